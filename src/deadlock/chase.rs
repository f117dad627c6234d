//! Edge chasing, for a thread of a client with
//! [`deadlock_detection`](crate::LockClientBuilder::deadlock_detection) on: from the lock it
//! waits for, to that lock's holders, to what each of them waits for, and so on, without a scan
//! (`docs/design.md`, "Deadlock detection").
//!
//! **The index.** What a holder waits for is not stored with its hold, so every client with
//! detection on publishes its long waits: one hash per client (`<prefix>:waits:{<client>}`, its
//! own hash tag: one node per look-up on a Cluster), field the owner, value the
//! [`IndexedWait`], written when the wait passes `after` and at each check after it (with a TTL
//! of [`index_ttl`]), deleted when it ends. It is only a hint: each hop is confirmed by the
//! status of the lock it names (the owner must be queued there), and a wait whose owner's entry
//! names another lock is not believed at all.
//!
//! **The check** ([`check`]): the first reading follows the hops breadth first, at most
//! [`MAX_RESOURCES`] status reads and [`MAX_INDEX_READS`] index look-ups; the pure `analyse`
//! finds the cycles among what was read; only when this thread is the youngest wait of one
//! (the one to refuse), the locks the proof rests on are read again and the graph is built
//! again from what stood through both readings (as `deadlocks_in` does). At most
//! `MAX_RESOURCES + MAX_INDEX_READS + MAX_RESOURCES` round trips.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use crate::client::ClientInner;
use crate::cycle::Deadlock;
use crate::deadlock::graph::analyse;
use crate::deadlock::report::deadlock;
use crate::deadlock::snapshot::{Primitive, Resource, ResourceKey};
use crate::error::{Error, Result};
use crate::kind::HoldKind;
use crate::raw::{RawLock, RawSemaphore, SemKind};
use crate::status::{LockStatus, SemaphoreStatus};

/// The most locks (status reads) the first reading of a check follows.
pub(crate) const MAX_RESOURCES: usize = 16;
/// The most index look-ups (one per holder followed) of a check.
pub(crate) const MAX_INDEX_READS: usize = 32;

/// What a waiting thread waits for, as its client's index entry says it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct IndexedWait {
    pub kind: HoldKind,
    pub attempt: u64,
    pub permits: u64,
    pub name: String,
}

impl IndexedWait {
    /// `<kind>|<attempt>|<permits>|<name>` (the name last: it may hold `|`).
    pub fn encode(&self) -> String {
        let kind = match self.kind {
            HoldKind::Lock => "lock",
            HoldKind::Semaphore => "semaphore",
            HoldKind::Read => "read",
            HoldKind::Write => "write",
        };
        format!("{kind}|{}|{}|{}", self.attempt, self.permits, self.name)
    }

    /// An entry as [`encode`](Self::encode) writes it; `None` for anything else (an entry of
    /// another version, or not ours): it is only a hint, and a hint not understood is none.
    pub fn parse(value: &str) -> Option<IndexedWait> {
        let mut parts = value.splitn(4, '|');
        let kind = match parts.next()? {
            "lock" => HoldKind::Lock,
            "semaphore" => HoldKind::Semaphore,
            "read" => HoldKind::Read,
            "write" => HoldKind::Write,
            _ => return None,
        };
        let attempt = parts.next()?.parse().ok()?;
        let permits = parts.next()?.parse().ok()?;
        let name = parts.next().filter(|n| !n.is_empty())?.to_string();
        Some(IndexedWait {
            kind,
            attempt,
            permits,
            name,
        })
    }

    /// The resource waited for.
    pub fn key(&self) -> ResourceKey {
        let primitive = match self.kind {
            HoldKind::Lock => Primitive::Lock,
            _ => Primitive::Semaphore,
        };
        (primitive, self.name.clone())
    }
}

/// The index hash of `owner`'s client: `<prefix>:waits:{<client>}`, the client being the
/// owner id up to its last `:` (as its wake lists are named).
pub(crate) fn index_key(prefix: &str, owner: &str) -> String {
    let client = owner.rsplit_once(':').map_or(owner, |(client, _)| client);
    format!("{prefix}:waits:{{{client}}}")
}

