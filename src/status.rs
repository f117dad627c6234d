//! The snapshots for people and tools: [`LockStatus`] of a lock, [`SemaphoreStatus`] of a
//! semaphore or read/write lock, each read in one script.

use std::time::Duration;

pub use crate::kind::Origin;
use crate::raw::{RawStatus, SemStatus};

/// Who holds a lock and who waits for it, read in one atomic step.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockStatus {
    /// The lock name.
    pub name: String,
    /// The current holder, if any.
    pub holder: Option<Holder>,
    /// The last fencing token handed out for this name (0 if never locked).
    pub fencing_counter: u64,
    /// Waiters in queue order (the first is served next).
    pub waiters: Vec<Waiter>,
}

/// The holder of a lock.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    /// Who holds it.
    pub origin: Origin,
    /// Re-entry depth.
    pub hold_count: u32,
    /// The hold's fencing token.
    pub fencing_token: u64,
    /// Lease left on the server.
    pub lease_remaining: Duration,
    /// The hold's lease: what each renewal resets the lease left to (a fixed lease is never
    /// renewed).
    pub lease: Duration,
    /// How long this hold has lasted (server clock).
    pub held_for: Duration,
}

impl Holder {
    /// Whether less than a third of the lease is left. The watchdog renews a hold every third of
    /// its lease, so a renewed hold that shows this has missed a renewal: its process is stalled
    /// or dead, or cannot reach Redis, and the lock frees itself when the lease runs out. A hold
    /// with a fixed lease ([`FairLock::with_fixed_lease`](crate::FairLock::with_fixed_lease))
    /// shows it in the last third of its lease, as it should.
    pub fn is_lease_running_out(&self) -> bool {
        self.lease_remaining.saturating_mul(3) < self.lease
    }
}

/// A waiter in the queue.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Waiter {
    /// Who waits.
    pub origin: Origin,
    /// How long since its first attempt reached Redis (server clock).
    pub waiting_for: Duration,
    /// When its first attempt reached Redis: the server's clock, since the Unix epoch, as stored
    /// with the queue entry. It names this wait: a thread that leaves the queue and comes back
    /// gets a later one.
    pub queued_at: Duration,
}

pub(crate) fn origin(owner: String, meta: &str) -> Origin {
    let mut parts = meta.splitn(3, '|');
    let host = parts.next().unwrap_or("").to_string();
    let pid = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let thread = parts.next().unwrap_or("").to_string();
    Origin {
        owner,
        host,
        pid,
        thread,
    }
}

fn ms(v: i64) -> Duration {
    Duration::from_millis(v.max(0) as u64)
}

