//! Adversarial review, round 58: structured concurrency (fiber-jobs)
//! checked against Kotlin's `Job` (kotlinx.coroutines) and
//! `std::thread::scope`, in combinations earlier rounds did not cover:
//! nested scopes of mixed kinds (a supervisor inside a scope inside a
//! `with_timeout`, a `try_scope` inside a supervisor's child), nested
//! deadlines of every order, children that open scopes after their parent
//! was cancelled, scopes driven from plain threads and across runtimes,
//! `Job` handles that outlive their runtime, exact job counters of a mixed
//! tree, a 10,000-node tree cancelled at once, shutdown of a runtime whose
//! fiber is parked deep in mixed scopes, and cancellation racing
//! completion at every level of a small tree.
//!
//! Expected: spec/jobs.md, the rustdoc of `fiber_jobs`, Kotlin's `Job`
//! documentation where fiber does not document a difference, and std's
//! `thread::scope`.

use crate::common::*;

use fiber::{CancelReason, Job, JobState};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// A long sleep, as a `Result` the caller can inspect.
fn long_sleep() -> Result<(), fiber::Cancelled> {
    fiber::sleep(Duration::from_secs(30))
}

/// Counts its drops.
struct Guard(Arc<AtomicUsize>);

impl Drop for Guard {
    fn drop(&mut self) {
        self.0.fetch_add(1, SeqCst);
    }
}

/// A value whose destructor panics (once per value), counting its drops.
struct PanicOnDrop(Arc<AtomicUsize>);

impl Drop for PanicOnDrop {
    fn drop(&mut self) {
        self.0.fetch_add(1, SeqCst);
        panic!("r58: value dropped");
    }
}

// ---------------------------------------------------------------------------
// (a) Nested scopes of mixed kinds.

/// `with_timeout` { scope { sibling, child { supervisor_scope { a child
/// that panics, a child that sleeps } } } }: the supervised panic stays
/// with its child (Kotlin's supervisorScope) even two levels inside a
/// regular scope, so nothing cancels the sleeping fibers before the
/// deadline; the deadline then ends every level, and the sleepers report
/// a timeout (not a plain cancellation or a failure), and no panic leaves
/// the `with_timeout`.
#[test]
fn supervisor_in_scope_in_with_timeout_keeps_the_panic_local_and_times_out_the_rest() {
    let (outer, sib, bad, slow, elapsed) = on_runtime(|| {
        let t0 = Instant::now();
        let seen = Mutex::new(None);
        let sup_seen = Mutex::new(None);
        let outer = fiber::with_timeout(ms(150), || {
            fiber::scope(|s| {
                let sib = s.spawn(long_sleep);
                let sup = s.spawn(|| {
                    fiber::supervisor_scope(|sv| {
                        let bad = sv.spawn(|| -> u32 { panic!("r58 supervised") });
                        let slow = sv.spawn(long_sleep);
                        let bad = bad.join().map_err(|e| panic_text(e.into_panic()));
                        let slow = slow.join().map_err(|e| (e.is_timed_out(), e.is_cancelled()));
                        *sup_seen.lock().unwrap() = Some((bad, slow));
                    })
                });
                let sib = sib.join().map_err(|e| (e.is_timed_out(), e.is_cancelled()));
                let sup = sup.join().map_err(|e| (e.is_timed_out(), e.is_panic()));
                *seen.lock().unwrap() = Some((sib, sup));
            })
        });
        let (sib, sup) = seen.lock().unwrap().take().expect("the scope's body ran");
        assert_eq!(
            sup,
            Err((true, false)),
            "the supervisor's owner timed out, it did not fail"
        );
        let (bad, slow) = sup_seen.lock().unwrap().take().expect("the supervisor's body ran");
        (outer, sib, bad, slow, t0.elapsed())
    });
    assert_eq!(outer, Err(fiber::TimedOut));
    assert_eq!(bad, Err("r58 supervised".to_string()));
    assert_eq!(
        slow,
        Err((true, true)),
        "the supervised sleeper is ended by the deadline"
    );
    assert_eq!(sib, Err((true, true)), "the outer sibling is ended by the deadline");
    assert!(elapsed >= ms(140), "nothing ended before the deadline ({elapsed:?})");
    assert!(
        elapsed < Duration::from_secs(10),
        "the deadline ended the tree ({elapsed:?})"
    );
}

/// supervisor_scope { a: scope { a1 panics, a2 sleeps }, b: try_scope {
/// b1 returns Err, b2 sleeps }, c: sleeps 50 ms }: each inner regular
/// scope fails and cancels its own siblings (a2, b2), the failures stay
/// with the supervisor's children (a's join reports a1's panic, b's value
/// is b1's error), and c, their supervised sibling, is never cancelled.
#[test]
fn failing_inner_scopes_of_a_supervisors_children_cancel_only_their_own_siblings() {
    on_runtime(|| {
        let a2_cancelled = AtomicBool::new(false);
        let b2_cancelled = AtomicBool::new(false);
        let (a, b, c) = fiber::supervisor_scope(|sv| {
            let a = sv.spawn(|| {
                fiber::scope(|s| {
                    s.spawn(|| {
                        fiber::sleep(ms(5)).unwrap();
                        panic!("r58 a1")
                    });
                    s.spawn(|| a2_cancelled.store(long_sleep().is_err(), SeqCst));
                })
            });
            let b = sv.spawn(|| {
                fiber::try_scope(|s| {
                    s.spawn(|| -> Result<(), &'static str> {
                        fiber::sleep(ms(5)).unwrap();
                        Err("r58 b1")
                    });
                    s.spawn(|| -> Result<(), &'static str> {
                        b2_cancelled.store(long_sleep().is_err(), SeqCst);
                        Ok(())
                    });
                    Ok(())
                })
            });
            let c = sv.spawn(|| fiber::sleep(ms(50)).map(|()| Job::current().state()));
            let a = a.join().map_err(|e| panic_text(e.into_panic()));
            (a, b.join().unwrap(), c.join().unwrap())
        });
        assert_eq!(a, Err("r58 a1".to_string()));
        assert_eq!(b, Err("r58 b1"));
        assert_eq!(c, Ok(JobState::Active), "the supervised sibling ran undisturbed");
        assert!(a2_cancelled.load(SeqCst));
        assert!(b2_cancelled.load(SeqCst));
    });
}

/// A supervisor scope's own body panicking (not a child) fails it and
/// cancels its children, as Kotlin's `supervisorScope` "fails if the
/// block fails"; nested in a regular scope's child, that child's panic
/// then cancels the regular scope's other children too.
#[test]
fn a_supervisor_body_panic_nested_in_a_scope_cancels_the_whole_tree() {
    let msg = panic_message(|| {
        on_runtime(|| {
            let cancelled = AtomicUsize::new(0);
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                fiber::scope(|s| {
                    s.spawn(|| {
                        if long_sleep().is_err() {
                            cancelled.fetch_add(1, SeqCst);
                        }
                    });
                    s.spawn(|| {
                        fiber::supervisor_scope(|sv| {
                            for _ in 0..3 {
                                sv.spawn(|| {
                                    if long_sleep().is_err() {
                                        cancelled.fetch_add(1, SeqCst);
                                    }
                                });
                            }
                            fiber::sleep(ms(10)).unwrap();
                            panic!("r58 supervisor body");
                        })
                    });
                })
            }));
            assert_eq!(cancelled.load(SeqCst), 4, "every sleeper was cancelled");
            if let Err(p) = r {
                std::panic::resume_unwind(p);
            }
        })
    });
    assert_eq!(msg.as_deref(), Some("r58 supervisor body"));
}

