//! What only the semaphores have (every odd seed: one or two, each a counting semaphore of
//! capacity 1-4 whose threads ask for 1-3 permits, or the read/write shape: capacity
//! `RW_CAPACITY`, a read takes 1, a write all): their shapes, the permits an acquire asks for,
//! their share of the generator, their snapshot, the operator's force-release and
//! set-capacity, Redis's own count (`sem_after_call`: `~used`, live permits within capacity)
//! and what they may leave at the end. Their threads act through the actions, faults and
//! judges every primitive shares (`actions.rs`, `faults.rs`, `judges.rs`; the differences in
//! `prim.rs`); see the header of `main.rs`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::sync::LazyLock;

use fairlock::raw::{RawSemaphore, SemCapacity, SemKind, Settings, RW_CAPACITY};
use redis::Value;

use crate::fuzz::checks::{items, parse_queue, parse_waiters, text, Check};
use crate::fuzz::judges::View;
use crate::fuzz::model::Prim;
use crate::fuzz::model::State;
use crate::fuzz::rng::Rng;
use crate::fuzz::steps::{Choices, EvictKey, Fault, Step, ThreadKind, Who};
use crate::fuzz::world::{describe, World};

/// `World::late_pops` entries of a semaphore carry its index plus this (the lock's: below).
pub const SEM_POP: usize = 1 << 20;

/// A semaphore operator's step (the threads' and clients' steps are `Step`'s, with
/// `Prim::Sem`), or one of its keys' eviction.
#[derive(Clone, Copy, Debug)]
pub enum SemStep {
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
}

impl SemStep {
    pub fn kind(&self) -> &'static str {
        match self {
            SemStep::ForceRelease { .. } => "sem force-release",
            SemStep::SetCapacity { .. } => "sem set capacity",
        }
    }
}

impl fmt::Display for SemStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            SemStep::ForceRelease { sem, fault } => {
                write!(f, "operator force-release sem={sem}{fault}")
            }
            SemStep::SetCapacity { sem, fault } => {
                write!(f, "operator set capacity sem={sem}{fault}")
            }
        }
    }
}

