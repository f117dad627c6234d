//! Lost holds, pushed to their holder: what a [`LostHold`] says, and the once-only signal a
//! hold carries from the watchdog, which finds the loss, to the guard's owner, who may be busy
//! in its critical section and never poll.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};

use crate::kind::{Held, HoldKind};

/// Why a hold was lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LossCause {
    /// A renewal found the hold gone or taken by another owner: it was force-released, its
    /// lease ran out while this process was stopped or stalled, or Redis lost it (a restart
    /// without persistence, a failover).
    TakenOrGone,
    /// Redis could not be reached, or did not answer, to renew the lease until it ran out (by
    /// this client's estimate, which is never later than Redis's): another owner may hold it
    /// now.
    LeaseRanOut,
}

/// A hold the watchdog found lost: sent once on the guard's (or permit's)
/// [`lost_signal`](crate::LockGuard::lost_signal) and passed to the client's
/// [`on_lost`](crate::LockClientBuilder::on_lost) callback. Stop writing to what the hold
/// protects; the fencing token keeps late writes out where the resource checks it.
///
/// Its text names the kind and the name: `lock "x" (token 7) was lost: ...`,
/// `permits of semaphore "x" (token 7) were lost: ...`, `read lock "x" ...`, `write lock "x" ...`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LostHold {
    /// The name of the lock, semaphore or read/write lock.
    pub name: String,
    /// What the hold held: a lock, permits of a semaphore, a read or the write of a read/write
    /// lock (names of different kinds are different things).
    pub kind: HoldKind,
    /// The hold's fencing token.
    pub token: u64,
    /// Why it was lost.
    pub cause: LossCause,
}

impl fmt::Display for LostHold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let held = Held {
            kind: self.kind,
            name: &self.name,
        };
        let why = match self.cause {
            LossCause::TakenOrGone => "a renewal found the hold gone or taken by another owner",
            LossCause::LeaseRanOut => {
                "the lease ran out while Redis could not be reached or did not answer"
            }
        };
        write!(
            f,
            "{held} (token {}) {} lost: {why}",
            self.token,
            held.was()
        )
    }
}

/// A client's callback for lost holds.
pub(crate) type OnLost = Arc<dyn Fn(&LostHold) + Send + Sync>;

/// The once-only loss signal of one hold.
pub(crate) struct LossSignal {
    /// The name, the kind and the hold's token, for the message.
    name: String,
    kind: HoldKind,
    token: u64,
    /// Label the loss metric with the name.
    labelled: bool,
    told: AtomicBool,
    sender: Sender<LostHold>,
    receiver: Receiver<LostHold>,
}

impl LossSignal {
    pub fn new(name: &str, kind: HoldKind, token: u64, labelled: bool) -> LossSignal {
        let (sender, receiver) = crossbeam_channel::bounded(1);
        LossSignal {
            name: name.to_string(),
            kind,
            token,
            labelled,
            told: AtomicBool::new(false),
            sender,
            receiver,
        }
    }

    /// The hold's kind and name, for log lines.
    pub fn what(&self) -> Held<'_> {
        Held {
            kind: self.kind,
            name: &self.name,
        }
    }

    /// A receiver of the signal (any number of them; the one message goes to one of them).
    pub fn receiver(&self) -> Receiver<LostHold> {
        self.receiver.clone()
    }

    /// Send the loss (for `cause`) and call `callback` with it, the first time only; true when
    /// this was it.
    pub fn tell(&self, cause: LossCause, callback: Option<&OnLost>) -> bool {
        if self.told.swap(true, Ordering::SeqCst) {
            return false;
        }
        let lost = LostHold {
            name: self.name.clone(),
            kind: self.kind,
            token: self.token,
            cause,
        };
        let label = match cause {
            LossCause::TakenOrGone => "taken_or_gone",
            LossCause::LeaseRanOut => "lease_ran_out",
        };
        crate::telemetry::hold_lost(label, self.labelled.then_some(self.name.as_str()));
        if let Some(callback) = callback {
            // a panicking callback must not take the watchdog thread down with it
            let called = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| callback(&lost)));
            if called.is_err() {
                log::error!("fairlock: the on_lost callback panicked for {lost}");
            }
        }
        // room for one, sent once: never blocks
        let _ = self.sender.try_send(lost);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    fn lost() -> LostHold {
        LostHold {
            name: "job".into(),
            kind: HoldKind::Lock,
            token: 7,
            cause: LossCause::TakenOrGone,
        }
    }

    #[test]
    fn a_loss_is_told_once_to_the_channel_and_the_callback() {
        let signal = LossSignal::new("job", HoldKind::Lock, 7, false);
        let rx = signal.receiver();
        let calls = Arc::new(AtomicU32::new(0));
        let counted = calls.clone();
        let callback: OnLost = Arc::new(move |l: &LostHold| {
            assert_eq!(l.token, 7);
            counted.fetch_add(1, Ordering::SeqCst);
        });
        assert!(signal.tell(LossCause::TakenOrGone, Some(&callback)));
        assert!(!signal.tell(LossCause::LeaseRanOut, Some(&callback)));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(rx.try_recv().unwrap(), lost());
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn a_panicking_callback_is_contained() {
        let signal = LossSignal::new("job", HoldKind::Lock, 7, false);
        let callback: OnLost = Arc::new(|_: &LostHold| panic!("user code"));
        assert!(signal.tell(LossCause::TakenOrGone, Some(&callback)));
        assert_eq!(
            signal.receiver().try_recv().unwrap().cause,
            LossCause::TakenOrGone
        );
    }

    #[test]
    fn it_reads_as_a_sentence() {
        let text = lost().to_string();
        assert!(
            text.contains("\"job\"") && text.contains("token 7"),
            "{text}"
        );
    }

    #[test]
    fn it_names_what_was_held() {
        let said = |kind| {
            LostHold {
                kind,
                cause: LossCause::LeaseRanOut,
                ..lost()
            }
            .to_string()
        };
        assert!(said(HoldKind::Lock).starts_with("lock \"job\" (token 7) was lost: "));
        assert!(said(HoldKind::Semaphore)
            .starts_with("permits of semaphore \"job\" (token 7) were lost: "));
        assert!(said(HoldKind::Read).starts_with("read lock \"job\" (token 7) was lost: "));
        assert!(said(HoldKind::Write).starts_with("write lock \"job\" (token 7) was lost: "));
    }
}
