//! The benchmark driver: uncontended and re-entrant cost, hand-off latency,
//! contended throughput with fairness, and scaling with waiters, for fairlock and its two peers
//! (see `locks/mod.rs`), every figure next to the PING round trip (RTT) measured in the same run;
//! what each acquisition costs Redis in calls and CPU time, and for fairlock the calls per
//! script (section "scripts").
//!
//! `scripts/bench.sh` builds and runs it against a throwaway redis-server whose URL it passes in
//! `FAIRLOCK_BENCH_REDIS`. Arguments: `[--quick] [--out PATH] [--criterion DIR] [--only LIST]`
//! (LIST: comma-separated of micro, handoff, throughput, fifo, scaling, scripts) and, to narrow
//! a run down while investigating, `--libs fairlock,naive --layouts 8x4,0x32 --holds 0,1000
//! --secs 2`.
//! It writes a JSON file and prints Markdown tables. Multi-process scenarios re-invoke this
//! binary as `--child k=v ...`.
//!
//! How the figures are taken (all times from CLOCK_MONOTONIC, shared by the processes):
//! - every acquisition is a record: worker, `req` (acquire called), `got` (acquire returned),
//!   `rel` (release called) and `seq`, the value of a Redis counter read under the lock (GET,
//!   then SET seq+1), so `seq` numbers the grants in the order they happened, across processes;
//!   the scaling runs, which must count only the lock's own commands, use the fencing token;
//! - hand-off k = `got[k+1] - rel[k]`, counted when grant k+1 went to another worker that had
//!   called acquire before `rel[k]` (it was waiting when the release started);
//! - an overtake is a grant to a worker whose acquire started after that of another worker that
//!   was still waiting (`req_j < req_i` and `got_j > got_i`, or j never got the lock);
//! - Redis commands per acquisition are `INFO commandstats` deltas over a window in the middle
//!   of a run, divided by the grants in that window; "round trips" counts the commands a client
//!   sends (EVALSHA, BLPOP, SET, ...), "all" adds the commands scripts run inside;
//! - Redis CPU per acquisition is the redis-server process's CPU time (`INFO cpu`:
//!   used_cpu_sys + used_cpu_user) over the same window, divided the same way;
//! - the per-script breakdown follows `MONITOR`, which shows the commands a script runs right
//!   after the EVALSHA that ran it, and counts the lines on the lock's keys.

#[path = "../locks/mod.rs"]
mod locks;

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use locks::{mono_ns, sleep_until_ns, Lib, Locker, Res};
use serde_json::{json, Value as Json};

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000_000_000;

// ---- sizes -------------------------------------------------------------------------------

/// How much of everything to run: the full table, or the CI smoke run.
struct Sizes {
    libs: Vec<Lib>,
    ping: usize,
    micro: usize,
    micro_redlock: usize,
    handoffs: u64,
    handoff_cap: u64,
    peer_handoffs: u64,
    peer_handoff_cap: u64,
    handoff_hold_us: u64,
    throughput_secs: f64,
    /// (processes, threads per process); processes 0 = threads of this process
    layouts: Vec<(u32, u32)>,
    holds_us: Vec<u64>,
    scale_waiters: Vec<u32>,
    scale_secs: f64,
    scale_hold_us: u64,
    /// acquisitions of the one-thread runs of the per-script breakdown
    scripts_n: usize,
    /// length of its contended run
    scripts_secs: f64,
    grace: u64,
}

impl Sizes {
    fn new(quick: bool) -> Sizes {
        if quick {
            Sizes {
                libs: Lib::ALL.to_vec(),
                ping: 300,
                micro: 200,
                micro_redlock: 50,
                handoffs: 100,
                handoff_cap: 10 * SEC,
                peer_handoffs: 4,
                peer_handoff_cap: 5 * SEC,
                handoff_hold_us: 2000,
                throughput_secs: 0.6,
                layouts: vec![(0, 2), (2, 2)],
                holds_us: vec![0],
                scale_waiters: vec![1, 16],
                scale_secs: 1.0,
                scale_hold_us: 1000,
                scripts_n: 30,
                scripts_secs: 0.3,
                grace: 3 * SEC,
            }
        } else {
            Sizes {
                libs: Lib::ALL.to_vec(),
                ping: 3000,
                micro: 3000,
                micro_redlock: 1000,
                handoffs: 1000,
                handoff_cap: 40 * SEC,
                peer_handoffs: 200,
                peer_handoff_cap: 45 * SEC,
                handoff_hold_us: 2000,
                throughput_secs: 4.0,
                layouts: vec![(0, 2), (0, 8), (0, 32), (8, 4)],
                holds_us: vec![0, 1000],
                scale_waiters: vec![1, 2, 16, 64, 256],
                scale_secs: 4.0,
                scale_hold_us: 1000,
                scripts_n: 300,
                scripts_secs: 1.5,
                grace: 8 * SEC,
            }
        }
    }
}

// ---- statistics --------------------------------------------------------------------------

/// Nearest-rank percentile of sorted values.
fn pct(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[derive(Clone, Copy, Default)]
struct Dist {
    n: usize,
    p50: f64,
    p99: f64,
    max: f64,
    mean: f64,
}

/// Distribution of nanosecond samples, in microseconds.
fn dist(mut ns: Vec<u64>) -> Dist {
    ns.sort_unstable();
    let us = |v: u64| v as f64 / 1000.0;
    Dist {
        n: ns.len(),
        p50: us(pct(&ns, 50.0)),
        p99: us(pct(&ns, 99.0)),
        max: us(ns.last().copied().unwrap_or(0)),
        mean: if ns.is_empty() {
            0.0
        } else {
            ns.iter().sum::<u64>() as f64 / ns.len() as f64 / 1000.0
        },
    }
}

impl Dist {
    fn json(&self, rtt: f64) -> Json {
        json!({
            "n": self.n, "p50_us": r1(self.p50), "p99_us": r1(self.p99), "max_us": r1(self.max),
            "mean_us": r1(self.mean), "p50_rtt": r2(self.p50 / rtt), "p99_rtt": r2(self.p99 / rtt),
            "max_rtt": r2(self.max / rtt),
        })
    }
}

fn r1(v: f64) -> f64 {
    (v * 10.0).round() / 10.0
}
fn r2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}
fn r4(v: f64) -> f64 {
    (v * 10000.0).round() / 10000.0
}

/// Jain's fairness index of per-worker counts: 1 = all equal, 1/n = one worker got everything.
fn jain(counts: &[u64]) -> f64 {
    let sum: f64 = counts.iter().map(|&c| c as f64).sum();
    let sq: f64 = counts.iter().map(|&c| (c as f64) * (c as f64)).sum();
    if sq == 0.0 {
        0.0
    } else {
        sum * sum / (counts.len() as f64 * sq)
    }
}

// ---- records -----------------------------------------------------------------------------

/// One acquisition (or, with `got == 0`, a wait abandoned at the end of a run).
#[derive(Clone, Copy, Debug)]
struct Rec {
    worker: u32,
    req: u64,
    got: u64,
    rel: u64,
    /// the release call returned
    done: u64,
    seq: i64,
}

impl Rec {
    fn line(&self) -> String {
        format!(
            "rec {} {} {} {} {} {}",
            self.worker, self.req, self.got, self.rel, self.done, self.seq
        )
    }

    fn parse(line: &str) -> Option<Rec> {
        let mut it = line.strip_prefix("rec ")?.split(' ');
        Some(Rec {
            worker: it.next()?.parse().ok()?,
            req: it.next()?.parse().ok()?,
            got: it.next()?.parse().ok()?,
            rel: it.next()?.parse().ok()?,
            done: it.next()?.parse().ok()?,
            seq: it.next()?.parse().ok()?,
        })
    }
}

/// Hand-off latencies (ns) between consecutive grants, and mutual-exclusion violations seen.
fn handoffs(recs: &[Rec]) -> (Vec<u64>, usize) {
    let (lat, _, overlaps) = handoffs_with_release(recs);
    (lat, overlaps)
}

/// Hand-off latencies, the durations of the release calls that started them (ns), overlaps.
fn handoffs_with_release(recs: &[Rec]) -> (Vec<u64>, Vec<u64>, usize) {
    let by_seq: BTreeMap<i64, &Rec> = recs
        .iter()
        .filter(|r| r.got > 0 && r.seq >= 0)
        .map(|r| (r.seq, r))
        .collect();
    let mut out = vec![];
    let mut release = vec![];
    let mut overlaps = 0;
    // consecutive grants: seq is a dense counter, or the fencing token (strictly increasing,
    // time-seeded, so not dense): pair each grant with the next one in order either way
    let grants: Vec<&Rec> = by_seq.values().copied().collect();
    for pair in grants.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if b.got < a.rel {
            overlaps += 1;
            continue;
        }
        if b.worker != a.worker && b.req <= a.rel {
            out.push(b.got - a.rel);
            release.push(a.done.saturating_sub(a.rel));
        }
    }
    (out, release, overlaps)
}

/// Grants that overtook an earlier waiter (see the module docs). The workers' first requests
/// leave together at the start, microseconds apart, in no defined order: one first request
/// passing another is not counted (passing anyone's later request is).
fn overtakes(recs: &[Rec]) -> usize {
    let mut first: HashMap<u32, u64> = HashMap::new();
    for r in recs {
        let f = first.entry(r.worker).or_insert(r.req);
        *f = (*f).min(r.req);
    }
    // (req, got or never, is the worker's first request)
    let mut v: Vec<(u64, u64, bool)> = recs
        .iter()
        .map(|r| {
            let got = if r.got == 0 { u64::MAX } else { r.got };
            (r.req, got, first[&r.worker] == r.req)
        })
        .collect();
    v.sort_unstable();
    let (mut max_all, mut max_later) = (0u64, 0u64);
    let mut n = 0;
    let mut i = 0;
    while i < v.len() {
        // requests at the very same nanosecond are not ordered
        let mut j = i;
        while j < v.len() && v[j].0 == v[i].0 {
            let (_, got, is_first) = v[j];
            let passed = if is_first { max_later } else { max_all };
            if got != u64::MAX && passed > got {
                n += 1;
            }
            j += 1;
        }
        for &(_, got, is_first) in &v[i..j] {
            max_all = max_all.max(got);
            if !is_first {
                max_later = max_later.max(got);
            }
        }
        i = j;
    }
    n
}

