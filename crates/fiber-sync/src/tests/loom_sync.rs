//! Loom models: threads wait through fiber-core's plain-thread park path,
//! so the real lock words, waiter queues and hand-offs run under loom. The
//! mutation each model catches is recorded in `spec/sync.md`.

use crate::{Barrier, Condvar, Mutex, Once, OnceLock, RwLock, Semaphore, WaitGroup};
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

/// Two lockers and the main thread: every increment lands (loom's cell
/// checks the critical sections never overlap) and nobody sleeps forever.
/// With three parties a woken waiter can lose to a newcomer, re-queue and
/// get the lock handed over, so both unlock paths run.
#[test]
fn loom_mutex_lock_word_and_queue() {
    loom::model(|| {
        let m = Arc::new(Mutex::new(0u32));
        let ts: Vec<_> = (0..2)
            .map(|_| {
                let m = m.clone();
                thread::spawn(move || *m.lock().unwrap() += 1)
            })
            .collect();
        *m.lock().unwrap() += 1;
        for t in ts {
            t.join().unwrap();
        }
        assert_eq!(*m.lock().unwrap(), 3);
    });
}

/// A waiter that loses the race after being woken re-queues and the next
/// unlock hands the lock to it (the hand-off path): the main thread takes
/// the lock three times in a row while a second thread waits, so a lock
/// handed over must stay locked against the main thread's next attempt.
#[test]
fn loom_mutex_handoff_after_barging() {
    loom::model(|| {
        let m = Arc::new(Mutex::new(Vec::new()));
        let t = {
            let m = m.clone();
            thread::spawn(move || m.lock().unwrap().push(1))
        };
        for i in [2, 3, 4] {
            m.lock().unwrap().push(i);
        }
        t.join().unwrap();
        let mut v = m.lock().unwrap().clone();
        v.sort();
        assert_eq!(v, [1, 2, 3, 4]);
    });
}

/// Producer/consumer over a condvar: the consumer checks the flag under
/// the mutex and waits; the producer sets it under the mutex and
/// notifies. The consumer always wakes (no lost wake-up).
#[test]
fn loom_condvar_wait_vs_notify() {
    loom::model(|| {
        let pair = Arc::new((Mutex::new(false), Condvar::new()));
        let producer = {
            let pair = pair.clone();
            thread::spawn(move || {
                let (flag, cv) = &*pair;
                *flag.lock().unwrap() = true;
                cv.notify_one();
            })
        };
        let (flag, cv) = &*pair;
        let mut guard = flag.lock().unwrap();
        while !*guard {
            guard = cv.wait(guard).unwrap();
        }
        drop(guard);
        producer.join().unwrap();
    });
}

/// A condvar waiter woken by a wake that brought no notify (on a fiber, a
/// cancel's interrupt inside `non_cancellable`, or the end of an unwinding
/// wait's slice; here a third thread fires its record) leaves the queue
/// and queues again, with the mutex released all along. A notify in that
/// gap must still end its wait. Mutations caught (loom: deadlock): the
/// re-queue's fence and second look at `notifies` removed from
/// `CondWait::publish`, or `notify_one` counting the notify only when it
/// finds no waiter counted (its pop then finds the queue empty and the
/// notify is lost).
#[test]
fn loom_condvar_requeue_after_a_stray_wake_vs_notify() {
    loom::model(|| {
        let pair = Arc::new((Mutex::new(false), Condvar::new()));
        let last = Arc::new(loom::sync::Mutex::new(None::<fiber_core::Waiter>));
        let waiter = {
            let (pair, last) = (pair.clone(), last.clone());
            thread::spawn(move || {
                let (flag, cv) = &*pair;
                let mut guard = flag.lock().unwrap();
                while !*guard {
                    guard = cv
                        .wait_with(guard, None, |wait, io, options, site| {
                            let spy = crate::tests::Spy {
                                inner: wait,
                                last: &last,
                            };
                            let options = options.interrupt(fiber_core::Interrupt::NotCancellable);
                            let _ = site;
                            fiber_core::fiber_wait(&spy, io, options)
                        })
                        .0
                        .unwrap();
                }
            })
        };
        let stray = {
            let last = last.clone();
            thread::spawn(move || crate::tests::fire(&last))
        };
        let (flag, cv) = &*pair;
        *flag.lock().unwrap() = true;
        cv.notify_one();
        stray.join().unwrap();
        waiter.join().unwrap();
    });
}

