//! The one acquisition engine: an [`Attempt`] of one thread to take a [`Primitive`] (a lock, or
//! permits of a semaphore or read/write lock), which may have to wait.
//!
//! How a waiter waits (the whole wake-up path is here and in the scripts' grant loop):
//! 1. Each acquire call is an *attempt* with a number of its own. The primitive's acquire
//!    script either grants it (nobody queued and it fits: the primitive's admission rule) or
//!    puts the attempt in the FIFO queue.
//! 2. The thread registers its attempt with the client's `waker` before the request, and then
//!    waits: either as the *leader*, blocking in the one BLPOP that covers this client's wake
//!    lists of every lock its threads wait on, or on a channel of its own, for the leader to hand
//!    it its message. Waiting costs no connection per thread.
//! 3. The release that makes this attempt fit grants it inside the script and pushes
//!    `<thread>|g|<attempt>|<token>|<time>` (a hand-off) to this client's wake list: this
//!    thread (as the leader, usually) pops it and holds with no further round trip, if the
//!    grant's lease can be placed (`lease_estimate`); otherwise it confirms the grant by
//!    running the acquire again with the same attempt. A push that lands before the BLPOP
//!    covers the list stays in it, so no wake-up is lost.
//! 4. The janitor keeps the queue entry alive meanwhile; if the attempt lost its place (a long
//!    pause, a lapsed grant, a Redis restart) it pushes a "retry" and the thread re-runs step 1
//!    with the same attempt. So does a wait that failed (the blocking connection broke, and a
//!    message may have been lost with it): with the same attempt, the acquire keeps the place,
//!    or returns a grant whose wake-up was lost.
//! 5. A waiter whose time runs out leaves with `claim`, which takes a grant that reached it
//!    meanwhile rather than wasting it; a waiter that fails leaves passing such a grant on.
//!    Both act on this attempt only, so a late copy never touches the thread's later waits or
//!    holds; a request that went unanswered or was sent twice makes the attempt's end leave a
//!    left mark.

use std::cell::Cell;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::primitive::{Asked, Left, Primitive};
use super::wait::Wait;
use crate::background::janitor::SharedWitness;
use crate::background::waker::{Event, Registration};
use crate::boot_clock::BootInstant;
use crate::client::ClientInner;
use crate::connection::Conn;
use crate::cycle::Deadlock;
use crate::deadlock::chase::{self, first_due, next_due, Due, IndexedWait};
use crate::error::{Error, Result};
use crate::kind::HoldKind;
use crate::raw::{self, judge_handoff, Call, Handoff, Mode, Wake, Witness};
use crate::telemetry::Outcome;

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

/// A grant an attempt holds now: each handle turns it into its guard.
pub(crate) struct Granted {
    pub owner: String,
    pub attempt: u64,
    pub token: u64,
    /// The lease's end by our (early) estimate.
    pub expires: BootInstant,
    /// A request of the attempt went unanswered or was sent twice, so a copy of it may still
    /// reach Redis: the hold's release leaves a left mark that makes such a copy do nothing.
    pub late_acquire: bool,
    /// Granted by a hand-off (the attempt queued), not at once.
    pub handed_off: bool,
}

