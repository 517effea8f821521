//! Review 24: `fiber::sync` under races that mix fibers on two workers and
//! plain threads (a notify racing a timed wait's expiry, a release racing a
//! cancelled acquire, a cancel racing a barrier's completing arrival, a
//! parking then panicking `OnceLock` initializer), guards held across parks
//! while the holder migrates, and the facade's `std::thread`-like API.

use fiber::sync::{Barrier, BarrierWaitResult, Condvar, Mutex, OnceLock, RwLock, Semaphore};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use crate::common::{ms, rt2, wait_parked, within};

/// Spin (no yield point) until `t`.
fn spin_to(t: Instant) {
    while Instant::now() < t {
        std::hint::spin_loop();
    }
}

#[derive(Default)]
struct Tokens {
    tokens: u32,
    a_in: bool,
    b_in: bool,
}

/// std: `notify_one` wakes one of the waiters blocked at that moment. Waiter
/// A (`wait_timeout`, front of the queue) and waiter B (`wait_while`) wait;
/// a notifier fires `notify_one` right around A's deadline. Either A reports
/// the notification (then B still waits, and gets a second one), or A
/// reports a timeout and then the notification must reach B. A fiber and a
/// plain thread swap the roles every round; the notifier alternates too.
#[test]
fn notify_one_racing_a_wait_timeout_expiry_reaches_the_other_waiter() {
    within(60, || {
        let rt = rt2();
        let pair = Arc::new((Mutex::new(Tokens::default()), Condvar::new()));
        let mut a_notified = 0;
        for round in 0..300u32 {
            let timeout = Duration::from_micros(1500);
            // A: one timed wait, entered first.
            let p = pair.clone();
            let a = move || {
                let (m, cv) = &*p;
                let mut g = m.lock().unwrap();
                g.a_in = true;
                let (mut g, r) = cv.wait_timeout(g, timeout).unwrap();
                if !r.timed_out() {
                    assert!(g.tokens > 0, "A reported a notification with no token");
                    g.tokens -= 1;
                }
                r.timed_out()
            };
            // B: waits for a token, entered once A waits.
            let p = pair.clone();
            let b = move || {
                let (m, cv) = &*p;
                let mut g = m.lock().unwrap();
                loop {
                    if g.a_in {
                        break;
                    }
                    drop(g);
                    std::thread::yield_now();
                    g = m.lock().unwrap();
                }
                g.b_in = true;
                let mut g = cv.wait_while(g, |t| t.tokens == 0).unwrap();
                g.tokens -= 1;
            };
            let (a_tx, a_rx) = mpsc::channel();
            let (b_tx, b_rx) = mpsc::channel();
            if round % 2 == 0 {
                let _f = rt.spawn(move || a_tx.send(a()).unwrap());
                std::thread::spawn(move || {
                    b();
                    b_tx.send(()).unwrap();
                });
            } else {
                std::thread::spawn(move || a_tx.send(a()).unwrap());
                let _f = rt.spawn(move || {
                    b();
                    b_tx.send(()).unwrap();
                });
            }
            // Notifier: once both wait, fire at A's deadline +- jitter.
            let p = pair.clone();
            let notify = move || {
                let (m, cv) = &*p;
                let start = loop {
                    let g = m.lock().unwrap();
                    if g.b_in {
                        break Instant::now();
                    }
                    drop(g);
                    std::thread::yield_now();
                };
                let jitter = Duration::from_micros(u64::from(round % 7) * 200);
                spin_to(start + Duration::from_micros(600) + jitter);
                m.lock().unwrap().tokens += 1;
                cv.notify_one();
            };
            if round % 3 == 0 {
                std::thread::spawn(notify).join().unwrap();
            } else {
                rt.spawn(notify).join().unwrap();
            }
            let a_timed_out = a_rx.recv_timeout(Duration::from_secs(5)).expect("A never returned");
            if a_timed_out {
                b_rx.recv_timeout(Duration::from_secs(3)).unwrap_or_else(|_| {
                    panic!("round {round}: A timed out and the notify_one did not reach B (lost notification)")
                });
            } else {
                a_notified += 1;
                assert!(b_rx.try_recv().is_err(), "round {round}: one notify_one woke both");
                pair.0.lock().unwrap().tokens += 1;
                pair.1.notify_one();
                b_rx.recv_timeout(Duration::from_secs(3))
                    .expect("B never got the second notification");
            }
            let mut g = pair.0.lock().unwrap();
            assert_eq!(g.tokens, 0, "round {round}");
            g.a_in = false;
            g.b_in = false;
        }
        // Not asserted (timing), but shows both branches ran.
        eprintln!("A took the notification in {a_notified} of 300 rounds");
    })
}

