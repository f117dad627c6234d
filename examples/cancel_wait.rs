//! Giving up a wait from another thread: a shutdown signal, a user who pressed Cancel.
//!
//! ```text
//! cargo run --example cancel_wait -- redis://127.0.0.1:6379/
//! ```

use std::time::Duration;

fn main() -> Result<(), fairlock::Error> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or("redis://127.0.0.1:6379/".into());
    let client = fairlock::LockClient::connect(&url)?;
    let lock = client.fair_lock("examples:cancel")?;
    let held = lock.lock()?; // so that the other thread has to wait

    // the canceller is made by the thread that will wait: it can end that thread's wait only
    let waiting = lock.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        tx.send(waiting.wait_canceller()).expect("main listens");
        waiting.lock().map(|g| g.fencing_token())
    });
    let canceller = rx.recv().expect("the waiting thread sends its canceller");
    std::thread::sleep(Duration::from_millis(300));
    let asked = std::time::Instant::now();
    canceller.abandon()?; // the waiting thread leaves the queue
    match waiter.join().expect("the waiting thread ran") {
        Err(e) if e.kind() == fairlock::ErrorKind::Abandoned => {
            println!(
                "the wait was given up {:?} after abandon: {e}",
                asked.elapsed()
            )
        }
        Err(e) => return Err(e),
        Ok(token) => println!("the lock came first (token {token})"),
    }
    held.unlock()?;
    Ok(())
}
