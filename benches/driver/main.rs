//! The benchmark driver: uncontended and re-entrant cost, hand-off latency,
//! contended throughput with fairness, and scaling with waiters, for fairlock and its two peers
//! (see `benches/locks/mod.rs`), every figure next to the PING round trip (RTT) measured in the same run;
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

mod args;
mod bench;
mod fifo;
mod handoff;
mod micro;
mod monitor;
mod redis_cost;
mod report;
mod scaling;
mod scripts;
mod sizes;
mod stats;
mod targets;
mod throughput;
mod workers;

use std::time::Instant;

use clap::Parser;
use serde_json::{json, Value as Json};

use args::Args;
use bench::{connect, ping_samples, Bench};
use locks::mono_ns;
use report::{loadavg, machine};
use stats::{dist, r1};
use workers::child_main;

pub const MS: u64 = 1_000_000;
pub const SEC: u64 = 1_000_000_000;

fn main() {
    let args = Args::parse();
    if let Some(child) = &args.child {
        child_main(child);
        return;
    }
    let Ok(url) = std::env::var("FAIRLOCK_BENCH_REDIS") else {
        eprintln!("driver: FAIRLOCK_BENCH_REDIS is not set; run scripts/bench.sh (it starts a throwaway redis-server)");
        return;
    };
    let began = Instant::now();
    let mut conn = connect(&url);
    let machine = machine(&mut conn);
    let sizes = args.sizes();
    let ping_start = ping_samples(&mut conn, sizes.ping);
    let mut b = Bench {
        rtt_us: dist(ping_start.clone()).p50,
        ping: connect(&url),
        url,
        run_id: format!("{}-{}", std::process::id(), mono_ns() % 1_000_000),
        sizes,
        json: serde_json::Map::new(),
        md: vec![],
        criterion: args.criterion.clone(),
    };
    eprintln!(
        "driver: PING p50 {:.0} µs; running{}",
        b.rtt_us,
        if args.quick { " (quick)" } else { "" }
    );
    type Step = (&'static str, fn(&mut Bench));
    let steps: [Step; 6] = [
        ("micro", micro::micro),
        ("handoff", handoff::handoff),
        ("throughput", throughput::throughput),
        ("fifo", fifo::fifo),
        ("scaling", scaling::scaling),
        ("scripts", scripts::scripts),
    ];
    for (name, step) in steps {
        if args.wants(name) {
            let t = Instant::now();
            step(&mut b);
            eprintln!("driver: {name} done in {:.1} s", t.elapsed().as_secs_f64());
        }
    }
    let ping_end = ping_samples(&mut conn, b.sizes.ping);
    let (d0, d1) = (dist(ping_start.clone()), dist(ping_end.clone()));
    let all = dist([ping_start, ping_end].concat());
    targets::targets(&mut b);

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
    json.insert("quick".into(), json!(args.quick));
    json.insert(
        "ping".into(),
        json!({"rtt_us": r1(b.rtt_us), "start": d0.json(b.rtt_us), "end": d1.json(b.rtt_us), "all": all.json(b.rtt_us)}),
    );
    json.insert("seconds".into(), json!(r1(began.elapsed().as_secs_f64())));
    json.extend(std::mem::take(&mut b.json));
    if let Some(dir) = args.out.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let text = serde_json::to_string_pretty(&Json::Object(json)).expect("json");
    std::fs::write(&args.out, text + "\n")
        .unwrap_or_else(|e| panic!("writing {}: {e}", args.out.display()));
    println!("{head}");
    if args.quick {
        println!("**Quick run** (what CI checks): tiny samples, the figures mean nothing.\n");
    }
    for line in &b.md {
        println!("{line}");
    }
    eprintln!(
        "driver: wrote {} in {:.0} s",
        args.out.display(),
        began.elapsed().as_secs_f64()
    );
}
