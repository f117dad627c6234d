//! Restricted Redis users: the ACL line docs/deployments.md gives is enough for everything a client
//! does, and with less a client either works with a logged degradation or fails with an error that
//! names the missing permission, never "check the host and port".
//!
//! Every test makes its user on its own throwaway server; the servers' default user stays the
//! test's admin.

use crate::support;

use std::sync::{mpsc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::support::{queued, RedisServer};
use fairlock::{Error, ErrorKind, LockClient};

const SECS_10: Duration = Duration::from_secs(10);

/// The loose bound on a hand-off for a restricted user: a waiter that relied on its BLPOP's
/// 10 s re-block instead of a wake-up (a lost `CLIENT UNBLOCK` with no fallback) fails it.
const HAND_OFF_BOUND: Duration = Duration::from_millis(1500);

/// The documented line (the first `ACL SETUSER fairlock ...` line of docs/deployments.md), for
/// the server's version: without the function commands on a server that has none.
fn documented_acl_line(server: &RedisServer) -> Vec<String> {
    let doc = include_str!("../../docs/deployments.md");
    let line = doc
        .lines()
        .find(|l| l.starts_with("ACL SETUSER fairlock on "))
        .expect("docs/deployments.md gives the ACL line");
    let has_functions = redis::cmd("COMMAND")
        .arg("INFO")
        .arg("FCALL")
        .query::<Vec<redis::Value>>(&mut server.conn())
        .unwrap()
        .iter()
        .any(|v| *v != redis::Value::Nil);
    line.split_whitespace()
        .skip(2) // ACL SETUSER
        .filter(|w| has_functions || !(w.contains("function") || w.contains("fcall")))
        .map(|w| w.replace("PASSWORD", "pw"))
        .collect()
}

fn set_user(server: &RedisServer, rules: &[String]) {
    let mut cmd = redis::cmd("ACL");
    cmd.arg("SETUSER");
    for r in rules {
        cmd.arg(r);
    }
    let _: () = cmd.query(&mut server.conn()).unwrap();
}

fn rules(user: &str, rest: &[&str]) -> Vec<String> {
    let mut all = vec![user.to_string(), "on".into(), ">pw".into()];
    all.extend(rest.iter().map(|s| s.to_string()));
    all
}

fn url_for(server: &RedisServer, user: &str) -> String {
    format!("redis://{user}:pw@127.0.0.1:{}/", server.port)
}

/// The log records of this test binary at warn level and above (one global logger).
static WARNINGS: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct Capture;

impl log::Log for Capture {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::Level::Warn
    }
    fn log(&self, r: &log::Record) {
        if self.enabled(r.metadata()) && r.target().starts_with("fairlock") {
            WARNINGS.lock().unwrap().push(r.args().to_string());
        }
    }
    fn flush(&self) {}
}

fn capture_warnings() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        log::set_logger(&Capture).unwrap();
        log::set_max_level(log::LevelFilter::Warn);
    });
}

/// A holder (the admin) holds `first` and `second`; `client`'s threads wait on `first`, then on
/// `second` (a list its blocked BLPOP does not cover yet); `second` is released: its waiter must
/// be served within [`HAND_OFF_BOUND`], then `first`'s.
fn hand_off_on_a_newly_waited_lock(server: &RedisServer, client: &LockClient, tag: &str) {
    let admin = support::client(server);
    let first = format!("{tag}-first");
    let second = format!("{tag}-second");
    let held_first = admin.fair_lock(&first).unwrap().lock().unwrap();
    let held_second = admin.fair_lock(&second).unwrap().lock().unwrap();
    let (tx, rx) = mpsc::channel();
    let mut waiters = vec![];
    for name in [&first, &second] {
        let lock = client.fair_lock(name).unwrap();
        let tx = tx.clone();
        waiters.push(thread::spawn(move || {
            let got = lock.lock().map(|g| {
                let token = g.fencing_token();
                g.unlock().map(|()| token)
            });
            tx.send((lock.name().to_string(), got)).unwrap();
        }));
        let probe = admin.fair_lock(name).unwrap();
        assert!(
            queued(&probe, 1, SECS_10),
            "{tag}: a waiter queued on {name}"
        );
    }
    let token = held_second.fencing_token();
    held_second.unlock().unwrap();
    let released = Instant::now();
    let (name, got) = rx.recv_timeout(SECS_10).expect("the second lock's waiter");
    let took = released.elapsed();
    assert_eq!(name, second);
    assert!(
        got.expect("lock()").expect("unlock()") > token,
        "{tag}: token rises"
    );
    assert!(
        took < HAND_OFF_BOUND,
        "{tag}: served {took:?} after the release (a BLPOP re-block, not a wake-up)"
    );
    let token = held_first.fencing_token();
    held_first.unlock().unwrap();
    let (name, got) = rx.recv_timeout(SECS_10).expect("the first lock's waiter");
    assert_eq!(name, first);
    assert!(got.unwrap().unwrap() > token);
    for w in waiters {
        w.join().unwrap();
    }
}

