//! One acquire call of one thread that may have to wait: an `Attempt`.
//!
//! How a waiter waits (the whole wake-up path is here and in `release.lua`):
//! 1. Each acquire call is an *attempt* with a number of its own. `acquire.lua` either grants
//!    the lock or puts the attempt in the lock's FIFO queue.
//! 2. The thread registers its attempt with the client's `waker` before the request, and then
//!    waits: either as the *leader*, blocking in the one BLPOP that covers this client's wake
//!    lists of every lock its threads wait on, or on a channel of its own, for the leader to hand
//!    it its message. Waiting costs no connection per thread.
//! 3. The release that makes this attempt the head grants it the lock inside the script and
//!    pushes `<thread>|g|<attempt>|<token>|<time>` (a hand-off) to this client's list of that
//!    lock: this thread (as the leader, usually) pops it and holds the lock with no further
//!    round trip. A push that lands before the BLPOP covers the list stays in it, so no wake-up
//!    is lost.
//! 4. The janitor keeps the queue entry alive meanwhile; if the attempt lost its place (a long
//!    pause, a lapsed grant, a Redis restart) it pushes a "retry" and the thread re-runs step 1
//!    with the same attempt. So does a wait that failed (the blocking connection broke, and a
//!    message may have been lost with it): with the same attempt, `acquire.lua` keeps the place,
//!    or returns a grant whose wake-up was lost.
//! 5. A waiter whose time runs out leaves with `leave.lua`, which takes a grant that reached it
//!    meanwhile rather than wasting it; a waiter that fails hands such a grant on. Both act on
//!    this attempt only, so a late copy never touches the thread's later waits or holds.

use std::cell::Cell;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::boot_clock::BootInstant;
use crate::client::ClientInner;
use crate::connection::Conn;
use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::janitor::SharedWitness;
use crate::lock::{ms, FairLock, Wait};
use crate::raw::{
    self, judge_handoff, Acquire, Call, Handoff, LateAcquire, Leave, LeaveMode, Mode, Wake, Witness,
};
use crate::waker::{Event, Registration};

/// Failed waits (the waker's connection failed) or late grants, each within
/// [`FAILURE_WINDOW`] of the one before, before a wait gives up with the error.
pub(crate) const MAX_WAIT_FAILURES: u32 = 3;
/// Connections the server may close under a wait (restarts), each within [`FAILURE_WINDOW`]
/// of the one before, before it gives up.
pub(crate) const MAX_DROPS: u32 = 10;
/// Failures further apart than this are isolated hiccups, not a server in trouble: the count
/// starts again. A wait may last hours, and a signal (a Ctrl-Z and `fg`), a restart or a
/// network blip now and then must not end it.
pub(crate) const FAILURE_WINDOW: Duration = Duration::from_secs(10);
/// The pause before a waiter asks again after its request failed (see
/// `Attempt::pause_before_asking_again`).
const REQUEST_PAUSE: Duration = Duration::from_millis(100);

/// How many failures of one kind came in a row, each within [`FAILURE_WINDOW`] of the last.
#[derive(Default)]
pub(crate) struct Streak {
    count: Cell<u32>,
    last: Cell<Option<Instant>>,
}

impl Streak {
    /// Count one more; returns the length of the streak it is in.
    pub(crate) fn add(&self) -> u32 {
        self.add_at(Instant::now())
    }

    fn add_at(&self, now: Instant) -> u32 {
        let in_streak = self
            .last
            .get()
            .is_some_and(|last| now.duration_since(last) < FAILURE_WINDOW);
        let count = if in_streak { self.count.get() + 1 } else { 1 };
        self.count.set(count);
        self.last.set(Some(now));
        count
    }
}

/// What one acquire request decided.
enum Requested {
    Granted { token: u64, expires: BootInstant },
    Busy,
    Queued { pttl_ms: i64 },
}

/// What a wait in the queue came to.
enum Queue {
    /// Granted with this token, the lease ending at `expires` by our (early) estimate.
    Granted { token: u64, expires: BootInstant },
    /// The deadline came and no grant with it.
    GaveUp,
    /// Run the acquire script again (the place was lost, or the wait failed).
    Again,
}

