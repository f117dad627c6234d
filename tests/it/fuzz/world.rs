//! The world of one run: a redis-server on a steppable clock, a few plain connections, the locks
//! and the simulated clients. Every request goes through [`World::exec`], which injects the
//! network faults (lost reply, late delivery, lost request, connection-layer retry) and runs the
//! per-call checks. The steps themselves are in `actions.rs` (threads and clients, reacting to
//! replies the way the real client does) and `faults.rs` (operator, network, process, data).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::rc::Rc;
use std::time::Duration;

use fairlock::raw::{Call, RawLock, RawSemaphore, Runner, Settings};

use crate::fuzz::checks::{Check, Checker, Violation};
use crate::fuzz::faketime::FakeClockRedis;
use crate::fuzz::model::{Client, Clock, Config, Prim, Wait};
use crate::fuzz::sem::{make_sems, SemChecker};
use crate::fuzz::steps::{Fault, Step, Who};

/// Counters by name: steps by kind, faults by kind, exemptions; and maxima (named "max ...").
#[derive(Clone, Default)]
pub struct Stats(pub BTreeMap<String, u64>);

impl Stats {
    pub fn add(&mut self, key: &str, n: u64) {
        *self.0.entry(key.to_string()).or_default() += n;
    }

    /// Keep the largest `n` seen under "max `key`".
    pub fn max(&mut self, key: &str, n: u64) {
        let v = self.0.entry(format!("max {key}")).or_default();
        *v = (*v).max(n);
    }

    pub fn merge(&mut self, other: &Stats) {
        for (k, v) in &other.0 {
            if k.starts_with("max ") {
                let mine = self.0.entry(k.clone()).or_default();
                *mine = (*mine).max(*v);
            } else {
                self.add(k, *v);
            }
        }
    }
}

/// A request that can be sent again (a stray duplicate, a late delivery) whatever it returns.
pub trait Resend {
    fn label(&self) -> &str;
    /// The thread (owner) that sent it, if a thread did.
    fn owner(&self) -> Option<&str>;
    /// The server's clock (ms) when it was first sent.
    fn sent_server_ms(&self) -> i64;
    /// Send it and describe the reply.
    fn resend(&self, conn: &mut redis::Connection) -> String;
}

struct Labeled<T> {
    call: Call<T>,
    label: String,
    owner: Option<String>,
    sent_server_ms: i64,
}

impl<T: fmt::Debug> Resend for Labeled<T> {
    fn label(&self) -> &str {
        &self.label
    }

    fn owner(&self) -> Option<&str> {
        self.owner.as_deref()
    }

    fn sent_server_ms(&self) -> i64 {
        self.sent_server_ms
    }

    fn resend(&self, conn: &mut redis::Connection) -> String {
        describe(&self.call.run(conn).map_err(|e| e.to_string()))
    }
}

pub fn describe<T: fmt::Debug>(r: &Result<T, String>) -> String {
    match r {
        Ok(v) => format!("{v:?}"),
        Err(e) => format!("error: {e}"),
    }
}

/// A reply as the caller saw it, with the fuzzer times the request was sent at.
pub struct Sent<T> {
    pub reply: Result<T, String>,
    pub sent: f64,
    pub sent_real: f64,
}

/// What an acquire (or its re-run with the same attempt) asks for.
#[derive(Clone, Copy)]
pub struct Plan {
    pub lock: usize,
    pub attempt: u64,
    pub lease_ms: u64,
    pub wait: bool,
    pub deadline: Option<f64>,
    /// An acquire request of this attempt met a fault, so (as the real client counts it: an
    /// error, or a second send) a copy may still arrive: its leave asks for a left mark.
    pub unanswered: bool,
}

impl Plan {
    pub fn of(w: &Wait) -> Plan {
        Plan {
            lock: w.lock,
            attempt: w.attempt,
            lease_ms: w.lease_ms,
            wait: true,
            deadline: w.deadline,
            unanswered: w.unanswered,
        }
    }
}

