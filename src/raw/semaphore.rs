//! The semaphore's calls (see `docs/semaphores.md`): a weighted fair
//! semaphore, and a read/write lock as one (a write takes every permit of [`RW_CAPACITY`]).
//! Built as [`RawLock`](super::RawLock)'s are: each call a [`Call`] to run, pipeline, lose or
//! repeat.

use std::sync::LazyLock;
use std::time::Duration;

use redis::Value;

use super::scripts::{
    SEM_ACQUIRE, SEM_CAPACITY, SEM_HEARTBEAT, SEM_LEAVE, SEM_RELEASE, SEM_RENEW, SEM_STATUS,
};
use super::{millis, Call, Mode, Script, Settings};
use crate::error::{Error, Result};

/// The capacity of a read/write lock: a read takes one permit, a write all of them.
pub const RW_CAPACITY: u64 = 1 << 30;

/// What a name's permits are for; stored with them, so that a semaphore and a read/write lock
/// never share a name by mistake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SemKind {
    /// A counting semaphore.
    Semaphore,
    /// A read/write lock.
    ReadWrite,
}

impl SemKind {
    fn as_str(self) -> &'static str {
        match self {
            SemKind::Semaphore => "sem",
            SemKind::ReadWrite => "rw",
        }
    }
}

/// The reply to [`RawSemaphore::acquire`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SemAcquire {
    /// The permits are this attempt's, with this token; `pttl`: the lease left (at most the
    /// lease asked for).
    Granted {
        /// The hold's fencing token.
        token: u64,
        /// The server's clock at the reply (ms).
        server_ms: i64,
        /// The lease left.
        pttl: Duration,
    },
    /// `try`: the permits are not free now, or others wait.
    Busy {
        /// Permits held now.
        used: u64,
        /// The capacity.
        capacity: u64,
    },
    /// Queued; a grant comes as a wake-up.
    Queued {
        /// The server's clock at the reply (ms).
        server_ms: i64,
        /// The last token handed out before this queueing.
        last_token: u64,
    },
    /// A newer attempt of this owner exists, or this one has ended: nothing done.
    Stale,
    /// The name is in use with another kind or capacity.
    Mismatch {
        /// The kind stored ("sem" or "rw").
        kind: String,
        /// The capacity stored.
        capacity: u64,
    },
}

/// The reply to [`RawSemaphore::release`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SemRelease {
    /// Given back (or given back before: a receipt); `grants`: waiters granted by it.
    Released {
        /// Waiters granted by this release.
        grants: u64,
    },
    /// No hold of that attempt with that token.
    NotHeld,
}

/// The reply to [`RawSemaphore::leave`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SemLeave {
    /// The attempt's place (if any) is gone; nothing was granted to it.
    Left,
    /// A hold granted to the attempt was given back; `grants`: waiters granted by that.
    Passed {
        /// Waiters granted by the leave.
        grants: u64,
    },
    /// `claim`: a hold granted to the attempt is kept, and is the caller's.
    Granted {
        /// The hold's fencing token.
        token: u64,
        /// The server's clock at the reply (ms).
        server_ms: i64,
        /// The lease left.
        pttl: Duration,
    },
}

/// The reply to [`RawSemaphore::set_capacity`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SemCapacity {
    /// Stored; `grants`: waiters granted by a raise.
    Set {
        /// Waiters granted by the change.
        grants: u64,
    },
    /// The name is in use with another kind.
    Mismatch {
        /// The kind stored ("sem" or "rw").
        kind: String,
        /// The capacity stored.
        capacity: u64,
    },
}

/// One hold in a [`SemStatus`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SemHold {
    /// The hold's id: `<owner>#<attempt>`.
    pub id: String,
    /// Its fencing token.
    pub token: u64,
    /// Permits it holds.
    pub permits: u64,
    /// Lease left on the server.
    pub pttl: Duration,
    /// Its lease (what a renewal extends it to).
    pub lease: Duration,
    /// `host|pid|thread` of the holder.
    pub meta: String,
}

/// One waiter in a [`SemStatus`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SemWaiter {
    /// The waiting owner.
    pub owner: String,
    /// When its first attempt reached Redis (server µs).
    pub since_us: u64,
    /// Permits it wants.
    pub permits: u64,
    /// `host|pid|thread` of the waiter.
    pub meta: String,
}