// ---------------------------------------------------------------------------
// (b) Nested deadlines.

/// Three nested `with_timeout`s, middle longest: the innermost (30 ms)
/// fires first and ends only its block; the outermost (250 ms) then ends
/// the middle one (10 s), which reports `Err(TimedOut)` because the outer
/// deadline cut it (spec/jobs.md: "a with_timeout checks the job's
/// deadline, not only its own"); the jobs of the levels record the same.
#[test]
fn three_nested_deadlines_fire_innermost_first_then_outermost_and_each_level_reports_it() {
    on_runtime(|| {
        let t0 = Instant::now();
        let mut inner = None;
        let mut middle = None;
        let mut jobs = Vec::new();
        let outer = fiber::with_timeout(ms(250), || {
            jobs.push(Job::current());
            middle = Some(fiber::with_timeout(Duration::from_secs(10), || {
                jobs.push(Job::current());
                inner = Some(fiber::with_timeout(ms(30), || {
                    jobs.push(Job::current());
                    long_sleep()
                }));
                let at_inner = t0.elapsed();
                // The outer levels are still active after the inner timeout.
                let still = Job::current().is_active();
                (at_inner, still, long_sleep())
            }));
        });
        let elapsed = t0.elapsed();
        assert_eq!(outer, Err(fiber::TimedOut));
        assert_eq!(inner, Some(Err(fiber::TimedOut)));
        assert_eq!(middle.map(|m| m.map(|_| ())), Some(Err(fiber::TimedOut)));
        assert!(elapsed >= ms(240), "the outer deadline ended it ({elapsed:?})");
        assert!(
            elapsed < Duration::from_secs(9),
            "not the middle deadline ({elapsed:?})"
        );
        for (i, job) in jobs.iter().enumerate() {
            assert_eq!(job.state(), JobState::Cancelled, "level {i}");
            assert_eq!(job.cancel_reason(), Some(CancelReason::TimedOut), "level {i}");
        }
    });
}

/// Inner shorter than outer, inside a scope's child: the inner timeout
/// ends only the inner block; the child goes on, finishes normally, and
/// its join is `Ok`; the outer `with_timeout` returns `Ok`.
#[test]
fn an_inner_timeout_in_a_scoped_child_leaves_the_child_and_the_outer_block_running() {
    on_runtime(|| {
        let r = fiber::with_timeout(Duration::from_secs(20), || {
            fiber::scope(|s| {
                let h = s.spawn(|| {
                    let inner = fiber::with_timeout(ms(20), long_sleep);
                    let after = fiber::sleep(ms(5));
                    (inner, after, Job::current().is_active())
                });
                h.join().unwrap()
            })
        });
        assert_eq!(r, Ok((Err(fiber::TimedOut), Ok(()), true)));
    });
}

/// An explicit cancel (through the fiber's `JoinHandle`) of a fiber
/// inside with_timeout { scope { child } }: the explicit reason wins over
/// the (long) deadline at every level: the child's join is a plain
/// cancellation, not a timeout, and the `with_timeout` does not report
/// `TimedOut`.
#[test]
fn a_handle_cancel_through_with_timeout_and_scope_is_a_plain_cancellation_at_every_level() {
    on_runtime(|| {
        let (tx, rx) = fiber::chan::bounded(1);
        let h = fiber::spawn(move || {
            let r = fiber::with_timeout(Duration::from_secs(20), || {
                fiber::scope(|s| {
                    let c = s.spawn(long_sleep);
                    c.join().map_err(|e| (e.is_cancelled(), e.is_timed_out()))
                })
            });
            let _ = fiber::non_cancellable(|| tx.send(r));
        });
        wait_until("the child to park", 10, || {
            fiber::dump()
                .fibers
                .iter()
                .filter(|f| f.state == fiber::core::state::FiberState::Parked)
                .count()
                >= 3
        });
        h.cancel();
        let r = rx.recv().unwrap();
        assert_eq!(r, Ok(Err((true, false))));
        assert!(h.join().unwrap_err().is_cancelled());
    });
}

// ---------------------------------------------------------------------------
// (c) Children that open scopes after their parent was cancelled.

/// A scoped child that did not see its scope's cancel yet (it spins with
/// no cancellation point) opens a scope, a supervisor scope and a
/// `with_timeout`: each is a child of a cancelling job and starts
/// cancelled, so none of their children's bodies run and their joins
/// report a cancellation; a scope opened inside `non_cancellable` gets no
/// parent and runs its child.
#[test]
fn scopes_opened_by_a_child_after_its_parent_was_cancelled_start_cancelled() {
    let (ran, joins, timed, held_off, child) = within(30, || {
        rt2().block_on(|| {
            let go = AtomicBool::new(false);
            let started = AtomicBool::new(false);
            let ran = AtomicUsize::new(0);
            let seen = Mutex::new(None);
            let child = fiber::scope(|s| {
                let h = s.spawn(|| {
                    started.store(true, SeqCst);
                    assert!(spin_until(&go, Duration::from_secs(10)), "the parent was cancelled");
                    let mut joins = Vec::new();
                    fiber::scope(|inner| {
                        let hs: Vec<_> = (0..3).map(|_| inner.spawn(|| ran.fetch_add(1, SeqCst))).collect();
                        joins.extend(hs.into_iter().map(|h| h.join().unwrap_err().is_cancelled()));
                    });
                    fiber::supervisor_scope(|inner| {
                        let hs: Vec<_> = (0..3).map(|_| inner.spawn(|| ran.fetch_add(1, SeqCst))).collect();
                        joins.extend(hs.into_iter().map(|h| h.join().unwrap_err().is_cancelled()));
                    });
                    let timed = fiber::with_timeout(Duration::from_secs(20), || {
                        (Job::current().is_cancelled(), long_sleep().is_err())
                    });
                    let held_off = fiber::non_cancellable(|| {
                        fiber::scope(|inner| inner.spawn(|| ran.fetch_add(100, SeqCst)).join().is_ok())
                    });
                    *seen.lock().unwrap() = Some((joins, timed, held_off));
                });
                // The child spins: cancel, then let it go on.
                wait_until("the child to start", 10, || started.load(SeqCst));
                s.cancel();
                go.store(true, SeqCst);
                h.join().map_err(|e| e.is_cancelled())
            });
            let (joins, timed, held_off) = seen.lock().unwrap().take().expect("the child finished");
            (ran.load(SeqCst), joins, timed, held_off, child)
        })
    });
    assert_eq!(ran, 100, "only the non-cancellable section's child ran");
    assert_eq!(joins, vec![true; 6]);
    assert_eq!(timed, Ok((true, true)), "an explicit cancel, not a timeout");
    assert!(held_off);
    assert_eq!(child, Err(true), "the cancelled child ends cancelled");
}

