//! The limits and defaults fairlock checks its inputs against, declared once for the library and
//! the command-line tool. Imports nothing of fairlock's: every layer may use it.

use std::time::Duration;

/// The longest lock name accepted, in bytes.
pub const MAX_NAME_LEN: usize = 512;

/// The longest key prefix accepted, in bytes.
pub const MAX_PREFIX_LEN: usize = 128;

/// The lease of a hold when none is set: renewed by the watchdog every third of it.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// The shortest lease accepted: renewals run every third of it, and Redis timers tick every 100 ms.
pub const MIN_LEASE: Duration = Duration::from_millis(100);

/// The longest lease accepted (a lease is a safety net, not a schedule).
pub const MAX_LEASE: Duration = Duration::from_secs(7 * 24 * 3600);
