//! The deadlock world: a seeded, step-driven fuzzer of deadlock detection over the real scripts
//! and the library's own check (`fairlock::raw_deadlock::DeadlockCheck`, the machine the engine
//! drives), one read at a time, other threads' steps in between.
//!
//! Per seed: one redis-server, 3-6 locks, and on odd seeds one semaphore of capacity 1-3
//! (`s0`), one read/write lock (`rw0`) or both (a third each), 2-4 logical clients of 1-3
//! threads, with detection on (`after` 150-300 ms of a virtual client clock); on some seeds
//! (30%) one client has detection off (its waits publish and check nothing, and all have a
//! deadline). Each thread runs plans: take 2-3 of the resources in a random (nested) order (a
//! lock; 1..capacity permits of the semaphore; a read or a write of the read/write lock, half
//! each), holding each a while, then release them innermost first; so cycles form (in the quiet
//! phase, it ends the plan under way and runs one more). The semaphores go through their raw
//! scripts as the locks do (`RawSemaphore`: acquire in wait mode, the pop of the wake list,
//! release, leave with `claim`; the purge's leave passes, a restart force-releases).
//! Some waits have a deadline (so cycles also dissolve on their own).
//! Steps: a thread's acquire (the acquire script in wait mode), the pop of its wake list (a
//! grant), its release, its leave at its deadline (`claim`, as the engine's
//! `leave_at_deadline`), a janitor's heartbeat, time passing on the virtual clock, and the
//! moments of detection as the engine has them (`raw_deadlock::first_due` / `next_due`: a
//! publication of the wait in its client's index; a check, which publishes and then reads
//! **one read per step**); a check that decides to refuse makes its thread leave in a later
//! step (the leave with `claim`: a grant that came meanwhile is kept and is no refusal).
//!
//! Time: a step that is due (a moment of detection, a check's next read, a refusal's leave, a
//! deadline's leave, the pop of a grant) runs within `R` ms of virtual time of when it became
//! due; time passes only in time steps, which never pass such a limit. So one read of a check
//! takes at most `R`, the thread's wake-up and one round trip.
//!
//! Faults (until the quiet phase): a check's thread stalled between two reads (10 ms to
//! `after` / 2; the window in which a cycle read so far dissolves), a publication whose reply is
//! lost (applied or not: the
//! check is skipped, as the engine does, and the engine, which did not see it written, does not
//! delete it at the end), a check's read whose reply is lost (the check fails and is skipped),
//! a client's index hash evicted; a deadline's leave that never reaches Redis (the thread goes
//! on; its queue entry stays, *stale*, until the janitor purges it 1-3 s later: the leave
//! script with `Pass`, which hands a grant it never popped on); an index entry's `HDEL` lost (the
//! entry of an ended wait names another lock than the thread's next wait until that one
//! publishes); a client that crashes (it sends nothing: its queue entries stay stale until
//! purged, its index hash until its TTL, its holds until their leases end, forced; then it
//! starts again). A wait a fault touched is *faulted*: cycles through it, or through a thread
//! with a stale queue or index entry, are exempt from judge (c) (counted), as are cycles through
//! a client with detection off (counted apart).
//!
//! A generator of stale first readings: while a check is in its first reading and its thread
//! is the youngest wait of the model's cycle through it, now and then a member whose wait the
//! check has read (it read the lock that member waits for) leaves at once (its deadline is
//! now), so that the first reading shows a cycle that no longer stands; only the confirming
//! reading tells (without it, judge (a) fails within a few thousand steps on most seeds).
//!
//! Judges (ground truth: the world's model of holds (permits, a read, a write: a lock's is one
//! permit of one) and queue positions per resource, from the replies it saw: acquire
//! `Granted`/`Queued`, release `next`, leave `Left`/`Granted`; a semaphore's release, passing
//! leave or forced release says how many it granted, not whom, so its status, read right after,
//! says whom, and must agree with the model on every other hold).
//!
//! The model's blocked threads and cycles are those the library's graph can prove
//! (graph.rs, which tests cannot reach, so replicated here: `World::holt`): Holt's reduction,
//! the largest set `D` of waiting threads each of whose waits is blocked given `D`: a member of
//! `D` waits ahead of it in the queue, or the permits it wants are more than the capacity less
//! those held by members of `D` (so a free permit, or a holder not blocked, that could serve it
//! proves nothing); its edges go to those members. A *cycle* is a strongly connected set of
//! `D` that holds a cycle (its id: its members' waits by thread and attempt); the threads its
//! proof rests on are the set and every blocked thread reachable from it (whose permits or
//! place keep a member out).
//! - (a) a refusal only of a cycle through the refused thread that the model had between the
//!   check's two readings (the step before the confirming reading's first read; without a
//!   second reading, the decision): what the confirming reading proves, every hold and wait of
//!   it being in both readings (by token and queue time), so standing all the while between
//!   them (a member may leave after its lock's second reading: counted). Each reported member
//!   (resource, holder, how it blocks: its hold's permits and token, or queued ahead; what it
//!   waits for) holds those permits (a lock, a read, a write) or is queued there, and is queued
//!   for what it waits for, in the model, a stale queue entry counting as a wait
//!   (docs/guarantees.md); each member is in `D` of Holt's reduction over the resources the
//!   check read, and keeps the member before it out as reported (an edge of the reduction: no
//!   more than the graph proves from what the check read); every member is believed: no member
//!   whose index entry, as the check read it, names another resource than one the check read
//!   that it is queued for (such an owner's waits are dropped from that reduction, as the
//!   check drops them). The refused thread is the youngest wait (queued last). A graph that
//!   takes any blocked holder for proof that a wait for permits is blocked (a permit free, or
//!   a holder not blocked, could serve it) fails it within a few thousand steps on some seeds
//!   with a semaphore of capacity 2-3 (docs/evidence.md);
//! - (b) at most one refusal per cycle (a cycle: its members' waits, by owner and attempt);
//! - (c) every cycle of the model (above) that is not exempt is broken within
//!   `after + (MAX_RESOURCES + MAX_INDEX_READS + MAX_RESOURCES + 3) R` of the step that closed it:
//!   its youngest wait publishes at `after` / 2 (within `R`) and checks at `after` (its
//!   publication's `R` later), every older member's entry is written by then, the check
//!   publishes (`R`), reads at most 64 times (`R` each) and the leave follows (`R`)
//!   (docs/design.md, "The bound"). Exempt: a cycle whose proof rests on a thread a fault
//!   touched, with a stale queue or index entry, or of a client with detection off. A set that
//!   loses or gains a member is a new cycle (its clock starts again): a set of two cycles that
//!   share a member, one broken, is judged from then on. A graph blind to the semaphores' holds
//!   fails it within a few thousand steps on seeds with a semaphore (docs/evidence.md);
//! - (d) a refused wait leaves no queue entry or hold of that thread in Redis; every index entry
//!   is of a wait under way that published it (or one whose publication's reply or `HDEL` was
//!   lost, or of a crashed client, until its TTL);
//! - (e) liveness: after the steps, faults stop, and every thread's plans complete within
//!   `QUIET_STEPS` steps, every lock free with an empty queue and no index entry left but those
//!   of lost replies.
//!
//! Not in this world: a thread that waits for more of a resource it holds (a plan takes
//! distinct resources, so no reader waits behind a writer for a second read of its own), and a
//! semaphore's capacity changed while held.
//!
//! `cargo test --all-features --test it -- fuzz::deadlock::short` runs a few seeds (about 30 s
//! in a debug build); `FAIRLOCK_DL_FUZZ_SEED=N` one seed, `FAIRLOCK_DL_FUZZ_STEPS` the steps per
//! seed, `FAIRLOCK_DL_FUZZ_SEEDS` how many seeds; the long mode is `fuzz::deadlock::long`
//! (ignored; `scripts/fuzz.sh --deadlock [STEPS]`). A violation prints the seed, the judge and
//! the last 60 steps of the log; a seed replays the same steps (the server's timing aside).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use fairlock::raw::{
    Acquire, ForceUnlock, LateAcquire, Leave, LeaveMode, Mode, RawLock, RawSemaphore, Release,
    Runner, SemAcquire, SemKind, SemLeave, SemRelease, Settings, RW_CAPACITY,
};
use fairlock::raw_deadlock::{
    first_due, next_due, publish_cmds, read_index_cmd, unpublish_cmd, DeadlockCheck, Due,
    IndexedWait, Need, Primitive, MAX_INDEX_READS, MAX_RESOURCES,
};
use fairlock::{Blocking, Deadlock, HoldKind};

use crate::support::rng::Rng;
use crate::support::RedisServer;

const PREFIX: &str = "dlfz";
/// A due step runs within this many ms of virtual time (a wake-up and one round trip).
const R: u64 = 2;
/// The quiet phase's limit (steps).
const QUIET_STEPS: usize = 40_000;
const LEASE: Duration = Duration::from_secs(600);
/// A stale queue entry is purged this long after its wait ended (ms of virtual time): three
/// janitor intervals, the library's default `waiter_timeout` being 3 s.
const PURGE_MIN: u64 = 1000;
const PURGE_MAX: u64 = 3000;

fn env<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[derive(Clone, Debug)]
struct Cfg {
    seed: u64,
    locks: usize,
    clients: usize,
    threads: usize,
    after: u64,
    /// A client with detection off (its waits publish nothing and check nothing), on some seeds.
    off: Option<usize>,
    /// A semaphore of this capacity (1-3), on some odd seeds.
    sem: Option<u64>,
    /// A read/write lock, on some odd seeds.
    rw: bool,
}

impl Cfg {
    fn for_seed(seed: u64) -> Cfg {
        let mut rng = Rng::new(seed ^ 0xD1AD_10C4);
        let mut cfg = Cfg {
            seed,
            locks: rng.range(3, 6) as usize,
            clients: rng.range(2, 4) as usize,
            threads: rng.range(1, 3) as usize,
            after: rng.range(150, 300),
            off: None,
            sem: None,
            rw: false,
        };
        if rng.chance(0.3) {
            cfg.off = Some(rng.below(cfg.clients as u64) as usize);
        }
        if seed % 2 == 1 {
            // one semaphore, one read/write lock, or both
            let shape = rng.below(3);
            if shape != 1 {
                cfg.sem = Some(rng.range(1, 3));
            }
            cfg.rw = shape != 0;
        }
        cfg
    }

