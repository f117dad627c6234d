//! Metrics through the `metrics` facade (feature `metrics`, off by default): what the library
//! records, under which names and labels. Without the feature every function here is empty and
//! compiles away. The application installs a recorder (an exporter) of its choice; fairlock
//! depends on none.
//!
//! | name | kind | labels | what |
//! |---|---|---|---|
//! | `fairlock_acquisitions_total` | counter | `outcome`: `acquired`, `timed_out`, `busy`, `abandoned`, `error` | acquisitions (`lock`, `try_lock*`) by how they ended; re-entries are counted apart |
//! | `fairlock_wait_seconds` | histogram | `outcome` | how long each of those took, from the call to its outcome |
//! | `fairlock_hold_seconds` | histogram | | how long a hold lasted, from the grant to its last guard's release (or leak) |
//! | `fairlock_handoffs_total` | counter | | grants a waiting thread received from a release (it had queued) |
//! | `fairlock_reentries_total` | counter | | re-entries by a thread that holds the lock |
//! | `fairlock_lease_renewals_total` | counter | | leases renewed by the watchdog |
//! | `fairlock_lease_renewal_failures_total` | counter | | renewals that failed on the network (retried) |
//! | `fairlock_holds_lost_total` | counter | `cause`: `taken_or_gone`, `lease_ran_out`, `at_release`, `at_reentry` | holds found lost |
//! | `fairlock_janitor_repairs_total` | counter | | what the janitor repaired: hand-offs revoked from dead grantees, stranded locks (a dead holder's, with waiters) granted to the live head |
//! | `fairlock_janitor_requeues_total` | counter | | waiters the janitor told to queue again (they had lost their place) |
//! | `fairlock_redis_errors_total` | counter | `kind`: an [`ErrorKind`] in snake case | calls to Redis that failed, best-effort ones included (an acquisition that fails also leaves its place: two calls) |
//! | `fairlock_waiting_threads` | gauge | | threads waiting for a lock now |
//! | `fairlock_held_locks` | gauge | | holds this process has now |
//!
//! Semaphores and read/write locks are not counted in the acquisition, wait, hold, hand-off and
//! gauge metrics (those are the locks'). They count in `fairlock_lease_renewals_total` and its
//! failures (their permits are renewed in the same round trips), `fairlock_holds_lost_total`
//! (a permit the watchdog found lost), `fairlock_janitor_repairs_total` (a semaphore's heartbeat
//! counts the waiters it granted: permits freed by an expired lease or a revoked hand-off),
//! `fairlock_janitor_requeues_total` and `fairlock_redis_errors_total`.
//!
//! With `LockClientBuilder::metrics_lock_label(true)` the acquisition, wait, hold, hand-off,
//! re-entry and loss metrics also carry `lock` = the lock name: one series per name, so only
//! for a bounded set of names.

use std::time::Duration;

use crate::error::ErrorKind;

/// How an acquisition ended, for `fairlock_acquisitions_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Acquired,
    TimedOut,
    Busy,
    Abandoned,
    /// Refused to break a deadlock (`Error::Deadlock`).
    Deadlock,
    Error,
}

impl Outcome {
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Acquired => "acquired",
            Outcome::TimedOut => "timed_out",
            Outcome::Busy => "busy",
            Outcome::Abandoned => "abandoned",
            Outcome::Deadlock => "deadlock",
            Outcome::Error => "error",
        }
    }
}

/// `kind` in snake case, for `fairlock_redis_errors_total`.
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
fn kind_label(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::InvalidInput => "invalid_input",
        ErrorKind::Unavailable => "unavailable",
        ErrorKind::Server => "server",
        ErrorKind::ForeignData => "foreign_data",
        ErrorKind::NotHeld => "not_held",
        ErrorKind::Abandoned => "abandoned",
        ErrorKind::Deadlock => "deadlock",
        ErrorKind::Client => "client",
        ErrorKind::Permission => "permission",
        ErrorKind::Unexpected => "unexpected",
    }
}

#[cfg(feature = "metrics")]
mod imp {
    use super::*;

