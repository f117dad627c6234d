//! Waiting: what threads queued on a lock cost, fairlock only (the target: "Waiting costs one
//! connection per process, not one per thread").
//!
//! - Connections and memory: a worker process (`--child mode=waiting ...`) builds one client
//!   (default `Config`), a holder thread takes the lock(s), then N waiter threads (64 KiB
//!   stacks) queue on one lock, or spread over several. Once `status()` shows them all queued
//!   and the number of connections has held still for 300 ms, the driver counts the lines of
//!   `CLIENT LIST` (minus the lines before the worker started: the driver's own connections)
//!   and reads Redis's `used_memory` and the worker's RSS (`/proc/<pid>/statm`), each against
//!   a baseline taken after the holder took the locks and before the waiters started; then the
//!   holder releases and every waiter acquires and releases in turn. The bound the count is
//!   checked against is `pool_size + 2`.
//! - Hand-off with k waiters: k + 1 workers in a free loop (hold `scale_hold_us`) on one lock,
//!   so at each release the k others are queued: one gets the lock, k - 1 still wait. Thread →
//!   thread: k + 1 threads of one process; process → process: one worker per process up to 16
//!   waiters, then processes of 16 threads and one more process of the rest (256 waiters: 16
//!   processes × 16 threads + 1 × 1). Counted are the releases in the middle of the run (after
//!   a warm-up, before the workers stop asking again), with the number of workers waiting at
//!   each release read from the records (`req <= rel < got`), so the table shows the k it
//!   measured.
//!
//! Every wait is bounded: the queueing by `QUEUE_BOUND`, the worker process's steps by
//! `STEP_BOUND` (then it is killed), the waiters by their `try_lock_until` deadline.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::bench::{between_md, connect, Bench};
use crate::locks::{mono_ns, Lib, Res};
use crate::stats::{dist, r1, DistRow};
use crate::workers::{Layout, Rec};
use crate::{MS, SEC};

/// The waiter threads' stack size.
const STACK_KIB: u32 = 64;
/// How long the waiters may take to show up queued in `status()`.
const QUEUE_BOUND: Duration = Duration::from_secs(60);
/// How long the worker process may take for each other step (connect and hold; drain).
const STEP_BOUND: Duration = Duration::from_secs(60);

/// A row of the results file's `waiting_connections`: N threads of one process waiting.
#[derive(Serialize, Default)]
pub struct WaitingConnRow {
    pub threads: u32,
    pub locks: u32,
    /// waiter threads started, and how many `status()` showed queued when measured
    pub spawned: u32,
    pub queued: u32,
    /// `CLIENT LIST` lines while they waited, minus the lines before the worker process started
    pub connections: Option<i64>,
    pub client_list_lines: Option<i64>,
    pub client_list_lines_before: i64,
    /// `INFO clients` blocked_clients while they waited (connections in BLPOP)
    pub blocked_clients: Option<i64>,
    pub pool_size: Option<u32>,
    /// pool_size + 2
    pub bound: Option<u32>,
    pub within_bound: Option<bool>,
    /// Redis `used_memory` delta (bytes), and per 1,000 waiters in KiB
    pub redis_used_memory_delta: Option<i64>,
    pub redis_kib_per_1000_waiters: Option<f64>,
    /// the worker process's RSS delta (bytes), and per 1,000 waiting threads in KiB; includes
    /// the thread stacks (their touched pages)
    pub rss_delta: Option<i64>,
    pub rss_kib_per_1000_threads: Option<f64>,
    pub stack_kib: u32,
    /// from "go" until all showed queued (or the bound)
    pub queue_ms: Option<f64>,
    /// from the holder's release until every waiter had acquired and released
    pub drain_ms: Option<f64>,
    pub acquired: Option<u32>,
    pub nofile_soft: u64,
    pub nofile_hard: u64,
    pub errors: Vec<String>,
}

