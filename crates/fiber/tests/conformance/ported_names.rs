//! Conformance: the names a port from std::thread, std::sync (with
//! `mpsc`), std's panic idioms and Kotlin's `Job` reaches for, written the
//! way the upstream documentation uses them: `JoinHandle::thread`,
//! `JoinError::is` / `downcast`, `?` on `Cancelled` and `TimedOut` in an
//! `io::Result` function, `fiber::sync::{Arc, Weak, atomic, mpsc}`,
//! `fiber::panicking`, `fiber::select_biased!`, and Kotlin's
//! `Job.children`, `Job.parent`, `Job.cancelChildren()` and the job behind
//! a `launch` handle. Each test runs on a one-worker and a two-worker
//! runtime where the worker count could matter.

// `Job` hashes and compares by identity (a pointer), never by its state, so
// the state it shares with other handles cannot move it in a set.
#![allow(clippy::mutable_key_type)]

use fiber::sync::atomic::{AtomicUsize, Ordering};
use fiber::sync::mpsc;
use fiber::sync::{Arc, Weak};
use fiber::{Cancelled, Job, JobState, TimedOut};
use std::any::Any;
use std::cell::Cell;
use std::collections::HashSet;
use std::io;
use std::time::Duration;

use crate::common::ms;

/// The panics these tests raise on purpose (kept out of the test output).
fn planned_panic(payload: &(dyn Any + Send)) -> bool {
    payload
        .downcast_ref::<&str>()
        .is_some_and(|m| m.contains("ported-names"))
        || payload
            .downcast_ref::<String>()
            .is_some_and(|m| m.contains("ported-names"))
        || payload.is::<Cell<u8>>()
}

fn on_both(body: fn()) {
    for rt in [crate::common::rt1(), crate::common::rt2()] {
        crate::common::within(30, move || rt.block_on(body));
    }
}

// ---- std::thread ---------------------------------------------------------

#[test]
fn join_handle_thread_names_the_fiber_and_unparks_it() {
    on_both(|| {
        let (tx, rx) = fiber::chan::bounded::<()>(0);
        let h = fiber::Builder::new()
            .name("parked")
            .spawn(move || {
                tx.send(()).unwrap();
                fiber::park();
                fiber::current().id()
            })
            .unwrap();
        rx.recv().unwrap();
        assert_eq!(h.thread().id(), h.id());
        assert_eq!(h.thread().name(), Some("parked"));
        h.thread().unpark();
        let id = h.id();
        assert_eq!(h.join().unwrap(), id);

        fiber::scope(|s| {
            let h = s.spawn(|| fiber::current().id());
            assert_eq!(h.thread().id(), h.id());
            let id = h.id();
            assert_eq!(h.join().unwrap(), id);
        });
    });
}

/// std's idiom on the error of `JoinHandle::join`: `is::<T>()` and
/// `downcast::<T>()`, for string payloads and for a payload that is not
/// `Sync` (which `downcast_ref` cannot lend).
#[test]
fn join_error_is_and_downcast_follow_std_box_any() {
    crate::common::fuzz::quiet_panics(planned_panic);
    on_both(|| {
        let err = fiber::spawn(|| -> () { panic!("ported-names static") })
            .join()
            .unwrap_err();
        assert!(err.is::<&str>());
        assert!(!err.is::<String>());
        let err = err.downcast::<String>().unwrap_err();
        assert!(err.is_panic(), "a failed downcast hands the error back intact");
        assert_eq!(*err.downcast::<&str>().unwrap(), "ported-names static");

        let n = std::hint::black_box(3);
        let err = fiber::spawn(move || -> () { panic!("ported-names {n}") })
            .join()
            .unwrap_err();
        assert!(err.is::<String>());
        assert_eq!(*err.downcast::<String>().unwrap(), "ported-names 3");

        // Send but not Sync: only by value.
        let err = fiber::spawn(|| -> () { std::panic::panic_any(Cell::new(7u8)) })
            .join()
            .unwrap_err();
        assert!(err.is::<Cell<u8>>());
        let err = err.downcast::<u8>().unwrap_err();
        assert!(err.is::<Cell<u8>>());
        assert_eq!(err.downcast::<Cell<u8>>().unwrap().get(), 7);

        // Not a panic: nothing to downcast, and the error comes back.
        let (_tx, rx) = fiber::chan::bounded::<()>(0);
        let h = fiber::spawn(move || rx.recv().is_ok());
        fiber::yield_now().unwrap();
        h.cancel();
        let err = h.join().unwrap_err();
        assert!(!err.is::<&str>() && !err.is::<()>());
        let err = err.downcast::<&str>().unwrap_err();
        assert!(err.is_cancelled());
    });
}

