//! Crashes leave nothing stuck: a SIGKILLed holder, a SIGKILLed waiter, a Redis restart under
//! holders and waiters, and a Redis that is down.

use crate::support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::support::{eventually, say, unix_micros, ChildTest, Proc, RedisServer};
use fairlock::Error;

const SECS_5: Duration = Duration::from_secs(5);
const SECS_30: Duration = Duration::from_secs(30);

/// The timing bounds below are generous, but a crash test sharing 2 cores with another one that
/// restarts Redis is needlessly noisy: these tests take turns.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Child roles of the crash tests (env URL, NAME, LEASE_MS):
/// - "holder": take the lock, print `HELD <token>`, then hold it until killed.
/// - "waiter": print `READY`, take the lock, print `ACQ <unix us> <token> <flag>`, hold it 50 ms,
///   release, print `DONE`.
fn crash_child(role: &str) {
    support::child_time_limit(Duration::from_secs(60));
    let url: String = support::env_arg("URL");
    let name: String = support::env_arg("NAME");
    let lease_ms: u64 = support::env_arg("LEASE_MS");
    let client = support::client_with_url(&url, |b| b.lease(Duration::from_millis(lease_ms)));
    let lock = client.fair_lock(&name).unwrap();
    match role {
        "holder" => {
            let g = lock.lock().unwrap();
            say("HELD", g.fencing_token());
            thread::sleep(Duration::from_secs(120));
        }
        "waiter" => {
            say("READY", "");
            let g = lock.lock().unwrap();
            say(
                "ACQ",
                format!(
                    "{} {} {}",
                    unix_micros(),
                    g.fencing_token(),
                    client.current_owner()
                ),
            );
            thread::sleep(Duration::from_millis(50));
            g.unlock().unwrap();
            say("DONE", "");
        }
        "paused-holder" => {
            let g = lock.lock().unwrap();
            say("HELD", g.fencing_token());
            // the parent SIGSTOPs us here, lets the lease run out, SIGCONTs us and says "go"
            assert_eq!(support::hear(), "go");
            let lost = support::eventually(Duration::from_secs(5), || g.is_lost());
            say("LOST", lost);
            let outcome = match g.unlock() {
                Ok(()) => "ok".to_string(),
                Err(Error::NotHeld { .. }) => "not-held".to_string(),
                Err(e) => format!("error {e}"),
            };
            say("UNLOCK", outcome);
        }
        other => panic!("unknown role {other}"),
    }
}

fn child_env(server: &RedisServer, name: &str, lease_ms: u64) -> Vec<(&'static str, String)> {
    vec![
        ("URL", server.url()),
        ("NAME", name.to_string()),
        ("LEASE_MS", lease_ms.to_string()),
    ]
}

struct Acq {
    at_us: u64,
    token: u64,
    flag: String,
}

fn parse_acq(line: &str) -> Acq {
    let mut parts = line.split(' ');
    Acq {
        at_us: parts.next().unwrap().parse().unwrap(),
        token: parts.next().unwrap().parse().unwrap(),
        flag: parts.next().unwrap().to_string(),
    }
}

