//! The `fairlock` command-line tool, run as a real process against a real redis-server.
//!
//! Each test starts its own server on a free loopback port. Every wait is bounded; the only
//! timing assertions are generous upper bounds (and one lower bound that `--wait` guarantees).

use crate::support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{eventually, Out, Proc, RedisServer};

const BIN: &str = env!("CARGO_BIN_EXE_fairlock");
/// Upper bound for any one fairlock process in these tests.
const LIMIT: Duration = Duration::from_secs(20);

/// `fairlock` pointed at `server` through FAIRLOCK_REDIS_URL, with backtraces on (so a panic
/// would show), stdin closed, stderr collected.
fn fairlock(server: &RedisServer) -> Command {
    fairlock_at(&server.url())
}

fn fairlock_at(url: &str) -> Command {
    let mut c = Command::new(BIN);
    c.env("FAIRLOCK_REDIS_URL", url)
        .env("RUST_BACKTRACE", "1")
        .stdin(Stdio::null())
        .stderr(Stdio::piped());
    c
}

/// A URL where nothing listens.
fn dead_url() -> String {
    format!("redis://127.0.0.1:{}/", support::free_port())
}

fn run_out(cmd: &mut Command) -> Out {
    Proc::spawn(cmd).finish(LIMIT)
}

/// Exactly one line on stderr, from fairlock, and no trace of a panic.
fn assert_one_line(out: &Out) {
    let lines: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| !l.trim().is_empty())
        .collect();
    assert_eq!(
        lines.len(),
        1,
        "expected one line on stderr, got {:?}",
        out.stderr
    );
    assert!(lines[0].starts_with("fairlock: "), "{:?}", out.stderr);
    let lower = out.stderr.to_lowercase();
    assert!(
        !lower.contains("panic") && !lower.contains("backtrace"),
        "{:?}",
        out.stderr
    );
}

/// A process exists and is not a zombie.
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z'),
        Err(_) => false,
    }
}

const SECOND: Duration = Duration::from_secs(1);

#[test]
fn run_passes_exit_code_and_environment_and_releases() {
    let server = RedisServer::start();
    let lock = support::client(&server).fair_lock("job").unwrap();

    let out = run_out(fairlock(&server).args([
        "run",
        "job",
        "--",
        "sh",
        "-c",
        "echo \"$FAIRLOCK_NAME|$FAIRLOCK_TOKEN|$FAIRLOCK_OWNER\"; exit 7",
    ]));
    assert_eq!(out.code, Some(7), "stderr: {}", out.stderr);
    assert_eq!(
        out.stderr, "",
        "silent on success when stderr is not a terminal"
    );
    let fields: Vec<&str> = out.stdout.trim().split('|').collect();
    assert_eq!(fields[0], "job", "{:?}", out.stdout);
    // tokens are time-seeded (server µs): only their order is known, not their values
    let first: u64 = fields[1].parse().expect("FAIRLOCK_TOKEN is a number");
    assert!(first > 0, "{:?}", out.stdout);
    let (client_id, thread) = fields[2].split_once(':').expect("owner flag id:thread");
    assert!(client_id.len() == 32 && client_id.chars().all(|c| c.is_ascii_hexdigit()));
    assert!(thread.parse::<u64>().is_ok(), "{:?}", fields[2]);
    assert!(
        !lock.is_locked().unwrap(),
        "released after the command exited"
    );

    // the next hold gets a greater fencing token; commands without `--` work too
    let out = run_out(fairlock(&server).args(["run", "job", "sh", "-c", "echo $FAIRLOCK_TOKEN"]));
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let second: u64 = out
        .stdout
        .trim()
        .parse()
        .expect("FAIRLOCK_TOKEN is a number");
    assert!(second > first, "{second} after {first}");

    // a command killed by a signal: 128 + signal, as a shell reports it
    let out = run_out(fairlock(&server).args(["run", "job", "--", "sh", "-c", "kill -KILL $$"]));
    assert_eq!(out.code, Some(128 + 9));

    // a command that cannot be started: 127 / 126, one line, lock released
    let out = run_out(fairlock(&server).args(["run", "job", "--", "/nonexistent/command"]));
    assert_eq!(out.code, Some(127));
    assert_one_line(&out);
    let dir = std::env::temp_dir();
    let out = run_out(fairlock(&server).args(["run", "job", "--"]).arg(&dir));
    assert_eq!(out.code, Some(126));
    assert_one_line(&out);
    assert!(!lock.is_locked().unwrap());
    // the three runs after the second each held the lock (a new token each), even the ones
    // whose command was killed or never started; tokens are not dense, so the counter can only
    // be compared with the last token seen
    assert!(lock.status().unwrap().fencing_counter > second);
}

