//! A small threaded TCP proxy on loopback between the workers and Redis, for network faults:
//! cut every connection, black-hole (accept and hold, forward nothing), add latency, and trap
//! one request of one connection (see [`Trap`]).
//!
//! Each connection gets two pump threads, one per direction. A pump reads a chunk, waits while
//! the black hole is on, sleeps the latency, then writes the chunk on: data held during a black
//! hole is delivered late once it ends (as after a partition heals), so a request the client
//! already gave up on may still reach Redis.
//!
//! The upstream (Redis) port can change ([`Proxy::set_upstream`]): a restart onto a new port
//! looks to the clients like a restart on the same one.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use super::history::now_ns;

/// The longest a pump waits for a black hole to end (faults are shorter; this bounds the thread).
const MAX_HOLD: Duration = Duration::from_secs(30);
/// How long a lost reply's connection stays open at most after the request went on, waiting for
/// the reply (which the proxy swallows) before the cut.
const LOSE_REPLY_WAIT: Duration = Duration::from_millis(300);
/// How long a late request's connection stays open after the delivery, so Redis executes it
/// before it sees the connection close.
const AFTER_LATE_DELIVERY: Duration = Duration::from_millis(200);

/// What to do with the next client-to-server chunk that contains every one of the patterns.
#[derive(Clone, Copy, Debug)]
pub enum Trap {
    /// Hold the chunk (and the connection's later ones) until the client closes the connection
    /// (it timed out and moved on) or `max_wait` passed, then `delay` more, then deliver it to
    /// Redis: a request that arrives after its sender gave up on it.
    Late { delay: Duration, max_wait: Duration },
    /// Forward the chunk, swallow the reply, then cut the connection: a reply lost on the way.
    LoseReply,
}

/// What happened to the trapped chunk.
#[derive(Clone, Debug)]
pub struct TrapReport {
    /// `CLOCK_MONOTONIC` ns when the chunk was caught, and when the trap was done with it.
    pub caught_ns: u64,
    pub done_ns: u64,
    /// The chunk, printable (CR/LF as spaces), at most 4096 characters.
    pub request: String,
    /// Late: after how long the client closed its end (`None`: it did not within `max_wait`).
    pub client_closed_after: Option<Duration>,
    /// Late: how long the chunk was held in all.
    pub held: Duration,
    /// Whether the chunk was written to Redis.
    pub delivered: bool,
    /// The reply that never reached the client (LoseReply; Late: Redis's reply to the late
    /// request), printable.
    pub swallowed_reply: String,
}

struct Armed {
    patterns: Vec<Vec<u8>>,
    trap: Trap,
}

#[derive(Default)]
struct State {
    stop: AtomicBool,
    blackhole: AtomicBool,
    latency_us: AtomicU64,
    next_id: AtomicU64,
    upstream: AtomicU16,
    armed_flag: AtomicBool,
    armed: Mutex<Option<Armed>>,
    report: Mutex<Option<TrapReport>>,
    /// Both sockets of every open connection, to cut them all at once.
    conns: Mutex<HashMap<u64, (TcpStream, TcpStream)>>,
}

impl State {
    /// Take the armed trap if `chunk` contains all its patterns.
    fn spring(&self, chunk: &[u8]) -> Option<Trap> {
        if !self.armed_flag.load(Ordering::SeqCst) {
            return None;
        }
        let mut armed = self.armed.lock().unwrap();
        let hit = armed
            .as_ref()
            .is_some_and(|a| a.patterns.iter().all(|p| contains(chunk, p)));
        if !hit {
            return None;
        }
        self.armed_flag.store(false, Ordering::SeqCst);
        armed.take().map(|a| a.trap)
    }
}

/// Per connection: the downstream pump swallows replies while `mute` is on.
#[derive(Default)]
struct ConnState {
    mute: AtomicBool,
    swallowed: Mutex<Vec<u8>>,
}

pub struct Proxy {
    pub port: u16,
    state: Arc<State>,
    accept: Option<thread::JoinHandle<()>>,
}

