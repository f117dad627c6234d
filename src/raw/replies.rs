//! The replies of the scripts, typed, and their parsers; the wake-up messages.

use redis::Value;

use crate::error::{Error, Result};

/// A grant: the caller holds the lock with this token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The hold's fencing token.
    pub token: u64,
    /// The server's clock when the reply was made (ms).
    pub server_ms: i64,
    /// The lease left on the server (ms).
    pub pttl_ms: i64,
}

/// What the acquire script decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acquire {
    /// The caller holds the lock now.
    Granted(Grant),
    /// [`Mode::Try`](super::Mode::Try): held by someone, or others are queued.
    Busy {
        /// The holder's lease left (ms; 0 when free but others are queued).
        pttl_ms: i64,
    },
    /// Queued: wait on the wake list.
    Queued {
        /// The server's clock when the caller was queued (ms).
        server_ms: i64,
        /// The holder's lease (ms): an upper bound of what it has left, read without a PTTL
        /// call to keep queueing cheap.
        pttl_ms: i64,
        /// The last token handed out when the caller was queued: a grant with a greater token
        /// was made after this request reached Redis (see [`judge_handoff`](super::judge_handoff)).
        last_token: u64,
    },
    /// A newer attempt of this owner reached Redis first: this request came late and did
    /// nothing.
    Stale,
}

/// What the re-enter script did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reenter {
    /// Re-entered; the hold's count is now this.
    Reentered(u32),
    /// The lock is no longer this hold's.
    Lost,
}

/// What the release script did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Release {
    /// An inner level was released; the hold goes on.
    StillHeld,
    /// Fully released (or a retry found its receipt); granted to this waiter, if any.
    Released {
        /// The waiter the lock was handed to.
        next: Option<String>,
    },
    /// This hold did not own the lock; nothing changed.
    NotHeld {
        /// The current owner, if any.
        holder: Option<String>,
    },
}

/// What the leave script did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Leave {
    /// The attempt's queue entry is gone (or was already).
    Left,
    /// [`LeaveMode::Claim`](super::LeaveMode::Claim): the attempt had been granted the lock; the caller holds it.
    Granted(Grant),
    /// [`LeaveMode::Pass`](super::LeaveMode::Pass): the attempt had been granted the lock; it went to the next waiter.
    Passed {
        /// The waiter it went to, if any.
        next: Option<String>,
    },
}

/// What the force-unlock script did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ForceUnlock {
    /// The named hold was released; the lock went to this waiter, if any.
    Released {
        /// The waiter the lock was handed to.
        next: Option<String>,
    },
    /// The named hold does not hold the lock (any more); nothing was released.
    NotHeld {
        /// The current owner and its token, if any.
        holder: Option<(String, u64)>,
    },
}

/// The janitor's view of one lock after a heartbeat.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Heartbeat {
    /// The holder's lease left (ms; 0 when free).
    pub pttl_ms: i64,
    /// The last token handed out when the heartbeat ran (see [`judge_handoff`](super::judge_handoff)).
    pub last_token: u64,
    /// What the heartbeat repaired: a hand-off revoked from a dead grantee, a stranded lock
    /// granted to the live head of its queue (0 to 2).
    pub repairs: u32,
    /// Owners whose attempt had lost its place and were told to retry.
    pub told_to_retry: Vec<String>,
}

/// A snapshot of one lock, as the status script returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawStatus {
    /// The server's clock (ms).
    pub server_ms: i64,
    /// The holder (empty when free).
    pub owner: String,
    /// The holder's re-entry count.
    pub count: i64,
    /// The holder's token.
    pub token: u64,
    /// The holder's lease left (ms).
    pub pttl_ms: i64,
    /// When the hold began (server ms).
    pub since_ms: i64,
    /// The holder's "host|pid|thread".
    pub meta: String,
    /// The last token handed out.
    pub fence: u64,
    /// The hold's lease (ms): what each renewal resets its TTL to (0 when free).
    pub lease_ms: i64,
    /// (owner, arrival time in server us, meta) in queue order.
    pub queue: Vec<(String, i64, String)>,
}

