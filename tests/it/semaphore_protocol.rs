//! The semaphore's scripts (`src/raw/lua/sem*.lua`) against a real redis-server,
//! through the raw layer (`fairlock::raw::RawSemaphore`, as the function library): capacity, weighted FIFO without overtaking, the read/write shape, expiry,
//! repeats and capacity mismatch; and a seeded random driver that checks, after every step, that
//! the permits held never exceed the capacity and that `~used` is their sum.

use crate::support;

use std::collections::HashMap;
use std::thread;
use std::time::Duration;

use crate::support::RedisServer;
use fairlock::raw::{
    Mode, RawSemaphore, SemAcquire, SemCapacity, SemKind, SemLeave, SemRelease, Settings,
    RW_CAPACITY,
};

const WAITER_TTL: u64 = 3_000;
const RW_MAX: u64 = RW_CAPACITY;

struct Sem {
    name: String,
    kind: SemKind,
    raw: RawSemaphore,
    keys: Vec<String>,
}

#[derive(Debug, PartialEq)]
enum Reply {
    Granted(u64),
    Queued,
    Busy,
    Stale,
    Mismatch,
}

fn settings() -> Settings {
    Settings {
        fence_ttl: Duration::from_secs(3600),
        waiter_timeout: Duration::from_millis(WAITER_TTL),
        ..Settings::default()
    }
}

impl Sem {
    fn new(name: &str, kind: &'static str, cap: u64) -> Sem {
        let kind = if kind == "rw" {
            SemKind::ReadWrite
        } else {
            SemKind::Semaphore
        };
        let raw = RawSemaphore::new("fairlock", name, kind, cap, settings()).unwrap();
        let keys = raw.key_names().iter().map(|k| k.to_string()).collect();
        Sem {
            name: name.into(),
            kind,
            raw,
            keys,
        }
    }

    fn acquire(
        &self,
        c: &mut redis::Connection,
        owner: &str,
        attempt: u64,
        permits: u64,
        lease_ms: u64,
        wait: bool,
    ) -> Reply {
        self.acquire_with(&self.raw, c, owner, attempt, permits, lease_ms, wait)
    }

    #[allow(clippy::too_many_arguments)]
    fn acquire_as(
        &self,
        c: &mut redis::Connection,
        owner: &str,
        attempt: u64,
        permits: u64,
        lease_ms: u64,
        wait: bool,
        cap: u64,
    ) -> Reply {
        let raw = RawSemaphore::new("fairlock", &self.name, self.kind, cap, settings()).unwrap();
        self.acquire_with(&raw, c, owner, attempt, permits, lease_ms, wait)
    }

    #[allow(clippy::too_many_arguments)]
    fn acquire_with(
        &self,
        raw: &RawSemaphore,
        c: &mut redis::Connection,
        owner: &str,
        attempt: u64,
        permits: u64,
        lease_ms: u64,
        wait: bool,
    ) -> Reply {
        let mode = if wait { Mode::Wait } else { Mode::Try };
        let lease = Duration::from_millis(lease_ms);
        match raw
            .acquire(owner, attempt, permits, lease, mode, "host|1|t")
            .run(c)
            .expect("sem_acquire")
        {
            SemAcquire::Granted { token, .. } => Reply::Granted(token),
            SemAcquire::Queued { .. } => Reply::Queued,
            SemAcquire::Busy { .. } => Reply::Busy,
            SemAcquire::Stale => Reply::Stale,
            SemAcquire::Mismatch { .. } => Reply::Mismatch,
        }
    }

    fn release(&self, c: &mut redis::Connection, owner: &str, attempt: u64, token: u64) -> bool {
        self.release_marking(c, owner, attempt, token, false)
    }

    /// A release that leaves a left mark when `mark` (a copy of the acquire may still arrive).
    fn release_marking(
        &self,
        c: &mut redis::Connection,
        owner: &str,
        attempt: u64,
        token: u64,
        mark: bool,
    ) -> bool {
        let r = self.raw.release(owner, attempt, token, mark).run(c);
        matches!(r.expect("sem_release"), SemRelease::Released { .. })
    }

    fn renew(&self, c: &mut redis::Connection, owner: &str, attempt: u64, token: u64) -> bool {
        let lease = Duration::from_secs(60);
        self.raw
            .renew(owner, attempt, token, lease)
            .run(c)
            .expect("sem_renew")
    }

    fn leave(&self, c: &mut redis::Connection, owner: &str, attempt: u64) {
        self.leave_marking(c, owner, attempt, false);
    }

    fn leave_marking(&self, c: &mut redis::Connection, owner: &str, attempt: u64, mark: bool) {
        self.raw
            .leave(owner, attempt, mark, false)
            .run(c)
            .expect("sem_leave");
    }

    fn heartbeat(&self, c: &mut redis::Connection, waiting: &[(&str, u64)]) {
        self.raw
            .heartbeat(waiting.iter().copied())
            .run(c)
            .expect("sem_heartbeat");
    }

    /// The grant waiting in `owner`'s wake list for `attempt`, if any (popped).
    fn pop_grant(&self, c: &mut redis::Connection, owner: &str, attempt: u64) -> Option<u64> {
        let (_, thread) = owner.rsplit_once(':').unwrap();
        let list = self.raw.wake_key(owner);
        let msgs: Vec<String> = redis::cmd("LRANGE")
            .arg(&list)
            .arg(0)
            .arg(-1)
            .query(c)
            .unwrap();
        let prefix = format!("{thread}|g|{attempt}|");
        let msg = msgs.iter().find(|m| m.starts_with(&prefix))?;
        let _: () = redis::cmd("LREM")
            .arg(&list)
            .arg(1)
            .arg(msg)
            .query(c)
            .unwrap();
        msg[prefix.len()..].split('|').next()?.parse().ok()
    }

    /// Holds in Redis: hold id -> permits; and the stored `~used`.
    fn holds(&self, c: &mut redis::Connection) -> (HashMap<String, u64>, u64) {
        let all: HashMap<String, String> =
            redis::cmd("HGETALL").arg(&self.keys[0]).query(c).unwrap();
        let mut holds = HashMap::new();
        for (f, v) in &all {
            if !f.starts_with('~') {
                let permits = v.split('|').nth(1).unwrap().parse().unwrap();
                holds.insert(f.clone(), permits);
            }
        }
        let used = all.get("~used").map_or(0, |u| u.parse().unwrap());
        (holds, used)
    }
}

fn granted(r: Reply) -> u64 {
    match r {
        Reply::Granted(t) => t,
        other => panic!("expected a grant, got {other:?}"),
    }
}

#[test]
fn permits_up_to_capacity_then_a_fifo_queue_served_on_release() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let sem = Sem::new("cap", "sem", 2);
    let ta = granted(sem.acquire(&mut c, "a:1", 1, 1, 30_000, true));
    let tb = granted(sem.acquire(&mut c, "b:1", 1, 1, 30_000, true));
    assert!(tb > ta);
    assert_eq!(
        sem.acquire(&mut c, "c:1", 1, 1, 30_000, true),
        Reply::Queued
    );
    assert_eq!(sem.acquire(&mut c, "d:1", 1, 1, 30_000, false), Reply::Busy);
    assert_eq!(sem.holds(&mut c).1, 2);
    assert!(sem.release(&mut c, "a:1", 1, ta));
    let tc = sem.pop_grant(&mut c, "c:1", 1).expect("c was granted");
    assert!(tc > tb);
    assert_eq!(sem.holds(&mut c).1, 2);
    // a repeat of c's acquire finds its hold
    assert_eq!(
        sem.acquire(&mut c, "c:1", 1, 1, 30_000, true),
        Reply::Granted(tc)
    );
    // a repeated release reports success from its receipt and frees nothing more
    assert!(sem.release(&mut c, "a:1", 1, ta));
    assert_eq!(sem.holds(&mut c).1, 2);
}

#[test]
fn a_large_request_at_the_head_is_not_overtaken_by_smaller_ones() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let sem = Sem::new("weights", "sem", 4);
    let ta = granted(sem.acquire(&mut c, "a:1", 1, 3, 30_000, true));
    assert_eq!(
        sem.acquire(&mut c, "b:1", 1, 2, 30_000, true),
        Reply::Queued
    );
    // one permit is free, but b (two) is ahead: c queues, and try_acquire is busy
    assert_eq!(
        sem.acquire(&mut c, "c:1", 1, 1, 30_000, true),
        Reply::Queued
    );
    assert_eq!(sem.acquire(&mut c, "d:1", 1, 1, 30_000, false), Reply::Busy);
    assert!(sem.release(&mut c, "a:1", 1, ta));
    // both fit now, and are granted in arrival order in one release
    let tb = sem.pop_grant(&mut c, "b:1", 1).expect("b");
    let tc = sem.pop_grant(&mut c, "c:1", 1).expect("c");
    assert!(tc > tb && tb > ta);
    assert_eq!(sem.holds(&mut c).1, 3);
}

#[test]
fn a_writer_at_the_head_blocks_later_readers_and_readers_together_are_admitted_together() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let rw = Sem::new("rw", "rw", RW_MAX);
    let r1 = granted(rw.acquire(&mut c, "r1:1", 1, 1, 30_000, true));
    let r2 = granted(rw.acquire(&mut c, "r2:1", 1, 1, 30_000, true));
    assert_eq!(
        rw.acquire(&mut c, "w:1", 1, RW_MAX, 30_000, true),
        Reply::Queued
    );
    assert_eq!(
        rw.acquire(&mut c, "r3:1", 1, 1, 30_000, true),
        Reply::Queued
    );
    assert_eq!(
        rw.acquire(&mut c, "r4:1", 1, 1, 30_000, true),
        Reply::Queued
    );
    assert!(rw.release(&mut c, "r1:1", 1, r1));
    assert_eq!(
        rw.pop_grant(&mut c, "w:1", 1),
        None,
        "the writer while a reader holds"
    );
    assert!(rw.release(&mut c, "r2:1", 1, r2));
    let tw = rw.pop_grant(&mut c, "w:1", 1).expect("the writer, alone");
    assert_eq!(
        rw.pop_grant(&mut c, "r3:1", 1),
        None,
        "a reader beside the writer"
    );
    assert!(rw.release(&mut c, "w:1", 1, tw));
    assert!(rw.pop_grant(&mut c, "r3:1", 1).is_some());
    assert!(
        rw.pop_grant(&mut c, "r4:1", 1).is_some(),
        "readers together"
    );
}

#[test]
fn a_crashed_holders_permits_come_back_after_its_lease_and_go_to_the_head() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let sem = Sem::new("expiry", "sem", 1);
    granted(sem.acquire(&mut c, "dead:1", 1, 1, 200, true));
    assert_eq!(
        sem.acquire(&mut c, "b:1", 1, 1, 30_000, true),
        Reply::Queued
    );
    thread::sleep(Duration::from_millis(300));
    sem.heartbeat(&mut c, &[("b:1", 1)]);
    assert!(sem.pop_grant(&mut c, "b:1", 1).is_some());
    assert_eq!(sem.holds(&mut c).1, 1);
}

#[test]
fn clients_that_disagree_on_capacity_or_kind_are_told() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let sem = Sem::new("mismatch", "sem", 3);
    granted(sem.acquire(&mut c, "a:1", 1, 1, 30_000, true));
    assert_eq!(
        sem.acquire_as(&mut c, "b:1", 1, 1, 30_000, true, 4),
        Reply::Mismatch
    );
    let rw = Sem::new("mismatch", "rw", 3);
    assert_eq!(
        rw.acquire(&mut c, "b:1", 1, 1, 30_000, true),
        Reply::Mismatch
    );
}

#[test]
fn a_waiter_that_leaves_after_its_grant_gives_the_permits_on() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let sem = Sem::new("leave", "sem", 1);
    let ta = granted(sem.acquire(&mut c, "a:1", 1, 1, 30_000, true));
    assert_eq!(
        sem.acquire(&mut c, "b:1", 1, 1, 30_000, true),
        Reply::Queued
    );
    assert_eq!(
        sem.acquire(&mut c, "c:1", 1, 1, 30_000, true),
        Reply::Queued
    );
    assert!(sem.release(&mut c, "a:1", 1, ta));
    // b gave up just as it was granted: its hold is passed on to c
    sem.leave(&mut c, "b:1", 1);
    assert!(sem.pop_grant(&mut c, "c:1", 1).is_some());
    assert_eq!(sem.holds(&mut c).1, 1);
}

