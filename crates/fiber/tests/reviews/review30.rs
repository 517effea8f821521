//! Review 30: the cancel walk of e4badea (a second canceller walks a
//! subtree whose first canceller is still part way down) and the joins
//! from inside a job whose cancel is in flight. The in-flight window is
//! opened deterministically as in `adversarial/cancel_in_flight.rs`: a
//! `tracing` layer holds the armed canceller in the "job state" event of
//! the job it just turned CANCELLING (those tests run in a child process:
//! the subscriber is global).

use crate::common::*;

use crate::common::hold::{gate, install, ARMED};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

// The holding layer (child processes only): `crate::common::hold`.

/// One cancelled leaf job (a scoped child parked in `recv`, no child of
/// its own): the first canceller is held right after the job turned
/// CANCELLING, before it interrupted the job's fiber. A second `cancel` of
/// the same job must not return before the parked fiber is woken (Go: a
/// second `cancel()` of a context takes the context's lock, so it returns
/// only once the first one closed `Done()` and every waiter on it is
/// runnable). Returns whether the fiber woke within 2 s of the second
/// cancel returning.
fn second_cancel_wakes(leaf: bool) -> bool {
    let rt = rt2();
    rt.block_on(move || {
        fiber::scope(|s| {
            let (job_tx, job_rx) = fiber::chan::bounded::<(fiber::Job, fiber::FiberId)>(1);
            let (woke_tx, woke_rx) = fiber::chan::bounded::<&'static str>(4);
            let (never_tx, never_rx) = fiber::chan::bounded::<()>(1);
            let never_rx2 = never_rx.clone();
            let woke_tx2 = woke_tx.clone();
            s.spawn(move || {
                job_tx.send((fiber::Job::current(), fiber::current().id())).unwrap();
                if leaf {
                    let r = never_rx.recv();
                    assert!(r.is_err());
                    let _ = fiber::non_cancellable(|| woke_tx.send("child"));
                } else {
                    // The same fiber, with a child of its own (a nested
                    // scope whose child parks too).
                    fiber::scope(|inner| {
                        inner.spawn(move || {
                            let r = never_rx2.recv();
                            assert!(r.is_err());
                            let _ = fiber::non_cancellable(|| woke_tx2.send("grandchild"));
                        });
                        let r = never_rx.recv();
                        assert!(r.is_err());
                        let _ = fiber::non_cancellable(|| woke_tx.send("child"));
                    });
                }
            });
            let (kjob, kid) = job_rx.recv().unwrap();
            wait_fiber_parked(kid);
            let first = kjob.clone();
            s.spawn(move || {
                ARMED.store(true, SeqCst);
                first.cancel();
            });
            // The first canceller is held: the job is CANCELLING, its
            // fiber not interrupted yet.
            gate().parked.1.recv().unwrap();
            kjob.cancel();
            assert!(kjob.is_cancelled());
            let woke = woke_rx.recv_timeout(Duration::from_secs(2)).is_ok();
            gate().release.0.send(()).unwrap();
            drop(never_tx);
            woke
        })
    })
}

// Failed before the fix: a second Job::cancel of a leaf job whose first canceller is mid-cancel returns without waking the job's parked fiber
#[test]
fn a_second_cancel_of_a_leaf_job_wakes_its_parked_fiber() {
    in_child("a_second_cancel_of_a_leaf_job_wakes_its_parked_fiber", 30, || {
        install();
        assert!(
            second_cancel_wakes(true),
            "the second cancel returned, yet the cancelled job's parked fiber was not woken \
             (the first canceller marked the leaf's subtree_cancelled before interrupting its fibers)"
        );
    });
}

/// The control: the same job with a child of its own is walked by the
/// second canceller, which interrupts its fiber.
#[test]
fn a_second_cancel_of_a_job_with_a_child_wakes_its_parked_fiber() {
    in_child(
        "a_second_cancel_of_a_job_with_a_child_wakes_its_parked_fiber",
        30,
        || {
            install();
            assert!(second_cancel_wakes(false));
        },
    );
}

