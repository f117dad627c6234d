//! [`Manager`]: where connections go (one node, the master a Sentinel group names, or a
//! Redis Cluster), as a URL names it, and how each connection is opened with fairlock's
//! timeouts.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use std::sync::{Arc, OnceLock};

use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::{ConnectionInfo, IntoConnectionInfo};

use super::{Conn, Inner};
use crate::connection::credentials::Provider;
use crate::connection::sentinel::{Connect, Followed, SentinelTarget};
use crate::connection::tls::{Tls, TlsSettings};
use crate::error::{Error, Result};

/// How often a client asks the sentinels which master they name (see
/// [`Manager::follow_master`]).
/// Clients move when they see the switch, so it also bounds how long after each other two
/// clients move (a hold granted by each master meanwhile gives two owners, without replica
/// acknowledgements): one command on a sentinel per interval is cheap.
pub(crate) const MASTER_WATCH_INTERVAL: Duration = Duration::from_millis(200);

/// How long after more than half of the sentinels last named the followed master a new
/// connection goes to it without asking them again (see [`Manager::open`]): five rounds of the
/// master watch, so it is fresh as long as the watch gets its answers.
const AGREEMENT_FRESH: Duration = Duration::from_secs(1);

/// The longest BLPOP through a Sentinel group (see [`Manager::longest_block`]).
const SENTINEL_BLOCK: Duration = Duration::from_secs(1);

/// Where connections go.
pub(super) enum Target {
    /// One node.
    Node(Box<NodeAccess>),
    /// The master that a Sentinel group names, watched (see [`Manager::follow_master`]) and
    /// looked up again for a new connection when the watch has not confirmed it lately (see
    /// [`Manager::open`]).
    Sentinel(Box<SentinelTarget>),
    /// A Redis Cluster: `commands` for the pool, whose connections follow redirects and repeat
    /// a request after a failure (safe: see the scripts' headers); `blocking` for the waker's
    /// BLPOP, which must never be repeated behind our back (its reply, a grant, would be lost
    /// unseen), so any failure or redirect reaches the waker, which re-checks and reconnects.
    /// Made anew for each connection when the credentials come from a provider.
    Cluster(Box<ClusterAccess>),
}

/// How a node is reached: its address and URL credentials, TLS, and a credentials provider.
pub(super) struct NodeAccess {
    info: ConnectionInfo,
    tls: Tls,
    credentials: Option<Provider>,
}

impl NodeAccess {
    /// A client with the credentials of the moment.
    fn client(&self) -> redis::RedisResult<redis::Client> {
        let info = match &self.credentials {
            Some(provider) => provider.apply(self.info.clone())?,
            None => self.info.clone(),
        };
        self.tls.client(info)
    }
}

/// How a Cluster is reached (see [`Target::Cluster`]).
pub(super) struct ClusterAccess {
    nodes: Vec<ConnectionInfo>,
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    tls: Tls,
    credentials: Option<Provider>,
    connect_timeout: Duration,
    read_timeout: Duration,
    /// Made once when the credentials do not change: for the pool, and for the waker.
    fixed: Option<(ClusterClient, ClusterClient)>,
}

impl ClusterAccess {
    /// The redis crate's client, repeating a failed request `retries` times.
    fn build(&self, retries: u32) -> redis::RedisResult<ClusterClient> {
        let nodes = match &self.credentials {
            Some(provider) => self
                .nodes
                .iter()
                .map(|n| provider.apply(n.clone()))
                .collect::<redis::RedisResult<Vec<_>>>()?,
            None => self.nodes.clone(),
        };
        #[allow(unused_mut)]
        let mut builder = ClusterClientBuilder::new(nodes)
            .tcp_settings(super::tcp_settings())
            .connection_timeout(self.connect_timeout)
            .response_timeout(self.read_timeout)
            .retries(retries)
            .min_retry_wait(CLUSTER_RETRY_WAIT_MS.0)
            .retry_wait_formula(CLUSTER_RETRY_WAIT_MS.1, 2)
            .max_retry_wait(CLUSTER_RETRY_WAIT_MS.2);
        #[cfg(feature = "tls")]
        {
            if let Some(certificates) = self.tls.certificates() {
                crate::connection::tls::install_crypto_provider();
                builder = builder.certs(certificates.clone());
            }
            if self.tls.accepts_invalid_hostnames() {
                builder = builder.danger_accept_invalid_hostnames(true);
            }
        }
        builder.build()
    }

