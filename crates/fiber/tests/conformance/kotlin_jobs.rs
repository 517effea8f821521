//! Conformance: ports of kotlinx.coroutines' job and structured-concurrency
//! tests (`kotlinx-coroutines-core/common/test`: JobTest, JobStatesTest,
//! CancelledParentAttachTest, ScopedBuildersCancelledStartTest,
//! SupervisorTest, CoroutineScopeTest, WithTimeoutTest,
//! WithTimeoutOrNullTest, ParentCancellationTest, NonCancellableTest,
//! AwaitTest, CoroutinesTest; `jvm/test/exceptions`: JobExceptionHandlingTest,
//! JobNestedExceptionsTest, JobBasicCancellationTest) onto fiber's jobs API.
//!
//! The mapping: `launch`/`async` in a scope is `s.spawn`, `coroutineScope`
//! is `fiber::scope` (or `try_scope`), `supervisorScope` is
//! `fiber::supervisor_scope`, `withTimeout` / `withTimeoutOrNull` is
//! `fiber::with_timeout` (its `Err(TimedOut)` plays the part of both the
//! exception and the `null`), `withContext(NonCancellable)` is
//! `fiber::non_cancellable`, an exception is a panic (`panic_any` of a marker
//! type, so the test can check *which* one arrived), a
//! `CancellationException` seen by the body is an `Err(Cancelled)` from a
//! cancellation point. `GlobalScope.launch` is `fiber::spawn`.
//!
//! This file does not repeat what `conformance/jobs.rs`, `behaviour/cancellation.rs`,
//! `behaviour/non_cancellable.rs`, `adversarial_*` and `fiber-jobs/tests` already hold;
//! each test names its upstream test. Every test runs in fibers on a
//! one-worker and on a two-worker runtime (`one_worker` / `two_workers`).

use fiber::{CancelReason, Job, JobState, TimedOut};
use std::any::Any;
use std::panic::{catch_unwind, panic_any, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::ms;

/// Run `body` as the root fiber of a fixed runtime of `workers` workers,
/// under a 30 s hang guard.
fn run_on(workers: usize, body: fn()) {
    crate::common::within(30, move || {
        let rt = if workers == 1 {
            crate::common::rt1()
        } else {
            crate::common::rt2()
        };
        rt.block_on(body)
    })
}

/// One upstream test, run on one worker and on two.
macro_rules! kotlin_test {
    ($(#[$m:meta])* fn $name:ident() $body:block) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            fn body() $body
            $(#[$m])*
            #[test]
            fn one_worker() {
                run_on(1, body)
            }
            $(#[$m])*
            #[test]
            fn two_workers() {
                run_on(2, body)
            }
        }
    };
}

// Marker payloads (Kotlin's TestException1, TestException2, IOException,
// ArithmeticException): the tests check which one a scope re-raises.
#[derive(Debug)]
struct E1;
#[derive(Debug)]
struct E2;
#[derive(Debug)]
struct Io;
#[derive(Debug)]
struct Arith;

/// What a panic payload is, for assertion messages.
fn describe(p: &(dyn Any + Send)) -> String {
    if p.is::<E1>() {
        "E1".into()
    } else if p.is::<E2>() {
        "E2".into()
    } else if p.is::<Io>() {
        "Io".into()
    } else if p.is::<Arith>() {
        "Arith".into()
    } else if let Some(s) = p.downcast_ref::<String>() {
        format!("String({s:?})")
    } else if let Some(s) = p.downcast_ref::<&str>() {
        format!("str({s:?})")
    } else {
        "an unknown payload".into()
    }
}

/// The payload `f` panics with; fails the test if it returns.
fn panic_of<T>(what: &str, f: impl FnOnce() -> T) -> Box<dyn Any + Send> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(_) => panic!("{what}: expected a panic, it returned"),
        Err(p) => p,
    }
}

/// Assert that `p` is the marker `T`.
fn assert_is<T: 'static>(p: &(dyn Any + Send), what: &str) {
    assert!(
        p.is::<T>(),
        "{what}: expected {}, got {}",
        std::any::type_name::<T>(),
        describe(p)
    );
}

/// Park until cancelled (only a cancellation ends this sleep).
fn park_until_cancelled() {
    assert!(
        fiber::sleep(Duration::from_secs(3600)).is_err(),
        "only a cancellation ends this sleep"
    );
}

/// Yield until `cond` holds (10 s at most). A cancelled fiber's yield still
/// yields, so this works in a cancelled body too.
fn wait_until(what: &str, cond: impl Fn() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < Duration::from_secs(10), "never happened: {what}");
        let _ = fiber::yield_now();
    }
}

/// Ignore cancellation until `flag` is set (Kotlin's ATOMIC start plus a
/// `withContext(NonCancellable)` clean-up: a child that holds its job in
/// CANCELLING while the test looks at it).
fn hold_until(flag: &AtomicBool) {
    fiber::non_cancellable(|| {
        while !flag.load(SeqCst) {
            fiber::sleep(ms(1)).expect("a non-cancellable sleep is not cancelled");
        }
    })
}

/// Sets its flag when dropped (Kotlin's `finally { expect(n) }`).
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, SeqCst);
    }
}

// ---------------------------------------------------------------- JobStatesTest

kotlin_test! {
    /// JobStatesTest.testCompletingFailed: a job whose body returned while a
    /// child runs is active ("completing"); when that child then fails, the
    /// job ends failed: completed and cancelled, not active.
    fn completing_scope_whose_child_then_fails_ends_failed() {
        let (job_tx, job_rx) = fiber::chan::bounded::<Job>(1);
        let (go_tx, go_rx) = fiber::chan::bounded::<()>(0);
        let body_returned = Arc::new(AtomicBool::new(false));
        let returned = body_returned.clone();
        let owner = fiber::spawn(move || {
            let p = panic_of("the scope", || {
                fiber::scope(|s| {
                    s.spawn(move || {
                        go_rx.recv().unwrap();
                        panic_any(E1)
                    });
                    job_tx.send(s.job()).unwrap();
                    returned.store(true, SeqCst);
                })
            });
            describe(&*p)
        });
        let job = job_rx.recv().unwrap();
        wait_until("the scope body returned", || body_returned.load(SeqCst));
        assert!(job.is_active() && !job.is_completed() && !job.is_cancelled(), "completing: {job:?}");
        go_tx.send(()).unwrap();
        assert_eq!(owner.join().unwrap(), "E1", "the child's exception is the scope's");
        assert_eq!(job.join(), Ok(JobState::Failed));
        assert!(!job.is_active() && job.is_completed() && job.is_cancelled());
        assert_eq!(job.cancel_reason(), Some(CancelReason::ChildFailed));
    }
}

