//! The semaphores of a run (every odd seed: one or two, each a counting semaphore of capacity
//! 1-4 whose threads ask for 1-3 permits, or the read/write shape: capacity `RW_CAPACITY`, a
//! read takes 1, a write all). Their threads and clients act as the real client's
//! the acquisition engine, `Permit` and the janitor do (`src/acquire/engine.rs`, `src/semaphore/permit.rs`, `src/background/janitor.rs`),
//! through [`World::exec`], so every network fault applies; the process, clock and data faults
//! of `faults.rs` apply to them as to the locks, and the semaphore's keys are evicted one by
//! one as the lock's are. A thread has a semaphore side beside its lock side
//! (`Thread::sem`, a `Wait` or `Hold` whose `lock` is the semaphore's index).
//!
//! Checked after every request (`sem_after_call`: every new hold is a grant) and every step
//! (`sem_step_checks`); see the header of `main.rs`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::sync::LazyLock;
use std::time::Duration;

use fairlock::raw::{
    self, judge_handoff, Handoff, Mode, RawSemaphore, SemAcquire, SemCapacity, SemKind, SemLeave,
    SemRelease, Settings, Wake, Witness, RW_CAPACITY,
};
use redis::Value;

use crate::checks::{grant_prefix, Check};
use crate::fifo::Prim;
use crate::model::{Handoff as SeenHandoff, Hold, LocalMs, State, Wait};
use crate::rng::Rng;
use crate::steps::{fault, Fault, Who};
use crate::world::{describe, fault_name, Plan, World};

/// `World::late_pops` entries of a semaphore carry its index plus this (the lock's: below).
pub const SEM_POP: usize = 1 << 20;

/// A key of a semaphore an eviction deletes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SemKey {
    Hash,
    Fence,
    Queue,
    Waiters,
    Leases,
    Handoffs,
    Left,
    Wake(usize, usize),
}

#[derive(Clone, Copy, Debug)]
pub enum SemStep {
    Acquire {
        c: usize,
        t: usize,
        sem: usize,
        permits: u64,
        wait: bool,
        lease_ms: u64,
        deadline_ms: Option<u64>,
        fault: Fault,
        then: Fault,
    },
    Pop {
        c: usize,
        t: usize,
        fault: Fault,
        then: Fault,
    },
    Release {
        c: usize,
        t: usize,
        fault: Fault,
    },
    Renew {
        c: usize,
        t: usize,
        fault: Fault,
    },
    LeaveClaim {
        c: usize,
        t: usize,
        fault: Fault,
        then: Fault,
    },
    LeavePass {
        c: usize,
        t: usize,
        fault: Fault,
    },
    Heartbeat {
        c: usize,
        sem: usize,
        fault: Fault,
    },
    ForceRelease {
        sem: usize,
        fault: Fault,
    },
    /// The operator stores the capacity every handle of the run has again (`sem_capacity`):
    /// a change that changes nothing but the durable `~set`, under the network's faults; it
    /// grants the heads that fit, as a raise would.
    SetCapacity {
        sem: usize,
        fault: Fault,
    },
    Evict {
        sem: usize,
        key: SemKey,
    },
}

impl SemStep {
    pub fn kind(&self) -> &'static str {
        match self {
            SemStep::Acquire { .. } => "sem acquire",
            SemStep::Pop { .. } => "sem pop",
            SemStep::Release { .. } => "sem release",
            SemStep::Renew { .. } => "sem renew",
            SemStep::LeaveClaim { .. } => "sem leave claim",
            SemStep::LeavePass { .. } => "sem leave pass",
            SemStep::Heartbeat { .. } => "sem heartbeat",
            SemStep::ForceRelease { .. } => "sem force-release",
            SemStep::SetCapacity { .. } => "sem set capacity",
            SemStep::Evict { .. } => "sem eviction",
        }
    }
}

fn then_text(then: Fault) -> String {
    if then == Fault::None {
        String::new()
    } else {
        format!(" (follow-up{then})")
    }
}

impl fmt::Display for SemStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            SemStep::Acquire {
                c,
                t,
                sem,
                permits,
                wait,
                lease_ms,
                deadline_ms,
                fault,
                then,
            } => {
                let mode = if wait { "wait" } else { "try" };
                write!(
                    f,
                    "c{c}:t{t} sem acquire {mode} sem={sem} permits={permits} lease={lease_ms}ms"
                )?;
                if let Some(d) = deadline_ms {
                    write!(f, " timeout={d}ms")?;
                }
                write!(f, "{fault}{}", then_text(then))
            }
            SemStep::Pop { c, t, fault, then } => {
                write!(f, "c{c}:t{t} sem pop{fault}{}", then_text(then))
            }
            SemStep::Release { c, t, fault } => write!(f, "c{c}:t{t} sem release{fault}"),
            SemStep::Renew { c, t, fault } => write!(f, "c{c}:t{t} sem renew{fault}"),
            SemStep::LeaveClaim { c, t, fault, then } => {
                write!(f, "c{c}:t{t} sem leave claim{fault}{}", then_text(then))
            }
            SemStep::LeavePass { c, t, fault } => write!(f, "c{c}:t{t} sem leave pass{fault}"),
            SemStep::Heartbeat { c, sem, fault } => {
                write!(f, "c{c} sem heartbeat sem={sem}{fault}")
            }
            SemStep::ForceRelease { sem, fault } => {
                write!(f, "operator force-release sem={sem}{fault}")
            }
            SemStep::SetCapacity { sem, fault } => {
                write!(f, "operator set capacity sem={sem}{fault}")
            }
            SemStep::Evict { sem, key } => write!(f, "evict sem={sem} {key:?}"),
        }
    }
}

/// Build the run's semaphores.
pub fn make_sems(cfg: &crate::model::Config, settings: Settings) -> Vec<RawSemaphore> {
    cfg.sems
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let kind = if s.rw {
                SemKind::ReadWrite
            } else {
                SemKind::Semaphore
            };
            RawSemaphore::new("fz", &format!("S{i}"), kind, s.cap, settings).expect("sem name")
        })
        .collect()
}

/// The permits an acquire of semaphore `sem` asks for.
fn draw_permits(w: &World, sem: usize, rng: &mut Rng) -> u64 {
    let shape = w.cfg.sems[sem];
    if shape.rw {
        if rng.chance(0.3) {
            RW_CAPACITY
        } else {
            1
        }
    } else {
        rng.range(1, 3.min(shape.cap))
    }
}

/// The generator's semaphore steps: their weight in the step mix, by state (0 when the run
/// has no semaphore, which leaves an even seed's choices as they were).
pub struct SemChoices {
    idle: Vec<(usize, usize)>,
    waiting: Vec<(usize, usize)>,
    claimable: Vec<(usize, usize)>,
    holding: Vec<(usize, usize)>,
    valid: Vec<(usize, usize)>,
    heartbeaters: Vec<(usize, usize)>,
}

impl SemChoices {
    pub fn of(w: &World) -> SemChoices {
        let now = w.clock.fz();
        let mut s = SemChoices {
            idle: vec![],
            waiting: vec![],
            claimable: vec![],
            holding: vec![],
            valid: vec![],
            heartbeaters: vec![],
        };
        if w.sems.is_empty() {
            return s;
        }
        for (c, client) in w.clients.iter().enumerate() {
            if !w.active(c) {
                continue;
            }
            for (t, th) in client.threads.iter().enumerate() {
                match &th.sem {
                    State::Idle => s.idle.push((c, t)),
                    State::Waiting(wt) => {
                        s.waiting.push((c, t));
                        s.heartbeaters.push((c, wt.lock));
                        if wt.deadline.is_some_and(|d| d <= now) {
                            s.claimable.push((c, t));
                        }
                    }
                    State::Holding(h) => {
                        s.holding.push((c, t));
                        if h.expires > now {
                            s.valid.push((c, t));
                        }
                    }
                }
            }
        }
        s
    }

