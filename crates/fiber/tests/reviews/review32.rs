//! Review 32: `non_cancellable` scopes and `with_timeout` after 99646fa
//! (held-off jobs with an `enclosing` link), `fiber::sync` parity with
//! `std::sync`, and the `std::thread`-like API (spawn, Builder, park,
//! scope), from fibers and plain threads.

use crate::common::*;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, TryLockError};
use std::time::{Duration, Instant};

use fiber::sync::{Barrier, Condvar, Mutex, OnceLock, RwLock};
use fiber::{Job, JobState};

// ---------------------------------------------------------------------
// 1. non_cancellable + scopes / with_timeout (99646fa)
// ---------------------------------------------------------------------

/// Run `body` in a fiber that has been cancelled (through its root job
/// when `via_job`, else through its `JoinHandle`), after it has seen the
/// cancellation; return what `body` returned (a panic of `body` is
/// re-raised here).
fn after_cancel<T: Send + 'static>(via_job: bool, body: impl FnOnce() -> T + Send + 'static) -> T {
    within(20, move || {
        rt().block_on(move || {
            let out = Arc::new(std::sync::Mutex::new(None));
            let o = out.clone();
            let (tx, rx) = fiber::chan::bounded(1);
            let h = fiber::spawn(move || {
                tx.send(Job::current()).unwrap();
                while fiber::sleep(ms(2)).is_ok() {}
                let v = body();
                *o.lock().unwrap() = Some(v);
            });
            let job: Job = rx.recv().unwrap();
            if via_job {
                job.cancel();
            } else {
                h.cancel();
            }
            match h.join() {
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(e) => assert!(e.is_cancelled(), "{e:?}"),
                Ok(()) => panic!("the fiber was cancelled but ended Ok"),
            }
            let v = out.lock().unwrap().take().expect("body ran");
            v
        })
    })
}

#[test]
fn children_of_a_scope_opened_in_non_cancellable_are_not_cancelled_by_the_outer_cancel() {
    for via_job in [true, false] {
        let (results, during, after) = after_cancel(via_job, || {
            let (results, during) = fiber::non_cancellable(|| {
                let results = fiber::scope(|s| {
                    let hs: Vec<_> = (0..3)
                        .map(|i| s.spawn(move || (i, fiber::sleep(ms(30)).is_ok(), fiber::is_cancelled())))
                        .collect();
                    hs.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
                });
                (results, fiber::is_cancelled())
            });
            (results, during, fiber::is_cancelled())
        });
        assert_eq!(
            results,
            vec![(0, true, false), (1, true, false), (2, true, false)],
            "via_job={via_job}"
        );
        assert!(!during, "is_cancelled inside the section");
        assert!(
            after,
            "the outer cancellation must be seen after the section (via_job={via_job})"
        );
    }
}

#[test]
fn a_child_panic_in_a_scope_opened_in_non_cancellable_reaches_the_caller() {
    let msg = after_cancel(true, || {
        panic_message(|| {
            fiber::non_cancellable(|| {
                fiber::scope(|s| {
                    s.spawn(|| {
                        fiber::sleep(ms(10)).expect("child was cancelled");
                        panic!("child-boom");
                    });
                })
            })
        })
    });
    assert_eq!(msg.as_deref(), Some("child-boom"));
}

#[test]
fn a_child_error_in_a_try_scope_opened_in_non_cancellable_reaches_the_caller() {
    let (r, after) = after_cancel(false, || {
        let r = fiber::non_cancellable(|| {
            fiber::try_scope(|s| {
                s.spawn(|| -> Result<(), &'static str> {
                    fiber::sleep(ms(10)).map_err(|_| "cancelled")?;
                    Err("child-err")
                });
                s.spawn(|| -> Result<u8, &'static str> {
                    // A sibling: cancelled by the failure (not by the outer cancel).
                    let _ = fiber::sleep(Duration::from_secs(5));
                    Ok(1)
                });
                Ok(())
            })
        });
        (r, fiber::is_cancelled())
    });
    assert_eq!(r, Err("child-err"));
    assert!(after);
}

#[test]
fn job_current_inside_a_scope_opened_in_non_cancellable_is_the_scopes_active_job() {
    let (outer_cancelled, body, child, distinct) = after_cancel(true, || {
        let outer = Job::current();
        let (body, child, distinct) = fiber::non_cancellable(|| {
            fiber::scope(|s| {
                let me = Job::current();
                let child = s
                    .spawn(|| {
                        let j = Job::current();
                        (j.is_active(), j.is_cancelled(), j.state())
                    })
                    .join()
                    .unwrap();
                (
                    (me.is_active(), me.is_cancelled(), me.state()),
                    child,
                    me.id() != outer.id(),
                )
            })
        });
        (outer.is_cancelled(), body, child, distinct)
    });
    assert!(outer_cancelled);
    assert_eq!(body, (true, false, JobState::Active));
    assert_eq!(child, (true, false, JobState::Active));
    assert!(distinct);
}

