//! Conformance with the documented behaviour of `std::sync` for the
//! `fiber::sync` types that claim std's API: each rule runs inside a fiber
//! runtime and, where the type works on plain threads, on a plain thread.

use fiber::sync::{Barrier, Condvar, Mutex, OnceLock, RwLock};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, TryLockError};
use std::time::Duration;

use crate::common::{ms, on_runtime, within};

/// `body` in a fiber of a two-worker runtime, then on a plain thread.
fn in_fiber_and_thread(body: fn()) {
    on_runtime(body);
    within(30, body);
}

/// A fiber whose destructor waits (for a lock held by a plain thread)
/// while the fiber unwinds from a panic: `std::thread::panicking()` is per
/// OS thread, so the other fibers its worker runs meanwhile must not see it
/// true, and guards they drop normally must not poison their locks.
#[test]
fn a_destructor_waiting_during_an_unwind_does_not_leak_the_panic_to_other_fibers() {
    within(30, || {
        // One worker, so the fibers below share the unwinding fiber's thread.
        let rt = fiber::Runtime::builder()
            .workers(1)
            .shutdown_timeout(ms(500))
            .build()
            .unwrap();
        let gate = Arc::new(Mutex::new(()));
        let (locked_tx, locked_rx) = std::sync::mpsc::channel::<()>();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let g = gate.clone();
        // Holds the gate until a little after the destructor is about to
        // lock it. The pause only makes the destructor really wait (longer
        // than the lock's spin); the assertions hold for any pause.
        let holder = std::thread::spawn(move || {
            let held = g.lock().unwrap();
            locked_tx.send(()).unwrap();
            release_rx.recv().unwrap();
            std::thread::sleep(ms(5));
            drop(held);
        });
        locked_rx.recv().unwrap();
        rt.block_on(move || {
            struct LockOnDrop(Arc<Mutex<()>>, std::sync::mpsc::Sender<()>, fiber::chan::Sender<()>);
            impl Drop for LockOnDrop {
                fn drop(&mut self) {
                    let _ = self.1.send(());
                    let _ = self.2.send(());
                    let _g = self.0.lock();
                }
            }
            let (in_drop_tx, in_drop_rx) = fiber::chan::bounded(1);
            let panicker = fiber::spawn(move || {
                let _d = LockOnDrop(gate, release_tx, in_drop_tx);
                panic!("boom");
            });
            in_drop_rx.recv().unwrap();
            // The root runs on the same worker thread as the panicker.
            let root_saw = std::thread::panicking();
            let seen = Arc::new(AtomicUsize::new(0));
            let other = Arc::new(Mutex::new(0));
            let checkers: Vec<_> = (0..20)
                .map(|_| {
                    let (seen, other) = (seen.clone(), other.clone());
                    fiber::spawn(move || {
                        if std::thread::panicking() {
                            seen.fetch_add(1, Ordering::Relaxed);
                        }
                        *other.lock().unwrap() += 1;
                    })
                })
                .collect();
            for h in checkers {
                h.join().unwrap();
            }
            let err = panicker.join().unwrap_err();
            assert_eq!(err.into_panic().downcast_ref::<&str>(), Some(&"boom"));
            assert!(!root_saw, "the root fiber saw std::thread::panicking()");
            assert_eq!(seen.load(Ordering::Relaxed), 0, "fibers saw std::thread::panicking()");
            assert!(
                !other.is_poisoned(),
                "a guard dropped without a panic poisoned its lock"
            );
            let later: Vec<_> = (0..20).map(|_| fiber::spawn(std::thread::panicking)).collect();
            for h in later {
                assert!(!h.join().unwrap(), "a worker thread still reports panicking()");
            }
        });
        holder.join().unwrap();
    })
}

fn panic_while_holding<T: Send + Sync + 'static>(lock: Arc<T>, hold: fn(&T)) {
    let r = std::thread::spawn(move || {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| hold(&lock)));
    });
    r.join().unwrap();
}

