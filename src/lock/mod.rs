//! [`FairLock`]: the handle users take, try and inspect a lock through.
//!
//! An acquisition is the one engine's (see `acquire/engine.rs`, which tells the whole wake-up
//! path); the lock supplies its scripts as a [`Primitive`].

use std::fmt;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(crate) mod guard;

use crate::acquire::{self, Asked, LeaseMode, Left, Primitive, Wait, WaitCanceller};
use crate::background::janitor::Target;
use crate::client::{ClientInner, LockClient};
use crate::config::validate_lease;
use crate::error::{Error, Result};
use crate::hold::{self, Hold, HoldKey};
use crate::kind::HoldKind;
use crate::raw::{self, Call, LateAcquire, LeaveMode, Mode, RawLock};
use crate::status::LockStatus;
use guard::LockGuard;

/// A fair, reentrant distributed lock on Redis. Cheap to clone; `Send + Sync`.
///
/// # Guarantees
/// - **Mutual exclusion**: at most one owner (a client's thread) holds the lock while its lease
///   runs. Every state change is one atomic Lua script.
/// - **FIFO, no barging**: waiters are served in the order their first attempt reached Redis,
///   across threads and processes. While anyone waits, a newcomer (`try_lock` too) queues behind
///   them; a release hands the lock straight to the next waiter, so there is no gap to barge into.
///   A live waiter keeps its place however long the lock is held.
/// - **Reentrancy**: the owning thread takes the lock again without waiting; it is free when every
///   guard is released. Another thread of the same process is another owner.
/// - **Leases**: a hold's lease (default 30 s) is renewed every third of it while the guard lives
///   ([`FairLock::with_fixed_lease`] turns renewal off). A holder that dies holds the lock until
///   its lease runs out; then the next waiter gets it within milliseconds.
/// - **Fencing**: each new hold gets a token greater than all before it
///   ([`LockGuard::fencing_token`]): `max(last + 1, server time in µs)`, so tokens keep rising
///   across a restart without persistence, eviction or a failover, as long as the server clock
///   does not go back.
/// - **Late and repeated requests** (a lost reply, a request arriving after its sender gave
///   up, a retry) never act on a later wait or hold of the same thread: each acquire call is an
///   attempt the scripts check.
///
/// # Limits
/// A lease is time-based: a holder paused longer than its lease (GC, swap, SIGSTOP) may still run
/// while another holds the lock; so may a holder whose server clock stepped forward by more than
/// its remaining lease (Redis TTLs follow the wall clock). Use the fencing token at the resource.
/// A Redis without persistence that restarts, or a failover to a replica that missed the last
/// writes, forgets locks and queue places (replica acknowledgements,
/// [`LockClientBuilder::replica_acks`](crate::LockClientBuilder::replica_acks), keep a guard from
/// resting on such a grant). On a Redis Cluster a lock lives on one shard: all of this holds
/// per shard.
///
/// ```no_run
/// use std::time::Duration;
/// let client = fairlock::LockClient::connect("redis://127.0.0.1:6379/")?;
/// let lock = client.fair_lock("orders:close-unpaid")?;
/// if let Some(guard) = lock.try_lock_for(Duration::from_secs(5))? {
///     // ... critical section; pass guard.fencing_token() to the resource ...
///     guard.unlock()?;
/// }
/// # Ok::<(), fairlock::Error>(())
/// ```
#[derive(Clone)]
pub struct FairLock {
    client: Arc<ClientInner>,
    name: Arc<str>,
    raw: Arc<RawLock>,
    lease: LeaseMode,
}

impl LockClient {
    /// A handle to the lock `name`. Checks the name; does not talk to Redis.
    ///
    /// # Errors
    /// [`Error::InvalidName`] for a name that cannot be a key (see [`validate_name`](crate::validate_name)).
    pub fn fair_lock(&self, name: &str) -> Result<FairLock> {
        FairLock::new(self.inner.clone(), name)
    }
}