    /// Locks, then the semaphore, then the read/write lock.
    fn resources(&self) -> usize {
        self.locks + usize::from(self.sem.is_some()) + usize::from(self.rw)
    }

    /// The bound judge (c) holds a cycle to (ms of virtual time).
    fn bound(&self) -> u64 {
        self.after + (2 * MAX_RESOURCES + MAX_INDEX_READS + 3) as u64 * R
    }
}

/// A check under way: the machine, when its current need became due, and the model's cycle
/// through its thread at each of its steps.
struct Running {
    check: DeadlockCheck,
    since: u64,
    /// The locks it read so far (a status of one of them again starts the confirming reading).
    read: BTreeSet<String>,
    /// The model between the two readings (just before the first read of the confirming
    /// reading); `None` while in the first reading.
    gap: Option<Vec<ModelLock>>,
    /// The index entries it read (owner -> value), its own wait's included.
    hints: BTreeMap<String, Option<String>>,
}

/// What the world does later, on its own (virtual ms).
#[derive(Clone, Copy, Debug)]
enum Timer {
    /// The janitor purges a stale queue entry (thread, lock, attempt): others' heartbeats find
    /// it 3 janitor intervals old (here: the leave script, `Pass`, as the purge hands a grant
    /// it never popped on).
    Purge(usize, usize, u64),
    /// A crashed client's index hash reaches its TTL.
    IndexTtl(usize),
    /// A crashed client's holds reach the end of their leases (forced), and it starts again.
    Restart(usize),
}

/// (resource, holder, its hold's token and permits (`None`: it is queued ahead), what the
/// holder waits for).
type Member = (String, String, Option<(u64, u64)>, String);

/// The edges of each blocked thread in Holt's reduction: (the thread that keeps it out, the
/// resource, through a hold (else: queued ahead)).
type Edges = BTreeMap<usize, Vec<(usize, usize, bool)>>;

struct Wait {
    lock: usize,
    attempt: u64,
    permits: u64,
    deadline: Option<u64>,
    /// The next moment of detection and what it does.
    due_at: u64,
    due: Due,
    running: Option<Running>,
    /// A refusal decided at this time: the leave is due.
    refuse: Option<(u64, Deadlock)>,
    /// The engine's `published` (it deletes the entry at the end only then).
    published: bool,
    /// A release granted it at this time (its pop is due).
    granted_at: Option<u64>,
    faulted: bool,
}

enum Phase {
    /// Between acquisitions (or done with its plans, when `plan` is empty).
    Idle,
    Waiting(Box<Wait>),
    /// Releasing what it holds, innermost first (the plan's end, a refusal or a timeout).
    Unwinding,
}

struct Thr {
    owner: String,
    client: usize,
    plans_left: u32,
    /// (resource, permits: 1 for a lock or a read, `RW_CAPACITY` for a write).
    plan: Vec<(usize, u64)>,
    /// (resource, token, attempt) in the order taken.
    held: Vec<(usize, u64, u64)>,
    phase: Phase,
    busy_until: u64,
    /// Its client crashed: it takes no step until the client starts again.
    crashed: bool,
}

/// The model of one resource (a lock, the semaphore or the read/write lock), from the replies
/// seen (a semaphore's release says how many it granted, not whom, and its leave not even that,
/// though a head that leaves lets in those behind it that fit: its status, read right after,
/// says whom).
#[derive(Default, Clone)]
struct ModelLock {
    /// 1 for a lock, the semaphore's capacity, `RW_CAPACITY`.
    cap: u64,
    /// (thread, attempt, permits, token once known: a lock's hand-off's comes with its pop).
    holds: Vec<(usize, u64, u64, Option<u64>)>,
    /// (thread, attempt, queue sequence number, permits).
    queue: Vec<(usize, u64, u64, u64)>,
}

impl ModelLock {
    /// A lock's holder.
    fn holder(&self) -> Option<usize> {
        self.holds.first().map(|h| h.0)
    }
}

#[derive(Default)]
struct Outcome {
    violation: Option<String>,
    log: Vec<String>,
    stats: BTreeMap<&'static str, u64>,
    steps: usize,
    max_life: u64,
}

struct World {
    cfg: Cfg,
    rng: Rng,
    conn: redis::Connection,
    locks: Vec<RawLock>,
    /// The semaphore and the read/write lock (resources `cfg.locks..`).
    sems: Vec<RawSemaphore>,
    /// Every resource's name (locks `l<i>`, the semaphore `s0`, the read/write lock `rw0`).
    names: Vec<String>,
    model: Vec<ModelLock>,
    thr: Vec<Thr>,
    attempts: Vec<u64>,
    now: u64,
    seq: u64,
    faults: bool,
    /// Cycles standing: id -> (closed at, exempt: 1 a fault or stale entry, 2 a member's client
    /// has detection off).
    standing: BTreeMap<Vec<(usize, u64)>, (u64, u8)>,
    refused: BTreeSet<Vec<(usize, u64)>>,
    /// Index entries the engine will not delete (lost publication replies): (thread, attempt).
    orphans: BTreeSet<(usize, u64)>,
    /// Queue entries of waits that ended without their leave reaching Redis (a lost leave, a
    /// crash): (thread, attempt). They count as waits until the janitor purges them.
    stale: BTreeSet<(usize, u64)>,
    /// Threads whose index entry is a leftover of an earlier wait (its `HDEL` was lost), until
    /// they publish again.
    stale_index: BTreeSet<usize>,
    timers: Vec<(u64, Timer)>,
    out: Outcome,
}

type Res<T> = std::result::Result<T, String>;

fn client_id(seed: u64, c: usize) -> String {
    format!("dl{seed:x}c{c}")
}

impl World {
    fn new(cfg: &Cfg, server: &RedisServer) -> World {
        // a server without functions (Redis 6.2 has no FCALL) runs the scripts with EVALSHA,
        // as the client chooses there (the server matrix runs this world on 6.2)
        let runner = if crate::support::has_command(&mut server.conn(), "FCALL") {
            Runner::Functions
        } else {
            Runner::Eval
        };
        let settings = Settings {
            waiter_timeout: Duration::from_secs(600),
            runner,
            ..Settings::default()
        };
        let rng = Rng::new(cfg.seed);
        let mut names: Vec<String> = (0..cfg.locks).map(|i| format!("l{i}")).collect();
        let locks = names
            .iter()
            .map(|n| RawLock::new(PREFIX, n, settings).unwrap())
            .collect();
        let mut model = vec![
            ModelLock {
                cap: 1,
                ..ModelLock::default()
            };
            cfg.locks
        ];
        let mut sems = vec![];
        let shapes = [
            cfg.sem.map(|c| ("s0", SemKind::Semaphore, c)),
            cfg.rw.then_some(("rw0", SemKind::ReadWrite, RW_CAPACITY)),
        ];
        for (name, kind, cap) in shapes.into_iter().flatten() {
            sems.push(RawSemaphore::new(PREFIX, name, kind, cap, settings).unwrap());
            names.push(name.to_string());
            model.push(ModelLock {
                cap,
                ..ModelLock::default()
            });
        }
        let mut thr = vec![];
        for c in 0..cfg.clients {
            for t in 0..cfg.threads {
                thr.push(Thr {
                    owner: format!("{}:{t}", client_id(cfg.seed, c)),
                    client: c,
                    plans_left: u32::MAX,
                    plan: vec![],
                    held: vec![],
                    phase: Phase::Idle,
                    busy_until: 0,
                    crashed: false,
                });
            }
        }
        let mut w = World {
            cfg: cfg.clone(),
            rng,
            conn: server.conn(),
            locks,
            sems,
            names,
            model,
            thr,
            attempts: vec![1; cfg.clients],
            now: 0,
            seq: 0,
            faults: true,
            standing: BTreeMap::new(),
            refused: BTreeSet::new(),
            orphans: BTreeSet::new(),
            stale: BTreeSet::new(),
            stale_index: BTreeSet::new(),
            timers: vec![],
            out: Outcome::default(),
        };
        for t in 0..w.thr.len() {
            w.new_plan(t);
        }
        w
    }

    fn count(&mut self, what: &'static str) {
        *self.out.stats.entry(what).or_default() += 1;
    }

    fn log(&mut self, line: String) {
        self.out.log.push(format!("[{} ms] {line}", self.now));
    }

    fn new_plan(&mut self, t: usize) {
        let th = &self.thr[t];
        if th.plans_left == 0 {
            self.thr[t].plan.clear();
            return;
        }
        let n = self.rng.range(2, 3.min(self.cfg.locks as u64)) as usize;
        let mut plan: Vec<(usize, u64)> = vec![];
        while plan.len() < n {
            let r = self.rng.below(self.cfg.resources() as u64) as usize;
            if plan.iter().any(|p| p.0 == r) {
                continue;
            }
            let cap = self.model[r].cap;
            let permits = if cap == RW_CAPACITY {
                // a read or a write
                if self.rng.chance(0.5) {
                    1
                } else {
                    RW_CAPACITY
                }
            } else {
                self.rng.range(1, cap)
            };
            plan.push((r, permits));
        }
        self.thr[t].plan = plan;
    }

    fn is_sem(&self, r: usize) -> bool {
        r >= self.cfg.locks
    }

    /// What a wait for (or hold of) `permits` of `r` is.
    fn kind_of(&self, r: usize, permits: u64) -> HoldKind {
        match (self.is_sem(r), self.model[r].cap == RW_CAPACITY) {
            (false, _) => HoldKind::Lock,
            (true, false) => HoldKind::Semaphore,
            (true, true) if permits == RW_CAPACITY => HoldKind::Write,
            (true, true) => HoldKind::Read,
        }
    }

