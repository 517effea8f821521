//! Adversarial: shutdown while a fiber waits on something only a plain
//! thread can end, or while a worker is stuck in a fiber that never yields.
//! The grace time is the waiting fiber's; a stuck worker delays nobody
//! else's teardown; a fiber left running by that worker still ends (and its
//! joiners learn it) once it reaches a yield point.

use fiber::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use crate::common::{ms, rt_fixed_grace, within};

/// Wait (on the calling plain thread) until `n` fibers of `rt` are parked
/// with `kind`.
fn until_parked(rt: &fiber::Runtime, kind: fiber::WaitKind, n: usize) {
    let start = Instant::now();
    loop {
        let parked = rt
            .dump()
            .fibers
            .iter()
            .filter(|f| f.state == fiber::core::state::FiberState::Parked && f.waiting == kind)
            .count();
        if parked >= n {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "the fibers never parked");
        std::thread::sleep(ms(1));
    }
}

/// Spin (no yield point) until `flag` is set or `limit` passes.
fn spin_until(flag: &AtomicBool, limit: Duration) {
    let start = Instant::now();
    while !flag.load(Ordering::Acquire) && start.elapsed() < limit {
        std::hint::spin_loop();
    }
}

/// Sets its flag when dropped.
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[test]
fn a_fiber_waiting_for_a_lock_a_plain_thread_holds_gets_the_grace_time() {
    // spec/sync.md 5a: a fiber parked in `Mutex::lock` waits on through the
    // grace time; every live fiber being parked must not cut it short when
    // a plain thread is what releases the lock.
    within(30, || {
        let rt = fiber::Runtime::builder()
            .workers(1)
            .max_workers(1)
            .shutdown_timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        let lock = Arc::new(Mutex::new(0u32));
        let guard_taken = Arc::new(AtomicBool::new(false));
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let holder = {
            let lock = lock.clone();
            let taken = guard_taken.clone();
            std::thread::spawn(move || {
                let mut guard = lock.lock().unwrap();
                taken.store(true, Ordering::SeqCst);
                release_rx.recv().unwrap();
                // The runtime's shutdown has begun: hold on a little more.
                std::thread::sleep(ms(300));
                *guard += 1;
            })
        };
        while !guard_taken.load(Ordering::SeqCst) {
            std::thread::sleep(ms(1));
        }
        let got = Arc::new(AtomicUsize::new(0));
        let (l, g) = (lock.clone(), got.clone());
        let h = rt.spawn(move || {
            let value = *l.lock().unwrap();
            g.store(value as usize + 1, Ordering::SeqCst);
        });
        until_parked(&rt, fiber::WaitKind::Lock, 1);
        release_tx.send(()).unwrap();
        let start = Instant::now();
        drop(rt);
        holder.join().unwrap();
        assert_eq!(
            got.load(Ordering::SeqCst),
            2,
            "the fiber got the lock within the grace time (shutdown took {:?})",
            start.elapsed()
        );
        // Still running when shutdown began, so it ends cancelled (its
        // value dropped), as every such fiber does (spec/lifecycle.md).
        assert!(h.join().unwrap_err().is_cancelled());
    })
}

#[test]
fn a_fiber_waiting_for_a_once_lock_a_plain_thread_initialises_gets_the_grace_time() {
    within(30, || {
        let rt = fiber::Runtime::builder()
            .workers(1)
            .max_workers(1)
            .shutdown_timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        let cell = Arc::new(fiber::sync::OnceLock::<u32>::new());
        let (started_tx, started_rx) = mpsc::channel::<()>();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let initer = {
            let cell = cell.clone();
            std::thread::spawn(move || {
                cell.get_or_init(|| {
                    started_tx.send(()).unwrap();
                    release_rx.recv().unwrap();
                    std::thread::sleep(ms(300));
                    7
                });
            })
        };
        started_rx.recv().unwrap();
        let got = Arc::new(AtomicUsize::new(0));
        let (c, g) = (cell.clone(), got.clone());
        rt.spawn(move || {
            g.store(*c.get_or_init(|| 1) as usize, Ordering::SeqCst);
        });
        until_parked(&rt, fiber::WaitKind::Lock, 1);
        release_tx.send(()).unwrap();
        drop(rt);
        initer.join().unwrap();
        assert_eq!(
            got.load(Ordering::SeqCst),
            7,
            "the fiber saw the value within the grace time"
        );
    })
}