kotlin_test! {
    /// JobStatesTest.testFailed: a body that throws while a child still runs
    /// makes the job cancelling at once (not active, cancelled, not
    /// completed) until the child ends; then it is failed.
    fn body_failure_while_a_child_runs_is_cancelling_until_the_child_ends() {
        let (job_tx, job_rx) = fiber::chan::bounded::<Job>(1);
        let release = Arc::new(AtomicBool::new(false));
        let child_saw_cancel = Arc::new(AtomicBool::new(false));
        let owner = {
            let (release, saw) = (release.clone(), child_saw_cancel.clone());
            fiber::spawn(move || {
                let p = panic_of("the scope", || {
                    fiber::scope(|s| {
                        // Kotlin's ATOMIC start: the child runs before the
                        // block fails (a child the failure finds unstarted
                        // never runs).
                        let started = Arc::new(AtomicBool::new(false));
                        let child_started = started.clone();
                        s.spawn(move || {
                            child_started.store(true, SeqCst);
                            hold_until(&release);
                            saw.store(fiber::is_cancelled(), SeqCst);
                        });
                        wait_until("the child runs", || started.load(SeqCst));
                        job_tx.send(s.job()).unwrap();
                        panic_any(E1)
                    })
                });
                describe(&*p)
            })
        };
        let job = job_rx.recv().unwrap();
        wait_until("the body's failure cancels the job", || !job.is_active());
        assert_eq!(job.state(), JobState::Cancelling);
        assert!(!job.is_active() && job.is_cancelled() && !job.is_completed());
        fiber::sleep(ms(10)).unwrap();
        assert_eq!(job.state(), JobState::Cancelling, "the held child keeps the job cancelling");
        release.store(true, SeqCst);
        assert_eq!(owner.join().unwrap(), "E1");
        assert_eq!(job.state(), JobState::Failed);
        assert!(!job.is_active() && job.is_cancelled() && job.is_completed());
        assert!(child_saw_cancel.load(SeqCst), "the body's failure cancelled the child");
    }
}

kotlin_test! {
    /// JobStatesTest.testCancelling: cancelling a completing job (body
    /// returned, a child running) makes it cancelling, then cancelled once
    /// the child ends. (Kotlin's coroutineScope then throws
    /// CancellationException; fiber's scope returns its body's value and the
    /// job says it was cancelled, as `conformance/jobs.rs` documents.)
    fn cancelling_a_completing_scope_makes_it_cancelling_then_cancelled() {
        let (job_tx, job_rx) = fiber::chan::bounded::<Job>(1);
        let release = Arc::new(AtomicBool::new(false));
        let body_returned = Arc::new(AtomicBool::new(false));
        let owner = {
            let (release, returned) = (release.clone(), body_returned.clone());
            fiber::spawn(move || {
                fiber::scope(|s| {
                    s.spawn(move || hold_until(&release));
                    job_tx.send(s.job()).unwrap();
                    returned.store(true, SeqCst);
                    7
                })
            })
        };
        let job = job_rx.recv().unwrap();
        wait_until("the body returned", || body_returned.load(SeqCst));
        assert!(job.is_active() && !job.is_completed() && !job.is_cancelled());
        job.cancel();
        assert!(!job.is_active() && !job.is_completed() && job.is_cancelled());
        assert_eq!(job.state(), JobState::Cancelling);
        release.store(true, SeqCst);
        assert_eq!(owner.join().unwrap(), 7);
        assert_eq!(job.state(), JobState::Cancelled);
        assert!(!job.is_active() && job.is_completed() && job.is_cancelled());
        assert_eq!(job.cancel_reason(), Some(CancelReason::Cancelled));
    }
}

// ------------------------------- CancelledParentAttachTest, ScopedBuildersCancelledStartTest

/// Open each kind of scope in the (cancelled) current job; their jobs.
fn open_every_scope_kind(ran: &AtomicUsize) -> Vec<(&'static str, Job)> {
    let mut jobs = Vec::new();
    jobs.push((
        "scope",
        fiber::scope(|s| {
            ran.fetch_add(1, SeqCst);
            assert!(s.job().is_cancelled(), "a scope in a cancelled job starts cancelled");
            s.job()
        }),
    ));
    jobs.push((
        "supervisor_scope",
        fiber::supervisor_scope(|s| {
            ran.fetch_add(1, SeqCst);
            assert!(s.job().is_cancelled());
            s.job()
        }),
    ));
    let r: Result<Job, ()> = fiber::try_scope(|s| {
        ran.fetch_add(1, SeqCst);
        assert!(s.job().is_cancelled());
        Ok(s.job())
    });
    jobs.push(("try_scope", r.expect("try_scope: the body's Ok")));
    let r = fiber::with_timeout(Duration::MAX, || {
        ran.fetch_add(1, SeqCst);
        assert!(fiber::is_cancelled());
        Job::current()
    });
    jobs.push((
        "with_timeout",
        r.expect("with_timeout in a cancelled job: a cancellation, not a timeout"),
    ));
    jobs
}

kotlin_test! {
    /// CancelledParentAttachTest.testScopes and
    /// ScopedBuildersCancelledStartTest: coroutineScope, supervisorScope and
    /// withTimeout(Long.MAX_VALUE) opened in a cancelled job run their block
    /// and end cancelled (never completed), the timeout one as a plain
    /// cancellation, not a timeout. Both in a cancelled scope and in a fiber
    /// that cancelled its own (root) job.
    fn scopes_opened_in_a_cancelled_job_end_cancelled() {
        let ran = AtomicUsize::new(0);
        let jobs = fiber::scope(|outer| {
            outer.job().cancel();
            open_every_scope_kind(&ran)
        });
        // The fiber's value is dropped (it cancelled itself: its handle
        // reports Cancelled), so the results travel by channel.
        let (tx, rx) = fiber::chan::bounded(1);
        let h = fiber::spawn(move || {
            Job::current().cancel();
            let ran = AtomicUsize::new(0);
            let jobs = open_every_scope_kind(&ran);
            fiber::non_cancellable(|| tx.send((ran.into_inner(), jobs))).unwrap();
        });
        assert!(h.join().unwrap_err().is_cancelled());
        let (ran_in_root, root_jobs) = rx.recv().unwrap();
        assert_eq!(ran.load(SeqCst) + ran_in_root, 8, "Kotlin runs each block");
        for (kind, job) in jobs.into_iter().chain(root_jobs) {
            assert_eq!(job.state(), JobState::Cancelled, "{kind}");
            assert_eq!(job.cancel_reason(), Some(CancelReason::Cancelled), "{kind}");
        }
    }
}

// ---------------------------------------------------------------- SupervisorTest

kotlin_test! {
    /// SupervisorTest.testSupervisorScope: children failing in a
    /// supervisorScope do not fail it; it returns its block's value ("OK").
    /// Here nobody joins the failed children (their handles are dropped).
    fn supervisor_scope_returns_its_value_when_unjoined_children_fail() {
        let r = catch_unwind(AssertUnwindSafe(|| {
            fiber::supervisor_scope(|s| {
                s.spawn(|| panic_any(E1));
                s.spawn(|| panic_any(E2));
                (s.job(), "OK")
            })
        }));
        let (job, v) = match r {
            Ok(v) => v,
            Err(p) => panic!("the supervisor scope re-raised a child's failure: {}", describe(&*p)),
        };
        assert_eq!(v, "OK");
        assert_eq!(job.state(), JobState::Completed);
        assert!(!fiber::is_cancelled());
    }
}

