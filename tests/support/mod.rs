//! Shared test plumbing: real `redis-server` processes on loopback, and worker child processes.
//!
//! Every test starts its own server on a free port in a temp dir (no persistence unless asked)
//! and the server is killed when the handle drops. Child processes are this same test binary
//! re-invoked with `FAIRLOCK_CHILD=<role>`: [`Worker`] starts one, collects every line it prints,
//! can write to its stdin and kills it on drop; the child's test checks [`child_role`]. In the
//! child: [`say`] prints a `PREFIX rest` line, [`hear`] reads a line from the parent,
//! [`child_time_limit`] bounds its life, [`env_arg`] reads its parameters and
//! [`client_with_url`] builds its client.
//!
//! Every test binary compiles this module and uses only part of it, hence `allow(dead_code)`.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::ops::RangeInclusive;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// A redis-server process owned by a test.
pub struct RedisServer {
    pub port: u16,
    /// The server's working dir (its log, and its AOF when enabled), removed on drop.
    dir: TempDir,
    extra: Vec<String>,
    child: Option<Child>,
}

/// The first port [`free_port`] may hand out below the kernel's ephemeral range (as
/// `free_port` in scripts/lib.sh).
const TEST_PORTS_FROM: u16 = 20000;

/// The kernel's ephemeral port range (`ip_local_port_range`): where it picks the local port of
/// an outgoing connection, or of a bind to port 0.
fn ephemeral_ports() -> RangeInclusive<u16> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range");
    let bounds: Vec<u16> = text
        .iter()
        .flat_map(|t| t.split_whitespace())
        .filter_map(|n| n.parse().ok())
        .collect();
    match bounds[..] {
        [low, high] => low..=high,
        _ => 32768..=60999, // Linux's default
    }
}

/// A free loopback port for a server, outside the kernel's ephemeral range, so that the local
/// port of an outgoing connection cannot take it before the server binds it (or between a kill
/// and a restart on the same port). Random among the ports below that range (above it when there
/// is more room there), free when a bind to it works, and never handed out twice in one process.
/// Panics after 100 candidates that were taken.
pub fn free_port() -> u16 {
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let ephemeral = ephemeral_ports();
    let below = TEST_PORTS_FROM..*ephemeral.start();
    let above = ephemeral.end().saturating_add(1)..u16::MAX;
    let ports = if below.len() >= above.len() {
        below
    } else {
        above
    };
    assert!(
        !ports.is_empty(),
        "no ports for tests outside the ephemeral range {ephemeral:?}"
    );
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..100 {
        let port = fastrand::u16(ports.clone());
        if !handed_out.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            handed_out.insert(port);
            return port;
        }
    }
    panic!("no free port in {ports:?} after 100 tries");
}

impl RedisServer {
    /// Start a throwaway server: no RDB, no AOF.
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    /// Start with extra config, e.g. `&["--appendonly", "yes", "--appendfsync", "always"]`.
    pub fn start_with(extra: &[&str]) -> RedisServer {
        let dir = tempfile::Builder::new()
            .prefix("fairlock-test-")
            .tempdir()
            .expect("create temp dir");
        let mut server = RedisServer {
            port: 0,
            dir,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            child: None,
        };
        // another process may bind the port between free_port and the server: try another one
        for _ in 0..5 {
            server.port = free_port();
            if server.launch() {
                return server;
            }
            server.stop();
        }
        panic!(
            "redis-server did not start on 5 ports (log: {})",
            server.dir.path().join("redis.log").display()
        );
    }

