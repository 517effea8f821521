//! Adversarial: a fiber that polls with non-blocking operations in a loop
//! (`try_recv`, `try_send`, `select!` with `default`, `try_select`,
//! `try_lock`, `try_read` / `try_write`, `try_acquire`) on a fixed pool.
//! Each such call returns at once, and none gave up the worker, so the
//! fiber that would end the loop, queued behind the poller, never ran and
//! the program hung (crossbeam's busy-polling tests, ported to fibers; Go
//! preempts such a loop, tokio's budget yields it). Every
//! `fiber_core::POLL_BUDGET` failed polls the fiber now yields.

use std::time::Duration;

use crate::common::{ms, poller_lets_others_run, within};

#[test]
fn try_recv_on_an_empty_channel_lets_others_run() {
    poller_lets_others_run(|| {
        let (_tx, rx) = fiber::chan::bounded::<u8>(1);
        assert!(rx.try_recv().is_err());
    });
    poller_lets_others_run(|| {
        let (_tx, rx) = fiber::chan::unbounded::<u8>();
        assert_eq!(rx.try_iter().count(), 0);
    });
}

#[test]
fn try_send_on_a_full_channel_lets_others_run() {
    poller_lets_others_run(|| {
        let (tx, _rx) = fiber::chan::bounded::<u8>(0);
        assert!(tx.try_send(1).is_err());
    });
}

#[test]
fn a_select_with_a_default_lets_others_run() {
    poller_lets_others_run(|| {
        let (_tx, rx) = fiber::chan::bounded::<u8>(0);
        fiber::chan::select! {
            recv(rx) -> _ => unreachable!("nothing is sent"),
            default => {}
        }
    });
    poller_lets_others_run(|| {
        let (_tx, rx) = fiber::chan::bounded::<u8>(0);
        let mut sel = fiber::chan::Select::new();
        sel.recv(&rx);
        assert!(sel.try_select().is_err());
        assert!(sel.try_ready().is_err());
    });
}

/// A fiber spinning on `try_lock` while the holder, on the same single
/// worker, waits behind it to run and unlock.
#[test]
fn spinning_on_try_lock_lets_the_holder_unlock() {
    within(30, || {
        let rt = crate::common::rt_fixed_grace(1, ms(200));
        rt.block_on(|| {
            let lock = std::sync::Arc::new(fiber::sync::Mutex::new(0u32));
            let rw = std::sync::Arc::new(fiber::sync::RwLock::new(0u32));
            let sem = std::sync::Arc::new(fiber::sync::Semaphore::new(1));
            let guard = lock.lock().unwrap();
            let read = rw.read().unwrap();
            let permit = sem.try_acquire().unwrap();
            let (l, r, s) = (lock.clone(), rw.clone(), sem.clone());
            let spinner = fiber::spawn(move || {
                let mut spins = 0u64;
                loop {
                    if let Ok(mut g) = l.try_lock() {
                        *g += 1;
                        break;
                    }
                    spins += 1;
                }
                loop {
                    if let Ok(mut g) = r.try_write() {
                        *g += 1;
                        break;
                    }
                    spins += 1;
                }
                while s.try_acquire().is_none() {
                    spins += 1;
                }
                spins
            });
            // Let the spinner start, then unlock one at a time: each
            // unlock needs the spinner to give the worker back.
            fiber::yield_now().unwrap();
            drop(guard);
            fiber::yield_now().unwrap();
            drop(read);
            fiber::yield_now().unwrap();
            drop(permit);
            assert!(spinner.join().unwrap() >= 1);
            assert_eq!((*lock.lock().unwrap(), *rw.read().unwrap()), (1, 1));
        });
    });
}

/// The budget costs the fast paths nothing they can see: a fiber that
/// drains a channel with `try_recv` gets every value in order, and a
/// `try_recv` loop on a plain thread (no fiber) still works.
#[test]
fn budget_yields_lose_nothing() {
    within(30, || {
        let rt = crate::common::rt_fixed_grace(2, ms(200));
        rt.block_on(|| {
            let (tx, rx) = fiber::chan::bounded(16);
            let producer = fiber::spawn(move || {
                for i in 0..10_000u32 {
                    tx.send(i).unwrap();
                }
            });
            let mut next = 0u32;
            while next < 10_000 {
                match rx.try_recv() {
                    Ok(v) => {
                        assert_eq!(v, next);
                        next += 1;
                    }
                    Err(fiber::chan::TryRecvError::Empty) => {}
                    Err(e) => panic!("{e:?}"),
                }
            }
            producer.join().unwrap();
        });
        let (tx, rx) = fiber::chan::bounded::<u8>(1);
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(10));
            tx.send(7).unwrap();
        });
        let got = loop {
            if let Ok(v) = rx.try_recv() {
                break v;
            }
            std::hint::spin_loop();
        };
        assert_eq!(got, 7);
        t.join().unwrap();
    });
}

