//! `fairlock list`: every lock under the key prefix, one line each (stale-looking holds marked
//! `!`, locks in a deadlock `D`), or a JSON array of the objects `status --json` prints.

use fairlock::{Deadlock, HoldKind, ListOptions, LockClient, LockListing, LockStatus, StaleSigns};

use crate::duration::human;
use crate::exit::{say, Failure};
use crate::status::{describe_origin, print, to_json};

/// How many skipped names the warning on stderr names.
const SKIPPED_SHOWN: usize = 5;

/// List the locks: held or waited for, or with `all` idle ones too.
/// `eviction_accepted`: as for `status`, the text says so.
pub fn list(
    client: &LockClient,
    as_json: bool,
    all: bool,
    semaphores: bool,
    eviction_accepted: bool,
) -> Result<u8, Failure> {
    let listing = client.list_locks(ListOptions::new().include_idle(all))?;
    // reads again only the locks of a cycle the listing shows
    let deadlocks = client.deadlocks_in(&listing)?;
    let text = if as_json {
        let array: Vec<serde_json::Value> = listing
            .locks
            .iter()
            .map(|lock| {
                let mut json = to_json(lock);
                json["stale"] = stale_words(listing.stale_signs(lock)).into();
                json["deadlocked"] = in_cycle(&deadlocks, &lock.name, HoldKind::Lock).into();
                json
            })
            .collect();
        let array: Vec<serde_json::Value> = if semaphores {
            // the semaphores' objects have another shape: never mixed with the locks'
            listing
                .semaphores
                .iter()
                .map(|st| {
                    let mut json = crate::status::semaphore_json(st);
                    json["deadlocked"] = in_cycle(&deadlocks, &st.name, HoldKind::Semaphore).into();
                    json
                })
                .collect()
        } else {
            array
        };
        let mut s = serde_json::to_string_pretty(&array)
            .map_err(|e| Failure::new(crate::exit::SOFTWARE, e.to_string()))?;
        s.push('\n');
        s
    } else {
        let mut s = to_text(&listing, &deadlocks, all);
        if eviction_accepted {
            s += "warning: the server may evict keys (--danger-accept-eviction): a lock can get a second holder\n";
        }
        s
    };
    print(&text);
    if !listing.skipped.is_empty() {
        say(&skipped_warning(&listing));
    }
    Ok(0)
}

/// Whether `name` (a lock, or with another kind a semaphore) is one of a cycle's locks.
fn in_cycle(deadlocks: &[Deadlock], name: &str, kind: HoldKind) -> bool {
    deadlocks.iter().any(|d| d.involves(name, kind))
}

/// The mark before a row: `!` for a stale-looking hold, `D` for a lock in a deadlock.
fn mark(stale: bool, deadlocked: bool) -> &'static str {
    match (stale, deadlocked) {
        (false, false) => "  ",
        (true, false) => "! ",
        (false, true) => "D ",
        (true, true) => "!D",
    }
}

/// The stale signs as the words `--json` prints: `lease_running_out`, `held_unusually_long`.
fn stale_words(signs: StaleSigns) -> Vec<&'static str> {
    let mut words = Vec::new();
    if signs.lease_running_out {
        words.push("lease_running_out");
    }
    if signs.held_unusually_long {
        words.push("held_unusually_long");
    }
    words
}

