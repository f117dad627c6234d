//! The counting semaphore and the read/write lock against a real redis-server, one test per
//! guarantee (docs/guarantees.md, "Semaphores and read/write locks"): never more than
//! capacity (an interval check over threads of several processes), FIFO with a large request
//! never overtaken, no barging, the read/write shape, crash safety, fencing, capacity as part
//! of the state, loss told to the holder, and key hygiene.

use crate::support;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::support::{eventually, say, unix_micros, RedisServer};
use fairlock::{Error, LockClient, Semaphore};

const SECS_30: Duration = Duration::from_secs(30);

fn waiting(sem: &Semaphore, n: usize) -> bool {
    eventually(SECS_30, || sem.status().unwrap().waiters.len() == n)
}

/// Start a thread named `name` that takes `permits` of `sem`, sends `(name, token)` on `tx` when
/// it has them, and holds them until told on the channel returned (or for 30 s).
fn taker(
    sem: &Semaphore,
    name: &str,
    permits: u64,
    tx: &mpsc::Sender<(String, u64)>,
) -> (thread::JoinHandle<()>, mpsc::Sender<()>) {
    let (sem, tx, label) = (sem.clone(), tx.clone(), name.to_string());
    let (release, told) = mpsc::channel::<()>();
    let t = thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            let p = sem.acquire_many(permits).unwrap();
            tx.send((label, p.fencing_token())).unwrap();
            let _ = told.recv_timeout(SECS_30);
            p.release().unwrap();
        })
        .unwrap();
    (t, release)
}

/// Child roles (env URL, NAME, CAP, LEASE_MS, and for "worker" ROUNDS and SEED):
/// - "holder": take 2 permits, print `HELD <token>`, hold until killed;
/// - "waiter": print `WAITING`, take 1 permit, print `GOT <token>`, hold until killed;
/// - "worker": ROUNDS times take 1-3 permits, print `IV <start us> <end us> <permits> <token>`
///   for the time it held them (measured inside the hold), then print `DONE`.
fn sem_child(role: &str) {
    support::child_time_limit(Duration::from_secs(120));
    let url: String = support::env_arg("URL");
    let name: String = support::env_arg("NAME");
    let cap: u64 = support::env_arg("CAP");
    let lease_ms: u64 = support::env_arg("LEASE_MS");
    let client = support::client_with_url(&url, |b| b.lease(Duration::from_millis(lease_ms)));
    let sem = client.semaphore(&name, cap).unwrap();
    match role {
        "holder" => {
            let p = sem.acquire_many(2).unwrap();
            say("HELD", p.fencing_token());
            thread::sleep(Duration::from_secs(120));
        }
        "waiter" => {
            say("WAITING", "");
            let p = sem.acquire().unwrap();
            say("GOT", p.fencing_token());
            thread::sleep(Duration::from_secs(120));
        }
        "worker" => {
            let rounds: u64 = support::env_arg("ROUNDS");
            let seed: u64 = support::env_arg("SEED");
            let out = std::sync::Mutex::new(());
            thread::scope(|s| {
                for t in 0..3u64 {
                    let (sem, out) = (&sem, &out);
                    s.spawn(move || {
                        let mut rng = fastrand::Rng::with_seed(seed * 10 + t);
                        for _ in 0..rounds {
                            let k = rng.u64(1..=3);
                            let p = sem.acquire_many(k).unwrap();
                            let start = unix_micros();
                            thread::sleep(Duration::from_micros(rng.u64(0..2000)));
                            let end = unix_micros();
                            let token = p.fencing_token();
                            p.release().unwrap();
                            let _g = out.lock().unwrap();
                            say("IV", format!("{start} {end} {k} {token}"));
                        }
                    });
                }
            });
            say("DONE", "");
        }
        other => panic!("unknown role {other}"),
    }
}

fn env(server: &RedisServer, name: &str, cap: u64, lease_ms: u64) -> Vec<(&'static str, String)> {
    vec![
        ("URL", server.url()),
        ("NAME", name.to_string()),
        ("CAP", cap.to_string()),
        ("LEASE_MS", lease_ms.to_string()),
    ]
}

/// Guarantee 1, the counter-style invariant: workers in three processes (three threads each)
/// take 1-3 permits of a semaphore of capacity 4 again and again; each records the interval it
/// held them (inside the hold). Checked offline: at no moment do the recorded intervals hold
/// more than 4 permits together, and every acquisition got its own token.
#[test]
fn weighted_holders_in_several_processes_never_hold_more_than_capacity() {
    let children = support::child_test!(sem_child);
    let server = RedisServer::start();
    let (cap, rounds) = (4u64, 40u64);
    let mut env = env(&server, "slots", cap, 30_000);
    env.push(("ROUNDS", rounds.to_string()));
    let workers: Vec<_> = (0..3)
        .map(|i| {
            let mut env = env.clone();
            env.push(("SEED", (20261127 + i).to_string()));
            children.spawn("worker", &env)
        })
        .collect();
    let mut intervals = vec![];
    for w in workers {
        let out = w.finish(Duration::from_secs(100));
        assert_eq!(out.code, Some(0), "a worker failed: {}", out.stdout);
        // (libtest's own "test ... " may share a line with the first)
        for line in out
            .stdout
            .lines()
            .filter_map(|l| l.split_once("IV ").map(|(_, r)| r))
        {
            let v: Vec<u64> = line.split(' ').map(|x| x.parse().unwrap()).collect();
            intervals.push((v[0], v[1], v[2], v[3]));
        }
    }
    assert_eq!(intervals.len() as u64, 3 * 3 * rounds);
    // a sweep over starts and ends: an end at the same µs as a start frees first (the end was
    // measured before the release, the start after the grant)
    let mut events: Vec<(u64, i64)> = vec![];
    for &(start, end, k, _) in &intervals {
        events.push((start, k as i64));
        events.push((end, -(k as i64)));
    }
    events.sort_by_key(|&(t, d)| (t, d));
    let (mut held, mut most) = (0i64, 0i64);
    for (_, d) in events {
        held += d;
        most = most.max(held);
    }
    assert!(
        most <= cap as i64,
        "{most} permits held at once (capacity {cap})"
    );
    assert!(
        most >= 2,
        "the workers never overlapped ({most}): the check saw nothing"
    );
    let mut tokens: Vec<u64> = intervals.iter().map(|iv| iv.3).collect();
    tokens.sort();
    tokens.dedup();
    assert_eq!(
        tokens.len(),
        intervals.len(),
        "two acquisitions shared a token"
    );
    let status = client_for(&server)
        .semaphore("slots", cap)
        .unwrap()
        .status()
        .unwrap();
    assert_eq!((status.permits_held, status.waiters.len()), (0, 0));
}

