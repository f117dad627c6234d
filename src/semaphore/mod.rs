//! [`Semaphore`]: the handle users take permits of a fair counting semaphore through, and
//! [`SemaphoreStatus`], its snapshot. Acquiring is the one engine's (`acquire/engine.rs`),
//! with the semaphore's scripts supplied as a [`Primitive`] ([`Permits`]); the protocol is
//! `docs/semaphores.md`.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(crate) mod permit;
pub(crate) mod rwlock;

use crate::acquire::{self, Asked, LeaseMode, Left, Primitive, Wait, WaitCanceller};
use crate::background::janitor::Target;
use crate::client::{ClientInner, LockClient};
use crate::config::validate_lease;
use crate::error::{Error, Result};
use crate::kind::HoldKind;
use crate::raw::{
    Call, Mode, RawSemaphore, SemAcquire, SemCapacity, SemKind, SemLeave, SemRelease, RW_CAPACITY,
};
use crate::semaphore::permit::Permit;
use crate::status::SemaphoreStatus;

/// The largest capacity of a [`Semaphore`].
pub const MAX_CAPACITY: u64 = 1_000_000;

/// A fair, crash-safe counting semaphore on Redis: at most `capacity` permits are held at once,
/// across threads, processes and machines. Cheap to clone; `Send + Sync`.
///
/// ```no_run
/// use std::time::Duration;
/// let client = fairlock::LockClient::connect("redis://127.0.0.1:6379/")?;
/// let slots = client.semaphore("render-slots", 4)?;
/// let permit = slots.acquire()?;                          // waits in FIFO order
/// let token = permit.fencing_token();                     // rising per semaphore name
/// drop(permit);                                           // gives the permit back
/// if let Some(three) = slots.try_acquire_many_for(3, Duration::from_secs(5))? {
///     // ... three permits' worth of work ...
///     three.release()?;
/// }
/// # let _ = token;
/// # Ok::<(), fairlock::Error>(())
/// ```
///
/// # Guarantees
/// - **Never more than capacity**: at no moment do live holds (their lease not run out) hold
///   more than `capacity` permits together; an acquisition of `n` permits counts `n`. Every
///   state change is one atomic Lua script.
/// - **FIFO, no starvation**: waiters are served in the order their first attempt reached
///   Redis. A request for `n` permits at the head of the queue is not overtaken by later small
///   requests: the grant stops at the first waiter that does not fit. `try_acquire` never jumps
///   the queue: while anyone waits it fails.
/// - **Crash safety**: every hold has a lease (30 s unless set otherwise) that the watchdog
///   renews while the [`Permit`] lives. A killed holder's permits come back when its lease
///   ends, and the waiters they fit are granted them at once (the janitor of any client with
///   waiters looks when the lease ends); a dead waiter's place lapses and a grant it never
///   picked up is revoked. Every key carries a TTL.
/// - **Fencing**: each acquisition gets a token greater than every one before it for this name
///   ([`Permit::fencing_token`]), across restarts and data loss as a lock's are (the server
///   clock in µs is its floor). A permit knows when it was lost ([`Permit::is_lost`],
///   [`Permit::lost_signal`]).
/// - **Capacity is part of the state**: while anyone holds or waits, the capacity is stored
///   with the name. A handle made with another capacity gets [`Error::CapacityMismatch`], never
///   a silent mix; [`Semaphore::set_capacity`] changes it for everyone, durably (for
///   [`Config::fence_ttl`](crate::Config::fence_ttl), used or not).
/// - **Late and repeated requests** (a lost reply, a request arriving after its sender gave
///   up, a retry) never act on another acquisition: every call names its attempt.
///
/// # Limits
/// As a lock's: a holder paused longer than its lease may still run while its permits are
/// someone else's, and a Redis that loses data (no persistence, a failover to a replica that
/// missed the last writes) forgets holds. A semaphore is not re-entrant: a thread that holds
/// permits and asks for more waits like anyone else, behind the queue.
#[derive(Clone)]
pub struct Semaphore {
    client: Arc<ClientInner>,
    name: Arc<str>,
    raw: Arc<RawSemaphore>,
    lease: LeaseMode,
}

