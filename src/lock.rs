//! [`FairLock`]: the handle users take, try and inspect a lock through.
//!
//! An acquisition that has to wait is an `Attempt` (see `attempt.rs`, which tells the whole
//! wake-up path).

use std::fmt;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::attempt::Attempt;
use crate::client::{ClientInner, LockClient};
use crate::config::validate_lease;
use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::hold::{self, Hold, HoldKey};
use crate::raw::{self, LateAcquire, LeaveMode, RawLock};
use crate::semaphore::Semaphore;
use crate::status::LockStatus;
use crate::telemetry::Outcome;

/// A lease renewed while held, or a fixed one (shared with the semaphore's handle).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LeaseMode {
    /// Renewed by the watchdog while held.
    Renewed(Duration),
    /// Runs out after this long; never renewed.
    Fixed(Duration),
}

impl LeaseMode {
    /// The lease of a new hold.
    pub(crate) fn lease(self) -> Duration {
        match self {
            LeaseMode::Renewed(l) | LeaseMode::Fixed(l) => l,
        }
    }

    /// The lease to renew, or `None` for a fixed lease.
    pub(crate) fn renewed(self) -> Option<Duration> {
        match self {
            LeaseMode::Renewed(l) => Some(l),
            LeaseMode::Fixed(_) => None,
        }
    }
}

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

/// How long an acquire call may wait.
#[derive(Clone, Copy)]
pub(crate) enum Wait {
    /// Never queue.
    No,
    /// Wait until this instant at the latest.
    Until(Instant),
    /// Wait as long as it takes.
    Forever,
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
        match Instant::now().checked_add(timeout) {
            Some(deadline) => self.acquire(Wait::Until(deadline)),
            None => self.acquire(Wait::Forever),
        }
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
        WaitCanceller {
            target: Cancellable::Lock(self.clone()),
            owner: self.client.owner(),
            thread: self.client.thread_number(),
        }
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

    pub(crate) fn lease(&self) -> Duration {
        self.lease.lease()
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
        let started = std::time::Instant::now();
        let attempt = Attempt::new(self);
        let key = (self.raw.keys().lock.clone(), attempt.owner.clone());
        self.client
            .waiting
            .lock()
            .insert(key.clone(), attempt.number);
        let result = attempt.run(wait);
        self.client.waiting.lock().remove(&key);
        if result.is_err() {
            // Even a first request may have been applied (queued, or granted) before its reply
            // was lost: leave, handing on anything granted to this attempt. Best effort: if
            // Redis is unreachable, other clients' janitors purge the place once it goes stale.
            attempt.leave_quietly();
        }
        let outcome = match &result {
            Ok(Some(_)) => Outcome::Acquired,
            Ok(None) if matches!(wait, Wait::No) => Outcome::Busy,
            Ok(None) => Outcome::TimedOut,
            Err(Error::Abandoned { .. }) => Outcome::Abandoned,
            Err(_) => Outcome::Error,
        };
        crate::telemetry::acquisition(outcome, started.elapsed(), self.metric_label());
        result
    }

    /// The lock name, when the client labels its metrics with it.
    fn metric_label(&self) -> Option<&str> {
        self.client
            .config
            .metrics_lock_label
            .then_some(self.name.as_ref())
    }

    fn reenter(&self, hold: Rc<Hold>) -> Result<LockGuard> {
        let call = self
            .raw
            .reenter(&self.client.owner(), hold.token, hold.depth.get());
        match self.client.with_conn(call.during(), |c| call.run(c))? {
            raw::Reenter::Reentered(_) => {
                crate::telemetry::reentry(self.metric_label());
                Ok(LockGuard::nested(self, hold))
            }
            raw::Reenter::Lost => {
                if !hold.state.lost.swap(true, Ordering::SeqCst) {
                    crate::telemetry::hold_lost("at_reentry", self.metric_label());
                }
                self.forget_hold(&hold);
                Err(Error::NotHeld {
                    name: self.name.to_string(),
                    holder: None,
                })
            }
        }
    }
}

pub(crate) fn ms(v: i64) -> Duration {
    Duration::from_millis(v.max(0) as u64)
}

