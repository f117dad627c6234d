//! The three locks the benchmarks compare, behind one small interface, and the clock they share.
//!
//! - `fairlock`: this crate (FIFO queue, a wake list per client, the release grants the lock).
//! - `redlock`: the `redlock` crate 2.0.0, single instance, its default retry (3 attempts per
//!   `lock` call, a random 0-200 ms sleep between them); a new TCP connection per command, as the
//!   crate does. A waiter calls `lock` again until it gets the lock.
//! - `naive`: the lock fairlock replaces (the user's original code): `SET key id NX PX 30000`,
//!   on failure sleep 100 ms and try again; release with an atomic compare-and-delete script. One connection per worker.
//! - `node-mutex`: node `redis-semaphore`'s Mutex, run by the driver's section "peer" in node
//!   worker processes (`benches/peers/redis-semaphore/mutex.js`), never in this process.
//!
//! Every lock lives in the worker thread that uses it (fairlock guards belong to their thread).
#![allow(dead_code)] // each bench target uses a different part

use std::time::{Duration, Instant};

#[path = "../../tests/it/support/mono_clock.rs"]
mod mono_clock;
/// CLOCK_MONOTONIC in nanoseconds: a release stamped in one process and the acquire it enabled,
/// stamped in another, can be subtracted.
pub use mono_clock::mono_ns;

/// Sleep until the monotonic clock reads `ns` (returns at once if it already has).
pub fn sleep_until_ns(ns: u64) {
    let now = mono_ns();
    if ns > now {
        std::thread::sleep(Duration::from_nanos(ns - now));
    }
}

/// The `Instant` at which the monotonic clock will read `ns`.
pub fn instant_at(ns: u64) -> Instant {
    let (now_i, now) = (Instant::now(), mono_ns());
    if ns >= now {
        now_i + Duration::from_nanos(ns - now)
    } else {
        now_i
            .checked_sub(Duration::from_nanos(now - ns))
            .unwrap_or(now_i)
    }
}

/// Which lock a benchmark runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lib {
    Fairlock,
    /// fairlock's semaphore of one permit (the semaphore's protocol doing a lock's job)
    Semaphore,
    /// fairlock's read/write lock, writes only
    RwWrite,
    Redlock,
    Naive,
    /// node `redis-semaphore`'s Mutex, which barges (`benches/peers/redis-semaphore/mutex.js`):
    /// runs in node worker processes only (the driver's section "peer"), not in `ALL`
    NodeMutex,
}

impl Lib {
    pub const ALL: [Lib; 5] = [
        Lib::Fairlock,
        Lib::Semaphore,
        Lib::RwWrite,
        Lib::Redlock,
        Lib::Naive,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Lib::Fairlock => "fairlock",
            Lib::Semaphore => "fairlock-sem",
            Lib::RwWrite => "fairlock-rw",
            Lib::Redlock => "redlock",
            Lib::Naive => "naive",
            Lib::NodeMutex => "node-mutex",
        }
    }

    /// Whether it runs on a fairlock client.
    pub fn is_fairlock(self) -> bool {
        matches!(self, Lib::Fairlock | Lib::Semaphore | Lib::RwWrite)
    }

    pub fn parse(s: &str) -> Option<Lib> {
        Lib::ALL.into_iter().find(|l| l.name() == s)
    }
}

/// Lease / TTL of the peers' locks: long enough never to expire during a benchmark.
pub const PEER_TTL_MS: usize = 30_000;
/// The naive lock's retry sleep (the original code's value).
pub const NAIVE_RETRY: Duration = Duration::from_millis(100);

const COMPARE_AND_DELETE: &str = r"if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('del', KEYS[1])
end
return 0";

/// One worker's handle on the lock under test.
pub enum Locker {
    Fair {
        lock: fairlock::FairLock,
        guard: Option<fairlock::LockGuard>,
    },
    Sem {
        sem: fairlock::Semaphore,
        permit: Option<fairlock::Permit>,
    },
    Rw {
        rw: fairlock::RwLock,
        guard: Option<fairlock::WriteGuard>,
    },
    Red {
        rl: redlock::RedLock,
        resource: Vec<u8>,
        val: Option<Vec<u8>>,
    },
    Naive {
        conn: redis::Connection,
        key: String,
        id: String,
        held: bool,
        unlock: redis::Script,
    },
}

pub type Res<T> = std::result::Result<T, String>;

fn err<E: std::fmt::Display>(during: &'static str) -> impl Fn(E) -> String {
    move |e| format!("{during}: {e}")
}

