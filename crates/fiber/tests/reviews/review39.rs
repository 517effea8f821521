//! Review 39: API conformance corners against crossbeam-channel's, Go's
//! and `std::sync`'s documented behaviour, on fibers, plain threads and
//! both mixed.
use crate::common::*;

use fiber::chan::{
    self, after, at, bounded, never, tick, unbounded, RecvTimeoutError, SendTimeoutError, TryRecvError, TrySendError,
};
use fiber::select;
use fiber::sync::{Barrier, Condvar, Mutex, Once, OnceLock, RwLock, TryLockError};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Locks its mutex in its destructor (so during an unwind) and bumps it.
struct LockOnDrop(Arc<Mutex<u32>>);
impl Drop for LockOnDrop {
    fn drop(&mut self) {
        *self.0.lock().unwrap() += 1;
    }
}

/// Takes a write lock in its destructor and bumps the value.
struct WriteOnDrop(Arc<RwLock<u32>>);
impl Drop for WriteOnDrop {
    fn drop(&mut self) {
        *self.0.write().unwrap() += 1;
    }
}

/// Wait on a plain thread (polling) until `cond` holds, at most 10 s.
fn thread_wait_until(what: &str, cond: impl Fn() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "timed out waiting for {what}"
        );
        std::thread::sleep(ms(1));
    }
}

// ---------------------------------------------------------------------
// std::sync poisoning
// ---------------------------------------------------------------------

/// std: a guard taken while its thread is already panicking (in a
/// destructor run by the unwind) does not poison the lock when it is
/// dropped in the same unwind; only a panic that began while the guard was
/// held does. On a plain thread and in a fiber, uncontended.
#[test]
fn a_guard_taken_during_an_unwind_does_not_poison() {
    within(20, || {
        // Plain thread.
        let m = Arc::new(Mutex::new(0u32));
        let rw = Arc::new(RwLock::new(0u32));
        let (m2, rw2) = (m.clone(), rw.clone());
        let r = std::thread::spawn(move || {
            let _a = LockOnDrop(m2);
            let _b = WriteOnDrop(rw2);
            panic!("boom");
        })
        .join();
        assert!(r.is_err());
        assert!(
            !m.is_poisoned(),
            "thread: a guard taken during the unwind poisoned the mutex"
        );
        assert!(
            !rw.is_poisoned(),
            "thread: a guard taken during the unwind poisoned the rwlock"
        );
        assert_eq!(*m.lock().unwrap(), 1);
        assert_eq!(*rw.read().unwrap(), 1);

        // Fiber.
        rt2().block_on(move || {
            let (m2, rw2) = (m.clone(), rw.clone());
            let h = fiber::spawn(move || {
                let _a = LockOnDrop(m2);
                let _b = WriteOnDrop(rw2);
                panic!("boom");
            });
            assert!(h.join().unwrap_err().is_panic());
            assert!(
                !m.is_poisoned(),
                "fiber: a guard taken during the unwind poisoned the mutex"
            );
            assert!(
                !rw.is_poisoned(),
                "fiber: a guard taken during the unwind poisoned the rwlock"
            );
            assert_eq!(*m.lock().unwrap(), 2);
            assert_eq!(*rw.read().unwrap(), 2);
        });
    });
}

/// The same with contention: the unwinding fiber's destructor has to wait
/// for the lock (held by another fiber, then by a plain thread) and gets it
/// later, maybe on another worker; dropping that guard still does not
/// poison. A guard held when the panic began does poison.
#[test]
fn a_contended_guard_taken_during_an_unwind_does_not_poison() {
    within(30, || {
        rt2().block_on(|| {
            for holder_is_thread in [false, true] {
                let m = Arc::new(Mutex::new(0u32));
                let (held_tx, held_rx) = bounded::<()>(0);
                let (release_tx, release_rx) = bounded::<()>(0);
                let m2 = m.clone();
                let hold = move || {
                    let g = m2.lock().unwrap();
                    held_tx.send(()).unwrap();
                    release_rx.recv().unwrap();
                    drop(g);
                };
                let thread = if holder_is_thread {
                    Some(std::thread::spawn(hold))
                } else {
                    fiber::spawn(hold);
                    None
                };
                held_rx.recv().unwrap();
                let m3 = m.clone();
                let h = fiber::spawn(move || {
                    let _a = LockOnDrop(m3);
                    panic!("boom");
                });
                wait_fiber_parked(h.id());
                release_tx.send(()).unwrap();
                assert!(h.join().unwrap_err().is_panic());
                if let Some(t) = thread {
                    t.join().unwrap();
                }
                assert!(
                    !m.is_poisoned(),
                    "a contended guard taken during the unwind poisoned the mutex (holder thread: {holder_is_thread})"
                );
                assert_eq!(*m.lock().unwrap(), 1);
            }
            // A guard held when the panic begins poisons.
            let m = Arc::new(Mutex::new(0u32));
            let m2 = m.clone();
            let h = fiber::spawn(move || {
                let _g = m2.lock().unwrap();
                fiber::yield_now().unwrap();
                panic!("boom");
            });
            assert!(h.join().is_err());
            assert!(m.is_poisoned());
        });
    });
}

