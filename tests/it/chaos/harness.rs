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
//!
//! The Sentinel and Cluster modes (`Scenario::deployment`) run the workers against a topology
//! (`chaos/topo.rs`) with the counter and the fenced resource on a redis-server of their own,
//! and deal the worker faults (SIGKILL of holders and waiters, SIGSTOP) with two of their own:
//! - `kill-master`: SIGKILL of the master (in a Cluster, of a lock's shard); the harness reads
//!   each lock's fencing counter on the replicas once their link is down (what the promoted one
//!   starts from), waits for the promotion, then starts the killed node again and waits until
//!   it is a linked replica.
//! - `failover`: `SENTINEL FAILOVER`, or `CLUSTER FAILOVER` sent to the replica of a lock's
//!   shard, until the old master is a linked replica again.
//!
//! No proxy there (clients connect to the addresses the topology announces), so no network
//! faults, late deliveries or force-unlocks with lost replies; no clock steps either.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::checker::{self, EndState, Params, Report};
use super::history::{now_ns, FaultKind, History};
use super::proxy::{Proxy, Trap};
use super::server::Server;
use super::topo::{self, Deployment, Topology};
use super::workload::{self, Rng, Workload};
use crate::support::{unix_micros, ChildTest, Proc, RedisServer};

pub const LOCKS: [&str; 2] = ["chaos-a", "chaos-b"];

/// The largest forward step of the server clock: a forward step of S shortens every lease on
/// the server by S (Redis TTLs follow the wall clock; docs/guarantees.md, Limits) while the holders' estimates
/// do not know. The watchdog renews every third of the lease, so the server keeps at least two
/// thirds of it; a quarter leaves a margin of more than a third of the lease for a late renewal.
pub const MAX_FORWARD_STEP: Duration =
    Duration::from_millis(workload::LEASE.as_millis() as u64 / 4);
/// The largest backward step of the server clock.
pub const MAX_BACKWARD_STEP: Duration = Duration::from_secs(5);

/// How often a late delivery traps each of the protocol's scripts (known by their function
/// names from `fairlock::raw::scripts()`); weight 0: never chosen, only named in reports. While
/// Redis lacks the function library (after a restart), any script call of the lock protocol is
/// trapped instead.
const TRAP_WEIGHTS: [(&str, u64); 5] = [
    ("acquire", 4),
    ("release", 4),
    ("heartbeat", 2),
    ("leave", 1),
    ("renew", 1),
];

/// The same for the semaphore's scripts (the `sem` and `rw` workloads).
const SEM_TRAP_WEIGHTS: [(&str, u64); 5] = [
    ("sem_acquire", 4),
    ("sem_release", 4),
    ("sem_heartbeat", 2),
    ("sem_leave", 1),
    ("sem_renew", 1),
];

/// One of the protocol's scripts and how often a late delivery traps it.
struct ScriptInfo {
    name: String,
    /// The name `FCALL` calls it by.
    function: String,
    weight: u64,
}

/// The scripts a late delivery may trap, weighted for `workload` (the other workload's: 0).
fn trap_scripts(workload: Workload) -> Vec<ScriptInfo> {
    let weight = |table: &[(&str, u64)], name: &str| {
        table.iter().find(|(n, _)| *n == name).map_or(0, |w| w.1)
    };
    let mutex = workload == Workload::Mutex;
    let mut scripts: Vec<ScriptInfo> = fairlock::raw::scripts()
        .into_iter()
        .map(|script| ScriptInfo {
            name: script.name().to_string(),
            function: script.function().to_string(),
            weight: if mutex {
                weight(&TRAP_WEIGHTS, script.name())
            } else {
                0
            },
        })
        .collect();
    // the semaphore's functions are in the same library: `fairlock_<library hash>_<name>`
    let acquire = fairlock::raw::scripts()[0].function().to_string();
    let prefix = acquire
        .strip_suffix("acquire")
        .expect("function names end with the script's name");
    for (name, w) in SEM_TRAP_WEIGHTS {
        scripts.push(ScriptInfo {
            name: name.to_string(),
            function: format!("{prefix}{name}"),
            weight: if mutex { 0 } else { w },
        });
    }
    scripts
}

