//! Real Redis topologies on loopback for tests: a Sentinel group ([`SentinelGroup`]: a master, 2
//! replicas and 3 sentinels) and a Redis Cluster ([`RedisCluster`]: 3 masters with a replica each).
//!
//! Every process is a real `redis-server` on a free loopback port
//! ([`free_port_with`](super::free_port_with), with its TLS and bus ports) with its own dir,
//! config file and log under the topology's temp dir; dropping the topology kills every
//! process it started (and a panic on the way, in `start` too, drops what was started so far).
//! Every wait has a deadline and panics naming what did not happen, the state it saw last and
//! the tail of the log files of the processes concerned.
//!
//! Timings to expect on loopback (sentinel `down-after-milliseconds` 1000, cluster
//! `cluster-node-timeout` 1000): a sentinel failover after a SIGKILL takes about 3 to 6 s (the
//! down detection, a vote, the promotion, then the other replica's reconfiguration before the
//! sentinels switch their answer), a cluster failover about 2 to 4 s.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use redis::{Connection, FromRedisValue, RedisResult, Value};
use tempfile::TempDir;

use super::{free_port_with, Proc, CLUSTER_BUS_OFFSET};

/// The name the sentinels monitor the master under.
pub const MASTER_NAME: &str = "mymaster";

/// How long a process may take to answer after it was started.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a whole topology may take to settle after its processes answer.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the views of a settled topology may take to agree (sentinels on the master,
/// cluster nodes on the slots) when a method needs that answer.
const AGREE_TIMEOUT: Duration = Duration::from_secs(10);
/// Between two checks of a wait: often enough to time failovers to 50 ms, rarely enough not to
/// load 2 cores with connections.
const POLL: Duration = Duration::from_millis(50);
/// Log lines shown per process when a wait fails.
const LOG_TAIL: usize = 40;

/// The role a node reports (`ROLE`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    Master,
    /// `connected`: the replication link is up (state `connected`).
    Replica {
        master_port: u16,
        connected: bool,
    },
    Sentinel,
}

/// A Sentinel group: 1 master and 2 replicas (`replicaof`), monitored by 3 sentinels under
/// [`MASTER_NAME`] with quorum 2, `down-after-milliseconds` 1000, `failover-timeout` 5000 and
/// `parallel-syncs` 2. No persistence (`save ""`, no AOF): a restarted node starts empty and
/// syncs from the master.
pub struct SentinelGroup {
    /// The data nodes: the first master, then the replicas (whichever is master now).
    nodes: Vec<Node>,
    sentinels: Vec<Node>,
    /// Last: removed after the processes above were killed.
    dir: TempDir,
}

impl SentinelGroup {
    /// Start the group and wait (up to 30 s after the processes answer) until both replicas
    /// report `master_link_status:up` and every sentinel knows the master, both replicas (not
    /// down) and the 2 other sentinels.
    pub fn start() -> SentinelGroup {
        SentinelGroup::start_with("")
    }

    /// [`SentinelGroup::start`], with `master_conf` added to the first master's config file
    /// (e.g. `rename-command REPLICAOF ""`, so that the sentinels can never make it a replica).
    pub fn start_with(master_conf: &str) -> SentinelGroup {
        Self::start_inner(master_conf, None)
    }

    /// [`SentinelGroup::start`] with every node and sentinel speaking TLS only, on its port,
    /// with `files` (certificate, key, CA): clients, replication and the sentinels' own
    /// connections (`tls-replication yes`). The harness's connections to them are TLS too.
    pub fn start_tls(files: [&Path; 3]) -> SentinelGroup {
        Self::start_inner("", Some(files.map(Path::to_path_buf)))
    }

    fn start_inner(master_conf: &str, tls: Option<[PathBuf; 3]>) -> SentinelGroup {
        let tls_conf = |port: u16| match &tls {
            Some(files) => serve_tls(port, files),
            None => String::new(),
        };
        let dir = tempdir("fairlock-sentinel-");
        let root = dir.path().to_path_buf();
        // pushed one by one: a panic drops the group and kills what was started so far
        let mut group = SentinelGroup {
            nodes: Vec::new(),
            sentinels: Vec::new(),
            dir,
        };
        group
            .nodes
            .push(Node::start(&root, "master", &[], |port, dir| {
                data_conf(port, dir, master_conf) + &tls_conf(port)
            }));
        let master = group.nodes[0].port;
        for i in 1..=2 {
            let node = Node::start(&root, &format!("replica-{i}"), &[], |port, dir| {
                data_conf(port, dir, &format!("replicaof 127.0.0.1 {master}\n")) + &tls_conf(port)
            });
            group.nodes.push(node);
        }
        // the replicas first, so that the sentinels' first INFO of the master lists them
        let mut last = String::new();
        let linked = poll(SETTLE_TIMEOUT, || {
            last = group.nodes[1..]
                .iter()
                .map(|n| {
                    let link = info_field(n.port, "replication", "master_link_status");
                    format!("{}: master_link_status {link:?}", n.name)
                })
                .collect::<Vec<_>>()
                .join(", ");
            group.nodes[1..]
                .iter()
                .all(|n| {
                    info_field(n.port, "replication", "master_link_status").as_deref() == Some("up")
                })
                .then_some(())
        });
        if linked.is_none() {
            group.fail(&format!(
                "the replicas did not report master_link_status:up within {SETTLE_TIMEOUT:?} \
                 (last seen: {last})"
            ));
        }
        for i in 1..=3 {
            let node = Node::start(
                &root,
                &format!("sentinel-{i}"),
                &["--sentinel"],
                |port, dir| sentinel_conf(port, dir, master) + &tls_conf(port),
            );
            group.sentinels.push(node);
        }
        let replicas: BTreeSet<u16> = group.nodes[1..].iter().map(|n| n.port).collect();
        let mut last = String::new();
        let known = poll(SETTLE_TIMEOUT, || {
            let mut all = true;
            last.clear();
            for s in &group.sentinels {
                let others: BTreeSet<u16> = group
                    .sentinels
                    .iter()
                    .filter(|o| o.port != s.port)
                    .map(|o| o.port)
                    .collect();
                let seen_master = sentinel_master(s.port);
                let seen_replicas = sentinel_replicas(s.port);
                let up: BTreeSet<u16> = seen_replicas
                    .iter()
                    .flatten()
                    .filter(|(_, flags)| flags_up(flags))
                    .map(|(port, _)| *port)
                    .collect();
                let seen_sentinels: Option<BTreeSet<u16>> = sentinel_sentinels(s.port);
                all &= seen_master == Some(master)
                    && up == replicas
                    && seen_sentinels.as_ref() == Some(&others);
                let _ = write!(
                    last,
                    "{}: master {seen_master:?}, replicas {seen_replicas:?}, \
                     sentinels {seen_sentinels:?}; ",
                    s.name
                );
            }
            all.then_some(())
        });
        if known.is_none() {
            group.fail(&format!(
                "the sentinels did not all come to know the master {master}, the replicas \
                 {replicas:?} (up) and each other within {SETTLE_TIMEOUT:?} (last seen: {last})"
            ));
        }
        group
    }

