//! Histories: one text file per process, one event per line, flushed line by line (a SIGKILL
//! loses at most the event being written). Times come from `CLOCK_MONOTONIC`, which all
//! processes on one machine share, so the checker can merge the files into one timeline.
//!
//! Line format: `<t ns> <pid> <thread> <KIND> <args...>`. Worker kinds:
//! - `REQ lock [permits]`: about to call `lock()` (or, in the `sem` and `rw` workloads, to take
//!   `permits`: 1-2 of a semaphore, 1 for a read, 2^30 for a write; 1 when absent)
//! - `ACQ lock token lease_left_us`: `lock()` returned a guard (its `lease_remaining()` then, in µs;
//!   `-` for a read/write guard, which does not tell)
//! - `CS lock before after`: the counter read-modify-write (`after` is `?` when the SET failed)
//! - `FENCE lock token ok seq epoch` | `FENCE lock token stale max` | `FENCE lock token unknown`
//! - `UNLOCK lock`: about to call `unlock()` (the critical section is over)
//! - `REL lock ok|notheld|err lost done msg`: stamped *before* `unlock()` is called; `notheld`
//!   when the release found the lock no longer this hold's, `err` for any other failure; `done`
//!   is the time `unlock()` returned
//! - `ERR lock phase msg`, `LOG msg` (the library's warnings)
//!
//! Parent kinds: `FAULT id kind start target detail...`, `FAULT id kind end detail...` (kind is a
//! [`FaultKind`], target a pid or `-`, details `key=value` words), `PHASE name`, `SPAWN idx pid`.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;

/// Nanoseconds on `CLOCK_MONOTONIC`, the clock every process on this machine shares.
pub use crate::support::mono_clock::mono_ns as now_ns;

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

/// The kinds of fault the harness injects; the names are what the history says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultKind {
    /// SIGKILL of a worker that holds a lock (or of any worker when none does).
    SigkillHolder,
    /// SIGKILL of a worker that waits in a queue (or of any worker).
    SigkillWaiter,
    /// SIGSTOP for 1.5-2.5 s of a worker holding a lock (a GC pause inside the critical section).
    Sigstop,
    /// A stop of a few ms of a worker that let go meanwhile (the harness then tries another).
    SigstopProbe,
    /// `kill -9` of redis-server with `appendonly yes` + `appendfsync always`, and a start.
    RestartAof,
    /// `kill -9` of redis-server without persistence (all keys lost), and a start.
    RestartVolatile,
    /// The proxy cuts every connection.
    Drop,
    /// The proxy forwards nothing for 2-3 s (then delivers what it held).
    Blackhole,
    /// The proxy delays every chunk by 20 ms for 2-3.5 s.
    Latency,
    /// The proxy holds one request of a worker until the worker times out and abandons the
    /// connection, then delivers it to Redis 0.5-3 s later.
    LateDelivery,
    /// An operator force-unlocks a named hold; the first reply is lost (the library retries)
    /// and the operator retries once more.
    ForceUnlock,
    /// redis-server's wall clock steps (libfaketime): back by up to 5 s, or forward by less
    /// than a quarter of the lease.
    ClockStep,
    /// Sentinel and Cluster modes: SIGKILL of a master; a replica is promoted (asynchronous
    /// replication: it may lack the master's last writes), then the killed node is started
    /// again and rejoins as a replica. The fault lasts from the kill to the rejoin.
    KillMaster,
    /// Sentinel and Cluster modes: a graceful failover (`SENTINEL FAILOVER`, or `CLUSTER
    /// FAILOVER` sent to a replica), until the old master is a linked replica again.
    Failover,
    /// A waiting worker is stopped and continued three times, 50-150 ms each (Ctrl-Z and `fg`,
    /// a debugger, a cgroup freeze): its blocked reads fail with EINTR. It must keep its place.
    WaiterHiccup,
    /// Sentinel mode: one sentinel stopped (SIGSTOP) for 3-6 s: it accepts connections and
    /// answers nothing. Nobody may lose a hold or a place for it.
    StopSentinel,
    /// Cluster mode: the slot of a lock migrates to another master under load (MIGRATING and
    /// IMPORTING, MIGRATE of its keys, SETSLOT NODE). Nobody may lose a hold or a place for it.
    MigrateSlot,
}