#[test]
fn a_grantee_that_never_pops_its_hand_off_loses_it_after_the_waiter_timeout() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let sem = Sem::new("dead-grantee", "sem", 1);
    let ta = granted(sem.acquire(&mut c, "a:1", 1, 1, 30_000, true));
    assert_eq!(
        sem.acquire(&mut c, "dead:1", 1, 1, 30_000, true),
        Reply::Queued
    );
    assert_eq!(
        sem.acquire(&mut c, "c:1", 1, 1, 30_000, true),
        Reply::Queued
    );
    assert!(sem.release(&mut c, "a:1", 1, ta));
    // "dead" was granted and never pops it, nor heartbeats; c does
    let deadline = std::time::Instant::now() + Duration::from_millis(WAITER_TTL * 3);
    let tc = loop {
        sem.heartbeat(&mut c, &[("c:1", 1)]);
        if let Some(t) = sem.pop_grant(&mut c, "c:1", 1) {
            break t;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "c not served within three waiter timeouts"
        );
        thread::sleep(Duration::from_millis(100));
    };
    assert!(tc > ta);
    let (holds, used) = sem.holds(&mut c);
    assert_eq!((holds.len(), used), (1, 1), "{holds:?}");
    assert!(holds.contains_key("c:1#1"));
    // a live grantee that heartbeats keeps its hand-off past the waiter timeout
    assert_eq!(
        sem.acquire(&mut c, "slow:1", 1, 1, 30_000, true),
        Reply::Queued
    );
    assert!(sem.release(&mut c, "c:1", 1, tc));
    for _ in 0..((WAITER_TTL * 3 / 2) / 200) {
        sem.heartbeat(&mut c, &[("slow:1", 1)]);
        thread::sleep(Duration::from_millis(200));
    }
    assert!(
        sem.pop_grant(&mut c, "slow:1", 1).is_some(),
        "a live grantee's hand-off revoked"
    );
}

/// A semaphore of one held by `a`, `g` and then `c` queued, and `a`'s release, which grants `g`
/// (its hand-off waits in g's wake list). Returns a's token.
fn hand_off_to_g_with_c_behind(sem: &Sem, c: &mut redis::Connection) -> u64 {
    let ta = granted(sem.acquire(c, "a:1", 1, 1, 30_000, true));
    for owner in ["g:1", "c:1"] {
        assert_eq!(sem.acquire(c, owner, 1, 1, 30_000, true), Reply::Queued);
    }
    assert!(sem.release(c, "a:1", 1, ta));
    ta
}

/// sem_acquire.lua: a grantee that learns of its grant from its own acquire's reply (a retry,
/// its hand-off never popped: the waker drops the wake-up) has its hand-off confirmed there, so
/// the grant is never revoked as an unpopped one once the waiter timeout has passed. (With the
/// confirmation's `zrem` of the hand-off planted out, the heartbeats of the waiter behind it
/// revoke the hold.)
#[test]
fn a_grant_learned_of_from_the_acquires_reply_is_never_revoked_as_unpopped() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let sem = Sem::new("reply-grantee", "sem", 1);
    let ta = hand_off_to_g_with_c_behind(&sem, &mut c);
    // g asks again (its pop failed) and is told of the grant by the reply; it never pops
    let tg = granted(sem.acquire(&mut c, "g:1", 1, 1, 30_000, true));
    assert!(tg > ta);
    // c heartbeats for one and a half waiter timeouts: every heartbeat looks for dead grantees
    for _ in 0..((WAITER_TTL * 3 / 2) / 200) {
        sem.heartbeat(&mut c, &[("c:1", 1)]);
        thread::sleep(Duration::from_millis(200));
    }
    let (holds, used) = sem.holds(&mut c);
    assert!(
        holds.contains_key("g:1#1") && used == 1,
        "the grant g learned of from its reply was revoked: {holds:?}"
    );
    assert_eq!(sem.pop_grant(&mut c, "c:1", 1), None, "c served beside g");
}

/// sem_heartbeat.lua: a heartbeat that tells a grant again (its wake-up gone: popped by a
/// thread that took the hold, or lost) confirms the hand-off there: the copy it pushes lives a
/// waiter timeout and nobody pops it, and the hand-off's deadline (a waiter timeout from the
/// grant) passes first, so an unconfirmed hand-off would be revoked as unpopped. (With that
/// `zrem` planted out, the waiter behind takes the permit.)
#[test]
fn a_late_heartbeat_that_tells_a_taken_grant_again_never_gets_it_revoked() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let sem = Sem::new("told-again", "sem", 1);
    let ta = hand_off_to_g_with_c_behind(&sem, &mut c);
    let tg = sem.pop_grant(&mut c, "g:1", 1).expect("g granted");
    assert!(tg > ta);
    // g's thread holds the permit; half a waiter timeout later a heartbeat naming its attempt
    // arrives (late), then only c's come, for two waiter timeouts
    let beats = WAITER_TTL / 200;
    for i in 0..beats * 5 / 2 {
        if i == beats / 2 {
            sem.heartbeat(&mut c, &[("g:1", 1), ("c:1", 1)]);
        } else {
            sem.heartbeat(&mut c, &[("c:1", 1)]);
        }
        thread::sleep(Duration::from_millis(200));
    }
    let (holds, used) = sem.holds(&mut c);
    assert!(
        holds.contains_key("g:1#1") && used == 1,
        "the grant g took was revoked: {holds:?}"
    );
}

/// sem_heartbeat.lua: a hand-off entry whose hold went with an evicted hash is dropped by the
/// first heartbeat that names its attempt, not kept until its deadline: the hand-offs zset holds
/// only entries of holds that exist (its size bound, sem.lua's header). (With that `zrem` planted
/// out, the entry stays for a waiter timeout.)
#[test]
fn a_heartbeat_drops_the_hand_off_entry_of_a_hold_lost_with_its_hash() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let sem = Sem::new("stale-handoff", "sem", 1);
    hand_off_to_g_with_c_behind(&sem, &mut c);
    let handoffs = sem.keys.iter().find(|k| k.ends_with(":handoffs")).unwrap();
    let pending: Option<f64> = redis::cmd("ZSCORE")
        .arg(handoffs)
        .arg("g:1#1")
        .query(&mut c)
        .unwrap();
    assert!(pending.is_some(), "no hand-off to g pending");
    // the hash, with g's hold in it, is evicted; g's client heartbeats its attempt
    let _: () = redis::cmd("DEL").arg(&sem.keys[0]).query(&mut c).unwrap();
    sem.heartbeat(&mut c, &[("g:1", 1), ("c:1", 1)]);
    let left: Vec<String> = redis::cmd("ZRANGE")
        .arg(handoffs)
        .arg(0)
        .arg(-1)
        .query(&mut c)
        .unwrap();
    assert!(
        !left.iter().any(|id| id == "g:1#1"),
        "the hand-off of a hold lost with its hash is still recorded: {left:?}"
    );
}

/// A client of semaphore `name` (capacity `cap`) whose waiters time out after 60 s, against
/// the short WAITER_TTL of [`settings`].
fn long_timeout_client(name: &str, cap: u64) -> RawSemaphore {
    let settings = Settings {
        waiter_timeout: Duration::from_secs(60),
        ..settings()
    };
    RawSemaphore::new("fairlock", name, SemKind::Semaphore, cap, settings).unwrap()
}

/// The server clock steps 10 s forward and a long-timeout client (`long`) asks for a permit
/// before `s:1`, a short-timeout grantee, pops its grant: s must keep its hold and its wake-up,
/// and the newcomer queue.
fn s_keeps_its_grant_after_a_forward_step(
    server: &mut support::faketime::FakeClockRedis,
    c: &mut redis::Connection,
    sem: &Sem,
    long: &RawSemaphore,
) {
    server.set_offset_ms(10_000);
    let x = sem.acquire_with(long, c, "x:1", 1, 1, 3_600_000, true);
    let (holds, _) = sem.holds(c);
    assert!(
        holds.contains_key("s:1#1"),
        "the live short-timeout grantee's grant was revoked after the step: {holds:?} (x: {x:?})"
    );
    assert_eq!(x, Reply::Queued);
    assert!(sem.pop_grant(c, "s:1", 1).is_some(), "s's wake-up is gone");
}

/// state.lua, new_handoff: a grant to a short-timeout waiter stores the hand-off clock's cap as
/// that waiter's (a third of its timeout), not the granting client's; so after a forward step of
/// the server clock, a long-timeout client's next script moves the hand-off clock on by the short
/// cap only, and the live grantee, which has not popped its grant yet, keeps it. (With the cap
/// left at the caller's, planted, that script revokes the grant.)
#[test]
fn a_forward_clock_step_does_not_revoke_a_short_timeout_grantee_through_a_long_timeout_client() {
    let mut server = support::faketime::FakeClockRedis::start();
    let mut c = server.conn();
    let long = long_timeout_client("cap-stored", 1);
    let sem = Sem::new("cap-stored", "sem", 1);
    let Reply::Granted(th) = sem.acquire_with(&long, &mut c, "h:1", 1, 1, 3_600_000, true) else {
        panic!("h not granted");
    };
    // s waits with the short timeout (WAITER_TTL); the long-timeout holder's release grants it
    assert_eq!(
        sem.acquire(&mut c, "s:1", 1, 1, 3_600_000, true),
        Reply::Queued
    );
    let released = long.release("h:1", 1, th, false).run(&mut c).unwrap();
    assert!(
        matches!(released, SemRelease::Released { .. }),
        "{released:?}"
    );
    s_keeps_its_grant_after_a_forward_step(&mut server, &mut c, &sem, &long);
}

/// state.lua, new_handoff: while another hand-off may still be pending, a grant never raises the
/// hand-off clock's cap: a short-timeout grantee that has not popped its grant yet keeps the short
/// cap when a long-timeout waiter, queued after the waiters hash (and its cap) went, is granted
/// after it, so a long-timeout client's script after a forward step of the server clock moves
/// the clock on by the short cap only. (With the cap
/// raised anyway, planted, that script revokes the short-timeout grantee's live grant.)
#[test]
fn a_later_grant_to_a_long_timeout_waiter_keeps_the_short_cap_of_a_pending_hand_off() {
    let mut server = support::faketime::FakeClockRedis::start();
    let mut c = server.conn();
    let long = long_timeout_client("cap-pending", 2);
    let sem = Sem::new("cap-pending", "sem", 2);
    let hour = 3_600_000;
    let th = granted(sem.acquire_with(&long, &mut c, "h:1", 1, 1, hour, true));
    let tz = granted(sem.acquire_with(&long, &mut c, "z:1", 1, 1, hour, true));
    let release = |c: &mut redis::Connection, owner: &str, token: u64| {
        let released = long.release(owner, 1, token, false).run(c).unwrap();
        assert!(
            matches!(released, SemRelease::Released { .. }),
            "{released:?}"
        );
    };
    // s waits with the short timeout (WAITER_TTL); h's release grants it, and its hand-off
    // waits unpopped. The queue is empty then, and its waiters hash goes with it, short cap
    // and all
    assert_eq!(sem.acquire(&mut c, "s:1", 1, 1, hour, true), Reply::Queued);
    release(&mut c, "h:1", th);
    // l queues with the long timeout (a new waiters hash, with the long cap), and z's release
    // grants it while s's hand-off still waits
    assert_eq!(
        sem.acquire_with(&long, &mut c, "l:1", 1, 1, hour, true),
        Reply::Queued
    );
    release(&mut c, "z:1", tz);
    let (holds, _) = sem.holds(&mut c);
    assert!(
        holds.contains_key("s:1#1") && holds.contains_key("l:1#1"),
        "{holds:?}"
    );
    s_keeps_its_grant_after_a_forward_step(&mut server, &mut c, &sem, &long);
}

