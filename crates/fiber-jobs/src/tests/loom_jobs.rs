//! Loom models: threads drive the real `JobCore` (joins wait through
//! fiber-core's plain-thread park path).

use crate::job::{CancelReason, Failure, JobCore, JobState};
use loom::thread;
use std::sync::Arc;

/// Cancel racing completion: the job ends in exactly one terminal state,
/// COMPLETED if the body finished first, CANCELLED if the cancel did.
/// Deciding the final state outside the job lock lets a cancel land after
/// COMPLETED was chosen (an illegal COMPLETED -> CANCELLING edge panics).
#[test]
fn loom_cancel_racing_complete() {
    loom::model(|| {
        let job = JobCore::new(None, false, false);
        let canceller = {
            let job = job.clone();
            thread::spawn(move || job.cancel(CancelReason::Cancelled))
        };
        job.body_done();
        canceller.join().unwrap();
        let state = job.state();
        assert!(matches!(state, JobState::Completed | JobState::Cancelled), "{state:?}");
        if state == JobState::Cancelled {
            assert_eq!(job.reason(), Some(CancelReason::Cancelled));
        }
    });
}

/// A child's failure racing an external cancel of the parent: the parent
/// ends FAILED whatever the order (failure dominates). Choosing CANCELLED
/// whenever the parent was cancelling breaks it.
#[test]
fn loom_child_failure_racing_external_cancel() {
    loom::model(|| {
        let parent = JobCore::new(None, false, false);
        let child = JobCore::new(Some(parent.clone()), false, true);
        let canceller = {
            let parent = parent.clone();
            thread::spawn(move || parent.cancel(CancelReason::Cancelled))
        };
        let failer = thread::spawn(move || {
            child.fail_contained(
                Failure::Panic(Arc::new(crate::sync::Mutex::new(None))),
                CancelReason::ChildFailed,
            );
            child.body_done();
        });
        canceller.join().unwrap();
        failer.join().unwrap();
        parent.body_done();
        assert_eq!(parent.state(), JobState::Failed, "failure dominates cancellation");
    });
}

/// A failed child cancels its non-supervisor parent before it reads as
/// ended (Kotlin's order): a thread that sees the child terminal sees the
/// parent no longer ACTIVE. Handing the failure up after the child's final
/// state is stored (the order before) lets the observer read the child
/// FAILED and the parent ACTIVE.
#[test]
fn loom_failed_child_cancels_its_parent_before_it_ends() {
    loom::model(|| {
        let parent = JobCore::new(None, false, false);
        let child = JobCore::new(Some(parent.clone()), false, true);
        let observer = {
            let (parent, child) = (parent.clone(), child.clone());
            thread::spawn(move || {
                if child.state().is_terminal() {
                    assert_eq!(child.state(), JobState::Failed);
                    assert_ne!(
                        parent.state(),
                        JobState::Active,
                        "the child ended before its parent was told"
                    );
                }
            })
        };
        child.fail_contained(
            Failure::Panic(Arc::new(crate::sync::Mutex::new(None))),
            CancelReason::ChildFailed,
        );
        child.body_done();
        observer.join().unwrap();
        parent.body_done();
        assert_eq!(parent.state(), JobState::Failed);
    });
}

/// Join registration racing finalize: the joiner always wakes (no lost
/// wake). Checking "terminal" outside the lock that finalize holds while it
/// takes the waiters loses the wake (loom reports the joiner stuck).
#[test]
fn loom_join_registration_racing_finalize() {
    loom::model(|| {
        let job = JobCore::new(None, false, false);
        let joiner = {
            let job = job.clone();
            thread::spawn(move || job.join())
        };
        job.body_done();
        assert_eq!(joiner.join().unwrap(), Some(JobState::Completed));
    });
}

