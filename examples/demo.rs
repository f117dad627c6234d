//! The demo behind `scripts/demo.sh`: worker processes with several threads each contend for one
//! lock. Round 1 queues every thread behind a held lock and shows the hand-offs follow the queue;
//! round 2 lets them all hammer the lock and checks the GET/SET counter and the fencing tokens.
//!
//! Usage: `demo REDIS_URL` (parent) — it starts its own workers (`demo worker ...`).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fairlock::{LockClient, Result};

const LOCK: &str = "demo:close-unpaid-orders";
const COUNTER: &str = "demo:counter";
const PROCESSES: usize = 3;
const THREADS: usize = 3;
const ROUND2_ITERATIONS: usize = 20;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("worker") if args.len() == 5 => worker(&args[1], &args[2], &args[3], &args[4]),
        Some(url) if args.len() == 1 => parent(url),
        _ => {
            eprintln!("usage: demo REDIS_URL");
            std::process::exit(64);
        }
    };
    if let Err(e) = result {
        eprintln!("demo failed: {e}");
        std::process::exit(1);
    }
}

/// One acquisition as a worker reports it.
struct Grant {
    token: u64,
    who: String,
    before: i64,
    after: i64,
}

fn parse_grant(line: &str) -> Option<Grant> {
    // GRANT <token> <who> <before> <after>
    let mut p = line.strip_prefix("GRANT ")?.split(' ');
    Some(Grant {
        token: p.next()?.parse().ok()?,
        who: p.next()?.to_string(),
        before: p.next()?.parse().ok()?,
        after: p.next()?.parse().ok()?,
    })
}

