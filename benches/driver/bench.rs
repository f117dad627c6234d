//! The state the scenarios share: the Redis URL, the last measured RTT, the sizes, and the
//! tables and results gathered so far; the PING and connection helpers.

use serde::Deserialize;

use crate::locks::{mono_ns, Lib};
use crate::report::Results;
use crate::sizes::Sizes;
use crate::stats::dist;
use crate::workers::{run_layout, Layout, Outcome, Spec};

/// A connection to the benchmark's Redis; panics when there is none.
pub fn connect(url: &str) -> redis::Connection {
    redis::Client::open(url)
        .and_then(|c| c.get_connection())
        .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"))
}

/// The run in progress, handed to each scenario in turn.
pub struct Bench {
    pub url: String,
    /// a connection for the PING bursts around each run
    pub ping: redis::Connection,
    pub sizes: Sizes,
    /// makes this run's key names unique: process id and clock
    pub run_id: String,
    /// the PING p50 last measured, in µs, which the multi-worker figures are divided by
    pub rtt_us: f64,
    /// the sections of the results file
    pub results: Results,
    /// the Markdown report, line by line
    pub md: Vec<String>,
    /// criterion's output directory (`--criterion`)
    pub criterion: Option<std::path::PathBuf>,
}

impl Bench {
    /// The name of this run's lock or key `what`.
    pub fn name(&self, what: &str) -> String {
        format!("bench-{}-{what}", self.run_id)
    }

    /// A free loop on the lock `what` from `start` for `dur` ns; with `counter`, each hold does
    /// GET/SET on `<what>:counter` (else the fencing token numbers the grants).
    pub fn timed_spec(
        &self,
        lib: Lib,
        what: &str,
        counter: bool,
        hold_us: u64,
        start: u64,
        dur: u64,
    ) -> Spec {
        Spec {
            lib,
            url: self.url.clone(),
            lock_url: String::new(),
            name: self.name(what),
            counter: if counter {
                self.name(&format!("{what}:counter"))
            } else {
                String::new()
            },
            signal: String::new(),
            hold_us,
            start_ns: start,
            stop_ns: start + dur,
            give_up_ns: start + dur + self.sizes.grace,
            max_seq: 0,
        }
    }

    /// `us` divided by the RTT, as the tables show it.
    pub fn ratio(&self, us: f64) -> String {
        format!("{:.2}", us / self.rtt_us)
    }

    /// Table cells for the figures `us` (µs): each figure and the RTT to 1 µs, then each figure
    /// divided by the RTT (`p50 | p99 | RTT | p50 / RTT | p99 / RTT`).
    pub fn rtt_cells(&self, us: &[f64]) -> String {
        let mut cells: Vec<String> = us.iter().map(|v| format!("{v:.0}")).collect();
        cells.push(format!("{:.0}", self.rtt_us));
        cells.extend(us.iter().map(|&v| self.ratio(v)));
        cells.join(" | ")
    }

    /// `run`, between two bursts of PINGs that set the RTT this run's figures are divided by:
    /// the loopback round trip of this VM moves (20-100 µs) with what else the host runs.
    pub fn run_timed(
        &mut self,
        spec: &Spec,
        procs: u32,
        threads: u32,
        window: Option<(u64, u64)>,
    ) -> Outcome {
        self.run_timed_layout(spec, &Layout::of(procs, threads), window)
    }

    /// `run_timed` with the workers laid out as `layout` says.
    pub fn run_timed_layout(
        &mut self,
        spec: &Spec,
        layout: &Layout,
        window: Option<(u64, u64)>,
    ) -> Outcome {
        let mut pings = ping_samples(&mut self.ping, 200);
        let o = run_layout(spec, layout, window, false);
        pings.extend(ping_samples(&mut self.ping, 200));
        self.rtt_us = dist(pings).p50;
        o
    }

    /// The median of criterion's benchmark `micro/<id>` in µs, when `--criterion` was given and
    /// criterion has run it.
    pub fn criterion_median_us(&self, id: &str) -> Option<f64> {
        let path = self
            .criterion
            .as_ref()?
            .join(format!("micro/{id}/new/estimates.json"));
        let text = std::fs::read_to_string(path).ok()?;
        let v: Estimates = serde_json::from_str(&text).ok()?;
        Some(v.median.point_estimate / 1000.0)
    }
}

/// The part of criterion's `estimates.json` read here.
#[derive(Deserialize)]
struct Estimates {
    median: Estimate,
}

#[derive(Deserialize)]
struct Estimate {
    point_estimate: f64,
}

/// What a hand-off goes between, as the tables show it.
pub fn between_md(procs: bool) -> &'static str {
    if procs {
        "process → process"
    } else {
        "thread → thread"
    }
}

/// How long `f` took, ns.
pub fn time_ns(mut f: impl FnMut()) -> u64 {
    let t = mono_ns();
    f();
    mono_ns() - t
}

/// `n` PING round trips, ns each.
pub fn ping_samples(conn: &mut redis::Connection, n: usize) -> Vec<u64> {
    (0..n)
        .map(|_| {
            time_ns(|| {
                redis::cmd("PING").query::<String>(conn).expect("PING");
            })
        })
        .collect()
}