#[test]
fn busy_lock_exits_75_or_the_busy_exit_code() {
    let server = RedisServer::start();
    let lock = support::client(&server).fair_lock("job").unwrap();
    let guard = lock.lock().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let marker = tmp.path().join("busy-marker");
    let touch = |cmd: &mut Command| {
        cmd.arg("--").arg("touch").arg(&marker);
    };

    let mut cmd = fairlock(&server);
    cmd.args(["run", "--no-wait", "job"]);
    touch(&mut cmd);
    let out = run_out(&mut cmd);
    assert_eq!(out.code, Some(75));
    assert_one_line(&out);
    assert!(out.stderr.contains("busy"), "{}", out.stderr);
    let me = format!("pid {}", std::process::id());
    assert!(out.stderr.contains(&me), "names the holder: {}", out.stderr);

    let mut cmd = fairlock(&server);
    cmd.args(["run", "--no-wait", "--busy-exit-code", "0", "job"]);
    touch(&mut cmd);
    assert_eq!(run_out(&mut cmd).code, Some(0));

    let mut cmd = fairlock(&server);
    cmd.args(["run", "-q", "--no-wait", "job"]);
    touch(&mut cmd);
    let out = run_out(&mut cmd);
    assert_eq!((out.code, out.stderr.as_str()), (Some(75), ""));

    let started = Instant::now();
    let mut cmd = fairlock(&server);
    cmd.args(["run", "--wait", "300ms", "job"]);
    touch(&mut cmd);
    let out = run_out(&mut cmd);
    assert_eq!(out.code, Some(75));
    assert_one_line(&out);
    assert!(out.stderr.contains("gave up waiting"), "{}", out.stderr);
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(!marker.exists(), "the command never ran");

    let out = run_out(fairlock(&server).args(["hold", "--no-wait", "job"]));
    assert_eq!(out.code, Some(75));
    assert_eq!(
        lock.status().unwrap().waiters.len(),
        0,
        "nobody left in the queue"
    );

    guard.unlock().unwrap();
    let mut cmd = fairlock(&server);
    cmd.args(["run", "--no-wait", "job"]);
    touch(&mut cmd);
    assert_eq!(run_out(&mut cmd).code, Some(0));
    assert!(marker.exists());
}

#[test]
fn signals_are_forwarded_and_the_lock_released_after_the_command() {
    let server = RedisServer::start();
    let lock = support::client(&server).fair_lock("job").unwrap();
    let script = "trap 'echo got-int' INT; trap 'echo got-term; exit 3' TERM; echo ready; \
                  while :; do sleep 0.05; done";
    let mut p = Proc::spawn(fairlock(&server).args(["run", "job", "--", "sh", "-c", script]));
    p.expect("ready", LIMIT);
    p.signal(libc::SIGINT);
    p.expect("got-int", LIMIT);
    assert!(
        lock.is_locked().unwrap(),
        "still held: the command still runs"
    );
    p.signal(libc::SIGTERM);
    let out = p.finish(LIMIT);
    assert_eq!(
        out.code,
        Some(3),
        "the command's own exit code; {}",
        out.stderr
    );
    assert!(out.stdout.contains("got-term"));
    assert!(!lock.is_locked().unwrap());
}

#[test]
fn sigterm_while_waiting_gives_up_the_queue_place() {
    let server = RedisServer::start();
    let lock = support::client(&server).fair_lock("job").unwrap();
    let guard = lock.lock().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let marker = tmp.path().join("waiting-marker");
    let p = Proc::spawn(
        fairlock(&server)
            .args(["run", "job", "--", "touch"])
            .arg(&marker),
    );
    assert!(support::queued(&lock, 1, LIMIT));
    p.signal(libc::SIGTERM);
    let out = p.finish(LIMIT);
    assert_eq!(out.code, Some(128 + 15));
    assert_one_line(&out);
    assert!(out.stderr.contains("gave up waiting"), "{}", out.stderr);
    assert!(
        lock.status().unwrap().waiters.is_empty(),
        "left the queue at once"
    );
    guard.unlock().unwrap();
    assert!(
        !lock.is_locked().unwrap(),
        "not granted to the departed waiter"
    );
    assert!(!marker.exists());
}