impl FairLock {
    pub(crate) fn new(client: Arc<ClientInner>, name: &str) -> Result<FairLock> {
        let raw = RawLock::new(&client.config.key_prefix, name, client.protocol)?;
        let lease = LeaseMode::Renewed(client.config.lease);
        Ok(FairLock {
            client,
            name: name.into(),
            raw: Arc::new(raw),
            lease,
        })
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A handle to the same lock whose holds run out after `lease` and are never renewed: a
    /// `tryLock(0, 5, SECONDS)` for scheduled jobs that must not run twice within a period.
    /// Re-entry keeps the lease of the outer hold.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let client = fairlock::LockClient::connect("redis://127.0.0.1:6379/")?;
    /// let job = client.fair_lock("close-unpaid-orders")?.with_fixed_lease(Duration::from_secs(5))?;
    /// if let Some(guard) = job.try_lock()? {
    ///     // run the job, then keep the lock for the rest of the 5 s so no server runs it again
    ///     guard.leak();
    /// }
    /// # Ok::<(), fairlock::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a lease outside [`MIN_LEASE`](crate::MIN_LEASE) ..=
    /// [`MAX_LEASE`](crate::MAX_LEASE).
    pub fn with_fixed_lease(&self, lease: Duration) -> Result<FairLock> {
        validate_lease("fixed lease", lease)?;
        Ok(FairLock {
            lease: LeaseMode::Fixed(lease),
            ..self.clone()
        })
    }

    /// A handle to the same lock whose holds use `lease`, renewed by the watchdog.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a lease outside [`MIN_LEASE`](crate::MIN_LEASE) ..=
    /// [`MAX_LEASE`](crate::MAX_LEASE).
    pub fn with_lease(&self, lease: Duration) -> Result<FairLock> {
        validate_lease("lease", lease)?;
        Ok(FairLock {
            lease: LeaseMode::Renewed(lease),
            ..self.clone()
        })
    }

    /// Take the lock, waiting in FIFO order as long as it takes. Re-entry by the owning thread
    /// returns at once.
    ///
    /// # Errors
    /// [`Error::Connection`] when Redis fails (the thread's queue place is given up then),
    /// [`Error::ForeignData`] when another program's data sits at one of the lock's keys,
    /// [`Error::NotHeld`] when a re-entry finds the thread's hold lost, [`Error::Forked`] in a
    /// forked child.
    pub fn lock(&self) -> Result<LockGuard> {
        match self.acquire(Wait::Forever)? {
            Some(guard) => Ok(guard),
            None => Err(Error::protocol(
                "a wait without deadline ended without the lock".into(),
            )),
        }
    }

    /// Take the lock if it is free and nobody is queued; never waits and never queues.
    ///
    /// # Errors
    /// As [`FairLock::lock`].
    pub fn try_lock(&self) -> Result<Option<LockGuard>> {
        self.acquire(Wait::No)
    }

    /// Take the lock, waiting in FIFO order at most `timeout`. `Ok(None)` when the time ran out;
    /// the queue place is gone then.
    ///
    /// # Errors
    /// As [`FairLock::lock`].
    pub fn try_lock_for(&self, timeout: Duration) -> Result<Option<LockGuard>> {
        self.acquire(Wait::at_most(timeout))
    }

    /// Take the lock, waiting in FIFO order until `deadline` at the latest.
    ///
    /// # Errors
    /// As [`FairLock::lock`].
    pub fn try_lock_until(&self, deadline: Instant) -> Result<Option<LockGuard>> {
        self.acquire(Wait::Until(deadline))
    }

    /// Whether anyone holds the lock now (one read from Redis).
    ///
    /// # Errors
    /// [`Error::Connection`] when Redis cannot be reached.
    pub fn is_locked(&self) -> Result<bool> {
        let (owner, _) = self.owner_and("count")?;
        // a released lock's hash lives on for a while as a tombstone, with an empty owner
        Ok(owner.is_some_and(|o| !o.is_empty()))
    }

    /// Whether the calling thread (through this client) holds the lock, as Redis sees it (one
    /// read from Redis).
    ///
    /// # Errors
    /// [`Error::Connection`] when Redis cannot be reached.
    pub fn is_owned_by_current_thread(&self) -> Result<bool> {
        Ok(self.hold_count()? > 0)
    }

    /// How many levels the calling thread holds, as Redis sees it (0 when it does not hold the
    /// lock; one read from Redis).
    ///
    /// # Errors
    /// [`Error::Connection`] when Redis cannot be reached.
    pub fn hold_count(&self) -> Result<u32> {
        let (owner, count) = self.owner_and("count")?;
        Ok(match (owner, count) {
            (Some(o), Some(n)) if o == self.client.owner() => n as u32,
            _ => 0,
        })
    }

    /// Release the lock from whoever holds it now, and grant it to the next waiter. For operators
    /// and stuck jobs; the former holder's guard finds out at its next renewal or release.
    /// Reads the holder first and then releases exactly that hold (owner and token), so a
    /// repeated request never releases the next holder too. Returns the owner id of the
    /// released holder (`None` when the lock was free, or changed hands in between).
    ///
    /// # Errors
    /// [`Error::Connection`] when Redis cannot be reached.
    pub fn force_unlock(&self) -> Result<Option<String>> {
        let status = self.status()?;
        let Some(holder) = status.holder else {
            if !status.waiters.is_empty() {
                // free, but waiters queued (its holder died): hand it to the live head now
                self.force_unlock_hold("", 0)?;
            }
            return Ok(None);
        };
        let released = self.force_unlock_hold(&holder.origin.owner, holder.fencing_token)?;
        Ok(released.then_some(holder.origin.owner))
    }

    /// Release the hold of `owner` with fencing token `token` (as [`FairLock::status`] shows
    /// them), and grant the lock to the next waiter. Does nothing when that hold is over.
    /// Returns whether it released it.
    ///
    /// # Errors
    /// [`Error::Connection`] when Redis cannot be reached.
    pub fn force_unlock_hold(&self, owner: &str, token: u64) -> Result<bool> {
        let call = self.raw.force_unlock(owner, token);
        let outcome = self.client.with_conn(call.during(), |c| call.run(c))?;
        Ok(matches!(outcome, raw::ForceUnlock::Released { .. }))
    }

    /// A handle with which another thread can give up the calling thread's wait on this lock
    /// (see [`WaitCanceller`]). Make it on the thread that will wait, before it waits.
    pub fn wait_canceller(&self) -> WaitCanceller {
        let raw = self.raw.clone();
        let leave: acquire::LeaveFn = std::sync::Arc::new(move |client, owner, attempt| {
            let call = raw.leave(owner, attempt, LeaveMode::Pass, LateAcquire::Possible);
            client.with_conn(call.during(), |c| call.run(c)).map(|_| ())
        });
        WaitCanceller::new(
            &self.client,
            &self.raw.keys().lock,
            &self.name,
            HoldKind::Lock,
            leave,
        )
    }

    /// Holder, hold count, lease left, fencing counter and the waiters in queue order, read in
    /// one atomic step.
    ///
    /// # Errors
    /// [`Error::Connection`] when Redis cannot be reached, [`Error::ForeignData`].
    pub fn status(&self) -> Result<LockStatus> {
        let call = self.raw.status();
        let raw = self.client.with_conn(call.during(), |c| call.run(c))?;
        Ok(LockStatus::from_raw(&self.name, raw))
    }

    // ---- internals ----------------------------------------------------------------------

    pub(crate) fn client(&self) -> &ClientInner {
        &self.client
    }

    pub(crate) fn raw(&self) -> &Arc<RawLock> {
        &self.raw
    }

    pub(crate) fn hold_key(&self) -> HoldKey {
        (self.client.id.clone(), self.raw.keys().lock.clone())
    }

    /// The calling thread's hold of this lock (through this client), if any.
    fn current_hold(&self) -> Option<Rc<Hold>> {
        hold::current(&self.hold_key())
    }

    /// Record a new hold of the calling thread.
    pub(crate) fn remember_hold(&self, hold: Rc<Hold>) {
        hold::remember(self.hold_key(), hold);
    }

    /// Forget `hold` as the calling thread's hold and stop renewing it.
    pub(crate) fn forget_hold(&self, hold: &Rc<Hold>) {
        hold::forget(&self.hold_key(), hold);
        if let Some(id) = hold.renewal {
            self.client.watchdog.unregister(id);
        }
    }

    /// The lease to renew, or `None` for a fixed lease.
    pub(crate) fn renewed_lease(&self) -> Option<Duration> {
        self.lease.renewed()
    }

    /// Whether the hold with this token still owns the lock.
    pub(crate) fn owns(&self, token: u64) -> Result<bool> {
        let (owner, tok) = self.owner_and("token")?;
        Ok(owner.as_deref() == Some(&self.client.owner()) && tok == Some(token))
    }

    /// The lock's owner id and one numeric field of its hash.
    fn owner_and(&self, field: &str) -> Result<(Option<String>, Option<u64>)> {
        self.client.with_conn("reading the lock", |c| {
            c.query(
                redis::cmd("HMGET")
                    .arg(&self.raw.keys().lock)
                    .arg("owner")
                    .arg(field),
            )
            .map_err(|e| Error::from_redis("reading the lock", e))
        })
    }

    fn acquire(&self, wait: Wait) -> Result<Option<LockGuard>> {
        self.client.check_fork()?;
        if let Some(hold) = self.current_hold() {
            if !hold.is_lost() {
                return self.reenter(hold).map(Some);
            }
            // A hold whose lease is over (a leaked fixed-lease guard, or one the watchdog found
            // lost): this is a fresh acquisition. An old guard still around releases nothing.
            self.forget_hold(&hold);
        }
        let Some(granted) = acquire::acquire(self, wait)? else {
            return Ok(None);
        };
        let late = granted.late_acquire.then_some(granted.attempt);
        Ok(Some(LockGuard::new_hold(
            self,
            granted.token,
            granted.expires,
            late,
        )))
    }

    fn reenter(&self, hold: Rc<Hold>) -> Result<LockGuard> {
        let call = self
            .raw
            .reenter(&self.client.owner(), hold.token, hold.depth.get());
        match self.client.with_conn(call.during(), |c| call.run(c))? {
            raw::Reenter::Reentered(_) => {
                crate::telemetry::reentry(Primitive::metric_label(self));
                Ok(LockGuard::nested(self, hold))
            }
            raw::Reenter::Lost => {
                if !hold.state.lost.swap(true, Ordering::SeqCst) {
                    crate::telemetry::hold_lost("at_reentry", Primitive::metric_label(self));
                }
                self.forget_hold(&hold);
                Err(Error::NotHeld {
                    name: self.name.to_string(),
                    kind: HoldKind::Lock,
                    holder: None,
                })
            }
        }
    }
}

/// The lock's scripts, for the one acquisition engine.
impl Primitive for FairLock {
    type Acquired = raw::Acquire;
    type Left = raw::Leave;

