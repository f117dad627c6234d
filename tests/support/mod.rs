//! Shared test plumbing: real `redis-server` processes on loopback, and worker child processes.
//!
//! Every test starts its own server on a free port in a temp dir (no persistence unless asked)
//! and the server is killed when the handle drops. Child processes are this same test binary
//! re-invoked with `FAIRLOCK_CHILD=<role>`: see [`spawn_child`] and [`child_role`].
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A redis-server process owned by a test.
pub struct RedisServer {
    pub port: u16,
    pub dir: PathBuf,
    extra: Vec<String>,
    child: Option<Child>,
}

/// A free loopback port (bind to port 0, read it, let it go).
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().unwrap().port()
}

impl RedisServer {
    /// Start a throwaway server: no RDB, no AOF.
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    /// Start with extra config, e.g. `&["--appendonly", "yes", "--appendfsync", "always"]`.
    pub fn start_with(extra: &[&str]) -> RedisServer {
        let dir = std::env::temp_dir().join(format!(
            "fairlock-test-{}-{}",
            std::process::id(),
            uuid_like()
        ));
        std::fs::create_dir_all(&dir).expect("create temp dir");
        let mut server = RedisServer {
            port: free_port(),
            dir,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            child: None,
        };
        server.launch();
        server
    }

    fn launch(&mut self) {
        let mut cmd = Command::new("redis-server");
        cmd.arg("--port")
            .arg(self.port.to_string())
            .arg("--bind")
            .arg("127.0.0.1")
            .arg("--dir")
            .arg(&self.dir)
            .arg("--save")
            .arg("")
            .arg("--appendonly")
            .arg("no")
            .arg("--daemonize")
            .arg("no")
            .arg("--logfile")
            .arg(self.dir.join("redis.log"));
        for a in &self.extra {
            cmd.arg(a);
        }
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (scripts/test.sh installs it)");
        self.child = Some(child);
        self.wait_ready();
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(mut c) = self.try_conn() {
                if redis::cmd("PING").query::<String>(&mut c).is_ok() {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "redis-server on port {} did not start", self.port);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn try_conn(&self) -> redis::RedisResult<redis::Connection> {
        redis::Client::open(self.url())?.get_connection_with_timeout(Duration::from_secs(1))
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A plain connection for inspecting keys.
    pub fn conn(&self) -> redis::Connection {
        let c = self.try_conn().expect("connect to test redis");
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        c
    }

    /// All keys on the server, sorted.
    pub fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut self.conn()).unwrap();
        keys.sort();
        keys
    }

    /// SIGKILL the server (no shutdown save).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Kill and start again on the same port (and dir: an AOF, if enabled, is replayed).
    pub fn restart(&mut self) {
        self.kill();
        // the port can linger briefly; launch retries through wait_ready's deadline
        self.launch();
    }

    /// Stop the server and keep it stopped (for "server is down" tests).
    pub fn stop(&mut self) {
        self.kill();
    }

    pub fn start_again(&mut self) {
        self.launch();
    }

    /// Server process id, for SIGSTOP/SIGCONT.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn uuid_like() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{nanos:x}-{}", N.fetch_add(1, Ordering::Relaxed))
}

/// A client for tests: short janitor interval so crash repair is quick, short timeouts.
pub fn client(server: &RedisServer) -> fairlock::LockClient {
    fairlock::LockClient::builder(&server.url())
        .janitor_interval(Duration::from_millis(200))
        .connect_timeout(Duration::from_secs(2))
        .read_timeout(Duration::from_secs(5))
        .build()
        .expect("connect to test redis")
}

/// The role this process was started for, if it is a child (see [`spawn_child`]).
pub fn child_role() -> Option<String> {
    std::env::var("FAIRLOCK_CHILD").ok()
}

/// Re-run this test binary as a child process that executes only `test_name`, with
/// `FAIRLOCK_CHILD=role` and extra environment. The child's `test_name` test must check
/// [`child_role`] and do the child's work; in a normal run (no FAIRLOCK_CHILD) it returns at once.
/// Its stdout is piped so the parent can read lines it prints.
pub fn spawn_child(test_name: &str, role: &str, env: &[(&str, String)]) -> Child {
    let exe = std::env::current_exe().expect("current test binary");
    let mut cmd = Command::new(exe);
    cmd.arg("--exact")
        .arg(test_name)
        .arg("--nocapture")
        .arg("--test-threads=1")
        .env("FAIRLOCK_CHILD", role)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn child test process")
}

/// Read lines from a child's stdout until one starts with `prefix` (bounded by `timeout`).
/// Lines are expected in the form `PREFIX rest`; returns `rest`.
pub fn read_line_with(child: &mut Child, prefix: &str, timeout: Duration) -> Option<String> {
    let stdout = child.stdout.take()?;
    let (tx, rx) = std::sync::mpsc::channel();
    let prefix = prefix.to_string();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    if let Some(rest) = line.trim_end().strip_prefix(&prefix) {
                        let _ = tx.send(rest.trim().to_string());
                        // keep draining so the child never blocks on a full pipe
                        let mut sink = String::new();
                        while reader.read_line(&mut sink).map(|n| n > 0).unwrap_or(false) {
                            sink.clear();
                        }
                        return;
                    }
                }
            }
        }
    });
    rx.recv_timeout(timeout).ok()
}

/// Wait for a child to exit, killing it after `timeout`. Returns whether it exited successfully.
pub fn wait_child(child: &mut Child, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return status.success();
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Poll `cond` every 10 ms until it holds or `timeout` passes (for checks, not for timing).
pub fn eventually(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
