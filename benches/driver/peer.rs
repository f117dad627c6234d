//! Against the barging peer (section "peer"; the speed targets in `targets.rs` read it): node
//! `redis-semaphore`'s Mutex, which barges (a waiter polls with SET NX every 10 ms, so whoever
//! asks at the right moment gets the lock), beside fairlock's lock and semaphore, the two Rust
//! peers and the fair floor (`benches/locks`: `fair-floor` by FCALL, `fair-floor-eval` by
//! EVALSHA, `fair-floor-list` without a script; FIFO locks that do the least, yardsticks of what
//! fairness costs Redis), all in the same run and the same way:
//! - contended: 8 worker processes of one worker each (node processes for the node peer), each
//!   looping acquire → GET counter → SET counter+1 → hold (0 or 1 ms) → release on one connection
//!   of its own; acquisitions per second, Jain's index, the counter against the acquisitions (a
//!   lost update would show), and what Redis spent per acquisition over a window in the middle
//!   of the run (`redis_cost`: server time of the commands the clients sent, from `INFO
//!   commandstats`, the benchmark's GET and SET left out; CPU of the redis-server process, from
//!   `INFO cpu`, which cannot leave them out);
//! - uncontended: one worker process looping acquire → release, the same two figures per pair;
//! - fairlock's order (and fair-floor's, fair-floor-list's): the contended run again under
//!   `MONITOR` (`fifo::audited_run`), overtakes in the order Redis ran the acquire calls;
//! - per call: the fair floor's calls and the node peer's, each kind alone on one connection,
//!   server µs per call from `INFO commandstats`;
//! - memory: `MEMORY USAGE` of every key of one lock (and one semaphore of one permit) when idle
//!   after one acquire + release, when held, and with N waiters queued.
//!
//! Every row carries the PING p50 measured right around it. Without node (scripts/bench.sh sets
//! `FAIRLOCK_BENCH_NODE_PEER` when it could install the peer) the node rows are left out and
//! the targets that need them say "not measured".

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::bench::{connect, Bench};
use crate::fifo::{audited_run, audited_run_of, FifoRow};
use crate::locks::{
    floor_keys, floor_list_keys, load_floor, mono_ns, Lib, FLOOR_ACQUIRE, FLOOR_RELEASE,
    NODE_RELEASE, PEER_TTL_MS,
};
use crate::redis_cost::{commandstats, CostPerAcq};
use crate::stats::{jain, overtakes, r1, r2, r4};
use crate::workers::{cleanup, fairlock_client, node_peer, Layout, Outcome, Spec};
use crate::{MS, SEC};

/// The workers of the contended runs: processes of one worker each.
pub const PROCS: u32 = 8;

/// The results file's `peer`.
#[derive(Serialize, Default)]
pub struct PeerResults {
    /// why the node peer did not run, when it did not
    pub node_skipped: Option<String>,
    pub contended: Vec<PeerRow>,
    pub uncontended: Vec<PeerRow>,
    /// fairlock's contended runs under MONITOR
    pub audit: Vec<FifoRow>,
    /// the fair floor's (by FCALL)
    pub floor_audit: Vec<FifoRow>,
    /// the list lock's (`fair-floor-list`)
    pub list_audit: Vec<FifoRow>,
    pub memory: Vec<MemoryRow>,
    /// the server time of single calls of the fair floor and of the node peer, one connection,
    /// nothing else running
    pub per_call: Vec<CallRow>,
}

/// The server time of one kind of call, alone (`INFO commandstats` around a loop of them).
#[derive(Serialize)]
pub struct CallRow {
    pub call: String,
    /// what the call runs, in Redis commands
    pub runs: &'static str,
    /// the command of `INFO commandstats` it counts under
    pub command: &'static str,
    pub calls: u64,
    pub server_us_per_call: Option<f64>,
    pub errors: Vec<String>,
}

/// One run: a lock, a number of worker processes and a hold.
#[derive(Serialize)]
pub struct PeerRow {
    pub lock: &'static str,
    pub processes: u32,
    pub hold_ms: f64,
    pub seconds: f64,
    pub acquisitions: usize,
    pub acq_per_s: f64,
    /// the counter the workers incremented under the lock (contended runs), read at the end
    pub counter: Option<i64>,
    /// it equals the acquisitions (or there is no counter)
    pub counter_ok: bool,
    pub per_worker: Vec<u64>,
    pub jain: f64,
    /// by the workers' clocks; the audit gives fairlock's in server order
    pub overtakes_client_clock: usize,
    /// PING p50 of bursts right before and after the run
    pub ping_us: f64,
    #[serde(flatten)]
    pub cost: CostPerAcq,
    pub errors: Vec<String>,
}

