//! The waker: one blocking connection per client, on which one BLPOP covers the wake lists of
//! every lock this client's threads wait on. Waiting thus costs one connection per client,
//! however many threads wait on however many locks.
//!
//! There is no waker thread: the waiting threads take turns (the leader/followers pattern). One of
//! them, the *leader*, blocks in the BLPOP; it hands each message that is not its own to the
//! thread registered with its attempt, over a crossbeam channel, and blocks again. When the leader
//! stops waiting (its grant came, its deadline passed), it makes the longest-waiting of the others
//! the leader. In FIFO order that thread is usually the next to be granted, so its grant reaches
//! it with no hop between threads: a hand-off costs what it cost with a connection per thread.
//!
//! ```text
//!  thread 1 (leader) ── BLPOP <lock A>:wake:<client> <lock B>:wake:<client> … ── one connection
//!     │  "2|g|42|<token>|<ms>" popped from A's list is not its own:
//!     └──► crossbeam channel ──► thread 2 (registered with attempt 42), which holds the lock
//! ```
//!
//! - **Which thread.** Attempt numbers are unique per client, so a message's attempt names its
//!   thread. A message for an attempt nobody is registered with (an older attempt's stale
//!   "retry", a grant to a thread that gave up) is dropped: the scripts have already settled it
//!   (see `leave.lua`), or acquire will, when that thread tries again with the same attempt.
//! - **No message popped before its thread listens.** A thread that may wait registers its
//!   attempt *before* its acquire request, so every message for it (which only that request's
//!   queueing can cause) finds the channel. A message pushed before the BLPOP covers its list
//!   just waits in it.
//! - **Always a leader while anyone waits.** Leadership is state under the waker's mutex, not a
//!   message: a thread that stops waiting for any reason (a grant, a deadline, an error, a panic
//!   unwinding) passes it on if it holds it; a thread that starts waiting with no leader leads.
//! - **A new list to watch.** When a thread starts waiting on a lock whose list the blocked
//!   BLPOP does not cover, it sends `CLIENT UNBLOCK` for the blocking connection on a pooled
//!   connection, and the leader re-issues the BLPOP with the new key; never a polling loop. An
//!   UNBLOCK that overtakes the BLPOP it is meant for (it returns 0) is sent again until that
//!   BLPOP has arrived or has been answered. Lists stay watched for a while after their last
//!   waiter left, so a lock waited on again and again costs no UNBLOCK each time.
//! - **Lost pops.** When the blocking connection fails (dropped by a restart, a timeout, a read
//!   error), a message popped may be lost with the reply. Every waiting thread is told, and runs
//!   acquire again with the same attempt: it keeps its place, or gets the grant whose message was
//!   lost.
//! - **On a Redis Cluster** one BLPOP cannot cover keys of different hash slots, so a client has
//!   a waker per lock its threads wait on ([`Wakers`]), each blocking on the node that serves
//!   that lock's slot. Its connection never repeats the BLPOP or follows a redirect by itself: a
//!   slot that moved (`MOVED`, `ASK`) or a failover ends the wait like a dropped connection, the
//!   waiting threads re-check through the pool (which follows redirects), and the next BLPOP goes
//!   on a fresh connection that has learnt where the slot is now.
//! - **A connection per thread**, when asked for (`WaitMode::PerThread`): each waiting thread
//!   has a waker of its own, so it always leads and no message hops between threads; its owner
//!   id (`<client id>.<n>:<n>`) gives it a wake list of its own too. It trades connections for
//!   hand-off latency when many threads of one process wait.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use parking_lot::Mutex;
use redis::ConnectionLike;

use crate::connection::{
    is_interrupted, is_refused_command, is_server_gone, with_pooled, Conn, Manager, Pool,
};
use crate::error::{failover_error, Error};
use crate::raw::{self, Wake};