/// A fiber in a section (cancelled or not), and a child of a scope opened
/// there, join a sibling fiber's job: a legit join that waits.
#[test]
fn joins_of_a_siblings_job_from_inside_non_cancellable_wait_for_it() {
    on_runtime(|| {
        for cancelled in [false, true] {
            let (gtx, grx) = fiber::chan::bounded(2);
            let sibling = move || {
                let gtx = gtx.clone();
                fiber::spawn(move || {
                    gtx.send(Job::current()).unwrap();
                    fiber::sleep(ms(40)).unwrap();
                })
            };
            let g1 = sibling();
            let g2 = sibling();
            let j1: Job = grx.recv().unwrap();
            let j2: Job = grx.recv().unwrap();
            let (rtx, rrx) = fiber::chan::bounded(1);
            let (ready_tx, ready_rx) = fiber::chan::bounded(1);
            let f = fiber::spawn(move || {
                if cancelled {
                    ready_tx.send(()).unwrap();
                    while fiber::sleep(ms(2)).is_ok() {}
                }
                let r = fiber::non_cancellable(|| {
                    let direct = j1.join();
                    let from_child = fiber::scope(|s| s.spawn(move || j2.join()).join().unwrap());
                    (direct, from_child)
                });
                rtx.send(r).unwrap_or_else(|_| panic!("send"));
            });
            if cancelled {
                ready_rx.recv().unwrap();
                f.cancel();
            }
            let (direct, from_child) = rrx.recv().unwrap();
            assert_eq!(direct, Ok(JobState::Completed), "cancelled={cancelled}");
            assert_eq!(from_child, Ok(JobState::Completed), "cancelled={cancelled}");
            let _ = f.join();
            g1.join().unwrap();
            g2.join().unwrap();
        }
    });
}

/// Jobs made inside the section (the held-off scope's, and its child's)
/// joined from an unrelated fiber outside: waits for them.
#[test]
fn a_job_made_inside_non_cancellable_can_be_joined_from_outside() {
    on_runtime(|| {
        let (jtx, jrx) = fiber::chan::bounded::<Job>(2);
        let watcher = fiber::spawn(move || {
            let a = jrx.recv().unwrap();
            let b = jrx.recv().unwrap();
            (a.join(), b.join())
        });
        let f = fiber::spawn(move || {
            fiber::non_cancellable(|| {
                fiber::scope(|s| {
                    jtx.send(Job::current()).unwrap();
                    let jtx = jtx.clone();
                    s.spawn(move || {
                        jtx.send(Job::current()).unwrap();
                        fiber::sleep(ms(30)).unwrap();
                    });
                })
            })
        });
        f.join().unwrap();
        let (a, b) = watcher.join().unwrap();
        assert_eq!(a, Ok(JobState::Completed));
        assert_eq!(b, Ok(JobState::Completed));
    });
}

/// A child of a scope opened in the section joins a `ScopedJoinHandle` of
/// the outer scope (a sibling of the fiber in the section): not a self-join.
#[test]
fn a_child_of_a_held_off_scope_joins_an_outer_scopes_child_handle() {
    on_runtime(|| {
        let v = fiber::scope(|outer| {
            let sib = outer.spawn(|| {
                fiber::sleep(ms(30)).unwrap();
                42
            });
            fiber::non_cancellable(|| fiber::scope(|s| s.spawn(move || sib.join().unwrap()).join().unwrap()))
        });
        assert_eq!(v, 42);
    });
}

/// A detached fiber (`fiber::spawn`) started inside a scope (held off or
/// not) is not inside that scope: its join of the scope's job, or of the
/// job the section was entered in, must wait, not be refused as a
/// self-join.
#[test]
fn a_detached_fiber_spawned_in_a_scope_may_join_the_scopes_job() {
    on_runtime(|| {
        // Plain scope.
        let (dtx, drx) = fiber::chan::bounded(1);
        fiber::scope(|_| {
            let job = Job::current();
            dtx.send(fiber::spawn(move || job.join())).unwrap();
            fiber::sleep(ms(10)).unwrap();
        });
        let d = drx.recv().unwrap();
        assert_eq!(d.join().expect("detached joiner panicked"), Ok(JobState::Completed));
        // Held-off scope: the detached fiber joins the enclosing job.
        let f = fiber::spawn(|| {
            let enclosing = Job::current();
            fiber::non_cancellable(|| {
                fiber::scope(|_| {
                    let e = enclosing.clone();
                    let held = Job::current();
                    let d1 = fiber::spawn(move || e.join());
                    let d2 = fiber::spawn(move || held.join());
                    fiber::sleep(ms(10)).unwrap();
                    (d1, d2)
                })
            })
        });
        let (d1, d2) = f.join().unwrap();
        assert_eq!(
            d1.join().expect("joiner of the enclosing job panicked"),
            Ok(JobState::Completed)
        );
        assert_eq!(
            d2.join().expect("joiner of the held-off job panicked"),
            Ok(JobState::Completed)
        );
    });
}

