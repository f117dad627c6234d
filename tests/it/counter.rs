//! Mutual exclusion across processes: 4 processes x 4 threads do a read-modify-write of a Redis
//! counter (GET, pause, SET) under the lock. A lost update, two holders at once, or a fencing
//! token that goes down would show.

use crate::support;

use std::thread;
use std::time::Duration;

use crate::support::{say, Proc, RedisServer};

const PROCESSES: usize = 4;
const THREADS: usize = 4;
const ROUNDS: usize = 25;

/// Child role "counter": THREADS threads x ROUNDS acquisitions; prints `COUNT <acquisitions>`.
fn counter_child() {
    support::child_time_limit(Duration::from_secs(90));
    let url: String = support::env_arg("URL");
    let client = support::client_with_url(&url, |b| b.lease(Duration::from_secs(2)));
    let lock = client.fair_lock("counter").unwrap();
    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let lock = lock.clone();
            let url = url.clone();
            thread::spawn(move || {
                let mut redis = redis::Client::open(url).unwrap().get_connection().unwrap();
                let mut done = 0;
                for round in 0..ROUNDS {
                    let g = lock.lock().unwrap();
                    // nobody else inside: a second holder would see occupancy 2
                    let occupancy: i64 = redis::cmd("INCR")
                        .arg("test:inside")
                        .query(&mut redis)
                        .unwrap();
                    assert_eq!(occupancy, 1, "two holders at once");
                    // fencing: every grant's token is above the last one any holder used
                    let last: Option<u64> = redis::cmd("GET")
                        .arg("test:last-token")
                        .query(&mut redis)
                        .unwrap();
                    assert!(
                        last.is_none_or(|l| g.fencing_token() > l),
                        "token {} after {last:?}",
                        g.fencing_token()
                    );
                    redis::cmd("SET")
                        .arg("test:last-token")
                        .arg(g.fencing_token())
                        .exec(&mut redis)
                        .unwrap();
                    // the read-modify-write the lock protects, with a pause to widen any race
                    let n: i64 = redis::cmd("GET")
                        .arg("test:counter")
                        .query::<Option<i64>>(&mut redis)
                        .unwrap()
                        .unwrap_or(0);
                    if round % 3 == 0 {
                        thread::sleep(Duration::from_millis(2));
                    } else {
                        thread::yield_now();
                    }
                    redis::cmd("SET")
                        .arg("test:counter")
                        .arg(n + 1)
                        .exec(&mut redis)
                        .unwrap();
                    let _: i64 = redis::cmd("DECR")
                        .arg("test:inside")
                        .query(&mut redis)
                        .unwrap();
                    g.unlock().unwrap();
                    done += 1;
                }
                done
            })
        })
        .collect();
    let total: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
    say("COUNT", total);
}

#[test]
fn four_processes_of_four_threads_never_lose_a_counter_update() {
    let children = support::child_test!("counter" => counter_child);
    let server = RedisServer::start();
    let env = [("URL", server.url())];
    let mut workers: Vec<Proc> = (0..PROCESSES)
        .map(|_| children.spawn("counter", &env))
        .collect();
    let mut acquisitions = 0;
    for w in &mut workers {
        acquisitions += w
            .expect("COUNT", Duration::from_secs(90))
            .parse::<usize>()
            .unwrap();
        assert!(
            w.exits_ok(Duration::from_secs(30)),
            "a counter child failed"
        );
    }
    assert_eq!(acquisitions, PROCESSES * THREADS * ROUNDS);
    let mut c = server.conn();
    let counter: i64 = redis::cmd("GET").arg("test:counter").query(&mut c).unwrap();
    assert_eq!(counter as usize, acquisitions, "lost updates");
    let inside: i64 = redis::cmd("GET").arg("test:inside").query(&mut c).unwrap();
    assert_eq!(inside, 0);
    // Tokens are time-seeded, so they are not counted 1, 2, 3...: every holder checked that its
    // token was above the last one used (so all were distinct), and the fence counter must be
    // the last token any holder used: no hold took a token nobody saw.
    let last_token: u64 = redis::cmd("GET")
        .arg("test:last-token")
        .query(&mut c)
        .unwrap();
    let client = support::client(&server);
    let st = client.fair_lock("counter").unwrap().status().unwrap();
    assert_eq!(st.fencing_counter, last_token);
    assert!(st.holder.is_none() && st.waiters.is_empty());
}
