//! What the simulated clients believe: their threads' holds and waits, with the lease estimates
//! the real client keeps, and the fuzzer's clock those estimates are measured on.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::ops::Add;
use std::rc::Rc;
use std::time::{Duration, Instant};

use fairlock::raw::{Runner, Witness};

use crate::fuzz::rng::{mix, Rng};
use crate::fuzz::world::Resend;

/// The shape of one run, drawn from its seed.
#[derive(Clone, Debug)]
pub struct Config {
    pub seed: u64,
    pub locks: usize,
    pub clients: usize,
    pub threads: usize,
    pub lease_ms: (u64, u64),
    pub waiter_timeout_ms: u64,
    /// Cap a grant's reported pttl at the hold's lease, as the real client does
    /// (`src/lock/`). Off in `backward_step_then_lost_renewal`, which checks that the scripts
    /// alone are safe: they report at most the lease and a renewal never shortens a TTL.
    pub cap_pttl_at_lease: bool,
    /// Turn Redis's active expiry off, so an expired key stays until it is touched (and a
    /// backward clock step revives it): what a busy or unlucky server shows now and then.
    pub lazy_expiry_only: bool,
    /// How the calls reach the scripts: every fourth seed (3, 7, ...) sends them whole
    /// (`EVALSHA`, Redis 6.2's way), the others call the function library (`FCALL`).
    pub runner: Runner,
    /// Whether the clients' janitors heartbeat in the quiet phase. Every third seed (2, 5, ...)
    /// they do not: the waiting threads leave, and only `try_lock` callers come by (cron jobs
    /// with `--no-wait`), so dead waiters must be passed over and dead grantees revoked by that
    /// traffic alone, within explicit bounds (`quiet` in runner.rs). Those seeds hold longer
    /// leases, so a dead grantee kept for its lease shows.
    pub quiet_heartbeats: bool,
    /// The semaphores (`fuzz/sem.rs`): every odd seed has one or two, a counting semaphore of
    /// capacity 1-4 (weights 1-3) or the read/write shape; even seeds have none and run as
    /// before.
    pub sems: Vec<SemShape>,
}

/// One semaphore of a run: a counting semaphore of `cap` permits, or a read/write lock
/// (`rw`: capacity `RW_CAPACITY`, a read takes 1, a write all).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SemShape {
    pub rw: bool,
    pub cap: u64,
}

impl Config {
    pub fn for_seed(seed: u64) -> Config {
        let mut rng = Rng::new(mix(seed ^ 0xC0F1_6000));
        let quiet_heartbeats = seed % 3 != 2;
        Config {
            seed,
            locks: rng.range(1, 2) as usize,
            clients: rng.range(3, 5) as usize,
            threads: rng.range(1, 3) as usize,
            lease_ms: if quiet_heartbeats {
                (300, 800)
            } else {
                (1500, 3000)
            },
            waiter_timeout_ms: 600,
            cap_pttl_at_lease: true,
            lazy_expiry_only: false,
            runner: if seed % 4 == 3 {
                Runner::Eval
            } else {
                Runner::Functions
            },
            quiet_heartbeats,
            sems: Self::sems_for_seed(seed),
        }
    }

    /// Drawn from a generator of its own, so the mutex's shape of a seed is as it was.
    fn sems_for_seed(seed: u64) -> Vec<SemShape> {
        if seed.is_multiple_of(2) {
            return vec![];
        }
        let mut rng = Rng::new(mix(seed ^ 0x5E4A_F0E5));
        (0..rng.range(1, 2))
            .map(|_| {
                if rng.chance(0.3) {
                    SemShape {
                        rw: true,
                        cap: fairlock::raw::RW_CAPACITY,
                    }
                } else {
                    SemShape {
                        rw: false,
                        cap: rng.range(1, 4),
                    }
                }
            })
            .collect()
    }

    /// How long the queue keys live after a refresh (`QUEUE_TTL` in common.lua).
    pub fn queue_ttl_ms(&self) -> u64 {
        (2 * self.waiter_timeout_ms).max(600_000)
    }

    /// The most a waiter's virtual clock advances in one script (`CAP` in common.lua).
    pub fn cap_ms(&self) -> f64 {
        (self.waiter_timeout_ms / 3) as f64
    }
}

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "seed={} locks={} clients={} threads={} lease={}..{}ms waiter_timeout={}ms runner={:?}{}",
            self.seed,
            self.locks,
            self.clients,
            self.threads,
            self.lease_ms.0,
            self.lease_ms.1,
            self.waiter_timeout_ms,
            self.runner,
            if self.quiet_heartbeats {
                ""
            } else {
                " quiet=try-only"
            }
        )?;
        for s in &self.sems {
            if s.rw {
                write!(f, " rwlock")?;
            } else {
                write!(f, " sem(cap={})", s.cap)?;
            }
        }
        Ok(())
    }
}

