//! `fairlock run` (a command under the lock) and `fairlock hold` (the lock until interrupted).

use std::ffi::OsString;
use std::io;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver};

use crate::duration::human;
use crate::exit::{self, say, Failure};
use crate::holder::{Event, Holder};
use crate::signals::Received;
use crate::target::Target;
use crate::waiting::{self, WaitOptions};

/// Take the lock, run `command` with `FAIRLOCK_NAME`, `FAIRLOCK_TOKEN` and `FAIRLOCK_OWNER` in its
/// environment, release when it exits, and return its exit code (or [`exit::LOST`]).
pub fn run(
    lock: &Target,
    signals: &Receiver<Received>,
    opts: &WaitOptions,
    kill_grace: Duration,
    command: &[OsString],
) -> Result<u8, Failure> {
    let holder = start_holder(lock, opts, thread_name(command))?;
    let token = waiting::acquire(&holder, lock, signals, opts)?;
    let mut child = match spawn(command, lock.name(), token, holder.canceller.owner()) {
        Ok(child) => child,
        Err(e) => {
            waiting::release(&holder, lock.name(), false);
            let code = match e.kind() {
                io::ErrorKind::NotFound => exit::NOT_FOUND,
                _ => exit::CANNOT_EXECUTE,
            };
            let program = command[0].to_string_lossy();
            return Err(Failure::new(code, format!("cannot run {program:?}: {e}")));
        }
    };
    let supervised = supervise(&mut child, &holder, lock, signals, kill_grace);
    let known_lost = matches!(supervised, Ok((_, true)));
    let lost_at_release = waiting::release(&holder, lock.name(), known_lost);
    let (status, lost) = supervised?;
    if lost {
        return Err(Failure::new(exit::LOST, ""));
    }
    if lost_at_release {
        return Err(Failure::new(
            exit::LOST,
            format!(
                "{} {:?} was lost before the command finished (force-released, or its lease ran out while Redis was unreachable)",
                lock.noun(),
                lock.name()
            ),
        ));
    }
    Ok(exit_code(status))
}

/// Take the lock and keep it until SIGINT, SIGTERM, SIGHUP or SIGQUIT.
pub fn hold(
    lock: &Target,
    signals: &Receiver<Received>,
    opts: &WaitOptions,
) -> Result<u8, Failure> {
    let holder = start_holder(lock, opts, "hold".into())?;
    let token = waiting::acquire(&holder, lock, signals, opts)?;
    say(&format!(
        "holding {} {:?} (fencing token {token}); Ctrl-C or SIGTERM releases it",
        lock.noun(),
        lock.name()
    ));
    // the lock thread runs until asked to release; should it end all the same, stop listening
    // to it rather than wake up on its closed channel again and again
    let mut events = holder.events.clone();
    loop {
        select! {
            recv(events) -> event => match event {
                Ok(Event::Lost) => {
                    return Err(Failure::new(
                        exit::LOST,
                        format!("lost {} {:?}: {}", lock.noun(), lock.name(), loss_cause(lock, &holder)),
                    ));
                }
                Ok(_) => {}
                Err(_) => events = crossbeam_channel::never(),
            },
            recv(signals) -> sig => match sig {
                Ok(sig) if sig.is_stop() => break,
                _ => {}
            },
        }
    }
    if waiting::release(&holder, lock.name(), false) {
        return Err(Failure::new(
            exit::LOST,
            format!(
                "{} {:?} was lost before it was released (force-released, or its lease ran out while Redis was unreachable)",
                lock.noun(),
                lock.name()
            ),
        ));
    }
    say(&format!("released {} {:?}", lock.noun(), lock.name()));
    Ok(0)
}

fn start_holder(lock: &Target, opts: &WaitOptions, thread_name: String) -> Result<Holder, Failure> {
    Holder::start(lock, opts.wait, thread_name)
        .map_err(|e| Failure::new(exit::SOFTWARE, format!("cannot start the lock thread: {e}")))
}

