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

/// The other settings' defaults (see [`Config`](crate::Config), which documents each).
pub(crate) mod defaults {
    use std::time::Duration;

    pub const KEY_PREFIX: &str = "fairlock";
    pub const POOL_SIZE: u32 = 8;
    pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
    pub const READ_TIMEOUT: Duration = Duration::from_secs(5);
    pub const JANITOR_INTERVAL: Duration = Duration::from_secs(1);
    pub const SERVER_CHECK_INTERVAL: Duration = Duration::from_secs(60);
    pub const FENCE_TTL: Duration = Duration::from_secs(7 * 24 * 3600);
    pub const FAILOVER_TIMEOUT: Duration = Duration::from_secs(60);
    pub const REPLICA_ACK_TIMEOUT: Duration = Duration::from_secs(1);
}

/// The range each setting must be in (inclusive), checked by `Config::validate`.
pub(crate) mod ranges {
    use std::ops::RangeInclusive;
    use std::time::Duration;

    pub const POOL_SIZE: RangeInclusive<u32> = 1..=1024;
    /// the connect and the read timeout
    pub const TIMEOUT: RangeInclusive<Duration> =
        Duration::from_millis(10)..=Duration::from_secs(3600);
    /// a waiter not refreshed for three intervals counts as dead
    pub const JANITOR_INTERVAL: RangeInclusive<Duration> =
        Duration::from_millis(50)..=Duration::from_secs(60);
    pub const SERVER_CHECK_INTERVAL: RangeInclusive<Duration> =
        Duration::from_secs(1)..=Duration::from_secs(24 * 3600);
    pub const FENCE_TTL: RangeInclusive<Duration> =
        Duration::from_secs(60)..=Duration::from_secs(365 * 24 * 3600);
    pub const FAILOVER_TIMEOUT: RangeInclusive<Duration> =
        Duration::ZERO..=Duration::from_secs(3600);
    /// how long a wait lasts before it checks for a deadlock, and then how often it checks
    /// again: each check costs round trips, and a wait shorter than it costs none
    pub const DEADLOCK_DETECTION: RangeInclusive<Duration> =
        Duration::from_millis(100)..=Duration::from_secs(3600);
    /// and less than the read timeout
    pub const REPLICA_ACK_TIMEOUT: RangeInclusive<Duration> =
        Duration::from_millis(1)..=Duration::from_secs(3600);
}
