//! The watchdog: one thread per client renews the leases of all held locks without a fixed
//! lease, every third of the lease, in one pipelined round trip for all that are due.
//!
//! Renewal stops the moment a guard is released (the guard unregisters before its release goes
//! out), and the renew script checks owner *and* token, so a released hold never extends the next
//! owner's lease. A renewal that finds the lock gone or taken marks the hold lost, logs a
//! warning and tells the holder (the hold's loss signal and the client's `on_lost` callback,
//! once); a renewal that fails on the network is retried until the lease would have run out,
//! and then the hold is lost the same way. A hold released normally is unregistered before its
//! release goes out, so it is never told.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use parking_lot::Mutex;

use crate::boot_clock::BootInstant;
use crate::connection::{with_pooled, Pool};
use crate::error::{Error, Result};
use crate::hold::HoldState;
use crate::loss::{LossCause, OnLost};
use crate::raw::{self, Call};

/// One hold to renew: the renewal call of a lock's or a semaphore's hold (it names the owner
/// and token, and never shortens a lease), and what to log.
struct Renewal {
    call: Call<bool>,
    /// The lock's (or semaphore's) key, for log lines.
    key: String,
    token: u64,
    lease: Duration,
    state: Arc<HoldState>,
    due: BootInstant,
}

#[derive(Default)]
struct Registry {
    entries: HashMap<u64, Renewal>,
    /// When the thread will wake next (`None`: idle). Under the same mutex as `entries`, so a new
    /// hold always knows whether it must wake the thread.
    planned: Option<BootInstant>,
}

pub(crate) struct Watchdog {
    registry: Arc<Mutex<Registry>>,
    next_id: AtomicU64,
    nudge: Sender<()>,
}

impl Watchdog {
    /// `lease` is the client's default lease: with no holds, the thread still wakes every sixth
    /// of it, so a new hold with that lease (first due after a third) never needs to wake it.
    /// `on_lost`: the client's callback for lost holds.
    pub fn start(
        pool: Pool,
        client_id: &str,
        lease: Duration,
        on_lost: Option<OnLost>,
    ) -> Result<Watchdog> {
        let idle_wake = (lease / 6).max(Duration::from_millis(50));
        let registry = Arc::new(Mutex::new(Registry::default()));
        let (nudge, rx) = crossbeam_channel::unbounded();
        let reg = registry.clone();
        thread::Builder::new()
            .name(format!("fairlock-watchdog-{}", &client_id[..8]))
            .spawn(move || run(&pool, &reg, &rx, idle_wake, on_lost.as_ref()))
            .map_err(|source| Error::Io {
                during: "starting the watchdog thread",
                source,
            })?;
        Ok(Watchdog {
            registry,
            next_id: AtomicU64::new(1),
            nudge,
        })
    }

    /// Renew with `call` (which names the hold) every third of `lease` until unregistered.
    pub fn register(
        &self,
        call: Call<bool>,
        key: String,
        token: u64,
        lease: Duration,
        state: Arc<HoldState>,
        expires: BootInstant,
    ) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        // First renewal when a third of the lease has passed (measured from the grant).
        let due = expires
            .checked_sub(lease * 2 / 3)
            .unwrap_or_else(BootInstant::now);
        let mut registry = self.registry.lock();
        // Wake the thread only if this hold is due before its planned wake: a wake-up per
        // acquisition costs a context switch on a busy machine.
        let wake = registry.planned.is_none_or(|planned| due < planned);
        if wake {
            registry.planned = Some(due);
        }
        registry.entries.insert(
            id,
            Renewal {
                call,
                key,
                token,
                lease,
                state,
                due,
            },
        );
        if wake {
            let _ = self.nudge.send(());
        }
        id
    }

    pub fn unregister(&self, id: u64) {
        self.registry.lock().entries.remove(&id);
    }
}

fn run(
    pool: &Pool,
    registry: &Mutex<Registry>,
    nudge: &Receiver<()>,
    idle_wake: Duration,
    on_lost: Option<&OnLost>,
) {
    loop {
        let next = {
            let mut reg = registry.lock();
            let next = reg
                .entries
                .values()
                .map(|r| r.due)
                .min()
                .unwrap_or_else(|| BootInstant::now() + idle_wake);
            reg.planned = Some(next);
            next
        };
        let wait = next.saturating_duration_since(BootInstant::now());
        match nudge.recv_timeout(wait) {
            Ok(()) => continue,
            Err(RecvTimeoutError::Disconnected) => return,
            Err(RecvTimeoutError::Timeout) => renew_due(pool, registry, on_lost),
        }
    }
}

