//! [`LockClient::list_locks`]: every lock under the key prefix, each with its status, for
//! operators (`fairlock list`).
//!
//! Two steps: `SCAN ... MATCH <prefix>:{*}* COUNT 1000` on every master (`Conn::scan_masters`
//! in the connection module) finds the names, then each lock's (and semaphore's) status is
//! read with the one-name status script, 100 per pipeline (one by one on a Cluster, whose
//! connection cannot pipeline calls of different slots).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::client::LockClient;
use crate::error::{Error, Result};
use crate::keys::{lock_key_of, scan_pattern, validate_name, KeyRole};
use crate::raw::{run_pipeline, RawLock, RawSemaphore, SemKind};
use crate::status::LockStatus;
use crate::status::SemaphoreStatus;

/// How many keys each `SCAN` call looks at on a node (its `COUNT`): a node with N keys, of any
/// program, takes about N / 1000 calls, each a few hundred microseconds of the server's time.
pub const LIST_SCAN_COUNT: u32 = 1000;

/// How many status reads go in one pipeline.
const STATUS_BATCH: usize = 100;

/// A hold looks held unusually long when it has lasted more than this many times the
/// [`LockListing::usual_hold`]...
pub const UNUSUALLY_LONG_FACTOR: u32 = 10;

/// ...and more than this.
pub const UNUSUALLY_LONG_FLOOR: Duration = Duration::from_secs(60);

/// What [`LockClient::list_locks`] lists.
///
/// ```
/// let all = fairlock::ListOptions::new().include_idle(true);
/// assert!(all.include_idle);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListOptions {
    /// Also list idle locks: names that are neither held nor waited for, but still have keys
    /// (the fence, which keeps the last fencing token for [`Config::fence_ttl`](crate::Config),
    /// 7 days by default; a tombstone for the rest of a released lease; left marks, wake
    /// lists). Off by default: only locks that are held or have waiters.
    pub include_idle: bool,
}

impl ListOptions {
    /// Held locks and locks with waiters only.
    pub fn new() -> ListOptions {
        ListOptions::default()
    }

    /// Also list idle locks (see [`ListOptions::include_idle`]).
    pub fn include_idle(mut self, include: bool) -> ListOptions {
        self.include_idle = include;
        self
    }
}

/// Every lock found under the key prefix, sorted by name, and what the listing cost.
#[derive(Debug)]
#[non_exhaustive]
pub struct LockListing {
    /// The locks, sorted by name (byte order): held or with waiters, and with
    /// [`ListOptions::include_idle`] idle ones too. Each is read in one atomic step; the listing
    /// as a whole is not a snapshot (a lock taken or released while it runs may or may not be
    /// in it).
    pub locks: Vec<LockStatus>,
    /// The semaphores and read/write locks, sorted by name: held or with waiters, and with
    /// [`ListOptions::include_idle`] idle ones too. A name may be both a lock and a semaphore.
    pub semaphores: Vec<SemaphoreStatus>,
    /// Names under the prefix that are not fairlock's locks: a name the library refuses (not
    /// UTF-8, a control character, too long: [`Error::InvalidName`]), or a lock key holding
    /// another program's data ([`Error::ForeignData`]). Sorted by name.
    pub skipped: Vec<SkippedName>,
    /// Keys that matched `<prefix>:{*}*` but are no lock's key (another program's data under
    /// the prefix). A key `SCAN` returned twice counts twice.
    pub foreign_keys: u64,
    /// The masters scanned: 1, or every master of a Cluster.
    pub masters: usize,
    /// The `SCAN` calls made, on all masters together.
    pub scan_calls: u64,
    /// The median time the listed holds have lasted (`None` when no listed lock is held): what
    /// [`LockListing::stale_signs`] compares each hold with.
    pub usual_hold: Option<Duration>,
}

/// A name under the prefix that the listing skipped, and why.
#[derive(Debug)]
#[non_exhaustive]
pub struct SkippedName {
    /// The name as found (not UTF-8: decoded lossily), at most 80 characters.
    pub name: String,
    /// Why: [`Error::InvalidName`] or [`Error::ForeignData`].
    pub error: Error,
}