fn client_for(server: &RedisServer) -> LockClient {
    support::client(server)
}

/// Guarantee 2: a request for 4 permits at the head is not overtaken by a later request for 1,
/// though 1 permit is free all along; then both are served in queue order with rising tokens.
#[test]
fn a_large_request_at_the_head_is_not_overtaken_by_later_small_ones() {
    let server = RedisServer::start();
    let client = client_for(&server);
    let sem = client.semaphore("big-head", 4).unwrap();
    let three = sem.acquire_many(3).unwrap();
    let (tx, rx) = mpsc::channel();
    let (big, release_big) = taker(&sem, "big", 4, &tx);
    assert!(waiting(&sem, 1));
    let (small, release_small) = taker(&sem, "small", 1, &tx);
    assert!(waiting(&sem, 2));
    // one permit is free, but the head wants four: nobody is served, and a try never jumps
    assert_eq!(sem.available().unwrap(), 1);
    assert!(sem.try_acquire().unwrap().is_none());
    assert!(rx.recv_timeout(Duration::from_millis(300)).is_err());
    let status = sem.status().unwrap();
    let wants: Vec<u64> = status.waiters.iter().map(|w| w.permits).collect();
    assert_eq!(wants, [4, 1]);
    let names: Vec<&str> = status
        .waiters
        .iter()
        .map(|w| w.origin.thread.as_str())
        .collect();
    assert_eq!(names, ["big", "small"]);

    let first = three.fencing_token();
    three.release().unwrap();
    let (who, big_token) = rx.recv_timeout(SECS_30).unwrap();
    assert_eq!(who, "big");
    assert!(big_token > first);
    // all four are the big one's: the small one still waits
    assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
    release_big.send(()).unwrap();
    let (who, small_token) = rx.recv_timeout(SECS_30).unwrap();
    assert_eq!(who, "small");
    assert!(small_token > big_token);
    release_small.send(()).unwrap();
    big.join().unwrap();
    small.join().unwrap();
}

/// Guarantee 2, the read/write shape: readers share; a writer queued behind a read blocks the
/// readers that come after it (a try_read too); when the read ends the writer holds alone;
/// then the two readers that waited together behind it are admitted together.
#[test]
fn a_waiting_writer_blocks_later_readers_who_are_then_admitted_together() {
    let server = RedisServer::start();
    let client = client_for(&server);
    let rw = client.rw_lock("catalog").unwrap();
    let r1 = rw.read().unwrap();
    let r2 = rw.try_read().unwrap().expect("readers share");
    // (another thread: this one is refused the write while it holds a read)
    thread::scope(|s| {
        let other = s.spawn(|| rw.try_write().unwrap().is_none());
        assert!(other.join().unwrap());
    });
    let (tx, rx) = mpsc::channel::<(&str, u64)>();
    let writer = {
        let (rw, tx) = (rw.clone(), tx.clone());
        thread::spawn(move || {
            let w = rw.write().unwrap();
            tx.send(("writer", w.fencing_token())).unwrap();
            thread::sleep(Duration::from_millis(200));
            w.unlock().unwrap();
        })
    };
    let sem = rw.as_semaphore();
    assert!(waiting(sem, 1));
    assert!(
        rw.try_read().unwrap().is_none(),
        "a read jumped a waiting writer"
    );
    let readers: Vec<_> = (0..2)
        .map(|i| {
            let (rw, tx) = (rw.clone(), tx.clone());
            let t = thread::spawn(move || {
                let r = rw.read().unwrap();
                tx.send(("reader", r.fencing_token())).unwrap();
                // both readers hold at once: each waits until the other has its read
                thread::sleep(Duration::from_millis(300));
                r.unlock().unwrap();
            });
            assert!(waiting(sem, 2 + i));
            t
        })
        .collect();
    assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
    drop(r1);
    assert!(
        rx.recv_timeout(Duration::from_millis(200)).is_err(),
        "a read is still held"
    );
    r2.unlock().unwrap();
    let (who, w_token) = rx.recv_timeout(SECS_30).unwrap();
    assert_eq!(who, "writer");
    let status = sem.status().unwrap();
    assert_eq!(
        status.holders.len(),
        1,
        "the writer holds alone: {status:?}"
    );
    assert_eq!(status.waiters.len(), 2);
    let (a, ta) = rx.recv_timeout(SECS_30).unwrap();
    // the second reader is granted in the same step as the first: well within the first's hold
    let (b, tb) = rx.recv_timeout(Duration::from_millis(250)).unwrap();
    assert_eq!((a, b), ("reader", "reader"));
    // (the two readers report in either order: their tokens tell the grant order)
    assert!(
        ta.min(tb) > w_token && ta != tb,
        "{ta} {tb} after {w_token}"
    );
    writer.join().unwrap();
    for r in readers {
        r.join().unwrap();
    }
}

