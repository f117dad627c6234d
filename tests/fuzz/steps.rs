//! The steps of a run: what the generator chooses, what is recorded, replayed and shrunk. A step
//! names its actors by index, so a replay (or a shrunk list) applies it to whatever state the
//! model is in; one that no longer fits (the thread is not idle, say) is skipped.

use std::fmt;

use crate::model::State;
use crate::rng::Rng;
use crate::sem::{SemChoices, SemStep};
use crate::world::World;

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

/// Thread `t` of client `c` calls acquire on `lock`.
#[derive(Clone, Copy, Debug)]
pub struct AcquireStep {
    pub c: usize,
    pub t: usize,
    pub lock: usize,
    pub wait: bool,
    pub lease_ms: u64,
    pub deadline_ms: Option<u64>,
    pub fault: Fault,
    /// The fault of the follow-up call (the leave after an error, or a re-run).
    pub then: Fault,
}

impl AcquireStep {
    /// An acquire without a deadline, and without faults.
    pub fn plain(c: usize, t: usize, lock: usize, wait: bool, lease_ms: u64) -> AcquireStep {
        AcquireStep {
            c,
            t,
            lock,
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
        write!(f, "c{c}:t{t} acquire {mode} lock={lock} lease={lease_ms}ms")?;
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
        c: usize,
        t: usize,
        fault: Fault,
        then: Fault,
    },
    Reenter {
        c: usize,
        t: usize,
        fault: Fault,
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
    /// A step of a semaphore's thread, client or operator, or a semaphore key's eviction.
    Sem(SemStep),
}

impl Step {
    /// The step's kind, for the summary's counts.
    pub fn kind(&self) -> &'static str {
        match self {
            Step::Acquire(_) => "acquire",
            Step::Pop { .. } => "pop",
            Step::Reenter { .. } => "reenter",
            Step::Release { .. } => "release",
            Step::Renew { .. } => "renew",
            Step::LeaveClaim { .. } => "leave claim",
            Step::LeavePass { .. } => "leave pass",
            Step::Heartbeat { .. } => "heartbeat",
            Step::ForceUnlock { .. } => "force-unlock",
            Step::Resend { .. } => "stray duplicate",
            Step::DeliverLate { .. } => "late delivery",
            Step::DeliverPop { .. } => "slow wake-up delivered",
            Step::Crash { .. } => "crash",
            Step::Pause { .. } => "pause",
            Step::Sleep { .. } => "time passes",
            Step::Evict { .. } => "eviction",
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
            Step::Pop { c, t, fault, then } => {
                write!(f, "c{c}:t{t} pop{fault}{}", then_text(then))
            }
            Step::Reenter { c, t, fault } => write!(f, "c{c}:t{t} reenter{fault}"),
            Step::Release { c, t, fault } => write!(f, "c{c}:t{t} release{fault}"),
            Step::Renew { c, t, fault } => write!(f, "c{c}:t{t} renew{fault}"),
            Step::LeaveClaim { c, t, fault, then } => {
                write!(f, "c{c}:t{t} leave claim{fault}{}", then_text(then))
            }
            Step::LeavePass { c, t, fault } => write!(f, "c{c}:t{t} leave pass{fault}"),
            Step::Heartbeat { c, lock, fault } => write!(f, "c{c} heartbeat lock={lock}{fault}"),
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
            Step::Evict { lock, key } => write!(f, "evict lock={lock} {key:?}"),
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
    Acquire,
    Pop,
    LeaveClaim,
    LeavePass,
    Reenter,
    Release,
    Renew,
    Heartbeat,
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

/// Choose the next step from what the model's state allows.
pub fn choose(w: &World, rng: &mut Rng) -> Step {
    let now = w.clock.fz();
    let (mut idle, mut waiting, mut claimable, mut holding, mut valid, mut with_last) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    let mut heartbeaters = vec![];
    for (c, client) in w.clients.iter().enumerate() {
        if !w.active(c) {
            continue;
        }
        for (t, th) in client.threads.iter().enumerate() {
            if th.last.is_some() {
                with_last.push(Who::Thread(c, t));
            }
            match &th.lock.state {
                State::Idle => idle.push((c, t)),
                State::Waiting(wt) => {
                    waiting.push((c, t));
                    heartbeaters.push((c, wt.lock));
                    if wt.deadline.is_some_and(|d| d <= now) {
                        claimable.push((c, t));
                    }
                }
                State::Holding(h) => {
                    holding.push((c, t));
                    if h.expires > now {
                        valid.push((c, t));
                    }
                }
            }
        }
    }
    if w.operator_last.is_some() {
        with_last.push(Who::Operator);
    }
    let on = |v: bool, weight: f64| if v { weight } else { 0.0 };
    // the semaphores' steps weigh as much as the locks' (0 without semaphores: an even seed's
    // choices are as they were)
    let sem = SemChoices::of(w);
    let kind = rng.weighted(&[
        (on(!idle.is_empty(), 12.0), Kind::Acquire),
        (on(!waiting.is_empty(), 16.0), Kind::Pop),
        (on(!claimable.is_empty(), 6.0), Kind::LeaveClaim),
        (on(!waiting.is_empty(), 0.7), Kind::LeavePass),
        (on(!valid.is_empty(), 4.0), Kind::Reenter),
        (on(!holding.is_empty(), 12.0), Kind::Release),
        (on(!valid.is_empty(), 5.0), Kind::Renew),
        (on(!heartbeaters.is_empty(), 4.0), Kind::Heartbeat),
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
    let cfg = &w.cfg;
    match kind {
        Kind::Acquire => {
            let (c, t) = rng.pick(&idle);
            let wait = rng.chance(0.75);
            Step::Acquire(AcquireStep {
                c,
                t,
                lock: rng.below(cfg.locks as u64) as usize,
                wait,
                lease_ms: rng.range(cfg.lease_ms.0, cfg.lease_ms.1),
                deadline_ms: (wait && rng.chance(0.4)).then(|| rng.range(200, 1500)),
                fault: fault(rng),
                then: fault(rng),
            })
        }
        Kind::Pop => {
            let (c, t) = rng.pick(&waiting);
            Step::Pop {
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
        Kind::LeaveClaim => {
            let (c, t) = rng.pick(&claimable);
            Step::LeaveClaim {
                c,
                t,
                fault: fault(rng),
                then: fault(rng),
            }
        }
        Kind::LeavePass => {
            let (c, t) = rng.pick(&waiting);
            Step::LeavePass {
                c,
                t,
                fault: fault(rng),
            }
        }
        Kind::Reenter => {
            let (c, t) = rng.pick(&valid);
            Step::Reenter {
                c,
                t,
                fault: fault(rng),
            }
        }
        Kind::Release => {
            let (c, t) = rng.pick(&holding);
            Step::Release {
                c,
                t,
                fault: fault(rng),
            }
        }
        Kind::Renew => {
            let (c, t) = rng.pick(&valid);
            Step::Renew {
                c,
                t,
                fault: fault(rng),
            }
        }
        Kind::Heartbeat => {
            let (c, lock) = rng.pick(&heartbeaters);
            Step::Heartbeat {
                c,
                lock,
                fault: fault(rng),
            }
        }
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
        Kind::Sem => Step::Sem(sem.choose(w, rng)),
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