/// `cancel_and_join` of a leaf job from the second canceller, while the
/// first canceller is held: the join must return once the job has ended,
/// without the first canceller's help (Kotlin's `cancelAndJoin`).
// Failed before the fix: cancel_and_join of a leaf job whose first canceller is held never ends (its fiber is never interrupted)
#[test]
fn cancel_and_join_of_a_leaf_job_does_not_depend_on_the_first_canceller() {
    in_child(
        "cancel_and_join_of_a_leaf_job_does_not_depend_on_the_first_canceller",
        30,
        || {
            install();
            let rt = rt2();
            let joined = rt.block_on(|| {
                fiber::scope(|s| {
                    let (job_tx, job_rx) = fiber::chan::bounded::<(fiber::Job, fiber::FiberId)>(1);
                    let (never_tx, never_rx) = fiber::chan::bounded::<()>(1);
                    s.spawn(move || {
                        job_tx.send((fiber::Job::current(), fiber::current().id())).unwrap();
                        let _ = never_rx.recv();
                    });
                    let (kjob, kid) = job_rx.recv().unwrap();
                    wait_fiber_parked(kid);
                    let first = kjob.clone();
                    s.spawn(move || {
                        ARMED.store(true, SeqCst);
                        first.cancel();
                    });
                    gate().parked.1.recv().unwrap();
                    // The joiner: a sibling, bounded by a with_timeout so a
                    // stuck join ends the scenario.
                    let joiner = s.spawn(move || fiber::with_timeout(ms(2000), || kjob.cancel_and_join()));
                    let joined = fiber::non_cancellable(|| joiner.join()).unwrap();
                    gate().release.0.send(()).unwrap();
                    drop(never_tx);
                    joined
                })
            });
            assert_eq!(
                joined,
                Ok(Ok(fiber::JobState::Cancelled)),
                "cancel_and_join of a leaf job returned {joined:?} (Err(TimedOut): it waited 2 s for a fiber \
                 nobody interrupted)"
            );
        },
    );
}

/// After a join from inside the job being cancelled returned
/// `Err(Cancelled)`, the caller is cancelled: Kotlin's `join` throws
/// `CancellationException` only for a cancelled caller, whose `isActive`
/// is then false. Here the join says "cancelled" while the fiber's own
/// `is_cancelled()` still says no (its job not reached by the walk yet),
/// so it goes on as if nothing happened.
// Failed before the fix: Job::join reports Err(Cancelled) from inside a job whose cancel is in flight while fiber::is_cancelled() is still false
#[test]
fn a_join_that_reports_cancelled_leaves_the_caller_cancelled() {
    in_child("a_join_that_reports_cancelled_leaves_the_caller_cancelled", 30, || {
        install();
        let rt = rt2();
        let (tx, rx) = std::sync::mpsc::channel();
        rt.block_on(|| {
            fiber::scope(|s| {
                let j = s.job();
                let jc = j.clone();
                s.spawn(move || {
                    ARMED.store(true, SeqCst);
                    jc.cancel();
                });
                s.spawn(move || {
                    gate().parked.1.recv().unwrap();
                    let joined = j.join();
                    let cancelled_after = fiber::is_cancelled();
                    let check = fiber::check_cancelled();
                    gate().release.0.send(()).unwrap();
                    tx.send((joined, cancelled_after, check)).unwrap();
                });
            })
        });
        let (joined, cancelled_after, check) = rx.recv().unwrap();
        assert_eq!(joined, Err(fiber::Cancelled));
        assert!(
            cancelled_after && check.is_err(),
            "join said Cancelled, but is_cancelled() = {cancelled_after}, check_cancelled() = {check:?}"
        );
    });
}

// ---------------------------------------------------------------------
// No tracing layer.
// ---------------------------------------------------------------------

