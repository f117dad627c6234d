//! Uncontended and re-entrant cost, one thread, each iteration next to a PING.

use std::collections::BTreeMap;
use std::time::Duration;

use fairlock::raw::{Acquire, Mode, RawLock, Runner, Settings};

use serde::Serialize;

use crate::bench::{connect, time_ns, Bench};
use crate::locks::{mono_ns, Lib, Locker};
use crate::redis_cost::{background_switches, cost, cost_cells, snapshot, Cost, COST_HEADER};
use crate::stats::{dist, r1, r2, Dist, DistRow};

/// A row of the results file's `micro`: one figure of one lock.
#[derive(Serialize)]
pub struct MicroRow {
    pub figure: &'static str,
    pub lock: &'static str,
    pub rtt_us: f64,
    #[serde(flatten)]
    pub dist: DistRow,
    /// the figure's criterion benchmark, when it has one and criterion's results were found
    #[serde(flatten)]
    pub criterion: Option<CriterionMedian>,
    /// Redis's cost per op, on the rows of a whole acquire + release
    #[serde(flatten)]
    pub cost: Option<MicroCost>,
}

/// The median of a criterion benchmark, next to criterion's PING.
#[derive(Serialize)]
pub struct CriterionMedian {
    pub criterion_median_us: f64,
    pub criterion_ping_us: f64,
    pub criterion_median_rtt: f64,
}

/// What one op cost Redis, less the PING of its iteration.
#[derive(Serialize)]
pub struct MicroCost {
    pub round_trips: f64,
    pub redis_cmds: f64,
    pub server_us: f64,
    pub redis_cpu_us: f64,
    pub cmds_by_command: BTreeMap<String, f64>,
    /// fairlock only
    #[serde(skip_serializing_if = "Option::is_none")]
    pub watchdog_janitor_switches: Option<[f64; 2]>,
}

