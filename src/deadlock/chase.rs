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
use crate::raw::{RawLock, RawSemaphore, RawStatus, SemKind, SemStatus};
use crate::status::{LockStatus, SemaphoreStatus};

/// The most locks (status reads) the first reading of a check follows.
pub const MAX_RESOURCES: usize = 16;
/// The most index look-ups (one per holder followed) of a check.
pub const MAX_INDEX_READS: usize = 32;

/// What a waiting thread waits for, as its client's index entry says it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexedWait {
    /// What it wants of the resource: a lock, permits, a read or a write.
    pub kind: HoldKind,
    /// The wait's attempt number.
    pub attempt: u64,
    /// Permits it wants (1 for a lock).
    pub permits: u64,
    /// The resource's name.
    pub name: String,
}

impl IndexedWait {
    /// The wait of `attempt` for `permits` of `name` as `kind`.
    #[cfg_attr(not(feature = "raw"), allow(dead_code))]
    pub fn new(kind: HoldKind, attempt: u64, permits: u64, name: &str) -> IndexedWait {
        IndexedWait {
            kind,
            attempt,
            permits,
            name: name.to_string(),
        }
    }

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
    pub(crate) fn key(&self) -> ResourceKey {
        (self.primitive(), self.name.clone())
    }

    /// The primitive waited for: a lock, or a semaphore (a read/write lock's read or write
    /// included).
    pub fn primitive(&self) -> Primitive {
        match self.kind {
            HoldKind::Lock => Primitive::Lock,
            _ => Primitive::Semaphore,
        }
    }
}

/// The index hash of `owner`'s client: `<prefix>:waits:{<client>}`, the client being the
/// owner id up to its last `:` (as its wake lists are named).
pub fn index_key(prefix: &str, owner: &str) -> String {
    let client = owner.rsplit_once(':').map_or(owner, |(client, _)| client);
    format!("{prefix}:waits:{{{client}}}")
}

/// How long an index entry outlives its last refresh: three check periods (a wait refreshes
/// it at each check, every `after`), and at least 1 s.
pub fn index_ttl(after: Duration) -> Duration {
    (after * 3).max(Duration::from_secs(1))
}

/// The commands that write (or refresh) `owner`'s entry under `prefix`, it waits for `wait`,
/// with a TTL of `ttl` (the library's is [`index_ttl`]): `HSET`, then `PEXPIRE`.
pub fn publish_cmds(
    prefix: &str,
    owner: &str,
    wait: &IndexedWait,
    ttl: Duration,
) -> [redis::Cmd; 2] {
    let key = index_key(prefix, owner);
    let ttl = ttl.as_millis().clamp(1, u64::MAX as u128) as u64;
    [
        redis::cmd("HSET")
            .arg(&key)
            .arg(owner)
            .arg(wait.encode())
            .to_owned(),
        redis::cmd("PEXPIRE").arg(&key).arg(ttl).to_owned(),
    ]
}

/// The command that deletes `owner`'s entry (`HDEL`).
pub fn unpublish_cmd(prefix: &str, owner: &str) -> redis::Cmd {
    redis::cmd("HDEL")
        .arg(index_key(prefix, owner))
        .arg(owner)
        .to_owned()
}

/// The command that reads `owner`'s entry (`HGET`): its reply is what
/// [`DeadlockCheck::feed_index`] takes.
pub fn read_index_cmd(prefix: &str, owner: &str) -> redis::Cmd {
    redis::cmd("HGET")
        .arg(index_key(prefix, owner))
        .arg(owner)
        .to_owned()
}

/// What a wait with detection on does when its next moment comes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Due {
    /// Publish the wait in its client's index (no check).
    Publish,
    /// Publish (refresh) the wait, then check.
    Check,
}

/// A wait's first moment: `after` / 2 after it queued, it publishes (and does not check yet),
/// so that when the youngest member of a cycle checks, `after` after it queued, every other
/// member, whose wait began before, has written its entry even if it was up to `after` / 2
/// late (docs/design.md, "The bound").
pub fn first_due(after: Duration) -> (Duration, Due) {
    (after / 2, Due::Publish)
}

