//! One behaviour matrix: what a user relies on, for every primitive, in both wait modes. The rows
//! are behaviours (one `#[test]` each): FIFO, a try never queues, a timed wait gives up and leaves
//! nothing, a crashed holder's hold comes back, an abandoned wait leaves nothing, a leaked hold
//! runs out with its lease, a lost hold is told, a waiter keeps its place when its request to ask
//! again or its client's heartbeat stalls. The columns are {lock, semaphore(1),
//! semaphore(3), read, write} × {shared, per-thread}: each row runs every column against a real
//! redis-server, and a failure names its column.
//!
//! For each column, a *blocker* is a hold that keeps a *contender* out: a lock keeps out a lock,
//! one permit of a semaphore(1) keeps out one, 3 permits of a semaphore(3) keep out 2, a write
//! keeps out a read, a read keeps out a write. Contenders of a semaphore(3) take 2 permits each,
//! so that two of them never fit at once and FIFO is seen one at a time.

use crate::support;

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use crate::support::{eventually, say, RedisServer};
use crossbeam_channel::Receiver;
use fairlock::{Error, HoldKind, LockClient, LostHold, WaitCanceller, WaitMode};

const SECS_10: Duration = Duration::from_secs(10);
const SECS_30: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Prim {
    Lock,
    Sem1,
    Sem3,
    Read,
    Write,
}

const PRIMS: [Prim; 5] = [Prim::Lock, Prim::Sem1, Prim::Sem3, Prim::Read, Prim::Write];
const MODES: [WaitMode; 2] = [WaitMode::Shared, WaitMode::PerThread];

/// One cell of the matrix: a primitive in a wait mode, on a name of its own.
#[derive(Clone, Debug)]
struct Cell {
    prim: Prim,
    mode: WaitMode,
    url: String,
    name: String,
}

/// Every cell, each on its own name on `server`.
fn cells(server: &RedisServer, row: &str) -> Vec<Cell> {
    let mut cells = vec![];
    for prim in PRIMS {
        for mode in MODES {
            cells.push(Cell {
                prim,
                mode,
                url: server.url(),
                name: format!("{row}-{prim:?}-{mode:?}").to_lowercase(),
            });
        }
    }
    cells
}

/// How long a contender may wait.
#[derive(Clone, Copy)]
enum How {
    Try,
    For(Duration),
}

/// A hold of any primitive.
enum Held {
    Lock(fairlock::LockGuard),
    Permit(fairlock::Permit),
    Read(fairlock::ReadGuard),
    Write(fairlock::WriteGuard),
}

impl Held {
    fn token(&self) -> u64 {
        match self {
            Held::Lock(g) => g.fencing_token(),
            Held::Permit(p) => p.fencing_token(),
            Held::Read(g) => g.fencing_token(),
            Held::Write(g) => g.fencing_token(),
        }
    }

    fn lost_signal(&self) -> Receiver<LostHold> {
        match self {
            Held::Lock(g) => g.lost_signal(),
            Held::Permit(p) => p.lost_signal(),
            Held::Read(g) => g.lost_signal(),
            Held::Write(g) => g.lost_signal(),
        }
    }

    /// The id `force_release` takes (a lock is force-unlocked by name).
    fn hold_id(&self) -> Option<String> {
        match self {
            Held::Lock(_) => None,
            Held::Permit(p) => Some(p.hold_id()),
            Held::Read(g) => Some(g.hold_id()),
            Held::Write(g) => Some(g.hold_id()),
        }
    }

    fn release(self) -> fairlock::Result<()> {
        match self {
            Held::Lock(g) => g.unlock(),
            Held::Permit(p) => p.release(),
            Held::Read(g) => g.unlock(),
            Held::Write(g) => g.unlock(),
        }
    }

    fn leak(self) -> u64 {
        match self {
            Held::Lock(g) => g.leak(),
            Held::Permit(p) => p.leak(),
            Held::Read(g) => g.leak(),
            Held::Write(g) => g.leak(),
        }
    }
}

