//! [`RwLock`]: a fair read/write lock, as a semaphore whose write takes every permit (see
//! `docs/semaphores.md`).

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crate::acquire::WaitCanceller;
use crate::client::LockClient;
use crate::error::{Error, Result};
use crate::hold::HoldKey;
use crate::raw::{SemKind, RW_CAPACITY};
use crate::semaphore::permit::Permit;
use crate::semaphore::{Semaphore, WRITE_PERMITS};
use crate::status::SemaphoreStatus;

/// A fair read/write lock on Redis: many readers at once, or one writer. Cheap to clone;
/// `Send + Sync`.
///
/// ```no_run
/// let client = fairlock::LockClient::connect("redis://127.0.0.1:6379/")?;
/// let catalog = client.rw_lock("catalog")?;
/// let r = catalog.read()?;      // many readers at once
/// drop(r);
/// let w = catalog.write()?;     // alone
/// let token = w.fencing_token();
/// # let _ = token;
/// # Ok::<(), fairlock::Error>(())
/// ```
///
/// # Guarantees
/// - **Readers or one writer**: while a write is held (its lease running) nobody else holds
///   the lock; reads share it. It is a [`Semaphore`] of 2^30 permits where a read takes one and
///   a write all, so the semaphore's guarantees hold as they are.
/// - **Fair, no writer starvation**: readers and writers are served in the order their first
///   attempt reached Redis. A writer at the head of the queue blocks every reader behind it;
///   readers that are together at the head are admitted together; `try_read` fails while
///   anyone waits.
/// - **Crash safety, fencing, late requests**: as the semaphore's. Every read and write gets a
///   token greater than all before it for this name.
///
/// # No downgrade, no upgrade: refused at once
/// A thread that holds the write and asks for a read (a downgrade, which Redisson's and
/// `java.util.concurrent`'s read/write locks allow) or for the write again, or that holds a
/// read and asks for the write (an upgrade), would wait behind its own hold for ever (the
/// watchdog renews it). Every call here ([`read`](RwLock::read), [`write`](RwLock::write), the
/// `try_` and timed ones) refuses that at once with [`Error::WouldDeadlock`], changing nothing:
/// drop (or [`unlock`](WriteGuard::unlock)) the guard first, then ask for the other side. The
/// check is local and covers the holds the calling thread took through the same
/// [`LockClient`] (any handle of the name); it is not made through
/// [`as_semaphore`](RwLock::as_semaphore). The guards are not `Send` (as `std`'s and
/// [`LockGuard`](crate::LockGuard)), so a guard stays on the thread that took it and the check
/// is exact: a guard moved to another thread could not be seen by that thread's calls, which
/// would wait on it for ever. A leaked guard ([`WriteGuard::leak`]) is no longer the thread's:
/// its hold ends with its lease, unrenewed, so the thread's later calls are not refused but
/// wait behind it as anyone's.
///
/// ```compile_fail
/// fn assert_send<T: Send>() {}
/// assert_send::<fairlock::ReadGuard>();
/// ```
///
/// ```compile_fail
/// fn assert_send<T: Send>() {}
/// assert_send::<fairlock::WriteGuard>();
/// ```
///
/// # Re-entrant reads: not offered
/// A thread that holds a read and asks for another read is served as anyone (not refused), but
/// while a writer waits it **deadlocks**: the writer waits for the first read to end, the
/// second read waits behind the writer (the same as parking_lot's fair `RwLock`). Take one
/// read per thread and pass the guard down.
#[derive(Clone)]
pub struct RwLock {
    sem: Semaphore,
}

/// A read of an [`RwLock`]: shared with other reads. Given back on drop.
#[must_use = "the read is released as soon as the guard is dropped"]
pub struct ReadGuard {
    permit: Permit,
    _taken: Taken,
}

/// The write of an [`RwLock`]: nobody else holds the lock. Given back on drop.
#[must_use = "the write is released as soon as the guard is dropped"]
pub struct WriteGuard {
    permit: Permit,
    _taken: Taken,
}

/// Which side of a read/write lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Read,
    Write,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Read => "read",
            Side::Write => "write",
        }
    }
}

/// A guard's entry in its taker's record (see `TAKEN`): alive as long as the guard. It makes
/// the guards `!Send`: the record is the taking thread's, so the guard must stay there.
struct Taken {
    _alive: Arc<()>,
    _not_send: PhantomData<*const ()>,
}

/// A thread's guards of one read/write lock: one weak entry per guard, dead once the guard is
/// dropped on whatever thread.
type Guards = Vec<(Weak<()>, Side)>;

thread_local! {
    /// The read/write holds this thread took, by (client id, lock key).
    static TAKEN: RefCell<HashMap<HoldKey, Guards>> = RefCell::new(HashMap::new());
}