/// The longest single BLPOP: the leader re-blocks at least this often, which bounds how long a
/// silently dead connection (no RST) can hide, and how late an UNBLOCK that failed is made up for.
const MAX_BLOCK: Duration = Duration::from_secs(10);
/// The longest single BLPOP on a server that refuses `CLIENT UNBLOCK` (an ACL without `CLIENT`
/// or without `@admin`, a managed service that renames it): nothing can make the BLPOP take up
/// a newly watched list, so it re-blocks this often instead, which bounds how late a first
/// wake-up on a newly waited-on lock can be.
const NO_UNBLOCK_BLOCK: Duration = Duration::from_millis(500);
/// BLPOP timeouts below 1 ms turned into "forever" on Redis < 7.0.8 (redis/redis#11688).
const MIN_BLOCK: Duration = Duration::from_millis(2);
/// How long a list stays watched after its last waiter left.
const LINGER: Duration = Duration::from_secs(10);
/// At most this many lists without waiters stay watched (each costs the server a little on
/// every BLPOP); the longest idle go first.
const MAX_IDLE_LISTS: usize = 64;
/// The name of the blocking connection in `CLIENT LIST`.
pub(crate) const CONNECTION_NAME: &str = "fairlock-waker";
/// After the blocking connection failed because the server moved or went away (a failover, a
/// slot migration), the next one is opened no sooner than this: a slot being migrated answers a
/// BLPOP with `ASK` at once, sentinels that name no master refuse a connection at once, and the
/// re-checks must not spin.
const RECONNECT_PAUSE: Duration = Duration::from_millis(50);

/// What a waiting thread hears.
pub(crate) enum Event {
    /// A message for its attempt; for a grant, when replica acknowledgements are asked for, how
    /// many replicas acknowledged it (see [`raw::acknowledged_by_replicas`]).
    Wake { wake: Wake, acked: Option<u32> },
    /// The server closed the blocking connection (a restart): a message may have been lost with
    /// it; run acquire again.
    Dropped,
    /// The blocking connection failed otherwise (a timeout, refused): run acquire again, and
    /// count it as a failure.
    Failed(Error),
}

/// What goes over a waiting thread's channel.
enum Signal {
    Event(Event),
    /// You lead now (see the module docs); a nudge only: leadership is `State::leader`.
    Lead,
}

struct Registered {
    events: Sender<Signal>,
    /// The list this attempt waits on, once it waits.
    list: Option<String>,
    /// Whether its thread is in [`Registration::next`] now (only those are made leaders).
    in_next: bool,
    /// An event was sent to it while it led (see [`Waker::recheck`]): its next BLPOP must not
    /// be sent before it has read its channel.
    told: bool,
}

struct Watched {
    /// Registered attempts waiting on this list.
    waiting: usize,
    /// When the last of them left.
    idle_since: Instant,
}

/// The blocking connection and its server-side id.
struct Blocking {
    conn: Conn,
    /// `CLIENT ID` of the connection; `None` when the server refuses `CLIENT` (see
    /// [`NO_UNBLOCK_BLOCK`]).
    id: Option<i64>,
}

#[derive(Default)]
struct State {
    attempts: HashMap<u64, Registered>,
    lists: HashMap<String, Watched>,
    /// Counts the lists added: a BLPOP sent with the lists of generation g covers every list added
    /// up to g.
    generation: u64,
    /// The BLPOP in flight, if any: the generation of its lists, the id of its connection and
    /// the connection's master generation (see `Manager::is_retired`).
    in_flight: Option<(u64, Option<i64>, u64)>,
    /// The attempt whose thread leads.
    leader: Option<u64>,
    /// The blocking connection, while no BLPOP uses it.
    blocking: Option<Blocking>,
    /// Rotates the order of the lists in the BLPOP.
    rotation: usize,
    /// No new blocking connection before this (see `RECONNECT_PAUSE`).
    reconnect_at: Option<Instant>,
}

impl State {
    /// Tell every other waiting attempt about a failure of the blocking connection.
    fn tell_waiting(&self, except: u64, event: impl Fn() -> Event) {
        for (_, r) in self
            .attempts
            .iter()
            .filter(|(a, r)| **a != except && r.list.is_some())
        {
            let _ = r.events.send(Signal::Event(event()));
        }
    }

    /// The blocking connection failed under the leader `me` (`dropped`: closed by the server or
    /// refused, as in a restart or a failover; otherwise a failure that counts): tell every other
    /// waiting thread, pass on the lead, and return what `me` hears.
    fn connection_failed(&mut self, me: u64, dropped: bool, e: &redis::RedisError) -> Event {
        let event = || {
            if dropped {
                Event::Dropped
            } else {
                Event::Failed(Error::Connection {
                    during: "waiting for the lock",
                    detail: e.to_string(),
                    source: None,
                })
            }
        };
        self.tell_waiting(me, event);
        self.resign(me);
        event()
    }