#[test]
fn the_documented_acl_line_is_enough_for_every_call() {
    let server = RedisServer::start();
    set_user(&server, &documented_acl_line(&server));
    let url = url_for(&server, "fairlock");
    let client = LockClient::builder(&url)
        .lease(Duration::from_millis(600))
        .janitor_interval(Duration::from_millis(100))
        .build()
        .expect("build as the documented user");
    // the waker named its connection and may unblock it: a wake-up, not a re-block
    hand_off_on_a_newly_waited_lock(&server, &client, "doc");
    // reentry, status, a busy try, a forced release
    let lock = client.fair_lock("doc-calls").unwrap();
    let outer = lock.lock().unwrap();
    let inner = lock.lock().unwrap();
    assert_eq!(lock.hold_count().unwrap(), 2);
    assert!(lock.is_locked().unwrap());
    assert!(lock.is_owned_by_current_thread().unwrap());
    let status = lock.status().unwrap();
    assert!(status.holder.is_some(), "{status:?}");
    // the listing of every lock (SCAN)
    let listing = client.list_locks(fairlock::ListOptions::new()).unwrap();
    let names: Vec<&str> = listing.locks.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["doc-calls"], "{listing:?}");
    drop(inner);
    let other = {
        let lock = lock.clone();
        thread::spawn(move || lock.try_lock().map(|g| g.is_some()))
            .join()
            .unwrap()
    };
    assert!(!other.unwrap(), "busy for another thread");
    outer.unlock().unwrap();
    // a leaked hold runs out and its waiter gets the lock (the watchdog stops, the janitor or
    // the waiter's heartbeat grants it)
    let leaked = lock.lock().unwrap().leak();
    let waiter = {
        let lock = lock.clone();
        thread::spawn(move || lock.lock().map(|g| g.fencing_token()))
    };
    assert!(waiter.join().unwrap().unwrap() > leaked);
    let held = lock.lock().unwrap();
    assert!(lock.force_unlock().unwrap().is_some());
    drop(held);
    client.check_server().expect("the periodic server check");
    // a semaphore and a read/write lock: a hand-off, a leave at the deadline, status, a
    // capacity change, a forced release, a write after reads
    let sem = client.semaphore("doc-sem", 1).unwrap();
    let permit = sem.acquire().unwrap();
    let waiter = {
        let sem = sem.clone();
        thread::spawn(move || sem.acquire().map(|p| p.fencing_token()))
    };
    assert!(support::eventually(SECS_10, || sem
        .status()
        .unwrap()
        .waiters
        .len()
        == 1));
    assert!(sem
        .try_acquire_for(Duration::from_millis(50))
        .unwrap()
        .is_none());
    let first = permit.fencing_token();
    permit.release().unwrap();
    assert!(waiter.join().unwrap().unwrap() > first);
    let two = sem.set_capacity(2).unwrap();
    let p = two.acquire().unwrap();
    assert!(two.force_release(&p.hold_id(), p.fencing_token()).unwrap());
    assert!(p.release().is_err());
    let rw = client.rw_lock("doc-rw").unwrap();
    let r = rw.read().unwrap();
    // (from another thread: this one is refused the write while it holds a read)
    std::thread::scope(|s| {
        assert!(s
            .spawn(|| rw.try_write().unwrap().is_none())
            .join()
            .unwrap())
    });
    r.unlock().unwrap();
    rw.write().unwrap().unlock().unwrap();
    // nothing was refused to the user on the way, not even what fairlock can do without
    let refused: Vec<redis::Value> = redis::cmd("ACL")
        .arg("LOG")
        .query(&mut server.conn())
        .unwrap();
    assert!(refused.is_empty(), "ACL LOG: {refused:?}");
}

/// The textbook restricted user (Redis Cloud's "Read-Write" role excludes `@dangerous`): INFO,
/// `CLIENT LIST` and `CLIENT UNBLOCK` are refused. The client connects (saying once what it
/// could not check), and its waiting threads are still served promptly.
#[test]
fn a_user_without_dangerous_commands_connects_and_is_served_promptly() {
    support::in_own_process!(
        Duration::from_secs(300),
        a_user_without_dangerous_commands_connects_and_is_served_promptly_alone
    );
}

