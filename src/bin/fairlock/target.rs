//! What `run` and `hold` take: a lock, or permits of a semaphore (`--permits N`). The rest of
//! the tool handles both alike through [`Target`] and [`Held`].

use crossbeam_channel::Receiver;
use fairlock::{FairLock, LockGuard, LostHold, Permit, Semaphore, WaitCanceller};

use crate::duration::human;
use crate::holder::Wait;
use crate::status::describe_origin;

/// A lock, or `permits` permits of a semaphore.
#[derive(Clone)]
pub enum Target {
    Lock(FairLock),
    Permits { sem: Semaphore, permits: u64 },
}

/// What the lock thread holds.
pub enum Held {
    Guard(LockGuard),
    Permit(Permit),
}

impl Target {
    pub fn name(&self) -> &str {
        match self {
            Target::Lock(lock) => lock.name(),
            Target::Permits { sem, .. } => sem.name(),
        }
    }

    /// "lock" or "semaphore", for messages.
    pub fn noun(&self) -> &'static str {
        match self {
            Target::Lock(_) => "lock",
            Target::Permits { .. } => "semaphore",
        }
    }

    /// Made on the thread that will wait.
    pub fn wait_canceller(&self) -> WaitCanceller {
        match self {
            Target::Lock(lock) => lock.wait_canceller(),
            Target::Permits { sem, .. } => sem.wait_canceller(),
        }
    }

    pub fn take(&self, wait: Wait) -> fairlock::Result<Option<Held>> {
        match self {
            Target::Lock(lock) => {
                let guard = match wait {
                    Wait::No => lock.try_lock()?,
                    Wait::For(d) => lock.try_lock_for(d)?,
                    Wait::Forever => Some(lock.lock()?),
                };
                Ok(guard.map(Held::Guard))
            }
            Target::Permits { sem, permits } => {
                let permit = match wait {
                    Wait::No => sem.try_acquire_many(*permits)?,
                    Wait::For(d) => sem.try_acquire_many_for(*permits, d)?,
                    Wait::Forever => Some(sem.acquire_many(*permits)?),
                };
                Ok(permit.map(Held::Permit))
            }
        }
    }

    /// Who keeps it busy, as " (held by ...)", or "" when that cannot be told.
    pub fn busy_detail(&self) -> String {
        match self {
            Target::Lock(lock) => match lock.status() {
                Ok(st) => match &st.holder {
                    Some(h) => format!(
                        " (held by {} for {})",
                        describe_origin(&h.origin),
                        human(h.held_for)
                    ),
                    None if !st.waiters.is_empty() => format!(
                        " (being handed to the first of {} waiters)",
                        st.waiters.len()
                    ),
                    None => String::new(),
                },
                Err(_) => String::new(),
            },
            Target::Permits { sem, .. } => match sem.status() {
                Ok(st) => format!(
                    " ({} of {} permits held by {} holders, {} waiting)",
                    st.permits_held,
                    st.capacity.unwrap_or(sem.capacity()),
                    st.holders.len(),
                    st.waiters.len()
                ),
                Err(_) => String::new(),
            },
        }
    }

    /// The live line's text while `owner` waits (`None` when the status cannot be read).
    pub fn waiting_text(
        &self,
        owner: &str,
        coarse: fn(std::time::Duration) -> String,
    ) -> Option<String> {
        let place = |position: Option<usize>, of: usize| match position {
            Some(i) => format!("{} of {of} in the queue", i + 1),
            None => "joining the queue".to_string(),
        };
        Some(match self {
            Target::Lock(lock) => {
                let st = lock.status().ok()?;
                let at = st.waiters.iter().position(|w| w.origin.owner == owner);
                let holder = match &st.holder {
                    Some(h) => format!(
                        "held by {} for {}",
                        describe_origin(&h.origin),
                        coarse(h.held_for)
                    ),
                    None => "being handed over".to_string(),
                };
                format!(
                    "fairlock: waiting for {:?}: {}; {holder}",
                    lock.name(),
                    place(at, st.waiters.len())
                )
            }
            Target::Permits { sem, permits } => {
                let st = sem.status().ok()?;
                let at = st.waiters.iter().position(|w| w.origin.owner == owner);
                format!(
                    "fairlock: waiting for {permits} of {:?}: {}; {} of {} permits held by {} holders",
                    sem.name(),
                    place(at, st.waiters.len()),
                    st.permits_held,
                    st.capacity.unwrap_or(sem.capacity()),
                    st.holders.len()
                )
            }
        })
    }

    /// Why the hold was lost, as well as can be told now (`owner`: ours).
    pub fn loss_cause(&self, owner: &str) -> String {
        match self {
            Target::Lock(lock) => match lock.status() {
                Ok(st) => match st.holder {
                    Some(h) if h.origin.owner != owner => format!(
                        "it was force-released or its lease ran out; it is now held by {}",
                        describe_origin(&h.origin)
                    ),
                    _ => "it was force-released or its lease ran out".to_string(),
                },
                Err(_) => "Redis was unreachable for longer than the lease".to_string(),
            },
            Target::Permits { sem, .. } => match sem.status() {
                Ok(_) => "they were force-released or their lease ran out".to_string(),
                Err(_) => "Redis was unreachable for longer than the lease".to_string(),
            },
        }
    }
}

impl Held {
    pub fn fencing_token(&self) -> u64 {
        match self {
            Held::Guard(g) => g.fencing_token(),
            Held::Permit(p) => p.fencing_token(),
        }
    }

    pub fn lost_signal(&self) -> Receiver<LostHold> {
        match self {
            Held::Guard(g) => g.lost_signal(),
            Held::Permit(p) => p.lost_signal(),
        }
    }

    pub fn is_lost(&self) -> bool {
        match self {
            Held::Guard(g) => g.is_lost(),
            Held::Permit(p) => p.is_lost(),
        }
    }

    pub fn release(self) -> fairlock::Result<()> {
        match self {
            Held::Guard(g) => g.unlock(),
            Held::Permit(p) => p.release(),
        }
    }
}
