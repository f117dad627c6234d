//! The checker: merges the histories into one timeline and looks for violations.
//!
//! 1. `overlap`: two owners inside one lock's critical section at once (ACQ..REL intervals
//!    overlap; a SIGKILLed holder's interval ends at the kill, a force-unlocked one's at the
//!    force-unlock) that no fault explains.
//!    Explained: a SIGSTOP of the earlier holder's process in [its REQ, later ACQ] or of the later
//!    holder's process in [its REQ, its ACQ], a proxy fault that holds back or cuts all traffic
//!    (drop, black hole, latency) or a Redis restart in [earlier of the two REQs, later ACQ]. The
//!    REQ side matters: a grant whose reply the network held back (or whose process was stopped)
//!    reaches its thread late, with less of its lease left. An unexplained overlap whose earlier
//!    holder saw its lease lost is reported as `overlap_lease_lost` (a pause that no fault made:
//!    the watchdog could not renew in time).
//!    Never explained: a late delivery (one request of an abandoned connection reaching Redis
//!    after its thread moved on: the per-attempt numbers and tokens must make it harmless), a
//!    force-unlock other than of the hold it named, and a server clock step. Steps back only
//!    lengthen leases on the server; a forward step of S shortens every lease on the server by S
//!    (Redis TTLs follow the wall clock, a documented limit) while the holder's estimate does
//!    not know, so a step larger than the lease left on the server could give two owners. The
//!    harness keeps S below a quarter of the lease: renewals come every third of it, so the
//!    server holds at least two thirds of a lease when the step comes, and no exemption is
//!    needed (`clock_step_too_large` if the history shows a larger forward step).
//!    `expired_grant`: `lock()` returned a guard whose own estimate of the lease left was 0 (the
//!    library knew the hold might be someone else's already), with no stop of its process
//!    between the call and the ACQ line (a stop there ends the lease after the hand-over).
//! 2. `stale_token_accepted` / `token_reused` / `token_order` / `state_lost`: the fenced resource
//!    accepted a token lower than one it accepted earlier (in Redis's order), two holders wrote
//!    with one token, holds were granted tokens out of order, or the resource was reset although
//!    no restart without persistence happened. Tokens are only compared, never counted: they are
//!    max(last + 1, server time in us), so neither dense nor starting at 1.
//! 3. `lost_update`: per lock, the counter's read-modify-writes must chain (each `before` equals
//!    the previous `after`) except across an explained overlap, a force-unlocked hold, the
//!    window of a fault that explains overlaps, a holder killed mid-section, or a restart without
//!    persistence (the counter then starts over at 0).
//! 4. `fifo`: a live waiter overtaken: A.REQ + 100 ms < B.REQ but B.ACQ < A.ACQ on one lock,
//!    with no fault (but a clock step or a force-unlock, which must keep the order) and no error
//!    of A's or B's thread in [A.REQ, A.ACQ]. B.REQ dates back over the calls of B's thread on
//!    that lock right before it (within 10 s) whose request or hold may still be on the server:
//!    a `lock()` call that failed (its request may reach Redis late, after a black hole say, and
//!    be granted when it is next in line) or a hold whose release failed (a restart with AOF
//!    keeps it until its lease runs out). The thread's next call takes such a hold over as its
//!    own (acquire.lua: "an older attempt of this thread holds it") instead of queueing: the
//!    thread never left the head of the line.
//! 5. `liveness`: in the quiet phase after the faults, a request not granted within lease + 3 s,
//!    or an error.
//! 6. `keys_left` and 7. `panic` / `worker_exit`: from the end state the parent collected.
//! 8. Force-unlocks (the operator names the hold: owner and token, as `status()` showed them).
//!    The named hold ends at the force-unlock for mutual exclusion (unless every call is known to
//!    have found it gone); if the force-unlock released it (the lost reply says so, or a call
//!    returned true), its thread must find out: its release fails as not held, or the hold is
//!    marked lost (`force_unnoticed`); the next hold of the lock must have a greater token
//!    (`force_token_order`); and the same hold can be released once only
//!    (`force_released_twice`: the library's retry of the lost reply or the operator's retry
//!    released something).
//!    `hold_lost`: a hold the operator did not name was lost (its release found it not held, or
//!    `is_lost()`) with no fault in [its REQ, the return of its release] that could take a lease
//!    away (a proxy fault, a restart, a late delivery, a SIGSTOP of its process): for instance a
//!    retried force-unlock that released the NEXT holder.
//!
//! Recovery: for each SIGKILL of a process that held a lock while another process waited for
//! it, the time from the kill to the next ACQ of that lock by another process. `slow_recovery`
//! when it exceeds lease + 1 s with no other fault in that window (nor a clock step in the lease
//! before it: a step back lengthens the dead holder's lease on the server); with others, lease +
//! 1 s + for each its length, a lease, a read timeout and three janitor intervals (a clock step:
//! those and 5 s).
//!
//! 9. Failovers (Sentinel and Cluster modes). Replication is asynchronous: a master SIGKILLed
//!    (`kill-master`) may take its last writes with it, and the replica promoted in its place
//!    hands the lock out as if they never happened. Breaks of the rules above that this
//!    explains are counted apart, under `explained_by_async_replication` in the summary, and
//!    are no violations; everything else still is. Conservative: only a break whose earlier hold
//!    h1 straddles a master kill K counts, with evidence that the new master never saw h1:
//!    - *a lost grant*: h1 asked before K (its request reached the old master), and its token is
//!      greater than the lock's fencing counter on the promoted replica (read once the replica
//!      saw its link go down: it had every grant up to that counter and none after, as tokens
//!      only grow) and not above the server clock at K plus half the promotion delay (granted
//!      by the old master: tokens are max(last + 1, server µs), and no replica is promoted within
//!      a second of the kill here);
//!    - for an overlap (and the lost update or stale token it brings), h2 was granted by a later
//!      master (its token is above the server clock at K plus half the promotion delay) while
//!      h1 could still be within its lease (h2 acquired within a lease of K: no renewal reached
//!      the dead master after K). Later than that, h1 outlived its own lease, which it would
//!      have done with its grant replicated too: not replication's doing;
//!    - for tokens out of order, h2 asked after K (a later master granted it), or both were
//!      granted in a `SENTINEL FAILOVER`'s split (below), each master from its own clock;
//!    - for a hold found lost, it was such a lost grant (`holds_lost_unreplicated_grant`).
//!
//!    A graceful failover (`failover`: `SENTINEL FAILOVER`, `CLUSTER FAILOVER`) explains none
//!    of these, nor a hold lost, with one exception. `SENTINEL FAILOVER` is not atomic: the
//!    promoted replica takes writes at once, the old master until the sentinels convert it, and
//!    the clients move when they see the sentinels' switch (their master watch asks every
//!    200 ms). A hold found lost that was granted before the switch + 1.5 s with a token above
//!    the promoted replica's fencing counter at its promotion (read by the harness the moment
//!    it says `role:master`) was granted in that split, and is counted under
//!    `holds_lost_sentinel_split`; so is an overlap of two such holds (`holds_overlapped`, and
//!    the lost update it brings): one master granted each. Only replica acknowledgements from
//!    every replica prevent them (docs/deployments.md says so; `tests/it/sentinel.rs` shows it).
//!    A master kill can bring the same split: Sentinel may fail over the replica it has just
//!    promoted too (it stalled for the `down-after-milliseconds`, busy with a full sync), and
//!    that one stays a writable master until the sentinels convert it. The harness watches the
//!    data nodes during a kill and, when a node is promoted while another is a master, reads
//!    its fencing counters (`split=ok split_fence:<lock>=N`); holds granted in that split (by
//!    the switch, the kill's `promoted_after_ms`, + 1.5 s) count as above.
//!    A master kill also excuses a hold whose lease ran out while no master could renew it
//!    (`holds_lost_failover`: the guard says so, no safety break), and both kinds excuse FIFO
//!    order while they run, as every fault does.
//!    `failovers` in the summary counts the grants each kill lost
//!    (`grants_lost_by_replication`) and the promotion times.
//!
//! 10. The `sem` and `rw` workloads (`Params::capacity`: a semaphore's capacity, or 2^30 for a
//!     read/write lock whose write takes every permit). In place of 1.-4.:
//!     - `over_capacity`: at a hold's ACQ, the holds of other threads still live (ACQ to UNLOCK;
//!       a SIGKILLed one's to the kill, a force-released one's to the force-release) and the new
//!       one hold more permits together than the capacity (for `rw`: a write beside any other
//!       hold), after taking out each hold whose pairing with the new one is explained as an
//!       overlap is in 1. (a SIGSTOP of either process, a proxy fault, a Redis restart) or by
//!       asynchronous replication (9.); each explained hold counts once under
//!       `explained.holds_over_capacity_<why>`. `over_capacity_lease_lost` when a hold left in
//!       saw its hold lost. The summary's `most_permits_held_at_once` is the most any name saw
//!       (explained overruns included), `..._unexplained` the most without the explained holds
//!       (the capacity, when the run filled the semaphore; above it only with a violation).
//!     - `token_reused`: two holds of one name got one token; `token_order`: a hold asked after
//!       another was granted (its REQ after that one's ACQ, the only order the histories know
//!       when many hold at once) got a token not greater. Explained: a restart without
//!       persistence between the two grants (the comparison starts over after one), replication.
//!     - the counter chain (3.) and the fenced resource (2.) over the writes of a read/write lock
//!       (reads write nothing); a semaphore's holders share it, so `sem` has neither.
//!     - `fifo` as 4., with two more conditions: B's ACQ came FIFO_MARGIN before A's (grants
//!       made together are logged in any order: A may have been granted first and still be
//!       popping its wake-up), and no stop of A's process (a waiter's hiccup too) while it waited.
//!     - 5.-8. as they are; a force-release's next hold (8.) is the first asked after it began.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde_json::{json, Value};

use super::history::{detail_value, Event, FaultKind, Fence, Kind};
use super::workload::{JANITOR, READ_TIMEOUT};

