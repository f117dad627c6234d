//! Replies lost on the network: a TCP proxy between a client and Redis forwards a request and
//! then cuts the connection instead of passing the reply on. The client retries on a fresh
//! connection; the scripts must make that retry harmless: a release is never applied twice and
//! never reported as a false "not held", an acquire never takes two tokens or counts twice.

use crate::support;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use crate::support::RedisServer;

const SECS_5: Duration = Duration::from_secs(5);

/// A loopback proxy to `target`. When armed, the next reply from Redis (on any connection) is
/// swallowed and that connection is cut in both directions.
struct Proxy {
    port: u16,
    armed: Arc<AtomicBool>,
    cuts: Arc<AtomicU32>,
}

impl Proxy {
    fn start(target: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let armed = Arc::new(AtomicBool::new(false));
        let cuts = Arc::new(AtomicU32::new(0));
        let (a, c) = (armed.clone(), cuts.clone());
        thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
                    continue;
                };
                let (a, c) = (a.clone(), c.clone());
                // client -> server
                let (mut from, mut to) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                thread::spawn(move || {
                    let mut buf = [0u8; 16384];
                    while let Ok(n) = from.read(&mut buf) {
                        if n == 0 || to.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = to.shutdown(Shutdown::Both);
                    let _ = from.shutdown(Shutdown::Both);
                });
                // server -> client, or cut
                let (mut from, mut to) = (server, client);
                thread::spawn(move || {
                    let mut buf = [0u8; 16384];
                    while let Ok(n) = from.read(&mut buf) {
                        if n == 0 {
                            break;
                        }
                        if a.swap(false, Ordering::SeqCst) {
                            c.fetch_add(1, Ordering::SeqCst);
                            break;
                        }
                        if to.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = to.shutdown(Shutdown::Both);
                    let _ = from.shutdown(Shutdown::Both);
                });
            }
        });
        Proxy { port, armed, cuts }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Swallow the next reply from Redis.
    fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    fn cuts(&self) -> u32 {
        self.cuts.load(Ordering::SeqCst)
    }
}

/// A client through the proxy, with a 30 s lease (so its watchdog stays quiet for 10 s) and no
/// waiters (so its janitor stays quiet): the only traffic is what the test does.
fn proxied_client(proxy: &Proxy) -> fairlock::LockClient {
    let client = fairlock::LockClient::builder(&proxy.url())
        .janitor_interval(Duration::from_millis(200))
        .connect_timeout(Duration::from_secs(2))
        .read_timeout(Duration::from_secs(5))
        .build()
        .expect("connect through the proxy");
    // run every script first (the library is loaded at connect; with EVALSHA each script is
    // loaded on first use), so a cut reply is a script's own reply and not a "not found"
    let warm = client.fair_lock("warm-up").unwrap();
    let g = warm.lock().unwrap();
    let inner = warm.lock().unwrap();
    drop(inner);
    g.unlock().unwrap();
    warm.status().unwrap();
    client
}

/// The left marks of lock `name`: (owner, newest marked attempt), without the hash's marker
/// (a mark is "<attempt>|<expiry ms>").
fn left_marks(c: &mut redis::Connection, name: &str) -> Vec<(String, u64)> {
    redis::cmd("HGETALL")
        .arg(format!("fairlock:{{{name}}}:left"))
        .query::<Vec<(String, String)>>(c)
        .unwrap()
        .into_iter()
        .filter(|(field, _)| field != "~")
        .map(|(owner, mark)| {
            let attempt = mark.split('|').next().unwrap_or("").parse().unwrap();
            (owner, attempt)
        })
        .collect()
}

/// A client through the proxy whose janitor stays quiet for the length of a test (no warm-up).
fn quiet_client(proxy: &Proxy) -> fairlock::LockClient {
    fairlock::LockClient::builder(&proxy.url())
        .janitor_interval(Duration::from_secs(60))
        .build()
        .unwrap()
}

#[test]
fn a_release_whose_reply_was_lost_is_retried_once_without_a_false_not_held() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let client = proxied_client(&proxy);
    let lock = client.fair_lock("lost-release").unwrap();
    let holder = lock.lock().unwrap();
    let token = holder.fencing_token();

    // a waiter of another client, connected directly, queued behind the holder
    let direct = support::client(&server);
    let (tx, rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let waiter = {
        let lock = direct.fair_lock("lost-release").unwrap();
        thread::spawn(move || {
            let g = lock.lock().unwrap();
            tx.send(g.fencing_token()).unwrap();
            done_rx.recv_timeout(Duration::from_secs(20)).unwrap();
            assert!(
                g.is_held_in_redis().unwrap(),
                "a retried release freed the next owner's lock"
            );
            g.unlock().unwrap();
        })
    };
    assert!(support::queued(&lock, 1, SECS_5));

    proxy.arm();
    let result = holder.unlock();
    assert_eq!(proxy.cuts(), 1, "the release's reply was not cut");
    assert!(
        result.is_ok(),
        "a release whose reply was lost reported {result:?}"
    );

    // released exactly once: the waiter holds it with a greater token (time-seeded, so not
    // token + 1), and the counter shows nobody took one after it
    let next = rx.recv_timeout(SECS_5).unwrap();
    assert!(next > token, "{next} after {token}");
    let st = direct.fair_lock("lost-release").unwrap().status().unwrap();
    let h = st
        .holder
        .expect("the waiter's lock was released by the retry");
    assert_eq!(h.fencing_token, next);
    assert_eq!(h.hold_count, 1);
    assert_eq!(st.fencing_counter, next);
    done_tx.send(()).unwrap();
    waiter.join().unwrap();
}