/// Four fibers cancel a scope again and again while a fifth keeps adding
/// children to it (10,000 in all). After every `cancel` returns, every
/// child that has started reads its job cancelled; the scope ends, every
/// child ends cancelled, and no child's body runs past its cancellation.
#[test]
fn many_cancellers_of_a_big_scope_while_children_are_added() {
    within(120, || {
        let rt = rt();
        rt.block_on(|| {
            let started: Arc<Mutex<Vec<fiber::Job>>> = Arc::default();
            let spawned = Arc::new(AtomicUsize::new(0));
            let finished_sleep = Arc::new(AtomicUsize::new(0));
            let mut scope_job = None;
            fiber::scope(|s| {
                let sj = s.job();
                scope_job = Some(sj.clone());
                {
                    let (started, spawned, finished_sleep) = (started.clone(), spawned.clone(), finished_sleep.clone());
                    s.spawn(move || {
                        let mut handles = Vec::with_capacity(10_000);
                        for i in 0..10_000usize {
                            let (started, finished_sleep) = (started.clone(), finished_sleep.clone());
                            handles.push(s.spawn(move || {
                                started.lock().unwrap().push(fiber::Job::current());
                                if fiber::sleep(Duration::from_secs(60)).is_ok() {
                                    finished_sleep.fetch_add(1, SeqCst);
                                }
                            }));
                            spawned.store(i + 1, SeqCst);
                            if i % 64 == 0 {
                                let _ = fiber::yield_now();
                            }
                        }
                        let mut cancelled = 0;
                        for h in handles {
                            match fiber::non_cancellable(|| h.join()) {
                                Err(e) if e.is_cancelled() => cancelled += 1,
                                other => panic!("a child of the cancelled scope ended {other:?}"),
                            }
                        }
                        assert_eq!(cancelled, 10_000);
                    });
                }
                for c in 0..4usize {
                    let (sj, started, spawned) = (sj.clone(), started.clone(), spawned.clone());
                    s.spawn(move || {
                        while spawned.load(SeqCst) < 1_000 * (c + 1) {
                            let _ = fiber::non_cancellable(fiber::yield_now);
                        }
                        for _ in 0..40 {
                            sj.cancel();
                            assert!(fiber::is_cancelled(), "a canceller of its enclosing scope");
                            let jobs = started.lock().unwrap();
                            if let Some(k) = jobs.iter().position(|j| !j.is_cancelled()) {
                                panic!("child {k} of {} still active after cancel returned", jobs.len());
                            }
                            drop(jobs);
                            let _ = fiber::non_cancellable(fiber::yield_now);
                        }
                    });
                }
            });
            assert_eq!(finished_sleep.load(SeqCst), 0);
            let sj = scope_job.unwrap();
            assert_eq!(sj.state(), fiber::JobState::Cancelled);
            for j in started.lock().unwrap().iter() {
                assert_eq!(j.state(), fiber::JobState::Cancelled);
            }
        });
    });
}

/// A deep chain of nested scopes; fibers at many depths cancel the root
/// at once. Each reads itself cancelled as soon as its own `cancel`
/// returns, whichever canceller got there first (Go: every derived
/// context is done when `cancel` returns).
#[test]
fn concurrent_cancels_of_the_root_of_a_deep_chain_are_seen_at_every_depth() {
    fn chain(depth: usize, root: fiber::Job, ready: Arc<AtomicUsize>, seen: Arc<AtomicUsize>) {
        fiber::scope(|s| {
            if depth > 0 {
                let (r2, ready2, seen2) = (root.clone(), ready.clone(), seen.clone());
                s.spawn(move || chain(depth - 1, r2, ready2, seen2));
            }
            if depth % 10 == 0 {
                s.spawn(move || {
                    ready.fetch_add(1, SeqCst);
                    while ready.load(SeqCst) < 21 {
                        let _ = fiber::non_cancellable(fiber::yield_now);
                    }
                    root.cancel();
                    if fiber::is_cancelled() {
                        seen.fetch_add(1, SeqCst);
                    }
                });
            }
        });
    }
    for _ in 0..5 {
        within(60, || {
            rt().block_on(|| {
                let ready = Arc::new(AtomicUsize::new(0));
                let seen = Arc::new(AtomicUsize::new(0));
                let seen2 = seen.clone();
                fiber::scope(|s| {
                    let root = s.job();
                    s.spawn(move || chain(200, root, ready, seen2));
                });
                assert_eq!(seen.load(SeqCst), 21);
            })
        });
    }
}