    /// A client for the pool (`blocking_use` false) or the waker.
    fn client(&self, blocking_use: bool) -> redis::RedisResult<ClusterClient> {
        let retries = if blocking_use { 0 } else { CLUSTER_RETRIES };
        match &self.fixed {
            Some((commands, blocking)) => {
                Ok(if blocking_use { blocking } else { commands }.clone())
            }
            None => self.build(retries),
        }
    }
}

/// The scheme of a URL that names a Sentinel group: `redis+sentinel://[user:password@]host:port
/// [,host:port...]/<master name>` (the credentials are the master's and its replicas').
pub(crate) const SENTINEL_SCHEME: &str = "redis+sentinel://";

/// The same over TLS, to the sentinels and to the data nodes.
pub(crate) const SENTINEL_TLS_SCHEME: &str = "rediss+sentinel://";

/// The scheme of a URL that names a Redis Cluster by some of its nodes:
/// `redis+cluster://[user:password@]host:port[,host:port...]/`.
pub(crate) const CLUSTER_SCHEME: &str = "redis+cluster://";

/// The same over TLS.
pub(crate) const CLUSTER_TLS_SCHEME: &str = "rediss+cluster://";

/// How a client connects, besides its URL.
#[derive(Clone, Debug, Default)]
pub(crate) struct ConnectOptions {
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
    /// Through a Sentinel group or on a Cluster: how long a call keeps trying while there is
    /// no master.
    pub failover_timeout: Duration,
    pub tls: TlsSettings,
    pub credentials: Option<Provider>,
    /// Accept a server whose `maxmemory-policy` may evict keys (logged at every check).
    pub accept_eviction: bool,
}

/// How often a Cluster connection of the pool follows a redirect or repeats a failed request
/// before the call fails (and `with_pooled` takes over, for the failover timeout).
const CLUSTER_RETRIES: u32 = 5;

/// The pauses between those repeats, in ms: random between the first two numbers, the upper
/// one doubling with each repeat up to the last. The redis crate's default pauses at least
/// 1.28 s, which made a call refused during a slot migration of a few milliseconds come back
/// after a short lease had run out (found by the chaos harness); 5 ms at first, and at most
/// some 300 ms over the five repeats, follow a migration closely. A longer outage (a failover)
/// is `with_pooled`'s, which repeats the call for the failover timeout.
const CLUSTER_RETRY_WAIT_MS: (u64, u64, u64) = (5, 10, 160);

/// Creates connections with a connect timeout, a read and a write timeout.
pub(crate) struct Manager {
    pub(super) target: Target,
    pub(super) connect_timeout: Duration,
    pub(super) read_timeout: Duration,
    /// How long a call keeps trying while there is no master to reach (see `with_pooled`):
    /// zero for one node.
    pub(super) patience: Duration,
    /// Counts the masters a Sentinel group named: a connection of an older generation goes to
    /// a master that was replaced, and is dropped (see [`Manager::follow_master`]).
    pub(super) generation: AtomicU64,
    /// The server refused `INFO` to this user at the first check: the eviction policy is read
    /// with `CONFIG GET` if `config_get_checks`, else not at all (see `checks.rs`).
    pub(super) info_refused: AtomicBool,
    /// `CONFIG GET maxmemory-policy` answered when `INFO` was refused.
    pub(super) config_get_checks: AtomicBool,
    /// Why the eviction policy could not be checked (refused `INFO` and `CONFIG GET`).
    pub(super) skipped_checks: OnceLock<String>,
    /// Accept an evicting `maxmemory-policy` (see [`ConnectOptions::accept_eviction`]).
    pub(super) accept_eviction: bool,
}

impl std::fmt::Debug for Manager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let target = match &self.target {
            Target::Node(_) => "node",
            Target::Sentinel(_) => "sentinel",
            Target::Cluster(_) => "cluster",
        };
        f.debug_struct("Manager").field("target", &target).finish()
    }
}

