//! Review 64: the benchmark workloads W1-W8 of `BENCHMARKS.md`, written
//! fresh from the spec as an outside harness would write them (public API
//! only), scaled down, under the configurations such a harness may use:
//! `Runtime::builder().workers(C)` with growth left on and with growth off,
//! C = 1, 2, 4, 8 on a 2-core machine; the driver as the root fiber and on
//! a plain thread through a `Handle`; warm-up and timed runs in one process
//! and many runtimes one after the other; the runtime dropped while W7's
//! fibers are still parked, and the process exiting without dropping it;
//! CPU-bound fibers that never yield beside a driver that sleeps; and a
//! `FIBER_MAX_WORKERS` in the environment below the builder's `workers`.
//! No defect was found: these pin what the harness relies on. Scenarios
//! that could hang or exit run in a child process or under `within`.

use crate::common::*;

use fiber::chan;
use fiber::JoinHandle;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where a workload's fibers are spawned from: the driver fiber
/// (`fiber::spawn`), or a plain thread through a `Handle`.
#[derive(Clone)]
enum Sp {
    Fiber,
    Handle(fiber::Handle),
}

impl Sp {
    fn spawn<F, T>(&self, f: F) -> JoinHandle<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        match self {
            Sp::Fiber => fiber::spawn(f),
            Sp::Handle(h) => h.spawn(f),
        }
    }

    fn sleep(&self, d: Duration) {
        match self {
            Sp::Fiber => fiber::sleep(d).unwrap(),
            Sp::Handle(_) => std::thread::sleep(d),
        }
    }
}

fn w1(sp: &Sp, n: usize) {
    let mut hs = Vec::with_capacity(n);
    for _ in 0..n {
        hs.push(sp.spawn(|| {}));
    }
    let ok = hs.into_iter().map(|h| h.join().is_ok() as usize).sum::<usize>();
    assert_eq!(ok, n, "W1: every join succeeds");
}

fn skynet(tx: chan::Sender<u64>, num: u64, size: u64) {
    if size == 1 {
        tx.send(num).unwrap();
        return;
    }
    let (ctx, crx) = chan::bounded(10);
    for i in 0..10 {
        let ctx = ctx.clone();
        let s = size / 10;
        fiber::spawn(move || skynet(ctx, num + i * s, s));
    }
    drop(ctx);
    let sum: u64 = (0..10).map(|_| crx.recv().unwrap()).sum();
    tx.send(sum).unwrap();
}

fn w2(sp: &Sp, leaves: u64) {
    let (tx, rx) = chan::bounded(1);
    sp.spawn(move || skynet(tx, 0, leaves));
    assert_eq!(rx.recv().unwrap(), leaves * (leaves - 1) / 2, "W2: skynet sum");
}

fn w3(sp: &Sp, rounds: u64) {
    let (atx, arx) = chan::bounded::<u64>(0);
    let (btx, brx) = chan::bounded::<u64>(0);
    let pong = sp.spawn(move || {
        while let Ok(x) = arx.recv() {
            btx.send(x + 1).unwrap();
        }
    });
    for i in 0..rounds {
        atx.send(i).unwrap();
        assert_eq!(brx.recv().unwrap(), i + 1, "W3: pong's answer");
    }
    drop(atx);
    pong.join().unwrap();
}

fn w4(sp: &Sp, producers: u64, consumers: u64, per: u64) {
    let (tx, rx) = chan::bounded::<u64>(1024);
    let ps: Vec<_> = (0..producers)
        .map(|p| {
            let tx = tx.clone();
            sp.spawn(move || {
                for k in 0..per {
                    tx.send(p * 1_000_000 + k).unwrap();
                }
            })
        })
        .collect();
    drop(tx);
    let cs: Vec<_> = (0..consumers)
        .map(|_| {
            let rx = rx.clone();
            sp.spawn(move || {
                let (mut c, mut s) = (0u64, 0u64);
                while let Ok(v) = rx.recv() {
                    c += 1;
                    s += v;
                }
                (c, s)
            })
        })
        .collect();
    drop(rx);
    for p in ps {
        p.join().unwrap();
    }
    let (mut c, mut s) = (0, 0);
    for h in cs {
        let (a, b) = h.join().unwrap();
        c += a;
        s += b;
    }
    let want: u64 = (0..producers).map(|p| p * 1_000_000 * per + per * (per - 1) / 2).sum();
    assert_eq!((c, s), (producers * per, want), "W4: count and sum");
}

