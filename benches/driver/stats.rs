//! The figures taken from the workers' records: percentiles and distributions, Jain's fairness
//! index, hand-off latencies and overtakes (defined in the driver's docs, `main.rs`).

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::workers::Rec;

/// Nearest-rank percentile of sorted values.
fn pct(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// A distribution of samples, in µs.
#[derive(Clone, Copy, Default)]
pub struct Dist {
    pub n: usize,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
    pub mean: f64,
}

/// Distribution of nanosecond samples, in microseconds.
pub fn dist(mut ns: Vec<u64>) -> Dist {
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

/// A distribution as the results file gives it: µs to 0.1, and divided by the RTT to 0.01.
#[derive(Clone, Copy, Serialize)]
pub struct DistRow {
    pub n: usize,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    pub mean_us: f64,
    pub p50_rtt: f64,
    pub p99_rtt: f64,
    pub max_rtt: f64,
}

impl Dist {
    pub fn row(&self, rtt: f64) -> DistRow {
        DistRow {
            n: self.n,
            p50_us: r1(self.p50),
            p99_us: r1(self.p99),
            max_us: r1(self.max),
            mean_us: r1(self.mean),
            p50_rtt: r2(self.p50 / rtt),
            p99_rtt: r2(self.p99 / rtt),
            max_rtt: r2(self.max / rtt),
        }
    }
}

pub fn r1(v: f64) -> f64 {
    (v * 10.0).round() / 10.0
}

pub fn r2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

pub fn r4(v: f64) -> f64 {
    (v * 10000.0).round() / 10000.0
}

/// Jain's fairness index of per-worker counts: 1 = all equal, 1/n = one worker got everything.
pub fn jain(counts: &[u64]) -> f64 {
    let sum: f64 = counts.iter().map(|&c| c as f64).sum();
    let sq: f64 = counts.iter().map(|&c| (c as f64) * (c as f64)).sum();
    if sq == 0.0 {
        0.0
    } else {
        sum * sum / (counts.len() as f64 * sq)
    }
}

/// Hand-off latencies (ns) between consecutive grants, and mutual-exclusion violations seen.
pub fn handoffs(recs: &[Rec]) -> (Vec<u64>, usize) {
    let (lat, _, overlaps) = handoffs_with_release(recs);
    (lat, overlaps)
}

/// Hand-off latencies, the durations of the release calls that started them (ns), overlaps.
pub fn handoffs_with_release(recs: &[Rec]) -> (Vec<u64>, Vec<u64>, usize) {
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
pub fn overtakes(recs: &[Rec]) -> usize {
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