impl FaultKind {
    pub const ALL: [FaultKind; 17] = [
        FaultKind::SigkillHolder,
        FaultKind::SigkillWaiter,
        FaultKind::Sigstop,
        FaultKind::SigstopProbe,
        FaultKind::RestartAof,
        FaultKind::RestartVolatile,
        FaultKind::Drop,
        FaultKind::Blackhole,
        FaultKind::Latency,
        FaultKind::LateDelivery,
        FaultKind::ForceUnlock,
        FaultKind::ClockStep,
        FaultKind::KillMaster,
        FaultKind::Failover,
        FaultKind::WaiterHiccup,
        FaultKind::StopSentinel,
        FaultKind::MigrateSlot,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::SigkillHolder => "sigkill-holder",
            FaultKind::SigkillWaiter => "sigkill-waiter",
            FaultKind::Sigstop => "sigstop",
            FaultKind::SigstopProbe => "sigstop-probe",
            FaultKind::RestartAof => "restart-aof",
            FaultKind::RestartVolatile => "restart-volatile",
            FaultKind::Drop => "drop",
            FaultKind::Blackhole => "blackhole",
            FaultKind::Latency => "latency",
            FaultKind::LateDelivery => "late-delivery",
            FaultKind::ForceUnlock => "force-unlock",
            FaultKind::ClockStep => "clock-step",
            FaultKind::KillMaster => "kill-master",
            FaultKind::Failover => "failover",
            FaultKind::WaiterHiccup => "waiter-hiccup",
            FaultKind::StopSentinel => "stop-sentinel",
            FaultKind::MigrateSlot => "migrate-slot",
        }
    }

    pub fn parse(name: &str) -> Option<FaultKind> {
        FaultKind::ALL.into_iter().find(|k| k.name() == name)
    }

    pub fn is_kill(self) -> bool {
        matches!(self, FaultKind::SigkillHolder | FaultKind::SigkillWaiter)
    }

    pub fn is_stop(self) -> bool {
        matches!(self, FaultKind::Sigstop | FaultKind::SigstopProbe)
    }

    pub fn is_restart(self) -> bool {
        matches!(self, FaultKind::RestartAof | FaultKind::RestartVolatile)
    }

    /// A change of master (Sentinel and Cluster modes): killed or graceful.
    pub fn is_failover(self) -> bool {
        matches!(self, FaultKind::KillMaster | FaultKind::Failover)
    }

    /// The network faults that hold back or cut *every* connection's traffic. Faults the protocol
    /// must absorb without any effect on its guarantees: they explain nothing, no overtake, no lost
    /// hold, no slow recovery.
    pub fn is_benign(self) -> bool {
        matches!(
            self,
            FaultKind::WaiterHiccup | FaultKind::StopSentinel | FaultKind::MigrateSlot
        )
    }

    pub fn is_proxy(self) -> bool {
        matches!(
            self,
            FaultKind::Drop | FaultKind::Blackhole | FaultKind::Latency
        )
    }
}

impl std::fmt::Display for FaultKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
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
        /// Permits asked (1 for a mutex).
        permits: u64,
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
    Unlock {
        lock: String,
    },
    Rel {
        lock: String,
        ok: bool,
        /// The release found the lock no longer this hold's.
        not_held: bool,
        /// `is_lost()` before the release.
        lost: bool,
        /// When `unlock()` returned.
        done: Option<u64>,
    },
    Err {
        lock: String,
        phase: String,
    },
    Log,
    FaultStart {
        id: u64,
        kind: FaultKind,
        target: Option<u32>,
        /// The `key=value` words after the target.
        detail: String,
    },
    FaultEnd {
        id: u64,
        detail: String,
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

/// The value of `key=value` in a fault's detail words.
pub fn detail_value<'a>(detail: &'a str, key: &str) -> Option<&'a str> {
    detail
        .split(' ')
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
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
        "REQ" => Kind::Req {
            lock: arg()?,
            permits: arg().and_then(|p| p.parse().ok()).unwrap_or(1),
        },
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
        "UNLOCK" => Kind::Unlock { lock: arg()? },
        "REL" => {
            let lock = arg()?;
            let outcome = arg()?;
            Kind::Rel {
                lock,
                ok: outcome == "ok",
                not_held: outcome == "notheld",
                lost: arg()? == "1",
                done: arg().and_then(|d| d.parse().ok()),
            }
        }
        "ERR" => Kind::Err {
            lock: arg()?,
            phase: arg()?,
        },
        "LOG" => Kind::Log,
        "FAULT" => {
            let id = arg()?.parse().ok()?;
            let kind = FaultKind::parse(&arg()?)?;
            match arg()?.as_str() {
                "start" => {
                    let target = arg().and_then(|p| p.parse().ok());
                    Kind::FaultStart {
                        id,
                        kind,
                        target,
                        detail: f.collect::<Vec<_>>().join(" "),
                    }
                }
                _ => Kind::FaultEnd {
                    id,
                    detail: f.collect::<Vec<_>>().join(" "),
                },
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