/// sem.lua, sem_pending: a run that removed hand-offs its view of the zset did not count asks
/// Redis whether one is still pending, rather than taking its view's zero for "none". Here one
/// heartbeat revokes two dead grantees (the view read two entries) while a third, live grantee's
/// hand-off still waits, and grants a long-timeout waiter: the cap stays the short one. (With the
/// view's answer taken, planted, the cap goes up, and after a forward step of the server clock a
/// long-timeout client's script revokes the live short-timeout grantee's grant.)
#[test]
fn a_run_that_revoked_two_hand_offs_still_sees_the_third_pending() {
    let mut server = support::faketime::FakeClockRedis::start();
    let mut c = server.conn();
    let long = long_timeout_client("pending-after-revoke", 3);
    let sem = Sem::new("pending-after-revoke", "sem", 3);
    let hour = 3_600_000;
    let th = granted(sem.acquire_with(&long, &mut c, "h:1", 1, 3, hour, true));
    // a, b and s wait with the short timeout; h's release grants all three, whose hand-offs
    // wait unpopped, and the empty queue takes the waiters hash (and its short cap) with it
    for owner in ["a:1", "b:1", "s:1"] {
        assert_eq!(sem.acquire(&mut c, owner, 1, 1, hour, true), Reply::Queued);
    }
    let released = long.release("h:1", 1, th, false).run(&mut c).unwrap();
    assert!(
        matches!(released, SemRelease::Released { .. }),
        "{released:?}"
    );
    // l queues with the long timeout (a new waiters hash, with the long cap) for two permits
    assert_eq!(
        sem.acquire_with(&long, &mut c, "l:1", 1, 2, hour, true),
        Reply::Queued
    );
    // a and b never heartbeat; l's client (long timeout) and then s's do, every half second.
    // Once a's and b's deadlines have passed, l's heartbeat revokes both in one run (its view
    // of the hand-offs read those two) and grants l
    let deadline = std::time::Instant::now() + Duration::from_millis(WAITER_TTL * 3);
    loop {
        long.heartbeat([("l:1", 1)])
            .run(&mut c)
            .expect("sem_heartbeat");
        sem.heartbeat(&mut c, &[("s:1", 1)]);
        let (holds, _) = sem.holds(&mut c);
        if holds.contains_key("l:1#1") {
            assert!(
                !holds.contains_key("a:1#1") && !holds.contains_key("b:1#1"),
                "{holds:?}"
            );
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "l not granted within three waiter timeouts: {holds:?}"
        );
        thread::sleep(Duration::from_millis(500));
    }
    s_keeps_its_grant_after_a_forward_step(&mut server, &mut c, &sem, &long);
}

/// Found by the random driver's longer run (seed 20262701, a ghost hold): a thread's hold ran
/// out, and a late copy of the same attempt's acquire took permits again with a new token; the
/// thread's release (with the old token, asking for a mark) left them held with no guard behind
/// them. Such a hold of the released attempt now goes with the release, as the mutex's does.
#[test]
fn a_marking_release_frees_a_late_copys_hold_of_its_own_attempt() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let sem = Sem::new("own-ghost", "sem", 1);
    let first = granted(sem.acquire(&mut c, "a:1", 1, 1, 50, true));
    thread::sleep(Duration::from_millis(100));
    // the copy, sent with the first and delivered late, after the lease ran out
    let copy = granted(sem.acquire(&mut c, "a:1", 1, 1, 30_000, true));
    assert!(copy > first);
    // the thread releases the hold it knows of; its acquire was sent twice: it asks for a mark
    assert!(!sem.release_marking(&mut c, "a:1", 1, first, true));
    let (holds, used) = sem.holds(&mut c);
    assert_eq!(
        (holds.len(), used),
        (0, 0),
        "the copy's hold stayed: {holds:?}"
    );
    assert_eq!(sem.acquire(&mut c, "a:1", 1, 1, 30_000, true), Reply::Stale);
}

/// A seeded random driver: owners acquire (try or wait, 1-3 permits), pop their grants,
/// release, renew, leave and heartbeat, with short leases running out now and then; a quarter of
/// the acquires are sent twice, the copy arriving at a random later step (the attempt's release
/// or leave then asks for a left mark, as the mutex's client does). After every step: the
/// permits of the holds in Redis never exceed the capacity, `~used` is their sum, and every hold
/// belongs to its owner's attempt under way (no ghost hold from a late copy).
#[test]
fn random_steps_never_exceed_capacity_nor_leave_a_ghost_hold() {
    let server = RedisServer::start();
    let mut c = server.conn();
    // longer runs: FAIRLOCK_SEM_ROUNDS (default 6 rounds of 400 steps), FAIRLOCK_SEM_SEED
    let env = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let rounds = env("FAIRLOCK_SEM_ROUNDS", 6);
    let mut seed: u64 = env("FAIRLOCK_SEM_SEED", 0x5eed_2026).max(1);
    eprintln!("semaphore driver: seed {seed}, {rounds} rounds of 400 steps");
    let mut next = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    #[derive(Clone, Copy)]
    struct Owner {
        attempt: u64,
        waiting: bool,
        held: Option<u64>,
        /// a copy of this attempt's acquire may still arrive
        copied: bool,
    }
    let mut copies_sent = 0;
    for round in 0..rounds {
        let cap = 1 + round % 4;
        let sem = Sem::new(&format!("random{round}"), "sem", cap);
        let owners: Vec<String> = (0..5).map(|i| format!("o{i}:1")).collect();
        let mut state: HashMap<String, Owner> = owners
            .iter()
            .map(|o| {
                let idle = Owner {
                    attempt: 0,
                    waiting: false,
                    held: None,
                    copied: false,
                };
                (o.clone(), idle)
            })
            .collect();
        // copies on their way: (owner, attempt, permits, lease, wait)
        let mut in_flight: Vec<(String, u64, u64, u64, bool)> = vec![];
        for _ in 0..400 {
            if !in_flight.is_empty() && next(6) == 0 {
                let (o, a, permits, lease, wait) =
                    in_flight.swap_remove(next(in_flight.len() as u64) as usize);
                sem.acquire(&mut c, &o, a, permits, lease, wait);
                copies_sent += 1;
            }
            let o = owners[next(5) as usize].clone();
            let me = state[&o];
            let end = |st: &mut HashMap<String, Owner>| {
                st.insert(
                    o.clone(),
                    Owner {
                        waiting: false,
                        held: None,
                        copied: false,
                        ..me
                    },
                );
            };
            match (next(6), me.held, me.waiting) {
                (0 | 1, None, false) => {
                    let a = me.attempt + 1;
                    let permits = 1 + next(cap.min(3));
                    let lease = if next(4) == 0 { 50 } else { 30_000 };
                    let wait = next(3) > 0;
                    let copied = next(4) == 0;
                    if copied {
                        in_flight.push((o.clone(), a, permits, lease, wait));
                    }
                    let (waiting, held) = match sem.acquire(&mut c, &o, a, permits, lease, wait) {
                        Reply::Granted(t) => (false, Some(t)),
                        Reply::Queued => (true, None),
                        _ => (false, None),
                    };
                    // a try that was refused has ended: its copy must do nothing either
                    if copied && !waiting && held.is_none() {
                        sem.leave_marking(&mut c, &o, a, true);
                    }
                    state.insert(
                        o.clone(),
                        Owner {
                            attempt: a,
                            waiting,
                            held,
                            copied,
                        },
                    );
                }
                (_, None, true) => {
                    if let Some(t) = sem.pop_grant(&mut c, &o, me.attempt) {
                        state.insert(
                            o.clone(),
                            Owner {
                                waiting: false,
                                held: Some(t),
                                ..me
                            },
                        );
                    } else if next(5) == 0 {
                        sem.leave_marking(&mut c, &o, me.attempt, me.copied);
                        end(&mut state);
                    } else {
                        sem.heartbeat(&mut c, &[(&o, me.attempt)]);
                    }
                }
                (2, Some(t), _) => {
                    sem.renew(&mut c, &o, me.attempt, t);
                }
                (_, Some(t), _) => {
                    sem.release_marking(&mut c, &o, me.attempt, t, me.copied);
                    end(&mut state);
                }
                _ => thread::sleep(Duration::from_millis(next(30))),
            }
            let (holds, used) = sem.holds(&mut c);
            let sum: u64 = holds.values().sum();
            assert!(sum <= cap, "{sum} permits held of {cap}: {holds:?}");
            assert_eq!(used, sum, "~used {used} but the holds sum to {sum}");
            for id in holds.keys() {
                let (owner, attempt) = id.rsplit_once('#').unwrap();
                let st = state[owner];
                let attempt: u64 = attempt.parse().unwrap();
                assert!(
                    st.attempt == attempt && (st.waiting || st.held.is_some()),
                    "a ghost hold {id}: its owner is at attempt {} (waiting {}, held {:?})",
                    st.attempt,
                    st.waiting,
                    st.held
                );
            }
        }
    }
    assert!(copies_sent > 50, "only {copies_sent} late copies delivered");
}

/// A thread may hold a permit of one attempt while it waits with another. A late copy of the held
/// attempt's acquire must not take the wake-up of the newer attempt's grant with it (the thread
/// would never pop it, and the permit would sit unused for a lease).
#[test]
fn a_late_copy_of_a_held_attempts_acquire_keeps_the_wake_up_of_the_threads_newer_grant() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let sem = Sem::new("late-copy-wake", "sem", 2);
    let t5 = granted(sem.acquire(&mut c, "t:1", 5, 1, 60_000, true));
    let other = granted(sem.acquire(&mut c, "o:1", 1, 1, 60_000, true));
    // the thread waits for a second permit with attempt 9, granted on the other's release
    assert_eq!(
        sem.acquire(&mut c, "t:1", 9, 1, 60_000, true),
        Reply::Queued
    );
    assert!(sem.release(&mut c, "o:1", 1, other));
    // the late copy of attempt 5's acquire: it finds hold 5 (and says so to nobody)
    assert_eq!(
        sem.acquire(&mut c, "t:1", 5, 1, 60_000, true),
        Reply::Granted(t5)
    );
    assert!(
        sem.pop_grant(&mut c, "t:1", 9).is_some(),
        "the grant of attempt 9 lost its wake-up"
    );
}

/// After a capacity change, a waiter whose handle has the old capacity and that runs its acquire
/// again (to confirm a hand-off, after a dropped connection) gets the hold it was granted, not a
/// mismatch; and a queued one keeps its place.
#[test]
fn after_a_capacity_change_a_granted_or_queued_attempt_asking_again_keeps_what_it_has() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let sem = Sem::new("cap-confirm", "sem", 1);
    let held = granted(sem.acquire(&mut c, "h:1", 1, 1, 60_000, true));
    assert_eq!(
        sem.acquire(&mut c, "a:1", 1, 1, 60_000, true),
        Reply::Queued
    );
    assert_eq!(
        sem.acquire(&mut c, "b:1", 1, 1, 60_000, true),
        Reply::Queued
    );
    // an operator raises the capacity to 2: a is granted; b still waits (1 + 1 held of 2)
    let two =
        RawSemaphore::new("fairlock", "cap-confirm", SemKind::Semaphore, 2, settings()).unwrap();
    two.set_capacity(2).run(&mut c).unwrap();
    let a = sem
        .pop_grant(&mut c, "a:1", 1)
        .expect("a granted by the raise");
    // a asks again with its handle of capacity 1: its hold, not a mismatch
    assert_eq!(
        sem.acquire(&mut c, "a:1", 1, 1, 60_000, true),
        Reply::Granted(a)
    );
    // b asks again too: it keeps its place
    assert_eq!(
        sem.acquire(&mut c, "b:1", 1, 1, 60_000, true),
        Reply::Queued
    );
    // a new attempt with the old capacity is refused
    assert_eq!(
        sem.acquire(&mut c, "n:1", 1, 1, 60_000, true),
        Reply::Mismatch
    );
    assert!(sem.release(&mut c, "h:1", 1, held));
    assert!(
        sem.pop_grant(&mut c, "b:1", 1).is_some(),
        "b served in its place"
    );
}

