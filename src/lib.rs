//! # fairlock
//!
//! A fair (FIFO), reentrant, blocking distributed lock on Redis for synchronous Rust: thread
//! pools, cron-style jobs that must run on one server at a time, and code without an async
//! runtime.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! let client = fairlock::LockClient::connect("redis://127.0.0.1:6379/")?;
//! let lock = client.fair_lock("orders:close-unpaid")?;
//!
//! let guard = lock.lock()?;                       // waits in FIFO order
//! let token = guard.fencing_token();              // strictly increasing per lock name
//! let inner = lock.lock()?;                       // re-entry by the same thread: no wait
//! drop(inner);
//! guard.unlock()?;                                // or just drop it
//!
//! if let Some(guard) = lock.try_lock_for(Duration::from_secs(5))? {
//!     // ...
//! #   drop(guard);
//! }
//! # let _ = token;
//! # Ok::<(), fairlock::Error>(())
//! ```
//!
//! Layers, bottom to top; a module uses only those below it (`tests/layers.rs` checks it):
//! 1. `limits` (limits and defaults), `error`, `keys` (the key scheme and name checks),
//!    `boot_clock` (a clock that counts suspend), `server_check` (the eviction policy check),
//!    `sentinel` (which master a Sentinel group names), `lease_estimate` (a hand-off's lease
//!    start, a pure function the fuzzer drives too);
//! 2. `connection`: the connection manager, the pools and the retry of a dropped connection;
//! 3. [`raw`]: the protocol, `scripts/*.lua` with one typed call per transition;
//! 4. `hold`: the per-thread record of holds, and the state a hold shares with the watchdog;
//! 5. `watchdog` (lease renewal) and `janitor` (waiter heartbeats and crash repair), one thread
//!    each per client, fed plain data, `waker` (the one BLPOP all waiting threads of a
//!    client take turns on) and `master_watch` (through a Sentinel group: follow its master);
//! 6. `client`: [`LockClient`], its settings, pools and background threads;
//! 7. `status`, then [`FairLock`] (`lock`) and [`LockGuard`] (`guard`), the handle and its
//!    guard, which refer to each other as `lock_api`'s `Mutex` and `MutexGuard` do, with
//!    `attempt`, one acquire call that may wait (the wake-up path).

#![warn(missing_docs)]
#![warn(missing_debug_implementations)]

mod attempt;
mod boot_clock;
mod client;
mod config;
mod connection;
mod error;
mod guard;
mod hold;
mod janitor;
mod keys;
mod lease_estimate;
mod limits;
mod lock;
mod master_watch;
#[cfg(feature = "raw")]
pub mod raw;
// Without the feature the protocol is the library's own; some of its calls serve only the
// fuzzer, the benchmarks and tools.
#[cfg(not(feature = "raw"))]
#[allow(dead_code)]
mod raw;
mod redact;
mod sentinel;
mod server_check;
mod status;
mod waker;
mod watchdog;

pub use client::{LockClient, LockClientBuilder};
pub use config::{Config, WaitMode};
pub use error::{Error, ErrorKind, Result};
pub use guard::LockGuard;
pub use keys::validate_name;
pub use limits::{DEFAULT_LEASE, MAX_LEASE, MAX_NAME_LEN, MAX_PREFIX_LEN, MIN_LEASE};
pub use lock::{FairLock, WaitCanceller};
pub use redact::redact_url;
/// The redis crate, whose types [`Error::Redis`] and the `raw` feature's calls carry.
pub use redis;
pub use status::{Holder, LockStatus, Origin, Waiter};
