//! The janitor: one thread per client that keeps this client's waiters alive and repairs what
//! crashed processes leave behind, for every lock this client is waiting on.
//!
//! Each tick (every `janitor_interval`, all locks in one pipelined round trip) runs
//! `heartbeat.lua`, which
//! - refreshes the deadline of each local waiting attempt (one not refreshed for 3 intervals is
//!   dead), and tells an attempt that lost its place to queue again;
//! - revokes a hand-off whose grantee died before picking it up;
//! - grants a stranded lock (free, but waiters queued: its holder died) to the live head.
//!
//! Between ticks it also wakes when a holder's lease is due to run out, so the next waiter gets a
//! dead holder's lock within a few milliseconds of the lease's end, not at the next tick. Every
//! `server_check_interval` (a minute by default) it starts a check, on a short-lived thread of
//! its own, that the server does not evict keys, so a changed setting is logged. Not on the
//! janitor thread: the check opens a connection, which can wait for a slow server or sentinel
//! for seconds, and the heartbeats it owes the waiters must not (a waiter silent for 3
//! intervals is purged as dead and queues again at the back).
//!
//! A heartbeat not answered within an interval is given up (its connection dropped) and sent
//! once more at once, on another connection: one stalled connection (half-open after a network
//! fault, say) must not keep the client's waiters silent for the read timeout, which is longer
//! than the 3 intervals that make a waiter dead (the default 5 s against 3 s). A heartbeat that
//! was applied all the same is a late heartbeat, which the scripts take as one (heartbeat.lua).
//!
//! The registry is never locked across a round trip (a waiting thread registering must not wait
//! on the network): a tick sends a snapshot, so a heartbeat may speak for an attempt that has
//! just ended. The scripts make that harmless: a refresh only touches the entry of that very
//! attempt, and a "retry" for an ended attempt is ignored by its thread.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use parking_lot::Mutex;

use crate::boot_clock::BootInstant;
use crate::connection::{with_pooled, Conn, Pool};
use crate::error::{Error, Result};
use crate::raw::{self, RawLock, RawSemaphore, Witness};

/// A waiting attempt's witness (see `lease_estimate`), shared by its thread and the janitor,
/// whose heartbeats renew it.
pub(crate) type SharedWitness = Arc<Mutex<Witness<BootInstant>>>;

/// Margin after a lease's end before the janitor looks (Redis expires keys lazily on access, so
/// any margin works; this one keeps us from looking a hair too early).
const EXPIRY_MARGIN: Duration = Duration::from_millis(5);

/// What one heartbeat told the janitor, in the same words for every primitive.
pub(crate) struct Beat {
    /// The last token handed out when it ran (a grant with a greater token came later).
    last_token: u64,
    /// The owners whose attempt had lost its place and were told to queue again.
    told_to_retry: Vec<String>,
    /// What it repaired: hand-offs revoked from dead grantees, holds granted to live waiters.
    repairs: u64,
    /// When a holder's lease ends next, if one holds: the janitor looks again then.
    look_again: Option<Duration>,
}

impl From<raw::Heartbeat> for Beat {
    fn from(hb: raw::Heartbeat) -> Beat {
        Beat {
            last_token: hb.last_token,
            told_to_retry: hb.told_to_retry,
            repairs: u64::from(hb.repairs),
            look_again: (hb.pttl_ms > 0).then(|| Duration::from_millis(hb.pttl_ms as u64)),
        }
    }
}

impl From<raw::SemHeartbeat> for Beat {
    fn from(hb: raw::SemHeartbeat) -> Beat {
        Beat {
            last_token: hb.last_token,
            told_to_retry: hb.told_to_retry,
            repairs: hb.grants,
            look_again: hb.next_expiry,
        }
    }
}

/// What the janitor keeps waiters alive on: a lock, or a semaphore's (or read/write lock's)
/// permits (each primitive of the acquisition engine gives its own, `Primitive::janitor_target`).
pub(crate) trait Heartbeats: Send + Sync {
    /// The key the waiters are registered under (the primitive's main key).
    fn key(&self) -> &str;
    /// The heartbeat of these waiting attempts (owner, attempt).
    fn heartbeat(&self, attempts: &[(&str, u64)]) -> raw::Call<Beat>;
}

impl Heartbeats for RawLock {
    fn key(&self) -> &str {
        &self.keys().lock
    }

    fn heartbeat(&self, attempts: &[(&str, u64)]) -> raw::Call<Beat> {
        RawLock::heartbeat(self, attempts.iter().copied()).map(Beat::from)
    }
}

impl Heartbeats for RawSemaphore {
    fn key(&self) -> &str {
        self.key_names()[0]
    }

    fn heartbeat(&self, attempts: &[(&str, u64)]) -> raw::Call<Beat> {
        RawSemaphore::heartbeat(self, attempts.iter().copied()).map(Beat::from)
    }
}