/// The body of `body_panic_wins_...`: two children parked until cancelled,
/// the second of which then fails with `E2`; once both run, the body fails
/// with `E1`.
macro_rules! body_then_children_fail {
    ($s:ident, $started:ident) => {{
        let started = &$started;
        $s.spawn(move || {
            started.fetch_add(1, SeqCst);
            park_until_cancelled();
        });
        $s.spawn(move || {
            started.fetch_add(1, SeqCst);
            let _ = fiber::sleep(Duration::from_secs(3600));
            panic_any(E2)
        });
        wait_until("both children run", || started.load(SeqCst) == 2);
        panic_any(E1)
    }};
}

kotlin_test! {
    /// SupervisorTest.testSupervisorThrowsWithFailingChild and
    /// JobExceptionHandlingTest.testMultipleChildrenAndParentThrowsAtomic: the
    /// block throws E1, which cancels the children; a child that throws E2
    /// from its `finally` on that cancellation does not replace E1: the
    /// scope rethrows E1. For supervisorScope and coroutineScope.
    fn body_panic_wins_over_children_failing_on_its_cancellation() {
        let started = AtomicUsize::new(0);
        let p = panic_of("supervisor_scope", || {
            fiber::supervisor_scope(|s| -> () { body_then_children_fail!(s, started) })
        });
        assert_is::<E1>(&*p, "supervisor_scope");
        let started = AtomicUsize::new(0);
        let (tx, rx) = fiber::chan::bounded::<Job>(1);
        let p = panic_of("scope", || {
            fiber::scope(|s| -> () {
                tx.send(s.job()).unwrap();
                body_then_children_fail!(s, started)
            })
        });
        assert_is::<E1>(&*p, "scope");
        assert_eq!(rx.recv().unwrap().state(), JobState::Failed);
        assert!(!fiber::is_cancelled(), "the caller is not cancelled");
    }
}

kotlin_test! {
    /// SupervisorTest.testSupervisorScopeExternalCancellation: cancelling the
    /// coroutine that runs a supervisorScope cancels the scope's children at
    /// once (`childJob.isCancelled` right after `job.cancel()`), and the
    /// coroutine's join returns after the child's `finally`.
    fn cancelling_the_owner_cancels_its_supervisor_scopes_children_at_once() {
        let (tx, rx) = fiber::chan::bounded::<Job>(1);
        let cleaned = Arc::new(AtomicBool::new(false));
        let owner = {
            let cleaned = cleaned.clone();
            fiber::spawn(move || {
                fiber::supervisor_scope(|s| {
                    s.spawn(move || {
                        let _done = SetOnDrop(&cleaned);
                        tx.send(Job::current()).unwrap();
                        park_until_cancelled();
                    });
                })
            })
        };
        let child = rx.recv().unwrap();
        assert!(child.is_active());
        owner.cancel();
        assert!(child.is_cancelled(), "the cancel reached the child before cancel() returned");
        let e = owner.join().unwrap_err();
        assert!(e.is_cancelled(), "{e:?}");
        assert!(cleaned.load(SeqCst), "the owner ended after its child's clean-up");
        assert_eq!(child.state(), JobState::Cancelled);
    }
}

kotlin_test! {
    /// SupervisorTest.testSupervisorWithParentCancelNormally and
    /// testSupervisorWithParentCancelException: cancelling a supervisor
    /// leaves its parent active; a supervisor that fails (its own block
    /// throws) fails its parent, which cancels the parent's other children.
    fn a_cancelled_supervisor_spares_its_parent_a_failed_one_fails_it() {
        let outer = fiber::scope(|s| {
            let sup = fiber::supervisor_scope(|sup| {
                let h = sup.spawn(park_until_cancelled);
                sup.job().cancel();
                assert!(h.join().unwrap_err().is_cancelled());
                sup.job()
            });
            assert_eq!(sup.state(), JobState::Cancelled);
            assert!(s.job().is_active(), "the parent is not cancelled");
            assert!(!fiber::is_cancelled());
            s.job()
        });
        assert_eq!(outer.state(), JobState::Completed);

        let (tx, rx) = fiber::chan::bounded::<Job>(1);
        let sibling_cancelled = AtomicBool::new(false);
        let p = panic_of("a scope with a failing supervisor", || {
            fiber::scope(|s| {
                tx.send(s.job()).unwrap();
                let flag = &sibling_cancelled;
                let sibling = s.spawn(move || {
                    flag.store(true, SeqCst);
                    let cancelled = fiber::sleep(Duration::from_secs(3600)).is_err();
                    flag.store(cancelled, SeqCst);
                });
                wait_until("the sibling runs", || flag.load(SeqCst));
                flag.store(false, SeqCst);
                let _ = sibling;
                s.spawn(|| fiber::supervisor_scope(|_| -> () { panic_any(E1) }));
            })
        });
        assert_is::<E1>(&*p, "the supervisor's own failure");
        assert!(sibling_cancelled.load(SeqCst));
        let job = rx.recv().unwrap();
        assert_eq!(job.state(), JobState::Failed);
        assert_eq!(job.cancel_reason(), Some(CancelReason::ChildFailed));
    }
}

kotlin_test! {
    /// SupervisorTest.testSupervisorScopeCancellationVsException and
    /// CoroutineScopeTest.testCoroutineScopeCancellationVsException: the
    /// coroutine is cancelled, then the scope's block throws E1: the caller
    /// catches E1, not a cancellation. The try_scope form returns the body's
    /// error.
    fn cancel_then_throw_in_a_scope_raises_the_throw() {
        let h = fiber::spawn(|| {
            let me = Job::current();
            let mut seen = Vec::new();
            let p = panic_of("scope", || {
                fiber::scope(|_| -> () {
                    fiber::yield_now().unwrap();
                    me.cancel();
                    panic_any(E1)
                })
            });
            seen.push(describe(&*p));
            let p = panic_of("supervisor_scope", || {
                fiber::supervisor_scope(|_| -> () { panic_any(E1) })
            });
            seen.push(describe(&*p));
            let r: Result<(), &str> = fiber::try_scope(|_| Err("E1"));
            seen.push(format!("{r:?}"));
            assert!(fiber::is_cancelled(), "the coroutine stays cancelled");
            seen
        });
        match h.join() {
            Ok(seen) => assert_eq!(seen, ["E1", "E1", "Err(\"E1\")"]),
            Err(e) => assert!(e.is_cancelled(), "{e:?}"),
        }
    }
}

// ---------------------------------------------------------------- CoroutineScopeTest

kotlin_test! {
    /// CoroutineScopeTest.testScope and testIncompleteScopeState: the scope
    /// returns its block's value after every child, including one a child
    /// started after the block returned; its job is then completed, not
    /// cancelled; the caller is not cancelled.
    fn scope_waits_for_children_started_by_children_after_its_block_returned() {
        let done = AtomicUsize::new(0);
        let body_returned = AtomicBool::new(false);
        let late_saw_body_returned = AtomicBool::new(false);
        let (v, job) = fiber::scope(|s| {
            let (done, body_returned, late) = (&done, &body_returned, &late_saw_body_returned);
            s.spawn(move || done.fetch_add(1, SeqCst));
            s.spawn(move || {
                wait_until("the block returned", || body_returned.load(SeqCst));
                s.spawn(move || {
                    fiber::yield_now().unwrap();
                    late.store(true, SeqCst);
                    done.fetch_add(1, SeqCst);
                });
                done.fetch_add(1, SeqCst);
            });
            body_returned.store(true, SeqCst);
            (42, s.job())
        });
        assert_eq!(v, 42);
        assert_eq!(done.load(SeqCst), 3, "the scope waited for every child");
        assert!(late_saw_body_returned.load(SeqCst));
        assert_eq!(job.state(), JobState::Completed);
        assert!(job.is_completed() && !job.is_active() && !job.is_cancelled());
        assert_eq!(fiber::yield_now(), Ok(()), "the caller is not cancelled");
    }
}