impl Manager {
    /// `url`: `redis://...` or `rediss://...` (or any URL the redis crate opens) for one
    /// node; `redis+sentinel://[user:password@]host:port[,host:port...]/<master name>` for a
    /// Sentinel group (the credentials are the data nodes'; the sentinels are reached
    /// without); `redis+cluster://[user:password@]host:port[,host:port...]/` for a Redis
    /// Cluster, whose calls ride out a failover for up to `failover_timeout`; `rediss+sentinel`
    /// and `rediss+cluster` for the same over TLS.
    pub fn new(url: &str, options: &ConnectOptions) -> Result<Manager> {
        let invalid = |reason: String| Error::invalid_url(url, reason);
        let tls = options.tls.resolve()?;
        let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
        let uses_tls = scheme.starts_with("rediss");
        if uses_tls && cfg!(not(feature = "tls")) {
            return Err(invalid(
                "a TLS URL needs fairlock's `tls` feature (on by default)".into(),
            ));
        }
        if options.tls.is_set() && !uses_tls {
            return Err(invalid(
                "TLS settings were given for a URL without TLS: use rediss://, rediss+sentinel:// or rediss+cluster://".into(),
            ));
        }
        if crate::redact::has_unencoded_user_info(url) && scheme.contains('+') {
            // a Sentinel's or Cluster's credentials go into a node URL, where a '/', '?' or
            // '#' would make the rest of the password a path, a query or a fragment
            return Err(invalid("the credentials do not parse".into()));
        }
        let node_scheme = if uses_tls { "rediss" } else { "redis" };
        let (target, patience) = match scheme {
            "redis+sentinel" | "rediss+sentinel" => {
                // `[user:password@]`: the credentials of the master and its replicas (the
                // sentinels are reached without), percent-encoded as in a redis:// URL, whose
                // parser decodes them; up to the last '@', so that a password with a '/' is
                // never taken for the master's name (which errors name)
                let (credentials, rest) = match rest.rsplit_once('@') {
                    Some((credentials, rest)) => (format!("{credentials}@"), rest),
                    None => (String::new(), rest),
                };
                let (hosts, name) = rest.split_once('/').unwrap_or((rest, ""));
                let name = name.trim_end_matches('/');
                if name.is_empty() || name.contains('/') {
                    return Err(invalid(format!(
                        "a Sentinel URL ends with the master's name: {scheme}://[user:password@]host:port[,host:port...]/<master name>"
                    )));
                }
                let sentinels: Vec<String> = hosts
                    .split(',')
                    .filter(|h| !h.is_empty())
                    .map(str::to_string)
                    .collect();
                if sentinels.is_empty() {
                    return Err(invalid("no sentinel address".into()));
                }
                // parsed now, so a bad address or credentials fail here, not at the first call
                for host in &sentinels {
                    format!("{node_scheme}://{credentials}{host}/")
                        .into_connection_info()
                        .map_err(|e| invalid(e.to_string()))?;
                }
                let sentinel_tls = tls.clone();
                let connect_sentinel: Connect = Arc::new(move |addr: &str| {
                    sentinel_tls.client(format!("{node_scheme}://{addr}/").into_connection_info()?)
                });
                let node_tls = tls.clone();
                let provider = options.credentials.clone();
                let connect_node: Connect = Arc::new(move |addr: &str| {
                    NodeAccess {
                        info: format!("{node_scheme}://{credentials}{addr}/")
                            .into_connection_info()?,
                        tls: node_tls.clone(),
                        credentials: provider.clone(),
                    }
                    .client()
                });
                let target = SentinelTarget::new(name, sentinels, connect_sentinel, connect_node)
                    .map_err(|e| invalid(e.to_string()))?;
                (Target::Sentinel(Box::new(target)), options.failover_timeout)
            }
            "redis+cluster" | "rediss+cluster" => {
                let rest = rest.trim_end_matches('/');
                // `[user:password@]`: the nodes' credentials, percent-encoded as in a
                // redis:// URL (the redis crate decodes them), the same for every node
                let (credentials, hosts) = match rest.rsplit_once('@') {
                    Some((credentials, hosts)) => (format!("{credentials}@"), hosts),
                    None => (String::new(), rest),
                };
                if hosts.contains('/') {
                    return Err(invalid(format!(
                        "a Cluster URL names nodes only: {scheme}://[user:password@]host:port[,host:port...]/"
                    )));
                }
                let nodes = hosts
                    .split(',')
                    .filter(|h| !h.is_empty())
                    .map(|h| format!("{node_scheme}://{credentials}{h}/").into_connection_info())
                    .collect::<redis::RedisResult<Vec<_>>>()
                    .map_err(|e| invalid(e.to_string()))?;
                if nodes.is_empty() {
                    return Err(invalid("no node address".into()));
                }
                let mut access = ClusterAccess {
                    nodes,
                    tls,
                    credentials: options.credentials.clone(),
                    connect_timeout: options.connect_timeout,
                    read_timeout: options.read_timeout,
                    fixed: None,
                };
                if access.credentials.is_none() {
                    let built = (access.build(CLUSTER_RETRIES), access.build(0));
                    match built {
                        (Ok(commands), Ok(blocking)) => access.fixed = Some((commands, blocking)),
                        (Err(e), _) | (_, Err(e)) => return Err(invalid(e.to_string())),
                    }
                } else {
                    // checked now: the nodes and the TLS settings (not the credentials)
                    access.build(0).map_err(|e| invalid(e.to_string()))?;
                }
                (Target::Cluster(Box::new(access)), options.failover_timeout)
            }
            _ => {
                let info = url
                    .into_connection_info()
                    .map_err(|e| invalid(e.to_string()))?;
                let access = NodeAccess {
                    info,
                    tls,
                    credentials: options.credentials.clone(),
                };
                // checked now: the address and the TLS settings
                if access.credentials.is_none() {
                    access.client().map_err(|e| invalid(e.to_string()))?;
                }
                (Target::Node(Box::new(access)), Duration::ZERO)
            }
        };
        Ok(Manager {
            target,
            connect_timeout: options.connect_timeout,
            read_timeout: options.read_timeout,
            patience,
            generation: AtomicU64::new(0),
            info_refused: AtomicBool::new(false),
            config_get_checks: AtomicBool::new(false),
            skipped_checks: OnceLock::new(),
            accept_eviction: options.accept_eviction,
        })
    }

