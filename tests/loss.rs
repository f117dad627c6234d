//! Lost holds are pushed to the holder (issue 26): the guard's `lost_signal` and the client's
//! `on_lost` callback hear a force-release, Redis stopped past the lease, and the holder's own
//! process stopped (SIGSTOP) past its lease, once each, within a renewal interval; a hold
//! released normally is never reported.

mod support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use fairlock::crossbeam_channel::RecvTimeoutError;
use fairlock::{LockClient, LossCause, LostHold};
use support::{say, RedisServer};

const LEASE: Duration = Duration::from_millis(900);
/// A renewal interval (a third of the lease), and slack for a loaded 2-core machine.
const TOLD_WITHIN: Duration = Duration::from_millis(300 + 1200);

/// A client with a short lease that counts (and keeps) what its `on_lost` callback hears.
fn counting_client(url: &str) -> (LockClient, Arc<Mutex<Vec<LostHold>>>) {
    let heard = Arc::new(Mutex::new(Vec::new()));
    let callback_heard = heard.clone();
    let client = LockClient::builder(url)
        .lease(LEASE)
        .connect_timeout(Duration::from_millis(300))
        .read_timeout(Duration::from_millis(300))
        .on_lost(move |lost| callback_heard.lock().unwrap().push(lost.clone()))
        .build()
        .unwrap();
    (client, heard)
}

#[test]
fn a_force_release_is_told_once_to_the_guard_and_the_callback() {
    let server = RedisServer::start();
    let (client, heard) = counting_client(&server.url());
    let lock = client.fair_lock("forced").unwrap();
    let guard = lock.lock().unwrap();
    let lost = guard.lost_signal();
    let other = support::client(&server);
    let forced_at = Instant::now();
    assert!(other
        .fair_lock("forced")
        .unwrap()
        .force_unlock()
        .unwrap()
        .is_some());
    let news = lost.recv_timeout(TOLD_WITHIN).expect("told of the loss");
    let took = forced_at.elapsed();
    assert_eq!(news.name, "forced");
    assert_eq!(news.token, guard.fencing_token());
    assert_eq!(news.cause, LossCause::TakenOrGone);
    assert!(guard.is_lost());
    assert!(took < TOLD_WITHIN, "{took:?}");
    // once: nothing more on the channel or to the callback, however long the guard lives
    assert!(matches!(
        lost.recv_timeout(LEASE),
        Err(RecvTimeoutError::Timeout)
    ));
    assert_eq!(heard.lock().unwrap().as_slice(), &[news]);
    drop(guard);
    // the hold over, the channel disconnects
    assert!(matches!(
        lost.recv_timeout(TOLD_WITHIN),
        Err(RecvTimeoutError::Disconnected)
    ));
}

#[test]
fn a_hold_released_normally_is_never_told() {
    let server = RedisServer::start();
    let (client, heard) = counting_client(&server.url());
    let lock = client.fair_lock("normal").unwrap();
    let mut signals = vec![];
    // holds that outlive several renewals, short ones, and nested ones, released in turn
    for i in 0..20u64 {
        let guard = lock.lock().unwrap();
        signals.push(guard.lost_signal());
        let inner = lock.lock().unwrap();
        thread::sleep(Duration::from_millis(if i % 5 == 0 { 700 } else { 5 }));
        drop(inner);
        guard.unlock().unwrap();
    }
    thread::sleep(LEASE);
    for s in signals {
        assert!(matches!(
            s.try_recv(),
            Err(fairlock::crossbeam_channel::TryRecvError::Disconnected)
        ));
    }
    assert!(
        heard.lock().unwrap().is_empty(),
        "{:?}",
        heard.lock().unwrap()
    );
}

#[test]
fn redis_stopped_past_the_lease_is_told_as_a_lease_that_ran_out() {
    let mut server = RedisServer::start();
    let (client, heard) = counting_client(&server.url());
    let lock = client.fair_lock("unreachable").unwrap();
    let guard = lock.lock().unwrap();
    let lost = guard.lost_signal();
    server.stop();
    let stopped_at = Instant::now();
    let news = lost
        .recv_timeout(LEASE + TOLD_WITHIN)
        .expect("told when the lease ran out");
    assert_eq!(news.cause, LossCause::LeaseRanOut);
    assert!(stopped_at.elapsed() < LEASE + TOLD_WITHIN);
    assert!(guard.is_lost());
    server.start_again();
    assert_eq!(heard.lock().unwrap().len(), 1);
    drop(guard);
}

