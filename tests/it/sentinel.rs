//! A Sentinel group on loopback (1 master, 2 replicas, 3 sentinels; `support::topology`): the
//! client reaches the master through the sentinels and follows a failover without a restart.
//! Waiters blocked on the old master re-check their places on the new one and are served in
//! order, a hold that reached the replicas survives, and tokens keep rising.

use crate::support;
#[cfg(feature = "tls")]
use crate::support::tls as tls_support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::support::topology::{LoneSentinel, SentinelGroup};

const SECS_30: Duration = Duration::from_secs(30);
const SECS_60: Duration = Duration::from_secs(60);

fn client(group: &SentinelGroup) -> fairlock::LockClient {
    let urls = group.sentinel_urls();
    let sentinels: Vec<&str> = urls.iter().map(String::as_str).collect();
    fairlock::LockClient::builder_sentinel("mymaster", &sentinels)
        .lease(Duration::from_secs(10))
        .janitor_interval(Duration::from_millis(300))
        .failover_timeout(SECS_30)
        .build()
        .expect("a client through the sentinels")
}

/// `ZCARD` of the lock's queue on `port`.
fn queued_on(group: &SentinelGroup, port: u16, name: &str) -> usize {
    redis::cmd("ZCARD")
        .arg(format!("fairlock:{{{name}}}:queue"))
        .query(&mut group.conn_to(port))
        .unwrap_or(0)
}

/// Wait (bounded) until every replica has the queue with `n` entries: what the failover test
/// assumes reached them before the master dies.
fn wait_replicated(group: &SentinelGroup, name: &str, n: usize) {
    let replicas = group.replica_ports();
    assert!(
        support::eventually(SECS_30, || replicas
            .iter()
            .all(|p| queued_on(group, *p, name) == n)),
        "the queue of {n} did not reach the replicas {replicas:?}"
    );
}

#[test]
fn a_master_killed_under_a_hold_and_waiters_serves_every_waiter_in_order_on_the_new_master() {
    let mut group = SentinelGroup::start();
    let client = client(&group);
    let lock = client.fair_lock("failover").unwrap();
    let guard = lock.lock().unwrap();
    let first_token = guard.fencing_token();
    let in_section = Arc::new(AtomicBool::new(true));

    // 4 waiters queue one after another (each waits until the queue shows it)
    let served = Arc::new(Mutex::new(Vec::new()));
    let (errors_tx, errors) = mpsc::channel();
    let mut waiters = vec![];
    for i in 0..4 {
        let waiter = lock.clone();
        let in_section = in_section.clone();
        let served = served.clone();
        let errors_tx = errors_tx.clone();
        waiters.push(thread::spawn(move || match waiter.try_lock_for(SECS_60) {
            Ok(Some(g)) => {
                assert!(
                    !in_section.swap(true, Ordering::SeqCst),
                    "two holders at once"
                );
                served.lock().unwrap().push((i, g.fencing_token()));
                thread::sleep(Duration::from_millis(20));
                in_section.store(false, Ordering::SeqCst);
                if let Err(e) = g.unlock() {
                    let _ = errors_tx.send(format!("waiter {i} release: {e}"));
                }
            }
            Ok(None) => {
                let _ = errors_tx.send(format!("waiter {i} not served in 60 s"));
            }
            Err(e) => {
                let _ = errors_tx.send(format!("waiter {i}: {e}"));
            }
        }));
        assert!(
            support::eventually(SECS_30, || lock.status().unwrap().waiters.len() == i + 1),
            "waiter {i} did not queue"
        );
    }
    drop(errors_tx);
    wait_replicated(&group, "failover", 4);

    let old = group.kill_master();
    let new = group.wait_for_new_master(old, SECS_60);
    assert_ne!(old, new);

    // the hold reached the replicas before the kill: it lives on, and renewals go to the new
    // master (the watchdog rides out the failover)
    let renewed_after = Instant::now();
    assert!(
        support::eventually(SECS_30, || lock
            .status()
            .is_ok_and(|s| s.waiters.len() == 4)),
        "the queue did not survive the failover"
    );
    thread::sleep(Duration::from_secs(4)); // more than a third of the lease: a renewal ran
    assert!(
        !guard.is_lost(),
        "a replicated hold was reported lost after {:?}",
        renewed_after.elapsed()
    );
    in_section.store(false, Ordering::SeqCst);
    guard.unlock().expect("release on the new master");

    for w in waiters {
        w.join().expect("a waiter panicked");
    }
    let errors: Vec<String> = errors.iter().collect();
    assert!(errors.is_empty(), "{errors:?}");
    let served = served.lock().unwrap().clone();
    let order: Vec<usize> = served.iter().map(|(i, _)| *i).collect();
    assert_eq!(order, vec![0, 1, 2, 3], "served out of queue order");
    let tokens: Vec<u64> = served.iter().map(|(_, t)| *t).collect();
    assert!(tokens[0] > first_token, "{tokens:?} after {first_token}");
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    let status = lock.status().unwrap();
    assert!(
        status.holder.is_none() && status.waiters.is_empty(),
        "{status:?}"
    );
}