/// std's poisoning rules end to end: `lock` / `try_lock` / `get_mut` /
/// `into_inner` report the poison with the data inside; `try_lock` on a
/// poisoned mutex held by someone else is `WouldBlock`, not `Poisoned`;
/// `clear_poison` makes it healthy; a guard recovered through
/// `PoisonError::into_inner` that is held across another panic poisons
/// again. Threads and fibers share the mutex.
#[test]
fn mutex_poisoning_round_trip_across_threads_and_fibers() {
    within(20, || {
        let m = Arc::new(Mutex::new(vec![1u32]));
        let m2 = m.clone();
        assert!(std::thread::spawn(move || {
            let mut g = m2.lock().unwrap();
            g.push(2);
            panic!("thread poisons");
        })
        .join()
        .is_err());
        assert!(m.is_poisoned());
        rt2().block_on(move || {
            // Poisoned and free: try_lock is Poisoned with the data.
            match m.try_lock() {
                Err(TryLockError::Poisoned(e)) => assert_eq!(*e.into_inner(), vec![1, 2]),
                other => panic!("expected Poisoned, got {:?}", other.map(|_| ())),
            }
            // Poisoned and held by a fiber: WouldBlock.
            let (held_tx, held_rx) = bounded::<()>(0);
            let (rel_tx, rel_rx) = bounded::<()>(0);
            let m2 = m.clone();
            let holder = fiber::spawn(move || {
                let g = m2.lock().unwrap_or_else(|e| e.into_inner());
                held_tx.send(()).unwrap();
                rel_rx.recv().unwrap();
                drop(g);
            });
            held_rx.recv().unwrap();
            assert!(matches!(m.try_lock(), Err(TryLockError::WouldBlock)));
            rel_tx.send(()).unwrap();
            holder.join().unwrap();
            assert!(m.is_poisoned(), "a clean holder must not clear the poison");
            m.clear_poison();
            assert!(!m.is_poisoned());
            assert_eq!(*m.lock().unwrap(), vec![1, 2]);
            // A fiber panics while holding a recovered guard: poisoned again.
            let m2 = m.clone();
            assert!(fiber::spawn(move || {
                let mut g = m2.lock().unwrap();
                g.push(3);
                panic!("fiber poisons");
            })
            .join()
            .is_err());
            assert!(m.lock().is_err());
            let mut inner = Arc::try_unwrap(m).expect("last handle");
            assert_eq!(*inner.get_mut().unwrap_err().into_inner(), vec![1, 2, 3]);
            assert_eq!(inner.into_inner().unwrap_err().into_inner(), vec![1, 2, 3]);
        });
    });
}

// ---------------------------------------------------------------------
// Condvar
// ---------------------------------------------------------------------

/// std: `wait_timeout_while` keeps waiting through notifications that do
/// not make the condition false (spurious wake-ups for it), and reports a
/// timeout only if the condition still holds at the end; the whole wait
/// lasts about the timeout, not a fresh timeout per wake-up. The waiter is
/// a fiber, the notifier a plain thread, then the other way round.
#[test]
fn condvar_wait_timeout_while_survives_spurious_notifies() {
    within(30, || {
        let pair = Arc::new((Mutex::new(0u32), Condvar::new()));
        let stop = Arc::new(AtomicBool::new(false));
        // Notifier: a plain thread that notifies without changing the state.
        let (p2, s2) = (pair.clone(), stop.clone());
        let noisy = std::thread::spawn(move || {
            while !s2.load(SeqCst) {
                let g = p2.0.lock().unwrap();
                p2.1.notify_all();
                drop(g);
                std::thread::sleep(ms(2));
            }
        });
        let p3 = pair.clone();
        let (elapsed, timed_out, value) = rt2().block_on(move || {
            let start = Instant::now();
            let (g, r) =
                p3.1.wait_timeout_while(p3.0.lock().unwrap(), ms(150), |v| *v == 0)
                    .unwrap();
            (start.elapsed(), r.timed_out(), *g)
        });
        stop.store(true, SeqCst);
        noisy.join().unwrap();
        assert!(timed_out);
        assert_eq!(value, 0);
        assert!(elapsed >= ms(150), "returned early after {elapsed:?}");
        assert!(
            elapsed < Duration::from_secs(5),
            "the timeout restarted on each wake-up: {elapsed:?}"
        );

        // Fiber notifier (noisy, then setting the state), thread waiter.
        let rt = rt2();
        let p4 = pair.clone();
        let notifier = rt.handle().spawn(move || {
            for i in 0..20u32 {
                let mut g = p4.0.lock().unwrap();
                if i == 19 {
                    *g = 7;
                }
                p4.1.notify_one();
                drop(g);
                fiber::sleep(ms(2)).unwrap();
            }
        });
        let (g, r) = pair
            .1
            .wait_timeout_while(pair.0.lock().unwrap(), Duration::from_secs(10), |v| *v == 0)
            .unwrap();
        assert!(!r.timed_out());
        assert_eq!(*g, 7);
        drop(g);
        let _ = notifier;
    });
}

/// std: a condvar wait returns `Err` (holding the guard) when the mutex is
/// poisoned, also when it was poisoned while the caller waited, and the
/// timed forms keep the `WaitTimeoutResult` in the error.
#[test]
fn condvar_waits_report_poison_from_a_panic_during_the_wait() {
    within(20, || {
        rt2().block_on(|| {
            let pair = Arc::new((Mutex::new(false), Condvar::new()));
            let p2 = pair.clone();
            let waiter = fiber::spawn(move || {
                let r =
                    p2.1.wait_timeout_while(p2.0.lock().unwrap(), Duration::from_secs(20), |v| !*v);
                match r {
                    Err(e) => {
                        let (g, t) = e.into_inner();
                        (true, *g, t.timed_out())
                    }
                    Ok((g, t)) => (false, *g, t.timed_out()),
                }
            });
            wait_fiber_parked(waiter.id());
            let p3 = pair.clone();
            assert!(std::thread::spawn(move || {
                let mut g = p3.0.lock().unwrap();
                *g = true;
                p3.1.notify_all();
                panic!("poison while the fiber waits");
            })
            .join()
            .is_err());
            assert_eq!(waiter.join().unwrap(), (true, true, false));
            // A plain wait on the poisoned mutex returns Err too.
            let g = pair.0.lock().unwrap_err().into_inner();
            let (g, t) = pair.1.wait_timeout(g, ms(1)).unwrap_err().into_inner();
            assert!(t.timed_out());
            assert!(*g);
        });
    });
}

// ---------------------------------------------------------------------
// Barrier
// ---------------------------------------------------------------------

