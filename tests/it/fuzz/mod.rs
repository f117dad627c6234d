//! A seeded, replayable protocol fuzzer over the real scripts (`fairlock::raw`).
//!
//! Per seed: one redis-server whose wall clock the fuzzer steps (libfaketime, see
//! `support/faketime.rs`), 1-2 locks, 3-5 logical clients of 1-3 threads each (owner
//! `<32-hex client id>:<thread>`, a new id after a crash, attempt numbers from a per-client
//! counter), all driven from this one process over a few plain connections. Each step is an
//! action of a thread (acquire try/wait, pop its wake list, re-enter, release, renew, leave
//! claim/pass), of a client (heartbeat), of an operator (status + force-unlock), or a fault:
//! a lost reply, a late delivery, a lost request, a connection-layer retry, a stray duplicate
//! of a thread's last command, a crash, a pause longer than the waiter timeout, time passing,
//! an evicted key, data loss (FLUSHALL + SCRIPT FLUSH + FUNCTION FLUSH), a server clock step. Threads react to
//! replies and errors as the real client does (the engine of `src/acquire/`, `LockGuard`,
//! `Permit`, the janitor and the watchdog): see `fuzz/actions.rs`; requests and their network
//! faults go through `fuzz/world.rs`, the other faults are in `fuzz/faults.rs`.
//!
//! **One model for every primitive** (`model::Prim`): a thread has a lock side and a semaphore
//! side of one kind (`model::Side`), and the actions, steps, generator, faults and judges are
//! written once for both; `fuzz/prim.rs` holds what differs (the scripts a thread calls, how a
//! reply reads, what Redis has of an attempt), `fuzz/judges.rs` the judges run for both over a
//! common view of Redis (`judges::View`). Admission is one sum: the permits held never exceed
//! the capacity (a lock: 1, a hold takes 1; a read/write lock: a write takes all).
//!
//! Threads take the real client's decisions where it has them as functions: a popped hand-off is
//! judged by `fairlock::raw::judge_handoff` on the client's own clock (real time, which a server
//! clock step does not move) with the witness the client keeps (its queueing reply and every
//! heartbeat report the last token handed out). Some generators cover what an earlier fuzzer
//! missed: a popped wake-up held up on its way to the client, now and then for longer than a lease
//! (`Fault::Late` on a pop, `Step::DeliverPop`); a request whose first copy is held up while the
//! connection layer sends it again and the caller sees the second reply (`Fault::SlowFirst`, the
//! success path of a repeat); and every third seed's quiet phase without heartbeats (below).
//!
//! **Semaphores** (`fuzz/sem.rs`: their shapes, generator, snapshot and operator steps): every
//! odd seed also has one or two semaphores, each a
//! counting semaphore of capacity 1-4 whose acquires ask for 1-3 permits, or the read/write
//! shape (capacity `RW_CAPACITY`: a read takes 1 permit, a write all). The same threads act on
//! them beside their locks (a thread has a lock side and a semaphore side), as the real
//! the acquisition engine, `Permit` and the janitor do (`src/acquire/engine.rs`, `src/semaphore/permit.rs`, `src/background/janitor.rs`):
//! acquire try/wait with a deadline, pop the client's wake list (a grant judged by
//! `judge_handoff` with the witness, a retry re-runs acquire), leave claim at the deadline, leave
//! pass after an error, a left mark when a request went unanswered or was sent twice, release,
//! renewal, heartbeat, and the operator's status + `force_release`. Every request goes through
//! `World::exec`, so all network faults apply, stray duplicates and late deliveries included;
//! crashes, pauses, sleeps, data loss and clock steps apply as to the locks, and each semaphore
//! key (hash, fence, queue, waiters, leases, hand-offs, left marks, a wake list) is evicted on
//! its own. Even seeds have none, and draw the same steps as before.
//!
//! Checked after every request and every step (`fuzz/judges.rs` and `fuzz/checks.rs`, for
//! locks and semaphores alike unless said; `docs/evidence.md` tabulates which applies to which):
//! 1. **Mutual exclusion**: at most one thread holds a lock by its own conservative estimate
//!    (send time of the granting request + the pttl in its reply; a popped hand-off: the
//!    client's `judge_handoff`, counting forward clock steps only from the grant on; a renewal:
//!    its send time + lease), and Redis shows that very holder and token.
//! 2. **Tokens strictly rise**: each new hold's token exceeds every token granted before.
//! 3. **Key hygiene**: every key on the server has a TTL.
//! 4. **No live waiter overtaken**: no grant while a live waiter is queued ahead of the grantee
//!    (a thread re-taking the lock with a newer attempt included),
//!    a live waiter never loses its place, and a live waiter's hand-off stays until its lease
//!    could have run out. *Live*: queued (its `Queued` reply seen, no fault took its place since),
//!    its client neither crashed nor paused, heartbeated within the waiter timeout (less a
//!    third of it per forward clock step, which the virtual clock may absorb), not yet granted;
//!    its place may go only once forward steps and real time since its last refresh add up to
//!    the queue's TTL (the queue keys then expire on the server's clock: counted, exempt).
//!    Who is ahead is read twice: from Redis's queue, and (`fuzz/fifo.rs`) from the order the
//!    clients saw their `Queued` replies, which a script that queues in the wrong place cannot
//!    fool; a waiter whose place Redis may have dropped (found dead once, place lost, an unread
//!    copy of its acquire) is not judged by the second, counted by reason.
//! 5. **Liveness**: at the end faults stop and every client behaves; within 20 s every thread
//!    must have held the lock, and every lock must be free with nothing left but the fence, the
//!    release receipts, wake lists that expire within the waiter timeout and left marks that
//!    expire within the queue's TTL (plus however far the server clock is behind its furthest). A waiter that Redis forgot (no queue entry, no
//!    grant, no retry coming) fails here, or earlier in check 4.
//! 6. **No ghost hold**: a new hold goes only to an attempt under way (waiting, in its own call,
//!    or whose guard still lives and will mark it); exempt and counted: marks lost with all
//!    data; and, within two waiter timeouts + 2 s (+ backward clock steps) of the fault or of
//!    the last late copy to reach Redis (`Unsure::expired`), crashed clients, an ending leave or
//!    release that was lost or is late, and stray duplicates the client never learnt of.
//! 7. **Dead waiters without heartbeats** (every third seed, `Config::quiet_heartbeats`): at the
//!    end the clients but the last end their waits and holds, queue on one lock and crash; only
//!    `try_lock` callers come by. A hand-off to a dead waiter later than a waiter timeout and two
//!    thirds of one into that phase, or one still holding two waiter timeouts after it was made,
//!    is a violation.
//! 8. **Key sizes**: every key at most 16 entries + 2 per participant of the last 1.1 queue
//!    TTLs, no entry over 256 bytes (`keys_bounded`); waiters entries only for queued owners
//!    (after a queue key's eviction, only those the hash had then, until a heartbeat names them);
//!    the left marks (locks and semaphores) hold only owners whose last request reached Redis
//!    within 1.1 queue TTLs of the latest mark (`left_marks_bounded`; `Step::LongClock` jumps the
//!    server clock minutes ahead so that marks age that far within a run).
//! 9. **Wake-ups** (`WakeupLost`, locks and semaphores): a live waiter's hand-off that Redis
//!    still has keeps its wake-up in the wake list until its client's waker pops it, from the
//!    first heartbeat of its client after the grant on (a repeat of its own acquire may take
//!    the lock with a reply nobody reads; that heartbeat tells it); allowed: an evicted list.
//! 10. **Liveness within a heartbeat**: a heartbeat's reply never leaves a free lock (a
//!     semaphore with no permit held and its capacity known) with anyone queued; a lock held
//!     just before is checked at the next heartbeat.
//! 11. **A leave ends its attempt**: after a leave that answered, Redis has no hold and no
//!     place of that attempt (locks and semaphores).
//!
//! Check 4 is also judged from the order the `Queued` replies were seen in (`fifo.rs`, locks
//! and semaphores), which a script that queues in the wrong place cannot fool.
//!
//! An operator's forced release exempts its hold from checks 1 and 4 only when its holder has it
//! in hand, its popped wake-up is on its way, or the force may land late; a hand-off nobody
//! popped is not exempt (the force must take its wake-up), counted both ways.
//!
//! The semaphores' checks: (1) **never more than capacity**: the permits of the holds their
//! holders count on by their own conservative estimate (send time of the granting request + the
//! pttl in its reply, at most the lease; a popped hand-off judged by `judge_handoff` with the
//! witness; a renewal its send time + lease) never exceed the capacity, and Redis has each of
//! them (that hold id, token and permits); Redis's `~used` equals the permits of the holds in its
//! hash, and the permits of its holds whose lease has not run out on the server's clock never
//! exceed the capacity (checked after every request). (2) tokens strictly rise per semaphore
//! (a grant loop's several grants in token order). (3) every key has a TTL. (4) no grant while a
//! live waiter queued ahead of the grantee is not served in that same call (the grant loop
//! stops at the first head that does not fit), a live waiter keeps its place, and a live
//! waiter's hand-off stays until its lease could end. (5) liveness: in the quiet phase every
//! thread also gets permits once (a read/write lock's thread 0 a write), and each semaphore ends
//! with no live hold and no waiter, nothing left but the fence, a hash without live holds (kind,
//! capacity, receipts, holds whose lease ran out, which the next writing script removes: counted)
//! with its leases and hand-offs within the queue's TTL, wake lists and left marks. (6) no ghost hold: a new hold
//! only for an attempt under way. (7) is not mirrored: in a try-only ending the crashing clients
//! also queue for all of a semaphore's permits (dead waiters), which only liveness then judges.
//! (8) waiters entries only for queued owners. Also: replies the
//! scripts never give (busy to a wait, queued to a try, stale to the newest attempt, a
//! capacity mismatch), a release reported done while Redis still has the hold, and a renewal
//! of a force-released or lost hold. Exemptions, each counted in the summary, as the locks':
//! force-released holds and holds whose hash was evicted or lost with all data are released from
//! check 1 (by token); tokens after a fence loss on a stepped-back clock; late acquires of
//! attempts whose mark was lost (a lost or late ending leave/release, a stray duplicate, an
//! evicted marks key) or lost with all data; and, as the semaphore keeps hand-off
//! deadlines on the server clock (`docs/semaphores.md`), a hand-off to a live waiter
//! revoked after a forward clock step (liveness, never safety: the wake-up goes with it).
//!
//! Also: replies the scripts never give (a stale answer to a thread's newest attempt, a busy
//! answer to a wait, a re-entry count other than depth + 1), script errors, a depth-1 release
//! reported done while Redis still holds it, and a renewal or re-entry of a hold that was
//! force-unlocked or lost.
//!
//! Exemptions, faults Redis by design cannot survive: a hold whose hash was evicted, a hold lost
//! with all data, and a force-unlocked hold are released from check 1 (by token). A forward clock
//! step of S ms is not exempt: Redis TTLs count wall time, so it is modelled as S ms passing for
//! every estimate made before it (the fuzzer clock is real time + all forward steps; a hand-off's
//! estimate counts only the steps after its grant, as a step before the grant does not age that
//! hold); a backward step only lengthens TTLs. Clock assumption of check 2: a token is seeded from
//! the server clock when the fence is lost, so after a fence eviction or data loss while the clock
//! is stepped back below its furthest, the check restarts from the next token (counted as "exempt:
//! token after fence loss ..."); backward steps never go more than 60 s below the furthest offset,
//! so the 1 h fence cannot expire under a lagging clock. A holder renewing its own lock with a
//! newer attempt queues behind that hold, so it is checked as any grant is.
//!
//! Found by this fuzzer and fixed (regression test `backward_step_then_lost_renewal`): after a
//! backward step of the server clock a re-reported grant's pttl exceeded the lease, the client
//! trusted it, and a renewal whose reply was lost shortened the TTL under it. The scripts now
//! report at most the lease and never shorten a TTL; the client also caps at the lease, which
//! the model mirrors (a capped pttl is counted, not exempt).
//!
//! Found by this fuzzer in the semaphore scripts and fixed (regression tests
//! `sem_stale_handoff_entry_does_not_starve_a_live_waiter`, `sem_evicted_leases_do_not_strand_permits`):
//! a heartbeat took a hand-offs entry whose hold went with an evicted hash for a pending grant
//! and did not refresh the waiter (queued again with that attempt), which was purged while live
//! and overtaken; and an evicted leases zset left holds that never expired, so a crashed
//! holder's permits were never given back.
//!
//! A failure prints the seed, the violation and the shortest step list found by replaying and
//! dropping chunks (`fuzz/shrink.rs`, at most 60 s).
//!
//! - `cargo test --all-features --test it -- fuzz::`: fixed seeds, about 25 s on 2 cores. `FAIRLOCK_FUZZ_SEED=N` runs
//!   one seed; `FAIRLOCK_FUZZ_STEPS` / `FAIRLOCK_FUZZ_SECONDS` change the per-seed step limit
//!   and the total time budget; `FAIRLOCK_FUZZ_FAIL_FAST=1` skips the shrinking and starts no
//!   seed after a violation (`scripts/mutants.sh`, where only "fails or not" matters);
//!   `FAIRLOCK_FUZZ_LOG_DIR=DIR` writes each seed's whole step log to `DIR/seed-N.log` (a run
//!   is timing-dependent: a replay of a long run's seed can be compared step by step).
//! - `scripts/fuzz.sh [STEPS]`: the long mode (`long`, ignored by default), 1,000,000 steps.
//!
//! **The deadlock world** (`fuzz/deadlock.rs`, its own world and judges, see its header):
//! threads with deadlock detection on take locks in nested random orders, so cycles form; the
//! library's own check (`fairlock::raw_deadlock::DeadlockCheck`) runs one read per step, other
//! threads' steps in between, on a virtual client clock; lost replies of index writes and
//! reads, evicted index hashes. Judges: (a) a refusal only in a cycle of the model, by its
//! youngest wait, reporting the model's members; (b) one refusal per cycle; (c) every cycle
//! broken within `after` + 67 reads' time (`docs/design.md`, "The bound"); (d) no hold or queue
//! entry of a refused wait left, index entries only of waits under way; (e) every thread's plans
//! complete. `fuzz::deadlock::short` (6 seeds of 20,000 steps, about 35 s debug;
//! `FAIRLOCK_DL_FUZZ_SEED`, `FAIRLOCK_DL_FUZZ_STEPS`, `FAIRLOCK_DL_FUZZ_SEEDS`); the long mode
//! `scripts/fuzz.sh --deadlock [STEPS]`.