    /// `redis://127.0.0.1:PORT/` of every sentinel.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(|s| url(s.port)).collect()
    }

    /// The ports of the sentinels.
    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(|s| s.port).collect()
    }

    /// The ports of the data nodes (master and replicas, killed ones included), in start order.
    pub fn node_ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// The current master per the sentinels (`SENTINEL GET-MASTER-ADDR-BY-NAME`): waits up to
    /// 10 s until every running sentinel gives the same answer.
    pub fn master_port(&self) -> u16 {
        let mut last = Vec::new();
        let agreed = poll(AGREE_TIMEOUT, || {
            last = self.sentinel_answers();
            agreed_port(&last)
        });
        agreed.unwrap_or_else(|| {
            self.fail(&format!(
                "the sentinels did not agree on the master within {AGREE_TIMEOUT:?} \
                 (answers: {last:?})"
            ))
        })
    }

    /// The running data nodes other than the current master.
    pub fn replica_ports(&self) -> Vec<u16> {
        let master = self.master_port();
        self.nodes
            .iter()
            .filter(|n| n.running() && n.port != master)
            .map(|n| n.port)
            .collect()
    }

    /// A connection to the node (data node or sentinel) on `port`, 10 s read timeout.
    pub fn conn_to(&self, port: u16) -> Connection {
        conn_to(port)
    }

    /// What the node on `port` reports in `ROLE`; `None` when it does not answer.
    pub fn role(&self, port: u16) -> Option<Role> {
        role(port)
    }

    /// SIGKILL the current master's process (per the sentinels); returns its port.
    pub fn kill_master(&mut self) -> u16 {
        let port = self.master_port();
        self.kill_node(port);
        port
    }

    /// SIGKILL the data node on `port`.
    pub fn kill_node(&mut self, port: u16) {
        self.node_mut(port).kill();
    }

    /// SIGSTOP the sentinel on `port`, as a hung host or a paused VM: the kernel still accepts
    /// TCP connections to it, but it never answers. It runs again (SIGCONT) when the returned
    /// guard is dropped, on a panic too; declare the guard after the group, so that it drops
    /// first (the group's drop SIGKILLs a stopped process all the same).
    pub fn freeze_sentinel(&self, port: u16) -> Frozen {
        let node = self
            .sentinels
            .iter()
            .find(|s| s.port == port)
            .unwrap_or_else(|| panic!("no sentinel of the group on port {port}"));
        freeze(node)
    }

    /// SIGSTOP the data node on `port` (a hung host: connections to it stay open, nothing is
    /// answered); it runs again when the returned guard is dropped (see `freeze_sentinel`).
    pub fn freeze_node(&self, port: u16) -> Frozen {
        let node = self
            .nodes
            .iter()
            .find(|n| n.port == port)
            .unwrap_or_else(|| panic!("no data node of the group on port {port}"));
        freeze(node)
    }

    /// Wait until every running sentinel reports the same master (`GET-MASTER-ADDR-BY-NAME`),
    /// not `old_port`, with the failover over (no `failover_in_progress`, `s_down` or `o_down`
    /// in `SENTINEL MASTER`: the leader answers with the promoted replica while it still
    /// reconfigures the other replicas), and that node says `ROLE` master; returns its port.
    pub fn wait_for_new_master(&self, old_port: u16, timeout: Duration) -> u16 {
        let mut last = String::new();
        let new = poll(timeout, || {
            let answers = self.sentinel_answers();
            let flags: Vec<Option<String>> = self
                .sentinels
                .iter()
                .filter(|s| s.running())
                .map(|s| sentinel_master_flags(s.port))
                .collect();
            let port = agreed_port(&answers).filter(|&p| p != old_port);
            let role = port.map(role);
            last = format!(
                "sentinels' masters {answers:?} with flags {flags:?}, ROLE of the new one {role:?}"
            );
            let over = flags.iter().all(|f| f.as_deref().is_some_and(flags_up))
                && flags
                    .iter()
                    .flatten()
                    .all(|f| !f.contains("failover_in_progress"));
            port.filter(|_| over && role == Some(Some(Role::Master)))
        });
        new.unwrap_or_else(|| {
            self.fail(&format!(
                "no new master replaced {old_port} within {timeout:?}: the sentinels did not \
                 all report another master, failover over, that says ROLE master \
                 (last seen: {last})"
            ))
        })
    }

    /// Wait (`timeout` at most) until every running sentinel names the same master and sees it
    /// up (after a frozen sentinel is continued, it reconnects and catches up); whether they do.
    pub fn wait_for_sentinels_settled(&self, timeout: Duration) -> bool {
        poll(timeout, || {
            let agreed = agreed_port(&self.sentinel_answers())?;
            let up = self.sentinels.iter().filter(|s| s.running()).all(|s| {
                sentinel_master_flags(s.port)
                    .as_deref()
                    .is_some_and(flags_up)
            });
            up.then_some(agreed)
        })
        .is_some()
    }

    /// A graceful failover (`SENTINEL FAILOVER`, retried for up to 10 s while a sentinel
    /// refuses, e.g. `INPROG`), then [`SentinelGroup::wait_for_new_master`] (30 s); returns the
    /// new master's port. The old master stays a master until the sentinels convert it, about
    /// 8 s after their switch (Sentinel waits 4 hello periods before it reconfigures a node
    /// that claims the wrong role): [`SentinelGroup::wait_for_replicas`] waits for that.
    pub fn failover(&self) -> u16 {
        let old = self.master_port();
        let mut last = String::new();
        let sent = poll(AGREE_TIMEOUT, || {
            let s = self.sentinels.iter().find(|s| s.running())?;
            let reply: RedisResult<String> = query(
                s.port,
                redis::cmd("SENTINEL").arg("FAILOVER").arg(MASTER_NAME),
            );
            last = format!("{}: {reply:?}", s.name);
            reply.ok()
        });
        if sent.is_none() {
            self.fail(&format!(
                "SENTINEL FAILOVER {MASTER_NAME} was refused for {AGREE_TIMEOUT:?} (last: {last})"
            ));
        }
        // a sentinel thawed a moment ago (the chaos harness's stop-sentinel) may take some 30 s
        // to be elected leader for it: seen in scripts/chaos.sh 600 sentinel
        self.wait_for_new_master(old, Duration::from_secs(60))
    }

    /// Start the killed data node on `port` again, with its config file (as the sentinels
    /// rewrote it) and dir, and as a replica of the current master (`--replicaof` on the command
    /// line: a node that was master when killed would otherwise come back as a master and wait
    /// for the sentinels to convert it); then [`SentinelGroup::wait_for_replicas`] (20 s).
    /// The node comes back empty (no persistence) and syncs. When the sentinels still name it
    /// the master (killed and restarted before a failover), it starts as that master.
    pub fn restart_node(&mut self, port: u16) {
        let master = self.master_port();
        let node = self.node_mut(port);
        assert!(!node.running(), "{} is running: kill it first", node.name);
        let replicaof: Vec<String> = if master == port {
            Vec::new()
        } else {
            vec!["--replicaof".into(), "127.0.0.1".into(), master.to_string()]
        };
        if !node.launch(&replicaof) {
            let what = format!("{} did not start again on port {port}", node.name);
            self.fail(&what);
        }
        self.wait_for_replicas(Duration::from_secs(20));
    }

    /// Wait until every running data node but the master (per the sentinels) says `ROLE`
    /// replica of that master with the link up, and every running sentinel lists it as a replica
    /// that is not down.
    pub fn wait_for_replicas(&self, timeout: Duration) {
        let mut last = String::new();
        let ok = poll(timeout, || {
            let master = agreed_port(&self.sentinel_answers());
            let Some(master) = master else {
                last = "the sentinels disagree on the master".into();
                return None;
            };
            let replicas: Vec<&Node> = self
                .nodes
                .iter()
                .filter(|n| n.running() && n.port != master)
                .collect();
            let roles: Vec<(u16, Option<Role>)> =
                replicas.iter().map(|n| (n.port, role(n.port))).collect();
            let views: Vec<Option<Vec<(u16, String)>>> = self
                .sentinels
                .iter()
                .filter(|s| s.running())
                .map(|s| sentinel_replicas(s.port))
                .collect();
            last = format!("master {master}, ROLE {roles:?}, sentinels' replicas {views:?}");
            let linked = roles.iter().all(|(_, r)| {
                *r == Some(Role::Replica {
                    master_port: master,
                    connected: true,
                })
            });
            let listed = views.iter().all(|v| {
                v.as_ref().is_some_and(|v| {
                    replicas
                        .iter()
                        .all(|n| v.iter().any(|(p, f)| *p == n.port && flags_up(f)))
                })
            });
            (linked && listed).then_some(())
        });
        if ok.is_none() {
            self.fail(&format!(
                "the running data nodes did not all become linked replicas of the master known \
                 to every sentinel within {timeout:?} (last seen: {last})"
            ));
        }
    }

    /// Each running sentinel's answer to `GET-MASTER-ADDR-BY-NAME` (`None`: no answer).
    fn sentinel_answers(&self) -> Vec<Option<u16>> {
        self.sentinels
            .iter()
            .filter(|s| s.running())
            .map(|s| sentinel_master(s.port))
            .collect()
    }

    fn node_mut(&mut self, port: u16) -> &mut Node {
        self.nodes
            .iter_mut()
            .find(|n| n.port == port)
            .unwrap_or_else(|| panic!("no data node of the sentinel group on port {port}"))
    }

    /// The last lines of every log of the group (for a test's own failure messages).
    pub fn log_tails(&self) -> String {
        self.nodes
            .iter()
            .chain(&self.sentinels)
            .map(Node::log_tail)
            .collect()
    }

    /// Panic with `what` and the tail of every log of the group.
    fn fail(&self, what: &str) -> ! {
        fail(what, self.nodes.iter().chain(&self.sentinels))
    }
}

