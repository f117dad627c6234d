mod support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use support::RedisServer;

#[test]
fn lock_release_reenter_and_handoff() {
    let server = RedisServer::start();
    let client = support::client(&server);
    let lock = client.lock("smoke").unwrap();
    let g = lock.lock().unwrap();
    assert_eq!(g.fencing_token(), 1);
    let g2 = lock.lock().unwrap();
    assert_eq!(g2.fencing_token(), 1);
    assert_eq!(lock.hold_count().unwrap(), 2);
    drop(g2);
    assert_eq!(lock.hold_count().unwrap(), 1);

    let inside = Arc::new(AtomicU32::new(0));
    let mut handles = vec![];
    for _ in 0..4 {
        let lock = lock.clone();
        let inside = inside.clone();
        handles.push(std::thread::spawn(move || {
            for _ in 0..20 {
                let g = lock.lock().unwrap();
                assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0);
                inside.fetch_sub(1, Ordering::SeqCst);
                g.unlock().unwrap();
            }
        }));
    }
    std::thread::sleep(Duration::from_millis(200));
    let st = lock.status().unwrap();
    println!("{st:#?}");
    g.unlock().unwrap();
    for h in handles {
        h.join().unwrap();
    }
    assert!(!lock.is_locked().unwrap());
    let keys = server.keys();
    println!("{keys:?}");
}