    /// Whether this is a Redis Cluster's manager.
    pub fn is_cluster(&self) -> bool {
        matches!(self.target, Target::Cluster(_))
    }

    /// Whether this is a Sentinel group's manager, whose master [`Manager::follow_master`]
    /// watches.
    pub fn is_sentinel(&self) -> bool {
        matches!(self.target, Target::Sentinel(_))
    }

    /// Whether `conn` goes to a master the Sentinel group has replaced since it was opened.
    pub fn is_retired(&self, conn: &Conn) -> bool {
        self.is_retired_generation(conn.generation)
    }

    /// Whether a connection opened in master generation `generation` (see
    /// [`Conn::master_generation`]) goes to a replaced master.
    pub fn is_retired_generation(&self, generation: u64) -> bool {
        generation != self.generation.load(Ordering::SeqCst)
    }

    /// The longest a BLPOP may block: through a Sentinel group, short enough that waiting
    /// threads follow a new master soon (a blocking connection to a replaced master is only
    /// dropped when its BLPOP returns).
    pub fn longest_block(&self) -> Duration {
        match self.target {
            Target::Sentinel(_) => SENTINEL_BLOCK,
            _ => Duration::MAX,
        }
    }

    /// Through a Sentinel group: ask the sentinels which master more than half of them name now
    /// (see `sentinel.rs`), and when that is not the one connections go to, retire them all
    /// (pooled ones are dropped when next taken or given back, the waker's when its BLPOP
    /// returns; new ones go to the master the sentinels name). A no-op for one node or a
    /// Cluster.
    ///
    /// Why: in a failover the old master can stay up and writable for seconds after the
    /// sentinels named the new one (after `SENTINEL FAILOVER`, until they make it a replica,
    /// about 8 s later), and a connection that stays with it takes grants that the new master
    /// never sees. Asking here, every [`MASTER_WATCH_INTERVAL`], bounds that to the interval
    /// plus the sentinels' own delay in naming the new master. Each answer that names the
    /// followed master again also confirms it for new connections (see [`Manager::open`]).
    ///
    /// # Errors
    /// [`Error::Connection`] when no master is named by more than half of the sentinels (a
    /// failover under way, sentinels down or unaware of the master): connections stay where
    /// they are.
    pub fn follow_master(&self) -> Result<()> {
        let Target::Sentinel(target) = &self.target else {
            return Ok(());
        };
        // a look first (a command on a kept connection to each sentinel, all at once, until a
        // majority)...
        let agreed = target
            .agreed_master(self.connect_timeout, self.read_timeout)
            .map_err(|e| Error::from_redis("asking the sentinels for the master", e))?;
        if let Some(followed) = target.master.lock().as_mut() {
            if followed.addr == agreed.addr {
                // confirmed: new connections may go to it without asking (see `open`)
                followed.agreed_at = followed.agreed_at.max(agreed.asked);
                return Ok(());
            }
        }
        // ...then the master a new connection would get (through a sentinel that named it, which
        // checks the node's ROLE): connections move only when that changed, so the watch and
        // new connections never disagree
        let (client, addr) = target
            .client_for(&agreed, self.connect_timeout, self.read_timeout)
            .map_err(|e| Error::from_redis("asking the sentinels for the master", e))?;
        self.note_master(target, addr, client, agreed.asked);
        Ok(())
    }