/// A process stopped by [`SentinelGroup::freeze_sentinel`]; dropping this continues it.
pub struct Frozen {
    pid: libc::pid_t,
}

impl Drop for Frozen {
    fn drop(&mut self) {
        // SAFETY: kill(2) on a child of the group, which outlives this guard
        unsafe { libc::kill(self.pid, libc::SIGCONT) };
    }
}

impl Drop for SentinelGroup {
    fn drop(&mut self) {
        for node in self.sentinels.iter_mut().chain(&mut self.nodes) {
            node.kill();
        }
    }
}

/// A sentinel of its own monitoring a master of its own under [`MASTER_NAME`]: listed with a
/// [`SentinelGroup`]'s sentinels, it is a sentinel that names another master than the others
/// (as in a failover on which the sentinels do not agree yet). The group never hears of it: a
/// sentinel learns of others through its master's hello channel.
pub struct LoneSentinel {
    master: Node,
    sentinel: Node,
    /// Last: removed after the processes above were killed.
    _dir: TempDir,
}

impl LoneSentinel {
    /// Start the master and the sentinel, and wait (up to 30 s) until the sentinel names it.
    pub fn start() -> LoneSentinel {
        let dir = tempdir("fairlock-lone-sentinel-");
        let root = dir.path().to_path_buf();
        let master = Node::start(&root, "master", &[], |port, dir| data_conf(port, dir, ""));
        let port = master.port;
        let sentinel = Node::start(&root, "sentinel", &["--sentinel"], |p, dir| {
            sentinel_conf(p, dir, port)
        });
        let lone = LoneSentinel {
            master,
            sentinel,
            _dir: dir,
        };
        if poll(SETTLE_TIMEOUT, || {
            (sentinel_master(lone.sentinel.port) == Some(port)).then_some(())
        })
        .is_none()
        {
            fail(
                &format!(
                    "the lone sentinel did not name its master {port} within {SETTLE_TIMEOUT:?}"
                ),
                [&lone.master, &lone.sentinel],
            );
        }
        lone
    }

    /// `redis://127.0.0.1:PORT/` of the sentinel.
    pub fn sentinel_url(&self) -> String {
        url(self.sentinel.port)
    }

    /// The port of its master.
    pub fn master_port(&self) -> u16 {
        self.master.port
    }
}

/// A Redis Cluster of 3 masters with 1 replica each (`cluster-node-timeout` 1000, created by
/// `redis-cli --cluster create`). No persistence besides each node's `nodes.conf`.
pub struct RedisCluster {
    nodes: Vec<Node>,
    /// Masters added by [`RedisCluster::add_master`] (no slots until one is migrated there).
    added: Vec<u16>,
    /// The slot ranges and replicas of each killed master, as they were when it was killed.
    killed: HashMap<u16, Killed>,
    /// Last: removed after the processes above were killed.
    dir: TempDir,
}

/// A killed master's slot ranges and replicas, as they were when it was killed.
struct Killed {
    ranges: Vec<(u16, u16)>,
    replicas: Vec<u16>,
}

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ClusterEntry {
    id: String,
    port: u16,
    flags: String,
    /// The id of its master, for a replica.
    master: Option<String>,
    /// Slot ranges, inclusive (the `[slot->-id]` migration marks left out).
    ranges: Vec<(u16, u16)>,
}

