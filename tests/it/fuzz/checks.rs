//! The checks. After every request that reaches Redis an atomic snapshot of each lock (holder,
//! queue, waiters) is compared with the one before: a new token is a grant, which must carry the
//! highest token so far and must not pass over a live waiter queued ahead. After every step the
//! model's beliefs are compared with a fresh snapshot: one holder at most, the one Redis shows;
//! live waiters keep their places and their hand-offs; every key has a TTL.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::LazyLock;

use redis::Value;

use crate::fuzz::judges::View;
use crate::fuzz::model::Prim;
use crate::fuzz::world::World;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    MutualExclusion,
    RedisDisagrees,
    TokenOrder,
    KeyWithoutTtl,
    Overtaken,
    WaiterLost,
    HandoffVanished,
    /// A live waiter's hand-off is still in Redis, but its wake-up message, which nobody
    /// popped, is gone from the wake list: the waiter can never learn of it.
    WakeupLost,
    ReleaseIneffective,
    BadReply,
    ScriptError,
    Liveness,
    /// A hold granted to an attempt that has ended (a late copy of its acquire).
    GhostHold,
    /// Redis's keys hold more than the live participants explain.
    KeySize,
    /// A dead waiter was granted the lock, or kept it, longer than the bounds allow.
    DeadWaiter,
}

#[derive(Clone, Debug)]
pub struct Violation {
    pub check: Check,
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.check, self.message)
    }
}

/// Why the end state is not yet the one `settled` allows.
#[derive(Debug)]
pub enum Unsettled {
    /// Something is still held or queued: the quiet phase goes on.
    State(String),
    /// All is at rest, but these keys live longer than the bound of their kind.
    Overlong(String),
}

/// The start of a grant's wake-up for `owner`'s `attempt` with `token` (state.lua,
/// `grant_message`): "<thread>|g|<attempt>|<token>|".
pub fn grant_prefix(owner: &str, attempt: u64, token: u64) -> String {
    let thread = owner.rsplit_once(':').map_or("", |(_, t)| t);
    format!("{thread}|g|{attempt}|{token}|")
}

impl LockSnap {
    /// In the judges' common shape (`judges.rs`): one hold of one permit, or none.
    pub fn view(&self) -> View {
        View {
            holds: if self.owner.is_empty() {
                vec![]
            } else {
                vec![(self.owner.clone(), self.attempt, self.token, 1)]
            },
            queue: self.queue.clone(),
            waiters: self.waiters.clone(),
            fence: self.fence,
            detail: format!("holder {:?} token {}", self.owner, self.token),
        }
    }
}

/// One lock as Redis had it at a snapshot (`token` 0: no hash).
#[derive(Clone, Default, Debug)]
pub struct LockSnap {
    pub owner: String,
    pub attempt: u64,
    pub token: u64,
    /// (owner, score) in queue order.
    pub queue: Vec<(String, f64)>,
    /// owner -> attempt of its waiters entry.
    pub waiters: HashMap<String, u64>,
    /// The fence key's value (0: none), a bound above the tokens handed out.
    pub fence: u64,
}

pub struct Snapshot {
    pub locks: Vec<LockSnap>,
    /// Every key with its PTTL, when asked for.
    pub keys: Vec<(String, i64)>,
    /// Every key's entries and longest entry in bytes, when asked for (as `keys`).
    pub sizes: Vec<KeySize>,
    /// The server's clock (ms) at the snapshot.
    pub server_ms: i64,
    /// Fuzzer and real time when the reply arrived (after the snapshot was taken).
    pub fz: f64,
    pub real: f64,
}

/// The size judge's bounds (8'', `World::keys_bounded`): a key's entries beyond those a
/// participant brings (a lock's or a semaphore's hash fields, a fence), per participant (a
/// queue place, a waiters entry, a hold and its lease and hand-off, a wake-up in each wake
/// list: a wake-up of its current attempt, and one of an older attempt not yet dropped), and
/// an entry's bytes (a receipts field: eight tokens of 20 digits; an owner id with
/// its attempt and meta).
pub const KEY_ENTRIES_FIXED: i64 = 16;
pub const KEY_ENTRIES_PER_PARTICIPANT: i64 = 2;
pub const KEY_ENTRY_BYTES: i64 = 256;

