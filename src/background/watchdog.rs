//! The watchdog: one thread per client renews the leases of all held locks without a fixed
//! lease, every third of the lease, in one pipelined round trip for all that are due.
//!
//! The round trip itself runs on a second thread, the renewer, while the watchdog waits for its
//! reply no longer than the earliest lease end by the local estimate: a server that stops
//! answering without closing the connection (stalled, frozen, partitioned) holds the call up to
//! a read timeout (or a connect timeout and more, for a new connection or a failover), and a
//! loss must be told within a renewal interval of the lease's end all the same. A hold whose
//! lease ran out by the estimate is lost, whatever reply comes later: a lost hold stays lost
//! (`is_lost()` has said so already, and so may the push).
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

use crossbeam_channel::{select, Receiver, RecvTimeoutError, Sender};
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
        let renewer = Renewer::start(pool, client_id)?;
        let reg = registry.clone();
        thread::Builder::new()
            .name(format!("fairlock-watchdog-{}", &client_id[..8]))
            .spawn(move || run(&renewer, &reg, &rx, idle_wake, on_lost.as_ref()))
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

/// The thread that runs the renewal round trips for the watchdog, one at a time: it gets the
/// calls of one round and sends their replies back. It stops when the watchdog does (its job
/// channel disconnects), after the call in flight, if any, has returned.
struct Renewer {
    jobs: Sender<Vec<Call<bool>>>,
    replies: Receiver<Result<Vec<Result<bool>>>>,
}

impl Renewer {
    fn start(pool: Pool, client_id: &str) -> Result<Renewer> {
        let (jobs, job_rx) = crossbeam_channel::bounded::<Vec<Call<bool>>>(1);
        let (reply_tx, replies) = crossbeam_channel::bounded(1);
        thread::Builder::new()
            .name(format!("fairlock-renew-{}", &client_id[..8]))
            .spawn(move || {
                for calls in job_rx {
                    let replies =
                        with_pooled(&pool, "renewing leases", |c| raw::run_pipeline(c, &calls));
                    if reply_tx.send(replies).is_err() {
                        return;
                    }
                }
            })
            .map_err(|source| Error::Io {
                during: "starting the lease renewal thread",
                source,
            })?;
        Ok(Renewer { jobs, replies })
    }
}

/// Whether the watchdog goes on: `Stop` when its client is gone.
#[derive(PartialEq, Eq)]
enum Flow {
    Go,
    Stop,
}

fn run(
    renewer: &Renewer,
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
            Err(RecvTimeoutError::Timeout) => {
                if renew_due(renewer, registry, nudge, on_lost) == Flow::Stop {
                    return;
                }
            }
        }
    }
}

fn renew_due(
    renewer: &Renewer,
    registry: &Mutex<Registry>,
    nudge: &Receiver<()>,
    on_lost: Option<&OnLost>,
) -> Flow {
    let sent = BootInstant::now();
    // Snapshot what is due and let go of the registry: guards must never wait on the network.
    // A due hold whose lease already ran out by the estimate (this process was stopped or
    // starved past it) is lost whatever the reply says; it is sent all the same, for the reply
    // to tell why (gone or taken), and given a renewal interval for it.
    let mut ids = Vec::new();
    let mut calls = Vec::new();
    let mut late = HashMap::new();
    for (id, r) in &registry.lock().entries {
        if r.due <= sent + Duration::from_millis(5) {
            ids.push(*id);
            calls.push(r.call.clone());
            if *r.state.expires.lock() <= sent {
                late.insert(*id, sent + r.lease / 3);
            }
        }
    }
    if calls.is_empty() {
        return Flow::Go;
    }
    if renewer.jobs.send(calls).is_err() {
        log::error!("fairlock: the lease renewal thread is gone; leases are no longer renewed");
        return Flow::Stop;
    }
    // Wait for the reply, but tell each loss at its lease's end (by the estimate) meanwhile:
    // a server that does not answer holds the call up to a read timeout or longer.
    let replies = loop {
        let wait = {
            let mut reg = registry.lock();
            let end = reg
                .entries
                .iter()
                .map(|(id, r)| give_up_at(*id, r, &late))
                .min();
            // a new hold due before then wakes the thread (see `register`): its lease may end
            // sooner
            reg.planned = end;
            end.map_or(IDLE_WAIT, |end| {
                end.saturating_duration_since(BootInstant::now())
            })
        };
        select! {
            recv(renewer.replies) -> replies => match replies {
                Ok(replies) => break replies,
                Err(_) => {
                    log::error!("fairlock: the lease renewal thread is gone; leases are no longer renewed");
                    return Flow::Stop;
                }
            },
            recv(nudge) -> nudged => if nudged.is_err() {
                return Flow::Stop; // the client is gone; the renewer stops after its call
            },
            default(wait) => give_up_ran_out(registry, on_lost, &late),
        }
    };
    take_replies(registry, on_lost, &ids, sent, replies);
    // the holds that were not in this round and whose lease ran out meanwhile
    give_up_ran_out(registry, on_lost, &HashMap::new());
    Flow::Go
}

