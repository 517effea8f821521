//! A `with_timeout` deadline reaches every job below it, and what a job
//! reads and how it ends agree, however the timer's fiber is scheduled
//! (found by porting Go's context tests: TestDeadline's
//! "WithDeadline+otherContext+WithDeadline", TestWithCancelCanceledParent
//! and TestCauseRace).
//!
//! On one worker a body that runs past the deadline without a yield point
//! keeps the timer's fiber from running; on two it runs in time. Both must
//! give the same answer: the one spec/jobs.md gives ("a job past a
//! `with_timeout` deadline, its own or an ancestor's, is CANCELLING from
//! that instant"; CANCELLING ends CANCELLED or FAILED, never COMPLETED).

use crate::common::*;
use fiber::{CancelReason, Job, JobState, TimedOut};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn busy(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

fn rt_fixed(workers: usize) -> fiber::Runtime {
    fiber::Runtime::builder()
        .workers(workers)
        .max_workers(workers)
        .build()
        .unwrap()
}

/// An inner `with_timeout` with a later deadline, cut by the outer one
/// while its body spins: it reports the timeout (Go: the child context is
/// done with `DeadlineExceeded` at the parent's deadline), and its job,
/// read CANCELLING inside, ends CANCELLED with `TimedOut`.
fn inner_with_timeout_under_an_expired_outer_deadline(workers: usize) {
    within(60, move || {
        rt_fixed(workers).block_on(|| {
            let mut inner = None;
            let mut inner_job = None;
            let mut inside = None;
            let outer = fiber::with_timeout(ms(10), || {
                inner = Some(fiber::with_timeout(Duration::from_secs(10), || {
                    busy(ms(50));
                    inside = Some((Job::current().state(), Job::current().cancel_reason()));
                    inner_job = Some(Job::current());
                    5
                }));
            });
            assert_eq!(outer, Err(TimedOut));
            assert_eq!(inside, Some((JobState::Cancelling, Some(CancelReason::TimedOut))));
            let job = inner_job.unwrap();
            assert_eq!(
                (job.state(), job.cancel_reason()),
                (JobState::Cancelled, Some(CancelReason::TimedOut))
            );
            assert_eq!(inner, Some(Err(TimedOut)));
        })
    })
}

#[test]
fn inner_with_timeout_under_an_expired_outer_deadline_one_worker() {
    inner_with_timeout_under_an_expired_outer_deadline(1);
}

#[test]
fn inner_with_timeout_under_an_expired_outer_deadline_two_workers() {
    inner_with_timeout_under_an_expired_outer_deadline(2);
}

/// A scope opened after the deadline passed ends CANCELLED (`TimedOut`),
/// as it read inside; a child spawned there starts cancelled (Go: a child
/// of a done context is done at construction): its body never runs and
/// its join reports the timeout.
fn scope_and_child_under_an_expired_deadline(workers: usize) {
    within(60, move || {
        rt_fixed(workers).block_on(|| {
            let mut rec = None;
            let r = fiber::with_timeout(ms(5), || {
                busy(ms(30));
                let (inside, job) = fiber::scope(|s| ((s.job().state(), s.job().cancel_reason()), s.job()));
                let child = fiber::scope(|s| s.spawn(|| 1).join().map_err(|e| (e.is_cancelled(), e.is_timed_out())));
                rec = Some((inside, (job.state(), job.cancel_reason()), child));
            });
            assert_eq!(r, Err(TimedOut));
            let (inside, after, child) = rec.unwrap();
            assert_eq!(inside, (JobState::Cancelling, Some(CancelReason::TimedOut)));
            assert_eq!(after, (JobState::Cancelled, Some(CancelReason::TimedOut)));
            assert!(matches!(child, Err((true, true))), "child: {child:?}");
        })
    })
}

#[test]
fn scope_and_child_under_an_expired_deadline_one_worker() {
    scope_and_child_under_an_expired_deadline(1);
}

#[test]
fn scope_and_child_under_an_expired_deadline_two_workers() {
    scope_and_child_under_an_expired_deadline(2);
}

/// A scoped child that spins past its inherited deadline and then returns
/// a value ends CANCELLED: its join reports the timeout, on one worker as
/// on two.
fn a_child_that_outlives_the_deadline_reports_it(workers: usize) {
    within(60, move || {
        rt_fixed(workers).block_on(|| {
            let mut joined = None;
            let r = fiber::with_timeout(ms(10), || {
                fiber::scope(|s| {
                    let h = s.spawn(|| {
                        busy(ms(40));
                        7
                    });
                    joined = Some(h.join().map_err(|e| e.is_timed_out()));
                })
            });
            assert_eq!(r, Err(TimedOut));
            assert_eq!(joined, Some(Err(true)));
        })
    })
}

#[test]
fn a_child_that_outlives_the_deadline_reports_it_one_worker() {
    a_child_that_outlives_the_deadline_reports_it(1);
}

#[test]
fn a_child_that_outlives_the_deadline_reports_it_two_workers() {
    a_child_that_outlives_the_deadline_reports_it(2);
}

/// Go's TestCauseRace: a plain cancel of a job with no deadline is never
/// reported as a timeout, not even for a moment while the cancel lands
/// (the reason and the state were read under two locks).
#[test]
fn cancel_reason_never_reports_timed_out_for_a_plain_cancel() {
    let bad = within(120, || {
        rt_fixed(1).block_on(|| {
            let mut bad = 0;
            for _ in 0..2000 {
                fiber::scope(|s| {
                    let (tx, rx) = fiber::chan::bounded(1);
                    let h = s.spawn(move || {
                        tx.send(Job::current()).unwrap();
                        // Until cancelled.
                        let _ = fiber::sleep(Duration::from_secs(30));
                    });
                    let job = rx.recv().unwrap();
                    let canceller = job.clone();
                    let t = std::thread::spawn(move || canceller.cancel());
                    loop {
                        match job.cancel_reason() {
                            Some(CancelReason::TimedOut) => {
                                bad += 1;
                                break;
                            }
                            Some(_) => break,
                            None => std::hint::spin_loop(),
                        }
                    }
                    t.join().unwrap();
                    let _ = h.join();
                });
            }
            bad
        })
    });
    assert_eq!(
        bad, 0,
        "cancel_reason() said TimedOut for a plain Job::cancel in {bad} of 2,000 rounds"
    );
}

/// A body that returns well before its deadline gives `Ok`, and its job
/// ends COMPLETED, even when the deadline passes while `with_timeout`
/// waits for its watchdog fiber (a detached spinner took the only worker
/// first): the outcome is decided when the body returns.
#[test]
fn with_timeout_ok_means_its_job_did_not_time_out() {
    within(30, || {
        rt1().block_on(|| {
            let spun = Arc::new(AtomicBool::new(false));
            let s = spun.clone();
            let result = fiber::with_timeout(ms(30), move || {
                // Fills the runnext slot ahead of the watchdog: it runs
                // when this fiber parks on the watchdog's join, and holds
                // the only worker past the deadline.
                fiber::spawn(move || {
                    let t = Instant::now();
                    while t.elapsed() < ms(80) {
                        std::hint::spin_loop();
                    }
                    s.store(true, Ordering::SeqCst);
                });
                fiber::Job::current()
            });
            assert!(spun.load(Ordering::SeqCst), "the spinner did not run in the window");
            let job = result.expect("f returned well before its deadline: Ok");
            assert!(
                !job.is_cancelled() && job.cancel_reason().is_none(),
                "with_timeout returned Ok, but its job ended {:?} with reason {:?}",
                job.state(),
                job.cancel_reason()
            );
        })
    });
}
