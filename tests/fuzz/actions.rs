//! The actions of threads and clients, as the real client performs them (`src/lock.rs`,
//! `guard.rs`, the janitor and the watchdog): acquire and its re-runs, pop, re-enter, release,
//! renew, leave, heartbeat. Errors get the real client's reaction; replies are checked for
//! shapes the scripts never give.

use std::time::Duration;

use fairlock::raw::{self, Acquire, LateAcquire, Leave, LeaveMode, Mode, Release, Wake};

use crate::checks::Check;
use crate::model::{Hold, State, Wait};
use crate::steps::{AcquireStep, Fault, Who};
use crate::world::{describe, fault_name, Plan, World};

impl World {
    /// The pttl a grant's estimate is built on: as the real client, the reply's, at most the
    /// lease ([`Config::cap_pttl_at_lease`](crate::model::Config)).
    fn pttl(&mut self, pttl_ms: i64, lease_ms: u64) -> i64 {
        if self.cfg.cap_pttl_at_lease && pttl_ms > lease_ms as i64 {
            self.say(format!(
                " (pttl {pttl_ms}ms above the lease: taken as {lease_ms}ms)"
            ));
            self.stats
                .add("granted pttl above the lease, capped as the client does", 1);
            return lease_ms as i64;
        }
        pttl_ms
    }

    pub fn acquire(&mut self, step: AcquireStep) -> bool {
        let (c, t, lock, lease_ms) = (step.c, step.t, step.lock, step.lease_ms);
        if !self.fits(c, t) || lock >= self.locks.len() {
            return false;
        }
        if !matches!(self.state(c, t), State::Idle) {
            return false;
        }
        let attempt = self.clients[c].next_attempt;
        self.clients[c].next_attempt += 1;
        let plan = Plan {
            lock,
            attempt,
            lease_ms,
            wait: step.wait,
            deadline: step.deadline_ms.map(|d| self.clock.fz() + d as f64),
            unanswered: false,
        };
        let mode = if step.wait { "wait" } else { "try" };
        self.say(format!(
            "c{c}:t{t} acquire {mode} lock={lock} attempt={attempt} lease={lease_ms}ms"
        ));
        if let Some(d) = step.deadline_ms {
            self.say(format!(" timeout={d}ms"));
        }
        self.run_acquire(c, t, plan, step.fault, step.then);
        true
    }

    /// An acquire call and the real client's reaction; a grant whose lease is already over by
    /// the estimate is re-checked with the same attempt (three times at most, then it fails).
    /// A grant in a reply (`via`) sent at `sent` becomes a hold, as in the real client, unless
    /// its lease is already over by the estimate. Returns whether it did.
    fn hold_grant(
        &mut self,
        c: usize,
        t: usize,
        plan: &Plan,
        g: raw::Grant,
        sent: f64,
        via: &str,
    ) -> bool {
        let expires = sent + self.pttl(g.pttl_ms, plan.lease_ms) as f64;
        if expires <= self.clock.fz() {
            self.say(" (lease over by the estimate)");
            return false;
        }
        *self.state(c, t) = State::Holding(Hold {
            lock: plan.lock,
            attempt: plan.attempt,
            token: g.token,
            depth: 1,
            lease_ms: plan.lease_ms,
            expires,
            origin: format!("{via} pttl={}ms sent at {sent:.0}ms", g.pttl_ms),
        });
        true
    }