/// Text from Redis (a host, a thread name) without control characters, for one table cell.
fn clean(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// The table, sorted by name as the listing is, then a note per stale-looking hold and a
/// summary line.
fn to_text(listing: &LockListing, deadlocks: &[Deadlock], all: bool) -> String {
    let header = [
        "NAME",
        "HOLDER",
        "HELD FOR",
        "LEASE LEFT",
        "WAITERS",
        "TOKEN",
    ];
    let rows: Vec<(&str, [String; 6])> = listing
        .locks
        .iter()
        .map(|lock| {
            let dead = in_cycle(deadlocks, &lock.name, HoldKind::Lock);
            (mark(listing.stale_signs(lock).any(), dead), row(lock))
        })
        .collect();
    let mut widths = header.map(|h| h.chars().count());
    for (_, cells) in &rows {
        for (w, cell) in widths.iter_mut().zip(cells) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |mark: &str, cells: &[String; 6]| {
        let mut l = String::from(mark);
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == cells.len() {
                l += cell;
            } else {
                l += &format!("{cell:<w$}  ");
            }
        }
        l.trim_end().to_string() + "\n"
    };
    let mut s = String::new();
    if !rows.is_empty() {
        s += &line("  ", &header.map(String::from));
        for (mark, cells) in &rows {
            s += &line(mark, cells);
        }
        s += "\n";
    }
    let mut stale = 0;
    for lock in &listing.locks {
        let (Some(h), signs) = (&lock.holder, listing.stale_signs(lock)) else {
            continue;
        };
        if signs.any() {
            stale += 1;
        }
        if signs.held_unusually_long {
            let usual = listing.usual_hold.map(human).unwrap_or_default();
            s += &format!(
                "! {}: held for {}, more than {} times the usual {usual}: a hung job or a leaked guard?\n",
                lock.name,
                human(h.held_for),
                fairlock::UNUSUALLY_LONG_FACTOR
            );
        }
        if signs.lease_running_out {
            s += &format!(
                "! {}: {} of its {} lease left: renewals were missed (a stalled or dead holder?), or a fixed lease is ending\n",
                lock.name,
                human(h.lease_remaining),
                human(h.lease)
            );
        }
    }
    let what = if all {
        "locks"
    } else {
        "locks held or waited for"
    };
    s += &format!(
        "{} {what}, {stale} stale-looking; {} scanned with {}",
        listing.locks.len(),
        count(listing.masters as u64, "master"),
        count(listing.scan_calls, "SCAN call")
    );
    if listing.foreign_keys > 0 {
        s += &format!(
            "; {} under the prefix ignored",
            count(listing.foreign_keys, "other key")
        );
    }
    s += "\n";
    if !deadlocks.is_empty() {
        s += &format!(
            "D {} in a cycle of waits: see fairlock deadlocks\n",
            count(deadlocks.len() as u64, "deadlock")
        );
    }
    if !listing.semaphores.is_empty() {
        s += &semaphores_text(&listing.semaphores, deadlocks);
    }
    s
}

/// The semaphores (and read/write locks) as a second table, then a summary line.
fn semaphores_text(sems: &[fairlock::SemaphoreStatus], deadlocks: &[Deadlock]) -> String {
    let mut s = String::from("\n");
    let marks: Vec<&str> = std::iter::once("  ")
        .chain(
            sems.iter()
                .map(|st| mark(false, in_cycle(deadlocks, &st.name, HoldKind::Semaphore))),
        )
        .collect();
    let rows: Vec<[String; 5]> = sems
        .iter()
        .map(|st| {
            let capacity = st.capacity.map_or("-".into(), |c| {
                if c == 1 << 30 {
                    "rw".to_string()
                } else {
                    c.to_string()
                }
            });
            [
                clean(&st.name),
                format!("{} of {capacity}", st.permits_held),
                st.holders.len().to_string(),
                st.waiters.len().to_string(),
                st.fencing_counter.to_string(),
            ]
        })
        .collect();
    let header = ["SEMAPHORE", "PERMITS HELD", "HOLDERS", "WAITERS", "TOKEN"];
    let mut widths = header.map(|h| h.chars().count());
    for cells in &rows {
        for (w, cell) in widths.iter_mut().zip(cells) {
            *w = (*w).max(cell.chars().count());
        }
    }
    for (cells, mark) in std::iter::once(header.map(String::from))
        .chain(rows)
        .zip(marks)
    {
        let mut l = String::from(mark);
        for (cell, w) in cells.iter().zip(widths) {
            l += &format!("{cell:<w$}  ");
        }
        s += l.trim_end();
        s += "\n";
    }
    s += &format!(
        "{} (a read/write lock shows as rw)\n",
        count(sems.len() as u64, "semaphore")
    );
    s
}

/// `1 master`, `3 masters`.
fn count(n: u64, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

fn row(lock: &LockStatus) -> [String; 6] {
    let waiters = lock.waiters.len().to_string();
    match &lock.holder {
        Some(h) => {
            let mut holder = clean(&describe_origin(&h.origin));
            if h.hold_count > 1 {
                holder += &format!(" x{}", h.hold_count);
            }
            [
                lock.name.clone(),
                holder,
                human(h.held_for),
                format!("{} of {}", human(h.lease_remaining), human(h.lease)),
                waiters,
                h.fencing_token.to_string(),
            ]
        }
        None => [
            lock.name.clone(),
            "(free)".into(),
            "-".into(),
            "-".into(),
            waiters,
            "-".into(),
        ],
    }
}

/// One line naming the skipped names (the first few) and why.
fn skipped_warning(listing: &LockListing) -> String {
    let shown: Vec<String> = listing
        .skipped
        .iter()
        .take(SKIPPED_SHOWN)
        .map(|s| {
            let why = match &s.error {
                fairlock::Error::InvalidName { reason, .. } => format!("not a lock name: {reason}"),
                fairlock::Error::ForeignData { .. } => "another program's data".to_string(),
                other => other.to_string(),
            };
            format!("{:?} ({why})", s.name)
        })
        .collect();
    let more = listing.skipped.len().saturating_sub(SKIPPED_SHOWN);
    let more = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    format!(
        "skipped {} under the key prefix that are not fairlock's locks: {}{more}",
        count(listing.skipped.len() as u64, "name"),
        shown.join(", ")
    )
}
