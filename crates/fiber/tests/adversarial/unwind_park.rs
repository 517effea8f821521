//! A fiber that waits in a destructor while a panic unwinds its stack (a
//! flush, a notify, a sleep) parks mid-unwind once its wait outlasts
//! `UNWINDING_WAIT_BOUND`. std counts "this thread is panicking" per OS
//! thread, so the runtime has to keep that fiber's panic to itself: the
//! other fibers of its worker must not look panicking (no poisoned locks,
//! no slow waits, `yield_now` still yields), the unwind must end on the
//! thread it began on, and teardown must finish such a fiber before it
//! unwinds the next one.

use crate::common::{in_child, ms, within};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn fixed(workers: usize, grace: Duration) -> fiber::Runtime {
    crate::common::rt_fixed_grace(workers, grace)
}

/// A destructor that waits (a flush, a notify).
struct SlowDrop(Duration);
impl Drop for SlowDrop {
    fn drop(&mut self) {
        let _ = fiber::sleep(self.0);
    }
}

/// Teardown: a fiber whose destructor (run by the shutdown unwind) opens
/// a scope parks mid-unwind on the shutdown thread until the scope's child
/// has run; the fibers after it are unwound once it is done, not given up.
#[test]
fn teardown_runs_every_destructor_when_one_opens_a_scope() {
    in_child("teardown_runs_every_destructor_when_one_opens_a_scope", 60, || {
        within(40, || {
            static OPENED: AtomicUsize = AtomicUsize::new(0);
            static PLAIN: AtomicUsize = AtomicUsize::new(0);
            struct OpensAScope;
            impl Drop for OpensAScope {
                fn drop(&mut self) {
                    fiber::scope(|s| {
                        s.spawn(|| ());
                    });
                    OPENED.fetch_add(1, SeqCst);
                }
            }
            struct Plain;
            impl Drop for Plain {
                fn drop(&mut self) {
                    PLAIN.fetch_add(1, SeqCst);
                }
            }
            let rt = fixed(1, ms(50));
            // Fibers that ignore cancellation: only teardown unwinds them.
            rt.spawn(|| {
                let _g = Plain;
                loop {
                    let _ = fiber::sleep(ms(5));
                }
            });
            rt.spawn(|| {
                let _g = OpensAScope;
                loop {
                    let _ = fiber::sleep(ms(5));
                }
            });
            std::thread::sleep(ms(30));
            drop(rt);
            assert_eq!(
                (OPENED.load(SeqCst), PLAIN.load(SeqCst)),
                (1, 1),
                "(scope-opening, plain) destructors run"
            );
        });
    });
}

/// std: a mutex is poisoned when a thread panics while holding it. Here the
/// holder never panics; another fiber of the same worker is parked in the
/// middle of an unrelated unwind when the holder releases the lock.
#[test]
fn no_poison_without_a_panicking_holder() {
    within(30, || {
        let poisoned = fixed(1, ms(500)).block_on(|| {
            let m = Arc::new(fiber::sync::Mutex::new(0u32));
            let m2 = m.clone();
            let holder = fiber::spawn(move || {
                let mut g = m2.lock().unwrap();
                let _ = fiber::sleep(ms(300));
                *g += 1;
            });
            fiber::sleep(ms(10)).unwrap();
            let other = fiber::spawn(|| {
                let _d = SlowDrop(ms(400));
                panic!("unrelated panic");
            });
            holder.join().unwrap();
            assert!(other.join().unwrap_err().is_panic());
            m.is_poisoned()
        });
        assert!(!poisoned, "poisoned although its holder never panicked");
    });
}

/// The other fibers of the worker still park (not block the thread) while
/// one is parked mid-unwind: ten rendezvous sends take microseconds, not
/// the unwinding wait's 200 ms bound each.
#[test]
fn waits_of_other_fibers_are_not_slowed_by_a_fiber_parked_mid_unwind() {
    within(60, || {
        let elapsed = fixed(1, ms(500)).block_on(|| {
            let a = fiber::spawn(|| {
                let _d = SlowDrop(Duration::from_secs(3));
                panic!("unrelated panic");
            });
            fiber::sleep(ms(300)).unwrap();
            let (tx, rx) = fiber::chan::bounded::<u32>(0);
            let start = Instant::now();
            let b = fiber::spawn(move || {
                for i in 0..10 {
                    tx.send(i).unwrap();
                }
            });
            for _ in 0..10 {
                rx.recv().unwrap();
            }
            b.join().unwrap();
            let e = start.elapsed();
            assert!(a.join().unwrap_err().is_panic());
            e
        });
        assert!(elapsed < ms(200), "10 rendezvous sends took {elapsed:?}");
    });
}