#[test]
fn root_level_names_a_port_uses() {
    on_both(|| {
        assert!(!fiber::panicking());
        struct Probe(Arc<AtomicUsize>);
        impl Drop for Probe {
            fn drop(&mut self) {
                if fiber::panicking() {
                    self.0.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
        crate::common::fuzz::quiet_panics(planned_panic);
        let seen = Arc::new(AtomicUsize::new(0));
        let probe = Probe(seen.clone());
        let err = fiber::spawn(move || {
            let _probe = probe;
            panic!("ported-names unwind");
        })
        .join()
        .unwrap_err();
        assert!(err.is_panic());
        assert_eq!(seen.load(Ordering::SeqCst), 1, "the destructor saw its fiber unwinding");

        let (tx, rx) = fiber::chan::bounded(1);
        tx.send(5).unwrap();
        let got = fiber::select_biased! {
            recv(rx) -> v => v.unwrap(),
            default => 0,
        };
        assert_eq!(got, 5);
    });
}

// ---- ? in io::Result functions -------------------------------------------

fn sleeps_then_ok(d: Duration) -> io::Result<u32> {
    fiber::sleep(d)?;
    Ok(1)
}

fn times_out(limit: Duration) -> io::Result<u32> {
    let value = fiber::with_timeout(limit, || {
        let _ = fiber::sleep(Duration::from_secs(60));
        1
    })?;
    Ok(value)
}

#[test]
fn cancelled_and_timed_out_convert_into_io_errors() {
    on_both(|| {
        assert_eq!(sleeps_then_ok(ms(1)).unwrap(), 1);
        let h = fiber::spawn(|| sleeps_then_ok(Duration::from_secs(60)));
        fiber::yield_now().unwrap();
        h.cancel();
        match h.join() {
            // The body saw the cancellation and converted it.
            Ok(Err(e)) => {
                assert_eq!(e.kind(), io::ErrorKind::Other);
                assert!(e.get_ref().is_some_and(|inner| inner.is::<Cancelled>()), "{e:?}");
            }
            Ok(Ok(v)) => panic!("a cancelled sleep returned {v}"),
            // A cancelled fiber's value is dropped: the join reports the
            // cancellation itself.
            Err(e) => assert!(e.is_cancelled(), "{e}"),
        }
        // The conversion itself, as a net call would return it.
        let e: io::Error = Cancelled.into();
        assert_eq!(e.kind(), io::ErrorKind::Other);
        assert_eq!(e.to_string(), Cancelled.to_string());

        let e = times_out(ms(5)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(e.get_ref().is_some_and(|inner| inner.is::<TimedOut>()), "{e:?}");
    });
}

// ---- std::sync and std::sync::mpsc ---------------------------------------

/// std's `Arc` / `Weak` / `atomic` through `fiber::sync`, with a fiber
/// `Mutex` in the `Arc` (the std documentation's shared-counter example).
#[test]
fn sync_reexports_std_arc_weak_and_atomics() {
    on_both(|| {
        let counter = Arc::new(fiber::sync::Mutex::new(0));
        let weak: Weak<_> = Arc::downgrade(&counter);
        let hits = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..10)
            .map(|_| {
                let counter = Arc::clone(&counter);
                let hits = hits.clone();
                fiber::spawn(move || {
                    *counter.lock().unwrap() += 1;
                    hits.fetch_add(1, Ordering::Relaxed);
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(*counter.lock().unwrap(), 10);
        assert_eq!(hits.load(Ordering::Relaxed), 10);
        drop(counter);
        assert!(weak.upgrade().is_none());
    });
}

/// std's `mpsc` documentation examples: a channel filled from several
/// producers (here fibers and a plain thread), a `sync_channel(0)`
/// rendezvous, and the errors of a disconnected channel.
#[test]
fn mpsc_follows_std_documentation() {
    on_both(|| {
        let (tx, rx) = mpsc::channel();
        for i in 0..10 {
            let tx = tx.clone();
            fiber::spawn(move || tx.send(i).unwrap());
        }
        let thread_tx = tx.clone();
        let t = std::thread::spawn(move || thread_tx.send(100).unwrap());
        drop(tx);
        let mut got: Vec<i32> = rx.iter().collect();
        got.sort();
        assert_eq!(got, (0..10).chain([100]).collect::<Vec<_>>());
        t.join().unwrap();

        // A rendezvous: the sender waits until the value is taken.
        let (tx, rx): (mpsc::SyncSender<u8>, mpsc::Receiver<u8>) = mpsc::sync_channel(0);
        assert_eq!(tx.try_send(1), Err(mpsc::TrySendError::Full(1)));
        let sender = fiber::spawn(move || tx.send(2));
        assert_eq!(rx.recv(), Ok(2));
        assert_eq!(sender.join().unwrap(), Ok(()));
        // Every sender is gone now.
        assert_eq!(rx.recv(), Err(mpsc::RecvError));
        assert_eq!(rx.try_recv(), Err(mpsc::TryRecvError::Disconnected));
        assert_eq!(rx.recv_timeout(ms(1)), Err(mpsc::RecvTimeoutError::Disconnected));

        // A bounded buffer: sends beyond it wait; a dropped receiver hands
        // the value back.
        let (tx, rx) = mpsc::sync_channel(1);
        tx.send(1).unwrap();
        assert_eq!(tx.try_send(2), Err(mpsc::TrySendError::Full(2)));
        assert_eq!(rx.recv_timeout(ms(1)), Ok(1));
        assert_eq!(rx.recv_timeout(ms(1)), Err(mpsc::RecvTimeoutError::Timeout));
        drop(rx);
        assert_eq!(tx.send(3), Err(mpsc::SendError(3)));
        let mut iter_rx = {
            let (tx, rx) = mpsc::channel();
            tx.send("a").unwrap();
            rx.into_iter()
        };
        assert_eq!(iter_rx.next(), Some("a"));
        assert_eq!(iter_rx.next(), None);
    });
}

// ---- Kotlin Job ----------------------------------------------------------

/// `val job = launch { .. }`: the job behind a scoped handle is the one
/// the child sees as `Job::current()`, and its states follow Kotlin's
/// `isActive` / `isCancelled` / `isCompleted` table.
#[test]
fn a_scoped_handle_exposes_the_childs_job() {
    on_both(|| {
        fiber::scope(|s| {
            let (go_tx, go_rx) = fiber::chan::bounded::<()>(0);
            let h = s.spawn(move || {
                let me = Job::current();
                let _ = go_rx.recv();
                me
            });
            let job = h.job();
            assert!(job.is_active() && !job.is_cancelled() && !job.is_completed());
            go_tx.send(()).unwrap();
            assert_eq!(job.join(), Ok(JobState::Completed));
            assert!(!job.is_active() && !job.is_cancelled() && job.is_completed());
            assert_eq!(h.join().unwrap(), job, "the handle's job is the child's own");

            let (_hold, rx) = fiber::chan::bounded::<()>(0);
            let h = s.spawn(move || rx.recv().is_ok());
            let job = h.job();
            job.cancel();
            assert!(!job.is_active() && job.is_cancelled());
            assert_eq!(job.join(), Ok(JobState::Cancelled));
            assert!(job.is_completed());
            assert!(h.join().unwrap_err().is_cancelled());
            assert!(s.job().is_active(), "a cancelled child leaves its scope active");
        });
    });
}

/// Kotlin's `Job.children` lists the children that have not completed,
/// including the jobs of scopes and timeouts opened directly in the job,
/// and `Job.parent` walks back up.
#[test]
fn children_and_parent_follow_kotlin() {
    on_both(|| {
        let root = Job::current();
        assert_eq!(root.parent(), None);
        assert!(root.children().is_empty());
        fiber::scope(|s| {
            let scope_job = s.job();
            assert_eq!(scope_job.parent().as_ref(), Some(&root));
            assert_eq!(root.children(), vec![scope_job.clone()]);

            let (release_tx, release_rx) = fiber::chan::bounded::<()>(0);
            let waiting: Vec<_> = (0..3)
                .map(|_| {
                    let rx = release_rx.clone();
                    s.spawn(move || {
                        let _ = rx.recv();
                    })
                })
                .collect();
            let done = s.spawn(|| ());
            let done_job = done.job();
            done.join().unwrap();
            let expected: HashSet<Job> = waiting.iter().map(|h| h.job()).collect();
            let listed: HashSet<Job> = scope_job.children().into_iter().collect();
            assert_eq!(listed, expected, "ended children are not listed");
            assert!(!listed.contains(&done_job));
            for child in &listed {
                assert_eq!(child.parent().as_ref(), Some(&scope_job));
            }

            // A nested scope and a `with_timeout` body are children too.
            fiber::scope(|inner| {
                assert!(scope_job.children().contains(&inner.job()));
                assert_eq!(inner.job().parent().as_ref(), Some(&scope_job));
            });
            fiber::with_timeout(Duration::from_secs(60), || {
                let timeout_job = Job::current();
                assert_eq!(timeout_job.parent().as_ref(), Some(&scope_job));
                assert!(scope_job.children().contains(&timeout_job));
            })
            .unwrap();

            drop(release_tx);
            for h in waiting {
                h.join().unwrap();
            }
            assert!(scope_job.children().is_empty());
        });
        assert!(root.children().is_empty());

        // A scope opened directly inside `non_cancellable` is detached.
        fiber::non_cancellable(|| {
            fiber::scope(|s| {
                assert_eq!(s.job().parent(), None);
                assert!(!root.children().contains(&s.job()));
            })
        });
    });
}

/// Kotlin's `Job.cancelChildren()`: every child is cancelled (each
/// parked child wakes with `Cancelled`), the job itself stays active, and
/// a child started afterwards runs normally.
#[test]
fn cancel_children_cancels_the_children_not_the_job() {
    on_both(|| {
        let outcome = fiber::scope(|s| {
            let (_hold, rx) = fiber::chan::bounded::<()>(0);
            let parked: Vec<_> = (0..4)
                .map(|_| {
                    let rx = rx.clone();
                    s.spawn(move || match rx.recv() {
                        Err(_) if fiber::is_cancelled() => "cancelled",
                        Err(_) => "disconnected",
                        Ok(()) => "received",
                    })
                })
                .collect();
            // A grandchild under a child's nested scope is reached as well.
            let nested = s.spawn(move || {
                fiber::scope(|inner| {
                    let (_hold, rx) = fiber::chan::bounded::<()>(0);
                    inner.spawn(move || rx.recv().is_err()).join()
                })
            });
            for h in &parked {
                crate::common::wait_fiber_parked(h.id());
            }
            s.job().cancel_children();
            assert!(s.job().is_active(), "the job itself is not cancelled");
            assert!(!fiber::is_cancelled(), "the scope's body is not cancelled");
            for h in parked {
                let job = h.job();
                assert!(h.join().unwrap_err().is_cancelled());
                assert_eq!(job.state(), JobState::Cancelled);
            }
            assert!(nested.join().unwrap_err().is_cancelled());
            // Later children start uncancelled.
            s.spawn(|| {
                fiber::sleep(ms(1)).unwrap();
                7
            })
            .join()
            .unwrap()
        });
        assert_eq!(outcome, 7);
        // Cancelling the children of a job with none is a no-op.
        Job::current().cancel_children();
        assert!(Job::current().is_active());
    });
}

#[test]
fn jobs_compare_and_hash_by_identity() {
    on_both(|| {
        let a = Job::current();
        let b = Job::current();
        assert_eq!(a, b);
        let other = fiber::scope(|s| s.job());
        assert_ne!(a, other);
        let set: HashSet<Job> = [a.clone(), b, other.clone()].into_iter().collect();
        assert_eq!(set.len(), 2);
        assert!(set.contains(&a) && set.contains(&other));
    });
}

/// Kotlin's `invokeOnCompletion`: each handler runs once with the final
/// state, in the order added; on an ended job at once, on the caller; a
/// panicking handler stops neither the others nor the job's end; a scope
/// returns only after its children's handlers have run.
#[test]
fn invoke_on_completion_follows_kotlin() {
    crate::common::fuzz::quiet_panics(planned_panic);
    on_both(|| {
        let log = Arc::new(fiber::sync::Mutex::new(Vec::new()));
        let record = |tag: &'static str| {
            let log = log.clone();
            move |state: JobState| log.lock().unwrap().push((tag, state))
        };
        fiber::supervisor_scope(|s| {
            let (_hold, rx) = fiber::chan::bounded::<()>(0);
            let (go_tx, go_rx) = fiber::chan::bounded::<()>(0);
            let ok = s.spawn(move || {
                let _ = go_rx.recv();
                1
            });
            let stopped = s.spawn(move || rx.recv().is_ok());
            let failed = s.spawn(|| -> u32 { panic!("ported-names handler child") });
            ok.job().invoke_on_completion(record("ok first"));
            ok.job().invoke_on_completion(|_| panic!("ported-names handler"));
            ok.job().invoke_on_completion(record("ok third"));
            stopped.job().invoke_on_completion(record("stopped"));
            let failed_job = failed.job();
            assert!(failed.join().unwrap_err().is_panic());
            // Ended already: runs now, here.
            let here = std::thread::current().id();
            let ran_here = Arc::new(AtomicUsize::new(0));
            {
                let ran_here = ran_here.clone();
                failed_job.invoke_on_completion(move |state| {
                    assert_eq!(state, JobState::Failed);
                    assert_eq!(std::thread::current().id(), here);
                    ran_here.fetch_add(1, Ordering::SeqCst);
                });
            }
            assert_eq!(ran_here.load(Ordering::SeqCst), 1);
            stopped.cancel();
            go_tx.send(()).unwrap();
        });
        let mut log = log.lock().unwrap().clone();
        log.sort_by_key(|(tag, _)| *tag);
        assert_eq!(
            log,
            [
                ("ok first", JobState::Completed),
                ("ok third", JobState::Completed),
                ("stopped", JobState::Cancelled),
            ],
            "every handler ran, the panicking one did not stop the next"
        );

        // Many children on every worker: all handlers ran once the scope
        // returned.
        let ran = Arc::new(AtomicUsize::new(0));
        fiber::scope(|s| {
            for i in 0..200 {
                let h = s.spawn(move || {
                    if i % 3 == 0 {
                        fiber::yield_now().unwrap();
                    }
                    i
                });
                let ran = ran.clone();
                h.job().invoke_on_completion(move |state| {
                    assert_eq!(state, JobState::Completed);
                    ran.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        assert_eq!(ran.load(Ordering::SeqCst), 200);

        // A handler may use the job it belongs to: read its state, add
        // another handler (which runs at once: the job has ended).
        let nested = Arc::new(AtomicUsize::new(0));
        fiber::scope(|s| {
            let h = s.spawn(|| ());
            let job = h.job();
            let nested = nested.clone();
            let again = job.clone();
            job.invoke_on_completion(move |state| {
                assert_eq!(again.state(), state);
                assert!(again.is_completed());
                let nested2 = nested.clone();
                again.invoke_on_completion(move |_| {
                    nested2.fetch_add(10, Ordering::SeqCst);
                });
                nested.fetch_add(1, Ordering::SeqCst);
            });
        });
        assert_eq!(nested.load(Ordering::SeqCst), 11);

        // A with_timeout job that times out ends CANCELLED; a fiber's own
        // root job ends when its body does.
        let (tx, rx) = fiber::chan::bounded(2);
        let timeout_tx = tx.clone();
        let _ = fiber::with_timeout(ms(2), move || {
            Job::current().invoke_on_completion(move |state| timeout_tx.send(("timeout", state)).unwrap());
            let _ = fiber::sleep(Duration::from_secs(60));
        });
        fiber::spawn(move || {
            Job::current().invoke_on_completion(move |state| tx.send(("root", state)).unwrap());
        });
        let mut got = [rx.recv().unwrap(), rx.recv().unwrap()];
        got.sort_by_key(|(tag, _)| *tag);
        assert_eq!(got, [("root", JobState::Completed), ("timeout", JobState::Cancelled)]);
    });
}

/// Kotlin's `Job()` / `CompletableJob.complete()` / `CoroutineScope(job)
/// .launch`: a job with no fiber of its own stays active until completed,
/// then ends once its children have; `complete` says whether this call did
/// it.
#[test]
fn a_standalone_job_completes_after_its_children() {
    on_both(|| {
        let job = Job::new(None);
        assert!(job.is_active() && job.parent().is_none());
        let (go_tx, go_rx) = fiber::chan::bounded::<()>(0);
        let waiting = job.spawn(move || {
            let _ = go_rx.recv();
            5
        });
        let quick = job.spawn(|| 1);
        assert_eq!(quick.join().unwrap(), 1);
        assert!(job.complete());
        assert!(!job.complete(), "a second complete does nothing");
        assert!(job.is_active(), "completing: a child still runs");
        assert_eq!(job.children(), vec![waiting.job()]);
        // A child spawned while it completes is waited for as well.
        let late = job.spawn(|| 7);
        go_tx.send(()).unwrap();
        assert_eq!(job.join(), Ok(JobState::Completed));
        assert_eq!(waiting.join().unwrap(), 5);
        assert_eq!(late.join().unwrap(), 7);
        // Ended: a child spawned now starts cancelled, its closure unrun.
        let ran = Arc::new(AtomicUsize::new(0));
        let ran2 = ran.clone();
        let after = job.spawn(move || ran2.fetch_add(1, Ordering::SeqCst));
        assert!(after.join().unwrap_err().is_cancelled());
        assert_eq!(ran.load(Ordering::SeqCst), 0);
        assert_eq!(job.state(), JobState::Completed);

        // Completed with no children: ends at once.
        let empty = Job::new(None);
        assert!(empty.complete());
        assert_eq!(empty.state(), JobState::Completed);
    });
}

/// Cancelling a standalone job ends it once its children have (no
/// `complete` needed, as Kotlin's `Job().cancel()`); a child's panic fails
/// a plain job and cancels the siblings, while a supervisor job keeps
/// going.
#[test]
fn a_standalone_job_is_cancelled_or_failed_like_kotlins() {
    crate::common::fuzz::quiet_panics(planned_panic);
    on_both(|| {
        let empty = Job::new(None);
        empty.cancel();
        assert_eq!(empty.state(), JobState::Cancelled, "no children: ended at once");
        assert!(!empty.complete());

        let job = Job::new(None);
        let (_hold, rx) = fiber::chan::bounded::<()>(0);
        let parked: Vec<_> = (0..3)
            .map(|_| {
                let rx = rx.clone();
                job.spawn(move || rx.recv().is_ok())
            })
            .collect();
        for h in &parked {
            crate::common::wait_fiber_parked(h.id());
        }
        job.cancel();
        assert_eq!(job.join(), Ok(JobState::Cancelled));
        for h in parked {
            assert!(h.join().unwrap_err().is_cancelled());
        }

        // A child's panic fails a plain job and cancels its siblings.
        let job = Job::new(None);
        let (_hold, rx) = fiber::chan::bounded::<()>(0);
        let sibling = job.spawn(move || rx.recv().is_ok());
        crate::common::wait_fiber_parked(sibling.id());
        let failing = job.spawn(|| -> u32 { panic!("ported-names standalone child") });
        assert_eq!(job.join(), Ok(JobState::Failed));
        assert!(failing.join().unwrap_err().is_panic());
        assert!(sibling.join().unwrap_err().is_cancelled());

        // A supervisor keeps going: the failure stays with the child.
        let sup = Job::new_supervisor(None);
        let failing = sup.spawn(|| -> u32 { panic!("ported-names supervised child") });
        assert!(failing.join().unwrap_err().is_panic());
        assert!(sup.is_active());
        assert_eq!(sup.spawn(|| 3).join().unwrap(), 3);
        assert!(sup.complete());
        assert_eq!(sup.join(), Ok(JobState::Completed));
    });
}

/// `Job(parent)`: the new job is the parent's child. The parent's cancel
/// reaches it and its children; a parent waits for it; a job made under a
/// parent that is cancelling starts cancelled (and, childless, ends).
#[test]
fn a_standalone_job_with_a_parent_is_its_child() {
    on_both(|| {
        fiber::scope(|s| {
            let child_job = Job::new(Some(&s.job()));
            assert_eq!(child_job.parent(), Some(s.job()));
            assert!(s.job().children().contains(&child_job));
            let (_hold, rx) = fiber::chan::bounded::<()>(0);
            let parked = child_job.spawn(move || rx.recv().is_ok());
            crate::common::wait_fiber_parked(parked.id());
            // Completed: the scope's end waits for it.
            assert!(child_job.complete());
            let closer = s.spawn(move || {
                // Cancel the parked grandchild through its own handle so
                // the standalone job can end.
                parked.cancel();
                parked.join().unwrap_err().is_cancelled()
            });
            assert!(closer.join().unwrap());
            assert_eq!(child_job.join(), Ok(JobState::Completed));
        });

        let outer = Job::new(None);
        let inner = Job::new(Some(&outer));
        let (_hold, rx) = fiber::chan::bounded::<()>(0);
        let parked = inner.spawn(move || rx.recv().is_ok());
        crate::common::wait_fiber_parked(parked.id());
        outer.cancel();
        assert!(parked.join().unwrap_err().is_cancelled());
        assert_eq!(inner.join(), Ok(JobState::Cancelled));
        assert_eq!(outer.join(), Ok(JobState::Cancelled));
        let born_cancelled = Job::new(Some(&outer));
        assert_eq!(born_cancelled.state(), JobState::Cancelled);
    });
}

/// Misuse names itself: `complete` and `spawn` on a job that runs a body
/// of its own, and `spawn` outside a fiber. A standalone job made and
/// joined on plain threads works.
#[test]
fn standalone_job_misuse_is_a_clear_panic() {
    on_both(|| {
        let message = crate::common::panic_message(|| {
            Job::current().complete();
        })
        .expect("complete on a fiber's job panics");
        assert!(
            message.contains("Job::complete") && message.contains("Job::new"),
            "{message}"
        );
        let message = crate::common::panic_message(|| {
            fiber::scope(|s| {
                s.job().spawn(|| ());
            });
        })
        .expect("spawn into a scope's job panics");
        assert!(
            message.contains("Job::spawn") && message.contains("Scope::spawn"),
            "{message}"
        );
    });
    let job = Job::new(None);
    let message = crate::common::panic_message(|| {
        job.spawn(|| ());
    })
    .expect("spawn outside a fiber panics");
    assert!(message.contains("outside a fiber"), "{message}");
    // Made on a plain thread, fed from a runtime, joined on a plain thread.
    let rt = crate::common::rt2();
    let handle = {
        let job = job.clone();
        rt.block_on(move || job.spawn(|| 11))
    };
    assert!(job.complete());
    assert_eq!(job.join(), Ok(JobState::Completed));
    assert_eq!(handle.join().unwrap(), 11);
}

/// `fiber::net::{UnixListener, UnixStream, UnixDatagram}` at the root, as
/// the TCP and UDP types are (they were only under `fiber::net::unix`).
#[test]
fn unix_sockets_are_named_at_the_root_of_fiber_net() {
    let _: Option<fiber::net::UnixListener> = None::<fiber::net::unix::UnixListener>;
    let _: Option<fiber::net::UnixStream> = None::<fiber::net::unix::UnixStream>;
    let _: Option<fiber::net::UnixDatagram> = None::<fiber::net::unix::UnixDatagram>;
    crate::common::within(20, || {
        fiber::run(|| {
            let (a, b) = fiber::net::UnixStream::pair().unwrap();
            use std::io::{Read, Write};
            (&a).write_all(b"ping").unwrap();
            let mut buf = [0u8; 4];
            (&b).read_exact(&mut buf).unwrap();
            assert_eq!(&buf, b"ping");
        })
    });
}
