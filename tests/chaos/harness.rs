//! The parent of a chaos run: starts redis-server, the proxies and the worker processes, injects
//! faults at random (bounded in number and time), lets the system settle in a quiet phase, stops
//! the workers, collects the end state and runs the checker.
//!
//! Faults come in decks: every kind once per deck, in a random order, so a short run sees each
//! kind. Besides killing, pausing, restarting and the network faults of the proxy:
//! - `late-delivery`: the proxy traps one request of a worker (a script call of the lock
//!   protocol), holds it until the worker's read timeout made it abandon the connection, and
//!   delivers it to Redis 0.5-3 s later, when the thread has moved on to newer attempts.
//! - `force-unlock`: an operator (a `LockClient` in this process, through a proxy of its own)
//!   reads the holder with `status()` and calls `force_unlock_hold(owner, token)`; the proxy
//!   forwards the request and then cuts the connection, so the reply is lost and the library
//!   sends the call again, and the operator retries once more on its own. The swallowed reply
//!   tells whether the first call released the hold.
//! - `clock-step` (without persistence, when libfaketime is installed): redis-server's wall clock
//!   steps back by up to 5 s or forward by less than a quarter of the lease.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::checker::{self, EndState, Params, Report};
use super::history::{now_ns, FaultKind, History};
use super::proxy::{Proxy, Trap};
use super::server::Server;
use super::workload::{self, Rng};
use crate::support::{ChildTest, Proc};

pub const LOCKS: [&str; 2] = ["chaos-a", "chaos-b"];

/// The largest forward step of the server clock: a forward step of S shortens every lease on
/// the server by S (Redis TTLs follow the wall clock; README, Limits) while the holders' estimates
/// do not know. The watchdog renews every third of the lease, so the server keeps at least two
/// thirds of it; a quarter leaves a margin of more than a third of the lease for a late renewal.
pub const MAX_FORWARD_STEP: Duration =
    Duration::from_millis(workload::LEASE.as_millis() as u64 / 4);
/// The largest backward step of the server clock.
pub const MAX_BACKWARD_STEP: Duration = Duration::from_secs(5);

/// How often a late delivery traps each of the protocol's scripts (known by their SHA1 from
/// `fairlock::raw::scripts()`); weight 0: never chosen, only named in reports. A request Redis
/// does not know by that SHA1 falls back to any script call of the lock protocol.
const TRAP_WEIGHTS: [(&str, u64); 5] = [
    ("acquire", 4),
    ("release", 4),
    ("heartbeat", 2),
    ("leave", 1),
    ("renew", 1),
];

/// One of the protocol's scripts and how often a late delivery traps it.
struct ScriptInfo {
    script: &'static fairlock::raw::Script,
    weight: u64,
}

#[derive(Clone, Debug)]
pub struct Scenario {
    pub name: String,
    /// `appendonly yes` + `appendfsync always` (restarts keep the state) or no persistence.
    pub aof: bool,
    /// Run redis-server under libfaketime and step its clock (only without persistence).
    pub fake_clock: bool,
    /// How long faults are injected.
    pub fault_time: Duration,
    /// The quiet phase after the faults, for the liveness check.
    pub quiet_time: Duration,
    pub workers: usize,
    pub threads: usize,
    pub seed: u64,
}

/// `target/chaos` (or under `CARGO_TARGET_DIR`).
pub fn chaos_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    target.join("chaos")
}

