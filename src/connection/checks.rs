//! What a client checks of its server before it uses it, and again while it runs: a Redis of
//! a supported version that never evicts keys.

use std::sync::atomic::Ordering;

use redis::Value;

use super::{is_connection_error, is_refused_command, Conn, Manager};
use crate::connection::server_check::{
    check_eviction_policy, EvictionCheck, UNKNOWN_POLICY_WARNING,
};
use crate::error::{permission_error, Error, Result};

/// Oldest Redis version fairlock supports (BLPOP with sub-second timeouts, HSET with many fields,
/// ZRANGE with scores, script effects replication).
const MIN_VERSION: (u32, u32) = (6, 2);

impl Manager {
    /// Connect once and check that the server is a Redis of a supported version that never
    /// evicts keys; returns the lowest version (major, minor) of its masters, `None` when the
    /// server refuses `INFO` to this user. Then the eviction policy is read with `CONFIG GET
    /// maxmemory-policy` (often allowed separately), at once and by every periodic
    /// [`Manager::check_eviction`]; when that is refused too, nothing can be checked: logged once,
    /// kept for [`Manager::skipped_checks`], and the periodic check is skipped.
    pub fn check_server(&self) -> Result<Option<(u32, u32)>> {
        let mut conn = self
            .open()
            .map_err(|e| Error::from_redis("connecting", e))?;
        let infos = match conn.query_masters(redis::cmd("INFO").arg("server")) {
            Ok(infos) => infos,
            Err(e) if is_info_refused(&e) => {
                self.info_refused.store(true, Ordering::Relaxed);
                match check_memory_by_config(&mut conn, self.accept_eviction)? {
                    Ok(()) => {
                        self.config_get_checks.store(true, Ordering::Relaxed);
                        log::info!(
                            "fairlock: the server refuses INFO to this user ({e}): its \
                             maxmemory-policy was read with CONFIG GET, its version is not checked"
                        );
                    }
                    Err(refused) => {
                        let why = format!(
                            "the server refuses INFO ({e}) and CONFIG GET maxmemory-policy \
                             ({refused}) to this user, so fairlock cannot check that its \
                             maxmemory-policy is noeviction (nor its version), and goes on; make \
                             sure it is noeviction (an evicting server can give a lock two \
                             holders), or add +info (or +config|get) to the user's ACL to have it \
                             checked"
                        );
                        log::warn!("fairlock: {why}");
                        let _ = self.skipped_checks.set(why);
                    }
                }
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
    /// a setting changed while the client runs is reported. With `CONFIG GET` when the server
    /// refuses `INFO` to this user; skipped when it refuses both (said once, at the first check).
    pub fn check_eviction(&self) -> Result<()> {
        let by_config = self.info_refused.load(Ordering::Relaxed);
        if by_config && !self.config_get_checks.load(Ordering::Relaxed) {
            return Ok(());
        }
        let mut conn = self
            .open()
            .map_err(|e| Error::from_redis("checking the server", e))?;
        if by_config {
            // refused now (the ACL changed): as if refused at the start
            return check_memory_by_config(&mut conn, self.accept_eviction)?.or(Ok(()));
        }
        check_memory(&mut conn, self.accept_eviction)
    }

    /// Why the server's eviction policy could not be checked, when it could not (the server
    /// refuses both `INFO` and `CONFIG GET` to this user).
    pub fn skipped_checks(&self) -> Option<&str> {
        self.skipped_checks.get().map(String::as_str)
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
    check_policies(
        infos.into_iter().map(|(node, info)| (node, text_of(&info))),
        accept,
    )
}

/// [`check_memory`] with `CONFIG GET maxmemory-policy`, for a user refused `INFO`. The inner
/// `Err` is the server's refusal (a permission, a renamed command, a managed service's
/// restriction): nothing was checked. A connection error is the outer one.
fn check_memory_by_config(
    conn: &mut Conn,
    accept: bool,
) -> Result<std::result::Result<(), redis::RedisError>> {
    let replies = match conn.query_masters(redis::cmd("CONFIG").arg("GET").arg("maxmemory-policy"))
    {
        Ok(replies) => replies,
        Err(e) if is_connection_error(&e) => {
            return Err(Error::from_redis("checking the eviction policy", e))
        }
        Err(e) => return Ok(Err(e)),
    };
    // an INFO memory line made of the reply: [name, value] (RESP2) or {name: value} (RESP3);
    // empty (no such parameter) is an unknown policy
    let infos = replies.into_iter().map(|(node, reply)| {
        let value = match reply {
            Value::Array(items) => items.get(1).map(text_of),
            Value::Map(pairs) => pairs.first().map(|(_, v)| text_of(v)),
            _ => None,
        };
        (
            node,
            format!("maxmemory_policy:{}", value.unwrap_or_default()),
        )
    });
    check_policies(infos, accept).map(Ok)
}

/// The policy in each master's `INFO memory` text (`(node, text)`), checked.
fn check_policies(infos: impl Iterator<Item = (String, String)>, accept: bool) -> Result<()> {
    for (node, info) in infos {
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