/// The moment after one that did `done`, counted from its end: the first check comes the rest
/// of `after` after the publication; a check every `after` after that.
pub fn next_due(after: Duration, done: Due) -> (Duration, Due) {
    match done {
        Due::Publish => (after - after / 2, Due::Check),
        Due::Check => (after, Due::Check),
    }
}

/// Write (or refresh) `owner`'s entry: it waits for `wait`.
pub(crate) fn publish(
    inner: &ClientInner,
    owner: &str,
    wait: &IndexedWait,
    after: Duration,
) -> Result<()> {
    let cmds = publish_cmds(&inner.config.key_prefix, owner, wait, index_ttl(after));
    let during = |e| Error::from_redis("publishing a long wait", e);
    inner.with_conn("publishing a long wait", |c| {
        if redis::ConnectionLike::supports_pipelining(c) {
            // one round trip (a Cluster connection sends them one by one: same key, same node)
            let mut pipe = redis::pipe();
            for cmd in &cmds {
                pipe.add_command(cmd.clone()).ignore();
            }
            return pipe.query::<()>(c).map_err(during);
        }
        for cmd in &cmds {
            c.query::<()>(cmd).map_err(during)?;
        }
        Ok(())
    })
}

/// Delete `owner`'s entry (its wait ended).
pub(crate) fn unpublish(inner: &ClientInner, owner: &str) -> Result<()> {
    let cmd = unpublish_cmd(&inner.config.key_prefix, owner);
    inner.with_conn("ending a long wait", |c| {
        c.query::<()>(&cmd)
            .map_err(|e| Error::from_redis("ending a long wait", e))
    })
}

/// What `owner`'s client's index says of it, as stored (`None`: no entry).
fn read_index(inner: &ClientInner, owner: &str) -> Result<Option<String>> {
    let cmd = read_index_cmd(&inner.config.key_prefix, owner);
    inner.with_conn("reading the index of long waits", |c| {
        c.query(&cmd)
            .map_err(|e| Error::from_redis("reading the index of long waits", e))
    })
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

/// What a [`DeadlockCheck`] needs next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Need {
    /// The status of this resource (one status script: [`RawLock::status`] for
    /// [`Primitive::Lock`], [`RawSemaphore::status`] for [`Primitive::Semaphore`]), fed with
    /// [`DeadlockCheck::feed_lock_status`] or [`DeadlockCheck::feed_semaphore_status`].
    Status {
        /// A lock, or a semaphore (or read/write lock).
        primitive: Primitive,
        /// Its name.
        name: String,
    },
    /// `owner`'s index entry ([`read_index_cmd`]), fed with [`DeadlockCheck::feed_index`].
    Index {
        /// The holder whose wait is looked up.
        owner: String,
    },
    /// The check is over: the cycle this wait must break by leaving, if any.
    Done(Option<Deadlock>),
}

/// Where a check is.
#[derive(Debug)]
enum Phase {
    /// The first reading: hops breadth first.
    First,
    /// The confirming reading: `todo` are the first readings still to read again, `stood`
    /// what stood through both.
    Second {
        todo: VecDeque<Resource>,
        stood: Vec<Resource>,
    },
    Done(Option<Deadlock>),
}

/// One deadlock check of a waiting thread, without any I/O: it says what it needs to read
/// ([`need`](Self::need)), and is fed the replies. The library's engine drives it with one
/// round trip per need (see the module's documentation for the hops, their bounds, the
/// belief rule, the youngest-wait rule and the confirming reading); the protocol fuzzer drives
/// it one read at a time, other clients' steps in between.
///
/// A read that fails ends the check (the caller drops it: no refusal).
#[derive(Debug)]
pub struct DeadlockCheck {
    me: String,
    hints: BTreeMap<String, Option<IndexedWait>>,
    first: BTreeMap<ResourceKey, Resource>,
    hops: VecDeque<ResourceKey>,
    looked_up: usize,
    /// The resource read last in the first reading, whose holders are being looked up (from
    /// hold `.1` on) before it joins `first`.
    reading: Option<(Resource, usize)>,
    phase: Phase,
    reads: usize,
}

