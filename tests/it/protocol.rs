//! The protocol at its edges, one test per fault: late requests from abandoned connections, lost
//! replies to force-unlock, lapsed grants, eviction, clock steps, data loss, forks. Most drive the
//! raw protocol layer (`fairlock::raw`) directly against a real redis-server, as a client whose
//! replies were lost or whose requests arrived late would.

use crate::support;

use crate::support::faketime;

use std::thread;
use std::time::{Duration, Instant};

use crate::support::{eventually, RedisServer};
use fairlock::raw::{
    self, Acquire, ForceUnlock, LateAcquire, Leave, LeaveMode, Mode, RawLock, Reenter, Release,
    Runner, Settings, Wake,
};
use fairlock::Error;

const LEASE: Duration = Duration::from_secs(30);
const WAITER_TIMEOUT: Duration = Duration::from_millis(600);

/// A fresh server, a connection to it and the raw lock `name`.
fn start(name: &str) -> (RedisServer, redis::Connection, RawLock) {
    let server = RedisServer::start();
    let mut c = server.conn();
    let lock = raw_lock(&mut c, name);
    (server, c, lock)
}

/// The raw lock `name`, calling the scripts the way the server behind `c` runs them.
fn raw_lock(c: &mut redis::Connection, name: &str) -> RawLock {
    RawLock::new(
        "fairlock",
        name,
        Settings {
            waiter_timeout: WAITER_TIMEOUT,
            runner: runner(c),
            ..Settings::default()
        },
    )
    .unwrap()
}

/// How the client would call the scripts on the server behind `c`: the function library, or
/// `EVALSHA` on a server without functions (Redis 6.2 of the server matrix in scripts/test.sh);
/// asked of the server (does it know `FCALL`), not read from its version.
fn runner(c: &mut redis::Connection) -> Runner {
    if support::has_command(c, "FCALL") {
        Runner::Functions
    } else {
        Runner::Eval
    }
}

/// `owner`'s attempt takes the lock (it must be free); returns the token.
fn take(c: &mut redis::Connection, lock: &RawLock, owner: &str, attempt: u64) -> u64 {
    granted(
        lock.acquire(owner, attempt, LEASE, Mode::Wait, "m")
            .run(c)
            .unwrap(),
    )
}

/// `owner`'s attempt queues (the lock must be held).
fn enqueue(c: &mut redis::Connection, lock: &RawLock, owner: &str, attempt: u64) {
    queued(
        lock.acquire(owner, attempt, LEASE, Mode::Wait, "m")
            .run(c)
            .unwrap(),
    );
}

fn granted(reply: Acquire) -> u64 {
    match reply {
        Acquire::Granted(g) => g.token,
        other => panic!("expected a grant, got {other:?}"),
    }
}

fn queued(reply: Acquire) {
    assert!(
        matches!(reply, Acquire::Queued { .. }),
        "expected queued, got {reply:?}"
    );
}

/// The messages waiting in `owner`'s wake list (its client's, shared with its other threads).
fn wake_messages(conn: &mut redis::Connection, lock: &RawLock, owner: &str) -> Vec<String> {
    redis::cmd("LRANGE")
        .arg(lock.wake_key(owner))
        .arg(0)
        .arg(-1)
        .query(conn)
        .unwrap()
}

/// Pop `owner`'s next wake-up message, if any.
fn pop(conn: &mut redis::Connection, lock: &RawLock, owner: &str) -> Option<Wake> {
    let msg: Option<String> = redis::cmd("LPOP")
        .arg(lock.wake_key(owner))
        .query(conn)
        .unwrap();
    msg.map(|m| raw::parse_wake(&m).unwrap())
}

/// The holder and its token; (None, None) when free (no hash, or a released lock's tombstone).
fn holder(conn: &mut redis::Connection, lock: &RawLock) -> (Option<String>, Option<u64>) {
    let (owner, token): (Option<String>, Option<u64>) = redis::cmd("HMGET")
        .arg(lock.key_names()[0])
        .arg("owner")
        .arg("token")
        .query(conn)
        .unwrap();
    match owner {
        Some(o) if !o.is_empty() => (Some(o), token),
        _ => (None, None),
    }
}

fn queue(conn: &mut redis::Connection, lock: &RawLock) -> Vec<String> {
    redis::cmd("ZRANGE")
        .arg(lock.key_names()[2])
        .arg(0)
        .arg(-1)
        .query(conn)
        .unwrap()
}

/// A waiter learns of its grant late (a slow reply, a pause before its BLPOP) and the grant lapses
/// unseen. Before, its waiters entry survived, every heartbeat refreshed it and never said "retry":
/// the waiter hung while newcomers took the free lock.
#[test]
fn an_attempt_whose_grant_lapsed_unseen_is_told_to_retry() {
    let (_server, mut c, lock) = start("lapsed");
    take(&mut c, &lock, "h:1", 1);
    queued(
        lock.acquire("w:1", 7, Duration::from_millis(300), Mode::Wait, "m")
            .run(&mut c)
            .unwrap(),
    );
    let release = lock.release("h:1", holder(&mut c, &lock).1.unwrap(), 1);
    assert_eq!(
        release.run(&mut c).unwrap(),
        Release::Released {
            next: Some("w:1".into())
        }
    );
    // w never pops its 300 ms grant
    thread::sleep(Duration::from_millis(450));
    assert_eq!(holder(&mut c, &lock).0, None, "the grant lapsed");
    let hb = lock.heartbeat([("w:1", 7)]).run(&mut c).unwrap();
    assert_eq!(hb.told_to_retry, ["w:1"]);
    assert_eq!(hb.repairs, 0, "telling is no repair");
    assert_eq!(pop(&mut c, &lock, "w:1"), Some(Wake::Retry { attempt: 7 }));
    // and its retry (same attempt) takes the free lock
    take(&mut c, &lock, "w:1", 7);
}

/// A lapsed grant, the second way in: the queue key is lost (evicted) while the waiters entry
/// stays.
#[test]
fn a_waiter_whose_queue_key_vanished_is_told_to_retry() {
    let (_server, mut c, lock) = start("evicted-queue");
    take(&mut c, &lock, "h:1", 1);
    enqueue(&mut c, &lock, "w:1", 2);
    let _: () = redis::cmd("DEL")
        .arg(lock.key_names()[2])
        .query(&mut c)
        .unwrap();
    let hb = lock.heartbeat([("w:1", 2)]).run(&mut c).unwrap();
    assert_eq!(hb.told_to_retry, ["w:1"]);
    assert_eq!(pop(&mut c, &lock, "w:1"), Some(Wake::Retry { attempt: 2 }));
}

/// A force-unlock whose reply was lost is sent again. Before, the second run released whoever held
/// the lock, i.e. the waiter it had just been granted to.
#[test]
fn a_retried_force_unlock_never_releases_the_next_holder() {
    let (_server, mut c, lock) = start("forced");
    let t1 = take(&mut c, &lock, "a:1", 1);
    enqueue(&mut c, &lock, "b:1", 2);
    let force = lock.force_unlock("a:1", t1);
    assert_eq!(
        force.run(&mut c).unwrap(),
        ForceUnlock::Released {
            next: Some("b:1".into())
        }
    );
    let (owner, t2) = holder(&mut c, &lock);
    assert_eq!(owner.as_deref(), Some("b:1"));
    // the same request again (the connection layer's retry): nothing changes
    assert_eq!(
        force.run(&mut c).unwrap(),
        ForceUnlock::NotHeld {
            holder: Some(("b:1".into(), t2.unwrap()))
        }
    );
    assert_eq!(holder(&mut c, &lock), (Some("b:1".into()), t2));
}

/// After a read timeout the request may still reach Redis later. An abandoned attempt's late
/// `leave` used to match on the owner alone and release the thread's newer hold; a late `acquire`
/// reset a deep re-entry count to 1.
#[test]
fn late_requests_of_an_abandoned_attempt_change_nothing() {
    let (_server, mut c, lock) = start("late");
    let th = take(&mut c, &lock, "h:1", 1);
    // attempt 5 of w is applied (queued) but w never hears of it; its leave is held up too
    enqueue(&mut c, &lock, "w:1", 5);
    let late_acquire = lock.acquire("w:1", 5, LEASE, Mode::Wait, "m");
    let late_leave = lock.leave("w:1", 5, LeaveMode::Pass, LateAcquire::Possible);
    // w tries again with attempt 6 and is served
    enqueue(&mut c, &lock, "w:1", 6);
    lock.release("h:1", th, 1).run(&mut c).unwrap();
    let Some(Wake::Grant {
        attempt: 6, token, ..
    }) = pop(&mut c, &lock, "w:1")
    else {
        panic!("no grant for attempt 6");
    };
    // w re-enters twice: depth 3
    for depth in 1..3 {
        assert_eq!(
            lock.reenter("w:1", token, depth).run(&mut c).unwrap(),
            Reenter::Reentered(depth + 1)
        );
    }
    // then the late requests arrive
    assert_eq!(late_leave.run(&mut c).unwrap(), Leave::Left);
    assert_eq!(late_acquire.run(&mut c).unwrap(), Acquire::Stale);
    assert_eq!(holder(&mut c, &lock), (Some("w:1".into()), Some(token)));
    let count: u32 = redis::cmd("HGET")
        .arg(lock.key_names()[0])
        .arg("count")
        .query(&mut c)
        .unwrap();
    assert_eq!(count, 3);
}

/// Late requests in the other order: the attempt's `leave` arrives first (or its acquire arrives
/// twice, the second copy after the leave), and the thread moves on, maybe to another lock. The
/// late acquire used to queue a waiter nobody heartbeats, or take the free lock for a thread that
/// holds no guard: found by the fuzzer's long run (seed 20261977), where nothing touched that lock
/// again and its queue keys stayed for their 10-minute TTL. A leave whose attempt had a request
/// unanswered now leaves a mark that such an acquire finds.
#[test]
fn an_acquire_that_arrives_after_its_attempts_leave_does_nothing() {
    let (_server, mut c, lock) = start("left-first");
    // on a free lock, nobody waiting: the late acquire must not take it
    assert_eq!(
        lock.leave("w:1", 3, LeaveMode::Pass, LateAcquire::Possible)
            .run(&mut c)
            .unwrap(),
        Leave::Left
    );
    let late = lock.acquire("w:1", 3, LEASE, Mode::Wait, "m");
    assert_eq!(late.run(&mut c).unwrap(), Acquire::Stale);
    assert_eq!(holder(&mut c, &lock), (None, None));
    // the same thread's next attempt, and another thread, are served as usual
    let t4 = take(&mut c, &lock, "w:1", 4);
    enqueue(&mut c, &lock, "x:1", 1);
    // behind a holder: queued, left, then a second copy of the acquire arrives
    enqueue(&mut c, &lock, "w:2", 7);
    let copy = lock.acquire("w:2", 7, LEASE, Mode::Wait, "m");
    assert_eq!(
        lock.leave("w:2", 7, LeaveMode::Pass, LateAcquire::Possible)
            .run(&mut c)
            .unwrap(),
        Leave::Left
    );
    assert_eq!(copy.run(&mut c).unwrap(), Acquire::Stale);
    assert_eq!(queue(&mut c, &lock), vec!["x:1".to_string()]);
    // the release hands on to x, and the lock ends with no queue keys left behind
    lock.release("w:1", t4, 1).run(&mut c).unwrap();
    let Some(Wake::Grant { token: tx, .. }) = pop(&mut c, &lock, "x:1") else {
        panic!("no grant for x");
    };
    lock.release("x:1", tx, 1).run(&mut c).unwrap();
    let queue_keys: u32 = redis::cmd("EXISTS")
        .arg(lock.key_names()[2])
        .arg(lock.key_names()[3])
        .query(&mut c)
        .unwrap();
    assert_eq!(queue_keys, 0);
    // the marks stay, with a TTL (the queue's: 10 minutes)
    let left_key = format!("{}:left", lock.key_names()[0]);
    let pttl: i64 = redis::cmd("PTTL").arg(&left_key).query(&mut c).unwrap();
    assert!(pttl > 0 && pttl <= 600_000, "{left_key}: pttl {pttl}");

    // a leave whose acquire was answered leaves no mark: a waiter that timed out
    let (_server, mut c, lock) = start("timed-out");
    let th = take(&mut c, &lock, "h:1", 1);
    enqueue(&mut c, &lock, "w:1", 2);
    assert_eq!(
        lock.leave("w:1", 2, LeaveMode::Claim, LateAcquire::Impossible)
            .run(&mut c)
            .unwrap(),
        Leave::Left
    );
    lock.release("h:1", th, 1).run(&mut c).unwrap();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut c).unwrap();
    assert!(
        keys.iter()
            .all(|k| !k.ends_with(":left") && !k.ends_with(":queue") && !k.ends_with(":waiters")),
        "{keys:?}"
    );
}

