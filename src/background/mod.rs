//! A client's background threads, fed plain data: the watchdog (lease renewal and loss), the
//! janitor (waiter heartbeats and crash repair), the waker (the one BLPOP the waiting threads
//! take turns on) and, through Sentinel, the master watch (following the master).

pub(crate) mod janitor;
pub(crate) mod master_watch;
pub(crate) mod waker;
pub(crate) mod watchdog;
