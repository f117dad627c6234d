//! The worker process: T threads take the workload's locks in a loop through the proxy and, in
//! each critical section, do a read-modify-write on the lock's counter (GET, sleep, SET: not
//! INCR, so a second owner loses updates) and a fenced write on the lock's resource.
//! Library errors are recorded, never fatal. The parent stops the worker by closing its stdin.
//!
//! The workload (`FAIRLOCK_CHAOS_WORKLOAD`, [`Workload`]) is the mutex's (above), `sem` or `rw`:
//! - `sem`: each name is a [`fairlock::Semaphore`] of capacity [`SEM_CAPACITY`]; a thread takes
//!   1 or 2 permits (`acquire_many`), holds them 0-3 ms and gives them back. No counter and no
//!   fenced write (holders share the semaphore: its tokens order grants, not writes).
//! - `rw`: each name is a [`fairlock::RwLock`]; a quarter of the holds are writes, which do the
//!   mutex's counter read-modify-write and fenced write; reads hold 0-3 ms and write nothing.
//!
//! Either way the thread records the hold as the mutex's does (REQ with the permits asked, ACQ,
//! UNLOCK before the release, REL with the outcome and whether the hold said it was lost:
//! `is_lost()` or its lost signal), so the checker sees each hold's interval from inside it.
//!
//! In the Sentinel and Cluster modes the locks live on the topology (`redis+sentinel://` or
//! `redis+cluster://`) and the counter and the fenced resource on a redis-server of their own
//! that no fault touches, as a database would be: a failover that loses writes then loses lock
//! state only, and a lost update or a stale token accepted is the lock's doing.

use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use super::history::{now_ns, History};

pub const ENV_URL: &str = "FAIRLOCK_CHAOS_URL";
pub const ENV_HISTORY: &str = "FAIRLOCK_CHAOS_HISTORY";
pub const ENV_THREADS: &str = "FAIRLOCK_CHAOS_THREADS";
pub const ENV_LOCKS: &str = "FAIRLOCK_CHAOS_LOCKS";
pub const ENV_LIMIT: &str = "FAIRLOCK_CHAOS_LIMIT_SECS";
/// The CA to trust, for a TLS topology (unset: no TLS settings).
pub const ENV_TLS_CA: &str = "FAIRLOCK_CHAOS_TLS_CA";
/// Where the counter and the fenced resource live (default: `ENV_URL`).
pub const ENV_RESOURCE_URL: &str = "FAIRLOCK_CHAOS_RESOURCE_URL";
/// What the workers take: `mutex` (default), `sem` or `rw` ([`Workload`]).
pub const ENV_WORKLOAD: &str = "FAIRLOCK_CHAOS_WORKLOAD";

/// The capacity of the `sem` workload's semaphores.
pub const SEM_CAPACITY: u64 = 3;
/// The permits of a read/write lock (a write takes them all): `fairlock::raw::RW_CAPACITY`.
pub const RW_CAPACITY: u64 = 1 << 30;

/// What the workers contend for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// `fair_lock`: one holder at a time (counter, fenced write).
    Mutex,
    /// `semaphore(name, SEM_CAPACITY)`: holds of 1-2 permits.
    Sem,
    /// `rw_lock(name)`: mostly reads, a quarter writes (counter, fenced write).
    Rw,
}

impl Workload {
    pub fn parse(s: &str) -> Option<Workload> {
        match s {
            "mutex" | "" => Some(Workload::Mutex),
            "sem" => Some(Workload::Sem),
            "rw" => Some(Workload::Rw),
            _ => None,
        }
    }

    /// `FAIRLOCK_CHAOS_WORKLOAD` (default `mutex`); panics on an unknown name.
    pub fn from_env() -> Workload {
        let v = std::env::var(ENV_WORKLOAD).unwrap_or_default();
        Workload::parse(&v).unwrap_or_else(|| panic!("{ENV_WORKLOAD}={v:?}: mutex, sem or rw"))
    }

