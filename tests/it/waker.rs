//! Waiting costs O(1) connections per process: a client's waiting threads take turns leading one
//! BLPOP over its wake lists, and the leader hands each wake-up to the thread it is for. These
//! tests check what that must not break: FIFO order across thousands of waiting threads in several
//! processes (on a bounded number of connections), a waker whose connection is killed, a Redis
//! restart under waiters, and a grant that meets a waiter's deadline.

use crate::support;

use std::collections::HashSet;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::support::{eventually, say, RedisServer};

const SECS_5: Duration = Duration::from_secs(5);
const SECS_10: Duration = Duration::from_secs(10);
const SECS_30: Duration = Duration::from_secs(30);

/// What the waker's connection is called (`CLIENT SETNAME`), so a test can find it.
const WAKER_NAME: &str = "fairlock-waker";

/// The tests of this file take turns: the first runs 2048 threads, which on 2 cores would
/// starve the heartbeats of the others' waiters (and shift their deadlines) for no good reason.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Raise this process's soft limit of open files to its hard limit, so that code which (still)
/// spends a connection per waiting thread fails on the connection count, not on EMFILE. The
/// redis-server a test starts inherits the limit (its `maxclients` follows it).
fn raise_nofile_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit with a valid pointer to a local rlimit
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        if limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max;
            assert_eq!(
                libc::setrlimit(libc::RLIMIT_NOFILE, &limit),
                0,
                "setrlimit: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

/// The queue key of lock `name` (default prefix): a ZSET, whose ZCARD is the queue length in
/// one O(1) call (`status()` returns the whole queue, too much to poll 2048 times).
fn queue_key(name: &str) -> String {
    format!("fairlock:{{{name}}}:queue")
}

fn queue_len(conn: &mut redis::Connection, name: &str) -> usize {
    redis::cmd("ZCARD")
        .arg(queue_key(name))
        .query(conn)
        .unwrap()
}

/// The connections the server has now: one map of `CLIENT LIST` fields per connection.
fn client_list(conn: &mut redis::Connection) -> Vec<Vec<(String, String)>> {
    let text: String = redis::cmd("CLIENT").arg("LIST").query(conn).unwrap();
    text.lines()
        .map(|line| {
            line.split_whitespace()
                .filter_map(|f| f.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
        .collect()
}

fn field<'a>(client: &'a [(String, String)], name: &str) -> Option<&'a str> {
    client
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// The ids of the connections named [`WAKER_NAME`].
fn waker_ids(conn: &mut redis::Connection) -> Vec<u64> {
    client_list(conn)
        .iter()
        .filter(|c| field(c, "name") == Some(WAKER_NAME))
        .filter_map(|c| field(c, "id")?.parse().ok())
        .collect()
}

/// Wait (up to 10 s) for a waker connection that is not one of `killed`, kill every such one
/// with `CLIENT KILL ID` and add them to `killed`. Panics when none shows up.
fn kill_waker(conn: &mut redis::Connection, killed: &mut Vec<u64>, when: &str) {
    let mut fresh = vec![];
    let found = eventually(SECS_10, || {
        fresh = waker_ids(conn)
            .into_iter()
            .filter(|id| !killed.contains(id))
            .collect();
        !fresh.is_empty()
    });
    assert!(
        found,
        "{when}: no connection named {WAKER_NAME} (killed so far: {killed:?}); connections: {:?}",
        client_list(conn)
            .iter()
            .map(|c| format!(
                "id={} name={} cmd={}",
                field(c, "id").unwrap_or("?"),
                field(c, "name").unwrap_or(""),
                field(c, "cmd").unwrap_or("?")
            ))
            .collect::<Vec<_>>()
    );
    for id in fresh {
        let killed_now: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("ID")
            .arg(id)
            .query(conn)
            .unwrap();
        assert_eq!(killed_now, 1, "{when}: CLIENT KILL ID {id}");
        killed.push(id);
    }
}

/// How many established TCP connections process `pid` has to `port` on this machine (its
/// socket fds matched against its network namespace's `/proc/<pid>/net/tcp`).
fn tcp_connections(pid: u32, port: u16) -> usize {
    let inodes: HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| {
            dir.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter_map(|target| {
                    let t = target.to_string_lossy();
                    Some(t.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
                })
                .collect()
        })
        .unwrap_or_default();
    let remote = format!(":{port:04X}");
    ["tcp", "tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(format!("/proc/{pid}/net/{f}")).ok())
        .flat_map(|table| {
            table
                .lines()
                .skip(1)
                .filter(|line| {
                    let cols: Vec<&str> = line.split_whitespace().collect();
                    // cols: sl local rem st tx:rx tr:when retr uid timeout inode
                    cols.len() > 9
                        && cols[2].ends_with(&remote)
                        && cols[3] == "01"
                        && inodes.contains(cols[9])
                })
                .map(|_| ())
                .collect::<Vec<_>>()
        })
        .count()
}

// ---- 1. thousands of waiters in four processes ---------------------------------------------

const CHILDREN: usize = 4;
const THREADS_PER_CHILD: usize = 512;
/// The children's command pool.
const CHILD_POOL: u32 = 4;
/// The parent's command pool.
const PARENT_POOL: u32 = 2;
/// What one client may have open besides its command pool while its threads wait: the waker's
/// connection, and the short-lived one of a server check (at build, then every minute).
const CLIENT_EXTRA: usize = 2;
/// The parent's connections: its client's (it holds, it never waits) and the plain connection
/// this test inspects the server through.
const PARENT_CONNECTIONS: usize = PARENT_POOL as usize + CLIENT_EXTRA + 1;
/// The stack of a waiting thread in the children: 2048 threads with the default 2 MiB would
/// reserve 4 GiB of address space. 128 KiB leaves ample room for an acquire call.
const WAITER_STACK: usize = 128 * 1024;

/// Child role "waiters" (env URL, NAME, POOL): on each `go` line from the parent start one more
/// thread that takes lock NAME once, prints `ACQ <index> <token> <owner>` while holding it and
/// releases it at once; on `end` (or the end of stdin) join them all and print `DONE <count>`.
fn waiters_child() {
    support::child_time_limit(Duration::from_secs(150));
    raise_nofile_limit();
    let url: String = support::env_arg("URL");
    let name: String = support::env_arg("NAME");
    let pool: u32 = support::env_arg("POOL");
    // janitor at its default 1 s (not the tests' 200 ms): 512 waiters on 2 busy cores must not
    // be presumed dead because a heartbeat came late
    let client = support::client_with_url(&url, |b| {
        b.pool_size(pool).janitor_interval(Duration::from_secs(1))
    });
    let lock = client.fair_lock(&name).unwrap();
    let inside = Arc::new(AtomicU32::new(0));
    let mut threads = vec![];
    loop {
        match support::hear().as_str() {
            "go" => {
                let i = threads.len();
                let lock = lock.clone();
                let client = client.clone();
                let inside = inside.clone();
                let t = thread::Builder::new()
                    .name(format!("w{i}"))
                    .stack_size(WAITER_STACK)
                    .spawn(move || {
                        let g = lock.lock().unwrap();
                        assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                        say(
                            "ACQ",
                            format!("{i} {} {}", g.fencing_token(), client.current_owner()),
                        );
                        inside.fetch_sub(1, Ordering::SeqCst);
                        g.unlock().unwrap();
                    })
                    .unwrap();
                threads.push(t);
            }
            "end" | "" => break,
            other => panic!("unexpected line {other:?}"),
        }
    }
    let n = threads.len();
    for t in threads {
        t.join().unwrap();
    }
    say("DONE", n);
}

#[test]
fn many_waiting_threads_in_four_processes_are_served_in_fifo_order_on_few_connections() {
    let children = support::child_test!("waiters" => waiters_child);
    let _serial = serial();
    raise_nofile_limit();
    let started = Instant::now();
    let server = RedisServer::start();
    let name = "crowd";
    let mut conn = server.conn();
    let client = support::client_with_url(&server.url(), |b| b.pool_size(PARENT_POOL));
    let lock = client.fair_lock(name).unwrap();
    let holder = lock.lock().unwrap();
    let first = holder.fencing_token();

    let env = vec![
        ("URL", server.url()),
        ("NAME", name.to_string()),
        ("POOL", CHILD_POOL.to_string()),
    ];
    let mut workers: Vec<_> = (0..CHILDREN)
        .map(|_| children.spawn("waiters", &env))
        .collect();

    // Enqueue one thread at a time, round robin over the children, each only once the previous
    // one is in the queue: the enqueue order is then known here, independently of Redis. (2048
    // sequential enqueues take a few seconds: no need for batches.)
    let total = CHILDREN * THREADS_PER_CHILD;
    let mut expected: Vec<(usize, usize)> = Vec::with_capacity(total);
    for k in 0..total {
        let child = k % CHILDREN;
        workers[child].send("go");
        expected.push((child, k / CHILDREN));
        let deadline = Instant::now() + SECS_10;
        while queue_len(&mut conn, name) <= k {
            assert!(
                Instant::now() < deadline,
                "waiter {k} (thread {} of child {child}) did not queue within 10 s",
                k / CHILDREN
            );
            thread::sleep(Duration::from_micros(200));
        }
        assert_eq!(
            queue_len(&mut conn, name),
            k + 1,
            "the queue grew by more than one"
        );
    }
    let enqueued = started.elapsed();
    // Redis's queue is in the same order (by process; the threads' owner ids are checked
    // against it after the grants)
    let status = lock.status().unwrap();
    let pids: Vec<u32> = workers.iter().map(|w| w.pid()).collect();
    let queue_pids: Vec<u32> = status.waiters.iter().map(|w| w.origin.pid).collect();
    let expected_pids: Vec<u32> = expected.iter().map(|&(c, _)| pids[c]).collect();
    assert!(
        queue_pids == expected_pids,
        "the queue's processes are not in enqueue order"
    );
    let queue_owners: Vec<String> = status.waiters.into_iter().map(|w| w.origin.owner).collect();

    // While all 2048 wait: each process has at most its pool and the waker (and a passing
    // server check) open, not a connection per waiting thread.
    let bound = CHILDREN * (CHILD_POOL as usize + CLIENT_EXTRA) + PARENT_CONNECTIONS;
    let mut connections = 0;
    // a connection closed just now may still be listed for a moment
    let settled = eventually(SECS_5, || {
        connections = client_list(&mut conn).len();
        connections <= bound
    });
    let per_child: Vec<usize> = pids
        .iter()
        .map(|&pid| tcp_connections(pid, server.port))
        .collect();
    let wakers = waker_ids(&mut conn).len();
    println!(
        "{total} waiters queued in {enqueued:?}: {connections} connections to Redis \
         (bound {bound}), per child {per_child:?}, {wakers} named {WAKER_NAME}"
    );
    assert!(
        settled,
        "{connections} connections to Redis while {total} threads wait (bound {bound}); \
         per child process {per_child:?} (each may have at most {})",
        CHILD_POOL as usize + CLIENT_EXTRA
    );
    for (c, &n) in per_child.iter().enumerate() {
        assert!(
            n <= CHILD_POOL as usize + CLIENT_EXTRA,
            "child {c} has {n} connections to Redis with pool size {CHILD_POOL}"
        );
    }

    let released = Instant::now();
    holder.unlock().unwrap();
    // (token, child, thread index, owner) of every grant
    let mut grants: Vec<(u64, usize, usize, String)> = Vec::with_capacity(total);
    for (c, w) in workers.iter_mut().enumerate() {
        for _ in 0..THREADS_PER_CHILD {
            let line = w.expect("ACQ", Duration::from_secs(60));
            let mut parts = line.split(' ');
            let i: usize = parts.next().unwrap().parse().unwrap();
            let token: u64 = parts.next().unwrap().parse().unwrap();
            let owner = parts.next().unwrap().to_string();
            grants.push((token, c, i, owner));
        }
    }
    let served_in = released.elapsed();
    for w in &mut workers {
        w.send("end");
        assert_eq!(
            w.expect("DONE", SECS_30),
            THREADS_PER_CHILD.to_string(),
            "{}",
            w.name()
        );
        assert!(w.exits_ok(SECS_30), "child {} failed", w.name());
    }

    // the fencing token records the grant order exactly (tokens are time-seeded: their order
    // is known, not their values)
    grants.sort();
    let tokens: Vec<u64> = grants.iter().map(|g| g.0).collect();
    assert!(tokens[0] > first, "first grant {} after {first}", tokens[0]);
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "two grants shared a token"
    );
    let served: Vec<(usize, usize)> = grants.iter().map(|g| (g.1, g.2)).collect();
    if let Some(at) = (0..total).find(|&k| served[k] != expected[k]) {
        panic!(
            "grant {at} went to (child, thread) {:?}, the queue had {:?} there; grants {:?}..., enqueued {:?}...",
            served[at],
            expected[at],
            &served[at..(at + 8).min(total)],
            &expected[at..(at + 8).min(total)]
        );
    }
    let owners: Vec<String> = grants.iter().map(|g| g.3.clone()).collect();
    assert!(owners == queue_owners, "grants not in Redis's queue order");
    // nobody else took a turn, and nothing is left held or queued
    let status = lock.status().unwrap();
    assert_eq!(status.fencing_counter, tokens[total - 1]);
    assert!(
        status.holder.is_none() && status.waiters.is_empty(),
        "{status:?}"
    );
    println!(
        "{total} grants in FIFO order in {served_in:?}; whole test {:?}",
        started.elapsed()
    );
}

// ---- 2. the waker's connection killed -------------------------------------------------------

#[test]
fn killing_the_waker_connection_mid_wait_loses_no_waiter() {
    let _serial = serial();
    let server = RedisServer::start();
    let mut conn = server.conn();
    let client = support::client(&server);
    let lock = client.fair_lock("killed-waker").unwrap();
    let holder = lock.lock().unwrap();
    let first = holder.fencing_token();
    let mut killed = vec![];

    const WAITERS: usize = 8;
    /// The waiter that, while it holds the lock, lets the test kill the waker once more.
    const PAUSING: usize = 3;
    let inside = Arc::new(AtomicU32::new(0));
    let (grants_tx, grants_rx) = mpsc::channel();
    let (paused_tx, paused_rx) = mpsc::channel();
    let (resume_tx, resume_rx) = mpsc::channel::<()>();
    let mut resume_rx = Some(resume_rx);
    let threads = support::spawn_queued(&lock, WAITERS, SECS_5, |i| {
        if i == WAITERS / 2 {
            // half of them wait: kill it (those that queue next need the new one)
            kill_waker(&mut conn, &mut killed, "with 4 waiters queued");
        }
        let waiter = lock.clone();
        let inside = inside.clone();
        let grants_tx = grants_tx.clone();
        let paused_tx = paused_tx.clone();
        let resume_rx = if i == PAUSING { resume_rx.take() } else { None };
        move || {
            let g = waiter.lock().unwrap();
            assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
            // (sends may fail once the test has failed: no second panic with the lock held)
            let _ = grants_tx.send((g.fencing_token(), i));
            if let Some(resume) = resume_rx {
                let _ = paused_tx.send(());
                let _ = resume.recv_timeout(SECS_30);
            }
            thread::sleep(Duration::from_millis(5));
            inside.fetch_sub(1, Ordering::SeqCst);
            g.unlock().unwrap();
        }
    });
    let queue = support::queue_owners(&lock);
    // all wait: kill it again, and release before it can be back
    kill_waker(&mut conn, &mut killed, "with 8 waiters queued");
    holder.unlock().unwrap();

    // waiter 3 holds the lock and 4 more wait: kill the waker once more before its release
    paused_rx
        .recv_timeout(SECS_30)
        .expect("waiter 3 never got the lock");
    kill_waker(&mut conn, &mut killed, "while waiter 3 holds the lock");
    resume_tx.send(()).unwrap();

    let got = support::assert_served_in_queue_order(threads, &grants_rx, first);
    let status = lock.status().unwrap();
    assert!(
        status.holder.is_none() && status.waiters.is_empty(),
        "{status:?}"
    );
    assert_eq!(
        status.fencing_counter,
        got[WAITERS - 1].0,
        "someone else took a turn"
    );
    println!("killed waker connections {killed:?}; queue was {queue:?}");
}

// ---- 3. Redis restarted under waiters -------------------------------------------------------

#[test]
fn redis_restarted_mid_wait_serves_every_waiter_once() {
    let _serial = serial();
    // AOF with an fsync per write: the restart loses nothing (no hold, no queue place), so the
    // order must survive it exactly
    let mut server = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    // the holder's lease (3 s, renewed every second) outlasts the restart
    let holder_client =
        support::client_with_url(&server.url(), |b| b.lease(Duration::from_secs(3)));
    let lock = holder_client.fair_lock("restarted").unwrap();
    let holder = lock.lock().unwrap();
    let first = holder.fencing_token();
    // two waiting clients (two wakers), their threads alternating in the queue
    let clients = [support::client(&server), support::client(&server)];

    const WAITERS: usize = 8;
    let inside = Arc::new(AtomicU32::new(0));
    let (tx, rx) = mpsc::channel();
    let threads = support::spawn_queued(&lock, WAITERS, SECS_5, |i| {
        let waiter = clients[i % 2].fair_lock("restarted").unwrap();
        let inside = inside.clone();
        let tx = tx.clone();
        move || {
            let g = waiter
                .lock()
                .unwrap_or_else(|e| panic!("waiter {i} failed across the restart: {e:?}"));
            assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
            let _ = tx.send((g.fencing_token(), i));
            thread::sleep(Duration::from_millis(5));
            inside.fetch_sub(1, Ordering::SeqCst);
            g.unlock().unwrap();
        }
    });
    let queue = support::queue_owners(&lock);

    server.restart();
    // the hold and the queue came back from the AOF
    let status = lock.status().unwrap();
    assert_eq!(
        status.holder.as_ref().map(|h| h.fencing_token),
        Some(first),
        "the hold was lost in the restart"
    );
    let after: Vec<String> = status
        .waiters
        .iter()
        .map(|w| w.origin.owner.clone())
        .collect();
    assert_eq!(after, queue, "the queue changed across the restart");
    // release at once, while the waiters may still be reconnecting
    holder.unlock().expect("release after the restart");

    let got = support::assert_served_in_queue_order(threads, &rx, first);
    assert!(eventually(SECS_5, || {
        let st = lock.status().unwrap();
        st.holder.is_none() && st.waiters.is_empty()
    }));
    assert_eq!(lock.status().unwrap().fencing_counter, got[WAITERS - 1].0);
}

// ---- 4. a grant meeting a deadline ----------------------------------------------------------

#[test]
fn a_grant_arriving_as_the_deadline_passes_is_never_lost() {
    let _serial = serial();
    let server = RedisServer::start();
    let holder_client = support::client(&server);
    let lock = holder_client.fair_lock("deadline").unwrap();
    // both waiters in one client: their wake-ups go through one waker, which must tell them apart
    let waiters = support::client(&server);
    // the first waiter's patience: long enough that both waiters are surely queued before it
    // runs out, short enough for 50 rounds
    let patience = Duration::from_millis(100);
    let seed = fastrand::u64(..);
    let mut rng = fastrand::Rng::with_seed(seed);
    println!("jitter seed {seed}");
    let inside = Arc::new(AtomicU32::new(0));
    let mut both_queued = 0;
    let mut impatient_served = 0;
    // the release offsets of the rounds in which the impatient waiter gave up
    let mut gave_up_at = vec![];

    for round in 0..50 {
        let holder = lock.lock().unwrap();
        assert_eq!(
            inside.fetch_add(1, Ordering::SeqCst),
            0,
            "round {round}: two holders"
        );
        let held = holder.fencing_token();

        let (a_tx, a_rx) = mpsc::channel();
        let impatient = {
            let lock = waiters.fair_lock("deadline").unwrap();
            let client = waiters.clone();
            let inside = inside.clone();
            thread::spawn(move || {
                a_tx.send((client.current_owner(), Instant::now())).unwrap();
                let got = lock.try_lock_for(patience).unwrap();
                got.map(|g| {
                    assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                    let t = g.fencing_token();
                    inside.fetch_sub(1, Ordering::SeqCst);
                    g.unlock().unwrap();
                    t
                })
            })
        };
        let (a_owner, a_started) = a_rx.recv_timeout(SECS_5).unwrap();
        // the impatient one queues first (unless it is already gone, on a very slow machine)
        assert!(eventually(SECS_5, || {
            support::queue_owners(&lock) == [a_owner.clone()] || impatient.is_finished()
        }));

        let (b_tx, b_rx) = mpsc::channel();
        let (b_owner_tx, b_owner_rx) = mpsc::channel();
        let patient = {
            let lock = waiters.fair_lock("deadline").unwrap();
            let client = waiters.clone();
            let inside = inside.clone();
            thread::spawn(move || {
                b_owner_tx.send(client.current_owner()).unwrap();
                let g = lock.lock().unwrap();
                assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                let t = g.fencing_token();
                b_tx.send(t).unwrap();
                inside.fetch_sub(1, Ordering::SeqCst);
                g.unlock().unwrap();
            })
        };
        let b_owner = b_owner_rx.recv_timeout(SECS_5).unwrap();
        let mut seen = vec![];
        assert!(eventually(SECS_5, || {
            seen = support::queue_owners(&lock);
            seen.last() == Some(&b_owner)
        }));
        if seen == [a_owner.clone(), b_owner.clone()] {
            both_queued += 1;
        }

        // release around the impatient waiter's deadline: in two rounds of three within 3 ms of
        // it; in the third up to 120 ms after it, as the waiter may notice its deadline late (a
        // BLPOP's timeout fires at the server's next timer tick, up to 1/hz = 100 ms late)
        let offset_us: i64 = if round % 3 == 2 {
            rng.i64(0..=120_000)
        } else {
            rng.i64(-3_000..=3_000)
        };
        let at = if offset_us >= 0 {
            a_started + patience + Duration::from_micros(offset_us as u64)
        } else {
            a_started + patience - Duration::from_micros(offset_us.unsigned_abs())
        };
        thread::sleep(at.saturating_duration_since(Instant::now()));
        inside.fetch_sub(1, Ordering::SeqCst);
        holder.unlock().unwrap();

        let b_token = b_rx.recv_timeout(SECS_10).unwrap_or_else(|_| {
            panic!("round {round} (offset {offset_us} us): the second waiter never got the lock")
        });
        let a_token = impatient.join().expect("the impatient waiter failed");
        patient.join().expect("the patient waiter failed");
        assert!(b_token > held, "round {round}: {b_token} after {held}");
        if a_token.is_none() {
            gave_up_at.push(offset_us);
        }
        if let Some(a) = a_token {
            impatient_served += 1;
            assert!(
                held < a && a < b_token,
                "round {round}: the impatient waiter's token {a} is not between {held} and {b_token}"
            );
        }
        let mut last = None;
        let clean = eventually(SECS_5, || {
            let st = lock.status().unwrap();
            let done = st.holder.is_none() && st.waiters.is_empty();
            last = Some(st);
            done
        });
        assert!(clean, "round {round} (offset {offset_us} us) left {last:?}");
        assert_eq!(
            last.unwrap().fencing_counter,
            b_token,
            "round {round}: someone else took a turn"
        );
    }
    println!(
        "50 rounds: both waiters queued before the deadline in {both_queued}, the impatient \
         one served in {impatient_served}; it gave up in those released at {gave_up_at:?} us"
    );
    // the race was set up at all (each round leaves 100 ms for two enqueues)
    assert!(
        both_queued > 0,
        "the second waiter never queued behind the first"
    );
}

/// `WaitMode::PerThread`: each waiting thread blocks on a connection of its own and pops from
/// a wake list of its own (`<lock>:wake:<client id>.<n>`), served in FIFO order like the shared
/// mode; a thread of a per-thread client and one of a shared client wait in one queue.
#[test]
fn with_a_connection_per_thread_each_waiter_blocks_on_its_own_and_fifo_holds() {
    let _serial = serial();
    let server = RedisServer::start();
    let per_thread = support::client_with_url(&server.url(), |b| {
        b.wait_mode(fairlock::WaitMode::PerThread)
    });
    let shared = support::client(&server);
    let lock = per_thread.fair_lock("per-thread").unwrap();
    let shared_lock = shared.fair_lock("per-thread").unwrap();
    let guard = lock.lock().unwrap();
    let (tx, grants) = mpsc::channel();
    let waiters = support::spawn_queued(&lock, 6, SECS_30, |i| {
        // waiters 2 and 5 wait through the shared client
        let lock = if i % 3 == 2 {
            shared_lock.clone()
        } else {
            lock.clone()
        };
        let tx = tx.clone();
        move || {
            let g = lock.lock().expect("a waiter's lock");
            tx.send((g.fencing_token(), i)).unwrap();
            g.unlock().unwrap();
        }
    });
    let mut conn = server.conn();
    // 4 per-thread waiters, 1 connection each; 2 shared waiters, 1 connection
    assert!(
        eventually(SECS_10, || waker_ids(&mut conn).len() == 5),
        "blocking connections: {:?}",
        waker_ids(&mut conn)
    );
    let owners = support::queue_owners(&lock);
    let per_thread_owners: Vec<&String> = owners
        .iter()
        .filter(|o| o.starts_with(&format!("{}.", per_thread.id())))
        .collect();
    assert_eq!(per_thread_owners.len(), 4, "{owners:?}");
    let first = guard.fencing_token();
    guard.unlock().unwrap();
    support::assert_served_in_queue_order(waiters, &grants, first);
}

/// Before, a server whose ACL (or `rename-command`) refuses `CLIENT` made every `lock()` that had
/// to wait fail at once with "connection failed ... check that the server is running": the waker
/// named its connection and asked its id first. Waiting works without `CLIENT` now: the BLPOP
/// re-blocks every half second to take up a newly waited-on lock.
#[test]
fn waiting_works_for_a_user_the_server_refuses_client_to() {
    // (the second refusal: CLIENT SETNAME and ID allowed, CLIENT UNBLOCK refused with @admin;
    // before, a hand-off on a second lock then came up to 10 s late)
    for refused in ["-client", "-@admin"] {
        waiting_works_for_a_user_refused(refused);
    }
}

fn waiting_works_for_a_user_refused(refused: &str) {
    let _turn = serial();
    let server = RedisServer::start();
    let mut admin = server.conn();
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("locker")
        .arg("on")
        .arg(">pw")
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .arg(refused)
        .query(&mut admin)
        .unwrap();
    let url = format!("redis://locker:pw@127.0.0.1:{}/", server.port);
    let client = fairlock::LockClient::connect(&url).expect("connect as a user without CLIENT");
    let holder = support::client(&server);
    // a waiter blocks on A; then one waits on B, a list the blocked BLPOP does not cover and
    // no CLIENT UNBLOCK can make it take up: it must be served all the same
    let held_a = holder.fair_lock("no-client-a").unwrap().lock().unwrap();
    let held_b = holder.fair_lock("no-client-b").unwrap().lock().unwrap();
    let mut waiters = vec![];
    let (tx, rx) = mpsc::channel();
    for name in ["no-client-a", "no-client-b"] {
        let lock = client.fair_lock(name).unwrap();
        let tx = tx.clone();
        waiters.push(thread::spawn(move || {
            tx.send((
                lock.name().to_string(),
                lock.lock().map(|g| g.fencing_token()),
            ))
            .unwrap();
        }));
        assert!(eventually(SECS_5, || queue_len(&mut admin, name) == 1));
    }
    let token_b = held_b.fencing_token();
    held_b.unlock().unwrap();
    let released = Instant::now();
    // (within about one re-block of the BLPOP, 500 ms, not its 10 s)
    let (name, got) = rx
        .recv_timeout(SECS_10)
        .expect("the waiter on B was served");
    assert!(
        released.elapsed() < Duration::from_millis(1500),
        "{refused}: served {:?} after the release",
        released.elapsed()
    );
    assert_eq!(name, "no-client-b");
    assert!(got.expect("lock() as a user without CLIENT") > token_b);
    let token_a = held_a.fencing_token();
    held_a.unlock().unwrap();
    let (name, got) = rx
        .recv_timeout(SECS_10)
        .expect("the waiter on A was served");
    assert_eq!(name, "no-client-a");
    assert!(got.unwrap() > token_a);
    for w in waiters {
        w.join().unwrap();
    }
}