impl Cell {
    fn client(&self) -> LockClient {
        let mode = self.mode;
        support::client_with_url(&self.url, |b| b.wait_mode(mode))
    }

    /// What a contender's hold is, as errors and lost holds name it.
    fn contender_kind(&self) -> HoldKind {
        match self.prim {
            Prim::Lock => HoldKind::Lock,
            Prim::Sem1 | Prim::Sem3 => HoldKind::Semaphore,
            Prim::Read => HoldKind::Read,
            Prim::Write => HoldKind::Write,
        }
    }

    /// What a blocker's hold is.
    fn blocker_kind(&self) -> HoldKind {
        match self.prim {
            Prim::Read => HoldKind::Write,
            Prim::Write => HoldKind::Read,
            _ => self.contender_kind(),
        }
    }

    fn capacity(&self) -> u64 {
        if self.prim == Prim::Sem3 {
            3
        } else {
            1
        }
    }

    /// What a contender's client sends to call `stall`'s script: the function's name where the
    /// server has the library (Redis 7), the script's SHA before (EVALSHA).
    fn script_call(&self, stall: Stall) -> String {
        let name = match (stall, self.prim) {
            (Stall::AskingAgain, Prim::Lock) => "acquire",
            (Stall::AskingAgain, _) => "sem_acquire",
            (Stall::Heartbeat, Prim::Lock) => "heartbeat",
            (Stall::Heartbeat, _) => "sem_heartbeat",
        };
        let script = fairlock::raw::scripts()
            .into_iter()
            .find(|s| s.name() == name)
            .expect("the protocol's scripts");
        let mut conn = redis::Client::open(self.url.as_str())
            .and_then(|c| c.get_connection())
            .expect("a connection");
        let functions = redis::cmd("FUNCTION")
            .arg("LIST")
            .arg("LIBRARYNAME")
            .arg(fairlock::raw::library_name())
            .query::<Vec<redis::Value>>(&mut conn)
            .is_ok_and(|libs| !libs.is_empty());
        if functions {
            script.function().to_string()
        } else {
            script.sha().to_string()
        }
    }

    /// The server's port, from the url.
    fn port(&self) -> u16 {
        self.url
            .trim_end_matches('/')
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("a port in the url")
    }

    /// Take the blocker (waiting as long as it takes), with a fixed lease if one is given.
    fn block(&self, client: &LockClient, fixed: Option<Duration>) -> Held {
        match self.blocker_kind() {
            HoldKind::Lock => {
                let lock = client.fair_lock(&self.name).unwrap();
                let lock = fixed.map_or(Ok(lock.clone()), |l| lock.with_fixed_lease(l));
                Held::Lock(lock.unwrap().lock().unwrap())
            }
            HoldKind::Semaphore => {
                let sem = client.semaphore(&self.name, self.capacity()).unwrap();
                let sem = fixed.map_or(Ok(sem.clone()), |l| sem.with_fixed_lease(l));
                Held::Permit(sem.unwrap().acquire_many(self.capacity()).unwrap())
            }
            kind => {
                let rw = client.rw_lock(&self.name).unwrap();
                let rw = fixed
                    .map_or(Ok(rw.clone()), |l| rw.with_fixed_lease(l))
                    .unwrap();
                if kind == HoldKind::Read {
                    Held::Read(rw.read().unwrap())
                } else {
                    Held::Write(rw.write().unwrap())
                }
            }
        }
    }

