use crate::common::*;

// Adversarial review, round 56: `fiber::sync` and the thread-like API
// checked against what `std::sync` and `std::thread` document, with plain
// OS threads and fibers sharing one primitive, and runtimes dropped while
// fibers wait on (or hold) a primitive that plain threads go on using.
//
// Expected: std's documented behaviour, and spec/sync.md (sections 2, 3,
// 4, 5a).

use fiber::sync::{Barrier, Condvar, Mutex, Once, OnceLock, RwLock, Semaphore, WaitGroup};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------
// (a) A runtime dropped while its fibers wait on, or hold, a primitive that
// plain threads go on using.

/// spec/sync.md 5a: a fiber parked in `Barrier::wait` at shutdown is
/// cancelled and withdraws its arrival. Two plain threads then make up
/// each generation on their own: one leader per generation. (Had the
/// arrival stayed counted, the first thread would be released alone and
/// the second would wait for ever.)
#[test]
fn a_barrier_arrival_of_a_fiber_is_withdrawn_at_shutdown_and_threads_pair_up_after() {
    within(30, || {
        let barrier = Arc::new(Barrier::new(2));
        let rt = rt2();
        let b = barrier.clone();
        let (tx, rx) = mpsc::channel();
        // (A fiber cancelled by shutdown joins as cancelled whatever it
        // returns: the wait's result goes out through a channel.)
        let h = rt.spawn(move || tx.send(b.wait().is_cancelled()).unwrap());
        wait_parked(&rt, 1);
        drop(rt);
        assert!(h.join().is_err());
        assert_eq!(
            rx.try_recv().ok(),
            Some(true),
            "the parked arrival was not cancelled at shutdown"
        );
        assert_eq!(barrier.generation(), 0, "a withdrawn arrival released a generation");
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let b = barrier.clone();
                std::thread::spawn(move || (0..3).map(|_| b.wait().is_leader() as usize).sum::<usize>())
            })
            .collect();
        let leaders: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(leaders, 3, "one leader per generation");
        assert_eq!(barrier.generation(), 3);
    });
}

/// A fiber's condvar wait is cancelled at shutdown while a plain thread
/// holds the mutex: the wait's re-lock waits through the grace time and is
/// unwound at teardown. Afterwards the mutex is free once the thread lets
/// go, and the condvar no longer binds that mutex (a wait with another one
/// does not panic "two mutexes").
#[test]
fn a_condvar_waiter_unwound_while_relocking_at_shutdown_leaves_the_mutex_and_condvar_usable() {
    within(30, || {
        let m = Arc::new(Mutex::new(0u32));
        let cv = Arc::new(Condvar::new());
        let rt = rt2();
        let (m2, cv2) = (m.clone(), cv.clone());
        let h = rt.spawn(move || {
            let g = m2.lock().unwrap();
            let g = cv2.wait(g).unwrap_or_else(|e| e.into_inner());
            *g
        });
        wait_parked(&rt, 1);
        // The waiter released the mutex for its wait: this thread takes it
        // and keeps it while the runtime shuts down.
        let held = m.lock().unwrap();
        drop(rt);
        assert!(
            h.join().is_err(),
            "the waiter could not re-lock: it cannot have returned"
        );
        drop(held);
        // The mutex is free (the unwound waiter never held it again).
        let g = match m.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => panic!("the mutex stayed locked after the unwound wait"),
        };
        drop(g);
        // The condvar's binding to `m` ended with the unwound wait.
        let other = Mutex::new(());
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let (_g, t) = cv.wait_timeout(other.lock().unwrap(), ms(1)).unwrap();
            t.timed_out()
        }));
        assert_eq!(
            r.ok(),
            Some(true),
            "a wait with another mutex after the unwound one panicked"
        );
        // And one waiter, one notification, across threads still work.
        let (m3, cv3) = (m.clone(), cv.clone());
        let t = std::thread::spawn(move || {
            let g = m3.lock().unwrap_or_else(|e| e.into_inner());
            let (g, _) = cv3
                .wait_timeout_while(g, Duration::from_secs(10), |v| *v == 0)
                .unwrap_or_else(|e| e.into_inner());
            *g
        });
        std::thread::sleep(ms(5));
        *m.lock().unwrap_or_else(|e| e.into_inner()) = 7;
        cv.notify_all();
        assert_eq!(t.join().unwrap(), 7);
    });
}

