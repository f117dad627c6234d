//! 4'''. FIFO by the replies (locks): who is ahead is read from the order in which the clients
//! saw their `Queued` replies, not from Redis's queue (check 4 reads Redis's queue, which a
//! script that queues in the wrong place would fool: it would then grant its own "head").
//!
//! Every `Queued` reply of a new place gets the next number of its lock. A re-run of the same
//! attempt that keeps its place (its place known kept, not granted since) keeps its number; a
//! re-run after a known loss of the place (eviction, data loss, told to retry) or after a grant
//! queues at the back: a new number. A grant to G is a violation when a waiter Y of the same
//! lock whose number is below G's (any number, when G got the lock in its own call without
//! waiting) is live (`Wait::live`), has its place, was not granted, and is *sure*: never found
//! dead by the model since its number (a waiter that may have been purged and queued again at
//! the back, or not, has no known place). Not counted as overtaking, each counted by name when it
//! would otherwise have been one: the waiter ahead is unsure (found dead once: a pause, missed
//! heartbeats, forward clock steps; or its place was lost to an eviction, data loss or a retry
//! it was told), the grantee is unsure likewise, the grant came in the passed-over waiter's own
//! call (its leave passes the lock on), or the grantee waits with no `Queued` reply of that
//! attempt (a late copy, an ended attempt, a crashed client's: check 6's exemptions).

use std::collections::{HashMap, HashSet};

use crate::checks::{Check, LockSnap};
use crate::model::State;
use crate::world::World;

/// A `Queued` reply's place in the order the client saw them.
#[derive(Clone, Copy)]
struct Place {
    seq: u64,
    /// Why its place in Redis is no longer known (it may have been purged and re-queued).
    unsure: Option<&'static str>,
}

/// Per lock: (owner, attempt) -> its place by the replies; the next number.
#[derive(Default)]
pub struct ReplyOrder {
    places: Vec<HashMap<(String, u64), Place>>,
    next: u64,
    /// (lock, owner, attempt) of acquires a copy of which reached Redis with its reply unread
    /// (a stray duplicate, a late delivery): a place it queued may predate the reply seen.
    copies: HashSet<(usize, String, u64)>,
}

impl ReplyOrder {
    pub fn new(locks: usize) -> ReplyOrder {
        ReplyOrder {
            places: vec![HashMap::new(); locks],
            next: 1,
            copies: HashSet::new(),
        }
    }
}

impl World {
    /// Thread `(c, t)` just read a `Queued` reply for `attempt` on `lock` (before its model
    /// state is replaced by the new wait).
    pub fn note_queued(&mut self, c: usize, t: usize, lock: usize, attempt: u64) {
        let th = &self.clients[c].threads[t];
        let kept = matches!(&th.state, State::Waiting(w)
            if w.lock == lock && w.attempt == attempt && w.place && !w.granted_seen
                && w.handoff.is_none());
        let key = (th.owner.clone(), attempt);
        let order = &mut self.checker.reply_order;
        if kept && order.places[lock].contains_key(&key) {
            return;
        }
        let seq = order.next;
        order.next += 1;
        let unsure = order
            .copies
            .contains(&(lock, key.0.clone(), attempt))
            .then_some("an unread copy of its acquire reached Redis (its place may date from it)");
        order.places[lock].insert(key, Place { seq, unsure });
    }

    /// A copy of `owner`'s acquire of `attempt` on `lock` reached Redis and nobody reads its
    /// reply (a stray duplicate, a late delivery).
    pub fn fifo_copy_arrived(&mut self, owner: &str, lock: usize, attempt: u64) {
        let order = &mut self.checker.reply_order;
        order.copies.insert((lock, owner.to_string(), attempt));
        if let Some(p) = order.places[lock].get_mut(&(owner.to_string(), attempt)) {
            p.unsure.get_or_insert(
                "an unread copy of its acquire reached Redis (its place may date from it)",
            );
        }
    }