/// A primitive as the janitor holds it.
pub(crate) type Target = Arc<dyn Heartbeats>;

struct Waiting {
    target: Target,
    /// owner -> the attempt it is waiting with, and that attempt's witness, which each
    /// heartbeat renews (see `lease_estimate`)
    attempts: HashMap<String, (u64, SharedWitness)>,
}

/// What the janitor thread and the waiting threads share.
#[derive(Default)]
struct Registry {
    /// lock key -> this client's waiters of that lock
    locks: HashMap<String, Waiting>,
    /// When the janitor thread will wake next (`None`: idle until nudged). Kept under the same
    /// mutex as `locks`, so a new waiter always sees whether it must wake the thread.
    planned: Option<BootInstant>,
}

pub(crate) struct Janitor {
    registry: Arc<Mutex<Registry>>,
    nudge: Sender<BootInstant>,
}

/// Checks the server's configuration again (see [`Manager::check_eviction`]).
pub(crate) type ServerCheck = Arc<dyn Fn() -> Result<()> + Send + Sync>;

impl Janitor {
    pub fn start(
        pool: Pool,
        client_id: &str,
        interval: Duration,
        server_check_interval: Duration,
        server_check: ServerCheck,
    ) -> Result<Janitor> {
        let registry = Arc::new(Mutex::new(Registry::default()));
        let (nudge, rx) = crossbeam_channel::unbounded();
        let shared = registry.clone();
        thread::Builder::new()
            .name(format!("fairlock-janitor-{}", &client_id[..8]))
            .spawn(move || {
                let check = &server_check;
                run(&pool, &shared, &rx, interval, server_check_interval, check)
            })
            .map_err(|source| Error::Io {
                during: "starting the janitor thread",
                source,
            })?;
        Ok(Janitor { registry, nudge })
    }

    /// `owner` now waits on `raw`'s lock with `attempt`. `holder_pttl` bounds the holder's lease
    /// left (the queueing reply gives the hold's whole lease, to spare a PTTL call), so the
    /// janitor looks when it has surely run out; each heartbeat then replans on the exact PTTL.
    /// Each heartbeat also renews the attempt's `witness`.
    pub fn register(
        &self,
        target: Target,
        owner: &str,
        attempt: u64,
        holder_pttl: Duration,
        witness: SharedWitness,
    ) {
        let mut registry = self.registry.lock();
        registry
            .locks
            .entry(target.key().to_string())
            .or_insert_with(|| Waiting {
                target,
                attempts: HashMap::new(),
            })
            .attempts
            .insert(owner.to_string(), (attempt, witness));
        // Wake the thread only when it is idle or would look too late: a wake-up per waiter
        // costs a context switch per acquisition on a busy machine.
        let at = BootInstant::now() + holder_pttl + EXPIRY_MARGIN;
        if registry.planned.is_none_or(|planned| at < planned) {
            registry.planned = Some(at);
            let _ = self.nudge.send(at);
        }
    }

    /// `owner` no longer waits on the lock (or semaphore) with key `key`.
    pub fn unregister(&self, key: &str, owner: &str) {
        let mut registry = self.registry.lock();
        if let Some(w) = registry.locks.get_mut(key) {
            w.attempts.remove(owner);
            if w.attempts.is_empty() {
                registry.locks.remove(key);
            }
        }
    }
}

fn run(
    pool: &Pool,
    registry: &Mutex<Registry>,
    nudge: &Receiver<BootInstant>,
    interval: Duration,
    server_check_interval: Duration,
    server_check: &ServerCheck,
) {
    let checking = Arc::new(AtomicBool::new(false));
    // see the module's comment: a stalled heartbeat is sent again an interval after the tick,
    // an interval before the waiters it speaks for count as dead (3 after the last one)
    let reply_within = interval.min(pool.read_timeout());
    let mut next_tick = BootInstant::now() + interval;
    let mut next_server_check = BootInstant::now() + server_check_interval;
    let mut early: Option<BootInstant> = None;
    loop {
        let (idle, heartbeat_at) = {
            let mut reg = registry.lock();
            let idle = reg.locks.is_empty();
            let at = (!idle).then(|| early.map_or(next_tick, |e| e.min(next_tick)));
            reg.planned = at;
            (idle, at)
        };
        let wake_at = heartbeat_at.map_or(next_server_check, |at| at.min(next_server_check));
        match nudge.recv_timeout(wake_at.saturating_duration_since(BootInstant::now())) {
            Ok(at) => {
                if idle {
                    // first waiter after a quiet spell: tick one interval from now
                    next_tick = BootInstant::now() + interval;
                }
                early = Some(early.map_or(at, |e| e.min(at)));
            }
            Err(RecvTimeoutError::Disconnected) => return,
            Err(RecvTimeoutError::Timeout) => {
                let now = BootInstant::now();
                if now >= next_server_check {
                    next_server_check = now + server_check_interval;
                    check_aside(server_check, &checking);
                }
                if heartbeat_at.is_some_and(|at| now + Duration::from_millis(1) >= at) {
                    early = tick(pool, registry, reply_within);
                    next_tick = BootInstant::now() + interval;
                }
            }
        }
    }
}

