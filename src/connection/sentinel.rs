//! A Sentinel group as the target of a client's connections: which master they go to.
//!
//! The redis crate's `SentinelClient` finds a master and checks its `ROLE`, taking the first
//! sentinel, in the order given, that names a valid master. During a failover the sentinels can
//! disagree for a while: one has switched to the promoted replica while the others still name the
//! old master, or (a failover attempt aborted after its promotion, then another) two replicas are
//! masters at once and each is named by some sentinel. Following the first sentinel that
//! answers, a client's connections could then reach two masters at once (its pool one, its
//! waker the other), and two clients could each take the lock from a different master.
//!
//! So a client follows only a master that **more than half of the sentinels in its URL** name
//! (`SENTINEL GET-MASTER-ADDR-BY-NAME`): at any moment at most one master has such a majority, as
//! Sentinel's own failover needs a majority of the sentinels to authorize a new master. While no
//! master has one, new connections fail as in a failover under way (the calls are repeated for
//! up to the client's failover timeout) and connections already open stay where they are. The
//! agreed master is then asked its `ROLE` (or, where an ACL refuses that, `INFO replication`)
//! before connections go to it. How a sentinel or a data node is reached (TLS, credentials that
//! rotate) is the caller's: it gives the functions that make a client for an address, so a
//! client for the master is made fresh, with the credentials of the moment, each time.
//!
//! The sentinels are asked **all at once**, each on a short-lived thread of its own, and the
//! answer is decided as soon as one master has its majority (or none can have it any more). A
//! sentinel whose process is stopped (a hung host, a paused VM) still accepts TCP connections and
//! never answers: asked in turn, it would cost every question its whole read timeout (twice,
//! with the retry on a new connection), and the janitor's heartbeats waited behind that. Now it
//! costs nothing while the others make a majority: its question waits on its own thread, and
//! later questions to it give up after [`BUSY_WAIT`] instead of queueing behind it.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use redis::{ErrorKind, RedisError, RedisResult};

/// Makes a client for `host:port` (a sentinel's, or a data node's).
pub(crate) type Connect = Arc<dyn Fn(&str) -> RedisResult<redis::Client> + Send + Sync>;

/// The longest a question waits for an earlier question to the same sentinel to end (they share
/// its kept connection). A sentinel answers `GET-MASTER-ADDR-BY-NAME` within a round trip, so a
/// longer wait means it is not answering at all: the question then gives up at once rather than
/// wait a read timeout for it, and a client never has more than a few threads waiting on it.
const BUSY_WAIT: Duration = Duration::from_millis(500);

/// One sentinel of the URL.
struct Sentinel {
    /// `host:port`
    url: String,
    /// A client for it.
    client: redis::Client,
    /// A kept connection for `SENTINEL GET-MASTER-ADDR-BY-NAME`.
    asking: Mutex<Option<redis::Connection>>,
}

/// The sentinels of a client's URL and the master its connections go to.
pub(crate) struct SentinelTarget {
    master_name: String,
    /// Shared with the threads that ask them (see [`SentinelTarget::agreed_master`]).
    sentinels: Vec<Arc<Sentinel>>,
    /// Makes a client for a data node.
    connect_node: Connect,
    /// The master connections go to now (see `Manager::follow_master`).
    pub master: Mutex<Option<Followed>>,
}

/// The master a client's connections go to, and when the sentinels last agreed on it.
pub(crate) struct Followed {
    /// `host:port`
    pub addr: String,
    /// A client for it (made before the node said it is a master).
    pub client: redis::Client,
    /// When the last round of questions that gave it a majority began.
    pub agreed_at: Instant,
}

/// A master that more than half of the sentinels name.
pub(crate) struct Agreed {
    /// `host:port`
    pub addr: String,
    /// The indexes of the sentinels that named it.
    voters: Vec<usize>,
    /// When the questions were asked (their answers are no newer).
    pub asked: Instant,
}