/// The strongest side the calling thread holds of `key` (the write before a read).
fn held_by_this_thread(key: &HoldKey) -> Option<Side> {
    TAKEN
        .try_with(|t| {
            let mut map = t.borrow_mut();
            let entries = map.get_mut(key)?;
            entries.retain(|(alive, _)| alive.strong_count() > 0);
            let held = entries
                .iter()
                .map(|&(_, side)| side)
                .max_by_key(|&side| side == Side::Write);
            if entries.is_empty() {
                map.remove(key);
            }
            held
        })
        .ok()
        .flatten()
}

/// Record a guard of `side` taken by the calling thread.
fn record(key: HoldKey, side: Side) -> Taken {
    let alive = Arc::new(());
    let _ = TAKEN.try_with(|t| {
        let mut map = t.borrow_mut();
        let entries = map.entry(key).or_default();
        entries.retain(|(alive, _)| alive.strong_count() > 0);
        entries.push((Arc::downgrade(&alive), side));
    });
    Taken {
        _alive: alive,
        _not_send: PhantomData,
    }
}

impl LockClient {
    /// A handle to the read/write lock `name`. Checks the name; does not talk to Redis. The
    /// name is its own: a semaphore or a lock of the same name is a different thing (a
    /// semaphore of the same name gets [`Error::CapacityMismatch`](crate::Error::CapacityMismatch)).
    ///
    /// # Errors
    /// [`Error::InvalidName`](crate::Error::InvalidName) for a name that cannot be a key.
    pub fn rw_lock(&self, name: &str) -> Result<RwLock> {
        Ok(RwLock {
            sem: Semaphore::new(self.inner.clone(), name, SemKind::ReadWrite, RW_CAPACITY)?,
        })
    }
}

impl RwLock {
    /// The lock's name.
    pub fn name(&self) -> &str {
        self.sem.name()
    }

    /// A handle to the same lock whose holds use `lease`, renewed by the watchdog.
    ///
    /// # Errors
    /// As [`Semaphore::with_lease`].
    pub fn with_lease(&self, lease: Duration) -> Result<RwLock> {
        Ok(RwLock {
            sem: self.sem.with_lease(lease)?,
        })
    }

    /// A handle to the same lock whose holds run out after `lease` and are never renewed (as
    /// [`FairLock::with_fixed_lease`](crate::FairLock::with_fixed_lease)): the hold ends by
    /// itself when the lease does, whether or not the guard lives ([`WriteGuard::is_lost`]
    /// turns true then). With [`WriteGuard::leak`] it keeps a write (or a read) for the whole
    /// period.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let client = fairlock::LockClient::connect("redis://127.0.0.1:6379/")?;
    /// let catalog = client.rw_lock("catalog")?.with_fixed_lease(Duration::from_secs(60))?;
    /// let w = catalog.write()?;
    /// for step in 0..10 {
    ///     // the write ends after a minute even if this process hangs: readers wait no longer
    ///     if w.is_lost() { break; }
    ///     # let _ = (step, w.fencing_token());
    ///     // ... one step of the rebuild, fenced with w.fencing_token() ...
    /// }
    /// drop(w);
    /// # Ok::<(), fairlock::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`Semaphore::with_fixed_lease`].
    pub fn with_fixed_lease(&self, lease: Duration) -> Result<RwLock> {
        Ok(RwLock {
            sem: self.sem.with_fixed_lease(lease)?,
        })
    }

    /// Take a read, waiting in FIFO order as long as it takes.
    ///
    /// # Errors
    /// As [`Semaphore::acquire`]; [`Error::WouldDeadlock`] at once when the calling thread holds
    /// this lock's write.
    pub fn read(&self) -> Result<ReadGuard> {
        self.refuse_own(Side::Read)?;
        let p = self.sem.acquire_many(1)?;
        Ok(self.guard_read(p))
    }

    /// Take a read if no writer holds the lock and nobody waits; never waits.
    ///
    /// # Errors
    /// As [`Semaphore::acquire`]; [`Error::WouldDeadlock`] at once when the calling thread holds
    /// this lock's write.
    pub fn try_read(&self) -> Result<Option<ReadGuard>> {
        self.refuse_own(Side::Read)?;
        let p = self.sem.try_acquire_many(1)?;
        Ok(p.map(|p| self.guard_read(p)))
    }

    /// Take a read, waiting in FIFO order at most `timeout`.
    ///
    /// # Errors
    /// As [`Semaphore::acquire`]; [`Error::WouldDeadlock`] at once when the calling thread holds
    /// this lock's write.
    pub fn try_read_for(&self, timeout: Duration) -> Result<Option<ReadGuard>> {
        self.refuse_own(Side::Read)?;
        let p = self.sem.try_acquire_many_for(1, timeout)?;
        Ok(p.map(|p| self.guard_read(p)))
    }