/// The Redis memory of one primitive, every key of it (`MEMORY USAGE key SAMPLES 0`).
#[derive(Serialize)]
pub struct MemoryRow {
    /// "lock" or "semaphore" (one permit)
    pub primitive: &'static str,
    /// free after one acquire + release
    pub idle_keys: usize,
    pub idle_bytes: i64,
    /// held, nobody waiting
    pub held_bytes: i64,
    pub waiters: u32,
    pub with_waiters_bytes: Option<i64>,
    /// (with waiters - held) / waiters
    pub per_waiter_bytes: Option<f64>,
    pub errors: Vec<String>,
}

pub fn peer(b: &mut Bench) {
    let mut out = PeerResults::default();
    let node = node_peer().is_some();
    if !node {
        let why = "node peer skipped: FAIRLOCK_BENCH_NODE_PEER is not set to an installed benches/peers/redis-semaphore (scripts/bench.sh sets it when node and npm are installed)";
        eprintln!("driver: {why}");
        out.node_skipped = Some(why.into());
    }
    let libs: Vec<Lib> = [
        Lib::NodeMutex,
        Lib::FairFloor,
        Lib::FairFloorEval,
        Lib::FairFloorList,
        Lib::Fairlock,
        Lib::Semaphore,
        Lib::Redlock,
        Lib::Naive,
    ]
    .into_iter()
    .filter(|&l| {
        if l == Lib::NodeMutex {
            node
        } else if l.is_yardstick() {
            true
        } else {
            b.sizes.libs.contains(&l)
        }
    })
    .collect();
    let node_start = if node { node_start_ns() } else { 0 };
    let secs = b.sizes.throughput_secs;
    let dur = (secs * SEC as f64) as u64;

    for hold in [0, 1000] {
        for &lib in &libs {
            let name = format!("peer-{}-{hold}", lib.name());
            let row = run(b, lib, &name, PROCS, hold, dur, node_start);
            out.contended.push(row);
        }
    }
    for lib in [
        Lib::NodeMutex,
        Lib::FairFloor,
        Lib::FairFloorEval,
        Lib::FairFloorList,
        Lib::Fairlock,
        Lib::Semaphore,
    ] {
        if libs.contains(&lib) {
            let name = format!("peer-pair-{}", lib.name());
            out.uncontended
                .push(run(b, lib, &name, 1, 0, dur / 2, node_start));
        }
    }
    for hold in [0, 1000] {
        let row = audited_run(b, &format!("peer-audit-{hold}"), PROCS, 1, hold, dur / 2);
        out.audit.push(row);
        let what = format!("peer-floor-audit-{hold}");
        let row = audited_run_of(b, Lib::FairFloor, &what, PROCS, 1, hold, dur / 2);
        out.floor_audit.push(row);
        let what = format!("peer-list-audit-{hold}");
        let row = audited_run_of(b, Lib::FairFloorList, &what, PROCS, 1, hold, dur / 2);
        out.list_audit.push(row);
    }
    for sem in [false, true] {
        out.memory.push(memory(b, sem, b.sizes.peer_waiters));
    }
    out.per_call = per_call(b, b.sizes.peer_calls);
    tables(b, &out);
    b.results.peer = Some(out);
}

/// How long to give node worker processes to start: three times what 8 of them took to load the
/// peer's packages here, and at least 3 s (a worker that starts late says so in an error).
fn node_start_ns() -> u64 {
    let t = mono_ns();
    let dir = node_peer().unwrap_or_default();
    let loads: Vec<_> = (0..PROCS)
        .filter_map(|_| {
            std::process::Command::new("node")
                .current_dir(&dir)
                .args(["-e", "require('ioredis'); require('redis-semaphore')"])
                .spawn()
                .ok()
        })
        .collect();
    for mut l in loads {
        let _ = l.wait();
    }
    (3 * (mono_ns() - t)).max(3 * SEC)
}

