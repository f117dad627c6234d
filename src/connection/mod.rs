//! Connections: an r2d2 manager over `redis::Client` that applies fairlock's timeouts, to one
//! node, to the master a Sentinel group names, or to a Redis Cluster (the redis crate's
//! `ClusterConnection`, which routes each command by its first key and follows `MOVED` / `ASK`).
//!
//! The redis crate's own r2d2 impl connects without a timeout (a black-holed server would hang
//! for the OS TCP timeout) and cannot tell that a connection whose read timed out is poisoned: the
//! server may still answer the abandoned request later (for a BLPOP: with a grant). Our
//! [`Conn`] is marked broken on any I/O error or timeout, and r2d2 then drops it.

use std::time::Duration;

use redis::cluster::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
};
use redis::{ConnectionLike, Value};

use crate::error::failover_error;

mod checks;
use checks::text_of;
mod cluster_nodes;
pub(crate) mod credentials;
mod manager;
mod pool;
pub(crate) mod sentinel;
pub(crate) mod server_check;
pub(crate) mod tls;

pub(crate) use manager::{
    ConnectOptions, Manager, CLUSTER_SCHEME, CLUSTER_TLS_SCHEME, MASTER_WATCH_INTERVAL,
    SENTINEL_SCHEME, SENTINEL_TLS_SCHEME,
};
pub(crate) use pool::{with_pooled, Pool};

/// The TCP settings of every connection: `TCP_NODELAY` on, as Redis sets it on its side (the
/// redis crate leaves it off). Each request fairlock sends is one write, answered before the
/// next, so Nagle's algorithm would rarely hold one back; a TLS record split over two writes,
/// or a pipeline written in parts, would wait for the server's delayed ACK (up to 40 ms on
/// Linux).
fn tcp_settings() -> redis::io::tcp::TcpSettings {
    redis::io::tcp::TcpSettings::default().set_nodelay(true)
}

/// A pooled connection that remembers whether it is still trustworthy.
pub(crate) struct Conn {
    inner: Inner,
    broken: bool,
    dropped: bool,
    /// The master generation it was opened in (see [`Manager::follow_master`]).
    generation: u64,
}

/// One node's connection, or a Cluster's (a connection to each node it routes to).
enum Inner {
    Node(redis::Connection),
    Cluster(Box<ClusterConnection>),
}

impl Inner {
    fn as_like(&mut self) -> &mut dyn ConnectionLike {
        match self {
            Inner::Node(c) => c,
            Inner::Cluster(c) => c,
        }
    }

    fn as_ref_like(&self) -> &dyn ConnectionLike {
        match self {
            Inner::Node(c) => c,
            Inner::Cluster(c) => c,
        }
    }
}

impl Conn {
    /// Run a command; any connection-level failure poisons the connection.
    pub fn query<T: redis::FromRedisValue>(&mut self, cmd: &redis::Cmd) -> redis::RedisResult<T> {
        cmd.query(self)
    }

    /// Run `cmd` on the node that serves `key` (on a Cluster: `CLIENT ...` and `WAIT` name no
    /// key, and would go to any node); elsewhere the same as [`Conn::query`].
    pub fn query_at<T: redis::FromRedisValue>(
        &mut self,
        key: &str,
        cmd: &redis::Cmd,
    ) -> redis::RedisResult<T> {
        match &mut self.inner {
            Inner::Node(_) => self.query(cmd),
            Inner::Cluster(c) => {
                let route = Route::with_key(key, SlotAddr::Master);
                let result = c.route_command(
                    cmd,
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
                );
                self.note(&result);
                redis::FromRedisValue::from_redis_value(result?.extract_error()?)
                    .map_err(redis::RedisError::from)
            }
        }
    }