/// One acquire call of one thread: an attempt number the scripts tie its queue entry and its
/// grant to (see `raw`).
pub(crate) struct Attempt<'a> {
    lock: &'a FairLock,
    pub owner: String,
    pub number: u64,
    meta: String,
    /// Failures (failed waits, grants that arrived after their lease): a few in a row are
    /// worth re-checking, more mean the network or the server is in trouble.
    failures: Streak,
    /// Connections the server closed under this wait.
    drops: Streak,
    /// An acquire request of this attempt went unanswered or was sent again, so a copy of it
    /// may still reach Redis after the attempt ends (see [`LateAcquire`]): its leave, or the
    /// release of the hold it got, leaves a mark that makes such a copy do nothing.
    unanswered: Cell<bool>,
    /// The newest request that found this attempt queued: a grant popped later is placed
    /// after it by its token (see `lease_estimate`).
    witness: SharedWitness,
}

/// How a wait on the wake list ended.
enum Waited {
    /// The lock was granted to this attempt with this token.
    /// `acked`: replicas that acknowledged it, when acknowledgements are asked for.
    Handoff { token: u64, acked: Option<u32> },
    /// The caller's deadline came; it still has to leave the queue.
    Deadline,
    /// The attempt's queue entry was dropped: run acquire again.
    Again,
    /// The server dropped the connection (a restart): run acquire again (with the same attempt
    /// it keeps the place, or returns a grant whose wake-up was lost).
    Dropped,
}

impl<'a> Attempt<'a> {
    fn client(&self) -> &ClientInner {
        self.lock.client()
    }

