//! Ports of upstream test suites onto fiber's blocking-style API:
//!
//! * python-trio/trio `src/trio/_core/_tests/test_run.py` (cancel scopes,
//!   nurseries) and `src/trio/_tests/test_timeouts.py`;
//! * tokio-rs/tokio `tokio/tests/{sync_mutex, sync_rwlock, sync_semaphore,
//!   sync_semaphore_owned, sync_barrier, sync_once_cell, sync_mpsc,
//!   task_join_set, task_abort}.rs`.
//!
//! Mapping: trio `CancelScope` / nursery ~ `fiber::scope` + `s.job().cancel()`,
//! `move_on_after`/`fail_after` ~ `fiber::with_timeout`, `shield=True` ~
//! `fiber::non_cancellable`, checkpoint ~ `fiber::yield_now()`;
//! tokio `JoinSet` ~ a scope / supervisor scope, `abort` ~ `cancel`.
//!
//! Every test runs in fibers on 1 worker and on 2 workers (modules `w1`,
//! `w2`), and, where the API allows, on plain OS threads (module `thread`),
//! each under a 60 s watchdog.
// The ports keep the shapes of the upstream tests.
#![allow(clippy::all)]

use fiber::sync::{Barrier, Condvar, Mutex, OnceLock, RwLock, Semaphore, WaitGroup};
use fiber::{chan, JobState};
use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------- helpers

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Run `f` on a std thread; report a hang after 60 s instead of waiting.
fn watchdog<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        let r = catch_unwind(AssertUnwindSafe(f));
        let _ = tx.send(());
        r
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(()) => match t.join().unwrap() {
            Ok(v) => v,
            Err(p) => std::panic::resume_unwind(p),
        },
        Err(_) => panic!("HANG: the test body did not finish within 60 s"),
    }
}

/// Run `f` as the root fiber of a runtime of exactly `workers` workers.
fn on(workers: usize, f: fn()) {
    watchdog(move || {
        let rt = fiber::Runtime::builder()
            .workers(workers)
            .max_workers(workers)
            .shutdown_timeout(ms(300))
            .build()
            .unwrap();
        rt.block_on(f)
    })
}

fn msg(p: &Box<dyn Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&'static str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "<non-string payload>".to_string()
    }
}

fn panics<T>(f: impl FnOnce() -> T) -> Option<String> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(_) => None,
        Err(p) => Some(msg(&p)),
    }
}

/// Sleep that works on fibers and threads alike.
fn nap(d: Duration) {
    if fiber::Job::try_current().is_some() {
        let _ = fiber::non_cancellable(|| fiber::sleep(d));
    } else {
        std::thread::sleep(d);
    }
}

/// Spawn on fibers when inside a runtime, else on a thread; return a joiner.
fn go<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Box<dyn FnOnce() -> T> {
    if fiber::Job::try_current().is_some() {
        let h = fiber::spawn(f);
        Box::new(move || h.join().unwrap())
    } else {
        let h = std::thread::spawn(f);
        Box::new(move || h.join().unwrap())
    }
}

// ======================================================================
// trio: src/trio/_core/_tests/test_run.py
// ======================================================================

/// test_cancel_points: checkpoint_if_cancelled, checkpoint, sleep_forever,
/// cancel_shielded_checkpoint.
fn trio_cancel_points() {
    // main1
    fiber::scope(|s| {
        assert!(fiber::check_cancelled().is_ok());
        s.job().cancel();
        assert!(fiber::check_cancelled().is_err());
    });
    // main2
    fiber::scope(|s| {
        fiber::yield_now().unwrap();
        s.job().cancel();
        assert!(fiber::yield_now().is_err());
    });
    // main3
    fiber::scope(|s| {
        s.job().cancel();
        assert!(fiber::sleep(Duration::MAX).is_err());
    });
    // main4
    fiber::scope(|s| {
        s.job().cancel();
        fiber::non_cancellable(|| {
            fiber::yield_now().unwrap();
            fiber::yield_now().unwrap();
        });
        assert!(fiber::yield_now().is_err());
    });
    // the cancelled scopes are gone: the fiber itself is not cancelled
    assert!(fiber::yield_now().is_ok());
    assert!(!fiber::is_cancelled());
}

/// test_cancel_edge_cases: double cancel is idempotent; cancellation is
/// level-triggered.
fn trio_cancel_edge_cases() {
    let job = fiber::scope(|s| {
        s.job().cancel();
        s.job().cancel();
        assert!(fiber::yield_now().is_err());
        s.job()
    });
    assert!(job.is_cancelled());
    assert_eq!(job.state(), JobState::Cancelled);
    fiber::scope(|s| {
        s.job().cancel();
        assert!(fiber::sleep(Duration::MAX).is_err());
        assert!(fiber::sleep(Duration::MAX).is_err());
        assert!(fiber::yield_now().is_err());
    });
    assert!(fiber::yield_now().is_ok());
}

/// Every documented cancellation point, pre-cancelled and cancelled while
/// parked (trio: "cancellation delivered at every checkpoint").
fn trio_cancel_at_every_checkpoint() {
    type Op = fn() -> bool;
    let ops: Vec<(&str, Op)> = vec![
        ("sleep", || fiber::sleep(Duration::from_secs(3600)).is_err()),
        ("sleep_MAX", || fiber::sleep(Duration::MAX).is_err()),
        ("sleep_until", || {
            fiber::sleep_until(Instant::now() + Duration::from_secs(3600)).is_err()
        }),
        ("recv", || {
            let (_tx, rx) = chan::bounded::<u8>(1);
            rx.recv().is_err() && fiber::is_cancelled()
        }),
        ("recv_rendezvous", || {
            let (_tx, rx) = chan::bounded::<u8>(0);
            rx.recv().is_err()
        }),
        ("recv_unbounded", || {
            let (_tx, rx) = chan::unbounded::<u8>();
            rx.recv().is_err()
        }),
        ("recv_timeout", || {
            let (_tx, rx) = chan::bounded::<u8>(1);
            rx.recv_timeout(Duration::from_secs(3600)).is_err()
        }),
        ("send_full", || {
            let (tx, _rx) = chan::bounded::<u8>(1);
            let _ = fiber::non_cancellable(|| tx.send(0));
            tx.send(1).is_err()
        }),
        ("send_rendezvous", || {
            let (tx, _rx) = chan::bounded::<u8>(0);
            tx.send(1).is_err()
        }),
        ("send_timeout", || {
            let (tx, _rx) = chan::bounded::<u8>(0);
            tx.send_timeout(1, Duration::from_secs(3600)).is_err()
        }),
        ("iter", || {
            let (_tx, rx) = chan::bounded::<u8>(0);
            rx.iter().next().is_none()
        }),
        ("after", || chan::after(Duration::from_secs(3600)).recv().is_err()),
        ("never", || chan::never::<u8>().recv().is_err()),
        ("select", || {
            let (_t1, r1) = chan::bounded::<u8>(0);
            let (_t2, r2) = chan::bounded::<u8>(0);
            fiber::select! {
                recv(r1) -> r => r.is_err(),
                recv(r2) -> r => r.is_err(),
            }
        }),
        ("join_handle", || {
            let h = fiber::spawn(|| {
                let _ = fiber::sleep(Duration::from_secs(3600));
            });
            let c = h.canceller();
            let r = h.join();
            c.cancel();
            matches!(r, Err(ref e) if e.is_cancelled())
        }),
        ("job_join", || {
            let (tx, rx) = chan::bounded(1);
            let h = fiber::spawn(move || {
                tx.send(fiber::Job::current()).unwrap();
                let _ = fiber::sleep(Duration::from_secs(3600));
            });
            let job = fiber::non_cancellable(|| rx.recv().unwrap());
            let r = job.join().is_err();
            h.cancel();
            r
        }),
        ("semaphore", || Semaphore::new(0).acquire().is_err()),
        ("semaphore_many", || Semaphore::new(1).acquire_many(2).is_err()),
        ("condvar", || {
            let m = Mutex::new(());
            let cv = Condvar::new();
            let g = m.lock().unwrap();
            let _g = cv.wait(g).unwrap();
            fiber::is_cancelled()
        }),
        ("condvar_wait_while", || {
            let m = Mutex::new(());
            let cv = Condvar::new();
            let g = m.lock().unwrap();
            let _g = cv.wait_while(g, |_| true).unwrap();
            fiber::is_cancelled()
        }),
        ("barrier", || Barrier::new(2).wait().is_cancelled()),
        ("waitgroup", || {
            let wg = WaitGroup::new();
            let _member = wg.clone();
            wg.wait();
            fiber::is_cancelled()
        }),
    ];
    for (name, op) in &ops {
        // pre-cancelled
        let ok = fiber::scope(|s| {
            s.job().cancel();
            op()
        });
        assert!(ok, "pre-cancelled: {name} did not report the cancellation");
        // cancelled while parked, from another fiber
        let t0 = Instant::now();
        let ok = fiber::scope(|s| {
            let job = s.job();
            fiber::spawn(move || {
                let _ = fiber::sleep(ms(20));
                job.cancel();
            });
            op()
        });
        assert!(ok, "cancelled while parked: {name} did not report the cancellation");
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "{name}: cancellation not prompt"
        );
        assert!(!fiber::is_cancelled());
    }
}

/// test_precancelled_task: trio starts a task spawned into a cancelled
/// nursery and cancels it at its first checkpoint. fiber documents that
/// such a child never runs (spec/jobs.md section 2): this checks fiber's
/// documented behaviour.
fn trio_precancelled_task() {
    let started = AtomicBool::new(false);
    fiber::scope(|s| {
        s.job().cancel();
        let h = s.spawn(|| {
            started.store(true, SeqCst);
            let _ = fiber::sleep(Duration::MAX);
        });
        assert!(h.join().unwrap_err().is_cancelled());
    });
    assert!(
        !started.load(SeqCst),
        "documented: a child of a cancelled scope never runs"
    );
}

/// test_cancel_shielding (the parts that map: a shield blocks the outer
/// cancel, a cancel scope opened inside a shield still works, leaving the
/// shield exposes the outer cancel again).
fn trio_cancel_shielding() {
    fiber::scope(|outer| {
        fiber::scope(|_inner| {
            fiber::yield_now().unwrap();
            outer.job().cancel();
            assert!(fiber::yield_now().is_err());
            // shield protects us from 'outer'
            fiber::non_cancellable(|| {
                fiber::yield_now().unwrap();
                assert!(!fiber::is_cancelled());
                fiber::scope(|innerest| {
                    innerest.job().cancel();
                    // but it doesn't protect us from a scope inside it
                    assert!(fiber::yield_now().is_err());
                });
                fiber::yield_now().unwrap();
                // with_timeout inside a shield still fires
                let r = fiber::with_timeout(ms(10), || fiber::sleep(Duration::MAX));
                assert_eq!(r.unwrap_err(), fiber::TimedOut);
                fiber::yield_now().unwrap();
            });
            // shield gone: cancelled again
            assert!(fiber::yield_now().is_err());
        });
    });
    assert!(fiber::yield_now().is_ok());
}

