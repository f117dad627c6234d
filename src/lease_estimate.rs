//! The client's lease arithmetic for a hand-off: when, on the waiter's own clock, the lease of a
//! grant it pops surely started. Pure functions, so the protocol fuzzer drives these very
//! decisions (through `raw`) instead of a copy of them.
//!
//! A hold's lease is a Redis TTL that starts when the grant is made. The waiter learns of the
//! grant later, by a wake-up that may have been delayed on the way (a slow link, a stalled
//! process, the leader's wait for replica acknowledgements, a message popped by another thread
//! and handed over later), so the moment it reads the message is no lower bound of that start.
//! Nor is the server's own clock: the grant's time minus the queueing time (both server
//! readings) is inflated by any forward step of the server clock between the two. What *is* a
//! lower bound is the send time of a request that ran on the server before the grant. Tokens
//! tell which requests did: every grant takes a token greater than every token handed out before
//! it, so a grant whose token exceeds the last token a request saw was made after that request
//! ran, and so after it was sent. The acquire that queued the waiter and each heartbeat of its
//! janitor report that last token; the newest of them is the waiter's *witness*.
//!
//! A grant whose token does not exceed its witness's cannot be placed after it: it may be a
//! grant that lapsed before the waiter queued again, still in flight. Nor can any grant once a
//! request reported a lower last token than an earlier one had: tokens went back (Redis lost a
//! lock's fence while its clock was behind where it had been), so a grant from before the loss
//! may carry a token above the witness's. The waiter then asks Redis
//! (it runs acquire again with the same attempt, which returns the grant with its lease left if
//! it is still the waiter's, and keeps the place otherwise). It asks too when the estimate would
//! leave less than half the lease: an early estimate is safe, but one that early would make the
//! guard look lost (or a fixed lease end) long before the server's; one round trip gives the
//! server's own lease left.

use std::ops::Add;
use std::time::Duration;

/// The newest request of a waiting attempt that ran on the server before any grant the waiter
/// has not yet seen: when it was sent, on the waiter's clock, and the last token handed out
/// when it ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Witness<T> {
    /// When the request was sent (the waiter's clock).
    pub sent: T,
    /// The last token handed out when it ran (`u64::MAX`: no request has reported one yet, so no
    /// grant can be placed after it).
    pub last_token: u64,
    /// The highest last token any request of the attempt reported. Above `last_token`, tokens
    /// went back (Redis lost the fence while its clock was behind where it had been, or replies
    /// came out of order): their order then places no grant, and every one is confirmed.
    pub highest: u64,
}

impl<T: Copy + PartialOrd> Witness<T> {
    /// No request reported yet.
    pub fn none(now: T) -> Witness<T> {
        Witness {
            sent: now,
            last_token: u64::MAX,
            highest: 0,
        }
    }

    /// A request sent at `sent` ran when `last_token` was the last token: keep the newer of it
    /// and the witness so far. (Two requests of one attempt may be answered out of order: the
    /// janitor's heartbeat and a re-run of acquire.)
    pub fn observe(&mut self, sent: T, last_token: u64) {
        let highest = self.highest.max(last_token);
        if self.last_token == u64::MAX || sent >= self.sent {
            *self = Witness {
                sent,
                last_token,
                highest,
            };
        } else {
            self.highest = highest;
        }
    }
}

/// What a waiter does with a hand-off it popped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handoff<T> {
    /// Hold the lock: its lease surely lasts until `expires` (the waiter's clock).
    Hold {
        /// The early estimate of the lease's end.
        expires: T,
    },
    /// Ask Redis (run acquire again with the same attempt) before holding anything.
    Confirm,
}