/// A row of the results file's `waiting_handoff`: hand-offs with k waiters.
#[derive(Serialize)]
pub struct WaitingHandoffRow {
    pub waiters: u32,
    /// "threads" or "processes"
    pub between: &'static str,
    /// threads per process (one entry: threads of the driver's own process)
    pub layout: Vec<u32>,
    pub hold_us: u64,
    pub acquisitions: usize,
    /// workers waiting at the releases counted: p50, min, max
    pub waiting_at_release_p50: u32,
    pub waiting_at_release_min: u32,
    pub waiting_at_release_max: u32,
    pub overlaps: usize,
    pub rtt_us: f64,
    #[serde(flatten)]
    pub dist: DistRow,
    pub errors: Vec<String>,
}

/// The section: connections and memory while N threads wait, then hand-off with k waiters.
pub fn waiting(b: &mut Bench) {
    let nofile = raise_nofile();
    let (n, l) = (b.sizes.waiting_threads, b.sizes.waiting_locks);
    let rows: Vec<WaitingConnRow> = [(n, 1), (n, l)]
        .into_iter()
        .map(|(threads, locks)| {
            let mut row = conn_run(b, threads, locks);
            (row.nofile_soft, row.nofile_hard) = (nofile.0, nofile.1);
            if let Some(e) = &nofile.2 {
                row.errors.insert(0, e.clone());
            }
            // one connection per waiting thread (and the client's own) must fit
            if nofile.0 < u64::from(threads) + 64 {
                row.errors.insert(
                    0,
                    format!(
                        "RLIMIT_NOFILE is {} (hard {}): too low for {threads} waiters with a connection each",
                        nofile.0, nofile.1
                    ),
                );
            }
            row
        })
        .collect();
    conn_table(b, &rows);
    b.results.waiting_connections = Some(rows);
    let rows = handoff_runs(b);
    b.results.waiting_handoff = Some(rows);
}

/// Raise RLIMIT_NOFILE's soft limit to the hard limit (the worker processes inherit it).
/// Returns (soft, hard, an error when the soft limit stays below what the waiters may need).
fn raise_nofile() -> (u64, u64, Option<String>) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the rlimit we own.
    let mut err = None;
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            err = Some(format!(
                "getrlimit(RLIMIT_NOFILE): {}",
                std::io::Error::last_os_error()
            ));
        } else if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim = raised;
            } else {
                err = Some(format!(
                    "setrlimit(RLIMIT_NOFILE, {}): {}",
                    lim.rlim_max,
                    std::io::Error::last_os_error()
                ));
            }
        }
    }
    (lim.rlim_cur, lim.rlim_max, err)
}

/// The number of lines of `CLIENT LIST`: the server's connections.
fn client_lines(conn: &mut redis::Connection) -> Res<i64> {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(conn)
        .map_err(|e| format!("CLIENT LIST: {e}"))?;
    Ok(list.lines().filter(|l| !l.trim().is_empty()).count() as i64)
}

/// A numeric field of `INFO <section>`.
fn info_field(conn: &mut redis::Connection, section: &str, field: &str) -> Res<i64> {
    let info: String = redis::cmd("INFO")
        .arg(section)
        .query(conn)
        .map_err(|e| format!("INFO {section}: {e}"))?;
    info.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
        .ok_or(format!("INFO {section}: no {field}"))
}

/// The resident set of process `pid`, bytes.
fn rss(pid: u32) -> Res<i64> {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm"))
        .map_err(|e| format!("/proc/{pid}/statm: {e}"))?;
    let pages: i64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .ok_or(format!("/proc/{pid}/statm: {statm:?}"))?;
    // SAFETY: sysconf only reads a system setting.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Ok(pages * page as i64)
}

/// The worker process of a connections run, seen from the driver: its stdout lines arrive on a
/// channel, so every wait for one is bounded.
struct Worker {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    errors: Vec<String>,
}