/// `procs` worker processes of one worker each on `lib` with hold `hold` µs for `dur` ns: with
/// more than one, each hold does GET/SET on a counter; with one, the loop is acquire → release.
/// Node workers start `node_start` ns after they are spawned, the others 0.8 s.
fn run(
    b: &mut Bench,
    lib: Lib,
    what: &str,
    procs: u32,
    hold: u64,
    dur: u64,
    node_start: u64,
) -> PeerRow {
    let start = mono_ns()
        + if lib == Lib::NodeMutex {
            node_start
        } else {
            800 * MS
        };
    let counter = procs > 1;
    let spec = b.timed_spec(lib, what, counter, hold, start, dur);
    let window = (start + dur / 4, start + dur * 9 / 10);
    let o = b.run_timed_layout(&spec, &Layout::Procs(vec![1; procs as usize]), Some(window));
    let row = row(b, &spec, procs, &o, dur);
    cleanup(&b.url, &spec);
    if lib == Lib::FairFloorList {
        let (token, init) = floor_list_keys(&spec.name);
        let _: redis::RedisResult<i64> = redis::cmd("DEL")
            .arg(token)
            .arg(init)
            .query(&mut connect(&b.url));
    }
    PeerRow {
        errors: o.errors,
        ..row
    }
}

fn row(b: &Bench, spec: &Spec, procs: u32, o: &Outcome, dur: u64) -> PeerRow {
    let granted = o.recs.iter().filter(|r| r.got > 0).count();
    let in_time = o
        .recs
        .iter()
        .filter(|r| r.got >= spec.start_ns && r.got < spec.stop_ns)
        .count();
    let mut per_worker = vec![0u64; o.workers as usize];
    for r in o.recs.iter().filter(|r| r.got > 0) {
        if let Some(c) = per_worker.get_mut(r.worker as usize) {
            *c += 1;
        }
    }
    PeerRow {
        lock: spec.lib.name(),
        processes: procs,
        hold_ms: spec.hold_us as f64 / 1000.0,
        seconds: dur as f64 / SEC as f64,
        acquisitions: granted,
        acq_per_s: r1(in_time as f64 / (dur as f64 / SEC as f64)),
        counter: o.counter,
        counter_ok: o.counter.is_none_or(|c| c == granted as i64),
        jain: r4(jain(&per_worker)),
        per_worker,
        overtakes_client_clock: overtakes(&o.recs),
        ping_us: r1(b.rtt_us),
        cost: CostPerAcq::of(o.cost.as_ref()),
        errors: vec![],
    }
}

/// A hold of the lock or of the semaphore's one permit.
enum Held {
    Lock(fairlock::LockGuard),
    Permit(fairlock::Permit),
}

fn take(client: &fairlock::LockClient, sem: bool, name: &str) -> fairlock::Result<Held> {
    Ok(if sem {
        Held::Permit(client.semaphore(name, 1)?.acquire()?)
    } else {
        Held::Lock(client.fair_lock(name)?.lock()?)
    })
}

impl Held {
    fn release(self) -> fairlock::Result<()> {
        match self {
            Held::Lock(g) => g.unlock(),
            Held::Permit(p) => p.release(),
        }
    }
}

/// Every key of the primitive named `name` (they all carry the hash tag `{name}`) with its
/// `MEMORY USAGE`.
fn keys_of(conn: &mut redis::Connection, name: &str) -> BTreeMap<String, i64> {
    let keys: Vec<String> = redis::cmd("SCAN")
        .cursor_arg(0)
        .arg("MATCH")
        .arg(format!("*{{{name}}}*"))
        .arg("COUNT")
        .arg(1000)
        .clone()
        .iter(conn)
        .map(|it| it.filter_map(Result::ok).collect())
        .unwrap_or_default();
    keys.into_iter()
        .map(|k| {
            let bytes: Option<i64> = redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(&k)
                .arg("SAMPLES")
                .arg(0)
                .query(conn)
                .unwrap_or(None);
            (k, bytes.unwrap_or(0))
        })
        .collect()
}

/// The waiters queued on the primitive (the members of its queue zset).
fn queued(conn: &mut redis::Connection, keys: &BTreeMap<String, i64>) -> u64 {
    keys.keys()
        .filter(|k| k.ends_with(":queue"))
        .map(|k| redis::cmd("ZCARD").arg(k).query::<u64>(conn).unwrap_or(0))
        .sum()
}

