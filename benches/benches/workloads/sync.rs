//! fiber-sync rows of the workloads table (`sync_*`): uncontended and
//! contended mutex, semaphore round trip, a wait group of 1,000 fibers,
//! each against tokio's and std's nearest equivalents.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Uncontended lock+unlock pairs per measurement.
const UNCONTENDED_OPS: u64 = 10_000_000;
/// Contended: parties, lock/increment/unlock each, worker threads.
const CONTENDED_PARTIES: usize = 8;
const CONTENDED_OPS: u64 = 100_000;
const CONTENDED_WORKERS: usize = 2;
/// Semaphore acquire/release round trips.
const SEMAPHORE_OPS: u64 = 2_000_000;
/// Wait group: members per group, groups per measurement.
const GROUP: usize = 1_000;
const GROUP_ROUNDS: u32 = 20;

fn timed(warmup: bool, mut body: impl FnMut() -> Duration) -> Duration {
    if warmup {
        black_box(body());
    }
    body()
}

fn fiber_rt(workers: usize) -> fiber::Runtime {
    fiber::Runtime::builder().workers(workers).build().expect("runtime")
}

fn tokio_rt(workers: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn uncontended(system: &str) -> Duration {
    match system {
        "fiber" => {
            // On a plain thread, like the std row: the fast path is the
            // same in a fiber.
            let m = fiber::sync::Mutex::new(0u64);
            let start = Instant::now();
            for _ in 0..UNCONTENDED_OPS {
                *black_box(&m).lock().unwrap() += 1;
            }
            start.elapsed()
        }
        "tokio" => tokio_rt(1).block_on(async {
            let m = tokio::sync::Mutex::new(0u64);
            let start = Instant::now();
            for _ in 0..UNCONTENDED_OPS {
                *black_box(&m).lock().await += 1;
            }
            start.elapsed()
        }),
        _ => {
            let m = std::sync::Mutex::new(0u64);
            let start = Instant::now();
            for _ in 0..UNCONTENDED_OPS {
                *black_box(&m).lock().unwrap() += 1;
            }
            start.elapsed()
        }
    }
}

fn contended(system: &str) -> Duration {
    let total = CONTENDED_PARTIES as u64 * CONTENDED_OPS;
    match system {
        "fiber" => fiber_rt(CONTENDED_WORKERS).block_on(move || {
            let m = Arc::new(fiber::sync::Mutex::new(0u64));
            let start = Instant::now();
            let handles: Vec<_> = (0..CONTENDED_PARTIES)
                .map(|_| {
                    let m = m.clone();
                    fiber::spawn(move || {
                        for _ in 0..CONTENDED_OPS {
                            *m.lock().unwrap() += 1;
                        }
                    })
                })
                .collect();
            for h in handles {
                h.join().unwrap();
            }
            let d = start.elapsed();
            super::check(*m.lock().unwrap() == total, || "sync_contended: lost increments".into());
            d
        }),
        "tokio" => tokio_rt(CONTENDED_WORKERS).block_on(async move {
            let m = Arc::new(tokio::sync::Mutex::new(0u64));
            let start = Instant::now();
            let handles: Vec<_> = (0..CONTENDED_PARTIES)
                .map(|_| {
                    let m = m.clone();
                    tokio::spawn(async move {
                        for _ in 0..CONTENDED_OPS {
                            *m.lock().await += 1;
                        }
                    })
                })
                .collect();
            for h in handles {
                h.await.unwrap();
            }
            let d = start.elapsed();
            super::check(*m.lock().await == total, || "sync_contended: lost increments".into());
            d
        }),
        _ => {
            let m = Arc::new(std::sync::Mutex::new(0u64));
            let start = Instant::now();
            let handles: Vec<_> = (0..CONTENDED_PARTIES)
                .map(|_| {
                    let m = m.clone();
                    std::thread::spawn(move || {
                        for _ in 0..CONTENDED_OPS {
                            *m.lock().unwrap() += 1;
                        }
                    })
                })
                .collect();
            for h in handles {
                h.join().unwrap();
            }
            let d = start.elapsed();
            super::check(*m.lock().unwrap() == total, || "sync_contended: lost increments".into());
            d
        }
    }
}

fn semaphore(system: &str) -> Duration {
    match system {
        "fiber" => fiber_rt(1).block_on(|| {
            let s = fiber::sync::Semaphore::new(1);
            let start = Instant::now();
            for _ in 0..SEMAPHORE_OPS {
                drop(black_box(&s).acquire().unwrap());
            }
            start.elapsed()
        }),
        _ => tokio_rt(1).block_on(async {
            let s = tokio::sync::Semaphore::new(1);
            let start = Instant::now();
            for _ in 0..SEMAPHORE_OPS {
                drop(black_box(&s).acquire().await.unwrap());
            }
            start.elapsed()
        }),
    }
}

fn waitgroup(system: &str) -> Duration {
    match system {
        "fiber" => fiber_rt(super::cores()).block_on(|| {
            let start = Instant::now();
            for _ in 0..GROUP_ROUNDS {
                let wg = fiber::sync::WaitGroup::new();
                for _ in 0..GROUP {
                    let wg = wg.clone();
                    fiber::spawn(move || drop(wg));
                }
                wg.wait();
            }
            start.elapsed()
        }),
        "tokio" => tokio_rt(super::cores()).block_on(async {
            // tokio's idiom: every task holds a sender; recv ends when all
            // are dropped.
            let start = Instant::now();
            for _ in 0..GROUP_ROUNDS {
                let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(1);
                for _ in 0..GROUP {
                    let tx = tx.clone();
                    tokio::spawn(async move { drop(tx) });
                }
                drop(tx);
                let _ = rx.recv().await;
            }
            start.elapsed()
        }),
        _ => {
            let start = Instant::now();
            for _ in 0..GROUP_ROUNDS {
                let (tx, rx) = crossbeam_channel::bounded::<()>(0);
                for _ in 0..GROUP {
                    let tx = tx.clone();
                    std::thread::spawn(move || drop(tx));
                }
                drop(tx);
                let _ = rx.recv();
            }
            start.elapsed()
        }
    }
}

/// One `sync_*` measurement: (value, unit, detail).
pub fn run(workload: &str, system: &str) -> (f64, &'static str, String) {
    let warmup = super::warmup_on();
    let per = |d: Duration, n: u64| d.as_nanos() as f64 / n as f64;
    match (workload, system) {
        ("sync_uncontended", _) => {
            let d = timed(warmup, || uncontended(system));
            let detail = match system {
                "fiber" => "fiber::sync::Mutex on a thread",
                "tokio" => "tokio::sync::Mutex",
                _ => "std::sync::Mutex",
            };
            (per(d, UNCONTENDED_OPS), "ns/op", detail.into())
        }
        ("sync_contended", _) => {
            let d = timed(warmup, || contended(system));
            let detail = match system {
                "threads" => "8 OS threads, std Mutex",
                _ => "8 on 2 workers",
            };
            (per(d, CONTENDED_PARTIES as u64 * CONTENDED_OPS), "ns/op", detail.into())
        }
        ("sync_semaphore", "threads") => {
            println!("SKIP {workload} {system} std has no semaphore");
            std::process::exit(0);
        }
        ("sync_semaphore", _) => {
            let d = timed(warmup, || semaphore(system));
            (per(d, SEMAPHORE_OPS), "ns/rt", "uncontended".into())
        }
        ("sync_waitgroup", _) => {
            let d = timed(warmup, || waitgroup(system));
            let detail = match system {
                "fiber" => "WaitGroup",
                "tokio" => "mpsc sender drop",
                _ => "threads + crossbeam sender drop",
            };
            (d.as_secs_f64() * 1e6 / GROUP_ROUNDS as f64, "us", detail.into())
        }
        _ => {
            eprintln!("unknown workload {workload}");
            std::process::exit(2);
        }
    }
}
