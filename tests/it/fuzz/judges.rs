//! The after-every-step judges of a thread's side, written once for every primitive over a
//! common view of what Redis has (`View`): check 8 (waiters entries only for queued owners),
//! check 1 (admission by the holders' own estimates: the permits held never exceed the
//! capacity, and Redis has each hold), check 4' (a live waiter keeps its place, and its
//! hand-off until its lease could end) and check 9 (a live waiter's wake-up stays until it is
//! popped). The admission invariant is one sum: a lock is a capacity of 1 whose hold takes 1
//! (re-entry adds levels, not holds), a semaphore(n) has n, a read/write lock has
//! `RW_CAPACITY`, a read takes 1 and a write all (so a writer alone, or readers only).

use std::collections::HashMap;

use crate::fuzz::checks::{grant_prefix, Check};
use crate::fuzz::model::{Handoff, Hold, Prim, State};
use crate::fuzz::world::World;

/// What Redis has of one lock or semaphore, in one shape.
pub struct View {
    /// (owner, attempt, token, permits) of each hold.
    pub holds: Vec<(String, u64, u64, u64)>,
    /// (owner, score) in queue order.
    pub queue: Vec<(String, f64)>,
    /// owner -> attempt of its waiters entry.
    pub waiters: HashMap<String, u64>,
    /// The fence key's value (0: none), a bound above the tokens handed out.
    pub fence: u64,
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

