//! What one contended acquisition costs the server, for the lock and for a semaphore of capacity
//! 1 (docs/design.md, "One queue core, two admissions"): a waiter queues behind the holder (the
//! queueing acquire), then the holder releases, and the release's script grants the waiter and
//! pushes its wake-up (the release with its grant). Measured with `INFO commandstats` around each
//! of the two scripts (`CONFIG RESETSTAT` before it): the commands the script ran inside, by
//! name, and the server time of the script call. Ignored by default (it measures); run it with
//!
//! `nice -n 10 cargo test --release --all-features --test it -- --ignored --nocapture handoff_cost::`
//!
//! It fails when an acquire does not queue behind the holder, or a release does not hand the lock
//! or permit to the waiter.

use crate::support;

use std::collections::HashMap;
use std::time::Duration;

use crate::support::RedisServer;
use fairlock::raw::{
    self, Acquire, Mode, RawLock, RawSemaphore, Release, Runner, SemAcquire, SemKind, SemRelease,
    Settings, Wake,
};

const ROUNDS: u32 = 300;
const LEASE: Duration = Duration::from_secs(30);

/// `INFO commandstats` as command -> (calls, usec).
fn commandstats(c: &mut redis::Connection) -> HashMap<String, (u64, u64)> {
    support::commandstats(c)
        .into_iter()
        .map(|(name, calls, usec)| (name, (calls, usec)))
        .collect()
}

fn reset_stats(c: &mut redis::Connection) {
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query(c).unwrap();
}

/// The commands run inside the script call and its server time (us), from the stats since the
/// last reset (the script call itself: `fcall` or `evalsha`; `config`, `info` and `script`, with
/// their subcommands (`config|resetstat`, `script|load`), left out).
fn script_cost(c: &mut redis::Connection) -> (u64, u64) {
    let stats = commandstats(c);
    let mut inner = 0;
    let mut usec = 0;
    for (name, (calls, us)) in &stats {
        match name.as_str() {
            "fcall" | "evalsha" => usec += us,
            n if n.starts_with("config") || n.starts_with("info") || n.starts_with("script") => {}
            _ => inner += calls,
        }
    }
    (inner, usec)
}

/// The commands run inside the script call since the last reset, by name, sorted.
fn inner_commands(c: &mut redis::Connection) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = commandstats(c)
        .into_iter()
        .filter(|(n, _)| {
            !(matches!(n.as_str(), "fcall" | "evalsha")
                || n.starts_with("config")
                || n.starts_with("info")
                || n.starts_with("script"))
        })
        .map(|(n, (calls, _))| (n, calls))
        .collect();
    out.sort();
    out
}

/// One script's figures over the rounds.
#[derive(Default)]
struct Figures {
    commands: Vec<u64>,
    usec: Vec<u64>,
    /// the commands inside the last round's script, by name
    last: Vec<(String, u64)>,
    /// the commands inside the script, by name, summed over the rounds
    total: HashMap<String, u64>,
}

impl Figures {
    /// Record one round's run of the script, from the stats since the last reset.
    fn record(&mut self, c: &mut redis::Connection) {
        let cost = script_cost(c);
        self.last = inner_commands(c);
        for (n, calls) in &self.last {
            *self.total.entry(n.clone()).or_default() += calls;
        }
        self.commands.push(cost.0);
        self.usec.push(cost.1);
    }

