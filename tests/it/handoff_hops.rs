//! Where the time of one contended lock hand-off goes, hop by hop (docs/benchmarks.md, "Where the
//! time of a hand-off goes"). Over 300 hand-offs of each kind on one local redis-server of its
//! own, in rounds that alternate between the slowlog off (server times from `INFO commandstats`
//! around each script call) and `slowlog-log-slower-than 0` (each call apart):
//!
//! 1. the release, through the raw layer on connection A: its round trip as the releaser sees it
//!    (`Instant`s around the call), and inside it the release script's server time and its inner
//!    calls (`SLOWLOG`: on Redis 7 the `FCALL` and each `redis.call` inside it are logged apart,
//!    the inner ones with client `?:0`, before the `FCALL`);
//! 2. the push reaching the waiter: a second thread blocked in `BLPOP <wake list>` on its own
//!    connection B (as the library's waker blocks), and the instant its `BLPOP` returns, from
//!    the instant the release was sent and from the instant the release's reply was read; the
//!    server time of serving that `BLPOP`;
//! 3. the next step of the contended loop: the queueing acquire of the next round (the former
//!    holder queues behind the new one), its round trip, server time and inner calls;
//! 4. a `PING` round trip on connection A in every round, the unit: every hop is also given as a
//!    multiple of the `PING` median.
//!
//! Then the library's hand-off for comparison, in the same run: two threads taking turns on one
//! lock, from the holder calling `unlock` to the waiter's `lock()` returning, with two threads of
//! one `LockClient` and with a client per thread (as two processes would), with the script calls
//! per hand-off and their server time. The kinds run in turn in 6 blocks, so that they share the
//! machine's moods. Ignored by default (it measures); run it with
//!
//! `nice -n 10 cargo test --release --all-features --test it -- --ignored --nocapture handoff_hops::`
//!
//! It prints a Markdown table. It fails when a release does not hand the lock to the waiter, when
//! the waiter's `BLPOP` does not get its grant, or when a library hand-off does not go to the
//! other thread; never on a timing.

use crate::support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::{commandstats, RedisServer};
use fairlock::raw::{self, Acquire, Mode, RawLock, Release, Runner, Settings, Wake};
use redis::Value;

/// Hand-offs counted of each kind: in `BLOCKS` blocks, each of which runs every kind in turn, so
/// that the kinds share the machine's moods (a shared VM's speed swings within minutes).
const ROUNDS: usize = 300;
const BLOCKS: usize = 6;
/// Rounds of each kind run first in a block and not counted (scripts loaded, connections warm).
const WARM_UP: usize = 5;
const LEASE: Duration = Duration::from_secs(30);
/// The longest any one wait of the test may take.
const BOUND: Duration = Duration::from_secs(10);
/// The waiter's `BLPOP` timeout: shorter than the connection's read timeout (10 s).
const BLOCK: Duration = Duration::from_secs(5);

/// The median and the 90th percentile of `v` (sorted here).
fn p50_p90(v: &mut [f64]) -> (f64, f64) {
    assert!(!v.is_empty());
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[(v.len() * 9 / 10).min(v.len() - 1)])
}

fn micros(from: Instant, to: Instant) -> f64 {
    if to >= from {
        (to - from).as_secs_f64() * 1e6
    } else {
        -((from - to).as_secs_f64() * 1e6)
    }
}

fn set_name(c: &mut redis::Connection, name: &str) {
    let _: () = redis::cmd("CLIENT")
        .arg("SETNAME")
        .arg(name)
        .query(c)
        .unwrap();
}

/// One `SLOWLOG` entry: its command (lowercase), second argument (the function an `FCALL`
/// names), duration (µs) and client name (`?:0` for a script's inner calls, by address).
struct Entry {
    cmd: String,
    arg1: String,
    us: u64,
    client: String,
}

fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        _ => String::new(),
    }
}

