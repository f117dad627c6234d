//! The steps of a run: what the generator chooses, what is recorded, replayed and shrunk. A step
//! names its actors by index, so a replay (or a shrunk list) applies it to whatever state the
//! model is in; one that no longer fits (the thread is not idle, say) is skipped.

use std::fmt;

use crate::fuzz::model::{Prim, State};
use crate::fuzz::rng::Rng;
use crate::fuzz::sem::{SemChoices, SemStep};
use crate::fuzz::world::World;

/// What happens to one request on the network.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    None,
    /// Applied, but the reply never arrives: the caller sees an error.
    Lost,
    /// Held in the network and delivered after later steps; the caller sees an error now.
    Late,
    /// Never arrives at all; the caller sees an error.
    Dropped,
    /// The connection layer sends it twice; the caller sees the second reply.
    Retried,
    /// The first copy is held up in the network; the connection layer gives up on it and sends
    /// it again, and the caller sees the second copy's reply. The first arrives after later
    /// steps (the success path of a repeat: every call through Sentinel or Cluster).
    SlowFirst,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Fault::None => "",
            Fault::Lost => " [reply lost]",
            Fault::Late => " [delivered late]",
            Fault::Dropped => " [request lost]",
            Fault::Retried => " [sent twice]",
            Fault::SlowFirst => " [first copy held up, sent again]",
        })
    }
}

/// Whose last command a stray duplicate repeats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Who {
    Thread(usize, usize),
    Operator,
}

/// A key an eviction deletes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EvictKey {
    Hash,
    Fence,
    Queue,
    Waiters,
    /// A semaphore's leases zset and hand-offs zset (a lock has neither).
    Leases,
    Handoffs,
    /// The left marks.
    Left,
    Wake(usize, usize),
}

/// Thread `t` of client `c` calls acquire on lock or semaphore `lock` of kind `p`.
#[derive(Clone, Copy, Debug)]
pub struct AcquireStep {
    pub p: Prim,
    pub c: usize,
    pub t: usize,
    pub lock: usize,
    /// The permits asked for (1 on a lock; a semaphore's at most its capacity).
    pub permits: u64,
    pub wait: bool,
    pub lease_ms: u64,
    pub deadline_ms: Option<u64>,
    pub fault: Fault,
    /// The fault of the follow-up call (the leave after an error, or a re-run).
    pub then: Fault,
}

impl AcquireStep {
    /// A lock's acquire without a deadline, and without faults.
    pub fn plain(c: usize, t: usize, lock: usize, wait: bool, lease_ms: u64) -> AcquireStep {
        AcquireStep {
            p: Prim::Lock,
            c,
            t,
            lock,
            permits: 1,
            wait,
            lease_ms,
            deadline_ms: None,
            fault: Fault::None,
            then: Fault::None,
        }
    }
}

impl fmt::Display for AcquireStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (c, t, lock, lease_ms) = (self.c, self.t, self.lock, self.lease_ms);
        let mode = if self.wait { "wait" } else { "try" };
        let (pfx, noun) = (self.p.prefix(), self.p.name());
        write!(f, "c{c}:t{t} {pfx}acquire {mode} {noun}={lock}")?;
        if self.p == Prim::Sem {
            write!(f, " permits={}", self.permits)?;
        }
        write!(f, " lease={lease_ms}ms")?;
        if let Some(d) = self.deadline_ms {
            write!(f, " timeout={d}ms")?;
        }
        write!(f, "{}{}", self.fault, then_text(self.then))
    }
}

