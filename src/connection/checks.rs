//! What a client checks of its server before it uses it, and again while it runs: a Redis of
//! a supported version that never evicts keys.

use std::sync::atomic::Ordering;

use redis::Value;

use super::{is_refused_command, Conn, Manager};
use crate::error::{permission_error, Error, Result};
use crate::server_check::{check_eviction_policy, EvictionCheck, UNKNOWN_POLICY_WARNING};

/// Oldest Redis version fairlock supports (BLPOP with sub-second timeouts, HSET with many fields,
/// ZRANGE with scores, script effects replication).
const MIN_VERSION: (u32, u32) = (6, 2);

impl Manager {
    /// Connect once and check that the server is a Redis of a supported version that never
    /// evicts keys; returns the lowest version (major, minor) of its masters, `None` when the
    /// server refuses `INFO` to this user (then nothing can be checked: logged once, and the
    /// periodic [`Manager::check_eviction`] is skipped).
    pub fn check_server(&self) -> Result<Option<(u32, u32)>> {
        let mut conn = self
            .open()
            .map_err(|e| Error::from_redis("connecting", e))?;
        let infos = match conn.query_masters(redis::cmd("INFO").arg("server")) {
            Ok(infos) => infos,
            Err(e) if is_info_refused(&e) => {
                self.info_refused.store(true, Ordering::Relaxed);
                log::warn!(
                    "fairlock: the server refuses INFO to this user ({e}), so fairlock cannot check \
                     its version or that its maxmemory-policy is noeviction, and goes on; make sure \
                     it is noeviction (an evicting server can give a lock two holders), or add +info \
                     to the user's ACL to have it checked"
                );
                return Ok(None);
            }
            Err(e) => {
                return Err(match Error::from_redis("checking the server version", e) {
                    Error::Redis(e) => Error::NotRedis {
                        detail: e.to_string(),
                    },
                    other => other,
                })
            }
        };
        let mut lowest = (u32::MAX, u32::MAX);
        for (node, info) in infos {
            let info = text_of(&info);
            let version = info
                .lines()
                .find_map(|l| l.strip_prefix("redis_version:"))
                .map(|v| v.trim().to_string())
                .ok_or_else(|| Error::NotRedis {
                    detail: format!("INFO server{} has no redis_version", at_node(&node)),
                })?;
            let parsed = parse_version(&version);
            if parsed < MIN_VERSION {
                return Err(Error::UnsupportedServer { version });
            }
            lowest = lowest.min(parsed);
        }
        check_memory(&mut conn, self.accept_eviction)?;
        Ok(Some(lowest))
    }

    /// Check (again) that the server never evicts keys: the janitor calls this now and then, so
    /// a setting changed while the client runs is reported. Skipped when the server refuses
    /// `INFO` to this user (said once, at the first check).
    pub fn check_eviction(&self) -> Result<()> {
        if self.info_refused.load(Ordering::Relaxed) {
            return Ok(());
        }
        let mut conn = self
            .open()
            .map_err(|e| Error::from_redis("checking the server", e))?;
        check_memory(&mut conn, self.accept_eviction)
    }
}

/// Whether the server refused `INFO` to this user (an ACL without it, `rename-command`).
fn is_info_refused(e: &redis::RedisError) -> bool {
    permission_error(e) == Some(false) || is_refused_command(e)
}

/// Every master must be safe (on a Cluster, each one's setting is its own), or the user has
/// accepted eviction (`accept`): then each check warns instead.
fn check_memory(conn: &mut Conn, accept: bool) -> Result<()> {
    let infos = conn
        .query_masters(redis::cmd("INFO").arg("memory"))
        .map_err(|e| Error::from_redis("checking the eviction policy", e))?;
    for (node, info) in infos {
        let info = text_of(&info);
        match check_eviction_policy(&info) {
            Ok(EvictionCheck::Unknown) => {
                log::warn!("fairlock: {UNKNOWN_POLICY_WARNING}{}", at_node(&node))
            }
            Ok(_) => {}
            Err(detail) if accept => log::warn!(
                "fairlock: accepted with danger_accept_eviction: {detail}{}",
                at_node(&node)
            ),
            Err(detail) => {
                return Err(Error::UnsafeServer {
                    detail: format!("{detail}{}", at_node(&node)),
                })
            }
        }
    }
    Ok(())
}

/// A text reply's text (empty for any other reply).
pub(super) fn text_of(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::VerbatimString { text, .. } => text.clone(),
        _ => String::new(),
    }
}

/// " (at node <address>)" for a Cluster's node, nothing for one node.
fn at_node(node: &str) -> String {
    if node.is_empty() {
        String::new()
    } else {
        format!(" (at node {node})")
    }
}

fn parse_version(v: &str) -> (u32, u32) {
    let mut parts = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare() {
        assert!(parse_version("6.2.0") >= MIN_VERSION);
        assert!(parse_version("7.0.15") >= MIN_VERSION);
        assert!(parse_version("6.0.9") < MIN_VERSION);
        assert!(parse_version("garbage") < MIN_VERSION);
    }
}