/// `SENTINEL FAILOVER` is not atomic: the promoted replica takes writes at once, the old master
/// until the sentinels make it a replica, and a hold granted there in between (before the
/// client follows the switch) never reaches the new master. With every replica's
/// acknowledgement asked for (2 of 2 here) such a grant cannot count: the promoted replica
/// stopped acknowledging the moment it was promoted. So under load there are never two holders
/// and no token is handed out twice; grants the replicas did not all acknowledge fail cleanly
/// (`NotReplicated`, the lock passed on) until the old master is a replica again, and then the
/// lock is usable again.
#[test]
fn a_graceful_failover_under_load_with_every_replica_acknowledging_loses_no_update() {
    let group = SentinelGroup::start();
    let client = client_with_acks(&group, 2, Duration::from_secs(1));
    graceful_failover_under_load(&group, &client);
}

/// The same over TLS: every node and sentinel speaks TLS only (replication and the sentinels' own
/// connections too), and the client trusts the test CA.
#[cfg(feature = "tls")]
#[test]
fn over_tls_a_graceful_failover_under_load_with_every_replica_acknowledging_loses_no_update() {
    let certs = tls_support::certs();
    tls_support::install_provider();
    let group = SentinelGroup::start_tls([&certs.server.0, &certs.server.1, &certs.ca]);
    let urls = group.sentinel_urls();
    assert!(urls.iter().all(|u| u.starts_with("rediss://")), "{urls:?}");
    let sentinels: Vec<&str> = urls.iter().map(String::as_str).collect();
    let client = fairlock::LockClient::builder_sentinel("mymaster", &sentinels)
        .janitor_interval(Duration::from_millis(300))
        .replica_acks(2, Duration::from_secs(1))
        .tls_ca_file(&certs.ca)
        .build()
        .expect("a TLS client through the sentinels");
    graceful_failover_under_load(&group, &client);
}

/// 4 threads take one lock in turn while the sentinels fail the master over gracefully: one
/// holder at a time, no token twice, no error, and the lock usable once the old master is a
/// replica again.
fn graceful_failover_under_load(group: &SentinelGroup, client: &fairlock::LockClient) {
    let lock = client.fair_lock("graceful").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let in_section = Arc::new(AtomicBool::new(false));
    let done = Arc::new(Mutex::new(Vec::new()));
    let mut workers = vec![];
    for w in 0..4 {
        let (lock, stop, in_section, done) =
            (lock.clone(), stop.clone(), in_section.clone(), done.clone());
        workers.push(thread::spawn(move || {
            let mut tokens = vec![];
            let mut errors = vec![];
            let mut not_replicated = 0;
            while !stop.load(Ordering::SeqCst) {
                match lock.try_lock_for(SECS_30) {
                    Ok(Some(g)) => {
                        assert!(
                            !in_section.swap(true, Ordering::SeqCst),
                            "two holders at once"
                        );
                        tokens.push((g.fencing_token(), Instant::now()));
                        thread::sleep(Duration::from_millis(2));
                        in_section.store(false, Ordering::SeqCst);
                        if let Err(e) = g.unlock() {
                            errors.push(format!("worker {w} release: {e}"));
                        }
                    }
                    Ok(None) => errors.push(format!("worker {w}: not served in 30 s")),
                    Err(fairlock::Error::NotReplicated { .. }) => {
                        not_replicated += 1;
                        thread::sleep(Duration::from_millis(20));
                    }
                    Err(e) => errors.push(format!("worker {w}: {e}")),
                }
            }
            done.lock().unwrap().push((tokens, errors, not_replicated));
        }));
    }
    thread::sleep(Duration::from_millis(500));
    let old = group.master_port();
    let new = group.failover();
    assert_ne!(old, new);
    // until the old master is a replica again (the sentinels convert it ~8 s after the
    // switch), and a little longer: the lock must be usable again by then
    group.wait_for_replicas(SECS_60);
    let usable_again = Instant::now();
    thread::sleep(Duration::from_millis(1500));
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        w.join().expect("a worker panicked");
    }
    let done = done.lock().unwrap();
    let errors: Vec<&String> = done.iter().flat_map(|(_, e, _)| e).collect();
    assert!(errors.is_empty(), "{errors:?}");
    let mut tokens: Vec<u64> = done
        .iter()
        .flat_map(|(t, _, _)| t.iter().map(|(t, _)| *t))
        .collect();
    let n = tokens.len();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), n, "two holds shared a token");
    assert!(n > 20, "only {n} acquisitions");
    let after = done
        .iter()
        .flat_map(|(t, _, _)| t)
        .filter(|(_, at)| *at > usable_again)
        .count();
    let refused: u32 = done.iter().map(|(_, _, r)| r).sum();
    eprintln!("{n} acquisitions, {after} after the old master was a replica again, {refused} grants refused as not replicated");
    assert!(
        after > 0,
        "the lock was not usable again after the failover"
    );
}

