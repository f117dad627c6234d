//! The janitor: one thread per client that keeps this client's waiters alive and repairs what
//! crashed processes leave behind, for every lock this client is waiting on.
//!
//! Each tick (every `janitor_interval`, all locks in one pipelined round trip) runs
//! `heartbeat.lua`, which
//! - refreshes the deadline of each local waiter (a waiter not refreshed for 3 intervals is dead),
//!   and tells a waiter whose entry vanished to re-queue itself;
//! - purges dead waiters anywhere in the queue and revokes a grant a dead waiter never picked up;
//! - grants a stranded lock (free, but waiters queued: its holder died) to the live head.
//!
//! Between ticks it also wakes when a holder's lease is due to run out, so the next waiter gets a
//! dead holder's lock within a few milliseconds of the lease's end, not at the next tick.

use std::collections::HashMap;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use parking_lot::Mutex;

use crate::connection::Manager;
use crate::error::{Error, Result};
use crate::keys::LockKeys;
use crate::scripts;
use crate::watchdog::send_pipeline;

/// Margin after a lease's end before the janitor looks (Redis expires keys lazily on access, so
/// any margin works; this one keeps us from looking a hair too early).
const EXPIRY_MARGIN: Duration = Duration::from_millis(5);

struct Waiting {
    keys: LockKeys,
    /// flag -> (lease ms, meta)
    waiters: HashMap<String, (u64, String)>,
}

/// What the janitor thread and the waiting threads share.
#[derive(Default)]
struct Registry {
    /// lock key -> this client's waiters of that lock
    locks: HashMap<String, Waiting>,
    /// When the janitor thread will wake next (`None`: idle until nudged). Kept under the same
    /// mutex as `locks`, so a new waiter always sees whether it must wake the thread.
    planned: Option<Instant>,
}

pub(crate) struct Janitor {
    registry: Arc<Mutex<Registry>>,
    nudge: Sender<Instant>,
    waiter_timeout: Duration,
}

impl Janitor {
    pub fn start(
        pool: r2d2::Pool<Manager>,
        client_id: &str,
        interval: Duration,
    ) -> Result<Janitor> {
        let registry = Arc::new(Mutex::new(Registry::default()));
        let (nudge, rx) = crossbeam_channel::unbounded();
        let shared = registry.clone();
        let waiter_timeout = interval * 3;
        thread::Builder::new()
            .name(format!("fairlock-janitor-{}", &client_id[..8]))
            .spawn(move || run(&pool, &shared, &rx, interval, waiter_timeout))
            .map_err(|e| Error::InvalidConfig {
                setting: "threads",
                reason: format!("cannot start the janitor thread: {e}"),
            })?;
        Ok(Janitor {
            registry,
            nudge,
            waiter_timeout,
        })
    }

    pub fn waiter_timeout_ms(&self) -> u64 {
        self.waiter_timeout.as_millis() as u64
    }

    /// A thread of this client now waits on `keys`. `holder_pttl` is the holder's lease left, so
    /// the janitor can look right after it runs out.
    pub fn register(
        &self,
        keys: &LockKeys,
        flag: &str,
        lease_ms: u64,
        meta: &str,
        holder_pttl: Duration,
    ) {
        let mut registry = self.registry.lock();
        registry
            .locks
            .entry(keys.lock.clone())
            .or_insert_with(|| Waiting {
                keys: keys.clone(),
                waiters: HashMap::new(),
            })
            .waiters
            .insert(flag.to_string(), (lease_ms, meta.to_string()));
        // Wake the thread only when it is idle or would look too late: a wake-up per waiter
        // costs a context switch per acquisition on a busy machine.
        let at = Instant::now() + holder_pttl + EXPIRY_MARGIN;
        if registry.planned.is_none_or(|planned| at < planned) {
            registry.planned = Some(at);
            let _ = self.nudge.send(at);
        }
    }

