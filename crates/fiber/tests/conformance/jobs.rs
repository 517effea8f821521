//! Conformance: fiber's jobs and scopes against the documented behaviour of
//! Kotlin's `Job` and structured concurrency (`coroutineScope`,
//! `supervisorScope`, `withTimeout`), as far as spec/jobs.md says fiber
//! mirrors it. Each test names the documented rule it checks.

use fiber::{CancelReason, Job, JobState};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use crate::common::{ms, on_runtime};

/// Park until cancelled (a long sleep that only a cancellation ends).
fn park_until_cancelled() {
    assert!(
        fiber::sleep(Duration::from_secs(3600)).is_err(),
        "only a cancellation ends this sleep"
    );
}

/// Counts its drop: a child's end, whether it ran or was dropped unrun.
struct Ended<'a>(&'a AtomicUsize);

impl Drop for Ended<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn cancelling_one_child_cancels_neither_its_parent_nor_its_siblings() {
    // Kotlin: "Cancellation of a child ... does not cancel its parent";
    // a CancellationException is not a failure.
    on_runtime(|| {
        let sibling_done = AtomicBool::new(false);
        let job = fiber::scope(|s| {
            let victim = s.spawn(park_until_cancelled);
            let sibling = s.spawn(|| {
                for _ in 0..5 {
                    fiber::yield_now().expect("the sibling is not cancelled");
                }
                sibling_done.store(true, Ordering::SeqCst);
            });
            victim.cancel();
            assert!(victim.join().unwrap_err().is_cancelled());
            sibling.join().unwrap();
            assert!(!fiber::is_cancelled(), "the scope's owner is not cancelled");
            assert!(s.job().is_active(), "the scope's job is still active");
            s.job()
        });
        assert!(sibling_done.load(Ordering::SeqCst));
        assert_eq!(
            job.state(),
            JobState::Completed,
            "a cancelled child does not fail the scope"
        );
        assert_eq!(job.cancel_reason(), None);
    })
}

#[test]
fn a_child_that_cancels_itself_ends_cancelled_and_the_scope_completes() {
    on_runtime(|| {
        let job = fiber::scope(|s| {
            let h = s.spawn(|| {
                Job::current().cancel();
                assert!(fiber::check_cancelled().is_err());
                fiber::sleep(ms(1)).expect_err("a cancelled child's sleep fails at once");
            });
            assert!(h.join().unwrap_err().is_cancelled());
            let other = s.spawn(|| 7);
            assert_eq!(other.join().unwrap(), 7, "siblings still run");
            s.job()
        });
        assert_eq!(job.state(), JobState::Completed);
    })
}

#[test]
fn a_panicking_scope_body_cancels_its_children_and_waits_for_them() {
    // Kotlin: when the block of coroutineScope throws, its children are
    // cancelled, the scope waits for them, then rethrows.
    on_runtime(|| {
        let ended = AtomicUsize::new(0);
        let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
            fiber::scope(|s| {
                for _ in 0..3 {
                    let e = Ended(&ended);
                    s.spawn(move || {
                        let _e = e;
                        park_until_cancelled();
                    });
                }
                fiber::yield_now().unwrap();
                std::panic::panic_any(41u32);
            })
        }));
        assert_eq!(
            ended.load(Ordering::SeqCst),
            3,
            "every child ended before the scope returned"
        );
        assert_eq!(
            *r.unwrap_err().downcast::<u32>().unwrap(),
            41,
            "the body's own panic is re-raised"
        );
    })
}

#[test]
fn a_panicking_supervisor_scope_body_cancels_its_children() {
    // Kotlin supervisorScope: "A failure of the scope itself (exception
    // thrown in the block or external cancellation) fails the scope with
    // all its children".
    on_runtime(|| {
        let ended = AtomicUsize::new(0);
        let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
            fiber::supervisor_scope(|s| {
                for _ in 0..3 {
                    let e = Ended(&ended);
                    s.spawn(move || {
                        let _e = e;
                        park_until_cancelled();
                    });
                }
                fiber::yield_now().unwrap();
                panic!("supervisor body fails");
            })
        }));
        assert!(r.is_err());
        assert_eq!(ended.load(Ordering::SeqCst), 3);
    })
}

