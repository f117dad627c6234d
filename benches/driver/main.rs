//! The benchmark driver: uncontended and re-entrant cost, hand-off latency, contended
//! throughput with fairness, and scaling with waiters, for fairlock and its two peers (see
//! `benches/locks/mod.rs`), every figure next to the PING round trip (RTT) measured in the same
//! run; what each acquisition costs Redis in calls and CPU time, and for fairlock the calls per
//! script (section "scripts").
//!
//! `scripts/bench.sh` builds and runs it against a throwaway redis-server whose URL it passes in
//! `FAIRLOCK_BENCH_REDIS`. Arguments: `[--quick] [--out PATH] [--criterion DIR] [--only LIST]`
//! (LIST: comma-separated of micro, handoff, throughput, fifo, scaling, scripts, waiting, cluster,
//! tls, semaphore, peer) and, to narrow
//! a run down while investigating, `--libs fairlock,naive --layouts 8x4,0x32 --holds 0,1000
//! --secs 2`.
//! It writes a JSON file and prints Markdown tables. Multi-process scenarios re-invoke this
//! binary as `--child k=v ...`.
//!
//! The modules: `args` (the command line) and `sizes` (how much to run); `workers` (the worker
//! loop, child processes, `run`), `stats` (distributions, fairness, hand-offs, overtakes),
//! `redis_cost` (Redis's calls and CPU per acquisition) and `monitor` (following `MONITOR`);
//! `bench` (the state the scenarios share); one module per scenario (`micro`, `handoff`,
//! `throughput`, `fifo`, `scaling`, `scripts`, `waiting`, `cluster`, `tls`, `semaphore`, `peer`:
//! against node `redis-semaphore`'s barging Mutex), each with its table and its rows of
//! the results file; `targets`; `report` (the results file and the head of the Markdown).
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
//!   sends (FCALL, BLPOP, SET, ...), "all" adds the commands scripts run inside;
//! - Redis CPU per acquisition is the redis-server process's CPU time (`INFO cpu`:
//!   used_cpu_sys + used_cpu_user) over the same window, divided the same way;
//! - the per-script breakdown follows `MONITOR`, which shows the commands a script runs right
//!   after the FCALL that ran it, and counts the lines on the lock's keys.

#[path = "../locks/mod.rs"]
mod locks;

mod args;
mod bench;
mod cluster;
mod fifo;
mod handoff;
mod micro;
mod monitor;
mod peer;
mod redis_cost;
mod report;
mod scaling;
mod scripts;
mod semaphore;
mod sizes;
mod stats;
mod targets;
mod throughput;
mod tls;
mod waiting;
mod workers;

use std::time::Instant;

use clap::Parser;

use args::Args;
use bench::{connect, ping_samples, Bench};
use locks::mono_ns;
use report::{loadavg, machine, Pings, Results, ResultsFile};
use stats::{dist, r1};
use workers::child_main;

/// Nanoseconds in a millisecond and in a second (`locks::mono_ns` counts nanoseconds).
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
    let mut machine = machine(&mut conn);
    let sizes = args.sizes();
    let ping_start = ping_samples(&mut conn, sizes.ping);
    let mut b = Bench {
        rtt_us: dist(ping_start.clone()).p50,
        ping: connect(&url),
        url,
        run_id: format!("{}-{}", std::process::id(), mono_ns() % 1_000_000),
        sizes,
        results: Results::default(),
        md: vec![],
        criterion: args.criterion.clone(),
    };
    eprintln!(
        "driver: PING p50 {:.0} µs; running{}",
        b.rtt_us,
        if args.quick { " (quick)" } else { "" }
    );
    type Step = (&'static str, fn(&mut Bench));
    let steps: [Step; 11] = [
        ("micro", micro::micro),
        ("handoff", handoff::handoff),
        ("throughput", throughput::throughput),
        ("fifo", fifo::fifo),
        ("scaling", scaling::scaling),
        ("scripts", scripts::scripts),
        ("waiting", waiting::waiting),
        ("cluster", cluster::cluster),
        ("tls", tls::tls),
        ("semaphore", semaphore::semaphore),
        ("peer", peer::peer),
    ];
    for (name, step) in steps {
        if args.wants(name) {
            let t = Instant::now();
            step(&mut b);
            eprintln!("driver: {name} done in {:.1} s", t.elapsed().as_secs_f64());
        }
    }
    let ping_end = ping_samples(&mut conn, b.sizes.ping);
    let pings = Pings {
        start: dist(ping_start.clone()),
        end: dist(ping_end.clone()),
        all: dist([ping_start, ping_end].concat()),
    };
    targets::targets(&mut b);

    machine.loadavg_end = loadavg();
    let head = report::head(&machine, &pings);
    ResultsFile {
        machine: &machine,
        quick: args.quick,
        ping: pings.row(b.rtt_us),
        seconds: r1(began.elapsed().as_secs_f64()),
        results: &b.results,
    }
    .write(&args.out);
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
