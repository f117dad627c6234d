//! Shrinking a failing run: replay the recorded steps and drop chunks (halves, quarters, ... single
//! steps) while the same check still fails; steps a failing replay skipped (they no longer fit
//! the state) go too. Timing makes a replay imperfect, so each candidate gets two tries; the
//! whole search stops after a time budget. A liveness failure is searched with a shorter quiet
//! phase (a stuck waiter stays stuck), and the result is replayed once with the full one.

use std::time::{Duration, Instant};

use crate::fuzz::checks::Check;
use crate::fuzz::model::Config;
use crate::fuzz::runner::{run, Outcome, Source, QUIET_LIMIT};
use crate::fuzz::steps::Step;

/// The quiet phase's limit while shrinking: many times the leases and the waiter timeout.
const SHRINK_QUIET_LIMIT: Duration = Duration::from_secs(6);

/// The liveness check needs the quiet phase; the others fail during the steps.
fn quiet_for(check: Check, limit: Duration) -> Option<Duration> {
    (check == Check::Liveness).then_some(limit)
}

/// Replay `steps` (twice at most) and return the run if it fails the same check.
fn fails(cfg: &Config, steps: &[Step], check: Check, quiet: Duration) -> Option<Outcome> {
    for _ in 0..2 {
        let out = run(cfg, Source::Replay(steps), quiet_for(check, quiet));
        if out
            .violation
            .as_ref()
            .is_some_and(|(_, v)| v.check == check)
        {
            return Some(out);
        }
    }
    None
}

/// The steps that did something, up to and including the failing one (all of them for the
/// quiet phase's checks).
fn prefix(out: &Outcome) -> Vec<Step> {
    let end = match &out.violation {
        Some((i, _)) if *i < out.steps.len() => *i + 1,
        _ => out.steps.len(),
    };
    out.steps[..end]
        .iter()
        .zip(&out.applied)
        .filter(|(_, applied)| **applied)
        .map(|(s, _)| s.clone())
        .collect()
}

/// The shortest failing replay found within `budget`, or `None` when the failure did not
/// reproduce at all.
pub fn shrink(cfg: &Config, failing: &Outcome, budget: Duration) -> Option<Outcome> {
    let began = Instant::now();
    let check = failing.violation.as_ref()?.1.check;
    let mut best = fails(cfg, &prefix(failing), check, QUIET_LIMIT)?;
    let mut current = prefix(&best);
    let mut chunk = current.len().div_ceil(2).max(1);
    'outer: loop {
        let mut start = 0;
        while start < current.len() {
            if began.elapsed() > budget {
                break 'outer;
            }
            let end = (start + chunk).min(current.len());
            let mut candidate = current[..start].to_vec();
            candidate.extend_from_slice(&current[end..]);
            match fails(cfg, &candidate, check, SHRINK_QUIET_LIMIT) {
                Some(out) => {
                    current = prefix(&out);
                    best = out;
                }
                None => start = end,
            }
        }
        if chunk == 1 {
            break;
        }
        chunk = chunk.div_ceil(2);
    }
    // a last replay without the steps the best run skipped, and (for liveness) with the full
    // quiet phase; keep the best run when it does not fail again
    let limit = if check == Check::Liveness {
        QUIET_LIMIT
    } else {
        SHRINK_QUIET_LIMIT
    };
    if current.len() < best.steps.len() || check == Check::Liveness {
        if let Some(out) = fails(cfg, &current, check, limit) {
            best = out;
        }
    }
    Some(best)
}