    fn wake_key(&self, r: usize, owner: &str) -> String {
        if self.is_sem(r) {
            self.sems[r - self.cfg.locks].wake_key(owner)
        } else {
            self.locks[r].wake_key(owner)
        }
    }

    /// A semaphore's holds changed in Redis by a count the reply gave (a release, a leave's
    /// pass, a forced release): its status says which waiters were granted; the model follows
    /// (and must agree with it on every other hold).
    fn reconcile(&mut self, r: usize) -> Res<()> {
        let st = self.sems[r - self.cfg.locks]
            .status()
            .run(&mut self.conn)
            .map_err(|e| format!("sem status: {e}"))?;
        for h in &self.model[r].holds {
            let id = format!("{}#{}", self.thr[h.0].owner, h.1);
            if !st.holds.iter().any(|x| x.id == id) {
                return Err(format!(
                    "model: t{}'s hold of {} is gone from Redis: {st:?}",
                    h.0, self.names[r]
                ));
            }
        }
        for h in st.holds {
            let Some((owner, attempt)) = h.id.rsplit_once('#') else {
                return Err(format!("a hold id {}", h.id));
            };
            let attempt: u64 = attempt.parse().map_err(|_| format!("hold id {}", h.id))?;
            let n = self
                .thread_of(owner)
                .ok_or_else(|| format!("a hold of unknown {owner}"))?;
            if self.model[r]
                .holds
                .iter()
                .any(|x| x.0 == n && x.1 == attempt)
            {
                continue;
            }
            let Some(pos) = self.model[r]
                .queue
                .iter()
                .position(|q| q.0 == n && q.1 == attempt)
            else {
                return Err(format!(
                    "model: {} granted to t{n} #{attempt}, which was not queued",
                    self.names[r]
                ));
            };
            let (_, _, _, permits) = self.model[r].queue.remove(pos);
            if permits != h.permits {
                return Err(format!(
                    "model: t{n} wanted {permits}, granted {}",
                    h.permits
                ));
            }
            self.model[r]
                .holds
                .push((n, attempt, permits, Some(h.token)));
            self.log(format!(
                "t{n} granted {} ({permits}) token {}",
                self.names[r], h.token
            ));
            if self.stale.contains(&(n, attempt)) {
                self.count("grants to a stale queue entry");
                continue;
            }
            let now = self.now;
            match &mut self.thr[n].phase {
                Phase::Waiting(w) if w.lock == r && w.attempt == attempt => {
                    w.granted_at = Some(now)
                }
                _ => {
                    return Err(format!(
                        "model: {} granted to t{n}, which does not wait for it",
                        self.names[r]
                    ))
                }
            }
        }
        Ok(())
    }

    fn thread_of(&self, owner: &str) -> Option<usize> {
        self.thr.iter().position(|t| t.owner == owner)
    }

    fn meta(t: usize) -> String {
        format!("fuzz|1|t{t}")
    }

    // ---- what is due ----

    /// The thread's due item: (since, what), or its next future event.
    fn due_of(&self, t: usize) -> Option<(u64, &'static str)> {
        let Phase::Waiting(w) = &self.thr[t].phase else {
            return None;
        };
        if let Some((at, _)) = &w.refuse {
            return Some((*at, "refuse"));
        }
        if let Some(at) = w.granted_at {
            return Some((at, "pop"));
        }
        if let Some(d) = w.deadline {
            if d <= self.now {
                return Some((d, "deadline"));
            }
        }
        if let Some(r) = &w.running {
            return Some((r.since, "read"));
        }
        let next = w.deadline.map_or(w.due_at, |d| d.min(w.due_at));
        Some((
            next,
            if next == w.due_at {
                "moment"
            } else {
                "deadline"
            },
        ))
    }

    /// The latest virtual time the clock may advance to.
    fn time_limit(&self) -> u64 {
        let mut limit = u64::MAX;
        for t in 0..self.thr.len() {
            if let Some((since, _)) = self.due_of(t) {
                let hard = if since <= self.now { since + R } else { since };
                limit = limit.min(hard);
            }
        }
        for (at, _) in &self.timers {
            limit = limit.min((*at).max(self.now));
        }
        limit
    }

    // ---- steps ----

    fn step(&mut self) -> Res<()> {
        if let Some(i) = self.timers.iter().position(|(at, _)| *at <= self.now) {
            let (_, timer) = self.timers.remove(i);
            return self.run_timer(timer);
        }
        // the candidates: due items, thread actions, a heartbeat, faults, time
        let mut cands: Vec<(usize, u8)> = vec![];
        for t in 0..self.thr.len() {
            let th = &self.thr[t];
            if th.crashed {
                continue;
            }
            match &th.phase {
                Phase::Waiting(_) => {
                    if let Some((since, _)) = self.due_of(t) {
                        if since <= self.now {
                            cands.push((t, 0));
                        }
                    }
                }
                Phase::Idle | Phase::Unwinding => {
                    let active = !th.plan.is_empty() || !th.held.is_empty();
                    if active && th.busy_until <= self.now {
                        cands.push((t, 1));
                    }
                }
            }
        }
        let limit = self.time_limit();
        let can_tick = self.now < limit;
        let roll = self.rng.below(100);
        if can_tick && (cands.is_empty() || roll < 25) {
            let mut ms = self.rng.range(1, 8);
            if cands.is_empty() {
                // nothing to do before the next event: go there
                let next_busy = self
                    .thr
                    .iter()
                    .filter(|t| !t.plan.is_empty() || !t.held.is_empty())
                    .filter(|t| !matches!(t.phase, Phase::Waiting(_)) && !t.crashed)
                    .map(|t| t.busy_until)
                    .chain(self.timers.iter().map(|x| x.0))
                    .min()
                    .unwrap_or(u64::MAX);
                ms = ms.max(next_busy.min(limit).saturating_sub(self.now));
            }
            self.now = (self.now + ms).min(limit);
            return Ok(());
        }
        if self.faults && roll == 26 && self.rng.chance(0.2) {
            return self.evict_index();
        }
        if self.faults && roll == 27 && self.rng.chance(0.05) {
            return self.crash();
        }
        if roll < 28 {
            return self.heartbeat();
        }
        if cands.is_empty() {
            return Err(format!(
                "(e) liveness: nothing can happen at {} ms",
                self.now
            ));
        }
        let (t, kind) = cands[self.rng.below(cands.len() as u64) as usize];
        if kind == 1 {
            return self.act(t);
        }
        let (_, what) = self.due_of(t).expect("due");
        match what {
            "refuse" => self.refuse_leave(t),
            "pop" => self.pop(t),
            "deadline" => self.deadline_leave(t),
            "read" => self.read(t),
            _ => self.moment(t),
        }
    }

    fn act(&mut self, t: usize) -> Res<()> {
        let th = &self.thr[t];
        let unwinding = matches!(th.phase, Phase::Unwinding);
        if !unwinding && th.held.len() < th.plan.len() {
            let (l, permits) = th.plan[th.held.len()];
            if self.model[l].holds.iter().any(|h| h.0 == t)
                || self.model[l].queue.iter().any(|q| q.0 == t)
            {
                // its stale entry (or a grant to it) is still there: wait for the purge
                self.thr[t].busy_until = self.now + 10;
                return Ok(());
            }
            return self.acquire(t, l, permits);
        }
        if let Some(&(l, token, attempt)) = self.thr[t].held.last() {
            self.thr[t].phase = Phase::Unwinding;
            return self.release(t, l, token, attempt);
        }
        // released everything: the plan is over
        self.thr[t].phase = Phase::Idle;
        self.thr[t].plans_left = self.thr[t].plans_left.saturating_sub(1);
        self.new_plan(t);
        self.thr[t].busy_until = self.now + self.rng.below(40);
        self.count("plans ended");
        Ok(())
    }

    fn acquire(&mut self, t: usize, l: usize, permits: u64) -> Res<()> {
        let c = self.thr[t].client;
        let attempt = self.attempts[c];
        self.attempts[c] += 1;
        let owner = self.thr[t].owner.clone();
        let (granted, queued) = if self.is_sem(l) {
            let call = self.sems[l - self.cfg.locks].acquire(
                &owner,
                attempt,
                permits,
                LEASE,
                Mode::Wait,
                &Self::meta(t),
            );
            let reply = call
                .run(&mut self.conn)
                .map_err(|e| format!("sem acquire: {e}"))?;
            self.log(format!(
                "t{t} acquire {} ({permits}) #{attempt}: {reply:?}",
                self.names[l]
            ));
            match reply {
                SemAcquire::Granted { token, .. } => (Some(token), false),
                SemAcquire::Queued { .. } => (None, true),
                other => return Err(format!("sem acquire of a new attempt answered {other:?}")),
            }
        } else {
            let call = self.locks[l].acquire(&owner, attempt, LEASE, Mode::Wait, &Self::meta(t));
            let reply = call
                .run(&mut self.conn)
                .map_err(|e| format!("acquire: {e}"))?;
            self.log(format!("t{t} acquire l{l} #{attempt}: {reply:?}"));
            match reply {
                Acquire::Granted(g) => (Some(g.token), false),
                Acquire::Queued { .. } => (None, true),
                other => return Err(format!("acquire of a new attempt answered {other:?}")),
            }
        };
        if let Some(token) = granted {
            let used: u64 = self.model[l].holds.iter().map(|h| h.2).sum();
            if used + permits > self.model[l].cap {
                return Err(format!(
                    "model: {} granted to t{t} while {used} held",
                    self.names[l]
                ));
            }
            self.model[l].holds.push((t, attempt, permits, Some(token)));
            self.thr[t].held.push((l, token, attempt));
            self.thr[t].busy_until = self.now + self.rng.below(30);
        }
        if queued {
            {
                self.seq += 1;
                let seq = self.seq;
                self.model[l].queue.push((t, attempt, seq, permits));
                // (a client with detection off times its waits out: nothing else breaks its
                // cycles)
                let timed = self.cfg.off == Some(c) || self.rng.chance(0.3);
                let deadline = timed.then(|| self.now + self.rng.range(100, 1500));
                let (mut at, due) = first_due(Duration::from_millis(self.cfg.after));
                if self.cfg.off == Some(c) {
                    // detection off: no moment ever comes
                    at = Duration::from_millis(u64::MAX / 4);
                }
                self.thr[t].phase = Phase::Waiting(Box::new(Wait {
                    lock: l,
                    attempt,
                    permits,
                    deadline,
                    due_at: self.now + at.as_millis() as u64,
                    due,
                    running: None,
                    refuse: None,
                    published: false,
                    granted_at: None,
                    faulted: false,
                }));
            }
        }
        Ok(())
    }