#[test]
fn killed_fairlock_stops_its_command_and_the_lease_frees_the_lock() {
    let server = RedisServer::start();
    let script = "echo \"pid $$\"; while :; do sleep 0.05; done";
    let mut p = Proc::spawn(
        fairlock(&server).args(["run", "--lease", "1s", "job", "--", "sh", "-c", script]),
    );
    let child: u32 = p.expect("pid", LIMIT).parse().unwrap();
    p.signal(libc::SIGKILL);
    assert_eq!(p.finish(LIMIT).code, None, "killed by the signal");
    assert!(
        eventually(5 * SECOND, || !alive(child)),
        "the command ends with fairlock"
    );
    // the lock was never released: the next run gets it once the 1 s lease runs out
    let started = Instant::now();
    let out = run_out(fairlock(&server).args(["run", "--wait", "15s", "job", "--", "true"]));
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        started.elapsed() < 8 * SECOND,
        "took {:?}",
        started.elapsed()
    );
}

#[test]
fn lost_lock_stops_the_command_and_exits_79() {
    let server = RedisServer::start();
    // the command stops on SIGTERM
    let script = "trap 'echo got-term; exit 0' TERM; echo ready; while :; do sleep 0.05; done";
    let mut p = Proc::spawn(
        fairlock(&server).args(["run", "--lease", "1s", "job", "--", "sh", "-c", script]),
    );
    p.expect("ready", LIMIT);
    let released = run_out(fairlock(&server).args(["release", "job", "--force"]));
    assert_eq!(released.code, Some(0), "{}", released.stderr);
    assert!(
        released.stdout.contains("released lock \"job\""),
        "{}",
        released.stdout
    );
    assert!(
        released.stdout.contains(&format!("pid {}", p.pid())),
        "says who held it: {}",
        released.stdout
    );
    let out = p.finish(LIMIT);
    assert_eq!(out.code, Some(79), "{}", out.stderr);
    assert!(out.stdout.contains("got-term"));
    assert!(out.stderr.contains("lost lock \"job\""), "{}", out.stderr);

    // the command ignores SIGTERM: SIGKILL after --kill-grace
    let script = "trap '' TERM; echo ready; while :; do sleep 0.05; done";
    let mut p = Proc::spawn(fairlock(&server).args([
        "run",
        "--lease",
        "1s",
        "--kill-grace",
        "500ms",
        "job",
        "--",
        "sh",
        "-c",
        script,
    ]));
    p.expect("ready", LIMIT);
    let released = run_out(fairlock(&server).args(["release", "job", "--force"]));
    assert_eq!(released.code, Some(0));
    let out = p.finish(LIMIT);
    assert_eq!(out.code, Some(79), "{}", out.stderr);
    assert!(out.stderr.contains("SIGKILL"), "{}", out.stderr);

    // nothing left to release
    let out = run_out(fairlock(&server).args(["release", "job", "--force"]));
    assert_eq!(out.code, Some(0));
    assert!(out.stdout.contains("was free"), "{}", out.stdout);
}

#[test]
fn redis_unreachable_past_the_lease_is_a_lost_lock() {
    let mut server = RedisServer::start();
    let script = "trap 'echo got-term; exit 0' TERM; echo ready; while :; do sleep 0.05; done";
    let mut p = Proc::spawn(
        fairlock(&server).args(["run", "--lease", "1s", "job", "--", "sh", "-c", script]),
    );
    p.expect("ready", LIMIT);
    server.stop();
    let out = p.finish(LIMIT);
    assert_eq!(out.code, Some(79), "{}", out.stderr);
    assert!(out.stdout.contains("got-term"));
    assert!(out.stderr.contains("lost lock"), "{}", out.stderr);
}

#[test]
fn waiting_runs_are_served_in_arrival_order() {
    let server = RedisServer::start();
    let lock = support::client(&server).fair_lock("job").unwrap();
    let guard = lock.lock().unwrap();
    let held_token = guard.fencing_token();
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("fifo-log");
    // $0 is the run's number; start and end lines must pair up if runs never overlap
    let script =
        "echo \"start $0 $FAIRLOCK_TOKEN\" >> \"$1\"; sleep 0.1; echo \"end $0\" >> \"$1\"";
    let mut procs = Vec::new();
    for i in 0..4 {
        let p = Proc::spawn(
            fairlock(&server)
                .args(["run", "job", "--", "sh", "-c", script, &i.to_string()])
                .arg(&log),
        );
        assert!(
            support::queued(&lock, i + 1, LIMIT),
            "run {i} did not queue"
        );
        procs.push(p);
    }
    let queued: Vec<u32> = support::queue_pids(&lock);
    let pids: Vec<u32> = procs.iter().map(Proc::pid).collect();
    assert_eq!(queued, pids, "queue order is arrival order");
    guard.unlock().unwrap();
    for p in procs {
        let out = p.finish(LIMIT);
        assert_eq!(out.code, Some(0), "{}", out.stderr);
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 8, "{text}");
    let mut last_token = held_token; // the runs come after the test's own hold
    for i in 0..4 {
        let start: Vec<&str> = lines[2 * i].split(' ').collect();
        assert_eq!(start[..2], ["start", &i.to_string()], "{text}");
        let token: u64 = start[2].parse().unwrap();
        assert!(token > last_token, "tokens increase: {text}");
        last_token = token;
        assert_eq!(lines[2 * i + 1], format!("end {i}"), "{text}");
    }
}