/// A forced release of a hold its holder gave back already reports that it released nothing (a
/// receipt answers only the holder's own retry).
#[test]
fn a_forced_release_after_the_holders_own_release_released_nothing() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let sem = Sem::new("forced-after", "sem", 1);
    let t = granted(sem.acquire(&mut c, "h:1", 1, 1, 60_000, true));
    assert!(sem.release(&mut c, "h:1", 1, t));
    let forced = sem.raw.force_release("h:1", 1, t).run(&mut c).unwrap();
    assert_eq!(forced, SemRelease::NotHeld);
    // the holder's own retry still finds its receipt
    assert!(sem.release(&mut c, "h:1", 1, t));
}

/// On the semaphore, as on the lock: a repeated acquire of a grantee whose hand-off waits unpopped
/// (its reply going to no one) used to drop the wake-up, so the grantee waited a lease for a
/// message that was gone. The wake-up stays for the waiter; the hand-off is confirmed, so a hold
/// that reply reports (it may be the one the client reads) is never revoked as unpopped.
#[test]
fn a_repeated_acquire_during_a_pending_hand_off_keeps_the_grantees_wake_up() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let s = Sem::new("dup-handoff", "sem", 1);
    let th = granted(s.acquire(&mut c, "h:1", 1, 1, 60_000, true));
    assert_eq!(s.acquire(&mut c, "t:1", 5, 1, 60_000, true), Reply::Queued);
    assert_eq!(s.acquire(&mut c, "x:1", 1, 1, 60_000, true), Reply::Queued);
    assert!(s.release(&mut c, "h:1", 1, th));
    // the repeated copy of t's acquire arrives before t pops its hand-off
    let tt = granted(s.acquire(&mut c, "t:1", 5, 1, 60_000, true));
    // nobody pops it for a while: x heartbeats past t's hand-off deadline, and t keeps the hold
    // (the reply may have been the one t's client read)
    thread::sleep(Duration::from_millis(WAITER_TTL + 500));
    s.heartbeat(&mut c, &[("x:1", 1)]);
    let (holds, used) = s.holds(&mut c);
    assert_eq!(used, 1);
    assert!(holds.contains_key("t:1#5"), "{holds:?}");
    // and the waiter, if that reply went to no one, still finds its hand-off
    assert_eq!(
        s.pop_grant(&mut c, "t:1", 5),
        Some(tt),
        "t's hand-off was dropped by the repeat"
    );
}

/// Found by the fuzzer's wake-up judge: a late copy of an old attempt's acquire (an unseen
/// duplicate, which nothing marks) that arrives while the thread's newer attempt has a hand-off
/// waiting queued a ghost place and, as a new place does, dropped every wake-up of the thread:
/// the newer grant's too, which its waiter then never saw.
#[test]
fn a_late_copy_of_an_older_attempt_keeps_the_newer_attempts_hand_off() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let s = Sem::new("late-old", "sem", 1);
    let th = granted(s.acquire(&mut c, "h:1", 1, 1, 60_000, true));
    assert_eq!(s.acquire(&mut c, "t:1", 9, 1, 60_000, true), Reply::Queued);
    assert!(s.release(&mut c, "h:1", 1, th));
    // t's attempt 9 is granted, its wake-up waits; a copy of t's attempt 4 arrives now
    s.acquire(&mut c, "t:1", 4, 1, 60_000, true);
    assert!(
        s.pop_grant(&mut c, "t:1", 9).is_some(),
        "the late copy of attempt 4 dropped attempt 9's hand-off"
    );
}

/// The TTL of `key` in ms.
fn pttl(c: &mut redis::Connection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query(c).unwrap()
}

/// A cut to 2 tells a waiter that wants 4 (made with capacity 5) to retry. If the holders give
/// their permits back before its retry runs, the name is idle for an instant: the retry must still
/// be refused (CapacityMismatch, as `set_capacity` promises), not store capacity 5 again and take 4
/// permits. The capacity set stays stored (with the fence's TTL): an old handle's new attempt is
/// refused too, the status shows 2, and the operator's handle takes 2 permits and no more.
#[test]
fn a_waiter_turned_away_by_a_capacity_cut_is_refused_even_if_the_holders_left_before_its_retry() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let sem = Sem::new("cut", "sem", 5);
    let a = granted(sem.acquire(&mut c, "a:1", 1, 5, 30_000, true));
    assert_eq!(
        sem.acquire(&mut c, "b:1", 2, 4, 30_000, true),
        Reply::Queued
    );
    let two = RawSemaphore::new("fairlock", "cut", SemKind::Semaphore, 2, settings()).unwrap();
    assert_eq!(
        two.set_capacity(2).run(&mut c).unwrap(),
        SemCapacity::Set { grants: 0 }
    );
    let told: Vec<String> = redis::cmd("LRANGE")
        .arg(sem.raw.wake_key("b:1"))
        .arg(0)
        .arg(-1)
        .query(&mut c)
        .unwrap();
    assert_eq!(told, ["1|r|2"], "b is told to retry");
    assert!(sem.release(&mut c, "a:1", 1, a));
    // b's client runs its acquire again (same attempt, its handle of capacity 5)
    assert_eq!(
        sem.acquire(&mut c, "b:1", 2, 4, 30_000, true),
        Reply::Mismatch,
        "the waiter the cut turned away took its permits with the old capacity"
    );
    // a repeat of that request (a lost reply) is refused the same
    assert_eq!(
        sem.acquire(&mut c, "b:1", 2, 4, 30_000, true),
        Reply::Mismatch
    );
    // and so is a new attempt through an old handle, though nobody holds or waits
    assert_eq!(
        sem.acquire(&mut c, "n:1", 1, 1, 30_000, false),
        Reply::Mismatch
    );
    let st = two.status().run(&mut c).unwrap();
    assert_eq!(
        (
            st.kind.as_str(),
            st.capacity,
            st.used,
            st.holds.len(),
            st.waiters.len()
        ),
        ("sem", Some(2), 0, 0, 0)
    );
    // the operator's handle: 2 permits, no more
    granted(sem.acquire_as(&mut c, "o:1", 1, 2, 30_000, false, 2));
    assert_eq!(
        sem.acquire_as(&mut c, "p:1", 1, 1, 30_000, false, 2),
        Reply::Busy
    );
    // the stored capacity lives as long as the fence (fence_ttl: one hour here), no longer
    let ttl = pttl(&mut c, &sem.keys[0]);
    assert!(ttl > 3_500_000 && ttl <= 3_600_000, "{ttl}");
}

/// A capacity set on a name nobody uses is stored too (with the fence's TTL), so the next
/// handle of another capacity or kind is refused, and one of that capacity is served.
#[test]
fn a_capacity_set_on_an_unused_name_is_stored_and_binds_the_next_handles() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let one = Sem::new("fresh", "sem", 1);
    let three = RawSemaphore::new("fairlock", "fresh", SemKind::Semaphore, 3, settings()).unwrap();
    assert_eq!(
        three.set_capacity(3).run(&mut c).unwrap(),
        SemCapacity::Set { grants: 0 }
    );
    let st = three.status().run(&mut c).unwrap();
    assert_eq!(
        (st.kind.as_str(), st.capacity, st.used),
        ("sem", Some(3), 0)
    );
    assert_eq!(
        one.acquire(&mut c, "a:1", 1, 1, 30_000, false),
        Reply::Mismatch
    );
    let rw = Sem::new("fresh", "rw", RW_MAX);
    assert_eq!(
        rw.acquire(&mut c, "a:1", 2, 1, 30_000, false),
        Reply::Mismatch
    );
    granted(one.acquire_as(&mut c, "a:1", 3, 3, 30_000, false, 3));
    let ttl = pttl(&mut c, &one.keys[0]);
    assert!(ttl > 3_500_000 && ttl <= 3_600_000, "{ttl}");
}

/// The semaphore's side of
/// `protocol::a_heartbeat_tells_a_waiting_attempt_the_lock_its_own_repeat_took`: a waiting
/// attempt that holds permits with no wake-up pending and no hand-off to confirm (a repeat of its
/// acquire took them with a reply nobody read) is told by its client's next heartbeat.
#[test]
fn a_heartbeat_tells_a_waiting_attempt_the_permits_its_own_repeat_took() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let s = Sem::new("dup-fast", "sem", 1);
    let th = granted(s.acquire(&mut c, "h:1", 1, 1, 60_000, true));
    assert_eq!(s.acquire(&mut c, "t:1", 3, 1, 60_000, true), Reply::Queued);
    assert!(s.release(&mut c, "h:1", 1, th));
    // the repeat confirms the hand-off; its wake-up is then lost (an eviction of the list)
    let token = granted(s.acquire(&mut c, "t:1", 3, 1, 60_000, true));
    let _: () = redis::cmd("DEL")
        .arg(s.raw.wake_key("t:1"))
        .query(&mut c)
        .unwrap();
    // told once, however many heartbeats come before the waker pops it
    s.heartbeat(&mut c, &[("t:1", 3)]);
    s.heartbeat(&mut c, &[("t:1", 3)]);
    assert_eq!(
        s.pop_grant(&mut c, "t:1", 3),
        Some(token),
        "the heartbeat did not tell the waiter of its permits"
    );
    assert_eq!(s.pop_grant(&mut c, "t:1", 3), None, "told twice");
}

/// Before, an operator's forced release of a hold that was still a pending hand-off (its wake-up
/// not popped yet) freed the permits and granted them on, but left the grant's wake-up in the
/// grantee's list: popped later, it was judged a fresh grant, and two threads held the one permit
/// by their own estimates. The mutex's force-unlock drops the owner's wake-ups; so does the
/// semaphore's now.
#[test]
fn a_forced_release_of_a_pending_hand_off_takes_its_wake_up_too() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let s = Sem::new("force-pending", "sem", 1);
    let ta = granted(s.acquire(&mut c, "a:1", 1, 1, 60_000, true));
    assert_eq!(s.acquire(&mut c, "b:1", 1, 1, 60_000, true), Reply::Queued);
    assert_eq!(s.acquire(&mut c, "c:1", 1, 1, 60_000, true), Reply::Queued);
    assert!(s.release(&mut c, "a:1", 1, ta));
    let (holds, _) = s.holds(&mut c);
    assert!(holds.contains_key("b:1#1"), "{holds:?}");
    let all: HashMap<String, String> = redis::cmd("HGETALL").arg(&s.keys[0]).query(&mut c).unwrap();
    let tb: u64 = all["b:1#1"].split('|').next().unwrap().parse().unwrap();
    let forced = s.raw.force_release("b:1", 1, tb).run(&mut c).unwrap();
    assert!(matches!(forced, SemRelease::Released { .. }), "{forced:?}");
    let (holds, _) = s.holds(&mut c);
    assert!(holds.contains_key("c:1#1"), "{holds:?}");
    assert_eq!(
        s.pop_grant(&mut c, "b:1", 1),
        None,
        "b can still pop the grant the operator released"
    );
}