fn poison_in_fiber_or_thread<T: Send + Sync + 'static>(lock: &Arc<T>, hold: fn(&T)) {
    let l = lock.clone();
    if fiber::core::in_fiber() {
        let h = fiber::spawn(move || hold(&l));
        assert!(h.join().unwrap_err().is_panic());
    } else {
        panic_while_holding(l, hold);
    }
}

/// std: a panic while a `MutexGuard` is held poisons the mutex; `lock`,
/// `try_lock`, `into_inner` and `get_mut` then return `Err` that still
/// gives the guard or the value (`PoisonError::into_inner`, `get_ref`,
/// `get_mut`); `clear_poison` makes it usable again.
#[test]
fn mutex_poisoning_is_std_s() {
    in_fiber_and_thread(|| {
        let m = Arc::new(Mutex::new(1));
        assert!(!m.is_poisoned());
        poison_in_fiber_or_thread(&m, |m| {
            let mut g = m.lock().unwrap();
            *g = 2;
            panic!("poison it");
        });
        assert!(m.is_poisoned());
        // The value written before the panic is there.
        let err = m.lock().unwrap_err();
        assert_eq!(**err.get_ref(), 2);
        let mut g = err.into_inner();
        *g = 3;
        drop(g);
        // Still poisoned: the poison sticks until cleared.
        assert!(m.is_poisoned());
        match m.try_lock() {
            Err(TryLockError::Poisoned(e)) => assert_eq!(*e.into_inner(), 3),
            other => panic!("try_lock on a poisoned, free mutex: {:?}", other.map(|_| ())),
        }
        {
            let _held = m.lock().unwrap_or_else(|e| e.into_inner());
            assert!(matches!(m.try_lock(), Err(TryLockError::WouldBlock)));
        }
        m.clear_poison();
        assert!(!m.is_poisoned());
        assert_eq!(*m.lock().unwrap(), 3);
        // into_inner / get_mut report poison while giving the value.
        poison_in_fiber_or_thread(&m, |m| {
            let _g = m.lock().unwrap();
            panic!("again");
        });
        let mut m = Arc::try_unwrap(m).unwrap();
        assert_eq!(*m.get_mut().unwrap_err().into_inner(), 3);
        assert_eq!(m.into_inner().unwrap_err().into_inner(), 3);
    });
}

/// std: a guard taken while the thread is already panicking (in a
/// destructor during an unwind) does not poison when dropped.
#[test]
fn mutex_locked_only_inside_a_destructor_during_unwind_is_not_poisoned() {
    in_fiber_and_thread(|| {
        struct LockInDrop(Arc<Mutex<u32>>);
        impl Drop for LockInDrop {
            fn drop(&mut self) {
                *self.0.lock().unwrap() += 1;
            }
        }
        let m = Arc::new(Mutex::new(0));
        let m2 = m.clone();
        let body = move || {
            let _d = LockInDrop(m2);
            panic!("unwinding");
        };
        if fiber::core::in_fiber() {
            assert!(fiber::spawn(body).join().is_err());
        } else {
            assert!(std::thread::spawn(body).join().is_err());
        }
        assert!(!m.is_poisoned(), "a guard taken and dropped during an unwind poisoned");
        assert_eq!(*m.lock().unwrap(), 1);
    });
}