use crate::support::{faketime, rng};

mod actions;
mod checks;
mod deadlock;
mod faults;
mod fifo;
mod judges;
mod model;
mod prim;
mod runner;
mod sem;
mod shrink;
mod steps;
mod world;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use model::{Config, Prim};
use runner::{run, Outcome, Source, QUIET_LIMIT};
use world::Stats;

/// The seeds `cargo test` runs (a seed also fixes the run's shape: locks, clients, threads).
const CI_SEEDS: [u64; 4] = [1, 2, 3, 4];
const CI_STEPS_PER_SEED: usize = 4_000;
const CI_SECONDS: u64 = 25;
const LONG_STEPS: u64 = 1_000_000;
const LONG_STEPS_PER_SEED: usize = 20_000;
const SHRINK_BUDGET: Duration = Duration::from_secs(60);
/// Seeds run side by side (each has its own server; most of a run is waiting on the network).
const WORKERS: usize = 2;

fn env<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// `FAIRLOCK_FUZZ_FAIL_FAST=1` (scripts/mutants.sh): a violation is reported without shrinking
/// it, and no seed starts after it, so a failing run ends soon.
fn fail_fast() -> bool {
    env::<u8>("FAIRLOCK_FUZZ_FAIL_FAST").is_some_and(|v| v != 0)
}

