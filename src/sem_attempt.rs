//! One acquire call for permits of a semaphore (or a read/write lock) that may have to wait: a
//! `PermitAttempt`. The same path as a lock's `Attempt` (see `attempt.rs`, which tells it in
//! full), with the semaphore's scripts:
//! 1. `sem_acquire.lua` takes the permits at once (nobody queued and they fit), or queues the
//!    attempt with the number of permits it wants.
//! 2. The thread waits through the client's waker (one BLPOP for all of a client's waiters) for
//!    the wake-up a release, an expiry or a revoked hand-off pushes when the grant loop reaches
//!    it; the janitor keeps its queue place alive meanwhile.
//! 3. A hand-off is held if its lease can be placed (`lease_estimate`), else confirmed by
//!    running the acquire again with the same attempt, which returns the hold.
//! 4. At its deadline a waiter leaves with `claim` (a hold granted meanwhile is kept); after an
//!    error it leaves passing on what reached it. Every call names the attempt, so a late copy
//!    never acts on a later wait or hold; a request that went unanswered or was sent twice makes
//!    the attempt's end leave a left mark.

use std::cell::Cell;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use crate::attempt::{Streak, FAILURE_WINDOW, MAX_DROPS, MAX_WAIT_FAILURES};
use crate::boot_clock::BootInstant;
use crate::client::ClientInner;
use crate::error::{Error, Result};
use crate::janitor::SharedWitness;
use crate::lock::Wait;
use crate::permit::Permit;
use crate::raw::{self, judge_handoff, Call, Handoff, Mode, SemAcquire, SemLeave, Wake, Witness};
use crate::semaphore::Semaphore;
use crate::waker::{Event, Registration};

/// A grant that reached the attempt: its token and the lease's end by our (early) estimate.
type Grant = (u64, BootInstant);

/// What a wait in the queue came to.
enum Queue {
    Granted(Grant),
    /// The deadline came and no grant with it.
    GaveUp,
    /// Run the acquire script again (the place was lost, the wait failed, or a hand-off must be
    /// confirmed).
    Again,
}

pub(crate) struct PermitAttempt<'a> {
    sem: &'a Semaphore,
    permits: u64,
    owner: String,
    number: u64,
    meta: String,
    failures: Streak,
    drops: Streak,
    /// A request of this attempt went unanswered or was sent twice: its end leaves a left mark.
    unanswered: Cell<bool>,
    witness: SharedWitness,
}