/// std: `RwLock` lets many readers in at once, excludes a writer while
/// any reader or writer holds it (`try_*` report `WouldBlock`), and is
/// poisoned by a panicking writer, not by a panicking reader.
#[test]
fn rwlock_sharing_exclusion_and_poisoning_are_std_s() {
    in_fiber_and_thread(|| {
        let l = Arc::new(RwLock::new(5));
        {
            let r1 = l.read().unwrap();
            let r2 = l.try_read().unwrap();
            assert_eq!(*r1 + *r2, 10);
            assert!(matches!(l.try_write(), Err(TryLockError::WouldBlock)));
        }
        {
            let mut w = l.write().unwrap();
            *w = 6;
            assert!(matches!(l.try_read(), Err(TryLockError::WouldBlock)));
            assert!(matches!(l.try_write(), Err(TryLockError::WouldBlock)));
        }
        poison_in_fiber_or_thread(&l, |l| {
            let _r = l.read().unwrap();
            panic!("reader");
        });
        assert!(!l.is_poisoned(), "a panicking reader poisoned the RwLock");
        poison_in_fiber_or_thread(&l, |l| {
            let mut w = l.write().unwrap();
            *w = 7;
            panic!("writer");
        });
        assert!(l.is_poisoned());
        assert_eq!(*l.read().unwrap_err().into_inner(), 7);
        assert_eq!(*l.write().unwrap_err().into_inner(), 7);
        match l.try_read() {
            Err(TryLockError::Poisoned(e)) => assert_eq!(*e.into_inner(), 7),
            _ => panic!("try_read on a poisoned RwLock is not Poisoned"),
        }
        match l.try_write() {
            Err(TryLockError::Poisoned(e)) => assert_eq!(*e.into_inner(), 7),
            _ => panic!("try_write on a poisoned RwLock is not Poisoned"),
        }
        l.clear_poison();
        assert!(!l.is_poisoned());
        assert!(l.read().is_ok());
        poison_in_fiber_or_thread(&l, |l| {
            let _w = l.write().unwrap();
            panic!("writer again");
        });
        let mut l = Arc::try_unwrap(l).unwrap();
        assert_eq!(*l.get_mut().unwrap_err().into_inner(), 7);
        assert_eq!(l.into_inner().unwrap_err().into_inner(), 7);
    });
}

/// std: `Condvar::wait_timeout` with a zero duration returns at once with
/// `timed_out()`; `wait_timeout_while` with zero checks the condition once
/// (false: `timed_out() == false` without waiting); `Duration::MAX` never
/// panics and waits until notified.
#[test]
fn condvar_zero_and_max_timeouts_are_std_s() {
    in_fiber_and_thread(|| {
        let m = Mutex::new(0u32);
        let cv = Condvar::new();
        let (g, r) = cv.wait_timeout(m.lock().unwrap(), Duration::ZERO).unwrap();
        assert!(r.timed_out());
        let (g, r) = cv.wait_timeout_while(g, Duration::ZERO, |v| *v == 0).unwrap();
        assert!(r.timed_out(), "the condition still held and no time was left");
        let (g, r) = cv.wait_timeout_while(g, Duration::ZERO, |v| *v != 0).unwrap();
        assert!(!r.timed_out(), "the condition did not hold: not a timeout");
        let (g, r) = cv.wait_timeout_while(g, Duration::MAX, |v| *v != 0).unwrap();
        assert!(!r.timed_out());
        drop(g);
        // A long wait ended by a notification (from a plain thread).
        let pair = Arc::new((Mutex::new(false), Condvar::new()));
        let p = pair.clone();
        let t = std::thread::spawn(move || {
            *p.0.lock().unwrap() = true;
            p.1.notify_all();
        });
        let (m, cv) = &*pair;
        let (g, r) = cv
            .wait_timeout_while(m.lock().unwrap(), Duration::MAX, |ready| !*ready)
            .unwrap();
        assert!(*g && !r.timed_out());
        drop(g);
        t.join().unwrap();
        // `wait_timeout(Duration::MAX)`: returns on the notification.
        *m.lock().unwrap() = false;
        let p = pair.clone();
        let t = std::thread::spawn(move || {
            let (m, cv) = &*p;
            // The waiter sets the flag and waits without releasing the
            // lock in between, so this notification finds it queued.
            let mut g = cv.wait_while(m.lock().unwrap(), |waiting| !*waiting).unwrap();
            *g = false;
            cv.notify_all();
        });
        let mut g = m.lock().unwrap();
        *g = true;
        cv.notify_all();
        loop {
            let (g2, r) = cv.wait_timeout(g, Duration::MAX).unwrap();
            assert!(!r.timed_out(), "wait_timeout(Duration::MAX) timed out");
            g = g2;
            if !*g {
                break;
            }
        }
        drop(g);
        t.join().unwrap();
    });
}