/// `SLOWLOG GET -1`, oldest first.
fn slowlog(c: &mut redis::Connection) -> Vec<Entry> {
    let log: Vec<Value> = redis::cmd("SLOWLOG").arg("GET").arg(-1).query(c).unwrap();
    let mut out: Vec<(i64, Entry)> = log
        .iter()
        .filter_map(|e| {
            let Value::Array(f) = e else { return None };
            let (Some(Value::Int(id)), Some(Value::Int(us)), Some(Value::Array(argv))) =
                (f.first(), f.get(2), f.get(3))
            else {
                return None;
            };
            let addr = f.get(4).map(text).unwrap_or_default();
            let name = f.get(5).map(text).unwrap_or_default();
            Some((
                *id,
                Entry {
                    cmd: argv.first().map(text).unwrap_or_default().to_lowercase(),
                    arg1: argv.get(1).map(text).unwrap_or_default(),
                    us: *us as u64,
                    client: if addr == "?:0" { addr } else { name },
                },
            ))
        })
        .collect();
    out.sort_by_key(|(id, _)| *id);
    out.into_iter().map(|(_, e)| e).collect()
}

/// A script call in the log: its server time (µs), its inner calls (count, their own µs) and
/// their names.
#[derive(Default)]
struct ScriptCost {
    us: u64,
    inner: u64,
    inner_us: u64,
    names: Vec<String>,
}

/// The cost of the `nth` script call (`FCALL` or `EVALSHA`) of client `client` in the log: a
/// script's inner calls are logged just before the call itself, after whatever was logged
/// before.
fn script_cost(log: &[Entry], client: &str, nth: usize) -> ScriptCost {
    let mut seen = 0;
    let mut inner: Vec<&Entry> = vec![];
    for e in log {
        if e.client == "?:0" {
            inner.push(e);
            continue;
        }
        if e.client == client && (e.cmd == "fcall" || e.cmd == "evalsha") {
            if seen == nth {
                return ScriptCost {
                    us: e.us,
                    inner: inner.len() as u64,
                    inner_us: inner.iter().map(|e| e.us).sum(),
                    names: inner.iter().map(|e| e.cmd.to_uppercase()).collect(),
                };
            }
            seen += 1;
        }
        inner.clear();
    }
    panic!(
        "no script call #{nth} of {client} in the slowlog: {:?}",
        log.iter()
            .map(|e| format!("{} {} ({})", e.cmd, e.arg1, e.client))
            .collect::<Vec<_>>()
    );
}

/// What the waiter thread did: when its `BLPOP` returned and what it popped.
struct Popped {
    at: Instant,
    msg: Option<(String, String)>,
}

/// The blocked clients on the server (`INFO clients`).
fn blocked_clients(c: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO").arg("clients").query(c).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("blocked_clients:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// What ran between two `INFO commandstats`: the script calls' server time (µs) and the count
/// of the calls they made inside (every other command but those the test itself sends).
fn stats_delta(before: &[(String, u64, u64)], after: &[(String, u64, u64)]) -> ScriptCost {
    let mut cost = ScriptCost::default();
    for (name, calls, usec) in after {
        let (c0, u0) = before
            .iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, c, u)| (*c, *u))
            .unwrap_or((0, 0));
        let (calls, usec) = (calls - c0, usec - u0);
        match name.as_str() {
            "fcall" | "evalsha" => cost.us += usec,
            n if ["info", "ping", "blpop", "client", "slowlog", "config"]
                .iter()
                .any(|own| n == *own || n.starts_with(&format!("{own}|"))) => {}
            _ => {
                cost.inner += calls;
                cost.inner_us += usec;
            }
        }
    }
    cost
}

/// The raw hops: from rounds with the slowlog off (round trips, and the server time of each
/// script by `INFO commandstats`), and from rounds with `SLOWLOG` at threshold 0 (each call apart).
#[derive(Default)]
struct RawHops {
    ping: Vec<f64>,
    release_rtt: Vec<f64>,
    release: Vec<ScriptCost>,
    sent_to_pop: Vec<f64>,
    reply_to_pop: Vec<f64>,
    queue_rtt: Vec<f64>,
    queue: Vec<ScriptCost>,
    /// from the `SLOWLOG` rounds
    logged_release_rtt: Vec<f64>,
    logged_release: Vec<ScriptCost>,
    logged_queue: Vec<ScriptCost>,
    blpop_us: Vec<f64>,
}