/// A wake-up message popped from a waiter's wake list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wake {
    /// The lock was granted to this attempt with this token at the server's `server_ms`.
    Grant {
        /// The attempt it is for.
        attempt: u64,
        /// The hold's token.
        token: u64,
        /// The server's clock at the grant (ms).
        server_ms: i64,
    },
    /// The attempt's queue entry is gone: run acquire again.
    Retry {
        /// The attempt it is for.
        attempt: u64,
    },
}

impl Wake {
    /// The attempt the message is for.
    pub fn attempt(&self) -> u64 {
        match *self {
            Wake::Grant { attempt, .. } | Wake::Retry { attempt } => attempt,
        }
    }
}

/// Parse a wake-up message (`<thread>|g|<attempt>|<token>|<ms>` or `<thread>|r|<attempt>`; the
/// thread's number lets the scripts remove one thread's messages from its client's list).
///
/// # Errors
/// [`Error::Protocol`] for any other text.
pub fn parse_wake(msg: &str) -> Result<Wake> {
    let bad = || Error::protocol(format!("wake-up message {msg:?}"));
    let mut parts = msg.split('|').skip(1);
    let kind = parts.next().ok_or_else(bad)?;
    let mut num = || -> Result<u64> { parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad) };
    match kind {
        "g" => Ok(Wake::Grant {
            attempt: num()?,
            token: num()?,
            server_ms: num()? as i64,
        }),
        "r" => Ok(Wake::Retry { attempt: num()? }),
        _ => Err(bad()),
    }
}

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
        Value::BulkString(_) | Value::SimpleString(_) => text(v)?.parse::<i64>().ok(),
        _ => None,
    }
}

fn array(v: Value, during: &str) -> Result<Vec<Value>> {
    match v {
        Value::Array(items) => Ok(items),
        other => Err(Error::protocol(format!("{during}: {other:?}"))),
    }
}

fn field_int(items: &[Value], i: usize, during: &str) -> Result<i64> {
    items
        .get(i)
        .and_then(int)
        .ok_or_else(|| Error::protocol(format!("{during}: field {i} of {items:?}")))
}

/// A token (never negative: the scripts hand out whole numbers below 2^53).
fn field_token(items: &[Value], i: usize, during: &str) -> Result<u64> {
    let v = field_int(items, i, during)?;
    u64::try_from(v).map_err(|_| Error::protocol(format!("{during}: token {v} in {items:?}")))
}

fn field_text(items: &[Value], i: usize) -> String {
    items.get(i).and_then(text).unwrap_or_default()
}

fn field_opt(items: &[Value], i: usize) -> Option<String> {
    Some(field_text(items, i)).filter(|s| !s.is_empty())
}

fn grant_at(items: &[Value], i: usize, during: &str) -> Result<Grant> {
    Ok(Grant {
        token: field_token(items, i, during)?,
        server_ms: field_int(items, i + 1, during)?,
        pttl_ms: field_int(items, i + 2, during)?,
    })
}

pub(super) fn parse_acquire(v: Value) -> Result<Acquire> {
    const D: &str = "acquire";
    let items = array(v, D)?;
    match field_text(&items, 0).as_str() {
        "granted" => Ok(Acquire::Granted(grant_at(&items, 1, D)?)),
        "busy" => Ok(Acquire::Busy {
            pttl_ms: field_int(&items, 1, D)?,
        }),
        "queued" => Ok(Acquire::Queued {
            server_ms: field_int(&items, 1, D)?,
            pttl_ms: field_int(&items, 2, D)?,
            last_token: field_token(&items, 3, D)?,
        }),
        "stale" => Ok(Acquire::Stale),
        _ => Err(Error::protocol(format!("{D}: {items:?}"))),
    }
}

pub(super) fn parse_reenter(v: Value) -> Result<Reenter> {
    match int(&v) {
        Some(0) => Ok(Reenter::Lost),
        Some(n) if n > 0 => Ok(Reenter::Reentered(n.min(u32::MAX as i64) as u32)),
        _ => Err(Error::protocol(format!("re-enter: {v:?}"))),
    }
}