fn w5(sp: &Sp, tasks: u64, yields: u64) {
    let hs: Vec<_> = (0..tasks)
        .map(|_| {
            sp.spawn(move || {
                for _ in 0..yields {
                    fiber::yield_now().unwrap();
                }
                yields
            })
        })
        .collect();
    assert_eq!(
        hs.into_iter().map(|h| h.join().unwrap()).sum::<u64>(),
        tasks * yields,
        "W5"
    );
}

fn w6(sp: &Sp, n: usize) {
    let hs: Vec<_> = (0..n)
        .map(|_| {
            sp.spawn(|| {
                let t0 = Instant::now();
                fiber::sleep(ms(10)).unwrap();
                t0.elapsed() >= ms(10)
            })
        })
        .collect();
    let early = hs.into_iter().map(|h| !h.join().unwrap() as usize).sum::<usize>();
    assert_eq!(early, 0, "W6: no sleeper wakes early");
}

/// W7's parked fibers, kept: their senders and join handles.
type Parked = (Vec<chan::Sender<u64>>, Vec<JoinHandle<u64>>);

/// W7; with `release == false` the fibers stay parked and their senders
/// and handles are returned to the caller.
fn w7(sp: &Sp, n: usize, release: bool) -> Option<Parked> {
    let parked = Arc::new(AtomicUsize::new(0));
    let mut txs = Vec::with_capacity(n);
    let mut hs = Vec::with_capacity(n);
    for _ in 0..n {
        let (tx, rx) = chan::bounded::<u64>(1);
        txs.push(tx);
        let p = parked.clone();
        hs.push(sp.spawn(move || {
            p.fetch_add(1, Ordering::Relaxed);
            rx.recv().unwrap_or(u64::MAX)
        }));
    }
    while parked.load(Ordering::Relaxed) < n {
        sp.sleep(ms(1));
    }
    sp.sleep(ms(20));
    if !release {
        return Some((txs, hs));
    }
    for (i, tx) in txs.iter().enumerate() {
        tx.send(i as u64).unwrap();
    }
    let sum: u64 = hs.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(sum, (n as u64) * (n as u64 - 1) / 2, "W7: values received");
    None
}

fn block(input: &[u8], b: usize) -> &[u8] {
    &input[b * 131_072..(b + 1) * 131_072]
}

fn w8_input(blocks: usize) -> Arc<Vec<u8>> {
    const WORDS: [&str; 16] = [
        "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo", "lima",
        "mike", "november", "oscar", "papa",
    ];
    let len = blocks * 131_072;
    let mut buf = Vec::with_capacity(len + 64);
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    while buf.len() < len {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let r = x >> 33;
        buf.extend_from_slice(WORDS[(r & 15) as usize].as_bytes());
        if (r >> 4) & 7 == 0 {
            buf.extend_from_slice(((r >> 7) % 10_000).to_string().as_bytes());
        }
        buf.push(if (r >> 20) & 15 == 0 { b'\n' } else { b' ' });
    }
    buf.truncate(len);
    Arc::new(buf)
}

/// W8: one fiber per 128 KiB block, raw DEFLATE level 6, no yield point
/// inside; outputs collected in block order and decompressed back.
fn w8(sp: &Sp, input: &Arc<Vec<u8>>) {
    use std::io::{Read, Write};
    let blocks = input.len() / 131_072;
    let hs: Vec<_> = (0..blocks)
        .map(|b| {
            let input = input.clone();
            sp.spawn(move || {
                let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::new(6));
                e.write_all(block(&input, b)).unwrap();
                e.finish().unwrap()
            })
        })
        .collect();
    let outs: Vec<Vec<u8>> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    for (b, out) in outs.iter().enumerate() {
        let mut back = Vec::new();
        flate2::read::DeflateDecoder::new(&out[..])
            .read_to_end(&mut back)
            .unwrap();
        assert!(back == block(input, b), "W8: block {b} round trip");
    }
}

fn all_workloads(sp: &Sp, input: &Arc<Vec<u8>>) {
    w1(sp, 2_000);
    w2(sp, 1_000);
    w3(sp, 2_000);
    w4(sp, 4, 4, 5_000);
    w5(sp, 50, 50);
    w6(sp, 2_000);
    w7(sp, 2_000, true);
    w8(sp, input);
}