    /// The Sentinel group named another master (see `Manager::follow_master`): the blocking
    /// connection went to the old one. Like a dropped connection, every waiting thread runs
    /// acquire again (on the new master), without that counting as a failure.
    fn master_moved(&mut self, me: u64) -> Event {
        self.tell_waiting(me, || Event::Dropped);
        self.resign(me);
        Event::Dropped
    }

    /// If `attempt` leads, make the longest-waiting other thread in `next` the leader.
    fn resign(&mut self, attempt: u64) {
        if self.leader != Some(attempt) {
            return;
        }
        self.leader = self
            .attempts
            .iter()
            .filter(|(a, r)| **a != attempt && r.in_next && r.list.is_some())
            .map(|(a, _)| *a)
            .min();
        if let Some(next) = self.leader {
            let _ = self.attempts[&next].events.send(Signal::Lead);
        }
    }

    fn leave_list(&mut self, list: &str) {
        if let Some(w) = self.lists.get_mut(list) {
            w.waiting = w.waiting.saturating_sub(1);
            if w.waiting == 0 {
                w.idle_since = Instant::now();
            }
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

/// The waker of one client, or on a Cluster of one lock of a client (see the module docs).
pub(crate) struct Waker {
    state: Mutex<State>,
    manager: Arc<Manager>,
    /// A key of the slot this waker's lists are in: on a Cluster, the `CLIENT` commands go to
    /// the node that serves it; unused on one node.
    route_key: String,
    /// For `CLIENT UNBLOCK`.
    pool: Pool,
    /// Added to a BLPOP's block for its read timeout; also how long an UNBLOCK that overtook its
    /// BLPOP is sent again.
    read_timeout: Duration,
    /// Replica acknowledgements a popped grant waits for: how many, for how long.
    acks: Option<(u32, Duration)>,
}

impl Waker {
    fn new(
        manager: Arc<Manager>,
        route_key: String,
        pool: Pool,
        read_timeout: Duration,
        acks: Option<(u32, Duration)>,
    ) -> Waker {
        Waker {
            state: Mutex::new(State::default()),
            manager,
            route_key,
            pool,
            read_timeout,
            acks,
        }
    }

    /// Nobody waits, and no list is watched any more: the waker (and its connection) can go.
    fn is_idle(&self) -> bool {
        let mut state = self.state.lock();
        state.forget_idle_lists(Instant::now());
        state.attempts.is_empty() && state.lists.is_empty()
    }

    /// Listen for messages to `attempt`. Call it before the acquire request that may queue it.
    pub fn register(self: &Arc<Self>, attempt: u64) -> Registration {
        let (tx, rx) = crossbeam_channel::unbounded();
        self.state.lock().attempts.insert(
            attempt,
            Registered {
                events: tx,
                list: None,
                in_next: false,
                told: false,
            },
        );
        Registration {
            waker: Arc::clone(self),
            attempt,
            events: rx,
        }
    }

    /// Make the BLPOP cover `list` (for `attempt`, registered).
    fn watch(&self, attempt: u64, list: &str) {
        let added = {
            let mut state = self.state.lock();
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
            }
            added.then_some(state.generation)
        };
        if let Some(generation) = added {
            self.interrupt(generation);
        }
    }

    fn unregister(&self, attempt: u64) {
        let mut state = self.state.lock();
        state.resign(attempt);
        if let Some(Registered {
            list: Some(list), ..
        }) = state.attempts.remove(&attempt)
        {
            state.leave_list(&list);
        }
    }

    /// Make `attempt`'s thread, if it waits here, run its acquire again now: a
    /// [`WaitCanceller`](crate::WaitCanceller) gave its wait up, and the acquire, finding the
    /// attempt marked as left, ends the wait with [`Error::Abandoned`]. A thread that leads is
    /// blocked in the BLPOP: that is interrupted too.
    pub fn recheck(&self, attempt: u64) {
        let generation = {
            let mut state = self.state.lock();
            let Some(r) = state.attempts.get(&attempt) else {
                return;
            };
            let _ = r.events.send(Signal::Event(Event::Dropped));
            if state.leader != Some(attempt) {
                return;
            }
            // leading, maybe about to block: if its BLPOP is not in flight yet, there is
            // nothing to interrupt, and it must read its channel first (see `lead_once`)
            if let Some(r) = state.attempts.get_mut(&attempt) {
                r.told = true;
            }
            // a new generation, so that `interrupt` ends the BLPOP in flight (the next one is
            // built afresh, with the same lists)
            state.generation += 1;
            state.generation
        };
        self.interrupt(generation);
    }

    /// Make the blocked BLPOP, if it does not cover the lists of `generation`, end and be sent
    /// again with them.
    fn interrupt(&self, generation: u64) {
        let give_up = Instant::now() + self.read_timeout;
        let mut sent = 0;
        loop {
            let id = match self.state.lock().in_flight {
                // blocked on a master the Sentinel group has replaced: the pool reaches another
                // server, where that id is nobody's or a stranger's (client ids are per server);
                // the BLPOP ends by its own (short) block or read timeout
                Some((_, _, master)) if self.manager.is_retired_generation(master) => return,
                Some((g, Some(id), _)) if g < generation => id,
                // not blocked (the next BLPOP is built with the new list), already covering it,
                // or on a server without `CLIENT` (the BLPOP re-blocks soon: NO_UNBLOCK_BLOCK)
                _ => return,
            };
            let unblock = redis::cmd("CLIENT")
                .arg("UNBLOCK")
                .arg(id)
                .arg("TIMEOUT")
                .clone();
            match with_pooled(&self.pool, "interrupting the blocked BLPOP", |c| {
                c.query_at::<i64>(&self.route_key, &unblock)
                    .map_err(|e| Error::from_redis("interrupting the blocked BLPOP", e))
            }) {
                Ok(1) => return,
                // the BLPOP has not reached the server yet, or has just been answered: look again
                Ok(_) if Instant::now() < give_up => {
                    sent += 1;
                    if sent == 4 && !self.is_connected(id) {
                        // the blocking connection is not on the server the pool reaches: its
                        // server went away or was replaced (a frozen master a failover left
                        // behind), and its BLPOP fails by its own read timeout
                        return;
                    }
                    if sent > 3 {
                        // backing off (200 µs, doubling up to 50 ms): a few calls, not a spin
                        let shift = (sent - 4).min(8);
                        std::thread::sleep(Duration::from_micros(200 << shift));
                    } else {
                        std::thread::yield_now();
                    }
                }
                Ok(_) => {
                    log::warn!("fairlock: the BLPOP of waiting threads did not block within {:?}; it takes up a new lock when it times out (within {MAX_BLOCK:?})", self.read_timeout);
                    return;
                }
                Err(e) => {
                    log::warn!("fairlock: could not interrupt the BLPOP of waiting threads ({e}); it takes up a new lock when it times out (within {MAX_BLOCK:?})");
                    return;
                }
            }
        }
    }

    /// Whether the server the pool reaches has a waker's connection with `id` (`CLIENT LIST
    /// ID`, by its name; not by its command, which on a connection just opened is still the
    /// probe before its first BLPOP); true when it cannot tell (the command refused, or the
    /// server unreachable). Client ids are per server: after a failover the id may be a
    /// stranger's, or nobody's.
    fn is_connected(&self, id: i64) -> bool {
        let list = redis::cmd("CLIENT").arg("LIST").arg("ID").arg(id).clone();
        match with_pooled(&self.pool, "looking up the blocked connection", |c| {
            c.query_at::<String>(&self.route_key, &list)
                .map_err(|e| Error::from_redis("looking up the blocked connection", e))
        }) {
            Ok(clients) => clients
                .split_whitespace()
                .any(|f| f == format!("name={CONNECTION_NAME}")),
            Err(_) => true,
        }
    }

    /// As the leader (`me`), block once in the BLPOP, for at most `block`. `Some` when this
    /// thread's wait is over: a message for itself, or a failure of the connection.
    fn lead_once(&self, me: u64, block: Duration) -> Option<Event> {
        let (taken, reconnect_at) = {
            let mut state = self.state.lock();
            (state.blocking.take(), state.reconnect_at)
        };
        let mut blocking = match taken {
            Some(b) if self.manager.is_retired(&b.conn) => {
                // the Sentinel group named another master: re-check there
                let mut state = self.state.lock();
                return Some(state.master_moved(me));
            }
            Some(b) => b,
            None => match self.connect(reconnect_at, block) {
                Ok(b) => b,
                Err(e) => {
                    let mut state = self.state.lock();
                    if failover_error(&e).is_some() {
                        state.reconnect_at = Some(Instant::now() + RECONNECT_PAUSE);
                    }
                    // the server went away (a restart) or moved (a failover): re-checked like a
                    // dropped connection; anything else (a timeout) counts as a failure
                    return Some(state.connection_failed(me, is_server_gone(&e), &e));
                }
            },
        };
        // the lists and their generation in one step: a list added later is not covered, and
        // its thread sees an older generation in flight and sends an UNBLOCK
        let lists = {
            let mut state = self.state.lock();
            // told something since it last read its channel (a WaitCanceller gave it up just
            // as it took the lead): no BLPOP, it reads the news first
            if let Some(r) = state.attempts.get_mut(&me).filter(|r| r.told) {
                r.told = false;
                state.blocking = Some(blocking);
                return None;
            }
            state.forget_idle_lists(Instant::now());
            let mut lists: Vec<String> = state.lists.keys().cloned().collect();
            // rotate, so a busy list first in line never keeps the others waiting
            lists.sort_unstable();
            state.rotation = state.rotation.wrapping_add(1);
            let n = lists.len().max(1);
            lists.rotate_left(state.rotation % n);
            state.in_flight = Some((
                state.generation,
                blocking.id,
                blocking.conn.master_generation(),
            ));
            lists
        };
        let block = match blocking.id {
            Some(_) => block,
            None => block.min(NO_UNBLOCK_BLOCK),
        };
        blocking.conn.set_read_timeout(block + self.read_timeout);
        let reply: redis::RedisResult<Option<(String, String)>> =
            blocking.conn.query(&raw::wait_cmd(&lists, block));
        let popped = match &reply {
            Ok(Some((_, msg))) => match raw::parse_wake(msg) {
                Ok(wake) => Some(wake),
                Err(e) => {
                    log::warn!("fairlock: dropped a wake-up message it cannot read: {e}");
                    None
                }
            },
            _ => None,
        };
        // a grant counts once replicas have it: the pop, on this connection, came after it
        let acked = match (&popped, &reply, self.acks) {
            (Some(Wake::Grant { .. }), Ok(Some((list, _))), Some((n, timeout))) => Some(
                raw::acknowledged_by_replicas(&mut blocking.conn, list, n, timeout).unwrap_or_else(
                    |e| {
                        log::warn!("fairlock: could not learn whether replicas have a grant: {e}");
                        0
                    },
                ),
            ),
            _ => None,
        };
        let mut state = self.state.lock();
        state.in_flight = None;
        match reply {
            Ok(_) if self.manager.is_retired(&blocking.conn) => {
                // the Sentinel group named another master while this BLPOP blocked on the old
                // one: what it popped there (a grant the new master never saw, or nothing) is
                // let go, and every waiting thread re-checks its place on the new master
                if popped.is_some() {
                    log::info!("fairlock: let go of a wake-up popped from a replaced master; the waiting threads re-check on the new one");
                }
                Some(state.master_moved(me))
            }
            Ok(_) => {
                if blocking.conn.is_open() {
                    state.blocking = Some(blocking);
                }
                let wake = popped?;
                let event = Event::Wake { wake, acked };
                if wake.attempt() == me {
                    state.resign(me);
                    return Some(event);
                }
                match state.attempts.get(&wake.attempt()) {
                    Some(r) => {
                        let _ = r.events.send(Signal::Event(event));
                    }
                    None => log::debug!(
                        "fairlock: dropped a wake-up for attempt {}: no thread waits with it",
                        wake.attempt()
                    ),
                }
                None
            }
            Err(e) => {
                log::debug!("fairlock: the BLPOP of waiting threads failed ({e}); they re-check");
                if failover_error(&e).is_some() {
                    state.reconnect_at = Some(Instant::now() + RECONNECT_PAUSE);
                }
                // a signal that interrupted the read is no failure of the server (see
                // is_interrupted): re-checked like a dropped connection
                let dropped = blocking.conn.was_dropped() || is_interrupted(&e);
                Some(state.connection_failed(me, dropped, &e))
            }
        }
    }

    /// A new blocking connection, no sooner than `not_before` (but within `block`).
    fn connect(
        &self,
        not_before: Option<Instant>,
        block: Duration,
    ) -> redis::RedisResult<Blocking> {
        if let Some(at) = not_before {
            std::thread::sleep(at.saturating_duration_since(Instant::now()).min(block));
        }
        let key = &self.route_key;
        let mut conn = self.manager.open_blocking()?;
        // A server may refuse CLIENT (an ACL without it, `rename-command`, a managed service):
        // waiting works without it, the BLPOP re-blocking more often (NO_UNBLOCK_BLOCK).
        let named = conn.query_at::<()>(
            key,
            redis::cmd("CLIENT").arg("SETNAME").arg(CONNECTION_NAME),
        );
        // CLIENT UNBLOCK is what the id is for, and many restricted users are refused it alone
        // (it is @admin): tried on this very connection (not blocked, so it answers 0)
        let id = match named
            .and_then(|()| conn.query_at::<i64>(key, redis::cmd("CLIENT").arg("ID")))
            .and_then(|id| {
                conn.query_at::<i64>(key, redis::cmd("CLIENT").arg("UNBLOCK").arg(id))
                    .map(|_| id)
            }) {
            Ok(id) => Some(id),
            Err(e)
                if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm)
                    || is_refused_command(&e) =>
            {
                log::debug!("fairlock: the server refuses CLIENT or CLIENT UNBLOCK ({e}); waiting threads re-block every {NO_UNBLOCK_BLOCK:?} to take up new locks");
                None
            }
            Err(e) => return Err(e),
        };
        Ok(Blocking { conn, id })
    }
}

/// The wakers of one client: one for all its locks, or on a Cluster one per lock its threads
/// wait on (a BLPOP covers keys of one hash slot only); with a connection per waiting thread
/// (`WaitMode::PerThread`), one per thread (and lock, on a Cluster). Made when a thread starts
/// waiting and dropped, with its connection, once nobody has waited on it for a while.
pub(crate) struct Wakers {
    /// One node or a Sentinel group, shared by all threads: the client's one waker.
    shared: Option<Arc<Waker>>,
    /// Otherwise the waker of each lock (on a Cluster) and/or thread with waiters now or lately.
    by_waiter: Mutex<HashMap<String, Arc<Waker>>>,
    per_lock: bool,
    per_thread: bool,
    manager: Arc<Manager>,
    pool: Pool,
    read_timeout: Duration,
    acks: Option<(u32, Duration)>,
}

impl Wakers {
    /// `per_lock`: whether the server is a Cluster; `per_thread`: a connection per waiting
    /// thread.
    pub fn new(
        manager: Arc<Manager>,
        per_lock: bool,
        per_thread: bool,
        pool: Pool,
        read_timeout: Duration,
        acks: Option<(u32, Duration)>,
    ) -> Wakers {
        let shared = (!per_lock && !per_thread).then(|| {
            Arc::new(Waker::new(
                Arc::clone(&manager),
                String::new(),
                pool.clone(),
                read_timeout,
                acks,
            ))
        });
        Wakers {
            shared,
            by_waiter: Mutex::new(HashMap::new()),
            per_lock,
            per_thread,
            manager,
            pool,
            read_timeout,
            acks,
        }
    }