const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;
/// How much later B must have asked than A before B's earlier grant counts as overtaking.
const FIFO_MARGIN: u64 = 100 * MS;
/// Half the shortest time from a master's SIGKILL to a replica's promotion (Sentinel's
/// `down-after-milliseconds` and Cluster's `cluster-node-timeout` are 1000 here), in µs: a token
/// above the server clock at the kill plus this was granted by a later master, one at most that
/// by the killed one (tokens are server µs, or the last token + 1; see 9.).
const PROMOTION_GAP_US: u64 = 500_000;
/// How long a failed `lock()` call's request may still be granted (it reached Redis late), or a
/// hold whose release failed may stay, for the thread's next call to take it over: a generous
/// bound (held requests come out within a few seconds; a hold nobody renews lasts a lease).
const FAILED_CALL_REACH: u64 = 10 * S;

#[derive(Clone, Debug)]
pub struct Fault {
    pub kind: FaultKind,
    pub start: u64,
    pub end: u64,
    pub target: Option<u32>,
    /// The `key=value` words of the start and of the end line.
    pub detail: String,
    pub end_detail: String,
}

impl Fault {
    fn overlaps(&self, from: u64, to: u64) -> bool {
        self.start <= to && self.end >= from
    }
    fn is_volatile_restart(&self) -> bool {
        self.kind == FaultKind::RestartVolatile
    }
    /// Faults that may let two owners hold at once: every connection held back or cut, or the
    /// server gone for a while.
    fn explains_overlap(&self) -> bool {
        self.kind.is_proxy() || self.kind.is_restart()
    }
    /// Faults that may take a hold's lease away (the SIGSTOPs only of the holder's process). A
    /// waiter's hiccup stops its whole process, the holds of its other threads too: a release
    /// under way then may be sent again after more than the last 8 releases of a busy lock,
    /// whose receipts its retry looks for (docs/guarantees.md, 2.), and report a release that
    /// was applied as not held. It still explains no overtake and no lost place.
    fn may_lose_hold(&self, pid: u32) -> bool {
        self.explains_overlap()
            || self.kind == FaultKind::LateDelivery
            || ((self.kind.is_stop() || self.kind == FaultKind::WaiterHiccup)
                && self.target == Some(pid))
    }
    /// A force-unlock: did some call of it release the named hold, and how many did?
    fn force_releases(&self) -> usize {
        let d = &self.end_detail;
        usize::from(detail_value(d, "first") == Some("released"))
            + usize::from(detail_value(d, "lib") == Some("true"))
            + usize::from(detail_value(d, "retry") == Some("true"))
    }
    /// A force-unlock that may have released its hold: not when every call's outcome is known
    /// and none released (then the hold had ended before, and keeps no exemption).
    fn may_have_released(&self) -> bool {
        let d = &self.end_detail;
        self.force_releases() > 0
            || !matches!(
                detail_value(d, "first"),
                Some("not_held" | "noscript" | "not-trapped")
            )
            || detail_value(d, "lib") != Some("false")
            || detail_value(d, "retry") != Some("false")
    }
}

/// What the parent saw at the end of the run.
#[derive(Default)]
pub struct EndState {
    /// (worker index, pid, exit code or None when killed by a signal, killed by the harness)
    pub exits: Vec<(usize, u32, Option<i32>, bool)>,
    /// Workers whose stderr mentions a panic: (pid, first such line).
    pub panics: Vec<(u32, String)>,
    /// Keys left after the run that should not be there: (key, PTTL).
    pub leftover_keys: Vec<(String, i64)>,
}

/// One call of `lock()` by one thread and what followed.
#[derive(Clone, Debug)]
struct Attempt {
    pid: u32,
    thread: String,
    lock: String,
    /// Permits asked (1 for a mutex; a write of a read/write lock asks them all).
    permits: u64,
    req: u64,
    acq: Option<u64>,
    token: u64,
    lease_left_us: Option<u64>,
    err: Option<u64>,
    /// End of the hold: UNLOCK / REL (stamped before unlock), or the kill of the process.
    end: Option<u64>,
    /// The hold is over on the server for sure: released, or found not held.
    gone_for_sure: bool,
    /// The release failed, or the hold was marked lost.
    rel_lost: bool,
    /// The release found the lock no longer this hold's, or the hold was marked lost.
    lost_on_server: bool,
    /// REL said ok and not lost.
    rel_ok: bool,
    /// When the release call returned (its outcome may depend on anything until then).
    rel_done: Option<u64>,
    /// Start of the first force-unlock that named this hold.
    forced: Option<u64>,
    /// The REQ this call's place in line dates from for the FIFO check (see 4.).
    fifo_req: u64,
    cs: Option<(u64, u64, Option<u64>)>,
}

pub struct Report {
    pub violations: Vec<(String, String)>,
    pub summary: Value,
}

#[derive(Default)]
struct Counts(BTreeMap<String, u64>);

impl Counts {
    fn add(&mut self, k: &str) {
        *self.0.entry(k.to_string()).or_default() += 1;
    }
    fn json(&self) -> Value {
        json!(self.0)
    }
}

fn ms(ns: u64) -> f64 {
    (ns as f64 / 1e6 * 10.0).round() / 10.0
}

pub struct Params {
    pub scenario: String,
    /// The permits one name has: `None` for the mutex workload (one holder), the semaphore's
    /// capacity for `sem`, 2^30 for `rw` (a read takes 1, a write all); see 10.
    pub capacity: Option<u64>,
    pub lease_ns: u64,
    /// The largest forward step of the server clock the harness makes.
    pub max_forward_step_ns: u64,
}

pub fn check(files: Vec<Vec<Event>>, torn: usize, end: &EndState, p: &Params) -> Report {
    let mut found = Findings::default();

    let run = read_parent(&files);
    let faults = &run.faults;
    let stats = fault_stats(faults);
    let kills = master_kills(faults);
    let splits = sentinel_splits(faults);
    let repl = Replication {
        kills: &kills,
        splits: &splits,
        lease_ns: p.lease_ns,
    };
    check_clock_steps(stats.largest_forward_step_ms, p, &mut found);
    let kill_time = kill_times(faults);

    let WorkerLog {
        mut attempts,
        errors,
        fences,
        counts,
    } = read_attempts(&files);
    end_killed_holds(&mut attempts, &kill_time);
    date_fifo_reqs(&mut attempts);
    let forced_by = mark_force_unlocks(faults, &mut attempts, &mut found);

    check_expired_grants(&attempts, faults, &files, &mut found);
    let by_lock = group_by_lock(&attempts);
    let mut marks = OverlapMarks::default();
    let mut counts = counts;
    let mut most_held: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for (lock, list) in &by_lock {
        let holds = holds_in_order(list);
        match p.capacity {
            None => {
                check_overlaps(lock, &holds, faults, &repl, &files, &mut marks, &mut found);
                check_token_order(lock, &holds, faults, &repl, &files, &mut found);
                check_counter_chain(lock, &holds, faults, &files, &marks, &mut found);
                check_fifo(
                    lock, list, faults, &errors, &files, 0, p.lease_ns, &mut found,
                );
            }
            Some(cap) => {
                let most = check_capacity(
                    lock, &holds, cap, faults, &repl, &files, &mut marks, &mut found,
                );
                most_held.insert(lock.clone(), most);
                check_shared_tokens(lock, &holds, faults, &repl, &files, &mut found);
                // the counter and the fenced resource: a read/write lock's writes only
                let writes: Vec<&Attempt> =
                    holds.iter().copied().filter(|h| h.permits >= cap).collect();
                check_counter_chain(lock, &writes, faults, &files, &marks, &mut found);
                check_fifo(
                    lock,
                    list,
                    faults,
                    &errors,
                    &files,
                    FIFO_MARGIN,
                    p.lease_ns,
                    &mut found,
                );
                for h in &holds {
                    counts.add(&if cap == super::workload::RW_CAPACITY {
                        if h.permits >= cap {
                            "acquisitions_write".to_string()
                        } else {
                            "acquisitions_read".to_string()
                        }
                    } else {
                        format!("acquisitions_of_{}_permits", h.permits)
                    });
                }
            }
        }
    }
    let forced_holds = check_force_unlocks(
        &forced_by,
        &attempts,
        faults,
        p.capacity.is_some(),
        &files,
        &mut found,
    );
    check_lost_holds(&attempts, faults, &repl, &files, &mut found);
    let epochs_per_lock =
        check_fenced_resource(&fences, &attempts, faults, &repl, &files, &mut found);
    let failovers = failover_stats(faults, &kills, &attempts);
    let worst_quiet_wait =
        check_liveness(&attempts, &run.phases, &kill_time, p, &files, &mut found);
    let recoveries = check_recovery(faults, &by_lock, p, &files, &mut found);
    check_end_state(end, &mut found);
    check_torn_lines(torn, end, &mut found);

    let measures = Measures {
        most_held,
        duration_ns: run.last_t.saturating_sub(run.first_t),
        counts,
        torn,
        forced_holds,
        holds_cut_by_force: marks.cut_by_force.len(),
        recoveries,
        worst_quiet_wait,
        epochs_per_lock,
        failovers,
    };
    assemble_report(p, &stats, measures, found)
}

/// The violations found, and the breaks a fault or a rule explained instead (counted by kind):
/// asynchronous replication's apart (see 9.).
#[derive(Default)]
struct Findings {
    violations: Vec<(String, String)>,
    explained: Counts,
    replication: Counts,
}

impl Findings {
    fn violation(&mut self, kind: &str, message: String) {
        self.violations.push((kind.into(), message));
    }
}

/// A hold, named by its owner and the time of its ACQ.
type HoldKey = (u32, String, u64);

