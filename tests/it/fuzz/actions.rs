//! The actions of threads and clients, as the real client performs them (the acquisition
//! engine `src/acquire/`, `LockGuard`, `Permit`, the janitor and the watchdog): acquire and its
//! re-runs, pop, re-enter, release, renew, leave, heartbeat. One implementation for every
//! primitive (`Prim`): what a lock and a semaphore do differently is in `prim.rs`. Errors get
//! the real client's reaction; replies are checked for shapes the scripts never give.

use std::time::Duration;

use fairlock::raw::{self, judge_handoff, Handoff, Wake, Witness};

use crate::fuzz::checks::Check;
use crate::fuzz::model::{Hold, LocalMs, Prim, Side, State, Wait};
use crate::fuzz::prim::{Acq, Gone, Rel};
use crate::fuzz::steps::{Fault, Who};
use crate::fuzz::world::{describe, fault_name, Plan, World};

impl World {
    /// The pttl a grant's estimate is built on: as the real client, the reply's, at most the
    /// lease ([`Config::cap_pttl_at_lease`](crate::fuzz::model::Config)).
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

    pub fn side(&mut self, p: Prim, c: usize, t: usize) -> &mut Side {
        self.clients[c].threads[t].side_mut(p)
    }

    pub fn state(&mut self, p: Prim, c: usize, t: usize) -> &mut State {
        &mut self.side(p, c, t).state
    }

    pub fn waiting(&mut self, p: Prim, c: usize, t: usize) -> Option<&mut Wait> {
        match self.state(p, c, t) {
            State::Waiting(w) => Some(w),
            _ => None,
        }
    }

    pub fn holding(&mut self, p: Prim, c: usize, t: usize) -> Option<&mut Hold> {
        match self.state(p, c, t) {
            State::Holding(h) => Some(h),
            _ => None,
        }
    }

    /// Thread `(c, t)` starts a new attempt on `i` for `permits` (a lock's: 1; a semaphore's
    /// at most its capacity), waiting or trying, with a deadline or none.
    #[allow(clippy::too_many_arguments)]
    pub fn acquire(
        &mut self,
        p: Prim,
        (c, t, i): (usize, usize, usize),
        permits: u64,
        wait: bool,
        lease_ms: u64,
        deadline_ms: Option<u64>,
        (fault, then): (Fault, Fault),
    ) -> bool {
        if !self.fits(c, t) || i >= self.count(p) {
            return false;
        }
        if !matches!(self.state(p, c, t), State::Idle) {
            return false;
        }
        let permits = match p {
            Prim::Lock => 1,
            Prim::Sem => permits.min(self.cfg.sems[i].cap).max(1),
        };
        let attempt = self.clients[c].next_attempt;
        self.clients[c].next_attempt += 1;
        self.side(p, c, t).permits = permits;
        let plan = Plan {
            lock: i,
            attempt,
            lease_ms,
            wait,
            deadline: deadline_ms.map(|d| self.clock.fz() + d as f64),
            unanswered: false,
        };
        let mode = if wait { "wait" } else { "try" };
        let pfx = p.prefix();
        let (noun, asked) = match p {
            Prim::Lock => ("lock", String::new()),
            Prim::Sem => ("sem", format!(" permits={permits}")),
        };
        self.say(format!(
            "c{c}:t{t} {pfx}acquire {mode} {noun}={i}{asked} attempt={attempt} lease={lease_ms}ms"
        ));
        if let Some(d) = deadline_ms {
            self.say(format!(" timeout={d}ms"));
        }
        self.run_acquire(p, c, t, plan, fault, then);
        true
    }