// ---------------------------------------------------------------------------
// (d) Plain threads and other runtimes.

/// A scope's `Job` joined from a plain thread and from a detached fiber
/// (neither inside the job): both joins return only after every child
/// and grandchild has dropped what it owns (Kotlin: "a parent completes
/// only after all its children"; std: the scope returns after every
/// thread), and both report `Completed`.
#[test]
fn a_scopes_job_joined_from_a_thread_and_a_detached_fiber_ends_after_every_grandchild() {
    on_runtime(|| {
        let drops = Arc::new(AtomicUsize::new(0));
        let (job_tx, job_rx) = mpsc::channel::<Job>();
        let thread = std::thread::spawn(move || {
            let job = job_rx.recv().unwrap();
            let st = job.join();
            (st, job.is_completed())
        });
        let seen_by_fiber = Arc::new(AtomicUsize::new(usize::MAX));
        fiber::scope(|s| {
            let job = s.job();
            job_tx.send(job.clone()).unwrap();
            let (d, seen) = (drops.clone(), seen_by_fiber.clone());
            let detached = fiber::spawn(move || {
                let st = job.join();
                seen.store(d.load(SeqCst), SeqCst);
                st
            });
            for i in 0..3u64 {
                let d = drops.clone();
                s.spawn(move || {
                    fiber::scope(|inner| {
                        for j in 0..3u64 {
                            let g = Guard(d.clone());
                            inner.spawn(move || {
                                fiber::sleep(ms(1 + (i * 3 + j) % 7)).unwrap();
                                drop(g);
                            });
                        }
                    });
                    fiber::sleep(ms(2)).unwrap();
                    drop(Guard(d));
                });
            }
            // The detached joiner must not be inside the job.
            let _ = detached;
        });
        assert_eq!(drops.load(SeqCst), 12);
        let (st, done) = thread.join().unwrap();
        assert_eq!(st, Ok(JobState::Completed));
        assert!(done);
        wait_until("the detached joiner", 10, || seen_by_fiber.load(SeqCst) != usize::MAX);
        assert_eq!(
            seen_by_fiber.load(SeqCst),
            12,
            "the detached join returned before the tree ended"
        );
    });
}

/// A plain thread borrowing a fiber's scope spawns into it: while the
/// scope is active its child runs on the runtime, in the scope's job; once
/// the scope is cancelled, a child the thread spawns starts cancelled
/// (its body never runs) and the thread's join reports the cancellation.
#[test]
fn a_plain_thread_spawning_into_a_cancelled_scope_gets_children_that_never_run() {
    on_runtime(|| {
        let ran = AtomicUsize::new(0);
        let (first, second) = fiber::scope(|s| {
            let ran = &ran;
            // The body blocks its worker in std's scope; the children run
            // on the other worker.
            std::thread::scope(|ts| {
                ts.spawn(|| {
                    let first = s
                        .spawn(move || {
                            ran.fetch_add(1, SeqCst);
                            (fiber::core::in_fiber(), Job::current().is_active())
                        })
                        .join()
                        .map_err(|e| e.to_string());
                    s.cancel();
                    let second = s.spawn(move || ran.fetch_add(10, SeqCst)).join();
                    (first, second.map_err(|e| (e.is_cancelled(), e.is_panic())))
                })
                .join()
                .unwrap()
            })
        });
        assert_eq!(first, Ok((true, true)));
        assert_eq!(second, Err((true, false)));
        assert_eq!(ran.load(SeqCst), 1, "the child spawned after the cancel never ran");
    });
}

/// A fiber of runtime A `cancel_and_join`s a scope's job of runtime B:
/// the scope's children (parked on B) are cancelled, B's scope returns,
/// and A's join returns `Cancelled` only after B's children dropped what
/// they own; then B's root is done.
#[test]
fn cancel_and_join_of_another_runtimes_scope_from_a_fiber() {
    within(30, || {
        let drops = Arc::new(AtomicUsize::new(0));
        let (job_tx, job_rx) = mpsc::channel::<Job>();
        let d = drops.clone();
        let b = std::thread::spawn(move || {
            rt2().block_on(move || {
                fiber::scope(|s| {
                    for _ in 0..4 {
                        let g = Guard(d.clone());
                        s.spawn(move || {
                            let r = long_sleep();
                            drop(g);
                            r
                        });
                    }
                    job_tx.send(s.job()).unwrap();
                    long_sleep().is_err()
                })
            })
        });
        let job = job_rx.recv().unwrap();
        let d = drops.clone();
        let (st, seen) = rt2().block_on(move || {
            fiber::sleep(ms(20)).unwrap();
            let st = job.cancel_and_join();
            (st, d.load(SeqCst))
        });
        assert_eq!(st, Ok(JobState::Cancelled));
        assert_eq!(seen, 4, "the join returned before B's children ended");
        assert!(b.join().unwrap(), "B's scope body saw the cancel");
    });
}

// ---------------------------------------------------------------------------
// (e) Job handles that outlive their runtime.

