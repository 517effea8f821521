//! std's `std::sync::mpsc` test suite, as crossbeam-channel carries it
//! (crossbeam-rs/crossbeam, `crossbeam-channel/tests/mpsc.rs`: the tests
//! of `channel()`, `sync_channel()` and the old mpsc `select!`, rewritten
//! over crossbeam's API through small shims), plus the tests of std's own
//! current files (rust-lang/rust, `library/std/tests/sync/mpsc.rs` and
//! `mpsc_sync.rs`) that the crossbeam copy lacks, ported onto `fiber::chan`.
//! `channel()` is `unbounded()`, `sync_channel(n)` is `bounded(n)`; the
//! mpsc `select!` shim is fiber's `select!` with receive arms only.
//!
//! After the ports, a section (`edges`) holds checks of the rules those
//! tests touch, pushed further: disconnection while operations are
//! parked, values dropped exactly once, huge timeouts (`Duration::MAX`),
//! `try_recv` after a disconnection, the iterators, many senders.
//!
//! Every test body runs three ways, each its own `#[test]`: on plain OS
//! threads (peers are `std::thread`s), in fibers of a 1-worker runtime and
//! in fibers of a 2-worker runtime (peers are fibers); each run has a hang
//! guard. Iteration counts and sleeps are cut down from upstream's where
//! the assertion does not depend on them; every peer is joined (as in
//! crossbeam's copy; std leaves some detached).
//!
//! Adaptations for cooperative scheduling (the fixed runtimes here never
//! preempt): a loop that never blocks (`try_recv` polling, upstream's
//! `thread::yield_now` spins, and the `while tx.send(1).is_ok() {}` loops
//! on an unbounded channel, whose sends never wait) calls `relax()` (a
//! yield), so a single worker can run the peer the loop depends on.
//!
//! Not repeated here: crossbeam's zero/array/list/select tests
//! (`conformance/crossbeam.rs`).

#![allow(
    clippy::redundant_clone,
    clippy::type_complexity,
    clippy::bool_assert_comparison,
    clippy::let_and_return
)]

use fiber::chan::{
    bounded, select, unbounded, Receiver, RecvError, RecvTimeoutError, Select, SendError, SendTimeoutError, Sender,
    TryRecvError, TrySendError,
};
use std::panic::resume_unwind;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::rt1;

// ---------------------------------------------------------------------------
// Harness: `common/three_ways.rs`, and what only this suite needs.

use crate::three_ways::*;

/// Upstream's `RUST_TEST_STRESS` factor (1 there by default): a few rounds
/// here, so the `*_stress` tests race something.
const STRESS: usize = 20;

/// Wait (with a deadline) until `cond` holds.
fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "timed out waiting until {what}"
        );
        relax();
        sleep(ms(1));
    }
}

/// Wait until `r` receivers and `s` senders are parked on `tx`'s channel.
fn until_parked<T>(tx: &Sender<T>, r: usize, s: usize) {
    wait_until(&format!("{r} receivers and {s} senders park"), || {
        tx.waiting() == (r, s)
    });
}

/// A value that counts its drops in a shared counter (per test run, so
/// the modes running in parallel do not share it).
#[derive(Debug)]
struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn counter() -> Arc<AtomicUsize> {
    Arc::new(AtomicUsize::new(0))
}

fn drops(c: &Arc<AtomicUsize>) -> usize {
    c.load(Ordering::SeqCst)
}

// ---------------------------------------------------------------------------
// `channel()` tests (crossbeam mpsc.rs `channel_tests`; std `mpsc.rs`).

mod channel_tests {
    use super::*;

    fn channel<T>() -> (Sender<T>, Receiver<T>) {
        unbounded()
    }

    fn smoke() {
        let (tx, rx) = channel::<i32>();
        tx.send(1).unwrap();
        assert_eq!(rx.recv().unwrap(), 1);
    }

    // Upstream only drops a channel holding a value; here the value is
    // counted: dropped once, when the last handle goes.
    fn drop_full() {
        let c = counter();
        let (tx, rx) = channel::<Box<Counted>>();
        tx.send(Box::new(Counted(c.clone()))).unwrap();
        drop(rx);
        assert_eq!(drops(&c), 1, "the buffered value is dropped with the last receiver");
        drop(tx);
        assert_eq!(drops(&c), 1);
    }

    fn drop_full_shared() {
        let c = counter();
        let (tx, rx) = channel::<Box<Counted>>();
        drop(tx.clone());
        drop(tx.clone());
        tx.send(Box::new(Counted(c.clone()))).unwrap();
        drop(tx);
        assert_eq!(drops(&c), 0, "the value outlives the senders");
        drop(rx);
        assert_eq!(drops(&c), 1);
    }

    fn smoke_shared() {
        let (tx, rx) = channel::<i32>();
        tx.send(1).unwrap();
        assert_eq!(rx.recv().unwrap(), 1);
        let tx = tx.clone();
        tx.send(1).unwrap();
        assert_eq!(rx.recv().unwrap(), 1);
    }

    fn smoke_threads() {
        let (tx, rx) = channel::<i32>();
        let t = go(move || tx.send(1).unwrap());
        assert_eq!(rx.recv().unwrap(), 1);
        t.join();
    }

    fn smoke_port_gone() {
        let (tx, rx) = channel::<i32>();
        drop(rx);
        assert!(tx.send(1).is_err());
    }

    fn smoke_shared_port_gone() {
        let (tx, rx) = channel::<i32>();
        drop(rx);
        assert_eq!(tx.send(1), Err(SendError(1)));
    }

    fn smoke_shared_port_gone2() {
        let (tx, rx) = channel::<i32>();
        drop(rx);
        let tx2 = tx.clone();
        drop(tx);
        assert!(tx2.send(1).is_err());
    }

    fn port_gone_concurrent() {
        let (tx, rx) = channel::<i32>();
        let t = go(move || {
            rx.recv().unwrap();
        });
        while tx.send(1).is_ok() {
            relax();
        }
        t.join();
    }

    fn port_gone_concurrent_shared() {
        let (tx, rx) = channel::<i32>();
        let tx2 = tx.clone();
        let t = go(move || {
            rx.recv().unwrap();
        });
        while tx.send(1).is_ok() && tx2.send(1).is_ok() {
            relax();
        }
        t.join();
    }

    fn smoke_chan_gone() {
        let (tx, rx) = channel::<i32>();
        drop(tx);
        assert!(rx.recv().is_err());
    }

    fn smoke_chan_gone_shared() {
        let (tx, rx) = channel::<()>();
        let tx2 = tx.clone();
        drop(tx);
        drop(tx2);
        assert!(rx.recv().is_err());
    }

    fn chan_gone_concurrent() {
        let (tx, rx) = channel::<i32>();
        let t = go(move || {
            tx.send(1).unwrap();
            tx.send(1).unwrap();
        });
        let mut n = 0;
        while rx.recv().is_ok() {
            n += 1;
        }
        assert_eq!(n, 2);
        t.join();
    }

    fn stress() {
        const COUNT: usize = 5000;
        let (tx, rx) = channel::<i32>();
        let t = go(move || {
            for _ in 0..COUNT {
                tx.send(1).unwrap();
            }
        });
        for _ in 0..COUNT {
            assert_eq!(rx.recv().unwrap(), 1);
        }
        t.join();
    }

    fn stress_shared() {
        const AMT: u32 = 1000;
        const NTHREADS: u32 = 8;
        let (tx, rx) = channel::<i32>();
        let t = go(move || {
            for _ in 0..AMT * NTHREADS {
                assert_eq!(rx.recv().unwrap(), 1);
            }
            // Every sender is gone by now (the receiver had all values,
            // and the last sender drops after its last send): std says
            // only "not Ok"; crossbeam-channel's semantics make it
            // `Disconnected` once the senders' drops happened.
            assert!(rx.try_recv().is_err());
        });
        let ts: Vec<_> = (0..NTHREADS)
            .map(|_| {
                let tx = tx.clone();
                go(move || {
                    for _ in 0..AMT {
                        tx.send(1).unwrap();
                    }
                })
            })
            .collect();
        drop(tx);
        t.join();
        for t in ts {
            t.join();
        }
    }

    fn send_from_outside_runtime() {
        let (tx1, rx1) = channel::<()>();
        let (tx2, rx2) = channel::<i32>();
        let t1 = go(move || {
            tx1.send(()).unwrap();
            for _ in 0..40 {
                assert_eq!(rx2.recv().unwrap(), 1);
            }
        });
        rx1.recv().unwrap();
        let t2 = go(move || {
            for _ in 0..40 {
                tx2.send(1).unwrap();
            }
        });
        t1.join();
        t2.join();
    }

    fn recv_from_outside_runtime() {
        let (tx, rx) = channel::<i32>();
        let t = go(move || {
            for _ in 0..40 {
                assert_eq!(rx.recv().unwrap(), 1);
            }
        });
        for _ in 0..40 {
            tx.send(1).unwrap();
        }
        t.join();
    }

    fn no_runtime() {
        let (tx1, rx1) = channel::<i32>();
        let (tx2, rx2) = channel::<i32>();
        let t1 = go(move || {
            assert_eq!(rx1.recv().unwrap(), 1);
            tx2.send(2).unwrap();
        });
        let t2 = go(move || {
            tx1.send(1).unwrap();
            assert_eq!(rx2.recv().unwrap(), 2);
        });
        t1.join();
        t2.join();
    }

    fn oneshot_single_thread_close_port_first() {
        let (tx, rx) = channel::<i32>();
        drop(rx);
        assert!(tx.is_closed() || tx.send(0).is_err());
        drop(tx);
    }

