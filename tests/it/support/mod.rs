//! Shared test plumbing: real `redis-server` processes on loopback, and child processes.
//!
//! Every test starts its own server on a free port in a temp dir (no persistence unless asked)
//! and the server is killed when the handle drops. [`Proc`] runs any child process (the CLI, or
//! this test binary again): it collects every line the child prints, can write to its stdin and
//! kills it on drop. A test re-runs itself as children with [`child_test!`], which ties the
//! children to the test's own name and hands them their role in `FAIRLOCK_CHILD`. In a child:
//! [`say`] prints a `PREFIX rest` line, [`hear`] reads a line from the parent,
//! [`child_time_limit`] bounds its life, [`env_arg`] reads its parameters and
//! [`client_with_url`] builds its client.
//!
//! Every test binary compiles this module and uses only part of it, hence `allow(dead_code)`.
#![allow(dead_code)]

pub mod faketime;
pub mod mono_clock;
pub mod passwords;
pub mod rng;
pub mod tls;
pub mod topology;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::ops::RangeInclusive;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver};
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
    free_port_with(&[])
}

/// The offset of a Cluster node's bus port from its own (Redis's default `cluster-port`).
pub const CLUSTER_BUS_OFFSET: u16 = 10000;

/// As [`free_port`], for a server that also binds `port + offset` for each of `offsets` (a
/// Cluster node's bus, a TLS port beside the plain one): every one of those ports is outside the
/// ephemeral range, free, and handed out with it. A bus port left in the ephemeral range was
/// taken by some connection's local port five times in a row once, under a loaded suite.
pub fn free_port_with(offsets: &[u16]) -> u16 {
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let ephemeral = ephemeral_ports();
    let reach = offsets.iter().copied().max().unwrap_or(0);
    let below = TEST_PORTS_FROM..ephemeral.start().saturating_sub(reach);
    let above = ephemeral.end().saturating_add(1)..u16::MAX.saturating_sub(reach);
    let ports = if below.len() >= above.len() {
        below
    } else {
        above
    };
    assert!(
        !ports.is_empty(),
        "no ports for tests (and {offsets:?} above them) outside the ephemeral range {ephemeral:?}"
    );
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..100 {
        let port = fastrand::u16(ports.clone());
        let all: Vec<u16> = std::iter::once(port)
            .chain(offsets.iter().map(|o| port + o))
            .collect();
        let free = all
            .iter()
            .all(|p| !handed_out.contains(p) && TcpListener::bind(("127.0.0.1", *p)).is_ok());
        if free {
            handed_out.extend(all);
            return port;
        }
    }
    panic!("no free port in {ports:?} (with {offsets:?} above it) after 100 tries");
}

/// The server program the tests start: `FAIRLOCK_TEST_REDIS_SERVER` when set (a path, e.g. the
/// Redis 6.2 or Valkey binary of the server matrix in scripts/test.sh), else `redis-server` from
/// the PATH. [`RedisServer`] and `faketime::FakeClockRedis` start it; Sentinel groups and
/// Clusters (`topology.rs`) always run `redis-server`.
pub fn server_binary() -> std::ffi::OsString {
    std::env::var_os("FAIRLOCK_TEST_REDIS_SERVER")
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "redis-server".into())
}

/// Whether the server behind `conn` knows the command `name` (`COMMAND INFO` answers nil for an
/// unknown one): tests ask the server what it has rather than compare versions.
pub fn has_command(conn: &mut redis::Connection, name: &str) -> bool {
    let info: Vec<redis::Value> = redis::cmd("COMMAND")
        .arg("INFO")
        .arg(name)
        .query(conn)
        .expect("COMMAND INFO");
    !matches!(info.first(), None | Some(redis::Value::Nil))
}