#[test]
fn status_shows_holder_and_waiters_as_text_and_json() {
    let server = RedisServer::start();
    let lock = support::client(&server).fair_lock("job").unwrap();
    let hold = Proc::spawn(fairlock(&server).args(["hold", "--lease", "5s", "job"]));
    assert!(eventually(LIMIT, || lock.is_locked().unwrap()));
    let waiter = Proc::spawn(fairlock(&server).args(["run", "job", "--", "echo", "done"]));
    assert!(support::queued(&lock, 1, LIMIT));

    let out = run_out(fairlock(&server).args(["status", "job", "--json"]));
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).expect("status --json is JSON");
    assert_eq!(v["name"], "job");
    assert_eq!(v["locked"], true);
    // the hold's token is the last one handed out (tokens are time-seeded, so not 1)
    let held_token = v["fencing_counter"]
        .as_u64()
        .expect("fencing_counter is a u64");
    assert!(held_token > 0);
    let h = &v["holder"];
    assert_eq!(h["pid"], hold.pid());
    assert_eq!(h["thread"], "hold");
    assert!(!h["host"].as_str().unwrap().is_empty());
    assert!(h["owner"].as_str().unwrap().contains(':'));
    assert_eq!(h["hold_count"], 1);
    assert_eq!(h["fencing_token"].as_u64(), Some(held_token));
    let lease = h["lease_remaining_ms"].as_u64().unwrap();
    assert!(lease > 0 && lease <= 5000, "{lease}");
    assert_eq!(h["lease_ms"], 5000, "the hold's lease is --lease");
    assert!(h["held_for_ms"].as_u64().unwrap() < 60_000);
    assert!(h["since_unix_ms"].as_u64().unwrap() > 1_600_000_000_000);
    let w = v["waiters"].as_array().unwrap();
    assert_eq!(w.len(), 1);
    assert_eq!(w[0]["position"], 1);
    assert_eq!(w[0]["pid"], waiter.pid());
    assert_eq!(w[0]["thread"], "run: echo done");
    assert!(w[0]["waiting_for_ms"].as_u64().is_some());

    let out = run_out(fairlock(&server).args(["status", "job"]));
    assert_eq!(out.code, Some(0));
    assert!(
        out.stdout.starts_with("lock \"job\": held"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains(&format!("pid {}", hold.pid())));
    assert!(out.stdout.contains("1. ") && out.stdout.contains(&format!("pid {}", waiter.pid())));

    hold.signal(libc::SIGINT);
    let out = hold.finish(LIMIT);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        out.stderr.contains(&format!(
            "holding lock \"job\" (fencing token {held_token})"
        )),
        "{}",
        out.stderr
    );
    let out = waiter.finish(LIMIT);
    assert_eq!((out.code, out.stdout.trim()), (Some(0), "done"));

    let out = run_out(fairlock(&server).args(["status", "--json", "job"]));
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["locked"], false);
    assert!(v["holder"].is_null());
    // the waiter's run was the one hold after it
    let counter = v["fencing_counter"]
        .as_u64()
        .expect("fencing_counter is a u64");
    assert!(counter > held_token, "{counter} after {held_token}");
    assert_eq!(v["waiters"].as_array().unwrap().len(), 0);
}