/// Take `primitive` as `wait` allows: `None` when it did not come in time (or at once, for
/// [`Wait::No`]). Counts the acquisition in the metrics, and leaves the queue after an error
/// (best effort: if Redis is unreachable, other clients' janitors purge the place once it goes
/// stale).
pub(crate) fn acquire<P: Primitive>(primitive: &P, wait: Wait) -> Result<Option<Granted>> {
    let started = Instant::now();
    let attempt = Attempt::new(primitive);
    // a WaitCanceller takes this entry to end the wait
    let key = attempt.waiting_key();
    let client = primitive.client();
    client.waiting.lock().insert(key.clone(), attempt.number);
    let result = attempt.run(wait);
    client.waiting.lock().remove(&key);
    attempt.unpublish();
    if result.is_err() {
        // even a first request may have been applied (queued, or granted) before its reply
        // was lost: leave, handing on anything granted to this attempt
        attempt.leave_quietly();
    }
    let outcome = match &result {
        Ok(Some(_)) => Outcome::Acquired,
        Ok(None) if matches!(wait, Wait::No) => Outcome::Busy,
        Ok(None) => Outcome::TimedOut,
        Err(Error::Abandoned { .. }) => Outcome::Abandoned,
        Err(Error::Deadlock { .. }) => Outcome::Deadlock,
        Err(_) => Outcome::Error,
    };
    let label = primitive.metric_label();
    crate::telemetry::acquisition(outcome, started.elapsed(), label);
    if let Ok(Some(granted)) = &result {
        if granted.handed_off {
            // a release handed it over (or a janitor, from a dead holder)
            crate::telemetry::handoff(label);
        }
    }
    result
}

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

/// What the waker brought, or the deadline.
enum Waited {
    /// Granted with this token. `acked`: replicas that acknowledged it, when acknowledgements
    /// are asked for.
    Handoff { token: u64, acked: Option<u32> },
    /// The caller's deadline came; it still has to leave the queue.
    Deadline,
    /// The attempt's queue entry was dropped: run acquire again.
    Again,
    /// A deadlock check found this wait the youngest of a confirmed cycle: leave.
    Deadlock(Box<Deadlock>),
    /// The server dropped the connection (a restart): run acquire again (with the same attempt
    /// it keeps the place, or returns a grant whose wake-up was lost).
    Dropped,
}

/// One acquire call of one thread: an attempt number the scripts tie its queue entry and its
/// grant to (see `raw`).
struct Attempt<'a, P: Primitive> {
    primitive: &'a P,
    owner: String,
    number: u64,
    meta: String,
    /// Failures (failed waits, grants that arrived after their lease): a few in a row are
    /// worth re-checking, more mean the network or the server is in trouble.
    failures: Streak,
    /// Connections the server closed under this wait.
    drops: Streak,
    /// A request of this attempt went unanswered or was sent again, so a copy of it may still
    /// reach Redis after the attempt ends: its leave, or the release of the hold it got, leaves
    /// a mark that makes such a copy do nothing.
    unanswered: Cell<bool>,
    /// The newest request that found this attempt queued: a grant popped later is placed
    /// after it by its token (see `lease_estimate`).
    witness: SharedWitness,
    /// With deadlock detection on: when the wait next publishes or checks, and which (see
    /// `deadlock_check`).
    detection: Cell<Option<Instant>>,
    due: Cell<Due>,
    /// The wait is in the client's index of long waits (to delete at its end).
    published: Cell<bool>,
}

