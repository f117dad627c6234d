//! FIFO fairness across processes, no barging, a live waiter keeping its place, and a waiter that
//! gives up passing nothing stuck.

use crate::support;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use crate::support::{eventually, say, RedisServer};

const SECS_5: Duration = Duration::from_secs(5);
const SECS_30: Duration = Duration::from_secs(30);

/// Child role "waiters": THREADS threads each take lock NAME once, print `ACQ <flag> <token>`
/// while holding it, and release it.
fn waiters_child() {
    support::child_time_limit(Duration::from_secs(60));
    let url: String = support::env_arg("URL");
    let name: String = support::env_arg("NAME");
    let threads: usize = support::env_arg("THREADS");
    let client = support::client_with_url(&url, |b| b);
    let lock = client.fair_lock(&name).unwrap();
    let handles: Vec<_> = (0..threads)
        .map(|i| {
            let lock = lock.clone();
            let client = client.clone();
            thread::Builder::new()
                .name(format!("w{}-{i}", std::process::id()))
                .spawn(move || {
                    let g = lock.lock().unwrap();
                    say(
                        "ACQ",
                        format!("{} {}", client.current_owner(), g.fencing_token()),
                    );
                    thread::sleep(Duration::from_millis(5));
                    g.unlock().unwrap();
                })
                .unwrap()
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    say("DONE", "");
}

#[test]
fn fifo_order_of_16_waiters_in_two_processes_equals_their_queue_order() {
    let children = support::child_test!("waiters" => waiters_child);
    let server = RedisServer::start();
    let client = support::client(&server);
    let lock = client.fair_lock("fifo").unwrap();
    let holder = lock.lock().unwrap();
    let blpops_before = server.command_calls("blpop");

    let env = |n: usize| {
        vec![
            ("URL", server.url()),
            ("NAME", "fifo".to_string()),
            ("THREADS", n.to_string()),
        ]
    };
    let mut workers = vec![
        children.spawn("waiters", &env(8)),
        children.spawn("waiters", &env(8)),
    ];
    // all 16 enqueue (in whatever interleaving) while the lock is held
    assert!(
        support::queued(&lock, 16, SECS_30),
        "only {} waiters queued",
        lock.status().unwrap().waiters.len()
    );
    let status = lock.status().unwrap();
    let queue: Vec<String> = status
        .waiters
        .iter()
        .map(|w| w.origin.owner.clone())
        .collect();
    let pids: HashSet<u32> = status.waiters.iter().map(|w| w.origin.pid).collect();
    let expected_pids: HashSet<u32> = workers.iter().map(|w| w.pid()).collect();
    assert_eq!(
        pids, expected_pids,
        "waiters should come from both child processes"
    );

    let first = holder.fencing_token();
    holder.unlock().unwrap();

    // the fencing token records the grant order exactly (tokens are time-seeded: their order
    // is known, not their values)
    let mut grants: Vec<(u64, String)> = vec![];
    for w in &mut workers {
        for _ in 0..8 {
            let line = w.expect("ACQ", SECS_30);
            let (flag, token) = line.split_once(' ').unwrap();
            grants.push((token.parse().unwrap(), flag.to_string()));
        }
        w.expect("DONE", SECS_30);
        assert!(w.exits_ok(SECS_30), "child {} failed", w.name());
    }
    grants.sort();
    let order: Vec<String> = grants.iter().map(|(_, f)| f.clone()).collect();
    let tokens: Vec<u64> = grants.iter().map(|(t, _)| *t).collect();
    assert_eq!(order, queue, "acquisition order differs from queue order");
    assert!(tokens[0] > first, "{tokens:?} after {first}");
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "two grants shared a token: {tokens:?}"
    );
    // the counter is the last waiter's token: no hold came after the 16 (tokens are no longer
    // dense, so 16 waiters in queue order, above, is what shows nobody else took a turn)
    assert_eq!(
        lock.status().unwrap().fencing_counter,
        tokens[15],
        "someone else took a turn"
    );

    // one addressed wake-up per waiter: each blocked once (no ping-pong of wake-ups)
    let blpops = server.command_calls("blpop") - blpops_before;
    println!("{blpops} BLPOPs for 16 hand-offs");
    assert!(blpops <= 20, "{blpops} BLPOPs for 16 hand-offs");
    server.assert_released_keys("fifo");
}

#[test]
fn no_barging_try_lock_fails_around_every_release_and_a_newcomer_queues_last() {
    let server = RedisServer::start();
    let holder_client = support::client(&server);
    let lock = holder_client.fair_lock("barge").unwrap();
    let holder = lock.lock().unwrap();
    let first = holder.fencing_token();

    let served = Arc::new(AtomicU32::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let (tokens_tx, tokens_rx) = mpsc::channel();
    let waiters = support::spawn_queued(&lock, 3, SECS_5, |i| {
        let client = support::client(&server);
        let served = served.clone();
        let stop = stop.clone();
        let tokens_tx = tokens_tx.clone();
        move || {
            let g = client.fair_lock("barge").unwrap().lock().unwrap();
            tokens_tx.send((i, g.fencing_token())).unwrap();
            if served.fetch_add(1, Ordering::SeqCst) + 1 == 3 {
                // the last waiter keeps the lock until the barger stops: after it, nobody is queued
                assert!(eventually(SECS_30, || stop.load(Ordering::SeqCst)));
            } else {
                thread::sleep(Duration::from_millis(100));
            }
            g.unlock().unwrap();
        }
    });

    // a newcomer that spins on try_lock across all the hand-offs
    let barger = {
        let client = support::client(&server);
        let served = served.clone();
        let stop = stop.clone();
        thread::spawn(move || {
            let lock = client.fair_lock("barge").unwrap();
            let mut attempts = 0u32;
            let deadline = Instant::now() + SECS_30;
            while served.load(Ordering::SeqCst) < 3 && Instant::now() < deadline {
                if let Some(g) = lock.try_lock().unwrap() {
                    panic!(
                        "try_lock barged in with token {} after {attempts} attempts",
                        g.fencing_token()
                    );
                }
                attempts += 1;
            }
            stop.store(true, Ordering::SeqCst);
            attempts
        })
    };
    // and a newcomer that calls lock() after the three: it must come after them
    let (late_tx, late_rx) = mpsc::channel();
    let late = {
        let client = support::client(&server);
        thread::spawn(move || {
            let g = client.fair_lock("barge").unwrap().lock().unwrap();
            late_tx.send(g.fencing_token()).unwrap();
        })
    };
    assert!(support::queued(&lock, 4, SECS_5));
    thread::sleep(Duration::from_millis(100)); // let the barger spin before the first release
    holder.unlock().unwrap();

    let attempts = barger.join().unwrap();
    assert!(attempts >= 3, "the barger hardly ran ({attempts} attempts)");
    for w in waiters {
        w.join().unwrap();
    }
    late.join().unwrap();
    let mut got: Vec<(usize, u64)> = tokens_rx.try_iter().collect();
    got.sort();
    // in queue order (0, 1, 2) the tokens rise from the holder's; they are time-seeded, so
    // only their order is checked
    let waiter_tokens: Vec<u64> = got.iter().map(|(_, t)| *t).collect();
    assert!(
        waiter_tokens[0] > first && waiter_tokens.windows(2).all(|w| w[0] < w[1]),
        "waiters not served in order: {waiter_tokens:?} after {first}"
    );
    let late_token = late_rx.recv_timeout(SECS_5).unwrap();
    assert!(
        late_token > waiter_tokens[2],
        "the newcomer was not served last: {late_token} vs {waiter_tokens:?}"
    );
}

#[test]
fn a_live_waiter_keeps_its_place_however_long_the_lock_is_held() {
    let server = RedisServer::start();
    // a 1 s lease renewed by the watchdog; waiters are presumed dead after 3 x 200 ms without a
    // heartbeat, so this hold lasts many waiter timeouts and several leases
    let client = support::client_with_url(&server.url(), |b| b.lease(Duration::from_secs(1)));
    let lock = client.fair_lock("patient").unwrap();
    let g = lock.lock().unwrap();
    let held = g.fencing_token();
    let (tx, rx) = mpsc::channel();
    let threads = support::spawn_queued(&lock, 3, SECS_5, |i| {
        let c = support::client(&server);
        let tx = tx.clone();
        move || {
            let g = c.fair_lock("patient").unwrap().lock().unwrap();
            tx.send((g.fencing_token(), i)).unwrap();
        }
    });
    let queue: Vec<String> = support::queue_owners(&lock);
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(2500) {
        let now: Vec<String> = support::queue_owners(&lock);
        assert_eq!(now, queue, "the queue changed after {:?}", start.elapsed());
        thread::sleep(Duration::from_millis(100));
    }
    assert!(!g.is_lost());
    g.unlock().unwrap();
    support::assert_served_in_queue_order(threads, &rx, held);
}

#[test]
fn a_waiter_that_gives_up_at_the_moment_of_release_leaves_nothing_stuck() {
    let server = RedisServer::start();
    let client = support::client(&server);
    let lock = client.fair_lock("giveup").unwrap();
    let patience = Duration::from_millis(300);
    // release slightly before, at, and after the first waiter's deadline
    for offset_ms in [-30i64, -10, -4, -2, 0, 2, 4, 10, 30, 60, 90] {
        let holder = lock.lock().unwrap();
        let (start_tx, start_rx) = mpsc::channel();
        let impatient = {
            let lock = lock.clone();
            thread::spawn(move || {
                start_tx.send(Instant::now()).unwrap();
                let got = lock.try_lock_for(patience).unwrap();
                got.map(|g| {
                    let t = g.fencing_token();
                    g.unlock().unwrap();
                    t
                })
            })
        };
        let started = start_rx.recv_timeout(SECS_5).unwrap();
        assert!(support::queued(&lock, 1, SECS_5));
        let (tx, rx) = mpsc::channel();
        let patient = {
            let lock = lock.clone();
            thread::spawn(move || {
                let g = lock.lock().unwrap();
                tx.send(g.fencing_token()).unwrap();
                g.unlock().unwrap();
            })
        };
        assert!(support::queued(&lock, 2, SECS_5));
        let at = patience.as_millis() as i64 + offset_ms;
        let wait = Duration::from_millis(at.max(0) as u64).saturating_sub(started.elapsed());
        thread::sleep(wait);
        let released = Instant::now();
        holder.unlock().unwrap();
        let token = rx.recv_timeout(Duration::from_secs(3)).unwrap_or_else(|_| {
            panic!("offset {offset_ms} ms: the next waiter never got the lock")
        });
        assert!(released.elapsed() < Duration::from_secs(3));
        let impatient_token = impatient.join().unwrap();
        if let Some(t) = impatient_token {
            assert!(t < token, "offset {offset_ms} ms: order broken");
        }
        patient.join().unwrap();
        assert!(eventually(SECS_5, || {
            let st = lock.status().unwrap();
            st.holder.is_none() && st.waiters.is_empty()
        }));
        println!("offset {offset_ms:>3} ms: impatient got {impatient_token:?}, patient {token}");
    }
    server.assert_released_keys("giveup");
}

#[test]
fn a_waiter_sleeps_in_one_blpop_instead_of_polling() {
    let server = RedisServer::start();
    let client = support::client(&server);
    let lock = client.fair_lock("sleepy").unwrap();
    let g = lock.lock().unwrap();
    let waiter = {
        let lock = lock.clone();
        thread::spawn(move || lock.lock().unwrap().fencing_token())
    };
    assert!(support::queued(&lock, 1, SECS_5));
    let blpop = server.command_calls("blpop");
    let script_calls = || server.command_calls("fcall") + server.command_calls("evalsha");
    let scripts_before = script_calls();
    let total = server.total_commands();
    thread::sleep(Duration::from_secs(2));
    let blpops = server.command_calls("blpop") - blpop;
    let scripts = script_calls() - scripts_before;
    let commands = server.total_commands() - total;
    println!("2 s of waiting: {blpops} BLPOP, {scripts} scripts, {commands} commands");
    // one blocking pop (it may have started just before we looked) and the janitor's heartbeat
    // every 200 ms: a polling waiter (a 100 ms retry loop) would show 20+ attempts
    assert!(blpops <= 1, "{blpops} BLPOPs in 2 s");
    assert!(scripts <= 20, "{scripts} scripts in 2 s");
    let held = g.fencing_token();
    g.unlock().unwrap();
    assert!(waiter.join().unwrap() > held);
}

/// Redisson's fair-lock scenario: waiters queued 100 ms apart behind holds that are never
/// released, only run out (fixed lease): nobody pushes a wake-up, yet each waiter gets the lock
/// in order soon after the previous lease ends, and a newcomer's try_lock never barges in.
#[test]
fn waiters_behind_expiring_leases_are_served_in_order_and_a_newcomer_never_barges() {
    let server = RedisServer::start();
    let client = support::client(&server);
    let lease = Duration::from_millis(400);
    // the first hold is released; all later ones only run out
    let lock = client.fair_lock("expiring").unwrap();
    let first = lock.lock().unwrap();
    let first_token = first.fencing_token();

    const N: usize = 5;
    let served = Arc::new(AtomicU32::new(0));
    let (tx, rx) = mpsc::channel();
    let mut threads = vec![];
    for i in 0..N {
        let c = support::client(&server);
        let served = served.clone();
        let tx = tx.clone();
        threads.push(thread::spawn(move || {
            let lock = c
                .fair_lock("expiring")
                .unwrap()
                .with_fixed_lease(lease)
                .unwrap();
            let g = lock.lock().unwrap();
            tx.send((g.fencing_token(), i, Instant::now())).unwrap();
            served.fetch_add(1, Ordering::SeqCst);
            // never release: wait until the lease has run out, then drop the stale guard
            assert!(eventually(SECS_30, || g.is_lost()));
            thread::sleep(Duration::from_millis(50));
        }));
        assert!(support::queued(&lock, i + 1, SECS_5));
        thread::sleep(Duration::from_millis(100));
    }
    let barger = {
        let c = support::client(&server);
        let served = served.clone();
        thread::spawn(move || {
            let lock = c.fair_lock("expiring").unwrap();
            let deadline = Instant::now() + SECS_30;
            let mut attempts = 0;
            // up to the moment the last waiter is served, a free lock belongs to the queue
            while served.load(Ordering::SeqCst) < N as u32 - 1 && Instant::now() < deadline {
                if let Some(g) = lock.try_lock().unwrap() {
                    panic!("try_lock barged in with token {}", g.fencing_token());
                }
                attempts += 1;
                thread::sleep(Duration::from_millis(2));
            }
            attempts
        })
    };
    let start = Instant::now();
    first.unlock().unwrap();
    for t in threads {
        t.join().unwrap();
    }
    assert!(barger.join().unwrap() > 0);
    let mut got: Vec<(u64, usize, Instant)> = rx.try_iter().collect();
    got.sort();
    let order: Vec<usize> = got.iter().map(|g| g.1).collect();
    assert_eq!(
        order,
        (0..N).collect::<Vec<_>>(),
        "not served in queue order"
    );
    // sorted by token above, so only their start and distinctness are left to check
    let tokens: Vec<u64> = got.iter().map(|g| g.0).collect();
    assert!(tokens[0] > first_token, "{tokens:?} after {first_token}");
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    // each turn is one lease plus the janitor's reaction; generous bound
    let took = got.last().unwrap().2.duration_since(start);
    println!("{N} expiring holds handed on in {took:?}");
    assert!(
        took < (lease + Duration::from_secs(1)) * N as u32,
        "took {took:?}"
    );
}