    /// A grant in a reply (`via`) sent at `sent` becomes a hold, as in the real client, unless
    /// its lease is already over by the estimate (send time + the pttl, at most the lease).
    /// Returns whether it did.
    #[allow(clippy::too_many_arguments)]
    fn hold_grant(
        &mut self,
        p: Prim,
        (c, t): (usize, usize),
        plan: &Plan,
        token: u64,
        pttl_ms: i64,
        sent: f64,
        via: &str,
    ) -> bool {
        let expires = sent + self.pttl(pttl_ms, plan.lease_ms) as f64;
        if expires <= self.clock.fz() {
            self.say(" (lease over by the estimate)");
            return false;
        }
        *self.state(p, c, t) = State::Holding(Hold {
            lock: plan.lock,
            attempt: plan.attempt,
            token,
            depth: 1,
            lease_ms: plan.lease_ms,
            expires,
            origin: format!("{}{via} pttl={pttl_ms}ms sent at {sent:.0}ms", p.prefix()),
            late_acquire: plan.unanswered.then_some(plan.attempt),
        });
        true
    }

    /// An acquire call and the real client's reaction; a grant whose lease is already over by
    /// the estimate is re-checked with the same attempt (three times at most, then it fails).
    pub fn run_acquire(
        &mut self,
        p: Prim,
        c: usize,
        t: usize,
        plan: Plan,
        fault: Fault,
        then: Fault,
    ) {
        let outer = self
            .side(p, c, t)
            .calling
            .replace((plan.lock, plan.attempt));
        self.run_acquire_calls(p, c, t, plan, fault, then);
        self.side(p, c, t).calling = outer;
    }

