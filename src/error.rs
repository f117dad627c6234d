//! The one error type of fairlock.

use std::fmt;

use crate::cycle::{Blocking, Deadlock};
use crate::kind::{Held, HoldKind};

/// Everything that can go wrong in fairlock. Each message says what happened and what to do.
///
/// Match on the variant to react (e.g. retry on [`Error::Connection`]); print it for a person.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The lock name cannot be used as a key (empty, too long, braces or control characters).
    InvalidName {
        /// The rejected name (escaped for printing).
        name: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// A configuration value is out of range.
    InvalidConfig {
        /// The setting, as named on the builder.
        setting: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The Redis URL could not be parsed.
    InvalidUrl {
        /// The URL as given, with its password replaced by `***` ([`redact_url`]).
        ///
        /// [`redact_url`]: crate::redact_url
        url: String,
        /// What the parser said.
        reason: String,
    },
    /// Redis could not be reached, the connection broke, or it did not answer in time; also a
    /// wait that the network kept from completing: several grants in a row that arrived after
    /// their lease had run out (a stalled network or process), or connections the server
    /// closed again and again (restarts). Nothing is held; retrying later may work.
    Connection {
        /// What fairlock was doing.
        during: &'static str,
        /// What went wrong, for people.
        detail: String,
        /// The underlying error (the redis crate's or the pool's), when there is one; also
        /// [`std::error::Error::source`].
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// The server answered, but it is not a Redis server (or speaks another protocol).
    NotRedis {
        /// What came back.
        detail: String,
    },
    /// The server is a Redis older than 6.2, which fairlock needs.
    UnsupportedServer {
        /// The version the server reported.
        version: String,
    },
    /// A key that fairlock uses for this lock holds data of another type, written by someone else.
    /// fairlock leaves that data untouched.
    ForeignData {
        /// The key that holds the other program's data, when the server named it.
        key: Option<String>,
        /// The server's explanation, naming the key.
        detail: String,
    },
    /// The lock is not held by this hold (a release or renewal by a non-owner, or after the lease
    /// ran out and someone else may have taken the lock). Nothing was changed.
    NotHeld {
        /// The name of the lock, semaphore or read/write lock.
        name: String,
        /// What the hold was.
        kind: HoldKind,
        /// Who holds it now (owner id), if anyone.
        holder: Option<String>,
    },
    /// A grant was acknowledged by fewer replicas than [`Config::replica_acks`] asks for within
    /// its timeout, so a failover could lose it and let a second owner in: the attempt gave it
    /// up (the lock went to the next waiter, or is free) instead of holding it. Retry later;
    /// check that the replicas are up and connected.
    ///
    /// [`Config::replica_acks`]: crate::Config::replica_acks
    NotReplicated {
        /// The name of the lock, semaphore or read/write lock.
        name: String,
        /// What was granted.
        kind: HoldKind,
        /// Replicas that acknowledged the grant in time.
        acked: u32,
        /// Replicas asked for.
        wanted: u32,
    },
    /// Redis returned an error fairlock did not expect.
    Redis(redis::RedisError),
    /// A reply did not have the shape the protocol defines: a server that is not Redis, a
    /// script of another fairlock version under the same key prefix, or a bug in fairlock.
    Protocol {
        /// What was expected and what came instead.
        detail: String,
    },
    /// The operating system refused something fairlock needs (starting its background threads).
    Io {
        /// What fairlock was doing.
        during: &'static str,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The process forked after the client was created: the child shares the parent's
    /// connections and owner identity but has no watchdog or janitor, so it must not use the
    /// client. Create a new [`LockClient`](crate::LockClient) in the child.
    Forked,
    /// The server's configuration makes locks unsafe (e.g. a `maxmemory-policy` that may evict
    /// a lock's keys). Nothing was changed.
    UnsafeServer {
        /// The setting, its value, and what to do.
        detail: String,
    },
    /// The wait was given up by [`WaitCanceller::abandon`](crate::WaitCanceller::abandon) from
    /// another thread: nothing is held (a grant that reached the wait was passed on).
    Abandoned {
        /// The name of the lock, semaphore or read/write lock.
        name: String,
        /// What was waited for.
        kind: HoldKind,
    },
    /// With [`LockClientBuilder::deadlock_detection`](crate::LockClientBuilder::deadlock_detection)
    /// on: this thread's wait closed a cycle of waits (it waited for a lock whose holder waits,
    /// directly or through others, for what this thread holds), confirmed by two readings, and
    /// it was the youngest wait in it ([`Deadlock::youngest_wait`]), so it was refused to break
    /// the cycle. It left the queue as a timed-out wait does: nothing was taken, and the other
    /// members are served in turn. Release what this thread holds (drop its guards), then
    /// retry; taking locks in one fixed order keeps cycles from forming.
    Deadlock {
        /// The name of the lock, semaphore or read/write lock this thread waited for.
        name: String,
        /// What it waited for.
        kind: HoldKind,
        /// The cycle: each lock, its holder (host, pid, thread) and what that holder waits for.
        deadlock: Box<Deadlock>,
    },
    /// The TLS handshake failed: the server's certificate is not trusted (another CA, expired,
    /// or it names another host), the server refused the client certificate, or the server does
    /// not speak TLS on that port. Retrying cannot help: fix the CA bundle, the certificates or
    /// the URL.
    Tls {
        /// What fairlock was doing.
        during: &'static str,
        /// What the TLS library said.
        detail: String,
    },
    /// The name is in use as a semaphore of another capacity, or as another kind (a semaphore
    /// against a read/write lock), by the clients that hold or wait for it now: nothing was
    /// changed. Make the handle with the stored capacity, or change the capacity for everyone
    /// with [`Semaphore::set_capacity`](crate::Semaphore::set_capacity).
    CapacityMismatch {
        /// The semaphore's (or read/write lock's) name.
        name: String,
        /// What the name is in use as: "semaphore" or "read/write lock".
        stored_kind: &'static str,
        /// The capacity stored with it.
        stored: u64,
        /// What this handle asked for: its kind and capacity.
        asked_kind: &'static str,
        /// The capacity this handle was made with.
        asked: u64,
    },
    /// The calling thread asked for a read or the write of a [`RwLock`](crate::RwLock) while it
    /// holds that lock's write, or for the write while it holds a read of it, through the same
    /// client: the new request would wait behind the thread's own hold for ever. Refused at
    /// once, nothing changed; there is no downgrade (write to read) or upgrade (read to write):
    /// drop the guard first, then ask for the other side.
    WouldDeadlock {
        /// The read/write lock's name.
        name: String,
        /// What the thread holds: "read" or "write".
        held: &'static str,
        /// What it asked for: "read" or "write".
        asked: &'static str,
    },
    /// The server refused the credentials, or the Redis user may not run a command or touch a
    /// key that fairlock needs (an ACL): nothing was changed. The message names what was
    /// refused; docs/deployments.md ("Restricted users") gives the ACL line fairlock needs.
    PermissionDenied {
        /// What fairlock was doing.
        during: &'static str,
        /// What the server refused (its own message, which names the command or key, never a
        /// password).
        detail: String,
        /// True when the credentials were refused (a wrong or expired password or token, a
        /// disabled user), false when the user lacks a permission.
        credentials: bool,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidName { name, reason } => write!(
                f,
                "invalid lock name {name:?}: {reason}; use 1 to {} bytes without braces or control characters",
                crate::limits::MAX_NAME_LEN
            ),
            Error::InvalidConfig { setting, reason } => {
                write!(f, "invalid setting `{setting}`: {reason}")
            }
            Error::InvalidUrl { url, reason } => write!(
                f,
                "invalid Redis URL {url:?}: {reason}; expected redis://[user:password@]host[:port][/db]"
            ),
            Error::Connection { during, detail, .. } => write!(
                f,
                "Redis connection failed while {during}: {detail}; check that the server is running and reachable, then retry"
            ),
            Error::NotRedis { detail } => write!(
                f,
                "the server did not answer like Redis ({detail}); check the host and port in the URL"
            ),
            Error::UnsupportedServer { version } => write!(
                f,
                "Redis {version} is too old: fairlock needs Redis 6.2 or newer"
            ),
            Error::ForeignData { detail, .. } => write!(f, "{detail}"),
            Error::CapacityMismatch {
                name,
                stored_kind,
                stored,
                asked_kind,
                asked,
            } if stored_kind == asked_kind => write!(
                f,
                "{stored_kind} {name:?} is in use with capacity {stored}, not {asked}: nothing was changed; make the handle with capacity {stored}, or change the capacity with Semaphore::set_capacity"
            ),
            Error::CapacityMismatch {
                name,
                stored_kind,
                asked_kind,
                ..
            } => write!(
                f,
                "{name:?} is in use as a {stored_kind}, not a {asked_kind}: nothing was changed; choose another name"
            ),
            Error::WouldDeadlock { name, held, asked } => write!(
                f,
                "this thread holds the {held} of read/write lock {name:?} and asked for the {asked}, which would wait on its own {held} for ever: refused, nothing was changed; there is no downgrade or upgrade: drop the {held} guard first, then take the {asked}"
            ),
            Error::NotReplicated {
                name,
                kind,
                acked,
                wanted,
            } => write!(
                f,
                "the grant of {} reached {acked} of the {wanted} replicas asked for in time, so a failover could lose it; it was given up (passed on): check the replicas, then retry",
                Held { kind: *kind, name }
            ),
            Error::NotHeld { name, kind, holder } => {
                let held = Held { kind: *kind, name };
                let (was, by) = (held.was(), if *kind == HoldKind::Lock { "guard" } else { "hold" });
                match holder {
                    Some(h) => write!(
                        f,
                        "{held} {was} not held by this {by} (held by {h}); its lease may have run out: nothing was changed"
                    ),
                    None => write!(
                        f,
                        "{held} {was} not held by this {by} (free); its lease may have run out: nothing was changed"
                    ),
                }
            }
            Error::Redis(e) => write!(f, "unexpected Redis error: {e}"),
            Error::Protocol { detail } => write!(
                f,
                "unexpected reply from Redis ({detail}); is another fairlock version using the same key prefix?"
            ),
            Error::Io { during, source } => write!(f, "{during} failed: {source}"),
            Error::Forked => write!(
                f,
                "this LockClient was created before the process forked; create a new LockClient in the child process"
            ),
            Error::UnsafeServer { detail } => write!(f, "unsafe Redis configuration: {detail}"),
            Error::Abandoned { name, kind } => write!(
                f,
                "the wait for {} was abandoned (WaitCanceller::abandon); nothing is held",
                Held { kind: *kind, name }
            ),
            Error::Deadlock {
                name,
                kind,
                deadlock,
            } => {
                write!(
                    f,
                    "deadlock: the wait for {} was refused to break a cycle of {} waits, as the youngest in it:",
                    Held { kind: *kind, name },
                    deadlock.members.len()
                )?;
                for (i, m) in deadlock.members.iter().enumerate() {
                    let how = match m.blocking {
                        Blocking::QueuedAhead => "is wanted, ahead in its queue, by",
                        _ => "is held by",
                    };
                    write!(
                        f,
                        "{} {} {how} {} pid {} thread {:?} (owner {}), which waits for {}",
                        if i == 0 { "" } else { ";" },
                        Held {
                            kind: m.lock.kind,
                            name: &m.lock.name
                        },
                        m.holder.host,
                        m.holder.pid,
                        m.holder.thread,
                        m.holder.owner,
                        Held {
                            kind: m.waits_for.kind,
                            name: &m.waits_for.name
                        },
                    )?;
                }
                write!(
                    f,
                    ". Nothing was taken and the queue place was given up: release what this thread holds, then retry (taking locks in one fixed order avoids cycles)"
                )
            }
            Error::Tls { during, detail } => write!(
                f,
                "TLS failed while {during} ({detail}); check that the URL's port serves TLS, that the CA bundle (tls_ca_file, --tls-ca) signed the server's certificate, that the certificate is in date and names the host in the URL (or use danger_accept_invalid_hostnames), and, for mutual TLS, the client certificate"
            ),
            Error::PermissionDenied {
                during,
                detail,
                credentials: true,
            } => write!(
                f,
                "Redis refused the credentials while {during} ({detail}); check the user name and password (or token) in the URL or the credentials provider"
            ),
            Error::PermissionDenied { during, detail, .. } => write!(
                f,
                "the Redis user may not do what fairlock needs while {during} ({detail}); grant it the commands of the ACL line in docs/deployments.md (\"Restricted users\"), with a key pattern that covers the key prefix (~fairlock:* for the default one)"
            ),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Redis(e) => Some(e),
            Error::Io { source, .. } => Some(source),
            Error::Connection {
                source: Some(source),
                ..
            } => Some(source.as_ref()),
            _ => None,
        }
    }
}

/// What kind of failure an [`Error`] is, and so what a caller can do about it
/// ([`Error::kind`]). New kinds may be added.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A name, setting or URL the caller gave is unusable ([`Error::InvalidName`],
    /// [`Error::InvalidConfig`], [`Error::InvalidUrl`]), or disagrees with the capacity stored
    /// for a semaphore ([`Error::CapacityMismatch`]), or the call would wait on the calling
    /// thread's own hold ([`Error::WouldDeadlock`]): fix the input or the call; retrying
    /// cannot help.
    InvalidInput,
    /// Redis is unreachable, failing over, or could not make a grant safe just now
    /// ([`Error::Connection`], [`Error::NotReplicated`]): retrying later may work.
    Unavailable,
    /// The server cannot serve fairlock as configured ([`Error::NotRedis`],
    /// [`Error::UnsupportedServer`], [`Error::UnsafeServer`], [`Error::Tls`]): fix the server,
    /// the URL or the TLS settings.
    Server,
    /// Another program's data sits at one of the lock's keys ([`Error::ForeignData`]): choose
    /// another lock name or key prefix.
    ForeignData,
    /// The hold was not (or no longer) the lock's owner ([`Error::NotHeld`]): its lease ran out
    /// or it was force-released; whatever it protected may have been touched by another owner.
    NotHeld,
    /// The wait was given up by a [`WaitCanceller`](crate::WaitCanceller)
    /// ([`Error::Abandoned`]): an outcome the caller asked for, not a failure.
    Abandoned,
    /// The wait was refused to break a deadlock ([`Error::Deadlock`]): release what the thread
    /// holds before retrying; the same call made while holding the same locks may close the
    /// cycle again.
    Deadlock,
    /// This client cannot be used in this process any more ([`Error::Forked`]), or the
    /// operating system refused a thread ([`Error::Io`]).
    Client,
    /// The server refused the credentials or the Redis user lacks a permission fairlock needs
    /// ([`Error::PermissionDenied`]): fix the credentials or the user's ACL.
    Permission,
    /// Redis answered in a way fairlock did not expect ([`Error::Redis`],
    /// [`Error::Protocol`]): another fairlock version under the same key prefix, a server
    /// that restricts commands, or a bug; the message says what came back.
    Unexpected,
}

impl Error {
    /// The kind of failure, for callers that react by kind rather than by variant.
    ///
    /// ```
    /// use fairlock::{Error, ErrorKind, HoldKind};
    /// let e = Error::NotReplicated { name: "job".into(), kind: HoldKind::Lock, acked: 0, wanted: 1 };
    /// assert_eq!(e.kind(), ErrorKind::Unavailable);
    /// assert!(e.is_retryable());
    /// ```
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidName { .. }
            | Error::InvalidConfig { .. }
            | Error::InvalidUrl { .. }
            | Error::CapacityMismatch { .. }
            | Error::WouldDeadlock { .. } => ErrorKind::InvalidInput,
            Error::Connection { .. } | Error::NotReplicated { .. } => ErrorKind::Unavailable,
            Error::NotRedis { .. }
            | Error::UnsupportedServer { .. }
            | Error::UnsafeServer { .. }
            | Error::Tls { .. } => ErrorKind::Server,
            Error::ForeignData { .. } => ErrorKind::ForeignData,
            Error::NotHeld { .. } => ErrorKind::NotHeld,
            Error::Abandoned { .. } => ErrorKind::Abandoned,
            Error::Deadlock { .. } => ErrorKind::Deadlock,
            Error::Forked | Error::Io { .. } => ErrorKind::Client,
            Error::PermissionDenied { .. } => ErrorKind::Permission,
            Error::Redis(_) | Error::Protocol { .. } => ErrorKind::Unexpected,
        }
    }

    /// Whether the same call may succeed later unchanged: the [`ErrorKind::Unavailable`]
    /// errors (Redis unreachable or failing over, a grant too few replicas acknowledged).
    /// Nothing is held after such an error.
    pub fn is_retryable(&self) -> bool {
        self.kind() == ErrorKind::Unavailable
    }

    /// True when the error is [`Error::Connection`]: Redis could not be reached, the
    /// connection broke, or it did not answer in time. See also [`Error::is_retryable`],
    /// which covers every error worth retrying.
    pub fn is_connection(&self) -> bool {
        matches!(self, Error::Connection { .. })
    }

    /// Whether this is a reply that did not come within the read timeout.
    pub(crate) fn is_timeout(&self) -> bool {
        matches!(
            self,
            Error::Connection { source: Some(source), .. }
                if source.downcast_ref::<redis::RedisError>().is_some_and(|e| e.is_timeout())
        )
    }

    /// Whether this is Redis answering `LOADING`: restarted, it is still reading its data.
    pub(crate) fn is_loading(&self) -> bool {
        matches!(
            self,
            Error::Connection { source: Some(source), .. }
                if source.downcast_ref::<redis::RedisError>().is_some_and(|e| {
                    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::BusyLoading)
                })
        )
    }

    /// Classify an error from the redis crate. `during` names the operation for the message.
    pub(crate) fn from_redis(during: &'static str, e: redis::RedisError) -> Error {
        if is_tls_failure(&e) {
            return Error::Tls {
                during,
                detail: e.to_string(),
            };
        }
        if e.is_io_error()
            || e.is_timeout()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
        {
            let detail = if e.is_timeout() {
                format!(
                    "no reply in time ({e}); the server may be overloaded, stalled, or not Redis, or a URL's TLS (rediss://) may not match the port's"
                )
            } else {
                e.to_string()
            };
            return Error::Connection {
                during,
                detail,
                source: Some(Box::new(e)),
            };
        }
        // A restarted Redis answers LOADING until it has read its AOF or RDB file: the server is
        // unavailable for a moment, which is as retryable as a refused connection.
        if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::BusyLoading) {
            return Error::Connection {
                during,
                detail: "Redis is still loading its data after a restart".into(),
                source: Some(Box::new(e)),
            };
        }
        // Through a Sentinel group, no master named by more than half of the sentinels: a
        // failover under way, or a URL that names the wrong sentinels or master
        if e.kind() == redis::ErrorKind::MasterNameNotFoundBySentinel {
            return Error::Connection {
                during,
                detail: format!(
                    "{}; a failover may be under way, or the URL names the wrong sentinels or master",
                    e.detail().unwrap_or("the sentinels name no master")
                ),
                source: Some(Box::new(e)),
            };
        }
        // A failover in progress: the node was demoted (READONLY, and UNBLOCKED for a blocked
        // command), or a replica lost its master (MASTERDOWN). The master moves on; retry later.
        if let Some(detail) = failover_error(&e) {
            return Error::Connection {
                during,
                detail: format!("{detail} ({e}); a failover or a slot migration is under way"),
                source: Some(Box::new(e)),
            };
        }
        // An ACL refusal (NOPERM), or credentials refused (WRONGPASS; NOAUTH when none were
        // sent to a server that needs them)
        if let Some(credentials) = permission_error(&e) {
            return Error::PermissionDenied {
                during,
                detail: e.to_string(),
                credentials,
            };
        }
        // A script's `redis.error_reply('FOREIGN key ...')` arrives as a server error with code
        // FOREIGN, which the redis crate displays as `"FOREIGN": key ...`: match on the code.
        if e.code() == Some("FOREIGN") {
            let detail = e
                .detail()
                .unwrap_or("a key of this lock holds foreign data")
                .to_string();
            return Error::ForeignData {
                key: foreign_key(&detail),
                detail,
            };
        }
        // Outside the scripts (which refuse foreign data themselves), e.g. `is_locked`'s read.
        if e.code() == Some("WRONGTYPE") {
            return Error::ForeignData {
                key: None,
                detail: format!("a key of this lock holds data of another type ({e}); another program uses it: choose another name or key prefix"),
            };
        }
        match e.kind() {
            // bytes that are not RESP: whatever answered is not Redis
            redis::ErrorKind::Parse => Error::NotRedis {
                detail: e.to_string(),
            },
            // RESP of the wrong shape for the request: a protocol fault, not a wrong address
            redis::ErrorKind::UnexpectedReturnType => Error::Protocol {
                detail: format!("while {during}: {e}"),
            },
            _ => Error::Redis(e),
        }
    }

    pub(crate) fn protocol(detail: String) -> Error {
        Error::Protocol { detail }
    }

    /// An invalid URL, named without its password.
    /// When a user name or password looks typed with a reserved character as it is, the
    /// reason says how to write it.
    pub(crate) fn invalid_url(url: &str, reason: String) -> Error {
        let reason = if crate::redact::has_unencoded_user_info(url) {
            format!(
                "{reason}; a user name or password must have the characters a URL reserves \
                 percent-encoded: / as %2F, ? as %3F, # as %23, @ as %40, % as %25"
            )
        } else {
            reason
        };
        Error::InvalidUrl {
            url: crate::redact::redact_url(url),
            reason,
        }
    }
}