/// The reply to [`RawSemaphore::status`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SemStatus {
    /// The server's clock (ms).
    pub server_ms: i64,
    /// The kind stored ("sem", "rw"; empty without state).
    pub kind: String,
    /// The capacity stored, while the name has state.
    pub capacity: Option<u64>,
    /// Permits held by live holds.
    pub used: u64,
    /// The last token handed out.
    pub last_token: u64,
    /// Live holds.
    pub holds: Vec<SemHold>,
    /// Waiters in queue order.
    pub waiters: Vec<SemWaiter>,
}

/// The reply to [`RawSemaphore::heartbeat`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SemHeartbeat {
    /// Permits held now.
    pub used: u64,
    /// The capacity, while the name has state.
    pub capacity: Option<u64>,
    /// Waiters granted by this heartbeat (freed by expiry or revoked hand-offs).
    pub grants: u64,
    /// The last token handed out (a grant with a greater one came after the heartbeat ran).
    pub last_token: u64,
    /// Time until the next hold's lease ends, if anyone holds.
    pub next_expiry: Option<Duration>,
    /// Owners of the attempts told to run acquire again (their places are gone).
    pub told_to_retry: Vec<String>,
}

/// The keys and settings of one semaphore (or read/write lock): builds its calls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawSemaphore {
    keys: [String; 6],
    kind: SemKind,
    capacity: u64,
    settings: Settings,
}

impl RawSemaphore {
    /// The semaphore `name` of `capacity` permits (a read/write lock: [`RW_CAPACITY`]) under key
    /// prefix `prefix`.
    ///
    /// # Errors
    /// [`Error::InvalidName`] / [`Error::InvalidConfig`] for a name or prefix that cannot be a
    /// key, or a capacity of 0.
    pub fn new(
        prefix: &str,
        name: &str,
        kind: SemKind,
        capacity: u64,
        settings: Settings,
    ) -> Result<RawSemaphore> {
        crate::keys::validate_prefix(prefix)?;
        crate::keys::validate_name(name)?;
        if capacity == 0 {
            return Err(Error::InvalidConfig {
                setting: "capacity",
                reason: "must be at least 1".into(),
            });
        }
        let base = format!("{prefix}:{{{name}}}:sem");
        let keys = ["", ":fence", ":queue", ":waiters", ":leases", ":handoffs"]
            .map(|suffix| format!("{base}{suffix}"));
        Ok(RawSemaphore {
            keys,
            kind,
            capacity,
            settings,
        })
    }

    /// The semaphore's keys (hash, fence, queue, waiters, leases, hand-offs; wake lists are
    /// `<hash>:wake:<client id>`).
    pub fn key_names(&self) -> [&str; 6] {
        [
            &self.keys[0],
            &self.keys[1],
            &self.keys[2],
            &self.keys[3],
            &self.keys[4],
            &self.keys[5],
        ]
    }

    /// The wake list `owner`'s messages go to.
    pub fn wake_key(&self, owner: &str) -> String {
        let client = owner.rsplit_once(':').map_or(owner, |(c, _)| c);
        format!("{}:wake:{client}", self.keys[0])
    }

