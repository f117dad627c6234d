//! The Redis of a chaos run in the Sentinel and Cluster modes (`support::topology`): a Sentinel
//! group (a master, 2 replicas, 3 sentinels) or a Redis Cluster (3 masters with a replica each),
//! and the steps of the faults that change a master.
//!
//! No TCP proxy here: the clients learn the nodes' addresses from the sentinels or from the
//! cluster's slot map and connect to those, so a proxy in front of one address would be
//! bypassed (and the addresses the topology announces are the nodes' own). The network faults,
//! late deliveries and force-unlocks with a lost reply (all made by the proxy) stay the
//! single-node mode's, as do the clock steps (they need its stepped server).
//!
//! What a promoted replica had: a replica receives nothing more once its master died and takes
//! no writes until it is promoted (at least a second later here: `down-after-milliseconds` and
//! `cluster-node-timeout` are 1000), so its data, read once it saw its link go down, is what the
//! new master starts from. [`snapshot_fences`] reads each lock's fencing counter there: a grant
//! of the old master with a greater token never reached the new master.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::{Connection, Value};

use crate::support::topology::{client_for, tls_ca, RedisCluster, SentinelGroup, MASTER_NAME};
use crate::support::unix_micros;

/// Where the locks live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deployment {
    /// One redis-server behind the harness's TCP proxy.
    Single,
    /// A Sentinel group; workers connect with `redis+sentinel://.../mymaster`.
    Sentinel,
    /// A Sentinel group that speaks TLS only (clients, replication, the sentinels' own
    /// connections); workers connect with `rediss+sentinel://.../mymaster`.
    SentinelTls,
    /// A Redis Cluster; workers connect with `redis+cluster://...`.
    Cluster,
}

impl Deployment {
    pub fn name(self) -> &'static str {
        match self {
            Deployment::Single => "single",
            Deployment::Sentinel => "sentinel",
            Deployment::SentinelTls => "sentinel-tls",
            Deployment::Cluster => "cluster",
        }
    }
}

pub enum Topology {
    Sentinel(SentinelGroup),
    Cluster(RedisCluster),
}

/// How long a failover may take before the run gives up (and fails with the nodes' logs).
const FAILOVER_LIMIT: Duration = Duration::from_secs(60);
/// How long a failed master's replica may take to see its link go down.
const LINK_DOWN_LIMIT: Duration = Duration::from_secs(3);

impl Topology {
    /// Start a settled topology (panics for [`Deployment::Single`]).
    pub fn start(d: Deployment) -> Topology {
        match d {
            Deployment::Single => panic!("one node is no topology"),
            Deployment::Sentinel => Topology::Sentinel(SentinelGroup::start()),
            Deployment::SentinelTls => {
                let certs = crate::chaos::tls_support::certs();
                crate::chaos::tls_support::install_provider();
                Topology::Sentinel(SentinelGroup::start_tls([
                    &certs.server.0,
                    &certs.server.1,
                    &certs.ca,
                ]))
            }
            Deployment::Cluster => Topology::Cluster(RedisCluster::start()),
        }
    }

    /// The URL the workers' clients connect with.
    pub fn worker_url(&self) -> String {
        let hosts = |ports: Vec<u16>| {
            ports
                .iter()
                .map(|p| format!("127.0.0.1:{p}"))
                .collect::<Vec<_>>()
                .join(",")
        };
        match self {
            Topology::Sentinel(g) => {
                let scheme = if self.tls_ca().is_some() {
                    "rediss+sentinel"
                } else {
                    "redis+sentinel"
                };
                format!("{scheme}://{}/{MASTER_NAME}", hosts(g.sentinel_ports()))
            }
            Topology::Cluster(c) => format!("redis+cluster://{}/", hosts(c.node_ports())),
        }
    }

