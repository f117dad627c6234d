//! [`LockClientBuilder`]: the settings of a client, checked, and what `build` checks with the
//! server before the client runs.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::background::janitor::Janitor;
use crate::background::master_watch::MasterWatch;
use crate::background::waker::Wakers;
use crate::background::watchdog::Watchdog;
use crate::config::{Config, WaitMode};
use crate::connection::credentials::{Credentials, CredentialsError, Provider};
use crate::connection::tls::{Pem, TlsSettings};
use crate::connection::{
    ConnectOptions, Manager, Pool, CLUSTER_SCHEME, CLUSTER_TLS_SCHEME, SENTINEL_SCHEME,
    SENTINEL_TLS_SCHEME,
};
use crate::error::{Error, Result};
use crate::loss::OnLost;
use crate::raw;

use super::{hostname, ClientInner, LockClient};

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
    tls: TlsSettings,
    credentials: Option<Provider>,
    on_lost: Option<OnLost>,
}

/// The URL without its password ([`redact_url`](crate::redact_url)).
impl fmt::Debug for LockClientBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockClientBuilder")
            .field("url", &crate::redact::redact_url(&self.url))
            .field("config", &self.config)
            .field("tls", &self.tls)
            .field("credentials", &self.credentials)
            .field("on_lost", &self.on_lost.as_ref().map(|_| "<callback>"))
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

    /// Find and break deadlocks (off by default): a thread of this client that has waited
    /// `after` (at least 100 ms, at most 1 h) for a lock, permits or a read or write checks
    /// whether its wait closes a cycle (it waits for a lock whose holder waits, directly or
    /// through others, for what this thread holds), and again every `after` while it waits.
    /// In a cycle that a second reading confirms, the youngest wait
    /// ([`Deadlock::youngest_wait`](crate::Deadlock::youngest_wait)) is refused: its call
    /// returns [`Error::Deadlock`](crate::Error::Deadlock) naming the cycle, having left the
    /// queue as a timed-out wait does; every other member keeps its place and is served.
    ///
    /// Only the waits of clients with it on are found: every member of a cycle must have it on
    /// (their long waits are published in an index, `<key prefix>:waits:{<client>}`, which the
    /// check follows from the lock waited for, hop by hop, instead of scanning; a wait publishes
    /// itself when it has lasted `after` / 2). A cycle standing longer than `after`, plus the
    /// round trips of one publication, one check and the leave, is broken (when a wait's
    /// publication lands less than `after` / 2 late); a wait shorter than `after` / 2 costs
    /// nothing. See `docs/design.md`, "Deadlock detection".
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// let client = fairlock::LockClient::builder("redis://127.0.0.1:6379/")
    ///     .deadlock_detection(Duration::from_secs(2))
    ///     .build()?;
    /// let (a, b) = (client.fair_lock("accounts")?, client.fair_lock("ledger")?);
    /// let _accounts = a.lock()?;
    /// match b.lock() {
    ///     Ok(_ledger) => { /* ... */ }
    ///     Err(fairlock::Error::Deadlock { deadlock, .. }) => {
    ///         // another process holds "ledger" and waits for "accounts": drop what this thread
    ///         // holds, then start again
    ///         eprintln!("{} locks in a cycle", deadlock.members.len());
    ///     }
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok::<(), fairlock::Error>(())
    /// ```
    pub fn deadlock_detection(mut self, after: Duration) -> Self {
        self.config.deadlock_detection = Some(after);
        self
    }

    /// Trust the certificate authorities in the PEM file at `path` instead of the system's
    /// roots, for a `rediss://` URL (or `rediss+sentinel://`, `rediss+cluster://`): a private
    /// CA, as self-hosted TLS and some managed services use. Read by [`build`](Self::build).
    ///
    /// ```no_run
    /// let client = fairlock::LockClient::builder("rediss://cache.internal:6380/")
    ///     .tls_ca_file("/etc/ssl/redis-ca.pem")
    ///     .build()?;
    /// # Ok::<(), fairlock::Error>(())
    /// ```
    pub fn tls_ca_file(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.tls.ca = Some(Pem::File(path.into()));
        self
    }

    /// Like [`tls_ca_file`](Self::tls_ca_file), with the PEM text itself.
    pub fn tls_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.ca = Some(Pem::Bytes(pem.into()));
        self
    }

    /// Present this client certificate (chain) and private key, PEM files, to servers that ask
    /// for one (mutual TLS, `tls-auth-clients yes`). Read by [`build`](Self::build).
    pub fn tls_client_cert_files(
        mut self,
        cert: impl Into<std::path::PathBuf>,
        key: impl Into<std::path::PathBuf>,
    ) -> Self {
        self.tls.client = Some((Pem::File(cert.into()), Pem::File(key.into())));
        self
    }

    /// Like [`tls_client_cert_files`](Self::tls_client_cert_files), with the PEM texts.
    pub fn tls_client_cert_pem(
        mut self,
        cert: impl Into<Vec<u8>>,
        key: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.client = Some((Pem::Bytes(cert.into()), Pem::Bytes(key.into())));
        self
    }

    /// Accept a server certificate that does not name the host connected to (it must still be
    /// signed by a trusted CA and be in date). For one node or a Cluster reached by IP address
    /// whose certificates name a host (a Cluster's nodes announce IPs). Off by default: it
    /// lets any server with a certificate from the same CA pose as this one. Through Sentinel
    /// it is not needed when the certificates name the addresses the sentinels announce.
    pub fn danger_accept_invalid_hostnames(mut self, accept: bool) -> Self {
        self.tls.accept_invalid_hostnames = accept;
        self
    }

    /// Ask `provider` for the user name and password of every new connection (the pool's, the
    /// waiting threads', the Sentinel master's and every Cluster node's), instead of taking
    /// them from the URL once: for credentials that expire and rotate, such as ElastiCache IAM
    /// tokens or Azure Entra ID tokens. Connections already open stay logged in. When the
    /// provider fails, the connection is not made and the call fails with
    /// [`Error::PermissionDenied`] carrying the provider's message (which must hold no secret).
    ///
    /// ```no_run
    /// let client = fairlock::LockClient::builder("rediss://my-cache.example.com:6379/")
    ///     .credentials_provider(|| {
    ///         let token = std::fs::read_to_string("/run/secrets/redis-token")?;
    ///         Ok(fairlock::Credentials::new(Some("app"), token.trim()))
    ///     })
    ///     .build()?;
    /// # Ok::<(), fairlock::Error>(())
    /// ```
    pub fn credentials_provider(
        mut self,
        provider: impl Fn() -> std::result::Result<Credentials, CredentialsError>
            + Send
            + Sync
            + 'static,
    ) -> Self {
        self.credentials = Some(Provider(Arc::new(provider)));
        self
    }

    /// Call `callback` (on the watchdog's thread) for every hold of this client that the
    /// watchdog finds lost, once per hold, within a renewal interval of the loss: the same
    /// [`LostHold`](crate::LostHold) that the guard's
    /// [`lost_signal`](crate::LockGuard::lost_signal) receives. Keep it short (it delays the
    /// other renewals); a panic in it is caught and logged.
    ///
    /// ```no_run
    /// let client = fairlock::LockClient::builder("redis://127.0.0.1:6379/")
    ///     .on_lost(|lost| eprintln!("fairlock: {lost}; stopping the writers"))
    ///     .build()?;
    /// # Ok::<(), fairlock::Error>(())
    /// ```
    pub fn on_lost(mut self, callback: impl Fn(&crate::LostHold) + Send + Sync + 'static) -> Self {
        self.on_lost = Some(Arc::new(callback));
        self
    }

    /// With the feature `metrics`: label the acquisition, wait, hold, hand-off, re-entry and
    /// loss metrics with the lock name (`lock`). One series per name, so only for a bounded set
    /// of names. Off by default.
    pub fn metrics_lock_label(mut self, label: bool) -> Self {
        self.config.metrics_lock_label = label;
        self
    }

    /// Accept a server whose `maxmemory-policy` may evict keys (the `volatile-lru` default of
    /// ElastiCache, Memorystore and Azure Cache, say), which [`build`](Self::build) refuses
    /// otherwise. Only for a server whose memory is sized so that it never fills: an evicted
    /// lock key gives the lock a second holder, resets its fencing tokens to the server clock,
    /// or drops a waiter's place. A warning is logged at every check, and [`Config`] shows it.
    pub fn danger_accept_eviction(mut self, accept: bool) -> Self {
        self.config.danger_accept_eviction = accept;
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
        let options = ConnectOptions {
            connect_timeout: c.connect_timeout,
            read_timeout: c.read_timeout,
            failover_timeout: c.failover_timeout,
            tls: self.tls.clone(),
            credentials: self.credentials.clone(),
            accept_eviction: c.danger_accept_eviction,
        };
        let manager = Arc::new(Manager::new(&self.url, &options)?);
        let version = manager.check_server()?;
        let runner = choose_runner(&manager, version)?;
        let cluster = manager.is_cluster();
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
        let watchdog = Watchdog::start(pool.clone(), &id, c.lease, self.on_lost.clone())?;
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

impl LockClient {
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
            tls: TlsSettings::default(),
            credentials: None,
            on_lost: None,
        }
    }

    /// Start configuring a client of the master that the Sentinel group at `sentinels`
    /// (`host:port` or `redis://host:port/` each; `rediss://host:port/` each for TLS to the
    /// sentinels and the data nodes) knows as `master_name`. Every new connection
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
        let tls = sentinels.iter().any(|s| s.starts_with("rediss://"));
        let hosts: Vec<&str> = sentinels
            .iter()
            .map(|s| {
                s.strip_prefix("rediss://")
                    .or_else(|| s.strip_prefix("redis://"))
                    .unwrap_or(s)
                    .trim_end_matches('/')
            })
            .collect();
        let scheme = if tls {
            SENTINEL_TLS_SCHEME
        } else {
            SENTINEL_SCHEME
        };
        Self::builder(&format!("{scheme}{}/{master_name}", hosts.join(",")))
    }

    /// Start configuring a client of the Redis Cluster that `nodes` (`host:port` or
    /// `redis://[user:password@]host:port/` each, `rediss://...` for TLS; some of its nodes,
    /// any role) belong to. The
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
        let tls = nodes.iter().any(|s| s.starts_with("rediss://"));
        let mut credentials = "";
        let hosts: Vec<&str> = nodes
            .iter()
            .map(|s| {
                let node = s
                    .strip_prefix("rediss://")
                    .or_else(|| s.strip_prefix("redis://"))
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
        let scheme = if tls {
            CLUSTER_TLS_SCHEME
        } else {
            CLUSTER_SCHEME
        };
        Self::builder(&format!("{scheme}{credentials}{at}{}/", hosts.join(",")))
    }
}
