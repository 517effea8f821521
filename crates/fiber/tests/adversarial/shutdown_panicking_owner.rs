//! Adversarial: a runtime dropped while its dropping thread is
//! unwinding a panic (a plain thread that panics while it owns a runtime).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};

use crate::common::{in_child, ms, rt_grace, stubborn_sleep, wait_parked, within};

struct Counted(Arc<AtomicUsize>);
impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// Control: the same runtime dropped normally.
#[test]
fn control_lock_deadlock_and_stubborn_fibers_dropped_normally() {
    in_child("control_lock_deadlock_and_stubborn_fibers_dropped_normally", 60, || {
        within(40, || {
            let drops = Arc::new(AtomicUsize::new(0));
            let rt = build_scenario(&drops);
            drop(rt);
            assert_eq!(drops.load(Ordering::SeqCst), 4);
        });
    });
}

fn build_scenario(drops: &Arc<AtomicUsize>) -> fiber::Runtime {
    let rt = rt_grace(2, ms(200));
    // two fibers deadlocked on two fiber locks
    let a = Arc::new(fiber::sync::Mutex::new(()));
    let b = Arc::new(fiber::sync::Mutex::new(()));
    let (tx, rx) = mpsc::channel();
    for first in [true, false] {
        let (a, b, d, tx) = (a.clone(), b.clone(), drops.clone(), tx.clone());
        rt.spawn(move || {
            let _c = Counted(d);
            let (x, y) = if first { (a, b) } else { (b, a) };
            let _g1 = x.lock().unwrap_or_else(|e| e.into_inner());
            tx.send(()).unwrap();
            let _ = fiber::sleep(ms(30));
            let _g2 = y.lock().unwrap_or_else(|e| e.into_inner());
        });
    }
    rx.recv().unwrap();
    rx.recv().unwrap();
    // two fibers that ignore cancellation
    for _ in 0..2 {
        let d = drops.clone();
        rt.spawn(move || {
            let _c = Counted(d);
            stubborn_sleep();
        });
    }
    wait_parked(&rt, 4);
    std::thread::sleep(ms(50));
    rt
}

/// A thread that panics while it owns a runtime drops the runtime during
/// its unwind (the ordinary way a failing test or a `?`-less error path
/// ends). The runtime's shutdown must still unwind its fibers.
#[test]
fn a_runtime_dropped_during_a_panic_unwind_tears_its_fibers_down() {
    in_child(
        "a_runtime_dropped_during_a_panic_unwind_tears_its_fibers_down",
        60,
        || {
            within(40, || {
                let drops = Arc::new(AtomicUsize::new(0));
                let d = drops.clone();
                let r = std::panic::catch_unwind(move || {
                    let _rt = build_scenario(&d);
                    panic!("the owner of the runtime fails");
                });
                assert!(r.is_err());
                assert_eq!(drops.load(Ordering::SeqCst), 4, "destructors of the fibers did not run");
            });
        },
    );
}

/// Only fibers that ignore cancellation (no locks): no abort possible,
/// but are they torn down or leaked?
#[test]
fn stubborn_fibers_of_a_runtime_dropped_during_a_panic_unwind_are_torn_down() {
    in_child(
        "stubborn_fibers_of_a_runtime_dropped_during_a_panic_unwind_are_torn_down",
        60,
        || {
            within(40, || {
                let drops = Arc::new(AtomicUsize::new(0));
                let d = drops.clone();
                let r = std::panic::catch_unwind(move || {
                    let rt = rt_grace(2, ms(200));
                    for _ in 0..3 {
                        let d = d.clone();
                        rt.spawn(move || {
                            let _c = Counted(d);
                            stubborn_sleep();
                        });
                    }
                    wait_parked(&rt, 3);
                    let _rt = rt;
                    panic!("the owner of the runtime fails");
                });
                assert!(r.is_err());
                assert_eq!(drops.load(Ordering::SeqCst), 3, "destructors of the fibers did not run");
            });
        },
    );
}