/// How long an index entry outlives its last refresh: three check periods (a wait refreshes
/// it at each check, every `after`), and at least 1 s.
pub(crate) fn index_ttl(after: Duration) -> Duration {
    (after * 3).max(Duration::from_secs(1))
}

/// Write (or refresh) `owner`'s entry: it waits for `wait`.
pub(crate) fn publish(
    inner: &ClientInner,
    owner: &str,
    wait: &IndexedWait,
    after: Duration,
) -> Result<()> {
    let key = index_key(&inner.config.key_prefix, owner);
    let ttl = index_ttl(after).as_millis() as u64;
    let during = |e| Error::from_redis("publishing a long wait", e);
    inner.with_conn("publishing a long wait", |c| {
        c.query::<()>(redis::cmd("HSET").arg(&key).arg(owner).arg(wait.encode()))
            .map_err(during)?;
        c.query::<()>(redis::cmd("PEXPIRE").arg(&key).arg(ttl))
            .map_err(during)
    })
}

/// Delete `owner`'s entry (its wait ended).
pub(crate) fn unpublish(inner: &ClientInner, owner: &str) -> Result<()> {
    let key = index_key(&inner.config.key_prefix, owner);
    inner.with_conn("ending a long wait", |c| {
        c.query::<()>(redis::cmd("HDEL").arg(&key).arg(owner))
            .map_err(|e| Error::from_redis("ending a long wait", e))
    })
}

/// What `owner` waits for by its client's index, if it says.
fn read_index(inner: &ClientInner, owner: &str) -> Result<Option<IndexedWait>> {
    let key = index_key(&inner.config.key_prefix, owner);
    let value: Option<String> = inner.with_conn("reading the index of long waits", |c| {
        c.query(redis::cmd("HGET").arg(&key).arg(owner))
            .map_err(|e| Error::from_redis("reading the index of long waits", e))
    })?;
    Ok(value.as_deref().and_then(IndexedWait::parse))
}

/// One resource's status, read now (one status script).
pub(crate) fn read_resource(
    inner: &ClientInner,
    (primitive, name): &ResourceKey,
) -> Result<Resource> {
    let prefix = inner.config.key_prefix.as_str();
    match primitive {
        Primitive::Lock => {
            let call = RawLock::new(prefix, name, inner.protocol)?.status();
            let raw = inner.with_conn(call.during(), |c| call.run(c))?;
            Ok(Resource::of_lock(&LockStatus::from_raw(name, raw)))
        }
        Primitive::Semaphore => {
            // (the kind and capacity do not matter to a status read)
            let raw = RawSemaphore::new(prefix, name, SemKind::Semaphore, 1, inner.protocol)?;
            let call = raw.status();
            let raw = inner.with_conn(call.during(), |c| call.run(c))?;
            Ok(Resource::of_semaphore(&SemaphoreStatus::from_raw(
                name, raw,
            )))
        }
    }
}

/// The waits of `resources` that are believed: every wait the statuses show, except those of
/// an owner whose index entry names another resource than one it is queued for (a stale entry,
/// or a stale hint: neither is trusted, so all of that owner's waits are dropped, which can
/// only shrink the proven-blocked set).
pub(crate) fn believed(
    mut resources: Vec<Resource>,
    hints: &BTreeMap<String, Option<IndexedWait>>,
) -> Vec<Resource> {
    let disagree: BTreeSet<String> = resources
        .iter()
        .flat_map(|r| {
            r.waits.iter().filter_map(move |w| {
                let hint = hints.get(&w.origin.owner)?.as_ref()?;
                (hint.key() != r.key()).then(|| w.origin.owner.clone())
            })
        })
        .collect();
    for r in &mut resources {
        r.waits.retain(|w| !disagree.contains(&w.origin.owner));
    }
    resources
}

