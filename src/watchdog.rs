//! The watchdog: one thread per client renews the leases of all held locks without a fixed
//! lease, every third of the lease, in one pipelined round trip for all that are due.
//!
//! Renewal stops the moment a guard is released (the guard unregisters before its release goes
//! out), and the renew script checks owner *and* token, so a released hold never extends the next
//! owner's lease. A renewal that finds the lock gone or taken marks the hold lost and logs a
//! warning; a renewal that fails on the network is retried until the lease would have run out.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use parking_lot::Mutex;
use redis::Value;

use crate::connection::Manager;
use crate::error::{Error, Result};
use crate::guard::HoldState;
use crate::keys::LockKeys;
use crate::lock::FairLock;
use crate::scripts::{self, is_noscript};

struct Renewal {
    name: String,
    keys: LockKeys,
    flag: String,
    token: u64,
    lease: Duration,
    state: Arc<HoldState>,
    due: Instant,
}

#[derive(Default)]
struct Registry {
    entries: HashMap<u64, Renewal>,
    /// When the thread will wake next (`None`: idle). Under the same mutex as `entries`, so a new
    /// hold always knows whether it must wake the thread.
    planned: Option<Instant>,
}

pub(crate) struct Watchdog {
    registry: Arc<Mutex<Registry>>,
    next_id: AtomicU64,
    nudge: Sender<()>,
}

impl Watchdog {
    /// `lease` is the client's default lease: with no holds, the thread still wakes every sixth
    /// of it, so a new hold with that lease (first due after a third) never needs to wake it.
    pub fn start(pool: r2d2::Pool<Manager>, client_id: &str, lease: Duration) -> Result<Watchdog> {
        let idle_wake = (lease / 6).max(Duration::from_millis(50));
        let registry = Arc::new(Mutex::new(Registry::default()));
        let (nudge, rx) = crossbeam_channel::unbounded();
        let reg = registry.clone();
        thread::Builder::new()
            .name(format!("fairlock-watchdog-{}", &client_id[..8]))
            .spawn(move || run(&pool, &reg, &rx, idle_wake))
            .map_err(|e| Error::InvalidConfig {
                setting: "threads",
                reason: format!("cannot start the watchdog thread: {e}"),
            })?;
        Ok(Watchdog {
            registry,
            next_id: AtomicU64::new(1),
            nudge,
        })
    }

    pub fn register(
        &self,
        lock: &FairLock,
        token: u64,
        lease: Duration,
        state: Arc<HoldState>,
        expires: Instant,
    ) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        // First renewal when a third of the lease has passed (measured from the grant).
        let due = expires
            .checked_sub(lease * 2 / 3)
            .unwrap_or_else(Instant::now);
        let mut registry = self.registry.lock();
        // Wake the thread only if this hold is due before its planned wake: a wake-up per
        // acquisition costs a context switch on a busy machine.
        let wake = registry.planned.is_none_or(|planned| due < planned);
        if wake {
            registry.planned = Some(due);
        }
        registry.entries.insert(
            id,
            Renewal {
                name: lock.name().to_string(),
                keys: lock.keys().clone(),
                flag: lock.client().flag(),
                token,
                lease,
                state,
                due,
            },
        );
        if wake {
            let _ = self.nudge.send(());
        }
        id
    }

    pub fn unregister(&self, id: u64) {
        self.registry.lock().entries.remove(&id);
    }
}

fn run(
    pool: &r2d2::Pool<Manager>,
    registry: &Mutex<Registry>,
    nudge: &Receiver<()>,
    idle_wake: Duration,
) {
    loop {
        let next = {
            let mut reg = registry.lock();
            let next = reg
                .entries
                .values()
                .map(|r| r.due)
                .min()
                .unwrap_or_else(|| Instant::now() + idle_wake);
            reg.planned = Some(next);
            next
        };
        let wait = next.saturating_duration_since(Instant::now());
        match nudge.recv_timeout(wait) {
            Ok(()) => continue,
            Err(RecvTimeoutError::Disconnected) => return,
            Err(RecvTimeoutError::Timeout) => renew_due(pool, registry),
        }
    }
}