/// Client connections besides the admin one (index 0: checks, operator, faults).
const CLIENT_CONNS: usize = 3;
/// A backward clock step never takes the server more than this below its furthest offset, so
/// the fence (1 h TTL) cannot expire while tokens would be seeded from a lagging clock.
pub const MAX_BEHIND_MS: i64 = 60_000;

pub struct World {
    pub cfg: Config,
    pub server: FakeClockRedis,
    pub conns: Vec<redis::Connection>,
    pub locks: Vec<RawLock>,
    /// The run's semaphores (`fuzz/sem.rs`; none on even seeds) and their checks' memory.
    pub sems: Vec<RawSemaphore>,
    pub sem_checker: SemChecker,
    pub clients: Vec<Client>,
    pub clock: Clock,
    /// Requests held in the network.
    pub late: Vec<Rc<dyn Resend>>,
    /// Wake-ups a client's waker popped that have not reached it yet: (client, lock, message).
    pub late_pops: Vec<(usize, usize, String)>,
    pub operator_last: Option<Rc<dyn Resend>>,
    pub checker: Checker,
    /// The log line of the step being applied.
    pub line: String,
    pub stats: Stats,
    pub violation: Option<Violation>,
    pub max_offset_ms: i64,
    /// The server clock's backward steps so far, ms (the waiters' clock waits them out).
    pub back_steps_ms: i64,
    /// Crashed clients' ids -> (their slot, when they crashed or a late copy of one of their
    /// requests last reached Redis): a grant to them is bounded as an unsure end's is.
    pub crashed: HashMap<String, (usize, crate::fuzz::model::Unsure)>,
    /// Owner -> the server's clock (ms) just after the last request of that thread reached
    /// Redis: no left mark of the owner can be younger (the left marks' bound).
    pub last_sent_server_ms: HashMap<String, i64>,
    /// Per main key (a lock's or a semaphore's): how far its virtual clocks fell behind in
    /// quiet spells (the crashed clients' and unsure ends' bound).
    pub quiet: HashMap<String, crate::fuzz::model::QuietLag>,
    /// In a quiet phase without heartbeats (`Config::quiet_heartbeats` off): when it began
    /// (real ms), and per lock the hand-off to a dead waiter seen last (token, real ms seen).
    pub try_only_quiet: Option<TryOnlyQuiet>,
}

/// What the try-only quiet phase watches (see `runner.rs`).
pub struct TryOnlyQuiet {
    pub since: f64,
    pub handoffs: BTreeMap<usize, (u64, f64)>,
}

impl World {
    pub fn new(cfg: &Config) -> World {
        let server = FakeClockRedis::start();
        let mut conns: Vec<redis::Connection> = (0..=CLIENT_CONNS).map(|_| server.conn()).collect();
        if cfg.lazy_expiry_only {
            redis::cmd("DEBUG")
                .arg("SET-ACTIVE-EXPIRE")
                .arg(0)
                .query::<()>(&mut conns[0])
                .expect("DEBUG SET-ACTIVE-EXPIRE 0");
        }
        // A server without functions (Redis 6.2 has no FCALL) runs every seed with EVALSHA, as
        // the client chooses there; asked of the server, not read from its version.
        let mut cfg = cfg.clone();
        let mut stats = Stats::default();
        if cfg.runner == Runner::Functions && !crate::support::has_command(&mut conns[0], "FCALL") {
            cfg.runner = Runner::Eval;
            stats.add("runner: EVALSHA, the server has no FCALL", 1);
        }
        let settings = Settings {
            fence_ttl: Duration::from_secs(3600),
            waiter_timeout: Duration::from_millis(cfg.waiter_timeout_ms),
            runner: cfg.runner,
        };
        let locks = (0..cfg.locks)
            .map(|i| RawLock::new("fz", &format!("L{i}"), settings).expect("lock name"))
            .collect();
        let sems = make_sems(&cfg, settings);
        World {
            sem_checker: SemChecker::new(sems.len()),
            sems,
            clients: (0..cfg.clients)
                .map(|c| Client::new(cfg.seed, c, 0, cfg.threads))
                .collect(),
            checker: Checker::new(cfg.locks),
            cfg,
            server,
            conns,
            locks,
            clock: Clock::new(),
            late: Vec::new(),
            late_pops: Vec::new(),
            operator_last: None,
            line: String::new(),
            stats,
            violation: None,
            max_offset_ms: 0,
            back_steps_ms: 0,
            crashed: HashMap::new(),
            quiet: HashMap::new(),
            last_sent_server_ms: HashMap::new(),
            try_only_quiet: None,
        }
    }