#[test]
fn a_worker_stuck_in_a_spinner_does_not_keep_the_other_fibers_from_teardown() {
    // Two fibers deadlocked on two locks and one parked on a channel hold
    // guards with destructors; a third never yields. Shutdown must still
    // unwind the first ones (destructors run, joins return).
    static RELEASE: AtomicBool = AtomicBool::new(false);
    within(60, || {
        let rt = rt_fixed_grace(2, ms(100));
        let spinning = Arc::new(AtomicBool::new(false));
        let s = spinning.clone();
        let spinner = rt.spawn(move || {
            s.store(true, Ordering::SeqCst);
            spin_until(&RELEASE, Duration::from_secs(40));
        });
        while !spinning.load(Ordering::SeqCst) {
            std::thread::sleep(ms(1));
        }
        let a = Arc::new(Mutex::new(()));
        let b = Arc::new(Mutex::new(()));
        let dropped: Vec<Arc<AtomicBool>> = (0..3).map(|_| Arc::new(AtomicBool::new(false))).collect();
        let (both_tx, both_rx) = mpsc::channel::<()>();
        // Each takes its first lock, then waits for the other to have
        // taken its own: a deadlock whatever worker runs them when (one of
        // them may wait in the spinner's inbox until the monitor moves it).
        let both_locked = Arc::new(fiber::sync::Barrier::new(2));
        let first = {
            let (a, b, d, tx) = (a.clone(), b.clone(), dropped[0].clone(), both_tx.clone());
            let both_locked = both_locked.clone();
            rt.spawn(move || {
                let _flag = SetOnDrop(d);
                let _ga = a.lock().unwrap();
                tx.send(()).unwrap();
                both_locked.wait();
                // Teardown may unwind the other fiber first, which poisons
                // the lock this one then gets.
                let _gb = b.lock().unwrap_or_else(|e| e.into_inner());
            })
        };
        let second = {
            let (a, b, d, tx) = (a.clone(), b.clone(), dropped[1].clone(), both_tx);
            rt.spawn(move || {
                let _flag = SetOnDrop(d);
                let _gb = b.lock().unwrap();
                tx.send(()).unwrap();
                both_locked.wait();
                let _ga = a.lock().unwrap_or_else(|e| e.into_inner());
            })
        };
        both_rx.recv().unwrap();
        both_rx.recv().unwrap();
        let (_keep_tx, rx) = fiber::chan::bounded::<u8>(0);
        let third = {
            // Made here and moved in: dropped whether the fiber is unwound,
            // returns, or never starts (it may wait in the spinner's inbox).
            let flag = SetOnDrop(dropped[2].clone());
            rt.spawn(move || {
                let _flag = flag;
                let _ = rx.recv();
            })
        };
        until_parked(&rt, fiber::WaitKind::Lock, 2);
        drop(rt);
        for (i, d) in dropped.iter().enumerate() {
            assert!(d.load(Ordering::SeqCst), "fiber {i}'s destructors ran at shutdown");
        }
        // One of the two is unwound at its lock wait (cancelled); the other
        // may then get its lock and return: both joins return.
        let joins = [first.join(), second.join()];
        assert!(
            joins.iter().any(|j| j.as_ref().is_err_and(|e| e.is_cancelled())),
            "{joins:?}"
        );
        // Cancelled (its recv ended, or it never started): the join returns.
        assert!(third.join().unwrap_err().is_cancelled());
        RELEASE.store(true, Ordering::Release);
        // The spinner ends on its own (it returns normally once released).
        let _ = spinner.join();
    })
}

#[test]
fn a_spinner_left_running_at_shutdown_ends_at_its_next_yield_and_its_joiner_returns() {
    static RELEASE: AtomicBool = AtomicBool::new(false);
    within(60, || {
        let rt = fiber::Runtime::builder()
            .workers(1)
            .max_workers(1)
            .shutdown_timeout(ms(100))
            .build()
            .unwrap();
        let spinning = Arc::new(AtomicBool::new(false));
        let after_yield = Arc::new(AtomicBool::new(false));
        let dropped = Arc::new(AtomicBool::new(false));
        let (s, a, d) = (spinning.clone(), after_yield.clone(), dropped.clone());
        let spinner = rt.spawn(move || {
            let _flag = SetOnDrop(d);
            s.store(true, Ordering::SeqCst);
            spin_until(&RELEASE, Duration::from_secs(40));
            let _ = fiber::yield_now();
            a.store(true, Ordering::SeqCst);
            // Parks again: the runtime is gone, so this must end too.
            let (_tx, rx) = fiber::chan::bounded::<u8>(0);
            let _ = rx.recv();
            fiber::sleep(Duration::from_secs(3600)).ok();
        });
        while !spinning.load(Ordering::SeqCst) {
            std::thread::sleep(ms(1));
        }
        drop(rt);
        RELEASE.store(true, Ordering::Release);
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || tx.send(spinner.join().is_err()).unwrap());
        let joined = rx.recv_timeout(Duration::from_secs(20));
        assert_eq!(
            joined,
            Ok(true),
            "the spinner's join returned (cancelled) once it yielded"
        );
        assert!(dropped.load(Ordering::SeqCst), "its destructors ran");
        assert!(!after_yield.load(Ordering::SeqCst), "its stack unwound at the yield");
    })
}
