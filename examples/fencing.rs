//! Fencing: the resource checks the token, so a holder that stalled past its lease (a GC pause,
//! a stopped process) cannot overwrite the work of the holder after it.
//!
//! ```text
//! cargo run --example fencing -- redis://127.0.0.1:6379/
//! ```
//!
//! The "resource" here is a Redis key written by a small script that refuses a write with a
//! token lower than the highest it has seen; a database does the same with a column and a
//! conditional UPDATE (`... WHERE fence < $token`).

use fairlock::redis;

/// Write `value` to `key` if `token` is at least the highest token seen there; 1 if written.
const FENCED_SET: &str = r"
local highest = tonumber(redis.call('HGET', KEYS[1], 'token') or '0')
if tonumber(ARGV[1]) < highest then return 0 end
redis.call('HSET', KEYS[1], 'token', ARGV[1], 'value', ARGV[2])
return 1";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or("redis://127.0.0.1:6379/".into());
    let client = fairlock::LockClient::connect(&url)?;
    let lock = client.fair_lock("examples:fenced-report")?;
    let mut resource = redis::Client::open(url.as_str())?.get_connection()?;
    let fenced_set = redis::Script::new(FENCED_SET);

    // an old holder's token, as if its process had stalled while the lock moved on
    let stale_token = lock.lock()?.fencing_token();
    let guard = lock.lock()?;
    let written: i64 = fenced_set
        .key("examples:report")
        .arg(guard.fencing_token())
        .arg("from the current holder")
        .invoke(&mut resource)?;
    println!(
        "the current holder's write: {}",
        if written == 1 { "taken" } else { "refused" }
    );
    let written: i64 = fenced_set
        .key("examples:report")
        .arg(stale_token)
        .arg("from a stalled former holder")
        .invoke(&mut resource)?;
    println!(
        "the stalled holder's late write: {}",
        if written == 1 { "taken" } else { "refused" }
    );
    guard.unlock()?;
    Ok(())
}
