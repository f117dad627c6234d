//! Section "cluster": fairlock on a Redis Cluster next to fairlock on one node, in the same run:
//! hand-off (thread → thread, process → process) and contended throughput. `scripts/bench.sh`
//! starts a 3-master cluster (no replicas: the single node has none either) and passes its URL
//! in `FAIRLOCK_BENCH_CLUSTER`; without it the section is skipped. Counters and ping-pong signals
//! stay on the single node in both runs, so the only difference is where the lock lives.

use serde::Serialize;

use crate::bench::Bench;
use crate::locks::{mono_ns, Lib};
use crate::stats::{dist, handoffs, handoffs_with_release, r1, r2};
use crate::workers::{cleanup, Spec};
use crate::{MS, SEC};

/// A row of the results file's `cluster`: one scenario on one node and on the cluster.
#[derive(Serialize)]
pub struct ClusterRow {
    pub scenario: String,
    /// "hand-off p50 µs" or "acq/s"
    pub unit: &'static str,
    pub single_node: f64,
    pub cluster: f64,
    /// cluster / single node (for hand-off, above 1 is slower; for acq/s, below 1 is slower)
    pub ratio: f64,
    pub rtt_us: f64,
    pub errors: Vec<String>,
}

pub fn cluster(b: &mut Bench) {
    let Ok(cluster_url) = std::env::var("FAIRLOCK_BENCH_CLUSTER") else {
        eprintln!("driver: cluster: FAIRLOCK_BENCH_CLUSTER is not set (scripts/bench.sh sets it); skipped");
        return;
    };
    b.md.push("### On a Redis Cluster (3 masters, no replicas) and on one node, same run\n".into());
    b.md.push("| scenario | one node | cluster | cluster / one node | RTT µs |".into());
    b.md.push("|---|---:|---:|---:|---:|".into());
    let out = one_node_versus(b, &cluster_url, "cl")
        .into_iter()
        .map(|v| row(b, v))
        .collect();
    b.md.push(String::new());
    b.results.cluster = Some(out);
}

/// One scenario measured with the lock on the benchmark's node and at another URL.
pub struct Versus {
    pub scenario: String,
    pub unit: &'static str,
    /// [on the benchmark's node, at the other URL]
    pub values: [f64; 2],
    pub errors: Vec<String>,
}

/// Hand-off (thread → thread, process → process) and contended throughput (8 processes × 4
/// threads, hold 0 and 1 ms) with fairlock's lock on the benchmark's node, then at `other_url`;
/// counters and ping-pong signals stay on the benchmark's node in both. `tag` names the runs.
pub fn one_node_versus(b: &mut Bench, other_url: &str, tag: &str) -> Vec<Versus> {
    let mut out = vec![];
    // hand-off: two workers taking turns (ping-pong), as section "handoff"
    for (procs, threads, between) in [(0, 2, "thread → thread"), (2, 1, "process → process")] {
        let mut p50 = [0.0; 2];
        let mut errors = vec![];
        for (k, lock_url) in [String::new(), other_url.to_string()]
            .into_iter()
            .enumerate()
        {
            let what = format!("{tag}-handoff-{procs}-{k}");
            let start = mono_ns() + if procs > 0 { 800 * MS } else { 200 * MS };
            let spec = Spec {
                lib: Lib::Fairlock,
                url: b.url.clone(),
                lock_url,
                name: b.name(&what),
                counter: b.name(&format!("{what}:counter")),
                signal: b.name(&format!("{what}:signal")),
                hold_us: b.sizes.handoff_hold_us,
                start_ns: start,
                stop_ns: start + b.sizes.handoff_cap,
                give_up_ns: start + b.sizes.handoff_cap + b.sizes.grace,
                max_seq: b.sizes.handoffs as i64 + 1,
            };
            let o = b.run_timed(&spec, procs, threads, None);
            let (lat, _, _) = handoffs_with_release(&o.recs);
            p50[k] = dist(lat).p50;
            errors.extend(o.errors);
            cleanup(&b.url, &spec);
        }
        out.push(Versus {
            scenario: format!("hand-off p50 µs, {between}"),
            unit: "hand-off p50 µs",
            values: p50,
            errors,
        });
    }
    // contended throughput: 8 processes × 4 threads, hold 0 and 1 ms, as section "throughput"
    let secs = b.sizes.throughput_secs;
    for hold in [0, 1000] {
        let mut rate = [0.0; 2];
        let mut errors = vec![];
        for (k, lock_url) in [String::new(), other_url.to_string()]
            .into_iter()
            .enumerate()
        {
            let start = mono_ns() + 800 * MS;
            let dur = (secs * SEC as f64) as u64;
            let mut spec = b.timed_spec(
                Lib::Fairlock,
                &format!("{tag}-tp-{hold}-{k}"),
                true,
                hold,
                start,
                dur,
            );
            spec.lock_url = lock_url;
            let o = b.run_timed(&spec, 8, 4, None);
            let in_time = o
                .recs
                .iter()
                .filter(|r| r.got >= spec.start_ns && r.got < spec.stop_ns)
                .count();
            rate[k] = in_time as f64 / (dur as f64 / SEC as f64);
            let (_, overlaps) = handoffs(&o.recs);
            if overlaps > 0 {
                errors.push(format!("{overlaps} grants before the previous release"));
            }
            errors.extend(o.errors);
            cleanup(&b.url, &spec);
        }
        out.push(Versus {
            scenario: format!("acq/s, 8 procs × 4 threads, hold {} ms", hold / 1000),
            unit: "acq/s",
            values: rate,
            errors,
        });
    }
    out
}

/// A Markdown line (`| scenario | one node | other | other / one node | RTT µs |`) for `v`.
pub fn md_line(b: &mut Bench, v: &Versus) -> f64 {
    let [single, other] = v.values;
    let ratio = if single > 0.0 { other / single } else { 0.0 };
    b.md.push(format!(
        "| {} | {single:.0} | {other:.0} | {ratio:.2} | {:.0} |{}",
        v.scenario,
        b.rtt_us,
        if v.errors.is_empty() {
            String::new()
        } else {
            format!(" errors: {:?}", v.errors)
        }
    ));
    ratio
}

fn row(b: &mut Bench, v: Versus) -> ClusterRow {
    let ratio = md_line(b, &v);
    ClusterRow {
        scenario: v.scenario,
        unit: v.unit,
        single_node: r1(v.values[0]),
        cluster: r1(v.values[1]),
        ratio: r2(ratio),
        rtt_us: r1(b.rtt_us),
        errors: v.errors,
    }
}
