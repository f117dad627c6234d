//! The raw protocol: one typed call per state transition of a lock, each one atomic Lua script of
//! `scripts/`. Like `lock_api`'s `RawMutex` beneath `Mutex`: [`FairLock`](crate::FairLock),
//! [`LockGuard`](crate::LockGuard), the watchdog and the janitor reach Redis only through it, and
//! tools (the protocol fuzzer among them) can drive the scripts directly, with many logical
//! clients on one connection.
//!
//! A call is built first and run later ([`Call`]): its command can be sent on any connection, in
//! a pipeline, twice, or late, and its reply parsed apart from sending it. Nothing here waits,
//! retries or keeps state; every script is safe to run again or late (see each script's header
//! and `scripts/common.lua`).
//!
//! Owners are strings `<client id>:<thread number>`; an *attempt* is a number that grows with
//! every acquire call of a client: scripts act on an owner's queue entry or hold only for the
//! attempt they were sent for, so a request that arrives after its sender moved on does nothing.

use std::fmt;
use std::sync::LazyLock;
use std::time::Duration;

use redis::{ConnectionLike, Value};

use crate::connection::Conn;
use crate::error::{Error, Result};
use crate::keys::LockKeys;

/// The client's lease arithmetic for a hand-off (see its module), public here so the protocol
/// fuzzer drives the very decisions the client makes.
pub use crate::lease_estimate::{judge_handoff, Handoff, Witness};

const COMMON: &str = include_str!("../scripts/common.lua");
/// Helpers of the scripts that take the lock or change the queue (after `COMMON`).
const STATE: &str = include_str!("../scripts/state.lua");

/// How calls reach the scripts on a server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Runner {
    /// Redis 7 and later: every script is a function of one library ([`library_code`]), loaded
    /// once per server (`FUNCTION LOAD`) and called with `FCALL`. Lua creates the helpers once,
    /// at load, instead of on every call, which saves the server a tenth to a third of a call's
    /// time (`scripts/lua-cost.sh`).
    #[default]
    Functions,
    /// Redis 6.2, which has no functions: each script is sent whole once (`SCRIPT LOAD`) and
    /// called with `EVALSHA`.
    Eval,
}

impl Runner {
    /// The runner a server of this version (major, minor) supports best.
    pub fn for_version(version: (u32, u32)) -> Runner {
        if version >= (7, 0) {
            Runner::Functions
        } else {
            Runner::Eval
        }
    }
}

/// Settings every script of one lock client is run with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// How long the fence (the last token handed out) is kept after the last grant. Tokens stay
    /// increasing without it (they are seeded from the server clock); it only keeps them dense.
    pub fence_ttl: Duration,
    /// How long a waiter lives without a heartbeat before others purge it as dead.
    pub waiter_timeout: Duration,
    /// How the calls reach the scripts (`FCALL` or `EVALSHA`).
    pub runner: Runner,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            fence_ttl: Duration::from_secs(7 * 24 * 3600),
            waiter_timeout: Duration::from_secs(3),
            runner: Runner::default(),
        }
    }
}

/// A transition's source: its file in `scripts/`, and whether it uses `state.lua`'s helpers.
struct Source {
    name: &'static str,
    state: bool,
    body: &'static str,
}

macro_rules! source {
    ($name:literal, $state:expr) => {
        Source {
            name: $name,
            state: $state,
            body: include_str!(concat!("../scripts/", $name, ".lua")),
        }
    };
}

const ACQUIRE_SOURCE: Source = source!("acquire", true);
const REENTER_SOURCE: Source = source!("reenter", false);
const RELEASE_SOURCE: Source = source!("release", true);
const RENEW_SOURCE: Source = source!("renew", false);
const LEAVE_SOURCE: Source = source!("leave", true);
const FORCE_UNLOCK_SOURCE: Source = source!("force_unlock", true);
const HEARTBEAT_SOURCE: Source = source!("heartbeat", true);
const STATUS_SOURCE: Source = source!("status", true);

const SOURCES: [&Source; 8] = [
    &ACQUIRE_SOURCE,
    &REENTER_SOURCE,
    &RELEASE_SOURCE,
    &RENEW_SOURCE,
    &LEAVE_SOURCE,
    &FORCE_UNLOCK_SOURCE,
    &HEARTBEAT_SOURCE,
    &STATUS_SOURCE,
];

