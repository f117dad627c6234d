//! `LockClient::find_deadlocks` and `fairlock deadlocks` / `fairlock list` against real
//! redis-servers: cycles of threads (each with a `LockClient` of its own, so an owner id of its
//! own) that hold one lock and wait for the next one's are reported with every holder and wait;
//! locks taken in one global order are never reported; a cycle that dissolved before the
//! confirming read is not reported; semaphores and read/write locks join the graph. Every wait
//! is bounded: each member waits at most `LIMIT`, and each test breaks its cycle by force.

use crate::support;

use std::collections::BTreeSet;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::support::{eventually, Out, RedisServer};
use fairlock::{Blocking, Deadlock, HoldKind, ListOptions, LockClient};

/// Upper bound for any one wait, thread or fairlock process in these tests.
const LIMIT: Duration = Duration::from_secs(30);

/// What a member holds or waits for.
#[derive(Clone, Copy, Debug)]
enum Res {
    Lock(&'static str),
    /// A semaphore of this capacity; one permit.
    Permit(&'static str, u64),
}

/// A member thread: its own client; holds `hold`, says so, then, once `go` is sent (or
/// dropped), waits at most `wait` for `want`. The thread is named `member-<hold's name>`; it
/// returns whether it got `want`.
fn member(server: &RedisServer, hold: Res, want: Res, wait: Duration) -> Member {
    member_at(server.url(), hold, want, wait)
}

/// [`member`] of the server at `url`.
fn member_at(url: String, hold: Res, want: Res, wait: Duration) -> Member {
    let (held_tx, held_rx) = mpsc::channel();
    let (go, go_rx) = mpsc::channel::<()>();
    let name = match hold {
        Res::Lock(n) | Res::Permit(n, _) => format!("member-{n}"),
    };
    let t = std::thread::Builder::new()
        .name(name)
        .spawn(move || {
            let client = support::client_with_url(&url, |b| b);
            let _held: Box<dyn std::any::Any> = match hold {
                Res::Lock(n) => Box::new(client.fair_lock(n).unwrap().lock().unwrap()),
                Res::Permit(n, cap) => {
                    Box::new(client.semaphore(n, cap).unwrap().acquire().unwrap())
                }
            };
            held_tx.send(()).unwrap();
            let _ = go_rx.recv_timeout(LIMIT);
            match want {
                Res::Lock(n) => client
                    .fair_lock(n)
                    .unwrap()
                    .try_lock_for(wait)
                    .unwrap()
                    .is_some(),
                Res::Permit(n, cap) => client
                    .semaphore(n, cap)
                    .unwrap()
                    .try_acquire_for(wait)
                    .unwrap()
                    .is_some(),
            }
        })
        .unwrap();
    held_rx
        .recv_timeout(LIMIT)
        .expect("the member took its hold");
    Member { thread: t, go }
}

/// A member thread and what starts its wait.
struct Member {
    thread: JoinHandle<bool>,
    go: mpsc::Sender<()>,
}

/// Start the members' waits (each holds its lock by now); their threads.
fn go(members: Vec<Member>) -> Vec<JoinHandle<bool>> {
    members
        .into_iter()
        .map(|m| {
            m.go.send(()).unwrap();
            m.thread
        })
        .collect()
}

/// Whether `res` has `n` waiters within `LIMIT`.
fn waiters(client: &LockClient, res: Res, n: usize) -> bool {
    eventually(LIMIT, || match res {
        Res::Lock(name) => {
            client
                .fair_lock(name)
                .unwrap()
                .status()
                .unwrap()
                .waiters
                .len()
                == n
        }
        Res::Permit(name, cap) => {
            client
                .semaphore(name, cap)
                .unwrap()
                .status()
                .unwrap()
                .waiters
                .len()
                == n
        }
    })
}

/// Join `t` within `LIMIT`; what it returned.
fn join(t: JoinHandle<bool>) -> bool {
    assert!(
        eventually(LIMIT, || t.is_finished()),
        "a member did not finish within {LIMIT:?}"
    );
    t.join().unwrap()
}

/// (lock, holder's thread, what it waits for) of each member, in cycle order.
fn shape(d: &Deadlock) -> Vec<(String, String, String)> {
    d.members
        .iter()
        .map(|m| {
            (
                m.lock.name.clone(),
                m.holder.thread.clone(),
                m.waits_for.name.clone(),
            )
        })
        .collect()
}

/// The shape rotated to start at its smallest lock name (the cycle's start is the smallest
/// owner id's wait, which these tests do not choose).
fn normalized(d: &Deadlock) -> Vec<(String, String, String)> {
    let mut s = shape(d);
    let first = (0..s.len()).min_by_key(|&i| s[i].0.clone()).unwrap();
    s.rotate_left(first);
    s
}

fn triple(lock: &str, thread: &str, waits: &str) -> (String, String, String) {
    (lock.into(), thread.into(), waits.into())
}

/// The cycle of `names` as [`normalized`] gives it: lock `names[i]` held by `member-<names[i]>`,
/// which waits for the next name (the last for the first), from the smallest name on.
fn ring(names: &[&str]) -> Vec<(String, String, String)> {
    let n = names.len();
    let mut ring: Vec<(String, String, String)> = (0..n)
        .map(|i| {
            triple(
                names[i],
                &format!("member-{}", names[i]),
                names[(i + 1) % n],
            )
        })
        .collect();
    let first = (0..n).min_by_key(|&i| names[i]).unwrap_or(0);
    ring.rotate_left(first);
    ring
}

fn fairlock(server: &RedisServer, args: &[&str]) -> Out {
    support::fairlock_cli(server, args, LIMIT)
}

#[test]
fn deadlock_of_two_holders_is_reported_with_both_holds_and_waits_then_gone_once_broken() {
    let server = RedisServer::start();
    let admin = support::client(&server);
    let m1 = member(&server, Res::Lock("a"), Res::Lock("b"), LIMIT);
    let m2 = member(&server, Res::Lock("b"), Res::Lock("a"), LIMIT);
    let [t1, t2]: [JoinHandle<bool>; 2] = go(vec![m1, m2]).try_into().unwrap();
    assert!(waiters(&admin, Res::Lock("a"), 1) && waiters(&admin, Res::Lock("b"), 1));

    let found = admin.find_deadlocks().unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(
        normalized(&found[0]),
        [triple("a", "member-a", "b"), triple("b", "member-b", "a")]
    );
    let a = admin.fair_lock("a").unwrap().status().unwrap();
    let b = admin.fair_lock("b").unwrap().status().unwrap();
    for m in &found[0].members {
        let st = if m.lock.name == "a" { &a } else { &b };
        let h = st.holder.as_ref().unwrap();
        assert_eq!(m.holder, h.origin, "{m:?}");
        assert_eq!(m.holder.pid, std::process::id());
        assert_eq!(
            m.blocking,
            Blocking::Holds {
                fencing_token: h.fencing_token,
                permits: 1
            }
        );
        assert_eq!(
            (m.lock.kind, m.waits_for.kind),
            (HoldKind::Lock, HoldKind::Lock)
        );
        // what the holder waits for is its place in the other lock's queue
        let other = if m.lock.name == "a" { &b } else { &a };
        assert_eq!(other.waiters[0].origin, m.holder);
        assert_eq!(other.waiters[0].queued_at, m.queued_at);
    }
    // the two holders' owners differ, and the youngest wait is the later queued one
    let y = found[0].youngest_wait().unwrap();
    let latest = found[0].members.iter().map(|m| m.queued_at).max().unwrap();
    assert_eq!(y.queued_at, latest);

    // the command-line tool: text, exit code 3, JSON
    let out = fairlock(&server, &["deadlocks"]);
    assert_eq!(out.code, Some(3), "{} {}", out.stdout, out.stderr);
    for needle in [
        "deadlock 1 of 1: 2 holders",
        "lock \"a\": held by ",
        "lock \"b\": held by ",
        "(thread \"member-a\")",
        "(thread \"member-b\")",
        "it waits for lock \"b\"",
        "it waits for lock \"a\"",
        "1 deadlock found",
    ] {
        assert!(out.stdout.contains(needle), "{needle:?} in {}", out.stdout);
    }
    let out = fairlock(&server, &["deadlocks", "--json"]);
    assert_eq!(out.code, Some(3), "{} {}", out.stdout, out.stderr);
    let json: serde_json::Value = serde_json::from_str(&out.stdout).expect("JSON");
    let members = json[0]["members"].as_array().expect("members");
    assert_eq!(json.as_array().unwrap().len(), 1);
    let got: BTreeSet<(String, String, String)> = members
        .iter()
        .map(|m| {
            (
                m["lock"].as_str().unwrap().to_string(),
                m["holder"]["thread"].as_str().unwrap().to_string(),
                m["waits_for"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        got,
        BTreeSet::from([triple("a", "member-a", "b"), triple("b", "member-b", "a")])
    );
    assert!(members.iter().all(|m| m["kind"] == "lock"
        && m["fencing_token"].is_u64()
        && m["holder"]["pid"] == std::process::id()));
    // fairlock list marks both rows, and --json says "deadlocked"
    let out = fairlock(&server, &["list"]);
    assert_eq!(out.code, Some(0), "{} {}", out.stdout, out.stderr);
    let rows: Vec<&str> = out.stdout.lines().filter(|l| l.starts_with("D ")).collect();
    assert_eq!(rows.len(), 3, "{}", out.stdout);
    assert!(
        rows[0].starts_with("D a ") && rows[1].starts_with("D b "),
        "{rows:?}"
    );
    let out = fairlock(&server, &["list", "--json"]);
    let json: serde_json::Value = serde_json::from_str(&out.stdout).expect("JSON");
    assert!(
        json.as_array()
            .unwrap()
            .iter()
            .all(|l| l["deadlocked"] == true),
        "{json}"
    );

    // broken by force: member-b gets a, ends, releases b; member-a gets b
    assert!(admin
        .fair_lock("a")
        .unwrap()
        .force_unlock()
        .unwrap()
        .is_some());
    assert!(join(t2));
    assert!(join(t1));
    assert!(admin.find_deadlocks().unwrap().is_empty());
    let out = fairlock(&server, &["deadlocks"]);
    assert_eq!(
        (out.code, out.stdout.trim()),
        (Some(0), "no deadlock found")
    );
    let out = fairlock(&server, &["deadlocks", "--json"]);
    assert_eq!((out.code, out.stdout.trim()), (Some(0), "[]"));
}

#[test]
fn deadlock_of_three_holders_is_one_cycle_in_order() {
    let server = RedisServer::start();
    let admin = support::client(&server);
    let m1 = member(&server, Res::Lock("a"), Res::Lock("b"), LIMIT);
    let m2 = member(&server, Res::Lock("b"), Res::Lock("c"), LIMIT);
    let m3 = member(&server, Res::Lock("c"), Res::Lock("a"), LIMIT);
    // a bystander waits behind the cycle: blocked, but no member
    let m4 = member(&server, Res::Lock("z"), Res::Lock("a"), LIMIT);
    let [t1, t2, t3, t4]: [JoinHandle<bool>; 4] = go(vec![m1, m2, m3, m4]).try_into().unwrap();
    for l in ["a", "b", "c"] {
        assert!(waiters(&admin, Res::Lock(l), if l == "a" { 2 } else { 1 }));
    }
    let found = admin.find_deadlocks().unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(
        normalized(&found[0]),
        [
            triple("a", "member-a", "b"),
            triple("b", "member-b", "c"),
            triple("c", "member-c", "a"),
        ]
    );
    let out = fairlock(&server, &["deadlocks"]);
    assert_eq!(out.code, Some(3), "{} {}", out.stdout, out.stderr);
    assert!(
        out.stdout.contains("deadlock 1 of 1: 3 holders"),
        "{}",
        out.stdout
    );

    assert!(admin
        .fair_lock("a")
        .unwrap()
        .force_unlock()
        .unwrap()
        .is_some());
    for t in [t3, t2, t1, t4] {
        assert!(join(t));
    }
    assert!(admin.find_deadlocks().unwrap().is_empty());
}

#[test]
fn deadlock_is_never_reported_among_locks_taken_in_one_global_order() {
    let server = RedisServer::start();
    let admin = support::client(&server);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let names: Vec<String> = (0..6).map(|i| format!("ordered-{i}")).collect();
    let workers: Vec<JoinHandle<u64>> = (0..8)
        .map(|w| {
            let (url, stop, names) = (server.url(), stop.clone(), names.clone());
            std::thread::spawn(move || {
                let client = support::client_with_url(&url, |b| b);
                let mut rng = support::rng::Rng::new(w as u64 + 1);
                let mut rounds = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    // a random subset, always taken in the names' order
                    let mut guards = Vec::new();
                    for n in &names {
                        if rng.below(2) == 0 {
                            let lock = client.fair_lock(n).unwrap();
                            let g = lock.try_lock_for(LIMIT).unwrap().expect("served");
                            std::thread::sleep(Duration::from_millis(rng.below(5)));
                            guards.push(g);
                        }
                    }
                    drop(guards);
                    rounds += 1;
                }
                rounds
            })
        })
        .collect();
    // 200 looks while they run; some must catch a holder that waits for another lock
    let mut chains = 0;
    for _ in 0..200 {
        let listing = admin.list_locks(ListOptions::new()).unwrap();
        let holders: BTreeSet<&str> = listing
            .locks
            .iter()
            .filter_map(|l| Some(l.holder.as_ref()?.origin.owner.as_str()))
            .collect();
        if listing.locks.iter().any(|l| {
            l.waiters
                .iter()
                .any(|w| holders.contains(w.origin.owner.as_str()))
        }) {
            chains += 1;
        }
        let found = admin.deadlocks_in(&listing).unwrap();
        assert!(found.is_empty(), "{found:?}");
        assert!(admin.find_deadlocks().unwrap().is_empty());
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let rounds: u64 = workers
        .into_iter()
        .map(|t| {
            assert!(eventually(LIMIT, || t.is_finished()));
            t.join().unwrap()
        })
        .sum();
    assert!(
        chains > 0,
        "no look saw a holder waiting: the test proved nothing"
    );
    assert!(rounds > 0);
}

#[test]
fn deadlock_that_dissolved_before_the_confirming_read_is_not_reported() {
    let server = RedisServer::start();
    let admin = support::client(&server);
    // member-a gives up on b after a while; member-b waits for a as long as it takes
    let m1 = member(
        &server,
        Res::Lock("a"),
        Res::Lock("b"),
        Duration::from_secs(3),
    );
    let m2 = member(&server, Res::Lock("b"), Res::Lock("a"), LIMIT);
    let [t1, t2]: [JoinHandle<bool>; 2] = go(vec![m1, m2]).try_into().unwrap();
    assert!(waiters(&admin, Res::Lock("a"), 1) && waiters(&admin, Res::Lock("b"), 1));
    let listing = admin.list_locks(ListOptions::new()).unwrap();
    // the listing shows the cycle, and it stands: confirmed
    assert_eq!(admin.deadlocks_in(&listing).unwrap().len(), 1);
    // member-a's wait ends: it still holds a, but waits for nothing
    assert!(waiters(&admin, Res::Lock("b"), 0));
    // the same listing still shows the cycle, but the confirming read does not
    assert!(admin.deadlocks_in(&listing).unwrap().is_empty());
    assert!(admin.find_deadlocks().unwrap().is_empty());
    assert!(!join(t1));
    assert!(join(t2));
}

#[test]
fn deadlock_through_a_semaphore_and_through_a_read_write_queue() {
    let server = RedisServer::start();
    let admin = support::client(&server);
    // permits: member-s holds the only permit of s and waits for lock a; member-a holds a and
    // waits for a permit
    let m1 = member(&server, Res::Permit("s", 1), Res::Lock("a"), LIMIT);
    let m2 = member(&server, Res::Lock("a"), Res::Permit("s", 1), LIMIT);
    let [t1, t2]: [JoinHandle<bool>; 2] = go(vec![m1, m2]).try_into().unwrap();
    assert!(waiters(&admin, Res::Lock("a"), 1) && waiters(&admin, Res::Permit("s", 1), 1));
    let found = admin.find_deadlocks().unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(
        normalized(&found[0]),
        [triple("a", "member-a", "s"), triple("s", "member-s", "a")]
    );
    let m = &found[0].members;
    let s = m.iter().find(|m| m.lock.name == "s").unwrap();
    assert_eq!(
        (s.lock.kind, s.waits_for.kind),
        (HoldKind::Semaphore, HoldKind::Lock)
    );
    assert!(matches!(s.blocking, Blocking::Holds { permits: 1, .. }));
    // the semaphore table marks s
    let out = fairlock(&server, &["list", "--json", "--semaphores"]);
    let json: serde_json::Value = serde_json::from_str(&out.stdout).expect("JSON");
    assert_eq!(json[0]["name"], "s");
    assert_eq!(json[0]["deadlocked"], true);
    assert!(admin
        .fair_lock("a")
        .unwrap()
        .force_unlock()
        .unwrap()
        .is_some());
    assert!(join(t2) && join(t1));

    // a read/write lock: member holds a read and asks for another behind a waiting writer,
    // which waits for that first read
    let url = server.url();
    let (read_tx, read_rx) = mpsc::channel();
    let reader = std::thread::Builder::new()
        .name("reader".into())
        .spawn(move || {
            let client = support::client_with_url(&url, |b| b);
            let rw = client.rw_lock("rw").unwrap();
            let first = rw.read().unwrap();
            read_tx.send(()).unwrap();
            // wait until the writer is queued, then ask again
            assert!(eventually(LIMIT, || rw.status().unwrap().waiters.len() == 1));
            let again = rw.try_read_for(LIMIT).unwrap();
            drop(first);
            again.is_some()
        })
        .unwrap();
    read_rx.recv_timeout(LIMIT).unwrap();
    let url = server.url();
    let writer = std::thread::Builder::new()
        .name("writer".into())
        .spawn(move || {
            let client = support::client_with_url(&url, |b| b);
            let got = client.rw_lock("rw").unwrap().try_write_for(LIMIT).unwrap();
            got.is_some()
        })
        .unwrap();
    let rw = admin.rw_lock("rw").unwrap();
    assert!(eventually(LIMIT, || rw.status().unwrap().waiters.len() == 2));
    let found = admin.find_deadlocks().unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    let by_thread = |t: &str| {
        found[0]
            .members
            .iter()
            .find(|m| m.holder.thread == t)
            .unwrap_or_else(|| panic!("{t} in {found:?}"))
    };
    let w = by_thread("writer");
    assert_eq!(w.blocking, Blocking::QueuedAhead);
    assert_eq!(
        (w.lock.kind, w.waits_for.kind),
        (HoldKind::Write, HoldKind::Write)
    );
    let r = by_thread("reader");
    assert!(matches!(r.blocking, Blocking::Holds { permits: 1, .. }));
    assert_eq!(
        (r.lock.kind, r.waits_for.kind),
        (HoldKind::Read, HoldKind::Read)
    );
    // broken by force: the first read goes, the writer is served and done, then the reader
    let st = rw.status().unwrap();
    let h = &st.holders[0];
    assert!(rw.force_release(&h.hold_id, h.fencing_token).unwrap());
    assert!(join(writer) && join(reader));
    assert!(admin.find_deadlocks().unwrap().is_empty());
}

/// Three lock names starting with `prefix`, each in a slot of another of the cluster's three
/// masters (leaked: the members' threads take `&'static str` names).
fn one_name_per_master(
    cluster: &crate::support::topology::RedisCluster,
    prefix: &str,
) -> Vec<&'static str> {
    let names: Vec<&'static str> = crate::cluster::names_on_every_master(cluster, prefix)
        .into_iter()
        .map(|(n, _)| &*Box::leak(n.into_boxed_str()))
        .collect();
    assert_eq!(names.len(), 3, "{names:?}");
    names
}

#[test]
fn deadlock_across_three_masters_of_a_cluster_is_found_across_slots() {
    let cluster = crate::support::topology::RedisCluster::start();
    let url = crate::cluster::cluster_url(&cluster);
    let admin = support::client_with_url(&url, |b| b);
    let names = one_name_per_master(&cluster, "dl");
    let members: Vec<Member> = (0..3)
        .map(|i| {
            let (hold, want) = (names[i], names[(i + 1) % 3]);
            member_at(url.clone(), Res::Lock(hold), Res::Lock(want), LIMIT)
        })
        .collect();
    let threads = go(members);
    for n in &names {
        assert!(waiters(&admin, Res::Lock(n), 1), "{n}");
    }
    let found = admin.find_deadlocks().unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    let expected = ring(&names);
    assert_eq!(normalized(&found[0]), expected);
    assert!(admin
        .fair_lock(names[0])
        .unwrap()
        .force_unlock()
        .unwrap()
        .is_some());
    for t in threads {
        assert!(join(t));
    }
    assert!(admin.find_deadlocks().unwrap().is_empty());
}

// ---- detection in the library: LockClientBuilder::deadlock_detection ----

/// How a detecting member's wait ended.
#[derive(Debug)]
enum Outcome {
    Acquired,
    TimedOut,
    /// `Error::Deadlock`: the cycle, the message, and how long the wait lasted.
    Refused(Box<Deadlock>, String, Duration),
}

/// A member thread with a client of its own that has `deadlock_detection(after)`: holds
/// `hold`, says so, and once `go` is sent waits for `want`: as long as it takes (`lock()`,
/// `acquire()`) when `wait` is `None`, else at most `wait`. Named `member-<hold's name>`.
fn detecting(
    url: &str,
    after: Duration,
    hold: Res,
    want: Res,
    wait: Option<Duration>,
) -> (JoinHandle<Outcome>, mpsc::Sender<()>) {
    let (held_tx, held_rx) = mpsc::channel();
    let (go, go_rx) = mpsc::channel::<()>();
    let name = match hold {
        Res::Lock(n) | Res::Permit(n, _) => format!("member-{n}"),
    };
    let url = url.to_string();
    let t = std::thread::Builder::new()
        .name(name)
        .spawn(move || {
            let client = support::client_with_url(&url, |b| b.deadlock_detection(after));
            let _held: Box<dyn std::any::Any> = match hold {
                Res::Lock(n) => Box::new(client.fair_lock(n).unwrap().lock().unwrap()),
                Res::Permit(n, cap) => {
                    Box::new(client.semaphore(n, cap).unwrap().acquire().unwrap())
                }
            };
            held_tx.send(()).unwrap();
            let _ = go_rx.recv_timeout(LIMIT);
            let started = std::time::Instant::now();
            let got: fairlock::Result<bool> = match (want, wait) {
                (Res::Lock(n), None) => client.fair_lock(n).unwrap().lock().map(|_| true),
                (Res::Lock(n), Some(w)) => client
                    .fair_lock(n)
                    .unwrap()
                    .try_lock_for(w)
                    .map(|g| g.is_some()),
                (Res::Permit(n, cap), None) => {
                    client.semaphore(n, cap).unwrap().acquire().map(|_| true)
                }
                (Res::Permit(n, cap), Some(w)) => client
                    .semaphore(n, cap)
                    .unwrap()
                    .try_acquire_for(w)
                    .map(|p| p.is_some()),
            };
            match got {
                Ok(true) => Outcome::Acquired,
                Ok(false) => Outcome::TimedOut,
                Err(e @ fairlock::Error::Deadlock { .. }) => {
                    let message = e.to_string();
                    let fairlock::Error::Deadlock { deadlock, .. } = e else {
                        unreachable!()
                    };
                    Outcome::Refused(deadlock, message, started.elapsed())
                }
                Err(e) => panic!("unexpected error: {e}"),
            }
        })
        .unwrap();
    held_rx
        .recv_timeout(LIMIT)
        .expect("the member took its hold");
    (t, go)
}

/// Join the members within `LIMIT`; if one does not finish, release every lock in `names` by
/// force (so no thread is left waiting for ever) and fail.
fn join_all(admin: &LockClient, threads: Vec<JoinHandle<Outcome>>, names: &[&str]) -> Vec<Outcome> {
    let done = eventually(LIMIT, || threads.iter().all(|t| t.is_finished()));
    if !done {
        for n in names {
            let _ = admin.fair_lock(n).unwrap().force_unlock();
        }
        panic!("the members did not finish within {LIMIT:?}: no deadlock was broken");
    }
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

/// member-a holds a and waits for b (for `wait`, or as long as it takes); then member-b holds
/// b and waits for a: the youngest wait. Asserts that member-a acquires and member-b is
/// refused, within 5 s (`after`, one check period and the round trips, generous on 2 cores),
/// with the cycle of both; the refusal's cycle, message and how long member-b waited.
fn cycle_of_two(
    url: &str,
    admin: &LockClient,
    after: Duration,
    wait: Option<Duration>,
) -> (Box<Deadlock>, String, Duration) {
    let (t1, go1) = detecting(url, after, Res::Lock("a"), Res::Lock("b"), wait);
    let (t2, go2) = detecting(url, after, Res::Lock("b"), Res::Lock("a"), wait);
    go1.send(()).unwrap();
    assert!(waiters(admin, Res::Lock("b"), 1));
    go2.send(()).unwrap();
    let mut out = join_all(admin, vec![t1, t2], &["a", "b"]);
    assert!(matches!(out[0], Outcome::Acquired), "{out:?}");
    let Outcome::Refused(d, message, waited) = out.remove(1) else {
        panic!("member-b was not refused: {out:?}");
    };
    assert!(waited < Duration::from_secs(5), "{waited:?}");
    assert_eq!(
        normalized(&d),
        [triple("a", "member-a", "b"), triple("b", "member-b", "a")]
    );
    (d, message, waited)
}

#[test]
fn deadlock_detection_refuses_exactly_the_youngest_of_two_and_the_other_acquires() {
    let server = RedisServer::start();
    let admin = support::client(&server);
    let after = Duration::from_millis(300);
    let (d, message, waited) = cycle_of_two(&server.url(), &admin, after, None);
    assert!(
        waited >= after,
        "refused after {waited:?}, before {after:?}"
    );
    assert_eq!(d.youngest_wait().unwrap().holder.thread, "member-b");
    for m in &d.members {
        assert_eq!(m.holder.pid, std::process::id());
        assert!(matches!(m.blocking, Blocking::Holds { permits: 1, .. }));
    }
    for part in [
        "deadlock",
        "lock \"a\"",
        "lock \"b\"",
        "member-a",
        "member-b",
        "release what this thread holds",
    ] {
        assert!(message.contains(part), "{part:?} not in {message}");
    }
    // the refused wait left its queue, the index entries are gone, nothing is left behind
    assert!(admin.find_deadlocks().unwrap().is_empty());
    assert!(waiters(&admin, Res::Lock("a"), 0) && waiters(&admin, Res::Lock("b"), 0));
    let mut conn = server.conn();
    assert!(eventually(LIMIT, || {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("fairlock:waits:*")
            .query(&mut conn)
            .unwrap();
        keys.is_empty()
    }));
}

#[test]
fn deadlock_detection_breaks_a_cycle_of_three_across_three_masters_of_a_cluster() {
    let cluster = crate::support::topology::RedisCluster::start();
    let url = crate::cluster::cluster_url(&cluster);
    let admin = support::client_with_url(&url, |b| b);
    let names = one_name_per_master(&cluster, "dd");
    let after = Duration::from_millis(300);
    let members: Vec<_> = (0..3)
        .map(|i| {
            let (hold, want) = (names[i], names[(i + 1) % 3]);
            detecting(&url, after, Res::Lock(hold), Res::Lock(want), Some(LIMIT))
        })
        .collect();
    let mut threads = Vec::new();
    for (i, (t, go)) in members.into_iter().enumerate() {
        go.send(()).unwrap();
        // in order: the last one's wait is the youngest
        let want = names[(i + 1) % 3];
        assert!(waiters(&admin, Res::Lock(want), 1), "{want}");
        threads.push(t);
    }
    let out = join_all(&admin, threads, &names);
    let refused: Vec<usize> = (0..3)
        .filter(|&i| matches!(out[i], Outcome::Refused(..)))
        .collect();
    assert_eq!(refused, [2], "{out:?}");
    assert!(matches!(out[0], Outcome::Acquired) && matches!(out[1], Outcome::Acquired));
    let Outcome::Refused(d, _, waited) = &out[2] else {
        unreachable!()
    };
    assert!(*waited < Duration::from_secs(5), "{waited:?}");
    let expected = ring(&names);
    assert_eq!(normalized(d), expected);
    assert!(admin.find_deadlocks().unwrap().is_empty());
}

#[test]
fn deadlock_detection_refuses_nobody_among_locks_taken_in_one_global_order() {
    let server = RedisServer::start();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let names: Vec<String> = (0..5).map(|i| format!("ordered-{i}")).collect();
    // a short `after`, and holds long enough that waits pass it: checks run, and find chains
    // of holders that wait, but never a cycle
    let after = Duration::from_millis(100);
    let workers: Vec<JoinHandle<(u64, u64)>> = (0..8)
        .map(|w| {
            let (url, stop, names) = (server.url(), stop.clone(), names.clone());
            std::thread::spawn(move || {
                let client = support::client_with_url(&url, |b| b.deadlock_detection(after));
                let mut rng = support::rng::Rng::new(w as u64 + 1);
                let (mut rounds, mut long_waits) = (0, 0);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let mut guards = Vec::new();
                    for n in &names {
                        if rng.below(2) == 0 {
                            let lock = client.fair_lock(n).unwrap();
                            let started = std::time::Instant::now();
                            let g = match lock.try_lock_for(LIMIT) {
                                Ok(g) => g.expect("served"),
                                Err(e) => panic!("refused in a fixed order: {e}"),
                            };
                            if started.elapsed() > after * 2 {
                                long_waits += 1;
                            }
                            std::thread::sleep(Duration::from_millis(rng.below(40)));
                            guards.push(g);
                        }
                    }
                    drop(guards);
                    rounds += 1;
                }
                (rounds, long_waits)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(4));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut long_waits = 0;
    for t in workers {
        assert!(eventually(LIMIT, || t.is_finished()));
        let (rounds, long) = t.join().expect("no worker was refused");
        assert!(rounds > 0);
        long_waits += long;
    }
    assert!(
        long_waits > 0,
        "no wait lasted two check periods: no check ran, the test proved nothing"
    );
}

#[test]
fn deadlock_detection_refuses_nobody_when_the_cycle_dissolves_on_its_own() {
    let server = RedisServer::start();
    let admin = support::client(&server);
    let after = Duration::from_millis(300);
    let url = server.url();
    // member-b waits for a as long as it takes; member-a, queued later (the youngest wait),
    // gives up on b sooner than its first check: the cycle ends with its wait
    let (tb, gob) = detecting(&url, after, Res::Lock("b"), Res::Lock("a"), None);
    let (ta, goa) = detecting(
        &url,
        after,
        Res::Lock("a"),
        Res::Lock("b"),
        Some(Duration::from_millis(250)),
    );
    gob.send(()).unwrap();
    assert!(waiters(&admin, Res::Lock("a"), 1));
    goa.send(()).unwrap();
    let out = join_all(&admin, vec![ta, tb], &["a", "b"]);
    assert!(matches!(out[0], Outcome::TimedOut), "{out:?}");
    assert!(matches!(out[1], Outcome::Acquired), "{out:?}");

    // the same with a wait that lasts past member-b's checks but less than its own first
    // check plus a round: member-b (older) checks, sees the cycle, is not the youngest, keeps
    // waiting; member-a times out before or at its first check and refuses nobody, or its
    // check refuses itself: never member-b
    let (tb, gob) = detecting(&url, after, Res::Lock("b2"), Res::Lock("a2"), None);
    let (ta, goa) = detecting(
        &url,
        after,
        Res::Lock("a2"),
        Res::Lock("b2"),
        Some(Duration::from_millis(320)),
    );
    gob.send(()).unwrap();
    assert!(waiters(&admin, Res::Lock("a2"), 1));
    std::thread::sleep(after * 2);
    goa.send(()).unwrap();
    let out = join_all(&admin, vec![ta, tb], &["a2", "b2"]);
    assert!(
        matches!(out[0], Outcome::TimedOut | Outcome::Refused(..)),
        "{out:?}"
    );
    assert!(matches!(out[1], Outcome::Acquired), "{out:?}");
}

#[test]
fn deadlock_detection_breaks_a_cycle_through_a_semaphore_and_a_read_write_lock() {
    let server = RedisServer::start();
    let admin = support::client(&server);
    let after = Duration::from_millis(300);
    let url = server.url();
    // member-s holds the only permit of s and waits for lock a; member-a holds a and waits
    // for a permit (queued later: refused)
    let (ts, gos) = detecting(
        &url,
        after,
        Res::Permit("s", 1),
        Res::Lock("a"),
        Some(LIMIT),
    );
    let (ta, goa) = detecting(
        &url,
        after,
        Res::Lock("a"),
        Res::Permit("s", 1),
        Some(LIMIT),
    );
    gos.send(()).unwrap();
    assert!(waiters(&admin, Res::Lock("a"), 1));
    goa.send(()).unwrap();
    let out = join_all(&admin, vec![ts, ta], &["a"]);
    assert!(matches!(out[0], Outcome::Acquired), "{out:?}");
    let Outcome::Refused(d, message, _) = &out[1] else {
        panic!("member-a was not refused: {out:?}");
    };
    assert_eq!(
        normalized(d),
        [triple("a", "member-a", "s"), triple("s", "member-s", "a")]
    );
    assert!(message.contains("permits of semaphore \"s\""), "{message}");

    // a read/write lock: the reader holds a read of rw and waits for lock l; the writer holds
    // l and waits for the write of rw, behind the read (queued later: refused)
    let start = |name: &str, f: fn(&LockClient, &mpsc::Sender<()>, &mpsc::Receiver<()>) -> bool| {
        let (held_tx, held_rx) = mpsc::channel();
        let (go, go_rx) = mpsc::channel();
        let url = url.clone();
        let t = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let client = support::client_with_url(&url, |b| b.deadlock_detection(after));
                f(&client, &held_tx, &go_rx)
            })
            .unwrap();
        held_rx.recv_timeout(LIMIT).expect("took its hold");
        (t, go)
    };
    let (reader, go_r) = start("reader", |client, held, go| {
        let _read = client.rw_lock("rw").unwrap().read().unwrap();
        held.send(()).unwrap();
        let _ = go.recv_timeout(LIMIT);
        match client.fair_lock("l").unwrap().try_lock_for(LIMIT) {
            Ok(got) => got.is_some(),
            Err(e) => panic!("the reader's wait is the older: {e}"),
        }
    });
    let (writer, go_w) = start("writer", |client, held, go| {
        let _l = client.fair_lock("l").unwrap().lock().unwrap();
        held.send(()).unwrap();
        let _ = go.recv_timeout(LIMIT);
        match client.rw_lock("rw").unwrap().try_write_for(LIMIT) {
            Err(fairlock::Error::Deadlock { deadlock, kind, .. }) => {
                assert_eq!(kind, HoldKind::Write);
                assert!(deadlock.involves("rw", HoldKind::Write));
                assert!(deadlock.involves("l", HoldKind::Lock));
                true
            }
            other => panic!(
                "the writer was not refused: {:?}",
                other.map(|g| g.is_some())
            ),
        }
    });
    go_r.send(()).unwrap();
    assert!(waiters(&admin, Res::Lock("l"), 1));
    go_w.send(()).unwrap();
    if !eventually(LIMIT, || reader.is_finished() && writer.is_finished()) {
        let _ = admin.fair_lock("l").unwrap().force_unlock();
        panic!("the read/write cycle was not broken within {LIMIT:?}");
    }
    assert!(writer.join().expect("the writer was refused"));
    assert!(reader.join().expect("the reader was served"));
}

/// Two threads of ONE client (one client id, so one index hash for both, and with
/// `WaitMode::PerThread` a waker connection per thread), each holding one lock and waiting for
/// the other's: the youngest wait is refused, the other thread then acquires.
fn two_threads_of_one_client_in_a_cycle(mode: fairlock::WaitMode) {
    let server = RedisServer::start();
    let admin = support::client(&server);
    let after = Duration::from_millis(300);
    let client = std::sync::Arc::new(support::client_with_url(&server.url(), |b| {
        b.deadlock_detection(after).wait_mode(mode)
    }));
    let spawn = |hold: &'static str, want: &'static str| {
        let client = client.clone();
        let (held_tx, held_rx) = mpsc::channel();
        let (go, go_rx) = mpsc::channel::<()>();
        let t = std::thread::Builder::new()
            .name(format!("member-{hold}"))
            .spawn(move || {
                let _held = client.fair_lock(hold).unwrap().lock().unwrap();
                held_tx.send(()).unwrap();
                let _ = go_rx.recv_timeout(LIMIT);
                match client.fair_lock(want).unwrap().try_lock_for(LIMIT) {
                    Ok(Some(_)) => Outcome::Acquired,
                    Ok(None) => Outcome::TimedOut,
                    Err(fairlock::Error::Deadlock { deadlock, .. }) => {
                        Outcome::Refused(deadlock, String::new(), Duration::ZERO)
                    }
                    Err(e) => panic!("unexpected error: {e}"),
                }
            })
            .unwrap();
        held_rx
            .recv_timeout(LIMIT)
            .expect("the member took its hold");
        (t, go)
    };
    let (ta, goa) = spawn("a", "b");
    let (tb, gob) = spawn("b", "a");
    goa.send(()).unwrap();
    assert!(waiters(&admin, Res::Lock("b"), 1));
    gob.send(()).unwrap();
    let out = join_all(&admin, vec![ta, tb], &["a", "b"]);
    assert!(matches!(out[0], Outcome::Acquired), "{mode:?}: {out:?}");
    let Outcome::Refused(d, ..) = &out[1] else {
        panic!("{mode:?}: member-b was not refused: {out:?}");
    };
    assert_eq!(
        normalized(d),
        [triple("a", "member-a", "b"), triple("b", "member-b", "a")],
        "{mode:?}"
    );
    // both members are threads of the one client
    let owners: BTreeSet<&str> = d.members.iter().map(|m| m.holder.owner.as_str()).collect();
    assert_eq!(owners.len(), 2, "{owners:?}");
    let clients: BTreeSet<&str> = owners
        .iter()
        .map(|o| o.rsplit_once(':').map_or(*o, |(c, _)| c))
        .collect();
    if mode == fairlock::WaitMode::Shared {
        assert_eq!(clients.len(), 1, "{owners:?}");
    }
    assert!(waiters(&admin, Res::Lock("a"), 0) && waiters(&admin, Res::Lock("b"), 0));
}

#[test]
fn deadlock_detection_breaks_a_cycle_of_two_threads_of_one_client() {
    two_threads_of_one_client_in_a_cycle(fairlock::WaitMode::Shared);
}

#[test]
fn deadlock_detection_breaks_a_cycle_of_two_threads_of_one_client_waiting_per_thread() {
    two_threads_of_one_client_in_a_cycle(fairlock::WaitMode::PerThread);
}

#[test]
fn deadlock_detection_breaks_a_cycle_of_clients_that_reach_redis_through_sentinel() {
    let lone = crate::support::topology::LoneSentinel::start();
    let url = format!(
        "redis+sentinel://{}/{}",
        lone.sentinel_url()
            .trim_start_matches("redis://")
            .trim_end_matches('/'),
        crate::support::topology::MASTER_NAME
    );
    let admin = support::client_with_url(&url, |b| b);
    cycle_of_two(&url, &admin, Duration::from_millis(300), Some(LIMIT));
    // the operator's view through the sentinel agrees: nothing is left
    assert!(admin.find_deadlocks().unwrap().is_empty());
}

/// Every command the server runs (scripts' own calls included) while `during` runs, as
/// `MONITOR` prints them. (The monitor's connection reads without a short timeout, which
/// would end its reads: a marker `ECHO` sent after `during` ends them.)
fn monitored(server: &RedisServer, during: impl FnOnce()) -> Vec<String> {
    const END: &str = "fairlock-test-monitor-end";
    let mut mon = server.conn();
    mon.set_read_timeout(Some(LIMIT)).unwrap();
    let _: () = redis::cmd("MONITOR").query(&mut mon).unwrap();
    let reader = std::thread::spawn(move || {
        let mut lines = Vec::new();
        loop {
            match mon.recv_response() {
                Ok(redis::Value::SimpleString(line)) if line.contains(END) => return lines,
                Ok(redis::Value::SimpleString(line)) => lines.push(line),
                Ok(_) => {}
                Err(e) => panic!("the monitor stopped before the end marker: {e}"),
            }
        }
    });
    during();
    let _: String = redis::cmd("ECHO")
        .arg(END)
        .query(&mut server.conn())
        .unwrap();
    assert!(
        eventually(LIMIT, || reader.is_finished()),
        "the monitor did not see the end marker"
    );
    reader.join().unwrap()
}

/// A lock held by one client and waited for by another with detection on, released after `hold`.
fn one_wait(server: &RedisServer, name: &'static str, after: Duration, hold: Duration) {
    let holder = support::client(server);
    let waiter = support::client_with_url(&server.url(), |b| b.deadlock_detection(after));
    let guard = holder.fair_lock(name).unwrap().lock().unwrap();
    let admin = support::client(server);
    let t = {
        std::thread::spawn(move || {
            waiter
                .fair_lock(name)
                .unwrap()
                .try_lock_for(LIMIT)
                .unwrap()
                .is_some()
        })
    };
    assert!(waiters(&admin, Res::Lock(name), 1));
    std::thread::sleep(hold);
    guard.unlock().unwrap();
    assert!(join(t), "the waiter was served");
}

#[test]
fn deadlock_detection_sends_nothing_for_a_wait_shorter_than_half_of_after() {
    let server = RedisServer::start();
    // a wait of about 200 ms with `after` = 3 s (it would publish at 1.5 s): not one command
    // touches the index, and no status is read beyond what the test itself reads
    let short = monitored(&server, || {
        one_wait(
            &server,
            "short",
            Duration::from_secs(3),
            Duration::from_millis(200),
        )
    });
    assert!(
        short.iter().any(|l| l.contains("fairlock:{short}")),
        "the monitor saw the lock's own commands"
    );
    let index: Vec<&String> = short.iter().filter(|l| l.contains(":waits:")).collect();
    assert!(
        index.is_empty(),
        "a short wait touched the index: {index:?}"
    );

    // the control: a wait of 1.5 s with `after` = 300 ms publishes, checks and deletes its entry
    let long = monitored(&server, || {
        one_wait(
            &server,
            "long",
            Duration::from_millis(300),
            Duration::from_millis(1500),
        )
    });
    let index: Vec<&String> = long.iter().filter(|l| l.contains(":waits:")).collect();
    assert!(
        index
            .iter()
            .any(|l| l.contains("\"HSET\"") || l.contains("\"hset\"")),
        "{index:?}"
    );
    assert!(
        index
            .iter()
            .any(|l| l.contains("\"HDEL\"") || l.contains("\"hdel\"")),
        "{index:?}"
    );
}
