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