/// Start `check` on a short-lived thread, unless the last one still runs (a check waiting on a
/// server that does not answer is not joined by another).
fn check_aside(check: &ServerCheck, checking: &Arc<AtomicBool>) {
    if checking.swap(true, Ordering::SeqCst) {
        return;
    }
    let (check, done) = (Arc::clone(check), Arc::clone(checking));
    let started = thread::Builder::new()
        .name("fairlock-check".into())
        .spawn(move || {
            if let Err(e) = check() {
                log::error!("fairlock: {e}");
            }
            done.store(false, Ordering::SeqCst);
        });
    if let Err(e) = started {
        checking.store(false, Ordering::SeqCst);
        log::warn!("fairlock: cannot start the server check's thread ({e}); trying again later");
    }
}

/// Heartbeats of one script, and the witnesses of the attempts each speaks for.
type Pipeline = (Vec<raw::Call<Beat>>, Vec<Vec<SharedWitness>>);

/// One heartbeat for every lock (and semaphore) with local waiters. Returns when to look again
/// early (the soonest end of a holder's lease), if any.
fn tick(pool: &Pool, registry: &Mutex<Registry>, reply_within: Duration) -> Option<BootInstant> {
    // one pipeline per script, so that a failure of one kind's (say, a script its user may not
    // run) does not cost the other kinds' waiters their heartbeats
    let mut by_script: BTreeMap<&'static str, Pipeline> = BTreeMap::new();
    for w in registry.lock().locks.values() {
        let attempts: Vec<(&str, u64)> = w
            .attempts
            .iter()
            .map(|(owner, (a, _))| (owner.as_str(), *a))
            .collect();
        let call = w.target.heartbeat(&attempts);
        let (calls, witnesses) = by_script.entry(call.script().name()).or_default();
        calls.push(call);
        witnesses.push(w.attempts.values().map(|(_, w)| w.clone()).collect());
    }
    if by_script.is_empty() {
        return None;
    }
    let sent = BootInstant::now();
    let mut soonest: Option<BootInstant> = None;
    for (calls, witnesses) in by_script.into_values() {
        let replies = run_heartbeats(pool, &calls, reply_within);
        for (reply, witnesses) in replies.into_iter().zip(witnesses) {
            match reply {
                Ok(beat) => {
                    heard(sent, beat.last_token, &witnesses, &beat.told_to_retry);
                    crate::telemetry::repaired(beat.repairs);
                    if let Some(after) = beat.look_again {
                        let at = sent + after + EXPIRY_MARGIN;
                        soonest = Some(soonest.map_or(at, |s| s.min(at)));
                    }
                }
                Err(e) => log::warn!("fairlock: janitor heartbeat failed: {e}"),
            }
        }
    }
    soonest
}

/// Send `calls` in one pipeline; none when Redis cannot be reached (logged; the next tick
/// tries again).
fn run_heartbeats<T>(
    pool: &Pool,
    calls: &[raw::Call<T>],
    reply_within: Duration,
) -> Vec<Result<T>> {
    if calls.is_empty() {
        return Vec::new();
    }
    let run = |c: &mut Conn| {
        // (a reply that times out leaves the connection broken, and the pool drops it)
        c.set_read_timeout(reply_within);
        let replies = raw::run_pipeline(c, calls);
        c.set_read_timeout(pool.read_timeout());
        replies
    };
    let replies = match with_pooled(pool, "refreshing waiters", run) {
        Err(e) if e.is_timeout() => {
            log::debug!(
                "fairlock: a heartbeat got no reply in {reply_within:?} ({e}); sending it again"
            );
            with_pooled(pool, "refreshing waiters", run)
        }
        other => other,
    };
    match replies {
        Ok(replies) => replies,
        Err(e) => {
            log::warn!("fairlock: janitor could not reach Redis ({e}); retrying next interval");
            Vec::new()
        }
    }
}

/// What a heartbeat (sent at `sent`) tells the waiters it spoke for.
fn heard(sent: BootInstant, last_token: u64, witnesses: &[SharedWitness], told: &[String]) {
    // the heartbeat ran after it was sent: a grant with a greater token came later (a waiter
    // told to retry re-queues, and its acquire renews its witness anyway)
    for witness in witnesses {
        witness.lock().observe(sent, last_token);
    }
    crate::telemetry::requeued(told.len() as u64);
    for owner in told {
        log::warn!(
            "fairlock: waiter {owner} had lost its queue place (presumed dead during a pause, a grant it never picked up lapsed, or Redis lost data); it queues again at the back"
        );
    }
}
