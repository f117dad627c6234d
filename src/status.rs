//! [`LockStatus`]: a snapshot of one lock for people and tools.

use std::time::Duration;

use crate::raw::RawStatus;

/// Who holds a lock and who waits for it, read in one atomic step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockStatus {
    /// The lock name.
    pub name: String,
    /// The current holder, if any.
    pub holder: Option<Holder>,
    /// The last fencing token handed out for this name (0 if never locked).
    pub fencing_counter: u64,
    /// Waiters in queue order (the first is served next).
    pub waiters: Vec<Waiter>,
}

/// Where a holder or waiter runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    /// Owner id: `<client id>:<thread number>`.
    pub owner: String,
    /// Host name of the machine.
    pub host: String,
    /// Process id.
    pub pid: u32,
    /// Thread name (`unnamed` when the thread has none).
    pub thread: String,
}

/// The holder of a lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    /// Who holds it.
    pub origin: Origin,
    /// Re-entry depth.
    pub hold_count: u32,
    /// The hold's fencing token.
    pub fencing_token: u64,
    /// Lease left on the server.
    pub lease_remaining: Duration,
    /// How long this hold has lasted (server clock).
    pub held_for: Duration,
}

/// A waiter in the queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiter {
    /// Who waits.
    pub origin: Origin,
    /// How long since its first attempt reached Redis (server clock).
    pub waiting_for: Duration,
}

fn origin(owner: String, meta: &str) -> Origin {
    let mut parts = meta.splitn(3, '|');
    let host = parts.next().unwrap_or("").to_string();
    let pid = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let thread = parts.next().unwrap_or("").to_string();
    Origin {
        owner,
        host,
        pid,
        thread,
    }
}

fn ms(v: i64) -> Duration {
    Duration::from_millis(v.max(0) as u64)
}

impl LockStatus {
    pub(crate) fn from_raw(name: &str, raw: RawStatus) -> LockStatus {
        let holder = (!raw.owner.is_empty()).then(|| Holder {
            origin: origin(raw.owner.clone(), &raw.meta),
            hold_count: raw.count.max(0) as u32,
            fencing_token: raw.token,
            lease_remaining: ms(raw.pttl_ms),
            held_for: ms(raw.server_ms - raw.since_ms),
        });
        let waiters = raw
            .queue
            .into_iter()
            .map(|(owner, arrival_us, meta)| Waiter {
                origin: origin(owner, &meta),
                waiting_for: ms(raw.server_ms - arrival_us / 1000),
            })
            .collect();
        LockStatus {
            name: name.to_string(),
            holder,
            fencing_counter: raw.fence,
            waiters,
        }
    }
}
