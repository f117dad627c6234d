//! `fairlock status` and `fairlock release --force` (and the JSON object of a lock that `list`
//! prints too).

use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fairlock::{FairLock, LockStatus, Origin, Semaphore, SemaphoreStatus};
use serde_json::json;

use crate::duration::human;
use crate::exit::Failure;

/// "web-1 pid 4242 (thread "run: backup.sh")"
pub fn describe_origin(o: &Origin) -> String {
    format!("{} pid {} (thread {:?})", o.host, o.pid, o.thread)
}

/// Print the lock's status, for people or as JSON.
/// `eviction_accepted`: the client was told to use a server that may evict keys, which both
/// forms say.
pub fn status(lock: &FairLock, as_json: bool, eviction_accepted: bool) -> Result<u8, Failure> {
    let st = lock.status()?;
    let text = if as_json {
        let mut json = to_json(&st);
        json["eviction_accepted"] = serde_json::Value::Bool(eviction_accepted);
        let mut s = serde_json::to_string_pretty(&json)
            .map_err(|e| Failure::new(crate::exit::SOFTWARE, e.to_string()))?;
        s.push('\n');
        s
    } else if eviction_accepted {
        format!(
            "{}warning: the server may evict keys (--danger-accept-eviction): a lock can get a second holder\n",
            to_text(&st)
        )
    } else {
        to_text(&st)
    };
    print(&text);
    Ok(0)
}

/// Force-release the lock, saying who held it.
pub fn release(lock: &FairLock) -> Result<u8, Failure> {
    // read first, then release exactly that hold (owner and token): a request repeated after a
    // lost reply can then never release the holder after it
    let before = lock.status()?;
    let released = match &before.holder {
        Some(h) => lock
            .force_unlock_hold(&h.origin.owner, h.fencing_token)?
            .then(|| h.origin.owner.clone()),
        None => lock.force_unlock()?,
    };
    let text = match released {
        None => format!("lock {:?} was free: nothing to release\n", lock.name()),
        Some(owner) => {
            let who = match &before.holder {
                Some(h) if h.origin.owner == owner => format!(
                    "{}, owner {}, fencing token {}, held for {}",
                    describe_origin(&h.origin),
                    owner,
                    h.fencing_token,
                    human(h.held_for)
                ),
                _ => format!("owner {owner}"),
            };
            let next = if before.waiters.is_empty() {
                "it is free now".to_string()
            } else {
                "the next waiter gets it".to_string()
            };
            format!(
                "released lock {:?}, which was held by {who}; {next}\n",
                lock.name()
            )
        }
    };
    print(&text);
    Ok(0)
}

/// Print a semaphore's status, for people or as JSON.
pub fn semaphore_status(sem: &Semaphore, as_json: bool) -> Result<u8, Failure> {
    let st = sem.status()?;
    let text = if as_json {
        let mut s = serde_json::to_string_pretty(&semaphore_json(&st))
            .map_err(|e| Failure::new(crate::exit::SOFTWARE, e.to_string()))?;
        s.push('\n');
        s
    } else {
        semaphore_text(&st)
    };
    print(&text);
    Ok(0)
}

/// Release one holder of a semaphore by force: exactly the hold `hold_id` with the token
/// `status` shows for it now (a request repeated after a lost reply never releases another).
pub fn release_permits(sem: &Semaphore, hold_id: &str) -> Result<u8, Failure> {
    let before = sem.status()?;
    let Some(h) = before.holders.iter().find(|h| h.hold_id == hold_id) else {
        print(&format!(
            "semaphore {:?} has no holder {hold_id:?}: nothing to release (see fairlock status --semaphore)\n",
            sem.name()
        ));
        return Ok(0);
    };
    let text = if sem.force_release(hold_id, h.fencing_token)? {
        format!(
            "released {} permits of semaphore {:?}, which were held by {}, fencing token {}; the next waiters they fit get them\n",
            h.permits,
            sem.name(),
            describe_origin(&h.origin),
            h.fencing_token
        )
    } else {
        format!(
            "semaphore {:?}: holder {hold_id:?} gave its permits back meanwhile: nothing to release\n",
            sem.name()
        )
    };
    print(&text);
    Ok(0)
}

fn semaphore_text(st: &SemaphoreStatus) -> String {
    let mut s = match st.capacity {
        Some(cap) => format!(
            "semaphore {:?}: {} of {cap} permits held\n",
            st.name, st.permits_held
        ),
        None => format!("semaphore {:?}: unused\n", st.name),
    };
    s += &format!("  fencing counter: {}\n", st.fencing_counter);
    if st.holders.is_empty() {
        s += "  holders:         none\n";
    } else {
        s += &format!("  holders:         {}\n", st.holders.len());
        for h in &st.holders {
            s += &format!(
                "    {} permits: {}, fencing token {}, lease left {} of {}, hold {}\n",
                h.permits,
                describe_origin(&h.origin),
                h.fencing_token,
                human(h.lease_remaining),
                human(h.lease),
                h.hold_id
            );
        }
    }
    if st.waiters.is_empty() {
        s += "  waiters:         none\n";
    } else {
        s += &format!(
            "  waiters:         {} (first is served next)\n",
            st.waiters.len()
        );
        for (i, w) in st.waiters.iter().enumerate() {
            s += &format!(
                "    {}. wants {}: {}, waiting {}, owner {}\n",
                i + 1,
                w.permits,
                describe_origin(&w.origin),
                human(w.waiting_for),
                w.origin.owner
            );
        }
    }
    s
}