#[test]
fn bad_arguments_exit_64_with_one_line() {
    // nothing listens at the URL: arguments are checked before Redis is contacted
    let url = dead_url();
    let cases: &[&[&str]] = &[
        &[],
        &["frobnicate"],
        &["run"],
        &["run", "job"],
        &["run", "job", "--wait", "5x", "--", "true"],
        &["run", "job", "--wait", "500", "--", "true"],
        &["run", "job", "--wait", "5s", "--no-wait", "--", "true"],
        &["run", "job", "--lease", "1ms", "--", "true"],
        &["run", "job", "--busy-exit-code", "300", "--", "true"],
        &["run", "job", "--wiat", "5s", "--", "true"],
        &["run", "a{b}", "--", "true"],
        &["status"],
        &["status", ""],
        &["release", "job"],
        &["hold", "job", "--kill-grace", "1s"],
        &["--redis", "http://localhost", "status", "job"],
    ];
    for args in cases {
        let out = run_out(fairlock_at(&url).args(*args));
        assert_eq!(out.code, Some(64), "{args:?}: {}", out.stderr);
        assert_one_line(&out);
        assert_eq!(out.stdout, "", "{args:?}");
    }
    let out = run_out(fairlock_at(&url).arg("--help"));
    assert_eq!(out.code, Some(0));
    assert!(out.stdout.contains("run") && out.stdout.contains("status"));
    let out = run_out(fairlock_at(&url).args(["run", "--help"]));
    assert_eq!(out.code, Some(0));
    assert!(out.stdout.contains("--busy-exit-code"));
}

#[test]
fn unreachable_server_exits_69_and_redis_url_comes_from_flag_or_env() {
    let server = RedisServer::start();
    let dead = dead_url();
    let cases: &[&[&str]] = &[
        &["status", "job"],
        &["release", "job", "--force"],
        &["run", "job", "--", "true"],
        &["hold", "job"],
    ];
    for args in cases {
        let out = run_out(fairlock_at(&dead).args(*args));
        assert_eq!(out.code, Some(69), "{args:?}: {}", out.stderr);
        assert_one_line(&out);
        assert!(out.stderr.contains("Redis"), "{}", out.stderr);
    }
    // --redis wins over FAIRLOCK_REDIS_URL
    let out = run_out(fairlock(&server).args(["--redis", &dead, "status", "job"]));
    assert_eq!(out.code, Some(69));
    let out = run_out(fairlock_at(&dead).args(["status", "job", "--redis", &server.url()]));
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    // FAIRLOCK_REDIS_URL alone
    let out = run_out(fairlock(&server).args(["status", "job"]));
    assert_eq!(out.code, Some(0));
    assert!(
        out.stdout.starts_with("lock \"job\": free"),
        "{}",
        out.stdout
    );
}

/// A password in the URL never reaches the output, whatever goes wrong (the URL does not
/// parse, nobody listens, the password is refused).
#[test]
fn the_password_in_the_url_is_never_printed() {
    const SECRET: &str = "supersecret-51c9";
    let server = RedisServer::start();
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "requirepass", "the-right-one"])
        .query(&mut server.conn())
        .unwrap();
    let port = support::free_port();
    for url in [
        format!("redis://u:{SECRET}@127.0.0.1:notaport/"),
        format!("redis://u:{SECRET}@127.0.0.1:{port}/"),
        format!("redis+sentinel://u:{SECRET}@127.0.0.1:{port}/"),
        format!("redis://default:{SECRET}@127.0.0.1:{}/", server.port),
    ] {
        for args in [&["run", "job", "--", "true"][..], &["status", "job"]] {
            let out = run_out(fairlock_at(&url).args(args));
            assert_ne!(out.code, Some(0), "{url} {args:?}");
            assert_one_line(&out);
            for text in [&out.stdout, &out.stderr] {
                assert!(!text.contains(SECRET), "{args:?}: {text}");
            }
        }
    }
}

/// Before, a password with reserved characters typed as they are (`/`, `?`, `#`, `@`, `%`...) made
/// the URL unparsable, and every command printed it whole in the error. Every URL form, the fixed
/// passwords and generated ones: neither stdout nor stderr shows any of it.
#[test]
fn a_password_with_reserved_characters_is_never_printed_by_the_cli() {
    use proptest::test_runner::{Config, TestCaseError, TestRunner};
    use support::passwords;
    let dead = support::free_port();
    let try_one = |pw: String| -> Result<(), TestCaseError> {
        for url in passwords::urls(&pw, dead) {
            let out = run_out(fairlock_at(&url).args(["status", "x"]));
            proptest::prop_assert_ne!(out.code, Some(0), "{} connected", url);
            passwords::check("stdout", &url, &out.stdout)?;
            passwords::check("stderr", &url, &out.stderr)?;
        }
        Ok(())
    };
    for pw in passwords::fixed() {
        try_one(pw).unwrap();
    }
    // each case runs a dozen processes
    let mut runner = TestRunner::new(Config {
        cases: 8,
        failure_persistence: None,
        ..Config::default()
    });
    runner.run(&passwords::passwords(), try_one).unwrap();
}

