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
