//! The integration tests, in one binary: every suite is a module (`cargo test --test it --
//! basic::` runs one), and `support` (test servers, Sentinel groups and Clusters, child
//! processes, faketime, certificates) is compiled once for all. A suite that needs a feature the
//! build lacks is left out (`cargo test --all-features` runs them all, as scripts/test.sh does).
//! Tests that need the process to themselves (a global logger or metrics recorder, counting the
//! process's threads) run their body in a child process of this binary (`support::child_test!`).
//! The long modes (`chaos::chaos_long*`, `fuzz::long`) are ignored by default: scripts/chaos.sh
//! and scripts/fuzz.sh run them.

mod acl;
mod bad_input;
mod basic;
mod behaviour;
#[cfg(all(feature = "raw", feature = "tls"))]
mod chaos;
#[cfg(feature = "cli")]
mod cli;
#[cfg(all(feature = "cli", feature = "raw"))]
mod cluster;
mod counter;
mod crash;
mod credentials;
#[cfg(all(feature = "cli", feature = "raw"))]
mod deadlock;
mod fairness;
#[cfg(feature = "raw")]
mod fuzz;
#[cfg(feature = "raw")]
mod handoff_cost;
#[cfg(feature = "raw")]
mod handoff_hops;
mod layers;
#[cfg(feature = "cli")]
mod leader;
mod lease;
#[cfg(feature = "cli")]
mod list;
mod loss;
#[cfg(feature = "raw")]
mod lost_reply;
#[cfg(feature = "metrics")]
mod metrics;
mod names;
mod pool;
#[cfg(feature = "raw")]
mod protocol;
#[cfg(feature = "raw")]
mod runner;
mod secrets;
mod semaphore;
#[cfg(feature = "raw")]
mod semaphore_protocol;
mod sentinel;
mod support;
mod threads;
#[cfg(all(feature = "cli", feature = "tls"))]
mod tls;
mod topology_support;
mod waker;