/// The body of [`a_user_without_dangerous_commands_connects_and_is_served_promptly`], alone in a child process (see `support::in_own_process!`).
fn a_user_without_dangerous_commands_connects_and_is_served_promptly_alone() {
    capture_warnings();
    let server = RedisServer::start();
    set_user(
        &server,
        &rules("rw", &["~fairlock:*", "&*", "+@all", "-@dangerous"]),
    );
    let client =
        LockClient::connect(&url_for(&server, "rw")).expect("connect as a +@all -@dangerous user");
    hand_off_on_a_newly_waited_lock(&server, &client, "nodanger");
    client
        .check_server()
        .expect("the periodic check skips what INFO would tell");
    let said: Vec<String> = WARNINGS
        .lock()
        .unwrap()
        .iter()
        .filter(|w| w.contains("INFO"))
        .cloned()
        .collect();
    assert_eq!(said.len(), 1, "said once what it could not check: {said:?}");
    assert!(said[0].contains("maxmemory-policy"), "{}", said[0]);
    assert!(said[0].contains("+info"), "says the ACL fix: {}", said[0]);
    assert_eq!(
        client.skipped_checks(),
        Some(said[0].trim_start_matches("fairlock: "))
    );
}

/// Before, a user refused `INFO` connected to an evicting server with the eviction check skipped
/// and only a log line to say so. `CONFIG GET maxmemory-policy`, often allowed separately, is asked
/// instead, at connect and by the periodic check; only when it is refused too is the check skipped,
/// and the client says so (`LockClient::skipped_checks`).
#[test]
fn a_user_refused_info_is_checked_with_config_get_or_told_what_was_skipped() {
    let server = RedisServer::start_with(&["--maxmemory-policy", "allkeys-lru"]);
    set_user(&server, &rules("noinfo", &["~*", "&*", "+@all", "-info"]));
    set_user(
        &server,
        &rules("neither", &["~*", "&*", "+@all", "-info", "-config"]),
    );
    match LockClient::connect(&url_for(&server, "noinfo")) {
        Err(Error::UnsafeServer { detail }) => assert!(detail.contains("allkeys-lru"), "{detail}"),
        other => panic!("a user refused INFO on an allkeys-lru server: {other:?}"),
    }
    let accepted = LockClient::builder(&url_for(&server, "noinfo"))
        .danger_accept_eviction(true)
        .build()
        .expect("eviction accepted");
    assert_eq!(accepted.skipped_checks(), None);
    accepted.check_server().expect("eviction accepted");

    let set_policy = |policy: &str| {
        let _: () = redis::cmd("CONFIG")
            .arg(&["SET", "maxmemory-policy", policy])
            .query(&mut server.conn())
            .unwrap();
    };
    set_policy("noeviction");
    let client = LockClient::connect(&url_for(&server, "noinfo")).expect("a noeviction server");
    assert_eq!(client.skipped_checks(), None, "CONFIG GET checked it");
    client.check_server().expect("still noeviction");
    set_policy("allkeys-lru");
    match client.check_server() {
        Err(Error::UnsafeServer { detail }) => assert!(detail.contains("allkeys-lru"), "{detail}"),
        other => panic!("the periodic check after a switch to allkeys-lru: {other:?}"),
    }

    let client = LockClient::connect(&url_for(&server, "neither"))
        .expect("refused INFO and CONFIG: nothing can be checked, the client goes on");
    let why = client
        .skipped_checks()
        .expect("the client says what it could not check");
    for says in ["INFO", "CONFIG GET", "maxmemory-policy", "+info"] {
        assert!(why.contains(says), "{says}: {why}");
    }
}

/// A key pattern that does not cover the key prefix: an error that names the permission and
/// the fix, at connect or at the first call, never a connection or "not Redis" error.
#[test]
fn a_key_pattern_that_misses_the_prefix_is_a_permission_error_that_names_it() {
    let server = RedisServer::start();
    set_user(&server, &rules("narrow", &["~jobs:*", "&*", "+@all"]));
    let result = LockClient::connect(&url_for(&server, "narrow"))
        .and_then(|c| c.fair_lock("payments").and_then(|l| l.lock()).map(drop));
    let e = result.expect_err("no key of the prefix may be touched");
    assert_eq!(e.kind(), ErrorKind::Permission, "{e:?}");
    assert!(matches!(e, Error::PermissionDenied { .. }), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("~fairlock:*"),
        "names the key pattern: {text}"
    );
    assert!(!text.contains("host and port"), "{text}");
    assert!(!text.contains(":pw@"), "no password: {text}");
}

