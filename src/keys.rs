//! The key scheme: which Redis keys one lock uses, and which names are allowed.

use crate::error::{Error, Result};
use crate::limits::{MAX_NAME_LEN, MAX_PREFIX_LEN};

/// The Redis keys of one lock. All share the hash tag `{name}`, so one script may touch them
/// all, and on a Redis Cluster they live in one slot, on one shard.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct LockKeys {
    /// The lock hash: the hold (owner, count, token, lease, ...) or, once released, its
    /// tombstone. Also the base of the wake lists.
    pub lock: String,
    pub fence: String,
    pub queue: String,
    pub waiters: String,
}

impl LockKeys {
    pub fn new(prefix: &str, name: &str) -> LockKeys {
        let lock = format!("{prefix}:{{{name}}}");
        LockKeys {
            fence: format!("{lock}:fence"),
            queue: format!("{lock}:queue"),
            waiters: format!("{lock}:waiters"),
            lock,
        }
    }

    /// The wake list of this owner's client (owner ids are `<client id>:<thread>`): one per lock
    /// per client, shared by its waiting threads (built the same way in `state.lua`).
    pub fn wake(&self, owner: &str) -> String {
        let client = owner.rsplit_once(':').map_or(owner, |(client, _)| client);
        format!("{}:wake:{client}", self.lock)
    }

    /// The keys in the order every script expects them (KEYS[1..4]).
    pub fn all(&self) -> [&str; 4] {
        [&self.lock, &self.fence, &self.queue, &self.waiters]
    }
}

/// What a key found under the prefix is to its lock (see [`lock_key_of`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KeyRole {
    /// The lock hash: a hold, or a tombstone for the rest of a released lease.
    Lock,
    /// The queue: the lock has waiters.
    Queue,
    /// The fence, the waiters hash, the left marks, a wake list or the replica-ack marker: keys
    /// a lock keeps without being held or waited for (the fence lives for days).
    Other,
    /// A semaphore's (or read/write lock's) hash or queue: it may be held or waited for.
    Semaphore,
    /// Another key of a semaphore (`:sem:fence`, `:sem:leases`, a wake list...).
    SemaphoreOther,
}

/// The `SCAN ... MATCH` pattern of every key of every lock under `prefix`: `<prefix>:{*}*`, the
/// prefix's glob characters escaped.
pub(crate) fn scan_pattern(prefix: &str) -> String {
    let mut pattern = String::with_capacity(prefix.len() + 5);
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern.push_str(":{*}*");
    pattern
}

/// The lock name and the role of `key` when it is one of the keys [`LockKeys`] makes under
/// `prefix` (or a wake list, or the Cluster's replica-ack marker); `None` for any other key (the
/// name is not checked: see [`validate_name`]).
pub(crate) fn lock_key_of<'k>(prefix: &str, key: &'k [u8]) -> Option<(&'k [u8], KeyRole)> {
    let rest = key.strip_prefix(prefix.as_bytes())?.strip_prefix(b":{")?;
    // a name has no braces: the first '}' closes the hash tag
    let end = rest.iter().position(|&b| b == b'}')?;
    let (name, suffix) = (&rest[..end], &rest[end + 1..]);
    let role = match suffix {
        b"" => KeyRole::Lock,
        b":queue" => KeyRole::Queue,
        b":fence" | b":waiters" | b":left" | b":replicated" => KeyRole::Other,
        _ if suffix.starts_with(b":wake:") && suffix.len() > b":wake:".len() => KeyRole::Other,
        b":sem" | b":sem:queue" => KeyRole::Semaphore,
        b":sem:fence" | b":sem:waiters" | b":sem:left" | b":sem:leases" | b":sem:handoffs"
        | b":sem:replicated" => KeyRole::SemaphoreOther,
        _ if suffix.starts_with(b":sem:wake:") && suffix.len() > b":sem:wake:".len() => {
            KeyRole::SemaphoreOther
        }
        _ => return None,
    };
    Some((name, role))
}

/// Check a lock name: 1 to [`MAX_NAME_LEN`] bytes, no `{` or `}` (they would break the hash tag),
/// no control characters (they garble logs and the command-line tool's output).
///
/// # Errors
/// [`Error::InvalidName`] saying which rule the name breaks.
pub fn validate_name(name: &str) -> Result<()> {
    let reason = if name.is_empty() {
        Some("it is empty")
    } else if name.len() > MAX_NAME_LEN {
        Some("it is too long")
    } else if name.contains(['{', '}']) {
        Some("braces would break the key's hash tag")
    } else if name.chars().any(char::is_control) {
        Some("it contains a control character")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(Error::InvalidName {
            name: name.chars().take(80).collect(),
            reason,
        }),
        None => Ok(()),
    }
}

