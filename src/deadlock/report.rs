//! A cycle of the graph as a [`Deadlock`] (the type lives in `cycle`, below the error type).

use crate::cycle::{Blocking, Deadlock, DeadlockMember, LockRef};
use crate::deadlock::graph::{Step, Via};
use crate::deadlock::snapshot::Resource;

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
    use std::time::Duration;

    use super::*;
    use crate::cycle::youngest;
    use crate::deadlock::graph::analyse;
    use crate::deadlock::snapshot::tests::{lock, semaphore};
    use crate::kind::HoldKind;

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
        let v = d.youngest_wait().unwrap().holder.owner.clone();
        assert_eq!(v, d.members[1].holder.owner);
        // a tie goes to the smallest owner id, wherever it is in the cycle
        d.members[2].queued_at = at(9);
        let smaller = d.members[1]
            .holder
            .owner
            .clone()
            .min(d.members[2].holder.owner.clone());
        assert_eq!(d.youngest_wait().unwrap().holder.owner, smaller);
        let mut rotated = d.clone();
        rotated.members.rotate_left(1);
        assert_eq!(rotated.youngest_wait(), d.youngest_wait());
        assert_eq!(youngest(&[]), None);
    }
}