    /// Total weight of the semaphore's steps.
    pub fn weight(&self, w: &World) -> f64 {
        if w.sems.is_empty() {
            return 0.0;
        }
        let on = |v: bool, weight: f64| if v { weight } else { 0.0 };
        on(!self.idle.is_empty(), 12.0)
            + on(!self.waiting.is_empty(), 16.0)
            + on(!self.claimable.is_empty(), 6.0)
            + on(!self.waiting.is_empty(), 0.7)
            + on(!self.holding.is_empty(), 12.0)
            + on(!self.valid.is_empty(), 5.0)
            + on(!self.heartbeaters.is_empty(), 4.0)
            + 1.0
            + 1.0
    }

    pub fn choose(&self, w: &World, rng: &mut Rng) -> SemStep {
        #[derive(Clone, Copy)]
        enum K {
            Acquire,
            Pop,
            Claim,
            Pass,
            Release,
            Renew,
            Heartbeat,
            Force,
            SetCapacity,
            Evict,
        }
        let on = |v: bool, weight: f64| if v { weight } else { 0.0 };
        let k = rng.weighted(&[
            (on(!self.idle.is_empty(), 12.0), K::Acquire),
            (on(!self.waiting.is_empty(), 16.0), K::Pop),
            (on(!self.claimable.is_empty(), 6.0), K::Claim),
            (on(!self.waiting.is_empty(), 0.7), K::Pass),
            (on(!self.holding.is_empty(), 12.0), K::Release),
            (on(!self.valid.is_empty(), 5.0), K::Renew),
            (on(!self.heartbeaters.is_empty(), 4.0), K::Heartbeat),
            (1.0, K::Force),
            (0.5, K::SetCapacity),
            (1.0, K::Evict),
        ]);
        let cfg = &w.cfg;
        let n = w.sems.len() as u64;
        match k {
            K::Acquire => {
                let (c, t) = rng.pick(&self.idle);
                let sem = rng.below(n) as usize;
                let wait = rng.chance(0.75);
                SemStep::Acquire {
                    c,
                    t,
                    sem,
                    permits: draw_permits(w, sem, rng),
                    wait,
                    lease_ms: rng.range(cfg.lease_ms.0, cfg.lease_ms.1),
                    deadline_ms: (wait && rng.chance(0.4)).then(|| rng.range(200, 1500)),
                    fault: fault(rng),
                    then: fault(rng),
                }
            }
            K::Pop => {
                let (c, t) = rng.pick(&self.waiting);
                SemStep::Pop {
                    c,
                    t,
                    fault: rng.weighted(&[
                        (88.0, Fault::None),
                        (5.0, Fault::Lost),
                        (3.0, Fault::Dropped),
                        (4.0, Fault::Late),
                    ]),
                    then: fault(rng),
                }
            }
            K::Claim => {
                let (c, t) = rng.pick(&self.claimable);
                SemStep::LeaveClaim {
                    c,
                    t,
                    fault: fault(rng),
                    then: fault(rng),
                }
            }
            K::Pass => {
                let (c, t) = rng.pick(&self.waiting);
                SemStep::LeavePass {
                    c,
                    t,
                    fault: fault(rng),
                }
            }
            K::Release => {
                let (c, t) = rng.pick(&self.holding);
                SemStep::Release {
                    c,
                    t,
                    fault: fault(rng),
                }
            }
            K::Renew => {
                let (c, t) = rng.pick(&self.valid);
                SemStep::Renew {
                    c,
                    t,
                    fault: fault(rng),
                }
            }
            K::Heartbeat => {
                let (c, sem) = rng.pick(&self.heartbeaters);
                SemStep::Heartbeat {
                    c,
                    sem,
                    fault: fault(rng),
                }
            }
            K::Force => SemStep::ForceRelease {
                sem: rng.below(n) as usize,
                fault: rng.weighted(&[
                    (60.0, Fault::None),
                    (20.0, Fault::Retried),
                    (20.0, Fault::Late),
                ]),
            },
            K::SetCapacity => SemStep::SetCapacity {
                sem: rng.below(n) as usize,
                fault: rng.weighted(&[
                    (50.0, Fault::None),
                    (20.0, Fault::Lost),
                    (15.0, Fault::Retried),
                    (15.0, Fault::Late),
                ]),
            },
            K::Evict => {
                let c = rng.below(cfg.clients as u64) as usize;
                let t = rng.below(cfg.threads as u64) as usize;
                SemStep::Evict {
                    sem: rng.below(n) as usize,
                    key: rng.weighted(&[
                        (20.0, SemKey::Hash),
                        (10.0, SemKey::Fence),
                        (10.0, SemKey::Queue),
                        (10.0, SemKey::Waiters),
                        (15.0, SemKey::Leases),
                        (10.0, SemKey::Handoffs),
                        (5.0, SemKey::Left),
                        (20.0, SemKey::Wake(c, t)),
                    ]),
                }
            }
        }
    }
}

/// One semaphore as Redis had it at a snapshot.
#[derive(Clone, Default, Debug)]
pub struct SemSnap {
    pub cap: Option<u64>,
    pub used: u64,
    /// hold id (`owner#attempt`) -> (token, permits).
    pub holds: BTreeMap<String, (u64, u64)>,
    /// hold id -> lease end (server ms).
    pub leases: HashMap<String, i64>,
    pub queue: Vec<(String, f64)>,
    pub waiters: HashMap<String, u64>,
    pub fence: u64,
    pub server_ms: i64,
}

impl SemSnap {
    /// The permits of holds whose lease has not run out on the server's clock (a hold without
    /// a lease entry counts: nothing expires it).
    pub fn live_permits(&self) -> u64 {
        self.holds
            .iter()
            .filter(|(id, _)| self.leases.get(*id).is_none_or(|&e| e > self.server_ms))
            .map(|(_, (_, p))| p)
            .sum()
    }
}

/// What the semaphore checks remember between snapshots.
#[derive(Default)]
pub struct SemChecker {
    pub last: Vec<SemSnap>,
    pub max_token: Vec<u64>,
    pub exempt: Vec<HashSet<u64>>,
    /// Tokens an operator released by force: their hand-offs may vanish.
    pub forced: Vec<HashSet<u64>>,
    pub fence_lost: Vec<bool>,
    /// As the lock's (`Checker::queue_lost`): the owners whose waiters entries may outlive
    /// their places after a queue eviction, each until a heartbeat naming it is answered.
    pub queue_lost: Vec<Option<HashSet<String>>>,
    /// 4'''. The order the `Queued` replies were seen in (`fuzz/fifo.rs`).
    pub reply_order: crate::fifo::ReplyOrder,
    /// The operator's `set_capacity` may have reached Redis: the hash then lives at least
    /// the fence's TTL from it (`~set`, sem.lua), used or not.
    pub capacity_set: Vec<bool>,
}

impl SemChecker {
    pub fn new(n: usize) -> SemChecker {
        SemChecker {
            last: vec![SemSnap::default(); n],
            max_token: vec![0; n],
            exempt: vec![HashSet::new(); n],
            forced: vec![HashSet::new(); n],
            fence_lost: vec![false; n],
            queue_lost: vec![None; n],
            reply_order: crate::fifo::ReplyOrder::new(n),
            capacity_set: vec![false; n],
        }
    }
}

/// KEYS: hash, queue, waiters, fence, leases per semaphore. Returns per semaphore
/// {hash fields and values, queue with scores, waiters, fence, leases with scores}, then TIME.
static SEM_SNAPSHOT: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
local out = {}
for i = 0, #KEYS / 5 - 1 do
  out[#out + 1] = { redis.call('HGETALL', KEYS[5 * i + 1]),
                    redis.call('ZRANGE', KEYS[5 * i + 2], 0, -1, 'WITHSCORES'),
                    redis.call('HGETALL', KEYS[5 * i + 3]),
                    redis.call('GET', KEYS[5 * i + 4]) or '0',
                    redis.call('ZRANGE', KEYS[5 * i + 5], 0, -1, 'WITHSCORES') }
