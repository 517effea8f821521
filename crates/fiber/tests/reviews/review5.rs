//! Adversarial review 5: destructors (panicking and blocking) in the places
//! where the runtime drops user values on the user's behalf, the blocking
//! facade used from plain threads (also in a process where no runtime was
//! ever built), and runtimes nested in or talking to other runtimes.
//!
//! Expected semantics are std's and crossbeam's: each value is dropped
//! exactly once, a panicking destructor does not corrupt the runtime, a
//! destructor may wait for other fibers, nothing hangs.

#![allow(clippy::type_complexity)]
use fiber::chan;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use crate::common::{in_child, ms, panic_message, rt, rt1, rt_fixed_grace, wait_parked, within};

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// A value that counts its drops and, if asked, panics in its destructor
/// (only when not already unwinding, as a careful destructor would).
struct Tracked {
    id: usize,
    drops: Arc<AtomicUsize>,
    panic: bool,
}

impl Tracked {
    fn new(id: usize, drops: &Arc<AtomicUsize>, panic: bool) -> Tracked {
        Tracked {
            id,
            drops: drops.clone(),
            panic,
        }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.drops.fetch_add(1, SeqCst);
        if self.panic && !std::thread::panicking() {
            panic!("tracked {} panicked in drop", self.id);
        }
    }
}

/// A value whose destructor waits for a message on a fiber channel (fed by
/// someone else) before it counts itself dropped.
struct WaitsInDrop {
    rx: chan::Receiver<u32>,
    done: Arc<AtomicUsize>,
}

impl Drop for WaitsInDrop {
    fn drop(&mut self) {
        let got = self.rx.recv().expect("the feeder sends before it leaves");
        assert_eq!(got, 7);
        self.done.fetch_add(1, SeqCst);
    }
}

/// A runtime check: a fiber can still be spawned and joined.
fn still_works(rt: &fiber::Runtime) {
    assert_eq!(rt.spawn(|| 40 + 2).join().unwrap(), 42);
}

type Chan<T> = (chan::Sender<T>, chan::Receiver<T>);

fn kinds<T>() -> Vec<(&'static str, fn() -> Chan<T>)> {
    vec![
        ("unbounded", chan::unbounded::<T> as fn() -> Chan<T>),
        ("bounded(16)", || chan::bounded::<T>(16)),
        ("bounded(1000)", || chan::bounded::<T>(1000)),
    ]
}

// ---------------------------------------------------------------------------
// 1. Destructors the runtime runs on the user's behalf
// ---------------------------------------------------------------------------

/// crossbeam (and fiber's spec/chan.md): the last receiver leaving drops the
/// buffered values; fiber drops every value once and re-raises the first
/// panic. Here on a plain thread, with several panicking values; afterwards
/// the channel still behaves (a send fails and gives its value back).
#[test]
fn buffered_panicking_values_dropped_by_a_plain_thread_each_once_first_panic_raised() {
    within(30, || {
        for (name, make) in kinds::<Tracked>() {
            let drops = Arc::new(AtomicUsize::new(0));
            let (tx, rx) = make();
            for i in 0..6 {
                tx.send(Tracked::new(i, &drops, i == 1 || i == 3 || i == 4)).unwrap();
            }
            let msg = panic_message(move || drop(rx)).unwrap_or_else(|| panic!("{name}: the first panic is re-raised"));
            assert!(msg.contains("tracked 1"), "{name}: the first panic wins: {msg}");
            assert_eq!(drops.load(SeqCst), 6, "{name}: every buffered value dropped once");
            let back = tx.send(Tracked::new(9, &drops, false)).unwrap_err().into_inner();
            assert_eq!(back.id, 9, "{name}: a send after the disconnect gives its value back");
            drop(back);
            assert_eq!(drops.load(SeqCst), 7, "{name}");
        }
    })
}

/// The same drop inside a fiber on a single worker: the panic reaches the
/// fiber's joiner and the worker survives.
#[test]
fn buffered_panicking_values_dropped_by_a_fiber_reach_its_joiner_and_spare_the_worker() {
    within(30, || {
        let rt = rt1();
        for (name, make) in kinds::<Tracked>() {
            let drops = Arc::new(AtomicUsize::new(0));
            let (tx, rx) = make();
            for i in 0..6 {
                tx.send(Tracked::new(i, &drops, i % 2 == 0)).unwrap();
            }
            let err = rt.spawn(move || drop(rx)).join().unwrap_err();
            assert!(err.is_panic(), "{name}: {err}");
            assert_eq!(drops.load(SeqCst), 6, "{name}");
            assert!(tx.send(Tracked::new(9, &drops, false)).is_err(), "{name}");
            still_works(&rt);
        }
    })
}

/// A channel whose buffer holds its own last `Sender`: dropping the last
/// receiver drops that sender from inside the channel's own disconnect.
/// crossbeam frees the channel once; so must fiber (no double free, no
/// drop skipped, no hang).
#[test]
fn a_channel_that_buffers_its_own_last_sender_is_dropped_once() {
    struct Carrier {
        _tx: Option<chan::Sender<Carrier>>,
        _t: Tracked,
    }
    within(30, || {
        for (name, make) in kinds::<Carrier>() {
            let drops = Arc::new(AtomicUsize::new(0));
            let (tx, rx) = make();
            let tx2 = tx.clone();
            tx2.send(Carrier {
                _tx: Some(tx),
                _t: Tracked::new(0, &drops, false),
            })
            .unwrap();
            tx2.send(Carrier {
                _tx: None,
                _t: Tracked::new(1, &drops, false),
            })
            .unwrap();
            drop(tx2); // the only sender left is inside the buffer
            assert!(
                rx.recv_timeout(ms(1)).is_ok(),
                "{name}: the first carrier (and the sender) come out"
            );
            // That dropped the last sender: the channel is closed, one
            // value remains and then the end.
            assert!(rx.recv().is_ok(), "{name}");
            assert!(rx.recv().is_err(), "{name}: closed once its last sender left");
            assert_eq!(drops.load(SeqCst), 2, "{name}");

            // Now let the last receiver drop it in place, in a fiber.
            let drops = Arc::new(AtomicUsize::new(0));
            let (tx, rx) = make();
            let tx2 = tx.clone();
            for i in 0..3 {
                tx2.send(Carrier {
                    _tx: None,
                    _t: Tracked::new(i, &drops, false),
                })
                .unwrap();
            }
            tx2.send(Carrier {
                _tx: Some(tx),
                _t: Tracked::new(3, &drops, false),
            })
            .unwrap();
            drop(tx2);
            let d = drops.clone();
            rt1().block_on(move || {
                drop(rx);
                assert_eq!(d.load(SeqCst), 4);
            });
            assert_eq!(drops.load(SeqCst), 4, "{name}: each carrier dropped once");
        }
    })
}

/// A buffered value's destructor that sends on its own channel after the
/// last receiver left gets the value back in the error, and that value is
/// dropped too (once).
#[test]
fn a_buffered_values_drop_that_sends_on_its_own_disconnected_channel() {
    struct Resend {
        tx: Option<chan::Sender<Resend>>,
        drops: Arc<AtomicUsize>,
    }
    impl Drop for Resend {
        fn drop(&mut self) {
            self.drops.fetch_add(1, SeqCst);
            if let Some(tx) = self.tx.take() {
                let err = tx
                    .send(Resend {
                        tx: None,
                        drops: self.drops.clone(),
                    })
                    .expect_err("no receiver is left");
                drop(err);
            }
        }
    }
    within(30, || {
        for (name, make) in kinds::<Resend>() {
            let drops = Arc::new(AtomicUsize::new(0));
            let (tx, rx) = make();
            for _ in 0..4 {
                tx.send(Resend {
                    tx: Some(tx.clone()),
                    drops: drops.clone(),
                })
                .unwrap();
            }
            drop(tx);
            let d = drops.clone();
            rt1().block_on(move || drop(rx));
            assert_eq!(d.load(SeqCst), 8, "{name}: 4 buffered + 4 given back");
        }
    })
}

/// A buffered value's destructor may wait for other fibers (a channel, a
/// fiber mutex, a sleep, a join): the last receiver's drop runs it in the
/// dropping fiber, which parks; on a single worker the fibers it waits for
/// must still run.
#[test]
fn buffered_values_whose_drops_wait_for_other_fibers_on_one_worker() {
    struct Heavy {
        rx: chan::Receiver<u32>,
        lock: Arc<fiber::sync::Mutex<u32>>,
        join: Option<fiber::JoinHandle<u32>>,
        done: Arc<AtomicUsize>,
    }
    impl Drop for Heavy {
        fn drop(&mut self) {
            assert_eq!(self.rx.recv().unwrap(), 7);
            *self.lock.lock().unwrap() += 1;
            fiber::sleep(ms(1)).unwrap();
            if let Some(j) = self.join.take() {
                assert_eq!(j.join().unwrap(), 5);
            }
            self.done.fetch_add(1, SeqCst);
        }
    }
    within(30, || {
        for (name, make) in kinds::<Heavy>() {
            let done = Arc::new(AtomicUsize::new(0));
            let d = done.clone();
            rt1().block_on(move || {
                let lock = Arc::new(fiber::sync::Mutex::new(0));
                let (feed_tx, feed_rx) = chan::bounded::<u32>(0);
                let (tx, rx) = make();
                for _ in 0..5 {
                    let join = fiber::spawn(|| {
                        fiber::sleep(ms(2)).unwrap();
                        5
                    });
                    tx.send(Heavy {
                        rx: feed_rx.clone(),
                        lock: lock.clone(),
                        join: Some(join),
                        done: d.clone(),
                    })
                    .unwrap();
                }
                // The holder keeps the lock a while; the feeder starts
                // only after the drop below has begun (same worker).
                let l = lock.clone();
                let holder = fiber::spawn(move || {
                    let g = l.lock().unwrap();
                    fiber::sleep(ms(10)).unwrap();
                    drop(g);
                });
                let feeder = fiber::spawn(move || {
                    for _ in 0..5 {
                        feed_tx.send(7).unwrap();
                    }
                });
                drop(rx); // runs the five destructors here
                assert_eq!(d.load(SeqCst), 5, "{name}: every destructor ran to its end");
                assert_eq!(*lock.lock().unwrap(), 5);
                holder.join().unwrap();
                feeder.join().unwrap();
                drop(tx);
            });
            assert_eq!(done.load(SeqCst), 5, "{name}");
        }
    })
}