    fn call<T: 'static>(
        &self,
        script: &'static LazyLock<Script>,
        during: &'static str,
        parse: fn(Value) -> Result<T>,
    ) -> Call<T> {
        Call::new(script, &self.settings, &self.keys, during, parse)
    }

    /// An attempt to take `permits` (`Mode::Wait`: or queue for them).
    pub fn acquire(
        &self,
        owner: &str,
        attempt: u64,
        permits: u64,
        lease: Duration,
        mode: Mode,
        meta: &str,
    ) -> Call<SemAcquire> {
        let mut c = self.call(&SEM_ACQUIRE, "acquiring permits", parse_acquire);
        c.cmd
            .arg(owner)
            .arg(attempt)
            .arg(permits)
            .arg(millis(lease).max(1))
            .arg(match mode {
                Mode::Try => "try",
                Mode::Wait => "wait",
            })
            .arg(meta)
            .arg(self.kind.as_str())
            .arg(self.capacity);
        c
    }

    /// Give back the hold of `attempt` with `token`; `mark` when a copy of its acquire may
    /// still arrive (it went unanswered, or was sent twice).
    pub fn release(&self, owner: &str, attempt: u64, token: u64, mark: bool) -> Call<SemRelease> {
        let mut c = self.call(&SEM_RELEASE, "releasing permits", parse_release);
        c.cmd
            .arg(owner)
            .arg(attempt)
            .arg(token)
            .arg(if mark { "mark" } else { "" });
        c
    }

    /// An operator's release of another's hold: as [`RawSemaphore::release`], but it leaves
    /// no receipt, so the holder's own release (and a repeat) finds the hold gone.
    pub fn force_release(&self, owner: &str, attempt: u64, token: u64) -> Call<SemRelease> {
        let mut c = self.call(&SEM_RELEASE, "releasing permits by force", parse_release);
        c.cmd.arg(owner).arg(attempt).arg(token).arg("force");
        c
    }

    /// Extend the lease of the hold of `attempt` with `token` (never shortening it); true when
    /// held.
    pub fn renew(&self, owner: &str, attempt: u64, token: u64, lease: Duration) -> Call<bool> {
        let mut c = self.call(&SEM_RENEW, "renewing permits", parse_renew);
        c.cmd
            .arg(owner)
            .arg(attempt)
            .arg(token)
            .arg(millis(lease).max(1));
        c
    }

    /// Give up a waiting attempt: a hold granted to it meanwhile is passed on, or with `claim`
    /// kept and returned.
    pub fn leave(&self, owner: &str, attempt: u64, mark: bool, claim: bool) -> Call<SemLeave> {
        let mut c = self.call(&SEM_LEAVE, "leaving the queue", parse_leave);
        c.cmd
            .arg(owner)
            .arg(attempt)
            .arg(if mark { "mark" } else { "" })
            .arg(if claim { "claim" } else { "" });
        c
    }

    /// Holds and waiters, read in one atomic step.
    pub fn status(&self) -> Call<SemStatus> {
        self.call(&SEM_STATUS, "reading the semaphore", parse_status)
    }

    /// Store `capacity` as the name's capacity (see `sem_capacity.lua`).
    pub fn set_capacity(&self, capacity: u64) -> Call<SemCapacity> {
        let mut c = self.call(&SEM_CAPACITY, "changing the capacity", parse_capacity);
        c.cmd.arg(self.kind.as_str()).arg(capacity);
        c
    }

    /// The kind of this semaphore.
    pub fn kind(&self) -> SemKind {
        self.kind
    }

    /// The capacity this handle asks with.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The same semaphore, asking with another capacity.
    pub fn with_capacity(&self, capacity: u64) -> RawSemaphore {
        RawSemaphore {
            capacity,
            ..self.clone()
        }
    }

    /// A client's waiting attempts, refreshed (and expiry, revocation and grants on the way).
    pub fn heartbeat<'a>(
        &self,
        waiting: impl IntoIterator<Item = (&'a str, u64)>,
    ) -> Call<SemHeartbeat> {
        let mut c = self.call(&SEM_HEARTBEAT, "heartbeating waiters", parse_heartbeat);
        for (owner, attempt) in waiting {
            c.cmd.arg(owner).arg(attempt);
        }
        c
    }
}

fn items(v: Value) -> Result<Vec<Value>> {
    match v {
        Value::Array(items) => Ok(items),
        other => Err(Error::protocol(format!(
            "a semaphore script replied {other:?}"
        ))),
    }
}