    pub fn run_acquire(&mut self, c: usize, t: usize, mut plan: Plan, fault: Fault, then: Fault) {
        let mut fault = fault;
        for round in 0..3 {
            if round > 0 {
                self.say(format!("; re-run acquire attempt={}", plan.attempt));
            }
            let owner = self.owner(c, t);
            let mode = if plan.wait { Mode::Wait } else { Mode::Try };
            let call = self.locks[plan.lock].acquire(
                &owner,
                plan.attempt,
                Duration::from_millis(plan.lease_ms),
                mode,
                &format!("fuzz|{c}|{t}"),
            );
            let label = format!("c{c}:t{t} acquire attempt={}", plan.attempt);
            let s = self.exec(Some(Who::Thread(c, t)), label, call, fault);
            plan.unanswered |= fault != Fault::None;
            fault = then;
            let reply = match s.reply {
                Err(_) => {
                    self.say(" -> error");
                    self.leave_quietly(c, t, plan, then);
                    return;
                }
                Ok(r) => r,
            };
            self.say(format!(" -> {reply:?}"));
            match reply {
                Acquire::Granted(g) => {
                    if self.hold_grant(c, t, &plan, g, s.sent, "acquire reply") {
                        return;
                    }
                }
                Acquire::Busy { .. } => {
                    if plan.wait {
                        self.violate(Check::BadReply, "acquire in wait mode answered busy".into());
                    }
                    *self.state(c, t) = State::Idle;
                    return;
                }
                Acquire::Queued { server_ms, .. } => {
                    if !plan.wait {
                        self.violate(Check::BadReply, "acquire in try mode queued".into());
                    }
                    *self.state(c, t) = State::Waiting(Wait {
                        lock: plan.lock,
                        attempt: plan.attempt,
                        lease_ms: plan.lease_ms,
                        deadline: plan.deadline,
                        sent: s.sent,
                        server_ms,
                        place: true,
                        refreshed: s.sent_real,
                        forward_steps: 0,
                        granted_seen: false,
                        handoff: None,
                        unanswered: plan.unanswered,
                    });
                    return;
                }
                Acquire::Stale => {
                    let owner = self.owner(c, t);
                    self.violate(
                        Check::BadReply,
                        format!(
                            "acquire of {owner} attempt {} (its newest) answered stale",
                            plan.attempt
                        ),
                    );
                    *self.state(c, t) = State::Idle;
                    return;
                }
            }
        }
        self.say("; gives up after 3 late grants");
        self.leave_quietly(c, t, plan, Fault::None);
    }

    /// After an error: leave with `pass` (best effort) and go idle.
    pub fn leave_quietly(&mut self, c: usize, t: usize, plan: Plan, fault: Fault) {
        let owner = self.owner(c, t);
        self.say(format!("; leave pass attempt={}", plan.attempt));
        let call = self.locks[plan.lock].leave(&owner, plan.attempt, LeaveMode::Pass, late(&plan));
        let label = format!("c{c}:t{t} leave pass attempt={}", plan.attempt);
        let s = self.exec(Some(Who::Thread(c, t)), label, call, fault);
        self.say(format!(" -> {}", describe(&s.reply)));
        *self.state(c, t) = State::Idle;
    }

    pub fn waiting(&mut self, c: usize, t: usize) -> Option<&mut Wait> {
        match self.state(c, t) {
            State::Waiting(w) => Some(w),
            _ => None,
        }
    }

    pub fn holding(&mut self, c: usize, t: usize) -> Option<&mut Hold> {
        match self.state(c, t) {
            State::Holding(h) => Some(h),
            _ => None,
        }
    }