impl<'a, P: Primitive> Attempt<'a, P> {
    fn new(primitive: &'a P) -> Attempt<'a, P> {
        let client = primitive.client();
        Attempt {
            primitive,
            owner: client.owner(),
            number: client.next_attempt(),
            meta: client.meta(),
            failures: Streak::default(),
            drops: Streak::default(),
            unanswered: Cell::new(false),
            witness: Arc::new(Mutex::new(Witness::none(BootInstant::now()))),
            detection: Cell::new(None),
            due: Cell::new(Due::Publish),
            published: Cell::new(false),
        }
    }

    fn client(&self) -> &ClientInner {
        self.primitive.client()
    }

    /// Take it, queueing and waiting as `wait` allows; `None` when it did not come.
    fn run(&self, wait: Wait) -> Result<Option<Granted>> {
        let mode = match wait {
            Wait::No => Mode::Try,
            Wait::Until(_) | Wait::Forever => Mode::Wait,
        };
        let call = self
            .primitive
            .acquire(&self.owner, self.number, mode, &self.meta);
        // before the request: a grant may be popped before its reply arrives
        let _waiting = (mode == Mode::Wait).then(crate::telemetry::Waiting::start);
        let registration = (mode == Mode::Wait).then(|| {
            self.client()
                .wakers
                .for_waiter(self.primitive.key(), self.client().thread_number())
                .register(self.number)
        });
        let mut queued = false;
        // with the janitor from its first queueing to its end (see `Heartbeated`)
        let mut heartbeated = None;
        loop {
            let sent = BootInstant::now();
            let asked = match self.request(&call) {
                Ok(asked) => asked,
                // asking again from the queue: a server that restarts (a dropped connection,
                // then LOADING while it reads its data) or a failed request costs a pause, not
                // the place; failures count as those of the wait
                Err(e) if queued && e.is_connection() => {
                    self.pause_before_asking_again(e, wait)?;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let grant = match asked {
                Asked::Granted { token, pttl } => {
                    Some((token, sent + pttl.min(self.primitive.lease())))
                }
                Asked::Busy => {
                    if self.unanswered.get() {
                        // a copy of this try may still arrive and find it free: the leave's
                        // left mark makes it do nothing
                        self.leave_quietly();
                    }
                    return Ok(None);
                }
                Asked::Stale if self.abandoned() => return Err(self.abandoned_error()),
                Asked::Stale => {
                    return Err(Error::protocol(format!(
                        "Redis knows a newer attempt of owner {} than this one, or that this one left (WaitCanceller::abandon); is the client id shared with another process?",
                        self.owner
                    )))
                }
                Asked::Queued {
                    holder_pttl,
                    last_token,
                } => {
                    self.witness.lock().observe(sent, last_token);
                    if !queued {
                        // the wait starts: it publishes `after` / 2 from now, and checks
                        // `after` from now (chase::first_due)
                        let first = self.client().config.deadlock_detection.map(first_due);
                        if let Some((_, due)) = first {
                            self.due.set(due);
                        }
                        self.detection
                            .set(first.and_then(|(at, _)| Instant::now().checked_add(at)));
                    }
                    queued = true;
                    heartbeated.get_or_insert_with(|| Heartbeated {
                        client: self.client(),
                        key: self.primitive.key(),
                        owner: &self.owner,
                    });
                    let Some(registration) = &registration else {
                        return Err(Error::protocol(
                            "an acquire made with 'try' was queued".to_string(),
                        ));
                    };
                    match self.wait_in_queue(registration, wait, holder_pttl)? {
                        Queue::Granted(grant) => Some(grant),
                        Queue::GaveUp => return Ok(None),
                        Queue::Again => None,
                    }
                }
            };
            if let Some((token, expires)) = grant {
                if self.fresh(expires)? {
                    return Ok(Some(Granted {
                        owner: self.owner.clone(),
                        attempt: self.number,
                        token,
                        expires,
                        late_acquire: self.unanswered.get(),
                        handed_off: queued,
                    }));
                }
            }
        }
    }

    /// Run the acquire request once.
    fn request(&self, call: &Call<P::Acquired>) -> Result<Asked> {
        self.run_granting(
            call,
            |reply| self.primitive.asked(reply),
            |asked| matches!(asked, Asked::Granted { .. }),
        )
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
            "fairlock: asking again for {} failed ({e}); asking again soon",
            self.primitive.held()
        );
        let pause = deadline.map_or(REQUEST_PAUSE, |d| {
            REQUEST_PAUSE.min(d.saturating_duration_since(Instant::now()))
        });
        std::thread::sleep(pause);
        Ok(())
    }

    /// Run `call` and read its reply with `read`; a reply that `granted` says grants this
    /// attempt must, with replica acknowledgements asked for, have them (else it is given up:
    /// [`Error::NotReplicated`]). A request sent more than once, or without a reply, may still
    /// arrive: noted for the end of the attempt (its leave or its release leaves a left mark).
    /// On a Cluster every request counts as sent more than once: the redis crate's cluster
    /// connection repeats a failed request on its own, unseen here.
    fn run_granting<T, U>(
        &self,
        call: &Call<T>,
        read: impl Fn(T) -> Result<U>,
        granted: fn(&U) -> bool,
    ) -> Result<U> {
        let mut sends = 0;
        let (reply, acked) = self.client().with_conn(call.during(), |c| {
            sends += 1;
            let reply = call.run(c);
            if reply.is_err() || sends > 1 || c.is_cluster() {
                self.unanswered.set(true);
            }
            let reply = read(reply?)?;
            let acked = if granted(&reply) {
                self.replica_acks(c)?
            } else {
                None
            };
            Ok((reply, acked))
        })?;
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
        let key = self.primitive.key();
        raw::acknowledged_by_replicas(c, key, config.replica_acks, config.replica_ack_timeout)
            .map(Some)
    }

    /// A grant to this attempt that fewer replicas acknowledged than asked for is given up
    /// (passed to the next waiter, or left free): a failover could lose it and let a second
    /// owner in.
    fn check_replicated(&self, acked: Option<u32>) -> Result<()> {
        let wanted = self.client().config.replica_acks;
        match acked {
            Some(acked) if acked < wanted => {
                log::warn!(
                    "fairlock: a grant of {} reached {acked} of {wanted} replicas in time; passing it on",
                    self.primitive.held()
                );
                self.leave_quietly();
                Err(Error::NotReplicated {
                    name: self.primitive.name().to_string(),
                    kind: self.primitive.kind(),
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
        holder_pttl: Duration,
    ) -> Result<Queue> {
        let janitor = &self.client().janitor;
        janitor.register(
            self.primitive.janitor_target(),
            &self.owner,
            self.number,
            holder_pttl,
            self.witness.clone(),
        );
        // (unregistered when the attempt ends: `Heartbeated`)
        let outcome = self.wait_for_grant(registration, wait);
        Ok(match outcome {
            Ok(Waited::Handoff { token, acked }) => {
                self.check_replicated(acked)?;
                // The grant's lease started after the newest request that saw an older last
                // token was sent (never trust the server clock or when the message arrived:
                // see lease_estimate); a grant it cannot place is confirmed with acquire.
                let witness = *self.witness.lock();
                let lease = self.primitive.lease();
                match judge_handoff(token, witness, lease, BootInstant::now()) {
                    Handoff::Hold { expires } => Queue::Granted((token, expires)),
                    Handoff::Confirm => {
                        log::debug!(
                            "fairlock: a hand-off of {} (token {token}) is confirmed with Redis before it is held",
                            self.primitive.held()
                        );
                        Queue::Again
                    }
                }
            }
            Ok(Waited::Deadline) => match self.leave_at_deadline()? {
                Some(grant) => Queue::Granted(grant),
                None => Queue::GaveUp,
            },
            Ok(Waited::Again) => Queue::Again,
            Ok(Waited::Deadlock(deadlock)) => match self.leave_at_deadline()? {
                // served meanwhile: the cycle is gone, and the grant is this attempt's
                Some(grant) => Queue::Granted(grant),
                None => {
                    return Err(Error::Deadlock {
                        name: self.primitive.name().to_string(),
                        kind: self.primitive.kind(),
                        deadlock,
                    })
                }
            },
            Ok(Waited::Dropped) => {
                if self.drops.add() > MAX_DROPS {
                    return Err(Error::Connection {
                        during: waiting_for(self.primitive.kind()),
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
                    "fairlock: waiting on {} failed ({e}); re-checking",
                    self.primitive.held()
                );
                Queue::Again
            }
        })
    }

    /// Whether a grant whose lease ends at `expires` may become a hold: not when its lease
    /// already ran out by our (early) estimate (the reply was held up, a stalled network or a
    /// stopped process, and another owner may hold it by now). `false` means: run acquire
    /// again (with this attempt it returns the grant with a fresh lease if it is still ours,
    /// and queues us otherwise). After `MAX_WAIT_FAILURES` late grants in a row, fail.
    fn fresh(&self, expires: BootInstant) -> Result<bool> {
        if BootInstant::now() < expires {
            // the hold is this thread's only if no WaitCanceller gave the wait up first: the
            // claim and the canceller's take the same entry, and whoever takes it first wins
            // (a canceller that comes later does nothing; one that came first passes the grant
            // on, as this thread does too, in case the canceller's leave did not arrive)
            if !self.claim() {
                self.leave_quietly();
                return Err(self.abandoned_error());
            }
            return Ok(true);
        }
        log::warn!(
            "fairlock: a grant of {} arrived after its lease had run out; re-checking",
            self.primitive.held()
        );
        if self.failures.add() >= MAX_WAIT_FAILURES {
            return Err(Error::Connection {
                during: "acquiring",
                detail: format!(
                    "{MAX_WAIT_FAILURES} grants arrived after their lease of {:?} had run out",
                    self.primitive.lease()
                ),
                source: None,
            });
        }
        Ok(false)
    }

    /// Wait until the waker hands over a hand-off or retry for this attempt, or the deadline.
    fn wait_for_grant(&self, registration: &Registration, wait: Wait) -> Result<Waited> {
        let deadline = match wait {
            Wait::No => return Ok(Waited::Deadline),
            Wait::Forever => None,
            Wait::Until(d) => Some(d),
        };
        registration.watch(&self.primitive.wake_key(&self.owner));
        let event = loop {
            if deadline.is_some_and(|d| d <= Instant::now()) {
                return Ok(Waited::Deadline);
            }
            // the deadlock check comes first when it is due before the deadline
            let check = self
                .detection
                .get()
                .filter(|c| deadline.is_none_or(|d| *c < d));
            match registration.next(check.or(deadline)) {
                Some(event) => break event,
                None if check.is_none() => return Ok(Waited::Deadline),
                None => {
                    if let Some(deadlock) = self.deadlock_check() {
                        return Ok(Waited::Deadlock(Box::new(deadlock)));
                    }
                }
            }
        };
        Ok(match event {
            Event::Wake {
                wake: Wake::Grant { token, .. },
                acked,
            } => Waited::Handoff { token, acked },
            Event::Wake {
                wake: Wake::Retry { .. },
                ..
            } => Waited::Again,
            Event::Dropped => Waited::Dropped,
            Event::Failed(e) => return Err(e),
        })
    }

    /// The wait has lasted `deadlock_detection`'s `after` / 2: publish it in the client's index
    /// of long waits. Then (`after` from its start, and every `after` from the end of the last
    /// check): publish (refresh) it and check whether it is the youngest wait of a confirmed
    /// cycle (`chase::check`); `chase::first_due` and `next_due` say when. A check that fails
    /// is logged and the wait goes on: detection is best effort, and never ends a wait by
    /// itself but to break a cycle it proved.
    fn deadlock_check(&self) -> Option<Deadlock> {
        let client = self.client();
        let after = client.config.deadlock_detection?;
        let wait = IndexedWait {
            kind: self.primitive.kind(),
            attempt: self.number,
            permits: self.primitive.permits(),
            name: self.primitive.name().to_string(),
        };
        let due = self.due.get();
        let checked = chase::publish(client, &self.owner, &wait, after)
            .inspect(|()| self.published.set(true))
            .and_then(|()| match due {
                Due::Publish => Ok(None),
                Due::Check => chase::check(client, &self.owner, &wait),
            });
        let (at, next) = next_due(after, due);
        self.due.set(next);
        self.detection
            .set(Instant::now().checked_add(at).or(self.detection.get()));
        match checked {
            Ok(found) => found,
            Err(e) => {
                if e.is_connection() {
                    log::debug!(
                        "fairlock: the deadlock check of the wait for {} failed ({e}); waiting on",
                        self.primitive.held()
                    );
                } else {
                    log::warn!(
                        "fairlock: the deadlock check of the wait for {} failed ({e}); waiting on",
                        self.primitive.held()
                    );
                }
                None
            }
        }
    }

    /// The wait ended: delete its entry in the index of long waits, if it made one (best
    /// effort: the entry's TTL bounds a stale one, and every hop is confirmed anyway).
    fn unpublish(&self) {
        if self.published.get() {
            if let Err(e) = chase::unpublish(self.client(), &self.owner) {
                log::debug!("fairlock: could not delete a long wait's index entry: {e}");
            }
        }
    }

    /// The deadline passed: leave the queue, but keep a grant that reached us meanwhile.
    fn leave_at_deadline(&self) -> Result<Option<Grant>> {
        let call = self
            .primitive
            .leave(&self.owner, self.number, true, self.unanswered.get());
        let at = BootInstant::now();
        let left = self.run_granting(
            &call,
            |reply| Ok(P::left(reply)),
            |left| matches!(left, Left::Granted { .. }),
        )?;
        Ok(match left {
            Left::Granted { token, pttl } => Some((token, at + pttl.min(self.primitive.lease()))),
            Left::Nothing | Left::Passed => None,
        })
    }

    /// This attempt's entry in the client's `waiting` map, which a `WaitCanceller` takes.
    fn waiting_key(&self) -> (String, String) {
        (self.primitive.key().to_string(), self.owner.clone())
    }

    /// Take this attempt's `waiting` entry: `false` when a canceller took it first.
    fn claim(&self) -> bool {
        self.client().waiting.lock().remove(&self.waiting_key()) == Some(self.number)
    }

    /// Whether a canceller gave this attempt up (its `waiting` entry is gone).
    fn abandoned(&self) -> bool {
        self.client().waiting.lock().get(&self.waiting_key()) != Some(&self.number)
    }

    fn abandoned_error(&self) -> Error {
        Error::Abandoned {
            name: self.primitive.name().to_string(),
            kind: self.primitive.kind(),
        }
    }

    /// After an error: give up the queue place and hand on anything granted to this attempt.
    fn leave_quietly(&self) {
        let call = self
            .primitive
            .leave(&self.owner, self.number, false, self.unanswered.get());
        if let Err(e) = self.client().with_conn(call.during(), |c| call.run(c)) {
            log::debug!(
                "fairlock: could not leave the queue of {}: {e}",
                self.primitive.held()
            );
        }
    }
}

/// A queued attempt's place in the janitor's list, kept from its first queueing until the
/// attempt ends (granted, given up or failed), not only while one of its waits lasts: between
/// two waits it asks again, and that request may hang for up to the read timeout (a stalled
/// connection, a failover), longer than the waiter timeout, while other clients' heartbeats
/// would purge a place nobody refreshes. Each wait registers the attempt again with what it
/// learned (`wait_in_queue`); dropping this takes it off.
struct Heartbeated<'a> {
    client: &'a ClientInner,
    key: &'a str,
    owner: &'a str,
}

impl Drop for Heartbeated<'_> {
    fn drop(&mut self) {
        self.client.janitor.unregister(self.key, self.owner);
    }
}

/// What a wait that failed was doing, for [`Error::Connection`].
fn waiting_for(kind: HoldKind) -> &'static str {
    match kind {
        HoldKind::Lock => "waiting for the lock",
        HoldKind::Semaphore => "waiting for permits",
        HoldKind::Read => "waiting for a read",
        HoldKind::Write => "waiting for the write",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Failures further apart than the window start the count again: three isolated hiccups in
    /// an hours-long wait must not end it.
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
    /// re-checked like a dropped connection.
    #[test]
    fn a_read_interrupted_by_a_signal_is_recognised() {
        use crate::connection::is_interrupted;
        let eintr = redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::Interrupted));
        assert!(is_interrupted(&eintr), "{eintr}");
        let timeout = redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        assert!(!is_interrupted(&timeout), "{timeout}");
    }
}