fn runtime(c: usize, fixed: bool) -> fiber::Runtime {
    let mut b = fiber::Runtime::builder();
    b.workers(c);
    if fixed {
        b.max_workers(c);
    }
    b.build().unwrap()
}

/// Every workload, warm-up then timed (twice in one `block_on`), with the
/// driver as the root fiber, on `workers(C)` with growth on and off.
#[test]
fn harness_workloads_as_root_fiber_on_one_to_eight_workers() {
    within(120, || {
        let input = w8_input(2);
        for (c, fixed) in [(1, true), (1, false), (2, false), (4, true), (8, false)] {
            let rt = runtime(c, fixed);
            rt.block_on(|| {
                // Warm-up, then the timed run, in one driver.
                for _ in 0..2 {
                    all_workloads(&Sp::Fiber, &input);
                }
            });
            drop(rt);
        }
    });
}

/// The same workloads driven from a plain thread: `Handle::spawn` and
/// `JoinHandle::join`, channels and `std::thread::sleep` on the thread
/// (W2's inner spawns are the fibers' own).
#[test]
fn harness_workloads_driven_from_a_plain_thread_through_a_handle() {
    within(120, || {
        let input = w8_input(2);
        for c in [1, 2] {
            for fixed in [false, true] {
                let rt = runtime(c, fixed);
                let sp = Sp::Handle(rt.handle());
                w1(&sp, 5_000);
                w2(&sp, 10_000);
                w3(&sp, 500); // a cross-thread hand-off per message
                w4(&sp, 4, 4, 20_000);
                w5(&sp, 100, 100);
                w6(&sp, 5_000);
                w7(&sp, 5_000, true);
                w8(&sp, &input);
            }
        }
    });
}

/// Handles made inside one `block_on` and joined on the main thread after
/// it returned; a pong spawned in one `block_on` served by the ping of a
/// second one.
#[test]
fn harness_handles_outlive_the_block_on_that_spawned_them() {
    within(60, || {
        let rt = runtime(2, false);
        let hs = rt.block_on(|| {
            (0..5_000u64)
                .map(|i| {
                    fiber::spawn(move || {
                        fiber::sleep(ms(5)).unwrap();
                        i
                    })
                })
                .collect::<Vec<_>>()
        });
        assert_eq!(
            hs.into_iter().map(|h| h.join().unwrap()).sum::<u64>(),
            5_000 * 4_999 / 2
        );
        let (atx, arx) = chan::bounded::<u64>(0);
        let (btx, brx) = chan::bounded::<u64>(0);
        let pong = rt.block_on(|| {
            fiber::spawn(move || {
                while let Ok(x) = arx.recv() {
                    btx.send(x + 1).unwrap();
                }
            })
        });
        rt.block_on(|| {
            for i in 0..5_000 {
                atx.send(i).unwrap();
                assert_eq!(brx.recv().unwrap(), i + 1);
            }
        });
        drop(atx);
        pong.join().unwrap();
    });
}

/// Many runtimes one after the other in one process (`fiber::run` and
/// builders with different worker counts), each running workloads: every
/// one finishes and is right.
#[test]
fn harness_many_runtimes_in_one_process() {
    within(120, || {
        let input = w8_input(2);
        for round in 0..3 {
            for c in [1, 2, 4, 8] {
                if (round + c) % 2 == 0 {
                    fiber::run(|| {
                        w2(&Sp::Fiber, 1_000);
                        w5(&Sp::Fiber, 50, 50);
                        w6(&Sp::Fiber, 1_000);
                    });
                } else {
                    let rt = runtime(c, round == 1);
                    rt.block_on(|| {
                        w3(&Sp::Fiber, 2_000);
                        w7(&Sp::Fiber, 2_000, true);
                        w8(&Sp::Fiber, &input);
                    });
                }
            }
        }
    });
}

