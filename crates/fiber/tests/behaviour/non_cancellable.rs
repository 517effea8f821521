//! `fiber::non_cancellable` (Kotlin's `withContext(NonCancellable)`): the
//! clean-up code of a cancelled fiber can still wait; the cancellation is
//! not lost; a `with_timeout` or a `scope` opened inside still works; and
//! a runtime's shutdown still ends the section's waits.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{ms, on_runtime, within};

/// A cancelled scoped child sleeps, sends and joins in its clean-up.
#[test]
fn a_cancelled_fiber_can_wait_in_its_clean_up() {
    on_runtime(|| {
        let (tx, rx) = fiber::chan::bounded(0);
        let (started_tx, started_rx) = fiber::chan::bounded(1);
        let outcome = fiber::scope(|s| {
            let child = s.spawn(move || {
                started_tx.send(()).unwrap();
                assert!(fiber::sleep(Duration::from_secs(3600)).is_err(), "cancelled");
                fiber::non_cancellable(|| {
                    assert!(!fiber::is_cancelled());
                    fiber::sleep(ms(20)).unwrap();
                    fiber::yield_now().unwrap();
                    let helper = fiber::spawn(|| 7);
                    let v = helper.join().unwrap();
                    tx.send(v).unwrap();
                });
                assert!(fiber::is_cancelled(), "seen again after the section");
                assert!(fiber::sleep(ms(1)).is_err());
            });
            started_rx.recv().unwrap();
            child.cancel();
            assert_eq!(rx.recv().unwrap(), 7);
            child.join()
        });
        assert!(outcome.unwrap_err().is_cancelled());
    });
}

/// A cancel that arrives while the fiber sleeps in a section does not cut
/// the sleep short.
#[test]
fn a_cancel_during_the_section_does_not_end_its_sleep() {
    on_runtime(|| {
        let h = fiber::spawn(|| {
            fiber::non_cancellable(|| {
                let start = Instant::now();
                let r = fiber::sleep(ms(150));
                (r.is_ok(), start.elapsed())
            })
        });
        fiber::sleep(ms(20)).unwrap();
        h.cancel();
        // The value is dropped (the fiber was cancelled), but the join
        // waits for the whole sleep.
        let start = Instant::now();
        assert!(h.join().unwrap_err().is_cancelled());
        assert!(
            start.elapsed() >= ms(100),
            "the sleep ended early: {:?}",
            start.elapsed()
        );
    });
}

/// Sections nest: the inner one ending does not end the outer one; a
/// panic inside one ends it.
#[test]
fn sections_nest_and_end_on_unwind() {
    on_runtime(|| {
        let h = fiber::spawn(|| {
            while fiber::sleep(ms(1)).is_ok() {}
            fiber::non_cancellable(|| {
                fiber::non_cancellable(|| assert!(!fiber::is_cancelled()));
                assert!(!fiber::is_cancelled(), "still inside the outer section");
                let r = std::panic::catch_unwind(|| fiber::non_cancellable(|| panic!("inside")));
                assert!(r.is_err());
                assert!(
                    !fiber::is_cancelled(),
                    "the panicking section ended, the outer one did not"
                );
            });
            fiber::is_cancelled()
        });
        fiber::sleep(ms(10)).unwrap();
        h.cancel();
        assert!(h.join().unwrap_err().is_cancelled());
    });
}