/// The last receiver dropped by a plain thread: the buffered values'
/// destructors block the thread on a fiber channel that fibers feed.
#[test]
fn buffered_values_whose_drops_wait_for_fibers_dropped_by_a_plain_thread() {
    within(30, || {
        let rt = rt1();
        for (name, make) in kinds::<WaitsInDrop>() {
            let done = Arc::new(AtomicUsize::new(0));
            let (feed_tx, feed_rx) = chan::bounded::<u32>(0);
            let (tx, rx) = make();
            for _ in 0..4 {
                tx.send(WaitsInDrop {
                    rx: feed_rx.clone(),
                    done: done.clone(),
                })
                .unwrap();
            }
            let feeder = rt.spawn(move || {
                for _ in 0..4 {
                    fiber::sleep(ms(2)).unwrap();
                    feed_tx.send(7).unwrap();
                }
            });
            drop(rx);
            assert_eq!(done.load(SeqCst), 4, "{name}");
            feeder.join().unwrap();
            drop(tx);
        }
    })
}

/// std aborts when the result of an unjoined scoped thread panics on drop
/// ("thread result panicked on drop"); fiber documents that a child drops
/// its own unjoined value inside its job. What is required here: the value
/// is dropped once, no abort, no hang, the runtime keeps working, and the
/// scope either returns or re-raises that panic.
#[test]
fn an_unjoined_scoped_childs_value_whose_drop_panics() {
    in_child("an_unjoined_scoped_childs_value_whose_drop_panics", 60, || {
        within(30, || {
            let rt = rt1();
            let drops = Arc::new(AtomicUsize::new(0));
            let d = drops.clone();
            let sibling_ran = Arc::new(AtomicBool::new(false));
            let s2 = sibling_ran.clone();
            let outcome = rt.block_on(move || {
                panic_message(move || {
                    fiber::scope(|s| {
                        let h = s.spawn(move || Tracked::new(0, &d, true));
                        drop(h);
                        s.spawn(move || {
                            if fiber::sleep(ms(5)).is_ok() {
                                s2.store(true, SeqCst);
                            }
                        });
                    })
                })
            });
            assert_eq!(drops.load(SeqCst), 1, "dropped exactly once");
            // fiber makes the destructor's panic the child's failure: the
            // scope cancels the sibling (as for any failed child of a
            // regular scope) and re-raises it (std aborts instead).
            let msg = outcome.expect("the scope re-raises the destructor's panic");
            assert!(msg.contains("tracked 0"), "the scope re-raises the drop's panic: {msg}");
            let _ = sibling_ran.load(SeqCst);
            still_works(&rt);
            // The same with a supervisor scope and with try_scope.
            let drops = Arc::new(AtomicUsize::new(0));
            let d = drops.clone();
            let d2 = drops.clone();
            rt.block_on(move || {
                let _ = panic_message(move || {
                    fiber::supervisor_scope(|s| drop(s.spawn(move || Tracked::new(1, &d, true))));
                });
                let _ = panic_message(move || {
                    let _: Result<(), ()> = fiber::try_scope(|s| {
                        drop(s.spawn(move || Ok::<_, ()>(Tracked::new(2, &d2, true))));
                        Ok(())
                    });
                });
            });
            assert_eq!(drops.load(SeqCst), 2);
            still_works(&rt);
        })
    });
}

/// An unjoined scoped child's value whose destructor waits for a sibling:
/// the scope returns only after that destructor finished (std's scope
/// returns after every thread, and so every result, is gone).
#[test]
fn an_unjoined_scoped_childs_value_whose_drop_waits_for_a_sibling() {
    within(30, || {
        let rt = rt1();
        let done = Arc::new(AtomicUsize::new(0));
        let d = done.clone();
        rt.block_on(move || {
            let (feed_tx, feed_rx) = chan::bounded::<u32>(0);
            fiber::scope(|s| {
                let d = d.clone();
                drop(s.spawn(move || WaitsInDrop { rx: feed_rx, done: d }));
                s.spawn(move || {
                    fiber::sleep(ms(20)).unwrap();
                    feed_tx.send(7).unwrap();
                });
            });
            assert_eq!(
                d.load(SeqCst),
                1,
                "the scope returned before the child's value was dropped"
            );
        });
        assert_eq!(done.load(SeqCst), 1);
    })
}

/// A detached fiber's value whose destructor waits (sleep, channel, join):
/// it runs inside the fiber to its end, for a handle dropped before the
/// fiber ends; and for a handle dropped after the end, in the fiber or on
/// the plain thread that drops it.
#[test]
fn detached_and_late_dropped_values_whose_drops_wait() {
    within(30, || {
        let rt = rt1();
        // Dropped before the end: the fiber drops its own value.
        let done = Arc::new(AtomicUsize::new(0));
        let (feed_tx, feed_rx) = chan::bounded::<u32>(0);
        let d = done.clone();
        let h = rt.spawn(move || {
            fiber::sleep(ms(5)).unwrap();
            WaitsInDrop { rx: feed_rx, done: d }
        });
        drop(h);
        rt.spawn(move || {
            fiber::sleep(ms(20)).unwrap();
            feed_tx.send(7).unwrap();
        })
        .join()
        .unwrap();
        let start = Instant::now();
        while done.load(SeqCst) == 0 {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the detached value was never dropped"
            );
            std::thread::sleep(ms(2));
        }

        // Dropped after the end, inside another fiber on the same worker.
        let done = Arc::new(AtomicUsize::new(0));
        let d = done.clone();
        rt.block_on(move || {
            let (feed_tx, feed_rx) = chan::bounded::<u32>(0);
            let d2 = d.clone();
            let h = fiber::spawn(move || WaitsInDrop { rx: feed_rx, done: d2 });
            while !h.is_finished() {
                fiber::yield_now().unwrap();
            }
            let feeder = fiber::spawn(move || feed_tx.send(7).unwrap());
            drop(h); // parks in the value's destructor until the feeder runs
            assert_eq!(d.load(SeqCst), 1);
            feeder.join().unwrap();
        });

        // Dropped after the end by a plain thread.
        let done = Arc::new(AtomicUsize::new(0));
        let (feed_tx, feed_rx) = chan::bounded::<u32>(0);
        let d = done.clone();
        let h = rt.spawn(move || WaitsInDrop { rx: feed_rx, done: d });
        while !h.is_finished() {
            std::thread::sleep(ms(1));
        }
        let feeder = rt.spawn(move || {
            fiber::sleep(ms(10)).unwrap();
            feed_tx.send(7).unwrap();
        });
        drop(h);
        assert_eq!(done.load(SeqCst), 1);
        feeder.join().unwrap();
    })
}

/// `with_timeout` whose body returns after its deadline: the late value is
/// dropped once, and a destructor that needs to wait (non-cancellably) is
/// run to its end before `with_timeout` returns.
#[test]
fn with_timeouts_late_value_whose_drop_waits_non_cancellably() {
    struct SlowDrop(Arc<AtomicUsize>);
    impl Drop for SlowDrop {
        fn drop(&mut self) {
            fiber::non_cancellable(|| fiber::sleep(ms(20)).unwrap());
            self.0.fetch_add(1, SeqCst);
        }
    }
    within(30, || {
        let done = Arc::new(AtomicUsize::new(0));
        let d = done.clone();
        rt1().block_on(move || {
            let d2 = d.clone();
            let r = fiber::with_timeout(ms(10), move || {
                fiber::non_cancellable(|| fiber::sleep(ms(40)).unwrap());
                SlowDrop(d2)
            });
            assert!(r.is_err(), "the body returned after its deadline");
            assert_eq!(
                d.load(SeqCst),
                1,
                "the late value was dropped (once) before with_timeout returned"
            );
        });
        assert_eq!(done.load(SeqCst), 1);
    })
}

/// A spawn refused because the runtime is gone drops the closure once, on
/// the caller, like `std::thread::Builder::spawn` failing; a capture whose
/// destructor panics makes that panic reach the caller (or is contained),
/// never an abort or a double drop. `Handle::spawn` (the panicking form)
/// must not turn it into a panic during a panic.
#[test]
fn a_refused_spawn_drops_a_closure_with_a_panicking_capture_once() {
    in_child(
        "a_refused_spawn_drops_a_closure_with_a_panicking_capture_once",
        60,
        || {
            within(30, || {
                let rt = rt();
                let handle = rt.handle();
                drop(rt);
                let drops = Arc::new(AtomicUsize::new(0));
                let t = Tracked::new(0, &drops, true);
                let r = panic_message(|| {
                    let res = handle.try_spawn(move || drop(t));
                    assert!(res.is_err(), "a dropped runtime refuses the spawn");
                });
                assert_eq!(drops.load(SeqCst), 1, "the refused closure is dropped once");
                if let Some(msg) = r {
                    assert!(msg.contains("tracked 0"), "{msg}");
                }
                let t = Tracked::new(1, &drops, true);
                let msg = panic_message(|| drop(handle.spawn(move || drop(t)))).expect("Handle::spawn panics");
                assert!(msg.contains("tracked 1") || msg.contains("shut"), "{msg}");
                assert_eq!(drops.load(SeqCst), 2);
            })
        },
    );
}