#[test]
fn an_inner_release_whose_reply_was_lost_is_not_counted_twice() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let client = proxied_client(&proxy);
    let lock = client.fair_lock("lost-inner").unwrap();
    let outer = lock.lock().unwrap();
    let inner = lock.lock().unwrap();
    assert_eq!(lock.hold_count().unwrap(), 2);

    proxy.arm();
    inner.unlock().expect("inner release");
    assert_eq!(proxy.cuts(), 1);
    // one level released, not two: the lock is still held
    assert_eq!(
        lock.hold_count().unwrap(),
        1,
        "the retried release counted twice"
    );
    assert!(outer.is_held_in_redis().unwrap());
    outer.unlock().unwrap();
    assert!(!lock.is_locked().unwrap());
}

#[test]
fn an_acquire_whose_reply_was_lost_takes_one_token_and_one_level() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let client = proxied_client(&proxy);
    let lock = client.fair_lock("lost-acquire").unwrap();

    proxy.arm();
    let g = lock.lock().expect("acquire");
    assert_eq!(proxy.cuts(), 1);
    // Tokens are time-seeded, so "token 1, counter 1" is gone: the counter must be the token
    // the retry returned (the retry returned the first attempt's grant, took nothing after it).
    // A second token taken *before* the returned one would no longer show here.
    let token = g.fencing_token();
    assert!(token > 0);
    let st = lock.status().unwrap();
    assert_eq!(
        st.fencing_counter, token,
        "the retried acquire took a second token"
    );
    assert_eq!(st.holder.unwrap().hold_count, 1);

    // and a re-entry whose reply was lost counts once
    proxy.arm();
    let inner = lock.lock().expect("re-entry");
    assert_eq!(proxy.cuts(), 2);
    assert_eq!(
        lock.hold_count().unwrap(),
        2,
        "the retried re-entry counted twice"
    );
    drop(inner);
    g.unlock().unwrap();
    // fully released: nothing stuck at a count the guards cannot bring down
    assert!(!lock.is_locked().unwrap());
    let start = Instant::now();
    let again = support::client(&server)
        .fair_lock("lost-acquire")
        .unwrap()
        .try_lock()
        .unwrap();
    assert!(
        again.is_some(),
        "the lock stayed held after all guards were released"
    );
    assert!(start.elapsed() < SECS_5);
}

#[test]
fn a_hand_off_whose_blpop_reply_was_lost_is_still_claimed_once() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    // its janitor stays quiet, so the cut reply is the BLPOP's
    let waiter_client = quiet_client(&proxy);
    let direct = support::client(&server);
    let lock = direct.fair_lock("lost-handoff").unwrap();
    let holder = lock.lock().unwrap();
    let token = holder.fencing_token();

    let (tx, rx) = mpsc::channel();
    let waiter = {
        let lock = waiter_client.fair_lock("lost-handoff").unwrap();
        thread::spawn(move || {
            let g = lock.lock().unwrap();
            let t = g.fencing_token();
            let count = lock.hold_count().unwrap();
            tx.send((t, count)).unwrap();
            g.unlock().unwrap();
        })
    };
    assert!(support::queued(&lock, 1, SECS_5));
    thread::sleep(Duration::from_millis(100)); // the waiter is blocked in BLPOP by now
    proxy.arm();
    holder.unlock().unwrap();
    let (t, count) = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the hand-off was lost");
    assert_eq!(proxy.cuts(), 1);
    // Time-seeded tokens: the claim's token is above the holder's and (below) the last one
    // handed out. Whether it is the grant's own token or a new one taken by the retry no longer
    // shows in the values (it did when tokens were token + 1).
    assert!(
        t > token,
        "the grant was not claimed with its token: {t} after {token}"
    );
    assert_eq!(count, 1);
    waiter.join().unwrap();
    let st = lock.status().unwrap();
    assert!(st.holder.is_none() && st.waiters.is_empty(), "{st:?}");
    assert_eq!(st.fencing_counter, t);
}