/// std: exactly one leader per generation, and the barrier is reusable:
/// 2 plain threads and 2 fibers go through 200 generations in lockstep;
/// each generation has one leader.
#[test]
fn barrier_one_leader_per_generation_threads_and_fibers_mixed() {
    within(60, || {
        const ROUNDS: usize = 200;
        let barrier = Arc::new(Barrier::new(4));
        let leaders: Arc<Vec<AtomicUsize>> = Arc::new((0..ROUNDS).map(|_| AtomicUsize::new(0)).collect());
        let party = {
            let (barrier, leaders) = (barrier.clone(), leaders.clone());
            move || {
                for leader in leaders.iter() {
                    if barrier.wait().is_leader() {
                        leader.fetch_add(1, SeqCst);
                    }
                }
            }
        };
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let p = party.clone();
                std::thread::spawn(p)
            })
            .collect();
        rt2().block_on(move || {
            let fibers: Vec<_> = (0..2).map(|_| fiber::spawn(party.clone())).collect();
            for f in fibers {
                f.join().unwrap();
            }
        });
        for t in threads {
            t.join().unwrap();
        }
        for (i, l) in leaders.iter().enumerate() {
            assert_eq!(l.load(SeqCst), 1, "generation {i} had {} leaders", l.load(SeqCst));
        }
        assert_eq!(barrier.generation(), ROUNDS as u64);
    });
}

// ---------------------------------------------------------------------
// OnceLock / Once
// ---------------------------------------------------------------------

/// std: `set` while another caller's initializer runs waits for it and
/// then fails with the value; `get` meanwhile is `None`; `take` empties
/// the cell so `set` works again; `into_inner` gives the value. The
/// initializer is a parked fiber, `set` comes from a plain thread.
#[test]
fn once_lock_set_during_a_parked_initializer_waits_then_fails() {
    within(20, || {
        let cell = Arc::new(OnceLock::<String>::new());
        let (go_tx, go_rx) = bounded::<()>(0);
        let (in_tx, in_rx) = bounded::<()>(0);
        let rt = rt2();
        let c2 = cell.clone();
        let init = rt.handle().spawn(move || {
            c2.get_or_init(|| {
                in_tx.send(()).unwrap();
                go_rx.recv().unwrap();
                "fiber".to_string()
            })
            .clone()
        });
        in_rx.recv().unwrap();
        assert!(cell.get().is_none());
        let c3 = cell.clone();
        let setter = std::thread::spawn(move || c3.set("thread".to_string()));
        std::thread::sleep(ms(30));
        assert!(!setter.is_finished(), "set did not wait for the running initializer");
        go_tx.send(()).unwrap();
        assert_eq!(setter.join().unwrap(), Err("thread".to_string()));
        assert_eq!(cell.get().map(String::as_str), Some("fiber"));
        drop(rt);
        let _ = init;
        let mut cell = Arc::try_unwrap(cell).unwrap();
        assert_eq!(cell.take().as_deref(), Some("fiber"));
        assert!(cell.get().is_none());
        assert_eq!(cell.set("again".into()), Ok(()));
        assert_eq!(cell.set("third".into()), Err("third".into()));
        assert_eq!(cell.clone().into_inner().as_deref(), Some("again"));
        assert_eq!(cell.into_inner().as_deref(), Some("again"));
    });
}

/// std: `Once::call_once_force` on a poisoned `Once` sees `is_poisoned`,
/// and once it returns the `Once` is complete (so `call_once`, `wait` and
/// `is_completed` agree); `wait_force` on a poisoned `Once` waits for a
/// completion rather than returning.
#[test]
fn once_recovery_and_wait_force_follow_std() {
    within(20, || {
        let once = Arc::new(Once::new());
        let o2 = once.clone();
        assert!(std::thread::spawn(move || o2.call_once(|| panic!("poison")))
            .join()
            .is_err());
        assert!(!once.is_completed());
        assert!(panic_message(|| once.call_once(|| {})).is_some());
        rt2().block_on(move || {
            let o3 = once.clone();
            let w = fiber::spawn(move || {
                o3.wait_force();
                o3.is_completed()
            });
            wait_fiber_parked(w.id());
            let mut saw = None;
            once.call_once_force(|s| saw = Some(s.is_poisoned()));
            assert_eq!(saw, Some(true));
            assert!(w.join().unwrap());
            assert!(once.is_completed());
            once.call_once(|| panic!("must not run"));
            once.wait();
        });
    });
}

// ---------------------------------------------------------------------
// RwLock
// ---------------------------------------------------------------------

/// Writer preference with plain threads only: while a reader holds the lock
/// and a writer waits, a new `try_read` is refused (`WouldBlock`) and a new
/// blocking reader waits behind the writer; the writer gets the lock once
/// the first reader leaves, then the late reader.
#[test]
fn rwlock_waiting_writer_blocks_new_readers_on_threads() {
    within(20, || {
        let lock = Arc::new(RwLock::new(0u32));
        let r1 = lock.read().unwrap();
        let l2 = lock.clone();
        let writer = std::thread::spawn(move || {
            let mut g = l2.write().unwrap();
            *g += 1;
        });
        thread_wait_until("the writer to queue", || {
            matches!(lock.try_read(), Err(TryLockError::WouldBlock))
        });
        let l3 = lock.clone();
        let reader = std::thread::spawn(move || *l3.read().unwrap());
        std::thread::sleep(ms(20));
        assert!(!reader.is_finished(), "a reader passed the waiting writer");
        drop(r1);
        writer.join().unwrap();
        assert_eq!(reader.join().unwrap(), 1, "the late reader ran before the writer");
    });
}

/// std: `downgrade` keeps the value and admits other readers at once, and
/// a write guard recovered from a poisoned lock downgrades too (the read
/// guard then does not poison).
#[test]
fn rwlock_downgrade_of_a_recovered_poisoned_guard() {
    within(20, || {
        let lock = Arc::new(RwLock::new(1u32));
        let l2 = lock.clone();
        assert!(std::thread::spawn(move || {
            let _g = l2.write().unwrap();
            panic!("poison");
        })
        .join()
        .is_err());
        rt2().block_on(move || {
            let mut w = lock.write().unwrap_err().into_inner();
            *w = 5;
            let r = fiber::sync::RwLockWriteGuard::downgrade(w);
            assert_eq!(*r, 5);
            let l3 = lock.clone();
            let other = fiber::spawn(move || *l3.read().unwrap_or_else(|e| e.into_inner()));
            assert_eq!(other.join().unwrap(), 5);
            assert!(matches!(lock.try_write(), Err(TryLockError::WouldBlock)));
            drop(r);
            assert!(lock.is_poisoned());
            lock.clear_poison();
            assert_eq!(*lock.try_write().unwrap(), 5);
        });
    });
}

