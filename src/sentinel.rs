//! A Sentinel group as the target of a client's connections: which master they go to.
//!
//! The redis crate's `SentinelClient` finds a master and checks its `ROLE`; it takes the first
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
//! crate's client still does the discovery and the `ROLE` check: each sentinel has one of its
//! own, and the connection goes through one that named the agreed master.

use std::time::Duration;

use parking_lot::Mutex;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{ErrorKind, RedisError, RedisResult};

/// One sentinel of the URL.
struct Sentinel {
    /// `redis://host:port/`
    url: String,
    /// The redis crate's client asking this sentinel alone (discovery and the `ROLE` check).
    client: Mutex<SentinelClient>,
    /// A kept connection for `SENTINEL GET-MASTER-ADDR-BY-NAME`.
    asking: Mutex<Option<redis::Connection>>,
}

/// The sentinels of a client's URL and the master its connections go to.
pub(crate) struct SentinelTarget {
    master_name: String,
    sentinels: Vec<Sentinel>,
    /// `host:port` of the master connections go to now (see `Manager::follow_master`).
    pub master: Mutex<Option<String>>,
}

/// A master that more than half of the sentinels name.
pub(crate) struct Agreed {
    /// `host:port`
    pub addr: String,
    /// The indexes of the sentinels that named it.
    voters: Vec<usize>,
}

impl SentinelTarget {
    /// The sentinels at `urls` (`redis://host:port/` each), monitoring `master_name`; `nodes`:
    /// how to reach the data nodes (their credentials).
    ///
    /// # Errors
    /// The redis crate's, for a URL it cannot use.
    pub fn new(
        master_name: &str,
        urls: Vec<String>,
        nodes: Option<SentinelNodeConnectionInfo>,
    ) -> RedisResult<SentinelTarget> {
        let sentinels = urls
            .into_iter()
            .map(|url| {
                let client = SentinelClient::build(
                    vec![url.as_str()],
                    master_name.to_string(),
                    nodes.clone(),
                    SentinelServerType::Master,
                )?;
                Ok(Sentinel {
                    url,
                    client: Mutex::new(client),
                    asking: Mutex::new(None),
                })
            })
            .collect::<RedisResult<Vec<_>>>()?;
        Ok(SentinelTarget {
            master_name: master_name.to_string(),
            sentinels,
            master: Mutex::new(None),
        })
    }

    pub fn master_name(&self) -> &str {
        &self.master_name
    }

    /// The master that more than half of the sentinels name now. The sentinels are asked in
    /// order until one master has the majority or none can have it any more.
    ///
    /// # Errors
    /// A `MasterNameNotFoundBySentinel` error (which fairlock treats as a failover under way)
    /// saying what each sentinel answered, when no master has a majority.
    pub fn agreed_master(
        &self,
        connect_timeout: Duration,
        read_timeout: Duration,
    ) -> RedisResult<Agreed> {
        let n = self.sentinels.len();
        let needed = n / 2 + 1;
        let mut named: Vec<Agreed> = Vec::new();
        let mut answers = Vec::new();
        for (i, sentinel) in self.sentinels.iter().enumerate() {
            match sentinel.ask(&self.master_name, connect_timeout, read_timeout) {
                Ok(Some(addr)) => {
                    answers.push(format!("{} names {addr}", sentinel.url));
                    let index = match named.iter().position(|a| a.addr == addr) {
                        Some(index) => index,
                        None => {
                            named.push(Agreed {
                                addr,
                                voters: Vec::new(),
                            });
                            named.len() - 1
                        }
                    };
                    named[index].voters.push(i);
                    if named[index].voters.len() >= needed {
                        return Ok(named.swap_remove(index));
                    }
                }
                Ok(None) => answers.push(format!(
                    "{} knows no master {}",
                    sentinel.url, self.master_name
                )),
                Err(e) => answers.push(format!("{}: {e}", sentinel.url)),
            }
            let best = named.iter().map(|a| a.voters.len()).max().unwrap_or(0);
            if best + (n - i - 1) < needed {
                break;
            }
        }
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

    /// A client for the `agreed` master, found by the redis crate's client of a sentinel that
    /// named it (`SENTINEL MASTERS`, then `ROLE` on the node), and its `host:port`.
    ///
    /// # Errors
    /// The crate's error when no such sentinel gives a master, or a
    /// `MasterNameNotFoundBySentinel` error when what they give is another master (they
    /// changed their minds meanwhile: a failover under way).
    pub fn client_for(&self, agreed: &Agreed) -> RedisResult<(redis::Client, String)> {
        let mut last = None;
        for &i in &agreed.voters {
            match self.sentinels[i].client.lock().get_client() {
                Ok(client) => {
                    let addr = client.get_connection_info().addr().to_string();
                    if addr == agreed.addr {
                        return Ok((client, addr));
                    }
                    last = Some(RedisError::from((
                        ErrorKind::MasterNameNotFoundBySentinel,
                        "the sentinels changed their master",
                        format!(
                            "{} named {} as master {}, then gave {addr}",
                            self.sentinels[i].url, agreed.addr, self.master_name
                        ),
                    )));
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            RedisError::from((
                ErrorKind::MasterNameNotFoundBySentinel,
                "no sentinel named the master",
            ))
        }))
    }
}

impl Sentinel {
    /// `host:port` of the master this sentinel names (`None`: it knows no such master), on
    /// the kept connection, or on a new one when that failed.
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
        let mut asking = self.asking.lock();
        if let Some(conn) = asking.as_mut() {
            if let Ok(reply) = cmd.query::<Option<(String, String)>>(conn) {
                return Ok(reply.map(|(host, port)| format!("{host}:{port}")));
            }
        }
        *asking = None;
        let conn =
            redis::Client::open(self.url.as_str())?.get_connection_with_timeout(connect_timeout)?;
        conn.set_read_timeout(Some(read_timeout))?;
        conn.set_write_timeout(Some(read_timeout))?;
        let conn = asking.insert(conn);
        let reply: Option<(String, String)> = cmd.query(conn)?;
        Ok(reply.map(|(host, port)| format!("{host}:{port}")))
    }
}
