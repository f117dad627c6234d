//! FIFO audit: the order in which Redis ran the acquire calls (`MONITOR`) against the order of
//! the grants.

use std::collections::HashMap;

use serde::Serialize;

use crate::bench::Bench;
use crate::locks::{mono_ns, Lib};
use crate::stats::overtakes;
use crate::workers::{cleanup, run, Outcome, Rec};
use crate::{MS, SEC};

/// A row of the results file's `fifo_audit`: one audited run.
#[derive(Serialize)]
pub struct FifoRow {
    pub processes: u32,
    pub threads_per_process: u32,
    pub hold_ms: f64,
    pub grants: usize,
    pub audited: usize,
    pub overtakes_server_order: usize,
    pub overtakes_client_clock: usize,
    pub workers_not_paired: usize,
    pub errors: Vec<String>,
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

/// FIFO audit: the contended scenario again, fairlock only, under `MONITOR`, which gives the
/// exact order in which Redis ran the acquire calls. MONITOR slows Redis down: these runs are
/// for order, not speed. The clock-based overtakes of the same run are shown beside it.
pub fn fifo(b: &mut Bench) {
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
            let row = audited_run(b, &format!("fifo{i}-{hold}"), procs, threads, hold, dur);
            let layout = if procs > 0 {
                format!("{procs} procs × {threads}")
            } else {
                format!("{threads} threads")
            };
            b.md.push(format!(
                "| {layout} | {} ms | {} | {} | {} | {} |",
                row.hold_ms,
                row.audited,
                row.overtakes_server_order,
                row.overtakes_client_clock,
                row.workers_not_paired
            ));
            out.push(row);
        }
    }
    b.md.push(String::new());
    b.results.fifo_audit = Some(out);
}

/// One audited run of fairlock's contended loop: `procs` processes of `threads` workers (0
/// processes: threads of this one), hold `hold` µs, for `dur` ns, under `MONITOR`.
pub fn audited_run(
    b: &mut Bench,
    what: &str,
    procs: u32,
    threads: u32,
    hold: u64,
    dur: u64,
) -> FifoRow {
    audited_run_of(b, Lib::Fairlock, what, procs, threads, hold, dur)
}

/// `audited_run` of `lib` (fairlock, or the fair floor).
pub fn audited_run_of(
    b: &mut Bench,
    lib: Lib,
    what: &str,
    procs: u32,
    threads: u32,
    hold: u64,
    dur: u64,
) -> FifoRow {
    let start = mono_ns() + if procs > 0 { 800 * MS } else { 200 * MS };
    let spec = b.timed_spec(lib, what, true, hold, start, dur);
    let o = run(&spec, procs, threads, None, true);
    let (audited, over, unmatched) = fifo_audit(&o);
    cleanup(&b.url, &spec);
    FifoRow {
        processes: procs,
        threads_per_process: threads,
        hold_ms: hold as f64 / 1000.0,
        grants: o.recs.iter().filter(|r| r.got > 0).count(),
        audited,
        overtakes_server_order: over,
        overtakes_client_clock: overtakes(&o.recs),
        workers_not_paired: unmatched,
        errors: o.errors,
    }
}