    /// `metrics`' labels: `pairs`, and `lock` when given.
    fn labels(pairs: &[(&'static str, &'static str)], lock: Option<&str>) -> Vec<metrics::Label> {
        let mut labels: Vec<metrics::Label> = pairs
            .iter()
            .map(|(k, v)| metrics::Label::new(*k, *v))
            .collect();
        if let Some(lock) = lock {
            labels.push(metrics::Label::new("lock", lock.to_string()));
        }
        labels
    }

    pub fn acquisition(outcome: Outcome, took: Duration, lock: Option<&str>) {
        let l = labels(&[("outcome", outcome.as_str())], lock);
        metrics::counter!("fairlock_acquisitions_total", l.clone()).increment(1);
        metrics::histogram!("fairlock_wait_seconds", l).record(took.as_secs_f64());
    }

    pub fn held(took: Duration, lock: Option<&str>) {
        metrics::histogram!("fairlock_hold_seconds", labels(&[], lock)).record(took.as_secs_f64());
    }

    pub fn handoff(lock: Option<&str>) {
        metrics::counter!("fairlock_handoffs_total", labels(&[], lock)).increment(1);
    }

    pub fn reentry(lock: Option<&str>) {
        metrics::counter!("fairlock_reentries_total", labels(&[], lock)).increment(1);
    }

    pub fn renewals(renewed: u64, failed: u64) {
        if renewed > 0 {
            metrics::counter!("fairlock_lease_renewals_total").increment(renewed);
        }
        if failed > 0 {
            metrics::counter!("fairlock_lease_renewal_failures_total").increment(failed);
        }
    }

    pub fn hold_lost(cause: &'static str, lock: Option<&str>) {
        metrics::counter!(
            "fairlock_holds_lost_total",
            labels(&[("cause", cause)], lock)
        )
        .increment(1);
    }

    pub fn requeued(n: u64) {
        if n > 0 {
            metrics::counter!("fairlock_janitor_requeues_total").increment(n);
        }
    }

    pub fn repaired(n: u64) {
        if n > 0 {
            metrics::counter!("fairlock_janitor_repairs_total").increment(n);
        }
    }

    pub fn error(kind: ErrorKind) {
        metrics::counter!("fairlock_redis_errors_total", "kind" => kind_label(kind)).increment(1);
    }

    pub fn waiting(delta: f64) {
        metrics::gauge!("fairlock_waiting_threads").increment(delta);
    }

    pub fn holding(delta: f64) {
        metrics::gauge!("fairlock_held_locks").increment(delta);
    }
}

#[cfg(not(feature = "metrics"))]
#[allow(unused_variables)]
mod imp {
    use super::*;

    pub fn acquisition(outcome: Outcome, took: Duration, lock: Option<&str>) {}
    pub fn held(took: Duration, lock: Option<&str>) {}
    pub fn handoff(lock: Option<&str>) {}
    pub fn reentry(lock: Option<&str>) {}
    pub fn renewals(renewed: u64, failed: u64) {}
    pub fn hold_lost(cause: &'static str, lock: Option<&str>) {}
    pub fn requeued(n: u64) {}
    pub fn repaired(n: u64) {}
    pub fn error(kind: ErrorKind) {}
    pub fn waiting(delta: f64) {}
    pub fn holding(delta: f64) {}
}

pub(crate) use imp::*;

/// Counts a thread in `fairlock_waiting_threads` while it lives.
pub(crate) struct Waiting;

impl Waiting {
    pub fn start() -> Waiting {
        waiting(1.0);
        Waiting
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        waiting(-1.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_outcome_and_kind_has_a_snake_case_label() {
        for o in [
            Outcome::Acquired,
            Outcome::TimedOut,
            Outcome::Busy,
            Outcome::Abandoned,
            Outcome::Error,
        ] {
            let s = o.as_str();
            assert!(s.chars().all(|c| c.is_ascii_lowercase() || c == '_'), "{s}");
        }
        assert_eq!(kind_label(ErrorKind::Permission), "permission");
        assert_eq!(kind_label(ErrorKind::InvalidInput), "invalid_input");
    }
}
