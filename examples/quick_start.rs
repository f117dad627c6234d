//! The first minutes with fairlock: connect, lock, re-enter, try, and read the status.
//!
//! ```text
//! cargo run --example quick_start -- redis://127.0.0.1:6379/
//! ```

use std::time::Duration;

fn main() -> Result<(), fairlock::Error> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or("redis://127.0.0.1:6379/".into());
    let client = fairlock::LockClient::connect(&url)?;
    let lock = client.fair_lock("examples:quick-start")?;

    let guard = lock.lock()?; // waits in FIFO order as long as it takes
    println!("held with fencing token {}", guard.fencing_token());
    let inner = lock.lock()?; // the same thread again: no wait
    println!("re-entered: {} levels", inner.hold_count());
    drop(inner);

    // another thread is another owner: it cannot take the lock while this thread holds it
    let other = lock.clone();
    let got_it = std::thread::spawn(move || {
        other
            .try_lock_for(Duration::from_millis(200))
            .map(|guard| guard.is_some())
    })
    .join()
    .expect("the other thread ran")?;
    println!("another thread got it meanwhile: {got_it}");

    let status = lock.status()?;
    if let Some(holder) = &status.holder {
        println!(
            "status: held by pid {} (thread {}), lease left {:?}",
            holder.origin.pid, holder.origin.thread, holder.lease_remaining
        );
    }
    guard.unlock()?; // or drop it; unlock reports a failure
    println!("released; locked now: {}", lock.is_locked()?);
    Ok(())
}
