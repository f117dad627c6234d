//! [`FairLock`]: the handle users take, try and inspect a lock through.
//!
//! How a waiter waits (the whole wake-up path is here and in `release.lua`):
//! 1. `acquire.lua` either grants the lock or puts the thread in the lock's FIFO queue.
//! 2. The thread blocks in a timed BLPOP on its own wake list, on a connection of its own (so 64
//!    waiters never starve the command pool).
//! 3. The release that makes this thread the head grants it the lock inside the script and pushes
//!    `<token>|<time>` (a hand-off) to exactly that list: the BLPOP returns holding the lock, with
//!    no further round trip. A push that lands before the BLPOP starts stays in the list, so no
//!    wake-up is lost.
//! 4. The janitor keeps the queue entry alive meanwhile; if the entry was ever dropped (a long
//!    pause, a Redis restart) it pushes `retry` and the thread re-runs step 1.
//! 5. A waiter whose time runs out leaves with `leave.lua`, which takes a grant that reached it
//!    meanwhile rather than wasting it; a waiter that fails hands such a grant on.

use std::fmt;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Value;

use crate::client::{validate_lease, ClientInner};
use crate::error::{Error, Result};
use crate::guard::{current_hold, forget, Hold, LockGuard};
use crate::keys::LockKeys;
use crate::scripts::{self, Acquire, Leave, Wake};
use crate::status::LockStatus;

/// The longest single BLPOP: a waiter re-blocks at least this often, which bounds how long a
/// silently dead connection (no RST) can hide.
const MAX_BLOCK: Duration = Duration::from_secs(10);
/// BLPOP timeouts below 1 ms turned into "forever" on Redis < 7.0.8 (redis/redis#11688).
const MIN_BLOCK: Duration = Duration::from_millis(2);
/// Consecutive failed BLPOPs before a wait gives up with the error.
const MAX_WAIT_FAILURES: u32 = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LeaseMode {
    /// Renewed by the watchdog while held.
    Renewed(Duration),
    /// Runs out after this long; never renewed.
    Fixed(Duration),
}

/// A fair, reentrant distributed lock on Redis. Cheap to clone; `Send + Sync`.
///
/// # Guarantees
/// - **Mutual exclusion**: at most one owner (a client's thread) holds the lock while its lease
///   runs. Every state change is one atomic Lua script.
/// - **FIFO, no barging**: waiters are served in the order their first attempt reached Redis,
///   across threads and processes. While anyone waits, a newcomer (`try_lock` too) queues behind
///   them; a release hands the lock straight to the next waiter, so there is no gap to barge into.
///   A live waiter keeps its place however long the lock is held.
/// - **Reentrancy**: the owning thread takes the lock again without waiting; it is free when every
///   guard is released. Another thread of the same process is another owner.
/// - **Leases**: a hold's lease (default 30 s) is renewed every third of it while the guard lives
///   ([`FairLock::with_fixed_lease`] turns renewal off). A holder that dies holds the lock until
///   its lease runs out; then the next waiter gets it within milliseconds.
/// - **Fencing**: each new hold gets a token greater than all before it ([`LockGuard::fencing_token`]).
///
/// # Limits
/// A lease is time-based: a holder paused longer than its lease (GC, swap, SIGSTOP) may still run
/// while another holds the lock. Use the fencing token at the resource. A Redis without
/// persistence that restarts, or a failover to a replica that missed the last writes, forgets
/// locks and queue places.
///
/// ```no_run
/// use std::time::Duration;
/// let client = fairlock::LockClient::connect("redis://127.0.0.1:6379/")?;
/// let lock = client.lock("orders:close-unpaid")?;
/// if let Some(guard) = lock.try_lock_for(Duration::from_secs(5))? {
///     // ... critical section; pass guard.fencing_token() to the resource ...
///     guard.unlock()?;
/// }
/// # Ok::<(), fairlock::Error>(())
/// ```
#[derive(Clone)]
pub struct FairLock {
    client: Arc<ClientInner>,
    name: Arc<str>,
    keys: Arc<LockKeys>,
    lease: LeaseMode,
}