impl Proxy {
    /// Listen on a free loopback port and forward to `127.0.0.1:upstream`.
    pub fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("proxy bind");
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(State::default());
        state.upstream.store(upstream, Ordering::SeqCst);
        let st = state.clone();
        let accept = thread::Builder::new()
            .name("chaos-proxy".into())
            .spawn(move || {
                for client in listener.incoming() {
                    if st.stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(client) = client else { continue };
                    let st = st.clone();
                    // Connect upstream off the accept thread (Redis may be restarting).
                    thread::spawn(move || connect(st, client));
                }
            })
            .expect("proxy thread");
        Proxy {
            port,
            state,
            accept: Some(accept),
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Forward new connections to this port from now on.
    pub fn set_upstream(&self, port: u16) {
        self.state.upstream.store(port, Ordering::SeqCst);
    }

    /// Cut every open connection (both sides see a reset or EOF).
    pub fn drop_all(&self) -> usize {
        let conns: Vec<_> = self.state.conns.lock().unwrap().drain().collect();
        for (_, (a, b)) in &conns {
            let _ = a.shutdown(Shutdown::Both);
            let _ = b.shutdown(Shutdown::Both);
        }
        conns.len()
    }

    pub fn set_blackhole(&self, on: bool) {
        self.state.blackhole.store(on, Ordering::SeqCst);
    }

    pub fn set_latency(&self, latency: Duration) {
        self.state
            .latency_us
            .store(latency.as_micros() as u64, Ordering::SeqCst);
    }

    /// Trap the next client-to-server chunk (of any connection) that contains every pattern.
    pub fn arm(&self, patterns: &[&[u8]], trap: Trap) {
        *self.state.report.lock().unwrap() = None;
        *self.state.armed.lock().unwrap() = Some(Armed {
            patterns: patterns.iter().map(|p| p.to_vec()).collect(),
            trap,
        });
        self.state.armed_flag.store(true, Ordering::SeqCst);
    }

    /// Disarm; true when the trap had not caught anything yet.
    pub fn disarm(&self) -> bool {
        self.state.armed_flag.store(false, Ordering::SeqCst);
        self.state.armed.lock().unwrap().take().is_some()
    }

    /// Whether the armed trap caught a chunk (it may still be holding it).
    pub fn sprung(&self) -> bool {
        !self.state.armed_flag.load(Ordering::SeqCst)
    }

    /// The report of the trap, once it is done with its chunk.
    pub fn take_report(&self) -> Option<TrapReport> {
        self.state.report.lock().unwrap().take()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
        self.set_blackhole(false);
        self.disarm();
        // wake the accept loop so it sees the stop flag
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        self.drop_all();
    }
}

fn connect(st: Arc<State>, client: TcpStream) {
    let port = st.upstream.load(Ordering::SeqCst);
    let target: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let Ok(server) = TcpStream::connect_timeout(&target, Duration::from_secs(1)) else {
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let id = st.next_id.fetch_add(1, Ordering::SeqCst);
    let clones = (|| Some((client.try_clone().ok()?, server.try_clone().ok()?)))();
    let Some((c2, s2)) = clones else { return };
    st.conns.lock().unwrap().insert(id, (c2, s2));
    let (Ok(c_read), Ok(s_read)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    let conn = Arc::new(ConnState::default());
    let (st2, conn2) = (st.clone(), conn.clone());
    let up = thread::spawn(move || pump(&st2, &conn2, c_read, server, true));
    pump(&st, &conn, s_read, client, false);
    let _ = up.join();
    st.conns.lock().unwrap().remove(&id);
}

/// Copy `from` to `to` chunk by chunk, applying the black hole, the latency and (upstream) the
/// armed trap; on EOF or an error shut both down.
fn pump(st: &State, conn: &ConnState, mut from: TcpStream, mut to: TcpStream, upstream: bool) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if !upstream && conn.mute.load(Ordering::SeqCst) {
            conn.swallowed.lock().unwrap().extend_from_slice(&buf[..n]);
            continue;
        }
        if upstream {
            if let Some(trap) = st.spring(&buf[..n]) {
                let go_on = spring(st, conn, trap, &mut from, &mut to, &buf[..n]);
                if go_on {
                    continue;
                }
                break;
            }
        }
        let held = Instant::now();
        while st.blackhole.load(Ordering::SeqCst)
            && !st.stop.load(Ordering::SeqCst)
            && held.elapsed() < MAX_HOLD
        {
            thread::sleep(Duration::from_millis(5));
        }
        let latency = st.latency_us.load(Ordering::SeqCst);
        if latency > 0 {
            thread::sleep(Duration::from_micros(latency));
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

/// Apply a trap to `chunk` (read from the client `from`, bound for Redis `to`) and file its
/// report. Returns whether the pump goes on with the connection.
fn spring(
    st: &State,
    conn: &ConnState,
    trap: Trap,
    from: &mut TcpStream,
    to: &mut TcpStream,
    chunk: &[u8],
) -> bool {
    let caught_ns = now_ns();
    let caught = Instant::now();
    let mut report = TrapReport {
        caught_ns,
        done_ns: 0,
        request: printable(chunk, 4096),
        client_closed_after: None,
        held: Duration::ZERO,
        delivered: false,
        swallowed_reply: String::new(),
    };
    let go_on = match trap {
        Trap::LoseReply => {
            conn.mute.store(true, Ordering::SeqCst);
            report.delivered = to.write_all(chunk).is_ok();
            // cut as soon as the reply came (the client's retry should find the next holder)
            while caught.elapsed() < LOSE_REPLY_WAIT
                && !st.stop.load(Ordering::SeqCst)
                && !complete_reply(&conn.swallowed.lock().unwrap())
            {
                thread::sleep(Duration::from_millis(1));
            }
            let _ = from.shutdown(Shutdown::Both);
            let _ = to.shutdown(Shutdown::Both);
            report.swallowed_reply = printable(&conn.swallowed.lock().unwrap(), 160);
            false
        }
        Trap::Late { delay, max_wait } => {
            // Wait for the client to give up on the connection: a peek that sees EOF.
            let _ = from.set_read_timeout(Some(Duration::from_millis(20)));
            let mut probe = [0u8; 1];
            while caught.elapsed() < max_wait && !st.stop.load(Ordering::SeqCst) {
                match from.peek(&mut probe) {
                    Ok(0) => {
                        report.client_closed_after = Some(caught.elapsed());
                        break;
                    }
                    Ok(_) => thread::sleep(Duration::from_millis(20)),
                    Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                    Err(_) => {
                        report.client_closed_after = Some(caught.elapsed());
                        break;
                    }
                }
            }
            let _ = from.set_read_timeout(None);
            sleep_unless_stopped(st, delay);
            report.held = caught.elapsed();
            // the reply goes nowhere (the client left): keep it for the report
            conn.mute.store(true, Ordering::SeqCst);
            report.delivered = to.write_all(chunk).is_ok();
            let sent = Instant::now();
            while sent.elapsed() < AFTER_LATE_DELIVERY && !st.stop.load(Ordering::SeqCst) {
                thread::sleep(Duration::from_millis(5));
            }
            report.swallowed_reply = printable(&conn.swallowed.lock().unwrap(), 300);
            report.delivered
        }
    };
    report.done_ns = now_ns();
    *st.report.lock().unwrap() = Some(report);
    go_on
}

/// Whether `reply` holds one whole RESP reply (enough for the short replies of the scripts:
/// a simple string, an error, an integer, or an array of bulk strings and integers).
fn complete_reply(reply: &[u8]) -> bool {
    fn line(r: &[u8], at: usize) -> Option<(&[u8], usize)> {
        let end = at + r.get(at..)?.windows(2).position(|w| w == b"\r\n")?;
        Some((&r[at..end], end + 2))
    }
    fn value(r: &[u8], at: usize) -> Option<usize> {
        let (head, next) = line(r, at)?;
        let n = || std::str::from_utf8(&head[1..]).ok()?.parse::<i64>().ok();
        match head.first()? {
            b'+' | b'-' | b':' => Some(next),
            b'$' if n()? < 0 => Some(next),
            b'$' => {
                let end = next + n()? as usize + 2;
                (r.len() >= end).then_some(end)
            }
            b'*' => (0..n()?.max(0)).try_fold(next, |at, _| value(r, at)),
            _ => None,
        }
    }
    value(reply, 0).is_some()
}

fn sleep_unless_stopped(st: &State, d: Duration) {
    let until = Instant::now() + d;
    while Instant::now() < until && !st.stop.load(Ordering::SeqCst) {
        thread::sleep(
            Duration::from_millis(5).min(until.saturating_duration_since(Instant::now())),
        );
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || hay.windows(needle.len()).any(|w| w == needle)
}

/// Bytes as one printable line (CR/LF and other controls as spaces), at most `max` characters.
pub fn printable(bytes: &[u8], max: usize) -> String {
    bytes
        .iter()
        .take(max)
        .map(|&b| if b.is_ascii_graphic() { b as char } else { ' ' })
        .collect::<String>()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}