#[derive(Clone, Debug)]
pub enum Step {
    Acquire(AcquireStep),
    Pop {
        p: Prim,
        c: usize,
        t: usize,
        fault: Fault,
        then: Fault,
    },
    Reenter {
        p: Prim,
        c: usize,
        t: usize,
        fault: Fault,
    },
    Release {
        p: Prim,
        c: usize,
        t: usize,
        fault: Fault,
    },
    Renew {
        p: Prim,
        c: usize,
        t: usize,
        fault: Fault,
    },
    LeaveClaim {
        p: Prim,
        c: usize,
        t: usize,
        fault: Fault,
        then: Fault,
    },
    LeavePass {
        p: Prim,
        c: usize,
        t: usize,
        fault: Fault,
    },
    Heartbeat {
        p: Prim,
        c: usize,
        lock: usize,
        fault: Fault,
    },
    ForceUnlock {
        lock: usize,
        fault: Fault,
    },
    Resend {
        who: Who,
    },
    DeliverLate {
        n: usize,
    },
    /// A wake-up the waker popped reaches the thread only now: its BLPOP reply was held up on
    /// the way (a slow link, a stalled process, the leader's wait for replica acks).
    DeliverPop {
        n: usize,
        /// How much longer (ms) it is held up first: long enough, now and then, for the
        /// grant's lease to run out on the server before the client reads it.
        wait_ms: u64,
    },
    Crash {
        c: usize,
    },
    Pause {
        c: usize,
        ms: u64,
    },
    Sleep {
        ms: u64,
    },
    Evict {
        p: Prim,
        lock: usize,
        key: EvictKey,
    },
    DataLoss,
    Clock {
        ms: i64,
    },
    /// The server clock jumps minutes ahead (a VM resumed, an NTP correction after a long
    /// drift), and every active client's janitor ticks right after it, as it would within a
    /// third of the waiter timeout: keys that live the queue's TTL (10 minutes) see their
    /// entries age past it while the lock stays in use (the left marks' bound).
    LongClock {
        ms: i64,
    },
    /// A semaphore operator's step.
    Sem(SemStep),
}

