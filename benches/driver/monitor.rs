//! Following `MONITOR`: a thread that reads its lines in the order Redis ran the commands, and
//! what is read from them (the owner flag of acquire calls for the FIFO audit, one lock's
//! traffic for the per-script counts).

use std::io::Write;
use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::bench::connect;
use crate::locks::mono_ns;

/// A thread that follows `MONITOR` and keeps what `keep` makes of each line, in the order Redis
/// ran the commands.
pub struct Monitor<T> {
    pub url: String,
    /// the argument of the ECHO that ends the watch
    pub marker: String,
    pub stop: Arc<AtomicBool>,
    pub thread: std::thread::JoinHandle<Vec<T>>,
}

impl<T: Send + 'static> Monitor<T> {
    /// Start following; returns once Redis has confirmed MONITOR (or after 5 s).
    pub fn start(
        url: &str,
        mut keep: impl FnMut(&str) -> Option<T> + Send + 'static,
    ) -> Monitor<T> {
        let addr = url
            .trim_start_matches("redis://")
            .trim_end_matches('/')
            .to_string();
        let marker = format!("bench-monitor-end-{}-{}", std::process::id(), mono_ns());
        let stop = Arc::new(AtomicBool::new(false));
        let ready = Arc::new(AtomicBool::new(false));
        let (ready2, stop2, marker2) = (ready.clone(), stop.clone(), marker.clone());
        let thread = std::thread::spawn(move || {
            let mut stream = TcpStream::connect(&addr).expect("connect for MONITOR");
            stream
                .set_read_timeout(Some(Duration::from_millis(200)))
                .expect("read timeout");
            stream.write_all(b"MONITOR\r\n").expect("MONITOR");
            let mut r = BufReader::with_capacity(1 << 20, stream);
            let mut out = vec![];
            let mut line = vec![];
            loop {
                match r.read_until(b'\n', &mut line) {
                    Ok(0) => break,
                    Ok(_) => {
                        let text = String::from_utf8_lossy(&line);
                        if text.starts_with("+OK") {
                            ready2.store(true, Ordering::SeqCst);
                        } else if text.contains(&marker2) {
                            break;
                        } else if let Some(v) = keep(&text) {
                            out.push(v);
                        }
                        line.clear();
                    }
                    // a timeout may leave part of a line in `line`; the next read completes it.
                    // Stopped and nothing more for 200 ms: the marker got lost, end anyway.
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) =>
                    {
                        if stop2.load(Ordering::SeqCst) {
                            break;
                        }
                    }
                    Err(_) => break,
                }
            }
            out
        });
        let t = Instant::now();
        while !ready.load(Ordering::SeqCst) && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(1));
        }
        Monitor {
            url: url.to_string(),
            marker,
            stop,
            thread,
        }
    }

    /// What was kept of every command Redis ran until now: sends the marker and reads up to it.
    pub fn finish(self) -> Vec<T> {
        let mut conn = connect(&self.url);
        let _: redis::RedisResult<String> = redis::cmd("ECHO").arg(&self.marker).query(&mut conn);
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().expect("monitor thread")
    }
}

/// The arguments of a MONITOR line (`<time> [<db> <client>] "CMD" "arg" ...`), at most `max`.
/// Escapes (`\"`, `\\`, `\xHH`) keep the character after the backslash only: enough for the
/// names, keys and flags read here.
fn monitor_tokens(text: &str, max: usize) -> Vec<String> {
    let mut tokens: Vec<String> = vec![];
    let mut cur: Option<String> = None;
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match (&mut cur, c) {
            (None, '"') => cur = Some(String::new()),
            (Some(t), '\\') => t.extend(chars.next()),
            (Some(t), '"') => {
                tokens.push(std::mem::take(t));
                cur = None;
            }
            (Some(t), c) => t.push(c),
            (None, _) => {}
        }
        if tokens.len() >= max {
            break;
        }
    }
    tokens
}

/// Whether a MONITOR line is a command that a script ran (source `[<db> lua]`).
fn from_script(text: &str) -> bool {
    text.split_once('[')
        .and_then(|(_, rest)| rest.split_once(']'))
        .is_some_and(|(source, _)| source.ends_with(" lua"))
}

/// The script of `fairlock::raw` that a client command names: `FCALL` by its function name,
/// `EVALSHA` by its SHA1.
fn script_name(cmd: &str, name: &str) -> Option<&'static str> {
    fairlock::raw::scripts()
        .into_iter()
        .find(|s| match cmd {
            "FCALL" => s.function() == name,
            "EVALSHA" => s.sha().eq_ignore_ascii_case(name),
            _ => false,
        })
        .map(|s| s.name())
}