/// Jobs of every kind taken out of a runtime that has since been dropped:
/// each is ended, with the state and reason it ended with; `join` from a
/// plain thread returns that state at once, and `cancel` /
/// `cancel_and_join` change nothing (Kotlin: cancel of a completed job is
/// a no-op).
#[test]
fn job_handles_outliving_their_runtime_keep_their_final_state_and_ignore_cancel() {
    let jobs = within(30, || {
        rt2().block_on(|| {
            let mut jobs: Vec<(&'static str, Job)> = Vec::new();
            jobs.push(("root", Job::current()));
            fiber::scope(|s| {
                jobs.push(("scope", s.job()));
                let (tx, rx) = mpsc::channel();
                s.spawn(move || tx.send(Job::current()).unwrap()).join().unwrap();
                jobs.push(("child", rx.recv().unwrap()));
            });
            let mut timed = None;
            let _ = fiber::with_timeout(ms(10), || {
                timed = Some(Job::current());
                long_sleep()
            });
            jobs.push(("timed out", timed.unwrap()));
            fiber::supervisor_scope(|sv| {
                let (tx, rx) = mpsc::channel();
                let h = sv.spawn(move || {
                    tx.send(Job::current()).unwrap();
                    panic!("r58 supervised child")
                });
                assert!(h.join().unwrap_err().is_panic());
                jobs.push(("failed child", rx.recv().unwrap()));
                jobs.push(("supervisor", sv.job()));
            });
            let cancelled = fiber::scope(|s| {
                s.cancel();
                s.job()
            });
            jobs.push(("cancelled scope", cancelled));
            jobs
        })
    });
    let expect = |name: &str| match name {
        "timed out" => (JobState::Cancelled, Some(CancelReason::TimedOut)),
        "cancelled scope" => (JobState::Cancelled, Some(CancelReason::Cancelled)),
        "failed child" => (JobState::Failed, Some(CancelReason::ChildFailed)),
        _ => (JobState::Completed, None),
    };
    let jobs = std::thread::spawn(move || {
        for (name, job) in &jobs {
            let (state, reason) = expect(name);
            assert_eq!(job.state(), state, "{name}");
            assert_eq!(job.cancel_reason(), reason, "{name}");
            assert_eq!(job.join(), Ok(state), "{name}");
            job.cancel();
            assert_eq!(job.cancel_and_join(), Ok(state), "{name}");
            assert_eq!(job.cancel_reason(), reason, "{name} after cancel");
            assert!(job.is_completed() && !job.is_active(), "{name}");
            assert_eq!(job.is_cancelled(), state != JobState::Completed, "{name}");
        }
        jobs.len()
    })
    .join()
    .unwrap();
    assert_eq!(jobs, 7);
}

// ---------------------------------------------------------------------------
// (f) Exact counters of the job tree (process-wide: each in a child
// process of its own).

/// A mixed tree whose every job's path is known: each counter moves by
/// exactly the number of jobs that took that edge (spec/jobs.md section
/// 4: "each counter counts its event once").
#[test]
fn job_counters_of_a_mixed_tree_are_exact() {
    in_child("job_counters_of_a_mixed_tree_are_exact", 60, || {
        quiet_r58_panics();
        rt2().block_on(|| {
            // The root fiber's own job, made before the baseline.
            let _ = Job::current();
            let before = fiber_jobs_stats();
            // 1. scope { ok child, panicking child joined by the body }:
            //    3 created; the panicking child and the scope cancelled
            //    (2 requests); 1 completed, 2 failed.
            let v = fiber::scope(|s| {
                // The ok child ends before the other one panics.
                let a = s.spawn(|| 1).join().unwrap();
                let b = s.spawn(|| -> u32 { panic!("r58 counted") });
                (a, b.join().is_err())
            });
            assert_eq!(v, (1, true));
            // 2. supervisor { panicking child, ok child }: 3 created, 1
            //    request (the failing child's own), 2 completed, 1 failed.
            fiber::supervisor_scope(|s| {
                assert!(s.spawn(|| -> u32 { panic!("r58 counted") }).join().is_err());
                assert_eq!(s.spawn(|| 2).join().unwrap(), 2);
            });
            // 3. A with_timeout that times out: 1 created, 1 request, 1
            //    cancelled.
            assert_eq!(fiber::with_timeout(ms(5), long_sleep), Err(fiber::TimedOut));
            // 4. try_scope { Err child }: 2 created, 2 requests, 2 failed.
            let r: Result<(), &str> = fiber::try_scope(|s| {
                s.spawn(|| Err::<(), _>("r58 err"));
                Ok(())
            });
            assert_eq!(r, Err("r58 err"));
            // 5. A detached fiber that uses its job (1 created, 1
            //    completed) and one that does not (nothing).
            fiber::spawn(|| Job::current().id()).join().unwrap();
            fiber::spawn(|| 3).join().unwrap();
            // 6. A detached fiber parked in a scope, cancelled through its
            //    handle: root, scope, child: 3 created, 3 requests, 3
            //    cancelled.
            let (tx, rx) = fiber::chan::bounded(1);
            let h = fiber::spawn(move || {
                fiber::scope(|s| {
                    s.spawn(long_sleep);
                    tx.send(()).unwrap();
                    long_sleep()
                })
            });
            rx.recv().unwrap();
            h.cancel();
            assert!(h.join().unwrap_err().is_cancelled());
            let after = fiber_jobs_stats();
            let d = |f: fn(&fiber::JobStats) -> u64| f(&after) - f(&before);
            assert_eq!(d(|s| s.jobs_created), 13, "{before:?} -> {after:?}");
            assert_eq!(d(|s| s.cancellations_requested), 9, "{before:?} -> {after:?}");
            assert_eq!(d(|s| s.jobs_completed), 4, "{before:?} -> {after:?}");
            assert_eq!(d(|s| s.jobs_failed), 5, "{before:?} -> {after:?}");
            assert_eq!(d(|s| s.jobs_cancelled), 4, "{before:?} -> {after:?}");
        });
    });
}

fn fiber_jobs_stats() -> fiber::JobStats {
    fiber::stats().jobs
}

/// Keep this file's planned panics off stderr (in a child process).
fn quiet_r58_panics() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let p = info.payload();
        let text = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        if !text.starts_with("r58") {
            default(info);
        }
    }));
}

/// Join waiters are counted once per wait (spec/jobs.md section 4): a
/// join inside `non_cancellable` whose fiber is cancelled (a spurious wake,
/// then it parks again) counts one registration and one wake; a join
/// cancelled while it waits counts its registration and no wake; a plain
/// thread's join counts as a fiber's.
#[test]
fn join_waiter_counters_are_exact_across_re_publishes_and_cancelled_waits() {
    in_child(
        "join_waiter_counters_are_exact_across_re_publishes_and_cancelled_waits",
        60,
        || {
            rt2().block_on(|| {
                let before = fiber_jobs_stats();
                let (release_tx, release_rx) = fiber::chan::bounded::<()>(0);
                let (held, cancelled, thread) = fiber::scope(|s| {
                    s.spawn(move || release_rx.recv().unwrap());
                    let job = s.job();
                    let j = job.clone();
                    let held = fiber::spawn(move || fiber::non_cancellable(|| j.join()));
                    let j = job.clone();
                    let cancelled = fiber::spawn(move || j.join());
                    let j = job.clone();
                    let thread = std::thread::spawn(move || j.join());
                    wait_fiber_parked(held.id());
                    wait_fiber_parked(cancelled.id());
                    for _ in 0..3 {
                        held.cancel();
                        fiber::sleep(ms(2)).unwrap();
                        wait_fiber_parked(held.id());
                    }
                    cancelled.cancel();
                    let cancelled = cancelled.join();
                    // The thread's join registered too (it is still waiting).
                    wait_until("the thread's join to register", 10, || {
                        fiber_jobs_stats().waiters_registered - before.waiters_registered == 3
                    });
                    release_tx.send(()).unwrap();
                    (held, cancelled, thread)
                });
                // The held-off join saw the end (its fiber ends cancelled).
                assert!(held.join().unwrap_err().is_cancelled());
                assert!(cancelled.unwrap_err().is_cancelled());
                assert_eq!(thread.join().unwrap(), Ok(JobState::Completed));
                let after = fiber_jobs_stats();
                assert_eq!(
                    after.waiters_registered - before.waiters_registered,
                    3,
                    "{before:?} -> {after:?}"
                );
                assert_eq!(after.waiters_woken - before.waiters_woken, 2, "{before:?} -> {after:?}");
            });
        },
    );
}

// ---------------------------------------------------------------------------
// (g) A 10,000-node tree cancelled at once.