impl LockStatus {
    pub(crate) fn from_raw(name: &str, raw: RawStatus) -> LockStatus {
        let holder = (!raw.owner.is_empty()).then(|| Holder {
            origin: origin(raw.owner.clone(), &raw.meta),
            hold_count: raw.count.max(0) as u32,
            fencing_token: raw.token,
            lease_remaining: ms(raw.pttl_ms),
            lease: ms(raw.lease_ms),
            held_for: ms(raw.server_ms - raw.since_ms),
        });
        let waiters = raw
            .queue
            .into_iter()
            .map(|(owner, arrival_us, meta)| Waiter {
                origin: origin(owner, &meta),
                waiting_for: ms(raw.server_ms - arrival_us / 1000),
                queued_at: Duration::from_micros(arrival_us.max(0) as u64),
            })
            .collect();
        LockStatus {
            name: name.to_string(),
            holder,
            fencing_counter: raw.fence,
            waiters,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(owner: &str, meta: &str) -> RawStatus {
        RawStatus {
            server_ms: 10_000,
            owner: owner.into(),
            count: 2,
            token: 77,
            pttl_ms: 2_500,
            since_ms: 4_000,
            meta: meta.into(),
            fence: 77,
            lease_ms: 30_000,
            queue: vec![
                ("c:2".into(), 9_000_000, "h2|12|worker|with|bars".into()),
                ("c:3".into(), 11_000_000, "".into()),
            ],
        }
    }

    #[test]
    fn a_held_lock_shows_its_holder_and_waiters_in_queue_order() {
        let s = LockStatus::from_raw("job", raw("c:1", "host-a|4242|main"));
        let h = s.holder.expect("held");
        assert_eq!(h.origin.owner, "c:1");
        assert_eq!((h.origin.host.as_str(), h.origin.pid), ("host-a", 4242));
        assert_eq!(h.origin.thread, "main");
        assert_eq!((h.hold_count, h.fencing_token), (2, 77));
        assert_eq!(h.lease_remaining, Duration::from_millis(2_500));
        assert_eq!(h.held_for, Duration::from_millis(6_000));
        assert_eq!(h.lease, Duration::from_secs(30));
        // 2.5 s of a 30 s lease: renewals were missed
        assert!(h.is_lease_running_out());
        let owners: Vec<&str> = s.waiters.iter().map(|w| w.origin.owner.as_str()).collect();
        assert_eq!(owners, ["c:2", "c:3"]);
        // a thread name may contain the separator; a waiter's meta may be missing
        assert_eq!(s.waiters[0].origin.thread, "worker|with|bars");
        assert_eq!(s.waiters[0].waiting_for, Duration::from_millis(1_000));
        assert_eq!(
            (s.waiters[1].origin.pid, s.waiters[1].origin.host.as_str()),
            (0, "")
        );
        // an arrival after the server's reading (another clock) is no negative wait
        assert_eq!(s.waiters[1].waiting_for, Duration::ZERO);
        assert_eq!(s.fencing_counter, 77);
    }

    #[test]
    fn a_lease_runs_out_below_a_third_of_it() {
        let left = |pttl_ms| {
            let mut r = raw("c:1", "h|1|t");
            r.pttl_ms = pttl_ms;
            LockStatus::from_raw("job", r).holder.expect("held")
        };
        assert!(!left(30_000).is_lease_running_out());
        assert!(!left(10_000).is_lease_running_out());
        assert!(left(9_999).is_lease_running_out());
        assert!(left(0).is_lease_running_out());
    }

    #[test]
    fn a_free_lock_has_no_holder_whatever_its_tombstone_says() {
        let mut r = raw("", "host-a|4242|main");
        r.pttl_ms = -2;
        r.count = -1;
        let s = LockStatus::from_raw("job", r);
        assert_eq!(s.holder, None);
        assert_eq!(s.waiters.len(), 2);
    }
}

/// Who holds permits and who waits for them, read in one atomic step.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SemaphoreStatus {
    /// The name.
    pub name: String,
    /// The capacity stored with the name (`None` when nothing is stored: nobody held or waited
    /// for the last lease's length and no [`Semaphore::set_capacity`](crate::Semaphore::set_capacity) within
    /// [`Config::fence_ttl`](crate::Config::fence_ttl)).
    pub capacity: Option<u64>,
    /// Permits held now by live holds.
    pub permits_held: u64,
    /// The last fencing token handed out for this name (0 if never used).
    pub fencing_counter: u64,
    /// The holds, one per acquisition.
    pub holders: Vec<PermitHolder>,
    /// Waiters in queue order (the first is served next).
    pub waiters: Vec<PermitWaiter>,
}

impl SemaphoreStatus {
    /// The status of semaphore `name` from the status script's reply.
    pub(crate) fn from_raw(name: &str, raw: SemStatus) -> SemaphoreStatus {
        let now_us = (raw.server_ms.max(0) as u64).saturating_mul(1000);
        SemaphoreStatus {
            name: name.to_string(),
            capacity: raw.capacity,
            permits_held: raw.used,
            fencing_counter: raw.last_token,
            holders: raw
                .holds
                .into_iter()
                .map(|h| {
                    let owner = h.id.rsplit_once('#').map_or(h.id.as_str(), |(o, _)| o);
                    PermitHolder {
                        origin: origin(owner.to_string(), &h.meta),
                        hold_id: h.id.clone(),
                        permits: h.permits,
                        fencing_token: h.token,
                        lease_remaining: h.pttl,
                        lease: h.lease,
                    }
                })
                .collect(),
            waiters: raw
                .waiters
                .into_iter()
                .map(|w| PermitWaiter {
                    origin: origin(w.owner, &w.meta),
                    permits: w.permits,
                    waiting_for: Duration::from_micros(now_us.saturating_sub(w.since_us)),
                    queued_at: Duration::from_micros(w.since_us),
                })
                .collect(),
        }
    }
}

/// One acquisition holding permits.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PermitHolder {
    /// The hold's id (`<owner>#<attempt>`), for [`Semaphore::force_release`](crate::Semaphore::force_release).
    pub hold_id: String,
    /// Who holds it.
    pub origin: Origin,
    /// Permits it holds.
    pub permits: u64,
    /// Its fencing token.
    pub fencing_token: u64,
    /// Lease left on the server.
    pub lease_remaining: Duration,
    /// Its lease (what a renewal extends it to).
    pub lease: Duration,
}

/// A waiter in a semaphore's queue.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PermitWaiter {
    /// Who waits.
    pub origin: Origin,
    /// Permits it wants.
    pub permits: u64,
    /// How long since its first attempt reached Redis (server clock).
    pub waiting_for: Duration,
    /// When its first attempt reached Redis (the server's clock, since the Unix epoch): it
    /// names this wait, as [`Waiter::queued_at`] does.
    pub queued_at: Duration,
}