/// The memory of one lock (`sem`: one semaphore of one permit): idle after one acquire +
/// release, held, and held with `waiters` threads of one client queued.
fn memory(b: &Bench, sem: bool, waiters: u32) -> MemoryRow {
    let primitive = if sem { "semaphore" } else { "lock" };
    let name = b.name(&format!("peer-mem-{primitive}"));
    let mut conn = connect(&b.url);
    let mut row = MemoryRow {
        primitive,
        idle_keys: 0,
        idle_bytes: 0,
        held_bytes: 0,
        waiters,
        with_waiters_bytes: None,
        per_waiter_bytes: None,
        errors: vec![],
    };
    let client = match fairlock_client(&b.url) {
        Ok(c) => c,
        Err(e) => {
            row.errors.push(format!("client: {e}"));
            return row;
        }
    };
    let held = take(&client, sem, &name).and_then(Held::release);
    if let Err(e) = held {
        row.errors.push(format!("acquire + release: {e}"));
        return row;
    }
    let idle = keys_of(&mut conn, &name);
    row.idle_keys = idle.len();
    row.idle_bytes = idle.values().sum();
    let holder = match take(&client, sem, &name) {
        Ok(h) => h,
        Err(e) => {
            row.errors.push(format!("acquire: {e}"));
            return row;
        }
    };
    row.held_bytes = keys_of(&mut conn, &name).values().sum();
    let threads: Vec<_> = (0..waiters)
        .map(|_| {
            let (client, name) = (client.clone(), name.clone());
            std::thread::spawn(move || take(&client, sem, &name).and_then(Held::release))
        })
        .collect();
    // bounded: the waiters queue within milliseconds
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let keys = keys_of(&mut conn, &name);
        if queued(&mut conn, &keys) >= u64::from(waiters) {
            let bytes: i64 = keys.values().sum();
            row.with_waiters_bytes = Some(bytes);
            row.per_waiter_bytes = Some(r1(
                (bytes - row.held_bytes) as f64 / f64::from(waiters.max(1))
            ));
            break;
        }
        if Instant::now() > until {
            row.errors
                .push(format!("{waiters} waiters did not queue in 10 s"));
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    if let Err(e) = holder.release() {
        row.errors.push(format!("release: {e}"));
    }
    for t in threads {
        match t.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => row.errors.push(format!("waiter: {e}")),
            Err(_) => row.errors.push("a waiter panicked".into()),
        }
    }
    row
}

/// One kind of call of the per-call measurement: `before` once, then `n` times `setup` and the
/// `call` (counted under `command` in `INFO commandstats`; `setup` uses other commands), then
/// `after`.
struct CallKind {
    call: String,
    runs: &'static str,
    command: &'static str,
    before: Vec<redis::Cmd>,
    setup: Vec<redis::Cmd>,
    call_cmd: redis::Cmd,
    after: Vec<redis::Cmd>,
}

fn cmd(args: &[&str]) -> redis::Cmd {
    let mut c = redis::cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    c
}

