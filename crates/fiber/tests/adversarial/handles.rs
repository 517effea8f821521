//! Adversarial: handles used after what they point to is gone (a finished
//! fiber, a dropped runtime): unpark, cancel, join, dump and stats must be
//! no-ops or clear results, never a crash or a hang.

use fiber::chan;
use std::sync::mpsc;
use std::time::Duration;

use crate::common::{ms, within};

fn rt() -> fiber::Runtime {
    fiber::Runtime::builder()
        .workers(2)
        .shutdown_timeout(ms(300))
        .build()
        .unwrap()
}

#[test]
fn unpark_and_cancel_of_finished_fibers_and_of_a_dropped_runtime_are_no_ops() {
    within(20, || {
        let rt = rt();
        let (fh, canceller, job) = rt.block_on(|| {
            let h = fiber::spawn(|| (fiber::current(), fiber::Job::current()));
            let canceller = h.canceller();
            let (fh, job) = h.join().unwrap();
            fh.unpark(); // finished fiber: nothing to wake
            canceller.cancel();
            assert!(job.is_completed());
            // A frame reused by a new fiber must not get the stale unpark's
            // token or the stale cancel.
            let next = fiber::spawn(|| {
                fiber::park_timeout(ms(10));
                fiber::is_cancelled()
            });
            fh.unpark();
            canceller.cancel();
            assert!(!next.join().unwrap(), "a stale cancel reached a new fiber");
            (fh, canceller, job)
        });
        drop(rt);
        fh.unpark();
        canceller.cancel();
        job.cancel();
        assert!(job.is_completed());
        assert_eq!(job.join(), Ok(fiber::JobState::Completed));
    })
}

#[test]
fn a_job_of_a_parked_fiber_joined_from_a_thread_ends_when_the_runtime_is_dropped() {
    within(20, || {
        let rt = rt();
        let (tx, rx) = mpsc::channel();
        rt.spawn(move || {
            tx.send(fiber::Job::current()).unwrap();
            let _ = fiber::sleep(Duration::MAX);
        });
        let job = rx.recv().unwrap();
        assert!(job.is_active());
        let j = job.clone();
        let joiner = std::thread::spawn(move || j.join());
        std::thread::sleep(ms(10));
        drop(rt);
        let state = joiner.join().unwrap().expect("a plain thread is never cancelled");
        assert_eq!(state, fiber::JobState::Cancelled);
        assert_eq!(job.cancel_and_join(), Ok(fiber::JobState::Cancelled));
    })
}

#[test]
fn cancel_and_join_of_a_scope_job_from_a_plain_thread() {
    within(20, || {
        let rt = rt();
        let (tx, rx) = mpsc::channel();
        let h = rt.spawn(move || {
            fiber::scope(|s| {
                tx.send(s.job()).unwrap();
                for _ in 0..4 {
                    s.spawn(|| {
                        let _ = fiber::sleep(Duration::MAX);
                    });
                }
            });
            fiber::is_cancelled()
        });
        let job = rx.recv().unwrap();
        std::thread::sleep(ms(10));
        assert_eq!(job.cancel_and_join(), Ok(fiber::JobState::Cancelled));
        // Cancelling the scope's job does not cancel the fiber that owns
        // the scope (Kotlin: cancelling a child job leaves the parent).
        assert!(!h.join().unwrap(), "the owner was not cancelled");
    })
}

#[test]
fn dump_and_stats_race_with_spawns_and_shutdown() {
    within(30, || {
        let rt = rt();
        let handle = rt.handle();
        let rt = std::sync::Arc::new(std::sync::Mutex::new(Some(rt)));
        let r2 = rt.clone();
        let dumper = std::thread::spawn(move || {
            for _ in 0..50 {
                if let Some(rt) = r2.lock().unwrap().as_ref() {
                    let d = rt.dump();
                    let _ = format!("{d}");
                    let _ = rt.stats();
                }
                std::thread::sleep(ms(1));
            }
        });
        for _ in 0..20 {
            let _ = handle.try_spawn(|| {
                let (_tx, rx) = chan::bounded::<u8>(0);
                let _ = rx.recv_timeout(ms(5));
                let _ = format!("{}", fiber::dump());
            });
            std::thread::sleep(ms(1));
        }
        let rt = rt.lock().unwrap().take();
        drop(rt);
        dumper.join().unwrap();
    })
}