/// The same with a cancel instead of a deadline: the head waiter (a fiber
/// in `wait_timeout`) is cancelled as a plain thread calls `notify_one`.
/// A cancelled timed wait reports a timeout (spec/sync.md section 3.3);
/// then the notification must have gone to the waiter behind it (a plain
/// thread), else the head consumed it and reports no timeout.
#[test]
fn notify_one_racing_the_cancel_of_the_head_waiter_reaches_the_other_waiter() {
    within(60, || {
        let rt = rt2();
        let mut head_notified = 0;
        for round in 0..200u32 {
            let pair = Arc::new((Mutex::new(Tokens::default()), Condvar::new()));
            let p = pair.clone();
            let (a_tx, a_rx) = mpsc::channel();
            let a = rt.spawn(move || {
                let (m, cv) = &*p;
                let mut g = m.lock().unwrap();
                g.a_in = true;
                let (mut g, r) = cv.wait_timeout(g, Duration::from_secs(30)).unwrap();
                if !r.timed_out() {
                    g.tokens -= 1;
                }
                a_tx.send(r.timed_out()).unwrap();
            });
            wait_parked(&rt, 1);
            let p = pair.clone();
            let (b_tx, b_rx) = mpsc::channel();
            std::thread::spawn(move || {
                let (m, cv) = &*p;
                let mut g = m.lock().unwrap();
                g.b_in = true;
                let mut g = cv.wait_while(g, |t| t.tokens == 0).unwrap();
                g.tokens -= 1;
                b_tx.send(()).unwrap();
            });
            while !pair.0.lock().unwrap().b_in {
                std::thread::yield_now();
            }
            let go = Arc::new(AtomicBool::new(false));
            let (g, p) = (go.clone(), pair.clone());
            let notifier = std::thread::spawn(move || {
                while !g.load(Ordering::Acquire) {
                    std::hint::spin_loop();
                }
                spin_to(Instant::now() + Duration::from_micros(u64::from(round % 8) * 10));
                p.0.lock().unwrap().tokens += 1;
                p.1.notify_one();
            });
            go.store(true, Ordering::Release);
            a.cancel();
            notifier.join().unwrap();
            let a_timed_out = a_rx.recv_timeout(Duration::from_secs(5)).expect("A never returned");
            if a_timed_out {
                b_rx.recv_timeout(Duration::from_secs(3)).unwrap_or_else(|_| {
                    panic!("round {round}: the cancelled head reported a timeout and B never got the notification")
                });
            } else {
                head_notified += 1;
                pair.0.lock().unwrap().tokens += 1;
                pair.1.notify_one();
                b_rx.recv_timeout(Duration::from_secs(3))
                    .expect("B never got the second notification");
            }
            assert_eq!(pair.0.lock().unwrap().tokens, 0, "round {round}");
        }
        eprintln!("the cancelled head took the notification in {head_notified} of 200 rounds");
    })
}