pub(super) fn parse_renew(v: Value) -> Result<bool> {
    match int(&v) {
        Some(n) => Ok(n == 1),
        None => Err(Error::protocol(format!("renew: {v:?}"))),
    }
}

pub(super) fn parse_release(v: Value) -> Result<Release> {
    const D: &str = "release";
    let items = array(v, D)?;
    match field_text(&items, 0).as_str() {
        "held" => Ok(Release::StillHeld),
        "released" => Ok(Release::Released {
            next: field_opt(&items, 1),
        }),
        "not_held" => Ok(Release::NotHeld {
            holder: field_opt(&items, 1),
        }),
        _ => Err(Error::protocol(format!("{D}: {items:?}"))),
    }
}

pub(super) fn parse_leave(v: Value) -> Result<Leave> {
    const D: &str = "leave";
    let items = array(v, D)?;
    match field_text(&items, 0).as_str() {
        "left" => Ok(Leave::Left),
        "passed" => Ok(Leave::Passed {
            next: field_opt(&items, 1),
        }),
        "granted" => Ok(Leave::Granted(grant_at(&items, 1, D)?)),
        _ => Err(Error::protocol(format!("{D}: {items:?}"))),
    }
}

pub(super) fn parse_force_unlock(v: Value) -> Result<ForceUnlock> {
    const D: &str = "force_unlock";
    let items = array(v, D)?;
    match field_text(&items, 0).as_str() {
        "released" => Ok(ForceUnlock::Released {
            next: field_opt(&items, 1),
        }),
        "not_held" => Ok(ForceUnlock::NotHeld {
            holder: field_opt(&items, 1)
                .map(|o| (o, items.get(2).and_then(int).unwrap_or(0) as u64)),
        }),
        _ => Err(Error::protocol(format!("{D}: {items:?}"))),
    }
}

pub(super) fn parse_heartbeat(v: Value) -> Result<Heartbeat> {
    const D: &str = "heartbeat";
    let items = array(v, D)?;
    Ok(Heartbeat {
        pttl_ms: field_int(&items, 0, D)?,
        last_token: field_token(&items, 1, D)?,
        repairs: field_int(&items, 2, D)?.clamp(0, i64::from(u32::MAX)) as u32,
        told_to_retry: items.iter().skip(3).filter_map(text).collect(),
    })
}

