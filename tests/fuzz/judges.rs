//! The after-every-step judges of a thread's side, written once for every primitive over a
//! common view of what Redis has (`View`): check 8 (waiters entries only for queued owners),
//! check 1 (admission by the holders' own estimates: the permits held never exceed the
//! capacity, and Redis has each hold), check 4' (a live waiter keeps its place, and its
//! hand-off until its lease could end) and check 9 (a live waiter's wake-up stays until it is
//! popped). The admission invariant is one sum: a lock is a capacity of 1 whose hold takes 1
//! (re-entry adds levels, not holds), a semaphore(n) has n, a read/write lock has
//! `RW_CAPACITY`, a read takes 1 and a write all (so a writer alone, or readers only).

use std::collections::HashMap;

use crate::checks::{grant_prefix, Check};
use crate::model::{Hold, Prim, State, Wait};
use crate::world::World;

/// What Redis has of one lock or semaphore, in one shape.
pub struct View {
    /// (owner, attempt, token, permits) of each hold.
    pub holds: Vec<(String, u64, u64, u64)>,
    /// Owners in queue order.
    pub queue: Vec<String>,
    /// owner -> attempt of its waiters entry.
    pub waiters: HashMap<String, u64>,
    /// What a violation's message shows of the rest.
    pub detail: String,
}

impl View {
    /// The token of `owner`'s hold granted to `attempt`, if Redis has it.
    fn token_of(&self, owner: &str, attempt: u64) -> Option<u64> {
        self.holds
            .iter()
            .find(|h| h.0 == owner && h.1 == attempt)
            .map(|h| h.2)
    }
}

impl World {
    /// The capacity of `i`: 1 for a lock.
    pub fn capacity(&self, p: Prim, i: usize) -> u64 {
        match p {
            Prim::Lock => 1,
            Prim::Sem => self.cfg.sems[i].cap,
        }
    }

