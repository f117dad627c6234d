//! The wait-for graph's input: every lock, semaphore and read/write lock as one shape (a
//! capacity, holds, waits in queue order), built from the statuses, and the intersection of two
//! readings of one name (what stood through both).

use std::time::Duration;

use crate::kind::HoldKind;
use crate::raw::RW_CAPACITY;
use crate::status::{LockStatus, Origin, SemaphoreStatus};

/// Which primitive a name is used as: a lock and a semaphore of one name are two resources.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Primitive {
    /// A [`FairLock`](crate::FairLock).
    Lock,
    /// A [`Semaphore`](crate::Semaphore) or an [`RwLock`](crate::RwLock) (one keyspace).
    Semaphore,
}

/// A resource's identity: its primitive and name.
pub(crate) type ResourceKey = (Primitive, String);

/// One hold on a resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Hold {
    /// Names this hold across readings: the owner for a lock, the hold id for permits.
    pub id: String,
    pub origin: Origin,
    pub kind: HoldKind,
    pub fencing_token: u64,
    pub permits: u64,
}

/// One wait in a resource's queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Wait {
    pub origin: Origin,
    pub kind: HoldKind,
    pub permits: u64,
    pub waiting_for: Duration,
    /// Names this wait across readings (with the owner).
    pub queued_at: Duration,
}

/// A lock, semaphore or read/write lock as the graph sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Resource {
    pub primitive: Primitive,
    pub name: String,
    /// Permits in all (1 for a lock); `None` when unknown, and then no wait for it is proven
    /// blocked by its holders (only by a blocked waiter ahead of it).
    pub capacity: Option<u64>,
    pub holds: Vec<Hold>,
    /// In queue order: the first is served first.
    pub waits: Vec<Wait>,
}

impl Resource {
    pub fn key(&self) -> ResourceKey {
        (self.primitive, self.name.clone())
    }

    /// A lock's status: one hold of one permit at most, capacity 1.
    pub fn of_lock(st: &LockStatus) -> Resource {
        Resource {
            primitive: Primitive::Lock,
            name: st.name.clone(),
            capacity: Some(1),
            holds: st
                .holder
                .iter()
                .map(|h| Hold {
                    id: h.origin.owner.clone(),
                    origin: h.origin.clone(),
                    kind: HoldKind::Lock,
                    fencing_token: h.fencing_token,
                    permits: 1,
                })
                .collect(),
            waits: st
                .waiters
                .iter()
                .map(|w| Wait {
                    origin: w.origin.clone(),
                    kind: HoldKind::Lock,
                    permits: 1,
                    waiting_for: w.waiting_for,
                    queued_at: w.queued_at,
                })
                .collect(),
        }
    }

    /// A semaphore's (or read/write lock's: capacity 2^30, a write takes all of it) status.
    pub fn of_semaphore(st: &SemaphoreStatus) -> Resource {
        let rw = st.capacity == Some(RW_CAPACITY);
        let kind = |permits: u64| match (rw, permits == RW_CAPACITY) {
            (false, _) => HoldKind::Semaphore,
            (true, true) => HoldKind::Write,
            (true, false) => HoldKind::Read,
        };
        Resource {
            primitive: Primitive::Semaphore,
            name: st.name.clone(),
            capacity: st.capacity,
            holds: st
                .holders
                .iter()
                .map(|h| Hold {
                    id: h.hold_id.clone(),
                    origin: h.origin.clone(),
                    kind: kind(h.permits),
                    fencing_token: h.fencing_token,
                    permits: h.permits,
                })
                .collect(),
            waits: st
                .waiters
                .iter()
                .map(|w| Wait {
                    origin: w.origin.clone(),
                    kind: kind(w.permits),
                    permits: w.permits,
                    waiting_for: w.waiting_for,
                    queued_at: w.queued_at,
                })
                .collect(),
        }
    }