    fn release(&mut self, t: usize, l: usize, token: u64, attempt: u64) -> Res<()> {
        let owner = self.thr[t].owner.clone();
        if self.is_sem(l) {
            let reply = self.sems[l - self.cfg.locks]
                .release(&owner, attempt, token, false)
                .run(&mut self.conn)
                .map_err(|e| format!("sem release: {e}"))?;
            self.log(format!("t{t} release {}: {reply:?}", self.names[l]));
            let SemRelease::Released { .. } = reply else {
                return Err(format!("release of a hold answered {reply:?}"));
            };
            self.thr[t].held.pop();
            self.thr[t].busy_until = self.now + self.rng.below(20);
            self.model[l]
                .holds
                .retain(|h| !(h.0 == t && h.1 == attempt));
            return self.reconcile(l);
        }
        let reply = self.locks[l]
            .release(&owner, token, 1)
            .run(&mut self.conn)
            .map_err(|e| format!("release: {e}"))?;
        self.log(format!("t{t} release l{l}: {reply:?}"));
        let Release::Released { next } = reply else {
            return Err(format!("release of a hold answered {reply:?}"));
        };
        self.thr[t].held.pop();
        self.thr[t].busy_until = self.now + self.rng.below(20);
        self.hand_on(l, next)
    }

    /// `l`'s hold ended and Redis handed it to `next` (a release, a forced release, a purge's
    /// pass): the model follows.
    fn hand_on(&mut self, l: usize, next: Option<String>) -> Res<()> {
        self.model[l].holds.clear();
        let Some(next) = next else {
            return Ok(());
        };
        let n = self
            .thread_of(&next)
            .ok_or_else(|| format!("granted to unknown {next}"))?;
        let Some(pos) = self.model[l].queue.iter().position(|q| q.0 == n) else {
            return Err(format!("model: l{l} granted to t{n}, which was not queued"));
        };
        let (_, attempt, _, _) = self.model[l].queue.remove(pos);
        self.model[l].holds.push((n, attempt, 1, None));
        if self.stale.contains(&(n, attempt)) {
            // nobody pops it: the purge passes it on
            self.count("grants to a stale queue entry");
            return Ok(());
        }
        let now = self.now;
        match &mut self.thr[n].phase {
            Phase::Waiting(w) if w.lock == l && w.attempt == attempt => w.granted_at = Some(now),
            _ => {
                return Err(format!(
                    "model: l{l} granted to t{n}, which does not wait for it"
                ))
            }
        }
        Ok(())
    }

    /// The wait of `t` ended (granted, left): delete its entry if it published one, as the
    /// engine's `unpublish` does.
    fn end_wait(&mut self, t: usize) -> Res<Box<Wait>> {
        let phase = std::mem::replace(&mut self.thr[t].phase, Phase::Idle);
        let Phase::Waiting(w) = phase else {
            return Err("end_wait of no wait".into());
        };
        if w.published {
            if self.faults && self.rng.chance(0.05) {
                // the HDEL is lost: the entry, of a wait that ended, stays (and names another
                // lock than the thread's next wait, until that one publishes)
                self.orphans.insert((t, w.attempt));
                self.stale_index.insert(t);
                self.count("faults: an index entry's HDEL lost");
                self.log(format!("t{t} HDEL lost"));
            } else {
                let owner = self.thr[t].owner.clone();
                let () = unpublish_cmd(PREFIX, &owner)
                    .query(&mut self.conn)
                    .map_err(|e| format!("HDEL: {e}"))?;
            }
        }
        // (an entry the engine does not know it wrote stays: its TTL ends it)
        Ok(w)
    }

    fn pop(&mut self, t: usize) -> Res<()> {
        let Phase::Waiting(w) = &self.thr[t].phase else {
            unreachable!()
        };
        let (l, attempt) = (w.lock, w.attempt);
        let owner = self.thr[t].owner.clone();
        let key = self.wake_key(l, &owner);
        // the client's list may hold messages of its other threads and stale ones: take them
        // in order until this thread's grant
        for _ in 0..64 {
            let msg: Option<String> = redis::cmd("LPOP")
                .arg(&key)
                .query(&mut self.conn)
                .map_err(|e| format!("LPOP: {e}"))?;
            let Some(msg) = msg else {
                return Err(format!(
                    "t{t} was granted l{l} (release reply) and its wake list has no grant"
                ));
            };
            let thread = msg.split('|').next().unwrap_or("");
            let wake = fairlock::raw::parse_wake(&msg).map_err(|e| e.to_string())?;
            if owner.ends_with(&format!(":{thread}")) && wake.attempt() == attempt {
                let fairlock::raw::Wake::Grant { token, .. } = wake else {
                    return Err(format!("t{t}: {msg}"));
                };
                self.log(format!("t{t} pop {}: grant token {token}", self.names[l]));
                self.set_token(l, t, attempt, token)?;
                self.end_wait(t)?;
                self.thr[t].held.push((l, token, attempt));
                self.thr[t].busy_until = self.now + self.rng.below(30);
                return Ok(());
            }
            // another thread's (it is granted too, and will find its message gone: put back)
            let other = self.thr.iter().position(|x| {
                x.client == self.thr[t].client && x.owner.ends_with(&format!(":{thread}"))
            });
            let live = other.is_some_and(|o| {
                matches!(&self.thr[o].phase, Phase::Waiting(ow) if ow.attempt == wake.attempt() && ow.lock == l)
            });
            if live {
                let () = redis::cmd("RPUSH")
                    .arg(&key)
                    .arg(&msg)
                    .query(&mut self.conn)
                    .map_err(|e| format!("RPUSH: {e}"))?;
            } else {
                self.count("stale wake-ups popped");
            }
        }
        Err("pop: no grant in 64 messages".into())
    }

    /// `t` leaves its wait, keeping a grant that came meanwhile: its token, if so.
    fn leave_claim(&mut self, t: usize) -> Res<Option<u64>> {
        let Phase::Waiting(w) = &self.thr[t].phase else {
            unreachable!()
        };
        let (l, attempt) = (w.lock, w.attempt);
        let owner = self.thr[t].owner.clone();
        let reply = if self.is_sem(l) {
            let reply = self.sems[l - self.cfg.locks]
                .leave(&owner, attempt, false, true)
                .run(&mut self.conn)
                .map_err(|e| format!("sem leave: {e}"))?;
            match reply {
                SemLeave::Left => {
                    // a head that leaves may let those behind it in (readers behind a writer)
                    self.model[l].queue.retain(|q| q.0 != t);
                    self.reconcile(l)?;
                    Leave::Left
                }
                SemLeave::Granted { token, .. } => {
                    self.set_token(l, t, attempt, token)?;
                    return Ok(Some(token));
                }
                other => return Err(format!("sem leave claim answered {other:?}")),
            }
        } else {
            self.locks[l]
                .leave(&owner, attempt, LeaveMode::Claim, LateAcquire::Impossible)
                .run(&mut self.conn)
                .map_err(|e| format!("leave: {e}"))?
        };
        match &reply {
            Leave::Left => {
                self.model[l].queue.retain(|q| q.0 != t);
                if self.model[l].holds.iter().any(|h| h.0 == t) {
                    return Err(format!(
                        "model: t{t} holds {} but its leave says Left",
                        self.names[l]
                    ));
                }
                Ok(None)
            }
            Leave::Granted(g) => {
                self.set_token(l, t, attempt, g.token)?;
                Ok(Some(g.token))
            }
            other => Err(format!("leave claim answered {other:?}")),
        }
    }

    /// `t`'s hold of `l` (of `attempt`, granted meanwhile) has `token`, as its pop or claim
    /// says.
    fn set_token(&mut self, l: usize, t: usize, attempt: u64, token: u64) -> Res<()> {
        let name = self.names[l].clone();
        let Some(h) = self.model[l]
            .holds
            .iter_mut()
            .find(|h| h.0 == t && h.1 == attempt)
        else {
            return Err(format!(
                "model: t{t} claimed {name}, which it was not granted"
            ));
        };
        if h.3.is_some_and(|k| k != token) {
            return Err(format!(
                "model: t{t}'s token of {name} is {:?}, not {token}",
                h.3
            ));
        }
        h.3 = Some(token);
        Ok(())
    }

    fn deadline_leave(&mut self, t: usize) -> Res<()> {
        if self.faults && self.rng.chance(0.1) {
            // the leave never reaches Redis: its queue entry stays, stale, until the janitor
            // purges it; the thread goes on as if it left
            let Phase::Waiting(w) = &self.thr[t].phase else {
                unreachable!()
            };
            let (l, attempt) = (w.lock, w.attempt);
            self.stale.insert((t, attempt));
            let at = self.now + self.rng.range(PURGE_MIN, PURGE_MAX);
            self.timers.push((at, Timer::Purge(t, l, attempt)));
            self.count("faults: a leave lost (a stale queue entry)");
            self.log(format!("t{t} leave at deadline of l{l} #{attempt}: lost"));
            return self.after_leave(t, None, "timed out");
        }
        let reply = self.leave_claim(t)?;
        self.log(format!("t{} leave at deadline: {reply:?}", t));
        self.after_leave(t, reply, "timed out")
    }