fn text(v: &Value) -> Result<String> {
    match v {
        Value::BulkString(b) => Ok(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Ok(s.clone()),
        Value::Int(i) => Ok(i.to_string()),
        other => Err(Error::protocol(format!(
            "a semaphore script replied {other:?} where text was expected"
        ))),
    }
}

fn num(v: Option<&Value>) -> Result<u64> {
    let v = v.ok_or_else(|| Error::protocol("a semaphore script's reply is short".into()))?;
    text(v)?
        .parse()
        .map_err(|_| Error::protocol(format!("a semaphore script replied {v:?} for a number")))
}

fn parse_acquire(v: Value) -> Result<SemAcquire> {
    let v = items(v)?;
    let tag = text(v.first().unwrap_or(&Value::Nil))?;
    Ok(match tag.as_str() {
        "granted" => SemAcquire::Granted {
            token: num(v.get(1))?,
            server_ms: num(v.get(2))? as i64,
            pttl: Duration::from_millis(num(v.get(3))?),
        },
        "busy" => SemAcquire::Busy {
            used: num(v.get(1))?,
            capacity: num(v.get(2))?,
        },
        "queued" => SemAcquire::Queued {
            server_ms: num(v.get(1))? as i64,
            last_token: num(v.get(2))?,
        },
        "stale" => SemAcquire::Stale,
        "mismatch" => SemAcquire::Mismatch {
            kind: text(v.get(1).unwrap_or(&Value::Nil))?,
            capacity: num(v.get(2))?,
        },
        other => return Err(Error::protocol(format!("sem_acquire replied {other:?}"))),
    })
}

fn parse_release(v: Value) -> Result<SemRelease> {
    let v = items(v)?;
    match text(v.first().unwrap_or(&Value::Nil))?.as_str() {
        "released" => Ok(SemRelease::Released {
            grants: num(v.get(1))?,
        }),
        "not_held" => Ok(SemRelease::NotHeld),
        other => Err(Error::protocol(format!("sem_release replied {other:?}"))),
    }
}

fn parse_renew(v: Value) -> Result<bool> {
    match v {
        Value::Int(i) => Ok(i == 1),
        other => Err(Error::protocol(format!("sem_renew replied {other:?}"))),
    }
}

fn parse_heartbeat(v: Value) -> Result<SemHeartbeat> {
    let v = items(v)?;
    let capacity = text(v.get(1).unwrap_or(&Value::Nil))?;
    Ok(SemHeartbeat {
        used: num(v.first())?,
        capacity: capacity.parse().ok(),
        grants: num(v.get(2))?,
        last_token: num(v.get(3))?,
        next_expiry: match v.get(4) {
            Some(Value::Int(ms)) if *ms >= 0 => Some(Duration::from_millis(*ms as u64)),
            _ => None,
        },
        told_to_retry: v.iter().skip(5).map(text).collect::<Result<_>>()?,
    })
}

fn parse_leave(v: Value) -> Result<SemLeave> {
    let v = items(v)?;
    match text(v.first().unwrap_or(&Value::Nil))?.as_str() {
        "left" => Ok(SemLeave::Left),
        "passed" => Ok(SemLeave::Passed {
            grants: num(v.get(1))?,
        }),
        "granted" => Ok(SemLeave::Granted {
            token: num(v.get(1))?,
            server_ms: num(v.get(2))? as i64,
            pttl: Duration::from_millis(num(v.get(3))?),
        }),
        other => Err(Error::protocol(format!("sem_leave replied {other:?}"))),
    }
}

fn parse_capacity(v: Value) -> Result<SemCapacity> {
    let v = items(v)?;
    match text(v.first().unwrap_or(&Value::Nil))?.as_str() {
        "set" => Ok(SemCapacity::Set {
            grants: num(v.get(1))?,
        }),
        "mismatch" => Ok(SemCapacity::Mismatch {
            kind: text(v.get(1).unwrap_or(&Value::Nil))?,
            capacity: num(v.get(2))?,
        }),
        other => Err(Error::protocol(format!("sem_capacity replied {other:?}"))),
    }
}

fn parse_status(v: Value) -> Result<SemStatus> {
    let v = items(v)?;
    let opt = |i: usize| -> Result<String> { text(v.get(i).unwrap_or(&Value::Nil)) };
    // a count the reply cannot hold is a broken reply, not an allocation
    let holds_n = usize::try_from(num(v.get(5))?)
        .ok()
        .filter(|n| {
            n.checked_mul(6)
                .is_some_and(|c| c <= v.len().saturating_sub(6))
        })
        .ok_or_else(|| {
            Error::protocol(format!(
                "sem_status replied a count beyond its reply: {v:?}"
            ))
        })?;
    let mut holds = Vec::with_capacity(holds_n);
    for i in 0..holds_n {
        let b = 6 + i * 6;
        holds.push(SemHold {
            id: opt(b)?,
            token: num(v.get(b + 1))?,
            permits: num(v.get(b + 2))?,
            pttl: Duration::from_millis(num(v.get(b + 3))?),
            lease: Duration::from_millis(num(v.get(b + 4))?),
            meta: opt(b + 5)?,
        });
    }
    let rest = v.get(6 + holds_n * 6..).unwrap_or(&[]);
    let mut waiters = Vec::with_capacity(rest.len() / 4);
    for w in rest.chunks(4) {
        waiters.push(SemWaiter {
            owner: text(w.first().unwrap_or(&Value::Nil))?,
            // a zset score: a float as text
            since_us: text(w.get(1).unwrap_or(&Value::Nil))?
                .parse::<f64>()
                .map_or(0, |f| f.max(0.0) as u64),
            permits: num(w.get(2))?,
            meta: text(w.get(3).unwrap_or(&Value::Nil))?,
        });
    }
    Ok(SemStatus {
        server_ms: num(v.first())? as i64,
        kind: opt(1)?,
        capacity: opt(2)?.parse().ok(),
        used: num(v.get(3))?,
        last_token: num(v.get(4))?,
        holds,
        waiters,
    })
}