#[derive(Default)]
struct Totals {
    seeds: Vec<u64>,
    steps: u64,
    /// Steps promised to seeds under way (so two workers do not overshoot the total).
    reserved: u64,
    stats: Stats,
    failures: Vec<String>,
}

/// Run one seed; on a violation, shrink it and describe it.
fn fuzz_seed(seed: u64, max_steps: usize, max_time: Duration) -> (Outcome, Option<String>) {
    let cfg = Config::for_seed(seed);
    let out = run(
        &cfg,
        Source::Generate {
            max_steps,
            max_time,
        },
        Some(QUIET_LIMIT),
    );
    if let Ok(dir) = std::env::var("FAIRLOCK_FUZZ_LOG_DIR") {
        let _ = std::fs::write(format!("{dir}/seed-{seed}.log"), out.log.join("\n"));
    }
    let Some((at, v)) = out.violation.clone() else {
        return (out, None);
    };
    let mut report = format!(
        "=== VIOLATION seed {seed} ({cfg}) after {} steps: {v}\n",
        at + 1
    );
    let shrunk = if fail_fast() {
        None
    } else {
        Some(shrink::shrink(&cfg, &out, SHRINK_BUDGET))
    };
    match shrunk {
        None => {
            report.push_str("not shrunk (FAIRLOCK_FUZZ_FAIL_FAST); log (last 40 lines):\n");
            for line in out.log.iter().rev().take(40).rev() {
                report.push_str(&format!("  {line}\n"));
            }
        }
        Some(Some(small)) => {
            let (_, sv) = small.violation.clone().expect("a shrunk run fails");
            report.push_str(&format!(
                "shrunk to {} steps ({sv}); replay log:\n",
                small.steps.len()
            ));
            for line in &small.log {
                report.push_str(&format!("  {line}\n"));
            }
        }
        Some(None) => {
            report.push_str("did not reproduce on replay; original log (last 200 lines):\n");
            for line in out.log.iter().rev().take(200).rev() {
                report.push_str(&format!("  {line}\n"));
            }
        }
    }
    report.push_str(&format!(
        "replay: FAIRLOCK_FUZZ_SEED={seed} cargo test --all-features --test it -- --nocapture fuzz::\n"
    ));
    (out, Some(report))
}