/// The server time of the fair floor's calls (by FCALL and by EVALSHA), of an empty FCALL and
/// EVALSHA, and of the node peer's SET NX PX and release script, each alone on one connection:
/// `n` calls of a kind, sent in pipelines of 200 (the server time of a call does not include
/// reading or writing it), timed by the difference of `INFO commandstats` around them.
fn per_call(b: &Bench, n: u64) -> Vec<CallRow> {
    let mut conn = connect(&b.url);
    let name = b.name("peer-per-call");
    let (owner, queue, wake) = floor_keys(&name);
    let (me, next) = (format!("{wake}me"), format!("{wake}next"));
    let node_key = format!("mutex:{name}");
    let mut errors = vec![];
    if let Err(e) = load_floor(&mut conn) {
        errors.push(format!("FUNCTION LOAD: {e}"));
    }
    let sha = |src: &str| -> String {
        redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(src)
            .query(&mut connect(&b.url))
            .unwrap_or_default()
    };
    let (acq_sha, rel_sha, node_sha, noop_sha) = (
        sha(FLOOR_ACQUIRE),
        sha(FLOOR_RELEASE),
        sha(NODE_RELEASE),
        sha("return 1"),
    );
    let ttl = PEER_TTL_MS.to_string();
    let floor = |by_fcall: bool, release: bool| -> redis::Cmd {
        if by_fcall {
            let f = if release {
                "fairfloor_release"
            } else {
                "fairfloor_acquire"
            };
            cmd(&["FCALL", f, "2", &owner, &queue, &me])
        } else {
            let s = if release { &rel_sha } else { &acq_sha };
            cmd(&["EVALSHA", s, "2", &owner, &queue, &me])
        }
    };
    let mut kinds = vec![];
    for by_fcall in [true, false] {
        let (how, command) = if by_fcall {
            ("FCALL", "fcall")
        } else {
            ("EVALSHA", "evalsha")
        };
        let s = |v: &str| format!("{how} {v}");
        kinds.push(CallKind {
            call: s("empty function (return 1)"),
            runs: "nothing",
            command,
            before: vec![],
            setup: vec![],
            call_cmd: if by_fcall {
                cmd(&["FCALL", "fairfloor_noop", "0"])
            } else {
                cmd(&["EVALSHA", &noop_sha, "0"])
            },
            after: vec![],
        });
        kinds.push(CallKind {
            call: s("fair-floor acquire, free"),
            runs: "SET NX",
            command,
            before: vec![],
            setup: vec![cmd(&["DEL", &owner])],
            call_cmd: floor(by_fcall, false),
            after: vec![cmd(&["DEL", &owner])],
        });
        kinds.push(CallKind {
            call: s("fair-floor acquire, held (queues)"),
            runs: "SET NX, RPUSH",
            command,
            before: vec![cmd(&["SET", &owner, "other"])],
            setup: vec![],
            call_cmd: floor(by_fcall, false),
            after: vec![cmd(&["DEL", &owner, &queue])],
        });
        kinds.push(CallKind {
            call: s("fair-floor release, nobody queued"),
            runs: "GET, LPOP, DEL",
            command,
            before: vec![],
            setup: vec![cmd(&["SET", &owner, &me])],
            call_cmd: floor(by_fcall, true),
            after: vec![],
        });
        kinds.push(CallKind {
            call: s("fair-floor release, hand-over"),
            runs: "GET, LPOP, SET, RPUSH",
            command,
            before: vec![],
            setup: vec![cmd(&["SET", &owner, &me]), cmd(&["RPUSH", &queue, &next])],
            call_cmd: floor(by_fcall, true),
            after: vec![cmd(&["DEL", &owner, &queue, &next])],
        });
    }
    let (token, _) = floor_list_keys(&name);
    kinds.push(CallKind {
        call: "fair-floor-list: BLPOP, the token there".into(),
        runs: "BLPOP (pops at once)",
        command: "blpop",
        before: vec![],
        setup: vec![cmd(&["RPUSH", &token, "1"])],
        call_cmd: cmd(&["BLPOP", &token, "5"]),
        after: vec![],
    });
    kinds.push(CallKind {
        call: "fair-floor-list: RPUSH, nobody waiting".into(),
        runs: "RPUSH (makes the list)",
        command: "rpush",
        before: vec![],
        setup: vec![cmd(&["DEL", &token])],
        call_cmd: cmd(&["RPUSH", &token, "1"]),
        after: vec![cmd(&["DEL", &token])],
    });
    kinds.push(CallKind {
        call: "node: SET NX PX, free".into(),
        runs: "SET",
        command: "set",
        before: vec![],
        setup: vec![cmd(&["DEL", &node_key])],
        call_cmd: cmd(&["SET", &node_key, "id", "NX", "PX", &ttl]),
        after: vec![cmd(&["DEL", &node_key])],
    });
    kinds.push(CallKind {
        call: "node: SET NX PX, held (a poll)".into(),
        runs: "SET",
        command: "set",
        before: vec![cmd(&["SET", &node_key, "other"])],
        setup: vec![],
        call_cmd: cmd(&["SET", &node_key, "id", "NX", "PX", &ttl]),
        after: vec![cmd(&["DEL", &node_key])],
    });
    kinds.push(CallKind {
        call: "node: release (EVALSHA compare-and-delete)".into(),
        runs: "GET, DEL",
        command: "evalsha",
        before: vec![],
        // a client SET would be counted under "set", not under the measured "evalsha"
        setup: vec![cmd(&["SET", &node_key, "id"])],
        call_cmd: cmd(&["EVALSHA", &node_sha, "1", &node_key, "id"]),
        after: vec![],
    });
    kinds
        .into_iter()
        .map(|k| time_calls(&mut conn, k, n, &errors))
        .collect()
}

