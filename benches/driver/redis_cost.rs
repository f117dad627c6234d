//! What the locks cost Redis: snapshots of `INFO commandstats` and `INFO cpu`, their difference
//! per acquisition, and the wake-ups of fairlock's background threads in this process.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::stats::{r1, r2};

/// What Redis has done up to a moment: its command counters and the CPU time of its process.
pub struct Snapshot {
    /// `INFO commandstats`: command -> (calls, usec)
    cmds: HashMap<String, (u64, u64)>,
    /// `used_cpu_sys + used_cpu_user` of `INFO cpu` in µs: the redis-server process, all its
    /// threads
    cpu_us: u64,
}

pub fn snapshot(conn: &mut redis::Connection) -> Snapshot {
    Snapshot {
        cmds: commandstats(conn),
        cpu_us: redis_cpu_us(conn),
    }
}

/// The CPU time the redis-server process has used, in µs (`INFO cpu` gives seconds with six
/// decimals, from getrusage).
fn redis_cpu_us(conn: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO").arg("cpu").query(conn).expect("INFO cpu");
    let secs = |key: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    ((secs("used_cpu_sys:") + secs("used_cpu_user:")) * 1e6).round() as u64
}

/// `INFO commandstats` as command -> (calls, usec).
pub fn commandstats(conn: &mut redis::Connection) -> HashMap<String, (u64, u64)> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(conn)
        .expect("INFO commandstats");
    let mut out = HashMap::new();
    for line in info.lines() {
        let Some((name, rest)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        let field = |key: &str| {
            rest.split(',')
                .find_map(|kv| kv.strip_prefix(key))
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        out.insert(name.to_string(), (field("calls="), field("usec=")));
    }
    out
}

/// Commands a client sends itself; every other command in commandstats ran inside a script.
const CLIENT_COMMANDS: &[&str] = &[
    "evalsha",
    "eval",
    "evalsha_ro",
    "eval_ro",
    "fcall",
    "fcall_ro",
    "blpop",
    "brpop",
    "set",
    "script",
    "ping",
    "client|setinfo",
    "client|setname",
    "client|id",
    "hello",
    "select",
    "auth",
];

/// What the locks cost Redis per acquisition over a window.
pub struct Cost {
    pub round_trips: f64,
    pub all: f64,
    pub server_us: f64,
    /// CPU time of the redis-server process (`INFO cpu`) per acquisition, µs: unlike
    /// `server_us`, it includes reading requests and writing replies, and whatever else the
    /// server did in the window (its cron, other clients)
    pub redis_cpu_us: f64,
    pub by_command: BTreeMap<String, f64>,
    /// server µs per call of each command (a script's includes the commands it ran)
    pub us_per_call: BTreeMap<String, f64>,
    /// context switches of fairlock's watchdog and janitor threads per acquisition (runs in
    /// this process only)
    pub bg_wakes: Option<[f64; 2]>,
}

/// `scripted_set`: the lock's scripts run SET themselves (fairlock's fence) and its client never
/// does, so a SET is not a round trip. `client_rpush`: the lock's client sends RPUSH itself
/// (the list lock of the fair floor), so an RPUSH is one.
pub fn cost(
    before: &Snapshot,
    after: &Snapshot,
    acquisitions: u64,
    bench_counter: bool,
    scripted_set: bool,
    client_rpush: bool,
) -> Option<Cost> {
    if acquisitions == 0 {
        return None;
    }
    let mut calls: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for (name, &(c, u)) in &after.cmds {
        let (c0, u0) = before.cmds.get(name).copied().unwrap_or((0, 0));
        if c > c0 && name != "info" {
            calls.insert(name.clone(), (c - c0, u.saturating_sub(u0)));
        }
    }
    if bench_counter {
        // the benchmark's own GET and SET of its counter, one each per acquisition; a lock whose
        // client sends SET itself (the peers' SET NX) keeps its share of SET's time, the
        // benchmark's share taken out at SET's mean time per call (both set one short string)
        for name in ["get", "set"] {
            if let Some(e) = calls.get_mut(name) {
                let left = e.0.saturating_sub(acquisitions);
                e.1 = (e.1 as f64 * left as f64 / e.0.max(1) as f64).round() as u64;
                e.0 = left;
            }
        }
    }
    let a = acquisitions as f64;
    let mut rt = 0u64;
    let mut all = 0u64;
    let mut usec = 0u64;
    let mut by_command = BTreeMap::new();
    let mut us_per_call = BTreeMap::new();
    for (name, (c, u)) in &calls {
        if *c == 0 {
            continue;
        }
        all += c;
        let client = CLIENT_COMMANDS.contains(&name.as_str()) && !(scripted_set && name == "set")
            || client_rpush && name == "rpush";
        if client {
            rt += c;
            usec += u; // a client command's usec includes the commands its script ran
        }
        by_command.insert(name.clone(), r2(*c as f64 / a));
        us_per_call.insert(name.clone(), r2(*u as f64 / *c as f64));
    }
    Some(Cost {
        round_trips: r2(rt as f64 / a),
        all: r2(all as f64 / a),
        server_us: r1(usec as f64 / a),
        redis_cpu_us: r1(after.cpu_us.saturating_sub(before.cpu_us) as f64 / a),
        by_command,
        us_per_call,
        bg_wakes: None,
    })
}

/// The cost columns of the micro table, and of the multi-worker tables (the same, per
/// acquisition).
pub const COST_HEADER: &str = "round trips | Redis cmds | server µs | Redis CPU µs / acq";
pub const COST_HEADER_PER_ACQ: &str =
    "round trips / acq | Redis cmds / acq | server µs / acq | Redis CPU µs / acq";

/// The cells under `COST_HEADER`, "-" when the run took no figures.
pub fn cost_cells(c: Option<&Cost>) -> String {
    c.map_or("- | - | - | -".into(), |c| {
        format!(
            "{:.2} | {:.1} | {:.0} | {:.1}",
            c.round_trips, c.all, c.server_us, c.redis_cpu_us
        )
    })
}

/// A multi-worker run's cost figures as its row in the results file gives them (null when
/// not measured).
#[derive(Serialize)]
pub struct CostPerAcq {
    pub round_trips_per_acq: Option<f64>,
    pub redis_cmds_per_acq: Option<f64>,
    pub server_us_per_acq: Option<f64>,
    pub redis_cpu_us_per_acq: Option<f64>,
    pub cmds_per_acq_by_command: Option<BTreeMap<String, f64>>,
    /// server µs per call of each command in the window
    pub us_per_call_by_command: Option<BTreeMap<String, f64>>,
    pub background_wakeups_per_acq: Option<[f64; 2]>,
}

impl CostPerAcq {
    pub fn of(c: Option<&Cost>) -> CostPerAcq {
        CostPerAcq {
            round_trips_per_acq: c.map(|c| c.round_trips),
            redis_cmds_per_acq: c.map(|c| c.all),
            server_us_per_acq: c.map(|c| c.server_us),
            redis_cpu_us_per_acq: c.map(|c| c.redis_cpu_us),
            cmds_per_acq_by_command: c.map(|c| c.by_command.clone()),
            us_per_call_by_command: c.map(|c| c.us_per_call.clone()),
            background_wakeups_per_acq: c.and_then(|c| c.bg_wakes),
        }
    }
}

/// Context switches of this process's fairlock background threads (watchdog, janitor): each
/// one is a wake-up of a thread that competes with the lock's users for the CPUs.
pub fn background_switches() -> [u64; 2] {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return [0, 0];
    };
    let mut n = [0, 0];
    for t in tasks.flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        // thread names are cut to 15 bytes: fairlock-watchd, fairlock-janito
        let which = if comm.starts_with("fairlock-w") {
            0
        } else if comm.starts_with("fairlock-j") {
            1
        } else {
            continue;
        };
        let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
        for l in status.lines() {
            if let Some(v) = l
                .strip_prefix("voluntary_ctxt_switches:")
                .or_else(|| l.strip_prefix("nonvoluntary_ctxt_switches:"))
            {
                n[which] += v.trim().parse::<u64>().unwrap_or(0);
            }
        }
    }
    n
}