/// Two clocks, in ms since the run began. `real` is the monotonic clock. `fz` is the fuzzer
/// clock: real time plus every forward step of the server clock. Redis TTLs count wall time, so
/// a forward step of S ms ages every lease by S ms: lease estimates are kept on `fz`, which
/// ages them alike. (A backward step only lengthens the server's TTLs, which is safe.)
pub struct Clock {
    start: Instant,
    forward_ms: f64,
}

impl Clock {
    pub fn new() -> Clock {
        Clock {
            start: Instant::now(),
            forward_ms: 0.0,
        }
    }

    pub fn real(&self) -> f64 {
        self.start.elapsed().as_secs_f64() * 1000.0
    }

    pub fn fz(&self) -> f64 {
        self.real() + self.forward_ms
    }

    pub fn step_forward(&mut self, ms: f64) {
        self.forward_ms += ms;
    }

    /// All forward steps so far: `fz - real`.
    pub fn forward(&self) -> f64 {
        self.forward_ms
    }
}

/// A reading of a client's own clock (real time, ms since the run began): what the real
/// client's lease arithmetic (`fairlock::raw::judge_handoff`) runs on.
#[derive(Clone, Copy, Debug, PartialEq, PartialOrd)]
pub struct LocalMs(pub f64);

impl Add<Duration> for LocalMs {
    type Output = LocalMs;
    fn add(self, d: Duration) -> LocalMs {
        LocalMs(self.0 + d.as_secs_f64() * 1000.0)
    }
}

/// A logical client: an id (new after a crash), an attempt counter that only grows, threads.
pub struct Client {
    pub id: String,
    pub generation: u64,
    pub next_attempt: u64,
    /// Paused (a SIGSTOP): no action, heartbeat or renewal until this real time.
    pub paused_until: f64,
    pub threads: Vec<Thread>,
    /// Every message this client's waker popped (lock and semaphore wake lists), whatever
    /// became of it (handed over, its reply lost, held up on the way): a hand-off message that
    /// left a wake list otherwise was taken by a script.
    pub popped: HashSet<String>,
}

impl Client {
    pub fn new(seed: u64, slot: usize, generation: u64, threads: usize) -> Client {
        let id = client_id(seed, slot, generation);
        Client {
            threads: (0..threads)
                .map(|t| Thread {
                    owner: format!("{id}:{t}"),
                    lock: Side::new(),
                    sem: Side::new(),
                    last: None,
                    marks_lost_upto: 0,
                })
                .collect(),
            id,
            generation,
            next_attempt: 1,
            paused_until: 0.0,
            popped: HashSet::new(),
        }
    }
}

/// A 32-hex client id derived from the seed, so a replay uses the same names.
fn client_id(seed: u64, slot: usize, generation: u64) -> String {
    let a = mix(seed ^ mix(slot as u64 + 1) ^ mix(generation.wrapping_add(0x51)));
    format!("{a:016x}{:016x}", mix(a))
}

/// When an attempt's end became unsure (`Thread::unsure_end`), or a request that could act for
/// it reached Redis since (a late or repeated copy of its acquire, or of a heartbeat of its
/// client, which may refresh a place it left behind): real ms, and the server clock's
/// backward steps so far (ms; `World::back_steps_ms`).
#[derive(Clone, Copy, Debug)]
pub struct Unsure {
    pub since_real: f64,
    pub back_steps_ms: i64,
}

impl Unsure {
    /// Whether a grant to the attempt at `now_real` is past what its end's unsureness
    /// excuses: a copy of its acquire grants in the very call that delivers it (this is then
    /// fresh), and a place it left behind goes at its deadline, a waiter timeout after its
    /// last refresh on the waiters' clock, which runs no slower than real time except for the
    /// server's backward steps (it waits for the server to catch up). Bound: two waiter
    /// timeouts + 2 s + the backward steps since.
    /// `quiet_lag_ms`: how far the waiters' clock of the key granted fell behind real time
    /// since then in quiet spells ([`QuietLag::since`]), the one the grant closes included
    /// ([`QuietLag::open`]).
    pub fn expired(
        &self,
        now_real: f64,
        back_steps_ms: i64,
        waiter_timeout_ms: u64,
        quiet_lag_ms: f64,
    ) -> bool {
        let bound = 2.0 * waiter_timeout_ms as f64
            + 2_000.0
            + (back_steps_ms - self.back_steps_ms) as f64
            + quiet_lag_ms;
        now_real - self.since_real > bound
    }
}