fn parent(url: &str) -> Result<()> {
    let client = LockClient::connect(url)?;
    let lock = client.fair_lock(LOCK)?;
    let mut redis = redis::Client::open(url)
        .and_then(|c| c.get_connection())
        .map_err(|e| fairlock::Error::Connection {
            during: "connecting the demo",
            detail: e.to_string(),
            source: Some(Box::new(e)),
        })?;
    let _: () = redis::cmd("SET")
        .arg(COUNTER)
        .arg(0)
        .query(&mut redis)
        .unwrap_or(());

    println!("== Round 1: {PROCESSES} processes x {THREADS} threads queue behind a held lock");
    let guard = lock.lock()?;
    println!(
        "the parent holds {LOCK:?} with fencing token {}",
        guard.fencing_token()
    );
    let workers = spawn_workers(url, "1", 1);
    let deadline = Instant::now() + Duration::from_secs(30);
    let queue = loop {
        let status = lock.status()?;
        if status.waiters.len() == PROCESSES * THREADS || Instant::now() > deadline {
            break status.waiters;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    println!("queue order (as Redis sees it):");
    let queue: Vec<String> = queue
        .iter()
        .map(|w| format!("pid{}/{}", w.origin.pid, w.origin.thread))
        .collect();
    for (i, w) in queue.iter().enumerate() {
        println!("  {:>2}. {w}", i + 1);
    }
    guard.unlock()?;
    let grants = collect(workers);
    println!("hand-offs (in fencing-token order):");
    for g in &grants {
        println!("  token {} -> {}", g.token, g.who);
    }
    let served: Vec<String> = grants.iter().map(|g| g.who.clone()).collect();
    let fifo = served == queue;
    println!(
        "{} served in queue order",
        if fifo { "OK:" } else { "FAILED: not" }
    );

    println!();
    println!(
        "== Round 2: {PROCESSES} processes x {THREADS} threads x {ROUND2_ITERATIONS} acquisitions, each a GET/SET counter increment"
    );
    let started = Instant::now();
    let workers = spawn_workers(url, "2", ROUND2_ITERATIONS);
    let grants2 = collect(workers);
    let elapsed = started.elapsed();
    let counter: i64 = redis::cmd("GET")
        .arg(COUNTER)
        .query(&mut redis)
        .unwrap_or(-1);
    let total = grants.len() + grants2.len();
    let all: Vec<&Grant> = grants.iter().chain(grants2.iter()).collect();
    let increasing = all.windows(2).all(|w| w[0].token < w[1].token);
    let chained = all.windows(2).all(|w| w[0].after == w[1].before);
    println!(
        "{} acquisitions in {:.2?} ({:.0}/s)",
        grants2.len(),
        elapsed,
        grants2.len() as f64 / elapsed.as_secs_f64()
    );
    // tokens are seeded from the server clock (µs), so the range says nothing about the count
    println!(
        "{} fencing tokens, from {} to {}: {}",
        all.len(),
        all.first().map_or(0, |g| g.token),
        all.last().map_or(0, |g| g.token),
        if increasing {
            "OK: strictly increasing"
        } else {
            "FAILED: not increasing"
        }
    );
    println!(
        "counter = {counter}, acquisitions = {total}: {}",
        if counter == total as i64 && chained {
            "OK: no lost update"
        } else {
            "FAILED: lost update"
        }
    );
    let ok = fifo && increasing && chained && counter == total as i64;
    if !ok {
        std::process::exit(1);
    }
    Ok(())
}

fn spawn_workers(url: &str, round: &str, iterations: usize) -> Vec<std::process::Child> {
    let exe = std::env::current_exe().expect("own executable");
    (0..PROCESSES)
        .map(|_| {
            Command::new(&exe)
                .args([
                    "worker",
                    url,
                    round,
                    &THREADS.to_string(),
                    &iterations.to_string(),
                ])
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn worker")
        })
        .collect()
}

/// Read every worker's GRANT lines and return them sorted by token (the order of the grants).
fn collect(workers: Vec<std::process::Child>) -> Vec<Grant> {
    let mut grants = Vec::new();
    for mut w in workers {
        if let Some(out) = w.stdout.take() {
            for line in BufReader::new(out).lines().map_while(|l| l.ok()) {
                if let Some(g) = parse_grant(&line) {
                    grants.push(g);
                }
            }
        }
        let _ = w.wait();
    }
    grants.sort_by_key(|g| g.token);
    grants
}

fn worker(url: &str, round: &str, threads: &str, iterations: &str) -> Result<()> {
    let threads: usize = threads.parse().unwrap_or(1);
    let iterations: usize = iterations.parse().unwrap_or(1);
    let client = LockClient::connect(url)?;
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let client = client.clone();
            let url = url.to_string();
            let round = round.to_string();
            std::thread::Builder::new()
                .name(format!("worker-{t}"))
                .spawn(move || -> Result<()> {
                    let lock = client.fair_lock(LOCK)?;
                    let mut redis = redis::Client::open(url.as_str())
                        .and_then(|c| c.get_connection())
                        .map_err(|e| fairlock::Error::Connection {
                            during: "connecting a worker",
                            detail: e.to_string(),
                            source: Some(Box::new(e)),
                        })?;
                    for _ in 0..iterations {
                        let guard = lock.lock()?;
                        // a read-modify-write that only a lock keeps correct
                        let before: i64 = redis::cmd("GET")
                            .arg(COUNTER)
                            .query(&mut redis)
                            .unwrap_or(0);
                        if round == "1" {
                            std::thread::sleep(Duration::from_millis(10));
                        }
                        let _: () = redis::cmd("SET")
                            .arg(COUNTER)
                            .arg(before + 1)
                            .query(&mut redis)
                            .unwrap_or(());
                        println!(
                            "GRANT {} pid{}/{} {} {}",
                            guard.fencing_token(),
                            std::process::id(),
                            std::thread::current().name().unwrap_or("?"),
                            before,
                            before + 1
                        );
                        guard.unlock()?;
                    }
                    Ok(())
                })
                .expect("spawn thread")
        })
        .collect();
    for h in handles {
        match h.join() {
            Ok(r) => r?,
            Err(_) => eprintln!("a worker thread panicked"),
        }
    }
    Ok(())
}