kotlin_test! {
    /// CoroutineScopeTest.testScopeCancelledFromWithin, testScopeBlockThrows,
    /// testExceptionFromWithin: a child's or the block's exception is
    /// rethrown by the scope, and the caller goes on uncancelled (its
    /// `yield()` afterwards does not throw).
    fn a_failed_scope_leaves_its_caller_uncancelled() {
        let me = Job::current();
        let p = panic_of("a failing child", || {
            fiber::scope(|s| {
                s.spawn(park_until_cancelled);
                s.spawn(|| panic_any(E2));
            })
        });
        assert_is::<E2>(&*p, "a failing child");
        assert_eq!(fiber::yield_now(), Ok(()));
        assert!(me.is_active() && !fiber::is_cancelled());
        let p = panic_of("a failing block", || {
            fiber::scope(|s| -> () {
                s.spawn(park_until_cancelled);
                fiber::yield_now().unwrap();
                panic_any(E1)
            })
        });
        assert_is::<E1>(&*p, "a failing block");
        let p = panic_of("a failing block without children", || fiber::scope(|_| -> () { panic_any(E1) }));
        assert_is::<E1>(&*p, "a failing block without children");
        assert_eq!(fiber::yield_now(), Ok(()));
        assert!(me.is_active() && !fiber::is_cancelled());
    }
}

kotlin_test! {
    /// CoroutineScopeTest.testAsyncCancellationFirst: the first async fails,
    /// the block awaits it and rethrows; the second async is cancelled (its
    /// `finally` runs) and the scope rethrows TestException1.
    fn awaiting_the_failed_child_rethrows_its_exception() {
        let cleaned = AtomicBool::new(false);
        let p = panic_of("the scope", || {
            fiber::scope(|s| -> u32 {
                let cleaned = &cleaned;
                let two_started = Arc::new(AtomicBool::new(false));
                let started = two_started.clone();
                // `two` is ATOMIC upstream: it runs before `one` fails.
                let one = s.spawn(move || -> u32 {
                    wait_until("two runs", || started.load(SeqCst));
                    panic_any(E1)
                });
                let two = s.spawn(move || -> u32 {
                    let _done = SetOnDrop(cleaned);
                    two_started.store(true, SeqCst);
                    park_until_cancelled();
                    42
                });
                let a = one.join().unwrap_or_else(|e| resume_unwind(e.into_panic()));
                a + two.join().unwrap()
            })
        });
        assert_is::<E1>(&*p, "the scope");
        assert!(cleaned.load(SeqCst));
    }
}

kotlin_test! {
    /// CoroutineScopeTest.testAsyncCancellationSecond: the block awaits the
    /// first async, which the second's failure cancels; the await fails with
    /// a cancellation, and the scope rethrows the second's TestException1,
    /// not that cancellation (here: not the body's `unwrap` panic on the
    /// cancelled join).
    fn awaiting_a_sibling_cancelled_by_a_failure_rethrows_the_failure() {
        let cleaned = AtomicBool::new(false);
        let p = panic_of("the scope", || {
            fiber::scope(|s| -> u32 {
                let cleaned = &cleaned;
                let one_started = Arc::new(AtomicBool::new(false));
                let started = one_started.clone();
                let one = s.spawn(move || -> u32 {
                    let _done = SetOnDrop(cleaned);
                    one_started.store(true, SeqCst);
                    park_until_cancelled();
                    42
                });
                let two = s.spawn(move || -> u32 {
                    wait_until("one runs", || started.load(SeqCst));
                    panic_any(E1)
                });
                one.join().unwrap() + two.join().unwrap()
            })
        });
        assert_is::<E1>(&*p, "the scope");
        assert!(cleaned.load(SeqCst));
    }
}

// ---------------------------------------------------- WithTimeoutTest, WithTimeoutOrNullTest

kotlin_test! {
    /// WithTimeoutOrNullTest.testOuterTimeout: inner withTimeoutOrNull(150)
    /// blocks that spin on `yield()` in a loop under an outer
    /// withTimeoutOrNull(320): each inner one times out; the outer one cuts
    /// the loop: 1 or 2 inner blocks complete, the outer result is null.
    fn an_outer_timeout_cuts_a_loop_of_inner_timeouts() {
        fn spin() {
            while fiber::yield_now().is_ok() {}
        }
        let mut counter = 0;
        let r = fiber::with_timeout(ms(320), || loop {
            let inner = fiber::with_timeout(ms(150), spin);
            assert_eq!(inner, Err(TimedOut));
            if fiber::is_cancelled() {
                break;
            }
            counter += 1;
        });
        assert_eq!(r, Err(TimedOut));
        assert!((1..=2).contains(&counter), "executed {counter} times");
        assert!(!fiber::is_cancelled());
    }
}

kotlin_test! {
    /// WithTimeoutOrNullTest.testSmallTimeout and
    /// WithTimeoutTest.testSuppressExceptionWithResult: a receive on an
    /// empty channel under a 1 ms timeout times out; a block that catches
    /// the timeout's cancellation and returns "OK" still times out; the
    /// caller goes on.
    fn a_timeout_stands_even_when_the_block_swallows_its_cancellation() {
        let (tx, rx) = fiber::chan::bounded::<u32>(1);
        let r = fiber::with_timeout(ms(1), || rx.recv());
        assert_eq!(r, Err(TimedOut));
        tx.send(5).unwrap();
        assert_eq!(rx.recv(), Ok(5), "the channel lost nothing");

        let (job_tx, job_rx) = fiber::chan::bounded::<Job>(1);
        let swallowed = AtomicBool::new(false);
        let r = fiber::with_timeout(ms(10), || {
            job_tx.send(Job::current()).unwrap();
            if fiber::sleep(Duration::from_secs(3600)).is_err() {
                swallowed.store(true, SeqCst);
            }
            "OK"
        });
        assert_eq!(r, Err(TimedOut));
        assert!(swallowed.load(SeqCst));
        let job = job_rx.recv().unwrap();
        assert_eq!(job.state(), JobState::Cancelled);
        assert_eq!(job.cancel_reason(), Some(CancelReason::TimedOut));
        assert_eq!(fiber::yield_now(), Ok(()));
    }
}

