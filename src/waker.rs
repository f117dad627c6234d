//! The waker: one thread per client that blocks in one BLPOP over the wake lists of every lock
//! this client's threads wait on, and hands each message to the thread waiting with its attempt.
//! Waiting thus costs one connection per client, however many threads wait on however many locks.
//!
//! ```text
//!  thread 1 ─┐ register(attempt 41)            one connection, named fairlock-waker:
//!  thread 2 ─┤ register(attempt 42)    waker ── BLPOP <lock A>:wake:<client> <lock B>:wake:<client> …
//!  thread 3 ─┘ register(attempt 57)      │
//!       ▲                                │ "2|g|42|<token>|<ms>" popped from A's list
//!       └──── crossbeam channel ◄────────┘ to the thread registered with attempt 42
//! ```
//!
//! - **Which thread.** Attempt numbers are unique per client, so a message's attempt names its
//!   thread. A message for an attempt nobody is registered with (an older attempt's stale
//!   "retry", a grant to a thread that gave up) is dropped: the scripts have already settled it
//!   (see `leave.lua`), or acquire will, when that thread tries again with the same attempt.
//! - **No message popped before its thread listens.** A thread that may wait registers its
//!   attempt *before* its acquire request, so every message for it (which only that request's
//!   queueing can cause) finds the channel. A message pushed before the waker watches the list
//!   just waits in it.
//! - **A new list to watch.** When a thread starts waiting on a lock whose list the blocked
//!   BLPOP does not cover, it sends `CLIENT UNBLOCK` for the waker's connection on a pooled
//!   connection, and the waker re-issues the BLPOP with the new key; never a polling loop. An
//!   UNBLOCK that overtakes the BLPOP it is meant for (it returns 0) is sent again until that
//!   BLPOP has arrived or has been answered. Lists stay watched for a while after their last
//!   waiter left, so a lock waited on again and again costs no UNBLOCK each time.
//! - **Lost pops.** When the waker's connection fails (dropped by a restart, a timeout, a read
//!   error), a message it popped may be lost with the reply. Every waiting thread is told, and
//!   runs acquire again with the same attempt: it keeps its place, or gets the grant whose
//!   message was lost.

use std::collections::HashMap;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use parking_lot::{Condvar, Mutex};

use crate::connection::{with_pooled, Conn, Manager};
use crate::error::{Error, Result};
use crate::raw::{self, Wake};

/// The longest single BLPOP: the waker re-blocks at least this often, which bounds how long a
/// silently dead connection (no RST) can hide, and how late an UNBLOCK that failed is made up for.
const MAX_BLOCK: Duration = Duration::from_secs(10);
/// How long a list stays watched after its last waiter left.
const LINGER: Duration = Duration::from_secs(10);
/// At most this many lists without waiters stay watched (each costs the server a little on
/// every BLPOP); the longest idle go first.
const MAX_IDLE_LISTS: usize = 64;
/// Pauses between attempts to connect while the server cannot be reached.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(50), Duration::from_secs(2));
/// The name of the waker's connection in `CLIENT LIST`.
pub(crate) const CONNECTION_NAME: &str = "fairlock-waker";

/// What a waiting thread hears.
pub(crate) enum Event {
    /// A message for its attempt.
    Wake(Wake),
    /// The server closed the waker's connection (a restart): a message may have been lost with
    /// it; run acquire again.
    Dropped,
    /// The waker's connection failed otherwise (a timeout, refused): run acquire again, and
    /// count it as a failure.
    Failed(Error),
}

struct Registered {
    events: Sender<Event>,
    /// The list this attempt waits on, once it waits.
    list: Option<String>,
}

struct Watched {
    /// Registered attempts waiting on this list.
    waiting: usize,
    /// When the last of them left.
    idle_since: Instant,
}