    /// Marks the waiters whose place Redis may have dropped since (found dead, place lost).
    pub fn fifo_mark_unsure(&mut self, real: f64) {
        for cl in &self.clients {
            for th in &cl.threads {
                let State::Waiting(w) = &th.state else {
                    continue;
                };
                let why = if !w.place {
                    "its place was lost (eviction, data loss, told to retry)"
                } else if !w.live(&self.cfg, real) {
                    "found dead once (pause, missed heartbeats, forward clock steps)"
                } else {
                    continue;
                };
                if let Some(p) =
                    self.checker.reply_order.places[w.lock].get_mut(&(th.owner.clone(), w.attempt))
                {
                    p.unsure.get_or_insert(why);
                }
            }
        }
    }

    /// A grant of lock `l` (Redis now has `cur`) seen after a request of `actor`.
    pub fn fifo_by_replies(
        &mut self,
        l: usize,
        cur: &LockSnap,
        actor: Option<(usize, usize)>,
        real: f64,
    ) {
        let order = &self.checker.reply_order.places[l];
        let mut grantee_seq = None;
        let mut grantee_unsure = None;
        let mut own_call = false;
        for cl in &self.clients {
            for th in &cl.threads {
                if th.owner != cur.owner {
                    continue;
                }
                match &th.state {
                    State::Waiting(w) if w.lock == l && w.attempt == cur.attempt => {
                        match order.get(&(th.owner.clone(), cur.attempt)) {
                            Some(p) => {
                                grantee_seq = Some(p.seq);
                                grantee_unsure = p.unsure;
                            }
                            None => grantee_unsure = Some("no Queued reply of it"),
                        }
                    }
                    _ => own_call = th.calling == Some((l, cur.attempt)),
                }
            }
        }
        // a grant in the grantee's own call without a queue place: every waiter is ahead
        let bound = match (grantee_seq, own_call) {
            (Some(s), _) => s,
            (None, true) => u64::MAX,
            (None, false) => {
                grantee_unsure.get_or_insert(
                    "not waiting (a late copy, an ended attempt, a crashed client's)",
                );
                u64::MAX
            }
        };
        let mut exempt = vec![];
        let mut violation = None;
        for (c, cl) in self.clients.iter().enumerate() {
            for (t, th) in cl.threads.iter().enumerate() {
                let State::Waiting(w) = &th.state else {
                    continue;
                };
                if w.lock != l || th.owner == cur.owner {
                    continue;
                }
                let Some(p) = order.get(&(th.owner.clone(), w.attempt)) else {
                    continue;
                };
                if p.seq >= bound
                    || !w.place
                    || w.granted_seen
                    || w.handoff.is_some()
                    || !w.live(&self.cfg, real)
                {
                    continue;
                }
                if let Some(why) = grantee_unsure {
                    exempt.push(format!("fifo by replies: grantee's place unknown: {why}"));
                } else if let Some(why) = p.unsure {
                    exempt.push(format!("fifo by replies: passed-over waiter {why}"));
                } else if actor == Some((c, t)) {
                    exempt.push("fifo by replies: in the passed-over waiter's own call".into());
                } else if violation.is_none() {
                    violation = Some(format!(
                        "lock {l} granted (token {}) to {} attempt {} while live waiter c{c}:t{t} \
                         ({} attempt {}), whose Queued reply came earlier (#{} before #{}), still \
                         waits; Redis's queue before: {:?}",
                        cur.token,
                        cur.owner,
                        cur.attempt,
                        th.owner,
                        w.attempt,
                        p.seq,
                        if bound == u64::MAX {
                            "none".to_string()
                        } else {
                            bound.to_string()
                        },
                        self.checker.last[l].queue
                    ));
                }
            }
        }
        for e in exempt {
            self.stats.add(&e, 1);
        }
        if let Some(v) = violation {
            self.violate(Check::Overtaken, v);
        }
    }
}