    /// The waker for thread `thread` waiting on the lock whose key is `lock_key`.
    pub fn for_waiter(&self, lock_key: &str, thread: u64) -> Arc<Waker> {
        if let Some(shared) = &self.shared {
            return Arc::clone(shared);
        }
        let key = match (self.per_lock, self.per_thread) {
            (true, true) => format!("{lock_key}|{thread}"),
            (true, false) => lock_key.to_string(),
            _ => thread.to_string(),
        };
        // on a Cluster, its `CLIENT` commands go to the node of the lock's slot
        let route_key = if self.per_lock { lock_key } else { "" };
        let mut wakers = self.by_waiter.lock();
        // forget wakers nobody uses (only this map holds them) and nobody waited on lately
        wakers.retain(|k, w| *k == key || Arc::strong_count(w) > 1 || !w.is_idle());
        Arc::clone(wakers.entry(key).or_insert_with(|| {
            Arc::new(Waker::new(
                Arc::clone(&self.manager),
                route_key.to_string(),
                self.pool.clone(),
                self.read_timeout,
                self.acks,
            ))
        }))
    }
}

/// One registered attempt's end of the waker: unregisters (and passes on the lead) when dropped.
pub(crate) struct Registration {
    waker: Arc<Waker>,
    attempt: u64,
    events: Receiver<Signal>,
}

impl Registration {
    /// Wait on `list` (the wake list of this client for the lock): the BLPOP covers it from now on.
    pub fn watch(&self, list: &str) {
        self.waker.watch(self.attempt, list);
    }