impl Attempt {
    /// A call of `lock()` at the REQ event `e`, nothing known yet of what followed.
    fn new(e: &Event, lock: &str, permits: u64) -> Attempt {
        Attempt {
            pid: e.pid,
            thread: e.thread.clone(),
            lock: lock.to_string(),
            permits,
            req: e.t,
            acq: None,
            token: 0,
            lease_left_us: None,
            err: None,
            end: None,
            gone_for_sure: false,
            rel_lost: false,
            lost_on_server: false,
            rel_ok: false,
            rel_done: None,
            forced: None,
            fifo_req: e.t,
            cs: None,
        }
    }
    fn hold_key(&self) -> HoldKey {
        (self.pid, self.thread.clone(), self.acq.unwrap())
    }
    fn same_thread(&self, other: &Attempt) -> bool {
        self.pid == other.pid && self.thread == other.thread
    }
}

// ---- reading the histories ----

/// The parent's record of the run: the faults (start to end), when each phase began, and the
/// time span of all events.
struct ParentLog {
    faults: Vec<Fault>,
    phases: HashMap<String, u64>,
    first_t: u64,
    last_t: u64,
}

/// Pairs fault starts with their ends (a fault never ended stays open until the last event),
/// sorted by start; the phases the parent announced.
fn read_parent(files: &[Vec<Event>]) -> ParentLog {
    let mut starts: HashMap<u64, (FaultKind, u64, Option<u32>, String)> = HashMap::new();
    let mut faults: Vec<Fault> = Vec::new();
    let mut phases: HashMap<String, u64> = HashMap::new();
    let mut first_t = u64::MAX;
    let mut last_t = 0;
    for e in files.iter().flatten() {
        first_t = first_t.min(e.t);
        last_t = last_t.max(e.t);
        match &e.kind {
            Kind::FaultStart {
                id,
                kind,
                target,
                detail,
            } => {
                starts.insert(*id, (*kind, e.t, *target, detail.clone()));
            }
            Kind::FaultEnd { id, detail } => {
                if let Some((kind, start, target, start_detail)) = starts.remove(id) {
                    faults.push(Fault {
                        kind,
                        start,
                        end: e.t,
                        target,
                        detail: start_detail,
                        end_detail: detail.clone(),
                    });
                }
            }
            Kind::Phase { name } if e.thread == "parent" => {
                phases.insert(name.clone(), e.t);
            }
            _ => {}
        }
    }
    for (_, (kind, start, target, detail)) in starts {
        // a fault the parent never ended (it panicked): open until the end
        faults.push(Fault {
            kind,
            start,
            end: last_t,
            target,
            detail,
            end_detail: String::new(),
        });
    }
    faults.sort_by_key(|f| f.start);
    ParentLog {
        faults,
        phases,
        first_t,
        last_t,
    }
}

/// When each SIGKILLed process was killed.
fn kill_times(faults: &[Fault]) -> HashMap<u32, u64> {
    faults
        .iter()
        .filter(|f| f.kind.is_kill())
        .filter_map(|f| f.target.map(|pid| (pid, f.start)))
        .collect()
}

/// What the faults were, for the summary.
struct FaultStats {
    counts: Counts,
    details: Counts,
    largest_forward_step_ms: i64,
}

/// Counts the faults by kind and by outcome (late deliveries, force-unlocks, clock steps), and
/// finds the largest forward clock step.
fn fault_stats(faults: &[Fault]) -> FaultStats {
    let mut counts = Counts::default();
    let mut details = Counts::default();
    let mut largest_forward_step_ms = 0i64;
    for f in faults {
        counts.add(f.kind.name());
        match f.kind {
            FaultKind::LateDelivery => {
                let script = detail_value(&f.detail, "script").unwrap_or("?");
                let reply = detail_value(&f.end_detail, "reply").unwrap_or("?");
                details.add(&format!("late-delivery:{script}"));
                details.add(&format!("late-delivery:{script}->{reply}"));
                if detail_value(&f.end_detail, "delivered") != Some("1") {
                    details.add("late-delivery:not-delivered");
                }
                if detail_value(&f.end_detail, "client_closed_after_ms") == Some("never") {
                    details.add("late-delivery:client-kept-waiting");
                }
            }
            FaultKind::ForceUnlock => {
                let first = detail_value(&f.end_detail, "first").unwrap_or("?");
                details.add(&format!("force-unlock:first-{first}"));
                if f.force_releases() > 0 {
                    details.add("force-unlock:released");
                }
            }
            FaultKind::ClockStep => {
                let delta: i64 = detail_value(&f.detail, "delta_ms")
                    .and_then(|d| d.parse().ok())
                    .unwrap_or(0);
                details.add(if delta < 0 {
                    "clock-step:back"
                } else {
                    "clock-step:forward"
                });
                largest_forward_step_ms = largest_forward_step_ms.max(delta);
            }
            _ => {}
        }
    }
    FaultStats {
        counts,
        details,
        largest_forward_step_ms,
    }
}

/// `clock_step_too_large`: a forward step beyond what the overlap rules assume (see 1.).
fn check_clock_steps(largest_forward_step_ms: i64, p: &Params, found: &mut Findings) {
    if largest_forward_step_ms as u64 * MS > p.max_forward_step_ns {
        found.violation(
            "clock_step_too_large",
            format!(
                "the server clock stepped forward by {largest_forward_step_ms} ms, more than the {} ms the checker assumes",
                p.max_forward_step_ns / MS
            ),
        );
    }
}

/// One accepted, rejected or unknown write to the fenced resource:
/// (t, lock, token, outcome, pid, thread).
type FenceWrite = (u64, String, u64, Fence, u32, String);

/// What the workers' histories say.
struct WorkerLog {
    /// Every `lock()` call, per thread in program order.
    attempts: Vec<Attempt>,
    /// When each thread (pid, thread) got an error.
    errors: HashMap<(u32, String), Vec<u64>>,
    fences: Vec<FenceWrite>,
    counts: Counts,
}

/// Follows each thread through its calls: REQ opens an attempt, ACQ / CS / UNLOCK / REL and a
/// failed `lock()` fill it in; counts the events for the summary.
fn read_attempts(files: &[Vec<Event>]) -> WorkerLog {
    let mut attempts: Vec<Attempt> = Vec::new();
    let mut errors: HashMap<(u32, String), Vec<u64>> = HashMap::new();
    let mut fences: Vec<FenceWrite> = Vec::new();
    let mut counts = Counts::default();
    for file in files {
        let mut open: HashMap<String, usize> = HashMap::new(); // thread -> attempt index
        for e in file {
            let key = e.thread.clone();
            match &e.kind {
                Kind::Req { lock, permits } => {
                    counts.add("requests");
                    attempts.push(Attempt::new(e, lock, *permits));
                    open.insert(key, attempts.len() - 1);
                }
                Kind::Acq {
                    token,
                    lease_left_us,
                    ..
                } => {
                    counts.add("acquisitions");
                    if let Some(&i) = open.get(&key) {
                        attempts[i].acq = Some(e.t);
                        attempts[i].token = *token;
                        attempts[i].lease_left_us = *lease_left_us;
                    }
                }
                Kind::Cs { before, after, .. } => {
                    counts.add("critical_sections");
                    if let Some(&i) = open.get(&key) {
                        attempts[i].cs = Some((e.t, *before, *after));
                    }
                }
                Kind::Fence {
                    lock,
                    token,
                    outcome,
                } => {
                    counts.add(match outcome {
                        Fence::Ok { .. } => "fenced_writes_accepted",
                        Fence::Stale => "fenced_writes_rejected_stale",
                        Fence::Unknown => "fenced_writes_unknown",
                    });
                    fences.push((
                        e.t,
                        lock.clone(),
                        *token,
                        outcome.clone(),
                        e.pid,
                        e.thread.clone(),
                    ));
                }
                Kind::Unlock { .. } => {
                    if let Some(&i) = open.get(&key) {
                        attempts[i].end = Some(e.t);
                    }
                }
                Kind::Rel {
                    ok,
                    not_held,
                    lost,
                    done,
                    ..
                } => {
                    if !ok {
                        counts.add("releases_failed");
                    }
                    if *not_held {
                        counts.add("releases_not_held");
                    }
                    if *lost {
                        counts.add("holds_marked_lost");
                    }
                    if let Some(i) = open.remove(&key) {
                        attempts[i].end = Some(e.t);
                        attempts[i].rel_lost = !ok || *lost;
                        attempts[i].lost_on_server = *not_held || *lost;
                        attempts[i].rel_ok = *ok && !*lost;
                        attempts[i].rel_done = *done;
                        attempts[i].gone_for_sure = *ok || *not_held;
                    }
                }
                Kind::Err { phase, .. } => {
                    counts.add("errors");
                    errors.entry((e.pid, key.clone())).or_default().push(e.t);
                    if phase == "lock" {
                        if let Some(i) = open.remove(&key) {
                            attempts[i].err = Some(e.t);
                        }
                    }
                }
                Kind::Log => counts.add("library_warnings"),
                _ => {}
            }
        }
    }
    WorkerLog {
        attempts,
        errors,
        fences,
        counts,
    }
}

/// Holds cut by a SIGKILL end at the kill (never, if no kill of their process is known).
fn end_killed_holds(attempts: &mut [Attempt], kill_time: &HashMap<u32, u64>) {
    for a in attempts {
        if a.acq.is_some() && a.end.is_none() {
            a.end = Some(kill_time.get(&a.pid).copied().unwrap_or(u64::MAX));
        }
    }
}

/// A call takes over what a failed call of its thread on the same lock may have been granted:
/// its place in line for the FIFO check dates from the oldest such call (see 4.).
fn date_fifo_reqs(attempts: &mut [Attempt]) {
    let mut by_thread_lock: HashMap<(u32, &str, &str), Vec<usize>> = HashMap::new();
    for (i, a) in attempts.iter().enumerate() {
        by_thread_lock
            .entry((a.pid, &a.thread, &a.lock))
            .or_default()
            .push(i);
    }
    let mut fifo_reqs: Vec<(usize, u64)> = Vec::new();
    for list in by_thread_lock.values() {
        // the place of the oldest call whose request or hold may still be on the server
        let mut pending_since: Option<u64> = None;
        for &i in list {
            let a = &attempts[i];
            if a.acq.is_some() {
                let since = pending_since.filter(|&t| t + FAILED_CALL_REACH >= a.req);
                if let Some(t) = since {
                    fifo_reqs.push((i, t));
                }
                pending_since = if a.gone_for_sure {
                    None
                } else {
                    Some(since.unwrap_or(a.req))
                };
            } else if a.err.is_some() {
                pending_since = pending_since.or(Some(a.req));
            }
        }
    }
    for (i, t) in fifo_reqs {
        attempts[i].fifo_req = t;
    }
}