    /// A contender's acquisition, waiting as `how` allows.
    fn contend(&self, client: &LockClient, how: How) -> fairlock::Result<Option<Held>> {
        let name = &self.name;
        Ok(match self.prim {
            Prim::Lock => {
                let lock = client.fair_lock(name)?;
                match how {
                    How::Try => lock.try_lock()?,
                    How::For(d) => lock.try_lock_for(d)?,
                }
                .map(Held::Lock)
            }
            Prim::Sem1 | Prim::Sem3 => {
                let sem = client.semaphore(name, self.capacity())?;
                let n = if self.prim == Prim::Sem3 { 2 } else { 1 };
                match how {
                    How::Try => sem.try_acquire_many(n)?,
                    How::For(d) => sem.try_acquire_many_for(n, d)?,
                }
                .map(Held::Permit)
            }
            Prim::Read => {
                let rw = client.rw_lock(name)?;
                match how {
                    How::Try => rw.try_read()?,
                    How::For(d) => rw.try_read_for(d)?,
                }
                .map(Held::Read)
            }
            Prim::Write => {
                let rw = client.rw_lock(name)?;
                match how {
                    How::Try => rw.try_write()?,
                    How::For(d) => rw.try_write_for(d)?,
                }
                .map(Held::Write)
            }
        })
    }

    /// The canceller of the calling thread's wait for a contender's hold.
    fn canceller(&self, client: &LockClient) -> WaitCanceller {
        match self.prim {
            Prim::Lock => client.fair_lock(&self.name).unwrap().wait_canceller(),
            Prim::Sem1 | Prim::Sem3 => client
                .semaphore(&self.name, self.capacity())
                .unwrap()
                .wait_canceller(),
            Prim::Read | Prim::Write => client.rw_lock(&self.name).unwrap().wait_canceller(),
        }
    }

    /// How many wait now.
    fn waiters(&self, client: &LockClient) -> usize {
        match self.prim {
            Prim::Lock => client
                .fair_lock(&self.name)
                .unwrap()
                .status()
                .unwrap()
                .waiters
                .len(),
            Prim::Sem1 | Prim::Sem3 => client
                .semaphore(&self.name, self.capacity())
                .unwrap()
                .status()
                .unwrap()
                .waiters
                .len(),
            Prim::Read | Prim::Write => client
                .rw_lock(&self.name)
                .unwrap()
                .status()
                .unwrap()
                .waiters
                .len(),
        }
    }

    /// Release `held` by force, as an operator would from another client.
    fn force_release(&self, client: &LockClient, held: &Held) -> bool {
        match (self.prim, held.hold_id()) {
            (Prim::Lock, _) => client
                .fair_lock(&self.name)
                .unwrap()
                .force_unlock()
                .unwrap()
                .is_some(),
            (Prim::Sem1 | Prim::Sem3, Some(id)) => client
                .semaphore(&self.name, self.capacity())
                .unwrap()
                .force_release(&id, held.token())
                .unwrap(),
            (_, Some(id)) => client
                .rw_lock(&self.name)
                .unwrap()
                .force_release(&id, held.token())
                .unwrap(),
            (prim, None) => panic!("{prim:?}: a hold without an id"),
        }
    }

    /// Start a contender thread that waits at most 30 s (bounded: a test never hangs); it sends
    /// its canceller first, then the outcome (the token it got; it releases at once).
    fn spawn_waiter(
        &self,
        client: &LockClient,
    ) -> (
        WaitCanceller,
        thread::JoinHandle<fairlock::Result<Option<u64>>>,
    ) {
        let (tx, rx) = mpsc::channel();
        let (cell, client) = (self.clone(), client.clone());
        let handle = thread::spawn(move || {
            tx.send(cell.canceller(&client)).unwrap();
            let held = cell.contend(&client, How::For(SECS_30))?;
            let token = held.as_ref().map(Held::token);
            if let Some(held) = held {
                held.release()?;
            }
            Ok(token)
        });
        (rx.recv_timeout(SECS_10).unwrap(), handle)
    }
}

/// Run `row` on every cell, each in a thread of its own; panics naming every cell that failed.
fn each_cell(server: &RedisServer, row: &str, run: fn(&Cell)) {
    let threads: Vec<_> = cells(server, row)
        .into_iter()
        .map(|cell| {
            let label = format!("{:?} {:?}", cell.prim, cell.mode);
            (label, thread::spawn(move || run(&cell)))
        })
        .collect();
    let failed: Vec<String> = threads
        .into_iter()
        .filter_map(|(label, t)| t.join().is_err().then_some(label))
        .collect();
    assert!(failed.is_empty(), "{row} failed for {failed:?}");
}

