//! What differs between the primitives, and only that: which script a thread's action calls on a
//! lock or on a semaphore (or read/write lock), how its reply reads (in one shape for both, so
//! `actions.rs` reacts to it once), and what Redis has of an attempt. The judges' admission
//! invariant (a lock: one holder; a semaphore: the permits held within its capacity; a
//! read/write lock: a writer alone or readers only, as a semaphore of `RW_CAPACITY` whose write
//! takes all) is in `checks.rs` and `sem.rs`.

use std::collections::HashSet;
use std::time::Duration;

use fairlock::raw::{
    Acquire, LateAcquire, Leave, LeaveMode, Mode, Release, SemAcquire, SemLeave, SemRelease,
};

use crate::fuzz::model::{Hold, Prim};
use crate::fuzz::steps::{Fault, Who};
use crate::fuzz::world::{describe, Plan, Sent, World};

/// An acquire's reply, either primitive's.
pub enum Acq {
    Granted {
        token: u64,
        pttl_ms: i64,
    },
    Busy,
    Queued {
        server_ms: i64,
        last_token: u64,
    },
    Stale,
    /// A semaphore's kind or capacity differs from the caller's (never, in a run).
    Mismatch(String),
}

/// A leave's reply.
pub enum Gone {
    Granted { token: u64, pttl_ms: i64 },
    Left,
    Passed,
}

/// A release's reply.
#[derive(Debug)]
pub enum Rel {
    Released,
    /// An inner level of a re-entered lock was released.
    StillHeld,
    NotHeld,
}

/// A heartbeat's reply, as the janitor reads it.
pub struct Beat {
    pub last_token: u64,
    pub told_to_retry: Vec<String>,
    /// It left the primitive with nothing held (check 10 then wants nobody queued).
    pub left_free: bool,
}

fn ms(d: Duration) -> i64 {
    d.as_millis() as i64
}

/// The reply in the common shape, and the script's own reply for the log.
fn read<T: std::fmt::Debug, U>(s: Sent<T>, f: impl FnOnce(T) -> U) -> (Sent<U>, String) {
    let text = describe(&s.reply);
    let Sent {
        reply,
        sent,
        sent_real,
    } = s;
    (
        Sent {
            reply: reply.map(f),
            sent,
            sent_real,
        },
        text,
    )
}

impl World {
    /// How many locks or semaphores the run has.
    pub fn count(&self, p: Prim) -> usize {
        match p {
            Prim::Lock => self.locks.len(),
            Prim::Sem => self.sems.len(),
        }
    }

    pub fn wake_key(&self, p: Prim, i: usize, owner: &str) -> String {
        match p {
            Prim::Lock => self.locks[i].wake_key(owner),
            Prim::Sem => self.sems[i].wake_key(owner),
        }
    }

    /// The `late_pops` entry's index of wake list `i` of `p`.
    pub fn late_pop_index(p: Prim, i: usize) -> usize {
        match p {
            Prim::Lock => i,
            Prim::Sem => crate::fuzz::sem::SEM_POP + i,
        }
    }

    /// A token no hold may use again: force-released, evicted or lost with all data.
    pub fn token_exempt(&self, p: Prim, i: usize, token: u64) -> bool {
        match p {
            Prim::Lock => self.checker.is_exempt(i, token),
            Prim::Sem => self.sem_checker.exempt[i].contains(&token),
        }
    }

    /// The owners whose waiters entries may outlive their places (check 8).
    pub fn queue_lost(&mut self, p: Prim, i: usize) -> &mut Option<HashSet<String>> {
        match p {
            Prim::Lock => &mut self.checker.queue_lost[i],
            Prim::Sem => &mut self.sem_checker.queue_lost[i],
        }
    }

    pub fn call_acquire(
        &mut self,
        p: Prim,
        c: usize,
        t: usize,
        plan: &Plan,
        fault: Fault,
    ) -> (Sent<Acq>, String) {
        let owner = self.owner(c, t);
        let mode = if plan.wait { Mode::Wait } else { Mode::Try };
        let lease = Duration::from_millis(plan.lease_ms);
        let tag = format!("fuzz|{c}|{t}");
        let who = Some(Who::Thread(c, t));
        let (i, a) = (plan.lock, plan.attempt);
        match p {
            Prim::Lock => {
                let call = self.locks[i].acquire(&owner, a, lease, mode, &tag);
                let label = format!("c{c}:t{t} acquire lock={i} attempt={a}");
                read(self.exec(who, label, call, fault), |r| match r {
                    Acquire::Granted(g) => Acq::Granted {
                        token: g.token,
                        pttl_ms: g.pttl_ms,
                    },
                    Acquire::Busy { .. } => Acq::Busy,
                    Acquire::Queued {
                        server_ms,
                        last_token,
                        ..
                    } => Acq::Queued {
                        server_ms,
                        last_token,
                    },
                    Acquire::Stale => Acq::Stale,
                })
            }
            Prim::Sem => {
                let permits = self.clients[c].threads[t].sem.permits;
                let call = self.sems[i].acquire(&owner, a, permits, lease, mode, &tag);
                let label = format!("c{c}:t{t} sem acquire sem={i} attempt={a}");
                read(self.exec(who, label, call, fault), |r| match r {
                    SemAcquire::Granted { token, pttl, .. } => Acq::Granted {
                        token,
                        pttl_ms: ms(pttl),
                    },
                    SemAcquire::Busy { .. } => Acq::Busy,
                    SemAcquire::Queued {
                        server_ms,
                        last_token,
                    } => Acq::Queued {
                        server_ms,
                        last_token,
                    },
                    SemAcquire::Stale => Acq::Stale,
                    SemAcquire::Mismatch { kind, capacity } => {
                        Acq::Mismatch(format!("{kind}, {capacity}"))
                    }
                })
            }
        }
    }