    pub fn new(lock: &'a FairLock) -> Attempt<'a> {
        let client = lock.client();
        Attempt {
            lock,
            owner: client.owner(),
            number: client.next_attempt(),
            meta: client.meta(),
            failures: Streak::default(),
            drops: Streak::default(),
            unanswered: Cell::new(false),
            witness: Arc::new(Mutex::new(Witness::none(BootInstant::now()))),
        }
    }

    /// Take the lock, queue for it and wait as `wait` allows; `None` when it did not come.
    pub fn run(&self, wait: Wait) -> Result<Option<LockGuard>> {
        let mode = match wait {
            Wait::No => Mode::Try,
            Wait::Until(_) | Wait::Forever => Mode::Wait,
        };
        // a hold this thread leaked on purpose is waited for; any other older hold of it has no
        // guard and is passed on by the script (see acquire.lua)
        let raw = self.lock.raw();
        let call = if crate::hold::leaked_and_running(&self.lock.hold_key()) {
            raw.acquire_behind_leaked_hold(
                &self.owner,
                self.number,
                self.lock.lease(),
                mode,
                &self.meta,
            )
        } else {
            raw.acquire(
                &self.owner,
                self.number,
                self.lock.lease(),
                mode,
                &self.meta,
            )
        };
        // before the request: a grant may be popped before its reply arrives
        let _waiting = (mode == Mode::Wait).then(crate::telemetry::Waiting::start);
        let registration = (mode == Mode::Wait).then(|| {
            let lock_key = self.lock.raw().key_names()[0];
            let thread = self.client().thread_number();
            self.client()
                .wakers
                .for_waiter(lock_key, thread)
                .register(self.number)
        });
        let mut queued = false;
        loop {
            let sent = BootInstant::now();
            let requested = match self.request(&call, sent) {
                Ok(requested) => requested,
                // asking again from the queue: a server that restarts (a dropped connection,
                // then LOADING while it reads its data) or a failed request costs a pause, not
                // the place; failures count as those of the wait
                Err(e) if queued && e.is_connection() => {
                    self.pause_before_asking_again(e, wait)?;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let grant = match requested {
                Requested::Granted { token, expires } => Some((token, expires)),
                Requested::Busy => {
                    if self.unanswered.get() {
                        // a copy of this try may still arrive and find the lock free: the
                        // leave's left mark makes it do nothing
                        self.leave_quietly();
                    }
                    return Ok(None);
                }
                Requested::Queued { pttl_ms } => {
                    queued = true;
                    let Some(registration) = &registration else {
                        return Err(Error::protocol(
                            "acquire queued an attempt made with 'try'".to_string(),
                        ));
                    };
                    match self.wait_in_queue(registration, wait, pttl_ms)? {
                        Queue::Granted { token, expires } => Some((token, expires)),
                        Queue::GaveUp => return Ok(None),
                        Queue::Again => None,
                    }
                }
            };
            if let Some((token, expires)) = grant {
                if let Some(guard) = self.fresh_hold(token, expires)? {
                    if queued {
                        // a release handed it over (or a janitor, from a dead holder)
                        crate::telemetry::handoff(
                            self.client()
                                .config
                                .metrics_lock_label
                                .then_some(self.lock.name()),
                        );
                    }
                    return Ok(Some(guard));
                }
            }
        }
    }

    /// After a queued attempt's request failed with `e`: wait a little before asking again,
    /// or fail with `e` when the wait's deadline has passed or failures came too often
    /// ([`MAX_WAIT_FAILURES`]). A server still loading its data after a restart is no failure:
    /// the waiter asks again until it is loaded (or its deadline).
    fn pause_before_asking_again(&self, e: Error, wait: Wait) -> Result<()> {
        let deadline = match wait {
            Wait::Until(d) => Some(d),
            Wait::No | Wait::Forever => None,
        };
        let expired = deadline.is_some_and(|d| d <= Instant::now());
        if expired || (!e.is_loading() && self.failures.add() >= MAX_WAIT_FAILURES) {
            return Err(e);
        }
        log::debug!(
            "fairlock: asking again for {:?} failed ({e}); asking again soon",
            self.lock.name()
        );
        let pause = deadline.map_or(REQUEST_PAUSE, |d| {
            REQUEST_PAUSE.min(d.saturating_duration_since(Instant::now()))
        });
        std::thread::sleep(pause);
        Ok(())
    }

    /// Run the acquire script once (sent at `sent`).
    fn request(&self, call: &Call<Acquire>, sent: BootInstant) -> Result<Requested> {
        let reply = self.run_granting(call, |r| matches!(r, Acquire::Granted(_)))?;
        Ok(match reply {
                Acquire::Granted(g) => Requested::Granted {
                    token: g.token,
                    expires: sent + ms(g.pttl_ms).min(self.lock.lease()),
                },
                Acquire::Busy { .. } => Requested::Busy,
                Acquire::Stale if self.abandoned() => {
                    return Err(Error::Abandoned {
                        name: self.lock.name().to_string(),
                    })
                }
                Acquire::Stale => {
                    return Err(Error::protocol(format!(
                        "Redis knows a newer attempt of owner {} than this one, or that this one left (WaitCanceller::abandon); is the client id shared with another process?",
                        self.owner
                    )))
                }
                Acquire::Queued {
                    pttl_ms,
                    last_token,
                    ..
                } => {
                    self.witness.lock().observe(sent, last_token);
                    Requested::Queued { pttl_ms }
                }
        })
    }

    /// Run `call`; a reply that `granted` says grants this attempt the lock must, with replica
    /// acknowledgements asked for, have them (else it is given up: [`Error::NotReplicated`]).
    /// A request sent more than once, or without a reply, may still arrive: noted for the end
    /// of the attempt (its leave or its release leaves a left mark). On a Cluster every request
    /// counts as sent more than once: the redis crate's cluster connection repeats a failed
    /// request on its own, unseen here.
    fn run_granting<T>(&self, call: &Call<T>, granted: fn(&T) -> bool) -> Result<T> {
        let mut sends = 0;
        let result = self.client().with_conn(call.during(), |c| {
            sends += 1;
            let reply = call.run(c);
            if reply.is_err() || sends > 1 || c.is_cluster() {
                self.unanswered.set(true);
            }
            let reply = reply?;
            let acked = if granted(&reply) {
                self.replica_acks(c)?
            } else {
                None
            };
            Ok((reply, acked))
        });
        let (reply, acked) = result?;
        self.check_replicated(acked)?;
        Ok(reply)
    }

    /// With replica acknowledgements asked for: how many replicas have what connection `c`
    /// just wrote or read, a grant (see [`raw::acknowledged_by_replicas`]).
    fn replica_acks(&self, c: &mut Conn) -> Result<Option<u32>> {
        let config = &self.client().config;
        if config.replica_acks == 0 {
            return Ok(None);
        }
        let key = self.lock.raw().key_names()[0];
        raw::acknowledged_by_replicas(c, key, config.replica_acks, config.replica_ack_timeout)
            .map(Some)
    }

    /// A grant to this attempt that fewer replicas acknowledged than asked for is given up
    /// (passed to the next waiter, or the lock left free): a failover could lose it and let a
    /// second owner in.
    fn check_replicated(&self, acked: Option<u32>) -> Result<()> {
        let wanted = self.client().config.replica_acks;
        match acked {
            Some(acked) if acked < wanted => {
                log::warn!(
                    "fairlock: a grant of {:?} reached {acked} of {wanted} replicas in time; passing it on",
                    self.lock.name()
                );
                self.leave_quietly();
                Err(Error::NotReplicated {
                    name: self.lock.name().to_string(),
                    acked,
                    wanted,
                })
            }
            _ => Ok(()),
        }
    }

    /// Queued: wait for the hand-off with the janitor keeping the place, and decide what the
    /// wait's end means.
    fn wait_in_queue(
        &self,
        registration: &Registration,
        wait: Wait,
        holder_pttl_ms: i64,
    ) -> Result<Queue> {
        let lock = self.lock;
        let janitor = &self.client().janitor;
        janitor.register(
            lock.raw(),
            &self.owner,
            self.number,
            ms(holder_pttl_ms),
            self.witness.clone(),
        );
        let outcome = self.wait_for_grant(registration, wait);
        janitor.unregister(&lock.raw().keys().lock, &self.owner);
        Ok(match outcome {
            Ok(Waited::Handoff { token, acked }) => {
                self.check_replicated(acked)?;
                // The grant's lease started after the newest request that saw an older last
                // token was sent (never trust the server clock or when the message arrived:
                // see lease_estimate); a grant it cannot place is confirmed with acquire.
                let witness = *self.witness.lock();
                match judge_handoff(token, witness, lock.lease(), BootInstant::now()) {
                    Handoff::Hold { expires } => Queue::Granted { token, expires },
                    Handoff::Confirm => {
                        log::debug!(
                            "fairlock: a hand-off of {:?} (token {token}) is confirmed with Redis before it is held",
                            lock.name()
                        );
                        Queue::Again
                    }
                }
            }
            Ok(Waited::Deadline) => match self.leave_at_deadline()? {
                Some((token, expires)) => Queue::Granted { token, expires },
                None => Queue::GaveUp,
            },
            Ok(Waited::Again) => Queue::Again,
            Ok(Waited::Dropped) => {
                if self.drops.add() > MAX_DROPS {
                    return Err(Error::Connection {
                        during: "waiting for the lock",
                        detail: format!(
                            "the server closed {MAX_DROPS} connections in a row, each within {FAILURE_WINDOW:?} of the last"
                        ),
                        source: None,
                    });
                }
                Queue::Again
            }
            Err(e) => {
                if self.failures.add() >= MAX_WAIT_FAILURES {
                    return Err(e);
                }
                log::debug!(
                    "fairlock: waiting on {:?} failed ({e}); re-checking",
                    lock.name()
                );
                Queue::Again
            }
        })
    }

    /// Turn a grant into a guard, unless its lease already ran out by our (early) estimate: then
    /// the reply was held up (a stalled network, a stopped process) and another owner may hold
    /// the lock by now, so it must not become a guard. `None` means: run acquire again (with this
    /// attempt it returns the grant with a fresh lease if the lock is still ours, and queues us
    /// otherwise). After `MAX_WAIT_FAILURES` late grants in a row, fail.
    fn fresh_hold(&self, token: u64, expires: BootInstant) -> Result<Option<LockGuard>> {
        if BootInstant::now() < expires {
            // the hold is this thread's only if no WaitCanceller gave the wait up first: the
            // claim and the canceller's take the same entry, and whoever takes it first wins
            // (a canceller that comes later does nothing; one that came first passes the grant
            // on, as this thread does too, in case the canceller's leave did not arrive)
            if !self.claim() {
                self.leave_quietly();
                return Err(Error::Abandoned {
                    name: self.lock.name().to_string(),
                });
            }
            let late = self.unanswered.get().then_some(self.number);
            return Ok(Some(LockGuard::new_hold(self.lock, token, expires, late)));
        }
        log::warn!(
            "fairlock: a grant of {:?} arrived after its lease had run out; re-checking",
            self.lock.name()
        );
        if self.failures.add() >= MAX_WAIT_FAILURES {
            return Err(Error::Connection {
                during: "acquiring",
                detail: format!(
                    "{MAX_WAIT_FAILURES} grants arrived after their lease of {:?} had run out",
                    self.lock.lease()
                ),
                source: None,
            });
        }
        Ok(None)
    }

    /// Wait until the waker hands over a hand-off or retry for this attempt, or the deadline.
    fn wait_for_grant(&self, registration: &Registration, wait: Wait) -> Result<Waited> {
        let deadline = match wait {
            Wait::No => return Ok(Waited::Deadline),
            Wait::Forever => None,
            Wait::Until(d) => Some(d),
        };
        if deadline.is_some_and(|d| d <= Instant::now()) {
            return Ok(Waited::Deadline);
        }
        registration.watch(&self.lock.raw().wake_key(&self.owner));
        Ok(match registration.next(deadline) {
            None => Waited::Deadline,
            Some(Event::Wake {
                wake: Wake::Grant { token, .. },
                acked,
            }) => Waited::Handoff { token, acked },
            Some(Event::Wake {
                wake: Wake::Retry { .. },
                ..
            }) => Waited::Again,
            Some(Event::Dropped) => Waited::Dropped,
            Some(Event::Failed(e)) => return Err(e),
        })
    }

    /// The deadline passed: leave the queue, but keep a grant that reached us meanwhile
    /// (returned as its token and lease end).
    fn leave_at_deadline(&self) -> Result<Option<(u64, BootInstant)>> {
        let call = self.lock.raw().leave(
            &self.owner,
            self.number,
            LeaveMode::Claim,
            self.late_acquire(),
        );
        let at = BootInstant::now();
        let reply = self.run_granting(&call, |r| matches!(r, Leave::Granted(_)))?;
        Ok(match reply {
            Leave::Granted(g) => Some((g.token, at + ms(g.pttl_ms).min(self.lock.lease()))),
            Leave::Left | Leave::Passed { .. } => None,
        })
    }

    /// This attempt's entry in the client's `waiting` map, which a [`WaitCanceller`] takes.
    ///
    /// [`WaitCanceller`]: crate::WaitCanceller
    fn waiting_key(&self) -> (String, String) {
        (self.lock.raw().keys().lock.clone(), self.owner.clone())
    }

    /// Take this attempt's `waiting` entry: `false` when a canceller took it first.
    fn claim(&self) -> bool {
        self.client().waiting.lock().remove(&self.waiting_key()) == Some(self.number)
    }

    /// Whether a canceller gave this attempt up (its `waiting` entry is gone).
    fn abandoned(&self) -> bool {
        self.client().waiting.lock().get(&self.waiting_key()) != Some(&self.number)
    }

    fn late_acquire(&self) -> LateAcquire {
        if self.unanswered.get() {
            LateAcquire::Possible
        } else {
            LateAcquire::Impossible
        }
    }

    /// After an error: give up the queue place and hand on anything granted to this attempt.
    pub fn leave_quietly(&self) {
        let call = self.lock.raw().leave(
            &self.owner,
            self.number,
            LeaveMode::Pass,
            self.late_acquire(),
        );
        if let Err(e) = self.client().with_conn(call.during(), |c| call.run(c)) {
            log::debug!(
                "fairlock: could not leave the queue of {:?}: {e}",
                self.lock.name()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Failures further apart than the window start the count again. Before, the failure count was
    /// never reset, so three isolated hiccups in an hours-long wait ended it.
    #[test]
    fn failures_further_apart_than_the_window_start_the_count_again() {
        let s = Streak::default();
        let t0 = Instant::now();
        let minute = Duration::from_secs(60);
        assert_eq!(s.add_at(t0), 1);
        assert_eq!(s.add_at(t0 + minute), 1);
        assert_eq!(s.add_at(t0 + 2 * minute), 1);
        // a burst is a streak
        let t1 = t0 + 3 * minute;
        assert_eq!(s.add_at(t1), 1);
        assert_eq!(s.add_at(t1 + Duration::from_millis(10)), 2);
        assert_eq!(s.add_at(t1 + Duration::from_millis(20)), 3);
        assert_eq!(s.add_at(t1 + FAILURE_WINDOW * 2), 1);
    }

    /// A read interrupted by a signal (a Ctrl-Z and `fg`) is no failure of the server: it is
    /// re-checked like a dropped connection. Before, it counted as a failure.
    #[test]
    fn a_read_interrupted_by_a_signal_is_recognised() {
        use crate::connection::is_interrupted;
        let eintr = redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::Interrupted));
        assert!(is_interrupted(&eintr), "{eintr}");
        let timeout = redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        assert!(!is_interrupted(&timeout), "{timeout}");
    }
}