/// The lock's foreign-data generator (`protocol::foreign_data_of_any_kind_...`) for the
/// semaphore's scripts, which had none: every script, in every state of a semaphore, against
/// another program's data of another type, or of fairlock's own type but not fairlock's, at each
/// of the semaphore's keys that the state leaves unused. A script either refuses (`ForeignData`)
/// or succeeds, and the foreign key is left exactly as it was (its value and that it has no
/// TTL).
#[test]
fn foreign_data_at_any_semaphore_key_in_any_state_is_refused_or_left_untouched() {
    use fairlock::Error;
    let server = RedisServer::start();
    let mut c = server.conn();
    type Foreign = (&'static str, &'static [&'static str]);
    let hash: Foreign = ("hash", &["HSET", "user", "alice"]);
    let string: Foreign = ("string", &["SET", "x"]);
    let zset: Foreign = ("zset", &["ZADD", "1", "job-a"]);
    let list: Foreign = ("list", &["RPUSH", "hello"]);
    // a zset whose members are not due yet (expiry, which checks the due ones, does not see it)
    let later: Foreign = ("zset due later", &["ZADD", "99999999999999", "job-b"]);
    // (key index in key_names, or 6: the caller's wake list, 7: the waiter's, 8: the left marks)
    let kinds: [(usize, Vec<Foreign>); 9] = [
        (0, vec![hash, string]),
        (1, vec![("1e20", &["SET", "1e20"]), hash]),
        (2, vec![zset, list]),
        (3, vec![hash, string]),
        (4, vec![zset, later, hash]),
        (5, vec![zset, later, string]),
        (6, vec![list, string]),
        (7, vec![list, hash]),
        (8, vec![hash, zset]),
    ];
    let states = ["free", "held", "queued", "handed-off"];
    let mut runs = 0;
    for (s, state) in states.iter().enumerate() {
        for (k, values) in &kinds {
            for (v, (what, write)) in values.iter().enumerate() {
                for call in 0..11 {
                    let sem = Sem::new(&format!("sfd-{s}-{k}-{v}-{call}"), "sem", 1);
                    let mut th = 0;
                    if *state != "free" {
                        th = granted(sem.acquire(&mut c, "h:1", 1, 1, 60_000, true));
                    }
                    if matches!(*state, "queued" | "handed-off") {
                        assert_eq!(
                            sem.acquire(&mut c, "w:1", 2, 1, 60_000, true),
                            Reply::Queued
                        );
                    }
                    if *state == "handed-off" {
                        assert!(sem.release(&mut c, "h:1", 1, th));
                    }
                    let key = match *k {
                        6 => sem.raw.wake_key("me:1"),
                        7 => sem.raw.wake_key("w:1"),
                        8 => format!("{}:left", sem.keys[0]),
                        i => sem.keys[i].clone(),
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
                    let lease = Duration::from_secs(60);
                    let raw = &sem.raw;
                    let r: Result<String, Error> = match call {
                        0 => raw
                            .acquire("me:1", 5, 1, lease, Mode::Try, "m")
                            .run(&mut c)
                            .map(|r| format!("{r:?}")),
                        1 => raw
                            .acquire("me:1", 5, 1, lease, Mode::Wait, "m")
                            .run(&mut c)
                            .map(|r| format!("{r:?}")),
                        2 => raw
                            .release("h:1", 1, th, false)
                            .run(&mut c)
                            .map(|r| format!("{r:?}")),
                        3 => raw
                            .release("h:1", 1, th, true)
                            .run(&mut c)
                            .map(|r| format!("{r:?}")),
                        4 => raw
                            .renew("h:1", 1, th, lease)
                            .run(&mut c)
                            .map(|r| format!("{r:?}")),
                        5 => raw
                            .leave("w:1", 2, true, true)
                            .run(&mut c)
                            .map(|r| format!("{r:?}")),
                        6 => raw
                            .leave("w:1", 2, true, false)
                            .run(&mut c)
                            .map(|r| format!("{r:?}")),
                        7 => raw
                            .heartbeat([("w:1", 2), ("me:1", 5)])
                            .run(&mut c)
                            .map(|r| format!("{r:?}")),
                        8 => raw
                            .force_release("h:1", 1, th)
                            .run(&mut c)
                            .map(|r| format!("{r:?}")),
                        9 => raw.status().run(&mut c).map(|r| format!("{r:?}")),
                        _ => raw.set_capacity(2).run(&mut c).map(|r| format!("{r:?}")),
                    };
                    runs += 1;
                    let context = format!("state {state}, {what} at {key}, call {call}: {r:?}");
                    support::assert_foreign_data_untouched(&mut c, &key, &before, &r, &context);
                    if *state == "free" && r.is_err() && *k != 0 {
                        // on a semaphore nobody uses, the refusal comes before any write
                        let hash: bool = redis::cmd("EXISTS")
                            .arg(&sem.keys[0])
                            .query(&mut c)
                            .unwrap();
                        assert!(!hash, "a refused script wrote the hash first: {context}");
                    }
                    if *state == "free" && matches!(*k, 4 | 5) && call != 9 {
                        // a semaphore nobody uses: its zsets are looked at before any write at
                        // all (sem.lua, read_sem), a heartbeat's wake-ups and a waiter included
                        assert!(r.is_err(), "not refused: {context}");
                        let mut written = vec![sem.keys[2].clone(), sem.keys[3].clone()];
                        written.push(sem.raw.wake_key("me:1"));
                        written.push(sem.raw.wake_key("w:1"));
                        for other in &written {
                            let there: bool =
                                redis::cmd("EXISTS").arg(other).query(&mut c).unwrap();
                            assert!(!there, "a refused script wrote {other} first: {context}");
                        }
                    }
                }
            }
        }
    }
    assert!(runs > 300, "{runs} runs");
}

/// The semaphore's side of `protocol::with_the_undeclared_keys_refused_no_script_leaves_half_a_grant`:
/// run by a user allowed only the six keys the scripts declare (the wake lists and the left
/// marks refused), the grant loop's push of the head's wake-up is refused, and the permits stay
/// free with the queue (no hold without its wake-up); a heartbeat that reaches the lists then
/// grants the head.
#[test]
fn with_the_undeclared_keys_refused_the_grant_loop_leaves_no_half_grant() {
    let server = RedisServer::start();
    let mut admin = server.conn();
    for (i, call) in [
        "release",
        "release marking",
        "force release",
        "leave pass",
        "heartbeat",
    ]
    .iter()
    .enumerate()
    {
        let s = Sem::new(&format!("undeclared-{i}"), "sem", 1);
        let th = granted(s.acquire(&mut admin, "h:1", 1, 1, 60_000, true));
        assert_eq!(
            s.acquire(&mut admin, "x:1", 2, 1, 60_000, true),
            Reply::Queued
        );
        assert_eq!(
            s.acquire(&mut admin, "w:1", 3, 1, 60_000, true),
            Reply::Queued
        );
        let mut c = server.conn_limited_to(&format!("declared{i}"), &s.keys);
        let r = match *call {
            "release" => s
                .raw
                .release("h:1", 1, th, false)
                .run(&mut c)
                .map(|r| format!("{r:?}")),
            "release marking" => s
                .raw
                .release("h:1", 1, th, true)
                .run(&mut c)
                .map(|r| format!("{r:?}")),
            "force release" => s
                .raw
                .force_release("h:1", 1, th)
                .run(&mut c)
                .map(|r| format!("{r:?}")),
            "leave pass" => {
                // the holder gives back with the keys reachable; x leaves, passing on to w
                assert!(s.release(&mut admin, "h:1", 1, th));
                s.raw
                    .leave("x:1", 2, true, false)
                    .run(&mut c)
                    .map(|r| format!("{r:?}"))
            }
            _ => {
                let _: () = redis::cmd("ZADD")
                    .arg(&s.keys[4])
                    .arg(1)
                    .arg("h:1#1")
                    .query(&mut admin)
                    .unwrap(); // h's lease runs out: the heartbeat's grant loop serves x
                s.raw
                    .heartbeat([("x:1", 2), ("w:1", 3)])
                    .run(&mut c)
                    .map(|r| format!("{r:?}"))
            }
        };
        let (holds, _) = s.holds(&mut admin);
        let context = format!("{call}: {r:?}, holds {holds:?}");
        for id in holds.keys().filter(|id| !id.starts_with("h:1#")) {
            let (owner, attempt) = id.split_once('#').unwrap();
            let all: Vec<String> = redis::cmd("LRANGE")
                .arg(s.raw.wake_key(owner))
                .arg(0)
                .arg(-1)
                .query(&mut admin)
                .unwrap();
            let thread = owner.rsplit_once(':').unwrap().1;
            assert!(
                all.iter()
                    .any(|m| m.starts_with(&format!("{thread}|g|{attempt}|"))),
                "{id} holds without its wake-up: {context}"
            );
        }
        // with the lists reachable, a heartbeat serves whoever waits
        s.heartbeat(&mut admin, &[("x:1", 2), ("w:1", 3)]);
        let (holds, used) = s.holds(&mut admin);
        assert_eq!(used, 1, "{context}; then {holds:?}");
    }
}

/// The server's clock (ms).
fn server_ms(c: &mut redis::Connection) -> i64 {
    let (s, us): (i64, i64) = redis::cmd("TIME").query(c).unwrap();
    s * 1000 + us / 1000
}

impl Sem {
    /// The lease end stored for `owner`'s `attempt` (server ms), if any.
    fn lease_end(&self, c: &mut redis::Connection, owner: &str, attempt: u64) -> Option<i64> {
        let score: Option<f64> = redis::cmd("ZSCORE")
            .arg(&self.keys[4])
            .arg(format!("{owner}#{attempt}"))
            .query(c)
            .unwrap();
        score.map(|s| s as i64)
    }
}

/// sem_renew.lua: the live hold's renewal answers 1 and moves its lease end to the lease from
/// now; one with another token or another attempt answers 0 and leaves the lease end alone.
#[test]
fn a_renewal_extends_only_the_hold_it_names() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let sem = Sem::new("renew", "sem", 2);
    let t = granted(sem.acquire(&mut c, "a:1", 1, 1, 30_000, true));
    let end = sem.lease_end(&mut c, "a:1", 1).unwrap();
    assert!(!sem.renew(&mut c, "a:1", 1, t + 1));
    assert!(!sem.renew(&mut c, "a:1", 2, t));
    assert!(!sem.renew(&mut c, "b:1", 1, t));
    assert_eq!(sem.lease_end(&mut c, "a:1", 1), Some(end));
    assert!(sem.renew(&mut c, "a:1", 1, t));
    let left = sem.lease_end(&mut c, "a:1", 1).unwrap() - server_ms(&mut c);
    assert!(
        left > 50_000 && left <= 60_000,
        "the renewal left {left} ms of a 60 s lease"
    );
}

/// sem_renew.lua: a renewal never shortens a lease: after a backward step of the server clock
/// the hold's lease end is further away than the lease, and a renewal leaves it so.
#[test]
fn a_renewal_after_a_backward_clock_step_keeps_the_later_lease_end() {
    let mut server = support::faketime::FakeClockRedis::start();
    let mut c = server.conn();
    let sem = Sem::new("renew-stepped", "sem", 1);
    let t = granted(sem.acquire(&mut c, "a:1", 1, 1, 50_000, true));
    let end = sem.lease_end(&mut c, "a:1", 1).unwrap();
    server.set_offset_ms(-40_000);
    assert!(sem.renew(&mut c, "a:1", 1, t));
    assert_eq!(sem.lease_end(&mut c, "a:1", 1), Some(end));
}

/// sem_acquire.lua: a new attempt of a thread forgets the thread's older queue place: it queues
/// anew, behind the waiters that came between.
#[test]
fn a_newer_attempt_of_a_queued_thread_queues_behind_later_waiters() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let sem = Sem::new("newer-attempt", "sem", 1);
    let th = granted(sem.acquire(&mut c, "h:1", 1, 1, 30_000, true));
    assert_eq!(
        sem.acquire(&mut c, "t:1", 1, 1, 30_000, true),
        Reply::Queued
    );
    assert_eq!(
        sem.acquire(&mut c, "u:1", 1, 1, 30_000, true),
        Reply::Queued
    );
    assert_eq!(
        sem.acquire(&mut c, "t:1", 2, 1, 30_000, true),
        Reply::Queued
    );
    assert!(sem.release(&mut c, "h:1", 1, th));
    assert!(
        sem.pop_grant(&mut c, "u:1", 1).is_some(),
        "u, queued before t's newer attempt, was not served first"
    );
    assert_eq!(sem.pop_grant(&mut c, "t:1", 2), None);
    assert_eq!(sem.pop_grant(&mut c, "t:1", 1), None);
    let (holds, _) = sem.holds(&mut c);
    assert_eq!(holds.keys().collect::<Vec<_>>(), ["u:1#1"]);
}

/// sem_release.lua: a release first expires lapsed holds, so their permits go to the head in
/// that very release (no heartbeat in between), with the releaser's.
#[test]
fn a_release_gives_a_lapsed_holds_permits_to_the_head_at_once() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let sem = Sem::new("release-lapsed", "sem", 2);
    granted(sem.acquire(&mut c, "dead:1", 1, 1, 200, true));
    let tb = granted(sem.acquire(&mut c, "b:1", 1, 1, 30_000, true));
    // the head wants more than the releaser's permits
    assert_eq!(
        sem.acquire(&mut c, "w:1", 1, 2, 30_000, true),
        Reply::Queued
    );
    thread::sleep(Duration::from_millis(350));
    let r = sem.raw.release("b:1", 1, tb, false).run(&mut c).unwrap();
    assert_eq!(r, SemRelease::Released { grants: 1 });
    assert!(sem.pop_grant(&mut c, "w:1", 1).is_some());
    let (holds, used) = sem.holds(&mut c);
    assert_eq!((holds.len(), used), (1, 2), "{holds:?}");
}

