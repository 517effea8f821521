//! A fiber parked at a cancellable wait (a semaphore acquire, a condvar
//! wait) when its runtime shuts down is cancelled and unwound; its wait
//! node leaves the queue, so the primitive, shared with a thread that
//! outlives the runtime, stays usable and never touches the fiber's stack.
//!
//! (A fiber parked in `Mutex::lock` or `RwLock`, which are not
//! cancellation points, is abandoned by the runtime's teardown instead:
//! see spec/sync.md, "Shutdown".)

mod common;

use common::{runtime, until, within};
use fiber_sync::{Condvar, Mutex, Semaphore};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

#[test]
fn cancellable_waiters_at_shutdown_leave_their_queues() {
    within(|| {
        let sem = Arc::new(Semaphore::new(1));
        let pair = Arc::new((Mutex::new(false), Condvar::new()));
        let permit = sem.acquire().unwrap();
        let parked = Arc::new(AtomicUsize::new(0));
        {
            let rt = runtime();
            let (sem2, pair2, parked2) = (sem.clone(), pair.clone(), parked.clone());
            rt.block_on(move || {
                let p = parked2.clone();
                fiber_core::spawn(move || {
                    p.fetch_add(1, Ordering::SeqCst);
                    drop(sem2.acquire_many(1));
                });
                let p = parked2.clone();
                fiber_core::spawn(move || {
                    let (lock, cv) = &*pair2;
                    let g = lock.lock().unwrap();
                    p.fetch_add(1, Ordering::SeqCst);
                    let _g = cv.wait_while(g, |ready| !*ready);
                });
                until(|| parked2.load(Ordering::SeqCst) == 2);
                // Let the waiters reach their queues.
                for _ in 0..1000 {
                    let _ = fiber_core::yield_now();
                }
            });
            // Dropping the runtime cancels and unwinds the parked fibers.
            drop(rt);
        }
        drop(permit);
        // Each primitive is free and its queue empty: a thread takes it at
        // once (a stale node would be granted the permit instead).
        assert_eq!(sem.available_permits(), 1);
        assert!(sem.try_acquire().is_some());
        let (lock, cv) = &*pair;
        *lock.lock().unwrap() = true;
        cv.notify_all();
        assert!(lock.try_lock().is_ok());
    });
}