impl Source {
    /// What a run does first: set the run's keys and settings (and state.lua's per-run state).
    fn reset(&self) -> &'static str {
        if self.state {
            "reset(KEYS, ARGV)\nreset_state()\n"
        } else {
            "reset(KEYS, ARGV)\n"
        }
    }
}

/// The function library of every script (Redis 7+): its name carries a hash of its code, so
/// clients of different fairlock versions can share a server, each calling its own functions.
struct Library {
    name: String,
    code: String,
}

static LIBRARY: LazyLock<Library> = LazyLock::new(|| {
    let helpers = format!("{COMMON}\n{STATE}\n");
    let mut hashed = helpers.clone();
    for s in SOURCES {
        hashed.push_str(s.reset());
        hashed.push_str(s.body);
    }
    let name = format!("fairlock_{}", &redis::Script::new(&hashed).get_hash()[..12]);
    let mut code = format!("#!lua name={name}\n{helpers}");
    for s in SOURCES {
        code.push_str(&format!(
            "\nredis.register_function('{name}_{}', function(KEYS, ARGV)\n{}{}\nend)\n",
            s.name,
            s.reset(),
            s.body,
        ));
    }
    Library { name, code }
});

/// The function library's name (`fairlock_<hash of its code>`).
pub fn library_name() -> &'static str {
    &LIBRARY.name
}

/// The function library's code (`#!lua name=fairlock_<hash>` ...), as `FUNCTION LOAD` takes it.
pub fn library_code() -> &'static str {
    &LIBRARY.code
}

/// Load the function library into the server (every master of a Cluster); `FCALL` fails with
/// "Function not found" until then. Loading it again is harmless: the same name is the same code.
///
/// # Errors
/// [`Error::Connection`] when Redis cannot be reached; the server's own error when it refuses
/// (a Redis older than 7, or an ACL user without the `FUNCTION` command).
pub fn load_library(conn: &mut dyn ConnectionLike) -> Result<()> {
    redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(&LIBRARY.code)
        .query::<Value>(conn)
        .map(|_| ())
        .map_err(|e| Error::from_redis("loading the function library", e))
}

/// One compiled-in script: the `EVALSHA` form (`common.lua`, `state.lua` where it needs it, then
/// the transition's own file) with its SHA1, and the name of its function in the library.
pub struct Script {
    name: &'static str,
    code: String,
    sha: String,
    function: String,
}

/// The script's name, SHA1 and function name (not its code).
impl fmt::Debug for Script {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Script")
            .field("name", &self.name)
            .field("sha", &self.sha)
            .field("function", &self.function)
            .finish_non_exhaustive()
    }
}

impl Script {
    fn new(source: &Source) -> Script {
        let state = if source.state { STATE } else { "" };
        let code = format!(
            "{COMMON}\n{state}\n{reset}{body}",
            reset = source.reset(),
            body = source.body
        );
        let sha = redis::Script::new(&code).get_hash().to_string();
        let function = format!("{}_{}", LIBRARY.name, source.name);
        Script {
            name: source.name,
            code,
            sha,
            function,
        }
    }

    /// The transition's name, as its file in `scripts/` is called ("acquire", "release", ...).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The SHA1 that `EVALSHA` names the script by.
    pub fn sha(&self) -> &str {
        &self.sha
    }

    /// The script as `EVALSHA` runs it (helpers, `reset`, then the transition's own file).
    pub fn code(&self) -> &str {
        &self.code
    }

    /// The name that `FCALL` calls the script by (`fairlock_<library hash>_<name>`).
    pub fn function(&self) -> &str {
        &self.function
    }

    /// Load the script into the server's script cache (EVALSHA fails with NOSCRIPT until then).
    ///
    /// # Errors
    /// [`Error::Connection`] when Redis cannot be reached.
    pub fn load(&self, conn: &mut dyn ConnectionLike) -> Result<()> {
        redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(&self.code)
            .query::<String>(conn)
            .map(|_| ())
            .map_err(|e| Error::from_redis("loading a script", e))
    }