/// A semaphore release racing the cancel of the waiter at the head of the
/// queue: the permit ends with exactly one party. If the cancelled acquire
/// ends `Err(Cancelled)` the waiter behind it gets the permit; no permit is
/// lost or duplicated (spec/sync.md section 2 rule 4, section 3.4).
#[test]
fn sem_release_racing_the_cancel_of_the_head_waiter_hands_the_permit_on() {
    within(60, || {
        let rt = rt2();
        let mut a_got = 0;
        for round in 0..300u32 {
            let sem = Arc::new(Semaphore::new(0));
            let s = sem.clone();
            let (a_tx, a_rx) = mpsc::channel();
            let a = rt.spawn(move || {
                let got = match s.acquire() {
                    Ok(p) => {
                        p.forget();
                        true
                    }
                    Err(_) => false,
                };
                a_tx.send(got).unwrap();
            });
            wait_parked(&rt, 1);
            let s = sem.clone();
            let (b_tx, b_rx) = mpsc::channel();
            let _b = rt.spawn(move || {
                s.acquire().unwrap().forget();
                b_tx.send(()).unwrap();
            });
            wait_parked(&rt, 2);
            let go = Arc::new(AtomicBool::new(false));
            let (g, s) = (go.clone(), sem.clone());
            let releaser = std::thread::spawn(move || {
                while !g.load(Ordering::Acquire) {
                    std::hint::spin_loop();
                }
                if round % 2 == 0 {
                    spin_to(Instant::now() + Duration::from_micros(u64::from(round % 5) * 20));
                }
                s.add_permits(1);
            });
            go.store(true, Ordering::Release);
            if round % 2 == 1 {
                spin_to(Instant::now() + Duration::from_micros(u64::from(round % 5) * 20));
            }
            a.cancel();
            releaser.join().unwrap();
            let a_ok = a_rx.recv_timeout(Duration::from_secs(5)).expect("A never returned");
            if a_ok {
                a_got += 1;
                assert!(b_rx.try_recv().is_err(), "round {round}: one permit, two owners");
                sem.add_permits(1);
            }
            b_rx.recv_timeout(Duration::from_secs(3)).unwrap_or_else(|_| {
                panic!(
                    "round {round}: B never got the permit (A ok: {a_ok}, available {})",
                    sem.available_permits()
                )
            });
            assert_eq!(sem.available_permits(), 0, "round {round}: a permit was duplicated");
        }
        eprintln!("the cancelled acquire kept the permit in {a_got} of 300 rounds");
    })
}

/// A cancel racing the arrival that completes a barrier generation: either
/// the cancelled waiter counts (it returns not cancelled, the generation
/// has exactly one leader) or it withdrew (the arrival does not complete the
/// generation; a further one does). Never a generation released with a
/// party missing, never a withdrawn waiter reported as leader.
#[test]
fn a_cancel_racing_the_completing_barrier_arrival_keeps_the_count() {
    within(60, || {
        let rt = rt2();
        let mut withdrew = 0;
        for round in 0..200u32 {
            let barrier = Arc::new(Barrier::new(3));
            let (tx, rx) = mpsc::channel::<(char, BarrierWaitResult)>();
            let (b1, t1) = (barrier.clone(), tx.clone());
            let a = rt.spawn(move || t1.send(('a', b1.wait())).unwrap());
            let (b2, t2) = (barrier.clone(), tx.clone());
            let _b = rt.spawn(move || t2.send(('b', b2.wait())).unwrap());
            wait_parked(&rt, 2);
            let go = Arc::new(AtomicBool::new(false));
            let (g, b3, t3) = (go.clone(), barrier.clone(), tx.clone());
            let c = std::thread::spawn(move || {
                while !g.load(Ordering::Acquire) {
                    std::hint::spin_loop();
                }
                spin_to(Instant::now() + Duration::from_micros(u64::from(round % 4) * 15));
                t3.send(('c', b3.wait())).unwrap();
            });
            go.store(true, Ordering::Release);
            a.cancel();
            let mut results = Vec::new();
            let first = rx.recv_timeout(Duration::from_secs(5)).expect("nobody returned");
            results.push(first);
            // Either all three return (A counted) or only A (withdrawn).
            let a_res = if first.0 == 'a' {
                first.1
            } else {
                loop {
                    let r = rx.recv_timeout(Duration::from_secs(5)).expect("A never returned");
                    results.push(r);
                    if r.0 == 'a' {
                        break r.1;
                    }
                }
            };
            if a_res.is_cancelled() {
                withdrew += 1;
                assert!(!a_res.is_leader(), "round {round}: a withdrawn waiter led");
                let (b4, t4) = (barrier.clone(), tx.clone());
                std::thread::spawn(move || t4.send(('d', b4.wait())).unwrap());
            }
            let expected = if a_res.is_cancelled() { 4 } else { 3 };
            while results.len() < expected {
                let r = rx
                    .recv_timeout(Duration::from_secs(5))
                    .unwrap_or_else(|_| panic!("round {round}: the generation never completed: {:?}", results));
                results.push(r);
            }
            c.join().unwrap();
            let counted: Vec<_> = results.iter().filter(|r| !r.1.is_cancelled()).collect();
            assert_eq!(counted.len(), 3, "round {round}: {results:?}");
            assert_eq!(
                counted.iter().filter(|r| r.1.is_leader()).count(),
                1,
                "round {round}: {results:?}"
            );
            assert_eq!(barrier.generation(), 1, "round {round}");
        }
        eprintln!("the cancelled waiter withdrew in {withdrew} of 200 rounds");
    })
}