end
local t = redis.call('TIME')
out[#out + 1] = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return out
",
    )
});

fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Int(i) => i.to_string(),
        _ => String::new(),
    }
}

fn items(v: &Value) -> &[Value] {
    match v {
        Value::Array(a) => a,
        _ => &[],
    }
}

fn parse_sem(v: &Value, server_ms: i64) -> SemSnap {
    let f = items(v);
    let mut s = SemSnap {
        server_ms,
        ..SemSnap::default()
    };
    for p in f.first().map(items).unwrap_or(&[]).chunks(2) {
        let (k, val) = (text(&p[0]), text(&p[1]));
        match k.as_str() {
            "~cap" => s.cap = val.parse().ok(),
            "~used" => s.used = val.parse().unwrap_or(0),
            _ if k.starts_with('~') => {}
            _ => {
                let mut parts = val.split('|');
                let token = parts.next().and_then(|x| x.parse().ok()).unwrap_or(0);
                let permits = parts.next().and_then(|x| x.parse().ok()).unwrap_or(0);
                s.holds.insert(k, (token, permits));
            }
        }
    }
    s.queue = f
        .get(1)
        .map(items)
        .unwrap_or(&[])
        .chunks(2)
        .map(|p| (text(&p[0]), text(&p[1]).parse().unwrap_or(0.0)))
        .collect();
    s.waiters = f
        .get(2)
        .map(items)
        .unwrap_or(&[])
        .chunks(2)
        .filter(|p| !text(&p[0]).starts_with('~'))
        .map(|p| {
            let attempt = text(&p[1])
                .split('|')
                .next()
                .and_then(|a| a.parse().ok())
                .unwrap_or(0);
            (text(&p[0]), attempt)
        })
        .collect();
    s.fence = f.get(3).map(text).and_then(|x| x.parse().ok()).unwrap_or(0);
    s.leases = f
        .get(4)
        .map(items)
        .unwrap_or(&[])
        .chunks(2)
        .map(|p| {
            (
                text(&p[0]),
                text(&p[1]).parse::<f64>().unwrap_or(0.0) as i64,
            )
        })
        .collect();
    s
}

fn hold_id(owner: &str, attempt: u64) -> String {
    format!("{owner}#{attempt}")
}

fn split_id(id: &str) -> (&str, u64) {
    match id.rsplit_once('#') {
        Some((o, a)) => (o, a.parse().unwrap_or(0)),
        None => (id, 0),
    }
}

/// `(sem, attempt)` of a semaphore acquire request's label ("c0:t1 sem acquire sem=0 attempt=7").
pub fn sem_acquire_of(label: &str) -> Option<(usize, u64)> {
    let rest = label.split(" sem acquire sem=").nth(1)?;
    let (sem, attempt) = rest.split_once(" attempt=")?;
    Some((sem.parse().ok()?, attempt.parse().ok()?))
}

impl World {
    /// An ending call of `attempt` that asks for a left mark (`mark`) is about to go out.
    fn note_mark(&mut self, c: usize, t: usize, sem: usize, attempt: u64, mark: bool) {
        if mark {
            self.clients[c].threads[t].sem_marked.insert((sem, attempt));
        }
    }

    pub fn sem_state(&mut self, c: usize, t: usize) -> &mut State {
        &mut self.clients[c].threads[t].sem
    }

    fn sem_waiting(&mut self, c: usize, t: usize) -> Option<&mut Wait> {
        match self.sem_state(c, t) {
            State::Waiting(w) => Some(w),
            _ => None,
        }
    }

    fn sem_holding(&mut self, c: usize, t: usize) -> Option<&mut Hold> {
        match self.sem_state(c, t) {
            State::Holding(h) => Some(h),
            _ => None,
        }
    }

