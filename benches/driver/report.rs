//! The report: the results the scenarios gather (typed rows, one list per section), the
//! machine the run is on, the head of the Markdown, and the JSON results file.

use std::path::Path;

use serde::Serialize;

use crate::fifo::FifoRow;
use crate::handoff::HandoffRow;
use crate::micro::MicroRow;
use crate::scaling::ScalingRow;
use crate::scripts::ScriptsTable;
use crate::stats::{r1, Dist, DistRow};
use crate::targets::TargetRow;
use crate::throughput::ThroughputRow;
use crate::waiting::{WaitingConnRow, WaitingHandoffRow};

/// The sections of the results file, each filled by its scenario (absent when it did not run).
#[derive(Default, Serialize)]
pub struct Results {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub micro: Option<Vec<MicroRow>>,
    /// Redis's CPU time per PING of the micro loops, taken out of their figures
    #[serde(skip_serializing_if = "Option::is_none")]
    pub micro_ping_cpu_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handoff: Option<Vec<HandoffRow>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub throughput: Option<Vec<ThroughputRow>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fifo_audit: Option<Vec<FifoRow>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scaling: Option<Vec<ScalingRow>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scripts: Option<Vec<ScriptsTable>>,
    /// section "waiting": connections and memory while N threads of one process wait
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting_connections: Option<Vec<WaitingConnRow>>,
    /// section "waiting": hand-off with k waiters
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting_handoff: Option<Vec<WaitingHandoffRow>>,
    /// section "cluster": fairlock on a Redis Cluster next to one node
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<Vec<crate::cluster::ClusterRow>>,
    /// section "tls": fairlock over TLS next to plain TCP
    pub tls: Option<Vec<crate::tls::TlsRow>>,
    /// section "semaphore": cost with holders, hand-off with waiters
    #[serde(skip_serializing_if = "Option::is_none")]
    pub semaphore: Option<Vec<crate::semaphore::SemaphoreRow>>,
    /// section "peer": against node `redis-semaphore`'s barging Mutex
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer: Option<crate::peer::PeerResults>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub targets: Option<Vec<TargetRow>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub targets_cost: Option<Vec<TargetRow>>,
    /// the speed targets: fairlock against the barging peer of the same run
    #[serde(skip_serializing_if = "Option::is_none")]
    pub targets_peer: Option<Vec<TargetRow>>,
}

impl Results {
    /// The workers' errors as (section, error), the sections in the order the results file
    /// lists them.
    pub fn errors(&self) -> Vec<(&'static str, &str)> {
        fn of<'a, R>(
            section: &'static str,
            rows: &'a Option<Vec<R>>,
            errors: impl Fn(&'a R) -> &'a [String],
        ) -> impl Iterator<Item = (&'static str, &'a str)> {
            rows.iter()
                .flatten()
                .flat_map(move |r| errors(r).iter().map(move |e| (section, e.as_str())))
        }
        of("fifo_audit", &self.fifo_audit, |r| &r.errors)
            .chain(of("handoff", &self.handoff, |r| &r.errors))
            .chain(of("scaling", &self.scaling, |r| &r.errors))
            .chain(of("scripts", &self.scripts, |r| &r.errors))
            .chain(of("throughput", &self.throughput, |r| &r.errors))
            .chain(of("waiting_connections", &self.waiting_connections, |r| {
                &r.errors
            }))
            .chain(of("waiting_handoff", &self.waiting_handoff, |r| &r.errors))
            .chain(of("cluster", &self.cluster, |r| &r.errors))
            .chain(of("tls", &self.tls, |r| &r.errors))
            .chain(of("semaphore", &self.semaphore, |r| &r.errors))
            .chain(self.peer.iter().flat_map(|p| {
                let runs = p.contended.iter().chain(&p.uncontended).map(|r| &r.errors);
                let audit = p
                    .audit
                    .iter()
                    .chain(&p.floor_audit)
                    .chain(&p.list_audit)
                    .map(|r| &r.errors);
                let memory = p.memory.iter().map(|r| &r.errors);
                let per_call = p.per_call.iter().map(|r| &r.errors);
                runs.chain(audit)
                    .chain(memory)
                    .chain(per_call)
                    .flatten()
                    .map(|e| ("peer", e.as_str()))
            }))
            .collect()
    }
}

/// The machine and the Redis server a run is on.
#[derive(Serialize)]
pub struct Machine {
    pub nproc: usize,
    pub cpu: String,
    pub redis_version: String,
    pub redis_hz: String,
    pub kernel: String,
    pub loadavg_start: String,
    /// set at the end of the run
    pub loadavg_end: String,
}

pub fn machine(conn: &mut redis::Connection) -> Machine {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|m| m.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_default();
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query(conn)
        .unwrap_or_default();
    let field = |k: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(k))
            .unwrap_or("")
            .trim()
            .to_string()
    };
    Machine {
        nproc: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        cpu,
        redis_version: field("redis_version:"),
        redis_hz: field("hz:"),
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_string(),
        loadavg_start: loadavg(),
        loadavg_end: String::new(),
    }
}

pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The PING round trip over the whole run, and at its start and end.
pub struct Pings {
    pub start: Dist,
    pub end: Dist,
    pub all: Dist,
}

/// The head of the Markdown report: the machine and the PING round trip.
pub fn head(machine: &Machine, ping: &Pings) -> String {
    let ping_md = format!(
        "PING round trip (RTT), loopback, one client: p50 {:.0} µs over the run (start {:.0}, end {:.0}), p99 {:.0} µs. It moves with the host's load, so each row is divided by the RTT measured with it (column RTT: PINGs interleaved with the single-thread loops, or bursts right before and after a multi-worker run).",
        ping.all.p50, ping.start.p50, ping.end.p50, ping.all.p99
    );
    format!(
        "Machine: {} CPUs, {}, Redis {} on loopback, load average {} → {}.\n\n{ping_md}\n",
        machine.nproc,
        machine.cpu,
        machine.redis_version,
        machine.loadavg_start,
        machine.loadavg_end,
    )
}

impl Pings {
    /// As the results file gives them, divided by `rtt_us`.
    pub fn row(&self, rtt_us: f64) -> PingRow {
        PingRow {
            rtt_us: r1(rtt_us),
            start: self.start.row(rtt_us),
            end: self.end.row(rtt_us),
            all: self.all.row(rtt_us),
        }
    }
}

#[derive(Serialize)]
pub struct PingRow {
    /// the RTT of the last figures, which the distributions are divided by
    rtt_us: f64,
    start: DistRow,
    end: DistRow,
    all: DistRow,
}

/// The results file: the run, then the sections.
#[derive(Serialize)]
pub struct ResultsFile<'a> {
    pub machine: &'a Machine,
    pub quick: bool,
    pub ping: PingRow,
    pub seconds: f64,
    #[serde(flatten)]
    pub results: &'a Results,
}

impl ResultsFile<'_> {
    /// Write it at `path`, the keys in alphabetical order at every level (a `serde_json::Value`
    /// sorts its maps).
    pub fn write(&self, path: &Path) {
        let value = serde_json::to_value(self).expect("results as JSON");
        let text = serde_json::to_string_pretty(&value).expect("json");
        if let Some(dir) = path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        std::fs::write(path, text + "\n")
            .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    }
}