/// Finds the hold each force-unlock named (by pid, lock and token). One that may have released
/// it marks the hold `forced` (it ends there for mutual exclusion); returns the force-unlocks
/// per named hold. `force_released_twice`: more than one call of a force-unlock released.
fn mark_force_unlocks<'f>(
    faults: &'f [Fault],
    attempts: &mut [Attempt],
    found: &mut Findings,
) -> HashMap<usize, Vec<&'f Fault>> {
    let mut forced_by: HashMap<usize, Vec<&Fault>> = HashMap::new();
    for f in faults.iter().filter(|f| f.kind == FaultKind::ForceUnlock) {
        let lock = detail_value(&f.detail, "lock");
        let token = detail_value(&f.detail, "token").and_then(|t| t.parse::<u64>().ok());
        let (Some(pid), Some(lock), Some(token)) = (f.target, lock, token) else {
            continue;
        };
        if f.force_releases() > 1 {
            found.violation(
                "force_released_twice",
                format!(
                    "force-unlock of lock {lock} owner pid {pid} token {token} at {}: more than one call released ({})",
                    f.start, f.end_detail
                ),
            );
        }
        if !f.may_have_released() {
            continue;
        }
        let named = attempts.iter().position(|a| {
            a.pid == pid && a.lock == lock && a.token == token && a.acq.is_some_and(|t| t <= f.end)
        });
        if let Some(i) = named {
            let a = &mut attempts[i];
            a.forced = Some(a.forced.map_or(f.start, |t| t.min(f.start)));
            forced_by.entry(i).or_default().push(f);
        }
    }
    forced_by
}

/// The attempts of each lock, in the order they were read.
fn group_by_lock(attempts: &[Attempt]) -> BTreeMap<String, Vec<&Attempt>> {
    let mut by_lock: BTreeMap<String, Vec<&Attempt>> = BTreeMap::new();
    for a in attempts {
        by_lock.entry(a.lock.clone()).or_default().push(a);
    }
    by_lock
}

/// The granted attempts of one lock, by ACQ.
fn holds_in_order<'a>(list: &[&'a Attempt]) -> Vec<&'a Attempt> {
    let mut holds: Vec<&Attempt> = list.iter().copied().filter(|a| a.acq.is_some()).collect();
    holds.sort_by_key(|a| a.acq.unwrap());
    holds
}

// ---- (9) asynchronous replication ----

/// A master SIGKILLed in a topology mode, and what the replica promoted in its place had.
struct MasterKill {
    /// Right after the kill (the fault's start, on the histories' clock).
    at: u64,
    /// The server clock (µs since the epoch) at the kill: the scale of fencing tokens.
    unix_us: u64,
    /// The locks the killed master served.
    locks: Vec<String>,
    /// Each served lock's fencing counter on the promoted replica; `None` when it could not be
    /// read (then the kill explains nothing).
    fences: Option<HashMap<String, u64>>,
}

impl MasterKill {
    /// `h` was granted by the killed master, and the new master never saw the grant (see 9.).
    fn lost_grant(&self, h: &Attempt) -> bool {
        let Some(&fence) = self.fences.as_ref().and_then(|f| f.get(&h.lock)) else {
            return false;
        };
        h.acq.is_some()
            && h.req < self.at
            && h.token > fence
            && h.token <= self.unix_us + PROMOTION_GAP_US
    }

    /// `h` was granted by a master promoted after this kill.
    fn later_master_grant(&self, h: &Attempt) -> bool {
        self.locks.contains(&h.lock) && h.token > self.unix_us + PROMOTION_GAP_US
    }
}

/// The master kills of the run, with the promoted replica's fencing counters from the fault's
/// end detail (`snapshot=ok fence:<lock>=N ...`).
fn master_kills(faults: &[Fault]) -> Vec<MasterKill> {
    faults
        .iter()
        .filter(|f| f.kind == FaultKind::KillMaster)
        .map(|f| {
            let locks: Vec<String> = detail_value(&f.detail, "locks")
                .unwrap_or("")
                .split(',')
                .filter(|l| !l.is_empty())
                .map(str::to_string)
                .collect();
            let fences = snapshot_fences(&f.end_detail)
                .filter(|fences| locks.iter().all(|l| fences.contains_key(l)));
            MasterKill {
                at: f.start,
                unix_us: detail_value(&f.detail, "unix_us")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0),
                locks,
                fences,
            }
        })
        .collect()
}

/// How long after the sentinels all named the new master a client may still use the old one:
/// its master watch asks every 200 ms, and calls already on their way finish there.
const SENTINEL_FOLLOW_NS: u64 = 1_500_000_000;

/// A `SENTINEL FAILOVER`: from the promotion of a replica until the clients follow the
/// sentinels' switch, the old master is a master too, and its grants never reach the new one;
/// clients that follow sooner than others are granted the same lock by the new one.
struct SentinelSplit {
    /// The switch plus [`SENTINEL_FOLLOW_NS`] (on the histories' clock).
    followed_by: u64,
    /// Each lock's fencing counter on the promoted replica at its promotion.
    fences: HashMap<String, u64>,
}

impl SentinelSplit {
    /// `h` was granted in the split: before the clients followed the switch, with a token above
    /// what the promoted replica had, so by the old master after the promotion (or just before
    /// it, not replicated yet; the new master never saw those) or by the new master meanwhile.
    /// Conservative only in time: which of the two granted it the history cannot tell.
    fn in_split(&self, h: &Attempt) -> bool {
        let Some(&fence) = self.fences.get(&h.lock) else {
            return false;
        };
        h.acq.is_some_and(|acq| acq <= self.followed_by) && h.token > fence
    }
}

/// The fencing counters a fault's end detail gives (`snapshot=ok fence:<lock>=N ...`), by lock;
/// `None` without a snapshot.
fn snapshot_fences(end_detail: &str) -> Option<HashMap<String, u64>> {
    detail_fences(end_detail, "snapshot", "fence:")
}

/// The fencing counters after `<prefix><lock>=N` words of `detail`, by lock, when its word
/// `<flag>=ok` says they were read.
fn detail_fences(detail: &str, flag: &str, prefix: &str) -> Option<HashMap<String, u64>> {
    (detail_value(detail, flag) == Some("ok")).then(|| {
        detail
            .split_whitespace()
            .filter_map(|w| {
                let (lock, fence) = w.strip_prefix(prefix)?.split_once('=')?;
                Some((lock.to_string(), fence.parse().ok()?))
            })
            .collect()
    })
}

/// The splits of the run: the graceful Sentinel failovers whose promotion was seen
/// (`snapshot=ok`), and the master kills after which Sentinel failed over the first promoted
/// replica too while it lived (`split=ok`: the harness saw a second master promoted meanwhile,
/// and read its fencing counters then); the sentinels had switched by the kill's
/// `promoted_after_ms`.
fn sentinel_splits(faults: &[Fault]) -> Vec<SentinelSplit> {
    let split = |f: &Fault, fences: HashMap<String, u64>, switched_key: &str| {
        let switched_ms: u64 = detail_value(&f.end_detail, switched_key)?.parse().ok()?;
        Some(SentinelSplit {
            followed_by: f.start + switched_ms * 1_000_000 + SENTINEL_FOLLOW_NS,
            fences,
        })
    };
    faults
        .iter()
        .filter_map(|f| match f.kind {
            FaultKind::Failover => split(f, snapshot_fences(&f.end_detail)?, "switched_after_ms"),
            FaultKind::KillMaster => split(
                f,
                detail_fences(&f.end_detail, "split", "split_fence:")?,
                "promoted_after_ms",
            ),
            _ => None,
        })
        .collect()
}

/// What asynchronous replication explains (see 9.).
struct Replication<'a> {
    kills: &'a [MasterKill],
    splits: &'a [SentinelSplit],
    lease_ns: u64,
}

impl Replication<'_> {
    /// h1 (the earlier ACQ) and h2 held at once because a master kill lost h1's grant.
    /// Or both were granted in a `SENTINEL FAILOVER`'s split, when two masters grant.
    fn explains_overlap(&self, h1: &Attempt, h2: &Attempt) -> bool {
        let a2 = h2.acq.unwrap();
        self.kills
            .iter()
            .any(|k| k.lost_grant(h1) && k.later_master_grant(h2) && a2 <= k.at + self.lease_ns)
            || self.splits.iter().any(|s| s.in_split(h1) && s.in_split(h2))
    }

    /// h2 (the later ACQ) got a token not above h1's because a master kill lost h1's grant.
    fn explains_token_order(&self, h1: &Attempt, h2: &Attempt) -> bool {
        self.kills
            .iter()
            .any(|k| k.lost_grant(h1) && k.locks.contains(&h2.lock) && h2.req > k.at)
            // two masters granting at once, each from its own clock: their tokens interleave
            || self.splits.iter().any(|s| s.in_split(h1) && s.in_split(h2))
    }

    /// `a` was found lost because a master kill lost its grant.
    fn explains_lost_hold(&self, a: &Attempt, found_at: u64) -> bool {
        self.kills
            .iter()
            .any(|k| k.lost_grant(a) && k.at <= found_at)
    }
}

