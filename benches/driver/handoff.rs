//! Hand-off latency: two workers taking turns, thread → thread and process → process.

use serde_json::{json, Value as Json};

use crate::bench::Bench;
use crate::locks::{mono_ns, Lib};
use crate::stats::{dist, handoffs_with_release, r1};
use crate::workers::{cleanup, Spec};
use crate::MS;

/// Figure 3: hand-off latency, thread -> thread and process -> process (ping-pong of 2 workers).
pub fn handoff(b: &mut Bench) {
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