/// sem.lua, read_sem: another program's hash at the semaphore's key (no `~` fields of
/// fairlock's) is refused and left as it was.
#[test]
fn another_programs_hash_at_the_semaphores_key_is_refused_and_left_untouched() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let sem = Sem::new("foreign-hash", "sem", 2);
    let _: () = redis::cmd("HSET")
        .arg(&sem.keys[0])
        .arg("user")
        .arg("alice")
        .query(&mut c)
        .unwrap();
    let r = sem
        .raw
        .acquire("a:1", 1, 1, Duration::from_secs(30), Mode::Wait, "m")
        .run(&mut c);
    assert!(
        matches!(r, Err(fairlock::Error::ForeignData { .. })),
        "{r:?}"
    );
    let all: HashMap<String, String> = redis::cmd("HGETALL")
        .arg(&sem.keys[0])
        .query(&mut c)
        .unwrap();
    assert_eq!(
        all,
        HashMap::from([("user".to_string(), "alice".to_string())])
    );
}

/// sem_acquire.lua: a late copy of a held attempt's acquire (answered with its hold) leaves the
/// thread's newer queue place as it is: the newer attempt is still served first.
#[test]
fn a_late_copy_of_a_held_attempts_acquire_keeps_the_threads_newer_queue_place() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let sem = Sem::new("newer-place", "sem", 1);
    let t1 = granted(sem.acquire(&mut c, "t:1", 1, 1, 30_000, true));
    assert_eq!(
        sem.acquire(&mut c, "t:1", 2, 1, 30_000, true),
        Reply::Queued
    );
    assert_eq!(
        sem.acquire(&mut c, "u:1", 1, 1, 30_000, true),
        Reply::Queued
    );
    // the late copy of attempt 1
    assert_eq!(
        sem.acquire(&mut c, "t:1", 1, 1, 30_000, true),
        Reply::Granted(t1)
    );
    assert!(sem.release(&mut c, "t:1", 1, t1));
    assert!(
        sem.pop_grant(&mut c, "t:1", 2).is_some(),
        "the thread's newer place was lost"
    );
    assert_eq!(sem.pop_grant(&mut c, "u:1", 1), None);
}

/// sem_heartbeat.lua: a heartbeat keeps the waiters hash as long as the queue (both for the
/// queue's time to live from now), so a waiter that heartbeats keeps its place however long it
/// waits: here across forward steps of the server clock past that time to live (10 minutes)
/// counted from its queueing.
#[test]
fn a_heartbeating_waiter_keeps_its_place_past_the_queues_time_to_live() {
    let mut server = support::faketime::FakeClockRedis::start();
    let mut c = server.conn();
    let sem = Sem::new("long-wait", "sem", 1);
    let th = granted(sem.acquire(&mut c, "h:1", 1, 1, 3_600_000, true));
    assert_eq!(
        sem.acquire(&mut c, "w:1", 1, 1, 30_000, true),
        Reply::Queued
    );
    for offset in [300_000, 700_000] {
        server.set_offset_ms(offset);
        let hb = sem.raw.heartbeat([("w:1", 1)]).run(&mut c).unwrap();
        assert!(
            hb.told_to_retry.is_empty(),
            "at +{offset} ms the waiter lost its place"
        );
    }
    assert!(sem.release(&mut c, "h:1", 1, th));
    assert!(sem.pop_grant(&mut c, "w:1", 1).is_some());
}

/// The semaphore's twin of the lock's `a_new_place_keeps_the_waiters_hash_for_the_queue_ttl`
/// (the fuzzer's long run, seed 20261153): a new place refreshes both of its keys, the queue and
/// the waiters hash. Before, only the queue: behind a waiter whose client died (nobody
/// heartbeats), the hash kept its first TTL, and a forward step before the new waiter's first
/// heartbeat expired it with the new entry.
#[test]
fn a_new_place_keeps_the_waiters_hash_for_the_queue_ttl() {
    let mut server = support::faketime::FakeClockRedis::start();
    let mut c = server.conn();
    let sem = Sem::new("waiters-ttl", "sem", 1);
    let th = granted(sem.acquire(&mut c, "h:1", 1, 1, 3_600_000, true));
    assert_eq!(
        sem.acquire(&mut c, "dead:1", 1, 1, 30_000, true),
        Reply::Queued
    );
    server.set_offset_ms(7 * 60_000);
    assert_eq!(
        sem.acquire(&mut c, "live:1", 1, 1, 30_000, true),
        Reply::Queued
    );
    server.set_offset_ms(14 * 60_000);
    let hb = sem.raw.heartbeat([("live:1", 1)]).run(&mut c).unwrap();
    assert!(
        hb.told_to_retry.is_empty(),
        "a live waiter lost its place to a 7-minute step: {hb:?}"
    );
    // the dead waiter goes at the head by its deadline; the live one is served
    assert!(sem.release(&mut c, "h:1", 1, th));
    let served = support::eventually(Duration::from_secs(10), || {
        sem.raw.heartbeat([("live:1", 1)]).run(&mut c).unwrap();
        thread::sleep(Duration::from_millis(100));
        sem.pop_grant(&mut c, "live:1", 1).is_some()
    });
    assert!(served, "the live waiter was never served");
}

/// sem_status.lua: the waiters are listed in arrival order with their arrival times (server us),
/// the permits each wants and its meta.
#[test]
fn the_status_lists_the_waiters_in_order_with_times_permits_and_metas() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let sem = Sem::new("status-waiters", "sem", 3);
    granted(sem.acquire(&mut c, "h:1", 1, 3, 30_000, true));
    for (owner, permits) in [("a:1", 1), ("b:1", 3), ("c:1", 2)] {
        assert_eq!(
            sem.acquire(&mut c, owner, 1, permits, 30_000, true),
            Reply::Queued
        );
        thread::sleep(Duration::from_millis(2));
    }
    let s = sem.raw.status().run(&mut c).unwrap();
    let listed: Vec<(&str, u64, &str)> = s
        .waiters
        .iter()
        .map(|w| (w.owner.as_str(), w.permits, w.meta.as_str()))
        .collect();
    assert_eq!(
        listed,
        [
            ("a:1", 1, "host|1|t"),
            ("b:1", 3, "host|1|t"),
            ("c:1", 2, "host|1|t")
        ]
    );
    let times: Vec<u64> = s.waiters.iter().map(|w| w.since_us).collect();
    let now_us = s.server_ms as u64 * 1000;
    assert!(
        times[0] < times[1] && times[1] < times[2] && now_us - times[0] < 60_000_000,
        "arrival times {times:?} at {now_us} us"
    );
}

/// sem_acquire.lua: a capacity stored by a first use (not by `set_capacity`) binds only while
/// anyone holds or waits; a name nobody uses any more takes the capacity of its next
/// acquisition (docs/semaphores.md, "Capacity").
#[test]
fn an_unused_name_takes_the_capacity_of_its_next_acquisition() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let two = Sem::new("next-capacity", "sem", 2);
    let t = granted(two.acquire(&mut c, "a:1", 1, 2, 60_000, false));
    // in use: another capacity is refused
    assert_eq!(
        two.acquire_as(&mut c, "b:1", 1, 1, 60_000, false, 3),
        Reply::Mismatch
    );
    assert!(two.release(&mut c, "a:1", 1, t));
    // unused now: the next acquisition's capacity is taken, and binds in its turn
    granted(two.acquire_as(&mut c, "b:1", 2, 3, 60_000, false, 3));
    assert_eq!(
        two.acquire(&mut c, "c:1", 1, 1, 60_000, false),
        Reply::Mismatch
    );
}

/// sem_renew.lua: a renewal keeps the semaphore's hash (and leases) for the renewed lease, or
/// the hash, with every hold in it, would run out at the first lease's end while its holders
/// count on their renewals.
#[test]
fn a_renewal_keeps_the_semaphores_hash_for_the_renewed_lease() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let s = Sem::new("renew-keeps-hash", "sem", 2);
    let t = granted(s.acquire(&mut c, "a:1", 1, 1, 1_500, false));
    thread::sleep(Duration::from_millis(800));
    assert!(s.renew(&mut c, "a:1", 1, t));
    // renewed for 60 s (`Sem::renew`): the hash and the leases live at least that long
    for key in [&s.keys[0], &s.keys[4]] {
        let ttl: i64 = redis::cmd("PTTL").arg(key).query(&mut c).unwrap();
        assert!(ttl > 50_000, "{key} lives {ttl} ms after a 60 s renewal");
    }
}

/// sem.lua, keep_sem: the leases zset always has a TTL. Here the expiry of a run removes every
/// entry (more than its first read of the zset could count), and the same run's grant creates the
/// zset anew, under a hash whose TTL (the stored capacity's) needs no raise: the new zset gets
/// the hash's TTL all the same, or it would outlive the semaphore with its stale entries.
#[test]
fn a_leases_zset_emptied_and_made_again_in_one_run_gets_a_ttl() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let s = Sem::new("leases-ttl", "sem", 4);
    // the capacity stored: the hash lives the fence's TTL, longer than every lease below
    assert!(matches!(
        s.raw.set_capacity(4).run(&mut c).unwrap(),
        SemCapacity::Set { .. }
    ));
    granted(s.acquire(&mut c, "a:1", 1, 1, 100, false));
    granted(s.acquire(&mut c, "b:1", 1, 1, 100, false));
    granted(s.acquire(&mut c, "d:1", 1, 1, 100, false));
    thread::sleep(Duration::from_millis(300));
    granted(s.acquire(&mut c, "e:1", 1, 1, 2_000, false));
    let ttl = pttl(&mut c, &s.keys[4]);
    assert!(ttl > 0, "the leases zset lives {ttl} ms (-1: for ever)");
    assert!(ttl >= pttl(&mut c, &s.keys[0]) - 1_000);
}

/// sem.lua, keep_sem: the leases zset lives as long as the hash, whatever the run removed from it
/// before it raised the hash's TTL. Here a queueing acquire's expiry removes two of three lease
/// entries (its first read of the zset saw only two), then it keeps the hash for the queue's
/// TTL: the third hold's entry must live as long, or the zset would run out under a hash that
/// still holds that hold (and its permits would come back only through a repair).
#[test]
fn a_queueing_acquire_keeps_the_leases_as_long_as_the_hash_after_an_expiry() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let s = Sem::new("leases-kept", "sem", 3);
    granted(s.acquire(&mut c, "a:1", 1, 1, 100, false));
    granted(s.acquire(&mut c, "b:1", 1, 1, 100, false));
    granted(s.acquire(&mut c, "c:1", 1, 1, 60_000, false));
    thread::sleep(Duration::from_millis(300));
    // a and b ran out; c holds 1 of 3, so d (3 permits) queues, keeping the hash for the queue
    assert!(matches!(
        s.acquire(&mut c, "d:1", 1, 3, 60_000, true),
        Reply::Queued
    ));
    let (hash, leases) = (pttl(&mut c, &s.keys[0]), pttl(&mut c, &s.keys[4]));
    assert!(hash > 120_000, "the hash lives {hash} ms while d waits");
    assert!(
        leases >= hash - 1_000,
        "the leases zset lives {leases} ms, the hash {hash} ms"
    );
}

/// sem.lua, sem_take: the hand-offs zset lives as long as the longest lease granted into it. Here
/// one release grants two heads, a long lease first, then a short one: the record of the first
/// hand-off must outlive the second's lease, or a grantee that died before popping it would no
/// longer be revoked at its deadline and would keep its permits for its whole lease.
#[test]
fn one_release_granting_two_hand_offs_keeps_their_record_for_the_longer_lease() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let s = Sem::new("handoffs-kept", "sem", 2);
    let th = granted(s.acquire(&mut c, "h:1", 1, 2, 60_000, true));
    assert_eq!(s.acquire(&mut c, "x:1", 1, 1, 60_000, true), Reply::Queued);
    assert_eq!(s.acquire(&mut c, "y:1", 1, 1, 1_000, true), Reply::Queued);
    assert!(s.release(&mut c, "h:1", 1, th));
    let (holds, used) = s.holds(&mut c);
    assert_eq!((holds.len(), used), (2, 2), "{holds:?}");
    let ttl = pttl(&mut c, &s.keys[5]);
    assert!(ttl > 50_000, "the hand-offs zset lives {ttl} ms");
}