/// The token of the hold `HGET fairlock:{name}` shows on the node on `port` (`None`: free
/// there, or no hash).
fn held_on(group: &SentinelGroup, port: u16, name: &str) -> Option<u64> {
    let (owner, token): (Option<String>, Option<u64>) = redis::cmd("HMGET")
        .arg(format!("fairlock:{{{name}}}"))
        .arg("owner")
        .arg("token")
        .query(&mut group.conn_to(port))
        .ok()?;
    owner.filter(|o| !o.is_empty()).and(token)
}

/// After `SENTINEL FAILOVER` the old master stays up and writable until the sentinels make it
/// a replica, seconds later (here never: it refuses `REPLICAOF`). A client that stayed with it
/// would take grants the new master never sees, lost once the old one is converted. The client
/// must follow the master the sentinels name: new holds, the release of a hold from before the
/// switch and a thread that waited across it all happen on the new master.
#[test]
fn after_a_graceful_failover_the_client_leaves_the_old_master_while_it_still_takes_writes() {
    let group =
        SentinelGroup::start_with("rename-command REPLICAOF \"\"\nrename-command SLAVEOF \"\"\n");
    let client = client(&group);
    let lock = client.fair_lock("follow").unwrap();
    let probe = client.fair_lock("probe").unwrap();
    // pooled connections to the old master, a hold, and a thread waiting behind it
    drop(probe.lock().unwrap());
    let held = lock.lock().unwrap();
    let (served_tx, served) = mpsc::channel();
    let (release_tx, release) = mpsc::channel::<()>();
    let waiter = {
        let lock = lock.clone();
        thread::spawn(move || {
            let guard = lock.lock().expect("the waiter is served");
            served_tx.send(guard.fencing_token()).unwrap();
            release.recv_timeout(SECS_60).ok();
            guard.unlock().expect("the waiter's release");
        })
    };
    wait_replicated(&group, "follow", 1);

    let old = group.master_port();
    let new = group.failover();
    assert_ne!(old, new);
    assert_eq!(
        group.role(old),
        Some(support::topology::Role::Master),
        "the old master must still be a master for this test"
    );

    // new holds go to the new master, soon; until then a hold taken on the old master may
    // find itself gone at its release, which goes to the new one (the split the client ends)
    let deadline = Instant::now() + SECS_30;
    let mut moved_after = None;
    for i in 0.. {
        let g = probe.lock().unwrap();
        let on_new = held_on(&group, new, "probe") == Some(g.fencing_token());
        match g.unlock() {
            Ok(()) => {}
            Err(fairlock::Error::NotHeld { .. }) if !on_new => {}
            Err(e) => panic!("release of a probe hold: {e}"),
        }
        if on_new {
            moved_after = Some(i);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after {i} holds in {SECS_30:?}, the client still takes its holds on the old master {old}"
        );
        thread::sleep(Duration::from_millis(50));
    }
    eprintln!("holds moved to the new master after {moved_after:?} probes");
    for _ in 0..10 {
        let g = probe.lock().unwrap();
        assert_eq!(held_on(&group, new, "probe"), Some(g.fencing_token()));
        assert_ne!(held_on(&group, old, "probe"), Some(g.fencing_token()));
        g.unlock().unwrap();
    }

    // the hold from before the switch reached the new master, and is released there; the
    // thread that waited across the switch is served there
    assert_eq!(held_on(&group, new, "follow"), Some(held.fencing_token()));
    held.unlock()
        .expect("the release of the hold from before the switch");
    let token = served
        .recv_timeout(SECS_60)
        .expect("the waiter was not served within 60 s");
    assert_eq!(
        held_on(&group, new, "follow"),
        Some(token),
        "the waiter's hold is not on the new master"
    );
    assert_ne!(held_on(&group, old, "follow"), Some(token));
    release_tx.send(()).unwrap();
    waiter.join().expect("the waiter panicked");
    assert_eq!(held_on(&group, new, "follow"), None);
}