/// The failovers of the run and their cost, for the summary (null without any).
fn failover_stats(faults: &[Fault], kills: &[MasterKill], attempts: &[Attempt]) -> Value {
    let took = |kind: FaultKind, key: &str| -> Vec<u64> {
        faults
            .iter()
            .filter(|f| f.kind == kind)
            .filter_map(|f| detail_value(&f.end_detail, key)?.parse().ok())
            .collect()
    };
    let promotions = took(FaultKind::KillMaster, "promoted_after_ms");
    let graceful = took(FaultKind::Failover, "took_ms");
    if kills.is_empty() && graceful.is_empty() {
        return Value::Null;
    }
    let lost_per_kill: Vec<usize> = kills
        .iter()
        .map(|k| attempts.iter().filter(|a| k.lost_grant(a)).count())
        .collect();
    json!({
        "master_kills": kills.len(),
        "master_kills_with_promoted_replica_read": kills.iter().filter(|k| k.fences.is_some()).count(),
        "graceful_failovers": graceful.len(),
        "grants_lost_by_replication": lost_per_kill.iter().sum::<usize>(),
        "grants_lost_per_kill": lost_per_kill,
        "promotion_ms": promotions,
        "graceful_failover_ms": graceful,
    })
}

// ---- which faults explain what ----

/// Any fault in [from, to] but `skip`; a clock step counts from a lease before `from` (a step
/// back lengthens the leases set before it).
fn any_fault(faults: &[Fault], lease_ns: u64, from: u64, to: u64, skip: Option<&Fault>) -> bool {
    faults.iter().any(|f| {
        let from = if f.kind == FaultKind::ClockStep {
            from.saturating_sub(lease_ns)
        } else {
            from
        };
        f.overlaps(from, to) && skip.is_none_or(|s| !std::ptr::eq(s, f)) && !f.kind.is_benign()
    })
}

/// Faults in [from, to] that disturb the order of the queue (a clock step and a force-unlock
/// must not).
fn order_fault(faults: &[Fault], from: u64, to: u64) -> bool {
    faults.iter().any(|f| {
        f.overlaps(from, to)
            && !matches!(f.kind, FaultKind::ClockStep | FaultKind::ForceUnlock)
            && !f.kind.is_benign()
    })
}

/// A restart without persistence in [from, to] (Redis's keys, tokens included, start over).
fn volatile_between(faults: &[Fault], from: u64, to: u64) -> bool {
    faults
        .iter()
        .any(|f| f.is_volatile_restart() && f.overlaps(from, to))
}

/// A SIGSTOP of process `pid` in [from, to].
fn stopped_between(faults: &[Fault], pid: u32, from: u64, to: u64) -> bool {
    faults
        .iter()
        .any(|f| f.kind.is_stop() && f.target == Some(pid) && f.overlaps(from, to))
}

/// Why two holds h1 (earlier ACQ) and h2 may both think they hold: None when nothing does.
fn explain(faults: &[Fault], h1: &Attempt, h2: &Attempt, lease_ns: u64) -> Option<&'static str> {
    let a2 = h2.acq.unwrap();
    // only a fault that can hold back h1's grant reply or its renewals: from a lease before
    // h1's ACQ (its lease may have started that early) to h2's ACQ, not the whole of h1's wait
    let from = h1
        .acq
        .unwrap()
        .saturating_sub(lease_ns)
        .max(h1.req.min(h2.req));
    if stopped_between(faults, h1.pid, from, a2)
        || stopped_between(faults, h2.pid, h2.req.max(a2.saturating_sub(lease_ns)), a2)
    {
        return Some("sigstop");
    }
    for f in faults {
        if f.overlaps(from, a2) && f.explains_overlap() {
            return Some(match f.kind {
                FaultKind::RestartVolatile => "restart-volatile",
                FaultKind::RestartAof => "restart-aof",
                _ => "proxy",
            });
        }
    }
    None
}

/// The lines around [from, to] that mention `lock` or come from the parent, for a report.
fn excerpt(files: &[Vec<Event>], lock: &str, from: u64, to: u64) -> String {
    let mut lines: Vec<&Event> = files
        .iter()
        .flatten()
        .filter(|e| e.t + 5 * MS >= from && e.t <= to + 5 * MS)
        .filter(|e| e.line.contains(lock) || e.thread == "parent")
        .collect();
    lines.sort_by_key(|e| e.t);
    let total = lines.len();
    let mut s: Vec<String> = lines
        .iter()
        .take(40)
        .map(|e| format!("    {}", e.line))
        .collect();
    if total > 40 {
        s.push(format!("    ... {} more", total - 40));
    }
    s.join("\n")
}

// ---- (1) mutual exclusion ----

/// `expired_grant`: a guard whose own estimate of the lease left was 0, unless its process was
/// stopped between the call and the ACQ line: the lease then ran out after the library handed
/// the guard over (a SIGSTOP of a "holder" is often chosen by what Redis shows, right after the
/// grant and before the thread logs it), which is the limit of any lease, not the library's
/// doing; counted as explained.
fn check_expired_grants(
    attempts: &[Attempt],
    faults: &[Fault],
    files: &[Vec<Event>],
    found: &mut Findings,
) {
    for a in attempts {
        if a.lease_left_us == Some(0) && stopped_between(faults, a.pid, a.req, a.acq.unwrap()) {
            found.explained.add("grant_expired_during_stop");
        } else if a.lease_left_us == Some(0) {
            found.violation(
                "expired_grant",
                format!(
                    "lock {}: {}/{} got token {} at {} with no lease left by its own estimate\n{}",
                    a.lock,
                    a.pid,
                    a.thread,
                    a.token,
                    a.acq.unwrap(),
                    excerpt(files, &a.lock, a.req, a.acq.unwrap())
                ),
            );
        }
    }
}

/// What the overlap check learned about holds, for the later checks and the summary.
#[derive(Default)]
struct OverlapMarks {
    /// Holds that overlapped another thread's hold (explained or not).
    in_overlap: HashSet<HoldKey>,
    /// Holds a force-unlock cut while they still ran, before another thread's ACQ.
    cut_by_force: HashSet<HoldKey>,
    /// Holds another thread's explained hold outran (each counted once).
    overrun: HashSet<HoldKey>,
    /// Holds in an overlap that asynchronous replication explains (see 9.).
    by_replication: HashSet<HoldKey>,
}

/// `overlap` / `overlap_lease_lost`: two threads' holds of one lock at once that no fault
/// explains; a force-unlocked hold ends at the force-unlock.
fn check_overlaps(
    lock: &str,
    holds: &[&Attempt],
    faults: &[Fault],
    repl: &Replication,
    files: &[Vec<Event>],
    marks: &mut OverlapMarks,
    found: &mut Findings,
) {
    let mut active: Vec<&Attempt> = Vec::new();
    for &h2 in holds {
        let a2 = h2.acq.unwrap();
        if h2.forced.is_some_and(|f| f <= a2) {
            // force-unlocked before its holder learned of it (popped or answered before the
            // force, handed to the thread after): its interval ends before it began
            found
                .explained
                .add("hold_learned_of_after_its_force_unlock");
            continue;
        }
        for h in &active {
            let cut = h.forced.is_some_and(|f| f <= a2);
            if cut && h.end.unwrap() > a2 && !h.same_thread(h2) {
                marks.cut_by_force.insert(h.hold_key());
            }
        }
        active.retain(|h| h.end.unwrap().min(h.forced.unwrap_or(u64::MAX)) > a2);
        for &h1 in &active {
            if h1.same_thread(h2) {
                continue;
            }
            marks.in_overlap.insert(h1.hold_key());
            marks.in_overlap.insert(h2.hold_key());
            match explain(faults, h1, h2, repl.lease_ns) {
                Some(why) => {
                    // count each hold that another outran once, not every pair
                    if marks.overrun.insert(h1.hold_key()) {
                        found.explained.add(&format!("holds_overlapped_{why}"));
                    }
                }
                None if repl.explains_overlap(h1, h2) => {
                    marks.by_replication.insert(h1.hold_key());
                    marks.by_replication.insert(h2.hold_key());
                    if marks.overrun.insert(h1.hold_key()) {
                        found.replication.add("holds_overlapped");
                    }
                }
                None => {
                    let kind = if h1.rel_lost {
                        "overlap_lease_lost"
                    } else {
                        "overlap"
                    };
                    found.violation(
                        kind,
                        format!(
                            "lock {lock}: {}/{} (token {}) held from {} to {}, {}/{} (token {}) acquired at {}\n{}",
                            h1.pid, h1.thread, h1.token, h1.acq.unwrap(), h1.end.unwrap(),
                            h2.pid, h2.thread, h2.token, a2,
                            excerpt(files, lock, h1.acq.unwrap(), a2)
                        ),
                    );
                }
            }
        }
        active.push(h2);
    }
}

// ---- (2) tokens ----

/// `token_order`: a later hold of another thread got a token not greater than the one before,
/// unless a restart without persistence or an overlap fault (not a restart with AOF) explains it.
fn check_token_order(
    lock: &str,
    holds: &[&Attempt],
    faults: &[Fault],
    repl: &Replication,
    files: &[Vec<Event>],
    found: &mut Findings,
) {
    for w in holds.windows(2) {
        let (h1, h2) = (w[0], w[1]);
        if h2.token > h1.token || h1.same_thread(h2) {
            continue;
        }
        let (a1, a2) = (h1.acq.unwrap(), h2.acq.unwrap());
        if h2.forced.is_some_and(|f| f <= a2) {
            // granted before the hold it follows in the log, and force-unlocked before its
            // holder learned of it (see check_overlaps)
            found
                .explained
                .add("token_order_hold_learned_after_its_force_unlock");
        } else if volatile_between(faults, a1, a2) {
            found.explained.add("token_reset_restart_volatile");
        } else if explain(faults, h1, h2, repl.lease_ns).is_some_and(|w| w != "restart-aof") {
            found.explained.add("token_order_fault");
        } else if repl.explains_token_order(h1, h2) {
            found.replication.add("token_order");
        } else {
            found.violation(
                "token_order",
                format!(
                    "lock {lock}: token {} acquired at {a1} by {}/{}, then token {} at {a2} by {}/{}\n{}",
                    h1.token, h1.pid, h1.thread, h2.token, h2.pid, h2.thread,
                    excerpt(files, lock, a1, a2)
                ),
            );
        }
    }
}