impl DeadlockCheck {
    /// A check of `me`'s wait for `wait` (what its own index entry says).
    pub fn new(me: &str, wait: &IndexedWait) -> DeadlockCheck {
        let mut hints = BTreeMap::new();
        hints.insert(me.to_string(), Some(wait.clone()));
        DeadlockCheck {
            me: me.to_string(),
            hints,
            first: BTreeMap::new(),
            hops: VecDeque::from([wait.key()]),
            looked_up: 0,
            reading: None,
            phase: Phase::First,
            reads: 0,
        }
    }

    /// How many reads it was fed so far (at most `MAX_RESOURCES + MAX_INDEX_READS +
    /// MAX_RESOURCES`).
    #[cfg_attr(not(feature = "raw"), allow(dead_code))]
    pub fn reads(&self) -> usize {
        self.reads
    }

    /// What the check needs next; the same until it is fed.
    pub fn need(&mut self) -> Need {
        loop {
            match &mut self.phase {
                Phase::Done(found) => return Need::Done(found.clone()),
                Phase::Second { todo, stood } => match todo.front() {
                    Some(r) => {
                        return Need::Status {
                            primitive: r.primitive,
                            name: r.name.clone(),
                        }
                    }
                    None => {
                        let stood = std::mem::take(stood);
                        let found = refusing(stood, &self.hints, &self.me).2;
                        self.phase = Phase::Done(found);
                    }
                },
                Phase::First => {
                    if let Some((resource, mut at)) = self.reading.take() {
                        // the next holder to look up, if any
                        while at < resource.holds.len() {
                            let owner = &resource.holds[at].origin.owner;
                            if self.hints.contains_key(owner) || self.looked_up >= MAX_INDEX_READS {
                                at += 1;
                                continue;
                            }
                            let need = Need::Index {
                                owner: owner.clone(),
                            };
                            self.reading = Some((resource, at));
                            return need;
                        }
                        self.first.insert(resource.key(), resource);
                        continue;
                    }
                    match self.hops.front() {
                        Some(key) if self.first.contains_key(key) => {
                            self.hops.pop_front();
                        }
                        Some(key) if self.first.len() < MAX_RESOURCES => {
                            return Need::Status {
                                primitive: key.0,
                                name: key.1.clone(),
                            }
                        }
                        _ => self.end_first_reading(),
                    }
                }
            }
        }
    }

    /// The first reading is over: find the cycles; only the youngest wait of one reads again.
    fn end_first_reading(&mut self) {
        let first = std::mem::take(&mut self.first);
        let (first, blocked, found) =
            refusing(first.into_values().collect(), &self.hints, &self.me);
        self.phase = if found.is_none() {
            Phase::Done(None)
        } else {
            // the confirming read: the resources the blocked owners wait for, read again, and
            // what stood through both readings
            let todo = first
                .into_iter()
                .filter(|r| r.waits.iter().any(|w| blocked.contains(&w.origin.owner)))
                .collect();
            Phase::Second {
                todo,
                stood: Vec::new(),
            }
        };
    }

    /// Feed the status [`Need::Status`] asked for, as a resource (does nothing when no status
    /// was asked for).
    pub(crate) fn feed_resource(&mut self, resource: Resource) {
        if !matches!(self.need(), Need::Status { .. }) {
            return;
        }
        self.reads += 1;
        match &mut self.phase {
            Phase::First => {
                self.hops.pop_front();
                self.reading = Some((resource, 0));
            }
            Phase::Second { todo, stood } => {
                if let Some(earlier) = todo.pop_front() {
                    stood.push(earlier.intersect(&resource));
                }
            }
            Phase::Done(_) => {}
        }
    }

    /// Feed the lock status [`Need::Status`] asked for (its [`RawLock::status`] reply).
    #[cfg_attr(not(feature = "raw"), allow(dead_code))]
    pub fn feed_lock_status(&mut self, raw: RawStatus) {
        if let Need::Status { name, .. } = self.need() {
            self.feed_resource(Resource::of_lock(&LockStatus::from_raw(&name, raw)));
        }
    }