/// A completion handler added while the job ends runs exactly once, with
/// the final state: either the finalize takes it, or the registration
/// sees the job ended and runs it itself. Reading "ended" outside the lock
/// that the finalize holds while it takes the handlers loses it (loom finds
/// the handler never run), and running it on the registering side as well
/// as keeping it runs it twice.
#[test]
fn loom_completion_handler_racing_finalize() {
    use loom::sync::atomic::{AtomicUsize, Ordering};
    loom::model(|| {
        let job = JobCore::new(None, false, false);
        let ran = Arc::new(AtomicUsize::new(0));
        let registrar = {
            let job = job.clone();
            let ran = ran.clone();
            thread::spawn(move || {
                job.invoke_on_completion(Box::new(move |state| {
                    assert_eq!(state, JobState::Completed);
                    // Relaxed: the count is read after both threads are
                    // joined (the join orders it).
                    ran.fetch_add(1, Ordering::Relaxed);
                }))
            })
        };
        job.body_done();
        registrar.join().unwrap();
        assert_eq!(ran.load(Ordering::Relaxed), 1, "the handler runs exactly once");
    });
}

/// A standalone job (`Job::new`) cancelled while its last child ends: it
/// ends CANCELLED, whichever comes first, with nothing calling `complete`.
/// The cancel is its body's end: setting that end without finalizing when
/// no child is left (the child ended first) leaves it ACTIVE-less and
/// unended for ever (loom reports the job not terminal).
#[test]
fn loom_standalone_job_cancel_racing_last_child_end() {
    loom::model(|| {
        let job = JobCore::standalone(None, false);
        let child = JobCore::new(Some(job.clone()), false, true);
        let ender = {
            let child = child.clone();
            thread::spawn(move || child.body_done())
        };
        job.cancel(CancelReason::Cancelled);
        ender.join().unwrap();
        assert_eq!(
            job.state(),
            JobState::Cancelled,
            "the job ends once cancelled and childless"
        );
        assert!(!job.complete(), "an ended job is not completed again");
    });
}

/// `complete` racing a cancel of a standalone job with no children: it
/// ends exactly once, COMPLETED if `complete` came first, CANCELLED if the
/// cancel did, and `complete` says which.
#[test]
fn loom_standalone_job_complete_racing_cancel() {
    loom::model(|| {
        let job = JobCore::standalone(None, false);
        let canceller = {
            let job = job.clone();
            thread::spawn(move || job.cancel(CancelReason::Cancelled))
        };
        let completed = job.complete();
        canceller.join().unwrap();
        let state = job.state();
        if completed {
            assert_eq!(state, JobState::Completed);
        } else {
            assert_eq!(state, JobState::Cancelled);
        }
    });
}

/// The scope owner's wait for its children racing the last child's end:
/// the owner always wakes. The last child wakes only the record kept for
/// the children's waiter (not the job's joiners); checking the active
/// count outside the lock, or not waking that record, leaves the owner
/// parked (loom reports the deadlock).
#[test]
fn loom_children_wait_racing_last_child_end() {
    loom::model(|| {
        let parent = JobCore::new(None, false, false);
        let child = JobCore::new(Some(parent.clone()), false, false);
        let ender = {
            let child = child.clone();
            thread::spawn(move || child.body_done())
        };
        parent.join_children();
        ender.join().unwrap();
        assert_eq!(child.state(), JobState::Completed);
    });
}

/// The real job cancel path (`JobCore::cancel`: state change under the job
/// lock, then `interrupt` of every fiber in the job) racing a fiber of the
/// job that parks through fiber-core's production handshake
/// (`enter_parking`, reading the job's state): the cancel is never lost. If
/// the fiber parked, the cancel claimed it exactly once. Removing the
/// SeqCst fence from either half (`enter_parking` or `wait_to_interrupt` in
/// fiber-core's `wait.rs`) lets both sides miss: a parked fiber that is
/// never woken.
#[test]
fn loom_job_cancel_reaches_a_parking_fiber() {
    loom::model(|| {
        let job = JobCore::new(None, false, false);
        let fiber = fiber_core::FiberRef::running(1);
        job.add_model_fiber(fiber.clone());
        let canceller = {
            let job = job.clone();
            thread::spawn(move || job.cancel(CancelReason::Cancelled))
        };
        let parked = fiber.park_unless(|| job.is_cancelled());
        canceller.join().unwrap();
        if parked {
            assert_eq!(fiber.enqueues(), 1, "the cancel of a parked fiber was lost");
        } else {
            assert_eq!(fiber.enqueues(), 0);
        }
    });
}