/// A fiber-local holding the last receiver of a channel full of panicking
/// values: the fiber-local destructor re-raises the first panic; the other
/// fiber-locals are still dropped, the joiner sees a panic, the worker goes
/// on.
#[test]
fn a_fiber_local_holding_the_last_receiver_of_panicking_values() {
    fiber::fiber_local! {
        static HOLD: std::cell::RefCell<Option<chan::Receiver<Tracked>>> = const { std::cell::RefCell::new(None) };
        static OTHER: std::cell::RefCell<Option<Tracked>> = const { std::cell::RefCell::new(None) };
    }
    within(30, || {
        let rt = rt1();
        let drops = Arc::new(AtomicUsize::new(0));
        let d = drops.clone();
        let h = rt.spawn(move || {
            OTHER.with_borrow_mut(|o| *o = Some(Tracked::new(100, &d, false)));
            let (tx, rx) = chan::unbounded();
            for i in 0..4 {
                tx.send(Tracked::new(i, &d, true)).unwrap();
            }
            HOLD.with_borrow_mut(|h| *h = Some(rx));
        });
        // Either the value (the locals died after the result was published)
        // or the destructor's panic, as adversarial/drops.rs accepts.
        if let Err(e) = h.join() {
            assert!(e.is_panic(), "{e}");
        }
        assert_eq!(
            drops.load(SeqCst),
            5,
            "four buffered values and the other fiber-local, once each"
        );
        still_works(&rt);
    })
}

/// A runtime owned by a value that its own fiber drops (a detached fiber
/// returning its runtime; a channel of its own fibers buffering it): the
/// drop happens inside one of its own fibers, which fiber refuses with a
/// panic and hands the shutdown to a thread of its own. No hang, no abort.
#[test]
fn a_runtime_dropped_by_its_own_fiber_through_a_detached_value_or_a_channel() {
    in_child(
        "a_runtime_dropped_by_its_own_fiber_through_a_detached_value_or_a_channel",
        60,
        || {
            within(30, || {
                // The detached value.
                let rt = rt1();
                let handle = rt.handle();
                let (ran_tx, ran_rx) = mpsc::channel();
                let (go_tx, go_rx) = chan::bounded::<()>(0);
                let h = handle.spawn(move || {
                    go_rx.recv().unwrap();
                    let _ = ran_tx.send(());
                    rt
                });
                drop(h); // detached: the fiber drops its own runtime
                go_tx.send(()).unwrap();
                ran_rx.recv_timeout(Duration::from_secs(10)).unwrap();
                // The runtime shuts down eventually: a spawn is refused.
                let start = Instant::now();
                while handle.try_spawn(|| ()).is_ok() {
                    assert!(start.elapsed() < Duration::from_secs(15), "the runtime never shut down");
                    std::thread::sleep(ms(10));
                }

                // A channel buffering its runtime, whose last receiver a
                // fiber of that runtime drops.
                let rt = rt1();
                let handle = rt.handle();
                let (tx, rx) = chan::unbounded::<fiber::Runtime>();
                tx.send(rt).unwrap();
                let (res_tx, res_rx) = mpsc::channel();
                handle.spawn(move || {
                    let msg = panic_message(move || drop(rx));
                    let _ = res_tx.send(msg);
                });
                let msg = res_rx.recv_timeout(Duration::from_secs(10)).expect("the drop returned");
                if let Some(msg) = msg {
                    assert!(msg.to_lowercase().contains("runtime"), "{msg}");
                }
                let start = Instant::now();
                while handle.try_spawn(|| ()).is_ok() {
                    assert!(start.elapsed() < Duration::from_secs(15), "the runtime never shut down");
                    std::thread::sleep(ms(10));
                }
                drop(tx);
            })
        },
    );
}

/// Shutdown with a scope whose children are parked for ever and own
/// values whose destructors wait on a channel (fed by nobody) or panic:
/// the drop ends, each value is dropped once, nothing aborts.
#[test]
fn shutdown_with_a_parked_scope_whose_children_own_waiting_and_panicking_values() {
    in_child(
        "shutdown_with_a_parked_scope_whose_children_own_waiting_and_panicking_values",
        60,
        || {
            within(30, || {
                let rt = rt_fixed_grace(2, ms(200));
                let drops = Arc::new(AtomicUsize::new(0));
                let (_keep_tx, keep_rx) = chan::bounded::<u32>(0);
                let d = drops.clone();
                let _h = rt.spawn(move || {
                    fiber::scope(|s| {
                        for i in 0..6 {
                            let d = d.clone();
                            let keep_rx = keep_rx.clone();
                            s.spawn(move || {
                                let _t = Tracked::new(i, &d, i % 3 == 0);
                                let _w = WaitsInDropCounted {
                                    rx: keep_rx.clone(),
                                    drops: d.clone(),
                                };
                                crate::common::stubborn_sleep();
                            });
                        }
                        let _t = Tracked::new(99, &d, false);
                        let _ = keep_rx.recv();
                    });
                });
                wait_parked(&rt, 7);
                let start = Instant::now();
                drop(rt);
                assert!(start.elapsed() < Duration::from_secs(20));
                // 6 Tracked + 6 waiting values + the owner's Tracked.
                assert_eq!(drops.load(SeqCst), 13, "each owned value dropped exactly once");
            })
        },
    );
}

/// Like `WaitsInDrop` but tolerant: counts itself whatever the wait returns.
struct WaitsInDropCounted {
    rx: chan::Receiver<u32>,
    drops: Arc<AtomicUsize>,
}

impl Drop for WaitsInDropCounted {
    fn drop(&mut self) {
        let _ = self.rx.recv_timeout(Duration::from_secs(3600));
        self.drops.fetch_add(1, SeqCst);
    }
}

/// A timed-out or cancelled send gives its value back; a receive racing the
/// deadline either gets it or not, never both, never neither: every value
/// created is dropped exactly once (fibers and plain threads on both ends).
#[test]
fn send_timeouts_racing_receives_drop_each_value_once() {
    within(60, || {
        let rt = rt();
        let drops = Arc::new(AtomicUsize::new(0));
        let created = Arc::new(AtomicUsize::new(0));
        let received = Arc::new(AtomicUsize::new(0));
        let sent_ok = Arc::new(AtomicUsize::new(0));
        for round in 0..4 {
            let (tx, rx) = chan::bounded::<Tracked>(0);
            let n = 300;
            let sender = {
                let (drops, created, sent_ok) = (drops.clone(), created.clone(), sent_ok.clone());
                move || {
                    for i in 0..n {
                        created.fetch_add(1, SeqCst);
                        match tx.send_timeout(Tracked::new(i, &drops, false), Duration::from_micros(50)) {
                            Ok(()) => {
                                sent_ok.fetch_add(1, SeqCst);
                            }
                            Err(e) => drop(e.into_inner()),
                        }
                    }
                }
            };
            let receiver = {
                let received = received.clone();
                move || {
                    for _ in 0..n {
                        if let Ok(v) = rx.recv_timeout(Duration::from_micros(50)) {
                            received.fetch_add(1, SeqCst);
                            drop(v);
                        }
                    }
                }
            };
            match round {
                0 => {
                    let a = rt.spawn(sender);
                    let b = rt.spawn(receiver);
                    a.join().unwrap();
                    b.join().unwrap();
                }
                1 => {
                    let a = std::thread::spawn(sender);
                    let b = rt.spawn(receiver);
                    a.join().unwrap();
                    b.join().unwrap();
                }
                2 => {
                    let a = rt.spawn(sender);
                    let b = std::thread::spawn(receiver);
                    a.join().unwrap();
                    b.join().unwrap();
                }
                _ => {
                    let a = std::thread::spawn(sender);
                    let b = std::thread::spawn(receiver);
                    a.join().unwrap();
                    b.join().unwrap();
                }
            }
        }
        assert_eq!(drops.load(SeqCst), created.load(SeqCst), "each value dropped once");
        assert_eq!(sent_ok.load(SeqCst), received.load(SeqCst), "an Ok send was received");
    })
}

// ---------------------------------------------------------------------------
// 2. The facade from plain threads
// ---------------------------------------------------------------------------

fn elapsed_between(start: Instant, low: Duration, what: &str) {
    let e = start.elapsed();
    assert!(e >= low, "{what} returned early: {e:?} < {low:?}");
    assert!(e < low + Duration::from_secs(5), "{what} took far too long: {e:?}");
}

