//! Review 45: the operation budget (`coop_point`, `coop_point_cancellable`).

use crate::common::*;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;

/// Spawn `body` on `rt`; it runs only once its cancellation has been
/// requested (it waits for the go inside `non_cancellable`, so the wait
/// is not ended by the cancel). Returns once the fiber has finished.
fn run_cancelled(rt: &fiber::Runtime, body: impl FnOnce() + Send + 'static) {
    let (go_tx, go_rx) = fiber::chan::bounded::<()>(1);
    let h = rt.spawn(move || {
        fiber::non_cancellable(|| go_rx.recv()).unwrap();
        assert!(fiber::core::is_cancel_requested());
        body();
    });
    // Started and parked on the go (a fiber cancelled before it starts
    // never runs).
    while go_tx.waiting() == (0, 0) {
        std::thread::yield_now();
    }
    h.cancel();
    go_tx.send(()).unwrap();
    if let Err(e) = h.join() {
        eprintln!("run_cancelled: the fiber ended with {e:?}");
    }
}

const N: u64 = 20_000;

// ---------------------------------------------------------------------------
// Cancellation at the budget point.

#[test]
fn a_cancelled_recv_loop_on_a_full_bounded_channel_stops_within_the_budget_and_loses_nothing() {
    within(30, || {
        let rt = rt1();
        let (tx, rx) = fiber::chan::bounded::<u64>(N as usize);
        for i in 0..N {
            tx.send(i).unwrap();
        }
        let got = Arc::new(AtomicU64::new(0));
        let g = got.clone();
        let rx2 = rx.clone();
        run_cancelled(&rt, move || {
            let mut expect = 0;
            for v in &rx2 {
                assert_eq!(v, expect, "FIFO of one sender");
                expect += 1;
            }
            g.store(expect, SeqCst);
        });
        let got = got.load(SeqCst);
        assert!(got <= 2 * fiber::core::OP_BUDGET as u64, "received {got}");
        // Nothing consumed by the receive that ended as cancelled.
        assert_eq!(got + rx.len() as u64, N);
        assert_eq!(rx.try_recv().unwrap(), got);
    });
}

#[test]
fn a_cancelled_send_loop_into_a_bounded_channel_gets_its_value_back_exactly_once() {
    within(30, || {
        let rt = rt1();
        let (tx, rx) = fiber::chan::bounded::<u64>(N as usize);
        let sent = Arc::new(AtomicU64::new(u64::MAX));
        let s = sent.clone();
        run_cancelled(&rt, move || {
            for i in 0..N {
                if let Err(fiber::chan::SendError(v)) = tx.send(i) {
                    assert_eq!(v, i, "the unsent value comes back");
                    s.store(i, SeqCst);
                    return;
                }
            }
            s.store(N, SeqCst);
        });
        let sent = sent.load(SeqCst);
        assert!(sent <= 2 * fiber::core::OP_BUDGET as u64, "sent {sent}");
        assert_eq!(rx.len() as u64, sent, "the refused value was not enqueued");
    });
}

#[test]
// Failed before the fix: a cancelled fiber's send loop into an unbounded channel never sees the cancellation (each send counts twice, the budget always runs out at the non-cancellable point)
fn a_cancelled_send_loop_into_an_unbounded_channel_stops_within_the_budget() {
    within(30, || {
        let rt = rt1();
        let (tx, rx) = fiber::chan::unbounded::<u64>();
        let sent = Arc::new(AtomicU64::new(u64::MAX));
        let s = sent.clone();
        run_cancelled(&rt, move || {
            for i in 0..N {
                if let Err(fiber::chan::SendError(v)) = tx.send(i) {
                    assert_eq!(v, i);
                    s.store(i, SeqCst);
                    return;
                }
            }
            s.store(N, SeqCst);
        });
        let sent = sent.load(SeqCst);
        assert_eq!(rx.len() as u64, sent);
        assert!(
            sent <= 2 * fiber::core::OP_BUDGET as u64,
            "the cancelled fiber made {sent} sends"
        );
    });
}