    pub fn name(self) -> &'static str {
        match self {
            Workload::Mutex => "mutex",
            Workload::Sem => "sem",
            Workload::Rw => "rw",
        }
    }

    /// The permits one name has (`None`: a mutex, one holder).
    pub fn capacity(self) -> Option<u64> {
        match self {
            Workload::Mutex => None,
            Workload::Sem => Some(SEM_CAPACITY),
            Workload::Rw => Some(RW_CAPACITY),
        }
    }
}

/// The workload's settings (the parent's checker uses the same).
pub const LEASE: Duration = Duration::from_secs(1);
pub const JANITOR: Duration = Duration::from_millis(200);
/// Short, so a request the proxy holds back (a late delivery) is soon given up on: the
/// connection is dropped and the thread moves on while the request is still on its way.
pub const READ_TIMEOUT: Duration = Duration::from_secs(1);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Through Sentinel or on a Cluster: how long a call rides out a failover (about 2 to 6 s
/// here). No effect on one node.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(30);
const ERROR_PAUSE: Duration = Duration::from_millis(50);

/// The resource side of fencing (docs/guarantees.md, "Fencing"), plus what the checker needs: a sequence
/// number in Redis's execution order and an epoch that changes when the resource is lost (a
/// restart without persistence), so accepted writes can be put in order.
/// KEYS[1] = resource hash; ARGV[1] = token, ARGV[2] = writer.
/// Returns {'ok', seq, epoch} | {'stale', highest token accepted, epoch}.
const FENCED_WRITE: &str = r#"
local epoch = redis.call('HGET', KEYS[1], 'epoch')
if not epoch then
  local t = redis.call('TIME')
  epoch = t[1] .. '.' .. t[2]
  redis.call('HSET', KEYS[1], 'epoch', epoch)
end
local max = tonumber(redis.call('HGET', KEYS[1], 'max') or '0')
local token = tonumber(ARGV[1])
if token < max then return { 'stale', max, epoch } end
local seq = redis.call('HINCRBY', KEYS[1], 'seq', 1)
redis.call('HSET', KEYS[1], 'max', ARGV[1], 'value', ARGV[2])
return { 'ok', seq, epoch }
"#;

pub fn counter_key(lock: &str) -> String {
    format!("chaos:{{{lock}}}:counter")
}

pub fn resource_key(lock: &str) -> String {
    format!("chaos:{{{lock}}}:resource")
}

/// xorshift64*: enough randomness for choosing locks and sleeps, no dependency.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

static HISTORY: OnceLock<Arc<History>> = OnceLock::new();

/// Sends the library's warnings to the history (they explain many fault-time events).
struct HistoryLogger;

impl log::Log for HistoryLogger {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::Level::Warn
    }

    fn log(&self, record: &log::Record) {
        if let Some(h) = HISTORY.get() {
            if self.enabled(record.metadata()) {
                h.log("-", &format!("LOG {} {}", record.level(), record.args()));
            }
        }
    }

    fn flush(&self) {}
}

fn env<T: std::str::FromStr>(name: &str) -> T {
    std::env::var(name)
        .unwrap_or_else(|_| panic!("worker needs {name}"))
        .parse()
        .unwrap_or_else(|_| panic!("bad {name}"))
}