#[test]
fn waiters_are_served_in_the_order_they_queued() {
    let server = RedisServer::start();
    each_cell(&server, "fifo", |cell| {
        let client = cell.client();
        let blocker = cell.block(&client, None);
        let mut waiters = vec![];
        for i in 0..3 {
            waiters.push(cell.spawn_waiter(&client).1);
            assert!(
                eventually(SECS_10, || cell.waiters(&client) == i + 1),
                "{cell:?}: waiter {i} never queued"
            );
        }
        let blocker_token = blocker.token();
        blocker.release().unwrap();
        let tokens: Vec<u64> = waiters
            .into_iter()
            .map(|w| w.join().unwrap().unwrap().expect("served"))
            .collect();
        // tokens rise with every grant: served in queue order, each after the blocker
        assert!(tokens[0] > blocker_token, "{cell:?}: {tokens:?}");
        assert!(
            tokens.windows(2).all(|w| w[0] < w[1]),
            "{cell:?}: {tokens:?}"
        );
    });
}

/// Which request of a waiter's client a proxy holds up until the client gives up on it.
#[derive(Clone, Copy, Debug)]
enum Stall {
    /// The waiter's own request to ask again, after its wait ended early (the connection its
    /// client waits on was cut).
    AskingAgain,
    /// Its client's janitor's heartbeat.
    Heartbeat,
}

/// A waiter whose wait ended early and whose request to ask again hangs on a stalled connection
/// until the read timeout keeps its place meanwhile: its client's janitor heartbeats the attempt
/// from its first queueing to its end, between its waits too. (The attempt used to leave the
/// janitor's list at the end of each wait: a request that hung for longer than the waiter
/// timeout, as in a failover, let another client's heartbeat purge the live waiter, and the one
/// behind it was served first.)
#[test]
fn a_waiter_asking_again_over_a_stalled_connection_keeps_its_place() {
    let server = RedisServer::start();
    each_cell(&server, "stalled", |cell| {
        a_stalled_request_costs_no_place(cell, Stall::AskingAgain)
    });
}

/// A waiter whose client's heartbeat hangs on a stalled connection keeps its place: the janitor
/// gives a heartbeat up after half an interval and sends it again at the next tick, on another
/// connection. (It used to wait the read timeout, longer than the waiter timeout, and the live
/// waiter was purged by another client's heartbeat.)
#[test]
fn a_waiter_whose_heartbeat_stalls_keeps_its_place() {
    let server = RedisServer::start();
    each_cell(&server, "stalled-heartbeat", |cell| {
        a_stalled_request_costs_no_place(cell, Stall::Heartbeat)
    });
}