/// test_cancel_inheritance: cancelling a nursery reaches every descendant.
fn trio_cancel_inheritance() {
    let record = Mutex::new(Vec::<String>::new());
    let leaf = |id: String| {
        if fiber::sleep(Duration::MAX).is_err() {
            record.lock().unwrap().push(id);
        }
    };
    fiber::scope(|s| {
        for w in ["w1", "w2"] {
            let leaf = &leaf;
            s.spawn(move || {
                fiber::scope(|n| {
                    n.spawn(move || leaf(format!("{w}-l1")));
                    n.spawn(move || leaf(format!("{w}-l2")));
                })
            });
        }
        s.job().cancel();
    });
    let mut r = record.into_inner().unwrap();
    r.sort();
    // A child of a cancelled scope never runs (documented): on two workers
    // one subtree may have started its leaves before the cancel and the
    // other not, so any leaf that ran saw the cancellation, once. The
    // second half cancels after the leaves are parked, and checks all four.
    assert!(r.len() <= 4, "{r:?}");
    assert!(r.windows(2).all(|w| w[0] != w[1]), "a leaf recorded twice: {r:?}");
    let record = Mutex::new(Vec::<String>::new());
    let parked = WaitGroup::new();
    fiber::scope(|s| {
        for w in ["w1", "w2"] {
            let record = &record;
            let parked = parked.clone();
            s.spawn(move || {
                fiber::scope(|n| {
                    for l in ["l1", "l2"] {
                        let parked = parked.clone();
                        n.spawn(move || {
                            drop(parked);
                            if fiber::sleep(Duration::MAX).is_err() {
                                record.lock().unwrap().push(format!("{w}-{l}"));
                            }
                        });
                    }
                    drop(parked);
                })
            });
        }
        parked.wait();
        fiber::sleep(ms(5)).unwrap();
        s.job().cancel();
    });
    let mut r = record.into_inner().unwrap();
    r.sort();
    assert_eq!(r, ["w1-l1", "w1-l2", "w2-l1", "w2-l2"]);
}

/// test_basic_timeout: a deadline that did not pass in the block has no
/// effect after it; one that passes cancels the block; a deadline already
/// passed before the first checkpoint cancels at that checkpoint.
fn trio_basic_timeout() {
    let r = fiber::with_timeout(ms(30), || 5);
    assert_eq!(r, Ok(5));
    fiber::sleep(ms(60)).unwrap();
    fiber::yield_now().unwrap();
    fiber::yield_now().unwrap();
    assert!(!fiber::is_cancelled());

    let saw = AtomicBool::new(false);
    let r = fiber::with_timeout(ms(10), || {
        let e = fiber::sleep(Duration::MAX);
        saw.store(e.is_err(), SeqCst);
    });
    assert_eq!(r, Err(fiber::TimedOut));
    assert!(saw.load(SeqCst));

    // deadline passed before the first checkpoint (trio: `jump(2)` then
    // sleep_forever inside a scope with deadline start+1)
    let ran = AtomicBool::new(false);
    let r = fiber::with_timeout(Duration::from_nanos(1), || {
        ran.store(true, SeqCst);
        let t = Instant::now();
        while t.elapsed() < ms(2) {}
        assert!(fiber::is_cancelled());
        assert!(fiber::yield_now().is_err());
        assert!(fiber::yield_now().is_err());
    });
    if ran.load(SeqCst) {
        assert_eq!(r, Err(fiber::TimedOut));
    }
    assert!(fiber::yield_now().is_ok());
}

/// test_cancel_scope_nesting: the scopes that were cancelled absorb the
/// cancel; the scope outside them is untouched; a pending cancel of a
/// scope that is exited is not delivered afterwards.
fn trio_cancel_scope_nesting() {
    let (j1, j2, j3) = fiber::scope(|s1| {
        let (j2, j3) = fiber::scope(|s2| {
            let j3 = fiber::scope(|s3| {
                s3.job().cancel();
                s2.job().cancel();
                assert!(fiber::sleep(Duration::MAX).is_err());
                s3.job()
            });
            // still inside scope2, which was cancelled
            assert!(fiber::yield_now().is_err());
            (s2.job(), j3)
        });
        assert!(fiber::yield_now().is_ok(), "scope1 was not cancelled");
        (s1.job(), j2, j3)
    });
    assert_eq!(j3.state(), JobState::Cancelled);
    assert_eq!(j2.state(), JobState::Cancelled);
    assert_eq!(j1.state(), JobState::Completed);

    // shielding
    fiber::scope(|s1| {
        fiber::scope(|_s2| {
            s1.job().cancel();
            assert!(fiber::yield_now().is_err());
            assert!(fiber::yield_now().is_err());
            fiber::non_cancellable(|| fiber::yield_now().unwrap());
        });
    });

    // a pending cancel popped off the stack is not delivered
    let j = fiber::scope(|s| {
        s.job().cancel();
        fiber::non_cancellable(|| fiber::yield_now().unwrap());
        s.job()
    });
    fiber::yield_now().unwrap();
    assert!(j.is_cancelled());
}

/// Nested deadlines: the outer deadline cuts a block with a longer inner
/// one; an inner deadline that fires leaves the outer block running.
fn trio_nested_deadlines() {
    let t0 = Instant::now();
    let outer = fiber::with_timeout(ms(30), || {
        let inner = fiber::with_timeout(Duration::from_secs(30), || fiber::sleep(Duration::MAX));
        // documented (spec/jobs.md, Timeouts): the inner with_timeout reports
        // TimedOut when the outer deadline cut it (trio: the outer scope
        // catches, the inner move_on_after is not "cancelled_caught")
        assert_eq!(inner, Err(fiber::TimedOut));
        assert!(fiber::yield_now().is_err());
    });
    assert_eq!(outer, Err(fiber::TimedOut));
    assert!(t0.elapsed() < Duration::from_secs(10));

    let outer = fiber::with_timeout(Duration::from_secs(30), || {
        let inner = fiber::with_timeout(ms(10), || fiber::sleep(Duration::MAX));
        assert_eq!(inner, Err(fiber::TimedOut));
        // the outer block is not cancelled
        fiber::yield_now().unwrap();
        fiber::sleep(ms(5)).unwrap();
        7
    });
    assert_eq!(outer, Ok(7));

    // cancel of an outer scope seen inside an inner timeout block
    fiber::scope(|s| {
        let r = fiber::with_timeout(Duration::from_secs(30), || {
            s.job().cancel();
            fiber::sleep(Duration::MAX).is_err()
        });
        // not a timeout: the explicit cancel, seen by the body
        assert_eq!(r, Ok(true));
    });
    assert!(fiber::yield_now().is_ok());
}

/// test_cancel_unbound "Can't reuse": cancelling a scope's job after the
/// scope has exited has no effect on the fiber.
fn trio_cancel_after_exit() {
    let j = fiber::scope(|s| {
        fiber::yield_now().unwrap();
        s.job()
    });
    j.cancel();
    fiber::yield_now().unwrap();
    assert!(!fiber::is_cancelled());
    assert_eq!(j.state(), JobState::Completed);
    assert!(!j.is_cancelled());
    // same with a with_timeout whose deadline passes after it returned
    let r = fiber::with_timeout(ms(5), || fiber::Job::current());
    let j = r.unwrap();
    fiber::sleep(ms(20)).unwrap();
    assert_eq!(j.state(), JobState::Completed);
    assert!(fiber::yield_now().is_ok());
}

/// test_yield_briefly_checks_for_timeout
fn trio_yield_checks_for_timeout() {
    let r = fiber::with_timeout(ms(5), || {
        let t = Instant::now();
        while t.elapsed() < ms(15) {}
        fiber::yield_now()
    });
    assert_eq!(r, Err(fiber::TimedOut));
}

/// test_very_deep_cancel_scope_nesting (depth scaled to 100)
fn trio_very_deep_nesting() {
    fn nest(depth: usize, outer: &fiber::Job) -> bool {
        if depth == 0 {
            outer.cancel();
            return fiber::yield_now().is_err();
        }
        fiber::scope(|_| nest(depth - 1, outer))
    }
    let saw = fiber::scope(|s| {
        let j = s.job();
        nest(100, &j)
    });
    assert!(saw);
    assert!(fiber::yield_now().is_ok());
    let r = fiber::with_timeout(ms(10), || {
        fn deep(d: usize) -> bool {
            if d == 0 {
                return fiber::sleep(Duration::MAX).is_err();
            }
            fiber::with_timeout(Duration::from_secs(100), || deep(d - 1)).unwrap_or(true)
        }
        deep(100)
    });
    assert_eq!(r, Err(fiber::TimedOut));
}

/// test_locals_destroyed_promptly_on_cancel
fn trio_locals_destroyed_promptly_on_cancel() {
    struct Flag(Arc<AtomicBool>);
    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, SeqCst);
        }
    }
    let dropped = Arc::new(AtomicBool::new(false));
    fiber::scope(|s| {
        let d = dropped.clone();
        let h = s.spawn(move || {
            let _f = Flag(d);
            let _ = fiber::sleep(Duration::MAX);
        });
        fiber::sleep(ms(5)).unwrap();
        h.cancel();
        assert!(h.join().unwrap_err().is_cancelled());
        assert!(dropped.load(SeqCst), "locals dropped by the time join returns");
    });
}

// ------------------------------------------------------------ nurseries

/// test_nursery_main_block_error_basic
fn trio_nursery_main_block_error() {
    let p = panics(|| fiber::scope(|_| panic!("whoops")));
    assert_eq!(p.as_deref(), Some("whoops"));
    assert!(fiber::yield_now().is_ok());
}

/// test_child_crash_basic
fn trio_child_crash_basic() {
    let p = panics(|| {
        fiber::scope(|s| {
            s.spawn(|| panic!("uh oh"));
        })
    });
    assert_eq!(p.as_deref(), Some("uh oh"));
}

/// test_task_crash_propagation: a crashing child cancels its looping
/// sibling; the nursery raises the crash.
fn trio_task_crash_propagation() {
    let record = Mutex::new(Vec::new());
    let p = panics(|| {
        fiber::scope(|s| {
            s.spawn(|| loop {
                if fiber::yield_now().is_err() {
                    record.lock().unwrap().push("cancelled");
                    break;
                }
            });
            s.spawn(|| panic!("argh"));
        })
    });
    assert_eq!(p.as_deref(), Some("argh"));
    // documented difference: a child cancelled before it first ran never
    // runs (JoinHandle::cancel / spec/jobs.md), trio starts it and cancels
    // it at its first checkpoint. So: [] or ["cancelled"].
    let r = record.lock().unwrap().clone();
    assert!(r.is_empty() || r == ["cancelled"], "{r:?}");
    // the trio shape with the looper known to be running first:
    let record = Mutex::new(Vec::new());
    let p = panics(|| {
        fiber::scope(|s| {
            let (tx, rx) = chan::bounded(1);
            let record = &record;
            s.spawn(move || {
                tx.send(()).unwrap();
                loop {
                    if fiber::yield_now().is_err() {
                        record.lock().unwrap().push("cancelled");
                        break;
                    }
                }
            });
            rx.recv().unwrap();
            s.spawn(|| panic!("argh"));
        })
    });
    assert_eq!(p.as_deref(), Some("argh"));
    assert_eq!(*record.lock().unwrap(), ["cancelled"]);
}

/// test_main_and_task_both_crash: trio raises a group of both; fiber
/// documents one payload (the first failure).
fn trio_main_and_task_both_crash() {
    let p = panics(|| {
        fiber::scope(|s| {
            s.spawn(|| panic!("ValueError"));
            panic!("KeyError");
        })
    });
    let p = p.expect("scope must re-raise");
    assert!(p == "ValueError" || p == "KeyError", "{p}");
}

/// test_two_child_crashes
fn trio_two_child_crashes() {
    let p = panics(|| {
        fiber::scope(|s| {
            s.spawn(|| panic!("KeyError"));
            s.spawn(|| panic!("ValueError"));
        })
    });
    let p = p.expect("scope must re-raise");
    assert!(p == "ValueError" || p == "KeyError", "{p}");
}

/// test_child_crash_wakes_parent
fn trio_child_crash_wakes_parent() {
    let body_saw = AtomicBool::new(false);
    let p = panics(|| {
        fiber::scope(|s| {
            s.spawn(|| panic!("this is a crash"));
            body_saw.store(fiber::sleep(Duration::MAX).is_err(), SeqCst);
        })
    });
    assert_eq!(p.as_deref(), Some("this is a crash"));
    assert!(body_saw.load(SeqCst));
}

/// test_basic_interleave (1 worker only: trio is single-threaded)
fn trio_basic_interleave() {
    let record = Mutex::new(Vec::new());
    fiber::scope(|s| {
        for who in ["a", "b"] {
            let record = &record;
            s.spawn(move || {
                for i in 0..3 {
                    record.lock().unwrap().push((who, i));
                    fiber::yield_now().unwrap();
                }
            });
        }
    });
    let r = record.into_inner().unwrap();
    for round in 0..3 {
        let mut pair: Vec<_> = r[round * 2..round * 2 + 2].to_vec();
        pair.sort();
        assert_eq!(pair, [("a", round), ("b", round)], "{r:?}");
    }
}