/// A release that timed out unapplied, then a new acquire by the same thread. The new hold used to
/// get the old token, so the late release matched it and freed the new hold. (The new attempt
/// passes the old hold on as a release would, and takes the lock as a newcomer: here nobody waits,
/// so it takes it at once, with a new token.)
#[test]
fn a_new_hold_of_the_same_thread_gets_a_new_token_a_late_release_cannot_free() {
    let (_server, mut c, lock) = start("retaken");
    let t1 = take(&mut c, &lock, "w:1", 1);
    let late_release = lock.release("w:1", t1, 1);
    let t2 = take(&mut c, &lock, "w:1", 2);
    assert!(t2 > t1, "tokens {t1} then {t2}");
    assert_eq!(
        late_release.run(&mut c).unwrap(),
        Release::NotHeld {
            holder: Some("w:1".into())
        }
    );
    assert_eq!(holder(&mut c, &lock), (Some("w:1".into()), Some(t2)));
}

/// The only waiter is granted the lock and dies before popping it; nobody heartbeats, the waiters
/// hash goes. A newcomer's heartbeats used to never see the dead grantee, so the lock stayed with
/// it for the grant's whole lease (30 s here) instead of a few waiter timeouts.
#[test]
fn a_dead_grantee_is_revoked_within_waiter_timeouts_not_its_lease() {
    let (_server, mut c, lock) = start("dead-grantee");
    let th = take(&mut c, &lock, "h:1", 1);
    enqueue(&mut c, &lock, "dead:1", 2);
    lock.release("h:1", th, 1).run(&mut c).unwrap();
    assert_eq!(holder(&mut c, &lock).0.as_deref(), Some("dead:1"));
    // nobody heartbeats: the waiters hash is gone (here at once, as the queue emptied)
    let waiters: bool = redis::cmd("EXISTS")
        .arg(lock.key_names()[3])
        .query(&mut c)
        .unwrap();
    assert!(!waiters);
    enqueue(&mut c, &lock, "x:1", 3);
    let start = Instant::now();
    // x's janitor heartbeats every third of the waiter timeout
    let mut repairs = vec![];
    let served = eventually(Duration::from_secs(10), || {
        thread::sleep(WAITER_TIMEOUT / 3);
        repairs.push(lock.heartbeat([("x:1", 3)]).run(&mut c).unwrap().repairs);
        holder(&mut c, &lock).0.as_deref() == Some("x:1")
    });
    // the heartbeat that served x says so: the hand-off revoked, the free lock granted
    assert_eq!(repairs.last(), Some(&2), "{repairs:?}");
    assert_eq!(repairs.iter().sum::<u32>(), 2, "{repairs:?}");
    let took = start.elapsed();
    assert!(served, "the dead grantee kept the lock");
    assert!(took < WAITER_TIMEOUT * 4, "revoked after {took:?}");
    assert!(matches!(
        pop(&mut c, &lock, "x:1"),
        Some(Wake::Grant { attempt: 3, .. })
    ));
    assert_eq!(
        pop(&mut c, &lock, "dead:1"),
        None,
        "the stale grant was removed"
    );
}

/// A re-entry applied with its reply lost leaves the server's count above the thread's depth. The
/// outermost release used to see count 2, answer "held", and leave the lock held until its lease
/// ran out.
#[test]
fn the_outermost_release_frees_the_lock_whatever_the_count() {
    let (_server, mut c, lock) = start("diverged");
    let t = take(&mut c, &lock, "w:1", 1);
    // applied, reply lost: the thread stays at depth 1
    lock.reenter("w:1", t, 1).run(&mut c).unwrap();
    assert_eq!(
        lock.release("w:1", t, 1).run(&mut c).unwrap(),
        Release::Released { next: None }
    );
    assert_eq!(holder(&mut c, &lock), (None, None));
}

/// Tokens keep rising across data loss (a restart without persistence, a lagging replica,
/// eviction of the fence). Before, they went back to 1.
#[test]
fn tokens_keep_rising_across_data_loss() {
    let (mut server, mut c, lock) = start("lossy");
    let t1 = take(&mut c, &lock, "w:1", 1);
    lock.release("w:1", t1, 1).run(&mut c).unwrap();
    let t2 = take(&mut c, &lock, "w:1", 2);
    assert!(t2 > t1);
    let _: () = redis::cmd("FLUSHALL").query(&mut c).unwrap();
    let t3 = take(&mut c, &lock, "w:1", 3);
    assert!(t3 > t2, "after FLUSHALL: {t3} after {t2}");
    server.restart();
    let mut c = server.conn();
    let t4 = take(&mut c, &lock, "w:1", 4);
    assert!(
        t4 > t3,
        "after a restart without persistence: {t4} after {t3}"
    );
    // and the fence carries the client's TTL, default 7 days
    let fence_ttl: i64 = redis::cmd("PTTL")
        .arg(lock.key_names()[1])
        .query(&mut c)
        .unwrap();
    assert!(fence_ttl > 6 * 24 * 3600 * 1000, "fence TTL {fence_ttl}");
}

/// Server clock steps neither purge live waiters nor keep dead ones. Before, waiter deadlines
/// were absolute server times, so a forward step of the server clock larger than the waiter
/// timeout purged every live waiter (FIFO scrambled), and a backward step kept dead ones alive
/// for as long as the step.
#[test]
fn server_clock_steps_neither_purge_live_waiters_nor_keep_dead_ones() {
    let mut server = faketime::FakeClockRedis::start();
    let mut c = server.conn();
    let lock = raw_lock(&mut c, "stepped");
    let th = take(&mut c, &lock, "h:1", 1);
    for (owner, attempt) in [("a:1", 2), ("b:1", 3), ("dead:1", 4)] {
        enqueue(&mut c, &lock, owner, attempt);
    }
    let live = [("a:1", 2), ("b:1", 3)];
    // forward by 10 s (16 waiter timeouts, within the holder's 30 s lease): the live ones keep
    // their places
    server.set_offset_ms(10_000);
    for _ in 0..3 {
        lock.heartbeat(live).run(&mut c).unwrap();
        thread::sleep(WAITER_TIMEOUT / 4);
    }
    assert_eq!(queue(&mut c, &lock)[..2], ["a:1", "b:1"]);
    // back by 40 s: nothing moves backwards; a and b keep their places
    server.set_offset_ms(-30_000);
    for _ in 0..3 {
        lock.heartbeat(live).run(&mut c).unwrap();
        thread::sleep(WAITER_TIMEOUT / 4);
    }
    assert_eq!(queue(&mut c, &lock), ["a:1", "b:1", "dead:1"]);
    // FIFO: a, then b
    lock.release("h:1", th, 1).run(&mut c).unwrap();
    let Some(Wake::Grant { token: ta, .. }) = pop(&mut c, &lock, "a:1") else {
        panic!("a was not served first: {:?}", queue(&mut c, &lock));
    };
    lock.release("a:1", ta, 1).run(&mut c).unwrap();
    let Some(Wake::Grant { token: tb, .. }) = pop(&mut c, &lock, "b:1") else {
        panic!("b was not served second");
    };
    assert!(tb > ta);
    // the dead waiter (never heartbeated) is purged when it reaches the head
    let start = Instant::now();
    let gone = eventually(Duration::from_secs(10), || {
        lock.heartbeat([("b:1", 3)]).run(&mut c).unwrap();
        thread::sleep(WAITER_TIMEOUT / 4);
        queue(&mut c, &lock).is_empty()
    });
    assert!(gone, "a dead waiter survived a backward clock step");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
}

/// A server clock step cannot make a lease estimate late. Before, a forward step of the server
/// clock between a waiter's queueing and its grant made the local lease estimate late (the
/// estimate added the server time in between).
#[test]
fn a_server_clock_step_cannot_make_a_lease_estimate_late() {
    let mut server = faketime::FakeClockRedis::start();
    let client = fairlock::LockClient::builder(&server.url())
        .janitor_interval(Duration::from_millis(200))
        .lease(Duration::from_secs(5))
        .build()
        .unwrap();
    let lock = client.fair_lock("estimate").unwrap();
    let held = lock.lock().unwrap();
    let waiter = {
        let lock = lock.clone();
        thread::spawn(move || {
            let g = lock.lock().unwrap();
            let left = g.lease_remaining();
            g.unlock().unwrap();
            left
        })
    };
    assert!(support::queued(&lock, 1, Duration::from_secs(5)));
    server.set_offset_ms(3_000);
    held.unlock().unwrap();
    let left = waiter.join().unwrap();
    assert!(
        left <= Duration::from_secs(5),
        "estimated {left:?} of a 5 s lease"
    );
}

/// Under an evicting `maxmemory-policy` Redis may drop a lock's keys (a second holder, tokens
/// restarting, lost places). Such a server is refused, naming the setting, and a change while the
/// client runs is reported.
#[test]
fn a_server_that_may_evict_keys_is_refused_by_name() {
    let server = RedisServer::start_with(&["--maxmemory-policy", "allkeys-lru"]);
    match fairlock::LockClient::connect(&server.url()) {
        Err(e @ Error::UnsafeServer { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("maxmemory-policy"), "{msg}");
            assert!(msg.contains("allkeys-lru"), "{msg}");
            assert!(msg.contains("noeviction"), "{msg}");
        }
        Err(other) => panic!("expected UnsafeServer, got {other:?}"),
        Ok(_) => panic!("an evicting server was accepted"),
    }
    let server = RedisServer::start();
    let client = support::client(&server);
    client.check_server().unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("volatile-ttl")
        .query(&mut server.conn())
        .unwrap();
    assert!(matches!(
        client.check_server(),
        Err(Error::UnsafeServer { .. })
    ));
}

/// The managed services' default (`volatile-lru`) is refused too, saying how to change it on
/// each big provider and how to accept the risk; accepted by name, the client works and its
/// checks warn instead of failing.
#[test]
fn an_evicting_server_is_used_only_when_the_risk_is_accepted_by_name() {
    let server = RedisServer::start_with(&["--maxmemory-policy", "volatile-lru"]);
    let e = fairlock::LockClient::connect(&server.url()).expect_err("volatile-lru");
    let msg = e.to_string();
    for says in [
        "parameter group",
        "Memorystore",
        "Azure",
        "danger_accept_eviction",
    ] {
        assert!(msg.contains(says), "{says}: {msg}");
    }
    let client = fairlock::LockClient::builder(&server.url())
        .danger_accept_eviction(true)
        .build()
        .expect("accepted by name");
    assert!(client.config().danger_accept_eviction);
    let lock = client.fair_lock("evicting").unwrap();
    lock.lock().unwrap().unlock().unwrap();
    client.check_server().expect("warns, does not fail");
}

/// Found by the server matrix: a waiter whose re-request after a restart reached Redis while it was
/// still loading its AOF (`LOADING`) gave up the wait with "Redis is still loading its data after a
/// restart". A loading server is a restart in progress: the waiter keeps its place and asks again.
/// (300,000 keys make the load last long enough to be hit every time; Valkey answers LOADING even
/// for a tiny file.)
#[test]
fn a_waiter_keeps_waiting_while_a_restarted_redis_loads_its_data() {
    let mut server = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    {
        let mut c = server.conn();
        for chunk in 0..300 {
            let mut p = redis::pipe();
            for i in 0..1000 {
                p.cmd("SET")
                    .arg(format!("filler:{chunk}:{i}"))
                    .arg("x")
                    .ignore();
            }
            let _: () = p.query(&mut c).unwrap();
        }
    }
    let client = support::client(&server);
    let lock = client.fair_lock("loading").unwrap();
    let held = lock.lock().unwrap();
    let waiter = {
        let lock = lock.clone();
        thread::spawn(move || lock.lock().map(|g| g.fencing_token()))
    };
    assert!(support::queued(&lock, 1, Duration::from_secs(5)));
    for i in 0..2 {
        server.restart();
        assert!(
            eventually(Duration::from_secs(20), || {
                lock.status().is_ok_and(|s| s.waiters.len() == 1)
            }),
            "after restart {i} the waiter left the queue: {:?}",
            waiter.is_finished().then_some("it returned")
        );
    }
    let token = held.fencing_token();
    held.unlock().unwrap();
    let got = waiter
        .join()
        .unwrap()
        .expect("the waiter waited through the loads");
    assert!(got > token);
}

/// After a restart every pooled connection is stale. A waiter's BLPOP on one counted as a failure,
/// and three of them ended the wait with an error; a dropped connection is now replaced without
/// counting.
#[test]
fn a_waiter_survives_more_restarts_than_its_failure_budget() {
    let mut server = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let client = support::client(&server);
    let lock = client.fair_lock("restarts").unwrap();
    let held = lock.lock().unwrap();
    let waiter = {
        let lock = lock.clone();
        thread::spawn(move || lock.lock().map(|g| g.fencing_token()))
    };
    assert!(support::queued(&lock, 1, Duration::from_secs(5)));
    for i in 0..4 {
        server.restart();
        if !eventually(Duration::from_secs(10), || {
            lock.status().is_ok_and(|s| s.waiters.len() == 1)
        }) {
            // say why: the waiter's own error, if it gave up
            let status = lock.status();
            let waiter = waiter.is_finished().then(|| waiter.join().unwrap());
            panic!("after restart {i} the waiter left the queue: {waiter:?}; {status:?}");
        }
    }
    let token = held.fencing_token();
    held.unlock().unwrap();
    let got = waiter.join().unwrap().expect("the waiter gave up");
    assert!(got > token);
}

