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

/// A wait in a destructor while the fiber unwinds blocks its thread in
/// slices, leaving the waiter's queue between two of them: what completed
/// the wait in that gap (a condvar's notify, which then finds nobody to
/// wake) must be seen before the next slice queues the waiter again.
/// Here the gap's notify is certain (`unpublish` records it), so a wait
/// that did not look parked for good once its slices ran out.
#[test]
fn an_unwinding_wait_sees_what_completed_it_between_two_slices() {
    use fiber::core::{fiber_wait, Publish, WaitOptions, WaitResult, Waitable, Waiter};
    /// Never wakes its waiter; the notify lands just after a slice took
    /// the waiter off the queue.
    struct NotifiedInTheGap;
    impl Waitable for NotifiedInTheGap {
        type Io = bool;
        fn try_complete(&self, notified: &mut bool) -> Option<WaitResult> {
            notified.then_some(WaitResult::Ok)
        }
        fn publish(&self, _: &Waiter, _: &mut bool) -> Publish {
            Publish::Published
        }
        fn unpublish(&self, _: &Waiter, notified: &mut bool) -> Option<WaitResult> {
            *notified = true;
            None
        }
    }
    struct WaitsOnDrop(Arc<AtomicBool>);
    impl Drop for WaitsOnDrop {
        fn drop(&mut self) {
            let mut notified = false;
            let result = fiber_wait(&NotifiedInTheGap, &mut notified, WaitOptions::new());
            self.0.store(result == WaitResult::Ok, SeqCst);
        }
    }
    within(30, || {
        let rt = fixed(2, ms(200));
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        let h = rt.spawn(move || {
            let _w = WaitsOnDrop(d);
            std::panic::resume_unwind(Box::new("planned"));
        });
        assert!(h.join().is_err(), "the fiber panicked");
        assert!(done.load(SeqCst), "the wait ended with the notify it missed");
    });
}

/// A fiber that unwinds (its own panic) and waits in a destructor for a
/// lock a plain thread holds through the runtime's drop can be neither
/// unwound nor finished: the drop gives it up, its node still in the
/// lock's queue. The lock must stay usable by the threads that outlive the
/// runtime (spec/sync.md): the thread's release handed the lock to the
/// lost fiber (a `Mutex` waiter past the 1 ms starvation bound is handed
/// the lock; an `RwLock` reader at the head is counted in), and the
/// thread's next lock waited for ever.
#[test]
fn a_lock_released_after_its_waiter_was_given_up_at_shutdown_stays_usable() {
    use fiber::sync::{Mutex, RwLock};
    struct LocksOnDrop {
        mutex: Arc<Mutex<u32>>,
        rw: Arc<RwLock<u32>>,
        use_rw: bool,
    }
    impl Drop for LocksOnDrop {
        fn drop(&mut self) {
            if self.use_rw {
                let _g = self.rw.read();
            } else {
                let _g = self.mutex.lock();
            }
        }
    }
    for use_rw in [false, true] {
        within(60, move || {
            let mutex = Arc::new(Mutex::new(0u32));
            let rw = Arc::new(RwLock::new(0u32));
            let held = mutex.lock().unwrap();
            let written = rw.write().unwrap();
            let rt = fixed(1, ms(100));
            let entered = Arc::new(AtomicBool::new(false));
            let (m, r, e) = (mutex.clone(), rw.clone(), entered.clone());
            drop(rt.spawn(move || {
                let _l = LocksOnDrop {
                    mutex: m,
                    rw: r,
                    use_rw,
                };
                e.store(true, SeqCst);
                std::panic::resume_unwind(Box::new("planned"));
            }));
            // It blocks its worker for the unwinding-wait bound, then parks.
            crate::common::wait_parked(&rt, 1);
            assert!(entered.load(SeqCst));
            drop(rt);
            drop(held);
            drop(written);
            *mutex.lock().unwrap() += 1;
            *rw.write().unwrap() += 1;
            assert_eq!(
                (*mutex.lock().unwrap(), *rw.read().unwrap()),
                (1, 1),
                "use_rw: {use_rw}"
            );
        });
    }
}
