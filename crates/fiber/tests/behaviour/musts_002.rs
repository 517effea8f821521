//! Requirements of the jobs design document (002) that no other test held,
//! or held only weakly; spec/musts.md traces each one. Each test names the
//! section it holds.

use crate::common::{ms, rt2, within};
use fiber::chan::bounded;
use fiber::{CancelReason, Job, JobState};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Park at a cancellable point that only a cancellation ends; `true` if
/// the fiber is cancelled when it returns.
fn park_until_cancelled() -> bool {
    let (_keep, rx) = bounded::<()>(0);
    let result = rx.recv_timeout(Duration::from_secs(3600));
    result.is_err() && fiber::is_cancelled()
}

fn panic_text(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_default()
}

fn on_rt2(f: impl FnOnce() + Send + 'static) {
    within(10, move || rt2().block_on(f));
}

/// 002 §Job Model "Parent ensures all children completed before marking
/// COMPLETE", §Launch "Exiting scope waits (join) all non-detached
/// children", §4.16 invariant 1 (terminal => no active children). The
/// scope's body has returned, its child is still parked: the job stays
/// ACTIVE and the scope does not return; once the child ends, the job
/// ends COMPLETED and a join of it sees the child's work done.
#[test]
fn s4_16_inv1_a_job_stays_non_terminal_while_a_child_is_active() {
    on_rt2(|| {
        let (job_tx, job_rx) = bounded::<Job>(1);
        let (release_tx, release_rx) = bounded::<()>(0);
        let child_done = Arc::new(AtomicBool::new(false));
        let scope_returned = Arc::new(AtomicBool::new(false));
        let owner = {
            let (child_done, scope_returned) = (child_done.clone(), scope_returned.clone());
            fiber::spawn(move || {
                fiber::scope(|s| {
                    s.spawn(move || {
                        release_rx.recv().unwrap();
                        child_done.store(true, Ordering::SeqCst);
                    });
                    job_tx.send(s.job()).unwrap();
                });
                scope_returned.store(true, Ordering::SeqCst);
            })
        };
        let job = job_rx.recv().unwrap();
        for _ in 0..20 {
            fiber::sleep(ms(1)).unwrap();
            assert_eq!(
                job.state(),
                JobState::Active,
                "a job with an active child is not terminal"
            );
            assert!(!job.is_completed());
            assert!(
                !scope_returned.load(Ordering::SeqCst),
                "the scope returned before its child"
            );
        }
        release_tx.send(()).unwrap();
        assert_eq!(job.join(), Ok(JobState::Completed));
        assert!(child_done.load(Ordering::SeqCst), "the job ended before its child");
        owner.join().unwrap();
        assert!(scope_returned.load(Ordering::SeqCst));
    });
}

/// 002 §Supervisor Jobs "Supervisor ignores child failures (child failure
/// does not cancel siblings)" and matrix row 3. The sibling is parked when
/// its neighbour fails; it is not cancelled and finishes its work.
#[test]
fn s_supervisor_a_failing_child_does_not_cancel_a_parked_sibling() {
    on_rt2(|| {
        let (ready_tx, ready_rx) = bounded::<()>(1);
        let (release_tx, release_rx) = bounded::<u32>(0);
        let (value, failed, job) = fiber::supervisor_scope(|s| {
            let sibling = s.spawn(move || {
                ready_tx.send(()).unwrap();
                let v = release_rx.recv().expect("the sibling was not cancelled");
                assert!(!fiber::is_cancelled());
                v
            });
            ready_rx.recv().unwrap();
            let bad = s.spawn(|| -> u32 { panic!("supervised failure") });
            let failed = bad.join().unwrap_err();
            assert!(!s.job().is_cancelled(), "a supervisor is not cancelled by its child");
            release_tx.send(5).unwrap();
            (sibling.join().unwrap(), failed, s.job())
        });
        assert_eq!(value, 5);
        assert!(failed.is_panic());
        assert_eq!(job.state(), JobState::Completed);
    });
}