impl SentinelTarget {
    /// The sentinels at `addrs` (`host:port` each), monitoring `master_name`, reached through
    /// `connect_sentinel`; the data nodes through `connect_node`.
    ///
    /// # Errors
    /// The redis crate's, for an address it cannot use.
    pub fn new(
        master_name: &str,
        addrs: Vec<String>,
        connect_sentinel: Connect,
        connect_node: Connect,
    ) -> RedisResult<SentinelTarget> {
        let sentinels = addrs
            .into_iter()
            .map(|url| {
                let client = connect_sentinel(&url)?;
                Ok(Arc::new(Sentinel {
                    url,
                    client,
                    asking: Mutex::new(None),
                }))
            })
            .collect::<RedisResult<Vec<_>>>()?;
        Ok(SentinelTarget {
            master_name: master_name.to_string(),
            sentinels,
            connect_node,
            master: Mutex::new(None),
        })
    }

    pub fn master_name(&self) -> &str {
        &self.master_name
    }

    /// The master that more than half of the sentinels name now. Every sentinel is asked at
    /// once, each on a thread of its own, and the answer is given as soon as one master has the
    /// majority or none can have it any more, or after `connect_timeout + read_timeout` at
    /// most: a sentinel that does not answer costs nothing while the others make a majority.
    ///
    /// # Errors
    /// A `MasterNameNotFoundBySentinel` error (which fairlock treats as a failover under way)
    /// saying what each sentinel answered, when no master has a majority.
    pub fn agreed_master(
        &self,
        connect_timeout: Duration,
        read_timeout: Duration,
    ) -> RedisResult<Agreed> {
        let asked = Instant::now();
        let n = self.sentinels.len();
        let needed = n / 2 + 1;
        // room for every answer: a question that ends after we stopped listening never blocks
        let (tx, rx) = crossbeam_channel::bounded(n);
        let mut answers: Vec<Option<String>> = vec![None; n];
        let mut pending = 0;
        for (i, sentinel) in self.sentinels.iter().enumerate() {
            let (asking, tx) = (Arc::clone(sentinel), tx.clone());
            let name = self.master_name.clone();
            let started = thread::Builder::new()
                .name("fairlock-ask".into())
                .spawn(move || {
                    let _ = tx.send((i, asking.ask(&name, connect_timeout, read_timeout)));
                });
            match started {
                Ok(_) => pending += 1,
                Err(e) => {
                    answers[i] = Some(format!("{}: not asked (no thread: {e})", sentinel.url))
                }
            }
        }
        drop(tx);
        let deadline = asked + connect_timeout + read_timeout;
        let mut named: Vec<Agreed> = Vec::new();
        while pending > 0 {
            let best = named.iter().map(|a| a.voters.len()).max().unwrap_or(0);
            if best + pending < needed {
                break;
            }
            let Ok((i, answer)) = rx.recv_deadline(deadline) else {
                break;
            };
            pending -= 1;
            let url = &self.sentinels[i].url;
            answers[i] = Some(match answer {
                Ok(Some(addr)) => {
                    let answer = format!("{url} names {addr}");
                    let index = match named.iter().position(|a| a.addr == addr) {
                        Some(index) => index,
                        None => {
                            named.push(Agreed {
                                addr,
                                voters: Vec::new(),
                                asked,
                            });
                            named.len() - 1
                        }
                    };
                    named[index].voters.push(i);
                    if named[index].voters.len() >= needed {
                        return Ok(named.swap_remove(index));
                    }
                    answer
                }
                Ok(None) => format!("{url} knows no master {}", self.master_name),
                Err(e) => format!("{url}: {e}"),
            });
        }
        let waited = asked.elapsed();
        let answers: Vec<String> = answers
            .into_iter()
            .zip(&self.sentinels)
            .map(|(answer, sentinel)| {
                answer.unwrap_or_else(|| format!("{}: no answer after {waited:?}", sentinel.url))
            })
            .collect();
        Err(RedisError::from((
            ErrorKind::MasterNameNotFoundBySentinel,
            "no master is named by more than half of the sentinels",
            format!(
                "no master {} is named by more than half of the sentinels: {}",
                self.master_name,
                answers.join("; ")
            ),
        )))
    }