    /// The CA the workers must trust, when the topology speaks TLS.
    pub fn tls_ca(&self) -> Option<std::path::PathBuf> {
        match self {
            Topology::Sentinel(g) => tls_ca(g.sentinel_ports()[0]),
            Topology::Cluster(_) => None,
        }
    }

    /// The lock names of a run: `wanted` as they are, except in a Cluster, where a name whose
    /// slot a master already serves for an earlier name is replaced by the first of `name-1`,
    /// `name-2`, ... on another master, so every shard the locks use sees load.
    pub fn lock_names(&self, wanted: &[&str]) -> Vec<String> {
        let Topology::Cluster(c) = self else {
            return wanted.iter().map(|s| s.to_string()).collect();
        };
        let master_of = |n: &str| c.master_for_slot(c.slot_of(&lock_key(n)));
        let mut names: Vec<String> = Vec::new();
        let mut used: Vec<u16> = Vec::new();
        for w in wanted {
            let name = std::iter::once(w.to_string())
                .chain((1..1000).map(|i| format!("{w}-{i}")))
                .find(|n| !used.contains(&master_of(n)))
                .unwrap_or_else(|| w.to_string());
            used.push(master_of(&name));
            names.push(name);
        }
        names
    }

    /// The master of `lock` now, or `None` when nobody answers (a failover under way): never
    /// waits, never panics (the harness asks while faults run).
    pub fn master_of(&self, lock: &str) -> Option<u16> {
        match self {
            Topology::Sentinel(g) => g.sentinel_ports().into_iter().find_map(|p| {
                let mut c = try_conn(p)?;
                let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg(MASTER_NAME)
                    .query(&mut c)
                    .ok()?;
                addr.map(|a| a.1)
            }),
            Topology::Cluster(c) => {
                let slot = key_slot(&lock_key(lock));
                c.node_ports().into_iter().find_map(|p| {
                    let mut conn = try_conn(p)?;
                    let slots: Value = redis::cmd("CLUSTER").arg("SLOTS").query(&mut conn).ok()?;
                    slot_owner(&slots, slot)
                })
            }
        }
    }

    /// A connection to the master of `lock` now (see [`Topology::master_of`]).
    pub fn conn_for(&self, lock: &str) -> Option<Connection> {
        try_conn(self.master_of(lock)?)
    }

    /// The masters of a settled topology (waits for the nodes to agree; at the end of a run).
    /// Sentinel mode: stop one sentinel (SIGSTOP) until the returned guard is dropped.
    pub fn freeze_a_sentinel(
        &self,
        pick: usize,
    ) -> Option<(u16, crate::support::topology::Frozen)> {
        let Topology::Sentinel(g) = self else {
            return None;
        };
        let ports = g.sentinel_ports();
        let port = ports[pick % ports.len()];
        Some((port, g.freeze_sentinel(port)))
    }

    /// Sentinel mode: wait (30 s at most) until the sentinels agree and see their master up
    /// again, so the next fault starts from a settled group; whether they did.
    pub fn settle_sentinels(&self) -> bool {
        match self {
            Topology::Sentinel(g) => g.wait_for_sentinels_settled(FAILOVER_LIMIT),
            Topology::Cluster(_) => true,
        }
    }

    /// Cluster mode: migrate the slot of `lock` to another master; (from, to).
    pub fn migrate_lock(&self, lock: &str) -> Option<(u16, u16)> {
        let Topology::Cluster(c) = self else {
            return None;
        };
        let key = lock_key(lock);
        let slot = c.slot_of(&key);
        let from = c.master_for_slot(slot);
        let to = *c.master_ports().iter().find(|&&p| p != from)?;
        c.migrate_slot(slot, to);
        Some((from, to))
    }

    pub fn master_ports(&self) -> Vec<u16> {
        match self {
            Topology::Sentinel(g) => vec![g.master_port()],
            Topology::Cluster(c) => c.master_ports(),
        }
    }