/// A seed from the environment (`FAIRLOCK_CHAOS_SEED`, to replay a fault schedule) or the clock.
pub fn seed() -> u64 {
    std::env::var("FAIRLOCK_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| now_ns() ^ u64::from(std::process::id()) << 32)
}

struct WorkerProc {
    idx: usize,
    proc: Proc,
    err_path: PathBuf,
    killed: bool,
    stopped: bool,
}

impl WorkerProc {
    fn pid(&self) -> u32 {
        self.proc.pid()
    }

    fn signal(&self, sig: libc::c_int) {
        self.proc.signal(sig);
    }
}

impl Drop for WorkerProc {
    /// Continue a stopped worker; then `proc` drops, which kills it.
    fn drop(&mut self) {
        if self.stopped {
            self.signal(libc::SIGCONT);
        }
    }
}

struct Run<'a> {
    s: &'a Scenario,
    /// Starts the workers: the calling test again, in the "chaos-worker" role.
    children: &'a ChildTest,
    dir: PathBuf,
    server: Server,
    /// The workers' way to Redis.
    proxy: Proxy,
    /// The operator's way to Redis (force-unlocks whose replies get lost).
    op_proxy: Proxy,
    operator: fairlock::LockClient,
    scripts: Vec<ScriptInfo>,
    history: History,
    rng: Rng,
    workers: Vec<WorkerProc>,
    /// (idx, pid) of the workers the harness killed
    killed: Vec<(usize, u32)>,
    next_idx: usize,
    next_fault: u64,
    worker_limit: Duration,
}

