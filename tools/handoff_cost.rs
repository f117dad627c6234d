//! What a hand-off costs Redis: two owners take turns on one lock through the raw protocol layer
//! (one queues, the other releases, which grants the lock to it; it pops the grant), and Redis's
//! `SLOWLOG` (threshold 0) gives each call's server time. Prints, per script, the median and the
//! mean of the middle 80 % in µs. Run it only against a server of your own (it changes
//! `slowlog-*` and uses lock `cost`):
//!
//! ```text
//! cargo run --release --features raw --example handoff_cost -- redis://127.0.0.1:6379/ [HAND-OFFS]
//! ```

use std::process::ExitCode;
use std::time::Duration;

use fairlock::raw::{self, Acquire, RawLock, Release, Settings, Wake};

const LEASE: Duration = Duration::from_secs(30);

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let (Some(url), n) = (args.next(), args.next()) else {
        eprintln!("usage: handoff_cost REDIS_URL [HAND-OFFS (default 3000)]");
        return ExitCode::from(2);
    };
    let Ok(n) = n.as_deref().unwrap_or("3000").parse::<u64>() else {
        eprintln!("handoff_cost: HAND-OFFS must be a number");
        return ExitCode::from(2);
    };
    match run(&url, n) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("handoff_cost: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(url: &str, n: u64) -> Result<(), Box<dyn std::error::Error>> {
    let mut c = redis::Client::open(url)?.get_connection()?;
    let lock = RawLock::new("fairlock-cost", "cost", Settings::default())?;
    let owners = ["a:1", "b:1"];
    let mut attempts = [1u64, 1];
    let Acquire::Granted(g) = lock
        .acquire(owners[0], 1, LEASE, raw::Mode::Wait, "m")
        .run(&mut c)?
    else {
        return Err("lock `cost` is not free".into());
    };
    let mut token = g.token;
    let mut holder = 0;
    let slowlog = |c: &mut redis::Connection, args: &[&str]| -> redis::RedisResult<()> {
        redis::cmd("SLOWLOG").arg(args).query(c)
    };
    let _: () = redis::cmd("CONFIG")
        .arg(&[
            "SET",
            "slowlog-log-slower-than",
            "0",
            "slowlog-max-len",
            "1000000",
        ])
        .query(&mut c)?;
    slowlog(&mut c, &["RESET"])?;
    for _ in 0..n {
        let waiter = 1 - holder;
        attempts[waiter] += 1;
        let queued = lock
            .acquire(
                owners[waiter],
                attempts[waiter],
                LEASE,
                raw::Mode::Wait,
                "m",
            )
            .run(&mut c)?;
        if !matches!(queued, Acquire::Queued { .. }) {
            return Err(format!("expected to queue, got {queued:?}").into());
        }
        let released = lock.release(owners[holder], token, 1).run(&mut c)?;
        if !matches!(released, Release::Released { next: Some(_) }) {
            return Err(format!("expected a hand-off, got {released:?}").into());
        }
        let msg: String = redis::cmd("LPOP")
            .arg(lock.wake_key(owners[waiter]))
            .query(&mut c)?;
        let Wake::Grant { token: t, .. } = raw::parse_wake(&msg)? else {
            return Err(format!("expected a grant, got {msg}").into());
        };
        token = t;
        holder = waiter;
    }
    let log: Vec<redis::Value> = redis::cmd("SLOWLOG").arg(&["GET", "-1"]).query(&mut c)?;
    let _: () = redis::cmd("CONFIG")
        .arg(&[
            "SET",
            "slowlog-log-slower-than",
            "10000",
            "slowlog-max-len",
            "128",
        ])
        .query(&mut c)?;
    let mut release = vec![];
    let mut acquire = vec![];
    for entry in &log {
        let redis::Value::Array(fields) = entry else {
            continue;
        };
        let (Some(redis::Value::Int(us)), Some(redis::Value::Array(argv))) =
            (fields.get(2), fields.get(3))
        else {
            continue;
        };
        let text = |v: &redis::Value| match v {
            redis::Value::BulkString(b) => String::from_utf8_lossy(b).to_lowercase(),
            _ => String::new(),
        };
        let (cmd, name) = (
            argv.first().map(text).unwrap_or_default(),
            argv.get(1).map(text).unwrap_or_default(),
        );
        if cmd != "fcall" && cmd != "evalsha" {
            continue;
        }
        // FCALL names the function (<library>_<script>); EVALSHA only a digest, but its calls
        // alternate acquire, release in this loop, with the same keys: tell them by ARGV[4..]
        let script = if cmd == "fcall" {
            name.rsplit('_').next().unwrap_or_default().to_string()
        } else if argv.len() == 12 {
            "release".into()
        } else {
            "acquire".into()
        };
        match script.as_str() {
            "release" => release.push(*us as f64),
            "acquire" => acquire.push(*us as f64),
            _ => {}
        }
    }
    println!("| call ({n} hand-offs) | median µs | mean of the middle 80 % µs |");
    println!("|---|---:|---:|");
    for (what, v) in [
        ("release granting the waiter", &mut release),
        ("acquire queueing behind the holder", &mut acquire),
    ] {
        let (median, mid) = summary(v);
        println!("| {what} | {median:.0} | {mid:.1} |");
    }
    Ok(())
}

/// The median and the mean of the middle 80 %.
fn summary(v: &mut [f64]) -> (f64, f64) {
    if v.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    v.sort_by(f64::total_cmp);
    let cut = v.len() / 10;
    let mid = &v[cut..v.len() - cut];
    (v[v.len() / 2], mid.iter().sum::<f64>() / mid.len() as f64)
}