#[test]
fn a_sigkilled_holder_passes_the_lock_to_three_waiters_in_fifo_within_lease_plus_1s() {
    let children = support::child_test!(crash_child);
    let _serial = serial();
    let server = RedisServer::start();
    let observer = support::client(&server);
    let lock = observer.fair_lock("victim").unwrap();
    let lease_ms = 1000;
    let env = child_env(&server, "victim", lease_ms);

    let mut holder = children.spawn("holder", &env);
    let held_token: u64 = holder.expect("HELD", SECS_30).parse().unwrap();
    let mut waiters = vec![];
    for i in 0..3 {
        let mut w = children.spawn("waiter", &env);
        w.expect("READY", SECS_30);
        assert!(
            support::queued(&lock, i + 1, SECS_30),
            "waiter {i} never queued"
        );
        waiters.push(w);
    }
    let queue: Vec<u32> = support::queue_pids(&lock);
    assert_eq!(queue, waiters.iter().map(|w| w.pid()).collect::<Vec<_>>());
    // let the holder's watchdog renew at least once, so the lease left at the kill is unknown
    thread::sleep(Duration::from_millis(700));
    assert_eq!(
        lock.status().unwrap().holder.unwrap().fencing_token,
        held_token
    );

    let killed_at = unix_micros();
    holder.kill();

    let acqs: Vec<Acq> = waiters
        .iter_mut()
        .map(|w| parse_acq(&w.expect("ACQ", SECS_30)))
        .collect();
    for w in &mut waiters {
        w.expect("DONE", SECS_30);
        assert!(w.exits_ok(SECS_30), "waiter failed");
    }
    let first_after = Duration::from_micros(acqs[0].at_us.saturating_sub(killed_at));
    println!("first waiter got the dead holder's lock {first_after:?} after the kill");
    assert!(
        first_after < Duration::from_millis(lease_ms) + Duration::from_secs(1),
        "the next waiter waited {first_after:?} for a dead holder's lock (lease {lease_ms} ms)"
    );
    // FIFO: the waiters got it in queue order, one after another. `acqs` is in queue order, so
    // its tokens (time-seeded, not consecutive) must rise from the dead holder's.
    let tokens: Vec<u64> = acqs.iter().map(|a| a.token).collect();
    assert!(tokens[0] > held_token, "{tokens:?} after {held_token}");
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    assert!(acqs.windows(2).all(|w| w[0].at_us < w[1].at_us));
    assert!(acqs.iter().all(|a| !a.flag.is_empty()));
    server.assert_released_keys("victim");
}

/// Queue W1 then W2 (children) behind a holder in this process; SIGKILL W1.
fn holder_and_two_waiters(
    children: &ChildTest,
    server: &RedisServer,
    lock: &fairlock::FairLock,
) -> (fairlock::LockGuard, Proc, Proc) {
    let env = child_env(server, lock.name(), 30_000);
    let holder = lock.lock().unwrap();
    let mut w1 = children.spawn("waiter", &env);
    w1.expect("READY", SECS_30);
    assert!(support::queued(lock, 1, SECS_30));
    let mut w2 = children.spawn("waiter", &env);
    w2.expect("READY", SECS_30);
    assert!(support::queued(lock, 2, SECS_30));
    let pids: Vec<u32> = support::queue_pids(lock);
    assert_eq!(pids, [w1.pid(), w2.pid()]);
    w1.kill();
    // until the server has seen W1's blocking connection close, its BLPOP is still served: a
    // grant popped there (the reply lost with the connection) would be a hold of the dead
    // process, ending only with its 30 s lease
    assert!(
        support::eventually(SECS_30, || server.connections_named("fairlock-waker") == 1),
        "the dead waiter's blocking connection is still open"
    );
    (holder, w1, w2)
}

#[test]
fn a_sigkilled_waiter_at_the_head_does_not_stall_the_queue() {
    let children = support::child_test!(crash_child);
    let _serial = serial();
    let server = RedisServer::start();
    let client = support::client(&server);
    let lock = client.fair_lock("dead-head").unwrap();
    let (holder, _w1, mut w2) = holder_and_two_waiters(&children, &server, &lock);

    // release at once: the dead waiter is still within its heartbeat time, so the release grants
    // it the lock; the janitor of a live client must revoke that grant and pass it on
    let commands_before = server.total_commands();
    let released = Instant::now();
    holder.unlock().unwrap();
    w2.expect("ACQ", Duration::from_secs(10));
    let stalled = released.elapsed();
    let commands = server.total_commands() - commands_before;
    println!("the waiter behind a dead head got the lock after {stalled:?}, {commands} commands");
    // waiter timeout = 3 janitor intervals (600 ms) + a tick; generous bound
    assert!(
        stalled < Duration::from_secs(3),
        "queue stalled for {stalled:?}"
    );
    // nobody busy-looped meanwhile (heartbeats every 200 ms, one BLPOP per waiter)
    assert!(
        commands < 500,
        "{commands} commands while waiting for a dead waiter"
    );
    w2.expect("DONE", SECS_30);
    assert!(w2.exits_ok(SECS_30));
    // the dead waiter's entry and wake list are gone
    server.assert_released_keys("dead-head");
}

