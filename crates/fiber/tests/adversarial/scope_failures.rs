//! Adversarial: which failure a scope reports, self-joins of jobs, and a
//! condvar whose mutex moved. Kotlin: the first failure wins, later ones
//! are suppressed (a `try_scope` body's `Err` before a child's panic on the
//! cancellation it caused). std: a scope body that joins a panicked child
//! and re-raises (or panics on the join's error) raises that payload, not
//! a generic one. `Job::join` from inside the joined job panics naming the
//! misuse (as `JoinHandle::join` on one's own handle does) instead of
//! waiting for itself. A `Condvar` may be used with one mutex that moved
//! between waits (std never panics there). A `with_timeout` whose body
//! overran its deadline reports `TimedOut` even if an explicit cancel
//! came after the deadline (the first cancellation reason stands).

use fiber::sync::{Condvar, Mutex};
use fiber::Job;
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use crate::common::{ms, panic_message, rt1, rt2, within};

/// Run `f` on a 1-worker and then on a 2-worker runtime, each under a
/// hang guard.
fn on_both<T: Send + 'static>(f: impl Fn() -> T + Send + Sync + Clone + 'static) {
    let g = f.clone();
    within(20, move || rt1().block_on(move || drop(g())));
    within(20, move || rt2().block_on(move || drop(f())));
}

/// Kotlin: "the first exception wins"; a failure that happens while the
/// scope is already failing (because of an earlier failure) is suppressed.
/// A `try_scope` body that returns `Err` first must have that `Err`
/// returned, even if a child then panics on the cancellation it caused
/// (the common `fiber::sleep(..).unwrap()` pattern).
#[test]
fn try_scope_body_err_first_then_child_panics_on_cancel() {
    on_both(|| {
        let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
            fiber::try_scope(|s| -> Result<(), &'static str> {
                s.spawn(|| -> Result<(), &'static str> {
                    fiber::sleep(Duration::from_secs(3600)).expect("child: cancelled");
                    Ok(())
                });
                fiber::sleep(ms(20)).unwrap();
                Err("body failed first")
            })
        }));
        match r {
            Ok(res) => assert_eq!(res, Err("body failed first")),
            Err(p) => {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
                panic!("the body's earlier Err was lost; the scope re-raised a later child panic instead: {msg:?}");
            }
        }
    });
}

/// std::thread::scope idiom: the body joins a panicked child and re-raises
/// its payload (`resume_unwind(e.into_panic())`). std propagates the body's
/// panic (here: the child's original payload). fiber's scope recorded the
/// child's failure first (payload since taken by the join) and then
/// discards the body's panic, raising a generic message instead: the
/// original payload, which the body handed back, is lost.
#[test]
fn scope_body_reraising_a_joined_childs_payload_keeps_it() {
    on_both(|| {
        let msg = panic_message(|| {
            fiber::scope(|s| {
                let h = s.spawn(|| -> u32 { panic!("original child panic") });
                match h.join() {
                    Ok(_) => unreachable!(),
                    Err(e) => std::panic::resume_unwind(e.into_panic()),
                }
            })
        });
        assert_eq!(msg.as_deref(), Some("original child panic"));
    });
}

/// The body joins a panicked child and then panics with its own message
/// (e.g. `.expect("worker failed")`): std propagates the body's panic.
#[test]
fn scope_body_panicking_after_joining_a_panicked_child_keeps_its_message() {
    on_both(|| {
        let msg = panic_message(|| {
            fiber::scope(|s| {
                let h = s.spawn(|| -> u32 { panic!("child") });
                h.join().expect("worker failed")
            });
        });
        let msg = msg.unwrap_or_default();
        assert!(msg.contains("worker failed"), "scope raised: {msg:?}");
    });
}

/// std: a Condvar used with one mutex works however that mutex moves (the
/// same mutex, moved between waits while unborrowed). std (futex) never
/// panics here; fiber's "two mutexes" check compares addresses.
#[test]
fn condvar_with_the_same_mutex_after_it_moved_does_not_panic() {
    let run = || {
        let cv = Condvar::new();
        let m = Mutex::new(0u32);
        let (_g, to) = cv.wait_timeout(m.lock().unwrap(), ms(1)).unwrap();
        assert!(to.timed_out());
        drop(_g);
        let moved = Box::new(m); // the same mutex, now on the heap
        let msg = panic_message(|| {
            let _ = cv.wait_timeout(moved.lock().unwrap(), ms(1));
        });
        assert_eq!(msg, None, "a Condvar used with the same (moved) mutex panicked");
    };
    within(10, run);
    within(10, move || rt1().block_on(run));
}

/// `Job::current().join()` inside the fiber: a clear panic at once.
#[test]
fn joining_ones_own_job_panics_naming_the_misuse() {
    on_both(|| {
        let t = Instant::now();
        let msg = panic_message(|| {
            let _ = Job::current().join();
        });
        assert!(t.elapsed() < ms(500), "the self-join waited {:?}", t.elapsed());
        let msg = msg.expect("joining one's own job panics");
        assert!(msg.contains("wait for itself"), "{msg}");
    });
}

