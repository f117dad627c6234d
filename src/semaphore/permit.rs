//! [`Permit`]: permits of a semaphore held, given back on drop.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::boot_clock::BootInstant;
use crate::error::{Error, Result};
use crate::hold::{Counted, HoldState};
use crate::loss::LostHold;
use crate::raw::SemRelease;
use crate::semaphore::Semaphore;

/// Permits of a [`Semaphore`] held: one acquisition. Dropping it gives the permits back (and
/// logs a warning if that fails); call [`Permit::release`] to see the error instead.
///
/// A permit is not tied to a thread (a semaphore is not re-entrant: each acquisition is its own
/// hold, named by the acquiring thread and the attempt), so it is `Send` and may be released
/// from another thread. While it lives the client's watchdog renews its lease, as a lock
/// guard's.
#[must_use = "the permits are given back as soon as the permit is dropped"]
pub struct Permit {
    sem: Semaphore,
    owner: String,
    attempt: u64,
    permits: u64,
    token: u64,
    state: Arc<HoldState>,
    renewal: Option<u64>,
    /// A copy of the acquire may still arrive: the release leaves a left mark.
    late_acquire: bool,
    released: bool,
    /// The hold in the metrics, while the permit lives.
    _metric: Counted,
}

impl Permit {
    pub(crate) fn new(
        sem: &Semaphore,
        owner: &str,
        attempt: u64,
        permits: u64,
        token: u64,
        expires: BootInstant,
        late_acquire: bool,
    ) -> Permit {
        let client = sem.client();
        let kind = sem.hold_kind(permits);
        let labelled = client.config.metrics_lock_label;
        let state = Arc::new(HoldState::new(sem.name(), kind, token, expires, labelled));
        let renewal = sem.renewed_lease().map(|lease| {
            client.watchdog.register(
                sem.raw().renew(owner, attempt, token, lease),
                token,
                lease,
                state.clone(),
                expires,
            )
        });
        Permit {
            sem: sem.clone(),
            owner: owner.to_string(),
            attempt,
            permits,
            token,
            state,
            renewal,
            late_acquire,
            released: false,
            _metric: Counted::start(labelled.then(|| sem.name().to_string())),
        }
    }

    /// The fencing token of this acquisition: greater than every token handed out before for
    /// this semaphore's name (to any holder). A resource that one holder at a time may write
    /// (a write of a read/write lock) rejects a token lower than the highest it has accepted, as
    /// for a lock; with several holders, a token tells their grants apart and orders them.
    pub fn fencing_token(&self) -> u64 {
        self.token
    }

    /// How many permits this acquisition holds.
    pub fn permits(&self) -> u64 {
        self.permits
    }

    /// The semaphore the permits are of.
    pub fn semaphore(&self) -> &Semaphore {
        &self.sem
    }

    /// The id of this hold as [`SemaphoreStatus`](crate::SemaphoreStatus) shows it
    /// (`<owner>#<attempt>`), for [`Semaphore::force_release`].
    pub fn hold_id(&self) -> String {
        format!("{}#{}", self.owner, self.attempt)
    }

    /// True when the permits are no longer this holder's for sure: the watchdog found the hold
    /// gone, a release found it gone, or the lease ran out by the local estimate. Local: no call
    /// to Redis.
    pub fn is_lost(&self) -> bool {
        self.state.lost.load(Ordering::SeqCst) || *self.state.expires.lock() <= BootInstant::now()
    }

    /// A channel that receives one [`LostHold`] when the watchdog finds this hold lost (as
    /// [`LockGuard::lost_signal`](crate::LockGuard::lost_signal)).
    pub fn lost_signal(&self) -> crossbeam_channel::Receiver<LostHold> {
        self.state.loss.receiver()
    }

    /// The lease left by the local estimate (never later than the server's).
    pub fn lease_remaining(&self) -> Duration {
        self.state
            .expires
            .lock()
            .saturating_duration_since(BootInstant::now())
    }

    /// Give the permits back now. The queue's heads that now fit are granted them in the same
    /// step.
    ///
    /// # Errors
    /// [`Error::NotHeld`] when the hold was lost before (its lease ran out, or it was released by
    /// force): nothing was changed. [`Error::Connection`] when Redis cannot be reached (the
    /// permits come back when their lease runs out).
    pub fn release(mut self) -> Result<()> {
        self.release_inner()
    }

    /// Give up this permit *without* giving its permits back: they stay held in Redis until
    /// the lease runs out, and are not renewed any more (the watchdog forgets them). For a job
    /// that must hold its share for a fixed period after it is done, even across servers (with
    /// [`Semaphore::with_fixed_lease`], as
    /// [`LockGuard::leak`](crate::LockGuard::leak) for a lock). Returns the fencing token.
    ///
    /// Until the lease ends the hold counts like anyone's: [`Semaphore::status`] shows it
    /// (under [`Permit::hold_id`], read that before leaking if you may want to end it early),
    /// later acquisitions, this thread's too, wait behind it or are refused, and
    /// [`Semaphore::force_release`] ends it early. Then its permits come back and go to the
    /// waiters they fit, as a crashed holder's do. The loss channel of
    /// [`Permit::lost_signal`] disconnects (no loss is told for a leaked permit). With a renewed
    /// lease the permits are held for up to one lease from the last renewal.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let client = fairlock::LockClient::connect("redis://127.0.0.1:6379/")?;
    /// let exports = client.semaphore("exports", 3)?.with_fixed_lease(Duration::from_secs(60))?;
    /// if let Some(permit) = exports.try_acquire()? {
    ///     // start an export; at most 3 start within any minute, whatever the servers
    ///     permit.leak();
    /// }
    /// # Ok::<(), fairlock::Error>(())
    /// ```
    pub fn leak(mut self) -> u64 {
        self.released = true;
        // (in a forked child the parent's watchdog, whose registry lock a fork may have taken
        // mid-use, is not touched; it does not run in the child anyway)
        if let (Some(id), Ok(())) = (self.renewal, self.sem.client().check_fork()) {
            self.sem.client().watchdog.unregister(id);
        }
        self.token
    }

    fn release_inner(&mut self) -> Result<()> {
        if self.released {
            return Ok(());
        }
        // in a forked child: nothing is sent, and the parent's watchdog (whose registry lock a
        // fork may have taken mid-use) is not touched
        self.sem.client().check_fork()?;
        self.released = true;
        // stop renewing before the release goes out
        if let Some(id) = self.renewal {
            self.sem.client().watchdog.unregister(id);
        }
        let call = self
            .sem
            .raw()
            .release(&self.owner, self.attempt, self.token, self.late_acquire);
        let outcome = self
            .sem
            .client()
            .with_conn(call.during(), |c| call.run(c))?;
        match outcome {
            SemRelease::Released { .. } => Ok(()),
            SemRelease::NotHeld => {
                self.state.lost.store(true, Ordering::SeqCst);
                Err(Error::NotHeld {
                    name: self.sem.name().to_string(),
                    kind: self.sem.hold_kind(self.permits),
                    holder: None,
                })
            }
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Err(e) = self.release_inner() {
            log::warn!(
                "fairlock: giving back permits of {:?} on drop failed: {e}",
                self.sem.name()
            );
        }
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("name", &self.sem.name())
            .field("permits", &self.permits)
            .field("fencing_token", &self.token)
            .finish()
    }
}