#[test]
fn nested_non_cancellable_holds_off_a_cancel_of_the_held_off_scope() {
    let (inner, body_after) = after_cancel(true, || {
        fiber::non_cancellable(|| {
            fiber::scope(|s| {
                let s1 = Job::current();
                s.spawn(move || {
                    fiber::sleep(ms(10)).unwrap();
                    s1.cancel();
                });
                let inner = fiber::non_cancellable(|| {
                    fiber::scope(|s2| s2.spawn(|| fiber::sleep(ms(60)).is_ok()).join().unwrap())
                });
                (inner, fiber::is_cancelled())
            })
        })
    });
    assert!(inner, "a child of a scope opened in the inner section was cancelled");
    assert!(body_after, "the scope's own cancel is seen after the inner section");
}

#[test]
fn with_timeout_inside_non_cancellable_still_fires() {
    let (r, ok, elapsed) = after_cancel(false, || {
        let start = Instant::now();
        let r = fiber::non_cancellable(|| fiber::with_timeout(ms(50), || fiber::sleep(Duration::from_secs(5))));
        let ok = fiber::non_cancellable(|| fiber::with_timeout(ms(500), || 5));
        (r, ok, start.elapsed())
    });
    assert!(r.is_err(), "{r:?}");
    assert_eq!(ok, Ok(5));
    assert!(elapsed < Duration::from_secs(3), "{elapsed:?}");
}

#[test]
fn an_outer_deadline_does_not_reach_a_with_timeout_or_scope_opened_in_non_cancellable() {
    on_runtime(|| {
        let mut inner = None;
        let mut after = None;
        let outer = fiber::with_timeout(ms(30), || {
            inner = Some(fiber::non_cancellable(|| {
                let w = fiber::with_timeout(Duration::from_secs(5), || fiber::sleep(ms(80)).is_ok());
                let s = fiber::scope(|s| s.spawn(|| fiber::sleep(ms(80)).is_ok()).join().unwrap());
                (w, s)
            }));
            after = Some(fiber::is_cancelled());
        });
        assert_eq!(inner, Some((Ok(true), true)));
        assert_eq!(after, Some(true));
        assert!(outer.is_err(), "the outer deadline passed: the outcome is the timeout");
    });
}

#[test]
fn non_cancellable_inside_a_held_off_with_timeout_holds_its_deadline_off() {
    on_runtime(|| {
        let mut slept = None;
        let r = fiber::non_cancellable(|| {
            fiber::with_timeout(ms(30), || {
                slept = Some(fiber::non_cancellable(|| fiber::sleep(ms(80)).is_ok()));
                fiber::sleep(Duration::from_secs(5))
            })
        });
        assert_eq!(slept, Some(true));
        assert!(r.is_err());
    });
}

/// Kotlin: `withContext(NonCancellable) { coroutineScope { ... } }` in a
/// coroutine whose scope is cancelled by a failing sibling: the section's
/// children run to the end. Here the fiber is a scope child cancelled by
/// its sibling's panic.
#[test]
fn a_held_off_scope_survives_a_sibling_failure_of_the_enclosing_scope() {
    on_runtime(|| {
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        let msg = panic_message(move || {
            fiber::scope(|s| {
                s.spawn(move || {
                    while fiber::sleep(ms(2)).is_ok() {}
                    let ok = fiber::non_cancellable(|| {
                        fiber::scope(|s2| s2.spawn(|| fiber::sleep(ms(40)).is_ok()).join().unwrap())
                    });
                    d.store(ok, Ordering::SeqCst);
                });
                s.spawn(|| {
                    fiber::sleep(ms(10)).unwrap();
                    panic!("sibling-fails");
                });
            })
        });
        assert_eq!(msg.as_deref(), Some("sibling-fails"));
        assert!(done.load(Ordering::SeqCst));
    });
}

// ---------------------------------------------------------------------
// 2. fiber::sync vs std::sync
// ---------------------------------------------------------------------

#[test]
fn mutex_poisoning_from_a_fiber_seen_by_a_thread_and_cleared() {
    within(20, || {
        let m = Arc::new(Mutex::new(1));
        let m2 = m.clone();
        let r = rt().block_on(move || {
            fiber::spawn(move || {
                let mut g = m2.lock().unwrap();
                *g = 2;
                panic!("poison-it");
            })
            .join()
        });
        assert!(r.unwrap_err().is_panic());
        assert!(m.is_poisoned());
        let m3 = m.clone();
        std::thread::spawn(move || {
            let e = m3.lock().unwrap_err();
            assert_eq!(*e.into_inner(), 2);
            match m3.try_lock() {
                Err(TryLockError::Poisoned(p)) => assert_eq!(*p.into_inner(), 2),
                other => panic!("expected Poisoned, got {:?}", other.map(|g| *g)),
            }
        })
        .join()
        .unwrap();
        m.clear_poison();
        assert!(!m.is_poisoned());
        assert_eq!(*m.lock().unwrap(), 2);
        let mut m = Arc::try_unwrap(m).unwrap();
        *m.get_mut().unwrap() = 3;
        assert_eq!(m.into_inner().unwrap(), 3);
    });
}

