//! Every row of the design's testing matrix (4.18), each edge case of 4.17
//! and each invariant of 4.16, run on fiber-core's test scheduler and on
//! fiber-sched.

use fiber_chan::bounded;
use fiber_core::testing::TestScheduler;
use fiber_jobs::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn on_both(scenario: fn()) {
    TestScheduler::new().block_on(scenario);
    TestScheduler::with_seed(0xABCD).block_on(scenario);
    let rt = fiber_sched::Runtime::builder().workers(2).build().unwrap();
    rt.block_on(scenario);
}

fn panic_text(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_default()
}

/// Park until cancelled (a cancellable point: a receive that never comes).
fn park_until_cancelled() -> bool {
    let (_tx, rx) = bounded::<()>(0);
    let result = rx.recv_timeout(Duration::from_secs(3600));
    result.is_err() && is_cancelled()
}

#[test]
fn simple_scope_with_3_children_completes() {
    on_both(|| {
        let inputs = [1u32, 2, 3];
        let (sum, job) = scope(|s| {
            let handles: Vec<_> = inputs.iter().map(|x| s.spawn(move || x * 10)).collect();
            (handles.into_iter().map(|h| h.join().unwrap()).sum::<u32>(), s.job())
        });
        assert_eq!(sum, 60);
        assert_eq!(job.state(), JobState::Completed);
    });
}

#[test]
fn child_failure_non_supervisor_fails_parent_and_cancels_siblings() {
    on_both(|| {
        let started = Arc::new(AtomicUsize::new(0));
        let observed = Arc::new(AtomicUsize::new(0));
        let (s2, o2) = (started.clone(), observed.clone());
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            scope(|s| {
                for _ in 0..3 {
                    let (started, observed) = (s2.clone(), o2.clone());
                    s.spawn(move || {
                        started.fetch_add(1, Ordering::Relaxed);
                        if park_until_cancelled() {
                            observed.fetch_add(1, Ordering::Relaxed);
                        }
                    });
                }
                s.spawn(|| panic!("child failed"));
            })
        }));
        let payload = outcome.expect_err("the scope re-raises the child's panic");
        assert_eq!(panic_text(payload), "child failed");
        // Siblings that started saw the cancellation; the others never ran.
        assert_eq!(observed.load(Ordering::Relaxed), started.load(Ordering::Relaxed));
    });
}

#[test]
fn child_failure_supervisor_parent_completes() {
    on_both(|| {
        let (ok, failed, job) = supervisor_scope(|s| {
            let bad = s.spawn(|| -> u32 { panic!("supervised failure") });
            let good = s.spawn(|| 5u32);
            (good.join().unwrap(), bad.join().unwrap_err(), s.job())
        });
        assert_eq!(ok, 5);
        assert!(failed.is_panic());
        assert_eq!(panic_text(failed.into_panic()), "supervised failure");
        assert_eq!(job.state(), JobState::Completed);
    });
}

#[test]
fn external_cancel_before_children_start() {
    on_both(|| {
        let ran = Arc::new(AtomicUsize::new(0));
        let job = scope(|s| {
            s.job().cancel();
            let handles: Vec<_> = (0..5)
                .map(|_| {
                    let ran = ran.clone();
                    s.spawn(move || ran.fetch_add(1, Ordering::Relaxed))
                })
                .collect();
            for h in handles {
                assert!(
                    h.join().unwrap_err().is_cancelled(),
                    "children of a cancelled job are cancelled"
                );
            }
            s.job()
        });
        assert_eq!(ran.load(Ordering::Relaxed), 0, "no child body ran");
        assert_eq!(job.state(), JobState::Cancelled);
    });
}

#[test]
fn timeout_fires_first() {
    on_both(|| {
        let result = with_timeout(Duration::from_millis(20), || {
            assert!(park_until_cancelled(), "the body sees the timeout as cancellation");
            "finished"
        });
        assert_eq!(result, Err(TimedOut));
        assert_eq!(with_timeout(Duration::from_secs(60), || 7), Ok(7));
    });
}

#[test]
fn deferred_value_await_success() {
    on_both(|| {
        let value = scope(|s| s.spawn(|| String::from("payload")).join());
        assert_eq!(value.unwrap(), "payload");
    });
}

#[test]
fn deferred_failure() {
    on_both(|| {
        let result: Result<(), &str> = try_scope(|s| {
            let h = s.spawn(|| -> Result<u8, &str> { Err("bad input") });
            let err = h.join().unwrap_err();
            assert!(err.is_failed(), "the child's join reports the failure: {err}");
            Ok(())
        });
        assert_eq!(result, Err("bad input"), "the first Err is what try_scope returns");
        let panicked =
            scope(|_| supervisor_scope(|inner| inner.spawn(|| -> u8 { panic!("deferred panic") }).join()).unwrap_err());
        assert!(panicked.is_panic());
    });
}