// ---------------------------------------------------------------------
// Channels: timeouts and deadlines
// ---------------------------------------------------------------------

/// crossbeam: `send_timeout(v, ZERO)` / `send_deadline(v, past)` on a
/// rendezvous channel whose receiver is already waiting hands the value
/// over (it is ready); with no receiver it times out with the value.
/// The receiver is a plain thread, then a fiber; the sender a fiber, then
/// a plain thread.
#[test]
fn zero_timeout_send_to_a_waiting_receiver_succeeds() {
    within(30, || {
        let rt = rt2();
        for (sender_in_fiber, receiver_in_fiber) in [(true, false), (false, true), (true, true)] {
            for deadline_form in [false, true] {
                let (tx, rx) = bounded::<u32>(0);
                let got = if receiver_in_fiber {
                    let h = rt.handle().spawn(move || rx.recv());
                    Box::new(move || h.join().unwrap()) as Box<dyn FnOnce() -> Result<u32, chan::RecvError>>
                } else {
                    let t = std::thread::spawn(move || rx.recv());
                    Box::new(move || t.join().unwrap()) as Box<dyn FnOnce() -> Result<u32, chan::RecvError>>
                };
                let send = move || {
                    let start = Instant::now();
                    while tx.waiting().0 == 0 {
                        assert!(start.elapsed() < Duration::from_secs(10));
                        std::thread::sleep(ms(1));
                    }
                    if deadline_form {
                        tx.send_deadline(9, Instant::now() - ms(5))
                    } else {
                        tx.send_timeout(9, Duration::ZERO)
                    }
                };
                let r = if sender_in_fiber { rt.block_on(send) } else { send() };
                assert_eq!(
                    r,
                    Ok(()),
                    "sender fiber {sender_in_fiber}, receiver fiber {receiver_in_fiber}, deadline {deadline_form}"
                );
                assert_eq!(got(), Ok(9));
            }
        }
        // Nobody waiting: timeout with the value back, on both.
        let (tx, _rx) = bounded::<u32>(0);
        assert_eq!(tx.send_timeout(3, Duration::ZERO), Err(SendTimeoutError::Timeout(3)));
        let tx2 = tx.clone();
        assert_eq!(
            rt.block_on(move || tx2.send_deadline(4, Instant::now())),
            Err(SendTimeoutError::Timeout(4))
        );
    });
}

/// crossbeam: a disconnected channel is reported as such by every timed
/// form, whatever the timeout (zero, a past deadline, `Duration::MAX`),
/// with the value back; buffered values are still received first.
#[test]
fn timed_operations_on_a_closed_channel_report_disconnection_not_timeout() {
    within(20, || {
        let check = || {
            let (tx, rx) = bounded::<u32>(2);
            tx.send(1).unwrap();
            rx.close();
            assert_eq!(
                tx.send_timeout(2, Duration::ZERO),
                Err(SendTimeoutError::Disconnected(2))
            );
            assert_eq!(
                tx.send_timeout(3, Duration::MAX),
                Err(SendTimeoutError::Disconnected(3))
            );
            assert_eq!(
                tx.send_deadline(4, Instant::now() - ms(1)),
                Err(SendTimeoutError::Disconnected(4))
            );
            assert_eq!(tx.try_send(5), Err(TrySendError::Disconnected(5)));
            assert_eq!(rx.recv_timeout(Duration::ZERO), Ok(1));
            assert_eq!(rx.recv_timeout(Duration::ZERO), Err(RecvTimeoutError::Disconnected));
            assert_eq!(
                rx.recv_deadline(Instant::now() - ms(1)),
                Err(RecvTimeoutError::Disconnected)
            );
            assert_eq!(rx.recv_timeout(Duration::MAX), Err(RecvTimeoutError::Disconnected));
            assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));
            // Rendezvous and unbounded too.
            let (tx0, rx0) = bounded::<u32>(0);
            drop(rx0);
            assert_eq!(
                tx0.send_timeout(6, Duration::ZERO),
                Err(SendTimeoutError::Disconnected(6))
            );
            assert_eq!(
                tx0.send_timeout(7, Duration::MAX),
                Err(SendTimeoutError::Disconnected(7))
            );
            let (txu, rxu) = unbounded::<u32>();
            drop(txu);
            assert_eq!(rxu.recv_timeout(Duration::ZERO), Err(RecvTimeoutError::Disconnected));
        };
        check();
        rt2().block_on(check);
    });
}

/// mpsc / crossbeam: a receiver waiting with a long (or `MAX`) timeout
/// learns of the last sender leaving at once (`Disconnected`), not when
/// its timeout ends; a sender waiting on a full channel learns of the last
/// receiver leaving likewise, with its value back.
#[test]
fn a_long_timed_wait_ends_at_once_on_disconnection() {
    within(30, || {
        let rt = rt2();
        for timeout in [Duration::from_secs(3600), Duration::MAX] {
            let (tx, rx) = unbounded::<u32>();
            let h = rt.handle().spawn(move || {
                let start = Instant::now();
                (rx.recv_timeout(timeout), start.elapsed())
            });
            thread_wait_until("the receiver to park", || tx.waiting().0 == 1);
            drop(tx);
            let (r, took) = h.join().unwrap();
            assert_eq!(r, Err(RecvTimeoutError::Disconnected));
            assert!(took < Duration::from_secs(10));

            let (tx, rx) = bounded::<String>(1);
            tx.send("a".into()).unwrap();
            let probe = tx.clone();
            let t = std::thread::spawn(move || tx.send_timeout("b".into(), timeout));
            thread_wait_until("the sender to park", || probe.waiting().1 == 1);
            drop(rx);
            assert_eq!(t.join().unwrap(), Err(SendTimeoutError::Disconnected("b".into())));
        }
    });
}