/// A scope body (and a child of it) joining the scope's job: the same.
#[test]
fn joining_an_enclosing_scopes_job_panics_naming_the_misuse() {
    on_both(|| {
        fiber::scope(|s| {
            let msg = panic_message(|| {
                let _ = s.job().join();
            });
            assert!(msg.is_some_and(|m| m.contains("wait for itself")));
            let job = s.job();
            let child = s.spawn(move || {
                panic_message(|| {
                    let _ = job.join();
                })
            });
            let msg = child.join().unwrap();
            assert!(msg.is_some_and(|m| m.contains("wait for itself")));
        });
        // Joining a job that has ended, or another fiber's, is fine.
        let other = fiber::spawn(Job::current).join().unwrap();
        assert!(other.join().is_ok());
    });
}

/// The enclosing job is cancelled explicitly *after* the deadline of a
/// with_timeout whose body ignores cancellation: spec says the result is
/// `Err(TimedOut)` when the deadline passed before `f` returned.
#[test]
fn with_timeout_overrun_then_enclosing_cancel_reports() {
    on_both(|| {
        let r = fiber::scope(|s| {
            let enclosing = s.job();
            let h = s.spawn(move || {
                fiber::with_timeout(ms(20), || {
                    // spin past the deadline with no cancellation point
                    let t = Instant::now();
                    while t.elapsed() < ms(60) {}
                    enclosing.cancel(); // e.g. a sibling cancels the scope now
                    let t = Instant::now();
                    while t.elapsed() < ms(5) {}
                    5
                })
            });
            h.join()
        });
        // The child job was cancelled before it finished: its join may be
        // Cancelled; but if it returns a value, with_timeout must not have
        // returned Ok for an overrun body.
        match r {
            Ok(v) => assert_eq!(
                v,
                Err(fiber::TimedOut),
                "with_timeout returned Ok for a body that overran its deadline"
            ),
            Err(e) => assert!(e.is_cancelled()),
        }
    });
}

/// Same, observed directly in the fiber that called with_timeout
/// (the fiber's own root job is cancelled after the deadline).
#[test]
fn with_timeout_overrun_then_own_job_cancelled_reports_timed_out() {
    on_both(|| {
        // In a fiber of its own: it cancels its own job, so it ends
        // cancelled (a plain channel carries the result out, as a fiber
        // channel's send would see the cancellation).
        let (tx, rx) = std::sync::mpsc::channel();
        let h = fiber::spawn(move || {
            let job = Job::current();
            let r = fiber::with_timeout(ms(20), || {
                let t = Instant::now();
                while t.elapsed() < ms(60) {}
                job.cancel();
                1
            });
            tx.send(r).unwrap();
        });
        assert!(h.join().unwrap_err().is_cancelled());
        assert_eq!(
            rx.recv().unwrap(),
            Err(fiber::TimedOut),
            "deadline passed before f returned"
        );
    });
}

/// A grandchild joining its parent's `ScopedJoinHandle` (the parent waits
/// in an inner scope for that grandchild): the same wait for itself as
/// `Job::join` of the parent's job, refused the same way instead of
/// hanging both.
#[test]
fn a_grandchild_joining_its_parents_scoped_handle_panics_naming_the_misuse() {
    let msg = within(20, || {
        rt2().block_on(|| {
            let mut seen = None;
            fiber::scope(|s| {
                let (tx, rx) = fiber::chan::bounded::<fiber::ScopedJoinHandle<'_, ()>>(1);
                let seen = &mut seen;
                let child = s.spawn(move || {
                    let h = rx.recv().unwrap();
                    fiber::scope(|inner| {
                        inner.spawn(move || {
                            *seen = panic_message(move || {
                                let _ = h.join();
                            });
                        });
                    });
                });
                tx.send(child).unwrap();
            });
            seen
        })
    });
    let msg = msg.expect("the grandchild's join panics");
    assert!(msg.contains("wait for itself") || msg.contains("its own end"), "{msg}");
}

/// `Job::join` of the caller's own job from inside its `fiber::blocking`
/// call: the fiber waits for the call and the call for the fiber's job.
/// Refused naming the misuse, as from the fiber itself, instead of both
/// hanging.
#[test]
fn joining_the_callers_own_job_inside_blocking_panics_naming_the_misuse() {
    let msg = within(20, || {
        rt2().block_on(|| {
            let job = Job::current();
            fiber::blocking(move || {
                panic_message(move || {
                    let _ = job.join();
                })
            })
        })
    });
    let msg = msg.expect("the join inside the blocking call panics");
    assert!(msg.contains("wait for itself"), "{msg}");
    // A job the caller does not run in joins normally from there.
    let state = within(20, || {
        rt2().block_on(|| {
            fiber::scope(|s| {
                let (tx, rx) = fiber::chan::bounded(1);
                let child = s.spawn(move || {
                    tx.send(Job::current()).unwrap();
                    fiber::sleep(ms(20)).unwrap();
                    5
                });
                let job = rx.recv().unwrap();
                let state = fiber::blocking(move || job.join());
                child.join().unwrap();
                state
            })
        })
    });
    assert!(state.is_ok(), "{state:?}");
}