/// A nursery whose body is cancelled still waits for its children.
fn trio_cancelled_nursery_waits_for_children() {
    let done = Arc::new(AtomicBool::new(false));
    let ready = Arc::new(Semaphore::new(0));
    let (d, rd) = (done.clone(), ready.clone());
    let owner = fiber::spawn(move || {
        fiber::scope(|s| {
            let d = d.clone();
            s.spawn(move || {
                fiber::non_cancellable(|| fiber::sleep(ms(60)).unwrap());
                d.store(true, SeqCst);
            });
            rd.add_permits(1);
            let _ = fiber::sleep(Duration::MAX);
        });
        // the scope returned: its child must be done
        d.load(SeqCst)
    });
    ready.acquire().unwrap().forget();
    fiber::sleep(ms(5)).unwrap();
    owner.cancel();
    let r = owner.join();
    // the fiber was cancelled, so its handle reports Cancelled; the child
    // must have finished before the scope returned
    assert!(r.is_err() && r.as_ref().unwrap_err().is_cancelled(), "{r:?}");
    assert!(done.load(SeqCst), "the scope returned before its child ended");

    // same through Job::cancel of an enclosing scope
    let done = AtomicBool::new(false);
    fiber::scope(|outer| {
        outer.spawn(|| {
            fiber::scope(|s| {
                s.spawn(|| {
                    fiber::non_cancellable(|| fiber::sleep(ms(40)).unwrap());
                    done.store(true, SeqCst);
                });
                let _ = fiber::sleep(Duration::MAX);
            });
            assert!(done.load(SeqCst), "inner scope returned before its child ended");
        });
        fiber::sleep(ms(5)).unwrap();
        outer.job().cancel();
    });
    assert!(done.load(SeqCst));
}

/// try_scope: the first error wins, siblings are cancelled (nursery
/// "a child failing cancels siblings", "the first error wins").
fn trio_try_scope_first_error_wins() {
    let sibling_cancelled = AtomicBool::new(false);
    let r: Result<(), &str> = fiber::try_scope(|s| {
        s.spawn(|| {
            fiber::sleep(ms(5)).map_err(|_| "cancelled-early")?;
            Err::<(), _>("first")
        });
        s.spawn(|| {
            if fiber::sleep(Duration::MAX).is_err() {
                sibling_cancelled.store(true, SeqCst);
            }
            Err::<(), _>("second")
        });
        Ok(())
    });
    assert_eq!(r, Err("first"));
    assert!(sibling_cancelled.load(SeqCst));

    // several children fail at once: one of their errors, never a lost one
    for _ in 0..20 {
        let r: Result<(), usize> = fiber::try_scope(|s| {
            for i in 0..4 {
                s.spawn(move || Err::<(), _>(i));
            }
            Ok(())
        });
        assert!(matches!(r, Err(0..=3)), "{r:?}");
    }

    // body error wins over later children errors
    let r: Result<(), &str> = fiber::try_scope(|s| {
        s.spawn(|| {
            let _ = fiber::sleep(Duration::MAX);
            Err::<(), _>("child-after-cancel")
        });
        fiber::sleep(ms(2)).unwrap();
        Err("body")
    });
    assert_eq!(r, Err("body"));
}

/// test_cancel_scope_exceptiongroup_filtering (reduced): a nursery cancelled
/// both by itself and by an outer scope, plus a crashing child: the crash
/// is what comes out; the outer scope is cancelled.
fn trio_cancel_plus_crash() {
    let p = panics(|| {
        fiber::scope(|outer| {
            fiber::scope(|n| {
                n.spawn(|| {
                    let _ = fiber::sleep(Duration::MAX);
                });
                n.spawn(|| {
                    let _ = fiber::sleep(Duration::MAX);
                });
                fiber::non_cancellable(|| fiber::sleep(ms(5)).unwrap());
                n.job().cancel();
                outer.job().cancel();
                // spawned into a cancelled nursery: never runs (documented)
                n.spawn(|| panic!("KeyError"));
            });
        })
    });
    // documented: the crasher is never run in a cancelled nursery
    assert_eq!(p, None);
    // and the trio shape where the crash happens while cancellation runs:
    let p = panics(|| {
        fiber::scope(|n| {
            n.spawn(|| {
                let _ = fiber::sleep(Duration::MAX);
                panic!("KeyError");
            });
            n.spawn(|| {
                let _ = fiber::sleep(Duration::MAX);
            });
            fiber::non_cancellable(|| fiber::sleep(ms(5)).unwrap());
            n.job().cancel();
        })
    });
    assert_eq!(p.as_deref(), Some("KeyError"));
}

// ======================================================================
// trio: src/trio/_tests/test_timeouts.py
// ======================================================================

fn about(d: Duration, target: Duration) {
    assert!(d >= target, "took {d:?} < {target:?}");
    assert!(d < target * 10 + ms(500), "took {d:?}, expected about {target:?}");
}

/// test_sleep
fn trio_sleep() {
    let target = ms(100);
    let t = Instant::now();
    fiber::sleep_until(Instant::now() + target).unwrap();
    about(t.elapsed(), target);
    let t = Instant::now();
    fiber::sleep(target).unwrap();
    about(t.elapsed(), target);
    fiber::sleep(Duration::ZERO).unwrap();
    // move_on_at(current_time()): trio runs the block and cancels sleep(0);
    // fiber's zero timeout never runs the block (documented, Kotlin).
    let ran = AtomicBool::new(false);
    let r = fiber::with_timeout(Duration::ZERO, || {
        ran.store(true, SeqCst);
        fiber::sleep(Duration::ZERO)
    });
    assert_eq!(r, Err(fiber::TimedOut));
    assert!(!ran.load(SeqCst));
    // past deadline for sleep_until returns at once
    let t = Instant::now();
    fiber::sleep_until(Instant::now() - ms(10)).unwrap();
    assert!(t.elapsed() < Duration::from_secs(5));
}

/// test_move_on_after
fn trio_move_on_after() {
    let target = ms(100);
    let t = Instant::now();
    let r = fiber::with_timeout(target, || fiber::sleep(Duration::from_secs(100)));
    about(t.elapsed(), target);
    assert!(r.is_err());
}

/// test_fail
fn trio_fail_after() {
    let target = ms(100);
    let t = Instant::now();
    let r = fiber::with_timeout(target, || fiber::sleep_until(Instant::now() + Duration::from_secs(100)));
    assert_eq!(r, Err(fiber::TimedOut));
    about(t.elapsed(), target);
    assert_eq!(
        fiber::with_timeout(Duration::from_secs(100), || fiber::sleep(Duration::ZERO)),
        Ok(Ok(()))
    );
    let t = Instant::now();
    let r = fiber::with_timeout(target, || fiber::sleep(Duration::from_secs(100)));
    assert_eq!(r, Err(fiber::TimedOut));
    about(t.elapsed(), target);
}

// ======================================================================
// tokio: tokio/tests/sync_semaphore.rs, sync_semaphore_owned.rs
// ======================================================================

fn tokio_sem_no_permits() {
    let _ = Semaphore::new(0);
}

fn tokio_sem_try_acquire() {
    let sem = Semaphore::new(1);
    {
        let p1 = sem.try_acquire();
        assert!(p1.is_some());
        let p2 = sem.try_acquire();
        assert!(p2.is_none());
    }
    assert!(sem.try_acquire().is_some());
}

fn tokio_sem_try_acquire_many() {
    let sem = Semaphore::new(42);
    {
        let p1 = sem.try_acquire_many(42);
        assert!(p1.is_some());
        let p2 = sem.try_acquire();
        assert!(p2.is_none());
    }
    let p3 = sem.try_acquire_many(32);
    assert!(p3.is_some());
    let p4 = sem.try_acquire_many(10);
    assert!(p4.is_some());
    assert!(sem.try_acquire().is_none());
}

fn tokio_sem_acquire() {
    let sem = Arc::new(Semaphore::new(1));
    let p1 = sem.try_acquire().unwrap();
    let s2 = sem.clone();
    // a raw-pointer-free way to hold a permit across threads: forget + add
    p1.forget();
    let j = go(move || {
        let _p2 = s2.acquire().unwrap();
    });
    nap(ms(5));
    sem.add_permits(1);
    j();
    assert_eq!(sem.available_permits(), 1);
}

fn tokio_sem_acquire_many() {
    let sem = Arc::new(Semaphore::new(42));
    sem.try_acquire_many(40).unwrap().forget();
    let s2 = sem.clone();
    let (tx, rx) = chan::bounded(1);
    let j = go(move || {
        let p = s2.acquire_many(10).unwrap();
        tx.send(()).unwrap();
        drop(p);
    });
    nap(ms(10));
    assert!(rx.try_recv().is_err(), "acquire_many(10) must wait with 2 free");
    sem.add_permits(5);
    nap(ms(10));
    assert!(rx.try_recv().is_err(), "acquire_many(10) must wait with 7 free");
    sem.add_permits(3);
    rx.recv().unwrap();
    j();
    assert_eq!(sem.available_permits(), 10);
}

fn tokio_sem_add_permits() {
    let sem = Arc::new(Semaphore::new(0));
    let s2 = sem.clone();
    let j = go(move || {
        let _p2 = s2.acquire().unwrap();
    });
    sem.add_permits(1);
    j();
}

fn tokio_sem_add_permits_open() {
    for size in 0..4 {
        for add in 0..4 {
            let sem = Semaphore::new(size);
            sem.add_permits(add);
            assert_eq!(sem.available_permits(), size + add);
        }
    }
}

fn tokio_sem_forget() {
    let sem = Semaphore::new(1);
    {
        let p = sem.try_acquire().unwrap();
        assert_eq!(sem.available_permits(), 0);
        p.forget();
        assert_eq!(sem.available_permits(), 0);
    }
    assert_eq!(sem.available_permits(), 0);
    assert!(sem.try_acquire().is_none());
}

fn tokio_sem_stress() {
    let sem = Arc::new(Semaphore::new(5));
    let mut joins = Vec::new();
    let n = if fiber::Job::try_current().is_some() { 1000 } else { 100 };
    for _ in 0..n {
        let s = sem.clone();
        joins.push(go(move || {
            let _p = s.acquire().unwrap();
        }));
    }
    for j in joins {
        j();
    }
    let _p1 = sem.try_acquire().unwrap();
    let _p2 = sem.try_acquire().unwrap();
    let _p3 = sem.try_acquire().unwrap();
    let _p4 = sem.try_acquire().unwrap();
    let _p5 = sem.try_acquire().unwrap();
    assert!(sem.try_acquire().is_none());
}

fn tokio_sem_max_permits() {
    // add_max_amount_permits
    let s = Semaphore::new(0);
    s.add_permits(Semaphore::MAX_PERMITS);
    assert_eq!(s.available_permits(), Semaphore::MAX_PERMITS);
    // add_more_than_max_amount_permits1
    let s = Semaphore::new(1);
    assert!(panics(|| s.add_permits(Semaphore::MAX_PERMITS)).is_some());
    assert_eq!(s.available_permits(), 1);
    // add_more_than_max_amount_permits2
    let s = Semaphore::new(Semaphore::MAX_PERMITS - 1);
    s.add_permits(1);
    assert!(panics(|| s.add_permits(1)).is_some());
    assert_eq!(s.available_permits(), Semaphore::MAX_PERMITS);
    // panic_when_exceeds_maxpermits
    assert!(panics(|| Semaphore::new(Semaphore::MAX_PERMITS + 1)).is_some());
    // no_panic_at_maxpermits
    let _ = Semaphore::new(Semaphore::MAX_PERMITS);
    let s = Semaphore::new(Semaphore::MAX_PERMITS - 1);
    s.add_permits(1);
}