/// std: exactly one `wait` per generation returns `is_leader()`, the
/// barrier is reusable, and `Barrier::new(0)` acts as `new(1)`.
#[test]
fn barrier_one_leader_per_generation_and_reuse() {
    in_fiber_and_thread(|| {
        let solo = Barrier::new(0);
        assert!(solo.wait().is_leader());
        assert!(Barrier::new(1).wait().is_leader());
        let n = 4;
        let barrier = Arc::new(Barrier::new(n));
        let leaders = Arc::new(AtomicUsize::new(0));
        let rounds = 3;
        let parties: Vec<Box<dyn FnOnce() + Send>> = (0..n - 1)
            .map(|_| {
                let (b, l) = (barrier.clone(), leaders.clone());
                Box::new(move || {
                    for _ in 0..rounds {
                        if b.wait().is_leader() {
                            l.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }) as Box<dyn FnOnce() + Send>
            })
            .collect();
        // Half the other parties are fibers when there is a runtime.
        let mut joins: Vec<Box<dyn FnOnce()>> = Vec::new();
        for (i, p) in parties.into_iter().enumerate() {
            if fiber::core::in_fiber() && i % 2 == 0 {
                let h = fiber::spawn(p);
                joins.push(Box::new(move || h.join().unwrap()));
            } else {
                let h = std::thread::spawn(p);
                joins.push(Box::new(move || h.join().unwrap()));
            }
        }
        for _ in 0..rounds {
            if barrier.wait().is_leader() {
                leaders.fetch_add(1, Ordering::Relaxed);
            }
        }
        for j in joins {
            j();
        }
        assert_eq!(leaders.load(Ordering::Relaxed), rounds, "one leader per generation");
    });
}

/// std: `OnceLock::set` fills an empty cell once (`Err(value)` after),
/// `get_or_init` runs one initializer, a panicking initializer leaves the
/// cell empty for the next caller, `get_mut`/`into_inner` give the value.
#[test]
fn once_lock_is_std_s() {
    in_fiber_and_thread(|| {
        let cell = OnceLock::new();
        assert_eq!(cell.get(), None);
        assert_eq!(cell.set(1), Ok(()));
        assert_eq!(cell.set(2), Err(2));
        assert_eq!(*cell.get_or_init(|| 3), 1);
        let cell: Arc<OnceLock<String>> = Arc::new(OnceLock::new());
        let c = cell.clone();
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            c.get_or_init(|| panic!("init fails"));
        }));
        assert!(panicked.is_err());
        drop(c);
        assert_eq!(cell.get(), None, "a panicking initializer left a value");
        assert_eq!(cell.get_or_init(|| "second".to_string()), "second");
        let mut cell = Arc::try_unwrap(cell).unwrap();
        cell.get_mut().unwrap().push('!');
        assert_eq!(cell.into_inner().as_deref(), Some("second!"));
        assert_eq!(OnceLock::<u8>::new().into_inner(), None);
        // Many racing initializers: exactly one runs.
        let cell = Arc::new(OnceLock::new());
        let runs = Arc::new(AtomicUsize::new(0));
        let racers: Vec<_> = (0..4)
            .map(|i| {
                let (cell, runs) = (cell.clone(), runs.clone());
                std::thread::spawn(move || {
                    *cell.get_or_init(|| {
                        runs.fetch_add(1, Ordering::Relaxed);
                        i
                    })
                })
            })
            .collect();
        let values: Vec<_> = racers.into_iter().map(|t| t.join().unwrap()).collect();
        assert_eq!(runs.load(Ordering::Relaxed), 1);
        assert!(values.iter().all(|v| *v == values[0]));
    });
}