/// Each stop and continue of a waiting process (Ctrl-Z and `fg`, a debugger, a cgroup freeze) makes
/// its blocked read fail with EINTR. Before, the wait gave up at the third such hiccup in its whole
/// life (the failure count was never reset), dropping the queue place. A signal is no failure now,
/// and isolated failures do not add up.
#[test]
fn a_waiting_run_survives_being_stopped_and_continued_again_and_again() {
    let server = RedisServer::start();
    let lock = support::client(&server).fair_lock("stopped").unwrap();
    let guard = lock.lock().unwrap();
    let p = Proc::spawn(fairlock(&server).args(["run", "stopped", "--", "true"]));
    assert!(support::queued(&lock, 1, LIMIT));
    for _ in 0..5 {
        p.signal(libc::SIGSTOP);
        std::thread::sleep(Duration::from_millis(200));
        p.signal(libc::SIGCONT);
        std::thread::sleep(Duration::from_millis(400));
    }
    assert_eq!(
        lock.status().unwrap().waiters.len(),
        1,
        "the stopped waiter lost its place"
    );
    guard.unlock().unwrap();
    let out = p.finish(LIMIT);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
}

/// A managed service's default `volatile-lru`: refused with the fix (exit 78), unless the risk
/// is accepted by name, and then `status` says so in both forms.
#[test]
fn an_evicting_server_needs_the_danger_flag_and_status_says_it_was_given() {
    let server = RedisServer::start_with(&["--maxmemory-policy", "volatile-lru"]);
    let out = run_out(fairlock(&server).args(["status", "job"]));
    assert_eq!(out.code, Some(78), "{:?}", out.stderr);
    assert_one_line(&out);
    assert!(
        out.stderr.contains("--danger-accept-eviction"),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("parameter group"), "{}", out.stderr);
    let out = run_out(fairlock(&server).args(["--danger-accept-eviction", "status", "job"]));
    assert_eq!(out.code, Some(0), "{:?}", out.stderr);
    assert!(out.stdout.contains("may evict keys"), "{}", out.stdout);
    let out = run_out(
        fairlock(&server)
            .env("FAIRLOCK_DANGER_ACCEPT_EVICTION", "true")
            .args(["status", "job", "--json"]),
    );
    assert_eq!(out.code, Some(0), "{:?}", out.stderr);
    let json: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(json["eviction_accepted"], true, "{}", out.stdout);
    let out = run_out(fairlock(&server).args([
        "--danger-accept-eviction",
        "run",
        "--no-wait",
        "job",
        "--",
        "true",
    ]));
    assert_eq!(out.code, Some(0), "{:?}", out.stderr);
}

/// `--password-file`: read for every new connection (a sidecar may rewrite it); a refused
/// password exits 77 with one line that does not show it.
#[test]
fn the_password_file_is_read_and_a_refused_password_exits_77_without_showing_it() {
    let server = RedisServer::start();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("from-the-file-5e3c")
        .query(&mut server.conn())
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("password");
    std::fs::write(&file, "from-the-file-5e3c\n").unwrap();
    let out = run_out(fairlock(&server).arg("--password-file").arg(&file).args([
        "run",
        "--no-wait",
        "pw-file",
        "--",
        "true",
    ]));
    assert_eq!(out.code, Some(0), "{:?}", out.stderr);
    std::fs::write(&file, "stale-token-9d1f\n").unwrap();
    let out = run_out(
        fairlock(&server)
            .env("FAIRLOCK_PASSWORD_FILE", &file)
            .args(["status", "pw-file"]),
    );
    assert_eq!(out.code, Some(77), "{:?}", out.stderr);
    assert_one_line(&out);
    assert!(out.stderr.contains("credentials"), "{}", out.stderr);
    assert!(!out.stderr.contains("stale-token"), "{}", out.stderr);
}

