//! The checker: merges the histories into one timeline and looks for violations.
//!
//! 1. `overlap`: two owners inside one lock's critical section at once (ACQ..REL intervals
//!    overlap; a SIGKILLed holder's interval ends at the kill) that no fault explains.
//!    Explained: a SIGSTOP of the earlier holder's process in [its REQ, later ACQ] or of the later
//!    holder's process in [its REQ, its ACQ], a proxy fault or a Redis restart in [earlier of the
//!    two REQs, later ACQ]. The REQ side matters: a grant whose reply the network held back (or
//!    whose process was stopped) reaches its thread late, with less of its lease left. An
//!    unexplained overlap whose earlier holder saw its lease lost is reported as
//!    `overlap_lease_lost` (a pause that no fault made: the watchdog could not renew in time).
//!    `expired_grant`: `lock()` returned a guard whose own estimate of the lease left was 0 (the
//!    library knew the hold might be someone else's already).
//! 2. `stale_token_accepted` / `token_reused` / `token_order` / `state_lost`: the fenced resource
//!    accepted a token lower than one it accepted earlier (in Redis's order), two holders wrote
//!    with one token, holds were granted tokens out of order, or the resource was reset although
//!    no restart without persistence happened.
//! 3. `lost_update`: per lock, the counter's read-modify-writes must chain (each `before` equals
//!    the previous `after`) except across an explained overlap, a fault window, a holder killed
//!    mid-section, or a restart without persistence (the counter then starts over at 0).
//! 4. `fifo`: a live waiter overtaken: A.REQ + 100 ms < B.REQ but B.ACQ < A.ACQ on one lock,
//!    with no fault and no error of A's or B's thread in [A.REQ, A.ACQ].
//! 5. `liveness`: in the quiet phase after the faults, a request not granted within lease + 3 s,
//!    or an error.
//! 6. `keys_left` and 7. `panic` / `worker_exit`: from the end state the parent collected.
//!
//! Recovery: for each SIGKILL of a process that held a lock while another process waited for
//! it, the time from the kill to the next ACQ of that lock by another process. `slow_recovery`
//! when it exceeds lease + 1 s with no other fault in that window.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde_json::{json, Value};

use super::history::{Event, Fence, Kind};

const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;
/// How much later B must have asked than A before B's earlier grant counts as overtaking.
const FIFO_MARGIN: u64 = 100 * MS;

#[derive(Clone, Debug)]
pub struct Fault {
    pub kind: String,
    pub start: u64,
    pub end: u64,
    pub target: Option<u32>,
}