    /// Load what `runner` calls this script through: the script, or the whole library.
    fn load_for(&self, runner: Runner, conn: &mut dyn ConnectionLike) -> Result<()> {
        match runner {
            Runner::Eval => self.load(conn),
            Runner::Functions => load_library(conn),
        }
    }
}

macro_rules! script {
    ($source:expr) => {
        LazyLock::new(|| Script::new(&$source))
    };
}

static ACQUIRE: LazyLock<Script> = script!(ACQUIRE_SOURCE);
static REENTER: LazyLock<Script> = script!(REENTER_SOURCE);
static RELEASE: LazyLock<Script> = script!(RELEASE_SOURCE);
static RENEW: LazyLock<Script> = script!(RENEW_SOURCE);
static LEAVE: LazyLock<Script> = script!(LEAVE_SOURCE);
static FORCE_UNLOCK: LazyLock<Script> = script!(FORCE_UNLOCK_SOURCE);
static HEARTBEAT: LazyLock<Script> = script!(HEARTBEAT_SOURCE);
static STATUS: LazyLock<Script> = script!(STATUS_SOURCE);

/// Every script, for loading them ahead of use.
pub fn scripts() -> [&'static Script; 8] {
    [
        &ACQUIRE,
        &REENTER,
        &RELEASE,
        &RENEW,
        &LEAVE,
        &FORCE_UNLOCK,
        &HEARTBEAT,
        &STATUS,
    ]
}

/// A request built and not yet sent: the EVALSHA command, the script it names and the parser of
/// its reply.
pub struct Call<T> {
    script: &'static Script,
    runner: Runner,
    cmd: redis::Cmd,
    parse: fn(Value) -> Result<T>,
    during: &'static str,
}

/// The script's name, how it is run and what it is for (the arguments may name owners and
/// tokens: left out).
impl<T> fmt::Debug for Call<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Call")
            .field("script", &self.script.name)
            .field("runner", &self.runner)
            .field("during", &self.during)
            .finish_non_exhaustive()
    }
}

impl<T> Call<T> {
    /// The command, to send on any connection or in a pipeline.
    pub fn cmd(&self) -> &redis::Cmd {
        &self.cmd
    }

    /// The script this call runs.
    pub fn script(&self) -> &'static Script {
        self.script
    }

    /// Load what the call needs on a server that lacks it (a new, restarted or flushed server):
    /// its script, or the function library.
    ///
    /// # Errors
    /// [`Error::Connection`] when Redis cannot be reached.
    pub fn load(&self, conn: &mut dyn ConnectionLike) -> Result<()> {
        self.script.load_for(self.runner, conn)
    }

    /// What the call is doing, for error messages ("acquiring", "releasing", ...).
    pub fn during(&self) -> &'static str {
        self.during
    }

    /// Parse a reply to this call's command (a server error reply becomes the matching
    /// [`Error`]).
    ///
    /// # Errors
    /// The server's error ([`Error::ForeignData`] for another program's data at a lock key), or
    /// [`Error::Protocol`] when the reply has an unexpected shape.
    pub fn parse(&self, reply: Value) -> Result<T> {
        let reply = reply
            .extract_error()
            .map_err(|e| Error::from_redis(self.during, e))?;
        (self.parse)(reply)
    }

    /// Send the command and parse the reply; when the server lacks the script or the function
    /// (a new or restarted server) load it and send the command once more.
    ///
    /// # Errors
    /// [`Error::Connection`] when Redis cannot be reached or does not answer in time (the call
    /// may or may not have been applied), and what [`Call::parse`] returns.
    pub fn run(&self, conn: &mut dyn ConnectionLike) -> Result<T> {
        let send = |conn: &mut dyn ConnectionLike| {
            conn.req_command(&self.cmd)
                .and_then(|reply| reply.extract_error())
        };
        match send(conn) {
            Err(e) if is_missing_script(&e) => {
                self.load(conn)?;
                let reply = send(conn).map_err(|e| Error::from_redis(self.during, e))?;
                self.parse(reply)
            }
            Err(e) => Err(Error::from_redis(self.during, e)),
            Ok(reply) => self.parse(reply),
        }
    }
}