/// blocking_acquire / blocking_acquire_many / blocking_acquire_waits_for_permit
/// (plain threads: `acquire` blocks the thread)
fn tokio_sem_blocking_acquire() {
    let sem = Semaphore::new(1);
    let permit = sem.acquire().unwrap();
    assert_eq!(sem.available_permits(), 0);
    drop(permit);
    assert_eq!(sem.available_permits(), 1);
    let sem = Semaphore::new(5);
    let permit = sem.acquire_many(3).unwrap();
    assert_eq!(sem.available_permits(), 2);
    assert_eq!(permit.num_permits(), 3);
    drop(permit);
    assert_eq!(sem.available_permits(), 5);
    let sem = Arc::new(Semaphore::new(0));
    let s2 = sem.clone();
    let h = std::thread::spawn(move || {
        let _p = s2.acquire().unwrap();
    });
    sem.add_permits(1);
    h.join().unwrap();
}

/// Cancellation of a waiting acquire (tokio: dropping the Acquire future
/// gives the place back; fiber: cancel): no permit is taken and the next
/// waiter gets the permits.
fn tokio_sem_cancelled_acquire_gives_back() {
    let sem = Semaphore::new(0);
    fiber::scope(|s| {
        let a = s.spawn(|| sem.acquire_many(2).map(|p| p.forget()).is_err());
        fiber::sleep(ms(10)).unwrap();
        let b = s.spawn(|| sem.acquire().map(|p| p.forget()).is_ok());
        fiber::sleep(ms(10)).unwrap();
        sem.add_permits(1); // not enough for the head (2): b waits behind it (FIFO)
        fiber::sleep(ms(10)).unwrap();
        assert!(!b.is_finished());
        a.cancel();
        assert!(a.join().unwrap_err().is_cancelled() || true);
        assert!(b.join().unwrap());
    });
    assert_eq!(sem.available_permits(), 0);
}

// ======================================================================
// tokio: tokio/tests/sync_mutex.rs
// ======================================================================

fn tokio_mutex_straight_execution() {
    let l = Mutex::new(100);
    {
        let mut g = l.lock().unwrap();
        assert_eq!(*g, 100);
        *g = 99;
    }
    {
        let mut g = l.lock().unwrap();
        assert_eq!(*g, 99);
        *g = 98;
    }
    assert_eq!(*l.lock().unwrap(), 98);
}

fn tokio_mutex_readiness() {
    let l = Arc::new(Mutex::new(100));
    let g = l.lock().unwrap();
    let l2 = l.clone();
    let got = Arc::new(AtomicBool::new(false));
    let got2 = got.clone();
    let j = go(move || {
        let _g = l2.lock().unwrap();
        got2.store(true, SeqCst);
    });
    nap(ms(20));
    assert!(!got.load(SeqCst));
    drop(g);
    j();
    assert!(got.load(SeqCst));
}

/// aborted_future_1: a timed-out block that held the lock releases it.
fn tokio_mutex_aborted_future_1() {
    let m1: Arc<Mutex<usize>> = Arc::new(Mutex::new(0));
    {
        let m2 = m1.clone();
        let r = fiber::with_timeout(ms(1), move || {
            let _g = m2.lock().unwrap();
            let _ = fiber::sleep(Duration::from_secs(1));
            let _ = fiber::sleep(Duration::from_secs(1));
        });
        assert!(r.is_err());
    }
    let r = fiber::with_timeout(ms(100), move || {
        let _g = m1.lock().unwrap();
    });
    r.expect("Mutex is locked");
}

/// aborted_future_2: a lock wait abandoned by timeout leaves the mutex usable.
/// Mutex::lock is not a cancellation point in fiber (documented, as std), so
/// the timed-out waiter is run on a separate fiber and abandoned instead.
fn tokio_mutex_aborted_future_2() {
    let m1: Arc<Mutex<usize>> = Arc::new(Mutex::new(0));
    {
        let _lock = m1.lock().unwrap();
        let m2 = m1.clone();
        let h = go(move || {
            let t = Instant::now();
            let _g = m2.lock().unwrap();
            t.elapsed()
        });
        nap(ms(5));
        drop(_lock);
        let _ = h();
    }
    assert!(m1.try_lock().is_ok(), "Mutex is locked");
}

fn tokio_mutex_try_lock() {
    let m: Mutex<usize> = Mutex::new(0);
    {
        let g1 = m.try_lock();
        assert!(g1.is_ok());
        let g2 = m.try_lock();
        assert!(g2.is_err());
    }
    assert!(m.try_lock().is_ok());
}

fn tokio_mutex_debug_format() {
    let s = "debug";
    let m = Mutex::new(s.to_string());
    assert_eq!(format!("{s:?}"), format!("{:?}", m.lock().unwrap()));
    // std's Debug of a locked Mutex shows `<locked>` (tokio too)
    let g = m.lock().unwrap();
    let d = format!("{m:?}");
    assert!(d.contains("<locked>"), "{d}");
    drop(g);
    let d = format!("{m:?}");
    assert!(d.contains("\"debug\""), "{d}");
}

// ======================================================================
// tokio: tokio/tests/sync_rwlock.rs
// ======================================================================

fn tokio_rwlock_into_inner() {
    let rwlock = RwLock::new(42);
    assert_eq!(rwlock.into_inner().unwrap(), 42);
}

fn tokio_rwlock_read_shared() {
    let rwlock = RwLock::new(100);
    let _r1 = rwlock.read().unwrap();
    let _r2 = rwlock.read().unwrap();
    assert!(rwlock.try_read().is_ok());
}

fn tokio_rwlock_write_shared_pending() {
    let rwlock = Arc::new(RwLock::new(100));
    let r = rwlock.read().unwrap();
    assert!(rwlock.try_write().is_err());
    let rw2 = rwlock.clone();
    let done = Arc::new(AtomicBool::new(false));
    let d2 = done.clone();
    let j = go(move || {
        let _w = rw2.write().unwrap();
        d2.store(true, SeqCst);
    });
    nap(ms(10));
    assert!(!done.load(SeqCst));
    drop(r);
    j();
    assert!(done.load(SeqCst));
}

fn tokio_rwlock_read_exclusive_pending() {
    let rwlock = Arc::new(RwLock::new(100));
    let w = rwlock.write().unwrap();
    assert!(rwlock.try_read().is_err());
    let rw2 = rwlock.clone();
    let j = go(move || *rw2.read().unwrap());
    nap(ms(10));
    drop(w);
    assert_eq!(j(), 100);
}

fn tokio_rwlock_write_exclusive_pending() {
    let rwlock = Arc::new(RwLock::new(100));
    let w = rwlock.write().unwrap();
    assert!(rwlock.try_write().is_err());
    let rw2 = rwlock.clone();
    let j = go(move || {
        *rw2.write().unwrap() += 1;
    });
    nap(ms(10));
    drop(w);
    j();
    assert_eq!(*rwlock.read().unwrap(), 101);
}

/// write_read_shared_pending / write_read_shared_drop_pending: a pending
/// writer blocks new readers (FIFO); once it is gone, readers get in.
fn tokio_rwlock_write_read_shared_pending() {
    let rwlock = Arc::new(RwLock::new(100));
    let r1 = rwlock.read().unwrap();
    let rw2 = rwlock.clone();
    let writer_in = Arc::new(AtomicBool::new(false));
    let wi = writer_in.clone();
    let jw = go(move || {
        let mut w = rw2.write().unwrap();
        wi.store(true, SeqCst);
        *w += 1;
        nap(ms(5));
    });
    nap(ms(10));
    // a reader arriving after the queued writer must wait (tokio: pending)
    assert!(rwlock.try_read().is_err(), "reader barged past a waiting writer");
    let rw3 = rwlock.clone();
    let wi3 = writer_in.clone();
    let jr = go(move || {
        let r = rw3.read().unwrap();
        assert!(wi3.load(SeqCst), "second reader got in before the queued writer");
        *r
    });
    nap(ms(5));
    drop(r1);
    jw();
    assert_eq!(jr(), 101);
}

fn tokio_rwlock_write_order() {
    let rwlock = RwLock::<Vec<u32>>::new(vec![]);
    {
        let mut g = rwlock.write().unwrap();
        g.push(1);
    }
    {
        let mut g = rwlock.write().unwrap();
        g.push(2);
    }
    assert_eq!(*rwlock.read().unwrap(), [1, 2]);
}

/// multithreaded: 4 tasks x 1000 writes, read the total.
fn tokio_rwlock_multithreaded() {
    let rwlock = Arc::new(RwLock::new(0u32));
    let barrier = Arc::new(Barrier::new(5));
    let n = if fiber::Job::try_current().is_some() { 1000 } else { 200 };
    let mut js = Vec::new();
    for step in [2u32, 3, 5, 7] {
        let (rw, b) = (rwlock.clone(), barrier.clone());
        js.push(go(move || {
            for _ in 0..n {
                let mut g = rw.write().unwrap();
                *g += step;
                drop(g);
                let _r = rw.read().unwrap();
            }
            b.wait();
        }));
    }
    barrier.wait();
    for j in js {
        j();
    }
    assert_eq!(*rwlock.read().unwrap(), 17 * n);
}

fn tokio_rwlock_try_read_try_write() {
    let lock = RwLock::new(15);
    {
        let rg1 = lock.try_read().unwrap();
        assert_eq!(*rg1, 15);
        assert!(lock.try_write().is_err());
        let rg2 = lock.try_read().unwrap();
        assert_eq!(*rg2, 15);
    }
    {
        let mut wg = lock.try_write().unwrap();
        *wg = 1515;
        assert!(lock.try_read().is_err());
    }
    assert_eq!(*lock.try_read().unwrap(), 1515);
}

/// downgrade_map (downgrade only: no map API)
fn tokio_rwlock_downgrade() {
    let lock = Arc::new(RwLock::new(1));
    let mut w = lock.write().unwrap();
    *w = 2;
    let r = fiber::sync::RwLockWriteGuard::downgrade(w);
    assert_eq!(*r, 2);
    // other readers can now read
    let l2 = lock.clone();
    assert_eq!(go(move || *l2.read().unwrap())(), 2);
    assert!(lock.try_write().is_err());
    drop(r);
    assert!(lock.try_write().is_ok());
}

// ======================================================================
// tokio: tokio/tests/sync_barrier.rs
// ======================================================================

fn tokio_barrier_zero_does_not_block() {
    let b = Barrier::new(0);
    assert!(b.wait().is_leader());
    assert!(b.wait().is_leader());
}

fn tokio_barrier_single() {
    let b = Barrier::new(1);
    for _ in 0..3 {
        assert!(b.wait().is_leader());
    }
}

fn tokio_barrier_tango() {
    let b = Arc::new(Barrier::new(2));
    let b2 = b.clone();
    let j = go(move || b2.wait().is_leader());
    let l1 = b.wait().is_leader();
    let l2 = j();
    assert!(l1 || l2);
    assert!(!(l1 && l2));
}

fn tokio_barrier_lots() {
    let in_fiber = fiber::Job::try_current().is_some();
    let n = if in_fiber { 100 } else { 20 };
    let b = Arc::new(Barrier::new(n));
    for _ in 0..10 {
        let leaders = Arc::new(AtomicUsize::new(0));
        let mut js = Vec::new();
        for _ in 0..n - 1 {
            let (b, l) = (b.clone(), leaders.clone());
            js.push(go(move || {
                if b.wait().is_leader() {
                    l.fetch_add(1, SeqCst);
                }
            }));
        }
        if b.wait().is_leader() {
            leaders.fetch_add(1, SeqCst);
        }
        for j in js {
            j();
        }
        assert_eq!(leaders.load(SeqCst), 1);
    }
}

// ======================================================================
// tokio: tokio/tests/sync_once_cell.rs (std OnceLock shape)
// ======================================================================

struct Foo(Arc<AtomicU32>);
impl Drop for Foo {
    fn drop(&mut self) {
        self.0.fetch_add(1, SeqCst);
    }
}

