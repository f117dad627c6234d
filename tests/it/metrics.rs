//! Metrics (feature `metrics`): a scripted workload against a real Redis, then the exact values the
//! `metrics` facade received, read from `metrics-util`'s debugging recorder (one test: the recorder
//! is global to this binary).

use crate::support;

use std::collections::HashMap;
use std::thread;
use std::time::Duration;

use crate::support::RedisServer;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

/// Every metric as "name{label=value,...}" (labels sorted) -> its value.
fn values(snapshotter: &Snapshotter) -> HashMap<String, DebugValue> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let key = key.key();
            let mut labels: Vec<String> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            labels.sort();
            (format!("{}{{{}}}", key.name(), labels.join(",")), value)
        })
        .collect()
}

fn counter(v: &HashMap<String, DebugValue>, key: &str) -> u64 {
    match v.get(key) {
        Some(DebugValue::Counter(n)) => *n,
        None => 0,
        other => panic!("{key}: {other:?}"),
    }
}

fn gauge(v: &HashMap<String, DebugValue>, key: &str) -> f64 {
    match v.get(key) {
        Some(DebugValue::Gauge(g)) => g.into_inner(),
        None => 0.0,
        other => panic!("{key}: {other:?}"),
    }
}

/// The histograms' samples: a snapshot drains them, so every snapshot's are added up here.
#[derive(Default)]
struct Samples(HashMap<String, usize>);

impl Samples {
    fn add(&mut self, v: &HashMap<String, DebugValue>) {
        for (key, value) in v {
            if let DebugValue::Histogram(h) = value {
                *self.0.entry(key.clone()).or_default() += h.len();
            }
        }
    }

    fn of(&self, key: &str) -> usize {
        self.0.get(key).copied().unwrap_or(0)
    }
}

#[test]
fn a_scripted_workload_records_exactly_what_happened() {
    support::in_own_process!(
        Duration::from_secs(300),
        a_scripted_workload_records_exactly_what_happened_alone
    );
}

