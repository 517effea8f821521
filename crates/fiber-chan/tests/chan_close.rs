//! Admission and close rules (spec/chan.md, design spec 5.1-5.4), each test
//! named after its rule, each run on threads, the test scheduler and
//! fiber-sched.

mod common;
use common::{everywhere, go};
use fiber_chan::*;
use std::time::Duration;

#[test]
fn send_not_admitted_after_close_fails_and_returns_the_value() {
    everywhere(|| {
        for (tx, _rx) in [bounded::<String>(0), bounded(4), unbounded()] {
            assert!(tx.close());
            assert_eq!(tx.send("v".to_string()), Err(SendError("v".to_string())));
            assert_eq!(
                tx.try_send("w".to_string()),
                Err(TrySendError::Disconnected("w".to_string()))
            );
            assert_eq!(
                tx.send_timeout("x".to_string(), Duration::from_millis(5)),
                Err(SendTimeoutError::Disconnected("x".to_string()))
            );
        }
    });
}

#[test]
fn buffered_values_are_still_delivered_after_close() {
    everywhere(|| {
        let (tx, rx) = bounded(8);
        for i in 0..5 {
            tx.send(i).unwrap();
        }
        rx.close();
        assert!(tx.is_closed() && rx.is_closed());
        assert_eq!(rx.iter().collect::<Vec<_>>(), [0, 1, 2, 3, 4]);
        assert_eq!(rx.recv(), Err(RecvError));
    });
}

#[test]
fn recv_on_closed_empty_channel_fails_at_once_and_never_parks() {
    everywhere(|| {
        for (tx, rx) in [bounded::<u8>(0), bounded(1), unbounded()] {
            tx.close();
            assert_eq!(rx.recv(), Err(RecvError));
            assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));
            assert_eq!(
                rx.recv_timeout(Duration::from_secs(3600)),
                Err(RecvTimeoutError::Disconnected)
            );
        }
    });
}

#[test]
fn close_wakes_every_parked_receiver_exactly_once() {
    everywhere(|| {
        let (tx, rx) = bounded::<u32>(0);
        let receivers: Vec<_> = (0..8)
            .map(|_| {
                let rx = rx.clone();
                go(move || rx.recv())
            })
            .collect();
        common::until(|| tx.waiting().0 == 8);
        let before = tx.wakes_issued();
        tx.close();
        assert_eq!(tx.wakes_issued() - before, 8, "one wake per parked receiver, no more");
        for r in receivers {
            assert_eq!(r.join(), Err(RecvError));
        }
        assert_eq!(tx.wakes_issued() - before, 8);
    });
}

#[test]
fn repeated_close_is_a_noop() {
    everywhere(|| {
        let (tx, rx) = bounded::<u8>(0);
        // Parked senders stay queued across a close (they were admitted),
        // so a second close that re-woke waiters would show up here.
        let senders: Vec<_> = (0..4u8)
            .map(|i| {
                let tx = tx.clone();
                go(move || tx.send(i))
            })
            .collect();
        common::until(|| tx.waiting().1 == 4);
        let before = tx.wakes_issued();
        assert!(rx.close());
        assert!(!rx.close());
        assert!(!tx.close());
        assert_eq!(
            tx.wakes_issued(),
            before,
            "closing wakes no admitted sender, repeated closes nothing"
        );
        assert_eq!(tx.waiting().1, 4, "the admitted senders still wait");
        let mut got: Vec<u8> = rx.iter().collect();
        got.sort();
        assert_eq!(got, [0, 1, 2, 3]);
        for s in senders {
            assert_eq!(s.join(), Ok(()));
        }
        assert_eq!(rx.recv(), Err(RecvError));
    });
}

#[test]
fn sender_admitted_before_close_still_delivers() {
    everywhere(|| {
        let (tx, rx) = bounded(0);
        let sender = {
            let tx = tx.clone();
            go(move || tx.send(42))
        };
        common::until(|| tx.waiting().1 == 1);
        tx.close();
        assert_eq!(rx.recv(), Ok(42), "an admitted sender's value is delivered after close");
        assert_eq!(sender.join(), Ok(()));
        assert_eq!(rx.recv(), Err(RecvError));
    });
}