    /// The next event for this attempt, or `None` when `deadline` came
    /// first (`None` deadline: wait as long as it takes; every failure of the blocking connection
    /// is told, so this never hangs on a dead connection).
    pub fn next(&self, deadline: Option<Instant>) -> Option<Event> {
        self.set_in_next(true);
        let event = self.wait(deadline);
        let mut state = self.waker.state.lock();
        state.resign(self.attempt);
        if let Some(r) = state.attempts.get_mut(&self.attempt) {
            r.in_next = false;
        }
        event
    }

    fn set_in_next(&self, in_next: bool) {
        if let Some(r) = self.waker.state.lock().attempts.get_mut(&self.attempt) {
            r.in_next = in_next;
        }
    }

    fn wait(&self, deadline: Option<Instant>) -> Option<Event> {
        loop {
            match self.events.try_recv() {
                Ok(Signal::Lead) => {}
                Ok(Signal::Event(event)) => return Some(event),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => {}
            }
            let lead = {
                let mut state = self.waker.state.lock();
                if state.leader.is_none() {
                    state.leader = Some(self.attempt);
                }
                state.leader == Some(self.attempt)
            };
            if lead {
                let longest = MAX_BLOCK.min(self.waker.manager.longest_block());
                let block = match deadline {
                    None => longest,
                    Some(d) => {
                        let left = d.saturating_duration_since(Instant::now());
                        if left < MIN_BLOCK {
                            return None;
                        }
                        left.min(longest)
                    }
                };
                if let Some(event) = self.waker.lead_once(self.attempt, block) {
                    return Some(event);
                }
                continue;
            }
            let received = match deadline {
                None => self
                    .events
                    .recv()
                    .map_err(|_| RecvTimeoutError::Disconnected),
                Some(d) => self.events.recv_deadline(d),
            };
            match received {
                Ok(Signal::Lead) => {}
                Ok(Signal::Event(event)) => return Some(event),
                Err(RecvTimeoutError::Timeout) => return None,
                // the sender lives in the waker's registry as long as this registration
                Err(RecvTimeoutError::Disconnected) => {
                    return Some(Event::Failed(Error::protocol(
                        "a waiting thread's channel closed".to_string(),
                    )))
                }
            }
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.waker.unregister(self.attempt);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A state with `attempts` registered (attempt, waiting on a list, in `next`), and the
    /// receivers of their channels.
    fn state_with(attempts: &[(u64, bool, bool)]) -> (State, HashMap<u64, Receiver<Signal>>) {
        let mut state = State::default();
        let mut receivers = HashMap::new();
        for &(attempt, listed, in_next) in attempts {
            let (tx, rx) = crossbeam_channel::unbounded();
            state.attempts.insert(
                attempt,
                Registered {
                    events: tx,
                    list: listed.then(|| "p:{a}:wake:c".to_string()),
                    in_next,
                    told: false,
                },
            );
            receivers.insert(attempt, rx);
        }
        (state, receivers)
    }

    fn heard(rx: &Receiver<Signal>) -> Vec<&'static str> {
        rx.try_iter()
            .map(|s| match s {
                Signal::Lead => "lead",
                Signal::Event(Event::Dropped) => "dropped",
                Signal::Event(Event::Failed(_)) => "failed",
                Signal::Event(Event::Wake { .. }) => "wake",
            })
            .collect()
    }

    #[test]
    fn the_lead_passes_to_the_longest_waiting_thread_in_next() {
        // 3 is not in next, 4 waits on no list yet: neither can lead; 5 and 7 can, 5 first
        let (mut state, rx) = state_with(&[
            (2, true, true),
            (3, true, false),
            (4, false, true),
            (5, true, true),
            (7, true, true),
        ]);
        state.leader = Some(2);
        state.resign(2);
        assert_eq!(state.leader, Some(5));
        assert_eq!(heard(&rx[&5]), ["lead"]);
        for other in [2, 3, 4, 7] {
            assert!(heard(&rx[&other]).is_empty(), "{other}");
        }
        // only the leader resigns
        state.resign(7);
        assert_eq!(state.leader, Some(5));
    }

    #[test]
    fn with_nobody_to_lead_the_lead_is_empty() {
        let (mut state, _rx) = state_with(&[(2, true, true), (3, true, false)]);
        state.leader = Some(2);
        state.resign(2);
        assert_eq!(state.leader, None);
    }

    #[test]
    fn a_failed_connection_is_told_to_every_other_waiting_thread_once() {
        let e = redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        let (mut state, rx) = state_with(&[(2, true, true), (3, true, true), (4, false, true)]);
        state.leader = Some(2);
        let mine = state.connection_failed(2, false, &e);
        assert!(matches!(mine, Event::Failed(Error::Connection { .. })));
        // 3 hears the failure and takes the lead; 4 waits on no list: it hears nothing
        assert_eq!(heard(&rx[&3]), ["failed", "lead"]);
        assert!(heard(&rx[&2]).is_empty());
        assert!(heard(&rx[&4]).is_empty());

        let (mut state, rx) = state_with(&[(2, true, true), (3, true, true)]);
        state.leader = Some(2);
        assert!(matches!(
            state.connection_failed(2, true, &e),
            Event::Dropped
        ));
        assert_eq!(heard(&rx[&3]), ["dropped", "lead"]);
        // the new leader finds the master moved: the lead goes back to 2, still in next
        assert!(matches!(state.master_moved(3), Event::Dropped));
        assert_eq!(heard(&rx[&2]), ["dropped", "lead"]);
        assert_eq!(state.leader, Some(2));
    }

    #[test]
    fn idle_lists_are_forgotten_after_the_linger_and_beyond_the_cap() {
        let mut state = State::default();
        let start = Instant::now();
        let watched = |waiting, idle_since| Watched {
            waiting,
            idle_since,
        };
        state.lists.insert("busy".into(), watched(1, start));
        for i in 0..MAX_IDLE_LISTS + 3 {
            let since = start + Duration::from_millis(i as u64);
            state.lists.insert(format!("idle{i}"), watched(0, since));
        }
        // within the linger only the cap applies: the three longest idle go
        state.forget_idle_lists(start + Duration::from_secs(1));
        assert_eq!(state.lists.len(), 1 + MAX_IDLE_LISTS);
        for i in 0..3 {
            assert!(!state.lists.contains_key(&format!("idle{i}")), "idle{i}");
        }
        // after it, every idle list goes; one with a waiter stays however old
        state.forget_idle_lists(start + LINGER + Duration::from_secs(1));
        let left: Vec<&String> = state.lists.keys().collect();
        assert_eq!(left, ["busy"]);
    }

    #[test]
    fn a_list_turns_idle_when_its_last_waiter_leaves() {
        let mut state = State::default();
        let long_ago = Instant::now() - Duration::from_secs(60);
        state.lists.insert(
            "l".into(),
            Watched {
                waiting: 2,
                idle_since: long_ago,
            },
        );
        state.leave_list("l");
        assert_eq!(state.lists["l"].waiting, 1);
        assert_eq!(state.lists["l"].idle_since, long_ago);
        state.leave_list("l");
        assert_eq!(state.lists["l"].waiting, 0);
        assert!(state.lists["l"].idle_since > long_ago);
        // leaving an unknown list, or one already empty, changes nothing
        state.leave_list("l");
        state.leave_list("other");
        assert_eq!(state.lists["l"].waiting, 0);
        assert_eq!(state.lists.len(), 1);
    }
}
