//! Deadlocks across processes and machines: the wait-for graph of the holds and waits that
//! `status` shows, its cycles, and their confirmation.
//!
//! - `snapshot`: locks, semaphores and read/write locks as one shape, and what stood through
//!   two readings of one;
//! - `graph`: pure functions: which waiting owners are proven blocked, and the cycles among them;
//! - `report`: a cycle of the graph as a [`Deadlock`](crate::Deadlock) (the type is in `cycle`);
//! - `find`: [`LockClient::find_deadlocks`](crate::LockClient::find_deadlocks), which reads and
//!   confirms;
//! - `chase`: the edge chasing of a waiting thread with `deadlock_detection` on, and the index
//!   of long waits it follows.

pub(crate) mod chase;
mod find;
mod graph;
mod report;
mod snapshot;

#[cfg_attr(not(feature = "raw"), allow(unused_imports))]
pub use snapshot::Primitive;
