//! Every channel operation is a cancellation point (spec/chan.md section
//! 4): a cancelled send returns its value, a cancelled receive takes
//! nothing, a committed hand-off is seen through, and cancellation never
//! closes the channel. On both schedulers.

mod common;
use common::{on_schedulers, until};
use fiber_chan::*;
use std::time::Duration;

/// The fiber's result, whether or not its join reports the cancellation.
fn outcome<T: Send + 'static>(h: fiber_core::JoinHandle<T>) -> Option<T> {
    match h.join() {
        Ok(v) => Some(v),
        Err(e) => {
            assert!(e.is_cancelled(), "{e}");
            None
        }
    }
}

#[test]
fn cancelled_send_returns_its_value_and_leaves_the_channel_open() {
    on_schedulers(|| {
        let (tx, rx) = bounded::<String>(0);
        let sender = {
            let tx = tx.clone();
            fiber_core::spawn(move || tx.send("v".to_string()))
        };
        until(|| tx.waiting().1 == 1);
        sender.cancel();
        if let Some(result) = outcome(sender) {
            assert_eq!(result, Err(SendError("v".to_string())));
        }
        assert_eq!(tx.waiting(), (0, 0), "the cancelled sender left the queue");
        assert!(!tx.is_closed(), "cancellation never closes the channel");
        assert_eq!(rx.try_recv(), Err(TryRecvError::Empty), "nothing was sent");
        let t = fiber_core::spawn(move || rx.recv());
        tx.send("w".to_string()).unwrap();
        assert_eq!(t.join().unwrap(), Ok("w".to_string()));
    });
}

#[test]
fn cancelled_recv_and_iter_take_nothing() {
    on_schedulers(|| {
        let (tx, rx) = unbounded::<u32>();
        let receiver = {
            let rx = rx.clone();
            fiber_core::spawn(move || rx.iter().count())
        };
        let timed = {
            let rx = rx.clone();
            fiber_core::spawn(move || rx.recv_timeout(Duration::from_secs(3600)))
        };
        until(|| tx.waiting().0 == 2);
        receiver.cancel();
        timed.cancel();
        if let Some(n) = outcome(receiver) {
            assert_eq!(n, 0);
        }
        if let Some(r) = outcome(timed) {
            assert_eq!(r, Err(RecvTimeoutError::Timeout));
        }
        assert!(!rx.is_closed());
        tx.send(5).unwrap();
        assert_eq!(rx.try_recv(), Ok(5), "the value was not taken by a cancelled receiver");
    });
}

#[test]
fn cancelled_select_returns_and_takes_nothing() {
    on_schedulers(|| {
        let (tx, rx) = bounded::<u32>(0);
        let (stx, srx) = bounded::<u32>(0);
        let selector = {
            let (rx, stx) = (rx.clone(), stx.clone());
            fiber_core::spawn(move || {
                let t = tick(Duration::from_secs(3600));
                let mut rounds = 0;
                loop {
                    rounds += 1;
                    select! {
                        recv(t) -> _ => {}
                        recv(rx) -> m => match m {
                            Ok(_) => unreachable!("nothing is sent"),
                            Err(_) => break,
                        },
                        send(stx, 1) -> res => {
                            res.expect_err("no receiver: only a cancellation ends this arm");
                            break;
                        }
                    }
                }
                rounds
            })
        };
        until(|| tx.waiting().0 == 1 && stx.waiting().1 == 1);
        selector.cancel();
        if let Some(rounds) = outcome(selector) {
            assert_eq!(rounds, 1, "the cancelled select ended the loop at once");
        }
        assert_eq!((tx.waiting(), stx.waiting()), ((0, 0), (0, 0)));
        assert!(!tx.is_closed() && !stx.is_closed());
        assert_eq!(srx.try_recv(), Err(TryRecvError::Empty));
        let mut sel = Select::new();
        sel.recv(&rx);
        assert!(sel.try_select().is_err(), "the channel is still open and empty");
    });
}

/// Waiters cancelled at the head, in the middle and at the tail of a wait
/// queue leave it, and the others keep their FIFO order (the queue unlinks
/// any node in place, spec/chan.md "Wait queues").
#[test]
fn cancelled_waiters_anywhere_in_the_queue_leave_the_rest_in_order() {
    on_schedulers(|| {
        let (tx, rx) = bounded::<u32>(0);
        // Receivers park one at a time, so their queue order is known.
        let receivers: Vec<_> = (0..6)
            .map(|i| {
                let rx = rx.clone();
                let h = fiber_core::spawn(move || rx.recv().ok());
                until(|| tx.waiting().0 == i + 1);
                h
            })
            .collect();
        let mut receivers: Vec<_> = receivers.into_iter().map(Some).collect();
        for i in [0, 3, 5] {
            let h = receivers[i].take().unwrap();
            h.cancel();
            assert_eq!(outcome(h).flatten(), None, "a cancelled receiver took nothing");
        }
        assert_eq!(tx.waiting(), (3, 0));
        for v in [10, 11, 12] {
            tx.send(v).unwrap();
        }
        let got: Vec<_> = receivers.into_iter().flatten().map(|h| h.join().unwrap()).collect();
        assert_eq!(
            got,
            [Some(10), Some(11), Some(12)],
            "the survivors were served in queue order"
        );

        let senders: Vec<_> = (0..6u32)
            .map(|v| {
                let sender = tx.clone();
                let h = fiber_core::spawn(move || sender.send(v));
                until(|| tx.waiting().1 == v as usize + 1);
                h
            })
            .collect();
        let mut senders: Vec<_> = senders.into_iter().map(Some).collect();
        for i in [5, 2, 0] {
            let h = senders[i].take().unwrap();
            h.cancel();
            if let Some(result) = outcome(h) {
                assert_eq!(result, Err(SendError(i as u32)), "a cancelled send returns its value");
            }
        }
        assert_eq!(tx.waiting(), (0, 3));
        let got: Vec<_> = (0..3).map(|_| rx.recv().unwrap()).collect();
        assert_eq!(got, [1, 3, 4], "the surviving senders delivered in queue order");
        for h in senders.into_iter().flatten() {
            h.join().unwrap().unwrap();
        }
        assert_eq!(tx.waiting(), (0, 0));
    });
}

/// Two thousand parked receivers cancelled at once all leave the queue.
#[test]
fn many_cancelled_receivers_all_leave_the_queue() {
    on_schedulers(|| {
        let (tx, rx) = bounded::<u32>(0);
        let receivers: Vec<_> = (0..2000)
            .map(|_| {
                let rx = rx.clone();
                fiber_core::spawn(move || rx.recv().is_ok())
            })
            .collect();
        until(|| tx.waiting().0 == 2000);
        for h in &receivers {
            h.cancel();
        }
        for h in receivers {
            assert_ne!(outcome(h), Some(true), "nothing was sent, so no receiver got a value");
        }
        assert_eq!(tx.waiting(), (0, 0));
        assert!(!tx.is_closed());
    });
}