/// The JSON object of one semaphore (`status --semaphore --json`, and in `list --json`).
pub fn semaphore_json(st: &SemaphoreStatus) -> serde_json::Value {
    let holders: Vec<_> = st
        .holders
        .iter()
        .map(|h| {
            json!({
                "hold_id": h.hold_id,
                "owner": h.origin.owner,
                "host": h.origin.host,
                "pid": h.origin.pid,
                "thread": h.origin.thread,
                "permits": h.permits,
                "fencing_token": h.fencing_token,
                "lease_remaining_ms": ms(h.lease_remaining),
                "lease_ms": ms(h.lease),
            })
        })
        .collect();
    let waiters: Vec<_> = st
        .waiters
        .iter()
        .enumerate()
        .map(|(i, w)| {
            json!({
                "position": i + 1,
                "owner": w.origin.owner,
                "host": w.origin.host,
                "pid": w.origin.pid,
                "thread": w.origin.thread,
                "permits": w.permits,
                "waiting_for_ms": ms(w.waiting_for),
            })
        })
        .collect();
    json!({
        "name": st.name,
        "semaphore": true,
        "capacity": st.capacity,
        "permits_held": st.permits_held,
        "fencing_counter": st.fencing_counter,
        "holders": holders,
        "waiters": waiters,
    })
}

/// Write `text` to stdout (a closed stdout is ignored, as `say` ignores a closed stderr).
pub fn print(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}

fn to_text(st: &LockStatus) -> String {
    let mut s = String::new();
    match &st.holder {
        Some(h) => {
            s += &format!("lock {:?}: held\n", st.name);
            s += &format!("  holder:          {}\n", describe_origin(&h.origin));
            s += &format!("  owner:           {}\n", h.origin.owner);
            s += &format!(
                "  since:           {} ({} ago)\n",
                utc(since(h.held_for)),
                human(h.held_for)
            );
            s += &format!("  hold count:      {}\n", h.hold_count);
            s += &format!("  fencing token:   {}\n", h.fencing_token);
            s += &format!(
                "  lease left:      {} of {}\n",
                human(h.lease_remaining),
                human(h.lease)
            );
        }
        None => s += &format!("lock {:?}: free\n", st.name),
    }
    s += &format!("  fencing counter: {}\n", st.fencing_counter);
    if st.waiters.is_empty() {
        s += "  waiters:         none\n";
    } else {
        s += &format!(
            "  waiters:         {} (first is served next)\n",
            st.waiters.len()
        );
        for (i, w) in st.waiters.iter().enumerate() {
            s += &format!(
                "    {}. {}, waiting {}, owner {}\n",
                i + 1,
                describe_origin(&w.origin),
                human(w.waiting_for),
                w.origin.owner
            );
        }
    }
    s
}

/// The JSON object of one lock (`status --json`, and each element of `list --json`).
pub fn to_json(st: &LockStatus) -> serde_json::Value {
    let holder = st.holder.as_ref().map(|h| {
        json!({
            "owner": h.origin.owner,
            "host": h.origin.host,
            "pid": h.origin.pid,
            "thread": h.origin.thread,
            "hold_count": h.hold_count,
            "fencing_token": h.fencing_token,
            "held_for_ms": ms(h.held_for),
            "since_unix_ms": since(h.held_for).duration_since(UNIX_EPOCH).map(ms).unwrap_or(0),
            "lease_remaining_ms": ms(h.lease_remaining),
            "lease_ms": ms(h.lease),
        })
    });
    let waiters: Vec<_> = st
        .waiters
        .iter()
        .enumerate()
        .map(|(i, w)| {
            json!({
                "position": i + 1,
                "owner": w.origin.owner,
                "host": w.origin.host,
                "pid": w.origin.pid,
                "thread": w.origin.thread,
                "waiting_for_ms": ms(w.waiting_for),
            })
        })
        .collect();
    json!({
        "name": st.name,
        "locked": st.holder.is_some(),
        "holder": holder,
        "fencing_counter": st.fencing_counter,
        "waiters": waiters,
    })
}

fn ms(d: Duration) -> u64 {
    d.as_millis().min(u64::MAX as u128) as u64
}

/// When a hold that has lasted `held_for` began, on this machine's clock.
fn since(held_for: Duration) -> SystemTime {
    SystemTime::now()
        .checked_sub(held_for)
        .unwrap_or(UNIX_EPOCH)
}

/// `2025-01-02 12:03:04 UTC`: humantime's RFC 3339 form (`2025-01-02T12:03:04Z`), reworded.
fn utc(t: SystemTime) -> String {
    // humantime formats times from the epoch to the end of year 9999 only (it panics outside)
    let last = UNIX_EPOCH + Duration::from_secs(253_402_300_799);
    let stamp = humantime::format_rfc3339_seconds(t.clamp(UNIX_EPOCH, last)).to_string();
    format!("{} {} UTC", &stamp[..10], &stamp[11..19])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_utc() {
        let t = UNIX_EPOCH + Duration::from_secs(1_735_819_384); // 2025-01-02 12:03:04 UTC
        assert_eq!(utc(t), "2025-01-02 12:03:04 UTC");
        assert_eq!(utc(UNIX_EPOCH), "1970-01-01 00:00:00 UTC");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(utc(leap), "2000-02-29 00:00:00 UTC");
        let before = UNIX_EPOCH - Duration::from_secs(1); // a clock set before 1970
        assert_eq!(utc(before), "1970-01-01 00:00:00 UTC");
    }
}
