//! The wait-for graph and its cycles, as pure functions of [`Resource`]s (no I/O, no clock):
//! which waiting owners are proven blocked for ever, then one elementary cycle per strongly
//! connected set of them. `docs/design.md` ("Deadlocks: the wait-for graph") explains the rules.
//!
//! **Proven blocked.** The set `D` of blocked owners is the largest set of waiting owners such
//! that each wait of each member is blocked given `D`:
//! - a waiter ahead of it in the same queue is in `D` (every queue is served in order, so it
//!   cannot be served before that one is), or
//! - the resource's capacity is known, and the permits it wants are more than the capacity less
//!   the permits held by members of `D`: even if every other holder released, it would not fit.
//!   For a lock (capacity 1, one permit) that is "its holder is in `D`"; for a read/write lock's
//!   writer, "some reader or writer holding it is in `D`"; for a reader, "the writer holding it
//!   is in `D`".
//!
//! `D` is found by starting from every waiting owner and removing, until nothing changes, each
//! one that some wait of it is not blocked given the rest (Holt's graph reduction: an owner that
//! does not wait, or that could be served, is assumed to finish and release what it holds). It
//! does not depend on the order of removal, since "blocked given `D`" only grows with `D`.
//!
//! **Edges and cycles.** Among `D`, an owner has an edge to each owner that blocks it by the
//! rules above: a member of `D` ahead of it in its queue, and, when its holders in `D` are what
//! keeps it out, each of them. Every member of `D` has at least one edge, so each leads to a
//! cycle; Tarjan's algorithm finds the strongly connected sets, and from each set that holds a
//! cycle (two owners or more, or one that blocks itself) one elementary cycle is taken: the
//! shortest cycle of holds from the smallest owner id on one, or, in a set without a cycle of
//! holds, the shortest from its smallest owner id using waits ahead in a queue too, edges tried
//! in a fixed order (`cycle_in`). A set may
//! hold more cycles than the one reported; breaking any member of the reported one frees the set
//! or leaves another cycle to find on the next look. Owners in `D` that are in no such set wait
//! behind a cycle (they are freed when it is broken) and are not reported as members.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::deadlock::snapshot::Resource;

/// How an owner keeps a waiter out of the resource the waiter waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Via {
    /// It holds it: the hold at this index of the resource's holds.
    Hold(usize),
    /// It waits ahead in its queue: the wait at this index of the resource's waits.
    Ahead(usize),
}

/// One step of a cycle: `resources[resource].waits[wait]` (the owner's wait) is blocked by the
/// next step's owner, through `via` (a hold or a wait of that same resource).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Step {
    pub resource: usize,
    pub wait: usize,
    pub via: Via,
}

/// What [`analyse`] finds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Analysis {
    /// The owners proven blocked for ever (`D`), in the cycles or behind them.
    pub blocked: BTreeSet<String>,
    /// One cycle per strongly connected set, sorted by their first owner; each starts at its
    /// smallest owner id, and step `i`'s owner is blocked by step `i + 1`'s (the last by the
    /// first's).
    pub cycles: Vec<Vec<Step>>,
}

/// The owner of a step's wait.
pub(crate) fn owner_of<'a>(resources: &'a [Resource], step: &Step) -> &'a str {
    &resources[step.resource].waits[step.wait].origin.owner
}

/// What blocks `resources[r].waits[w]` given the blocked set `d`: nothing (it is not proven
/// blocked), or the owners that do, ahead of it first, then the holders.
fn blockers(res: &Resource, w: usize, d: &BTreeSet<&str>) -> Vec<(Via, String)> {
    let mut out: Vec<(Via, String)> = res.waits[..w]
        .iter()
        .enumerate()
        .filter(|(_, a)| d.contains(a.origin.owner.as_str()))
        .map(|(i, a)| (Via::Ahead(i), a.origin.owner.clone()))
        .collect();
    let held_by_d: u64 = res
        .holds
        .iter()
        .filter(|h| d.contains(h.origin.owner.as_str()))
        .map(|h| h.permits)
        .fold(0, u64::saturating_add);
    let wanted = res.waits[w].permits;
    if held_by_d > 0
        && res
            .capacity
            .is_some_and(|c| c.saturating_sub(held_by_d) < wanted)
    {
        out.extend(
            res.holds
                .iter()
                .enumerate()
                .filter(|(_, h)| d.contains(h.origin.owner.as_str()))
                .map(|(i, h)| (Via::Hold(i), h.origin.owner.clone())),
        );
    }
    out
}

