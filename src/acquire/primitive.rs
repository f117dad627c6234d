//! What the engine asks of a primitive: the one trait, [`Primitive`], that a lock and a
//! semaphore's (or read/write lock's) permits implement, and the replies in the engine's own
//! words. The primitive supplies its scripts (its admission rule lives in them) and its keys;
//! the engine does the waiting, the same way for every primitive.

use std::time::Duration;

use crate::background::janitor::Target;
use crate::client::ClientInner;
use crate::error::Result;
use crate::kind::{Held, HoldKind};
use crate::raw::{Call, Mode};

/// What an acquire request decided, whatever the primitive.
pub(crate) enum Asked {
    /// The hold is this attempt's, with this token and this lease left (at most the lease
    /// asked for).
    Granted { token: u64, pttl: Duration },
    /// `try`: not free now, or others wait.
    Busy,
    /// Queued: a grant comes as a wake-up. `holder_pttl` bounds the holders' lease left (the
    /// janitor looks when it has surely run out); `last_token` places a later grant's lease
    /// (see `lease_estimate`).
    Queued {
        holder_pttl: Duration,
        last_token: u64,
    },
    /// A newer attempt of this owner reached Redis first, or this one left: nothing done.
    Stale,
}

/// What a leave did, whatever the primitive.
pub(crate) enum Left {
    /// The attempt's place (if any) is gone; nothing had been granted to it.
    Nothing,
    /// `claim`: a hold granted to the attempt is kept, and is the caller's.
    Granted { token: u64, pttl: Duration },
    /// A hold granted to the attempt was passed on.
    Passed,
}

/// A primitive the engine can acquire: a lock, or some permits of a semaphore.
pub(crate) trait Primitive {
    /// The reply of the primitive's acquire script.
    type Acquired;
    /// The reply of the primitive's leave script.
    type Left;

    fn client(&self) -> &ClientInner;
    /// What is being taken, for messages: `lock "x"`, `permits of semaphore "x"`, ...
    fn kind(&self) -> HoldKind;
    fn name(&self) -> &str;
    /// The permits wanted (1 for a lock).
    fn permits(&self) -> u64 {
        1
    }
    /// The lease a new hold gets.
    fn lease(&self) -> Duration;
    /// The main key: the one the waker, the janitor and the `waiting` map know it by.
    fn key(&self) -> &str;
    /// `owner`'s wake list.
    fn wake_key(&self, owner: &str) -> String;
    /// What the janitor heartbeats while this client waits.
    fn janitor_target(&self) -> Target;
    /// The acquire request of `owner`'s attempt.
    fn acquire(&self, owner: &str, attempt: u64, mode: Mode, meta: &str) -> Call<Self::Acquired>;
    /// The acquire reply in the engine's words; an error for a reply that refuses the
    /// primitive itself (a name in use with another capacity).
    fn asked(&self, reply: Self::Acquired) -> Result<Asked>;
    /// The leave request of `owner`'s attempt: `claim` keeps a grant that reached it, else it
    /// is passed on; `late` when a copy of an acquire may still arrive (a left mark then).
    fn leave(&self, owner: &str, attempt: u64, claim: bool, late: bool) -> Call<Self::Left>;
    /// The leave reply in the engine's words.
    fn left(reply: Self::Left) -> Left;

    /// The kind and name, as messages say them.
    fn held(&self) -> Held<'_> {
        Held {
            kind: self.kind(),
            name: self.name(),
        }
    }

    /// The name, when the client labels its metrics with it.
    fn metric_label(&self) -> Option<&str> {
        self.client()
            .config
            .metrics_lock_label
            .then_some(self.name())
    }
}
