//! The targets, checked against this run's figures, and the workers' errors.

use serde_json::{json, Value as Json};

use crate::bench::Bench;

/// A table of targets: (target, goal, this run, met).
#[derive(Default)]
struct Targets {
    rows: Vec<(String, String, String, Option<bool>)>,
}

impl Targets {
    /// A target whose figure `value` is shown with `fmt` and met when `ok` (goal "-": only shown).
    fn add(
        &mut self,
        name: &str,
        goal: &str,
        value: Option<f64>,
        fmt: &dyn Fn(f64) -> String,
        ok: &dyn Fn(f64) -> bool,
    ) {
        self.rows.push((
            name.to_string(),
            goal.to_string(),
            value.map_or("not measured".into(), fmt),
            value.map(ok).filter(|_| goal != "-"),
        ));
    }

    /// The Markdown table under `title`, and the JSON array under `key`.
    fn report(self, b: &mut Bench, title: &str, key: &str) {
        b.md.push(format!("### {title}\n"));
        b.md.push("| target | goal | this run | met |".into());
        b.md.push("|---|---|---:|---|".into());
        let mut out = vec![];
        for (name, goal, value, ok) in self.rows {
            let met = match ok {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "-",
            };
            b.md.push(format!("| {name} | {goal} | {value} | {met} |"));
            out.push(json!({"target": name, "goal": goal, "value": value, "met": ok}));
        }
        b.md.push(String::new());
        b.json.insert(key.into(), Json::Array(out));
    }
}

/// Field `key` of the micro row of `figure` and `lock`.
fn micro_figure(j: &Json, figure: &str, lock: &str, key: &str) -> Option<f64> {
    j["micro"].as_array().and_then(|a| {
        a.iter()
            .find(|r| r["figure"] == figure && r["lock"] == lock)
            .and_then(|r| r[key].as_f64())
    })
}

/// The throughput row of `lock` with `procs` processes and a hold of `hold_ms`.
fn throughput_of(j: &Json, lock: &str, procs: u64, hold_ms: f64) -> Option<Json> {
    j["throughput"].as_array().and_then(|a| {
        a.iter()
            .find(|r| r["lock"] == lock && r["processes"] == procs && r["hold_ms"] == hold_ms)
            .cloned()
    })
}

fn x2(v: f64) -> String {
    format!("{v:.2}")
}

/// The targets, checked against this run; then the workers' errors.
pub fn targets(b: &mut Bench) {
    let j = Json::Object(b.json.clone());
    targets_latency(&j).report(b, "Targets: latency, fairness and throughput", "targets");
    targets_cost(&j).report(b, "Targets: what a lock costs Redis", "targets_cost");
    worker_errors(b, &j);
}

