//! [`LockGuard`]: one level of a thread's hold, released on drop.

use std::cell::Cell;
use std::fmt;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::boot_clock::BootInstant;
use crate::error::{Error, Result};
use crate::hold::{Counted, Hold, HoldState};
use crate::lock::FairLock;
use crate::loss::LostHold;
use crate::raw::Release;

/// A held lock. Dropping it releases one level (and logs a warning if that fails); call
/// [`LockGuard::unlock`] to see the error instead.
///
/// A guard belongs to the thread that took the lock (the owner id names the thread), so it is
/// neither `Send` nor `Sync`. Nested guards of one thread (re-entry) share one hold and one
/// fencing token; the lock is free again when the last of them is released.
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct LockGuard {
    lock: FairLock,
    hold: Rc<Hold>,
    released: bool,
}

impl LockGuard {
    /// Start a new hold at depth 1 (the caller got a grant with this token). `late_acquire`:
    /// the attempt that got it, when one of its acquire requests may still arrive.
    pub(crate) fn new_hold(
        lock: &FairLock,
        token: u64,
        expires: BootInstant,
        late_acquire: Option<u64>,
    ) -> LockGuard {
        let labelled = lock.client().config.metrics_lock_label;
        let state = Arc::new(HoldState::new(
            lock.name(),
            crate::HoldKind::Lock,
            token,
            expires,
            labelled,
        ));
        let renewal = lock.renewed_lease().map(|lease| {
            lock.client().watchdog.register(
                lock.raw().renew(&lock.client().owner(), token, lease),
                token,
                lease,
                state.clone(),
                expires,
            )
        });
        let hold = Rc::new(Hold {
            token,
            depth: Cell::new(1),
            state,
            renewal,
            late_acquire,
            leaked: Cell::new(false),
            metric: Counted::start(labelled.then(|| lock.name().to_string())),
        });
        lock.remember_hold(hold.clone());
        LockGuard {
            lock: lock.clone(),
            hold,
            released: false,
        }
    }

    /// Another level of an existing hold (re-entry).
    pub(crate) fn nested(lock: &FairLock, hold: Rc<Hold>) -> LockGuard {
        hold.depth.set(hold.depth.get() + 1);
        LockGuard {
            lock: lock.clone(),
            hold,
            released: false,
        }
    }

    /// The fencing token of this hold: greater than every token handed out before for this lock
    /// name. Pass it to the resource you protect and have it reject writes with a lower token than
    /// one it has seen (docs/guarantees.md, "Fencing"). Re-entry returns the outer token.
    pub fn fencing_token(&self) -> u64 {
        self.hold.token
    }

    /// The lock this guard holds (named after its type rather than `lock`, so that
    /// `guard.fair_lock().lock()` reads as the re-entry it is).
    pub fn fair_lock(&self) -> &FairLock {
        &self.lock
    }

    /// How many levels this thread holds now (1 when not re-entered); the same count as
    /// [`FairLock::hold_count`] and [`Holder::hold_count`](crate::Holder::hold_count), read
    /// locally.
    pub fn hold_count(&self) -> u32 {
        self.hold.depth.get()
    }

    /// True when the lock is no longer this hold's for sure: the watchdog found it gone or taken
    /// by another owner, a release or re-entry found it lost, or the lease ran out by the local
    /// estimate (a fixed lease's end, or Redis unreachable for longer than the lease). Work done
    /// under a lost lock is not protected any more: stop, and rely on the fencing token. Local:
    /// no call to Redis (see [`LockGuard::is_held_in_redis`] for one).
    pub fn is_lost(&self) -> bool {
        self.hold.is_lost()
    }

    /// A channel that receives one [`LostHold`] when the watchdog finds this hold lost: a
    /// renewal found the lock gone or taken by another owner, or Redis could not be reached to
    /// renew it before its lease ran out. It comes within a renewal interval (a third of the
    /// lease) of the loss, once per hold, never for a hold released normally; a hold that ends
    /// (its last guard released or leaked) disconnects the channel instead. Block on it, or
    /// `select!` on it beside the work, to stop writing at once; the client's
    /// [`on_lost`](crate::LockClientBuilder::on_lost) callback hears the same. Holds with a
    /// fixed lease are not renewed and not watched: their lease ends by design
    /// ([`LockGuard::lease_remaining`]).
    ///
    /// ```no_run
    /// use fairlock::crossbeam_channel::select;
    /// # let client = fairlock::LockClient::connect("redis://127.0.0.1:6379/")?;
    /// # let (_, jobs) = fairlock::crossbeam_channel::unbounded::<u32>();
    /// let guard = client.fair_lock("leader")?.lock()?;
    /// let lost = guard.lost_signal();
    /// loop {
    ///     select! {
    ///         recv(lost) -> why => { eprintln!("stopping: {why:?}"); break; }
    ///         recv(jobs) -> job => { /* work, with guard.fencing_token() */ }
    ///     }
    /// }
    /// # Ok::<(), fairlock::Error>(())
    /// ```
    pub fn lost_signal(&self) -> crossbeam_channel::Receiver<LostHold> {
        self.hold.state.loss.receiver()
    }

