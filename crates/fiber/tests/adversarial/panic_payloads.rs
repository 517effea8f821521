//! Adversarial: panic payloads whose own destructor panics. A second
//! payload was dropped unprotected: from a fiber-local destructor it
//! unwound into the worker thread (the worker died, the joiner saw
//! "cancelled"); in a channel drain it replaced the first panic and the
//! values after it were dropped during an unwind (an abort).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::common::{in_child, ms, within};

fn rt2() -> fiber::Runtime {
    fiber::Runtime::builder()
        .workers(2)
        .shutdown_timeout(ms(300))
        .build()
        .unwrap()
}

static PAYLOAD_DROPS: AtomicUsize = AtomicUsize::new(0);

/// A panic payload whose destructor panics (once).
struct BadPayload;
impl Drop for BadPayload {
    fn drop(&mut self) {
        PAYLOAD_DROPS.fetch_add(1, Ordering::SeqCst);
        if !std::thread::panicking() {
            panic!("payload destructor");
        }
    }
}

/// A value whose destructor panics with a BadPayload.
struct PanicsWithBadPayload;
impl Drop for PanicsWithBadPayload {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            std::panic::panic_any(BadPayload);
        }
    }
}

fn runtime_still_works() {
    let hs: Vec<_> = (0..32u64).map(|i| fiber::spawn(move || i)).collect();
    assert_eq!(hs.into_iter().map(|h| h.join().unwrap()).sum::<u64>(), 496);
}

// A detached fiber that panics with a BadPayload: fiber drops it quietly.
#[test]
fn detached_fiber_panicking_with_a_bad_payload() {
    in_child("detached_fiber_panicking_with_a_bad_payload", 30, || {
        within(20, || {
            rt2().block_on(|| {
                drop(fiber::spawn(|| std::panic::panic_any(BadPayload)));
                fiber::sleep(ms(50)).unwrap();
                runtime_still_works();
            })
        })
    })
}

// A fiber-local whose destructor panics with a BadPayload: the fiber's end
// drops the caught payload with `let _ = catch_unwind(..)`.
#[test]
fn fiber_local_destructor_panicking_with_a_bad_payload() {
    fiber::fiber_local! {
        static L: std::cell::RefCell<Option<PanicsWithBadPayload>> = std::cell::RefCell::new(None);
    }
    in_child("fiber_local_destructor_panicking_with_a_bad_payload", 30, || {
        within(20, || {
            rt2().block_on(|| {
                let h = fiber::spawn(|| {
                    L.with(|l| *l.borrow_mut() = Some(PanicsWithBadPayload));
                    3
                });
                let r = h.join();
                eprintln!("join: {:?}", r.as_ref().map_err(|e| e.to_string()));
                fiber::sleep(ms(50)).unwrap();
                let st = fiber::stats().runtime;
                eprintln!("after: fibers_alive {} workers {}", st.fibers_alive, st.workers);
                // The fiber returned 3 and was never cancelled: Ok(3), or the
                // destructor's panic, as for any fiber-local panic.
                assert!(
                    matches!(r, Ok(3)) || r.as_ref().unwrap_err().is_panic(),
                    "a fiber that was never cancelled is reported as {:?}",
                    r.map_err(|e| e.to_string())
                );
                assert_eq!(st.fibers_alive, 1, "the fiber must be gone (only the root is alive)");
                runtime_still_works();
            })
        })
    })
}

// Same for a scoped child's fiber-local.
#[test]
fn scoped_child_fiber_local_destructor_panicking_with_a_bad_payload() {
    fiber::fiber_local! {
        static L: std::cell::RefCell<Option<PanicsWithBadPayload>> = std::cell::RefCell::new(None);
    }
    in_child(
        "scoped_child_fiber_local_destructor_panicking_with_a_bad_payload",
        30,
        || {
            within(20, || {
                rt2().block_on(|| {
                    let r = fiber::scope(|s| {
                        s.spawn(|| {
                            L.with(|l| *l.borrow_mut() = Some(PanicsWithBadPayload));
                            3
                        })
                        .join()
                        .map_err(|e| e.to_string())
                    });
                    eprintln!("join: {r:?}");
                    assert!(
                        matches!(r, Ok(3)) || r.as_ref().is_err_and(|e| e.contains("panicked")),
                        "a scoped child that was never cancelled is reported as {r:?}"
                    );
                    runtime_still_works();
                })
            })
        },
    )
}