/// Why a hold looks stale (see [`LockListing::stale_signs`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StaleSigns {
    /// Less than a third of the lease is left ([`Holder::is_lease_running_out`]): a renewed hold
    /// missed a renewal (its process is stalled or dead, or cannot reach Redis), or a fixed
    /// lease is in its last third.
    ///
    /// [`Holder::is_lease_running_out`]: crate::Holder::is_lease_running_out
    pub lease_running_out: bool,
    /// Held more than [`UNUSUALLY_LONG_FACTOR`] times the [`LockListing::usual_hold`] and more
    /// than [`UNUSUALLY_LONG_FLOOR`]: a job that hangs, or a guard that was leaked.
    pub held_unusually_long: bool,
}

impl StaleSigns {
    /// Whether any sign shows.
    pub fn any(&self) -> bool {
        self.lease_running_out || self.held_unusually_long
    }
}

impl LockListing {
    /// Why `lock`'s hold looks stale, if it does (no sign for a free lock).
    pub fn stale_signs(&self, lock: &LockStatus) -> StaleSigns {
        let Some(h) = &lock.holder else {
            return StaleSigns::default();
        };
        StaleSigns {
            lease_running_out: h.is_lease_running_out(),
            held_unusually_long: self.usual_hold.is_some_and(|usual| {
                h.held_for > UNUSUALLY_LONG_FLOOR
                    && h.held_for > usual.saturating_mul(UNUSUALLY_LONG_FACTOR)
            }),
        }
    }
}

/// What the scan found of one name: whether it is held or waited for (its lock hash or its
/// queue exists).
type Found = BTreeMap<Vec<u8>, bool>;

impl LockClient {
    /// Every lock under this client's key prefix, with its holder (who, for how long, the lease
    /// left) and its waiters, sorted by name; on a Cluster, from every master.
    ///
    /// **Cost.** `SCAN` with `MATCH <prefix>:{*}*` and `COUNT` [`LIST_SCAN_COUNT`] on each
    /// master, never `KEYS`: about (keys on the node) / 1000 calls per node, whatever they hold,
    /// each a short step of the server that other clients' commands interleave with. Then one
    /// status script per lock and per semaphore found (100 per round trip; one per round trip on
    /// a Cluster). On one
    /// node with 1 million other keys that is about 1,000 `SCAN` calls (`docs/cli.md` gives a
    /// measured figure).
    ///
    /// ```no_run
    /// let client = fairlock::LockClient::connect("redis://127.0.0.1:6379/")?;
    /// let listing = client.list_locks(fairlock::ListOptions::new())?;
    /// for lock in &listing.locks {
    ///     if let Some(h) = &lock.holder {
    ///         let stale = if listing.stale_signs(lock).any() { " (stale?)" } else { "" };
    ///         println!("{}: {} for {:?}{stale}", lock.name, h.origin.host, h.held_for);
    ///     }
    /// }
    /// # Ok::<(), fairlock::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Connection`] when a master cannot be reached, [`Error::PermissionDenied`] when
    /// the user may not `SCAN` (or, on a Cluster, `PING`) or run the status script. Names that are
    /// not locks (see [`LockListing::skipped`]) do not fail the listing.
    pub fn list_locks(&self, options: ListOptions) -> Result<LockListing> {
        const DURING: &str = "listing the locks";
        let inner = &self.inner;
        let prefix = inner.config.key_prefix.as_str();
        let pattern = scan_pattern(prefix);
        let (found, found_sems, foreign_keys, scanned) = inner.with_conn(DURING, |c| {
            let mut found = Found::new();
            let mut sems = Found::new();
            let mut foreign = 0_u64;
            let scanned = c
                .scan_masters(&pattern, LIST_SCAN_COUNT, |key| {
                    match lock_key_of(prefix, key) {
                        Some((name, role @ (KeyRole::Semaphore | KeyRole::SemaphoreOther))) => {
                            let active = role == KeyRole::Semaphore;
                            if active || options.include_idle {
                                *sems.entry(name.to_vec()).or_default() |= active;
                            }
                        }
                        Some((name, role)) => {
                            let active = role != KeyRole::Other;
                            if active || options.include_idle {
                                *found.entry(name.to_vec()).or_default() |= active;
                            }
                        }
                        None => foreign += 1,
                    }
                })
                .map_err(|e| Error::from_redis(DURING, e))?;
            Ok((found, sems, foreign, scanned))
        })?;

        let mut skipped = Vec::new();
        let mut raws = Vec::new();
        for name in found.into_keys() {
            match checked_name(name) {
                Ok(name) => match RawLock::new(prefix, &name, inner.protocol) {
                    Ok(raw) => raws.push((name, raw)),
                    Err(error) => skipped.push(SkippedName { name, error }),
                },
                Err(skip) => skipped.push(skip),
            }
        }

        let mut locks = Vec::new();
        for batch in raws.chunks(STATUS_BATCH) {
            let calls: Vec<_> = batch.iter().map(|(_, raw)| raw.status()).collect();
            let replies = inner.with_conn(DURING, |c| run_pipeline(c, &calls))?;
            for ((name, _), reply) in batch.iter().zip(replies) {
                match reply {
                    Ok(raw) => {
                        let status = LockStatus::from_raw(name, raw);
                        if options.include_idle
                            || status.holder.is_some()
                            || !status.waiters.is_empty()
                        {
                            locks.push(status);
                        }
                    }
                    Err(error @ Error::ForeignData { .. }) => skipped.push(SkippedName {
                        name: name.clone(),
                        error,
                    }),
                    Err(e) => return Err(e),
                }
            }
        }
        let semaphores = self.list_semaphores(found_sems, &options, &mut skipped)?;
        locks.sort_by(|a, b| a.name.cmp(&b.name));
        skipped.sort_by(|a, b| a.name.cmp(&b.name));
        let usual_hold = median(
            locks
                .iter()
                .filter_map(|l| Some(l.holder.as_ref()?.held_for)),
        );
        Ok(LockListing {
            locks,
            semaphores,
            skipped,
            foreign_keys,
            masters: scanned.masters,
            scan_calls: scanned.calls,
            usual_hold,
        })
    }
}

