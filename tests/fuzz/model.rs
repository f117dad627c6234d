//! What the simulated clients believe: their threads' holds and waits, with the lease estimates
//! the real client keeps, and the fuzzer's clock those estimates are measured on.

use std::fmt;
use std::rc::Rc;
use std::time::Instant;

use fairlock::raw::Runner;

use crate::rng::{mix, Rng};
use crate::world::Resend;

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
    /// (`lock.rs`). Off in `backward_step_then_lost_renewal`, which checks that the scripts
    /// alone are safe: they report at most the lease and a renewal never shortens a TTL.
    pub cap_pttl_at_lease: bool,
    /// Turn Redis's active expiry off, so an expired key stays until it is touched (and a
    /// backward clock step revives it): what a busy or unlucky server shows now and then.
    pub lazy_expiry_only: bool,
    /// How the calls reach the scripts: every fourth seed (3, 7, ...) sends them whole
    /// (`EVALSHA`, Redis 6.2's way), the others call the function library (`FCALL`).
    pub runner: Runner,
}

impl Config {
    pub fn for_seed(seed: u64) -> Config {
        let mut rng = Rng::new(mix(seed ^ 0xC0F1_6000));
        Config {
            seed,
            locks: rng.range(1, 2) as usize,
            clients: rng.range(3, 5) as usize,
            threads: rng.range(1, 3) as usize,
            lease_ms: (300, 800),
            waiter_timeout_ms: 600,
            cap_pttl_at_lease: true,
            lazy_expiry_only: false,
            runner: if seed % 4 == 3 {
                Runner::Eval
            } else {
                Runner::Functions
            },
        }
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
            "seed={} locks={} clients={} threads={} lease={}..{}ms waiter_timeout={}ms runner={:?}",
            self.seed,
            self.locks,
            self.clients,
            self.threads,
            self.lease_ms.0,
            self.lease_ms.1,
            self.waiter_timeout_ms,
            self.runner
        )
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
}

/// A logical client: an id (new after a crash), an attempt counter that only grows, threads.
pub struct Client {
    pub id: String,
    pub generation: u64,
    pub next_attempt: u64,
    /// Paused (a SIGSTOP): no action, heartbeat or renewal until this real time.
    pub paused_until: f64,
    pub threads: Vec<Thread>,
}

impl Client {
    pub fn new(seed: u64, slot: usize, generation: u64, threads: usize) -> Client {
        let id = client_id(seed, slot, generation);
        Client {
            threads: (0..threads)
                .map(|t| Thread {
                    owner: format!("{id}:{t}"),
                    state: State::Idle,
                    last: None,
                })
                .collect(),
            id,
            generation,
            next_attempt: 1,
            paused_until: 0.0,
        }
    }
}

/// A 32-hex client id derived from the seed, so a replay uses the same names.
fn client_id(seed: u64, slot: usize, generation: u64) -> String {
    let a = mix(seed ^ mix(slot as u64 + 1) ^ mix(generation.wrapping_add(0x51)));
    format!("{a:016x}{:016x}", mix(a))
}

pub struct Thread {
    pub owner: String,
    pub state: State,
    /// The last command this thread sent, for a stray duplicate (the "retry" fault).
    pub last: Option<Rc<dyn Resend>>,
}

impl Thread {
    /// Whether this thread waits on `lock` with `attempt` (a message for it is its own).
    pub fn state_waits_with(&self, lock: usize, attempt: u64) -> bool {
        matches!(&self.state, State::Waiting(w) if w.lock == lock && w.attempt == attempt)
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
    /// The (send time, server ms) of the acquire call whose `Queued` reply came last: a grant
    /// popped later is mapped onto the local clock through them.
    pub sent: f64,
    pub server_ms: i64,
    /// Its queue place exists as far as the model knows (no fault removed it, no retry told).
    pub place: bool,
    /// Real time the last refresh of its deadline was sent (acquire or heartbeat), and forward
    /// clock steps since (each may age the server's virtual clock by up to `cap_ms`).
    pub refreshed: f64,
    pub forward_steps: u32,
    /// Redis granted this attempt the lock (a hand-off waits in its wake list).
    pub granted_seen: bool,
    pub handoff: Option<Handoff>,
    /// See [`crate::world::Plan::unanswered`].
    pub unanswered: bool,
}

/// A hand-off seen in Redis for a waiting thread: its token, and the earliest fuzzer time its
/// lease can run out (the granting call's send time + the lease).
#[derive(Clone, Copy)]
pub struct Handoff {
    pub token: u64,
    pub earliest_end: f64,
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

    pub fn refreshed_at(&mut self, real: f64) {
        self.refreshed = real;
        self.forward_steps = 0;
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
    /// How the estimate was made (for a violation report).
    pub origin: String,
}
