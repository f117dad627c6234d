//! The lock thread. A [`fairlock::LockGuard`] belongs to the thread that took the lock, so one
//! thread takes it (or a semaphore's permits, which are held the same way here), keeps the guard, watches it for loss and releases it, while the main thread
//! stays free to draw the waiting line, handle signals and supervise the command. They talk over
//! channels.

use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use fairlock::WaitCanceller;

use crate::target::Target;

/// How often the lock thread looks at `LockGuard::is_lost` (a local check, no Redis call).
const LOSS_POLL: Duration = Duration::from_millis(100);

/// How long to wait.
#[derive(Clone, Copy, Debug)]
pub enum Wait {
    /// `--no-wait`: take it only if it is free and nobody is queued.
    No,
    /// `--wait DURATION`: wait in the queue at most this long.
    For(Duration),
    /// The default: wait as long as it takes.
    Forever,
}

/// What the lock thread reports.
pub enum Event {
    /// The lock is ours.
    Acquired { token: u64 },
    /// Busy (`--no-wait`) or the wait ran out.
    Busy,
    /// Taking the lock failed.
    Failed(fairlock::Error),
    /// The watchdog found the lock gone or taken, or the lease ran out unrenewed.
    Lost,
    /// The outcome of the release asked for with [`Holder::release`].
    Released(fairlock::Result<()>),
}

/// The main thread's end of the lock thread.
pub struct Holder {
    /// Gives up the lock thread's wait; its owner id is `FAIRLOCK_OWNER` and how to find
    /// ourselves in the queue.
    pub canceller: WaitCanceller,
    pub events: Receiver<Event>,
    release: Sender<()>,
}

impl Holder {
    /// Start the lock thread. `thread_name` is recorded with the hold and shown by `status`.
    pub fn start(target: &Target, wait: Wait, thread_name: String) -> std::io::Result<Holder> {
        let (canceller_tx, canceller_rx) = crossbeam_channel::bounded(1);
        let (events_tx, events) = crossbeam_channel::unbounded();
        let (release, release_rx) = crossbeam_channel::bounded(1);
        let target = target.clone();
        std::thread::Builder::new()
            .name(thread_name)
            .spawn(move || {
                let _ = canceller_tx.send(target.wait_canceller());
                hold(&target, wait, &events_tx, &release_rx);
            })?;
        let canceller = canceller_rx
            .recv()
            .map_err(|_| std::io::Error::other("the lock thread ended at once"))?;
        Ok(Holder {
            canceller,
            events,
            release,
        })
    }

    /// Ask the lock thread to release. Its answer comes as [`Event::Released`].
    pub fn release(&self) {
        let _ = self.release.try_send(());
    }
}

fn hold(target: &Target, wait: Wait, events: &Sender<Event>, release: &Receiver<()>) {
    let guard = match target.take(wait) {
        Ok(Some(guard)) => guard,
        Ok(None) => {
            let _ = events.send(Event::Busy);
            return;
        }
        Err(e) => {
            let _ = events.send(Event::Failed(e));
            return;
        }
    };
    let _ = events.send(Event::Acquired {
        token: guard.fencing_token(),
    });
    let mut lost = false;
    // the watchdog's news at once, and the lease's end by the local estimate within LOSS_POLL
    let lost_signal = guard.lost_signal();
    loop {
        fairlock::crossbeam_channel::select! {
            // asked to release, or the main thread is gone (it gave up): release either way
            recv(release) -> _ => break,
            recv(lost_signal) -> _ => {
                if !lost {
                    lost = true;
                    let _ = events.send(Event::Lost);
                }
            }
            default(LOSS_POLL) => {
                if !lost && guard.is_lost() {
                    lost = true;
                    let _ = events.send(Event::Lost);
                }
            }
        }
    }
    let _ = events.send(Event::Released(guard.release()));
}