impl Locker {
    /// A handle on lock `name`. `client` is the process's fairlock client (fairlock only).
    pub fn new(
        lib: Lib,
        url: &str,
        name: &str,
        client: Option<&fairlock::LockClient>,
        worker_id: &str,
    ) -> Res<Locker> {
        Ok(match lib {
            Lib::Fairlock => {
                let client = client.ok_or("fairlock needs a client")?;
                Locker::Fair {
                    lock: client
                        .fair_lock(name)
                        .map_err(err("fairlock lock handle"))?,
                    guard: None,
                }
            }
            Lib::Semaphore => Locker::Sem {
                sem: client
                    .ok_or("fairlock needs a client")?
                    .semaphore(name, 1)
                    .map_err(err("fairlock semaphore handle"))?,
                permit: None,
            },
            Lib::RwWrite => Locker::Rw {
                rw: client
                    .ok_or("fairlock needs a client")?
                    .rw_lock(name)
                    .map_err(err("fairlock rw lock handle"))?,
                guard: None,
            },
            Lib::Redlock => Locker::Red {
                rl: redlock::RedLock::new(vec![url.to_string()]),
                resource: format!("redlock:{name}").into_bytes(),
                val: None,
            },
            Lib::Naive => Locker::Naive {
                conn: redis::Client::open(url)
                    .and_then(|c| c.get_connection())
                    .map_err(err("naive connect"))?,
                key: format!("naive:{name}"),
                id: format!("{}-{worker_id}", std::process::id()),
                held: false,
                unlock: redis::Script::new(COMPARE_AND_DELETE),
            },
            Lib::NodeMutex => return Err("node-mutex runs in node processes only".into()),
        })
    }

    /// Take the lock, waiting until the monotonic clock reads `give_up` at the latest.
    /// `Ok(Some(fencing token))` (0 for the peers, which have none), `Ok(None)` when it gave up.
    pub fn acquire(&mut self, give_up: u64) -> Res<Option<u64>> {
        match self {
            Locker::Fair { lock, guard } => {
                match lock
                    .try_lock_until(instant_at(give_up))
                    .map_err(err("fairlock acquire"))?
                {
                    Some(g) => {
                        let token = g.fencing_token();
                        *guard = Some(g);
                        Ok(Some(token))
                    }
                    None => Ok(None),
                }
            }
            Locker::Sem { sem, permit } => {
                let deadline = instant_at(give_up);
                match sem
                    .try_acquire_many_until(1, deadline)
                    .map_err(err("fairlock-sem acquire"))?
                {
                    Some(p) => {
                        let token = p.fencing_token();
                        *permit = Some(p);
                        Ok(Some(token))
                    }
                    None => Ok(None),
                }
            }
            Locker::Rw { rw, guard } => {
                match rw
                    .try_write_until(instant_at(give_up))
                    .map_err(err("fairlock-rw acquire"))?
                {
                    Some(g) => {
                        let token = g.fencing_token();
                        *guard = Some(g);
                        Ok(Some(token))
                    }
                    None => Ok(None),
                }
            }
            Locker::Red { rl, resource, val } => loop {
                let got = rl
                    .lock(resource, PEER_TTL_MS)
                    .map_err(err("redlock acquire"))?;
                if let Some(l) = got {
                    *val = Some(l.val);
                    return Ok(Some(0));
                }
                if mono_ns() >= give_up {
                    return Ok(None);
                }
            },
            Locker::Naive {
                conn,
                key,
                id,
                held,
                ..
            } => loop {
                let ok: Option<String> = redis::cmd("SET")
                    .arg(&*key)
                    .arg(&*id)
                    .arg("NX")
                    .arg("PX")
                    .arg(PEER_TTL_MS)
                    .query(conn)
                    .map_err(err("naive acquire"))?;
                if ok.is_some() {
                    *held = true;
                    return Ok(Some(0));
                }
                if mono_ns() + NAIVE_RETRY.as_nanos() as u64 > give_up {
                    return Ok(None);
                }
                std::thread::sleep(NAIVE_RETRY);
            },
        }
    }

    /// Release the lock taken by the last successful `acquire`.
    pub fn release(&mut self) -> Res<()> {
        match self {
            Locker::Fair { guard, .. } => match guard.take() {
                Some(g) => g.unlock().map_err(err("fairlock release")),
                None => Err("fairlock release: not held".into()),
            },
            Locker::Sem { permit, .. } => match permit.take() {
                Some(p) => p.release().map_err(err("fairlock-sem release")),
                None => Err("fairlock-sem release: not held".into()),
            },
            Locker::Rw { guard, .. } => match guard.take() {
                Some(g) => g.unlock().map_err(err("fairlock-rw release")),
                None => Err("fairlock-rw release: not held".into()),
            },
            Locker::Red { rl, resource, val } => {
                let val = val.take().ok_or("redlock release: not held")?;
                let lock = redlock::Lock {
                    resource: resource.clone(),
                    val,
                    validity_time: 0,
                    lock_manager: rl,
                };
                rl.unlock(&lock);
                Ok(())
            }
            Locker::Naive {
                conn,
                key,
                id,
                held,
                unlock,
            } => {
                if !*held {
                    return Err("naive release: not held".into());
                }
                *held = false;
                let n: i64 = unlock
                    .key(&*key)
                    .arg(&*id)
                    .invoke(conn)
                    .map_err(err("naive release"))?;
                if n == 1 {
                    Ok(())
                } else {
                    Err("naive release: the lock was not ours".into())
                }
            }
        }
    }
}