/// std: `Condvar::notify_one` with nobody waiting is not remembered; a
/// waiter that then waits with a timeout times out. `wait` on a condvar
/// whose mutex was poisoned returns `Err` holding the guard and the result.
#[test]
fn condvar_notify_is_not_stored_and_wait_reports_poison() {
    in_fiber_and_thread(|| {
        let m = Arc::new(Mutex::new(()));
        let cv = Condvar::new();
        cv.notify_one();
        cv.notify_all();
        let (g, r) = cv.wait_timeout(m.lock().unwrap(), ms(20)).unwrap();
        assert!(r.timed_out(), "a notification sent before the wait was remembered");
        drop(g);
        poison_in_fiber_or_thread(&m, |m| {
            let _g = m.lock().unwrap();
            panic!("poison");
        });
        let g = m.lock().unwrap_or_else(|e| e.into_inner());
        let err = cv.wait_timeout(g, ms(1)).unwrap_err();
        let (g, r) = err.into_inner();
        assert!(r.timed_out());
        let err = cv.wait_timeout_while(g, ms(1), |_| true).unwrap_err();
        let (g, r) = err.into_inner();
        assert!(r.timed_out());
        // As std, a condition that is already false returns `Ok` without
        // waiting, even on a poisoned mutex.
        assert!(cv.wait_while(g, |_| false).is_ok());
    });
}

/// std's stable API beyond the basics: `Barrier::new` is `const` (a
/// `static` barrier); `OnceLock` has `take`, `wait` (parks until another
/// caller initializes it), `Clone`, `PartialEq`/`Eq`; the `RwLock` guards
/// implement `Display`; `RwLockWriteGuard::downgrade` turns a write lock
/// into a read lock with no writer in between.
#[test]
fn std_api_barrier_const_once_lock_take_wait_rwlock_downgrade() {
    static SOLO: Barrier = Barrier::new(1);
    in_fiber_and_thread(|| {
        assert!(SOLO.wait().is_leader());
        // OnceLock: take, Clone, PartialEq.
        let mut cell = OnceLock::new();
        assert_eq!(cell.take(), None::<String>);
        cell.set("a".to_string()).unwrap();
        let copy = cell.clone();
        assert_eq!(copy, cell);
        assert_ne!(copy, OnceLock::new());
        assert_eq!(cell.take().as_deref(), Some("a"));
        assert_eq!(cell.get(), None);
        assert_eq!(copy.get().map(String::as_str), Some("a"));
        // OnceLock::wait: returns at once when set, else parks until set.
        assert_eq!(copy.wait(), "a");
        let late: Arc<OnceLock<u32>> = Arc::new(OnceLock::new());
        let l = late.clone();
        let waiter: Box<dyn FnOnce() -> u32> = if fiber::core::in_fiber() {
            let h = fiber::spawn(move || *l.wait());
            Box::new(move || h.join().unwrap())
        } else {
            let h = std::thread::spawn(move || *l.wait());
            Box::new(move || h.join().unwrap())
        };
        let _ = late.set(5);
        assert_eq!(waiter(), 5);
        // RwLock guards: Display; downgrade keeps the lock shared.
        let lock = Arc::new(RwLock::new(1));
        assert_eq!(lock.read().unwrap().to_string(), "1");
        let mut w = lock.write().unwrap();
        *w = 2;
        assert_eq!(w.to_string(), "2");
        let r = fiber::sync::RwLockWriteGuard::downgrade(w);
        assert_eq!(*r, 2);
        assert!(matches!(lock.try_write(), Err(TryLockError::WouldBlock)));
        let r2 = lock.try_read().expect("a downgraded lock admits readers");
        assert_eq!(*r2, 2);
        drop((r, r2));
        assert!(lock.try_write().is_ok());
    });
}