    /// `addr` is the master new connections go to, which more than half of the sentinels named
    /// at `agreed_at`, and `client` a client for it: when it is another one than before, retire
    /// the connections to the old one. Returns the generation of connections to `addr`.
    fn note_master(
        &self,
        target: &SentinelTarget,
        addr: String,
        client: redis::Client,
        agreed_at: Instant,
    ) -> u64 {
        let mut master = target.master.lock();
        if let Some(followed) = master.as_mut().filter(|f| f.addr == addr) {
            followed.agreed_at = followed.agreed_at.max(agreed_at);
            return self.generation.load(Ordering::SeqCst);
        }
        let generation = match master.as_ref() {
            None => self.generation.load(Ordering::SeqCst),
            Some(old) => {
                log::info!(
                    "fairlock: the sentinels name {addr} as master {} now (was {}); connections move there",
                    target.master_name(),
                    old.addr
                );
                self.generation.fetch_add(1, Ordering::SeqCst) + 1
            }
        };
        *master = Some(Followed {
            addr,
            client,
            agreed_at,
        });
        generation
    }

    /// The followed master's client and the generation of connections to it, when more than
    /// half of the sentinels named it less than [`AGREEMENT_FRESH`] ago. Read under the same
    /// lock that `note_master` moves the generation under, so the two belong together.
    fn fresh_master(&self, target: &SentinelTarget) -> Option<(redis::Client, u64)> {
        let master = target.master.lock();
        let followed = master
            .as_ref()
            .filter(|f| f.agreed_at.elapsed() < AGREEMENT_FRESH)?;
        Some((
            followed.client.clone(),
            self.generation.load(Ordering::SeqCst),
        ))
    }

    /// A connection for commands.
    ///
    /// Through a Sentinel group, to the master that more than half of the sentinels name: the
    /// one they named less than [`AGREEMENT_FRESH`] ago (the master watch confirms it every
    /// [`MASTER_WATCH_INTERVAL`]), else the one they name when asked now. Going to the
    /// confirmed one without asking again is no less safe than the connections already open to
    /// it, which stay there until the watch sees a switch; and it spares each new connection
    /// (the pool's, the waker's, the server check's) a round of questions.
    pub fn open(&self) -> redis::RedisResult<Conn> {
        self.open_for(false)
    }

    /// A connection for the waker's BLPOP: on a Cluster, one that never repeats a request or
    /// follows a redirect by itself (see [`Target::Cluster`]).
    pub fn open_blocking(&self) -> redis::RedisResult<Conn> {
        self.open_for(true)
    }