#[derive(Clone, Debug)]
pub struct Scenario {
    pub name: String,
    /// One node behind the proxy, a Sentinel group or a Redis Cluster.
    pub deployment: Deployment,
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
    /// What the workers take: a mutex, a semaphore or a read/write lock per name.
    pub workload: Workload,
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

/// The single-node mode's Redis and the ways to it.
struct Direct {
    server: Server,
    /// The workers' way to Redis.
    proxy: Proxy,
    /// The operator's way to Redis (force-unlocks whose replies get lost).
    op_proxy: Proxy,
    operator: fairlock::LockClient,
}

/// Where the locks live.
enum Redis {
    Single(Direct),
    Topology {
        topology: Topology,
        /// The counter and the fenced resource, on a server no fault touches.
        resource: RedisServer,
    },
}

struct Run<'a> {
    s: &'a Scenario,
    /// Starts the workers: the calling test again, in the "chaos-worker" role.
    children: &'a ChildTest,
    dir: PathBuf,
    redis: Redis,
    /// The lock names (in a Cluster, chosen so that each lies on another master).
    locks: Vec<String>,
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
    let redis = match s.deployment {
        Deployment::Single => {
            let server = Server::start(s.aof, s.fake_clock);
            let proxy = Proxy::start(server.port());
            let op_proxy = Proxy::start(server.port());
            let operator = fairlock::LockClient::builder(&op_proxy.url())
                .connect_timeout(Duration::from_secs(1))
                .read_timeout(Duration::from_secs(2))
                .build()
                .expect("the operator's client");
            Redis::Single(Direct {
                server,
                proxy,
                op_proxy,
                operator,
            })
        }
        d => Redis::Topology {
            topology: Topology::start(d),
            resource: RedisServer::start(),
        },
    };
    let locks = match &redis {
        Redis::Single(_) => LOCKS.iter().map(|l| l.to_string()).collect(),
        Redis::Topology { topology, .. } => topology.lock_names(&LOCKS),
    };
    let scripts = trap_scripts(s.workload);
    let history = History::create(&dir.join("parent.log"));
    let mut run = Run {
        s,
        children,
        dir: dir.clone(),
        redis,
        locks,
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
        "chaos {} ({}, {} workload, locks {:?}): seed {}, {} workers x {} threads, faults for {:?}, quiet {:?}, server clock {}, history in {}",
        s.name,
        s.deployment.name(),
        s.workload.name(),
        run.locks,
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
    // what the server holds for each name at the end of the quiet phase, for a liveness report
    run.log_lock_state();
    run.phase("stop");
    let mut end = run.stop_workers();
    let keys_clean_after = run.check_keys(&mut end);
    let final_offset = match &run.redis {
        Redis::Single(d) => d.server.offset_ms(),
        Redis::Topology { .. } => 0,
    };
    let locks = run.locks.clone();
    drop(run);

    let (files, torn) = super::history::read_dir(&dir);
    let mut report = checker::check(
        files,
        torn,
        &end,
        &Params {
            scenario: s.name.clone(),
            capacity: s.workload.capacity(),
            lease_ns: workload::LEASE.as_nanos() as u64,
            max_forward_step_ns: MAX_FORWARD_STEP.as_nanos() as u64,
        },
    );
    let extra = json!({
        "seed": s.seed.to_string(),
        "workload": s.workload.name(),
        "deployment": s.deployment.name(),
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
        "locks": locks,
        "lock_slots": match s.deployment {
            Deployment::Cluster => json!(topo::slots_of(&locks)),
            _ => Value::Null,
        },
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
        match &self.redis {
            Redis::Single(d) => cmd.env(workload::ENV_URL, d.proxy.url()),
            Redis::Topology { topology, resource } => {
                if let Some(ca) = topology.tls_ca() {
                    cmd.env(workload::ENV_TLS_CA, ca);
                }
                cmd.env(workload::ENV_URL, topology.worker_url())
                    .env(workload::ENV_RESOURCE_URL, resource.url())
            }
        };
        cmd.env(
            workload::ENV_HISTORY,
            self.dir.join(format!("worker-{idx}.log")),
        )
        .env(workload::ENV_THREADS, self.s.threads.to_string())
        .env(workload::ENV_WORKLOAD, self.s.workload.name())
        .env(workload::ENV_LOCKS, self.locks.join(","))
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

    /// Log (`LOG state ...`) each name's keys on its master: the lock hash, or the semaphore's
    /// hash, leases, hand-offs, queue and waiters, with the server's time.
    fn log_lock_state(&self) {
        for name in &self.locks {
            let Some(mut c) = self.lock_conn(name) else {
                self.log(&format!("LOG state {name}: no connection"));
                continue;
            };
            let time: Vec<String> = redis::cmd("TIME").query(&mut c).unwrap_or_default();
            let mut parts = vec![format!("time={}", time.join("."))];
            let base = format!("fairlock:{{{name}}}");
            for (key, how) in [
                (base.clone(), "HGETALL"),
                (format!("{base}:waiters"), "HGETALL"),
                (format!("{base}:sem"), "HGETALL"),
                (format!("{base}:sem:leases"), "ZRANGE"),
                (format!("{base}:sem:handoffs"), "ZRANGE"),
                (format!("{base}:sem:queue"), "ZRANGE"),
                (format!("{base}:sem:waiters"), "HGETALL"),
            ] {
                let mut cmd = redis::cmd(how);
                cmd.arg(&key);
                if how == "ZRANGE" {
                    cmd.arg(0).arg(-1).arg("WITHSCORES");
                }
                let v: Vec<String> = cmd.query(&mut c).unwrap_or_default();
                let pttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut c).unwrap_or(-3);
                if !v.is_empty() {
                    parts.push(format!("{key}(pttl {pttl})={v:?}"));
                }
            }
            self.log(&format!("LOG state {name}: {}", parts.join(" ")));
        }
    }

    /// The single-node mode's server, proxies and operator.
    fn direct(&self) -> &Direct {
        match &self.redis {
            Redis::Single(d) => d,
            Redis::Topology { .. } => panic!("a fault of the single-node mode in a topology"),
        }
    }

    fn direct_mut(&mut self) -> &mut Direct {
        match &mut self.redis {
            Redis::Single(d) => d,
            Redis::Topology { .. } => panic!("a fault of the single-node mode in a topology"),
        }
    }

    fn topology(&mut self) -> &mut Topology {
        match &mut self.redis {
            Redis::Topology { topology, .. } => topology,
            Redis::Single(_) => panic!("a topology fault in the single-node mode"),
        }
    }

    /// A direct connection (not through the proxy) to the single node.
    fn conn(&self) -> Option<redis::Connection> {
        let c = redis::Client::open(self.direct().server.url())
            .ok()?
            .get_connection_with_timeout(Duration::from_secs(1))
            .ok()?;
        c.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        Some(c)
    }

    /// A direct connection to the master of `lock` now, for looking at the lock state (`None`
    /// during a failover).
    fn lock_conn(&self, lock: &str) -> Option<redis::Connection> {
        match &self.redis {
            Redis::Single(_) => self.conn(),
            Redis::Topology { topology, .. } => topology.conn_for(lock),
        }
    }

    /// Connections to every master, at the end of a run (the topology settled).
    fn master_conns(&self) -> Vec<Option<redis::Connection>> {
        match &self.redis {
            Redis::Single(_) => vec![self.conn()],
            Redis::Topology { topology, .. } => topology
                .master_ports()
                .into_iter()
                .map(topo::try_conn)
                .collect(),
        }
    }

    fn live_pids(&self) -> Vec<u32> {
        self.workers.iter().map(|w| w.pid()).collect()
    }

    /// Pids of our workers that hold a lock now, as Redis sees it.
    fn holder_pids(&self) -> Vec<u32> {
        let live = self.live_pids();
        let mut pids = Vec::new();
        for name in &self.locks {
            let Some(mut c) = self.lock_conn(name) else {
                continue;
            };
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
            // a semaphore's holds: "<owner>#<attempt>" -> token|permits|lease|host|pid|thread
            let holds: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
                .arg(format!("fairlock:{{{name}}}:sem"))
                .query(&mut c)
                .unwrap_or_default();
            for (field, v) in holds {
                if field.starts_with('~') {
                    continue;
                }
                if let Some(pid) = v.split('|').nth(4).and_then(|p| p.parse().ok()) {
                    if live.contains(&pid) && !pids.contains(&pid) {
                        pids.push(pid);
                    }
                }
            }
        }
        pids
    }

    /// Pids of our workers with a thread in a queue that hold no lock.
    fn waiter_pids(&self) -> Vec<u32> {
        let live = self.live_pids();
        let holders = self.holder_pids();
        let mut pids = Vec::new();
        for name in &self.locks {
            let Some(mut c) = self.lock_conn(name) else {
                continue;
            };
            // the mutex's waiters and the semaphore's (whose meta starts with "k;")
            let mut entries: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
                .arg(format!("fairlock:{{{name}}}:waiters"))
                .query(&mut c)
                .unwrap_or_default();
            let sem: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
                .arg(format!("fairlock:{{{name}}}:sem:waiters"))
                .query(&mut c)
                .unwrap_or_default();
            entries.extend(sem);
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

    /// The kinds of fault of one deck.
    fn fault_kinds(&self) -> Vec<FaultKind> {
        let Redis::Single(d) = &self.redis else {
            // a topology: the worker faults, and two master kills per graceful failover (the
            // kills are what asynchronous replication can lose writes in), a frozen sentinel or
            // a slot migration
            let mut kinds = vec![
                FaultKind::SigkillHolder,
                FaultKind::SigkillWaiter,
                FaultKind::Sigstop,
                FaultKind::WaiterHiccup,
                FaultKind::KillMaster,
                FaultKind::KillMaster,
                FaultKind::Failover,
            ];
            if let Redis::Topology { topology, .. } = &self.redis {
                kinds.push(match topology {
                    Topology::Sentinel(_) => FaultKind::StopSentinel,
                    Topology::Cluster(_) => FaultKind::MigrateSlot,
                });
            }
            return kinds;
        };
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
            FaultKind::WaiterHiccup,
        ];
        if d.server.can_step_clock() {
            // cheap and instant: twice per deck
            kinds.extend([FaultKind::ClockStep, FaultKind::ClockStep]);
        }
        kinds
    }

    fn inject_faults(&mut self) {
        let kinds = self.fault_kinds();
        let end = Instant::now() + self.s.fault_time;
        // the longest faults (a late delivery, latency) last 6.5 s, a failover with the rejoin
        // of the old master up to about 20 s: stop starting faults that could run past `end`
        let longest = match self.redis {
            Redis::Single(_) => Duration::from_secs(7),
            Redis::Topology { .. } => Duration::from_secs(20),
        };
        let last_start = end.checked_sub(longest).unwrap_or(end);
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
            // after a kill leave a clean window for the recovery measurement; after a failover
            // some load on the new master before the next fault
            let gap = if kind.is_kill() {
                (2300, 3000)
            } else if kind.is_failover() {
                (1500, 3000)
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
                let d = self.direct_mut();
                let port = d.server.restart();
                d.proxy.set_upstream(port);
                d.op_proxy.set_upstream(port);
                self.fault_end(id, kind, &format!("port={port}"));
            }
            FaultKind::Drop => {
                let id = self.fault_start(kind, None, "cut-all-connections");
                let n = self.direct().proxy.drop_all();
                self.fault_end(id, kind, &format!("connections={n}"));
            }
            FaultKind::Blackhole => {
                let id = self.fault_start(kind, None, "forward-nothing");
                self.direct().proxy.set_blackhole(true);
                self.sleep_ms(2000, 3000);
                self.direct().proxy.set_blackhole(false);
                self.fault_end(id, kind, "");
            }
            FaultKind::Latency => {
                let id = self.fault_start(kind, None, "20ms-per-chunk");
                self.direct().proxy.set_latency(Duration::from_millis(20));
                self.sleep_ms(2000, 3500);
                self.direct().proxy.set_latency(Duration::ZERO);
                self.fault_end(id, kind, "");
            }
            FaultKind::LateDelivery => self.late_delivery(),
            FaultKind::ForceUnlock => self.force_unlock(),
            FaultKind::ClockStep => self.clock_step(),
            FaultKind::KillMaster => self.kill_master(),
            FaultKind::Failover => self.graceful_failover(),
            FaultKind::WaiterHiccup => self.waiter_hiccup(),
            FaultKind::StopSentinel => {
                let pick = self.rng.range(0, 2) as usize;
                let id = self.fault_start(kind, None, "sigstop-one-sentinel");
                let frozen = self.topology().freeze_a_sentinel(pick);
                self.sleep_ms(3000, 6000);
                let port = frozen.map(|(port, guard)| {
                    drop(guard);
                    port
                });
                // the continued sentinel reconnects and catches up before the next fault (the
                // harness's own failover waits ask every sentinel)
                let settled = self.topology().settle_sentinels();
                self.fault_end(id, kind, &format!("port={port:?} settled={settled}"));
            }
            FaultKind::MigrateSlot => {
                let lock =
                    self.locks[self.rng.range(0, self.locks.len() as u64 - 1) as usize].clone();
                let id = self.fault_start(kind, None, &format!("lock={lock}"));
                let moved = self.topology().migrate_lock(&lock);
                self.fault_end(id, kind, &format!("moved={moved:?}"));
            }
        }
    }

    /// Stop and continue a waiting worker three times, briefly (50-150 ms: well within its
    /// janitor's interval, so it is no dead waiter), as Ctrl-Z and `fg` do.
    fn waiter_hiccup(&mut self) {
        let kind = FaultKind::WaiterHiccup;
        let waiters = self.waiter_pids();
        let Some(pid) = self.pick(&waiters) else {
            let id = self.fault_start(kind, None, "no-waiter");
            self.fault_end(id, kind, "");
            return;
        };
        let i = self.workers.iter().position(|w| w.pid() == pid).unwrap();
        let id = self.fault_start(kind, Some(pid), "stop-continue-x3");
        for _ in 0..3 {
            self.workers[i].signal(libc::SIGSTOP);
            self.sleep_ms(50, 150);
            self.workers[i].signal(libc::SIGCONT);
            self.sleep_ms(100, 300);
        }
        self.fault_end(id, kind, "");
    }

    /// SIGKILL the master of a lock (in a Cluster, of a lock's shard), read the fencing
    /// counters the replicas were left with (see `chaos/topo.rs`), wait for the promotion, and
    /// start the killed node again as a replica. Start (stamped right after the death) detail:
    /// the killed port, the locks it served and the wall clock then in µs (fencing tokens are
    /// server µs: a token above it by more than the promotion delay is a new master's). End detail: the new master, how
    /// long the promotion took, and `fence:<lock>=N` as the promoted replica had it
    /// (`snapshot=missing` when it could not be read).
    fn kill_master(&mut self) {
        let kind = FaultKind::KillMaster;
        let lock = self.locks[self.rng.range(0, self.locks.len() as u64 - 1) as usize].clone();
        let locks = self.locks.clone();
        let topology = self.topology();
        let cluster = matches!(topology, Topology::Cluster(_));
        let (old, replicas) = topology.master_and_replicas(&lock);
        let served = topology.locks_served_by(old, &locks);
        // the kill returns once the process is gone (a Cluster's looks up its slots first):
        // the fault starts then, and its server clock is read then, so that every grant of the
        // killed master came before both
        topology.kill(old);
        let (t, killed) = (now_ns(), Instant::now());
        // through Sentinel, a second promotion while the first promoted master lives (see
        // `topo::watch_promotions`)
        let stop_watch = Arc::new(AtomicBool::new(false));
        let split_watch = (!cluster).then(|| {
            topo::watch_promotions(replicas.clone(), locks.clone(), Arc::clone(&stop_watch))
        });
        let unix_us = unix_micros();
        let id = self.fault_start_at(
            t,
            kind,
            None,
            &format!("port={old} locks={} unix_us={unix_us}", served.join(",")),
        );
        let snapshots: Vec<(u16, Option<topo::Fences>)> = replicas
            .iter()
            .map(|&r| (r, topo::snapshot_fences(r, &served, cluster)))
            .collect();
        let new = self.topology().wait_for_new_master(old);
        let promoted_ms = killed.elapsed().as_millis();
        stop_watch.store(true, Ordering::SeqCst);
        let split = split_watch.and_then(|w| w.join().expect("the promotion watch panicked"));
        let promoted = snapshots
            .iter()
            .find(|(r, _)| *r == new)
            .and_then(|(_, s)| s.clone());
        let mut detail = format!("new={new} promoted_after_ms={promoted_ms}");
        match &promoted {
            Some(fences) => detail.push_str(&snapshot_detail(fences)),
            None => detail.push_str(" snapshot=missing"),
        }
        if let Some(p) = &split {
            self.log(&format!(
                "LOG kill-master {id}: {} was promoted while another master lived (Sentinel failed over the first promoted one too): fencing counters then {:?}",
                p.port, p.fences
            ));
            detail.push_str(&format!(
                " split=ok split_port={} split_unix_us={}",
                p.port, p.unix_us
            ));
            for (l, f) in &p.fences {
                detail.push_str(&format!(" split_fence:{l}={f}"));
            }
        }
        self.log(&format!(
            "LOG kill-master {id}: replicas' fencing counters after the kill: {snapshots:?}"
        ));
        self.topology().restart(old);
        self.fault_end(id, kind, &detail);
    }

    /// A graceful failover of the master of a lock, until the old master is a linked replica.
    fn graceful_failover(&mut self) {
        let kind = FaultKind::Failover;
        let lock = self.locks[self.rng.range(0, self.locks.len() as u64 - 1) as usize].clone();
        let id = self.fault_start(kind, None, &format!("lock={lock}"));
        let started = Instant::now();
        let locks = self.locks.clone();
        let f = self.topology().graceful_failover(&lock, &locks);
        let mut detail = format!(
            "old={} new={} switched_after_ms={} took_ms={}",
            f.old,
            f.new,
            f.switched.as_millis(),
            started.elapsed().as_millis()
        );
        if let Some(p) = &f.promoted {
            detail.push_str(&format!(" promoted_unix_us={}", p.unix_us));
            detail.push_str(&snapshot_detail(&p.fences));
        }
        self.fault_end(id, kind, &detail);
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
        // a function of the protocol, by weight, if Redis has the library it is in
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
        let function = self.scripts[chosen].function.clone();
        let known = self.conn().is_some_and(|mut c| {
            redis::cmd("FUNCTION")
                .arg("LIST")
                .arg("LIBRARYNAME")
                .arg(fairlock::raw::library_name())
                .query::<Vec<redis::Value>>(&mut c)
                .is_ok_and(|v| !v.is_empty())
        });
        let delay = Duration::from_millis(self.rng.range(500, 3000));
        // the workers time out after READ_TIMEOUT; a client that never gives up (a blocked
        // wait) gets its request after this long anyway
        let max_wait = workload::READ_TIMEOUT + Duration::from_millis(1500);
        let trap = Trap::Late { delay, max_wait };
        let any: Vec<&[u8]> = vec![b"FCALL", b"fairlock:{"];
        let plans: Vec<Vec<&[u8]>> = if known {
            vec![vec![function.as_bytes()], any]
        } else {
            vec![any]
        };
        let mut caught = false;
        for patterns in plans {
            let proxy = &self.direct().proxy;
            proxy.arm(&patterns, trap);
            let armed = Instant::now();
            while !proxy.sprung() && armed.elapsed() < Duration::from_millis(1500) {
                thread::sleep(Duration::from_millis(5));
            }
            if !proxy.disarm() {
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
            if let Some(r) = self.direct().proxy.take_report() {
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
            .filter(|s| r.request.contains(&s.function))
            .map(|s| s.name.as_str())
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
        if self.s.workload != Workload::Mutex {
            return self.force_release();
        }
        let kind = FaultKind::ForceUnlock;
        for _ in 0..10 {
            // Redis must have the function library, or the lost reply is a "Function not
            // found" (after a restart without persistence) and only the retry runs it
            if let Some(mut c) = self.conn() {
                let _ = fairlock::raw::load_library(&mut c);
            }
            let name = self.locks[self.rng.range(0, self.locks.len() as u64 - 1) as usize].clone();
            let lock = self.direct().operator.fair_lock(&name).expect("lock name");
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
            let op_proxy = &self.direct().op_proxy;
            op_proxy.arm(&[token_text.as_bytes()], Trap::LoseReply);
            let lib = lock.force_unlock_hold(&owner, token);
            let report = if op_proxy.disarm() {
                None // not trapped: the call went through (or never reached the proxy)
            } else {
                let t = Instant::now();
                loop {
                    match op_proxy.take_report() {
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
                Some(r)
                    if r.swallowed_reply.contains("NOSCRIPT")
                        || r.swallowed_reply.contains("Function not found") =>
                {
                    "noscript"
                }
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

    /// The `sem` and `rw` workloads' force-unlock: an operator reads the holds with `status()`
    /// and calls `force_release(hold id, token)` on one of a live worker, through a connection
    /// whose reply gets lost (the library sends it again), and retries once more. Recorded as a
    /// `force-unlock` naming the hold's pid, name and token, so the checker's rules for it
    /// (8.) apply as they are.
    fn force_release(&mut self) {
        let kind = FaultKind::ForceUnlock;
        for _ in 0..10 {
            if let Some(mut c) = self.conn() {
                let _ = fairlock::raw::load_library(&mut c);
            }
            let name = self.locks[self.rng.range(0, self.locks.len() as u64 - 1) as usize].clone();
            let operator = &self.direct().operator;
            let sem = match self.s.workload {
                Workload::Sem => operator.semaphore(&name, workload::SEM_CAPACITY),
                _ => operator.rw_lock(&name).map(|l| l.as_semaphore().clone()),
            }
            .expect("semaphore name");
            let holders = match sem.status() {
                Ok(s) => s.holders,
                Err(e) => {
                    self.log(&format!("LOG operator status of {name} failed: {e}"));
                    thread::sleep(Duration::from_millis(50));
                    continue;
                }
            };
            let live = self.live_pids();
            let candidates: Vec<_> = holders
                .into_iter()
                .filter(|h| live.contains(&h.origin.pid))
                .collect();
            if candidates.is_empty() {
                thread::sleep(Duration::from_millis(20));
                continue;
            }
            let h = &candidates[self.rng.range(0, candidates.len() as u64 - 1) as usize];
            let (hold, token, pid) = (h.hold_id.clone(), h.fencing_token, h.origin.pid);
            let id = self.fault_start(
                kind,
                Some(pid),
                &format!(
                    "lock={name} owner={hold} token={token} permits={}",
                    h.permits
                ),
            );
            let token_text = token.to_string();
            let op_proxy = &self.direct().op_proxy;
            op_proxy.arm(&[token_text.as_bytes()], Trap::LoseReply);
            let lib = sem.force_release(&hold, token);
            let report = if op_proxy.disarm() {
                None
            } else {
                let t = Instant::now();
                loop {
                    match op_proxy.take_report() {
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
                Some(r)
                    if r.swallowed_reply.contains("NOSCRIPT")
                        || r.swallowed_reply.contains("Function not found") =>
                {
                    "noscript"
                }
                Some(_) => "unknown",
            };
            self.sleep_ms(0, 60);
            let retry = sem.force_release(&hold, token);
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
        let offset = self.direct_mut().server.step_clock(delta);
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

    /// After the workers stopped: only the fence counters, the tombstones of the last holds
    /// (free lock hashes living out a lease) and left marks (see `leave.lua`) may remain, besides the workload's own keys. Looks
    /// after 1.5 s, and again until 3 s.
    fn check_keys(&self, end: &mut EndState) -> Option<Duration> {
        let stopped = Instant::now();
        thread::sleep(Duration::from_millis(1500));
        let mut allowed: Vec<String> = Vec::new();
        for name in &self.locks {
            allowed.push(workload::counter_key(name));
            allowed.push(workload::resource_key(name));
        }
        loop {
            let mut bad = Vec::new();
            for c in self.master_conns() {
                let Some(mut c) = c else {
                    end.leftover_keys.push(("<redis unreachable>".into(), 0));
                    return None;
                };
                bad.extend(self.bad_keys(&mut c, &allowed));
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

    /// The keys on the node of `c` that should not be there (with their PTTL).
    fn bad_keys(&self, c: &mut redis::Connection, allowed: &[String]) -> Vec<(String, i64)> {
        let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(c).unwrap_or_default();
        let mut bad = Vec::new();
        for key in keys {
            if allowed.contains(&key) {
                continue;
            }
            let pttl: i64 = redis::cmd("PTTL").arg(&key).query(c).unwrap_or(-2);
            // every key of the lock has a TTL now, the fence too (7 days by default); the left
            // marks of attempts whose acquire went unanswered live for the queue's TTL
            // a semaphore's keys (hash, leases, hand-offs, queue, waiters, wake lists, left
            // marks, fence) must each be gone or carry a TTL: the fence its own (7 days), the
            // others no longer than the queue's (10 min)
            let ok = self.locks.iter().any(|n| {
                let sem = format!("fairlock:{{{n}}}:sem");
                (key == format!("{sem}:fence") && pttl > 0)
                    || (key.starts_with(&sem) && (1..=600_000).contains(&pttl))
                    || (key == format!("fairlock:{{{n}}}:fence") && pttl > 0)
                    || (key == format!("fairlock:{{{n}}}:left") && (1..=600_000).contains(&pttl))
                    || (key == format!("fairlock:{{{n}}}")
                        && (0..=workload::LEASE.as_millis() as i64).contains(&pttl)
                        && is_tombstone(c, &key))
            });
            if !ok && pttl != -2 {
                bad.push((key, pttl));
            }
        }
        bad
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

/// ` snapshot=ok fence:<lock>=N ...`: a promoted replica's fencing counters in a fault's end
/// detail, as the checker reads them.
fn snapshot_detail(fences: &topo::Fences) -> String {
    let mut detail = String::from(" snapshot=ok");
    for (l, f) in fences {
        detail.push_str(&format!(" fence:{l}={f}"));
    }
    detail
}