    fn queued(&self, owner: &str) -> bool {
        self.queue.iter().any(|(o, _)| o == owner)
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
                    .filter(|o| !cur.queued(o))
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
        let mut unpopped = vec![];
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
                        if judged {
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
                let queued = cur.waiters.get(&owner) == Some(&w.attempt) && cur.queued(&owner);
                if !queued && w.queue_ttl_passed(&self.cfg, real) {
                    self.stats.add(
                        "exempt: a place expired under forward steps past the queue's TTL",
                        1,
                    );
                } else if !queued {
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
        found.extend(self.wakeups_missing(unpopped));
        for (check, msg) in found {
            self.violate(check, msg);
        }
    }

    /// After a request reached Redis: each new hold of `i` (in `cur`, not in `prev`) is a grant.
    /// Check 2 (tokens strictly rise), 4 (no live waiter queued ahead of the grantee passed
    /// over; one granted in the same call is served), 4''' (the same by the order the `Queued`
    /// replies were seen in, `fifo.rs`), 6 (no ghost hold: a new hold goes to an attempt under
    /// way) and, on a lock, 7 (no hand-off to a dead waiter late in a try-only ending); then
    /// the grantee's hand-off is recorded for 4' and 9.
    #[allow(clippy::too_many_arguments)]
    pub fn judge_grants(
        &mut self,
        p: Prim,
        i: usize,
        prev: &View,
        cur: &View,
        actor: Option<(usize, usize)>,
        sent: f64,
        real: f64,
    ) {
        let (noun, pfx) = (p.name(), p.prefix());
        let mut new: Vec<&(String, u64, u64, u64)> = cur
            .holds
            .iter()
            .filter(|h| prev.token_of(&h.0, h.1) != Some(h.2))
            .collect();
        new.sort_by_key(|h| h.2);
        for (owner, attempt, token, _) in new {
            let (owner, attempt, token) = (owner.as_str(), *attempt, *token);
            self.stats.add(&format!("{pfx}grants"), 1);
            // 4'''. no live waiter overtaken, by the order the Queued replies were seen in
            let holds = |o: &str, a: u64| cur.token_of(o, a).is_some();
            let granted = crate::fuzz::fifo::Granted {
                prim: p,
                index: i,
                owner,
                attempt,
                token,
                holds: &holds,
                queue_before: format!("{:?}", prev.queue),
            };
            self.fifo_by_replies(granted, actor, real);
            // 2. tokens strictly rise
            let max = *self.max_token(p, i);
            if token <= max {
                let behind = self.server.offset_ms() < self.max_offset_ms;
                if *self.fence_lost_flag(p, i) && behind {
                    self.say(format!(
                        " (token check restarts: fence lost while the server clock is behind \
                         its furthest; token {token} <= {max})"
                    ));
                    let what =
                        format!("exempt: {pfx}token after fence loss on a stepped-back clock");
                    self.stats.add(&what, 1);
                } else {
                    self.violate(
                        Check::TokenOrder,
                        format!(
                            "{noun} {i} granted token {token} to {owner} attempt {attempt} but \
                             token {max} was granted before"
                        ),
                    );
                }
                *self.max_token(p, i) = token;
            }
            let max = self.max_token(p, i);
            *max = (*max).max(token);
            // a grant writes the fence only when its token passes the reservation, so the fence
            // is back only once it is above the tokens again
            if cur.fence >= *self.max_token(p, i) {
                *self.fence_lost_flag(p, i) = false;
            }
            // 4. no live waiter overtaken, not even by the holder's own thread taking a lock
            //    again with a newer attempt (a leaked or locally lost hold: it queues); a lock
            //    re-granted to the attempt that held it is not a new holder
            let regrant = p == Prim::Lock && prev.token_of(owner, attempt).is_some();
            let x_score = prev.queue.iter().find(|(o, _)| o == owner).map(|q| q.1);
            for (y, score) in prev.queue.iter().filter(|_| !regrant) {
                if y == owner || x_score.is_some_and(|xs| *score >= xs) {
                    continue;
                }
                let Some(&ay) = prev.waiters.get(y) else {
                    continue;
                };
                if cur.token_of(y, ay).is_some() {
                    continue;
                }
                let Some((c, t)) = self.waiter(p, y, i, ay) else {
                    continue;
                };
                if Some((c, t)) == actor {
                    continue;
                }
                let Some(w) = p.wait(&self.clients[c].threads[t]) else {
                    continue;
                };
                if w.live(&self.cfg, real) && !w.granted_seen {
                    self.violate(
                        Check::Overtaken,
                        format!(
                            "{noun} {i} granted (token {token}) to {owner} attempt {attempt} \
                             while live waiter c{c}:t{t} ({y} attempt {ay}) was queued ahead of it"
                        ),
                    );
                }
            }
            // 6. no ghost hold: a new hold goes to an attempt that is still under way (queued,
            //    or in its own acquire or leave call), never to one that has ended
            if let Some((c, t)) = self.thread_of(owner) {
                let th = &self.clients[c].threads[t];
                let side = th.side(p);
                // (a thread that still holds a guard of that attempt, whose hold was lost,
                // ends the new one with its release, which frees a hold of its own attempt)
                let under_way = side.calling == Some((i, attempt))
                    || side.waits_with(i, attempt)
                    || matches!(&side.state, State::Holding(h) if h.lock == i && h.attempt == attempt && h.late_acquire.is_some());
                if !under_way {
                    if attempt <= th.marks_lost_upto {
                        let what = format!(
                            "exempt: {pfx}late acquire of an attempt whose mark was lost with the \
                             data"
                        );
                        self.stats.add(&what, 1);
                    } else if let Some(by_open) = side.unsure_end.get(&(i, attempt)).and_then(|u| {
                        let (closed, open) = self.quiet_lag(p, i, u.since_real, real);
                        let timeout = self.cfg.waiter_timeout_ms;
                        let past = |lag| u.expired(real, self.back_steps_ms, timeout, lag);
                        (!past(closed + open)).then(|| past(closed))
                    }) {
                        let what =
                            format!("exempt: {pfx}late acquire of an attempt whose mark was lost");
                        self.stats.add(&what, 1);
                        if by_open {
                            let what = format!(
                                "exempt: {pfx}late acquire of an attempt whose mark was lost, \
                                 within the quiet spell its grant closed"
                            );
                            self.stats.add(&what, 1);
                        }
                    } else {
                        self.violate(
                            Check::GhostHold,
                            format!(
                                "{noun} {i} granted (token {token}) to c{c}:t{t} ({owner} attempt \
                                 {attempt}), an attempt that has ended: nobody holds a guard or \
                                 permit of it"
                            ),
                        );
                    }
                }
            } else {
                self.crashed_client_granted(p, i, owner, real);
            }
            if p == Prim::Lock {
                self.dead_waiter_handoff(i, owner, attempt, token, real);
            }
            if let Some((c, t)) = self.waiter(p, owner, i, attempt) {
                let forward = self.clock.forward();
                if let State::Waiting(w) = &mut self.clients[c].threads[t].side_mut(p).state {
                    w.granted_seen = true;
                    w.grant_forward.get_or_insert(forward);
                    w.handoff = Some(Handoff {
                        token,
                        earliest_end: sent + w.lease_ms as f64,
                        wake_lost: false,
                        heartbeat_after: false,
                    });
                }
            }
        }
    }

    /// Check 7: in a try-only quiet phase every waiter is dead (the live ones left first): a
    /// hand-off of lock `l` (a grant to anyone but a caller in its own call) goes to a dead
    /// waiter, and that must stop within a few waiter timeouts of traffic. Not for a semaphore:
    /// its try-only ending also queues dead waiters for all of its permits, which only the
    /// end's liveness judges.
    fn dead_waiter_handoff(&mut self, l: usize, owner: &str, attempt: u64, token: u64, real: f64) {
        let own_call = self
            .thread_of(owner)
            .is_some_and(|(c, t)| self.clients[c].threads[t].lock.calling == Some((l, attempt)));
        if let (Some(q), false) = (&mut self.try_only_quiet, own_call) {
            let grace = self.cfg.waiter_timeout_ms as f64 + 2.0 * self.cfg.cap_ms();
            let after = real - q.since;
            q.handoffs.insert(l, (token, real));
            self.stats
                .add("try-only quiet: hand-off to a dead waiter", 1);
            if after > grace {
                self.violate(
                    Check::DeadWaiter,
                    format!(
                        "lock {l} handed (token {token}) to {owner} attempt {attempt}, a waiter \
                         dead since before the quiet phase, {after:.0}ms into it (only try_lock \
                         callers came by; dead waiters must be passed over within {grace:.0}ms)"
                    ),
                );
            }
        }
    }

    /// The thread waiting on `i` of `p` as `owner` with `attempt`, if any.
    pub fn waiter(&self, p: Prim, owner: &str, i: usize, attempt: u64) -> Option<(usize, usize)> {
        let (c, t) = self.thread_of(owner)?;
        self.clients[c].threads[t]
            .side(p)
            .waits_with(i, attempt)
            .then_some((c, t))
    }

    fn max_token(&mut self, p: Prim, i: usize) -> &mut u64 {
        match p {
            Prim::Lock => &mut self.checker.max_token[i],
            Prim::Sem => &mut self.sem_checker.max_token[i],
        }
    }

    fn fence_lost_flag(&mut self, p: Prim, i: usize) -> &mut bool {
        match p {
            Prim::Lock => &mut self.checker.fence_lost[i],
            Prim::Sem => &mut self.sem_checker.fence_lost[i],
        }
    }

    /// A token an operator released by force: its hand-off may vanish.
    fn forced(&self, p: Prim, i: usize, token: u64) -> bool {
        match p {
            Prim::Lock => self.checker.forced[i].contains(&token),
            Prim::Sem => self.sem_checker.forced[i].contains(&token),
        }
    }
}