/// Send many calls in one pipeline (one round trip) and parse each reply; scripts the server
/// lacks are loaded and the pipeline sent once more. On a connection that cannot pipeline (a
/// Cluster's: the calls' locks live on different nodes), the calls go one by one.
///
/// # Errors
/// The outer error is the connection's; the inner ones are each call's own.
pub fn run_pipeline<T>(conn: &mut dyn ConnectionLike, calls: &[Call<T>]) -> Result<Vec<Result<T>>> {
    if calls.is_empty() {
        return Ok(Vec::new());
    }
    if !conn.supports_pipelining() {
        let mut replies = Vec::with_capacity(calls.len());
        for call in calls {
            match call.run(conn) {
                // as a pipeline would: a failed connection fails them all
                Err(e) if e.is_connection() => return Err(e),
                reply => replies.push(reply),
            }
        }
        return Ok(replies);
    }
    let mut pipe = redis::pipe();
    for call in calls {
        pipe.add_command(call.cmd.clone());
    }
    let during = calls[0].during;
    let packed = pipe.get_packed_pipeline();
    // req_packed_commands keeps each reply as it came, server errors included (a typed
    // pipeline query would fail whole on the first NOSCRIPT)
    let send = |conn: &mut dyn ConnectionLike| -> Result<Vec<Value>> {
        conn.req_packed_commands(&packed, 0, calls.len())
            .map_err(|e| Error::from_redis(during, e))
    };
    let mut replies = send(conn)?;
    let mut missing: Vec<&Call<T>> = Vec::new();
    for (call, reply) in calls.iter().zip(&replies) {
        let lacks = matches!(reply, Value::ServerError(e) if is_missing(e.kind(), e.details()));
        // one library holds every function: load it once
        let loaded = missing.iter().any(|m| {
            m.runner == call.runner
                && (call.runner == Runner::Functions || std::ptr::eq(m.script, call.script))
        });
        if lacks && !loaded {
            missing.push(call);
        }
    }
    if !missing.is_empty() {
        for call in missing {
            call.load(conn)?;
        }
        replies = send(conn)?;
    }
    Ok(calls
        .iter()
        .zip(replies)
        .map(|(call, v)| call.parse(v))
        .collect())
}

/// Whether a server error says it lacks the script (`NOSCRIPT`) or the function ("Function not
/// found": a server that never had the library, or lost it in a restart without persistence).
fn is_missing(kind: Option<redis::ServerErrorKind>, details: Option<&str>) -> bool {
    kind == Some(redis::ServerErrorKind::NoScript)
        || details.is_some_and(|d| d.starts_with("Function not found"))
}

fn is_missing_script(e: &redis::RedisError) -> bool {
    match e.kind() {
        redis::ErrorKind::Server(kind) => is_missing(Some(kind), e.detail()),
        _ => false,
    }
}

/// Whether an acquire attempt may queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Take the lock if it is free and nobody waits; never queue.
    Try,
    /// Take it, or queue for it.
    Wait,
}

/// What a leaving waiter does with a grant that reached it meanwhile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaveMode {
    /// Keep it (the caller becomes the holder).
    Claim,
    /// Hand it on to the next waiter.
    Pass,
}

/// Whether an acquire request of the leaving attempt may still reach Redis after the leave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LateAcquire {
    /// Every acquire request of the attempt was answered (and none was sent twice), so none
    /// can arrive later: the leave leaves nothing behind.
    Impossible,
    /// One went unanswered (an error, a connection that failed under it) or was sent again: it
    /// may still arrive. The leave leaves a *left mark* (`leave.lua`), which makes it do
    /// nothing, instead of queueing a waiter nobody refreshes; the mark costs a field of the
    /// lock's key `<prefix>:{name}:left`, which lives the queue's TTL (10 minutes) after the
    /// last mark.
    Possible,
}

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
    /// [`Mode::Try`]: held by someone, or others are queued.
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
        /// was made after this request reached Redis (see [`judge_handoff`]).
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
    /// [`LeaveMode::Claim`]: the attempt had been granted the lock; the caller holds it.
    Granted(Grant),
    /// [`LeaveMode::Pass`]: the attempt had been granted the lock; it went to the next waiter.
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
    /// The last token handed out when the heartbeat ran (see [`judge_handoff`]).
    pub last_token: u64,
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

