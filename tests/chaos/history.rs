//! Histories: one text file per process, one event per line, flushed line by line (a SIGKILL
//! loses at most the event being written). Times come from `CLOCK_MONOTONIC`, which all
//! processes on one machine share, so the checker can merge the files into one timeline.
//!
//! Line format: `<t ns> <pid> <thread> <KIND> <args...>`. Worker kinds:
//! - `REQ lock`: about to call `lock()`
//! - `ACQ lock token lease_left_us`: `lock()` returned a guard (its `expires_in()` then, in µs)
//! - `CS lock before after`: the counter read-modify-write (`after` is `?` when the SET failed)
//! - `FENCE lock token ok seq epoch` | `FENCE lock token stale max` | `FENCE lock token unknown`
//! - `REL lock ok|err lost msg`: stamped *before* `unlock()` is called
//! - `ERR lock phase msg`, `LOG msg` (the library's warnings)
//!
//! Parent kinds: `FAULT id kind start target detail`, `FAULT id kind end`, `PHASE name`,
//! `SPAWN idx pid`.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;

/// Nanoseconds on `CLOCK_MONOTONIC`, the clock every process on this machine shares.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The history file of one process.
pub struct History {
    file: Mutex<File>,
    pid: u32,
}

impl History {
    pub fn create(path: &Path) -> History {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap_or_else(|e| panic!("cannot open history {}: {e}", path.display()));
        History {
            file: Mutex::new(file),
            pid: std::process::id(),
        }
    }

    pub fn log(&self, thread: &str, rest: &str) {
        self.log_at(now_ns(), thread, rest);
    }

    /// One line, written with one `write` call on an O_APPEND file.
    pub fn log_at(&self, t: u64, thread: &str, rest: &str) {
        let line = format!("{t} {} {thread} {}\n", self.pid, one_line(rest));
        let mut f = self.file.lock().unwrap_or_else(|p| p.into_inner());
        let _ = f.write_all(line.as_bytes());
    }
}

/// Messages go on one line.
pub fn one_line(s: &str) -> String {
    s.replace(['\n', '\r'], " ")
}

#[derive(Clone, Debug, PartialEq)]
pub enum Fence {
    Ok { seq: u64, epoch: String },
    Stale,
    Unknown,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Kind {
    Req {
        lock: String,
    },
    Acq {
        lock: String,
        token: u64,
        /// The guard's own estimate of its lease left when `lock()` returned.
        lease_left_us: Option<u64>,
    },
    Cs {
        lock: String,
        before: u64,
        after: Option<u64>,
    },
    Fence {
        lock: String,
        token: u64,
        outcome: Fence,
    },
    Rel {
        lock: String,
        ok: bool,
        lost: bool,
    },
    Err {
        lock: String,
        phase: String,
    },
    Log,
    FaultStart {
        id: u64,
        kind: String,
        target: Option<u32>,
    },
    FaultEnd {
        id: u64,
    },
    Phase {
        name: String,
    },
    Spawn {
        pid: u32,
    },
}

#[derive(Clone, Debug)]
pub struct Event {
    pub t: u64,
    pub pid: u32,
    pub thread: String,
    pub kind: Kind,
    /// The raw line, for violation reports.
    pub line: String,
}

/// Parse one line; `None` for a torn or unknown line.
pub fn parse(line: &str) -> Option<Event> {
    let mut f = line.split(' ');
    let t: u64 = f.next()?.parse().ok()?;
    let pid: u32 = f.next()?.parse().ok()?;
    let thread = f.next()?.to_string();
    let word = f.next()?;
    let mut arg = || f.next().map(str::to_string);
    let kind = match word {
        "REQ" => Kind::Req { lock: arg()? },
        "ACQ" => Kind::Acq {
            lock: arg()?,
            token: arg()?.parse().ok()?,
            lease_left_us: arg().and_then(|v| v.parse().ok()),
        },
        "CS" => Kind::Cs {
            lock: arg()?,
            before: arg()?.parse().ok()?,
            after: arg()?.parse().ok(),
        },
        "FENCE" => {
            let lock = arg()?;
            let token = arg()?.parse().ok()?;
            let outcome = match arg()?.as_str() {
                "ok" => Fence::Ok {
                    seq: arg()?.parse().ok()?,
                    epoch: arg()?,
                },
                "stale" => Fence::Stale,
                _ => Fence::Unknown,
            };
            Kind::Fence {
                lock,
                token,
                outcome,
            }
        }
        "REL" => Kind::Rel {
            lock: arg()?,
            ok: arg()? == "ok",
            lost: arg()? == "1",
        },
        "ERR" => Kind::Err {
            lock: arg()?,
            phase: arg()?,
        },
        "LOG" => Kind::Log,
        "FAULT" => {
            let id = arg()?.parse().ok()?;
            let kind = arg()?;
            match arg()?.as_str() {
                "start" => Kind::FaultStart {
                    id,
                    kind,
                    target: arg().and_then(|p| p.parse().ok()),
                },
                _ => Kind::FaultEnd { id },
            }
        }
        "PHASE" => Kind::Phase { name: arg()? },
        "SPAWN" => {
            let _idx = arg()?;
            Kind::Spawn {
                pid: arg()?.parse().ok()?,
            }
        }
        _ => return None,
    };
    Some(Event {
        t,
        pid,
        thread,
        kind,
        line: line.to_string(),
    })
}

/// Read every `*.log` history in `dir`; each file's events stay in file order (the order the
/// process wrote them). Returns the events and the number of lines that did not parse.
pub fn read_dir(dir: &Path) -> (Vec<Vec<Event>>, usize) {
    let mut files = Vec::new();
    let mut torn = 0;
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .expect("history dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    paths.sort();
    for path in paths {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let mut events = Vec::new();
        for line in text.lines() {
            match parse(line) {
                Some(e) => events.push(e),
                None => torn += 1,
            }
        }
        files.push(events);
    }
    (files, torn)
}