    /// The master of `lock` and its replicas, in a settled topology.
    pub fn master_and_replicas(&self, lock: &str) -> (u16, Vec<u16>) {
        match self {
            Topology::Sentinel(g) => (g.master_port(), g.replica_ports()),
            Topology::Cluster(c) => {
                let master = c.master_for_slot(c.slot_of(&lock_key(lock)));
                (master, c.replicas_of(master))
            }
        }
    }

    /// The locks among `locks` that the master on `port` serves (settled topology).
    pub fn locks_served_by(&self, port: u16, locks: &[String]) -> Vec<String> {
        locks
            .iter()
            .filter(|l| self.master_and_replicas(l).0 == port)
            .cloned()
            .collect()
    }

    /// SIGKILL the master on `port`.
    pub fn kill(&mut self, port: u16) {
        match self {
            Topology::Sentinel(g) => g.kill_node(port),
            Topology::Cluster(c) => c.kill(port),
        }
    }

    /// Wait until a replica replaced the killed master `old` (and the topology agrees on it);
    /// returns its port.
    pub fn wait_for_new_master(&self, old: u16) -> u16 {
        match self {
            Topology::Sentinel(g) => g.wait_for_new_master(old, FAILOVER_LIMIT),
            Topology::Cluster(c) => c.wait_for_failover(old, FAILOVER_LIMIT),
        }
    }

    /// Start the killed node on `port` again and wait until it is a linked replica.
    pub fn restart(&mut self, port: u16) {
        match self {
            Topology::Sentinel(g) => g.restart_node(port),
            Topology::Cluster(c) => c.restart(port),
        }
    }

    /// A graceful failover of the master of `lock`, until the old master is a linked replica
    /// again; returns the old master, the new one, and how long after the start the topology
    /// named the new one (Sentinel: the sentinels' switch, about 10 s before they make the old
    /// master a replica; Cluster: the slots moved, after which the old master redirects).
    ///
    /// Sentinel also returns the promotion: when a replica first said `role:master` and the
    /// fencing counter of each of `locks` it had then (see [`watch_promotion`]).
    pub fn graceful_failover(&self, lock: &str, locks: &[String]) -> GracefulFailover {
        let started = Instant::now();
        match self {
            Topology::Sentinel(g) => {
                let old = g.master_port();
                let promotion = watch_promotion(g.replica_ports(), locks.to_vec());
                let new = g.failover();
                let switched = started.elapsed();
                let promoted = promotion.join().expect("the promotion watch panicked");
                // until the sentinels convert it, the old master is a master too, and takes
                // the writes of the clients still connected to it
                g.wait_for_replicas(Duration::from_secs(40));
                GracefulFailover {
                    old,
                    new,
                    switched,
                    promoted: promoted.filter(|p| p.port == new),
                }
            }
            Topology::Cluster(c) => {
                let (master, replicas) = self.master_and_replicas(lock);
                let replica = *replicas
                    .first()
                    .unwrap_or_else(|| panic!("the master {master} has no replica"));
                let old = c.failover_to(replica);
                GracefulFailover {
                    old,
                    new: replica,
                    switched: started.elapsed(),
                    promoted: None,
                }
            }
        }
    }
}

/// What [`Topology::graceful_failover`] did.
pub struct GracefulFailover {
    pub old: u16,
    pub new: u16,
    /// From the start until the topology named the new master.
    pub switched: Duration,
    /// Sentinel: the promotion as [`watch_promotion`] saw it.
    pub promoted: Option<Promotion>,
}

/// A replica seen promoted (see [`watch_roles`]).
pub struct Promotion {
    pub port: u16,
    /// The wall clock then, in µs (the scale of fencing tokens).
    pub unix_us: u64,
    /// Each lock's fencing counter on it then.
    pub fences: Fences,
}