/// Latency, fairness and throughput.
fn targets_latency(j: &Json) -> Targets {
    let micro = |fig: &str, lock: &str, key: &str| micro_figure(j, fig, lock, key);
    let hand = |lock: &str, between: &str, key: &str| {
        j["handoff"].as_array().and_then(|a| {
            a.iter()
                .find(|r| r["lock"] == lock && r["between"] == between)
                .and_then(|r| r[key].as_f64())
        })
    };
    let tp = |lock: &str, procs: u64, hold: f64| throughput_of(j, lock, procs, hold);
    let mut t = Targets::default();
    let x = x2;
    t.add(
        "uncontended acquire + release p50 / RTT",
        "≤ 2.5",
        micro("uncontended acquire + release", "fairlock", "p50_rtt"),
        &x,
        &|v| v <= 2.5,
    );
    t.add(
        "re-entrant acquire p50 / RTT",
        "≤ 1.2",
        micro("re-entrant acquire", "fairlock", "p50_rtt"),
        &x,
        &|v| v <= 1.2,
    );
    for between in ["threads", "processes"] {
        t.add(
            &format!("hand-off p50 / RTT ({between})"),
            "≤ 3",
            hand("fairlock", between, "p50_rtt"),
            &x,
            &|v| v <= 3.0,
        );
        t.add(
            &format!("hand-off p99 / RTT ({between})"),
            "≤ 10",
            hand("fairlock", between, "p99_rtt"),
            &x,
            &|v| v <= 10.0,
        );
    }
    let pp = hand("fairlock", "processes", "p50_us").zip(hand("fairlock", "threads", "p50_us"));
    t.add(
        "hand-off p50 processes / threads",
        "≈ 1 (≤ 1.25)",
        pp.map(|(p, t)| p / t),
        &x,
        &|v| v <= 1.25,
    );
    for hold in [0.0, 1.0] {
        let (f, r) = (tp("fairlock", 8, hold), tp("redlock", 8, hold));
        let ratio = f.as_ref().zip(r.as_ref()).and_then(|(f, r)| {
            Some(f["acq_per_s"].as_f64()? / r["acq_per_s"].as_f64()?.max(0.001))
        });
        t.add(
            &format!("8 procs hold {hold} ms: acq/s fairlock / redlock"),
            "≥ 1.5",
            ratio,
            &x,
            &|v| v >= 1.5,
        );
        let g = |k: &str| f.as_ref().and_then(|f| f[k].as_f64());
        // FIFO is judged on the exact orders of the audit; the client clocks of the throughput
        // run blur requests a few µs apart (a thread preempted between its timestamp and its
        // write), which the audit shows for what it is
        let audited = j["fifo_audit"].as_array().and_then(|a| {
            a.iter()
                .find(|r| r["processes"] == 8 && r["hold_ms"] == hold)
                .and_then(|r| r["overtakes_server_order"].as_f64())
        });
        t.add(
            &format!("8 procs hold {hold} ms: overtakes (FIFO audit, server order)"),
            "0",
            audited,
            &|v| format!("{v:.0}"),
            &|v| v == 0.0,
        );
        t.add(
            &format!("8 procs hold {hold} ms: overtakes by client clocks (informative)"),
            "-",
            g("overtake_pct"),
            &|v| format!("{v:.2} %"),
            &|_| true,
        );
        t.add(
            &format!("8 procs hold {hold} ms: Jain's index"),
            "≥ 0.99",
            g("jain"),
            &|v| format!("{v:.4}"),
            &|v| v >= 0.99,
        );
        t.add(
            &format!("8 procs hold {hold} ms: max wait / median wait"),
            "≤ 10",
            g("max_over_median_wait"),
            &x,
            &|v| v <= 10.0,
        );
    }
    let audit: Option<f64> = j["fifo_audit"].as_array().map(|a| {
        a.iter()
            .filter_map(|r| r["overtakes_server_order"].as_f64())
            .sum()
    });
    t.add(
        "FIFO audit: overtakes in server arrival order, all audited runs",
        "0",
        audit,
        &|v| format!("{v:.0}"),
        &|v| v == 0.0,
    );
    let mut max_rt: Option<f64> = None;
    for key in ["throughput", "scaling"] {
        for r in j[key].as_array().into_iter().flatten() {
            if key == "throughput" && r["lock"] != "fairlock" {
                continue;
            }
            if let Some(v) = r["round_trips_per_acq"].as_f64() {
                max_rt = Some(max_rt.map_or(v, |m: f64| m.max(v)));
            }
        }
    }
    t.add(
        "lock commands (round trips) per acquisition, worst run",
        "≤ 4",
        max_rt,
        &x,
        &|v| v <= 4.0,
    );
    let scale = |n: u64| {
        j["scaling"].as_array().and_then(|a| {
            a.iter()
                .find(|r| r["waiters"] == n)
                .and_then(|r| r["handoff"]["p50_us"].as_f64())
        })
    };
    let base = scale(2).or_else(|| hand("fairlock", "threads", "p50_us"));
    t.add(
        "256 waiters: hand-off p50 / 2-waiter p50",
        "≤ 1.5",
        scale(256).zip(base).map(|(a, b)| a / b),
        &x,
        &|v| v <= 1.5,
    );

    t
}

/// What one lock costs Redis, in calls and CPU, against the naive lock.
fn targets_cost(j: &Json) -> Targets {
    let mut t = Targets::default();
    let micro = |lock: &str, key: &str| micro_figure(j, "uncontended acquire + release", lock, key);
    let contended = |lock: &str| {
        throughput_of(j, lock, 8, 0.0).and_then(|r| r["redis_cpu_us_per_acq"].as_f64())
    };
    let ratio = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a / b.max(0.001));
    t.add(
        "Redis calls per uncontended acquire + release (EVALSHAs included)",
        "≤ 12",
        micro("fairlock", "redis_cmds"),
        &x2,
        &|v| v <= 12.0,
    );
    t.add(
        "Redis calls per contended acquisition (8 procs, hold 0)",
        "≤ 16",
        throughput_of(j, "fairlock", 8, 0.0).and_then(|r| r["redis_cmds_per_acq"].as_f64()),
        &x2,
        &|v| v <= 16.0,
    );
    t.add(
        "Redis CPU per uncontended acquire + release, fairlock / naive",
        "≤ 1.15",
        ratio(
            micro("fairlock", "redis_cpu_us"),
            micro("naive", "redis_cpu_us"),
        ),
        &x2,
        &|v| v <= 1.15,
    );
    t.add(
        "Redis CPU per contended acquisition (8 procs, hold 0), fairlock / naive",
        "≤ 1.3",
        ratio(contended("fairlock"), contended("naive")),
        &x2,
        &|v| v <= 1.3,
    );
    t.add(
        "uncontended acquire + release p50 / RTT",
        "≤ 2.6",
        micro("fairlock", "p50_rtt"),
        &x2,
        &|v| v <= 2.6,
    );
    t.add(
        "re-entrant acquire p50 / RTT",
        "≤ 1.2",
        micro_figure(j, "re-entrant acquire", "fairlock", "p50_rtt"),
        &x2,
        &|v| v <= 1.2,
    );
    t
}

/// The workers' errors of every section, listed under the targets.
fn worker_errors(b: &mut Bench, j: &Json) {
    let mut errors = vec![];
    for (section, v) in j.as_object().into_iter().flatten() {
        for r in v.as_array().into_iter().flatten() {
            for e in r["errors"].as_array().into_iter().flatten() {
                errors.push(format!("- {section}: {}", e.as_str().unwrap_or("?")));
            }
        }
    }
    if !errors.is_empty() {
        b.md.push(format!(
            "**{} worker errors** (see the JSON):\n",
            errors.len()
        ));
        b.md.extend(errors.into_iter().take(20));
        b.md.push(String::new());
    }
}
