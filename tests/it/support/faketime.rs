//! A redis-server whose wall clock the fuzzer can step, through libfaketime.
//!
//! libfaketime re-reads `FAKETIME_TIMESTAMP_FILE` on every time call (`FAKETIME_NO_CACHE=1`), so
//! rewriting that file ("+12.345" / "-0.500": seconds from the real clock) steps the server's
//! `TIME`, its key expiry and the scripts' clock at once. `DONT_FAKE_MONOTONIC=1` leaves
//! CLOCK_MONOTONIC alone: only the wall clock moves, as with an NTP step.
//!
//! Debian's redis-server allocates with jemalloc, which calls `clock_gettime` while libfaketime
//! is still resolving its own symbols: the server deadlocks at start (libfaketime issue #130).
//! Preloading glibc's `libc_malloc_debug.so.0` first routes `malloc` and friends to glibc's
//! allocator, which never asks for the time, and breaks that cycle. jemalloc stays loaded for
//! Redis's `mallctl` statistics and allocates nothing. The Redis 6.2 and Valkey binaries of the
//! server matrix (scripts/test.sh) use glibc's allocator already; the preload changes nothing
//! for them.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A throwaway redis-server (no persistence, loopback only) on a steppable wall clock.
pub struct FakeClockRedis {
    pub port: u16,
    /// The server's directory (its log, the clock offset file), removed when dropped.
    dir: tempfile::TempDir,
    offset_file: PathBuf,
    offset_ms: i64,
    child: Option<Child>,
}

/// libfaketime makes a shared memory segment and a semaphore per process and removes them at
/// exit, which a killed server never reaches: they are removed here. Left behind, they pile up
/// in /dev/shm, and the `faketime` command (tests/it/support/tls.rs) fails with "sem_open: File
/// exists" when it gets the pid of one of them.
pub fn remove_shared_memory(pid: u32) {
    let _ = std::fs::remove_file(format!("/dev/shm/faketime_shm_{pid}"));
    let _ = std::fs::remove_file(format!("/dev/shm/sem.faketime_sem_{pid}"));
}

/// libfaketime (`LD_PRELOAD`), for a command run at a faked time without the `faketime`
/// wrapper (which needs a fresh semaphore named after its pid).
pub fn libfaketime() -> Option<PathBuf> {
    find_lib("FAIRLOCK_LIBFAKETIME", "faketime/libfaketime.so.1")
}

/// The first existing file among `<dir>/<name>` and `<dir>/*/<name>` for the usual library dirs.
fn find_lib(env: &str, name: &str) -> Option<PathBuf> {
    if let Ok(p) = std::env::var(env) {
        return Some(PathBuf::from(p));
    }
    for dir in ["/usr/lib", "/lib", "/usr/local/lib", "/lib64", "/usr/lib64"] {
        let direct = Path::new(dir).join(name);
        if direct.exists() {
            return Some(direct);
        }
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path().join(name);
            if p.exists() {
                return Some(p);
            }
        }
    }
    None
}

/// `--enable-debug-command local` where the server has that setting (Redis 7 and Valkey refuse
/// `DEBUG` without it); Redis 6.2 has no such setting (its `DEBUG` is always open) and would not
/// start with it. Asked of the server once per process, not read from its version: a plain
/// server is started and asked `CONFIG GET enable-debug-command` (an empty reply: no such
/// setting).
fn debug_command_args() -> &'static [&'static str] {
    static ARGS: OnceLock<&'static [&'static str]> = OnceLock::new();
    ARGS.get_or_init(|| {
        let server = crate::support::RedisServer::start();
        let setting: Vec<String> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("enable-debug-command")
            .query(&mut server.conn())
            .expect("CONFIG GET enable-debug-command");
        if setting.is_empty() {
            &[]
        } else {
            &["--enable-debug-command", "local"]
        }
    })
}