impl LockClient {
    /// A handle to the semaphore `name` of `capacity` permits. Checks the name and capacity;
    /// does not talk to Redis (a capacity that disagrees with the stored one is found by the
    /// first acquisition: [`Error::CapacityMismatch`]).
    ///
    /// # Errors
    /// [`Error::InvalidName`] for a name that cannot be a key, [`Error::InvalidConfig`] for a
    /// capacity of 0 or above [`MAX_CAPACITY`].
    pub fn semaphore(&self, name: &str, capacity: u64) -> Result<Semaphore> {
        check_capacity(capacity)?;
        Semaphore::new(self.inner.clone(), name, SemKind::Semaphore, capacity)
    }
}

fn check_capacity(capacity: u64) -> Result<()> {
    if capacity == 0 || capacity > MAX_CAPACITY {
        return Err(Error::InvalidConfig {
            setting: "capacity",
            reason: format!("{capacity} is not within 1 ..= {MAX_CAPACITY}"),
        });
    }
    Ok(())
}

impl Semaphore {
    pub(crate) fn new(
        client: Arc<ClientInner>,
        name: &str,
        kind: SemKind,
        capacity: u64,
    ) -> Result<Semaphore> {
        let raw = RawSemaphore::new(
            &client.config.key_prefix,
            name,
            kind,
            capacity,
            client.protocol,
        )?;
        let lease = LeaseMode::Renewed(client.config.lease);
        Ok(Semaphore {
            client,
            name: name.into(),
            raw: Arc::new(raw),
            lease,
        })
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The capacity this handle was made with.
    pub fn capacity(&self) -> u64 {
        self.raw.capacity()
    }

    /// A handle to the same semaphore whose permits use `lease`, renewed by the watchdog.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a lease outside [`MIN_LEASE`](crate::MIN_LEASE) ..=
    /// [`MAX_LEASE`](crate::MAX_LEASE).
    pub fn with_lease(&self, lease: Duration) -> Result<Semaphore> {
        validate_lease("lease", lease)?;
        Ok(Semaphore {
            lease: LeaseMode::Renewed(lease),
            ..self.clone()
        })
    }

    /// A handle to the same semaphore whose permits run out after `lease` and are never
    /// renewed.
    ///
    /// # Errors
    /// As [`Semaphore::with_lease`].
    pub fn with_fixed_lease(&self, lease: Duration) -> Result<Semaphore> {
        validate_lease("fixed lease", lease)?;
        Ok(Semaphore {
            lease: LeaseMode::Fixed(lease),
            ..self.clone()
        })
    }

    /// Take one permit, waiting in FIFO order as long as it takes.
    ///
    /// # Errors
    /// [`Error::Connection`] when Redis fails (the queue place is given up then),
    /// [`Error::CapacityMismatch`] when the name is in use with another capacity,
    /// [`Error::ForeignData`] when another program's data sits at one of its keys,
    /// [`Error::Forked`] in a forked child.
    pub fn acquire(&self) -> Result<Permit> {
        self.acquire_many(1)
    }

    /// Take `permits` permits as one hold, waiting in FIFO order as long as it takes.
    ///
    /// # Errors
    /// As [`Semaphore::acquire`]; [`Error::InvalidConfig`] for 0 permits or more than the
    /// capacity.
    pub fn acquire_many(&self, permits: u64) -> Result<Permit> {
        self.take(permits, Wait::Forever)?
            .ok_or_else(|| Error::protocol("a wait without deadline ended without permits".into()))
    }

    /// Take one permit if it is free and nobody waits; never waits and never queues.
    ///
    /// # Errors
    /// As [`Semaphore::acquire`].
    pub fn try_acquire(&self) -> Result<Option<Permit>> {
        self.take(1, Wait::No)
    }

    /// Take `permits` permits if they are free and nobody waits; never waits and never queues.
    ///
    /// # Errors
    /// As [`Semaphore::acquire_many`].
    pub fn try_acquire_many(&self, permits: u64) -> Result<Option<Permit>> {
        self.take(permits, Wait::No)
    }

    /// Take one permit, waiting in FIFO order at most `timeout`; `Ok(None)` when the time ran
    /// out (the queue place is gone then).
    ///
    /// # Errors
    /// As [`Semaphore::acquire`].
    pub fn try_acquire_for(&self, timeout: Duration) -> Result<Option<Permit>> {
        self.try_acquire_many_for(1, timeout)
    }

    /// Take `permits` permits, waiting in FIFO order at most `timeout`.
    ///
    /// # Errors
    /// As [`Semaphore::acquire_many`].
    pub fn try_acquire_many_for(&self, permits: u64, timeout: Duration) -> Result<Option<Permit>> {
        self.take(permits, Wait::at_most(timeout))
    }

    /// Take one permit, waiting in FIFO order until `deadline` at the latest; `Ok(None)` when
    /// the deadline passed (the queue place is gone then).
    ///
    /// ```no_run
    /// # use std::time::{Duration, Instant};
    /// # let client = fairlock::LockClient::connect("redis://127.0.0.1:6379/")?;
    /// let slots = client.semaphore("render-slots", 4)?;
    /// let deadline = Instant::now() + Duration::from_secs(10); // one deadline for the whole job
    /// match slots.try_acquire_until(deadline)? {
    ///     Some(permit) => { /* render */ drop(permit); }
    ///     None => { /* no slot before the deadline */ }
    /// }
    /// # Ok::<(), fairlock::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`Semaphore::acquire`].
    pub fn try_acquire_until(&self, deadline: Instant) -> Result<Option<Permit>> {
        self.take(1, Wait::Until(deadline))
    }

    /// Take `permits` permits, waiting in FIFO order until `deadline` at the latest.
    ///
    /// # Errors
    /// As [`Semaphore::acquire_many`].
    pub fn try_acquire_many_until(
        &self,
        permits: u64,
        deadline: Instant,
    ) -> Result<Option<Permit>> {
        self.take(permits, Wait::Until(deadline))
    }

    /// Permits free now (capacity less the permits held; a waiter may be about to take them).
    /// One read from Redis.
    ///
    /// # Errors
    /// [`Error::Connection`] when Redis cannot be reached.
    pub fn available(&self) -> Result<u64> {
        let status = self.status()?;
        let capacity = status.capacity.unwrap_or(self.capacity());
        Ok(capacity.saturating_sub(status.permits_held))
    }

    /// Holders (with their permits) and waiters in queue order, read in one atomic step.
    ///
    /// # Errors
    /// [`Error::Connection`] when Redis cannot be reached, [`Error::ForeignData`].
    pub fn status(&self) -> Result<SemaphoreStatus> {
        let call = self.raw.status();
        let raw = self.client.with_conn(call.during(), |c| call.run(c))?;
        Ok(SemaphoreStatus::from_raw(&self.name, raw))
    }

    /// Change the capacity stored with the name to `capacity`, for every client, and return a
    /// handle with it (handles made with the old capacity get [`Error::CapacityMismatch`] from
    /// then on). A raise grants the waiters that now fit at once. A cut revokes nothing:
    /// holders above the new capacity keep their permits until they give them back or their
    /// lease ends, and no permit is granted until the permits held and the head's request fit.
    /// A waiter that wants more than the new capacity loses its place and gets
    /// [`Error::CapacityMismatch`], even if the holders give their permits back before its
    /// retry runs; a granted or queued acquisition made through an old handle keeps what it
    /// has. The capacity set is **durable**: it is stored whether or not anyone uses the name,
    /// and every handle must agree with it, even when nobody holds or waits, until
    /// [`Config::fence_ttl`](crate::Config::fence_ttl) (7 days by default) has passed since the last
    /// `set_capacity` or another one changes it; then an idle name takes the capacity of the
    /// next acquisition again. So change every user's capacity too, or their handles get
    /// [`Error::CapacityMismatch`] meanwhile.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a capacity of 0 or above [`MAX_CAPACITY`], or on a
    /// read/write lock ([`RwLock::as_semaphore`](crate::RwLock::as_semaphore)), whose capacity
    /// is fixed;
    /// [`Error::CapacityMismatch`] when the name is in use as a read/write lock,
    /// [`Error::Connection`] when Redis cannot be reached.
    pub fn set_capacity(&self, capacity: u64) -> Result<Semaphore> {
        if self.raw.kind() == SemKind::ReadWrite {
            return Err(Error::InvalidConfig {
                setting: "capacity",
                reason: "a read/write lock's capacity is fixed".into(),
            });
        }
        check_capacity(capacity)?;
        let raw = self.raw.with_capacity(capacity);
        let call = raw.set_capacity(capacity);
        match self.client.with_conn(call.during(), |c| call.run(c))? {
            SemCapacity::Set { .. } => Ok(Semaphore {
                raw: Arc::new(raw),
                ..self.clone()
            }),
            SemCapacity::Mismatch { kind, capacity } => Err(self.mismatch(&kind, capacity)),
        }
    }

    /// Give back the hold `hold_id` with fencing token `token` (as [`Semaphore::status`] shows
    /// them), and grant its permits to the waiters they fit. For operators and stuck jobs; the
    /// holder's [`Permit`] finds out at its next renewal or release. Returns whether it
    /// released it (`false`: that hold is over).
    ///
    /// # Errors
    /// [`Error::Connection`] when Redis cannot be reached; [`Error::InvalidConfig`] for an id
    /// that is not `<owner>#<attempt>`.
    pub fn force_release(&self, hold_id: &str, token: u64) -> Result<bool> {
        let bad = || Error::InvalidConfig {
            setting: "hold_id",
            reason: format!("{hold_id:?} is not <owner>#<attempt> as status shows it"),
        };
        let (owner, attempt) = hold_id.rsplit_once('#').ok_or_else(bad)?;
        let attempt: u64 = attempt.parse().map_err(|_| bad())?;
        let call = self.raw.force_release(owner, attempt, token);
        let outcome = self.client.with_conn(call.during(), |c| call.run(c))?;
        Ok(matches!(outcome, SemRelease::Released { .. }))
    }

    /// A handle with which another thread can give up the calling thread's wait for permits of
    /// this semaphore (see [`WaitCanceller`]). Make it on the thread that will wait, before it
    /// waits.
    pub fn wait_canceller(&self) -> WaitCanceller {
        let raw = self.raw.clone();
        let leave: acquire::LeaveFn = Arc::new(move |client, owner, attempt| {
            let call = raw.leave(owner, attempt, true, false);
            client.with_conn(call.during(), |c| call.run(c)).map(|_| ())
        });
        let kind = match self.raw.kind() {
            SemKind::Semaphore => HoldKind::Semaphore,
            // either side: the canceller ends whichever wait the thread is in
            SemKind::ReadWrite => HoldKind::Read,
        };
        WaitCanceller::new(
            &self.client,
            self.raw.key_names()[0],
            &self.name,
            kind,
            leave,
        )
    }

    // ---- internals ----------------------------------------------------------------------

    fn take(&self, permits: u64, wait: Wait) -> Result<Option<Permit>> {
        if permits == 0 || permits > self.capacity() {
            return Err(Error::InvalidConfig {
                setting: "permits",
                reason: format!(
                    "{permits} is not within 1 ..= the capacity ({})",
                    self.capacity()
                ),
            });
        }
        self.client.check_fork()?;
        let Some(granted) = acquire::acquire(&Permits { sem: self, permits }, wait)? else {
            return Ok(None);
        };
        Ok(Some(Permit::new(
            self,
            &granted.owner,
            granted.attempt,
            permits,
            granted.token,
            granted.expires,
            granted.late_acquire,
        )))
    }

    /// What a hold of `permits` of this semaphore is.
    pub(crate) fn hold_kind(&self, permits: u64) -> HoldKind {
        match self.raw.kind() {
            SemKind::Semaphore => HoldKind::Semaphore,
            SemKind::ReadWrite if permits == WRITE_PERMITS => HoldKind::Write,
            SemKind::ReadWrite => HoldKind::Read,
        }
    }

    pub(crate) fn client(&self) -> &ClientInner {
        &self.client
    }

    pub(crate) fn raw(&self) -> &Arc<RawSemaphore> {
        &self.raw
    }

    pub(crate) fn renewed_lease(&self) -> Option<Duration> {
        self.lease.renewed()
    }

    /// The error for a name stored as `kind` ("sem", "rw") with `capacity`.
    pub(crate) fn mismatch(&self, kind: &str, capacity: u64) -> Error {
        let named = |k: SemKind| match k {
            SemKind::Semaphore => "semaphore",
            SemKind::ReadWrite => "read/write lock",
        };
        Error::CapacityMismatch {
            name: self.name.to_string(),
            stored_kind: if kind == "rw" {
                named(SemKind::ReadWrite)
            } else {
                named(SemKind::Semaphore)
            },
            stored: capacity,
            asked_kind: named(self.raw.kind()),
            asked: self.capacity(),
        }
    }
}

/// Some permits of a semaphore, as the one acquisition engine takes them.
pub(crate) struct Permits<'a> {
    sem: &'a Semaphore,
    permits: u64,
}