    /// Local, conservative estimate of the lease left (the server may allow a little more, as
    /// [`Holder::lease_remaining`](crate::Holder::lease_remaining) shows). For a renewed lease
    /// this moves forward with each renewal.
    pub fn lease_remaining(&self) -> Duration {
        self.hold
            .state
            .expires
            .lock()
            .saturating_duration_since(BootInstant::now())
    }

    /// Ask Redis whether this hold still owns the lock (one read from Redis; see
    /// [`LockGuard::is_lost`] for the local view).
    ///
    /// # Errors
    /// [`Error::Connection`] when Redis cannot be reached, [`Error::ForeignData`] when another
    /// program's data sits at the lock's key.
    pub fn is_held_in_redis(&self) -> Result<bool> {
        self.lock.owns(self.hold.token)
    }

    /// Release this level now and report the outcome. Releasing the last level frees the lock or
    /// grants it to the next waiter. Safe to retry internally: a release whose reply was lost is
    /// never applied twice and never reported as "not held".
    ///
    /// # Errors
    /// [`Error::NotHeld`] when the lock was no longer this hold's (its lease ran out, or it was
    /// force-unlocked); nothing is changed then. [`Error::Connection`] when Redis cannot be
    /// reached: the release may or may not have been applied, and if not, the lock frees itself
    /// when the lease runs out (the watchdog no longer renews it).
    pub fn unlock(mut self) -> Result<()> {
        self.release()
    }

    /// Give up this guard *without* releasing: the lock stays held until its lease runs out, and
    /// is not renewed. For a job with a fixed lease that must not run again within that period,
    /// even on another server (Redisson's `tryLock(0, 5, SECONDS)` without `unlock`); not even
    /// this thread takes it again before then (a later acquisition queues behind the leaked
    /// hold like anyone's). Returns the fencing token.
    ///
    /// A leak gives up the whole hold, whatever level this guard is: the thread's other
    /// guards of it (re-entries, or the outer guard of a leaked inner one) release nothing when
    /// dropped, and [`LockGuard::is_lost`] turns true for them when the lease runs out.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let client = fairlock::LockClient::connect("redis://127.0.0.1:6379/")?;
    /// let job = client.fair_lock("close-unpaid-orders")?.with_fixed_lease(Duration::from_secs(60))?;
    /// if let Some(guard) = job.try_lock()? {
    ///     // close the unpaid orders; no other server runs this within the next minute
    ///     guard.leak();
    /// }
    /// # Ok::<(), fairlock::Error>(())
    /// ```
    pub fn leak(mut self) -> u64 {
        self.released = true;
        let depth = self.hold.depth.get();
        self.hold.depth.set(depth.saturating_sub(1));
        self.hold.leaked.set(true);
        self.lock.forget_hold(&self.hold);
        crate::hold::remember_leaked(self.lock.hold_key(), *self.hold.state.expires.lock());
        self.hold.token
    }

    fn release(&mut self) -> Result<()> {
        if self.released {
            return Ok(());
        }
        self.released = true;
        let hold = &self.hold;
        let depth = hold.depth.get();
        hold.depth.set(depth.saturating_sub(1));
        if hold.leaked.get() {
            // another guard of this hold was leaked: the hold runs out by its lease
            return Ok(());
        }
        if depth <= 1 {
            // Stop renewing before the release goes out: a lease must never be extended for a
            // hold that is being given up (the next owner's lock has another token anyway).
            self.lock.forget_hold(hold);
        }
        let owner = self.lock.client().owner();
        let call = match hold.late_acquire {
            Some(attempt) => {
                self.lock
                    .raw()
                    .release_marking(&owner, hold.token, depth.max(1), attempt)
            }
            None => self.lock.raw().release(&owner, hold.token, depth.max(1)),
        };
        let outcome = self
            .lock
            .client()
            .with_conn(call.during(), |c| call.run(c))?;
        match outcome {
            Release::StillHeld | Release::Released { .. } => Ok(()),
            Release::NotHeld { holder } => {
                // counted once per hold: not when the watchdog found it first
                if !hold.state.lost.swap(true, Ordering::SeqCst) {
                    crate::telemetry::hold_lost("at_release", hold.metric.label());
                }
                Err(Error::NotHeld {
                    name: self.lock.name().to_string(),
                    kind: crate::kind::HoldKind::Lock,
                    holder,
                })
            }
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if let Err(e) = self.release() {
            log::warn!(
                "fairlock: releasing {:?} on drop failed: {e}",
                self.lock.name()
            );
        }
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("name", &self.lock.name())
            .field("fencing_token", &self.hold.token)
            .field("depth", &self.hold.depth.get())
            .finish()
    }
}