#[test]
// Failed before the fix: a cancelled fiber's recv loop on an unbounded channel that always has data never sees the cancellation (each recv counts twice)
fn a_cancelled_recv_loop_on_a_full_unbounded_channel_stops_within_the_budget() {
    within(30, || {
        let rt = rt1();
        let (tx, rx) = fiber::chan::unbounded::<u64>();
        for i in 0..N {
            tx.send(i).unwrap();
        }
        let got = Arc::new(AtomicU64::new(0));
        let g = got.clone();
        let rx2 = rx.clone();
        run_cancelled(&rt, move || {
            let mut n = 0;
            while rx2.recv().is_ok() {
                n += 1;
                if n == N {
                    break;
                }
            }
            g.store(n, SeqCst);
        });
        let got = got.load(SeqCst);
        assert_eq!(got + rx.len() as u64, N);
        assert!(
            got <= 2 * fiber::core::OP_BUDGET as u64,
            "the cancelled fiber received {got}"
        );
    });
}

#[test]
fn the_budget_point_inside_non_cancellable_never_ends_an_operation_as_cancelled() {
    within(30, || {
        let rt = rt1();
        let ok = Arc::new(AtomicU64::new(0));
        let o = ok.clone();
        run_cancelled(&rt, move || {
            let (tx, rx) = fiber::chan::bounded::<u64>(4096);
            let (utx, urx) = fiber::chan::unbounded::<u64>();
            fiber::non_cancellable(|| {
                for i in 0..1000 {
                    tx.send(i).unwrap();
                    utx.send(i).unwrap();
                }
                for i in 0..1000 {
                    assert_eq!(rx.recv().unwrap(), i);
                    assert_eq!(urx.recv_timeout(ms(1000)).unwrap(), i);
                }
            });
            o.store(1, SeqCst);
        });
        assert_eq!(ok.load(SeqCst), 1);
    });
}

#[test]
// Failed before the fix: while a cancelled fiber unwinds, sends into a channel with room fail once the budget is spent (coop_point_spent reports a spent budget though it could not yield), and every later one fails too
fn sends_from_a_destructor_while_a_cancelled_fiber_unwinds_all_succeed() {
    within(30, || {
        let rt = rt1();
        let (tx, rx) = fiber::chan::bounded::<u64>(4096);
        struct Flush(fiber::chan::Sender<u64>);
        impl Drop for Flush {
            fn drop(&mut self) {
                for i in 0..1000 {
                    // Room for all: none of these waits.
                    let _ = self.0.send(i);
                }
            }
        }
        run_cancelled(&rt, move || {
            let _flush = Flush(tx);
            std::panic::panic_any("boom");
        });
        assert_eq!(rx.len(), 1000, "sends made by the destructor");
    });
}

#[test]
fn sends_from_a_destructor_while_a_fiber_unwinds_all_succeed() {
    within(30, || {
        let rt = rt1();
        let (tx, rx) = fiber::chan::bounded::<u64>(4096);
        struct Flush(fiber::chan::Sender<u64>);
        impl Drop for Flush {
            fn drop(&mut self) {
                for i in 0..1000 {
                    self.0.send(i).unwrap();
                }
            }
        }
        let h = rt.spawn(move || {
            let _flush = Flush(tx);
            std::panic::panic_any("boom");
        });
        assert!(h.join().is_err());
        let got: Vec<u64> = rx.try_iter().collect();
        assert_eq!(got, (0..1000).collect::<Vec<_>>());
    });
}

// ---------------------------------------------------------------------------
// Where the budget does nothing, or must keep its guarantees.

#[test]
fn the_budget_is_a_no_op_on_plain_threads_and_in_blocking_closures() {
    within(30, || {
        let work = || {
            let (tx, rx) = fiber::chan::bounded::<u64>(8);
            let m = fiber::sync::Mutex::new(0u64);
            for i in 0..2000 {
                tx.send(i).unwrap();
                assert_eq!(rx.recv().unwrap(), i);
                *m.lock().unwrap() += 1;
            }
            assert!(fiber::core::current_worker().is_none());
            m.into_inner().unwrap()
        };
        assert_eq!(work(), 2000);
        let rt = rt1();
        let got = rt.block_on(move || fiber::blocking(work));
        assert_eq!(got, 2000);
    });
}

#[test]
fn a_pinned_fiber_resumes_on_its_worker_after_every_budget_yield() {
    within(30, || {
        let rt = rt2();
        let h = rt.spawn(|| {
            fiber::spawn_pinned(|| {
                let first = fiber::core::current_worker().unwrap();
                let m = fiber::sync::Mutex::new(0u64);
                let (tx, rx) = fiber::chan::bounded::<u64>(1);
                for i in 0..5000 {
                    *m.lock().unwrap() += 1;
                    tx.send(i).unwrap();
                    assert_eq!(rx.recv().unwrap(), i);
                    assert_eq!(fiber::core::current_worker().unwrap(), first);
                }
                m.into_inner().unwrap()
            })
            .join()
            .unwrap()
        });
        assert_eq!(h.join().unwrap(), 5000);
    });
}