/// In a process where no runtime was ever built: timers, timed channel
/// operations, select timeouts, park, and the fiber::sync primitives on
/// plain threads work as their std / crossbeam equivalents.
#[test]
fn without_any_runtime_timed_channel_and_sync_waits_work_on_plain_threads() {
    in_child(
        "without_any_runtime_timed_channel_and_sync_waits_work_on_plain_threads",
        60,
        || {
            within(30, || {
                let start = Instant::now();
                chan::after(ms(30)).recv().unwrap();
                elapsed_between(start, ms(30), "after");

                let t = chan::tick(ms(10));
                let start = Instant::now();
                for _ in 0..3 {
                    t.recv().unwrap();
                }
                elapsed_between(start, ms(30), "tick");

                let (tx, rx) = chan::bounded::<u8>(1);
                let start = Instant::now();
                assert!(rx.recv_timeout(ms(20)).is_err());
                elapsed_between(start, ms(20), "recv_timeout");
                tx.send(1).unwrap();
                let start = Instant::now();
                assert!(tx.send_timeout(2, ms(20)).is_err());
                elapsed_between(start, ms(20), "send_timeout");

                let (_tx2, rx2) = chan::bounded::<u8>(0);
                let start = Instant::now();
                let r = fiber::select! {
                    recv(rx2) -> _ => "rx2",
                    default(ms(20)) => "timeout",
                };
                assert_eq!(r, "timeout");
                elapsed_between(start, ms(20), "select! default(timeout)");

                let start = Instant::now();
                let r = fiber::select! {
                    recv(rx2) -> _ => "rx2",
                    recv(chan::after(ms(20))) -> _ => "after",
                };
                assert_eq!(r, "after");
                elapsed_between(start, ms(20), "select! on after");

                let mut sel = chan::Select::new();
                sel.recv(&rx2);
                let start = Instant::now();
                assert!(sel.select_timeout(ms(20)).is_err());
                elapsed_between(start, ms(20), "Select::select_timeout");

                let start = Instant::now();
                assert!(chan::never::<u8>().recv_timeout(ms(20)).is_err());
                elapsed_between(start, ms(20), "never().recv_timeout");

                let start = Instant::now();
                fiber::park_timeout(ms(20));
                assert!(start.elapsed() < Duration::from_secs(5));

                let pair = Arc::new((fiber::sync::Mutex::new(false), fiber::sync::Condvar::new()));
                let start = Instant::now();
                let (g, res) = pair.1.wait_timeout(pair.0.lock().unwrap(), ms(20)).unwrap();
                assert!(res.timed_out() && !*g);
                drop(g);
                elapsed_between(start, ms(20), "Condvar::wait_timeout");

                // Threads only: a condvar hand-off, a barrier, a wait group,
                // a semaphore, a contended mutex.
                let p = pair.clone();
                let t = std::thread::spawn(move || {
                    std::thread::sleep(ms(10));
                    *p.0.lock().unwrap() = true;
                    p.1.notify_all();
                });
                let g = pair.1.wait_while(pair.0.lock().unwrap(), |ready| !*ready).unwrap();
                assert!(*g);
                drop(g);
                t.join().unwrap();

                let barrier = Arc::new(fiber::sync::Barrier::new(4));
                let leaders = Arc::new(AtomicUsize::new(0));
                let wg = fiber::sync::WaitGroup::new();
                let sem = Arc::new(fiber::sync::Semaphore::new(1));
                let m = Arc::new(fiber::sync::Mutex::new(0u64));
                let ts: Vec<_> = (0..4)
                    .map(|_| {
                        let (b, l, wg, sem, m) = (barrier.clone(), leaders.clone(), wg.clone(), sem.clone(), m.clone());
                        std::thread::spawn(move || {
                            for _ in 0..3 {
                                if b.wait().is_leader() {
                                    l.fetch_add(1, SeqCst);
                                }
                            }
                            for _ in 0..1000 {
                                let _p = sem.acquire().unwrap();
                                *m.lock().unwrap() += 1;
                            }
                            drop(wg);
                        })
                    })
                    .collect();
                wg.wait();
                assert_eq!(leaders.load(SeqCst), 3);
                assert_eq!(*m.lock().unwrap(), 4000);
                assert_eq!(sem.available_permits(), 1);
                for t in ts {
                    t.join().unwrap();
                }
            })
        },
    );
}

/// In a process where no runtime was ever built: fiber-only calls on a
/// plain thread work as std would or panic naming themselves; never hang.
#[test]
fn without_any_runtime_fiber_only_calls_work_or_name_themselves() {
    in_child(
        "without_any_runtime_fiber_only_calls_work_or_name_themselves",
        60,
        || {
            let calls: Vec<(&str, Box<dyn FnOnce() + Send>)> = vec![
                (
                    "sleep",
                    Box::new(|| {
                        let _ = fiber::sleep(ms(1));
                    }),
                ),
                ("spawn", Box::new(|| drop(fiber::spawn(|| ())))),
                ("current", Box::new(|| drop(fiber::current()))),
                ("stats", Box::new(|| drop(fiber::stats()))),
                ("Job::current", Box::new(|| drop(fiber::Job::current()))),
                ("Handle::current", Box::new(|| drop(fiber::Handle::current()))),
                (
                    "scope",
                    Box::new(|| assert_eq!(fiber::scope(|s| s.spawn(|| 1).join().unwrap()), 1)),
                ),
                (
                    "with_timeout",
                    Box::new(|| {
                        let (_tx, rx) = chan::bounded::<u8>(0);
                        let r = fiber::with_timeout(ms(20), move || rx.recv());
                        assert!(r.is_err() || r.unwrap().is_err());
                    }),
                ),
                ("blocking", Box::new(|| assert_eq!(fiber::blocking(|| 3), 3))),
                (
                    "non_cancellable",
                    Box::new(|| assert_eq!(fiber::non_cancellable(|| 4), 4)),
                ),
            ];
            for (name, f) in calls {
                let msg = within(20, move || panic_message(f));
                if let Some(msg) = msg {
                    assert!(msg.contains(name), "a misuse panic names `{name}`: {msg:?}");
                }
            }
            // Queries answer without a runtime.
            assert!(!fiber::is_cancelled());
            assert!(fiber::check_cancelled().is_ok());
            assert!(fiber::yield_now().is_ok());
            assert!(fiber::Job::try_current().is_none());
        },
    );
}

/// In a process where no runtime was ever built: fiber::net on plain
/// threads is std::net (blocking accept/read/write, read timeouts).
#[test]
fn without_any_runtime_sockets_work_on_plain_threads() {
    in_child("without_any_runtime_sockets_work_on_plain_threads", 60, || {
        within(30, || {
            use std::io::{Read, Write};
            let listener = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let t = std::thread::spawn(move || {
                let mut c = fiber::net::TcpStream::connect(addr).unwrap();
                c.write_all(b"ping").unwrap();
                let mut buf = [0u8; 4];
                c.read_exact(&mut buf).unwrap();
                assert_eq!(&buf, b"pong");
            });
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = [0u8; 4];
            s.read_exact(&mut buf).unwrap();
            assert_eq!(&buf, b"ping");
            s.write_all(b"pong").unwrap();
            t.join().unwrap();
            s.set_read_timeout(Some(ms(20))).unwrap();
            let start = Instant::now();
            let e = s.read(&mut buf);
            match e {
                Ok(0) => {} // the peer closed: EOF at once is right too
                Ok(n) => panic!("unexpected {n} bytes"),
                Err(e) => {
                    assert!(
                        matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
                        "{e:?}"
                    );
                    elapsed_between(start, ms(20), "read timeout");
                }
            }
            let u = fiber::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            u.set_read_timeout(Some(ms(20))).unwrap();
            let start = Instant::now();
            let mut b = [0u8; 8];
            let e = u.recv_from(&mut b).unwrap_err();
            assert!(
                matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
                "{e:?}"
            );
            elapsed_between(start, ms(20), "udp read timeout");
        })
    });
}

/// `fiber::park` on a plain thread is `std::thread::park`: a fiber wakes it
/// through the thread's std handle, and a token given before the park is
/// kept.
#[test]
fn fiber_park_on_a_plain_thread_is_woken_by_a_fiber_through_std_unpark() {
    within(30, || {
        let rt = rt1();
        let flag = Arc::new(AtomicBool::new(false));
        let f = flag.clone();
        let me = std::thread::current();
        let h = rt.spawn(move || {
            fiber::sleep(ms(10)).unwrap();
            f.store(true, SeqCst);
            me.unpark();
        });
        let start = Instant::now();
        while !flag.load(SeqCst) {
            fiber::park();
            assert!(start.elapsed() < Duration::from_secs(10));
        }
        h.join().unwrap();
    })
}

/// Plain threads and fibers waking each other in both directions through a
/// semaphore and wait groups, many of each, on one worker: permits are
/// conserved and every wait ends.
#[test]
fn semaphores_and_wait_groups_between_many_threads_and_fibers_both_ways() {
    within(60, || {
        let rt = rt1();
        let sem = Arc::new(fiber::sync::Semaphore::new(0));
        let inside = Arc::new(AtomicUsize::new(0));
        let max_inside = Arc::new(AtomicUsize::new(0));
        let rounds = 200;
        let mut threads = Vec::new();
        let mut fibers = Vec::new();
        for i in 0..8 {
            let (sem, inside, max_inside) = (sem.clone(), inside.clone(), max_inside.clone());
            let work = move || {
                for _ in 0..rounds {
                    let p = sem.acquire().unwrap();
                    let now = inside.fetch_add(1, SeqCst) + 1;
                    max_inside.fetch_max(now, SeqCst);
                    inside.fetch_sub(1, SeqCst);
                    drop(p);
                }
            };
            if i % 2 == 0 {
                threads.push(std::thread::spawn(work));
            } else {
                fibers.push(rt.spawn(work));
            }
        }
        // Permits come from a fiber, one at a time, then two more.
        rt.spawn({
            let sem = sem.clone();
            move || {
                fiber::sleep(ms(5)).unwrap();
                sem.add_permits(2);
            }
        });
        for t in threads {
            t.join().unwrap();
        }
        for f in fibers {
            f.join().unwrap();
        }
        assert!(max_inside.load(SeqCst) <= 2, "at most two holders at once");
        assert_eq!(sem.available_permits(), 2, "permits conserved");

        // A fiber waits for plain threads, a thread for fibers.
        let wg = fiber::sync::WaitGroup::new();
        let count = Arc::new(AtomicUsize::new(0));
        for _ in 0..8 {
            let (wg, c) = (wg.clone(), count.clone());
            std::thread::spawn(move || {
                std::thread::sleep(ms(5));
                c.fetch_add(1, SeqCst);
                drop(wg);
            });
        }
        let c = count.clone();
        rt.spawn(move || {
            wg.wait();
            assert_eq!(c.load(SeqCst), 8);
        })
        .join()
        .unwrap();
        let wg = fiber::sync::WaitGroup::new();
        for _ in 0..8 {
            let (wg, c) = (wg.clone(), count.clone());
            rt.spawn(move || {
                fiber::sleep(ms(5)).unwrap();
                c.fetch_add(1, SeqCst);
                drop(wg);
            });
        }
        wg.wait();
        assert_eq!(count.load(SeqCst), 16);
    })
}