#[test]
fn mutex_get_mut_and_into_inner_of_a_poisoned_mutex_are_err() {
    let mut m = Mutex::new(vec![1]);
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _g = m.lock().unwrap();
        panic!("x");
    }));
    assert!(m.is_poisoned());
    m.get_mut().unwrap_err().into_inner().push(2);
    assert_eq!(m.into_inner().unwrap_err().into_inner(), vec![1, 2]);
}

#[test]
fn try_lock_while_a_fiber_holds_the_mutex_across_a_park_is_would_block() {
    within(20, || {
        let m = Arc::new(Mutex::new(0));
        let rt = rt();
        let (tx, rx) = std::sync::mpsc::channel();
        let (rel_tx, rel_rx) = fiber::chan::bounded::<()>(1);
        let m2 = m.clone();
        let h = rt.handle().spawn(move || {
            let mut g = m2.lock().unwrap();
            tx.send(()).unwrap();
            rel_rx.recv().unwrap();
            *g += 1;
        });
        rx.recv().unwrap();
        assert!(matches!(m.try_lock(), Err(TryLockError::WouldBlock)));
        // A plain thread blocks on it until the fiber releases.
        let m3 = m.clone();
        let t = std::thread::spawn(move || *m3.lock().unwrap() + 10);
        rel_tx.send(()).unwrap();
        assert_eq!(t.join().unwrap(), 11);
        rt.block_on(move || h.join().unwrap());
    });
}

#[test]
fn rwlock_is_poisoned_by_a_writer_panic_only() {
    within(20, || {
        rt().block_on(|| {
            let l = Arc::new(RwLock::new(5));
            let l2 = l.clone();
            // A reader panicking does not poison (std: only writers do).
            let r = fiber::spawn(move || {
                let _g = l2.read().unwrap();
                panic!("reader");
            })
            .join();
            assert!(r.unwrap_err().is_panic());
            assert!(!l.is_poisoned(), "a panicking reader poisoned the RwLock");
            let l3 = l.clone();
            let _ = fiber::spawn(move || {
                let mut g = l3.write().unwrap();
                *g = 6;
                panic!("writer");
            })
            .join();
            assert!(l.is_poisoned());
            assert_eq!(*l.read().unwrap_err().into_inner(), 6);
            assert!(matches!(l.try_read(), Err(TryLockError::Poisoned(_))));
            assert!(matches!(l.try_write(), Err(TryLockError::Poisoned(_))));
            l.clear_poison();
            assert!(!l.is_poisoned());
            let g = l.read().unwrap();
            assert!(matches!(l.try_write(), Err(TryLockError::WouldBlock)));
            assert!(l.try_read().is_ok());
            drop(g);
            let w = l.write().unwrap();
            assert!(matches!(l.try_read(), Err(TryLockError::WouldBlock)));
            drop(w);
        });
    });
}

#[test]
fn condvar_wait_timeout_zero_and_max() {
    within(20, || {
        rt().block_on(|| {
            let pair = Arc::new((Mutex::new(false), Condvar::new()));
            let (m, cv) = &*pair;
            let (g, r) = cv.wait_timeout(m.lock().unwrap(), Duration::ZERO).unwrap();
            assert!(r.timed_out());
            let (g, r) = cv.wait_timeout_while(g, Duration::ZERO, |v| !*v).unwrap();
            assert!(r.timed_out());
            drop(g);
            // Duration::MAX: waits for the notify from a plain thread.
            let p2 = pair.clone();
            let t = std::thread::spawn(move || {
                std::thread::sleep(ms(20));
                *p2.0.lock().unwrap() = true;
                p2.1.notify_all();
            });
            let (g, r) = cv
                .wait_timeout_while(m.lock().unwrap(), Duration::MAX, |v| !*v)
                .unwrap();
            assert!(*g && !r.timed_out());
            drop(g);
            t.join().unwrap();
            // And a Duration::MAX wait_timeout from a plain thread, woken by a fiber.
            *m.lock().unwrap() = false;
            let p3 = pair.clone();
            let t = std::thread::spawn(move || {
                let (m, cv) = &*p3;
                let mut g = m.lock().unwrap();
                while !*g {
                    let (g2, r) = cv.wait_timeout(g, Duration::MAX).unwrap();
                    assert!(!r.timed_out());
                    g = g2;
                }
            });
            fiber::sleep(ms(20)).unwrap();
            *m.lock().unwrap() = true;
            cv.notify_one();
            fiber::blocking(move || t.join().unwrap());
        });
    });
}