pub(super) fn parse_status(v: Value) -> Result<RawStatus> {
    const D: &str = "status";
    let items = array(v, D)?;
    if items.len() < 9 {
        return Err(Error::protocol(format!("{D}: {items:?}")));
    }
    let queue = items[9..]
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
        token: field_int(&items, 3, D)?.max(0) as u64,
        pttl_ms: field_int(&items, 4, D)?,
        since_ms: field_int(&items, 5, D)?,
        meta: field_text(&items, 6),
        fence: field_int(&items, 7, D)?.max(0) as u64,
        lease_ms: field_int(&items, 8, D)?,
        queue,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wake_messages_parse() {
        assert_eq!(parse_wake("3|r|7").unwrap(), Wake::Retry { attempt: 7 });
        assert_eq!(
            parse_wake("3|g|7|1763812345678901|1763812345678").unwrap(),
            Wake::Grant {
                attempt: 7,
                token: 1763812345678901,
                server_ms: 1763812345678
            }
        );
        for bad in ["garbage", "retry", "3|g|1|2", "3|r|x", "r|7", ""] {
            assert!(parse_wake(bad).is_err(), "{bad}");
        }
    }

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn reply(items: &[&str]) -> Value {
        Value::Array(
            items
                .iter()
                .map(|s| match s.parse::<i64>() {
                    Ok(n) => Value::Int(n),
                    Err(_) => bulk(s),
                })
                .collect(),
        )
    }

    #[test]
    fn every_acquire_reply_parses_and_nothing_else_does() {
        assert_eq!(
            parse_acquire(reply(&["granted", "17", "1000", "2500"])).unwrap(),
            Acquire::Granted(Grant {
                token: 17,
                server_ms: 1000,
                pttl_ms: 2500
            })
        );
        assert_eq!(
            parse_acquire(reply(&["busy", "900"])).unwrap(),
            Acquire::Busy { pttl_ms: 900 }
        );
        // the last token comes as text (a token may be beyond what an integer reply keeps exact)
        let queued = Value::Array(vec![
            bulk("queued"),
            Value::Int(5),
            Value::Int(30000),
            bulk("9007199254740991"),
        ]);
        assert_eq!(
            parse_acquire(queued).unwrap(),
            Acquire::Queued {
                server_ms: 5,
                pttl_ms: 30000,
                last_token: 9007199254740991
            }
        );
        assert_eq!(parse_acquire(reply(&["stale"])).unwrap(), Acquire::Stale);
        for bad in [
            reply(&["granted", "17"]),
            reply(&["granted", "-1", "1", "1"]),
            reply(&["queued", "5", "1"]),
            reply(&["weird"]),
            reply(&[]),
            Value::Int(1),
            Value::Nil,
        ] {
            assert!(
                matches!(parse_acquire(bad.clone()), Err(Error::Protocol { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn release_leave_and_force_unlock_replies_parse() {
        assert_eq!(
            parse_release(reply(&["held", "1"])).unwrap(),
            Release::StillHeld
        );
        assert_eq!(
            parse_release(reply(&["released", ""])).unwrap(),
            Release::Released { next: None }
        );
        assert_eq!(
            parse_release(reply(&["not_held", "c:2"])).unwrap(),
            Release::NotHeld {
                holder: Some("c:2".into())
            }
        );
        assert_eq!(parse_leave(reply(&["left"])).unwrap(), Leave::Left);
        assert_eq!(
            parse_leave(reply(&["passed", "c:3"])).unwrap(),
            Leave::Passed {
                next: Some("c:3".into())
            }
        );
        assert!(matches!(
            parse_leave(reply(&["granted", "5", "6", "7"])).unwrap(),
            Leave::Granted(Grant { token: 5, .. })
        ));
        assert_eq!(
            parse_force_unlock(reply(&["not_held", "c:4", "99"])).unwrap(),
            ForceUnlock::NotHeld {
                holder: Some(("c:4".into(), 99))
            }
        );
        assert!(parse_release(reply(&["gone"])).is_err());
        assert!(parse_leave(Value::Nil).is_err());
    }

    #[test]
    fn short_replies_parse_by_their_number() {
        assert_eq!(parse_reenter(Value::Int(0)).unwrap(), Reenter::Lost);
        assert_eq!(parse_reenter(Value::Int(3)).unwrap(), Reenter::Reentered(3));
        assert_eq!(
            parse_reenter(Value::Int(i64::MAX)).unwrap(),
            Reenter::Reentered(u32::MAX)
        );
        assert!(parse_reenter(Value::Int(-1)).is_err());
        assert!(parse_renew(Value::Int(1)).unwrap());
        assert!(!parse_renew(Value::Int(0)).unwrap());
        assert!(parse_renew(Value::Nil).is_err());
        let hb = parse_heartbeat(reply(&["1500", "42", "1", "c:1", "c:2"])).unwrap();
        assert_eq!((hb.pttl_ms, hb.last_token, hb.repairs), (1500, 42, 1));
        assert_eq!(hb.told_to_retry, ["c:1", "c:2"]);
        assert!(parse_heartbeat(reply(&["1500"])).is_err());
        assert!(parse_heartbeat(reply(&["1500", "42"])).is_err());
    }

    #[test]
    fn a_status_reply_parses_with_its_queue() {
        let s = parse_status(reply(&[
            "10000", "c:1", "2", "77", "2500", "4000", "h|1|t", "77", "30000", "c:2", "9000000",
            "h|2|u",
        ]))
        .unwrap();
        assert_eq!(
            (s.owner.as_str(), s.count, s.token, s.fence, s.lease_ms),
            ("c:1", 2, 77, 77, 30_000)
        );
        assert_eq!(s.queue, [("c:2".to_string(), 9000000, "h|2|u".to_string())]);
        assert!(parse_status(reply(&["10000", "c:1"])).is_err());
        // a reply of the status script before the lease was added (8 fields) is refused
        assert!(parse_status(reply(&["10000", "", "0", "0", "0", "0", "", "5"])).is_err());
    }
}