impl<'a> PermitAttempt<'a> {
    pub fn new(sem: &'a Semaphore, permits: u64) -> PermitAttempt<'a> {
        let client = sem.client();
        PermitAttempt {
            sem,
            permits,
            owner: client.owner(),
            number: client.next_attempt(),
            meta: client.meta(),
            failures: Streak::default(),
            drops: Streak::default(),
            unanswered: Cell::new(false),
            witness: Arc::new(Mutex::new(Witness::none(BootInstant::now()))),
        }
    }

    fn client(&self) -> &ClientInner {
        self.sem.client()
    }

    /// Take the permits, queueing and waiting as `wait` allows; `None` when they did not come.
    pub fn run(&self, wait: Wait) -> Result<Option<Permit>> {
        // a WaitCanceller takes this entry to end the wait
        self.client()
            .waiting
            .lock()
            .insert(self.waiting_key(), self.number);
        let result = self.run_inner(wait);
        self.client().waiting.lock().remove(&self.waiting_key());
        if result.is_err() {
            // even a first request may have been applied (queued, or granted) before its reply
            // was lost: leave, handing on anything granted to this attempt
            self.leave_quietly();
        }
        result
    }

    fn run_inner(&self, wait: Wait) -> Result<Option<Permit>> {
        let mode = match wait {
            Wait::No => Mode::Try,
            Wait::Until(_) | Wait::Forever => Mode::Wait,
        };
        let raw = self.sem.raw();
        let call = raw.acquire(
            &self.owner,
            self.number,
            self.permits,
            self.sem.lease(),
            mode,
            &self.meta,
        );
        // before the request: a grant may be popped before its reply arrives
        let registration = (mode == Mode::Wait).then(|| {
            self.client()
                .wakers
                .for_waiter(raw.key_names()[0], self.client().thread_number())
                .register(self.number)
        });
        let mut queued = false;
        loop {
            let sent = BootInstant::now();
            let reply = match self.run_granting(&call, |r| matches!(r, SemAcquire::Granted { .. }))
            {
                Ok(reply) => reply,
                Err(e) if queued && e.is_connection() => {
                    self.pause_before_asking_again(e, wait)?;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let grant = match reply {
                SemAcquire::Granted { token, pttl, .. } => {
                    Some((token, sent + pttl.min(self.sem.lease())))
                }
                SemAcquire::Busy { .. } => {
                    if self.unanswered.get() {
                        self.leave_quietly();
                    }
                    return Ok(None);
                }
                SemAcquire::Stale if self.abandoned() => {
                    return Err(Error::Abandoned {
                        name: self.sem.name().to_string(),
                    })
                }
                SemAcquire::Stale => {
                    return Err(Error::protocol(format!(
                        "Redis knows a newer attempt of owner {} than this one, or that this one left (WaitCanceller::abandon); is the client id shared with another process?",
                        self.owner
                    )))
                }
                SemAcquire::Mismatch { kind, capacity } => {
                    return Err(self.sem.mismatch(&kind, capacity));
                }
                SemAcquire::Queued { last_token, .. } => {
                    self.witness.lock().observe(sent, last_token);
                    queued = true;
                    let Some(registration) = &registration else {
                        return Err(Error::protocol(
                            "sem_acquire queued an attempt made with 'try'".into(),
                        ));
                    };
                    match self.wait_in_queue(registration, wait)? {
                        Queue::Granted(grant) => Some(grant),
                        Queue::GaveUp => return Ok(None),
                        Queue::Again => None,
                    }
                }
            };
            if let Some((token, expires)) = grant {
                if BootInstant::now() < expires {
                    // the permits are this thread's only if no WaitCanceller gave the wait up
                    // first (whoever takes the entry first wins; see `Attempt::fresh_hold`)
                    if !self.claim() {
                        self.leave_quietly();
                        return Err(Error::Abandoned {
                            name: self.sem.name().to_string(),
                        });
                    }
                    return Ok(Some(Permit::new(
                        self.sem,
                        &self.owner,
                        self.number,
                        self.permits,
                        token,
                        expires,
                        self.unanswered.get(),
                    )));
                }
                // the reply was held up past the lease: run acquire again (it returns the hold
                // with a fresh lease if it is still ours)
                log::warn!(
                    "fairlock: a grant of {:?} arrived after its lease had run out; re-checking",
                    self.sem.name()
                );
                if self.failures.add() >= MAX_WAIT_FAILURES {
                    return Err(Error::Connection {
                        during: "acquiring permits",
                        detail: format!(
                            "{MAX_WAIT_FAILURES} grants arrived after their lease of {:?} had run out",
                            self.sem.lease()
                        ),
                        source: None,
                    });
                }
            }
        }
    }

    fn waiting_key(&self) -> (String, String) {
        (
            self.sem.raw().key_names()[0].to_string(),
            self.owner.clone(),
        )
    }

    /// Take this attempt's `waiting` entry: `false` when a canceller took it first.
    fn claim(&self) -> bool {
        self.client().waiting.lock().remove(&self.waiting_key()) == Some(self.number)
    }

    /// Whether a canceller gave this attempt up (its `waiting` entry is gone).
    fn abandoned(&self) -> bool {
        self.client().waiting.lock().get(&self.waiting_key()) != Some(&self.number)
    }

    /// As `Attempt::pause_before_asking_again`: a queued waiter whose request failed asks again
    /// after a pause, unless its deadline passed or failures came too often.
    fn pause_before_asking_again(&self, e: Error, wait: Wait) -> Result<()> {
        let deadline = match wait {
            Wait::Until(d) => Some(d),
            Wait::No | Wait::Forever => None,
        };
        if deadline.is_some_and(|d| d <= Instant::now())
            || (!e.is_loading() && self.failures.add() >= MAX_WAIT_FAILURES)
        {
            return Err(e);
        }
        let pause = std::time::Duration::from_millis(100);
        std::thread::sleep(deadline.map_or(pause, |d| {
            pause.min(d.saturating_duration_since(Instant::now()))
        }));
        Ok(())
    }

    /// Run `call`; a reply that `granted` says grants the permits must, with replica
    /// acknowledgements asked for, have them (else they are given up). A request sent more than
    /// once or without a reply (and every request on a Cluster) may still arrive: noted.
    fn run_granting<T>(&self, call: &Call<T>, granted: fn(&T) -> bool) -> Result<T> {
        let mut sends = 0;
        let config = &self.client().config;
        let key = self.sem.raw().key_names()[0];
        let (reply, acked) = self.client().with_conn(call.during(), |c| {
            sends += 1;
            let reply = call.run(c);
            if reply.is_err() || sends > 1 || c.is_cluster() {
                self.unanswered.set(true);
            }
            let reply = reply?;
            let acked = if granted(&reply) && config.replica_acks > 0 {
                Some(raw::acknowledged_by_replicas(
                    c,
                    key,
                    config.replica_acks,
                    config.replica_ack_timeout,
                )?)
            } else {
                None
            };
            Ok((reply, acked))
        })?;
        self.check_replicated(acked)?;
        Ok(reply)
    }

    fn check_replicated(&self, acked: Option<u32>) -> Result<()> {
        let wanted = self.client().config.replica_acks;
        match acked {
            Some(acked) if acked < wanted => {
                log::warn!(
                    "fairlock: a grant of {:?} reached {acked} of {wanted} replicas in time; passing it on",
                    self.sem.name()
                );
                self.leave_quietly();
                Err(Error::NotReplicated {
                    name: self.sem.name().to_string(),
                    acked,
                    wanted,
                })
            }
            _ => Ok(()),
        }
    }

    fn wait_in_queue(&self, registration: &Registration, wait: Wait) -> Result<Queue> {
        let raw = self.sem.raw();
        let janitor = &self.client().janitor;
        janitor.register(
            raw,
            &self.owner,
            self.number,
            self.sem.lease(),
            self.witness.clone(),
        );
        let outcome = self.wait_for_grant(registration, wait);
        janitor.unregister(raw.key_names()[0], &self.owner);
        Ok(match outcome {
            Ok(Some(Event::Wake {
                wake: Wake::Grant { token, .. },
                acked,
            })) => {
                self.check_replicated(acked)?;
                let witness = *self.witness.lock();
                match judge_handoff(token, witness, self.sem.lease(), BootInstant::now()) {
                    Handoff::Hold { expires } => Queue::Granted((token, expires)),
                    Handoff::Confirm => Queue::Again,
                }
            }
            Ok(Some(Event::Wake {
                wake: Wake::Retry { .. },
                ..
            })) => Queue::Again,
            Ok(None) => match self.leave_at_deadline()? {
                Some(grant) => Queue::Granted(grant),
                None => Queue::GaveUp,
            },
            Ok(Some(Event::Dropped)) => {
                if self.drops.add() > MAX_DROPS {
                    return Err(Error::Connection {
                        during: "waiting for permits",
                        detail: format!(
                            "the server closed {MAX_DROPS} connections in a row, each within {FAILURE_WINDOW:?} of the last"
                        ),
                        source: None,
                    });
                }
                Queue::Again
            }
            Ok(Some(Event::Failed(e))) | Err(e) => {
                if self.failures.add() >= MAX_WAIT_FAILURES {
                    return Err(e);
                }
                log::debug!(
                    "fairlock: waiting on {:?} failed ({e}); re-checking",
                    self.sem.name()
                );
                Queue::Again
            }
        })
    }

    /// The next event for this attempt; `None` when the deadline came first.
    fn wait_for_grant(&self, registration: &Registration, wait: Wait) -> Result<Option<Event>> {
        let deadline = match wait {
            Wait::No => return Ok(None),
            Wait::Forever => None,
            Wait::Until(d) => Some(d),
        };
        if deadline.is_some_and(|d| d <= Instant::now()) {
            return Ok(None);
        }
        registration.watch(&self.sem.raw().wake_key(&self.owner));
        Ok(registration.next(deadline))
    }

    /// The deadline passed: leave the queue, but keep permits granted meanwhile.
    fn leave_at_deadline(&self) -> Result<Option<Grant>> {
        let call = self
            .sem
            .raw()
            .leave(&self.owner, self.number, self.unanswered.get(), true);
        let at = BootInstant::now();
        let reply = self.run_granting(&call, |r| matches!(r, SemLeave::Granted { .. }))?;
        Ok(match reply {
            SemLeave::Granted { token, pttl, .. } => Some((token, at + pttl.min(self.sem.lease()))),
            SemLeave::Left | SemLeave::Passed { .. } => None,
        })
    }

    /// After an error: give up the queue place and hand on anything granted to this attempt.
    fn leave_quietly(&self) {
        let call = self
            .sem
            .raw()
            .leave(&self.owner, self.number, self.unanswered.get(), false);
        if let Err(e) = self.client().with_conn(call.during(), |c| call.run(c)) {
            log::debug!(
                "fairlock: could not leave the queue of {:?}: {e}",
                self.sem.name()
            );
        }
    }
}