#[test]
fn cancelling_a_supervisor_scope_cancels_every_child() {
    on_runtime(|| {
        let ended = AtomicUsize::new(0);
        let job = fiber::supervisor_scope(|s| {
            for _ in 0..4 {
                let e = Ended(&ended);
                s.spawn(move || {
                    let _e = e;
                    park_until_cancelled();
                });
            }
            fiber::yield_now().unwrap();
            s.job().cancel();
            s.job()
        });
        assert_eq!(ended.load(Ordering::SeqCst), 4);
        assert_eq!(job.state(), JobState::Cancelled);
        assert_eq!(job.cancel_reason(), Some(CancelReason::Cancelled));
    })
}

#[test]
fn a_supervisor_keeps_running_siblings_after_several_children_fail() {
    on_runtime(|| {
        let survivors = AtomicUsize::new(0);
        let job = fiber::supervisor_scope(|s| {
            let failing: Vec<_> = (0..3)
                .map(|i| s.spawn(move || -> u32 { panic!("child {i}") }))
                .collect();
            let healthy: Vec<_> = (0..3)
                .map(|i| {
                    let survivors = &survivors;
                    s.spawn(move || {
                        for _ in 0..3 {
                            fiber::yield_now().expect("a supervisor's child is not cancelled by a sibling");
                        }
                        survivors.fetch_add(1, Ordering::SeqCst);
                        i
                    })
                })
                .collect();
            for h in failing {
                assert!(h.join().unwrap_err().is_panic());
            }
            let sum: u32 = healthy.into_iter().map(|h| h.join().unwrap()).sum();
            assert_eq!(sum, 3);
            assert!(s.job().is_active());
            s.job()
        });
        assert_eq!(survivors.load(Ordering::SeqCst), 3);
        assert_eq!(
            job.state(),
            JobState::Completed,
            "child failures do not fail a supervisor"
        );
    })
}

#[test]
fn the_first_failure_wins_and_later_ones_do_not_replace_it() {
    // Kotlin: the first exception is the one the parent rethrows; others
    // (here: siblings that fail while being cancelled) are suppressed.
    on_runtime(|| {
        let r: Result<(), String> = fiber::try_scope(|s| {
            for i in 0..3 {
                s.spawn(move || -> Result<(), String> {
                    let _ = fiber::sleep(Duration::from_secs(3600));
                    Err(format!("late {i}"))
                });
            }
            s.spawn(|| -> Result<(), String> { Err("first".to_string()) });
            Ok(())
        });
        assert_eq!(r, Err("first".to_string()));

        // The same with panics in a plain scope: the first payload is
        // re-raised.
        let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
            fiber::scope(|s| {
                s.spawn(|| {
                    let _ = fiber::sleep(Duration::from_secs(3600));
                    std::panic::panic_any("late");
                });
                s.spawn(|| std::panic::panic_any("first"));
            })
        }));
        assert_eq!(*r.unwrap_err().downcast::<&str>().unwrap(), "first");
    })
}

#[test]
fn a_failed_scope_reports_failed_and_its_reason_is_the_child_failure() {
    on_runtime(|| {
        let (tx, rx) = fiber::chan::bounded::<Job>(1);
        let r: Result<(), &str> = fiber::try_scope(|s| {
            tx.send(s.job()).unwrap();
            s.spawn(|| Err::<(), _>("boom"));
            Ok(())
        });
        assert_eq!(r, Err("boom"));
        let job = rx.recv().unwrap();
        assert_eq!(job.state(), JobState::Failed);
        // Kotlin: a failed job is "cancelled" and "completed", not active.
        assert!(job.is_cancelled() && job.is_completed() && !job.is_active());
        assert_eq!(job.cancel_reason(), Some(CancelReason::ChildFailed));
        // Joining a failed job returns normally with its state.
        assert_eq!(job.join(), Ok(JobState::Failed));
        // Cancelling it now changes nothing.
        job.cancel();
        assert_eq!(job.state(), JobState::Failed);
        assert_eq!(job.cancel_reason(), Some(CancelReason::ChildFailed));
    })
}