    /// A leave of `plan`'s attempt, claiming a grant or passing it on; it asks for a left mark
    /// when a copy of the attempt's acquire may still arrive (as the real client's does).
    pub fn call_leave(
        &mut self,
        p: Prim,
        c: usize,
        t: usize,
        plan: &Plan,
        claim: bool,
        fault: Fault,
    ) -> (Sent<Gone>, String) {
        let owner = self.owner(c, t);
        let (i, a, mark) = (plan.lock, plan.attempt, plan.unanswered);
        let who = Some(Who::Thread(c, t));
        let what = if claim { "claim" } else { "pass" };
        let label = format!("c{c}:t{t} {}leave {what} attempt={a}", p.prefix());
        if mark {
            self.clients[c].threads[t].side_mut(p).marked.insert((i, a));
        }
        match p {
            Prim::Lock => {
                let mode = if claim {
                    LeaveMode::Claim
                } else {
                    LeaveMode::Pass
                };
                let late = if mark {
                    LateAcquire::Possible
                } else {
                    LateAcquire::Impossible
                };
                let call = self.locks[i].leave(&owner, a, mode, late);
                read(self.exec(who, label, call, fault), |r| match r {
                    Leave::Granted(g) => Gone::Granted {
                        token: g.token,
                        pttl_ms: g.pttl_ms,
                    },
                    Leave::Left => Gone::Left,
                    Leave::Passed { .. } => Gone::Passed,
                })
            }
            Prim::Sem => {
                let call = self.sems[i].leave(&owner, a, mark, claim);
                read(self.exec(who, label, call, fault), |r| match r {
                    SemLeave::Granted { token, pttl, .. } => Gone::Granted {
                        token,
                        pttl_ms: ms(pttl),
                    },
                    SemLeave::Left => Gone::Left,
                    SemLeave::Passed { .. } => Gone::Passed,
                })
            }
        }
    }

    /// A release of one level of `h` (a semaphore's holds have one), asking for the attempt's
    /// left mark when `mark`.
    pub fn call_release(
        &mut self,
        p: Prim,
        c: usize,
        t: usize,
        h: &Hold,
        mark: bool,
        fault: Fault,
    ) -> Sent<Rel> {
        let owner = self.owner(c, t);
        let who = Some(Who::Thread(c, t));
        if mark {
            self.clients[c].threads[t]
                .side_mut(p)
                .marked
                .insert((h.lock, h.attempt));
        }
        match p {
            Prim::Lock => {
                let l = &self.locks[h.lock];
                let call = if mark {
                    l.release_marking(&owner, h.token, h.depth, h.attempt)
                } else {
                    l.release(&owner, h.token, h.depth)
                };
                let label = format!("c{c}:t{t} release token={} depth={}", h.token, h.depth);
                read(self.exec(who, label, call, fault), |r| match r {
                    Release::Released { .. } => Rel::Released,
                    Release::StillHeld => Rel::StillHeld,
                    Release::NotHeld { .. } => Rel::NotHeld,
                })
                .0
            }
            Prim::Sem => {
                let call = self.sems[h.lock].release(&owner, h.attempt, h.token, mark);
                let label = format!("c{c}:t{t} sem release token={}", h.token);
                read(self.exec(who, label, call, fault), |r| match r {
                    SemRelease::Released { .. } => Rel::Released,
                    SemRelease::NotHeld => Rel::NotHeld,
                })
                .0
            }
        }
    }

    pub fn call_renew(
        &mut self,
        p: Prim,
        c: usize,
        t: usize,
        h: &Hold,
        fault: Fault,
    ) -> Sent<bool> {
        let owner = self.owner(c, t);
        let lease = Duration::from_millis(h.lease_ms);
        let label = format!("c{c}:t{t} {}renew token={}", p.prefix(), h.token);
        let call = match p {
            Prim::Lock => self.locks[h.lock].renew(&owner, h.token, lease),
            Prim::Sem => self.sems[h.lock].renew(&owner, h.attempt, h.token, lease),
        };
        self.exec(Some(Who::Thread(c, t)), label, call, fault)
    }