/// Child role: hold the lock (lease 900 ms) and say READY; then, for every line "write" the
/// parent sends, say LOST <cause> when the loss signal has arrived, else WROTE.
fn holder_child() {
    support::child_time_limit(Duration::from_secs(60));
    let url: String = support::env_arg("URL");
    let (client, heard) = counting_client(&url);
    let lock = client.fair_lock("stopped").unwrap();
    let guard = lock.lock().unwrap();
    let lost = guard.lost_signal();
    say("READY", guard.fencing_token());
    loop {
        let line = support::hear();
        if line != "write" {
            break;
        }
        match lost.try_recv() {
            Ok(news) => say(
                "LOST",
                format!("{:?} {}", news.cause, heard.lock().unwrap().len()),
            ),
            Err(_) => say("WROTE", guard.fencing_token()),
        }
    }
    drop(guard);
}

#[test]
fn the_holders_process_stopped_past_its_lease_is_told_before_its_next_write() {
    let children = support::child_test!("holder" => holder_child);
    let server = RedisServer::start();
    let mut child = children.spawn("holder", &[("URL", server.url())]);
    let token: u64 = child
        .expect("READY", Duration::from_secs(10))
        .trim()
        .parse()
        .unwrap();
    child.send("write");
    child.expect("WROTE", Duration::from_secs(5));
    child.signal(libc::SIGSTOP);
    // another owner takes the lock once the stopped holder's lease runs out
    let other = support::client(&server);
    let taken = other
        .fair_lock("stopped")
        .unwrap()
        .try_lock_for(Duration::from_secs(5))
        .unwrap()
        .expect("taken after the stopped holder's lease");
    assert!(taken.fencing_token() > token);
    child.signal(libc::SIGCONT);
    // the next write the holder is asked for, a moment after it runs again
    thread::sleep(Duration::from_millis(300));
    child.send("write");
    let said = child.expect("LOST", Duration::from_secs(5));
    assert_eq!(
        said.trim(),
        "TakenOrGone 1",
        "told once, to the callback too"
    );
    child.close_stdin();
    assert!(child.exits_ok(Duration::from_secs(10)));
    taken.unlock().unwrap();
}

/// A measurement, not a test (`cargo test --release --test loss -- --ignored --nocapture
/// notification_latency`): from a force-release to the `on_lost` callback, lease 900 ms
/// (renewals every 300 ms), 40 samples at random points of the renewal cycle.
#[test]
#[ignore = "a measurement: cargo test --release --test loss -- --ignored --nocapture notification_latency"]
fn notification_latency() {
    let server = RedisServer::start();
    let heard_at = Arc::new(Mutex::new(None::<Instant>));
    let calls = Arc::new(AtomicU32::new(0));
    let (h, c) = (heard_at.clone(), calls.clone());
    let client = LockClient::builder(&server.url())
        .lease(LEASE)
        .on_lost(move |_| {
            *h.lock().unwrap() = Some(Instant::now());
            c.fetch_add(1, Ordering::SeqCst);
        })
        .build()
        .unwrap();
    let other = support::client(&server);
    let mut samples = vec![];
    for i in 0..40u64 {
        let name = format!("latency-{i}");
        let guard = client.fair_lock(&name).unwrap().lock().unwrap();
        thread::sleep(Duration::from_millis(50 + (i * 37) % 300));
        *heard_at.lock().unwrap() = None;
        let forced = Instant::now();
        other.fair_lock(&name).unwrap().force_unlock().unwrap();
        guard
            .lost_signal()
            .recv_timeout(Duration::from_secs(3))
            .unwrap();
        let at = heard_at.lock().unwrap().expect("the callback ran first");
        samples.push(at.duration_since(forced));
        drop(guard);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 40);
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    println!(
        "force-release to on_lost, lease {LEASE:?}: p50 {:?}, p99 {:?}, max {:?}",
        at(0.5),
        at(0.99),
        samples[samples.len() - 1]
    );
}
