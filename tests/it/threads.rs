//! Type-level and thread-level facts: guards are `!Send` (a lock belongs to a thread), handles
//! and clients are `Clone + Send + Sync`, and a client runs exactly three background threads
//! (watchdog, its renewer, and janitor, not one per lock or per waiter: waiting threads take
//! turns on one blocking connection themselves), four through a Sentinel group (the master
//! watch), that stop when its last handle is dropped.

use crate::support;

use std::time::Duration;

use crate::support::topology::SentinelGroup;
use crate::support::{eventually, RedisServer};
use static_assertions::{assert_impl_all, assert_not_impl_any};

// Checked when this file compiles: handles and clients go to other threads and are shared, a
// guard (a hold of a lock) stays on the thread that took it.
assert_impl_all!(fairlock::LockClient: Send, Sync, Clone);
assert_impl_all!(fairlock::FairLock: Send, Sync, Clone);
assert_not_impl_any!(fairlock::LockGuard: Send, Sync);

/// Names of this process's threads that belong to fairlock (`/proc/self/task/*/comm`).
fn fairlock_threads() -> Vec<String> {
    let mut names = vec![];
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        if let Ok(name) = std::fs::read_to_string(task.path().join("comm")) {
            if name.starts_with("fairlock-") {
                names.push(name.trim().to_string());
            }
        }
    }
    names.sort();
    names
}

// Run alone in a child process: thread counts of the whole process are exact there.
#[test]
fn a_client_runs_three_background_threads_four_through_sentinel_and_stops_them_when_dropped() {
    support::in_own_process!(Duration::from_secs(300), a_client_runs_three_background_threads_four_through_sentinel_and_stops_them_when_dropped_alone);
}

/// The body of [`a_client_runs_three_background_threads_four_through_sentinel_and_stops_them_when_dropped`], alone in a child process (see `support::in_own_process!`).
fn a_client_runs_three_background_threads_four_through_sentinel_and_stops_them_when_dropped_alone()
{
    let server = RedisServer::start();
    assert!(fairlock_threads().is_empty(), "{:?}", fairlock_threads());
    let client = support::client_with_url(&server.url(), |b| b.lease(Duration::from_secs(1)));
    // a new thread names itself once it runs
    assert!(
        eventually(Duration::from_secs(5), || fairlock_threads().len() == 3),
        "{:?}",
        fairlock_threads()
    );

    // ten locks held and renewed, with waiters on them: still three threads
    let locks: Vec<_> = (0..10)
        .map(|i| client.fair_lock(&format!("l{i}")).unwrap())
        .collect();
    let guards: Vec<_> = locks.iter().map(|l| l.lock().unwrap()).collect();
    let waiters: Vec<_> = locks
        .iter()
        .map(|l| {
            let l = l.clone();
            std::thread::spawn(move || l.lock().unwrap().unlock().unwrap())
        })
        .collect();
    assert!(eventually(Duration::from_secs(5), || locks
        .iter()
        .all(|l| l.status().unwrap().waiters.len() == 1)));
    std::thread::sleep(Duration::from_millis(1500)); // renewals and heartbeats happen
    assert_eq!(fairlock_threads().len(), 3, "{:?}", fairlock_threads());
    assert!(guards.iter().all(|g| !g.is_lost()));
    drop(guards);
    for w in waiters {
        w.join().unwrap();
    }

    drop(locks);
    drop(client);
    assert!(
        eventually(Duration::from_secs(5), || fairlock_threads().is_empty()),
        "background threads outlived their client: {:?}",
        fairlock_threads()
    );

    // through a Sentinel group a fourth, the master watch ("fairlock-sentinel-<id>", cut to
    // 15 bytes by the kernel), which stops with its client too
    let group = SentinelGroup::start();
    let urls = group.sentinel_urls();
    let sentinels: Vec<&str> = urls.iter().map(String::as_str).collect();
    let client = fairlock::LockClient::builder_sentinel("mymaster", &sentinels)
        .build()
        .expect("a client through the sentinels");
    client
        .fair_lock("s")
        .unwrap()
        .lock()
        .unwrap()
        .unlock()
        .unwrap();
    assert!(
        eventually(Duration::from_secs(5), || {
            let names = fairlock_threads();
            names.len() == 4 && names.iter().any(|n| n.starts_with("fairlock-sentin"))
        }),
        "{:?}",
        fairlock_threads()
    );
    drop(client);
    assert!(
        eventually(Duration::from_secs(5), || fairlock_threads().is_empty()),
        "background threads outlived their Sentinel client: {:?}",
        fairlock_threads()
    );
}
