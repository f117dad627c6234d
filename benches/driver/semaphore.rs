//! The semaphore's cost against the number of holders and of waiters (the target: "acquire/release
//! cost does not grow with capacity or queue length beyond O(log n)"): an uncontended acquire +
//! release of one permit while H other holds are held (H = 1, 16, 256), and the hand-off of a
//! semaphore of one permit with W threads waiting (W = 1, 16, 256).

use std::time::Instant;

use serde::Serialize;

use crate::bench::Bench;
use crate::locks::{mono_ns, Lib};
use crate::stats::{dist, handoffs, r1, DistRow};
use crate::{MS, SEC};

/// A row of the results file's `semaphore`.
#[derive(Serialize)]
pub struct SemaphoreRow {
    /// "holders" (acquire + release of one more permit) or "waiters" (hand-off)
    pub with: &'static str,
    /// how many holders or waiters
    pub size: u32,
    pub rtt_us: f64,
    #[serde(flatten)]
    pub dist: DistRow,
    pub errors: Vec<String>,
}

pub fn semaphore(b: &mut Bench) {
    let sizes = b.sizes.sem_sizes.clone();
    b.md.push("### Semaphore: cost with H holders, hand-off with W waiters\n".into());
    b.md.push("| with | n | p50 µs | p99 µs | RTT µs | p50 / RTT | p99 / RTT |".into());
    b.md.push("|---|---:|---:|---:|---:|---:|---:|".into());
    let mut out = vec![];
    let client = match fairlock::LockClient::connect(&b.url) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("driver: semaphore: {e}");
            return;
        }
    };
    for &h in &sizes {
        let sem = match client.semaphore(&b.name(&format!("sem-holders{h}")), u64::from(h) + 1) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("driver: semaphore: {e}");
                return;
            }
        };
        let mut errors = vec![];
        let held: Vec<_> = (0..h)
            .filter_map(|_| sem.acquire().map_err(|e| errors.push(e.to_string())).ok())
            .collect();
        let mut lat = vec![];
        for _ in 0..b.sizes.micro.min(1000) {
            let t = Instant::now();
            match sem.acquire().and_then(|p| p.release()) {
                Ok(()) => lat.push(t.elapsed().as_nanos() as u64),
                Err(e) => errors.push(e.to_string()),
            }
        }
        drop(held);
        let d = dist(lat);
        b.md.push(format!(
            "| holders | {h} | {} |",
            b.rtt_cells(&[d.p50, d.p99])
        ));
        out.push(SemaphoreRow {
            with: "holders",
            size: h,
            rtt_us: r1(b.rtt_us),
            dist: d.row(b.rtt_us),
            errors,
        });
    }
    for &w in &sizes {
        let dur = (b.sizes.scale_secs * SEC as f64) as u64;
        let start = mono_ns() + 300 * MS + u64::from(w) * MS;
        let spec = b.timed_spec(
            Lib::Semaphore,
            &format!("sem-waiters{w}"),
            false,
            b.sizes.scale_hold_us,
            start,
            dur,
        );
        let window = (start + dur / 4, start + dur * 9 / 10);
        let o = b.run_timed(&spec, 0, w + 1, Some(window));
        let (lat, _) = handoffs(&o.recs);
        let d = dist(lat);
        b.md.push(format!(
            "| waiters | {w} | {} |",
            b.rtt_cells(&[d.p50, d.p99])
        ));
        out.push(SemaphoreRow {
            with: "waiters",
            size: w,
            rtt_us: r1(b.rtt_us),
            dist: d.row(b.rtt_us),
            errors: o.errors,
        });
    }
    b.md.push(String::new());
    b.results.semaphore = Some(out);
}
