//! Leader election with `fairlock run --wait forever`: three instances of a service that writes to
//! a fenced resource while it leads. The first leads; the other two wait in FIFO order. The
//! leader's fairlock is SIGKILLed: its service stops and the first standby leads. That leader's
//! fairlock is SIGSTOPped (its service runs on, a zombie leader): when its lease ends the last
//! standby leads, the zombie's writes are refused by the fencing token, and once continued its
//! fairlock learns of the loss at once, stops the service and exits 79.

use crate::support;

use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::{eventually, Proc, RedisServer};

const LIMIT: Duration = Duration::from_secs(30);

/// The service: every 50 ms, a write of its epoch ($FAIRLOCK_TOKEN) to the resource, accepted
/// only when no later epoch has written (the fencing check, done by the resource: here a Lua
/// script on the test's Redis). Accepted writes go to the list `accepted` as "epoch name", in
/// the order the resource took them; refused ones to `refused`.
const SERVICE: &str = r#"
while true; do
  redis-cli -p "$1" EVAL "
    local last = tonumber(redis.call('GET', KEYS[1]) or '0')
    if tonumber(ARGV[1]) >= last then
      redis.call('SET', KEYS[1], ARGV[1])
      redis.call('RPUSH', KEYS[2], ARGV[1] .. ' ' .. ARGV[2])
      return 1
    end
    redis.call('RPUSH', KEYS[3], ARGV[1] .. ' ' .. ARGV[2])
    return 0" 3 epoch accepted refused "$FAIRLOCK_TOKEN" "$2" >/dev/null
  sleep 0.05
done
"#;

fn instance(server: &RedisServer, name: &str) -> Proc {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fairlock"));
    cmd.env("FAIRLOCK_REDIS_URL", server.url())
        .args(["run", "--lease", "1s", "leader", "--", "sh", "-c", SERVICE])
        .arg(name)
        .arg(server.port.to_string())
        .arg(name);
    Proc::spawn(&mut cmd)
}

/// The accepted writes so far, as (epoch, name).
fn accepted(server: &RedisServer) -> Vec<(u64, String)> {
    list(server, "accepted")
}

fn list(server: &RedisServer, key: &str) -> Vec<(u64, String)> {
    let items: Vec<String> = redis::cmd("LRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .query(&mut server.conn())
        .unwrap();
    items
        .iter()
        .map(|i| {
            let (epoch, name) = i.split_once(' ').unwrap();
            (epoch.parse().unwrap(), name.to_string())
        })
        .collect()
}

fn leads(server: &RedisServer, name: &str) -> bool {
    accepted(server).last().is_some_and(|(_, n)| n == name)
}

#[test]
fn three_instances_elect_one_leader_at_a_time_in_fifo_order_through_a_kill_and_a_stop() {
    let server = RedisServer::start();
    let lock = support::client(&server).fair_lock("leader").unwrap();
    let mut a = instance(&server, "a");
    assert!(eventually(LIMIT, || leads(&server, "a")), "a leads");
    let mut b = instance(&server, "b");
    assert!(support::queued(&lock, 1, LIMIT));
    let mut c = instance(&server, "c");
    assert!(support::queued(&lock, 2, LIMIT));
    assert_eq!(
        support::queue_pids(&lock),
        vec![b.pid(), c.pid()],
        "FIFO standbys"
    );

    // the leader's fairlock is killed: its service gets SIGTERM, b takes over after the lease
    a.kill();
    let killed = Instant::now();
    assert!(eventually(LIMIT, || leads(&server, "b")), "b leads");
    let takeover = killed.elapsed();
    assert!(
        takeover < Duration::from_secs(5),
        "b led {takeover:?} after the kill"
    );

    // b's fairlock is stopped; its service runs on with b's epoch, a zombie leader
    b.signal(libc::SIGSTOP);
    assert!(eventually(LIMIT, || leads(&server, "c")), "c leads");
    // the zombie's writes are refused from c's first write on
    assert!(eventually(LIMIT, || list(&server, "refused")
        .iter()
        .any(|(_, n)| n == "b")));
    b.signal(libc::SIGCONT);
    let continued = Instant::now();
    // b learns of the loss at once, stops its service and exits 79
    let status = b.wait(Duration::from_secs(15)).expect("b exits");
    let stopped = continued.elapsed();
    assert_eq!(status.code(), Some(79), "b exits 79 (lost)");
    assert!(
        stopped < Duration::from_secs(12),
        "b stopped {stopped:?} after SIGCONT"
    );
    // (its service got SIGTERM, then SIGKILL after the 10 s grace if it ignored it)

    c.kill();
    let writes = accepted(&server);
    // one leader at a time, by epoch: the accepted writes come in runs a, b, c, epochs rising
    let mut runs: Vec<(u64, String)> = Vec::new();
    for (epoch, name) in &writes {
        match runs.last() {
            Some((e, n)) if e == epoch && n == name => {}
            Some((e, _)) => {
                assert!(epoch > e, "epochs rise between leaders: {writes:?}");
                runs.push((*epoch, name.clone()));
            }
            None => runs.push((*epoch, name.clone())),
        }
    }
    let names: Vec<&str> = runs.iter().map(|(_, n)| n.as_str()).collect();
    assert_eq!(names, ["a", "b", "c"], "{writes:?}");
    // no write of an earlier epoch was accepted after a later one
    assert!(writes.windows(2).all(|w| w[0].0 <= w[1].0));
}
