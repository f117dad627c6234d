//! Scaling: hand-off and cost per acquisition with more and more threads waiting on one lock.

use serde::Serialize;

use crate::bench::Bench;
use crate::locks::{mono_ns, Lib};
use crate::redis_cost::{cost_cells, CostPerAcq, COST_HEADER_PER_ACQ};
use crate::stats::{dist, handoffs, r1, DistRow};
use crate::{MS, SEC};

/// A row of the results file's `scaling`: one number of waiters.
#[derive(Serialize)]
pub struct ScalingRow {
    pub waiters: u32,
    pub threads: u32,
    pub hold_ms: f64,
    pub acquisitions: usize,
    pub overlaps: usize,
    pub rtt_us: f64,
    pub handoff: DistRow,
    pub errors: Vec<String>,
    #[serde(flatten)]
    pub cost: CostPerAcq,
}

/// Figure 5: hand-off and commands per acquisition with 1..256 threads waiting on one lock.
pub fn scaling(b: &mut Bench) {
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
            "| {n} | {acqs} | {} | {} | {} |",
            b.rtt_cells(&[h.p50, h.p99]),
            cost_cells(o.cost.as_ref()),
            o.cost
                .as_ref()
                .and_then(|c| c.bg_wakes)
                .map_or("-".into(), |w| format!("{:.2} + {:.2}", w[0], w[1])),
        ));
        out.push(ScalingRow {
            waiters: n,
            threads: n + 1,
            hold_ms: spec.hold_us as f64 / 1000.0,
            acquisitions: acqs,
            overlaps,
            rtt_us: r1(b.rtt_us),
            handoff: h.row(b.rtt_us),
            cost: CostPerAcq::of(o.cost.as_ref()),
            errors: o.errors,
        });
    }
    b.md.push(String::new());
    b.results.scaling = Some(out);
}
