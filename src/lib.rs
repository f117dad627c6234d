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
//! let lock = client.lock("orders:close-unpaid")?;
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
//! Layers, as in `lock_api`: `scripts/*.lua` with their typed calls in [`raw`] are the raw
//! protocol; [`FairLock`] and [`LockGuard`] are what users touch; the watchdog (lease renewal)
//! and the janitor (waiter heartbeats and crash repair) run in the background, one thread each
//! per [`LockClient`].

#![warn(missing_docs)]

mod boot_clock;
mod client;
mod connection;
mod error;
mod guard;
mod janitor;
mod keys;
mod lock;
pub mod raw;
mod server_check;
mod status;
mod watchdog;

pub use client::{
    Config, LockClient, LockClientBuilder, MAX_LEASE, MAX_WAITING_CONNECTIONS, MIN_LEASE,
};
pub use error::{Error, Result};
pub use guard::LockGuard;
pub use keys::{validate_name, MAX_NAME_LEN};
pub use lock::FairLock;
pub use status::{Holder, LockStatus, Origin, Waiter};
