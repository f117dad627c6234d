//! 4'''. FIFO by the replies (locks and semaphores alike): who is ahead is read from the order in which the clients
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
//! it was told, or may have expired with the queue keys under forward clock steps past the
//! queue's TTL since its last refresh), the grantee is unsure likewise, the grant came in the passed-over waiter's own
//! call (its leave passes the lock on), or the grantee waits with no `Queued` reply of that
//! attempt (a late copy, an ended attempt, a crashed client's: check 6's exemptions). A
//! semaphore grants several heads in one call: a waiter granted in the same call (Redis holds
//! its hold) is served, not passed over.

use std::collections::{HashMap, HashSet};

use crate::fuzz::model::Prim;
use crate::fuzz::world::World;

/// A `Queued` reply's place in the order the client saw them.
#[derive(Clone, Copy)]
struct Place {
    seq: u64,
    /// Why its place in Redis is no longer known (it may have been purged and re-queued).
    unsure: Option<&'static str>,
}

/// Per lock (or semaphore): (owner, attempt) -> its place by the replies; the next number.
#[derive(Default)]
pub struct ReplyOrder {
    places: Vec<HashMap<(String, u64), Place>>,
    next: u64,
    /// (index, owner, attempt) of acquires a copy of which reached Redis with its reply unread
    /// (a stray duplicate, a late delivery): a place it queued may predate the reply seen.
    copies: HashSet<(usize, String, u64)>,
}

impl ReplyOrder {
    pub fn new(n: usize) -> ReplyOrder {
        ReplyOrder {
            places: vec![HashMap::new(); n],
            next: 1,
            copies: HashSet::new(),
        }
    }
}

const COPY: &str = "an unread copy of its acquire reached Redis (its place may date from it)";

/// A grant seen in Redis, for `World::fifo_by_replies`.
pub struct Granted<'a> {
    pub prim: Prim,
    /// The lock's or the semaphore's index.
    pub index: usize,
    pub owner: &'a str,
    pub attempt: u64,
    pub token: u64,
    /// Whether Redis holds a hold of (owner, attempt) now: one granted in the same call.
    pub holds: &'a dyn Fn(&str, u64) -> bool,
    /// Redis's queue before the call, for the report.
    pub queue_before: String,
}

impl World {
    fn reply_order(&mut self, prim: Prim) -> &mut ReplyOrder {
        match prim {
            Prim::Lock => &mut self.checker.reply_order,
            Prim::Sem => &mut self.sem_checker.reply_order,
        }
    }

    /// Thread `(c, t)` just read a `Queued` reply for `attempt` on lock (or semaphore)
    /// `index` (before its model state is replaced by the new wait).
    pub fn note_queued(&mut self, prim: Prim, c: usize, t: usize, index: usize, attempt: u64) {
        let th = &self.clients[c].threads[t];
        let kept = prim.wait(th).is_some_and(|w| {
            w.lock == index
                && w.attempt == attempt
                && w.place
                && !w.granted_seen
                && w.handoff.is_none()
        });
        let key = (th.owner.clone(), attempt);
        let order = self.reply_order(prim);
        if kept && order.places[index].contains_key(&key) {
            return;
        }
        let seq = order.next;
        order.next += 1;
        let unsure = order
            .copies
            .contains(&(index, key.0.clone(), attempt))
            .then_some(COPY);
        order.places[index].insert(key, Place { seq, unsure });
    }

    /// A copy of `owner`'s acquire of `attempt` on lock (or semaphore) `index` reached Redis
    /// and nobody reads its reply (a stray duplicate, a late delivery).
    pub fn fifo_copy_arrived(&mut self, prim: Prim, owner: &str, index: usize, attempt: u64) {
        let order = self.reply_order(prim);
        order.copies.insert((index, owner.to_string(), attempt));
        if let Some(p) = order.places[index].get_mut(&(owner.to_string(), attempt)) {
            p.unsure.get_or_insert(COPY);
        }
    }

