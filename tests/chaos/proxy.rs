//! A small threaded TCP proxy on loopback between the workers and Redis, for network faults:
//! cut every connection, black-hole (accept and hold, forward nothing) and add latency.
//!
//! Each connection gets two pump threads, one per direction. A pump reads a chunk, waits while
//! the black hole is on, sleeps the latency, then writes the chunk on: data held during a black
//! hole is delivered late once it ends (as after a partition heals), so a request the client
//! already gave up on may still reach Redis.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// The longest a pump waits for a black hole to end (faults are shorter; this bounds the thread).
const MAX_HOLD: Duration = Duration::from_secs(30);

#[derive(Default)]
struct State {
    stop: AtomicBool,
    blackhole: AtomicBool,
    latency_us: AtomicU64,
    next_id: AtomicU64,
    /// Both sockets of every open connection, to cut them all at once.
    conns: Mutex<HashMap<u64, (TcpStream, TcpStream)>>,
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
        let st = state.clone();
        let target: SocketAddr = format!("127.0.0.1:{upstream}").parse().unwrap();
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
                    thread::spawn(move || connect(st, client, target));
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
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
        self.set_blackhole(false);
        // wake the accept loop so it sees the stop flag
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        self.drop_all();
    }
}

fn connect(st: Arc<State>, client: TcpStream, target: SocketAddr) {
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
    let st2 = st.clone();
    let up = thread::spawn(move || pump(&st2, c_read, server));
    pump(&st, s_read, client);
    let _ = up.join();
    st.conns.lock().unwrap().remove(&id);
}

/// Copy `from` to `to` chunk by chunk, applying the black hole and the latency; on EOF or an
/// error shut both down.
fn pump(st: &State, mut from: TcpStream, mut to: TcpStream) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
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