/// Build the run's semaphores.
pub fn make_sems(cfg: &crate::fuzz::model::Config, settings: Settings) -> Vec<RawSemaphore> {
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
pub fn draw_permits(w: &World, sem: usize, rng: &mut Rng) -> u64 {
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
pub struct SemChoices(Choices);

impl SemChoices {
    pub fn of(w: &World) -> SemChoices {
        SemChoices(Choices::of(w, Prim::Sem))
    }

    /// Total weight of the semaphore's steps.
    pub fn weight(&self, w: &World) -> f64 {
        if w.sems.is_empty() {
            return 0.0;
        }
        self.0.weights().iter().map(|k| k.0).sum::<f64>() + 1.0 + 1.0
    }

    pub fn choose(&self, w: &World, rng: &mut Rng) -> Step {
        #[derive(Clone, Copy)]
        enum K {
            Thread(ThreadKind),
            Force,
            SetCapacity,
            Evict,
        }
        let mut kinds: Vec<(f64, K)> = self
            .0
            .weights()
            .into_iter()
            .map(|(weight, k)| (weight, K::Thread(k)))
            .collect();
        kinds.extend([(1.0, K::Force), (0.5, K::SetCapacity), (1.0, K::Evict)]);
        let cfg = &w.cfg;
        let n = w.sems.len() as u64;
        match rng.weighted(&kinds) {
            K::Thread(k) => self.0.step(k, w, rng),
            K::Force => Step::Sem(SemStep::ForceRelease {
                sem: rng.below(n) as usize,
                fault: rng.weighted(&[
                    (60.0, Fault::None),
                    (20.0, Fault::Retried),
                    (20.0, Fault::Late),
                ]),
            }),
            K::SetCapacity => Step::Sem(SemStep::SetCapacity {
                sem: rng.below(n) as usize,
                fault: rng.weighted(&[
                    (50.0, Fault::None),
                    (20.0, Fault::Lost),
                    (15.0, Fault::Retried),
                    (15.0, Fault::Late),
                ]),
            }),
            K::Evict => {
                let c = rng.below(cfg.clients as u64) as usize;
                let t = rng.below(cfg.threads as u64) as usize;
                Step::Evict {
                    p: Prim::Sem,
                    lock: rng.below(n) as usize,
                    key: rng.weighted(&[
                        (20.0, EvictKey::Hash),
                        (10.0, EvictKey::Fence),
                        (10.0, EvictKey::Queue),
                        (10.0, EvictKey::Waiters),
                        (15.0, EvictKey::Leases),
                        (10.0, EvictKey::Handoffs),
                        (5.0, EvictKey::Left),
                        (20.0, EvictKey::Wake(c, t)),
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
    /// In the judges' common shape (`judges.rs`).
    pub fn view(&self) -> View {
        View {
            holds: self
                .holds
                .iter()
                .map(|(id, (token, permits))| {
                    let (owner, attempt) = split_id(id);
                    (owner.to_string(), attempt, *token, *permits)
                })
                .collect(),
            queue: self.queue.clone(),
            waiters: self.waiters.clone(),
            fence: self.fence,
            detail: format!("used {}", self.used),
        }
    }

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
    pub reply_order: crate::fuzz::fifo::ReplyOrder,
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
            reply_order: crate::fuzz::fifo::ReplyOrder::new(n),
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
    s.queue = parse_queue(f.get(1));
    s.waiters = parse_waiters(f.get(2));
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
    pub fn apply_sem(&mut self, step: &SemStep) -> bool {
        match *step {
            SemStep::ForceRelease { sem, fault } => self.sem_force_release(sem, fault),
            SemStep::SetCapacity { sem, fault } => self.sem_set_capacity(sem, fault),
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
        self.operator_force(label, fault, |w| {
            w.sems[sem].force_release(&owner, attempt, token)
        });
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
            let prev = prev.view();
            self.judge_grants(Prim::Sem, s, &prev, &cur.view(), actor, sent, real);
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
        let views: Vec<View> = snaps.iter().map(SemSnap::view).collect();
        self.judge_sides(Prim::Sem, &views, fz, real);
        self.sem_checker.last = snaps;
    }

    /// What the semaphores leave at the end, beyond what `settled` allows: holds, waiters; and
    /// the queue keys of free semaphores where only crashed clients wait (`only_crashed`), which
    /// `settled` bounds by their TTL.
    pub fn sem_unsettled(&mut self) -> (Vec<String>, HashSet<String>) {
        let snaps = self.sem_snapshot();
        let mut wrong = vec![];
        let mut left_for_next_user = HashSet::new();
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
                if live.is_empty() && self.only_crashed(&cur.queue, &cur.waiters) {
                    let names = self.sems[s].key_names();
                    left_for_next_user.extend(
                        names
                            .iter()
                            .filter(|k| k.ends_with(":queue") || k.ends_with(":waiters"))
                            .map(|k| k.to_string()),
                    );
                    self.stats.add(
                        "left for the next user: crashed clients' places on a free semaphore",
                        1,
                    );
                } else {
                    wrong.push(format!(
                        "sem {s} queue {:?} waiters {:?}",
                        cur.queue, cur.waiters
                    ));
                }
            }
        }
        (wrong, left_for_next_user)
    }

    /// The quiet phase's action of thread `(c, t)` on its semaphore side; returns whether it
    /// holds (or held) its permits this round.
    pub fn sem_quiet(&mut self, c: usize, t: usize, heartbeats: bool, served: bool) -> bool {
        if self.sems.is_empty() {
            return true;
        }
        let now = self.clock.fz();
        self.say("; ");
        let held = match self.state(Prim::Sem, c, t) {
            State::Holding(_) => {
                self.release(Prim::Sem, c, t, Fault::None);
                true
            }
            State::Waiting(_) if !heartbeats => {
                self.leave_pass(Prim::Sem, c, t, Fault::None);
                false
            }
            State::Waiting(w) if w.deadline.is_some_and(|d| d <= now) => {
                self.leave_claim(Prim::Sem, c, t, Fault::None, Fault::None);
                false
            }
            State::Waiting(_) => {
                self.pop(Prim::Sem, c, t, Fault::None, Fault::None);
                false
            }
            State::Idle if !served => {
                let sem = (c + t) % self.sems.len();
                let permits = if self.cfg.sems[sem].rw && t == 0 {
                    RW_CAPACITY
                } else {
                    1 + (c as u64 % self.cfg.sems[sem].cap.min(3))
                };
                let faults = (Fault::None, Fault::None);
                self.acquire(
                    Prim::Sem,
                    (c, t, sem),
                    permits,
                    heartbeats,
                    500,
                    None,
                    faults,
                );
                false
            }
            State::Idle => false,
        };
        held || matches!(self.state(Prim::Sem, c, t), State::Holding(_))
    }
}