impl Step {
    /// The step's kind, for the summary's counts.
    pub fn kind(&self) -> &'static str {
        let of = |p: &Prim, lock: &'static str, sem: &'static str| match p {
            Prim::Lock => lock,
            Prim::Sem => sem,
        };
        match self {
            Step::Acquire(a) => of(&a.p, "acquire", "sem acquire"),
            Step::Pop { p, .. } => of(p, "pop", "sem pop"),
            Step::Reenter { .. } => "reenter",
            Step::Release { p, .. } => of(p, "release", "sem release"),
            Step::Renew { p, .. } => of(p, "renew", "sem renew"),
            Step::LeaveClaim { p, .. } => of(p, "leave claim", "sem leave claim"),
            Step::LeavePass { p, .. } => of(p, "leave pass", "sem leave pass"),
            Step::Heartbeat { p, .. } => of(p, "heartbeat", "sem heartbeat"),
            Step::ForceUnlock { .. } => "force-unlock",
            Step::Resend { .. } => "stray duplicate",
            Step::DeliverLate { .. } => "late delivery",
            Step::DeliverPop { .. } => "slow wake-up delivered",
            Step::Crash { .. } => "crash",
            Step::Pause { .. } => "pause",
            Step::Sleep { .. } => "time passes",
            Step::Evict { p, .. } => of(p, "eviction", "sem eviction"),
            Step::DataLoss => "data loss",
            Step::Clock { .. } => "clock step",
            Step::LongClock { .. } => "long clock step",
            Step::Sem(s) => s.kind(),
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Step::Acquire(a) => write!(f, "{a}"),
            Step::Pop {
                p,
                c,
                t,
                fault,
                then,
            } => {
                let pfx = p.prefix();
                write!(f, "c{c}:t{t} {pfx}pop{fault}{}", then_text(then))
            }
            Step::Reenter { c, t, fault, .. } => write!(f, "c{c}:t{t} reenter{fault}"),
            Step::Release { p, c, t, fault } => write!(f, "c{c}:t{t} {}release{fault}", p.prefix()),
            Step::Renew { p, c, t, fault } => write!(f, "c{c}:t{t} {}renew{fault}", p.prefix()),
            Step::LeaveClaim {
                p,
                c,
                t,
                fault,
                then,
            } => {
                let pfx = p.prefix();
                write!(f, "c{c}:t{t} {pfx}leave claim{fault}{}", then_text(then))
            }
            Step::LeavePass { p, c, t, fault } => {
                write!(f, "c{c}:t{t} {}leave pass{fault}", p.prefix())
            }
            Step::Heartbeat { p, c, lock, fault } => {
                let (pfx, noun) = (p.prefix(), p.name());
                write!(f, "c{c} {pfx}heartbeat {noun}={lock}{fault}")
            }
            Step::ForceUnlock { lock, fault } => {
                let how = match fault {
                    Fault::None | Fault::Dropped => "",
                    Fault::Lost | Fault::Retried => " [retried by the connection layer]",
                    Fault::Late | Fault::SlowFirst => " [retried now, first copy delivered late]",
                };
                write!(f, "operator force-unlock lock={lock}{how}")
            }
            Step::Resend {
                who: Who::Thread(c, t),
            } => write!(f, "c{c}:t{t} stray duplicate"),
            Step::Resend { who: Who::Operator } => write!(f, "operator stray duplicate"),
            Step::DeliverLate { n } => write!(f, "deliver late request #{n}"),
            Step::DeliverPop { n, wait_ms } => {
                write!(f, "deliver held-up wake-up #{n} after {wait_ms}ms more")
            }
            Step::Crash { c } => write!(f, "c{c} crashes"),
            Step::Pause { c, ms } => write!(f, "c{c} pauses for {ms}ms"),
            Step::Sleep { ms } => write!(f, "time passes: {ms}ms"),
            Step::Evict { p, lock, key } => write!(f, "evict {}={lock} {key:?}", p.name()),
            Step::DataLoss => write!(f, "data loss (FLUSHALL, SCRIPT FLUSH, FUNCTION FLUSH)"),
            Step::Clock { ms } => write!(f, "server clock steps {ms:+}ms"),
            Step::LongClock { ms } => write!(f, "server clock jumps {ms:+}ms; janitors tick"),
            Step::Sem(s) => write!(f, "{s}"),
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

pub fn fault(rng: &mut Rng) -> Fault {
    rng.weighted(&[
        (82.0, Fault::None),
        (5.0, Fault::Lost),
        (4.0, Fault::Late),
        (2.0, Fault::Dropped),
        (4.0, Fault::Retried),
        (3.0, Fault::SlowFirst),
    ])
}

#[derive(Clone, Copy)]
enum Kind {
    Thread(ThreadKind),
    ForceUnlock,
    Resend,
    DeliverLate,
    DeliverPop,
    Crash,
    Pause,
    Sleep,
    Evict,
    DataLoss,
    Sem,
    ClockStep,
}

/// The threads and clients that can take each thread step on side `p`, by the model's state.
pub struct Choices {
    pub p: Prim,
    pub idle: Vec<(usize, usize)>,
    pub waiting: Vec<(usize, usize)>,
    pub claimable: Vec<(usize, usize)>,
    pub holding: Vec<(usize, usize)>,
    pub valid: Vec<(usize, usize)>,
    /// (client, index) of each waiting thread's lock or semaphore.
    pub heartbeaters: Vec<(usize, usize)>,
}

/// A thread's or client's step on one side.
#[derive(Clone, Copy)]
pub enum ThreadKind {
    Acquire,
    Pop,
    LeaveClaim,
    LeavePass,
    Reenter,
    Release,
    Renew,
    Heartbeat,
}

impl Choices {
    pub fn of(w: &World, p: Prim) -> Choices {
        let now = w.clock.fz();
        let mut s = Choices {
            p,
            idle: vec![],
            waiting: vec![],
            claimable: vec![],
            holding: vec![],
            valid: vec![],
            heartbeaters: vec![],
        };
        for (c, client) in w.clients.iter().enumerate() {
            if !w.active(c) {
                continue;
            }
            for (t, th) in client.threads.iter().enumerate() {
                match &th.side(p).state {
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

    /// The thread steps' weights in the step mix, by what the state allows (a semaphore has
    /// no re-entry).
    pub fn weights(&self) -> Vec<(f64, ThreadKind)> {
        let on = |v: &Vec<(usize, usize)>, weight: f64| if v.is_empty() { 0.0 } else { weight };
        let mut k = vec![
            (on(&self.idle, 12.0), ThreadKind::Acquire),
            (on(&self.waiting, 16.0), ThreadKind::Pop),
            (on(&self.claimable, 6.0), ThreadKind::LeaveClaim),
            (on(&self.waiting, 0.7), ThreadKind::LeavePass),
        ];
        if self.p == Prim::Lock {
            k.push((on(&self.valid, 4.0), ThreadKind::Reenter));
        }
        k.extend([
            (on(&self.holding, 12.0), ThreadKind::Release),
            (on(&self.valid, 5.0), ThreadKind::Renew),
            (on(&self.heartbeaters, 4.0), ThreadKind::Heartbeat),
        ]);
        k
    }

    /// A step of `kind`, its actor and faults drawn.
    pub fn step(&self, kind: ThreadKind, w: &World, rng: &mut Rng) -> Step {
        let cfg = &w.cfg;
        let p = self.p;
        match kind {
            ThreadKind::Acquire => {
                let (c, t) = rng.pick(&self.idle);
                let (lock, wait, permits) = match p {
                    Prim::Lock => {
                        let wait = rng.chance(0.75);
                        (rng.below(cfg.locks as u64) as usize, wait, 1)
                    }
                    Prim::Sem => {
                        let sem = rng.below(w.sems.len() as u64) as usize;
                        let wait = rng.chance(0.75);
                        (sem, wait, crate::fuzz::sem::draw_permits(w, sem, rng))
                    }
                };
                Step::Acquire(AcquireStep {
                    p,
                    c,
                    t,
                    lock,
                    permits,
                    wait,
                    lease_ms: rng.range(cfg.lease_ms.0, cfg.lease_ms.1),
                    deadline_ms: (wait && rng.chance(0.4)).then(|| rng.range(200, 1500)),
                    fault: fault(rng),
                    then: fault(rng),
                })
            }
            ThreadKind::Pop => {
                let (c, t) = rng.pick(&self.waiting);
                Step::Pop {
                    p,
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
            ThreadKind::LeaveClaim => {
                let (c, t) = rng.pick(&self.claimable);
                Step::LeaveClaim {
                    p,
                    c,
                    t,
                    fault: fault(rng),
                    then: fault(rng),
                }
            }
            ThreadKind::LeavePass => {
                let (c, t) = rng.pick(&self.waiting);
                Step::LeavePass {
                    p,
                    c,
                    t,
                    fault: fault(rng),
                }
            }
            ThreadKind::Reenter => {
                let (c, t) = rng.pick(&self.valid);
                Step::Reenter {
                    p,
                    c,
                    t,
                    fault: fault(rng),
                }
            }
            ThreadKind::Release => {
                let (c, t) = rng.pick(&self.holding);
                Step::Release {
                    p,
                    c,
                    t,
                    fault: fault(rng),
                }
            }
            ThreadKind::Renew => {
                let (c, t) = rng.pick(&self.valid);
                Step::Renew {
                    p,
                    c,
                    t,
                    fault: fault(rng),
                }
            }
            ThreadKind::Heartbeat => {
                let (c, lock) = rng.pick(&self.heartbeaters);
                Step::Heartbeat {
                    p,
                    c,
                    lock,
                    fault: fault(rng),
                }
            }
        }
    }
}

/// Choose the next step from what the model's state allows.
pub fn choose(w: &World, rng: &mut Rng) -> Step {
    let mut with_last = vec![];
    for (c, client) in w.clients.iter().enumerate() {
        if !w.active(c) {
            continue;
        }
        for (t, th) in client.threads.iter().enumerate() {
            if th.last.is_some() {
                with_last.push(Who::Thread(c, t));
            }
        }
    }
    if w.operator_last.is_some() {
        with_last.push(Who::Operator);
    }
    let on = |v: bool, weight: f64| if v { weight } else { 0.0 };
    let locks = Choices::of(w, Prim::Lock);
    // the semaphores' steps weigh as much as the locks' (0 without semaphores: an even seed's
    // choices are as they were)
    let sem = SemChoices::of(w);
    let mut kinds: Vec<(f64, Kind)> = locks
        .weights()
        .into_iter()
        .map(|(weight, k)| (weight, Kind::Thread(k)))
        .collect();
    kinds.extend([
        (1.0, Kind::ForceUnlock),
        (on(!with_last.is_empty(), 2.5), Kind::Resend),
        (on(!w.late.is_empty(), 4.0), Kind::DeliverLate),
        (on(!w.late_pops.is_empty(), 3.0), Kind::DeliverPop),
        (0.4, Kind::Crash),
        (0.6, Kind::Pause),
        (0.8, Kind::Sleep),
        (0.8, Kind::Evict),
        (0.25, Kind::DataLoss),
        (sem.weight(w), Kind::Sem),
        (1.0, Kind::ClockStep),
    ]);
    let kind = rng.weighted(&kinds);
    let cfg = &w.cfg;
    match kind {
        Kind::Thread(k) => locks.step(k, w, rng),
        Kind::ForceUnlock => Step::ForceUnlock {
            lock: rng.below(cfg.locks as u64) as usize,
            fault: rng.weighted(&[
                (60.0, Fault::None),
                (20.0, Fault::Retried),
                (20.0, Fault::Late),
            ]),
        },
        Kind::Resend => Step::Resend {
            who: rng.pick(&with_last),
        },
        Kind::DeliverLate => Step::DeliverLate {
            n: rng.below(1000) as usize,
        },
        Kind::DeliverPop => Step::DeliverPop {
            n: rng.below(1000) as usize,
            wait_ms: if rng.chance(0.15) {
                rng.range(cfg.lease_ms.0 / 2, cfg.lease_ms.1 * 2)
            } else {
                0
            },
        },
        Kind::Crash => Step::Crash {
            c: rng.below(cfg.clients as u64) as usize,
        },
        Kind::Pause => Step::Pause {
            c: rng.below(cfg.clients as u64) as usize,
            ms: rng.range(cfg.waiter_timeout_ms + 100, 3 * cfg.waiter_timeout_ms),
        },
        // mostly short (steps take well under a millisecond), now and then past a lease
        Kind::Sleep => Step::Sleep {
            ms: if rng.chance(0.8) {
                rng.range(10, 80)
            } else {
                rng.range(150, 350)
            },
        },
        Kind::Evict => {
            let c = rng.below(cfg.clients as u64) as usize;
            let t = rng.below(cfg.threads as u64) as usize;
            Step::Evict {
                p: Prim::Lock,
                lock: rng.below(cfg.locks as u64) as usize,
                key: rng.weighted(&[
                    (30.0, EvictKey::Hash),
                    (15.0, EvictKey::Fence),
                    (15.0, EvictKey::Queue),
                    (15.0, EvictKey::Waiters),
                    (5.0, EvictKey::Left),
                    (20.0, EvictKey::Wake(c, t)),
                ]),
            }
        }
        Kind::DataLoss => Step::DataLoss,
        Kind::Sem => sem.choose(w, rng),
        Kind::ClockStep if rng.below(10) == 0 => Step::LongClock {
            ms: rng.range(360_000, 420_000) as i64,
        },
        Kind::ClockStep => {
            let magnitude = match rng.below(10) {
                0..=2 => rng.range(100, 900),
                3..=7 => rng.range(1_000, 10_000),
                _ => rng.range(10_000, 30_000),
            } as i64;
            Step::Clock {
                ms: if rng.chance(0.5) {
                    magnitude
                } else {
                    -magnitude
                },
            }
        }
    }
}