/// Run one kind of call `n` times (after one warm-up) and take its server time per call.
fn time_calls(conn: &mut redis::Connection, k: CallKind, n: u64, errors: &[String]) -> CallRow {
    let mut row = CallRow {
        call: k.call,
        runs: k.runs,
        command: k.command,
        calls: 0,
        server_us_per_call: None,
        errors: errors.to_vec(),
    };
    let pipe = |conn: &mut redis::Connection, times: u64| -> redis::RedisResult<()> {
        let mut left = times;
        while left > 0 {
            let chunk = left.min(200);
            let mut p = redis::pipe();
            for _ in 0..chunk {
                for c in &k.setup {
                    p.add_command(c.clone()).ignore();
                }
                p.add_command(k.call_cmd.clone()).ignore();
            }
            p.query::<()>(conn)?;
            left -= chunk;
        }
        Ok(())
    };
    let run = |conn: &mut redis::Connection, cmds: &[redis::Cmd]| -> redis::RedisResult<()> {
        cmds.iter().try_for_each(|c| c.query::<()>(conn))
    };
    let measured = (|| -> redis::RedisResult<(u64, u64)> {
        run(conn, &k.before)?;
        pipe(conn, 1)?;
        let before = commandstats(conn).get(k.command).copied().unwrap_or((0, 0));
        pipe(conn, n)?;
        let after = commandstats(conn).get(k.command).copied().unwrap_or((0, 0));
        run(conn, &k.after)?;
        Ok((after.0 - before.0, after.1 - before.1))
    })();
    match measured {
        Ok((calls, usec)) => {
            row.calls = calls;
            row.server_us_per_call = (calls > 0).then(|| r2(usec as f64 / calls as f64));
            if calls != n {
                row.errors
                    .push(format!("{} {} calls counted, {n} sent", calls, k.command));
            }
        }
        Err(e) => row.errors.push(format!("{}: {e}", row.call)),
    }
    row
}

fn cells(c: &CostPerAcq) -> String {
    let f = |v: Option<f64>, d: usize| v.map_or("-".into(), |v| format!("{v:.d$}"));
    format!(
        "{} | {} | {} | {}",
        f(c.server_us_per_acq, 1),
        f(c.redis_cpu_us_per_acq, 1),
        f(c.redis_cmds_per_acq, 1),
        f(c.round_trips_per_acq, 2)
    )
}