#[test]
fn condvar_notify_all_wakes_fibers_and_threads_mixed() {
    within(20, || {
        let rt = rt();
        let pair = Arc::new((Mutex::new(0u32), Condvar::new()));
        let woke = Arc::new(AtomicUsize::new(0));
        let mut threads = Vec::new();
        let mut fibers = Vec::new();
        for i in 0..6 {
            let p = pair.clone();
            let w = woke.clone();
            let body = move || {
                let (m, cv) = &*p;
                let g = cv.wait_while(m.lock().unwrap(), |v| *v == 0).unwrap();
                assert_eq!(*g, 1);
                w.fetch_add(1, Ordering::SeqCst);
            };
            if i % 2 == 0 {
                threads.push(std::thread::spawn(body));
            } else {
                fibers.push(rt.handle().spawn(body));
            }
        }
        std::thread::sleep(ms(50));
        *pair.0.lock().unwrap() = 1;
        pair.1.notify_all();
        for t in threads {
            t.join().unwrap();
        }
        rt.block_on(move || {
            for f in fibers {
                f.join().unwrap();
            }
        });
        assert_eq!(woke.load(Ordering::SeqCst), 6);
    });
}

#[test]
fn condvar_with_two_mutexes_at_once_panics() {
    within(20, || {
        let rt = rt();
        let cv = Arc::new(Condvar::new());
        let m1 = Arc::new(Mutex::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        let (c, m) = (cv.clone(), m1.clone());
        let waiter = rt.handle().spawn(move || {
            let g = m.lock().unwrap();
            tx.send(()).unwrap();
            let _g = c.wait_while(g, |v| !*v).unwrap();
        });
        rx.recv().unwrap();
        // The fiber has released m1 only once it is queued on the condvar.
        drop(m1.lock().unwrap());
        let m2 = Mutex::new(());
        let msg = panic_message(|| {
            let _ = cv.wait_timeout(m2.lock().unwrap(), ms(100));
        });
        assert!(msg.is_some_and(|m| m.contains("two mutexes")));
        *m1.lock().unwrap() = true;
        cv.notify_all();
        rt.block_on(move || waiter.join().unwrap());
    });
}

#[test]
fn barrier_has_exactly_one_leader_per_generation_across_fibers_and_threads() {
    within(30, || {
        let rt = rt();
        let n = 4;
        let gens = 20;
        let b = Arc::new(Barrier::new(n));
        let leaders = Arc::new(AtomicUsize::new(0));
        let mut threads = Vec::new();
        let mut fibers = Vec::new();
        for i in 0..n {
            let (b, l) = (b.clone(), leaders.clone());
            let body = move || {
                for _ in 0..gens {
                    let r = b.wait();
                    assert!(!r.is_cancelled());
                    if r.is_leader() {
                        l.fetch_add(1, Ordering::SeqCst);
                    }
                }
            };
            if i % 2 == 0 {
                threads.push(std::thread::spawn(body));
            } else {
                fibers.push(rt.handle().spawn(body));
            }
        }
        for t in threads {
            t.join().unwrap();
        }
        rt.block_on(move || {
            for f in fibers {
                f.join().unwrap();
            }
        });
        assert_eq!(leaders.load(Ordering::SeqCst), gens);
        assert_eq!(b.generation(), gens as u64);
        // n = 0 acts as 1, as std's.
        let one = Barrier::new(0);
        assert!(one.wait().is_leader());
        assert!(one.wait().is_leader());
    });
}

#[test]
fn oncelock_panicking_initializer_leaves_it_empty_and_runs_once_under_contention() {
    within(20, || {
        let cell = Arc::new(OnceLock::new());
        assert!(panic_message(|| {
            cell.get_or_init(|| panic!("init-fails"));
        })
        .is_some_and(|m| m == "init-fails"));
        assert!(cell.get().is_none());
        let runs = Arc::new(AtomicUsize::new(0));
        let rt = rt();
        let mut threads = Vec::new();
        let mut fibers = Vec::new();
        for i in 0..8 {
            let (c, r) = (cell.clone(), runs.clone());
            let body = move || {
                *c.get_or_init(|| {
                    r.fetch_add(1, Ordering::SeqCst);
                    std::thread::sleep(ms(20));
                    7
                })
            };
            if i % 2 == 0 {
                threads.push(std::thread::spawn(body));
            } else {
                fibers.push(rt.handle().spawn(body));
            }
        }
        for t in threads {
            assert_eq!(t.join().unwrap(), 7);
        }
        rt.block_on(move || {
            for f in fibers {
                assert_eq!(f.join().unwrap(), 7);
            }
        });
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert_eq!(cell.set(8), Err(8));
        let mut c = Arc::try_unwrap(cell).unwrap();
        assert_eq!(c.take(), Some(7));
        assert!(c.get().is_none());
        assert_eq!(c.set(9), Ok(()));
        assert_eq!(c.into_inner(), Some(9));
    });
}

#[test]
fn oncelock_reentrant_init_panics_instead_of_hanging_in_a_fiber_and_a_thread() {
    within(20, || {
        let cell: OnceLock<u32> = OnceLock::new();
        let msg = panic_message(|| {
            cell.get_or_init(|| *cell.get_or_init(|| 1) + 1);
        });
        assert!(msg.is_some(), "re-entrant get_or_init on a thread did not panic");
        assert!(cell.get().is_none());
        assert_eq!(*cell.get_or_init(|| 3), 3);
        let r = rt().block_on(|| {
            let cell: OnceLock<u32> = OnceLock::new();
            let msg = panic_message(|| {
                cell.get_or_init(|| {
                    let _ = cell.set(5);
                    1
                });
            });
            (msg.is_some(), cell.get().copied())
        });
        assert_eq!(r, (true, None));
    });
}

#[test]
fn oncelock_waiters_are_not_lost_when_the_initializer_panics() {
    within(20, || {
        rt().block_on(|| {
            let cell = Arc::new(OnceLock::<u32>::new());
            let (tx, rx) = fiber::chan::bounded(1);
            let c = cell.clone();
            let first = fiber::spawn(move || {
                c.get_or_init(|| {
                    tx.send(()).unwrap();
                    fiber::sleep(ms(30)).unwrap();
                    panic!("first-init");
                });
            });
            rx.recv().unwrap();
            let waiters: Vec<_> = (0..3)
                .map(|i| {
                    let c = cell.clone();
                    fiber::spawn(move || *c.get_or_init(|| 10 + i))
                })
                .collect();
            let c = cell.clone();
            let on_thread = fiber::blocking(move || std::thread::spawn(move || *c.wait()));
            assert!(first.join().unwrap_err().is_panic());
            let vals: Vec<u32> = waiters.into_iter().map(|w| w.join().unwrap()).collect();
            assert!(vals.iter().all(|v| *v == vals[0]) && (10..13).contains(&vals[0]));
            assert_eq!(fiber::blocking(move || on_thread.join().unwrap()), vals[0]);
        });
    });
}

// ---------------------------------------------------------------------
// 3. std::thread-like API
// ---------------------------------------------------------------------

#[test]
fn builder_name_stack_errors_and_handles() {
    on_runtime(|| {
        let (go_tx, go_rx) = fiber::chan::bounded::<()>(1);
        let h = fiber::Builder::new()
            .name("worker-1")
            .spawn(move || {
                go_rx.recv().unwrap();
                fiber::current().name().map(str::to_owned)
            })
            .unwrap();
        assert_eq!(h.fiber().name(), Some("worker-1"));
        assert!(!h.is_finished());
        go_tx.send(()).unwrap();
        let id = h.id();
        assert_eq!(h.fiber().id(), id);
        assert_eq!(h.join().unwrap().as_deref(), Some("worker-1"));
        let e = fiber::Builder::new().stack_size(2 << 30).spawn(|| ()).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
        let msg = panic_message(|| {
            let _ = fiber::Builder::new().name("a\0b").spawn(|| ());
        });
        assert!(msg.is_some(), "a NUL in the name must panic (as std)");
        // A panicking named fiber: the error names it.
        let e = fiber::Builder::new()
            .name("p")
            .spawn(|| panic!("x"))
            .unwrap()
            .join()
            .unwrap_err();
        assert!(e.is_panic());
        assert_eq!(e.name(), Some("p"));
    });
}

#[test]
fn is_finished_becomes_true_without_join() {
    on_runtime(|| {
        let (go_tx, go_rx) = fiber::chan::bounded::<()>(1);
        let h = fiber::spawn(move || go_rx.recv().unwrap());
        assert!(!h.is_finished());
        go_tx.send(()).unwrap();
        wait_until("is_finished", 5, || h.is_finished());
        h.join().unwrap();
    });
}

#[test]
fn park_tokens_and_timeouts() {
    on_runtime(|| {
        // A token made available before park: park returns at once.
        fiber::current().unpark();
        let start = Instant::now();
        fiber::park();
        // park_timeout(0) returns.
        fiber::park_timeout(Duration::ZERO);
        assert!(start.elapsed() < Duration::from_secs(2));
        // park_timeout(MAX) woken by a plain thread's unpark.
        let me = fiber::current();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            rx.recv().unwrap();
            std::thread::sleep(ms(20));
            me.unpark();
        });
        tx.send(()).unwrap();
        let start = Instant::now();
        let flag = Arc::new(AtomicBool::new(false));
        // Spurious returns are allowed: loop on a condition, as std says.
        let f2 = flag.clone();
        let me2 = fiber::current();
        let setter = std::thread::spawn(move || {
            std::thread::sleep(ms(15));
            f2.store(true, Ordering::SeqCst);
            // The flag's own wake-up: under load this thread may run after
            // the other one's unpark, whose token the loop has used.
            me2.unpark();
        });
        while !flag.load(Ordering::SeqCst) {
            fiber::park_timeout(Duration::MAX);
        }
        assert!(start.elapsed() < Duration::from_secs(5));
        fiber::blocking(move || {
            t.join().unwrap();
            setter.join().unwrap();
        });
    });
}