impl Fault {
    fn overlaps(&self, from: u64, to: u64) -> bool {
        self.start <= to && self.end >= from
    }
    fn is_proxy(&self) -> bool {
        matches!(self.kind.as_str(), "drop" | "blackhole" | "latency")
    }
    fn is_restart(&self) -> bool {
        self.kind.starts_with("restart")
    }
    fn is_volatile_restart(&self) -> bool {
        self.kind == "restart-volatile"
    }
    fn is_kill(&self) -> bool {
        self.kind.starts_with("sigkill")
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
    req: u64,
    acq: Option<u64>,
    token: u64,
    lease_left_us: Option<u64>,
    err: Option<u64>,
    /// End of the hold: REL (stamped before unlock), or the kill of the process.
    end: Option<u64>,
    rel_lost: bool,
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
    pub lease_ns: u64,
}

pub fn check(files: Vec<Vec<Event>>, torn: usize, end: &EndState, p: &Params) -> Report {
    let mut violations: Vec<(String, String)> = Vec::new();
    let mut explained = Counts::default();

    // ---- faults and phases (from the parent's history) ----
    let mut starts: HashMap<u64, (String, u64, Option<u32>)> = HashMap::new();
    let mut faults: Vec<Fault> = Vec::new();
    let mut phases: HashMap<String, u64> = HashMap::new();
    let mut first_t = u64::MAX;
    let mut last_t = 0;
    for e in files.iter().flatten() {
        first_t = first_t.min(e.t);
        last_t = last_t.max(e.t);
        match &e.kind {
            Kind::FaultStart { id, kind, target } => {
                starts.insert(*id, (kind.clone(), e.t, *target));
            }
            Kind::FaultEnd { id } => {
                if let Some((kind, start, target)) = starts.remove(id) {
                    faults.push(Fault {
                        kind,
                        start,
                        end: e.t,
                        target,
                    });
                }
            }
            Kind::Phase { name } if e.thread == "parent" => {
                phases.insert(name.clone(), e.t);
            }
            _ => {}
        }
    }
    for (_, (kind, start, target)) in starts {
        // a fault the parent never ended (it panicked): open until the end
        faults.push(Fault {
            kind,
            start,
            end: last_t,
            target,
        });
    }
    faults.sort_by_key(|f| f.start);
    let kill_time: HashMap<u32, u64> = faults
        .iter()
        .filter(|f| f.is_kill())
        .filter_map(|f| f.target.map(|pid| (pid, f.start)))
        .collect();
    let mut fault_counts = Counts::default();
    for f in &faults {
        fault_counts.add(&f.kind);
    }
    let any_fault = |from: u64, to: u64, skip: Option<&Fault>| {
        faults
            .iter()
            .any(|f| f.overlaps(from, to) && skip.is_none_or(|s| !std::ptr::eq(s, f)))
    };
    let volatile_between = |from: u64, to: u64| {
        faults
            .iter()
            .any(|f| f.is_volatile_restart() && f.overlaps(from, to))
    };

    // ---- attempts, per thread in program order ----
    let mut attempts: Vec<Attempt> = Vec::new();
    let mut errors: HashMap<(u32, String), Vec<u64>> = HashMap::new();
    let mut fences: Vec<(u64, String, u64, Fence, u32, String)> = Vec::new();
    let mut counts = Counts::default();
    for file in &files {
        let mut open: HashMap<String, usize> = HashMap::new(); // thread -> attempt index
        for e in file {
            let key = e.thread.clone();
            match &e.kind {
                Kind::Req { lock } => {
                    counts.add("requests");
                    attempts.push(Attempt {
                        pid: e.pid,
                        thread: e.thread.clone(),
                        lock: lock.clone(),
                        req: e.t,
                        acq: None,
                        token: 0,
                        lease_left_us: None,
                        err: None,
                        end: None,
                        rel_lost: false,
                        cs: None,
                    });
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
                Kind::Rel { ok, lost, .. } => {
                    if !ok {
                        counts.add("releases_failed");
                    }
                    if *lost {
                        counts.add("holds_marked_lost");
                    }
                    if let Some(i) = open.remove(&key) {
                        attempts[i].end = Some(e.t);
                        attempts[i].rel_lost = !ok || *lost;
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
    // holds cut by a SIGKILL end at the kill
    for a in &mut attempts {
        if a.acq.is_some() && a.end.is_none() {
            a.end = Some(kill_time.get(&a.pid).copied().unwrap_or(u64::MAX));
        }
    }
    let err_in = |pid: u32, thread: &str, from: u64, to: u64| {
        errors
            .get(&(pid, thread.to_string()))
            .is_some_and(|v| v.iter().any(|&t| t >= from && t <= to))
    };

    let mut by_lock: BTreeMap<String, Vec<&Attempt>> = BTreeMap::new();
    for a in &attempts {
        by_lock.entry(a.lock.clone()).or_default().push(a);
    }
    let stopped_between = |pid: u32, from: u64, to: u64| {
        faults
            .iter()
            .any(|f| f.kind.starts_with("sigstop") && f.target == Some(pid) && f.overlaps(from, to))
    };
    // Why two holds h1 (earlier ACQ) and h2 may both think they hold: None when nothing does.
    let explain = |h1: &Attempt, h2: &Attempt| -> Option<&'static str> {
        let a2 = h2.acq.unwrap();
        if stopped_between(h1.pid, h1.req, a2) || stopped_between(h2.pid, h2.req, a2) {
            return Some("sigstop");
        }
        for f in &faults {
            if f.overlaps(h1.req.min(h2.req), a2) {
                if f.is_proxy() {
                    return Some("proxy");
                }
                if f.is_restart() {
                    return Some(if f.is_volatile_restart() {
                        "restart-volatile"
                    } else {
                        "restart-aof"
                    });
                }
            }
        }
        None
    };

    let excerpt = |lock: &str, from: u64, to: u64| -> String {
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
    };

    let mut in_overlap: HashSet<(u32, String, u64)> = HashSet::new();
    let mut overrun: HashSet<(u32, String, u64)> = HashSet::new();
    for a in &attempts {
        if a.lease_left_us == Some(0) {
            violations.push((
                "expired_grant".into(),
                format!(
                    "lock {}: {}/{} got token {} at {} with no lease left by its own estimate\n{}",
                    a.lock,
                    a.pid,
                    a.thread,
                    a.token,
                    a.acq.unwrap(),
                    excerpt(&a.lock, a.req, a.acq.unwrap())
                ),
            ));
        }
    }
    for (lock, list) in &by_lock {
        let mut holds: Vec<&Attempt> = list.iter().copied().filter(|a| a.acq.is_some()).collect();
        holds.sort_by_key(|a| a.acq.unwrap());

        // (1) overlaps
        let mut active: Vec<&Attempt> = Vec::new();
        for &h2 in &holds {
            let a2 = h2.acq.unwrap();
            active.retain(|h| h.end.unwrap() > a2);
            for &h1 in &active {
                if h1.pid == h2.pid && h1.thread == h2.thread {
                    continue;
                }
                in_overlap.insert((h1.pid, h1.thread.clone(), h1.acq.unwrap()));
                in_overlap.insert((h2.pid, h2.thread.clone(), a2));
                match explain(h1, h2) {
                    Some(why) => {
                        // count each hold that another outran once, not every pair
                        if overrun.insert((h1.pid, h1.thread.clone(), h1.acq.unwrap())) {
                            explained.add(&format!("holds_overlapped_{why}"));
                        }
                    }
                    None => {
                        let kind = if h1.rel_lost {
                            "overlap_lease_lost"
                        } else {
                            "overlap"
                        };
                        violations.push((
                            kind.into(),
                            format!(
                                "lock {lock}: {}/{} (token {}) held from {} to {}, {}/{} (token {}) acquired at {}\n{}",
                                h1.pid, h1.thread, h1.token, h1.acq.unwrap(), h1.end.unwrap(),
                                h2.pid, h2.thread, h2.token, a2,
                                excerpt(lock, h1.acq.unwrap(), a2)
                            ),
                        ));
                    }
                }
            }
            active.push(h2);
        }

        // (2) tokens granted in the order of the holds
        for w in holds.windows(2) {
            let (h1, h2) = (w[0], w[1]);
            if h2.token > h1.token || (h1.pid == h2.pid && h1.thread == h2.thread) {
                continue;
            }
            let (a1, a2) = (h1.acq.unwrap(), h2.acq.unwrap());
            if volatile_between(a1, a2) {
                explained.add("token_reset_restart_volatile");
            } else if explain(h1, h2).is_some_and(|w| w != "restart-aof") {
                explained.add("token_order_fault");
            } else {
                violations.push((
                    "token_order".into(),
                    format!(
                        "lock {lock}: token {} acquired at {a1} by {}/{}, then token {} at {a2} by {}/{}\n{}",
                        h1.token, h1.pid, h1.thread, h2.token, h2.pid, h2.thread,
                        excerpt(lock, a1, a2)
                    ),
                ));
            }
        }

        // (3) the counter chain
        let mut prev: Option<&Attempt> = None;
        let mut cut_since_prev = false; // a hold between prev and this one ended without CS
        for &h in &holds {
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
                    let overlapped = in_overlap.contains(&(p.pid, p.thread.clone(), from))
                        || in_overlap.contains(&(h.pid, h.thread.clone(), h.acq.unwrap()));
                    if before == 0 && volatile_between(pt, t) {
                        explained.add("counter_reset_restart_volatile");
                    } else if overlapped {
                        explained.add("counter_break_overlap");
                    } else if cut_since_prev {
                        explained.add("counter_break_cut_hold");
                    } else if faults.iter().any(|f| !f.is_kill() && f.overlaps(from, t)) {
                        explained.add("counter_break_fault_window");
                    } else {
                        violations.push((
                            "lost_update".into(),
                            format!(
                                "lock {lock}: counter {pbefore}->{pafter:?} by {}/{} at {pt}, then read {before} by {}/{} at {t}\n{}",
                                p.pid, p.thread, h.pid, h.thread, excerpt(lock, from, t)
                            ),
                        ));
                    }
                }
            }
            prev = Some(h);
            cut_since_prev = false;
        }

        // (4) FIFO: sort by REQ, suffix minimum of ACQ finds overtakers fast
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
            if any_fault(a.req, a_acq, None) || err_in(a.pid, &a.thread, a.req, a_acq) {
                continue;
            }
            for b in &reqs[j..] {
                if b.req > a_acq {
                    break;
                }
                if b.acq.unwrap() < a_acq && !err_in(b.pid, &b.thread, a.req, a_acq) {
                    violations.push((
                        "fifo".into(),
                        format!(
                            "lock {lock}: {}/{} asked at {} and got it at {a_acq}; {}/{} asked {:.1} ms later and got it at {}\n{}",
                            a.pid, a.thread, a.req, b.pid, b.thread,
                            ms(b.req - a.req), b.acq.unwrap(), excerpt(lock, a.req, a_acq)
                        ),
                    ));
                    break;
                }
            }
        }
    }

    // (2) the fenced resource, in Redis's order
    // (lock, epoch) -> accepted writes as (seq, token, pid, thread, t)
    type Writes = Vec<(u64, u64, u32, String, u64)>;
    let mut epochs: BTreeMap<(String, String), Writes> = BTreeMap::new();
    for (t, lock, token, outcome, pid, thread) in &fences {
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
            if t2 < t1 {
                violations.push((
                    "stale_token_accepted".into(),
                    format!("lock {lock}: resource accepted token {t2} ({p2}/{th2} at {at2}) after token {t1} ({p1}/{th1} at {at1})"),
                ));
            } else if t2 == t1 && (p1 != p2 || th1 != th2) {
                violations.push((
                    "token_reused".into(),
                    format!("lock {lock}: token {t1} written by {p1}/{th1} at {at1} and by {p2}/{th2} at {at2}\n{}",
                        excerpt(lock, *at1.min(at2), *at1.max(at2))),
                ));
            }
        }
    }
    let volatile_restarts = faults.iter().filter(|f| f.is_volatile_restart()).count() as u64;
    for (lock, n) in &epochs_per_lock {
        if *n > volatile_restarts + 1 {
            violations.push((
                "state_lost".into(),
                format!("lock {lock}: the resource started over {} times but Redis restarted without persistence {volatile_restarts} times", n - 1),
            ));
        }
    }

    // (5) liveness in the quiet phase
    let patience = p.lease_ns + 3 * S;
    let mut worst_quiet_wait = 0u64;
    if let (Some(&quiet), Some(&stop)) = (phases.get("quiet"), phases.get("stop")) {
        for a in &attempts {
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
                    violations.push((
                        "liveness".into(),
                        format!(
                            "lock {}: {}/{} got an error at {e} in the quiet phase\n{}",
                            a.lock,
                            a.pid,
                            a.thread,
                            excerpt(&a.lock, a.req, e)
                        ),
                    ));
                }
                continue;
            }
            if waited > patience && from + patience <= stop {
                violations.push((
                    "liveness".into(),
                    format!(
                        "lock {}: {}/{} asked at {} and waited {:.0} ms in the quiet phase (limit {:.0} ms)\n{}",
                        a.lock, a.pid, a.thread, a.req, ms(waited), ms(patience),
                        excerpt(&a.lock, from, from + patience)
                    ),
                ));
            }
        }
    } else {
        violations.push(("liveness".into(), "no quiet phase was recorded".into()));
    }