/// A child's panic racing an explicit cancel of its scope (both fibers
/// running, each spinning a varying while first): the scope re-raises the
/// panic and its job ends FAILED whichever came first (failure dominates
/// cancellation; Kotlin: a child failure completes the parent
/// exceptionally even while it is cancelling).
#[test]
fn a_child_panic_racing_the_scopes_cancel_always_dominates() {
    within(60, || {
        rt2().block_on(|| {
            for round in 0..300u64 {
                let started = Arc::new(AtomicUsize::new(0));
                let mut job = None;
                let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
                    fiber::scope(|s| {
                        let j = s.job();
                        job = Some(j.clone());
                        let st = started.clone();
                        s.spawn(move || {
                            st.fetch_add(1, SeqCst);
                            while st.load(SeqCst) < 2 {
                                std::hint::spin_loop();
                            }
                            for _ in 0..(round % 7) * 50 {
                                std::hint::spin_loop();
                            }
                            std::panic::resume_unwind(Box::new("review30 child failure"));
                        });
                        let st = started.clone();
                        s.spawn(move || {
                            st.fetch_add(1, SeqCst);
                            while st.load(SeqCst) < 2 {
                                std::hint::spin_loop();
                            }
                            for _ in 0..(round % 5) * 70 {
                                std::hint::spin_loop();
                            }
                            j.cancel();
                        });
                    })
                }));
                let state = job.unwrap().state();
                let p = r.expect_err("the scope returned normally although a child panicked");
                assert_eq!(p.downcast_ref::<&str>(), Some(&"review30 child failure"));
                assert_eq!(state, fiber::JobState::Failed, "round {round}");
            }
        });
    });
}

/// The first reason stands: a `with_timeout` whose deadline fired keeps
/// `TimedOut` through a later explicit cancel of its enclosing scope, and
/// a scope cancelled explicitly before the deadline keeps `Cancelled`
/// when the deadline then passes.
#[test]
fn first_cancel_reason_stands_between_timeout_and_explicit_cancel() {
    on_runtime(|| {
        // Timeout first, explicit cancel after.
        let (job_tx, job_rx) = fiber::chan::bounded::<fiber::Job>(1);
        let r = fiber::scope(|s| {
            let sj = s.job();
            let h = s.spawn(move || {
                fiber::with_timeout(ms(20), || {
                    job_tx.send(fiber::Job::current()).unwrap();
                    let _ = fiber::non_cancellable(|| fiber::sleep(ms(80)));
                })
            });
            let tj = job_rx.recv().unwrap();
            fiber::sleep(ms(40)).unwrap();
            sj.cancel();
            assert_eq!(tj.cancel_reason(), Some(fiber::CancelReason::TimedOut));
            fiber::non_cancellable(|| h.join())
        });
        assert!(matches!(r, Ok(Err(fiber::TimedOut)) | Err(_)), "{r:?}");
        // Explicit cancel first, deadline after.
        let (job_tx, job_rx) = fiber::chan::bounded::<fiber::Job>(1);
        let r = fiber::scope(|s| {
            let sj = s.job();
            let h = s.spawn(move || {
                fiber::with_timeout(ms(40), || {
                    job_tx.send(fiber::Job::current()).unwrap();
                    let _ = fiber::non_cancellable(|| fiber::sleep(ms(80)));
                    7
                })
            });
            let tj = job_rx.recv().unwrap();
            sj.cancel();
            assert_eq!(tj.cancel_reason(), Some(fiber::CancelReason::Cancelled));
            fiber::non_cancellable(|| fiber::sleep(ms(60))).unwrap();
            assert_eq!(tj.cancel_reason(), Some(fiber::CancelReason::Cancelled));
            fiber::non_cancellable(|| h.join())
        });
        // The child was cancelled: its join reports that (the explicit
        // reason, not a timeout).
        match r {
            Err(e) => assert!(e.is_cancelled() && !e.is_timed_out(), "{e:?}"),
            Ok(v) => assert_ne!(v, Err(fiber::TimedOut), "explicit cancel came first"),
        }
    });
}

