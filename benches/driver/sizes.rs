//! The sizes of a run: samples, seconds, layouts and holds of each scenario.

use crate::locks::Lib;
use crate::SEC;

/// How much of everything to run: the full tables, or the quick run CI makes.
pub struct Sizes {
    pub libs: Vec<Lib>,
    pub ping: usize,
    pub micro: usize,
    pub micro_redlock: usize,
    pub handoffs: u64,
    pub handoff_cap: u64,
    pub peer_handoffs: u64,
    pub peer_handoff_cap: u64,
    pub handoff_hold_us: u64,
    pub throughput_secs: f64,
    /// (processes, threads per process); processes 0 = threads of this process
    pub layouts: Vec<(u32, u32)>,
    pub holds_us: Vec<u64>,
    pub scale_waiters: Vec<u32>,
    pub scale_secs: f64,
    pub scale_hold_us: u64,
    /// acquisitions of the one-thread runs of the per-script breakdown
    pub scripts_n: usize,
    /// length of its contended run
    pub scripts_secs: f64,
    /// section "waiting": threads of one process queued on one lock, then spread over
    /// `waiting_locks` locks
    pub waiting_threads: u32,
    pub waiting_locks: u32,
    /// its hand-off runs: waiters at each release, and the length of each run
    pub waiting_handoff: Vec<u32>,
    pub waiting_secs: f64,
    pub grace: u64,
    /// section "semaphore": the numbers of holders and of waiters
    pub sem_sizes: Vec<u32>,
    /// section "peer": the waiters queued for the memory per waiter
    pub peer_waiters: u32,
    /// section "peer": the calls of each kind of its per-call measurement
    pub peer_calls: u64,
}

impl Sizes {
    pub fn new(quick: bool) -> Sizes {
        if quick {
            Sizes {
                libs: Lib::ALL.to_vec(),
                ping: 300,
                micro: 200,
                micro_redlock: 50,
                handoffs: 100,
                handoff_cap: 10 * SEC,
                peer_handoffs: 4,
                peer_handoff_cap: 5 * SEC,
                handoff_hold_us: 2000,
                throughput_secs: 0.6,
                layouts: vec![(0, 2), (2, 2)],
                holds_us: vec![0],
                scale_waiters: vec![1, 16],
                scale_secs: 1.0,
                scale_hold_us: 1000,
                scripts_n: 30,
                scripts_secs: 0.3,
                waiting_threads: 200,
                waiting_locks: 20,
                waiting_handoff: vec![1, 16, 64],
                waiting_secs: 0.6,
                grace: 3 * SEC,
                sem_sizes: vec![1, 16],
                peer_waiters: 4,
                peer_calls: 200,
            }
        } else {
            Sizes {
                libs: Lib::ALL.to_vec(),
                ping: 3000,
                micro: 3000,
                micro_redlock: 1000,
                handoffs: 1000,
                handoff_cap: 40 * SEC,
                peer_handoffs: 200,
                peer_handoff_cap: 45 * SEC,
                handoff_hold_us: 2000,
                throughput_secs: 4.0,
                layouts: vec![(0, 2), (0, 8), (0, 32), (8, 4)],
                holds_us: vec![0, 1000],
                scale_waiters: vec![1, 2, 16, 64, 256],
                scale_secs: 4.0,
                scale_hold_us: 1000,
                scripts_n: 300,
                scripts_secs: 1.5,
                waiting_threads: 1000,
                waiting_locks: 100,
                waiting_handoff: vec![1, 16, 256],
                waiting_secs: 2.5,
                grace: 8 * SEC,
                sem_sizes: vec![1, 16, 256],
                peer_waiters: 16,
                peer_calls: 20_000,
            }
        }
    }
}
