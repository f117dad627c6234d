//! # fairlock
//!
//! A fair (FIFO), reentrant, blocking distributed lock on Redis for synchronous Rust: thread
//! pools, cron-style jobs that must run on one server at a time, and code without an async
//! runtime. Waiters queue in arrival order and sleep in a `BLPOP`; a release hands the lock
//! straight to the next waiter. A watchdog renews leases while a guard lives, a janitor repairs
//! what crashed processes leave behind, and every hold gets a fencing token.
//!
//! # Quick start
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
//! A [`LockClient`] holds the connections and the background threads; make one per process and
//! share it. [`LockClient::fair_lock`] gives a [`FairLock`], a cheap handle (`Clone + Send +
//! Sync`) to one lock name. A [`LockGuard`] is one level of the calling thread's hold: it
//! belongs to that thread (`!Send`), and dropping it releases that level. Settings other than
//! the defaults go through [`LockClient::builder`].
//!
//! # Waiting
//!
//! [`FairLock::lock`] waits as long as it takes; [`FairLock::try_lock_for`] and
//! [`FairLock::try_lock_until`] wait at most that long; [`FairLock::try_lock`] never waits and
//! never queues. Waiters are served in the order they reached Redis, across threads, processes
//! and machines, and nobody barges in: while anyone is queued a newcomer's `try_lock` fails, and
//! a thread that leaked its hold ([`LockGuard::leak`]) queues behind it like anyone else. A
//! thread about to wait can make a [`WaitCanceller`] ([`FairLock::wait_canceller`]) with which
//! another thread ends that wait. However many threads of a client wait, they share one
//! blocking connection ([`WaitMode`]).
//!
//! # Semaphores and read/write locks
//!
//! [`LockClient::semaphore`] gives a fair counting [`Semaphore`] ("at most N of these at once
//! across the fleet"), [`LockClient::rw_lock`] a fair [`RwLock`]; both wait in the same FIFO
//! queue, with leases, the watchdog, the janitor and fencing tokens as a lock's:
//!
//! ```no_run
//! let client = fairlock::LockClient::connect("redis://127.0.0.1:6379/")?;
//! let slots = client.semaphore("render-slots", 4)?;
//! let permit = slots.acquire()?;            // one of 4; released on drop
//! let catalog = client.rw_lock("catalog")?;
//! let read = catalog.read()?;               // many readers, or one writer
//! # drop((permit, read));
//! # Ok::<(), fairlock::Error>(())
//! ```
//!
//! # Leases, lost locks and fencing
//!
//! A hold has a lease (30 s unless set otherwise), renewed every third of it while the guard
//! lives, so a job may hold a lock far longer than its lease, and a crashed holder's lock moves
//! on once its lease ends. [`FairLock::with_fixed_lease`] turns renewal off for a job that must
//! not run twice within a period:
//!
//! ```no_run
//! use std::time::Duration;
//!
//! let client = fairlock::LockClient::connect("redis://127.0.0.1:6379/")?;
//! let job = client.fair_lock("nightly-report")?.with_fixed_lease(Duration::from_secs(60))?;
//! if let Some(guard) = job.try_lock()? {
//!     // run the job; then keep the lock for the rest of the minute, on every server
//!     guard.leak();
//! }
//! # Ok::<(), fairlock::Error>(())
//! ```
//!
//! A holder that stalls longer than its lease (a GC pause, a stopped process) may still run
//! while the next owner holds the lock: no lease-based lock can prevent that.
//! [`LockGuard::is_lost`] tells when the watchdog found the lock gone; for the writes
//! themselves, pass [`LockGuard::fencing_token`] to the resource and have it reject a token
//! lower than the highest it has seen.
//!
//! # Errors
//!
//! Every call returns [`Result`]. [`Error`] has a variant per outcome, with a message that says
//! what to do; [`Error::kind`] sorts it ([`ErrorKind`]), and [`Error::is_retryable`] tells
//! whether the same call may succeed later:
//!
//! ```no_run
//! let client = fairlock::LockClient::connect("redis://127.0.0.1:6379/")?;
//! let lock = client.fair_lock("orders:close-unpaid")?;
//! match lock.lock() {
//!     Ok(guard) => {
//!         // ... the critical section ...
//!         guard.unlock()?;
//!     }
//!     Err(e) if e.is_retryable() => { /* Redis unreachable or failing over: try again later */ }
//!     Err(e) => return Err(e),
//! }
//! # Ok::<(), fairlock::Error>(())
//! ```
//!
//! # Deployments
//!
//! One Redis node ([`LockClient::connect`], [`LockClient::builder`]), the master of a Sentinel
//! group ([`LockClient::builder_sentinel`], or a `redis+sentinel://` URL), or a Redis Cluster
//! ([`LockClient::builder_cluster`], or a `redis+cluster://` URL), Redis 6.2 or later. A server
//! that may evict keys is refused. Replication is asynchronous, so a failover can lose the last
//! grant; [`LockClientBuilder::replica_acks`] keeps a guard from resting on such a grant.
//!
//! # Guarantees
//!
//! [`FairLock`] states its guarantees and limits. The README sums all fourteen up in a few
//! bullets, and `docs/guarantees.md` gives them in full, each with the test that shows it.
//!
//! # Cargo features
//!
//! - `tls` (on by default): `rediss://` URLs (and `rediss+sentinel://`, `rediss+cluster://`),
//!   private CAs and client certificates ([`LockClientBuilder::tls_ca_file`] and its kin),
//!   through rustls. Without it a TLS URL or setting is refused at [`LockClientBuilder::build`].
//! - `metrics`: acquisitions, wait and hold times, hand-offs, renewals, lost holds and more
//!   recorded through the [`metrics`](https://docs.rs/metrics) facade; the application installs
//!   the recorder (exporter). Off by default.
//! - `cli`: the `fairlock` command-line tool, which runs a command under a lock, shows who holds
//!   a lock and releases one by force (`cargo install fairlock --features cli`). Off by default,
//!   so the library alone pulls in no argument parser.
//! - `raw`: the module `fairlock::raw`, the protocol's calls one by one, for the fuzzer, the
//!   benchmarks and tools. Off by default; its replies mirror the Lua scripts' and change with
//!   them, with no stability promise. With it, `fairlock::raw_deadlock` is the deadlock check
//!   of a waiting thread without I/O (the machine the library drives), its index of long waits
//!   and the schedule of a wait's checks, for the fuzzer.
//!
//! # Further reading
//!
//! The README covers the command-line tool, deployments and configuration. In `docs/`, shipped
//! with the crate: `guarantees.md` (guarantees, limits, fencing), `deployments.md` (Sentinel,
//! Cluster, replica acknowledgements, the server's configuration), `design.md` (how it works,
//! and the layers of the source, which `tests/it/layers.rs` checks), `evidence.md` (tests, fault
//! injection, the protocol fuzzer) and `benchmarks.md`.