impl Worker {
    fn start(url: &str, prefix: &str, threads: u32, locks: u32) -> Res<Worker> {
        let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
        let mut child = Command::new(exe)
            .arg("--child")
            .arg("mode=waiting")
            .arg(format!("url={url}"))
            .arg(format!("prefix={prefix}"))
            .arg(format!("threads={threads}"))
            .arg(format!("locks={locks}"))
            .arg(format!("stack_kib={STACK_KIB}"))
            .arg(format!("queue_ms={}", QUEUE_BOUND.as_millis()))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("spawning the waiting process: {e}"))?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Worker {
            child,
            stdin,
            lines: rx,
            errors: vec![],
        })
    }

    /// The rest of the first line that starts with `tag`, within `bound`; the worker's errors
    /// on the way are kept. None (and an error noted) when it ended or the bound passed.
    fn expect(&mut self, tag: &str, bound: Duration) -> Option<String> {
        let until = Instant::now() + bound;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some(e) = line.strip_prefix("error ") {
                        self.errors.push(e.to_string());
                    } else if let Some(rest) = line.strip_prefix(tag) {
                        return Some(rest.trim().to_string());
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    self.errors.push(format!(
                        "the waiting process did not say {tag:?} within {bound:?}"
                    ));
                    return None;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    self.errors
                        .push(format!("the waiting process ended before saying {tag:?}"));
                    return None;
                }
            }
        }
    }

    fn say(&mut self, what: &str) {
        if let Some(stdin) = &mut self.stdin {
            let _ = writeln!(stdin, "{what}").and_then(|_| stdin.flush());
        }
    }

    /// Wait for the worker's end (it was told to finish, or failed): killed if it has not
    /// ended within 5 s.
    fn finish(mut self, ok: bool) -> Vec<String> {
        drop(self.stdin.take());
        let until = Instant::now()
            + if ok {
                Duration::from_secs(5)
            } else {
                Duration::ZERO
            };
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => {
                    if !status.success() {
                        self.errors
                            .push(format!("the waiting process ended with {status}"));
                    }
                    break;
                }
                Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(20)),
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    if ok {
                        self.errors
                            .push("the waiting process had to be killed".into());
                    }
                    break;
                }
            }
        }
        // the errors it printed last
        while let Ok(line) = self.lines.recv_timeout(Duration::from_millis(200)) {
            if let Some(e) = line.strip_prefix("error ") {
                self.errors.push(e.to_string());
            }
        }
        self.errors
    }
}

/// `key=value` pairs of a worker's line.
fn kv(line: &str) -> BTreeMap<&str, &str> {
    line.split_whitespace()
        .filter_map(|p| p.split_once('='))
        .collect()
}

fn num<T: std::str::FromStr>(m: &BTreeMap<&str, &str>, k: &str) -> Option<T> {
    m.get(k).and_then(|v| v.parse().ok())
}