kotlin_test! {
    /// A `withTimeout` block that cancels its own job before the deadline,
    /// then overruns the deadline in a non-cancellable section: the first
    /// reason stands (an explicit cancel, not a timeout; spec/jobs.md "a
    /// timeout never replaces an explicit reason"), so it is not reported
    /// as timed out.
    fn a_timeout_after_an_explicit_cancel_of_the_block_keeps_the_explicit_reason() {
        let (job_tx, job_rx) = fiber::chan::bounded::<Job>(1);
        let r = fiber::with_timeout(ms(5), || {
            let me = Job::current();
            job_tx.send(me.clone()).unwrap();
            me.cancel();
            fiber::non_cancellable(|| fiber::sleep(ms(30))).expect("held off");
            assert_eq!(me.cancel_reason(), Some(CancelReason::Cancelled));
            1
        });
        let job = job_rx.recv().unwrap();
        assert_eq!(job.state(), JobState::Cancelled);
        assert_eq!(job.cancel_reason(), Some(CancelReason::Cancelled));
        assert_eq!(r, Ok(1), "cancelled, not timed out (the value of a scope-like block)");
        assert!(!fiber::is_cancelled());
    }
}

// ---------------------------------------------------------------- ParentCancellationTest

kotlin_test! {
    /// ParentCancellationTest.testCoroutineScopeChild, testWithTimeoutChild,
    /// testSupervisorChild: a grandchild failing inside coroutineScope or
    /// withTimeout is rethrown to the code that opened it (the very same
    /// exception) and leaves the enclosing job active; inside supervisorScope
    /// it stays with the grandchild. A grandchild that cancels itself
    /// (throws CancellationException) is not rethrown anywhere.
    fn a_failure_inside_a_scope_or_timeout_goes_to_its_caller_not_the_parent_job() {
        let parent = fiber::scope(|parent| {
            let p = panic_of("scope", || {
                fiber::scope(|s| {
                    s.spawn(|| panic_any(E1));
                })
            });
            assert_is::<E1>(&*p, "scope");
            assert!(parent.job().is_active());

            let p = panic_of("with_timeout", || {
                fiber::with_timeout(Duration::from_secs(1), || {
                    fiber::scope(|s| {
                        s.spawn(|| panic_any(E2));
                    })
                })
            });
            assert_is::<E2>(&*p, "with_timeout rethrows, it does not report a timeout");
            assert!(parent.job().is_active());

            fiber::supervisor_scope(|s| {
                s.spawn(|| panic_any(E1));
            });
            assert!(parent.job().is_active());

            for kind in 0..3 {
                let self_cancel = || {
                    Job::current().cancel();
                    assert!(fiber::check_cancelled().is_err());
                };
                match kind {
                    0 => fiber::scope(|s| {
                        s.spawn(self_cancel);
                    }),
                    1 => fiber::supervisor_scope(|s| {
                        s.spawn(self_cancel);
                    }),
                    _ => fiber::with_timeout(Duration::from_secs(1), || {
                        fiber::scope(|s| {
                            s.spawn(self_cancel);
                        })
                    })
                    .expect("a child's own cancel is not a timeout"),
                }
            }
            assert!(parent.job().is_active() && !fiber::is_cancelled());
            parent.job()
        });
        assert_eq!(parent.state(), JobState::Completed);
    }
}

// ---------------------------------------------- JobExceptionHandlingTest, JobNestedExceptionsTest

kotlin_test! {
    /// JobExceptionHandlingTest.testExceptionOnChildCancellation: a child
    /// cancels the root job; a grandchild throws ArithmeticException when it
    /// sees that cancellation: the root ends with that exception (failed,
    /// not just cancelled).
    fn a_grandchild_failing_on_the_roots_cancellation_fails_the_root() {
        let (tx, rx) = fiber::chan::bounded::<Job>(1);
        let started = AtomicBool::new(false);
        let p = panic_of("the root scope", || {
            fiber::scope(|root| {
                tx.send(root.job()).unwrap();
                let root_job = root.job();
                let started = &started;
                root.spawn(move || {
                    fiber::scope(|inner| {
                        let flag = started;
                        inner.spawn(move || {
                            flag.store(true, SeqCst);
                            let _ = fiber::sleep(Duration::from_secs(3600));
                            panic_any(Arith)
                        });
                        wait_until("the grandchild runs", || started.load(SeqCst));
                        root_job.cancel();
                    })
                });
            })
        });
        assert_is::<Arith>(&*p, "the root scope");
        let job = rx.recv().unwrap();
        assert_eq!(job.state(), JobState::Failed, "failure dominates the cancellation");
        assert!(!fiber::is_cancelled());
    }
}

kotlin_test! {
    /// JobExceptionHandlingTest.testExceptionDuringCancellation and
    /// testInnerChildException: cancelAndJoin of a job whose child throws
    /// while being cancelled: the join returns once everything ended, the
    /// job is failed, and the exception is reported (here: re-raised by the
    /// scope to its owner).
    fn cancel_and_join_while_a_child_fails_on_the_cancellation_ends_failed() {
        let (tx, rx) = fiber::chan::bounded::<Job>(1);
        let started = Arc::new(AtomicBool::new(false));
        let owner = {
            let started = started.clone();
            fiber::spawn(move || {
                let p = panic_of("the scope", || {
                    fiber::scope(|s| {
                        s.spawn(move || {
                            started.store(true, SeqCst);
                            let _ = fiber::sleep(Duration::from_secs(3600));
                            panic_any(E1)
                        });
                        tx.send(s.job()).unwrap();
                    })
                });
                describe(&*p)
            })
        };
        let job = rx.recv().unwrap();
        wait_until("the child runs", || started.load(SeqCst));
        assert_eq!(job.cancel_and_join(), Ok(JobState::Failed));
        assert!(job.is_completed() && job.is_cancelled());
        assert_eq!(owner.join().unwrap(), "E1");
    }
}

kotlin_test! {
    /// JobExceptionHandlingTest.testAttachToCancelledJob (and testCancelledParent):
    /// a child launched into a job that a failure is cancelling never runs
    /// and completes as cancelled (not failed); the scope rethrows the first
    /// failure.
    fn a_child_started_in_a_failing_scope_never_runs() {
        let ran = AtomicBool::new(false);
        let late_error = Mutex::new(None);
        let p = panic_of("the scope", || {
            fiber::scope(|s| {
                s.spawn(|| panic_any(E1));
                let job = s.job();
                wait_until("the failure cancels the scope", || job.is_cancelled());
                let late = s.spawn(|| ran.store(true, SeqCst));
                let e = late.join().unwrap_err();
                *late_error.lock().unwrap() = Some((e.is_cancelled(), e.is_panic(), e.is_failed()));
            })
        });
        assert_is::<E1>(&*p, "the scope");
        assert!(!ran.load(SeqCst), "the late child never ran");
        assert_eq!(
            *late_error.lock().unwrap(),
            Some((true, false, false)),
            "(is_cancelled, is_panic, is_failed) of the late child"
        );
    }
}

/// A scope at `depth` with a sleeping sibling and, at the bottom, a child
/// that throws `Io` once every sibling is asleep (`asleep` counts them; a
/// sibling cancelled before it started would never run its body, as in
/// Kotlin, and on two workers the bottom child may get there first);
/// every level records its job.
fn nested_failure(
    depth: usize,
    jobs: &Mutex<Vec<Job>>,
    cancelled: &AtomicUsize,
    asleep: &AtomicUsize,
    siblings: usize,
) {
    fiber::scope(|s| {
        jobs.lock().unwrap().push(s.job());
        s.spawn(move || {
            asleep.fetch_add(1, SeqCst);
            if fiber::sleep(Duration::from_secs(3600)).is_err() {
                cancelled.fetch_add(1, SeqCst);
            }
        });
        if depth == 0 {
            s.spawn(move || {
                while asleep.load(SeqCst) < siblings {
                    let _ = fiber::yield_now();
                }
                let _ = fiber::yield_now();
                panic_any(Io)
            });
        } else {
            s.spawn(move || nested_failure(depth - 1, jobs, cancelled, asleep, siblings));
        }
    })
}