// ---- Redis helpers -----------------------------------------------------------------------

fn connect(url: &str) -> redis::Connection {
    redis::Client::open(url)
        .and_then(|c| c.get_connection())
        .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"))
}

/// What Redis has done up to a moment: its command counters and the CPU time of its process.
struct Snapshot {
    /// `INFO commandstats`: command -> (calls, usec)
    cmds: HashMap<String, (u64, u64)>,
    /// `used_cpu_sys + used_cpu_user` of `INFO cpu` in µs: the redis-server process, all its
    /// threads
    cpu_us: u64,
}

fn snapshot(conn: &mut redis::Connection) -> Snapshot {
    Snapshot {
        cmds: commandstats(conn),
        cpu_us: redis_cpu_us(conn),
    }
}

/// The CPU time the redis-server process has used, in µs (`INFO cpu` gives seconds with six
/// decimals, from getrusage).
fn redis_cpu_us(conn: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO").arg("cpu").query(conn).expect("INFO cpu");
    let secs = |key: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    ((secs("used_cpu_sys:") + secs("used_cpu_user:")) * 1e6).round() as u64
}

/// `INFO commandstats` as command -> (calls, usec).
fn commandstats(conn: &mut redis::Connection) -> HashMap<String, (u64, u64)> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(conn)
        .expect("INFO commandstats");
    let mut out = HashMap::new();
    for line in info.lines() {
        let Some((name, rest)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        let field = |key: &str| {
            rest.split(',')
                .find_map(|kv| kv.strip_prefix(key))
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        out.insert(name.to_string(), (field("calls="), field("usec=")));
    }
    out
}

/// Commands a client sends itself; every other command in commandstats ran inside a script.
const CLIENT_COMMANDS: &[&str] = &[
    "evalsha",
    "eval",
    "evalsha_ro",
    "eval_ro",
    "fcall",
    "blpop",
    "brpop",
    "set",
    "script",
    "ping",
    "client|setinfo",
    "client|setname",
    "client|id",
    "hello",
    "select",
    "auth",
];

/// What the locks cost Redis per acquisition over a window.
struct Cost {
    round_trips: f64,
    all: f64,
    server_us: f64,
    /// CPU time of the redis-server process (`INFO cpu`) per acquisition, µs: unlike
    /// `server_us`, it includes reading requests and writing replies, and whatever else the
    /// server did in the window (its cron, other clients)
    redis_cpu_us: f64,
    by_command: BTreeMap<String, f64>,
    /// context switches of fairlock's watchdog and janitor threads per acquisition (runs in
    /// this process only)
    bg_wakes: Option<[f64; 2]>,
}

/// `scripted_set`: the lock's scripts run SET themselves (fairlock's fence) and its client never
/// does, so a SET is not a round trip.
fn cost(
    before: &Snapshot,
    after: &Snapshot,
    acquisitions: u64,
    bench_counter: bool,
    scripted_set: bool,
) -> Option<Cost> {
    if acquisitions == 0 {
        return None;
    }
    let mut calls: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for (name, &(c, u)) in &after.cmds {
        let (c0, u0) = before.cmds.get(name).copied().unwrap_or((0, 0));
        if c > c0 && name != "info" {
            calls.insert(name.clone(), (c - c0, u.saturating_sub(u0)));
        }
    }
    if bench_counter {
        // the benchmark's own GET and SET of its counter, one each per acquisition
        for name in ["get", "set"] {
            if let Some(e) = calls.get_mut(name) {
                e.0 = e.0.saturating_sub(acquisitions);
            }
        }
    }
    let a = acquisitions as f64;
    let mut rt = 0u64;
    let mut all = 0u64;
    let mut usec = 0u64;
    let mut by_command = BTreeMap::new();
    for (name, (c, u)) in &calls {
        if *c == 0 {
            continue;
        }
        all += c;
        if CLIENT_COMMANDS.contains(&name.as_str()) && !(scripted_set && name == "set") {
            rt += c;
            usec += u; // a client command's usec includes the commands its script ran
        }
        by_command.insert(name.clone(), r2(*c as f64 / a));
    }
    Some(Cost {
        round_trips: r2(rt as f64 / a),
        all: r2(all as f64 / a),
        server_us: r1(usec as f64 / a),
        redis_cpu_us: r1(after.cpu_us.saturating_sub(before.cpu_us) as f64 / a),
        by_command,
        bg_wakes: None,
    })
}

/// The cost columns of the micro table, and of the multi-worker tables (the same, per
/// acquisition).
const COST_HEADER: &str = "round trips | Redis cmds | server µs | Redis CPU µs / acq";
const COST_HEADER_PER_ACQ: &str =
    "round trips / acq | Redis cmds / acq | server µs / acq | Redis CPU µs / acq";

/// The cells under `COST_HEADER`, "-" when the run took no figures.
fn cost_cells(c: Option<&Cost>) -> String {
    c.map_or("- | - | - | -".into(), |c| {
        format!(
            "{:.2} | {:.1} | {:.0} | {:.1}",
            c.round_trips, c.all, c.server_us, c.redis_cpu_us
        )
    })
}

/// A multi-worker run's cost figures, added to its JSON row (null when not measured).
fn add_cost_json(row: &mut Json, c: Option<&Cost>) {
    row["round_trips_per_acq"] = json!(c.map(|c| c.round_trips));
    row["redis_cmds_per_acq"] = json!(c.map(|c| c.all));
    row["server_us_per_acq"] = json!(c.map(|c| c.server_us));
    row["redis_cpu_us_per_acq"] = json!(c.map(|c| c.redis_cpu_us));
    row["cmds_per_acq_by_command"] = json!(c.map(|c| &c.by_command));
    row["background_wakeups_per_acq"] = json!(c.and_then(|c| c.bg_wakes));
}

/// Context switches of this process's fairlock background threads (watchdog, janitor): each
/// one is a wake-up of a thread that competes with the lock's users for the CPUs.
fn background_switches() -> [u64; 2] {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return [0, 0];
    };
    let mut n = [0, 0];
    for t in tasks.flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        // thread names are cut to 15 bytes: fairlock-watchd, fairlock-janito
        let which = if comm.starts_with("fairlock-w") {
            0
        } else if comm.starts_with("fairlock-j") {
            1
        } else {
            continue;
        };
        let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
        for l in status.lines() {
            if let Some(v) = l
                .strip_prefix("voluntary_ctxt_switches:")
                .or_else(|| l.strip_prefix("nonvoluntary_ctxt_switches:"))
            {
                n[which] += v.trim().parse::<u64>().unwrap_or(0);
            }
        }
    }
    n
}

/// A thread that follows `MONITOR` and keeps what `keep` makes of each line, in the order Redis
/// ran the commands.
struct Monitor<T> {
    url: String,
    /// the argument of the ECHO that ends the watch
    marker: String,
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<T>>,
}

impl<T: Send + 'static> Monitor<T> {
    /// Start following; returns once Redis has confirmed MONITOR (or after 5 s).
    fn start(url: &str, mut keep: impl FnMut(&str) -> Option<T> + Send + 'static) -> Monitor<T> {
        let addr = url
            .trim_start_matches("redis://")
            .trim_end_matches('/')
            .to_string();
        let marker = format!("bench-monitor-end-{}-{}", std::process::id(), mono_ns());
        let stop = Arc::new(AtomicBool::new(false));
        let ready = Arc::new(AtomicBool::new(false));
        let (ready2, stop2, marker2) = (ready.clone(), stop.clone(), marker.clone());
        let thread = std::thread::spawn(move || {
            let mut stream = TcpStream::connect(&addr).expect("connect for MONITOR");
            stream
                .set_read_timeout(Some(Duration::from_millis(200)))
                .expect("read timeout");
            stream.write_all(b"MONITOR\r\n").expect("MONITOR");
            let mut r = BufReader::with_capacity(1 << 20, stream);
            let mut out = vec![];
            let mut line = vec![];
            loop {
                match r.read_until(b'\n', &mut line) {
                    Ok(0) => break,
                    Ok(_) => {
                        let text = String::from_utf8_lossy(&line);
                        if text.starts_with("+OK") {
                            ready2.store(true, Ordering::SeqCst);
                        } else if text.contains(&marker2) {
                            break;
                        } else if let Some(v) = keep(&text) {
                            out.push(v);
                        }
                        line.clear();
                    }
                    // a timeout may leave part of a line in `line`; the next read completes it.
                    // Stopped and nothing more for 200 ms: the marker got lost, end anyway.
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) =>
                    {
                        if stop2.load(Ordering::SeqCst) {
                            break;
                        }
                    }
                    Err(_) => break,
                }
            }
            out
        });
        let t = Instant::now();
        while !ready.load(Ordering::SeqCst) && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(1));
        }
        Monitor {
            url: url.to_string(),
            marker,
            stop,
            thread,
        }
    }

    /// What was kept of every command Redis ran until now: sends the marker and reads up to it.
    fn finish(self) -> Vec<T> {
        let mut conn = connect(&self.url);
        let _: redis::RedisResult<String> = redis::cmd("ECHO").arg(&self.marker).query(&mut conn);
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().expect("monitor thread")
    }
}

/// The arguments of a MONITOR line (`<time> [<db> <client>] "CMD" "arg" ...`), at most `max`.
/// Escapes (`\"`, `\\`, `\xHH`) keep the character after the backslash only: enough for the
/// names, keys and flags read here.
fn monitor_tokens(text: &str, max: usize) -> Vec<String> {
    let mut tokens: Vec<String> = vec![];
    let mut cur: Option<String> = None;
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match (&mut cur, c) {
            (None, '"') => cur = Some(String::new()),
            (Some(t), '\\') => t.extend(chars.next()),
            (Some(t), '"') => {
                tokens.push(std::mem::take(t));
                cur = None;
            }
            (Some(t), c) => t.push(c),
            (None, _) => {}
        }
        if tokens.len() >= max {
            break;
        }
    }
    tokens
}

/// Whether a MONITOR line is a command that a script ran (source `[<db> lua]`).
fn from_script(text: &str) -> bool {
    text.split_once('[')
        .and_then(|(_, rest)| rest.split_once(']'))
        .is_some_and(|(source, _)| source.ends_with(" lua"))
}