    /// The client's waker pops the wake list of the lock thread `t` waits on, and hands the
    /// message to the thread of the client that waits with its attempt (`src/waker.rs`).
    pub fn pop(&mut self, c: usize, t: usize, fault: Fault, then: Fault) -> bool {
        if !self.fits(c, t) {
            return false;
        }
        let Some(w) = self.waiting(c, t) else {
            return false;
        };
        let lock = w.lock;
        let owner = self.owner(c, t);
        self.say(format!("c{c} waker pops lock {lock} (for t{t})"));
        let key = self.locks[lock].wake_key(&owner);
        let popped: Result<Option<String>, String> = if fault == Fault::Dropped {
            self.say(" [request lost]");
            Err("request lost".into())
        } else {
            let conn = Self::conn_of(Some(Who::Thread(c, t)));
            let r = redis::cmd("LPOP")
                .arg(&key)
                .query::<Option<String>>(&mut self.conns[conn])
                .map_err(|e| e.to_string());
            self.after_call(Some((c, t)), self.clock.fz());
            match (&r, fault) {
                (Err(e), _) => {
                    let e = e.clone();
                    self.violate(Check::ScriptError, format!("LPOP failed: {e}"));
                    return true;
                }
                (Ok(v), Fault::Lost) => {
                    self.say(format!(" [reply lost: {v:?}]"));
                    Err("reply lost".into())
                }
                _ => r,
            }
        };
        if fault != Fault::None {
            self.stats.add(&format!("fault: {}", fault_name(fault)), 1);
        }
        let msg = match popped {
            Err(_) => {
                // the waker's connection failed: every waiting thread of the client re-checks
                self.say(" -> error; its waiting threads re-check");
                for t2 in 0..self.clients[c].threads.len() {
                    if let Some(w2) = self.waiting(c, t2) {
                        let plan = Plan::of(w2);
                        self.say(format!("; c{c}:t{t2}"));
                        self.run_acquire(c, t2, plan, then, Fault::None);
                    }
                }
                return true;
            }
            Ok(None) => {
                self.say(" -> empty");
                return true;
            }
            Ok(Some(msg)) => msg,
        };
        self.say(format!(" -> {msg:?}"));
        let wake = match raw::parse_wake(&msg) {
            Ok(w) => w,
            Err(e) => {
                self.violate(Check::BadReply, format!("wake-up message {msg:?}: {e}"));
                return true;
            }
        };
        let to = (0..self.clients[c].threads.len())
            .find(|&t2| self.clients[c].threads[t2].state_waits_with(lock, wake.attempt()));
        let Some(t) = to else {
            self.say(" (no thread waits with that attempt: dropped)");
            return true;
        };
        self.say(format!(" to t{t}"));
        let w = self.waiting(c, t).expect("found waiting above");
        let plan = Plan::of(w);
        let (sent0, server0, lease) = (w.sent, w.server_ms, w.lease_ms);
        match wake {
            Wake::Grant {
                token, server_ms, ..
            } => {
                let now = self.clock.fz();
                let queued_for = ((server_ms - server0).max(0) as f64).min(now - sent0);
                let expires = sent0 + queued_for + lease as f64;
                if expires > now {
                    *self.state(c, t) = State::Holding(Hold {
                        lock: plan.lock,
                        attempt: plan.attempt,
                        token,
                        depth: 1,
                        lease_ms: lease,
                        expires,
                        origin: format!(
                            "hand-off at server {server_ms}ms, queued at server {server0}ms \
                             by a request sent at {sent0:.0}ms, popped at {now:.0}ms"
                        ),
                    });
                } else {
                    self.say(" (lease over by the estimate)");
                    self.run_acquire(c, t, plan, then, Fault::None);
                }
            }
            Wake::Retry { .. } => self.run_acquire(c, t, plan, then, Fault::None),
        }
        true
    }

    /// A hold that was force-unlocked, evicted or lost with the data is gone for good (tokens
    /// are unique): its holder must find out, never renew or re-enter it.
    pub fn check_gone(&mut self, c: usize, t: usize, h: &Hold, what: &str) {
        if self.checker.is_exempt(h.lock, h.token) {
            self.violate(
                Check::BadReply,
                format!(
                    "c{c}:t{t} {what} token {} of lock {}, a hold that was force-unlocked or \
                     whose data was lost",
                    h.token, h.lock
                ),
            );
        }
    }

    pub fn valid_hold(&mut self, c: usize, t: usize) -> Option<Hold> {
        let now = self.clock.fz();
        if !self.fits(c, t) {
            return None;
        }
        self.holding(c, t).filter(|h| h.expires > now).cloned()
    }