    fn oneshot_single_thread_close_chan_first() {
        let (tx, rx) = channel::<i32>();
        drop(tx);
        assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));
        drop(rx);
    }

    // "the sender cleans up the payload if receiver is closed": the error
    // carries the payload back, and it is dropped exactly once.
    fn oneshot_single_thread_send_port_close() {
        let c = counter();
        let (tx, rx) = channel::<Box<Counted>>();
        drop(rx);
        let err = tx.send(Box::new(Counted(c.clone()))).unwrap_err();
        assert_eq!(drops(&c), 0, "the refused value comes back, not dropped");
        drop(err.into_inner());
        assert_eq!(drops(&c), 1);
        drop(tx);
        assert_eq!(drops(&c), 1);
    }

    fn oneshot_single_thread_recv_chan_close() {
        let (tx, rx) = channel::<i32>();
        drop(tx);
        assert_eq!(rx.recv(), Err(RecvError));
    }

    // std's form: the peer unwraps the failed receive and panics.
    fn oneshot_single_thread_recv_chan_close_panics() {
        let res = go(move || {
            let (tx, rx) = channel::<i32>();
            drop(tx);
            rx.recv().unwrap();
        })
        .outcome();
        assert!(res.is_err());
    }

    fn oneshot_single_thread_send_then_recv() {
        let (tx, rx) = channel::<Box<i32>>();
        tx.send(Box::new(10)).unwrap();
        assert!(*rx.recv().unwrap() == 10);
    }

    fn oneshot_single_thread_try_send_open() {
        let (tx, rx) = channel::<i32>();
        assert!(tx.send(10).is_ok());
        assert!(rx.recv().unwrap() == 10);
    }

    fn oneshot_single_thread_try_send_closed() {
        let (tx, rx) = channel::<i32>();
        drop(rx);
        assert!(tx.send(10).is_err());
        assert_eq!(tx.try_send(10), Err(TrySendError::Disconnected(10)));
    }

    fn oneshot_single_thread_try_recv_open() {
        let (tx, rx) = channel::<i32>();
        tx.send(10).unwrap();
        assert!(rx.recv() == Ok(10));
    }

    fn oneshot_single_thread_try_recv_closed() {
        let (tx, rx) = channel::<i32>();
        drop(tx);
        assert!(rx.recv().is_err());
    }

    fn oneshot_single_thread_peek_data() {
        let (tx, rx) = channel::<i32>();
        assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
        tx.send(10).unwrap();
        assert_eq!(rx.try_recv(), Ok(10));
    }

    fn oneshot_single_thread_peek_close() {
        let (tx, rx) = channel::<i32>();
        drop(tx);
        assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));
        assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));
    }

    fn oneshot_single_thread_peek_open() {
        let (_tx, rx) = channel::<i32>();
        assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    }

    fn oneshot_multi_task_recv_then_send() {
        let (tx, rx) = channel::<Box<i32>>();
        let t = go(move || {
            assert!(*rx.recv().unwrap() == 10);
        });
        tx.send(Box::new(10)).unwrap();
        t.join();
    }

    fn oneshot_multi_task_recv_then_close() {
        let (tx, rx) = channel::<Box<i32>>();
        let t = go(move || drop(tx));
        go(move || assert_eq!(rx.recv(), Err(RecvError))).join();
        t.join();
    }

    // std's form: the receiving peer unwraps and panics.
    fn oneshot_multi_task_recv_then_close_panics() {
        let (tx, rx) = channel::<Box<i32>>();
        let t = go(move || drop(tx));
        let res = go(move || {
            assert!(*rx.recv().unwrap() == 10);
        })
        .outcome();
        assert!(res.is_err());
        t.join();
    }

    fn oneshot_multi_thread_close_stress() {
        let mut ts = Vec::with_capacity(STRESS);
        for _ in 0..STRESS {
            let (tx, rx) = channel::<i32>();
            ts.push(go(move || drop(rx)));
            drop(tx);
        }
        for t in ts {
            t.join();
        }
    }

    fn oneshot_multi_thread_send_close_stress() {
        let mut ts = Vec::with_capacity(STRESS);
        for _ in 0..STRESS {
            let (tx, rx) = channel::<i32>();
            ts.push(go(move || drop(rx)));
            // Either outcome is fine (std unwraps it in a peer and ignores
            // the peer's panic).
            go(move || {
                let _ = tx.send(1);
            })
            .join();
        }
        for t in ts {
            t.join();
        }
    }

    fn oneshot_multi_thread_recv_close_stress() {
        let mut ts = Vec::with_capacity(2 * STRESS);
        for _ in 0..STRESS {
            let (tx, rx) = channel::<i32>();
            ts.push(go(move || {
                go(move || assert_eq!(rx.recv(), Err(RecvError))).join();
            }));
            ts.push(go(move || {
                go(move || drop(tx)).join();
            }));
        }
        for t in ts {
            t.join();
        }
    }

    fn oneshot_multi_thread_send_recv_stress() {
        let mut ts = Vec::with_capacity(STRESS);
        for _ in 0..STRESS {
            let (tx, rx) = channel::<Box<isize>>();
            ts.push(go(move || tx.send(Box::new(10)).unwrap()));
            assert!(*rx.recv().unwrap() == 10);
        }
        for t in ts {
            t.join();
        }
    }

    /// A chain of peers, each sending `i` and handing the sender on.
    pub(super) fn send_chain(tx: Sender<Box<i32>>, i: i32) -> Option<Peer<()>> {
        if i == 10 {
            return None;
        }
        Some(go(move || {
            tx.send(Box::new(i)).unwrap();
            if let Some(t) = send_chain(tx, i + 1) {
                t.join();
            }
        }))
    }

    /// A chain of peers, each receiving `i` and handing the receiver on.
    pub(super) fn recv_chain(rx: Receiver<Box<i32>>, i: i32) -> Option<Peer<()>> {
        if i == 10 {
            return None;
        }
        Some(go(move || {
            assert!(*rx.recv().unwrap() == i);
            if let Some(t) = recv_chain(rx, i + 1) {
                t.join();
            }
        }))
    }

    fn stream_send_recv_stress() {
        let mut ts = Vec::with_capacity(2 * STRESS);
        for _ in 0..STRESS {
            let (tx, rx) = channel();
            ts.extend(send_chain(tx, 0));
            ts.extend(recv_chain(rx, 0));
        }
        for t in ts {
            t.join();
        }
    }

    fn oneshot_single_thread_recv_timeout() {
        let (tx, rx) = channel();
        tx.send(()).unwrap();
        assert_eq!(rx.recv_timeout(ms(1)), Ok(()));
        assert_eq!(rx.recv_timeout(ms(1)), Err(RecvTimeoutError::Timeout));
        tx.send(()).unwrap();
        assert_eq!(rx.recv_timeout(ms(1)), Ok(()));
    }

    fn stress_recv_timeout_two_threads() {
        let (tx, rx) = channel();
        let stress = 20;
        let timeout = ms(5);
        let t = go(move || {
            for i in 0..stress {
                if i % 2 == 0 {
                    sleep(timeout * 2);
                }
                tx.send(1usize).unwrap();
            }
        });
        let mut recv_count = 0;
        loop {
            match rx.recv_timeout(timeout) {
                Ok(n) => {
                    assert_eq!(n, 1usize);
                    recv_count += 1;
                }
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        assert_eq!(recv_count, stress);
        t.join();
    }

    fn recv_timeout_upgrade() {
        let (tx, rx) = channel::<()>();
        let timeout = ms(1);
        let _tx_clone = tx.clone();
        let start = Instant::now();
        assert_eq!(rx.recv_timeout(timeout), Err(RecvTimeoutError::Timeout));
        assert!(Instant::now() >= start + timeout, "the timeout fired early");
    }

    fn stress_recv_timeout_shared() {
        let (tx, rx) = channel();
        let stress = 30;
        let ts: Vec<_> = (0..stress)
            .map(|i| {
                let tx = tx.clone();
                go(move || {
                    sleep(ms(i as u64 * 3));
                    tx.send(1usize).unwrap();
                })
            })
            .collect();
        drop(tx);
        let mut recv_count = 0;
        loop {
            match rx.recv_timeout(ms(10)) {
                Ok(n) => {
                    assert_eq!(n, 1usize);
                    recv_count += 1;
                }
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        assert_eq!(recv_count, stress);
        for t in ts {
            t.join();
        }
    }

    // std: `very_long_recv_timeout_wont_panic` (a receiver waiting
    // `from_secs(u64::MAX)` gets the value sent later).
    fn very_long_recv_timeout_wont_panic() {
        let (tx, rx) = channel::<()>();
        let t = go(move || rx.recv_timeout(Duration::from_secs(u64::MAX)));
        sleep(ms(50));
        assert!(tx.send(()).is_ok());
        assert_eq!(t.join(), Ok(()));
    }

    fn recv_a_lot() {
        const N: usize = 10000;
        let (tx, rx) = channel();
        for _ in 0..N {
            tx.send(()).unwrap();
        }
        for _ in 0..N {
            rx.recv().unwrap();
        }
    }

    fn shared_recv_timeout() {
        let (tx, rx) = channel();
        let total = 5;
        let ts: Vec<_> = (0..total)
            .map(|_| {
                let tx = tx.clone();
                go(move || tx.send(()).unwrap())
            })
            .collect();
        for _ in 0..total {
            rx.recv().unwrap();
        }
        assert_eq!(rx.recv_timeout(ms(1)), Err(RecvTimeoutError::Timeout));
        tx.send(()).unwrap();
        assert_eq!(rx.recv_timeout(ms(1)), Ok(()));
        for t in ts {
            t.join();
        }
    }

    fn shared_chan_stress() {
        let (tx, rx) = channel();
        let total = 101;
        let ts: Vec<_> = (0..total)
            .map(|_| {
                let tx = tx.clone();
                go(move || tx.send(()).unwrap())
            })
            .collect();
        for _ in 0..total {
            rx.recv().unwrap();
        }
        for t in ts {
            t.join();
        }
    }

    fn test_nested_recv_iter() {
        let (tx, rx) = channel::<i32>();
        let (total_tx, total_rx) = channel::<i32>();
        let t = go(move || {
            let mut acc = 0;
            for x in rx.iter() {
                acc += x;
            }
            total_tx.send(acc).unwrap();
        });
        tx.send(3).unwrap();
        tx.send(1).unwrap();
        tx.send(2).unwrap();
        drop(tx);
        assert_eq!(total_rx.recv().unwrap(), 6);
        t.join();
    }

    fn test_recv_iter_break() {
        let (tx, rx) = channel::<i32>();
        let (count_tx, count_rx) = channel();
        let t = go(move || {
            let mut count = 0;
            for x in rx.iter() {
                if count >= 3 {
                    break;
                } else {
                    count += x;
                }
            }
            count_tx.send(count).unwrap();
        });
        tx.send(2).unwrap();
        tx.send(2).unwrap();
        tx.send(2).unwrap();
        let _ = tx.send(2);
        drop(tx);
        assert_eq!(count_rx.recv().unwrap(), 4);
        t.join();
    }

    fn test_recv_try_iter() {
        let (request_tx, request_rx) = channel();
        let (response_tx, response_rx) = channel();
        // Request `x`s until we have `6`.
        let t = go(move || {
            let mut count = 0;
            loop {
                for x in response_rx.try_iter() {
                    count += x;
                    if count == 6 {
                        return count;
                    }
                }
                request_tx.send(()).unwrap();
                relax();
            }
        });
        for _ in request_rx.iter() {
            if response_tx.send(2).is_err() {
                break;
            }
        }
        assert_eq!(t.join(), 6);
    }

    fn test_recv_into_iter_owned() {
        let mut iter = {
            let (tx, rx) = channel::<i32>();
            tx.send(1).unwrap();
            tx.send(2).unwrap();
            rx.into_iter()
        };
        assert_eq!(iter.next().unwrap(), 1);
        assert_eq!(iter.next().unwrap(), 2);
        assert!(iter.next().is_none());
    }

    fn test_recv_into_iter_borrowed() {
        let (tx, rx) = channel::<i32>();
        tx.send(1).unwrap();
        tx.send(2).unwrap();
        drop(tx);
        let mut iter = (&rx).into_iter();
        assert_eq!(iter.next().unwrap(), 1);
        assert_eq!(iter.next().unwrap(), 2);
        assert!(iter.next().is_none());
    }

    fn try_recv_states() {
        let (tx1, rx1) = channel::<i32>();
        let (tx2, rx2) = channel::<()>();
        let (tx3, rx3) = channel::<()>();
        let t = go(move || {
            rx2.recv().unwrap();
            tx1.send(1).unwrap();
            tx3.send(()).unwrap();
            rx2.recv().unwrap();
            drop(tx1);
            tx3.send(()).unwrap();
        });
        assert_eq!(rx1.try_recv(), Err(TryRecvError::Empty));
        tx2.send(()).unwrap();
        rx3.recv().unwrap();
        assert_eq!(rx1.try_recv(), Ok(1));
        assert_eq!(rx1.try_recv(), Err(TryRecvError::Empty));
        tx2.send(()).unwrap();
        rx3.recv().unwrap();
        assert_eq!(rx1.try_recv(), Err(TryRecvError::Disconnected));
        t.join();
    }

    fn destroy_upgraded_shared_port_when_sender_still_active() {
        let (tx, rx) = channel();
        let (tx2, rx2) = channel();
        let t = go(move || {
            rx.recv().unwrap(); // wait on a oneshot
            drop(rx); // destroy a shared
            tx2.send(()).unwrap();
        });
        // let the other side go to sleep
        for _ in 0..5000 {
            relax();
        }
        // upgrade to a shared chan and send a message
        let t2 = tx.clone();
        drop(tx);
        t2.send(()).unwrap();
        // wait for the child to exit before we exit
        rx2.recv().unwrap();
        t.join();
    }

    fn issue_32114() {
        let (tx, _) = channel();
        let _ = tx.send(123);
        assert_eq!(tx.send(123), Err(SendError(123)));
    }

    // std: `issue_39364` (a sender cloned, while the receiver waits with a
    // timeout, then kept alive: the receive times out, no hang or panic).
    fn issue_39364() {
        let (tx, rx) = channel::<()>();
        let t = go(move || {
            sleep(ms(100));
            let _ = tx.clone();
            // Don't drop; hand back to caller.
            tx
        });
        assert_eq!(rx.recv_timeout(ms(150)), Err(RecvTimeoutError::Timeout));
        let _tx = t.join(); // delay dropping until end of test
        assert_eq!(rx.recv_timeout(ms(50)), Err(RecvTimeoutError::Timeout));
    }

    port!(
        smoke,
        drop_full,
        drop_full_shared,
        smoke_shared,
        smoke_threads,
        smoke_port_gone,
        smoke_shared_port_gone,
        smoke_shared_port_gone2,
        port_gone_concurrent,
        port_gone_concurrent_shared,
        smoke_chan_gone,
        smoke_chan_gone_shared,
        chan_gone_concurrent,
        stress,
        stress_shared,
        send_from_outside_runtime,
        recv_from_outside_runtime,
        no_runtime,
        oneshot_single_thread_close_port_first,
        oneshot_single_thread_close_chan_first,
        oneshot_single_thread_send_port_close,
        oneshot_single_thread_recv_chan_close,
        oneshot_single_thread_recv_chan_close_panics,
        oneshot_single_thread_send_then_recv,
        oneshot_single_thread_try_send_open,
        oneshot_single_thread_try_send_closed,
        oneshot_single_thread_try_recv_open,
        oneshot_single_thread_try_recv_closed,
        oneshot_single_thread_peek_data,
        oneshot_single_thread_peek_close,
        oneshot_single_thread_peek_open,
        oneshot_multi_task_recv_then_send,
        oneshot_multi_task_recv_then_close,
        oneshot_multi_task_recv_then_close_panics,
        oneshot_multi_thread_close_stress,
        oneshot_multi_thread_send_close_stress,
        oneshot_multi_thread_recv_close_stress,
        oneshot_multi_thread_send_recv_stress,
        stream_send_recv_stress,
        oneshot_single_thread_recv_timeout,
        stress_recv_timeout_two_threads,
        recv_timeout_upgrade,
        stress_recv_timeout_shared,
        very_long_recv_timeout_wont_panic,
        recv_a_lot,
        shared_recv_timeout,
        shared_chan_stress,
        test_nested_recv_iter,
        test_recv_iter_break,
        test_recv_try_iter,
        test_recv_into_iter_owned,
        test_recv_into_iter_borrowed,
        try_recv_states,
        destroy_upgraded_shared_port_when_sender_still_active,
        issue_32114,
        issue_39364,
    );
}

// ---------------------------------------------------------------------------
// `sync_channel(n)` tests (crossbeam mpsc.rs `sync_channel_tests`; std
// `mpsc_sync.rs`).

mod sync_channel_tests {
    use super::*;

    fn sync_channel<T>(bound: usize) -> (Sender<T>, Receiver<T>) {
        bounded(bound)
    }

    fn smoke() {
        let (tx, rx) = sync_channel::<i32>(1);
        tx.send(1).unwrap();
        assert_eq!(rx.recv().unwrap(), 1);
    }

    fn drop_full() {
        let c = counter();
        let (tx, rx) = sync_channel::<Box<Counted>>(1);
        tx.send(Box::new(Counted(c.clone()))).unwrap();
        drop(tx);
        assert_eq!(drops(&c), 0);
        drop(rx);
        assert_eq!(drops(&c), 1);
    }

    fn smoke_shared() {
        let (tx, rx) = sync_channel::<i32>(1);
        tx.send(1).unwrap();
        assert_eq!(rx.recv().unwrap(), 1);
        let tx = tx.clone();
        tx.send(1).unwrap();
        assert_eq!(rx.recv().unwrap(), 1);
    }

    fn recv_timeout() {
        let (tx, rx) = sync_channel::<i32>(1);
        assert_eq!(rx.recv_timeout(ms(1)), Err(RecvTimeoutError::Timeout));
        tx.send(1).unwrap();
        assert_eq!(rx.recv_timeout(ms(1)), Ok(1));
    }

    // std `mpsc_sync.rs`: `send_timeout`.
    fn send_timeout() {
        let (tx, _rx) = sync_channel::<i32>(1);
        assert_eq!(tx.send_timeout(1, ms(1)), Ok(()));
        assert_eq!(tx.send_timeout(1, ms(1)), Err(SendTimeoutError::Timeout(1)));
    }

    fn smoke_threads() {
        let (tx, rx) = sync_channel::<i32>(0);
        let t = go(move || tx.send(1).unwrap());
        assert_eq!(rx.recv().unwrap(), 1);
        t.join();
    }

    fn smoke_port_gone() {
        let (tx, rx) = sync_channel::<i32>(0);
        drop(rx);
        assert!(tx.send(1).is_err());
    }

    fn smoke_shared_port_gone2() {
        let (tx, rx) = sync_channel::<i32>(0);
        drop(rx);
        let tx2 = tx.clone();
        drop(tx);
        assert!(tx2.send(1).is_err());
    }

    fn port_gone_concurrent() {
        let (tx, rx) = sync_channel::<i32>(0);
        let t = go(move || {
            rx.recv().unwrap();
        });
        while tx.send(1).is_ok() {}
        t.join();
    }

    fn port_gone_concurrent_shared() {
        let (tx, rx) = sync_channel::<i32>(0);
        let tx2 = tx.clone();
        let t = go(move || {
            rx.recv().unwrap();
        });
        while tx.send(1).is_ok() && tx2.send(1).is_ok() {}
        t.join();
    }

    fn smoke_chan_gone() {
        let (tx, rx) = sync_channel::<i32>(0);
        drop(tx);
        assert!(rx.recv().is_err());
    }

    fn smoke_chan_gone_shared() {
        let (tx, rx) = sync_channel::<()>(0);
        let tx2 = tx.clone();
        drop(tx);
        drop(tx2);
        assert!(rx.recv().is_err());
    }

    fn chan_gone_concurrent() {
        let (tx, rx) = sync_channel::<i32>(0);
        let t = go(move || {
            tx.send(1).unwrap();
            tx.send(1).unwrap();
        });
        let mut n = 0;
        while rx.recv().is_ok() {
            n += 1;
        }
        assert_eq!(n, 2);
        t.join();
    }

    fn stress() {
        const N: usize = 2000;
        let (tx, rx) = sync_channel::<i32>(0);
        let t = go(move || {
            for _ in 0..N {
                tx.send(1).unwrap();
            }
        });
        for _ in 0..N {
            assert_eq!(rx.recv().unwrap(), 1);
        }
        t.join();
    }

    fn stress_recv_timeout_two_threads() {
        const N: usize = 1000;
        let (tx, rx) = sync_channel::<i32>(0);
        let t = go(move || {
            for _ in 0..N {
                tx.send(1).unwrap();
            }
        });
        let mut recv_count = 0;
        loop {
            match rx.recv_timeout(ms(1)) {
                Ok(v) => {
                    assert_eq!(v, 1);
                    recv_count += 1;
                }
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        assert_eq!(recv_count, N);
        t.join();
    }

    fn stress_recv_timeout_shared() {
        const AMT: u32 = 200;
        const NTHREADS: u32 = 8;
        let (tx, rx) = sync_channel::<i32>(0);
        let (dtx, drx) = sync_channel::<()>(0);
        let t = go(move || {
            let mut recv_count = 0;
            loop {
                match rx.recv_timeout(ms(10)) {
                    Ok(v) => {
                        assert_eq!(v, 1);
                        recv_count += 1;
                    }
                    Err(RecvTimeoutError::Timeout) => continue,
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            }
            assert_eq!(recv_count, AMT * NTHREADS);
            assert!(rx.try_recv().is_err());
            dtx.send(()).unwrap();
        });
        let ts: Vec<_> = (0..NTHREADS)
            .map(|_| {
                let tx = tx.clone();
                go(move || {
                    for _ in 0..AMT {
                        tx.send(1).unwrap();
                    }
                })
            })
            .collect();
        drop(tx);
        drx.recv().unwrap();
        for t in ts {
            t.join();
        }
        t.join();
    }

    fn stress_shared() {
        const AMT: u32 = 200;
        const NTHREADS: u32 = 8;
        let (tx, rx) = sync_channel::<i32>(0);
        let (dtx, drx) = sync_channel::<()>(0);
        let t = go(move || {
            for _ in 0..AMT * NTHREADS {
                assert_eq!(rx.recv().unwrap(), 1);
            }
            assert!(rx.try_recv().is_err());
            dtx.send(()).unwrap();
        });
        let ts: Vec<_> = (0..NTHREADS)
            .map(|_| {
                let tx = tx.clone();
                go(move || {
                    for _ in 0..AMT {
                        tx.send(1).unwrap();
                    }
                })
            })
            .collect();
        drop(tx);
        drx.recv().unwrap();
        for t in ts {
            t.join();
        }
        t.join();
    }

    fn oneshot_single_thread_close_port_first() {
        let (tx, rx) = sync_channel::<i32>(0);
        drop(rx);
        assert_eq!(tx.try_send(0), Err(TrySendError::Disconnected(0)));
    }

    fn oneshot_single_thread_close_chan_first() {
        let (tx, rx) = sync_channel::<i32>(0);
        drop(tx);
        assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));
    }

    fn oneshot_single_thread_send_port_close() {
        let c = counter();
        let (tx, rx) = sync_channel::<Box<Counted>>(0);
        drop(rx);
        let err = tx.send(Box::new(Counted(c.clone()))).unwrap_err();
        assert_eq!(drops(&c), 0);
        drop(err);
        assert_eq!(drops(&c), 1);
    }

    fn oneshot_single_thread_recv_chan_close() {
        let (tx, rx) = sync_channel::<i32>(0);
        drop(tx);
        assert_eq!(rx.recv(), Err(RecvError));
    }

    fn oneshot_single_thread_recv_chan_close_panics() {
        let res = go(move || {
            let (tx, rx) = sync_channel::<i32>(0);
            drop(tx);
            rx.recv().unwrap();
        })
        .outcome();
        assert!(res.is_err());
    }

    fn oneshot_single_thread_send_then_recv() {
        let (tx, rx) = sync_channel::<Box<i32>>(1);
        tx.send(Box::new(10)).unwrap();
        assert!(*rx.recv().unwrap() == 10);
    }

    fn oneshot_single_thread_try_send_open() {
        let (tx, rx) = sync_channel::<i32>(1);
        assert_eq!(tx.try_send(10), Ok(()));
        assert!(rx.recv().unwrap() == 10);
    }

    fn oneshot_single_thread_try_send_closed() {
        let (tx, rx) = sync_channel::<i32>(0);
        drop(rx);
        assert_eq!(tx.try_send(10), Err(TrySendError::Disconnected(10)));
    }

    fn oneshot_single_thread_try_send_closed2() {
        let (tx, _rx) = sync_channel::<i32>(0);
        assert_eq!(tx.try_send(10), Err(TrySendError::Full(10)));
    }

    fn oneshot_single_thread_try_recv_open() {
        let (tx, rx) = sync_channel::<i32>(1);
        tx.send(10).unwrap();
        assert!(rx.recv() == Ok(10));
    }

    fn oneshot_single_thread_try_recv_closed() {
        let (tx, rx) = sync_channel::<i32>(0);
        drop(tx);
        assert!(rx.recv().is_err());
    }

    fn oneshot_single_thread_try_recv_closed_with_data() {
        let (tx, rx) = sync_channel::<i32>(1);
        tx.send(10).unwrap();
        drop(tx);
        assert_eq!(rx.try_recv(), Ok(10));
        assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));
    }

    fn oneshot_single_thread_peek_data() {
        let (tx, rx) = sync_channel::<i32>(1);
        assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
        tx.send(10).unwrap();
        assert_eq!(rx.try_recv(), Ok(10));
    }

    fn oneshot_single_thread_peek_close() {
        let (tx, rx) = sync_channel::<i32>(0);
        drop(tx);
        assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));
        assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));
    }

    fn oneshot_single_thread_peek_open() {
        let (_tx, rx) = sync_channel::<i32>(0);
        assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    }

    fn oneshot_multi_task_recv_then_send() {
        let (tx, rx) = sync_channel::<Box<i32>>(0);
        let t = go(move || {
            assert!(*rx.recv().unwrap() == 10);
        });
        tx.send(Box::new(10)).unwrap();
        t.join();
    }

    fn oneshot_multi_task_recv_then_close() {
        let (tx, rx) = sync_channel::<Box<i32>>(0);
        let t = go(move || drop(tx));
        go(move || assert_eq!(rx.recv(), Err(RecvError))).join();
        t.join();
    }

    fn oneshot_multi_task_recv_then_close_panics() {
        let (tx, rx) = sync_channel::<Box<i32>>(0);
        let t = go(move || drop(tx));
        let res = go(move || {
            assert!(*rx.recv().unwrap() == 10);
        })
        .outcome();
        assert!(res.is_err());
        t.join();
    }

    fn oneshot_multi_thread_close_stress() {
        let mut ts = Vec::with_capacity(STRESS);
        for _ in 0..STRESS {
            let (tx, rx) = sync_channel::<i32>(0);
            ts.push(go(move || drop(rx)));
            drop(tx);
        }
        for t in ts {
            t.join();
        }
    }

    fn oneshot_multi_thread_send_close_stress() {
        let mut ts = Vec::with_capacity(STRESS);
        for _ in 0..STRESS {
            let (tx, rx) = sync_channel::<i32>(0);
            ts.push(go(move || drop(rx)));
            // On a rendezvous channel nothing receives: the send can only
            // fail, once the receiver is gone (it must not hang).
            let res = go(move || tx.send(1)).join();
            assert_eq!(res, Err(SendError(1)));
        }
        for t in ts {
            t.join();
        }
    }

    fn oneshot_multi_thread_recv_close_stress() {
        let mut ts = Vec::with_capacity(2 * STRESS);
        for _ in 0..STRESS {
            let (tx, rx) = sync_channel::<i32>(0);
            ts.push(go(move || {
                go(move || assert_eq!(rx.recv(), Err(RecvError))).join();
            }));
            ts.push(go(move || {
                go(move || drop(tx)).join();
            }));
        }
        for t in ts {
            t.join();
        }
    }

    fn oneshot_multi_thread_send_recv_stress() {
        let mut ts = Vec::with_capacity(STRESS);
        for _ in 0..STRESS {
            let (tx, rx) = sync_channel::<Box<i32>>(0);
            ts.push(go(move || tx.send(Box::new(10)).unwrap()));
            assert!(*rx.recv().unwrap() == 10);
        }
        for t in ts {
            t.join();
        }
    }

    fn stream_send_recv_stress() {
        let mut ts = Vec::with_capacity(2 * STRESS);
        for _ in 0..STRESS {
            let (tx, rx) = sync_channel::<Box<i32>>(0);
            ts.extend(channel_tests::send_chain(tx, 0));
            ts.extend(channel_tests::recv_chain(rx, 0));
        }
        for t in ts {
            t.join();
        }
    }

    fn recv_a_lot() {
        const N: usize = 10000;
        let (tx, rx) = sync_channel(N);
        for _ in 0..N {
            tx.send(()).unwrap();
        }
        for _ in 0..N {
            rx.recv().unwrap();
        }
    }

    fn shared_chan_stress() {
        let (tx, rx) = sync_channel(0);
        let total = 101;
        let ts: Vec<_> = (0..total)
            .map(|_| {
                let tx = tx.clone();
                go(move || tx.send(()).unwrap())
            })
            .collect();
        for _ in 0..total {
            rx.recv().unwrap();
        }
        for t in ts {
            t.join();
        }
    }

    fn test_nested_recv_iter() {
        let (tx, rx) = sync_channel::<i32>(0);
        let (total_tx, total_rx) = sync_channel::<i32>(0);
        let t = go(move || {
            let mut acc = 0;
            for x in rx.iter() {
                acc += x;
            }
            total_tx.send(acc).unwrap();
        });
        tx.send(3).unwrap();
        tx.send(1).unwrap();
        tx.send(2).unwrap();
        drop(tx);
        assert_eq!(total_rx.recv().unwrap(), 6);
        t.join();
    }

    fn test_recv_iter_break() {
        let (tx, rx) = sync_channel::<i32>(0);
        let (count_tx, count_rx) = sync_channel(0);
        let t = go(move || {
            let mut count = 0;
            for x in rx.iter() {
                if count >= 3 {
                    break;
                } else {
                    count += x;
                }
            }
            count_tx.send(count).unwrap();
        });
        tx.send(2).unwrap();
        tx.send(2).unwrap();
        tx.send(2).unwrap();
        let _ = tx.try_send(2);
        drop(tx);
        assert_eq!(count_rx.recv().unwrap(), 4);
        t.join();
    }

    fn try_recv_states() {
        let (tx1, rx1) = sync_channel::<i32>(1);
        let (tx2, rx2) = sync_channel::<()>(1);
        let (tx3, rx3) = sync_channel::<()>(1);
        let t = go(move || {
            rx2.recv().unwrap();
            tx1.send(1).unwrap();
            tx3.send(()).unwrap();
            rx2.recv().unwrap();
            drop(tx1);
            tx3.send(()).unwrap();
        });
        assert_eq!(rx1.try_recv(), Err(TryRecvError::Empty));
        tx2.send(()).unwrap();
        rx3.recv().unwrap();
        assert_eq!(rx1.try_recv(), Ok(1));
        assert_eq!(rx1.try_recv(), Err(TryRecvError::Empty));
        tx2.send(()).unwrap();
        rx3.recv().unwrap();
        assert_eq!(rx1.try_recv(), Err(TryRecvError::Disconnected));
        t.join();
    }

    fn destroy_upgraded_shared_port_when_sender_still_active() {
        let (tx, rx) = sync_channel::<()>(0);
        let (tx2, rx2) = sync_channel::<()>(0);
        let t = go(move || {
            rx.recv().unwrap();
            drop(rx);
            tx2.send(()).unwrap();
        });
        for _ in 0..5000 {
            relax();
        }
        let t2 = tx.clone();
        drop(tx);
        t2.send(()).unwrap();
        rx2.recv().unwrap();
        t.join();
    }

    fn send1() {
        let (tx, rx) = sync_channel::<i32>(0);
        let t = go(move || {
            rx.recv().unwrap();
        });
        assert_eq!(tx.send(1), Ok(()));
        t.join();
    }

    fn send2() {
        let (tx, rx) = sync_channel::<i32>(0);
        let t = go(move || drop(rx));
        assert!(tx.send(1).is_err());
        t.join();
    }

    fn send3() {
        let (tx, rx) = sync_channel::<i32>(1);
        assert_eq!(tx.send(1), Ok(()));
        let t = go(move || drop(rx));
        assert!(tx.send(1).is_err());
        t.join();
    }

    fn send4() {
        let (tx, rx) = sync_channel::<i32>(0);
        let tx2 = tx.clone();
        let (done, donerx) = unbounded();
        let done2 = done.clone();
        let t = go(move || {
            assert!(tx.send(1).is_err());
            done.send(()).unwrap();
        });
        let t2 = go(move || {
            assert!(tx2.send(2).is_err());
            done2.send(()).unwrap();
        });
        drop(rx);
        donerx.recv().unwrap();
        donerx.recv().unwrap();
        t.join();
        t2.join();
    }

    fn try_send1() {
        let (tx, _rx) = sync_channel::<i32>(0);
        assert_eq!(tx.try_send(1), Err(TrySendError::Full(1)));
    }

    fn try_send2() {
        let (tx, _rx) = sync_channel::<i32>(1);
        assert_eq!(tx.try_send(1), Ok(()));
        assert_eq!(tx.try_send(1), Err(TrySendError::Full(1)));
    }

    fn try_send3() {
        let (tx, rx) = sync_channel::<i32>(1);
        assert_eq!(tx.try_send(1), Ok(()));
        drop(rx);
        assert_eq!(tx.try_send(1), Err(TrySendError::Disconnected(1)));
    }

    fn issue_15761() {
        fn repro() {
            let (tx1, rx1) = sync_channel::<()>(3);
            let (tx2, rx2) = sync_channel::<()>(3);
            let t = go(move || {
                rx1.recv().unwrap();
                tx2.try_send(()).unwrap();
            });
            tx1.try_send(()).unwrap();
            rx2.recv().unwrap();
            t.join();
        }
        for _ in 0..100 {
            repro()
        }
    }

    // std `mpsc_sync.rs`: `drop_unreceived` ("Messages should be dropped
    // immediately when the last receiver is destroyed"; std uses `Rc`).
    fn drop_unreceived() {
        let (tx, rx) = sync_channel::<Arc<()>>(1);
        let msg = Arc::new(());
        let weak = Arc::downgrade(&msg);
        assert!(tx.send(msg).is_ok());
        drop(rx);
        assert!(
            weak.upgrade().is_none(),
            "the buffered message outlived the last receiver"
        );
        drop(tx);
    }

    port!(
        smoke,
        drop_full,
        smoke_shared,
        recv_timeout,
        send_timeout,
        smoke_threads,
        smoke_port_gone,
        smoke_shared_port_gone2,
        port_gone_concurrent,
        port_gone_concurrent_shared,
        smoke_chan_gone,
        smoke_chan_gone_shared,
        chan_gone_concurrent,
        stress,
        stress_recv_timeout_two_threads,
        stress_recv_timeout_shared,
        stress_shared,
        oneshot_single_thread_close_port_first,
        oneshot_single_thread_close_chan_first,
        oneshot_single_thread_send_port_close,
        oneshot_single_thread_recv_chan_close,
        oneshot_single_thread_recv_chan_close_panics,
        oneshot_single_thread_send_then_recv,
        oneshot_single_thread_try_send_open,
        oneshot_single_thread_try_send_closed,
        oneshot_single_thread_try_send_closed2,
        oneshot_single_thread_try_recv_open,
        oneshot_single_thread_try_recv_closed,
        oneshot_single_thread_try_recv_closed_with_data,
        oneshot_single_thread_peek_data,
        oneshot_single_thread_peek_close,
        oneshot_single_thread_peek_open,
        oneshot_multi_task_recv_then_send,
        oneshot_multi_task_recv_then_close,
        oneshot_multi_task_recv_then_close_panics,
        oneshot_multi_thread_close_stress,
        oneshot_multi_thread_send_close_stress,
        oneshot_multi_thread_recv_close_stress,
        oneshot_multi_thread_send_recv_stress,
        stream_send_recv_stress,
        recv_a_lot,
        shared_chan_stress,
        test_nested_recv_iter,
        test_recv_iter_break,
        try_recv_states,
        destroy_upgraded_shared_port_when_sender_still_active,
        send1,
        send2,
        send3,
        send4,
        try_send1,
        try_send2,
        try_send3,
        issue_15761,
        drop_unreceived,
    );
}