/// How far one key's virtual clocks (the waiters' and the hand-off clock, common.lua "Time")
/// fell behind real time in quiet spells: a script that judges waiters advances them by at most
/// CAP (a third of the waiter timeout) from the stored reading, so a gap between two such
/// scripts longer than CAP puts them behind by the rest of it, and a dead waiter lives that
/// much longer in real time (the scripts promise "a few calls", not real time). Each gap counts
/// `gap - CAP + CAP/10` (a reading is stored only when due, CAP/10 after the stored one): a
/// bound that is never below the scripts' lag.
#[derive(Default)]
pub struct QuietLag {
    last_call_real: Option<f64>,
    /// (real ms of a call that advanced it, the lag so far), in call order.
    marks: Vec<(f64, f64)>,
}

impl QuietLag {
    /// A script that advances the key's clocks ran at `real`.
    pub fn note(&mut self, real: f64, cap_ms: f64) {
        let so_far = self.marks.last().map_or(0.0, |m| m.1);
        let gap = self.last_call_real.map_or(0.0, |last| real - last);
        let lag = so_far + (gap - cap_ms + cap_ms / 10.0).max(0.0);
        self.last_call_real = Some(real);
        if lag > so_far || self.marks.is_empty() {
            self.marks.push((real, lag));
        }
    }

    /// The lag of the gap still open at `now_real` (from the last call noted): a script that
    /// reads the clocks without being noted (a leave's or a capacity change's grant loop, which
    /// may leave them as they are) reads them that far behind.
    pub fn open(&self, now_real: f64, cap_ms: f64) -> f64 {
        self.last_call_real.map_or(0.0, |last| {
            (now_real - last - cap_ms + cap_ms / 10.0).max(0.0)
        })
    }

    /// The lag gathered after `since_real`, with the gap that was open then.
    pub fn since(&self, since_real: f64) -> f64 {
        let now = self.marks.last().map_or(0.0, |m| m.1);
        let before = self
            .marks
            .iter()
            .take_while(|(at, _)| *at <= since_real)
            .last()
            .map_or(0.0, |m| m.1);
        now - before
    }
}

/// Which primitive a thread acts on: its lock side or its semaphore side (a read/write lock is
/// a semaphore of its own shape). What differs between them is in `fuzz/prim.rs`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prim {
    Lock,
    Sem,
}

impl Prim {
    pub const ALL: [Prim; 2] = [Prim::Lock, Prim::Sem];

    pub fn wait(self, th: &Thread) -> Option<&Wait> {
        match &th.side(self).state {
            State::Waiting(w) => Some(w),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Prim::Lock => "lock",
            Prim::Sem => "sem",
        }
    }

    /// What the log lines and counters put before a step's name ("" for a lock, "sem ").
    pub fn prefix(self) -> &'static str {
        match self {
            Prim::Lock => "",
            Prim::Sem => "sem ",
        }
    }
}

pub struct Thread {
    pub owner: String,
    /// The thread's lock side and its semaphore side: one attempt at a time on each.
    pub lock: Side,
    pub sem: Side,
    /// The last command this thread sent, for a stray duplicate (the "retry" fault).
    pub last: Option<Rc<dyn Resend>>,
    /// Attempts up to this one ended before the left marks were lost with all data (a restart
    /// without persistence): a late copy of them may act, as the README's limits say.
    pub marks_lost_upto: u64,
}

/// A thread's bookkeeping on one primitive (`Prim`): its state (a `Wait` or `Hold` whose
/// `lock` is the lock's or semaphore's index), and what the ghost-hold judge needs.
pub struct Side {
    pub state: State,
    /// The permits it wants or holds (1 on a lock).
    pub permits: u64,
    /// (index, attempt) of the acquire or leave call this thread is in, if any: a grant to it
    /// during that call is its own.
    pub calling: Option<(usize, u64)>,
    /// (index, attempt) of attempts that ended here while Redis may not know it yet: the leave
    /// or release that ends them (and writes their left mark) was lost or is late, or a copy
    /// of their acquire went out that the client never learnt of. Redis may still grant them:
    /// a hand-off its janitor no longer refreshes (revoked as a dead grantee's), or a late
    /// copy's hold (the README's limits). Every other grant to an ended attempt is a ghost, and
    /// so is one later than `Unsure::expired` allows.
    pub unsure_end: HashMap<(usize, u64), Unsure>,
    /// (index, attempt) of attempts whose end asked for a left mark: if the marks key is
    /// evicted, a late copy of their acquire may act (they join `unsure_end`).
    pub marked: HashSet<(usize, u64)>,
}

impl Side {
    pub fn new() -> Side {
        Side {
            state: State::Idle,
            permits: 1,
            calling: None,
            unsure_end: HashMap::new(),
            marked: HashSet::new(),
        }
    }

    /// Whether it waits on `index` with `attempt` (a message for it is its own).
    pub fn waits_with(&self, index: usize, attempt: u64) -> bool {
        matches!(&self.state, State::Waiting(w) if w.lock == index && w.attempt == attempt)
    }
}