/// std's `OnceLock`: an initializer that panics leaves the cell
/// uninitialized and a waiting caller runs its own. Here the first
/// initializer parks (a channel receive) while four fibers and two plain
/// threads wait in `get_or_init`, then panics: exactly one waiter's
/// initializer runs, every waiter gets its value.
#[test]
fn a_parking_then_panicking_once_initializer_lets_exactly_one_waiter_retry() {
    within(30, || {
        let rt = rt2();
        for round in 0..20 {
            let cell = Arc::new(OnceLock::<usize>::new());
            let inits = Arc::new(AtomicUsize::new(0));
            let (go_tx, go_rx) = fiber::chan::bounded::<()>(0);
            let c = cell.clone();
            let first = rt.spawn(move || {
                c.get_or_init(|| {
                    go_rx.recv().unwrap();
                    panic!("first initializer fails");
                });
            });
            wait_parked(&rt, 1);
            let mut fibers = Vec::new();
            for i in 0..4 {
                let (c, n) = (cell.clone(), inits.clone());
                fibers.push(rt.spawn(move || {
                    *c.get_or_init(|| {
                        n.fetch_add(1, Ordering::SeqCst);
                        100 + i
                    })
                }));
            }
            let mut threads = Vec::new();
            for i in 0..2 {
                let (c, n) = (cell.clone(), inits.clone());
                threads.push(std::thread::spawn(move || {
                    *c.get_or_init(|| {
                        n.fetch_add(1, Ordering::SeqCst);
                        200 + i
                    })
                }));
            }
            wait_parked(&rt, 5);
            go_tx.send(()).unwrap();
            assert!(first.join().unwrap_err().is_panic());
            let mut seen: Vec<usize> = fibers.into_iter().map(|f| f.join().unwrap()).collect();
            seen.extend(threads.into_iter().map(|t| t.join().unwrap()));
            assert_eq!(inits.load(Ordering::SeqCst), 1, "round {round}");
            let v = *cell.get().expect("initialized");
            assert!(seen.iter().all(|&s| s == v), "round {round}: {seen:?} vs {v}");
        }
    })
}