/// The script of `fairlock::raw` that EVALSHA names by `sha`.
fn script_name(sha: &str) -> Option<&'static str> {
    fairlock::raw::scripts()
        .into_iter()
        .find(|s| s.sha().eq_ignore_ascii_case(sha))
        .map(|s| s.name())
}

/// Follow `MONITOR` and collect the owner flag of every acquire script call on lock `name`, in
/// the order Redis ran them: the exact arrival order FIFO is defined by.
fn watch_acquires(url: &str, name: &str) -> Monitor<String> {
    let tag = format!("{{{name}}}");
    Monitor::start(url, move |line| acquire_flag(line, &tag))
}

/// The owner flag of an acquire call in a MONITOR line (see `raw::RawLock::acquire`):
/// `EVALSHA sha numkeys key... fence-ttl waiter-ttl owner attempt lease mode meta`, the keys
/// first (the first one names the lock), then the two arguments every script takes, then the
/// script's own.
fn acquire_flag(line: &str, tag: &str) -> Option<String> {
    let head = monitor_tokens(line, 3);
    if head.len() < 3
        || !head[0].eq_ignore_ascii_case("evalsha")
        || script_name(&head[1]) != Some("acquire")
    {
        return None;
    }
    let numkeys: usize = head[2].parse().ok()?;
    let (owner, mode) = (3 + numkeys + 2, 3 + numkeys + 5);
    let tokens = monitor_tokens(line, mode + 1);
    let is_acquire = numkeys > 0
        && tokens.len() > mode
        && tokens[3].contains(tag)
        && (tokens[mode] == "wait" || tokens[mode] == "try");
    is_acquire.then(|| tokens[owner].clone())
}

/// Overtakes by the exact orders: arrival (the server ran the acquire scripts in this order)
/// against grant (`seq`). Returns (grants audited, overtakes, workers whose calls and grants
/// did not pair up, e.g. after a re-queue).
fn fifo_audit(o: &Outcome) -> (usize, usize, usize) {
    let mut arrivals_of: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, f) in o.arrivals.iter().enumerate() {
        arrivals_of.entry(f.as_str()).or_default().push(i);
    }
    let mut pairs: Vec<(usize, i64)> = vec![];
    let mut unmatched = 0;
    for (w, flag) in &o.flags {
        let mut recs: Vec<&Rec> = o.recs.iter().filter(|r| r.worker == *w).collect();
        recs.sort_by_key(|r| r.req);
        let arr = arrivals_of
            .get(flag.as_str())
            .map_or(&[][..], |v| v.as_slice());
        if arr.len() != recs.len() {
            unmatched += 1;
            continue;
        }
        for (a, r) in arr.iter().zip(recs) {
            pairs.push((*a, if r.got == 0 { i64::MAX } else { r.seq }));
        }
    }
    pairs.sort_unstable();
    let mut max_seq = i64::MIN;
    let mut over = 0;
    for (_, seq) in &pairs {
        if *seq != i64::MAX && max_seq > *seq {
            over += 1;
        }
        max_seq = max_seq.max(*seq);
    }
    (pairs.len(), over, unmatched)
}

// ---- workers -----------------------------------------------------------------------------

/// Everything a worker needs; passed to child processes as `key=value` arguments.
#[derive(Clone, Debug)]
struct Spec {
    lib: Lib,
    url: String,
    name: String,
    /// counter key for GET/SET under the lock; empty: use the fencing token as `seq`
    counter: String,
    /// prefix of the per-worker signal lists of the ping-pong hand-off runs; empty: free loop
    signal: String,
    hold_us: u64,
    start_ns: u64,
    stop_ns: u64,
    give_up_ns: u64,
    /// stop once this many grants were counted (0: only the time)
    max_seq: i64,
}

impl Spec {
    fn args(&self) -> Vec<String> {
        vec![
            format!("lib={}", self.lib.name()),
            format!("url={}", self.url),
            format!("name={}", self.name),
            format!("counter={}", self.counter),
            format!("signal={}", self.signal),
            format!("hold_us={}", self.hold_us),
            format!("start_ns={}", self.start_ns),
            format!("stop_ns={}", self.stop_ns),
            format!("give_up_ns={}", self.give_up_ns),
            format!("max_seq={}", self.max_seq),
        ]
    }

    fn from_args(args: &[String]) -> Res<(Spec, u32, u32)> {
        let kv: HashMap<&str, &str> = args.iter().filter_map(|a| a.split_once('=')).collect();
        let get = |k: &str| kv.get(k).copied().ok_or(format!("child: missing {k}"));
        let num = |k: &str| -> Res<u64> { get(k)?.parse().map_err(|e| format!("{k}: {e}")) };
        let spec = Spec {
            lib: Lib::parse(get("lib")?).ok_or("child: bad lib")?,
            url: get("url")?.into(),
            name: get("name")?.into(),
            counter: get("counter")?.into(),
            signal: get("signal")?.into(),
            hold_us: num("hold_us")?,
            start_ns: num("start_ns")?,
            stop_ns: num("stop_ns")?,
            give_up_ns: num("give_up_ns")?,
            max_seq: num("max_seq")? as i64,
        };
        Ok((spec, num("first_worker")? as u32, num("threads")? as u32))
    }
}

/// Wait for a ping-pong signal; false when `give_up` passed first.
fn wait_signal(conn: &mut redis::Connection, key: &str, give_up: u64) -> Res<bool> {
    loop {
        let left = give_up.saturating_sub(mono_ns());
        if left < 5 * MS {
            return Ok(false);
        }
        let secs = (left as f64 / SEC as f64).min(1.0);
        let got: Option<(String, String)> = redis::cmd("BLPOP")
            .arg(key)
            .arg(format!("{secs:.3}"))
            .query(conn)
            .map_err(|e| format!("signal: {e}"))?;
        if got.is_some() {
            return Ok(true);
        }
    }
}

/// One worker's loop. Ping-pong runs (2 workers): after its release a worker waits until the
/// other one holds the lock before it asks again, so every grant is a hand-off to a waiter.
/// Returns the worker's records and, for fairlock, its owner flag (as the scripts see it).
fn worker(spec: &Spec, id: u32, client: Option<&fairlock::LockClient>) -> Res<(Vec<Rec>, String)> {
    let flag = client.map(|c| c.current_owner()).unwrap_or_default();
    let mut locker = Locker::new(spec.lib, &spec.url, &spec.name, client, &id.to_string())?;
    let mut conn = redis::Client::open(spec.url.as_str())
        .and_then(|c| c.get_connection())
        .map_err(|e| format!("connect: {e}"))?;
    let pingpong = !spec.signal.is_empty();
    let my_signal = format!("{}:{id}", spec.signal);
    let other_signal = format!("{}:{}", spec.signal, 1 - id.min(1));
    let mut recs = Vec::new();
    let mut wait_for_other = pingpong && id != 0;
    sleep_until_ns(spec.start_ns);
    loop {
        if wait_for_other && !wait_signal(&mut conn, &my_signal, spec.give_up_ns)? {
            break;
        }
        if mono_ns() >= spec.stop_ns {
            break;
        }
        let req = mono_ns();
        let Some(token) = locker.acquire(spec.give_up_ns)? else {
            recs.push(Rec {
                worker: id,
                req,
                got: 0,
                rel: 0,
                done: 0,
                seq: -1,
            });
            break;
        };
        let got = mono_ns();
        let seq = if spec.counter.is_empty() {
            token as i64
        } else {
            let v: Option<i64> = redis::cmd("GET")
                .arg(&spec.counter)
                .query(&mut conn)
                .map_err(|e| format!("counter: {e}"))?;
            let v = v.unwrap_or(0);
            redis::cmd("SET")
                .arg(&spec.counter)
                .arg(v + 1)
                .query::<()>(&mut conn)
                .map_err(|e| format!("counter: {e}"))?;
            v
        };
        if pingpong {
            redis::cmd("RPUSH")
                .arg(&other_signal)
                .arg(1)
                .query::<()>(&mut conn)
                .map_err(|e| format!("signal: {e}"))?;
        }
        if spec.hold_us > 0 {
            std::thread::sleep(Duration::from_micros(spec.hold_us));
        }
        let rel = mono_ns();
        locker.release()?;
        let done = mono_ns();
        recs.push(Rec {
            worker: id,
            req,
            got,
            rel,
            done,
            seq,
        });
        if spec.max_seq > 0 && seq + 1 >= spec.max_seq {
            break;
        }
        if mono_ns() >= spec.stop_ns {
            break;
        }
        wait_for_other = pingpong;
    }
    Ok((recs, flag))
}

/// Run `threads` workers in this process, numbered from `first`.
/// What the workers of one process bring back.
#[derive(Default)]
struct Collected {
    recs: Vec<Rec>,
    errors: Vec<String>,
    /// worker -> owner flag (fairlock)
    flags: HashMap<u32, String>,
}

fn run_threads(spec: &Spec, first: u32, threads: u32) -> Collected {
    let mut out = Collected::default();
    let client = match spec.lib {
        Lib::Fairlock => match fairlock::LockClient::connect(&spec.url) {
            Ok(c) => Some(c),
            Err(e) => {
                out.errors.push(format!("fairlock client: {e}"));
                return out;
            }
        },
        _ => None,
    };
    let spec = Arc::new(spec.clone());
    let handles: Vec<_> = (0..threads)
        .map(|i| {
            let spec = spec.clone();
            let client = client.clone();
            std::thread::Builder::new()
                .name(format!("bench-worker-{}", first + i))
                .stack_size(256 * 1024)
                .spawn(move || worker(&spec, first + i, client.as_ref()))
                .expect("spawn worker")
        })
        .collect();
    for (i, h) in handles.into_iter().enumerate() {
        match h.join() {
            Ok(Ok((r, flag))) => {
                out.recs.extend(r);
                out.flags.insert(first + i as u32, flag);
            }
            Ok(Err(e)) => out.errors.push(e),
            Err(_) => out.errors.push("worker panicked".into()),
        }
    }
    out
}

/// Child process: run the workers, print their records.
fn child_main(args: &[String]) {
    let (spec, first, threads) = match Spec::from_args(args) {
        Ok(v) => v,
        Err(e) => {
            println!("error {e}");
            return;
        }
    };
    let got = run_threads(&spec, first, threads);
    let out = std::io::stdout();
    let mut out = std::io::BufWriter::new(out.lock());
    for r in &got.recs {
        let _ = writeln!(out, "{}", r.line());
    }
    for (w, f) in &got.flags {
        let _ = writeln!(out, "flag {w} {f}");
    }
    for e in &got.errors {
        let _ = writeln!(out, "error {}", e.replace('\n', " "));
    }
    let _ = writeln!(out, "done");
}