/// sem_status.lua: every hold is listed with its id, token, permits, lease left, lease and meta.
#[test]
fn the_status_lists_every_hold_with_its_token_permits_and_lease() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let s = Sem::new("status-holds", "sem", 4);
    let ta = granted(s.acquire(&mut c, "a:1", 1, 1, 30_000, false));
    let tb = granted(s.acquire(&mut c, "b:1", 2, 3, 60_000, false));
    let st = s.raw.status().run(&mut c).unwrap();
    assert_eq!(st.used, 4);
    let mut holds: Vec<(String, u64, u64)> = st
        .holds
        .iter()
        .map(|h| (h.id.clone(), h.token, h.permits))
        .collect();
    holds.sort();
    assert_eq!(
        holds,
        [("a:1#1".to_string(), ta, 1), ("b:1#2".to_string(), tb, 3)]
    );
    for h in &st.holds {
        assert!(h.pttl > Duration::from_secs(25), "{h:?}");
        assert!(h.lease == Duration::from_secs(30) || h.lease == Duration::from_secs(60));
    }
}

/// The open chaos finding (sem-long-00-volatile, docs/evidence.md): a release granted a waiter
/// (1 permit of 3) its permit in queue order and pushed the hand-off to its client's wake list;
/// the wake-up was popped (the list was being served: the hand-off pushed right behind it, to
/// another thread of the same client, was taken 1 ms later) but never reached the waiting
/// thread. That thread's attempt went on waiting, and its janitor on heartbeating it as a
/// waiter; sem_heartbeat found the hand-off entry and only moved its deadline on (the grantee
/// is alive), so nobody told the thread of its grant again. The permit stayed taken, by nobody,
/// until the grant's lease would run out on the server clock, which a -3.2 s step just after
/// the grant put 4.2 s away (an operator's forced release freed it after 1.5 s); the thread was
/// then told "retry" and queued again at the back, behind ~650 later grants: the `fifo`
/// report. (Without the step the permit comes back after the lease, 1 s, and the waiter still
/// loses its place.) A hand-off whose wake-up is no longer in the list while its attempt still
/// heartbeats as a waiter was popped and not taken: the heartbeat must push it again, as it
/// does for a hold of a waiting attempt with no hand-off entry
/// (`a_heartbeat_tells_a_waiting_attempt_the_permits_its_own_repeat_took`).
#[test]
fn a_hand_off_popped_but_not_taken_is_told_again_while_its_attempt_still_waits() {
    let mut server = support::faketime::FakeClockRedis::start();
    let mut c = server.conn();
    let s = Sem::new("lost-hand-off", "sem", 1);
    let th = granted(s.acquire(&mut c, "h:1", 1, 1, 1_000, true));
    assert_eq!(
        s.acquire(&mut c, "w:2", 6621, 1, 1_000, true),
        Reply::Queued
    );
    assert_eq!(s.acquire(&mut c, "x:1", 1, 1, 1_000, true), Reply::Queued);
    assert!(s.release(&mut c, "h:1", 1, th));
    // the waker pops w's hand-off, and w's thread never sees it
    let tw = s
        .pop_grant(&mut c, "w:2", 6621)
        .expect("the release granted w");
    // the server clock steps back just after the grant, as in the chaos run
    server.set_offset_ms(-3_166);
    // w's thread still waits, and so does x: their janitors heartbeat them every 200 ms
    let until = std::time::Instant::now() + Duration::from_millis(1_500);
    let mut told = None;
    while told.is_none() && std::time::Instant::now() < until {
        s.heartbeat(&mut c, &[("w:2", 6621), ("x:1", 1)]);
        told = s.pop_grant(&mut c, "w:2", 6621);
        thread::sleep(Duration::from_millis(200));
    }
    let (holds, used) = s.holds(&mut c);
    assert_eq!(
        told,
        Some(tw),
        "w heartbeated as a waiter for 1.5 s and was never told of its grant again; \
         its hold (lease 1 s) is still taken by nobody: holds {holds:?}, used {used}"
    );
}

/// The semaphore's twin of protocol's test of the same name. Before, the hand-offs zset was
/// scored by the grantee's deadline on the server clock, so a forward step of the server clock
/// revoked an unpopped grant at the next script (here: another waiter's heartbeat), and the
/// permit went on to the waiter behind. The deadline is on the semaphore hash's virtual clock
/// now, as the lock's (common.lua, "Time"), which a step advances by at most a third of the
/// waiter timeout.
#[test]
fn a_forward_server_clock_step_does_not_revoke_an_unpopped_hand_off() {
    let mut server = support::faketime::FakeClockRedis::start();
    let mut c = server.conn();
    let sem = Sem::new("handoff-stepped", "sem", 1);
    let th = granted(sem.acquire(&mut c, "h:1", 1, 1, 60_000, true));
    for owner in ["w:1", "x:1"] {
        assert_eq!(
            sem.acquire(&mut c, owner, 1, 1, 60_000, true),
            Reply::Queued
        );
    }
    assert!(sem.release(&mut c, "h:1", 1, th));
    server.set_offset_ms(10_000);
    for _ in 0..3 {
        sem.heartbeat(&mut c, &[("x:1", 1)]);
        assert_eq!(
            sem.acquire(&mut c, "cron:1", 1, 1, 60_000, false),
            Reply::Busy
        );
    }
    let (holds, used) = sem.holds(&mut c);
    assert_eq!((holds.len(), used), (1, 1), "{holds:?}");
    assert!(
        holds.contains_key("w:1#1"),
        "the hand-off was revoked after the step: {holds:?}"
    );
    assert!(
        sem.pop_grant(&mut c, "w:1", 1).is_some(),
        "the grantee's hand-off is gone"
    );
    assert_eq!(sem.pop_grant(&mut c, "x:1", 1), None, "x was served");
}

/// The hand-off clock's cap follows the waiters of each grant: a short-timeout client's small cap
/// (a third of its waiter timeout) stays only while a hand-off it may bind is pending. Here a
/// 150 ms client's hand-off ends (popped and released), then a 3 s client's grantee dies before
/// popping: with the small cap kept, each heartbeat of the waiter behind (every 500 ms) would
/// move the clock on by 50 ms only, and the dead grantee would keep the permit for half a
/// minute; it is revoked within a few seconds.
#[test]
fn a_dead_grantees_hand_off_is_judged_with_its_own_waiters_cap() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let with_timeout = |ms| {
        let settings = Settings {
            waiter_timeout: Duration::from_millis(ms),
            ..settings()
        };
        RawSemaphore::new("fairlock", "cap-follows", SemKind::Semaphore, 1, settings).unwrap()
    };
    let (short, long) = (with_timeout(150), with_timeout(3000));
    let sem = Sem::new("cap-follows", "sem", 1);
    let acquire = |raw: &RawSemaphore, c: &mut redis::Connection, owner: &str| {
        raw.acquire(owner, 1, 1, Duration::from_secs(60), Mode::Wait, "m")
            .run(c)
            .unwrap()
    };
    let SemAcquire::Granted { token: th, .. } = acquire(&long, &mut c, "h:1") else {
        panic!("h was not granted");
    };
    assert!(matches!(
        acquire(&short, &mut c, "s:1"),
        SemAcquire::Queued { .. }
    ));
    assert!(sem.release(&mut c, "h:1", 1, th));
    let ts = sem.pop_grant(&mut c, "s:1", 1).expect("s's hand-off");
    assert!(sem.release(&mut c, "s:1", 1, ts));
    // the 3 s clients: x is granted and dies unpopped, y waits behind it and heartbeats
    let SemAcquire::Granted { token: th2, .. } = acquire(&long, &mut c, "h2:1") else {
        panic!("h2 was not granted");
    };
    for owner in ["x:1", "y:1"] {
        assert!(matches!(
            acquire(&long, &mut c, owner),
            SemAcquire::Queued { .. }
        ));
    }
    assert!(sem.release(&mut c, "h2:1", 1, th2));
    let start = std::time::Instant::now();
    let ty = loop {
        long.heartbeat([("y:1", 1)]).run(&mut c).unwrap();
        if let Some(t) = sem.pop_grant(&mut c, "y:1", 1) {
            break t;
        }
        assert!(
            start.elapsed() < Duration::from_secs(8),
            "the dead grantee kept the permit for {:?}",
            start.elapsed()
        );
        thread::sleep(Duration::from_millis(500));
    };
    assert!(ty > th2);
    assert_eq!(
        sem.pop_grant(&mut c, "x:1", 1),
        None,
        "x's stale grant stayed"
    );
}

/// The semaphore's twin of protocol's test of the same name: a heartbeat in flight as the
/// thread takes its hand-off pushes the grant again, and that copy, never popped, must not let a
/// deadline revoke the permit from its live holder.
#[test]
fn a_grant_told_again_to_a_thread_that_took_it_is_never_revoked() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let s = Sem::new("told-again", "sem", 1);
    let th = granted(s.acquire(&mut c, "h:1", 1, 1, 60_000, true));
    assert_eq!(s.acquire(&mut c, "w:2", 7, 1, 60_000, true), Reply::Queued);
    assert!(s.release(&mut c, "h:1", 1, th));
    let tw = s
        .pop_grant(&mut c, "w:2", 7)
        .expect("the release granted w");
    // the janitor's last heartbeats, in flight as the thread takes its hold: the first tells
    // the grant again, the second finds that copy pending (and must not start a deadline)
    s.heartbeat(&mut c, &[("w:2", 7)]);
    s.heartbeat(&mut c, &[("w:2", 7)]);
    // nobody pops the copy told again: it goes within a waiter timeout, not the lease
    let ttl = pttl(&mut c, &s.raw.wake_key("w:2"));
    assert!(
        0 < ttl && ttl <= WAITER_TTL as i64,
        "the copy told again lives {ttl} ms, more than the waiter timeout {WAITER_TTL} ms"
    );
    // w holds the permit and waits no more; others come by for several waiter timeouts
    let until = std::time::Instant::now() + Duration::from_millis(WAITER_TTL * 5);
    while std::time::Instant::now() < until {
        thread::sleep(Duration::from_millis(WAITER_TTL / 3));
        assert_eq!(
            s.acquire(&mut c, "cron:1", 10, 1, 60_000, false),
            Reply::Busy,
            "the permit was taken from its live holder w"
        );
    }
    let (holds, _) = s.holds(&mut c);
    assert_eq!(holds.get("w:2#7"), Some(&1), "{holds:?} (token {tw})");
}

/// sem_leave.lua: a leave gives back the permits of an attempt granted meanwhile and says so
/// (`passed`, with the grants it made), not that it only left the queue.
#[test]
fn a_leave_that_gives_back_a_grant_says_it_passed_it_on() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let sem = Sem::new("leave-passed", "sem", 1);
    let ta = granted(sem.acquire(&mut c, "a:1", 1, 1, 30_000, true));
    assert_eq!(
        sem.acquire(&mut c, "b:1", 1, 1, 30_000, true),
        Reply::Queued
    );
    assert_eq!(
        sem.acquire(&mut c, "c:1", 1, 1, 30_000, true),
        Reply::Queued
    );
    assert!(sem.release(&mut c, "a:1", 1, ta));
    let r = sem.raw.leave("b:1", 1, false, false).run(&mut c).unwrap();
    assert_eq!(r, SemLeave::Passed { grants: 1 });
    assert!(sem.pop_grant(&mut c, "c:1", 1).is_some());
    // a waiter that held nothing only left
    let r = sem.raw.leave("d:1", 1, false, false).run(&mut c).unwrap();
    assert_eq!(r, SemLeave::Left);
}