#[derive(Default)]
struct State {
    attempts: HashMap<u64, Registered>,
    lists: HashMap<String, Watched>,
    /// Counts the lists added: a BLPOP sent with the lists of generation g covers every list added
    /// up to g.
    generation: u64,
    /// The BLPOP in flight, if any: the generation of its lists and the id of its connection.
    in_flight: Option<(u64, i64)>,
    /// Set when the client is dropped, or the thread ended.
    stopped: bool,
}

impl State {
    /// Tell every waiting attempt (one that watches a list) about a failure of the waker's
    /// connection.
    fn tell_waiting(&self, event: impl Fn() -> Event) {
        for r in self.attempts.values().filter(|r| r.list.is_some()) {
            let _ = r.events.send(event());
        }
    }

    /// Forget the lists nobody has waited on for `LINGER`, and the longest idle beyond
    /// `MAX_IDLE_LISTS`.
    fn forget_idle_lists(&mut self, now: Instant) {
        self.lists
            .retain(|_, w| w.waiting > 0 || now.duration_since(w.idle_since) < LINGER);
        let mut idle: Vec<(Instant, String)> = self
            .lists
            .iter()
            .filter(|(_, w)| w.waiting == 0)
            .map(|(k, w)| (w.idle_since, k.clone()))
            .collect();
        if idle.len() > MAX_IDLE_LISTS {
            idle.sort();
            for (_, key) in &idle[..idle.len() - MAX_IDLE_LISTS] {
                self.lists.remove(key);
            }
        }
    }
}

struct Shared {
    state: Mutex<State>,
    /// Wakes the thread when it idles with nothing to watch.
    changed: Condvar,
    /// For `CLIENT UNBLOCK`.
    pool: r2d2::Pool<Manager>,
    /// How long to keep resending an UNBLOCK that overtook its BLPOP.
    read_timeout: Duration,
}

/// The waker of one client (see the module docs). Dropping it stops its thread.
pub(crate) struct Waker {
    shared: Arc<Shared>,
}

impl Waker {
    /// Start the thread; it connects when the first thread waits.
    ///
    /// # Errors
    /// [`Error::Io`] when the thread cannot be started.
    pub fn start(
        manager: Manager,
        pool: r2d2::Pool<Manager>,
        client_id: &str,
        read_timeout: Duration,
    ) -> Result<Waker> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            pool,
            read_timeout,
        });
        let for_thread = shared.clone();
        thread::Builder::new()
            .name(format!(
                "fairlock-waker-{}",
                &client_id[..8.min(client_id.len())]
            ))
            .spawn(move || {
                let _ending = Ending(&for_thread);
                run(&for_thread, &manager);
            })
            .map_err(|source| Error::Io {
                during: "starting the waker thread",
                source,
            })?;
        Ok(Waker { shared })
    }

    /// Listen for messages to `attempt`. Call it before the acquire request that may queue it.
    pub fn register(&self, attempt: u64) -> Registration<'_> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let mut state = self.shared.state.lock();
        if state.stopped {
            let _ = tx.send(Event::Failed(stopped_error()));
        }
        state.attempts.insert(
            attempt,
            Registered {
                events: tx,
                list: None,
            },
        );
        Registration {
            waker: self,
            attempt,
            events: rx,
        }
    }

    /// Make the BLPOP cover `list` (for `attempt`, registered).
    fn watch(&self, attempt: u64, list: &str) {
        let added = {
            let mut state = self.shared.state.lock();
            let Some(r) = state.attempts.get_mut(&attempt) else {
                return;
            };
            if r.list.as_deref() == Some(list) {
                return;
            }
            let old = r.list.replace(list.to_string());
            if let Some(old) = old {
                state.leave_list(&old);
            }
            let now = Instant::now();
            let mut added = false;
            state
                .lists
                .entry(list.to_string())
                .or_insert_with(|| {
                    added = true;
                    Watched {
                        waiting: 0,
                        idle_since: now,
                    }
                })
                .waiting += 1;
            if added {
                state.generation += 1;
                self.shared.changed.notify_one();
            }
            added.then_some(state.generation)
        };
        if let Some(generation) = added {
            self.interrupt(generation);
        }
    }

    fn unregister(&self, attempt: u64) {
        let mut state = self.shared.state.lock();
        if let Some(Registered {
            list: Some(list), ..
        }) = state.attempts.remove(&attempt)
        {
            state.leave_list(&list);
        }
    }

    /// Make the blocked BLPOP, if it does not cover the lists of `generation`, end and be sent
    /// again with them.
    fn interrupt(&self, generation: u64) {
        let give_up = Instant::now() + self.shared.read_timeout;
        let mut sent = 0;
        loop {
            let id = match self.shared.state.lock().in_flight {
                Some((g, id)) if g < generation => id,
                // not blocked (the next BLPOP is built with the new list), or already covering it
                _ => return,
            };
            let unblock = redis::cmd("CLIENT")
                .arg("UNBLOCK")
                .arg(id)
                .arg("TIMEOUT")
                .clone();
            match with_pooled(&self.shared.pool, "waking the waker", |c| {
                c.query::<i64>(&unblock)
                    .map_err(|e| Error::from_redis("waking the waker", e))
            }) {
                Ok(1) => return,
                // the BLPOP has not reached the server yet, or has just been answered: look again
                Ok(_) if Instant::now() < give_up => {
                    sent += 1;
                    if sent > 3 {
                        thread::sleep(Duration::from_micros(200));
                    } else {
                        thread::yield_now();
                    }
                }
                Ok(_) => {
                    log::warn!("fairlock: the waker did not block within {:?}; it takes up a new lock when its BLPOP times out (within {MAX_BLOCK:?})", self.shared.read_timeout);
                    return;
                }
                Err(e) => {
                    log::warn!("fairlock: could not interrupt the waker ({e}); it takes up a new lock when its BLPOP times out (within {MAX_BLOCK:?})");
                    return;
                }
            }
        }
    }
}