/// scope { 99 children, each opening a scope (a supervisor scope for every
/// other one) of 99 sleeping children }: exactly 10,000 jobs. One cancel
/// of the top scope ends every one of them: each sleeper sees
/// `Cancelled`, the scope returns, and the counters move by exactly
/// 10,000 created, 10,000 cancel requests and 10,000 cancelled.
#[test]
fn a_10000_node_tree_of_mixed_scopes_is_cancelled_at_once_and_counted_exactly() {
    in_child(
        "a_10000_node_tree_of_mixed_scopes_is_cancelled_at_once_and_counted_exactly",
        120,
        || {
            let rt = fiber::Runtime::builder()
                .workers(2)
                .max_workers(2)
                .shutdown_timeout(ms(2000))
                .build()
                .unwrap();
            rt.block_on(|| {
                let _ = Job::current();
                let before = fiber_jobs_stats();
                let parked = AtomicUsize::new(0);
                let woke = AtomicUsize::new(0);
                let t0 = Instant::now();
                let cancel_took = fiber::scope(|s| {
                    for i in 0..99 {
                        let (parked, woke) = (&parked, &woke);
                        s.spawn(move || {
                            if i % 2 == 0 {
                                fiber::scope(|inner| leaves(inner, parked, woke));
                            } else {
                                fiber::supervisor_scope(|inner| leaves(inner, parked, woke));
                            }
                        });
                    }
                    wait_until("every leaf to start", 60, || parked.load(SeqCst) == 99 * 99);
                    let t1 = Instant::now();
                    s.cancel();
                    assert!(fiber::is_cancelled(), "the body is in the cancelled job");
                    t1
                });
                let after = fiber_jobs_stats();
                assert_eq!(woke.load(SeqCst), 99 * 99, "every sleeper saw the cancel");
                assert!(
                    cancel_took.elapsed() < Duration::from_secs(30),
                    "started {:?} ago",
                    t0.elapsed()
                );
                let d = |f: fn(&fiber::JobStats) -> u64| f(&after) - f(&before);
                assert_eq!(d(|s| s.jobs_created), 10_000, "{before:?} -> {after:?}");
                assert_eq!(d(|s| s.cancellations_requested), 10_000, "{before:?} -> {after:?}");
                assert_eq!(d(|s| s.jobs_cancelled), 10_000, "{before:?} -> {after:?}");
                assert_eq!(
                    d(|s| s.jobs_completed) + d(|s| s.jobs_failed),
                    0,
                    "{before:?} -> {after:?}"
                );
            });
        },
    );
}

/// 99 sleeping children of `inner`.
fn leaves<'scope, 'env>(inner: &'scope fiber::Scope<'scope, 'env>, parked: &'env AtomicUsize, woke: &'env AtomicUsize) {
    for _ in 0..99 {
        inner.spawn(move || {
            parked.fetch_add(1, SeqCst);
            if fiber::sleep(Duration::from_secs(60)).is_err() {
                woke.fetch_add(1, SeqCst);
            }
        });
    }
}

/// The 10,000-node tree of the test above, failed by one leaf (of a
/// regular inner scope) instead of cancelled: the failure climbs leaf ->
/// inner scope -> child -> top scope (4 jobs FAILED), every other job is
/// cancelled (9,996 CANCELLED), each job took ACTIVE -> CANCELLING once,
/// and the top scope re-raises the leaf's panic.
#[test]
fn a_10000_node_tree_failed_by_one_leaf_is_counted_exactly() {
    in_child("a_10000_node_tree_failed_by_one_leaf_is_counted_exactly", 120, || {
        quiet_r58_panics();
        let rt = fiber::Runtime::builder()
            .workers(2)
            .max_workers(2)
            .shutdown_timeout(ms(2000))
            .build()
            .unwrap();
        rt.block_on(|| {
            let _ = Job::current();
            let before = fiber_jobs_stats();
            let parked = AtomicUsize::new(0);
            let woke = AtomicUsize::new(0);
            let (fire_tx, fire_rx) = fiber::chan::bounded::<()>(1);
            let msg = panic_message(|| {
                fiber::scope(|s| {
                    let (parked, woke) = (&parked, &woke);
                    s.spawn(move || {
                        fiber::scope(|inner| {
                            inner.spawn(move || {
                                parked.fetch_add(1, SeqCst);
                                fire_rx.recv().unwrap();
                                panic!("r58 leaf of 10000");
                            });
                            for _ in 0..98 {
                                inner.spawn(move || {
                                    parked.fetch_add(1, SeqCst);
                                    if fiber::sleep(Duration::from_secs(60)).is_err() {
                                        woke.fetch_add(1, SeqCst);
                                    }
                                });
                            }
                        })
                    });
                    for i in 1..99 {
                        s.spawn(move || {
                            if i % 2 == 0 {
                                fiber::scope(|inner| leaves(inner, parked, woke));
                            } else {
                                fiber::supervisor_scope(|inner| leaves(inner, parked, woke));
                            }
                        });
                    }
                    wait_until("every leaf to start", 60, || parked.load(SeqCst) == 99 * 99);
                    fire_tx.send(()).unwrap();
                    // The body waits too: the failure cancels it.
                    let _ = fiber::sleep(Duration::from_secs(60));
                })
            });
            let after = fiber_jobs_stats();
            assert_eq!(msg.as_deref(), Some("r58 leaf of 10000"));
            assert_eq!(woke.load(SeqCst), 99 * 99 - 1, "every other sleeper saw the cancel");
            let d = |f: fn(&fiber::JobStats) -> u64| f(&after) - f(&before);
            assert_eq!(d(|s| s.jobs_created), 10_000, "{before:?} -> {after:?}");
            assert_eq!(d(|s| s.cancellations_requested), 10_000, "{before:?} -> {after:?}");
            assert_eq!(d(|s| s.jobs_failed), 4, "{before:?} -> {after:?}");
            assert_eq!(d(|s| s.jobs_cancelled), 9_996, "{before:?} -> {after:?}");
            assert_eq!(d(|s| s.jobs_completed), 0, "{before:?} -> {after:?}");
        });
    });
}

// ---------------------------------------------------------------------------
// (h) Shutdown while deep scopes of mixed kinds are parked.

/// A chain of `depth` levels, each a scoped child that opens a scope, a
/// supervisor scope or a `with_timeout` (1 h) holding a scope; every job
/// is sent to `jobs`. The leaf sleeps (`stubborn`: ignores cancellation).
fn mixed_chain(depth: usize, jobs: &mpsc::Sender<Job>, stubborn: bool) {
    jobs.send(Job::current()).unwrap();
    if depth == 0 {
        if stubborn {
            stubborn_sleep();
        } else {
            let _ = fiber::sleep(Duration::MAX);
        }
        return;
    }
    match depth % 3 {
        0 => fiber::scope(|s| next_level(s, depth, jobs, stubborn)),
        1 => fiber::supervisor_scope(|s| next_level(s, depth, jobs, stubborn)),
        _ => {
            let _ = fiber::with_timeout(Duration::from_secs(3600), || {
                jobs.send(Job::current()).unwrap();
                fiber::scope(|s| next_level(s, depth, jobs, stubborn))
            });
        }
    }
}

fn next_level<'scope>(s: &'scope fiber::Scope<'scope, '_>, depth: usize, jobs: &mpsc::Sender<Job>, stubborn: bool) {
    jobs.send(s.job()).unwrap();
    let jobs = jobs.clone();
    s.spawn(move || mixed_chain(depth - 1, &jobs, stubborn));
}

/// The job counters from outside a runtime (a fresh one that makes no
/// job).
fn stats_now() -> fiber::JobStats {
    rt1().block_on(fiber_jobs_stats)
}

