//! Bad input, property-tested: lock names (any bytes, unicode, braces, newlines, very long) and
//! configuration values. Each is either accepted and round-trips through the key scheme, or is
//! rejected with the typed error (`Error::InvalidName`, `Error::InvalidConfig`); never a panic.
//! (Foreign data at a lock's keys and a server that is not Redis: tests/it/bad_input.rs.)

use crate::support;

use std::cell::Cell;
use std::time::Duration;

use crate::support::RedisServer;
use fairlock::Error;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

fn runner(cases: u32) -> TestRunner {
    TestRunner::new(Config {
        cases,
        // no proptest-regressions/ files in the source tree; a failure prints its input
        failure_persistence: None,
        ..Config::default()
    })
}

/// Names of every kind: raw bytes made into strings, any unicode, the characters the key
/// scheme cares about (braces, newlines, glob characters), and lengths around the 512-byte limit.
fn names() -> impl Strategy<Value = String> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..48)
            .prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
        proptest::collection::vec(any::<char>(), 0..24).prop_map(|v| v.into_iter().collect()),
        "[a-z{}:\n\r\t \\\\*?\\[\\]\"'|\\x00-]{0,16}",
        "\\PC{1,24}",
        (500usize..530).prop_map(|n| "n".repeat(n)),
        (165usize..180).prop_map(|n| "é€😀".chars().cycle().take(n).collect()),
        (0usize..2000).prop_map(|n| "{x}".repeat(n % 7) + &"y".repeat(n)),
    ]
}

/// The documented rule (`validate_name`): 1 to 512 bytes, no braces, no control characters.
fn name_is_valid(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 512
        && !name.contains(['{', '}'])
        && !name.chars().any(char::is_control)
}

/// The hash tag of a key: the bytes between its first `{` and the next `}`.
fn hash_tag(key: &[u8]) -> Option<&[u8]> {
    let open = key.iter().position(|&b| b == b'{')?;
    let close = open + 1 + key[open + 1..].iter().position(|&b| b == b'}')?;
    Some(&key[open + 1..close])
}

fn sorted_keys(server: &RedisServer) -> Vec<Vec<u8>> {
    let mut keys: Vec<Vec<u8>> = redis::cmd("KEYS")
        .arg("*")
        .query(&mut server.conn())
        .unwrap();
    keys.sort();
    keys
}

fn key(prefix: &str, name: &str, suffix: &str) -> Vec<u8> {
    format!("{prefix}:{{{name}}}{suffix}").into_bytes()
}

/// Lock and unlock `name` and check the keys it leaves at each step.
fn round_trip(
    server: &RedisServer,
    client: &fairlock::LockClient,
    prefix: &str,
    name: &str,
) -> Result<(), TestCaseError> {
    let _: () = redis::cmd("FLUSHALL").query(&mut server.conn()).unwrap();
    let lock = client
        .fair_lock(name)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(lock.name(), name);
    let guard = lock
        .lock()
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let status = lock
        .status()
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(&status.name, name);
    let holder = status.holder.expect("a holder while the guard lives");
    prop_assert_eq!(holder.fencing_token, guard.fencing_token());
    prop_assert_eq!(holder.origin.pid, std::process::id());
    let mut held = vec![key(prefix, name, ""), key(prefix, name, ":fence")];
    held.sort();
    prop_assert_eq!(&sorted_keys(server), &held);
    guard
        .unlock()
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    // the same keys: the lock hash stays as the tombstone of the released hold
    let keys = sorted_keys(server);
    prop_assert_eq!(&keys, &held);
    for k in &keys {
        prop_assert_eq!(
            hash_tag(k),
            Some(name.as_bytes()),
            "key {:?}",
            String::from_utf8_lossy(k)
        );
    }
    prop_assert!(!lock
        .is_locked()
        .map_err(|e| TestCaseError::fail(e.to_string()))?);
    Ok(())
}

#[test]
fn every_name_is_accepted_or_rejected_with_invalid_name() {
    let server = RedisServer::start();
    let client = support::client(&server);
    let (accepted, rejected) = (Cell::new(0), Cell::new(0));
    runner(512)
        .run(&names(), |name| {
            match client.fair_lock(&name) {
                Ok(lock) => {
                    prop_assert!(name_is_valid(&name), "accepted {name:?}");
                    prop_assert_eq!(lock.name(), name.as_str());
                    accepted.set(accepted.get() + 1);
                }
                Err(Error::InvalidName { .. }) => {
                    prop_assert!(!name_is_valid(&name), "rejected {name:?}");
                    rejected.set(rejected.get() + 1);
                }
                Err(e) => return Err(TestCaseError::fail(format!("{name:?}: {e}"))),
            }
            Ok(())
        })
        .unwrap();
    println!(
        "names: {} accepted, {} rejected",
        accepted.get(),
        rejected.get()
    );
    assert!(accepted.get() > 50 && rejected.get() > 50);
}

#[test]
fn accepted_names_round_trip_through_the_keys() {
    let server = RedisServer::start();
    let client = support::client(&server);
    let valid = names().prop_filter("accepted names", |n| name_is_valid(n));
    runner(64)
        .run(&valid, |name| {
            round_trip(&server, &client, "fairlock", &name)
        })
        .unwrap();
}

