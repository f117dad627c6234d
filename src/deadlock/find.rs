//! [`LockClient::find_deadlocks`] and [`LockClient::deadlocks_in`]: the graph of a listing,
//! confirmed by a second reading of the locks it rests on.

use std::collections::BTreeSet;

use crate::client::LockClient;
use crate::cycle::Deadlock;
use crate::deadlock::chase::read_resource;
use crate::deadlock::graph::analyse;
use crate::deadlock::report::deadlock;
use crate::deadlock::snapshot::Resource;
use crate::error::Result;
use crate::list::{ListOptions, LockListing};

impl LockClient {
    /// Every deadlock among the holds and waits under this client's key prefix: cycles of
    /// holders each waiting for a lock (or semaphore, or read/write lock) the next one holds.
    /// Nothing is changed or refused: this only reads.
    ///
    /// It lists the locks ([`LockClient::list_locks`]: a `SCAN` of every master and one status
    /// read per name) and then confirms what it found with [`LockClient::deadlocks_in`]: see
    /// there for what is reported as proven and what is not.
    ///
    /// ```no_run
    /// let client = fairlock::LockClient::connect("redis://127.0.0.1:6379/")?;
    /// for cycle in client.find_deadlocks()? {
    ///     for m in &cycle.members {
    ///         println!(
    ///             "{:?} is held by {} pid {} (thread {}), which waits for {:?}",
    ///             m.lock.name, m.holder.host, m.holder.pid, m.holder.thread, m.waits_for.name
    ///         );
    ///     }
    /// }
    /// # Ok::<(), fairlock::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`LockClient::list_locks`]: [`Error::Connection`](crate::Error::Connection) when a
    /// master cannot be reached, [`Error::PermissionDenied`](crate::Error::PermissionDenied)
    /// when the user may not `SCAN` or run the status scripts.
    pub fn find_deadlocks(&self) -> Result<Vec<Deadlock>> {
        let listing = self.list_locks(ListOptions::new())?;
        self.deadlocks_in(&listing)
    }

    /// The deadlocks in `listing` (from [`LockClient::list_locks`]) that a second reading
    /// confirms.
    ///
    /// **What is proven.** The listing's statuses build a wait-for graph among owners
    /// (`<client id>:<thread>`): a waiter is blocked for ever when a waiter ahead of it in the
    /// same queue is (queues are served in order), or when the holders that are blocked hold so
    /// many permits that even if every other holder released, what it wants would not fit (for
    /// a lock: its holder is blocked). Owners that do not wait are assumed to finish and
    /// release. The cycles among the blocked owners are the deadlocks, one per strongly
    /// connected set (`docs/design.md`, "Deadlocks: the wait-for graph").
    ///
    /// **The confirming read.** The listing is no snapshot: each name is read at another
    /// moment, so it can show a cycle that never stood at one moment. So the status of each
    /// lock a blocked owner waits for is read again (one status call per lock), and the graph
    /// is built again from what stood through both readings only: a hold with the same fencing
    /// token in both, a wait with the same `queued_at` in both. Each of those lasted, unbroken,
    /// from its first reading to its second, and every first reading was made before every
    /// second one, so all of them stood together at one moment between the two: a cycle they
    /// make was a deadlock then. A cycle that dissolved between the readings is not reported.
    ///
    /// **What is not decided.** A member whose wait has a time limit
    /// ([`FairLock::try_lock_for`](crate::FairLock::try_lock_for)) leaves on its own when it runs
    /// out; a dead member's hold ends with its lease. A wait for permits that a holder outside
    /// the blocked set could free is not a deadlock (it may be served), and nor is a wait for a
    /// semaphore whose capacity is not stored, or changed between the readings, unless a
    /// blocked waiter is ahead of it. A cycle found may be gone by the time it is reported.
    ///
    /// # Errors
    /// [`Error::Connection`](crate::Error::Connection) when Redis cannot be reached,
    /// [`Error::PermissionDenied`](crate::Error::PermissionDenied) when the user may not run
    /// the status scripts.
    pub fn deadlocks_in(&self, listing: &LockListing) -> Result<Vec<Deadlock>> {
        let first: Vec<Resource> = listing
            .locks
            .iter()
            .map(Resource::of_lock)
            .chain(listing.semaphores.iter().map(Resource::of_semaphore))
            .collect();
        let (first, analysis) = analyse(first);
        if analysis.cycles.is_empty() {
            return Ok(Vec::new());
        }
        // the locks the proofs rest on: those the blocked owners wait for
        let needed: BTreeSet<usize> = first
            .iter()
            .enumerate()
            .filter(|(_, r)| {
                r.waits
                    .iter()
                    .any(|w| analysis.blocked.contains(&w.origin.owner))
            })
            .map(|(i, _)| i)
            .collect();
        let mut stood = Vec::new();
        for i in needed {
            let again = read_resource(&self.inner, &first[i].key())?;
            stood.push(first[i].intersect(&again));
        }
        let (stood, confirmed) = analyse(stood);
        Ok(confirmed
            .cycles
            .iter()
            .map(|c| deadlock(&stood, c))
            .collect())
    }
}
