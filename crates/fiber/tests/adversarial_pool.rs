//! Adversarial: the elastic pool's edges. With growth off
//! (`max_workers == workers`), a worker that computes for longer than the
//! retire interval must not be drained for good (spec/sched.md section 5:
//! the pool never retires below `workers`); Go and tokio never drop below
//! their worker count.

use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
use common::ms;

/// One worker, growth off, a 500 ms computation with no yield point, a
/// 200 ms retire interval: the root resumes after it.
#[test]
fn a_long_computation_with_growth_off_keeps_the_runtime_its_worker() {
    let rt = Arc::new(
        fiber::Runtime::builder()
            .workers(1)
            .max_workers(1)
            .idle_timeout(ms(200))
            .shutdown_timeout(ms(200))
            .build()
            .unwrap(),
    );
    let (tx, rx) = std::sync::mpsc::channel();
    let rt2 = rt.clone();
    std::thread::spawn(move || {
        let v = rt2.block_on(|| {
            let t = Instant::now();
            while t.elapsed() < ms(500) {
                std::hint::spin_loop();
            }
            fiber::sleep(ms(1)).unwrap();
            7
        });
        let _ = tx.send(v);
    });
    let got = rx.recv_timeout(Duration::from_secs(10));
    let s = rt.stats();
    if got.is_err() {
        // Leak the runtime: its root can never finish.
        std::mem::forget(rt);
    }
    assert_eq!(
        got.ok(),
        Some(7),
        "the root never resumed after its computation: {} worker(s) alive (min {}), drained_stuck {}, events {:?}",
        s.workers,
        s.min_workers,
        s.workers_drained_stuck,
        s.scale_events
    );
}

/// A plain thread that calls `block_on` (or `Runtime::spawn` and joins)
/// again and again reuses frames: at most one fiber is alive at a time.
/// The frames its fibers left went into the workers' caches and batches,
/// which a thread without a cache of the pool never looked at, so each
/// call mapped a new stack (20,000 frames for 20,000 calls, memory bounded
/// only by the monitor's trim).
#[test]
fn outside_spawns_reuse_frames_finished_on_the_workers() {
    let rt = fiber::Runtime::builder().workers(2).build().unwrap();
    for i in 0..3_000usize {
        assert_eq!(rt.block_on(move || i), i);
        assert_eq!(rt.spawn(move || i).join().unwrap(), i);
    }
    let frames = rt.stats().frames_allocated;
    assert!(
        frames < 500,
        "6,000 outside spawns, one alive at a time, made {frames} frames"
    );
}