/// Watch `replicas` (every 2 ms, up to 30 s) until one says `role:master`, and read each of
/// `locks`' fencing counter on it at once. In a `SENTINEL FAILOVER` the promoted replica takes
/// no more replication from the old master from that moment, and no client writes to it before
/// a sentinel names it, which takes the sentinels hundreds of ms more: what is read is what
/// the new master got from the old one. A grant of the old master with a greater token never
/// reached it (the old master stays writable until the sentinels convert it, seconds later).
fn watch_promotion(
    replicas: Vec<u16>,
    locks: Vec<String>,
) -> std::thread::JoinHandle<Option<Promotion>> {
    let never = Arc::new(AtomicBool::new(false));
    std::thread::spawn(move || {
        watch_roles(&replicas, &locks, Duration::from_secs(30), &never, |seen| {
            seen.is_master
        })
    })
}

/// Watch the Sentinel group's data nodes `nodes` (every 2 ms, until `stop` is set) for a node
/// that says `role:master` while another of them still does: two masters at once. Sentinel
/// does that on its own: a master promoted moments ago that stalls for the
/// `down-after-milliseconds` (busy with a replica's full sync on this 2-core machine) is failed
/// over in turn, and stays a writable master until the sentinels convert it, seconds later. Its
/// grants then never reach the new master, and clients that follow the sentinels' switch
/// before others are granted the same lock by the new one: the split of a `SENTINEL
/// FAILOVER`. The first such promotion is returned, with each of `locks`' fencing counter on
/// the new master the moment it was seen (everything it had from the old one).
pub fn watch_promotions(
    nodes: Vec<u16>,
    locks: Vec<String>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Option<Promotion>> {
    std::thread::spawn(move || {
        // a node that was a master when the watch began is no promotion
        watch_roles(&nodes, &locks, Duration::from_secs(60), &stop, |seen| {
            seen.is_master && seen.was_master == Some(false) && seen.other_master
        })
    })
}

/// One look at a node's `ROLE` by [`watch_roles`].
struct Seen {
    is_master: bool,
    /// What it said at the look before (`None`: the first answer).
    was_master: Option<bool>,
    /// Whether another of the nodes said `role:master` at its last answer.
    other_master: bool,
}

/// Ask each of `nodes` its `ROLE` every 2 ms, until `limit` passed or `stop` is set, and return
/// the first node whose answer `promoted` takes for a promotion, with each of `locks`' fencing
/// counter on it then. Reads time out after 100 ms, so a stalled node does not hold up the look
/// at the others (it keeps what it said last); a node whose connection failed is asked again
/// on a new one (a promotion kills the node's client connections).
fn watch_roles(
    nodes: &[u16],
    locks: &[String],
    limit: Duration,
    stop: &AtomicBool,
    promoted: impl Fn(&Seen) -> bool,
) -> Option<Promotion> {
    let deadline = Instant::now() + limit;
    let quick = |port: u16| {
        let c = try_conn(port)?;
        c.set_read_timeout(Some(Duration::from_millis(100))).ok()?;
        Some(c)
    };
    let mut conns: Vec<(u16, Option<Connection>)> = nodes.iter().map(|&p| (p, quick(p))).collect();
    let mut master: HashMap<u16, bool> = HashMap::new();
    while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
        for (port, conn) in conns.iter_mut() {
            let port = *port;
            if conn.is_none() {
                *conn = quick(port);
            }
            let Some(c) = conn.as_mut() else { continue };
            let is_master = match redis::cmd("ROLE").query::<Vec<Value>>(c) {
                Ok(r) => matches!(r.first(), Some(Value::BulkString(b)) if b == b"master"),
                Err(_) => {
                    *conn = None;
                    continue;
                }
            };
            let was_master = master.insert(port, is_master);
            let other_master = master.iter().any(|(p, m)| *p != port && *m);
            let seen = Seen {
                is_master,
                was_master,
                other_master,
            };
            if promoted(&seen) {
                let unix_us = unix_micros();
                c.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
                let fences = read_fences(c, locks)?;
                return Some(Promotion {
                    port,
                    unix_us,
                    fences,
                });
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    None
}

/// `fairlock:{name}`: the lock's hash, whose hash tag all its keys share.
pub fn lock_key(name: &str) -> String {
    format!("fairlock:{{{name}}}")
}

/// Each lock's fencing counter on one node.
pub type Fences = Vec<(String, u64)>;

/// The fencing counter of each of `locks` on the replica on `port`, read once the replica saw
/// its link to the (killed) master go down, so that nothing more can reach it (see the module
/// doc); 0 for a lock without one. `None` when the link did not go down within 3 s or the
/// replica did not answer.
pub fn snapshot_fences(port: u16, locks: &[String], cluster: bool) -> Option<Fences> {
    let deadline = Instant::now() + LINK_DOWN_LIMIT;
    loop {
        let link = try_conn(port).and_then(|mut c| {
            let info: String = redis::cmd("INFO").arg("replication").query(&mut c).ok()?;
            info.lines()
                .find_map(|l| l.strip_prefix("master_link_status:"))
                .map(|v| v.trim().to_string())
        });
        if link.as_deref() == Some("down") {
            break;
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut c = try_conn(port)?;
    if cluster {
        // a Cluster replica serves reads of its master's slots only after READONLY
        redis::cmd("READONLY").query::<()>(&mut c).ok()?;
    }
    read_fences(&mut c, locks)
}

/// The fencing counter of each of `locks` on `c`'s node (0 for a lock without one); `None`
/// when the node did not answer.
fn read_fences(c: &mut Connection, locks: &[String]) -> Option<Fences> {
    locks
        .iter()
        .map(|l| {
            // the mutex's fence and the semaphore's (the `sem` and `rw` workloads): a name is
            // used as one or the other in a run, so the greater is the one in use
            let mut fence = 0;
            for key in [
                format!("{}:fence", lock_key(l)),
                format!("{}:sem:fence", lock_key(l)),
            ] {
                let v: Option<u64> = redis::cmd("GET").arg(key).query(c).ok()?;
                fence = fence.max(v.unwrap_or(0));
            }
            Some((l.clone(), fence))
        })
        .collect()
}

/// A connection with short timeouts; `None` when the node does not answer.
pub fn try_conn(port: u16) -> Option<Connection> {
    let c = client_for(port)
        .ok()?
        .get_connection_with_timeout(Duration::from_millis(500))
        .ok()?;
    c.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    c.set_write_timeout(Some(Duration::from_secs(2))).ok()?;
    Some(c)
}

/// The port of the master that serves `slot` in a `CLUSTER SLOTS` reply.
fn slot_owner(reply: &Value, slot: u16) -> Option<u16> {
    let Value::Array(ranges) = reply else {
        return None;
    };
    let int = |v: &Value| match v {
        Value::Int(n) => Some(*n),
        _ => None,
    };
    ranges.iter().find_map(|r| {
        let Value::Array(r) = r else { return None };
        let (first, last) = (int(r.first()?)?, int(r.get(1)?)?);
        if !(first..=last).contains(&i64::from(slot)) {
            return None;
        }
        let Value::Array(master) = r.get(2)? else {
            return None;
        };
        u16::try_from(int(master.get(1)?)?).ok()
    })
}

/// The hash slot of `key` (CRC16/XMODEM of its hash tag, as Redis Cluster computes it).
pub fn key_slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes.iter().position(|&b| b == b'{').and_then(|open| {
        let close = bytes[open + 1..].iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &bytes[open + 1..open + 1 + close])
    });
    let mut crc: u16 = 0;
    for &b in tagged.unwrap_or(bytes) {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

/// Lock name -> slot, for the run's report.
pub fn slots_of(locks: &[String]) -> HashMap<String, u16> {
    locks
        .iter()
        .map(|l| (l.clone(), key_slot(&lock_key(l))))
        .collect()
}