/// The hand-off of `token`, popped at `now` by a waiter whose witness is `witness`, with a
/// lease of `lease`: hold it until an estimate that is never later than the server's lease end,
/// or confirm it with Redis first (see the module's doc).
pub fn judge_handoff<T>(token: u64, witness: Witness<T>, lease: Duration, now: T) -> Handoff<T>
where
    T: Copy + PartialOrd + Add<Duration, Output = T>,
{
    if token <= witness.last_token || witness.highest > witness.last_token {
        return Handoff::Confirm;
    }
    let expires = witness.sent + lease;
    if expires >= now + lease / 2 {
        Handoff::Hold { expires }
    } else {
        Handoff::Confirm
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Milliseconds on a test clock.
    #[derive(Clone, Copy, Debug, PartialEq, PartialOrd)]
    struct Ms(u64);

    impl Add<Duration> for Ms {
        type Output = Ms;
        fn add(self, d: Duration) -> Ms {
            Ms(self.0 + d.as_millis() as u64)
        }
    }

    const LEASE: Duration = Duration::from_millis(3000);

    fn witness(sent: u64, last_token: u64) -> Witness<Ms> {
        Witness {
            sent: Ms(sent),
            last_token,
            highest: last_token,
        }
    }

    /// A case that gave two owners at once: queued at local 0 (last token 100), the server clock
    /// steps +20 s, the grant (token 101) is made at local 1000 and delivered 5 s late, at 6000.
    /// The server's lease ends at 1000 + 3000 = 4000; the old formula (server interval capped by
    /// the elapsed time at processing) put it at 9000.
    #[test]
    fn a_late_delivered_grant_after_a_forward_server_clock_step_is_never_taken_as_fresh() {
        let verdict = judge_handoff(101, witness(0, 100), LEASE, Ms(6000));
        assert_eq!(verdict, Handoff::Confirm);
        // every estimate it can hold with is no later than the true end, 4000
        for now in [0, 500, 1000, 1400] {
            if let Handoff::Hold { expires } = judge_handoff(101, witness(0, 100), LEASE, Ms(now)) {
                assert!(expires <= Ms(4000), "{expires:?}");
            }
        }
    }

    #[test]
    fn a_grant_not_newer_than_the_witness_is_confirmed_with_redis() {
        // a grant that lapsed before the waiter queued again (token 90 <= 100 seen then)
        assert_eq!(
            judge_handoff(90, witness(5000, 100), LEASE, Ms(5001)),
            Handoff::Confirm
        );
        assert_eq!(
            judge_handoff(100, witness(5000, 100), LEASE, Ms(5001)),
            Handoff::Confirm
        );
        // no witness yet
        assert_eq!(
            judge_handoff(7, Witness::none(Ms(0)), LEASE, Ms(1)),
            Handoff::Confirm
        );
    }

    #[test]
    fn a_fresh_grant_is_held_from_the_witness_send_time() {
        assert_eq!(
            judge_handoff(101, witness(1000, 100), LEASE, Ms(1200)),
            Handoff::Hold { expires: Ms(4000) }
        );
    }

    #[test]
    fn a_grant_whose_estimate_leaves_less_than_half_the_lease_is_confirmed() {
        assert_eq!(
            judge_handoff(101, witness(1000, 100), LEASE, Ms(2600)),
            Handoff::Confirm
        );
    }

    /// Found by the protocol fuzzer (seed 20261142): a grant (token 850981) popped before a
    /// data loss, its delivery held up; Redis loses the lock with its fence while the server
    /// clock is stepped back 29 s, so new tokens restart lower (821497172 < 850981); a heartbeat
    /// of the same attempt reports the lower last token; then the old grant arrives. Its token
    /// exceeds the witness's, so it was taken as made after the heartbeat, and held, while
    /// Redis had given the lock to someone else. Tokens that went back say their order means
    /// nothing now: every grant to this attempt is confirmed with Redis.
    #[test]
    fn after_the_last_token_went_back_every_grant_is_confirmed_with_redis() {
        let mut w = Witness::none(Ms(0));
        w.observe(Ms(10), 850_982);
        w.observe(Ms(5000), 821_497);
        assert_eq!(judge_handoff(850_981, w, LEASE, Ms(5001)), Handoff::Confirm);
        // a grant of the new era too (its token can no more be placed than the old one's)
        assert_eq!(judge_handoff(821_498, w, LEASE, Ms(5001)), Handoff::Confirm);
    }

    #[test]
    fn the_witness_keeps_the_newest_request() {
        let mut w = Witness::none(Ms(0));
        w.observe(Ms(10), 5);
        w.observe(Ms(30), 7);
        w.observe(Ms(20), 6); // answered out of order: older, ignored
        assert_eq!(w, witness(30, 7));
        // an older request that ran later (a higher token) leaves the witness, and shows that
        // the order of tokens and of send times disagree
        w.observe(Ms(25), 9);
        assert_eq!((w.sent, w.last_token, w.highest), (Ms(30), 7, 9));
        assert_eq!(judge_handoff(10, w, LEASE, Ms(31)), Handoff::Confirm);
    }
}