/// During a failover the sentinels can disagree on the master for a while, and two nodes can
/// be masters at once, each named by some sentinel. A client must follow only the master that
/// more than half of the sentinels in its URL name, with every connection (pool and waker):
/// here a lone sentinel, listed first, names a writable master of its own, and the group's
/// three sentinels name theirs. With no majority a client is refused, with an error that says
/// what each sentinel answered.
#[test]
fn a_client_follows_only_the_master_that_more_than_half_of_the_sentinels_name() {
    let group = SentinelGroup::start();
    let lone = LoneSentinel::start();
    let mut urls = vec![lone.sentinel_url()];
    urls.extend(group.sentinel_urls());
    let sentinels: Vec<&str> = urls.iter().map(String::as_str).collect();
    let client = fairlock::LockClient::builder_sentinel("mymaster", &sentinels)
        .janitor_interval(Duration::from_millis(300))
        .failover_timeout(SECS_30)
        .build()
        .expect("a client through the sentinels");
    let (master, other) = (group.master_port(), lone.master_port());
    let lock = client.fair_lock("majority").unwrap();
    let held = lock.lock().unwrap();
    assert_eq!(
        held_on(&group, master, "majority"),
        Some(held.fencing_token()),
        "the hold is not on the master that 3 of the 4 sentinels name"
    );
    assert_eq!(held_on(&group, other, "majority"), None);
    // a waiter blocks on the waker's connection: it too must be on the majority's master
    let (served_tx, served) = mpsc::channel();
    let waiter = {
        let lock = lock.clone();
        thread::spawn(move || {
            let guard = lock.lock().expect("the waiter is served");
            served_tx.send(guard.fencing_token()).unwrap();
            thread::sleep(Duration::from_millis(200));
            guard.unlock().expect("the waiter's release");
        })
    };
    assert!(
        support::eventually(SECS_30, || queued_on(&group, master, "majority") == 1),
        "the waiter did not queue on the master {master}"
    );
    held.unlock().unwrap();
    let token = served.recv_timeout(SECS_60).expect("the waiter was served");
    assert_eq!(held_on(&group, master, "majority"), Some(token));
    waiter.join().expect("the waiter panicked");

    // the lone sentinel and one of the group's: 1 of 2 each, no majority
    let two = [lone.sentinel_url(), group.sentinel_urls()[0].clone()];
    let two: Vec<&str> = two.iter().map(String::as_str).collect();
    match fairlock::LockClient::builder_sentinel("mymaster", &two)
        .failover_timeout(Duration::from_secs(1))
        .build()
    {
        Err(e @ fairlock::Error::Connection { .. }) => {
            let text = e.to_string();
            assert!(
                text.contains("more than half")
                    && text.contains("names 127.0.0.1")
                    && text.contains(&format!(":{other}")),
                "the error does not say what the sentinels answered: {text}"
            );
        }
        other => panic!(
            "two sentinels naming two masters: {:?}",
            other.map(|_| "a client")
        ),
    }
    // a master no sentinel knows
    let group_urls = group.sentinel_urls();
    let group_sentinels: Vec<&str> = group_urls.iter().map(String::as_str).collect();
    match fairlock::LockClient::builder_sentinel("nosuch", &group_sentinels).build() {
        Err(e) => assert!(
            e.to_string().contains("knows no master nosuch"),
            "the error does not name the unknown master: {e}"
        ),
        Ok(_) => panic!("a client for a master no sentinel knows"),
    }
}

/// A group whose data nodes ask for a password (`requirepass`, with `masterauth` on the
/// replicas and `auth-pass` on the sentinels; the sentinels themselves ask for none): the
/// credentials of a `redis+sentinel://` URL reach the master; without them the client is
/// refused with an error that names authentication.
#[test]
fn a_password_protected_sentinel_group_takes_the_urls_credentials() {
    let group = SentinelGroup::start();
    let password = "s3cr/t@pw";
    for port in group.node_ports() {
        let mut c = group.conn_to(port);
        for (setting, value) in [("masterauth", password), ("requirepass", password)] {
            let _: () = redis::cmd("CONFIG")
                .arg("SET")
                .arg(setting)
                .arg(value)
                .query(&mut c)
                .unwrap();
        }
    }
    for port in group.sentinel_ports() {
        let _: () = redis::cmd("SENTINEL")
            .arg("SET")
            .arg("mymaster")
            .arg("auth-pass")
            .arg(password)
            .query(&mut group.conn_to(port))
            .unwrap();
    }
    let hosts: Vec<String> = group
        .sentinel_ports()
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect();
    let hosts = hosts.join(",");

    let client =
        fairlock::LockClient::connect(&format!("redis+sentinel://:s3cr%2Ft%40pw@{hosts}/mymaster"))
            .expect("a client with the data nodes' password");
    let lock = client.fair_lock("secret").unwrap();
    let g = lock.lock().unwrap();
    let token = g.fencing_token();
    g.unlock().unwrap();
    assert!(lock
        .try_lock()
        .unwrap()
        .is_some_and(|g| g.fencing_token() > token));

    match fairlock::LockClient::connect(&format!("redis+sentinel://{hosts}/mymaster")) {
        Err(e) => {
            let text = e.to_string().to_lowercase();
            assert!(text.contains("auth"), "{e}");
        }
        Ok(_) => panic!("a client without the password"),
    }
}

#[test]
fn sentinel_urls_without_a_master_name_are_refused() {
    for url in [
        "redis+sentinel://127.0.0.1:26379",
        "redis+sentinel://127.0.0.1:26379/",
        "redis+sentinel:///mymaster",
        "redis+sentinel://127.0.0.1:26379/mymaster/extra",
        "redis+sentinel://user:pw@/mymaster",
    ] {
        match fairlock::LockClient::connect(url) {
            Err(fairlock::Error::InvalidUrl { .. }) => {}
            other => panic!("{url}: {:?}", other.map(|_| "a client")),
        }
    }
}

fn client_with_acks(group: &SentinelGroup, acks: u32, timeout: Duration) -> fairlock::LockClient {
    let urls = group.sentinel_urls();
    let sentinels: Vec<&str> = urls.iter().map(String::as_str).collect();
    fairlock::LockClient::builder_sentinel("mymaster", &sentinels)
        .janitor_interval(Duration::from_millis(300))
        .replica_acks(acks, timeout)
        .build()
        .expect("a client through the sentinels")
}

