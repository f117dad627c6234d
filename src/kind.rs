//! What a hold is ([`HoldKind`]: a lock's, permits, a read or a write), how every message
//! names one, and where a holder or waiter runs ([`Origin`]).

use std::fmt;

/// What a hold is: the primitive it was taken on, so that a lost hold, an error or a callback
/// that hears the losses of a client's holds can tell apart a lock and a semaphore of one name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HoldKind {
    /// A [`FairLock`](crate::FairLock)'s hold (a [`LockGuard`](crate::LockGuard)).
    Lock,
    /// Permits of a [`Semaphore`](crate::Semaphore) (a [`Permit`](crate::Permit)).
    Semaphore,
    /// A read of an [`RwLock`](crate::RwLock) (a [`ReadGuard`](crate::ReadGuard)).
    Read,
    /// The write of an [`RwLock`](crate::RwLock) (a [`WriteGuard`](crate::WriteGuard)).
    Write,
}

/// Where a holder or waiter runs.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
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

/// A hold's kind and name as a text says it: `lock "x"`, `permits of semaphore "x"`,
/// `read lock "x"`, `write lock "x"`.
pub(crate) struct Held<'a> {
    pub kind: HoldKind,
    pub name: &'a str,
}

impl Held<'_> {
    /// "was" or "were", as the noun wants.
    pub fn was(&self) -> &'static str {
        match self.kind {
            HoldKind::Semaphore => "were",
            _ => "was",
        }
    }
}

impl fmt::Display for Held<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = self.name;
        match self.kind {
            HoldKind::Lock => write!(f, "lock {name:?}"),
            HoldKind::Semaphore => write!(f, "permits of semaphore {name:?}"),
            HoldKind::Read => write!(f, "read lock {name:?}"),
            HoldKind::Write => write!(f, "write lock {name:?}"),
        }
    }
}
