//! The machine a run is on, for the head of the report and the results file.

use serde_json::{json, Value as Json};

pub fn machine(conn: &mut redis::Connection) -> Json {
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
    json!({
        "nproc": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "cpu": cpu,
        "redis_version": field("redis_version:"),
        "redis_hz": field("hz:"),
        "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
        "loadavg_start": loadavg(),
    })
}

pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}