#[test]
fn park_timeout_max_returns_when_unparked_from_another_fiber() {
    on_runtime(|| {
        let (tx, rx) = fiber::chan::bounded(1);
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        let parker = fiber::spawn(move || {
            tx.send(fiber::current()).unwrap();
            while !d.load(Ordering::SeqCst) {
                fiber::park_timeout(Duration::MAX);
            }
        });
        let h: fiber::FiberHandle = rx.recv().unwrap();
        fiber::sleep(ms(10)).unwrap();
        done.store(true, Ordering::SeqCst);
        h.unpark();
        parker.join().unwrap();
    });
}

#[test]
fn sleep_duration_max_is_cancelled_promptly() {
    on_runtime(|| {
        let h = fiber::spawn(|| fiber::sleep(Duration::MAX));
        let h2 = fiber::spawn(|| fiber::with_timeout(ms(20), || fiber::sleep(Duration::MAX)));
        fiber::sleep(ms(10)).unwrap();
        let start = Instant::now();
        h.cancel();
        assert!(h.join().unwrap_err().is_cancelled());
        assert!(h2.join().unwrap().is_err());
        assert!(start.elapsed() < Duration::from_secs(3));
    });
}

#[test]
fn scope_panics_only_after_every_child_has_ended() {
    on_runtime(|| {
        let ended = Arc::new(AtomicUsize::new(0));
        let e = ended.clone();
        let msg = panic_message(move || {
            fiber::scope(|s| {
                for _ in 0..3 {
                    let e = e.clone();
                    s.spawn(move || {
                        struct OnEnd(Arc<AtomicUsize>);
                        impl Drop for OnEnd {
                            fn drop(&mut self) {
                                // Clean-up that parks: the scope must wait for it.
                                fiber::non_cancellable(|| fiber::sleep(ms(20)).unwrap());
                                self.0.fetch_add(1, Ordering::SeqCst);
                            }
                        }
                        let _g = OnEnd(e);
                        let _ = fiber::sleep(Duration::from_secs(5));
                    });
                }
                s.spawn(|| {
                    fiber::sleep(ms(5)).unwrap();
                    panic!("scoped-child-panic");
                });
            })
        });
        assert_eq!(msg.as_deref(), Some("scoped-child-panic"));
        assert_eq!(
            ended.load(Ordering::SeqCst),
            3,
            "scope re-raised before every child ended"
        );
    });
}