    /// What stood through two readings of this resource, `self` the earlier and `later` the
    /// later: the holds with the same id and fencing token in both, the waits with the same
    /// owner, permits and `queued_at` in both (in the later reading's order, its times), and the
    /// capacity if it did not change. A hold's token and a wait's `queued_at` name it: one
    /// that is in both readings lasted from the first to the second, without a gap.
    pub fn intersect(&self, later: &Resource) -> Resource {
        let holds = later
            .holds
            .iter()
            .filter(|h| {
                self.holds
                    .iter()
                    .any(|e| e.id == h.id && e.fencing_token == h.fencing_token)
            })
            .cloned()
            .collect();
        let waits = later
            .waits
            .iter()
            .filter(|w| {
                self.waits.iter().any(|e| {
                    e.origin.owner == w.origin.owner
                        && e.queued_at == w.queued_at
                        && e.permits == w.permits
                })
            })
            .cloned()
            .collect();
        Resource {
            primitive: later.primitive,
            name: later.name.clone(),
            capacity: later.capacity.filter(|c| Some(*c) == self.capacity),
            holds,
            waits,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::status::{PermitHolder, PermitWaiter};

    pub fn origin(owner: &str) -> Origin {
        Origin {
            owner: owner.into(),
            host: "h".into(),
            pid: 1,
            thread: format!("t-{owner}"),
        }
    }

    /// A lock `name` held by `holder` (token 7) with `waiters` queued in this order; each
    /// waiter's `queued_at` and `waiting_for` are its position.
    pub fn lock(name: &str, holder: Option<&str>, waiters: &[&str]) -> Resource {
        Resource {
            primitive: Primitive::Lock,
            name: name.into(),
            capacity: Some(1),
            holds: holder
                .iter()
                .map(|h| Hold {
                    id: h.to_string(),
                    origin: origin(h),
                    kind: HoldKind::Lock,
                    fencing_token: 7,
                    permits: 1,
                })
                .collect(),
            waits: waiters
                .iter()
                .enumerate()
                .map(|(i, w)| Wait {
                    origin: origin(w),
                    kind: HoldKind::Lock,
                    permits: 1,
                    waiting_for: Duration::from_secs(i as u64 + 1),
                    queued_at: Duration::from_secs(100 - i as u64),
                })
                .collect(),
        }
    }

    /// A semaphore of `capacity` with `holds` (owner, permits) and `waits` (owner, permits).
    pub fn semaphore(
        name: &str,
        capacity: u64,
        holds: &[(&str, u64)],
        waits: &[(&str, u64)],
    ) -> Resource {
        Resource {
            primitive: Primitive::Semaphore,
            name: name.into(),
            capacity: Some(capacity),
            holds: holds
                .iter()
                .enumerate()
                .map(|(i, (o, p))| Hold {
                    id: format!("{o}#{i}"),
                    origin: origin(o),
                    kind: HoldKind::Semaphore,
                    fencing_token: 10 + i as u64,
                    permits: *p,
                })
                .collect(),
            waits: waits
                .iter()
                .enumerate()
                .map(|(i, (o, p))| Wait {
                    origin: origin(o),
                    kind: HoldKind::Semaphore,
                    permits: *p,
                    waiting_for: Duration::from_secs(i as u64 + 1),
                    queued_at: Duration::from_secs(100 - i as u64),
                })
                .collect(),
        }
    }

    #[test]
    fn the_intersection_keeps_what_stood_through_both_readings() {
        let before = lock("a", Some("c:1"), &["c:2", "c:3"]);
        // the same hold and waits: all kept
        assert_eq!(before.intersect(&before), before);
        // a new hold of the same owner (another token) is not the hold read first
        let mut later = before.clone();
        later.holds[0].fencing_token = 8;
        assert!(before.intersect(&later).holds.is_empty());
        // c:2 left and queued again: a later queued_at, another wait
        let mut later = before.clone();
        later.waits[0].queued_at += Duration::from_millis(1);
        let kept = before.intersect(&later);
        let owners: Vec<&str> = kept.waits.iter().map(|w| w.origin.owner.as_str()).collect();
        assert_eq!(owners, ["c:3"]);
        // a changed capacity is unknown
        let s = semaphore("s", 2, &[("c:1", 1)], &[("c:2", 2)]);
        let mut later = s.clone();
        later.capacity = Some(3);
        assert_eq!(s.intersect(&later).capacity, None);
        assert_eq!(s.intersect(&s).capacity, Some(2));
    }

    fn permit_holder(owner: &str, permits: u64) -> PermitHolder {
        PermitHolder {
            hold_id: format!("{owner}#1"),
            origin: origin(owner),
            permits,
            fencing_token: 5,
            lease_remaining: Duration::from_secs(1),
            lease: Duration::from_secs(2),
        }
    }

    fn permit_waiter(owner: &str, permits: u64) -> PermitWaiter {
        PermitWaiter {
            origin: origin(owner),
            permits,
            waiting_for: Duration::from_secs(3),
            queued_at: Duration::from_secs(40),
        }
    }

    fn status(capacity: Option<u64>) -> SemaphoreStatus {
        SemaphoreStatus {
            name: "s".into(),
            capacity,
            permits_held: 0,
            fencing_counter: 5,
            holders: vec![permit_holder("c:1", 1), permit_holder("c:2", RW_CAPACITY)],
            waiters: vec![permit_waiter("c:3", RW_CAPACITY), permit_waiter("c:4", 1)],
        }
    }

    fn kinds(r: &Resource) -> Vec<HoldKind> {
        r.holds
            .iter()
            .map(|h| h.kind)
            .chain(r.waits.iter().map(|w| w.kind))
            .collect()
    }

    #[test]
    fn a_read_write_lock_is_told_from_a_semaphore_by_its_capacity() {
        use HoldKind::{Read, Semaphore, Write};
        let rw = Resource::of_semaphore(&status(Some(RW_CAPACITY)));
        assert_eq!(kinds(&rw), [Read, Write, Write, Read]);
        assert_eq!(rw.capacity, Some(RW_CAPACITY));
        assert_eq!(rw.key(), (Primitive::Semaphore, "s".to_string()));
        // (a semaphore's permits are never a write, however many)
        for capacity in [Some(2), None] {
            let s = Resource::of_semaphore(&status(capacity));
            assert_eq!(kinds(&s), [Semaphore; 4], "{capacity:?}");
            assert_eq!(s.capacity, capacity);
        }
        let s = Resource::of_semaphore(&status(Some(2)));
        assert_eq!(s.holds[1].id, "c:2#1");
        assert_eq!(s.holds[1].permits, RW_CAPACITY);
        assert_eq!(s.waits[0].origin.owner, "c:3");
        assert_eq!(s.waits[0].queued_at, Duration::from_secs(40));
    }
}
