//! Exit codes (sysexits(3) where one fits) and the one-line failure every command ends with.

use std::io::Write;

/// `deadlocks`: a deadlock was found (and confirmed).
pub const DEADLOCK: u8 = 3;
/// Bad arguments: unknown flag, bad duration, bad lock name, bad URL, out-of-range lease.
pub const USAGE: u8 = 64;
/// A key of the lock holds data of another type (another program uses the name).
pub const DATAERR: u8 = 65;
/// Redis unreachable, not Redis, or too old.
pub const UNAVAILABLE: u8 = 69;
/// The credentials were refused, or the Redis user lacks a permission fairlock needs.
pub const NOPERM: u8 = 77;
/// An unexpected error (a bug, or a Redis error fairlock does not know).
pub const SOFTWARE: u8 = 70;
/// The lock is busy (`--no-wait`) or `--wait` ran out. `--busy-exit-code` changes it.
pub const TEMPFAIL: u8 = 75;
/// The server's configuration is unsafe for locks (an evicting `maxmemory-policy`).
pub const CONFIG: u8 = 78;
/// The lock was lost while the command ran (or while `hold` held it).
pub const LOST: u8 = 79;
/// The command was found but could not be executed.
pub const CANNOT_EXECUTE: u8 = 126;
/// The command was not found.
pub const NOT_FOUND: u8 = 127;

/// Why a command ends unsuccessfully: an exit code and one line for stderr (empty: say nothing).
#[derive(Debug)]
pub struct Failure {
    pub code: u8,
    pub message: String,
}

impl Failure {
    pub fn new(code: u8, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
        }
    }

    pub fn usage(message: impl Into<String>) -> Failure {
        Failure::new(USAGE, message)
    }
}

impl From<fairlock::Error> for Failure {
    fn from(e: fairlock::Error) -> Failure {
        use fairlock::Error as E;
        let code = match &e {
            E::InvalidName { .. }
            | E::InvalidConfig { .. }
            | E::InvalidUrl { .. }
            | E::CapacityMismatch { .. } => USAGE,
            E::Connection { .. }
            | E::NotRedis { .. }
            | E::UnsupportedServer { .. }
            | E::Tls { .. } => UNAVAILABLE,
            E::ForeignData { .. } => DATAERR,
            E::PermissionDenied { .. } => NOPERM,
            E::UnsafeServer { .. } => CONFIG,
            _ => SOFTWARE,
        };
        let message = match &e {
            // the library's advice names its API; the tool's user gives --permits
            E::CapacityMismatch {
                name,
                stored_kind,
                stored,
                asked_kind,
                asked,
            } if stored_kind == asked_kind => format!(
                "{stored_kind} {name:?} is in use with capacity {stored}, not {asked}: nothing was changed; give --permits {stored}"
            ),
            _ => e.to_string(),
        };
        Failure::new(code, message)
    }
}

/// Print `fairlock: <message>` as one line on stderr. Write errors (a closed stderr) are ignored:
/// nothing useful can be done about them, and `eprintln!` would panic.
pub fn say(message: &str) {
    let line = one_line(message);
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "fairlock: {line}");
}

/// Collapse newlines and runs of spaces so a message is one line.
pub fn one_line(message: &str) -> String {
    message.split_whitespace().collect::<Vec<_>>().join(" ")
}