/// A child forked after the client was built shares its sockets and owner flags but has no watchdog
/// or janitor; it gets `Error::Forked` and sends nothing.
#[test]
fn a_forked_child_is_refused() {
    let server = RedisServer::start();
    let client = support::client(&server);
    let lock = client.fair_lock("forked").unwrap();
    let guard = lock.lock().unwrap();
    // SAFETY: the child only calls into fairlock (which refuses at once) and then _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let ok = matches!(lock.try_lock(), Err(Error::Forked))
            && matches!(lock.status(), Err(Error::Forked))
            && matches!(guard.is_held_in_redis(), Err(Error::Forked));
        std::mem::forget(guard);
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child status {status}"
    );
    assert!(
        guard.is_held_in_redis().unwrap(),
        "the child released the parent's hold"
    );
    guard.unlock().unwrap();
}

/// Before, every heartbeat read the whole waiters hash, so Redis's work grew with all waiters of
/// all clients. A heartbeat now costs the same with 10 or 300 others waiting.
#[test]
fn a_heartbeat_costs_the_same_however_many_others_wait() {
    let (server, mut c, lock) = start("crowded");
    take(&mut c, &lock, "h:1", 1);
    enqueue(&mut c, &lock, "me:1", 2);
    // every command Redis ran, the scripts' own calls included
    let all_calls = |c: &mut redis::Connection| -> u64 {
        let info: String = redis::cmd("INFO").arg("commandstats").query(c).unwrap();
        info.lines()
            .filter_map(|l| {
                l.split_once(":calls=")?
                    .1
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum()
    };
    let calls_of_one_heartbeat = |c: &mut redis::Connection| {
        let before = all_calls(c);
        lock.heartbeat([("me:1", 2)]).run(c).unwrap();
        all_calls(c) - before
    };
    let mut attempt = 10;
    let mut add = |c: &mut redis::Connection, n: usize| {
        for _ in 0..n {
            attempt += 1;
            let owner = format!("other:{attempt}");
            enqueue(c, &lock, &owner, attempt);
        }
    };
    add(&mut c, 10);
    let few = calls_of_one_heartbeat(&mut c);
    add(&mut c, 290);
    let many = calls_of_one_heartbeat(&mut c);
    // (give or take the INFO calls that measure it)
    assert!(
        many <= few + 3,
        "commands per heartbeat: {few} with 11 waiting, {many} with 301"
    );
    assert_eq!(server.command_calls("hgetall"), 0);
}

/// Threads of one client share its wake list of a lock (one BLPOP per client covers them all):
/// dropping one thread's messages (it left, or queues anew) must not drop its neighbour's.
#[test]
fn one_clients_threads_share_a_wake_list_and_lose_only_their_own_messages() {
    let (_server, mut c, lock) = start("shared-wake");
    let token = take(&mut c, &lock, "h:1", 1);
    enqueue(&mut c, &lock, "c:1", 11);
    enqueue(&mut c, &lock, "c:2", 12);
    assert_eq!(lock.wake_key("c:1"), lock.wake_key("c:2"));
    assert_ne!(lock.wake_key("c:1"), lock.wake_key("h:1"));

    // the release grants to c:1: its message waits in the client's list
    assert_eq!(
        lock.release("h:1", token, 1).run(&mut c).unwrap(),
        Release::Released {
            next: Some("c:1".into())
        }
    );
    // c:1 gives up and passes the grant on: its message goes, c:2's comes
    assert_eq!(
        lock.leave("c:1", 11, LeaveMode::Pass, LateAcquire::Impossible)
            .run(&mut c)
            .unwrap(),
        Leave::Passed {
            next: Some("c:2".into())
        }
    );
    let msgs = wake_messages(&mut c, &lock, "c:2");
    assert_eq!(msgs.len(), 1, "{msgs:?}");
    assert!(msgs[0].starts_with("2|g|12|"), "{msgs:?}");
    let pttl: i64 = redis::cmd("PTTL")
        .arg(lock.wake_key("c:2"))
        .query(&mut c)
        .unwrap();
    assert!(pttl > 0 && pttl <= LEASE.as_millis() as i64, "{pttl}");

    // c:1 queues anew behind c:2: c:2's grant stays
    enqueue(&mut c, &lock, "c:1", 13);
    assert!(matches!(
        pop(&mut c, &lock, "c:2"),
        Some(Wake::Grant { attempt: 12, .. })
    ));
}

/// A full release leaves a receipt (its token) in the lock hash, so that a retry of it, whose
/// first run was applied and its reply lost, reports success; the hash keeps the last 8, newest
/// first, and a retry of an older release than those answers "not held" without touching the
/// current hold.
#[test]
fn a_lock_remembers_the_last_eight_releases_for_their_retries() {
    let (_server, mut c, lock) = start("receipts");
    let mut tokens = vec![];
    for attempt in 1..=10 {
        let t = take(&mut c, &lock, "w:1", attempt);
        assert_eq!(
            lock.release("w:1", t, 1).run(&mut c).unwrap(),
            Release::Released { next: None }
        );
        tokens.push(t);
    }
    let released: String = redis::cmd("HGET")
        .arg(lock.key_names()[0])
        .arg("released")
        .query(&mut c)
        .unwrap();
    let newest_first: Vec<String> = tokens.iter().rev().take(8).map(u64::to_string).collect();
    assert_eq!(released, newest_first.join(" "));
    // retries: the last 8 find their receipt, an older one does not
    let now = take(&mut c, &lock, "x:1", 1);
    for t in &tokens[2..] {
        assert_eq!(
            lock.release("w:1", *t, 1).run(&mut c).unwrap(),
            Release::Released { next: None }
        );
    }
    assert_eq!(
        lock.release("w:1", tokens[1], 1).run(&mut c).unwrap(),
        Release::NotHeld {
            holder: Some("x:1".into())
        }
    );
    assert_eq!(holder(&mut c, &lock), (Some("x:1".into()), Some(now)));
}

/// The hold's lease runs out now (its hash expires, as at the end of a lease nobody renewed).
fn expire_hold(c: &mut redis::Connection, lock: &RawLock) {
    let _: () = redis::cmd("PEXPIRE")
        .arg(lock.key_names()[0])
        .arg(1)
        .query(c)
        .unwrap();
    thread::sleep(Duration::from_millis(5));
}

/// The attempt that holds the lock, as its hash says.
fn holding_attempt(c: &mut redis::Connection, lock: &RawLock) -> Option<u64> {
    redis::cmd("HGET")
        .arg(lock.key_names()[0])
        .arg("attempt")
        .query(c)
        .unwrap()
}

/// Before, a thread re-took its own leaked (or locally lost) hold with a new attempt at once, ahead
/// of the waiters queued behind it (barging), and `try_lock` succeeded while others waited. Now a
/// leaked hold counts like anyone's (the client says so: 'keep'): a new attempt of the same thread
/// is busy, or queues behind the waiters. Any other older hold of the thread (no guard keeps it) is
/// passed on to the queue's head, and the new attempt is a newcomer behind it: no barging either
/// way.
#[test]
fn a_thread_does_not_retake_its_own_leaked_hold_ahead_of_the_queue() {
    let (_server, mut c, lock) = start("leaked");
    let t1 = take(&mut c, &lock, "job:1", 1);
    enqueue(&mut c, &lock, "other:1", 2);
    let again = lock
        .acquire_behind_leaked_hold("job:1", 3, LEASE, Mode::Try, "m")
        .run(&mut c)
        .unwrap();
    assert!(
        matches!(again, Acquire::Busy { .. }),
        "try_lock of the leaking thread: {again:?}"
    );
    assert_eq!(holder(&mut c, &lock), (Some("job:1".into()), Some(t1)));
    queued(
        lock.acquire_behind_leaked_hold("job:1", 4, LEASE, Mode::Wait, "m")
            .run(&mut c)
            .unwrap(),
    );
    assert_eq!(queue(&mut c, &lock), ["other:1", "job:1"]);
    // the leaked hold runs out: the head, not the leaking thread, gets the lock
    expire_hold(&mut c, &lock);
    lock.heartbeat([("job:1", 4)]).run(&mut c).unwrap();
    assert_eq!(holder(&mut c, &lock).0.as_deref(), Some("other:1"));

    // an older hold nobody keeps (its leave went astray in a failover): passed on, FIFO
    let (_server, mut c, lock) = start("orphaned");
    take(&mut c, &lock, "job:1", 1);
    enqueue(&mut c, &lock, "other:1", 2);
    let again = lock
        .acquire("job:1", 3, LEASE, Mode::Try, "m")
        .run(&mut c)
        .unwrap();
    assert!(matches!(again, Acquire::Busy { .. }), "{again:?}");
    assert_eq!(holder(&mut c, &lock).0.as_deref(), Some("other:1"));
}

/// Before, an attempt whose acquire was sent twice succeeded with the second copy; the thread used
/// the lock and released it; then the first copy arrived and took the lock for a thread that holds
/// no guard, so others were refused for a whole lease. The release now leaves a left mark when the
/// client asks (it saw the request go unanswered or sent it twice), and the late copy does nothing.
#[test]
fn a_late_copy_of_an_acquire_after_its_hold_was_released_does_nothing() {
    let (_server, mut c, lock) = start("ghost-hold");
    let copy = lock.acquire("c1:1", 7, LEASE, Mode::Wait, "m");
    let t = granted(copy.run(&mut c).unwrap()); // the repeat grants
    assert_eq!(
        lock.release_marking("c1:1", t, 1, 7).run(&mut c).unwrap(),
        Release::Released { next: None }
    );
    assert_eq!(copy.run(&mut c).unwrap(), Acquire::Stale, "the late copy");
    assert_eq!(holder(&mut c, &lock), (None, None));
    let other = lock
        .acquire("c2:1", 1, LEASE, Mode::Try, "m")
        .run(&mut c)
        .unwrap();
    assert!(matches!(other, Acquire::Granted(_)), "{other:?}");
    // a release that found the hold already gone (lost) marks too
    let (_server2, mut c2, lock2) = start("ghost-hold-lost");
    let t = take(&mut c2, &lock2, "c1:1", 9);
    expire_hold(&mut c2, &lock2);
    assert_eq!(
        lock2.release_marking("c1:1", t, 1, 9).run(&mut c2).unwrap(),
        Release::NotHeld { holder: None }
    );
    assert_eq!(
        lock2
            .acquire("c1:1", 9, LEASE, Mode::Wait, "m")
            .run(&mut c2)
            .unwrap(),
        Acquire::Stale
    );
}

/// Before, the waiters' virtual clock moved only when a heartbeat or an enqueue stored it, so with
/// only `try_lock` callers around nobody ever judged a dead waiter dead: each was handed the lock
/// for its whole lease, one after another. Now every script that judges waiters stores the clock:
/// try_lock traffic alone passes dead waiters over.
#[test]
fn dead_waiters_are_passed_over_with_only_try_lock_traffic() {
    let (_server, mut c, lock) = start("dead-waiters");
    let th = take(&mut c, &lock, "h:1", 1);
    for (owner, attempt) in [("d1:1", 2), ("d2:1", 3), ("d3:1", 4)] {
        enqueue(&mut c, &lock, owner, attempt);
    }
    // the three die; only try_lock callers (a cron job with --no-wait) come by
    let start = Instant::now();
    while start.elapsed() < WAITER_TIMEOUT * 3 {
        let r = lock
            .acquire("cron:1", 10, LEASE, Mode::Try, "m")
            .run(&mut c)
            .unwrap();
        assert!(matches!(r, Acquire::Busy { .. }), "{r:?}");
        thread::sleep(WAITER_TIMEOUT / 6);
    }
    assert_eq!(
        lock.release("h:1", th, 1).run(&mut c).unwrap(),
        Release::Released { next: None },
        "the release handed the lock to a waiter dead for three waiter timeouts"
    );
    let r = lock
        .acquire("cron:1", 11, LEASE, Mode::Try, "m")
        .run(&mut c)
        .unwrap();
    assert!(matches!(r, Acquire::Granted(_)), "{r:?}");
}

/// The same for a grant: a hand-off to a waiter that dies before popping it was revoked only by a
/// heartbeat; with only try_lock callers the dead grantee kept the lock for its whole lease. Now an
/// acquire revokes it too, within a few waiter timeouts.
#[test]
fn a_dead_grantee_is_revoked_by_try_lock_traffic_alone() {
    let (_server, mut c, lock) = start("dead-grantee-try");
    let th = take(&mut c, &lock, "h:1", 1);
    enqueue(&mut c, &lock, "dead:1", 2);
    lock.release("h:1", th, 1).run(&mut c).unwrap();
    assert_eq!(holder(&mut c, &lock).0.as_deref(), Some("dead:1"));
    let start = Instant::now();
    let got = eventually(Duration::from_secs(10), || {
        thread::sleep(WAITER_TIMEOUT / 6);
        let r = lock
            .acquire("cron:1", 10, LEASE, Mode::Try, "m")
            .run(&mut c)
            .unwrap();
        matches!(r, Acquire::Granted(_))
    });
    let took = start.elapsed();
    assert!(got, "the dead grantee kept the lock");
    assert!(took < WAITER_TIMEOUT * 6, "revoked after {took:?}");
    assert_eq!(pop(&mut c, &lock, "dead:1"), None, "the stale grant stays");
}

/// Before, same-type data of another program at a lock's keys was modified or deleted (a hash at
/// the lock's key got fairlock's fields and a TTL; a zset at the queue's key was emptied). Both are
/// refused now, and left as they were.
#[test]
fn another_programs_data_of_fairlocks_own_types_is_refused_and_left_untouched() {
    let (_server, mut c, lock) = start("same-type");
    let [lock_key, _, queue_key, waiters_key] = lock.key_names();
    let _: () = redis::cmd("HSET")
        .arg(lock_key)
        .arg("user")
        .arg("alice")
        .arg("balance")
        .arg(100)
        .query(&mut c)
        .unwrap();
    let r = lock.acquire("a:1", 1, LEASE, Mode::Wait, "m").run(&mut c);
    assert!(matches!(r, Err(Error::ForeignData { .. })), "{r:?}");
    let fields: Vec<String> = redis::cmd("HKEYS").arg(lock_key).query(&mut c).unwrap();
    assert_eq!(fields, ["user", "balance"]);
    let ttl: i64 = redis::cmd("PTTL").arg(lock_key).query(&mut c).unwrap();
    assert_eq!(ttl, -1);

    let (_server, mut c, lock) = start("same-type-queue");
    let [_, _, queue_key2, _] = lock.key_names();
    let _ = (queue_key, waiters_key);
    take(&mut c, &lock, "h:1", 1);
    let _: () = redis::cmd("ZADD")
        .arg(queue_key2)
        .arg(1)
        .arg("job-a")
        .arg(2)
        .arg("job-b")
        .query(&mut c)
        .unwrap();
    let r = lock.heartbeat([("w:1", 2)]).run(&mut c);
    assert!(matches!(r, Err(Error::ForeignData { .. })), "{r:?}");
    let members: Vec<String> = redis::cmd("ZRANGE")
        .arg(queue_key2)
        .arg(0)
        .arg(-1)
        .query(&mut c)
        .unwrap();
    assert_eq!(members, ["job-a", "job-b"]);

    let (_server, mut c, lock) = start("same-type-waiters");
    let [_, _, _, waiters_key3] = lock.key_names();
    take(&mut c, &lock, "h:1", 1);
    let _: () = redis::cmd("HSET")
        .arg(waiters_key3)
        .arg("config")
        .arg("x")
        .query(&mut c)
        .unwrap();
    let r = lock.acquire("w:1", 2, LEASE, Mode::Wait, "m").run(&mut c);
    assert!(matches!(r, Err(Error::ForeignData { .. })), "{r:?}");
    let fields: Vec<String> = redis::cmd("HKEYS").arg(waiters_key3).query(&mut c).unwrap();
    assert_eq!(fields, ["config"]);
}

/// Before, a fence of 2^63 or more (or '1e20', 'inf') overflowed the next token ('%d' through a C
/// long): the holder could not release, and tokens then went back. A fence that is no token
/// fairlock can use is refused now, and left as it was.
#[test]
fn a_fence_beyond_the_tokens_range_is_refused_and_left_as_it_was() {
    for (i, v) in [
        "1e20",
        "inf",
        "0x7fffffffffffffff",
        "9223372036854775808",
        "-5",
        "12.5",
    ]
    .into_iter()
    .enumerate()
    {
        let (_server, mut c, lock) = start(&format!("fence{i}"));
        let fence = lock.key_names()[1];
        let _: () = redis::cmd("SET").arg(fence).arg(v).query(&mut c).unwrap();
        let r = lock.acquire("a:1", 1, LEASE, Mode::Wait, "m").run(&mut c);
        assert!(
            matches!(r, Err(Error::ForeignData { .. })),
            "fence {v:?}: {r:?}"
        );
        let after: String = redis::cmd("GET").arg(fence).query(&mut c).unwrap();
        assert_eq!(after, v);
        assert_eq!(holder(&mut c, &lock), (None, None), "fence {v:?}");
    }
    // the largest token that is exact, and the next grant above it
    let (_server, mut c, lock) = start("fence-max");
    let _: () = redis::cmd("SET")
        .arg(lock.key_names()[1])
        .arg("9007199254740990")
        .query(&mut c)
        .unwrap();
    let t = take(&mut c, &lock, "a:1", 1);
    assert_eq!(t, 9007199254740991);
    assert_eq!(holding_attempt(&mut c, &lock), Some(1));
}

/// A grant pushes its wake-up before it takes the lock (the push is the probe of the wake list,
/// a key the script does not declare). Refused after the push, at another program's string in
/// the fence, the release takes the wake-up back: nothing is granted, nothing announced, and the
/// fence is as it was.
#[test]
fn a_grant_refused_at_the_fence_takes_its_wake_up_back() {
    let (_server, mut c, lock) = start("grant-refused");
    let t = take(&mut c, &lock, "h:1", 1);
    enqueue(&mut c, &lock, "w:1", 2);
    let fence = lock.key_names()[1];
    let _: () = redis::cmd("SET")
        .arg(fence)
        .arg("1e20")
        .query(&mut c)
        .unwrap();
    let r = lock.release("h:1", t, 1).run(&mut c);
    assert!(matches!(r, Err(Error::ForeignData { .. })), "{r:?}");
    assert_eq!(pop(&mut c, &lock, "w:1"), None, "a wake-up for no grant");
    assert_eq!(holder(&mut c, &lock), (Some("h:1".into()), Some(t)));
    assert_eq!(queue(&mut c, &lock), ["w:1"]);
    let after: String = redis::cmd("GET").arg(fence).query(&mut c).unwrap();
    assert_eq!(after, "1e20");
}

/// The wake-up is pushed with the token the hold gets unless the fence is ahead of the hash;
/// when it is (here set far ahead by hand, as a lost hash or a backward clock step leaves it),
/// the wake-up carries the token the hold really got.
#[test]
fn a_grant_behind_the_fence_announces_the_token_it_got() {
    let (_server, mut c, lock) = start("grant-ahead");
    let t = take(&mut c, &lock, "h:1", 1);
    enqueue(&mut c, &lock, "w:1", 2);
    let ahead = t + 10_000_000_000;
    let _: () = redis::cmd("SET")
        .arg(lock.key_names()[1])
        .arg(ahead)
        .query(&mut c)
        .unwrap();
    lock.release("h:1", t, 1).run(&mut c).unwrap();
    assert_eq!(holder(&mut c, &lock), (Some("w:1".into()), Some(ahead + 1)));
    match pop(&mut c, &lock, "w:1") {
        Some(Wake::Grant { attempt, token, .. }) => assert_eq!((attempt, token), (2, ahead + 1)),
        other => panic!("expected the grant, got {other:?}"),
    }
    assert_eq!(pop(&mut c, &lock, "w:1"), None, "a second wake-up");
}

/// Found by the fuzzer's ghost-hold check (its generator of acquires sent twice): a copy of an
/// acquire that was sent twice arrived after the thread's own hold was lost (force-unlocked, or run
/// out) but while the thread still held its guard, and took the lock for that very attempt with a
/// new token nobody will release. The guard's release (which asks for a mark, as the acquire was
/// sent twice) now frees such a hold of its own attempt.
#[test]
fn a_marking_release_frees_a_late_copys_hold_of_its_own_attempt() {
    let (_server, mut c, lock) = start("own-ghost");
    let copy = lock.acquire("c1:1", 4, LEASE, Mode::Wait, "m");
    let t1 = granted(copy.run(&mut c).unwrap());
    assert!(matches!(
        lock.force_unlock("c1:1", t1).run(&mut c).unwrap(),
        ForceUnlock::Released { .. }
    ));
    let t2 = granted(copy.run(&mut c).unwrap()); // the late copy
    assert!(t2 > t1);
    assert_eq!(
        lock.release_marking("c1:1", t1, 1, 4).run(&mut c).unwrap(),
        Release::NotHeld { holder: None }
    );
    assert_eq!(holder(&mut c, &lock), (None, None), "the late copy's hold");
    assert_eq!(copy.run(&mut c).unwrap(), Acquire::Stale);
}

/// Found by the fuzzer's ghost-hold check: a late copy of an acquire sent twice arrived after
/// the thread's hold was force-unlocked and the lock taken by another, so it *queued* for that
/// attempt; the thread's guard was dropped (its release marked the attempt) but the queue place
/// stayed, and the next release handed the lock to an attempt nobody waits with. A marking
/// release now removes a queue place of its attempt too.
#[test]
fn a_marking_release_removes_a_late_copys_queue_place() {
    let (_server, mut c, lock) = start("own-ghost-queued");
    let copy = lock.acquire("c1:1", 2, LEASE, Mode::Wait, "m");
    let t1 = granted(copy.run(&mut c).unwrap());
    lock.force_unlock("c1:1", t1).run(&mut c).unwrap();
    let t_other = take(&mut c, &lock, "c2:1", 3);
    queued(copy.run(&mut c).unwrap()); // the late copy queues
    assert_eq!(
        lock.release_marking("c1:1", t1, 1, 2).run(&mut c).unwrap(),
        Release::NotHeld {
            holder: Some("c2:1".into())
        }
    );
    assert!(
        queue(&mut c, &lock).is_empty(),
        "the late copy's place stayed"
    );
    assert_eq!(
        lock.release("c2:1", t_other, 1).run(&mut c).unwrap(),
        Release::Released { next: None }
    );
}

/// Found by the fuzzer (a live waiter lost its place): a thread still held the lock with
/// attempt 1 and queued behind it with attempt 2; a late copy of attempt 1's
/// acquire, answered with the grant it already had, removed the thread's queue entry, which is
/// attempt 2's. Only an entry of that attempt (or an older one) goes now.
#[test]
fn a_late_copy_of_a_granted_acquire_keeps_the_threads_newer_queue_place() {
    let (_server, mut c, lock) = start("newer-place");
    let copy = lock.acquire("c1:1", 1, LEASE, Mode::Wait, "m");
    let t1 = granted(copy.run(&mut c).unwrap());
    // it leaked that hold: it queues behind it
    queued(
        lock.acquire_behind_leaked_hold("c1:1", 2, LEASE, Mode::Wait, "m")
            .run(&mut c)
            .unwrap(),
    );
    assert_eq!(granted(copy.run(&mut c).unwrap()), t1);
    assert_eq!(queue(&mut c, &lock), ["c1:1"], "attempt 2 lost its place");
    let waiters: Vec<String> = redis::cmd("HKEYS")
        .arg(lock.key_names()[3])
        .query(&mut c)
        .unwrap();
    assert!(waiters.contains(&"c1:1".to_string()), "{waiters:?}");
}

/// A generator of foreign data (fences that are no token, another program's keys): every script, in
/// every state of a lock, against another program's data of every kind at each of the lock's keys
/// that the state does not use (the same type as fairlock's, another type, numeric extremes at the
/// fence). A script either refuses (`ForeignData`) or succeeds, and the foreign key is left exactly
/// as it was (its value and its TTL).
#[test]
fn foreign_data_of_any_kind_at_any_key_in_any_state_is_refused_or_left_untouched() {
    let server = RedisServer::start();
    let mut c = server.conn();
    // (what, the command that writes it, without its key)
    type Foreign = (&'static str, &'static [&'static str]);
    let hash = ("hash", &["HSET", "user", "alice"][..]);
    let string = ("string", &["SET", "x"][..]);
    let zset = ("zset", &["ZADD", "1", "job-a"][..]);
    let list = ("list", &["RPUSH", "hello"][..]);
    // (key suffix, foreign values): "" the lock hash; "wake-me"/"wake-w" the wake lists of the
    // caller's client and of the queued waiter's
    let kinds: [(&str, Vec<Foreign>); 7] = [
        ("", vec![hash, string, zset]),
        (
            ":fence",
            vec![
                ("1e20", &["SET", "1e20"]),
                ("inf", &["SET", "inf"]),
                ("2^63", &["SET", "9223372036854775808"]),
                ("20 digits", &["SET", "99999999999999999999"]),
                hash,
            ],
        ),
        (":queue", vec![zset, list]),
        (":waiters", vec![hash, string]),
        (":left", vec![hash, zset]),
        ("wake-me", vec![list, string]),
        ("wake-w", vec![list, hash]),
    ];
    let states = ["free", "held", "queued", "handed-off", "released"];
    let mut runs = 0;
    for (s, state) in states.iter().enumerate() {
        for (k, (suffix, values)) in kinds.iter().enumerate() {
            for (v, (what, write)) in values.iter().enumerate() {
                for call in 0..12 {
                    let name = format!("fd-{s}-{k}-{v}-{call}");
                    let lock = raw_lock(&mut c, &name);
                    // the state, with h:1 (token th) holding and w:1 queued as set up
                    let mut th = 0;
                    if *state != "free" {
                        th = take(&mut c, &lock, "h:1", 1);
                    }
                    if matches!(*state, "queued" | "handed-off") {
                        enqueue(&mut c, &lock, "w:1", 2);
                    }
                    if *state == "handed-off" {
                        lock.release("h:1", th, 1).run(&mut c).unwrap();
                    }
                    if *state == "released" {
                        lock.release("h:1", th, 1).run(&mut c).unwrap();
                    }
                    let key = match *suffix {
                        "wake-me" => lock.wake_key("me:1"),
                        "wake-w" => lock.wake_key("w:1"),
                        s => format!("{}{s}", lock.key_names()[0]),
                    };
                    let exists: bool = redis::cmd("EXISTS").arg(&key).query(&mut c).unwrap();
                    if exists {
                        continue; // fairlock's own key in this state
                    }
                    let _: () = redis::cmd(write[0])
                        .arg(&key)
                        .arg(&write[1..])
                        .query(&mut c)
                        .unwrap();
                    let before: Vec<u8> = redis::cmd("DUMP").arg(&key).query(&mut c).unwrap();
                    let r: Result<String, Error> = match call {
                        0 => lock
                            .acquire("me:1", 5, LEASE, Mode::Try, "m")
                            .run(&mut c)
                            .map(|r| format!("{r:?}")),
                        1 => lock
                            .acquire("me:1", 5, LEASE, Mode::Wait, "m")
                            .run(&mut c)
                            .map(|r| format!("{r:?}")),
                        2 => lock
                            .release("h:1", th, 1)
                            .run(&mut c)
                            .map(|r| format!("{r:?}")),
                        3 => lock
                            .release_marking("h:1", th, 1, 1)
                            .run(&mut c)
                            .map(|r| format!("{r:?}")),
                        4 => lock
                            .renew("h:1", th, LEASE)
                            .run(&mut c)
                            .map(|r| format!("{r:?}")),
                        5 => lock
                            .reenter("h:1", th, 1)
                            .run(&mut c)
                            .map(|r| format!("{r:?}")),
                        6 => lock
                            .leave("w:1", 2, LeaveMode::Claim, LateAcquire::Possible)
                            .run(&mut c)
                            .map(|r| format!("{r:?}")),
                        7 => lock
                            .leave("w:1", 2, LeaveMode::Pass, LateAcquire::Possible)
                            .run(&mut c)
                            .map(|r| format!("{r:?}")),
                        8 => lock
                            .heartbeat([("w:1", 2), ("me:1", 5)])
                            .run(&mut c)
                            .map(|r| format!("{r:?}")),
                        9 => lock
                            .force_unlock("h:1", th)
                            .run(&mut c)
                            .map(|r| format!("{r:?}")),
                        10 => lock.status().run(&mut c).map(|r| format!("{r:?}")),
                        _ => lock
                            .leave("me:1", 5, LeaveMode::Pass, LateAcquire::Possible)
                            .run(&mut c)
                            .map(|r| format!("{r:?}")),
                    };
                    runs += 1;
                    let context = format!("state {state}, {what} at {key}, call {call}: {r:?}");
                    support::assert_foreign_data_untouched(&mut c, &key, &before, &r, &context);
                    if r.is_err() && *suffix != "wake-w" {
                        // a grant pushes its wake-up first: refused after it, it takes it back
                        let wake = wake_messages(&mut c, &lock, "w:1");
                        let owner: Option<String> = redis::cmd("HGET")
                            .arg(lock.key_names()[0])
                            .arg("owner")
                            .query(&mut c)
                            .unwrap_or(None);
                        if owner.as_deref() != Some("w:1") {
                            assert!(
                                wake.iter().all(|m| !m.contains("|g|")),
                                "a refused grant left its wake-up {wake:?}: {context}"
                            );
                        }
                    }
                }
            }
        }
    }
    assert!(runs > 500, "{runs} runs");
}

/// Clients with different waiter timeouts on one lock. Before, after a forward step of the server
/// clock the first script advanced the shared virtual clock by *its caller's* third of a waiter
/// timeout (1 s for a 3 s timeout), which is more than a 150 ms waiter's whole timeout: the live
/// short-timeout waiter, heartbeating on time, was purged and queued again at the back. A clock now
/// advances by at most the smallest third of the clients queued on it.
#[test]
fn a_long_timeout_client_cannot_age_a_short_timeout_waiter_out_after_a_clock_step() {
    let mut server = faketime::FakeClockRedis::start();
    let mut c = server.conn();
    let runner = runner(&mut c);
    let with_timeout = |ms| {
        let settings = Settings {
            waiter_timeout: Duration::from_millis(ms),
            runner,
            ..Settings::default()
        };
        RawLock::new("fairlock", "mixed", settings).unwrap()
    };
    let (short, long) = (with_timeout(150), with_timeout(3000));
    take(&mut c, &long, "h:1", 1);
    queued(
        short
            .acquire("b:1", 2, LEASE, Mode::Wait, "m")
            .run(&mut c)
            .unwrap(),
    );
    queued(
        long.acquire("a:1", 3, LEASE, Mode::Wait, "m")
            .run(&mut c)
            .unwrap(),
    );
    short.heartbeat([("b:1", 2)]).run(&mut c).unwrap();
    server.set_offset_ms(2_000);
    // A's heartbeat runs first after the step, then B's, on time
    long.heartbeat([("a:1", 3)]).run(&mut c).unwrap();
    let hb = short.heartbeat([("b:1", 2)]).run(&mut c).unwrap();
    assert!(hb.told_to_retry.is_empty(), "B was purged: {hb:?}");
    assert_eq!(queue(&mut c, &short), ["b:1", "a:1"]);
}

/// Before, a repeated acquire of the grantee that arrives while its hand-off waits in its wake list
/// (a copy sent again after a slow reply, or repeated by the connection layer on Sentinel or
/// Cluster) answered "granted" to a connection nobody reads and dropped the wake-up: the grantee
/// waited a whole lease for a message that was gone, while its heartbeats kept the orphaned
/// hand-off alive, and then the waiter queued behind it was served first.
#[test]
fn a_repeated_acquire_during_a_pending_hand_off_keeps_the_grantees_wake_up() {
    let (_server, mut c, lock) = start("dup-handoff");
    let th = take(&mut c, &lock, "h:1", 1);
    let first_copy = lock.acquire("t:1", 5, LEASE, Mode::Wait, "m");
    queued(first_copy.run(&mut c).unwrap());
    enqueue(&mut c, &lock, "x:1", 1);
    lock.release("h:1", th, 1).run(&mut c).unwrap();
    let (grantee, token) = holder(&mut c, &lock);
    assert_eq!(grantee.as_deref(), Some("t:1"));
    // the repeated copy arrives before t pops its hand-off; its reply goes nowhere
    assert_eq!(granted(first_copy.run(&mut c).unwrap()), token.unwrap());
    // t pops the hand-off it was sent, with the hold's token
    match pop(&mut c, &lock, "t:1") {
        Some(Wake::Grant {
            attempt: 5,
            token: t,
            ..
        }) => assert_eq!(Some(t), token),
        other => panic!("t's hand-off was dropped by the repeat: {other:?}"),
    }
    // and keeps it past the waiter timeout, whatever the heartbeats say: x is still queued
    for _ in 0..4 {
        thread::sleep(WAITER_TIMEOUT / 2);
        lock.heartbeat([("x:1", 1)]).run(&mut c).unwrap();
    }
    assert_eq!(holder(&mut c, &lock), (Some("t:1".into()), token));
    assert_eq!(queue(&mut c, &lock), ["x:1"]);
}

/// A repeated acquire answered "granted" during a pending hand-off may be the one whose reply
/// the client reads (the connection layer's repeat): the hold it reports must then not be
/// revoked as a dead grantee's while the unpopped wake-up waits in the list, since nobody
/// waits to pop it.
#[test]
fn a_hold_reported_by_a_repeated_acquire_is_not_revoked_as_an_unpopped_hand_off() {
    let (_server, mut c, lock) = start("dup-handoff-read");
    let th = take(&mut c, &lock, "h:1", 1);
    let copy = lock.acquire("t:1", 5, LEASE, Mode::Wait, "m");
    queued(copy.run(&mut c).unwrap());
    enqueue(&mut c, &lock, "x:1", 1);
    lock.release("h:1", th, 1).run(&mut c).unwrap();
    let token = granted(copy.run(&mut c).unwrap());
    // t holds through the reply; nobody pops the hand-off; x heartbeats past the waiter timeout
    for _ in 0..6 {
        thread::sleep(WAITER_TIMEOUT / 2);
        lock.heartbeat([("x:1", 1)]).run(&mut c).unwrap();
    }
    assert_eq!(holder(&mut c, &lock), (Some("t:1".into()), Some(token)));
    assert_eq!(queue(&mut c, &lock), ["x:1"]);
}

/// Found by the fuzzer's wake-up judge (a hand-off in Redis whose wake-up nobody popped must be
/// in the wake list): the holder's lease ran out, and a repeated copy of the queue head's acquire
/// (a stray duplicate, a connection-layer retry) took the free lock for it with a reply nobody
/// read and no wake-up; the head slept on its wake list until that hold's lease ran out too.
#[test]
fn a_repeated_acquire_of_the_head_of_a_free_lock_also_wakes_the_head() {
    let (_server, mut c, lock) = start("dup-head");
    take(&mut c, &lock, "h:1", 1);
    let copy = lock.acquire("t:1", 7, LEASE, Mode::Wait, "m");
    queued(copy.run(&mut c).unwrap());
    enqueue(&mut c, &lock, "x:1", 1);
    expire_hold(&mut c, &lock);
    // the repeat arrives while the lock is free with t at the head; its reply goes nowhere
    let token = granted(copy.run(&mut c).unwrap());
    match pop(&mut c, &lock, "t:1") {
        Some(Wake::Grant {
            attempt: 7,
            token: t,
            ..
        }) => assert_eq!(t, token),
        other => panic!("the head was not told of its grant: {other:?}"),
    }
    // the hold is confirmed: heartbeats past the waiter timeout do not revoke it
    for _ in 0..4 {
        thread::sleep(WAITER_TIMEOUT / 2);
        lock.heartbeat([("x:1", 1)]).run(&mut c).unwrap();
    }
    assert_eq!(holder(&mut c, &lock), (Some("t:1".into()), Some(token)));
    assert_eq!(queue(&mut c, &lock), ["x:1"]);
}

/// `owner`'s `attempt` queues behind the holder and leaves with a left mark (an acquire request
/// of it may still arrive).
fn queue_and_leave_marked(c: &mut redis::Connection, lock: &RawLock, owner: &str, attempt: u64) {
    enqueue(c, lock, owner, attempt);
    lock.leave(owner, attempt, LeaveMode::Pass, LateAcquire::Possible)
        .run(c)
        .unwrap();
}

/// Fields of the left marks' hash (the marker field '~' included).
fn left_marks(c: &mut redis::Connection, lock: &RawLock) -> usize {
    redis::cmd("HLEN")
        .arg(format!("{}:left", lock.key_names()[0]))
        .query(c)
        .unwrap()
}

/// Found by the fuzzer's long run (seed 20261153, `WaiterLost`): a waiter's place lives in two
/// keys, the queue and the waiters hash, each kept the queue's TTL (10 minutes, so that they
/// outlive a forward step of the server clock). A new place refreshed the queue's TTL but not
/// the waiters hash's, which only heartbeats refreshed: on a lock whose other waiters are dead
/// (nobody heartbeats it), the hash kept the TTL of its last refresh, and a forward step before
/// the new waiter's first heartbeat expired it with the new entry: the live waiter was told to
/// retry, its place lost. Here the hash is 7 minutes old when the waiter queues and a 7-minute
/// step follows.
#[test]
fn a_new_place_keeps_the_waiters_hash_for_the_queue_ttl() {
    let mut server = faketime::FakeClockRedis::start();
    let mut c = server.conn();
    let lock = raw_lock(&mut c, "waiters-ttl");
    granted(
        lock.acquire("h:1", 1, Duration::from_secs(3600), Mode::Wait, "m")
            .run(&mut c)
            .unwrap(),
    );
    // a waiter whose client died: nobody heartbeats this lock
    enqueue(&mut c, &lock, "dead:1", 2);
    server.set_offset_ms(7 * 60_000);
    enqueue(&mut c, &lock, "live:1", 3);
    let pttl = |c: &mut redis::Connection, key: &str| -> i64 {
        redis::cmd("PTTL").arg(key).query(c).unwrap()
    };
    let waiters_ttl = pttl(&mut c, lock.key_names()[3]);
    // one step of 7 minutes, less than the queue's TTL, before the waiter's first heartbeat
    server.set_offset_ms(14 * 60_000);
    let hb = lock.heartbeat([("live:1", 3)]).run(&mut c).unwrap();
    assert!(
        hb.told_to_retry.is_empty(),
        "a live waiter lost its place to a 7-minute step (the waiters hash had {waiters_ttl} ms \
         left when it queued): {hb:?}"
    );
    assert_eq!(queue(&mut c, &lock), ["dead:1", "live:1"]);
}

/// Before, the left marks' hash never lost a field, and every mark refreshed its TTL, so on a lock
/// where marks keep coming it grew by one field per marking owner forever (2,000 fields, 112 KB in
/// one run). A mark lives the queue's TTL (10 minutes) after it was made, whatever marks come after
/// it: the first mark after that (plus a tenth, so a prune reads the hash at most once a minute)
/// drops it.
#[test]
fn left_marks_older_than_the_queue_ttl_go_while_new_marks_keep_coming() {
    let mut server = faketime::FakeClockRedis::start();
    let mut c = server.conn();
    let lock = raw_lock(&mut c, "marks");
    granted(
        lock.acquire("h:1", 1, Duration::from_secs(3600), Mode::Wait, "m")
            .run(&mut c)
            .unwrap(),
    );
    for i in 0..40 {
        queue_and_leave_marked(&mut c, &lock, &format!("old{i}:1"), 1);
    }
    assert_eq!(left_marks(&mut c, &lock), 41);
    // six minutes on, a new mark; six more (past the first marks' ten and a tenth), another
    server.set_offset_ms(6 * 60_000);
    queue_and_leave_marked(&mut c, &lock, "mid:1", 1);
    server.set_offset_ms(12 * 60_000);
    queue_and_leave_marked(&mut c, &lock, "new:1", 1);
    assert_eq!(left_marks(&mut c, &lock), 3, "old marks kept");
    // the kept marks still work: a late copy of mid's acquire does nothing
    assert!(matches!(
        lock.acquire("mid:1", 1, LEASE, Mode::Wait, "m")
            .run(&mut c)
            .unwrap(),
        Acquire::Stale
    ));
}

/// Found by the fuzzer's wake-up judge: the operator force-unlocked a hand-off before its waiter
/// popped it, and a stray copy of the waiter's acquire then took the free lock (no queue: the
/// fast path) with a reply nobody read and no wake-up; the waiter slept until that hold's lease
/// ran out. A heartbeat that finds a waiting attempt holding the lock with no wake-up pending
/// tells it, so it learns within a heartbeat.
#[test]
fn a_heartbeat_tells_a_waiting_attempt_the_lock_its_own_repeat_took() {
    let (_server, mut c, lock) = start("dup-fast");
    let th = take(&mut c, &lock, "h:1", 1);
    let copy = lock.acquire("t:1", 3, LEASE, Mode::Wait, "m");
    queued(copy.run(&mut c).unwrap());
    lock.release("h:1", th, 1).run(&mut c).unwrap();
    let (_, handed) = holder(&mut c, &lock);
    lock.force_unlock("t:1", handed.unwrap())
        .run(&mut c)
        .unwrap();
    assert_eq!(
        pop(&mut c, &lock, "t:1"),
        None,
        "the forced unlock kept the wake-up"
    );
    // the stray copy takes the free lock; its reply goes to no one
    let token = granted(copy.run(&mut c).unwrap());
    // told once, however many heartbeats come before the waker pops it
    lock.heartbeat([("t:1", 3)]).run(&mut c).unwrap();
    lock.heartbeat([("t:1", 3)]).run(&mut c).unwrap();
    match pop(&mut c, &lock, "t:1") {
        Some(Wake::Grant {
            attempt: 3,
            token: t,
            ..
        }) => assert_eq!(t, token),
        other => panic!("the heartbeat did not tell the waiter of its hold: {other:?}"),
    }
    assert_eq!(pop(&mut c, &lock, "t:1"), None, "told twice");
}

/// A hand-off's wake-up popped from the wake list whose reply never reached the waiting thread
/// (the waker's BLPOP applied, its reply lost with the connection): the attempt goes on waiting,
/// and its janitor on heartbeating it as a waiter. Before, the heartbeat only moved the
/// hand-off's deadline on (the grantee is alive), so nobody told the thread of its grant again
/// and the lock stayed held by nobody until its lease ran out, the waiter then told to retry at
/// the back of the queue (the semaphore's twin is the chaos finding of
/// `semaphore_protocol::a_hand_off_popped_but_not_taken_is_told_again_while_its_attempt_still_waits`).
/// A hand-off whose wake-up is gone while its attempt still heartbeats as a waiter is told
/// again, once, and confirmed (the grantee is alive).
#[test]
fn a_hand_off_popped_but_not_taken_is_told_again_while_its_attempt_still_waits() {
    let (_server, mut c, lock) = start("lost-pop");
    let th = take(&mut c, &lock, "h:1", 1);
    enqueue(&mut c, &lock, "w:2", 7);
    enqueue(&mut c, &lock, "x:1", 1);
    lock.release("h:1", th, 1).run(&mut c).unwrap();
    // the waker pops w's hand-off, and w's thread never sees it
    let handed = match pop(&mut c, &lock, "w:2") {
        Some(Wake::Grant {
            attempt: 7, token, ..
        }) => token,
        other => panic!("the release did not hand the lock to w: {other:?}"),
    };
    // w's thread still waits: its janitor heartbeats it, twice before its waker pops again
    lock.heartbeat([("w:2", 7)]).run(&mut c).unwrap();
    lock.heartbeat([("w:2", 7)]).run(&mut c).unwrap();
    match pop(&mut c, &lock, "w:2") {
        Some(Wake::Grant {
            attempt: 7, token, ..
        }) => assert_eq!(token, handed),
        other => panic!("w was never told of its grant again: {other:?}"),
    }
    assert_eq!(pop(&mut c, &lock, "w:2"), None, "told twice");
    assert_eq!(holder(&mut c, &lock), (Some("w:2".into()), Some(handed)));
}

/// The other side of telling a grant again: a heartbeat sent just before its thread took the
/// hand-off (the janitor unregisters the attempt only after) finds the wake-up popped and pushes
/// it again. That copy stays in the list once the thread stopped waiting (its waker no longer
/// pops that list), so the hand-off must be confirmed with it: a deadline left in place would
/// see the copy unpopped and revoke the lock from its live holder once the deadline passed. The
/// copy lives a waiter timeout, not the lease: nobody pops it, and the list is otherwise left
/// behind long after its client exited.
#[test]
fn a_grant_told_again_to_a_thread_that_took_it_is_never_revoked() {
    let (_server, mut c, lock) = start("told-again");
    let th = take(&mut c, &lock, "h:1", 1);
    enqueue(&mut c, &lock, "w:2", 7);
    lock.release("h:1", th, 1).run(&mut c).unwrap();
    let handed = match pop(&mut c, &lock, "w:2") {
        Some(Wake::Grant {
            attempt: 7, token, ..
        }) => token,
        other => panic!("the release did not hand the lock to w: {other:?}"),
    };
    // the janitor's last heartbeats, in flight as the thread takes its hold: the first tells
    // the grant again, the second finds that copy pending (and must not start a deadline)
    lock.heartbeat([("w:2", 7)]).run(&mut c).unwrap();
    lock.heartbeat([("w:2", 7)]).run(&mut c).unwrap();
    assert_eq!(
        wake_messages(&mut c, &lock, "w:2").len(),
        1,
        "told again, once"
    );
    // nobody pops that copy now: it must go within a waiter timeout, as a "retry" does, and not
    // live out the lease (a client's clean exit left its wake list behind for 30 s)
    let ttl: i64 = redis::cmd("PTTL")
        .arg(lock.wake_key("w:2"))
        .query(&mut c)
        .unwrap();
    assert!(
        0 < ttl && ttl <= WAITER_TIMEOUT.as_millis() as i64,
        "the copy told again lives {ttl} ms, more than the waiter timeout {WAITER_TIMEOUT:?}"
    );
    // w holds the lock and waits no more; others come by for several waiter timeouts
    let until = Instant::now() + WAITER_TIMEOUT * 5;
    while Instant::now() < until {
        thread::sleep(WAITER_TIMEOUT / 3);
        let r = lock
            .acquire("cron:1", 10, LEASE, Mode::Try, "m")
            .run(&mut c)
            .unwrap();
        assert!(
            !matches!(r, Acquire::Granted(_)),
            "the lock was taken from its live holder w"
        );
    }
    assert_eq!(holder(&mut c, &lock), (Some("w:2".into()), Some(handed)));
}

/// A connection as a user whose ACL allows only the four keys each script declares of lock
/// `name` (`~` patterns): the wake lists and the left marks, which the scripts name inside,
/// are refused, as while a Cluster slot migrates or under a serverless offering that checks
/// declared keys.
fn declared_keys_only(server: &RedisServer, name: &str, extra: &[&str]) -> redis::Connection {
    let base = format!("fairlock:{{{name}}}");
    let suffixes = ["", ":fence", ":queue", ":waiters"].iter().chain(extra);
    server.conn_limited_to("declared", suffixes.map(|suffix| format!("{base}{suffix}")))
}

/// A generator beyond the one Cluster test: every script that may grant, run by a user refused the
/// undeclared keys (the grantee's wake list, the left marks). A grant pushes the grantee's wake-up
/// first, so a refused push leaves no half grant: either the script hands the lock on with the
/// wake-up in place, or the lock stays free with its queue (stranded), which a heartbeat with the
/// keys reachable then grants to the head.
#[test]
fn with_the_undeclared_keys_refused_no_script_leaves_half_a_grant() {
    let server = RedisServer::start();
    let mut admin = server.conn();
    let calls = [
        "release",
        "release marking",
        "leave pass",
        "force unlock",
        "heartbeat",
    ];
    for (i, call) in calls.iter().enumerate() {
        let name = format!("undeclared-{i}");
        let lock = raw_lock(&mut admin, &name);
        let th = take(&mut admin, &lock, "h:1", 1);
        enqueue(&mut admin, &lock, "x:1", 2);
        enqueue(&mut admin, &lock, "w:1", 3);
        if *call == "leave pass" || *call == "heartbeat" {
            // the holder's lease runs out: a stranded lock for the call to hand on
            expire_hold(&mut admin, &lock);
        }
        let mut c = declared_keys_only(&server, &name, &[]);
        let r = match *call {
            "release" => lock
                .release("h:1", th, 1)
                .run(&mut c)
                .map(|r| format!("{r:?}")),
            "release marking" => lock
                .release_marking("h:1", th, 1, 1)
                .run(&mut c)
                .map(|r| format!("{r:?}")),
            "leave pass" => lock
                .leave("x:1", 2, LeaveMode::Pass, LateAcquire::Possible)
                .run(&mut c)
                .map(|r| format!("{r:?}")),
            "force unlock" => lock
                .force_unlock("h:1", th)
                .run(&mut c)
                .map(|r| format!("{r:?}")),
            _ => lock
                .heartbeat([("x:1", 2), ("w:1", 3)])
                .run(&mut c)
                .map(|r| format!("{r:?}")),
        };
        let (owner, _) = holder(&mut admin, &lock);
        let context = format!(
            "{call}: {r:?}, owner {owner:?}, queue {:?}",
            queue(&mut admin, &lock)
        );
        match owner.as_deref() {
            None => {
                assert!(
                    !queue(&mut admin, &lock).is_empty(),
                    "the queue was lost: {context}"
                );
                // stranded: a heartbeat that reaches the wake lists grants the head
                lock.heartbeat([("x:1", 2), ("w:1", 3)])
                    .run(&mut admin)
                    .unwrap();
                let (next, token) = holder(&mut admin, &lock);
                let next = next.unwrap_or_else(|| panic!("still stranded: {context}"));
                assert!(
                    wake_messages(&mut admin, &lock, &next)
                        .iter()
                        .any(|m| m.contains("|g|") && m.contains(&token.unwrap().to_string())),
                    "{next} was granted without its wake-up after the repair: {context}"
                );
            }
            Some("h:1") => assert!(r.is_err(), "the holder kept the lock: {context}"),
            Some(grantee) => {
                let (_, token) = holder(&mut admin, &lock);
                assert!(
                    wake_messages(&mut admin, &lock, grantee)
                        .iter()
                        .any(|m| m.contains(&token.unwrap().to_string())),
                    "{grantee} holds without its wake-up: {context}"
                );
            }
        }
    }
}

/// The lock's time to live in ms.
fn pttl(c: &mut redis::Connection, lock: &RawLock) -> i64 {
    redis::cmd("PTTL")
        .arg(lock.key_names()[0])
        .query(c)
        .unwrap()
}

/// renew.lua: the live hold's renewal answers 1 and sets the TTL to the lease from now; one with
/// another hold's token or another owner answers 0 and leaves the TTL alone.
#[test]
fn a_renewal_extends_only_the_hold_it_names() {
    let (_server, mut c, lock) = start("renew");
    let t = take(&mut c, &lock, "h:1", 1);
    let longer = Duration::from_secs(90);
    assert!(!lock.renew("h:1", t + 1, longer).run(&mut c).unwrap());
    assert!(!lock.renew("x:1", t, longer).run(&mut c).unwrap());
    let left = pttl(&mut c, &lock);
    assert!(
        left > 0 && left <= LEASE.as_millis() as i64,
        "a refused renewal changed the TTL: {left} ms"
    );
    assert!(lock.renew("h:1", t, longer).run(&mut c).unwrap());
    let left = pttl(&mut c, &lock);
    assert!(
        left > 80_000 && left <= 90_000,
        "the renewal set the TTL to {left} ms, not the 90 s lease"
    );
    assert_eq!(holder(&mut c, &lock), (Some("h:1".into()), Some(t)));
}

/// renew.lua: a renewal only ever lengthens the TTL: after a backward step of the server clock
/// the lock's TTL is longer than the lease, and a renewal leaves it so.
#[test]
fn a_renewal_after_a_backward_clock_step_keeps_the_longer_ttl() {
    let mut server = faketime::FakeClockRedis::start();
    let mut c = server.conn();
    let lock = raw_lock(&mut c, "renew-stepped");
    let t = take(&mut c, &lock, "h:1", 1);
    server.set_offset_ms(-40_000);
    let before = pttl(&mut c, &lock);
    assert!(before > 60_000, "the step made the TTL {before} ms");
    assert!(lock.renew("h:1", t, LEASE).run(&mut c).unwrap());
    let after = pttl(&mut c, &lock);
    assert!(
        after > 60_000,
        "a renewal shortened a {before} ms TTL to {after} ms"
    );
}

/// heartbeat.lua, 1.: a grantee whose hand-off waits unpopped keeps it alive with its heartbeats
/// past the waiter timeout: it stays the holder, is never told to retry, and another waiter's
/// heartbeats do not revoke it (the mutex's twin of semaphore_protocol's test).
#[test]
fn a_grantee_that_heartbeats_keeps_its_hand_off() {
    let (_server, mut c, lock) = start("grantee-heartbeats");
    let th = take(&mut c, &lock, "h:1", 1);
    enqueue(&mut c, &lock, "w:1", 2);
    enqueue(&mut c, &lock, "x:1", 3);
    assert_eq!(
        lock.release("h:1", th, 1).run(&mut c).unwrap(),
        Release::Released {
            next: Some("w:1".into())
        }
    );
    let (_, tw) = holder(&mut c, &lock);
    let start = Instant::now();
    while start.elapsed() < WAITER_TIMEOUT * 2 {
        let hb = lock.heartbeat([("w:1", 2)]).run(&mut c).unwrap();
        assert!(hb.told_to_retry.is_empty(), "the grantee was told to retry");
        // another client's heartbeat: it revokes a hand-off whose deadline passed
        let hb = lock.heartbeat([("x:1", 3)]).run(&mut c).unwrap();
        assert_eq!(hb.repairs, 0, "a live grantee's hand-off revoked");
        thread::sleep(WAITER_TIMEOUT / 6);
    }
    assert_eq!(holder(&mut c, &lock), (Some("w:1".into()), tw));
    assert_eq!(
        wake_messages(&mut c, &lock, "w:1").len(),
        1,
        "{:?}",
        wake_messages(&mut c, &lock, "w:1")
    );
    match pop(&mut c, &lock, "w:1") {
        Some(Wake::Grant {
            attempt: 2, token, ..
        }) => assert_eq!(Some(token), tw),
        other => panic!("expected the grant, got {other:?}"),
    }
}

/// status.lua: the queue listing has every waiter in arrival order, with its arrival time and
/// its meta.
#[test]
fn the_status_lists_the_queue_in_order_with_owners_times_and_metas() {
    let (_server, mut c, lock) = start("status-queue");
    take(&mut c, &lock, "h:1", 1);
    for (owner, attempt, meta) in [
        ("a:1", 2, "ha|1|a"),
        ("b:1", 3, "hb|2|b"),
        ("c:1", 4, "hc|3|c"),
    ] {
        queued(
            lock.acquire(owner, attempt, LEASE, Mode::Wait, meta)
                .run(&mut c)
                .unwrap(),
        );
        thread::sleep(Duration::from_millis(2));
    }
    let s = lock.status().run(&mut c).unwrap();
    assert_eq!(s.owner, "h:1");
    let listed: Vec<(&str, &str)> = s
        .queue
        .iter()
        .map(|(o, _, m)| (o.as_str(), m.as_str()))
        .collect();
    assert_eq!(
        listed,
        [("a:1", "ha|1|a"), ("b:1", "hb|2|b"), ("c:1", "hc|3|c")]
    );
    let times: Vec<i64> = s.queue.iter().map(|(_, t, _)| *t).collect();
    assert!(
        times[0] > 0 && times[0] < times[1] && times[1] < times[2],
        "arrival times {times:?}"
    );
    assert!(
        (times[0] / 1000 - s.server_ms).abs() < 60_000,
        "an arrival time in us near the server's clock: {times:?}, {} ms",
        s.server_ms
    );
}

/// common.lua, expected_type: another program's data of another type at one of the lock's keys
/// is refused with a message naming the type fairlock keeps there.
#[test]
fn a_foreign_keys_refusal_names_the_type_fairlock_expects() {
    for (i, expects) in [(0, "a hash"), (1, "a string"), (2, "a zset"), (3, "a hash")] {
        let (_server, mut c, lock) = start(&format!("foreign-type-{i}"));
        let key = lock.key_names()[i];
        if i >= 2 {
            // the queue and waiters are read once someone waits
            take(&mut c, &lock, "h:1", 1);
        }
        // a list where fairlock keeps a string; a string elsewhere
        if i == 1 {
            let _: () = redis::cmd("RPUSH").arg(key).arg("x").query(&mut c).unwrap();
        } else {
            let _: () = redis::cmd("SET").arg(key).arg("x").query(&mut c).unwrap();
        }
        let r = lock.acquire("a:1", 2, LEASE, Mode::Wait, "m").run(&mut c);
        match r {
            Err(Error::ForeignData { detail, .. }) => assert!(
                detail.contains(&format!("fairlock expects {expects}")),
                "key {i}: {detail}"
            ),
            other => panic!("key {i}: expected a refusal, got {other:?}"),
        }
    }
}

/// heartbeat.lua, 3.: with no queue (its key lost) the waiters hash goes too, even when the
/// heartbeat names none of its waiters.
#[test]
fn a_heartbeat_drops_the_waiters_hash_of_a_lost_queue() {
    let (_server, mut c, lock) = start("orphaned-waiters");
    take(&mut c, &lock, "h:1", 1);
    enqueue(&mut c, &lock, "w:1", 2);
    enqueue(&mut c, &lock, "x:1", 3);
    let [_, _, queue_key, waiters_key] = lock.key_names();
    let _: () = redis::cmd("DEL").arg(queue_key).query(&mut c).unwrap();
    let hb = lock
        .heartbeat(std::iter::empty::<(&str, u64)>())
        .run(&mut c)
        .unwrap();
    assert!(hb.told_to_retry.is_empty());
    let left: i64 = redis::cmd("EXISTS").arg(waiters_key).query(&mut c).unwrap();
    assert_eq!(left, 0, "the waiters hash outlived its queue");
}

/// status.lua: a free lock (here a released one, whose hash keeps its last token for the
/// fence) is reported with no holder: no owner, count, token, lease left, start, meta or lease;
/// only the fence names the last token.
#[test]
fn the_status_of_a_released_lock_reports_no_holder() {
    let (_server, mut c, lock) = start("status-free");
    let t = take(&mut c, &lock, "h:1", 1);
    lock.release("h:1", t, 1).run(&mut c).unwrap();
    let s = lock.status().run(&mut c).unwrap();
    assert_eq!(
        (
            s.owner.as_str(),
            s.count,
            s.token,
            s.pttl_ms,
            s.since_ms,
            s.meta.as_str(),
            s.lease_ms
        ),
        ("", 0, 0, 0, 0, "", 0),
        "{s:?}"
    );
    assert_eq!(s.fence, t);
    assert!(s.queue.is_empty());
}

/// A wake list of another type is refused by name too, as a list (common.lua's
/// `expected_type` falls through to the wake lists, which are named after their client).
#[test]
fn a_foreign_wake_list_is_refused_as_a_list() {
    let (_server, mut c, lock) = start("foreign-wake-type");
    take(&mut c, &lock, "h:1", 1);
    let _: () = redis::cmd("SET")
        .arg(lock.wake_key("a:1"))
        .arg("x")
        .query(&mut c)
        .unwrap();
    match lock.acquire("a:1", 2, LEASE, Mode::Wait, "m").run(&mut c) {
        Err(Error::ForeignData { detail, .. }) => {
            assert!(detail.contains("fairlock expects a list"), "{detail}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// leave.lua: a leave that asks for no mark (every acquire request of the attempt was
/// answered) leaves none, even when it passes on a hand-off it was granted: the marks are
/// written only when a copy may still arrive (docs/design.md's key table).
#[test]
fn a_leave_that_asks_no_mark_leaves_none() {
    let (_server, mut c, lock) = start("no-mark");
    let th = take(&mut c, &lock, "h:1", 1);
    enqueue(&mut c, &lock, "t:1", 2);
    enqueue(&mut c, &lock, "x:1", 3);
    lock.release("h:1", th, 1).run(&mut c).unwrap();
    assert_eq!(holder(&mut c, &lock).0.as_deref(), Some("t:1"));
    // t gives up before popping its hand-off: passed on to x, no mark asked
    lock.leave("t:1", 2, LeaveMode::Pass, LateAcquire::Impossible)
        .run(&mut c)
        .unwrap();
    assert_eq!(holder(&mut c, &lock).0.as_deref(), Some("x:1"));
    let marks: bool = redis::cmd("EXISTS")
        .arg(format!("{}:left", lock.key_names()[0]))
        .query(&mut c)
        .unwrap();
    assert!(!marks, "a leave that asked for no mark left one");
}

/// A late copy of an acquire whose attempt already left (its mark says so), arriving while
/// the thread still has an older hold nobody keeps: the copy does nothing for its own attempt,
/// but the orphaned hold is passed on at once to the queue's head, with its wake-up, not left
/// free for the next heartbeat to notice.
#[test]
fn a_stale_acquire_passes_the_threads_orphaned_hold_to_the_head_at_once() {
    let (_server, mut c, lock) = start("stale-orphan");
    take(&mut c, &lock, "job:1", 1);
    enqueue(&mut c, &lock, "other:1", 2);
    // attempt 3 of job:1 left (with a mark) before its acquire arrived
    lock.leave("job:1", 3, LeaveMode::Pass, LateAcquire::Possible)
        .run(&mut c)
        .unwrap();
    assert_eq!(holder(&mut c, &lock).0.as_deref(), Some("job:1"));
    let late = lock
        .acquire("job:1", 3, LEASE, Mode::Wait, "m")
        .run(&mut c)
        .unwrap();
    assert!(matches!(late, Acquire::Stale), "{late:?}");
    assert_eq!(holder(&mut c, &lock).0.as_deref(), Some("other:1"));
    assert!(queue(&mut c, &lock).is_empty());
    assert!(
        matches!(pop(&mut c, &lock, "other:1"), Some(Wake::Grant { .. })),
        "the head is told of its grant"
    );
}

/// A force-unlock naming a hold that is gone still repairs a stranded lock (free, waiters
/// queued): the head is granted in that call, with its wake-up, not at the next heartbeat.
#[test]
fn a_force_unlock_that_finds_its_hold_gone_hands_a_stranded_lock_to_the_head() {
    let (_server, mut c, lock) = start("force-stranded");
    let token = take(&mut c, &lock, "h:1", 1);
    enqueue(&mut c, &lock, "w:1", 2);
    expire_hold(&mut c, &lock);
    assert_eq!(holder(&mut c, &lock), (None, None));
    let reply = lock.force_unlock("h:1", token).run(&mut c).unwrap();
    assert!(
        matches!(reply, ForceUnlock::NotHeld { holder: None }),
        "{reply:?}"
    );
    assert_eq!(holder(&mut c, &lock).0.as_deref(), Some("w:1"));
    assert!(
        matches!(pop(&mut c, &lock, "w:1"), Some(Wake::Grant { .. })),
        "the head is told of its grant"
    );
}

/// A command the server refuses in the middle of a script (here a write under `maxmemory`
/// with `noeviction`) comes back as the server's own error, code and message (OOM), which the
/// client can tell from a fault of the script itself.
#[test]
fn a_servers_refusal_inside_a_script_comes_back_as_its_own_error() {
    let (_server, mut c, _) = start("refused-inside");
    // EVAL: a function that may write is refused before it runs; a script, at its first write
    let lock = RawLock::new(
        "fairlock",
        "refused-inside",
        Settings {
            waiter_timeout: WAITER_TIMEOUT,
            runner: Runner::Eval,
            ..Settings::default()
        },
    )
    .unwrap();
    let token = take(&mut c, &lock, "h:1", 1);
    enqueue(&mut c, &lock, "w:1", 2);
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(1)
        .query(&mut c)
        .unwrap();
    // refused by a plain write (redis.call), by the first write of a grant (the grantee's
    // wake-up, through redis.pcall), and in a heartbeat
    let errors = [
        lock.release("h:1", token, 1)
            .run(&mut c)
            .map(|r| format!("{r:?}")),
        lock.acquire("x:1", 3, LEASE, Mode::Wait, "m")
            .run(&mut c)
            .map(|r| format!("{r:?}")),
        lock.heartbeat([("gone:1", 5)])
            .run(&mut c)
            .map(|r| format!("{r:?}")),
    ];
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(0)
        .query(&mut c)
        .unwrap();
    for r in errors {
        let text = r.unwrap_err().to_string();
        assert!(
            text.contains("OOM") && !text.contains("fairlock script"),
            "{text}"
        );
    }
}

/// A heartbeat keeps a queue's keys for another queue TTL, however long its waiters have
/// waited: the queue and the waiters hash live only as long as someone still waits.
#[test]
fn a_heartbeat_keeps_the_queue_and_the_waiters_for_another_queue_ttl() {
    let (_server, mut c, lock) = start("queue-ttl");
    take(&mut c, &lock, "h:1", 1);
    enqueue(&mut c, &lock, "w:1", 2);
    let names = lock.key_names();
    for key in [names[2], names[3]] {
        let _: () = redis::cmd("PEXPIRE")
            .arg(key)
            .arg(5_000)
            .query(&mut c)
            .unwrap();
    }
    lock.heartbeat([("w:1", 2)]).run(&mut c).unwrap();
    for key in [names[2], names[3]] {
        let left: i64 = redis::cmd("PTTL").arg(key).query(&mut c).unwrap();
        assert!(left > 60_000, "{key}: {left} ms left after a heartbeat");
    }
}

/// A granted waiter that leaves anyway (its deadline passed as the grant came), asking for a
/// mark: the grant is passed on, and a late copy of its acquire finds the mark and does nothing,
/// rather than taking the lock for an attempt that has ended.
#[test]
fn a_granted_attempt_that_leaves_with_a_mark_is_not_revived_by_a_late_acquire() {
    let (_server, mut c, lock) = start("granted-leaves");
    let token = take(&mut c, &lock, "h:1", 1);
    enqueue(&mut c, &lock, "w:1", 2);
    lock.release("h:1", token, 1).run(&mut c).unwrap();
    assert_eq!(holder(&mut c, &lock).0.as_deref(), Some("w:1"));
    let left = lock
        .leave("w:1", 2, LeaveMode::Pass, LateAcquire::Possible)
        .run(&mut c)
        .unwrap();
    assert!(matches!(left, Leave::Passed { next: None }), "{left:?}");
    assert_eq!(holder(&mut c, &lock), (None, None));
    let late = lock
        .acquire("w:1", 2, LEASE, Mode::Wait, "m")
        .run(&mut c)
        .unwrap();
    assert!(matches!(late, Acquire::Stale), "{late:?}");
    assert_eq!(holder(&mut c, &lock), (None, None));
}

/// A fault of a script itself (a Lua error: here an attempt that is not a number, which no
/// client sends) comes back as `ERR fairlock script: <the Lua error>`, never dressed as one of
/// the server's refusals, which the client would take for a failover or a refused write.
#[test]
fn a_scripts_own_lua_error_comes_back_as_a_script_fault() {
    let (_server, mut c, lock) = start("lua-fault");
    let acquire = raw::scripts()
        .into_iter()
        .find(|s| s.name() == "acquire")
        .unwrap();
    let mut eval = redis::cmd("EVAL");
    eval.arg(acquire.code()).arg(4);
    for key in lock.key_names() {
        eval.arg(key);
    }
    eval.arg(3_600_000)
        .arg(3_000)
        .arg("o:1")
        .arg("not a number")
        .arg(30_000)
        .arg("wait")
        .arg("m")
        .arg("");
    let err = eval.query::<redis::Value>(&mut c).unwrap_err();
    assert_eq!(err.code(), Some("ERR"), "{err}");
    assert!(
        err.detail()
            .is_some_and(|d| d.starts_with("fairlock script: ")),
        "{err}"
    );
}

/// A forward step of the server clock cannot revoke an unpopped hand-off early: its deadline
/// (wdl) is on the lock hash's virtual clock, which a step advances by at most a third of the
/// waiter timeout (common.lua, "Time"). Here a 10 s step (16 waiter timeouts) right after the
/// grant; other clients' heartbeats and try_locks run at once, and the grantee still holds and
/// pops its grant (semaphore_protocol has the semaphore's twin).
#[test]
fn a_forward_server_clock_step_does_not_revoke_an_unpopped_hand_off() {
    let mut server = faketime::FakeClockRedis::start();
    let mut c = server.conn();
    let lock = raw_lock(&mut c, "handoff-stepped");
    let th = take(&mut c, &lock, "h:1", 1);
    enqueue(&mut c, &lock, "w:1", 2);
    enqueue(&mut c, &lock, "x:1", 3);
    lock.release("h:1", th, 1).run(&mut c).unwrap();
    let (_, tw) = holder(&mut c, &lock);
    server.set_offset_ms(10_000);
    for _ in 0..3 {
        let hb = lock.heartbeat([("x:1", 3)]).run(&mut c).unwrap();
        assert_eq!(hb.repairs, 0, "the hand-off was revoked after the step");
        let r = lock
            .acquire("cron:1", 9, LEASE, Mode::Try, "m")
            .run(&mut c)
            .unwrap();
        assert!(matches!(r, Acquire::Busy { .. }), "{r:?}");
    }
    assert_eq!(holder(&mut c, &lock), (Some("w:1".into()), tw));
    match pop(&mut c, &lock, "w:1") {
        Some(Wake::Grant {
            attempt: 2,
            token: t,
            ..
        }) => assert_eq!(Some(t), tw),
        other => panic!("the grantee's hand-off is gone: {other:?}"),
    }
}

/// common.lua's `token_value`: a stored fence of 16 digits at or above 2^53 is no token either.
/// It passes the length check, but it is not exact in Lua's numbers: the next token would be the
/// fence itself (2^53 + 1 rounds to 2^53), so tokens would stop rising. Refused and left as it
/// was, like the other strings that are no token.
#[test]
fn a_fence_of_sixteen_digits_from_two_to_the_53_on_is_refused() {
    let server = RedisServer::start();
    let mut c = server.conn();
    for (i, v) in ["9007199254740992", "9999999999999999"]
        .into_iter()
        .enumerate()
    {
        let lock = raw_lock(&mut c, &format!("fence-2p53-{i}"));
        let fence = lock.key_names()[1];
        let _: () = redis::cmd("SET").arg(fence).arg(v).query(&mut c).unwrap();
        let r = lock.acquire("a:1", 1, LEASE, Mode::Wait, "m").run(&mut c);
        assert!(
            matches!(r, Err(Error::ForeignData { .. })),
            "fence {v:?}: {r:?}"
        );
        let after: String = redis::cmd("GET").arg(fence).query(&mut c).unwrap();
        assert_eq!(after, v);
        assert_eq!(holder(&mut c, &lock), (None, None), "fence {v:?}");
    }
}

/// status.lua reads the fence (a lock whose hash is gone reports the last token from it): a
/// string there that is not a fairlock token is another program's, and the status says so
/// instead of reporting the fence as gone.
#[test]
fn the_status_refuses_a_fence_that_is_not_a_token() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let lock = raw_lock(&mut c, "status-foreign-fence");
    let fence = lock.key_names()[1];
    let _: () = redis::cmd("SET")
        .arg(fence)
        .arg("not-a-token")
        .query(&mut c)
        .unwrap();
    let r = lock.status().run(&mut c);
    assert!(matches!(r, Err(Error::ForeignData { .. })), "{r:?}");
    let after: String = redis::cmd("GET").arg(fence).query(&mut c).unwrap();
    assert_eq!(after, "not-a-token");
}

/// leave.lua: a leave that asks for no mark never touches the marks' key, a key the scripts do
/// not declare (common.lua, "Undeclared keys"). Where that key cannot be reached (a Cluster slot
/// migrating, an ACL, an offering that checks declared keys) the waiter still leaves, its place
/// gone; a leave that asks for a mark is refused there before it writes anything.
#[test]
fn a_leave_that_asks_no_mark_works_where_the_marks_cannot_be_reached() {
    let server = RedisServer::start();
    let mut admin = server.conn();
    let name = "no-mark-reach";
    let lock = raw_lock(&mut admin, name);
    take(&mut admin, &lock, "h:1", 1);
    enqueue(&mut admin, &lock, "t:1", 2);
    enqueue(&mut admin, &lock, "x:1", 3);
    // both leavers' wake lists can be reached, the marks cannot: only the marks refuse the
    // marking leave, which must find that out before it writes
    let mut c = declared_keys_only(&server, name, &[":wake:t", ":wake:x"]);
    let r = lock
        .leave("t:1", 2, LeaveMode::Pass, LateAcquire::Impossible)
        .run(&mut c);
    assert_eq!(r.unwrap(), Leave::Left);
    assert_eq!(queue(&mut admin, &lock), ["x:1"]);
    let r = lock
        .leave("x:1", 3, LeaveMode::Pass, LateAcquire::Possible)
        .run(&mut c);
    assert!(r.is_err(), "a marking leave with the marks refused: {r:?}");
    assert_eq!(queue(&mut admin, &lock), ["x:1"]);
}

/// release.lua: an outermost release that asks for a left mark touches the marks' key (not
/// declared) before its first write. Where that key cannot be reached it is refused with the
/// lock still held, never after freeing it: the holder's guard then still owns a hold it can
/// release without a mark, or that runs out.
#[test]
fn a_marking_release_where_the_marks_cannot_be_reached_is_refused_before_it_frees_the_lock() {
    let server = RedisServer::start();
    let mut admin = server.conn();
    let name = "mark-release-reach";
    let lock = raw_lock(&mut admin, name);
    let th = take(&mut admin, &lock, "h:1", 1);
    let mut c = declared_keys_only(&server, name, &[":wake:h"]);
    let r = lock.release_marking("h:1", th, 1, 1).run(&mut c);
    assert!(
        r.is_err(),
        "a marking release with the marks refused: {r:?}"
    );
    assert_eq!(holder(&mut admin, &lock), (Some("h:1".into()), Some(th)));
    let r = lock.release("h:1", th, 1).run(&mut c);
    assert!(r.is_ok(), "a release without a mark: {r:?}");
    assert_eq!(holder(&mut admin, &lock), (None, None));
}

/// state.lua's `dequeue`, with the queue's front already read in the script: a waiters entry left
/// without its place (its queue key was lost) goes alone; it is never taken for the queue's last
/// entry, which would delete the live head's entry with it (and an empty front would let the
/// caller take the lock ahead of that head). Reached here by a thread's newer attempt that passes
/// on its orphaned older hold while the head's wake list cannot be reached (the grant is not
/// made, the lock is left free with its queue), then drops its own orphaned entry of a middle
/// attempt: it queues behind the head, and the head, still queued, gets the lock from the next
/// heartbeat that reaches its wake list.
#[test]
fn an_entry_left_without_its_place_goes_alone_and_the_head_keeps_its_own() {
    let server = RedisServer::start();
    let mut admin = server.conn();
    let name = "orphan-entry";
    let lock = raw_lock(&mut admin, name);
    take(&mut admin, &lock, "o:1", 1);
    // the thread's attempt 2 queues behind its own leaked hold
    queued(
        lock.acquire_behind_leaked_hold("o:1", 2, LEASE, Mode::Wait, "m")
            .run(&mut admin)
            .unwrap(),
    );
    // the queue key is lost (evicted): o's waiters entry stays without its place
    let _: () = redis::cmd("DEL")
        .arg(lock.key_names()[2])
        .query(&mut admin)
        .unwrap();
    enqueue(&mut admin, &lock, "x:1", 1);
    assert_eq!(queue(&mut admin, &lock), ["x:1"]);
    // attempt 3 (the leaked hold given up as lost) runs where x's wake list cannot be reached
    let mut c = declared_keys_only(&server, name, &[":left", ":wake:o"]);
    let r = lock
        .acquire("o:1", 3, LEASE, Mode::Wait, "m")
        .run(&mut c)
        .unwrap();
    assert!(
        matches!(r, Acquire::Queued { .. }),
        "the caller went ahead of the live head x: {r:?}"
    );
    assert_eq!(queue(&mut admin, &lock), ["x:1", "o:1"]);
    assert_eq!(holder(&mut admin, &lock), (None, None));
    let hb = lock.heartbeat([("x:1", 1)]).run(&mut admin).unwrap();
    assert!(
        hb.told_to_retry.is_empty(),
        "the head's entry went with the orphan: {hb:?}"
    );
    assert_eq!(holder(&mut admin, &lock).0.as_deref(), Some("x:1"));
    assert_eq!(queue(&mut admin, &lock), ["o:1"]);
}