    /// Feed the semaphore status [`Need::Status`] asked for (its [`RawSemaphore::status`]
    /// reply).
    #[cfg_attr(not(feature = "raw"), allow(dead_code))]
    pub fn feed_semaphore_status(&mut self, raw: SemStatus) {
        if let Need::Status { name, .. } = self.need() {
            self.feed_resource(Resource::of_semaphore(&SemaphoreStatus::from_raw(
                &name, raw,
            )));
        }
    }

    /// Feed the index entry [`Need::Index`] asked for: the `HGET` reply ([`read_index_cmd`]),
    /// `None` when there is none (does nothing when no entry was asked for).
    pub fn feed_index(&mut self, value: Option<String>) {
        let Need::Index { owner } = self.need() else {
            return;
        };
        self.reads += 1;
        self.looked_up += 1;
        let hint = value.as_deref().and_then(IndexedWait::parse);
        if let Some(h) = &hint {
            self.hops.push_back(h.key());
        }
        // (`need` passes over this holder from now on: its hint is known)
        self.hints.insert(owner, hint);
    }
}

/// Whether `me`'s wait for `wait` closes a cycle in which it is the youngest wait, confirmed by
/// two readings: then the cycle, which `me` must break by leaving. `None` when there is no
/// cycle, when another member is the youngest (it breaks it), or when the cycle dissolved
/// between the readings. See the module's documentation for the hops and their bound.
///
/// # Errors
/// [`Error::Connection`] and the like when a read fails; the caller keeps waiting.
pub(crate) fn check(inner: &ClientInner, me: &str, wait: &IndexedWait) -> Result<Option<Deadlock>> {
    let mut check = DeadlockCheck::new(me, wait);
    loop {
        match check.need() {
            Need::Status { primitive, name } => {
                let resource = read_resource(inner, &(primitive, name))?;
                check.feed_resource(resource);
            }
            Need::Index { owner } => {
                let value = read_index(inner, &owner)?;
                check.feed_index(value);
            }
            Need::Done(found) => return Ok(found),
        }
    }
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

    /// When the youngest member of a cycle first finds the whole cycle, its members having
    /// queued at `queued` (ms) and each one's moments coming `late` ms late (a thread that woke
    /// late, a publication in flight): the first check of the youngest that starts once every
    /// other member's entry is written. Every member follows `first_due` / `next_due`, each
    /// moment taking no time.
    fn found_at(queued: &[u64], late: u64, after: Duration) -> u64 {
        let ms = |d: Duration| d.as_millis() as u64;
        // when a member's entry is first written
        // (every moment writes it, the first one included)
        let published = |q: u64| q + ms(first_due(after).0) + late;
        let youngest = *queued.iter().max().unwrap();
        let ready = queued
            .iter()
            .filter(|q| **q != youngest)
            .map(|q| published(*q))
            .max()
            .unwrap_or(0);
        let (at, mut due) = first_due(after);
        let mut t = youngest + ms(at);
        loop {
            if due == Due::Check && t >= ready {
                return t;
            }
            let (at, next) = next_due(after, due);
            t += ms(at);
            due = next;
        }
    }

    /// The bound (docs/design.md, "The bound"): a cycle is found by its youngest member's
    /// first check, `after` after it queued, when the others' waits began up to a moment
    /// before and their entries are written up to `after` / 2 late. (With a wait that
    /// published only at its first check, `after` after it queued, a member that queued a
    /// millisecond before the youngest and wrote its entry a few milliseconds late was missed,
    /// and the cycle was found only a whole `after` later.)
    #[test]
    fn the_youngest_members_first_check_finds_a_cycle_whose_members_published_a_little_late() {
        let after = Duration::from_millis(400);
        for late in [0, 1, 5, 50, 199] {
            for gap in [0, 1, 3, 100, 400, 5000] {
                let queued = [1000, 1000 + gap / 2, 1000 + gap];
                let found = found_at(&queued, late, after);
                let youngest = 1000 + gap;
                assert!(
                    found <= youngest + 400,
                    "late {late} gap {gap}: found {} ms after the youngest queued",
                    found - youngest
                );
            }
        }
        assert_eq!(first_due(after).0, Duration::from_millis(200));
        assert_eq!(
            next_due(after, Due::Publish),
            (Duration::from_millis(200), Due::Check)
        );
        assert_eq!(next_due(after, Due::Check), (after, Due::Check));
        // odd numbers of ms (or ns) add up to `after`
        let odd = Duration::from_nanos(333_333_333);
        assert_eq!(first_due(odd).0 + next_due(odd, Due::Publish).0, odd);
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

    /// A command's name and arguments, as text.
    fn words(cmd: &redis::Cmd) -> Vec<String> {
        cmd.args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                _ => "<not a plain argument>".to_string(),
            })
            .collect()
    }

    #[test]
    fn the_index_commands_write_read_and_delete_the_owners_field_of_its_clients_hash() {
        let wait = IndexedWait {
            kind: HoldKind::Write,
            attempt: 12,
            permits: 3,
            name: "a|b".to_string(),
        };
        let [set, expire] = publish_cmds("fl", "abc:7", &wait, Duration::from_millis(1500));
        assert_eq!(
            words(&set),
            ["HSET", "fl:waits:{abc}", "abc:7", "write|12|3|a|b"]
        );
        assert_eq!(words(&expire), ["PEXPIRE", "fl:waits:{abc}", "1500"]);
        // (a TTL below 1 ms would delete the key: at least 1)
        let [_, expire] = publish_cmds("fl", "abc:7", &wait, Duration::ZERO);
        assert_eq!(words(&expire), ["PEXPIRE", "fl:waits:{abc}", "1"]);
        assert_eq!(
            words(&read_index_cmd("fl", "abc:7")),
            ["HGET", "fl:waits:{abc}", "abc:7"]
        );
        assert_eq!(
            words(&unpublish_cmd("fl", "abc:7")),
            ["HDEL", "fl:waits:{abc}", "abc:7"]
        );
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

    /// The machine asks for the hops one at a time, breadth first: the lock waited for, its
    /// holder's entry, the next lock, and so on; then (the youngest only) the confirming
    /// reading, which a cycle that dissolved between the readings does not pass.
    #[test]
    fn the_check_asks_for_one_read_at_a_time_and_confirms_with_a_second_reading() {
        let mut a = lock("a", Some("c:1"), &["c:2"]);
        let mut b = lock("b", Some("c:2"), &["c:1"]);
        a.waits[0].queued_at = Duration::from_secs(50);
        b.waits[0].queued_at = Duration::from_secs(40);
        let status = |name: &str| Need::Status {
            primitive: Primitive::Lock,
            name: name.into(),
        };
        let index = |owner: &str| Need::Index {
            owner: owner.into(),
        };
        for dissolved in [false, true] {
            let mut c = DeadlockCheck::new("c:2", &wait(HoldKind::Lock, "a"));
            assert_eq!(c.need(), status("a"));
            // asked again, the same need
            assert_eq!(c.need(), status("a"));
            c.feed_resource(a.clone());
            assert_eq!(c.need(), index("c:1"));
            c.feed_index(Some(wait(HoldKind::Lock, "b").encode()));
            assert_eq!(c.need(), status("b"));
            c.feed_resource(b.clone());
            // c:2's own wait is known: no look-up of it; the youngest reads both again
            assert_eq!(c.need(), status("a"));
            c.feed_resource(a.clone());
            assert_eq!(c.need(), status("b"));
            let mut again = b.clone();
            if dissolved {
                // c:1 left b's queue between the readings
                again.waits.clear();
            }
            c.feed_resource(again);
            match c.need() {
                Need::Done(Some(d)) => {
                    assert!(!dissolved);
                    assert_eq!(d.members.len(), 2);
                }
                Need::Done(None) => assert!(dissolved),
                other => panic!("{other:?}"),
            }
            assert_eq!(c.reads(), 5);
            // a reply nobody asked for changes nothing
            c.feed_index(None);
            assert_eq!(c.reads(), 5);
        }
        // the older member reads once, finds it is not the youngest, and is done
        let mut c = DeadlockCheck::new("c:1", &wait(HoldKind::Lock, "b"));
        assert_eq!(c.need(), status("b"));
        c.feed_resource(b.clone());
        assert_eq!(c.need(), index("c:2"));
        c.feed_index(Some(wait(HoldKind::Lock, "a").encode()));
        assert_eq!(c.need(), status("a"));
        c.feed_resource(a);
        assert_eq!(c.need(), Need::Done(None));
        assert_eq!(c.reads(), 3);
    }

    /// Run `c` to its end over `locks` (by name) and `index` (owner -> the lock it waits
    /// for); the statuses it read, in order (both readings), the owners it looked up, and
    /// what it found.
    fn drive(
        mut c: DeadlockCheck,
        locks: &[Resource],
        index: &[(&str, &str)],
    ) -> (Vec<String>, Vec<String>, Option<Deadlock>) {
        let mut read = Vec::new();
        let mut looked_up = Vec::new();
        for _ in 0..1000 {
            match c.need() {
                Need::Status { name, .. } => {
                    let r = locks.iter().find(|r| r.name == name).cloned();
                    c.feed_resource(r.unwrap_or_else(|| lock(&name, None, &[])));
                    read.push(name);
                }
                Need::Index { owner } => {
                    let hint = index.iter().find(|(o, _)| *o == owner);
                    c.feed_index(hint.map(|(_, l)| wait(HoldKind::Lock, l).encode()));
                    looked_up.push(owner);
                }
                Need::Done(found) => return (read, looked_up, found),
            }
        }
        panic!("the check did not end");
    }

    #[test]
    fn the_first_reading_reads_each_lock_once_even_when_two_hops_lead_to_it() {
        // c:9 waits for a, held by c:1, which waits for b, held by c:2, which waits for a
        // again (a cycle c:9 is not in: c:1 and c:2 are queued on each other's locks)
        let a = lock("a", Some("c:1"), &["c:9", "c:2"]);
        let b = lock("b", Some("c:2"), &["c:1"]);
        let (first, _, found) = drive(
            DeadlockCheck::new("c:9", &wait(HoldKind::Lock, "a")),
            &[a, b],
            &[("c:1", "b"), ("c:2", "a")],
        );
        assert_eq!(first, ["a", "b"]);
        // the cycle is c:1 and c:2's; c:9 only waits behind it, and refuses nothing
        assert!(found.is_none());
    }

    #[test]
    fn the_first_reading_stops_at_its_bound_of_locks() {
        // a chain of 20 locks: l<i> held by c:<i>, which waits for l<i+1>; c:99 waits for l0
        let n = MAX_RESOURCES + 4;
        let names: Vec<String> = (0..n).map(|i| format!("l{i}")).collect();
        let owners: Vec<String> = (0..n).map(|i| format!("c:{i}")).collect();
        let locks: Vec<Resource> = (0..n)
            .map(|i| {
                let waiter = if i == 0 {
                    "c:99".to_string()
                } else {
                    owners[i - 1].clone()
                };
                lock(&names[i], Some(&owners[i]), &[waiter.as_str()])
            })
            .collect();
        let index: Vec<(&str, &str)> = (0..n - 1)
            .map(|i| (owners[i].as_str(), names[i + 1].as_str()))
            .collect();
        let (first, _, found) = drive(
            DeadlockCheck::new("c:99", &wait(HoldKind::Lock, "l0")),
            &locks,
            &index,
        );
        assert_eq!(first.len(), MAX_RESOURCES, "{first:?}");
        assert_eq!(first, names[..MAX_RESOURCES]);
        assert!(found.is_none());
    }

    #[test]
    fn the_first_reading_stops_at_its_bound_of_index_look_ups() {
        // a semaphore of 40 permits, each held by a thread of its own; c:99 waits for one more
        let n = MAX_INDEX_READS + 8;
        let owners: Vec<String> = (0..n).map(|i| format!("c:{i}")).collect();
        let holds: Vec<(&str, u64)> = owners.iter().map(|o| (o.as_str(), 1)).collect();
        let s = semaphore("s", n as u64, &holds, &[("c:99", 1)]);
        let (read, looked_up, found) = drive(
            DeadlockCheck::new("c:99", &wait(HoldKind::Semaphore, "s")),
            &[s],
            &[],
        );
        assert_eq!(read, ["s"]);
        assert_eq!(looked_up.len(), MAX_INDEX_READS, "{looked_up:?}");
        assert!(found.is_none());
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