/// The lock thread's name, which `status` shows: `run: <the command line>`.
fn thread_name(command: &[OsString]) -> String {
    let line: Vec<String> = command
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let name: String = format!("run: {}", line.join(" "))
        .chars()
        .filter(|c| !c.is_control())
        .take(60)
        .collect();
    name
}

fn spawn(command: &[OsString], name: &str, token: u64, owner: &str) -> io::Result<Child> {
    let mut cmd = Command::new(&command[0]);
    cmd.args(&command[1..])
        .env("FAIRLOCK_NAME", name)
        .env("FAIRLOCK_TOKEN", token.to_string())
        .env("FAIRLOCK_OWNER", owner);
    die_with_parent(&mut cmd);
    cmd.spawn()
}

/// If fairlock is killed outright (SIGKILL), its lease runs out and another holder may start:
/// the command must not go on. Linux sends it SIGTERM when fairlock's main thread (the one that
/// spawns it) dies.
#[cfg(target_os = "linux")]
fn die_with_parent(cmd: &mut Command) {
    let parent = std::process::id();
    // SAFETY: the closure runs between fork and exec and only makes async-signal-safe calls.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(io::Error::last_os_error());
            }
            // fairlock died before prctl took effect: do not start the command at all
            if libc::getppid() as u32 != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn die_with_parent(_cmd: &mut Command) {}

/// Wait for the child, forwarding signals, and stop it if the lock is lost. Returns its status
/// and whether the lock was lost meanwhile. The child's exit is noticed through SIGCHLD.
fn supervise(
    child: &mut Child,
    holder: &Holder,
    lock: &Target,
    signals: &Receiver<Received>,
    kill_grace: Duration,
) -> Result<(ExitStatus, bool), Failure> {
    let mut lost_at: Option<Instant> = None;
    // fires once kill_grace has passed since SIGTERM was sent for a lost lock
    let mut grace_over = crossbeam_channel::never();
    // as in `hold`: a lock thread that ends early is not listened to any more
    let mut events = holder.events.clone();
    loop {
        // SIGCHLD is caught since before the spawn, so an exit is never missed between checks
        match child.try_wait() {
            Ok(Some(status)) => return Ok((status, lost_at.is_some())),
            Ok(None) => {}
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Failure::new(
                    exit::SOFTWARE,
                    format!("cannot wait for the command: {e}"),
                ));
            }
        }
        select! {
            recv(events) -> event => match event {
                Ok(Event::Lost) if lost_at.is_none() => {
                    lost_at = Some(Instant::now());
                    grace_over = crossbeam_channel::after(kill_grace);
                    send(child, libc::SIGTERM);
                    say(&format!(
                        "lost {} {:?} while the command ran ({}): sent SIGTERM to the command, SIGKILL follows after {}",
                        lock.noun(),
                        lock.name(),
                        loss_cause(lock, holder),
                        human(kill_grace)
                    ));
                }
                Ok(_) => {}
                Err(_) => events = crossbeam_channel::never(),
            },
            recv(signals) -> sig => {
                // a terminal's signal reached the command directly (same process group)
                if let Ok(sig) = sig {
                    if !sig.from_terminal && !sig.is_child() {
                        send(child, sig.signal);
                    }
                }
            },
            recv(grace_over) -> _ => {
                grace_over = crossbeam_channel::never();
                let _ = child.kill();
                say(&format!(
                    "the command did not stop within {} of SIGTERM: sent SIGKILL",
                    human(kill_grace)
                ));
            },
        }
    }
}

/// Signal the child. It is not reaped until `try_wait` on this thread sees it exit, so its pid
/// cannot have been reused.
fn send(child: &Child, signal: libc::c_int) {
    // SAFETY: kill(2) with a pid we own and a valid signal number.
    unsafe {
        libc::kill(child.id() as libc::pid_t, signal);
    }
}

/// Why the lock was lost, as well as can be told now.
fn loss_cause(lock: &Target, holder: &Holder) -> String {
    lock.loss_cause(holder.canceller.owner())
}

/// The child's exit code, or 128 + the signal that ended it, as a shell reports it.
fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(sig)) => (128 + sig).clamp(0, 255) as u8,
        _ => exit::SOFTWARE,
    }
}