/// The key a script's refusal names: its message is `key <key> holds <what>; ...` (see
/// `refuse` in src/raw/lua/common.lua; what a key holds never says " holds ").
fn foreign_key(detail: &str) -> Option<String> {
    let rest = detail.strip_prefix("key ")?;
    let end = rest.rfind(" holds ")?;
    Some(rest[..end].to_string())
}

/// What a server error says about a failover in progress, if it is one: the node was demoted to a
/// replica (READONLY; UNBLOCKED for a command blocked on it) or lost its master (MASTERDOWN); on
/// a Cluster, the slot moved or is moving (MOVED, ASK, TRYAGAIN: a blocked BLPOP is answered
/// MOVED when its slot moves) or the cluster cannot serve it now (CLUSTERDOWN); through a
/// Sentinel group, no master is named by more than half of the sentinels.
pub(crate) fn failover_error(e: &redis::RedisError) -> Option<&'static str> {
    use redis::{ErrorKind, ServerErrorKind};
    match e.kind() {
        ErrorKind::Server(ServerErrorKind::ReadOnly) => Some("the node is a replica now"),
        ErrorKind::Server(ServerErrorKind::MasterDown) => Some("the node lost its master"),
        ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::Ask) => {
            Some("the lock's hash slot moved to another node")
        }
        ErrorKind::Server(ServerErrorKind::TryAgain) => {
            Some("the lock's hash slot is moving between nodes")
        }
        ErrorKind::Server(ServerErrorKind::ClusterDown) => {
            Some("the cluster cannot serve the lock's hash slot now (CLUSTERDOWN)")
        }
        _ if e.code() == Some("UNBLOCKED") => Some("the node changed role under a blocked command"),
        // no master named by a majority of the sentinels (see `sentinel.rs`)
        ErrorKind::MasterNameNotFoundBySentinel => {
            Some("the sentinels name no master that a majority of them agree on")
        }
        _ => None,
    }
}

