//! Hand-off latency: two workers taking turns, thread → thread and process → process.

use serde::Serialize;

use crate::bench::{between_md, Bench};
use crate::locks::{mono_ns, Lib};
use crate::stats::{dist, handoffs_with_release, r1, DistRow};
use crate::workers::{cleanup, Spec};
use crate::MS;

/// A row of the results file's `handoff`: the hand-offs of one run.
#[derive(Serialize)]
pub struct HandoffRow {
    pub lock: &'static str,
    /// "threads" or "processes"
    pub between: &'static str,
    pub hold_us: u64,
    /// grants that came before the previous holder's release started (none, for a lock)
    pub overlaps: usize,
    pub rtt_us: f64,
    /// the hand-off latencies
    #[serde(flatten)]
    pub dist: DistRow,
    /// the release calls that started them
    pub release_call: DistRow,
    pub errors: Vec<String>,
}

/// Figure 3: hand-off latency, thread -> thread and process -> process (ping-pong of 2 workers).
pub fn handoff(b: &mut Bench) {
    let runs: Vec<(Lib, u32, u32)> = [
        (Lib::Fairlock, 0, 2),
        (Lib::Fairlock, 2, 1),
        (Lib::Semaphore, 0, 2),
        (Lib::Semaphore, 2, 1),
        (Lib::RwWrite, 0, 2),
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
        let (n, cap) = if lib.is_fairlock() {
            (b.sizes.handoffs, b.sizes.handoff_cap)
        } else {
            (b.sizes.peer_handoffs, b.sizes.peer_handoff_cap)
        };
        let start = mono_ns() + if procs > 0 { 800 * MS } else { 200 * MS };
        let spec = Spec {
            lib,
            url: b.url.clone(),
            lock_url: String::new(),
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
        b.md.push(format!(
            "| {} | {} | {} | {} | {:.0} |",
            lib.name(),
            between_md(procs > 0),
            d.n,
            b.rtt_cells(&[d.p50, d.p99, d.max]),
            rc.p50,
        ));
        out.push(HandoffRow {
            lock: lib.name(),
            between: if procs > 0 { "processes" } else { "threads" },
            hold_us: spec.hold_us,
            overlaps,
            rtt_us: r1(b.rtt_us),
            dist: d.row(b.rtt_us),
            release_call: rc.row(b.rtt_us),
            errors: o.errors,
        });
        cleanup(&b.url, &spec);
    }
    b.md.push(String::new());
    b.results.handoff = Some(out);
}