#![warn(missing_docs)]
#![warn(missing_debug_implementations)]
// docs.rs (`--cfg docsrs`, Cargo.toml): mark the items a feature gates.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod acquire;
mod background;
mod boot_clock;
mod client;
mod config;
mod connection;
mod cycle;
mod deadlock;
mod error;
mod hold;
mod keys;
mod kind;
mod lease_estimate;
mod limits;
mod list;
mod lock;
mod loss;
#[cfg(feature = "raw")]
#[cfg_attr(docsrs, doc(cfg(feature = "raw")))]
pub mod raw;
// Without the feature the protocol is the library's own; some of its calls serve only the
// fuzzer, the benchmarks and tools.
#[cfg(not(feature = "raw"))]
#[allow(dead_code, unused_imports)]
mod raw;
/// The deadlock check of a waiting thread with
/// [`deadlock_detection`](LockClientBuilder::deadlock_detection) on, without I/O: the very machine
/// the library drives ([`DeadlockCheck`](raw_deadlock::DeadlockCheck): what to read next, fed the
/// replies), the index of long waits it follows (its key, entries, TTL and commands) and when a
/// wait publishes and checks. For the protocol fuzzer and tools, like [`raw`]: no stability
/// promise. See `docs/design.md`, "Deadlock detection".
#[cfg(feature = "raw")]
#[cfg_attr(docsrs, doc(cfg(feature = "raw")))]
pub mod raw_deadlock {
    pub use crate::deadlock::chase::{
        first_due, index_key, index_ttl, next_due, publish_cmds, read_index_cmd, unpublish_cmd,
        DeadlockCheck, Due, IndexedWait, Need, MAX_INDEX_READS, MAX_RESOURCES,
    };
    pub use crate::deadlock::Primitive;
}
mod redact;
mod semaphore;
mod status;
mod telemetry;

pub use acquire::wait::WaitCanceller;
pub use client::{LockClient, LockClientBuilder};
pub use config::{Config, WaitMode};
pub use connection::credentials::{Credentials, CredentialsError};
/// The channels of [`LockGuard::lost_signal`], re-exported so that `select!` needs no other
/// dependency.
pub use crossbeam_channel;
pub use cycle::{Blocking, Deadlock, DeadlockMember, LockRef};
pub use error::{Error, ErrorKind, Result};
pub use keys::validate_name;
pub use kind::HoldKind;
pub use limits::{DEFAULT_LEASE, MAX_LEASE, MAX_NAME_LEN, MAX_PREFIX_LEN, MIN_LEASE};
pub use list::{
    ListOptions, LockListing, SkippedName, StaleSigns, LIST_SCAN_COUNT, UNUSUALLY_LONG_FACTOR,
    UNUSUALLY_LONG_FLOOR,
};
pub use lock::guard::LockGuard;
pub use lock::FairLock;
pub use loss::{LossCause, LostHold};
pub use redact::redact_url;
/// The redis crate, whose types [`Error::Redis`] and the `raw` feature's calls carry.
pub use redis;
pub use semaphore::permit::Permit;
pub use semaphore::rwlock::{ReadGuard, RwLock, WriteGuard};
pub use semaphore::{Semaphore, MAX_CAPACITY};
pub use status::{Holder, LockStatus, Origin, PermitHolder, PermitWaiter, SemaphoreStatus, Waiter};
