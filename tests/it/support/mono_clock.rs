//! `CLOCK_MONOTONIC` in nanoseconds: the clock every process on this machine shares, so a time
//! stamped in one process and one stamped in another can be subtracted. A module of the tests'
//! support (the chaos suite's histories use it), and included by the benchmarks' workers, which
//! must agree with them on the clock.

/// Nanoseconds on `CLOCK_MONOTONIC`.
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes into the timespec we own; CLOCK_MONOTONIC always exists
    // on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