/// The body of [`a_scripted_workload_records_exactly_what_happened`], alone in a child process (see `support::in_own_process!`).
fn a_scripted_workload_records_exactly_what_happened_alone() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this binary");

    let server = RedisServer::start();
    let client = fairlock::LockClient::builder(&server.url())
        .lease(Duration::from_millis(900))
        .metrics_lock_label(true)
        .build()
        .unwrap();
    let lock = client.fair_lock("m").unwrap();

    // 3 uncontended holds, the second with a re-entry, the third long enough for a renewal
    for i in 0..3 {
        let g = lock.lock().unwrap();
        if i == 1 {
            drop(lock.lock().unwrap());
        }
        if i == 2 {
            thread::sleep(Duration::from_millis(450));
        }
        g.unlock().unwrap();
    }
    // while held: a busy try, a timed-out wait, then a waiter that gets it handed over
    let held = lock.lock().unwrap();
    let mut samples = Samples::default();
    let mid = values(&snapshotter);
    samples.add(&mid);
    assert_eq!(gauge(&mid, "fairlock_held_locks{}"), 1.0);
    let other = lock.clone();
    thread::spawn(move || {
        assert!(other.try_lock().unwrap().is_none());
        assert!(other
            .try_lock_for(Duration::from_millis(100))
            .unwrap()
            .is_none());
    })
    .join()
    .unwrap();
    let waiter = {
        let lock = lock.clone();
        thread::spawn(move || lock.lock().map(|g| g.unlock()))
    };
    assert!(support::queued(&lock, 1, Duration::from_secs(5)));
    assert_eq!(
        gauge(&values(&snapshotter), "fairlock_waiting_threads{}"),
        1.0
    );
    held.unlock().unwrap();
    waiter.join().unwrap().unwrap().unwrap();
    // a hold force-released by someone else: the watchdog finds it, then its release too
    let lost = lock.lock().unwrap();
    support::client(&server)
        .fair_lock("m")
        .unwrap()
        .force_unlock()
        .unwrap();
    lost.lost_signal()
        .recv_timeout(Duration::from_secs(3))
        .expect("told");
    assert!(lost.unlock().is_err());
    // a holder that dies (its hold leaked, a fixed 300 ms lease) with this client's waiter
    // queued: the janitor grants the stranded lock to the waiter at the lease's end (a repair)
    let dead = support::client(&server)
        .fair_lock("stranded")
        .unwrap()
        .with_fixed_lease(Duration::from_millis(300))
        .unwrap();
    dead.lock().unwrap().leak();
    let waited = client.fair_lock("stranded").unwrap().lock().unwrap();
    waited.unlock().unwrap();
    // another program's data at a lock's key: an error
    let _: () = redis::cmd("SET")
        .arg("fairlock:{foreign}")
        .arg("x")
        .query(&mut server.conn())
        .unwrap();
    assert!(client.fair_lock("foreign").unwrap().lock().is_err());

    // a semaphore's permits and a read/write lock's sides count as a lock's holds do: taken at
    // once, a busy try, a waiter handed the permit, and a read
    let sem = client.semaphore("s", 1).unwrap();
    let first = sem.acquire().unwrap();
    assert!(sem.try_acquire().unwrap().is_none());
    let sem_waiter = {
        let sem = sem.clone();
        thread::spawn(move || sem.acquire().map(|p| p.release()))
    };
    assert!(support::eventually(Duration::from_secs(5), || sem
        .status()
        .is_ok_and(|s| s.waiters.len() == 1)));
    let mid = values(&snapshotter);
    samples.add(&mid);
    assert_eq!(gauge(&mid, "fairlock_waiting_threads{}"), 1.0);
    first.release().unwrap();
    sem_waiter.join().unwrap().unwrap().unwrap();
    drop(client.rw_lock("rw").unwrap().read().unwrap());

    let v = values(&snapshotter);
    samples.add(&v);
    assert_eq!(
        counter(&v, "fairlock_acquisitions_total{lock=s,outcome=acquired}"),
        2,
        "{v:#?}"
    );
    assert_eq!(
        counter(&v, "fairlock_acquisitions_total{lock=s,outcome=busy}"),
        1
    );
    assert_eq!(counter(&v, "fairlock_handoffs_total{lock=s}"), 1);
    assert_eq!(
        samples.of("fairlock_wait_seconds{lock=s,outcome=acquired}"),
        2
    );
    assert_eq!(samples.of("fairlock_hold_seconds{lock=s}"), 2);
    assert_eq!(
        counter(&v, "fairlock_acquisitions_total{lock=rw,outcome=acquired}"),
        1
    );
    assert_eq!(samples.of("fairlock_hold_seconds{lock=rw}"), 1);
    let acquired = "fairlock_acquisitions_total{lock=m,outcome=acquired}";
    assert_eq!(counter(&v, acquired), 3 + 1 + 1 + 1, "{v:#?}");
    assert_eq!(
        counter(&v, "fairlock_acquisitions_total{lock=m,outcome=busy}"),
        1
    );
    assert_eq!(
        counter(&v, "fairlock_acquisitions_total{lock=m,outcome=timed_out}"),
        1
    );
    assert_eq!(
        counter(
            &v,
            "fairlock_acquisitions_total{lock=foreign,outcome=error}"
        ),
        1
    );
    assert_eq!(
        samples.of("fairlock_wait_seconds{lock=m,outcome=acquired}"),
        6
    );
    assert_eq!(counter(&v, "fairlock_reentries_total{lock=m}"), 1);
    assert_eq!(counter(&v, "fairlock_handoffs_total{lock=m}"), 1);
    assert_eq!(samples.of("fairlock_hold_seconds{lock=m}"), 6);
    assert_eq!(
        counter(&v, "fairlock_holds_lost_total{cause=taken_or_gone,lock=m}"),
        1,
        "counted once: not again at the release that found it lost"
    );
    assert_eq!(
        counter(&v, "fairlock_holds_lost_total{cause=at_release,lock=m}"),
        0
    );
    // the acquire's request, and its leave (best effort, the same key): two calls failed
    assert_eq!(
        counter(&v, "fairlock_redis_errors_total{kind=foreign_data}"),
        2
    );
    assert!(
        counter(&v, "fairlock_lease_renewals_total{}") >= 1,
        "{v:#?}"
    );
    assert_eq!(counter(&v, "fairlock_lease_renewal_failures_total{}"), 0);
    assert_eq!(counter(&v, "fairlock_janitor_repairs_total{}"), 1, "{v:#?}");
    assert_eq!(counter(&v, "fairlock_handoffs_total{lock=stranded}"), 1);
    assert_eq!(gauge(&v, "fairlock_held_locks{}"), 0.0);
    assert_eq!(gauge(&v, "fairlock_waiting_threads{}"), 0.0);
}