#[test]
fn a_sigkilled_waiter_leaves_the_queue_while_the_lock_is_held() {
    let children = support::child_test!(crash_child);
    let _serial = serial();
    let server = RedisServer::start();
    let client = support::client(&server);
    let lock = client.fair_lock("dead-waiter").unwrap();
    let (holder, w1, mut w2) = holder_and_two_waiters(&children, &server, &lock);
    let (dead, live) = (w1.pid(), w2.pid());

    let killed = Instant::now();
    assert!(
        eventually(SECS_5, || {
            let pids: Vec<u32> = support::queue_pids(&lock);
            pids == [live]
        }),
        "the dead waiter {dead} was not removed"
    );
    let removed_after = killed.elapsed();
    println!("dead waiter removed {removed_after:?} after the kill");
    assert!(removed_after < Duration::from_secs(3));
    // the live waiter keeps its place for many waiter timeouts
    thread::sleep(Duration::from_millis(1000));
    let pids: Vec<u32> = support::queue_pids(&lock);
    assert_eq!(pids, [live]);
    let released = Instant::now();
    holder.unlock().unwrap();
    w2.expect("ACQ", SECS_30);
    assert!(released.elapsed() < Duration::from_secs(3));
    w2.expect("DONE", SECS_30);
    assert!(w2.exits_ok(SECS_30));
    server.assert_released_keys("dead-waiter");
}

#[test]
fn a_redis_restart_under_holders_and_waiters_gives_errors_or_recovery_and_threads_carry_on() {
    let _serial = serial();
    let mut server = RedisServer::start();
    let client = support::client_with_url(&server.url(), |b| b.lease(Duration::from_secs(1)));
    let lock = client.fair_lock("restart").unwrap();
    let holder = lock.lock().unwrap();

    let inside = Arc::new(AtomicU32::new(0));
    let (tx, rx) = mpsc::channel();
    let waiters: Vec<_> = (0..4)
        .map(|i| {
            let lock = lock.clone();
            let inside = inside.clone();
            let tx = tx.clone();
            thread::spawn(move || {
                let deadline = Instant::now() + SECS_30;
                let mut errors = vec![];
                loop {
                    match lock.lock() {
                        Ok(g) => {
                            assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                            thread::sleep(Duration::from_millis(20));
                            inside.fetch_sub(1, Ordering::SeqCst);
                            // the release may fail if Redis restarts again; never panics
                            let released = g.unlock();
                            tx.send((i, errors, released.err().map(|e| e.to_string())))
                                .unwrap();
                            return;
                        }
                        Err(e) => {
                            assert!(
                                e.is_connection() || matches!(e, Error::NotHeld { .. }),
                                "unexpected error during a restart: {e:?}"
                            );
                            errors.push(e.to_string());
                            assert!(
                                Instant::now() < deadline,
                                "waiter {i} never recovered: {errors:?}"
                            );
                            thread::sleep(Duration::from_millis(100));
                        }
                    }
                }
            })
        })
        .collect();
    assert!(support::queued(&lock, 4, SECS_5));

    server.restart();
    // Redis forgot everything; the holder's release reports it (or the connection error)
    match holder.unlock() {
        Ok(()) | Err(Error::NotHeld { .. }) => {}
        Err(e) => assert!(e.is_connection(), "unexpected release error {e:?}"),
    }
    for w in waiters {
        w.join().expect("a waiter panicked");
    }
    let outcomes: Vec<_> = rx.try_iter().collect();
    assert_eq!(outcomes.len(), 4);
    for (i, errors, release) in &outcomes {
        println!("waiter {i}: errors {errors:?}, release error {release:?}");
    }

    // the same client works again: lock/unlock
    let g = lock.lock().unwrap();
    assert!(g.is_held_in_redis().unwrap());
    g.unlock().unwrap();

    // the watchdog still renews: a 1 s lease kept for 2.5 s
    let rival_client = support::client(&server);
    let rival = rival_client.fair_lock("restart").unwrap();
    let g = lock.lock().unwrap();
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(2500) {
        assert!(
            rival.try_lock().unwrap().is_none(),
            "lease not renewed after the restart"
        );
        thread::sleep(Duration::from_millis(100));
    }
    assert!(!g.is_lost());

    // the janitor still heartbeats: a waiter of this client keeps its place for > 3 intervals
    let (tx, rx) = mpsc::channel();
    let waiter = {
        let lock = lock.clone();
        thread::spawn(move || tx.send(lock.lock().unwrap().fencing_token()).unwrap())
    };
    assert!(support::queued(&rival, 1, SECS_5));
    thread::sleep(Duration::from_millis(1200));
    assert_eq!(
        rival.status().unwrap().waiters.len(),
        1,
        "a live waiter was dropped"
    );
    let token = g.fencing_token();
    g.unlock().unwrap();
    // the waiter is the next hold: a greater token (time-seeded, so not token + 1)
    assert!(rx.recv_timeout(SECS_5).unwrap() > token);
    waiter.join().unwrap();
}

