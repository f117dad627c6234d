//! The raw protocol: the Lua scripts of `scripts/` and typed Rust calls for each state transition.
//!
//! Each script is `common.lua` followed by the transition's own file, compiled in with
//! `include_str!`, invoked by EVALSHA and loaded on NOSCRIPT (after a Redis restart, say).
//! Nothing here waits or retries; `lock.rs` and the background threads build on these calls.

use std::sync::LazyLock;

use redis::Value;

use crate::connection::Conn;
use crate::error::{Error, Result};
use crate::keys::LockKeys;

/// How long a full release's receipt is kept, so a retried release can tell it already happened.
pub(crate) const RECEIPT_TTL_MS: u64 = 10_000;

const COMMON: &str = include_str!("../scripts/common.lua");

/// One compiled-in script: its source and SHA1.
pub(crate) struct LuaScript {
    code: String,
    sha: String,
}

impl LuaScript {
    fn new(body: &str) -> LuaScript {
        let code = format!("{COMMON}\n{body}");
        let sha = redis::Script::new(&code).get_hash().to_string();
        LuaScript { code, sha }
    }

    /// An EVALSHA command for this script with a lock's keys, for single calls and pipelines.
    pub fn cmd(&self, keys: &LockKeys) -> redis::Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&self.sha).arg(5).arg(&keys.all()[..]);
        cmd
    }

    /// Run a command built by [`LuaScript::cmd`], loading the script once if the server lacks it.
    pub fn run(&self, conn: &mut Conn, cmd: &redis::Cmd, during: &'static str) -> Result<Value> {
        match conn.query::<Value>(cmd) {
            Err(e) if is_noscript(&e) => {
                self.load(conn, during)?;
                conn.query::<Value>(cmd)
                    .map_err(|e| Error::from_redis(during, e))
            }
            other => other.map_err(|e| Error::from_redis(during, e)),
        }
    }

    pub fn load(&self, conn: &mut Conn, during: &'static str) -> Result<()> {
        conn.query::<String>(redis::cmd("SCRIPT").arg("LOAD").arg(&self.code))
            .map(|_| ())
            .map_err(|e| Error::from_redis(during, e))
    }
}

pub(crate) fn is_noscript(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

macro_rules! lua {
    ($name:literal) => {
        LazyLock::new(|| LuaScript::new(include_str!(concat!("../scripts/", $name, ".lua"))))
    };
}

pub(crate) static ACQUIRE: LazyLock<LuaScript> = lua!("acquire");
pub(crate) static REENTER: LazyLock<LuaScript> = lua!("reenter");
pub(crate) static RELEASE: LazyLock<LuaScript> = lua!("release");
pub(crate) static RENEW: LazyLock<LuaScript> = lua!("renew");
pub(crate) static LEAVE: LazyLock<LuaScript> = lua!("leave");
pub(crate) static FORCE_UNLOCK: LazyLock<LuaScript> = lua!("force_unlock");
pub(crate) static HEARTBEAT: LazyLock<LuaScript> = lua!("heartbeat");
pub(crate) static STATUS: LazyLock<LuaScript> = lua!("status");

// ---- reply parsing -------------------------------------------------------------------------

pub(crate) fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Okay => Some("OK".into()),
        Value::Int(i) => Some(i.to_string()),
        _ => None,
    }
}

pub(crate) fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        Value::BulkString(_) | Value::SimpleString(_) => {
            text(v)?.parse::<f64>().ok().map(|f| f as i64)
        }
        _ => None,
    }
}

fn array(v: Value, during: &str) -> Result<Vec<Value>> {
    match v {
        Value::Array(items) => Ok(items),
        other => Err(Error::unexpected(&format!("{during}: {other:?}"))),
    }
}

fn field_int(items: &[Value], i: usize, during: &str) -> Result<i64> {
    items
        .get(i)
        .and_then(int)
        .ok_or_else(|| Error::unexpected(&format!("{during}: field {i} of {items:?}")))
}

fn field_text(items: &[Value], i: usize) -> String {
    items.get(i).and_then(text).unwrap_or_default()
}

/// What the acquire script decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Acquire {
    /// The caller holds the lock now, with this token. `server_ms` is the server's clock at the
    /// grant, `pttl_ms` the lease left.
    Granted {
        token: u64,
        server_ms: i64,
        pttl_ms: i64,
    },
    /// `try` mode: held by someone or others are queued.
    Busy { pttl_ms: i64 },
    /// Queued; `pttl_ms` is the holder's lease left.
    Queued { server_ms: i64, pttl_ms: i64 },
}

pub(crate) fn parse_acquire(v: Value) -> Result<Acquire> {
    const D: &str = "acquire";
    let items = array(v, D)?;
    match field_text(&items, 0).as_str() {
        "granted" => Ok(Acquire::Granted {
            token: field_int(&items, 1, D)? as u64,
            server_ms: field_int(&items, 2, D)?,
            pttl_ms: field_int(&items, 3, D)?,
        }),
        "busy" => Ok(Acquire::Busy {
            pttl_ms: field_int(&items, 1, D)?,
        }),
        "queued" => Ok(Acquire::Queued {
            server_ms: field_int(&items, 1, D)?,
            pttl_ms: field_int(&items, 2, D)?,
        }),
        _ => Err(Error::unexpected(&format!("{D}: {items:?}"))),
    }
}