/// The budget holds during a shutdown's grace too: clean-up that polls for
/// a value another fiber's clean-up sends, on one worker, gets it, and the
/// runtime stops well before its grace time runs out.
#[test]
fn clean_up_that_polls_during_shutdown_lets_the_sender_run() {
    use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
    static GOT: AtomicU32 = AtomicU32::new(0);
    within(30, || {
        let rt = crate::common::rt_fixed_grace(1, Duration::from_secs(10));
        let (tx, rx) = fiber::chan::bounded::<u32>(1);
        rt.spawn(move || {
            let _ = fiber::sleep(Duration::MAX);
            fiber::non_cancellable(|| loop {
                if let Ok(v) = rx.try_recv() {
                    GOT.store(v, SeqCst);
                    break;
                }
            });
        });
        rt.spawn(move || {
            let _ = fiber::sleep(Duration::MAX);
            fiber::non_cancellable(|| tx.send(7).unwrap());
        });
        crate::common::wait_parked(&rt, 2);
        let start = std::time::Instant::now();
        drop(rt);
        assert_eq!(GOT.load(SeqCst), 7, "the polling clean-up got the value");
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "shutdown took {:?}",
            start.elapsed()
        );
    });
}

/// A `Waitable` (a safe public trait) whose `publish` polls: it runs while
/// the fiber is PARKING, where a budget yield would corrupt the park. The
/// budget never yields there (the misses count on until a yield is
/// allowed), and the wait completes normally.
#[test]
fn a_publish_that_polls_does_not_yield_mid_park() {
    use fiber::core::{fiber_wait, Publish, WaitOptions, WaitResult, Waitable, Waiter};
    struct PollingPublish<'a>(&'a fiber::sync::Mutex<()>);
    impl Waitable for PollingPublish<'_> {
        type Io = ();
        fn try_complete(&self, _: &mut ()) -> Option<WaitResult> {
            None
        }
        fn publish(&self, _: &Waiter, _: &mut ()) -> Publish {
            for _ in 0..3 * fiber::core::POLL_BUDGET {
                assert!(self.0.try_lock().is_err());
            }
            Publish::Ready(WaitResult::Ok)
        }
        fn unpublish(&self, _: &Waiter, _: &mut ()) -> Option<WaitResult> {
            None
        }
    }
    within(30, || {
        let rt = crate::common::rt_fixed_grace(1, ms(200));
        rt.block_on(|| {
            let lock = fiber::sync::Mutex::new(());
            let _held = lock.lock().unwrap();
            for _ in 0..4 {
                let result = fiber_wait(&PollingPublish(&lock), &mut (), WaitOptions::new());
                assert_eq!(result, WaitResult::Ok);
            }
            // The misses counted meanwhile yield at the next allowed poll.
            assert!(lock.try_lock().is_err());
        });
    });
}

/// `Debug` of a locked `Mutex` or `RwLock` is never a yield point, however
/// often it runs: formatting may happen under stdout's lock or a caller's
/// std guard, where a switch to another worker would be unsound.
#[test]
fn debug_of_a_locked_lock_never_yields() {
    within(30, || {
        let rt = crate::common::rt_fixed_grace(1, ms(200));
        rt.block_on(|| {
            let lock = fiber::sync::Mutex::new(1u8);
            let rw = fiber::sync::RwLock::new(2u8);
            let _held = lock.lock().unwrap();
            let _written = rw.write().unwrap();
            let ran = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let r = ran.clone();
            let other = fiber::spawn(move || r.store(true, std::sync::atomic::Ordering::SeqCst));
            for _ in 0..4 * fiber::core::POLL_BUDGET {
                assert!(format!("{lock:?}").contains("<locked>"));
                assert!(format!("{rw:?}").contains("<locked>"));
            }
            assert!(
                !ran.load(std::sync::atomic::Ordering::SeqCst),
                "formatting let another fiber run on the only worker"
            );
            other.join().unwrap();
        });
    });
}
