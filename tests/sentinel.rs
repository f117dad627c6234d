//! A Sentinel group on loopback (1 master, 2 replicas, 3 sentinels; `support::topology`): the
//! client reaches the master through the sentinels and follows a failover without a restart.
//! Waiters blocked on the old master re-check their places on the new one and are served in
//! order, a hold that reached the replicas survives, and tokens keep rising.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use support::topology::SentinelGroup;

const SECS_30: Duration = Duration::from_secs(30);
const SECS_60: Duration = Duration::from_secs(60);

fn client(group: &SentinelGroup) -> fairlock::LockClient {
    let urls = group.sentinel_urls();
    let sentinels: Vec<&str> = urls.iter().map(String::as_str).collect();
    fairlock::LockClient::builder_sentinel("mymaster", &sentinels)
        .lease(Duration::from_secs(10))
        .janitor_interval(Duration::from_millis(300))
        .failover_timeout(SECS_30)
        .build()
        .expect("a client through the sentinels")
}

/// `ZCARD` of the lock's queue on `port`.
fn queued_on(group: &SentinelGroup, port: u16, name: &str) -> usize {
    redis::cmd("ZCARD")
        .arg(format!("fairlock:{{{name}}}:queue"))
        .query(&mut group.conn_to(port))
        .unwrap_or(0)
}

/// Wait (bounded) until every replica has the queue with `n` entries: what the failover test
/// assumes reached them before the master dies.
fn wait_replicated(group: &SentinelGroup, name: &str, n: usize) {
    let replicas = group.replica_ports();
    assert!(
        support::eventually(SECS_30, || replicas
            .iter()
            .all(|p| queued_on(group, *p, name) == n)),
        "the queue of {n} did not reach the replicas {replicas:?}"
    );
}

#[test]
fn a_master_killed_under_a_hold_and_waiters_serves_every_waiter_in_order_on_the_new_master() {
    let mut group = SentinelGroup::start();
    let client = client(&group);
    let lock = client.lock("failover").unwrap();
    let guard = lock.lock().unwrap();
    let first_token = guard.fencing_token();
    let in_section = Arc::new(AtomicBool::new(true));

    // 4 waiters queue one after another (each waits until the queue shows it)
    let served = Arc::new(Mutex::new(Vec::new()));
    let (errors_tx, errors) = mpsc::channel();
    let mut waiters = vec![];
    for i in 0..4 {
        let waiter = lock.clone();
        let in_section = in_section.clone();
        let served = served.clone();
        let errors_tx = errors_tx.clone();
        waiters.push(thread::spawn(move || match waiter.try_lock_for(SECS_60) {
            Ok(Some(g)) => {
                assert!(
                    !in_section.swap(true, Ordering::SeqCst),
                    "two holders at once"
                );
                served.lock().unwrap().push((i, g.fencing_token()));
                thread::sleep(Duration::from_millis(20));
                in_section.store(false, Ordering::SeqCst);
                if let Err(e) = g.unlock() {
                    let _ = errors_tx.send(format!("waiter {i} release: {e}"));
                }
            }
            Ok(None) => {
                let _ = errors_tx.send(format!("waiter {i} not served in 60 s"));
            }
            Err(e) => {
                let _ = errors_tx.send(format!("waiter {i}: {e}"));
            }
        }));
        assert!(
            support::eventually(SECS_30, || lock.status().unwrap().waiters.len() == i + 1),
            "waiter {i} did not queue"
        );
    }
    drop(errors_tx);
    wait_replicated(&group, "failover", 4);

    let old = group.kill_master();
    let new = group.wait_for_new_master(old, SECS_60);
    assert_ne!(old, new);

    // the hold reached the replicas before the kill: it lives on, and renewals go to the new
    // master (the watchdog rides out the failover)
    let renewed_after = Instant::now();
    assert!(
        support::eventually(SECS_30, || lock
            .status()
            .is_ok_and(|s| s.waiters.len() == 4)),
        "the queue did not survive the failover"
    );
    thread::sleep(Duration::from_secs(4)); // more than a third of the lease: a renewal ran
    assert!(
        !guard.is_lost(),
        "a replicated hold was reported lost after {:?}",
        renewed_after.elapsed()
    );
    in_section.store(false, Ordering::SeqCst);
    guard.unlock().expect("release on the new master");

    for w in waiters {
        w.join().expect("a waiter panicked");
    }
    let errors: Vec<String> = errors.iter().collect();
    assert!(errors.is_empty(), "{errors:?}");
    let served = served.lock().unwrap().clone();
    let order: Vec<usize> = served.iter().map(|(i, _)| *i).collect();
    assert_eq!(order, vec![0, 1, 2, 3], "served out of queue order");
    let tokens: Vec<u64> = served.iter().map(|(_, t)| *t).collect();
    assert!(tokens[0] > first_token, "{tokens:?} after {first_token}");
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    let status = lock.status().unwrap();
    assert!(
        status.holder.is_none() && status.waiters.is_empty(),
        "{status:?}"
    );
}

#[test]
fn a_graceful_failover_under_load_loses_no_update() {
    let group = SentinelGroup::start();
    let client = client(&group);
    let lock = client.lock("graceful").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let in_section = Arc::new(AtomicBool::new(false));
    let done = Arc::new(Mutex::new(Vec::new()));
    let mut workers = vec![];
    for w in 0..4 {
        let (lock, stop, in_section, done) =
            (lock.clone(), stop.clone(), in_section.clone(), done.clone());
        workers.push(thread::spawn(move || {
            let mut tokens = vec![];
            let mut errors = vec![];
            while !stop.load(Ordering::SeqCst) {
                match lock.try_lock_for(SECS_30) {
                    Ok(Some(g)) => {
                        assert!(
                            !in_section.swap(true, Ordering::SeqCst),
                            "two holders at once"
                        );
                        tokens.push(g.fencing_token());
                        thread::sleep(Duration::from_millis(2));
                        in_section.store(false, Ordering::SeqCst);
                        if let Err(e) = g.unlock() {
                            errors.push(format!("worker {w} release: {e}"));
                        }
                    }
                    Ok(None) => errors.push(format!("worker {w}: not served in 30 s")),
                    Err(e) => errors.push(format!("worker {w}: {e}")),
                }
            }
            done.lock().unwrap().push((tokens, errors));
        }));
    }
    thread::sleep(Duration::from_millis(500));
    let old = group.master_port();
    let new = group.failover();
    assert_ne!(old, new);
    thread::sleep(Duration::from_millis(1500));
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        w.join().expect("a worker panicked");
    }
    let done = done.lock().unwrap();
    let errors: Vec<&String> = done.iter().flat_map(|(_, e)| e).collect();
    assert!(errors.is_empty(), "{errors:?}");
    let mut tokens: Vec<u64> = done.iter().flat_map(|(t, _)| t.iter().copied()).collect();
    let n = tokens.len();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), n, "two holds shared a token");
    assert!(n > 20, "only {n} acquisitions");
}

#[test]
fn sentinel_urls_without_a_master_name_or_with_a_password_are_refused() {
    for url in [
        "redis+sentinel://127.0.0.1:26379",
        "redis+sentinel://127.0.0.1:26379/",
        "redis+sentinel:///mymaster",
        "redis+sentinel://127.0.0.1:26379/mymaster/extra",
        "redis+sentinel://user:pw@127.0.0.1:26379/mymaster",
    ] {
        match fairlock::LockClient::connect(url) {
            Err(fairlock::Error::InvalidUrl { .. }) => {}
            other => panic!("{url}: {:?}", other.map(|_| "a client")),
        }
    }
}
