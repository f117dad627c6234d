//! [`Deadlock`]: a cycle of the wait-for graph as people and tools read it, and which member's
//! wait is the youngest ([`Deadlock::youngest_wait`], the rule for breaking one).

use std::time::Duration;

use crate::deadlock::graph::{Step, Via};
use crate::deadlock::snapshot::Resource;
use crate::kind::HoldKind;
use crate::status::Origin;

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
    /// as it has waited least.
    ///
    /// ```
    /// # fn show(d: &fairlock::Deadlock) {
    /// let v = d.youngest_wait();
    /// println!("break it at {} pid {} ({})", v.holder.host, v.holder.pid, v.holder.owner);
    /// # }
    /// ```
    pub fn youngest_wait(&self) -> &DeadlockMember {
        youngest(&self.members).expect("a deadlock has members")
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
fn youngest(members: &[DeadlockMember]) -> Option<&DeadlockMember> {
    members.iter().min_by(|a, b| {
        b.queued_at
            .cmp(&a.queued_at)
            .then_with(|| a.holder.owner.cmp(&b.holder.owner))
    })
}

/// The cycle `steps` of `resources` as a [`Deadlock`].
pub(crate) fn deadlock(resources: &[Resource], steps: &[Step]) -> Deadlock {
    let members = steps
        .iter()
        .enumerate()
        .map(|(i, step)| {
            let res = &resources[step.resource];
            let next = &steps[(i + 1) % steps.len()];
            let next_wait = &resources[next.resource].waits[next.wait];
            let (kind, holder, blocking) = match step.via {
                Via::Hold(h) => {
                    let h = &res.holds[h];
                    let blocking = Blocking::Holds {
                        fencing_token: h.fencing_token,
                        permits: h.permits,
                    };
                    (h.kind, h.origin.clone(), blocking)
                }
                Via::Ahead(w) => {
                    let w = &res.waits[w];
                    (w.kind, w.origin.clone(), Blocking::QueuedAhead)
                }
            };
            DeadlockMember {
                lock: LockRef {
                    name: res.name.clone(),
                    kind,
                },
                holder,
                blocking,
                waits_for: LockRef {
                    name: resources[next.resource].name.clone(),
                    kind: next_wait.kind,
                },
                waiting_for: next_wait.waiting_for,
                queued_at: next_wait.queued_at,
            }
        })
        .collect();
    Deadlock { members }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deadlock::graph::analyse;
    use crate::deadlock::snapshot::tests::{lock, semaphore};

    fn found(resources: Vec<Resource>) -> Vec<Deadlock> {
        let (resources, a) = analyse(resources);
        a.cycles.iter().map(|c| deadlock(&resources, c)).collect()
    }

    #[test]
    fn each_member_names_its_lock_its_holder_and_what_the_holder_waits_for() {
        let d = found(vec![
            lock("a", Some("c:1"), &["c:2"]),
            lock("b", Some("c:2"), &["c:1"]),
        ]);
        assert_eq!(d.len(), 1);
        let m: Vec<(&str, &str, &str)> = d[0]
            .members
            .iter()
            .map(|m| {
                (
                    m.lock.name.as_str(),
                    m.holder.owner.as_str(),
                    m.waits_for.name.as_str(),
                )
            })
            .collect();
        // c:1 waits for b: b is held by c:2, which waits for a, held by c:1, which waits for b
        assert_eq!(m, [("b", "c:2", "a"), ("a", "c:1", "b")]);
        assert_eq!(
            d[0].members[0].blocking,
            Blocking::Holds {
                fencing_token: 7,
                permits: 1
            }
        );
        assert_eq!(d[0].members[0].lock.kind, HoldKind::Lock);
        assert_eq!(d[0].members[0].holder.thread, "t-c:2");
        assert!(d[0].involves("a", HoldKind::Lock));
        assert!(!d[0].involves("a", HoldKind::Semaphore));
        assert!(!d[0].involves("x", HoldKind::Lock));
    }

    #[test]
    fn a_reader_queued_ahead_is_named_as_such_with_its_kind() {
        let rw = 1 << 30;
        let mut s = semaphore("rw", rw, &[("c:1", 1)], &[("c:2", rw), ("c:1", 1)]);
        s.holds[0].kind = HoldKind::Read;
        s.waits[0].kind = HoldKind::Write;
        s.waits[1].kind = HoldKind::Read;
        let d = found(vec![s]);
        let m = &d[0].members;
        // c:1's read waits behind c:2's write, which waits for c:1's read to end
        assert_eq!(m[0].holder.owner, "c:2");
        assert_eq!(m[0].blocking, Blocking::QueuedAhead);
        assert_eq!(m[0].lock.kind, HoldKind::Write);
        assert_eq!(m[1].holder.owner, "c:1");
        assert_eq!(m[1].lock.kind, HoldKind::Read);
        assert_eq!(m[1].waits_for.kind, HoldKind::Read);
        assert!(d[0].involves("rw", HoldKind::Read));
    }

    #[test]
    fn the_youngest_wait_is_the_latest_queued_ties_by_owner() {
        let d = &found(vec![
            lock("a", Some("c:1"), &["c:3"]),
            lock("b", Some("c:2"), &["c:1"]),
            lock("c", Some("c:3"), &["c:2"]),
        ])[0];
        let mut d = d.clone();
        let at = |s| Duration::from_secs(s);
        d.members[0].queued_at = at(5);
        d.members[1].queued_at = at(9);
        d.members[2].queued_at = at(7);
        let v = d.youngest_wait().holder.owner.clone();
        assert_eq!(v, d.members[1].holder.owner);
        // a tie goes to the smallest owner id, wherever it is in the cycle
        d.members[2].queued_at = at(9);
        let smaller = d.members[1]
            .holder
            .owner
            .clone()
            .min(d.members[2].holder.owner.clone());
        assert_eq!(d.youngest_wait().holder.owner, smaller);
        let mut rotated = d.clone();
        rotated.members.rotate_left(1);
        assert_eq!(rotated.youngest_wait(), d.youngest_wait());
        assert_eq!(youngest(&[]), None);
    }
}