fn shutdown_with_a_parked_chain(stubborn: bool) -> usize {
    let depth = 150;
    let (jobs, states, joined) = within(60, move || {
        let rt = rt_fixed_grace(2, ms(200));
        let (tx, rx) = mpsc::channel();
        let _h = rt.spawn(move || mixed_chain(depth, &tx, stubborn));
        // depth + 1 calls, a scope job per level, a with_timeout job per
        // third level.
        let expected = (depth + 1) + depth + depth / 3;
        let mut jobs = Vec::new();
        while jobs.len() < expected {
            jobs.push(rx.recv_timeout(Duration::from_secs(20)).expect("the chain was built"));
        }
        wait_parked(&rt, depth + 1);
        // A plain thread parked in the join of the deepest job.
        let deepest = jobs.last().unwrap().clone();
        let joiner = std::thread::spawn(move || deepest.join());
        std::thread::sleep(ms(20));
        drop(rt);
        let states: Vec<JobState> = jobs.iter().map(|j| j.state()).collect();
        (jobs.len(), states, joiner.join().unwrap())
    });
    assert!(jobs > depth);
    let not_cancelled: Vec<_> = states
        .iter()
        .enumerate()
        .filter(|(_, s)| **s != JobState::Cancelled)
        .collect();
    assert!(
        not_cancelled.is_empty(),
        "jobs not CANCELLED after shutdown: {not_cancelled:?}"
    );
    assert_eq!(joined, Ok(JobState::Cancelled));
    jobs
}

/// Shutdown of a runtime whose detached fiber is parked 150 levels deep
/// in scopes, supervisor scopes and `with_timeout`s: every job of the
/// chain (the fiber's root job included) ends CANCELLED (spec/jobs.md:
/// "every job below a root that ends while the runtime shuts down ...
/// ends CANCELLED"), and a plain thread joining the deepest one returns.
#[test]
fn shutdown_with_a_deep_mixed_chain_parked_ends_every_job_cancelled() {
    shutdown_with_a_parked_chain(false);
}

/// The same, with a leaf that ignores cancellation: it is unwound at
/// teardown, after the grace time, and every job still ends CANCELLED.
#[test]
fn shutdown_with_a_deep_mixed_chain_and_a_stubborn_leaf_ends_every_job_cancelled() {
    shutdown_with_a_parked_chain(true);
}

/// The job counters of both shutdowns above (in a child process): every
/// job of the chain was created once, took ACTIVE -> CANCELLING once and
/// ended CANCELLED once, whether its end came in the grace time or at
/// teardown; none is counted completed or failed.
#[test]
fn shutdown_of_deep_mixed_chains_counts_each_job_once() {
    in_child("shutdown_of_deep_mixed_chains_counts_each_job_once", 120, || {
        for stubborn in [false, true] {
            let before = stats_now();
            let n = shutdown_with_a_parked_chain(stubborn) as u64;
            let after = stats_now();
            let d = |f: fn(&fiber::JobStats) -> u64| f(&after) - f(&before);
            let ctx = format!("stubborn {stubborn}: {n} jobs, {before:?} -> {after:?}");
            assert_eq!(d(|s| s.jobs_created), n, "{ctx}");
            assert_eq!(d(|s| s.cancellations_requested), n, "{ctx}");
            assert_eq!(d(|s| s.jobs_cancelled), n, "{ctx}");
            assert_eq!(d(|s| s.jobs_completed) + d(|s| s.jobs_failed), 0, "{ctx}");
        }
    });
}

// ---------------------------------------------------------------------------
// (i) Cancellation racing completion at every level.

/// A small xorshift.
fn next_rand(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// scope { child { scope { grandchild returns 7 } } }, the top cancelled
/// from a plain thread at a random instant, 400 rounds. Whatever the
/// instant, the tree is consistent: every job has ended when the top
/// scope returns; a cancelled job's ancestors are cancelled (nothing
/// else cancels); a COMPLETED top means a tree of COMPLETED jobs and the
/// value; and each join agrees with its job's final state (Ok exactly
/// when COMPLETED, a cancellation exactly when CANCELLED).
#[test]
fn cancel_racing_completion_at_every_level_leaves_a_consistent_tree() {
    within(120, || {
        let (job_tx, job_rx) = mpsc::channel::<(Job, u64)>();
        let (ack_tx, ack_rx) = mpsc::channel::<()>();
        let canceller = std::thread::spawn(move || {
            while let Ok((job, spin_ns)) = job_rx.recv() {
                let t0 = Instant::now();
                while t0.elapsed() < Duration::from_nanos(spin_ns) {
                    std::hint::spin_loop();
                }
                job.cancel();
                // When cancel returns, a job that had not ended is
                // cancelling (or ended cancelled).
                assert!(job.is_cancelled() || job.state() == JobState::Completed);
                ack_tx.send(()).unwrap();
            }
        });
        let outcomes = rt2().block_on(move || {
            let mut outcomes = [0usize; 2];
            let mut seed = 0x9E37_79B9_7F4A_7C15u64;
            for round in 0..400 {
                let spin_ns = next_rand(&mut seed) % 300_000;
                let levels: Mutex<Vec<Job>> = Mutex::new(Vec::new());
                let inner_join = Mutex::new(None);
                let (top, top_join) = fiber::scope(|s| {
                    levels.lock().unwrap().push(s.job());
                    job_tx.send((s.job(), spin_ns)).unwrap();
                    let h = s.spawn(|| {
                        levels.lock().unwrap().push(Job::current());
                        fiber::scope(|s2| {
                            levels.lock().unwrap().push(s2.job());
                            let g = s2.spawn(|| {
                                levels.lock().unwrap().push(Job::current());
                                let t0 = Instant::now();
                                while t0.elapsed() < Duration::from_micros(100) {
                                    std::hint::spin_loop();
                                }
                                7u32
                            });
                            *inner_join.lock().unwrap() = Some(g.join().map_err(|e| e.is_cancelled()));
                        });
                    });
                    (s.job(), h.join().map_err(|e| e.is_cancelled()))
                });
                ack_rx.recv().unwrap();
                let levels = levels.into_inner().unwrap();
                let states: Vec<JobState> = levels.iter().map(|j| j.state()).collect();
                let ctx = format!("round {round}, spin {spin_ns} ns: {states:?}");
                assert!(states.iter().all(|s| s.is_terminal()), "{ctx}");
                assert_eq!(top.state(), states[0], "{ctx}");
                // Nothing but the top's cancel cancels: a cancelled job's
                // ancestors are cancelled.
                for i in 1..states.len() {
                    if states[i] == JobState::Cancelled {
                        assert_eq!(states[i - 1], JobState::Cancelled, "{ctx}");
                    }
                    assert_ne!(states[i], JobState::Failed, "{ctx}");
                }
                if states[0] == JobState::Completed {
                    assert!(states.iter().all(|s| *s == JobState::Completed), "{ctx}");
                }
                // A child cancelled before it started never ran (one job).
                let child_completed = states.get(1) == Some(&JobState::Completed);
                assert_eq!(top_join.is_ok(), child_completed, "{ctx}");
                assert!(top_join.is_ok() || top_join == Err(true), "{ctx}");
                if states.len() == 4 {
                    let inner = inner_join
                        .lock()
                        .unwrap()
                        .take()
                        .expect("the inner scope's body joined");
                    match states[3] {
                        JobState::Completed => assert_eq!(inner, Ok(7), "{ctx}"),
                        _ => assert_eq!(inner, Err(true), "{ctx}"),
                    }
                }
                outcomes[usize::from(states[0] == JobState::Completed)] += 1;
            }
            outcomes
        });
        canceller.join().unwrap();
        // Not a timing assertion: only reported.
        eprintln!("cancelled tops: {}, completed tops: {}", outcomes[0], outcomes[1]);
    });
}

/// scope { child { scope { grandchild spins, then panics } } }, the top
/// cancelled from a plain thread at a random instant, 300 rounds. Failure
/// dominates cancellation at every level (spec/jobs.md, invariant 5): a
/// grandchild that started always panics, and then every job of the chain
/// ends FAILED and the top scope re-raises that panic, however early the
/// cancel landed; a grandchild cancelled before it started leaves every
/// job CANCELLED and the scope returns.
#[test]
fn failure_racing_cancel_along_a_chain_always_dominates() {
    within(120, || {
        quiet_r58_panics_once();
        let (job_tx, job_rx) = mpsc::channel::<(Job, u64)>();
        let (ack_tx, ack_rx) = mpsc::channel::<()>();
        let canceller = std::thread::spawn(move || {
            while let Ok((job, spin_ns)) = job_rx.recv() {
                let t0 = Instant::now();
                while t0.elapsed() < Duration::from_nanos(spin_ns) {
                    std::hint::spin_loop();
                }
                job.cancel();
                ack_tx.send(()).unwrap();
            }
        });
        let seen = rt2().block_on(move || {
            let mut seen = [0usize; 2];
            let mut seed = 0x2545_F491_4F6C_DD1Du64;
            for round in 0..300 {
                let spin_ns = next_rand(&mut seed) % 300_000;
                let levels: Mutex<Vec<Job>> = Mutex::new(Vec::new());
                let ran = AtomicBool::new(false);
                let msg = panic_message(|| {
                    fiber::scope(|s| {
                        levels.lock().unwrap().push(s.job());
                        job_tx.send((s.job(), spin_ns)).unwrap();
                        s.spawn(|| {
                            levels.lock().unwrap().push(Job::current());
                            fiber::scope(|s2| {
                                levels.lock().unwrap().push(s2.job());
                                s2.spawn(|| {
                                    levels.lock().unwrap().push(Job::current());
                                    ran.store(true, SeqCst);
                                    let t0 = Instant::now();
                                    while t0.elapsed() < Duration::from_micros(100) {
                                        std::hint::spin_loop();
                                    }
                                    panic!("r58 leaf");
                                });
                            });
                        });
                    })
                });
                ack_rx.recv().unwrap();
                let states: Vec<JobState> = levels.into_inner().unwrap().iter().map(|j| j.state()).collect();
                let ctx = format!("round {round}, spin {spin_ns} ns: {states:?}, {msg:?}");
                if ran.load(SeqCst) {
                    assert_eq!(msg.as_deref(), Some("r58 leaf"), "{ctx}");
                    assert_eq!(states, vec![JobState::Failed; 4], "{ctx}");
                } else {
                    assert_eq!(msg, None, "{ctx}");
                    assert!(states.iter().all(|s| *s == JobState::Cancelled), "{ctx}");
                }
                seen[usize::from(ran.load(SeqCst))] += 1;
            }
            seen
        });
        canceller.join().unwrap();
        eprintln!("leaf never ran: {}, leaf panicked: {}", seen[0], seen[1]);
    });
}

/// Install [`quiet_r58_panics`] once in this process.
fn quiet_r58_panics_once() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(quiet_r58_panics);
}