/// A fiber's root job ends while `Job::cancel` races it: what
/// `end_as_root` (`fiber_finished`) reports (and the fiber's `JoinHandle` then says) is the
/// job's final state. Reporting the reading taken before `body_done` (the
/// fiber's own "was I cancelled") lets the handle say completed while the
/// job ends CANCELLED.
#[test]
fn loom_root_job_end_is_what_the_handle_reports() {
    loom::model(|| {
        let job = JobCore::new(None, false, false);
        let canceller = {
            let job = job.clone();
            thread::spawn(move || job.cancel(CancelReason::Cancelled))
        };
        let reported = job.end_as_root(false, false);
        canceller.join().unwrap();
        assert_eq!(
            reported,
            Some(job.state() == JobState::Cancelled),
            "the handle would report another outcome than the job's"
        );
    });
}

/// Two cancels of one job, each from its own thread: whichever returns
/// sees the job's child and grandchild cancelling (Go's `context`: once
/// `cancel` returns, every derived context is done). A second canceller
/// that finds the job CANCELLING and returns at once (before the first
/// one's walk reached the children) fails it.
#[test]
fn loom_second_cancel_returns_only_once_the_subtree_is_cancelled() {
    loom::model(|| {
        let parent = JobCore::new(None, false, false);
        let child = JobCore::new(Some(parent.clone()), false, true);
        let grandchild = JobCore::new(Some(child.clone()), false, true);
        let spawn_canceller = || {
            let (parent, child, grandchild) = (parent.clone(), child.clone(), grandchild.clone());
            thread::spawn(move || {
                parent.cancel(CancelReason::Cancelled);
                assert_ne!(
                    child.state(),
                    JobState::Active,
                    "the child after a cancel of its parent returned"
                );
                assert_ne!(grandchild.state(), JobState::Active, "the grandchild after the same");
            })
        };
        let (a, b) = (spawn_canceller(), spawn_canceller());
        a.join().unwrap();
        b.join().unwrap();
    });
}

/// Two cancels of a job with no child, whose fiber is parked: whichever
/// cancel returns, the fiber has been claimed by a waker (and is
/// enqueued once in the end). Marking the
/// job's walk finished before its fibers are interrupted (at the state
/// change) lets the second canceller return while the first has not
/// interrupted yet: the fiber still parked.
#[test]
fn loom_second_cancel_of_a_leaf_returns_only_once_its_fiber_is_woken() {
    loom::model(|| {
        let job = JobCore::new(None, false, false);
        let fiber = fiber_core::FiberRef::running(1);
        job.add_model_fiber(fiber.clone());
        assert!(fiber.park_unless(|| false), "parks: nothing cancelled yet");
        let spawn_canceller = || {
            let (job, fiber) = (job.clone(), fiber.clone());
            thread::spawn(move || {
                job.cancel(CancelReason::Cancelled);
                // Claimed (a waker moved it on), if not enqueued yet.
                assert!(
                    !fiber.is_parked(),
                    "the fiber still parked after a cancel of its job returned"
                );
            })
        };
        let (a, b) = (spawn_canceller(), spawn_canceller());
        a.join().unwrap();
        b.join().unwrap();
        assert_eq!(fiber.enqueues(), 1, "woken exactly once");
    });
}

/// A child attached to a completed standalone job (`Job::spawn` after
/// `complete()`, which the rustdoc allows) racing the end of its last
/// other child: the job never ends while a child it accepted as active
/// runs. A child either attaches before the job ends (the job then waits
/// for it) or finds it ended (and starts cancelled). Deciding to finalize
/// under the job lock, releasing it and finalizing under a second lock
/// let the attach slip in between: the job ended COMPLETED with an active
/// child, whose failure would then be lost.
#[test]
fn loom_late_attach_racing_a_completed_standalone_jobs_last_child_end() {
    loom::model(|| {
        let job = JobCore::standalone(None, false);
        let first = JobCore::new(Some(job.clone()), false, true);
        assert!(job.complete(), "an ACTIVE standalone job is completed");
        let ender = {
            let first = first.clone();
            thread::spawn(move || first.body_done())
        };
        let late = JobCore::new(Some(job.clone()), false, true);
        ender.join().unwrap();
        if job.state().is_terminal() {
            assert_ne!(
                late.state(),
                JobState::Active,
                "the job ended while a child it accepted as active runs"
            );
        }
        late.body_done();
        assert!(job.state().is_terminal(), "the job ends once its last child has");
    });
}