#[test]
fn a_cancelled_job_is_cancelling_until_its_children_end_then_cancelled() {
    // Kotlin: after cancel(), isActive is false at once, isCompleted only
    // once every child has finished.
    on_runtime(|| {
        let release = AtomicBool::new(false);
        let job = fiber::scope(|s| {
            // A child that ignores cancellation until released.
            s.spawn(|| {
                while !release.load(Ordering::SeqCst) {
                    std::hint::spin_loop();
                    std::thread::yield_now();
                }
            });
            let job = s.job();
            job.cancel();
            assert!(!job.is_active() && job.is_cancelled() && !job.is_completed());
            assert_eq!(job.state(), JobState::Cancelling);
            assert_eq!(job.cancel_reason(), Some(CancelReason::Cancelled));
            release.store(true, Ordering::SeqCst);
            job
        });
        assert_eq!(job.state(), JobState::Cancelled);
        assert!(job.is_completed());
    })
}

#[test]
fn joining_a_scope_job_from_another_fiber_waits_for_every_child() {
    // Kotlin: join() resumes when the job is complete, children included.
    on_runtime(|| {
        let done = std::sync::Arc::new(AtomicUsize::new(0));
        let (tx, rx) = fiber::chan::bounded::<Job>(0);
        let watcher = {
            let done = done.clone();
            fiber::spawn(move || {
                let job = rx.recv().unwrap();
                let state = job.join().unwrap();
                (state, done.load(Ordering::SeqCst))
            })
        };
        fiber::scope(|s| {
            tx.send(s.job()).unwrap();
            for _ in 0..3 {
                let done = done.clone();
                s.spawn(move || {
                    for _ in 0..10 {
                        fiber::yield_now().unwrap();
                    }
                    done.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        assert_eq!(watcher.join().unwrap(), (JobState::Completed, 3));
    })
}

#[test]
fn with_timeout_returns_the_value_in_time_and_timed_out_late_with_the_reason_kept() {
    on_runtime(|| {
        assert_eq!(fiber::with_timeout(Duration::from_secs(60), || 5), Ok(5));
        let (tx, rx) = fiber::chan::bounded::<Job>(1);
        let r = fiber::with_timeout(ms(10), || {
            tx.send(Job::current()).unwrap();
            park_until_cancelled();
        });
        assert_eq!(r, Err(fiber::TimedOut));
        let job = rx.recv().unwrap();
        assert!(job.is_completed() && job.is_cancelled());
        assert_eq!(job.cancel_reason(), Some(CancelReason::TimedOut));
        // Kotlin: the timeout is a TimeoutCancellationException of the
        // block only; the caller's own job is untouched.
        assert!(Job::current().is_active());
        assert_eq!(Job::current().cancel_reason(), None);
    })
}

#[test]
fn with_timeout_cancels_the_children_of_its_block_and_waits_for_them() {
    on_runtime(|| {
        let ended = AtomicUsize::new(0);
        let r = fiber::with_timeout(ms(10), || {
            fiber::scope(|s| {
                for _ in 0..3 {
                    let e = Ended(&ended);
                    s.spawn(move || {
                        let _e = e;
                        park_until_cancelled();
                    });
                }
            })
        });
        assert_eq!(r, Err(fiber::TimedOut));
        assert_eq!(
            ended.load(Ordering::SeqCst),
            3,
            "children ended before with_timeout returned"
        );
    })
}

#[test]
fn a_scope_cancelled_from_outside_reports_cancelled_to_its_owner() {
    // Kotlin: cancelling the parent job of a coroutineScope makes the scope
    // end with a CancellationException; here the owner's fiber sees
    // is_cancelled() and the scope's job ends Cancelled.
    on_runtime(|| {
        let (tx, rx) = fiber::chan::bounded::<Job>(1);
        let owner = fiber::spawn(move || {
            tx.send(Job::current()).unwrap();
            let job = fiber::scope(|s| {
                s.spawn(park_until_cancelled);
                s.spawn(park_until_cancelled);
                s.job()
            });
            (job.state(), fiber::is_cancelled())
        });
        let owner_job = rx.recv().unwrap();
        owner_job.cancel();
        let (scope_state, owner_cancelled) = match owner.join() {
            Ok(v) => v,
            Err(e) => {
                assert!(e.is_cancelled(), "{e:?}");
                (JobState::Cancelled, true)
            }
        };
        assert_eq!(scope_state, JobState::Cancelled);
        assert!(owner_cancelled);
        assert_eq!(owner_job.join(), Ok(JobState::Cancelled));
    })
}

#[test]
fn a_job_joined_by_a_cancelled_fiber_returns_cancelled_and_the_job_runs_on() {
    // Kotlin: join() is cancellable; cancelling the joiner does not cancel
    // the job it joins.
    on_runtime(|| {
        fiber::scope(|s| {
            let (job_tx, job_rx) = fiber::chan::bounded::<Job>(1);
            let (go_tx, go_rx) = fiber::chan::bounded::<()>(0);
            let target = s.spawn(move || {
                job_tx.send(Job::current()).unwrap();
                go_rx.recv().unwrap();
                1
            });
            let target_job = job_rx.recv().unwrap();
            let joiner = {
                let target_job = target_job.clone();
                s.spawn(move || {
                    Job::current().cancel();
                    target_job.join()
                })
            };
            match joiner.join() {
                Ok(r) => assert_eq!(r, Err(fiber::Cancelled)),
                Err(e) => assert!(e.is_cancelled(), "{e:?}"),
            }
            assert!(target_job.is_active(), "the joined job runs on");
            go_tx.send(()).unwrap();
            assert_eq!(target.join().unwrap(), 1);
            assert_eq!(target_job.join(), Ok(JobState::Completed));
        });
    })
}

#[test]
fn cancel_and_join_waits_for_a_child_that_finishes_its_cleanup() {
    // Kotlin's cancelAndJoin: returns once the job (and its cleanup) ended.
    on_runtime(|| {
        let cleaned = AtomicBool::new(false);
        fiber::scope(|s| {
            let (tx, rx) = fiber::chan::bounded::<Job>(1);
            let cleaned = &cleaned;
            let h = s.spawn(move || {
                tx.send(Job::current()).unwrap();
                park_until_cancelled();
                // Cleanup after the cancellation still runs to the end.
                for _ in 0..5 {
                    std::thread::yield_now();
                }
                cleaned.store(true, Ordering::SeqCst);
            });
            let job = rx.recv().unwrap();
            assert_eq!(job.cancel_and_join(), Ok(JobState::Cancelled));
            assert!(
                cleaned.load(Ordering::SeqCst),
                "cancel_and_join returned before the cleanup ended"
            );
            assert!(h.join().unwrap_err().is_cancelled());
        });
    })
}

#[test]
fn with_timeout_of_zero_times_out_at_once_without_running_the_block() {
    // Kotlin: "If the given timeMillis is non-positive,
    // TimeoutCancellationException is thrown immediately."
    on_runtime(|| {
        let ran = AtomicBool::new(false);
        let dropped = AtomicUsize::new(0);
        let guard = Ended(&dropped);
        let r = fiber::with_timeout(Duration::ZERO, || {
            let _guard = &guard;
            ran.store(true, Ordering::SeqCst);
            5
        });
        assert_eq!(r, Err(fiber::TimedOut));
        assert!(!ran.load(Ordering::SeqCst), "the block did not run");
        drop(guard);
        assert_eq!(dropped.load(Ordering::SeqCst), 1);
        assert!(!fiber::is_cancelled(), "the caller is not cancelled");
        assert_eq!(fiber::with_timeout(Duration::from_secs(60), || 5), Ok(5));
    })
}

#[test]
fn a_try_scope_body_returning_err_cancels_its_children() {
    // Kotlin: when the block of coroutineScope fails, its children are
    // cancelled; here the body's own `Err` plays that part.
    on_runtime(|| {
        let ended = AtomicUsize::new(0);
        let r: Result<(), &str> = fiber::try_scope(|s| {
            for _ in 0..2 {
                let e = Ended(&ended);
                s.spawn(move || -> Result<(), &str> {
                    let _e = e;
                    fiber::sleep(Duration::from_secs(3600)).map_err(|_| "cancelled")?;
                    Ok(())
                });
            }
            fiber::yield_now().unwrap();
            Err("body")
        });
        assert_eq!(r, Err("body"), "the body's error, not a cancelled child's");
        assert_eq!(ended.load(Ordering::SeqCst), 2);
    })
}

#[test]
fn a_panicking_try_scope_child_is_re_raised_as_a_panic() {
    on_runtime(|| {
        let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let _: Result<(), &str> = fiber::try_scope(|s| {
                s.spawn(|| -> Result<(), &str> { std::panic::panic_any(17u8) });
                s.spawn(|| -> Result<(), &str> {
                    fiber::sleep(Duration::from_secs(3600)).map_err(|_| "cancelled")?;
                    Ok(())
                });
                Ok(())
            });
        }));
        assert_eq!(*r.unwrap_err().downcast::<u8>().unwrap(), 17);
    })
}

#[test]
fn cancelling_after_a_child_completed_keeps_its_value() {
    // Kotlin: cancelling a completed job has no effect; it stays completed.
    on_runtime(|| {
        fiber::scope(|s| {
            let h = s.spawn(|| 11);
            while !h.is_finished() {
                fiber::yield_now().unwrap();
            }
            h.cancel();
            s.job().cancel();
            assert_eq!(h.join().unwrap(), 11, "a finished child keeps its value");
        });
    })
}

#[test]
fn a_supervisor_inside_a_plain_scope_contains_its_childs_failure() {
    on_runtime(|| {
        let outer_sibling = AtomicBool::new(false);
        let job = fiber::scope(|s| {
            s.spawn(|| {
                fiber::supervisor_scope(|inner| {
                    let h = inner.spawn(|| panic!("contained"));
                    assert!(h.join().unwrap_err().is_panic());
                })
            });
            s.spawn(|| {
                for _ in 0..5 {
                    fiber::yield_now().expect("not cancelled by the contained failure");
                }
                outer_sibling.store(true, Ordering::SeqCst);
            });
            s.job()
        });
        assert!(outer_sibling.load(Ordering::SeqCst));
        assert_eq!(job.state(), JobState::Completed);
    })
}

#[test]
fn a_child_spawned_into_a_cancelling_scope_never_runs_and_reports_cancelled() {
    // spec/jobs.md: "A child created in a job that is already cancelling
    // starts cancelled: its body never runs and its join reports
    // Cancelled" (Kotlin: launch in a cancelled scope).
    on_runtime(|| {
        let ran = AtomicUsize::new(0);
        for _ in 0..50 {
            fiber::scope(|s| {
                s.job().cancel();
                let h = s.spawn(|| ran.fetch_add(1, Ordering::SeqCst));
                assert!(h.join().unwrap_err().is_cancelled());
                // Nested: a scope opened inside a cancelled scope's child
                // context (here: the cancelled scope's body) starts cancelled.
                fiber::scope(|inner| {
                    assert!(
                        inner.job().is_cancelled(),
                        "a scope inside a cancelled job starts cancelled"
                    );
                    let h = inner.spawn(|| ran.fetch_add(1, Ordering::SeqCst));
                    assert!(h.join().unwrap_err().is_cancelled());
                });
            });
        }
        assert_eq!(ran.load(Ordering::SeqCst), 0);
        // Through a plain thread's cancel of a supervisor scope.
        fiber::supervisor_scope(|s| {
            let job = s.job();
            std::thread::spawn(move || job.cancel()).join().unwrap();
            let h = s.spawn(|| ran.fetch_add(1, Ordering::SeqCst));
            assert!(h.join().unwrap_err().is_cancelled());
        });
        assert_eq!(ran.load(Ordering::SeqCst), 0);
    })
}

#[test]
fn a_job_and_its_handles_are_send_sync_and_usable_from_plain_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Job>();
    send_sync::<fiber::ScopedJoinHandle<'static, u8>>();
    on_runtime(|| {
        fiber::scope(|s| {
            let (tx, rx) = fiber::chan::bounded::<Job>(1);
            let h = s.spawn(move || {
                tx.send(Job::current()).unwrap();
                park_until_cancelled();
            });
            let job = rx.recv().unwrap();
            let t = std::thread::spawn(move || {
                assert!(job.is_active());
                job.cancel_and_join()
            });
            assert!(h.join().unwrap_err().is_cancelled());
            assert_eq!(t.join().unwrap(), Ok(JobState::Cancelled));
        });
    })
}

#[test]
fn a_scope_whose_body_returned_stays_active_until_its_children_end() {
    // Kotlin: a job whose body finished but whose children still run is
    // "completing": isActive is true and isCompleted false until the last
    // child ends (spec/jobs.md reports it Active).
    on_runtime(|| {
        let (job_tx, job_rx) = fiber::chan::bounded::<Job>(1);
        let (go_tx, go_rx) = fiber::chan::bounded::<()>(0);
        let body_returned = std::sync::Arc::new(AtomicBool::new(false));
        let owner = {
            let body_returned = body_returned.clone();
            fiber::spawn(move || {
                fiber::scope(|s| {
                    s.spawn(move || go_rx.recv().unwrap());
                    job_tx.send(s.job()).unwrap();
                    body_returned.store(true, Ordering::SeqCst);
                    9
                })
            })
        };
        let job = job_rx.recv().unwrap();
        while !body_returned.load(Ordering::SeqCst) {
            fiber::yield_now().unwrap();
        }
        assert!(job.is_active() && !job.is_completed() && !job.is_cancelled());
        assert_eq!(job.state(), JobState::Active);
        assert!(!owner.is_finished(), "the scope waits for its child");
        go_tx.send(()).unwrap();
        assert_eq!(owner.join().unwrap(), 9);
        assert_eq!(job.join(), Ok(JobState::Completed));
    })
}

/// Kotlin: `isActive` turns false once `withTimeout`'s deadline passes, so
/// `while (isActive) { work() }` ends. On one fixed worker spinning in the
/// body, the watchdog fiber that cancels the job cannot run: the job's
/// own `is_active`, `is_cancelled` and `state` must still see the deadline,
/// as `fiber::is_cancelled()` does (they read only the state word, and the
/// loop ran until its 3 s escape hatch).
#[test]
fn a_jobs_is_active_sees_its_with_timeout_deadline_on_a_busy_worker() {
    let (result, elapsed, seen) = crate::common::within(30, || {
        crate::common::rt1().block_on(|| {
            let start = std::time::Instant::now();
            let mut seen = None;
            let result = fiber::with_timeout(ms(50), || {
                let job = Job::current();
                while job.is_active() {
                    if start.elapsed() > Duration::from_secs(3) {
                        break;
                    }
                }
                seen = Some((
                    fiber::is_cancelled(),
                    job.is_cancelled(),
                    job.is_active(),
                    job.state(),
                    job.is_completed(),
                    job.cancel_reason(),
                ));
            });
            (result, start.elapsed(), seen)
        })
    });
    assert!(result.is_err(), "the body ran past its deadline: TimedOut");
    assert!(elapsed < Duration::from_secs(2), "the is_active loop ran {elapsed:?}");
    assert_eq!(
        seen,
        Some((
            true,
            true,
            false,
            JobState::Cancelling,
            false,
            Some(CancelReason::TimedOut)
        )),
        "(fiber::is_cancelled, is_cancelled, is_active, state, is_completed, cancel_reason) past the deadline"
    );
}
