//! A timeline of W6 (fibers that each sleep once, spawned and joined by one
//! fiber), several iterations in one runtime: when the spawn loop ended,
//! when the last fiber started, when the first and the last woke, and the
//! total. `spec/sched.md` section 7 ("Cost") was profiled with it.
//!
//! ```text
//! cargo build --release -p benches --example w6_timeline
//! target/release/examples/w6_timeline
//! ```
//!
//! Environment: `N` fibers (100,000), `MS` of sleep (10; 0 = no park),
//! `ITERS` (5), `WORKERS` (2, fixed), `DEEP=1` (each fiber keeps a 2 KiB
//! buffer on its stack across the sleep), `STATS=1` (frames allocated and
//! the most fibers alive during the spawn loop, sampled every 2,000
//! spawns), `TOKIO=1` (the same loop on tokio, spawn and total only).
//! Only every 128th fiber (and the last 128) records its times, so that
//! the recording does not bounce one cache line between the workers.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

static FIRST_WAKE: AtomicU64 = AtomicU64::new(u64::MAX);
static LAST_WAKE: AtomicU64 = AtomicU64::new(0);
static LAST_START: AtomicU64 = AtomicU64::new(0);

mod support;
use support::{env, fixed_runtime};

fn micros_since(base: Instant, at: Instant) -> u64 {
    at.saturating_duration_since(base).as_micros() as u64
}

fn main() {
    let n = env("N", 100_000) as usize;
    let iters = env("ITERS", 5);
    let sleep = Duration::from_millis(env("MS", 10));
    let workers = env("WORKERS", 2) as usize;
    if std::env::var_os("TOKIO").is_some() {
        return on_tokio(n, iters, sleep, workers);
    }
    let deep = std::env::var_os("DEEP").is_some();
    let stats = std::env::var_os("STATS").is_some();
    let rt = fixed_runtime(workers);
    rt.block_on(move || {
        for _ in 0..iters {
            FIRST_WAKE.store(u64::MAX, Ordering::Relaxed);
            LAST_WAKE.store(0, Ordering::Relaxed);
            LAST_START.store(0, Ordering::Relaxed);
            let base = Instant::now();
            let mut most_alive = 0;
            let handles: Vec<_> = (0..n)
                .map(|i| {
                    if stats && i % 2000 == 0 {
                        most_alive = most_alive.max(fiber::stats().runtime.fibers_alive);
                    }
                    fiber::spawn(move || {
                        let record = i % 128 == 0 || i + 128 >= n;
                        let started = Instant::now();
                        if record {
                            LAST_START.fetch_max(micros_since(base, started), Ordering::Relaxed);
                        }
                        if !sleep.is_zero() {
                            if deep {
                                sleep_with_a_deep_stack(sleep);
                            } else {
                                let _ = fiber::sleep(sleep);
                            }
                        }
                        let woke = Instant::now();
                        if record {
                            FIRST_WAKE.fetch_min(micros_since(base, woke), Ordering::Relaxed);
                            LAST_WAKE.fetch_max(micros_since(base, woke), Ordering::Relaxed);
                        }
                        woke - started >= sleep
                    })
                })
                .collect();
            let spawned = base.elapsed();
            let on_time = handles.into_iter().map(|h| h.join().unwrap() as usize).sum::<usize>();
            let total = base.elapsed();
            assert_eq!(on_time, n, "every fiber slept at least its duration");
            let ms = |us: &AtomicU64| us.load(Ordering::Relaxed) as f64 / 1e3;
            println!(
                "spawn {:6.1} ms  last_start {:6.1}  first_wake {:6.1}  last_wake {:6.1}  total {:6.1} ms",
                spawned.as_secs_f64() * 1e3,
                ms(&LAST_START),
                ms(&FIRST_WAKE),
                ms(&LAST_WAKE),
                total.as_secs_f64() * 1e3
            );
            if stats {
                println!(
                    "  frames allocated {}, most fibers alive during the spawn loop {most_alive}",
                    fiber::stats().runtime.frames_allocated
                );
            }
        }
    });
}

/// Sleep with 2 KiB of this frame written before and read after.
#[inline(never)]
fn sleep_with_a_deep_stack(sleep: Duration) {
    let mut buf = [0u8; 2048];
    std::hint::black_box(&mut buf);
    let _ = fiber::sleep(sleep);
    std::hint::black_box(&mut buf);
}

fn on_tokio(n: usize, iters: u64, sleep: Duration, workers: usize) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async move {
        tokio::spawn(async move {
            for _ in 0..iters {
                let base = Instant::now();
                let handles: Vec<_> = (0..n).map(|_| tokio::spawn(tokio::time::sleep(sleep))).collect();
                let spawned = base.elapsed();
                for handle in handles {
                    handle.await.unwrap();
                }
                println!(
                    "spawn {:6.1} ms  total {:6.1} ms",
                    spawned.as_secs_f64() * 1e3,
                    base.elapsed().as_secs_f64() * 1e3
                );
            }
        })
        .await
        .unwrap();
    });
}