    /// Start redis-server on `self.port`; false when it exited before answering (port taken)
    /// or did not answer within 10 s.
    fn launch(&mut self) -> bool {
        let mut cmd = Command::new("redis-server");
        cmd.arg("--port")
            .arg(self.port.to_string())
            .arg("--bind")
            .arg("127.0.0.1")
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--save")
            .arg("")
            .arg("--appendonly")
            .arg("no")
            .arg("--daemonize")
            .arg("no")
            .arg("--logfile")
            .arg(self.dir.path().join("redis.log"));
        for a in &self.extra {
            cmd.arg(a);
        }
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (scripts/test.sh installs it)");
        let pid = child.id();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(Ok(Some(_))) = self.child.as_mut().map(Child::try_wait) {
                return false;
            }
            // ready when it answers PING, and it is this server, not another on the same port
            if let Ok(mut c) = self.try_conn() {
                let info: redis::RedisResult<String> = redis::cmd("PING")
                    .query::<String>(&mut c)
                    .and_then(|_| redis::cmd("INFO").arg("server").query(&mut c));
                if let Ok(info) = info {
                    return info.contains(&format!("process_id:{pid}\r\n"));
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
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

    /// SIGKILL the server (no shutdown save) and keep it stopped (for "server is down" tests).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Kill and start again on the same port (and dir: an AOF, if enabled, is replayed).
    pub fn restart(&mut self) {
        self.stop();
        self.start_again();
    }

    /// Start the server again on its port and dir after [`RedisServer::stop`].
    pub fn start_again(&mut self) {
        assert!(
            self.launch(),
            "redis-server did not start again on port {} (log: {})",
            self.port,
            self.dir.path().join("redis.log").display()
        );
    }

    /// The keys of lock `name` under the default prefix (`fairlock:{name}...`), sorted.
    pub fn lock_keys(&self, name: &str) -> Vec<String> {
        let mut keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("fairlock:{{{name}}}*"))
            .query(&mut self.conn())
            .unwrap();
        keys.sort();
        keys
    }

    /// PTTL of a key in ms (-2: missing, -1: no TTL).
    pub fn pttl(&self, key: &str) -> i64 {
        redis::cmd("PTTL").arg(key).query(&mut self.conn()).unwrap()
    }

    /// One field of `INFO commandstats`, e.g. `calls` of `blpop`; 0 when the command never ran.
    pub fn command_calls(&self, command: &str) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut self.conn())
            .unwrap();
        let prefix = format!("cmdstat_{command}:calls=");
        info.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }

    /// `total_commands_processed` from `INFO stats`.
    pub fn total_commands(&self) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("stats")
            .query(&mut self.conn())
            .unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("total_commands_processed:"))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }
    /// Wait (up to 3 s) until the keys of lock `name` are exactly `expected`, else panic showing
    /// the keys last seen. A waiter's wake list may outlive its wait by up to 3 janitor
    /// intervals: a heartbeat already on its way when the waiter left tells it to "retry" with
    /// that TTL.
    pub fn assert_lock_keys(&self, name: &str, expected: &[&str]) {
        let mut last = vec![];
        let settled = eventually(Duration::from_secs(3), || {
            last = self.lock_keys(name);
            last == expected
        });
        assert!(
            settled,
            "keys of lock {name:?}: {last:?}, expected {expected:?}"
        );
    }

    /// Wait (up to 3 s) until lock `name` is free with nothing left but its fence and the
    /// tombstone of its last hold (a lock hash whose owner is empty, living out that hold's
    /// lease), else panic. See [`RedisServer::assert_lock_keys`].
    pub fn assert_released_keys(&self, name: &str) {
        let lock = format!("fairlock:{{{name}}}");
        self.assert_lock_keys(name, &[&lock, &format!("{lock}:fence")]);
        let owner: Option<String> = redis::cmd("HGET")
            .arg(&lock)
            .arg("owner")
            .query(&mut self.conn())
            .unwrap();
        assert_eq!(owner.as_deref(), Some(""), "{lock} is not a tombstone");
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // the TempDir field drops after this and removes the dir of the dead server
        self.stop();
    }
}

/// A client for tests: short janitor interval so crash repair is quick, short timeouts.
pub fn client(server: &RedisServer) -> fairlock::LockClient {
    client_with_url(&server.url(), |b| b)
}

/// A client for the server at `url` (a child gets it from its parent) with [`client`]'s settings
/// (janitor 200 ms, connect timeout 2 s, read timeout 5 s) changed by `configure`.
pub fn client_with_url(
    url: &str,
    configure: impl FnOnce(fairlock::LockClientBuilder) -> fairlock::LockClientBuilder,
) -> fairlock::LockClient {
    let builder = fairlock::LockClient::builder(url)
        .janitor_interval(Duration::from_millis(200))
        .connect_timeout(Duration::from_secs(2))
        .read_timeout(Duration::from_secs(5));
    configure(builder).build().expect("connect to test redis")
}

/// The role this process was started for, if it is a child (see [`Worker::spawn`]).
pub fn child_role() -> Option<String> {
    std::env::var("FAIRLOCK_CHILD").ok()
}