/// Redis 7's default for new users refuses every channel; only replica acknowledgements on one
/// node publish (to put the connection's last write after the grant). Without them the user
/// works; with them `build()` says what is missing.
#[test]
fn a_user_without_channels_works_and_replica_acks_need_its_channel() {
    let server = RedisServer::start();
    set_user(&server, &rules("nochan", &["~*", "resetchannels", "+@all"]));
    let url = url_for(&server, "nochan");
    let client = LockClient::connect(&url).expect("no channel needed without replica acks");
    let lock = client.fair_lock("nochan").unwrap();
    lock.lock().unwrap().unlock().unwrap();
    let e = LockClient::builder(&url)
        .replica_acks(1, Duration::from_millis(100))
        .build()
        .expect_err("replica acks need PUBLISH on its channel");
    assert_eq!(e.kind(), ErrorKind::Permission, "{e:?}");
    let text = e.to_string();
    assert!(text.contains("&fairlock:replicated"), "{text}");
}

/// A wrong password is a permission error that says to check the credentials (and never shows
/// them), not "check that the server is running".
#[test]
fn refused_credentials_are_a_permission_error() {
    let server = RedisServer::start();
    set_user(&server, &rules("someone", &["~*", "+@all"]));
    let url = format!("redis://someone:wrong@127.0.0.1:{}/", server.port);
    let e = LockClient::connect(&url).expect_err("wrong password");
    assert_eq!(e.kind(), ErrorKind::Permission, "{e:?}");
    let text = e.to_string();
    assert!(text.contains("credentials"), "{text}");
    assert!(!text.contains("wrong"), "no password: {text}");
}

/// A measurement, not a test (`cargo test --release --all-features --test it -- --ignored --nocapture
/// acl::wake_up_latency`): how long after a release the waiter on a lock newly waited on is served,
/// while the client's waiting connection is blocked for another lock, for a user that may send
/// `CLIENT UNBLOCK` and one that may not (`-@admin`), in the same run. 40 samples each.
#[test]
#[ignore = "a measurement: cargo test --release --all-features --test it -- --ignored --nocapture acl::wake_up_latency"]
fn wake_up_latency_without_client_unblock() {
    let server = RedisServer::start();
    set_user(&server, &rules("full", &["~*", "&*", "+@all"]));
    set_user(
        &server,
        &rules("noadmin", &["~*", "&*", "+@all", "-@admin"]),
    );
    let admin = support::client(&server);
    let mut report = vec![];
    for user in ["full", "noadmin"] {
        let client = LockClient::connect(&url_for(&server, user)).unwrap();
        // a thread of the client waits on a lock that stays held: the waiting connection is
        // blocked in a BLPOP that covers only that lock's list
        let anchor = admin.fair_lock(&format!("anchor-{user}")).unwrap();
        let anchor_held = anchor.lock().unwrap();
        let anchor_waiter = {
            let lock = client.fair_lock(&format!("anchor-{user}")).unwrap();
            thread::spawn(move || lock.lock().map(drop))
        };
        assert!(queued(&anchor, 1, SECS_10));
        let mut samples = vec![];
        for i in 0..40 {
            let name = format!("wake-{user}-{i}");
            let held = admin.fair_lock(&name).unwrap().lock().unwrap();
            let (tx, rx) = mpsc::channel();
            let lock = client.fair_lock(&name).unwrap();
            let waiter = thread::spawn(move || {
                let g = lock.lock().unwrap();
                tx.send(Instant::now()).unwrap();
                g.unlock().unwrap();
            });
            assert!(queued(&admin.fair_lock(&name).unwrap(), 1, SECS_10));
            // let the waiter's BLPOP settle (with UNBLOCK it is re-sent with the new list)
            thread::sleep(Duration::from_millis(50));
            let released = Instant::now();
            held.unlock().unwrap();
            let served = rx.recv_timeout(SECS_10).expect("served");
            samples.push(served.duration_since(released));
            waiter.join().unwrap();
        }
        anchor_held.unlock().unwrap();
        anchor_waiter.join().unwrap().unwrap();
        samples.sort();
        let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
        report.push(format!(
            "{user}: p50 {:?}, p90 {:?}, p99 {:?}, max {:?}",
            at(0.5),
            at(0.9),
            at(0.99),
            samples[samples.len() - 1]
        ));
    }
    let rtt = {
        let mut c = server.conn();
        let start = Instant::now();
        for _ in 0..100 {
            let _: String = redis::cmd("PING").query(&mut c).unwrap();
        }
        start.elapsed() / 100
    };
    println!("wake-up after a release, lock newly waited on (PING {rtt:?}):");
    for line in report {
        println!("  {line}");
    }
}