/// How long a server started (or started again) has to answer PING.
pub const LAUNCH_TIMEOUT: Duration = Duration::from_secs(30);

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
    /// or did not answer within [`LAUNCH_TIMEOUT`].
    fn launch(&mut self) -> bool {
        let mut cmd = Command::new(server_binary());
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
            .unwrap_or_else(|e| {
                panic!(
                    "start {:?}: {e} (scripts/test.sh installs redis-server)",
                    server_binary()
                )
            });
        let pid = child.id();
        self.child = Some(child);
        // generous: a restart with a large AOF answers LOADING until it is read, which took
        // over 10 s once on a loaded 2-core machine
        let deadline = Instant::now() + LAUNCH_TIMEOUT;
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
    /// A connection as a new user `user` that may run every command on `keys` only (an ACL
    /// like a deployment's that refuses the keys a script does not declare).
    pub fn conn_limited_to<K: std::fmt::Display>(
        &self,
        user: &str,
        keys: impl IntoIterator<Item = K>,
    ) -> redis::Connection {
        let mut acl = redis::cmd("ACL");
        acl.arg("SETUSER")
            .arg(user)
            .arg("on")
            .arg(">pw")
            .arg("+@all");
        for key in keys {
            acl.arg(format!("~{key}"));
        }
        let _: () = acl.query(&mut self.conn()).expect("ACL SETUSER");
        let url = format!("redis://{user}:pw@127.0.0.1:{}/", self.port);
        redis::Client::open(url)
            .and_then(|c| c.get_connection())
            .expect("a connection as the limited user")
    }

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

    /// Freeze the server (SIGSTOP): it keeps its connections open and accepts new ones, but
    /// answers nothing until [`RedisServer::thaw`] (a stalled or partitioned Redis). A frozen
    /// server is still killed on drop (SIGKILL works on a stopped process).
    pub fn freeze(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// Let a frozen server run again (SIGCONT).
    pub fn thaw(&self) {
        self.signal(libc::SIGCONT);
    }

    fn signal(&self, sig: libc::c_int) {
        let pid = self.child.as_ref().expect("the server runs").id();
        // SAFETY: kill(2) on our own child, not reaped yet (it is reaped only in `stop`)
        let sent = unsafe { libc::kill(pid as libc::pid_t, sig) } == 0;
        assert!(
            sent,
            "kill -{sig} {pid}: {}",
            std::io::Error::last_os_error()
        );
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

    /// How many connections named `name` (`CLIENT SETNAME`) the server has (`CLIENT LIST`).
    pub fn connections_named(&self, name: &str) -> usize {
        let list: String = redis::cmd("CLIENT")
            .arg("LIST")
            .query(&mut self.conn())
            .unwrap();
        let field = format!("name={name}");
        list.lines()
            .filter(|l| l.split(' ').any(|f| f == field))
            .count()
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
    /// intervals (the waiter timeout): a heartbeat already on its way when the waiter left tells
    /// it to "retry", or tells its grant again, with that TTL.
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
/// (janitor 200 ms, connect timeout 2 s, read timeout 5 s, the wait mode of [`wait_mode`])
/// changed by `configure`.
pub fn client_with_url(
    url: &str,
    configure: impl FnOnce(fairlock::LockClientBuilder) -> fairlock::LockClientBuilder,
) -> fairlock::LockClient {
    let builder = fairlock::LockClient::builder(url)
        .janitor_interval(Duration::from_millis(200))
        .connect_timeout(Duration::from_secs(2))
        .read_timeout(Duration::from_secs(5))
        .wait_mode(wait_mode());
    configure(builder).build().expect("connect to test redis")
}

/// The wait mode of the tests' clients: `FAIRLOCK_TEST_WAIT_MODE=per-thread` runs a suite's
/// behaviour in [`fairlock::WaitMode::PerThread`] (scripts/test.sh runs the core suites so
/// too); the default otherwise.
pub fn wait_mode() -> fairlock::WaitMode {
    match std::env::var("FAIRLOCK_TEST_WAIT_MODE").as_deref() {
        Err(_) | Ok("") | Ok("shared") => fairlock::WaitMode::Shared,
        Ok("per-thread") => fairlock::WaitMode::PerThread,
        Ok(other) => panic!("FAIRLOCK_TEST_WAIT_MODE={other:?}: use shared or per-thread"),
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

/// Microseconds since the Unix epoch on this machine's clock (for comparing moments between a
/// test and its child processes on the same machine; the library itself never uses it).
pub fn unix_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

/// The waiters of `lock` in queue order, by process id.
pub fn queue_pids(lock: &fairlock::FairLock) -> Vec<u32> {
    let status = lock.status().expect("status");
    status.waiters.iter().map(|w| w.origin.pid).collect()
}

/// The waiters of `lock` in queue order, by owner id.
pub fn queue_owners(lock: &fairlock::FairLock) -> Vec<String> {
    let status = lock.status().expect("status");
    status.waiters.into_iter().map(|w| w.origin.owner).collect()
}

/// A child process with a reader thread on its stdout (and one on its stderr when the command
/// pipes it) and its stdin kept open when the command pipes it. Killed and reaped when dropped.
pub struct Proc {
    /// Names the process in panic messages: a child test's role, or the program's file name.
    name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    /// Every stdout line taken from `lines` so far.
    seen: Vec<String>,
    stderr: Option<Receiver<String>>,
}

/// How a [`Proc`] ended: its exit code (`None` when a signal ended it) and its output.
pub struct Out {
    pub code: Option<i32>,
    /// Every line it printed on stdout, joined with `\n`.
    pub stdout: String,
    /// Its whole stderr, when the command piped it.
    pub stderr: String,
}

impl Proc {
    /// Start `cmd` with its stdout piped; stdin and stderr as `cmd` sets them.
    pub fn spawn(cmd: &mut Command) -> Proc {
        let name = Path::new(cmd.get_program())
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        let mut child = cmd
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {name}: {e}"));
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let stderr = child.stderr.take().map(|mut err| {
            let (tx, text) = mpsc::channel();
            std::thread::spawn(move || {
                let mut s = String::new();
                let _ = err.read_to_string(&mut s);
                let _ = tx.send(s);
            });
            text
        });
        Proc {
            name,
            stdin: child.stdin.take(),
            child,
            lines,
            seen: Vec::new(),
            stderr,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The rest of the next stdout line that starts with `prefix` (see [`after_prefix`]; other
    /// lines are skipped); `None` when none came within `timeout` or stdout closed.
    pub fn try_expect(&mut self, prefix: &str, timeout: Duration) -> Option<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self.lines.recv_timeout(left).ok()?;
            let rest = after_prefix(&line, prefix);
            self.seen.push(line);
            if rest.is_some() {
                return rest;
            }
        }
    }

    /// Like [`Proc::try_expect`] but panics, showing the lines seen, when the line does not come.
    pub fn expect(&mut self, prefix: &str, timeout: Duration) -> String {
        match self.try_expect(prefix, timeout) {
            Some(rest) => rest,
            None => panic!(
                "{:?} printed no line starting with {prefix:?} within {timeout:?}; it printed {:?}",
                self.name, self.seen
            ),
        }
    }

    /// Send one line to its stdin.
    pub fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("a piped stdin");
        writeln!(stdin, "{line}").expect("write to the child");
        stdin.flush().unwrap();
    }

    /// Close its stdin (a child that reads it sees the end).
    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// Send signal `sig` with kill(2), which must succeed. Only before the process was waited
    /// for: its pid may be another process's after that.
    pub fn signal(&self, sig: libc::c_int) {
        let pid = self.child.id();
        // SAFETY: kill(2) on our own child, not reaped yet
        let sent = unsafe { libc::kill(pid as libc::pid_t, sig) } == 0;
        assert!(
            sent,
            "kill -{sig} {pid}: {}",
            std::io::Error::last_os_error()
        );
    }

    /// SIGKILL it and reap it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Close its stdin and wait for it to exit; `None` when it did not within `timeout` (it is
    /// killed then).
    pub fn wait(&mut self, timeout: Duration) -> Option<ExitStatus> {
        self.close_stdin();
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                self.kill();
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// [`Proc::wait`], true when it exited successfully in time.
    pub fn exits_ok(&mut self, timeout: Duration) -> bool {
        self.wait(timeout).is_some_and(|s| s.success())
    }

    /// [`Proc::wait`] (a panic when it does not exit within `timeout`), then all its output.
    pub fn finish(mut self, timeout: Duration) -> Out {
        let Some(status) = self.wait(timeout) else {
            panic!("{:?} did not end within {timeout:?}", self.name);
        };
        // the pipes close when the last writer (the process or a child of its own) is gone
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.seen.push(line);
        }
        let stderr = self.stderr.as_ref().map_or_else(String::new, |text| {
            text.recv_timeout(Duration::from_secs(5))
                .unwrap_or_default()
        });
        Out {
            code: status.code(),
            stdout: self.seen.join("\n"),
            stderr,
        }
    }
}

impl Drop for Proc {
    /// A failed assertion must not leave a process behind.
    fn drop(&mut self) {
        self.kill();
    }
}

/// The rest of `line` after `prefix`, trimmed. The prefix may follow other text: the test harness
/// prints `test <name> ... ` without a newline before a child test's first line.
fn after_prefix(line: &str, prefix: &str) -> Option<String> {
    let line = line.trim_end();
    if let Some(rest) = line.strip_prefix(prefix) {
        return Some(rest.trim().to_string());
    }
    let at = line.find(&format!(" ... {prefix}"))?;
    Some(line[at + 5 + prefix.len()..].trim().to_string())
}

/// Re-run the calling test in child processes. It goes first in a `#[test]` fn: in a child
/// started for role `R` (`FAIRLOCK_CHILD=R`) it does the child's work and returns from the test;
/// otherwise it gives the [`ChildTest`] that starts such children. The children run the test by
/// the name of the fn the macro is in, so a test that is renamed still re-runs itself.
///
/// - `child_test!(work)`: `work(role)` for every role;
/// - `child_test!("role" => work)`: `work()` for that one role (another role panics).
#[allow(unused_macros)] // in the test binaries without children
macro_rules! child_test {
    ($role:literal => $work:expr) => {
        $crate::support::child_test!(|role: &str| {
            assert_eq!(role, $role, "no such child role");
            $work()
        })
    };
    ($work:expr) => {{
        fn here() {}
        if let Some(role) = $crate::support::child_role() {
            return ($work)(role.as_str());
        }
        $crate::support::ChildTest::of_fn(::std::any::type_name_of_val(&here))
    }};
}
#[allow(unused_imports)] // in the test binaries without children
pub(crate) use child_test;

/// Run `body` alone in a child process of this test binary, for a test that needs the process to
/// itself: one that installs the global logger or metrics recorder, or counts the process's
/// threads (every suite shares the `it` binary, and its other tests run beside). The parent waits
/// at most `limit` and fails with the child's output when the child fails.
#[allow(unused_macros)] // in the test binaries that need no process of their own
macro_rules! in_own_process {
    ($limit:expr, $body:expr) => {{
        let children = $crate::support::child_test!("alone" => $body);
        children.run_alone($limit);
    }};
}
#[allow(unused_imports)] // in the test binaries that need no process of their own
pub(crate) use in_own_process;

/// This test binary, to start again as children that run one test of it (see [`child_test!`]).
pub struct ChildTest {
    /// The test's path in the binary, as `--exact` takes it.
    name: String,
}

impl ChildTest {
    /// The test that declares the fn item whose type name is `fn_path`
    /// (`<crate>::<test path>::<fn>`).
    pub fn of_fn(fn_path: &str) -> ChildTest {
        let test_path = fn_path.rsplit_once("::").map(|(test, _fn)| test);
        let name = test_path
            .and_then(|p| p.split_once("::"))
            .map(|(_crate, name)| name);
        match name {
            Some(name) if !name.contains(['{', '<']) => ChildTest {
                name: name.to_string(),
            },
            _ => panic!("child_test! must be called in a #[test] fn itself, not in {fn_path}"),
        }
    }

    /// The command for a child that runs only this test, with `FAIRLOCK_CHILD=role` and `env`;
    /// stdin piped, stderr inherited.
    pub fn command(&self, role: &str, env: &[(&str, String)]) -> Command {
        // /proc/self/exe still runs this binary when a rebuild replaced the file meanwhile
        let exe = Path::new("/proc/self/exe");
        let exe = if exe.exists() {
            exe.to_path_buf()
        } else {
            std::env::current_exe().expect("current test binary")
        };
        let mut cmd = Command::new(exe);
        // --include-ignored: the test may be an ignored one that was asked for by name
        cmd.args(["--exact", &self.name, "--include-ignored"])
            .args(["--nocapture", "--test-threads=1"])
            .env("FAIRLOCK_CHILD", role)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stderr(Stdio::inherit());
        cmd
    }

    /// Run this test alone in a child (role "alone", see [`in_own_process!`]), and fail with its
    /// output unless it passes within `limit`.
    pub fn run_alone(&self, limit: Duration) {
        let out = self.spawn("alone", &[]).finish(limit);
        assert_eq!(
            out.code,
            Some(0),
            "the test failed in its own process:\n{}\n{}",
            out.stdout,
            out.stderr
        );
    }

    /// Start a child that runs only this test with `FAIRLOCK_CHILD=role` and `env`; named by its
    /// role in messages.
    pub fn spawn(&self, role: &str, env: &[(&str, String)]) -> Proc {
        let mut child = Proc::spawn(&mut self.command(role, env));
        child.name = role.to_string();
        child
    }
}

/// The role this process was started for, if it is a child (see [`child_test!`]).
pub fn child_role() -> Option<String> {
    std::env::var("FAIRLOCK_CHILD").ok()
}

/// In a child: print one `PREFIX rest` line for the parent (stdout is line-buffered).
pub fn say(prefix: &str, rest: impl std::fmt::Display) {
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

/// Whether `lock`'s queue holds exactly `n` waiters within `timeout` (polled through `status()`).
pub fn queued(lock: &fairlock::FairLock, n: usize, timeout: Duration) -> bool {
    eventually(timeout, || lock.status().unwrap().waiters.len() == n)
}

/// Start `n` waiter threads one after another, so that their queue order is known: thread `i`,
/// named `waiter-<i>`, runs what `waiter(i)` returns, and the next one starts once `lock`'s queue
/// holds `i + 1` waiters (which it must within `timeout`, else this panics).
pub fn spawn_queued<F, T>(
    lock: &fairlock::FairLock,
    n: usize,
    timeout: Duration,
    mut waiter: impl FnMut(usize) -> F,
) -> Vec<std::thread::JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    (0..n)
        .map(|i| {
            let thread = std::thread::Builder::new()
                .name(format!("waiter-{i}"))
                .spawn(waiter(i))
                .unwrap();
            assert!(
                queued(lock, i + 1, timeout),
                "waiter {i} did not queue within {timeout:?}"
            );
            thread
        })
        .collect()
}

/// The grants `(fencing token, waiter index)` that the waiter threads queued by
/// [`spawn_queued`] send on `grants`, in token order, once each came (within 30 s) and the threads
/// are joined. Checks that each waiter was served once, in queue order, after the hold with token
/// `after`.
pub fn assert_served_in_queue_order(
    threads: Vec<std::thread::JoinHandle<()>>,
    grants: &Receiver<(u64, usize)>,
    after: u64,
) -> Vec<(u64, usize)> {
    let waiters = threads.len();
    let mut got = vec![];
    for _ in 0..waiters {
        got.push(
            grants
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|_| {
                    panic!("only {} of {waiters} waiters served: {got:?}", got.len())
                }),
        );
    }
    for t in threads {
        t.join().expect("a waiter failed");
    }
    assert!(grants.try_recv().is_err(), "a waiter was served twice");
    got.sort();
    let order: Vec<usize> = got.iter().map(|&(_, i)| i).collect();
    assert_eq!(
        order,
        (0..waiters).collect::<Vec<_>>(),
        "not served in queue order: {got:?}"
    );
    assert!(got[0].0 > after, "{got:?} after {after}");
    assert!(got.windows(2).all(|w| w[0].0 < w[1].0), "{got:?}");
    got
}

/// What a call that met another program's data at `key` must leave: it went through or was
/// refused as `ForeignData`, and the data is as it was (`before`: its `DUMP`), still without a
/// TTL. `context` names the case in a failure.
pub fn assert_foreign_data_untouched(
    c: &mut redis::Connection,
    key: &str,
    before: &[u8],
    r: &Result<String, fairlock::Error>,
    context: &str,
) {
    assert!(
        matches!(r, Ok(_) | Err(fairlock::Error::ForeignData { .. })),
        "{context}"
    );
    let after: Vec<u8> = redis::cmd("DUMP").arg(key).query(c).unwrap_or_default();
    assert_eq!(before, after, "the foreign data changed: {context}");
    let ttl: i64 = redis::cmd("PTTL").arg(key).query(c).unwrap();
    assert_eq!(ttl, -1, "the foreign data got a TTL: {context}");
}

/// For each TCP socket of this process connected to 127.0.0.1:`port`, whether `TCP_NODELAY` is
/// set on it (read from the sockets under /proc/self/fd with getsockopt).
pub fn nodelay_of_connections_to(port: u16) -> Vec<bool> {
    let mut found = Vec::new();
    let Ok(fds) = std::fs::read_dir("/proc/self/fd") else {
        return found;
    };
    for entry in fds.flatten() {
        let Some(fd) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        // SAFETY: getpeername and getsockopt only write into the buffers given, of the sizes
        // given; a descriptor closed meanwhile or not a socket makes them fail, not misbehave.
        unsafe {
            let mut addr: libc::sockaddr_in = std::mem::zeroed();
            let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            let peer = libc::getpeername(fd, (&raw mut addr).cast(), &mut len);
            if peer != 0 || i32::from(addr.sin_family) != libc::AF_INET {
                continue;
            }
            if u16::from_be(addr.sin_port) != port {
                continue;
            }
            let mut on: libc::c_int = 0;
            let mut on_len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            let got = libc::getsockopt(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_NODELAY,
                (&raw mut on).cast(),
                &mut on_len,
            );
            if got == 0 {
                found.push(on != 0);
            }
        }
    }
    found
}

/// Run the `fairlock` command-line tool with `args` against `server` (`FAIRLOCK_REDIS_URL`),
/// stdin closed, and wait for it (`timeout` at most, then it is killed).
#[cfg(feature = "cli")]
pub fn fairlock_cli(server: &RedisServer, args: &[&str], timeout: Duration) -> Out {
    let mut c = Command::new(env!("CARGO_BIN_EXE_fairlock"));
    c.env("FAIRLOCK_REDIS_URL", server.url())
        .env("RUST_BACKTRACE", "1")
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::piped());
    Proc::spawn(&mut c).finish(timeout)
}

/// `INFO commandstats` of the server `c` is connected to, as (command, calls, usec), one per
/// command the server has run since its last `CONFIG RESETSTAT`.
pub fn commandstats(c: &mut redis::Connection) -> Vec<(String, u64, u64)> {
    let info: String = redis::cmd("INFO").arg("commandstats").query(c).unwrap();
    info.lines()
        .filter_map(|line| {
            let (name, fields) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let field = |key: &str| -> u64 {
                fields
                    .split(',')
                    .find_map(|f| f.strip_prefix(key))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0)
            };
            Some((name.to_string(), field("calls="), field("usec=")))
        })
        .collect()
}