impl Thread {
    pub fn side(&self, p: Prim) -> &Side {
        match p {
            Prim::Lock => &self.lock,
            Prim::Sem => &self.sem,
        }
    }

    pub fn side_mut(&mut self, p: Prim) -> &mut Side {
        match p {
            Prim::Lock => &mut self.lock,
            Prim::Sem => &mut self.sem,
        }
    }
}

pub enum State {
    Idle,
    Waiting(Wait),
    Holding(Hold),
}

/// A thread queued for a lock (it saw `Queued` for this attempt).
pub struct Wait {
    pub lock: usize,
    pub attempt: u64,
    pub lease_ms: u64,
    /// A timed wait leaves (claiming a grant) once this fuzzer time has passed.
    pub deadline: Option<f64>,
    /// The (send time, server ms) of the acquire call whose `Queued` reply came last (kept for
    /// the log and for planting the old estimate).
    pub sent: f64,
    pub server_ms: i64,
    /// The client's witness for its hand-off (see `fairlock::raw::judge_handoff`), on the
    /// client's own clock (real time, which a server clock step does not move): renewed by the
    /// queueing reply and by every heartbeat of the client on that lock.
    pub witness: Witness<LocalMs>,
    /// `Clock::forward` when the model saw Redis grant this attempt the lock: forward steps
    /// after it age the hold (Redis TTLs count wall time), steps before it do not.
    pub grant_forward: Option<f64>,
    /// Its queue place exists as far as the model knows (no fault removed it, no retry told).
    pub place: bool,
    /// Real time the last refresh of its deadline was sent (acquire or heartbeat), and forward
    /// clock steps since (each may age the server's virtual clock by up to `cap_ms`).
    pub refreshed: f64,
    pub forward_steps: u32,
    /// The forward steps' total since that refresh, ms (a semaphore's hand-off deadline is on
    /// the server clock, which they move in full).
    pub forward_ms: f64,
    /// Redis granted this attempt the lock (a hand-off waits in its wake list).
    pub granted_seen: bool,
    pub handoff: Option<Handoff>,
    /// See [`crate::fuzz::world::Plan::unanswered`].
    pub unanswered: bool,
}

/// A hand-off seen in Redis for a waiting thread: its token, and the earliest fuzzer time its
/// lease can run out (the granting call's send time + the lease).
#[derive(Clone, Copy)]
pub struct Handoff {
    pub token: u64,
    pub earliest_end: f64,
    /// Its client's wake list was evicted since the grant: the message may be gone with it.
    pub wake_lost: bool,
    /// A heartbeat of its client on that lock or semaphore answered since the grant: by then
    /// its wake-up must be in the wake list (a grant made by a repeat of the waiter's own
    /// acquire, with a reply nobody read, is told by that heartbeat).
    pub heartbeat_after: bool,
}

impl Wait {
    /// Whether Redis must still keep this waiter's place: a dead waiter is purged once its
    /// virtual deadline passes, which needs `waiter_timeout` of virtual time since the last
    /// refresh; virtual time runs at most as fast as real time, plus `cap` per forward step.
    pub fn live(&self, cfg: &Config, real_now: f64) -> bool {
        const SLACK_MS: f64 = 40.0;
        self.place
            && (real_now - self.refreshed) + cfg.cap_ms() * self.forward_steps as f64 + SLACK_MS
                < cfg.waiter_timeout_ms as f64
    }

    /// Whether the queue keys may have expired with this waiter's place since its last refresh:
    /// each refresh gives them the queue's TTL on the server's wall clock, which the forward
    /// steps since (`forward_ms`) and real time move. Redis may then drop the place of a live
    /// waiter (docs/guarantees.md, "Server clock steps"): it queues again when told. Not before.
    pub fn queue_ttl_passed(&self, cfg: &Config, real_now: f64) -> bool {
        self.forward_ms + (real_now - self.refreshed) >= cfg.queue_ttl_ms() as f64
    }

    pub fn refreshed_at(&mut self, real: f64) {
        self.refreshed = real;
        self.forward_steps = 0;
        self.forward_ms = 0.0;
    }
}

/// A thread's hold, as the real guard keeps it.
#[derive(Clone)]
pub struct Hold {
    pub lock: usize,
    pub attempt: u64,
    pub token: u64,
    /// Levels the thread holds (its own count; Redis's count may differ after lost replies).
    pub depth: u32,
    pub lease_ms: u64,
    /// Conservative lease end on the fuzzer clock.
    pub expires: f64,
    /// The attempt that got it, when one of its acquire requests may still arrive: the
    /// outermost release asks for a left mark (`release_marking`), as the real guard's does.
    pub late_acquire: Option<u64>,
    /// How the estimate was made (for a violation report).
    pub origin: String,
}
