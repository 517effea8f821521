//! Adversarial: destructors and waits at teardown (fiber-local destructors
//! that wait run to their end; a worker stuck in a spinner loses no other
//! fiber; condvar, barrier, timer-select and cross-runtime joins end).

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use crate::common::{in_child, ms, rt_fixed_grace, rt_grace, stubborn_sleep, wait_parked, within};

/// A destructor that waits (a cancellable wait), then records that its
/// code after the wait ran.
struct WaitsThenCounts(Arc<AtomicUsize>);
impl Drop for WaitsThenCounts {
    fn drop(&mut self) {
        let _ = fiber::sleep(ms(1));
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn control_a_stack_values_destructor_that_waits_at_teardown_runs_to_its_end() {
    in_child(
        "control_a_stack_values_destructor_that_waits_at_teardown_runs_to_its_end",
        60,
        || {
            within(40, || {
                let done = Arc::new(AtomicUsize::new(0));
                let rt = rt_grace(2, ms(200));
                for _ in 0..4 {
                    let v = WaitsThenCounts(done.clone());
                    rt.spawn(move || {
                        let _v = v;
                        stubborn_sleep();
                    });
                }
                wait_parked(&rt, 4);
                drop(rt);
                assert_eq!(done.load(Ordering::SeqCst), 4);
            });
        },
    );
}

fiber::fiber_local! {
    static WAITER_LOCAL: RefCell<Option<WaitsThenCounts>> = RefCell::new(None);
}

#[test]
fn a_fiber_locals_destructor_that_waits_at_teardown_runs_to_its_end() {
    in_child(
        "a_fiber_locals_destructor_that_waits_at_teardown_runs_to_its_end",
        60,
        || {
            within(40, || {
                let done = Arc::new(AtomicUsize::new(0));
                let rt = rt_grace(2, ms(200));
                for _ in 0..4 {
                    let v = WaitsThenCounts(done.clone());
                    rt.spawn(move || {
                        WAITER_LOCAL.with(|l| *l.borrow_mut() = Some(v));
                        stubborn_sleep();
                    });
                }
                wait_parked(&rt, 4);
                drop(rt);
                assert_eq!(
                    done.load(Ordering::SeqCst),
                    4,
                    "code after the wait in a fiber-local destructor was skipped"
                );
            });
        },
    );
}

// Ten fiber-locals, each of whose destructors waits: every one is dropped
// and the fiber is not abandoned (no leak).
fiber::fiber_local! {
    static L0: RefCell<Option<WaitsThenCounts>> = RefCell::new(None);
    static L1: RefCell<Option<WaitsThenCounts>> = RefCell::new(None);
    static L2: RefCell<Option<WaitsThenCounts>> = RefCell::new(None);
    static L3: RefCell<Option<WaitsThenCounts>> = RefCell::new(None);
    static L4: RefCell<Option<WaitsThenCounts>> = RefCell::new(None);
    static L5: RefCell<Option<WaitsThenCounts>> = RefCell::new(None);
    static L6: RefCell<Option<WaitsThenCounts>> = RefCell::new(None);
    static L7: RefCell<Option<WaitsThenCounts>> = RefCell::new(None);
    static L8: RefCell<Option<WaitsThenCounts>> = RefCell::new(None);
    static L9: RefCell<Option<WaitsThenCounts>> = RefCell::new(None);
}

struct Counted(Arc<AtomicUsize>);
impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn ten_fiber_locals_whose_destructors_wait_are_all_dropped_at_teardown() {
    in_child(
        "ten_fiber_locals_whose_destructors_wait_are_all_dropped_at_teardown",
        60,
        || {
            within(40, || {
                let done = Arc::new(AtomicUsize::new(0));
                let dropped = Arc::new(AtomicUsize::new(0));
                let rt = rt_grace(2, ms(200));
                let d = done.clone();
                let dr = dropped.clone();
                let h = rt.spawn(move || {
                    for l in [&L0, &L1, &L2, &L3, &L4, &L5, &L6, &L7, &L8, &L9] {
                        let v = WaitsThenCounts(d.clone());
                        l.with(|l| *l.borrow_mut() = Some(v));
                    }
                    let _c = Counted(dr);
                    stubborn_sleep();
                });
                wait_parked(&rt, 1);
                let (tx, rx) = mpsc::channel();
                std::thread::spawn(move || {
                    let _ = tx.send(h.join().is_err());
                });
                drop(rt);
                assert_eq!(dropped.load(Ordering::SeqCst), 1);
                assert_eq!(
                    rx.recv_timeout(Duration::from_secs(5)),
                    Ok(true),
                    "the joiner of the fiber must be released"
                );
                assert_eq!(
                    done.load(Ordering::SeqCst),
                    10,
                    "every fiber-local destructor must run to its end"
                );
            });
        },
    );
}

// ---------------------------------------------------------------- condvar
#[test]
fn a_condvar_waiter_whose_mutex_a_stubborn_fiber_holds_is_torn_down() {
    in_child(
        "a_condvar_waiter_whose_mutex_a_stubborn_fiber_holds_is_torn_down",
        60,
        || {
            within(40, || {
                let drops = Arc::new(AtomicUsize::new(0));
                let rt = rt_grace(2, ms(200));
                let pair = Arc::new((fiber::sync::Mutex::new(false), fiber::sync::Condvar::new()));
                // waiter first (lower id), then the holder
                let p = pair.clone();
                let d = drops.clone();
                let (tx, rx) = mpsc::channel();
                rt.spawn(move || {
                    let _c = Counted(d);
                    let g = p.0.lock().unwrap();
                    tx.send(()).unwrap();
                    let _g = p.1.wait_while(g, |ready| !*ready);
                });
                rx.recv().unwrap();
                std::thread::sleep(ms(20));
                let p = pair.clone();
                let d = drops.clone();
                rt.spawn(move || {
                    let _c = Counted(d);
                    let _g = p.0.lock().unwrap();
                    stubborn_sleep();
                });
                std::thread::sleep(ms(50));
                drop(rt);
                assert_eq!(drops.load(Ordering::SeqCst), 2);
                // the mutex is usable afterwards
                drop(pair.0.lock());
            });
        },
    );
}

// ---------------------------------------------------------------- barrier
#[test]
fn barrier_waiters_end_a_shutdown_with_an_infinite_grace() {
    within(30, || {
        let rt = rt_grace(2, ms(200));
        let b = Arc::new(fiber::sync::Barrier::new(10));
        let cancelled = Arc::new(AtomicUsize::new(0));
        for _ in 0..5 {
            let b = b.clone();
            let c = cancelled.clone();
            rt.spawn(move || {
                if b.wait().is_cancelled() {
                    c.fetch_add(1, Ordering::SeqCst);
                }
            });
        }
        wait_parked(&rt, 5);
        let t = Instant::now();
        rt.shutdown_timeout(Duration::MAX);
        assert!(t.elapsed() < Duration::from_secs(5), "took {:?}", t.elapsed());
        assert_eq!(cancelled.load(Ordering::SeqCst), 5);
    });
}

// ---------------------------------------------------------------- select with timers
#[test]
fn a_select_loop_on_timer_arms_ignoring_cancellation_ends_at_zero_grace() {
    within(30, || {
        let rt = rt_grace(2, ms(200));
        let drops = Arc::new(AtomicUsize::new(0));
        for _ in 0..4 {
            let d = drops.clone();
            rt.spawn(move || {
                let _c = Counted(d);
                let (_tx, rx) = fiber::chan::bounded::<u8>(0);
                let tick = fiber::chan::tick(Duration::from_secs(3600));
                for _ in 0..1_000_000 {
                    fiber::select! {
                        recv(rx) -> _ => {},
                        recv(tick) -> _ => {},
                        recv(fiber::chan::after(Duration::from_secs(3600))) -> _ => {},
                    }
                }
            });
        }
        wait_parked(&rt, 4);
        let t = Instant::now();
        rt.shutdown_timeout(Duration::ZERO);
        assert!(t.elapsed() < Duration::from_secs(10), "took {:?}", t.elapsed());
        assert_eq!(drops.load(Ordering::SeqCst), 4);
    });
}

// ---------------------------------------------------------------- stuck worker
#[test]
fn a_spinner_that_never_yields_and_returns_after_shutdown_releases_its_joiner() {
    in_child(
        "a_spinner_that_never_yields_and_returns_after_shutdown_releases_its_joiner",
        60,
        || {
            within(40, || {
                let rt = rt_fixed_grace(2, ms(100));
                let flag = Arc::new(AtomicBool::new(false));
                let drops = Arc::new(AtomicUsize::new(0));
                let f = flag.clone();
                let d = drops.clone();
                let started = Arc::new(AtomicBool::new(false));
                let s = started.clone();
                let h = rt.spawn(move || {
                    let _c = Counted(d);
                    s.store(true, Ordering::SeqCst);
                    while !f.load(Ordering::SeqCst) {
                        std::hint::spin_loop();
                    }
                    5u32
                });
                // Three more, which may or may not have started by the
                // drop: the counted value is captured, so it is dropped
                // whether the fiber is unwound or never starts (its
                // closure is dropped then).
                for _ in 0..3 {
                    let c = Counted(drops.clone());
                    rt.spawn(move || {
                        let _c = c;
                        stubborn_sleep();
                    });
                }
                while !started.load(Ordering::SeqCst) {
                    std::thread::sleep(ms(1));
                }
                let (tx, rx) = mpsc::channel();
                std::thread::spawn(move || {
                    let _ = tx.send(h.join().ok());
                });
                drop(rt);
                let at_drop = drops.load(Ordering::SeqCst);
                eprintln!("at_drop={at_drop}");
                flag.store(true, Ordering::SeqCst);
                let r = rx.recv_timeout(Duration::from_secs(10));
                assert!(r.is_ok(), "the joiner of the spinner never returned");
                let start = Instant::now();
                while drops.load(Ordering::SeqCst) < 4 && start.elapsed() < Duration::from_secs(5) {
                    std::thread::sleep(ms(5));
                }
                eprintln!("final={} joined={:?}", drops.load(Ordering::SeqCst), r);
                assert_eq!(drops.load(Ordering::SeqCst), 4, "not every destructor ran in the end");
                assert_eq!(
                    at_drop, 3,
                    "the non-stuck fibers were not all unwound when drop returned"
                );
            });
        },
    );
}

// ---------------------------------------------------------------- stuck worker
#[test]
fn a_spinner_with_parked_neighbours_all_torn_down() {
    in_child("a_spinner_with_parked_neighbours_all_torn_down", 60, || {
        within(40, || {
            let rt = rt_fixed_grace(2, ms(100));
            let flag = Arc::new(AtomicBool::new(false));
            let drops = Arc::new(AtomicUsize::new(0));
            let f = flag.clone();
            let d = drops.clone();
            let started = Arc::new(AtomicBool::new(false));
            let s = started.clone();
            let h = rt.spawn(move || {
                let _c = Counted(d);
                s.store(true, Ordering::SeqCst);
                while !f.load(Ordering::SeqCst) {
                    std::hint::spin_loop();
                }
                5u32
            });
            // others parked, one in a scope
            for _ in 0..3 {
                let d = drops.clone();
                rt.spawn(move || {
                    let _c = Counted(d);
                    stubborn_sleep();
                });
            }
            while !started.load(Ordering::SeqCst) {
                std::thread::sleep(ms(1));
            }
            wait_parked(&rt, 3);
            let (tx, rx) = mpsc::channel();
            std::thread::spawn(move || {
                let _ = tx.send(h.join().ok());
            });
            drop(rt);
            let at_drop = drops.load(Ordering::SeqCst);
            eprintln!("at_drop={at_drop}");
            flag.store(true, Ordering::SeqCst);
            let r = rx.recv_timeout(Duration::from_secs(10));
            assert!(r.is_ok(), "the joiner of the spinner never returned");
            let start = Instant::now();
            while drops.load(Ordering::SeqCst) < 4 && start.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(ms(5));
            }
            eprintln!("final={} joined={:?}", drops.load(Ordering::SeqCst), r);
            assert_eq!(drops.load(Ordering::SeqCst), 4, "not every destructor ran in the end");
            assert_eq!(
                at_drop, 3,
                "the non-stuck fibers were not all unwound when drop returned"
            );
        });
    });
}

// ---------------------------------------------------------------- cross runtime join
#[test]
fn a_fiber_of_one_runtime_joining_a_fiber_of_a_dropped_runtime_returns() {
    within(30, || {
        let a = rt_grace(2, ms(200));
        let b = rt_grace(2, ms(200));
        let h = a.spawn(stubborn_sleep);
        wait_parked(&a, 1);
        let j = b.spawn(move || h.join().is_err());
        std::thread::sleep(ms(20));
        drop(a);
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(j.join());
        });
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(10))
                .expect("join of b's fiber hung")
                .ok(),
            Some(true)
        );
        drop(b);
    });
}

