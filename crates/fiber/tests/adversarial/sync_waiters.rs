//! Adversarial: many waiters leaving a `fiber::sync` queue. A waiter that
//! leaves without being served (cancelled, timed out, unwound at
//! shutdown) unlinks itself; that was a scan of the queue under its lock,
//! so n waiters leaving cost O(n^2): 40,000 cancelled `Semaphore::acquire`
//! calls took 11x as long as 10,000 in a release build, 14x in a debug one.
//! The programs below take seconds when the unlink is O(1) and minutes
//! when it scans (about 7 * 10^9 steps for 120,000 waiters leaving from
//! the back).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::common::{ms, within};

const N: usize = 120_000;

/// N fibers wait in `Semaphore::acquire`; they are cancelled newest first
/// (each from the back of the queue). Every one ends cancelled, no permit
/// is handed out, and the semaphore still works afterwards.
#[test]
fn cancelling_many_semaphore_waiters_from_the_back() {
    within(60, || {
        let rt = crate::common::rt_fixed_grace(2, ms(300));
        let sem = Arc::new(fiber::sync::Semaphore::new(0));
        let handles: Vec<_> = (0..N)
            .map(|_| {
                let sem = sem.clone();
                rt.spawn(move || sem.acquire().map(|permit| permit.forget()).is_ok())
            })
            .collect();
        crate::common::wait_parked(&rt, N);
        let cancelled = crate::common::cancel_from_the_back(handles);
        assert_eq!(cancelled, N, "every waiter ends cancelled");
        assert_eq!(sem.available_permits(), 0);
        sem.add_permits(1);
        let sem2 = sem.clone();
        assert!(rt.block_on(move || sem2.acquire().is_ok()));
    });
}

/// N fibers wait for a `Mutex` that a fiber holds while ignoring every
/// cancellation; dropping the runtime unwinds them all (each leaves the
/// queue in its unwind) within the shutdown grace.
#[test]
fn shutdown_with_many_mutex_waiters() {
    within(60, || {
        let rt = crate::common::rt_fixed_grace(2, ms(100));
        let m = Arc::new(fiber::sync::Mutex::new(()));
        let (tx, rx) = std::sync::mpsc::channel();
        let m2 = m.clone();
        rt.spawn(move || {
            let _guard = m2.lock().unwrap();
            tx.send(()).unwrap();
            crate::common::stubborn_sleep();
        });
        rx.recv().unwrap();
        let unwound = Arc::new(AtomicUsize::new(0));
        for _ in 0..N {
            let (m, unwound) = (m.clone(), unwound.clone());
            rt.spawn(move || {
                struct Count(Arc<AtomicUsize>);
                impl Drop for Count {
                    fn drop(&mut self) {
                        self.0.fetch_add(1, Ordering::Relaxed);
                    }
                }
                let _count = Count(unwound);
                drop(m.lock());
            });
        }
        // The holder and the N waiters.
        crate::common::wait_parked(&rt, N + 1);
        drop(rt);
        assert_eq!(unwound.load(Ordering::Relaxed), N, "every waiter was unwound");
    });
}

/// FIFO across a wake that grants nothing: A asks for 5 permits inside
/// `non_cancellable` and queues; B asks for 1 behind it; one permit is
/// added (A does not fit, so nobody is served); then A is cancelled. The
/// cancel only interrupts A's wait, which goes on. A used to leave the
/// queue and join it again at the back, and the freed head let B take the
/// permit first: a later request served before an earlier one, which the
/// docs rule out ("no later request is served first").
#[test]
fn a_cancel_inside_non_cancellable_does_not_let_a_later_acquire_pass() {
    within(20, || {
        let rt = fiber::Runtime::builder().workers(2).build().unwrap();
        let sem = Arc::new(fiber::sync::Semaphore::new(0));
        let (tx, rx) = fiber::chan::unbounded::<&'static str>();
        let (s, t) = (sem.clone(), tx.clone());
        let a = rt.spawn(move || {
            fiber::non_cancellable(|| {
                let p = s.acquire_many(5).unwrap();
                t.send("a").unwrap();
                drop(p);
            })
        });
        crate::common::wait_parked(&rt, 1);
        let (s, t) = (sem.clone(), tx);
        let b = rt.spawn(move || {
            let p = s.acquire_many(1).unwrap();
            t.send("b").unwrap();
            drop(p);
        });
        crate::common::wait_parked(&rt, 2);
        sem.add_permits(1);
        a.cancel();
        // Nothing may be served now: watch for a while.
        std::thread::sleep(ms(50));
        assert!(
            rx.try_recv().is_err(),
            "the later request for 1 permit was served before the earlier one for 5"
        );
        sem.add_permits(4);
        assert_eq!(rx.recv().unwrap(), "a");
        assert_eq!(rx.recv().unwrap(), "b");
        // A's body ran to its end; its join reports the cancel.
        let _ = a.join();
        b.join().unwrap();
    });
}