/// Run scenario `s`; `children` starts the worker processes (see `support::child_test!`).
pub fn run(s: &Scenario, children: &ChildTest) -> Report {
    let dir = chaos_dir().join(&s.name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the chaos dir");
    let server = Server::start(s.aof, s.fake_clock);
    let proxy = Proxy::start(server.port());
    let op_proxy = Proxy::start(server.port());
    let operator = fairlock::LockClient::builder(&op_proxy.url())
        .connect_timeout(Duration::from_secs(1))
        .read_timeout(Duration::from_secs(2))
        .build()
        .expect("the operator's client");
    let scripts = fairlock::raw::scripts()
        .into_iter()
        .map(|script| ScriptInfo {
            script,
            weight: TRAP_WEIGHTS
                .iter()
                .find(|(name, _)| *name == script.name())
                .map_or(0, |w| w.1),
        })
        .collect();
    let history = History::create(&dir.join("parent.log"));
    let mut run = Run {
        s,
        children,
        dir: dir.clone(),
        server,
        proxy,
        op_proxy,
        operator,
        scripts,
        history,
        rng: Rng::new(s.seed),
        workers: Vec::new(),
        killed: Vec::new(),
        next_idx: 0,
        next_fault: 1,
        worker_limit: s.fault_time + s.quiet_time + Duration::from_secs(120),
    };
    println!(
        "chaos {}: seed {}, {} workers x {} threads, faults for {:?}, quiet {:?}, server clock {}, history in {}",
        s.name,
        s.seed,
        s.workers,
        s.threads,
        s.fault_time,
        s.quiet_time,
        if s.fake_clock { "stepped" } else { "real" },
        dir.display()
    );
    run.phase("start");
    for _ in 0..s.workers {
        run.spawn_worker();
    }
    run.inject_faults();
    run.phase("quiet");
    thread::sleep(s.quiet_time);
    run.phase("stop");
    let mut end = run.stop_workers();
    let keys_clean_after = run.check_keys(&mut end);
    let final_offset = run.server.offset_ms();
    drop(run);

    let (files, torn) = super::history::read_dir(&dir);
    let mut report = checker::check(
        files,
        torn,
        &end,
        &Params {
            scenario: s.name.clone(),
            lease_ns: workload::LEASE.as_nanos() as u64,
            max_forward_step_ns: MAX_FORWARD_STEP.as_nanos() as u64,
        },
    );
    let extra = json!({
        "seed": s.seed.to_string(),
        "redis_persistence": if s.aof { "appendonly yes, appendfsync always" } else { "none" },
        "server_clock": if s.fake_clock {
            json!({
                "stepped": true,
                "max_backward_step_ms": MAX_BACKWARD_STEP.as_millis() as u64,
                "max_forward_step_ms": MAX_FORWARD_STEP.as_millis() as u64,
                "final_offset_ms": final_offset,
            })
        } else {
            json!({ "stepped": false })
        },
        "worker_read_timeout_ms": workload::READ_TIMEOUT.as_millis() as u64,
        "workers": s.workers,
        "threads_per_worker": s.threads,
        "locks": LOCKS,
        "fault_phase_s": s.fault_time.as_secs_f64(),
        "quiet_phase_s": s.quiet_time.as_secs_f64(),
        "keys_clean_after_stop_ms": keys_clean_after.map(|d| d.as_millis() as u64),
        "history_dir": dir.display().to_string(),
    });
    if let (Value::Object(m), Value::Object(x)) = (&mut report.summary, extra) {
        m.extend(x);
    }
    write_report(&dir, &report);
    report
}

/// `summary.json` and `violations.txt` in `dir`.
pub fn write_report(dir: &Path, report: &Report) {
    let text = serde_json::to_string_pretty(&report.summary).unwrap();
    std::fs::write(dir.join("summary.json"), text + "\n").expect("write summary.json");
    let mut v = std::fs::File::create(dir.join("violations.txt")).expect("violations.txt");
    for (kind, detail) in &report.violations {
        let _ = writeln!(v, "[{kind}] {detail}\n");
    }
}

impl Run<'_> {
    fn log(&self, rest: &str) {
        self.history.log("parent", rest);
    }

    fn phase(&self, name: &str) {
        self.log(&format!("PHASE {name}"));
    }

    fn spawn_worker(&mut self) {
        let idx = self.next_idx;
        self.next_idx += 1;
        let err_path = self.dir.join(format!("worker-{idx}.err"));
        let stderr = std::fs::File::create(&err_path).expect("worker stderr file");
        let mut cmd = self.children.command("chaos-worker", &[]);
        cmd.env(workload::ENV_URL, self.proxy.url())
            .env(
                workload::ENV_HISTORY,
                self.dir.join(format!("worker-{idx}.log")),
            )
            .env(workload::ENV_THREADS, self.s.threads.to_string())
            .env(workload::ENV_LOCKS, LOCKS.join(","))
            .env(workload::ENV_LIMIT, self.worker_limit.as_secs().to_string())
            .stderr(stderr);
        let w = WorkerProc {
            idx,
            proc: Proc::spawn(&mut cmd),
            err_path,
            killed: false,
            stopped: false,
        };
        self.log(&format!("SPAWN {idx} {}", w.pid()));
        self.workers.push(w);
    }

    /// A direct connection (not through the proxy) for looking at the lock state.
    fn conn(&self) -> Option<redis::Connection> {
        let c = redis::Client::open(self.server.url())
            .ok()?
            .get_connection_with_timeout(Duration::from_secs(1))
            .ok()?;
        c.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        Some(c)
    }

    fn live_pids(&self) -> Vec<u32> {
        self.workers.iter().map(|w| w.pid()).collect()
    }

    /// Pids of our workers that hold a lock now, as Redis sees it.
    fn holder_pids(&self) -> Vec<u32> {
        let Some(mut c) = self.conn() else {
            return Vec::new();
        };
        let live = self.live_pids();
        let mut pids = Vec::new();
        for name in LOCKS {
            let meta: Option<String> = redis::cmd("HGET")
                .arg(format!("fairlock:{{{name}}}"))
                .arg("meta")
                .query(&mut c)
                .unwrap_or(None);
            // meta = host|pid|thread
            if let Some(pid) = meta.and_then(|m| m.split('|').nth(1)?.parse().ok()) {
                if live.contains(&pid) {
                    pids.push(pid);
                }
            }
        }
        pids
    }

    /// Pids of our workers with a thread in a queue that hold no lock.
    fn waiter_pids(&self) -> Vec<u32> {
        let Some(mut c) = self.conn() else {
            return Vec::new();
        };
        let live = self.live_pids();
        let holders = self.holder_pids();
        let mut pids = Vec::new();
        for name in LOCKS {
            let entries: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
                .arg(format!("fairlock:{{{name}}}:waiters"))
                .query(&mut c)
                .unwrap_or_default();
            // owner -> attempt|deadline|lease|host|pid|thread; field ~clock is the hash's
            // virtual clock ("v|real"), no waiter
            for (field, e) in entries {
                if field.starts_with('~') {
                    continue;
                }
                if let Some(pid) = e.split('|').nth(4).and_then(|p| p.parse().ok()) {
                    if live.contains(&pid) && !holders.contains(&pid) && !pids.contains(&pid) {
                        pids.push(pid);
                    }
                }
            }
        }
        pids
    }

    fn pick(&mut self, candidates: &[u32]) -> Option<u32> {
        if candidates.is_empty() {
            return None;
        }
        let i = self.rng.range(0, candidates.len() as u64 - 1) as usize;
        Some(candidates[i])
    }

    fn fault_start(&mut self, kind: FaultKind, target: Option<u32>, detail: &str) -> u64 {
        self.fault_start_at(now_ns(), kind, target, detail)
    }

    fn fault_start_at(
        &mut self,
        t: u64,
        kind: FaultKind,
        target: Option<u32>,
        detail: &str,
    ) -> u64 {
        let id = self.next_fault;
        self.next_fault += 1;
        let target = target.map_or("-".to_string(), |p| p.to_string());
        self.history.log_at(
            t,
            "parent",
            &format!("FAULT {id} {kind} start {target} {detail}"),
        );
        id
    }

    fn fault_end(&self, id: u64, kind: FaultKind, detail: &str) {
        self.fault_end_at(now_ns(), id, kind, detail);
    }

    fn fault_end_at(&self, t: u64, id: u64, kind: FaultKind, detail: &str) {
        self.history
            .log_at(t, "parent", &format!("FAULT {id} {kind} end {detail}"));
    }

    fn sleep_ms(&mut self, lo: u64, hi: u64) -> Duration {
        let d = Duration::from_millis(self.rng.range(lo, hi));
        thread::sleep(d);
        d
    }

    fn inject_faults(&mut self) {
        let restart = if self.s.aof {
            FaultKind::RestartAof
        } else {
            FaultKind::RestartVolatile
        };
        let mut kinds = vec![
            FaultKind::SigkillHolder,
            FaultKind::SigkillWaiter,
            FaultKind::Sigstop,
            restart,
            FaultKind::Drop,
            FaultKind::Blackhole,
            FaultKind::Latency,
            FaultKind::LateDelivery,
            FaultKind::ForceUnlock,
        ];
        if self.server.can_step_clock() {
            // cheap and instant: twice per deck
            kinds.extend([FaultKind::ClockStep, FaultKind::ClockStep]);
        }
        let end = Instant::now() + self.s.fault_time;
        // the longest faults (a late delivery, latency) last 6.5 s: stop starting faults that
        // could run past `end`
        let last_start = end.checked_sub(Duration::from_secs(7)).unwrap_or(end);
        let max_faults = (self.s.fault_time.as_secs() / 2).max(kinds.len() as u64);
        let mut deck: Vec<FaultKind> = Vec::new();
        let mut injected = 0;
        // warm up
        self.sleep_ms(2000, 2000);
        // the first deck always runs whole, so every kind of fault happens at least once
        let kinds_n = kinds.len() as u64;
        while injected < kinds_n || (Instant::now() < last_start && injected < max_faults) {
            if deck.is_empty() {
                deck = kinds.clone();
                for i in (1..deck.len()).rev() {
                    let j = self.rng.range(0, i as u64) as usize;
                    deck.swap(i, j);
                }
            }
            let kind = deck.pop().unwrap();
            self.inject(kind);
            injected += 1;
            // after a kill leave a clean window for the recovery measurement
            let gap = if kind.is_kill() {
                (2300, 3000)
            } else {
                (800, 1600)
            };
            self.sleep_ms(gap.0, gap.1);
        }
        let left = end.saturating_duration_since(Instant::now());
        thread::sleep(left);
    }

    fn inject(&mut self, kind: FaultKind) {
        match kind {
            FaultKind::SigkillHolder | FaultKind::SigkillWaiter => {
                let preferred = if kind == FaultKind::SigkillHolder {
                    self.holder_pids()
                } else {
                    self.waiter_pids()
                };
                let live = self.live_pids();
                let (pid, detail) = match self.pick(&preferred) {
                    Some(p) => (p, "as-chosen"),
                    None => (self.pick(&live).expect("a live worker"), "any-worker"),
                };
                let id = self.fault_start(kind, Some(pid), detail);
                let i = self.workers.iter().position(|w| w.pid() == pid).unwrap();
                let mut w = self.workers.remove(i);
                w.proc.kill();
                w.killed = true;
                self.fault_end(id, kind, "");
                self.killed.push((w.idx, pid));
                drop(w);
                self.spawn_worker();
            }
            FaultKind::Sigstop | FaultKind::SigstopProbe => self.sigstop(),
            FaultKind::RestartAof | FaultKind::RestartVolatile => {
                let id = self.fault_start(kind, None, "kill-9-and-start");
                let port = self.server.restart();
                self.proxy.set_upstream(port);
                self.op_proxy.set_upstream(port);
                self.fault_end(id, kind, &format!("port={port}"));
            }
            FaultKind::Drop => {
                let id = self.fault_start(kind, None, "cut-all-connections");
                let n = self.proxy.drop_all();
                self.fault_end(id, kind, &format!("connections={n}"));
            }
            FaultKind::Blackhole => {
                let id = self.fault_start(kind, None, "forward-nothing");
                self.proxy.set_blackhole(true);
                self.sleep_ms(2000, 3000);
                self.proxy.set_blackhole(false);
                self.fault_end(id, kind, "");
            }
            FaultKind::Latency => {
                let id = self.fault_start(kind, None, "20ms-per-chunk");
                self.proxy.set_latency(Duration::from_millis(20));
                self.sleep_ms(2000, 3500);
                self.proxy.set_latency(Duration::ZERO);
                self.fault_end(id, kind, "");
            }
            FaultKind::LateDelivery => self.late_delivery(),
            FaultKind::ForceUnlock => self.force_unlock(),
            FaultKind::ClockStep => self.clock_step(),
        }
    }

    fn sigstop(&mut self) {
        // The GC-pause case needs a process stopped *inside* a critical section, which lasts a
        // few ms: stop a holder, then ask Redis whether it still holds. If it let go meanwhile,
        // let it run again at once (a logged `sigstop-probe`) and retry.
        for probe in 0..20 {
            let holders = self.holder_pids();
            let Some(pid) = self.pick(&holders) else {
                thread::sleep(Duration::from_millis(20));
                continue;
            };
            let i = self.workers.iter().position(|w| w.pid() == pid).unwrap();
            let t0 = now_ns();
            self.workers[i].signal(libc::SIGSTOP);
            self.workers[i].stopped = true;
            let long = probe == 19 || self.holder_pids().contains(&pid);
            let kind = if long {
                FaultKind::Sigstop
            } else {
                FaultKind::SigstopProbe
            };
            let id = self.fault_start_at(t0, kind, Some(pid), "holder");
            if long {
                self.sleep_ms(1500, 2500);
            }
            self.workers[i].signal(libc::SIGCONT);
            self.workers[i].stopped = false;
            self.fault_end(id, kind, "");
            if long {
                return;
            }
            thread::sleep(Duration::from_millis(50));
        }
        let live = self.live_pids();
        let pid = self.pick(&live).expect("a live worker");
        let i = self.workers.iter().position(|w| w.pid() == pid).unwrap();
        let id = self.fault_start(FaultKind::Sigstop, Some(pid), "any-worker");
        self.workers[i].signal(libc::SIGSTOP);
        self.workers[i].stopped = true;
        self.sleep_ms(1500, 2500);
        self.workers[i].signal(libc::SIGCONT);
        self.workers[i].stopped = false;
        self.fault_end(id, FaultKind::Sigstop, "");
    }

    /// Trap one script call of a worker in the proxy until the worker abandons the connection,
    /// and have it delivered 0.5-3 s later. The fault's window is from the catch to the delivery.
    fn late_delivery(&mut self) {
        let kind = FaultKind::LateDelivery;
        // a script of the protocol, by weight, if Redis knows it by the SHA1 computed here
        let total: u64 = self.scripts.iter().map(|s| s.weight).sum();
        let mut x = self.rng.range(0, total - 1);
        let mut chosen = 0;
        for (i, s) in self.scripts.iter().enumerate() {
            if x < s.weight {
                chosen = i;
                break;
            }
            x -= s.weight;
        }
        let sha = self.scripts[chosen].script.sha().to_string();
        let known = self.conn().is_some_and(|mut c| {
            redis::cmd("SCRIPT")
                .arg("EXISTS")
                .arg(&sha)
                .query::<Vec<i64>>(&mut c)
                .is_ok_and(|v| v == [1])
        });
        let delay = Duration::from_millis(self.rng.range(500, 3000));
        // the workers time out after READ_TIMEOUT; a client that never gives up (a blocked
        // wait) gets its request after this long anyway
        let max_wait = workload::READ_TIMEOUT + Duration::from_millis(1500);
        let trap = Trap::Late { delay, max_wait };
        let any: Vec<&[u8]> = vec![b"EVALSHA", b"fairlock:{"];
        let plans: Vec<Vec<&[u8]>> = if known {
            vec![vec![sha.as_bytes()], any]
        } else {
            vec![any]
        };
        let mut caught = false;
        for patterns in plans {
            self.proxy.arm(&patterns, trap);
            let armed = Instant::now();
            while !self.proxy.sprung() && armed.elapsed() < Duration::from_millis(1500) {
                thread::sleep(Duration::from_millis(5));
            }
            if !self.proxy.disarm() {
                caught = true;
                break;
            }
        }
        if !caught {
            self.log("LOG late-delivery: no request of the protocol to trap");
            return;
        }
        let waited = Instant::now();
        let bound = max_wait + delay + Duration::from_secs(2);
        let report = loop {
            if let Some(r) = self.proxy.take_report() {
                break Some(r);
            }
            if waited.elapsed() > bound {
                break None;
            }
            thread::sleep(Duration::from_millis(10));
        };
        let Some(r) = report else {
            // cannot happen within the bound: the trap's waits are bounded by it
            let id = self.fault_start(kind, None, "script=? report=none");
            self.fault_end(id, kind, "delivered=unknown");
            return;
        };
        // name the script(s) of the chunk (a pipeline may hold several calls)
        let mut names: Vec<&str> = self
            .scripts
            .iter()
            .filter(|s| r.request.contains(s.script.sha()))
            .map(|s| s.script.name())
            .collect();
        if names.is_empty() {
            names.push("other");
        }
        let script = names.join("+");
        let id = self.fault_start_at(
            r.caught_ns,
            kind,
            None,
            &format!("script={script} delay_ms={}", delay.as_millis()),
        );
        self.fault_end_at(
            r.done_ns,
            id,
            kind,
            &format!(
                "client_closed_after_ms={} held_ms={} delivered={} reply={}",
                r.client_closed_after
                    .map_or("never".to_string(), |d| d.as_millis().to_string()),
                r.held.as_millis(),
                u8::from(r.delivered),
                reply_word(&r.swallowed_reply)
            ),
        );
        self.log(&format!(
            "LOG late-delivery {id}: reply {:?} to {}",
            r.swallowed_reply,
            &r.request[..r.request.len().min(300)]
        ));
    }

    /// An operator force-unlocks the hold `status()` shows, through a connection whose reply
    /// gets lost, and retries once more. Tries a few holds until one was released for real.
    fn force_unlock(&mut self) {
        let kind = FaultKind::ForceUnlock;
        for _ in 0..10 {
            // Redis must know the script, or the lost reply is a NOSCRIPT (after a restart
            // without persistence, or before any force-unlock) and only the retry runs it
            if let Some(mut c) = self.conn() {
                let script = self
                    .scripts
                    .iter()
                    .find(|s| s.script.name() == "force_unlock")
                    .unwrap()
                    .script;
                let _ = script.load(&mut c);
            }
            let name = LOCKS[self.rng.range(0, LOCKS.len() as u64 - 1) as usize];
            let lock = self.operator.lock(name).expect("lock name");
            let holder = match lock.status() {
                Ok(s) => s.holder,
                Err(e) => {
                    self.log(&format!("LOG operator status of {name} failed: {e}"));
                    thread::sleep(Duration::from_millis(50));
                    continue;
                }
            };
            let Some(h) = holder.filter(|h| self.live_pids().contains(&h.origin.pid)) else {
                thread::sleep(Duration::from_millis(20));
                continue;
            };
            let (owner, token) = (h.origin.owner.clone(), h.fencing_token);
            let id = self.fault_start(
                kind,
                Some(h.origin.pid),
                &format!("lock={name} owner={owner} token={token}"),
            );
            // only force_unlock carries the token: forward it, swallow the reply, cut
            let token_text = token.to_string();
            self.op_proxy.arm(&[token_text.as_bytes()], Trap::LoseReply);
            let lib = lock.force_unlock_hold(&owner, token);
            let report = if self.op_proxy.disarm() {
                None // not trapped: the call went through (or never reached the proxy)
            } else {
                let t = Instant::now();
                loop {
                    match self.op_proxy.take_report() {
                        Some(r) => break Some(r),
                        None if t.elapsed() < Duration::from_secs(1) => {
                            thread::sleep(Duration::from_millis(5))
                        }
                        None => break None,
                    }
                }
            };
            let first = match &report {
                None => "not-trapped",
                Some(r) if r.swallowed_reply.contains("not_held") => "not_held",
                Some(r) if r.swallowed_reply.contains("released") => "released",
                Some(r) if r.swallowed_reply.contains("NOSCRIPT") => "noscript",
                Some(_) => "unknown",
            };
            // the operator's own retry, when the next holder likely holds
            self.sleep_ms(0, 60);
            let retry = if mutant_retry_releases_current() {
                // the bug the checker must catch: a "retry" that releases whoever holds now
                lock.force_unlock().map(|o| o.is_some())
            } else {
                lock.force_unlock_hold(&owner, token)
            };
            let show = |r: &fairlock::Result<bool>| match r {
                Ok(b) => b.to_string(),
                Err(_) => "err".to_string(),
            };
            self.fault_end(
                id,
                kind,
                &format!("first={first} lib={} retry={}", show(&lib), show(&retry)),
            );
            if let Some(r) = &report {
                self.log(&format!(
                    "LOG force-unlock {id}: lost reply {:?} to {}",
                    r.swallowed_reply,
                    &r.request[..r.request.len().min(200)]
                ));
            }
            if let (Err(e), _) | (_, Err(e)) = (&lib, &retry) {
                self.log(&format!("LOG force-unlock {id}: {e}"));
            }
            if first == "released" || (first == "not-trapped" && matches!(lib, Ok(true))) {
                return;
            }
            thread::sleep(Duration::from_millis(30));
        }
    }

    /// Step redis-server's wall clock back by up to 5 s or forward by up to a quarter lease.
    fn clock_step(&mut self) {
        let kind = FaultKind::ClockStep;
        let delta = if self.rng.range(0, 1) == 0 {
            -(self.rng.range(100, MAX_BACKWARD_STEP.as_millis() as u64) as i64)
        } else {
            self.rng.range(20, MAX_FORWARD_STEP.as_millis() as u64) as i64
        };
        let id = self.fault_start(kind, None, &format!("delta_ms={delta}"));
        let offset = self.server.step_clock(delta);
        self.fault_end(id, kind, &format!("offset_ms={offset}"));
    }

    /// Close every worker's stdin (the stop signal) and collect exit codes and panics.
    fn stop_workers(&mut self) -> EndState {
        let mut end = EndState::default();
        for w in &mut self.workers {
            w.proc.close_stdin();
        }
        let deadline = Instant::now() + Duration::from_secs(40);
        for w in &mut self.workers {
            let left = deadline.saturating_duration_since(Instant::now());
            // -1: did not stop in time (and was killed)
            let code = w.proc.wait(left).map_or(Some(-1), |status| status.code());
            end.exits.push((w.idx, w.pid(), code, false));
        }
        for &(idx, pid) in &self.killed {
            end.exits.push((idx, pid, None, true));
        }
        let all: Vec<(u32, PathBuf)> = self
            .workers
            .iter()
            .map(|w| (w.pid(), w.err_path.clone()))
            .chain(
                self.killed
                    .iter()
                    .map(|&(idx, pid)| (pid, self.dir.join(format!("worker-{idx}.err")))),
            )
            .collect();
        for (pid, path) in all {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            if let Some(line) = text.lines().find(|l| l.contains("panicked")) {
                end.panics.push((pid, line.to_string()));
            }
        }
        self.workers.clear();
        end
    }

    /// After the workers stopped: only the fence counters and the tombstones of the last holds
    /// (free lock hashes living out a lease) may remain, besides the workload's own keys. Looks
    /// after 1.5 s, and again until 3 s.
    fn check_keys(&self, end: &mut EndState) -> Option<Duration> {
        let stopped = Instant::now();
        thread::sleep(Duration::from_millis(1500));
        let mut allowed: Vec<String> = Vec::new();
        for name in LOCKS {
            allowed.push(workload::counter_key(name));
            allowed.push(workload::resource_key(name));
        }
        loop {
            let Some(mut c) = self.conn() else {
                end.leftover_keys.push(("<redis unreachable>".into(), 0));
                return None;
            };
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg("*")
                .query(&mut c)
                .unwrap_or_default();
            let mut bad = Vec::new();
            for key in keys {
                if allowed.contains(&key) {
                    continue;
                }
                let pttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut c).unwrap_or(-2);
                // every key of the lock has a TTL now, the fence too (7 days by default)
                let ok = LOCKS.iter().any(|n| {
                    (key == format!("fairlock:{{{n}}}:fence") && pttl > 0)
                        || (key == format!("fairlock:{{{n}}}")
                            && (0..=workload::LEASE.as_millis() as i64).contains(&pttl)
                            && is_tombstone(&mut c, &key))
                });
                if !ok && pttl != -2 {
                    bad.push((key, pttl));
                }
            }
            if bad.is_empty() {
                return Some(stopped.elapsed());
            }
            if stopped.elapsed() > Duration::from_secs(3) {
                end.leftover_keys = bad;
                return None;
            }
            thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Whether the lock hash at `key` is free: the tombstone a release leaves (owner '').
fn is_tombstone(c: &mut redis::Connection, key: &str) -> bool {
    let owner: Option<String> = redis::cmd("HGET")
        .arg(key)
        .arg("owner")
        .query(c)
        .unwrap_or(None);
    owner.as_deref() == Some("")
}

/// `FAIRLOCK_CHAOS_MUTANT=force-retry` turns the operator's retry into `force_unlock()`, which
/// releases whoever holds by then: the NEXT holder. Only to see the checker catch it
/// (`hold_lost`, `force_released_twice`); never set in a normal run.
fn mutant_retry_releases_current() -> bool {
    std::env::var("FAIRLOCK_CHAOS_MUTANT").is_ok_and(|v| v == "force-retry")
}

/// The first word of a printable RESP reply ("*3 $6 queued :17..." -> "queued", a number ->
/// "integer"), for a detail.
fn reply_word(reply: &str) -> String {
    match reply
        .split(' ')
        .find(|w| !w.is_empty() && !w.starts_with(['*', '$']))
    {
        None => "none".to_string(),
        Some(w) if w.starts_with(':') => "integer".to_string(),
        Some(w) => w.trim_start_matches(['+', '-']).to_string(),
    }
}

/// Print a report for people: the summary and the first violations.
pub fn print_report(report: &Report) {
    println!("{}", serde_json::to_string_pretty(&report.summary).unwrap());
    for (kind, detail) in report.violations.iter().take(5) {
        println!("VIOLATION [{kind}] {detail}\n");
    }
    if report.violations.len() > 5 {
        println!("... {} more violations", report.violations.len() - 5);
    }
}