impl State {
    fn leave_list(&mut self, list: &str) {
        if let Some(w) = self.lists.get_mut(list) {
            w.waiting = w.waiting.saturating_sub(1);
            if w.waiting == 0 {
                w.idle_since = Instant::now();
            }
        }
    }
}

impl Drop for Waker {
    fn drop(&mut self) {
        let in_flight = {
            let mut state = self.shared.state.lock();
            state.stopped = true;
            self.shared.changed.notify_one();
            state.in_flight
        };
        if let Some((_, id)) = in_flight {
            let unblock = redis::cmd("CLIENT").arg("UNBLOCK").arg(id).clone();
            let _ = with_pooled(&self.shared.pool, "stopping the waker", |c| {
                c.query::<i64>(&unblock)
                    .map_err(|e| Error::from_redis("stopping the waker", e))
            });
        }
    }
}

/// One registered attempt's end of the waker: unregisters when dropped.
pub(crate) struct Registration<'a> {
    waker: &'a Waker,
    attempt: u64,
    events: Receiver<Event>,
}

impl Registration<'_> {
    /// Wait on `list` (the wake list of this client for the lock): the waker covers it from now on.
    pub fn watch(&self, list: &str) {
        self.waker.watch(self.attempt, list);
    }

    /// The next event, or `None` when `deadline` came first (`None` deadline: wait as long as it
    /// takes; the waker tells of every failure, so this never hangs on a dead connection).
    pub fn next(&self, deadline: Option<Instant>) -> Option<Event> {
        match deadline {
            None => self.events.recv().ok(),
            Some(d) => self.events.recv_deadline(d).ok(),
        }
    }
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        self.waker.unregister(self.attempt);
    }
}

fn stopped_error() -> Error {
    Error::Connection {
        during: "waiting for the lock",
        detail: "the client's waker thread has stopped".into(),
        source: None,
    }
}

/// Marks the waker stopped and tells the waiting threads when its thread ends, however it ends.
struct Ending<'a>(&'a Shared);

impl Drop for Ending<'_> {
    fn drop(&mut self) {
        let mut state = self.0.state.lock();
        state.stopped = true;
        state.in_flight = None;
        for r in state.attempts.values() {
            let _ = r.events.send(Event::Failed(stopped_error()));
        }
    }
}