/// Run seeds from `next_seed` on `WORKERS` threads until the steps or the time run out.
fn fuzz_many(
    mut next_seed: impl FnMut() -> Option<u64> + Send,
    steps_per_seed: usize,
    time_per_seed: Duration,
    total_steps: u64,
    deadline: Instant,
) -> Totals {
    let totals = Mutex::new(Totals::default());
    let seeds = Mutex::new(&mut next_seed);
    std::thread::scope(|s| {
        for _ in 0..WORKERS {
            s.spawn(|| loop {
                let left = deadline.saturating_duration_since(Instant::now());
                let steps = {
                    let mut t = totals.lock().unwrap();
                    let steps = steps_per_seed.min((total_steps - t.reserved) as usize);
                    if left < Duration::from_secs(1) || steps == 0 {
                        return;
                    }
                    t.reserved += steps as u64;
                    steps
                };
                if fail_fast() && !totals.lock().unwrap().failures.is_empty() {
                    return;
                }
                let Some(seed) = (seeds.lock().unwrap())() else {
                    return;
                };
                let (out, failure) = fuzz_seed(seed, steps, left.min(time_per_seed));
                let rate = out.steps.len() as f64 / (out.elapsed - out.quiet).as_secs_f64();
                println!(
                    "seed {seed}: {} steps in {:.1}s ({rate:.0} steps/s), quiet phase {:.1}s{}",
                    out.steps.len(),
                    out.elapsed.as_secs_f64(),
                    out.quiet.as_secs_f64(),
                    if failure.is_some() { ": VIOLATION" } else { "" }
                );
                let mut t = totals.lock().unwrap();
                t.seeds.push(seed);
                t.steps += out.steps.len() as u64;
                t.reserved -= (steps - out.steps.len().min(steps)) as u64;
                t.stats.merge(&out.stats);
                if let Some(f) = failure {
                    println!("{f}");
                    t.failures.push(f);
                }
            });
        }
    });
    totals.into_inner().unwrap()
}

fn summary(t: &Totals, elapsed: Duration) -> String {
    let mut out = format!(
        "fuzz: {} seeds {:?}, {} steps in {:.1}s ({:.0} steps/s), {} violations\n",
        t.seeds.len(),
        t.seeds,
        t.steps,
        elapsed.as_secs_f64(),
        t.steps as f64 / elapsed.as_secs_f64(),
        t.failures.len()
    );
    for (k, v) in &t.stats.0 {
        out.push_str(&format!("  {k}: {v}\n"));
    }
    out
}

fn assert_clean(t: &Totals, elapsed: Duration) {
    let text = summary(t, elapsed);
    println!("{text}");
    // each violation, with its shrunk steps, was printed when its seed ended (shown above)
    assert!(
        t.failures.is_empty(),
        "{} violations; shrunk step lists above\n{text}",
        t.failures.len()
    );
}

/// The CI budget: a few fixed seeds (or `FAIRLOCK_FUZZ_SEED`) within about 45 s.
#[test]
fn fuzz_short() {
    let began = Instant::now();
    let mut seeds: Vec<u64> = match env::<u64>("FAIRLOCK_FUZZ_SEED") {
        Some(s) => vec![s],
        None => CI_SEEDS.to_vec(),
    };
    seeds.reverse();
    let budget = Duration::from_secs(env("FAIRLOCK_FUZZ_SECONDS").unwrap_or(CI_SECONDS));
    // the fault phases share the budget; a quarter is left for the quiet phases
    let per_seed = budget.mul_f64(0.75 * WORKERS as f64 / seeds.len() as f64);
    let steps = env("FAIRLOCK_FUZZ_STEPS").unwrap_or(CI_STEPS_PER_SEED);
    let totals = fuzz_many(|| seeds.pop(), steps, per_seed, u64::MAX, began + budget);
    assert_clean(&totals, began.elapsed());
}

