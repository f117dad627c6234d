//! Review 5, finding F2: `ReadGuard`/`WriteGuard` are `Send`, but the up/downgrade check
//! (`Error::WouldDeadlock`, src/rwlock.rs) keys on the thread that *took* the guard, not on the
//! thread that holds it. A guard moved to another thread (legitimate: it is Send) makes
//! (a) the holding thread's `write()` wait on its own read, with no WouldDeadlock (a `write()`
//!     would hang forever; here a bounded `try_write_for` shows the wait), and
//! (b) the thread that took it and gave it away get a WouldDeadlock for a wait that is no
//!     deadlock at all.

mod support;

use std::time::{Duration, Instant};

use support::RedisServer;

fn assert_send<T: Send>() {}

#[test]
fn a_read_guard_moved_to_another_thread_defeats_the_would_deadlock_check() {
    assert_send::<fairlock::ReadGuard>();
    let server = RedisServer::start();
    let client = support::client(&server);
    let rw = client.rw_lock("r5-rw-send").unwrap();

    // same thread: the documented behaviour
    let r = rw.read().unwrap();
    let same = rw.try_write_for(Duration::from_millis(500));
    println!("same thread holds a read, asks the write: {same:?}");
    assert!(matches!(same, Err(fairlock::Error::WouldDeadlock { .. })));

    // the read guard moves to thread B, which then asks for the write
    let rw_b = rw.clone();
    let b = std::thread::spawn(move || {
        let guard = r; // B holds the read now
        let t = Instant::now();
        let asked = rw_b.try_write_for(Duration::from_secs(1));
        let waited = t.elapsed();
        drop(guard);
        (format!("{asked:?}"), asked.is_ok_and(|w| w.is_none()), waited)
    });
    let (shown, timed_out, waited) = b.join().unwrap();
    println!("thread B holds the (moved) read, asks the write: {shown} after {waited:?}");

    // thread A gave its read away; its own write is no deadlock any more
    let r2 = rw.read().unwrap();
    let rw_c = rw.clone();
    let moved = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        drop(r2); // released by the thread it was moved to
    });
    let _ = &rw_c;
    let a = rw.try_write_for(Duration::from_secs(2));
    println!("thread A gave its read away (released in 300 ms), asks the write: {a:?}");
    moved.join().unwrap();

    assert!(
        !timed_out,
        "B waited on its own read with no WouldDeadlock (write() would never return)"
    );
    assert!(a.is_ok(), "A got {a:?} although the read it took is another thread's");
}