kotlin_test! {
    /// JobNestedExceptionsTest.testExceptionUnwrapping and
    /// testExceptionUnwrappingWithSuspensions: an exception thrown four
    /// launches deep reaches the root as itself (not wrapped), every level
    /// fails, and every suspended sibling on the way is cancelled.
    fn a_failure_deep_in_nested_scopes_reaches_the_root_unwrapped() {
        let jobs = Mutex::new(Vec::new());
        let cancelled = AtomicUsize::new(0);
        let asleep = AtomicUsize::new(0);
        let p = panic_of("the root", || nested_failure(3, &jobs, &cancelled, &asleep, 4));
        assert_is::<Io>(&*p, "the root");
        let jobs = jobs.into_inner().unwrap();
        assert_eq!(jobs.len(), 4);
        for (depth, job) in jobs.iter().enumerate() {
            assert_eq!(job.state(), JobState::Failed, "level {depth}");
        }
        assert_eq!(cancelled.load(SeqCst), 4, "every sleeping sibling was cancelled");
    }
}

// ---------------------------------------------------------------- CoroutinesTest, JobTest

kotlin_test! {
    /// CoroutinesTest.testParentCrashCancelsChildren: a crashed parent
    /// cancels its child and waits for the child's non-cancellable
    /// `finally` before it completes.
    fn a_crashed_parent_waits_for_its_childs_non_cancellable_clean_up() {
        let cleanup_done = AtomicBool::new(false);
        let (tx, rx) = fiber::chan::bounded::<Job>(1);
        let p = panic_of("the crashed scope", || {
            fiber::scope(|s| -> () {
                let cleanup_done = &cleanup_done;
                s.spawn(move || {
                    tx.send(Job::current()).unwrap();
                    park_until_cancelled();
                    fiber::non_cancellable(|| {
                        fiber::sleep(ms(20)).expect("the clean-up sleeps in full");
                        fiber::yield_now().expect("and yields");
                    });
                    cleanup_done.store(true, SeqCst);
                });
                let _child = rx.recv().unwrap();
                panic_any(E1)
            })
        });
        assert_is::<E1>(&*p, "the crashed scope");
        assert!(cleanup_done.load(SeqCst), "the scope waited for the clean-up");
    }
}

kotlin_test! {
    /// CoroutinesTest.testJoinWithFinally, JobTest.testCancelAndJoinParentWaitChildren:
    /// right after cancel() a job in its `finally` is neither active nor
    /// completed; join returns once the `finally` ended. Joining a cancelled
    /// parent waits for its children's clean-up too.
    fn a_cancelled_job_is_cancelling_during_its_clean_up_and_join_waits_for_it() {
        let (tx, rx) = fiber::chan::bounded::<Job>(1);
        let in_cleanup = AtomicBool::new(false);
        let release = AtomicBool::new(false);
        fiber::scope(|s| {
            let (in_cleanup, release) = (&in_cleanup, &release);
            let h = s.spawn(move || {
                tx.send(Job::current()).unwrap();
                park_until_cancelled();
                in_cleanup.store(true, SeqCst);
                hold_until(release);
            });
            let job = rx.recv().unwrap();
            assert!(job.is_active() && !job.is_completed());
            h.cancel();
            assert!(!job.is_active() && !job.is_completed() && job.is_cancelled());
            wait_until("the child is in its clean-up", || in_cleanup.load(SeqCst));
            assert_eq!(job.state(), JobState::Cancelling);
            release.store(true, SeqCst);
            assert!(h.join().unwrap_err().is_cancelled());
            assert!(!job.is_active() && job.is_completed() && job.is_cancelled());
        });

        // The parent: cancelAndJoin of a scope's job from another fiber.
        let (tx, rx) = fiber::chan::bounded::<Job>(1);
        let cleaned = Arc::new(AtomicBool::new(false));
        let owner = {
            let cleaned = cleaned.clone();
            fiber::spawn(move || {
                fiber::scope(|s| {
                    let started = Arc::new(AtomicBool::new(false));
                    let child_started = started.clone();
                    s.spawn(move || {
                        child_started.store(true, SeqCst);
                        park_until_cancelled();
                        fiber::non_cancellable(|| fiber::sleep(ms(20))).unwrap();
                        cleaned.store(true, SeqCst);
                    });
                    wait_until("the child runs", || started.load(SeqCst));
                    tx.send(s.job()).unwrap();
                })
            })
        };
        let parent = rx.recv().unwrap();
        assert_eq!(parent.cancel_and_join(), Ok(JobState::Cancelled));
        assert!(cleaned.load(SeqCst), "the parent's join waited for the child's clean-up");
        owner.join().unwrap();
    }
}

kotlin_test! {
    /// CoroutinesTest.testCancelAndJoinChildCrash: after a child crashed
    /// (which cancels the parent), the parent's cancelAndJoin of that child
    /// throws CancellationException: Kotlin's join "always checks for a
    /// cancellation of the invoking coroutine's Job", even when the joined
    /// job has already completed.
    fn join_by_a_cancelled_fiber_of_an_ended_job_reports_the_cancellation() {
        let (tx, rx) = fiber::chan::bounded::<Job>(1);
        let joined = Mutex::new(None);
        let p = panic_of("the scope", || {
            fiber::scope(|s| {
                s.spawn(move || -> () {
                    tx.send(Job::current()).unwrap();
                    panic_any(E1)
                });
                let child = rx.recv().unwrap();
                wait_until("the child crashed", || child.is_completed());
                assert!(fiber::is_cancelled(), "the crash cancelled the body");
                *joined.lock().unwrap() = Some(child.cancel_and_join());
            })
        });
        assert_is::<E1>(&*p, "the scope");
        assert_eq!(*joined.lock().unwrap(), Some(Err(fiber::Cancelled)));
    }
}

/// Sleeps (a suspension) in its destructor and records what the sleep said.
struct SleepOnDrop<'a>(&'a Mutex<Option<Result<(), fiber::Cancelled>>>);

impl Drop for SleepOnDrop<'_> {
    fn drop(&mut self) {
        let r = fiber::sleep(ms(2));
        let _ = fiber::yield_now();
        *self.0.lock().unwrap() = Some(r);
    }
}

kotlin_test! {
    /// CoroutinesTest.testYieldInFinally: a `finally` that suspends while an
    /// exception propagates runs to its end and the exception goes on, in
    /// the root fiber and in a scoped child (whose scope rethrows it).
    fn a_destructor_that_suspends_during_a_panic_runs_and_the_panic_goes_on() {
        let slept = Mutex::new(None);
        let p = panic_of("the root fiber's block", || {
            let _g = SleepOnDrop(&slept);
            panic_any(E2)
        });
        assert_is::<E2>(&*p, "the root fiber's block");
        assert_eq!(*slept.lock().unwrap(), Some(Ok(())));

        let slept = Mutex::new(None);
        let p = panic_of("the scope", || {
            fiber::scope(|s| {
                let slept = &slept;
                s.spawn(move || {
                    let _g = SleepOnDrop(slept);
                    panic_any(E1)
                });
            })
        });
        assert_is::<E1>(&*p, "the scope");
        assert!(slept.lock().unwrap().is_some(), "the child's destructor ran to its end");
    }
}