/// Who owns which slots: `(first, last, port)`, sorted.
type SlotMap = Vec<(u16, u16, u16)>;

impl RedisCluster {
    /// Start 6 nodes, create the cluster with `redis-cli --cluster create ... --cluster-replicas 1
    /// --cluster-yes` (60 s at most), then wait (up to 30 s) until every node reports
    /// `cluster_state:ok`, all agree on who owns which of the 16384 slots, every master has a
    /// replica and every replica's link is up.
    pub fn start() -> RedisCluster {
        Self::start_with(|_| String::new())
    }

    /// [`RedisCluster::start`], each node also serving TLS on the port after its own (see
    /// [`RedisCluster::tls_port`]) with `files` (certificate, key, CA), its cluster bus and its
    /// replication over TLS too. The nodes answer a TLS connection's `CLUSTER SLOTS` with their
    /// TLS ports, so a client that starts from TLS ports stays on them; the harness's own
    /// connections use the plain ports.
    pub fn start_tls(files: [&Path; 3]) -> RedisCluster {
        let [cert, key, ca] = files.map(|p| p.display().to_string());
        Self::start_with(move |port| {
            format!(
                "tls-port {}\ntls-cert-file {cert}\ntls-key-file {key}\ntls-ca-cert-file {ca}\n\
                 tls-auth-clients no\ntls-cluster yes\ntls-replication yes\n",
                Self::tls_port(port)
            )
        })
    }

    /// The TLS port of the node on `port` (of a cluster made by [`RedisCluster::start_tls`]).
    pub fn tls_port(port: u16) -> u16 {
        port + 1
    }

    fn start_with(more_conf: impl Fn(u16) -> String) -> RedisCluster {
        let dir = tempdir("fairlock-cluster-");
        let root = dir.path().to_path_buf();
        let mut cluster = RedisCluster {
            nodes: Vec::new(),
            added: Vec::new(),
            killed: HashMap::new(),
            dir,
        };
        for i in 1..=6 {
            let node = Node::start(&root, &format!("node-{i}"), &[], |port, dir| {
                data_conf(
                    port,
                    dir,
                    &format!(
                        "cluster-enabled yes\ncluster-config-file nodes.conf\n\
                         cluster-node-timeout 1000\n{}",
                        more_conf(port)
                    ),
                )
            });
            cluster.nodes.push(node);
        }
        let mut cmd = Command::new("redis-cli");
        cmd.args(["--cluster", "create"])
            .args(
                cluster
                    .nodes
                    .iter()
                    .map(|n| format!("127.0.0.1:{}", n.port)),
            )
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .stderr(Stdio::piped());
        let out = Proc::spawn(&mut cmd).finish(Duration::from_secs(60));
        if out.code != Some(0) {
            cluster.fail(&format!(
                "redis-cli --cluster create failed ({:?})\nstdout:\n{}\nstderr:\n{}",
                out.code, out.stdout, out.stderr
            ));
        }
        let mut last = String::new();
        let settled = poll(SETTLE_TIMEOUT, || {
            let map = cluster.agreement(&mut last)?;
            let views = cluster_nodes(cluster.nodes[0].port)?;
            let masters: BTreeSet<u16> = map.iter().map(|&(_, _, p)| p).collect();
            let replicated = masters.iter().all(|&m| !replicas_of(&views, m).is_empty());
            let linked = cluster.nodes.iter().all(|n| {
                masters.contains(&n.port)
                    || info_field(n.port, "replication", "master_link_status").as_deref()
                        == Some("up")
            });
            let _ = write!(
                last,
                "; every master replicated {replicated}, linked {linked}"
            );
            (masters.len() == 3 && replicated && linked).then_some(())
        });
        if settled.is_none() {
            cluster.fail(&format!(
                "the cluster did not settle within {SETTLE_TIMEOUT:?}: cluster_state:ok on every \
                 node, one slot map, 3 masters with a linked replica each (last seen: {last})"
            ));
        }
        cluster
    }