/// Two nested `with_timeout`s whose deadlines race their spinning body,
/// 300 rounds: at each level the result is `Ok` exactly when its job
/// ended COMPLETED, and `Err(TimedOut)` exactly when it ended CANCELLED
/// with reason `TimedOut`.
#[test]
fn nested_with_timeouts_racing_their_body_report_what_their_jobs_ended_with() {
    within(120, || {
        rt2().block_on(|| {
            let mut seed = 0xD1B5_4A32_D192_ED03u64;
            for round in 0..300 {
                let outer_us = 200 + next_rand(&mut seed) % 600;
                let inner_us = 200 + next_rand(&mut seed) % 600;
                let body_us = 200 + next_rand(&mut seed) % 600;
                let mut inner_job = None;
                let mut inner_r = None;
                let mut outer_job = None;
                let outer_r = fiber::with_timeout(Duration::from_micros(outer_us), || {
                    outer_job = Some(Job::current());
                    inner_r = Some(fiber::with_timeout(Duration::from_micros(inner_us), || {
                        inner_job = Some(Job::current());
                        let t0 = Instant::now();
                        while t0.elapsed() < Duration::from_micros(body_us) {
                            std::hint::spin_loop();
                        }
                    }));
                });
                let ctx = format!("round {round}: outer {outer_us} us, inner {inner_us} us, body {body_us} us");
                for (r, job) in [(outer_r, outer_job.unwrap()), (inner_r.unwrap(), inner_job.unwrap())] {
                    match r {
                        Ok(()) => assert_eq!(job.state(), JobState::Completed, "{ctx}"),
                        Err(fiber::TimedOut) => {
                            assert_eq!(job.state(), JobState::Cancelled, "{ctx}");
                            assert_eq!(job.cancel_reason(), Some(CancelReason::TimedOut), "{ctx}");
                        }
                    }
                }
            }
        });
    });
}

// ---------------------------------------------------------------------------
// (j) Panicking destructors of children's values.

/// A supervisor's child whose value nobody joins and whose destructor
/// panics: the failure stays with that child (supervisor), so its sibling
/// is not cancelled and the supervisor scope returns normally; the value
/// is dropped once.
#[test]
fn a_supervised_unjoined_value_whose_drop_panics_leaves_the_siblings_and_the_scope_alone() {
    on_runtime(|| {
        let drops = Arc::new(AtomicUsize::new(0));
        let (go_tx, go_rx) = fiber::chan::bounded::<()>(0);
        let (sib, child_job) = fiber::supervisor_scope(|sv| {
            let d = drops.clone();
            let (job_tx, job_rx) = fiber::chan::bounded(1);
            drop(sv.spawn(move || {
                job_tx.send(Job::current()).unwrap();
                go_rx.recv().unwrap();
                PanicOnDrop(d)
            }));
            let sib = sv.spawn(|| fiber::sleep(ms(30)));
            go_tx.send(()).unwrap();
            (sib.join(), job_rx.recv().unwrap())
        });
        assert_eq!(drops.load(SeqCst), 1);
        assert!(matches!(sib, Ok(Ok(()))), "the sibling was cancelled: {sib:?}");
        assert_eq!(child_job.state(), JobState::Failed);
    });
}