/// Kotlin: `withTimeout` inside `NonCancellable` still times out, and a
/// scope opened there is not cancelled with the outer job.
#[test]
fn with_timeout_and_scope_inside_a_section_still_work() {
    on_runtime(|| {
        let ran = Arc::new(AtomicUsize::new(0));
        let ran2 = ran.clone();
        let h = fiber::spawn(move || {
            while fiber::sleep(ms(1)).is_ok() {}
            fiber::non_cancellable(|| {
                let start = Instant::now();
                let r = fiber::with_timeout(ms(30), || fiber::sleep(Duration::from_secs(3600)));
                assert!(r.is_err(), "timed out");
                assert!(start.elapsed() < Duration::from_secs(5));
                let sum = fiber::scope(|s| {
                    let a = s.spawn(|| {
                        fiber::sleep(ms(5)).unwrap();
                        1
                    });
                    let b = s.spawn(|| 2);
                    a.join().unwrap() + b.join().unwrap()
                });
                ran2.fetch_add(sum, Ordering::SeqCst);
            });
        });
        fiber::sleep(ms(10)).unwrap();
        h.cancel();
        assert!(h.join().unwrap_err().is_cancelled());
        assert_eq!(ran.load(Ordering::SeqCst), 3);
    });
}

/// A runtime's shutdown still ends a section's waits (after its grace
/// time), and the fiber's destructors run.
#[test]
fn shutdown_ends_a_sections_wait() {
    static DROPPED: AtomicUsize = AtomicUsize::new(0);
    struct Guard;
    impl Drop for Guard {
        fn drop(&mut self) {
            DROPPED.fetch_add(1, Ordering::SeqCst);
        }
    }
    let elapsed = within(60, || {
        let rt = fiber::Runtime::builder()
            .workers(1)
            .max_workers(1)
            .shutdown_timeout(ms(100))
            .build()
            .unwrap();
        rt.spawn(|| {
            let _g = Guard;
            fiber::non_cancellable(|| {
                let _ = fiber::sleep(Duration::from_secs(3600));
            });
        });
        std::thread::sleep(ms(20));
        let start = Instant::now();
        drop(rt);
        start.elapsed()
    });
    assert!(elapsed < Duration::from_secs(10), "shutdown took {elapsed:?}");
    assert_eq!(DROPPED.load(Ordering::SeqCst), 1);
}

/// Shutdown gives a section's clean-up its grace time: a fiber cancelled by
/// shutdown that sleeps 100 ms and then reports in `non_cancellable` gets
/// to report. Shutdown stopped waiting 50 ms after every fiber was parked,
/// counting a sleeping fiber as one that only another fiber could wake,
/// so such clean-up was unwound (the report never came) whatever the
/// grace time.
#[test]
fn shutdown_waits_for_a_sections_timed_clean_up() {
    let (got, elapsed) = within(60, || {
        let rt = crate::common::rt_fixed_grace(2, Duration::from_secs(5));
        let (tx, rx) = std::sync::mpsc::channel();
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        rt.spawn(move || {
            started_tx.send(()).unwrap();
            assert!(
                fiber::sleep(Duration::from_secs(3600)).is_err(),
                "cancelled by shutdown"
            );
            fiber::non_cancellable(|| {
                fiber::sleep(ms(100)).unwrap();
                tx.send("stopped").unwrap();
            });
        });
        started_rx.recv().unwrap();
        crate::common::wait_parked(&rt, 1);
        let start = Instant::now();
        drop(rt);
        (rx.try_recv(), start.elapsed())
    });
    assert_eq!(
        got,
        Ok("stopped"),
        "the clean-up was cut short (shutdown took {elapsed:?})"
    );
    assert!(
        elapsed >= ms(100) && elapsed < Duration::from_secs(5),
        "shutdown took {elapsed:?}"
    );
}