impl FakeClockRedis {
    /// Start a server at clock offset 0 and check that `TIME` follows the offset file.
    pub fn start() -> FakeClockRedis {
        let faketime = find_lib("FAIRLOCK_LIBFAKETIME", "faketime/libfaketime.so.1").expect(
            "libfaketime not found: install Debian's faketime package \
             (scripts/fuzz.sh does: apt-get install -y faketime) or set FAIRLOCK_LIBFAKETIME",
        );
        let mut preload = faketime.display().to_string();
        if let Some(glibc_malloc) = find_lib("FAIRLOCK_LIBC_MALLOC", "libc_malloc_debug.so.0") {
            preload = format!("{}:{preload}", glibc_malloc.display());
        }
        let dir = tempfile::Builder::new()
            .prefix("fairlock-fuzz-")
            .tempdir()
            .expect("create temp dir");
        let offset_file = dir.path().join("clock-offset");
        let mut server = FakeClockRedis {
            port: 0,
            dir,
            offset_file,
            offset_ms: 0,
            child: None,
        };
        server.write_offset(0);
        // a port taken between free_port and the bind: try a few
        for _ in 0..5 {
            server.port = crate::support::free_port();
            let child = Command::new(crate::support::server_binary())
                .args(["--port", &server.port.to_string(), "--bind", "127.0.0.1"])
                .arg("--dir")
                .arg(server.dir.path())
                .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
                // DEBUG SET-ACTIVE-EXPIRE, for runs where expired keys must wait to be touched
                .args(debug_command_args())
                .arg("--logfile")
                .arg(server.dir.path().join("redis.log"))
                .env("LD_PRELOAD", &preload)
                .env("FAKETIME_TIMESTAMP_FILE", &server.offset_file)
                .env("FAKETIME_NO_CACHE", "1")
                .env("DONT_FAKE_MONOTONIC", "1")
                .env_remove("FAKETIME")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| {
                    panic!(
                        "start {:?}: {e} (scripts/test.sh installs redis-server)",
                        crate::support::server_binary()
                    )
                });
            server.child = Some(child);
            if server.wait_ready() {
                server.verify_clock();
                return server;
            }
            server.kill();
        }
        panic!(
            "redis-server under libfaketime ({preload}) did not start; log in {}",
            server.dir.path().display()
        );
    }

    fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Some(Ok(Some(_))) = self.child.as_mut().map(|c| c.try_wait()) {
                return false;
            }
            if let Ok(mut c) = self.try_conn() {
                if redis::cmd("PING").query::<String>(&mut c).is_ok() {
                    return true;
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// The server must follow the offset file: step it by +1000 s and back.
    fn verify_clock(&mut self) {
        let mut c = self.conn();
        let before = server_time_us(&mut c);
        self.set_offset_ms(1_000_000);
        let stepped = server_time_us(&mut c);
        self.set_offset_ms(0);
        let back = server_time_us(&mut c);
        let jump = stepped - before;
        assert!(
            (999_000_000..1_002_000_000).contains(&jump) && back < stepped - 999_000_000,
            "redis-server's TIME does not follow libfaketime's offset file \
             (before {before}, stepped {stepped}, back {back})"
        );
    }

    fn try_conn(&self) -> redis::RedisResult<redis::Connection> {
        redis::Client::open(self.url())?.get_connection_with_timeout(Duration::from_secs(1))
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A connection whose reads and writes time out after 5 s, so no call can hang a run.
    pub fn conn(&self) -> redis::Connection {
        let c = self.try_conn().expect("connect to the fuzz redis-server");
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
        c
    }

    /// The server clock's offset from the real wall clock (ms).
    pub fn offset_ms(&self) -> i64 {
        self.offset_ms
    }

    /// Step the server's wall clock to `offset_ms` from the real one.
    pub fn set_offset_ms(&mut self, offset_ms: i64) {
        self.offset_ms = offset_ms;
        self.write_offset(offset_ms);
    }

    /// Written to a temporary file and renamed, so the server never reads half a line.
    fn write_offset(&self, offset_ms: i64) {
        let text = format!("{:+.3}\n", offset_ms as f64 / 1000.0);
        let tmp = self.offset_file.with_extension("tmp");
        std::fs::write(&tmp, text).expect("write the clock offset");
        std::fs::rename(&tmp, &self.offset_file).expect("replace the clock offset");
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let pid = c.id();
            let _ = c.kill();
            let _ = c.wait();
            remove_shared_memory(pid);
        }
    }
}

impl Drop for FakeClockRedis {
    fn drop(&mut self) {
        // the TempDir field is removed after this, once the server is gone
        self.kill();
    }
}

/// The server's `TIME` in µs.
pub fn server_time_us(conn: &mut redis::Connection) -> i64 {
    let (s, us): (i64, i64) = redis::cmd("TIME").query(conn).expect("TIME");
    s * 1_000_000 + us
}
