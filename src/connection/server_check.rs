//! Checks of the Redis server's configuration that the lock's guarantees depend on.
//!
//! Every guarantee of a lock rests on its keys staying in Redis until a script removes them or
//! their TTL ends. A server that evicts keys under memory pressure (any `maxmemory-policy` but
//! `noeviction`) can drop them at any moment: the lock hash (a second holder), the fence counter
//! (the next token is seeded from the server clock alone), or a queue entry (a waiter loses its
//! place). The `volatile-*` policies only evict keys with a TTL, and every key of a lock
//! has one. With `noeviction` Redis refuses writes when full instead, which the lock
//! reports as an error.

/// What `INFO memory` says about eviction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum EvictionCheck {
    /// `maxmemory_policy:noeviction`.
    Safe,
    /// No `maxmemory_policy` line: an old server, or a managed one that hides it. The caller
    /// should log [`UNKNOWN_POLICY_WARNING`] and go on.
    Unknown,
    /// Any other policy, as reported.
    Evicts(String),
}

/// The warning for [`EvictionCheck::Unknown`].
pub(crate) const UNKNOWN_POLICY_WARNING: &str = "Redis does not report its maxmemory-policy \
     (INFO memory has no maxmemory_policy line), so fairlock cannot check that the server never \
     evicts a lock's keys; make sure maxmemory-policy is noeviction";

/// The value of the `maxmemory_policy:` line of `INFO memory` (or of a full `INFO`), trimmed;
/// `None` if there is no such line or it is empty. Accepts `\r\n` (as Redis sends it) and `\n`.
pub(crate) fn eviction_policy(info_memory: &str) -> Option<String> {
    info_memory
        .lines()
        .find_map(|line| line.strip_prefix("maxmemory_policy:"))
        .map(str::trim)
        .filter(|policy| !policy.is_empty())
        .map(str::to_string)
}

/// Classifies the server's eviction policy from its `INFO memory` output.
pub(crate) fn eviction_check(info_memory: &str) -> EvictionCheck {
    match eviction_policy(info_memory) {
        None => EvictionCheck::Unknown,
        Some(policy) if policy.eq_ignore_ascii_case("noeviction") => EvictionCheck::Safe,
        Some(policy) => EvictionCheck::Evicts(policy),
    }
}

/// `Ok(Safe)` for `noeviction`, `Ok(Unknown)` when the server does not say (log
/// [`UNKNOWN_POLICY_WARNING`]), and `Err` with [`eviction_message`] for any evicting policy.
pub(crate) fn check_eviction_policy(info_memory: &str) -> Result<EvictionCheck, String> {
    match eviction_check(info_memory) {
        EvictionCheck::Evicts(policy) => Err(eviction_message(&policy)),
        other => Ok(other),
    }
}