/// This test binary, set up to run only `test_name` as a child with `FAIRLOCK_CHILD=role`.
fn child_command(test_name: &str, role: &str, env: &[(&str, String)]) -> Command {
    let exe = std::env::current_exe().expect("current test binary");
    let mut cmd = Command::new(exe);
    cmd.arg("--exact")
        .arg(test_name)
        .arg("--nocapture")
        .arg("--test-threads=1")
        .env("FAIRLOCK_CHILD", role)
        .stderr(Stdio::inherit());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// The rest of `line` after `prefix`, trimmed. The prefix may follow other text: the test harness
/// prints `test <name> ... ` without a newline before the child's first line.
fn after_prefix(line: &str, prefix: &str) -> Option<String> {
    let line = line.trim_end();
    if let Some(rest) = line.strip_prefix(prefix) {
        return Some(rest.trim().to_string());
    }
    let at = line.find(&format!(" ... {prefix}"))?;
    Some(line[at + 5 + prefix.len()..].trim().to_string())
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

/// Microseconds since the Unix epoch on this machine's clock (for comparing moments between a
/// test and its child processes on the same machine; the library itself never uses it).
pub fn unix_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

/// A child process running a role of a test (see [`child_role`]), with every stdout line
/// collected by a reader thread and stdin open for commands. Killed when dropped.
pub struct Worker {
    pub role: String,
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
    stdin: Option<std::process::ChildStdin>,
}

impl Worker {
    /// Start `test_name` of this test binary as a child with `FAIRLOCK_CHILD=role`.
    pub fn spawn(test_name: &str, role: &str, env: &[(&str, String)]) -> Worker {
        let mut cmd = child_command(test_name, role, env);
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn child test process");
        let stdout = child.stdout.take().unwrap();
        let stdin = child.stdin.take();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Worker {
            role: role.to_string(),
            child,
            lines,
            stdin,
        }
    }

    /// The next line starting with `prefix` (others are skipped), without the prefix; `None` when
    /// none came within `timeout` or the child's stdout closed.
    pub fn try_expect(&mut self, prefix: &str, timeout: Duration) -> Option<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self.lines.recv_timeout(left).ok()?;
            if let Some(rest) = after_prefix(&line, prefix) {
                return Some(rest);
            }
        }
    }

    /// Like [`Worker::try_expect`] but panics, naming the role, when the line does not come.
    pub fn expect(&mut self, prefix: &str, timeout: Duration) -> String {
        match self.try_expect(prefix, timeout) {
            Some(rest) => rest,
            None => panic!(
                "child {:?} printed no line starting with {prefix:?} within {timeout:?}",
                self.role
            ),
        }
    }

    /// Send one line to the child's stdin.
    pub fn send(&mut self, line: &str) {
        use std::io::Write;
        let stdin = self.stdin.as_mut().expect("child stdin");
        writeln!(stdin, "{line}").expect("write to child");
        stdin.flush().unwrap();
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL the child and reap it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Wait for the child to exit (killing it after `timeout`); true when it exited successfully.
    pub fn wait(&mut self, timeout: Duration) -> bool {
        self.stdin = None;
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.success();
            }
            if Instant::now() >= deadline {
                self.kill();
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.kill();
    }
}

/// In a child: print one `PREFIX rest` line for the parent (stdout is line-buffered).
pub fn say(prefix: &str, rest: impl std::fmt::Display) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{prefix} {rest}");
    let _ = out.flush();
}

/// In a child: the next line the parent sent ("" when the parent closed stdin).
pub fn hear() -> String {
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    line.trim().to_string()
}

/// In a child: exit with status 3 after `limit` whatever happens, so no child outlives a test.
pub fn child_time_limit(limit: Duration) {
    std::thread::spawn(move || {
        std::thread::sleep(limit);
        eprintln!("child {:?}: time limit {limit:?} reached", child_role());
        std::process::exit(3);
    });
}

/// An environment variable a parent passed to its child, parsed.
pub fn env_arg<T: std::str::FromStr>(name: &str) -> T {
    std::env::var(name)
        .unwrap_or_else(|_| panic!("child needs {name}"))
        .parse()
        .unwrap_or_else(|_| panic!("bad {name}"))
}

/// The waiters of `lock` in queue order, by process id.
pub fn queue_pids(lock: &fairlock::FairLock) -> Vec<u32> {
    let status = lock.status().expect("status");
    status.waiters.iter().map(|w| w.origin.pid).collect()
}

/// The waiters of `lock` in queue order, by owner flag.
pub fn queue_owners(lock: &fairlock::FairLock) -> Vec<String> {
    let status = lock.status().expect("status");
    status.waiters.into_iter().map(|w| w.origin.owner).collect()
}