/// std: a scoped join "waits for the associated thread to finish". A
/// sibling's panic cancels the scope, the body with it; the body's join of
/// a child still running must still wait for that child to end (it
/// returned `Cancelled` at once, the child still running). The child,
/// cancelled before it finished, ends cancelled (spec/jobs.md, as Kotlin).
#[test]
fn after_a_joined_panic_the_bodys_join_of_a_running_sibling_waits_for_it() {
    let (got, finished) = within(20, || {
        rt2().block_on(|| {
            let finished = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let (f, f2) = (finished.clone(), finished.clone());
            let got = std::panic::catch_unwind(AssertUnwindSafe(|| {
                fiber::scope(|s| {
                    let (started_tx, started_rx) = fiber::chan::bounded::<()>(1);
                    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
                    let b = s.spawn(move || -> u32 {
                        started_tx.send(()).unwrap();
                        // No cancellation point: a plain blocking wait.
                        go_rx.recv().unwrap();
                        f.store(true, std::sync::atomic::Ordering::SeqCst);
                        7
                    });
                    started_rx.recv().unwrap();
                    let a = s.spawn(|| -> u32 { panic!("A") });
                    assert!(a.join().unwrap_err().is_panic());
                    go_tx.send(()).unwrap();
                    let joined = b.join().map_err(|e| e.is_cancelled());
                    // Read right after the join, before the scope's own
                    // wait for its children.
                    (joined, f2.load(std::sync::atomic::Ordering::SeqCst))
                })
            }))
            .map_err(|_| "the scope panicked");
            match got {
                Ok((joined, finished)) => (Ok(joined), finished),
                Err(e) => (Err(e), false),
            }
        })
    });
    assert!(finished, "the join returned before the child's body did");
    assert_eq!(got, Ok(Err(true)));
}

/// spec/jobs.md: "If every failed child was joined by the body and the
/// body returned, the scope returns the body's value" (std: joined panics
/// are the body's to handle). Two children panic; the body joins both, in
/// either order.
#[test]
fn two_panicked_children_both_joined_leave_the_scope_its_value() {
    for later_first in [false, true] {
        let got = within(20, move || {
            rt2().block_on(move || {
                std::panic::catch_unwind(AssertUnwindSafe(|| {
                    fiber::scope(|s| {
                        let (started_tx, started_rx) = fiber::chan::bounded::<()>(1);
                        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
                        let b = s.spawn(move || -> u32 {
                            started_tx.send(()).unwrap();
                            go_rx.recv().unwrap();
                            panic!("B")
                        });
                        started_rx.recv().unwrap();
                        let (a_started_tx, a_started_rx) = fiber::chan::bounded::<()>(1);
                        let a = s.spawn(move || -> u32 {
                            a_started_tx.send(()).unwrap();
                            panic!("A")
                        });
                        // Both bodies run (neither is cancelled before it
                        // starts): both end in their panic.
                        a_started_rx.recv().unwrap();
                        go_tx.send(()).unwrap();
                        let (x, y) = if later_first {
                            let y = b.join();
                            (a.join(), y)
                        } else {
                            let x = a.join();
                            (x, b.join())
                        };
                        (x.unwrap_err().is_panic(), y.unwrap_err().is_panic())
                    })
                }))
                .map_err(|_| "the scope panicked")
            })
        });
        assert_eq!(got, Ok((true, true)), "later_first = {later_first}");
    }
}

/// `JoinHandle::join` of the caller's own handle inside its
/// `fiber::blocking` call: refused naming the misuse, as from the fiber
/// itself, instead of both waiting for ever.
#[test]
fn joining_ones_own_handle_inside_blocking_panics_naming_the_misuse() {
    let msg = within(20, || {
        rt2().block_on(|| {
            let (handle_tx, handle_rx) = fiber::chan::bounded::<fiber::JoinHandle<()>>(1);
            let (msg_tx, msg_rx) = fiber::chan::bounded::<Option<String>>(1);
            let h = fiber::spawn(move || {
                let me = handle_rx.recv().unwrap();
                let msg = fiber::blocking(move || {
                    panic_message(move || {
                        let _ = me.join();
                    })
                });
                msg_tx.send(msg).unwrap();
            });
            handle_tx.send(h).unwrap();
            msg_rx
                .recv_timeout(Duration::from_secs(10))
                .expect("the join inside the blocking call hung")
        })
    });
    let msg = msg.expect("the join panics");
    assert!(msg.contains("wait for itself"), "{msg}");
}