/// sem_leave.lua: a leave first removes the holds whose lease ran out. A claim (the waiter's
/// deadline came) of a grant whose lease has run out gets nothing (no hold with no time left),
/// and its permits, and any other lapsed hold's, go to the head at once.
#[test]
fn a_claim_of_a_grant_whose_lease_ran_out_gets_nothing_and_the_head_gets_the_permits() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let sem = Sem::new("leave-lapsed", "sem", 1);
    let th = granted(sem.acquire(&mut c, "h:1", 1, 1, 30_000, true));
    assert_eq!(sem.acquire(&mut c, "w:1", 1, 1, 200, true), Reply::Queued);
    assert_eq!(
        sem.acquire(&mut c, "x:1", 1, 1, 30_000, true),
        Reply::Queued
    );
    assert!(sem.release(&mut c, "h:1", 1, th));
    // w was granted, with a 200 ms lease, and did not take it in time
    thread::sleep(Duration::from_millis(300));
    let r = sem.raw.leave("w:1", 1, false, true).run(&mut c).unwrap();
    assert_eq!(r, SemLeave::Left, "a claim of a lapsed hold");
    assert!(
        sem.pop_grant(&mut c, "x:1", 1).is_some(),
        "the head was not granted the lapsed permits"
    );
    let (holds, used) = sem.holds(&mut c);
    assert_eq!(used, 1);
    assert_eq!(holds.keys().collect::<Vec<_>>(), ["x:1#1"]);
}

/// sem_capacity.lua: a capacity change for a name in use with the other kind is told the stored
/// kind and capacity, and changes nothing.
#[test]
fn a_capacity_change_of_the_other_kind_is_told_the_stored_kind_and_capacity() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let rw = Sem::new("kinds", "rw", RW_MAX);
    granted(rw.acquire(&mut c, "r:1", 1, 1, 30_000, true));
    let sem = Sem::new("kinds", "sem", 2);
    let r = sem.raw.set_capacity(5).run(&mut c).unwrap();
    assert_eq!(
        r,
        SemCapacity::Mismatch {
            kind: "rw".into(),
            capacity: RW_MAX
        }
    );
    let (kind, cap): (String, u64) = redis::cmd("HMGET")
        .arg(&sem.keys[0])
        .arg("~kind")
        .arg("~cap")
        .query(&mut c)
        .unwrap();
    assert_eq!((kind.as_str(), cap), ("rw", RW_MAX));
}

/// sem_acquire.lua: a waiter queues with the semaphore's kind and capacity stored, so that they
/// bind while it waits. Here the hash was lost (evicted) while a waiter that wants 3 permits was
/// queued; a newcomer whose handle says capacity 2 cannot grant that head and queues behind it,
/// storing capacity 2: a client with capacity 3 is then told of the mismatch, and the head is
/// not granted 3 permits under it.
#[test]
fn a_waiter_queueing_on_a_lost_hash_stores_the_capacity_it_waits_under() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let sem = Sem::new("lost-hash", "sem", 3);
    granted(sem.acquire(&mut c, "a:1", 1, 1, 30_000, true));
    assert_eq!(
        sem.acquire(&mut c, "b:1", 1, 3, 30_000, true),
        Reply::Queued
    );
    let _: () = redis::cmd("DEL").arg(&sem.keys[0]).query(&mut c).unwrap();
    assert_eq!(
        sem.acquire_as(&mut c, "c:1", 1, 1, 30_000, true, 2),
        Reply::Queued
    );
    let (kind, cap): (Option<String>, Option<u64>) = redis::cmd("HMGET")
        .arg(&sem.keys[0])
        .arg("~kind")
        .arg("~cap")
        .query(&mut c)
        .unwrap();
    assert_eq!((kind.as_deref(), cap), (Some("sem"), Some(2)));
    assert_eq!(
        sem.acquire(&mut c, "d:1", 1, 1, 30_000, true),
        Reply::Mismatch
    );
    assert_eq!(sem.pop_grant(&mut c, "b:1", 1), None);
}

/// sem_leave.lua: a leave that asks for no mark never touches the marks' key, a key the scripts
/// do not declare (common.lua, "Undeclared keys"). Where that key cannot be reached (a Cluster
/// slot migrating, an ACL) the waiter still leaves, its place gone; a leave that asks for a mark
/// is refused there before it writes anything. (The lock's twin is in `protocol::`.)
#[test]
fn a_leave_that_asks_no_mark_works_where_the_marks_cannot_be_reached() {
    let server = RedisServer::start();
    let mut admin = server.conn();
    let s = Sem::new("no-mark-reach", "sem", 1);
    let _ = granted(s.acquire(&mut admin, "h:1", 1, 1, 60_000, true));
    for (owner, attempt) in [("t:1", 2), ("x:1", 3)] {
        assert_eq!(
            s.acquire(&mut admin, owner, attempt, 1, 60_000, true),
            Reply::Queued
        );
    }
    // the semaphore's declared keys and both leavers' wake lists can be reached, the marks
    // cannot: only the marks refuse the marking leave, which must find that out before it writes
    let wake_lists = [s.raw.wake_key("t:1"), s.raw.wake_key("x:1")];
    let mut c = server.conn_limited_to("declared", s.keys.iter().chain(&wake_lists));
    let waiters = |admin: &mut redis::Connection| -> Vec<String> {
        redis::cmd("ZRANGE")
            .arg(&s.keys[2])
            .arg(0)
            .arg(-1)
            .query(admin)
            .unwrap()
    };
    let r = s.raw.leave("t:1", 2, false, false).run(&mut c);
    assert!(r.is_ok(), "a leave without a mark: {r:?}");
    assert_eq!(waiters(&mut admin), ["x:1"]);
    let r = s.raw.leave("x:1", 3, true, false).run(&mut c);
    assert!(r.is_err(), "a marking leave with the marks refused: {r:?}");
    assert_eq!(waiters(&mut admin), ["x:1"]);
}

/// sem_status.lua reads the fence: a string there that is not a fairlock token is another
/// program's, and the status says so instead of reporting the fence as gone (the lock's twin is
/// in `protocol::`).
#[test]
fn the_status_refuses_a_fence_that_is_not_a_token() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let s = Sem::new("status-foreign-fence", "sem", 2);
    let _: () = redis::cmd("SET")
        .arg(&s.keys[1])
        .arg("not-a-token")
        .query(&mut c)
        .unwrap();
    let r = s.raw.status().run(&mut c);
    assert!(
        matches!(r, Err(fairlock::Error::ForeignData { .. })),
        "{r:?}"
    );
    let after: String = redis::cmd("GET").arg(&s.keys[1]).query(&mut c).unwrap();
    assert_eq!(after, "not-a-token");
}

/// sem.lua's expiry: a lease entry whose hold is gone (the hash was evicted with the hold in it)
/// goes once it is due, so the leases zset holds no more than the live holds and the entries
/// not yet due (an orphan kept would stay as long as the semaphore is used, one more per lost
/// hash).
#[test]
fn a_lease_entry_whose_hold_went_with_the_hash_goes_once_due() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let sem = Sem::new("orphan-lease", "sem", 3);
    // a short hold and a long one (which keeps the hash and the leases for 30 s)
    let _ = granted(sem.acquire(&mut c, "a:1", 1, 1, 100, true));
    let _ = granted(sem.acquire(&mut c, "z:1", 1, 1, 30_000, true));
    let _: () = redis::cmd("DEL").arg(&sem.keys[0]).query(&mut c).unwrap();
    thread::sleep(Duration::from_millis(150));
    let _ = granted(sem.acquire(&mut c, "b:1", 1, 1, 30_000, true));
    let mut leases: Vec<String> = redis::cmd("ZRANGE")
        .arg(&sem.keys[4])
        .arg(0)
        .arg(-1)
        .query(&mut c)
        .unwrap();
    leases.sort();
    // a's entry was due: gone; z's is not due yet
    assert_eq!(leases, ["b:1#1", "z:1#1"]);
}

/// sem.lua, drop_hold: a hold given back takes its lease entry with it (the release's own, and an
/// expiry's), so the leases zset holds the live holds only: an entry kept would stay until its
/// lease's end, one more per release, and keep the zset alive after the last hold.
#[test]
fn a_released_hold_leaves_no_lease_entry_behind() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let sem = Sem::new("released-lease", "sem", 2);
    let ta = granted(sem.acquire(&mut c, "a:1", 1, 1, 60_000, true));
    let _ = granted(sem.acquire(&mut c, "b:1", 1, 1, 60_000, true));
    assert!(sem.release(&mut c, "a:1", 1, ta));
    let leases: Vec<String> = redis::cmd("ZRANGE")
        .arg(&sem.keys[4])
        .arg(0)
        .arg(-1)
        .query(&mut c)
        .unwrap();
    assert_eq!(leases, ["b:1#1"]);
}

/// A grantee that heartbeats while its hand-off waits to be popped, then dies: the heartbeat
/// gives the hand-off more time but does not confirm it (only a pop does), so once the grantee
/// stops, the hand-off is revoked after the waiter timeout and the next waiter is served long
/// before the 30 s lease would have run out.
#[test]
fn a_grantee_that_heartbeats_then_dies_still_loses_its_unpopped_hand_off() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let sem = Sem::new("heartbeat-then-die", "sem", 1);
    let ta = granted(sem.acquire(&mut c, "a:1", 1, 1, 30_000, true));
    for owner in ["dead:1", "c:1"] {
        assert_eq!(
            sem.acquire(&mut c, owner, 1, 1, 30_000, true),
            Reply::Queued
        );
    }
    assert!(sem.release(&mut c, "a:1", 1, ta));
    // "dead" was granted: it heartbeats once, then never again and never pops
    sem.heartbeat(&mut c, &[("dead:1", 1)]);
    let deadline = std::time::Instant::now() + Duration::from_millis(WAITER_TTL * 4);
    loop {
        sem.heartbeat(&mut c, &[("c:1", 1)]);
        if sem.pop_grant(&mut c, "c:1", 1).is_some() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "c not served within four waiter timeouts: the hand-off was confirmed by a heartbeat"
        );
        thread::sleep(Duration::from_millis(100));
    }
    let (holds, _) = sem.holds(&mut c);
    assert!(!holds.contains_key("dead:1#1"), "{holds:?}");
}

/// The late copy's hold that a marking release frees goes to the queue's head at once (as any
/// release's permits do), not at the next heartbeat.
#[test]
fn the_permits_a_marking_release_takes_from_a_late_copy_go_to_the_head_at_once() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let sem = Sem::new("own-ghost-head", "sem", 1);
    let first = granted(sem.acquire(&mut c, "a:1", 1, 1, 50, true));
    thread::sleep(Duration::from_millis(100));
    let _copy = granted(sem.acquire(&mut c, "a:1", 1, 1, 30_000, true));
    assert_eq!(
        sem.acquire(&mut c, "w:1", 1, 1, 30_000, true),
        Reply::Queued
    );
    assert!(!sem.release_marking(&mut c, "a:1", 1, first, true));
    assert!(
        sem.pop_grant(&mut c, "w:1", 1).is_some(),
        "the head was not granted the freed permit"
    );
    let (holds, used) = sem.holds(&mut c);
    assert_eq!((holds.len(), used), (1, 1), "{holds:?}");
    assert!(holds.contains_key("w:1#1"));
}

/// A renewal never brings back a hold whose lease ran out on the server's clock: the hold is
/// expired first (its permits go back), and the renewal reports it lost, as the mutex's does.
#[test]
fn a_renewal_after_the_lease_ran_out_reports_the_hold_lost() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let sem = Sem::new("renew-expired", "sem", 2);
    let ta = granted(sem.acquire(&mut c, "a:1", 1, 1, 100, true));
    // a long hold keeps the hash and the leases alive past a's lease
    let _ = granted(sem.acquire(&mut c, "z:1", 1, 1, 30_000, true));
    thread::sleep(Duration::from_millis(150));
    assert!(!sem.renew(&mut c, "a:1", 1, ta), "an expired hold renewed");
    let (holds, used) = sem.holds(&mut c);
    assert_eq!((holds.len(), used), (1, 1), "{holds:?}");
    assert!(holds.contains_key("z:1#1"));
}
