//! [`RwLock`]: a fair read/write lock, as a semaphore whose write takes every permit (see
//! `docs/semaphores.md`).

use std::fmt;
use std::time::{Duration, Instant};

use crate::client::LockClient;
use crate::error::Result;
use crate::permit::Permit;
use crate::raw::{SemKind, RW_CAPACITY};
use crate::semaphore::{Semaphore, SemaphoreStatus, WRITE_PERMITS};

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
/// # Re-entrant reads: not offered
/// A thread that holds a read and asks for another read while a writer waits **deadlocks**:
/// the writer waits for the first read to end, the second read waits behind the writer (the
/// same as parking_lot's fair `RwLock`). Take one read per thread and pass the guard down.
/// There is no upgrade from read to write either; a writer's `read` waits like anyone else's.
#[derive(Clone)]
pub struct RwLock {
    sem: Semaphore,
}

/// A read of an [`RwLock`]: shared with other reads. Given back on drop.
#[derive(Debug)]
#[must_use = "the read is released as soon as the guard is dropped"]
pub struct ReadGuard(Permit);

/// The write of an [`RwLock`]: nobody else holds the lock. Given back on drop.
#[derive(Debug)]
#[must_use = "the write is released as soon as the guard is dropped"]
pub struct WriteGuard(Permit);

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

    /// Take a read, waiting in FIFO order as long as it takes.
    ///
    /// # Errors
    /// As [`Semaphore::acquire`].
    pub fn read(&self) -> Result<ReadGuard> {
        self.sem.acquire_many(1).map(ReadGuard)
    }

    /// Take a read if no writer holds the lock and nobody waits; never waits.
    ///
    /// # Errors
    /// As [`Semaphore::acquire`].
    pub fn try_read(&self) -> Result<Option<ReadGuard>> {
        Ok(self.sem.try_acquire_many(1)?.map(ReadGuard))
    }

    /// Take a read, waiting in FIFO order at most `timeout`.
    ///
    /// # Errors
    /// As [`Semaphore::acquire`].
    pub fn try_read_for(&self, timeout: Duration) -> Result<Option<ReadGuard>> {
        Ok(self.sem.try_acquire_many_for(1, timeout)?.map(ReadGuard))
    }

    /// Take the write, waiting in FIFO order as long as it takes.
    ///
    /// # Errors
    /// As [`Semaphore::acquire`].
    pub fn write(&self) -> Result<WriteGuard> {
        self.sem.acquire_many(WRITE_PERMITS).map(WriteGuard)
    }

    /// Take the write if nobody holds the lock and nobody waits; never waits.
    ///
    /// # Errors
    /// As [`Semaphore::acquire`].
    pub fn try_write(&self) -> Result<Option<WriteGuard>> {
        Ok(self.sem.try_acquire_many(WRITE_PERMITS)?.map(WriteGuard))
    }

    /// Take the write, waiting in FIFO order until `deadline` at the latest.
    ///
    /// # Errors
    /// As [`Semaphore::acquire`].
    pub fn try_write_until(&self, deadline: Instant) -> Result<Option<WriteGuard>> {
        Ok(self
            .sem
            .try_acquire_many_until(WRITE_PERMITS, deadline)?
            .map(WriteGuard))
    }

    /// Take the write, waiting in FIFO order at most `timeout`.
    ///
    /// # Errors
    /// As [`Semaphore::acquire`].
    pub fn try_write_for(&self, timeout: Duration) -> Result<Option<WriteGuard>> {
        Ok(self
            .sem
            .try_acquire_many_for(WRITE_PERMITS, timeout)?
            .map(WriteGuard))
    }

    /// Holders and waiters in queue order (a write shows as 2^30 permits), read in one atomic
    /// step.
    ///
    /// # Errors
    /// As [`Semaphore::status`].
    pub fn status(&self) -> Result<SemaphoreStatus> {
        self.sem.status()
    }

    /// The lock as the semaphore it is built on (for `force_release` and the like; its
    /// `set_capacity` is refused).
    pub fn as_semaphore(&self) -> &Semaphore {
        &self.sem
    }
}

macro_rules! guard_methods {
    ($guard:ident) => {
        impl $guard {
            /// The hold's fencing token: greater than every token before it for this name.
            pub fn fencing_token(&self) -> u64 {
                self.0.fencing_token()
            }

            /// True when the hold is no longer this guard's for sure (see
            /// [`Permit::is_lost`]).
            pub fn is_lost(&self) -> bool {
                self.0.is_lost()
            }

            /// A channel told once when the watchdog finds the hold lost (see
            /// [`Permit::lost_signal`]).
            pub fn lost_signal(&self) -> crossbeam_channel::Receiver<crate::LostHold> {
                self.0.lost_signal()
            }

            /// Give the hold back now.
            ///
            /// # Errors
            /// As [`Permit::release`].
            pub fn unlock(self) -> Result<()> {
                self.0.release()
            }
        }
    };
}

guard_methods!(ReadGuard);
guard_methods!(WriteGuard);

impl fmt::Debug for RwLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RwLock")
            .field("name", &self.name())
            .finish()
    }
}