fn renew_due(pool: &r2d2::Pool<Manager>, registry: &Mutex<Registry>) {
    let now = Instant::now();
    // Snapshot what is due and let go of the registry: guards must never wait on the network.
    let due: Vec<(u64, redis::Cmd)> = registry
        .lock()
        .entries
        .iter()
        .filter(|(_, r)| r.due <= now + Duration::from_millis(5))
        .map(|(id, r)| {
            let mut cmd = scripts::RENEW.cmd(&r.keys);
            cmd.arg(&r.flag)
                .arg(r.token)
                .arg(r.lease.as_millis() as u64);
            (*id, cmd)
        })
        .collect();
    if due.is_empty() {
        return;
    }
    let mut pipe = redis::pipe();
    for (_, cmd) in &due {
        pipe.add_command(cmd.clone());
    }
    let sent = Instant::now();
    let replies = send(pool, &pipe);

    let mut reg = registry.lock();
    match replies {
        Ok(values) => {
            for ((id, _), value) in due.iter().zip(values) {
                let Some(r) = reg.entries.get_mut(id) else {
                    continue; // released meanwhile: its result means nothing now
                };
                if scripts::int(&value) == Some(1) {
                    *r.state.expires.lock() = sent + r.lease;
                    r.due = sent + r.lease / 3;
                } else {
                    log::warn!(
                        "fairlock: lock {:?} (token {}) was lost: renewal found it gone or held by another owner",
                        r.name, r.token
                    );
                    r.state.lost.store(true, Ordering::SeqCst);
                    reg.entries.remove(id);
                }
            }
        }
        Err(e) => {
            for (id, _) in &due {
                let Some(r) = reg.entries.get_mut(id) else {
                    continue;
                };
                let expires = *r.state.expires.lock();
                if Instant::now() >= expires {
                    log::warn!(
                        "fairlock: lock {:?} (token {}) is presumed lost: its lease ran out while Redis could not be reached ({e})",
                        r.name, r.token
                    );
                    r.state.lost.store(true, Ordering::SeqCst);
                    reg.entries.remove(id);
                } else {
                    log::warn!(
                        "fairlock: renewing lock {:?} failed ({e}); retrying",
                        r.name
                    );
                    r.due = Instant::now() + (r.lease / 10).min(Duration::from_millis(500));
                }
            }
        }
    }
}

/// Send a pipeline of renew (or heartbeat) scripts; load the script and resend on NOSCRIPT.
pub(crate) fn send_pipeline(
    pool: &r2d2::Pool<Manager>,
    pipe: &redis::Pipeline,
    script: &scripts::LuaScript,
    during: &'static str,
) -> Result<Vec<Value>> {
    let mut conn = pool.get().map_err(|e| Error::Connection {
        during,
        detail: e.to_string(),
    })?;
    let first: redis::RedisResult<Vec<Value>> = conn.query_pipeline(pipe);
    let values = match first {
        Err(e) if is_noscript(&e) => {
            script.load(&mut conn, during)?;
            conn.query_pipeline(pipe)
        }
        other => other,
    }
    .map_err(|e| Error::from_redis(during, e))?;
    if values
        .iter()
        .any(|v| matches!(v, Value::ServerError(e) if e.code() == "NOSCRIPT"))
    {
        script.load(&mut conn, during)?;
        return conn
            .query_pipeline(pipe)
            .map_err(|e| Error::from_redis(during, e));
    }
    Ok(values)
}

fn send(pool: &r2d2::Pool<Manager>, pipe: &redis::Pipeline) -> Result<Vec<Value>> {
    send_pipeline(pool, pipe, &scripts::RENEW, "renewing leases")
}
