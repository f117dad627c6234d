//! [`LockClient`]: connections, configuration and the background threads of one client, once
//! built (the settings and the checks before are the builder's, `builder.rs`).

mod builder;
pub use builder::LockClientBuilder;

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::background::janitor::Janitor;
use crate::background::master_watch::MasterWatch;
use crate::background::waker::Wakers;
use crate::background::watchdog::Watchdog;
use crate::config::{Config, WaitMode};
use crate::connection::{with_pooled, Conn, Manager, Pool};
use crate::error::{Error, Result};
use crate::raw;

/// A connection to one Redis server that hands out [`FairLock`](crate::FairLock) handles. Cheap to clone; all
/// clones share the pool, the one blocking connection its waiting threads take turns on, and
/// the three background threads (the watchdog, which renews leases, with its renewer, which
/// makes the renewal round trips, and the janitor, which keeps this client's waiters alive and
/// repairs locks that crashes left behind; through a Sentinel group a fourth, the master watch,
/// which follows the master the sentinels name). The threads
/// stop when the last clone and the last lock handle are dropped. Short-lived threads come and
/// go besides: the server check's (every [`Config::server_check_interval`]) and, through a
/// Sentinel group, one per sentinel for each round of questions.
///
/// ```no_run
/// let client = fairlock::LockClient::connect("redis://127.0.0.1:6379/")?;
/// let lock = client.fair_lock("orders:close-unpaid")?;
/// let guard = lock.lock()?;
/// println!("fencing token {}", guard.fencing_token());
/// guard.unlock()?;
/// # Ok::<(), fairlock::Error>(())
/// ```
#[derive(Clone)]
pub struct LockClient {
    pub(crate) inner: Arc<ClientInner>,
}

/// The client id, the URL without its password and the settings.
impl fmt::Debug for LockClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockClient")
            .field("id", &self.inner.id)
            .field("url", &crate::redact::redact_url(&self.inner.url))
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

pub(crate) struct ClientInner {
    /// Unique per client; with the thread's number it forms the owner id.
    pub id: String,
    pub url: String,
    pub config: Config,
    /// The settings every script of this client runs with.
    pub protocol: raw::Settings,
    /// Numbers the acquire attempts of this client (see `raw`): only ever grows.
    next_attempt: AtomicU64,
    /// (lock key, owner) -> the attempt that thread is making now, for `WaitCanceller`.
    pub waiting: Mutex<HashMap<(String, String), u64>>,
    pub pool: Pool,
    /// Opens every connection (the pool's and the wakers' through it) and checks the server.
    manager: Arc<Manager>,
    /// The BLPOP of this client's waiting threads: one, or one per lock on a Cluster (see
    /// `waker`).
    pub wakers: Wakers,
    pub watchdog: Watchdog,
    pub janitor: Janitor,
    /// Through a Sentinel group: follows the master the sentinels name (see `master_watch`).
    _master_watch: Option<MasterWatch>,
    pub host: String,
    pub pid: u32,
}

impl LockClient {
    /// Connect with default settings.
    ///
    /// # Errors
    /// As [`LockClientBuilder::build`]: [`Error::InvalidUrl`], [`Error::Connection`] when the
    /// server cannot be reached, [`Error::NotRedis`] / [`Error::UnsupportedServer`] for a server
    /// that is not Redis 6.2+, [`Error::UnsafeServer`] for one that may evict keys.
    pub fn connect(url: &str) -> Result<LockClient> {
        Self::builder(url).build()
    }

    /// The settings in force.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// This client's unique id (the first part of every owner id it writes).
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// The owner id of the calling thread: `<client id>:<thread number>` (with
    /// [`WaitMode::PerThread`]: `<client id>.<thread number>:<thread number>`), as stored in Redis.
    pub fn current_owner(&self) -> String {
        self.inner.owner()
    }

    /// Why the client could not check that its server never evicts keys, when it could not:
    /// the server refuses both `INFO` and `CONFIG GET maxmemory-policy` to this user (the same
    /// text is logged at warn level when the client is built). `None` when the check ran (then it
    /// runs again every [`Config::server_check_interval`]). A user refused only `INFO` is
    /// checked with `CONFIG GET`; an evicting server then fails [`LockClientBuilder::build`]
    /// with [`Error::UnsafeServer`] as for any user.
    pub fn skipped_checks(&self) -> Option<&str> {
        self.inner.manager.skipped_checks()
    }

    /// Check now that the server is still safe for locks: its `maxmemory-policy` must not
    /// evict keys. The client runs the same check every [`Config::server_check_interval`] (a
    /// minute by default) and logs an error when it fails; call this from a health check to see it.
    ///
    /// # Errors
    /// [`Error::UnsafeServer`] naming the setting, [`Error::Connection`] when the server cannot
    /// be reached.
    pub fn check_server(&self) -> Result<()> {
        self.inner.check_fork()?;
        self.inner.manager.check_eviction()
    }
}

static NEXT_THREAD: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static THREAD_NUMBER: u64 = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
}

impl ClientInner {
    /// The owner id of the calling thread: `<client id>:<n>`, or with [`WaitMode::PerThread`]
    /// `<client id>.<n>:<n>`, which gives each thread a wake list of its own (the scripts name a
    /// wake list after the part before the last ':').
    pub fn owner(&self) -> String {
        let n = self.thread_number();
        match self.config.wait_mode {
            WaitMode::Shared => format!("{}:{n}", self.id),
            WaitMode::PerThread => format!("{}.{n}:{n}", self.id),
        }
    }

    /// The calling thread's number (unique in this process).
    pub fn thread_number(&self) -> u64 {
        THREAD_NUMBER.with(|n| *n)
    }

    /// "host|pid|thread name", stored with a hold or a queue entry for `status`.
    pub fn meta(&self) -> String {
        let thread = std::thread::current();
        let name: String = thread
            .name()
            .unwrap_or("unnamed")
            .chars()
            .filter(|c| !c.is_control())
            .take(64)
            .collect();
        format!("{}|{}|{}", self.host, self.pid, name)
    }

    /// A new attempt number (see `raw`).
    pub fn next_attempt(&self) -> u64 {
        self.next_attempt.fetch_add(1, Ordering::Relaxed)
    }

    /// Refuse to act in a child process forked after this client was built: it would share the
    /// parent's sockets and owner ids (so its guards' drops would release the parent's holds),
    /// and it has no watchdog or janitor.
    ///
    /// # Errors
    /// [`Error::Forked`] in such a child.
    pub fn check_fork(&self) -> Result<()> {
        if std::process::id() == self.pid {
            Ok(())
        } else {
            Err(Error::Forked)
        }
    }

    /// Run `f` on a pooled connection (a stale one is replaced and `f` repeated; all of
    /// fairlock's calls are safe to repeat: see the scripts' headers).
    pub fn with_conn<T>(
        &self,
        during: &'static str,
        f: impl FnMut(&mut Conn) -> Result<T>,
    ) -> Result<T> {
        self.check_fork()?;
        with_pooled(&self.pool, during, f).inspect_err(|e| crate::telemetry::error(e.kind()))
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown-host".into())
        .replace('|', "_")
}