/// A writer downgrades while a reader waits: the reader gets in alongside
/// the downgraded holder (it would wait forever if the downgrade did not
/// let queued readers in); a writer then waits for both to leave.
#[test]
fn rwlock_downgrade_admits_a_waiting_reader_then_a_writer() {
    in_fiber_and_thread(|| {
        let lock = Arc::new(RwLock::new(0));
        let w = lock.write().unwrap();
        let started = Arc::new(AtomicUsize::new(0));
        let spawn = |f: Box<dyn FnOnce() -> u32 + Send>| -> Box<dyn FnOnce() -> u32> {
            if fiber::core::in_fiber() {
                let h = fiber::spawn(f);
                Box::new(move || h.join().unwrap())
            } else {
                let h = std::thread::spawn(f);
                Box::new(move || h.join().unwrap())
            }
        };
        let (l, st) = (lock.clone(), started.clone());
        let reader = spawn(Box::new(move || {
            st.fetch_add(1, Ordering::SeqCst);
            *l.read().unwrap()
        }));
        while started.load(Ordering::SeqCst) == 0 {
            if fiber::core::in_fiber() {
                fiber::yield_now().unwrap();
            } else {
                std::thread::yield_now();
            }
        }
        let mut w = w;
        *w = 10;
        let r = fiber::sync::RwLockWriteGuard::downgrade(w);
        assert_eq!(reader(), 10, "the reader saw the downgraded value");
        let l = lock.clone();
        let writer = spawn(Box::new(move || {
            let mut g = l.write().unwrap();
            *g += 1;
            *g
        }));
        assert_eq!(*r, 10);
        drop(r);
        assert_eq!(writer(), 11);
    });
}

/// At runtime teardown a fiber is unwound at its cancellation point; a
/// destructor on its stack that locks a `fiber::sync::Mutex` another fiber
/// left at shutdown still holds can neither get the lock (the holder is
/// torn down after it, on the same thread) nor go on without it. It used
/// to go on without it (two holders; in debug builds a failed assertion
/// and "panic in a destructor during cleanup"); now the process aborts
/// with a message naming the misuse, and never runs with two holders.
#[test]
fn a_destructor_locking_at_teardown_never_shares_the_lock() {
    const NAME: &str = "a_destructor_locking_at_teardown_never_shares_the_lock";
    if std::env::var("FIBER_CONFORMANCE_CHILD").as_deref() != Ok(NAME) {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                &crate::common::full_test_name(NAME),
                "--nocapture",
                "--test-threads=1",
            ])
            .env("FIBER_CONFORMANCE_CHILD", NAME)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("two holders"), "{stderr}");
        assert!(
            out.status.success(),
            "the child failed ({:?}): the holder's unwind hands the lock over\n{stderr}",
            out.status
        );
        return;
    }
    {
        let m = Arc::new(Mutex::new(0u32));
        let inside = Arc::new(AtomicUsize::new(0));
        let overlaps = Arc::new(AtomicUsize::new(0));
        let locked_in_drop = Arc::new(AtomicUsize::new(0));
        let rt = fiber::Runtime::builder()
            .workers(2)
            .shutdown_timeout(ms(50))
            .build()
            .unwrap();
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        {
            let (m, inside, overlaps) = (m.clone(), inside.clone(), overlaps.clone());
            // The holder: older, so torn down after the other fiber.
            rt.spawn(move || {
                struct Leave(Arc<AtomicUsize>);
                impl Drop for Leave {
                    fn drop(&mut self) {
                        self.0.fetch_sub(1, Ordering::SeqCst);
                    }
                }
                let _g = m.lock().unwrap();
                if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                // Dropped before the guard: "inside" ends before the unlock.
                let _leave = Leave(inside);
                held_tx.send(()).unwrap();
                // Ignore cancellation: only teardown unwinds this stack.
                loop {
                    let _ = fiber::sleep(Duration::from_secs(3600));
                }
            });
        }
        held_rx.recv().unwrap();
        struct LockOnDrop {
            m: Arc<Mutex<u32>>,
            inside: Arc<AtomicUsize>,
            overlaps: Arc<AtomicUsize>,
            locked: Arc<AtomicUsize>,
        }
        impl Drop for LockOnDrop {
            fn drop(&mut self) {
                let mut g = self.m.lock().unwrap_or_else(|e| e.into_inner());
                if self.inside.fetch_add(1, Ordering::SeqCst) != 0 {
                    self.overlaps.fetch_add(1, Ordering::SeqCst);
                }
                *g += 1;
                self.locked.fetch_add(1, Ordering::SeqCst);
                self.inside.fetch_sub(1, Ordering::SeqCst);
            }
        }
        let guard = LockOnDrop {
            m: m.clone(),
            inside: inside.clone(),
            overlaps: overlaps.clone(),
            locked: locked_in_drop.clone(),
        };
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        rt.spawn(move || {
            let _guard = guard;
            started_tx.send(()).unwrap();
            loop {
                let _ = fiber::sleep(Duration::from_secs(3600));
            }
        });
        started_rx.recv().unwrap();
        drop(rt);
        assert_eq!(
            overlaps.load(Ordering::SeqCst),
            0,
            "two holders of one fiber::sync::Mutex"
        );
        // Either the destructor got the lock after the holder's unwind, or
        // (if the holder was abandoned) it never ran; never with the lock held.
        let locked = locked_in_drop.load(Ordering::SeqCst);
        assert!(locked <= 1);
        if locked == 1 {
            assert!(
                m.is_poisoned(),
                "the holder's unwind released (and poisoned) the lock first"
            );
        }
    }
}