/// Deadlines far in the future (a century, and the last representable
/// instant) wait for the value like no deadline, in a fiber and on a
/// thread, for receives, sends, `Select` and condvar waits.
#[test]
fn far_future_deadlines_wait_for_the_peer() {
    within(30, || {
        let century = Duration::from_secs(100 * 365 * 24 * 3600);
        let last = last_instant();
        let body = move || {
            let (tx, rx) = bounded::<u32>(0);
            let t = std::thread::spawn(move || {
                std::thread::sleep(ms(20));
                tx.send(1).unwrap();
                std::thread::sleep(ms(20));
                tx.send(2).unwrap();
                std::thread::sleep(ms(20));
                tx.send(3).unwrap();
            });
            assert_eq!(rx.recv_timeout(century), Ok(1));
            assert_eq!(rx.recv_deadline(last), Ok(2));
            let mut sel = chan::Select::new();
            let i = sel.recv(&rx);
            let op = sel.select_deadline(last).expect("a far deadline does not time out");
            assert_eq!(op.index(), i);
            assert_eq!(op.recv(&rx), Ok(3));
            t.join().unwrap();

            let (tx, rx) = bounded::<u32>(1);
            tx.send(0).unwrap();
            let t = std::thread::spawn(move || {
                std::thread::sleep(ms(20));
                rx.recv().unwrap();
                rx.recv().unwrap()
            });
            assert_eq!(tx.send_deadline(5, last), Ok(()));
            assert_eq!(t.join().unwrap(), 5);

            // A century-long timer does not fire early.
            let late = after(century);
            assert_eq!(late.recv_timeout(ms(20)), Err(RecvTimeoutError::Timeout));
            let r = select! {
                recv(late) -> _ => 1,
                recv(after(ms(20))) -> _ => 2,
            };
            assert_eq!(r, 2);

            let pair = Arc::new((Mutex::new(false), Condvar::new()));
            let p2 = pair.clone();
            let t = std::thread::spawn(move || {
                std::thread::sleep(ms(20));
                *p2.0.lock().unwrap() = true;
                p2.1.notify_all();
            });
            let (g, res) = pair
                .1
                .wait_timeout_while(pair.0.lock().unwrap(), century, |v| !*v)
                .unwrap();
            assert!(*g && !res.timed_out());
            drop(g);
            t.join().unwrap();
        };
        body();
        rt2().block_on(body);
    });
}

// ---------------------------------------------------------------------
// select!
// ---------------------------------------------------------------------

/// crossbeam: `default(Duration::MAX)` waits for an operation like a
/// blocking select; a timer arm that is due before the `default` timeout
/// wins over it, and a `default` timeout shorter than a timer arm wins.
#[test]
fn select_default_timeouts_against_timer_arms() {
    within(30, || {
        let body = || {
            let (tx, rx) = unbounded::<u32>();
            let t = std::thread::spawn(move || {
                std::thread::sleep(ms(30));
                tx.send(5).unwrap();
            });
            let r = select! {
                recv(rx) -> v => v.unwrap(),
                default(Duration::MAX) => 0,
            };
            assert_eq!(r, 5);
            t.join().unwrap();

            let start = Instant::now();
            let r = select! {
                recv(after(ms(20))) -> _ => 1,
                default(Duration::from_secs(20)) => 2,
            };
            assert_eq!(r, 1);
            assert!(start.elapsed() < Duration::from_secs(10));

            let start = Instant::now();
            let r = select! {
                recv(after(Duration::from_secs(20))) -> _ => 1,
                default(ms(20)) => 2,
            };
            assert_eq!(r, 2);
            assert!(start.elapsed() >= ms(20) && start.elapsed() < Duration::from_secs(10));

            // A disconnected channel is ready: its arm is taken, not default.
            let (txd, rxd) = unbounded::<u32>();
            drop(txd);
            let r = select! {
                recv(rxd) -> v => v.is_err(),
                default => false,
            };
            assert!(r, "a disconnected receive arm is ready");
            let (txs, rxs) = bounded::<String>(0);
            drop(rxs);
            let r = select! {
                send(txs, "v".to_string()) -> res => res.unwrap_err().into_inner(),
                default(Duration::ZERO) => "default".to_string(),
            };
            assert_eq!(
                r, "v",
                "a send arm to a disconnected channel is ready and returns its value"
            );
        };
        body();
        rt2().block_on(body);
    });
}

/// crossbeam: `Select::remove` keeps the other indices, and a new
/// operation gets the next index (indices are never reused); removing
/// twice panics.
#[test]
fn select_remove_keeps_indices_and_rejects_double_removal() {
    within(20, || {
        let (tx1, rx1) = unbounded::<u32>();
        let (tx2, rx2) = unbounded::<u32>();
        let (tx3, rx3) = unbounded::<u32>();
        tx1.send(1).unwrap();
        tx2.send(2).unwrap();
        tx3.send(3).unwrap();
        let mut sel = chan::Select::new();
        let i1 = sel.recv(&rx1);
        let i2 = sel.recv(&rx2);
        assert_eq!((i1, i2), (0, 1));
        sel.remove(i1);
        let i3 = sel.recv(&rx3);
        assert_eq!(i3, 2, "a new operation takes a fresh index");
        let mut seen = Vec::new();
        for _ in 0..2 {
            let op = sel.select();
            let idx = op.index();
            let v = if idx == i2 { op.recv(&rx2) } else { op.recv(&rx3) };
            seen.push((idx, v.unwrap()));
        }
        seen.sort();
        assert_eq!(seen, vec![(1, 2), (2, 3)]);
        assert_eq!(rx1.try_recv(), Ok(1), "the removed operation took nothing");
        assert!(panic_message(|| sel.remove(i1)).is_some());
        assert!(panic_message(|| sel.remove(17)).is_some());
    });
}

// ---------------------------------------------------------------------
// Timer channels shared between receivers
// ---------------------------------------------------------------------