/// How many replicas have everything this connection wrote so far, and so every write the master
/// made before it (a grant made by another client's release included): waits for `replicas` of
/// them for at most `timeout`. A write goes first: it makes this connection's last write come
/// after the grant even when the call before it wrote nothing, which `WAIT` needs to mean
/// anything. On one node that is a `PUBLISH` (replicated, and it changes no data); on a Cluster,
/// where `PUBLISH` is not replicated and `WAIT` must reach the master of `key`'s slot, it is a
/// short-lived marker key `<key>:replicated` (1 s TTL) in that slot.
///
/// # Errors
/// [`Error::Connection`] when the server cannot be reached.
pub(crate) fn acknowledged_by_replicas(
    conn: &mut Conn,
    key: &str,
    replicas: u32,
    timeout: Duration,
) -> Result<u32> {
    let during = |e| Error::from_redis("waiting for replicas", e);
    let mut wait = redis::cmd("WAIT");
    wait.arg(replicas).arg(timeout.as_millis().max(1) as u64);
    let acked: i64 = if conn.is_cluster() {
        conn.query::<()>(
            redis::cmd("SET")
                .arg(format!("{key}:replicated"))
                .arg("")
                .arg("PX")
                .arg(1000),
        )
        .map_err(during)?;
        conn.query_at(key, &wait).map_err(during)?
    } else {
        let (acked,): (i64,) = redis::pipe()
            .cmd("PUBLISH")
            .arg("fairlock:replicated")
            .arg("")
            .ignore()
            .add_command(wait)
            .query(conn)
            .map_err(during)?;
        acked
    };
    Ok(acked.max(0) as u32)
}

/// A BLPOP on `lists` (wake lists; on a Cluster they must share a slot) for at most `block`
/// (rounded to ms; at least 1 ms).
pub fn wait_cmd<S: AsRef<str>>(lists: &[S], block: Duration) -> redis::Cmd {
    let mut cmd = redis::cmd("BLPOP");
    for list in lists {
        cmd.arg(list.as_ref());
    }
    cmd.arg(format!(
        "{:.3}",
        block.max(Duration::from_millis(1)).as_secs_f64()
    ));
    cmd
}

/// The keys and settings of one lock: builds its calls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawLock {
    keys: LockKeys,
    settings: Settings,
}

fn millis(d: Duration) -> u64 {
    d.as_millis().min(u64::MAX as u128) as u64
}

impl RawLock {
    /// The lock `name` under key prefix `prefix`.
    ///
    /// # Errors
    /// [`Error::InvalidName`] / [`Error::InvalidConfig`] for a name or prefix that cannot be a key.
    pub fn new(prefix: &str, name: &str, settings: Settings) -> Result<RawLock> {
        crate::keys::validate_prefix(prefix)?;
        crate::keys::validate_name(name)?;
        Ok(RawLock {
            keys: LockKeys::new(prefix, name),
            settings,
        })
    }

    pub(crate) fn keys(&self) -> &LockKeys {
        &self.keys
    }

    /// The settings the calls carry.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The lock's keys (lock hash, fence, queue, waiters; wake lists are
    /// `<lock hash>:wake:<client id>`).
    pub fn key_names(&self) -> [&str; 4] {
        self.keys.all()
    }

    /// The wake list `owner`'s messages go to: the one of its client (owner ids are
    /// `<client id>:<thread>`), shared with the client's other threads.
    pub fn wake_key(&self, owner: &str) -> String {
        self.keys.wake(owner)
    }

    fn call<T>(
        &self,
        script: &'static LazyLock<Script>,
        during: &'static str,
        parse: fn(Value) -> Result<T>,
    ) -> Call<T> {
        let mut cmd = match self.settings.runner {
            Runner::Functions => redis::cmd("FCALL").arg(&script.function).to_owned(),
            Runner::Eval => redis::cmd("EVALSHA").arg(&script.sha).to_owned(),
        };
        cmd.arg(4)
            .arg(&self.keys.all()[..])
            .arg(millis(self.settings.fence_ttl).max(1))
            .arg(millis(self.settings.waiter_timeout).max(3));
        Call {
            script,
            runner: self.settings.runner,
            cmd,
            parse,
            during,
        }
    }