/// What the release script did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Release {
    /// Still held at this depth (a re-entrant level was released).
    StillHeld,
    /// Fully released; granted to this waiter (if any).
    Released { next: Option<String> },
    /// This hold did not own the lock; the current owner, if any.
    NotHeld { holder: Option<String> },
}

pub(crate) fn parse_release(v: Value) -> Result<Release> {
    const D: &str = "release";
    let items = array(v, D)?;
    let opt = |s: String| if s.is_empty() { None } else { Some(s) };
    match field_text(&items, 0).as_str() {
        "held" => Ok(Release::StillHeld),
        "released" => Ok(Release::Released {
            next: opt(field_text(&items, 1)),
        }),
        "not_held" => Ok(Release::NotHeld {
            holder: opt(field_text(&items, 1)),
        }),
        _ => Err(Error::unexpected(&format!("{D}: {items:?}"))),
    }
}

/// What the leave script did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Leave {
    Left,
    Granted {
        token: u64,
        server_ms: i64,
        pttl_ms: i64,
    },
    Passed,
}

pub(crate) fn parse_leave(v: Value) -> Result<Leave> {
    const D: &str = "leave";
    let items = array(v, D)?;
    match field_text(&items, 0).as_str() {
        "left" => Ok(Leave::Left),
        "passed" => Ok(Leave::Passed),
        "granted" => Ok(Leave::Granted {
            token: field_int(&items, 1, D)? as u64,
            server_ms: field_int(&items, 2, D)?,
            pttl_ms: field_int(&items, 3, D)?,
        }),
        _ => Err(Error::unexpected(&format!("{D}: {items:?}"))),
    }
}

/// The janitor's view of one lock after a heartbeat.
pub(crate) struct Heartbeat {
    pub pttl_ms: i64,
    pub told_to_retry: Vec<String>,
}

pub(crate) fn parse_heartbeat(v: Value) -> Result<Heartbeat> {
    const D: &str = "heartbeat";
    let items = array(v, D)?;
    Ok(Heartbeat {
        pttl_ms: field_int(&items, 0, D)?,
        told_to_retry: items[1..].iter().filter_map(text).collect(),
    })
}

/// Raw status of one lock, as the status script returns it.
pub(crate) struct RawStatus {
    pub server_ms: i64,
    pub owner: String,
    pub count: i64,
    pub token: i64,
    pub pttl_ms: i64,
    pub since_ms: i64,
    pub meta: String,
    pub fence: i64,
    /// (flag, arrival time in server microseconds, meta)
    pub queue: Vec<(String, i64, String)>,
}

pub(crate) fn parse_status(v: Value) -> Result<RawStatus> {
    const D: &str = "status";
    let items = array(v, D)?;
    if items.len() < 8 {
        return Err(Error::unexpected(&format!("{D}: {items:?}")));
    }
    let queue = items[8..]
        .chunks(3)
        .map(|c| {
            (
                field_text(c, 0),
                c.get(1).and_then(int).unwrap_or(0),
                field_text(c, 2),
            )
        })
        .collect();
    Ok(RawStatus {
        server_ms: field_int(&items, 0, D)?,
        owner: field_text(&items, 1),
        count: field_int(&items, 2, D)?,
        token: field_int(&items, 3, D)?,
        pttl_ms: field_int(&items, 4, D)?,
        since_ms: field_int(&items, 5, D)?,
        meta: field_text(&items, 6),
        fence: field_int(&items, 7, D)?,
        queue,
    })
}

/// The first wake-up message in a BLPOP reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Wake {
    /// HANDOFF: the lock was granted to this waiter with this token at this server time.
    Handoff { token: u64, server_ms: i64 },
    /// NORMAL: the waiter's queue entry was dropped; run acquire again.
    Retry,
}

pub(crate) fn parse_wake(msg: &str) -> Result<Wake> {
    if msg == "retry" {
        return Ok(Wake::Retry);
    }
    let (token, ms) = msg
        .split_once('|')
        .ok_or_else(|| Error::unexpected(&format!("wake-up {msg:?}")))?;
    match (token.parse::<u64>(), ms.parse::<f64>()) {
        (Ok(token), Ok(ms)) => Ok(Wake::Handoff {
            token,
            server_ms: ms as i64,
        }),
        _ => Err(Error::unexpected(&format!("wake-up {msg:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wake_messages_parse() {
        assert_eq!(parse_wake("retry").unwrap(), Wake::Retry);
        assert_eq!(
            parse_wake("42|1763812345678").unwrap(),
            Wake::Handoff {
                token: 42,
                server_ms: 1763812345678
            }
        );
        assert!(parse_wake("garbage").is_err());
    }

    #[test]
    fn scripts_are_distinct_and_start_with_common() {
        for s in [
            &*ACQUIRE,
            &*REENTER,
            &*RELEASE,
            &*RENEW,
            &*LEAVE,
            &*FORCE_UNLOCK,
            &*HEARTBEAT,
            &*STATUS,
        ] {
            assert!(s.code.starts_with(COMMON));
            assert_eq!(s.sha.len(), 40);
        }
        assert_ne!(ACQUIRE.sha, RELEASE.sha);
    }
}