/// crossbeam: a cloned `after` receiver shares the one message: of two
/// receivers (a thread and a fiber) exactly one gets it; a shared `tick`
/// gives each tick to one receiver only.
#[test]
fn shared_timer_channels_deliver_each_message_once() {
    within(30, || {
        let rt = rt2();
        for _ in 0..5 {
            let a = after(ms(10));
            let b = a.clone();
            let f = rt.handle().spawn(move || b.recv_timeout(ms(300)).is_ok());
            let t = a.recv_timeout(ms(300)).is_ok();
            let f = f.join().unwrap();
            assert!(t ^ f, "thread got it: {t}, fiber got it: {f}");
        }
        let t = tick(ms(5));
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut hs = Vec::new();
        for _ in 0..2 {
            let (t, seen) = (t.clone(), seen.clone());
            hs.push(rt.handle().spawn(move || {
                for _ in 0..10 {
                    let at = t.recv().unwrap();
                    seen.lock().unwrap().push(at);
                }
            }));
        }
        let (t2, seen2) = (t.clone(), seen.clone());
        let th = std::thread::spawn(move || {
            for _ in 0..10 {
                let at = t2.recv().unwrap();
                seen2.lock().unwrap().push(at);
            }
        });
        for h in hs {
            h.join().unwrap();
        }
        th.join().unwrap();
        let mut v = seen.lock().unwrap().clone();
        let n = v.len();
        v.sort();
        v.dedup();
        assert_eq!(v.len(), n, "a tick was delivered twice");
        assert_eq!(n, 30);
    });
}

/// crossbeam's `at(when)` delivers `when` itself (past or future) and
/// `tick(ZERO)` is always ready; `never` and an exhausted `after` time out
/// on every timed form.
#[test]
fn timer_channel_messages_and_exhaustion() {
    within(20, || {
        let body = || {
            let when = Instant::now() + ms(15);
            let r = at(when);
            assert!(r.is_empty());
            assert_eq!(r.recv(), Ok(when));
            assert!(Instant::now() >= when);
            assert_eq!(r.recv_timeout(Duration::ZERO), Err(RecvTimeoutError::Timeout));
            assert_eq!(r.recv_deadline(Instant::now() + ms(5)), Err(RecvTimeoutError::Timeout));
            assert_eq!(r.try_iter().count(), 0);
            let z = tick(Duration::ZERO);
            for _ in 0..3 {
                assert!(z.try_recv().is_ok());
                assert!(z.recv_timeout(Duration::ZERO).is_ok());
            }
            let n = never::<u8>();
            assert_eq!(n.recv_deadline(Instant::now() - ms(1)), Err(RecvTimeoutError::Timeout));
            assert!(!n.is_closed());
            assert!(!n.close());
        };
        body();
        rt2().block_on(body);
    });
}

// ---------------------------------------------------------------------
// Iterators after disconnection
// ---------------------------------------------------------------------

/// crossbeam / Go: after the receiving side closes, the values already
/// buffered (and a sender parked before the close) are still received by
/// `iter`, then it ends for good; `try_iter` drains and stops;
/// `into_iter` over a cloned receiver behaves the same.
#[test]
fn iterators_drain_after_close_then_end() {
    within(20, || {
        rt2().block_on(|| {
            let (tx, rx) = bounded::<u32>(2);
            tx.send(1).unwrap();
            tx.send(2).unwrap();
            let t2 = tx.clone();
            let parked = fiber::spawn(move || t2.send(3));
            wait_fiber_parked(parked.id());
            assert!(rx.close());
            assert!(!tx.close(), "a second close reports it was closed");
            assert_eq!(tx.send(4), Err(chan::SendError(4)));
            let rx2 = rx.clone();
            let mut it = rx.iter();
            assert_eq!(it.next(), Some(1));
            let rest: Vec<u32> = rx2.into_iter().collect();
            assert_eq!(rest, vec![2, 3]);
            assert_eq!(it.next(), None);
            assert_eq!(it.next(), None);
            assert_eq!(parked.join().unwrap(), Ok(()));
            assert_eq!(rx.try_iter().count(), 0);
            assert_eq!(rx.len(), 0);
            assert!(rx.is_empty() && !rx.is_full());
            assert_eq!(rx.capacity(), Some(2));
        });
    });
}

/// Sizes as crossbeam reports them: a bounded channel holding its
/// capacity after the close is still full; `same_channel` holds across
/// clones of both ends and not across channels.
#[test]
fn sizes_and_identity_after_close() {
    within(10, || {
        let (tx, rx) = bounded::<u8>(2);
        tx.send(1).unwrap();
        tx.send(2).unwrap();
        drop(tx.clone());
        let tx2 = tx.clone();
        assert!(tx.same_channel(&tx2));
        assert!(rx.same_channel(&rx.clone()));
        let (other_tx, other_rx) = bounded::<u8>(2);
        assert!(!tx.same_channel(&other_tx));
        assert!(!rx.same_channel(&other_rx));
        drop(tx);
        drop(tx2);
        assert!(rx.is_closed());
        assert_eq!((rx.len(), rx.is_full(), rx.is_empty()), (2, true, false));
        assert_eq!(rx.recv(), Ok(1));
        assert_eq!((rx.len(), rx.is_full()), (1, false));
        assert_eq!(rx.recv(), Ok(2));
        assert_eq!(rx.recv(), Err(chan::RecvError));
        let (txu, rxu) = unbounded::<u8>();
        for i in 0..100 {
            txu.send(i).unwrap();
        }
        assert_eq!((rxu.len(), rxu.is_full(), rxu.capacity()), (100, false, None));
    });
}

/// Counts drops of the values it wraps.
struct Counted(Arc<AtomicUsize>);
impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, SeqCst);
    }
}

/// crossbeam: when the last receiver leaves, the buffered values are
/// dropped at once and the senders see an empty, disconnected channel
/// (`len` 0), for every flavour.
#[test]
fn last_receiver_leaving_empties_the_buffer() {
    within(10, || {
        for cap in [Some(3), None] {
            let drops = Arc::new(AtomicUsize::new(0));
            let (tx, rx) = match cap {
                Some(c) => bounded::<Counted>(c),
                None => unbounded::<Counted>(),
            };
            for _ in 0..3 {
                assert!(tx.send(Counted(drops.clone())).is_ok());
            }
            assert_eq!(tx.len(), 3);
            drop(rx);
            assert_eq!(
                drops.load(SeqCst),
                3,
                "buffered values outlived the last receiver ({cap:?})"
            );
            assert_eq!(tx.len(), 0);
            assert!(tx.is_empty());
            assert!(tx.is_closed());
            let back = tx.send(Counted(drops.clone())).unwrap_err().into_inner();
            assert_eq!(drops.load(SeqCst), 3);
            drop(back);
            assert_eq!(drops.load(SeqCst), 4);
        }
    });
}