/// A `fiber::sync::Mutex` guard held across a channel receive (the holder
/// parks and may resume on the other worker, dropping the guard there)
/// while fibers on both workers and plain threads contend: mutual
/// exclusion holds and no increment is lost.
#[test]
fn a_mutex_guard_held_across_parks_while_fibers_and_threads_contend_counts_exactly() {
    within(60, || {
        let rt = rt2();
        let m = Arc::new(Mutex::new(0u64));
        let inside = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = fiber::chan::bounded::<()>(0);
        const N: u64 = 300;
        let mut fibers = Vec::new();
        // The parker: holds the guard across a receive each time.
        let (mm, ins) = (m.clone(), inside.clone());
        fibers.push(rt.spawn(move || {
            let mut moved = 0;
            for _ in 0..N {
                let mut g = mm.lock().unwrap();
                assert_eq!(ins.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                let before = std::thread::current().id();
                rx.recv().unwrap();
                // Runnable again: an idle worker may steal it.
                fiber::yield_now().unwrap();
                if std::thread::current().id() != before {
                    moved += 1;
                }
                *g += 1;
                ins.fetch_sub(1, Ordering::SeqCst);
            }
            moved
        }));
        for _ in 0..3 {
            let (mm, ins) = (m.clone(), inside.clone());
            fibers.push(rt.spawn(move || {
                for i in 0..N {
                    let mut g = mm.lock().unwrap();
                    assert_eq!(ins.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                    if i % 3 == 0 {
                        fiber::yield_now().unwrap();
                    }
                    *g += 1;
                    ins.fetch_sub(1, Ordering::SeqCst);
                }
                0
            }));
        }
        let mut threads = Vec::new();
        for _ in 0..2 {
            let (mm, ins) = (m.clone(), inside.clone());
            threads.push(std::thread::spawn(move || {
                for _ in 0..N {
                    let mut g = mm.lock().unwrap();
                    assert_eq!(ins.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                    *g += 1;
                    ins.fetch_sub(1, Ordering::SeqCst);
                }
            }));
        }
        // A plain thread feeds the parker half the time, a fiber the rest.
        let tx2 = tx.clone();
        let feeder = std::thread::spawn(move || {
            for _ in 0..N / 2 {
                tx.send(()).unwrap();
            }
        });
        let fiber_feeder = rt.spawn(move || {
            for _ in 0..N - N / 2 {
                tx2.send(()).unwrap();
            }
        });
        feeder.join().unwrap();
        fiber_feeder.join().unwrap();
        let moved: u32 = fibers.into_iter().map(|f| f.join().unwrap()).sum();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*m.lock().unwrap(), 6 * N);
        assert!(!m.is_poisoned());
        eprintln!("the holder resumed on another worker {moved} times");
    })
}

/// A `Semaphore` of 5 shared by fibers on two workers and plain threads
/// taking 1 to 3 permits at a time, while some fibers are cancelled in the
/// middle of it: never more than 5 permits out, every cancelled acquire
/// takes nothing, nobody hangs, and all 5 are back at the end.
#[test]
fn a_semaphore_under_mixed_contention_and_cancels_keeps_its_permits() {
    within(60, || {
        let rt = rt2();
        let sem = Arc::new(Semaphore::new(5));
        let out = Arc::new(AtomicUsize::new(0));
        let worst = Arc::new(AtomicUsize::new(0));
        let take = |sem: &Semaphore, out: &AtomicUsize, worst: &AtomicUsize, k: u32| -> bool {
            let Ok(permit) = sem.acquire_many(k) else {
                return false;
            };
            let now = out.fetch_add(k as usize, Ordering::SeqCst) + k as usize;
            worst.fetch_max(now, Ordering::SeqCst);
            out.fetch_sub(k as usize, Ordering::SeqCst);
            drop(permit);
            true
        };
        let mut fibers = Vec::new();
        for f in 0..8u32 {
            let (s, o, w) = (sem.clone(), out.clone(), worst.clone());
            fibers.push(rt.spawn(move || {
                for i in 0..400u32 {
                    let k = 1 + (f + i) % 3;
                    let Ok(permit) = s.acquire_many(k) else {
                        return i;
                    };
                    let now = o.fetch_add(k as usize, Ordering::SeqCst) + k as usize;
                    w.fetch_max(now, Ordering::SeqCst);
                    if i % 4 == 0 {
                        let _ = fiber::yield_now();
                    }
                    o.fetch_sub(k as usize, Ordering::SeqCst);
                    drop(permit);
                }
                400
            }));
        }
        let mut threads = Vec::new();
        for t in 0..2u32 {
            let (s, o, w) = (sem.clone(), out.clone(), worst.clone());
            threads.push(std::thread::spawn(move || {
                for i in 0..400u32 {
                    assert!(take(&s, &o, &w, 1 + (t + i) % 3));
                }
            }));
        }
        // Cancel every other fiber while the others go on.
        for f in fibers.iter().step_by(2) {
            f.cancel();
        }
        for (n, f) in fibers.into_iter().enumerate() {
            match f.join() {
                Ok(done) => assert!(n % 2 == 1 || done <= 400),
                Err(e) => assert!(n % 2 == 0 && e.is_cancelled(), "fiber {n}: {e:?}"),
            }
        }
        for t in threads {
            t.join().unwrap();
        }
        assert!(worst.load(Ordering::SeqCst) <= 5, "more than 5 permits out at once");
        assert_eq!(out.load(Ordering::SeqCst), 0);
        assert_eq!(sem.available_permits(), 5, "permits lost or created");
    })
}

/// std's `OnceLock`: a panicking initializer leaves the cell empty and a
/// waiting caller runs its own. Here the initializer is a fiber that never
/// returns (it ignores cancellation) and is unwound by the runtime's
/// teardown while a plain thread waits in `get_or_init`: the thread then
/// runs its own initializer and gets its value.
#[test]
fn a_once_initializer_unwound_at_teardown_lets_a_waiting_thread_initialize() {
    within(30, || {
        let rt = crate::common::rt_fixed_grace(2, ms(100));
        let cell = Arc::new(OnceLock::<u32>::new());
        let c = cell.clone();
        let _stuck = rt.spawn(move || {
            c.get_or_init(|| {
                crate::common::stubborn_sleep();
                1
            });
        });
        wait_parked(&rt, 1);
        let c = cell.clone();
        let (tx, rx) = mpsc::channel();
        let waiter = std::thread::spawn(move || {
            tx.send(()).unwrap();
            *c.get_or_init(|| 2)
        });
        rx.recv().unwrap();
        drop(rt);
        assert_eq!(waiter.join().unwrap(), 2);
        assert_eq!(cell.get(), Some(&2));
    })
}

/// A `RwLock` read guard held across a park by a fiber while a writer
/// (plain thread) waits: `try_read` from another fiber fails while the
/// writer waits (FIFO, documented), the writer gets in after the reader
/// lets go, then readers again. A panicking reader does not poison (std);
/// a panicking writer on a plain thread does, for fibers too.
#[test]
fn rwlock_try_read_behind_a_waiting_thread_writer_and_poison_rules() {
    within(30, || {
        let rt = rt2();
        let lock = Arc::new(RwLock::new(0u32));
        let (tx, rx) = fiber::chan::bounded::<()>(0);
        let l = lock.clone();
        let reader = rt.spawn(move || {
            let g = l.read().unwrap();
            rx.recv().unwrap(); // park holding the read lock
            *g
        });
        wait_parked(&rt, 1);
        let l = lock.clone();
        let writer_in = Arc::new(AtomicBool::new(false));
        let wi = writer_in.clone();
        let writer = std::thread::spawn(move || {
            let mut g = l.write().unwrap();
            wi.store(true, Ordering::SeqCst);
            *g += 1;
        });
        // Wait until the writer is queued: a try_read then fails.
        let l = lock.clone();
        rt.block_on(move || {
            crate::common::wait_until("the writer to queue", 5, || {
                matches!(l.try_read(), Err(std::sync::TryLockError::WouldBlock))
            });
        });
        assert!(!writer_in.load(Ordering::SeqCst));
        tx.send(()).unwrap();
        assert_eq!(reader.join().unwrap(), 0);
        writer.join().unwrap();
        assert_eq!(*lock.read().unwrap(), 1);
        // A panicking reader (fiber) does not poison.
        let l = lock.clone();
        let r = rt.spawn(move || {
            let _g = l.read().unwrap();
            panic!("reader panics");
        });
        assert!(r.join().unwrap_err().is_panic());
        assert!(!lock.is_poisoned());
        // A panicking writer (thread) poisons, seen by a fiber.
        let l = lock.clone();
        let _ = std::thread::spawn(move || {
            let _g = l.write().unwrap();
            panic!("writer panics");
        })
        .join();
        let l = lock.clone();
        let poisoned = rt
            .spawn(move || l.read().is_err() && l.write().is_err())
            .join()
            .unwrap();
        assert!(poisoned);
    })
}

/// Cancelling the large `acquire_many` at the head of a semaphore's queue
/// lets the smaller requests behind it, which the permits already cover,
/// through (the leaving waiter runs `grant`, spec/sync.md section 3.4).
#[test]
fn cancelling_a_blocking_large_acquire_serves_the_waiters_behind_it() {
    within(20, || {
        let rt = rt2();
        let sem = Arc::new(Semaphore::new(0));
        let s = sem.clone();
        let big = rt.spawn(move || s.acquire_many(5).map(|p| p.forget()).is_ok());
        wait_parked(&rt, 1);
        let (tx, rx) = mpsc::channel();
        let mut small = Vec::new();
        for _ in 0..2 {
            let (s, tx) = (sem.clone(), tx.clone());
            small.push(rt.spawn(move || {
                s.acquire().unwrap().forget();
                tx.send(()).unwrap();
            }));
        }
        let (s, tx2) = (sem.clone(), tx.clone());
        let thread = std::thread::spawn(move || {
            s.acquire().unwrap().forget();
            tx2.send(()).unwrap();
        });
        wait_parked(&rt, 3);
        sem.add_permits(3);
        // FIFO: nobody passes the big request.
        assert!(
            rx.recv_timeout(ms(50)).is_err(),
            "a small acquire passed the waiting large one"
        );
        big.cancel();
        assert!(big.join().unwrap_err().is_cancelled());
        for _ in 0..3 {
            rx.recv_timeout(Duration::from_secs(3))
                .expect("a small acquire behind the cancelled large one never got its permit");
        }
        thread.join().unwrap();
        assert_eq!(sem.available_permits(), 0);
    })
}

/// `fiber::Builder` and the handles against `std::thread`: a name given to
/// `spawn_scoped` is the child's `current().name()`, `JoinHandle::fiber()`
/// names the same fiber as its `current()`, `is_finished` turns true
/// without a join, an `unpark` before `park` is kept (one token, not a
/// count), and `sleep_until` a past instant returns `Ok` at once.
#[test]
fn builder_handles_and_park_tokens_follow_std_thread() {
    within(20, || {
        let rt = rt2();
        rt.block_on(|| {
            let mut seen = None;
            fiber::scope(|s| {
                let h = fiber::Builder::new()
                    .name("scoped-24")
                    .spawn_scoped(s, || fiber::current().name().map(str::to_owned))
                    .unwrap();
                seen = h.join().unwrap();
            });
            assert_eq!(seen.as_deref(), Some("scoped-24"));

            let (tx, rx) = fiber::chan::bounded(1);
            let (go_tx, go_rx) = fiber::chan::bounded::<()>(1);
            let h = fiber::Builder::new()
                .name("named")
                .spawn(move || {
                    tx.send(fiber::current().id()).unwrap();
                    go_rx.recv().unwrap();
                    // One token however many unparks came before.
                    two_unparks_left_one_token();
                })
                .unwrap();
            let id = rx.recv().unwrap();
            assert_eq!(h.id(), id);
            assert_eq!(h.fiber().id(), id);
            assert_eq!(h.fiber().name(), Some("named"));
            h.fiber().unpark();
            h.fiber().unpark();
            go_tx.send(()).unwrap();
            crate::common::wait_until("is_finished", 5, || h.is_finished());
            h.join().unwrap();

            let past = Instant::now() - ms(50);
            let t = Instant::now();
            assert_eq!(fiber::sleep_until(past), Ok(()));
            assert!(t.elapsed() < Duration::from_secs(1));
        });
    })
}

/// Park until the token comes, then check that a second park times out:
/// two unparks leave one token, as `std::thread::park` documents.
fn two_unparks_left_one_token() {
    let t = Instant::now();
    fiber::park();
    assert!(t.elapsed() < Duration::from_secs(1), "the token was lost");
    // A second token would make this park return at once (spurious
    // returns are allowed, but nothing here wakes the fiber).
    let t = Instant::now();
    fiber::park_timeout(ms(20));
    assert!(t.elapsed() >= ms(20), "two unparks left two tokens");
}

/// spec/sync.md section 3.2: a writer waiting in `write` whose fiber is
/// cancelled "leaves the queue without granting anyone behind it and queues
/// again at the front, keeping its place", and the `RwLock` rustdoc: a
/// waiting writer stops new readers (`try_read` fails while it waits,
/// `adversarial_review9.rs` checks that once, after the cancel). Here a
/// plain thread polls `try_read` the whole time a cancelled writer waits
/// behind a held read lock: it must never get in before the writer.
#[test]
// Failed before the fix: a cancel wakes a writer waiting in RwLock::write, which leaves the queue (clearing QUEUED) before it queues again, so try_read and queued readers pass it
fn rwlock_try_read_never_passes_a_waiting_writer_whose_fiber_is_cancelled() {
    within(30, || {
        let rt = crate::common::rt1();
        // The window is a few microseconds of the writer's own code and
        // needs the poller on the other core at that moment: rounds go on
        // until a pass-in is seen or BUDGET is spent.
        let start = Instant::now();
        let mut rounds = 0;
        while start.elapsed() < BUDGET {
            rounds += 1;
            let lock = Arc::new(RwLock::new(0u32));
            let held = lock.read().unwrap();
            let l = lock.clone();
            let writer = rt.spawn(move || *l.write().unwrap() = 1);
            wait_parked(&rt, 1);
            let stop = Arc::new(AtomicBool::new(false));
            let (l, st) = (lock.clone(), stop.clone());
            let poller = std::thread::spawn(move || {
                let mut got = 0u32;
                while !st.load(Ordering::Acquire) {
                    if let Ok(g) = l.try_read() {
                        if *g == 0 {
                            got += 1;
                        }
                    }
                }
                got
            });
            // The writer has been parked a while; the cancel wakes it, and
            // it parks again (its `since` restarts): then let it in.
            let id = writer.id();
            wait_fiber(&rt, id, |since| since >= ms(6));
            let cancelled_at = Instant::now();
            writer.cancel();
            // Parked again since the cancel. `since` comes from the dump's
            // coarse millisecond clock, which the re-park may read up to a
            // tick stale: allow 3 ms, against the 6 ms of a writer that
            // never woke.
            wait_fiber(&rt, id, |since| since < cancelled_at.elapsed() + ms(3));
            drop(held);
            let _ = writer.join();
            stop.store(true, Ordering::Release);
            let got = poller.join().unwrap();
            assert_eq!(*lock.read().unwrap(), 1);
            assert_eq!(
                got, 0,
                "round {rounds}: try_read got in {got} times while the cancelled writer waited to queue again"
            );
        }
    })
}

/// spec/sync.md 3.1: once the first waiter of a `Mutex` has waited 1 ms
/// the next unlock hands the lock to it (Go's starvation mode: "ownership
/// of the mutex is directly handed off from the unlocking goroutine to the
/// waiter at the front of the queue"). A lock wait is no cancellation
/// point, so a cancel of that waiter's fiber is only a spurious wake-up: it
/// must not cost the waiter its turn. Two fibers wait, in order, past the
/// threshold; the first one's fiber is cancelled and the holder (a plain
/// thread) unlocks right after, at a varying delay, to land in the few
/// microseconds in which the woken waiter is awake: the first waiter still
/// gets the lock first.
#[test]
// Failed before the fix: a cancel wakes the starving first waiter of a Mutex, which leaves the queue before it queues again, so an unlock in between hands the lock to the waiter behind it
fn mutex_starving_first_waiter_keeps_its_hand_off_when_its_fiber_is_cancelled() {
    within(60, || {
        let rt = rt2();
        let start = Instant::now();
        let mut rounds = 0u32;
        while start.elapsed() < BUDGET {
            rounds += 1;
            let lock = Arc::new(Mutex::new(Vec::new()));
            let held = lock.lock().unwrap();
            let l = lock.clone();
            let first = rt.spawn(move || l.lock().unwrap().push(1));
            wait_parked(&rt, 1);
            let l = lock.clone();
            let second = rt.spawn(move || l.lock().unwrap().push(2));
            wait_parked(&rt, 2);
            wait_fiber(&rt, second.id(), |since| since >= ms(2));
            first.cancel();
            // Sweep the unlock across the woken waiter's window.
            for _ in 0..(rounds % 64) * 16 {
                std::hint::spin_loop();
            }
            drop(held);
            let _ = first.join();
            let _ = second.join();
            let order = lock.lock().unwrap().clone();
            assert_eq!(
                order,
                [1, 2],
                "round {rounds}: the waiter behind got the hand-off while the cancelled first waiter was awake"
            );
        }
    })
}

/// How long the cancel test above keeps trying.
const BUDGET: Duration = Duration::from_secs(6);

/// Wait (on a plain thread) until fiber `id` of `rt` is parked and its time
/// in that state satisfies `ok`.
fn wait_fiber(rt: &fiber::Runtime, id: fiber::FiberId, ok: impl Fn(Duration) -> bool) {
    let start = Instant::now();
    loop {
        let parked = rt
            .dump()
            .fibers
            .iter()
            .any(|f| f.id == id && f.state == fiber::core::state::FiberState::Parked && ok(f.since));
        if parked {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "fiber {id} never reached the state"
        );
        std::thread::sleep(ms(1));
    }
}
