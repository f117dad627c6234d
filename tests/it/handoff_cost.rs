//! What one contended hand-off costs the server, for the lock and for a semaphore of capacity 1
//! (docs/design.md, "One queue core, two admissions"): a holder releases while one waiter is
//! queued, and the release's script grants the waiter and pushes its wake-up. Measured with
//! `INFO commandstats` around each release (`CONFIG RESETSTAT` before it): the commands the
//! script ran inside and the server time of the script call. Ignored by default (it measures);
//! run it with
//!
//! `nice -n 10 cargo test --release --all-features --test it -- --ignored --nocapture handoff_cost::`
//!
//! It fails when a release does not hand the lock or permit to the waiter.

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
/// last reset (the script call itself: `fcall` or `evalsha`; `config` and `info`, with their
/// subcommands (`config|resetstat`), left out).
fn script_cost(c: &mut redis::Connection) -> (u64, u64) {
    let stats = commandstats(c);
    let mut inner = 0;
    let mut usec = 0;
    for (name, (calls, us)) in &stats {
        match name.as_str() {
            "fcall" | "evalsha" => usec += us,
            n if n.starts_with("config") || n.starts_with("info") => {}
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
                || n.starts_with("info"))
        })
        .map(|(n, (calls, _))| (n, calls))
        .collect();
    out.sort();
    out
}

struct Figures {
    commands: Vec<u64>,
    usec: Vec<u64>,
    /// the commands inside the last round's release script, by name
    last: Vec<(String, u64)>,
}

impl Figures {
    fn report(&self, what: &str) {
        let mut us = self.usec.clone();
        us.sort_unstable();
        let mean_cmds = self.commands.iter().sum::<u64>() as f64 / self.commands.len() as f64;
        let mean_us = us.iter().sum::<u64>() as f64 / us.len() as f64;
        println!(
            "{what}: {mean_cmds:.1} commands inside the release script (min {}, max {}), \
             server time mean {mean_us:.1} us, median {} us, p90 {} us ({} rounds)",
            self.commands.iter().min().unwrap(),
            self.commands.iter().max().unwrap(),
            us[us.len() / 2],
            us[us.len() * 9 / 10],
            us.len()
        );
        let inner: Vec<String> = self.last.iter().map(|(n, c)| format!("{n} {c}")).collect();
        println!("  last round: {}", inner.join(", "));
    }
}

fn settings(runner: Runner) -> Settings {
    Settings {
        runner,
        ..Settings::default()
    }
}

fn lock_handoffs(c: &mut redis::Connection, runner: Runner) -> Figures {
    let lock = RawLock::new(
        "fairlock",
        &format!("cost-lock-{runner:?}"),
        settings(runner),
    )
    .unwrap();
    let mut f = Figures {
        commands: vec![],
        usec: vec![],
        last: vec![],
    };
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
        let r = lock
            .acquire(waiter, attempt, LEASE, Mode::Wait, "m")
            .run(c)
            .unwrap();
        assert!(matches!(r, Acquire::Queued { .. }), "{r:?}");
        reset_stats(c);
        let r = lock.release(&holder.0, holder.1, 1).run(c).unwrap();
        let cost = script_cost(c);
        f.last = inner_commands(c);
        assert_eq!(
            r,
            Release::Released {
                next: Some(waiter.into())
            }
        );
        f.commands.push(cost.0);
        f.usec.push(cost.1);
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

fn semaphore_handoffs(c: &mut redis::Connection, runner: Runner) -> Figures {
    let sem = RawSemaphore::new(
        "fairlock",
        &format!("cost-sem-{runner:?}"),
        SemKind::Semaphore,
        1,
        settings(runner),
    )
    .unwrap();
    let mut f = Figures {
        commands: vec![],
        usec: vec![],
        last: vec![],
    };
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
        let r = sem
            .acquire(waiter, attempt, 1, LEASE, Mode::Wait, "m")
            .run(c)
            .unwrap();
        assert!(matches!(r, SemAcquire::Queued { .. }), "{r:?}");
        reset_stats(c);
        let r = sem
            .release(&holder.0, holder.1, holder.2, false)
            .run(c)
            .unwrap();
        let cost = script_cost(c);
        f.last = inner_commands(c);
        assert!(matches!(r, SemRelease::Released { .. }), "{r:?}");
        f.commands.push(cost.0);
        f.usec.push(cost.1);
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

#[test]
#[ignore = "a measurement: run with --ignored --nocapture"]
fn one_contended_hand_off_costs_the_lock_and_a_semaphore_of_one() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let runners: &[Runner] = if support::has_command(&mut c, "FCALL") {
        &[Runner::Functions, Runner::Eval]
    } else {
        &[Runner::Eval]
    };
    for &runner in runners {
        let lock = lock_handoffs(&mut c, runner);
        let sem = semaphore_handoffs(&mut c, runner);
        lock.report(&format!("lock ({runner:?})"));
        sem.report(&format!("semaphore(1) ({runner:?})"));
    }
}