/// The outcome of one multi-worker run.
struct Outcome {
    recs: Vec<Rec>,
    errors: Vec<String>,
    flags: HashMap<u32, String>,
    /// with `monitor`: the owner flags of the acquire calls, in the order Redis ran them
    arrivals: Vec<String>,
    workers: u32,
    cost: Option<Cost>,
    counter: Option<i64>,
}

/// Run a scenario: `procs` child processes of `threads` workers each (`procs == 0`: threads of
/// this process). Takes commandstats over the middle of the run when `window` is given.
fn run(
    spec: &Spec,
    procs: u32,
    threads: u32,
    window: Option<(u64, u64)>,
    monitor: bool,
) -> Outcome {
    let workers = procs.max(1) * threads;
    let mut conn = connect(&spec.url);
    let monitor = monitor.then(|| watch_acquires(&spec.url, &spec.name));
    let mut stats = vec![];
    let mut bg = vec![];
    let got = if procs == 0 {
        let s = spec.clone();
        let h = std::thread::spawn(move || run_threads(&s, 0, threads));
        if let Some((a, b)) = window {
            sleep_until_ns(a);
            stats.push(snapshot(&mut conn));
            bg.push(background_switches());
            sleep_until_ns(b);
            bg.push(background_switches());
            stats.push(snapshot(&mut conn));
        }
        h.join().expect("worker threads")
    } else {
        let exe = std::env::current_exe().expect("current_exe");
        let children: Vec<_> = (0..procs)
            .map(|p| {
                Command::new(&exe)
                    .arg("--child")
                    .args(spec.args())
                    .arg(format!("first_worker={}", p * threads))
                    .arg(format!("threads={threads}"))
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::inherit())
                    .spawn()
                    .expect("spawn child process")
            })
            .collect();
        if let Some((a, b)) = window {
            sleep_until_ns(a);
            stats.push(snapshot(&mut conn));
            sleep_until_ns(b);
            stats.push(snapshot(&mut conn));
        }
        let mut got = Collected::default();
        for c in children {
            let out = c.wait_with_output().expect("child output");
            let text = String::from_utf8_lossy(&out.stdout);
            let mut done = false;
            for line in text.lines() {
                if let Some(r) = Rec::parse(line) {
                    got.recs.push(r);
                } else if let Some((w, f)) =
                    line.strip_prefix("flag ").and_then(|l| l.split_once(' '))
                {
                    got.flags
                        .insert(w.parse().unwrap_or(u32::MAX), f.to_string());
                } else if let Some(e) = line.strip_prefix("error ") {
                    got.errors.push(e.to_string());
                } else if line == "done" {
                    done = true;
                }
            }
            if !done {
                got.errors.push(format!(
                    "a child process ended without finishing: {}",
                    out.status
                ));
            }
        }
        got
    };
    let arrivals = monitor.map(Monitor::finish).unwrap_or_default();
    let Collected {
        recs,
        errors,
        flags,
    } = got;
    let cost = match (window, stats.as_slice()) {
        (Some((a, b)), [before, after]) => {
            let n = recs.iter().filter(|r| r.got >= a && r.got < b).count() as u64;
            cost(
                before,
                after,
                n,
                !spec.counter.is_empty(),
                spec.lib == Lib::Fairlock,
            )
            .map(|mut c| {
                if let [b0, b1] = bg.as_slice() {
                    c.bg_wakes = Some([0, 1].map(|i| r2((b1[i] - b0[i]) as f64 / n as f64)));
                }
                c
            })
        }
        _ => None,
    };
    let counter = if spec.counter.is_empty() {
        None
    } else {
        let v: Option<i64> = redis::cmd("GET")
            .arg(&spec.counter)
            .query(&mut conn)
            .ok()
            .flatten();
        Some(v.unwrap_or(0))
    };
    Outcome {
        recs,
        errors,
        flags,
        arrivals,
        workers,
        cost,
        counter,
    }
}

// ---- the report --------------------------------------------------------------------------

struct Bench {
    url: String,
    /// a connection for the PING bursts around each run
    ping: redis::Connection,
    sizes: Sizes,
    run_id: String,
    rtt_us: f64,
    json: serde_json::Map<String, Json>,
    md: Vec<String>,
    criterion: Option<std::path::PathBuf>,
}

impl Bench {
    fn name(&self, what: &str) -> String {
        format!("bench-{}-{what}", self.run_id)
    }

    /// A free loop on the lock `what` from `start` for `dur` ns; with `counter`, each hold does
    /// GET/SET on `<what>:counter` (else the fencing token numbers the grants).
    fn timed_spec(
        &self,
        lib: Lib,
        what: &str,
        counter: bool,
        hold_us: u64,
        start: u64,
        dur: u64,
    ) -> Spec {
        Spec {
            lib,
            url: self.url.clone(),
            name: self.name(what),
            counter: if counter {
                self.name(&format!("{what}:counter"))
            } else {
                String::new()
            },
            signal: String::new(),
            hold_us,
            start_ns: start,
            stop_ns: start + dur,
            give_up_ns: start + dur + self.sizes.grace,
            max_seq: 0,
        }
    }

    fn ratio(&self, us: f64) -> String {
        format!("{:.2}", us / self.rtt_us)
    }

    /// `run`, between two bursts of PINGs that set the RTT this run's figures are divided by:
    /// the loopback round trip of this VM moves (20-100 µs) with what else the host runs.
    fn run_timed(
        &mut self,
        spec: &Spec,
        procs: u32,
        threads: u32,
        window: Option<(u64, u64)>,
    ) -> Outcome {
        let mut pings = ping_samples(&mut self.ping, 200);
        let o = run(spec, procs, threads, window, false);
        pings.extend(ping_samples(&mut self.ping, 200));
        self.rtt_us = dist(pings).p50;
        o
    }

    fn criterion_median_us(&self, id: &str) -> Option<f64> {
        let path = self
            .criterion
            .as_ref()?
            .join(format!("micro/{id}/new/estimates.json"));
        let text = std::fs::read_to_string(path).ok()?;
        let v: Json = serde_json::from_str(&text).ok()?;
        Some(v["median"]["point_estimate"].as_f64()? / 1000.0)
    }
}

fn time_ns(mut f: impl FnMut()) -> u64 {
    let t = mono_ns();
    f();
    mono_ns() - t
}

fn ping_samples(conn: &mut redis::Connection, n: usize) -> Vec<u64> {
    (0..n)
        .map(|_| {
            time_ns(|| {
                redis::cmd("PING").query::<String>(conn).expect("PING");
            })
        })
        .collect()
}