/// The other side of keeping an unwinding fiber on its thread: on one
/// worker with growth off, a destructor that waits (during an unwind) for
/// a fiber only that worker can run must still finish (the wait parks
/// after a bound instead of holding the worker forever). Past that bound
/// the worker runs other fibers while it still counts as panicking, so
/// guards dropped meanwhile may poison (the known cost of the fallback;
/// `spec/lifecycle.md` section 10): the locks here tolerate poison.
#[test]
fn a_destructor_waiting_during_an_unwind_on_one_fixed_worker_does_not_deadlock() {
    within(30, || {
        fiber::Runtime::builder()
            .workers(1)
            .max_workers(1)
            .shutdown_timeout(ms(500))
            .build()
            .unwrap()
            .block_on(|| {
                struct JoinOnDrop(Option<fiber::JoinHandle<u32>>);
                impl Drop for JoinOnDrop {
                    fn drop(&mut self) {
                        let h = self.0.take().unwrap();
                        assert_eq!(h.join().unwrap(), 7);
                    }
                }
                let m = Arc::new(Mutex::new(0u32));
                let held = m.lock().unwrap();
                let m2 = m.clone();
                let sibling = fiber::spawn(move || {
                    *m2.lock().unwrap_or_else(|e| e.into_inner()) += 7;
                    7
                });
                let panicker = fiber::spawn(move || {
                    let _j = JoinOnDrop(Some(sibling));
                    panic!("unwinding joiner");
                });
                // Let the panicker reach its destructor's wait first.
                fiber::yield_now().unwrap();
                drop(held);
                assert!(panicker.join().unwrap_err().is_panic());
                assert_eq!(*m.lock().unwrap_or_else(|e| e.into_inner()), 7);
            });
    });
}

/// As std's `RwLockReadGuard`, a read guard is covariant in `T`: a guard
/// of `&'long i32` passes where one of `&'short i32` is expected (std's
/// `test_read_guard_covariance`; a compile-time rule, held by this test
/// compiling).
#[test]
fn a_read_guard_is_covariant() {
    fn do_stuff<'a>(guard: fiber::sync::RwLockReadGuard<'_, &'a i32>, other: &'a i32) -> i32 {
        **guard + *other
    }
    let long = 1;
    let lock = RwLock::new(&long);
    {
        let short = 2;
        assert_eq!(do_stuff(lock.read().unwrap(), &short), 3);
    }
}

