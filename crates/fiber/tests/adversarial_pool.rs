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