    pub fn unregister(&self, keys: &LockKeys, flag: &str) {
        let mut registry = self.registry.lock();
        if let Some(w) = registry.locks.get_mut(&keys.lock) {
            w.waiters.remove(flag);
            if w.waiters.is_empty() {
                registry.locks.remove(&keys.lock);
            }
        }
    }
}

fn run(
    pool: &r2d2::Pool<Manager>,
    registry: &Mutex<Registry>,
    nudge: &Receiver<Instant>,
    interval: Duration,
    waiter_timeout: Duration,
) {
    let mut next_tick = Instant::now() + interval;
    let mut early: Option<Instant> = None;
    loop {
        let (idle, wake_at) = {
            let mut reg = registry.lock();
            let idle = reg.locks.is_empty();
            let wake_at = (!idle).then(|| early.map_or(next_tick, |e| e.min(next_tick)));
            reg.planned = wake_at;
            (idle, wake_at)
        };
        let wait = wake_at.map_or(Duration::from_secs(3600), |at| {
            at.saturating_duration_since(Instant::now())
        });
        match nudge.recv_timeout(wait) {
            Ok(at) => {
                if idle {
                    // first waiter after a quiet spell: tick one interval from now
                    next_tick = Instant::now() + interval;
                }
                early = Some(early.map_or(at, |e| e.min(at)));
            }
            Err(RecvTimeoutError::Disconnected) => return,
            Err(RecvTimeoutError::Timeout) => {
                early = tick(pool, registry, waiter_timeout);
                next_tick = Instant::now() + interval;
            }
        }
    }
}

/// One heartbeat for every lock with local waiters. Returns when to look again early (the
/// soonest end of a holder's lease), if any.
fn tick(
    pool: &r2d2::Pool<Manager>,
    registry: &Mutex<Registry>,
    waiter_timeout: Duration,
) -> Option<Instant> {
    // The registry stays locked until the replies are in: an unregister (a waiter served or
    // leaving) waits for a heartbeat in flight, so no heartbeat ever speaks for a waiter that has
    // already gone (it would tell it to "retry" and leave a stray wake list behind).
    let registry = registry.lock();
    let batch: Vec<(String, redis::Cmd)> = registry
        .locks
        .values()
        .map(|w| {
            let mut cmd = scripts::HEARTBEAT.cmd(&w.keys);
            cmd.arg(waiter_timeout.as_millis() as u64);
            for (flag, (lease, meta)) in &w.waiters {
                cmd.arg(flag).arg(*lease).arg(meta);
            }
            (w.keys.lock.clone(), cmd)
        })
        .collect();
    if batch.is_empty() {
        return None;
    }
    let mut pipe = redis::pipe();
    for (_, cmd) in &batch {
        pipe.add_command(cmd.clone());
    }
    let sent = Instant::now();
    let replies = send_pipeline(pool, &pipe, &scripts::HEARTBEAT, "refreshing waiters");
    drop(registry);
    match replies {
        Ok(values) => {
            let mut soonest: Option<Instant> = None;
            for ((lock, _), value) in batch.iter().zip(values) {
                match scripts::parse_heartbeat(value) {
                    Ok(hb) => {
                        for flag in hb.told_to_retry {
                            log::warn!(
                                "fairlock: waiter {flag} of {lock} had lost its queue entry (presumed dead during a pause, or Redis restarted); it re-queues at the back"
                            );
                        }
                        if hb.pttl_ms > 0 {
                            let at =
                                sent + Duration::from_millis(hb.pttl_ms as u64) + EXPIRY_MARGIN;
                            soonest = Some(soonest.map_or(at, |s| s.min(at)));
                        }
                    }
                    Err(e) => log::warn!("fairlock: janitor heartbeat on {lock} failed: {e}"),
                }
            }
            soonest
        }
        Err(e) => {
            log::warn!("fairlock: janitor could not reach Redis ({e}); retrying next interval");
            None
        }
    }
}
