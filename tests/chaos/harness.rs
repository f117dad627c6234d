//! The parent of a chaos run: starts redis-server, the proxy and the worker processes, injects
//! faults at random (bounded in number and time), lets the system settle in a quiet phase, stops
//! the workers, collects the end state and runs the checker.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::checker::{self, EndState, Params, Report};
use super::history::{now_ns, History};
use super::proxy::Proxy;
use super::workload::{self, Rng};
use crate::support::RedisServer;

pub const LOCKS: [&str; 2] = ["chaos-a", "chaos-b"];

#[derive(Clone, Debug)]
pub struct Scenario {
    pub name: String,
    /// `appendonly yes` + `appendfsync always` (restarts keep the state) or no persistence.
    pub aof: bool,
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
    child: Child,
    stdin: Option<ChildStdin>,
    err_path: PathBuf,
    killed: bool,
    stopped: bool,
}

impl WorkerProc {
    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn signal(&self, sig: libc::c_int) {
        // SAFETY: plain kill(2) on our own child's pid, which we have not reaped yet.
        unsafe { libc::kill(self.pid() as libc::pid_t, sig) };
    }
}

impl Drop for WorkerProc {
    fn drop(&mut self) {
        if self.stopped {
            self.signal(libc::SIGCONT);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Run<'a> {
    s: &'a Scenario,
    dir: PathBuf,
    server: RedisServer,
    proxy: Proxy,
    history: History,
    rng: Rng,
    workers: Vec<WorkerProc>,
    /// (idx, pid) of the workers the harness killed
    killed: Vec<(usize, u32)>,
    next_idx: usize,
    next_fault: u64,
    worker_limit: Duration,
}

pub fn run(s: &Scenario) -> Report {
    let dir = chaos_dir().join(&s.name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the chaos dir");
    let server = if s.aof {
        RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"])
    } else {
        RedisServer::start()
    };
    let proxy = Proxy::start(server.port);
    let history = History::create(&dir.join("parent.log"));
    let mut run = Run {
        s,
        dir: dir.clone(),
        server,
        proxy,
        history,
        rng: Rng::new(s.seed),
        workers: Vec::new(),
        killed: Vec::new(),
        next_idx: 0,
        next_fault: 1,
        worker_limit: s.fault_time + s.quiet_time + Duration::from_secs(120),
    };
    println!(
        "chaos {}: seed {}, {} workers x {} threads, faults for {:?}, quiet {:?}, history in {}",
        s.name,
        s.seed,
        s.workers,
        s.threads,
        s.fault_time,
        s.quiet_time,
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
    drop(run);

    let (files, torn) = super::history::read_dir(&dir);
    let mut report = checker::check(
        files,
        torn,
        &end,
        &Params {
            scenario: s.name.clone(),
            lease_ns: workload::LEASE.as_nanos() as u64,
        },
    );
    let extra = json!({
        "seed": s.seed.to_string(),
        "redis_persistence": if s.aof { "appendonly yes, appendfsync always" } else { "none" },
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
        // /proc/self/exe still runs this binary when a rebuild replaced the file meanwhile
        let exe = Path::new("/proc/self/exe");
        let exe = if exe.exists() {
            exe.to_path_buf()
        } else {
            std::env::current_exe().expect("current test binary")
        };
        let mut child = Command::new(exe)
            .args(["--exact", "chaos_worker", "--nocapture", "--test-threads=1"])
            .env("FAIRLOCK_CHILD", "chaos-worker")
            .env(workload::ENV_URL, self.proxy.url())
            .env(
                workload::ENV_HISTORY,
                self.dir.join(format!("worker-{idx}.log")),
            )
            .env(workload::ENV_THREADS, self.s.threads.to_string())
            .env(workload::ENV_LOCKS, LOCKS.join(","))
            .env(workload::ENV_LIMIT, self.worker_limit.as_secs().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn a chaos worker");
        let stdin = child.stdin.take();
        let w = WorkerProc {
            idx,
            child,
            stdin,
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
            let entries: Vec<String> = redis::cmd("HVALS")
                .arg(format!("fairlock:{{{name}}}:waiters"))
                .query(&mut c)
                .unwrap_or_default();
            // deadline|lease|host|pid|thread
            for e in entries {
                if let Some(pid) = e.split('|').nth(3).and_then(|p| p.parse().ok()) {
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

    fn fault_start(&mut self, kind: &str, target: Option<u32>, detail: &str) -> u64 {
        let id = self.next_fault;
        self.next_fault += 1;
        let target = target.map_or("-".to_string(), |p| p.to_string());
        self.log(&format!("FAULT {id} {kind} start {target} {detail}"));
        id
    }

    fn fault_end(&self, id: u64, kind: &str) {
        self.log(&format!("FAULT {id} {kind} end"));
    }

    fn sleep_ms(&mut self, lo: u64, hi: u64) -> Duration {
        let d = Duration::from_millis(self.rng.range(lo, hi));
        thread::sleep(d);
        d
    }

    fn inject_faults(&mut self) {
        let restart = if self.s.aof {
            "restart-aof"
        } else {
            "restart-volatile"
        };
        let kinds = [
            "sigkill-holder",
            "sigkill-waiter",
            "sigstop",
            restart,
            "drop",
            "blackhole",
            "latency",
        ];
        let end = Instant::now() + self.s.fault_time;
        // the longest fault (latency) lasts 5 s: stop starting faults that could run past `end`
        let last_start = end.checked_sub(Duration::from_secs(6)).unwrap_or(end);
        let max_faults = (self.s.fault_time.as_secs() / 2).max(kinds.len() as u64);
        let mut deck: Vec<&str> = Vec::new();
        let mut injected = 0;
        // warm up
        self.sleep_ms(2000, 2000);
        // the first deck always runs whole, so every kind of fault happens at least once
        let kinds_n = kinds.len() as u64;
        while injected < kinds_n || (Instant::now() < last_start && injected < max_faults) {
            if deck.is_empty() {
                deck = kinds.to_vec();
                for i in (1..deck.len()).rev() {
                    let j = self.rng.range(0, i as u64) as usize;
                    deck.swap(i, j);
                }
            }
            let kind = deck.pop().unwrap();
            self.inject(kind);
            injected += 1;
            // after a kill leave a clean window for the recovery measurement
            let gap = if kind.starts_with("sigkill") {
                (2300, 3000)
            } else {
                (1200, 2500)
            };
            self.sleep_ms(gap.0, gap.1);
        }
        let left = end.saturating_duration_since(Instant::now());
        thread::sleep(left);
    }

    fn inject(&mut self, kind: &str) {
        match kind {
            "sigkill-holder" | "sigkill-waiter" => {
                let preferred = if kind == "sigkill-holder" {
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
                let _ = w.child.kill();
                let _ = w.child.wait();
                w.killed = true;
                self.fault_end(id, kind);
                self.killed.push((w.idx, pid));
                drop(w);
                self.spawn_worker();
            }
            "sigstop" => {
                // The GC-pause case needs a process stopped *inside* a critical section, which
                // lasts a few ms: stop a holder, then ask Redis whether it still holds. If it let
                // go meanwhile, let it run again at once (a logged `sigstop-probe`) and retry.
                for probe in 0..20 {
                    let holders = self.holder_pids();
                    let Some(pid) = self.pick(&holders) else {
                        thread::sleep(Duration::from_millis(20));
                        continue;
                    };
                    let i = self.workers.iter().position(|w| w.pid() == pid).unwrap();
                    let (id, t0) = (self.next_fault, now_ns());
                    self.next_fault += 1;
                    self.workers[i].signal(libc::SIGSTOP);
                    self.workers[i].stopped = true;
                    let long = probe == 19 || self.holder_pids().contains(&pid);
                    let kind = if long { "sigstop" } else { "sigstop-probe" };
                    let start = format!("FAULT {id} {kind} start {pid} holder");
                    self.history.log_at(t0, "parent", &start);
                    if long {
                        self.sleep_ms(1500, 2500);
                    }
                    self.workers[i].signal(libc::SIGCONT);
                    self.workers[i].stopped = false;
                    self.fault_end(id, kind);
                    if long {
                        return;
                    }
                    thread::sleep(Duration::from_millis(50));
                }
                let live = self.live_pids();
                let pid = self.pick(&live).expect("a live worker");
                let i = self.workers.iter().position(|w| w.pid() == pid).unwrap();
                let id = self.fault_start(kind, Some(pid), "any-worker");
                self.workers[i].signal(libc::SIGSTOP);
                self.workers[i].stopped = true;
                self.sleep_ms(1500, 2500);
                self.workers[i].signal(libc::SIGCONT);
                self.workers[i].stopped = false;
                self.fault_end(id, kind);
            }
            "restart-aof" | "restart-volatile" => {
                let id = self.fault_start(kind, None, "kill-9-and-start");
                self.server.restart();
                self.fault_end(id, kind);
            }
            "drop" => {
                let id = self.fault_start(kind, None, "cut-all-connections");
                let n = self.proxy.drop_all();
                self.fault_end(id, kind);
                self.log(&format!("LOG proxy cut {n} connections"));
            }
            "blackhole" => {
                let id = self.fault_start(kind, None, "forward-nothing");
                self.proxy.set_blackhole(true);
                self.sleep_ms(2000, 3000);
                self.proxy.set_blackhole(false);
                self.fault_end(id, kind);
            }
            "latency" => {
                let id = self.fault_start(kind, None, "20ms-per-chunk");
                self.proxy.set_latency(Duration::from_millis(20));
                self.sleep_ms(3000, 5000);
                self.proxy.set_latency(Duration::ZERO);
                self.fault_end(id, kind);
            }
            other => unreachable!("fault {other}"),
        }
    }

    /// Close every worker's stdin (the stop signal) and collect exit codes and panics.
    fn stop_workers(&mut self) -> EndState {
        let mut end = EndState::default();
        for w in &mut self.workers {
            w.stdin = None;
        }
        let deadline = Instant::now() + Duration::from_secs(40);
        for w in &mut self.workers {
            let code = loop {
                match w.child.try_wait() {
                    Ok(Some(status)) => break status.code(),
                    Ok(None) if Instant::now() < deadline => {
                        thread::sleep(Duration::from_millis(20))
                    }
                    _ => {
                        let _ = w.child.kill();
                        let _ = w.child.wait();
                        break Some(-1); // did not stop in time
                    }
                }
            };
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

    /// After the workers stopped: only the fence counters and (for 10 s) release receipts of the
    /// locks may remain, besides the workload's own keys. Looks after 1.5 s, and again until 3 s.
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
                let ok = LOCKS.iter().any(|n| {
                    (key == format!("fairlock:{{{n}}}:fence") && pttl == -1)
                        || (key == format!("fairlock:{{{n}}}:released")
                            && (0..=10_000).contains(&pttl))
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