    fn after_leave(&mut self, t: usize, reply: Option<u64>, why: &'static str) -> Res<()> {
        let w = self.end_wait(t)?;
        match reply {
            Some(token) => {
                self.thr[t].held.push((w.lock, token, w.attempt));
                self.count("grants claimed at a leave");
            }
            None => {
                self.count(why);
                self.thr[t].phase = Phase::Unwinding;
            }
        }
        self.thr[t].busy_until = self.now;
        Ok(())
    }

    fn refuse_leave(&mut self, t: usize) -> Res<()> {
        let reply = self.leave_claim(t)?;
        self.log(format!("t{t} refusal's leave: {reply:?}"));
        let l = match &self.thr[t].phase {
            Phase::Waiting(w) => w.lock,
            _ => unreachable!(),
        };
        let refused = reply.is_none();
        self.after_leave(t, reply, "refusals (Error::Deadlock)")?;
        if refused {
            // (d) the refused attempt left nothing in Redis
            let owner = self.thr[t].owner.clone();
            if self.is_sem(l) {
                let st = self.sems[l - self.cfg.locks]
                    .status()
                    .run(&mut self.conn)
                    .map_err(|e| format!("sem status: {e}"))?;
                if st.waiters.iter().any(|q| q.owner == owner)
                    || st
                        .holds
                        .iter()
                        .any(|h| h.id.rsplit_once('#').is_some_and(|(o, _)| o == owner))
                {
                    return Err(format!(
                        "(d) t{t}'s refused wait for {} left a hold or queue entry: {st:?}",
                        self.names[l]
                    ));
                }
            } else {
                let st = self.locks[l]
                    .status()
                    .run(&mut self.conn)
                    .map_err(|e| format!("status: {e}"))?;
                if st.owner == owner || st.queue.iter().any(|q| q.0 == owner) {
                    return Err(format!(
                        "(d) t{t}'s refused wait for l{l} left a hold or queue entry: {st:?}"
                    ));
                }
            }
        }
        Ok(())
    }

    fn moment(&mut self, t: usize) -> Res<()> {
        let after = Duration::from_millis(self.cfg.after);
        let owner = self.thr[t].owner.clone();
        let (l, attempt, permits, due, published) = match &self.thr[t].phase {
            Phase::Waiting(w) => (w.lock, w.attempt, w.permits, w.due, w.published),
            _ => unreachable!(),
        };
        let wait = IndexedWait::new(self.kind_of(l, permits), attempt, permits, &self.names[l]);
        // a lost reply: applied or not, the engine sees an error
        let fault = self.faults && self.rng.chance(0.03);
        let applied = !fault || self.rng.chance(0.5);
        if applied {
            for cmd in publish_cmds(PREFIX, &owner, &wait, Duration::from_secs(600)) {
                let () = cmd
                    .query(&mut self.conn)
                    .map_err(|e| format!("publish: {e}"))?;
            }
            self.stale_index.remove(&t);
        }
        let now = self.now;
        if fault {
            if applied && !published {
                self.orphans.insert((t, attempt));
            }
            self.count("faults: a publication's reply lost");
            self.log(format!("t{t} publish (reply lost, applied {applied})"));
        } else {
            self.log(format!("t{t} publish ({due:?})"));
        }
        let Phase::Waiting(w) = &mut self.thr[t].phase else {
            unreachable!()
        };
        if fault || due == Due::Publish {
            w.faulted |= fault;
            w.published |= !fault;
            let (at, next) = next_due(after, due);
            w.due_at = now + at.as_millis() as u64;
            w.due = next;
            return Ok(());
        }
        w.published = true;
        w.running = Some(Running {
            check: DeadlockCheck::new(&owner, &wait),
            since: now,
            read: BTreeSet::new(),
            gap: None,
            hints: BTreeMap::from([(owner.clone(), Some(wait.encode()))]),
        });
        self.count("checks");
        Ok(())
    }

    fn read(&mut self, t: usize) -> Res<()> {
        let after = Duration::from_millis(self.cfg.after);
        let fault = self.faults && self.rng.chance(0.01);
        let stall = if self.faults && self.rng.chance(0.03) {
            self.rng.range(10, self.cfg.after / 2)
        } else {
            0
        };
        let now = self.now;
        let snapshot = self.model.clone();
        let World {
            thr,
            locks,
            sems,
            names,
            conn,
            cfg,
            ..
        } = self;
        let Phase::Waiting(w) = &mut thr[t].phase else {
            unreachable!()
        };
        let r = w.running.as_mut().expect("running");
        if stall > 0 {
            // the checking thread stalls between two reads (a pause): others act meanwhile
            r.since = now + stall;
            w.faulted = true;
            self.count("faults: a check stalled between two reads");
            self.log(format!("t{t} check stalls {stall} ms"));
            return Ok(());
        }
        let need = r.check.need();
        if let Need::Status { name, .. } = &need {
            // a lock read again: the first reading is over, the confirming one begins
            if !r.read.insert(name.clone()) && r.gap.is_none() {
                r.gap = Some(snapshot);
            }
        }
        let what = format!("{need:?}");
        match need {
            Need::Status {
                primitive: Primitive::Lock,
                name,
            } => {
                let l = names
                    .iter()
                    .position(|n| *n == name)
                    .ok_or_else(|| format!("a check asked for unknown {name}"))?;
                let st = locks[l]
                    .status()
                    .run(conn)
                    .map_err(|e| format!("status: {e}"))?;
                if !fault {
                    r.check.feed_lock_status(st);
                }
            }
            Need::Index { owner } => {
                let v: Option<String> = read_index_cmd(PREFIX, &owner)
                    .query(conn)
                    .map_err(|e| format!("HGET: {e}"))?;
                if !fault {
                    r.hints.insert(owner, v.clone());
                    r.check.feed_index(v);
                }
            }
            Need::Status {
                primitive: Primitive::Semaphore,
                name,
            } => {
                let s = names[cfg.locks..]
                    .iter()
                    .position(|n| *n == name)
                    .ok_or_else(|| format!("a check asked for unknown semaphore {name}"))?;
                let st = sems[s]
                    .status()
                    .run(conn)
                    .map_err(|e| format!("sem status: {e}"))?;
                if !fault {
                    r.check.feed_semaphore_status(st);
                }
            }
            other => return Err(format!("a check needs {other:?}")),
        }
        r.since = now;
        let line = format!("t{t} check read {what}");
        let found = if fault {
            None
        } else {
            match r.check.need() {
                Need::Done(found) => Some(found),
                _ => {
                    let first_reading = r.gap.is_none();
                    self.log(line);
                    if first_reading && self.faults && self.rng.chance(0.2) {
                        self.leave_mid_reading(t);
                    }
                    return Ok(());
                }
            }
        };
        // the check is over (or failed): the next one comes `after` from now
        let (gap, hints, read) = w
            .running
            .take()
            .map(|r| (r.gap, r.hints, r.read))
            .unwrap_or_default();
        w.faulted |= fault;
        w.due_at = now + next_due(after, Due::Check).0.as_millis() as u64;
        w.due = Due::Check;
        let Some(found) = found else {
            self.count("faults: a check's read lost (check skipped)");
            self.log(format!("{line}: reply lost"));
            return Ok(());
        };
        let Some(d) = found else {
            self.log(format!("{line}: done, no refusal"));
            return Ok(());
        };
        w.refuse = Some((now, d.clone()));
        self.log(format!("{line}: REFUSE {}", describe(&d)));
        self.count("refusals decided");
        self.judge_refusal(t, &d, gap, &hints, &read)
    }

    /// The generator of stale first readings: while `t`'s check is in its first reading and
    /// `t` is the youngest wait of the model's cycle through it, a member whose wait the check
    /// has read (the lock it waits for was read) leaves: its deadline is now. The first reading
    /// then shows a cycle that no longer stands; only the confirming reading can tell.
    fn leave_mid_reading(&mut self, t: usize) {
        let Some(cycle) = self.cycle_through(t) else {
            return;
        };
        let youngest = cycle.iter().max_by_key(|&&m| self.queue_seq(m)).copied();
        if youngest != Some(t) {
            return;
        }
        let read = match &self.thr[t].phase {
            Phase::Waiting(w) => w
                .running
                .as_ref()
                .map(|r| r.read.clone())
                .unwrap_or_default(),
            _ => return,
        };
        let read_members: Vec<usize> = cycle
            .iter()
            .copied()
            .filter(|&m| m != t)
            .filter(|&m| {
                self.waits_for(m)
                    .is_some_and(|l| read.contains(&self.names[l]))
            })
            .collect();
        if read_members.is_empty() {
            return;
        }
        let m = read_members[self.rng.below(read_members.len() as u64) as usize];
        let now = self.now;
        if let Phase::Waiting(w) = &mut self.thr[m].phase {
            if w.refuse.is_none() && w.granted_at.is_none() {
                w.deadline = Some(now);
                self.count(
                    "targeted: a member whose wait a first reading read leaves (deadline now)",
                );
                self.log(format!(
                    "t{m} made to leave while t{t}'s check is in its first reading"
                ));
            }
        }
    }

    /// A client crashes: it sends nothing more. Its queue entries stay (stale) until the
    /// janitor purges them, its index hash until its TTL, its holds until their leases end; then
    /// it starts again.
    fn crash(&mut self) -> Res<()> {
        if self.thr.iter().any(|x| x.crashed) {
            return Ok(());
        }
        let c = self.rng.below(self.cfg.clients as u64) as usize;
        for t in 0..self.thr.len() {
            if self.thr[t].client != c {
                continue;
            }
            self.thr[t].crashed = true;
            let phase = std::mem::replace(&mut self.thr[t].phase, Phase::Idle);
            if let Phase::Waiting(w) = phase {
                self.stale.insert((t, w.attempt));
                let at = self.now + self.rng.range(PURGE_MIN, PURGE_MAX);
                self.timers.push((at, Timer::Purge(t, w.lock, w.attempt)));
                if w.published {
                    self.orphans.insert((t, w.attempt));
                }
            }
        }
        let ttl = 1000.max(3 * self.cfg.after);
        self.timers.push((self.now + ttl, Timer::IndexTtl(c)));
        let restart = self.now + ttl.max(PURGE_MAX) + self.rng.range(1, 1000);
        self.timers.push((restart, Timer::Restart(c)));
        self.count("faults: a client crashed");
        self.log(format!("client {c} crashes"));
        Ok(())
    }

