//! Waiting for the lock: the main thread's side of the wait, with the live status line that is
//! drawn while stderr is a terminal (and never otherwise: cron mails whatever a job prints).

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver};

use crate::duration::human;
use crate::exit::{say, Failure};
use crate::holder::{Event, Holder, Wait};
use crate::signals::Received;
use crate::target::Target;

/// How often the live line reads the lock's status.
const REFRESH: Duration = Duration::from_millis(500);
/// How long to wait for the lock thread's release once asked.
pub const RELEASE_WAIT: Duration = Duration::from_secs(20);

/// What `--wait`, `--no-wait`, `--busy-exit-code` and `--quiet` asked for.
pub struct WaitOptions {
    pub wait: Wait,
    pub busy_exit_code: u8,
    pub quiet: bool,
}

/// Wait for the lock thread to take the lock. Returns the fencing token, or how to end.
pub fn acquire(
    holder: &Holder,
    lock: &Target,
    signals: &Receiver<Received>,
    opts: &WaitOptions,
) -> Result<u64, Failure> {
    let mut line = LiveLine::new();
    let started = Instant::now();
    loop {
        select! {
            recv(holder.events) -> event => match event {
                Ok(Event::Acquired { token }) => {
                    line.clear();
                    return Ok(token);
                }
                Ok(Event::Busy) => {
                    line.clear();
                    let message = if opts.quiet {
                        String::new()
                    } else {
                        busy_message(lock, opts.wait, started.elapsed())
                    };
                    return Err(Failure::new(opts.busy_exit_code, message));
                }
                Ok(Event::Failed(e)) => {
                    line.clear();
                    return Err(e.into());
                }
                Ok(_) => {}
                Err(_) => {
                    line.clear();
                    return Err(Failure::new(
                        crate::exit::SOFTWARE,
                        "the lock thread ended unexpectedly",
                    ));
                }
            },
            // SIGUSR1, SIGUSR2 (nothing to pass them on to yet) and SIGCHLD are ignored
            recv(signals) -> sig => match sig {
                Ok(sig) if sig.is_stop() => {
                    line.clear();
                    return Err(interrupted(holder, lock, sig));
                }
                _ => {}
            },
            recv(line.ticks) -> _ => line.refresh(lock, holder.canceller.owner()),
        }
    }
}

/// A stop signal came while waiting. The lock thread is blocked in Redis and cannot be woken, so
/// the queue place is given up from here (with a grant that reached it meanwhile), then fairlock
/// exits. A grant the lock thread already reported is released the ordinary way.
fn interrupted(holder: &Holder, lock: &Target, sig: Received) -> Failure {
    let message = format!(
        "{} while waiting for {} {:?}: gave up waiting",
        sig.name(),
        lock.noun(),
        lock.name()
    );
    if let Ok(Event::Acquired { .. }) = holder.events.try_recv() {
        release(holder, lock.name(), false);
    } else if let Err(e) = holder.canceller.abandon() {
        // the place lapses by itself within a few seconds once nobody refreshes it
        say(&format!(
            "could not leave the queue of {:?}: {e}",
            lock.name()
        ));
    }
    Failure::new(sig.exit_code(), message)
}

fn busy_message(lock: &Target, wait: Wait, waited: Duration) -> String {
    let who = lock.busy_detail();
    match wait {
        Wait::For(_) => format!(
            "gave up waiting for {} {:?} after {}: it is still busy{who}",
            lock.noun(),
            lock.name(),
            human(waited)
        ),
        _ => format!("{} {:?} is busy{who}", lock.noun(), lock.name()),
    }
}

/// The one-line live status on a terminal.
struct LiveLine {
    enabled: bool,
    shown: String,
    /// When to read the status again: every [`REFRESH`] on a terminal, never otherwise.
    ticks: Receiver<Instant>,
}

impl LiveLine {
    fn new() -> LiveLine {
        let enabled = std::io::stderr().is_terminal();
        LiveLine {
            enabled,
            shown: String::new(),
            ticks: if enabled {
                crossbeam_channel::tick(REFRESH)
            } else {
                crossbeam_channel::never()
            },
        }
    }

    fn refresh(&mut self, lock: &Target, owner: &str) {
        // a failed read keeps the last line; the lock thread reports real trouble
        let Some(text) = lock.waiting_text(owner, human_coarse) else {
            return;
        };
        if text != self.shown {
            let width = terminal_width().saturating_sub(1).max(20);
            let cut: String = text.chars().take(width).collect();
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K{cut}");
            let _ = err.flush();
            self.shown = text;
        }
    }

    fn clear(&mut self) {
        if self.enabled && !self.shown.is_empty() {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
            self.shown.clear();
        }
    }
}

/// Whole seconds, so the line changes at most once a second.
fn human_coarse(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        return "under 1s".into();
    }
    let d = Duration::from_secs(d.as_secs());
    if d < Duration::from_secs(60) {
        return format!("{}s", d.as_secs());
    }
    human(d)
}

/// stderr's width in columns (80 when it cannot be told).
fn terminal_width() -> usize {
    terminal_size::terminal_size_of(std::io::stderr()).map_or(80, |(width, _)| width.0.into())
}

/// Release through the lock thread and wait (bounded) for the outcome. Returns whether the
/// lock turned out lost (not ours any more at release time, or loss seen meanwhile). `lost`: the
/// loss is known and reported already, so a failed release is not worth a word.
pub fn release(holder: &Holder, lock_name: &str, mut lost: bool) -> bool {
    holder.release();
    let deadline = Instant::now() + RELEASE_WAIT;
    loop {
        match holder
            .events
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            Ok(Event::Released(Ok(()))) => return lost,
            Ok(Event::Released(Err(fairlock::Error::NotHeld { .. }))) => return true,
            Ok(Event::Released(Err(e))) => {
                if !lost {
                    say(&format!(
                        "could not release lock {lock_name:?} ({e}); it frees itself when its lease runs out"
                    ));
                }
                return lost;
            }
            Ok(Event::Lost) => lost = true,
            Ok(_) => {}
            Err(_) => {
                if !lost {
                    say(&format!(
                        "releasing lock {lock_name:?} did not finish in {}; it frees itself when its lease runs out",
                        human(RELEASE_WAIT)
                    ));
                }
                return lost;
            }
        }
    }
}
