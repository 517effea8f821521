//! Timers (spec/sched.md section 7): per-worker wheels, fired by their
//! owner, by idle workers, or by the monitor when the owner is busy.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The name of the worker thread running the caller, read after any park
/// (never cached across a switch).
#[inline(never)]
fn worker_name() -> String {
    std::thread::current().name().unwrap_or("?").to_string()
}

/// A fiber arms a timer on worker X, then X runs a fiber that never
/// yields: the timer still fires (the owner cannot), and the sleeper runs
/// on the other worker while X spins. Growth is off, so nothing but the
/// timer design can rescue it.
#[test]
fn a_timer_armed_on_a_worker_that_then_spins_fires_and_its_fiber_runs_elsewhere() {
    let rt = fiber::Runtime::builder().workers(2).max_workers(2).build().unwrap();
    let outcome = rt.block_on(|| {
        for _attempt in 0..50 {
            let armed_on = Arc::new(Mutex::new(None::<String>));
            let woke = Arc::new(AtomicBool::new(false));
            let sleeper = {
                let (armed_on, woke) = (armed_on.clone(), woke.clone());
                fiber::spawn(move || {
                    *armed_on.lock().unwrap() = Some(worker_name());
                    fiber::sleep(Duration::from_millis(20)).unwrap();
                    woke.store(true, Ordering::Release);
                })
            };
            // Let the sleeper run and arm its timer.
            while armed_on.lock().unwrap().is_none() {
                let _ = fiber::yield_now();
            }
            // Once we run on the sleeper's worker, it has parked there (one
            // worker runs one fiber at a time): its timer is in that
            // worker's wheel. Otherwise try again.
            let same = armed_on.lock().unwrap().as_deref() == Some(worker_name().as_str());
            if !same {
                sleeper.join().unwrap();
                continue;
            }
            // Spin on this worker without a yield point until the sleeper
            // ran (a generous cap only detects a hang).
            let cap = Instant::now() + Duration::from_secs(20);
            while !woke.load(Ordering::Acquire) && Instant::now() < cap {
                std::hint::spin_loop();
            }
            let woke_while_spinning = woke.load(Ordering::Acquire);
            sleeper.join().unwrap();
            return Some(woke_while_spinning);
        }
        None
    });
    let woke = outcome.expect("the sleeper never armed on the driver's worker in 50 attempts");
    assert!(woke, "the busy worker's timer did not fire while it spun");
}

/// A deadline beyond the wheel's range (years ahead) parks the fiber
/// until something else ends the wait: it counts as a pending timer, and
/// cancellation ends it.
#[test]
fn a_deadline_years_ahead_parks_until_cancelled() {
    let rt = fiber::Runtime::builder().workers(2).max_workers(2).build().unwrap();
    let (result, pending) = rt.block_on(|| {
        let far = Instant::now() + Duration::from_secs(10 * 365 * 24 * 3600);
        let started = Arc::new(AtomicBool::new(false));
        let s = started.clone();
        let h = fiber::spawn(move || {
            s.store(true, Ordering::Release);
            fiber::sleep_until(far)
        });
        while !started.load(Ordering::Acquire) {
            let _ = fiber::yield_now();
        }
        // It arms its timer right after (a generous cap only bounds the wait).
        let cap = Instant::now() + Duration::from_secs(10);
        let mut pending = 0;
        while pending == 0 && Instant::now() < cap {
            let _ = fiber::yield_now();
            pending = fiber::stats().runtime.timers_pending;
        }
        h.cancel();
        (h.join(), pending)
    });
    assert!(pending >= 1, "the far sleeper's timer is pending");
    assert!(result.is_err(), "the far sleep ended by cancellation: {result:?}");
}

/// Many sleepers with deadlines spread over several wheel levels wake in
/// deadline order at the wheel's resolution, never early.
#[test]
fn sleepers_across_wheel_levels_wake_never_early() {
    let rt = fiber::Runtime::builder().workers(2).max_workers(2).build().unwrap();
    let early = rt.block_on(|| {
        let handles: Vec<_> = [1u64, 2, 63, 64, 65, 130, 300]
            .iter()
            .flat_map(|&ms| (0..20).map(move |_| ms))
            .map(|ms| {
                fiber::spawn(move || {
                    let d = Duration::from_millis(ms);
                    let start = Instant::now();
                    fiber::sleep(d).unwrap();
                    start.elapsed() < d
                })
            })
            .collect();
        handles
            .into_iter()
            .filter(|_| true)
            .map(|h| h.join().unwrap() as usize)
            .sum::<usize>()
    });
    assert_eq!(early, 0, "sleepers woke before their deadline");
}

/// `timers_pending` counts the armed timers of every wheel, and drops back
/// once they fired.
#[test]
fn timers_pending_counts_armed_timers_and_drops_once_they_fire() {
    let rt = fiber::Runtime::builder().workers(2).max_workers(2).build().unwrap();
    let (during, after) = rt.block_on(|| {
        let start = Instant::now();
        let handles: Vec<_> = (0..1000)
            .map(|_| fiber::spawn(|| fiber::sleep(Duration::from_secs(2)).unwrap()))
            .collect();
        // Every sleeper arms its timer when it first runs (a generous cap,
        // well before the first deadline, only bounds the wait).
        let mut during = 0;
        while during < 1000 && start.elapsed() < Duration::from_millis(1500) {
            let _ = fiber::yield_now();
            during = fiber::stats().runtime.timers_pending;
        }
        for h in handles {
            h.join().unwrap();
        }
        (during, fiber::stats().runtime.timers_pending)
    });
    assert!(during >= 1000, "{during} timers pending while 1,000 fibers sleep");
    assert_eq!(after, 0, "timers left after every sleeper woke");
}