/// Guarantee 3: a holder killed with SIGKILL keeps its permits only until its lease ends; then
/// the waiters they fit get them at once, with tokens above the dead holder's, and nothing is
/// left behind but the fence.
#[test]
fn a_killed_holders_permits_come_back_at_its_lease_end_and_go_to_the_waiters() {
    let children = support::child_test!(sem_child);
    let server = RedisServer::start();
    let client = client_for(&server);
    let sem = client.semaphore("victim", 2).unwrap();
    let lease_ms = 1000;
    let mut holder = children.spawn("holder", &env(&server, "victim", 2, lease_ms));
    let dead_token: u64 = holder.expect("HELD", SECS_30).parse().unwrap();
    let (tx, rx) = mpsc::channel();
    let (a, release_a) = taker(&sem, "a", 1, &tx);
    assert!(waiting(&sem, 1));
    let (b, release_b) = taker(&sem, "b", 1, &tx);
    assert!(waiting(&sem, 2));
    // outlive a renewal, so the lease left at the kill is a full one at most
    thread::sleep(Duration::from_millis(500));
    let killed = Instant::now();
    holder.kill();
    let got: Vec<(String, u64)> = (0..2).map(|_| rx.recv_timeout(SECS_30).unwrap()).collect();
    let after = killed.elapsed();
    assert!(
        after < Duration::from_millis(lease_ms) + Duration::from_secs(1),
        "the waiters waited {after:?} for a dead holder's permits (lease {lease_ms} ms)"
    );
    // both are granted in one step, in queue order (a first: the smaller token); they report
    // in either order
    let token_of = |who: &str| got.iter().find(|(w, _)| w == who).map(|(_, t)| *t).unwrap();
    assert!(
        token_of("a") > dead_token && token_of("b") > token_of("a"),
        "{got:?} after {dead_token}"
    );
    release_a.send(()).unwrap();
    release_b.send(()).unwrap();
    a.join().unwrap();
    b.join().unwrap();
    // every key of a semaphore nobody uses is gone but the fence (its own TTL) and the hash,
    // which keeps the receipts of releases for a while (at most the queue's TTL, 10 minutes)
    // and holds nothing
    let hash = "fairlock:{victim}:sem";
    assert!(
        eventually(SECS_30, || server.keys()
            == [hash, "fairlock:{victim}:sem:fence"]),
        "{:?}",
        server.keys()
    );
    let ttl = server.pttl(hash);
    assert!(ttl > 0 && ttl <= 600_000, "{hash} TTL {ttl}");
    let status = sem.status().unwrap();
    assert_eq!((status.permits_held, status.holders.len()), (0, 0));
    // and its capacity binds nobody now
    let other = client.semaphore("victim", 5).unwrap();
    let five = other.try_acquire_many(5).unwrap();
    assert!(
        five.is_some(),
        "a semaphore nobody uses takes the new capacity"
    );
}

/// Guarantee 3: every key a semaphore writes carries a TTL while it is held and waited for.
#[test]
fn every_key_of_a_held_and_waited_semaphore_expires() {
    let server = RedisServer::start();
    let client = client_for(&server);
    let sem = client.semaphore("ttl", 1).unwrap();
    let p = sem.acquire().unwrap();
    let (tx, rx) = mpsc::channel();
    let (t, release) = taker(&sem, "w", 1, &tx);
    assert!(waiting(&sem, 1));
    let keys = server.keys();
    assert!(keys.len() >= 5, "{keys:?}");
    for key in &keys {
        assert!(server.pttl(key) > 0, "{key} has no TTL ({keys:?})");
    }
    p.release().unwrap();
    rx.recv_timeout(SECS_30).unwrap();
    release.send(()).unwrap();
    t.join().unwrap();
}

/// Guarantee 4: a permit released by force is lost for its holder: the watchdog tells it (its
/// loss signal) and its release reports NotHeld, while the permit went to the next waiter with
/// a greater token.
#[test]
fn a_permit_released_by_force_is_told_lost_and_its_release_changes_nothing() {
    let server = RedisServer::start();
    let client = support::client_with_url(&server.url(), |b| b.lease(Duration::from_millis(600)));
    let sem = client.semaphore("forced", 1).unwrap();
    let p = sem.acquire().unwrap();
    let lost = p.lost_signal();
    let (tx, rx) = mpsc::channel();
    let (t, release) = taker(&sem, "next", 1, &tx);
    assert!(waiting(&sem, 1));
    let status = sem.status().unwrap();
    assert_eq!(status.holders.len(), 1);
    let h = &status.holders[0];
    assert_eq!(
        (h.hold_id.clone(), h.fencing_token, h.permits),
        (p.hold_id(), p.fencing_token(), 1)
    );
    assert!(sem.force_release(&h.hold_id, h.fencing_token).unwrap());
    let (_, next_token) = rx.recv_timeout(SECS_30).unwrap();
    assert!(next_token > p.fencing_token());
    assert!(
        lost.recv_timeout(Duration::from_secs(5)).is_ok(),
        "the watchdog did not tell"
    );
    assert!(p.is_lost());
    assert!(
        !sem.force_release(&h.hold_id, h.fencing_token).unwrap(),
        "released twice"
    );
    assert!(matches!(p.release(), Err(Error::NotHeld { .. })));
    assert_eq!(
        sem.status().unwrap().holders.len(),
        1,
        "the next holder's permit was touched"
    );
    release.send(()).unwrap();
    t.join().unwrap();
}

