//! [`Config`]: every setting of a client, its default and its range, checked in one place.

use std::fmt;
use std::ops::RangeInclusive;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::keys;
use crate::limits::{defaults, ranges, DEFAULT_LEASE, MAX_LEASE, MIN_LEASE};

/// How a client's waiting threads wait for their wake-ups (docs/design.md, "Connections").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WaitMode {
    /// The waiting threads take turns on one blocking connection (per lock on a Redis Cluster):
    /// waiting costs one connection however many threads wait. The default.
    #[default]
    Shared,
    /// Each waiting thread blocks on a connection of its own (kept for 10 s after its last
    /// wait): one connection per waiting thread, and no hand-over of the lead between the
    /// threads of a process (see docs/design.md, "Connections").
    PerThread,
}

/// The settings of a [`LockClient`](crate::LockClient): set one by one on a [`LockClientBuilder`](crate::LockClientBuilder), or all at once
/// with [`LockClientBuilder::config`](crate::LockClientBuilder::config); read with [`LockClient::config`](crate::LockClient::config).
#[derive(Clone, Debug)]
pub struct Config {
    /// Lease of a hold; renewed by the watchdog every third of it. Default 30 s.
    pub lease: Duration,
    /// Prefix of every key. Default `fairlock`.
    pub key_prefix: String,
    /// Connections for commands. Waiting threads use none of them: one more connection, the
    /// waker's, blocks for all of them. Default 8.
    pub pool_size: u32,
    /// How long to wait for a TCP connection (and for a free pooled one). Default 2 s.
    pub connect_timeout: Duration,
    /// How long to wait for a reply to a command. Default 5 s.
    pub read_timeout: Duration,
    /// How often the janitor refreshes this client's waiters and repairs locks. Default 1 s.
    /// A waiter not refreshed for 3 intervals counts as dead and is removed.
    pub janitor_interval: Duration,
    /// How often the client checks again, while it runs, that the server never evicts keys
    /// (`maxmemory-policy`), and logs an error when that changed. Default 1 minute.
    pub server_check_interval: Duration,
    /// How long a lock's fence (its last fencing token) is kept after its last grant. Default
    /// 7 days. Tokens keep rising after it expires (they are seeded from the server clock); it
    /// bounds what idle lock names cost Redis.
    pub fence_ttl: Duration,
    /// Through a Sentinel group or on a Cluster: how long a call keeps trying while there is no
    /// master to reach (a failover or a slot migration under way) before it fails with
    /// [`Error::Connection`]. Default 60 s; unused with one node, where such a call fails at
    /// once.
    pub failover_timeout: Duration,
    /// How many replicas must acknowledge a grant (`WAIT`) before it becomes a guard; 0 (the
    /// default) for none. A grant acknowledged by fewer within `replica_ack_timeout` is given up
    /// (passed to the next waiter) and the call fails with [`Error::NotReplicated`], so no guard
    /// ever rests on a grant that a failover could lose. Costs a round trip and the replicas'
    /// lag per grant.
    pub replica_acks: u32,
    /// How long to wait for `replica_acks` acknowledgements. Default 1 s; less than
    /// `read_timeout`.
    pub replica_ack_timeout: Duration,
    /// How waiting threads wait: on one shared connection (the default) or each on its own.
    pub wait_mode: WaitMode,
    /// Accept a server whose `maxmemory-policy` may evict keys, which `build()` refuses
    /// otherwise (see [`LockClientBuilder::danger_accept_eviction`](crate::LockClientBuilder::danger_accept_eviction)).
    /// Default false.
    pub danger_accept_eviction: bool,
    /// With the feature `metrics`: label the per-lock metrics with the lock name (one series
    /// per name: only for a bounded set of names). Default false.
    pub metrics_lock_label: bool,
    /// Find and break deadlocks among the waits of clients that have it on: a thread that has
    /// waited this long checks whether its wait closes a cycle, and again every this long while
    /// it waits (see
    /// [`LockClientBuilder::deadlock_detection`](crate::LockClientBuilder::deadlock_detection)).
    /// `None` (the default): off, no check and no index. 100 ms to 1 h.
    pub deadlock_detection: Option<Duration>,
}

impl Config {
    /// How long a waiter entry lives without a heartbeat before others treat it as dead.
    pub fn waiter_timeout(&self) -> Duration {
        self.janitor_interval * 3
    }
}

impl Default for Config {
    fn default() -> Config {
        Config {
            lease: DEFAULT_LEASE,
            key_prefix: defaults::KEY_PREFIX.into(),
            pool_size: defaults::POOL_SIZE,
            connect_timeout: defaults::CONNECT_TIMEOUT,
            read_timeout: defaults::READ_TIMEOUT,
            janitor_interval: defaults::JANITOR_INTERVAL,
            server_check_interval: defaults::SERVER_CHECK_INTERVAL,
            fence_ttl: defaults::FENCE_TTL,
            failover_timeout: defaults::FAILOVER_TIMEOUT,
            replica_acks: 0,
            replica_ack_timeout: defaults::REPLICA_ACK_TIMEOUT,
            wait_mode: WaitMode::Shared,
            danger_accept_eviction: false,
            metrics_lock_label: false,
            deadlock_detection: None,
        }
    }
}