/// One side of a two-way rendezvous exchange: a select over a send and a
/// receive while both remain, then plain operations for what is left.
fn exchange(tx: chan::Sender<u64>, rx: chan::Receiver<u64>, n: u64) -> u64 {
    let (mut sent, mut received, mut sum) = (0u64, 0u64, 0u64);
    while sent < n && received < n {
        fiber::select! {
            send(tx, sent) -> r => { r.unwrap(); sent += 1; },
            recv(rx) -> v => { sum += v.unwrap(); received += 1; },
        }
    }
    while sent < n {
        tx.send(sent).unwrap();
        sent += 1;
    }
    while received < n {
        sum += rx.recv().unwrap();
        received += 1;
    }
    sum
}

/// A rendezvous select on a plain thread paired with a select in a fiber,
/// both directions, many rounds: each value crosses exactly once.
#[test]
fn selects_on_a_plain_thread_pair_with_selects_in_fibers_both_ways() {
    within(60, || {
        let rt = rt1();
        let n = 2000u64;
        let expect: u64 = (0..n).sum();
        for _ in 0..2 {
            let (a_tx, a_rx) = chan::bounded::<u64>(0);
            let (b_tx, b_rx) = chan::bounded::<u64>(0);
            let f = rt.spawn(move || exchange(b_tx, a_rx, n));
            let t = std::thread::spawn(move || exchange(a_tx, b_rx, n));
            assert_eq!(f.join().unwrap(), expect, "the fiber got each value once");
            assert_eq!(t.join().unwrap(), expect, "the thread got each value once");
        }
    })
}

// ---------------------------------------------------------------------------
// 3. Runtimes nested in and talking to other runtimes
// ---------------------------------------------------------------------------

/// Two single-worker runtimes exchange values over rendezvous channels and
/// hand a fiber mutex back and forth with a condvar.
#[test]
fn two_runtimes_ping_pong_over_channels_and_a_condvar() {
    within(60, || {
        let a = rt1();
        let b = rt1();
        let (to_b, from_a) = chan::bounded::<u32>(0);
        let (to_a, from_b) = chan::bounded::<u32>(0);
        let pong = b.spawn(move || {
            let mut n = 0;
            while let Ok(v) = from_a.recv() {
                to_a.send(v + 1).unwrap();
                n += 1;
            }
            n
        });
        let ping = a.spawn(move || {
            let mut v = 0;
            for _ in 0..2000 {
                to_b.send(v).unwrap();
                v = from_b.recv().unwrap();
            }
            v
        });
        assert_eq!(ping.join().unwrap(), 2000);
        assert_eq!(pong.join().unwrap(), 2000);

        let state = Arc::new((fiber::sync::Mutex::new(0u32), fiber::sync::Condvar::new()));
        let turn = |rt: &fiber::Runtime, me: u32| {
            let st = state.clone();
            rt.spawn(move || {
                for _ in 0..300 {
                    let mut g = st.1.wait_while(st.0.lock().unwrap(), |t| *t % 2 != me).unwrap();
                    *g += 1;
                    drop(g);
                    st.1.notify_all();
                }
            })
        };
        let x = turn(&a, 0);
        let y = turn(&b, 1);
        x.join().unwrap();
        y.join().unwrap();
        assert_eq!(*state.0.lock().unwrap(), 600);
    })
}

/// Dropping runtime A ends its fiber, which drops its sender: a fiber of
/// runtime B parked in a receive on that channel sees the disconnect.
/// Meanwhile B's fibers keep running.
#[test]
fn dropping_one_runtime_disconnects_a_channel_the_other_runtime_waits_on() {
    within(30, || {
        let a = rt_fixed_grace(1, ms(200));
        let b = rt1();
        let (tx, rx) = chan::bounded::<u32>(0);
        a.spawn(move || {
            let _tx = tx;
            let _ = fiber::sleep(Duration::MAX);
        });
        let waiter = b.spawn(move || rx.recv());
        wait_parked(&a, 1);
        wait_parked(&b, 1);
        drop(a);
        assert!(waiter.join().unwrap().is_err(), "the receive sees the disconnect");
        still_works(&b);
    })
}

/// A fiber of runtime B sends to a fiber of runtime A parked in a receive
/// while A is being dropped: the value is received (and dropped by A's
/// fiber) or given back to B, exactly once; no crash, no hang.
#[test]
fn a_send_from_another_runtime_racing_a_runtime_drop_drops_each_value_once() {
    within(120, || {
        let b = rt1();
        let drops = Arc::new(AtomicUsize::new(0));
        let mut created = 0;
        for round in 0..60 {
            let a = rt_fixed_grace(1, ms(50));
            let (tx, rx) = chan::bounded::<Tracked>(0);
            a.spawn(move || {
                while let Ok(v) = rx.recv() {
                    drop(v);
                }
            });
            wait_parked(&a, 1);
            let d = drops.clone();
            let sender = b.spawn(move || {
                let mut made = 0;
                for i in 0..5 {
                    made += 1;
                    if let Err(e) = tx.send(Tracked::new(i, &d, false)) {
                        drop(e.into_inner());
                        break;
                    }
                    if round % 2 == 0 {
                        fiber::yield_now().unwrap();
                    }
                }
                made
            });
            drop(a);
            created += sender.join().unwrap();
        }
        assert_eq!(drops.load(SeqCst), created, "each value dropped exactly once");
        still_works(&b);
    })
}

/// Cross-runtime join cycle resolved by a third fiber: a fiber of A joins a
/// fiber of B that waits for a value a second fiber of A sends later (one
/// worker each: the join must park, not block A's worker).
#[test]
fn a_join_across_runtimes_parks_instead_of_blocking_the_worker() {
    within(30, || {
        let a = rt1();
        let b = rt1();
        let (tx, rx) = chan::bounded::<u32>(0);
        let hb = b.spawn(move || rx.recv().unwrap() * 2);
        let joiner = a.spawn(move || hb.join().unwrap());
        let feeder = a.spawn(move || {
            fiber::sleep(ms(10)).unwrap();
            tx.send(21).unwrap();
        });
        assert_eq!(joiner.join().unwrap(), 42);
        feeder.join().unwrap();
    })
}

/// Dropping runtime A while its fiber joins a fiber of runtime B: the join
/// is cancelled, A's drop ends, and B's fiber runs on to its end.
#[test]
fn a_runtime_dropped_while_its_fiber_joins_another_runtimes_fiber() {
    within(30, || {
        let a = rt_fixed_grace(1, ms(200));
        let b = rt1();
        let (go_tx, go_rx) = chan::bounded::<()>(0);
        let finished = Arc::new(AtomicBool::new(false));
        let f = finished.clone();
        let hb = b.spawn(move || {
            go_rx.recv().unwrap();
            f.store(true, SeqCst);
            5
        });
        let (res_tx, res_rx) = mpsc::channel();
        a.spawn(move || {
            let r = hb.join();
            let _ = res_tx.send(r.map_err(|e| e.is_cancelled()));
        });
        wait_parked(&a, 1);
        drop(a);
        let r = res_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("A's fiber reported");
        assert_eq!(r, Err(true), "the join of B's fiber was cancelled by A's shutdown");
        go_tx.send(()).unwrap();
        let start = Instant::now();
        while !finished.load(SeqCst) {
            assert!(start.elapsed() < Duration::from_secs(10), "B's fiber never finished");
            std::thread::sleep(ms(2));
        }
        still_works(&b);
    })
}

/// A runtime built and dropped inside a fiber of a single-worker runtime,
/// whose own fiber waits for a `fiber::sync::Mutex` held by a fiber of the
/// outer runtime. The outer worker is blocked in the inner drop, so the
/// holder cannot run; the inner shutdown must still end (grace time, then
/// teardown abandons the stuck fiber) instead of hanging.
#[test]
fn an_inner_runtime_dropped_in_a_fiber_while_its_fiber_waits_for_an_outer_lock() {
    in_child(
        "an_inner_runtime_dropped_in_a_fiber_while_its_fiber_waits_for_an_outer_lock",
        60,
        || {
            within(40, || {
                let outer = rt_fixed_grace(1, ms(200));
                outer.block_on(|| {
                    let lock = Arc::new(fiber::sync::Mutex::new(0u32));
                    let l = lock.clone();
                    let (held_tx, held_rx) = chan::bounded::<()>(0);
                    let holder = fiber::spawn(move || {
                        let mut g = l.lock().unwrap();
                        held_tx.send(()).unwrap();
                        fiber::non_cancellable(|| fiber::sleep(ms(50)).unwrap());
                        *g += 1;
                    });
                    held_rx.recv().unwrap();
                    let inner = rt_fixed_grace(1, ms(200));
                    let l = lock.clone();
                    let waiter = inner.spawn(move || {
                        *l.lock().unwrap() += 10;
                    });
                    wait_parked(&inner, 1);
                    let start = Instant::now();
                    drop(inner);
                    assert!(start.elapsed() < Duration::from_secs(20), "the inner drop ended");
                    let _ = waiter.join();
                    holder.join().unwrap();
                    let v = *lock.lock().unwrap();
                    assert!(v == 1 || v == 11, "the lock is usable afterwards: {v}");
                });
            })
        },
    );
}