/// The raw hops of `rounds` hand-offs of each kind (slowlog off, `SLOWLOG` at 0, alternating)
/// between two owners of two clients (`p:1`, `q:1`, each with a wake list of its own) on lock
/// `name`, added to `h`.
fn raw_hops(server: &RedisServer, runner: Runner, name: &str, rounds: usize, h: &mut RawHops) {
    let mut a = server.conn();
    set_name(&mut a, "hops-releaser");
    let mut stats = server.conn();
    set_name(&mut stats, "hops-stats");
    let slowlog_threshold = |c: &mut redis::Connection, us: i64| {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("slowlog-log-slower-than")
            .arg(us)
            .arg("slowlog-max-len")
            .arg(1024)
            .query(c)
            .unwrap();
    };
    let lock = RawLock::new(
        "fairlock",
        name,
        Settings {
            runner,
            ..Settings::default()
        },
    )
    .unwrap();

    // the waiter thread: one BLPOP per request, on a connection of its own
    let (to_waiter, requests) = mpsc::channel::<String>();
    let (to_main, pops) = mpsc::channel::<Popped>();
    let mut b = server.conn();
    set_name(&mut b, "hops-waiter");
    let waiter = std::thread::spawn(move || {
        while let Ok(list) = requests.recv_timeout(BOUND) {
            let reply: Option<(String, String)> =
                raw::wait_cmd(&[&list], BLOCK).query(&mut b).unwrap();
            let at = Instant::now();
            if to_main.send(Popped { at, msg: reply }).is_err() {
                return;
            }
        }
    });

    let owners = ["p:1", "q:1"];
    let mut attempts = [1u64, 1];
    let mut holder = 0;
    let mut token = match lock
        .acquire(owners[0], 1, LEASE, Mode::Wait, "m")
        .run(&mut a)
        .unwrap()
    {
        Acquire::Granted(g) => g.token,
        other => panic!("{other:?}"),
    };
    attempts[1] += 1;
    let r = lock
        .acquire(owners[1], attempts[1], LEASE, Mode::Wait, "m")
        .run(&mut a)
        .unwrap();
    assert!(matches!(r, Acquire::Queued { .. }), "{r:?}");

    for round in 0..2 * (WARM_UP + rounds) {
        let logged = round % 2 == 1;
        let counted = round >= 2 * WARM_UP;
        slowlog_threshold(&mut stats, if logged { 0 } else { -1 });
        let w = 1 - holder;
        let wake_list = lock.wake_key(owners[w]);
        let s0 = commandstats(&mut stats);
        // the unit, on the releaser's connection
        let p0 = Instant::now();
        let _: String = redis::cmd("PING").query(&mut a).unwrap();
        let ping = micros(p0, Instant::now());

        // the waiter blocks; the release is sent once its BLPOP is blocked
        to_waiter.send(wake_list.clone()).unwrap();
        let deadline = Instant::now() + BOUND;
        while blocked_clients(&mut stats) != 1 {
            assert!(
                Instant::now() < deadline,
                "the waiter's BLPOP never blocked"
            );
            std::thread::sleep(Duration::from_micros(200));
        }
        let _: () = redis::cmd("SLOWLOG")
            .arg("RESET")
            .query(&mut stats)
            .unwrap();

        // 1: the release, granting the waiter
        let t0 = Instant::now();
        let released = lock.release(owners[holder], token, 1).run(&mut a).unwrap();
        let t1 = Instant::now();
        assert_eq!(
            released,
            Release::Released {
                next: Some(owners[w].into())
            },
            "round {round}: the release did not hand the lock to the waiter"
        );
        // 2: the push, popped by the waiter's BLPOP
        let popped = pops.recv_timeout(BOUND).expect("the waiter thread answers");
        let (list, msg) = popped
            .msg
            .unwrap_or_else(|| panic!("round {round}: the waiter's BLPOP timed out"));
        assert_eq!(list, wake_list);
        match raw::parse_wake(&msg).unwrap() {
            Wake::Grant {
                attempt, token: t, ..
            } => {
                assert_eq!(
                    attempt, attempts[w],
                    "round {round}: a grant for another attempt"
                );
                token = t;
            }
            other => panic!("round {round}: the waiter popped {other:?}, not its grant"),
        }
        let s1 = commandstats(&mut stats);
        // 3: the next round's queueing acquire: the former holder queues behind the new one
        let former = holder;
        holder = w;
        attempts[former] += 1;
        let t3 = Instant::now();
        let queued = lock
            .acquire(owners[former], attempts[former], LEASE, Mode::Wait, "m")
            .run(&mut a)
            .unwrap();
        let t4 = Instant::now();
        assert!(matches!(queued, Acquire::Queued { .. }), "{queued:?}");
        let s2 = commandstats(&mut stats);
        if !counted {
            continue;
        }
        if logged {
            let log = slowlog(&mut stats);
            h.logged_release_rtt.push(micros(t0, t1));
            h.logged_release.push(script_cost(&log, "hops-releaser", 0));
            h.logged_queue.push(script_cost(&log, "hops-releaser", 1));
            h.blpop_us.push(
                log.iter()
                    .find(|e| e.cmd == "blpop" && e.client == "hops-waiter")
                    .map(|e| e.us as f64)
                    .expect("the served BLPOP is in the slowlog"),
            );
        } else {
            h.ping.push(ping);
            h.release_rtt.push(micros(t0, t1));
            h.release.push(stats_delta(&s0, &s1));
            h.sent_to_pop.push(micros(t0, popped.at));
            h.reply_to_pop.push(micros(t1, popped.at));
            h.queue_rtt.push(micros(t3, t4));
            h.queue.push(stats_delta(&s1, &s2));
        }
    }
    drop(to_waiter);
    waiter.join().unwrap();
    slowlog_threshold(&mut stats, 10_000);
}