/// crossbeam's `Select::ready*` with timer operations: an `after` is ready
/// once due (and its message is still there to take), `never` is never
/// ready, a disconnected channel is ready; `try_ready` on nothing ready
/// fails, and a biased select reports the first ready operation.
#[test]
fn select_ready_with_timers_and_disconnection() {
    within(20, || {
        let body = || {
            // Before the timer is made: its 20 ms count from its creation,
            // and a loaded machine may pause this thread before the wait.
            let start = Instant::now();
            let late = after(ms(20));
            let nev = never::<u32>();
            let (tx, rx) = unbounded::<u32>();
            let mut sel = chan::Select::new();
            let i_nev = sel.recv(&nev);
            let i_late = sel.recv(&late);
            assert!(sel.try_ready().is_err());
            assert_eq!(sel.ready_timeout(Duration::from_secs(10)), Ok(i_late));
            assert!(start.elapsed() >= ms(20));
            assert!(late.try_recv().is_ok(), "ready must not consume the timer's message");
            sel.remove(i_late);
            assert!(sel.ready_timeout(ms(10)).is_err());
            let i_rx = sel.recv(&rx);
            drop(tx);
            assert_ne!(i_nev, i_rx);
            assert_eq!(sel.ready(), i_rx);

            // Biased: the first ready operation, every time.
            let (t1, r1) = unbounded::<u32>();
            let (t2, r2) = unbounded::<u32>();
            t1.send(1).unwrap();
            t2.send(2).unwrap();
            let mut b = chan::Select::new_biased();
            let a = b.recv(&r2);
            let _ = b.recv(&r1);
            for _ in 0..20 {
                assert_eq!(b.try_ready(), Ok(a));
            }
            let got = fiber::chan::select_biased! {
                recv(r1) -> v => v.unwrap(),
                recv(r2) -> v => v.unwrap(),
            };
            assert_eq!(got, 1);
        };
        body();
        rt2().block_on(body);
    });
}

/// A plain thread blocked on a channel or a lock whose other side is a
/// fiber learns when the runtime is dropped: the fiber is unwound, its
/// sender goes (the receive fails) and its guard goes (the lock is
/// poisoned, as std's after a panicking holder): no hang.
#[test]
fn a_thread_waiting_on_a_fiber_is_released_when_the_runtime_drops() {
    within(30, || {
        let rt = rt_fixed_grace(2, ms(100));
        let (tx, rx) = unbounded::<u32>();
        let m = Arc::new(Mutex::new(0u32));
        let (held_tx, held_rx) = bounded::<()>(1);
        let m2 = m.clone();
        rt.handle().spawn(move || {
            let _keep = tx;
            let _g = m2.lock().unwrap();
            held_tx.send(()).unwrap();
            stubborn_sleep();
        });
        held_rx.recv().unwrap();
        let m3 = m.clone();
        let locker = std::thread::spawn(move || m3.lock().is_err());
        let receiver = std::thread::spawn(move || rx.recv());
        std::thread::sleep(ms(20));
        drop(rt);
        assert_eq!(receiver.join().unwrap(), Err(chan::RecvError));
        assert!(locker.join().unwrap(), "the unwound holder's guard should poison");
    });
}

/// A condvar-guarded queue shared by 2 plain-thread and 4 fiber consumers
/// using timed waits (`wait_timeout_while` with short timeouts, retrying)
/// and `notify_one` producers on both sides: every item is taken exactly
/// once and nobody is left waiting (no lost notification).
#[test]
fn condvar_queue_with_timed_waits_loses_no_item_mixed() {
    within(60, || {
        const ITEMS: u32 = 4000;
        struct Q {
            items: std::collections::VecDeque<u32>,
            done: bool,
        }
        let shared = Arc::new((
            Mutex::new(Q {
                items: Default::default(),
                done: false,
            }),
            Condvar::new(),
        ));
        let consume = {
            let shared = shared.clone();
            move |seed: u64| {
                let mut got = Vec::new();
                let mut x = seed;
                let (m, cv) = &*shared;
                let mut g = m.lock().unwrap();
                loop {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let t = Duration::from_micros(x % 3000);
                    let (g2, _) = cv.wait_timeout_while(g, t, |q| q.items.is_empty() && !q.done).unwrap();
                    g = g2;
                    if let Some(v) = g.items.pop_front() {
                        got.push(v);
                    } else if g.done {
                        return got;
                    }
                }
            }
        };
        let produce = {
            let shared = shared.clone();
            move |from: u32, to: u32| {
                for i in from..to {
                    let (m, cv) = &*shared;
                    m.lock().unwrap().items.push_back(i);
                    cv.notify_one();
                }
            }
        };
        let threads: Vec<_> = (0..2u64)
            .map(|s| {
                let c = consume.clone();
                std::thread::spawn(move || c(s + 1))
            })
            .collect();
        let p = produce.clone();
        let tp = std::thread::spawn(move || p(0, ITEMS / 2));
        let mut all = rt2().block_on(move || {
            let fibers: Vec<_> = (0..4u64)
                .map(|s| {
                    let c = consume.clone();
                    fiber::spawn(move || c(s + 11))
                })
                .collect();
            let p = produce.clone();
            fiber::spawn(move || p(ITEMS / 2, ITEMS)).join().unwrap();
            tp.join().unwrap();
            {
                let (m, cv) = &*shared;
                m.lock().unwrap().done = true;
                cv.notify_all();
            }
            let mut all = Vec::new();
            for f in fibers {
                all.extend(f.join().unwrap());
            }
            all
        });
        for t in threads {
            all.extend(t.join().unwrap());
        }
        all.sort_unstable();
        assert_eq!(all, (0..ITEMS).collect::<Vec<_>>());
    });
}