    /// Marks the waiters whose place Redis may have dropped since (found dead, place lost).
    pub fn fifo_mark_unsure(&mut self, real: f64) {
        for prim in [Prim::Lock, Prim::Sem] {
            let mut marks = vec![];
            for cl in &self.clients {
                for th in &cl.threads {
                    let Some(w) = prim.wait(th) else {
                        continue;
                    };
                    let why = if !w.place {
                        "its place was lost (eviction, data loss, told to retry)"
                    } else if !w.live(&self.cfg, real) {
                        "found dead once (pause, missed heartbeats, forward clock steps)"
                    } else if w.queue_ttl_passed(&self.cfg, real) {
                        "its place may have expired (forward clock steps and real time since its \
                         last refresh past the queue's TTL)"
                    } else {
                        continue;
                    };
                    marks.push((w.lock, (th.owner.clone(), w.attempt), why));
                }
            }
            let order = self.reply_order(prim);
            for (index, key, why) in marks {
                if let Some(p) = order.places.get_mut(index).and_then(|m| m.get_mut(&key)) {
                    p.unsure.get_or_insert(why);
                }
            }
        }
    }

    /// A grant `g` seen after a request of `actor`: no live, sure waiter whose `Queued` reply
    /// came earlier still waits (see the module's documentation).
    pub fn fifo_by_replies(&mut self, g: Granted<'_>, actor: Option<(usize, usize)>, real: f64) {
        let (prim, l) = (g.prim, g.index);
        let order = match prim {
            Prim::Lock => &self.checker.reply_order.places[l],
            Prim::Sem => &self.sem_checker.reply_order.places[l],
        };
        let mut grantee_seq = None;
        let mut grantee_unsure = None;
        let mut own_call = false;
        for cl in &self.clients {
            for th in &cl.threads {
                if th.owner != g.owner {
                    continue;
                }
                match prim.wait(th) {
                    Some(w) if w.lock == l && w.attempt == g.attempt => {
                        match order.get(&(th.owner.clone(), g.attempt)) {
                            Some(p) => {
                                grantee_seq = Some(p.seq);
                                grantee_unsure = p.unsure;
                            }
                            None => grantee_unsure = Some("no Queued reply of it"),
                        }
                    }
                    _ => own_call = th.side(prim).calling == Some((l, g.attempt)),
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
                let Some(w) = prim.wait(th) else {
                    continue;
                };
                if w.lock != l || th.owner == g.owner {
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
                    || (g.holds)(&th.owner, w.attempt)
                {
                    continue;
                }
                let prefix = match prim {
                    Prim::Lock => "",
                    Prim::Sem => "sem ",
                };
                if let Some(why) = grantee_unsure {
                    exempt.push(format!(
                        "{prefix}fifo by replies: grantee's place unknown: {why}"
                    ));
                } else if let Some(why) = p.unsure {
                    exempt.push(format!("{prefix}fifo by replies: passed-over waiter {why}"));
                } else if actor == Some((c, t)) {
                    exempt.push(format!(
                        "{prefix}fifo by replies: in the passed-over waiter's own call"
                    ));
                } else if violation.is_none() {
                    violation = Some(format!(
                        "{} {l} granted (token {}) to {} attempt {} while live waiter c{c}:t{t} \
                         ({} attempt {}), whose Queued reply came earlier (#{} before #{}), still \
                         waits; Redis's queue before: {}",
                        prim.name(),
                        g.token,
                        g.owner,
                        g.attempt,
                        th.owner,
                        w.attempt,
                        p.seq,
                        if bound == u64::MAX {
                            "none".to_string()
                        } else {
                            bound.to_string()
                        },
                        g.queue_before
                    ));
                }
            }
        }
        for e in exempt {
            self.stats.add(&e, 1);
        }
        if let Some(v) = violation {
            self.violate(crate::fuzz::checks::Check::Overtaken, v);
        }
    }
}