/// `force_release` says whether it released the hold: one its holder had already given back
/// itself (whose release left a receipt) was not released by force, so it returns false, its
/// first call as its repeat (found by the chaos harness's `sem` workload: an operator read the
/// hold with `status()`, the holder released it, and the force-release and its retry both
/// reported a release, from the receipt).
#[test]
fn a_force_release_of_a_hold_its_holder_gave_back_reports_nothing_released() {
    let server = RedisServer::start();
    let client = client_for(&server);
    let sem = client.semaphore("given-back", 2).unwrap();
    let p = sem.acquire().unwrap();
    let (id, token) = (p.hold_id(), p.fencing_token());
    p.release().unwrap();
    assert!(
        !sem.force_release(&id, token).unwrap(),
        "a hold released by its holder was reported released by force"
    );
    assert!(!sem.force_release(&id, token).unwrap());
    assert_eq!(sem.status().unwrap().permits_held, 0);
}

/// Crash safety: the permits of a holder that died come back at its lease end, also when the
/// semaphore's hash outlives its leases zset. The hash's TTL is the queue's once anyone queued
/// (10 min), the zset's only the lease of the last hold written when it was created anew (its
/// last member gone); so the dead holder's lease entry and the zset expired at one moment,
/// before any script could see the entry due, and its permits stayed taken for as long as the
/// hash lived (found by the chaos harness's `rw` workload in the Sentinel mode: after a
/// failover with no traffic on the new master, three reads outlived their leases and a writer
/// at the head waited for ever).
#[test]
fn a_dead_holders_permits_come_back_after_the_queue_kept_the_hash_alive() {
    let server = RedisServer::start();
    let client = client_for(&server);
    let sem = client.semaphore("outlived", 1).unwrap();
    let fixed = sem.with_fixed_lease(Duration::from_millis(300)).unwrap();
    // someone queues: the hash (and the zset, while it exists) live for the queue's TTL
    let first = sem.acquire().unwrap();
    let (tx, rx) = mpsc::channel();
    let (t, release) = taker(&sem, "queued", 1, &tx);
    assert!(waiting(&sem, 1));
    first.release().unwrap();
    rx.recv_timeout(SECS_30).unwrap();
    release.send(()).unwrap();
    t.join().unwrap();
    // the zset's last member is gone with that release; a holder that dies (no release, no
    // renewal) is the only hold when the zset is created again
    let dead = fixed.acquire().unwrap();
    std::mem::forget(dead);
    thread::sleep(Duration::from_millis(600));
    let next = sem.try_acquire_for(Duration::from_secs(3)).unwrap();
    assert!(
        next.is_some(),
        "the dead holder's permit never came back: {:?}",
        sem.status().unwrap()
    );
}

