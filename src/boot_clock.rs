//! A monotonic clock that keeps counting while the machine is suspended.
//!
//! A hold's lease runs on the Redis server, which keeps counting while this machine sleeps.
//! `std::time::Instant` reads `CLOCK_MONOTONIC` on Linux, and that clock stops during a system
//! suspend: a guard that estimates "my lease ends at `Instant` X" would, after a suspend longer
//! than the lease, still believe it holds a lock Redis gave away long ago. [`BootInstant`] reads
//! `CLOCK_BOOTTIME` on Linux and Android, which is `CLOCK_MONOTONIC` plus the time spent
//! suspended, so a local lease estimate is never later than the server's lease.
//!
//! Elsewhere it is `std::time::Instant` (macOS's `Instant` already counts suspended time; on
//! other systems it is the best clock std offers).
//!
//! Nothing here panics. If `clock_gettime(CLOCK_BOOTTIME)` fails (a kernel older than 2.6.39, or
//! a sandbox that filters the call), readings fall back to the monotonic clock: they then stop
//! during a suspend, exactly as `Instant` does, and nothing worse. The choice is consistent
//! within a process: readings are all on one scale, so comparing any two is meaningful.

use std::ops::{Add, AddAssign};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A point in time on a clock that is monotonic and, on Linux and Android, counts suspended
/// time. Like `Instant` it is opaque: only differences between two readings mean something.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct BootInstant {
    /// Time on the process's scale: since boot (`CLOCK_BOOTTIME`) when that clock works, else
    /// since the process's first reading.
    t: Duration,
}

impl BootInstant {
    /// The current time.
    pub(crate) fn now() -> BootInstant {
        let anchor = anchor();
        BootInstant {
            t: on_scale(anchor, boottime()),
        }
    }

    /// The time elapsed since `earlier`, or zero if `earlier` is later than `self`.
    pub(crate) fn saturating_duration_since(&self, earlier: BootInstant) -> Duration {
        self.t.saturating_sub(earlier.t)
    }

    /// The time elapsed since this reading (zero if none did).
    #[cfg(test)]
    pub(crate) fn elapsed(&self) -> Duration {
        BootInstant::now().saturating_duration_since(*self)
    }

    /// `self - d`, or `None` if that would be before the clock's zero (boot, or the process's
    /// first reading on the fallback clock), just as `Instant::checked_sub` can return `None`.
    pub(crate) fn checked_sub(&self, d: Duration) -> Option<BootInstant> {
        self.t.checked_sub(d).map(|t| BootInstant { t })
    }
}

/// `instant + d`, saturating at the end of time instead of panicking (`Instant + Duration`
/// panics on overflow; a lease or deadline that far away means "never").
impl Add<Duration> for BootInstant {
    type Output = BootInstant;

    fn add(self, d: Duration) -> BootInstant {
        BootInstant {
            t: self.t.saturating_add(d),
        }
    }
}

impl AddAssign<Duration> for BootInstant {
    fn add_assign(&mut self, d: Duration) {
        *self = *self + d;
    }
}

/// Fixed at the process's first reading: the fallback clock and the boot clock at that moment,
/// so that fallback readings land on the same scale as boot-clock readings.
struct Anchor {
    at: Instant,
    /// `CLOCK_BOOTTIME` at `at`; `None` if it did not work then (it is then never used).
    boot: Option<Duration>,
}

fn anchor() -> &'static Anchor {
    static ANCHOR: OnceLock<Anchor> = OnceLock::new();
    ANCHOR.get_or_init(|| Anchor {
        at: Instant::now(),
        boot: boottime(),
    })
}

/// A reading on the process's scale, from the boot clock's reading `boot` (`None`: it failed).
fn on_scale(anchor: &Anchor, boot: Option<Duration>) -> Duration {
    match (anchor.boot, boot) {
        (Some(_), Some(now)) => now,
        // the boot clock worked and then failed (no known kernel does this): continue from the
        // anchor on the monotonic clock, which misses the time suspended since the anchor
        (Some(at_anchor), None) => at_anchor.saturating_add(anchor.at.elapsed()),
        // never worked in this process: the monotonic clock alone
        (None, _) => anchor.at.elapsed(),
    }
}

