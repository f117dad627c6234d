//! Deadlocks across processes and machines: the wait-for graph of the holds and waits that
//! `status` shows, its cycles, and their confirmation.
//!
//! - `snapshot`: locks, semaphores and read/write locks as one shape, and what stood through
//!   two readings of one;
//! - `graph`: pure functions: which waiting owners are proven blocked, and the cycles among them;
//! - `report`: [`Deadlock`] as people and tools read it, and the youngest wait of a cycle;
//! - `find`: [`LockClient::find_deadlocks`](crate::LockClient::find_deadlocks), which reads and
//!   confirms.

mod find;
mod graph;
mod report;
mod snapshot;

pub use report::{Blocking, Deadlock, DeadlockMember, LockRef};