/// An acquire sent twice (its first reply cut) could, in general, have a copy still on its way
/// when its attempt gives up. So that copy does nothing then, the attempt's leave leaves a left
/// mark: here the acquire queues behind a holder, times out, and a copy of it sent afterwards
/// is answered `Stale` instead of queueing a waiter nobody refreshes. (A waiter whose requests
/// were all answered leaves no mark: `basic::try_lock_for_gives_up_in_bounded_time_...`.)
#[test]
fn a_waiter_whose_acquire_was_sent_twice_leaves_a_mark_when_it_gives_up() {
    use fairlock::raw::{Acquire, Mode, RawLock, Settings};
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    // its janitor stays quiet, so the cut reply is the acquire's
    let waiter_client = quiet_client(&proxy);
    // a pooled connection and the scripts ready, so the first reply after arming is the acquire's
    drop(waiter_client.fair_lock("warm-up").unwrap().lock().unwrap());
    let direct = support::client(&server);
    let holder = direct.fair_lock("marked").unwrap().lock().unwrap();

    let lock = waiter_client.fair_lock("marked").unwrap();
    proxy.arm();
    let got = lock.try_lock_for(Duration::from_millis(500)).unwrap();
    assert!(got.is_none(), "got a held lock");
    assert_eq!(proxy.cuts(), 1);

    let mut c = server.conn();
    let marks = left_marks(&mut c, "marked");
    assert_eq!(marks.len(), 1, "{marks:?}");
    let (owner, attempt) = marks[0].clone();
    let raw = RawLock::new("fairlock", "marked", Settings::default()).unwrap();
    let copy = raw
        .acquire(&owner, attempt, Duration::from_secs(30), Mode::Wait, "m")
        .run(&mut c)
        .unwrap();
    assert_eq!(copy, Acquire::Stale);
    let st = direct.fair_lock("marked").unwrap().status().unwrap();
    assert!(st.waiters.is_empty(), "{st:?}");
    holder.unlock().unwrap();
}

/// An acquire sent twice, with the real client: its acquire's reply is lost, the client sends it
/// again and gets the lock, uses it and releases it; then a copy of that very request arrives late
/// (as a copy held up on the abandoned connection would). It used to take the lock for a thread
/// that holds no guard, refusing everyone else for a whole lease; the release now leaves a left
/// mark (the client knew a copy could still come), and the copy does nothing.
#[test]
fn a_late_copy_of_a_repeated_acquire_after_the_release_takes_nothing() {
    use fairlock::raw::{Acquire, Mode, RawLock, Settings};
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let client = proxied_client(&proxy);
    let lock = client.fair_lock("repeated").unwrap();
    proxy.arm();
    let g = lock.lock().expect("acquire, sent twice");
    assert_eq!(proxy.cuts(), 1);
    let mut c = server.conn();
    let (owner, attempt): (String, u64) = redis::cmd("HMGET")
        .arg("fairlock:{repeated}")
        .arg("owner")
        .arg("attempt")
        .query(&mut c)
        .unwrap();
    g.unlock().unwrap();

    let raw = RawLock::new("fairlock", "repeated", Settings::default()).unwrap();
    let late_copy = raw
        .acquire(&owner, attempt, Duration::from_secs(30), Mode::Wait, "m")
        .run(&mut c)
        .unwrap();
    assert_eq!(late_copy, Acquire::Stale, "the late copy took the lock");
    let other = support::client(&server)
        .fair_lock("repeated")
        .unwrap()
        .try_lock()
        .unwrap();
    assert!(other.is_some(), "the lock is held by nobody's guard");
}

/// Found by the fuzzer's ghost-hold check: a `try_lock` whose request was sent twice and that
/// was answered busy left nothing behind, so its other copy, arriving once the lock was free,
/// took it for a thread that got `None`. A try that may have a copy on the way now leaves with
/// a mark.
#[test]
fn a_busy_try_lock_sent_twice_leaves_a_mark_for_its_copy() {
    use fairlock::raw::{Acquire, Mode, RawLock, Settings};
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let client = proxied_client(&proxy);
    let holder = support::client(&server)
        .fair_lock("busy-twice")
        .unwrap()
        .lock()
        .unwrap();
    let lock = client.fair_lock("busy-twice").unwrap();
    proxy.arm();
    assert!(lock.try_lock().unwrap().is_none());
    assert_eq!(proxy.cuts(), 1);
    let mut c = server.conn();
    let marks = left_marks(&mut c, "busy-twice");
    assert_eq!(marks.len(), 1, "{marks:?}");
    holder.unlock().unwrap();
    let (owner, attempt) = marks[0].clone();
    let raw = RawLock::new("fairlock", "busy-twice", Settings::default()).unwrap();
    let copy = raw
        .acquire(&owner, attempt, Duration::from_secs(30), Mode::Try, "m")
        .run(&mut c)
        .unwrap();
    assert_eq!(copy, Acquire::Stale);
}