/// `stale_token_accepted` / `token_reused` per resource epoch in Redis's order, and
/// `state_lost` when a lock's resource started over more often than Redis lost its data.
/// Returns the number of epochs per lock.
fn check_fenced_resource(
    fences: &[FenceWrite],
    attempts: &[Attempt],
    faults: &[Fault],
    repl: &Replication,
    files: &[Vec<Event>],
    found: &mut Findings,
) -> BTreeMap<String, u64> {
    // the hold that wrote (lock, token, pid, thread)
    let hold_of = |lock: &str, token: u64, pid: u32, thread: &str| {
        attempts.iter().find(|a| {
            a.acq.is_some()
                && a.lock == lock
                && a.token == token
                && a.pid == pid
                && a.thread == thread
        })
    };
    // (lock, epoch) -> accepted writes as (seq, token, pid, thread, t)
    type Writes = Vec<(u64, u64, u32, String, u64)>;
    let mut epochs: BTreeMap<(String, String), Writes> = BTreeMap::new();
    for (t, lock, token, outcome, pid, thread) in fences {
        if let Fence::Ok { seq, epoch } = outcome {
            epochs
                .entry((lock.clone(), epoch.clone()))
                .or_default()
                .push((*seq, *token, *pid, thread.clone(), *t));
        }
    }
    let mut epochs_per_lock: BTreeMap<String, u64> = BTreeMap::new();
    for ((lock, _), writes) in &mut epochs {
        *epochs_per_lock.entry(lock.clone()).or_default() += 1;
        writes.sort();
        for w in writes.windows(2) {
            let ((_, t1, p1, th1, at1), (_, t2, p2, th2, at2)) = (&w[0], &w[1]);
            let by_replication = || {
                // the later write's hold (lower token) is the lost grant, the earlier one's
                // hold a later master's
                match (hold_of(lock, *t2, *p2, th2), hold_of(lock, *t1, *p1, th1)) {
                    (Some(old), Some(new)) if old.acq <= new.acq => repl.explains_overlap(old, new),
                    _ => false,
                }
            };
            if t2 < t1 && by_replication() {
                found.replication.add("stale_token_accepted");
            } else if t2 < t1 {
                found.violation(
                    "stale_token_accepted",
                    format!("lock {lock}: resource accepted token {t2} ({p2}/{th2} at {at2}) after token {t1} ({p1}/{th1} at {at1})"),
                );
            } else if t2 == t1 && (p1 != p2 || th1 != th2) {
                found.violation(
                    "token_reused",
                    format!("lock {lock}: token {t1} written by {p1}/{th1} at {at1} and by {p2}/{th2} at {at2}\n{}",
                        excerpt(files, lock, *at1.min(at2), *at1.max(at2))),
                );
            }
        }
    }
    let volatile_restarts = faults.iter().filter(|f| f.is_volatile_restart()).count() as u64;
    for (lock, n) in &epochs_per_lock {
        if *n > volatile_restarts + 1 {
            found.violation(
                "state_lost",
                format!("lock {lock}: the resource started over {} times but Redis restarted without persistence {volatile_restarts} times", n - 1),
            );
        }
    }
    epochs_per_lock
}

// ---- (3) the counter ----

/// `lost_update`: each hold's read of the counter must be the previous hold's write, unless a
/// restart without persistence, an overlap, a force-unlock, a hold cut before its section, or
/// a fault window explains the break.
fn check_counter_chain(
    lock: &str,
    holds: &[&Attempt],
    faults: &[Fault],
    files: &[Vec<Event>],
    marks: &OverlapMarks,
    found: &mut Findings,
) {
    let in_overlap = &marks.in_overlap;
    let mut prev: Option<&Attempt> = None;
    let mut cut_since_prev = false; // a hold between prev and this one ended without CS
    for &h in holds {
        let Some((t, before, _)) = h.cs else {
            if prev.is_some() {
                cut_since_prev = true;
            }
            continue;
        };
        if let Some(p) = prev {
            let (pt, pbefore, pafter) = p.cs.unwrap();
            let chained = match pafter {
                Some(a) => before == a,
                None => before == pbefore || before == pbefore + 1,
            };
            if !chained {
                let from = p.acq.unwrap();
                let overlapped =
                    in_overlap.contains(&p.hold_key()) || in_overlap.contains(&h.hold_key());
                if before == 0 && volatile_between(faults, pt, t) {
                    found.explained.add("counter_reset_restart_volatile");
                } else if overlapped
                    && (marks.by_replication.contains(&p.hold_key())
                        || marks.by_replication.contains(&h.hold_key()))
                {
                    found.replication.add("counter_break_overlap");
                } else if overlapped {
                    found.explained.add("counter_break_overlap");
                } else if p.forced.is_some_and(|f| f <= pt) || h.forced.is_some_and(|f| f <= t) {
                    // a force-unlock explains it only if it began before the critical section
                    // it could disturb: p's write, or h's read
                    found.explained.add("counter_break_force_unlock");
                } else if cut_since_prev {
                    found.explained.add("counter_break_cut_hold");
                } else if faults.iter().any(|f| {
                    let stop_of_either =
                        f.kind.is_stop() && (f.target == Some(p.pid) || f.target == Some(h.pid));
                    (f.explains_overlap() || stop_of_either) && f.overlaps(from, t)
                }) {
                    found.explained.add("counter_break_fault_window");
                } else {
                    found.violation(
                        "lost_update",
                        format!(
                            "lock {lock}: counter {pbefore}->{pafter:?} by {}/{} at {pt}, then read {before} by {}/{} at {t}\n{}",
                            p.pid, p.thread, h.pid, h.thread, excerpt(files, lock, from, t)
                        ),
                    );
                }
            }
        }
        prev = Some(h);
        cut_since_prev = false;
    }
}

// ---- (4) FIFO ----

/// `fifo`: a waiter overtaken by one that asked more than FIFO_MARGIN later, with no error of
/// either thread while the first waited, and no fault that disturbs the order in that wait
/// unless the overtaker asked later than the fault's end + a lease + a read timeout + three
/// janitor intervals (by then the first waiter had queued again).
#[allow(clippy::too_many_arguments)]
fn check_fifo(
    lock: &str,
    list: &[&Attempt],
    faults: &[Fault],
    errors: &HashMap<(u32, String), Vec<u64>>,
    files: &[Vec<Event>],
    acq_margin: u64,
    lease_ns: u64,
    found: &mut Findings,
) {
    let err_in = |pid: u32, thread: &str, from: u64, to: u64| {
        errors
            .get(&(pid, thread.to_string()))
            .is_some_and(|v| v.iter().any(|&t| t >= from && t <= to))
    };
    // sort by REQ, suffix minimum of ACQ finds overtakers fast
    let mut reqs: Vec<&Attempt> = list
        .iter()
        .copied()
        .filter(|a| a.acq.is_some() && a.err.is_none())
        .collect();
    reqs.sort_by_key(|a| a.req);
    let mut suffix_min = vec![u64::MAX; reqs.len() + 1];
    for i in (0..reqs.len()).rev() {
        suffix_min[i] = suffix_min[i + 1].min(reqs[i].acq.unwrap());
    }
    for (i, a) in reqs.iter().enumerate() {
        let a_acq = a.acq.unwrap();
        let j = reqs
            .partition_point(|b| b.req <= a.req + FIFO_MARGIN)
            .max(i + 1);
        if suffix_min[j] >= a_acq {
            continue;
        }
        if err_in(a.pid, &a.thread, a.req, a_acq) {
            continue;
        }
        // a fault in A's wait that disturbs the order excuses only overtakers that asked
        // before A could have queued again after it: by the fault's end + a lease (A found
        // dead and purged), a read timeout (A noticing) and three janitor intervals
        let reach = lease_ns + (READ_TIMEOUT + JANITOR * 3).as_nanos() as u64;
        let excused_until = faults
            .iter()
            .filter(|f| order_fault(std::slice::from_ref(*f), a.req, a_acq))
            .map(|f| f.end + reach)
            .max();
        // many hold at once (sem, rw): A may have been granted before B and logged its ACQ
        // later (a wake-up to pop), unless B got it acq_margin before; a stop of A's process
        // (a waiter's hiccup too) delays A's ACQ line
        if acq_margin > 0
            && faults.iter().any(|f| {
                (f.kind.is_stop() || f.kind == FaultKind::WaiterHiccup)
                    && f.target == Some(a.pid)
                    && f.overlaps(a.req, a_acq)
            })
        {
            continue;
        }
        for b in &reqs[j..] {
            if b.req > a_acq {
                break;
            }
            if b.acq.unwrap() + acq_margin < a_acq
                && b.fifo_req > a.req + FIFO_MARGIN
                && !err_in(b.pid, &b.thread, a.req, a_acq)
                && excused_until.is_none_or(|until| b.fifo_req > until)
            {
                found.violation(
                    "fifo",
                    format!(
                        "lock {lock}: {}/{} asked at {} and got it at {a_acq}; {}/{} asked {:.1} ms later and got it at {}\n{}",
                        a.pid, a.thread, a.req, b.pid, b.thread,
                        ms(b.req - a.req), b.acq.unwrap(), excerpt(files, lock, a.req, a_acq)
                    ),
                );
                break;
            }
        }
    }
}

// ---- (8) force-unlocks and lost holds ----