/// One connections run: `threads` threads of a worker process waiting on `locks` locks.
fn conn_run(b: &Bench, threads: u32, locks: u32) -> WaitingConnRow {
    let mut row = WaitingConnRow {
        threads,
        locks,
        stack_kib: STACK_KIB,
        ..Default::default()
    };
    let mut m = connect(&b.url);
    match client_lines(&mut m) {
        Ok(v) => row.client_list_lines_before = v,
        Err(e) => row.errors.push(e),
    }
    let prefix = b.name(&format!("waiting{threads}x{locks}"));
    let mut w = match Worker::start(&b.url, &prefix, threads, locks) {
        Ok(w) => w,
        Err(e) => {
            row.errors.push(e);
            return row;
        }
    };
    let pid = w.child.id();
    let mut ok = false;
    'run: {
        let Some(held) = w.expect("held", STEP_BOUND) else {
            break 'run;
        };
        row.pool_size = num(&kv(&held), "pool_size");
        row.bound = row.pool_size.map(|p| p + 2);
        let mem0 = info_field(&mut m, "memory", "used_memory");
        let rss0 = rss(pid);
        w.say("go");
        let Some(queued) = w.expect("queued", QUEUE_BOUND + STEP_BOUND / 6) else {
            break 'run;
        };
        // a waiter shows in `status()` just before it blocks on its connection: count once the
        // number of connections has held still for 300 ms (at most 5 s), then the rest at once
        let settle = Instant::now() + Duration::from_secs(5);
        let mut lines = client_lines(&mut m);
        let mut same = 0;
        while same < 3 && Instant::now() < settle {
            std::thread::sleep(Duration::from_millis(100));
            let now = client_lines(&mut m);
            same = if now == lines { same + 1 } else { 0 };
            lines = now;
        }
        let mem1 = info_field(&mut m, "memory", "used_memory");
        let rss1 = rss(pid);
        let blocked = info_field(&mut m, "clients", "blocked_clients");
        let q = kv(&queued);
        row.spawned = num(&q, "spawned").unwrap_or(0);
        row.queued = num(&q, "n").unwrap_or(0);
        row.queue_ms = num(&q, "ms");
        if row.queued < threads {
            row.errors.push(format!(
                "only {} of {threads} waiters queued within {QUEUE_BOUND:?}; measured anyway",
                row.queued
            ));
        }
        let per_1000 = |delta: i64| r1(delta as f64 / 1024.0 * 1000.0 / row.queued.max(1) as f64);
        match lines {
            Ok(v) => {
                row.client_list_lines = Some(v);
                let c = v - row.client_list_lines_before;
                row.connections = Some(c);
                row.within_bound = row.bound.map(|bd| c <= bd as i64);
            }
            Err(e) => row.errors.push(e),
        }
        match (mem0, mem1) {
            (Ok(a), Ok(z)) => {
                row.redis_used_memory_delta = Some(z - a);
                row.redis_kib_per_1000_waiters = Some(per_1000(z - a));
            }
            (Err(e), _) | (_, Err(e)) => row.errors.push(e),
        }
        match (rss0, rss1) {
            (Ok(a), Ok(z)) => {
                row.rss_delta = Some(z - a);
                row.rss_kib_per_1000_threads = Some(per_1000(z - a));
            }
            (Err(e), _) | (_, Err(e)) => row.errors.push(e),
        }
        match blocked {
            Ok(v) => row.blocked_clients = Some(v),
            Err(e) => row.errors.push(e),
        }
        w.say("release");
        let Some(drained) = w.expect("drained", STEP_BOUND + QUEUE_BOUND) else {
            break 'run;
        };
        let d = kv(&drained);
        row.acquired = num(&d, "acquired");
        row.drain_ms = num(&d, "ms");
        if row.acquired != Some(row.spawned) {
            row.errors.push(format!(
                "{} of {} waiters acquired the lock",
                row.acquired.unwrap_or(0),
                row.spawned
            ));
        }
        ok = w.expect("done", STEP_BOUND).is_some();
    }
    row.errors.extend(w.finish(ok));
    row
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or("-".into(), |v| v.to_string())
}

fn conn_table(b: &mut Bench, rows: &[WaitingConnRow]) {
    b.md.push("### Waiting: N threads of one process queued (fairlock)\n".into());
    b.md.push(format!(
        "Connections: `CLIENT LIST` lines while they wait (once all show queued in `status()` and the count has held still for 300 ms), minus those before the waiting process started (the driver's own); bound = the client's `pool_size` + 2. Memory: deltas from just before the waiters started (the locks already held) to the moment the connections were counted, per 1,000 waiters. The client's RSS includes the waiter threads' stacks ({STACK_KIB} KiB each, the pages touched) and their allocator arenas. RLIMIT_NOFILE {} (hard {}).\n",
        rows.first().map_or(0, |r| r.nofile_soft),
        rows.first().map_or(0, |r| r.nofile_hard),
    ));
    b.md.push("| waiting threads | locks | queued | connections | bound (pool_size + 2) | within bound | blocked clients | Redis used_memory KiB / 1,000 waiters | client RSS KiB / 1,000 threads (incl. stacks) | queued in ms | drained in ms | errors |".into());
    b.md.push("|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|".into());
    for r in rows {
        b.md.push(format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.threads,
            r.locks,
            r.queued,
            opt(r.connections),
            opt(r.bound),
            r.within_bound
                .map_or("-", |w| if w { "yes" } else { "**no**" }),
            opt(r.blocked_clients),
            r.redis_kib_per_1000_waiters
                .map_or("-".into(), |v| format!("{v:.0}")),
            r.rss_kib_per_1000_threads
                .map_or("-".into(), |v| format!("{v:.0}")),
            r.queue_ms.map_or("-".into(), |v| format!("{v:.0}")),
            r.drain_ms.map_or("-".into(), |v| format!("{v:.0}")),
            r.errors.len(),
        ));
    }
    b.md.push(String::new());
}