/// The blocked owners and the cycles among them in `resources` (in any order: they are sorted
/// by primitive and name first, and the steps index that sorted order, which is returned).
pub(crate) fn analyse(mut resources: Vec<Resource>) -> (Vec<Resource>, Analysis) {
    resources.sort_by_key(Resource::key);
    let mut waits_of: BTreeMap<&str, Vec<(usize, usize)>> = BTreeMap::new();
    for (r, res) in resources.iter().enumerate() {
        for (w, wait) in res.waits.iter().enumerate() {
            waits_of
                .entry(wait.origin.owner.as_str())
                .or_default()
                .push((r, w));
        }
    }
    // the reduction: remove whoever has a wait that is not blocked by the rest
    let mut d: BTreeSet<&str> = waits_of.keys().copied().collect();
    loop {
        let kept: BTreeSet<&str> = d
            .iter()
            .copied()
            .filter(|o| {
                waits_of[o]
                    .iter()
                    .all(|&(r, w)| !blockers(&resources[r], w, &d).is_empty())
            })
            .collect();
        if kept.len() == d.len() {
            break;
        }
        d = kept;
    }
    let nodes: Vec<&str> = d.iter().copied().collect();
    let index: BTreeMap<&str, usize> = nodes.iter().enumerate().map(|(i, o)| (*o, i)).collect();
    // edges[n]: (step of n's wait, target node), in a fixed order
    let edges: Vec<Vec<(Step, usize)>> = nodes
        .iter()
        .map(|o| {
            waits_of[o]
                .iter()
                .flat_map(|&(r, w)| {
                    blockers(&resources[r], w, &d)
                        .into_iter()
                        .map(move |(via, to)| {
                            (
                                Step {
                                    resource: r,
                                    wait: w,
                                    via,
                                },
                                to,
                            )
                        })
                })
                .map(|(step, to)| (step, index[to.as_str()]))
                .collect()
        })
        .collect();
    let mut cycles: Vec<Vec<Step>> = strongly_connected(&edges)
        .into_iter()
        .filter_map(|set| cycle_in(&set, &edges))
        .collect();
    cycles.sort_by_key(|c| owner_of(&resources, &c[0]).to_string());
    let analysis = Analysis {
        blocked: d.iter().map(|o| o.to_string()).collect(),
        cycles,
    };
    (resources, analysis)
}

/// Tarjan's strongly connected components of the graph `edges` (node -> (label, target)).
fn strongly_connected<L>(edges: &[Vec<(L, usize)>]) -> Vec<Vec<usize>> {
    struct Tarjan<'a, L> {
        edges: &'a [Vec<(L, usize)>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        out: Vec<Vec<usize>>,
    }
    impl<L> Tarjan<'_, L> {
        fn visit(&mut self, v: usize) {
            self.index[v] = Some(self.next);
            self.low[v] = self.next;
            self.next += 1;
            self.stack.push(v);
            self.on_stack[v] = true;
            for &(_, w) in &self.edges[v] {
                match self.index[w] {
                    None => {
                        self.visit(w);
                        self.low[v] = self.low[v].min(self.low[w]);
                    }
                    Some(iw) if self.on_stack[w] => self.low[v] = self.low[v].min(iw),
                    Some(_) => {}
                }
            }
            if Some(self.low[v]) == self.index[v] {
                let mut set = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack[w] = false;
                    set.push(w);
                    if w == v {
                        break;
                    }
                }
                set.sort_unstable();
                self.out.push(set);
            }
        }
    }
    let n = edges.len();
    let mut t = Tarjan {
        edges,
        index: vec![None; n],
        low: vec![0; n],
        on_stack: vec![false; n],
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in 0..n {
        if t.index[v].is_none() {
            t.visit(v);
        }
    }
    t.out
}