    /// Take a read, waiting in FIFO order until `deadline` at the latest; `Ok(None)` when the
    /// deadline passed (the queue place is gone then).
    ///
    /// # Errors
    /// As [`Semaphore::acquire`]; [`Error::WouldDeadlock`] at once when the calling thread holds
    /// this lock's write.
    pub fn try_read_until(&self, deadline: Instant) -> Result<Option<ReadGuard>> {
        self.refuse_own(Side::Read)?;
        let p = self.sem.try_acquire_many_until(1, deadline)?;
        Ok(p.map(|p| self.guard_read(p)))
    }

    /// Take the write, waiting in FIFO order as long as it takes.
    ///
    /// # Errors
    /// As [`Semaphore::acquire`]; [`Error::WouldDeadlock`] at once when the calling thread holds
    /// a read or the write of this lock.
    pub fn write(&self) -> Result<WriteGuard> {
        self.refuse_own(Side::Write)?;
        let p = self.sem.acquire_many(WRITE_PERMITS)?;
        Ok(self.guard_write(p))
    }

    /// Take the write if nobody holds the lock and nobody waits; never waits.
    ///
    /// # Errors
    /// As [`Semaphore::acquire`]; [`Error::WouldDeadlock`] at once when the calling thread holds
    /// a read or the write of this lock.
    pub fn try_write(&self) -> Result<Option<WriteGuard>> {
        self.refuse_own(Side::Write)?;
        let p = self.sem.try_acquire_many(WRITE_PERMITS)?;
        Ok(p.map(|p| self.guard_write(p)))
    }

    /// Take the write, waiting in FIFO order until `deadline` at the latest.
    ///
    /// # Errors
    /// As [`Semaphore::acquire`]; [`Error::WouldDeadlock`] at once when the calling thread holds
    /// a read or the write of this lock.
    pub fn try_write_until(&self, deadline: Instant) -> Result<Option<WriteGuard>> {
        self.refuse_own(Side::Write)?;
        let p = self.sem.try_acquire_many_until(WRITE_PERMITS, deadline)?;
        Ok(p.map(|p| self.guard_write(p)))
    }

    /// Take the write, waiting in FIFO order at most `timeout`.
    ///
    /// # Errors
    /// As [`Semaphore::acquire`]; [`Error::WouldDeadlock`] at once when the calling thread holds
    /// a read or the write of this lock.
    pub fn try_write_for(&self, timeout: Duration) -> Result<Option<WriteGuard>> {
        self.refuse_own(Side::Write)?;
        let p = self.sem.try_acquire_many_for(WRITE_PERMITS, timeout)?;
        Ok(p.map(|p| self.guard_write(p)))
    }

    /// Holders and waiters in queue order (a write shows as 2^30 permits), read in one atomic
    /// step.
    ///
    /// # Errors
    /// As [`Semaphore::status`].
    pub fn status(&self) -> Result<SemaphoreStatus> {
        self.sem.status()
    }

    /// Give back the hold `hold_id` with fencing token `token` (as [`RwLock::status`] or the
    /// guard's [`hold_id`](WriteGuard::hold_id) and [`fencing_token`](WriteGuard::fencing_token)
    /// show them), a read or the write, and grant the lock to the waiters at the head of the
    /// queue that now fit. As [`Semaphore::force_release`]: for operators and stuck jobs (a
    /// leaked hold too); the holder's guard finds out at its next renewal or unlock
    /// ([`Error::NotHeld`]). The holder's thread still counts as holding that side until it
    /// drops the guard (its calls for the other side are refused as before). Returns whether
    /// it released the hold (`false`: that hold is over).
    ///
    /// ```no_run
    /// # let client = fairlock::LockClient::connect("redis://127.0.0.1:6379/")?;
    /// let catalog = client.rw_lock("catalog")?;
    /// // a stuck job on "batch-7" holds the catalog: let the others in
    /// for h in catalog.status()?.holders {
    ///     if h.origin.host == "batch-7" {
    ///         catalog.force_release(&h.hold_id, h.fencing_token)?;
    ///     }
    /// }
    /// # Ok::<(), fairlock::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`Semaphore::force_release`]: [`Error::Connection`] when Redis cannot be reached,
    /// [`Error::InvalidConfig`] for an id that is not `<owner>#<attempt>`.
    pub fn force_release(&self, hold_id: &str, token: u64) -> Result<bool> {
        self.sem.force_release(hold_id, token)
    }