// ---------------------------------------------------------------- waitgroup
#[test]
fn a_plain_thread_waiting_on_a_waitgroup_a_torn_down_fiber_holds_returns() {
    within(30, || {
        let rt = rt_grace(2, ms(200));
        let wg = fiber::sync::WaitGroup::new();
        let w2 = wg.clone();
        rt.spawn(move || {
            let _w = w2;
            stubborn_sleep();
        });
        let t = std::thread::spawn(move || wg.wait());
        wait_parked(&rt, 1);
        drop(rt);
        t.join().unwrap();
    });
}

/// A destructor that opens a scope and joins its child, run by teardown
/// (the fiber is unwound out of a lock-order deadlock). The child is
/// spawned during shutdown, so it is cancelled before it starts, and only
/// teardown's thread can run it to its end. The explicit join of a scoped
/// child was a non-cancellable wait, which an unwinding fiber at teardown
/// treated as a lock nothing would release: after 200 ms the process
/// aborted ("waits ... for a lock or a value that nothing will release
/// now"). It now waits as the scope's own exit does, parked at once, and
/// reports the child cancelled.
#[test]
fn a_scoped_join_in_a_destructor_run_by_teardown_reports_cancelled() {
    in_child(
        "a_scoped_join_in_a_destructor_run_by_teardown_reports_cancelled",
        60,
        || {
            within(40, || {
                static CANCELLED: AtomicUsize = AtomicUsize::new(0);
                struct JoinsAScopedChild;
                impl Drop for JoinsAScopedChild {
                    fn drop(&mut self) {
                        let r = fiber::scope(|s| s.spawn(|| 1).join());
                        if r.is_err_and(|e| e.is_cancelled()) {
                            CANCELLED.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
                let rt = rt_grace(2, ms(200));
                let m1 = Arc::new(fiber::sync::Mutex::new(()));
                let m2 = Arc::new(fiber::sync::Mutex::new(()));
                let both = Arc::new(fiber::sync::Barrier::new(2));
                for k in 0..2 {
                    let (a, b) = if k == 0 {
                        (m1.clone(), m2.clone())
                    } else {
                        (m2.clone(), m1.clone())
                    };
                    let both = both.clone();
                    rt.spawn(move || {
                        let _on_drop = JoinsAScopedChild;
                        let _ga = a.lock().unwrap();
                        let _ = both.wait();
                        // A lock-order deadlock: torn down at shutdown.
                        let _gb = b.lock();
                    });
                }
                wait_parked(&rt, 2);
                drop(rt);
                assert_eq!(CANCELLED.load(Ordering::SeqCst), 2);
            })
        },
    );
}
