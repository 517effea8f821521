//! Adversarial: the elastic pool's edges. With growth off
//! (`max_workers == workers`), a worker that computes for longer than the
//! retire interval must not be drained for good (spec/sched.md section 5:
//! the pool never retires below `workers`); Go and tokio never drop below
//! their worker count.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::ms;

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

/// Spawn `n` fibers that are all alive at once (each waits until the last
/// one is spawned) and join them.
fn burst(rt: &fiber::Runtime, n: usize) {
    rt.block_on(move || {
        let (tx, rx) = fiber::chan::bounded::<()>(0);
        let handles: Vec<_> = (0..n)
            .map(|_| {
                let rx = rx.clone();
                fiber::spawn(move || rx.recv().is_err())
            })
            .collect();
        drop(tx);
        assert!(handles.into_iter().all(|h| h.join().unwrap()));
    });
}

/// Bursts of 3,000 fibers every 200 ms for 4 s reuse the first burst's
/// frames. The monitor trimmed every frame beyond 1,024 whenever two of its
/// checks 1 s apart fell between bursts, so each later burst made about
/// 2,000 new frames (and faulted in their stacks' pages).
#[test]
fn bursts_that_come_back_keep_their_frames() {
    const N: usize = 3_000;
    let rt = fiber::Runtime::builder().workers(2).build().unwrap();
    burst(&rt, N);
    let first = rt.stats().frames_allocated;
    let start = Instant::now();
    let mut bursts = 1;
    while start.elapsed() < Duration::from_secs(4) {
        std::thread::sleep(ms(200));
        burst(&rt, N);
        bursts += 1;
    }
    let frames = rt.stats().frames_allocated;
    assert!(
        frames <= first + N / 10,
        "{bursts} bursts of {N} fibers made {frames} frames (the first made {first})"
    );
}

/// A pool that goes quiet still gives its frames back: after 2.5 s
/// without fibers, frames beyond the pool's cap of 1,024 idle frames are
/// gone, so the next burst of 3,000 makes new ones.
#[test]
fn a_pool_that_goes_quiet_is_trimmed() {
    const N: usize = 3_000;
    let rt = fiber::Runtime::builder().workers(2).build().unwrap();
    burst(&rt, N);
    let first = rt.stats().frames_allocated;
    std::thread::sleep(Duration::from_millis(2_500));
    burst(&rt, N);
    let frames = rt.stats().frames_allocated;
    assert!(
        frames >= first + 1_000,
        "after 2.5 s quiet a burst of {N} made only {} new frames: the idle frames were never trimmed",
        frames - first
    );
}