fn machine(conn: &mut redis::Connection) -> Json {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|m| m.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_default();
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query(conn)
        .unwrap_or_default();
    let field = |k: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(k))
            .unwrap_or("")
            .trim()
            .to_string()
    };
    json!({
        "nproc": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "cpu": cpu,
        "redis_version": field("redis_version:"),
        "redis_hz": field("hz:"),
        "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
        "loadavg_start": loadavg(),
    })
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Figures 1 and 2: uncontended and re-entrant cost, for fairlock and the peers. Each iteration
/// sends one PING first, so every row has the round trip of the very same moments.
fn micro(b: &mut Bench) {
    let mut conn = connect(&b.url);
    let mut ping_conn = connect(&b.url);
    let n = b.sizes.micro;
    struct Row {
        figure: &'static str,
        lock: &'static str,
        d: Dist,
        rtt: f64,
        criterion: &'static str,
        cost: Option<Cost>,
    }
    let mut rows: Vec<Row> = vec![];

    // Run `op` n times, each after a timed PING; `op` returns the moment between its two halves
    // (acquire | release). Returns the whole, the halves, Redis's cost per op and the RTT. The
    // PINGs are taken out of the cost: one call each from the counts, and `ping_cpu` µs each
    // from Redis's CPU time.
    let mut measure = |n: usize, scripted_set: bool, ping_cpu: f64, op: &mut dyn FnMut() -> u64| {
        let before = snapshot(&mut conn);
        let bg = background_switches();
        let (mut both, mut first, mut second, mut pings) = (vec![], vec![], vec![], vec![]);
        for _ in 0..n {
            pings.push(time_ns(|| {
                redis::cmd("PING")
                    .query::<String>(&mut ping_conn)
                    .expect("PING");
            }));
            let t0 = mono_ns();
            let mid = op();
            let t2 = mono_ns();
            both.push(t2 - t0);
            first.push(mid.saturating_sub(t0));
            second.push(t2.saturating_sub(mid));
        }
        let bg1 = background_switches();
        let wakes = [0, 1].map(|i| r2((bg1[i] - bg[i]) as f64 / n as f64));
        let after = snapshot(&mut conn);
        let c = cost(&before, &after, n as u64, false, scripted_set).map(|mut c| {
            c.bg_wakes = Some(wakes);
            c.round_trips = r2(c.round_trips - 1.0); // the PING of each iteration
            c.all = r2(c.all - 1.0);
            c.redis_cpu_us = r1(c.redis_cpu_us - ping_cpu);
            c.by_command.remove("ping");
            c
        });
        (dist(both), dist(first), dist(second), c, dist(pings).p50)
    };

    // Redis's CPU time per PING: the same loop with nothing between the PINGs. It also carries
    // the server's idle work (its cron) over the loop's time, which the rows below have too,
    // over iterations a few times longer: their figure keeps a small share of that idle work.
    let (_, _, _, ping_cost, _) = measure(n, false, 0.0, &mut mono_ns);
    let ping_cpu = ping_cost.map_or(0.0, |c| c.redis_cpu_us);

    let trivial = redis::Script::new("return 1");
    let mut c2 = connect(&b.url);
    trivial
        .prepare_invoke()
        .invoke::<i64>(&mut c2)
        .expect("EVALSHA");
    let (d, _, _, cost, rtt) = measure(n, false, ping_cpu, &mut || {
        trivial
            .prepare_invoke()
            .invoke::<i64>(&mut c2)
            .expect("EVALSHA");
        0
    });
    rows.push(Row {
        figure: "EVALSHA `return 1` (script floor)",
        lock: "-",
        d,
        rtt,
        criterion: "evalsha_return1",
        cost,
    });

    let client = fairlock::LockClient::connect(&b.url).expect("fairlock client");
    for reentrant in [false, true] {
        let lock = client
            .lock(&b.name(if reentrant {
                "reentrant"
            } else {
                "uncontended"
            }))
            .unwrap();
        let outer = reentrant.then(|| lock.lock().expect("lock"));
        let (both, acq, rel, cost, rtt) = measure(n, true, ping_cpu, &mut || {
            let g = lock.lock().expect("lock");
            let mid = mono_ns();
            g.unlock().expect("unlock");
            mid
        });
        if let Some(g) = outer {
            g.unlock().expect("unlock");
        }
        let (pair, first, second, crit) = if reentrant {
            (
                "re-entrant acquire + release",
                "re-entrant acquire",
                "re-entrant release",
                "fairlock_reentrant",
            )
        } else {
            (
                "uncontended acquire + release",
                "uncontended acquire",
                "uncontended release",
                "fairlock_uncontended",
            )
        };
        for (figure, d, criterion, cost) in [
            (pair, both, crit, cost),
            (first, acq, "", None),
            (second, rel, "", None),
        ] {
            rows.push(Row {
                figure,
                lock: "fairlock",
                d,
                rtt,
                criterion,
                cost,
            });
        }
    }

    for (lib, id) in [
        (Lib::Naive, "naive_uncontended"),
        (Lib::Redlock, "redlock_uncontended"),
    ] {
        let n = if lib == Lib::Redlock {
            b.sizes.micro_redlock
        } else {
            n
        };
        let mut locker = Locker::new(lib, &b.url, &b.name("uncontended"), None, "micro").unwrap();
        let (d, _, _, cost, rtt) = measure(n, lib == Lib::Fairlock, ping_cpu, &mut || {
            locker.acquire(u64::MAX).unwrap().expect("uncontended");
            locker.release().unwrap();
            0
        });
        rows.push(Row {
            figure: "uncontended acquire + release",
            lock: lib.name(),
            d,
            rtt,
            criterion: id,
            cost,
        });
    }

    let crit_ping = b.criterion_median_us("ping");
    b.md.push("### Uncontended and re-entrant (one thread)\n".into());
    b.md.push(format!("| figure | lock | n | p50 µs | p99 µs | RTT µs | p50 / RTT | p99 / RTT | criterion median / RTT | {COST_HEADER} | watchdog + janitor switches |"));
    b.md.push("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|".into());
    let mut out = vec![];
    for r in rows {
        let crit = if r.criterion.is_empty() {
            None
        } else {
            b.criterion_median_us(r.criterion).zip(crit_ping)
        };
        let c = r.cost.as_ref();
        b.md.push(format!(
            "| {} | {} | {} | {:.0} | {:.0} | {:.0} | {:.2} | {:.2} | {} | {} | {} |",
            r.figure,
            r.lock,
            r.d.n,
            r.d.p50,
            r.d.p99,
            r.rtt,
            r.d.p50 / r.rtt,
            r.d.p99 / r.rtt,
            crit.map_or("-".into(), |(op, ping)| format!("{:.2}", op / ping)),
            cost_cells(c),
            c.and_then(|c| c.bg_wakes)
                .filter(|_| r.lock == "fairlock")
                .map_or("".into(), |w| format!("{:.2} + {:.2}", w[0], w[1])),
        ));
        let mut j = r.d.json(r.rtt);
        j["figure"] = json!(r.figure);
        j["lock"] = json!(r.lock);
        j["rtt_us"] = json!(r1(r.rtt));
        if let Some((op, ping)) = crit {
            j["criterion_median_us"] = json!(r1(op));
            j["criterion_ping_us"] = json!(r1(ping));
            j["criterion_median_rtt"] = json!(r2(op / ping));
        }
        if let Some(c) = c {
            j["round_trips"] = json!(c.round_trips);
            j["redis_cmds"] = json!(c.all);
            j["server_us"] = json!(c.server_us);
            j["redis_cpu_us"] = json!(c.redis_cpu_us);
            j["cmds_by_command"] = json!(c.by_command);
            if r.lock == "fairlock" {
                j["watchdog_janitor_switches"] = json!(c.bg_wakes);
            }
        }
        out.push(j);
    }
    b.md.push(String::new());
    b.md.push(format!("Redis CPU per acquisition: the redis-server process's CPU time (`INFO cpu`) over the loop, less {ping_cpu:.1} µs per iteration for its PING (the same loop with PINGs only).\n"));
    b.json.insert("micro".into(), Json::Array(out));
    b.json.insert("micro_ping_cpu_us".into(), json!(ping_cpu));
}

/// Figure 3: hand-off latency, thread -> thread and process -> process (ping-pong of 2 workers).
fn handoff(b: &mut Bench) {
    let runs: Vec<(Lib, u32, u32)> = [
        (Lib::Fairlock, 0, 2),
        (Lib::Fairlock, 2, 1),
        (Lib::Naive, 2, 1),
        (Lib::Redlock, 2, 1),
    ]
    .into_iter()
    .filter(|(lib, _, _)| b.sizes.libs.contains(lib))
    .collect();
    b.md.push(
        "### Hand-off: release started → next waiter's acquire returned (2 workers taking turns)\n"
            .into(),
    );
    b.md.push("| lock | between | hand-offs | p50 µs | p99 µs | max µs | RTT µs | p50 / RTT | p99 / RTT | max / RTT | release call p50 µs |".into());
    b.md.push("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|".into());
    let mut out = vec![];
    for (i, (lib, procs, threads)) in runs.into_iter().enumerate() {
        let (n, cap) = if lib == Lib::Fairlock {
            (b.sizes.handoffs, b.sizes.handoff_cap)
        } else {
            (b.sizes.peer_handoffs, b.sizes.peer_handoff_cap)
        };
        let start = mono_ns() + if procs > 0 { 800 * MS } else { 200 * MS };
        let spec = Spec {
            lib,
            url: b.url.clone(),
            name: b.name(&format!("handoff{i}")),
            counter: b.name(&format!("handoff{i}:counter")),
            signal: b.name(&format!("handoff{i}:signal")),
            hold_us: b.sizes.handoff_hold_us,
            start_ns: start,
            stop_ns: start + cap,
            give_up_ns: start + cap + b.sizes.grace,
            max_seq: n as i64 + 1,
        };
        let o = b.run_timed(&spec, procs, threads, None);
        let (lat, release, overlaps) = handoffs_with_release(&o.recs);
        let d = dist(lat);
        let rc = dist(release);
        let between = if procs > 0 {
            "process → process"
        } else {
            "thread → thread"
        };
        b.md.push(format!(
            "| {} | {between} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {} | {} | {} | {:.0} |",
            lib.name(),
            d.n,
            d.p50,
            d.p99,
            d.max,
            b.rtt_us,
            b.ratio(d.p50),
            b.ratio(d.p99),
            b.ratio(d.max),
            rc.p50,
        ));
        let mut j = d.json(b.rtt_us);
        j["lock"] = json!(lib.name());
        j["between"] = json!(if procs > 0 { "processes" } else { "threads" });
        j["hold_us"] = json!(spec.hold_us);
        j["overlaps"] = json!(overlaps);
        j["rtt_us"] = json!(r1(b.rtt_us));
        j["release_call"] = rc.json(b.rtt_us);
        j["errors"] = json!(o.errors);
        out.push(j);
        cleanup(&b.url, &spec);
    }
    b.md.push(String::new());
    b.json.insert("handoff".into(), Json::Array(out));
}

/// Delete a run's keys (the locks' own keys expire or are empty at the end).
fn cleanup(url: &str, spec: &Spec) {
    let mut conn = connect(url);
    let mut del = redis::cmd("DEL");
    del.arg(&spec.counter);
    if !spec.signal.is_empty() {
        del.arg(format!("{}:0", spec.signal))
            .arg(format!("{}:1", spec.signal));
    }
    let _: redis::RedisResult<i64> = del.query(&mut conn);
}

/// Figure 4: contended throughput with fairness, per lock, layout and hold.
fn throughput(b: &mut Bench) {
    b.md.push("### Contended: acquire, GET + SET a counter, hold, release, in a loop\n".into());
    b.md.push(format!("| lock | workers | hold | acq/s | counter = acq | Jain | overtakes | wait p50 µs | wait p99 µs | wait max µs | max / p50 | RTT µs | hand-off p50 / RTT | {COST_HEADER_PER_ACQ} |"));
    b.md.push(
        "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
            .into(),
    );
    let mut out = vec![];
    let secs = b.sizes.throughput_secs;
    let mut i = 0;
    for &hold in &b.sizes.holds_us.clone() {
        for &(procs, threads) in &b.sizes.layouts.clone() {
            for lib in b.sizes.libs.clone() {
                i += 1;
                let start = mono_ns() + if procs > 0 { 800 * MS } else { 200 * MS };
                let dur = (secs * SEC as f64) as u64;
                let spec = b.timed_spec(lib, &format!("tp{i}"), true, hold, start, dur);
                let window = (start + dur / 4, start + dur * 9 / 10);
                let o = b.run_timed(&spec, procs, threads, Some(window));
                out.push(throughput_row(b, &spec, procs, threads, &o, dur));
                cleanup(&b.url, &spec);
            }
        }
    }
    b.md.push(String::new());
    b.md.push("Redis cmds / acq leave out the benchmark's own GET and SET of the counter; Redis CPU µs / acq cannot and includes them (two round trips per acquisition, for every lock).\n".into());
    b.json.insert("throughput".into(), Json::Array(out));
}