// ---------------------------------------------------------------------------
// The old mpsc `select!` tests (crossbeam mpsc.rs `select_tests`, from
// std's `sync/mpsc/select.rs`): receive arms only.

mod select_tests {
    use super::*;

    fn channel<T>() -> (Sender<T>, Receiver<T>) {
        unbounded()
    }

    fn sync_channel<T>(bound: usize) -> (Sender<T>, Receiver<T>) {
        bounded(bound)
    }

    fn smoke() {
        let (tx1, rx1) = channel::<i32>();
        let (tx2, rx2) = channel::<i32>();
        tx1.send(1).unwrap();
        select! {
            recv(rx1) -> got => assert_eq!(got.unwrap(), 1),
            recv(rx2) -> _bar => panic!(),
        }
        tx2.send(2).unwrap();
        select! {
            recv(rx1) -> _foo => panic!(),
            recv(rx2) -> bar => assert_eq!(bar.unwrap(), 2),
        }
        drop(tx1);
        select! {
            recv(rx1) -> got => assert!(got.is_err()),
            recv(rx2) -> _bar => panic!(),
        }
        drop(tx2);
        select! {
            recv(rx2) -> bar => assert!(bar.is_err()),
        }
    }

    fn smoke2() {
        let (_tx1, rx1) = channel::<i32>();
        let (_tx2, rx2) = channel::<i32>();
        let (_tx3, rx3) = channel::<i32>();
        let (_tx4, rx4) = channel::<i32>();
        let (tx5, rx5) = channel::<i32>();
        tx5.send(4).unwrap();
        select! {
            recv(rx1) -> _foo => panic!("1"),
            recv(rx2) -> _foo => panic!("2"),
            recv(rx3) -> _foo => panic!("3"),
            recv(rx4) -> _foo => panic!("4"),
            recv(rx5) -> got => assert_eq!(got.unwrap(), 4),
        }
    }