    /// Run `cmd` on every master (one node, or each master of a Cluster): each one's reply.
    pub fn query_masters(&mut self, cmd: &redis::Cmd) -> redis::RedisResult<Vec<(String, Value)>> {
        match &mut self.inner {
            Inner::Node(_) => Ok(vec![(String::new(), self.query(cmd)?)]),
            Inner::Cluster(c) => {
                let result = c.route_command(
                    cmd,
                    RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None)),
                );
                self.note(&result);
                match result? {
                    Value::Map(pairs) => Ok(pairs
                        .into_iter()
                        .map(|(node, v)| (text_of(&node), v))
                        .collect()),
                    other => Ok(vec![(String::new(), other)]),
                }
            }
        }
    }

    /// Every key that matches `pattern` on every master (one node, or each master of a
    /// Cluster, one after the other), each passed to `each` as the server wrote it (a key may
    /// come twice: `SCAN` promises only that a key present for the whole scan comes at least
    /// once). `SCAN cursor MATCH pattern COUNT count` on each node until its cursor is back at
    /// 0: each call looks at about `count` keys of the node, matching or not, so a node with N
    /// keys takes about N / `count` calls whatever matches. Never `KEYS`.
    ///
    /// On a Cluster a `SCAN` call that fails is repeated by the redis crate with the same cursor
    /// (it only reads); a slot that moves during the scan may have its keys missed or seen twice.
    pub fn scan_masters(
        &mut self,
        pattern: &str,
        count: u32,
        mut each: impl FnMut(&[u8]),
    ) -> redis::RedisResult<Scanned> {
        let nodes: Vec<Option<(String, u16)>> = match &self.inner {
            Inner::Node(_) => vec![None],
            // the masters of the crate's slot map (PING goes to each; its reply names them)
            Inner::Cluster(_) => self
                .query_masters(&redis::cmd("PING"))?
                .into_iter()
                .map(|(node, _)| match node.rsplit_once(':') {
                    Some((host, port)) => port
                        .parse()
                        .map(|port| Some((host.to_string(), port)))
                        .map_err(|_| unexpected_reply("a node address", &node)),
                    None => Err(unexpected_reply("a node address", &node)),
                })
                .collect::<redis::RedisResult<_>>()?,
        };
        let mut scanned = Scanned {
            masters: nodes.len(),
            calls: 0,
        };
        for node in &nodes {
            let mut cursor = 0_u64;
            loop {
                let mut cmd = redis::cmd("SCAN");
                cmd.arg(cursor)
                    .arg("MATCH")
                    .arg(pattern)
                    .arg("COUNT")
                    .arg(count);
                let (next, keys): (u64, Vec<Vec<u8>>) = match (node, &mut self.inner) {
                    (Some((host, port)), Inner::Cluster(c)) => {
                        let result = c.route_command(
                            &cmd,
                            RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                                host: host.clone(),
                                port: *port,
                            }),
                        );
                        self.note(&result);
                        redis::FromRedisValue::from_redis_value(result?.extract_error()?)?
                    }
                    _ => self.query(&cmd)?,
                };
                scanned.calls += 1;
                for key in &keys {
                    each(key);
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok(scanned)
    }

    /// The master generation this connection was opened in (see [`Manager::is_retired`]).
    pub fn master_generation(&self) -> u64 {
        self.generation
    }

    /// Whether this is a Cluster's connection (which cannot pipeline calls of different slots).
    pub fn is_cluster(&self) -> bool {
        matches!(self.inner, Inner::Cluster(_))
    }

    pub fn set_read_timeout(&mut self, timeout: Duration) {
        let set = match &self.inner {
            Inner::Node(c) => c.set_read_timeout(Some(timeout)),
            Inner::Cluster(c) => c.set_read_timeout(Some(timeout)),
        };
        if set.is_err() {
            self.broken = true;
        }
    }

    /// True when the last failure was the server closing the connection (as after a restart),
    /// as opposed to a timeout or refusal: then the same request may go again on a fresh one.
    pub fn was_dropped(&self) -> bool {
        self.dropped
    }

    /// Load a script or the function library (`cmd`) on every master of a Cluster: those of the
    /// crate's slot map, where it would route the load, and those `CLUSTER NODES` lists that the
    /// map lacks. A master that owns no slot yet (a shard being added) is in no slot map, and a
    /// map refreshed during a resharding may come from a node not yet told of the move; a call
    /// that reaches such a master (through `ASK`, or `MOVED`) would find the script missing
    /// again after the load. The extra loads are best effort: their failures are left to the
    /// next call that reaches the node. Returns the reply of one master of the slot map.
    fn load_on_every_master(&mut self, cmd: &redis::Cmd) -> redis::RedisResult<Value> {
        let mut reply = None;
        let mut loaded = std::collections::HashSet::new();
        for (node, value) in self.query_masters(cmd)? {
            let value = value.extract_error()?;
            loaded.insert(node);
            reply.get_or_insert(value);
        }
        let listed = self
            .query::<String>(redis::cmd("CLUSTER").arg("NODES"))
            .map(|text| cluster_nodes::masters(&text))
            .unwrap_or_default();
        if let Inner::Cluster(c) = &mut self.inner {
            for (host, port) in listed {
                if loaded.contains(&format!("{host}:{port}")) {
                    continue;
                }
                let route = SingleNodeRoutingInfo::ByAddress { host, port };
                if let Err(e) = c.route_command(cmd, RoutingInfo::SingleNode(route)) {
                    log::debug!("fairlock: loading scripts on a master outside the slot map: {e}");
                }
            }
        }
        reply.ok_or_else(|| unexpected_reply("a reply from a master", "none"))
    }

    fn note<T>(&mut self, result: &redis::RedisResult<T>) {
        if let Err(e) = result {
            if is_connection_error(e) {
                self.broken = true;
                self.dropped = is_server_gone(e);
            } else if failover_error(e).is_some() {
                // a demoted master: this connection leads nowhere now, a fresh one finds the new
                // master (through the sentinels)
                self.broken = true;
                self.dropped = true;
            }
        }
    }
}