// Two values in a channel whose destructors panic with BadPayloads: the
// last receiver's drop keeps the first payload and drops the second.
#[test]
fn channel_values_panicking_with_bad_payloads() {
    in_child("channel_values_panicking_with_bad_payloads", 30, || {
        within(20, || {
            rt2().block_on(|| {
                let (tx, rx) = fiber::chan::unbounded();
                tx.send(PanicsWithBadPayload).unwrap();
                tx.send(PanicsWithBadPayload).unwrap();
                let h = fiber::spawn(move || drop(rx));
                let r = h.join();
                let e = r.expect_err("the first drop panic is resumed");
                let p = e.into_panic();
                assert!(p.is::<BadPayload>(), "the first payload is re-raised");
                std::mem::forget(p);
                runtime_still_works();
            })
        })
    })
}

// A scope with two children panicking with BadPayloads.
#[test]
fn scope_children_panicking_with_bad_payloads() {
    in_child("scope_children_panicking_with_bad_payloads", 30, || {
        within(20, || {
            rt2().block_on(|| {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    fiber::scope(|s| {
                        s.spawn(|| std::panic::panic_any(BadPayload));
                        s.spawn(|| std::panic::panic_any(BadPayload));
                    })
                }));
                let p = r.expect_err("scope re-raises");
                std::mem::forget(p);
                runtime_still_works();
            })
        })
    })
}

// A fiber cancelled before start whose capture panics with a BadPayload,
// handle dropped.
#[test]
fn detached_cancelled_before_start_capture_panicking_with_a_bad_payload() {
    in_child(
        "detached_cancelled_before_start_capture_panicking_with_a_bad_payload",
        30,
        || {
            within(20, || {
                fiber::Runtime::builder()
                    .workers(1)
                    .max_workers(1)
                    .build()
                    .unwrap()
                    .block_on(|| {
                        let c = PanicsWithBadPayload;
                        let h = fiber::spawn(move || {
                            let _c = &c;
                        });
                        h.cancel();
                        drop(h);
                        fiber::sleep(ms(30)).unwrap();
                        runtime_still_works();
                    })
            })
        },
    )
}

#[allow(dead_code)]
fn unused(_: Arc<()>) {}

// The same on a runtime of one fixed worker, many times: the escaping panic
// must not kill the worker nor strand fibers.
#[test]
fn fiber_local_bad_payload_on_one_fixed_worker() {
    fiber::fiber_local! {
        static L: std::cell::RefCell<Option<PanicsWithBadPayload>> = std::cell::RefCell::new(None);
    }
    in_child("fiber_local_bad_payload_on_one_fixed_worker", 30, || {
        within(20, || {
            let rt = fiber::Runtime::builder()
                .workers(1)
                .max_workers(1)
                .shutdown_timeout(ms(300))
                .build()
                .unwrap();
            rt.block_on(|| {
                for i in 0..3 {
                    let h = fiber::spawn(|| {
                        L.with(|l| *l.borrow_mut() = Some(PanicsWithBadPayload));
                        3
                    });
                    let r = h.join();
                    eprintln!("round {i} join: {:?}", r.as_ref().map_err(|e| e.to_string()));
                    assert!(
                        matches!(r, Ok(3)) || r.as_ref().unwrap_err().is_panic(),
                        "fiber misreported: {:?}",
                        r.map_err(|e| e.to_string())
                    );
                }
                runtime_still_works();
                eprintln!("{}", fiber::stats());
            });
            eprintln!("runtime dropped");
        })
    })
}

/// A value whose destructor always panics (no `panicking()` check).
struct AlwaysPanics;
impl Drop for AlwaysPanics {
    fn drop(&mut self) {
        panic!("always panics");
    }
}

// Three buffered values: two panic with BadPayloads, the third always
// panics. spec/chan.md: "one by one inside catch_unwind (the first panic
// is resumed at the end)": every value's drop is caught, so no abort.
#[test]
fn channel_values_after_a_bad_payload_are_not_dropped_during_an_unwind() {
    in_child(
        "channel_values_after_a_bad_payload_are_not_dropped_during_an_unwind",
        30,
        || {
            within(20, || {
                rt2().block_on(|| {
                    let (tx, rx) = fiber::chan::unbounded::<Box<dyn Send>>();
                    tx.send(Box::new(PanicsWithBadPayload)).unwrap();
                    tx.send(Box::new(PanicsWithBadPayload)).unwrap();
                    tx.send(Box::new(AlwaysPanics)).unwrap();
                    let h = fiber::spawn(move || drop(rx));
                    let e = h.join().expect_err("a drop panic is resumed");
                    std::mem::forget(e);
                    runtime_still_works();
                })
            })
        },
    )
}
