//! A scheduled job that must run on one server of a fleet, and not again within its period:
//! run it from cron on every server; the first to start runs it, the others skip it.
//!
//! ```text
//! cargo run --example cron_job -- redis://127.0.0.1:6379/
//! ```
//!
//! The fixed lease is not renewed, and the guard is leaked, so the lock stays taken until the
//! period ends even though the job finished: a server whose clock or cron fires a little late
//! finds it taken and skips the run.

use std::time::Duration;

const PERIOD: Duration = Duration::from_secs(60);

fn main() -> Result<(), fairlock::Error> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or("redis://127.0.0.1:6379/".into());
    let client = fairlock::LockClient::connect(&url)?;
    let job = client
        .fair_lock("examples:close-unpaid-orders")?
        .with_fixed_lease(PERIOD)?;
    match job.try_lock()? {
        Some(guard) => {
            println!("running the job (fencing token {})", guard.fencing_token());
            // ... close the unpaid orders ...
            let token = guard.leak();
            println!("done; no server runs it again for {PERIOD:?} (token {token})");
        }
        None => println!("another server runs it, or ran it less than {PERIOD:?} ago: skipped"),
    }
    Ok(())
}