/// 002 §Supervisor Jobs "Regular job: first failing child transitions
/// parent to CANCELLING", §4.11 parent completion rule (FAILED if any child
/// FAILED) and matrix row 2 ("Parent FAILED; siblings cancelled"), with the
/// sibling known to be parked when the failure lands.
#[test]
fn s4_18_row2_a_child_failure_fails_the_parent_and_cancels_a_parked_sibling() {
    on_rt2(|| {
        let job_slot: Arc<Mutex<Option<Job>>> = Arc::default();
        let saw_cancel = Arc::new(AtomicUsize::new(0));
        let (slot, saw) = (job_slot.clone(), saw_cancel.clone());
        let outcome = catch_unwind(AssertUnwindSafe(move || {
            fiber::scope(|s| {
                *slot.lock().unwrap() = Some(s.job());
                let (ready_tx, ready_rx) = bounded::<()>(1);
                s.spawn(move || {
                    ready_tx.send(()).unwrap();
                    if park_until_cancelled() {
                        saw.fetch_add(1, Ordering::SeqCst);
                    }
                });
                ready_rx.recv().unwrap();
                s.spawn(|| panic!("child failed"));
            })
        }));
        assert_eq!(panic_text(outcome.unwrap_err()), "child failed");
        assert_eq!(saw_cancel.load(Ordering::SeqCst), 1, "the parked sibling was cancelled");
        let job = job_slot.lock().unwrap().take().unwrap();
        assert_eq!(job.state(), JobState::Failed, "parent FAILED");
        assert_eq!(job.cancel_reason(), Some(CancelReason::ChildFailed));
    });
}

/// 002 matrix row 5 "Timeout fires first: Scope CANCELLED (ETIMEDOUT)": the
/// timeout's job itself ends CANCELLED with the timeout as its reason.
#[test]
fn s4_18_row5_a_timeout_that_fires_first_ends_its_job_cancelled_timed_out() {
    on_rt2(|| {
        let (job_tx, job_rx) = bounded::<Job>(1);
        let result = fiber::with_timeout(ms(20), move || {
            job_tx.send(Job::current()).unwrap();
            park_until_cancelled()
        });
        assert_eq!(result, Err(fiber::TimedOut));
        let job = job_rx.recv().unwrap();
        assert_eq!(job.state(), JobState::Cancelled);
        assert_eq!(job.cancel_reason(), Some(CancelReason::TimedOut));
    });
}

/// 002 §4.15 "After kc_cancel(job) returns true: all future suspension
/// points in that job must observe cancellation" (not only the first):
/// every later cancellable wait of the job's fiber returns at once with the
/// cancellation, again and again, and a child made afterwards never runs.
#[test]
fn s4_15_after_a_cancel_every_later_suspension_point_observes_it() {
    on_rt2(|| {
        let (job_tx, job_rx) = bounded::<Job>(1);
        let (parked_tx, parked_rx) = bounded::<()>(1);
        let worker = fiber::spawn(move || {
            fiber::scope(|s| {
                job_tx.send(s.job()).unwrap();
                parked_tx.send(()).unwrap();
                assert!(park_until_cancelled(), "the first wait sees the cancel");
                let ran = Arc::new(AtomicBool::new(false));
                for round in 0..3 {
                    assert!(fiber::sleep(Duration::from_secs(3600)).is_err(), "round {round}: sleep");
                    assert!(fiber::yield_now().is_err(), "round {round}: yield_now");
                    let (_keep, rx) = bounded::<u8>(0);
                    assert!(
                        rx.recv_timeout(Duration::from_secs(3600)).is_err(),
                        "round {round}: recv"
                    );
                    assert!(fiber::check_cancelled().is_err(), "round {round}: check_cancelled");
                    let ran2 = ran.clone();
                    let child = s.spawn(move || ran2.store(true, Ordering::SeqCst));
                    assert!(child.join().unwrap_err().is_cancelled(), "round {round}: child");
                }
                assert!(!ran.load(Ordering::SeqCst), "a child made after the cancel ran");
            });
        });
        let job = job_rx.recv().unwrap();
        parked_rx.recv().unwrap();
        job.cancel();
        assert!(job.is_cancelled());
        let _ = worker.join();
        assert_eq!(job.state(), JobState::Cancelled);
    });
}