/// The long mode (`scripts/fuzz.sh`): `FAIRLOCK_FUZZ_STEPS` steps in all (default 1,000,000)
/// over consecutive seeds from `FAIRLOCK_FUZZ_SEED` (default: from the clock), at most
/// `FAIRLOCK_FUZZ_SECONDS` if set.
#[test]
#[ignore]
fn long() {
    let began = Instant::now();
    let total: u64 = env("FAIRLOCK_FUZZ_STEPS").unwrap_or(LONG_STEPS);
    let mut seed: u64 = env("FAIRLOCK_FUZZ_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            % 1_000_000
    });
    let seconds: u64 = env("FAIRLOCK_FUZZ_SECONDS").unwrap_or(30 * 24 * 3600);
    println!("fuzz long mode: {total} steps from seed {seed}");
    let totals = fuzz_many(
        || {
            seed += 1;
            Some(seed - 1)
        },
        LONG_STEPS_PER_SEED,
        Duration::from_secs(600),
        total,
        began + Duration::from_secs(seconds),
    );
    assert_clean(&totals, began.elapsed());
}

/// Found by this fuzzer (seed 3 of the CI run, shrunk to 8 steps): after a backward step of the
/// server clock, a re-reported grant (acquire retried with the same attempt, leave claim)
/// carried `lock_pttl()`, inflated beyond the lease; the client trusted it, and a renewal whose
/// reply was lost reset the TTL to the lease (`renew.lua`: PEXPIRE), so Redis freed the lock
/// while the holder still counted on it. Run with the client-side cap off, so the scripts alone
/// must be safe.
#[test]
fn backward_step_then_lost_renewal() {
    use steps::{AcquireStep, Fault, Step};
    let cfg = Config {
        cap_pttl_at_lease: false,
        locks: 1,
        clients: 3,
        threads: 1,
        sems: vec![],
        ..Config::for_seed(7)
    };
    let acquire = |c| Step::Acquire(AcquireStep::plain(c, 0, 0, true, 600));
    let steps = [
        acquire(0),
        acquire(1),
        Step::Release {
            p: Prim::Lock,
            c: 0,
            t: 0,
            fault: Fault::None,
        },
        Step::Clock { ms: -3000 },
        // the hand-off's pop is lost: acquire again with the same attempt (pttl ~3600 ms)
        Step::Pop {
            p: Prim::Lock,
            c: 1,
            t: 0,
            fault: Fault::Lost,
            then: Fault::None,
        },
        // applied (TTL back to 600 ms), reply lost: the client keeps its estimate
        Step::Renew {
            p: Prim::Lock,
            c: 1,
            t: 0,
            fault: Fault::Lost,
        },
        Step::Pause { c: 1, ms: 1500 },
        Step::Sleep { ms: 700 },
        acquire(2),
    ];
    replay_expecting_no_violation(&cfg, &steps);
}

/// Replay `steps` and fail with the step log on a violation.
/// Run `steps`, then the quiet phase (every thread served, Redis settled), which must pass.
fn replay_settling_without_violation(cfg: &Config, steps: &[steps::Step]) {
    let out = run(cfg, Source::Replay(steps), Some(runner::QUIET_LIMIT));
    assert!(
        out.violation.is_none(),
        "{:?}\n{}",
        out.violation,
        out.log.join("\n")
    );
}

fn replay_expecting_no_violation(cfg: &Config, steps: &[steps::Step]) {
    let out = run(cfg, Source::Replay(steps), None);
    assert!(
        out.violation.is_none(),
        "{:?}\n{}",
        out.violation,
        out.log.join("\n")
    );
}

/// Found by the long run (seed 20261141), shrunk: a hand-off's grant lapses unseen under a
/// forward step of the server clock, another client takes the lock, the grantee's pop is lost
/// and it queues again with the same attempt; a backward step then revives the expired wake
/// message (Redis had not deleted it yet) and the grantee popped the old grant as a new one:
/// two owners. Queueing now drops the wake list, as it did before the cost cuts.
#[test]
fn lapsed_handoff_revived_by_a_backward_step() {
    use steps::{AcquireStep, Fault, Step};
    let cfg = Config {
        locks: 1,
        clients: 2,
        threads: 2,
        // the original run was lucky: Redis had not yet deleted the expired message
        lazy_expiry_only: true,
        sems: vec![],
        ..Config::for_seed(20261141)
    };
    let acquire = |c, t, wait, lease_ms| Step::Acquire(AcquireStep::plain(c, t, 0, wait, lease_ms));
    let steps = [
        acquire(1, 0, false, 617),
        acquire(1, 1, true, 307),
        Step::Release {
            p: Prim::Lock,
            c: 1,
            t: 0,
            fault: Fault::None,
        },
        Step::Clock { ms: 346 },
        acquire(0, 0, true, 319),
        // the pop never reaches Redis, which would have deleted the expired message
        Step::Pop {
            p: Prim::Lock,
            c: 1,
            t: 1,
            fault: Fault::Dropped,
            then: Fault::None,
        },
        Step::Clock { ms: -580 },
        Step::Pop {
            p: Prim::Lock,
            c: 1,
            t: 1,
            fault: Fault::None,
            then: Fault::None,
        },
    ];
    replay_expecting_no_violation(&cfg, &steps);
}