/// What is wrong with an evicting `policy` and what to do about it.
pub(crate) fn eviction_message(policy: &str) -> String {
    format!(
        "Redis maxmemory-policy is {policy}: when memory runs short Redis may evict a lock's keys, \
         which can give a lock a second holder, reset its fencing counter (tokens then keep \
         increasing only as long as the server clock does) or drop a waiter's place in the \
         queue. Set `maxmemory-policy noeviction` (CONFIG SET maxmemory-policy noeviction, and \
         in redis.conf so it survives a restart; on ElastiCache in a custom parameter group, on \
         Memorystore and Azure Cache in the instance's maxmemory-policy setting): Redis then \
         refuses writes when full instead of dropping keys. If it cannot be changed and memory \
         is sized so that Redis never fills, danger_accept_eviction on the builder \
         (--danger-accept-eviction in the CLI) accepts the risk"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `redis-cli INFO memory` of a redis-server 7.0.15 started with `--save ''` (default
    /// configuration), line endings normalised to `\n`.
    const INFO_MEMORY_7_0: &str = "# Memory
used_memory:914632
used_memory_human:893.20K
used_memory_rss:12296192
used_memory_rss_human:11.73M
used_memory_peak:914632
used_memory_peak_human:893.20K
used_memory_peak_perc:102.32%
used_memory_overhead:876360
used_memory_startup:876160
used_memory_dataset:38272
used_memory_dataset_perc:99.48%
allocator_allocated:1690848
allocator_active:1826816
allocator_resident:4497408
total_system_memory:25276502016
total_system_memory_human:23.54G
used_memory_lua:32768
used_memory_vm_eval:32768
used_memory_lua_human:32.00K
used_memory_scripts_eval:0
number_of_cached_scripts:0
number_of_functions:0
number_of_libraries:0
used_memory_vm_functions:33792
used_memory_vm_total:66560
used_memory_vm_total_human:65.00K
used_memory_functions:200
used_memory_scripts:200
used_memory_scripts_human:200B
maxmemory:0
maxmemory_human:0B
maxmemory_policy:noeviction
allocator_frag_ratio:1.08
allocator_frag_bytes:135968
allocator_rss_ratio:2.46
allocator_rss_bytes:2670592
rss_overhead_ratio:2.73
rss_overhead_bytes:7798784
mem_fragmentation_ratio:14.03
mem_fragmentation_bytes:11419888
mem_not_counted_for_evict:0
mem_replication_backlog:0
mem_total_replication_buffers:0
mem_clients_slaves:0
mem_clients_normal:0
mem_cluster_links:0
mem_aof_buffer:0
mem_allocator:jemalloc-5.3.0
active_defrag_running:0
lazyfree_pending_objects:0
lazyfreed_objects:0
";

    /// The sample as Redis sends it over the wire (`\r\n`).
    fn crlf(text: &str) -> String {
        text.replace('\n', "\r\n")
    }

    /// The sample after `CONFIG SET maxmemory-policy <policy>` (the only line that changes).
    fn with_policy(policy: &str) -> String {
        INFO_MEMORY_7_0.replace(
            "maxmemory_policy:noeviction",
            &format!("maxmemory_policy:{policy}"),
        )
    }

    /// The sample without its `maxmemory*` lines, as from a server that does not report them.
    fn without_maxmemory_lines() -> String {
        INFO_MEMORY_7_0
            .lines()
            .filter(|l| !l.starts_with("maxmemory"))
            .map(|l| format!("{l}\r\n"))
            .collect()
    }

    #[test]
    fn the_default_server_is_noeviction_and_safe() {
        for text in [INFO_MEMORY_7_0.to_string(), crlf(INFO_MEMORY_7_0)] {
            assert_eq!(eviction_policy(&text).as_deref(), Some("noeviction"));
            assert_eq!(eviction_check(&text), EvictionCheck::Safe);
            assert_eq!(check_eviction_policy(&text), Ok(EvictionCheck::Safe));
        }
    }

    #[test]
    fn every_evicting_policy_is_an_error_that_says_what_to_do() {
        for policy in [
            "allkeys-lru",
            "allkeys-lfu",
            "allkeys-random",
            "volatile-lru",
            "volatile-lfu",
            "volatile-random",
            "volatile-ttl",
        ] {
            let text = crlf(&with_policy(policy));
            assert_eq!(eviction_policy(&text).as_deref(), Some(policy));
            assert_eq!(eviction_check(&text), EvictionCheck::Evicts(policy.into()));
            let e = check_eviction_policy(&text).unwrap_err();
            assert!(e.contains("maxmemory-policy"), "{e}");
            assert!(e.contains(policy), "{e}");
            assert!(e.contains("maxmemory-policy noeviction"), "{e}");
            assert!(e.contains("second holder"), "{e}");
            assert!(e.contains("fencing"), "{e}");
            assert!(e.contains("waiter"), "{e}");
            assert!(!e.contains('\r') && !e.contains('\n'), "one line: {e}");
        }
    }

    #[test]
    fn a_server_that_hides_the_policy_is_unknown_not_an_error() {
        let text = without_maxmemory_lines();
        assert!(text.contains("used_memory:914632\r\n"));
        assert_eq!(eviction_policy(&text), None);
        assert_eq!(eviction_check(&text), EvictionCheck::Unknown);
        assert_eq!(check_eviction_policy(&text), Ok(EvictionCheck::Unknown));
        assert!(UNKNOWN_POLICY_WARNING.contains("noeviction"));
        // nothing at all, or an empty value, is the same
        assert_eq!(check_eviction_policy(""), Ok(EvictionCheck::Unknown));
        let empty = with_policy("");
        assert_eq!(eviction_policy(&empty), None);
        assert_eq!(check_eviction_policy(&empty), Ok(EvictionCheck::Unknown));
    }

    #[test]
    fn a_full_info_reply_and_odd_spacing_or_case_are_read_too() {
        let full = crlf(&format!(
            "# Server\nredis_version:7.0.15\nredis_mode:standalone\n\n# Clients\n\
             connected_clients:1\n\n{INFO_MEMORY_7_0}\n# Persistence\nloading:0\n"
        ));
        assert_eq!(check_eviction_policy(&full), Ok(EvictionCheck::Safe));
        let spaced = with_policy(" allkeys-lru ");
        assert_eq!(eviction_policy(&spaced).as_deref(), Some("allkeys-lru"));
        assert_eq!(
            eviction_check(&with_policy("NoEviction")),
            EvictionCheck::Safe
        );
        // only a line that starts with the field counts
        let other = "# Memory\r\nx_maxmemory_policy:allkeys-lru\r\n";
        assert_eq!(eviction_check(other), EvictionCheck::Unknown);
    }
}
