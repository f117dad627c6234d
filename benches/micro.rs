//! Criterion micro benchmarks: the PING round
//! trip, a trivial EVALSHA, uncontended acquire + release, and re-entrant acquire + release.
//!
//! Needs a throwaway Redis in `FAIRLOCK_BENCH_REDIS` (`scripts/bench.sh` starts one and passes
//! it); without it this prints why and measures nothing. `benches/driver.rs` reads the medians
//! criterion writes (`target/criterion/micro/*/new/estimates.json`) into the results table.

mod locks;

use criterion::{criterion_group, criterion_main, Criterion};
use locks::{Lib, Locker};

fn micro(c: &mut Criterion) {
    let Ok(url) = std::env::var("FAIRLOCK_BENCH_REDIS") else {
        eprintln!("micro: FAIRLOCK_BENCH_REDIS is not set; run scripts/bench.sh (it starts a throwaway redis-server)");
        return;
    };
    let mut conn = redis::Client::open(url.as_str())
        .and_then(|c| c.get_connection())
        .expect("connect to FAIRLOCK_BENCH_REDIS");
    let client = fairlock::LockClient::connect(&url).expect("fairlock client");
    let run = std::process::id();

    let mut g = c.benchmark_group("micro");
    g.bench_function("ping", |b| {
        b.iter(|| redis::cmd("PING").query::<String>(&mut conn).unwrap())
    });
    let trivial = redis::Script::new("return 1");
    g.bench_function("evalsha_return1", |b| {
        b.iter(|| trivial.prepare_invoke().invoke::<i64>(&mut conn).unwrap())
    });

    let lock = client
        .fair_lock(&format!("micro-uncontended-{run}"))
        .unwrap();
    g.bench_function("fairlock_uncontended", |b| {
        b.iter(|| lock.lock().unwrap().unlock().unwrap())
    });

    let lock = client.fair_lock(&format!("micro-reentrant-{run}")).unwrap();
    let outer = lock.lock().unwrap();
    g.bench_function("fairlock_reentrant", |b| {
        b.iter(|| lock.lock().unwrap().unlock().unwrap())
    });
    outer.unlock().unwrap();

    for lib in [Lib::Naive, Lib::Redlock] {
        let name = format!("micro-uncontended-{run}");
        let mut locker = Locker::new(lib, &url, &name, None, "micro").unwrap();
        g.bench_function(format!("{}_uncontended", lib.name()), |b| {
            b.iter(|| {
                locker.acquire(u64::MAX).unwrap().expect("uncontended");
                locker.release().unwrap();
            })
        });
    }
    g.finish();
}

criterion_group!(benches, micro);
criterion_main!(benches);