#[test]
fn last_sender_drop_closes_the_channel() {
    everywhere(|| {
        let (tx, rx) = bounded::<u8>(2);
        let tx2 = tx.clone();
        tx.send(1).unwrap();
        drop(tx);
        assert!(!rx.is_closed());
        drop(tx2);
        assert!(rx.is_closed());
        assert_eq!(rx.recv(), Ok(1));
        assert_eq!(rx.recv(), Err(RecvError));
    });
}

#[test]
fn last_receiver_drop_fails_sends_with_their_values() {
    everywhere(|| {
        let (tx, rx) = bounded::<String>(0);
        let parked = {
            let tx = tx.clone();
            go(move || tx.send("parked".to_string()))
        };
        common::until(|| tx.waiting().1 == 1);
        drop(rx);
        assert_eq!(parked.join(), Err(SendError("parked".to_string())));
        assert_eq!(tx.send("late".to_string()), Err(SendError("late".to_string())));
    });
}

#[test]
fn rendezvous_send_completes_only_when_received() {
    everywhere(|| {
        let (tx, rx) = bounded(0);
        assert_eq!(tx.try_send(1), Err(TrySendError::Full(1)), "no receiver waits");
        let receiver = go(move || rx.recv());
        tx.send(7).unwrap();
        assert_eq!(receiver.join(), Ok(7));
    });
}

#[test]
fn buffered_channel_is_fifo_with_exact_capacity() {
    everywhere(|| {
        let (tx, rx) = bounded(3);
        assert_eq!(
            (tx.capacity(), tx.len(), tx.is_empty(), tx.is_full()),
            (Some(3), 0, true, false)
        );
        for i in 0..3 {
            tx.try_send(i).unwrap();
        }
        assert!(tx.is_full() && rx.is_full());
        assert_eq!(tx.try_send(9), Err(TrySendError::Full(9)));
        assert_eq!(rx.try_iter().collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
        let (utx, urx) = unbounded::<u8>();
        assert_eq!(utx.capacity(), None);
        assert!(!urx.is_full());
    });
}

#[test]
fn timeouts_return_the_value_and_never_fire_early() {
    everywhere(|| {
        let (tx, rx) = bounded::<u8>(0);
        assert_eq!(
            rx.recv_timeout(Duration::from_millis(10)),
            Err(RecvTimeoutError::Timeout)
        );
        assert_eq!(
            tx.send_timeout(5, Duration::from_millis(10)),
            Err(SendTimeoutError::Timeout(5))
        );
        assert_eq!(rx.len(), 0, "a timed-out sender left nothing behind");
    });
}

#[test]
fn errors_print_like_crossbeam_without_needing_debug_values() {
    struct Opaque;
    assert_eq!(format!("{:?}", SendError(Opaque)), "SendError(..)");
    assert_eq!(format!("{:?}", TrySendError::Full(Opaque)), "Full(..)");
    assert_eq!(SendError(1).to_string(), "sending on a disconnected channel");
    assert_eq!(RecvError.to_string(), "receiving on an empty and disconnected channel");
    assert_eq!(TryRecvError::Empty.to_string(), "receiving on an empty channel");
    assert_eq!(
        RecvTimeoutError::Timeout.to_string(),
        "timed out waiting on receive operation"
    );
    assert_eq!(SendTimeoutError::Timeout(1).into_inner(), 1);
    assert!(TrySendError::Disconnected(1).is_disconnected());
    let e: Box<dyn std::error::Error> = Box::new(SendError(1));
    assert!(e.to_string().contains("disconnected"));
}

#[test]
fn a_fiber_and_a_thread_talk_over_one_channel() {
    common::on_schedulers(|| {
        let (tx, rx) = bounded(0);
        let (back_tx, back_rx) = bounded(0);
        let t = common::thread(move || {
            for v in rx.iter() {
                back_tx.send(v * 2).unwrap();
            }
        });
        for i in 0..100 {
            tx.send(i).unwrap();
            assert_eq!(back_rx.recv(), Ok(i * 2));
        }
        drop(tx);
        t.join();
    });
}