/// Before, with `--password-file` the user name was cut out of the URL still percent-encoded, so
/// `ops%40team` was sent for the user `ops@team` and refused, where the same URL with the password
/// in it logs in.
#[test]
fn the_password_file_logs_in_a_user_whose_name_is_percent_encoded_in_the_url() {
    let server = RedisServer::start();
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "ops@team",
            "on",
            ">filepw-0c4e",
            "~*",
            "&*",
            "+@all",
        ])
        .query(&mut server.conn())
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("password");
    std::fs::write(&file, "filepw-0c4e\n").unwrap();
    let inline = format!("redis://ops%40team:filepw-0c4e@127.0.0.1:{}/", server.port);
    let out = run_out(fairlock_at(&inline).args(["status", "x"]));
    assert_eq!(
        out.code,
        Some(0),
        "the password in the URL: {:?}",
        out.stderr
    );
    let url = format!("redis://ops%40team@127.0.0.1:{}/", server.port);
    let out = run_out(
        fairlock_at(&url)
            .arg("--password-file")
            .arg(&file)
            .args(["status", "x"]),
    );
    assert_eq!(out.code, Some(0), "--password-file: {:?}", out.stderr);
    let out = run_out(fairlock_at(&url).arg("--password-file").arg(&file).args([
        "run",
        "--no-wait",
        "x",
        "--",
        "true",
    ]));
    assert_eq!(
        out.code,
        Some(0),
        "run with --password-file: {:?}",
        out.stderr
    );
}

/// Before, a user refused `INFO` ran on an `allkeys-lru` server silently (exit 0) where the default
/// user is refused (exit 78): the check was skipped with a log line the tool never showed. Now
/// `CONFIG GET maxmemory-policy` checks it (exit 78); when that is refused too, the tool runs and
/// says on stderr what it could not check.
#[test]
fn a_user_refused_info_is_refused_an_evicting_server_or_warned_on_stderr() {
    let server = RedisServer::start_with(&["--maxmemory-policy", "allkeys-lru"]);
    for (user, rules) in [
        ("noinfo", &["-info"][..]),
        ("neither", &["-info", "-config"]),
    ] {
        let _: () = redis::cmd("ACL")
            .arg(&["SETUSER", user, "on", ">pw", "~*", "&*", "+@all"])
            .arg(rules)
            .query(&mut server.conn())
            .unwrap();
    }
    let url = |user: &str| format!("redis://{user}:pw@127.0.0.1:{}/", server.port);
    let run = ["run", "--permits", "2", "semx", "--", "true"];
    for args in [&run[..], &["status", "x"]] {
        let out = run_out(fairlock_at(&url("noinfo")).args(args));
        assert_eq!(out.code, Some(78), "{args:?}: {:?}", out.stderr);
        assert_one_line(&out);
        assert!(out.stderr.contains("allkeys-lru"), "{}", out.stderr);

        let out = run_out(fairlock_at(&url("neither")).args(args));
        assert_eq!(out.code, Some(0), "{args:?}: {:?}", out.stderr);
        assert!(
            out.stderr.contains("warning") && out.stderr.contains("maxmemory-policy"),
            "{args:?} says nothing of the check it skipped: {:?}",
            out.stderr
        );
    }
}

/// `run --permits 2`: three runs at once, at most two commands inside at any moment (each
/// command appends `start` and `end` lines to one file; the file's order is the order of the
/// writes), all three run, and `status --semaphore` shows the holders with their permits and the
/// waiter with the permits it wants.
#[test]
fn run_with_permits_lets_at_most_that_many_commands_run_at_once() {
    let server = RedisServer::start();
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("log");
    let gate = tmp.path().join("gate");
    // each command waits for the gate file (bounded), so the third run must queue
    let script = format!(
        "echo start >> {log}; i=0; while [ ! -e {gate} ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; echo end >> {log}",
        log = log.display(),
        gate = gate.display()
    );
    let runs: Vec<Proc> = (0..3)
        .map(|_| {
            Proc::spawn(fairlock(&server).args([
                "run",
                "--permits",
                "2",
                "slots",
                "--",
                "sh",
                "-c",
                &script,
            ]))
        })
        .collect();
    let sem = support::client(&server).semaphore("slots", 2).unwrap();
    assert!(
        eventually(LIMIT, || {
            let st = sem.status().unwrap();
            st.holders.len() == 2 && st.waiters.len() == 1
        }),
        "two hold, one waits: {:?}",
        sem.status()
    );
    let json = run_out(fairlock(&server).args(["status", "--semaphore", "--json", "slots"]));
    assert_eq!(json.code, Some(0), "{}", json.stderr);
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(v["capacity"], 2);
    assert_eq!(v["permits_held"], 2);
    assert_eq!(v["holders"].as_array().unwrap().len(), 2);
    assert_eq!(v["waiters"][0]["permits"], 1);
    let text = run_out(fairlock(&server).args(["status", "--semaphore", "slots"]));
    assert!(
        text.stdout.contains("2 of 2 permits held"),
        "{}",
        text.stdout
    );
    assert!(text.stdout.contains("wants 1"), "{}", text.stdout);
    // a handle with another capacity is refused, with exit code 64 and one line
    let other = run_out(fairlock(&server).args([
        "run",
        "--permits",
        "3",
        "--no-wait",
        "slots",
        "--",
        "true",
    ]));
    assert_eq!(other.code, Some(64), "{}", other.stderr);
    assert_one_line(&other);
    assert!(
        other.stderr.contains("give --permits 2"),
        "{}",
        other.stderr
    );

    std::fs::write(&gate, "").unwrap();
    for p in runs {
        let out = p.finish(LIMIT);
        assert_eq!(out.code, Some(0), "{}", out.stderr);
    }
    let lines = std::fs::read_to_string(&log).unwrap();
    let (mut inside, mut most, mut runs) = (0, 0, 0);
    for line in lines.lines() {
        match line {
            "start" => {
                inside += 1;
                runs += 1;
            }
            "end" => inside -= 1,
            other => panic!("{other:?}"),
        }
        most = most.max(inside);
    }
    assert_eq!((runs, most), (3, 2), "{lines}");
}