#[test]
fn cancellation_during_await() {
    on_both(|| {
        scope(|s| {
            let (release_tx, release_rx) = bounded::<u32>(0);
            let (waiting_tx, waiting_rx) = bounded::<()>(0);
            let (seen_tx, seen_rx) = bounded::<bool>(1);
            let (done_tx, done_rx) = bounded::<u32>(1);
            let target = s.spawn(move || {
                let v = release_rx.recv().unwrap();
                done_tx.send(v).unwrap();
                v
            });
            let awaiter = s.spawn(move || {
                waiting_tx.send(()).unwrap();
                let inner = target.join();
                seen_tx.send(inner.is_err_and(|e| e.is_cancelled())).unwrap();
            });
            waiting_rx.recv().unwrap();
            awaiter.cancel();
            assert!(seen_rx.recv().unwrap(), "the await returned Cancelled");
            assert!(
                awaiter.join().unwrap_err().is_cancelled(),
                "a job cancelled before it finished ends cancelled"
            );
            // The awaited fiber runs on undisturbed.
            release_tx.send(1).unwrap();
            assert_eq!(done_rx.recv().unwrap(), 1);
        });
    });
}

#[test]
fn nested_scopes_with_inner_failure() {
    on_both(|| {
        let order = Arc::new(Mutex::new(Vec::new()));
        let log = order.clone();
        let outer = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            scope(|outer| {
                let (outer_ready_tx, outer_ready_rx) = bounded::<()>(1);
                let log2 = log.clone();
                outer.spawn(move || {
                    outer_ready_tx.send(()).unwrap();
                    if park_until_cancelled() {
                        log2.lock().unwrap().push("outer sibling cancelled");
                    }
                });
                outer.spawn(move || {
                    outer_ready_rx.recv().unwrap();
                    scope(|inner| {
                        let (inner_ready_tx, inner_ready_rx) = bounded::<()>(1);
                        let log3 = log.clone();
                        inner.spawn(move || {
                            inner_ready_tx.send(()).unwrap();
                            if park_until_cancelled() {
                                log3.lock().unwrap().push("inner sibling cancelled");
                            }
                        });
                        inner.spawn(move || {
                            inner_ready_rx.recv().unwrap();
                            panic!("inner failure")
                        });
                    });
                });
            })
        }));
        assert_eq!(panic_text(outer.unwrap_err()), "inner failure");
        let mut order = order.lock().unwrap().clone();
        order.sort();
        assert_eq!(order, ["inner sibling cancelled", "outer sibling cancelled"]);
    });
}

#[test]
fn detached_child_failure_leaves_parent_unaffected() {
    on_both(|| {
        let (detached, job) = scope(|s| (fiber_core::spawn(|| -> u8 { panic!("detached failure") }), s.job()));
        assert!(detached.join().unwrap_err().is_panic());
        assert_eq!(job.state(), JobState::Completed);
    });
}

#[test]
fn race_failure_vs_external_cancel_failure_dominates() {
    on_both(|| {
        for round in 0..20 {
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                scope(|s| {
                    let (started_tx, started_rx) = bounded::<()>(1);
                    s.spawn(move || {
                        started_tx.send(()).unwrap();
                        for _ in 0..(round % 3) {
                            let _ = fiber_core::yield_now();
                        }
                        panic!("failure");
                    });
                    let job = s.job();
                    s.spawn(move || {
                        let _ = started_rx.recv();
                        for _ in 0..(round % 2) {
                            let _ = fiber_core::yield_now();
                        }
                        job.cancel();
                    });
                })
            }));
            assert_eq!(
                panic_text(outcome.unwrap_err()),
                "failure",
                "round {round}: failure dominates"
            );
        }
    });
}

struct DropCount(Arc<AtomicUsize>);