    /// `redis://127.0.0.1:PORT/` of every node (killed ones included), in start order.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| url(n.port)).collect()
    }

    /// The ports of every node (killed ones included), in start order.
    pub fn node_ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// The masters that own slots, by their first slot (waits up to 10 s for the running nodes
    /// to agree).
    pub fn master_ports(&self) -> Vec<u16> {
        let mut ports: Vec<u16> = Vec::new();
        for (_, _, port) in self.slot_map() {
            if !ports.contains(&port) {
                ports.push(port);
            }
        }
        ports
    }

    /// The replicas of the master on `port`, as the running nodes agree.
    pub fn replicas_of(&self, port: u16) -> Vec<u16> {
        self.slot_map();
        let views = self
            .running()
            .find_map(|n| cluster_nodes(n.port))
            .unwrap_or_else(|| self.fail("no running node answered CLUSTER NODES"));
        replicas_of(&views, port)
    }

    /// The master that owns `slot` (waits up to 10 s for the running nodes to agree).
    pub fn master_for_slot(&self, slot: u16) -> u16 {
        owner(&self.slot_map(), slot)
            .unwrap_or_else(|| self.fail(&format!("no master owns slot {slot}")))
    }

    /// The slot of `key` (`CLUSTER KEYSLOT`).
    pub fn slot_of(&self, key: &str) -> u16 {
        let port = self
            .running()
            .next()
            .unwrap_or_else(|| self.fail("no node is running"))
            .port;
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut conn_to(port))
            .unwrap_or_else(|e| panic!("CLUSTER KEYSLOT {key:?} on {port}: {e}"))
    }

    /// A connection to the node on `port`, 10 s read timeout (a plain connection: keys of other
    /// nodes' slots get `MOVED`).
    pub fn conn_to(&self, port: u16) -> Connection {
        conn_to(port)
    }

    /// What the node on `port` reports in `ROLE`; `None` when it does not answer.
    pub fn role(&self, port: u16) -> Option<Role> {
        role(port)
    }

    /// SIGKILL the node on `port`. For a master, its slots and replicas are noted first (the
    /// running nodes must agree on the slots, 10 s at most) for
    /// [`RedisCluster::wait_for_failover`].
    pub fn kill(&mut self, port: u16) {
        let map = self.slot_map();
        let ranges: Vec<(u16, u16)> = map
            .iter()
            .filter(|&&(_, _, p)| p == port)
            .map(|&(first, last, _)| (first, last))
            .collect();
        if !ranges.is_empty() {
            let replicas = self.replicas_of(port);
            self.killed.insert(port, Killed { ranges, replicas });
        }
        self.node_mut(port).kill();
    }

    /// Wait until one of the replicas the killed master `old_port` had owns all the slots it
    /// had and says `ROLE` master, and every running node reports `cluster_state:ok` and the
    /// same slot map; returns the new master's port.
    pub fn wait_for_failover(&self, old_port: u16, timeout: Duration) -> u16 {
        let Killed { ranges, replicas } = self
            .killed
            .get(&old_port)
            .unwrap_or_else(|| panic!("{old_port} is not a master killed by RedisCluster::kill"));
        let mut last = String::new();
        let new = poll(timeout, || {
            let map = self.agreement(&mut last)?;
            let new = owner(&map, ranges[0].0)?;
            let all = ranges
                .iter()
                .all(|&(first, end)| (first..=end).all(|s| owner(&map, s) == Some(new)));
            let role = role(new);
            let _ = write!(last, "; owner of slot {} ROLE {role:?}", ranges[0].0);
            (replicas.contains(&new) && all && role == Some(Role::Master)).then_some(new)
        });
        new.unwrap_or_else(|| {
            self.fail(&format!(
                "no replica of {old_port} ({replicas:?}) took over its slots {ranges:?} with \
                 cluster_state:ok on every running node within {timeout:?} (last seen: {last})"
            ))
        })
    }

    /// Start the killed node on `port` again with its `nodes.conf`: a master that was failed
    /// over comes back as a replica of its successor. Waits (30 s) until it says `ROLE` replica
    /// with its link up and every running node agrees on the slots.
    pub fn restart(&mut self, port: u16) {
        let node = self.node_mut(port);
        assert!(!node.running(), "{} is running: kill it first", node.name);
        if !node.launch(&[]) {
            let what = format!("{} did not start again on port {port}", node.name);
            self.fail(&what);
        }
        self.killed.remove(&port);
        let rejoined = poll(SETTLE_TIMEOUT, || {
            matches!(
                role(port),
                Some(Role::Replica {
                    connected: true,
                    ..
                })
            )
            .then_some(())
        });
        if rejoined.is_none() {
            self.fail(&format!(
                "{port} did not rejoin as a linked replica within {SETTLE_TIMEOUT:?}"
            ));
        }
        self.slot_map();
    }

    /// Move `slot` and its keys to the master on `to_port`: `CLUSTER SETSLOT IMPORTING` on it,
    /// `MIGRATING` on the owner, `MIGRATE ... KEYS` 100 keys at a time (30 s at most), then
    /// `SETSLOT NODE` on the new owner, the old one and the other masters; waits (10 s) until
    /// every running node agrees.
    pub fn migrate_slot(&self, slot: u16, to_port: u16) {
        self.migrate_slot_with(slot, to_port, |_| {});
    }

    /// As [`RedisCluster::migrate_slot`], running `during` (given the old owner's port) while
    /// the slot is MIGRATING and IMPORTING, before any key has moved.
    pub fn migrate_slot_with(&self, slot: u16, to_port: u16, during: impl FnOnce(u16)) {
        self.migrate_slot_around(slot, to_port, during, |_| {});
    }

    /// As [`RedisCluster::migrate_slot_with`], also running `moved` (given the old owner's
    /// port) once every key has moved, before the slot is assigned to its new owner.
    pub fn migrate_slot_around(
        &self,
        slot: u16,
        to_port: u16,
        during: impl FnOnce(u16),
        moved: impl FnOnce(u16),
    ) {
        let map = self.slot_map();
        let from_port = owner(&map, slot).expect("a settled map covers every slot");
        if from_port == to_port {
            return;
        }
        let masters = self.master_ports();
        assert!(
            masters.contains(&to_port) || self.added.contains(&to_port),
            "{to_port} is not a master owning slots ({masters:?}) nor one added"
        );
        let (mut from, mut to) = (conn_to(from_port), conn_to(to_port));
        let from_id = myid(&mut from);
        let to_id = myid(&mut to);
        let setslot = |c: &mut Connection, state: &str, id: &str| {
            let reply: RedisResult<()> = redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg(state)
                .arg(id)
                .query(c);
            reply.unwrap_or_else(|e| panic!("CLUSTER SETSLOT {slot} {state} {id}: {e}"));
        };
        setslot(&mut to, "IMPORTING", &from_id);
        setslot(&mut from, "MIGRATING", &to_id);
        during(from_port);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let keys: Vec<Vec<u8>> = redis::cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(slot)
                .arg(100)
                .query(&mut from)
                .unwrap_or_else(|e| panic!("CLUSTER GETKEYSINSLOT {slot} 100: {e}"));
            if keys.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "slot {slot} still had keys on {from_port} after 30 s of MIGRATE"
            );
            let reply: RedisResult<String> = redis::cmd("MIGRATE")
                .arg("127.0.0.1")
                .arg(to_port)
                .arg("")
                .arg(0)
                .arg(5000)
                .arg("KEYS")
                .arg(&keys)
                .query(&mut from);
            reply.unwrap_or_else(|e| panic!("MIGRATE of slot {slot} to {to_port}: {e}"));
        }
        moved(from_port);
        setslot(&mut to, "NODE", &to_id);
        setslot(&mut from, "NODE", &to_id);
        for port in masters {
            if port != from_port && port != to_port {
                setslot(&mut conn_to(port), "NODE", &to_id);
            }
        }
        let mut last = String::new();
        let moved = poll(AGREE_TIMEOUT, || {
            let map = self.agreement(&mut last)?;
            (owner(&map, slot) == Some(to_port)).then_some(())
        });
        if moved.is_none() {
            self.fail(&format!(
                "the running nodes did not all agree that {to_port} owns slot {slot} within \
                 {AGREE_TIMEOUT:?} (last seen: {last})"
            ));
        }
    }

    /// Start a seventh node, a master without slots, and have it meet the cluster (as a new
    /// shard is added before slots move to it); waits (30 s) until every running node knows it
    /// as a connected master. Returns its port.
    pub fn add_master(&mut self) -> u16 {
        let root = self.dir.path().to_path_buf();
        let name = format!("node-{}", self.nodes.len() + 1);
        let node = Node::start(&root, &name, &[], |port, dir| {
            data_conf(
                port,
                dir,
                "cluster-enabled yes\ncluster-config-file nodes.conf\ncluster-node-timeout 1000\n",
            )
        });
        let port = node.port;
        self.nodes.push(node);
        self.added.push(port);
        let met: RedisResult<()> = redis::cmd("CLUSTER")
            .arg("MEET")
            .arg("127.0.0.1")
            .arg(port)
            .query(&mut conn_to(self.nodes[0].port));
        met.unwrap_or_else(|e| self.fail(&format!("CLUSTER MEET 127.0.0.1 {port}: {e}")));
        let known = poll(SETTLE_TIMEOUT, || {
            self.running()
                .all(|n| {
                    cluster_nodes(n.port).is_some_and(|v| {
                        v.iter().any(|e| {
                            e.port == port
                                && e.flags.contains("master")
                                && !e.flags.contains("handshake")
                                && !e.flags.contains("fail")
                        })
                    })
                })
                .then_some(())
        });
        if known.is_none() {
            self.fail(&format!(
                "the nodes did not all come to know the new master {port} within {SETTLE_TIMEOUT:?}"
            ));
        }
        port
    }

    /// The slot map every running node agrees on (10 s at most).
    fn slot_map(&self) -> SlotMap {
        let mut last = String::new();
        let map = poll(AGREE_TIMEOUT, || self.agreement(&mut last));
        map.unwrap_or_else(|| {
            self.fail(&format!(
                "the running nodes did not agree on the slots with cluster_state:ok within \
                 {AGREE_TIMEOUT:?} (last seen: {last})"
            ))
        })
    }

    /// The slot map when every running node reports `cluster_state:ok` and the same map of all
    /// 16384 slots; what it saw in `last`.
    fn agreement(&self, last: &mut String) -> Option<SlotMap> {
        last.clear();
        let mut maps = Vec::new();
        for n in self.running() {
            let state = info_like(n.port, redis::cmd("CLUSTER").arg("INFO"), "cluster_state");
            let map = cluster_nodes(n.port).map(|v| slot_map(&v));
            let _ = write!(last, "{} ({}): {state:?} {map:?}; ", n.name, n.port);
            maps.push((state, map));
        }
        let first = maps.first()?.1.clone()?;
        let covered: usize = first.iter().map(|&(a, b, _)| usize::from(b - a) + 1).sum();
        let agreed = maps
            .iter()
            .all(|(state, map)| state.as_deref() == Some("ok") && map.as_ref() == Some(&first));
        (agreed && covered == 16384).then_some(first)
    }

    fn running(&self) -> impl Iterator<Item = &Node> {
        self.nodes.iter().filter(|n| n.running())
    }

    fn node_mut(&mut self, port: u16) -> &mut Node {
        self.nodes
            .iter_mut()
            .find(|n| n.port == port)
            .unwrap_or_else(|| panic!("no node of the cluster on port {port}"))
    }

    /// The last lines of every node's log (for a test's own failure messages).
    pub fn log_tails(&self) -> String {
        self.nodes.iter().map(Node::log_tail).collect()
    }

    /// Panic with `what` and the tail of every node's log.
    fn fail(&self, what: &str) -> ! {
        fail(what, &self.nodes)
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            node.kill();
        }
    }
}

