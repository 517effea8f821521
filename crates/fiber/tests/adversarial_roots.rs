//! Adversarial: several plain threads in `block_on` on one runtime (a
//! documented use). The deadlock report ("all fibers are asleep") names a
//! root parked forever even after another root came and went.

use std::time::{Duration, Instant};

mod common;
use common::ms;

#[test]
fn a_deadlocked_root_is_reported_after_another_block_on_returns() {
    let rt = fiber::Runtime::builder()
        .workers(2)
        .shutdown_timeout(ms(200))
        .build()
        .unwrap();
    let h = rt.handle();
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let stuck = std::thread::spawn(move || {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            h.block_on(move || {
                let (_tx, rx) = fiber::chan::bounded::<u8>(0);
                started_tx.send(()).unwrap();
                // A real deadlock: the only sender is this fiber's own.
                let _ = rx.recv();
            })
        }));
    });
    started_rx.recv().unwrap();
    std::thread::sleep(ms(50));
    // A second root comes and goes.
    rt.block_on(|| ());
    let start = Instant::now();
    while rt.stats().deadlock_reports == 0 && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(ms(20));
    }
    let reports = rt.stats().deadlock_reports;
    // Dropping the runtime cancels the stuck root: its thread returns.
    drop(rt);
    stuck.join().unwrap();
    assert!(
        reports >= 1,
        "no deadlock report for a root parked forever after another root returned"
    );
}