kotlin_test! {
    /// CoroutinesTest.testNotCancellableChildWithExceptionCancelled: a child
    /// cancelled while it runs non-cancellably and then throwing is failed
    /// with that exception, not cancelled: its join reports the panic.
    fn a_cancelled_child_that_then_panics_reports_the_panic() {
        let entered = AtomicBool::new(false);
        let release = AtomicBool::new(false);
        let job = fiber::scope(|s| {
            let (entered, release) = (&entered, &release);
            let h = s.spawn(move || -> () {
                entered.store(true, SeqCst);
                hold_until(release);
                panic_any(E1)
            });
            wait_until("the child runs", || entered.load(SeqCst));
            h.cancel();
            release.store(true, SeqCst);
            let e = h.join().unwrap_err();
            assert!(e.is_panic(), "{e:?}");
            assert_is::<E1>(&*e.into_panic(), "the child's join");
            s.job()
        });
        // The body took the payload through the join and returned: the
        // scope returns (std's rule, spec/jobs.md), its job is failed.
        assert_eq!(job.state(), JobState::Failed);
    }
}

kotlin_test! {
    /// NonCancellableTest.testNonCancellable and testNonCancellableTwice: a
    /// job cancelled while in a NonCancellable block finishes that block and
    /// a second one entered after the cancel, with their suspensions; its
    /// next suspension outside throws, and the job ends cancelled.
    fn two_non_cancellable_sections_run_in_full_in_a_cancelled_child() {
        let steps = Mutex::new(Vec::new());
        let (tx, rx) = fiber::chan::bounded::<Job>(1);
        fiber::scope(|s| {
            let steps = &steps;
            let h = s.spawn(move || {
                let me = Job::current();
                tx.send(me.clone()).unwrap();
                fiber::non_cancellable(|| {
                    while !me.is_cancelled() {
                        fiber::sleep(ms(1)).unwrap();
                    }
                    steps.lock().unwrap().push(("first", fiber::yield_now().is_ok(), fiber::is_cancelled()));
                });
                fiber::non_cancellable(|| {
                    let ok = fiber::yield_now().is_ok() && fiber::sleep(ms(1)).is_ok();
                    steps.lock().unwrap().push(("second", ok, fiber::is_cancelled()));
                });
                steps.lock().unwrap().push(("after", fiber::yield_now().is_ok(), fiber::is_cancelled()));
                "returned"
            });
            let job = rx.recv().unwrap();
            job.cancel();
            assert!(h.join().unwrap_err().is_cancelled());
            assert_eq!(job.state(), JobState::Cancelled);
        });
        assert_eq!(
            *steps.lock().unwrap(),
            [("first", true, false), ("second", true, false), ("after", false, true)]
        );
    }
}

// ---------------------------------------------------------------- AwaitTest

kotlin_test! {
    /// AwaitTest.testJoinAllCancellation / testAwaitAllCancellation: a
    /// coroutine waiting for its child is cancelled: the child is cancelled
    /// with it and both end cancelled.
    fn cancelling_a_fiber_waiting_for_its_scoped_child_ends_both() {
        let (tx, rx) = fiber::chan::bounded::<Job>(1);
        let outer = fiber::spawn(move || {
            fiber::scope(|s| {
                let inner = s.spawn(move || {
                    tx.send(Job::current()).unwrap();
                    park_until_cancelled();
                });
                inner.join().is_ok()
            })
        });
        let inner = rx.recv().unwrap();
        fiber::sleep(ms(5)).unwrap(); // the outer fiber parks in its join (not required)
        assert!(inner.is_active());
        outer.cancel();
        let e = outer.join().unwrap_err();
        assert!(e.is_cancelled(), "{e:?}");
        assert_eq!(inner.state(), JobState::Cancelled);
    }
}

kotlin_test! {
    /// AwaitTest.testAwaitAllSameJobMultipleTimes,
    /// testJoinAllSameJobExceptionally, testJoinAllExceptionally: joining the
    /// same job again and again, from several coroutines, gives the same
    /// answer; joining a failed job does not throw.
    fn joining_the_same_job_many_times_gives_the_same_state() {
        fiber::supervisor_scope(|s| {
            let (tx, rx) = fiber::chan::bounded::<Job>(2);
            let tx2 = tx.clone();
            let ok = s.spawn(move || {
                tx.send(Job::current()).unwrap();
                "OK"
            });
            let ok_job = rx.recv().unwrap();
            let bad = s.spawn(move || -> () {
                tx2.send(Job::current()).unwrap();
                panic_any(E1)
            });
            let bad_job = rx.recv().unwrap();
            let joiners: Vec<_> = (0..3)
                .map(|_| {
                    let (a, b) = (ok_job.clone(), bad_job.clone());
                    s.spawn(move || (a.join(), a.join(), b.join(), b.join()))
                })
                .collect();
            for _ in 0..3 {
                assert_eq!(ok_job.join(), Ok(JobState::Completed));
                assert_eq!(bad_job.join(), Ok(JobState::Failed));
            }
            for j in joiners {
                let all = j.join().unwrap();
                assert_eq!(
                    all,
                    (
                        Ok(JobState::Completed),
                        Ok(JobState::Completed),
                        Ok(JobState::Failed),
                        Ok(JobState::Failed)
                    )
                );
            }
            assert_eq!(ok.join().unwrap(), "OK");
            assert!(bad.join().unwrap_err().is_panic());
            assert!(s.job().is_active());
        });
    }
}

// ------------------------------------------------- cancel after the end; destructors that panic

kotlin_test! {
    /// JobTest.testHandler ("cancel again"), CoroutineScopeTest.testIncompleteScopeState,
    /// WithTimeoutTest.testIncompleteWithTimeoutState: a completed scope or
    /// withTimeout job is completed, not active, not cancelled, and a cancel
    /// of it changes nothing; nor does a cancel of a timed-out job replace
    /// its reason.
    fn cancel_after_the_end_changes_nothing_for_scope_and_timeout_jobs() {
        let scope_job = fiber::scope(|s| s.job());
        let timeout_job = fiber::with_timeout(Duration::from_secs(3600), Job::current).unwrap();
        for (what, job) in [("scope", &scope_job), ("with_timeout", &timeout_job)] {
            for _ in 0..2 {
                assert_eq!(job.state(), JobState::Completed, "{what}");
                assert!(job.is_completed() && !job.is_active() && !job.is_cancelled(), "{what}");
                assert_eq!(job.cancel_reason(), None, "{what}");
                job.cancel();
            }
            assert_eq!(job.join(), Ok(JobState::Completed), "{what}");
        }
        let (tx, rx) = fiber::chan::bounded::<Job>(1);
        let r = fiber::with_timeout(ms(5), || {
            tx.send(Job::current()).unwrap();
            park_until_cancelled();
        });
        assert_eq!(r, Err(TimedOut));
        let timed_out = rx.recv().unwrap();
        timed_out.cancel();
        assert_eq!(timed_out.state(), JobState::Cancelled);
        assert_eq!(timed_out.cancel_reason(), Some(CancelReason::TimedOut));
    }
}