/// The layout of the process → process run with `k` waiters (k + 1 workers): one worker per
/// process up to 17 workers, else processes of 16 threads and one of the rest.
fn proc_layout(k: u32) -> Vec<u32> {
    let workers = k + 1;
    if workers <= 17 {
        return vec![1; workers as usize];
    }
    let mut v = vec![16; (workers / 16) as usize];
    if !workers.is_multiple_of(16) {
        v.push(workers % 16);
    }
    v
}

/// Hand-offs whose release started in `[lo, hi)`: (latency ns, workers waiting at the
/// release), and the overlaps (grants before the previous holder's release).
fn handoffs_in(recs: &[Rec], lo: u64, hi: u64) -> (Vec<u64>, Vec<u32>, usize) {
    let mut grants: Vec<&Rec> = recs.iter().filter(|r| r.got > 0 && r.seq >= 0).collect();
    grants.sort_by_key(|r| r.seq);
    let (mut lat, mut waiting, mut overlaps) = (vec![], vec![], 0);
    for pair in grants.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if a.rel < lo || a.rel >= hi {
            continue;
        }
        if b.got < a.rel {
            overlaps += 1;
            continue;
        }
        if b.worker != a.worker && b.req <= a.rel {
            lat.push(b.got - a.rel);
            let w = recs
                .iter()
                .filter(|r| r.req <= a.rel && (r.got == 0 || r.got > a.rel))
                .count();
            waiting.push(w as u32);
        }
    }
    (lat, waiting, overlaps)
}

/// Hand-off p50/p99 with k waiters, thread → thread and process → process.
fn handoff_runs(b: &mut Bench) -> Vec<WaitingHandoffRow> {
    let hold = b.sizes.scale_hold_us;
    b.md.push(format!(
        "### Waiting: hand-off with k waiters (fairlock, k + 1 workers in a loop on one lock, hold {} ms)\n",
        hold as f64 / 1000.0
    ));
    b.md.push("A hand-off: a release started → the next holder's acquire returned, while k - 1 others still wait; counted over the middle of each run, the number of workers waiting at each release read from the records. Thread → thread: k + 1 threads of one process; process → process: one worker per process up to 16 waiters, above that processes of 16 threads and one of the rest.\n".into());
    b.md.push("| waiters | between | layout | hand-offs | waiting at release p50 (min-max) | p50 µs | p99 µs | RTT µs | p50 / RTT | p99 / RTT |".into());
    b.md.push("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|".into());
    let mut out = vec![];
    for k in b.sizes.waiting_handoff.clone() {
        for procs in [false, true] {
            let layout = if procs {
                Layout::Procs(proc_layout(k))
            } else {
                Layout::Threads(k + 1)
            };
            let dur = (b.sizes.waiting_secs * SEC as f64) as u64;
            let start = mono_ns()
                + match &layout {
                    Layout::Threads(t) => 300 * MS + *t as u64 * MS,
                    Layout::Procs(p) => 500 * MS + p.len() as u64 * 80 * MS,
                };
            let between = if procs { "processes" } else { "threads" };
            let spec = b.timed_spec(
                Lib::Fairlock,
                &format!("waiting-handoff{k}-{between}"),
                false,
                hold,
                start,
                dur,
            );
            let o = b.run_timed_layout(&spec, &layout, None);
            let warm = (dur / 5).min(500 * MS);
            let (lat, mut waiting, overlaps) = handoffs_in(&o.recs, start + warm, start + dur);
            waiting.sort_unstable();
            let d = dist(lat);
            let (w50, wmin, wmax) = (
                waiting.get(waiting.len() / 2).copied().unwrap_or(0),
                waiting.first().copied().unwrap_or(0),
                waiting.last().copied().unwrap_or(0),
            );
            let layout_md = match &layout {
                Layout::Threads(t) => format!("{t} threads"),
                Layout::Procs(p) => describe_procs(p),
            };
            b.md.push(format!(
                "| {k} | {} | {layout_md} | {} | {w50} ({wmin}-{wmax}) | {} |",
                between_md(procs),
                d.n,
                b.rtt_cells(&[d.p50, d.p99]),
            ));
            out.push(WaitingHandoffRow {
                waiters: k,
                between,
                layout: match layout {
                    Layout::Threads(t) => vec![t],
                    Layout::Procs(p) => p,
                },
                hold_us: hold,
                acquisitions: o.recs.iter().filter(|r| r.got > 0).count(),
                waiting_at_release_p50: w50,
                waiting_at_release_min: wmin,
                waiting_at_release_max: wmax,
                overlaps,
                rtt_us: r1(b.rtt_us),
                dist: d.row(b.rtt_us),
                errors: o.errors,
            });
        }
    }
    b.md.push(String::new());
    out
}