    pub fn say(&mut self, text: impl AsRef<str>) {
        self.line.push_str(text.as_ref());
    }

    pub fn violate(&mut self, check: Check, message: String) {
        if self.violation.is_none() {
            self.violation = Some(Violation { check, message });
        }
    }

    /// Not paused (a paused client does nothing at all).
    /// Remember that a request of `owner` just reached Redis (`last_sent_server_ms`).
    pub fn note_sent(&mut self, owner: Option<&str>) {
        if let Some(owner) = owner {
            let now = self.server_now_ms();
            self.last_sent_server_ms.insert(owner.to_string(), now);
        }
    }

    /// A script ran at `real` (ms): one that judges waiters moves its key's virtual clocks on
    /// (common.lua, "Time"; not the status, renew and re-enter scripts, nor those that may
    /// leave them as they are: leave, set capacity).
    fn note_script(&mut self, script: &str, cmd: &redis::Cmd, real: f64) {
        const ADVANCING: [&str; 7] = [
            "acquire",
            "release",
            "force_unlock",
            "heartbeat",
            "sem_acquire",
            "sem_release",
            "sem_heartbeat",
        ];
        if !ADVANCING.contains(&script) {
            return;
        }
        // FCALL/EVALSHA <name> <numkeys> <first key> ...
        let Some(redis::Arg::Simple(key)) = cmd.args_iter().nth(3) else {
            return;
        };
        let cap = self.cfg.cap_ms();
        self.quiet
            .entry(String::from_utf8_lossy(key).into_owned())
            .or_default()
            .note(real, cap);
    }

    /// How far the virtual clocks of `p`'s `i` fell behind in quiet spells after `since_real`,
    /// up to `now_real`: (the spells closed by a noted call, the one still open at `now_real`).
    /// A grant made at `now_real` by a script that is not noted (a leave, a capacity change)
    /// closes the open one: its reading is that far behind too.
    pub fn quiet_lag(&self, p: Prim, i: usize, since_real: f64, now_real: f64) -> (f64, f64) {
        let key = match p {
            Prim::Lock => self.locks[i].key_names()[0],
            Prim::Sem => self.sems[i].key_names()[0],
        };
        let cap = self.cfg.cap_ms();
        self.quiet
            .get(key)
            .map_or((0.0, 0.0), |q| (q.since(since_real), q.open(now_real, cap)))
    }

    /// The server's wall clock now (ms), from the offset the fuzzer gave it: no round trip.
    pub fn server_now_ms(&self) -> i64 {
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        wall + self.server.offset_ms()
    }

    pub fn active(&self, c: usize) -> bool {
        c < self.clients.len() && self.clients[c].paused_until <= self.clock.real()
    }

    pub fn owner(&self, c: usize, t: usize) -> String {
        self.clients[c].threads[t].owner.clone()
    }

    pub fn fits(&self, c: usize, t: usize) -> bool {
        c < self.clients.len() && t < self.clients[c].threads.len() && self.active(c)
    }

    pub fn conn_of(who: Option<Who>) -> usize {
        match who {
            Some(Who::Thread(c, _)) => 1 + c % CLIENT_CONNS,
            _ => 0,
        }
    }