fn tables(b: &mut Bench, out: &PeerResults) {
    b.md.push(format!("### Against the barging peer: {PROCS} worker processes, acquire → GET → SET → hold → release\n"));
    b.md.push("| lock | hold | acq/s | counter = acq | Jain | overtakes (client clocks) | server µs / acq | Redis CPU µs / acq | Redis cmds / acq | round trips / acq | PING p50 µs |".into());
    b.md.push("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|".into());
    for r in &out.contended {
        b.md.push(format!(
            "| {} | {} ms | {:.0} | {} | {:.3} | {} | {} | {:.0} |",
            r.lock,
            r.hold_ms,
            r.acq_per_s,
            if r.counter_ok {
                "yes".to_string()
            } else {
                format!("**NO** ({:?} vs {})", r.counter, r.acquisitions)
            },
            r.jain,
            r.overtakes_client_clock,
            cells(&r.cost),
            r.ping_us
        ));
    }
    b.md.push(String::new());
    b.md.push("Uncontended, one worker process looping acquire → release:\n".into());
    b.md.push("| lock | pairs/s | server µs / pair | Redis CPU µs / pair | Redis cmds / pair | round trips / pair | PING p50 µs |".into());
    b.md.push("|---|---:|---:|---:|---:|---:|---:|".into());
    for r in &out.uncontended {
        b.md.push(format!(
            "| {} | {:.0} | {} | {:.0} |",
            r.lock,
            r.acq_per_s,
            cells(&r.cost),
            r.ping_us
        ));
    }
    b.md.push(String::new());
    b.md.push("Server µs per call of the clients' own commands in the same windows (`INFO commandstats`; a script's includes the commands it ran), and calls per acquisition:\n".into());
    b.md.push("| lock | hold | µs per call × calls per acq |".into());
    b.md.push("|---|---:|---|".into());
    for r in out.contended.iter().chain(&out.uncontended) {
        let (Some(us), Some(n)) = (
            &r.cost.us_per_call_by_command,
            &r.cost.cmds_per_acq_by_command,
        ) else {
            continue;
        };
        let calls: Vec<String> = us
            .iter()
            .filter(|(c, _)| {
                ["fcall", "evalsha", "set", "blpop"].contains(&c.as_str())
                    || *c == "rpush" && r.lock == Lib::FairFloorList.name()
            })
            // a SET of fairlock or the fair floor ran inside their scripts
            .filter(|(c, _)| *c != "set" || !Lib::parse(r.lock).is_some_and(Lib::scripts_set))
            .map(|(c, u)| format!("{c} {u:.2} × {:.2}", n.get(c).copied().unwrap_or(0.0)))
            .collect();
        let hold = if r.processes == 1 {
            "pair".to_string()
        } else {
            format!("{} ms", r.hold_ms)
        };
        b.md.push(format!("| {} | {hold} | {} |", r.lock, calls.join(", ")));
    }
    b.md.push(String::new());
    b.md.push(format!("The fair floor's calls and the node peer's, each alone on one connection ({} calls of each, pipelined; `INFO commandstats`):\n", out.per_call.first().map_or(0, |c| c.calls)));
    b.md.push("| call | runs | server µs / call |".into());
    b.md.push("|---|---|---:|".into());
    for c in &out.per_call {
        b.md.push(format!(
            "| {} | {} | {} |",
            c.call,
            c.runs,
            c.server_us_per_call
                .map_or("-".into(), |v| format!("{v:.2}"))
        ));
    }
    b.md.push(String::new());
    let order = |rows: &[FifoRow]| {
        rows.iter()
            .map(|a| {
                format!(
                "hold {} ms, {} overtakes in server order in {} grants ({} by client clocks, {} workers not paired)",
                a.hold_ms, a.overtakes_server_order, a.audited, a.overtakes_client_clock, a.workers_not_paired
            )
            })
            .collect::<Vec<_>>()
            .join("; ")
    };
    b.md.push(format!(
        "fairlock's order, the contended run again under MONITOR: {}.\n",
        order(&out.audit)
    ));
    b.md.push(format!(
        "fair-floor's order, the same: {}.\n",
        order(&out.floor_audit)
    ));
    b.md.push(format!(
        "fair-floor-list's order, the same (its acquire is the BLPOP): {}.\n",
        order(&out.list_audit)
    ));
    b.md.push("| Redis memory (`MEMORY USAGE`, every key) | keys idle | bytes idle | bytes held | waiters | bytes per waiter |".into());
    b.md.push("|---|---:|---:|---:|---:|---:|".into());
    for m in &out.memory {
        b.md.push(format!(
            "| fairlock {} | {} | {} | {} | {} | {} |",
            m.primitive,
            m.idle_keys,
            m.idle_bytes,
            m.held_bytes,
            m.waiters,
            m.per_waiter_bytes.map_or("-".into(), |v| format!("{v:.0}"))
        ));
    }
    b.md.push(String::new());
    b.md.push("Server µs: the time Redis spent in the commands the clients sent (a script's includes the commands it ran), from `INFO commandstats`, without the benchmark's GET and SET; Redis CPU: the redis-server process's CPU time (`INFO cpu`), which includes them and the reading and writing of every request. The node peer keeps one string key while held, nothing when free and nothing per waiter (its waiters poll). fair-floor (by FCALL) and fair-floor-eval (the same Lua by EVALSHA): the least a FIFO lock with push wake-ups does on Redis (acquire: SET NX, else RPUSH onto the queue and BLPOP a wake list; release: GET, LPOP, then DEL, or SET the next owner and RPUSH its wake list), with no crash safety, leases, reentrancy or tokens: a yardstick, not a lock to use. fair-floor-list: a token in a list, BLPOP to take it and RPUSH to give it back (Redis serves the clients blocked on a key in the order they blocked), no script and no owner: the least a FIFO lock on Redis does, a yardstick too.\n".into());
}