    fn client(&self) -> &ClientInner {
        &self.client
    }

    fn kind(&self) -> HoldKind {
        HoldKind::Lock
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn lease(&self) -> Duration {
        self.lease.lease()
    }

    fn key(&self) -> &str {
        &self.raw.keys().lock
    }

    fn wake_key(&self, owner: &str) -> String {
        self.raw.wake_key(owner)
    }

    fn janitor_target(&self) -> Target {
        self.raw.clone()
    }

    fn acquire(&self, owner: &str, attempt: u64, mode: Mode, meta: &str) -> Call<raw::Acquire> {
        // a hold this thread leaked on purpose is waited for; any other older hold of it has no
        // guard and is passed on by the script (see acquire.lua)
        let lease = self.lease.lease();
        if hold::leaked_and_running(&self.hold_key()) {
            self.raw
                .acquire_behind_leaked_hold(owner, attempt, lease, mode, meta)
        } else {
            self.raw.acquire(owner, attempt, lease, mode, meta)
        }
    }

    fn asked(&self, reply: raw::Acquire) -> Result<Asked> {
        Ok(match reply {
            raw::Acquire::Granted(g) => Asked::Granted {
                token: g.token,
                pttl: acquire::ms(g.pttl_ms),
            },
            raw::Acquire::Busy { .. } => Asked::Busy,
            raw::Acquire::Queued {
                pttl_ms,
                last_token,
                ..
            } => Asked::Queued {
                holder_pttl: acquire::ms(pttl_ms),
                last_token,
            },
            raw::Acquire::Stale => Asked::Stale,
        })
    }

    fn leave(&self, owner: &str, attempt: u64, claim: bool, late: bool) -> Call<raw::Leave> {
        let mode = if claim {
            LeaveMode::Claim
        } else {
            LeaveMode::Pass
        };
        let late = if late {
            LateAcquire::Possible
        } else {
            LateAcquire::Impossible
        };
        self.raw.leave(owner, attempt, mode, late)
    }

    fn left(reply: raw::Leave) -> Left {
        match reply {
            raw::Leave::Left => Left::Nothing,
            raw::Leave::Passed { .. } => Left::Passed,
            raw::Leave::Granted(g) => Left::Granted {
                token: g.token,
                pttl: acquire::ms(g.pttl_ms),
            },
        }
    }
}

impl fmt::Debug for FairLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FairLock")
            .field("name", &self.name)
            .field("lease", &self.lease)
            .finish()
    }
}
