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
//! - `fair-floor` (FCALL) and `fair-floor-eval` (the same Lua by EVALSHA): the least a FIFO lock
//!   with push wake-ups does on Redis, a yardstick for section "peer" and never a product (see
//!   [`FLOOR_LIBRARY`]).
//! - `fair-floor-list`: a FIFO lock with no script at all, a token passed through a list
//!   (`BLPOP` to take it, `RPUSH` to give it back): the least there is, also a yardstick only.
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

/// A fair floor's wait: `BLPOP key` for at most [`FLOOR_WAIT`]; `what` names the call and
/// `empty` what a timeout means.
fn floor_pop(conn: &mut redis::Connection, key: &str, what: &'static str, empty: &str) -> Res<()> {
    let secs = FLOOR_WAIT.as_secs_f64();
    let popped: Option<(String, String)> = redis::cmd("BLPOP")
        .arg(key)
        .arg(format!("{secs:.3}"))
        .query(conn)
        .map_err(err(what))?;
    match popped {
        Some(_) => Ok(()),
        None => Err(format!("{what}: {empty} in {secs} s")),
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
    /// the floor of a fair lock on Redis, its scripts by FCALL (see [`FLOOR_LIBRARY`]): section
    /// "peer" only, not in `ALL`
    FairFloor,
    /// the same, its scripts by EVALSHA
    FairFloorEval,
    /// a token in a list, taken by BLPOP and given back by RPUSH (see `Locker::FloorList`)
    FairFloorList,
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
            Lib::FairFloor => "fair-floor",
            Lib::FairFloorEval => "fair-floor-eval",
            Lib::FairFloorList => "fair-floor-list",
        }
    }

    /// Whether it runs on a fairlock client.
    pub fn is_fairlock(self) -> bool {
        matches!(self, Lib::Fairlock | Lib::Semaphore | Lib::RwWrite)
    }

    /// Whether it is the fair floor (FCALL or EVALSHA).
    pub fn is_floor(self) -> bool {
        matches!(self, Lib::FairFloor | Lib::FairFloorEval)
    }

    /// Whether it is a yardstick of section "peer": the fair floor, by script or by list.
    pub fn is_yardstick(self) -> bool {
        self.is_floor() || self == Lib::FairFloorList
    }

    /// Whether its client sends RPUSH itself (not only its scripts).
    pub fn client_rpush(self) -> bool {
        self == Lib::FairFloorList
    }

    /// Whether its scripts run SET themselves and its client never does (a SET in
    /// `INFO commandstats` is then no round trip of its own).
    pub fn scripts_set(self) -> bool {
        self.is_fairlock() || self.is_floor()
    }

    pub fn parse(s: &str) -> Option<Lib> {
        Lib::ALL
            .into_iter()
            .chain([Lib::FairFloor, Lib::FairFloorEval, Lib::FairFloorList])
            .find(|l| l.name() == s)
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

/// The fair floor: the least a FIFO lock with push wake-ups does on Redis, as a Redis FUNCTION
/// library (`FUNCTION LOAD REPLACE`, called by FCALL; `fair-floor-eval` runs the same bodies by
/// EVALSHA, see [`FLOOR_ACQUIRE`] and [`FLOOR_RELEASE`]). A yardstick for the benchmark, never a
/// product: no crash safety (a holder that dies keeps the lock forever, a waiter that dies
/// leaves the lock to nobody when its turn comes), no leases or TTLs, no reentrancy, no fencing
/// tokens, no heartbeats, no timeouts of queued waiters.
///
/// Keys (all of one hash tag, the lock's name): `fair-floor:{name}:owner`, a string holding the
/// owner's id; `fair-floor:{name}:queue`, a list of the waiters' ids in arrival order. A worker's
/// id is the name of its own wake list (`fair-floor:{name}:wake:<pid>-<worker>`), so a queue
/// entry is at once who gets the lock and where to tell them.
///
/// - `fairfloor_acquire(owner, queue; id)`: `SET owner id NX`; taken: 1. Else `RPUSH queue id`: 0,
///   and the caller waits with `BLPOP` on its wake list, after which it owns the lock. The queue
///   is non-empty only while the lock is owned (the release hands it over in the same script),
///   so a free owner key means nobody is queued: one SET NX decides.
/// - `fairfloor_release(owner, queue; id)`: not the owner: 0. `LPOP queue`: nobody, `DEL owner`;
///   else `SET owner next` and `RPUSH next 1` (wake the next one, who already owns the lock). 1.
pub const FLOOR_LIBRARY: &str = r"#!lua name=fairfloor
redis.register_function('fairfloor_acquire', function(KEYS, ARGV)
  if redis.call('set', KEYS[1], ARGV[1], 'NX') then return 1 end
  redis.call('rpush', KEYS[2], ARGV[1])
  return 0
end)
redis.register_function('fairfloor_release', function(KEYS, ARGV)
  if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end
  local next = redis.call('lpop', KEYS[2])
  if not next then
    redis.call('del', KEYS[1])
  else
    redis.call('set', KEYS[1], next)
    redis.call('rpush', next, '1')
  end
  return 1
end)
redis.register_function('fairfloor_noop', function(KEYS, ARGV) return 1 end)
";

/// The body of `fairfloor_acquire` as a script of its own, for EVALSHA (`fair-floor-eval`).
pub const FLOOR_ACQUIRE: &str = r"if redis.call('set', KEYS[1], ARGV[1], 'NX') then return 1 end
redis.call('rpush', KEYS[2], ARGV[1])
return 0";

/// The body of `fairfloor_release` as a script of its own, for EVALSHA (`fair-floor-eval`).
pub const FLOOR_RELEASE: &str = r"if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end
local next = redis.call('lpop', KEYS[2])
if not next then
  redis.call('del', KEYS[1])
else
  redis.call('set', KEYS[1], next)
  redis.call('rpush', next, '1')
end
return 1";

/// Node `redis-semaphore`'s release script (its `delIfEqualLua`), for the per-call side
/// measurement of section "peer".
pub const NODE_RELEASE: &str = r"
  local key = KEYS[1]
  local identifier = ARGV[1]

  if redis.call('get', key) == identifier then
    return redis.call('del', key)
  end

  return 0
  ";

/// How long a fair-floor waiter waits for its wake-up at most before it calls the run broken.
pub const FLOOR_WAIT: Duration = Duration::from_secs(5);

/// The fair floor's keys of lock `name`: (owner, queue, the wake-list prefix).
pub fn floor_keys(name: &str) -> (String, String, String) {
    let base = format!("fair-floor:{{{name}}}");
    (
        format!("{base}:owner"),
        format!("{base}:queue"),
        format!("{base}:wake:"),
    )
}

/// Load the fair floor's library (`FUNCTION LOAD REPLACE`).
/// The list lock's keys of lock `name`: (the token list, the key that says it was set up).
pub fn floor_list_keys(name: &str) -> (String, String) {
    let base = format!("fair-floor-list:{{{name}}}");
    (format!("{base}:token"), format!("{base}:init"))
}

pub fn load_floor(conn: &mut redis::Connection) -> redis::RedisResult<()> {
    redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(FLOOR_LIBRARY)
        .query::<String>(conn)
        .map(drop)
}

/// The fair floor's scripts as one worker calls them: by FCALL, or by EVALSHA.
pub enum FloorCalls {
    Fcall,
    Evalsha {
        acquire: redis::Script,
        release: redis::Script,
    },
}

impl FloorCalls {
    /// Call the floor's acquire (`release == false`) or release script on `owner`, `queue`.
    fn call(
        &self,
        conn: &mut redis::Connection,
        release: bool,
        owner: &str,
        queue: &str,
        id: &str,
    ) -> redis::RedisResult<i64> {
        match self {
            FloorCalls::Fcall => redis::cmd("FCALL")
                .arg(if release {
                    "fairfloor_release"
                } else {
                    "fairfloor_acquire"
                })
                .arg(2)
                .arg(owner)
                .arg(queue)
                .arg(id)
                .query(conn),
            FloorCalls::Evalsha {
                acquire,
                release: r,
            } => {
                let script = if release { r } else { acquire };
                script.key(owner).key(queue).arg(id).invoke(conn)
            }
        }
    }
}

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
    Floor {
        conn: redis::Connection,
        owner: String,
        queue: String,
        /// this worker's id: the name of its wake list
        id: String,
        calls: FloorCalls,
        held: bool,
    },
    /// `fair-floor-list`: the lock is a token in a list. Acquire: `BLPOP token` (Redis serves
    /// the clients blocked on a key in the order they blocked: FIFO, and the wake-up is a push);
    /// release: `RPUSH token 1`. The first worker to `SET init 1 NX` puts the token in. No
    /// owner (the release cannot check who calls it), no crash safety (a holder that dies takes
    /// the token with it): a yardstick only, like [`FLOOR_LIBRARY`].
    FloorList {
        conn: redis::Connection,
        token: String,
        held: bool,
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
            Lib::FairFloor | Lib::FairFloorEval => {
                let mut conn = redis::Client::open(url)
                    .and_then(|c| c.get_connection())
                    .map_err(err("fair-floor connect"))?;
                let calls = if lib == Lib::FairFloor {
                    load_floor(&mut conn).map_err(err("fair-floor FUNCTION LOAD"))?;
                    FloorCalls::Fcall
                } else {
                    FloorCalls::Evalsha {
                        acquire: redis::Script::new(FLOOR_ACQUIRE),
                        release: redis::Script::new(FLOOR_RELEASE),
                    }
                };
                let (owner, queue, wake) = floor_keys(name);
                Locker::Floor {
                    conn,
                    owner,
                    queue,
                    id: format!("{wake}{}-{worker_id}", std::process::id()),
                    calls,
                    held: false,
                }
            }
            Lib::FairFloorList => {
                let mut conn = redis::Client::open(url)
                    .and_then(|c| c.get_connection())
                    .map_err(err("fair-floor-list connect"))?;
                let (token, init) = floor_list_keys(name);
                let first: Option<String> = redis::cmd("SET")
                    .arg(&init)
                    .arg(1)
                    .arg("NX")
                    .query(&mut conn)
                    .map_err(err("fair-floor-list set up"))?;
                if first.is_some() {
                    redis::cmd("RPUSH")
                        .arg(&token)
                        .arg(1)
                        .query::<i64>(&mut conn)
                        .map_err(err("fair-floor-list set up"))?;
                }
                Locker::FloorList {
                    conn,
                    token,
                    held: false,
                }
            }
            Lib::NodeMutex => return Err("node-mutex runs in node processes only".into()),
        })
    }

    /// The fair floor's id of this worker, for the FIFO audit: what its acquire calls pass
    /// (`fair-floor`), or the address of its connection as MONITOR shows it (`fair-floor-list`).
    pub fn floor_id(&mut self) -> Option<String> {
        match self {
            Locker::Floor { id, .. } => Some(id.clone()),
            Locker::FloorList { conn, .. } => {
                let info: String = redis::cmd("CLIENT").arg("INFO").query(conn).ok()?;
                info.split(' ')
                    .find_map(|kv| kv.strip_prefix("addr="))
                    .map(str::to_string)
            }
            _ => None,
        }
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
            Locker::Floor {
                conn,
                owner,
                queue,
                id,
                calls,
                held,
            } => {
                let got = calls
                    .call(conn, false, owner, queue, id)
                    .map_err(err("fair-floor acquire"))?;
                if got != 1 {
                    // queued: the release that hands the lock over pushes onto our wake list
                    floor_pop(
                        conn,
                        id,
                        "fair-floor wait",
                        "not woken (the queue is stuck)",
                    )?;
                }
                *held = true;
                Ok(Some(0))
            }
            Locker::FloorList { conn, token, held } => {
                floor_pop(
                    conn,
                    token,
                    "fair-floor-list acquire",
                    "no token (the token is lost)",
                )?;
                *held = true;
                Ok(Some(0))
            }
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
            Locker::Floor {
                conn,
                owner,
                queue,
                id,
                calls,
                held,
            } => {
                if !*held {
                    return Err("fair-floor release: not held".into());
                }
                *held = false;
                match calls.call(conn, true, owner, queue, id) {
                    Ok(1) => Ok(()),
                    Ok(_) => Err("fair-floor release: the lock was not ours".into()),
                    Err(e) => Err(format!("fair-floor release: {e}")),
                }
            }
            Locker::FloorList { conn, token, held } => {
                if !*held {
                    return Err("fair-floor-list release: not held".into());
                }
                *held = false;
                redis::cmd("RPUSH")
                    .arg(&*token)
                    .arg(1)
                    .query::<i64>(conn)
                    .map(drop)
                    .map_err(err("fair-floor-list release"))
            }
        }
    }
}