/// A key's size: its entries (fields, members, elements; 1 for a string) and its longest field,
/// value, member or element in bytes.
#[derive(Clone, Debug)]
pub struct KeySize {
    pub key: String,
    pub entries: i64,
    pub longest: i64,
}

/// What the checks remember between snapshots.
pub struct Checker {
    pub last: Vec<LockSnap>,
    pub max_token: Vec<u64>,
    /// Tokens of holds that lost the guarantee by design (force-unlocked, data lost).
    exempt: Vec<HashSet<u64>>,
    /// Tokens an operator released by force: their hand-offs may vanish (exempt from the
    /// holders' checks only when `World::force_exemption` says so).
    pub forced: Vec<HashSet<u64>>,
    /// The fence may be gone (evicted, data loss) since the last grant.
    pub fence_lost: Vec<bool>,
    /// The queue key was evicted while the waiters hash lived on: the owners whose entries may
    /// outlive their places (those the hash had at the eviction), each until a heartbeat that
    /// names it is answered (it tells the owner to retry and drops the entry) or the hash goes.
    pub queue_lost: Vec<Option<HashSet<String>>>,
    /// 4'''. The order the `Queued` replies were seen in (`fuzz/fifo.rs`).
    pub reply_order: crate::fuzz::fifo::ReplyOrder,
}

impl Checker {
    pub fn new(locks: usize) -> Checker {
        Checker {
            last: vec![LockSnap::default(); locks],
            max_token: vec![0; locks],
            exempt: vec![HashSet::new(); locks],
            forced: vec![HashSet::new(); locks],
            fence_lost: vec![false; locks],
            queue_lost: vec![None; locks],
            reply_order: crate::fuzz::fifo::ReplyOrder::new(locks),
        }
    }

    pub fn exempt(&mut self, lock: usize, token: u64) {
        self.exempt[lock].insert(token);
    }

    pub fn is_exempt(&self, lock: usize, token: u64) -> bool {
        self.exempt[lock].contains(&token)
    }
}

/// Reads every lock's holder, queue, waiters and fence in one atomic step (and, when asked, the
/// PTTL of every key on the server). KEYS: lock hash, queue, waiters, fence per lock. A
/// tombstone (a released lock's hash, owner '') reads as no hash.
static SNAPSHOT: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
local out = {}
for i = 0, #KEYS / 4 - 1 do
  local h = redis.call('HMGET', KEYS[4 * i + 1], 'owner', 'attempt', 'token')
  if h[1] == '' then h = {} end
  out[#out + 1] = { h[1] or '', h[2] or '0', h[3] or '0',
                    redis.call('ZRANGE', KEYS[4 * i + 2], 0, -1, 'WITHSCORES'),
                    redis.call('HGETALL', KEYS[4 * i + 3]),
                    redis.call('GET', KEYS[4 * i + 4]) or '0' }