/// Apply the replies of a renewal round sent at `sent` for the holds `ids`.
fn take_replies(
    registry: &Mutex<Registry>,
    on_lost: Option<&OnLost>,
    ids: &[u64],
    sent: BootInstant,
    replies: Result<Vec<Result<bool>>>,
) {
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
            for id in ids {
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
            // released meanwhile, or lost (a lost hold stays lost): its result means nothing now
            continue;
        };
        match reply {
            Ok(true) => {
                let mut expires = r.state.expires.lock();
                if *expires <= BootInstant::now() {
                    // the lease ran out by the estimate just now, before this reply came:
                    // `is_lost()` may have said so already, and it stays so
                    drop(expires);
                    lost.push((
                        r.state.clone(),
                        presume_lost(r, "the renewal came too late"),
                    ));
                } else {
                    *expires = sent + r.lease;
                    drop(expires);
                    r.due = sent + r.lease / 3;
                    renewed += 1;
                }
            }
            Ok(false) => {
                log::warn!(
                    "fairlock: lost {} (token {}): a renewal found the hold gone or taken by another owner",
                    r.state.loss.what(),
                    r.token
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

/// How long the watchdog waits for a renewal's reply when no hold is registered any more (all
/// released meanwhile); a new hold wakes it.
const IDLE_WAIT: Duration = Duration::from_secs(3600);

/// When hold `id` is given up if no reply says otherwise: at its lease's end by the estimate,
/// or for one sent already past it (`late`), when the time for the reply's cause is over.
fn give_up_at(id: u64, r: &Renewal, late: &HashMap<u64, BootInstant>) -> BootInstant {
    late.get(&id)
        .copied()
        .unwrap_or_else(|| *r.state.expires.lock())
}

/// Every registered hold whose time is up (see [`give_up_at`]) is lost: marked, removed and
/// told (after the registry is let go).
fn give_up_ran_out(
    registry: &Mutex<Registry>,
    on_lost: Option<&OnLost>,
    late: &HashMap<u64, BootInstant>,
) {
    let now = BootInstant::now();
    let mut lost = Vec::new();
    registry.lock().entries.retain(|id, r| {
        if give_up_at(*id, r, late) > now {
            return true;
        }
        lost.push((
            r.state.clone(),
            presume_lost(r, "no renewal came back in time"),
        ));
        false
    });
    tell(lost, on_lost);
}

/// Mark a hold whose lease ran out by the estimate lost, with a warning saying `why`.
fn presume_lost(r: &Renewal, why: &str) -> LossCause {
    log::warn!(
        "fairlock: presumed lost {} (token {}): its lease ran out while it could not be renewed ({why})",
        r.state.loss.what(),
        r.token
    );
    r.state.lost.store(true, Ordering::SeqCst);
    LossCause::LeaseRanOut
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
        Some(presume_lost(r, &e.to_string()))
    } else {
        log::warn!(
            "fairlock: renewing {} failed ({e}); retrying",
            r.state.loss.what()
        );
        // not after the lease's end: a loss is told within a retry of it
        r.due = (BootInstant::now() + (r.lease / 10).min(Duration::from_millis(500))).min(expires);
        None
    }
}