    /// Checks 8, 1, 4' and 9 of side `p` against `views` (one per lock or semaphore), at the
    /// snapshot's fuzzer and real time.
    pub fn judge_sides(&mut self, p: Prim, views: &[View], fz: f64, real: f64) {
        let noun = p.name();
        let mut found = vec![];
        for (i, cur) in views.iter().enumerate() {
            // 8. key sizes: a waiters entry exists only for a queued owner, so the waiters
            //    hash never outgrows the queue (each entry is a participant's place)
            //    (after a queue eviction: only the owners the hash had then, each until a
            //    heartbeat naming it was answered; F13)
            if cur.waiters.is_empty() {
                *self.queue_lost(p, i) = None;
            } else {
                let excused = self.queue_lost(p, i).clone();
                let extra: Vec<&String> = cur
                    .waiters
                    .keys()
                    .filter(|o| !cur.queue.contains(*o))
                    .filter(|o| !excused.as_ref().is_some_and(|e| e.contains(*o)))
                    .collect();
                if !extra.is_empty() {
                    found.push((
                        Check::KeySize,
                        format!(
                            "{noun} {i}: waiters entries {extra:?} without a queue place \
                             (queue {:?})",
                            cur.queue
                        ),
                    ));
                }
            }
            // 1. admission by the holders' own estimates, and Redis has each of their holds
            let mut holders: Vec<(usize, usize, String, u64, Hold)> = vec![];
            for (c, cl) in self.clients.iter().enumerate() {
                for (t, th) in cl.threads.iter().enumerate() {
                    let side = th.side(p);
                    if let State::Holding(h) = &side.state {
                        if h.lock == i && h.expires > fz && !self.token_exempt(p, i, h.token) {
                            holders.push((c, t, th.owner.clone(), side.permits, h.clone()));
                        }
                    }
                }
            }
            let list = || {
                holders
                    .iter()
                    .map(|(c, t, _, n, h)| {
                        format!(
                            "c{c}:t{t} (attempt {}) {n} permits token {} for {:.0}ms more \
                             (estimate from {})",
                            h.attempt,
                            h.token,
                            h.expires - fz,
                            h.origin
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let cap = self.capacity(p, i);
            if holders.iter().map(|x| x.3).sum::<u64>() > cap {
                found.push((
                    Check::MutualExclusion,
                    format!("{noun} {i} (capacity {cap}) held by {} at once", list()),
                ));
            }
            for (c, t, owner, n, h) in &holders {
                let has = cur
                    .holds
                    .iter()
                    .any(|x| x.0 == *owner && x.2 == h.token && x.3 == *n);
                if !has {
                    found.push((
                        Check::RedisDisagrees,
                        format!(
                            "c{c}:t{t} holds {n} permits of {noun} {i} (token {}) by its \
                             estimate ({}), but Redis has {:?}",
                            h.token, h.origin, cur.holds
                        ),
                    ));
                }
            }
        }
        // 4'. live waiters keep their places, and their hand-offs until their lease could end
        let forward_now = self.clock.forward();
        let mut unpopped = vec![];
        let mut revoked_early = 0;
        for c in 0..self.clients.len() {
            for t in 0..self.clients[c].threads.len() {
                let th = &self.clients[c].threads[t];
                let State::Waiting(w) = &th.side(p).state else {
                    continue;
                };
                let owner = th.owner.clone();
                let cur = &views[w.lock];
                let redis_token = cur.token_of(&owner, w.attempt);
                let live = w.live(&self.cfg, real);
                if let Some(h) = w.handoff {
                    let exempt = self.token_exempt(p, w.lock, h.token);
                    if redis_token == Some(h.token)
                        && live
                        && fz < h.earliest_end
                        && h.heartbeat_after
                        && !h.wake_lost
                        && !exempt
                    {
                        // 9. its wake-up waits in the wake list until its waker pops it
                        let prefix = grant_prefix(&owner, w.attempt, h.token);
                        if !self.clients[c]
                            .popped
                            .iter()
                            .any(|m| m.starts_with(&prefix))
                        {
                            unpopped.push((
                                self.wake_key(p, w.lock, &owner),
                                prefix,
                                format!("{noun} {} to c{c}:t{t}", w.lock),
                                h.earliest_end,
                            ));
                        }
                    }
                    if redis_token != Some(h.token) {
                        let judged = live
                            && fz < h.earliest_end
                            && !exempt
                            && !self.forced(p, w.lock, h.token);
                        if judged && self.handoff_revoked_early(p, w, real, forward_now) {
                            revoked_early += 1;
                        } else if judged {
                            found.push((
                                Check::HandoffVanished,
                                format!(
                                    "the hand-off of {noun} {} to live waiter c{c}:t{t} ({owner} \
                                     attempt {}, token {}) vanished before its lease could end; \
                                     Redis has {:?}",
                                    w.lock, w.attempt, h.token, cur.holds
                                ),
                            ));
                        }
                        if let State::Waiting(w) = &mut self.clients[c].threads[t].side_mut(p).state
                        {
                            w.handoff = None;
                        }
                    }
                    continue;
                }
                if redis_token.is_some() {
                    if let State::Waiting(w) = &mut self.clients[c].threads[t].side_mut(p).state {
                        w.granted_seen = true;
                    }
                    continue;
                }
                if w.granted_seen || !live {
                    continue;
                }
                let queued =
                    cur.waiters.get(&owner) == Some(&w.attempt) && cur.queue.contains(&owner);
                if !queued {
                    found.push((
                        Check::WaiterLost,
                        format!(
                            "live waiter c{c}:t{t} ({owner} attempt {}) has neither a queue place \
                             nor a grant on {noun} {}: queue {:?}, waiters {:?}, {}",
                            w.attempt, w.lock, cur.queue, cur.waiters, cur.detail
                        ),
                    ));
                }
            }
        }
        if revoked_early > 0 {
            self.stats.add(
                "exempt: sem hand-off revoked after a forward clock step",
                revoked_early,
            );
        }
        found.extend(self.wakeups_missing(unpopped));
        for (check, msg) in found {
            self.violate(check, msg);
        }
    }

    /// A token an operator released by force: its hand-off may vanish.
    fn forced(&self, p: Prim, i: usize, token: u64) -> bool {
        match p {
            Prim::Lock => self.checker.forced[i].contains(&token),
            Prim::Sem => self.sem_checker.forced[i].contains(&token),
        }
    }

    /// Whether a live waiter's hand-off may have been revoked early, as its primitive allows.
    /// A lock keeps hand-off deadlines on the waiters' virtual clock, which a forward step of
    /// the server clock moves by at most `cap_ms` per script: never. A semaphore keeps them on
    /// the server clock (docs/semaphores.md): forward steps revoke early, but only once they
    /// and the real time since the waiter's last refresh could have run its waiter timeout out.
    fn handoff_revoked_early(&self, p: Prim, w: &Wait, real: f64, forward_now: f64) -> bool {
        match p {
            Prim::Lock => false,
            Prim::Sem => {
                let server_clock_aged =
                    (real - w.refreshed) + w.forward_ms + 40.0 >= self.cfg.waiter_timeout_ms as f64;
                w.grant_forward.is_some_and(|g| g < forward_now) && server_clock_aged
            }
        }
    }
}