    fn run_timer(&mut self, timer: Timer) -> Res<()> {
        match timer {
            Timer::Purge(t, l, attempt) => {
                let owner = self.thr[t].owner.clone();
                if self.is_sem(l) {
                    let reply = self.sems[l - self.cfg.locks]
                        .leave(&owner, attempt, false, false)
                        .run(&mut self.conn)
                        .map_err(|e| format!("sem purge: {e}"))?;
                    self.log(format!(
                        "janitor purges t{t}'s stale entry {} #{attempt}: {reply:?}",
                        self.names[l]
                    ));
                    match reply {
                        SemLeave::Left => {
                            self.model[l]
                                .queue
                                .retain(|q| !(q.0 == t && q.1 == attempt));
                            self.reconcile(l)?;
                        }
                        SemLeave::Passed { .. } => {
                            let before = self.model[l].holds.len();
                            self.model[l]
                                .holds
                                .retain(|h| !(h.0 == t && h.1 == attempt));
                            if self.model[l].holds.len() == before {
                                return Err(format!(
                                    "model: a purge of t{t} passed {} on, not held",
                                    self.names[l]
                                ));
                            }
                            self.reconcile(l)?;
                        }
                        other => return Err(format!("a purge's leave answered {other:?}")),
                    }
                    self.stale.remove(&(t, attempt));
                    self.count("stale queue entries purged");
                    return Ok(());
                }
                let reply = self.locks[l]
                    .leave(&owner, attempt, LeaveMode::Pass, LateAcquire::Impossible)
                    .run(&mut self.conn)
                    .map_err(|e| format!("purge: {e}"))?;
                self.log(format!(
                    "janitor purges t{t}'s stale entry l{l} #{attempt}: {reply:?}"
                ));
                match reply {
                    Leave::Left => self.model[l]
                        .queue
                        .retain(|q| !(q.0 == t && q.1 == attempt)),
                    Leave::Passed { next } => {
                        if self.model[l].holder() != Some(t) {
                            return Err(format!("model: a purge of t{t} passed l{l} on, not held"));
                        }
                        self.hand_on(l, next)?;
                    }
                    other => return Err(format!("a purge's leave answered {other:?}")),
                }
                self.stale.remove(&(t, attempt));
                self.count("stale queue entries purged");
            }
            Timer::IndexTtl(c) => {
                let owner = format!("{}:0", client_id(self.cfg.seed, c));
                let () = redis::cmd("DEL")
                    .arg(fairlock::raw_deadlock::index_key(PREFIX, &owner))
                    .query(&mut self.conn)
                    .map_err(|e| format!("DEL: {e}"))?;
                let thr = &self.thr;
                self.orphans.retain(|o| thr[o.0].client != c);
                self.stale_index.retain(|&t| thr[t].client != c);
                self.log(format!("client {c}'s index hash expires"));
            }
            Timer::Restart(c) => {
                for t in 0..self.thr.len() {
                    if self.thr[t].client != c {
                        continue;
                    }
                    let owner = self.thr[t].owner.clone();
                    while let Some((l, token, attempt)) = self.thr[t].held.pop() {
                        if self.is_sem(l) {
                            let reply = self.sems[l - self.cfg.locks]
                                .force_release(&owner, attempt, token)
                                .run(&mut self.conn)
                                .map_err(|e| format!("force_release: {e}"))?;
                            self.log(format!(
                                "t{t}'s lease of {} ends (forced): {reply:?}",
                                self.names[l]
                            ));
                            let SemRelease::Released { .. } = reply else {
                                return Err(format!(
                                    "model: t{t} held {}: {reply:?}",
                                    self.names[l]
                                ));
                            };
                            self.model[l]
                                .holds
                                .retain(|h| !(h.0 == t && h.1 == attempt));
                            self.reconcile(l)?;
                            continue;
                        }
                        let reply = self.locks[l]
                            .force_unlock(&owner, token)
                            .run(&mut self.conn)
                            .map_err(|e| format!("force_unlock: {e}"))?;
                        self.log(format!("t{t}'s lease of l{l} ends (forced): {reply:?}"));
                        let ForceUnlock::Released { next } = reply else {
                            return Err(format!("model: t{t} held l{l}: {reply:?}"));
                        };
                        self.hand_on(l, next)?;
                    }
                    self.thr[t].crashed = false;
                    self.thr[t].busy_until = self.now;
                    self.new_plan(t);
                }
                self.count("crashed clients started again");
                self.log(format!("client {c} starts again"));
            }
        }
        Ok(())
    }

    fn evict_index(&mut self) -> Res<()> {
        let c = self.rng.below(self.cfg.clients as u64) as usize;
        let owner = format!("{}:0", client_id(self.cfg.seed, c));
        let key = fairlock::raw_deadlock::index_key(PREFIX, &owner);
        let n: u64 = redis::cmd("DEL")
            .arg(&key)
            .query(&mut self.conn)
            .map_err(|e| format!("DEL: {e}"))?;
        if n > 0 {
            for th in self.thr.iter_mut().filter(|x| x.client == c) {
                if let Phase::Waiting(w) = &mut th.phase {
                    w.faulted = true;
                }
            }
            let thr = &self.thr;
            self.orphans.retain(|o| thr[o.0].client != c);
            self.stale_index.retain(|&t| thr[t].client != c);
            self.count("faults: an index hash evicted");
            self.log(format!("evict {key}"));
        }
        Ok(())
    }

    fn heartbeat(&mut self) -> Res<()> {
        let c = self.rng.below(self.cfg.clients as u64) as usize;
        let l = self.rng.below(self.cfg.resources() as u64) as usize;
        let waiting: Vec<(String, u64)> = self
            .thr
            .iter()
            .filter(|x| x.client == c)
            .filter_map(|x| match &x.phase {
                Phase::Waiting(w) if w.lock == l => Some((x.owner.clone(), w.attempt)),
                _ => None,
            })
            .collect();
        if self.is_sem(l) {
            let hb = self.sems[l - self.cfg.locks]
                .heartbeat(waiting.iter().map(|(o, a)| (o.as_str(), *a)))
                .run(&mut self.conn)
                .map_err(|e| format!("sem heartbeat: {e}"))?;
            if hb.grants > 0 || !hb.told_to_retry.is_empty() {
                return Err(format!("a heartbeat granted or told to retry: {hb:?}"));
            }
            self.count("heartbeats");
            return Ok(());
        }
        let hb = self.locks[l]
            .heartbeat(waiting.iter().map(|(o, a)| (o.as_str(), *a)))
            .run(&mut self.conn)
            .map_err(|e| format!("heartbeat: {e}"))?;
        if hb.repairs > 0 || !hb.told_to_retry.is_empty() {
            return Err(format!("a heartbeat repaired or told to retry: {hb:?}"));
        }
        self.count("heartbeats");
        Ok(())
    }

    // ---- the model's cycles and the judges ----

    /// What `t` waits for, by the model (its wait under way, not a stale entry).
    fn waits_for(&self, t: usize) -> Option<usize> {
        self.model.iter().position(|m| {
            m.queue
                .iter()
                .any(|q| q.0 == t && !self.stale.contains(&(t, q.1)))
        })
    }

    /// Holt's reduction over `snap`, as the library's graph (graph.rs) does it: the threads
    /// proven blocked (`D`, the largest set of waiting threads each of whose waits is blocked
    /// given `D`: a member of `D` waits ahead of it in the queue, or the permits it wants are
    /// more than the capacity less those held by members of `D`, one of them at least) and each
    /// one's edges (thread, resource, through a hold: else queued ahead). Every queue entry
    /// counts as a wait (a stale one too: Redis shows it), but only in the resources `only`
    /// names (all: `None`), and none of the threads `unbelieved`.
    fn holt(
        &self,
        snap: &[ModelLock],
        only: Option<&BTreeSet<String>>,
        unbelieved: &BTreeSet<usize>,
    ) -> (BTreeSet<usize>, Edges) {
        let looked = |r: usize| only.is_none_or(|o| o.contains(&self.names[r]));
        // the queues as the graph sees them: (thread, permits) in order
        let queues: Vec<Vec<(usize, u64)>> = snap
            .iter()
            .enumerate()
            .map(|(r, m)| {
                if !looked(r) {
                    return vec![];
                }
                m.queue
                    .iter()
                    .filter(|q| !unbelieved.contains(&q.0))
                    .map(|q| (q.0, q.3))
                    .collect()
            })
            .collect();
        let blockers = |r: usize, i: usize, d: &BTreeSet<usize>| -> Vec<(usize, usize, bool)> {
            let mut out: Vec<(usize, usize, bool)> = queues[r][..i]
                .iter()
                .filter(|a| d.contains(&a.0))
                .map(|a| (a.0, r, false))
                .collect();
            let held_by_d: u64 = snap[r]
                .holds
                .iter()
                .filter(|h| d.contains(&h.0))
                .map(|h| h.2)
                .sum();
            if held_by_d > 0 && snap[r].cap.saturating_sub(held_by_d) < queues[r][i].1 {
                out.extend(
                    snap[r]
                        .holds
                        .iter()
                        .filter(|h| d.contains(&h.0))
                        .map(|h| (h.0, r, true)),
                );
            }
            out
        };
        let mut waits_of: BTreeMap<usize, Vec<(usize, usize)>> = BTreeMap::new();
        for (r, q) in queues.iter().enumerate() {
            for (i, w) in q.iter().enumerate() {
                waits_of.entry(w.0).or_default().push((r, i));
            }
        }
        let mut d: BTreeSet<usize> = waits_of.keys().copied().collect();
        loop {
            let kept: BTreeSet<usize> = d
                .iter()
                .copied()
                .filter(|t| {
                    waits_of[t]
                        .iter()
                        .all(|&(r, i)| !blockers(r, i, &d).is_empty())
                })
                .collect();
            if kept.len() == d.len() {
                break;
            }
            d = kept;
        }
        let edges = d
            .iter()
            .map(|&t| {
                let e = waits_of[&t]
                    .iter()
                    .flat_map(|&(r, i)| blockers(r, i, &d))
                    .collect();
                (t, e)
            })
            .collect();
        (d, edges)
    }