    fn run_acquire_calls(
        &mut self,
        p: Prim,
        c: usize,
        t: usize,
        mut plan: Plan,
        fault: Fault,
        then: Fault,
    ) {
        let mut fault = fault;
        let pfx = p.prefix();
        for round in 0..3 {
            if round > 0 {
                self.say(format!("; re-run {pfx}acquire attempt={}", plan.attempt));
            }
            let (s, text) = self.call_acquire(p, c, t, &plan, fault);
            plan.unanswered |= fault != Fault::None;
            fault = then;
            let reply = match s.reply {
                Err(_) => {
                    self.say(" -> error");
                    self.leave_quietly(p, c, t, plan, then);
                    return;
                }
                Ok(r) => r,
            };
            self.say(format!(" -> {text}"));
            match reply {
                Acq::Granted { token, pttl_ms } => {
                    let via = "acquire reply";
                    if self.hold_grant(p, (c, t), &plan, token, pttl_ms, s.sent, via) {
                        return;
                    }
                }
                Acq::Busy => {
                    if plan.wait {
                        self.violate(
                            Check::BadReply,
                            format!("{pfx}acquire in wait mode answered busy"),
                        );
                    }
                    if plan.unanswered {
                        // a copy of this try may still arrive and find it free: as the real
                        // client, leave with a mark so it does nothing
                        self.leave_quietly(p, c, t, plan, then);
                    }
                    *self.state(p, c, t) = State::Idle;
                    return;
                }
                Acq::Queued {
                    server_ms,
                    last_token,
                } => {
                    if !plan.wait {
                        self.violate(Check::BadReply, format!("{pfx}acquire in try mode queued"));
                    }
                    self.note_queued(p, c, t, plan.lock, plan.attempt);
                    // the client's witness: kept across re-runs of the attempt, the newest wins
                    let mut witness = match self.state(p, c, t) {
                        State::Waiting(w) if w.attempt == plan.attempt => w.witness,
                        _ => Witness::none(LocalMs(s.sent_real)),
                    };
                    witness.observe(LocalMs(s.sent_real), last_token);
                    *self.state(p, c, t) = State::Waiting(Wait {
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
                Acq::Stale => {
                    let owner = self.owner(c, t);
                    self.violate(
                        Check::BadReply,
                        format!(
                            "{pfx}acquire of {owner} attempt {} (its newest) answered stale",
                            plan.attempt
                        ),
                    );
                    *self.state(p, c, t) = State::Idle;
                    return;
                }
                Acq::Mismatch(what) => {
                    self.violate(
                        Check::BadReply,
                        format!("{pfx}acquire answered mismatch ({what})"),
                    );
                    *self.state(p, c, t) = State::Idle;
                    return;
                }
            }
        }
        self.say("; gives up after 3 late grants");
        self.leave_quietly(p, c, t, plan, Fault::None);
    }

    /// After an error: leave passing on what reached the attempt (best effort), go idle.
    pub fn leave_quietly(&mut self, p: Prim, c: usize, t: usize, plan: Plan, fault: Fault) {
        let owner = self.owner(c, t);
        self.say(format!(
            "; {}leave pass attempt={}",
            p.prefix(),
            plan.attempt
        ));
        let (s, text) = self.call_leave(p, c, t, &plan, false, fault);
        self.say(format!(" -> {text}"));
        if matches!(fault, Fault::Dropped | Fault::Late) {
            let unsure = self.unsure();
            self.side(p, c, t)
                .unsure_end
                .insert((plan.lock, plan.attempt), unsure);
        }
        if s.reply.is_ok() {
            // 11. a leave that answered has ended its attempt in Redis: no hold (a grant that
            //     reached it is passed on) and no place of that attempt is left
            let (holds, placed, detail) = self.attempt_in_redis(p, plan.lock, &owner, plan.attempt);
            if holds || placed {
                self.violate(
                    Check::ReleaseIneffective,
                    format!(
                        "c{c}:t{t}'s {}leave of attempt {} answered {text}, but Redis still has \
                         it {} ({detail})",
                        p.prefix(),
                        plan.attempt,
                        if holds { "holding" } else { "queued" },
                    ),
                );
            }
        }
        *self.state(p, c, t) = State::Idle;
    }

    /// The client's waker pops the wake list of what thread `t` waits on, and hands the
    /// message to the thread of the client that waits with its attempt
    /// (`src/background/waker.rs`). With `Fault::Late` the popped message is held up on its way
    /// to the client (a slow link, a stalled process, the leader's wait for replica acks) and
    /// handed over by a later step.
    pub fn pop(&mut self, p: Prim, c: usize, t: usize, fault: Fault, then: Fault) -> bool {
        if !self.fits(c, t) {
            return false;
        }
        let Some(w) = self.waiting(p, c, t) else {
            return false;
        };
        let i = w.lock;
        let owner = self.owner(c, t);
        self.say(format!("c{c} waker pops {} {i} (for t{t})", p.name()));
        let key = self.wake_key(p, i, &owner);
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
            let what = format!("fault: {}pop {}", p.prefix(), fault_name(fault));
            self.stats.add(&what, 1);
        }
        let msg = match popped {
            Err(_) => {
                // the waker's connection failed: every waiting thread of the client re-checks
                self.say(" -> error; its waiting threads re-check");
                for t2 in 0..self.clients[c].threads.len() {
                    if let Some(w2) = self.waiting(p, c, t2) {
                        let plan = Plan::of(w2);
                        self.say(format!("; c{c}:t{t2}"));
                        self.run_acquire(p, c, t2, plan, then, Fault::None);
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
            self.late_pops.push((c, Self::late_pop_index(p, i), msg));
            return true;
        }
        self.say(format!(" -> {msg:?}"));
        self.hand_over(p, c, i, &msg, then);
        true
    }

    /// The waker hands a popped message of `i` to client `c`'s thread that waits with its
    /// attempt (dropped when none does), which reacts as the real engine does: a hand-off is
    /// held only when `judge_handoff` (the client's own decision) says its lease surely lasts,
    /// else confirmed with a re-run of acquire; a retry re-runs acquire.
    pub fn hand_over(&mut self, p: Prim, c: usize, i: usize, msg: &str, then: Fault) {
        let pfx = p.prefix();
        let wake = match raw::parse_wake(msg) {
            Ok(w) => w,
            Err(e) => {
                self.violate(
                    Check::BadReply,
                    format!("{pfx}wake-up message {msg:?}: {e}"),
                );
                return;
            }
        };
        let to = (0..self.clients[c].threads.len()).find(|&t2| {
            self.clients[c].threads[t2]
                .side(p)
                .waits_with(i, wake.attempt())
        });
        let Some(t) = to else {
            self.say(" (no thread waits with that attempt: dropped)");
            return;
        };
        if !self.active(c) {
            // a paused process reads it when it runs again: held up further
            self.late_pops
                .push((c, Self::late_pop_index(p, i), msg.to_string()));
            self.say(" (its process is paused: held up further)");
            return;
        }
        self.say(format!(" to t{t}"));
        let now_real = self.clock.real();
        let forward_now = self.clock.forward();
        let w = self.waiting(p, c, t).expect("found waiting above");
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
                            self.stats.add(
                                &format!("{pfx}hand-off whose grant the model did not see"),
                                1,
                            );
                            forward_now
                        });
                        *self.state(p, c, t) = State::Holding(Hold {
                            lock: plan.lock,
                            attempt: plan.attempt,
                            token,
                            depth: 1,
                            lease_ms: lease,
                            expires: expires.0 + forward,
                            origin: format!(
                                "{pfx}hand-off at server {server_ms}ms, queued at server \
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
                        self.stats
                            .add(&format!("{pfx}hand-off confirmed with a re-run"), 1);
                        self.run_acquire(p, c, t, plan, then, Fault::None);
                    }
                }
            }
            Wake::Retry { .. } => self.run_acquire(p, c, t, plan, then, Fault::None),
        }
    }

    /// A hold that was force-released, evicted or lost with the data is gone for good (tokens
    /// are unique): its holder must find out, never renew or re-enter it.
    pub fn check_gone(&mut self, p: Prim, c: usize, t: usize, h: &Hold, what: &str) {
        if self.token_exempt(p, h.lock, h.token) {
            self.violate(
                Check::BadReply,
                format!(
                    "c{c}:t{t} {what} token {} of {} {}, a hold that was force-released or \
                     whose data was lost",
                    h.token,
                    p.name(),
                    h.lock
                ),
            );
        }
    }

    pub fn valid_hold(&mut self, p: Prim, c: usize, t: usize) -> Option<Hold> {
        let now = self.clock.fz();
        if !self.fits(c, t) {
            return None;
        }
        self.holding(p, c, t).filter(|h| h.expires > now).cloned()
    }

    /// A lock's re-entry (a semaphore has none).
    pub fn reenter(&mut self, c: usize, t: usize, fault: Fault) -> bool {
        let Some(h) = self.valid_hold(Prim::Lock, c, t) else {
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
                self.check_gone(Prim::Lock, c, t, &h, "re-entered");
                if n != h.depth + 1 {
                    self.violate(
                        Check::BadReply,
                        format!("reenter at depth {} answered count {n}", h.depth),
                    );
                }
                if let Some(h) = self.holding(Prim::Lock, c, t) {
                    h.depth += 1;
                }
            }
            Ok(raw::Reenter::Lost) => self.drop_lost_guard(Prim::Lock, c, t, &h),
            Err(_) => {}
        }
        true
    }

    /// The hold `h` was found lost (a re-entry or renewal said so): the caller drops its guard
    /// or permit, whose release asks for the attempt's left mark when a copy of its acquire may
    /// still arrive (and frees a hold such a copy took), as the real guard's drop does.
    fn drop_lost_guard(&mut self, p: Prim, c: usize, t: usize, h: &Hold) {
        if h.late_acquire.is_some() {
            self.say("; its guard is dropped");
            let last = Hold {
                depth: 1,
                ..h.clone()
            };
            let s = self.call_release(p, c, t, &last, true, Fault::None);
            self.say(format!(" -> {}", describe(&s.reply)));
        }
        *self.state(p, c, t) = State::Idle;
    }

    pub fn release(&mut self, p: Prim, c: usize, t: usize, fault: Fault) -> bool {
        if !self.fits(c, t) {
            return false;
        }
        let Some(h) = self.holding(p, c, t).cloned() else {
            return false;
        };
        // like the guard: the level is given up before the request goes out
        if h.depth <= 1 {
            *self.state(p, c, t) = State::Idle;
        } else if let Some(hh) = self.holding(p, c, t) {
            hh.depth -= 1;
        }
        let owner = self.owner(c, t);
        match p {
            Prim::Lock => self.say(format!(
                "c{c}:t{t} release token={} depth={}",
                h.token, h.depth
            )),
            Prim::Sem => self.say(format!("c{c}:t{t} sem release token={}", h.token)),
        }
        let mark = h.late_acquire.is_some();
        let s = self.call_release(p, c, t, &h, mark, fault);
        if mark && h.depth <= 1 && matches!(fault, Fault::Dropped | Fault::Late) {
            let unsure = self.unsure();
            self.side(p, c, t)
                .unsure_end
                .insert((h.lock, h.attempt), unsure);
        }
        self.say(format!(" -> {}", describe(&s.reply)));
        match s.reply {
            Ok(Rel::Released) if h.depth > 1 => self.violate(
                Check::BadReply,
                format!("release at depth {} freed the lock", h.depth),
            ),
            // the thread believes it holds nothing now: Redis must agree
            Ok(Rel::Released | Rel::StillHeld)
                if h.depth == 1 && self.still_held(p, &owner, &h) =>
            {
                self.violate(
                    Check::ReleaseIneffective,
                    format!(
                        "c{c}:t{t} released {} {} token {} (its last level) and was told so, \
                         but Redis still holds it for {owner}",
                        p.name(),
                        h.lock,
                        h.token
                    ),
                );
            }
            Ok(Rel::StillHeld) if h.depth > 1 => {
                self.check_gone(p, c, t, &h, "released a level of")
            }
            Ok(Rel::NotHeld) if h.depth > 1 => self.drop_lost_guard(p, c, t, &h),
            _ => {}
        }
        true
    }

    pub fn renew(&mut self, p: Prim, c: usize, t: usize, fault: Fault) -> bool {
        let Some(h) = self.valid_hold(p, c, t) else {
            return false;
        };
        self.say(format!("c{c}:t{t} {}renew token={}", p.prefix(), h.token));
        let s = self.call_renew(p, c, t, &h, fault);
        self.say(format!(" -> {}", describe(&s.reply)));
        match s.reply {
            Ok(true) => {
                self.check_gone(p, c, t, &h, "renewed");
                if let Some(hh) = self.holding(p, c, t) {
                    hh.expires = Self::renewed_until(p, hh, s.sent);
                    hh.origin = format!("{}renewal sent at {:.0}ms", p.prefix(), s.sent);
                }
            }
            Ok(false) => self.drop_lost_guard(p, c, t, &h),
            Err(_) => {}
        }
        true
    }

    pub fn leave_claim(&mut self, p: Prim, c: usize, t: usize, fault: Fault, then: Fault) -> bool {
        if !self.fits(c, t) {
            return false;
        }
        let now = self.clock.fz();
        let Some(w) = self.waiting(p, c, t) else {
            return false;
        };
        if w.deadline.is_none_or(|d| d > now) {
            return false;
        }
        let plan = Plan::of(w);
        self.say(format!(
            "c{c}:t{t} deadline: {}leave claim attempt={}",
            p.prefix(),
            plan.attempt
        ));
        let outer = self
            .side(p, c, t)
            .calling
            .replace((plan.lock, plan.attempt));
        let (s, text) = self.call_leave(p, c, t, &plan, true, fault);
        self.side(p, c, t).calling = outer;
        self.say(format!(" -> {text}"));
        match s.reply {
            Ok(Gone::Granted { token, pttl_ms }) => {
                let via = "leave claim reply";
                if !self.hold_grant(p, (c, t), &plan, token, pttl_ms, s.sent, via) {
                    self.run_acquire(p, c, t, plan, then, Fault::None);
                }
            }
            Ok(Gone::Left) => *self.state(p, c, t) = State::Idle,
            Ok(Gone::Passed) => {
                self.violate(
                    Check::BadReply,
                    format!("{}leave claim answered passed", p.prefix()),
                );
                *self.state(p, c, t) = State::Idle;
            }
            Err(_) => self.leave_quietly(p, c, t, plan, then),
        }
        true
    }

    pub fn leave_pass(&mut self, p: Prim, c: usize, t: usize, fault: Fault) -> bool {
        if !self.fits(c, t) {
            return false;
        }
        let Some(w) = self.waiting(p, c, t) else {
            return false;
        };
        let plan = Plan::of(w);
        self.say(format!("c{c}:t{t} gives up waiting"));
        self.leave_quietly(p, c, t, plan, fault);
        true
    }

    /// One heartbeat of client `c` for all its waiting attempts on `i`.
    pub fn heartbeat(&mut self, p: Prim, c: usize, i: usize, fault: Fault) -> bool {
        if c >= self.clients.len() || !self.active(c) || i >= self.count(p) {
            return false;
        }
        let pairs: Vec<(usize, String, u64)> = self.clients[c]
            .threads
            .iter()
            .enumerate()
            .filter_map(|(t, th)| match &th.side(p).state {
                State::Waiting(w) if w.lock == i => Some((t, th.owner.clone(), w.attempt)),
                _ => None,
            })
            .collect();
        if pairs.is_empty() {
            return false;
        }
        let attempts: Vec<String> = pairs.iter().map(|(t, _, a)| format!("t{t}={a}")).collect();
        let (pfx, noun) = (p.prefix(), p.name());
        self.say(format!(
            "c{c} {pfx}heartbeat {noun}={i} {}",
            attempts.join(",")
        ));
        let (s, text) = self.call_heartbeat(p, c, i, &pairs, fault);
        self.say(format!(" -> {text}"));
        let Ok(hb) = s.reply else {
            return true;
        };
        // 10. liveness with a bound of one heartbeat: a heartbeat grants the live heads that
        // fit (purging dead heads first), so it never leaves nothing held with anyone queued
        if hb.left_free {
            let (queue, detail) = self.queue_now(p, i);
            if !queue.is_empty() {
                self.violate(
                    Check::Liveness,
                    format!(
                        "{noun} {i} left with nothing held by c{c}'s heartbeat ({text}) with \
                         {queue:?} queued ({detail}): a heartbeat grants the heads that fit"
                    ),
                );
            }
        }
        let now = self.clock.real();
        // a heartbeat drops the waiters entry of each owner it names that has no place
        if let Some(excused) = self.queue_lost(p, i) {
            for (_, owner, _) in &pairs {
                excused.remove(owner);
            }
        }
        for (t, owner, attempt) in pairs {
            let told = hb.told_to_retry.contains(&owner);
            if told {
                self.told_retry(p, i, (c, t), attempt, now);
            }
            if let Some(w) = self.waiting(p, c, t).filter(|w| w.attempt == attempt) {
                // the janitor renews every registered attempt's witness
                w.witness.observe(LocalMs(s.sent_real), hb.last_token);
                if let Some(h) = &mut w.handoff {
                    h.heartbeat_after = true;
                }
                if told {
                    w.place = false;
                } else {
                    w.refreshed_at(s.sent_real);
                }
            }
        }
        true
    }

    /// Every active client heartbeats its waiters and renews its holds (janitor and watchdog),
    /// on its locks, then on its semaphores.
    pub fn keepalive(&mut self) {
        for p in Prim::ALL {
            for c in 0..self.clients.len() {
                if !self.active(c) {
                    continue;
                }
                for i in 0..self.count(p) {
                    let before = self.line.len();
                    self.say("; ");
                    if !self.heartbeat(p, c, i, Fault::None) {
                        self.line.truncate(before);
                    }
                }
                for t in 0..self.clients[c].threads.len() {
                    let before = self.line.len();
                    self.say("; ");
                    if !self.renew(p, c, t, Fault::None) {
                        self.line.truncate(before);
                    }
                }
            }
        }
    }
}