/// A `OnceLock` initializer running in a fiber that shutdown unwinds (it
/// ignores its cancellation) leaves the cell empty, as a panicking
/// initializer does; a plain thread waiting in `get_or_init` meanwhile then
/// runs its own initializer.
#[test]
fn a_once_lock_initializer_unwound_at_shutdown_lets_a_waiting_thread_initialize() {
    within(30, || {
        let cell = Arc::new(OnceLock::<u32>::new());
        let started = Arc::new(AtomicBool::new(false));
        let rt = rt2();
        let (c, s) = (cell.clone(), started.clone());
        let h = rt.spawn(move || {
            *c.get_or_init(|| {
                s.store(true, Ordering::SeqCst);
                stubborn_sleep();
                1
            })
        });
        assert!(spin_until(&started, Duration::from_secs(10)));
        let c = cell.clone();
        let t = std::thread::spawn(move || *c.get_or_init(|| 2));
        std::thread::sleep(ms(20));
        assert!(!t.is_finished(), "the thread did not wait for the running initializer");
        drop(rt);
        assert!(h.join().is_err());
        assert_eq!(
            t.join().unwrap(),
            2,
            "the waiting thread did not run its own initializer"
        );
        assert_eq!(cell.get(), Some(&2));
    });
}

/// As above for `Once`: a closure unwound at shutdown is an unwinding
/// closure, which poisons (std). A thread waiting in `call_once` panics
/// with std's message; `call_once_force` then runs with `is_poisoned()`
/// and completes the `Once`.
#[test]
fn a_once_closure_unwound_at_shutdown_poisons_and_call_once_force_recovers() {
    within(30, || {
        let once = Arc::new(Once::new());
        let started = Arc::new(AtomicBool::new(false));
        let rt = rt2();
        let (o, s) = (once.clone(), started.clone());
        let h = rt.spawn(move || {
            o.call_once(|| {
                s.store(true, Ordering::SeqCst);
                stubborn_sleep();
            })
        });
        assert!(spin_until(&started, Duration::from_secs(10)));
        let o = once.clone();
        let ran = Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        let t = std::thread::spawn(move || panic_message(|| o.call_once(|| r.store(true, Ordering::SeqCst))));
        std::thread::sleep(ms(20));
        drop(rt);
        assert!(h.join().is_err());
        let msg = t.join().unwrap();
        assert!(
            !ran.load(Ordering::SeqCst),
            "call_once ran its closure on a poisoned Once"
        );
        assert_eq!(msg.as_deref(), Some("Once instance has previously been poisoned"));
        assert!(!once.is_completed());
        let mut seen = None;
        once.call_once_force(|state| seen = Some(state.is_poisoned()));
        assert_eq!(seen, Some(true));
        assert!(once.is_completed());
        once.wait();
    });
}

/// Fibers holding a `WaitGroup` member each, never reaching a
/// cancellation point: a plain thread's `wait` returns once the runtime's
/// teardown unwinds them (their members are dropped by the unwind).
#[test]
fn a_thread_waiting_on_a_wait_group_returns_when_shutdown_unwinds_the_members() {
    within(30, || {
        let wg = WaitGroup::new();
        let rt = rt2();
        let handles: Vec<_> = (0..3)
            .map(|_| {
                let member = wg.clone();
                rt.spawn(move || {
                    let _member = member;
                    stubborn_sleep();
                })
            })
            .collect();
        wait_parked(&rt, 3);
        let t = std::thread::spawn(move || wg.wait());
        std::thread::sleep(ms(10));
        assert!(!t.is_finished());
        drop(rt);
        t.join().unwrap();
        for h in handles {
            assert!(h.join().is_err());
        }
    });
}