#[test]
fn with_replica_acks_grants_wait_for_the_replicas_and_unacknowledged_ones_are_passed_on() {
    let mut group = SentinelGroup::start();
    let acked = client_with_acks(&group, 2, Duration::from_secs(2));
    let plain = client(&group);
    let lock = acked.fair_lock("acks").unwrap();

    // both replicas up: an acquire and a hand-off are acknowledged by both
    let guard = lock.lock().unwrap();
    let waiter = {
        let lock = lock.clone();
        thread::spawn(move || lock.lock().map(|g| g.fencing_token()))
    };
    assert!(support::eventually(SECS_30, || lock
        .status()
        .unwrap()
        .waiters
        .len()
        == 1));
    let first = guard.fencing_token();
    guard.unlock().unwrap();
    let handed = waiter.join().unwrap().expect("an acknowledged hand-off");
    assert!(handed > first);

    // no replica left: a grant cannot be acknowledged, so it is given up, never held
    for port in group.replica_ports() {
        group.kill_node(port);
    }
    let short = client_with_acks(&group, 1, Duration::from_millis(200));
    let lonely = short.fair_lock("acks").unwrap();
    match lonely.try_lock() {
        Err(fairlock::Error::NotReplicated { acked, wanted, .. }) => {
            assert_eq!((acked, wanted), (0, 1));
        }
        other => panic!(
            "expected NotReplicated, got {:?}",
            other.map(|g| g.is_some())
        ),
    }
    assert!(
        lock.status().unwrap().holder.is_none(),
        "the given-up grant stayed held"
    );

    // a hand-off to such a client is passed on to the next waiter
    let plain_lock = plain.fair_lock("acks").unwrap();
    let holder = plain_lock.lock().unwrap();
    let unacked = {
        let lonely = lonely.clone();
        thread::spawn(move || lonely.lock().map(|g| g.fencing_token()))
    };
    assert!(support::eventually(SECS_30, || plain_lock
        .status()
        .unwrap()
        .waiters
        .len()
        == 1));
    let next = {
        let plain_lock = plain_lock.clone();
        thread::spawn(move || plain_lock.lock().map(|g| g.fencing_token()))
    };
    assert!(support::eventually(SECS_30, || plain_lock
        .status()
        .unwrap()
        .waiters
        .len()
        == 2));
    holder.unlock().unwrap();
    match unacked.join().unwrap() {
        Err(fairlock::Error::NotReplicated { .. }) => {}
        other => panic!("expected NotReplicated, got {other:?}"),
    }
    next.join()
        .unwrap()
        .expect("the next waiter got the lock passed on");
}

/// A measurement, not a test (timing belongs in benchmarks): the cost of replica
/// acknowledgements on this machine. `cargo test --release --all-features --test it -- --ignored --nocapture
/// sentinel::replica_ack_cost` prints p50 and p99 of an uncontended acquire + release with 0,
/// 1 and 2 acknowledgements asked for, and of a PING, measured in the same run.
#[test]
#[ignore = "a measurement: cargo test --release --all-features --test it -- --ignored --nocapture sentinel::replica_ack_cost"]
fn replica_ack_cost() {
    let group = SentinelGroup::start();
    let mut ping_conn = group.conn_to(group.master_port());
    let pct = |mut v: Vec<f64>, p: f64| {
        v.sort_by(f64::total_cmp);
        v[((v.len() - 1) as f64 * p) as usize]
    };
    let rounds = 2000;
    let pings: Vec<f64> = (0..rounds)
        .map(|_| {
            let t = Instant::now();
            redis::cmd("PING").query::<String>(&mut ping_conn).unwrap();
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    let rtt = pct(pings, 0.5);
    println!("PING p50 {rtt:.0} µs");
    let connections = |conn: &mut redis::Connection| -> u64 {
        let info: String = redis::cmd("INFO").arg("stats").query(conn).unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("total_connections_received:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    let direct = format!("redis://127.0.0.1:{}/", group.master_port());
    for acks in [None, Some(0), Some(1), Some(2)] {
        // None: straight to the master, without the sentinels
        let c = match acks {
            None => fairlock::LockClient::connect(&direct).unwrap(),
            Some(n) => client_with_acks(&group, n, Duration::from_secs(1)),
        };
        let acks = acks.map_or("direct".to_string(), |n| n.to_string());
        let lock = c.fair_lock(&format!("cost-{acks}")).unwrap();
        let opened = connections(&mut ping_conn);
        let pairs: Vec<f64> = (0..rounds)
            .map(|_| {
                let t = Instant::now();
                lock.lock().unwrap().unlock().unwrap();
                t.elapsed().as_secs_f64() * 1e6
            })
            .collect();
        let (p50, p99) = (pct(pairs.clone(), 0.5), pct(pairs, 0.99));
        println!(
            "replica_acks {acks}: acquire + release p50 {p50:.0} µs ({:.2} RTT), p99 {p99:.0} µs; {} connections opened",
            p50 / rtt,
            connections(&mut ping_conn) - opened
        );
    }
}

/// One failover trial: 2 clients x 2 threads take turns on a lock (asking for `acks` replica
/// acknowledgements) while the master is SIGKILLed at a random moment; returns how many times a
/// thread entered the critical section while another was in it (two owners).
fn overlap_trial(group: &mut SentinelGroup, acks: u32, trial: u32) -> (u32, u32, Vec<String>) {
    let name = format!("trial-{acks}-{trial}");
    let in_section = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let done = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(Mutex::new(Vec::new()));
    let clients: Vec<_> = (0..2)
        .map(|_| client_with_acks(group, acks, Duration::from_millis(500)))
        .collect();
    let mut threads = vec![];
    for c in &clients {
        for _ in 0..2 {
            let lock = c.fair_lock(&name).unwrap();
            let (in_section, overlaps, done, stop, errors) = (
                in_section.clone(),
                overlaps.clone(),
                done.clone(),
                stop.clone(),
                errors.clone(),
            );
            threads.push(thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    match lock.try_lock_for(SECS_30) {
                        Ok(Some(g)) => {
                            if in_section.swap(true, Ordering::SeqCst) {
                                overlaps.fetch_add(1, Ordering::SeqCst);
                            }
                            thread::sleep(Duration::from_millis(1));
                            in_section.store(false, Ordering::SeqCst);
                            done.fetch_add(1, Ordering::SeqCst);
                            let _ = g.unlock();
                        }
                        Ok(None) => {}
                        Err(e) => errors.lock().unwrap().push(e.to_string()),
                    }
                }
            }));
        }
    }
    thread::sleep(Duration::from_millis(200 + u64::from(trial * 37 % 300)));
    let old = group.kill_master();
    group.wait_for_new_master(old, SECS_60);
    thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        t.join().unwrap();
    }
    group.restart_node(old);
    let errors = errors.lock().unwrap().clone();
    (
        overlaps.load(Ordering::SeqCst),
        done.load(Ordering::SeqCst),
        errors,
    )
}