    // recovery after a holder's death
    let mut recoveries: Vec<(u64, bool)> = Vec::new();
    for f in faults.iter().filter(|f| f.is_kill()) {
        let Some(pid) = f.target else { continue };
        for (lock, list) in &by_lock {
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
            let clean = !any_fault(f.start, next, Some(f));
            recoveries.push((took, clean));
            if clean && took > p.lease_ns + S {
                violations.push((
                    "slow_recovery".into(),
                    format!(
                        "lock {lock}: holder {pid} killed at {}, next acquisition {:.0} ms later\n{}",
                        f.start,
                        ms(took),
                        excerpt(lock, f.start, next)
                    ),
                ));
            }
        }
    }

    // (6), (7)
    for (key, pttl) in &end.leftover_keys {
        violations.push((
            "keys_left".into(),
            format!("key {key:?} (PTTL {pttl} ms) left after the run"),
        ));
    }
    for (pid, line) in &end.panics {
        violations.push(("panic".into(), format!("worker {pid}: {line}")));
    }
    for (idx, pid, code, killed) in &end.exits {
        if !killed && *code != Some(0) {
            violations.push((
                "worker_exit".into(),
                format!("worker {idx} (pid {pid}) exited with {code:?}"),
            ));
        }
    }

    let mut by_kind = Counts::default();
    for (k, _) in &violations {
        by_kind.add(k);
    }
    let worst = recoveries.iter().map(|r| r.0).max();
    let worst_clean = recoveries.iter().filter(|r| r.1).map(|r| r.0).max();
    let summary = json!({
        "scenario": p.scenario,
        "duration_s": (last_t.saturating_sub(first_t)) as f64 / 1e9,
        "lease_ms": p.lease_ns / MS,
        "counts": counts.json(),
        "torn_lines": torn,
        "faults": fault_counts.json(),
        "violations": by_kind.json(),
        "violations_total": violations.len(),
        "explained": explained.json(),
        "recoveries_measured": recoveries.len(),
        "worst_recovery_ms": worst.map(ms),
        "worst_recovery_without_other_fault_ms": worst_clean.map(ms),
        "recovery_limit_ms": ms(p.lease_ns + S),
        "worst_wait_in_quiet_phase_ms": ms(worst_quiet_wait),
        "resource_epochs": epochs_per_lock,
    });
    Report {
        violations,
        summary,
    }
}