/// W7's fibers left parked when the timed run ends (senders kept alive):
/// dropping the runtime right away ends them (their `recv` returns
/// `Cancelled`) and returns, from the root-fiber driver and from a
/// plain-thread driver alike.
#[test]
fn harness_runtime_dropped_while_w7_fibers_are_still_parked() {
    within(150, || {
        for plain in [false, true] {
            // A grace time far above the bound below: a drop that waited for
            // it (fibers not ended by their cancellation) cannot pass, and
            // a slow machine has room.
            let rt = fiber::Runtime::builder()
                .workers(2)
                .shutdown_timeout(Duration::from_secs(120))
                .build()
                .unwrap();
            let kept = if plain {
                w7(&Sp::Handle(rt.handle()), 20_000, false)
            } else {
                rt.block_on(|| w7(&Sp::Fiber, 20_000, false))
            };
            let (txs, hs) = kept.unwrap();
            let start = Instant::now();
            drop(rt);
            let took = start.elapsed();
            // Every fiber ended, its receive cancelled; a fiber cancelled
            // before it returned joins as `Cancelled` (its value, here
            // `u64::MAX` from `unwrap_or`, is dropped), as documented in
            // `Task::complete`.
            let cancelled = hs
                .into_iter()
                .map(|h| h.join().map_err(|e| e.is_cancelled()))
                .filter(|r| *r == Err(true))
                .count();
            assert_eq!(cancelled, 20_000, "every parked fiber was cancelled at the drop");
            assert!(
                took < Duration::from_secs(60),
                "the drop waited {took:?} (grace time is 120 s)"
            );
            drop(txs);
        }
    });
}

/// The process exits (`std::process::exit(0)`) without dropping the
/// runtime while W7's fibers are parked and W8-style fibers are computing:
/// a clean exit, no hang, no abort.
#[test]
fn harness_process_exit_without_dropping_the_runtime() {
    in_child("harness_process_exit_without_dropping_the_runtime", 30, || {
        let rt = runtime(2, false);
        let kept = rt.block_on(|| {
            let kept = w7(&Sp::Fiber, 20_000, false);
            for _ in 0..4 {
                fiber::spawn(|| {
                    let t = Instant::now();
                    while t.elapsed() < Duration::from_secs(2) {
                        std::hint::spin_loop();
                    }
                });
            }
            kept
        });
        std::mem::forget(kept);
        std::mem::forget(rt);
        std::process::exit(0);
    });
}

/// CPU-bound fibers that never yield (more of them than workers) beside a
/// driver that sleeps: on `workers(2)` with growth left on, the driver's
/// sleep ends while they still run (the pool grows past the spinners),
/// and no stall report ends the process.
#[test]
fn harness_non_yielding_fibers_do_not_starve_the_driver_on_an_elastic_pool() {
    within(60, || {
        let rt = runtime(2, false);
        rt.block_on(|| {
            let stop = Arc::new(AtomicBool::new(false));
            let spinners: Vec<_> = (0..2)
                .map(|_| {
                    let stop = stop.clone();
                    fiber::spawn(move || {
                        let t = Instant::now();
                        while !stop.load(Ordering::Relaxed) {
                            if t.elapsed() > Duration::from_secs(10) {
                                return false; // never told: the driver starved
                            }
                            std::hint::spin_loop();
                        }
                        true
                    })
                })
                .collect();
            // Let both spinners take a worker each, then sleep on the timer.
            fiber::sleep(ms(20)).unwrap();
            fiber::sleep(ms(10)).unwrap();
            stop.store(true, Ordering::Relaxed);
            for h in spinners {
                assert!(
                    h.join().unwrap(),
                    "the driver's sleep waited for the spinners to give up"
                );
            }
        });
    });
}

/// `FIBER_MAX_WORKERS=2` in the environment and `workers(4)` from the
/// builder. This review had `build` fail with an `InvalidInput` naming the
/// variable; a later review held the README's rule ("builder values win
/// over the environment") against it, and the builder's `workers` now
/// lifts the environment's ceiling (spec/sched.md section 9). With the
/// builder's `max_workers` too, the builder wins as before.
#[test]
fn harness_env_max_workers_below_builder_workers_is_lifted_by_the_builder() {
    let outcome = child_outcome(
        "harness_env_max_workers_below_builder_workers_is_lifted_by_the_builder",
        30,
        &[("FIBER_MAX_WORKERS", "2")],
        || {
            let rt = fiber::Runtime::builder().workers(4).build().unwrap();
            assert_eq!((rt.stats().workers, rt.stats().max_workers), (4, 4));
            drop(rt);
            let rt = fiber::Runtime::builder().workers(4).max_workers(4).build().unwrap();
            assert_eq!(rt.block_on(|| fiber::spawn(|| 7).join().unwrap()), 7);
            // Alone, it caps the default runtime's pool.
            let rt = fiber::Runtime::new().unwrap();
            assert!(rt.stats().max_workers <= 2);
        },
    );
    if let Some((status, stderr)) = outcome {
        assert!(status.success(), "child failed ({status:?}):\n{stderr}");
    }
}