/// A fiber parked inside a section on a receive that nothing ends holds
/// shutdown for the grace time at most, then is unwound. A plain thread
/// may hold the sender (here it does), so the runtime cannot tell this wait
/// from clean-up that waits for a thread's last message: it keeps the
/// grace time for it, as for a lock (`reviews/review4.rs::
/// non_cancellable_recv_timeout_max_keeps_the_grace_time_like_a_long_timeout`).
#[test]
fn shutdown_waits_at_most_the_grace_time_for_a_stuck_section() {
    let (elapsed, after) = within(60, || {
        let rt = crate::common::rt_fixed_grace(2, Duration::from_secs(1));
        let (tx, rx) = fiber::chan::bounded::<()>(0);
        let after = Arc::new(AtomicBool::new(false));
        let a = after.clone();
        rt.spawn(move || {
            fiber::non_cancellable(|| {
                let _ = rx.recv();
            });
            a.store(true, Ordering::SeqCst);
        });
        crate::common::wait_parked(&rt, 1);
        let start = Instant::now();
        drop(rt);
        drop(tx);
        (start.elapsed(), after.load(Ordering::SeqCst))
    });
    assert!(
        elapsed >= ms(900) && elapsed < Duration::from_secs(10),
        "shutdown took {elapsed:?}"
    );
    assert!(!after, "the stuck fiber was unwound at teardown, not resumed");
}

/// On a plain thread it just runs the closure.
#[test]
fn on_a_plain_thread_it_runs_the_closure() {
    assert_eq!(fiber::non_cancellable(|| 5), 5);
}

/// A cancelled fiber whose job did not exist yet makes it inside its
/// clean-up (`Job::current()`, or a library call that opens a scope): the
/// job is born cancelled, and the section still holds it off, as it holds
/// off the fiber's own cancellation (Kotlin's `NonCancellable`). After the
/// section the fiber is cancelled again. Nested sections entered before the
/// job existed hold it off too.
#[test]
fn a_job_made_inside_the_section_is_held_off() {
    on_runtime(|| {
        let (ready_tx, ready_rx) = fiber::chan::bounded(0);
        let (out_tx, out_rx) = fiber::chan::bounded(1);
        let h = fiber::spawn(move || {
            ready_tx.send(()).unwrap();
            while fiber::sleep(Duration::MAX).is_ok() {}
            let inside = fiber::non_cancellable(|| {
                // Made in a nested section: the outer one holds it off too
                // once the nested one has ended.
                let job = fiber::non_cancellable(fiber::Job::current);
                let nested = fiber::non_cancellable(|| fiber::Job::try_current().is_some() && !fiber::is_cancelled());
                let scoped = fiber::scope(|s| s.spawn(|| fiber::sleep(ms(5)).is_ok()).join());
                (
                    job.is_cancelled(),
                    nested,
                    fiber::is_cancelled(),
                    fiber::sleep(ms(5)).is_ok(),
                    fiber::yield_now().is_ok(),
                    matches!(scoped, Ok(true)),
                )
            });
            let after = (fiber::is_cancelled(), fiber::sleep(ms(1)).is_err());
            out_tx.send((inside, after)).unwrap();
        });
        ready_rx.recv().unwrap();
        h.cancel();
        assert!(h.join().unwrap_err().is_cancelled());
        let (inside, after) = out_rx.recv().unwrap();
        // The job is cancelled (the fiber is), but the section does not
        // see it: waits complete, a scope opened there runs its child.
        assert_eq!(inside, (true, true, false, true, true, true));
        assert_eq!(after, (true, true), "the cancellation is seen again after the section");
    });
}

/// The same when the cancel arrives while the section that made the job
/// sleeps: the sleep runs its whole length.
#[test]
fn a_cancel_of_a_job_made_inside_the_section_does_not_end_its_sleep() {
    on_runtime(|| {
        let (ready_tx, ready_rx) = fiber::chan::bounded(0);
        let (out_tx, out_rx) = fiber::chan::bounded(1);
        let h = fiber::spawn(move || {
            let slept = fiber::non_cancellable(|| {
                let _job = fiber::Job::current();
                ready_tx.send(()).unwrap();
                let start = Instant::now();
                fiber::sleep(ms(100)).is_ok() && start.elapsed() >= ms(100)
            });
            out_tx.send(slept).unwrap();
        });
        ready_rx.recv().unwrap();
        h.cancel();
        assert!(h.join().unwrap_err().is_cancelled());
        assert!(
            out_rx.recv().unwrap(),
            "the section's sleep was cut short by the cancel"
        );
    });
}