#[test]
fn a_joined_child_panic_does_not_make_the_scope_panic() {
    on_runtime(|| {
        let r = fiber::scope(|s| {
            let h = s.spawn(|| panic!("joined"));
            h.join().unwrap_err().is_panic()
        });
        assert!(r);
    });
}

/// A named misuse and the call that commits it.
type Misuse = (&'static str, Box<dyn FnOnce()>);

#[test]
fn misuse_from_a_plain_thread_panics_clearly() {
    within(10, || {
        let checks: Vec<Misuse> = vec![
            (
                "spawn",
                Box::new(|| {
                    fiber::spawn(|| ());
                }),
            ),
            (
                "sleep",
                Box::new(|| {
                    let _ = fiber::sleep(ms(1));
                }),
            ),
            (
                "current",
                Box::new(|| {
                    fiber::current();
                }),
            ),
            ("scope", Box::new(|| fiber::scope(|_| ()))),
            (
                "with_timeout",
                Box::new(|| {
                    let _ = fiber::with_timeout(ms(1), || ());
                }),
            ),
            (
                "Builder::spawn",
                Box::new(|| {
                    let _ = fiber::Builder::new().spawn(|| ());
                }),
            ),
            (
                "Job::current",
                Box::new(|| {
                    Job::current();
                }),
            ),
        ];
        for (what, f) in checks {
            let msg = panic_message(f);
            assert!(msg.is_some(), "{what} on a plain thread did not panic");
        }
        // The ones that have a plain-thread meaning.
        assert_eq!(fiber::non_cancellable(|| 3), 3);
        assert!(!fiber::is_cancelled());
        assert!(fiber::check_cancelled().is_ok());
        assert!(fiber::yield_now().is_ok());
        fiber::park_timeout(Duration::ZERO);
        assert!(Job::try_current().is_none());
    });
}

#[test]
fn joining_ones_own_handle_panics_instead_of_hanging() {
    on_runtime(|| {
        let (tx, rx) = fiber::chan::bounded::<fiber::JoinHandle<()>>(1);
        let (out_tx, out_rx) = fiber::chan::bounded(1);
        let h = fiber::spawn(move || {
            let me = rx.recv().unwrap();
            out_tx.send(panic_message(move || drop(me.join()))).unwrap();
        });
        tx.send(h).unwrap();
        let msg = out_rx.recv().unwrap();
        assert!(msg.is_some(), "a fiber joining its own handle must panic");
    });
}

/// During a runtime's shutdown grace, a fiber's clean-up code in a
/// `non_cancellable` section uses `with_timeout` to bound a wait: the
/// deadline must still fire (spec: "its own timeout still fires"), not
/// leave the body parked until the grace runs out. (The watchdog fiber
/// `with_timeout` spawns is, like every spawn during shutdown, cancelled
/// before it starts, so nothing enforces the deadline.)
// Failed before the fix: with_timeout inside non_cancellable during the shutdown grace never fires; the body sleeps until teardown
#[test]
fn with_timeout_in_non_cancellable_fires_during_the_shutdown_grace() {
    let (tx, rx) = std::sync::mpsc::channel();
    let dropped_after = within(20, move || {
        let rt = rt_fixed_grace(2, Duration::from_secs(2));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        rt.handle().spawn(move || {
            ready_tx.send(()).unwrap();
            while fiber::sleep(ms(2)).is_ok() {}
            // Shutting down: clean up, with a bounded wait.
            let start = Instant::now();
            let r = fiber::non_cancellable(|| fiber::with_timeout(ms(50), || fiber::sleep(Duration::from_secs(30))));
            let _ = tx.send((r.is_err(), start.elapsed()));
        });
        ready_rx.recv().unwrap();
        let start = Instant::now();
        drop(rt);
        start.elapsed()
    });
    let (timed_out, elapsed) = rx.recv_timeout(Duration::from_secs(1)).unwrap_or_else(|_| {
        panic!(
            "the 50 ms with_timeout never returned: its body was still parked when the runtime tore \
             down after the 2 s grace (runtime drop took {dropped_after:?})"
        )
    });
    assert!(timed_out);
    assert!(
        elapsed < Duration::from_millis(1500),
        "the 50 ms deadline fired only after {elapsed:?}"
    );
}

/// The control for the test above: a plain bounded wait (`sleep`,
/// `recv_timeout`) in a `non_cancellable` section during the shutdown
/// grace returns on time.
#[test]
fn a_bounded_wait_in_non_cancellable_returns_on_time_during_the_shutdown_grace() {
    let (tx, rx) = std::sync::mpsc::channel();
    within(20, move || {
        let rt = rt_fixed_grace(2, Duration::from_secs(2));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        rt.handle().spawn(move || {
            let (_keep, never) = fiber::chan::bounded::<()>(1);
            ready_tx.send(()).unwrap();
            while fiber::sleep(ms(2)).is_ok() {}
            let start = Instant::now();
            let slept = fiber::non_cancellable(|| fiber::sleep(ms(50)).is_ok());
            let recv = fiber::non_cancellable(|| never.recv_timeout(ms(50)).is_err());
            let _ = tx.send((slept, recv, start.elapsed()));
        });
        ready_rx.recv().unwrap();
        drop(rt);
    });
    let (slept, recv, elapsed) = rx
        .recv_timeout(Duration::from_secs(1))
        .expect("the clean-up never reported");
    assert!(slept && recv);
    assert!(elapsed < Duration::from_millis(1500), "{elapsed:?}");
}

/// In a cancelled fiber, `fiber::sync` waits inside `non_cancellable`
/// (Condvar, Barrier) wait as usual: no early "timed out" or cancelled
/// result.
#[test]
fn sync_waits_inside_non_cancellable_of_a_cancelled_fiber_wait_normally() {
    let pair = Arc::new((Mutex::new(false), Condvar::new()));
    let barrier = Arc::new(Barrier::new(2));
    let (p, b) = (pair.clone(), barrier.clone());
    let notifier = std::thread::spawn(move || {
        std::thread::sleep(ms(150));
        *p.0.lock().unwrap() = true;
        p.1.notify_all();
        b.wait().is_leader()
    });
    let (cv_ok, timed_out, barrier_cancelled) = after_cancel(false, move || {
        fiber::non_cancellable(|| {
            let (m, cv) = &*pair;
            let g = cv.wait_while(m.lock().unwrap(), |v| !*v).unwrap();
            let cv_ok = *g;
            let (g, r) = cv.wait_timeout_while(g, Duration::from_secs(5), |v| !*v).unwrap();
            drop(g);
            (cv_ok, r.timed_out(), barrier.wait().is_cancelled())
        })
    });
    assert!(cv_ok, "the condvar wait returned before the notify");
    assert!(!timed_out);
    assert!(!barrier_cancelled);
    notifier.join().unwrap();
}