/// One redis-server process (data node or sentinel) with its dir, config file and log.
struct Node {
    /// Names the node in messages and its dir: `master`, `replica-1`, `sentinel-2`, `node-3`.
    name: String,
    port: u16,
    dir: PathBuf,
    /// `redis.conf` in `dir`: the server (and Sentinel) may rewrite it.
    conf: PathBuf,
    /// Arguments after the config file, e.g. `--sentinel`.
    extra: Vec<String>,
    child: Option<Child>,
}

impl Node {
    /// Create `root/name`, write the config for a free port (`conf(port, dir)`) and start the
    /// server; another port when that one was taken meanwhile (5 tries).
    fn start(root: &Path, name: &str, extra: &[&str], conf: impl Fn(u16, &Path) -> String) -> Node {
        let dir = root.join(name);
        fs::create_dir(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        let mut node = Node {
            name: name.to_string(),
            port: 0,
            conf: dir.join("redis.conf"),
            dir,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            child: None,
        };
        for _ in 0..5 {
            // the TLS port beside it (RedisCluster::tls_port) and a Cluster node's bus port too
            node.port = free_port_with(&[1, CLUSTER_BUS_OFFSET]);
            fs::write(&node.conf, conf(node.port, &node.dir))
                .unwrap_or_else(|e| panic!("write {}: {e}", node.conf.display()));
            if node.launch(&[]) {
                return node;
            }
            node.kill();
        }
        fail(&format!("{name} did not start on 5 ports"), [&node])
    }

    /// Start the server with its config file, `extra` and `more`; true when it answers within
    /// 10 s and it is this process (not another server on the port).
    fn launch(&mut self, more: &[String]) -> bool {
        let out = File::create(self.dir.join("stdout.log")).expect("create stdout.log");
        let err = out.try_clone().expect("clone stdout.log");
        let child = Command::new("redis-server")
            .arg(&self.conf)
            .args(&self.extra)
            .args(more)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("redis-server must be installed (scripts/test.sh installs it)");
        let pid = child.id();
        self.child = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        while Instant::now() < deadline {
            if let Some(Ok(Some(_))) = self.child.as_mut().map(Child::try_wait) {
                return false;
            }
            if let Ok(info) = query::<String>(self.port, redis::cmd("INFO").arg("server")) {
                return info.contains(&format!("process_id:{pid}\r\n"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    fn running(&self) -> bool {
        self.child.is_some()
    }

    /// SIGKILL and reap (nothing when not running).
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The last lines of its log (and of its stdout/stderr, where config errors go).
    fn log_tail(&self) -> String {
        let mut text = String::new();
        for file in ["redis.log", "stdout.log"] {
            let path = self.dir.join(file);
            let Ok(content) = fs::read_to_string(&path) else {
                continue;
            };
            // the overcommit warning of every start is long and says nothing about the test
            let lines: Vec<&str> = content
                .lines()
                .filter(|l| !l.contains("WARNING Memory overcommit"))
                .collect();
            if lines.is_empty() {
                continue;
            }
            let from = lines.len().saturating_sub(LOG_TAIL);
            let _ = writeln!(
                text,
                "--- {} (port {}), last {} lines of {}:",
                self.name,
                self.port,
                lines.len() - from,
                path.display()
            );
            for line in &lines[from..] {
                let _ = writeln!(text, "{line}");
            }
        }
        text
    }
}

/// SIGSTOP `node` (see `SentinelGroup::freeze_sentinel`); it runs again when the guard drops.
fn freeze(node: &Node) -> Frozen {
    let pid = node
        .child
        .as_ref()
        .unwrap_or_else(|| panic!("{} is not running", node.name))
        .id() as libc::pid_t;
    // SAFETY: kill(2) on our own child, not reaped (the group reaps it when it kills it)
    let sent = unsafe { libc::kill(pid, libc::SIGSTOP) } == 0;
    assert!(
        sent,
        "kill -STOP {pid}: {}",
        std::io::Error::last_os_error()
    );
    Frozen { pid }
}

impl Drop for Node {
    /// A panic must not leave a server behind.
    fn drop(&mut self) {
        self.kill();
    }
}

/// Panic with `what`, followed by the log tails of `nodes`.
fn fail<'a>(what: &str, nodes: impl IntoIterator<Item = &'a Node>) -> ! {
    let tails: String = nodes.into_iter().map(Node::log_tail).collect();
    panic!("{what}\n{tails}")
}

/// A topology's directory (configs, logs); kept after the run when `FAIRLOCK_KEEP_TOPOLOGY` is
/// set, to read the servers' and sentinels' logs afterwards.
fn tempdir(prefix: &str) -> TempDir {
    let keep = std::env::var_os("FAIRLOCK_KEEP_TOPOLOGY").is_some();
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .disable_cleanup(keep)
        .tempdir()
        .expect("create temp dir");
    if keep {
        eprintln!("topology dir kept: {}", dir.path().display());
    }
    dir
}

/// The config every process shares: loopback only, its own dir and log, in the foreground.
fn base_conf(port: u16, dir: &Path) -> String {
    // plain text unless `serve_tls` says otherwise (a port an earlier TLS node had)
    TLS_PORTS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&port);
    let dir = dir.display();
    format!(
        "port {port}\nbind 127.0.0.1\nprotected-mode no\ndaemonize no\n\
         dir \"{dir}\"\nlogfile \"{dir}/redis.log\"\n"
    )
}

/// A data node: no persistence, and a full sync starts at once (Redis 7 waits 5 s for more
/// replicas by default: `repl-diskless-sync-delay`); then `more`.
fn data_conf(port: u16, dir: &Path, more: &str) -> String {
    base_conf(port, dir) + "save \"\"\nappendonly no\nrepl-diskless-sync-delay 0\n" + more
}

/// A sentinel of the master on `master`, with fast failover settings.
fn sentinel_conf(port: u16, dir: &Path, master: u16) -> String {
    base_conf(port, dir)
        + &format!(
            "sentinel resolve-hostnames no\n\
             sentinel announce-hostnames no\n\
             sentinel monitor {MASTER_NAME} 127.0.0.1 {master} 2\n\
             sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
             sentinel failover-timeout {MASTER_NAME} 5000\n\
             sentinel parallel-syncs {MASTER_NAME} 2\n"
        )
}

fn url(port: u16) -> String {
    match tls_ca(port) {
        Some(_) => format!("rediss://127.0.0.1:{port}/"),
        None => format!("redis://127.0.0.1:{port}/"),
    }
}

/// The ports that serve TLS only (see [`serve_tls`]), with the CA that signed their
/// certificate.
static TLS_PORTS: Mutex<BTreeMap<u16, PathBuf>> = Mutex::new(BTreeMap::new());

/// The CA that signed the certificate of the node on `port`, when it serves TLS only.
pub fn tls_ca(port: u16) -> Option<PathBuf> {
    TLS_PORTS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&port)
        .cloned()
}

/// The config lines that make the node on `port` speak TLS only there, with `files`
/// (certificate, key, CA), to clients and in its own connections to other nodes; the port is
/// noted, so the harness's connections to it are TLS too.
fn serve_tls(port: u16, files: &[PathBuf; 3]) -> String {
    let [cert, key, ca] = files.each_ref().map(|p| p.display().to_string());
    TLS_PORTS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(port, files[2].clone());
    format!(
        "port 0\ntls-port {port}\ntls-cert-file {cert}\ntls-key-file {key}\n\
         tls-ca-cert-file {ca}\ntls-auth-clients no\ntls-replication yes\n"
    )
}

/// A client for the node on `port`: over TLS, trusting its CA, where it serves TLS.
pub fn client_for(port: u16) -> RedisResult<redis::Client> {
    match tls_ca(port) {
        #[cfg(feature = "tls")]
        Some(ca) => {
            let _ = rustls::crypto::ring::default_provider().install_default();
            let certificates = redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(fs::read(ca)?),
            };
            redis::Client::build_with_tls(url(port), certificates)
        }
        _ => redis::Client::open(url(port)),
    }
}

/// A connection with short timeouts, for the checks of a wait.
fn try_conn(port: u16) -> RedisResult<Connection> {
    let c = client_for(port)?.get_connection_with_timeout(Duration::from_secs(1))?;
    c.set_read_timeout(Some(Duration::from_secs(2)))?;
    c.set_write_timeout(Some(Duration::from_secs(2)))?;
    Ok(c)
}

fn conn_to(port: u16) -> Connection {
    let c = try_conn(port).unwrap_or_else(|e| panic!("connect to 127.0.0.1:{port}: {e}"));
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c
}

/// One command on a new connection.
fn query<T: FromRedisValue>(port: u16, cmd: &redis::Cmd) -> RedisResult<T> {
    cmd.query(&mut try_conn(port)?)
}

/// `field` of `INFO section`; `None` when the node does not answer or lacks it.
fn info_field(port: u16, section: &str, field: &str) -> Option<String> {
    info_like(port, redis::cmd("INFO").arg(section), field)
}

/// `field` of a `name:value` per line reply (`INFO`, `CLUSTER INFO`).
fn info_like(port: u16, cmd: &redis::Cmd, field: &str) -> Option<String> {
    let text: String = query(port, cmd).ok()?;
    let prefix = format!("{field}:");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|v| v.trim().to_string())
}

/// `ROLE` of the node on `port`; `None` when it does not answer.
fn role(port: u16) -> Option<Role> {
    let Value::Array(items) = query::<Value>(port, &redis::cmd("ROLE")).ok()? else {
        return None;
    };
    let text = |i: usize| -> Option<String> {
        match items.get(i)? {
            Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
            Value::SimpleString(s) => Some(s.clone()),
            Value::Int(n) => Some(n.to_string()),
            _ => None,
        }
    };
    match text(0)?.as_str() {
        "master" => Some(Role::Master),
        "slave" => Some(Role::Replica {
            master_port: text(2)?.parse().ok()?,
            connected: text(3)? == "connected",
        }),
        "sentinel" => Some(Role::Sentinel),
        _ => None,
    }
}

/// The master's port per the sentinel on `port` (`None`: no answer or no master).
fn sentinel_master(port: u16) -> Option<u16> {
    let addr: Option<(String, u16)> = query(
        port,
        redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(MASTER_NAME),
    )
    .ok()?;
    addr.map(|(_, p)| p)
}

/// The flags of the master in `SENTINEL MASTER` of the sentinel on `port`.
fn sentinel_master_flags(port: u16) -> Option<String> {
    let master: HashMap<String, String> =
        query(port, redis::cmd("SENTINEL").arg("MASTER").arg(MASTER_NAME)).ok()?;
    master.get("flags").cloned()
}

/// `SENTINEL REPLICAS` of the sentinel on `port`: port and flags of each replica it knows.
fn sentinel_replicas(port: u16) -> Option<Vec<(u16, String)>> {
    let replicas: Vec<HashMap<String, String>> = query(
        port,
        redis::cmd("SENTINEL").arg("REPLICAS").arg(MASTER_NAME),
    )
    .ok()?;
    replicas
        .iter()
        .map(|r| Some((r.get("port")?.parse().ok()?, r.get("flags")?.clone())))
        .collect()
}

/// The ports of the other sentinels the sentinel on `port` knows.
fn sentinel_sentinels(port: u16) -> Option<BTreeSet<u16>> {
    let sentinels: Vec<HashMap<String, String>> = query(
        port,
        redis::cmd("SENTINEL").arg("SENTINELS").arg(MASTER_NAME),
    )
    .ok()?;
    sentinels
        .iter()
        .map(|s| s.get("port")?.parse().ok())
        .collect()
}

/// Sentinel flags of an instance that is reachable and not thought down.
fn flags_up(flags: &str) -> bool {
    !flags
        .split(',')
        .any(|f| matches!(f, "s_down" | "o_down" | "disconnected"))
}

/// The port all answers name, when they all answered the same.
fn agreed_port(answers: &[Option<u16>]) -> Option<u16> {
    let first = (*answers.first()?)?;
    answers.iter().all(|a| *a == Some(first)).then_some(first)
}

/// `CLUSTER NODES` of the node on `port`, parsed.
fn cluster_nodes(port: u16) -> Option<Vec<ClusterEntry>> {
    let text: String = query(port, redis::cmd("CLUSTER").arg("NODES")).ok()?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // <id> <ip:port@cport[,hostname]> <flags> <master> <ping> <pong> <epoch> <link> <slot>...
            let addr = fields.get(1)?.split(',').next()?;
            let port = addr.rsplit_once(':')?.1.split('@').next()?.parse().ok()?;
            let ranges = fields
                .get(8..)
                .unwrap_or_default()
                .iter()
                .filter(|s| !s.starts_with('['))
                .map(|s| match s.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => s.parse().ok().map(|a| (a, a)),
                })
                .collect::<Option<Vec<(u16, u16)>>>()?;
            Some(ClusterEntry {
                id: fields.first()?.to_string(),
                port,
                flags: fields.get(2)?.to_string(),
                master: Some(fields.get(3)?.to_string()).filter(|m| m.as_str() != "-"),
                ranges,
            })
        })
        .collect()
}