    pub fn apply_sem(&mut self, step: &SemStep) -> bool {
        match *step {
            SemStep::Acquire {
                c,
                t,
                sem,
                permits,
                wait,
                lease_ms,
                deadline_ms,
                fault,
                then,
            } => self.sem_acquire(c, t, sem, permits, wait, lease_ms, deadline_ms, fault, then),
            SemStep::Pop { c, t, fault, then } => self.sem_pop(c, t, fault, then),
            SemStep::Release { c, t, fault } => self.sem_release(c, t, fault),
            SemStep::Renew { c, t, fault } => self.sem_renew(c, t, fault),
            SemStep::LeaveClaim { c, t, fault, then } => self.sem_leave_claim(c, t, fault, then),
            SemStep::LeavePass { c, t, fault } => self.sem_leave_pass(c, t, fault),
            SemStep::Heartbeat { c, sem, fault } => self.sem_heartbeat(c, sem, fault),
            SemStep::ForceRelease { sem, fault } => self.sem_force_release(sem, fault),
            SemStep::SetCapacity { sem, fault } => self.sem_set_capacity(sem, fault),
            SemStep::Evict { sem, key } => self.sem_evict(sem, key),
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub fn sem_acquire(
        &mut self,
        c: usize,
        t: usize,
        sem: usize,
        permits: u64,
        wait: bool,
        lease_ms: u64,
        deadline_ms: Option<u64>,
        fault: Fault,
        then: Fault,
    ) -> bool {
        if !self.fits(c, t) || sem >= self.sems.len() {
            return false;
        }
        if !matches!(self.sem_state(c, t), State::Idle) {
            return false;
        }
        let permits = permits.min(self.cfg.sems[sem].cap).max(1);
        let attempt = self.clients[c].next_attempt;
        self.clients[c].next_attempt += 1;
        self.clients[c].threads[t].sem_permits = permits;
        let plan = Plan {
            lock: sem,
            attempt,
            lease_ms,
            wait,
            deadline: deadline_ms.map(|d| self.clock.fz() + d as f64),
            unanswered: false,
        };
        let mode = if wait { "wait" } else { "try" };
        self.say(format!(
            "c{c}:t{t} sem acquire {mode} sem={sem} permits={permits} attempt={attempt} \
             lease={lease_ms}ms"
        ));
        if let Some(d) = deadline_ms {
            self.say(format!(" timeout={d}ms"));
        }
        self.run_sem_acquire(c, t, plan, fault, then);
        true
    }

    fn run_sem_acquire(&mut self, c: usize, t: usize, plan: Plan, fault: Fault, then: Fault) {
        let outer = self.clients[c].threads[t]
            .sem_calling
            .replace((plan.lock, plan.attempt));
        self.run_sem_acquire_calls(c, t, plan, fault, then);
        self.clients[c].threads[t].sem_calling = outer;
    }

    /// A grant in a reply sent at `sent` becomes a hold unless its lease is over by the
    /// estimate (send time + the pttl, at most the lease, as the acquisition engine takes it).
    #[allow(clippy::too_many_arguments)]
    fn sem_hold_grant(
        &mut self,
        c: usize,
        t: usize,
        plan: &Plan,
        token: u64,
        pttl: Duration,
        sent: f64,
        via: &str,
    ) -> bool {
        let pttl_ms = (pttl.as_secs_f64() * 1000.0).min(plan.lease_ms as f64);
        let expires = sent + pttl_ms;
        if expires <= self.clock.fz() {
            self.say(" (lease over by the estimate)");
            return false;
        }
        *self.sem_state(c, t) = State::Holding(Hold {
            lock: plan.lock,
            attempt: plan.attempt,
            token,
            depth: 1,
            lease_ms: plan.lease_ms,
            expires,
            origin: format!("{via} pttl={pttl_ms:.0}ms sent at {sent:.0}ms"),
            late_acquire: plan.unanswered.then_some(plan.attempt),
        });
        true
    }

    fn run_sem_acquire_calls(
        &mut self,
        c: usize,
        t: usize,
        mut plan: Plan,
        fault: Fault,
        then: Fault,
    ) {
        let mut fault = fault;
        let permits = self.clients[c].threads[t].sem_permits;
        for round in 0..3 {
            if round > 0 {
                self.say(format!("; re-run sem acquire attempt={}", plan.attempt));
            }
            let owner = self.owner(c, t);
            let mode = if plan.wait { Mode::Wait } else { Mode::Try };
            let call = self.sems[plan.lock].acquire(
                &owner,
                plan.attempt,
                permits,
                Duration::from_millis(plan.lease_ms),
                mode,
                &format!("fuzz|{c}|{t}"),
            );
            let label = format!(
                "c{c}:t{t} sem acquire sem={} attempt={}",
                plan.lock, plan.attempt
            );
            let s = self.exec(Some(Who::Thread(c, t)), label, call, fault);
            plan.unanswered |= fault != Fault::None;
            fault = then;
            let reply = match s.reply {
                Err(_) => {
                    self.say(" -> error");
                    self.sem_leave_quietly(c, t, plan, then);
                    return;
                }
                Ok(r) => r,
            };
            self.say(format!(" -> {reply:?}"));
            match reply {
                SemAcquire::Granted { token, pttl, .. } => {
                    if self.sem_hold_grant(c, t, &plan, token, pttl, s.sent, "acquire reply") {
                        return;
                    }
                }
                SemAcquire::Busy { .. } => {
                    if plan.wait {
                        self.violate(
                            Check::BadReply,
                            "sem acquire in wait mode answered busy".into(),
                        );
                    }
                    if plan.unanswered {
                        self.sem_leave_quietly(c, t, plan, then);
                    }
                    *self.sem_state(c, t) = State::Idle;
                    return;
                }
                SemAcquire::Queued {
                    server_ms,
                    last_token,
                } => {
                    if !plan.wait {
                        self.violate(Check::BadReply, "sem acquire in try mode queued".into());
                    }
                    self.note_queued(Prim::Sem, c, t, plan.lock, plan.attempt);
                    let mut witness = match self.sem_state(c, t) {
                        State::Waiting(w) if w.attempt == plan.attempt => w.witness,
                        _ => Witness::none(LocalMs(s.sent_real)),
                    };
                    witness.observe(LocalMs(s.sent_real), last_token);
                    *self.sem_state(c, t) = State::Waiting(Wait {
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
                SemAcquire::Stale => {
                    let owner = self.owner(c, t);
                    self.violate(
                        Check::BadReply,
                        format!(
                            "sem acquire of {owner} attempt {} (its newest) answered stale",
                            plan.attempt
                        ),
                    );
                    *self.sem_state(c, t) = State::Idle;
                    return;
                }
                SemAcquire::Mismatch { kind, capacity } => {
                    self.violate(
                        Check::BadReply,
                        format!("sem acquire answered mismatch ({kind}, {capacity})"),
                    );
                    *self.sem_state(c, t) = State::Idle;
                    return;
                }
            }
        }
        self.say("; gives up after 3 late grants");
        self.sem_leave_quietly(c, t, plan, Fault::None);
    }

    /// After an error: leave passing on what reached the attempt (best effort), go idle.
    pub fn sem_leave_quietly(&mut self, c: usize, t: usize, plan: Plan, fault: Fault) {
        let owner = self.owner(c, t);
        self.say(format!("; sem leave pass attempt={}", plan.attempt));
        self.note_mark(c, t, plan.lock, plan.attempt, plan.unanswered);
        let call = self.sems[plan.lock].leave(&owner, plan.attempt, plan.unanswered, false);
        let label = format!("c{c}:t{t} sem leave pass attempt={}", plan.attempt);
        let s = self.exec(Some(Who::Thread(c, t)), label, call, fault);
        self.say(format!(" -> {}", describe(&s.reply)));
        if matches!(fault, Fault::Dropped | Fault::Late) {
            let unsure = self.unsure();
            self.clients[c].threads[t]
                .sem_unsure_end
                .insert((plan.lock, plan.attempt), unsure);
        }
        if s.reply.is_ok() {
            // 11. a leave that answered has ended its attempt in Redis (as the lock's)
            let cur = self.sem_snapshot().swap_remove(plan.lock);
            let holds = cur.holds.contains_key(&format!("{owner}#{}", plan.attempt));
            let placed = cur.waiters.get(&owner) == Some(&plan.attempt);
            if holds || placed {
                self.violate(
                    Check::ReleaseIneffective,
                    format!(
                        "c{c}:t{t}'s sem leave of attempt {} answered {}, but Redis still has it \
                         {} (sem {}: holds {:?}, waiters {:?})",
                        plan.attempt,
                        describe(&s.reply),
                        if holds { "holding" } else { "queued" },
                        plan.lock,
                        cur.holds,
                        cur.waiters
                    ),
                );
            }
        }
        *self.sem_state(c, t) = State::Idle;
    }

    /// The client's waker pops the wake list of the semaphore thread `t` waits on (as `pop`).
    pub fn sem_pop(&mut self, c: usize, t: usize, fault: Fault, then: Fault) -> bool {
        if !self.fits(c, t) {
            return false;
        }
        let Some(w) = self.sem_waiting(c, t) else {
            return false;
        };
        let sem = w.lock;
        let owner = self.owner(c, t);
        self.say(format!("c{c} waker pops sem {sem} (for t{t})"));
        let key = self.sems[sem].wake_key(&owner);
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
                .add(&format!("fault: sem pop {}", fault_name(fault)), 1);
        }
        let msg = match popped {
            Err(_) => {
                self.say(" -> error; its waiting threads re-check");
                for t2 in 0..self.clients[c].threads.len() {
                    if let Some(w2) = self.sem_waiting(c, t2) {
                        let plan = Plan::of(w2);
                        self.say(format!("; c{c}:t{t2}"));
                        self.run_sem_acquire(c, t2, plan, then, Fault::None);
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
            self.late_pops.push((c, SEM_POP + sem, msg));
            return true;
        }
        self.say(format!(" -> {msg:?}"));
        self.sem_hand_over(c, sem, &msg, then);
        true
    }

    /// As `hand_over`: the thread waiting with the message's attempt judges a grant with its
    /// witness (`judge_handoff`), or re-runs acquire (a retry, or a hand-off to confirm).
    pub fn sem_hand_over(&mut self, c: usize, sem: usize, msg: &str, then: Fault) {
        let wake = match raw::parse_wake(msg) {
            Ok(w) => w,
            Err(e) => {
                self.violate(Check::BadReply, format!("sem wake-up message {msg:?}: {e}"));
                return;
            }
        };
        let to = (0..self.clients[c].threads.len()).find(|&t2| {
            matches!(&self.clients[c].threads[t2].sem,
                State::Waiting(w) if w.lock == sem && w.attempt == wake.attempt())
        });
        let Some(t) = to else {
            self.say(" (no thread waits with that attempt: dropped)");
            return;
        };
        if !self.active(c) {
            self.late_pops.push((c, SEM_POP + sem, msg.to_string()));
            self.say(" (its process is paused: held up further)");
            return;
        }
        self.say(format!(" to t{t}"));
        let now_real = self.clock.real();
        let forward_now = self.clock.forward();
        let w = self.sem_waiting(c, t).expect("found waiting above");
        let plan = Plan::of(w);
        let (lease, witness, grant_forward) = (w.lease_ms, w.witness, w.grant_forward);
        match wake {
            Wake::Grant {
                token, server_ms, ..
            } => match judge_handoff(
                token,
                witness,
                Duration::from_millis(lease),
                LocalMs(now_real),
            ) {
                Handoff::Hold { expires } => {
                    let forward = grant_forward.unwrap_or_else(|| {
                        self.stats
                            .add("sem hand-off whose grant the model did not see", 1);
                        forward_now
                    });
                    *self.sem_state(c, t) = State::Holding(Hold {
                        lock: plan.lock,
                        attempt: plan.attempt,
                        token,
                        depth: 1,
                        lease_ms: lease,
                        expires: expires.0 + forward,
                        origin: format!(
                            "sem hand-off at server {server_ms}ms, witness sent at real {:.0}ms \
                             (last token {}), handed over at real {now_real:.0}ms",
                            witness.sent.0, witness.last_token
                        ),
                        late_acquire: plan.unanswered.then_some(plan.attempt),
                    });
                }
                Handoff::Confirm => {
                    self.say(" (confirmed with Redis before it is held)");
                    self.stats.add("sem hand-off confirmed with a re-run", 1);
                    self.run_sem_acquire(c, t, plan, then, Fault::None);
                }
            },
            Wake::Retry { .. } => self.run_sem_acquire(c, t, plan, then, Fault::None),
        }
    }

    fn sem_check_gone(&mut self, c: usize, t: usize, h: &Hold, what: &str) {
        if self.sem_checker.exempt[h.lock].contains(&h.token) {
            self.violate(
                Check::BadReply,
                format!(
                    "c{c}:t{t} {what} token {} of sem {}, a hold that was force-released or \
                     whose data was lost",
                    h.token, h.lock
                ),
            );
        }
    }

    pub fn sem_release(&mut self, c: usize, t: usize, fault: Fault) -> bool {
        if !self.fits(c, t) {
            return false;
        }
        let Some(h) = self.sem_holding(c, t).cloned() else {
            return false;
        };
        // like the permit's drop: given up before the request goes out
        *self.sem_state(c, t) = State::Idle;
        let owner = self.owner(c, t);
        self.say(format!("c{c}:t{t} sem release token={}", h.token));
        let mark = h.late_acquire.is_some();
        self.note_mark(c, t, h.lock, h.attempt, mark);
        let call = self.sems[h.lock].release(&owner, h.attempt, h.token, mark);
        let label = format!("c{c}:t{t} sem release token={}", h.token);
        let s = self.exec(Some(Who::Thread(c, t)), label, call, fault);
        if mark && matches!(fault, Fault::Dropped | Fault::Late) {
            let unsure = self.unsure();
            self.clients[c].threads[t]
                .sem_unsure_end
                .insert((h.lock, h.attempt), unsure);
        }
        self.say(format!(" -> {}", describe(&s.reply)));
        if let Ok(SemRelease::Released { .. }) = s.reply {
            let id = hold_id(&owner, h.attempt);
            if self.sem_checker.last[h.lock].holds.get(&id).map(|x| x.0) == Some(h.token) {
                self.violate(
                    Check::ReleaseIneffective,
                    format!(
                        "c{c}:t{t} released sem {} token {} and was told so, but Redis still \
                         has the hold {id}",
                        h.lock, h.token
                    ),
                );
            }
        }
        true
    }

    pub fn sem_renew(&mut self, c: usize, t: usize, fault: Fault) -> bool {
        if !self.fits(c, t) {
            return false;
        }
        let now = self.clock.fz();
        let Some(h) = self.sem_holding(c, t).filter(|h| h.expires > now).cloned() else {
            return false;
        };
        let owner = self.owner(c, t);
        self.say(format!("c{c}:t{t} sem renew token={}", h.token));
        let call = self.sems[h.lock].renew(
            &owner,
            h.attempt,
            h.token,
            Duration::from_millis(h.lease_ms),
        );
        let label = format!("c{c}:t{t} sem renew token={}", h.token);
        let s = self.exec(Some(Who::Thread(c, t)), label, call, fault);
        self.say(format!(" -> {}", describe(&s.reply)));
        match s.reply {
            Ok(true) => {
                self.sem_check_gone(c, t, &h, "renewed");
                if let Some(hh) = self.sem_holding(c, t) {
                    hh.expires = hh.expires.max(s.sent + h.lease_ms as f64);
                    hh.origin = format!("sem renewal sent at {:.0}ms", s.sent);
                }
            }
            Ok(false) => {
                // the permit is lost: its holder drops it, whose release marks the attempt
                // when a copy of its acquire may still arrive
                if h.late_acquire.is_some() {
                    self.say("; its permit is dropped");
                    self.note_mark(c, t, h.lock, h.attempt, true);
                    let call = self.sems[h.lock].release(&owner, h.attempt, h.token, true);
                    let label = format!("c{c}:t{t} sem release token={}", h.token);
                    let s = self.exec(Some(Who::Thread(c, t)), label, call, Fault::None);
                    self.say(format!(" -> {}", describe(&s.reply)));
                }
                *self.sem_state(c, t) = State::Idle;
            }
            Err(_) => {}
        }
        true
    }

    pub fn sem_leave_claim(&mut self, c: usize, t: usize, fault: Fault, then: Fault) -> bool {
        if !self.fits(c, t) {
            return false;
        }
        let now = self.clock.fz();
        let Some(w) = self.sem_waiting(c, t) else {
            return false;
        };
        if w.deadline.is_none_or(|d| d > now) {
            return false;
        }
        let plan = Plan::of(w);
        let owner = self.owner(c, t);
        self.say(format!(
            "c{c}:t{t} deadline: sem leave claim attempt={}",
            plan.attempt
        ));
        self.note_mark(c, t, plan.lock, plan.attempt, plan.unanswered);
        let call = self.sems[plan.lock].leave(&owner, plan.attempt, plan.unanswered, true);
        let label = format!("c{c}:t{t} sem leave claim attempt={}", plan.attempt);
        let outer = self.clients[c].threads[t]
            .sem_calling
            .replace((plan.lock, plan.attempt));
        let s = self.exec(Some(Who::Thread(c, t)), label, call, fault);
        self.clients[c].threads[t].sem_calling = outer;
        self.say(format!(" -> {}", describe(&s.reply)));
        match s.reply {
            Ok(SemLeave::Granted { token, pttl, .. }) => {
                if !self.sem_hold_grant(c, t, &plan, token, pttl, s.sent, "leave claim reply") {
                    self.run_sem_acquire(c, t, plan, then, Fault::None);
                }
            }
            Ok(SemLeave::Left) => *self.sem_state(c, t) = State::Idle,
            Ok(SemLeave::Passed { .. }) => {
                self.violate(Check::BadReply, "sem leave claim answered passed".into());
                *self.sem_state(c, t) = State::Idle;
            }
            Err(_) => self.sem_leave_quietly(c, t, plan, then),
        }
        true
    }

    pub fn sem_leave_pass(&mut self, c: usize, t: usize, fault: Fault) -> bool {
        if !self.fits(c, t) {
            return false;
        }
        let Some(w) = self.sem_waiting(c, t) else {
            return false;
        };
        let plan = Plan::of(w);
        self.say(format!("c{c}:t{t} gives up waiting for permits"));
        self.sem_leave_quietly(c, t, plan, fault);
        true
    }

    /// One heartbeat of client `c` for all its waiting attempts on semaphore `sem`.
    pub fn sem_heartbeat(&mut self, c: usize, sem: usize, fault: Fault) -> bool {
        if c >= self.clients.len() || !self.active(c) || sem >= self.sems.len() {
            return false;
        }
        let pairs: Vec<(usize, String, u64)> = self.clients[c]
            .threads
            .iter()
            .enumerate()
            .filter_map(|(t, th)| match &th.sem {
                State::Waiting(w) if w.lock == sem => Some((t, th.owner.clone(), w.attempt)),
                _ => None,
            })
            .collect();
        if pairs.is_empty() {
            return false;
        }
        let attempts: Vec<String> = pairs.iter().map(|(t, _, a)| format!("t{t}={a}")).collect();
        self.say(format!(
            "c{c} sem heartbeat sem={sem} {}",
            attempts.join(",")
        ));
        let call = self.sems[sem].heartbeat(pairs.iter().map(|(_, o, a)| (o.as_str(), *a)));
        let s = self.exec(None, format!("c{c} sem heartbeat"), call, fault);
        self.say(format!(" -> {}", describe(&s.reply)));
        if let Ok(hb) = &s.reply {
            // 5'. liveness with a bound of one heartbeat: with no permit held, every head fits,
            // and a heartbeat grants the live heads that fit (purging dead heads first). Not
            // while the capacity is unknown (the hash was evicted or lost: the next
            // acquisition stores it again), counted
            if hb.used == 0 && hb.capacity.is_none() {
                self.stats
                    .add("sem heartbeat with the capacity unknown (hash lost)", 1);
            }
            if hb.used == 0 && hb.capacity.is_some() {
                let queue = self.sem_snapshot()[sem].queue.clone();
                if !queue.is_empty() {
                    self.violate(
                        Check::Liveness,
                        format!(
                            "sem {sem} left with no permit held by c{c}'s heartbeat and \
                             {queue:?} queued (a heartbeat grants the heads that fit)"
                        ),
                    );
                }
            }
        }
        if let Ok(hb) = s.reply {
            let now = self.clock.real();
            if let Some(excused) = &mut self.sem_checker.queue_lost[sem] {
                for (_, owner, _) in &pairs {
                    excused.remove(owner);
                }
            }
            for (t, owner, attempt) in pairs {
                if hb.told_to_retry.contains(&owner) {
                    self.told_retry(Prim::Sem, sem, (c, t), attempt, now);
                }
                if let Some(w) = self.sem_waiting(c, t).filter(|w| w.attempt == attempt) {
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

    /// The janitor's heartbeats and the watchdog's renewals of the semaphore side.
    pub fn sem_keepalive(&mut self) {
        for c in 0..self.clients.len() {
            if !self.active(c) {
                continue;
            }
            for sem in 0..self.sems.len() {
                let before = self.line.len();
                self.say("; ");
                if !self.sem_heartbeat(c, sem, Fault::None) {
                    self.line.truncate(before);
                }
            }
            for t in 0..self.clients[c].threads.len() {
                let before = self.line.len();
                self.say("; ");
                if !self.sem_renew(c, t, Fault::None) {
                    self.line.truncate(before);
                }
            }
        }
    }

    /// The operator reads the holds and releases one by force (it loses the guarantee).
    /// The operator's `set_capacity` with the capacity the run's handles have (see
    /// `SemStep::SetCapacity`): stored, never a mismatch (the kind is the run's), and every
    /// check runs after it as after any call.
    pub fn sem_set_capacity(&mut self, sem: usize, fault: Fault) -> bool {
        if sem >= self.sems.len() {
            return false;
        }
        let cap = self.cfg.sems[sem].cap;
        let label = format!("operator sem set_capacity sem={sem} capacity={cap}");
        let call = self.sems[sem].set_capacity(cap);
        self.sem_checker.capacity_set[sem] = true;
        let s = self.exec(Some(Who::Operator), label, call, fault);
        self.say(format!(
            "operator set capacity sem={sem} to {cap} -> {}",
            describe(&s.reply)
        ));
        if let Ok(SemCapacity::Mismatch { kind, capacity }) = &s.reply {
            self.violate(
                Check::BadReply,
                format!(
                    "set_capacity of sem {sem} to {cap} answered mismatch ({kind}, {capacity})"
                ),
            );
        }
        true
    }

    pub fn sem_force_release(&mut self, sem: usize, fault: Fault) -> bool {
        if sem >= self.sems.len() {
            return false;
        }
        self.say(format!("operator force-release sem={sem}: status"));
        let call = self.sems[sem].status();
        let s = self.exec(
            Some(Who::Operator),
            "operator sem status".into(),
            call,
            Fault::None,
        );
        let Ok(st) = s.reply else {
            return true;
        };
        let Some(h) = st.holds.first() else {
            self.say(" -> no holds, nothing to do");
            return true;
        };
        let (owner, attempt) = split_id(&h.id);
        let (owner, attempt, token) = (owner.to_string(), attempt, h.token);
        self.sem_checker.forced[sem].insert(token);
        if self.force_exemption(sem, Some(sem), token, fault) {
            self.sem_checker.exempt[sem].insert(token);
        }
        self.say(format!(" -> hold {} token={token}; force_release", h.id));
        let label = format!("operator sem force_release {owner:?} token={token}");
        let call = self.sems[sem].force_release(&owner, attempt, token);
        let fault = match fault {
            Fault::Lost | Fault::Retried => Fault::Retried,
            Fault::Late | Fault::SlowFirst => Fault::Late,
            Fault::None | Fault::Dropped => Fault::None,
        };
        let mut s = self.exec(Some(Who::Operator), label.clone(), call, fault);
        if fault == Fault::Late {
            let call = self.sems[sem].force_release(&owner, attempt, token);
            s = self.exec(Some(Who::Operator), label, call, Fault::None);
        }
        self.say(format!(" -> {}", describe(&s.reply)));
        true
    }

    /// Holds of `sem` that a lost hash or data loss takes from under their holders: exempt.
    pub fn sem_exempt_current_holds(&mut self, sem: usize) {
        let mut tokens: Vec<u64> = self.sem_checker.last[sem]
            .holds
            .values()
            .map(|x| x.0)
            .collect();
        for cl in &self.clients {
            for th in &cl.threads {
                if let State::Holding(h) = &th.sem {
                    if h.lock == sem {
                        tokens.push(h.token);
                    }
                }
            }
        }
        self.sem_checker.exempt[sem].extend(tokens);
    }

    pub fn sem_places_lost(&mut self, sem: usize) {
        for cl in &mut self.clients {
            for th in &mut cl.threads {
                if let State::Waiting(w) = &mut th.sem {
                    if w.lock == sem {
                        w.place = false;
                    }
                }
            }
        }
    }

    pub fn sem_evict(&mut self, sem: usize, key: SemKey) -> bool {
        if sem >= self.sems.len() {
            return false;
        }
        let names = self.sems[sem].key_names().map(str::to_string);
        let victim = match key {
            SemKey::Hash => {
                self.sem_exempt_current_holds(sem);
                names[0].clone()
            }
            SemKey::Fence => {
                self.sem_checker.fence_lost[sem] = true;
                names[1].clone()
            }
            SemKey::Queue | SemKey::Waiters => {
                self.sem_places_lost(sem);
                if key == SemKey::Queue {
                    let owners = self.waiters_owners(&names[3]);
                    self.sem_checker.queue_lost[sem]
                        .get_or_insert_with(HashSet::new)
                        .extend(owners);
                    names[2].clone()
                } else {
                    names[3].clone()
                }
            }
            SemKey::Leases => names[4].clone(),
            SemKey::Handoffs => names[5].clone(),
            SemKey::Left => {
                // every attempt that ended with a mark may have its late copy act now
                let unsure = self.unsure();
                for cl in &mut self.clients {
                    for th in &mut cl.threads {
                        let marked: Vec<(usize, u64)> = th
                            .sem_marked
                            .iter()
                            .filter(|m| m.0 == sem)
                            .copied()
                            .collect();
                        th.sem_unsure_end
                            .extend(marked.into_iter().map(|m| (m, unsure)));
                    }
                }
                format!("{}:left", names[0])
            }
            SemKey::Wake(c, t) => {
                if c >= self.clients.len() || t >= self.clients[c].threads.len() {
                    return false;
                }
                let owner = self.owner(c, t);
                for th in &mut self.clients[c].threads {
                    if let State::Waiting(w) = &mut th.sem {
                        if let (true, Some(h)) = (w.lock == sem, &mut w.handoff) {
                            h.wake_lost = true;
                        }
                    }
                }
                self.sems[sem].wake_key(&owner)
            }
        };
        let n: i64 = redis::cmd("DEL")
            .arg(&victim)
            .query(&mut self.conns[0])
            .unwrap_or(0);
        self.after_call(None, self.clock.fz());
        self.say(format!(
            "evict {victim}{}",
            if n == 0 { " (absent)" } else { "" }
        ));
        self.stats.add("fault: sem eviction", 1);
        true
    }

    // ---- checks -----------------------------------------------------------------------------

    pub fn sem_snapshot(&mut self) -> Vec<SemSnap> {
        if self.sems.is_empty() {
            return vec![];
        }
        let mut inv = SEM_SNAPSHOT.prepare_invoke();
        for s in &self.sems {
            let k = s.key_names();
            inv.key(k[0]).key(k[2]).key(k[3]).key(k[1]).key(k[4]);
        }
        let v: Value = inv.invoke(&mut self.conns[0]).expect("sem snapshot");
        let all = items(&v);
        let n = self.sems.len();
        let server_ms = all
            .get(n)
            .map(text)
            .and_then(|x| x.parse().ok())
            .unwrap_or(0);
        all[..n].iter().map(|x| parse_sem(x, server_ms)).collect()
    }

    fn sem_thread_of(&self, owner: &str) -> Option<(usize, usize)> {
        for (c, cl) in self.clients.iter().enumerate() {
            for (t, th) in cl.threads.iter().enumerate() {
                if th.owner == owner {
                    return Some((c, t));
                }
            }
        }
        None
    }

    /// After a request reached Redis: every new hold is a grant; check its token, that no live
    /// waiter queued ahead of it was passed over, and that its attempt is under way.
    pub fn sem_after_call(&mut self, actor: Option<(usize, usize)>, sent: f64) {
        if self.sems.is_empty() {
            return;
        }
        let snaps = self.sem_snapshot();
        let real = self.clock.real();
        for (s, cur) in snaps.iter().enumerate() {
            let prev = self.sem_checker.last[s].clone();
            let mut new: Vec<(String, u64, u64)> = cur
                .holds
                .iter()
                .filter(|(id, (tok, _))| prev.holds.get(*id).map(|x| x.0) != Some(*tok))
                .map(|(id, (tok, p))| (id.clone(), *tok, *p))
                .collect();
            new.sort_by_key(|x| x.1);
            // 1'. Redis's own count agrees with its holds, and its live holds fit
            let sum: u64 = cur.holds.values().map(|x| x.1).sum();
            if cur.used != sum {
                self.violate(
                    Check::RedisDisagrees,
                    format!(
                        "sem {s}: ~used is {} but its holds carry {sum} permits: {:?}",
                        cur.used, cur.holds
                    ),
                );
            }
            let live = cur.live_permits();
            if let Some(cap) = cur.cap {
                if live > cap {
                    self.violate(
                        Check::MutualExclusion,
                        format!(
                            "sem {s}: Redis holds {live} live permits, capacity {cap}: {:?} \
                             (leases {:?}, server {}ms)",
                            cur.holds, cur.leases, cur.server_ms
                        ),
                    );
                }
            }
            for (id, token, _) in &new {
                self.stats.add("sem grants", 1);
                let (owner, attempt) = split_id(id);
                // 4'''. no live waiter overtaken, by the order the Queued replies were seen in
                let holds = |o: &str, a: u64| cur.holds.contains_key(&hold_id(o, a));
                let granted = crate::fifo::Granted {
                    prim: Prim::Sem,
                    index: s,
                    owner,
                    attempt,
                    token: *token,
                    holds: &holds,
                    queue_before: format!("{:?}", prev.queue),
                };
                self.fifo_by_replies(granted, actor, real);
                // 2. tokens strictly rise
                if *token <= self.sem_checker.max_token[s] {
                    let behind = self.server.offset_ms() < self.max_offset_ms;
                    if self.sem_checker.fence_lost[s] && behind {
                        self.stats.add(
                            "exempt: sem token after fence loss on a stepped-back clock",
                            1,
                        );
                    } else {
                        self.violate(
                            Check::TokenOrder,
                            format!(
                                "sem {s} granted token {token} to {id} but token {} was granted \
                                 before",
                                self.sem_checker.max_token[s]
                            ),
                        );
                    }
                    self.sem_checker.max_token[s] = *token;
                }
                self.sem_checker.max_token[s] = self.sem_checker.max_token[s].max(*token);
                if cur.fence >= self.sem_checker.max_token[s] {
                    self.sem_checker.fence_lost[s] = false;
                }
                // 4. no live waiter queued ahead of the grantee passed over (one granted in the
                //    same call is served, not passed over)
                let x_score = prev.queue.iter().find(|(o, _)| o == owner).map(|q| q.1);
                for (y, score) in &prev.queue {
                    if y == owner || x_score.is_some_and(|xs| *score >= xs) {
                        continue;
                    }
                    let Some(&ay) = prev.waiters.get(y) else {
                        continue;
                    };
                    if cur.holds.contains_key(&hold_id(y, ay)) {
                        continue;
                    }
                    let Some((c, t)) = self.sem_thread_of(y) else {
                        continue;
                    };
                    if Some((c, t)) == actor {
                        continue;
                    }
                    let State::Waiting(w) = &self.clients[c].threads[t].sem else {
                        continue;
                    };
                    if w.lock == s && w.attempt == ay && w.live(&self.cfg, real) && !w.granted_seen
                    {
                        self.violate(
                            Check::Overtaken,
                            format!(
                                "sem {s} granted (token {token}) to {id} while live waiter \
                                 c{c}:t{t} ({y} attempt {ay}) was queued ahead of it"
                            ),
                        );
                    }
                }
                // 6. no ghost hold
                if let Some((c, t)) = self.sem_thread_of(owner) {
                    let th = &self.clients[c].threads[t];
                    let under_way = th.sem_calling == Some((s, attempt))
                        || matches!(&th.sem, State::Waiting(w) if w.lock == s && w.attempt == attempt)
                        || matches!(&th.sem, State::Holding(h) if h.lock == s && h.attempt == attempt && h.late_acquire.is_some());
                    if !under_way {
                        if attempt <= th.marks_lost_upto {
                            self.stats.add(
                                "exempt: sem late acquire of an attempt whose mark was lost with \
                                 the data",
                                1,
                            );
                        } else if th.sem_unsure_end.get(&(s, attempt)).is_some_and(|u| {
                            !u.expired(real, self.back_steps_ms, self.cfg.waiter_timeout_ms)
                        }) {
                            self.stats.add(
                                "exempt: sem late acquire of an attempt whose mark was lost",
                                1,
                            );
                        } else {
                            self.violate(
                                Check::GhostHold,
                                format!(
                                    "sem {s} granted (token {token}) to c{c}:t{t} ({id}), an \
                                     attempt that has ended: nobody holds a permit of it"
                                ),
                            );
                        }
                    }
                } else {
                    self.crashed_client_granted(&format!("sem {s}"), owner, real);
                }
                let forward = self.clock.forward();
                if let Some((c, t)) = self.sem_thread_of(owner) {
                    let lease_end = |w: &Wait| sent + w.lease_ms as f64;
                    if let State::Waiting(w) = &mut self.clients[c].threads[t].sem {
                        if w.lock == s && w.attempt == attempt {
                            w.granted_seen = true;
                            w.grant_forward.get_or_insert(forward);
                            w.handoff = Some(SeenHandoff {
                                token: *token,
                                earliest_end: lease_end(w),
                                wake_lost: false,
                                heartbeat_after: false,
                            });
                        }
                    }
                }
            }
        }
        self.sem_checker.last = snaps;
    }

    /// After every step: the permits their holders count on fit the capacity and Redis has
    /// them; live waiters keep their places; hand-offs to live waiters stay.
    pub fn sem_step_checks(&mut self) {
        if self.sems.is_empty() {
            return;
        }
        let snaps = self.sem_snapshot();
        let (fz, real) = (self.clock.fz(), self.clock.real());
        let mut found = vec![];
        for (s, cur) in snaps.iter().enumerate() {
            let cap = self.cfg.sems[s].cap;
            // 8. waiters entries only for queued owners
            if cur.waiters.is_empty() {
                self.sem_checker.queue_lost[s] = None;
            } else {
                let excused = self.sem_checker.queue_lost[s].as_ref();
                let extra: Vec<&String> = cur
                    .waiters
                    .keys()
                    .filter(|o| !cur.queue.iter().any(|(q, _)| q == *o))
                    .filter(|o| !excused.is_some_and(|e| e.contains(*o)))
                    .collect();
                if !extra.is_empty() {
                    found.push((
                        Check::KeySize,
                        format!("sem {s}: waiters entries {extra:?} without a queue place"),
                    ));
                }
            }
            // 1. never more than capacity by the holders' own estimates, and Redis has them
            let mut holders = vec![];
            for (c, cl) in self.clients.iter().enumerate() {
                for (t, th) in cl.threads.iter().enumerate() {
                    if let State::Holding(h) = &th.sem {
                        if h.lock == s
                            && h.expires > fz
                            && !self.sem_checker.exempt[s].contains(&h.token)
                        {
                            holders.push((c, t, th.owner.clone(), th.sem_permits, h.clone()));
                        }
                    }
                }
            }
            let total: u64 = holders.iter().map(|x| x.3).sum();
            let list = || {
                holders
                    .iter()
                    .map(|(c, t, _, p, h)| {
                        format!(
                            "c{c}:t{t} (attempt {}) {p} permits token {} for {:.0}ms more \
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
            if total > cap {
                found.push((
                    Check::MutualExclusion,
                    format!("sem {s} (capacity {cap}) held by {}", list()),
                ));
            }
            for (c, t, owner, p, h) in &holders {
                let id = hold_id(owner, h.attempt);
                if cur.holds.get(&id) != Some(&(h.token, *p)) {
                    found.push((
                        Check::RedisDisagrees,
                        format!(
                            "c{c}:t{t} holds {p} permits of sem {s} (token {}) by its estimate \
                             ({}), but Redis has {:?} for {id}",
                            h.token,
                            h.origin,
                            cur.holds.get(&id)
                        ),
                    ));
                }
            }
        }
        // 4'. live waiters keep their places, and their hand-offs until their lease could end
        let mut unpopped = vec![];
        for (c, cl) in self.clients.iter_mut().enumerate() {
            let popped = &cl.popped;
            for (t, th) in cl.threads.iter_mut().enumerate() {
                let State::Waiting(w) = &mut th.sem else {
                    continue;
                };
                let cur = &snaps[w.lock];
                let id = hold_id(&th.owner, w.attempt);
                let granted = cur.holds.contains_key(&id);
                let live = w.live(&self.cfg, real);
                if let Some(h) = w.handoff {
                    if cur.holds.get(&id).map(|x| x.0) == Some(h.token)
                        && live
                        && fz < h.earliest_end
                        && h.heartbeat_after
                        && !h.wake_lost
                        && !self.sem_checker.exempt[w.lock].contains(&h.token)
                    {
                        // 4''. its wake-up waits in the wake list until its waker pops it
                        let prefix = grant_prefix(&th.owner, w.attempt, h.token);
                        if !popped.iter().any(|m| m.starts_with(&prefix)) {
                            let key = self.sems[w.lock].wake_key(&th.owner);
                            unpopped.push((
                                key,
                                prefix,
                                format!("sem {} to c{c}:t{t}", w.lock),
                                h.earliest_end,
                            ));
                        }
                    }
                    if cur.holds.get(&id).map(|x| x.0) != Some(h.token) {
                        w.handoff = None;
                        if live
                            && fz < h.earliest_end
                            && !self.sem_checker.exempt[w.lock].contains(&h.token)
                            && !self.sem_checker.forced[w.lock].contains(&h.token)
                        {
                            // the hand-off deadline is on the hand-off clock (a virtual
                            // clock, docs/semaphores.md): a forward step does not revoke it
                            found.push((
                                Check::HandoffVanished,
                                format!(
                                    "the hand-off of sem {} to live waiter c{c}:t{t} ({id}, \
                                     token {}) vanished before its lease could end",
                                    w.lock, h.token
                                ),
                            ));
                        }
                    }
                    continue;
                }
                if granted {
                    w.granted_seen = true;
                    continue;
                }
                if w.granted_seen || !live {
                    continue;
                }
                let queued = cur.waiters.get(&th.owner) == Some(&w.attempt)
                    && cur.queue.iter().any(|(o, _)| *o == th.owner);
                if !queued {
                    found.push((
                        Check::WaiterLost,
                        format!(
                            "live waiter c{c}:t{t} ({} attempt {}) has neither a queue place nor \
                             a grant on sem {}: queue {:?}, waiters {:?}, holds {:?}",
                            th.owner, w.attempt, w.lock, cur.queue, cur.waiters, cur.holds
                        ),
                    ));
                }
            }
        }
        found.extend(self.wakeups_missing(unpopped));
        for (check, msg) in found {
            self.violate(check, msg);
        }
        self.sem_checker.last = snaps;
    }

    /// What the semaphores leave at the end, beyond what `settled` allows: holds, waiters.
    pub fn sem_unsettled(&mut self) -> Vec<String> {
        let snaps = self.sem_snapshot();
        let mut wrong = vec![];
        for (s, cur) in snaps.iter().enumerate() {
            // a hold whose lease ran out stays in the hash until a writing script passes by
            // (status does not show it; the next acquire, release or heartbeat removes it)
            let live: Vec<&String> = cur
                .holds
                .keys()
                .filter(|id| cur.leases.get(*id).is_none_or(|&e| e > cur.server_ms))
                .collect();
            if !live.is_empty() {
                wrong.push(format!(
                    "sem {s} holds {:?} (used {}, leases {:?}, server {}ms)",
                    cur.holds, cur.used, cur.leases, cur.server_ms
                ));
            } else if !cur.holds.is_empty() {
                self.stats
                    .add("sem: expired holds left at the end for the next script", 1);
            }
            if !cur.queue.is_empty() || !cur.waiters.is_empty() {
                wrong.push(format!(
                    "sem {s} queue {:?} waiters {:?}",
                    cur.queue, cur.waiters
                ));
            }
        }
        wrong
    }

    /// The quiet phase's action of thread `(c, t)` on its semaphore side; returns whether it
    /// holds (or held) its permits this round.
    pub fn sem_quiet(&mut self, c: usize, t: usize, heartbeats: bool, served: bool) -> bool {
        if self.sems.is_empty() {
            return true;
        }
        let now = self.clock.fz();
        self.say("; ");
        let held = match self.sem_state(c, t) {
            State::Holding(_) => {
                self.sem_release(c, t, Fault::None);
                true
            }
            State::Waiting(_) if !heartbeats => {
                self.sem_leave_pass(c, t, Fault::None);
                false
            }
            State::Waiting(w) if w.deadline.is_some_and(|d| d <= now) => {
                self.sem_leave_claim(c, t, Fault::None, Fault::None);
                false
            }
            State::Waiting(_) => {
                self.sem_pop(c, t, Fault::None, Fault::None);
                false
            }
            State::Idle if !served => {
                let sem = (c + t) % self.sems.len();
                let permits = if self.cfg.sems[sem].rw && t == 0 {
                    RW_CAPACITY
                } else {
                    1 + (c as u64 % self.cfg.sems[sem].cap.min(3))
                };
                self.sem_acquire(
                    c,
                    t,
                    sem,
                    permits,
                    heartbeats,
                    500,
                    None,
                    Fault::None,
                    Fault::None,
                );
                false
            }
            State::Idle => false,
        };
        held || matches!(self.sem_state(c, t), State::Holding(_))
    }
}
