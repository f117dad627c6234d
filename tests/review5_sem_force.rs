//! Review 5, finding F1: an operator's forced release of a semaphore hold that is still a
//! pending hand-off (granted by a release, its wake-up not popped yet) frees the permits and
//! grants them on, but leaves the grant's wake-up in the grantee's wake list. The grantee then
//! pops it and, by its own lease estimate, holds permits that are already someone else's: two
//! holders of a capacity-1 semaphore. The mutex's force_unlock.lua drops the owner's wake-ups
//! (drop_wakeups) before granting on; sem_release.lua with 'force' does not.

mod support;

use std::time::{Duration, Instant};

use fairlock::raw::{
    judge_handoff, Handoff, Mode, RawSemaphore, SemAcquire, SemKind, SemRelease, Settings,
    Witness,
};
use support::RedisServer;

fn settings() -> Settings {
    Settings {
        fence_ttl: Duration::from_secs(3600),
        waiter_timeout: Duration::from_millis(3000),
        ..Settings::default()
    }
}

fn wake_msgs(c: &mut redis::Connection, list: &str) -> Vec<String> {
    redis::cmd("LRANGE").arg(list).arg(0).arg(-1).query(c).unwrap()
}

#[test]
fn a_forced_release_of_a_pending_hand_off_leaves_its_grant_to_be_popped() {
    let server = RedisServer::start();
    let mut c = server.conn();
    let sem = RawSemaphore::new("fairlock", "r5-force", SemKind::Semaphore, 1, settings()).unwrap();
    let lease = Duration::from_secs(30);
    let acquire = |c: &mut redis::Connection, owner: &str, attempt: u64| {
        sem.acquire(owner, attempt, 1, lease, Mode::Wait, "host|1|t")
            .run(c)
            .unwrap()
    };
    // a holds the only permit; b, then c, queue behind it
    let SemAcquire::Granted { token: ta, .. } = acquire(&mut c, "a:1", 1) else {
        panic!("a not granted")
    };
    let b_sent = Instant::now();
    let SemAcquire::Queued { last_token: b_witness, .. } = acquire(&mut c, "b:1", 1) else {
        panic!("b not queued")
    };
    assert!(matches!(acquire(&mut c, "c:1", 1), SemAcquire::Queued { .. }));
    // a releases: the permit is handed off to b (its wake-up waits in b's list)
    let r = sem.release("a:1", 1, ta, false).run(&mut c).unwrap();
    assert!(matches!(r, SemRelease::Released { .. }), "{r:?}");
    let status = sem.status().run(&mut c).unwrap();
    let hold_b = status.holds.iter().find(|h| h.id == "b:1#1").expect("b's hold");
    println!("before the force: holds {:?}", status.holds.iter().map(|h| (&h.id, h.token)).collect::<Vec<_>>());
    // the operator force-releases b's hold as `fairlock release --force --hold b:1#1` would
    let forced = sem.force_release("b:1", 1, hold_b.token).run(&mut c).unwrap();
    println!("force_release(b:1#1) -> {forced:?}");
    let status = sem.status().run(&mut c).unwrap();
    println!("after the force: holds {:?}", status.holds.iter().map(|h| (&h.id, h.token)).collect::<Vec<_>>());
    assert!(status.holds.iter().any(|h| h.id == "c:1#1"), "c was granted the freed permit");
    let list = sem.wake_key("b:1");
    let msgs = wake_msgs(&mut c, &list);
    println!("b's wake list after the force: {msgs:?}");
    // what b's waker would pop, and what b's waiting thread would decide about it
    let grant = msgs.iter().find(|m| m.starts_with("1|g|1|"));
    if let Some(msg) = grant {
        let token: u64 = msg.split('|').nth(3).unwrap().parse().unwrap();
        let mut w = Witness::none(b_sent);
        w.observe(b_sent, b_witness);
        let verdict = judge_handoff(token, w, lease, Instant::now());
        println!("b pops {msg:?}: judge_handoff -> {verdict:?} (c holds the permit: capacity 1)");
        assert!(
            !matches!(verdict, Handoff::Hold { .. }),
            "b would hold a permit the operator released and c now holds: 2 holders of capacity 1"
        );
    }
}