    /// An attempt to take the lock (`Mode::Wait`: or queue for it).
    /// An older attempt's hold of the same thread, if the lock has one, is passed on first (the
    /// thread has no guard of it: see `acquire.lua`).
    pub fn acquire(
        &self,
        owner: &str,
        attempt: u64,
        lease: Duration,
        mode: Mode,
        meta: &str,
    ) -> Call<Acquire> {
        self.acquire_call(owner, attempt, lease, mode, meta, false)
    }

    /// As [`RawLock::acquire`], for a thread that leaked a hold of this lock which is to run out
    /// by its lease: that hold is kept, and this attempt is busy or queues behind it.
    pub fn acquire_behind_leaked_hold(
        &self,
        owner: &str,
        attempt: u64,
        lease: Duration,
        mode: Mode,
        meta: &str,
    ) -> Call<Acquire> {
        self.acquire_call(owner, attempt, lease, mode, meta, true)
    }

    fn acquire_call(
        &self,
        owner: &str,
        attempt: u64,
        lease: Duration,
        mode: Mode,
        meta: &str,
        keep: bool,
    ) -> Call<Acquire> {
        let mut c = self.call(&ACQUIRE, "acquiring", parse_acquire);
        c.cmd
            .arg(owner)
            .arg(attempt)
            .arg(millis(lease))
            .arg(match mode {
                Mode::Try => "try",
                Mode::Wait => "wait",
            })
            .arg(meta)
            .arg(if keep { "keep" } else { "" });
        c
    }

    /// The holder of `token` takes the lock once more; `depth` is its depth before.
    pub fn reenter(&self, owner: &str, token: u64, depth: u32) -> Call<Reenter> {
        let mut c = self.call(&REENTER, "re-entering", parse_reenter);
        c.cmd.arg(owner).arg(token).arg(depth);
        c
    }

    /// The holder of `token` releases one level; `depth` is its depth before (1: the whole hold).
    pub fn release(&self, owner: &str, token: u64, depth: u32) -> Call<Release> {
        self.release_call(owner, token, depth, None)
    }

    /// As [`RawLock::release`], for a hold that `attempt` got while one of its acquire requests
    /// may still arrive (it went unanswered, or was sent twice): the outermost release also
    /// leaves a left mark for `attempt`, whatever it finds, so that request does nothing when
    /// it arrives (see [`LateAcquire::Possible`]).
    pub fn release_marking(
        &self,
        owner: &str,
        token: u64,
        depth: u32,
        attempt: u64,
    ) -> Call<Release> {
        self.release_call(owner, token, depth, Some(attempt))
    }

    fn release_call(
        &self,
        owner: &str,
        token: u64,
        depth: u32,
        mark: Option<u64>,
    ) -> Call<Release> {
        let mut c = self.call(&RELEASE, "releasing", parse_release);
        c.cmd.arg(owner).arg(token).arg(depth.max(1));
        match mark {
            Some(attempt) => c.cmd.arg(attempt),
            None => c.cmd.arg(""),
        };
        c
    }

    /// Extend the lease of the hold `token` to `lease` from now. `true` when renewed.
    pub fn renew(&self, owner: &str, token: u64, lease: Duration) -> Call<bool> {
        let mut c = self.call(&RENEW, "renewing a lease", parse_renew);
        c.cmd.arg(owner).arg(token).arg(millis(lease));
        c
    }

    /// The waiting `attempt` stops waiting; `late` says whether one of its acquire requests
    /// may still arrive.
    pub fn leave(
        &self,
        owner: &str,
        attempt: u64,
        mode: LeaveMode,
        late: LateAcquire,
    ) -> Call<Leave> {
        let mut c = self.call(&LEAVE, "leaving the queue", parse_leave);
        c.cmd
            .arg(owner)
            .arg(attempt)
            .arg(match mode {
                LeaveMode::Claim => "claim",
                LeaveMode::Pass => "pass",
            })
            .arg(match late {
                LateAcquire::Impossible => "",
                LateAcquire::Possible => "mark",
            });
        c
    }