/// Permit holders that shutdown unwinds give their permits back, and
/// queued fiber waiters leave the queue: a plain thread queued behind them
/// for every permit gets them, and the count is whole afterwards.
#[test]
fn semaphore_permits_return_when_holders_and_waiters_are_unwound_at_shutdown() {
    within(30, || {
        let sem = Arc::new(Semaphore::new(2));
        let rt = rt2();
        let mut handles = Vec::new();
        for _ in 0..2 {
            let s = sem.clone();
            handles.push(rt.spawn(move || {
                let _p = s.acquire().unwrap();
                stubborn_sleep();
            }));
        }
        wait_parked(&rt, 2);
        assert_eq!(sem.available_permits(), 0);
        for _ in 0..3 {
            let s = sem.clone();
            handles.push(rt.spawn(move || {
                let _p = s.acquire_many(1);
            }));
        }
        wait_parked(&rt, 5);
        let s = sem.clone();
        let t = std::thread::spawn(move || s.acquire_many(2).map(|p| p.num_permits()).ok());
        std::thread::sleep(ms(10));
        drop(rt);
        assert_eq!(t.join().unwrap(), Some(2), "the thread did not get the permits back");
        assert_eq!(sem.available_permits(), 2);
        assert!(sem.try_acquire_many(2).is_some());
        for h in handles {
            let _ = h.join();
        }
    });
}

/// std: a write guard dropped by an unwind poisons an `RwLock`, a read
/// guard does not. The Mutex rustdoc says a guard held by a fiber that
/// shutdown unwinds poisons as a thread's unwind would: the same for the
/// two guards of an `RwLock`. Both locks are free afterwards.
#[test]
fn rwlock_guards_held_by_fibers_unwound_at_shutdown_poison_as_std_unwinds_do() {
    within(30, || {
        let written = Arc::new(RwLock::new(0u32));
        let read = Arc::new(RwLock::new(0u32));
        let rt = rt2();
        let w = written.clone();
        let h1 = rt.spawn(move || {
            let _g = w.write().unwrap();
            stubborn_sleep();
        });
        let r = read.clone();
        let h2 = rt.spawn(move || {
            let _g = r.read().unwrap();
            stubborn_sleep();
        });
        wait_parked(&rt, 2);
        drop(rt);
        assert!(h1.join().is_err() && h2.join().is_err());
        assert!(
            written.is_poisoned(),
            "a write guard dropped by the teardown unwind did not poison"
        );
        assert!(!read.is_poisoned(), "a read guard poisoned");
        assert!(matches!(written.try_write(), Err(std::sync::TryLockError::Poisoned(_))));
        assert!(read.try_write().is_ok());
    });
}

/// A plain thread holds an `RwLock` for writing while fiber readers and a
/// fiber writer queue behind it; the runtime is dropped. When the thread
/// lets go, nothing is handed to the unwound fibers: the lock is free.
#[test]
fn rwlock_waiters_unwound_at_shutdown_behind_a_thread_writer_leave_the_lock_free() {
    within(30, || {
        let lock = Arc::new(RwLock::new(0u32));
        let held = lock.write().unwrap();
        let rt = rt2();
        let mut handles = Vec::new();
        for i in 0..4 {
            let l = lock.clone();
            handles.push(rt.spawn(move || {
                if i % 2 == 0 {
                    *l.read().unwrap()
                } else {
                    let mut g = l.write().unwrap();
                    *g += 1;
                    *g
                }
            }));
        }
        wait_parked(&rt, 4);
        drop(rt);
        for h in handles {
            assert!(h.join().is_err(), "a fiber got the lock the thread still held");
        }
        drop(held);
        assert!(
            lock.try_write().is_ok(),
            "the lock is not free after the waiters were unwound"
        );
        assert!(lock.try_read().is_ok());
        assert_eq!(*lock.read().unwrap(), 0);
        assert!(!lock.is_poisoned());
    });
}

// ---------------------------------------------------------------------------
// (b) Plain threads and fibers competing.