    pub fn reenter(&mut self, c: usize, t: usize, fault: Fault) -> bool {
        let Some(h) = self.valid_hold(c, t) else {
            return false;
        };
        let owner = self.owner(c, t);
        self.say(format!(
            "c{c}:t{t} reenter token={} depth={}",
            h.token, h.depth
        ));
        let call = self.locks[h.lock].reenter(&owner, h.token, h.depth);
        let label = format!("c{c}:t{t} reenter depth={}", h.depth);
        let s = self.exec(Some(Who::Thread(c, t)), label, call, fault);
        self.say(format!(" -> {}", describe(&s.reply)));
        match s.reply {
            Ok(raw::Reenter::Reentered(n)) => {
                self.check_gone(c, t, &h, "re-entered");
                if n != h.depth + 1 {
                    self.violate(
                        Check::BadReply,
                        format!("reenter at depth {} answered count {n}", h.depth),
                    );
                }
                if let Some(h) = self.holding(c, t) {
                    h.depth += 1;
                }
            }
            Ok(raw::Reenter::Lost) => *self.state(c, t) = State::Idle,
            Err(_) => {}
        }
        true
    }

    pub fn release(&mut self, c: usize, t: usize, fault: Fault) -> bool {
        if !self.fits(c, t) {
            return false;
        }
        let Some(h) = self.holding(c, t).cloned() else {
            return false;
        };
        // like the guard: the level is given up before the request goes out
        if h.depth <= 1 {
            *self.state(c, t) = State::Idle;
        } else if let Some(hh) = self.holding(c, t) {
            hh.depth -= 1;
        }
        let owner = self.owner(c, t);
        self.say(format!(
            "c{c}:t{t} release token={} depth={}",
            h.token, h.depth
        ));
        let call = self.locks[h.lock].release(&owner, h.token, h.depth);
        let label = format!("c{c}:t{t} release token={} depth={}", h.token, h.depth);
        let s = self.exec(Some(Who::Thread(c, t)), label, call, fault);
        self.say(format!(" -> {}", describe(&s.reply)));
        match s.reply {
            Ok(Release::Released { .. }) if h.depth > 1 => self.violate(
                Check::BadReply,
                format!("release at depth {} freed the lock", h.depth),
            ),
            // the thread believes the lock is free of it now: Redis must agree
            Ok(Release::Released { .. } | Release::StillHeld)
                if h.depth == 1 && self.checker.last[h.lock].token == h.token =>
            {
                self.violate(
                    Check::ReleaseIneffective,
                    format!(
                        "c{c}:t{t} released token {} at depth 1 and was told so, but Redis \
                         still holds it for {owner}",
                        h.token
                    ),
                );
            }
            Ok(Release::StillHeld) if h.depth > 1 => {
                self.check_gone(c, t, &h, "released a level of")
            }
            Ok(Release::NotHeld { .. }) if h.depth > 1 => *self.state(c, t) = State::Idle,
            _ => {}
        }
        true
    }

    pub fn renew(&mut self, c: usize, t: usize, fault: Fault) -> bool {
        let Some(h) = self.valid_hold(c, t) else {
            return false;
        };
        let owner = self.owner(c, t);
        self.say(format!("c{c}:t{t} renew token={}", h.token));
        let call = self.locks[h.lock].renew(&owner, h.token, Duration::from_millis(h.lease_ms));
        let label = format!("c{c}:t{t} renew token={}", h.token);
        let s = self.exec(Some(Who::Thread(c, t)), label, call, fault);
        self.say(format!(" -> {}", describe(&s.reply)));
        match s.reply {
            Ok(true) => {
                self.check_gone(c, t, &h, "renewed");
                if let Some(hh) = self.holding(c, t) {
                    // renew.lua sets the TTL to the lease: it may shorten it (as the watchdog)
                    hh.expires = s.sent + h.lease_ms as f64;
                    hh.origin = format!("renewal sent at {:.0}ms", s.sent);
                }
            }
            Ok(false) => *self.state(c, t) = State::Idle,
            Err(_) => {}
        }
        true
    }

