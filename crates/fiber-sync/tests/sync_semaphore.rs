//! Semaphore: permits from fibers, threads and both; FIFO so a large
//! `acquire_many` is not starved; cancellation; permits return on drop.

mod common;

use common::{everywhere, go, join_all, runtime, thread, until, within};
use fiber_sync::{Cancelled, Semaphore};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};

#[test]
fn semaphore_bounds_concurrency() {
    everywhere(|| {
        let sem = Arc::new(Semaphore::new(3));
        let inside = Arc::new(AtomicUsize::new(0));
        let max = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let (sem, inside, max) = (sem.clone(), inside.clone(), max.clone());
                let work = move || {
                    for _ in 0..200 {
                        let _p = sem.acquire().unwrap();
                        let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        max.fetch_max(now, Ordering::SeqCst);
                        if fiber_core::in_fiber() {
                            let _ = fiber_core::yield_now();
                        }
                        inside.fetch_sub(1, Ordering::SeqCst);
                    }
                };
                if i % 3 == 0 {
                    thread(work)
                } else {
                    go(work)
                }
            })
            .collect();
        join_all(handles);
        assert!(max.load(Ordering::SeqCst) <= 3);
        assert_eq!(sem.available_permits(), 3);
    });
}

#[test]
fn semaphore_try_acquire_add_permits_forget() {
    everywhere(|| {
        let sem = Semaphore::new(1);
        let p = sem.try_acquire().unwrap();
        assert_eq!(p.num_permits(), 1);
        assert!(sem.try_acquire().is_none());
        drop(p);
        assert_eq!(sem.available_permits(), 1);
        sem.add_permits(2);
        let p = sem.try_acquire_many(3).unwrap();
        assert_eq!(sem.available_permits(), 0);
        p.forget();
        assert_eq!(sem.available_permits(), 0);
        assert!(sem.acquire_many(0).is_ok());
    });
}

/// FIFO: a large request queued first is served before small requests
/// queued after it, even though each small one could be served earlier.
#[test]
fn semaphore_fifo_large_acquire_many_not_starved() {
    everywhere(|| {
        let sem = Arc::new(Semaphore::new(1));
        let order = Arc::new(StdMutex::new(Vec::new()));
        let big = {
            let (sem, order) = (sem.clone(), order.clone());
            go(move || {
                let p = sem.acquire_many(3).unwrap();
                order.lock().unwrap().push("big");
                drop(p);
            })
        };
        // Queued: one permit is free, but a try is refused (FIFO).
        until(|| sem.try_acquire().is_none());
        assert_eq!(sem.available_permits(), 1);
        let smalls: Vec<_> = (0..3)
            .map(|i| {
                let (sem, order) = (sem.clone(), order.clone());
                let work = move || {
                    let _p = sem.acquire().unwrap();
                    order.lock().unwrap().push("small");
                };
                if i == 0 {
                    thread(work)
                } else {
                    go(work)
                }
            })
            .collect();
        for _ in 0..2 {
            sem.add_permits(1);
        }
        let mut all = vec![big];
        all.extend(smalls);
        join_all(all);
        let order = order.lock().unwrap().clone();
        assert_eq!(order[0], "big", "a later small request was served first: {order:?}");
        assert_eq!(order.len(), 4);
        assert_eq!(sem.available_permits(), 3);
    });
}

/// Cancelling a fiber parked in `acquire` ends the wait with `Cancelled`
/// and takes no permit; a big request that leaves lets smaller ones
/// behind it through. Both cancellation sources: the fiber's handle and a
/// job scope.
#[test]
fn semaphore_acquire_is_a_cancellation_point() {
    within(|| {
        runtime().block_on(|| {
            let sem = Arc::new(Semaphore::new(1));
            let result = Arc::new(StdMutex::new(None));
            let big = {
                let (sem, result) = (sem.clone(), result.clone());
                fiber_core::spawn(move || {
                    let r = sem.acquire_many(5).map(|p| p.num_permits());
                    *result.lock().unwrap() = Some(r);
                })
            };
            until(|| sem.try_acquire().is_none());
            let small = {
                let sem = sem.clone();
                fiber_core::spawn(move || sem.acquire().map(|p| p.num_permits()))
            };
            big.cancel();
            let _ = big.join();
            assert_eq!(*result.lock().unwrap(), Some(Err(Cancelled)));
            assert_eq!(small.join().unwrap(), Ok(1));
            assert_eq!(sem.available_permits(), 1);

            // A job scope's cancellation reaches a parked acquire too.
            let held = sem.acquire().unwrap();
            let seen = StdMutex::new(None);
            let started = AtomicUsize::new(0);
            fiber_jobs::scope(|s| {
                s.spawn(|| {
                    started.store(1, Ordering::SeqCst);
                    *seen.lock().unwrap() = Some(sem.acquire().map(|_| ()));
                });
                until(|| started.load(Ordering::SeqCst) == 1);
                s.job().cancel();
            });
            assert_eq!(*seen.lock().unwrap(), Some(Err(Cancelled)));
            drop(held);
            assert_eq!(sem.available_permits(), 1);
        })
    });
}

/// `add_permits` past `MAX_PERMITS` panics and leaves the count as it was,
/// and the count never shows more than `MAX_PERMITS` meanwhile: a taker
/// racing the refused add could otherwise take permits that never existed.
#[test]
fn a_refused_add_never_shows_more_than_max_permits() {
    use std::sync::atomic::AtomicBool;
    let sem = Arc::new(Semaphore::new(Semaphore::MAX_PERMITS));
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (sem, stop) = (sem.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut most = 0;
            while !stop.load(Ordering::Relaxed) {
                most = most.max(sem.available_permits());
            }
            most
        })
    };
    let mut refused = 0;
    for _ in 0..20_000 {
        let add = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sem.add_permits(1)));
        refused += usize::from(add.is_err());
    }
    stop.store(true, Ordering::Relaxed);
    let most = watcher.join().unwrap();
    assert_eq!(refused, 20_000, "every add past MAX_PERMITS panics");
    assert_eq!(sem.available_permits(), Semaphore::MAX_PERMITS);
    assert!(
        most <= Semaphore::MAX_PERMITS,
        "the count showed {most}, past MAX_PERMITS ({})",
        Semaphore::MAX_PERMITS
    );
}