/// spec/sync.md 4: a waiter that has waited 1 ms gets the lock handed over.
/// A plain thread competing with two fibers that re-lock in a tight loop
/// gets the lock every time it asks, promptly.
#[test]
fn a_thread_waiting_for_a_mutex_is_not_starved_by_fibers_relocking_in_a_loop() {
    within(60, || {
        let m = Arc::new(Mutex::new(0u64));
        let stop = Arc::new(AtomicBool::new(false));
        let rt = rt2();
        let hammers: Vec<_> = (0..2)
            .map(|_| {
                let (m, stop) = (m.clone(), stop.clone());
                rt.spawn(move || {
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let mut g = m.lock().unwrap();
                        let t = Instant::now();
                        while t.elapsed() < Duration::from_micros(20) {
                            std::hint::spin_loop();
                        }
                        *g += 1;
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        // Let the hammers get going.
        while *m.lock().unwrap() < 100 {
            std::thread::yield_now();
        }
        let start = Instant::now();
        let mut worst = Duration::ZERO;
        for _ in 0..50 {
            let t = Instant::now();
            let g = m.lock().unwrap();
            worst = worst.max(t.elapsed());
            drop(g);
        }
        stop.store(true, Ordering::Relaxed);
        // The hammers together (one of them may not have had a turn yet:
        // two spawned from a plain thread can share a worker, the second
        // waiting for the first's operation-budget yield, 2 ms in, while
        // the 50 locks can take less).
        let rounds: u64 = hammers.into_iter().map(|h| h.join().unwrap()).sum();
        assert!(rounds > 0);
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "50 thread locks took {:?} (worst {worst:?})",
            start.elapsed()
        );
    });
}

/// spec/sync.md 3.2: once a writer waits, new readers queue behind it. A
/// plain-thread writer waiting behind fiber readers that keep overlapping
/// read sections gets in, every time it asks.
#[test]
fn a_thread_writer_is_not_starved_by_overlapping_fiber_readers() {
    within(60, || {
        let lock = Arc::new(RwLock::new(0u64));
        let stop = Arc::new(AtomicBool::new(false));
        let reads = Arc::new(AtomicUsize::new(0));
        let rt = rt2();
        let readers: Vec<_> = (0..4)
            .map(|_| {
                let (lock, stop, reads) = (lock.clone(), stop.clone(), reads.clone());
                rt.spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let g = lock.read().unwrap();
                        // Hold across a park: the other readers overlap.
                        let _ = fiber::sleep(Duration::from_micros(200));
                        let _ = *g;
                        drop(g);
                        reads.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        while reads.load(Ordering::Relaxed) < 20 {
            std::thread::yield_now();
        }
        for i in 1..=30u64 {
            let mut g = lock.write().unwrap();
            *g = i;
        }
        stop.store(true, Ordering::Relaxed);
        for h in readers {
            h.join().unwrap();
        }
        assert_eq!(*lock.read().unwrap(), 30);
    });
}

/// A plain-thread writer queued behind fiber readers stops new fiber
/// readers (`try_read` is `WouldBlock`), and a reader arriving after it
/// reads what the writer wrote (FIFO).
#[test]
fn a_queued_thread_writer_goes_before_fiber_readers_that_arrive_after_it() {
    on_runtime(|| {
        let lock = Arc::new(RwLock::new(0u32));
        let first = lock.read().unwrap();
        let l = lock.clone();
        let writer = std::thread::spawn(move || *l.write().unwrap() = 5);
        // Wait until the writer is queued: new readers are refused then.
        wait_until("the thread writer to queue", 10, || {
            matches!(lock.try_read(), Err(std::sync::TryLockError::WouldBlock))
        });
        let l = lock.clone();
        let late = fiber::spawn(move || *l.read().unwrap());
        fiber::sleep(ms(5)).unwrap();
        assert!(!late.is_finished(), "a reader passed the waiting writer");
        drop(first);
        assert_eq!(late.join().unwrap(), 5, "the late reader went before the queued writer");
        writer.join().unwrap();
    });
}

/// No lost notification: with two waiters, one timed (about to time out)
/// and one not, a single `notify_one` wakes at least one of them: either
/// the timed waiter reports it was notified, or the other one wakes. The
/// timed waiter is a fiber or a plain thread in turns.
#[test]
fn notify_one_racing_a_timeout_is_never_lost() {
    within(120, || {
        let rt = rt2();
        rt.block_on(|| {
            for round in 0..150u32 {
                let pair = Arc::new((Mutex::new(()), Condvar::new()));
                let p = pair.clone();
                let timed_wait = move || {
                    let (m, cv) = &*p;
                    let g = m.lock().unwrap();
                    let (_g, r) = cv
                        .wait_timeout(g, Duration::from_micros(200 + (round as u64 % 7) * 150))
                        .unwrap();
                    r.timed_out()
                };
                let (tx, rx) = mpsc::channel();
                let thread_waiter = if round % 2 == 0 {
                    let _ = fiber::spawn(move || tx.send(timed_wait()).unwrap());
                    None
                } else {
                    Some(std::thread::spawn(move || tx.send(timed_wait()).unwrap()))
                };
                let p = pair.clone();
                let other = fiber::spawn(move || {
                    let (m, cv) = &*p;
                    let g = m.lock().unwrap();
                    let (_g, r) = cv.wait_timeout(g, Duration::from_secs(5)).unwrap();
                    r.timed_out()
                });
                wait_fiber_parked(other.id());
                {
                    let (m, cv) = &*pair;
                    let _g = m.lock().unwrap();
                    cv.notify_one();
                }
                let timed_out = fiber::blocking(move || rx.recv().unwrap());
                if let Some(t) = thread_waiter {
                    t.join().unwrap();
                }
                if !timed_out {
                    // The timed waiter took the notification: release the other.
                    let (m, cv) = &*pair;
                    let _g = m.lock().unwrap();
                    cv.notify_one();
                }
                let other_timed_out = other.join().unwrap();
                assert!(
                    !(timed_out && other_timed_out),
                    "round {round}: one notify_one, and both waiters report a timeout"
                );
            }
        });
    });
}

/// std: `wait_while` evaluates the condition with the lock held. Checked
/// from inside the condition (`try_lock` must fail) in a fiber and on a
/// plain thread, with a notifier of the other kind.
#[test]
fn wait_while_runs_its_condition_under_the_lock_in_fibers_and_threads() {
    on_runtime(|| {
        let pair = Arc::new((Mutex::new(0u32), Condvar::new()));
        let unlocked_checks = Arc::new(AtomicUsize::new(0));
        let waiter = |pair: Arc<(Mutex<u32>, Condvar)>, bad: Arc<AtomicUsize>| {
            move || {
                let (m, cv) = &*pair;
                let g = cv
                    .wait_while(m.lock().unwrap(), |v| {
                        if !matches!(m.try_lock(), Err(std::sync::TryLockError::WouldBlock)) {
                            bad.fetch_add(1, Ordering::SeqCst);
                        }
                        *v < 50
                    })
                    .unwrap();
                *g
            }
        };
        let f = fiber::spawn(waiter(pair.clone(), unlocked_checks.clone()));
        let t = std::thread::spawn(waiter(pair.clone(), unlocked_checks.clone()));
        let p = pair.clone();
        let notifier = std::thread::spawn(move || {
            for _ in 0..50 {
                *p.0.lock().unwrap() += 1;
                p.1.notify_all();
                std::thread::yield_now();
            }
        });
        for _ in 0..50 {
            fiber::yield_now().unwrap();
            pair.1.notify_all();
        }
        notifier.join().unwrap();
        pair.1.notify_all();
        assert_eq!(f.join().unwrap(), 50);
        assert_eq!(t.join().unwrap(), 50);
        assert_eq!(
            unlocked_checks.load(Ordering::SeqCst),
            0,
            "the condition ran without the lock"
        );
    });
}

/// A cancelled party withdraws its arrival (`is_cancelled`, not leader);
/// the generation then needs n live parties, fibers and plain threads
/// mixed, and has exactly one leader.
#[test]
fn barrier_generation_after_a_cancelled_party_needs_n_live_ones_with_one_leader() {
    on_runtime(|| {
        let barrier = Arc::new(Barrier::new(3));
        for generation in 1..=3u64 {
            let b = barrier.clone();
            let (tx, rx) = mpsc::channel();
            // (A cancelled fiber joins as cancelled whatever it returns.)
            let quitter = fiber::spawn(move || tx.send(b.wait()).unwrap());
            wait_fiber_parked(quitter.id());
            quitter.cancel();
            assert!(quitter.join().unwrap_err().is_cancelled());
            let r = rx.try_recv().unwrap();
            assert!(r.is_cancelled() && !r.is_leader());
            assert_eq!(barrier.generation(), generation - 1);
            let b = barrier.clone();
            let f = fiber::spawn(move || b.wait());
            let b = barrier.clone();
            let t = std::thread::spawn(move || b.wait());
            wait_fiber_parked(f.id());
            fiber::sleep(ms(2)).unwrap();
            assert_eq!(
                barrier.generation(),
                generation - 1,
                "released with a withdrawn arrival"
            );
            let mine = barrier.wait();
            let results = [mine, f.join().unwrap(), t.join().unwrap()];
            assert_eq!(results.iter().filter(|r| r.is_leader()).count(), 1);
            assert!(results.iter().all(|r| !r.is_cancelled()));
            assert_eq!(barrier.generation(), generation);
        }
    });
}

// ---------------------------------------------------------------------------
// (c) The thread-like API.

/// std: "once `is_finished` returns true, `join` can be expected to return
/// quickly, without blocking". A plain thread joins a finished fiber while
/// the one worker is busy (the root fiber spins without a yield point).
#[test]
fn join_from_a_thread_after_is_finished_needs_no_worker() {
    within(30, || {
        let rt = rt1();
        rt.block_on(|| {
            let h = fiber::spawn(|| 5u32);
            while !h.is_finished() {
                fiber::yield_now().unwrap();
            }
            let done = Arc::new(AtomicBool::new(false));
            let d = done.clone();
            let t = std::thread::spawn(move || {
                let v = h.join();
                d.store(true, Ordering::Release);
                v.ok()
            });
            assert!(
                spin_until(&done, Duration::from_secs(5)),
                "the join of a finished fiber waited for the busy worker"
            );
            assert_eq!(t.join().unwrap(), Some(5));
        });
    });
}

/// std: joining a panicked thread gives `Err` with the payload; here the
/// error also names the fiber. From a plain thread, and from a fiber.
#[test]
fn joining_a_named_panicked_fiber_gives_payload_and_name_from_threads_and_fibers() {
    on_runtime(|| {
        for from_thread in [false, true] {
            let h = fiber::Builder::new()
                .name("boom")
                .spawn(|| -> u32 { std::panic::panic_any(7u8) })
                .unwrap();
            let err = if from_thread {
                std::thread::spawn(move || h.join().unwrap_err()).join().unwrap()
            } else {
                h.join().unwrap_err()
            };
            assert!(err.is_panic() && !err.is_cancelled());
            assert_eq!(err.name(), Some("boom"));
            assert!(err.to_string().contains("boom"), "{err}");
            assert_eq!(err.into_panic().downcast_ref::<u8>(), Some(&7));
        }
    });
}

/// A fiber mutex guard kept across parks (the fiber may move to the other
/// worker) and then dropped by a panic poisons the lock for fibers and
/// threads alike; `PoisonError::into_inner` gives the value the holder
/// wrote, and `clear_poison` clears it for everyone.
#[test]
fn a_guard_moved_across_workers_and_dropped_by_a_panic_poisons_for_threads_too() {
    on_runtime(|| {
        let m = Arc::new(Mutex::new(0u32));
        let m2 = m.clone();
        let h = fiber::spawn(move || {
            let mut g = m2.lock().unwrap();
            for i in 0..20 {
                *g = i;
                fiber::sleep(Duration::from_micros(100)).unwrap();
            }
            panic!("holder fails");
        });
        assert!(h.join().unwrap_err().is_panic());
        let m3 = m.clone();
        let from_thread = std::thread::spawn(move || match m3.lock() {
            Ok(_) => None,
            Err(p) => Some(*p.into_inner()),
        })
        .join()
        .unwrap();
        assert_eq!(from_thread, Some(19));
        assert!(m.is_poisoned());
        m.clear_poison();
        let m4 = m.clone();
        assert!(std::thread::spawn(move || m4.lock().is_ok()).join().unwrap());
        assert!(m.lock().is_ok());
    });
}

// ---------------------------------------------------------------------------
// (d) Waits inside `non_cancellable` and during an unwind.

/// `non_cancellable`: "inside it, waits are not interrupted by a cancelled
/// task or job". A cancelled fiber's timed condvar wait inside a section
/// lasts its duration (std: `timed_out` only once the time has passed),
/// and its `wait_while` waits for the condition, not for the
/// cancellation.
#[test]
fn condvar_waits_inside_non_cancellable_of_a_cancelled_fiber_wait_as_std() {
    on_runtime(|| {
        let pair = Arc::new((Mutex::new(false), Condvar::new()));
        let p = pair.clone();
        let (tx, rx) = mpsc::channel();
        let h = fiber::spawn(move || {
            while fiber::sleep(ms(1)).is_ok() {}
            let (m, cv) = &*p;
            let out = fiber::non_cancellable(|| {
                let t = Instant::now();
                let (g, r) = cv.wait_timeout(m.lock().unwrap(), ms(30)).unwrap();
                let timed = (t.elapsed(), r.timed_out());
                let g = cv.wait_while(g, |ready| !*ready).unwrap();
                (timed, *g)
            });
            tx.send(out).unwrap();
        });
        fiber::sleep(ms(3)).unwrap();
        h.cancel();
        fiber::sleep(ms(60)).unwrap();
        assert!(
            rx.try_recv().is_err(),
            "wait_while returned in the section before the condition held"
        );
        *pair.0.lock().unwrap() = true;
        pair.1.notify_all();
        assert!(h.join().unwrap_err().is_cancelled());
        let ((elapsed, timed_out), ready) = rx.recv().unwrap();
        assert!(timed_out);
        assert!(
            elapsed >= ms(30),
            "a 30 ms wait_timeout in the section ended after {elapsed:?}"
        );
        assert!(ready, "wait_while returned with the condition still true");
    });
}

/// The same for `Barrier::wait`, `Semaphore::acquire` and
/// `WaitGroup::wait` (cancellation points outside a section): inside
/// `non_cancellable` a cancelled fiber's waits go on until served, and a
/// permit granted there is kept (not given back as `Err(Cancelled)`).
#[test]
fn barrier_semaphore_and_wait_group_inside_non_cancellable_wait_until_served() {
    on_runtime(|| {
        let barrier = Arc::new(Barrier::new(2));
        let sem = Arc::new(Semaphore::new(0));
        let wg = WaitGroup::new();
        let member = wg.clone();
        let (b, s) = (barrier.clone(), sem.clone());
        let (tx, rx) = mpsc::channel();
        let h = fiber::spawn(move || {
            while fiber::sleep(ms(1)).is_ok() {}
            fiber::non_cancellable(|| {
                let r = b.wait();
                tx.send(("barrier", !r.is_cancelled())).unwrap();
                let p = s.acquire();
                let ok = p.is_ok();
                drop(p);
                tx.send(("semaphore", ok)).unwrap();
                wg.wait();
                tx.send(("waitgroup", true)).unwrap();
            });
        });
        fiber::sleep(ms(3)).unwrap();
        h.cancel();
        fiber::sleep(ms(20)).unwrap();
        assert!(rx.try_recv().is_err(), "the barrier wait ended without a second party");
        barrier.wait();
        assert_eq!(rx.recv().unwrap(), ("barrier", true));
        fiber::sleep(ms(20)).unwrap();
        assert!(rx.try_recv().is_err(), "acquire ended without a permit");
        sem.add_permits(1);
        assert_eq!(rx.recv().unwrap(), ("semaphore", true));
        assert_eq!(
            sem.available_permits(),
            1,
            "the permit granted in the section did not come back on drop"
        );
        fiber::sleep(ms(20)).unwrap();
        assert!(rx.try_recv().is_err(), "the wait group wait ended with a member alive");
        drop(member);
        assert_eq!(rx.recv().unwrap(), ("waitgroup", true));
        assert!(h.join().unwrap_err().is_cancelled());
    });
}

/// A destructor run by a fiber's panic waits on a condvar (its guard taken
/// during the unwind) for a fiber of the same single worker: the wait
/// parks after its bound, the notifier runs, and since the guard was taken
/// while panicking its drop does not poison (std); the notifier's guard,
/// on a worker that counts as panicking meanwhile, does not either.
#[test]
fn a_condvar_wait_in_a_destructor_during_an_unwind_is_served_by_a_fiber_of_the_same_worker() {
    within(30, || {
        let rt = rt1();
        rt.block_on(|| {
            let pair = Arc::new((Mutex::new(0u32), Condvar::new()));
            struct WaitOnDrop(Arc<(Mutex<u32>, Condvar)>);
            impl Drop for WaitOnDrop {
                fn drop(&mut self) {
                    let (m, cv) = &*self.0;
                    let g = m.lock().unwrap_or_else(|e| e.into_inner());
                    let mut g = cv.wait_while(g, |v| *v == 0).unwrap_or_else(|e| e.into_inner());
                    *g += 10;
                }
            }
            let p = pair.clone();
            let (started_tx, started_rx) = fiber::chan::bounded(1);
            let a = fiber::spawn(move || {
                let _w = WaitOnDrop(p);
                started_tx.send(()).unwrap();
                panic!("unwinds into a waiting destructor");
            });
            started_rx.recv().unwrap();
            let p = pair.clone();
            let b = fiber::spawn(move || {
                *p.0.lock().unwrap() += 1;
                p.1.notify_all();
            });
            assert!(a.join().unwrap_err().is_panic());
            b.join().unwrap();
            assert_eq!(*pair.0.lock().unwrap_or_else(|e| e.into_inner()), 11);
            assert!(
                !pair.0.is_poisoned(),
                "a guard taken during the unwind, or the notifier's, poisoned"
            );
        });
    });
}

/// std: `wait_timeout_while` waits at most its timeout in all, however
/// many notifications arrive that leave the condition true; it then
/// reports a timeout.
#[test]
fn wait_timeout_while_bounds_the_whole_wait_under_a_stream_of_notifications() {
    on_runtime(|| {
        let pair = Arc::new((Mutex::new(0u32), Condvar::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (pair.clone(), stop.clone());
        let noise = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                *p.0.lock().unwrap() += 1;
                p.1.notify_all();
                std::thread::sleep(Duration::from_micros(300));
            }
        });
        for in_thread in [false, true] {
            let p = pair.clone();
            let body = move || {
                let t = Instant::now();
                let (_g, r) = p.1.wait_timeout_while(p.0.lock().unwrap(), ms(60), |_| true).unwrap();
                (t.elapsed(), r.timed_out())
            };
            let (elapsed, timed_out) = if in_thread {
                std::thread::spawn(body).join().unwrap()
            } else {
                fiber::spawn(body).join().unwrap()
            };
            assert!(timed_out);
            assert!(elapsed >= ms(60), "returned after {elapsed:?}");
            assert!(elapsed < Duration::from_secs(5), "returned after {elapsed:?}");
        }
        stop.store(true, Ordering::Relaxed);
        noise.join().unwrap();
    });
}

/// spec/sync.md 5: `OnceLock::get_or_init` / `wait` and `Once::wait` are
/// not cancellation points (as std). Fibers waiting in them are cancelled
/// (the interrupt is a stray wake-up there) and go on waiting; they all
/// return the value once the initializer finishes.
#[test]
fn once_waits_of_cancelled_fibers_go_on_until_the_value_is_there() {
    on_runtime(|| {
        let cell = Arc::new(OnceLock::<u32>::new());
        let once = Arc::new(Once::new());
        let (go_tx, go_rx) = fiber::chan::bounded::<()>(0);
        let (c, o) = (cell.clone(), once.clone());
        let init = fiber::spawn(move || {
            o.call_once(|| {
                c.get_or_init(|| {
                    go_rx.recv().unwrap();
                    9
                });
            });
        });
        wait_fiber_parked(init.id());
        let (tx, rx) = mpsc::channel();
        let mut waiters = Vec::new();
        for kind in 0..3 {
            let (c, o, tx) = (cell.clone(), once.clone(), tx.clone());
            waiters.push(fiber::spawn(move || {
                let v = match kind {
                    0 => *c.get_or_init(|| 1),
                    1 => *c.wait(),
                    _ => {
                        o.wait();
                        *c.get().unwrap()
                    }
                };
                tx.send((kind, v, fiber::is_cancelled())).unwrap();
            }));
        }
        for w in &waiters {
            wait_fiber_parked(w.id());
        }
        for w in &waiters {
            w.cancel();
        }
        fiber::sleep(ms(10)).unwrap();
        assert!(rx.try_recv().is_err(), "a once wait ended at its cancellation");
        go_tx.send(()).unwrap();
        init.join().unwrap();
        let mut got: Vec<_> = (0..3).map(|_| rx.recv().unwrap()).collect();
        got.sort();
        assert_eq!(got, vec![(0, 9, true), (1, 9, true), (2, 9, true)]);
        for w in waiters {
            assert!(w.join().unwrap_err().is_cancelled());
        }
    });
}

/// std: `Thread::unpark` on a thread that has finished does nothing; the
/// handle still names it. The same for a fiber's handle.
#[test]
fn a_fiber_handle_outlives_its_fiber_unpark_is_a_no_op_and_the_name_stays() {
    on_runtime(|| {
        let h = fiber::Builder::new().name("short").spawn(|| 1).unwrap();
        let handle = h.fiber();
        assert_eq!(h.join().unwrap(), 1);
        handle.unpark();
        handle.unpark();
        assert_eq!(handle.name(), Some("short"));
        assert_ne!(fiber::current().id(), handle.id());
    });
}