/// Two callers race `get_or_init`: the initializer runs once, and the
/// loser waits for the value (never sees an empty cell, never sleeps
/// forever).
#[test]
fn loom_once_init_runs_once() {
    loom::model(|| {
        let cell = Arc::new(OnceLock::new());
        let runs = Arc::new(AtomicUsize::new(0));
        let other = {
            let (cell, runs) = (cell.clone(), runs.clone());
            thread::spawn(move || {
                *cell.get_or_init(|| {
                    runs.fetch_add(1, Ordering::Relaxed);
                    7u32
                })
            })
        };
        let mine = *cell.get_or_init(|| {
            runs.fetch_add(1, Ordering::Relaxed);
            7u32
        });
        assert_eq!(mine, 7);
        assert_eq!(other.join().unwrap(), 7);
        assert_eq!(runs.load(Ordering::Relaxed), 1);
    });
}

/// A release racing a parked acquirer: the permit reaches the waiter.
#[test]
fn loom_semaphore_release_vs_acquire() {
    loom::model(|| {
        let sem = Arc::new(Semaphore::new(1));
        let held = sem.acquire().unwrap();
        let t = {
            let sem = sem.clone();
            thread::spawn(move || {
                let p = sem.acquire_many(1).unwrap();
                p.num_permits()
            })
        };
        drop(held);
        assert_eq!(t.join().unwrap(), 1);
        assert_eq!(sem.available_permits(), 1);
    });
}

/// A writer waits for a reader to leave; the last read unlock hands the
/// lock to the queued writer, and the data stays race-free.
#[test]
fn loom_rwlock_last_reader_hands_to_writer() {
    loom::model(|| {
        let lock = Arc::new(RwLock::new(0u32));
        let reader = {
            let lock = lock.clone();
            thread::spawn(move || *lock.read().unwrap())
        };
        *lock.write().unwrap() += 1;
        let seen = reader.join().unwrap();
        assert!(seen <= 1);
        assert_eq!(*lock.read().unwrap(), 1);
    });
}

/// The last member leaving wakes the waiter (no lost wake-up), and the
/// member's write is visible after `wait`.
#[test]
fn loom_waitgroup_last_drop_wakes() {
    loom::model(|| {
        let wg = WaitGroup::new();
        let done = Arc::new(AtomicUsize::new(0));
        let t = {
            let (wg, done) = (wg.clone(), done.clone());
            thread::spawn(move || {
                done.store(1, Ordering::Relaxed);
                drop(wg);
            })
        };
        wg.wait();
        assert_eq!(done.load(Ordering::Relaxed), 1);
        t.join().unwrap();
    });
}

/// Two parties meet at a barrier: exactly one leader, both return.
#[test]
fn loom_barrier_one_leader() {
    loom::model(|| {
        let b = Arc::new(Barrier::new(2));
        let t = {
            let b = b.clone();
            thread::spawn(move || b.wait().is_leader())
        };
        let me = b.wait().is_leader();
        assert!(me ^ t.join().unwrap(), "exactly one leader");
    });
}