/// For each hold a force-unlock released: `force_unnoticed` when its thread still released it
/// as its own afterwards, `force_token_order` when the next hold's token is not greater.
/// Returns how many holds a force-unlock released.
fn check_force_unlocks(
    forced_by: &HashMap<usize, Vec<&Fault>>,
    attempts: &[Attempt],
    faults: &[Fault],
    shared: bool,
    files: &[Vec<Event>],
    found: &mut Findings,
) -> usize {
    let mut forced_holds = 0;
    for (&i, fs) in forced_by {
        let a = &attempts[i];
        let Some(f) = fs.iter().find(|f| f.force_releases() > 0) else {
            continue;
        };
        forced_holds += 1;
        // REL is stamped before the release is sent: one stamped after the force-unlock ended
        // went out when the hold was gone, and must not come back as a success
        if a.rel_ok && a.end.is_some_and(|t| t > f.end) {
            found.violation(
                "force_unnoticed",
                format!(
                    "lock {}: {}/{} (token {}) was force-unlocked at {} ({}) but released it as its own at {}\n{}",
                    a.lock, a.pid, a.thread, a.token, f.start, f.end_detail, a.end.unwrap(),
                    excerpt(files, &a.lock, a.acq.unwrap(), a.end.unwrap())
                ),
            );
        }
        let next = attempts
            .iter()
            .filter(|b| b.lock == a.lock && !std::ptr::eq(*b, a))
            .filter(|b| b.acq.is_some_and(|t| t >= f.start))
            // many hold at once (sem, rw): only a hold asked after the force-unlock began was
            // granted after the named one for sure (that one was in `status()` before)
            .filter(|b| !shared || b.req >= f.start)
            .min_by_key(|b| b.acq.unwrap());
        if let Some(b) = next {
            let (a2, b2) = (f.start, b.acq.unwrap());
            if b.token <= a.token && !volatile_between(faults, a2, b2) {
                found.violation(
                    "force_token_order",
                    format!(
                        "lock {}: {}/{} (token {}) force-unlocked at {a2}, next hold {}/{} got token {} at {b2}\n{}",
                        a.lock, a.pid, a.thread, a.token, b.pid, b.thread, b.token,
                        excerpt(files, &a.lock, a2, b2)
                    ),
                );
            }
        }
    }
    forced_holds
}

/// `hold_lost`: a hold no force-unlock named was lost with no fault in [its REQ, the return of
/// its release] that could take it away.
fn check_lost_holds(
    attempts: &[Attempt],
    faults: &[Fault],
    repl: &Replication,
    files: &[Vec<Event>],
    found: &mut Findings,
) {
    for a in attempts {
        if !a.lost_on_server || a.forced.is_some() {
            continue;
        }
        // until the release returned: a fault that strikes while it is on its way (a restart,
        // then the library's retry on a new connection finds the lock gone) explains the loss;
        // from a lease before the ACQ (a fault that held back the grant reply), not the whole
        // wait before it
        let from = a
            .acq
            .map_or(a.req, |t| t.saturating_sub(repl.lease_ns).max(a.req));
        let to = a.rel_done.unwrap_or(a.end.unwrap());
        if faults
            .iter()
            .any(|f| f.may_lose_hold(a.pid) && f.overlaps(from, to))
        {
            found.explained.add("holds_lost_fault");
            continue;
        }
        if repl.explains_lost_hold(a, to) {
            found.replication.add("holds_lost_unreplicated_grant");
            continue;
        }
        if repl.splits.iter().any(|s| s.in_split(a)) {
            found.replication.add("holds_lost_sentinel_split");
            continue;
        }
        if faults
            .iter()
            .any(|f| f.kind == FaultKind::KillMaster && f.overlaps(from, to))
        {
            // no master to renew with for longer than the lease left (a promotion takes
            // seconds): the guard says so; nobody else held meanwhile (the overlap check sees
            // to that). Not after a graceful failover, which must keep every hold.
            found.explained.add("holds_lost_failover");
            continue;
        }
        let hint = match faults
            .iter()
            .find(|f| f.kind == FaultKind::Failover && f.overlaps(from, to))
        {
            Some(f) => format!(
                "during the graceful failover from {} to {} ({}), which must keep every hold but the old master's grants before the clients followed the switch (this one came after, or its token was not above the promoted replica's fence)",
                f.start, f.end, f.end_detail
            ),
            None => "with no fault that explains it (a force-unlock naming another hold?)".into(),
        };
        found.violation(
            "hold_lost",
            format!(
                "lock {}: {}/{} (token {}, acquired at {}) found its hold gone at {} {hint}\n{}",
                a.lock,
                a.pid,
                a.thread,
                a.token,
                a.acq.unwrap(),
                to,
                excerpt(files, &a.lock, a.acq.unwrap().saturating_sub(20 * MS), to)
            ),
        );
    }
}

// ---- (5) liveness and recovery ----

/// `liveness`: in the quiet phase, an error or a wait longer than lease + 3 s (a waiter the
/// harness killed excepted). Returns the longest wait seen in the quiet phase.
fn check_liveness(
    attempts: &[Attempt],
    phases: &HashMap<String, u64>,
    kill_time: &HashMap<u32, u64>,
    p: &Params,
    files: &[Vec<Event>],
    found: &mut Findings,
) -> u64 {
    let patience = p.lease_ns + 3 * S;
    let mut worst_quiet_wait = 0u64;
    let (Some(&quiet), Some(&stop)) = (phases.get("quiet"), phases.get("stop")) else {
        found.violation("liveness", "no quiet phase was recorded".into());
        return worst_quiet_wait;
    };
    for a in attempts {
        let from = a.req.max(quiet);
        if from >= stop {
            continue;
        }
        let done = a.acq.or(a.err);
        if done.is_none() && kill_time.contains_key(&a.pid) {
            continue; // a waiter the harness killed
        }
        let waited = done.unwrap_or(stop).saturating_sub(from);
        if a.req < stop && done.is_none_or(|d| d >= quiet) {
            worst_quiet_wait = worst_quiet_wait.max(waited);
        }
        if let Some(e) = a.err {
            if e >= quiet {
                found.violation(
                    "liveness",
                    format!(
                        "lock {}: {}/{} got an error at {e} in the quiet phase\n{}",
                        a.lock,
                        a.pid,
                        a.thread,
                        excerpt(files, &a.lock, a.req, e)
                    ),
                );
            }
            continue;
        }
        if waited > patience && from + patience <= stop {
            found.violation(
                "liveness",
                format!(
                    "lock {}: {}/{} asked at {} and waited {:.0} ms in the quiet phase (limit {:.0} ms)\n{}",
                    a.lock, a.pid, a.thread, a.req, ms(waited), ms(patience),
                    excerpt(files, &a.lock, from, from + patience)
                ),
            );
        }
    }
    worst_quiet_wait
}

/// For each SIGKILL of a holder another process waited for: the time to the next ACQ of that
/// lock by another process, and whether no other fault came in between. `slow_recovery` when
/// such a clean recovery took longer than lease + 1 s. Returns (time taken, clean) per recovery.
fn check_recovery(
    faults: &[Fault],
    by_lock: &BTreeMap<String, Vec<&Attempt>>,
    p: &Params,
    files: &[Vec<Event>],
    found: &mut Findings,
) -> Vec<(u64, bool)> {
    let mut recoveries: Vec<(u64, bool)> = Vec::new();
    for f in faults.iter().filter(|f| f.kind.is_kill()) {
        let Some(pid) = f.target else { continue };
        for (lock, list) in by_lock {
            let held = list.iter().any(|a| {
                a.pid == pid && a.acq.is_some_and(|t| t <= f.start) && a.end.unwrap() >= f.start
            });
            let waited_for = list
                .iter()
                .any(|a| a.pid != pid && a.req <= f.start && a.acq.is_none_or(|t| t > f.start));
            if !held || !waited_for {
                continue;
            }
            let next = list
                .iter()
                .filter(|a| a.pid != pid)
                .filter_map(|a| a.acq)
                .filter(|&t| t > f.start)
                .min();
            let Some(next) = next else { continue };
            let took = next - f.start;
            let clean = !any_fault(faults, p.lease_ns, f.start, next, Some(f));
            recoveries.push((took, clean));
            // with other faults in the way, each may delay it by its own length plus a lease
            // (a hold it disrupted), a read timeout (noticing it) and three janitor
            // intervals (a dead waiter's purge); a clock step in the lease before the kill
            // too, by as much as a step back can lengthen the dead holder's lease (5 s)
            let per_fault = p.lease_ns + (READ_TIMEOUT + JANITOR * 3).as_nanos() as u64;
            let delays: u64 = faults
                .iter()
                .filter(|g| !std::ptr::eq(*g, f) && !g.kind.is_benign())
                .filter_map(|g| {
                    if g.kind == FaultKind::ClockStep {
                        let from = f.start.saturating_sub(p.lease_ns);
                        g.overlaps(from, next).then_some(per_fault + 5 * S)
                    } else {
                        g.overlaps(f.start, next)
                            .then(|| g.end.saturating_sub(g.start) + per_fault)
                    }
                })
                .sum();
            let bound = p.lease_ns + S + delays;
            if took > bound {
                found.violation(
                    "slow_recovery",
                    format!(
                        "lock {lock}: holder {pid} killed at {}, next acquisition {:.0} ms later \
                         (at most {:.0} ms{})\n{}",
                        f.start,
                        ms(took),
                        ms(bound),
                        if clean {
                            ""
                        } else {
                            " with the other faults in the way"
                        },
                        excerpt(files, lock, f.start, next)
                    ),
                );
            }
        }
    }
    recoveries
}

// ---- (6), (7) the end state ----

/// Torn lines: each history is written a line at a time, so only a process killed by a
/// signal (SIGKILLed by the harness, or killed at the end for not stopping in time) can leave
/// one, its last. More torn lines than such processes is a violation (they are dropped
/// unread, and could hide any event).
fn check_torn_lines(torn: usize, end: &EndState, found: &mut Findings) {
    let killed = end
        .exits
        .iter()
        .filter(|(_, _, code, by_harness)| *by_harness || matches!(code, None | Some(-1)))
        .count();
    if torn > killed {
        found.violation(
            "torn_lines",
            format!(
                "{torn} history lines did not parse, more than the {killed} processes killed \
                 mid-write could tear (one line each)"
            ),
        );
    }
}

/// `keys_left`, `panic`, `worker_exit`: from what the parent collected at the end.
fn check_end_state(end: &EndState, found: &mut Findings) {
    for (key, pttl) in &end.leftover_keys {
        found.violation(
            "keys_left",
            format!("key {key:?} (PTTL {pttl} ms) left after the run"),
        );
    }
    for (pid, line) in &end.panics {
        found.violation("panic", format!("worker {pid}: {line}"));
    }
    for (idx, pid, code, killed) in &end.exits {
        if !killed && *code != Some(0) {
            found.violation(
                "worker_exit",
                format!("worker {idx} (pid {pid}) exited with {code:?}"),
            );
        }
    }
}