    fn closed() {
        let (_tx1, rx1) = channel::<i32>();
        let (tx2, rx2) = channel::<i32>();
        drop(tx2);
        select! {
            recv(rx1) -> _a1 => panic!(),
            recv(rx2) -> a2 => assert!(a2.is_err()),
        }
    }

    fn unblocks() {
        let (tx1, rx1) = channel::<i32>();
        let (_tx2, rx2) = channel::<i32>();
        let (tx3, rx3) = channel::<i32>();
        let t = go(move || {
            for _ in 0..20 {
                relax();
            }
            tx1.send(1).unwrap();
            rx3.recv().unwrap();
            for _ in 0..20 {
                relax();
            }
        });
        select! {
            recv(rx1) -> a => assert_eq!(a.unwrap(), 1),
            recv(rx2) -> _b => panic!(),
        }
        tx3.send(1).unwrap();
        select! {
            recv(rx1) -> a => assert!(a.is_err()),
            recv(rx2) -> _b => panic!(),
        }
        t.join();
    }

    fn both_ready() {
        let (tx1, rx1) = channel::<i32>();
        let (tx2, rx2) = channel::<i32>();
        let (tx3, rx3) = channel::<()>();
        let t = go(move || {
            for _ in 0..20 {
                relax();
            }
            tx1.send(1).unwrap();
            tx2.send(2).unwrap();
            rx3.recv().unwrap();
        });
        for _ in 0..2 {
            select! {
                recv(rx1) -> a => assert_eq!(a.unwrap(), 1),
                recv(rx2) -> a => assert_eq!(a.unwrap(), 2),
            }
        }
        assert_eq!(rx1.try_recv(), Err(TryRecvError::Empty));
        assert_eq!(rx2.try_recv(), Err(TryRecvError::Empty));
        tx3.send(()).unwrap();
        t.join();
    }

