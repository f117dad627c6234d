//! The actions of threads and clients, as the real client performs them (`src/lock/`,
//! `guard.rs`, the janitor and the watchdog): acquire and its re-runs, pop, re-enter, release,
//! renew, leave, heartbeat. Errors get the real client's reaction; replies are checked for
//! shapes the scripts never give.

use std::time::Duration;

use fairlock::raw::{
    self, judge_handoff, Acquire, Handoff, LateAcquire, Leave, LeaveMode, Mode, Release, Wake,
    Witness,
};

use crate::checks::Check;
use crate::fifo::Prim;
use crate::model::{Hold, LocalMs, State, Wait};
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
            late_acquire: plan.unanswered.then_some(plan.attempt),
        });
        true
    }

    pub fn run_acquire(&mut self, c: usize, t: usize, plan: Plan, fault: Fault, then: Fault) {
        let outer = self.clients[c].threads[t]
            .calling
            .replace((plan.lock, plan.attempt));
        self.run_acquire_calls(c, t, plan, fault, then);
        self.clients[c].threads[t].calling = outer;
    }

    fn run_acquire_calls(&mut self, c: usize, t: usize, mut plan: Plan, fault: Fault, then: Fault) {
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
            let label = format!(
                "c{c}:t{t} acquire lock={} attempt={}",
                plan.lock, plan.attempt
            );
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
                    if plan.unanswered {
                        // a copy of this try may still arrive and find the lock free: as the
                        // real client, leave with a mark so it does nothing
                        self.leave_quietly(c, t, plan, then);
                    }
                    *self.state(c, t) = State::Idle;
                    return;
                }
                Acquire::Queued {
                    server_ms,
                    last_token,
                    ..
                } => {
                    if !plan.wait {
                        self.violate(Check::BadReply, "acquire in try mode queued".into());
                    }
                    self.note_queued(Prim::Lock, c, t, plan.lock, plan.attempt);
                    // the client's witness: kept across re-runs of the attempt, the newest wins
                    let mut witness = match self.state(c, t) {
                        State::Waiting(w) if w.attempt == plan.attempt => w.witness,
                        _ => Witness::none(LocalMs(s.sent_real)),
                    };
                    witness.observe(LocalMs(s.sent_real), last_token);
                    *self.state(c, t) = State::Waiting(Wait {
                        lock: plan.lock,
                        attempt: plan.attempt,
                        lease_ms: plan.lease_ms,
                        deadline: plan.deadline,
                        sent: s.sent,
                        server_ms,
                        witness,
                        grant_forward: None,
                        place: true,
                        refreshed: s.sent_real,
                        forward_steps: 0,
                        forward_ms: 0.0,
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
        if matches!(fault, Fault::Dropped | Fault::Late) {
            let unsure = self.unsure();
            self.clients[c].threads[t]
                .unsure_end
                .insert((plan.lock, plan.attempt), unsure);
        }
        if s.reply.is_ok() {
            // 11. a leave that answered has ended its attempt in Redis: no hold (a grant that
            //     reached it is passed on) and no place of that attempt is left
            let cur = self.snapshot(false).locks[plan.lock].clone();
            let holds = cur.owner == owner && cur.attempt == plan.attempt;
            let placed = cur.waiters.get(&owner) == Some(&plan.attempt);
            if holds || placed {
                self.violate(
                    Check::ReleaseIneffective,
                    format!(
                        "c{c}:t{t}'s leave of attempt {} answered {}, but Redis still has it {} \
                         (lock {}: owner {:?} attempt {}, waiters {:?})",
                        plan.attempt,
                        describe(&s.reply),
                        if holds { "holding" } else { "queued" },
                        plan.lock,
                        cur.owner,
                        cur.attempt,
                        cur.waiters
                    ),
                );
            }
        }
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
    /// message to the thread of the client that waits with its attempt (`src/background/waker.rs`). With
    /// `Fault::Late` the popped message is held up on its way to the client (a slow link, a
    /// stalled process, the leader's wait for replica acks) and handed over by a later step.
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
            if let Ok(Some(m)) = &r {
                self.clients[c].popped.insert(m.clone());
            }
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
            self.stats
                .add(&format!("fault: pop {}", fault_name(fault)), 1);
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
        if fault == Fault::Late {
            self.say(format!(" -> {msg:?} [held up on its way to the client]"));
            self.late_pops.push((c, lock, msg));
            return true;
        }
        self.say(format!(" -> {msg:?}"));
        self.hand_over(c, lock, &msg, then);
        true
    }

    /// The waker hands a popped message of `lock` to client `c`'s thread that waits with its
    /// attempt (dropped when none does), which reacts as the real `Attempt` does: a hand-off is
    /// held only when `judge_handoff` (the client's own decision) says its lease surely lasts,
    /// else confirmed with a re-run of acquire; a retry re-runs acquire.
    pub fn hand_over(&mut self, c: usize, lock: usize, msg: &str, then: Fault) {
        let wake = match raw::parse_wake(msg) {
            Ok(w) => w,
            Err(e) => {
                self.violate(Check::BadReply, format!("wake-up message {msg:?}: {e}"));
                return;
            }
        };
        let to = (0..self.clients[c].threads.len())
            .find(|&t2| self.clients[c].threads[t2].state_waits_with(lock, wake.attempt()));
        let Some(t) = to else {
            self.say(" (no thread waits with that attempt: dropped)");
            return;
        };
        if !self.active(c) {
            // a paused process reads it when it runs again: held up further
            self.late_pops.push((c, lock, msg.to_string()));
            self.say(" (its process is paused: held up further)");
            return;
        }
        self.say(format!(" to t{t}"));
        let now_real = self.clock.real();
        let forward_now = self.clock.forward();
        let w = self.waiting(c, t).expect("found waiting above");
        let plan = Plan::of(w);
        let (sent0, server0, lease, witness) = (w.sent, w.server_ms, w.lease_ms, w.witness);
        let grant_forward = w.grant_forward;
        match wake {
            Wake::Grant {
                token, server_ms, ..
            } => {
                let verdict = judge_handoff(
                    token,
                    witness,
                    Duration::from_millis(lease),
                    LocalMs(now_real),
                );
                match verdict {
                    Handoff::Hold { expires } => {
                        // on the fuzzer clock: forward steps after the grant age the hold (a
                        // documented limit), those before it do not
                        let forward = grant_forward.unwrap_or_else(|| {
                            self.stats
                                .add("hand-off whose grant the model did not see", 1);
                            forward_now
                        });
                        *self.state(c, t) = State::Holding(Hold {
                            lock: plan.lock,
                            attempt: plan.attempt,
                            token,
                            depth: 1,
                            lease_ms: lease,
                            expires: expires.0 + forward,
                            origin: format!(
                                "hand-off at server {server_ms}ms, queued at server \
                                 {server0}ms by a request sent at {sent0:.0}ms, witness sent \
                                 at real {:.0}ms (last token {}), handed over at real \
                                 {now_real:.0}ms",
                                witness.sent.0, witness.last_token
                            ),
                            late_acquire: plan.unanswered.then_some(plan.attempt),
                        });
                    }
                    Handoff::Confirm => {
                        self.say(" (confirmed with Redis before it is held)");
                        self.stats.add("hand-off confirmed with a re-run", 1);
                        self.run_acquire(c, t, plan, then, Fault::None);
                    }
                }
            }
            Wake::Retry { .. } => self.run_acquire(c, t, plan, then, Fault::None),
        }
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
            Ok(raw::Reenter::Lost) => self.drop_lost_guard(c, t, &h),
            Err(_) => {}
        }
        true
    }

    /// The hold `h` was found lost (a re-entry or renewal said so): the caller drops its guard,
    /// whose release asks for the attempt's left mark when a copy of its acquire may still
    /// arrive (and frees a hold such a copy took), as the real guard's drop does.
    fn drop_lost_guard(&mut self, c: usize, t: usize, h: &Hold) {
        if let Some(attempt) = h.late_acquire {
            let owner = self.owner(c, t);
            self.say("; its guard is dropped");
            let call = self.locks[h.lock].release_marking(&owner, h.token, 1, attempt);
            let label = format!("c{c}:t{t} release token={} depth=1", h.token);
            let s = self.exec(Some(Who::Thread(c, t)), label, call, Fault::None);
            self.say(format!(" -> {}", describe(&s.reply)));
        }
        *self.state(c, t) = State::Idle;
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
        let call = match h.late_acquire {
            Some(attempt) => self.locks[h.lock].release_marking(&owner, h.token, h.depth, attempt),
            None => self.locks[h.lock].release(&owner, h.token, h.depth),
        };
        let label = format!("c{c}:t{t} release token={} depth={}", h.token, h.depth);
        let s = self.exec(Some(Who::Thread(c, t)), label, call, fault);
        if h.late_acquire.is_some() && h.depth <= 1 && matches!(fault, Fault::Dropped | Fault::Late)
        {
            let unsure = self.unsure();
            self.clients[c].threads[t]
                .unsure_end
                .insert((h.lock, h.attempt), unsure);
        }
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
            Ok(Release::NotHeld { .. }) if h.depth > 1 => self.drop_lost_guard(c, t, &h),
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
            Ok(false) => self.drop_lost_guard(c, t, &h),
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
        let outer = self.clients[c].threads[t]
            .calling
            .replace((plan.lock, plan.attempt));
        let s = self.exec(Some(Who::Thread(c, t)), label, call, fault);
        self.clients[c].threads[t].calling = outer;
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
        let held_before = !self.checker.last[lock].owner.is_empty();
        let s = self.exec(None, format!("c{c} heartbeat"), call, fault);
        self.say(format!(" -> {}", describe(&s.reply)));
        if let Ok(hb) = &s.reply {
            // 5'. liveness with a bound of one heartbeat: a heartbeat grants a free lock to the
            // live head of its queue (purging dead heads first), so it never leaves the lock
            // free with anyone queued. A lock held before it (its hold may end just as the
            // heartbeat runs: seen held, 0 ms left) is checked at the next heartbeat instead
            if hb.pttl_ms == 0 && held_before {
                self.stats
                    .add("heartbeat as a hold ends: checked at the next", 1);
            }
            if hb.pttl_ms == 0 && !held_before {
                let cur = self.snapshot(false).locks[lock].clone();
                if !cur.queue.is_empty() {
                    self.violate(
                        Check::Liveness,
                        format!(
                            "lock {lock} left free by c{c}'s heartbeat ({hb:?}) with {:?} \
                             queued (waiters {:?}, owner {:?}): a heartbeat grants a stranded \
                             lock to its live head",
                            cur.queue, cur.waiters, cur.owner
                        ),
                    );
                }
            }
        }
        if let Ok(hb) = s.reply {
            let now = self.clock.real();
            // a heartbeat drops the waiters entry of each owner it names that has no place
            if let Some(excused) = &mut self.checker.queue_lost[lock] {
                for (_, owner, _) in &pairs {
                    excused.remove(owner);
                }
            }
            for (t, owner, attempt) in pairs {
                if hb.told_to_retry.contains(&owner) {
                    self.told_retry(Prim::Lock, lock, (c, t), attempt, now);
                }
                if let Some(w) = self.waiting(c, t).filter(|w| w.attempt == attempt) {
                    // the janitor renews every registered attempt's witness
                    w.witness.observe(LocalMs(s.sent_real), hb.last_token);
                    if let Some(h) = &mut w.handoff {
                        h.heartbeat_after = true;
                    }
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
        self.sem_keepalive();
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