fn throughput_row(
    b: &mut Bench,
    spec: &Spec,
    procs: u32,
    threads: u32,
    o: &Outcome,
    dur: u64,
) -> Json {
    let granted: Vec<&Rec> = o.recs.iter().filter(|r| r.got > 0).collect();
    let in_time = granted
        .iter()
        .filter(|r| r.got >= spec.start_ns && r.got < spec.stop_ns)
        .count();
    let rate = in_time as f64 / (dur as f64 / SEC as f64);
    let mut counts = vec![0u64; o.workers as usize];
    for r in &granted {
        if let Some(c) = counts.get_mut(r.worker as usize) {
            *c += 1;
        }
    }
    let fair = jain(&counts);
    let over = overtakes(&o.recs);
    // a wait abandoned at the end counts with the time it had waited by then
    let waits: Vec<u64> = o
        .recs
        .iter()
        .map(|r| {
            if r.got > 0 {
                r.got - r.req
            } else {
                spec.give_up_ns.saturating_sub(r.req)
            }
        })
        .collect();
    let abandoned = o.recs.iter().filter(|r| r.got == 0).count();
    let w = dist(waits);
    let (lat, overlaps) = handoffs(&o.recs);
    let h = dist(lat);
    let counter_ok = o.counter == Some(granted.len() as i64);
    let layout = if procs > 0 {
        format!("{procs} procs × {threads}")
    } else {
        format!("{threads} threads")
    };
    let hold_text = format!("{} ms", spec.hold_us as f64 / 1000.0);
    b.md.push(format!(
        "| {} | {layout} | {hold_text} | {rate:.0} | {} | {:.3} | {} ({:.1} %) | {:.0} | {:.0} | {:.0}{} | {:.1} | {:.0} | {} | {} |",
        spec.lib.name(),
        if counter_ok { "yes".to_string() } else { format!("**NO** ({:?} vs {})", o.counter, granted.len()) },
        fair,
        over,
        100.0 * over as f64 / granted.len().max(1) as f64,
        w.p50,
        w.p99,
        w.max,
        if abandoned > 0 { format!(" (≥, {abandoned} gave up)") } else { String::new() },
        if w.p50 > 0.0 { w.max / w.p50 } else { 0.0 },
        b.rtt_us,
        if h.n > 0 { b.ratio(h.p50) } else { "-".into() },
        cost_cells(o.cost.as_ref()),
    ));
    let mut row = json!({
        "lock": spec.lib.name(),
        "processes": procs,
        "threads_per_process": threads,
        "workers": o.workers,
        "hold_ms": spec.hold_us as f64 / 1000.0,
        "seconds": dur as f64 / SEC as f64,
        "acquisitions": granted.len(),
        "acq_per_s": r1(rate),
        "counter": o.counter,
        "counter_ok": counter_ok,
        "overlaps": overlaps,
        "per_worker": counts,
        "jain": r4(fair),
        "overtakes": over,
        "overtake_pct": r2(100.0 * over as f64 / granted.len().max(1) as f64),
        "abandoned_waits": abandoned,
        "rtt_us": r1(b.rtt_us),
        "wait": w.json(b.rtt_us),
        "max_over_median_wait": r2(if w.p50 > 0.0 { w.max / w.p50 } else { 0.0 }),
        "handoff": h.json(b.rtt_us),
        "errors": o.errors,
    });
    add_cost_json(&mut row, o.cost.as_ref());
    row
}

/// FIFO audit: the contended scenario again, fairlock only, under `MONITOR`, which gives the
/// exact order in which Redis ran the acquire calls. MONITOR slows Redis down: these runs are
/// for order, not speed. The clock-based overtakes of the same run are shown beside it.
fn fifo(b: &mut Bench) {
    b.md.push(
        "### FIFO audit: arrival order at Redis (MONITOR) against grant order, fairlock\n".into(),
    );
    b.md.push("| workers | hold | grants audited | overtakes (server order) | overtakes (client clocks, same run) | workers not paired |".into());
    b.md.push("|---|---:|---:|---:|---:|---:|".into());
    let mut out = vec![];
    let layouts: Vec<(u32, u32)> = if b.sizes.throughput_secs < 1.0 {
        vec![(2, 2)]
    } else {
        vec![(0, 32), (8, 4)]
    };
    for (i, (procs, threads)) in layouts.into_iter().enumerate() {
        for hold in [0, 1000] {
            let dur = (b.sizes.throughput_secs * SEC as f64 * 0.5) as u64;
            let start = mono_ns() + if procs > 0 { 800 * MS } else { 200 * MS };
            let spec = b.timed_spec(
                Lib::Fairlock,
                &format!("fifo{i}-{hold}"),
                true,
                hold,
                start,
                dur,
            );
            let o = run(&spec, procs, threads, None, true);
            let (audited, over, unmatched) = fifo_audit(&o);
            let clock = overtakes(&o.recs);
            let layout = if procs > 0 {
                format!("{procs} procs × {threads}")
            } else {
                format!("{threads} threads")
            };
            b.md.push(format!(
                "| {layout} | {} ms | {audited} | {over} | {clock} | {unmatched} |",
                hold as f64 / 1000.0
            ));
            out.push(json!({
                "processes": procs,
                "threads_per_process": threads,
                "hold_ms": hold as f64 / 1000.0,
                "grants": o.recs.iter().filter(|r| r.got > 0).count(),
                "audited": audited,
                "overtakes_server_order": over,
                "overtakes_client_clock": clock,
                "workers_not_paired": unmatched,
                "errors": o.errors,
            }));
            cleanup(&b.url, &spec);
        }
    }
    b.md.push(String::new());
    b.json.insert("fifo_audit".into(), Json::Array(out));
}

/// Figure 5: hand-off and commands per acquisition with 1..256 threads waiting on one lock.
fn scaling(b: &mut Bench) {
    b.md.push(format!(
        "### Scaling: N threads waiting on one fairlock (one process, hold {} ms)\n",
        b.sizes.scale_hold_us as f64 / 1000.0
    ));
    b.md.push(format!("| waiters | acquisitions | hand-off p50 µs | p99 µs | RTT µs | p50 / RTT | p99 / RTT | {COST_HEADER_PER_ACQ} | watchdog + janitor switches / acq |"));
    b.md.push("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|".into());
    let mut out = vec![];
    for &n in &b.sizes.scale_waiters.clone() {
        let dur = (b.sizes.scale_secs * SEC as f64) as u64;
        let start = mono_ns() + 300 * MS + n as u64 * MS;
        let spec = b.timed_spec(
            Lib::Fairlock,
            &format!("scale{n}"),
            false,
            b.sizes.scale_hold_us,
            start,
            dur,
        );
        let window = (start + dur / 4, start + dur * 9 / 10);
        let o = b.run_timed(&spec, 0, n + 1, Some(window));
        let (lat, overlaps) = handoffs(&o.recs);
        let h = dist(lat);
        let acqs = o.recs.iter().filter(|r| r.got > 0).count();
        b.md.push(format!(
            "| {n} | {acqs} | {:.0} | {:.0} | {:.0} | {} | {} | {} | {} |",
            h.p50,
            h.p99,
            b.rtt_us,
            b.ratio(h.p50),
            b.ratio(h.p99),
            cost_cells(o.cost.as_ref()),
            o.cost
                .as_ref()
                .and_then(|c| c.bg_wakes)
                .map_or("-".into(), |w| format!("{:.2} + {:.2}", w[0], w[1])),
        ));
        let mut row = json!({
            "waiters": n,
            "threads": n + 1,
            "hold_ms": spec.hold_us as f64 / 1000.0,
            "acquisitions": acqs,
            "overlaps": overlaps,
            "rtt_us": r1(b.rtt_us),
            "handoff": h.json(b.rtt_us),
            "errors": o.errors,
        });
        add_cost_json(&mut row, o.cost.as_ref());
        out.push(row);
    }
    b.md.push(String::new());
    b.json.insert("scaling".into(), Json::Array(out));
}

/// A command of one lock's traffic, as MONITOR showed it.
enum Seen {
    /// a command a client sent: "EVALSHA <script>", "BLPOP", ...
    Client(String),
    /// a command the script of the last `Client` line ran
    Inner(String),
}

/// Keeps the MONITOR lines of lock `name`'s traffic: client commands on its keys, and the
/// commands run by its scripts (the lines after their EVALSHA: a script runs atomically).
/// Everything else (other connections, MONITOR's own, PING, INFO) is left out.
fn lock_traffic(name: &str) -> impl FnMut(&str) -> Option<Seen> + Send + 'static {
    let tag = format!("{{{name}}}");
    let mut in_our_script = false;
    move |line| {
        let tokens = monitor_tokens(line, usize::MAX);
        let cmd = tokens.first()?.to_ascii_uppercase();
        if from_script(line) {
            return in_our_script.then_some(Seen::Inner(cmd));
        }
        let ours = tokens[1..].iter().any(|t| t.contains(&tag));
        in_our_script = ours && cmd.starts_with("EVAL");
        if !ours {
            return None;
        }
        Some(Seen::Client(match (cmd.as_str(), tokens.get(1)) {
            ("EVALSHA", Some(sha)) => match script_name(sha) {
                Some(script) => format!("EVALSHA {script}"),
                None => format!("EVALSHA {}…", &sha[..sha.len().min(8)]),
            },
            _ => cmd,
        }))
    }
}

/// One client command's share of a lock's traffic: how often it ran and what it ran inside.
struct CallTally {
    call: String,
    runs: u64,
    /// inner command -> count, in the order first seen
    inner: Vec<(String, u64)>,
}

/// Tally the traffic per client command, in the order first seen.
fn tally(seen: &[Seen]) -> Vec<CallTally> {
    let mut out: Vec<CallTally> = vec![];
    let mut current: Option<usize> = None;
    for s in seen {
        match s {
            Seen::Client(call) => {
                let i = match out.iter().position(|t| &t.call == call) {
                    Some(i) => i,
                    None => {
                        out.push(CallTally {
                            call: call.clone(),
                            runs: 0,
                            inner: vec![],
                        });
                        out.len() - 1
                    }
                };
                out[i].runs += 1;
                current = Some(i);
            }
            Seen::Inner(cmd) => {
                let Some(i) = current else { continue };
                let inner = &mut out[i].inner;
                match inner.iter_mut().find(|(c, _)| c == cmd) {
                    Some((_, n)) => *n += 1,
                    None => inner.push((cmd.clone(), 1)),
                }
            }
        }
    }
    out
}

/// A count per acquisition with two decimals, "<0.01" for a command that ran but rarely.
fn rare_aware(v: f64) -> String {
    if v > 0.0 && v < 0.005 {
        "<0.01".into()
    } else {
        format!("{v:.2}")
    }
}