#[test]
fn fifo_of_one_sender_and_a_rendezvous_hand_off_survive_budget_yields() {
    within(30, || {
        let rt = rt2();
        let ok = rt.block_on(|| {
            let (tx, rx) = fiber::chan::bounded::<u64>(16);
            let (rtx, rrx) = fiber::chan::bounded::<u64>(0);
            let p = fiber::spawn(move || {
                for i in 0..N {
                    tx.send(i).unwrap();
                }
                for i in 0..2000 {
                    rtx.send(i).unwrap();
                }
            });
            for i in 0..N {
                assert_eq!(rx.recv().unwrap(), i);
            }
            for i in 0..2000 {
                assert_eq!(rrx.recv().unwrap(), i);
            }
            p.join().unwrap();
            true
        });
        assert!(ok);
    });
}

#[test]
fn a_budget_yield_lets_a_sibling_run_between_uncontended_locks_one_worker() {
    within(30, || {
        let rt = rt1();
        let ran = rt.block_on(|| {
            let sibling = Arc::new(AtomicUsize::new(0));
            let s = sibling.clone();
            let h = fiber::spawn(move || {
                s.fetch_add(1, SeqCst);
            });
            let m = fiber::sync::Mutex::new(0u64);
            let mut n = 0;
            while sibling.load(SeqCst) == 0 {
                *m.lock().unwrap() += 1;
                n += 1;
            }
            h.join().unwrap();
            n
        });
        // The run yields once it has lasted `OP_SLICE`, looked at every
        // `OP_BUDGET` locks (review 48: a yield every 128 operations gave
        // such a loop 128 operations per 10 ms slice of a hand-off chain
        // beside it), so the sibling ran after a whole number of looks.
        assert!(ran >= fiber::core::OP_BUDGET as u64, "yielded after {ran} locks");
        assert_eq!(
            ran % fiber::core::OP_BUDGET as u64,
            0,
            "yielded after {ran} locks, not at a look"
        );
    });
}

#[test]
fn a_select_loop_with_a_default_arm_at_the_budget_boundary_takes_every_value_once() {
    within(30, || {
        let rt = rt1();
        let got = rt.block_on(|| {
            let (tx, rx) = fiber::chan::bounded::<u64>(1024);
            let p = fiber::spawn(move || {
                for i in 0..1000 {
                    tx.send(i).unwrap();
                }
            });
            let mut got = Vec::new();
            let mut defaults = 0u64;
            while got.len() < 1000 {
                fiber::select! {
                    recv(rx) -> v => got.push(v.unwrap()),
                    default => defaults += 1,
                }
                assert!(defaults < 1_000_000);
            }
            p.join().unwrap();
            got
        });
        assert_eq!(got, (0..1000).collect::<Vec<_>>());
    });
}

/// Review 46: in teardown, cleanup that runs after the fiber's body (a
/// fiber-local destructor) makes 3,000 uncontended lock operations; it
/// never switches there, so its operation count stayed at the budget and
/// every later operation counted as a teardown raise, until the fiber was
/// abandoned in the middle of the destructor (after about 1,150). It must
/// run to its end.
#[test]
fn a_fiber_local_destructor_in_teardown_makes_thousands_of_operations() {
    static DONE: AtomicUsize = AtomicUsize::new(0);
    struct ManyLocks;
    impl Drop for ManyLocks {
        fn drop(&mut self) {
            let m = fiber::sync::Mutex::new(0u64);
            for _ in 0..3000 {
                *m.lock().unwrap() += 1;
            }
            DONE.store(*m.lock().unwrap() as usize, SeqCst);
        }
    }
    fiber::fiber_local! {
        static SLOT: std::cell::RefCell<Option<ManyLocks>> = std::cell::RefCell::new(None);
    }
    in_child(
        "a_fiber_local_destructor_in_teardown_makes_thousands_of_operations",
        30,
        || {
            let rt = rt_fixed_grace(1, ms(50));
            let (tx, rx) = fiber::chan::bounded::<()>(0);
            rt.spawn(move || {
                SLOT.with(|s| *s.borrow_mut() = Some(ManyLocks));
                tx.send(()).unwrap();
                // Parked for good: ended by the runtime's teardown.
                loop {
                    fiber::non_cancellable(fiber::park);
                }
            });
            rx.recv().unwrap();
            drop(rt);
            assert_eq!(DONE.load(SeqCst), 3000, "the destructor did not run to its end");
        },
    );
}