/// The cycle reported for the strongly connected `set`: the shortest cycle of holds (every step
/// blocked by the next owner's hold) from the smallest node of `set` that is on one, through
/// nodes of `set` only; when `set` has no cycle of holds (a reader queued behind a writer that
/// waits for that reader's own read), the shortest from its smallest node using waits ahead in
/// a queue too. `None` when `set` holds no cycle (one node without an edge to itself).
///
/// Holds first because a waiter queued ahead is blocked by the same cycle it would seem to
/// join: with a cycle `a -> b -> c -> a` of holds and `z` queued ahead of `c` for what `a`
/// holds, `c -> z -> a` closes a longer cycle through `z`, and refusing `z`, which holds
/// nothing anybody in the cycle waits for, would break nothing.
fn cycle_in(set: &[usize], edges: &[Vec<(Step, usize)>]) -> Option<Vec<Step>> {
    let holds_only = |step: &Step| matches!(step.via, Via::Hold(_));
    set.iter()
        .find_map(|&start| shortest_cycle(start, set, edges, holds_only))
        .or_else(|| shortest_cycle(*set.first()?, set, edges, |_| true))
}

/// The shortest cycle from `start` back to it through nodes of `set` and edges that `usable`
/// lets pass (breadth first, edges in their order).
fn shortest_cycle(
    start: usize,
    set: &[usize],
    edges: &[Vec<(Step, usize)>],
    usable: impl Fn(&Step) -> bool,
) -> Option<Vec<Step>> {
    let inside: BTreeSet<usize> = set.iter().copied().collect();
    // came_by[n]: the node and edge n was first reached from
    let mut came_by: BTreeMap<usize, (usize, Step)> = BTreeMap::new();
    let mut queue = VecDeque::from([start]);
    while let Some(v) = queue.pop_front() {
        for &(step, w) in &edges[v] {
            if !inside.contains(&w) || !usable(&step) {
                continue;
            }
            if w == start {
                let mut path = vec![step];
                let mut at = v;
                while at != start {
                    let (from, s) = came_by[&at];
                    path.push(s);
                    at = from;
                }
                path.reverse();
                return Some(path);
            }
            if let std::collections::btree_map::Entry::Vacant(e) = came_by.entry(w) {
                e.insert((v, step));
                queue.push_back(w);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deadlock::snapshot::tests::{lock, semaphore};

    /// The cycles as lists of owners, and the blocked owners.
    fn run(resources: Vec<Resource>) -> (Vec<Vec<String>>, Vec<String>) {
        let (resources, a) = analyse(resources);
        let cycles = a
            .cycles
            .iter()
            .map(|c| {
                c.iter()
                    .map(|s| owner_of(&resources, s).to_string())
                    .collect()
            })
            .collect();
        (cycles, a.blocked.into_iter().collect())
    }

    fn owners(list: &[&[&str]]) -> Vec<Vec<String>> {
        list.iter()
            .map(|c| c.iter().map(|o| o.to_string()).collect())
            .collect()
    }

    #[test]
    fn two_owners_each_holding_what_the_other_waits_for_are_a_cycle() {
        let (cycles, blocked) = run(vec![
            lock("a", Some("c:1"), &["c:2"]),
            lock("b", Some("c:2"), &["c:1"]),
        ]);
        assert_eq!(cycles, owners(&[&["c:1", "c:2"]]));
        assert_eq!(blocked, ["c:1", "c:2"]);
    }

    #[test]
    fn a_three_cycle_is_found_with_its_steps_in_order() {
        let (resources, a) = analyse(vec![
            lock("c", Some("p:3"), &["p:2"]),
            lock("a", Some("p:1"), &["p:3"]),
            lock("b", Some("p:2"), &["p:1"]),
        ]);
        assert_eq!(a.cycles.len(), 1);
        let steps: Vec<(&str, &str)> = a.cycles[0]
            .iter()
            .map(|s| (owner_of(&resources, s), resources[s.resource].name.as_str()))
            .collect();
        // p:1 waits for b (held by p:2), p:2 for c (p:3), p:3 for a (p:1)
        assert_eq!(steps, [("p:1", "b"), ("p:2", "c"), ("p:3", "a")]);
        assert!(a.cycles[0].iter().all(|s| s.via == Via::Hold(0)));
    }

    #[test]
    fn locks_taken_in_one_global_order_make_no_cycle() {
        // p:1 holds a and b, waits for c; p:2 holds c, waits for d; p:3 holds d, waits for nothing
        // (busy); p:4 waits for a, p:5 for b behind p:4
        let (cycles, blocked) = run(vec![
            lock("a", Some("p:1"), &["p:4"]),
            lock("b", Some("p:1"), &["p:4", "p:5"]),
            lock("c", Some("p:2"), &["p:1"]),
            lock("d", Some("p:3"), &["p:2"]),
        ]);
        assert!(cycles.is_empty(), "{cycles:?}");
        assert!(blocked.is_empty(), "{blocked:?}");
    }

    #[test]
    fn a_busy_holder_that_waits_for_nothing_frees_the_chain_behind_it() {
        // c:1 waits for c:2, which waits for c:3, which is busy
        let (cycles, blocked) = run(vec![
            lock("a", Some("c:2"), &["c:1"]),
            lock("b", Some("c:3"), &["c:2"]),
            lock("x", Some("c:1"), &[]),
        ]);
        assert!(cycles.is_empty() && blocked.is_empty());
        // a free lock with a queue (a hand-off under way) blocks nobody
        let (cycles, blocked) = run(vec![lock("a", None, &["c:1", "c:2"])]);
        assert!(cycles.is_empty() && blocked.is_empty());
    }

    #[test]
    fn owners_waiting_behind_a_cycle_are_blocked_but_not_members() {
        let (cycles, blocked) = run(vec![
            lock("a", Some("c:1"), &["c:2", "c:9"]),
            lock("b", Some("c:2"), &["c:1", "c:8"]),
            lock("z", Some("c:8"), &["c:7"]),
        ]);
        assert_eq!(cycles, owners(&[&["c:1", "c:2"]]));
        assert_eq!(blocked, ["c:1", "c:2", "c:7", "c:8", "c:9"]);
    }

    #[test]
    fn a_waiter_queued_ahead_of_a_member_is_not_made_a_member() {
        // a -> b -> c -> a by holds; "a:0" (the smallest id) holds z and is queued for "a"
        // ahead of "c:3": it closes a longer cycle through the queue, and refusing it would
        // break nothing
        let (cycles, blocked) = run(vec![
            lock("a", Some("c:1"), &["a:0", "c:3"]),
            lock("b", Some("c:2"), &["c:1"]),
            lock("c", Some("c:3"), &["c:2"]),
            lock("z", Some("a:0"), &[]),
        ]);
        assert_eq!(cycles, owners(&[&["c:1", "c:2", "c:3"]]));
        assert_eq!(blocked, ["a:0", "c:1", "c:2", "c:3"]);
    }

    #[test]
    fn two_separate_cycles_are_both_found_sorted() {
        let (cycles, _) = run(vec![
            lock("a", Some("x:1"), &["x:2"]),
            lock("b", Some("x:2"), &["x:1"]),
            lock("c", Some("m:1"), &["m:2"]),
            lock("d", Some("m:2"), &["m:1"]),
        ]);
        assert_eq!(cycles, owners(&[&["m:1", "m:2"], &["x:1", "x:2"]]));
    }

    #[test]
    fn a_cycle_whose_wait_is_also_held_up_by_another_cycle_is_still_found() {
        // m:1 <-> m:2 by locks a and b; x:1 <-> x:2: x:1 wants both permits of s, held by x:2
        // and by m:1 (of the other cycle, already a closed set when x:1 is visited), x:2 waits
        // for c, held by x:1
        let (cycles, blocked) = run(vec![
            semaphore("s", 2, &[("m:1", 1), ("x:2", 1)], &[("x:1", 2)]),
            lock("a", Some("m:2"), &["m:1"]),
            lock("b", Some("m:1"), &["m:2"]),
            lock("c", Some("x:1"), &["x:2"]),
        ]);
        assert_eq!(cycles, owners(&[&["m:1", "m:2"], &["x:1", "x:2"]]));
        assert_eq!(blocked, ["m:1", "m:2", "x:1", "x:2"]);
    }

    #[test]
    fn a_waiter_behind_permit_holders_is_blocked_only_if_the_free_ones_cannot_serve_it() {
        // s: 2 permits, held by c:1 (in the cycle) and c:3 (busy). c:2 wants 1: c:3's release
        // serves it, so nothing is proven
        let (cycles, blocked) = run(vec![
            semaphore("s", 2, &[("c:1", 1), ("c:3", 1)], &[("c:2", 1)]),
            lock("a", Some("c:2"), &["c:1"]),
        ]);
        assert!(cycles.is_empty() && blocked.is_empty(), "{cycles:?}");
        // c:2 wants 2: it needs c:1's permit too, which never comes
        let (cycles, _) = run(vec![
            semaphore("s", 2, &[("c:1", 1), ("c:3", 1)], &[("c:2", 2)]),
            lock("a", Some("c:2"), &["c:1"]),
        ]);
        assert_eq!(cycles, owners(&[&["c:1", "c:2"]]));
        // both holders in the cycle: c:1 holds s and waits for a; c:3 holds s and waits for b;
        // c:2 holds a and b... c:2 waits for one permit of s held by c:1 and c:3
        let (cycles, blocked) = run(vec![
            semaphore("s", 2, &[("c:1", 1), ("c:3", 1)], &[("c:2", 1)]),
            lock("a", Some("c:2"), &["c:1"]),
            lock("b", Some("c:2"), &["c:3"]),
        ]);
        assert_eq!(cycles, owners(&[&["c:1", "c:2"]]));
        assert_eq!(blocked, ["c:1", "c:2", "c:3"]);
        // an unknown capacity proves nothing through the holders
        let mut s = semaphore("s", 2, &[("c:1", 2)], &[("c:2", 1)]);
        s.capacity = None;
        let (cycles, _) = run(vec![s, lock("a", Some("c:2"), &["c:1"])]);
        assert!(cycles.is_empty());
    }

    #[test]
    fn a_reader_behind_a_writer_behind_its_own_read_is_a_cycle_through_the_queue() {
        // c:1 holds a read and asks for another; c:2's write waits ahead of it
        let rw = 1 << 30;
        let (resources, a) = analyse(vec![semaphore(
            "rw",
            rw,
            &[("c:1", 1)],
            &[("c:2", rw), ("c:1", 1)],
        )]);
        assert_eq!(a.cycles.len(), 1);
        let c = &a.cycles[0];
        assert_eq!(owner_of(&resources, &c[0]), "c:1");
        assert_eq!(c[0].via, Via::Ahead(0));
        assert_eq!(owner_of(&resources, &c[1]), "c:2");
        assert_eq!(c[1].via, Via::Hold(0));
    }

    #[test]
    fn a_thread_waiting_for_permits_it_holds_itself_is_a_cycle_of_one() {
        let (cycles, _) = run(vec![semaphore("s", 1, &[("c:1", 1)], &[("c:1", 1)])]);
        assert_eq!(cycles, owners(&[&["c:1"]]));
        // with a permit free it is served
        let (cycles, _) = run(vec![semaphore("s", 2, &[("c:1", 1)], &[("c:1", 1)])]);
        assert!(cycles.is_empty());
    }

    #[test]
    fn the_result_does_not_depend_on_the_order_of_the_input() {
        let input = vec![
            lock("a", Some("c:1"), &["c:3"]),
            lock("b", Some("c:2"), &["c:1"]),
            lock("c", Some("c:3"), &["c:2"]),
            semaphore("s", 1, &[("c:2", 1)], &[("c:4", 1)]),
        ];
        let first = run(input.clone());
        let mut reversed = input;
        reversed.reverse();
        assert_eq!(run(reversed), first);
        assert_eq!(first.0, owners(&[&["c:1", "c:2", "c:3"]]));
        assert_eq!(first.1, ["c:1", "c:2", "c:3", "c:4"]);
    }
}
