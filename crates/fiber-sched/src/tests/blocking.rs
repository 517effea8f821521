//! The blocking pool: off the workers, capped, borrowing, panics, retire.

use crate::{blocking, sleep, Runtime};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The report's case: 32 concurrent 100 ms blocking calls on two workers
/// run side by side on the pool, and a fiber sleeping 1 ms in a loop keeps
/// going meanwhile (hang and freeze detection only: generous bounds).
#[test]
fn thirty_two_blocking_calls_do_not_freeze_the_runtime() {
    let rt = Runtime::builder().workers(2).build().unwrap();
    let (elapsed, ticks) = rt.block_on(|| {
        let done = Arc::new(AtomicUsize::new(0));
        let ticks = Arc::new(AtomicUsize::new(0));
        let ticker = {
            let (done, ticks) = (done.clone(), ticks.clone());
            fiber_core::spawn(move || {
                while done.load(Ordering::Relaxed) < 32 {
                    sleep(Duration::from_millis(1)).unwrap();
                    ticks.fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        let start = Instant::now();
        let calls: Vec<_> = (0..32)
            .map(|_| {
                let done = done.clone();
                fiber_core::spawn(move || {
                    let on = blocking(|| {
                        std::thread::sleep(Duration::from_millis(100));
                        std::thread::current().name().unwrap_or("").to_string()
                    });
                    done.fetch_add(1, Ordering::Relaxed);
                    on
                })
            })
            .collect();
        let threads: Vec<String> = calls.into_iter().map(|c| c.join().unwrap()).collect();
        let elapsed = start.elapsed();
        ticker.join().unwrap();
        // Every call ran on a blocking-pool thread, never on a worker.
        assert!(threads.iter().all(|name| name.ends_with("-blocking")), "{threads:?}");
        (elapsed, ticks.load(Ordering::Relaxed))
    });
    // Serial on two workers would be 1.6 s; side by side it is ~100 ms.
    assert!(
        elapsed < Duration::from_millis(32 * 100 / 2),
        "32 calls took {elapsed:?}"
    );
    // The ticker ran during the calls (a frozen runtime gives 0 or 1).
    assert!(ticks >= 5, "the 1 ms sleep loop made {ticks} turns in {elapsed:?}");
}

#[test]
fn the_cap_bounds_concurrent_calls_and_queued_calls_still_run() {
    let rt = Runtime::builder().workers(2).max_blocking_threads(2).build().unwrap();
    let running = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let calls: Vec<_> = (0..8)
        .map(|i| {
            let (running, peak) = (running.clone(), peak.clone());
            rt.spawn(move || {
                blocking(|| {
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(now, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(10));
                    running.fetch_sub(1, Ordering::SeqCst);
                    i
                })
            })
        })
        .collect();
    let sum: usize = calls.into_iter().map(|c| c.join().unwrap()).sum();
    assert_eq!(sum, 28);
    let peak = peak.load(Ordering::SeqCst);
    assert!((1..=2).contains(&peak), "peak concurrency {peak} with a cap of 2");
}

#[test]
fn blocking_borrows_from_the_fiber_and_returns_panics() {
    let rt = Runtime::builder().workers(1).build().unwrap();
    rt.block_on(|| {
        let mut data = vec![1u64, 2, 3];
        let sum: u64 = blocking(|| {
            data.push(4);
            data.iter().sum()
        });
        assert_eq!((sum, data.len()), (10, 4));
        let caught = std::panic::catch_unwind(|| blocking(|| panic!("boom in the pool")));
        let payload = caught.unwrap_err();
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"boom in the pool"));
        // A blocking thread is not a worker.
        let on_worker = blocking(|| fiber_core::in_fiber() || crate::current_stats().is_some());
        assert!(!on_worker);
    });
    // From a plain thread: runs inline.
    let me = std::thread::current().id();
    assert_eq!(blocking(|| std::thread::current().id()), me);
}

#[test]
fn cancellation_waits_for_the_running_call() {
    let rt = Runtime::builder().workers(1).build().unwrap();
    let finished = Arc::new(AtomicUsize::new(0));
    let started = Arc::new(AtomicUsize::new(0));
    let (f, s) = (finished.clone(), started.clone());
    let handle = rt.spawn(move || {
        blocking(|| {
            s.store(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(50))
        });
        f.fetch_add(1, Ordering::SeqCst);
    });
    // Cancel once the call runs on the pool (the fiber waits for it then;
    // `fibers_parked` is approximate and could show the fiber parked before
    // it had started, and a fiber cancelled before it starts never runs).
    while started.load(Ordering::SeqCst) == 0 {
        std::thread::yield_now();
    }
    handle.cancel();
    // The call is not abandoned: it completes, then the fiber goes on.
    let _ = handle.join();
    assert_eq!(finished.load(Ordering::SeqCst), 1);
}

/// Two calls that must run at the same time (each waits for the other)
/// while one idle thread is left from earlier: the second call gets a
/// thread of its own instead of queueing behind the first.
#[test]
fn an_idle_thread_is_not_promised_to_two_calls() {
    let rt = Runtime::builder().workers(2).build().unwrap();
    rt.block_on(|| blocking(|| ()));
    let (a_tx, a_rx) = std::sync::mpsc::channel::<()>();
    let (b_tx, b_rx) = std::sync::mpsc::channel::<()>();
    let hang = Duration::from_secs(30);
    let a = rt.spawn(move || {
        blocking(move || {
            a_tx.send(()).unwrap();
            b_rx.recv_timeout(hang).is_ok()
        })
    });
    let b = rt.spawn(move || {
        blocking(move || {
            b_tx.send(()).unwrap();
            a_rx.recv_timeout(hang).is_ok()
        })
    });
    assert!(a.join().unwrap() && b.join().unwrap(), "the two calls did not overlap");
}

/// The count the deadlock check needs: calls in flight per runtime.
#[test]
fn in_flight_counts_running_calls() {
    let rt = Runtime::builder().workers(1).build().unwrap();
    let id = rt.shared.id;
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let call = rt.spawn(move || blocking(move || release_rx.recv().unwrap()));
    let deadline = Instant::now() + Duration::from_secs(30);
    while crate::blocking::in_flight(id) != 1 && Instant::now() < deadline {
        std::thread::yield_now();
    }
    assert_eq!(crate::blocking::in_flight(id), 1);
    release_tx.send(()).unwrap();
    call.join().unwrap();
    // The pool thread counts the call out after it woke the caller (so a
    // shut-down runtime's reaper that sees no call in flight knows every
    // caller is back in a run queue): the join may return first.
    let deadline = Instant::now() + Duration::from_secs(30);
    while crate::blocking::in_flight(id) != 0 && Instant::now() < deadline {
        std::thread::yield_now();
    }
    assert_eq!(crate::blocking::in_flight(id), 0);
}