/// Check a key prefix: 1 to [`MAX_PREFIX_LEN`] bytes, no braces, whitespace or control characters.
pub(crate) fn validate_prefix(prefix: &str) -> Result<()> {
    let bad = prefix.is_empty()
        || prefix.len() > MAX_PREFIX_LEN
        || prefix.contains(['{', '}'])
        || prefix.chars().any(|c| c.is_control() || c.is_whitespace());
    if bad {
        return Err(Error::InvalidConfig {
            setting: "key_prefix",
            reason: format!(
                "{prefix:?} must be 1 to {MAX_PREFIX_LEN} bytes without braces, spaces or control characters"
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_one_hash_tag() {
        let k = LockKeys::new("fairlock", "orders:close");
        for key in k.all() {
            assert!(key.starts_with("fairlock:{orders:close}"), "{key}");
        }
        assert_eq!(k.wake("c:1"), "fairlock:{orders:close}:wake:c");
        assert_eq!(k.wake("c"), "fairlock:{orders:close}:wake:c");
    }

    #[test]
    fn every_key_a_lock_makes_is_recognised_with_its_name() {
        let k = LockKeys::new("fairlock", "orders:close*?");
        fn of(key: &str) -> Option<(&[u8], KeyRole)> {
            lock_key_of("fairlock", key.as_bytes())
        }
        let name: &[u8] = b"orders:close*?";
        assert_eq!(of(&k.lock), Some((name, KeyRole::Lock)));
        assert_eq!(of(&k.queue), Some((name, KeyRole::Queue)));
        for other in [&k.fence, &k.waiters, &k.wake("c:1")] {
            assert_eq!(of(other), Some((name, KeyRole::Other)), "{other}");
        }
        assert_eq!(
            of("fairlock:{orders:close*?}:left").unwrap().1,
            KeyRole::Other
        );
        assert_eq!(of("fairlock:{a}:replicated").unwrap().1, KeyRole::Other);
        assert_eq!(of("fairlock:{a}:sem").unwrap().1, KeyRole::Semaphore);
        assert_eq!(of("fairlock:{a}:sem:queue").unwrap().1, KeyRole::Semaphore);
        for other in ["fence", "waiters", "left", "leases", "handoffs", "wake:c1"] {
            let key = format!("fairlock:{{a}}:sem:{other}");
            assert_eq!(of(&key).unwrap().1, KeyRole::SemaphoreOther, "{key}");
        }
        assert_eq!(of("fairlock:{a}:sem:wake:"), None);
        assert_eq!(of("fairlock:{a}:semx"), None);
        // an empty name is found (and refused later by validate_name)
        assert_eq!(of("fairlock:{}"), Some((&b""[..], KeyRole::Lock)));
        for foreign in [
            "fairlock:{a}:other",
            "fairlock:{a}x",
            "fairlock:{a}:wake:",
            "fairlock:{a",
            "fairlock:a}",
            "fairlockx:{a}",
            "other:{a}",
            "fairlock:{a}:fence:x",
        ] {
            assert_eq!(of(foreign), None, "{foreign}");
        }
        assert_eq!(
            lock_key_of("p", b"p:{\xff\xfe}:queue"),
            Some((&b"\xff\xfe"[..], KeyRole::Queue))
        );
    }

    #[test]
    fn the_scan_pattern_escapes_the_prefix() {
        assert_eq!(scan_pattern("fairlock"), "fairlock:{*}*");
        assert_eq!(scan_pattern("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\:{*}*");
    }

    #[test]
    fn names_are_checked() {
        assert!(validate_name("orders:close-unpaid").is_ok());
        assert!(validate_name("ünïcode name").is_ok());
        for bad in ["", "a{b", "a}b", "a\nb", "a\0b"] {
            assert!(
                matches!(validate_name(bad), Err(Error::InvalidName { .. })),
                "{bad:?}"
            );
        }
        assert!(validate_name(&"x".repeat(MAX_NAME_LEN)).is_ok());
        assert!(validate_name(&"x".repeat(MAX_NAME_LEN + 1)).is_err());
    }
}