    fn stress() {
        const AMT: i32 = 2000;
        let (tx1, rx1) = channel::<i32>();
        let (tx2, rx2) = channel::<i32>();
        let (tx3, rx3) = channel::<()>();
        let t = go(move || {
            for i in 0..AMT {
                if i % 2 == 0 {
                    tx1.send(i).unwrap();
                } else {
                    tx2.send(i).unwrap();
                }
                rx3.recv().unwrap();
            }
        });
        for i in 0..AMT {
            select! {
                recv(rx1) -> i1 => assert!(i % 2 == 0 && i == i1.unwrap()),
                recv(rx2) -> i2 => assert!(i % 2 == 1 && i == i2.unwrap()),
            }
            tx3.send(()).unwrap();
        }
        t.join();
    }

    fn cloning() {
        let (tx1, rx1) = channel::<i32>();
        let (_tx2, rx2) = channel::<i32>();
        let (tx3, rx3) = channel::<()>();
        let t = go(move || {
            rx3.recv().unwrap();
            drop(tx1.clone());
            assert_eq!(rx3.try_recv(), Err(TryRecvError::Empty));
            tx1.send(2).unwrap();
            rx3.recv().unwrap();
        });
        tx3.send(()).unwrap();
        select! {
            recv(rx1) -> i1 => assert_eq!(i1, Ok(2)),
            recv(rx2) -> _i2 => panic!(),
        }
        tx3.send(()).unwrap();
        t.join();
    }

    // Upstream's `cloning2` repeats `cloning` word for word.
    fn cloning2() {
        cloning()
    }

    fn cloning3() {
        let (tx1, rx1) = channel::<()>();
        let (tx2, rx2) = channel::<()>();
        let (tx3, rx3) = channel::<()>();
        let t = go(move || {
            select! {
                recv(rx1) -> _ => panic!(),
                recv(rx2) -> _ => {}
            }
            tx3.send(()).unwrap();
        });
        for _ in 0..1000 {
            relax();
        }
        drop(tx1.clone());
        tx2.send(()).unwrap();
        rx3.recv().unwrap();
        t.join();
    }

    fn preflight1() {
        let (tx, rx) = channel();
        tx.send(()).unwrap();
        select! {
            recv(rx) -> n => assert_eq!(n, Ok(())),
        }
    }

    fn preflight2() {
        let (tx, rx) = channel();
        tx.send(()).unwrap();
        tx.send(()).unwrap();
        select! {
            recv(rx) -> n => assert_eq!(n, Ok(())),
        }
        assert_eq!(rx.try_recv(), Ok(()));
    }

    fn preflight3() {
        let (tx, rx) = channel();
        drop(tx.clone());
        tx.send(()).unwrap();
        select! {
            recv(rx) -> n => assert_eq!(n, Ok(())),
        }
    }

    // preflight4..6: 1..3 with a `_` pattern (the value is dropped).
    fn preflight4() {
        let (tx, rx) = channel();
        tx.send(()).unwrap();
        select! {
            recv(rx) -> _ => {}
        }
        assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    }

    fn preflight5() {
        let (tx, rx) = channel();
        tx.send(()).unwrap();
        tx.send(()).unwrap();
        select! {
            recv(rx) -> _ => {}
        }
        assert_eq!(rx.len(), 1);
    }

    fn preflight6() {
        let (tx, rx) = channel();
        drop(tx.clone());
        tx.send(()).unwrap();
        select! {
            recv(rx) -> _ => {}
        }
        assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    }

    fn preflight7() {
        let (tx, rx) = channel::<()>();
        drop(tx);
        select! {
            recv(rx) -> n => assert_eq!(n, Err(RecvError)),
        }
    }

    fn preflight8() {
        let (tx, rx) = channel();
        tx.send(()).unwrap();
        drop(tx);
        rx.recv().unwrap();
        select! {
            recv(rx) -> n => assert_eq!(n, Err(RecvError)),
        }
    }

    fn preflight9() {
        let (tx, rx) = channel();
        drop(tx.clone());
        tx.send(()).unwrap();
        drop(tx);
        rx.recv().unwrap();
        select! {
            recv(rx) -> n => assert_eq!(n, Err(RecvError)),
        }
    }

    fn oneshot_data_waiting() {
        let (tx1, rx1) = channel();
        let (tx2, rx2) = channel();
        let t = go(move || {
            select! {
                recv(rx1) -> n => assert_eq!(n, Ok(())),
            }
            tx2.send(()).unwrap();
        });
        for _ in 0..100 {
            relax();
        }
        tx1.send(()).unwrap();
        rx2.recv().unwrap();
        t.join();
    }

    fn stream_data_waiting() {
        let (tx1, rx1) = channel();
        let (tx2, rx2) = channel();
        tx1.send(()).unwrap();
        tx1.send(()).unwrap();
        rx1.recv().unwrap();
        rx1.recv().unwrap();
        let t = go(move || {
            select! {
                recv(rx1) -> n => assert_eq!(n, Ok(())),
            }
            tx2.send(()).unwrap();
        });
        for _ in 0..100 {
            relax();
        }
        tx1.send(()).unwrap();
        rx2.recv().unwrap();
        t.join();
    }

    fn shared_data_waiting() {
        let (tx1, rx1) = channel();
        let (tx2, rx2) = channel();
        drop(tx1.clone());
        tx1.send(()).unwrap();
        rx1.recv().unwrap();
        let t = go(move || {
            select! {
                recv(rx1) -> n => assert_eq!(n, Ok(())),
            }
            tx2.send(()).unwrap();
        });
        for _ in 0..100 {
            relax();
        }
        tx1.send(()).unwrap();
        rx2.recv().unwrap();
        t.join();
    }

    fn sync1() {
        let (tx, rx) = sync_channel::<i32>(1);
        tx.send(1).unwrap();
        select! {
            recv(rx) -> n => assert_eq!(n.unwrap(), 1),
        }
    }

    fn sync2() {
        let (tx, rx) = sync_channel::<i32>(0);
        let t = go(move || {
            for _ in 0..100 {
                relax();
            }
            tx.send(1).unwrap();
        });
        select! {
            recv(rx) -> n => assert_eq!(n.unwrap(), 1),
        }
        t.join();
    }

    fn sync3() {
        let (tx1, rx1) = sync_channel::<i32>(0);
        let (tx2, rx2) = channel::<i32>();
        let t = go(move || tx1.send(1).unwrap());
        let t2 = go(move || tx2.send(2).unwrap());
        select! {
            recv(rx1) -> n => {
                assert_eq!(n.unwrap(), 1);
                assert_eq!(rx2.recv().unwrap(), 2);
            },
            recv(rx2) -> n => {
                assert_eq!(n.unwrap(), 2);
                assert_eq!(rx1.recv().unwrap(), 1);
            },
        }
        t.join();
        t2.join();
    }

