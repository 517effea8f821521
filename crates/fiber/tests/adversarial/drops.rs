//! Adversarial: destructors that panic or block, on values sent through
//! channels, returned from fibers, held in fiber-locals, and dropped at
//! runtime shutdown. A panicking destructor is an ordinary panic (it reaches
//! whoever joins the fiber that ran it) unless it runs during an unwind;
//! it never kills a worker, aborts the process outside an unwind, or hangs.
//! Scenarios that could abort run in a child process.

use fiber::chan;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{in_child, ms, within};

fn rt() -> fiber::Runtime {
    fiber::Runtime::builder()
        .workers(2)
        .shutdown_timeout(ms(300))
        .build()
        .unwrap()
}

struct PanicOnDrop(&'static str);
impl Drop for PanicOnDrop {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            panic!("{}", self.0);
        }
    }
}

struct Counted(Arc<AtomicUsize>);
impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn payload_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

/// The runtime still runs fibers on every worker after the scenario.
fn runtime_still_works() {
    let handles: Vec<_> = (0..64u64).map(|i| fiber::spawn(move || i)).collect();
    assert_eq!(handles.into_iter().map(|h| h.join().unwrap()).sum::<u64>(), 2016);
}

#[test]
fn a_panicking_value_left_in_a_channel_panics_in_the_fiber_that_drops_it() {
    // The last receiver's drop discards the buffered values (crossbeam's
    // unbounded flavour does the same), in the dropping thread: a panic
    // there is that thread's panic, and here reaches the joiner.
    within(20, || {
        rt().block_on(|| {
            for (tx, rx) in [chan::unbounded(), chan::bounded(2)] {
                tx.send(PanicOnDrop("message dropped")).unwrap();
                let h = fiber::spawn(move || drop(rx));
                let err = h.join().expect_err("the drop's panic reaches the joiner");
                assert!(err.is_panic());
                assert_eq!(payload_text(&*err.into_panic()), "message dropped");
                let back = tx.send(PanicOnDrop("never sent")).expect_err("no receiver left");
                std::mem::forget(back);
            }
            runtime_still_works();
        })
    })
}

#[test]
fn a_fiber_local_whose_drop_panics_is_swallowed_and_spares_the_worker() {
    fiber::fiber_local! {
        static BOMB: std::cell::RefCell<Option<PanicOnDrop>> = std::cell::RefCell::new(None);
    }
    in_child(
        "a_fiber_local_whose_drop_panics_is_swallowed_and_spares_the_worker",
        30,
        || {
            rt().block_on(|| {
                for _ in 0..4 {
                    let h = fiber::spawn(|| {
                        BOMB.with(|b| *b.borrow_mut() = Some(PanicOnDrop("fiber-local dropped")));
                        5
                    });
                    // The join reports the body's outcome; the local's
                    // panic goes to the hook only (spec/facade.md), and the
                    // worker lives on.
                    assert_eq!(h.join().expect("the body returned 5"), 5);
                }
                runtime_still_works();
            })
        },
    );
}