/// The waker's connection and its server-side id.
struct Connection {
    conn: Conn,
    id: i64,
}

fn connect(manager: &Manager) -> redis::RedisResult<Connection> {
    let mut conn = manager.open()?;
    conn.query::<()>(redis::cmd("CLIENT").arg("SETNAME").arg(CONNECTION_NAME))?;
    let id = conn.query(redis::cmd("CLIENT").arg("ID"))?;
    Ok(Connection { conn, id })
}

fn run(shared: &Shared, manager: &Manager) {
    let read_margin = shared.read_timeout;
    let mut connection: Option<Connection> = None;
    let mut backoff = BACKOFF.0;
    let mut rotation = 0usize;
    loop {
        // the lists to watch, once there are any
        {
            let mut state = shared.state.lock();
            loop {
                if state.stopped {
                    return;
                }
                state.forget_idle_lists(Instant::now());
                if !state.lists.is_empty() {
                    break;
                }
                shared.changed.wait(&mut state);
            }
        }
        let c = match connection.as_mut() {
            Some(c) => c,
            None => match connect(manager) {
                Ok(c) => {
                    backoff = BACKOFF.0;
                    connection.insert(c)
                }
                Err(e) => {
                    log::warn!(
                        "fairlock: the waker cannot reach Redis ({e}); retrying in {backoff:?}"
                    );
                    let mut state = shared.state.lock();
                    let detail = e.to_string();
                    state.tell_waiting(|| {
                        Event::Failed(Error::Connection {
                            during: "waiting for the lock",
                            detail: detail.clone(),
                            source: None,
                        })
                    });
                    if !state.stopped {
                        shared.changed.wait_for(&mut state, backoff);
                    }
                    backoff = (backoff * 2).min(BACKOFF.1);
                    continue;
                }
            },
        };
        let (lists, block) = {
            let mut state = shared.state.lock();
            if state.stopped {
                return;
            }
            let mut lists: Vec<String> = state.lists.keys().cloned().collect();
            if lists.is_empty() {
                continue;
            }
            // rotate, so a busy list first in line never keeps the others waiting
            lists.sort_unstable();
            rotation = rotation.wrapping_add(1);
            let n = lists.len();
            lists.rotate_left(rotation % n);
            state.in_flight = Some((state.generation, c.id));
            let block = if state.lists.values().any(|w| w.waiting > 0) {
                MAX_BLOCK
            } else {
                LINGER
            };
            (lists, block)
        };
        c.conn.set_read_timeout(block + read_margin);
        let reply: redis::RedisResult<Option<(String, String)>> =
            c.conn.query(&raw::wait_cmd(&lists, block));
        let mut state = shared.state.lock();
        state.in_flight = None;
        match reply {
            Ok(Some((_, msg))) => deliver(&state, &msg),
            Ok(None) => {}
            Err(e) => {
                let dropped = c.conn.was_dropped();
                log::debug!("fairlock: the waker's BLPOP failed ({e}); its waiters re-check");
                connection = None;
                if dropped {
                    state.tell_waiting(|| Event::Dropped);
                } else {
                    let detail = e.to_string();
                    state.tell_waiting(|| {
                        Event::Failed(Error::Connection {
                            during: "waiting for the lock",
                            detail: detail.clone(),
                            source: None,
                        })
                    });
                }
            }
        }
    }
}

/// Hand a popped message to the thread registered with its attempt.
fn deliver(state: &State, msg: &str) {
    let wake = match raw::parse_wake(msg) {
        Ok(wake) => wake,
        Err(e) => {
            log::warn!("fairlock: the waker dropped a message it cannot read: {e}");
            return;
        }
    };
    match state.attempts.get(&wake.attempt()) {
        Some(r) => {
            let _ = r.events.send(Event::Wake(wake));
        }
        None => log::debug!(
            "fairlock: the waker dropped {msg:?}: no thread waits with attempt {}",
            wake.attempt()
        ),
    }
}