    pub fn leave_claim(&mut self, c: usize, t: usize, fault: Fault, then: Fault) -> bool {
        if !self.fits(c, t) {
            return false;
        }
        let now = self.clock.fz();
        let Some(w) = self.waiting(c, t) else {
            return false;
        };
        if w.deadline.is_none_or(|d| d > now) {
            return false;
        }
        let plan = Plan::of(w);
        let owner = self.owner(c, t);
        self.say(format!(
            "c{c}:t{t} deadline: leave claim attempt={}",
            plan.attempt
        ));
        let call = self.locks[plan.lock].leave(&owner, plan.attempt, LeaveMode::Claim, late(&plan));
        let label = format!("c{c}:t{t} leave claim attempt={}", plan.attempt);
        let s = self.exec(Some(Who::Thread(c, t)), label, call, fault);
        self.say(format!(" -> {}", describe(&s.reply)));
        match s.reply {
            Ok(Leave::Granted(g)) => {
                if !self.hold_grant(c, t, &plan, g, s.sent, "leave claim reply") {
                    self.run_acquire(c, t, plan, then, Fault::None);
                }
            }
            Ok(Leave::Left) => *self.state(c, t) = State::Idle,
            Ok(Leave::Passed { .. }) => {
                self.violate(Check::BadReply, "leave claim answered passed".into());
                *self.state(c, t) = State::Idle;
            }
            Err(_) => self.leave_quietly(c, t, plan, then),
        }
        true
    }

    pub fn leave_pass(&mut self, c: usize, t: usize, fault: Fault) -> bool {
        if !self.fits(c, t) {
            return false;
        }
        let Some(w) = self.waiting(c, t) else {
            return false;
        };
        let plan = Plan::of(w);
        self.say(format!("c{c}:t{t} gives up waiting"));
        self.leave_quietly(c, t, plan, fault);
        true
    }

    /// One heartbeat of client `c` for all its waiting attempts on `lock`.
    pub fn heartbeat(&mut self, c: usize, lock: usize, fault: Fault) -> bool {
        if c >= self.clients.len() || !self.active(c) || lock >= self.locks.len() {
            return false;
        }
        let pairs: Vec<(usize, String, u64)> = self.clients[c]
            .threads
            .iter()
            .enumerate()
            .filter_map(|(t, th)| match &th.state {
                State::Waiting(w) if w.lock == lock => Some((t, th.owner.clone(), w.attempt)),
                _ => None,
            })
            .collect();
        if pairs.is_empty() {
            return false;
        }
        let attempts: Vec<String> = pairs.iter().map(|(t, _, a)| format!("t{t}={a}")).collect();
        self.say(format!("c{c} heartbeat lock={lock} {}", attempts.join(",")));
        let call = self.locks[lock].heartbeat(pairs.iter().map(|(_, o, a)| (o.as_str(), *a)));
        let s = self.exec(None, format!("c{c} heartbeat"), call, fault);
        self.say(format!(" -> {}", describe(&s.reply)));
        if let Ok(hb) = s.reply {
            for (t, owner, attempt) in pairs {
                if let Some(w) = self.waiting(c, t).filter(|w| w.attempt == attempt) {
                    if hb.told_to_retry.contains(&owner) {
                        w.place = false;
                    } else {
                        w.refreshed_at(s.sent_real);
                    }
                }
            }
        }
        true
    }

    /// Every active client heartbeats its waiters and renews its holds (janitor and watchdog).
    pub fn keepalive(&mut self) {
        for c in 0..self.clients.len() {
            if !self.active(c) {
                continue;
            }
            for lock in 0..self.locks.len() {
                let before = self.line.len();
                self.say("; ");
                if !self.heartbeat(c, lock, Fault::None) {
                    self.line.truncate(before);
                }
            }
            for t in 0..self.clients[c].threads.len() {
                let before = self.line.len();
                self.say("; ");
                if !self.renew(c, t, Fault::None) {
                    self.line.truncate(before);
                }
            }
        }
    }
}

/// Whether the leave of `plan`'s attempt asks for a left mark (as the real client's does).
fn late(plan: &Plan) -> LateAcquire {
    if plan.unanswered {
        LateAcquire::Possible
    } else {
        LateAcquire::Impossible
    }
}
