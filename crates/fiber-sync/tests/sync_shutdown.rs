//! A fiber parked on a lock when its runtime shuts down is unwound; its
//! wait node leaves the queue (`Drop` of the wait), so the lock, shared
//! with a thread that outlives the runtime, stays usable and never touches
//! the unwound fiber's stack.

mod common;

use common::{runtime, until, within};
use fiber_sync::{Condvar, Mutex, RwLock, Semaphore};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

#[test]
fn parked_waiters_unwound_at_shutdown_leave_their_queues() {
    within(|| {
        let m = Arc::new(Mutex::new(0u32));
        let rw = Arc::new(RwLock::new(0u32));
        let sem = Arc::new(Semaphore::new(1));
        let pair = Arc::new((Mutex::new(false), Condvar::new()));
        let guard = m.lock().unwrap();
        let write = rw.write().unwrap();
        let permit = sem.acquire().unwrap();
        let parked = Arc::new(AtomicUsize::new(0));
        {
            let rt = runtime();
            let (m2, rw2, sem2, pair2, parked2) = (m.clone(), rw.clone(), sem.clone(), pair.clone(), parked.clone());
            rt.block_on(move || {
                let p = parked2.clone();
                fiber_core::spawn(move || {
                    p.fetch_add(1, Ordering::SeqCst);
                    *m2.lock().unwrap() += 1;
                });
                let p = parked2.clone();
                fiber_core::spawn(move || {
                    p.fetch_add(1, Ordering::SeqCst);
                    *rw2.write().unwrap() += 1;
                });
                let p = parked2.clone();
                fiber_core::spawn(move || {
                    p.fetch_add(1, Ordering::SeqCst);
                    drop(sem2.acquire());
                });
                let p = parked2.clone();
                fiber_core::spawn(move || {
                    let (lock, cv) = &*pair2;
                    let g = lock.lock().unwrap();
                    p.fetch_add(1, Ordering::SeqCst);
                    let _g = cv.wait_while(g, |ready| !*ready);
                });
                until(|| parked2.load(Ordering::SeqCst) == 4);
                // Give the waiters time to reach their queues.
                for _ in 0..1000 {
                    fiber_core::yield_now();
                }
            });
            // Dropping the runtime unwinds the parked fibers.
            drop(rt);
        }
        drop(guard);
        drop(write);
        drop(permit);
        // Each primitive is free and its queue empty: a thread takes it at
        // once (a stale node would be woken or granted instead).
        assert!(m.try_lock().is_ok());
        assert!(rw.try_write().is_ok());
        assert_eq!(sem.available_permits(), 1);
        assert!(sem.try_acquire().is_some());
        let (lock, cv) = &*pair;
        *lock.lock().unwrap() = true;
        cv.notify_all();
        assert!(lock.try_lock().is_ok());
    });
}
