//! Adversarial: destructors that poll or make short waits while their fiber
//! unwinds. A fiber that unwinds stays on its thread for a bounded time
//! (`wait::UNWINDING_WAIT_BOUND`, 200 ms) and then switches away like any
//! other; `yield_now` loops followed that rule (`reviews/review61.rs`),
//! but a loop of missed `try_*` calls never yielded, and the bound on
//! waits counted from each call, so a loop of short waits never switched
//! away either. On one worker with growth off, what they waited for (a
//! fiber of the same worker) never ran; at shutdown the teardown pass,
//! which runs fibers one at a time, spun in the destructor for ever.

use crate::common::*;
use fiber::chan::{self, TryRecvError};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Polls its receiver with `try_recv` until a value or the disconnect.
struct DrainUntilDone(chan::Receiver<u32>);

impl Drop for DrainUntilDone {
    fn drop(&mut self) {
        loop {
            match self.0.try_recv() {
                Ok(_) | Err(TryRecvError::Disconnected) => break,
                Err(TryRecvError::Empty) => std::hint::spin_loop(),
            }
        }
    }
}

/// One worker, growth off: a fiber panics, and its destructor polls a
/// channel with `try_recv` for a value a sibling on the same worker sends.
/// The README promises a yield every 128 misses; while unwinding none
/// came, and the program hung.
#[test]
fn a_destructor_polling_with_try_recv_during_an_unwind_lets_a_neighbour_run() {
    within(20, || {
        rt1().block_on(|| {
            let (tx, rx) = chan::bounded::<u32>(1);
            let sender = fiber::spawn(move || {
                let _ = fiber::sleep(ms(5));
                let _ = tx.send(1);
            });
            let poller = fiber::spawn(move || {
                let _g = DrainUntilDone(rx);
                panic!("boom");
            });
            assert!(poller.join().unwrap_err().is_panic());
            sender.join().unwrap();
        });
    });
}

/// The same with `Mutex::try_lock` and with a `select!` whose `default`
/// arm runs at once.
#[test]
fn destructors_polling_with_try_lock_or_select_default_during_an_unwind_let_a_neighbour_run() {
    within(20, || {
        rt1().block_on(|| {
            let lock = Arc::new(fiber::sync::Mutex::new(()));
            let guard = lock.clone();
            let (held_tx, held_rx) = chan::bounded::<()>(1);
            let holder = fiber::spawn(move || {
                let g = guard.lock().unwrap();
                held_tx.send(()).unwrap();
                let _ = fiber::sleep(ms(5));
                drop(g);
            });
            held_rx.recv().unwrap();
            struct TryLockUntilFree(Arc<fiber::sync::Mutex<()>>);
            impl Drop for TryLockUntilFree {
                fn drop(&mut self) {
                    while self.0.try_lock().is_err() {}
                }
            }
            let poller = fiber::spawn(move || {
                let _g = TryLockUntilFree(lock);
                panic!("boom");
            });
            assert!(poller.join().unwrap_err().is_panic());
            holder.join().unwrap();

            let (tx, rx) = chan::bounded::<u32>(1);
            let sender = fiber::spawn(move || {
                let _ = fiber::sleep(ms(5));
                let _ = tx.send(1);
            });
            struct SelectUntilValue(chan::Receiver<u32>);
            impl Drop for SelectUntilValue {
                fn drop(&mut self) {
                    loop {
                        fiber::select! {
                            recv(self.0) -> _ => break,
                            default => {}
                        }
                    }
                }
            }
            let poller = fiber::spawn(move || {
                let _g = SelectUntilValue(rx);
                panic!("boom");
            });
            assert!(poller.join().unwrap_err().is_panic());
            sender.join().unwrap();
        });
    });
}

/// Waits for a flag in a loop of 1 ms sleeps.
struct SleepUntilSet(Arc<AtomicBool>);

impl Drop for SleepUntilSet {
    fn drop(&mut self) {
        while !self.0.load(SeqCst) {
            let _ = fiber::sleep(ms(1));
        }
    }
}

/// One worker, growth off: a destructor during an unwind waits for a flag
/// that a sibling sets, in a loop of 1 ms sleeps. Each sleep ended before
/// the 200 ms bound, so each blocked the thread and none switched away:
/// the sibling never ran.
#[test]
fn a_loop_of_short_sleeps_during_an_unwind_lets_a_neighbour_run() {
    within(20, || {
        rt1().block_on(|| {
            let flag = Arc::new(AtomicBool::new(false));
            let f = flag.clone();
            let waiter = fiber::spawn(move || {
                let _g = SleepUntilSet(f);
                panic!("boom");
            });
            let setter = fiber::spawn(move || flag.store(true, SeqCst));
            assert!(waiter.join().unwrap_err().is_panic());
            setter.join().unwrap();
        });
    });
}