/// Panics when dropped (only ever dropped outside an unwind here).
struct PanicOnDrop;

impl Drop for PanicOnDrop {
    fn drop(&mut self) {
        panic_any(E2)
    }
}

kotlin_test! {
    /// JobExceptionHandlingTest.testExceptionDuringCancellation, in the form
    /// of clean-up code: a child whose destructor throws after the scope was
    /// cancelled, or whose NonCancellable clean-up block throws, fails: the
    /// scope ends failed (failure dominates the cancellation) and rethrows
    /// that exception; the caller is not cancelled.
    fn clean_up_code_that_panics_after_a_cancel_fails_the_scope() {
        let (tx, rx) = fiber::chan::bounded::<Job>(1);
        let started = AtomicBool::new(false);
        let p = panic_of("a destructor", || {
            fiber::scope(|s| {
                tx.send(s.job()).unwrap();
                let started = &started;
                s.spawn(move || {
                    let _g = PanicOnDrop;
                    started.store(true, SeqCst);
                    park_until_cancelled();
                });
                wait_until("the child runs", || started.load(SeqCst));
                s.job().cancel();
            })
        });
        assert_is::<E2>(&*p, "a destructor");
        let job = rx.recv().unwrap();
        assert_eq!(job.state(), JobState::Failed);
        assert_eq!(job.cancel_reason(), Some(CancelReason::Cancelled), "the first reason stands");

        let started = AtomicBool::new(false);
        let p = panic_of("a non-cancellable clean-up", || {
            fiber::scope(|s| {
                let started = &started;
                let h = s.spawn(move || {
                    started.store(true, SeqCst);
                    park_until_cancelled();
                    fiber::non_cancellable(|| -> () {
                        fiber::sleep(ms(1)).unwrap();
                        panic_any(E1)
                    })
                });
                wait_until("the child runs", || started.load(SeqCst));
                h.cancel();
            })
        });
        assert_is::<E1>(&*p, "a non-cancellable clean-up");
        assert!(!fiber::is_cancelled());
        assert_eq!(fiber::yield_now(), Ok(()));
    }
}

kotlin_test! {
    /// WithTimeoutTest.testSuppressExceptionWithAnotherException and
    /// WithTimeoutOrNullTest.testSuppressExceptionWithAnotherException: a
    /// block that catches its timeout and throws something else rethrows
    /// that exception, not a timeout (nor null); its job ends failed, the
    /// timeout staying its (first) reason.
    fn a_block_that_panics_on_its_timeout_raises_the_panic_and_fails() {
        let (tx, rx) = fiber::chan::bounded::<Job>(1);
        let p = panic_of("with_timeout", || {
            fiber::with_timeout(ms(10), || -> &str {
                tx.send(Job::current()).unwrap();
                let _ = fiber::sleep(Duration::from_secs(3600));
                panic_any(E1)
            })
        });
        assert_is::<E1>(&*p, "with_timeout");
        let job = rx.recv().unwrap();
        assert_eq!(job.state(), JobState::Failed);
        assert_eq!(job.cancel_reason(), Some(CancelReason::TimedOut));
        assert!(!fiber::is_cancelled());
    }
}

kotlin_test! {
    /// JobExceptionHandlingTest.testExceptionDuringCancellation in try_scope
    /// form: a scope cancelled from outside whose child then fails with an
    /// error: the error is the scope's outcome (failure dominates the
    /// cancellation) and the job ends failed.
    fn a_try_scope_child_error_after_an_outside_cancel_is_returned() {
        let (tx, rx) = fiber::chan::bounded::<Job>(1);
        let started = Arc::new(AtomicBool::new(false));
        let owner = {
            let started = started.clone();
            fiber::spawn(move || {
                fiber::try_scope(|s| {
                    s.spawn(move || -> Result<(), &str> {
                        started.store(true, SeqCst);
                        let _ = fiber::sleep(Duration::from_secs(3600));
                        Err("after cancel")
                    });
                    tx.send(s.job()).unwrap();
                    Ok(())
                })
            })
        };
        let job = rx.recv().unwrap();
        wait_until("the child runs", || started.load(SeqCst));
        assert_eq!(job.cancel_and_join(), Ok(JobState::Failed));
        assert_eq!(owner.join().unwrap(), Err("after cancel"));
    }
}

kotlin_test! {
    /// Kotlin's JobSupport cancels the parent of a failing child
    /// (`cancelParent` in `finalizeFinishingState`) before the child's
    /// state becomes final, so whoever sees the failed child completed (its
    /// `isCompleted` reads true) sees the parent cancelled too
    /// (CoroutinesTest.testCancelParentOnChildException: the parent's next
    /// suspension throws). Here: a sibling polls the failed child's job until
    /// it reads completed, then reads the scope's job and its own
    /// cancellation.
    fn once_a_failed_child_reads_completed_its_parent_is_already_cancelling() {
        let mut stale = Vec::new();
        let mut observed = 0;
        for round in 0..400 {
            let slot: Mutex<Option<Job>> = Mutex::new(None);
            let seen = Mutex::new(None);
            let watching = AtomicBool::new(false);
            let _ = catch_unwind(AssertUnwindSafe(|| {
                fiber::scope(|s| {
                    let (slot, seen, watching) = (&slot, &seen, &watching);
                    let scope_job = s.job();
                    s.spawn(move || {
                        watching.store(true, SeqCst);
                        // Polled, not parked on: the watcher is running
                        // (on the other worker, with two) when the child
                        // fails, and reads `isCompleted` as soon as it can.
                        let mut spins = 0u32;
                        let mut spin = || {
                            std::hint::spin_loop();
                            spins += 1;
                            if spins % 4096 == 0 {
                                let _ = fiber::yield_now();
                            }
                        };
                        let child = loop {
                            if let Some(job) = slot.lock().unwrap().take() {
                                break job;
                            }
                            spin();
                        };
                        while !child.is_completed() {
                            spin();
                        }
                        if child.state() == JobState::Failed {
                            *seen.lock().unwrap() = Some((scope_job.is_cancelled(), fiber::is_cancelled()));
                        }
                    });
                    // The watcher starts before the failing child (a child
                    // of a scope cancelled before it starts never runs).
                    wait_until("the watcher runs", || watching.load(SeqCst));
                    s.spawn(move || -> () {
                        *slot.lock().unwrap() = Some(Job::current());
                        panic_any(E1)
                    });
                })
            }));
            let seen = seen.into_inner().unwrap();
            if let Some(v) = seen {
                observed += 1;
                if v != (true, true) {
                    stale.push((round, v));
                }
            }
        }
        assert!(observed > 0, "the watcher saw the failed child end in some round");
        assert!(
            stale.is_empty(),
            "{} rounds saw the failed child ended but (scope job cancelled, watcher cancelled) = {:?}",
            stale.len(),
            &stale[..stale.len().min(5)]
        );
    }
}
