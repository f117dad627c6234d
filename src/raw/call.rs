//! [`Call`]: a request built and not yet sent, and how calls are sent (one by one, or in a
//! pipeline), loading what a server lacks.

use std::fmt;
use std::sync::Arc;

use redis::{ConnectionLike, Value};

use super::{millis, Runner, Script, Settings};
use crate::error::{Error, Result};

/// How a call reads its reply: the script's parser, or a mapping of one ([`Call::map`]).
type Parser<T> = Arc<dyn Fn(Value) -> Result<T> + Send + Sync>;

/// A request built and not yet sent: the EVALSHA command, the script it names and the parser of
/// its reply.
pub struct Call<T> {
    pub(super) script: &'static Script,
    pub(super) runner: Runner,
    pub(super) cmd: redis::Cmd,
    pub(super) parse: Parser<T>,
    pub(super) during: &'static str,
}

/// The script's name, how it is run and what it is for (the arguments may name owners and
/// tokens: left out).
impl<T> fmt::Debug for Call<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Call")
            .field("script", &self.script.name())
            .field("runner", &self.runner)
            .field("during", &self.during)
            .finish_non_exhaustive()
    }
}

impl<T> Clone for Call<T> {
    fn clone(&self) -> Self {
        Call {
            script: self.script,
            runner: self.runner,
            cmd: self.cmd.clone(),
            parse: Arc::clone(&self.parse),
            during: self.during,
        }
    }
}

impl<T: 'static> Call<T> {
    /// A call of `script` on `keys` as `settings` run scripts, with the two arguments every
    /// script takes first (the fence's TTL, the waiter timeout); the caller adds the script's
    /// own. `during` says what it does, for error messages.
    pub(super) fn new<K: redis::ToRedisArgs>(
        script: &'static Script,
        settings: &Settings,
        keys: &[K],
        during: &'static str,
        parse: fn(Value) -> Result<T>,
    ) -> Call<T> {
        let mut cmd = match settings.runner {
            Runner::Functions => redis::cmd("FCALL").arg(script.function()).to_owned(),
            Runner::Eval => redis::cmd("EVALSHA").arg(script.sha()).to_owned(),
        };
        cmd.arg(keys.len())
            .arg(keys)
            .arg(millis(settings.fence_ttl).max(1))
            .arg(millis(settings.waiter_timeout).max(3));
        Call {
            script,
            runner: settings.runner,
            cmd,
            parse: Arc::new(parse),
            during,
        }
    }

    /// The same request, its reply read on into `f`'s: so calls of different scripts with one
    /// meaning (the heartbeats of a lock and of a semaphore, say) can be handled alike.
    pub fn map<U: 'static>(self, f: fn(T) -> U) -> Call<U> {
        let parse = self.parse;
        Call {
            script: self.script,
            runner: self.runner,
            cmd: self.cmd,
            parse: Arc::new(move |v| parse(v).map(f)),
            during: self.during,
        }
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