/// The long run's one violation (seed 20261977, not reproducible by replay as its timing
/// differed), rebuilt by hand: a thread's acquire is held up in the network, its leave arrives
/// first and finds nothing, and the thread moves on. The late acquire used to queue a waiter
/// nobody heartbeats behind a holder that had died; nothing touched that lock again, so its
/// queue keys stayed for their 10-minute TTL and the quiet phase never settled. The leave now
/// leaves a mark that the late acquire finds.
#[test]
fn late_acquire_after_its_leave_leaves_no_ghost_waiter() {
    use steps::{AcquireStep, Fault, Step};
    // three locks, two clients: the quiet phase's threads use locks 0 and 1, never lock 2
    let cfg = Config {
        locks: 3,
        clients: 2,
        threads: 1,
        sems: vec![],
        ..Config::for_seed(20261977)
    };
    let steps = [
        Step::Acquire(AcquireStep::plain(1, 0, 2, true, 600)),
        Step::Crash { c: 1 },
        Step::Acquire(AcquireStep {
            fault: Fault::Late,
            ..AcquireStep::plain(0, 0, 2, true, 600)
        }),
    ];
    replay_settling_without_violation(&cfg, &steps);
}

/// Found by this fuzzer once it drove the semaphores (seed 1 of the CI run, shrunk to 16
/// steps): a hand-off's hold was lost with the semaphore's hash (evicted) while its entry in
/// the hand-offs zset stayed; the grantee, its pop's reply lost, queued again with the same
/// attempt. Its client's heartbeats then found the stale hand-off entry, extended it, and did
/// not refresh the waiter's entry: the live waiter was purged as dead after a forward clock
/// step, and a waiter behind it was granted the permits first.
#[test]
fn sem_stale_handoff_entry_does_not_starve_a_live_waiter() {
    use sem::SemStep;
    use steps::{AcquireStep, EvictKey, Fault, Step, Who};
    let cfg = Config::for_seed(1);
    assert_eq!((cfg.clients, cfg.threads, cfg.sems.len()), (5, 2, 1));
    let acquire = |c, t, permits, lease_ms, deadline_ms| {
        Step::Acquire(AcquireStep {
            p: Prim::Sem,
            permits,
            deadline_ms,
            ..AcquireStep::plain(c, t, 0, true, lease_ms)
        })
    };
    let force = |fault| Step::Sem(SemStep::ForceRelease { sem: 0, fault });
    let steps = [
        acquire(2, 1, 1, 383, Some(1397)),
        acquire(1, 0, 2, 610, None),
        force(Fault::Retried),
        acquire(0, 1, 2, 405, None),
        acquire(4, 0, 1, 312, None),
        force(Fault::None),
        Step::Resend {
            who: Who::Thread(1, 0),
        },
        force(Fault::Retried),
        Step::Evict {
            p: Prim::Sem,
            lock: 0,
            key: EvictKey::Hash,
        },
        Step::Pop {
            p: Prim::Sem,
            c: 4,
            t: 0,
            fault: Fault::Lost,
            then: Fault::None,
        },
        Step::Clock { ms: 202 },
        acquire(1, 1, 2, 611, None),
        Step::Clock { ms: 284 },
        Step::Sleep { ms: 14 },
        Step::Clock { ms: 6468 },
        acquire(4, 1, 1, 754, Some(535)),
    ];
    replay_expecting_no_violation(&cfg, &steps);
}

/// Found by this fuzzer (seed 1 of the CI run, shrunk to 18 steps; rebuilt here from its
/// core): the leases zset of a semaphore was evicted while a crashed client held permits.
/// Nothing expired that hold any more (expiry reads the zset), and every heartbeat kept the
/// hash alive, so the permits were never given back and the quiet phase never settled.
#[test]
fn sem_evicted_leases_do_not_strand_permits() {
    use steps::{AcquireStep, EvictKey, Step};
    let cfg = Config::for_seed(1);
    assert_eq!(cfg.sems[0].cap, 2);
    let steps = [
        Step::Acquire(AcquireStep {
            p: Prim::Sem,
            permits: 2,
            ..AcquireStep::plain(0, 1, 0, true, 600)
        }),
        Step::Crash { c: 0 },
        Step::Evict {
            p: Prim::Sem,
            lock: 0,
            key: EvictKey::Leases,
        },
    ];
    replay_settling_without_violation(&cfg, &steps);
}

/// Found by the long run (seed 20261173, not reproducible by replay; rebuilt by hand): an
/// operator stored a semaphore's capacity, which keeps its hash for the fence's TTL (1 h
/// here), and a crashed client's hold expired with no later script to sweep it. `keep_sem`
/// keeps the leases zset as long as the hash, so the expired hold's entry waits there for the
/// next script, for up to the fence's TTL; the end-state check allowed the leases only the
/// queue's TTL and failed with `Liveness`. It now gives the leases and hand-offs of a stored
/// capacity the hash's bound (a leases zset kept longer still fails).
#[test]
fn sem_leases_of_a_stored_capacity_live_as_long_as_its_hash() {
    use steps::{AcquireStep, Step};
    // room for the crashed hold and both threads' quiet-phase permits: the crashed hold
    // outlives the last script, which leaves it (expired) for the next one
    let cfg = Config {
        clients: 2,
        threads: 1,
        sems: vec![model::SemShape { rw: false, cap: 8 }],
        ..Config::for_seed(1)
    };
    let steps = [
        Step::Sem(sem::SemStep::SetCapacity {
            sem: 0,
            fault: steps::Fault::None,
        }),
        Step::Acquire(AcquireStep {
            p: Prim::Sem,
            ..AcquireStep::plain(0, 0, 0, true, 2500)
        }),
        Step::Crash { c: 0 },
    ];
    replay_settling_without_violation(&cfg, &steps);
}

