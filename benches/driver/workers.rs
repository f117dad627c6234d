//! The workers: one loop per worker (acquire, number the grant, hold, release), as threads of
//! this process or in child processes (`--child k=v ...`, which print their records on stdout),
//! and `run`, which starts a scenario's workers and gathers their records and Redis's cost.

use std::collections::HashMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use crate::bench::connect;
use crate::locks::{mono_ns, sleep_until_ns, Lib, Locker, Res};
use crate::monitor::{watch_acquires, watch_floor_acquires, watch_list_acquires, Monitor};
use crate::redis_cost::{background_switches, cost, snapshot, Cost};
use crate::stats::r2;
use crate::{MS, SEC};

/// One acquisition (or, with `got == 0`, a wait abandoned at the end of a run).
#[derive(Clone, Copy, Debug)]
pub struct Rec {
    pub worker: u32,
    pub req: u64,
    pub got: u64,
    pub rel: u64,
    /// the release call returned
    pub done: u64,
    pub seq: i64,
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

/// A fairlock client of `url`, waiting as `FAIRLOCK_BENCH_WAIT_MODE` says: `per-thread` for a
/// connection per waiting thread, anything else (or unset) for the default, shared one. For
/// A/B runs: `FAIRLOCK_BENCH_WAIT_MODE=per-thread scripts/bench-ab.sh REV HEAD 3 waiting`.
pub fn fairlock_client(url: &str) -> fairlock::Result<fairlock::LockClient> {
    let mode = match std::env::var("FAIRLOCK_BENCH_WAIT_MODE").as_deref() {
        Ok("per-thread") => fairlock::WaitMode::PerThread,
        _ => fairlock::WaitMode::Shared,
    };
    let mut builder = fairlock::LockClient::builder(url).wait_mode(mode);
    // the TLS server of section "tls" (scripts/bench.sh made its CA)
    if url.starts_with("rediss") {
        if let Some(ca) = std::env::var_os("FAIRLOCK_BENCH_TLS_CA") {
            builder = builder.tls_ca_file(ca);
        }
    }
    builder.build()
}

/// Everything a worker needs; passed to child processes as `key=value` arguments.
#[derive(Clone, Debug)]
pub struct Spec {
    pub lib: Lib,
    /// the benchmark's Redis: counters, signals, and the lock unless `lock_url` is set
    pub url: String,
    /// where fairlock's lock lives when not at `url` (a Redis Cluster); empty: at `url`
    pub lock_url: String,
    pub name: String,
    /// counter key for GET/SET under the lock; empty: use the fencing token as `seq`
    pub counter: String,
    /// prefix of the per-worker signal lists of the ping-pong hand-off runs; empty: free loop
    pub signal: String,
    pub hold_us: u64,
    pub start_ns: u64,
    pub stop_ns: u64,
    pub give_up_ns: u64,
    /// stop once this many grants were counted (0: only the time)
    pub max_seq: i64,
}

impl Spec {
    /// Where the lock lives.
    pub fn lock_url(&self) -> &str {
        if self.lock_url.is_empty() {
            &self.url
        } else {
            &self.lock_url
        }
    }