impl LockClient {
    /// The status of each semaphore name found; the idle ones only when asked for. Read as the
    /// locks' are: [`STATUS_BATCH`] to a pipeline (one by one on a Cluster).
    fn list_semaphores(
        &self,
        found: Found,
        options: &ListOptions,
        skipped: &mut Vec<SkippedName>,
    ) -> Result<Vec<SemaphoreStatus>> {
        const DURING: &str = "listing the semaphores";
        let inner = &self.inner;
        let prefix = inner.config.key_prefix.as_str();
        let mut raws = Vec::new();
        for name in found.into_keys() {
            match checked_name(name) {
                // (the kind and capacity do not matter to a status read)
                Ok(name) => {
                    match RawSemaphore::new(prefix, &name, SemKind::Semaphore, 1, inner.protocol) {
                        Ok(raw) => raws.push((name, raw)),
                        Err(error) => skipped.push(SkippedName { name, error }),
                    }
                }
                Err(skip) => skipped.push(skip),
            }
        }
        let mut out = Vec::new();
        for batch in raws.chunks(STATUS_BATCH) {
            let calls: Vec<_> = batch.iter().map(|(_, raw)| raw.status()).collect();
            let replies = inner.with_conn(DURING, |c| run_pipeline(c, &calls))?;
            for ((name, _), reply) in batch.iter().zip(replies) {
                match reply {
                    Ok(raw) => {
                        let st = SemaphoreStatus::from_raw(name, raw);
                        if options.include_idle || !st.holders.is_empty() || !st.waiters.is_empty()
                        {
                            out.push(st);
                        }
                    }
                    Err(error @ Error::ForeignData { .. }) => skipped.push(SkippedName {
                        name: name.clone(),
                        error,
                    }),
                    Err(e) => return Err(e),
                }
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }
}

/// A name found in Redis, as a lock name: UTF-8 and valid, or why it is skipped.
fn checked_name(name: Vec<u8>) -> std::result::Result<String, SkippedName> {
    let short = |text: &str| text.chars().take(80).collect::<String>();
    match String::from_utf8(name) {
        Ok(name) => match validate_name(&name) {
            Ok(()) => Ok(name),
            Err(error) => Err(SkippedName {
                name: short(&name),
                error,
            }),
        },
        Err(e) => {
            let name = short(&String::from_utf8_lossy(e.as_bytes()));
            Err(SkippedName {
                error: Error::InvalidName {
                    name: name.clone(),
                    reason: "it is not UTF-8",
                },
                name,
            })
        }
    }
}

/// The median of `durations` (the lower of the two middle ones for an even count).
fn median(durations: impl Iterator<Item = Duration>) -> Option<Duration> {
    let mut all: Vec<Duration> = durations.collect();
    if all.is_empty() {
        return None;
    }
    all.sort_unstable();
    Some(all[(all.len() - 1) / 2])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raw::RawStatus;

    fn held(name: &str, held_for_ms: i64, pttl_ms: i64) -> LockStatus {
        LockStatus::from_raw(
            name,
            RawStatus {
                server_ms: 1_000_000,
                owner: "c:1".into(),
                count: 1,
                token: 7,
                pttl_ms,
                since_ms: 1_000_000 - held_for_ms,
                meta: "h|1|t".into(),
                fence: 7,
                lease_ms: 30_000,
                queue: vec![],
            },
        )
    }

    fn listing(locks: Vec<LockStatus>) -> LockListing {
        let usual_hold = median(
            locks
                .iter()
                .filter_map(|l| Some(l.holder.as_ref()?.held_for)),
        );
        LockListing {
            locks,
            semaphores: vec![],
            skipped: vec![],
            foreign_keys: 0,
            masters: 1,
            scan_calls: 1,
            usual_hold,
        }
    }

    #[test]
    fn the_median_is_the_lower_middle() {
        let ms = Duration::from_millis;
        assert_eq!(median([].into_iter()), None);
        assert_eq!(median([ms(5)].into_iter()), Some(ms(5)));
        assert_eq!(median([ms(9), ms(1), ms(5)].into_iter()), Some(ms(5)));
        assert_eq!(
            median([ms(9), ms(1), ms(5), ms(7)].into_iter()),
            Some(ms(5))
        );
    }

    #[test]
    fn a_hold_far_longer_than_the_others_or_short_of_lease_looks_stale() {
        let l = listing(vec![
            held("a", 10_000, 25_000),
            held("b", 12_000, 25_000),
            held("c", 11_000, 25_000),
            // 10x the median (11 s) and over a minute
            held("hung", 111_000, 25_000),
            // under a third of its 30 s lease left
            held("missed", 5_000, 9_000),
        ]);
        assert_eq!(l.usual_hold, Some(Duration::from_secs(11)));
        let signs: Vec<(&str, bool, bool)> = l
            .locks
            .iter()
            .map(|s| {
                let st = l.stale_signs(s);
                (
                    s.name.as_str(),
                    st.lease_running_out,
                    st.held_unusually_long,
                )
            })
            .collect();
        assert_eq!(
            signs,
            [
                ("a", false, false),
                ("b", false, false),
                ("c", false, false),
                ("hung", false, true),
                ("missed", true, false),
            ]
        );
        // a long hold among short ones, but under a minute, is not flagged
        let l = listing(vec![held("a", 100, 30_000), held("b", 50_000, 30_000)]);
        assert!(!l.stale_signs(&l.locks[1]).any());
    }

    #[test]
    fn names_found_in_redis_are_checked() {
        assert_eq!(checked_name(b"job".to_vec()).unwrap(), "job");
        let bad = checked_name(b"a\nb".to_vec()).unwrap_err();
        assert!(matches!(bad.error, Error::InvalidName { .. }), "{bad:?}");
        let bad = checked_name(vec![b'x', 0xff]).unwrap_err();
        assert_eq!(bad.name, "x\u{fffd}");
        assert!(bad.error.to_string().contains("UTF-8"), "{}", bad.error);
        let long = checked_name(vec![b'x'; 600]).unwrap_err();
        assert_eq!(long.name.len(), 80);
    }
}