    /// The threads reachable from `t` by the edges (`t` itself only through a cycle).
    fn reach(t: usize, edges: &Edges) -> BTreeSet<usize> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![t];
        while let Some(x) = todo.pop() {
            for e in edges.get(&x).into_iter().flatten() {
                if seen.insert(e.0) {
                    todo.push(e.0);
                }
            }
        }
        seen
    }

    /// The model's cycles, as the library's graph can prove them (Holt's reduction over every
    /// resource, every queue entry a wait): each strongly connected set of blocked threads that
    /// holds a cycle, and the threads its proof rests on (those reachable from it: the set and
    /// the blocked threads downstream of it, whose permits or places in a queue keep its
    /// members out).
    fn model_cycles(&self) -> Vec<(Vec<usize>, BTreeSet<usize>)> {
        let (d, edges) = self.holt(&self.model, None, &BTreeSet::new());
        let reach: BTreeMap<usize, BTreeSet<usize>> =
            d.iter().map(|&t| (t, Self::reach(t, &edges))).collect();
        let mut out = vec![];
        for &t in &d {
            if !reach[&t].contains(&t) {
                continue;
            }
            let set: Vec<usize> = reach[&t]
                .iter()
                .copied()
                .filter(|u| reach[u].contains(&t))
                .collect();
            if set.first() == Some(&t) {
                out.push((set, reach[&t].clone()));
            }
        }
        out
    }

    /// The cycle through `t` (the strongly connected set of blocked threads it is in), if any.
    fn cycle_through(&self, t: usize) -> Option<Vec<usize>> {
        self.model_cycles()
            .into_iter()
            .map(|c| c.0)
            .find(|c| c.contains(&t))
    }

    fn attempt_of(&self, t: usize) -> u64 {
        match &self.thr[t].phase {
            Phase::Waiting(w) => w.attempt,
            _ => 0,
        }
    }

    fn cycle_id(&self, members: &[usize]) -> Vec<(usize, u64)> {
        let mut id: Vec<(usize, u64)> = members.iter().map(|&m| (m, self.attempt_of(m))).collect();
        id.sort();
        id
    }

    fn queue_seq(&self, t: usize) -> u64 {
        self.model
            .iter()
            .flat_map(|m| m.queue.iter())
            .find(|q| q.0 == t && !self.stale.contains(&(t, q.1)))
            .map_or(0, |q| q.2)
    }

    /// Whether the reported cycle `reported` (in its order: each member's holder waits for the
    /// next member's resource) stands in the model `snap`, as the graph proves it from the
    /// resources the check read (`read`): every member holds what it is reported to hold
    /// (those permits, with its token when the model knows it) or is queued where it is
    /// reported queued ahead, and is queued (a wait under way or a stale entry: both count)
    /// for what it waits for; every member is proven blocked by Holt's reduction over the read
    /// resources, and each member keeps the one before it out as reported (an edge of the
    /// reduction: its hold while the permits free and those of holders not blocked are too
    /// few, or its place ahead in the queue); `t` is a member. The belief rule the check
    /// applies: an owner whose index entry, as the check read it (`hints`), names another
    /// resource than one of the read ones it is queued for has no wait believed. Its cycle id
    /// and youngest thread, or why not.
    fn stands_in(
        &self,
        snap: &[ModelLock],
        reported: &[Member],
        hints: &BTreeMap<String, Option<String>>,
        read: &BTreeSet<String>,
        t: usize,
    ) -> Res<(Vec<(usize, u64)>, usize)> {
        let ix = |name: &str| {
            self.names
                .iter()
                .position(|n| n == name)
                .ok_or_else(|| format!("unknown resource {name}"))
        };
        let mut unbelieved = BTreeSet::new();
        for (owner, hint) in hints {
            let Some(hint) = hint.as_deref().and_then(IndexedWait::parse) else {
                continue;
            };
            let Some(h) = self.thread_of(owner) else {
                continue;
            };
            let elsewhere = snap.iter().enumerate().any(|(x, m)| {
                read.contains(&self.names[x])
                    && self.names[x] != hint.name
                    && m.queue.iter().any(|q| q.0 == h)
            });
            if elsewhere {
                unbelieved.insert(h);
            }
        }
        let (d, edges) = self.holt(snap, Some(read), &unbelieved);
        let (mut id, mut youngest) = (vec![], (0, usize::MAX));
        let n = reported.len();
        for (i, (lock, holder, blocking, waits_for)) in reported.iter().enumerate() {
            let (l, wl) = (ix(lock)?, ix(waits_for)?);
            let h = self
                .thread_of(holder)
                .ok_or_else(|| format!("unknown holder {holder}"))?;
            match blocking {
                Some((token, permits)) => {
                    let hold = snap[l].holds.iter().find(|x| x.0 == h);
                    let Some(hold) = hold else {
                        return Err(format!("{lock} is not held by t{h}"));
                    };
                    if hold.2 != *permits || hold.3.is_some_and(|k| k != *token) {
                        return Err(format!(
                            "t{h} holds {} of {lock} with token {:?}, not {permits} with {token}",
                            hold.2, hold.3
                        ));
                    }
                }
                None => {
                    if !snap[l].queue.iter().any(|q| q.0 == h) {
                        return Err(format!("t{h} is not queued for {lock} (reported ahead)"));
                    }
                }
            }
            let Some(&(_, attempt, seq, _)) = snap[wl].queue.iter().find(|q| q.0 == h) else {
                return Err(format!("t{h} is not queued for {waits_for}"));
            };
            if unbelieved.contains(&h) {
                return Err(format!(
                    "t{h}'s index entry names another resource than {waits_for}, which the check read: not believed"
                ));
            }
            if !d.contains(&h) {
                return Err(format!("t{h} is not proven blocked"));
            }
            // the member before keeps... this one keeps the one before out of `lock`
            let prev = &reported[(i + n - 1) % n];
            if prev.3 != *lock {
                return Err(format!(
                    "not a cycle: {} waits for {}, not {lock}",
                    prev.1, prev.3
                ));
            }
            let p = self
                .thread_of(&prev.1)
                .ok_or_else(|| format!("unknown holder {}", prev.1))?;
            let edge = (h, l, blocking.is_some());
            if !edges.get(&p).is_some_and(|e| e.contains(&edge)) {
                return Err(format!(
                    "t{h} does not keep t{p} out of {lock} as reported (the reduction's edges of t{p}: {:?})",
                    edges.get(&p)
                ));
            }
            id.push((h, attempt));
            youngest = youngest.max((seq, h));
        }
        if !id.iter().any(|m| m.0 == t) {
            return Err(format!("no cycle through t{t}"));
        }
        id.sort();
        Ok((id, youngest.1))
    }

    /// (a) and (b), at the step a refusal is decided. The confirming reading proves that the
    /// cycle stood between the two readings (every hold and wait of it is in both, by token and
    /// queue time: it lasted from its first read to its second, so through the moment between
    /// the readings); the decision may come after a member left (a refusal of a cycle that just
    /// dissolved, as the engine's leave may be too): so the cycle must be the model's at `gap`,
    /// the step between the readings (`None`: there was no second reading, and then the
    /// decision is that moment), stale queue entries counting as waits, the belief rule
    /// applied to the index entries the check read.
    fn judge_refusal(
        &mut self,
        t: usize,
        d: &Deadlock,
        gap: Option<Vec<ModelLock>>,
        hints: &BTreeMap<String, Option<String>>,
        read: &BTreeSet<String>,
    ) -> Res<()> {
        let reported: Vec<Member> = d
            .members
            .iter()
            .map(|m| {
                let token = match m.blocking {
                    Blocking::Holds {
                        fencing_token,
                        permits,
                    } => Some((fencing_token, permits)),
                    _ => None,
                };
                (
                    m.lock.name.clone(),
                    m.holder.owner.clone(),
                    token,
                    m.waits_for.name.clone(),
                )
            })
            .collect();
        let between = gap.unwrap_or_else(|| self.model.clone());
        let (id, youngest) = self
            .stands_in(&between, &reported, hints, read, t)
            .map_err(|why| {
                format!(
                    "(a) t{t} decided to refuse a cycle the model did not have between the readings ({why}): reported {reported:?}"
                )
            })?;
        if self
            .stands_in(&self.model, &reported, hints, read, t)
            .is_err()
        {
            self.count("refusals of a cycle that dissolved after the readings' gap");
        }
        if id.iter().any(|m| self.stale.contains(m)) {
            self.count("refusals of a cycle through a stale queue entry");
        }
        if d.members.iter().any(|m| m.lock.kind != HoldKind::Lock) {
            self.count("refusals of a cycle through the semaphore or the read/write lock");
        }
        if d.members
            .iter()
            .any(|m| matches!(m.blocking, Blocking::QueuedAhead))
        {
            self.count("refusals of a cycle through a wait queued ahead");
        }
        if youngest != t {
            return Err(format!(
                "(a) t{t} refused, but t{youngest} is the youngest wait of the cycle {id:?}"
            ));
        }
        if !self.refused.insert(id.clone()) {
            return Err(format!(
                "(b) a second refusal of the cycle {id:?} (by t{t})"
            ));
        }
        Ok(())
    }

    /// (c) and (d), after every step.
    fn judge(&mut self) -> Res<()> {
        let mut now_standing = BTreeMap::new();
        for (cycle, rests_on) in self.model_cycles() {
            // a fault touched the wait of a thread the cycle's proof rests on (a member, or a
            // blocked thread downstream whose permits or place keep a member out), or one has
            // a stale queue entry or index entry (its waits are then not believed:
            // docs/guarantees.md)
            let faulted = rests_on.iter().any(|&m| {
                let faulted = match &self.thr[m].phase {
                    Phase::Waiting(w) => w.faulted,
                    _ => false,
                };
                faulted || self.stale.iter().any(|s| s.0 == m) || self.stale_index.contains(&m)
            });
            let off = rests_on
                .iter()
                .any(|&m| Some(self.thr[m].client) == self.cfg.off);
            let exempt = u8::from(faulted) | (u8::from(off) << 1);
            let through = cycle.iter().any(|&m| {
                self.waits_for(m).is_some_and(|r| self.is_sem(r))
                    || self.thr[m].held.iter().any(|h| self.is_sem(h.0))
            });
            if through && !self.standing.contains_key(&self.cycle_id(&cycle)) {
                self.count("cycles formed through the semaphore or the read/write lock");
            }
            now_standing.insert(self.cycle_id(&cycle), exempt);
        }
        let ended: Vec<_> = self
            .standing
            .keys()
            .filter(|k| !now_standing.contains_key(*k))
            .cloned()
            .collect();
        for k in ended {
            let (since, exempt) = self.standing.remove(&k).unwrap();
            let life = self.now - since;
            if exempt & 2 != 0 {
                self.count("cycles broken, exempt from (c) (a member's client has detection off)");
            } else if exempt != 0 {
                self.count("cycles broken, exempt from (c) (a fault touched a member's wait, or a member has a stale queue or index entry)");
            } else {
                self.out.max_life = self.out.max_life.max(life);
                self.count("cycles broken, judged by (c)");
            }
        }
        for (k, exempt) in now_standing {
            let now = self.now;
            if !self.standing.contains_key(&k) {
                self.count("cycles formed");
            }
            let e = self
                .standing
                .entry(k.clone())
                .or_insert_with(|| (now, exempt));
            e.1 |= exempt;
            let (since, exempt) = *e;
            if exempt == 0 && now - since > self.cfg.bound() {
                return Err(format!(
                    "(c) the cycle {k:?} has stood {} ms (closed at {since} ms), longer than the bound {} ms (after {} ms)",
                    now - since,
                    self.cfg.bound(),
                    self.cfg.after
                ));
            }
        }
        self.judge_index()
    }

    /// (d): every index entry is of a wait under way that published it, or an orphan.
    fn judge_index(&mut self) -> Res<()> {
        for c in 0..self.cfg.clients {
            let key = fairlock::raw_deadlock::index_key(
                PREFIX,
                &format!("{}:0", client_id(self.cfg.seed, c)),
            );
            let entries: BTreeMap<String, String> = redis::cmd("HGETALL")
                .arg(&key)
                .query(&mut self.conn)
                .map_err(|e| format!("HGETALL: {e}"))?;
            for (owner, value) in entries {
                let t = self
                    .thread_of(&owner)
                    .ok_or_else(|| format!("(d) an index entry of unknown {owner}"))?;
                let entry = IndexedWait::parse(&value)
                    .ok_or_else(|| format!("(d) an index entry not understood: {value}"))?;
                let ok = match &self.thr[t].phase {
                    Phase::Waiting(w) => {
                        w.attempt == entry.attempt
                            && self.names[w.lock] == entry.name
                            && w.published
                    }
                    _ => false,
                };
                if !ok && !self.orphans.contains(&(t, entry.attempt)) && !self.thr[t].crashed {
                    return Err(format!(
                        "(d) index entry {owner} = {value} is of no wait under way that published it"
                    ));
                }
            }
        }
        Ok(())
    }

    /// (e), at the end: everyone done, every lock free, no queue, no index entry but orphans.
    fn judge_end(&mut self) -> Res<()> {
        for l in 0..self.cfg.locks {
            let st = self.locks[l]
                .status()
                .run(&mut self.conn)
                .map_err(|e| format!("status: {e}"))?;
            if !st.owner.is_empty() || !st.queue.is_empty() {
                return Err(format!("(e) l{l} is not free at the end: {st:?}"));
            }
        }
        self.judge_index()
    }

    fn done(&self) -> bool {
        self.thr
            .iter()
            .all(|t| t.plan.is_empty() && t.held.is_empty() && matches!(t.phase, Phase::Idle))
    }
}