/// The same inner runtime, dropped from `fiber::blocking` instead (the
/// advice for a blocking call in a fiber): the holder runs, the inner
/// fiber gets the lock within the grace time.
#[test]
fn an_inner_runtime_dropped_through_blocking_while_its_fiber_waits_for_an_outer_lock() {
    within(30, || {
        let outer = rt_fixed_grace(1, ms(200));
        outer.block_on(|| {
            let lock = Arc::new(fiber::sync::Mutex::new(0u32));
            let l = lock.clone();
            let (held_tx, held_rx) = chan::bounded::<()>(0);
            let holder = fiber::spawn(move || {
                let mut g = l.lock().unwrap();
                held_tx.send(()).unwrap();
                fiber::sleep(ms(30)).unwrap();
                *g += 1;
            });
            held_rx.recv().unwrap();
            let inner = rt_fixed_grace(1, Duration::from_secs(5));
            let l = lock.clone();
            let waiter = inner.spawn(move || {
                *l.lock().unwrap() += 10;
            });
            wait_parked(&inner, 1);
            fiber::blocking(move || drop(inner));
            let r = waiter.join();
            holder.join().unwrap();
            assert_eq!(
                *lock.lock().unwrap(),
                11,
                "the inner fiber got the lock in its grace time: {r:?}"
            );
        });
    })
}

// ---------------------------------------------------------------------------
// 4. More combinations
// ---------------------------------------------------------------------------

/// A fiber-local destructor that joins the fiber's own handle: std panics
/// on a self-join ("Resource deadlock avoided"); fiber panics naming the
/// misuse for a self-join in the body. In a fiber-local destructor (after
/// the body) it must not wait for ever either.
#[test]
fn a_fiber_local_destructor_joining_its_own_fiber_does_not_hang() {
    struct JoinsSelf {
        own: Option<fiber::JoinHandle<()>>,
        report: Option<mpsc::Sender<String>>,
    }
    impl Drop for JoinsSelf {
        fn drop(&mut self) {
            let (Some(own), Some(report)) = (self.own.take(), self.report.take()) else {
                return;
            };
            let msg = panic_message(|| {
                let r = own.join();
                let _ = report.send(format!("returned {r:?}"));
            });
            if let Some(msg) = msg {
                let _ = report.send(format!("panicked: {msg}"));
            }
        }
    }
    fiber::fiber_local! {
        static SELF_JOIN: std::cell::RefCell<JoinsSelf> = const {
            std::cell::RefCell::new(JoinsSelf { own: None, report: None })
        };
    }
    within(30, || {
        let rt = rt1();
        let (tx, rx) = chan::bounded::<fiber::JoinHandle<()>>(1);
        let (report_tx, report_rx) = mpsc::channel();
        let me = rt.spawn(move || {
            let own = rx.recv().unwrap();
            SELF_JOIN.with_borrow_mut(|s| {
                s.own = Some(own);
                s.report = Some(report_tx);
            });
        });
        let canceller = me.canceller();
        tx.send(me).unwrap();
        let report = match report_rx.recv_timeout(Duration::from_secs(3)) {
            Ok(r) => r,
            Err(_) => {
                canceller.cancel();
                let r = report_rx.recv_timeout(Duration::from_secs(10));
                panic!("a self-join in a fiber-local destructor blocked (until cancelled: {r:?})");
            }
        };
        assert!(
            report.starts_with("panicked") && report.contains("join"),
            "a self-join is refused naming the misuse: {report}"
        );
        still_works(&rt);
    })
}

/// A runtime kept in a plain thread's `thread_local!` (and one in a
/// `fiber_local!`, which is thread-local outside fibers) is dropped by that
/// thread's exit: the shutdown runs from a TLS destructor. std lets a
/// thread pool be joined there; the runtime must shut down (its parked
/// fiber's value dropped once) and the thread exit, not abort or hang.
#[test]
fn a_runtime_in_a_plain_threads_thread_local_is_shut_down_at_thread_exit() {
    thread_local! {
        static RT_TLS: std::cell::RefCell<Option<fiber::Runtime>> = const { std::cell::RefCell::new(None) };
    }
    fiber::fiber_local! {
        static RT_FLS: std::cell::RefCell<Option<fiber::Runtime>> = const { std::cell::RefCell::new(None) };
    }
    in_child(
        "a_runtime_in_a_plain_threads_thread_local_is_shut_down_at_thread_exit",
        60,
        || {
            within(40, || {
                for use_fiber_local in [false, true] {
                    let drops = Arc::new(AtomicUsize::new(0));
                    let d = drops.clone();
                    let t = std::thread::spawn(move || {
                        let rt = rt_fixed_grace(2, ms(100));
                        // Use it from this thread first (a block_on, a spawn).
                        assert_eq!(rt.block_on(|| 3), 3);
                        rt.spawn(move || {
                            let _t = Tracked::new(0, &d, false);
                            let _ = fiber::sleep(Duration::MAX);
                        });
                        wait_parked(&rt, 1);
                        if use_fiber_local {
                            RT_FLS.with_borrow_mut(|s| *s = Some(rt));
                        } else {
                            RT_TLS.with_borrow_mut(|s| *s = Some(rt));
                        }
                    });
                    t.join().expect("the thread exits cleanly");
                    assert_eq!(
                        drops.load(SeqCst),
                        1,
                        "fiber_local={use_fiber_local}: the parked fiber's value dropped once"
                    );
                }
            })
        },
    );
}

/// The last receiver leaves while a `Select` holds a reserved position of a
/// bounded channel, with panicking values queued behind it: the
/// reservation's completion drops them (spec/chan.md). Each value is
/// dropped once, the panic does not leave the channel broken (a later send
/// fails at once with its value), nothing hangs.
#[test]
fn a_reserved_send_completing_after_the_last_receiver_left_drops_panicking_values_once() {
    within(30, || {
        for in_fiber in [false, true] {
            let body = move || {
                let drops = Arc::new(AtomicUsize::new(0));
                let (tx, rx) = chan::bounded::<Tracked>(4);
                let mut sel = chan::Select::new();
                let i = sel.send(&tx);
                let op = sel.select();
                assert_eq!(op.index(), i);
                tx.send(Tracked::new(1, &drops, true)).unwrap();
                tx.send(Tracked::new(2, &drops, true)).unwrap();
                drop(rx);
                let mine = Tracked::new(0, &drops, false);
                let msg = panic_message(|| {
                    let _ = op.send(&tx, mine);
                });
                if let Some(msg) = &msg {
                    assert!(msg.contains("tracked 1"), "{msg}");
                }
                assert_eq!(
                    drops.load(SeqCst),
                    3,
                    "in_fiber={in_fiber}: each value dropped once ({msg:?})"
                );
                let back = tx.send(Tracked::new(3, &drops, false));
                assert!(back.is_err(), "the channel is disconnected");
                drop(back);
                assert_eq!(drops.load(SeqCst), 4);
                let back = tx.try_send(Tracked::new(4, &drops, false));
                assert!(back.is_err());
                drop(back);
                assert_eq!(drops.load(SeqCst), 5);
            };
            if in_fiber {
                let rt = rt1();
                rt.block_on(body);
                still_works(&rt);
            } else {
                body();
            }
        }
    })
}

/// A fiber of runtime A waits for a `fiber::sync::Mutex` (and a condvar)
/// that a fiber of runtime B holds; B is dropped: the teardown unwinds the
/// holder, the guard's drop poisons and releases the lock (std: a guard
/// dropped by an unwind poisons), and A's fiber gets it.
#[test]
fn a_lock_held_by_a_fiber_of_a_dropped_runtime_is_released_poisoned_to_another_runtime() {
    within(30, || {
        let a = rt1();
        let b = rt_fixed_grace(1, ms(100));
        let lock = Arc::new(fiber::sync::Mutex::new(0u32));
        let l = lock.clone();
        let (held_tx, held_rx) = chan::bounded::<()>(0);
        b.spawn(move || {
            let _g = l.lock().unwrap();
            held_tx.send(()).unwrap();
            crate::common::stubborn_sleep();
        });
        held_rx.recv().unwrap();
        let l = lock.clone();
        let waiter = a.spawn(move || match l.lock() {
            Ok(g) => (*g, false),
            Err(p) => (*p.into_inner(), true),
        });
        wait_parked(&a, 1);
        drop(b);
        let (v, poisoned) = waiter.join().unwrap();
        assert_eq!(v, 0);
        assert!(poisoned, "a guard dropped by the teardown unwind poisons the lock");
    })
}

/// An unjoined scoped child's value whose destructor spawns the next child
/// into the same scope (after the scope's body returned), thirty deep: std
/// lets a scoped thread spawn into its scope at any time before the scope
/// ends; the scope must wait for the whole chain, each value dropped once.
#[test]
fn unjoined_values_whose_drops_spawn_into_the_scope_are_all_awaited() {
    struct Next<'scope, 'env> {
        s: &'scope fiber::Scope<'scope, 'env>,
        left: usize,
        drops: Arc<AtomicUsize>,
    }
    impl Drop for Next<'_, '_> {
        fn drop(&mut self) {
            self.drops.fetch_add(1, SeqCst);
            if self.left > 0 {
                let (s, left, drops) = (self.s, self.left - 1, self.drops.clone());
                drop(s.spawn(move || {
                    fiber::yield_now().unwrap();
                    Next { s, left, drops }
                }));
            }
        }
    }
    within(30, || {
        let rt = rt1();
        let drops = Arc::new(AtomicUsize::new(0));
        let d = drops.clone();
        rt.block_on(move || {
            fiber::scope(|s| {
                let d = d.clone();
                drop(s.spawn(move || Next { s, left: 30, drops: d }));
            });
            assert_eq!(d.load(SeqCst), 31, "the scope waited for the whole chain");
        });
        assert_eq!(drops.load(SeqCst), 31);
    })
}

