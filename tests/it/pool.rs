//! Waiters blocked in BLPOP never starve the command pool: with `pool_size` 8 and 64 threads
//! waiting on one lock, the holder's renewals and release still go through, and all 64 acquire.

use crate::support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use crate::support::{eventually, RedisServer};

const WAITERS: usize = 64;

#[test]
fn sixty_four_waiters_do_not_starve_a_pool_of_eight() {
    let server = RedisServer::start();
    let client = support::client_with_url(&server.url(), |b| {
        b.pool_size(8).lease(Duration::from_secs(1))
    });
    let rival_client = support::client(&server);
    let rival = rival_client.fair_lock("crowded").unwrap();
    let lock = client.fair_lock("crowded").unwrap();
    let holder = lock.lock().unwrap();
    let first = holder.fencing_token();

    let inside = Arc::new(AtomicU32::new(0));
    let (tx, rx) = mpsc::channel();
    let threads: Vec<_> = (0..WAITERS)
        .map(|i| {
            let lock = lock.clone();
            let client = client.clone();
            let inside = inside.clone();
            let tx = tx.clone();
            thread::spawn(move || {
                let g = lock.lock().unwrap();
                assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                thread::sleep(Duration::from_millis(1));
                inside.fetch_sub(1, Ordering::SeqCst);
                tx.send((g.fencing_token(), client.current_owner(), i))
                    .unwrap();
                g.unlock().unwrap();
            })
        })
        .collect();
    assert!(
        eventually(Duration::from_secs(30), || rival
            .status()
            .unwrap()
            .waiters
            .len()
            == WAITERS),
        "only {} of {WAITERS} queued",
        rival.status().unwrap().waiters.len()
    );
    let queue: Vec<String> = support::queue_owners(&rival);

    // hold for 2.5 leases while all 64 wait: the watchdog's renewals need a pooled connection
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(2500) {
        assert!(
            !holder.is_lost(),
            "renewal starved after {:?}",
            start.elapsed()
        );
        assert!(rival.try_lock().unwrap().is_none());
        let h = rival
            .status()
            .unwrap()
            .holder
            .expect("the holder's lease ran out");
        assert_eq!(h.fencing_token, first);
        thread::sleep(Duration::from_millis(100));
    }
    // the holder's own commands still get a connection promptly
    let t = Instant::now();
    assert!(holder.is_held_in_redis().unwrap());
    assert_eq!(lock.hold_count().unwrap(), 1);
    holder.unlock().unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "pool starved: {:?}",
        t.elapsed()
    );

    for t in threads {
        t.join().unwrap();
    }
    let mut grants: Vec<(u64, String, usize)> = rx.try_iter().collect();
    assert_eq!(grants.len(), WAITERS);
    grants.sort();
    // sorted by token: all after the holder's and all distinct (tokens are time-seeded, so
    // not first + 1, first + 2...); the queue order is checked on the owners below
    let tokens: Vec<u64> = grants.iter().map(|g| g.0).collect();
    assert!(tokens[0] > first, "{tokens:?} after {first}");
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    let order: Vec<String> = grants.into_iter().map(|g| g.1).collect();
    assert_eq!(order, queue, "not served in queue order");
    server.assert_released_keys("crowded");
}

/// Every connection of a client (the pool's and the waker's) has `TCP_NODELAY` set, as Redis
/// sets it on its side: a request is never held back by Nagle's algorithm waiting for the
/// server's delayed ACK.
#[test]
fn every_connection_to_redis_has_tcp_nodelay_set() {
    let server = RedisServer::start();
    let client = support::client(&server);
    let lock = client.fair_lock("nodelay").unwrap();
    let held = lock.lock().unwrap();
    let waiter = {
        let lock = lock.clone();
        thread::spawn(move || lock.lock().map(|g| g.fencing_token()))
    };
    // the waiter blocks on the waker's connection, the pool has the holder's
    let waiting = eventually(Duration::from_secs(10), || {
        lock.status().unwrap().waiters.len() == 1
    });
    assert!(waiting, "the waiter never queued");
    let sockets = support::nodelay_of_connections_to(server.port);
    assert!(sockets.len() >= 2, "connections found: {sockets:?}");
    assert!(
        sockets.iter().all(|&on| on),
        "TCP_NODELAY per connection: {sockets:?}"
    );
    drop(held);
    assert!(waiter.join().unwrap().is_ok());
}