/// How long an acquire call may wait.
#[derive(Clone, Copy)]
enum Wait {
    No,
    Until(Option<Instant>),
}

impl FairLock {
    pub(crate) fn new(client: Arc<ClientInner>, name: &str) -> FairLock {
        let keys = LockKeys::new(&client.config.key_prefix, name);
        let lease = LeaseMode::Renewed(client.config.lease);
        FairLock {
            client,
            name: name.into(),
            keys: Arc::new(keys),
            lease,
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A handle to the same lock whose holds run out after `lease` and are never renewed: the
    /// seeds' `tryLock(0, 5, SECONDS)` for scheduled jobs that must not run twice within a period.
    /// Re-entry keeps the lease of the outer hold.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let client = fairlock::LockClient::connect("redis://127.0.0.1:6379/")?;
    /// let job = client.lock("close-unpaid-orders")?.with_fixed_lease(Duration::from_secs(5))?;
    /// if let Some(guard) = job.try_lock()? {
    ///     // run the job, then keep the lock for the rest of the 5 s so no server runs it again
    ///     guard.leak();
    /// }
    /// # Ok::<(), fairlock::Error>(())
    /// ```
    pub fn with_fixed_lease(&self, lease: Duration) -> Result<FairLock> {
        validate_lease("fixed lease", lease)?;
        Ok(FairLock {
            lease: LeaseMode::Fixed(lease),
            ..self.clone()
        })
    }

    /// A handle to the same lock whose holds use `lease`, renewed by the watchdog.
    pub fn with_lease(&self, lease: Duration) -> Result<FairLock> {
        validate_lease("lease", lease)?;
        Ok(FairLock {
            lease: LeaseMode::Renewed(lease),
            ..self.clone()
        })
    }

    /// Take the lock, waiting in FIFO order as long as it takes. Re-entry by the owning thread
    /// returns at once. Errors only when Redis fails (then the thread's queue place is given up).
    pub fn lock(&self) -> Result<LockGuard> {
        match self.acquire(Wait::Until(None))? {
            Some(guard) => Ok(guard),
            None => Err(Error::unexpected(
                "a wait without deadline ended without the lock",
            )),
        }
    }

    /// Take the lock if it is free and nobody is queued; never waits and never queues.
    pub fn try_lock(&self) -> Result<Option<LockGuard>> {
        self.acquire(Wait::No)
    }

    /// Take the lock, waiting in FIFO order at most `timeout`. `Ok(None)` when the time ran out;
    /// the queue place is gone then.
    pub fn try_lock_for(&self, timeout: Duration) -> Result<Option<LockGuard>> {
        self.acquire(Wait::Until(Instant::now().checked_add(timeout)))
    }

    /// Take the lock, waiting in FIFO order until `deadline` at the latest.
    pub fn try_lock_until(&self, deadline: Instant) -> Result<Option<LockGuard>> {
        self.acquire(Wait::Until(Some(deadline)))
    }

    /// Whether anyone holds the lock now.
    pub fn is_locked(&self) -> Result<bool> {
        let exists: bool = self.client.with_conn("reading the lock", |c| {
            c.query(redis::cmd("EXISTS").arg(&self.keys.lock))
                .map_err(|e| Error::from_redis("reading the lock", e))
        })?;
        Ok(exists)
    }

    /// Whether the calling thread (through this client) holds the lock, as Redis sees it.
    pub fn is_held_by_current_thread(&self) -> Result<bool> {
        Ok(self.hold_count()? > 0)
    }

    /// How many levels the calling thread holds (0 when it does not hold the lock).
    pub fn hold_count(&self) -> Result<u32> {
        let (owner, count) = self.owner_and("count")?;
        Ok(match (owner, count) {
            (Some(o), Some(n)) if o == self.client.flag() => n as u32,
            _ => 0,
        })
    }

    /// Release the lock whoever holds it, and grant it to the next waiter. For operators and
    /// stuck jobs; the former holder's guard finds out at its next renewal or release. Returns the
    /// owner flag of the former holder (`None` when the lock was free).
    pub fn force_unlock(&self) -> Result<Option<String>> {
        let cmd = scripts::FORCE_UNLOCK.cmd(&self.keys);
        let reply = self.client.with_conn("force-releasing", |c| {
            scripts::FORCE_UNLOCK.run(c, &cmd, "force-releasing")
        })?;
        match reply {
            Value::Array(items) => Ok(items
                .first()
                .and_then(scripts::text)
                .filter(|s| !s.is_empty())),
            other => Err(Error::unexpected(&format!("force_unlock: {other:?}"))),
        }
    }

    /// Give up the queue place of the waiter `owner` (an owner flag, as from
    /// [`LockClient::current_owner`](crate::LockClient::current_owner) on the waiting thread) and
    /// hand on a grant that already reached it; if `owner` holds the lock, it is released too.
    /// For a process that must exit while one of its threads is blocked in [`FairLock::lock`]
    /// (the command-line tool on Ctrl-C): that call is not woken, so exit right after. Without
    /// this the place lapses only when the janitor stops refreshing it, and a grant made to it
    /// meanwhile waits to be revoked.
    pub fn abandon_wait(&self, owner: &str) -> Result<()> {
        let mut cmd = scripts::LEAVE.cmd(&self.keys);
        cmd.arg(owner).arg("pass");
        self.client
            .with_conn("leaving the queue", |c| {
                scripts::LEAVE.run(c, &cmd, "leaving the queue")
            })
            .and_then(scripts::parse_leave)
            .map(|_| ())
    }

    /// Holder, hold count, lease left, fencing counter and the waiters in queue order.
    pub fn status(&self) -> Result<LockStatus> {
        let cmd = scripts::STATUS.cmd(&self.keys);
        let reply = self.client.with_conn("reading the status", |c| {
            scripts::STATUS.run(c, &cmd, "reading the status")
        })?;
        Ok(LockStatus::from_raw(
            &self.name,
            scripts::parse_status(reply)?,
        ))
    }

    // ---- internals ----------------------------------------------------------------------

    pub(crate) fn client(&self) -> &ClientInner {
        &self.client
    }

    pub(crate) fn keys(&self) -> &LockKeys {
        &self.keys
    }

    pub(crate) fn hold_key(&self) -> (String, String) {
        (self.client.id.clone(), self.keys.lock.clone())
    }

    /// The lease to renew, or `None` for a fixed lease.
    pub(crate) fn renewed_lease(&self) -> Option<Duration> {
        match self.lease {
            LeaseMode::Renewed(l) => Some(l),
            LeaseMode::Fixed(_) => None,
        }
    }

    fn lease_ms(&self) -> u64 {
        match self.lease {
            LeaseMode::Renewed(l) | LeaseMode::Fixed(l) => l.as_millis() as u64,
        }
    }

    /// Whether the hold with this token still owns the lock.
    pub(crate) fn owns(&self, token: u64) -> Result<bool> {
        let (owner, tok) = self.owner_and("token")?;
        Ok(owner.as_deref() == Some(&self.client.flag()) && tok == Some(token))
    }

    /// The lock's owner flag and one numeric field of its hash.
    fn owner_and(&self, field: &str) -> Result<(Option<String>, Option<u64>)> {
        self.client.with_conn("reading the lock", |c| {
            c.query(
                redis::cmd("HMGET")
                    .arg(&self.keys.lock)
                    .arg("owner")
                    .arg(field),
            )
            .map_err(|e| Error::from_redis("reading the lock", e))
        })
    }

    fn acquire(&self, wait: Wait) -> Result<Option<LockGuard>> {
        if let Some(hold) = current_hold(self) {
            if !hold.is_stale() {
                return self.reenter(hold).map(Some);
            }
            // A hold whose lease is over (a leaked fixed-lease guard, or one the watchdog found
            // lost): this is a fresh acquisition. An old guard still around releases nothing.
            forget(self, &hold);
        }
        let flag = self.client.flag();
        let meta = self.client.meta();
        let mode = if matches!(wait, Wait::No) {
            "try"
        } else {
            "wait"
        };
        let mut cmd = scripts::ACQUIRE.cmd(&self.keys);
        cmd.arg(&flag)
            .arg(self.lease_ms())
            .arg(mode)
            .arg(self.client.janitor.waiter_timeout_ms())
            .arg(&meta);
        let deadline = match wait {
            Wait::No => None,
            Wait::Until(d) => d,
        };
        let mut failures = 0;
        loop {
            let sent = Instant::now();
            let reply = self
                .client
                .with_conn("acquiring", |c| scripts::ACQUIRE.run(c, &cmd, "acquiring"))
                .and_then(scripts::parse_acquire);
            let (server_ms, pttl_ms) = match reply {
                Err(e) => {
                    // Even a first attempt may have been queued before its reply was lost.
                    self.leave_after_error(&flag);
                    return Err(e);
                }
                Ok(Acquire::Granted { token, pttl_ms, .. }) => {
                    match self.fresh_hold(token, sent + ms(pttl_ms), &flag, &mut failures)? {
                        Some(guard) => return Ok(Some(guard)),
                        None => continue,
                    }
                }
                Ok(Acquire::Busy { .. }) => return Ok(None),
                Ok(Acquire::Queued { server_ms, pttl_ms }) => (server_ms, pttl_ms),
            };
            let janitor = &self.client.janitor;
            janitor.register(&self.keys, &flag, self.lease_ms(), &meta, ms(pttl_ms));
            let outcome = self.wait_for_grant(&flag, deadline);
            // Unregister before anything else touches the queue entry (leave, re-acquire), so the
            // janitor never refreshes or re-queues an entry this thread is done with.
            janitor.unregister(&self.keys, &flag);
            let (token, expires) = match outcome {
                Ok(Waited::Handoff { token, grant_ms }) => {
                    // The grant's lease started at the server's grant_ms; map that onto our
                    // clock through the (sent, server_ms) pair of the acquire call, which can only
                    // make the estimate early, never late.
                    let lease = ms(self.lease_ms() as i64);
                    (token, sent + ms(grant_ms - server_ms) + lease)
                }
                Ok(Waited::Deadline) => match self.leave_at_deadline(&flag)? {
                    Some((token, expires)) => (token, expires),
                    None => return Ok(None),
                },
                Ok(Waited::Retry) => continue,
                Err(e) if failures + 1 < MAX_WAIT_FAILURES => {
                    failures += 1;
                    log::debug!(
                        "fairlock: waiting on {:?} failed ({e}); re-checking",
                        self.name
                    );
                    continue;
                }
                Err(e) => {
                    self.leave_after_error(&flag);
                    return Err(e);
                }
            };
            if let Some(guard) = self.fresh_hold(token, expires, &flag, &mut failures)? {
                return Ok(Some(guard));
            }
        }
    }

    /// Turn a grant into a guard, unless its lease already ran out by our (early) estimate: then
    /// the reply was held up (a stalled network, a stopped process) and another owner may hold
    /// the lock by now, so it must not become a guard. `None` means: run `acquire.lua` again (it
    /// renews the grant if the lock is still ours, and queues us otherwise).
    fn fresh_hold(
        &self,
        token: u64,
        expires: Instant,
        flag: &str,
        failures: &mut u32,
    ) -> Result<Option<LockGuard>> {
        if Instant::now() < expires {
            return Ok(Some(LockGuard::new_hold(self, token, expires)));
        }
        self.late_grant(flag, failures)?;
        Ok(None)
    }

    /// Count a late grant (see [`FairLock::fresh_hold`]); after `MAX_WAIT_FAILURES` in a row,
    /// pass the lock on and fail.
    fn late_grant(&self, flag: &str, failures: &mut u32) -> Result<()> {
        log::warn!(
            "fairlock: a grant of {:?} arrived after its lease had run out; re-checking",
            self.name
        );
        *failures += 1;
        if *failures >= MAX_WAIT_FAILURES {
            self.leave_after_error(flag);
            return Err(Error::Connection {
                during: "acquiring",
                detail: format!(
                    "{MAX_WAIT_FAILURES} grants arrived after their lease of {} ms had run out",
                    self.lease_ms()
                ),
            });
        }
        Ok(())
    }

    /// Block on the wake list until a hand-off, a retry request or the deadline.
    fn wait_for_grant(&self, flag: &str, deadline: Option<Instant>) -> Result<Waited> {
        let wake_key = self.keys.wake(flag);
        let read_margin = self.client.config.read_timeout;
        let mut conn = self.client.blocking.get().map_err(|e| Error::Connection {
            during: "waiting for the lock",
            detail: e.to_string(),
        })?;
        loop {
            let block = match deadline {
                None => MAX_BLOCK,
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left < MIN_BLOCK {
                        return Ok(Waited::Deadline);
                    }
                    left.min(MAX_BLOCK)
                }
            };
            conn.set_read_timeout(block + read_margin);
            let reply: Option<(String, String)> = conn
                .query(
                    redis::cmd("BLPOP")
                        .arg(&wake_key)
                        .arg(format!("{:.3}", block.as_secs_f64())),
                )
                .map_err(|e| Error::from_redis("waiting for the lock", e))?;
            match reply {
                None => continue,
                Some((_, msg)) => {
                    return Ok(match scripts::parse_wake(&msg)? {
                        Wake::Handoff { token, server_ms } => Waited::Handoff {
                            token,
                            grant_ms: server_ms,
                        },
                        Wake::Retry => Waited::Retry,
                    })
                }
            }
        }
    }

    /// The deadline passed: leave the queue, but keep a grant that reached us meanwhile
    /// (returned as its token and lease end).
    fn leave_at_deadline(&self, flag: &str) -> Result<Option<(u64, Instant)>> {
        let mut cmd = scripts::LEAVE.cmd(&self.keys);
        cmd.arg(flag).arg("claim");
        let at = Instant::now();
        let reply = self.client.with_conn("leaving the queue", |c| {
            scripts::LEAVE.run(c, &cmd, "leaving the queue")
        })?;
        Ok(match scripts::parse_leave(reply)? {
            Leave::Granted { token, pttl_ms, .. } => Some((token, at + ms(pttl_ms))),
            Leave::Left | Leave::Passed => None,
        })
    }

    /// After an error: give up the queue place and hand on anything granted to us, best effort
    /// (if Redis is unreachable the janitors of other clients remove the entry once it is stale).
    fn leave_after_error(&self, flag: &str) {
        let mut cmd = scripts::LEAVE.cmd(&self.keys);
        cmd.arg(flag).arg("pass");
        let result = self.client.with_conn("leaving the queue", |c| {
            scripts::LEAVE.run(c, &cmd, "leaving the queue")
        });
        if let Err(e) = result {
            log::debug!(
                "fairlock: could not leave the queue of {:?}: {e}",
                self.name
            );
        }
    }

    fn reenter(&self, hold: Rc<Hold>) -> Result<LockGuard> {
        let mut cmd = scripts::REENTER.cmd(&self.keys);
        cmd.arg(self.client.flag())
            .arg(hold.token)
            .arg(hold.depth.get());
        let reply = self.client.with_conn("re-entering", |c| {
            scripts::REENTER.run(c, &cmd, "re-entering")
        })?;
        if scripts::int(&reply).unwrap_or(0) == 0 {
            hold.state
                .lost
                .store(true, std::sync::atomic::Ordering::SeqCst);
            forget(self, &hold);
            return Err(Error::NotHeld {
                name: self.name.to_string(),
                holder: None,
            });
        }
        Ok(LockGuard::nested(self, hold))
    }
}

enum Waited {
    /// HANDOFF: the lock was granted to us at the server's `grant_ms`.
    Handoff { token: u64, grant_ms: i64 },
    /// The caller's deadline came; it still has to leave the queue.
    Deadline,
    /// NORMAL: our queue entry was dropped; run acquire again.
    Retry,
}

fn ms(v: i64) -> Duration {
    Duration::from_millis(v.max(0) as u64)
}

impl fmt::Debug for FairLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FairLock")
            .field("name", &self.name)
            .field("lease", &self.lease)
            .finish()
    }
}
