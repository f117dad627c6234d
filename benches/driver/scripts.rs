//! Redis calls per acquisition by script, fairlock under `MONITOR`.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::bench::{connect, Bench};
use crate::locks::{mono_ns, Lib};
use crate::monitor::{lock_traffic, Monitor, Seen};
use crate::stats::{r2, r4};
use crate::workers::run;
use crate::{MS, SEC};

/// An entry of the results file's `scripts`: the calls of one scenario.
#[derive(Serialize)]
pub struct ScriptsTable {
    pub scenario: &'static str,
    pub acquisitions: u64,
    pub calls_per_acq: f64,
    pub calls: Vec<CallRow>,
    pub errors: Vec<String>,
}

/// One client command of a scenario, per acquisition.
#[derive(Serialize)]
pub struct CallRow {
    pub call: String,
    pub runs_per_acq: f64,
    /// scripts only
    pub calls_inside_per_run: Option<f64>,
    pub calls_per_acq: f64,
    /// the commands its script ran
    pub inside_per_acq: BTreeMap<String, f64>,
}

/// One client command's share of a lock's traffic: how often it ran and what it ran inside.
struct CallTally {
    call: String,
    runs: u64,
    /// inner command -> count, in the order first seen
    inner: Vec<(String, u64)>,
}

/// Tally the traffic per client command, in the order first seen.
fn tally(seen: &[Seen]) -> Vec<CallTally> {
    let mut out: Vec<CallTally> = vec![];
    let mut current: Option<usize> = None;
    for s in seen {
        match s {
            Seen::Client(call) => {
                let i = match out.iter().position(|t| &t.call == call) {
                    Some(i) => i,
                    None => {
                        out.push(CallTally {
                            call: call.clone(),
                            runs: 0,
                            inner: vec![],
                        });
                        out.len() - 1
                    }
                };
                out[i].runs += 1;
                current = Some(i);
            }
            Seen::Inner(cmd) => {
                let Some(i) = current else { continue };
                let inner = &mut out[i].inner;
                match inner.iter_mut().find(|(c, _)| c == cmd) {
                    Some((_, n)) => *n += 1,
                    None => inner.push((cmd.clone(), 1)),
                }
            }
        }
    }
    out
}

/// A count per acquisition with two decimals, "<0.01" for a command that ran but rarely.
fn rare_aware(v: f64) -> String {
    if v > 0.0 && v < 0.005 {
        "<0.01".into()
    } else {
        format!("{v:.2}")
    }
}

/// The per-script table of one scenario, and its entry in the results file.
fn calls_table(
    b: &mut Bench,
    scenario: &'static str,
    acquisitions: u64,
    seen: &[Seen],
    errors: Vec<String>,
) -> ScriptsTable {
    let a = acquisitions.max(1) as f64;
    b.md.push(format!(
        "#### {scenario}: {acquisitions} acquisitions, {} commands seen\n",
        seen.len()
    ));
    b.md.push("| call | runs / acq | Redis calls inside / run | calls / acq (the call and inside) | inside, per acq |".into());
    b.md.push("|---|---:|---:|---:|---|".into());
    let mut rows = vec![];
    for t in tally(seen) {
        let inside: u64 = t.inner.iter().map(|(_, n)| n).sum();
        let script = t.call.starts_with("EVAL");
        let per_run = script.then(|| inside as f64 / t.runs as f64);
        let by_name: Vec<String> = t
            .inner
            .iter()
            .map(|(c, n)| format!("{c} {}", rare_aware(*n as f64 / a)))
            .collect();
        b.md.push(format!(
            "| {} | {} | {} | {} | {} |",
            t.call,
            rare_aware(t.runs as f64 / a),
            per_run.map_or("-".into(), |v| format!("{v:.1}")),
            rare_aware((t.runs + inside) as f64 / a),
            if by_name.is_empty() {
                "-".into()
            } else {
                by_name.join(", ")
            },
        ));
        rows.push(CallRow {
            runs_per_acq: r4(t.runs as f64 / a),
            calls_inside_per_run: per_run.map(r2),
            calls_per_acq: r4((t.runs + inside) as f64 / a),
            inside_per_acq: t
                .inner
                .iter()
                .map(|(c, n)| (c.clone(), r4(*n as f64 / a)))
                .collect(),
            call: t.call,
        });
    }
    let total = seen.len() as f64 / a;
    b.md.push(format!(
        "| **calls per acquisition (FCALL and BLPOP included)** | | | **{total:.2}** | |"
    ));
    b.md.push(String::new());
    ScriptsTable {
        scenario,
        acquisitions,
        calls_per_acq: r2(total),
        calls: rows,
        errors,
    }
}

/// Run `body` on a fresh lock under MONITOR; `body` gets the lock's name and returns the
/// acquisitions it made and its errors. Adds the scenario's table.
fn scripts_scenario(
    b: &mut Bench,
    what: &str,
    scenario: &'static str,
    body: impl FnOnce(&str) -> (u64, Vec<String>),
) -> ScriptsTable {
    let name = b.name(what);
    let monitor = Monitor::start(&b.url, lock_traffic(&name));
    let (acquisitions, errors) = body(&name);
    let seen = monitor.finish();
    calls_table(b, scenario, acquisitions, &seen, errors)
}

/// Redis calls per acquisition, per script: fairlock under `MONITOR`, which shows every command
/// a script runs. Uncontended pairs, re-entrant pairs under an outer guard, 4 threads contending.
pub fn scripts(b: &mut Bench) {
    b.md.push("### Redis calls per acquisition by script, fairlock (under MONITOR, which slows Redis: counts, not speed)\n".into());
    let n = b.sizes.scripts_n;
    // load the function library (and every script) before watching, so no "Function not
    // found" or NOSCRIPT reply and retry is counted
    let mut conn = connect(&b.url);
    fairlock::raw::load_library(&mut conn).expect("FUNCTION LOAD");
    for script in fairlock::raw::scripts() {
        script.load(&mut conn).expect("SCRIPT LOAD");
    }
    let client = fairlock::LockClient::connect(&b.url).expect("fairlock client");
    let pairs = |name: &str| {
        let lock = client.fair_lock(name).expect("lock handle");
        for _ in 0..n {
            lock.lock().expect("lock").unlock().expect("unlock");
        }
        (n as u64, vec![])
    };
    let mut out = vec![scripts_scenario(
        b,
        "scripts-uncontended",
        "uncontended acquire + release (one thread)",
        pairs,
    )];

    let reentrant_lock = client
        .fair_lock(&b.name("scripts-reentrant"))
        .expect("lock handle");
    let outer = reentrant_lock.lock().expect("lock");
    out.push(scripts_scenario(
        b,
        "scripts-reentrant",
        "re-entrant acquire + release (an outer guard held)",
        |_| {
            for _ in 0..n {
                reentrant_lock
                    .lock()
                    .expect("lock")
                    .unlock()
                    .expect("unlock");
            }
            (n as u64, vec![])
        },
    ));
    outer.unlock().expect("unlock");

    let start = mono_ns() + 200 * MS;
    let dur = (b.sizes.scripts_secs * SEC as f64) as u64;
    let spec = b.timed_spec(Lib::Fairlock, "scripts-contended", false, 0, start, dur);
    out.push(scripts_scenario(
        b,
        "scripts-contended",
        "contended: 4 threads of one process, hold 0",
        |_| {
            let o = run(&spec, 0, 4, None, false);
            let grants = o.recs.iter().filter(|r| r.got > 0).count() as u64;
            (grants, o.errors)
        },
    ));
    b.results.scripts = Some(out);
}