/// A fiber of runtime B spawns into a scope opened by a fiber of runtime A
/// (B's root borrows the scope through `fiber::blocking` + `Handle::block_on`):
/// the child runs on the scope's runtime (A), as for a plain thread, and the
/// scope waits for it.
#[test]
fn a_fiber_of_another_runtime_spawns_into_a_scope_and_the_child_runs_on_the_scopes_runtime() {
    within(30, || {
        let a = fiber::Runtime::builder()
            .workers(1)
            .max_workers(1)
            .thread_name("rt-aaa")
            .build()
            .unwrap();
        let b = fiber::Runtime::builder()
            .workers(1)
            .max_workers(1)
            .thread_name("rt-bbb")
            .build()
            .unwrap();
        let bh = b.handle();
        let mut data = vec![1, 2, 3];
        a.block_on(|| {
            fiber::scope(|s| {
                let data = &mut data;
                let seen = fiber::blocking(|| {
                    bh.block_on(|| {
                        let h = s.spawn(move || {
                            data.push(4);
                            std::thread::current().name().map(str::to_string)
                        });
                        h.join().unwrap()
                    })
                });
                let seen = seen.unwrap_or_default();
                assert!(
                    seen.starts_with("rt-aaa"),
                    "the child ran on the scope's runtime: {seen}"
                );
            });
        });
        assert_eq!(data, vec![1, 2, 3, 4]);
    })
}

/// `block_on` returns after the root fiber is done. std's `join` (and
/// fiber's scoped join) returns only after the joined thread's
/// thread-local destructors ran: here the root's fiber-local destructor
/// must have run when `block_on` returns, also when it has to wait for
/// another fiber (a detached one) to finish.
#[test]
fn block_on_returns_after_the_roots_fiber_local_destructors_ran() {
    struct SetsOnDrop {
        flag: Arc<AtomicBool>,
        rx: Option<chan::Receiver<u32>>,
    }
    impl Drop for SetsOnDrop {
        fn drop(&mut self) {
            if let Some(rx) = self.rx.take() {
                assert_eq!(rx.recv(), Ok(7), "the detached feeder is still running");
            }
            self.flag.store(true, SeqCst);
        }
    }
    fiber::fiber_local! {
        static ROOT_LOCAL: std::cell::RefCell<Option<SetsOnDrop>> = const { std::cell::RefCell::new(None) };
    }
    within(30, || {
        let rt = rt1();
        let flag = Arc::new(AtomicBool::new(false));
        let f = flag.clone();
        rt.block_on(move || ROOT_LOCAL.with_borrow_mut(|s| *s = Some(SetsOnDrop { flag: f, rx: None })));
        assert!(
            flag.load(SeqCst),
            "block_on returned before the root's fiber-local was dropped"
        );

        let flag = Arc::new(AtomicBool::new(false));
        let f = flag.clone();
        rt.block_on(move || {
            let (tx, rx) = chan::bounded::<u32>(0);
            fiber::spawn(move || {
                fiber::sleep(ms(10)).unwrap();
                tx.send(7).unwrap();
            });
            ROOT_LOCAL.with_borrow_mut(|s| *s = Some(SetsOnDrop { flag: f, rx: Some(rx) }));
        });
        assert!(
            flag.load(SeqCst),
            "block_on returned before the root's fiber-local was dropped"
        );

        // fiber::run: the root's fiber-local destructor runs before the
        // shutdown cancels the detached feeder (the root is not done yet).
        let flag = Arc::new(AtomicBool::new(false));
        let f = flag.clone();
        let r = panic_message(move || {
            fiber::run(move || {
                let (tx, rx) = chan::bounded::<u32>(0);
                fiber::spawn(move || {
                    fiber::sleep(ms(10)).unwrap();
                    tx.send(7).unwrap();
                });
                ROOT_LOCAL.with_borrow_mut(|s| *s = Some(SetsOnDrop { flag: f, rx: Some(rx) }));
            })
        });
        assert_eq!(r, None, "the root's fiber-local destructor could wait for the feeder");
        assert!(flag.load(SeqCst));
    })
}

/// A `fiber::blocking` call still queued at shutdown (the pool's only
/// thread busy) never runs: its closure goes back to its fiber and is
/// dropped there (adversarial/shutdown_blocking.rs). A capture whose
/// destructor panics is like the capture of a fiber that never starts
/// (dropped and caught, `shutdown_drops_an_unrun_closure_whose_capture_panics_in_drop`):
/// it is dropped once, and the process does not abort (std never drops a
/// closure that did not run inside an unwind).
#[test]
fn an_unrun_blocking_closure_whose_capture_panics_in_drop_at_shutdown() {
    in_child(
        "an_unrun_blocking_closure_whose_capture_panics_in_drop_at_shutdown",
        40,
        || {
            let drops = Arc::new(AtomicUsize::new(0));
            let rt = fiber::Runtime::builder()
                .workers(1)
                .max_workers(1)
                .max_blocking_threads(1)
                .shutdown_timeout(ms(100))
                .build()
                .unwrap();
            let (started_tx, started_rx) = mpsc::channel();
            let (release_tx, release_rx) = mpsc::channel::<()>();
            rt.spawn(move || {
                fiber::blocking(move || {
                    started_tx.send(()).unwrap();
                    let _ = release_rx.recv();
                })
            });
            started_rx.recv().unwrap();
            let ran = Arc::new(AtomicBool::new(false));
            let (d, r) = (drops.clone(), ran.clone());
            rt.spawn(move || {
                let t = Tracked::new(0, &d, true);
                fiber::blocking(move || {
                    let _t = t;
                    r.store(true, SeqCst);
                });
            });
            wait_parked(&rt, 2);
            drop(rt);
            release_tx.send(()).unwrap();
            let until = Instant::now() + Duration::from_secs(20);
            while drops.load(SeqCst) == 0 {
                assert!(Instant::now() < until, "the unrun closure was never dropped");
                std::thread::sleep(ms(10));
            }
            std::thread::sleep(ms(200));
            assert_eq!(drops.load(SeqCst), 1);
            assert!(!ran.load(SeqCst));
        },
    );
}

/// A value whose destructor waits on a fiber channel that nobody feeds (a
/// long timed receive), and counts itself once the wait returned.
struct WaitsThenCounts {
    rx: chan::Receiver<u32>,
    started: Arc<AtomicUsize>,
    finished: Arc<AtomicUsize>,
}

impl Drop for WaitsThenCounts {
    fn drop(&mut self) {
        self.started.fetch_add(1, SeqCst);
        let _ = self.rx.recv_timeout(Duration::from_secs(3600));
        self.finished.fetch_add(1, SeqCst);
    }
}

/// Keep the only worker of `rt` busy (a fiber that never yields) until the
/// returned flag is set: fibers spawned meanwhile never start, so at
/// shutdown they are only reached by the teardown (step 4), on the dropping
/// thread.
fn hog_the_only_worker(rt: &fiber::Runtime) -> Arc<AtomicBool> {
    let (spin_tx, spin_rx) = mpsc::channel::<()>();
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    rt.spawn(move || {
        spin_tx.send(()).unwrap();
        while !s.load(SeqCst) {
            std::hint::spin_loop();
        }
    });
    spin_rx.recv().unwrap();
    stop
}

/// Fibers that never started when their runtime is dropped: teardown drops
/// each closure on the fiber's own stack. A capture whose destructor waits
/// must get `Cancelled` (or a timeout) at once and run to its end, as the
/// destructors of a cancelled fiber's value and of fiber-locals do
/// (spec/reliability.md, step 4: "a wait after the body has returned ...
/// returns `Cancelled` at once ... an unwind there would be caught at once
/// and cut the destructor short"); a capture whose destructor panics must
/// not keep the others from being dropped; and the join reports the fiber
/// cancelled ("Torn down by shutdown is a cancellation, not a panic").
/// Was (before the fix): the wait raises the shutdown unwind, which drop_caught catches: destructor cut short, join says "panicked"
#[test]
fn unrun_fibers_whose_captures_wait_in_drop_at_teardown_run_to_their_end() {
    in_child(
        "unrun_fibers_whose_captures_wait_in_drop_at_teardown_run_to_their_end",
        40,
        || {
            let started = Arc::new(AtomicUsize::new(0));
            let finished = Arc::new(AtomicUsize::new(0));
            let rt = rt_fixed_grace(1, ms(100));
            let (_keep, keep_rx) = chan::bounded::<u32>(0);
            let stop = hog_the_only_worker(&rt);
            let mut handles = Vec::new();
            for _ in 0..4 {
                let w = WaitsThenCounts {
                    rx: keep_rx.clone(),
                    started: started.clone(),
                    finished: finished.clone(),
                };
                handles.push(rt.spawn(move || {
                    let _ = &w;
                }));
            }
            // The hog returns after the grace time, before the 2 s bound on
            // stopping the workers: the unstarted fibers are left to teardown.
            let stopper = std::thread::spawn(move || {
                std::thread::sleep(ms(300));
                stop.store(true, SeqCst);
            });
            drop(rt);
            stopper.join().unwrap();
            assert_eq!(started.load(SeqCst), 4, "every unrun closure was dropped");
            let outcomes: Vec<String> = handles
                .into_iter()
                .map(|h| match h.join() {
                    Ok(()) => "ok".to_string(),
                    Err(e) => format!("cancelled={} panic={} ({e})", e.is_cancelled(), e.is_panic()),
                })
                .collect();
            assert_eq!(
                finished.load(SeqCst),
                4,
                "each destructor ran to its end (joins: {outcomes:?})"
            );
            for o in &outcomes {
                assert!(
                    o.starts_with("cancelled=true"),
                    "a never-started fiber ends cancelled: {o}"
                );
            }
        },
    );
}