    /// Keep these waiting attempts (owner, attempt) alive, and repair the lock.
    pub fn heartbeat<'a>(
        &self,
        waiting: impl IntoIterator<Item = (&'a str, u64)>,
    ) -> Call<Heartbeat> {
        let mut c = self.call(&HEARTBEAT, "refreshing waiters", parse_heartbeat);
        for (owner, attempt) in waiting {
            c.cmd.arg(owner).arg(attempt);
        }
        c
    }

    /// Release the hold of `owner` with `token`, whoever asks; nothing when that hold is gone.
    pub fn force_unlock(&self, owner: &str, token: u64) -> Call<ForceUnlock> {
        let mut c = self.call(&FORCE_UNLOCK, "force-releasing", parse_force_unlock);
        c.cmd.arg(owner).arg(token);
        c
    }

    /// Read the lock's holder, fence and queue in one atomic step.
    pub fn status(&self) -> Call<RawStatus> {
        self.call(&STATUS, "reading the status", parse_status)
    }
}

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

fn parse_acquire(v: Value) -> Result<Acquire> {
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

fn parse_reenter(v: Value) -> Result<Reenter> {
    match int(&v) {
        Some(0) => Ok(Reenter::Lost),
        Some(n) if n > 0 => Ok(Reenter::Reentered(n.min(u32::MAX as i64) as u32)),
        _ => Err(Error::protocol(format!("re-enter: {v:?}"))),
    }
}

fn parse_renew(v: Value) -> Result<bool> {
    match int(&v) {
        Some(n) => Ok(n == 1),
        None => Err(Error::protocol(format!("renew: {v:?}"))),
    }
}

fn parse_release(v: Value) -> Result<Release> {
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

fn parse_leave(v: Value) -> Result<Leave> {
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

fn parse_force_unlock(v: Value) -> Result<ForceUnlock> {
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

fn parse_heartbeat(v: Value) -> Result<Heartbeat> {
    const D: &str = "heartbeat";
    let items = array(v, D)?;
    Ok(Heartbeat {
        pttl_ms: field_int(&items, 0, D)?,
        last_token: field_token(&items, 1, D)?,
        told_to_retry: items.iter().skip(2).filter_map(text).collect(),
    })
}

fn parse_status(v: Value) -> Result<RawStatus> {
    const D: &str = "status";
    let items = array(v, D)?;
    if items.len() < 8 {
        return Err(Error::protocol(format!("{D}: {items:?}")));
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
        token: field_int(&items, 3, D)?.max(0) as u64,
        pttl_ms: field_int(&items, 4, D)?,
        since_ms: field_int(&items, 5, D)?,
        meta: field_text(&items, 6),
        fence: field_int(&items, 7, D)?.max(0) as u64,
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
        let hb = parse_heartbeat(reply(&["1500", "42", "c:1", "c:2"])).unwrap();
        assert_eq!((hb.pttl_ms, hb.last_token), (1500, 42));
        assert_eq!(hb.told_to_retry, ["c:1", "c:2"]);
        assert!(parse_heartbeat(reply(&["1500"])).is_err());
    }

    #[test]
    fn a_status_reply_parses_with_its_queue() {
        let s = parse_status(reply(&[
            "10000", "c:1", "2", "77", "2500", "4000", "h|1|t", "77", "c:2", "9000000", "h|2|u",
        ]))
        .unwrap();
        assert_eq!(
            (s.owner.as_str(), s.count, s.token, s.fence),
            ("c:1", 2, 77, 77)
        );
        assert_eq!(s.queue, [("c:2".to_string(), 9000000, "h|2|u".to_string())]);
        assert!(parse_status(reply(&["10000", "c:1"])).is_err());
    }

    #[test]
    fn scripts_are_distinct_and_start_with_common() {
        for s in scripts() {
            assert!(s.code.starts_with(COMMON));
            assert_eq!(s.sha.len(), 40);
        }
        assert_ne!(ACQUIRE.sha, RELEASE.sha);
    }

    #[test]
    fn every_call_carries_the_common_arguments() {
        let lock = RawLock::new("p", "n", Settings::default()).unwrap();
        let packed = lock
            .renew("o", 5, Duration::from_secs(1))
            .cmd()
            .get_packed_command();
        let text = String::from_utf8_lossy(&packed);
        assert!(text.contains("604800000"), "{text}");
        assert!(text.contains("p:{n}:waiters"), "{text}");
    }
}