/// 002 §4.17 "Self-cancel: job requests its own cancellation ... finalize
/// path sets CANCELLED (unless failure recorded)".
#[test]
fn s4_17_a_job_that_cancels_itself_ends_cancelled() {
    on_rt2(|| {
        // A scope whose body cancels its own job.
        let job = fiber::scope(|s| {
            s.job().cancel();
            assert!(fiber::check_cancelled().is_err(), "the body sees its own cancel");
            s.job()
        });
        // A scoped child that cancels its own job, then returns a value.
        let (tx, rx) = bounded::<Job>(1);
        let child = fiber::scope(|s| {
            s.spawn(move || {
                Job::current().cancel();
                tx.send(Job::current()).unwrap();
                7
            })
            .join()
        });
        let child_job = rx.recv().unwrap();
        assert_eq!(job.state(), JobState::Cancelled);
        assert_eq!(job.cancel_reason(), Some(CancelReason::Cancelled));
        assert!(
            child.unwrap_err().is_cancelled(),
            "cancelled before it finished: no value"
        );
        assert_eq!(child_job.state(), JobState::Cancelled);
    });
}

/// 002 §4.17 "Detached child: parent does not wait; ... its failure does
/// not affect parent" and matrix row 10. The scope returns while its
/// detached fiber is still parked; the fiber's later failure leaves the
/// scope's job COMPLETED.
#[test]
fn s4_17_a_detached_child_is_not_waited_for_and_its_failure_stays_its_own() {
    on_rt2(|| {
        let (release_tx, release_rx) = bounded::<()>(0);
        let (detached, job) = fiber::scope(|s| {
            let detached = fiber::spawn(move || {
                release_rx.recv().unwrap();
                panic!("detached failure");
            });
            (detached, s.job())
        });
        assert!(!detached.is_finished(), "the scope waited for a detached fiber");
        assert_eq!(job.state(), JobState::Completed);
        release_tx.send(()).unwrap();
        assert!(detached.join().unwrap_err().is_panic());
        assert_eq!(
            job.state(),
            JobState::Completed,
            "the detached failure reached the parent"
        );
    });
}

/// 002 §4.16 invariant 5, §4.17 "Parent cancelled after child failure in
/// flight: ... choose FAILED", matrix row 11: the final *state* (not only
/// the re-raised payload) is FAILED whichever of failure and cancel lands
/// first.
#[test]
fn s4_16_inv5_failure_racing_an_external_cancel_ends_failed() {
    on_rt2(|| {
        for round in 0..30u32 {
            let slot: Arc<Mutex<Option<Job>>> = Arc::default();
            let slot2 = slot.clone();
            let outcome = catch_unwind(AssertUnwindSafe(move || {
                fiber::scope(|s| {
                    *slot2.lock().unwrap() = Some(s.job());
                    let (go_tx, go_rx) = bounded::<()>(1);
                    s.spawn(move || {
                        go_tx.send(()).unwrap();
                        for _ in 0..(round % 3) {
                            let _ = fiber::yield_now();
                        }
                        panic!("failure");
                    });
                    let job = s.job();
                    s.spawn(move || {
                        let _ = go_rx.recv();
                        for _ in 0..(round % 2) {
                            let _ = fiber::yield_now();
                        }
                        job.cancel();
                    });
                })
            }));
            assert_eq!(panic_text(outcome.unwrap_err()), "failure", "round {round}");
            let job = slot.lock().unwrap().take().unwrap();
            assert_eq!(job.state(), JobState::Failed, "round {round}: failure dominates");
        }
    });
}

/// 002 §4.16 invariant 5 as the project reads it (spec/jobs.md section 2,
/// "Failure dominance keeps the ETIMEDOUT exception"): a block that timed
/// out and then fails ends FAILED, its panic re-raised, the reason still
/// `TimedOut`.
#[test]
fn s4_16_inv5_a_timed_out_block_that_then_fails_ends_failed() {
    on_rt2(|| {
        let (job_tx, job_rx) = bounded::<Job>(1);
        let outcome = catch_unwind(AssertUnwindSafe(move || {
            fiber::with_timeout(ms(10), move || {
                job_tx.send(Job::current()).unwrap();
                assert!(park_until_cancelled());
                panic!("failed after the timeout");
            })
        }));
        assert_eq!(panic_text(outcome.unwrap_err()), "failed after the timeout");
        let job = job_rx.recv().unwrap();
        assert_eq!(job.state(), JobState::Failed);
        assert_eq!(job.cancel_reason(), Some(CancelReason::TimedOut));
    });
}