/// Waiter 0 queues through a proxy, waiter 1 behind it on another client; the proxy holds
/// `stall`'s next request up (waiter 0's client gives up on it after its read timeout, 3 s, five
/// waiter timeouts: 3 janitor intervals of 200 ms each); a second later the blocker is released,
/// and waiter 0 must be served first.
fn a_stalled_request_costs_no_place(cell: &Cell, stall: Stall) {
    use crate::chaos::proxy::{Proxy, Trap};
    let client = cell.client();
    let blocker = cell.block(&client, None);
    let proxy = Proxy::start(cell.port());
    let mode = cell.mode;
    let slow = support::client_with_url(&proxy.url(), |b| {
        b.wait_mode(mode).read_timeout(Duration::from_secs(3))
    });
    let first = cell.spawn_waiter(&slow).1;
    assert!(
        eventually(SECS_10, || cell.waiters(&client) == 1),
        "{cell:?}: waiter 0 never queued"
    );
    let second = cell.spawn_waiter(&cell.client()).1;
    assert!(
        eventually(SECS_10, || cell.waiters(&client) == 2),
        "{cell:?}: waiter 1 never queued"
    );
    let call = cell.script_call(stall);
    let trap = Trap::Late {
        delay: Duration::ZERO,
        max_wait: SECS_10,
    };
    match stall {
        Stall::AskingAgain => {
            // cutting the proxy's connections ends waiter 0's wait; the trap may catch its
            // request on a pooled connection the cut has just closed (the client sees it closed
            // at once and asks again on a new one): then cut again, a few times at most
            let mut hanging = false;
            for _ in 0..5 {
                proxy.arm(&[call.as_bytes()], trap);
                proxy.drop_all();
                assert!(
                    eventually(SECS_10, || proxy.sprung()),
                    "{cell:?}: waiter 0 did not ask again"
                );
                thread::sleep(Duration::from_millis(300));
                if proxy.take_report().is_none() {
                    hanging = true;
                    break;
                }
            }
            assert!(hanging, "{cell:?}: no request of waiter 0 hung in 5 tries");
            thread::sleep(Duration::from_millis(1000));
            assert!(
                proxy.take_report().is_none(),
                "{cell:?}: waiter 0's request came back before the release"
            );
        }
        Stall::Heartbeat => {
            proxy.arm(&[call.as_bytes()], trap);
            assert!(
                eventually(SECS_10, || proxy.sprung()),
                "{cell:?}: waiter 0's client sent no heartbeat"
            );
            thread::sleep(Duration::from_millis(1300));
        }
    }
    let blocker_token = blocker.token();
    blocker.release().unwrap();
    let tokens: Vec<u64> = [first, second]
        .into_iter()
        .map(|w| w.join().unwrap().unwrap().expect("served"))
        .collect();
    assert!(tokens[0] > blocker_token, "{cell:?}: {tokens:?}");
    assert!(
        tokens[0] < tokens[1],
        "{cell:?}: waiter 1 was served before waiter 0: {tokens:?}"
    );
}

#[test]
fn a_try_never_queues_and_takes_a_free_primitive() {
    let server = RedisServer::start();
    each_cell(&server, "try", |cell| {
        let client = cell.client();
        let other = cell.client();
        let blocker = cell.block(&client, None);
        assert!(
            cell.contend(&other, How::Try).unwrap().is_none(),
            "{cell:?}"
        );
        assert_eq!(cell.waiters(&client), 0, "{cell:?}: a try queued");
        blocker.release().unwrap();
        let held = cell.contend(&other, How::Try).unwrap();
        held.expect("free now").release().unwrap();
    });
}

#[test]
fn a_timed_wait_gives_up_and_leaves_nothing() {
    let server = RedisServer::start();
    each_cell(&server, "timed", |cell| {
        let client = cell.client();
        let other = cell.client();
        let blocker = cell.block(&client, None);
        let got = cell
            .contend(&other, How::For(Duration::from_millis(300)))
            .unwrap();
        assert!(got.is_none(), "{cell:?}: got it while blocked");
        assert_eq!(cell.waiters(&client), 0, "{cell:?}: the place stayed");
        blocker.release().unwrap();
        // nothing left behind: a try takes it at once
        let held = cell.contend(&other, How::Try).unwrap();
        held.expect("free once the blocker left").release().unwrap();
    });
}

#[test]
fn an_abandoned_wait_ends_with_abandoned_naming_the_primitive_and_leaves_nothing() {
    let server = RedisServer::start();
    each_cell(&server, "abandon", |cell| {
        let client = cell.client();
        let blocker = cell.block(&client, None);
        let (canceller, waiter) = cell.spawn_waiter(&client);
        assert!(
            eventually(SECS_10, || cell.waiters(&client) == 1),
            "{cell:?}"
        );
        canceller.abandon().unwrap();
        match waiter.join().unwrap() {
            Err(Error::Abandoned { kind, .. }) => {
                assert_eq!(kind, cell.contender_kind(), "{cell:?}")
            }
            other => panic!("{cell:?}: {:?}", other.map_err(|e| e.to_string())),
        }
        assert_eq!(cell.waiters(&client), 0, "{cell:?}");
        blocker.release().unwrap();
        let held = cell.contend(&client, How::Try).unwrap();
        held.expect("nothing held by the abandoned wait")
            .release()
            .unwrap();
    });
}

