//! Contended throughput with fairness, per lock, layout and hold.

use serde::Serialize;

use crate::bench::Bench;
use crate::locks::{mono_ns, Lib};
use crate::redis_cost::{cost_cells, CostPerAcq, COST_HEADER_PER_ACQ};
use crate::stats::{dist, handoffs, jain, overtakes, r1, r2, r4, DistRow};
use crate::workers::{cleanup, Outcome, Rec, Spec};
use crate::{MS, SEC};

/// A row of the results file's `throughput`: one lock, layout and hold.
#[derive(Serialize)]
pub struct ThroughputRow {
    pub lock: &'static str,
    pub processes: u32,
    pub threads_per_process: u32,
    pub workers: u32,
    pub hold_ms: f64,
    pub seconds: f64,
    pub acquisitions: usize,
    pub acq_per_s: f64,
    /// the counter the workers incremented under the lock, read at the end
    pub counter: Option<i64>,
    /// it equals the grants
    pub counter_ok: bool,
    pub overlaps: usize,
    pub per_worker: Vec<u64>,
    pub jain: f64,
    pub overtakes: usize,
    pub overtake_pct: f64,
    pub abandoned_waits: usize,
    pub rtt_us: f64,
    pub wait: DistRow,
    pub max_over_median_wait: f64,
    pub handoff: DistRow,
    pub errors: Vec<String>,
    #[serde(flatten)]
    pub cost: CostPerAcq,
}

/// Figure 4: contended throughput with fairness, per lock, layout and hold.
pub fn throughput(b: &mut Bench) {
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
            // the read/write lock's writes are measured by the hand-off only
            for lib in b
                .sizes
                .libs
                .clone()
                .into_iter()
                .filter(|&l| l != Lib::RwWrite)
            {
                i += 1;
                let start = mono_ns() + if procs > 0 { 800 * MS } else { 200 * MS };
                let dur = (secs * SEC as f64) as u64;
                let spec = b.timed_spec(lib, &format!("tp{i}"), true, hold, start, dur);
                let window = (start + dur / 4, start + dur * 9 / 10);
                let o = b.run_timed(&spec, procs, threads, Some(window));
                out.push(throughput_row(b, &spec, procs, threads, o, dur));
                cleanup(&b.url, &spec);
            }
        }
    }
    b.md.push(String::new());
    b.md.push("Redis cmds / acq leave out the benchmark's own GET and SET of the counter; Redis CPU µs / acq cannot and includes them (two round trips per acquisition, for every lock).\n".into());
    b.results.throughput = Some(out);
}

fn throughput_row(
    b: &mut Bench,
    spec: &Spec,
    procs: u32,
    threads: u32,
    o: Outcome,
    dur: u64,
) -> ThroughputRow {
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
    ThroughputRow {
        lock: spec.lib.name(),
        processes: procs,
        threads_per_process: threads,
        workers: o.workers,
        hold_ms: spec.hold_us as f64 / 1000.0,
        seconds: dur as f64 / SEC as f64,
        acquisitions: granted.len(),
        acq_per_s: r1(rate),
        counter: o.counter,
        counter_ok,
        overlaps,
        per_worker: counts,
        jain: r4(fair),
        overtakes: over,
        overtake_pct: r2(100.0 * over as f64 / granted.len().max(1) as f64),
        abandoned_waits: abandoned,
        rtt_us: r1(b.rtt_us),
        wait: w.row(b.rtt_us),
        max_over_median_wait: r2(if w.p50 > 0.0 { w.max / w.p50 } else { 0.0 }),
        handoff: h.row(b.rtt_us),
        cost: CostPerAcq::of(o.cost.as_ref()),
        errors: o.errors,
    }
}
