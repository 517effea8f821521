//! A job's cancellation walks its subtree one job at a time. While one
//! canceller is part way down (here: held in a `tracing` layer right after
//! the job it cancels turned CANCELLING, before any child), a second
//! `cancel` of that job finds it already cancelling and returns at once.
//! A fiber below it that then joins the job must not be told it joins
//! itself: it is being cancelled, so `join` gives `Err(Cancelled)` as it
//! does once the walk has reached it. Each test runs in a child process
//! (the subscriber is global).
//!
//! Failed before the fix: `cancel_and_join` of an enclosing job panicked
//! with the self-join misuse message (seen once in the review-29 fuzzer
//! under shutdown: a scope child joining its sibling's job while the scope
//! was being cancelled).

use crate::common::*;

use crate::common::hold::{gate, install, message, ARMED};
use std::sync::atomic::Ordering::SeqCst;

/// One scope child cancels the scope and is held mid-walk; another joins
/// the scope's job (`cancel_and_join`: its own cancel finds the job
/// already cancelling).
#[test]
fn cancel_and_join_of_an_enclosing_job_while_its_cancel_is_in_flight() {
    in_child(
        "cancel_and_join_of_an_enclosing_job_while_its_cancel_is_in_flight",
        30,
        || {
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
                        assert!(j.is_cancelled(), "the scope's job is cancelling");
                        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| j.cancel_and_join()));
                        let in_flight = fiber::is_cancelled();
                        gate().release.0.send(()).unwrap();
                        tx.send((r.map_err(message), in_flight)).unwrap();
                    });
                })
            });
            let (joined, seen_cancelled) = rx.recv().unwrap();
            assert_eq!(
                joined,
                Ok(Err(fiber::Cancelled)),
                "join of an enclosing job being cancelled"
            );
            assert!(
                seen_cancelled,
                "fiber::is_cancelled() once the enclosing job is cancelling"
            );
        },
    );
}

/// The same with the join inside `with_timeout` (the joiner's cancel scope
/// is then a job two levels below the one being cancelled).
#[test]
fn cancel_and_join_under_with_timeout_while_the_cancel_is_in_flight() {
    in_child(
        "cancel_and_join_under_with_timeout_while_the_cancel_is_in_flight",
        30,
        || {
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
                        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            fiber::with_timeout(std::time::Duration::from_secs(60), || j.cancel_and_join())
                        }));
                        gate().release.0.send(()).unwrap();
                        tx.send(r.map_err(message)).unwrap();
                    });
                })
            });
            let joined = rx.recv().unwrap();
            // `with_timeout` reports the cancellation of its caller as
            // `Err(Cancelled)` of its own, or passes the body's on.
            assert!(
                matches!(joined, Ok(Err(_)) | Ok(Ok(Err(_)))),
                "join of an enclosing job being cancelled, under with_timeout: {joined:?}"
            );
        },
    );
}

/// A plain `join` of the enclosing job (no cancel of its own) while
/// another fiber's cancel of it is part way down: the joiner is being
/// cancelled, not joining itself.
#[test]
fn join_of_an_enclosing_job_while_its_cancel_is_in_flight() {
    in_child("join_of_an_enclosing_job_while_its_cancel_is_in_flight", 30, || {
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
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| j.join()));
                    gate().release.0.send(()).unwrap();
                    tx.send(r.map_err(message)).unwrap();
                });
            })
        });
        assert_eq!(rx.recv().unwrap(), Ok(Err(fiber::Cancelled)));
    });
}

/// Go's `context`: once `cancel` returns, every context derived from the
/// cancelled one is done. Here: once `Job::cancel` returns, a fiber
/// anywhere below the job reads `fiber::is_cancelled()` as true, even
/// while the first canceller of that job is still part way down.
#[test]
fn a_second_cancel_returns_only_once_the_subtree_is_cancelled() {
    in_child("a_second_cancel_returns_only_once_the_subtree_is_cancelled", 30, || {
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
                    // Two levels below the scope's job: this child's job
                    // and a nested scope's.
                    let seen = fiber::scope(|inner| {
                        let before = fiber::is_cancelled();
                        j.cancel();
                        let after = fiber::is_cancelled();
                        let child = inner.spawn(fiber::is_cancelled);
                        (before, after, child.join().ok())
                    });
                    gate().release.0.send(()).unwrap();
                    tx.send(seen).unwrap();
                });
            })
        });
        let (before, after, child) = rx.recv().unwrap();
        assert!(!before, "not cancelled before either cancel reached this fiber");
        assert!(after, "cancelled once a cancel of an enclosing job returned");
        // A child spawned in a cancelled scope starts cancelled (its join
        // reports that, or the value it saw).
        assert_ne!(
            child,
            Some(false),
            "a child of a cancelled scope saw itself not cancelled"
        );
    });
}

/// A scope opened inside `non_cancellable` has no parent (the held-off
/// cancellation must not reach it), but its fibers still run inside the
/// enclosing scope: a join of that scope's job from there would wait for
/// itself, and panics naming the misuse instead of hanging.
/// Failed before the fix: the join waited for ever (the chain from the
/// inner scope's job up to the outer one was lost).
#[test]
fn joining_the_enclosing_scope_from_a_scope_opened_in_non_cancellable_panics() {
    let msg = within(20, || {
        let rt = rt2();
        rt.block_on(|| {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                fiber::scope(|s| {
                    let j = s.job();
                    s.spawn(move || {
                        fiber::non_cancellable(|| {
                            fiber::scope(|inner| {
                                inner.spawn(move || {
                                    let _ = j.join();
                                });
                            })
                        })
                    });
                })
            }));
            r.err().map(message)
        })
    });
    assert!(
        msg.as_deref()
            .is_some_and(|m| m.contains("runs inside the job it joins")),
        "the self-join misuse panic, got {msg:?}"
    );
}