/// A client that gives up on a server soon: connect timeout 500 ms (also the wait for a pooled
/// connection, so a refused request costs about that), read timeout 1 s.
fn quick_to_fail(server: &RedisServer) -> fairlock::LockClient {
    support::client_with_url(&server.url(), |b| {
        b.connect_timeout(Duration::from_millis(500))
            .read_timeout(Duration::from_secs(1))
    })
}

/// Queued waiters, one waiting for as long as it takes and one with a deadline, ride out a
/// restart of their server during which their requests to ask again are refused, fewer times
/// than the failure budget: each is served once the server is back, not failed at the first
/// refusal.
#[test]
fn queued_waiters_ride_out_a_restart_that_refuses_their_requests_for_a_while() {
    let _serial = serial();
    let mut server = RedisServer::start();
    // a refused request costs about the connect timeout (the pool tries until then), then a
    // pause of 100 ms: a 600 ms outage refuses each waiter once or twice, under the budget of 3
    let client = quick_to_fail(&server);
    let lock = client.fair_lock("restarted").unwrap();
    let g = lock.lock().unwrap();
    let (tx, rx) = mpsc::channel();
    let waiters: Vec<_> = [None, Some(Duration::from_secs(30))]
        .into_iter()
        .enumerate()
        .map(|(i, deadline)| {
            let (waiting, tx) = (lock.clone(), tx.clone());
            let waiter = thread::spawn(move || {
                let result = match deadline {
                    None => waiting.lock().map(|g| Some(g.fencing_token())),
                    Some(d) => waiting
                        .try_lock_for(d)
                        .map(|g| g.map(|g| g.fencing_token())),
                };
                tx.send((i, result)).unwrap();
            });
            assert!(support::queued(&lock, i + 1, SECS_5));
            waiter
        })
        .collect();
    server.stop();
    thread::sleep(Duration::from_millis(600));
    server.start_again();
    for _ in 0..2 {
        let (i, result) = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("a waiter not served 30 s after the restart");
        let token = result.unwrap_or_else(|e| panic!("waiter {i} gave up: {e:?}"));
        assert!(token.is_some(), "waiter {i}'s deadline passed");
    }
    for w in waiters {
        w.join().unwrap();
    }
    // (the holder's hold went with the restart, without persistence)
    drop(g);
}

/// A waiter already queued when its server goes away for good gives up with a connection error
/// after its failure budget (3 failed requests to ask again, each within 10 s of the last, with
/// a pause between), instead of asking again forever.
#[test]
fn a_queued_waiter_whose_server_never_comes_back_fails_with_a_connection_error() {
    let _serial = serial();
    let mut server = RedisServer::start();
    let client = quick_to_fail(&server);
    let lock = client.fair_lock("gone").unwrap();
    let g = lock.lock().unwrap();
    let (tx, rx) = mpsc::channel();
    let waiter = {
        let lock = lock.clone();
        thread::spawn(move || {
            let result = lock.lock().map(|g| g.fencing_token());
            tx.send(result).unwrap();
        })
    };
    assert!(support::queued(&lock, 1, SECS_5));
    server.stop();
    let started = Instant::now();
    let result = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the waiter still asks 30 s after its server went away");
    let e = result.expect_err("a stopped server granted the lock");
    assert!(e.is_connection(), "{e:?}");
    println!(
        "a queued waiter gave up {:?} after its server stopped: {e}",
        started.elapsed()
    );
    waiter.join().unwrap();
    // (its release fails against the stopped server, which the guard's drop only logs)
    drop(g);
}