/// `cancel_and_join` of one's own job from a `fiber::blocking` call
/// returns `Err(Cancelled)` at once (Kotlin's `cancelAndJoin` of one's
/// own job: the caller is cancelled); of a sibling's job it returns the
/// sibling's final state only once the sibling has ended, after its
/// non-cancellable clean-up.
#[test]
fn cancel_and_join_from_blocking_of_own_and_of_a_siblings_job() {
    on_runtime(|| {
        fiber::scope(|s| {
            let seen = Arc::new(Mutex::new(None));
            let seen2 = seen.clone();
            let h = s.spawn(move || {
                let own = fiber::Job::current();
                let r = fiber::blocking(move || own.cancel_and_join());
                *seen2.lock().unwrap() = Some(r);
            });
            // The child cancelled itself: its join reports that.
            assert!(h.join().is_err_and(|e| e.is_cancelled()));
            assert_eq!(*seen.lock().unwrap(), Some(Err(fiber::Cancelled)));

            let cleaned = Arc::new(AtomicBool::new(false));
            let c2 = cleaned.clone();
            let (job_tx, job_rx) = fiber::chan::bounded::<fiber::Job>(1);
            s.spawn(move || {
                job_tx.send(fiber::Job::current()).unwrap();
                let _ = fiber::sleep(Duration::from_secs(60));
                fiber::non_cancellable(|| fiber::sleep(ms(50))).unwrap();
                c2.store(true, SeqCst);
            });
            let sib = job_rx.recv().unwrap();
            let joiner = s.spawn(move || {
                let r = fiber::blocking(move || sib.cancel_and_join());
                (r, cleaned.load(SeqCst))
            });
            let (r, cleaned) = joiner.join().unwrap();
            assert_eq!(r, Ok(fiber::JobState::Cancelled));
            assert!(cleaned, "cancel_and_join returned before the sibling's clean-up ended");
        });
    });
}

/// A supervisor scope cancelled from outside: every child ends cancelled
/// (Kotlin: cancelling a `SupervisorJob` cancels its children), and a
/// child's failure before that did not cancel the others.
#[test]
fn cancelling_a_supervisor_scope_cancels_every_child() {
    on_runtime(|| {
        let (job_tx, job_rx) = fiber::chan::bounded::<fiber::Job>(1);
        let outer = fiber::spawn(move || {
            fiber::supervisor_scope(|s| {
                job_tx.send(s.job()).unwrap();
                let bad = s.spawn(|| -> () { std::panic::resume_unwind(Box::new("supervised")) });
                assert!(bad.join().is_err());
                let hs: Vec<_> = (0..50)
                    .map(|_| s.spawn(|| fiber::sleep(Duration::from_secs(60))))
                    .collect();
                hs.into_iter()
                    .map(|h| fiber::non_cancellable(|| h.join()))
                    .filter(|r| r.as_ref().is_err_and(|e| e.is_cancelled()))
                    .count()
            })
        });
        let sj = job_rx.recv().unwrap();
        fiber::sleep(ms(20)).unwrap();
        assert!(sj.is_active(), "a supervised failure cancelled the supervisor");
        sj.cancel();
        assert_eq!(outer.join().unwrap(), 50);
        assert_eq!(sj.state(), fiber::JobState::Cancelled);
    });
}