/// `release --force --hold ID` takes one holder's permits: its run is told the permits are
/// lost (exit 79) while the other holder runs on, and the waiter gets the freed permit.
#[test]
fn release_force_hold_releases_one_holder_of_a_semaphore() {
    let server = RedisServer::start();
    let script = "trap 'echo got-term; exit 0' TERM; echo ready; i=0; while [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done";
    let mut a = Proc::spawn(fairlock(&server).args([
        "run",
        "--lease",
        "1s",
        "--permits",
        "2",
        "slots",
        "--",
        "sh",
        "-c",
        script,
    ]));
    a.expect("ready", LIMIT);
    let mut b = Proc::spawn(fairlock(&server).args([
        "run",
        "--lease",
        "1s",
        "--permits",
        "2",
        "slots",
        "--",
        "sh",
        "-c",
        script,
    ]));
    b.expect("ready", LIMIT);
    let sem = support::client(&server).semaphore("slots", 2).unwrap();
    let st = sem.status().unwrap();
    let a_hold = st
        .holders
        .iter()
        .find(|h| h.origin.pid == a.pid())
        .expect("a holds")
        .hold_id
        .clone();
    let released =
        run_out(fairlock(&server).args(["release", "--force", "--hold", &a_hold, "slots"]));
    assert_eq!(released.code, Some(0), "{}", released.stderr);
    assert!(
        released.stdout.contains(&format!("pid {}", a.pid())),
        "{}",
        released.stdout
    );
    let out = a.finish(LIMIT);
    assert_eq!(out.code, Some(79), "{}", out.stderr);
    assert!(
        out.stderr.contains("lost semaphore \"slots\""),
        "{}",
        out.stderr
    );
    // b holds on
    let st = sem.status().unwrap();
    assert_eq!(st.holders.len(), 1);
    assert_eq!(st.holders[0].origin.pid, b.pid());
    let again = run_out(fairlock(&server).args(["release", "--force", "--hold", &a_hold, "slots"]));
    assert!(
        again.stdout.contains("nothing to release"),
        "{}",
        again.stdout
    );
    b.signal(libc::SIGTERM);
    assert_eq!(b.finish(LIMIT).code, Some(0));
}

/// SIGTERM while `run --permits` waits gives the queue place up at once (the semaphore's wait
/// canceller), and the command never runs.
#[test]
fn sigterm_while_waiting_for_permits_gives_up_the_queue_place() {
    let server = RedisServer::start();
    let sem = support::client(&server).semaphore("slots", 1).unwrap();
    let held = sem.acquire().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let marker = tmp.path().join("marker");
    let p = Proc::spawn(
        fairlock(&server)
            .args(["run", "--permits", "1", "slots", "--", "touch"])
            .arg(&marker),
    );
    assert!(eventually(LIMIT, || sem.status().unwrap().waiters.len() == 1));
    p.signal(libc::SIGTERM);
    let out = p.finish(LIMIT);
    assert_eq!(out.code, Some(128 + 15));
    assert_one_line(&out);
    assert!(
        out.stderr
            .contains("waiting for semaphore \"slots\": gave up"),
        "{}",
        out.stderr
    );
    assert!(
        sem.status().unwrap().waiters.is_empty(),
        "left the queue at once"
    );
    held.release().unwrap();
    assert_eq!(
        sem.status().unwrap().permits_held,
        0,
        "not granted to the departed waiter"
    );
    assert!(!marker.exists());
}
