//! [`LockClient`]: connections, configuration and the background threads of one client.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::config::{Config, WaitMode};
use crate::connection::{with_pooled, Conn, Manager, Pool, CLUSTER_SCHEME, SENTINEL_SCHEME};
use crate::error::{Error, Result};
use crate::janitor::Janitor;
use crate::master_watch::MasterWatch;
use crate::raw;
use crate::waker::Wakers;
use crate::watchdog::Watchdog;

/// Builds a [`LockClient`] with settings other than the defaults.
///
/// ```no_run
/// use std::time::Duration;
/// let client = fairlock::LockClient::builder("redis://127.0.0.1:6379/")
///     .lease(Duration::from_secs(10))
///     .key_prefix("myapp-locks")
///     .pool_size(16)
///     .build()?;
/// # Ok::<(), fairlock::Error>(())
/// ```
#[derive(Clone)]
pub struct LockClientBuilder {
    url: String,
    config: Config,
}

/// The URL without its password ([`redact_url`](crate::redact_url)).
impl fmt::Debug for LockClientBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockClientBuilder")
            .field("url", &crate::redact::redact_url(&self.url))
            .field("config", &self.config)
            .finish()
    }
}

impl LockClientBuilder {
    /// All settings at once, e.g. a [`Config`] read from a configuration file, or another
    /// client's [`LockClient::config`]. Checked by [`build`](Self::build) like the others.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// let config = fairlock::Config {
    ///     key_prefix: "myapp-locks".into(),
    ///     ..fairlock::Config::default()
    /// };
    /// let client = fairlock::LockClient::builder("redis://127.0.0.1:6379/")
    ///     .config(config)
    ///     .build()?;
    /// # Ok::<(), fairlock::Error>(())
    /// ```
    pub fn config(mut self, config: Config) -> Self {
        self.config = config;
        self
    }