/// Figures 1 and 2: uncontended and re-entrant cost, for fairlock and the peers. Each iteration
/// sends one PING first, so every row has the round trip of the very same moments.
pub fn micro(b: &mut Bench) {
    let mut conn = connect(&b.url);
    let mut ping_conn = connect(&b.url);
    let n = b.sizes.micro;
    struct Row {
        figure: &'static str,
        lock: &'static str,
        d: Dist,
        rtt: f64,
        criterion: &'static str,
        cost: Option<Cost>,
    }
    let mut rows: Vec<Row> = vec![];

    // Run `op` n times, each after a timed PING; `op` returns the moment between its two halves
    // (acquire | release). Returns the whole, the halves, Redis's cost per op and the RTT. The
    // PINGs are taken out of the cost: one call each from the counts, and `ping_cpu` µs each
    // from Redis's CPU time.
    let mut measure = |n: usize, scripted_set: bool, ping_cpu: f64, op: &mut dyn FnMut() -> u64| {
        let before = snapshot(&mut conn);
        let bg = background_switches();
        let (mut both, mut first, mut second, mut pings) = (vec![], vec![], vec![], vec![]);
        for _ in 0..n {
            pings.push(time_ns(|| {
                redis::cmd("PING")
                    .query::<String>(&mut ping_conn)
                    .expect("PING");
            }));
            let t0 = mono_ns();
            let mid = op();
            let t2 = mono_ns();
            both.push(t2 - t0);
            first.push(mid.saturating_sub(t0));
            second.push(t2.saturating_sub(mid));
        }
        let bg1 = background_switches();
        let wakes = [0, 1].map(|i| r2((bg1[i] - bg[i]) as f64 / n as f64));
        let after = snapshot(&mut conn);
        let c = cost(&before, &after, n as u64, false, scripted_set, false).map(|mut c| {
            c.bg_wakes = Some(wakes);
            c.round_trips = r2(c.round_trips - 1.0); // the PING of each iteration
            c.all = r2(c.all - 1.0);
            c.redis_cpu_us = r1(c.redis_cpu_us - ping_cpu);
            c.by_command.remove("ping");
            c
        });
        (dist(both), dist(first), dist(second), c, dist(pings).p50)
    };

    // Redis's CPU time per PING: the same loop with nothing between the PINGs. It also carries
    // the server's idle work (its cron) over the loop's time, which the rows below have too,
    // over iterations a few times longer: their figure keeps a small share of that idle work.
    let (_, _, _, ping_cost, _) = measure(n, false, 0.0, &mut mono_ns);
    let ping_cpu = ping_cost.map_or(0.0, |c| c.redis_cpu_us);

    let trivial = redis::Script::new("return 1");
    let mut c2 = connect(&b.url);
    trivial
        .prepare_invoke()
        .invoke::<i64>(&mut c2)
        .expect("EVALSHA");
    let (d, _, _, cost, rtt) = measure(n, false, ping_cpu, &mut || {
        trivial
            .prepare_invoke()
            .invoke::<i64>(&mut c2)
            .expect("EVALSHA");
        0
    });
    rows.push(Row {
        figure: "EVALSHA `return 1` (script floor)",
        lock: "-",
        d,
        rtt,
        criterion: "evalsha_return1",
        cost,
    });

    let client = fairlock::LockClient::connect(&b.url).expect("fairlock client");
    for reentrant in [false, true] {
        let lock = client
            .fair_lock(&b.name(if reentrant {
                "reentrant"
            } else {
                "uncontended"
            }))
            .unwrap();
        let outer = reentrant.then(|| lock.lock().expect("lock"));
        let (both, acq, rel, cost, rtt) = measure(n, true, ping_cpu, &mut || {
            let g = lock.lock().expect("lock");
            let mid = mono_ns();
            g.unlock().expect("unlock");
            mid
        });
        if let Some(g) = outer {
            g.unlock().expect("unlock");
        }
        let (pair, first, second, crit) = if reentrant {
            (
                "re-entrant acquire + release",
                "re-entrant acquire",
                "re-entrant release",
                "fairlock_reentrant",
            )
        } else {
            (
                "uncontended acquire + release",
                "uncontended acquire",
                "uncontended release",
                "fairlock_uncontended",
            )
        };
        for (figure, d, criterion, cost) in [
            (pair, both, crit, cost),
            (first, acq, "", None),
            (second, rel, "", None),
        ] {
            rows.push(Row {
                figure,
                lock: "fairlock",
                d,
                rtt,
                criterion,
                cost,
            });
        }
    }

    // The same pair through the raw layer, once per runner, in alternating blocks: what the
    // function library saves the server against scripts sent whole (EVALSHA, Redis 6.2's way).
    let mut raw_conn = connect(&b.url);
    let mut attempt = 0;
    for _block in 0..2 {
        for (runner, label) in [
            (Runner::Functions, "fairlock FCALL"),
            (Runner::Eval, "fairlock EVALSHA"),
        ] {
            let settings = Settings {
                runner,
                ..Settings::default()
            };
            let lock = RawLock::new("fairlock", &b.name("raw"), settings).expect("raw lock");
            let (d, _, _, cost, rtt) = measure(n / 2, true, ping_cpu, &mut || {
                attempt += 1;
                let grant = match lock
                    .acquire(
                        "bench:1",
                        attempt,
                        Duration::from_secs(30),
                        Mode::Try,
                        "bench",
                    )
                    .run(&mut raw_conn)
                    .expect("raw acquire")
                {
                    Acquire::Granted(g) => g,
                    other => panic!("an uncontended raw acquire: {other:?}"),
                };
                let mid = mono_ns();
                lock.release("bench:1", grant.token, 1)
                    .run(&mut raw_conn)
                    .expect("raw release");
                mid
            });
            rows.push(Row {
                figure: "uncontended acquire + release, raw layer",
                lock: label,
                d,
                rtt,
                criterion: "",
                cost,
            });
        }
    }

    for (lib, id) in [
        (Lib::Naive, "naive_uncontended"),
        (Lib::Redlock, "redlock_uncontended"),
    ] {
        let n = if lib == Lib::Redlock {
            b.sizes.micro_redlock
        } else {
            n
        };
        let mut locker = Locker::new(lib, &b.url, &b.name("uncontended"), None, "micro").unwrap();
        let (d, _, _, cost, rtt) = measure(n, lib == Lib::Fairlock, ping_cpu, &mut || {
            locker.acquire(u64::MAX).unwrap().expect("uncontended");
            locker.release().unwrap();
            0
        });
        rows.push(Row {
            figure: "uncontended acquire + release",
            lock: lib.name(),
            d,
            rtt,
            criterion: id,
            cost,
        });
    }

    let crit_ping = b.criterion_median_us("ping");
    b.md.push("### Uncontended and re-entrant (one thread)\n".into());
    b.md.push(format!("| figure | lock | n | p50 µs | p99 µs | RTT µs | p50 / RTT | p99 / RTT | criterion median / RTT | {COST_HEADER} | watchdog + janitor switches |"));
    b.md.push("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|".into());
    let mut out = vec![];
    for r in rows {
        let crit = if r.criterion.is_empty() {
            None
        } else {
            b.criterion_median_us(r.criterion).zip(crit_ping)
        };
        let c = r.cost.as_ref();
        b.md.push(format!(
            "| {} | {} | {} | {:.0} | {:.0} | {:.0} | {:.2} | {:.2} | {} | {} | {} |",
            r.figure,
            r.lock,
            r.d.n,
            r.d.p50,
            r.d.p99,
            r.rtt,
            r.d.p50 / r.rtt,
            r.d.p99 / r.rtt,
            crit.map_or("-".into(), |(op, ping)| format!("{:.2}", op / ping)),
            cost_cells(c),
            c.and_then(|c| c.bg_wakes)
                .filter(|_| r.lock == "fairlock")
                .map_or("".into(), |w| format!("{:.2} + {:.2}", w[0], w[1])),
        ));
        out.push(MicroRow {
            figure: r.figure,
            lock: r.lock,
            rtt_us: r1(r.rtt),
            dist: r.d.row(r.rtt),
            criterion: crit.map(|(op, ping)| CriterionMedian {
                criterion_median_us: r1(op),
                criterion_ping_us: r1(ping),
                criterion_median_rtt: r2(op / ping),
            }),
            cost: c.map(|c| MicroCost {
                round_trips: c.round_trips,
                redis_cmds: c.all,
                server_us: c.server_us,
                redis_cpu_us: c.redis_cpu_us,
                cmds_by_command: c.by_command.clone(),
                watchdog_janitor_switches: c.bg_wakes.filter(|_| r.lock == "fairlock"),
            }),
        });
    }
    b.md.push(String::new());
    b.md.push(format!("Redis CPU per acquisition: the redis-server process's CPU time (`INFO cpu`) over the loop, less {ping_cpu:.1} µs per iteration for its PING (the same loop with PINGs only).\n"));
    b.results.micro = Some(out);
    b.results.micro_ping_cpu_us = Some(ping_cpu);
}