end
-- every key: name, PTTL, entries (fields, members, elements; 1 for a string) and the
-- longest field, value, member or element in bytes
local function size(k)
  local t = redis.call('TYPE', k).ok
  local items
  if t == 'string' then return 1, redis.call('STRLEN', k)
  elseif t == 'hash' then items = redis.call('HGETALL', k)
  elseif t == 'zset' then items = redis.call('ZRANGE', k, 0, -1)
  elseif t == 'list' then items = redis.call('LRANGE', k, 0, -1)
  elseif t == 'set' then items = redis.call('SMEMBERS', k)
  else return 0, 0 end
  local longest = 0
  for _, v in ipairs(items) do longest = math.max(longest, #v) end
  if t == 'hash' then return #items / 2, longest end
  return #items, longest
end
local keys = {}
if ARGV[1] == '1' then
  for _, k in ipairs(redis.call('KEYS', '*')) do
    local entries, longest = size(k)
    keys[#keys + 1] = k
    keys[#keys + 1] = redis.call('PTTL', k)
    keys[#keys + 1] = entries
    keys[#keys + 1] = longest
  end
end
out[#out + 1] = keys
local now = redis.call('TIME')
out[#out + 1] = now[1] * 1000 + math.floor(now[2] / 1000)
return out
",
    )
});

pub fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Int(i) => i.to_string(),
        _ => String::new(),
    }
}

pub fn items(v: &Value) -> &[Value] {
    match v {
        Value::Array(a) => a,
        _ => &[],
    }
}

/// A queue zset's (owner, score) pairs in order, from ZRANGE ... WITHSCORES.
pub fn parse_queue(v: Option<&Value>) -> Vec<(String, f64)> {
    v.map(items)
        .unwrap_or(&[])
        .chunks(2)
        .map(|p| (text(&p[0]), text(&p[1]).parse().unwrap_or(0.0)))
        .collect()
}

/// A waiters hash's owner -> attempt (its entries start with the attempt), from HGETALL.
pub fn parse_waiters(v: Option<&Value>) -> HashMap<String, u64> {
    v.map(items)
        .unwrap_or(&[])
        .chunks(2)
        .filter(|p| !text(&p[0]).starts_with('~'))
        .map(|p| {
            let attempt = text(&p[1])
                .split('|')
                .next()
                .and_then(|a| a.parse().ok())
                .unwrap_or(0);
            (text(&p[0]), attempt)
        })
        .collect()
}

fn parse_lock(v: &Value) -> LockSnap {
    let f = items(v);
    let num = |i: usize| f.get(i).map(text).and_then(|s| s.parse().ok()).unwrap_or(0);
    LockSnap {
        owner: f.first().map(text).unwrap_or_default(),
        attempt: num(1),
        token: num(2),
        queue: parse_queue(f.get(3)),
        waiters: parse_waiters(f.get(4)),
        fence: num(5),
    }
}

impl World {
    pub fn snapshot(&mut self, with_keys: bool) -> Snapshot {
        let mut inv = SNAPSHOT.prepare_invoke();
        for lock in &self.locks {
            let k = lock.key_names();
            inv.key(k[0]).key(k[2]).key(k[3]).key(k[1]);
        }
        inv.arg(if with_keys { "1" } else { "0" });
        let v: Value = inv.invoke(&mut self.conns[0]).expect("snapshot");
        let all = items(&v);
        let n = self.locks.len();
        let locks = all[..n].iter().map(parse_lock).collect();
        let int = |v: &Value| text(v).parse().unwrap_or(-3);
        let rows = items(&all[n]).chunks(4);
        let keys = rows.clone().map(|p| (text(&p[0]), int(&p[1]))).collect();
        let sizes = rows
            .map(|p| KeySize {
                key: text(&p[0]),
                entries: int(&p[2]),
                longest: int(&p[3]),
            })
            .collect();
        Snapshot {
            locks,
            keys,
            sizes,
            server_ms: all.get(n + 1).map_or(0, int),
            fz: self.clock.fz(),
            real: self.clock.real(),
        }
    }

    /// 6'. A grant to a crashed client's attempt (a place it left, a late copy of its acquire)
    /// is not judged as a thread's, but bounded as an unsure end's (`Unsure::expired`): from
    /// the crash, or the last late copy of its requests to reach Redis, its places go by their
    /// deadlines. Counted; a later one is a `DeadWaiter` violation.
    pub fn crashed_client_granted(&mut self, p: Prim, i: usize, owner: &str, now_real: f64) {
        let what = format!("{} {i}", p.name());
        let crashed = owner
            .rsplit_once(':')
            .and_then(|(id, _)| self.crashed.get(id))
            .map(|(_, u)| *u);
        let (mut expired, mut by_open) = (crashed.is_none(), false);
        if let Some(u) = crashed {
            let (closed, open) = self.quiet_lag(p, i, u.since_real, now_real);
            let past = |lag| {
                u.expired(
                    now_real,
                    self.back_steps_ms,
                    self.cfg.waiter_timeout_ms,
                    lag,
                )
            };
            expired = past(closed + open);
            by_open = !expired && past(closed);
        }
        if by_open {
            self.stats.add(
                "grant to a crashed client's attempt within the quiet spell it closed",
                1,
            );
        }
        if expired {
            self.violate(
                Check::DeadWaiter,
                format!(
                    "{what} granted to {owner}, of a client that crashed (or sent nothing that \
                     reached Redis) more than two waiter timeouts + 2 s (+ backward steps and \
                     quiet spells) ago{}: its places had to go by their deadlines",
                    if crashed.is_none() {
                        " (a client never seen)"
                    } else {
                        ""
                    }
                ),
            );
        } else {
            self.stats.add("grant to a crashed client's attempt", 1);
        }
    }

    /// F6. A heartbeat of lock (or semaphore) `index` told thread `(c, t)`'s `attempt` to retry:
    /// its place is gone. Redis may do that to a dead waiter, to one whose place a counted
    /// event took (eviction, data loss) or that was granted since, never to a live one (checked
    /// here, before the model stops counting it live).
    pub fn told_retry(
        &mut self,
        prim: Prim,
        index: usize,
        (c, t): (usize, usize),
        attempt: u64,
        now: f64,
    ) {
        let th = &self.clients[c].threads[t];
        let robbed = prim.wait(th).is_some_and(|w| {
            w.attempt == attempt
                && w.place
                && !w.granted_seen
                && w.handoff.is_none()
                && w.live(&self.cfg, now)
                && !w.queue_ttl_passed(&self.cfg, now)
        });
        if robbed {
            let owner = th.owner.clone();
            self.violate(
                Check::WaiterLost,
                format!(
                    "live waiter c{c}:t{t} ({owner} attempt {attempt}) was told to retry by a \
                     heartbeat of {} {index}: its place was dropped",
                    prim.name()
                ),
            );
        }
    }

    /// The thread whose owner id is `owner` (crashed clients' old ids have none).
    pub fn thread_of(&self, owner: &str) -> Option<(usize, usize)> {
        for (c, cl) in self.clients.iter().enumerate() {
            for (t, th) in cl.threads.iter().enumerate() {
                if th.owner == owner {
                    return Some((c, t));
                }
            }
        }
        None
    }

    /// After a request reached Redis (sent at fuzzer time `sent`; `actor` is the thread that
    /// sent it, whose model reacts only after this): look for a grant, check it.
    pub fn after_call(&mut self, actor: Option<(usize, usize)>, sent: f64) {
        let snap = self.snapshot(false);
        self.fifo_mark_unsure(snap.real);
        for (l, cur) in snap.locks.iter().enumerate() {
            let prev = self.checker.last[l].view();
            self.judge_grants(Prim::Lock, l, &prev, &cur.view(), actor, sent, snap.real);
        }
        self.checker.last = snap.locks;
        self.sem_after_call(actor, sent);
    }

    /// After every step: mutual exclusion, Redis's agreement, live waiters' places and
    /// hand-offs, key TTLs.
    pub fn step_checks(&mut self) {
        let snap = self.snapshot(true);
        self.fifo_mark_unsure(snap.real);
        // 3. key hygiene
        let bad: Vec<&(String, i64)> = snap.keys.iter().filter(|(_, p)| *p == -1).collect();
        if !bad.is_empty() {
            self.violate(Check::KeyWithoutTtl, format!("keys without a TTL: {bad:?}"));
        }
        let views: Vec<View> = snap.locks.iter().map(LockSnap::view).collect();
        self.judge_sides(Prim::Lock, &views, snap.fz, snap.real);
        self.keys_bounded(&snap);
        self.checker.last = snap.locks;
        self.sem_step_checks();
        self.left_marks_bounded();
    }

    /// 8''. Every key's size (locks and semaphores: hashes, queues, waiters, leases, hand-offs,
    /// wake lists, fences, receipts): at most `KEY_ENTRIES_FIXED` entries plus
    /// `KEY_ENTRIES_PER_PARTICIPANT` for each participant, and no entry longer than
    /// `KEY_ENTRY_BYTES`. The participants: the owners whose last request reached Redis
    /// within 1.1 queue TTLs (and 2 s) of the snapshot, the longest anything of a departed
    /// owner may stay (a queue place, a waiters entry, a wake list, an expired hold's field
    /// are all gone by then). So a key that grows with the attempts, the requests or the time
    /// rather than with the participants fails, however slowly. Not counted here: the left
    /// marks, whose count follows the attempts that ended within a queue TTL (8' bounds each
    /// mark's age instead); their entries' length is bounded here like every key's.
    pub fn keys_bounded(&mut self, snap: &Snapshot) {
        let queue_ttl = (2 * self.cfg.waiter_timeout_ms).max(600_000) as i64;
        let since = snap.server_ms - queue_ttl - queue_ttl / 10 - 2_000;
        let participants = self
            .last_sent_server_ms
            .values()
            .filter(|sent| **sent >= since)
            .count() as i64;
        let most = KEY_ENTRIES_FIXED + KEY_ENTRIES_PER_PARTICIPANT * participants;
        let mut wrong = vec![];
        for k in &snap.sizes {
            let counted = !k.key.ends_with(":left");
            if counted && k.entries > most {
                wrong.push(format!(
                    "{} has {} entries (at most {most} for {participants} participants)",
                    k.key, k.entries
                ));
            }
            if k.longest > KEY_ENTRY_BYTES {
                wrong.push(format!(
                    "{} has an entry of {} bytes (at most {KEY_ENTRY_BYTES})",
                    k.key, k.longest
                ));
            }
            if counted && participants > 0 {
                let per = (k.entries - KEY_ENTRIES_FIXED).max(0) as f64 / participants as f64;
                self.stats
                    .max("key entries per participant (x100)", (per * 100.0) as u64);
            }
            let role = k.key.rsplit_once('}').map_or("", |(_, r)| r);
            let role = if role.contains(":wake:") {
                ":wake:*"
            } else {
                role
            };
            self.stats
                .max(&format!("key entries {role:?}"), k.entries.max(0) as u64);
            self.stats.max("participants", participants as u64);
            self.stats.max("key entry bytes", k.longest.max(0) as u64);
        }
        if !wrong.is_empty() {
            self.violate(Check::KeySize, wrong.join("; "));
        }
    }

    /// 8'. The left marks' size (lock and semaphore): a mark lives the queue's TTL, and the mark
    /// that finds the earliest one a tenth of that past its end drops every expired one
    /// (state.lua, `mark_left`). So, as of the latest mark (the key's TTL tells when: it is
    /// set to the queue's TTL by every mark), no field may belong to an owner whose last
    /// request reached Redis more than 1.1 queue TTLs before it, however many marks keep
    /// coming: a constant plus the owners that marked within that window (the live
    /// participants and those that left lately). Allowed: 2 s for the fuzzer's reading of
    /// the server's clock; nothing else. A field of an owner that never sent a request is
    /// a violation too.
    pub fn left_marks_bounded(&mut self) {
        let queue_ttl = (2 * self.cfg.waiter_timeout_ms).max(600_000) as i64;
        let mut keys: Vec<String> = self
            .locks
            .iter()
            .map(|l| format!("{}:left", l.key_names()[0]))
            .collect();
        keys.extend(
            self.sems
                .iter()
                .map(|s| format!("{}:left", s.key_names()[0])),
        );
        for key in keys {
            let mut pipe = redis::pipe();
            pipe.cmd("HKEYS")
                .arg(&key)
                .cmd("PTTL")
                .arg(&key)
                .cmd("TIME");
            let Ok((fields, pttl, time)): Result<(Vec<String>, i64, (i64, i64)), _> =
                pipe.query(&mut self.conns[0])
            else {
                continue;
            };
            if pttl <= 0 {
                continue;
            }
            let now = time.0 * 1000 + time.1 / 1000;
            let last_mark = now + pttl - queue_ttl;
            let oldest_allowed = last_mark - queue_ttl - queue_ttl / 10 - 2_000;
            let stale: Vec<String> = fields
                .iter()
                .filter(|f| *f != "~")
                .filter(|f| {
                    self.last_sent_server_ms
                        .get(*f)
                        .is_none_or(|sent| *sent < oldest_allowed)
                })
                .map(|f| {
                    let age = self.last_sent_server_ms.get(f).map(|s| last_mark - s);
                    format!("{f} (last request {age:?}ms before the latest mark)")
                })
                .collect();
            if !stale.is_empty() {
                self.violate(
                    Check::KeySize,
                    format!(
                        "{key}: {} of {} left marks outlived 1.1 queue TTLs ({}ms): {}",
                        stale.len(),
                        fields.len().saturating_sub(1),
                        queue_ttl + queue_ttl / 10,
                        stale.join(", ")
                    ),
                );
            }
        }
    }

    /// Of the hand-offs `(wake list, message prefix, what, earliest end of its lease)` that
    /// Redis still has for live waiters and no waker popped: those whose wake-up is not in the
    /// wake list. Nothing but a pop, the eviction of the list or the end of the hold may take
    /// it (4''), since the waiter learns of its hand-off from it alone. The list is read after
    /// the snapshot: a reply that comes back after the lease's earliest end is not judged (the
    /// list lives as long as the grant's lease, and may just have gone with it), counted.
    pub fn wakeups_missing(
        &mut self,
        unpopped: Vec<(String, String, String, f64)>,
    ) -> Vec<(Check, String)> {
        let mut missing = vec![];
        for (key, prefix, what, earliest_end) in unpopped {
            let msgs: Vec<String> = redis::cmd("LRANGE")
                .arg(&key)
                .arg(0)
                .arg(-1)
                .query(&mut self.conns[0])
                .unwrap_or_default();
            if msgs.iter().any(|m| m.starts_with(&prefix)) {
                continue;
            }
            if self.clock.fz() >= earliest_end {
                self.stats.add(
                    "wake list read after the hand-off's lease could end: not judged",
                    1,
                );
                continue;
            }
            missing.push((
                Check::WakeupLost,
                format!(
                    "the hand-off of {what} is in Redis, but its wake-up {prefix:?}... is gone from {key} ({msgs:?}) and no waker popped it"
                ),
            ));
        }
        missing
    }

    /// Whether the operator set the capacity of the semaphore whose hash is `key`.
    fn capacity_was_set(&self, key: &str) -> bool {
        self.sems
            .iter()
            .position(|s| s.key_names()[0] == key)
            .is_some_and(|i| self.sem_checker.capacity_set[i])
    }

    /// Whether every place in a queue and every waiters entry is a crashed client's. Nobody
    /// purges those until a script runs on that lock or semaphore (its next user's acquire, or a
    /// live waiter's heartbeat), and in the quiet phase no live client may touch it again (each
    /// goes back to its own lock only if it was not served on another). Exempt from "nothing
    /// queued", with the bound the library promises for such leftovers: the keys live at most
    /// the queue TTL, checked with the other keys' TTLs.
    pub fn only_crashed(&self, queue: &[(String, f64)], waiters: &HashMap<String, u64>) -> bool {
        let crashed = |owner: &str| {
            owner
                .rsplit_once(':')
                .is_some_and(|(id, _)| self.crashed.contains_key(id))
        };
        queue.iter().all(|(o, _)| crashed(o)) && waiters.keys().all(|o| crashed(o))
    }

    /// The end state after the quiet phase: every lock free, nothing queued, and only the fence,
    /// tombstones living out a released lease and short-lived wake lists left.
    /// `Err(Unsettled::State)`: something is still held or queued (the quiet phase goes on);
    /// `Err(Unsettled::Overlong)`: all is at rest, but a key lives longer than the bound of its
    /// kind (a violation at once: nothing at rest pushes, so waiting would only let the key
    /// expire, and a judge that waits for that lets through any TTL up to its time limit).
    pub fn settled(&mut self) -> Result<(), Unsettled> {
        let snap = self.snapshot(true);
        let (mut wrong, mut left_for_next_user) = self.sem_unsettled();
        for (l, cur) in snap.locks.iter().enumerate() {
            let free = cur.token == 0 && cur.owner.is_empty();
            if !free {
                wrong.push(format!("lock {l} held by {:?}", cur.owner));
            }
            if !cur.queue.is_empty() || !cur.waiters.is_empty() {
                if free && self.only_crashed(&cur.queue, &cur.waiters) {
                    // see `only_crashed`: bounded below by the queue keys' TTL
                    left_for_next_user
                        .extend(self.locks[l].key_names()[2..].iter().map(|k| k.to_string()));
                    self.stats.add(
                        "left for the next user: crashed clients' places on a free lock",
                        1,
                    );
                } else {
                    wrong.push(format!(
                        "lock {l} queue {:?} waiters {:?}",
                        cur.queue, cur.waiters
                    ));
                }
            }
        }
        let mut overlong = vec![];
        // a backward clock step lengthens every TTL by as much as the clock is now behind
        let behind = self.max_offset_ms - self.server.offset_ms();
        for (key, pttl) in &snap.keys {
            let ok = if key.ends_with(":fence") {
                // every grant sets the fence's TTL to `fence_ttl` (1 h here, world.rs)
                *pttl > 0 && *pttl <= 3_600_000 + behind
            } else if key.ends_with("}:sem") && self.capacity_was_set(key) {
                // a stored capacity (`~set`) keeps the hash as long as the fence
                *pttl > 0 && *pttl <= 3_600_000 + behind
            } else if key
                .strip_suffix(":leases")
                .is_some_and(|hash| hash.ends_with("}:sem") && self.capacity_was_set(hash))
            {
                // the leases live as long as their hash (sem.lua, keep_sem): an expired hold's
                // entry waits there for the next script, as its field waits in the hash
                *pttl > 0 && *pttl <= 3_600_000 + behind
            } else if key.ends_with("}:sem")
                || key.ends_with("}:sem:leases")
                || key.ends_with("}:sem:handoffs")
            {
                // a semaphore's hash without live holds (checked above): kind, capacity, the
                // receipts and expired holds, kept as long as its last queue could live
                // (QUEUE_TTL), with its leases and hand-offs
                let queue_ttl = (2 * self.cfg.waiter_timeout_ms).max(600_000) as i64;
                *pttl > 0 && *pttl <= queue_ttl + behind
            } else if !key.contains("}:") {
                // a lock hash, free (checked above): a tombstone for the rest of a lease
                *pttl > 0 && *pttl <= self.cfg.lease_ms.1 as i64 + behind
            } else if left_for_next_user.contains(key) {
                // the queue keys of a free primitive where only crashed clients wait, which no
                // live client touches: they go with the next script run there, or their TTL
                let queue_ttl = (2 * self.cfg.waiter_timeout_ms).max(600_000) as i64;
                *pttl > 0 && *pttl <= queue_ttl + behind
            } else if key.contains(":wake:") {
                // a "retry" is pushed with the waiter timeout, and so is a grant told again; a
                // grant's first push gives its list the grant's lease (at most the longest), and
                // its message outlives the grant when the hold is lost with its hash (evicted).
                // A push never shortens the list's TTL (keep_list), so the list lives as long as
                // the longest message pushed since it was last empty, which may have been
                // popped: a "retry" left behind a popped grant keeps the grant's TTL. Lets pass
                // a list without a grant living up to the longest lease; bound: the longer of
                // the longest lease and the waiter timeout
                let bound = self.cfg.lease_ms.1.max(self.cfg.waiter_timeout_ms);
                *pttl > 0 && *pttl <= bound as i64 + behind
            } else if key.ends_with(":left") {
                // the left marks of attempts whose acquire could still arrive (leave.lua): they
                // live as long as a ghost waiter's queue keys would have (QUEUE_TTL)
                let queue_ttl = (2 * self.cfg.waiter_timeout_ms).max(600_000) as i64;
                *pttl > 0 && *pttl <= queue_ttl + behind
            } else {
                false
            };
            if !ok {
                overlong.push(format!("key {key} (pttl {pttl})"));
            }
        }
        if !wrong.is_empty() {
            wrong.extend(overlong);
            Err(Unsettled::State(wrong.join("; ")))
        } else if !overlong.is_empty() {
            Err(Unsettled::Overlong(overlong.join("; ")))
        } else {
            Ok(())
        }
    }
}