fn tokio_once_drop_cell() {
    let n = Arc::new(AtomicU32::new(0));
    {
        let c = OnceLock::new();
        assert!(c.set(Foo(n.clone())).is_ok());
    }
    assert_eq!(n.load(SeqCst), 1);
    // drop_into_inner
    let n = Arc::new(AtomicU32::new(0));
    let c = OnceLock::new();
    assert!(c.set(Foo(n.clone())).is_ok());
    let f = c.into_inner();
    assert_eq!(n.load(SeqCst), 0);
    drop(f);
    assert_eq!(n.load(SeqCst), 1);
    // from / get_uninit / set_twice
    let c = OnceLock::from(2);
    assert_eq!(*c.get().unwrap(), 2);
    let c: OnceLock<u32> = OnceLock::new();
    assert!(c.get().is_none());
    assert_eq!(c.set(5), Ok(()));
    assert_eq!(c.set(6), Err(6));
    // a value set twice: the rejected one is returned, not dropped twice
    let n = Arc::new(AtomicU32::new(0));
    let c = OnceLock::new();
    assert!(c.set(Foo(n.clone())).is_ok());
    let rej = c.set(Foo(n.clone())).unwrap_err();
    assert_eq!(n.load(SeqCst), 0);
    drop(rej);
    assert_eq!(n.load(SeqCst), 1);
    drop(c);
    assert_eq!(n.load(SeqCst), 2);
}

/// get_or_init: two racing initializers, one runs, both see its value.
fn tokio_once_get_or_init() {
    let once: Arc<OnceLock<u32>> = Arc::new(OnceLock::new());
    let runs = Arc::new(AtomicUsize::new(0));
    let (o1, r1) = (once.clone(), runs.clone());
    let h1 = go(move || {
        *o1.get_or_init(|| {
            r1.fetch_add(1, SeqCst);
            5
        })
    });
    let (o2, r2) = (once.clone(), runs.clone());
    let h2 = go(move || {
        *o2.get_or_init(|| {
            r2.fetch_add(1, SeqCst);
            nap(ms(1));
            10
        })
    });
    let (a, b) = (h1(), h2());
    assert_eq!(a, b);
    assert_eq!(runs.load(SeqCst), 1);
}

/// get_or_init_panic: a panicking initializer lets a waiter initialize.
fn tokio_once_get_or_init_panic() {
    let once: Arc<OnceLock<u32>> = Arc::new(OnceLock::new());
    let o2 = once.clone();
    let started = Arc::new(AtomicBool::new(false));
    let s2 = started.clone();
    let h2 = go(move || {
        panics(|| {
            *o2.get_or_init(|| {
                s2.store(true, SeqCst);
                nap(ms(10));
                panic!("init panics")
            })
        })
    });
    while !started.load(SeqCst) {
        nap(ms(1));
    }
    let o1 = once.clone();
    let h1 = go(move || *o1.get_or_init(|| 5));
    assert_eq!(h2().as_deref(), Some("init panics"));
    assert_eq!(h1(), 5);
    assert_eq!(once.get(), Some(&5));
}

/// set_while_initializing: tokio returns an "initializing" error; fiber
/// has std's shape, whose `set` waits for the running initializer and
/// then returns the value back (documented difference of API shape).
fn tokio_once_set_while_initializing() {
    let once: Arc<OnceLock<u32>> = Arc::new(OnceLock::new());
    let started = Arc::new(AtomicBool::new(false));
    let (o1, s1) = (once.clone(), started.clone());
    let h1 = go(move || {
        *o1.get_or_init(|| {
            s1.store(true, SeqCst);
            nap(ms(20));
            5
        })
    });
    while !started.load(SeqCst) {
        nap(ms(1));
    }
    let o2 = once.clone();
    let h2 = go(move || o2.set(10));
    assert_eq!(h1(), 5);
    assert_eq!(h2(), Err(10));
    // OnceLock::wait sees the value
    assert_eq!(*once.wait(), 5);
}

// ======================================================================
// tokio: tokio/tests/sync_mpsc.rs -> fiber::chan
// ======================================================================

fn tokio_mpsc_send_recv_with_buffer() {
    let (tx, rx) = chan::bounded::<i32>(16);
    tx.send(1).unwrap();
    tx.send(2).unwrap();
    drop(tx);
    assert_eq!(rx.recv(), Ok(1));
    assert_eq!(rx.recv(), Ok(2));
    assert!(rx.recv().is_err());
}

/// start_send_past_cap: a full channel's send waits until a receive frees a slot.
fn tokio_mpsc_start_send_past_cap() {
    let (tx1, rx) = chan::bounded::<()>(1);
    let tx2 = tx1.clone();
    assert!(tx1.try_send(()).is_ok());
    let r = tx1.try_send(());
    assert!(matches!(r, Err(chan::TrySendError::Full(()))));
    let r = tx2.try_send(());
    assert!(matches!(r, Err(chan::TrySendError::Full(()))));
    let done = Arc::new(AtomicBool::new(false));
    let d = done.clone();
    let j = go(move || {
        tx1.send(()).unwrap();
        d.store(true, SeqCst);
    });
    nap(ms(10));
    assert!(!done.load(SeqCst));
    assert!(rx.recv().is_ok());
    j();
    assert!(done.load(SeqCst));
    drop(tx2);
    assert!(rx.recv().is_ok());
    assert!(rx.recv().is_err());
}

fn tokio_mpsc_send_recv_unbounded() {
    let (tx, rx) = chan::unbounded::<i32>();
    tx.send(1).unwrap();
    tx.send(2).unwrap();
    assert_eq!(rx.recv(), Ok(1));
    assert_eq!(rx.recv(), Ok(2));
    drop(tx);
    assert!(rx.recv().is_err());
}

/// send_recv_buffer_limited
fn tokio_mpsc_send_recv_buffer_limited() {
    let (tx, rx) = chan::bounded::<i32>(1);
    tx.send(1).unwrap();
    let tx2 = tx.clone();
    let sent2 = Arc::new(AtomicBool::new(false));
    let s2 = sent2.clone();
    let j = go(move || {
        tx2.send(2).unwrap();
        s2.store(true, SeqCst);
    });
    nap(ms(10));
    assert!(!sent2.load(SeqCst));
    assert_eq!(rx.recv(), Ok(1));
    j();
    assert_eq!(rx.recv(), Ok(2));
    assert!(rx.try_recv().is_err());
}

/// recv_close_gets_none_idle / tx_close_gets_none / dropping_rx_closes_channel
fn tokio_mpsc_close() {
    let (tx, rx) = chan::bounded::<i32>(10);
    rx.close();
    assert!(rx.recv().is_err());
    assert!(tx.send(10).is_err());
    let (tx, rx) = chan::bounded::<i32>(10);
    drop(tx);
    assert!(rx.recv().is_err());
    // dropping_rx_closes_channel
    let (tx, rx) = chan::bounded::<Arc<()>>(100);
    let msg = Arc::new(());
    tx.try_send(msg.clone()).unwrap();
    drop(rx);
    assert!(tx.is_closed());
    assert!(tx.send(msg.clone()).is_err());
    assert_eq!(1, Arc::strong_count(&msg));
    // dropping_rx_closes_channel_for_try
    let (tx, rx) = chan::bounded::<Arc<()>>(100);
    let msg = Arc::new(());
    tx.try_send(msg.clone()).unwrap();
    drop(rx);
    assert!(matches!(
        tx.try_send(msg.clone()),
        Err(chan::TrySendError::Disconnected(_))
    ));
    assert_eq!(1, Arc::strong_count(&msg));
}

/// close with buffered values: they are still delivered (tokio:
/// test_rx_is_closed_when_there_are_messages_and_close_is_called,
/// recv_many_with_non_empty_buffer_*_rx_closed_and_idle)
fn tokio_mpsc_close_delivers_buffered() {
    for cap in [Some(10usize), None] {
        let (tx, rx) = match cap {
            Some(c) => chan::bounded::<i32>(c),
            None => chan::unbounded::<i32>(),
        };
        tx.send(1).unwrap();
        tx.send(2).unwrap();
        rx.close();
        assert!(rx.is_closed());
        assert!(tx.is_closed());
        assert_eq!(rx.len(), 2);
        assert!(tx.send(3).is_err());
        assert_eq!(rx.recv(), Ok(1));
        assert_eq!(rx.recv(), Ok(2));
        assert!(rx.recv().is_err());
        assert!(rx.is_empty());
        assert_eq!(rx.len(), 0);
    }
}

fn tokio_mpsc_try_send_fail() {
    let (tx, rx) = chan::bounded(1);
    tx.try_send("hello").unwrap();
    match tx.try_send("fail") {
        Err(chan::TrySendError::Full(v)) => assert_eq!(v, "fail"),
        other => panic!("{other:?}"),
    }
    assert_eq!(rx.recv(), Ok("hello"));
    tx.try_send("goodbye").unwrap();
    drop(tx);
    assert_eq!(rx.recv(), Ok("goodbye"));
    assert!(rx.recv().is_err());
}

fn tokio_mpsc_try_send_fail_with_try_recv() {
    let (tx, rx) = chan::bounded(1);
    tx.try_send("hello").unwrap();
    assert!(matches!(tx.try_send("fail"), Err(chan::TrySendError::Full("fail"))));
    assert_eq!(rx.try_recv(), Ok("hello"));
    tx.try_send("goodbye").unwrap();
    drop(tx);
    assert_eq!(rx.try_recv(), Ok("goodbye"));
    assert_eq!(rx.try_recv(), Err(chan::TryRecvError::Disconnected));
}

fn tokio_mpsc_unconsumed_messages_are_dropped() {
    let msg = Arc::new(());
    let (tx, rx) = chan::bounded(100);
    tx.try_send(msg.clone()).unwrap();
    assert_eq!(2, Arc::strong_count(&msg));
    drop((tx, rx));
    assert_eq!(1, Arc::strong_count(&msg));
    // unbounded too
    let msg = Arc::new(());
    let (tx, rx) = chan::unbounded();
    tx.send(msg.clone()).unwrap();
    drop(rx);
    assert_eq!(
        1,
        Arc::strong_count(&msg),
        "dropping the last receiver drops buffered values"
    );
    drop(tx);
}

fn tokio_mpsc_try_recv_bounded() {
    let (tx, rx) = chan::bounded(5);
    tx.try_send("hello").unwrap();
    tx.try_send("hello").unwrap();
    tx.try_send("hello").unwrap();
    tx.try_send("hello").unwrap();
    tx.try_send("hello").unwrap();
    assert!(tx.try_send("hello").is_err());
    for _ in 0..5 {
        assert_eq!(Ok("hello"), rx.try_recv());
    }
    assert_eq!(Err(chan::TryRecvError::Empty), rx.try_recv());
    tx.try_send("hello").unwrap();
    tx.try_send("hello").unwrap();
    tx.try_send("hello").unwrap();
    tx.try_send("hello").unwrap();
    assert_eq!(Ok("hello"), rx.try_recv());
    tx.try_send("hello").unwrap();
    tx.try_send("hello").unwrap();
    assert!(tx.try_send("hello").is_err());
    for _ in 0..5 {
        assert_eq!(Ok("hello"), rx.try_recv());
    }
    assert_eq!(Err(chan::TryRecvError::Empty), rx.try_recv());
    tx.try_send("hello").unwrap();
    tx.try_send("hello").unwrap();
    tx.try_send("hello").unwrap();
    drop(tx);
    for _ in 0..3 {
        assert_eq!(Ok("hello"), rx.try_recv());
    }
    assert_eq!(Err(chan::TryRecvError::Disconnected), rx.try_recv());
}

fn tokio_mpsc_try_recv_unbounded() {
    for num in 0..100 {
        let (tx, rx) = chan::unbounded();
        for i in 0..num {
            tx.send(i).unwrap();
        }
        for i in 0..num {
            assert_eq!(rx.try_recv(), Ok(i));
        }
        assert_eq!(rx.try_recv(), Err(chan::TryRecvError::Empty));
        drop(tx);
        assert_eq!(rx.try_recv(), Err(chan::TryRecvError::Disconnected));
    }
}