/// Whether `e` is a failed TLS handshake (an untrusted, expired or misnamed certificate, a
/// refused client certificate, a server that does not speak TLS there) rather than a network
/// failure. rustls' errors reach us as I/O errors, known by their text.
pub(crate) fn is_tls_failure(e: &redis::RedisError) -> bool {
    if !e.is_io_error() {
        return false;
    }
    let text = e.to_string();
    [
        "invalid peer certificate",
        "corrupt message",
        "received fatal alert",
        "peer is incompatible",
        "peer sent no certificates",
        "HandshakeFailure",
        "InvalidContentType",
        "InvalidMessage",
    ]
    .iter()
    .any(|needle| text.contains(needle))
}

/// Whether `e` is a refusal by the server's ACL: `Some(true)` for refused credentials,
/// `Some(false)` for a missing permission.
pub(crate) fn permission_error(e: &redis::RedisError) -> Option<bool> {
    use redis::{ErrorKind, ServerErrorKind};
    match e.kind() {
        ErrorKind::Server(ServerErrorKind::NoPerm) => Some(false),
        ErrorKind::AuthenticationFailed => Some(true),
        _ if matches!(e.code(), Some("WRONGPASS" | "NOAUTH")) => Some(true),
        _ => None,
    }
}

/// The result type of fairlock.
pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadlock_says_the_cycle_the_refused_wait_and_what_to_do() {
        use crate::cycle::{DeadlockMember, LockRef};
        use crate::kind::Origin;
        use std::time::Duration;
        let member = |lock: &str, host: &str, owner: &str, waits: &str| DeadlockMember {
            lock: LockRef {
                name: lock.into(),
                kind: HoldKind::Lock,
            },
            holder: Origin {
                owner: owner.into(),
                host: host.into(),
                pid: 7,
                thread: "worker".into(),
            },
            blocking: Blocking::Holds {
                fencing_token: 3,
                permits: 1,
            },
            waits_for: LockRef {
                name: waits.into(),
                kind: HoldKind::Lock,
            },
            waiting_for: Duration::from_secs(1),
            queued_at: Duration::from_secs(100),
        };
        let e = Error::Deadlock {
            name: "b".into(),
            kind: HoldKind::Lock,
            deadlock: Box::new(Deadlock {
                members: vec![
                    member("b", "web-1", "c1:1", "a"),
                    member("a", "web-2", "c2:1", "b"),
                ],
            }),
        };
        let text = e.to_string();
        assert_eq!(
            text,
            "deadlock: the wait for lock \"b\" was refused to break a cycle of 2 waits, as the youngest in it: \
             lock \"b\" is held by web-1 pid 7 thread \"worker\" (owner c1:1), which waits for lock \"a\"; \
             lock \"a\" is held by web-2 pid 7 thread \"worker\" (owner c2:1), which waits for lock \"b\". \
             Nothing was taken and the queue place was given up: release what this thread holds, then retry \
             (taking locks in one fixed order avoids cycles)"
        );
        assert_eq!(e.kind(), ErrorKind::Deadlock);
        assert!(!e.is_retryable());
    }

    /// The error the redis crate makes of the server's error reply `-<line>`.
    fn server_error(line: &str) -> redis::RedisError {
        let reply = redis::parse_redis_value(format!("-{line}\r\n").as_bytes())
            .expect("an error reply parses");
        reply
            .extract_error()
            .expect_err("an error reply is an error")
    }

    #[test]
    fn a_scripts_refusal_becomes_foreign_data_naming_its_key() {
        let e = Error::from_redis(
            "acquiring",
            server_error("FOREIGN key fairlock:{a b}:queue holds a zset whose members are not fairlock owners; another program uses this key"),
        );
        match &e {
            Error::ForeignData { key, .. } => {
                assert_eq!(key.as_deref(), Some("fairlock:{a b}:queue"))
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(e.kind(), ErrorKind::ForeignData);
        assert!(!e.is_retryable());
    }

    #[test]
    fn the_key_of_a_refusal_is_read_only_from_the_scripts_form() {
        assert_eq!(
            foreign_key("key p:{x} holds a list but fairlock expects a hash"),
            Some("p:{x}".into())
        );
        assert_eq!(foreign_key("something else"), None);
        assert_eq!(foreign_key("key without the verb"), None);
    }

    #[test]
    fn unavailability_is_retryable_and_nothing_else_is() {
        let unavailable = [
            Error::Connection {
                during: "x",
                detail: "y".into(),
                source: None,
            },
            Error::NotReplicated {
                name: "n".into(),
                kind: HoldKind::Write,
                acked: 0,
                wanted: 1,
            },
            Error::from_redis(
                "x",
                redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset)),
            ),
        ];
        for e in unavailable {
            assert!(e.is_retryable(), "{e:?}");
        }
        let final_ = [
            Error::InvalidName {
                name: "".into(),
                reason: "empty",
            },
            Error::invalid_url("redis://u:pw@h:x/", "bad port".into()),
            Error::NotHeld {
                name: "n".into(),
                kind: HoldKind::Lock,
                holder: None,
            },
            Error::Abandoned {
                name: "n".into(),
                kind: HoldKind::Semaphore,
            },
            Error::Forked,
            Error::protocol("odd".into()),
            Error::from_redis("x", server_error("ERR odd")),
        ];
        for e in final_ {
            assert!(!e.is_retryable(), "{e:?}");
        }
    }

    #[test]
    fn failovers_are_connection_errors() {
        for code in [
            "READONLY",
            "MASTERDOWN",
            "TRYAGAIN",
            "CLUSTERDOWN",
            "LOADING",
        ] {
            let e = Error::from_redis("x", server_error(&format!("{code} now")));
            assert!(e.is_connection(), "{code}: {e:?}");
        }
    }

    #[test]
    fn an_invalid_url_is_named_without_its_password() {
        let e = Error::invalid_url("redis://u:supersecret@h:notaport/", "bad port".into());
        assert!(!e.to_string().contains("supersecret"), "{e}");
        assert!(!format!("{e:?}").contains("supersecret"), "{e:?}");
        assert!(e.to_string().contains("redis://u:***@h:notaport/"), "{e}");
    }
}