    /// A renewal's new lease end by the holder's estimate: a lock's `renew.lua` sets the TTL to
    /// the lease (it may shorten it, as the watchdog knows); a semaphore's never shortens one.
    pub fn renewed_until(p: Prim, h: &Hold, sent: f64) -> f64 {
        match p {
            Prim::Lock => sent + h.lease_ms as f64,
            Prim::Sem => h.expires.max(sent + h.lease_ms as f64),
        }
    }

    /// One heartbeat of client `c` on `i` for `pairs` (owner, attempt). `left_free` is judged
    /// as each primitive can: a lock held just before (its hold may end as the heartbeat runs)
    /// and a semaphore whose capacity is unknown (its hash lost) are not judged, counted.
    pub fn call_heartbeat(
        &mut self,
        p: Prim,
        c: usize,
        i: usize,
        pairs: &[(usize, String, u64)],
        fault: Fault,
    ) -> (Sent<Beat>, String) {
        let names = pairs.iter().map(|(_, o, a)| (o.as_str(), *a));
        let label = format!("c{c} {}heartbeat", p.prefix());
        match p {
            Prim::Lock => {
                let call = self.locks[i].heartbeat(names);
                let held_before = !self.checker.last[i].owner.is_empty();
                let (s, text) = read(self.exec(None, label, call, fault), |hb| {
                    (hb.pttl_ms == 0, hb.last_token, hb.told_to_retry)
                });
                if matches!(s.reply, Ok((true, ..))) && held_before {
                    self.stats
                        .add("heartbeat as a hold ends: checked at the next", 1);
                }
                read(s, |(free, last_token, told_to_retry)| Beat {
                    last_token,
                    told_to_retry,
                    left_free: free && !held_before,
                })
                .0
                .with_text(text)
            }
            Prim::Sem => {
                let call = self.sems[i].heartbeat(names);
                let (s, text) = read(self.exec(None, label, call, fault), |hb| {
                    (
                        hb.used == 0,
                        hb.capacity.is_some(),
                        hb.last_token,
                        hb.told_to_retry,
                    )
                });
                if matches!(s.reply, Ok((true, false, ..))) {
                    self.stats
                        .add("sem heartbeat with the capacity unknown (hash lost)", 1);
                }
                read(s, |(free, known, last_token, told_to_retry)| Beat {
                    last_token,
                    told_to_retry,
                    left_free: free && known,
                })
                .0
                .with_text(text)
            }
        }
    }

    /// Redis's queue on `i` now (check 10), with what the message shows of the rest.
    pub fn queue_now(&mut self, p: Prim, i: usize) -> (Vec<String>, String) {
        match p {
            Prim::Lock => {
                let cur = self.snapshot(false).locks[i].clone();
                let detail = format!("waiters {:?}, owner {:?}", cur.waiters, cur.owner);
                let queue = cur.queue.iter().map(|(o, _)| o.clone()).collect();
                (queue, detail)
            }
            Prim::Sem => {
                let cur = self.sem_snapshot().swap_remove(i);
                let queue = cur.queue.iter().map(|(o, _)| o.clone()).collect();
                (
                    queue,
                    format!("waiters {:?}, holds {:?}", cur.waiters, cur.holds),
                )
            }
        }
    }

    /// What Redis has now of `owner`'s `attempt` on `i` (check 11): (holds it, queued with it,
    /// what it shows).
    pub fn attempt_in_redis(
        &mut self,
        p: Prim,
        i: usize,
        owner: &str,
        attempt: u64,
    ) -> (bool, bool, String) {
        match p {
            Prim::Lock => {
                let cur = self.snapshot(false).locks[i].clone();
                let holds = cur.owner == owner && cur.attempt == attempt;
                let placed = cur.waiters.get(owner) == Some(&attempt);
                let detail = format!(
                    "lock {i}: owner {:?} attempt {}, waiters {:?}",
                    cur.owner, cur.attempt, cur.waiters
                );
                (holds, placed, detail)
            }
            Prim::Sem => {
                let cur = self.sem_snapshot().swap_remove(i);
                let holds = cur.holds.contains_key(&format!("{owner}#{attempt}"));
                let placed = cur.waiters.get(owner) == Some(&attempt);
                let detail = format!("sem {i}: holds {:?}, waiters {:?}", cur.holds, cur.waiters);
                (holds, placed, detail)
            }
        }
    }

    /// Whether Redis, at the last snapshot, still had the hold `h` of `owner`.
    pub fn still_held(&self, p: Prim, owner: &str, h: &Hold) -> bool {
        match p {
            Prim::Lock => self.checker.last[h.lock].token == h.token,
            Prim::Sem => {
                let id = format!("{owner}#{}", h.attempt);
                self.sem_checker.last[h.lock].holds.get(&id).map(|x| x.0) == Some(h.token)
            }
        }
    }
}

impl<T> Sent<T> {
    fn with_text(self, text: String) -> (Sent<T>, String) {
        (self, text)
    }
}