/// Found by the long run (seed 20261319, not reproducible by replay; rebuilt by hand): a waiter's
/// client is paused (its janitor silent) while the server clock steps forward twice by some
/// 390 s. Each step is less than the queue's TTL (10 minutes), together they are more, and no
/// heartbeat ran between them: the queue and the waiters hash expire with the waiter's place,
/// as docs/guarantees.md says of forward steps past the queue's TTL. Check 4' called that a
/// lost place (`WaiterLost`), and check 4''' the next grant an overtaking (seed 20261401);
/// both now let a place go once the forward steps and the real time
/// since the waiter's last refresh add up to the queue's TTL, and still fails one lost sooner
/// (planted: a queue TTL of 5 minutes fails this test with one step of 390 s).
#[test]
fn a_place_may_expire_under_forward_steps_past_the_queue_ttl_between_heartbeats() {
    use steps::{AcquireStep, Step};
    for p in [Prim::Lock, Prim::Sem] {
        let cfg = Config {
            locks: 1,
            clients: 3,
            threads: 1,
            sems: vec![model::SemShape { rw: false, cap: 1 }],
            ..Config::for_seed(1)
        };
        let steps = [
            Step::Acquire(AcquireStep {
                p,
                ..AcquireStep::plain(1, 0, 0, true, 800)
            }),
            Step::Acquire(AcquireStep {
                p,
                ..AcquireStep::plain(0, 0, 0, true, 800)
            }),
            Step::Clock { ms: 390_000 },
            Step::Clock { ms: 390_000 },
            // a newcomer then finds the queue empty and takes it: no overtaking (check 4''')
            Step::Acquire(AcquireStep {
                p,
                ..AcquireStep::plain(2, 0, 0, true, 800)
            }),
        ];
        let (n, log) = replay_counting(
            &cfg,
            &steps,
            "exempt: a place expired under forward steps past the queue's TTL",
        );
        assert!(n >= 1, "{p:?}: the place did not expire:\n{log}");
    }
}

/// Found by the long run (seeds 876350 and 876353, both try-only endings; 2 violations in
/// 282,519 steps), rebuilt by hand. A waiter whose client crashes stays "live" on the lock's
/// virtual clock, which advances by at most a third of the waiter timeout per script (common.lua,
/// "Time": dead waiters are kept "for a few calls"): after a quiet spell with no script on the
/// lock (here 4 s), the first call grants the lock to that dead waiter. Check 6' bounded a grant
/// to a crashed client's attempt by real time since the crash alone (two waiter timeouts + 2 s)
/// and failed here; it now adds how far the lock's clocks fell behind in quiet spells
/// (`QuietLag`), the scripts' own promise. A dead waiter kept longer still fails: a planted
/// `enqueue` that gives each place 8 waiter timeouts fails the short mode (seed 2, `DeadWaiter`).
#[test]
fn dead_waiter_granted_after_a_quiet_spell() {
    use steps::{AcquireStep, Step};
    let cfg = Config {
        locks: 1,
        clients: 3,
        threads: 1,
        sems: vec![],
        ..Config::for_seed(7)
    };
    let steps = [
        Step::Acquire(AcquireStep::plain(0, 0, 0, true, 1500)),
        Step::Acquire(AcquireStep::plain(1, 0, 0, true, 1500)),
        Step::Crash { c: 1 },
        Step::Sleep { ms: 4000 },
        Step::Acquire(AcquireStep::plain(2, 0, 0, false, 1500)),
    ];
    replay_expecting_no_violation(&cfg, &steps);
}

/// The steps of a held-up wake-up of lock 0 (its client reads it `wait_ms` later): a quiet
/// spell of that length with no script at all, as `Step::DeliverPop` sleeps without janitors.
fn quiet_spell_of(wait_ms: u64) -> Vec<steps::Step> {
    use steps::{AcquireStep, Fault, Step};
    vec![
        Step::Acquire(AcquireStep::plain(3, 0, 0, true, 1500)),
        Step::Acquire(AcquireStep::plain(4, 0, 0, true, 1500)),
        Step::Release {
            p: Prim::Lock,
            c: 3,
            t: 0,
            fault: Fault::None,
        },
        Step::Pop {
            p: Prim::Lock,
            c: 4,
            t: 0,
            fault: Fault::Late,
            then: Fault::None,
        },
        Step::DeliverPop { n: 0, wait_ms },
    ]
}

/// A semaphore acquire (wait) of one permit by `c`'s thread 0, with a deadline (ms) or none.
fn sem_wait(c: usize, deadline_ms: Option<u64>, fault: steps::Fault) -> steps::Step {
    steps::Step::Acquire(steps::AcquireStep {
        p: Prim::Sem,
        deadline_ms,
        fault,
        ..steps::AcquireStep::plain(c, 0, 0, true, 1500)
    })
}

/// Run `steps`, which must pass, and return how often the summary counted `stat`, and the log.
fn replay_counting(cfg: &Config, steps: &[steps::Step], stat: &str) -> (u64, String) {
    let out = run(cfg, Source::Replay(steps), None);
    assert!(
        out.violation.is_none(),
        "{:?}\n{}",
        out.violation,
        out.log.join("\n")
    );
    (
        out.stats.0.get(stat).copied().unwrap_or(0),
        out.log.join("\n"),
    )
}

