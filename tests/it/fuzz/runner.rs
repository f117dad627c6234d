//! One run: a fresh server, steps generated from the seed (or replayed from a list), the checks
//! after every step, then the quiet phase where faults stop and every live thread must be served.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::fuzz::checks::{Check, Unsettled, Violation};
use crate::fuzz::model::{Config, Prim, State};
use crate::fuzz::rng::Rng;
use crate::fuzz::steps::{self, Fault, Step};
use crate::fuzz::world::{Stats, World};

/// How long the quiet phase may take to serve every live thread and clean up.
pub const QUIET_LIMIT: Duration = Duration::from_secs(20);
/// Heartbeat period in the quiet phase (the real janitor's: a third of the waiter timeout).
const QUIET_HEARTBEAT_MS: f64 = 150.0;
/// Quiet-phase log lines kept for a report (the phase can run many rounds).
const QUIET_LOG_LINES: usize = 80;

pub enum Source<'a> {
    /// Choose steps from the seed, until either limit.
    Generate {
        max_steps: usize,
        max_time: Duration,
    },
    Replay(&'a [Step]),
}

pub struct Outcome {
    /// One line per step (replays: skipped steps too), then the quiet phase's last lines.
    pub log: Vec<String>,
    /// The steps applied (generated runs) or the list replayed.
    pub steps: Vec<Step>,
    /// Whether each step fitted the state (a replayed step may not: it then did nothing).
    pub applied: Vec<bool>,
    /// The violation and the index of the step it followed (`steps.len()`: the quiet phase).
    pub violation: Option<(usize, Violation)>,
    pub stats: Stats,
    pub elapsed: Duration,
    /// How long the quiet phase took to serve everyone and settle.
    pub quiet: Duration,
}

/// Run the steps, then (with `quiet`: its time limit) the quiet phase.
pub fn run(cfg: &Config, source: Source, quiet: Option<Duration>) -> Outcome {
    let began = Instant::now();
    let mut world = World::new(cfg);
    let mut rng = Rng::new(cfg.seed);
    let mut log = vec![];
    let mut steps = vec![];
    let mut applied_steps = vec![];
    let mut violation = None;
    let mut i = 0;
    loop {
        let step = match &source {
            Source::Generate {
                max_steps,
                max_time,
            } => {
                if i >= *max_steps || began.elapsed() >= *max_time {
                    break;
                }
                steps::choose(&world, &mut rng)
            }
            Source::Replay(list) => match list.get(i) {
                Some(s) => s.clone(),
                None => break,
            },
        };
        world.line.clear();
        let applied = world.apply(&step);
        if applied {
            world.step_checks();
            log.push(format!("#{i:<5} {}", world.line));
        } else {
            log.push(format!("#{i:<5} {step} (skipped: does not fit)"));
        }
        if applied || matches!(source, Source::Replay(_)) {
            steps.push(step);
            applied_steps.push(applied);
        }
        if let Some(v) = world.violation.take() {
            violation = Some((steps.len() - 1, v));
            break;
        }
        i += 1;
    }
    let quiet_began = Instant::now();
    if let (None, Some(limit)) = (&violation, quiet) {
        if let Some(v) = world.quiet(&mut log, limit) {
            violation = Some((steps.len(), v));
        }
    }
    let quiet = quiet_began.elapsed();
    Outcome {
        log,
        steps,
        applied: applied_steps,
        violation,
        stats: world.stats.clone(),
        elapsed: began.elapsed(),
        quiet,
    }
}