/// Whether a client command runs a script (whose commands MONITOR shows after it).
fn runs_script(cmd: &str) -> bool {
    cmd.starts_with("EVAL") || cmd.starts_with("FCALL")
}

/// Follow `MONITOR` and collect the owner flag of every acquire script call on lock `name`, in
/// the order Redis ran them: the exact arrival order FIFO is defined by.
pub fn watch_acquires(url: &str, name: &str) -> Monitor<String> {
    let tag = format!("{{{name}}}");
    Monitor::start(url, move |line| acquire_flag(line, &tag))
}

/// Follow `MONITOR` and collect the id of every acquire call of the fair floor (`fair-floor`,
/// `fair-floor-eval`, see `benches/locks`) on lock `name`, in the order Redis ran them.
pub fn watch_floor_acquires(url: &str, name: &str) -> Monitor<String> {
    let tag = format!("{{{name}}}");
    let sha = redis::Script::new(crate::locks::FLOOR_ACQUIRE)
        .get_hash()
        .to_string();
    Monitor::start(url, move |line| {
        // FCALL fairfloor_acquire 2 owner queue id, or EVALSHA <sha> 2 owner queue id
        let t = monitor_tokens(line, 6);
        let acquire = t.len() == 6
            && match t[0].to_ascii_uppercase().as_str() {
                "FCALL" => t[1] == "fairfloor_acquire",
                "EVALSHA" => t[1] == sha,
                _ => false,
            };
        (acquire && t[3].contains(&tag)).then(|| t[5].clone())
    })
}

/// Follow `MONITOR` and collect the client address of every BLPOP on the token of the list lock
/// `name` (`fair-floor-list`), in the order Redis ran them.
pub fn watch_list_acquires(url: &str, name: &str) -> Monitor<String> {
    let token = crate::locks::floor_list_keys(name).0;
    Monitor::start(url, move |line| {
        // <time> [<db> <addr>] "BLPOP" "token" "5.000"
        let t = monitor_tokens(line, 2);
        let ours = t.len() == 2 && t[0].eq_ignore_ascii_case("BLPOP") && t[1] == token;
        let addr = line
            .split_once('[')
            .and_then(|(_, rest)| rest.split_once(']'))
            .and_then(|(source, _)| source.split_once(' '))
            .map(|(_, addr)| addr.to_string());
        addr.filter(|_| ours)
    })
}

/// The owner flag of an acquire call in a MONITOR line (see `raw::RawLock::acquire`):
/// `FCALL function numkeys key... fence-ttl waiter-ttl owner attempt lease mode meta` (or
/// `EVALSHA sha ...`), the keys
/// first (the first one names the lock), then the two arguments every script takes, then the
/// script's own.
fn acquire_flag(line: &str, tag: &str) -> Option<String> {
    let head = monitor_tokens(line, 3);
    if head.len() < 3 || script_name(&head[0].to_ascii_uppercase(), &head[1]) != Some("acquire") {
        return None;
    }
    let numkeys: usize = head[2].parse().ok()?;
    let (owner, mode) = (3 + numkeys + 2, 3 + numkeys + 5);
    let tokens = monitor_tokens(line, mode + 1);
    let is_acquire = numkeys > 0
        && tokens.len() > mode
        && tokens[3].contains(tag)
        && (tokens[mode] == "wait" || tokens[mode] == "try");
    is_acquire.then(|| tokens[owner].clone())
}

/// A command of one lock's traffic, as MONITOR showed it.
pub enum Seen {
    /// a command a client sent: "FCALL <script>", "BLPOP", ...
    Client(String),
    /// a command the script of the last `Client` line ran
    Inner(String),
}

/// Keeps the MONITOR lines of lock `name`'s traffic: client commands on its keys, and the
/// commands run by its scripts (the lines after their FCALL or EVALSHA: a script runs
/// atomically).
/// Everything else (other connections, MONITOR's own, PING, INFO) is left out.
pub fn lock_traffic(name: &str) -> impl FnMut(&str) -> Option<Seen> + Send + 'static {
    let tag = format!("{{{name}}}");
    let mut in_our_script = false;
    move |line| {
        let tokens = monitor_tokens(line, usize::MAX);
        let cmd = tokens.first()?.to_ascii_uppercase();
        if from_script(line) {
            return in_our_script.then_some(Seen::Inner(cmd));
        }
        let ours = tokens[1..].iter().any(|t| t.contains(&tag));
        in_our_script = ours && runs_script(&cmd);
        if !ours {
            return None;
        }
        Some(Seen::Client(match tokens.get(1) {
            Some(name) if runs_script(&cmd) => match script_name(&cmd, name) {
                Some(script) => format!("{cmd} {script}"),
                None => format!("{cmd} {}…", &name[..name.len().min(8)]),
            },
            _ => cmd,
        }))
    }
}