    port!(
        smoke,
        smoke2,
        closed,
        unblocks,
        both_ready,
        stress,
        cloning,
        cloning2,
        cloning3,
        preflight1,
        preflight2,
        preflight3,
        preflight4,
        preflight5,
        preflight6,
        preflight7,
        preflight8,
        preflight9,
        oneshot_data_waiting,
        stream_data_waiting,
        shared_data_waiting,
        sync1,
        sync2,
        sync3,
    );
}

// ---------------------------------------------------------------------------
// The rules above, pushed further on every flavor. Each test names the
// upstream rule it checks.

mod edges {
    use super::*;

    /// The flavors: rendezvous, a ring of one and of four, unbounded.
    fn flavors<T>() -> Vec<(&'static str, fn() -> (Sender<T>, Receiver<T>))> {
        vec![
            ("bounded(0)", || bounded(0)),
            ("bounded(1)", || bounded(1)),
            ("bounded(4)", || bounded(4)),
            ("unbounded", unbounded),
        ]
    }

    /// Huge timeouts: past the end of `Instant`, and ones that fit in an
    /// `Instant` but not in a timer's arithmetic.
    fn huge_timeouts() -> Vec<Duration> {
        vec![
            longest_representable_timeout(),
            longest_representable_timeout() - ms(1),
            Duration::MAX,
            Duration::from_secs(u64::MAX),
            Duration::from_nanos(u64::MAX),
            Duration::from_secs(1 << 40),
            Duration::from_secs(i64::MAX as u64 / 2),
            Duration::from_secs(100 * 365 * 24 * 3600),
        ]
    }