#[test]
fn a_leaked_hold_runs_out_with_its_lease_and_the_waiter_gets_it() {
    let server = RedisServer::start();
    each_cell(&server, "leak", |cell| {
        let client = cell.client();
        let other = cell.client();
        let leaked = cell.block(&client, Some(Duration::from_secs(1)));
        let leaked_token = leaked.leak();
        // still held after the leak...
        assert!(
            cell.contend(&other, How::Try).unwrap().is_none(),
            "{cell:?}"
        );
        // ...until its lease ends
        let held = cell.contend(&other, How::For(SECS_10)).unwrap();
        let held = held.unwrap_or_else(|| panic!("{cell:?}: never came back"));
        assert!(held.token() > leaked_token, "{cell:?}");
        held.release().unwrap();
    });
}

#[test]
fn a_hold_released_by_force_is_told_lost_to_its_holder() {
    let server = RedisServer::start();
    each_cell(&server, "lost", |cell| {
        // a lease of 1.5 s is renewed every 0.5 s: the renewal that finds the hold gone comes
        // well within the 10 s bound (with the default 30 s lease it could take 10 s)
        let mode = cell.mode;
        let client = support::client_with_url(&cell.url, |b| {
            b.wait_mode(mode).lease(Duration::from_millis(1500))
        });
        let operator = cell.client();
        let held = cell.block(&client, None);
        assert!(cell.force_release(&operator, &held), "{cell:?}");
        let lost = held
            .lost_signal()
            .recv_timeout(SECS_10)
            .unwrap_or_else(|e| panic!("{cell:?}: not told ({e})"));
        assert_eq!(lost.kind, cell.blocker_kind(), "{cell:?}");
        assert_eq!(lost.token, held.token(), "{cell:?}");
        assert!(held.release().is_err(), "{cell:?}: released a lost hold");
    });
}

/// The crash row's child: take the blocker of the cell in its environment, say `HELD <token>`,
/// and hold it until killed.
fn crash_child(role: &str) {
    assert_eq!(role, "holder");
    support::child_time_limit(Duration::from_secs(60));
    let prim: String = support::env_arg("PRIM");
    let mode: String = support::env_arg("MODE");
    let cell = Cell {
        prim: *PRIMS.iter().find(|p| format!("{p:?}") == prim).unwrap(),
        mode: *MODES.iter().find(|m| format!("{m:?}") == mode).unwrap(),
        url: support::env_arg("URL"),
        name: support::env_arg("NAME"),
    };
    let client = support::client_with_url(&cell.url, |b| {
        b.lease(Duration::from_secs(1)).wait_mode(cell.mode)
    });
    let held = cell.block(&client, None);
    say("HELD", held.token());
    thread::sleep(Duration::from_secs(120));
}

#[test]
fn a_killed_holders_hold_comes_back_to_the_waiter() {
    let children = support::child_test!(crash_child);
    let server = RedisServer::start();
    for cell in cells(&server, "crash") {
        let env = vec![
            ("PRIM", format!("{:?}", cell.prim)),
            ("MODE", format!("{:?}", cell.mode)),
            ("URL", cell.url.clone()),
            ("NAME", cell.name.clone()),
        ];
        let mut holder = children.spawn("holder", &env);
        let held_token: u64 = holder.expect("HELD", SECS_30).parse().unwrap();
        let client = cell.client();
        let (_, waiter) = cell.spawn_waiter(&client);
        assert!(
            eventually(SECS_10, || cell.waiters(&client) == 1),
            "{cell:?}"
        );
        holder.kill();
        // the holder's lease (1 s) runs out unrenewed; the janitor (200 ms) hands it over
        let token = waiter.join().unwrap().unwrap();
        let token = token.unwrap_or_else(|| panic!("{cell:?}: never came back"));
        assert!(token > held_token, "{cell:?}");
    }
}