/// "16 procs × 16 + 1 × 1", "17 procs × 1".
fn describe_procs(p: &[u32]) -> String {
    let mut parts: Vec<(usize, u32)> = vec![];
    for &t in p {
        match parts.last_mut() {
            Some((n, tt)) if *tt == t => *n += 1,
            _ => parts.push((1, t)),
        }
    }
    parts
        .iter()
        .enumerate()
        .map(|(i, (n, t))| {
            if i == 0 {
                format!("{n} procs × {t}")
            } else {
                format!("{n} × {t}")
            }
        })
        .collect::<Vec<_>>()
        .join(" + ")
}

// ---- the waiting process --------------------------------------------------------------------

/// The waiting process (`--child mode=waiting url=... prefix=... threads=N locks=L
/// stack_kib=K queue_ms=Q`). Says on stdout `held pool_size=P` once its holder thread holds the
/// L locks, waits for `go` on stdin, starts N waiter threads (thread i waits on lock i mod L),
/// says `queued n=<queued> spawned=<threads started> ms=<time>` once `status()` shows them all
/// (or Q ms passed), waits for `release` (or the end of stdin), lets the holder release, joins
/// the waiters and says `drained acquired=<n> ms=<time>`; errors as `error ...`; `done` last.
pub fn child(args: &[String]) {
    if let Err(e) = child_run(args) {
        println!("error {}", e.replace('\n', " "));
    }
    println!("done");
}