// ---- the report ----

/// What the checks measured, for the summary.
struct Measures {
    /// Sem and rw workloads: per name, the most permits live holds held at once (explained
    /// overlaps included).
    most_held: BTreeMap<String, (u64, u64)>,
    duration_ns: u64,
    counts: Counts,
    torn: usize,
    forced_holds: usize,
    holds_cut_by_force: usize,
    recoveries: Vec<(u64, bool)>,
    worst_quiet_wait: u64,
    epochs_per_lock: BTreeMap<String, u64>,
    /// Null without failovers (see [`failover_stats`]).
    failovers: Value,
}

/// The violations and the summary JSON.
fn assemble_report(p: &Params, stats: &FaultStats, m: Measures, found: Findings) -> Report {
    let Findings {
        violations,
        explained,
        replication,
    } = found;
    let mut by_kind = Counts::default();
    for (k, _) in &violations {
        by_kind.add(k);
    }
    let worst = m.recoveries.iter().map(|r| r.0).max();
    let worst_clean = m.recoveries.iter().filter(|r| r.1).map(|r| r.0).max();
    let summary = json!({
        "scenario": p.scenario,
        "duration_s": m.duration_ns as f64 / 1e9,
        "lease_ms": p.lease_ns / MS,
        "counts": m.counts.json(),
        "torn_lines": m.torn,
        "faults": stats.counts.json(),
        "fault_details": stats.details.json(),
        "force_unlocked_holds": m.forced_holds,
        "holds_cut_by_force_unlock": m.holds_cut_by_force,
        "largest_forward_clock_step_ms": stats.largest_forward_step_ms,
        "violations": by_kind.json(),
        "violations_total": violations.len(),
        "explained": explained.json(),
        "explained_by_async_replication": replication.json(),
        "explained_by_async_replication_total": replication.0.values().sum::<u64>(),
        "failovers": m.failovers,
        "recoveries_measured": m.recoveries.len(),
        "worst_recovery_ms": worst.map(ms),
        "worst_recovery_without_other_fault_ms": worst_clean.map(ms),
        "recovery_limit_ms": ms(p.lease_ns + S),
        "worst_wait_in_quiet_phase_ms": ms(m.worst_quiet_wait),
        "resource_epochs": m.epochs_per_lock,
        "capacity": p.capacity,
        "most_permits_held_at_once": if p.capacity.is_some() {
            json!(m.most_held.iter().map(|(k, v)| (k.clone(), v.0)).collect::<BTreeMap<_, _>>())
        } else {
            Value::Null
        },
        "most_permits_held_at_once_unexplained": if p.capacity.is_some() {
            json!(m.most_held.iter().map(|(k, v)| (k.clone(), v.1)).collect::<BTreeMap<_, _>>())
        } else {
            Value::Null
        },
    });
    Report {
        violations,
        summary,
    }
}

// ---- (10) semaphores and read/write locks ----

/// `over_capacity` / `over_capacity_lease_lost`: at some ACQ the live holds of one name held
/// more than `cap` permits together (a write of a read/write lock holds all of them, so a write
/// overlapping any other hold is one), and the holds no fault explains (as for a mutex's
/// overlap, pair by pair with the new hold: [`explain`], or asynchronous replication) still
/// do. A hold's interval runs from its ACQ to its UNLOCK (or the kill of its process, or the
/// force-release that named it). Returns the most permits held at once, explained overruns
/// included and not (capped at twice the capacity).
#[allow(clippy::too_many_arguments)]
fn check_capacity(
    lock: &str,
    holds: &[&Attempt],
    cap: u64,
    faults: &[Fault],
    repl: &Replication,
    files: &[Vec<Event>],
    marks: &mut OverlapMarks,
    found: &mut Findings,
) -> (u64, u64) {
    let mut active: Vec<&Attempt> = Vec::new();
    let (mut most, mut most_unexplained) = (0, 0);
    for &h2 in holds {
        let a2 = h2.acq.unwrap();
        for h in &active {
            let cut = h.forced.is_some_and(|f| f <= a2);
            if cut && h.end.unwrap() > a2 && !h.same_thread(h2) {
                marks.cut_by_force.insert(h.hold_key());
            }
        }
        active.retain(|h| h.end.unwrap().min(h.forced.unwrap_or(u64::MAX)) > a2);
        let others: Vec<&Attempt> = active
            .iter()
            .copied()
            .filter(|h| !h.same_thread(h2))
            .collect();
        let held: u64 = others.iter().map(|h| h.permits).sum::<u64>() + h2.permits;
        most = most.max(held.min(cap.saturating_mul(2)));
        if held <= cap {
            most_unexplained = most_unexplained.max(held);
        }
        if held > cap {
            marks.in_overlap.insert(h2.hold_key());
            let mut unexplained: Vec<&Attempt> = Vec::new();
            for &h1 in &others {
                marks.in_overlap.insert(h1.hold_key());
                match explain(faults, h1, h2, repl.lease_ns) {
                    Some(why) => {
                        if marks.overrun.insert(h1.hold_key()) {
                            found.explained.add(&format!("holds_over_capacity_{why}"));
                        }
                    }
                    None if repl.explains_overlap(h1, h2) => {
                        marks.by_replication.insert(h1.hold_key());
                        marks.by_replication.insert(h2.hold_key());
                        if marks.overrun.insert(h1.hold_key()) {
                            found.replication.add("holds_over_capacity");
                        }
                    }
                    None => unexplained.push(h1),
                }
            }
            let left: u64 = unexplained.iter().map(|h| h.permits).sum::<u64>() + h2.permits;
            most_unexplained = most_unexplained.max(left.min(cap.saturating_mul(2)));
            if left > cap {
                let kind = if unexplained.iter().any(|h| h.rel_lost) {
                    "over_capacity_lease_lost"
                } else {
                    "over_capacity"
                };
                let list: Vec<String> = unexplained
                    .iter()
                    .map(|h| {
                        format!(
                            "{}/{} ({} permits, token {}, {}..{})",
                            h.pid,
                            h.thread,
                            h.permits,
                            h.token,
                            h.acq.unwrap(),
                            h.end.unwrap()
                        )
                    })
                    .collect();
                let from = unexplained
                    .iter()
                    .map(|h| h.acq.unwrap())
                    .min()
                    .unwrap_or(a2);
                found.violation(
                    kind,
                    format!(
                        "lock {lock} (capacity {cap}): {}/{} acquired {} permits (token {}) at {a2} while {} held {} more: {}\n{}",
                        h2.pid, h2.thread, h2.permits, h2.token, list.len(),
                        left - h2.permits, list.join(", "),
                        excerpt(files, lock, from, a2)
                    ),
                );
            }
        }
        active.push(h2);
    }
    (most, most_unexplained)
}

/// Tokens of a semaphore or a read/write lock: `token_reused` when two holds got one token,
/// `token_order` when a hold asked after another was granted (its REQ after the other's ACQ:
/// the grant order is known) got a token not greater. Many hold at once, so the order of ACQ
/// lines alone is not the grant order. Explained: a restart without persistence between the
/// two grants (the fence starts over), asynchronous replication (see 9.).
fn check_shared_tokens(
    lock: &str,
    holds: &[&Attempt],
    faults: &[Fault],
    repl: &Replication,
    files: &[Vec<Event>],
    found: &mut Findings,
) {
    let mut by_token: HashMap<u64, &Attempt> = HashMap::new();
    for &h in holds {
        let Some(o) = by_token.insert(h.token, h) else {
            continue;
        };
        let (a1, a2) = (o.acq.unwrap(), h.acq.unwrap());
        if volatile_between(faults, a1, a2) {
            found.explained.add("token_reset_restart_volatile");
        } else if repl.explains_token_order(o, h) {
            found.replication.add("token_reused");
        } else {
            found.violation(
                "token_reused",
                format!(
                    "lock {lock}: token {} granted to {}/{} (ACQ at {a1}) and to {}/{} (ACQ at {a2})\n{}",
                    h.token, o.pid, o.thread, h.pid, h.thread, excerpt(files, lock, a1, a2)
                ),
            );
        }
    }
    // holds is by ACQ; walk the holds by REQ with the greatest token granted before each REQ
    // since the end of the last restart without persistence before it (tokens may start lower
    // after one: the fence is gone and the server clock may have been stepped back)
    let mut restarts: Vec<(u64, u64)> = faults
        .iter()
        .filter(|f| f.is_volatile_restart())
        .map(|f| (f.start, f.end))
        .collect();
    restarts.sort();
    let mut by_req: Vec<&Attempt> = holds.to_vec();
    by_req.sort_by_key(|h| h.req);
    let mut j = 0;
    let mut best: Option<&Attempt> = None;
    let mut since = 0u64;
    for &h2 in &by_req {
        let cutoff = restarts
            .iter()
            .filter(|r| r.0 < h2.req)
            .map(|r| r.1)
            .max()
            .unwrap_or(0);
        if cutoff != since {
            since = cutoff;
            best = None;
            j = holds.partition_point(|h| h.acq.unwrap() <= since);
        }
        while j < holds.len() && holds[j].acq.unwrap() < h2.req {
            if best.is_none_or(|b| holds[j].token > b.token) {
                best = Some(holds[j]);
            }
            j += 1;
        }
        let Some(h1) = best else { continue };
        if h2.token > h1.token {
            continue;
        }
        let (a1, a2) = (h1.acq.unwrap(), h2.acq.unwrap());
        if volatile_between(faults, a1, a2) {
            found.explained.add("token_reset_restart_volatile");
        } else if repl.explains_token_order(h1, h2) {
            found.replication.add("token_order");
        } else {
            found.violation(
                "token_order",
                format!(
                    "lock {lock}: token {} acquired at {a1} by {}/{}, then {}/{} asked at {} and got token {} at {a2}\n{}",
                    h1.token, h1.pid, h1.thread, h2.pid, h2.thread, h2.req, h2.token,
                    excerpt(files, lock, a1, a2)
                ),
            );
        }
    }
}