/// The cycles of `resources` (after [`believed`]) whose youngest wait is `me`'s, and the
/// owners proven blocked (whose waits a confirming read must cover).
pub(crate) fn refusing(
    resources: Vec<Resource>,
    hints: &BTreeMap<String, Option<IndexedWait>>,
    me: &str,
) -> (Vec<Resource>, BTreeSet<String>, Option<Deadlock>) {
    let (resources, analysis) = analyse(believed(resources, hints));
    let mine = analysis
        .cycles
        .iter()
        .map(|c| deadlock(&resources, c))
        .find(|d| d.youngest_wait().is_some_and(|y| y.holder.owner == me));
    (resources, analysis.blocked, mine)
}

/// Whether `me`'s wait for `wait` closes a cycle in which it is the youngest wait, confirmed by
/// two readings: then the cycle, which `me` must break by leaving. `None` when there is no
/// cycle, when another member is the youngest (it breaks it), or when the cycle dissolved
/// between the readings. See the module's documentation for the hops and their bound.
///
/// # Errors
/// [`Error::Connection`] and the like when a read fails; the caller keeps waiting.
pub(crate) fn check(inner: &ClientInner, me: &str, wait: &IndexedWait) -> Result<Option<Deadlock>> {
    let mut hints: BTreeMap<String, Option<IndexedWait>> = BTreeMap::new();
    hints.insert(me.to_string(), Some(wait.clone()));
    let mut first: BTreeMap<ResourceKey, Resource> = BTreeMap::new();
    let mut hops: VecDeque<ResourceKey> = VecDeque::from([wait.key()]);
    let mut looked_up = 0;
    while let Some(key) = hops.pop_front() {
        if first.contains_key(&key) {
            continue;
        }
        if first.len() >= MAX_RESOURCES {
            break;
        }
        let resource = read_resource(inner, &key)?;
        for hold in &resource.holds {
            let owner = &hold.origin.owner;
            if hints.contains_key(owner) || looked_up >= MAX_INDEX_READS {
                continue;
            }
            looked_up += 1;
            let hint = read_index(inner, owner)?;
            if let Some(h) = &hint {
                hops.push_back(h.key());
            }
            hints.insert(owner.clone(), hint);
        }
        first.insert(key, resource);
    }
    let (first, blocked, found) = refusing(first.into_values().collect(), &hints, me);
    if found.is_none() {
        return Ok(None);
    }
    // the confirming read: the resources the blocked owners wait for, read again, and what
    // stood through both readings
    let mut stood = Vec::new();
    for r in &first {
        if r.waits.iter().any(|w| blocked.contains(&w.origin.owner)) {
            let again = read_resource(inner, &r.key())?;
            stood.push(r.intersect(&again));
        }
    }
    Ok(refusing(stood, &hints, me).2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deadlock::snapshot::tests::{lock, semaphore};

    fn wait(kind: HoldKind, name: &str) -> IndexedWait {
        IndexedWait {
            kind,
            attempt: 42,
            permits: 1,
            name: name.into(),
        }
    }

    #[test]
    fn an_index_entry_reads_back_as_written_and_nothing_else_is_a_hint() {
        for kind in [
            HoldKind::Lock,
            HoldKind::Semaphore,
            HoldKind::Read,
            HoldKind::Write,
        ] {
            let w = IndexedWait {
                permits: 3,
                ..wait(kind, "a|b c")
            };
            assert_eq!(IndexedWait::parse(&w.encode()), Some(w));
        }
        assert_eq!(wait(HoldKind::Lock, "x").encode(), "lock|42|1|x");
        for bad in [
            "",
            "lock",
            "lock|42|1",
            "lock|42|1|",
            "mutex|42|1|x",
            "lock|-1|1|x",
            "lock|42|many|x",
        ] {
            assert_eq!(IndexedWait::parse(bad), None, "{bad:?}");
        }
        assert_eq!(
            wait(HoldKind::Read, "rw").key(),
            (Primitive::Semaphore, "rw".to_string())
        );
        assert_eq!(
            wait(HoldKind::Lock, "l").key(),
            (Primitive::Lock, "l".to_string())
        );
    }

    #[test]
    fn the_index_key_is_the_clients_own_hash_tag() {
        assert_eq!(index_key("fl", "abc:7"), "fl:waits:{abc}");
        // WaitMode::PerThread: one per waiting thread, as its wake list
        assert_eq!(index_key("fl", "abc.7:7"), "fl:waits:{abc.7}");
        assert_eq!(
            index_ttl(Duration::from_millis(100)),
            Duration::from_secs(1)
        );
        assert_eq!(index_ttl(Duration::from_secs(2)), Duration::from_secs(6));
    }

    fn hints(entries: &[(&str, Option<IndexedWait>)]) -> BTreeMap<String, Option<IndexedWait>> {
        entries
            .iter()
            .map(|(o, w)| (o.to_string(), w.clone()))
            .collect()
    }

    #[test]
    fn only_the_youngest_wait_of_a_cycle_refuses_itself() {
        // c:1 holds a and waits for b; c:2 holds b and waits for a; c:2 queued later
        // (the fixture's queued_at falls with the queue place, so make it explicit)
        let mut a = lock("a", Some("c:1"), &["c:2"]);
        let mut b = lock("b", Some("c:2"), &["c:1"]);
        a.waits[0].queued_at = Duration::from_secs(50);
        b.waits[0].queued_at = Duration::from_secs(40);
        let h = hints(&[
            ("c:1", Some(wait(HoldKind::Lock, "b"))),
            ("c:2", Some(wait(HoldKind::Lock, "a"))),
        ]);
        let (_, blocked, d) = refusing(vec![a.clone(), b.clone()], &h, "c:2");
        let d = d.expect("c:2 is the youngest wait");
        assert_eq!(d.members.len(), 2);
        assert!(d.involves("a", HoldKind::Lock) && d.involves("b", HoldKind::Lock));
        assert_eq!(blocked.len(), 2);
        // the older member finds the same cycle and keeps waiting
        assert_eq!(refusing(vec![a.clone(), b.clone()], &h, "c:1").2, None);
        // an owner outside the cycle refuses nobody
        assert_eq!(refusing(vec![a, b], &h, "c:9").2, None);
    }

    #[test]
    fn a_wait_whose_index_entry_names_another_lock_is_not_believed() {
        let a = lock("a", Some("c:1"), &["c:2"]);
        let b = lock("b", Some("c:2"), &["c:1"]);
        // c:2's entry says it waits for z: its wait for a is not believed, so no cycle
        let h = hints(&[
            ("c:1", Some(wait(HoldKind::Lock, "b"))),
            ("c:2", Some(wait(HoldKind::Lock, "z"))),
        ]);
        for me in ["c:1", "c:2"] {
            assert_eq!(refusing(vec![a.clone(), b.clone()], &h, me).2, None);
        }
        // an owner not looked up (not a holder) is believed on the status alone
        let h = hints(&[("c:1", Some(wait(HoldKind::Lock, "b")))]);
        assert!(refusing(vec![a, b], &h, "c:1").2.is_some());
    }

    #[test]
    fn a_holder_that_waits_for_nothing_is_no_deadlock() {
        // c:2 holds b and waits for nothing: c:1 waits for it, no cycle
        let a = lock("a", Some("c:1"), &[]);
        let b = lock("b", Some("c:2"), &["c:1"]);
        let h = hints(&[("c:1", Some(wait(HoldKind::Lock, "b"))), ("c:2", None)]);
        assert_eq!(refusing(vec![a, b], &h, "c:1").2, None);
        // a writer behind a reader that waits for a lock the writer holds: found
        let rw = 1 << 30;
        let mut s = semaphore("rw", rw, &[("c:1", 1)], &[("c:2", rw)]);
        s.holds[0].kind = HoldKind::Read;
        s.waits[0].kind = HoldKind::Write;
        let l = lock("l", Some("c:2"), &["c:1"]);
        let h = hints(&[
            ("c:1", Some(wait(HoldKind::Lock, "l"))),
            ("c:2", Some(wait(HoldKind::Write, "rw"))),
        ]);
        let found = [
            refusing(vec![s.clone(), l.clone()], &h, "c:1").2,
            refusing(vec![s, l], &h, "c:2").2,
        ];
        assert_eq!(found.iter().filter(|d| d.is_some()).count(), 1);
    }
}