fn child_run(args: &[String]) -> Res<()> {
    let m: BTreeMap<&str, &str> = args.iter().filter_map(|a| a.split_once('=')).collect();
    let get = |k: &str| {
        m.get(k)
            .copied()
            .ok_or(format!("waiting child: missing {k}"))
    };
    let n = |k: &str| -> Res<u64> { get(k)?.parse().map_err(|e| format!("{k}: {e}")) };
    let (url, prefix) = (get("url")?, get("prefix")?);
    let (threads, nlocks) = (n("threads")? as usize, n("locks")?.max(1) as usize);
    let stack = n("stack_kib")? as usize * 1024;
    let queue_bound = Duration::from_millis(n("queue_ms")?);

    let client =
        crate::workers::fairlock_client(url).map_err(|e| format!("fairlock client: {e}"))?;
    let pool_size = client.config().pool_size;
    let locks = (0..nlocks)
        .map(|i| client.fair_lock(&format!("{prefix}-{i}")))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("lock handle: {e}"))?;

    // the holder: takes every lock, releases them when told (or after the bounds)
    let (held_tx, held_rx) = mpsc::channel::<Res<()>>();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let held_locks = locks.clone();
    let hold_bound = 2 * queue_bound + STEP_BOUND;
    let holder = std::thread::Builder::new()
        .name("holder".into())
        .spawn(move || -> Res<()> {
            let mut guards = vec![];
            for l in &held_locks {
                match l.try_lock_for(Duration::from_secs(10)) {
                    Ok(Some(g)) => guards.push(g),
                    Ok(None) => {
                        let _ = held_tx.send(Err("holder: a lock was busy for 10 s".into()));
                        return Ok(());
                    }
                    Err(e) => {
                        let _ = held_tx.send(Err(format!("holder: {e}")));
                        return Ok(());
                    }
                }
            }
            let _ = held_tx.send(Ok(()));
            let _ = release_rx.recv_timeout(hold_bound);
            for g in guards {
                g.unlock().map_err(|e| format!("holder release: {e}"))?;
            }
            Ok(())
        })
        .map_err(|e| format!("spawning the holder: {e}"))?;
    held_rx
        .recv_timeout(STEP_BOUND)
        .map_err(|_| "the holder did not take the locks in time".to_string())??;
    println!("held pool_size={pool_size}");
    let mut stdin = std::io::stdin().lock();
    let mut line = String::new();
    let _ = stdin.read_line(&mut line);

    let deadline = Instant::now() + queue_bound + STEP_BOUND;
    let began = Instant::now();
    let mut waiters = vec![];
    for i in 0..threads {
        let lock = locks[i % nlocks].clone();
        let spawned = std::thread::Builder::new()
            .name(format!("waiter-{i}"))
            .stack_size(stack)
            .spawn(move || -> Res<bool> {
                match lock.try_lock_until(deadline) {
                    Ok(Some(g)) => g.unlock().map(|_| true).map_err(|e| format!("{e}")),
                    Ok(None) => Ok(false),
                    Err(e) => Err(format!("{e}")),
                }
            });
        match spawned {
            Ok(h) => waiters.push(h),
            Err(e) => {
                println!("error spawning waiter thread {i}: {e}");
                break;
            }
        }
    }
    let mut queued = 0;
    let mut status_error = None;
    while began.elapsed() < queue_bound {
        let mut q = 0;
        for l in &locks {
            match l.status() {
                Ok(s) => q += s.waiters.len(),
                Err(e) => status_error = Some(format!("status: {e}")),
            }
        }
        queued = q;
        if queued >= waiters.len() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if let Some(e) = status_error {
        println!("error {e}");
    }
    println!(
        "queued n={queued} spawned={} ms={:.1}",
        waiters.len(),
        began.elapsed().as_secs_f64() * 1000.0
    );
    line.clear();
    let _ = stdin.read_line(&mut line);

    let drain = Instant::now();
    let _ = release_tx.send(());
    let mut errors: BTreeMap<String, usize> = BTreeMap::new();
    match holder.join() {
        Ok(Ok(())) => {}
        Ok(Err(e)) => *errors.entry(e).or_default() += 1,
        Err(_) => *errors.entry("the holder panicked".into()).or_default() += 1,
    }
    let mut acquired = 0;
    for h in waiters {
        match h.join() {
            Ok(Ok(true)) => acquired += 1,
            Ok(Ok(false)) => {
                *errors
                    .entry("waiter: gave up at its deadline".into())
                    .or_default() += 1
            }
            Ok(Err(e)) => *errors.entry(format!("waiter: {e}")).or_default() += 1,
            Err(_) => *errors.entry("waiter panicked".into()).or_default() += 1,
        }
    }
    for (e, count) in errors {
        println!("error {count} × {}", e.replace('\n', " "));
    }
    println!(
        "drained acquired={acquired} ms={:.1}",
        drain.elapsed().as_secs_f64() * 1000.0
    );
    Ok(())
}