#[test]
fn calls_against_a_stopped_redis_fail_within_the_timeouts_and_work_once_it_is_back() {
    let _serial = serial();
    let mut server = RedisServer::start();
    let client = quick_to_fail(&server);
    let lock = client.fair_lock("down").unwrap();
    lock.lock().unwrap().unlock().unwrap();

    server.stop();
    for (what, result) in [
        ("lock", lock.lock().map(|_| ())),
        ("try_lock", lock.try_lock().map(|_| ())),
        (
            "try_lock_for",
            lock.try_lock_for(Duration::from_secs(1)).map(|_| ()),
        ),
        ("status", lock.status().map(|_| ())),
        ("is_locked", lock.is_locked().map(|_| ())),
    ] {
        let e = result.expect_err(what);
        assert!(e.is_connection(), "{what}: {e:?}");
        assert!(
            e.to_string().contains("check that the server is running"),
            "{what}: {e}"
        );
    }
    let start = Instant::now();
    let e = lock.lock().map(|_| ()).unwrap_err();
    let took = start.elapsed();
    assert!(e.is_connection(), "{e:?}");
    // connect timeout 500 ms: generous bound
    assert!(
        took < Duration::from_secs(10),
        "a call against a dead server took {took:?}"
    );
    println!("lock() against a stopped server failed after {took:?}");

    server.start_again();
    let g = lock.lock().unwrap();
    assert!(g.is_held_in_redis().unwrap());
    g.unlock().unwrap();
}

#[test]
fn a_redis_restart_with_aof_keeps_the_holder_and_the_queue_order() {
    let _serial = serial();
    let mut server = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let holder_client =
        support::client_with_url(&server.url(), |b| b.lease(Duration::from_secs(3)));
    let waiter_client = support::client(&server);
    let lock = holder_client.fair_lock("durable").unwrap();
    let holder = lock.lock().unwrap();
    let token = holder.fencing_token();

    let (tx, rx) = mpsc::channel();
    let threads = support::spawn_queued(&lock, 3, SECS_5, |i| {
        let waiter = waiter_client.fair_lock("durable").unwrap();
        let tx = tx.clone();
        move || {
            let g = waiter.lock().unwrap();
            tx.send((g.fencing_token(), i)).unwrap();
            g.unlock().unwrap();
        }
    });
    let queue: Vec<String> = support::queue_owners(&lock);

    server.restart();
    // the hold and the queue came back from the AOF; every blocked waiter re-attached to its place
    thread::sleep(Duration::from_millis(1500));
    let st = lock.status().unwrap();
    assert_eq!(
        st.holder.expect("hold lost in the restart").fencing_token,
        token
    );
    let now: Vec<String> = st.waiters.into_iter().map(|w| w.origin.owner).collect();
    assert_eq!(now, queue, "the queue changed across the restart");
    // the watchdog kept renewing through the restart (lease 3 s, now > 3 s since the last grant)
    thread::sleep(Duration::from_millis(2000));
    assert!(
        holder.is_held_in_redis().unwrap(),
        "lease not renewed after the restart"
    );
    assert!(!holder.is_lost());
    holder.unlock().unwrap();
    // in token order the waiters are in queue order 0, 1, 2; tokens are time-seeded, so only
    // their order is checked: all distinct, all after the holder's
    support::assert_served_in_queue_order(threads, &rx, token);
}

#[test]
fn a_holder_paused_past_its_lease_loses_the_lock_and_its_late_release_changes_nothing() {
    let children = support::child_test!(crash_child);
    let _serial = serial();
    let server = RedisServer::start();
    let client = support::client(&server);
    let lock = client.fair_lock("paused").unwrap();
    let mut holder = children.spawn("paused-holder", &child_env(&server, "paused", 1000));
    let old_token: u64 = holder.expect("HELD", SECS_30).parse().unwrap();

    holder.signal(libc::SIGSTOP);
    let stopped = Instant::now();
    // the paused holder cannot renew: this waiter gets the lock once the 1 s lease runs out
    let g = lock.lock().unwrap();
    let waited = stopped.elapsed();
    println!("got a paused holder's lock after {waited:?}");
    assert!(
        waited < Duration::from_secs(2),
        "waited {waited:?} for a 1 s lease"
    );
    assert!(g.fencing_token() > old_token);

    holder.signal(libc::SIGCONT);
    holder.send("go");
    assert_eq!(
        holder.expect("LOST", SECS_30),
        "true",
        "the old holder did not notice"
    );
    assert_eq!(holder.expect("UNLOCK", SECS_30), "not-held");
    assert!(holder.exits_ok(SECS_30));
    // the new owner still holds it, and nobody extended or shortened its lease
    assert!(g.is_held_in_redis().unwrap());
    let h = lock.status().unwrap().holder.unwrap();
    assert_eq!(h.origin.owner, client.current_owner());
    assert_eq!(h.fencing_token, g.fencing_token());
    g.unlock().unwrap();
}