fn tokio_mpsc_try_recv_after_close() {
    let (_tx, rx) = chan::bounded::<()>(5);
    rx.close();
    assert_eq!(Err(chan::TryRecvError::Disconnected), rx.try_recv());
    let (_tx, rx) = chan::unbounded::<()>();
    rx.close();
    assert_eq!(Err(chan::TryRecvError::Disconnected), rx.try_recv());
}

fn tokio_mpsc_recv_timeout() {
    let (tx, rx) = chan::bounded(5);
    assert_eq!(rx.recv_timeout(ms(10)), Err(chan::RecvTimeoutError::Timeout));
    tx.send(10).unwrap();
    assert_eq!(rx.recv_timeout(ms(10)), Ok(10));
    drop(tx);
    assert_eq!(rx.recv_timeout(ms(10)), Err(chan::RecvTimeoutError::Disconnected));
}

/// test_tx_capacity (capacity, len)
fn tokio_mpsc_capacity_len() {
    let (tx, rx) = chan::bounded::<()>(10);
    assert_eq!(tx.capacity(), Some(10));
    let _ = tx.try_send(());
    assert_eq!(tx.len(), 1);
    assert_eq!(rx.len(), 1);
    assert!(!rx.is_empty());
    for _ in 0..9 {
        tx.try_send(()).unwrap();
    }
    assert!(rx.is_full());
    assert_eq!(rx.len(), 10);
    drop(tx);
    assert!(rx.is_closed());
    assert_eq!(rx.len(), 10);
    for _ in 0..10 {
        rx.recv().unwrap();
    }
    assert!(rx.is_empty());
    assert_eq!(rx.len(), 0);
    // test_is_empty_32_msgs
    let (tx, rx) = chan::bounded(32);
    for i in 0..32 {
        tx.send(i).unwrap();
        assert!(!rx.is_empty());
    }
    for i in 0..32 {
        assert!(!rx.is_empty());
        assert_eq!(rx.recv(), Ok(i));
    }
    assert!(rx.is_empty());
    // test_rx_is_not_closed_when_there_are_senders
    let (tx, rx) = chan::bounded::<()>(1);
    assert!(!rx.is_closed());
    drop(tx);
    assert!(rx.is_closed());
}

/// drop_all_elements_during_panic: a panicking Drop of one buffered value
/// must not leak the others.
fn tokio_mpsc_drop_all_elements_during_panic() {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    struct A(bool);
    impl Drop for A {
        fn drop(&mut self) {
            COUNTER.fetch_add(1, SeqCst);
            if self.0 {
                panic!("panic!")
            }
        }
    }
    let before = COUNTER.load(SeqCst);
    let (tx, rx) = chan::unbounded();
    tx.send(A(true)).unwrap();
    tx.send(A(false)).unwrap();
    tx.send(A(false)).unwrap();
    drop(tx);
    let r = panics(move || drop(rx));
    assert!(r.is_some());
    assert_eq!(COUNTER.load(SeqCst) - before, 3);
}

/// send_recv_many_*: many senders / one receiver, every value once, in
/// order per sender.
fn tokio_mpsc_many_senders() {
    let per = 500usize;
    let (tx, rx) = chan::bounded(4);
    let mut js = Vec::new();
    for s in 0..4usize {
        let tx = tx.clone();
        js.push(go(move || {
            for i in 0..per {
                tx.send((s, i)).unwrap();
            }
        }));
    }
    drop(tx);
    let mut next = [0usize; 4];
    for (s, i) in rx.iter() {
        assert_eq!(next[s], i);
        next[s] += 1;
    }
    assert_eq!(next, [per; 4]);
    for j in js {
        j();
    }
}

/// buffer_gteq_one: tokio panics on a zero capacity; fiber's bounded(0) is
/// a rendezvous channel (documented): a send completes only when received.
fn tokio_mpsc_zero_capacity() {
    let (tx, rx) = chan::bounded::<u8>(0);
    assert!(matches!(tx.try_send(1), Err(chan::TrySendError::Full(1))));
    let j = go(move || tx.send(7));
    assert_eq!(rx.recv(), Ok(7));
    assert!(j().is_ok());
}

// ======================================================================
// tokio: tokio/tests/task_join_set.rs (JoinSet ~ scope), task_abort.rs
// ======================================================================

/// test_with_sleep / join_all: spawn n, each returns its index; collect.
fn tokio_joinset_with_sleep() {
    let n = 10;
    let mut got = fiber::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|i| {
                s.spawn(move || {
                    fiber::sleep(ms(1)).unwrap();
                    i
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
    });
    got.sort();
    assert_eq!(got, (0..n).collect::<Vec<_>>());
}

/// abort_tasks: abort every other task; the aborted ones are cancelled,
/// the rest complete.
fn tokio_joinset_abort_tasks() {
    let (mut cancelled, mut completed) = (0, 0);
    fiber::scope(|s| {
        let hs: Vec<_> = (0..16)
            .map(|i| {
                s.spawn(move || {
                    if i % 2 == 0 {
                        fiber::sleep(Duration::MAX).map(|_| i)
                    } else {
                        fiber::sleep(ms(5)).map(|_| i)
                    }
                })
            })
            .collect();
        fiber::yield_now().unwrap();
        for (i, h) in hs.iter().enumerate() {
            if i % 2 == 0 {
                h.cancel();
            }
        }
        for h in hs {
            match h.join() {
                Ok(Ok(i)) => {
                    assert!(i % 2 == 1);
                    completed += 1
                }
                Err(e) if e.is_cancelled() => cancelled += 1,
                other => panic!("{other:?}"),
            }
        }
    });
    assert_eq!((cancelled, completed), (8, 8));
}

/// task_panics: one child panics, its join has the panic; in a supervisor
/// scope the others are untouched (tokio's JoinSet does not cancel).
fn tokio_joinset_task_panics() {
    let (mut panicked, mut ok) = (0, 0);
    fiber::supervisor_scope(|s| {
        let hs: Vec<_> = (0..3)
            .map(|i| {
                s.spawn(move || {
                    if i == 1 {
                        panic!("boom");
                    }
                    fiber::sleep(ms(5)).unwrap();
                    i
                })
            })
            .collect();
        for h in hs {
            match h.join() {
                Ok(_) => ok += 1,
                Err(e) if e.is_panic() => {
                    assert_eq!(msg(&e.into_panic()), "boom");
                    panicked += 1
                }
                Err(e) => panic!("{e:?}"),
            }
        }
    });
    assert_eq!((panicked, ok), (1, 2));
}

/// abort_all: cancel the scope's job; every child ends cancelled.
fn tokio_joinset_abort_all() {
    let finished = AtomicUsize::new(0);
    fiber::scope(|s| {
        let hs: Vec<_> = (0..5)
            .map(|_| {
                s.spawn(|| {
                    let r = fiber::sleep(Duration::from_secs(3600));
                    finished.fetch_add(1, SeqCst);
                    r
                })
            })
            .collect();
        fiber::non_cancellable(|| fiber::sleep(ms(5)).unwrap());
        s.job().cancel();
        for h in hs {
            assert!(h.join().unwrap_err().is_cancelled());
        }
    });
    assert_eq!(finished.load(SeqCst), 5);
}

/// try_join_next: is_finished reports only finished children.
fn tokio_joinset_try_join_next() {
    fiber::scope(|s| {
        let (tx, rx) = chan::bounded::<()>(0);
        let h1 = s.spawn(move || rx.recv().is_ok());
        let h2 = s.spawn(|| 5);
        let t = Instant::now();
        while !h2.is_finished() {
            assert!(t.elapsed() < Duration::from_secs(20));
            fiber::yield_now().unwrap();
        }
        assert!(!h1.is_finished());
        tx.send(()).unwrap();
        assert!(h1.join().unwrap());
        assert_eq!(h2.join().unwrap(), 5);
    });
}

/// test_abort_without_panic_3157: abort a sleeping task; its join is fine.
fn tokio_abort_without_panic_3157() {
    let handle = fiber::spawn(|| fiber::sleep(Duration::new(100, 0)));
    fiber::sleep(ms(10)).unwrap();
    handle.cancel();
    let r = handle.join();
    assert!(r.unwrap_err().is_cancelled());
}

/// test_abort_without_panic_3662: abort from another OS thread; the task's
/// state is dropped by the time the join returns; the runtime still works.
fn tokio_abort_without_panic_3662() {
    struct DropCheck(Arc<AtomicBool>);
    impl Drop for DropCheck {
        fn drop(&mut self) {
            self.0.store(true, SeqCst);
        }
    }
    let flag = Arc::new(AtomicBool::new(false));
    let dc = DropCheck(flag.clone());
    let j = fiber::spawn(move || {
        let _dc = dc;
        let _ = fiber::sleep(Duration::MAX);
    });
    let f2 = flag.clone();
    let j = fiber::blocking(move || {
        std::thread::spawn(move || {
            assert!(!f2.load(SeqCst));
            j.cancel();
            j
        })
        .join()
        .unwrap()
    });
    let r = j.join();
    assert!(flag.load(SeqCst));
    assert!(r.unwrap_err().is_cancelled());
    let i = fiber::spawn(|| fiber::yield_now().unwrap());
    i.join().unwrap();
}

/// test_abort_wakes_task_3964: abort + drop the handle: the task's state is
/// dropped soon after.
fn tokio_abort_wakes_task_3964() {
    let notify = Arc::new(());
    let weak = Arc::downgrade(&notify);
    let handle = fiber::spawn(move || {
        let _n = notify;
        let _ = fiber::sleep(Duration::new(100, 0));
    });
    fiber::sleep(ms(10)).unwrap();
    handle.cancel();
    drop(handle);
    let t = Instant::now();
    while weak.upgrade().is_some() {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "aborted task's state never dropped"
        );
        fiber::sleep(ms(1)).unwrap();
    }
}

struct PanicOnDrop;
impl Drop for PanicOnDrop {
    fn drop(&mut self) {
        panic!("Well what did you expect would happen...");
    }
}

/// test_abort_task_that_panics_on_drop_contained / _returned
fn tokio_abort_task_that_panics_on_drop() {
    let handle = fiber::spawn(|| {
        let _p = PanicOnDrop;
        let _ = fiber::sleep(Duration::new(100, 0));
    });
    fiber::sleep(ms(10)).unwrap();
    handle.cancel();
    drop(handle);
    fiber::sleep(ms(10)).unwrap();
    // returned
    let handle = fiber::spawn(|| {
        let _p = PanicOnDrop;
        let _ = fiber::sleep(Duration::new(100, 0));
    });
    fiber::sleep(ms(10)).unwrap();
    handle.cancel();
    let e = handle.join().unwrap_err();
    assert!(e.is_panic(), "{e:?}");
}

/// test_join_error_display (fiber says "fiber N" where tokio says "task N")
fn tokio_join_error_display() {
    let e = fiber::spawn(|| {
        let value = 1234;
        panic!("Format-args payload: {value}")
    })
    .join()
    .unwrap_err();
    let s = e.to_string();
    assert!(
        s.ends_with(" panicked with message \"Format-args payload: 1234\""),
        "{s:?}"
    );
    let e = fiber::spawn(|| panic!("Const payload")).join().unwrap_err();
    let s = e.to_string();
    assert!(s.ends_with(" panicked with message \"Const payload\""), "{s:?}");
    let e = fiber::spawn(|| std::panic::panic_any(1234i32)).join().unwrap_err();
    let s = e.to_string();
    assert!(s.ends_with(" panicked"), "{s:?}");
    let d = format!("{e:?}");
    assert!(d.starts_with("JoinError::Panic("), "{d:?}");
}

/// JoinHandle::cancel of a fiber that has not started: it never runs
/// (tokio: abort before first poll).
fn tokio_abort_before_start() {
    let ran = Arc::new(AtomicBool::new(false));
    let r2 = ran.clone();
    let h = fiber::spawn(move || r2.store(true, SeqCst));
    h.cancel();
    let r = h.join();
    if ran.load(SeqCst) {
        // it may have started on the other worker before the cancel
        assert!(r.is_ok() || r.unwrap_err().is_cancelled());
    } else {
        assert!(r.unwrap_err().is_cancelled());
    }
}

