//! Adversarial: several plain threads in `block_on` on one runtime (a
//! documented use). The deadlock report ("all fibers are asleep") names a
//! root parked forever even after another root came and went. A root whose
//! job was cancelled and that returns a value hands it back.

use fiber::Job;
use std::time::{Duration, Instant};

use crate::common::{ms, rt, within};

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

/// The deadlock check looked at a process-wide count of socket waits, so a
/// server of another runtime parked in `accept` hid this runtime's
/// deadlock for ever. It now looks for socket waits among its own fibers.
#[test]
fn a_deadlock_is_reported_while_another_runtime_waits_on_a_socket() {
    crate::common::within(60, || {
        let other = crate::common::rt();
        let l = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let accepting = other.spawn(move || {
            let _ = l.accept();
        });
        let stuck = crate::common::rt();
        let h = stuck.handle();
        let t = std::thread::spawn(move || {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                h.block_on(|| {
                    let (_tx, rx) = fiber::chan::bounded::<u8>(0);
                    let _ = rx.recv();
                })
            }));
        });
        let start = Instant::now();
        while stuck.stats().deadlock_reports == 0 && start.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(ms(50));
        }
        let reports = stuck.stats().deadlock_reports;
        drop(stuck);
        t.join().unwrap();
        accepting.cancel();
        drop(other);
        assert!(reports >= 1, "the parked root was not reported");
    });
}

/// Its own fiber waiting on a socket still keeps a root from being
/// reported: the outside world may wake it.
#[test]
fn no_report_while_a_fiber_of_the_same_runtime_waits_on_a_socket() {
    crate::common::within(60, || {
        let rt = crate::common::rt();
        let reports = rt.block_on(|| {
            let l = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            let server = fiber::spawn(move || l.accept().map(|_| ()));
            // Longer than the deadlock threshold (1 s).
            std::thread::spawn(move || {
                std::thread::sleep(ms(1800));
                let _ = std::net::TcpStream::connect(addr);
            });
            server.join().unwrap().unwrap();
            fiber::stats().runtime.deadlock_reports
        });
        assert_eq!(reports, 0);
    });
}

/// `fiber::run` "return[s] f's value"; cancellation is cooperative: a root
/// fiber whose job was cancelled (e.g. by a shutdown signal from a thread)
/// and that returns normally must hand its value back, not panic.
#[test]
fn run_returns_the_value_of_a_root_fiber_whose_job_was_cancelled() {
    within(30, || {
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        let t = std::thread::spawn(move || rx.recv().unwrap().cancel());
        let r = std::panic::catch_unwind(|| {
            fiber::run(move || {
                tx.send(Job::current()).unwrap();
                // graceful loop: stops when cancelled, then returns a summary
                let mut ticks = 0u32;
                while fiber::sleep(Duration::from_millis(5)).is_ok() {
                    ticks += 1;
                }
                ticks + 1000
            })
        });
        t.join().unwrap();
        match r {
            Ok(v) => assert!(v >= 1000),
            Err(p) => panic!(
                "fiber::run panicked although f returned a value: {:?}",
                p.downcast_ref::<String>()
            ),
        }
    });
}

#[test]
fn block_on_returns_the_value_when_the_root_cancels_itself() {
    within(30, || {
        let r = std::panic::catch_unwind(|| {
            rt().block_on(|| {
                Job::current().cancel();
                42
            })
        });
        match r {
            Ok(v) => assert_eq!(v, 42),
            Err(p) => panic!(
                "block_on panicked although f returned 42: {:?}",
                p.downcast_ref::<String>()
            ),
        }
    });
}