fn describe(d: &Deadlock) -> String {
    d.members
        .iter()
        .map(|m| {
            format!(
                "{} held by {} waits for {}",
                m.lock.name, m.holder.owner, m.waits_for.name
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Run one seed: `steps` steps with faults, then the quiet phase.
fn run(cfg: &Cfg, steps: usize) -> Outcome {
    let server = RedisServer::start();
    let mut w = World::new(cfg, &server);
    let mut result = Ok(());
    let mut n = 0;
    while n < steps + QUIET_STEPS {
        if n == steps {
            w.faults = false;
            // every thread ends its plan under way, and runs one more
            for t in &mut w.thr {
                t.plans_left = t.plans_left.min(2);
            }
            w.log("quiet phase: no faults".into());
        }
        if w.done() {
            result = w.judge_end();
            break;
        }
        result = w.step().and_then(|()| w.judge());
        n += 1;
        if result.is_err() {
            break;
        }
    }
    if result.is_ok() && !w.done() {
        result = Err(format!(
            "(e) liveness: plans not complete {QUIET_STEPS} steps into the quiet phase"
        ));
    }
    w.out.steps = n;
    if let Err(v) = result {
        w.out.violation = Some(v);
    }
    w.out
}

fn run_seeds(seeds: impl Iterator<Item = u64>, steps: usize, budget: Duration) {
    let began = Instant::now();
    let mut total: BTreeMap<&'static str, u64> = BTreeMap::new();
    let (mut all_steps, mut max_life, mut seeds_run, mut failures) = (0, 0, vec![], vec![]);
    for seed in seeds {
        if began.elapsed() > budget {
            break;
        }
        let cfg = Cfg::for_seed(seed);
        let t0 = Instant::now();
        let out = run(&cfg, steps);
        println!(
            "deadlock fuzz seed {seed} ({cfg:?}, bound {} ms): {} steps in {:.1}s ({:.0} steps/s), longest cycle {} ms{}",
            cfg.bound(),
            out.steps,
            t0.elapsed().as_secs_f64(),
            out.steps as f64 / t0.elapsed().as_secs_f64(),
            out.max_life,
            if out.violation.is_some() { ": VIOLATION" } else { "" }
        );
        for (k, v) in &out.stats {
            *total.entry(k).or_default() += v;
        }
        all_steps += out.steps;
        max_life = max_life.max(out.max_life);
        seeds_run.push(seed);
        if let Some(v) = &out.violation {
            let mut report = format!(
                "=== VIOLATION seed {seed} ({cfg:?}) after {} steps: {v}\nlast steps:\n",
                out.steps
            );
            for line in out.log.iter().rev().take(60).rev() {
                report.push_str(&format!("  {line}\n"));
            }
            report.push_str(&format!(
                "replay: FAIRLOCK_DL_FUZZ_SEED={seed} FAIRLOCK_DL_FUZZ_STEPS={steps} cargo test --all-features --test it -- --nocapture fuzz::deadlock::short\n"
            ));
            println!("{report}");
            failures.push(report);
        }
    }
    println!(
        "deadlock fuzz: {} seeds {seeds_run:?}, {all_steps} steps in {:.1}s ({:.0} steps/s), longest unexempt cycle {max_life} ms, {} violations",
        seeds_run.len(),
        began.elapsed().as_secs_f64(),
        all_steps as f64 / began.elapsed().as_secs_f64(),
        failures.len()
    );
    for (k, v) in &total {
        println!("  {k}: {v}");
    }
    assert!(
        total
            .get("refusals (Error::Deadlock)")
            .copied()
            .unwrap_or(0)
            > 0
            || seeds_run.len() < 2,
        "no refusal at all: the world forms no cycles"
    );
    assert!(failures.is_empty(), "{} violations (above)", failures.len());
}

/// The short mode: a few fixed seeds (or `FAIRLOCK_DL_FUZZ_SEED`), at most
/// `FAIRLOCK_DL_FUZZ_SECONDS` (or `FAIRLOCK_FUZZ_SECONDS`, as the server matrix sets it; 25 s)
/// before a new seed starts.
#[test]
fn short() {
    let steps = env("FAIRLOCK_DL_FUZZ_STEPS").unwrap_or(20_000);
    match env::<u64>("FAIRLOCK_DL_FUZZ_SEED") {
        Some(s) => run_seeds(std::iter::once(s), steps, Duration::from_secs(3600)),
        None => {
            let n = env("FAIRLOCK_DL_FUZZ_SEEDS").unwrap_or(6u64);
            run_seeds(
                1..=n,
                steps,
                // (the server matrix cuts every fuzzer's short mode with FAIRLOCK_FUZZ_SECONDS)
                Duration::from_secs(
                    env("FAIRLOCK_DL_FUZZ_SECONDS")
                        .or_else(|| env("FAIRLOCK_FUZZ_SECONDS"))
                        .unwrap_or(25),
                ),
            )
        }
    }
}

/// The long mode (`scripts/fuzz.sh --deadlock [STEPS]`): `FAIRLOCK_DL_FUZZ_STEPS` steps in all
/// (default 200,000) over consecutive seeds from `FAIRLOCK_DL_FUZZ_SEED` (default from the
/// clock), 5,000 per seed.
#[test]
#[ignore]
fn long() {
    let total: u64 = env("FAIRLOCK_DL_FUZZ_STEPS").unwrap_or(200_000);
    let first: u64 = env("FAIRLOCK_DL_FUZZ_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            % 1_000_000
    });
    let per = 5_000;
    let seeds = total.div_ceil(per);
    run_seeds(
        first..first + seeds,
        per as usize,
        Duration::from_secs(30 * 24 * 3600),
    );
}