#[test]
fn a_fiber_local_whose_drop_parks_runs_inside_the_fiber() {
    struct SleepsOnDrop(chan::Sender<&'static str>);
    impl Drop for SleepsOnDrop {
        fn drop(&mut self) {
            // A park inside a fiber-local's destructor: must park the fiber
            // (or return at once), not panic "outside a fiber" on a worker.
            let slept = fiber::sleep(ms(5)).is_ok();
            let _ = self.0.send(if slept { "slept" } else { "cancelled" });
        }
    }
    fiber::fiber_local! {
        static SLOT: std::cell::RefCell<Option<SleepsOnDrop>> = std::cell::RefCell::new(None);
    }
    in_child("a_fiber_local_whose_drop_parks_runs_inside_the_fiber", 30, || {
        rt().block_on(|| {
            let (tx, rx) = chan::unbounded();
            let h = fiber::spawn(move || SLOT.with(|s| *s.borrow_mut() = Some(SleepsOnDrop(tx))));
            let _ = h.join();
            assert_eq!(rx.recv_timeout(Duration::from_secs(10)), Ok("slept"));
            runtime_still_works();
        })
    });
}

#[test]
fn a_fiber_local_touched_by_another_locals_destructor_does_not_hang() {
    fiber::fiber_local! {
        static A: std::cell::Cell<u32> = std::cell::Cell::new(1);
    }
    struct ReadsA(Arc<AtomicUsize>);
    impl Drop for ReadsA {
        fn drop(&mut self) {
            // std: accessing a TLS key during destruction may panic or
            // re-initialise; either is fine, a hang or UB is not.
            let v = std::panic::catch_unwind(|| A.with(|a| a.get())).unwrap_or(99);
            self.0.store(v as usize, Ordering::SeqCst);
        }
    }
    fiber::fiber_local! {
        static B: std::cell::RefCell<Option<ReadsA>> = std::cell::RefCell::new(None);
    }
    in_child(
        "a_fiber_local_touched_by_another_locals_destructor_does_not_hang",
        30,
        || {
            let seen = Arc::new(AtomicUsize::new(0));
            let s = seen.clone();
            rt().block_on(move || {
                let h = fiber::spawn(move || {
                    A.with(|a| a.set(7));
                    B.with(|b| *b.borrow_mut() = Some(ReadsA(s)));
                });
                let _ = h.join();
                runtime_still_works();
            });
            assert_ne!(seen.load(Ordering::SeqCst), 0, "the destructor ran");
        },
    );
}

#[test]
fn a_detached_fiber_returning_a_panicking_value_does_not_abort_or_kill_a_worker() {
    in_child(
        "a_detached_fiber_returning_a_panicking_value_does_not_abort_or_kill_a_worker",
        30,
        || {
            rt().block_on(|| {
                for _ in 0..8 {
                    drop(fiber::spawn(|| PanicOnDrop("detached result dropped")));
                }
                fiber::sleep(ms(20)).unwrap();
                runtime_still_works();
            })
        },
    );
}

#[test]
fn dropping_a_join_handle_of_a_finished_fiber_with_a_panicking_value_does_not_abort() {
    in_child(
        "dropping_a_join_handle_of_a_finished_fiber_with_a_panicking_value_does_not_abort",
        30,
        || {
            rt().block_on(|| {
                let h = fiber::spawn(|| PanicOnDrop("unjoined result dropped"));
                while !h.is_finished() {
                    fiber::sleep(ms(1)).unwrap();
                }
                // std's Packet aborts here; a panic in the dropping fiber
                // (reaching its joiner) or a silent drop are both fine.
                let dropper = fiber::spawn(move || drop(h));
                let _ = dropper.join();
                runtime_still_works();
            })
        },
    );
}

#[test]
fn at_shutdown_fiber_locals_and_stack_values_of_parked_fibers_drop_once() {
    fiber::fiber_local! {
        static HELD: std::cell::RefCell<Option<Counted>> = std::cell::RefCell::new(None);
    }
    let drops = Arc::new(AtomicUsize::new(0));
    within(30, {
        let drops = drops.clone();
        move || {
            let rt = rt();
            let (_tx, rx) = chan::bounded::<u8>(0);
            let d = drops.clone();
            rt.block_on(move || {
                for i in 0..8 {
                    let (rx, d) = (rx.clone(), d.clone());
                    fiber::spawn(move || {
                        let _on_stack = Counted(d.clone());
                        HELD.with(|h| *h.borrow_mut() = Some(Counted(d)));
                        if i % 2 == 0 {
                            let _ = rx.recv();
                        } else {
                            let _ = fiber::sleep(Duration::MAX);
                        }
                    });
                }
                fiber::sleep(ms(10)).unwrap();
            });
            drop(rt);
        }
    });
    assert_eq!(
        drops.load(Ordering::SeqCst),
        16,
        "each stack value and each fiber-local dropped once"
    );
}

#[test]
fn at_shutdown_a_fiber_locals_panicking_drop_after_a_cancelled_wait_does_not_abort() {
    fiber::fiber_local! {
        static BOMB: std::cell::RefCell<Option<PanicOnDrop>> = std::cell::RefCell::new(None);
    }
    in_child(
        "at_shutdown_a_fiber_locals_panicking_drop_after_a_cancelled_wait_does_not_abort",
        30,
        || {
            let rt = rt();
            rt.block_on(|| {
                for _ in 0..4 {
                    fiber::spawn(|| {
                        BOMB.with(|b| *b.borrow_mut() = Some(PanicOnDrop("local at shutdown")));
                        // Returns normally when cancelled: the local's drop
                        // runs outside any unwind, an ordinary panic.
                        let _ = fiber::sleep(Duration::MAX);
                    });
                }
                fiber::sleep(ms(10)).unwrap();
            });
            drop(rt);
        },
    );
}

#[test]
fn at_shutdown_destructors_that_block_do_not_hold_shutdown_forever() {
    // Destructors that block: one waits on a channel nobody sends to, one
    // sleeps, one blocks its thread for a while (std sleep). Shutdown ends.
    struct Blocks(chan::Receiver<u8>);
    impl Drop for Blocks {
        fn drop(&mut self) {
            let _ = self.0.recv();
            let _ = fiber::sleep(Duration::from_secs(3600));
            std::thread::sleep(ms(50));
        }
    }
    let drops = Arc::new(AtomicUsize::new(0));
    let d = drops.clone();
    within(30, move || {
        let rt = rt();
        let (_keep, rx) = chan::bounded::<u8>(0);
        rt.block_on(move || {
            for _ in 0..4 {
                let rx = rx.clone();
                let d = d.clone();
                fiber::spawn(move || {
                    let _c = Counted(d);
                    let _b = Blocks(rx.clone());
                    let _ = rx.recv();
                });
            }
            fiber::sleep(ms(10)).unwrap();
        });
        drop(rt);
    });
    assert_eq!(drops.load(Ordering::SeqCst), 4);
}

#[test]
fn a_panicking_value_in_a_channel_owned_by_parked_fibers_at_shutdown_does_not_abort() {
    in_child(
        "a_panicking_value_in_a_channel_owned_by_parked_fibers_at_shutdown_does_not_abort",
        30,
        || {
            let rt = rt();
            rt.block_on(|| {
                let (tx, rx) = chan::bounded(4);
                tx.send(PanicOnDrop("buffered at shutdown")).unwrap();
                let (tx2, rx2) = (tx.clone(), rx.clone());
                fiber::spawn(move || {
                    let _hold = (tx2, rx2);
                    let _ = fiber::sleep(Duration::MAX);
                });
                fiber::spawn(move || {
                    let _hold = (tx, rx);
                    let _ = fiber::sleep(Duration::MAX);
                });
                fiber::sleep(ms(10)).unwrap();
            });
            drop(rt);
        },
    );
}

#[test]
fn a_panicking_value_returned_by_the_root_fiber_and_dropped_by_the_caller_is_a_plain_panic() {
    within(20, || {
        let rt = rt();
        let v = rt.block_on(|| PanicOnDrop("root value"));
        let r = std::panic::catch_unwind(AssertUnwindSafe(move || drop(v)));
        assert_eq!(payload_text(&*r.unwrap_err()), "root value");
        // The runtime is unharmed.
        assert_eq!(rt.block_on(|| fiber::spawn(|| 1).join().unwrap()), 1);
    })
}

#[test]
fn with_timeout_drops_a_late_panicking_result_as_an_ordinary_panic() {
    // "Whatever f returned is dropped" on a timeout: if that drop panics,
    // the panic is the caller's (no abort, no lost worker).
    within(20, || {
        rt().block_on(|| {
            let h = fiber::spawn(|| {
                fiber::with_timeout(ms(5), || {
                    let start = Instant::now();
                    while start.elapsed() < ms(30) {
                        std::hint::spin_loop();
                    }
                    PanicOnDrop("timed-out result")
                })
                .is_err()
            });
            match h.join() {
                Ok(timed_out) => assert!(timed_out),
                Err(e) => assert_eq!(payload_text(&*e.into_panic()), "timed-out result"),
            }
            runtime_still_works();
        })
    })
}

#[test]
fn a_panicking_fiber_local_initialiser_leaves_the_key_usable() {
    // std thread_local!: a panicking initialiser propagates its panic; the
    // key is not poisoned into UB, a later access initialises again.
    static INITS: AtomicUsize = AtomicUsize::new(0);
    fiber::fiber_local! {
        static FLAKY: u32 = {
            if INITS.fetch_add(1, Ordering::SeqCst) == 0 {
                panic!("first init fails");
            }
            7
        };
    }
    within(20, || {
        rt().block_on(|| {
            let h = fiber::spawn(|| {
                let first = std::panic::catch_unwind(|| FLAKY.with(|v| *v));
                assert!(first.is_err(), "the first initialiser panicked");
                FLAKY.with(|v| *v)
            });
            assert_eq!(h.join().unwrap(), 7);
            runtime_still_works();
        })
    })
}

#[test]
fn a_fiber_local_initialiser_that_parks_and_migrates_keeps_one_value() {
    fiber::fiber_local! {
        static SLOW: u64 = {
            fiber::sleep(Duration::from_millis(2)).unwrap();
            fiber::current().id().0
        };
    }
    within(20, || {
        rt().block_on(|| {
            let hs: Vec<_> = (0..16)
                .map(|_| {
                    fiber::spawn(|| {
                        let a = SLOW.with(|v| *v);
                        fiber::yield_now().unwrap();
                        let b = SLOW.with(|v| *v);
                        (a, b, fiber::current().id().0)
                    })
                })
                .collect();
            for h in hs {
                let (a, b, me) = h.join().unwrap();
                assert_eq!((a, b), (me, me), "each fiber keeps its own value across a park");
            }
        })
    })
}