/// Guarantee 5: capacity is part of the state. A handle with another capacity, or a read/write
/// lock of the same name, is refused while the state lives; a raise grants the waiters that
/// now fit; a cut revokes nothing and grants nothing until the permits held fit it; a waiter
/// that wants more than the new capacity is told so.
#[test]
fn capacity_is_stored_with_the_name_and_changed_for_everyone() {
    let server = RedisServer::start();
    let client = client_for(&server);
    let two = client.semaphore("cap", 2).unwrap();
    let held = two.acquire_many(2).unwrap();
    let three = client.semaphore("cap", 3).unwrap();
    match three.try_acquire() {
        Err(
            e @ Error::CapacityMismatch {
                stored: 2,
                asked: 3,
                ..
            },
        ) => {
            assert!(e.to_string().contains("set_capacity"), "{e}");
            assert_eq!(e.kind(), fairlock::ErrorKind::InvalidInput);
        }
        other => panic!("{other:?}"),
    }
    let rw = client.rw_lock("cap").unwrap();
    assert!(matches!(rw.try_read(), Err(Error::CapacityMismatch { .. })));
    // a read/write lock's capacity is fixed
    assert!(matches!(
        rw.as_semaphore().set_capacity(5),
        Err(Error::InvalidConfig { .. })
    ));
    assert!(matches!(
        two.acquire_many(3),
        Err(Error::InvalidConfig { .. })
    ));
    assert!(matches!(
        two.acquire_many(0),
        Err(Error::InvalidConfig { .. })
    ));

    // a waiter for 1 (queued), then a raise to 3: it is granted at once
    let (tx, rx) = mpsc::channel();
    let (w, release_w) = taker(&two, "w", 1, &tx);
    assert!(waiting(&two, 1));
    let three = two.set_capacity(3).unwrap();
    assert_eq!(rx.recv_timeout(SECS_30).unwrap().0, "w");
    assert!(matches!(
        two.try_acquire(),
        Err(Error::CapacityMismatch { stored: 3, .. })
    ));
    // a cut to 1 with 3 held: nothing is revoked, and nothing granted until one is left
    let one = three.set_capacity(1).unwrap();
    assert_eq!(one.status().unwrap().permits_held, 3);
    let (x, release_x) = taker(&one, "x", 1, &tx);
    assert!(waiting(&one, 1));
    release_w.send(()).unwrap();
    w.join().unwrap();
    assert!(
        rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "granted above the new capacity"
    );
    // the hold made through the old handle is still its own to give back
    held.release().unwrap();
    assert_eq!(rx.recv_timeout(SECS_30).unwrap().0, "x");
    release_x.send(()).unwrap();
    x.join().unwrap();
    // a waiter for 2 behind a holder, then a cut to 1: it can never be served, and is told
    let p = one.acquire().unwrap();
    let two_again = one.set_capacity(2).unwrap();
    let p2 = two_again.acquire().unwrap();
    let waiter = {
        let two = two_again.clone();
        thread::spawn(move || two.acquire_many(2).map(|p| p.fencing_token()))
    };
    assert!(waiting(&two_again, 1));
    let _one = two_again.set_capacity(1).unwrap();
    match waiter.join().unwrap() {
        Err(Error::CapacityMismatch {
            stored: 1,
            asked: 2,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    assert!(two_again.status().unwrap().waiters.is_empty());
    drop((p, p2));
}

/// A wait for permits given up from another thread ([`fairlock::WaitCanceller`]) ends with
/// Error::Abandoned, leaves the queue at once, and the permits it would have got go to the
/// next waiter instead.
#[test]
fn a_wait_for_permits_abandoned_from_another_thread_ends_and_leaves_the_queue() {
    let server = RedisServer::start();
    let client = client_for(&server);
    let sem = client.semaphore("cancel", 1).unwrap();
    let p = sem.acquire().unwrap();
    let (tx, rx) = mpsc::channel();
    let waiter = {
        let sem = sem.clone();
        thread::spawn(move || {
            tx.send(sem.wait_canceller()).unwrap();
            sem.acquire().map(|p| p.fencing_token())
        })
    };
    let canceller = rx.recv_timeout(SECS_30).unwrap();
    assert!(waiting(&sem, 1));
    let (tx2, rx2) = mpsc::channel();
    let (next, release_next) = taker(&sem, "next", 1, &tx2);
    assert!(waiting(&sem, 2));
    canceller.abandon().unwrap();
    assert!(matches!(
        waiter.join().unwrap(),
        Err(Error::Abandoned { .. })
    ));
    assert!(waiting(&sem, 1));
    p.release().unwrap();
    assert_eq!(rx2.recv_timeout(SECS_30).unwrap().0, "next");
    release_next.send(()).unwrap();
    next.join().unwrap();
}

/// Shared waiting: 64 threads of one client wait for permits of a semaphore of capacity 2 on at
/// most `pool_size` + 2 connections (the pool, the waker's one BLPOP, a server check's for a
/// moment), counted by the server; then every one is served, never more than 2 at once.
#[test]
fn sixty_four_threads_wait_for_permits_on_a_bounded_number_of_connections() {
    if support::wait_mode() == fairlock::WaitMode::PerThread {
        return; // a connection per waiting thread, by design
    }
    let server = RedisServer::start();
    let client = support::client_with_url(&server.url(), |b| b.pool_size(4));
    let sem = client.semaphore("many", 2).unwrap();
    let held = [sem.acquire().unwrap(), sem.acquire().unwrap()];
    let inside = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let most = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let threads: Vec<_> = (0..64)
        .map(|_| {
            let (sem, inside, most) = (sem.clone(), inside.clone(), most.clone());
            thread::spawn(move || {
                let p = sem.acquire().unwrap();
                let now = inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                most.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
                thread::sleep(Duration::from_millis(1));
                inside.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                p.release().unwrap();
            })
        })
        .collect();
    assert!(waiting(&sem, 64));
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(&mut server.conn())
        .unwrap();
    // every connection but this CLIENT LIST's own
    let connections = clients.lines().count() - 1;
    assert!(connections <= 4 + 2, "{connections} connections: {clients}");
    drop(held);
    for t in threads {
        t.join().unwrap();
    }
    assert!(most.load(std::sync::atomic::Ordering::SeqCst) <= 2);
    assert_eq!(sem.status().unwrap().permits_held, 0);
}

/// Guarantee 3: a waiter killed with SIGKILL in the queue is passed over. Its place lapses (no
/// heartbeat), and a grant made to it before that is revoked, so the live waiter behind it gets
/// the permit within a few janitor intervals and the waiter timeout, never the dead one.
#[test]
fn a_killed_waiter_is_passed_over_and_the_live_one_behind_it_gets_the_permit() {
    let children = support::child_test!(sem_child);
    let server = RedisServer::start();
    let client = client_for(&server);
    let sem = client.semaphore("dead-waiter", 1).unwrap();
    let held = sem.acquire().unwrap();
    let mut dead = children.spawn("waiter", &env(&server, "dead-waiter", 1, 30_000));
    dead.expect("WAITING", SECS_30);
    assert!(waiting(&sem, 1));
    let (tx, rx) = mpsc::channel();
    let (live, release_live) = taker(&sem, "live", 1, &tx);
    assert!(waiting(&sem, 2));
    dead.kill();
    // the server must have seen the dead waiter's blocking connection close: until then its
    // BLPOP is still served, and a grant popped there (its reply lost with the connection) is a
    // hold of the dead process, which ends only with its 30 s lease (seen once under load)
    assert!(
        support::eventually(Duration::from_secs(10), || server
            .connections_named("fairlock-waker")
            == 1),
        "the dead waiter's blocking connection is still open"
    );
    // released at once: the permit goes to the dead head first, and is revoked
    let released = Instant::now();
    held.release().unwrap();
    let (who, _) = rx
        .recv_timeout(SECS_30)
        .expect("the live waiter was never served");
    assert_eq!(who, "live");
    let took = released.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "the live waiter waited {took:?}"
    );
    assert!(dead.try_expect("GOT", Duration::from_millis(100)).is_none());
    let st = sem.status().unwrap();
    assert_eq!((st.holders.len(), st.waiters.len()), (1, 0), "{st:?}");
    release_live.send(()).unwrap();
    live.join().unwrap();
}

/// A thread that holds the write of a read/write lock and asks for a read (a downgrade), or holds a
/// read and asks for the write (an upgrade), or holds the write and asks for it again, would wait
/// on its own hold for ever (the watchdog renews it): it is refused at once with
/// Error::WouldDeadlock, by the waiting calls and the try ones. Once the guard is dropped (or
/// unlocked) the same thread takes the other side; another thread is not refused and waits its turn
/// as before.
#[test]
fn a_thread_asking_for_the_other_side_of_its_own_read_write_hold_is_refused_at_once() {
    let server = RedisServer::start();
    let client = client_for(&server);
    let rw = client.rw_lock("self").unwrap();
    // run on a thread of its own: before the fix the waiting calls never return
    let (tx, rx) = mpsc::channel::<String>();
    let (go, wait_go) = mpsc::channel::<()>();
    let me = {
        let rw = rw.clone();
        thread::spawn(move || {
            // (each call is bounded by the channel's timeout below, not timed here)
            let check = |what: &str, r: Result<bool, Error>, held: &str, asked: &str| {
                let line = match r {
                    Err(e @ Error::WouldDeadlock { .. }) => {
                        assert_eq!(e.kind(), fairlock::ErrorKind::InvalidInput);
                        let text = e.to_string();
                        assert!(text.contains("drop the") && text.contains("self"), "{text}");
                        match e {
                            Error::WouldDeadlock {
                                held: h, asked: a, ..
                            } => assert_eq!((h, a), (held, asked), "{what}"),
                            _ => unreachable!(),
                        }
                        format!("{what}: refused")
                    }
                    other => format!("{what}: {other:?}"),
                };
                tx.send(line).unwrap();
            };
            let w = rw.write().unwrap();
            check(
                "w/try_read",
                rw.try_read().map(|g| g.is_some()),
                "write",
                "read",
            );
            check(
                "w/try_read_for",
                rw.try_read_for(Duration::from_secs(3)).map(|g| g.is_some()),
                "write",
                "read",
            );
            check("w/read", rw.read().map(|_| true), "write", "read");
            check(
                "w/try_write",
                rw.try_write().map(|g| g.is_some()),
                "write",
                "write",
            );
            check("w/write", rw.write().map(|_| true), "write", "write");
            assert!(!w.is_lost());
            // another thread's read waits behind the write meanwhile
            wait_go.recv_timeout(SECS_30).unwrap();
            drop(w);
            let r = rw.read().expect("a read once the write is dropped");
            check(
                "r/try_write",
                rw.try_write().map(|g| g.is_some()),
                "read",
                "write",
            );
            check(
                "r/try_write_for",
                rw.try_write_for(Duration::from_secs(3))
                    .map(|g| g.is_some()),
                "read",
                "write",
            );
            check(
                "r/try_write_until",
                rw.try_write_until(Instant::now() + Duration::from_secs(3))
                    .map(|g| g.is_some()),
                "read",
                "write",
            );
            check("r/write", rw.write().map(|_| true), "read", "write");
            r.unlock().unwrap();
            // (the other reader still holds: the write waits its turn, then comes)
            let w = rw
                .try_write_for(SECS_30)
                .unwrap()
                .expect("the write after the read");
            w.unlock().unwrap();
            tx.send("done".into()).unwrap();
        })
    };
    let mut lines = Vec::new();
    for _ in 0..5 {
        lines.push(
            rx.recv_timeout(Duration::from_secs(10))
                .unwrap_or_else(|_| {
                    panic!("the thread waited on its own write; told so far: {lines:?}")
                }),
        );
    }
    assert_eq!(
        lines,
        [
            "w/try_read: refused",
            "w/try_read_for: refused",
            "w/read: refused",
            "w/try_write: refused",
            "w/write: refused"
        ]
    );
    // another thread is not refused: it waits for the write, fairly, and then reads
    let (got, got_rx) = mpsc::channel::<u64>();
    let (done, done_rx) = mpsc::channel::<()>();
    let other = {
        let rw = rw.clone();
        thread::spawn(move || {
            let r = rw.read().unwrap();
            got.send(r.fencing_token()).unwrap();
            let _ = done_rx.recv_timeout(SECS_30);
            drop(r);
        })
    };
    assert!(waiting(rw.as_semaphore(), 1));
    assert!(got_rx.recv_timeout(Duration::from_millis(200)).is_err());
    go.send(()).unwrap();
    got_rx
        .recv_timeout(SECS_30)
        .expect("the other reader served");
    for _ in 0..4 {
        lines.push(
            rx.recv_timeout(Duration::from_secs(10))
                .unwrap_or_else(|_| {
                    panic!("the thread waited on its own read; told so far: {lines:?}")
                }),
        );
    }
    assert_eq!(
        &lines[5..],
        [
            "r/try_write: refused",
            "r/try_write_for: refused",
            "r/try_write_until: refused",
            "r/write: refused"
        ]
    );
    done.send(()).unwrap();
    assert_eq!(rx.recv_timeout(SECS_30).unwrap(), "done");
    me.join().unwrap();
    other.join().unwrap();
}

// ---- one method set on every handle ---------------------------------------------------------

/// `Permit::leak` gives the permit up without giving the permits back: they stay held in Redis
/// (another `try_acquire` is refused, `status` shows the hold with the returned token) and the
/// watchdog stops renewing them, so they come back when the lease ends and go to the waiter
/// queued behind them. (A renewed hold would keep them for as long as the test waits.)
#[test]
fn a_leaked_permit_keeps_its_permits_until_its_lease_ends_unrenewed() {
    let server = RedisServer::start();
    let client = support::client_with_url(&server.url(), |b| b.lease(Duration::from_millis(1500)));
    let sem = client.semaphore("leaked", 2).unwrap();
    let p = sem.acquire_many(2).unwrap();
    let (id, lost) = (p.hold_id(), p.lost_signal());
    let token = p.leak();
    // the permit is gone, its loss channel with it (disconnected, never told a loss)
    assert_eq!(
        lost.recv_timeout(Duration::from_secs(2)),
        Err(fairlock::crossbeam_channel::RecvTimeoutError::Disconnected)
    );
    let st = sem.status().unwrap();
    assert_eq!(st.permits_held, 2, "{st:?}");
    assert_eq!(
        st.holders
            .iter()
            .map(|h| (h.hold_id.clone(), h.fencing_token))
            .collect::<Vec<_>>(),
        [(id, token)]
    );
    assert!(
        sem.try_acquire().unwrap().is_none(),
        "a leaked permit's permits were free at once"
    );
    // a waiter queues behind them and gets them when the (unrenewed) lease ends
    let (tx, rx) = mpsc::channel();
    let (t, release) = taker(&sem, "after-leak", 2, &tx);
    let (who, next) = rx
        .recv_timeout(Duration::from_secs(15))
        .expect("the leaked permits never came back: still renewed?");
    assert_eq!(who, "after-leak");
    assert!(next > token);
    release.send(()).unwrap();
    t.join().unwrap();
    assert_eq!(sem.status().unwrap().permits_held, 0);
}

/// `Semaphore::try_acquire_until` waits in the queue until its deadline, then gives up and
/// leaves no waiter behind; with the permit free it takes it.
#[test]
fn try_acquire_until_gives_up_at_the_deadline_and_leaves_no_waiter() {
    let server = RedisServer::start();
    let client = client_for(&server);
    let sem = client.semaphore("until", 1).unwrap();
    let held = sem.acquire().unwrap();
    let start = Instant::now();
    let deadline = start + Duration::from_millis(400);
    assert!(sem.try_acquire_until(deadline).unwrap().is_none());
    assert!(
        start.elapsed() >= Duration::from_millis(300),
        "gave up after {:?}, before the deadline",
        start.elapsed()
    );
    let st = sem.status().unwrap();
    assert!(st.waiters.is_empty(), "{st:?}");
    drop(held);
    let p = sem
        .try_acquire_until(Instant::now() + SECS_30)
        .unwrap()
        .expect("a free permit");
    assert_eq!(p.permits(), 1);
}

/// `RwLock::try_read_until` waits behind a write until its deadline, then gives up and leaves
/// no waiter; it is refused at once (`WouldDeadlock`) on the thread that holds the write; and it
/// reads once the write is gone.
#[test]
fn try_read_until_gives_up_at_the_deadline_and_leaves_no_waiter() {
    let server = RedisServer::start();
    let client = client_for(&server);
    let rw = client.rw_lock("read-until").unwrap();
    let w = rw.write().unwrap();
    assert!(matches!(
        rw.try_read_until(Instant::now() + SECS_30),
        Err(Error::WouldDeadlock { .. })
    ));
    let other = {
        let rw = rw.clone();
        thread::spawn(move || {
            let start = Instant::now();
            let got = rw
                .try_read_until(start + Duration::from_millis(400))
                .unwrap()
                .is_some();
            (got, start.elapsed())
        })
    };
    let (got, took) = other.join().unwrap();
    assert!(!got, "read while the write was held");
    assert!(took >= Duration::from_millis(300), "gave up after {took:?}");
    let st = rw.status().unwrap();
    assert!(st.waiters.is_empty(), "{st:?}");
    drop(w);
    let r = rw
        .try_read_until(Instant::now() + SECS_30)
        .unwrap()
        .expect("a read once the write is gone");
    r.unlock().unwrap();
}

/// `RwLock::wait_canceller` ends another thread's blocked read with `Error::Abandoned` and its
/// queue place goes at once; the write's holder is untouched.
#[test]
fn a_blocked_read_abandoned_from_another_thread_ends_with_abandoned() {
    let server = RedisServer::start();
    let client = client_for(&server);
    let rw = client.rw_lock("cancel-read").unwrap();
    let w = rw.write().unwrap();
    let (tx, rx) = mpsc::channel();
    let reader = {
        let rw = rw.clone();
        thread::spawn(move || {
            tx.send(rw.wait_canceller()).unwrap();
            rw.read().map(|g| g.fencing_token())
        })
    };
    let canceller = rx.recv_timeout(SECS_30).unwrap();
    assert!(waiting(rw.as_semaphore(), 1));
    canceller.abandon().unwrap();
    assert!(matches!(
        reader.join().unwrap(),
        Err(Error::Abandoned { .. })
    ));
    let st = rw.status().unwrap();
    assert!(st.waiters.is_empty(), "{st:?}");
    assert_eq!(st.holders.len(), 1);
    assert!(!w.is_lost());
    w.unlock().unwrap();
}

/// `RwLock::with_fixed_lease`: the hold carries that lease and is not renewed, so it is gone
/// from Redis when the lease ends (the guard knows: `is_lost`, and its unlock is `NotHeld`),
/// while a hold of the renewed handle with the same lease outlives it.
#[test]
fn a_read_write_hold_with_a_fixed_lease_is_not_renewed() {
    let server = RedisServer::start();
    let client = client_for(&server);
    let lease = Duration::from_millis(1000);
    let fixed = client
        .rw_lock("fixed-rw")
        .unwrap()
        .with_fixed_lease(lease)
        .unwrap();
    let renewed = client
        .rw_lock("renewed-rw")
        .unwrap()
        .with_lease(lease)
        .unwrap();
    let w = fixed.write().unwrap();
    let r = renewed.read().unwrap();
    let st = fixed.status().unwrap();
    assert_eq!(st.holders.len(), 1);
    assert_eq!(st.holders[0].lease, lease);
    assert!(w.lease_remaining() <= lease);
    assert!(
        eventually(Duration::from_secs(10), || fixed
            .status()
            .unwrap()
            .holders
            .is_empty()),
        "the fixed-lease write was renewed"
    );
    assert!(w.is_lost());
    assert!(matches!(w.unlock(), Err(Error::NotHeld { .. })));
    // the renewed read, as old as the write was, still holds
    assert!(!r.is_lost());
    assert_eq!(renewed.status().unwrap().holders.len(), 1);
    r.unlock().unwrap();
}

/// `RwLock::force_release` ends a hold by id and token as `Semaphore::force_release` does: the
/// queued write gets the lock, the released read's guard finds it lost (its unlock is
/// `NotHeld`), a repeat releases nothing. The guards' `hold_id` and `lease_remaining` agree
/// with `status`.
#[test]
fn a_read_released_by_force_goes_to_the_queued_writer() {
    let server = RedisServer::start();
    let client = client_for(&server);
    let rw = client
        .rw_lock("forced-rw")
        .unwrap()
        .with_lease(SECS_30)
        .unwrap();
    let r = rw.read().unwrap();
    let st = rw.status().unwrap();
    assert_eq!(st.holders.len(), 1);
    assert_eq!(
        (st.holders[0].hold_id.clone(), st.holders[0].fencing_token),
        (r.hold_id(), r.fencing_token())
    );
    let left = r.lease_remaining();
    assert!(left > Duration::ZERO && left <= SECS_30, "{left:?}");
    let (tx, rx) = mpsc::channel();
    let writer = {
        let rw = rw.clone();
        thread::spawn(move || {
            let w = rw.write().unwrap();
            tx.send(w.fencing_token()).unwrap();
            let left = w.lease_remaining();
            let id = w.hold_id();
            w.unlock().unwrap();
            (left, id)
        })
    };
    assert!(waiting(rw.as_semaphore(), 1));
    assert!(rw.force_release(&r.hold_id(), r.fencing_token()).unwrap());
    let w_token = rx.recv_timeout(SECS_30).expect("the writer got the lock");
    assert!(w_token > r.fencing_token());
    let (w_left, w_id) = writer.join().unwrap();
    assert!(w_left > Duration::ZERO && w_left <= SECS_30);
    assert!(w_id.contains('#') && w_id != r.hold_id());
    assert!(!rw.force_release(&r.hold_id(), r.fencing_token()).unwrap());
    assert!(matches!(
        rw.force_release("no-attempt", 1),
        Err(Error::InvalidConfig { .. })
    ));
    assert!(matches!(r.unlock(), Err(Error::NotHeld { .. })));
}

/// A leaked read or write stays held in Redis, unrenewed, until its lease ends. It is no longer
/// the thread's hold: the same thread's later calls are not refused as `WouldDeadlock` (that
/// would be for ever, or until the lease) but queue behind the leaked hold like anyone's, and
/// are served when its lease ends.
#[test]
fn a_leaked_read_or_write_holds_until_its_lease_and_the_thread_then_takes_the_other_side() {
    let server = RedisServer::start();
    let client = client_for(&server);
    let rw = client
        .rw_lock("leak-rw")
        .unwrap()
        .with_lease(Duration::from_millis(1500))
        .unwrap();
    // the thread of its own: a refusal or a wait for ever must not hang the test
    let (tx, rx) = mpsc::channel::<String>();
    let me = {
        let rw = rw.clone();
        thread::spawn(move || {
            let w = rw.write().unwrap();
            let token = w.leak();
            let st = rw.status().unwrap();
            assert_eq!(
                st.holders
                    .iter()
                    .map(|h| h.fencing_token)
                    .collect::<Vec<_>>(),
                [token]
            );
            // not refused: held by the leaked write, so no read now
            tx.send(format!(
                "try_read: {:?}",
                rw.try_read().map(|g| g.is_some())
            ))
            .unwrap();
            // and a wait is served when the leaked write's lease ends (not renewed)
            let r = rw
                .try_read_for(SECS_30)
                .unwrap()
                .expect("a read after the lease");
            assert!(r.fencing_token() > token);
            let token = r.leak();
            tx.send(format!(
                "try_write: {:?}",
                rw.try_write().map(|g| g.is_some())
            ))
            .unwrap();
            let w = rw
                .try_write_for(SECS_30)
                .unwrap()
                .expect("the write after the leaked read's lease");
            assert!(w.fencing_token() > token);
            w.unlock().unwrap();
            tx.send("done".into()).unwrap();
        })
    };
    let mut lines = vec![];
    for _ in 0..3 {
        lines.push(
            rx.recv_timeout(Duration::from_secs(40))
                .unwrap_or_else(|_| panic!("the thread hung; told so far: {lines:?}")),
        );
    }
    assert_eq!(
        lines,
        ["try_read: Ok(false)", "try_write: Ok(false)", "done"]
    );
    me.join().unwrap();
    assert!(rw.status().unwrap().holders.is_empty());
}
