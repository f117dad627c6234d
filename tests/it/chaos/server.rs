//! The redis-server of a chaos run: a plain one (`tests/support`, with or without AOF), or one
//! whose wall clock the harness can step (`FakeClockRedis` of `tests/it/support/faketime.rs`, under
//! libfaketime, without persistence).
//!
//! `FakeClockRedis` cannot restart on its port, so a restart of the stepped server kills it
//! (SIGKILL, as a crash) and starts a fresh one on a new port at the same clock offset; the
//! proxy then forwards to the new port. Without persistence that is what a restart is to the
//! clients: every connection drops, every key is gone, the server clock runs on.

use std::path::Path;

use crate::chaos::faketime::FakeClockRedis;
use crate::support::RedisServer;

pub enum Server {
    Plain(RedisServer),
    FakeClock {
        /// `None` only inside `restart`.
        server: Option<FakeClockRedis>,
        offset_ms: i64,
    },
}

/// Whether libfaketime is installed (where `FakeClockRedis` looks for it).
pub fn libfaketime_available() -> bool {
    if std::env::var_os("FAIRLOCK_LIBFAKETIME").is_some() {
        return true;
    }
    let name = "faketime/libfaketime.so.1";
    ["/usr/lib", "/lib", "/usr/local/lib", "/lib64", "/usr/lib64"]
        .iter()
        .any(|dir| {
            Path::new(dir).join(name).exists()
                || std::fs::read_dir(dir)
                    .map(|entries| entries.flatten().any(|e| e.path().join(name).exists()))
                    .unwrap_or(false)
        })
}

impl Server {
    /// `aof`: `appendonly yes` + `appendfsync always`. `fake_clock` (only without AOF): a
    /// server whose clock [`Server::step_clock`] can step.
    pub fn start(aof: bool, fake_clock: bool) -> Server {
        assert!(
            !(aof && fake_clock),
            "the stepped clock runs without persistence"
        );
        if fake_clock {
            Server::FakeClock {
                server: Some(FakeClockRedis::start()),
                offset_ms: 0,
            }
        } else if aof {
            Server::Plain(RedisServer::start_with(&[
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ]))
        } else {
            Server::Plain(RedisServer::start())
        }
    }

    pub fn port(&self) -> u16 {
        match self {
            Server::Plain(s) => s.port,
            Server::FakeClock { server, .. } => server.as_ref().expect("a server").port,
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port())
    }

    pub fn can_step_clock(&self) -> bool {
        matches!(self, Server::FakeClock { .. })
    }

    /// `kill -9` and start again; returns the port the server listens on now.
    pub fn restart(&mut self) -> u16 {
        match self {
            Server::Plain(s) => s.restart(),
            Server::FakeClock { server, offset_ms } => {
                drop(server.take()); // SIGKILL
                let mut fresh = FakeClockRedis::start();
                fresh.set_offset_ms(*offset_ms);
                *server = Some(fresh);
            }
        }
        self.port()
    }

    /// Step the server's wall clock by `delta_ms`; returns the new offset from the real clock.
    pub fn step_clock(&mut self, delta_ms: i64) -> i64 {
        match self {
            Server::Plain(_) => panic!("this server's clock cannot be stepped"),
            Server::FakeClock { server, offset_ms } => {
                *offset_ms += delta_ms;
                server.as_mut().expect("a server").set_offset_ms(*offset_ms);
                *offset_ms
            }
        }
    }

    /// The server clock's offset from the real wall clock (0 for a plain server).
    pub fn offset_ms(&self) -> i64 {
        match self {
            Server::Plain(_) => 0,
            Server::FakeClock { offset_ms, .. } => *offset_ms,
        }
    }
}