/// A measurement (long mode): `FAIRLOCK_TRIALS` (default 20) master kills under load, without and
/// with one replica acknowledgement, counting the times two owners overlapped.
/// `cargo test --release --all-features --test it -- --ignored --nocapture sentinel::failover_overlap_trials`
#[test]
#[ignore = "long mode: cargo test --release --all-features --test it -- --ignored --nocapture sentinel::failover_overlap_trials"]
fn failover_overlap_trials() {
    let trials: u32 = std::env::var("FAIRLOCK_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let mut group = SentinelGroup::start();
    for acks in [0, 1] {
        let (mut overlapped, mut total, mut acquisitions, mut errors) = (0, 0, 0, 0);
        for trial in 0..trials {
            let (o, n, e) = overlap_trial(&mut group, acks, trial);
            overlapped += u32::from(o > 0);
            total += o;
            acquisitions += n;
            errors += e.len();
            println!("acks {acks} trial {trial}: {o} overlaps, {n} acquisitions, errors {e:?}");
        }
        println!(
            "replica_acks {acks}: {overlapped} of {trials} failovers had two owners ({total} overlaps in all), {acquisitions} acquisitions, {errors} errors"
        );
        if acks > 0 {
            assert_eq!(total, 0, "two owners despite replica acknowledgements");
        }
    }
}

/// A sentinel whose process is stopped (a hung host, a paused VM) still accepts TCP connections,
/// so every question to it waits for the whole read timeout. With one of three frozen, and listed
/// first, the two others still make a majority: building a client must stay quick, and no
/// background thread may wait on the frozen one for longer than the work it owes others. Two
/// clients each queue a waiter; the first one's server check runs every second (the other's
/// every minute, as by default: clients check at different moments). Its janitor must keep its
/// waiter alive all the same, or the other client's heartbeat purges it as dead and it queues
/// again at the back: both keep their places and are served in the order they queued.
#[test]
fn a_frozen_sentinel_neither_stalls_the_janitor_nor_costs_waiters_their_places() {
    let group = SentinelGroup::start();
    let master = group.master_port();
    let urls = group.sentinel_urls();
    // after the group: continued (SIGCONT) before the group kills it, on a panic too
    let _frozen = group.freeze_sentinel(group.sentinel_ports()[0]);
    // default connect and read timeouts (2 s, 5 s): what a frozen sentinel costs by default
    let build = |server_check: Duration| {
        let sentinels: Vec<&str> = urls.iter().map(String::as_str).collect();
        let started = Instant::now();
        let client = fairlock::LockClient::builder_sentinel("mymaster", &sentinels)
            .janitor_interval(Duration::from_millis(300))
            .server_check_interval(server_check)
            .failover_timeout(SECS_30)
            .build()
            .expect("a client through 2 of 3 sentinels");
        (client, started.elapsed())
    };
    let queue = || -> Vec<String> {
        redis::cmd("ZRANGE")
            .arg("fairlock:{frozen}:queue")
            .arg(0)
            .arg(-1)
            .query(&mut group.conn_to(master))
            .unwrap_or_default()
    };
    let mut problems = vec![];
    let mut builds = vec![];

    let (holder, took) = build(SECS_60);
    builds.push(took);
    let lock = holder.fair_lock("frozen").unwrap();
    let guard = lock.lock().unwrap();
    let after = guard.fencing_token();
    let (grants_tx, grants) = mpsc::channel();
    let mut clients = vec![];
    let mut waiters = vec![];
    for i in 0..2 {
        let every = if i == 0 {
            Duration::from_secs(1)
        } else {
            SECS_60
        };
        let (client, took) = build(every);
        builds.push(took);
        let lock = client.fair_lock("frozen").unwrap();
        let grants_tx = grants_tx.clone();
        waiters.push(thread::spawn(move || match lock.try_lock_for(SECS_60) {
            Ok(Some(g)) => {
                let _ = grants_tx.send((g.fencing_token(), i));
                thread::sleep(Duration::from_millis(20));
                g.unlock().map_err(|e| format!("waiter {i} release: {e}"))
            }
            Ok(None) => Err(format!("waiter {i} not served in 60 s")),
            Err(e) => Err(format!("waiter {i}: {e}")),
        }));
        assert!(
            support::eventually(SECS_30, || queue().len() == i + 1),
            "waiter {i} did not queue: {:?}",
            queue()
        );
        clients.push(client);
    }
    drop(grants_tx);

    // eight server checks of the first client (every second) and some 26 heartbeats of each
    // (every 300 ms; a waiter silent for 900 ms is dead): the queue must stay as it is
    let ids: Vec<String> = clients.iter().map(|c| format!("{}:", c.id())).collect();
    let places = |q: &[String]| -> Vec<Option<usize>> {
        q.iter()
            .map(|owner| ids.iter().position(|id| owner.starts_with(id)))
            .collect()
    };
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_secs(8) {
        let q = places(&queue());
        if q != [Some(0), Some(1)] {
            problems.push(format!(
                "{:?} after the second waiter queued the queue was {q:?} (waiter 0, then \
                 waiter 1 expected): a waiter lost its place",
                watched.elapsed()
            ));
            break;
        }
        thread::sleep(Duration::from_millis(50));
    }

    guard.unlock().expect("the holder's release");
    let mut served = vec![];
    for _ in 0..2 {
        match grants.recv_timeout(SECS_60) {
            Ok(grant) => served.push(grant),
            Err(_) => break,
        }
    }
    for w in waiters {
        if let Err(e) = w.join().expect("a waiter panicked") {
            problems.push(e);
        }
    }
    served.sort();
    let order: Vec<usize> = served.iter().map(|&(_, i)| i).collect();
    if order != [0, 1] {
        problems.push(format!(
            "served {served:?} (token, waiter): not in queue order"
        ));
    }
    if served.first().is_some_and(|&(token, _)| token <= after) {
        problems.push(format!("tokens {served:?} after {after}"));
    }
    eprintln!("build() with 1 of 3 sentinels frozen took {builds:?}");
    if builds.iter().any(|b| *b >= Duration::from_secs(2)) {
        problems.push(format!(
            "build() took {builds:?} with 1 of 3 sentinels frozen (2 s at most expected)"
        ));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// `CLIENT UNBLOCK` calls of the node on `port` so far.
fn unblock_calls(group: &SentinelGroup, port: u16) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut group.conn_to(port))
        .unwrap_or_default();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_client|unblock:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// While the waiting threads' BLPOP hangs on a frozen master that a failover left behind, a thread
/// that starts waiting on another lock asks the new master to `CLIENT UNBLOCK` a connection it has
/// never seen. That answer (0) once meant "look again" for the whole read timeout, sleeping 200 µs
/// between calls: thousands of calls. Now the waker looks the connection up (`CLIENT LIST ID`)
/// after three, and backs off.
#[test]
fn unblocking_a_blpop_stuck_on_a_frozen_master_does_not_spin_on_the_new_master() {
    let group = SentinelGroup::start();
    let old_master = group.master_port();
    let holder = client(&group);
    let urls = group.sentinel_urls();
    let sentinels: Vec<&str> = urls.iter().map(String::as_str).collect();
    // a long read timeout: the BLPOP on the frozen master hangs for 1 s + 10 s
    let waiter = fairlock::LockClient::builder_sentinel("mymaster", &sentinels)
        .lease(Duration::from_secs(10))
        .janitor_interval(Duration::from_millis(300))
        .read_timeout(Duration::from_secs(10))
        .failover_timeout(SECS_30)
        .build()
        .expect("a client through the sentinels");
    let first = holder.fair_lock("stuck-a").unwrap().lock().unwrap();
    let second = holder.fair_lock("stuck-b").unwrap().lock().unwrap();
    let wait_on = |name: &str| {
        let lock = waiter.fair_lock(name).unwrap();
        thread::spawn(move || {
            lock.try_lock_for(SECS_60)
                .map(|g| g.map(|g| g.fencing_token()))
        })
    };
    let waiting_a = wait_on("stuck-a");
    assert!(support::eventually(SECS_30, || queued_on(
        &group, old_master, "stuck-a"
    ) == 1));
    wait_replicated(&group, "stuck-a", 1);

    let frozen = group.freeze_node(old_master);
    let new_master = group.wait_for_new_master(old_master, SECS_60);
    // the clients' master watches follow the sentinels within 200 ms
    thread::sleep(Duration::from_secs(1));
    let before = unblock_calls(&group, new_master);
    let waiting_b = wait_on("stuck-b");
    // longer than the read timeout the UNBLOCK loop once spun for
    thread::sleep(Duration::from_secs(11));
    let calls = unblock_calls(&group, new_master) - before;
    assert!(
        calls <= 20,
        "{calls} CLIENT UNBLOCK calls on the new master for one newly watched lock"
    );

    // and both waits end once the holds are released or have run out on the new master (the
    // renewals that went to the frozen master may have let them lapse: dropped, not unlocked)
    drop(frozen);
    drop(first);
    drop(second);
    for (name, waiting) in [("stuck-a", waiting_a), ("stuck-b", waiting_b)] {
        let got = waiting.join().unwrap();
        assert!(matches!(got, Ok(Some(_))), "{name}: {got:?}");
    }
}

/// A read/write lock through the sentinels, under a graceful failover (`SENTINEL FAILOVER`)
/// with every replica acknowledging each grant: 2 writer and 2 reader threads take it in a loop.
/// A write never overlaps another hold, tokens never repeat, and the lock is usable again
/// after the failover.
#[test]
fn a_read_write_lock_under_a_graceful_failover_keeps_writes_alone() {
    let group = SentinelGroup::start();
    // SENTINEL FAILOVER does not wait for the replica to catch up: a release in the last moment
    // may be lost with the old master, and its hold then lasts until its lease ends (nobody
    // renews it). A short lease keeps that wait short.
    let urls = group.sentinel_urls();
    let sentinels: Vec<&str> = urls.iter().map(String::as_str).collect();
    let client = fairlock::LockClient::builder_sentinel("mymaster", &sentinels)
        .lease(Duration::from_secs(2))
        .janitor_interval(Duration::from_millis(300))
        .replica_acks(2, Duration::from_secs(2))
        .build()
        .expect("a client through the sentinels");
    let rw = client.rw_lock("catalog").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    // readers inside, and whether a writer is inside
    let readers = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let writing = Arc::new(AtomicBool::new(false));
    let done = Arc::new(Mutex::new(Vec::new()));
    let mut workers = vec![];
    for w in 0..4 {
        let (rw, stop, readers, writing, done) = (
            rw.clone(),
            stop.clone(),
            readers.clone(),
            writing.clone(),
            done.clone(),
        );
        workers.push(thread::spawn(move || {
            let (mut tokens, mut errors) = (vec![], vec![]);
            let mut after = 0;
            while !stop.load(Ordering::SeqCst) {
                let write = w % 2 == 0;
                let got = if write {
                    rw.try_write_for(SECS_30).map(|g| {
                        g.map(|g| {
                            assert!(!writing.swap(true, Ordering::SeqCst), "two writers");
                            assert_eq!(readers.load(Ordering::SeqCst), 0, "a write beside reads");
                            let t = g.fencing_token();
                            thread::sleep(Duration::from_millis(2));
                            writing.store(false, Ordering::SeqCst);
                            (t, g.unlock())
                        })
                    })
                } else {
                    rw.try_read_for(SECS_30).map(|g| {
                        g.map(|g| {
                            readers.fetch_add(1, Ordering::SeqCst);
                            assert!(!writing.load(Ordering::SeqCst), "a read beside a write");
                            let t = g.fencing_token();
                            thread::sleep(Duration::from_millis(2));
                            readers.fetch_sub(1, Ordering::SeqCst);
                            (t, g.unlock())
                        })
                    })
                };
                match got {
                    Ok(Some((t, released))) => {
                        tokens.push(t);
                        if let Err(e) = released {
                            errors.push(format!("worker {w} release: {e}"));
                        }
                        if stop.load(Ordering::Relaxed) {
                            after += 1;
                        }
                    }
                    Ok(None) => {
                        errors.push(format!("worker {w}: not served in 30 s: {:?}", rw.status()))
                    }
                    Err(fairlock::Error::NotReplicated { .. }) => {
                        thread::sleep(Duration::from_millis(20))
                    }
                    Err(e) => errors.push(format!("worker {w}: {e}")),
                }
            }
            done.lock().unwrap().push((tokens, errors, after));
        }));
    }
    thread::sleep(Duration::from_millis(500));
    let old = group.master_port();
    assert_ne!(old, group.failover());
    group.wait_for_replicas(SECS_60);
    let before_stop = done.lock().unwrap().len();
    assert_eq!(before_stop, 0);
    let counted = {
        let t = Instant::now();
        // the lock must be usable on the new master: a write by this thread
        let w = rw
            .try_write_for(SECS_30)
            .expect("a write after the failover");
        let ok = w.is_some();
        drop(w);
        (ok, t.elapsed())
    };
    assert!(counted.0, "no write within 30 s after the failover");
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        w.join().expect("a worker panicked");
    }
    let done = done.lock().unwrap();
    let errors: Vec<&String> = done.iter().flat_map(|(_, e, _)| e).collect();
    assert!(errors.is_empty(), "{errors:?}");
    let mut tokens: Vec<u64> = done.iter().flat_map(|(t, _, _)| t.clone()).collect();
    let n = tokens.len();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), n, "two holds shared a token");
    assert!(n > 20, "only {n} acquisitions");
}