// ======================================================================
// extra cases derived from the same upstream semantics
// ======================================================================

/// trio: a shield (~ non_cancellable) protects against a deadline of an
/// enclosing move_on_after that passes while inside the shield, even when
/// the timer fiber could not run (busy single worker).
fn trio_shield_vs_passed_deadline() {
    let inside = Mutex::new(Vec::new());
    let r = fiber::with_timeout(ms(5), || {
        fiber::non_cancellable(|| {
            let t = Instant::now();
            while t.elapsed() < ms(20) {}
            inside.lock().unwrap().push(fiber::is_cancelled());
            inside.lock().unwrap().push(fiber::yield_now().is_err());
            inside.lock().unwrap().push(fiber::sleep(ms(1)).is_err());
        });
        fiber::yield_now().is_err()
    });
    assert_eq!(
        *inside.lock().unwrap(),
        [false, false, false],
        "shield did not hold off the deadline"
    );
    assert_eq!(r, Err(fiber::TimedOut));
}

/// trio: move_on_after around a nursery cancels its children.
fn trio_timeout_cancels_nursery_children() {
    let cancelled = AtomicUsize::new(0);
    let r = fiber::with_timeout(ms(10), || {
        fiber::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    if fiber::sleep(Duration::MAX).is_err() {
                        cancelled.fetch_add(1, SeqCst);
                    }
                });
            }
        })
    });
    assert_eq!(r, Err(fiber::TimedOut));
    assert_eq!(cancelled.load(SeqCst), 3);
}

/// trio: an error raised while a timeout cancels the block is not swallowed
/// by move_on_after (failure dominates cancellation, spec/jobs.md too).
fn trio_error_during_timeout_propagates() {
    let p = panics(|| {
        fiber::with_timeout(ms(10), || {
            fiber::scope(|s| {
                s.spawn(|| {
                    let _ = fiber::sleep(Duration::MAX);
                    panic!("after cancel");
                });
            })
        })
    });
    assert_eq!(p.as_deref(), Some("after cancel"));
    let p = panics(|| {
        fiber::with_timeout(ms(10), || {
            let _ = fiber::sleep(Duration::MAX);
            panic!("body after cancel");
        })
    });
    assert_eq!(p.as_deref(), Some("body after cancel"));
    assert!(fiber::yield_now().is_ok());
}

/// Kotlin/trio: a supervisor scope's body failing cancels its children.
fn supervisor_body_panic_cancels_children() {
    let cancelled = AtomicBool::new(false);
    let p = panics(|| {
        fiber::supervisor_scope(|s| {
            s.spawn(|| {
                if fiber::sleep(Duration::MAX).is_err() {
                    cancelled.store(true, SeqCst);
                }
            });
            fiber::sleep(ms(5)).unwrap();
            panic!("body");
        })
    });
    assert_eq!(p.as_deref(), Some("body"));
    assert!(cancelled.load(SeqCst));
    // cancel of a supervisor scope's job reaches its children
    let cancelled = AtomicUsize::new(0);
    fiber::supervisor_scope(|s| {
        for _ in 0..3 {
            s.spawn(|| {
                if fiber::sleep(Duration::MAX).is_err() {
                    cancelled.fetch_add(1, SeqCst);
                }
            });
        }
        fiber::non_cancellable(|| fiber::sleep(ms(5)).unwrap());
        s.job().cancel();
    });
    assert_eq!(cancelled.load(SeqCst), 3);
    // a failed child does not cancel the siblings nor the body
    let sibling_ok = AtomicBool::new(false);
    fiber::supervisor_scope(|s| {
        let bad = s.spawn(|| panic!("child"));
        s.spawn(|| sibling_ok.store(fiber::sleep(ms(20)).is_ok(), SeqCst));
        assert!(bad.join().unwrap_err().is_panic());
        fiber::sleep(ms(1)).unwrap();
    });
    assert!(sibling_ok.load(SeqCst));
}

/// tokio: dropping the receiver while a sender is parked on a full channel
/// fails the send and hands the value back; buffered values are dropped.
fn tokio_mpsc_rx_drop_wakes_parked_sender() {
    let msg = Arc::new(());
    let (tx, rx) = chan::bounded::<Arc<()>>(1);
    tx.send(msg.clone()).unwrap();
    let m2 = msg.clone();
    let j = go(move || match tx.send(m2) {
        Err(chan::SendError(v)) => {
            drop(v);
            true
        }
        Ok(()) => false,
    });
    nap(ms(10));
    drop(rx);
    assert!(j(), "send to a dropped receiver must fail");
    assert_eq!(Arc::strong_count(&msg), 1);
}

/// tokio: a permit released by a thread reaches a fiber waiter and the
/// reverse (mixed fibers and threads on one semaphore / barrier).
fn mixed_thread_fiber_sync() {
    let sem = Arc::new(Semaphore::new(0));
    let s2 = sem.clone();
    let t = std::thread::spawn(move || {
        std::thread::sleep(ms(10));
        s2.add_permits(1);
        let _p = s2.acquire_many(2).unwrap();
    });
    sem.acquire().unwrap().forget();
    fiber::sleep(ms(10)).unwrap();
    sem.add_permits(2);
    t.join().unwrap();
    assert_eq!(sem.available_permits(), 2);
    let b = Arc::new(Barrier::new(3));
    let ts: Vec<_> = (0..2)
        .map(|_| {
            let b = b.clone();
            std::thread::spawn(move || b.wait().is_leader())
        })
        .collect();
    let me = b.wait().is_leader();
    let n = ts.into_iter().map(|t| t.join().unwrap()).filter(|l| *l).count() + me as usize;
    assert_eq!(n, 1);
}

/// A cancelled barrier waiter withdraws its arrival (spec/sync.md 3.6): the
/// next arrival does not release the generation.
fn barrier_cancelled_waiter_withdraws() {
    let b = Barrier::new(2);
    fiber::scope(|s| {
        let a = s.spawn(|| b.wait());
        fiber::sleep(ms(5)).unwrap();
        a.cancel();
        let ra = a.join();
        assert!(ra.is_err() || ra.unwrap().is_cancelled());
        let c = s.spawn(|| b.wait());
        fiber::sleep(ms(10)).unwrap();
        assert!(!c.is_finished(), "the withdrawn arrival was counted");
        let me = b.wait();
        let rc = c.join().unwrap();
        assert!(me.is_leader() ^ rc.is_leader());
        assert!(!rc.is_cancelled());
    });
}

/// task_join_set::runtime_gone: handles outlive their runtime; joining
/// reports cancellation.
fn tokio_joinset_runtime_gone() {
    let rt = fiber::Runtime::builder()
        .workers(1)
        .max_workers(1)
        .shutdown_timeout(ms(200))
        .build()
        .unwrap();
    let h = rt.spawn(|| {
        let _ = fiber::sleep(Duration::MAX);
        1
    });
    let h2 = rt.spawn(|| fiber::sleep(Duration::MAX).map(|_| 2));
    std::thread::sleep(ms(10));
    drop(rt);
    assert!(h.join().unwrap_err().is_cancelled());
    assert!(h2.join().unwrap_err().is_cancelled());
}

/// Duration::MAX timeouts mean "no deadline" (std, tokio).
fn max_timeouts_mean_forever() {
    let r = fiber::with_timeout(Duration::MAX, || {
        fiber::sleep(ms(2)).unwrap();
        3
    });
    assert_eq!(r, Ok(3));
    let (tx, rx) = chan::bounded::<u8>(0);
    let j = fiber::spawn(move || {
        fiber::sleep(ms(10)).unwrap();
        tx.send_timeout(1, Duration::MAX).unwrap();
    });
    assert_eq!(rx.recv_timeout(Duration::MAX), Ok(1));
    j.join().unwrap();
    let m = Mutex::new(false);
    let cv = Condvar::new();
    fiber::scope(|s| {
        s.spawn(|| {
            fiber::sleep(ms(10)).unwrap();
            *m.lock().unwrap() = true;
            cv.notify_all();
        });
        let g = m.lock().unwrap();
        let (g, to) = cv.wait_timeout_while(g, Duration::MAX, |v| !*v).unwrap();
        assert!(*g && !to.timed_out());
    });
}

/// tokio (mpsc `recv` is cancel safe; a `send` that fails returns its
/// value): a receiver cancelled at a random moment never loses a value a
/// sender was told was delivered, and never gets one twice.
fn chan_cancel_exactly_once() {
    for kind in 0..4 {
        for round in 0..60u64 {
            let (tx, rx) = match kind {
                0 => chan::bounded::<u64>(0),
                1 => chan::bounded::<u64>(1),
                2 => chan::bounded::<u64>(4),
                _ => chan::unbounded::<u64>(),
            };
            let rx2 = rx.clone();
            let got = Arc::new(std::sync::Mutex::new(Vec::new()));
            let g2 = got.clone();
            let receiver = fiber::spawn(move || loop {
                let r = if round % 2 == 0 {
                    rx2.recv()
                } else {
                    fiber::select! { recv(rx2) -> r => r }
                };
                match r {
                    Ok(v) => g2.lock().unwrap().push(v),
                    Err(_) => break,
                }
            });
            let sender = fiber::spawn(move || {
                let mut sent = Vec::new();
                for i in 0..200u64 {
                    match tx.send_timeout(i, ms(20)) {
                        Ok(()) => sent.push(i),
                        Err(_) => break,
                    }
                }
                sent
            });
            let spins = (round * 7919 + kind as u64 * 31) % 400;
            for _ in 0..spins {
                fiber::yield_now().unwrap();
            }
            receiver.cancel();
            let _ = receiver.join();
            let sent = sender.join().unwrap();
            let mut all = got.lock().unwrap().clone();
            all.extend(rx.try_iter());
            let mut sorted = all.clone();
            sorted.sort();
            sorted.dedup();
            assert_eq!(sorted.len(), all.len(), "kind {kind} round {round}: a value twice");
            assert_eq!(
                sorted,
                sent,
                "kind {kind} round {round}: sent {} got {}",
                sent.len(),
                all.len()
            );
        }
    }
}

/// tokio semaphore: acquires cancelled at random moments never leak or
/// duplicate permits.
fn sem_cancel_stress() {
    let sem = Arc::new(Semaphore::new(3));
    for round in 0..40u64 {
        let hs: Vec<_> = (0..8u64)
            .map(|i| {
                let sem = sem.clone();
                fiber::spawn(move || {
                    for _ in 0..20 {
                        match sem.acquire_many(1 + (i % 3) as u32) {
                            Ok(p) => {
                                let _ = fiber::yield_now();
                                drop(p);
                            }
                            Err(_) => return,
                        }
                    }
                })
            })
            .collect();
        for _ in 0..(round % 13) {
            fiber::yield_now().unwrap();
        }
        for (i, h) in hs.iter().enumerate() {
            if (i as u64 + round) % 2 == 0 {
                h.cancel();
            }
        }
        for h in hs {
            let _ = h.join();
        }
        assert_eq!(
            sem.available_permits(),
            3,
            "round {round}: permits leaked or duplicated"
        );
    }
}