fn renew_due(pool: &Pool, registry: &Mutex<Registry>, on_lost: Option<&OnLost>) {
    let now = BootInstant::now();
    // Snapshot what is due and let go of the registry: guards must never wait on the network.
    let (ids, calls): (Vec<u64>, Vec<_>) = registry
        .lock()
        .entries
        .iter()
        .filter(|(_, r)| r.due <= now + Duration::from_millis(5))
        .map(|(id, r)| (*id, r.call.clone()))
        .unzip();
    if calls.is_empty() {
        return;
    }
    let sent = BootInstant::now();
    let replies = with_pooled(pool, "renewing leases", |c| raw::run_pipeline(c, &calls));

    // The holds found lost, told after the registry is let go (the callback is user code), in
    // the order found. Their entries are removed under the lock: a release that comes after
    // finds nothing to unregister, one that came before left nothing to tell.
    let mut lost: Vec<(Arc<HoldState>, LossCause)> = Vec::new();
    let (mut renewed, mut failed) = (0, 0);
    let mut reg = registry.lock();
    let replies = match replies {
        Ok(replies) => replies,
        Err(e) => {
            crate::telemetry::renewals(0, ids.len() as u64);
            for id in &ids {
                if let Some(r) = reg.entries.get_mut(id) {
                    if let Some(l) = retry_or_give_up(r, &e) {
                        lost.push((r.state.clone(), l));
                    }
                }
            }
            reg.entries
                .retain(|_, r| !r.state.lost.load(Ordering::SeqCst));
            drop(reg);
            tell(lost, on_lost);
            return;
        }
    };
    for (id, reply) in ids.iter().zip(replies) {
        let Some(r) = reg.entries.get_mut(id) else {
            continue; // released meanwhile: its result means nothing now
        };
        match reply {
            Ok(true) => {
                *r.state.expires.lock() = sent + r.lease;
                r.due = sent + r.lease / 3;
                renewed += 1;
            }
            Ok(false) => {
                log::warn!(
                    "fairlock: lock {:?} (token {}) was lost: renewal found it gone or held by another owner",
                    r.key, r.token
                );
                r.state.lost.store(true, Ordering::SeqCst);
                lost.push((r.state.clone(), LossCause::TakenOrGone));
                reg.entries.remove(id);
            }
            Err(e) => {
                failed += 1;
                if let Some(l) = retry_or_give_up(r, &e) {
                    lost.push((r.state.clone(), l));
                }
            }
        }
    }
    crate::telemetry::renewals(renewed, failed);
    reg.entries
        .retain(|_, r| !r.state.lost.load(Ordering::SeqCst));
    drop(reg);
    tell(lost, on_lost);
}

/// Tell each hold's holder that it was lost (once each: see `LossSignal::tell`).
fn tell(lost: Vec<(Arc<HoldState>, LossCause)>, on_lost: Option<&OnLost>) {
    for (state, cause) in lost {
        state.loss.tell(cause, on_lost);
    }
}

/// A renewal failed on the network (or the server): retry soon, unless the lease ran out
/// meanwhile by our estimate, and then the hold is presumed lost (returned, to be told).
fn retry_or_give_up(r: &mut Renewal, e: &Error) -> Option<LossCause> {
    let expires = *r.state.expires.lock();
    if BootInstant::now() >= expires {
        log::warn!(
            "fairlock: lock {:?} (token {}) is presumed lost: its lease ran out while it could not be renewed ({e})",
            r.key, r.token
        );
        r.state.lost.store(true, Ordering::SeqCst);
        Some(LossCause::LeaseRanOut)
    } else {
        log::warn!("fairlock: renewing lock {:?} failed ({e}); retrying", r.key);
        // not after the lease's end: a loss is told within a retry of it
        r.due = (BootInstant::now() + (r.lease / 10).min(Duration::from_millis(500))).min(expires);
        None
    }
}
