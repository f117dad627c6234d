//! How calls reach the scripts: the function library (`FCALL`) on Redis 7, loaded at connect and
//! again when a server lost it; `EVALSHA` where `FUNCTION LOAD` is refused, and through the raw
//! layer for Redis 6.2.

use crate::support;

use std::thread;
use std::time::Duration;

use crate::support::RedisServer;
use fairlock::raw::{self, Acquire, Mode, RawLock, Release, Runner, Settings};

const SECS_5: Duration = Duration::from_secs(5);

/// A thread queued behind the holder, returning its token once served.
fn one_waiter(lock: &fairlock::FairLock) -> thread::JoinHandle<fairlock::Result<u64>> {
    let mut waiters = support::spawn_queued(lock, 1, SECS_5, |_| {
        let lock = lock.clone();
        move || lock.lock().map(|g| g.fencing_token())
    });
    waiters.pop().expect("one waiter")
}

fn script_calls(server: &RedisServer) -> (u64, u64) {
    (
        server.command_calls("fcall"),
        server.command_calls("evalsha"),
    )
}

#[test]
fn a_client_on_redis_7_loads_the_library_at_connect_and_calls_only_functions() {
    let server = RedisServer::start();
    let client = support::client(&server);
    let libraries: Vec<redis::Value> = redis::cmd("FUNCTION")
        .arg("LIST")
        .arg("LIBRARYNAME")
        .arg(raw::library_name())
        .query(&mut server.conn())
        .unwrap();
    assert_eq!(libraries.len(), 1, "the library is loaded at connect");

    let lock = client.fair_lock("functions").unwrap();
    let g = lock.lock().unwrap();
    let inner = lock.lock().unwrap();
    drop(inner);
    g.unlock().unwrap();
    let (fcalls, evalshas) = script_calls(&server);
    assert!(
        fcalls >= 4,
        "{fcalls} FCALLs for acquire, re-enter and two releases"
    );
    assert_eq!(evalshas, 0, "no EVALSHA when functions are there");
}

#[test]
fn a_server_that_lost_the_library_gets_it_again_and_nothing_is_lost() {
    let server = RedisServer::start();
    let client = support::client(&server);
    let lock = client.fair_lock("flushed").unwrap();
    let g = lock.lock().unwrap();
    let first = g.fencing_token();
    // a restart without persistence loses functions; the lock's keys stay here
    let _: () = redis::cmd("FUNCTION")
        .arg("FLUSH")
        .query(&mut server.conn())
        .unwrap();
    let waiter = one_waiter(&lock);
    let _: () = redis::cmd("FUNCTION")
        .arg("FLUSH")
        .query(&mut server.conn())
        .unwrap();
    assert!(
        g.is_held_in_redis().unwrap(),
        "the hold survives the lost library"
    );
    g.unlock().unwrap();
    let next = waiter.join().unwrap().expect("the waiter is served");
    assert!(next > first, "tokens rise: {next} after {first}");
    assert_eq!(
        script_calls(&server).1,
        0,
        "functions reloaded, not EVALSHA"
    );
}

#[test]
fn a_user_who_may_not_load_functions_gets_evalsha() {
    let server = RedisServer::start();
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("nofunctions")
        .arg("on")
        .arg(">secret")
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .arg("-function")
        .query(&mut server.conn())
        .unwrap();
    let url = format!("redis://nofunctions:secret@127.0.0.1:{}/", server.port);
    let client = fairlock::LockClient::connect(&url).expect("connects without FUNCTION LOAD");
    let lock = client.fair_lock("eval").unwrap();
    let g = lock.lock().unwrap();
    let waiter = one_waiter(&lock);
    let held = g.fencing_token();
    g.unlock().unwrap();
    assert!(waiter.join().unwrap().expect("served") > held);
    let (fcalls, evalshas) = script_calls(&server);
    assert_eq!(fcalls, 0);
    assert!(evalshas >= 3, "{evalshas} EVALSHAs");
}

/// Redis 6.2 has no functions: the raw layer's `Runner::Eval` sends each script whole. Both
/// runners act alike on the same keys, and each loads what a flushed server lacks.
#[test]
fn both_runners_drive_the_same_protocol() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let lock = |runner| {
        RawLock::new(
            "fairlock",
            "runners",
            Settings {
                runner,
                ..Settings::default()
            },
        )
        .unwrap()
    };
    let (functions, eval) = (lock(Runner::Functions), lock(Runner::Eval));
    let lease = Duration::from_secs(10);
    let Acquire::Granted(a) = functions
        .acquire("a:1", 1, lease, Mode::Wait, "h|1|1")
        .run(&mut c)
        .unwrap()
    else {
        panic!("a free lock is granted")
    };
    let queued = eval
        .acquire("b:1", 1, lease, Mode::Wait, "h|2|1")
        .run(&mut c)
        .unwrap();
    assert!(matches!(queued, Acquire::Queued { .. }), "{queued:?}");
    for flush in [["SCRIPT", "FLUSH"], ["FUNCTION", "FLUSH"]] {
        let _: () = redis::cmd(flush[0]).arg(flush[1]).query(&mut c).unwrap();
    }
    // released through EVALSHA, granted to the waiter queued through it too
    let released = eval.release("a:1", a.token, 1).run(&mut c).unwrap();
    assert_eq!(
        released,
        Release::Released {
            next: Some("b:1".into())
        }
    );
    let msg: String = redis::cmd("LPOP")
        .arg(functions.wake_key("b:1"))
        .query(&mut c)
        .expect("the grant message");
    let raw::Wake::Grant { token, .. } = raw::parse_wake(&msg).unwrap() else {
        panic!("a grant: {msg}")
    };
    assert!(token > a.token);
    // and the function library, reloaded, sees the hold the EVALSHA scripts granted
    let renewed = functions.renew("b:1", token, lease).run(&mut c).unwrap();
    assert!(renewed);
    let (fcalls, evalshas) = script_calls(&server);
    assert!(
        fcalls >= 2 && evalshas >= 2,
        "{fcalls} FCALL, {evalshas} EVALSHA"
    );
}
