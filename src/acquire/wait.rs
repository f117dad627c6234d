//! What every acquisition shares, whatever it takes: how long it may wait ([`Wait`]), the lease
//! of the hold it makes ([`LeaseMode`]), and the [`WaitCanceller`] that ends it from another
//! thread.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::client::ClientInner;
use crate::error::Result;
use crate::kind::HoldKind;

/// A lease renewed while held, or a fixed one.
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

impl Wait {
    /// At most `timeout` from now (a timeout too large for an `Instant` waits for ever).
    pub(crate) fn at_most(timeout: Duration) -> Wait {
        Instant::now()
            .checked_add(timeout)
            .map_or(Wait::Forever, Wait::Until)
    }
}

/// Milliseconds from a script's reply as a duration (a negative value, "none", as zero).
pub(crate) fn ms(v: i64) -> Duration {
    Duration::from_millis(v.max(0) as u64)
}

/// Leaves the queue for a canceller: `(owner, attempt)`, passing on a grant that reached it.
pub(crate) type LeaveFn = Arc<dyn Fn(&ClientInner, &str, u64) -> Result<()> + Send + Sync>;

/// Gives up one thread's wait on one lock, semaphore or read/write lock from another thread:
/// for a process that must exit while that thread is blocked in [`FairLock::lock`] (the
/// command-line tool on Ctrl-C), [`Semaphore::acquire`] or [`RwLock::read`]. The waiting thread
/// makes it with `wait_canceller` on its handle, so it can only ever end that thread's wait,
/// never another's.
///
/// [`FairLock::lock`]: crate::FairLock::lock
/// [`Semaphore::acquire`]: crate::Semaphore::acquire
/// [`RwLock::read`]: crate::RwLock::read
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
    client: Arc<ClientInner>,
    /// The primitive's main key: the key of the client's `waiting` map and of its waker.
    key: String,
    name: String,
    kind: HoldKind,
    leave: LeaveFn,
    owner: String,
    /// The waiting thread's number (its waker: see `Wakers::for_waiter`).
    thread: u64,
}

impl WaitCanceller {
    /// A canceller of the calling thread's wait on the primitive at `key`; `leave` runs its
    /// leave script.
    pub(crate) fn new(
        client: &Arc<ClientInner>,
        key: &str,
        name: &str,
        kind: HoldKind,
        leave: LeaveFn,
    ) -> WaitCanceller {
        WaitCanceller {
            client: client.clone(),
            key: key.to_string(),
            name: name.to_string(),
            kind,
            leave,
            owner: client.owner(),
            thread: client.thread_number(),
        }
    }

    /// The owner id of the thread whose wait this ends, as [`LockStatus`](crate::LockStatus)
    /// and [`SemaphoreStatus`](crate::SemaphoreStatus) show it.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// Give up that thread's queue place, and hand on a grant that already reached it. Its
    /// acquire call returns [`Error::Abandoned`](crate::Error::Abandoned) within a round trip
    /// or two (it is woken and checks with Redis), never a guard; if it took the lock (or the
    /// permits) before this call, this does nothing and the thread keeps them. Without this
    /// the place lapses only when the janitor stops refreshing it, and a grant made to it
    /// meanwhile waits to be revoked. Does nothing when the thread is not waiting. The attempt
    /// is marked as left (key `<prefix>:{name}:left`, or `<prefix>:{name}:sem:left` for a
    /// semaphore or read/write lock, for 10 minutes), so that if the waiting thread runs its
    /// acquire again before the exit it gets an error instead of a new place.
    ///
    /// # Errors
    /// [`Error::Connection`](crate::Error::Connection) when Redis cannot be reached (the place
    /// then lapses by itself within a few janitor intervals).
    pub fn abandon(&self) -> Result<()> {
        let key = (self.key.clone(), self.owner.clone());
        // taken, not read: the waiting thread claims the same entry before it holds a grant,
        // so either it holds the lock and this does nothing, or this gives the wait up and the
        // thread gets Error::Abandoned (never both: a guard whose grant was passed on)
        let Some(attempt) = self.client.waiting.lock().remove(&key) else {
            return Ok(());
        };
        // the waiting thread may be re-running its acquire right now: mark it as left, so that
        // run does nothing (its thread gets an error) instead of queueing again
        let left = (self.leave)(&self.client, &self.owner, attempt);
        // and the thread hears it now, not at its next wake-up: its acquire, run again, finds
        // the mark and returns Error::Abandoned (also when the leave failed: the entry is gone)
        self.client
            .wakers
            .for_waiter(&self.key, self.thread)
            .recheck(attempt);
        left
    }
}

impl fmt::Debug for WaitCanceller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WaitCanceller")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("owner", &self.owner)
            .finish()
    }
}