    fn open_for(&self, blocking_use: bool) -> redis::RedisResult<Conn> {
        let mut generation = self.generation.load(Ordering::SeqCst);
        let client = match &self.target {
            Target::Node(access) => access.client()?,
            // the master more than half of the sentinels name (and that says it is one)
            Target::Sentinel(target) => match self.fresh_master(target) {
                Some((client, followed)) => {
                    generation = followed;
                    client
                }
                None => {
                    let agreed = target.agreed_master(self.connect_timeout, self.read_timeout)?;
                    let (client, addr) =
                        target.client_for(&agreed, self.connect_timeout, self.read_timeout)?;
                    generation = self.note_master(target, addr, client.clone(), agreed.asked);
                    client
                }
            },
            Target::Cluster(access) => {
                let inner = access.client(blocking_use)?.get_connection()?;
                inner.set_read_timeout(Some(self.read_timeout))?;
                inner.set_write_timeout(Some(self.read_timeout))?;
                return Ok(Conn {
                    inner: Inner::Cluster(Box::new(inner)),
                    broken: false,
                    dropped: false,
                    generation,
                });
            }
        };
        let inner = client.get_connection_with_timeout(self.connect_timeout)?;
        inner.set_read_timeout(Some(self.read_timeout))?;
        inner.set_write_timeout(Some(self.read_timeout))?;
        Ok(Conn {
            inner: Inner::Node(inner),
            broken: false,
            dropped: false,
            generation,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The target `url` names (no I/O: nothing connects before the first call), or the reason
    /// it was refused.
    fn target_of(url: &str) -> std::result::Result<&'static str, String> {
        let s = Duration::from_secs(1);
        let options = ConnectOptions {
            connect_timeout: s,
            read_timeout: s,
            failover_timeout: s,
            ..ConnectOptions::default()
        };
        match Manager::new(url, &options) {
            Ok(m) => Ok(match m.target {
                Target::Node(_) => "node",
                Target::Sentinel(_) => "sentinel",
                Target::Cluster(_) => "cluster",
            }),
            Err(Error::InvalidUrl { reason, .. }) => Err(reason),
            Err(e) => panic!("{url}: {e:?}"),
        }
    }

    #[test]
    fn each_url_form_names_its_target() {
        for (url, target) in [
            ("redis://127.0.0.1:6379/", "node"),
            ("redis://u:p%40ss@cache.internal:6380/2", "node"),
            (
                "redis+sentinel://10.0.0.1:26379,10.0.0.2:26379/mymaster",
                "sentinel",
            ),
            ("redis+sentinel://u:pw@10.0.0.1:26379/mymaster/", "sentinel"),
            ("redis+cluster://10.0.0.1:7000,10.0.0.2:7000/", "cluster"),
            ("redis+cluster://:pw@10.0.0.1:7000", "cluster"),
        ] {
            assert_eq!(target_of(url), Ok(target), "{url}");
        }
    }

    #[test]
    fn malformed_urls_are_refused_with_the_form_they_need() {
        for (url, says) in [
            (
                "redis+sentinel://10.0.0.1:26379",
                "ends with the master's name",
            ),
            (
                "redis+sentinel://10.0.0.1:26379/a/b",
                "ends with the master's name",
            ),
            ("redis+sentinel:///mymaster", "no sentinel address"),
            ("redis+cluster://10.0.0.1:7000/0", "names nodes only"),
            ("redis+cluster:///", "no node address"),
            ("redis+sentinel://:pa/ss@10.0.0.1:26379/m", "%2F"),
            ("redis+cluster://u:pa?ss@10.0.0.1:7000/", "%3F"),
            ("redis://u:pa/ss@10.0.0.1:6379/", "percent-encoded"),
        ] {
            let reason = target_of(url).expect_err(url);
            assert!(reason.contains(says), "{url}: {reason}");
        }
        for url in [
            "http://127.0.0.1/",
            "redis://127.0.0.1:notaport/",
            "",
            "127.0.0.1:6379",
        ] {
            assert!(target_of(url).is_err(), "{url}");
        }
    }
}