/// A child that returns a value with a panicking destructor after its
/// scope was cancelled (it spun past the cancel): its job ends CANCELLED,
/// so the body's join drops the value and the drop's panic unwinds the
/// body; the scope re-raises it (once), and with no join (handle dropped)
/// the child's own drop of it fails the scope the same way, although the
/// scope was cancelled first (failure dominates cancellation).
#[test]
fn a_value_with_a_panicking_drop_returned_after_the_scope_was_cancelled() {
    for joined in [true, false] {
        let drops = Arc::new(AtomicUsize::new(0));
        let d = drops.clone();
        let (msg, job) = within(30, move || {
            rt2().block_on(move || {
                let job = Mutex::new(None);
                let go = AtomicBool::new(false);
                let started = AtomicBool::new(false);
                let msg = panic_message(|| {
                    fiber::scope(|s| {
                        *job.lock().unwrap() = Some(s.job());
                        let h = s.spawn(|| {
                            started.store(true, SeqCst);
                            assert!(spin_until(&go, Duration::from_secs(10)));
                            PanicOnDrop(d)
                        });
                        wait_until("the child to start", 10, || started.load(SeqCst));
                        s.cancel();
                        if joined {
                            go.store(true, SeqCst);
                            let _ = h.join();
                            unreachable!("the join's drop of the value panics");
                        } else {
                            drop(h);
                            go.store(true, SeqCst);
                        }
                    })
                });
                (msg, job.into_inner().unwrap().unwrap())
            })
        });
        assert_eq!(msg.as_deref(), Some("r58: value dropped"), "joined: {joined}");
        assert_eq!(drops.load(SeqCst), 1, "joined: {joined}");
        assert_eq!(job.state(), JobState::Failed, "joined: {joined}");
    }
}

/// A `with_timeout` whose block outlived its deadline and returned a value
/// with a panicking destructor: the value is dropped once (the panic
/// comes out of `with_timeout`), and the fiber's next `with_timeout`
/// works (no watchdog or job left behind).
#[test]
fn a_timed_out_blocks_value_whose_drop_panics() {
    on_runtime(|| {
        let drops = Arc::new(AtomicUsize::new(0));
        let d = drops.clone();
        let mut job = None;
        let msg = panic_message(|| {
            let _ = fiber::with_timeout(ms(10), || {
                job = Some(Job::current());
                let _ = long_sleep();
                PanicOnDrop(d)
            });
        });
        assert_eq!(msg.as_deref(), Some("r58: value dropped"));
        assert_eq!(drops.load(SeqCst), 1);
        let job = job.unwrap();
        assert_eq!(
            (job.state(), job.cancel_reason()),
            (JobState::Cancelled, Some(CancelReason::TimedOut))
        );
        assert_eq!(fiber::with_timeout(ms(500), || 5), Ok(5));
        assert!(Job::current().is_active());
    });
}

/// A child spawned into an already-cancelled scope never runs, but its
/// closure is still dropped (on its fiber): a capture whose destructor
/// panics fails the scope (failure dominates cancellation), which
/// re-raises that panic, as for a panic in a child's body; in a
/// supervisor scope the failure stays with the child and the scope
/// returns normally. Each capture is dropped once.
#[test]
fn an_unrun_childs_capture_whose_drop_panics_in_a_cancelled_scope() {
    on_runtime(|| {
        let drops = Arc::new(AtomicUsize::new(0));
        let d = drops.clone();
        let msg = panic_message(move || {
            fiber::scope(|s| {
                s.cancel();
                let cap = PanicOnDrop(d);
                s.spawn(move || {
                    let _keep = &cap;
                    unreachable!("a child of a cancelled scope never runs");
                });
            })
        });
        assert_eq!(msg.as_deref(), Some("r58: value dropped"));
        assert_eq!(drops.load(SeqCst), 1);
        let d = drops.clone();
        let (joined, state) = fiber::supervisor_scope(move |s| {
            s.cancel();
            let cap = PanicOnDrop(d);
            let h = s.spawn(move || {
                let _keep = &cap;
                unreachable!("a child of a cancelled scope never runs");
            });
            (h.join().map_err(|e| e.is_panic()), s.job().state())
        });
        assert_eq!(joined, Err(true), "the capture's panic is the child's failure");
        assert_eq!(state, JobState::Cancelling);
        assert_eq!(drops.load(SeqCst), 2);
    });
}

/// A fiber of runtime B parked in `Job::join` of a job of runtime A, and B
/// dropped: the join ends with `Cancelled` (B's shutdown cancels its
/// fiber) and leaves no waiter behind in A's job: A's job then ends
/// normally, its own joiner is woken, and A's runtime goes on.
#[test]
fn a_joiner_on_a_dropped_runtime_leaves_the_other_runtimes_job_intact() {
    within(30, || {
        let a = rt2();
        a.block_on(|| {
            let (release_tx, release_rx) = fiber::chan::bounded::<()>(0);
            let out = fiber::scope(|s| {
                s.spawn(move || release_rx.recv().unwrap());
                let job = s.job();
                let b = rt2();
                let (res_tx, res_rx) = mpsc::channel();
                let j = job.clone();
                let bh = b.spawn(move || {
                    let r = j.join();
                    let _ = res_tx.send(r);
                });
                wait_until("B's joiner to park", 10, || {
                    b.dump()
                        .fibers
                        .iter()
                        .any(|f| f.id == bh.id() && f.state == fiber::core::state::FiberState::Parked)
                });
                // Dropping B shuts it down: its joiner is cancelled.
                fiber::blocking(move || drop(b));
                let b_join = res_rx
                    .recv_timeout(Duration::from_secs(10))
                    .expect("B's joiner returned");
                let j = job.clone();
                let own = fiber::spawn(move || j.join());
                fiber::sleep(ms(5)).unwrap();
                release_tx.send(()).unwrap();
                (b_join, own)
            });
            let (b_join, own) = out;
            assert_eq!(b_join, Err(fiber::Cancelled));
            assert_eq!(own.join().unwrap(), Ok(JobState::Completed));
            assert_eq!(fiber::spawn(|| 5).join().unwrap(), 5);
        });
    });
}

/// A detached fiber whose body blocks its worker in `std::thread::scope`
/// while a plain thread of it joins a sleeping child of the fiber's scope;
/// the runtime is dropped: shutdown cancels the child, the plain thread's
/// join reports the cancellation, the fiber's scope closes, and the drop
/// returns (nothing waits for a worker that only the fiber's return frees).
#[test]
fn shutdown_while_a_plain_thread_joins_a_scoped_child_for_a_blocked_fiber() {
    let (joined, job) = within(30, || {
        let rt = rt_fixed_grace(2, ms(300));
        let (tx, rx) = mpsc::channel();
        let (job_tx, job_rx) = mpsc::channel();
        let _h = rt.spawn(move || {
            fiber::scope(|s| {
                job_tx.send(s.job()).unwrap();
                std::thread::scope(|ts| {
                    ts.spawn(|| {
                        let r = s.spawn(long_sleep).join();
                        tx.send(r.map_err(|e| e.is_cancelled())).unwrap();
                    });
                });
            })
        });
        let job: Job = job_rx.recv().unwrap();
        wait_parked(&rt, 1);
        drop(rt);
        let joined = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the thread's join returned");
        (joined, job)
    });
    assert_eq!(joined, Err(true));
    assert_eq!(job.state(), JobState::Cancelled);
}

/// The panic payload's text.
fn panic_text(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}