/// trio test_timeouts `check_takes_about`: a timed wait never returns
/// before its duration (dur / expected >= 1 - 1e-8), for every timed wait.
fn timed_waits_never_early() {
    let durs: Vec<Duration> = (0..40u64).map(|i| Duration::from_micros(300 + i * 137)).collect();
    let mut early = Vec::new();
    let mut check = |what: &str, d: Duration, el: Duration| {
        if el < d {
            early.push(format!("{what}: asked {d:?}, returned after {el:?}"));
        }
    };
    for &d in &durs {
        let t = Instant::now();
        fiber::sleep(d).unwrap();
        check("sleep", d, t.elapsed());
        let t = Instant::now();
        let target = t + d;
        fiber::sleep_until(target).unwrap();
        check("sleep_until", d, t.elapsed());
        let (_tx, rx) = chan::bounded::<u8>(0);
        let t = Instant::now();
        let _ = rx.recv_timeout(d);
        check("recv_timeout", d, t.elapsed());
        let (tx, _rx) = chan::bounded::<u8>(0);
        let t = Instant::now();
        let _ = tx.send_timeout(1, d);
        check("send_timeout", d, t.elapsed());
        let t = Instant::now();
        let _ = chan::after(d).recv();
        check("after", d, t.elapsed());
        let (_tx2, rx2) = chan::bounded::<u8>(0);
        let t = Instant::now();
        fiber::select! { recv(rx2) -> _r => {}, default(d) => {} }
        check("select default(d)", d, t.elapsed());
        let t = Instant::now();
        let _ = fiber::with_timeout(d, || fiber::sleep(Duration::MAX));
        check("with_timeout", d, t.elapsed());
        let m = Mutex::new(());
        let cv = Condvar::new();
        let t = Instant::now();
        let (_g, r) = cv.wait_timeout(m.lock().unwrap(), d).unwrap();
        if r.timed_out() {
            check("condvar wait_timeout", d, t.elapsed());
        }
        let t = Instant::now();
        fiber::park_timeout(d);
        let el = t.elapsed();
        let _ = el; // park_timeout may return spuriously (std)
    }
    assert!(early.is_empty(), "timed waits returned early:\n{}", early.join("\n"));
}

/// spec/jobs.md: a scoped child cancelled by a with_timeout deadline joins
/// with is_timed_out (and is_cancelled).
fn timeout_reason_reaches_children() {
    let r = fiber::with_timeout(ms(10), || {
        fiber::scope(|s| {
            let h = s.spawn(|| fiber::sleep(Duration::MAX));
            let e = h.join().unwrap_err();
            (e.is_timed_out(), e.is_cancelled())
        })
    });
    assert_eq!(r, Err(fiber::TimedOut));
    let seen = Mutex::new(None);
    let _ = fiber::with_timeout(ms(10), || {
        fiber::scope(|s| {
            let h = s.spawn(|| fiber::sleep(Duration::MAX));
            let e = h.join().unwrap_err();
            *seen.lock().unwrap() = Some((e.is_timed_out(), e.is_cancelled()));
        })
    });
    assert_eq!(*seen.lock().unwrap(), Some((true, true)));
}

/// trio checkpoints always schedule (cancel_shielded_checkpoint yields;
/// checkpoint yields even when it raises). fiber README: "Every timed wait
/// is a yield point, even one whose deadline has already passed ... so a
/// polling loop lets other fibers run". A cancelled fiber polling for a
/// flag another fiber sets must let that fiber run, on one worker too.
fn cancelled_fiber_polling_loops_still_yield() {
    // Failed on one worker before such waits yielded (adversarial/cancelled_polling.rs).
    let mut starved = Vec::new();
    for name in [
        "yield_now",
        "sleep(0)",
        "sleep(1ms)",
        "recv_timeout(0)",
        "try_recv",
        "park_timeout(1ms)",
    ] {
        let flag = Arc::new(AtomicBool::new(false));
        let started = Arc::new(AtomicBool::new(false));
        let (f2, s2) = (flag.clone(), started.clone());
        let n = name;
        let poller = fiber::spawn(move || {
            s2.store(true, SeqCst);
            let t = Instant::now();
            let (_t, r) = chan::bounded::<u8>(0);
            while !f2.load(SeqCst) {
                match n {
                    "yield_now" => drop(fiber::yield_now()),
                    "sleep(0)" => drop(fiber::sleep(Duration::ZERO)),
                    "sleep(1ms)" => drop(fiber::sleep(ms(1))),
                    "recv_timeout(0)" => drop(r.recv_timeout(Duration::ZERO)),
                    "try_recv" => drop(r.try_recv()),
                    _ => fiber::park_timeout(ms(1)),
                }
                if t.elapsed() > Duration::from_secs(5) {
                    return Err(t.elapsed());
                }
            }
            Ok(t.elapsed())
        });
        while !started.load(SeqCst) {
            fiber::yield_now().unwrap();
        }
        let canceller = poller.canceller();
        let f3 = flag.clone();
        let setter = fiber::spawn(move || {
            canceller.cancel();
            fiber::yield_now().unwrap();
            f3.store(true, SeqCst)
        });
        let t = Instant::now();
        let _ = poller.join();
        let _ = setter.join();
        if t.elapsed() > Duration::from_secs(4) {
            starved.push(format!(
                "{name}: a cancelled poller starved the fiber it waited for ({:?})",
                t.elapsed()
            ));
        }
    }
    assert!(starved.is_empty(), "{}", starved.join("\n"));
}

// ======================================================================
// registration
// ======================================================================

macro_rules! on_fibers {
    ($modname:ident, $workers:expr; $($f:ident),* $(,)?) => {
        mod $modname {
            $( #[test] fn $f() { super::on($workers, super::$f) } )*
        }
    };
}

macro_rules! all_fiber_tests {
    ($($f:ident),* $(,)?) => {
        on_fibers!(w1, 1; $($f),*);
        on_fibers!(w2, 2; $($f),*);
    };
}

all_fiber_tests!(
    trio_cancel_points,
    trio_cancel_edge_cases,
    trio_cancel_at_every_checkpoint,
    trio_precancelled_task,
    trio_cancel_shielding,
    trio_cancel_inheritance,
    trio_basic_timeout,
    trio_cancel_scope_nesting,
    trio_nested_deadlines,
    trio_cancel_after_exit,
    trio_yield_checks_for_timeout,
    trio_very_deep_nesting,
    trio_locals_destroyed_promptly_on_cancel,
    trio_nursery_main_block_error,
    trio_child_crash_basic,
    trio_task_crash_propagation,
    trio_main_and_task_both_crash,
    trio_two_child_crashes,
    trio_child_crash_wakes_parent,
    trio_cancelled_nursery_waits_for_children,
    trio_try_scope_first_error_wins,
    trio_cancel_plus_crash,
    trio_sleep,
    trio_move_on_after,
    trio_fail_after,
    tokio_sem_no_permits,
    tokio_sem_try_acquire,
    tokio_sem_try_acquire_many,
    tokio_sem_acquire,
    tokio_sem_acquire_many,
    tokio_sem_add_permits,
    tokio_sem_add_permits_open,
    tokio_sem_forget,
    tokio_sem_stress,
    tokio_sem_max_permits,
    tokio_sem_cancelled_acquire_gives_back,
    tokio_mutex_straight_execution,
    tokio_mutex_readiness,
    tokio_mutex_aborted_future_1,
    tokio_mutex_aborted_future_2,
    tokio_mutex_try_lock,
    tokio_mutex_debug_format,
    tokio_rwlock_into_inner,
    tokio_rwlock_read_shared,
    tokio_rwlock_write_shared_pending,
    tokio_rwlock_read_exclusive_pending,
    tokio_rwlock_write_exclusive_pending,
    tokio_rwlock_write_read_shared_pending,
    tokio_rwlock_write_order,
    tokio_rwlock_multithreaded,
    tokio_rwlock_try_read_try_write,
    tokio_rwlock_downgrade,
    tokio_barrier_zero_does_not_block,
    tokio_barrier_single,
    tokio_barrier_tango,
    tokio_barrier_lots,
    tokio_once_drop_cell,
    tokio_once_get_or_init,
    tokio_once_get_or_init_panic,
    tokio_once_set_while_initializing,
    tokio_mpsc_send_recv_with_buffer,
    tokio_mpsc_start_send_past_cap,
    tokio_mpsc_send_recv_unbounded,
    tokio_mpsc_send_recv_buffer_limited,
    tokio_mpsc_close,
    tokio_mpsc_close_delivers_buffered,
    tokio_mpsc_try_send_fail,
    tokio_mpsc_try_send_fail_with_try_recv,
    tokio_mpsc_unconsumed_messages_are_dropped,
    tokio_mpsc_try_recv_bounded,
    tokio_mpsc_try_recv_unbounded,
    tokio_mpsc_try_recv_after_close,
    tokio_mpsc_recv_timeout,
    tokio_mpsc_capacity_len,
    tokio_mpsc_drop_all_elements_during_panic,
    tokio_mpsc_many_senders,
    tokio_mpsc_zero_capacity,
    tokio_joinset_with_sleep,
    tokio_joinset_abort_tasks,
    tokio_joinset_task_panics,
    tokio_joinset_abort_all,
    tokio_joinset_try_join_next,
    tokio_abort_without_panic_3157,
    tokio_abort_without_panic_3662,
    tokio_abort_wakes_task_3964,
    tokio_abort_task_that_panics_on_drop,
    tokio_join_error_display,
    tokio_abort_before_start,
    trio_shield_vs_passed_deadline,
    trio_timeout_cancels_nursery_children,
    trio_error_during_timeout_propagates,
    supervisor_body_panic_cancels_children,
    tokio_mpsc_rx_drop_wakes_parked_sender,
    mixed_thread_fiber_sync,
    barrier_cancelled_waiter_withdraws,
    max_timeouts_mean_forever,
    chan_cancel_exactly_once,
    sem_cancel_stress,
    timed_waits_never_early,
    timeout_reason_reaches_children,
    cancelled_fiber_polling_loops_still_yield,
);

// trio's interleave check assumes one thread.
on_fibers!(w1_only, 1; trio_basic_interleave);

/// The same bodies from plain OS threads (no runtime), where the API allows.
mod thread {
    macro_rules! on_threads {
        ($($f:ident),* $(,)?) => { $( #[test] fn $f() { super::watchdog(super::$f) } )* };
    }
    on_threads!(
        tokio_sem_no_permits,
        tokio_sem_try_acquire,
        tokio_sem_try_acquire_many,
        tokio_sem_acquire,
        tokio_sem_acquire_many,
        tokio_sem_add_permits,
        tokio_sem_add_permits_open,
        tokio_sem_forget,
        tokio_sem_stress,
        tokio_sem_max_permits,
        tokio_sem_blocking_acquire,
        tokio_mutex_straight_execution,
        tokio_mutex_readiness,
        tokio_mutex_aborted_future_2,
        tokio_mutex_try_lock,
        tokio_mutex_debug_format,
        tokio_rwlock_into_inner,
        tokio_rwlock_read_shared,
        tokio_rwlock_write_shared_pending,
        tokio_rwlock_read_exclusive_pending,
        tokio_rwlock_write_exclusive_pending,
        tokio_rwlock_write_read_shared_pending,
        tokio_rwlock_write_order,
        tokio_rwlock_multithreaded,
        tokio_rwlock_try_read_try_write,
        tokio_rwlock_downgrade,
        tokio_barrier_zero_does_not_block,
        tokio_barrier_single,
        tokio_barrier_tango,
        tokio_barrier_lots,
        tokio_once_drop_cell,
        tokio_once_get_or_init,
        tokio_once_get_or_init_panic,
        tokio_once_set_while_initializing,
        tokio_mpsc_send_recv_with_buffer,
        tokio_mpsc_start_send_past_cap,
        tokio_mpsc_send_recv_unbounded,
        tokio_mpsc_send_recv_buffer_limited,
        tokio_mpsc_close,
        tokio_mpsc_close_delivers_buffered,
        tokio_mpsc_try_send_fail,
        tokio_mpsc_try_send_fail_with_try_recv,
        tokio_mpsc_unconsumed_messages_are_dropped,
        tokio_mpsc_try_recv_bounded,
        tokio_mpsc_try_recv_unbounded,
        tokio_mpsc_try_recv_after_close,
        tokio_mpsc_recv_timeout,
        tokio_mpsc_capacity_len,
        tokio_mpsc_drop_all_elements_during_panic,
        tokio_mpsc_many_senders,
        tokio_mpsc_zero_capacity,
        tokio_mpsc_rx_drop_wakes_parked_sender,
        tokio_joinset_runtime_gone,
    );
}