/// One grant of the library loop: the thread, its token, when `lock()` returned, when `unlock`
/// was called and when it returned.
struct Turn {
    thread: usize,
    token: u64,
    got: Instant,
    unlock: Instant,
    unlocked: Instant,
}

/// The library's hand-offs (µs each): unlock called → the other's `lock()` returned, the unlock
/// call; and the script calls per hand-off and their server time per hand-off (`INFO
/// commandstats` over the run).
#[derive(Default)]
struct Library {
    handoff: Vec<f64>,
    unlock: Vec<f64>,
    /// script calls, their server time (µs) and the hand-offs of the runs
    scripts: u64,
    script_us: u64,
    handoffs: u64,
}

impl Library {
    fn scripts_per_handoff(&self) -> (f64, f64) {
        let n = self.handoffs as f64;
        (self.scripts as f64 / n, self.script_us as f64 / n)
    }
}

/// Library hand-offs: two threads take turns on one lock (`clients` has one client for both or
/// one each); each holder waits until the other is queued (`ZCARD` of the queue on a plain
/// connection, so that no script call but the loop's own runs), then unlocks; `rounds`
/// hand-offs counted, added to `lib`.
fn library_hops(
    server: &RedisServer,
    clients: [fairlock::LockClient; 2],
    name: &str,
    rounds: usize,
    lib: &mut Library,
) {
    let queue = RawLock::new("fairlock", name, Settings::default())
        .unwrap()
        .key_names()[2]
        .to_string();
    let mut stats = server.conn();
    let grants = Arc::new(AtomicU32::new(0));
    let turns = Arc::new(Mutex::new(Vec::<Turn>::new()));
    let total = (WARM_UP + rounds + 1) as u32;
    let before = commandstats(&mut stats);
    let threads: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(i, client)| {
            let (grants, turns) = (Arc::clone(&grants), Arc::clone(&turns));
            let lock = client.fair_lock(name).unwrap();
            let mut c = server.conn();
            let queue = queue.clone();
            std::thread::spawn(move || loop {
                let guard = lock.lock().unwrap();
                let got = Instant::now();
                let token = guard.fencing_token();
                if grants.fetch_add(1, Ordering::SeqCst) + 1 >= total {
                    guard.unlock().unwrap();
                    return;
                }
                // the other thread queues behind this one before it lets go
                let deadline = Instant::now() + BOUND;
                loop {
                    let queued: u64 = redis::cmd("ZCARD").arg(&queue).query(&mut c).unwrap();
                    if queued == 1 {
                        break;
                    }
                    assert!(Instant::now() < deadline, "the other thread never queued");
                    std::thread::sleep(Duration::from_micros(200));
                }
                let unlock = Instant::now();
                guard.unlock().unwrap();
                let unlocked = Instant::now();
                turns.lock().unwrap().push(Turn {
                    thread: i,
                    token,
                    got,
                    unlock,
                    unlocked,
                });
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let after = commandstats(&mut stats);
    let script = |s: &[(String, u64, u64)]| -> (u64, u64) {
        s.iter()
            .filter(|(n, _, _)| n == "fcall" || n == "evalsha")
            .fold((0, 0), |(c, u), (_, calls, usec)| (c + calls, u + usec))
    };
    let (c0, u0) = script(&before);
    let (c1, u1) = script(&after);
    let mut turns = Arc::try_unwrap(turns).ok().unwrap().into_inner().unwrap();
    turns.sort_by_key(|t| t.token);
    for (i, pair) in turns.windows(2).enumerate() {
        let (x, y) = (&pair[0], &pair[1]);
        assert_ne!(
            x.thread, y.thread,
            "a hand-off went back to the thread that let go"
        );
        if i < WARM_UP {
            continue;
        }
        lib.handoff.push(micros(x.unlock, y.got));
        lib.unlock.push(micros(x.unlock, x.unlocked));
    }
    // every grant of the run but the first is a hand-off; the last holder's release is counted
    // too, so that every hand-off has its release and its queueing acquire
    lib.scripts += c1 - c0;
    lib.script_us += u1 - u0;
    lib.handoffs += u64::from(total);
}

fn client(server: &RedisServer) -> fairlock::LockClient {
    fairlock::LockClient::builder(&server.url())
        .build()
        .unwrap()
}

/// One row: median, p90, median / PING.
fn row(what: &str, v: &mut [f64], ping: f64, how: &str) -> (f64, String) {
    let (p50, p90) = p50_p90(v);
    (
        p50,
        format!(
            "| {what} | {p50:.1} | {p90:.1} | {:.2} | {how} |",
            p50 / ping
        ),
    )
}

#[test]
#[ignore = "a measurement: run with --ignored --nocapture"]
fn where_the_time_of_one_contended_hand_off_goes() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let runner = if support::has_command(&mut c, "FCALL") {
        Runner::Functions
    } else {
        Runner::Eval
    };
    let info: String = redis::cmd("INFO").arg("server").query(&mut c).unwrap();
    let version = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("?")
        .trim()
        .to_string();

    let mut h = RawHops::default();
    let mut threads = Library::default();
    let mut procs = Library::default();
    let rounds = ROUNDS / BLOCKS;
    for block in 0..BLOCKS {
        raw_hops(&server, runner, &format!("hops-{block}"), rounds, &mut h);
        let one = client(&server);
        let name = format!("hops-threads-{block}");
        library_hops(&server, [one.clone(), one], &name, rounds, &mut threads);
        let two = [client(&server), client(&server)];
        library_hops(
            &server,
            two,
            &format!("hops-clients-{block}"),
            rounds,
            &mut procs,
        );
    }

    let (ping, ping_p90) = p50_p90(&mut h.ping);
    let of = |v: &[ScriptCost], f: fn(&ScriptCost) -> u64| -> Vec<f64> {
        v.iter().map(|s| f(s) as f64).collect()
    };
    let mut rows = vec![format!(
        "| PING round trip (the unit) | {ping:.1} | {ping_p90:.1} | 1.00 | `Instant`s around `PING` on the releaser's connection |"
    )];
    let mut add = |what: &str, mut v: Vec<f64>, how: &str| -> f64 {
        let (p50, line) = row(what, &mut v, ping, how);
        rows.push(line);
        p50
    };
    let release_rtt = add(
        "1. release: round trip seen by the releaser",
        h.release_rtt.clone(),
        "`Instant`s around `RawLock::release(..).run(A)`",
    );
    let release_us = add(
        "1a. … the release script's server time",
        of(&h.release, |s| s.us),
        "`INFO commandstats` around it, `fcall` usec",
    );
    add(
        "1b. … of which its inner calls' own time",
        of(&h.release, |s| s.inner_us),
        "the same, the other commands' usec",
    );
    add(
        "1c. … the rest: network, protocol, client (1 − 1a)",
        h.release_rtt
            .iter()
            .zip(&h.release)
            .map(|(rtt, s)| rtt - s.us as f64)
            .collect(),
        "per round",
    );
    let push = add(
        "2. push: release sent → the waiter's `BLPOP` returned",
        h.sent_to_pop.clone(),
        "`Instant`s on the two threads",
    );
    add(
        "2a. … release reply read → `BLPOP` returned (< 0: the waiter first)",
        h.reply_to_pop.clone(),
        "the same",
    );
    add(
        "2b. … serving the `BLPOP` on the server",
        h.blpop_us.clone(),
        "`SLOWLOG` rounds, the `BLPOP` entry",
    );
    add(
        "3. next round's queueing acquire: round trip",
        h.queue_rtt.clone(),
        "`Instant`s around `RawLock::acquire(..).run(A)`",
    );
    add(
        "3a. … the acquire script's server time",
        of(&h.queue, |s| s.us),
        "`INFO commandstats` around it",
    );
    add(
        "3b. … of which its inner calls' own time",
        of(&h.queue, |s| s.inner_us),
        "the same",
    );
    add(
        "1'. release round trip, `SLOWLOG` at 0",
        h.logged_release_rtt.clone(),
        "`SLOWLOG` rounds",
    );
    add(
        "1a'. … the release script's server time, `SLOWLOG` at 0",
        of(&h.logged_release, |s| s.us),
        "`SLOWLOG`, the `FCALL` entry",
    );
    add(
        "1b'. … of which its inner calls' own time",
        of(&h.logged_release, |s| s.inner_us),
        "`SLOWLOG`, the entries of client `?:0` before it",
    );
    add(
        "3a'. queueing acquire's server time, `SLOWLOG` at 0",
        of(&h.logged_queue, |s| s.us),
        "`SLOWLOG`, the `FCALL` entry",
    );
    add(
        "3b'. … of which its inner calls' own time",
        of(&h.logged_queue, |s| s.inner_us),
        "`SLOWLOG`, the entries of client `?:0` before it",
    );
    let lib_threads = add(
        "4. library, thread → thread (one `LockClient`): `unlock` called → the waiter's `lock()` returned",
        threads.handoff.clone(),
        "`Instant`s on the two threads",
    );
    add(
        "4a. … the `unlock` call",
        threads.unlock.clone(),
        "`Instant`s around `LockGuard::unlock`",
    );
    let lib_procs = add(
        "5. library, a client per thread (as two processes): the same",
        procs.handoff.clone(),
        "`Instant`s on the two threads",
    );
    add(
        "5a. … the `unlock` call",
        procs.unlock.clone(),
        "`Instant`s around `LockGuard::unlock`",
    );
    for (what, lib) in [("4b", &threads), ("5b", &procs)] {
        let (calls, us) = lib.scripts_per_handoff();
        rows.push(format!(
            "| {what}. … script calls per hand-off, and their server time | {calls:.2} calls, {us:.1} µs | | {:.2} | `INFO commandstats` over the runs, per hand-off |",
            us / ping
        ));
    }
    rows.push(format!(
        "| 4 − 2: what the raw hops leave unexplained, thread → thread | {:.1} | | {:.2} | difference of the medians |",
        lib_threads - push,
        (lib_threads - push) / ping
    ));
    rows.push(format!(
        "| 5 − 2: the same, a client per thread | {:.1} | | {:.2} | difference of the medians |",
        lib_procs - push,
        (lib_procs - push) / ping
    ));
    let calls = |v: &[ScriptCost]| p50_p90(&mut of(v, |s| s.inner));
    let (calls_release, calls_release_p90) = calls(&h.release);
    let (calls_queue, calls_queue_p90) = calls(&h.queue);
    let (logged_release, _) = calls(&h.logged_release);
    let (logged_queue, _) = calls(&h.logged_queue);
    let names = |s: &ScriptCost| s.names.join(" ");

    println!(
        "\n{ROUNDS} hand-offs of each kind in {BLOCKS} blocks (after {WARM_UP} a block not counted), redis-server {version} on loopback, {runner:?}\n"
    );
    println!("| hop | median µs | p90 µs | median / PING | measured by |");
    println!("|---|---:|---:|---:|---|");
    for r in &rows {
        println!("{r}");
    }
    println!(
        "\ninner calls (INFO commandstats): the release script {calls_release} (p90 \
         {calls_release_p90}), the queueing acquire {calls_queue} (p90 {calls_queue_p90}); \
         in the SLOWLOG: {logged_release} and {logged_queue}"
    );
    println!(
        "  last release: {}",
        names(h.logged_release.last().unwrap())
    );
    println!(
        "  last queueing acquire: {}",
        names(h.logged_queue.last().unwrap())
    );
    println!(
        "release round trip {release_rtt:.1} µs, of which the script {release_us:.1} µs \
         ({:.0} %)",
        100.0 * release_us / release_rtt
    );
}