/// `CLOCK_BOOTTIME`, or `None` if the call fails or returns something out of range.
#[cfg(any(target_os = "linux", target_os = "android"))]
fn boottime() -> Option<Duration> {
    let mut ts = std::mem::MaybeUninit::<libc::timespec>::uninit();
    // SAFETY: `ts` points to writable memory for one timespec for the duration of the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, ts.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: clock_gettime returned 0, so it filled in `ts`.
    let ts = unsafe { ts.assume_init() };
    let secs = u64::try_from(ts.tv_sec).ok()?;
    let nanos = u32::try_from(ts.tv_nsec)
        .ok()
        .filter(|n| *n < 1_000_000_000)?;
    // nanos < 1 s: `Duration::new` cannot overflow
    Some(Duration::new(secs, nanos))
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn boottime() -> Option<Duration> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;

    const MS_10: Duration = Duration::from_millis(10);

    #[test]
    fn readings_never_go_backwards() {
        let mut last = BootInstant::now();
        for _ in 0..10_000 {
            let now = BootInstant::now();
            assert!(now >= last, "{now:?} after {last:?}");
            last = now;
        }
    }

    #[test]
    fn it_advances_across_a_10_ms_sleep_at_least_as_much_as_instant() {
        let b0 = BootInstant::now();
        let i0 = Instant::now();
        thread::sleep(MS_10);
        let i = i0.elapsed();
        let b1 = BootInstant::now();
        let b = b1.saturating_duration_since(b0);
        assert!(b1 > b0);
        assert!(b >= MS_10, "{b:?}");
        // the boot interval encloses the Instant interval and runs at least as fast
        assert!(b >= i, "boot {b:?} < instant {i:?}");
        assert!(b < Duration::from_secs(10), "{b:?}");
        assert!(b0.elapsed() >= b);
    }

    #[test]
    fn arithmetic_matches_durations() {
        let a = BootInstant::now();
        let d = Duration::from_millis(1500);
        let later = a + d;
        assert!(later > a);
        assert_eq!(later.saturating_duration_since(a), d);
        assert_eq!(later.saturating_duration_since(a), d);
        assert_eq!(later.checked_sub(d), Some(a));
        let mut b = a;
        b += d;
        assert_eq!(b, later);
        // the wrong way round: zero or None, never a panic
        assert_eq!(a.saturating_duration_since(later), Duration::ZERO);
        assert_eq!(a.saturating_duration_since(later), Duration::ZERO);
        assert_eq!((a + Duration::from_secs(3600)).elapsed(), Duration::ZERO);
        assert_eq!(a + Duration::ZERO, a);
    }

    #[test]
    fn overflow_saturates_or_returns_none() {
        let a = BootInstant::now();
        let end = a + Duration::MAX;
        assert_eq!(end, a + Duration::MAX + Duration::from_secs(1));
        assert!(end > a);
        assert_eq!(a.checked_sub(Duration::MAX), None);
    }

    #[test]
    fn ordering_is_the_ordering_of_time() {
        let a = BootInstant::now();
        let b = a + Duration::from_nanos(1);
        let c = a + Duration::from_secs(1);
        let mut v = vec![c, a, b];
        v.sort();
        assert_eq!(v, [a, b, c]);
        assert_eq!(a.max(c), c);
        assert_eq!(a.min(b), a);
        assert_ne!(a, b);
        assert!(format!("{a:?}").contains("BootInstant"));
    }

    #[cfg(any(target_os = "linux", target_os = "android"))]
    #[test]
    fn linux_reads_the_boot_clock() {
        let anchor = anchor();
        assert!(anchor.boot.is_some(), "CLOCK_BOOTTIME unavailable");
        let before = boottime().unwrap();
        let now = BootInstant::now();
        let after = boottime().unwrap();
        assert!(before <= now.t && now.t <= after);
    }

    #[test]
    fn a_failing_boot_clock_falls_back_to_the_monotonic_clock_on_the_same_scale() {
        let start = Duration::from_secs(1000);
        let anchor = Anchor {
            at: Instant::now(),
            boot: Some(start),
        };
        thread::sleep(MS_10);
        let fallback = on_scale(&anchor, None);
        assert!(fallback >= start + MS_10, "{fallback:?}");
        assert!(fallback < start + Duration::from_secs(10), "{fallback:?}");
        assert_eq!(on_scale(&anchor, Some(start * 2)), start * 2);

        // a boot clock that never worked: time since the anchor, whatever a reading says
        let never = Anchor {
            at: Instant::now(),
            boot: None,
        };
        thread::sleep(MS_10);
        let t = on_scale(&never, Some(start));
        assert!(t >= MS_10 && t < Duration::from_secs(10), "{t:?}");
    }
}