/// `yield_now` still yields to the scheduler while a neighbour is parked
/// mid-unwind: a yield loop waiting for a fiber it spawned ends (it hung
/// for good with growth off: the yield had become a thread yield).
#[test]
fn yield_now_still_yields_while_a_fiber_is_parked_mid_unwind() {
    within(20, || {
        fixed(1, ms(500)).block_on(|| {
            let a = fiber::spawn(|| {
                let _d = SlowDrop(Duration::from_secs(1));
                panic!("unrelated panic");
            });
            fiber::sleep(ms(300)).unwrap();
            let flag = Arc::new(AtomicBool::new(false));
            let f2 = flag.clone();
            let setter = fiber::spawn(move || f2.store(true, SeqCst));
            while !flag.load(SeqCst) {
                fiber::yield_now().unwrap();
            }
            setter.join().unwrap();
            assert!(a.join().unwrap_err().is_panic());
        });
    });
}

/// An unwind that parked ends on the thread it began on: afterwards no
/// worker thread counts as panicking. (Finished on the other worker, it
/// left its own thread panicking for good and the other's count wrapped.)
/// Two workers, with fibers that keep both busy while the unwinder sleeps,
/// so that whichever worker is free takes its wake-up.
#[test]
fn a_parked_unwind_ends_on_its_own_thread() {
    within(60, || {
        let seen = fixed(2, ms(500)).block_on(|| {
            let unwinders: Vec<_> = (0..4)
                .map(|_| {
                    fiber::spawn(|| {
                        let _d = SlowDrop(ms(300));
                        panic!("unrelated panic");
                    })
                })
                .collect();
            // Keep both workers turning, and let fibers move between them.
            let stop = Arc::new(AtomicBool::new(false));
            let busy: Vec<_> = (0..4)
                .map(|_| {
                    let stop = stop.clone();
                    fiber::spawn(move || {
                        while !stop.load(SeqCst) {
                            let spin = Instant::now();
                            while spin.elapsed() < Duration::from_micros(200) {}
                            let _ = fiber::yield_now();
                        }
                    })
                })
                .collect();
            for u in unwinders {
                assert!(u.join().unwrap_err().is_panic());
            }
            stop.store(true, SeqCst);
            for b in busy {
                b.join().unwrap();
            }
            // Every worker thread is clean again.
            let checks: Vec<_> = (0..200)
                .map(|_| {
                    fiber::spawn(|| {
                        let _ = fiber::yield_now();
                        std::thread::panicking()
                    })
                })
                .collect();
            checks.into_iter().map(|c| c.join().unwrap()).filter(|p| *p).count()
        });
        assert_eq!(
            seen, 0,
            "fibers saw their worker thread panicking after every unwind had ended"
        );
    });
}

/// Shutdown while a fiber is parked mid-unwind (kept on its worker): its
/// destructor's sleep is cancelled in the grace time, the unwind ends on
/// its worker, its destructor runs once, and the drop returns promptly.
#[test]
fn shutdown_while_a_fiber_is_parked_mid_unwind() {
    in_child("shutdown_while_a_fiber_is_parked_mid_unwind", 60, || {
        static DROPS: AtomicUsize = AtomicUsize::new(0);
        struct CountedSlowDrop;
        impl Drop for CountedSlowDrop {
            fn drop(&mut self) {
                let _ = fiber::sleep(Duration::MAX);
                DROPS.fetch_add(1, SeqCst);
            }
        }
        let elapsed = within(40, || {
            let rt = fixed(2, ms(200));
            for _ in 0..4 {
                rt.spawn(|| {
                    let _d = CountedSlowDrop;
                    panic!("unrelated panic");
                });
            }
            // Until all four are parked mid-unwind (past the unwinding
            // wait's bound, each blocks its worker for up to 200 ms first,
            // so the last two start only after that; on a loaded machine
            // a fixed pause was not always long enough for them to start).
            crate::common::wait_parked(&rt, 4);
            let start = Instant::now();
            drop(rt);
            start.elapsed()
        });
        assert!(elapsed < Duration::from_secs(10), "shutdown took {elapsed:?}");
        assert_eq!(DROPS.load(SeqCst), 4, "every destructor ran once");
    });
}
