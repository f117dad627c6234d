//! Section "tls": fairlock over TLS next to plain TCP, in the same run: the same hand-offs and
//! contended throughput as section "cluster", with the lock on a TLS-only redis-server (which
//! `scripts/bench.sh` starts with certificates it makes, passing its URL in
//! `FAIRLOCK_BENCH_TLS` and its CA in `FAIRLOCK_BENCH_TLS_CA`) and on the plain one; without
//! them the section is skipped.

use serde::Serialize;

use crate::bench::Bench;
use crate::cluster::{md_line, one_node_versus};
use crate::stats::{r1, r2};

/// A row of the results file's `tls`: one scenario over plain TCP and over TLS.
#[derive(Serialize)]
pub struct TlsRow {
    pub scenario: String,
    /// "hand-off p50 µs" or "acq/s"
    pub unit: &'static str,
    pub plain: f64,
    pub tls: f64,
    /// tls / plain (for hand-off, above 1 is slower; for acq/s, below 1 is slower)
    pub ratio: f64,
    pub rtt_us: f64,
    pub errors: Vec<String>,
}

pub fn tls(b: &mut Bench) {
    let Ok(tls_url) = std::env::var("FAIRLOCK_BENCH_TLS") else {
        eprintln!("driver: tls: FAIRLOCK_BENCH_TLS is not set (scripts/bench.sh sets it); skipped");
        return;
    };
    b.md.push("### Over TLS and over plain TCP (one node each), same run\n".into());
    b.md.push("| scenario | plain | TLS | TLS / plain | RTT µs |".into());
    b.md.push("|---|---:|---:|---:|---:|".into());
    let mut out = vec![];
    for v in one_node_versus(b, &tls_url, "tls") {
        let ratio = md_line(b, &v);
        out.push(TlsRow {
            scenario: v.scenario,
            unit: v.unit,
            plain: r1(v.values[0]),
            tls: r1(v.values[1]),
            ratio: r2(ratio),
            rtt_us: r1(b.rtt_us),
            errors: v.errors,
        });
    }
    b.md.push(String::new());
    b.results.tls = Some(out);
}
