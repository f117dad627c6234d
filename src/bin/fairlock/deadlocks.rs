//! `fairlock deadlocks`: every cycle of holders each waiting for what the next one holds, as
//! text or JSON; exit 0 when there is none, [`crate::exit::DEADLOCK`] when there is one.

use fairlock::{Blocking, Deadlock, DeadlockMember, HoldKind, LockClient, LockRef};
use serde_json::json;

use crate::duration::human;
use crate::exit::{Failure, DEADLOCK};
use crate::status::{describe_origin, print};

/// Find the deadlocks and print them; the exit code says whether there was one.
pub fn deadlocks(client: &LockClient, as_json: bool) -> Result<u8, Failure> {
    let found = client.find_deadlocks()?;
    let text = if as_json {
        let array: Vec<serde_json::Value> = found.iter().map(to_json).collect();
        let mut s = serde_json::to_string_pretty(&array)
            .map_err(|e| Failure::new(crate::exit::SOFTWARE, e.to_string()))?;
        s.push('\n');
        s
    } else {
        to_text(&found)
    };
    print(&text);
    Ok(if found.is_empty() { 0 } else { DEADLOCK })
}

/// A kind as `--json` prints it.
pub fn kind_word(kind: HoldKind) -> &'static str {
    match kind {
        HoldKind::Lock => "lock",
        HoldKind::Semaphore => "semaphore",
        HoldKind::Read => "read",
        HoldKind::Write => "write",
        _ => "other",
    }
}

/// `lock "a"`, `semaphore "s"`, `read/write lock "rw"`.
fn named(lock: &LockRef) -> String {
    match lock.kind {
        HoldKind::Lock => format!("lock {:?}", lock.name),
        HoldKind::Read | HoldKind::Write => format!("read/write lock {:?}", lock.name),
        _ => format!("semaphore {:?}", lock.name),
    }
}

/// What the holder waits for: `lock "b"`, `2 permits of semaphore "s"`, `a read of ...`.
fn wanted(m: &DeadlockMember) -> String {
    match m.waits_for.kind {
        HoldKind::Read => format!("a read of {}", named(&m.waits_for)),
        HoldKind::Write => format!("the write of {}", named(&m.waits_for)),
        _ => named(&m.waits_for),
    }
}

/// One member: the lock, how its holder keeps the previous one out, what it waits for.
fn member_text(m: &DeadlockMember) -> String {
    let who = format!(
        "{}, owner {}",
        clean(&describe_origin(&m.holder)),
        clean(&m.holder.owner)
    );
    let how = match (m.blocking, m.lock.kind) {
        (Blocking::Holds { fencing_token, .. }, HoldKind::Lock) => {
            format!("held by {who}, fencing token {fencing_token}")
        }
        (Blocking::Holds { fencing_token, .. }, HoldKind::Read) => {
            format!("a read held by {who}, fencing token {fencing_token}")
        }
        (Blocking::Holds { fencing_token, .. }, HoldKind::Write) => {
            format!("the write held by {who}, fencing token {fencing_token}")
        }
        (
            Blocking::Holds {
                fencing_token,
                permits,
            },
            _,
        ) => format!("{permits} permit(s) held by {who}, fencing token {fencing_token}"),
        (_, _) => format!("{who} waits ahead in its queue"),
    };
    format!(
        "  {}: {how};\n    it waits for {} (for {})\n",
        named(&m.lock),
        wanted(m),
        human(m.waiting_for)
    )
}

/// Every cycle, then a summary line.
fn to_text(found: &[Deadlock]) -> String {
    let mut s = String::new();
    for (i, d) in found.iter().enumerate() {
        s += &format!(
            "deadlock {} of {}: {} waiting for each other in a cycle\n",
            i + 1,
            found.len(),
            if d.members.len() == 1 {
                "1 holder".to_string()
            } else {
                format!("{} holders", d.members.len())
            }
        );
        for m in &d.members {
            s += &member_text(m);
        }
        if let Some(y) = d.youngest_wait() {
            s += &format!(
                "  youngest wait: {}, owner {}, for {}\n",
                clean(&describe_origin(&y.holder)),
                clean(&y.holder.owner),
                wanted(y)
            );
        }
        s += "\n";
    }
    s += &match found.len() {
        0 => "no deadlock found\n".to_string(),
        1 => "1 deadlock found (confirmed by a second reading of its locks)\n".to_string(),
        n => format!("{n} deadlocks found (each confirmed by a second reading of its locks)\n"),
    };
    s
}

/// One deadlock as JSON: its members in cycle order and the youngest wait's owner.
fn to_json(d: &Deadlock) -> serde_json::Value {
    let members: Vec<serde_json::Value> = d
        .members
        .iter()
        .map(|m| {
            let (fencing_token, permits) = match m.blocking {
                Blocking::Holds {
                    fencing_token,
                    permits,
                } => (Some(fencing_token), Some(permits)),
                _ => (None, None),
            };
            json!({
                "lock": m.lock.name,
                "kind": kind_word(m.lock.kind),
                "holder": {
                    "owner": m.holder.owner,
                    "host": m.holder.host,
                    "pid": m.holder.pid,
                    "thread": m.holder.thread,
                },
                "queued_ahead": matches!(m.blocking, Blocking::QueuedAhead),
                "fencing_token": fencing_token,
                "permits": permits,
                "waits_for": m.waits_for.name,
                "waits_for_kind": kind_word(m.waits_for.kind),
                "waiting_for_ms": u64::try_from(m.waiting_for.as_millis()).unwrap_or(u64::MAX),
            })
        })
        .collect();
    json!({
        "members": members,
        "youngest_wait": d.youngest_wait().map(|y| y.holder.owner.as_str()),
    })
}

/// Text from Redis (a host, a thread name) without control characters.
fn clean(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}