    /// Lease of a hold (default 30 s, at least 100 ms). The watchdog renews it every third.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.config.lease = lease;
        self
    }

    /// Prefix of every Redis key (default `fairlock`).
    pub fn key_prefix(mut self, prefix: &str) -> Self {
        self.config.key_prefix = prefix.to_string();
        self
    }

    /// Size of the command connection pool (default 8).
    pub fn pool_size(mut self, size: u32) -> Self {
        self.config.pool_size = size;
        self
    }

    /// TCP connect timeout, also the wait for a free pooled connection (default 2 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.config.connect_timeout = timeout;
        self
    }

    /// Reply timeout of a command (default 5 s).
    pub fn read_timeout(mut self, timeout: Duration) -> Self {
        self.config.read_timeout = timeout;
        self
    }

    /// Janitor interval (default 1 s). Dead waiters are removed after 3 intervals.
    pub fn janitor_interval(mut self, interval: Duration) -> Self {
        self.config.janitor_interval = interval;
        self
    }

    /// How often the server's eviction policy is checked again while the client runs (default
    /// 1 minute, 1 s to 1 day); a policy that may evict keys is logged as an error. See
    /// [`Config::server_check_interval`].
    pub fn server_check_interval(mut self, interval: Duration) -> Self {
        self.config.server_check_interval = interval;
        self
    }

    /// How long a lock's last fencing token is kept after its last grant (default 7 days, at
    /// least 1 minute). Tokens rise without it too; it only bounds the memory of idle names.
    pub fn fence_ttl(mut self, ttl: Duration) -> Self {
        self.config.fence_ttl = ttl;
        self
    }

    /// Through a Sentinel group or on a Cluster: how long a call keeps trying while a failover
    /// leaves no master to reach (default 60 s, at most 1 h).
    pub fn failover_timeout(mut self, timeout: Duration) -> Self {
        self.config.failover_timeout = timeout;
        self
    }

    /// Make every grant wait for `replicas` replicas to acknowledge it (`WAIT`), for at most
    /// `timeout`, before it becomes a guard; see [`Config::replica_acks`].
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// let client = fairlock::LockClient::builder_sentinel("mymaster", &["10.0.0.1:26379"])
    ///     .replica_acks(1, Duration::from_millis(500))
    ///     .build()?;
    /// # Ok::<(), fairlock::Error>(())
    /// ```
    pub fn replica_acks(mut self, replicas: u32, timeout: Duration) -> Self {
        self.config.replica_acks = replicas;
        self.config.replica_ack_timeout = timeout;
        self
    }

    /// How waiting threads wait (default [`WaitMode::Shared`]: one connection for all of them).
    ///
    /// ```no_run
    /// let client = fairlock::LockClient::builder("redis://127.0.0.1:6379/")
    ///     .wait_mode(fairlock::WaitMode::PerThread)
    ///     .build()?;
    /// # Ok::<(), fairlock::Error>(())
    /// ```
    pub fn wait_mode(mut self, mode: WaitMode) -> Self {
        self.config.wait_mode = mode;
        self
    }

    /// Check the settings, connect once to check the server, and start the background threads.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a setting out of range, [`Error::InvalidUrl`],
    /// [`Error::Connection`] when the server cannot be reached, [`Error::NotRedis`] /
    /// [`Error::UnsupportedServer`] for a server that is not Redis 6.2+, and
    /// [`Error::UnsafeServer`] for a Redis whose `maxmemory-policy` may evict keys.
    pub fn build(self) -> Result<LockClient> {
        self.config.validate()?;
        let c = &self.config;

        // one manager for the pool, the wakers, the checks and the master watch: through a
        // Sentinel group, they all follow the same master
        let manager = Arc::new(Manager::new(
            &self.url,
            c.connect_timeout,
            c.read_timeout,
            c.failover_timeout,
        )?);
        let version = manager.check_server()?;
        let runner = choose_runner(&manager, version)?;
        let cluster = self.url.starts_with(CLUSTER_SCHEME);
        if c.replica_acks > 0 && !cluster {
            check_publish(&manager)?;
        }
        let pool = Pool::new(Arc::clone(&manager), c.pool_size, c.connect_timeout);
        let id = uuid::Uuid::new_v4().simple().to_string();
        let acks = (c.replica_acks > 0).then_some((c.replica_acks, c.replica_ack_timeout));
        let per_thread = c.wait_mode == WaitMode::PerThread;
        let wakers = Wakers::new(
            Arc::clone(&manager),
            cluster,
            per_thread,
            pool.clone(),
            c.read_timeout,
            acks,
        );
        let watchdog = Watchdog::start(pool.clone(), &id, c.lease)?;
        let master_watch = MasterWatch::start(Arc::clone(&manager), &id)?;
        let checker = Arc::clone(&manager);
        let janitor = Janitor::start(
            pool.clone(),
            &id,
            c.janitor_interval,
            c.server_check_interval,
            Arc::new(move || checker.check_eviction()),
        )?;
        let protocol = raw::Settings {
            fence_ttl: c.fence_ttl,
            waiter_timeout: c.waiter_timeout(),
            runner,
        };
        Ok(LockClient {
            inner: Arc::new(ClientInner {
                host: hostname(),
                pid: std::process::id(),
                id,
                url: self.url.clone(),
                protocol,
                config: self.config,
                pool,
                wakers,
                watchdog,
                janitor,
                _master_watch: master_watch,
                manager,
                next_attempt: AtomicU64::new(1),
                waiting: Mutex::new(HashMap::new()),
            }),
        })
    }
}

/// How this client's calls will reach the scripts: the function library where the server has
/// functions (Redis 7+) and lets this user load them, loaded now; `EVALSHA` otherwise (Redis
/// 6.2, or a managed server whose ACLs refuse `FUNCTION LOAD`).
///
/// `version`: the lowest of the masters', `None` when the server would not say (INFO refused):
/// then the library is tried.
fn choose_runner(manager: &Manager, version: Option<(u32, u32)>) -> Result<raw::Runner> {
    if version.is_some_and(|v| raw::Runner::for_version(v) == raw::Runner::Eval) {
        return Ok(raw::Runner::Eval);
    }
    let mut conn = manager
        .open()
        .map_err(|e| Error::from_redis("connecting", e))?;
    match raw::load_library(&mut conn) {
        Ok(()) => Ok(raw::Runner::Functions),
        Err(e) if e.is_connection() => Err(e),
        Err(e) => {
            log::warn!("fairlock: cannot load its function library ({e}); using EVALSHA");
            Ok(raw::Runner::Eval)
        }
    }
}

/// Replica acknowledgements on one node publish to `fairlock:replicated` (see
/// `raw::acknowledged_by_replicas`): refuse at build time a user who may not, rather than fail
/// every grant.
fn check_publish(manager: &Manager) -> Result<()> {
    let mut conn = manager
        .open()
        .map_err(|e| Error::from_redis("connecting", e))?;
    conn.query::<i64>(redis::cmd("PUBLISH").arg(raw::REPLICATED_CHANNEL).arg(""))
        .map(drop)
        .map_err(|e| match Error::from_redis("checking that replica acknowledgements can work", e) {
            Error::PermissionDenied {
                during,
                detail,
                credentials,
            } => Error::PermissionDenied {
                during,
                detail: format!(
                    "{detail}; replica acknowledgements publish on the channel {0}: add &{0} to the user's ACL",
                    raw::REPLICATED_CHANNEL
                ),
                credentials,
            },
            other => other,
        })
}