impl Config {
    /// Check every setting against its range (see `limits::ranges`), as
    /// [`LockClientBuilder::build`](crate::LockClientBuilder::build) does first.
    pub(crate) fn validate(&self) -> Result<()> {
        validate_lease("lease", self.lease)?;
        keys::validate_prefix(&self.key_prefix)?;
        in_range("pool_size", self.pool_size, ranges::POOL_SIZE, "")?;
        for (setting, value) in [
            ("connect_timeout", self.connect_timeout),
            ("read_timeout", self.read_timeout),
        ] {
            in_range(setting, value, ranges::TIMEOUT, "")?;
        }
        in_range(
            "janitor_interval",
            self.janitor_interval,
            ranges::JANITOR_INTERVAL,
            "",
        )?;
        in_range(
            "server_check_interval",
            self.server_check_interval,
            ranges::SERVER_CHECK_INTERVAL,
            "",
        )?;
        in_range("fence_ttl", self.fence_ttl, ranges::FENCE_TTL, "")?;
        if let Some(after) = self.deadlock_detection {
            in_range("deadlock_detection", after, ranges::DEADLOCK_DETECTION, "")?;
        }
        in_range(
            "failover_timeout",
            self.failover_timeout,
            ranges::FAILOVER_TIMEOUT,
            "",
        )?;
        if self.replica_acks > 0 {
            // the WAIT must end before the read of its reply gives up
            let below_read = *ranges::REPLICA_ACK_TIMEOUT.start()..=self.read_timeout;
            if self.replica_ack_timeout >= self.read_timeout {
                return Err(out_of_range(
                    "replica_ack_timeout",
                    self.replica_ack_timeout,
                    &below_read,
                    " (less than the read timeout)",
                ));
            }
            in_range(
                "replica_ack_timeout",
                self.replica_ack_timeout,
                below_read,
                " (less than the read timeout)",
            )?;
        }
        Ok(())
    }
}

/// A lease (of the client, or of one handle) within `MIN_LEASE ..= MAX_LEASE`.
pub(crate) fn validate_lease(setting: &'static str, lease: Duration) -> Result<()> {
    in_range(setting, lease, MIN_LEASE..=MAX_LEASE, "")
}

fn in_range<T: PartialOrd + fmt::Debug>(
    setting: &'static str,
    value: T,
    range: RangeInclusive<T>,
    note: &str,
) -> Result<()> {
    if range.contains(&value) {
        Ok(())
    } else {
        Err(out_of_range(setting, value, &range, note))
    }
}

fn out_of_range<T: fmt::Debug>(
    setting: &'static str,
    value: T,
    range: &RangeInclusive<T>,
    note: &str,
) -> Error {
    Error::InvalidConfig {
        setting,
        reason: format!(
            "{value:?} is not between {:?} and {:?}{note}",
            range.start(),
            range.end()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setting_of(c: Config) -> Option<&'static str> {
        match c.validate() {
            Ok(()) => None,
            Err(Error::InvalidConfig { setting, .. }) => Some(setting),
            Err(e) => panic!("{e:?}"),
        }
    }

    #[test]
    fn the_defaults_are_valid() {
        assert_eq!(setting_of(Config::default()), None);
    }

    #[test]
    fn each_setting_is_refused_just_outside_its_range_and_taken_at_its_ends() {
        let ms = Duration::from_millis;
        type Case = (&'static str, fn(&mut Config, Duration), Duration, Duration);
        let cases: [Case; 8] = [
            ("lease", |c, d| c.lease = d, MIN_LEASE, MAX_LEASE),
            (
                "connect_timeout",
                |c, d| c.connect_timeout = d,
                ms(10),
                Duration::from_secs(3600),
            ),
            (
                "read_timeout",
                |c, d| c.read_timeout = d,
                ms(10),
                Duration::from_secs(3600),
            ),
            (
                "janitor_interval",
                |c, d| c.janitor_interval = d,
                ms(50),
                Duration::from_secs(60),
            ),
            (
                "server_check_interval",
                |c, d| c.server_check_interval = d,
                Duration::from_secs(1),
                Duration::from_secs(24 * 3600),
            ),
            (
                "fence_ttl",
                |c, d| c.fence_ttl = d,
                Duration::from_secs(60),
                Duration::from_secs(365 * 24 * 3600),
            ),
            (
                "failover_timeout",
                |c, d| c.failover_timeout = d,
                Duration::ZERO,
                Duration::from_secs(3600),
            ),
            (
                "deadlock_detection",
                |c, d| c.deadlock_detection = Some(d),
                ms(100),
                Duration::from_secs(3600),
            ),
        ];
        for (name, set, low, high) in cases {
            for (value, refused) in [(low, false), (high, false), (high + ms(1), true)] {
                let mut c = Config::default();
                set(&mut c, value);
                assert_eq!(setting_of(c), refused.then_some(name), "{name} = {value:?}");
            }
            if low > Duration::ZERO {
                let mut c = Config::default();
                set(&mut c, low - Duration::from_nanos(1));
                assert_eq!(setting_of(c), Some(name), "{name} just below {low:?}");
            }
        }
    }

    #[test]
    fn pool_size_prefix_and_replica_acks_are_checked() {
        for (size, ok) in [(0, false), (1, true), (1024, true), (1025, false)] {
            let c = Config {
                pool_size: size,
                ..Config::default()
            };
            assert_eq!(setting_of(c).is_none(), ok, "pool_size {size}");
        }
        let c = Config {
            key_prefix: "a{b".into(),
            ..Config::default()
        };
        assert!(c.validate().is_err());
        // the timeout matters only when acknowledgements are asked for
        let slow = Config {
            replica_ack_timeout: Duration::from_secs(9),
            ..Config::default()
        };
        assert_eq!(setting_of(slow.clone()), None);
        let slow = Config {
            replica_acks: 1,
            ..slow
        };
        assert_eq!(setting_of(slow), Some("replica_ack_timeout"));
        let zero = Config {
            replica_acks: 1,
            replica_ack_timeout: Duration::ZERO,
            ..Config::default()
        };
        assert_eq!(setting_of(zero), Some("replica_ack_timeout"));
    }
}