/// As std's `OnceLock` (whose `Drop` is `#[may_dangle]`): a cell may hold
/// a borrow of a value declared after it, dropped before it (std's
/// `once_lock::dropck`; held by this test compiling), and its value is
/// still dropped exactly once.
#[test]
fn a_once_lock_may_hold_a_borrow_that_dies_first() {
    let cell = OnceLock::new();
    {
        let s = String::from("borrowed");
        cell.set(&s).unwrap();
        assert_eq!(*cell.get().unwrap(), "borrowed");
    }

    struct Counted(Arc<AtomicUsize>);
    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let drops = Arc::new(AtomicUsize::new(0));
    let mut cell = OnceLock::new();
    assert!(cell.set(Counted(drops.clone())).is_ok());
    assert!(cell.set(Counted(drops.clone())).is_err());
    assert_eq!(drops.load(Ordering::SeqCst), 1, "the refused value is dropped");
    assert!(cell.get_mut().is_some());
    let taken = cell.take().expect("a value");
    assert!(cell.get().is_none() && cell.get_mut().is_none());
    drop(taken);
    assert_eq!(drops.load(Ordering::SeqCst), 2);
    cell.set(Counted(drops.clone())).ok().unwrap();
    drop(cell);
    assert_eq!(drops.load(Ordering::SeqCst), 3, "a full cell drops its value");
    let empty: OnceLock<Counted> = OnceLock::new();
    drop(empty);
    assert_eq!(drops.load(Ordering::SeqCst), 3);
}

/// std's `OnceLock::get_or_init`: a re-entrant initialization from `f`
/// "is an error ... unspecified. Current implementation deadlocks, but this
/// may be changed to a panic". Here it panics, naming the call, for
/// `get_or_init`, `set` and `wait` from inside the initializer; the cell
/// stays empty (as after any panicking initializer) and works afterwards.
#[test]
fn once_lock_reentrant_initialization_panics_naming_it() {
    in_fiber_and_thread(|| {
        let cell = OnceLock::<u32>::new();
        type Reenter = fn(&OnceLock<u32>);
        let reentries: [(&str, Reenter); 3] = [
            ("get_or_init", |c| {
                c.get_or_init(|| 1);
            }),
            ("set", |c| {
                let _ = c.set(2);
            }),
            ("wait", |c| {
                c.wait();
            }),
        ];
        for (call, reenter) in reentries {
            let message = crate::common::panic_message(|| {
                cell.get_or_init(|| {
                    reenter(&cell);
                    7
                });
            })
            .unwrap_or_else(|| panic!("re-entrant {call} did not panic"));
            assert!(
                message.contains("from inside the cell's own initializer"),
                "{call}: {message}"
            );
            assert_eq!(cell.get(), None, "{call}");
        }
        assert_eq!(*cell.get_or_init(|| 9), 9);
    });
}

/// The re-entrance check names only the caller running the initializer:
/// another fiber that arrives meanwhile waits, as before, even on the same
/// worker thread.
#[test]
fn once_lock_another_fiber_during_the_initializer_still_waits() {
    within(30, || {
        let rt = fiber::Runtime::builder().workers(1).build().unwrap();
        rt.block_on(|| {
            let cell = Arc::new(OnceLock::<u32>::new());
            let c2 = cell.clone();
            let mut other = None;
            let v = cell.get_or_init(|| {
                let h = fiber::spawn(move || *c2.get_or_init(|| 1));
                fiber::sleep(ms(20)).unwrap();
                assert!(!h.is_finished());
                other = Some(h);
                5
            });
            assert_eq!(*v, 5);
            assert_eq!(other.unwrap().join().unwrap(), 5);
        });
    });
}

/// `LazyLock::get`, `get_mut` and `force_mut` (stable in std since 1.94):
/// `get` never runs the initializer, `force_mut` does.
#[test]
fn lazy_lock_get_get_mut_and_force_mut_as_std() {
    use fiber::sync::LazyLock;
    let mut lazy = LazyLock::new(|| 7);
    assert_eq!(LazyLock::get(&lazy), None);
    assert_eq!(LazyLock::get_mut(&mut lazy), None);
    *LazyLock::force_mut(&mut lazy) += 1;
    assert_eq!(LazyLock::get(&lazy), Some(&8));
    *LazyLock::get_mut(&mut lazy).unwrap() += 1;
    assert_eq!(*lazy, 9);

    let mut std_lazy = std::sync::LazyLock::new(|| 7);
    assert_eq!(std::sync::LazyLock::get(&std_lazy), None);
    *std::sync::LazyLock::force_mut(&mut std_lazy) += 1;
    assert_eq!(std::sync::LazyLock::get(&std_lazy), Some(&8));
}