    /// A client for the `agreed` master, once the node says it is a master, and its
    /// `host:port`.
    ///
    /// # Errors
    /// The node's when it cannot be reached, or a `MasterNameNotFoundBySentinel` error when it
    /// says it is a replica (the sentinels' answer is already old: a failover under way).
    pub fn client_for(
        &self,
        agreed: &Agreed,
        connect_timeout: Duration,
        read_timeout: Duration,
    ) -> RedisResult<(redis::Client, String)> {
        let client = (self.connect_node)(&agreed.addr)?;
        let mut conn = client.get_connection_with_timeout(connect_timeout)?;
        conn.set_read_timeout(Some(read_timeout))?;
        conn.set_write_timeout(Some(read_timeout))?;
        match role_of(&mut conn)? {
            Some(role) if role != "master" => Err(RedisError::from((
                ErrorKind::MasterNameNotFoundBySentinel,
                "the master the sentinels name is not one (any more)",
                format!(
                    "the sentinels name {} as master {}, but it says it is a {role}",
                    agreed.addr, self.master_name
                ),
            ))),
            // a master, or a node that will not say (an ACL that refuses ROLE and INFO): more
            // than half of the sentinels named it just now
            _ => Ok((client, agreed.addr.clone())),
        }
    }
}

/// The node's role (`master`, `slave`, ...) by `ROLE`, or by `INFO replication` where an ACL
/// refuses `ROLE`; `None` when both are refused.
fn role_of(conn: &mut redis::Connection) -> RedisResult<Option<String>> {
    let refused = |e: &RedisError| {
        e.kind() == ErrorKind::Server(redis::ServerErrorKind::NoPerm)
            || e.to_string()
                .to_ascii_lowercase()
                .contains("unknown command")
    };
    match redis::cmd("ROLE").query::<Vec<redis::Value>>(conn) {
        Ok(reply) => Ok(reply.first().and_then(|v| match v {
            redis::Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
            redis::Value::SimpleString(s) => Some(s.clone()),
            _ => None,
        })),
        Err(e) if refused(&e) => {
            match redis::cmd("INFO").arg("replication").query::<String>(conn) {
                Ok(info) => Ok(info
                    .lines()
                    .find_map(|l| l.strip_prefix("role:"))
                    .map(|r| r.trim().to_string())),
                Err(e) if refused(&e) => Ok(None),
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

impl Sentinel {
    /// `host:port` of the master this sentinel names (`None`: it knows no such master), on
    /// the kept connection, or on a new one when that was closed (a sentinel restarted). One
    /// question at a time per sentinel: a question that finds another one under way for longer
    /// than [`BUSY_WAIT`] gives up, and one that timed out is not asked again on a new
    /// connection (that would wait as long again).
    fn ask(
        &self,
        master_name: &str,
        connect_timeout: Duration,
        read_timeout: Duration,
    ) -> RedisResult<Option<String>> {
        let cmd = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(master_name)
            .clone();
        let busy_wait = BUSY_WAIT.min(read_timeout);
        let Some(mut asking) = self.asking.try_lock_for(busy_wait) else {
            return Err(RedisError::from((
                ErrorKind::Io,
                "the sentinel does not answer",
                format!("it has not answered an earlier question for {busy_wait:?}"),
            )));
        };
        if let Some(conn) = asking.as_mut() {
            match cmd.query::<Option<(String, String)>>(conn) {
                Ok(reply) => return Ok(reply.map(|(host, port)| format!("{host}:{port}"))),
                Err(e) if e.is_timeout() => {
                    // its late answer must not be read as the next question's
                    *asking = None;
                    return Err(e);
                }
                Err(_) => {}
            }
        }
        *asking = None;
        let conn = self.client.get_connection_with_timeout(connect_timeout)?;
        conn.set_read_timeout(Some(read_timeout))?;
        conn.set_write_timeout(Some(read_timeout))?;
        let reply = cmd.query::<Option<(String, String)>>(asking.insert(conn));
        if reply.is_err() {
            *asking = None;
        }
        Ok(reply?.map(|(host, port)| format!("{host}:{port}")))
    }
}