impl Drop for DropCount {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

#[test]
fn many_siblings_1k_cancel_stress() {
    on_both(|| {
        let ended = Arc::new(AtomicUsize::new(0));
        let job = scope(|s| {
            let handles: Vec<_> = (0..1000)
                .map(|_| {
                    // Dropped exactly once, whether the child ran or was
                    // cancelled before it started.
                    let token = DropCount(ended.clone());
                    s.spawn(move || {
                        let _token = token;
                        park_until_cancelled()
                    })
                })
                .collect();
            let _ = fiber_core::yield_now();
            s.job().cancel();
            // Each child was cancelled before it finished: its join reports
            // cancelled (the value it returned is dropped).
            for h in handles {
                assert!(h.join().unwrap_err().is_cancelled());
            }
            s.job()
        });
        assert_eq!(job.state(), JobState::Cancelled);
        assert_eq!(ended.load(Ordering::Relaxed), 1000, "every child ended once");
        // Exact counts (no job leaked, one request per job, linear in the
        // tree's size): tests/cancel_linear.rs, in a process of its own.
    });
}

/// 32 fibers block in `Job::join` on one job (no polling): each returns
/// once, with the job's final state, after the job ends. The exact count of
/// registrations and wakes (32 each) is asserted in `tests/counters.rs`,
/// which has its process to itself.
#[test]
fn waiters_storm_32_awaits_all_woken_exactly_once() {
    on_both(|| {
        let (release_tx, release_rx) = bounded::<()>(0);
        let (job_tx, job_rx) = bounded::<Job>(1);
        let returned = Arc::new(AtomicUsize::new(0));
        scope(|s| {
            let target = s.spawn(move || {
                job_tx.send(Job::current()).unwrap();
                release_rx.recv().unwrap();
                42
            });
            let job = job_rx.recv().unwrap();
            let waiters: Vec<_> = (0..32)
                .map(|_| {
                    let (job, returned) = (job.clone(), returned.clone());
                    s.spawn(move || {
                        let state = job.join();
                        returned.fetch_add(1, Ordering::Relaxed);
                        state
                    })
                })
                .collect();
            // Let every waiter reach its join: none returns before the
            // target is released.
            for _ in 0..64 {
                let _ = fiber_core::yield_now();
            }
            assert_eq!(
                returned.load(Ordering::Relaxed),
                0,
                "a joiner returned before the job ended"
            );
            assert!(job.is_active());
            release_tx.send(()).unwrap();
            for w in waiters {
                assert_eq!(w.join().unwrap(), Ok(JobState::Completed));
            }
            assert_eq!(target.join().unwrap(), 42);
        });
        assert_eq!(returned.load(Ordering::Relaxed), 32);
    });
}

#[test]
fn current_job_and_check_cancelled() {
    on_both(|| {
        assert!(!Job::current().is_cancelled());
        scope(|s| {
            let job = Job::current();
            assert_eq!(job.id(), s.job().id());
            assert_eq!(check_cancelled(), Ok(()));
            job.cancel();
            assert_eq!(check_cancelled(), Err(Cancelled));
            assert_eq!(job.cancel_reason(), Some(CancelReason::Cancelled));
        });
    });
}

#[test]
fn timeout_loses_to_an_explicit_reason() {
    on_both(|| {
        let (timed, enclosing) = scope(|s| {
            let enclosing = s.job();
            let (job_tx, job_rx) = bounded::<Job>(1);
            s.spawn(move || {
                with_timeout(Duration::from_millis(200), || {
                    job_tx.send(Job::current()).unwrap();
                    park_until_cancelled()
                })
            });
            // The timeout's own job, parked inside the block.
            let timed = job_rx.recv().unwrap();
            // An explicit cancel of the enclosing job, before the deadline.
            enclosing.cancel();
            (timed, enclosing)
        });
        // The scope waited for its child, so the timeout's job has ended,
        // with the explicit reason, not TimedOut.
        assert_eq!(timed.state(), JobState::Cancelled);
        assert_eq!(timed.cancel_reason(), Some(CancelReason::Cancelled), "not TimedOut");
        assert_eq!(enclosing.cancel_reason(), Some(CancelReason::Cancelled));
    });
}

#[test]
fn job_state_machine_rejects_illegal_edges() {
    assert!(is_legal(JobState::Active, JobState::Cancelling, JobActor::Canceller));
    assert!(is_legal(JobState::Cancelling, JobState::Failed, JobActor::Finalizer));
    assert!(!is_legal(JobState::Completed, JobState::Active, JobActor::Finalizer));
    assert!(!is_legal(
        JobState::Cancelled,
        JobState::Cancelling,
        JobActor::Canceller
    ));
    assert!(
        !is_legal(JobState::Active, JobState::Cancelled, JobActor::Finalizer),
        "must pass through CANCELLING"
    );
}

#[test]
fn scope_outside_a_fiber_is_refused_with_a_message() {
    let err = std::panic::catch_unwind(|| scope(|_| ())).unwrap_err();
    assert!(panic_text(err).contains("outside a fiber"));
}

#[test]
fn job_join_and_kotlin_style_predicates() {
    on_both(|| {
        let job = scope(|s| {
            assert_eq!(s.spawn(|| 3).join().unwrap(), 3);
            s.job()
        });
        assert!(job.is_completed() && !job.is_active());
        assert!(
            !job.is_cancelled(),
            "a job that completed normally is not cancelled (Kotlin)"
        );
        assert_eq!(job.join(), Ok(JobState::Completed));
        let inner = scope(|s| {
            let job = s.job();
            assert!(job.is_active() && !job.is_completed());
            let watcher = {
                let job = job.clone();
                fiber_core::spawn(move || job.join())
            };
            job.cancel();
            (job, watcher)
        });
        assert_eq!(inner.1.join().unwrap(), Ok(JobState::Cancelled));
        assert!(inner.0.is_completed() && inner.0.is_cancelled());
        let state = scope(|s| {
            let (job_tx, job_rx) = bounded(1);
            s.spawn(move || {
                supervisor_scope(|inner| {
                    job_tx.send(inner.job()).unwrap();
                    park_until_cancelled();
                })
            });
            job_rx.recv().unwrap().cancel_and_join()
        });
        assert_eq!(state, Ok(JobState::Cancelled));
    });
}