/// The same through a destructor that teardown runs (a fiber parked at
/// shutdown owns it): it spawns a fiber (cancelled before it starts, its
/// closure dropped on its own stack) whose capture waits in its destructor.
/// Was (before the fix): the capture's destructor is cut short at its wait (shutdown unwind caught by drop_caught)
#[test]
fn a_teardown_destructor_spawning_a_fiber_whose_capture_waits_in_drop() {
    struct SpawnsOnDrop(Option<WaitsThenCounts>);
    impl Drop for SpawnsOnDrop {
        fn drop(&mut self) {
            let w = self.0.take().unwrap();
            let h = fiber::spawn(move || {
                let _ = &w;
            });
            let _ = h.join();
        }
    }
    in_child(
        "a_teardown_destructor_spawning_a_fiber_whose_capture_waits_in_drop",
        40,
        || {
            let started = Arc::new(AtomicUsize::new(0));
            let finished = Arc::new(AtomicUsize::new(0));
            let rt = rt_fixed_grace(1, ms(100));
            let (_keep, keep_rx) = chan::bounded::<u32>(0);
            let w = WaitsThenCounts {
                rx: keep_rx,
                started: started.clone(),
                finished: finished.clone(),
            };
            rt.spawn(move || {
                let _o = SpawnsOnDrop(Some(w));
                crate::common::stubborn_sleep();
            });
            wait_parked(&rt, 1);
            drop(rt);
            assert_eq!(started.load(SeqCst), 1);
            assert_eq!(finished.load(SeqCst), 1, "the capture's destructor ran to its end");
        },
    );
}

/// A destructor run by teardown opens a `fiber::scope` whose child (never
/// started: the runtime is shutting down) has a capture that waits in its
/// destructor. std runs such a destructor normally; fiber must not abort.
/// On main the wait raises the shutdown unwind inside the child's unrun
/// closure drop, `ChildBody` catches it as a child panic, and the scope
/// re-raises it inside the destructor that is already unwinding: "panic in
/// a destructor during cleanup", abort.
/// Was (before the fix): process aborts ("panic in a destructor during cleanup")
#[test]
fn a_teardown_destructor_opening_a_scope_whose_childs_capture_waits_does_not_abort() {
    struct ScopeOnDrop(Option<WaitsThenCounts>, Arc<AtomicUsize>);
    impl Drop for ScopeOnDrop {
        fn drop(&mut self) {
            let w = self.0.take().unwrap();
            fiber::scope(|s| {
                s.spawn(move || {
                    let _ = &w;
                });
            });
            self.1.fetch_add(1, SeqCst);
        }
    }
    in_child(
        "a_teardown_destructor_opening_a_scope_whose_childs_capture_waits_does_not_abort",
        40,
        || {
            let started = Arc::new(AtomicUsize::new(0));
            let finished = Arc::new(AtomicUsize::new(0));
            let owner_done = Arc::new(AtomicUsize::new(0));
            let rt = rt_fixed_grace(1, ms(100));
            let (_keep, keep_rx) = chan::bounded::<u32>(0);
            let w = WaitsThenCounts {
                rx: keep_rx,
                started: started.clone(),
                finished: finished.clone(),
            };
            let od = owner_done.clone();
            rt.spawn(move || {
                let _o = ScopeOnDrop(Some(w), od);
                crate::common::stubborn_sleep();
            });
            wait_parked(&rt, 1);
            drop(rt);
            assert_eq!(started.load(SeqCst), 1);
            assert_eq!(
                finished.load(SeqCst),
                1,
                "the child's capture destructor ran to its end"
            );
            assert_eq!(
                owner_done.load(SeqCst),
                1,
                "the scope returned in the owner's destructor"
            );
        },
    );
}

/// A plain thread's `Handle::block_on(root)` admitted behind a fiber that
/// keeps the only worker busy until after the runtime's drop began (so
/// the root never starts and teardown drops it unrun); the receiver gets
/// what `block_on` panicked with (`None`: it returned).
fn block_on_behind_a_hog_at_shutdown(root: impl FnOnce() + Send + 'static) -> mpsc::Receiver<Option<String>> {
    let rt = rt_fixed_grace(1, ms(100));
    let handle = rt.handle();
    let stop = hog_the_only_worker(&rt);
    let (res_tx, res_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let r = panic_message(move || handle.block_on(root));
        let _ = res_tx.send(r);
    });
    // Let the thread's root be admitted behind the hog (the hog and the
    // root: two fibers alive).
    let until = Instant::now() + Duration::from_secs(10);
    while rt.stats().fibers_alive < 2 {
        assert!(Instant::now() < until, "the root was never admitted");
        std::thread::sleep(ms(2));
    }
    let stopper = std::thread::spawn(move || {
        std::thread::sleep(ms(300));
        stop.store(true, SeqCst);
    });
    drop(rt);
    stopper.join().unwrap();
    res_rx
}

/// A plain thread's `Handle::block_on` whose root never started when the
/// runtime is dropped (the only worker busy): teardown drops the root
/// closure unrun. A capture whose destructor waits must run to its end and
/// the caller must get a panic saying the root ended without a value (or
/// that the runtime shut down), never wait for ever.
/// Was (before the fix): the capture's wait raises the shutdown unwind inside Root::drop, which then never sets `done`: block_on hangs for ever
#[test]
fn a_block_on_root_dropped_unrun_at_teardown_with_a_waiting_capture_returns() {
    in_child(
        "a_block_on_root_dropped_unrun_at_teardown_with_a_waiting_capture_returns",
        40,
        || {
            let started = Arc::new(AtomicUsize::new(0));
            let finished = Arc::new(AtomicUsize::new(0));
            let (_keep, keep_rx) = chan::bounded::<u32>(0);
            let w = WaitsThenCounts {
                rx: keep_rx,
                started: started.clone(),
                finished: finished.clone(),
            };
            let res_rx = block_on_behind_a_hog_at_shutdown(move || {
                let _ = &w;
            });
            let r = res_rx.recv_timeout(Duration::from_secs(10)).unwrap_or_else(|_| {
                panic!(
                    "Handle::block_on never returned (capture destructor started {} finished {})",
                    started.load(SeqCst),
                    finished.load(SeqCst)
                )
            });
            assert!(r.is_some(), "the root never ran: block_on cannot return a value");
            assert_eq!(started.load(SeqCst), 1);
            assert_eq!(finished.load(SeqCst), 1, "the capture's destructor ran to its end");
        },
    );
}

/// `Handle::block_on` on a runtime that is gone refuses to spawn the root
/// and drops the closure on the caller. A capture whose destructor panics
/// (as `std::thread::Builder::spawn` failing drops its closure, and that
/// panic reaches the caller): `block_on` must panic, not wait for ever.
/// Was (before the fix): Root::drop panics in drop(self.f) before done.set(); the unwind's WaitDone then waits for ever
#[test]
fn handle_block_on_refused_with_a_panicking_capture_panics_instead_of_hanging() {
    in_child(
        "handle_block_on_refused_with_a_panicking_capture_panics_instead_of_hanging",
        40,
        || {
            let drops = Arc::new(AtomicUsize::new(0));
            let rt = rt();
            let handle = rt.handle();
            drop(rt);
            let t = Tracked::new(0, &drops, true);
            let (res_tx, res_rx) = mpsc::channel();
            std::thread::spawn(move || {
                let r = panic_message(move || {
                    handle.block_on(move || {
                        let _ = &t;
                    })
                });
                let _ = res_tx.send(r);
            });
            let r = res_rx
                .recv_timeout(Duration::from_secs(10))
                .unwrap_or_else(|_| panic!("Handle::block_on never returned (drops: {})", drops.load(SeqCst)));
            assert!(r.is_some(), "a refused block_on panics");
            assert_eq!(drops.load(SeqCst), 1);
        },
    );
}

/// The same for a root admitted but never started when the runtime shuts
/// down (the only worker busy): its closure is dropped unrun; a capture
/// whose destructor panics must make `block_on` panic, not hang.
/// Was (before the fix): as above (Root::drop skips done.set() when dropping the closure panics): block_on hangs
#[test]
fn a_block_on_root_dropped_unrun_with_a_panicking_capture_panics_instead_of_hanging() {
    in_child(
        "a_block_on_root_dropped_unrun_with_a_panicking_capture_panics_instead_of_hanging",
        40,
        || {
            let drops = Arc::new(AtomicUsize::new(0));
            let t = Tracked::new(0, &drops, true);
            let res_rx = block_on_behind_a_hog_at_shutdown(move || {
                let _ = &t;
            });
            let r = res_rx
                .recv_timeout(Duration::from_secs(10))
                .unwrap_or_else(|_| panic!("Handle::block_on never returned (drops: {})", drops.load(SeqCst)));
            assert!(r.is_some(), "the root never ran: block_on panics");
            assert_eq!(drops.load(SeqCst), 1);
        },
    );
}