/// A writer holds the lock while two readers arrive: when it unlocks,
/// `grant` hands the lock to every reader at the head of the queue at
/// once. Each reader stays inside until both are (so granting one reader
/// at a time deadlocks), and neither sleeps forever.
#[test]
fn loom_rwlock_writer_unlock_grants_all_readers() {
    loom::model(|| {
        let lock = Arc::new(RwLock::new(0u32));
        let inside = Arc::new(AtomicUsize::new(0));
        let w = lock.write().unwrap();
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (lock, inside) = (lock.clone(), inside.clone());
                thread::spawn(move || {
                    let r = lock.read().unwrap();
                    inside.fetch_add(1, Ordering::SeqCst);
                    while inside.load(Ordering::SeqCst) < 2 {
                        thread::yield_now();
                    }
                    *r
                })
            })
            .collect();
        let mut w = w;
        *w = 5;
        drop(w);
        for r in readers {
            assert_eq!(r.join().unwrap(), 5);
        }
    });
}

/// A large request queued before a small one is served first (FIFO), and
/// the small one is served after it: permits released one at a time reach
/// the head of the queue, never past it.
#[test]
fn loom_semaphore_fifo_head_first() {
    loom::model(|| {
        let sem = Arc::new(Semaphore::new(0));
        let order = Arc::new(AtomicUsize::new(0));
        let big = {
            let (sem, order) = (sem.clone(), order.clone());
            thread::spawn(move || {
                let p = sem.acquire_many(2).unwrap();
                // 0 -> 1: the big request went first.
                let _ = order.compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst);
                drop(p);
            })
        };
        // Wait until the big request is queued: a try then fails even with
        // a permit free (FIFO).
        sem.add_permits(1);
        while sem.try_acquire().map(|p| p.forget()).is_some() {
            sem.add_permits(1);
            loom::thread::yield_now();
        }
        sem.add_permits(1);
        let small = sem.acquire().unwrap();
        // The small request can only have been served after the big one.
        assert_eq!(order.load(Ordering::SeqCst), 1, "a later request passed the head");
        drop(small);
        big.join().unwrap();
    });
}

/// A writer downgrades while a reader arrives (before or after): the
/// reader gets in while the downgraded holder still reads (so it must be
/// granted at the downgrade if it was queued), sees the writer's value, and
/// nobody sleeps forever.
#[test]
fn loom_rwlock_downgrade_lets_the_queued_reader_in() {
    loom::model(|| {
        let lock = Arc::new(RwLock::new(0u32));
        let mut w = lock.write().unwrap();
        let reader = {
            let lock = lock.clone();
            thread::spawn(move || *lock.read().unwrap())
        };
        *w = 7;
        let r = crate::RwLockWriteGuard::downgrade(w);
        assert_eq!(reader.join().unwrap(), 7);
        drop(r);
        *lock.write().unwrap() += 1;
        assert_eq!(*lock.read().unwrap(), 8);
    });
}

/// `OnceLock::wait` parks until another thread initializes the cell and
/// then sees the value (no lost wake-up between its check and its queueing).
#[test]
fn loom_once_wait_sees_the_value() {
    loom::model(|| {
        let cell = Arc::new(OnceLock::new());
        let waiter = {
            let cell = cell.clone();
            thread::spawn(move || *cell.wait())
        };
        let _ = cell.set(3u32);
        assert_eq!(waiter.join().unwrap(), 3);
    });
}

/// `Once::wait` ends (and panics) when the closure it waits for panics,
/// whichever runs first: the waiter's re-check of the poison flag under
/// the queue lock orders it after the failed closure's wake pass or
/// before its own queueing (without that re-check, a waiter that queued
/// after the wake pass slept for ever: loom reports the deadlock).
#[test]
fn loom_once_wait_sees_a_poisoning_closure() {
    loom::model(|| {
        let once = Arc::new(Once::new());
        let runner = {
            let once = once.clone();
            thread::spawn(move || {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    once.call_once(|| panic!("closure"));
                }));
                assert!(r.is_err());
            })
        };
        let waited = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| once.wait()));
        assert!(waited.is_err(), "a wait on a poisoned Once returned");
        runner.join().unwrap();
        assert!(!once.is_completed());
    });
}