/// The per-script table of one scenario, and its JSON.
fn calls_table(b: &mut Bench, scenario: &str, acquisitions: u64, seen: &[Seen]) -> Json {
    let a = acquisitions.max(1) as f64;
    b.md.push(format!(
        "#### {scenario}: {acquisitions} acquisitions, {} commands seen\n",
        seen.len()
    ));
    b.md.push("| call | runs / acq | Redis calls inside / run | calls / acq (the call and inside) | inside, per acq |".into());
    b.md.push("|---|---:|---:|---:|---|".into());
    let mut rows = vec![];
    for t in tally(seen) {
        let inside: u64 = t.inner.iter().map(|(_, n)| n).sum();
        let script = t.call.starts_with("EVAL");
        let per_run = script.then(|| inside as f64 / t.runs as f64);
        let by_name: Vec<String> = t
            .inner
            .iter()
            .map(|(c, n)| format!("{c} {}", rare_aware(*n as f64 / a)))
            .collect();
        b.md.push(format!(
            "| {} | {} | {} | {} | {} |",
            t.call,
            rare_aware(t.runs as f64 / a),
            per_run.map_or("-".into(), |v| format!("{v:.1}")),
            rare_aware((t.runs + inside) as f64 / a),
            if by_name.is_empty() {
                "-".into()
            } else {
                by_name.join(", ")
            },
        ));
        let inner: serde_json::Map<String, Json> = t
            .inner
            .iter()
            .map(|(c, n)| (c.clone(), json!(r4(*n as f64 / a))))
            .collect();
        rows.push(json!({
            "call": t.call,
            "runs_per_acq": r4(t.runs as f64 / a),
            "calls_inside_per_run": per_run.map(r2),
            "calls_per_acq": r4((t.runs + inside) as f64 / a),
            "inside_per_acq": inner,
        }));
    }
    let total = seen.len() as f64 / a;
    b.md.push(format!(
        "| **calls per acquisition (EVALSHA and BLPOP included)** | | | **{total:.2}** | |"
    ));
    b.md.push(String::new());
    json!({
        "scenario": scenario,
        "acquisitions": acquisitions,
        "calls_per_acq": r2(total),
        "calls": rows,
    })
}

/// Run `body` on a fresh lock under MONITOR; `body` gets the lock's name and returns the
/// acquisitions it made and its errors. Adds the scenario's table.
fn scripts_scenario(
    b: &mut Bench,
    what: &str,
    scenario: &str,
    body: impl FnOnce(&str) -> (u64, Vec<String>),
) -> Json {
    let name = b.name(what);
    let monitor = Monitor::start(&b.url, lock_traffic(&name));
    let (acquisitions, errors) = body(&name);
    let seen = monitor.finish();
    let mut j = calls_table(b, scenario, acquisitions, &seen);
    j["errors"] = json!(errors);
    j
}

/// Redis calls per acquisition, per script: fairlock under `MONITOR`, which shows every command
/// a script runs. Uncontended pairs, re-entrant pairs under an outer guard, 4 threads contending.
fn scripts(b: &mut Bench) {
    b.md.push("### Redis calls per acquisition by script, fairlock (under MONITOR, which slows Redis: counts, not speed)\n".into());
    let n = b.sizes.scripts_n;
    // load every script before watching, so no NOSCRIPT reply and retry is counted
    let mut conn = connect(&b.url);
    for script in fairlock::raw::scripts() {
        script.load(&mut conn).expect("SCRIPT LOAD");
    }
    let client = fairlock::LockClient::connect(&b.url).expect("fairlock client");
    let pairs = |name: &str| {
        let lock = client.lock(name).expect("lock handle");
        for _ in 0..n {
            lock.lock().expect("lock").unlock().expect("unlock");
        }
        (n as u64, vec![])
    };
    let mut out = vec![scripts_scenario(
        b,
        "scripts-uncontended",
        "uncontended acquire + release (one thread)",
        pairs,
    )];

    let reentrant_lock = client
        .lock(&b.name("scripts-reentrant"))
        .expect("lock handle");
    let outer = reentrant_lock.lock().expect("lock");
    out.push(scripts_scenario(
        b,
        "scripts-reentrant",
        "re-entrant acquire + release (an outer guard held)",
        |_| {
            for _ in 0..n {
                reentrant_lock
                    .lock()
                    .expect("lock")
                    .unlock()
                    .expect("unlock");
            }
            (n as u64, vec![])
        },
    ));
    outer.unlock().expect("unlock");

    let start = mono_ns() + 200 * MS;
    let dur = (b.sizes.scripts_secs * SEC as f64) as u64;
    let spec = b.timed_spec(Lib::Fairlock, "scripts-contended", false, 0, start, dur);
    out.push(scripts_scenario(
        b,
        "scripts-contended",
        "contended: 4 threads of one process, hold 0",
        |_| {
            let o = run(&spec, 0, 4, None, false);
            let grants = o.recs.iter().filter(|r| r.got > 0).count() as u64;
            (grants, o.errors)
        },
    ));
    b.json.insert("scripts".into(), Json::Array(out));
}

/// A table of targets: (target, goal, this run, met).
#[derive(Default)]
struct Targets {
    rows: Vec<(String, String, String, Option<bool>)>,
}

impl Targets {
    /// A target whose figure `value` is shown with `fmt` and met when `ok` (goal "-": only shown).
    fn add(
        &mut self,
        name: &str,
        goal: &str,
        value: Option<f64>,
        fmt: &dyn Fn(f64) -> String,
        ok: &dyn Fn(f64) -> bool,
    ) {
        self.rows.push((
            name.to_string(),
            goal.to_string(),
            value.map_or("not measured".into(), fmt),
            value.map(ok).filter(|_| goal != "-"),
        ));
    }

    /// The Markdown table under `title`, and the JSON array under `key`.
    fn report(self, b: &mut Bench, title: &str, key: &str) {
        b.md.push(format!("### {title}\n"));
        b.md.push("| target | goal | this run | met |".into());
        b.md.push("|---|---|---:|---|".into());
        let mut out = vec![];
        for (name, goal, value, ok) in self.rows {
            let met = match ok {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "-",
            };
            b.md.push(format!("| {name} | {goal} | {value} | {met} |"));
            out.push(json!({"target": name, "goal": goal, "value": value, "met": ok}));
        }
        b.md.push(String::new());
        b.json.insert(key.into(), Json::Array(out));
    }
}

/// Field `key` of the micro row of `figure` and `lock`.
fn micro_figure(j: &Json, figure: &str, lock: &str, key: &str) -> Option<f64> {
    j["micro"].as_array().and_then(|a| {
        a.iter()
            .find(|r| r["figure"] == figure && r["lock"] == lock)
            .and_then(|r| r[key].as_f64())
    })
}

/// The throughput row of `lock` with `procs` processes and a hold of `hold_ms`.
fn throughput_of(j: &Json, lock: &str, procs: u64, hold_ms: f64) -> Option<Json> {
    j["throughput"].as_array().and_then(|a| {
        a.iter()
            .find(|r| r["lock"] == lock && r["processes"] == procs && r["hold_ms"] == hold_ms)
            .cloned()
    })
}

fn x2(v: f64) -> String {
    format!("{v:.2}")
}

/// The targets, checked against this run; then the workers' errors.
fn targets(b: &mut Bench) {
    let j = Json::Object(b.json.clone());
    targets_latency(&j).report(b, "Targets: latency, fairness and throughput", "targets");
    targets_cost(&j).report(b, "Targets: what a lock costs Redis", "targets_cost");
    worker_errors(b, &j);
}

/// Latency, fairness and throughput.
fn targets_latency(j: &Json) -> Targets {
    let micro = |fig: &str, lock: &str, key: &str| micro_figure(j, fig, lock, key);
    let hand = |lock: &str, between: &str, key: &str| {
        j["handoff"].as_array().and_then(|a| {
            a.iter()
                .find(|r| r["lock"] == lock && r["between"] == between)
                .and_then(|r| r[key].as_f64())
        })
    };
    let tp = |lock: &str, procs: u64, hold: f64| throughput_of(j, lock, procs, hold);
    let mut t = Targets::default();
    let x = x2;
    t.add(
        "uncontended acquire + release p50 / RTT",
        "≤ 2.5",
        micro("uncontended acquire + release", "fairlock", "p50_rtt"),
        &x,
        &|v| v <= 2.5,
    );
    t.add(
        "re-entrant acquire p50 / RTT",
        "≤ 1.2",
        micro("re-entrant acquire", "fairlock", "p50_rtt"),
        &x,
        &|v| v <= 1.2,
    );
    for between in ["threads", "processes"] {
        t.add(
            &format!("hand-off p50 / RTT ({between})"),
            "≤ 3",
            hand("fairlock", between, "p50_rtt"),
            &x,
            &|v| v <= 3.0,
        );
        t.add(
            &format!("hand-off p99 / RTT ({between})"),
            "≤ 10",
            hand("fairlock", between, "p99_rtt"),
            &x,
            &|v| v <= 10.0,
        );
    }
    let pp = hand("fairlock", "processes", "p50_us").zip(hand("fairlock", "threads", "p50_us"));
    t.add(
        "hand-off p50 processes / threads",
        "≈ 1 (≤ 1.25)",
        pp.map(|(p, t)| p / t),
        &x,
        &|v| v <= 1.25,
    );
    for hold in [0.0, 1.0] {
        let (f, r) = (tp("fairlock", 8, hold), tp("redlock", 8, hold));
        let ratio = f.as_ref().zip(r.as_ref()).and_then(|(f, r)| {
            Some(f["acq_per_s"].as_f64()? / r["acq_per_s"].as_f64()?.max(0.001))
        });
        t.add(
            &format!("8 procs hold {hold} ms: acq/s fairlock / redlock"),
            "≥ 1.5",
            ratio,
            &x,
            &|v| v >= 1.5,
        );
        let g = |k: &str| f.as_ref().and_then(|f| f[k].as_f64());
        // FIFO is judged on the exact orders of the audit; the client clocks of the throughput
        // run blur requests a few µs apart (a thread preempted between its timestamp and its
        // write), which the audit shows for what it is
        let audited = j["fifo_audit"].as_array().and_then(|a| {
            a.iter()
                .find(|r| r["processes"] == 8 && r["hold_ms"] == hold)
                .and_then(|r| r["overtakes_server_order"].as_f64())
        });
        t.add(
            &format!("8 procs hold {hold} ms: overtakes (FIFO audit, server order)"),
            "0",
            audited,
            &|v| format!("{v:.0}"),
            &|v| v == 0.0,
        );
        t.add(
            &format!("8 procs hold {hold} ms: overtakes by client clocks (informative)"),
            "-",
            g("overtake_pct"),
            &|v| format!("{v:.2} %"),
            &|_| true,
        );
        t.add(
            &format!("8 procs hold {hold} ms: Jain's index"),
            "≥ 0.99",
            g("jain"),
            &|v| format!("{v:.4}"),
            &|v| v >= 0.99,
        );
        t.add(
            &format!("8 procs hold {hold} ms: max wait / median wait"),
            "≤ 10",
            g("max_over_median_wait"),
            &x,
            &|v| v <= 10.0,
        );
    }
    let audit: Option<f64> = j["fifo_audit"].as_array().map(|a| {
        a.iter()
            .filter_map(|r| r["overtakes_server_order"].as_f64())
            .sum()
    });
    t.add(
        "FIFO audit: overtakes in server arrival order, all audited runs",
        "0",
        audit,
        &|v| format!("{v:.0}"),
        &|v| v == 0.0,
    );
    let mut max_rt: Option<f64> = None;
    for key in ["throughput", "scaling"] {
        for r in j[key].as_array().into_iter().flatten() {
            if key == "throughput" && r["lock"] != "fairlock" {
                continue;
            }
            if let Some(v) = r["round_trips_per_acq"].as_f64() {
                max_rt = Some(max_rt.map_or(v, |m: f64| m.max(v)));
            }
        }
    }
    t.add(
        "lock commands (round trips) per acquisition, worst run",
        "≤ 4",
        max_rt,
        &x,
        &|v| v <= 4.0,
    );
    let scale = |n: u64| {
        j["scaling"].as_array().and_then(|a| {
            a.iter()
                .find(|r| r["waiters"] == n)
                .and_then(|r| r["handoff"]["p50_us"].as_f64())
        })
    };
    let base = scale(2).or_else(|| hand("fairlock", "threads", "p50_us"));
    t.add(
        "256 waiters: hand-off p50 / 2-waiter p50",
        "≤ 1.5",
        scale(256).zip(base).map(|(a, b)| a / b),
        &x,
        &|v| v <= 1.5,
    );

    t
}