/// Every request of fairlock (the raw layer's calls included) goes through `note`.
impl redis::ConnectionLike for Conn {
    fn req_packed_command(&mut self, cmd: &[u8]) -> redis::RedisResult<redis::Value> {
        let result = self.inner.as_like().req_packed_command(cmd);
        self.note(&result);
        result
    }

    fn req_command(&mut self, cmd: &redis::Cmd) -> redis::RedisResult<redis::Value> {
        if self.is_cluster() && is_load(cmd) {
            return self.load_on_every_master(cmd);
        }
        // a Cluster routes a command by its key (its packed bytes alone would be parsed again)
        let result = self.inner.as_like().req_command(cmd);
        self.note(&result);
        result
    }

    fn supports_pipelining(&self) -> bool {
        self.inner.as_ref_like().supports_pipelining()
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> redis::RedisResult<Vec<redis::Value>> {
        let result = self.inner.as_like().req_packed_commands(cmd, offset, count);
        self.note(&result);
        result
    }

    fn get_db(&self) -> i64 {
        self.inner.as_ref_like().get_db()
    }

    fn check_connection(&mut self) -> bool {
        self.inner.as_like().check_connection()
    }

    fn is_open(&self) -> bool {
        !self.broken && self.inner.as_ref_like().is_open()
    }
}

/// What [`Conn::scan_masters`] did: on how many masters, with how many `SCAN` calls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Scanned {
    pub masters: usize,
    pub calls: u64,
}

/// Whether `cmd` loads a script or the function library (`SCRIPT LOAD`, `FUNCTION LOAD`).
fn is_load(cmd: &redis::Cmd) -> bool {
    let mut args = cmd.args_iter().map(|arg| match arg {
        redis::Arg::Simple(bytes) => bytes,
        _ => &[],
    });
    let (first, second) = (args.next(), args.next());
    first.is_some_and(|a| a.eq_ignore_ascii_case(b"SCRIPT") || a.eq_ignore_ascii_case(b"FUNCTION"))
        && second.is_some_and(|a| a.eq_ignore_ascii_case(b"LOAD"))
}

fn unexpected_reply(what: &str, got: &str) -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::UnexpectedReturnType,
        "unexpected reply",
        format!("expected {what}, got {got:?}"),
    ))
}

/// Whether an error says the server went away or moved (closed, reset, refused, or a failover
/// under way) rather than that it failed to answer: the same request may go again on a fresh
/// connection, without that counting as a failure.
pub(crate) fn is_server_gone(e: &redis::RedisError) -> bool {
    e.is_connection_dropped()
        || e.is_connection_refusal()
        || (e.is_unrecoverable_error() && !e.is_timeout())
        || failover_error(e).is_some()
}

/// Whether `e` is a read interrupted by a signal (EINTR): the process was stopped and continued
/// (Ctrl-Z and `fg`, a debugger, a cgroup freeze). The reply may be lost with the connection, but
/// the server is fine: not a failure.
pub(crate) fn is_interrupted(e: &redis::RedisError) -> bool {
    // The crate keeps the io::Error behind an Arc that `source()` does not lead into, so its
    // text tells: the OS's "Interrupted system call (os error 4)", or the kind's own text.
    if !e.is_io_error() {
        return false;
    }
    let text = e.to_string();
    text.contains("(os error 4)") || text.contains("operation interrupted")
}

/// Whether the server refused a command as unknown or disabled (`rename-command CLIENT ""`).
pub(crate) fn is_refused_command(e: &redis::RedisError) -> bool {
    e.code().is_some_and(|c| c == "ERR")
        && e.to_string()
            .to_ascii_lowercase()
            .contains("unknown command")
}

pub(crate) fn is_connection_error(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal()
}