    /// A handle with which another thread can give up the calling thread's wait for a read or
    /// the write of this lock (see [`WaitCanceller`]): the waiting call returns
    /// [`Error::Abandoned`] and its queue place is gone. Make it on the thread that will wait,
    /// before it waits.
    ///
    /// ```no_run
    /// # let client = fairlock::LockClient::connect("redis://127.0.0.1:6379/")?;
    /// let catalog = client.rw_lock("catalog")?;
    /// let (tx, rx) = std::sync::mpsc::channel();
    /// let reader = std::thread::spawn(move || {
    ///     tx.send(catalog.wait_canceller()).unwrap();
    ///     catalog.read().map(|r| r.fencing_token())
    /// });
    /// rx.recv().unwrap().abandon()?; // time to go
    /// # drop(reader);
    /// # Ok::<(), fairlock::Error>(())
    /// ```
    pub fn wait_canceller(&self) -> WaitCanceller {
        self.sem.wait_canceller()
    }

    /// The lock as the semaphore it is built on (its `set_capacity` is refused).
    pub fn as_semaphore(&self) -> &Semaphore {
        &self.sem
    }

    /// Which record entry: this client's holds of this lock.
    fn taken_key(&self) -> HoldKey {
        (
            self.sem.client().id.clone(),
            self.sem.raw().key_names()[0].to_string(),
        )
    }

    fn guard_read(&self, permit: Permit) -> ReadGuard {
        ReadGuard {
            permit,
            _taken: record(self.taken_key(), Side::Read),
        }
    }

    fn guard_write(&self, permit: Permit) -> WriteGuard {
        WriteGuard {
            permit,
            _taken: record(self.taken_key(), Side::Write),
        }
    }

    /// [`Error::WouldDeadlock`] when the calling thread holds the write, or a read and asks for
    /// the write: the request would wait behind its own hold.
    fn refuse_own(&self, asked: Side) -> Result<()> {
        match held_by_this_thread(&self.taken_key()) {
            Some(held) if held == Side::Write || asked == Side::Write => {
                Err(Error::WouldDeadlock {
                    name: self.name().to_string(),
                    held: held.name(),
                    asked: asked.name(),
                })
            }
            _ => Ok(()),
        }
    }
}

macro_rules! guard_methods {
    ($guard:ident) => {
        impl $guard {
            /// The hold's fencing token: greater than every token before it for this name.
            pub fn fencing_token(&self) -> u64 {
                self.permit.fencing_token()
            }

            /// True when the hold is no longer this guard's for sure (see
            /// [`Permit::is_lost`]).
            pub fn is_lost(&self) -> bool {
                self.permit.is_lost()
            }

            /// A channel told once when the watchdog finds the hold lost (see
            /// [`Permit::lost_signal`]).
            pub fn lost_signal(&self) -> crossbeam_channel::Receiver<crate::LostHold> {
                self.permit.lost_signal()
            }

            /// Local, conservative estimate of the lease left (see
            /// [`Permit::lease_remaining`]); for a renewed lease it moves forward with each
            /// renewal.
            pub fn lease_remaining(&self) -> Duration {
                self.permit.lease_remaining()
            }

            /// The id of this hold as [`RwLock::status`] shows it (`<owner>#<attempt>`), for
            /// [`RwLock::force_release`].
            pub fn hold_id(&self) -> String {
                self.permit.hold_id()
            }

            /// Give up this guard *without* unlocking: the hold stays in Redis until its lease
            /// runs out and is not renewed (see [`Permit::leak`] and
            /// [`LockGuard::leak`](crate::LockGuard::leak)); with
            /// [`RwLock::with_fixed_lease`] it keeps the lock for a fixed period. Returns the
            /// fencing token.
            ///
            /// The leaked hold is no longer the calling thread's: its later
            /// [`read`](RwLock::read) or [`write`](RwLock::write) is not refused with
            /// [`Error::WouldDeadlock`] (the hold ends with its lease, so the wait is not for
            /// ever) but is served as anyone's, in queue order behind the leaked hold: a
            /// `try_` call is refused while it is in the way, a waiting call returns when its
            /// lease ends (or when [`RwLock::force_release`] ends it). A read after a leaked
            /// read is served at once unless a writer waits.
            pub fn leak(self) -> u64 {
                // the record entry (`_taken`) dies with the guard: the thread holds no side
                self.permit.leak()
            }

            /// Give the hold back now.
            /// Give the hold back now.
            ///
            /// # Errors
            /// As [`Permit::release`].
            pub fn unlock(self) -> Result<()> {
                self.permit.release()
            }
        }
    };
}

guard_methods!(ReadGuard);
guard_methods!(WriteGuard);

impl fmt::Debug for ReadGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ReadGuard").field(&self.permit).finish()
    }
}

impl fmt::Debug for WriteGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("WriteGuard").field(&self.permit).finish()
    }
}

impl fmt::Debug for RwLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RwLock")
            .field("name", &self.name())
            .finish()
    }
}