/// Durations around a valid range `lo..=hi`: inside it, at its edges, zero and huge.
fn duration_around(lo: Duration, hi: Duration) -> impl Strategy<Value = Duration> {
    let (lo, hi) = (lo.as_micros() as u64, hi.as_micros() as u64);
    prop_oneof![
        20 => (lo..=hi.min(lo.saturating_mul(40))).prop_map(Duration::from_micros),
        1 => (lo.saturating_sub(3)..=lo + 3).prop_map(Duration::from_micros),
        1 => (hi - 3..=hi + 3).prop_map(Duration::from_micros),
        1 => Just(Duration::ZERO),
        1 => any::<u64>().prop_map(Duration::from_micros),
        1 => Just(Duration::MAX),
    ]
}

fn prefixes() -> impl Strategy<Value = String> {
    prop_oneof![
        20 => "[a-z0-9:_.-]{1,24}",
        1 => "\\PC{0,12}",
        1 => "[a-z{} \t\n]{0,8}",
        1 => (125usize..132).prop_map(|n| "p".repeat(n)),
    ]
}

#[derive(Debug, Clone)]
struct Settings {
    lease: Duration,
    prefix: String,
    pool_size: u32,
    connect_timeout: Duration,
    read_timeout: Duration,
    janitor_interval: Duration,
}

fn settings() -> impl Strategy<Value = Settings> {
    let ms = Duration::from_millis;
    let secs = Duration::from_secs;
    (
        duration_around(ms(100), secs(7 * 24 * 3600)),
        prefixes(),
        prop_oneof![20 => 1u32..=64, 1 => Just(0u32), 1 => 1020u32..=1030, 1 => any::<u32>()],
        duration_around(ms(10), secs(3600)),
        duration_around(ms(10), secs(3600)),
        duration_around(ms(50), secs(60)),
    )
        .prop_map(
            |(lease, prefix, pool_size, connect_timeout, read_timeout, janitor_interval)| {
                Settings {
                    lease,
                    prefix,
                    pool_size,
                    connect_timeout,
                    read_timeout,
                    janitor_interval,
                }
            },
        )
}

/// The settings that break the documented ranges (src/limits.rs, `ranges`).
fn invalid_settings(s: &Settings) -> Vec<&'static str> {
    let ms = Duration::from_millis;
    let secs = Duration::from_secs;
    let mut bad = Vec::new();
    if s.lease < ms(100) || s.lease > secs(7 * 24 * 3600) {
        bad.push("lease");
    }
    let p = &s.prefix;
    if p.is_empty()
        || p.len() > 128
        || p.contains(['{', '}'])
        || p.chars().any(|c| c.is_control() || c.is_whitespace())
    {
        bad.push("key_prefix");
    }
    if s.pool_size == 0 || s.pool_size > 1024 {
        bad.push("pool_size");
    }
    if s.connect_timeout < ms(10) || s.connect_timeout > secs(3600) {
        bad.push("connect_timeout");
    }
    if s.read_timeout < ms(10) || s.read_timeout > secs(3600) {
        bad.push("read_timeout");
    }
    if s.janitor_interval < ms(50) || s.janitor_interval > secs(60) {
        bad.push("janitor_interval");
    }
    bad
}

#[test]
fn every_setting_is_accepted_or_rejected_with_invalid_config() {
    let server = RedisServer::start();
    let (accepted, rejected) = (Cell::new(0), Cell::new(0));
    runner(64)
        .run(&settings(), |s| {
            let bad = invalid_settings(&s);
            // Timeouts this short are valid but may really run out on a loaded machine.
            let tight = s.connect_timeout < Duration::from_secs(1)
                || s.read_timeout < Duration::from_secs(1);
            let built = fairlock::LockClient::builder(&server.url())
                .lease(s.lease)
                .key_prefix(&s.prefix)
                .pool_size(s.pool_size)
                .connect_timeout(s.connect_timeout)
                .read_timeout(s.read_timeout)
                .janitor_interval(s.janitor_interval)
                .build();
            match built {
                Ok(client) => {
                    prop_assert!(bad.is_empty(), "accepted although {bad:?} are out of range");
                    accepted.set(accepted.get() + 1);
                    prop_assert_eq!(client.config().lease, s.lease);
                    prop_assert_eq!(&client.config().key_prefix, &s.prefix);
                    match round_trip(&server, &client, &s.prefix, "cfg") {
                        Err(e) if tight => println!("tight timeouts, round trip failed: {e}"),
                        other => other?,
                    }
                }
                Err(Error::InvalidConfig { setting, reason }) => {
                    prop_assert!(
                        bad.contains(&setting),
                        "rejected {setting} ({reason}) but the out-of-range ones are {bad:?}"
                    );
                    rejected.set(rejected.get() + 1);
                }
                Err(e) if e.is_connection() && tight && bad.is_empty() => {}
                Err(e) => return Err(TestCaseError::fail(format!("{s:?}: {e}"))),
            }
            Ok(())
        })
        .unwrap();
    println!(
        "settings: {} accepted, {} rejected",
        accepted.get(),
        rejected.get()
    );
    assert!(accepted.get() > 5 && rejected.get() > 5);
}