/// RwLock exclusion with readers and writers on threads and fibers mixed,
/// blocking and `try_*` forms and `downgrade`: a writer is always alone,
/// readers overlap only with readers, every write lands.
#[test]
fn rwlock_exclusion_mixed_threads_fibers_try_and_downgrade() {
    within(60, || {
        const ROUNDS: u32 = 300;
        let lock = Arc::new(RwLock::new(0u64));
        let readers = Arc::new(AtomicUsize::new(0));
        let writers = Arc::new(AtomicUsize::new(0));
        let worker = {
            let (lock, readers, writers) = (lock.clone(), readers.clone(), writers.clone());
            move |id: u32| {
                let mut writes = 0u64;
                for i in 0..ROUNDS {
                    match (i + id) % 5 {
                        0 | 1 => {
                            let g = lock.read().unwrap();
                            readers.fetch_add(1, SeqCst);
                            assert_eq!(writers.load(SeqCst), 0, "reader beside a writer");
                            let _ = *g;
                            readers.fetch_sub(1, SeqCst);
                        }
                        2 => {
                            let mut g = lock.write().unwrap();
                            assert_eq!(writers.fetch_add(1, SeqCst), 0, "two writers");
                            assert_eq!(readers.load(SeqCst), 0, "writer beside a reader");
                            *g += 1;
                            writes += 1;
                            writers.fetch_sub(1, SeqCst);
                        }
                        3 => {
                            if let Ok(mut g) = lock.try_write() {
                                assert_eq!(writers.fetch_add(1, SeqCst), 0, "two writers (try)");
                                assert_eq!(readers.load(SeqCst), 0, "try-writer beside a reader");
                                *g += 1;
                                writes += 1;
                                writers.fetch_sub(1, SeqCst);
                            }
                        }
                        _ => {
                            let mut g = lock.write().unwrap();
                            assert_eq!(writers.fetch_add(1, SeqCst), 0, "two writers (downgrade)");
                            *g += 1;
                            writes += 1;
                            writers.fetch_sub(1, SeqCst);
                            let r = fiber::sync::RwLockWriteGuard::downgrade(g);
                            readers.fetch_add(1, SeqCst);
                            assert_eq!(writers.load(SeqCst), 0, "writer beside a downgraded reader");
                            let _ = *r;
                            readers.fetch_sub(1, SeqCst);
                        }
                    }
                    if i % 16 == 0 {
                        if fiber::core::in_fiber() {
                            let _ = fiber::yield_now();
                        } else {
                            std::thread::yield_now();
                        }
                    }
                }
                writes
            }
        };
        let threads: Vec<_> = (0..2u32)
            .map(|id| {
                let w = worker.clone();
                std::thread::spawn(move || w(id))
            })
            .collect();
        let mut total = rt2().block_on(move || {
            let fibers: Vec<_> = (2..6u32)
                .map(|id| {
                    let w = worker.clone();
                    fiber::spawn(move || w(id))
                })
                .collect();
            fibers.into_iter().map(|f| f.join().unwrap()).sum::<u64>()
        });
        total += threads.into_iter().map(|t| t.join().unwrap()).sum::<u64>();
        assert_eq!(*lock.read().unwrap(), total);
    });
}

/// std's barrier: nobody leaves a generation before every party arrived
/// (checked with an arrival count per generation), over many reuses,
/// parties on threads and fibers, with one party a pinned fiber.
#[test]
fn barrier_nobody_leaves_before_everyone_arrived() {
    within(60, || {
        const ROUNDS: usize = 300;
        const N: usize = 4;
        let barrier = Arc::new(Barrier::new(N));
        let arrived: Arc<Vec<AtomicUsize>> = Arc::new((0..ROUNDS).map(|_| AtomicUsize::new(0)).collect());
        let party = {
            let (barrier, arrived) = (barrier.clone(), arrived.clone());
            move || {
                let mut leads = 0;
                for (g, a) in arrived.iter().enumerate() {
                    a.fetch_add(1, SeqCst);
                    if barrier.wait().is_leader() {
                        leads += 1;
                    }
                    assert_eq!(a.load(SeqCst), N, "left generation {g} before everyone arrived");
                }
                leads
            }
        };
        let p = party.clone();
        let t = std::thread::spawn(p);
        let fiber_leads = rt2().block_on(move || {
            let mut hs = vec![fiber::spawn_pinned(party.clone())];
            for _ in 0..2 {
                hs.push(fiber::spawn(party.clone()));
            }
            hs.into_iter().map(|h| h.join().unwrap()).sum::<usize>()
        });
        assert_eq!(fiber_leads + t.join().unwrap(), ROUNDS);
    });
}

/// A plain thread sending with timed sends and a fiber receiving through
/// `select!` with a short `default` timeout meet on a rendezvous channel
/// (each side's wait overlaps the other's), every value arrives once and
/// in order; after the sender's explicit `close`, a sender parked before
/// the close still delivers to the select (Go: buffered first), then the
/// select sees the disconnection.
#[test]
fn timed_thread_sends_meet_a_selecting_fiber_on_a_rendezvous_channel() {
    within(60, || {
        const N: u32 = 300;
        let (tx, rx) = bounded::<u32>(0);
        let tx2 = tx.clone();
        let sender = std::thread::spawn(move || {
            for i in 0..N {
                let mut v = i;
                loop {
                    match tx2.send_timeout(v, ms(3)) {
                        Ok(()) => break,
                        Err(SendTimeoutError::Timeout(back)) => v = back,
                        Err(SendTimeoutError::Disconnected(_)) => panic!("disconnected"),
                    }
                }
            }
            // Parks, then the main side closes: this send was admitted.
            tx2.send(N)
        });
        let got = rt2().block_on(move || {
            let mut got = Vec::new();
            while got.len() < N as usize {
                select! {
                    recv(rx) -> v => got.push(v.unwrap()),
                    default(ms(2)) => {}
                }
            }
            wait_until("the last sender to park", 10, || tx.waiting().1 == 1);
            assert!(tx.close());
            let last = select! {
                recv(rx) -> v => v,
                default(Duration::from_secs(10)) => panic!("the parked sender's value was lost"),
            };
            assert_eq!(last, Ok(N));
            let end = select! {
                recv(rx) -> v => v,
                default(Duration::from_secs(10)) => panic!("a closed, drained channel must be ready"),
            };
            assert_eq!(end, Err(chan::RecvError));
            got
        });
        assert_eq!(sender.join().unwrap(), Ok(()));
        assert_eq!(got, (0..N).collect::<Vec<_>>());
    });
}