/// The worker's main. Exits the process itself: 0 when every thread finished after the stop.
pub fn run() -> ! {
    let url: String = env(ENV_URL);
    let path: String = env(ENV_HISTORY);
    let threads: usize = env(ENV_THREADS);
    let locks: Vec<String> = env::<String>(ENV_LOCKS)
        .split(',')
        .map(str::to_string)
        .collect();
    let limit = Duration::from_secs(env(ENV_LIMIT));
    let resource_url = std::env::var(ENV_RESOURCE_URL).unwrap_or_else(|_| url.clone());
    let workload = Workload::from_env();
    thread::spawn(move || {
        thread::sleep(limit);
        eprintln!(
            "chaos worker {}: time limit {limit:?} reached",
            std::process::id()
        );
        std::process::exit(3);
    });

    let history = Arc::new(History::create(std::path::Path::new(&path)));
    let _ = HISTORY.set(history.clone());
    let _ = log::set_logger(&HistoryLogger);
    log::set_max_level(log::LevelFilter::Warn);

    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        thread::spawn(move || {
            // the parent closes our stdin to stop us (and so does its death)
            let mut sink = Vec::new();
            let _ = std::io::stdin().read_to_end(&mut sink);
            stop.store(true, Ordering::SeqCst);
        });
    }

    // Redis may be restarting or black-holed right now: keep trying for a while.
    let started = Instant::now();
    let tls_ca = std::env::var_os(ENV_TLS_CA);
    let client = loop {
        let mut builder = fairlock::LockClient::builder(&url);
        if let Some(ca) = &tls_ca {
            builder = builder.tls_ca_file(ca);
        }
        match builder
            .lease(LEASE)
            .janitor_interval(JANITOR)
            .connect_timeout(CONNECT_TIMEOUT)
            .read_timeout(READ_TIMEOUT)
            .failover_timeout(FAILOVER_TIMEOUT)
            .build()
        {
            Ok(c) => break c,
            Err(e) if started.elapsed() < Duration::from_secs(30) => {
                history.log("-", &format!("ERR - build {e}"));
                thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("chaos worker cannot connect: {e}"),
        }
    };

    let (done_tx, done_rx) = mpsc::channel();
    for i in 0..threads {
        let client = client.clone();
        let history = history.clone();
        let locks = locks.clone();
        let stop = stop.clone();
        let url = resource_url.clone();
        let done = done_tx.clone();
        thread::Builder::new()
            .name(format!("w{i}"))
            .spawn(move || {
                let seed = u64::from(std::process::id()) << 16 | i as u64;
                if workload == Workload::Mutex {
                    worker_thread(&client, &history, &locks, &stop, &url, i, seed);
                } else {
                    shared_thread(workload, &client, &history, &locks, &stop, &url, i, seed);
                }
                let _ = done.send(i);
            })
            .expect("worker thread");
    }
    drop(done_tx);

    // Every thread must finish within a bound once told to stop (a waiter gets its turn).
    while !stop.load(Ordering::SeqCst) {
        thread::sleep(Duration::from_millis(20));
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut finished = 0;
    while finished < threads {
        let left = deadline.saturating_duration_since(Instant::now());
        match done_rx.recv_timeout(left) {
            Ok(_) => finished += 1,
            Err(_) => {
                history.log("-", "ERR - stop threads still running 20 s after the stop");
                eprintln!("chaos worker: {} threads did not stop", threads - finished);
                std::process::exit(4);
            }
        }
    }
    history.log("-", "PHASE exit");
    std::process::exit(0);
}

/// A plain connection (through the proxy, or to the resource's own server) for the counter and
/// the resource.
fn resource_conn(url: &str) -> redis::RedisResult<redis::Connection> {
    let c = redis::Client::open(url)?.get_connection_with_timeout(CONNECT_TIMEOUT)?;
    c.set_read_timeout(Some(READ_TIMEOUT))?;
    c.set_write_timeout(Some(READ_TIMEOUT))?;
    Ok(c)
}

fn worker_thread(
    client: &fairlock::LockClient,
    h: &History,
    locks: &[String],
    stop: &AtomicBool,
    url: &str,
    me: usize,
    seed: u64,
) {
    let th = me.to_string();
    let mut rng = Rng::new(seed);
    let handles: Vec<_> = locks.iter().map(|n| client.fair_lock(n).unwrap()).collect();
    let script = redis::Script::new(FENCED_WRITE);
    let mut conn: Option<redis::Connection> = None;
    // Open this thread's pooled connection before the first REQ: the FIFO check dates a
    // request from its REQ line, and a first connection (through the sentinels, over TLS, on a
    // loaded machine) can take longer than the check's 100 ms margin before the request even
    // leaves (seen in the short TLS round: a first request overtaken by one sent 100 ms after
    // its REQ). Later connections are opened after faults, which the check excuses.
    let _ = handles[0].is_locked();
    while !stop.load(Ordering::SeqCst) {
        let pick = rng.range(0, handles.len() as u64 - 1) as usize;
        let (lock, name) = (&handles[pick], &locks[pick]);
        h.log(&th, &format!("REQ {name}"));
        let guard = match lock.lock() {
            Ok(g) => g,
            Err(e) => {
                h.log(&th, &format!("ERR {name} lock {e}"));
                thread::sleep(ERROR_PAUSE);
                continue;
            }
        };
        let token = guard.fencing_token();
        let left = guard.lease_remaining().as_micros();
        h.log(&th, &format!("ACQ {name} {token} {left}"));
        let ok = critical_section(h, &th, name, token, &mut conn, url, &script, &mut rng);
        let lost = u8::from(guard.is_lost());
        // the critical section ends here (REL, with the outcome, is written once unlock returns:
        // a SIGKILL in between must not stretch the hold to the kill)
        let t = now_ns();
        h.log_at(t, &th, &format!("UNLOCK {name}"));
        match guard.unlock() {
            Ok(()) => h.log_at(t, &th, &format!("REL {name} ok {lost} {}", now_ns())),
            Err(e) => {
                let outcome = match e {
                    fairlock::Error::NotHeld { .. } => "notheld",
                    _ => "err",
                };
                let done = now_ns();
                h.log_at(t, &th, &format!("REL {name} {outcome} {lost} {done} {e}"));
                thread::sleep(ERROR_PAUSE);
            }
        }
        if !ok {
            conn = None;
            thread::sleep(ERROR_PAUSE);
        }
        // think time outside the lock
        thread::sleep(Duration::from_micros(rng.range(0, 2000)));
    }
}

/// A name of the `sem` or `rw` workload.
enum Shared {
    Sem(fairlock::Semaphore),
    Rw(fairlock::RwLock),
}

/// A hold of the `sem` or `rw` workload.
enum Held {
    Permit(fairlock::Permit),
    Read(fairlock::ReadGuard),
    Write(fairlock::WriteGuard),
}

impl Held {
    fn token(&self) -> u64 {
        match self {
            Held::Permit(p) => p.fencing_token(),
            Held::Read(g) => g.fencing_token(),
            Held::Write(g) => g.fencing_token(),
        }
    }

    fn is_lost(&self) -> bool {
        match self {
            Held::Permit(p) => p.is_lost(),
            Held::Read(g) => g.is_lost(),
            Held::Write(g) => g.is_lost(),
        }
    }

    fn lost_signal(&self) -> crossbeam_channel::Receiver<fairlock::LostHold> {
        match self {
            Held::Permit(p) => p.lost_signal(),
            Held::Read(g) => g.lost_signal(),
            Held::Write(g) => g.lost_signal(),
        }
    }

    /// The lease left by the holder's estimate, in µs, when the hold tells it (a permit does,
    /// the read/write guards do not).
    fn lease_left_us(&self) -> String {
        match self {
            Held::Permit(p) => p.lease_remaining().as_micros().to_string(),
            _ => "-".to_string(),
        }
    }

    fn release(self) -> fairlock::Result<()> {
        match self {
            Held::Permit(p) => p.release(),
            Held::Read(g) => g.unlock(),
            Held::Write(g) => g.unlock(),
        }
    }
}

/// The `sem` and `rw` workloads' thread: as [`worker_thread`], with permits. `REQ name k` names
/// the permits asked (a write: all of them); the interval the checker sees runs from ACQ
/// (after the grant) to UNLOCK (before the release).
#[allow(clippy::too_many_arguments)]
fn shared_thread(
    workload: Workload,
    client: &fairlock::LockClient,
    h: &History,
    locks: &[String],
    stop: &AtomicBool,
    url: &str,
    me: usize,
    seed: u64,
) {
    let th = me.to_string();
    let mut rng = Rng::new(seed);
    let handles: Vec<Shared> = locks
        .iter()
        .map(|n| match workload {
            Workload::Sem => Shared::Sem(client.semaphore(n, SEM_CAPACITY).unwrap()),
            _ => Shared::Rw(client.rw_lock(n).unwrap()),
        })
        .collect();
    let script = redis::Script::new(FENCED_WRITE);
    let mut conn: Option<redis::Connection> = None;
    // open the pooled connection before the first REQ (see worker_thread)
    let _ = match &handles[0] {
        Shared::Sem(s) => s.status(),
        Shared::Rw(l) => l.status(),
    };
    while !stop.load(Ordering::SeqCst) {
        let pick = rng.range(0, handles.len() as u64 - 1) as usize;
        let name = &locks[pick];
        let (permits, held) = match &handles[pick] {
            Shared::Sem(s) => {
                let k = rng.range(1, 2);
                h.log(&th, &format!("REQ {name} {k}"));
                (k, s.acquire_many(k).map(Held::Permit))
            }
            Shared::Rw(l) if rng.range(0, 3) == 0 => {
                h.log(&th, &format!("REQ {name} {RW_CAPACITY}"));
                (RW_CAPACITY, l.write().map(Held::Write))
            }
            Shared::Rw(l) => {
                h.log(&th, &format!("REQ {name} 1"));
                (1, l.read().map(Held::Read))
            }
        };
        let held = match held {
            Ok(g) => g,
            Err(e) => {
                h.log(&th, &format!("ERR {name} lock {e}"));
                thread::sleep(ERROR_PAUSE);
                continue;
            }
        };
        let signal = held.lost_signal();
        let token = held.token();
        h.log(&th, &format!("ACQ {name} {token} {}", held.lease_left_us()));
        let ok = if workload == Workload::Rw && permits == RW_CAPACITY {
            critical_section(h, &th, name, token, &mut conn, url, &script, &mut rng)
        } else {
            thread::sleep(Duration::from_micros(rng.range(0, 3000)));
            true
        };
        let lost = u8::from(held.is_lost() || signal.try_recv().is_ok());
        let t = now_ns();
        h.log_at(t, &th, &format!("UNLOCK {name}"));
        match held.release() {
            Ok(()) => h.log_at(t, &th, &format!("REL {name} ok {lost} {}", now_ns())),
            Err(e) => {
                let outcome = match e {
                    fairlock::Error::NotHeld { .. } => "notheld",
                    _ => "err",
                };
                let done = now_ns();
                h.log_at(t, &th, &format!("REL {name} {outcome} {lost} {done} {e}"));
                thread::sleep(ERROR_PAUSE);
            }
        }
        if !ok {
            conn = None;
            thread::sleep(ERROR_PAUSE);
        }
        thread::sleep(Duration::from_micros(rng.range(0, 2000)));
    }
}

/// GET counter, sleep 0-3 ms, SET counter+1, fenced write. False after an error.
#[allow(clippy::too_many_arguments)]
fn critical_section(
    h: &History,
    th: &str,
    name: &str,
    token: u64,
    conn: &mut Option<redis::Connection>,
    url: &str,
    script: &redis::Script,
    rng: &mut Rng,
) -> bool {
    if conn.is_none() {
        match resource_conn(url) {
            Ok(c) => *conn = Some(c),
            Err(e) => {
                h.log(th, &format!("ERR {name} connect {e}"));
                return false;
            }
        }
    }
    let c = conn.as_mut().unwrap();
    let before: Option<u64> = match redis::cmd("GET").arg(counter_key(name)).query(c) {
        Ok(v) => v,
        Err(e) => {
            h.log(th, &format!("ERR {name} get {e}"));
            return false;
        }
    };
    let before = before.unwrap_or(0);
    thread::sleep(Duration::from_micros(rng.range(0, 3000)));
    let set: redis::RedisResult<()> = redis::cmd("SET")
        .arg(counter_key(name))
        .arg(before + 1)
        .query(c);
    if let Err(e) = set {
        h.log(th, &format!("CS {name} {before} ?"));
        h.log(th, &format!("ERR {name} set {e}"));
        return false;
    }
    h.log(th, &format!("CS {name} {before} {}", before + 1));
    let writer = format!("{}:{th}:{token}", std::process::id());
    let reply: redis::RedisResult<(String, u64, String)> = script
        .key(resource_key(name))
        .arg(token)
        .arg(writer)
        .invoke(c);
    match reply {
        Ok((status, n, epoch)) if status == "ok" => {
            h.log(th, &format!("FENCE {name} {token} ok {n} {epoch}"));
            true
        }
        Ok((_, max, _)) => {
            h.log(th, &format!("FENCE {name} {token} stale {max}"));
            true
        }
        Err(e) => {
            h.log(th, &format!("FENCE {name} {token} unknown"));
            h.log(th, &format!("ERR {name} fence {e}"));
            false
        }
    }
}