    /// Send one request under `fault`; the per-call checks run after every copy that reaches
    /// Redis. `who` sent it (its last command, for a stray duplicate later).
    pub fn exec<T: fmt::Debug + 'static>(
        &mut self,
        who: Option<Who>,
        label: String,
        call: Call<T>,
        fault: Fault,
    ) -> Sent<T> {
        let owner = match who {
            Some(Who::Thread(c, t)) => Some(self.owner(c, t)),
            _ => None,
        };
        let call = Rc::new(Labeled {
            call,
            label,
            owner,
            sent_server_ms: self.server_now_ms(),
        });
        match who {
            Some(Who::Thread(c, t)) => self.clients[c].threads[t].last = Some(call.clone()),
            Some(Who::Operator) => self.operator_last = Some(call.clone()),
            None => {}
        }
        let actor = match who {
            Some(Who::Thread(c, t)) => Some((c, t)),
            _ => None,
        };
        let conn = Self::conn_of(who);
        let sent = self.clock.fz();
        let sent_real = self.clock.real();
        let send = |w: &mut World| {
            w.note_script(call.call.script().name(), call.call.cmd(), sent_real);
            let r = call.call.run(&mut w.conns[conn]).map_err(|e| e.to_string());
            w.note_sent(call.owner());
            w.after_call(actor, sent);
            r
        };
        let reply = match fault {
            Fault::None => {
                let r = send(self);
                if let Err(e) = &r {
                    let label = call.label.clone();
                    self.violate(Check::ScriptError, format!("{label} failed: {e}"));
                }
                r
            }
            Fault::Lost => {
                let r = send(self);
                self.say(format!(" [reply lost: {}]", describe(&r)));
                Err("reply lost".into())
            }
            Fault::Dropped => {
                self.say(" [request lost]");
                Err("request lost".into())
            }
            Fault::Late => {
                self.late.push(call.clone());
                self.say(" [delayed in the network]");
                Err("no reply (request delayed)".into())
            }
            Fault::Retried => {
                let first = send(self);
                self.say(format!(" [sent twice; first reply {}]", describe(&first)));
                send(self)
            }
            Fault::SlowFirst => {
                self.late.push(call.clone());
                self.say(" [first copy held up in the network; sent again]");
                send(self)
            }
        };
        if fault != Fault::None {
            self.stats.add(&format!("fault: {}", fault_name(fault)), 1);
        }
        Sent {
            reply,
            sent,
            sent_real,
        }
    }

    /// Apply one step; `false` when it does not fit the current state (skipped).
    pub fn apply(&mut self, step: &Step) -> bool {
        let applied = match *step {
            Step::Acquire(a) => self.acquire(
                a.p,
                (a.c, a.t, a.lock),
                a.permits,
                a.wait,
                a.lease_ms,
                a.deadline_ms,
                (a.fault, a.then),
            ),
            Step::Pop {
                p,
                c,
                t,
                fault,
                then,
            } => self.pop(p, c, t, fault, then),
            Step::Reenter { p, c, t, fault } => p == Prim::Lock && self.reenter(c, t, fault),
            Step::Release { p, c, t, fault } => self.release(p, c, t, fault),
            Step::Renew { p, c, t, fault } => self.renew(p, c, t, fault),
            Step::LeaveClaim {
                p,
                c,
                t,
                fault,
                then,
            } => self.leave_claim(p, c, t, fault, then),
            Step::LeavePass { p, c, t, fault } => self.leave_pass(p, c, t, fault),
            Step::Heartbeat { p, c, lock, fault } => self.heartbeat(p, c, lock, fault),
            Step::ForceUnlock { lock, fault } => self.force_unlock(lock, fault),
            Step::Resend { who } => self.resend(who),
            Step::DeliverLate { n } => self.deliver_late(n),
            Step::DeliverPop { n, wait_ms } => self.deliver_pop(n, wait_ms),
            Step::Crash { c } => self.crash(c),
            Step::Pause { c, ms } => self.pause(c, ms),
            Step::Sleep { ms } => self.sleep(ms),
            Step::Evict { p, lock, key } => self.evict(p, lock, key),
            Step::DataLoss => self.data_loss(),
            Step::Clock { ms } => self.clock_step(ms),
            Step::LongClock { ms } => self.long_clock_step(ms),
            Step::Sem(ref s) => self.apply_sem(s),
        };
        if applied {
            self.stats.add(&format!("step: {}", step.kind()), 1);
        }
        applied
    }
}

pub fn fault_name(f: Fault) -> &'static str {
    match f {
        Fault::None => "none",
        Fault::Lost => "lost reply",
        Fault::Late => "late delivery",
        Fault::Dropped => "lost request",
        Fault::Retried => "sent twice",
        Fault::SlowFirst => "held up and sent again",
    }
}