/// What one lock costs Redis, in calls and CPU, against the naive lock.
fn targets_cost(j: &Json) -> Targets {
    let mut t = Targets::default();
    let micro = |lock: &str, key: &str| micro_figure(j, "uncontended acquire + release", lock, key);
    let contended = |lock: &str| {
        throughput_of(j, lock, 8, 0.0).and_then(|r| r["redis_cpu_us_per_acq"].as_f64())
    };
    let ratio = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a / b.max(0.001));
    t.add(
        "Redis calls per uncontended acquire + release (EVALSHAs included)",
        "≤ 12",
        micro("fairlock", "redis_cmds"),
        &x2,
        &|v| v <= 12.0,
    );
    t.add(
        "Redis calls per contended acquisition (8 procs, hold 0)",
        "≤ 16",
        throughput_of(j, "fairlock", 8, 0.0).and_then(|r| r["redis_cmds_per_acq"].as_f64()),
        &x2,
        &|v| v <= 16.0,
    );
    t.add(
        "Redis CPU per uncontended acquire + release, fairlock / naive",
        "≤ 1.15",
        ratio(
            micro("fairlock", "redis_cpu_us"),
            micro("naive", "redis_cpu_us"),
        ),
        &x2,
        &|v| v <= 1.15,
    );
    t.add(
        "Redis CPU per contended acquisition (8 procs, hold 0), fairlock / naive",
        "≤ 1.3",
        ratio(contended("fairlock"), contended("naive")),
        &x2,
        &|v| v <= 1.3,
    );
    t.add(
        "uncontended acquire + release p50 / RTT",
        "≤ 2.6",
        micro("fairlock", "p50_rtt"),
        &x2,
        &|v| v <= 2.6,
    );
    t.add(
        "re-entrant acquire p50 / RTT",
        "≤ 1.2",
        micro_figure(j, "re-entrant acquire", "fairlock", "p50_rtt"),
        &x2,
        &|v| v <= 1.2,
    );
    t
}

/// The workers' errors of every section, listed under the targets.
fn worker_errors(b: &mut Bench, j: &Json) {
    let mut errors = vec![];
    for (section, v) in j.as_object().into_iter().flatten() {
        for r in v.as_array().into_iter().flatten() {
            for e in r["errors"].as_array().into_iter().flatten() {
                errors.push(format!("- {section}: {}", e.as_str().unwrap_or("?")));
            }
        }
    }
    if !errors.is_empty() {
        b.md.push(format!(
            "**{} worker errors** (see the JSON):\n",
            errors.len()
        ));
        b.md.extend(errors.into_iter().take(20));
        b.md.push(String::new());
    }
}

// ---- main --------------------------------------------------------------------------------

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--child") {
        child_main(&args[1..]);
        return;
    }
    let mut quick = false;
    let mut out = std::path::PathBuf::from("target/bench/results.json");
    let mut criterion = None;
    let mut only: Option<Vec<String>> = None;
    let mut overrides: Vec<(String, String)> = vec![];
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--quick" => quick = true,
            "--out" => out = it.next().expect("--out PATH").into(),
            "--criterion" => criterion = Some(it.next().expect("--criterion DIR").into()),
            "--only" => {
                only = Some(
                    it.next()
                        .expect("--only LIST")
                        .split(',')
                        .map(String::from)
                        .collect(),
                )
            }
            // narrow a run down while investigating: --libs fairlock,redlock --layouts 8x4,0x32
            // (processes x threads, 0 = threads of one process) --holds 0,1000 (µs) --secs 2
            "--libs" | "--layouts" | "--holds" | "--secs" => {
                let v = it.next().unwrap_or_else(|| panic!("{a} needs a value"));
                overrides.push((a.clone(), v.clone()));
            }
            "--bench" => {} // added by `cargo bench`
            other => {
                eprintln!("driver: unknown argument {other:?}");
                std::process::exit(2);
            }
        }
    }
    let Ok(url) = std::env::var("FAIRLOCK_BENCH_REDIS") else {
        eprintln!("driver: FAIRLOCK_BENCH_REDIS is not set; run scripts/bench.sh (it starts a throwaway redis-server)");
        return;
    };
    let wanted = |s: &str| only.as_ref().is_none_or(|o| o.iter().any(|x| x == s));

    let began = Instant::now();
    let mut conn = connect(&url);
    let machine = machine(&mut conn);
    let mut sizes = Sizes::new(quick);
    for (k, v) in &overrides {
        let list = || v.split(',').map(str::trim);
        match k.as_str() {
            "--libs" => {
                sizes.libs = list()
                    .map(|l| Lib::parse(l).unwrap_or_else(|| panic!("unknown lock {l:?}")))
                    .collect()
            }
            "--layouts" => {
                sizes.layouts = list()
                    .map(|l| {
                        let (p, t) = l.split_once('x').expect("--layouts PxT");
                        (p.parse().expect("processes"), t.parse().expect("threads"))
                    })
                    .collect()
            }
            "--holds" => sizes.holds_us = list().map(|h| h.parse().expect("µs")).collect(),
            "--secs" => sizes.throughput_secs = v.parse().expect("seconds"),
            _ => {}
        }
    }
    let ping_start = ping_samples(&mut conn, sizes.ping);
    let mut b = Bench {
        rtt_us: dist(ping_start.clone()).p50,
        ping: connect(&url),
        url,
        run_id: format!("{}-{}", std::process::id(), mono_ns() % 1_000_000),
        sizes,
        json: serde_json::Map::new(),
        md: vec![],
        criterion,
    };
    eprintln!(
        "driver: PING p50 {:.0} µs; running{}",
        b.rtt_us,
        if quick { " (quick)" } else { "" }
    );
    type Step = (&'static str, fn(&mut Bench));
    let steps: [Step; 6] = [
        ("micro", micro),
        ("handoff", handoff),
        ("throughput", throughput),
        ("fifo", fifo),
        ("scaling", scaling),
        ("scripts", scripts),
    ];
    for (name, step) in steps {
        if wanted(name) {
            let t = Instant::now();
            step(&mut b);
            eprintln!("driver: {name} done in {:.1} s", t.elapsed().as_secs_f64());
        }
    }
    let ping_end = ping_samples(&mut conn, b.sizes.ping);
    let (d0, d1) = (dist(ping_start.clone()), dist(ping_end.clone()));
    let all = dist([ping_start, ping_end].concat());
    targets(&mut b);

    let mut machine = machine;
    machine["loadavg_end"] = json!(loadavg());
    let ping_md = format!(
        "PING round trip (RTT), loopback, one client: p50 {:.0} µs over the run (start {:.0}, end {:.0}), p99 {:.0} µs. It moves with the host's load, so each row is divided by the RTT measured with it (column RTT: PINGs interleaved with the single-thread loops, or bursts right before and after a multi-worker run).",
        all.p50, d0.p50, d1.p50, all.p99
    );
    let head = format!(
        "Machine: {} CPUs, {}, Redis {} on loopback, load average {} → {}.\n\n{ping_md}\n",
        machine["nproc"],
        machine["cpu"].as_str().unwrap_or(""),
        machine["redis_version"].as_str().unwrap_or(""),
        machine["loadavg_start"].as_str().unwrap_or(""),
        machine["loadavg_end"].as_str().unwrap_or(""),
    );
    let mut json = serde_json::Map::new();
    json.insert("machine".into(), machine);
    json.insert("quick".into(), json!(quick));
    json.insert(
        "ping".into(),
        json!({"rtt_us": r1(b.rtt_us), "start": d0.json(b.rtt_us), "end": d1.json(b.rtt_us), "all": all.json(b.rtt_us)}),
    );
    json.insert("seconds".into(), json!(r1(began.elapsed().as_secs_f64())));
    json.extend(std::mem::take(&mut b.json));
    if let Some(dir) = out.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let text = serde_json::to_string_pretty(&Json::Object(json)).expect("json");
    std::fs::write(&out, text + "\n").unwrap_or_else(|e| panic!("writing {}: {e}", out.display()));
    println!("{head}");
    if quick {
        println!("**Quick run** (what CI checks): tiny samples, the figures mean nothing.\n");
    }
    for line in &b.md {
        println!("{line}");
    }
    eprintln!(
        "driver: wrote {} in {:.0} s",
        out.display(),
        began.elapsed().as_secs_f64()
    );
}