/// A scope owner whose child ignores cancellation, dropped during a panic.
#[test]
fn a_scope_of_a_runtime_dropped_during_a_panic_unwind_is_torn_down() {
    in_child(
        "a_scope_of_a_runtime_dropped_during_a_panic_unwind_is_torn_down",
        60,
        || {
            within(40, || {
                let drops = Arc::new(AtomicUsize::new(0));
                let d = drops.clone();
                let r = std::panic::catch_unwind(move || {
                    let rt = rt_grace(2, ms(200));
                    let d2 = d.clone();
                    rt.spawn(move || {
                        let _c = Counted(d2.clone());
                        fiber::scope(|s| {
                            s.spawn(move || {
                                let _c = Counted(d2);
                                let (_tx, rx) = fiber::chan::bounded::<u8>(0);
                                loop {
                                    let _ = rx.recv();
                                }
                            });
                        });
                    });
                    wait_parked(&rt, 2);
                    let _rt = rt;
                    panic!("the owner of the runtime fails");
                });
                assert!(r.is_err());
                assert_eq!(drops.load(Ordering::SeqCst), 2, "destructors of the fibers did not run");
            });
        },
    );
}

/// Two fibers deadlocked on two `fiber::sync` locks (no fiber ignores
/// cancellation), the runtime dropped during its owner's panic unwind.
#[test]
fn a_lock_deadlock_of_a_runtime_dropped_during_a_panic_unwind_is_torn_down() {
    in_child(
        "a_lock_deadlock_of_a_runtime_dropped_during_a_panic_unwind_is_torn_down",
        60,
        || {
            within(40, || {
                let drops = Arc::new(AtomicUsize::new(0));
                let d = drops.clone();
                let r = std::panic::catch_unwind(move || {
                    let rt = rt_grace(2, ms(200));
                    let a = Arc::new(fiber::sync::Mutex::new(()));
                    let b = Arc::new(fiber::sync::Mutex::new(()));
                    let (tx, rx) = mpsc::channel();
                    for first in [true, false] {
                        let (a, b, d, tx) = (a.clone(), b.clone(), d.clone(), tx.clone());
                        rt.spawn(move || {
                            let _c = Counted(d);
                            let (x, y) = if first { (a, b) } else { (b, a) };
                            let _g1 = x.lock().unwrap_or_else(|e| e.into_inner());
                            tx.send(()).unwrap();
                            let _ = fiber::sleep(ms(30));
                            let _g2 = y.lock().unwrap_or_else(|e| e.into_inner());
                        });
                    }
                    rx.recv().unwrap();
                    rx.recv().unwrap();
                    wait_parked(&rt, 2);
                    let _rt = rt;
                    panic!("the owner of the runtime fails");
                });
                assert!(r.is_err());
                assert_eq!(drops.load(Ordering::SeqCst), 2, "destructors of the fibers did not run");
            });
        },
    );
}

/// Control for the above: the same, dropped without a panic.
#[test]
fn control_a_lock_deadlock_dropped_normally_is_torn_down() {
    in_child("control_a_lock_deadlock_dropped_normally_is_torn_down", 60, || {
        within(40, || {
            let drops = Arc::new(AtomicUsize::new(0));
            let d = drops.clone();
            let rt = rt_grace(2, ms(200));
            let a = Arc::new(fiber::sync::Mutex::new(()));
            let b = Arc::new(fiber::sync::Mutex::new(()));
            let (tx, rx) = mpsc::channel();
            for first in [true, false] {
                let (a, b, d, tx) = (a.clone(), b.clone(), d.clone(), tx.clone());
                rt.spawn(move || {
                    let _c = Counted(d);
                    let (x, y) = if first { (a, b) } else { (b, a) };
                    let _g1 = x.lock().unwrap_or_else(|e| e.into_inner());
                    tx.send(()).unwrap();
                    let _ = fiber::sleep(ms(30));
                    let _g2 = y.lock().unwrap_or_else(|e| e.into_inner());
                });
            }
            rx.recv().unwrap();
            rx.recv().unwrap();
            wait_parked(&rt, 2);
            drop(rt);
            assert_eq!(drops.load(Ordering::SeqCst), 2);
        });
    });
}