/// Found by the long run (seed 20261159, not reproducible by replay as its timing differed),
/// rebuilt by hand: a crashed client's waiter sits behind a live one on a semaphore; a wake-up
/// of the lock is held up 4 s on its way (no script runs on the semaphore meanwhile, and the
/// holder's lease runs out); the live waiter's deadline comes and its leave grants the free
/// permit to the dead waiter, whose deadline the semaphore's virtual clock, a quiet spell
/// behind, has not reached ("dead waiters kept for a few calls", common.lua "Time"). Check 6'
/// counted quiet spells only up to the last script that advances the clocks, and the leave
/// (as a capacity change, a late copy or a stray duplicate) is not one, so it missed the spell
/// the grant itself closed, and failed with `DeadWaiter`. The bound now adds the spell still
/// open at the grant (`QuietLag::open`).
#[test]
fn sem_dead_waiter_granted_by_a_leave_that_closes_a_quiet_spell() {
    use steps::{Fault, Step};
    let cfg = Config {
        locks: 1,
        clients: 5,
        threads: 1,
        ..Config::for_seed(20261159)
    };
    assert_eq!(cfg.sems[0].cap, 1);
    let mut steps = vec![
        sem_wait(0, None, Fault::None),
        // its deadline comes in the spell
        sem_wait(1, Some(1000), Fault::None),
        sem_wait(2, None, Fault::None),
        Step::Crash { c: 2 },
    ];
    steps.extend(quiet_spell_of(4000));
    steps.push(Step::LeaveClaim {
        p: Prim::Sem,
        c: 1,
        t: 0,
        fault: Fault::None,
        then: Fault::None,
    });
    let (n, log) = replay_counting(
        &cfg,
        &steps,
        "grant to a crashed client's attempt within the quiet spell it closed",
    );
    assert_eq!(
        n, 1,
        "the steps no longer grant within the open spell:\n{log}"
    );
}

/// The same spell in check 6 (seed 20261147 of the long run, rebuilt by hand): a thread's
/// acquire is held up in the network, it leaves with a mark, the marks are evicted and the late
/// copy queues (an unsure end); after the quiet spell an operator's capacity change grants it
/// the permit its holder's lease gave back. Check 6 failed with `GhostHold` before the bound
/// counted the spell the grant closed.
#[test]
fn sem_late_copy_granted_by_a_capacity_change_that_closes_a_quiet_spell() {
    use steps::{EvictKey, Fault, Step};
    let cfg = Config {
        locks: 1,
        clients: 5,
        threads: 1,
        ..Config::for_seed(20261159)
    };
    let mut steps = vec![
        sem_wait(0, None, Fault::None),
        sem_wait(1, None, Fault::Late),
        Step::Evict {
            p: Prim::Sem,
            lock: 0,
            key: EvictKey::Left,
        },
        Step::DeliverLate { n: 0 },
    ];
    steps.extend(quiet_spell_of(4000));
    steps.push(Step::Sem(sem::SemStep::SetCapacity {
        sem: 0,
        fault: Fault::None,
    }));
    let (n, log) = replay_counting(
        &cfg,
        &steps,
        "exempt: sem late acquire of an attempt whose mark was lost, within the quiet spell \
         its grant closed",
    );
    assert_eq!(
        n, 1,
        "the steps no longer grant within the open spell:\n{log}"
    );
}

/// Found by the matrix's short run on Valkey 8.1.8 (seed 4, not reproducible by replay;
/// rebuilt by hand): a wake list lives as long as the longest message pushed since it was last
/// empty, and that message may be popped already. Here a grant (lease 3 s) and then a "retry"
/// (the waiter timeout) go to one client; its waker pops the grant, the thread told to retry
/// leaves, and the "retry" rests in a list that keeps the grant's TTL. The end-state judge gave
/// a list without a grant the waiter timeout and failed with `KeySize`; a list's bound is now the
/// longest of a lease and the waiter timeout, whatever it holds.
#[test]
fn a_retry_left_in_a_wake_list_keeps_the_ttl_of_a_grant_popped_before_it() {
    use steps::{AcquireStep, Fault, Step};
    // two locks: in the quiet phase client 1 queues on lock 1 only, so nothing touches its
    // wake list of lock 0 again
    let cfg = Config {
        locks: 2,
        clients: 2,
        threads: 2,
        sems: vec![],
        lease_ms: (300, 3000),
        waiter_timeout_ms: 600,
        quiet_heartbeats: true,
        ..Config::for_seed(4)
    };
    let steps = [
        Step::Acquire(AcquireStep::plain(0, 0, 0, true, 3000)),
        Step::Acquire(AcquireStep::plain(1, 0, 0, true, 3000)),
        Step::Acquire(AcquireStep::plain(1, 1, 0, true, 3000)),
        // c1's heartbeat for both waiters is held up in the network
        Step::Heartbeat {
            p: Prim::Lock,
            c: 1,
            lock: 0,
            fault: Fault::Late,
        },
        Step::LeavePass {
            p: Prim::Lock,
            c: 1,
            t: 1,
            fault: Fault::None,
        },
        // the grant to c1:t0 gives c1's wake list a TTL of 3 s
        Step::Release {
            p: Prim::Lock,
            c: 0,
            t: 0,
            fault: Fault::None,
        },
        // the late heartbeat finds c1:t1's attempt gone and tells it "retry", behind the grant
        Step::DeliverLate { n: 0 },
        Step::Pop {
            p: Prim::Lock,
            c: 1,
            t: 0,
            fault: Fault::None,
            then: Fault::None,
        },
    ];
    replay_settling_without_violation(&cfg, &steps);
}
