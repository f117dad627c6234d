//! Leases and fencing tokens: a fixed lease runs out and is never renewed, the watchdog keeps a
//! renewed lease alive for as long as the guard lives, and tokens only ever go up.

use crate::support;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::support::{eventually, RedisServer};
use fairlock::Error;

const SECS_5: Duration = Duration::from_secs(5);

#[test]
fn fixed_lease_runs_out_unrenewed_and_the_next_owner_gets_a_higher_token() {
    let server = RedisServer::start();
    let client = support::client(&server);
    let other = support::client(&server);
    let job = client
        .fair_lock("job")
        .unwrap()
        .with_fixed_lease(Duration::from_millis(600))
        .unwrap();

    let start = Instant::now();
    let g = job.try_lock().unwrap().expect("free");
    let first = g.fencing_token();
    // the lease only goes down: nobody renews a fixed lease
    let mut last = server.pttl("fairlock:{job}");
    assert!(last > 0 && last <= 600, "fixed lease TTL {last} ms");
    // while it runs, another client cannot take it
    assert!(other
        .fair_lock("job")
        .unwrap()
        .try_lock()
        .unwrap()
        .is_none());
    while job.is_locked().unwrap() {
        let p = server.pttl("fairlock:{job}");
        if p >= 0 {
            assert!(p <= last + 5, "fixed lease was renewed: {last} -> {p} ms");
            last = p;
        }
        assert!(start.elapsed() < SECS_5, "fixed lease did not run out");
        thread::sleep(Duration::from_millis(25));
    }
    assert!(
        start.elapsed() >= Duration::from_millis(500),
        "ran out early: {:?}",
        start.elapsed()
    );
    assert!(g.is_lost());
    assert!(!g.is_held_in_redis().unwrap());

    // another owner takes it: a greater token
    let next = other
        .fair_lock("job")
        .unwrap()
        .try_lock()
        .unwrap()
        .expect("free after expiry");
    assert!(next.fencing_token() > first);
    assert!(matches!(g.unlock(), Err(Error::NotHeld { .. })));
    assert!(next.is_held_in_redis().unwrap());
    next.unlock().unwrap();
}

#[test]
fn watchdog_keeps_a_lock_for_three_and_a_half_leases() {
    let server = RedisServer::start();
    let holder = support::client_with_url(&server.url(), |b| b.lease(Duration::from_secs(1)));
    let other = support::client(&server);
    let lock = holder.fair_lock("long-job").unwrap();
    let rival = other.fair_lock("long-job").unwrap();

    let g = lock.lock().unwrap();
    let token = g.fencing_token();
    let start = Instant::now();
    let mut attempts = 0;
    while start.elapsed() < Duration::from_millis(3500) {
        assert!(
            rival.try_lock().unwrap().is_none(),
            "rival took a watched lock after {:?}",
            start.elapsed()
        );
        attempts += 1;
        let st = rival.status().unwrap();
        let h = st.holder.expect("lock vanished while held");
        assert_eq!(h.fencing_token, token);
        assert_eq!(h.origin.owner, holder.current_owner());
        assert!(h.lease_remaining <= Duration::from_secs(1));
        assert!(
            !g.is_lost(),
            "guard marked lost after {:?}",
            start.elapsed()
        );
        thread::sleep(Duration::from_millis(100));
    }
    assert!(attempts >= 10);
    assert!(g.is_held_in_redis().unwrap());
    assert!(!g.is_lost());
    assert!(g.lease_remaining() > Duration::ZERO);
    assert_eq!(rival.status().unwrap().fencing_counter, token);
    g.unlock().unwrap();
    // renewal stopped with the release: the key is gone and stays gone
    thread::sleep(Duration::from_millis(500));
    assert!(!lock.is_locked().unwrap());
    server.assert_released_keys("long-job");
}

#[test]
fn with_lease_overrides_the_client_lease_per_handle() {
    let server = RedisServer::start();
    let client = support::client(&server);
    let lock = client
        .fair_lock("per-handle")
        .unwrap()
        .with_lease(Duration::from_secs(1))
        .unwrap();
    let g = lock.lock().unwrap();
    let p = server.pttl("fairlock:{per-handle}");
    assert!(p > 0 && p <= 1000, "lease TTL {p} ms");
    thread::sleep(Duration::from_millis(1500));
    assert!(
        g.is_held_in_redis().unwrap(),
        "the 1 s lease was not renewed"
    );
    g.unlock().unwrap();
}

#[test]
fn fencing_tokens_strictly_increase_across_owners_clients_and_expiries() {
    let server = RedisServer::start();
    let c1 = support::client(&server);
    let c2 = support::client(&server);
    let lock1 = c1.fair_lock("fence").unwrap();
    let lock2 = c2.fair_lock("fence").unwrap();
    let mut tokens = vec![];

    // an owner, and its re-entries that return the outer token
    let g = lock1.lock().unwrap();
    let inner = lock1.lock().unwrap();
    let inner2 = lock1.try_lock_for(Duration::from_secs(1)).unwrap().unwrap();
    assert_eq!(inner.fencing_token(), g.fencing_token());
    assert_eq!(inner2.fencing_token(), g.fencing_token());
    tokens.push(g.fencing_token());
    drop(inner2);
    drop(inner);
    g.unlock().unwrap();

    // other threads of the same client, and another client
    for i in 0..3 {
        let lock = if i % 2 == 0 {
            lock1.clone()
        } else {
            lock2.clone()
        };
        tokens.push(
            thread::spawn(move || lock.lock().unwrap().fencing_token())
                .join()
                .unwrap(),
        );
    }
    tokens.push(lock2.lock().unwrap().fencing_token());

    // a hold whose fixed lease runs out, then the next owner
    let fixed = lock1.with_fixed_lease(Duration::from_millis(200)).unwrap();
    let expired = fixed.lock().unwrap();
    tokens.push(expired.fencing_token());
    assert!(eventually(SECS_5, || !lock2.is_locked().unwrap()));
    let after = lock2.lock().unwrap();
    tokens.push(after.fencing_token());
    assert!(matches!(expired.unlock(), Err(Error::NotHeld { .. })));
    after.unlock().unwrap();

    // a hand-off from a holder to a waiter, and a forced unlock
    let (tx, rx) = mpsc::channel();
    let h = lock1.lock().unwrap();
    tokens.push(h.fencing_token());
    let waiter = {
        let lock2 = lock2.clone();
        thread::spawn(move || {
            let g = lock2.lock().unwrap();
            tx.send(g.fencing_token()).unwrap();
            std::mem::forget(g); // hold until force_unlock; the guard's thread exits
        })
    };
    assert!(support::queued(&lock1, 1, SECS_5));
    h.unlock().unwrap();
    tokens.push(rx.recv_timeout(SECS_5).unwrap());
    waiter.join().unwrap();
    assert!(lock1.force_unlock().unwrap().is_some());
    tokens.push(lock1.lock().unwrap().fencing_token());

    println!("tokens {tokens:?}");
    for w in tokens.windows(2) {
        assert!(w[1] > w[0], "tokens not strictly increasing: {tokens:?}");
    }
    assert_eq!(
        lock1.status().unwrap().fencing_counter,
        *tokens.last().unwrap()
    );
}