    /// About the longest timeout `Instant::now()` can still add (a
    /// deadline at the very end of `Instant`'s range).
    fn longest_representable_timeout() -> Duration {
        let now = Instant::now();
        let (mut lo, mut hi) = (0u128, Duration::MAX.as_nanos());
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            let d = Duration::new((mid / 1_000_000_000) as u64, (mid % 1_000_000_000) as u32);
            if now.checked_add(d).is_some() {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        // Leave a second, so the instant is still representable by the time
        // the receive adds it.
        Duration::new((lo / 1_000_000_000) as u64, (lo % 1_000_000_000) as u32) - Duration::from_secs(1)
    }

    // std `Receiver::recv`: "If the corresponding Sender has disconnected,
    // or it disconnects while this call is blocking, this call will wake up
    // and return Err"; `recv_timeout`: likewise `Disconnected`. Receivers
    // of every kind (recv, recv_timeout short and `Duration::MAX`, iter)
    // parked on one channel all wake when the last of several senders
    // goes, not before.
    fn last_sender_drop_wakes_every_parked_receiver() {
        for (name, make) in flavors::<u32>() {
            let (tx, rx) = make();
            let tx2 = tx.clone();
            let r1 = rx.clone();
            let r2 = rx.clone();
            let r3 = rx.clone();
            let r4 = rx.clone();
            let ps = vec![
                go(move || format!("{:?}", r1.recv().map_err(|_| RecvTimeoutError::Disconnected))),
                go(move || format!("{:?}", r2.recv_timeout(Duration::MAX))),
                go(move || format!("{:?}", r3.recv_timeout(Duration::from_secs(3600)))),
                go(move || format!("{:?}", r4.iter().count())),
            ];
            until_parked(&tx, 4, 0);
            drop(tx2);
            sleep(ms(20));
            assert_eq!(tx.waiting(), (4, 0), "{name}: a receiver woke while a sender was alive");
            drop(tx);
            let outs: Vec<String> = ps.into_iter().map(Peer::join).collect();
            assert_eq!(
                outs,
                ["Err(Disconnected)", "Err(Disconnected)", "Err(Disconnected)", "0"],
                "{name}"
            );
            assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected), "{name}");
        }
    }

    // std `SyncSender::send`: "it may return Err if the Receiver has
    // disconnected" (`send4`: while blocked). Senders of every kind parked
    // on a full channel get their own values back when the last receiver
    // goes; every value (those parked and the one buffered) is dropped
    // exactly once; the buffered one at once (`drop_unreceived`).
    fn last_receiver_drop_fails_every_parked_sender_with_its_value() {
        for (name, make) in flavors::<Counted>() {
            if name == "unbounded" {
                continue; // never full
            }
            let c = counter();
            let (tx, rx) = make();
            let cap = tx.capacity().unwrap();
            for _ in 0..cap {
                tx.send(Counted(c.clone())).unwrap();
            }
            let rx2 = rx.clone();
            let (s1, s2, s3) = (tx.clone(), tx.clone(), tx.clone());
            let (c1, c2, c3) = (c.clone(), c.clone(), c.clone());
            // Each sender hands back the value its send returned (kept
            // alive, so the count below sees only the channel's drops).
            let ps: Vec<Peer<(String, Option<Counted>)>> = vec![
                go(move || match s1.send(Counted(c1)) {
                    Ok(()) => ("sent".to_string(), None),
                    Err(SendError(v)) => ("SendError".to_string(), Some(v)),
                }),
                go(move || match s2.send_timeout(Counted(c2), Duration::MAX) {
                    Ok(()) => ("sent".to_string(), None),
                    Err(e) => (format!("disconnected={}", e.is_disconnected()), Some(e.into_inner())),
                }),
                go(move || match s3.send_timeout(Counted(c3), Duration::from_secs(3600)) {
                    Ok(()) => ("sent".to_string(), None),
                    Err(e) => (format!("disconnected={}", e.is_disconnected()), Some(e.into_inner())),
                }),
            ];
            until_parked(&tx, 0, 3);
            drop(rx2);
            sleep(ms(20));
            assert_eq!(tx.waiting(), (0, 3), "{name}: a sender woke while a receiver was alive");
            assert_eq!(drops(&c), 0, "{name}: values dropped while a receiver was alive");
            drop(rx);
            assert_eq!(drops(&c), cap, "{name}: buffered values outlived the last receiver");
            let (outs, values): (Vec<String>, Vec<Option<Counted>>) = ps.into_iter().map(Peer::join).unzip();
            assert_eq!(outs, ["SendError", "disconnected=true", "disconnected=true"], "{name}");
            assert_eq!(drops(&c), cap, "{name}: the channel dropped a value it gave back");
            drop(values);
            assert_eq!(drops(&c), cap + 3, "{name}: each value dropped exactly once");
            drop(tx);
            assert_eq!(drops(&c), cap + 3, "{name}");
        }
    }

    // The buffered values of a channel are dropped exactly once, whichever
    // side goes last, and with a partial drain (std `drop_full`,
    // `drop_unreceived`; crossbeam list/array `drops`).
    fn buffered_values_are_dropped_exactly_once() {
        for (name, make) in flavors::<Counted>() {
            if name == "bounded(0)" {
                continue; // buffers nothing
            }
            // Senders go first, the receiver drains half, then goes.
            let c = counter();
            let (tx, rx) = make();
            let n = tx.capacity().unwrap_or(4).min(4);
            for _ in 0..n {
                tx.send(Counted(c.clone())).unwrap();
            }
            drop(tx);
            for _ in 0..n / 2 {
                drop(rx.recv().unwrap());
            }
            assert_eq!(drops(&c), n / 2, "{name}");
            drop(rx);
            assert_eq!(drops(&c), n, "{name}: senders first");

            // The receiver goes first, a sender is alive: the values go
            // with the receiver; a later send gets its value back.
            let c = counter();
            let (tx, rx) = make();
            for _ in 0..n {
                tx.send(Counted(c.clone())).unwrap();
            }
            let rx_clone = rx.clone();
            drop(rx);
            assert_eq!(drops(&c), 0, "{name}: a receiver clone is alive");
            drop(rx_clone);
            assert_eq!(drops(&c), n, "{name}: receiver first");
            let back = tx.send(Counted(c.clone())).unwrap_err().into_inner();
            assert_eq!(drops(&c), n, "{name}");
            drop(back);
            match tx.try_send(Counted(c.clone())) {
                Err(TrySendError::Disconnected(v)) => drop(v),
                other => panic!("{name}: try_send after the receivers left: {:?}", other.map_err(|_| ())),
            }
            drop(tx);
            assert_eq!(drops(&c), n + 2, "{name}: each value once");
        }
    }

    // A rendezvous sender parked when the last receiver goes gets its value
    // back (not dropped by the channel), and the channel holds nothing.
    fn rendezvous_parked_value_comes_back_not_dropped() {
        let c = counter();
        let (tx, rx) = bounded::<Counted>(0);
        let tx2 = tx.clone();
        let c1 = c.clone();
        let p = go(move || {
            let v = tx2.send(Counted(c1)).unwrap_err().into_inner();
            // Still alive here: the channel did not drop it.
            (Arc::strong_count(&v.0), v)
        });
        until_parked(&tx, 0, 1);
        drop(rx);
        let (strong, v) = p.join();
        assert!(strong >= 2);
        assert_eq!(drops(&c), 0);
        drop(v);
        assert_eq!(drops(&c), 1);
    }

    // std `TryRecvError::Disconnected`: "the channel is empty and the
    // sending half is disconnected, so data will never be received";
    // buffered values come first (`oneshot_single_thread_try_recv_closed_with_data`);
    // then every kind of receive reports the disconnection, at once, for
    // good, whatever the timeout.
    fn try_recv_after_disconnect_drains_then_reports_it_for_good() {
        for (name, make) in flavors::<u32>() {
            let (tx, rx) = make();
            let cap = tx.capacity().unwrap_or(3).min(3);
            for i in 0..cap as u32 {
                tx.send(i).unwrap();
            }
            drop(tx);
            for i in 0..cap as u32 {
                assert_eq!(rx.try_recv(), Ok(i), "{name}");
            }
            for _ in 0..3 {
                assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected), "{name}");
            }
            let start = Instant::now();
            assert_eq!(rx.recv(), Err(RecvError), "{name}");
            assert_eq!(
                rx.recv_timeout(Duration::ZERO),
                Err(RecvTimeoutError::Disconnected),
                "{name}"
            );
            assert_eq!(
                rx.recv_timeout(Duration::MAX),
                Err(RecvTimeoutError::Disconnected),
                "{name}"
            );
            assert_eq!(
                rx.recv_timeout(Duration::from_secs(1 << 40)),
                Err(RecvTimeoutError::Disconnected),
                "{name}"
            );
            assert_eq!(rx.try_iter().count(), 0, "{name}");
            assert_eq!(rx.iter().count(), 0, "{name}");
            assert!(
                start.elapsed() < Duration::from_secs(1),
                "{name}: a disconnected receive waited"
            );
            assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected), "{name}");
        }
    }

    // The mirror: after the receivers go, every kind of send fails at once
    // with its value, whatever the timeout.
    fn send_after_receivers_gone_fails_at_once_with_the_value() {
        for (name, make) in flavors::<u32>() {
            let (tx, rx) = make();
            drop(rx);
            let start = Instant::now();
            assert_eq!(tx.send(1), Err(SendError(1)), "{name}");
            assert_eq!(tx.try_send(2), Err(TrySendError::Disconnected(2)), "{name}");
            assert_eq!(
                tx.send_timeout(3, Duration::ZERO),
                Err(SendTimeoutError::Disconnected(3)),
                "{name}"
            );
            assert_eq!(
                tx.send_timeout(4, Duration::MAX),
                Err(SendTimeoutError::Disconnected(4)),
                "{name}"
            );
            assert_eq!(
                tx.send_timeout(5, Duration::from_secs(1 << 40)),
                Err(SendTimeoutError::Disconnected(5)),
                "{name}"
            );
            assert!(
                start.elapsed() < Duration::from_secs(1),
                "{name}: a disconnected send waited"
            );
        }
    }

    // std `very_long_recv_timeout_wont_panic`, for every huge timeout and
    // flavor: the wait neither panics nor times out early, and ends with
    // the value sent later.
    fn huge_recv_timeouts_wait_for_the_value() {
        for (name, make) in flavors::<u32>() {
            for (k, t) in huge_timeouts().into_iter().enumerate() {
                let (tx, rx) = make();
                let p = go(move || rx.recv_timeout(t));
                until_parked(&tx, 1, 0);
                sleep(ms(5));
                assert_eq!(tx.send(k as u32), Ok(()), "{name} {t:?}");
                assert_eq!(p.join(), Ok(k as u32), "{name} {t:?}");
            }
        }
    }

    // The same for `recv_deadline` far in the future (a deadline that
    // `Instant` can hold).
    fn far_recv_deadline_waits_for_the_value() {
        for (name, make) in flavors::<u32>() {
            for t in [
                longest_representable_timeout(),
                Duration::from_secs(1 << 40),
                Duration::from_secs(100 * 365 * 24 * 3600),
            ] {
                let Some(deadline) = Instant::now().checked_add(t) else {
                    continue;
                };
                let (tx, rx) = make();
                let p = go(move || rx.recv_deadline(deadline));
                until_parked(&tx, 1, 0);
                tx.send(7).unwrap();
                assert_eq!(p.join(), Ok(7), "{name} {t:?}");
            }
        }
    }

    // A huge-timeout receive is woken by the disconnection too.
    fn huge_recv_timeouts_see_the_disconnection() {
        for (name, make) in flavors::<u32>() {
            for t in huge_timeouts() {
                let (tx, rx) = make();
                let p = go(move || rx.recv_timeout(t));
                until_parked(&tx, 1, 0);
                drop(tx);
                assert_eq!(p.join(), Err(RecvTimeoutError::Disconnected), "{name} {t:?}");
            }
        }
    }

    // `SyncSender::send_timeout` / crossbeam `send_timeout` with huge
    // timeouts on a full channel: waits for room (no early timeout, no
    // panic), or for the disconnection.
    fn huge_send_timeouts_wait_for_room_or_the_disconnection() {
        for (name, make) in flavors::<u32>() {
            if name == "unbounded" {
                continue;
            }
            for t in huge_timeouts() {
                let (tx, rx) = make();
                let cap = tx.capacity().unwrap();
                for i in 0..cap as u32 {
                    tx.send(i).unwrap();
                }
                let tx2 = tx.clone();
                let p = go(move || tx2.send_timeout(99, t));
                until_parked(&tx, 0, 1);
                sleep(ms(5));
                for i in 0..cap as u32 {
                    assert_eq!(rx.recv(), Ok(i), "{name}");
                }
                assert_eq!(rx.recv(), Ok(99), "{name} {t:?}");
                assert_eq!(p.join(), Ok(()), "{name} {t:?}");

                let tx2 = tx.clone();
                for i in 0..cap as u32 {
                    tx.send(i).unwrap();
                }
                let p = go(move || tx2.send_timeout(98, t));
                until_parked(&tx, 0, 1);
                drop(rx);
                assert_eq!(p.join(), Err(SendTimeoutError::Disconnected(98)), "{name} {t:?}");
            }
        }
    }

    // A select parked on several channels wakes when the last sender of
    // one of them goes, and reports that arm disconnected (crossbeam
    // select: a receive on a disconnected channel is ready and fails);
    // `Select::ready` likewise reports the disconnected operation.
    fn a_parked_select_wakes_on_a_disconnection() {
        for (name, make) in flavors::<u32>() {
            let (tx1, rx1) = make();
            let (tx2, rx2) = make();
            let probe = tx2.clone();
            let p = go(move || {
                let r = select! {
                    recv(rx1) -> v => (1, v),
                    recv(rx2) -> v => (2, v),
                    default(Duration::MAX) => (0, Err(RecvError)),
                };
                drop(rx1);
                r
            });
            until_parked(&probe, 1, 0);
            drop(probe);
            drop(tx2);
            assert_eq!(p.join(), (2, Err(RecvError)), "{name}");
            drop(tx1);

            let (tx1, rx1) = make();
            let (tx2, rx2) = make();
            let probe = tx1.clone();
            let p = go(move || {
                let mut sel = Select::new();
                sel.recv(&rx1);
                sel.recv(&rx2);
                let i = sel.ready();
                (i, rx1.try_recv())
            });
            until_parked(&probe, 1, 0);
            drop(probe);
            drop(tx1);
            assert_eq!(p.join(), (0, Err(TryRecvError::Disconnected)), "{name}");
            drop(tx2);
        }
    }

    // std `stress_recv_timeout_two_threads` (sync: 1 ms timeouts on a
    // rendezvous channel), pushed: both sides time out all the time, with
    // timeouts of 0 to 200 us; a send is `Ok` exactly when its value is
    // received, once, in order per sender.
    fn timed_out_operations_lose_and_duplicate_nothing() {
        for (name, make) in flavors::<(u32, u32)>() {
            let (tx, rx) = make();
            let senders: Vec<_> = (0..2u32)
                .map(|s| {
                    let tx = tx.clone();
                    go(move || {
                        let mut ok = Vec::new();
                        for i in 0..300u32 {
                            let t = Duration::from_micros(((i * 37 + s * 11) % 200) as u64);
                            match tx.send_timeout((s, i), t) {
                                Ok(()) => ok.push(i),
                                Err(SendTimeoutError::Timeout(v)) => assert_eq!(v, (s, i)),
                                Err(e) => panic!("{e:?}"),
                            }
                        }
                        ok
                    })
                })
                .collect();
            drop(tx);
            let receivers: Vec<_> = (0..2u32)
                .map(|r| {
                    let rx = rx.clone();
                    go(move || {
                        let mut got = Vec::new();
                        let mut k = r;
                        loop {
                            k = k.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                            match rx.recv_timeout(Duration::from_micros((k % 200) as u64)) {
                                Ok(v) => got.push(v),
                                Err(RecvTimeoutError::Timeout) => {}
                                Err(RecvTimeoutError::Disconnected) => return got,
                            }
                        }
                    })
                })
                .collect();
            drop(rx);
            let sent: Vec<Vec<u32>> = senders.into_iter().map(Peer::join).collect();
            let got: Vec<Vec<(u32, u32)>> = receivers.into_iter().map(Peer::join).collect();
            for (s, sent) in sent.iter().enumerate() {
                let mut mine: Vec<u32> = got.iter().flatten().filter(|v| v.0 == s as u32).map(|v| v.1).collect();
                // Per receiver the values of one sender come in order.
                for g in &got {
                    let seq: Vec<u32> = g.iter().filter(|v| v.0 == s as u32).map(|v| v.1).collect();
                    assert!(seq.windows(2).all(|w| w[0] < w[1]), "{name}: out of order");
                }
                mine.sort();
                assert_eq!(&mine, sent, "{name}: sender {s}: received set != sent-Ok set");
            }
        }
    }

    // The other end of the range: a zero timeout is a try, and a try on a
    // rendezvous channel meets a parked peer (crossbeam zero.rs
    // `try_recv` / `try_send`; std `recv_timeout` "waits at most").
    fn zero_timeouts_meet_a_parked_peer() {
        let (tx, rx) = bounded::<u32>(0);
        let tx2 = tx.clone();
        let p = go(move || tx2.send(1));
        until_parked(&tx, 0, 1);
        assert_eq!(rx.recv_timeout(Duration::ZERO), Ok(1));
        assert_eq!(p.join(), Ok(()));
        assert_eq!(rx.recv_timeout(Duration::ZERO), Err(RecvTimeoutError::Timeout));

        let rx2 = rx.clone();
        let p = go(move || rx2.recv());
        until_parked(&tx, 1, 0);
        assert_eq!(tx.send_timeout(2, Duration::ZERO), Ok(()));
        assert_eq!(p.join(), Ok(2));
        assert_eq!(tx.send_timeout(3, Duration::ZERO), Err(SendTimeoutError::Timeout(3)));
    }

    // A select waiting with a huge timeout: `select!` `default(t)`,
    // `Select::select_timeout`, `ready_timeout`.
    fn huge_select_timeouts_wait_for_the_value() {
        for t in huge_timeouts() {
            let (tx, rx) = unbounded::<u32>();
            let (_tx2, rx2) = unbounded::<u32>();
            let tx_ = tx.clone();
            let p = go(move || {
                select! {
                    recv(rx) -> v => v.map_err(|_| "disconnected"),
                    recv(rx2) -> _ => Err("other arm"),
                    default(t) => Err("timed out"),
                }
            });
            until_parked(&tx, 1, 0);
            tx_.send(1).unwrap();
            assert_eq!(p.join(), Ok(1), "select! default({t:?})");

            let (tx, rx) = bounded::<u32>(0);
            let tx_ = tx.clone();
            let p = go(move || {
                let mut sel = Select::new();
                sel.recv(&rx);
                let res = match sel.select_timeout(t) {
                    Ok(op) => op.recv(&rx).map_err(|_| "disconnected"),
                    Err(_) => Err("timed out"),
                };
                res
            });
            until_parked(&tx, 1, 0);
            tx_.send(2).unwrap();
            assert_eq!(p.join(), Ok(2), "select_timeout({t:?})");

            let (tx, rx) = bounded::<u32>(1);
            let tx_ = tx.clone();
            let p = go(move || {
                let mut sel = Select::new();
                sel.recv(&rx);
                let ready = sel.ready_timeout(t).map_err(|_| "timed out");
                (ready, rx.try_recv())
            });
            until_parked(&tx, 1, 0);
            tx_.send(3).unwrap();
            assert_eq!(p.join(), (Ok(0), Ok(3)), "ready_timeout({t:?})");
        }
    }

    // std `Iter`: "will return None when the channel has hung up", after
    // every value; `try_iter`: the pending values, never blocking;
    // `into_iter` owns the receiver. On every flavor, with the producer a
    // concurrent peer.
    fn iterators_on_every_flavor() {
        for (name, make) in flavors::<u32>() {
            // iter: everything, in order, then None for good.
            let (tx, rx) = make();
            let p = go(move || {
                for i in 0..50 {
                    tx.send(i).unwrap();
                }
            });
            let mut it = rx.iter();
            let got: Vec<u32> = it.by_ref().collect();
            assert_eq!(got, (0..50).collect::<Vec<_>>(), "{name}");
            assert_eq!(it.next(), None, "{name}");
            p.join();

            // into_iter: the same, owning the receiver.
            let (tx, rx) = make();
            let p = go(move || {
                for i in 0..50 {
                    tx.send(i).unwrap();
                }
            });
            let got: Vec<u32> = rx.into_iter().collect();
            assert_eq!(got, (0..50).collect::<Vec<_>>(), "{name}");
            p.join();

            // try_iter: nothing pending, an open channel: None at once.
            let (tx, rx) = make();
            let start = Instant::now();
            assert_eq!(rx.try_iter().next(), None, "{name}");
            assert!(start.elapsed() < Duration::from_secs(1), "{name}");
            // Pending values, then None while the channel stays open.
            let cap = tx.capacity().unwrap_or(3).min(3) as u32;
            for i in 0..cap {
                tx.send(i).unwrap();
            }
            assert_eq!(
                rx.try_iter().collect::<Vec<_>>(),
                (0..cap).collect::<Vec<_>>(),
                "{name}"
            );
            // A rendezvous try_iter takes a parked sender's value.
            if cap == 0 {
                let tx2 = tx.clone();
                let p = go(move || tx2.send(9).unwrap());
                until_parked(&tx, 0, 1);
                assert_eq!(rx.try_iter().collect::<Vec<_>>(), [9], "{name}");
                p.join();
            }
            drop(tx);
            assert_eq!(rx.try_iter().next(), None, "{name}");
        }
    }

    // std `test_recv_iter_break`, pushed: an iterator dropped mid-way
    // leaves the rest for the next receive; a `for` over `&rx` resumes.
    fn an_abandoned_iterator_leaves_the_rest() {
        for (name, make) in flavors::<u32>() {
            let (tx, rx) = make();
            let p = go(move || {
                for i in 0..10 {
                    tx.send(i).unwrap();
                }
            });
            let first: Vec<u32> = rx.iter().take(4).collect();
            assert_eq!(first, [0, 1, 2, 3], "{name}");
            let mut rest = Vec::new();
            for v in &rx {
                rest.push(v);
            }
            assert_eq!(rest, (4..10).collect::<Vec<_>>(), "{name}");
            p.join();
        }
    }

    // std `stress_shared` / `shared_chan_stress`, pushed: many senders,
    // each value received exactly once and each sender's values in its
    // order; the receiver's iterator ends when the last sender goes.
    fn many_senders_every_value_once_in_sender_order() {
        const SENDERS: u32 = 32;
        const EACH: u32 = 64;
        for (name, make) in flavors::<(u32, u32)>() {
            let (tx, rx) = make();
            let ps: Vec<_> = (0..SENDERS)
                .map(|s| {
                    let tx = tx.clone();
                    go(move || {
                        for i in 0..EACH {
                            tx.send((s, i)).unwrap();
                        }
                    })
                })
                .collect();
            drop(tx);
            let mut next = vec![0u32; SENDERS as usize];
            let mut total = 0;
            for (s, i) in rx.iter() {
                assert_eq!(i, next[s as usize], "{name}: sender {s} out of order");
                next[s as usize] += 1;
                total += 1;
            }
            assert_eq!(total, SENDERS * EACH, "{name}");
            assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected), "{name}");
            for p in ps {
                p.join();
            }
        }
    }

    // Many senders racing the last receiver's drop: every send that
    // returned `Ok` was received or dropped with the channel, every other
    // value came back; nothing is dropped twice or leaked.
    fn many_senders_racing_the_receiver_drop_lose_nothing() {
        for (name, make) in flavors::<Counted>() {
            let c = counter();
            let (tx, rx) = make();
            let ps: Vec<_> = (0..16)
                .map(|_| {
                    let tx = tx.clone();
                    let c = c.clone();
                    go(move || {
                        let (mut ok, mut back) = (0usize, 0usize);
                        for _ in 0..50 {
                            match tx.send_timeout(Counted(c.clone()), Duration::MAX) {
                                Ok(()) => ok += 1,
                                Err(e) => {
                                    assert!(e.is_disconnected());
                                    drop(e.into_inner());
                                    back += 1;
                                }
                            }
                        }
                        (ok, back)
                    })
                })
                .collect();
            drop(tx);
            let mut received = 0;
            for _ in 0..200 {
                match rx.recv() {
                    Ok(v) => {
                        drop(v);
                        received += 1;
                    }
                    Err(_) => break,
                }
            }
            drop(rx);
            let (mut ok, mut back) = (0, 0);
            for p in ps {
                let (o, b) = p.join();
                ok += o;
                back += b;
            }
            assert_eq!(ok + back, 16 * 50, "{name}");
            assert!(received <= ok, "{name}");
            assert_eq!(drops(&c), 16 * 50, "{name}: every value dropped exactly once");
        }
    }

    // oneshot family, every flavor: a single value crosses once, and the
    // second send after the receiver has gone fails (std `issue_32114`).
    fn oneshot_on_every_flavor() {
        for (name, make) in flavors::<u32>() {
            for _ in 0..STRESS {
                let (tx, rx) = make();
                let p = go(move || rx.recv());
                assert_eq!(tx.send(5), Ok(()), "{name}");
                assert_eq!(p.join(), Ok(5), "{name}");
                assert_eq!(tx.send(6), Err(SendError(6)), "{name}");
            }
            for _ in 0..STRESS {
                let (tx, rx) = make();
                let p = go(move || drop(tx));
                assert_eq!(rx.recv(), Err(RecvError), "{name}");
                p.join();
            }
        }
    }

    /// Run `f` in the other world: on a plain thread when called from a
    /// fiber, as the root fiber of a fresh 1-worker runtime when called
    /// from a thread.
    fn other_world<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        if in_fiber() {
            // Joined without blocking this worker: the thread's work may
            // need the fibers of this runtime.
            let t = std::thread::spawn(f);
            wait_until("the thread finishes", || t.is_finished());
            t.join().unwrap_or_else(|p| resume_unwind(p))
        } else {
            std::thread::spawn(move || rt1().block_on(f))
                .join()
                .unwrap_or_else(|p| resume_unwind(p))
        }
    }

    // The disconnection rules across the two worlds: receivers parked
    // here (fibers, or threads), values sent and the last sender dropped
    // over there (a thread, or a fiber).
    fn last_sender_drop_from_the_other_world_wakes_parked_receivers() {
        for (name, make) in flavors::<u32>() {
            let (tx, rx) = make();
            let ps: Vec<_> = (0..3)
                .map(|_| {
                    let rx = rx.clone();
                    go(move || rx.iter().collect::<Vec<u32>>())
                })
                .collect();
            drop(rx);
            until_parked(&tx, 3, 0);
            other_world(move || {
                for i in 0..30 {
                    tx.send(i).unwrap();
                }
            });
            let mut all: Vec<u32> = ps.into_iter().flat_map(Peer::join).collect();
            all.sort();
            assert_eq!(all, (0..30).collect::<Vec<_>>(), "{name}");
        }
    }

    fn last_receiver_drop_from_the_other_world_fails_parked_senders() {
        for (name, make) in flavors::<u32>() {
            if name == "unbounded" {
                continue;
            }
            let (tx, rx) = make();
            let cap = tx.capacity().unwrap() as u32;
            for i in 0..cap {
                tx.send(i).unwrap();
            }
            let ps: Vec<_> = (0..3)
                .map(|k| {
                    let tx = tx.clone();
                    go(move || tx.send(100 + k))
                })
                .collect();
            until_parked(&tx, 0, 3);
            let got = other_world(move || {
                let got: Vec<u32> = rx.try_iter().take(cap as usize).collect();
                drop(rx);
                got
            });
            assert_eq!(got, (0..cap).collect::<Vec<_>>(), "{name}");
            // A receive that freed a slot may have admitted one parked
            // sender before the drop; every other one gets its value back.
            let outs: Vec<_> = ps.into_iter().map(Peer::join).collect();
            let failed = outs.iter().filter(|r| r.is_err()).count();
            assert!(failed >= 3usize.saturating_sub(cap as usize), "{name}: {outs:?}");
            for (k, r) in outs.iter().enumerate() {
                if let Err(SendError(v)) = r {
                    assert_eq!(*v, 100 + k as u32, "{name}: a sender got another's value back");
                }
            }
            assert_eq!(tx.send(1), Err(SendError(1)), "{name}");
        }
    }

    /// A value holding a sender of the channel it travels in.
    struct Echo {
        tx: Option<Sender<Echo>>,
        drops: Arc<AtomicUsize>,
        /// What a send from this value's destructor returned.
        echoed: Arc<AtomicUsize>,
    }

    impl Drop for Echo {
        fn drop(&mut self) {
            self.drops.fetch_add(1, Ordering::SeqCst);
            if let Some(tx) = self.tx.take() {
                let echo = Echo {
                    tx: None,
                    drops: self.drops.clone(),
                    echoed: self.echoed.clone(),
                };
                match tx.try_send(echo) {
                    Ok(()) => self.echoed.fetch_add(1000, Ordering::SeqCst),
                    Err(TrySendError::Full(_)) => self.echoed.fetch_add(100, Ordering::SeqCst),
                    Err(TrySendError::Disconnected(_)) => self.echoed.fetch_add(1, Ordering::SeqCst),
                };
                // `tx` (maybe the channel's last sender) drops here.
            }
        }
    }

    // Buffered values dropped by the last receiver run user destructors
    // that use the channel itself: one sends on it (the receivers are
    // gone: `Disconnected`), and drops the channel's last sender. Each
    // value is dropped exactly once and nothing deadlocks (crossbeam and
    // std drop them outside any lock).
    fn buffered_values_whose_drop_uses_the_channel() {
        for (name, make) in flavors::<Echo>() {
            if name == "bounded(0)" {
                continue;
            }
            let (drops_, echoed) = (counter(), counter());
            let (tx, rx) = make();
            let n = tx.capacity().unwrap_or(3).min(3);
            for _ in 0..n {
                let e = Echo {
                    tx: Some(tx.clone()),
                    drops: drops_.clone(),
                    echoed: echoed.clone(),
                };
                tx.send(e).unwrap();
            }
            drop(tx); // the only senders left are inside the buffer
            assert_eq!(rx.len(), n, "{name}");
            drop(rx);
            assert_eq!(drops(&drops_), 2 * n, "{name}: values and their echoes, each once");
            assert_eq!(drops(&echoed), n, "{name}: each echo found the channel disconnected");
        }
    }

    // A channel of receivers: dropping the outer channel's last receiver
    // drops the inner receivers it held, and with them the inner values.
    fn nested_channels_drop_their_values_once() {
        for (name, make) in flavors::<Receiver<Counted>>() {
            if name == "bounded(0)" {
                continue;
            }
            let c = counter();
            let (otx, orx) = make();
            let n = otx.capacity().unwrap_or(3).min(3);
            for _ in 0..n {
                let (itx, irx) = unbounded();
                itx.send(Counted(c.clone())).unwrap();
                itx.send(Counted(c.clone())).unwrap();
                otx.send(irx).unwrap();
            }
            drop(orx);
            assert_eq!(drops(&c), 2 * n, "{name}");
            drop(otx);
            assert_eq!(drops(&c), 2 * n, "{name}");
        }
    }

    port!(
        last_sender_drop_wakes_every_parked_receiver,
        last_receiver_drop_fails_every_parked_sender_with_its_value,
        buffered_values_are_dropped_exactly_once,
        rendezvous_parked_value_comes_back_not_dropped,
        try_recv_after_disconnect_drains_then_reports_it_for_good,
        send_after_receivers_gone_fails_at_once_with_the_value,
        huge_recv_timeouts_wait_for_the_value,
        far_recv_deadline_waits_for_the_value,
        huge_recv_timeouts_see_the_disconnection,
        huge_send_timeouts_wait_for_room_or_the_disconnection,
        huge_select_timeouts_wait_for_the_value,
        zero_timeouts_meet_a_parked_peer,
        timed_out_operations_lose_and_duplicate_nothing,
        a_parked_select_wakes_on_a_disconnection,
        iterators_on_every_flavor,
        an_abandoned_iterator_leaves_the_rest,
        many_senders_every_value_once_in_sender_order,
        many_senders_racing_the_receiver_drop_lose_nothing,
        oneshot_on_every_flavor,
        last_sender_drop_from_the_other_world_wakes_parked_receivers,
        last_receiver_drop_from_the_other_world_fails_parked_senders,
        buffered_values_whose_drop_uses_the_channel,
        nested_channels_drop_their_values_once,
    );
}