impl Primitive for Permits<'_> {
    type Acquired = SemAcquire;
    type Left = SemLeave;

    fn client(&self) -> &ClientInner {
        &self.sem.client
    }

    fn kind(&self) -> HoldKind {
        self.sem.hold_kind(self.permits)
    }

    fn name(&self) -> &str {
        &self.sem.name
    }

    fn permits(&self) -> u64 {
        self.permits
    }

    fn lease(&self) -> Duration {
        self.sem.lease.lease()
    }

    fn key(&self) -> &str {
        self.sem.raw.key_names()[0]
    }

    fn wake_key(&self, owner: &str) -> String {
        self.sem.raw.wake_key(owner)
    }

    fn janitor_target(&self) -> Target {
        self.sem.raw.clone()
    }

    fn acquire(&self, owner: &str, attempt: u64, mode: Mode, meta: &str) -> Call<SemAcquire> {
        let lease = self.sem.lease.lease();
        self.sem
            .raw
            .acquire(owner, attempt, self.permits, lease, mode, meta)
    }

    fn asked(&self, reply: SemAcquire) -> Result<Asked> {
        Ok(match reply {
            SemAcquire::Granted { token, pttl, .. } => Asked::Granted { token, pttl },
            SemAcquire::Busy { .. } => Asked::Busy,
            // the holders' leases are not in the reply: the janitor looks after one lease
            SemAcquire::Queued { last_token, .. } => Asked::Queued {
                holder_pttl: self.sem.lease.lease(),
                last_token,
            },
            SemAcquire::Stale => Asked::Stale,
            SemAcquire::Mismatch { kind, capacity } => {
                return Err(self.sem.mismatch(&kind, capacity))
            }
        })
    }

    fn leave(&self, owner: &str, attempt: u64, claim: bool, late: bool) -> Call<SemLeave> {
        self.sem.raw.leave(owner, attempt, late, claim)
    }

    fn left(reply: SemLeave) -> Left {
        match reply {
            SemLeave::Left => Left::Nothing,
            SemLeave::Passed { .. } => Left::Passed,
            SemLeave::Granted { token, pttl, .. } => Left::Granted { token, pttl },
        }
    }
}

/// The permits a write of a read/write lock takes: all of them.
pub(crate) const WRITE_PERMITS: u64 = RW_CAPACITY;

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore")
            .field("name", &self.name)
            .field("capacity", &self.capacity())
            .field("lease", &self.lease)
            .finish()
    }
}