    /// The commands inside the script by name, mean calls per round.
    fn by_name(&self) -> Vec<(String, f64)> {
        let rounds = self.commands.len() as f64;
        let mut out: Vec<(String, f64)> = self
            .total
            .iter()
            .map(|(n, c)| (n.clone(), *c as f64 / rounds))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    fn report(&self, what: &str) {
        let mut us = self.usec.clone();
        us.sort_unstable();
        let mean_cmds = self.commands.iter().sum::<u64>() as f64 / self.commands.len() as f64;
        let mean_us = us.iter().sum::<u64>() as f64 / us.len() as f64;
        println!(
            "{what}: {mean_cmds:.1} commands inside the script (min {}, max {}), \
             server time mean {mean_us:.1} us, median {} us, p90 {} us ({} rounds)",
            self.commands.iter().min().unwrap(),
            self.commands.iter().max().unwrap(),
            us[us.len() / 2],
            us[us.len() * 9 / 10],
            us.len()
        );
        let inner: Vec<String> = self.last.iter().map(|(n, c)| format!("{n} {c}")).collect();
        println!("  last round: {}", inner.join(", "));
        let mean: Vec<String> = self
            .by_name()
            .iter()
            .map(|(n, c)| format!("{n} {c:.2}"))
            .collect();
        println!("  mean per round: {}", mean.join(", "));
    }
}

/// The two scripts of one contended acquisition.
#[derive(Default)]
struct Acquisition {
    /// the waiter queueing behind the holder
    queue: Figures,
    /// the holder's release, with its grant to the waiter
    release: Figures,
}

/// The per-command table of the lock against the semaphore for one script.
fn compare(what: &str, lock: &Figures, sem: &Figures) {
    let l: HashMap<String, f64> = lock.by_name().into_iter().collect();
    let s: HashMap<String, f64> = sem.by_name().into_iter().collect();
    let mut names: Vec<&String> = l.keys().chain(s.keys()).collect();
    names.sort();
    names.dedup();
    println!("{what}: command | lock | semaphore(1)");
    let mut sums = (0.0, 0.0);
    for n in names {
        let (a, b) = (
            l.get(n).copied().unwrap_or(0.0),
            s.get(n).copied().unwrap_or(0.0),
        );
        sums = (sums.0 + a, sums.1 + b);
        println!("  {n:<16} | {a:>5.2} | {b:>5.2}");
    }
    println!("  {:<16} | {:>5.2} | {:>5.2}", "total", sums.0, sums.1);
}

fn settings(runner: Runner) -> Settings {
    Settings {
        runner,
        ..Settings::default()
    }
}

fn lock_handoffs(c: &mut redis::Connection, runner: Runner) -> Acquisition {
    let lock = RawLock::new(
        "fairlock",
        &format!("cost-lock-{runner:?}"),
        settings(runner),
    )
    .unwrap();
    let mut f = Acquisition::default();
    let mut attempt = 0;
    let mut holder = match lock
        .acquire("h:1", 1, LEASE, Mode::Wait, "m")
        .run(c)
        .unwrap()
    {
        Acquire::Granted(g) => (String::from("h:1"), g.token),
        other => panic!("{other:?}"),
    };
    for round in 0..ROUNDS {
        attempt += 2;
        // the other thread queues behind the holder
        let waiter = if round % 2 == 0 { "w:1" } else { "h:1" };
        reset_stats(c);
        let r = lock
            .acquire(waiter, attempt, LEASE, Mode::Wait, "m")
            .run(c)
            .unwrap();
        f.queue.record(c);
        assert!(matches!(r, Acquire::Queued { .. }), "{r:?}");
        reset_stats(c);
        let r = lock.release(&holder.0, holder.1, 1).run(c).unwrap();
        f.release.record(c);
        assert_eq!(
            r,
            Release::Released {
                next: Some(waiter.into())
            }
        );
        let msg: String = redis::cmd("LPOP")
            .arg(lock.wake_key(waiter))
            .query(c)
            .unwrap();
        match raw::parse_wake(&msg).unwrap() {
            Wake::Grant { token, .. } => holder = (waiter.into(), token),
            other => panic!("{other:?}"),
        }
    }
    f
}

fn semaphore_handoffs(c: &mut redis::Connection, runner: Runner) -> Acquisition {
    let sem = RawSemaphore::new(
        "fairlock",
        &format!("cost-sem-{runner:?}"),
        SemKind::Semaphore,
        1,
        settings(runner),
    )
    .unwrap();
    let mut f = Acquisition::default();
    let mut attempt = 1;
    let mut holder = match sem
        .acquire("h:1", attempt, 1, LEASE, Mode::Wait, "m")
        .run(c)
        .unwrap()
    {
        SemAcquire::Granted { token, .. } => (String::from("h:1"), attempt, token),
        other => panic!("{other:?}"),
    };
    for round in 0..ROUNDS {
        attempt += 1;
        let waiter = if round % 2 == 0 { "w:1" } else { "h:1" };
        reset_stats(c);
        let r = sem
            .acquire(waiter, attempt, 1, LEASE, Mode::Wait, "m")
            .run(c)
            .unwrap();
        f.queue.record(c);
        assert!(matches!(r, SemAcquire::Queued { .. }), "{r:?}");
        reset_stats(c);
        let r = sem
            .release(&holder.0, holder.1, holder.2, false)
            .run(c)
            .unwrap();
        f.release.record(c);
        assert!(matches!(r, SemRelease::Released { .. }), "{r:?}");
        let msg: String = redis::cmd("LPOP")
            .arg(sem.wake_key(waiter))
            .query(c)
            .unwrap();
        match raw::parse_wake(&msg).unwrap() {
            Wake::Grant { token, .. } => holder = (waiter.into(), attempt, token),
            other => panic!("{other:?}"),
        }
    }
    f
}

/// The median round trip of 200 PINGs, in us (the unit the server times are read against: the
/// VM's speed moves from minute to minute).
fn ping_p50(c: &mut redis::Connection) -> u128 {
    let mut rtt: Vec<u128> = (0..200)
        .map(|_| {
            let t = std::time::Instant::now();
            let _: String = redis::cmd("PING").query(c).unwrap();
            t.elapsed().as_micros()
        })
        .collect();
    rtt.sort_unstable();
    rtt[rtt.len() / 2]
}

#[test]
#[ignore = "a measurement: run with --ignored --nocapture"]
fn one_contended_acquisition_costs_the_lock_and_a_semaphore_of_one() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let runners: &[Runner] = if support::has_command(&mut c, "FCALL") {
        &[Runner::Functions, Runner::Eval]
    } else {
        &[Runner::Eval]
    };
    for &runner in runners {
        let before = ping_p50(&mut c);
        let lock = lock_handoffs(&mut c, runner);
        let sem = semaphore_handoffs(&mut c, runner);
        let after = ping_p50(&mut c);
        println!("PING p50 {before} us before, {after} us after ({runner:?})");
        lock.queue
            .report(&format!("lock ({runner:?}), queueing acquire"));
        sem.queue
            .report(&format!("semaphore(1) ({runner:?}), queueing acquire"));
        lock.release
            .report(&format!("lock ({runner:?}), release with its grant"));
        sem.release.report(&format!(
            "semaphore(1) ({runner:?}), release with its grant"
        ));
        compare(
            &format!("queueing acquire ({runner:?})"),
            &lock.queue,
            &sem.queue,
        );
        compare(
            &format!("release with its grant ({runner:?})"),
            &lock.release,
            &sem.release,
        );
    }
}
