//! The raw protocol: one typed call per state transition of a lock, each one atomic Lua script of
//! `lua/`. Like `lock_api`'s `RawMutex` beneath `Mutex`: [`FairLock`](crate::FairLock),
//! [`LockGuard`](crate::LockGuard), the watchdog and the janitor reach Redis only through it, and
//! tools (the protocol fuzzer among them) can drive the scripts directly, with many logical
//! clients on one connection.
//!
//! A call is built first and run later ([`Call`]): its command can be sent on any connection, in
//! a pipeline, twice, or late, and its reply parsed apart from sending it. Nothing here waits,
//! retries or keeps state; every script is safe to run again or late (see each script's header
//! and `lua/common.lua`).
//!
//! Owners are strings `<client id>:<thread number>`; an *attempt* is a number that grows with
//! every acquire call of a client: scripts act on an owner's queue entry or hold only for the
//! attempt they were sent for, so a request that arrives after its sender moved on does nothing.

use std::sync::LazyLock;
use std::time::Duration;

use redis::Value;

use crate::connection::Conn;
use crate::error::{Error, Result};
use crate::keys::LockKeys;

/// The client's lease arithmetic for a hand-off (see its module), public here so the protocol
/// fuzzer drives the very decisions the client makes.
pub use crate::lease_estimate::{judge_handoff, Handoff, Witness};

mod call;
mod replies;
mod scripts;
mod semaphore;

pub use call::{run_pipeline, Call};
pub use replies::*;
pub use scripts::{library_code, library_name, load_library, scripts, Script};
use scripts::{ACQUIRE, FORCE_UNLOCK, HEARTBEAT, LEAVE, REENTER, RELEASE, RENEW, STATUS};
pub use semaphore::{
    RawSemaphore, SemAcquire, SemCapacity, SemHeartbeat, SemHold, SemKind, SemLeave, SemRelease,
    SemStatus, SemWaiter, RW_CAPACITY,
};

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
    /// lock's key `<prefix>:{name}:left` for the queue's TTL (10 minutes; a later mark drops
    /// it within a tenth more).
    Possible,
}

/// The channel a grant's connection publishes on before its `WAIT` (one node).
pub(crate) const REPLICATED_CHANNEL: &str = "fairlock:replicated";

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
            .arg(REPLICATED_CHANNEL)
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

    fn call<T: 'static>(
        &self,
        script: &'static LazyLock<Script>,
        during: &'static str,
        parse: fn(Value) -> Result<T>,
    ) -> Call<T> {
        Call::new(script, &self.settings, &self.keys.all(), during, parse)
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

#[cfg(test)]
mod tests {
    use super::*;

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