    fn args(&self) -> Vec<String> {
        vec![
            format!("lib={}", self.lib.name()),
            format!("url={}", self.url),
            format!("lock_url={}", self.lock_url),
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
            lock_url: get("lock_url")?.into(),
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
/// Returns the worker's records and, for fairlock, its owner flag (as the scripts see it; for
/// the fair floor, its id).
fn worker(spec: &Spec, id: u32, client: Option<&fairlock::LockClient>) -> Res<(Vec<Rec>, String)> {
    let mut locker = Locker::new(spec.lib, &spec.url, &spec.name, client, &id.to_string())?;
    let flag = client
        .map(|c| c.current_owner())
        .or_else(|| locker.floor_id())
        .unwrap_or_default();
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

/// What the workers of one process bring back.
#[derive(Default)]
struct Collected {
    recs: Vec<Rec>,
    errors: Vec<String>,
    /// worker -> owner flag (fairlock)
    flags: HashMap<u32, String>,
}

/// Run `threads` workers in this process, numbered from `first`.
fn run_threads(spec: &Spec, first: u32, threads: u32) -> Collected {
    let mut out = Collected::default();
    let client = match spec.lib {
        lib if lib.is_fairlock() => match fairlock_client(spec.lock_url()) {
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

/// Child process: run the workers, print their records (`mode=waiting`: the waiting process of
/// section "waiting", see `waiting::child`).
pub fn child_main(args: &[String]) {
    if args.iter().any(|a| a == "mode=waiting") {
        crate::waiting::child(args);
        return;
    }
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
pub struct Outcome {
    pub recs: Vec<Rec>,
    pub errors: Vec<String>,
    pub flags: HashMap<u32, String>,
    /// with `monitor`: the owner flags of the acquire calls, in the order Redis ran them
    pub arrivals: Vec<String>,
    pub workers: u32,
    pub cost: Option<Cost>,
    pub counter: Option<i64>,
}

/// Where a run's workers live: threads of this process, or child processes of so many threads
/// each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Layout {
    Threads(u32),
    Procs(Vec<u32>),
}

impl Layout {
    /// `procs` processes of `threads` threads; `procs == 0`: `threads` threads of this process.
    pub fn of(procs: u32, threads: u32) -> Layout {
        if procs == 0 {
            Layout::Threads(threads)
        } else {
            Layout::Procs(vec![threads; procs as usize])
        }
    }

    pub fn workers(&self) -> u32 {
        match self {
            Layout::Threads(t) => *t,
            Layout::Procs(p) => p.iter().sum(),
        }
    }
}

/// Run a scenario: `procs` child processes of `threads` workers each (`procs == 0`: threads of
/// this process). Takes commandstats over the middle of the run when `window` is given.
pub fn run(
    spec: &Spec,
    procs: u32,
    threads: u32,
    window: Option<(u64, u64)>,
    monitor: bool,
) -> Outcome {
    run_layout(spec, &Layout::of(procs, threads), window, monitor)
}

/// `run` with the workers laid out as `layout` says.
pub fn run_layout(
    spec: &Spec,
    layout: &Layout,
    window: Option<(u64, u64)>,
    monitor: bool,
) -> Outcome {
    let workers = layout.workers();
    let mut conn = connect(&spec.url);
    let monitor = monitor.then(|| {
        if spec.lib == Lib::FairFloorList {
            watch_list_acquires(&spec.url, &spec.name)
        } else if spec.lib.is_floor() {
            watch_floor_acquires(&spec.url, &spec.name)
        } else {
            watch_acquires(&spec.url, &spec.name)
        }
    });
    let mut stats = vec![];
    let mut bg = vec![];
    let got = match layout {
        &Layout::Threads(threads) => {
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
        }
        Layout::Procs(procs) => {
            let exe = std::env::current_exe().expect("current_exe");
            let firsts = procs.iter().scan(0, |first, &t| {
                *first += t;
                Some(*first - t)
            });
            let children: Vec<_> = procs
                .iter()
                .zip(firsts)
                .map(|(&threads, first)| {
                    let mut cmd = match (spec.lib, node_peer()) {
                        (Lib::NodeMutex, Some(dir)) => {
                            let mut c = Command::new("node");
                            c.arg(dir.join("mutex.js"));
                            c
                        }
                        _ => {
                            let mut c = Command::new(&exe);
                            c.arg("--child");
                            c
                        }
                    };
                    cmd.args(spec.args())
                        .arg(format!("first_worker={first}"))
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
        }
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
                spec.lib.scripts_set(),
                spec.lib.client_rpush(),
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

/// The directory of the node peer (`benches/peers/redis-semaphore`, its packages installed),
/// which scripts/bench.sh passes in `FAIRLOCK_BENCH_NODE_PEER` when node and npm could set it up.
pub fn node_peer() -> Option<std::path::PathBuf> {
    std::env::var_os("FAIRLOCK_BENCH_NODE_PEER")
        .map(std::path::PathBuf::from)
        .filter(|d| d.join("node_modules").is_dir())
}

/// Delete a run's keys (the locks' own keys expire or are empty at the end).
pub fn cleanup(url: &str, spec: &Spec) {
    let mut conn = connect(url);
    let mut del = redis::cmd("DEL");
    del.arg(&spec.counter);
    if !spec.signal.is_empty() {
        del.arg(format!("{}:0", spec.signal))
            .arg(format!("{}:1", spec.signal));
    }
    let _: redis::RedisResult<i64> = del.query(&mut conn);
}