/// Gives up one thread's wait on one lock from another thread: for a process that must exit
/// while that thread is blocked in [`FairLock::lock`] (the command-line tool on Ctrl-C). The
/// waiting thread makes it with [`FairLock::wait_canceller`], so it can only ever end that
/// thread's wait, never another's.
///
/// ```no_run
/// # let client = fairlock::LockClient::connect("redis://127.0.0.1:6379/")?;
/// let lock = client.fair_lock("nightly-report")?;
/// let (tx, rx) = std::sync::mpsc::channel();
/// let waiter = std::thread::spawn(move || {
///     tx.send(lock.wait_canceller()).unwrap();
///     lock.lock().map(|guard| guard.fencing_token())
/// });
/// let canceller = rx.recv().unwrap();
/// // ... time to go: give up the place (and any grant that reached it), then exit
/// canceller.abandon()?;
/// # drop(waiter);
/// # Ok::<(), fairlock::Error>(())
/// ```
#[derive(Clone)]
pub struct WaitCanceller {
    target: Cancellable,
    owner: String,
    /// The waiting thread's number (its waker: see `Wakers::for_waiter`).
    thread: u64,
}

impl WaitCanceller {
    /// The owner id of the thread whose wait this ends, as [`LockStatus`] shows it.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// Give up that thread's queue place, and hand on a grant that already reached it. Its
    /// acquire call returns [`Error::Abandoned`] within a round trip or two (it is woken and
    /// checks with Redis), never a guard; if it took the lock before this call, this does
    /// nothing and the thread keeps it. Without this the place lapses only when
    /// the janitor stops refreshing it, and a grant made to it meanwhile waits to be revoked.
    /// Does nothing when the thread is not waiting on this lock. The attempt is marked as left
    /// (key `<prefix>:{name}:left`, or `<prefix>:{name}:sem:left` for a semaphore, for 10
    /// minutes), so that if the waiting thread runs its
    /// acquire again before the exit it gets an error instead of a new place.
    ///
    /// # Errors
    /// [`Error::Connection`] when Redis cannot be reached (the place then lapses by itself
    /// within a few janitor intervals).
    pub fn abandon(&self) -> Result<()> {
        let (client, key) = match &self.target {
            Cancellable::Lock(lock) => (&lock.client, lock.raw.keys().lock.clone()),
            Cancellable::Semaphore(sem) => (sem.client_arc(), sem.raw().key_names()[0].into()),
        };
        let key = (key, self.owner.clone());
        // taken, not read: the waiting thread claims the same entry before it holds a grant,
        // so either it holds the lock and this does nothing, or this gives the wait up and the
        // thread gets Error::Abandoned (never both: a guard whose grant was passed on)
        let Some(attempt) = client.waiting.lock().remove(&key) else {
            return Ok(());
        };
        // the waiting thread may be re-running its acquire right now: mark it as left, so that
        // run does nothing (its thread gets an error) instead of queueing again
        let left = match &self.target {
            Cancellable::Lock(lock) => {
                let call =
                    lock.raw
                        .leave(&self.owner, attempt, LeaveMode::Pass, LateAcquire::Possible);
                client.with_conn(call.during(), |c| call.run(c)).map(|_| ())
            }
            Cancellable::Semaphore(sem) => {
                let call = sem.raw().leave(&self.owner, attempt, true, false);
                client.with_conn(call.during(), |c| call.run(c)).map(|_| ())
            }
        };
        // and the thread hears it now, not at its next wake-up: its acquire, run again, finds
        // the mark and returns Error::Abandoned (also when the leave failed: the entry is gone)
        client
            .wakers
            .for_waiter(&key.0, self.thread)
            .recheck(attempt);
        left
    }
}

/// What a [`WaitCanceller`] ends a wait for.
#[derive(Clone)]
enum Cancellable {
    Lock(FairLock),
    Semaphore(Semaphore),
}

impl WaitCanceller {
    /// A canceller of the calling thread's wait for permits of `sem`.
    pub(crate) fn for_semaphore(sem: &Semaphore) -> WaitCanceller {
        WaitCanceller {
            target: Cancellable::Semaphore(sem.clone()),
            owner: sem.client().owner(),
            thread: sem.client().thread_number(),
        }
    }
}

impl fmt::Debug for WaitCanceller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match &self.target {
            Cancellable::Lock(lock) => lock.name(),
            Cancellable::Semaphore(sem) => sem.name(),
        };
        f.debug_struct("WaitCanceller")
            .field("name", &name)
            .field("owner", &self.owner)
            .finish()
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