impl World {
    /// Faults stop; every live client behaves like the real one: holders release, waiters pop
    /// and heartbeat, and each thread takes the lock once more. Within `limit` every thread
    /// must have held the lock and the locks must end free and clean.
    fn quiet(&mut self, log: &mut Vec<String>, limit: Duration) -> Option<Violation> {
        let began = self.clock.real();
        let mut lines = vec![];
        self.line.clear();
        self.say("quiet: faults stop; late requests arrive");
        self.deliver_all_late();
        // a clock stepped back lengthens every TTL (a dead holder's lease too) by as much as
        // it lags: bring it back to its furthest, a forward step the estimates account for
        let behind = self.max_offset_ms - self.server.offset_ms();
        if behind > 0 {
            self.say("; ");
            self.clock_step(behind);
        }
        for cl in &mut self.clients {
            cl.paused_until = 0.0;
        }
        let heartbeats = self.cfg.quiet_heartbeats;
        if !heartbeats {
            // dead waiters, many: every client but the last queues its idle threads, then all
            // of them crash (a holder among them holds until its lease ends)
            self.say("; no heartbeats from now on: all clients but the last queue and crash (dead holders and waiters), only try_lock callers come by");
            let last = self.clients.len() - 1;
            for t in 0..self.clients[last].threads.len() {
                while matches!(self.state(Prim::Lock, last, t), State::Holding(_)) {
                    self.say("; ");
                    self.release(Prim::Lock, last, t, Fault::None);
                }
                if matches!(self.state(Prim::Sem, last, t), State::Holding(_)) {
                    self.say("; ");
                    self.release(Prim::Sem, last, t, Fault::None);
                }
            }
            let mut first = true;
            for c in 0..last {
                for t in 0..self.clients[c].threads.len() {
                    while matches!(self.state(Prim::Lock, c, t), State::Holding(_)) {
                        self.say("; ");
                        self.release(Prim::Lock, c, t, Fault::None);
                    }
                    if matches!(self.state(Prim::Lock, c, t), State::Waiting(_)) {
                        self.say("; ");
                        self.leave_pass(Prim::Lock, c, t, Fault::None);
                    }
                    if !self.sems.is_empty() {
                        // the semaphore side likewise: a dead waiter for permits
                        if matches!(self.state(Prim::Sem, c, t), State::Holding(_)) {
                            self.say("; ");
                            self.release(Prim::Sem, c, t, Fault::None);
                        }
                        if matches!(self.state(Prim::Sem, c, t), State::Waiting(_)) {
                            self.say("; ");
                            self.leave_pass(Prim::Sem, c, t, Fault::None);
                        }
                        if matches!(self.state(Prim::Sem, c, t), State::Idle) {
                            self.say("; ");
                            let cap = self.cfg.sems[0].cap;
                            let faults = (Fault::None, Fault::None);
                            self.acquire(Prim::Sem, (c, t, 0), cap, true, 2500, None, faults);
                        }
                    }
                    if matches!(self.state(Prim::Lock, c, t), State::Idle) {
                        self.say("; ");
                        // the first (usually the holder) briefly, so the next is handed the
                        // lock while still alive by its deadline, dies, and must be revoked
                        let lease = if first { 300 } else { 2500 };
                        first = false;
                        self.acquire(
                            Prim::Lock,
                            (c, t, 0),
                            1,
                            true,
                            lease,
                            None,
                            (Fault::None, Fault::None),
                        );
                    }
                }
                self.say("; ");
                self.crash(c);
            }
            self.try_only_quiet = Some(crate::fuzz::world::TryOnlyQuiet {
                since: self.clock.real(),
                handoffs: Default::default(),
            });
        }
        lines.push(std::mem::take(&mut self.line));
        // threads that held the lock since the faults stopped
        let mut served: HashSet<(usize, usize)> = HashSet::new();
        // threads that held permits of a semaphore since (all of them, without semaphores)
        let mut sem_served: HashSet<(usize, usize)> = HashSet::new();
        let mut last_heartbeat = f64::MIN;
        let mut leftover = String::new();
        let result = loop {
            if self.clock.real() - began > limit.as_secs_f64() * 1000.0 {
                break Some(Violation {
                    check: Check::Liveness,
                    message: self.liveness_report(&served, &sem_served, &leftover, limit),
                });
            }
            self.line.clear();
            if heartbeats && self.clock.real() - last_heartbeat >= QUIET_HEARTBEAT_MS {
                last_heartbeat = self.clock.real();
                for c in 0..self.clients.len() {
                    for lock in 0..self.locks.len() {
                        let before = self.line.len();
                        self.say("; ");
                        if !self.heartbeat(Prim::Lock, c, lock, Fault::None) {
                            self.line.truncate(before);
                        }
                    }
                    for sem in 0..self.sems.len() {
                        let before = self.line.len();
                        self.say("; ");
                        if !self.heartbeat(Prim::Sem, c, sem, Fault::None) {
                            self.line.truncate(before);
                        }
                    }
                }
            }
            for c in 0..self.clients.len() {
                for t in 0..self.clients[c].threads.len() {
                    let now = self.clock.fz();
                    self.say("; ");
                    match self.state(Prim::Lock, c, t) {
                        State::Holding(_) => {
                            served.insert((c, t));
                            self.release(Prim::Lock, c, t, Fault::None);
                        }
                        State::Waiting(_) if !heartbeats => {
                            self.leave_pass(Prim::Lock, c, t, Fault::None);
                        }
                        State::Waiting(w) if w.deadline.is_some_and(|d| d <= now) => {
                            self.leave_claim(Prim::Lock, c, t, Fault::None, Fault::None);
                        }
                        State::Waiting(_) => {
                            self.pop(Prim::Lock, c, t, Fault::None, Fault::None);
                        }
                        State::Idle if !served.contains(&(c, t)) => {
                            let lock = c % self.locks.len();
                            self.acquire(
                                Prim::Lock,
                                (c, t, lock),
                                1,
                                heartbeats,
                                500,
                                None,
                                (Fault::None, Fault::None),
                            );
                        }
                        State::Idle => {}
                    }
                    if matches!(self.state(Prim::Lock, c, t), State::Holding(_)) {
                        served.insert((c, t));
                    }
                    let was = sem_served.contains(&(c, t));
                    if self.sem_quiet(c, t, heartbeats, was) {
                        sem_served.insert((c, t));
                    }
                }
            }
            self.step_checks();
            self.check_dead_grantees();
            let quiet_line: String = self
                .line
                .split("; ")
                .filter(|p| !p.is_empty() && !p.ends_with("-> None"))
                .filter(|p| !p.contains(" pop ") || !p.ends_with("-> empty"))
                .collect::<Vec<_>>()
                .join("; ");
            if !quiet_line.is_empty() {
                lines.push(format!("quiet {quiet_line}"));
            }
            if let Some(v) = self.violation.take() {
                break Some(v);
            }
            let all_done = self.clients.iter().enumerate().all(|(c, cl)| {
                cl.threads.iter().enumerate().all(|(t, th)| {
                    served.contains(&(c, t))
                        && sem_served.contains(&(c, t))
                        && matches!(th.lock.state, State::Idle)
                        && matches!(th.sem.state, State::Idle)
                })
            });
            if all_done {
                match self.settled() {
                    Ok(()) => break None,
                    Err(Unsettled::State(e)) => leftover = e,
                    Err(Unsettled::Overlong(keys)) => {
                        break Some(Violation {
                            check: Check::KeySize,
                            message: format!(
                                "at rest (every lock and semaphore free, nothing queued), keys \
                                 live longer than the bound of their kind: {keys}"
                            ),
                        });
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let skipped = lines.len().saturating_sub(QUIET_LOG_LINES);
        if skipped > 0 {
            log.push(format!("quiet ... {skipped} lines omitted"));
        }
        if std::env::var("FAIRLOCK_FUZZ_DEBUG_QUIET").is_ok() {
            for l in &lines {
                eprintln!("{l}");
            }
        }
        log.extend(lines.into_iter().skip(skipped));
        result
    }

    /// Who was not served, and what Redis holds for them.
    /// Try-only quiet phase: a hand-off to a dead waiter is revoked within two waiter timeouts
    /// of try_lock traffic (it is never popped; acquire revokes it once its deadline passes on
    /// the lock's clock, which that traffic moves on).
    fn check_dead_grantees(&mut self) {
        let Some(q) = &self.try_only_quiet else {
            return;
        };
        let bound = 2.0 * self.cfg.waiter_timeout_ms as f64;
        let now = self.clock.real();
        let mut late = vec![];
        for (&l, &(token, seen)) in &q.handoffs {
            if self.checker.last[l].token == token && now - seen > bound {
                late.push(format!(
                    "lock {l}: the hand-off of token {token} to {} (a dead waiter) still holds \
                     the lock {:.0}ms after it was made (bound {bound:.0}ms)",
                    self.checker.last[l].owner,
                    now - seen
                ));
            }
        }
        if let Some(msg) = late.first() {
            self.violate(Check::DeadWaiter, msg.clone());
        }
    }

    fn liveness_report(
        &mut self,
        served: &HashSet<(usize, usize)>,
        sem_served: &HashSet<(usize, usize)>,
        leftover: &str,
        limit: Duration,
    ) -> String {
        let mut out = vec![];
        for c in 0..self.clients.len() {
            for t in 0..self.clients[c].threads.len() {
                let th = &self.clients[c].threads[t];
                let what = match &th.lock.state {
                    State::Idle if served.contains(&(c, t)) => continue,
                    State::Idle => "idle, never served".to_string(),
                    State::Holding(h) => format!("still holding token {}", h.token),
                    State::Waiting(w) => {
                        let snap = &self.checker.last[w.lock];
                        let wake: Vec<String> = redis::cmd("LRANGE")
                            .arg(self.locks[w.lock].wake_key(&th.owner))
                            .arg(0)
                            .arg(-1)
                            .query(&mut self.conns[0])
                            .unwrap_or_default();
                        format!(
                            "waiting on lock {} with attempt {}: queue entry {:?}, holder {:?} \
                             attempt {}, wake list {wake:?}",
                            w.lock,
                            w.attempt,
                            snap.waiters.get(&th.owner),
                            snap.owner,
                            snap.attempt
                        )
                    }
                };
                out.push(format!("c{c}:t{t} ({}) {what}", th.owner));
            }
        }
        for c in 0..self.clients.len() {
            for t in 0..self.clients[c].threads.len() {
                let th = &self.clients[c].threads[t];
                let what = match &th.sem.state {
                    State::Idle if sem_served.contains(&(c, t)) => continue,
                    State::Idle => "never got its permits".to_string(),
                    State::Holding(h) => format!("still holding permits, token {}", h.token),
                    State::Waiting(w) => {
                        let snap = &self.sem_checker.last[w.lock];
                        format!(
                            "waiting for {} permits of sem {} with attempt {}: queue entry {:?}, \
                             holds {:?}, used {}",
                            th.sem.permits,
                            w.lock,
                            w.attempt,
                            snap.waiters.get(&th.owner),
                            snap.holds,
                            snap.used
                        )
                    }
                };
                out.push(format!("c{c}:t{t} ({}) sem side: {what}", th.owner));
            }
        }
        if !leftover.is_empty() {
            out.push(format!("left in Redis: {leftover}"));
        }
        format!(
            "not settled {}s after faults stopped: {}",
            limit.as_secs(),
            out.join(" | ")
        )
    }
}