/// A connection to one Redis server that hands out [`FairLock`](crate::FairLock) handles. Cheap to clone; all
/// clones share the pool, the one blocking connection its waiting threads take turns on, and
/// the two background threads (the watchdog, which renews leases, and the janitor, which keeps
/// this client's waiters alive and repairs locks that crashes left behind; through a Sentinel
/// group a third, the master watch, which follows the master the sentinels name). The threads
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

    /// Start configuring a client. `url` names one node (`redis://host:port/`, any URL the
    /// `redis` crate opens), the master of a Sentinel group:
    /// `redis+sentinel://[user:password@]host:port[,host:port...]/<master name>` (as
    /// [`builder_sentinel`](Self::builder_sentinel) builds it; the credentials, percent-encoded,
    /// are the master's and its replicas', the sentinels are reached without), or a Redis
    /// Cluster by some of
    /// its nodes: `redis+cluster://[user:password@]host:port[,host:port...]/` (as
    /// [`builder_cluster`](Self::builder_cluster) builds it).
    pub fn builder(url: &str) -> LockClientBuilder {
        LockClientBuilder {
            url: url.to_string(),
            config: Config::default(),
        }
    }

    /// Start configuring a client of the master that the Sentinel group at `sentinels`
    /// (`host:port` or `redis://host:port/` each) knows as `master_name`. Every new connection
    /// goes to the master that more than half of these sentinels name then (list them all: while
    /// they disagree, as in a failover, no master is followed), and a thread asks them every
    /// 200 ms, so the client follows a failover, even one that leaves the old master up; calls
    /// made while there is no such master keep trying for [`Config::failover_timeout`]. For a
    /// master that asks
    /// for a password, use [`builder`](Self::builder) with
    /// `redis+sentinel://user:password@host:port,.../<master name>`.
    ///
    /// ```no_run
    /// let client = fairlock::LockClient::builder_sentinel(
    ///     "mymaster",
    ///     &["redis://10.0.0.1:26379", "redis://10.0.0.2:26379", "10.0.0.3:26379"],
    /// )
    /// .build()?;
    /// # Ok::<(), fairlock::Error>(())
    /// ```
    pub fn builder_sentinel(master_name: &str, sentinels: &[&str]) -> LockClientBuilder {
        let hosts: Vec<&str> = sentinels
            .iter()
            .map(|s| {
                s.strip_prefix("redis://")
                    .unwrap_or(s)
                    .trim_end_matches('/')
            })
            .collect();
        Self::builder(&format!(
            "{SENTINEL_SCHEME}{}/{master_name}",
            hosts.join(",")
        ))
    }

    /// Start configuring a client of the Redis Cluster that `nodes` (`host:port` or
    /// `redis://[user:password@]host:port/` each; some of its nodes, any role) belong to. The
    /// nodes share one user and password (the last one given). The client learns the
    /// others from them. A lock's keys share one hash slot, so each lock lives on one shard and
    /// locks spread over all of them; commands follow `MOVED` / `ASK` redirects, and calls made
    /// while a slot has no master (a failover under way) keep trying for
    /// [`Config::failover_timeout`].
    ///
    /// ```no_run
    /// let client = fairlock::LockClient::builder_cluster(&[
    ///     "redis://10.0.0.1:7000",
    ///     "10.0.0.2:7000",
    /// ])
    /// .build()?;
    /// # Ok::<(), fairlock::Error>(())
    /// ```
    pub fn builder_cluster(nodes: &[&str]) -> LockClientBuilder {
        let mut credentials = "";
        let hosts: Vec<&str> = nodes
            .iter()
            .map(|s| {
                let node = s
                    .strip_prefix("redis://")
                    .unwrap_or(s)
                    .trim_end_matches('/');
                match node.rsplit_once('@') {
                    Some((user_password, host)) => {
                        credentials = user_password;
                        host
                    }
                    None => node,
                }
            })
            .collect();
        let at = if credentials.is_empty() { "" } else { "@" };
        Self::builder(&format!(
            "{CLUSTER_SCHEME}{credentials}{at}{}/",
            hosts.join(",")
        ))
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
        with_pooled(&self.pool, during, f)
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
