//! [`Deadlock`]: a cycle of the wait-for graph as people and tools read it, and which member's
//! wait is the youngest ([`Deadlock::youngest_wait`], the rule for breaking one). Plain data,
//! below the error type, which carries one in [`Error::Deadlock`](crate::Error::Deadlock).

use std::time::Duration;

use crate::kind::{HoldKind, Origin};

/// A cycle of waits among holders of locks, semaphores and read/write locks, each blocked for
/// as long as the next one is: nobody in it is served until one of them gives up (a timed wait
/// ends, a process dies and its lease runs out, or an operator releases a hold).
///
/// Found by [`LockClient::find_deadlocks`](crate::LockClient::find_deadlocks), which reports a
/// cycle only when two readings of every lock in it agree (see there).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Deadlock {
    /// In the order of the cycle: each member's holder waits for the next member's lock, and
    /// the last one's for the first one's. The first is the lock that the smallest owner id of
    /// the cycle waits for (so the last member's holder is that owner).
    pub members: Vec<DeadlockMember>,
}

/// One lock of a [`Deadlock`], who keeps the previous member's holder out of it, and what that
/// one waits for.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadlockMember {
    /// The lock (or semaphore, or read/write lock), and what `holder` holds of it (or, when it is
    /// [`Blocking::QueuedAhead`], wants of it).
    pub lock: LockRef,
    /// Who holds it (or waits ahead in its queue).
    pub holder: Origin,
    /// How `holder` keeps the previous member's holder out of `lock`.
    pub blocking: Blocking,
    /// What `holder` waits for: the next member's lock.
    pub waits_for: LockRef,
    /// How long `holder` has waited for it (server clock, at the reading).
    pub waiting_for: Duration,
    /// When `holder`'s wait reached Redis (server clock, since the Unix epoch; see
    /// [`Waiter::queued_at`](crate::Waiter::queued_at)).
    pub queued_at: Duration,
}

/// A lock, semaphore or read/write lock by name, and what is held or wanted of it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockRef {
    /// The name.
    pub name: String,
    /// [`HoldKind::Lock`] for a [`FairLock`](crate::FairLock), [`HoldKind::Semaphore`] for
    /// permits, [`HoldKind::Read`] or [`HoldKind::Write`] for a read/write lock.
    pub kind: HoldKind,
}

/// How a member's holder keeps the waiter before it out of its lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Blocking {
    /// It holds the lock (or these permits of it) with this fencing token.
    Holds {
        /// The hold's fencing token.
        fencing_token: u64,
        /// Permits held (1 for a lock; 2^30 for a read/write lock's write).
        permits: u64,
    },
    /// It waits ahead in the lock's queue, which is served in order: the waiter behind cannot
    /// be served before it is (a reader behind a writer that waits for a read).
    QueuedAhead,
}

impl Deadlock {
    /// The member whose holder's wait is the youngest (the latest [`DeadlockMember::queued_at`];
    /// ties: the smallest owner id). Every reader of the same cycle picks the same one, from
    /// values stored in Redis, whatever its clock: it is the one to refuse to break the cycle,
    /// as it has waited least. `None` only for a `Deadlock` whose `members` were emptied after
    /// it was found (every one fairlock reports has at least one).
    ///
    /// ```
    /// # fn show(d: &fairlock::Deadlock) {
    /// if let Some(v) = d.youngest_wait() {
    ///     println!("break it at {} pid {} ({})", v.holder.host, v.holder.pid, v.holder.owner);
    /// }
    /// # }
    /// ```
    pub fn youngest_wait(&self) -> Option<&DeadlockMember> {
        youngest(&self.members)
    }

    /// Whether `name`, as a lock of `kind`'s primitive, is one of the cycle's locks
    /// ([`HoldKind::Lock`] for a [`FairLock`](crate::FairLock); any other kind for a semaphore or
    /// read/write lock).
    pub fn involves(&self, name: &str, kind: HoldKind) -> bool {
        let lock = |k: HoldKind| k == HoldKind::Lock;
        self.members
            .iter()
            .any(|m| m.lock.name == name && lock(m.lock.kind) == lock(kind))
    }
}

/// The member with the latest `queued_at`, ties the smallest owner id; `None` for none.
pub(crate) fn youngest(members: &[DeadlockMember]) -> Option<&DeadlockMember> {
    members.iter().min_by(|a, b| {
        b.queued_at
            .cmp(&a.queued_at)
            .then_with(|| a.holder.owner.cmp(&b.holder.owner))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(lock: &str, kind: HoldKind, owner: &str, queued_at: u64) -> DeadlockMember {
        DeadlockMember {
            lock: LockRef {
                name: lock.into(),
                kind,
            },
            holder: Origin {
                owner: owner.into(),
                host: "h".into(),
                pid: 1,
                thread: "t".into(),
            },
            blocking: Blocking::QueuedAhead,
            waits_for: LockRef {
                name: "next".into(),
                kind: HoldKind::Lock,
            },
            waiting_for: Duration::from_secs(1),
            queued_at: Duration::from_secs(queued_at),
        }
    }

    /// The owner whose wait the rule picks (`None`: no member at all, which fails the caller's
    /// comparison with an owner).
    fn victim(members: Vec<DeadlockMember>) -> Option<String> {
        Deadlock { members }
            .youngest_wait()
            .map(|m| m.holder.owner.clone())
    }

    #[test]
    fn the_youngest_wait_is_the_latest_queued_and_ties_go_to_the_smallest_owner() {
        let members = vec![
            member("a", HoldKind::Lock, "c:2", 50),
            member("b", HoldKind::Lock, "c:1", 70),
            member("c", HoldKind::Lock, "c:3", 60),
        ];
        assert_eq!(victim(members.clone()).as_deref(), Some("c:1"));
        let mut reversed = members;
        reversed.reverse();
        assert_eq!(victim(reversed).as_deref(), Some("c:1"));
        // the same queued_at: the smallest owner id, wherever it stands in the cycle
        let tied = vec![
            member("a", HoldKind::Lock, "c:3", 70),
            member("b", HoldKind::Lock, "c:1", 70),
            member("c", HoldKind::Lock, "c:2", 70),
            member("d", HoldKind::Lock, "c:0", 69),
        ];
        assert_eq!(victim(tied.clone()).as_deref(), Some("c:1"));
        let mut reversed = tied;
        reversed.reverse();
        assert_eq!(victim(reversed).as_deref(), Some("c:1"));
        assert_eq!(youngest(&[]), None);
    }

    #[test]
    fn a_deadlock_involves_its_locks_by_name_and_primitive_only() {
        let d = Deadlock {
            members: vec![
                member("a", HoldKind::Lock, "c:1", 1),
                member("rw", HoldKind::Read, "c:2", 2),
                member("s", HoldKind::Semaphore, "c:3", 3),
            ],
        };
        assert!(d.involves("a", HoldKind::Lock));
        // a semaphore or read/write lock named like a lock of the cycle is another one
        assert!(!d.involves("a", HoldKind::Semaphore));
        assert!(!d.involves("a", HoldKind::Write));
        // a read/write lock and a semaphore are one keyspace: any of their kinds
        for kind in [HoldKind::Read, HoldKind::Write, HoldKind::Semaphore] {
            assert!(d.involves("rw", kind), "{kind:?}");
            assert!(d.involves("s", kind), "{kind:?}");
        }
        assert!(!d.involves("rw", HoldKind::Lock));
        assert!(!d.involves("s", HoldKind::Lock));
        for kind in [HoldKind::Lock, HoldKind::Semaphore] {
            assert!(!d.involves("b", kind), "{kind:?}");
        }
    }
}