/// A destructor sends 50 values on a rendezvous channel to a receiver on
/// the same worker while its fiber unwinds. Each send that found no
/// receiver blocked the thread for the whole 200 ms bound before it
/// parked (about 5 s in all); the bound now counts from the first wait
/// of the unwind, so only the first send blocks that long.
#[test]
fn rendezvous_sends_from_a_destructor_during_an_unwind_do_not_each_wait_out_the_bound() {
    let took = within(30, || {
        rt1().block_on(|| {
            let (tx, rx) = chan::bounded::<u32>(0);
            struct SendFifty(chan::Sender<u32>);
            impl Drop for SendFifty {
                fn drop(&mut self) {
                    for i in 0..50 {
                        self.0.send(i).unwrap();
                    }
                }
            }
            let receiver = fiber::spawn(move || rx.iter().count());
            let started = Instant::now();
            let sender = fiber::spawn(move || {
                let _g = SendFifty(tx);
                panic!("boom");
            });
            assert!(sender.join().unwrap_err().is_panic());
            assert_eq!(receiver.join().unwrap(), 50);
            started.elapsed()
        })
    });
    assert!(
        took < Duration::from_secs(2),
        "50 rendezvous sends from an unwinding destructor took {took:?}"
    );
}

/// At shutdown, past the grace: the teardown pass runs the newest fiber
/// first. Its unwind's destructor polls with `try_recv` until the sender,
/// held by an older fiber, is dropped; that happens only when the pass
/// gets to the older fiber. The poll never yielded there, and dropping the
/// runtime hung for ever.
#[test]
fn a_destructor_polling_during_the_teardown_unwind_lets_the_pass_reach_the_sender() {
    in_child(
        "unwinding_polls::a_destructor_polling_during_the_teardown_unwind_lets_the_pass_reach_the_sender",
        30,
        || {
            let rt = rt_fixed_grace(2, ms(100));
            let (tx, rx) = chan::bounded::<u32>(4);
            let (started_tx, started_rx) = std::sync::mpsc::channel();
            let started_b = started_tx.clone();
            // Older: holds the sender and ignores cancellation.
            drop(rt.spawn(move || {
                let _tx = tx;
                started_tx.send(()).unwrap();
                loop {
                    let _ = fiber::sleep(Duration::from_secs(3600));
                }
            }));
            started_rx.recv().unwrap();
            // Newer: drains until the sender is gone; ignores cancellation.
            drop(rt.spawn(move || {
                let _g = DrainUntilDone(rx);
                started_b.send(()).unwrap();
                loop {
                    let _ = fiber::sleep(Duration::from_secs(3600));
                }
            }));
            started_rx.recv().unwrap();
            let t = Instant::now();
            drop(rt);
            assert!(t.elapsed() < Duration::from_secs(10), "drop took {:?}", t.elapsed());
        },
    );
}

/// One worker, growth off: a cancelled fiber panics, and a destructor runs
/// std's `while !ready { g = cv.wait(g) }` loop for a flag a sibling sets.
/// A cancelled fiber's condvar wait returns at once (after releasing the
/// mutex); while unwinding it never yielded either, so the loop held the
/// worker for ever.
#[test]
fn a_cancelled_unwinding_fibers_condvar_loop_lets_the_notifier_run() {
    use fiber::sync::{Condvar, Mutex};
    within(20, || {
        rt1().block_on(|| {
            struct WaitOnDrop(Arc<(Mutex<bool>, Condvar)>);
            impl Drop for WaitOnDrop {
                fn drop(&mut self) {
                    let (m, cv) = &*self.0;
                    let mut g = m.lock().unwrap_or_else(|e| e.into_inner());
                    while !*g {
                        g = cv.wait(g).unwrap_or_else(|e| e.into_inner());
                    }
                }
            }
            let pair = Arc::new((Mutex::new(false), Condvar::new()));
            let p = pair.clone();
            let a = fiber::spawn(move || {
                let _w = WaitOnDrop(p);
                while fiber::sleep(ms(1)).is_ok() {}
                panic!("unwinds while cancelled");
            });
            let p = pair.clone();
            let b = fiber::spawn(move || {
                let _ = fiber::sleep(ms(5));
                *p.0.lock().unwrap() = true;
                p.1.notify_all();
            });
            let _ = fiber::sleep(ms(2));
            a.cancel();
            assert!(a.join().is_err());
            b.join().unwrap();
        });
    });
}