fn slot_map(entries: &[ClusterEntry]) -> SlotMap {
    let mut map: SlotMap = entries
        .iter()
        .flat_map(|e| e.ranges.iter().map(|&(a, b)| (a, b, e.port)))
        .collect();
    map.sort_unstable();
    map
}

fn owner(map: &SlotMap, slot: u16) -> Option<u16> {
    map.iter()
        .find(|&&(a, b, _)| (a..=b).contains(&slot))
        .map(|&(_, _, p)| p)
}

/// The nodes that `entries` show as replicas of the master on `port` and not failed.
fn replicas_of(entries: &[ClusterEntry], port: u16) -> Vec<u16> {
    let Some(master) = entries.iter().find(|e| e.port == port) else {
        return Vec::new();
    };
    entries
        .iter()
        .filter(|e| e.master.as_ref() == Some(&master.id) && !e.flags.contains("fail"))
        .map(|e| e.port)
        .collect()
}

fn myid(c: &mut Connection) -> String {
    redis::cmd("CLUSTER")
        .arg("MYID")
        .query(c)
        .unwrap_or_else(|e| panic!("CLUSTER MYID: {e}"))
}

/// Call `f` every 50 ms until it gives a value or `timeout` passes.
fn poll<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(POLL);
    }
}

/// Added for the chaos suite's Cluster mode (tests/chaos): a graceful failover, and the wait for
/// every node that owns no slots to be a linked replica.
impl RedisCluster {
    /// A graceful failover (`CLUSTER FAILOVER` sent to the replica on `replica_port`: its master
    /// stops its clients until the replica has caught up, then the replica takes over). Waits
    /// (30 s) until the replica owns its former master's slots, says `ROLE` master, and every
    /// running node agrees, then [`RedisCluster::wait_for_replicas`] (30 s). Returns the former
    /// master's port.
    pub fn failover_to(&self, replica_port: u16) -> u16 {
        let Some(Role::Replica { master_port, .. }) = role(replica_port) else {
            self.fail(&format!("{replica_port} is not a replica"));
        };
        let ranges: Vec<(u16, u16)> = self
            .slot_map()
            .iter()
            .filter(|&&(_, _, p)| p == master_port)
            .map(|&(first, last, _)| (first, last))
            .collect();
        let reply: RedisResult<String> = query(replica_port, redis::cmd("CLUSTER").arg("FAILOVER"));
        if let Err(e) = reply {
            self.fail(&format!("CLUSTER FAILOVER on {replica_port}: {e}"));
        }
        let timeout = Duration::from_secs(30);
        let mut last = String::new();
        let done = poll(timeout, || {
            let map = self.agreement(&mut last)?;
            let all = ranges
                .iter()
                .all(|&(first, end)| (first..=end).all(|s| owner(&map, s) == Some(replica_port)));
            (all && role(replica_port) == Some(Role::Master)).then_some(())
        });
        if done.is_none() {
            self.fail(&format!(
                "the replica {replica_port} did not take over the slots {ranges:?} of \
                 {master_port} within {timeout:?} (last seen: {last})"
            ));
        }
        self.wait_for_replicas(timeout);
        master_port
    }

    /// Wait until every running node agrees on the slots with `cluster_state:ok` and every
    /// running node that owns none says `ROLE` replica of a slot owner with the link up.
    pub fn wait_for_replicas(&self, timeout: Duration) {
        let mut last = String::new();
        let ok = poll(timeout, || {
            let map = self.agreement(&mut last)?;
            let owners: BTreeSet<u16> = map.iter().map(|&(_, _, p)| p).collect();
            let roles: Vec<(u16, Option<Role>)> = self
                .running()
                .filter(|n| !owners.contains(&n.port))
                .map(|n| (n.port, role(n.port)))
                .collect();
            let _ = write!(last, "; ROLE of the others {roles:?}");
            roles
                .iter()
                .all(|(_, r)| {
                    matches!(r, Some(Role::Replica { master_port, connected: true })
                        if owners.contains(master_port))
                })
                .then_some(())
        });
        if ok.is_none() {
            self.fail(&format!(
                "the running nodes that own no slots did not all become linked replicas of a \
                 slot owner within {timeout:?} (last seen: {last})"
            ));
        }
    }
}
