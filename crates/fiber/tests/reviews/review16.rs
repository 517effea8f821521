//! Review 16: re-entrancy. User code that the runtime calls from inside its
//! own code paths (a message's `Drop` run when a channel discards it, a
//! send arm's value expression, an iterator's loop body, a job's unjoined
//! value, a lock's old value, a fiber-local's initializer and destructor,
//! a tracing layer, a panic hook, a value dropped by a teardown) and that
//! calls back into the same object or runtime.
//!
//! What std, crossbeam-channel, tokio and Go users expect: such a call
//! works, or fails with a clear error or panic; never a self-deadlock on an
//! internal lock, a hang, a double drop or a lost value. Every test checks
//! exact values and drop counts, under a hang guard.

use crate::common::{in_child, ms, rt1, rt2, wait_until, within};
use fiber::chan::{bounded, unbounded, Receiver, SendError, SendTimeoutError, Sender, TrySendError};
use fiber::sync::{Condvar, Mutex, OnceLock, RwLock};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::sync::TryLockError;

/// Run `body` as the root fiber of a fixed two-worker runtime, under a
/// 10 s hang guard.
fn on2(body: impl FnOnce() + Send + 'static) {
    within(10, move || rt2().block_on(body));
}

/// Run `body` as the root fiber of a one-worker runtime, under a 10 s hang
/// guard.
fn on1(body: impl FnOnce() + Send + 'static) {
    within(10, move || rt1().block_on(body));
}

/// A shared counter.
fn counter() -> Arc<AtomicUsize> {
    Arc::new(AtomicUsize::new(0))
}

/// The channel flavours with a buffer: the lock-free ring (bounded, cap >
/// 0) and the locked deque (unbounded).
fn buffered<T>() -> Vec<(&'static str, Sender<T>, Receiver<T>)> {
    let (a, b) = bounded(8);
    let (c, d) = unbounded();
    vec![("bounded(8)", a, b), ("unbounded", c, d)]
}

// ---------------------------------------------------------------------------
// Channels: a message's Drop that calls back into its own channel
// ---------------------------------------------------------------------------

/// A message that, when dropped, sends a plain message on its own channel.
struct Echo {
    tx: Option<Sender<Echo>>,
    drops: Arc<AtomicUsize>,
    refused: Arc<AtomicUsize>,
    accepted: Arc<AtomicUsize>,
}

impl Echo {
    fn plain(drops: &Arc<AtomicUsize>) -> Echo {
        Echo {
            tx: None,
            drops: drops.clone(),
            refused: counter(),
            accepted: counter(),
        }
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        self.drops.fetch_add(1, SeqCst);
        if let Some(tx) = self.tx.take() {
            match tx.send(Echo::plain(&self.drops)) {
                Ok(()) => self.accepted.fetch_add(1, SeqCst),
                Err(SendError(back)) => {
                    drop(back);
                    self.refused.fetch_add(1, SeqCst)
                }
            };
        }
    }
}

/// crossbeam: dropping the last receiver drops the buffered messages; a
/// send from inside such a drop sees the channel disconnected and gets its
/// message back (`SendError`). No self-deadlock on the channel's lock.
#[test]
fn a_discarded_messages_drop_that_sends_on_its_own_channel_gets_it_back() {
    on2(|| {
        for (flavour, tx, rx) in buffered::<Echo>() {
            let (drops, refused, accepted) = (counter(), counter(), counter());
            for _ in 0..3 {
                tx.send(Echo {
                    tx: Some(tx.clone()),
                    drops: drops.clone(),
                    refused: refused.clone(),
                    accepted: accepted.clone(),
                })
                .unwrap();
            }
            drop(rx);
            // 3 messages and the 3 they tried to send, each dropped once.
            assert_eq!(drops.load(SeqCst), 6, "{flavour}");
            assert_eq!(refused.load(SeqCst), 3, "{flavour}");
            assert_eq!(accepted.load(SeqCst), 0, "{flavour}");
            assert!(tx.is_closed(), "{flavour}");
        }
    });
}

/// A sender parked on a full channel whose last receiver goes gets its
/// message back (`SendError`); dropping it there sends from its Drop on
/// the same, now disconnected, channel: refused again, nothing hangs.
#[test]
fn a_parked_senders_returned_message_that_resends_from_its_drop_is_refused() {
    on2(|| {
        let (tx, rx) = bounded::<Echo>(0);
        let (drops, refused, accepted) = (counter(), counter(), counter());
        let sender = {
            let (tx, drops, refused, accepted) = (tx.clone(), drops.clone(), refused.clone(), accepted.clone());
            fiber::spawn(move || {
                let msg = Echo {
                    tx: Some(tx.clone()),
                    drops,
                    refused,
                    accepted,
                };
                // The error holds the message; dropping it runs its Drop.
                tx.send(msg).is_err()
            })
        };
        wait_until("the sender to park", 5, || tx.waiting().1 == 1);
        drop(rx);
        assert!(sender.join().unwrap(), "the parked send fails");
        assert_eq!(drops.load(SeqCst), 2);
        assert_eq!(refused.load(SeqCst), 1);
        assert_eq!(accepted.load(SeqCst), 0);
    });
}

/// A message that holds a sender of its own channel.
struct Holder {
    _tx: Sender<Holder>,
    drops: Arc<AtomicUsize>,
}

impl Drop for Holder {
    fn drop(&mut self) {
        self.drops.fetch_add(1, SeqCst);
    }
}

/// Buffered messages that hold the channel's last senders: dropping the
/// last receiver drops them, and with them the last sender (whose drop
/// closes the same channel from inside its discard). Received one by one,
/// the channel closes exactly when the last of them is dropped.
/// Send three `Holder`s that each hold a clone of `tx`, then drop `tx`:
/// the buffered messages hold the channel's last senders.
fn send_three_holders(tx: Sender<Holder>) -> Arc<AtomicUsize> {
    let drops = counter();
    for _ in 0..3 {
        tx.send(Holder {
            _tx: tx.clone(),
            drops: drops.clone(),
        })
        .unwrap();
    }
    drops
}

#[test]
fn buffered_messages_holding_their_channels_last_sender() {
    on2(|| {
        for (flavour, tx, rx) in buffered::<Holder>() {
            let drops = send_three_holders(tx);
            drop(rx);
            assert_eq!(drops.load(SeqCst), 3, "{flavour}");
        }
        for (flavour, tx, rx) in buffered::<Holder>() {
            let drops = send_three_holders(tx);
            let mut got = 0;
            for msg in rx.iter() {
                got += 1;
                drop(msg);
            }
            assert_eq!(got, 3, "{flavour}");
            assert_eq!(drops.load(SeqCst), 3, "{flavour}");
            assert!(rx.is_closed(), "{flavour}");
            assert!(rx.recv().is_err(), "{flavour}");
        }
    });
}

/// Two channels linked through their buffered messages: A buffers the
/// last receiver of B, B buffers the last sender of A. Dropping A's
/// receiver drops B's receiver (from inside A's discard), which drops A's
/// last sender (from inside B's discard, closing A again): every message
/// once, no hang.
#[test]
fn a_cycle_of_two_channels_through_their_buffered_messages_unwinds_once() {
    enum Link {
        Rx(#[allow(dead_code)] Receiver<Link>, Arc<AtomicUsize>),
        Tx(#[allow(dead_code)] Sender<Link>, Arc<AtomicUsize>),
    }
    impl Drop for Link {
        fn drop(&mut self) {
            match self {
                Link::Rx(_, n) | Link::Tx(_, n) => n.fetch_add(1, SeqCst),
            };
        }
    }
    on2(|| {
        for (fa, fb) in [(true, true), (true, false), (false, true), (false, false)] {
            let make = |ring: bool| if ring { bounded::<Link>(4) } else { unbounded::<Link>() };
            let (tx_a, rx_a) = make(fa);
            let (tx_b, rx_b) = make(fb);
            let drops = counter();
            tx_a.send(Link::Rx(rx_b, drops.clone())).unwrap();
            tx_b.send(Link::Tx(tx_a.clone(), drops.clone())).unwrap();
            drop(tx_a);
            drop(rx_a);
            assert_eq!(drops.load(SeqCst), 2, "ring a {fa}, ring b {fb}");
            assert!(tx_b.send(Link::Tx(bounded(1).0, drops.clone())).is_err());
            assert_eq!(drops.load(SeqCst), 3);
        }
    });
}

/// A discarded message whose Drop parks: it receives from another channel
/// fed by another fiber, and spawns and joins a fiber. The discard goes on
/// message by message, in order, in the dropping fiber.
#[test]
fn a_discarded_messages_drop_may_park_spawn_and_join() {
    struct Waits {
        n: u32,
        feed: Receiver<u32>,
        log: Arc<std::sync::Mutex<Vec<(u32, u32, u32)>>>,
    }
    impl Drop for Waits {
        fn drop(&mut self) {
            let got = self.feed.recv().unwrap();
            let n = self.n;
            let doubled = fiber::spawn(move || n * 2).join().unwrap();
            self.log.lock().unwrap().push((self.n, got, doubled));
        }
    }
    on2(|| {
        for (flavour, tx, rx) in buffered::<Waits>() {
            let (feed_tx, feed_rx) = bounded(0);
            let log = Arc::new(std::sync::Mutex::new(Vec::new()));
            for n in 0..3 {
                tx.send(Waits {
                    n,
                    feed: feed_rx.clone(),
                    log: log.clone(),
                })
                .unwrap();
            }
            let feeder = fiber::spawn(move || {
                for i in 100..103 {
                    feed_tx.send(i).unwrap();
                }
            });
            drop(rx);
            feeder.join().unwrap();
            assert_eq!(
                *log.lock().unwrap(),
                vec![(0, 100, 0), (1, 101, 2), (2, 102, 4)],
                "{flavour}"
            );
            assert!(tx
                .send(Waits {
                    n: 9,
                    feed: {
                        let (t, r) = bounded(1);
                        t.send(0).unwrap();
                        r
                    },
                    log: log.clone(),
                })
                .is_err());
        }
    });
}

/// A message whose Drop closes its own channel, dropped inside a
/// `rx.iter()` loop: the loop still yields every message buffered before
/// the close, then ends; a send after the close fails (Go: a closed
/// channel still delivers its buffer).
#[test]
fn closing_the_channel_from_a_received_messages_drop_inside_iter() {
    struct Closer(u32, Option<Sender<Closer>>);
    impl Drop for Closer {
        fn drop(&mut self) {
            if let Some(tx) = self.1.take() {
                assert!(tx.close(), "the first close");
            }
        }
    }
    on2(|| {
        for (flavour, tx, rx) in buffered::<Closer>() {
            for i in 0..5 {
                let closer = (i == 1).then(|| tx.clone());
                tx.send(Closer(i, closer)).unwrap();
            }
            let mut seen = Vec::new();
            for msg in rx.iter() {
                seen.push(msg.0);
                drop(msg);
            }
            assert_eq!(seen, vec![0, 1, 2, 3, 4], "{flavour}");
            assert!(tx.send(Closer(9, None)).is_err(), "{flavour}");
        }
    });
}

/// An `iter()` loop whose body drops the last sender: the loop drains what
/// is buffered and ends (crossbeam and std mpsc).
#[test]
fn an_iter_loop_whose_body_drops_the_last_sender_drains_and_ends() {
    on2(|| {
        for (flavour, tx, rx) in buffered::<u32>() {
            for i in 0..6 {
                tx.send(i).unwrap();
            }
            let mut tx = Some(tx);
            let mut seen = Vec::new();
            for v in rx.iter() {
                seen.push(v);
                if v == 2 {
                    drop(tx.take());
                }
            }
            assert_eq!(seen, vec![0, 1, 2, 3, 4, 5], "{flavour}");
        }
        // Rendezvous: a sender fiber blocked in its next send when the loop
        // drops the last other sender still hands its value over.
        let (tx, rx) = bounded::<u32>(0);
        let feeder = {
            let tx = tx.clone();
            fiber::spawn(move || {
                for i in 0..4 {
                    tx.send(i).unwrap();
                }
            })
        };
        let mut tx = Some(tx);
        let mut seen = Vec::new();
        for v in rx.iter() {
            seen.push(v);
            drop(tx.take());
        }
        feeder.join().unwrap();
        assert_eq!(seen, vec![0, 1, 2, 3]);
    });
}

/// A `try_iter()` loop whose body sends on the same channel: it sees the
/// values it sends (std mpsc and crossbeam: `try_iter` yields what is
/// there at each step).
#[test]
fn a_try_iter_loop_that_sends_on_its_own_channel_sees_what_it_sends() {
    on2(|| {
        let (a, b) = bounded(1);
        let (c, d) = unbounded();
        for (flavour, tx, rx) in [("bounded(1)", a, b), ("unbounded", c, d)] {
            tx.send(0u32).unwrap();
            let mut seen = Vec::new();
            for v in rx.try_iter() {
                seen.push(v);
                if v < 5 {
                    tx.try_send(v + 1).unwrap();
                }
            }
            assert_eq!(seen, vec![0, 1, 2, 3, 4, 5], "{flavour}");
            assert!(rx.try_recv().is_err(), "{flavour}");
        }
    });
}

// ---------------------------------------------------------------------------
// select!: arm bodies and send values that use the selected channel
// ---------------------------------------------------------------------------

/// A recv arm's body that sends back on the channel it selected, in a
/// `select!` loop with a `default`: every value once, in order.
#[test]
fn a_select_body_that_sends_back_on_the_selected_channel() {
    on2(|| {
        let (a, b) = bounded(1);
        let (c, d) = unbounded();
        for (flavour, tx, rx) in [("bounded(1)", a, b), ("unbounded", c, d)] {
            let (_other_tx, other_rx) = bounded::<u32>(0);
            tx.send(0u32).unwrap();
            let mut seen = Vec::new();
            loop {
                fiber::select! {
                    recv(rx) -> v => {
                        let v = v.unwrap();
                        seen.push(v);
                        if v < 5 {
                            tx.send(v + 1).unwrap();
                        }
                    },
                    recv(other_rx) -> _ => unreachable!(),
                    default => break,
                }
            }
            assert_eq!(seen, vec![0, 1, 2, 3, 4, 5], "{flavour}");
        }
    });
}

/// A send arm's value expression that itself sends on the same rendezvous
/// channel: the one parked receiver is reserved for the select, so the
/// inner `send_timeout` finds none and times out with its value, and the
/// receiver gets the select's value (crossbeam: the arm's operation is
/// committed before its value is evaluated).
#[test]
fn a_send_arms_value_that_sends_on_the_same_rendezvous_channel_times_out() {
    on2(|| {
        let (tx, rx) = bounded::<u32>(0);
        let receiver = fiber::spawn(move || (rx.recv().unwrap(), rx.recv_timeout(ms(100)).ok()));
        wait_until("the receiver to park", 5, || tx.waiting().0 == 1);
        let mut inner = Vec::new();
        let res = fiber::select! {
            send(tx, {
                inner.push(tx.send_timeout(7, ms(30)));
                8
            }) -> r => r,
        };
        assert_eq!(res, Ok(()));
        assert_eq!(inner, vec![Err(SendTimeoutError::Timeout(7))]);
        assert_eq!(receiver.join().unwrap(), (8, None));
    });
}

/// A send arm's value expression that `try_send`s on the same buffered
/// channel: on a bounded(1) channel the reserved slot is the only one, so
/// the inner send is refused as full; on an unbounded one both arrive.
#[test]
fn a_send_arms_value_that_try_sends_on_the_same_buffered_channel() {
    on2(|| {
        let (tx, rx) = bounded::<u32>(1);
        let mut inner = Vec::new();
        let res = fiber::select! {
            send(tx, {
                inner.push(tx.try_send(7));
                8
            }) -> r => r,
        };
        assert_eq!(res, Ok(()));
        assert_eq!(inner, vec![Err(TrySendError::Full(7))]);
        assert_eq!(rx.try_recv(), Ok(8));
        assert!(rx.try_recv().is_err());

        let (tx, rx) = unbounded::<u32>();
        let mut inner = Vec::new();
        let res = fiber::select! {
            send(tx, {
                inner.push(tx.try_send(7));
                8
            }) -> r => r,
        };
        assert_eq!(res, Ok(()));
        assert_eq!(inner, vec![Ok(())]);
        let mut got: Vec<u32> = rx.try_iter().collect();
        got.sort_unstable();
        assert_eq!(got, vec![7, 8]);
    });
}

/// A value that counts its drops.
struct Counted(u32, Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.1.fetch_add(1, SeqCst);
    }
}

/// A send arm's value expression that drops the channel's last receiver:
/// the send either succeeds (and the channel drops the value) or gives it
/// back; either way the value is dropped exactly once, and the channel is
/// disconnected afterwards.
#[test]
fn a_send_arms_value_that_drops_the_last_receiver_drops_the_value_once() {
    on2(|| {
        for (flavour, tx, rx) in buffered::<Counted>() {
            let drops = counter();
            let mut rx = Some(rx);
            let res = fiber::select! {
                send(tx, {
                    drop(rx.take());
                    Counted(5, drops.clone())
                }) -> r => r,
            };
            match res {
                Ok(()) => {}
                Err(SendError(v)) => {
                    assert_eq!(v.0, 5, "{flavour}");
                    assert_eq!(drops.load(SeqCst), 0, "{flavour}: given back, not dropped");
                    drop(v);
                }
            }
            assert!(tx.send(Counted(6, drops.clone())).is_err(), "{flavour}");
            drop(tx);
            assert_eq!(drops.load(SeqCst), 2, "{flavour}: each value once");
        }
    });
}

/// A send arm's value expression that closes the channel: the send was
/// admitted when its slot was reserved, so it is delivered (Go: values
/// sent before the close are received), then the receiver sees the close.
#[test]
fn a_send_arms_value_that_closes_the_channel_is_still_delivered() {
    on2(|| {
        for (flavour, tx, rx) in buffered::<u32>() {
            let res = fiber::select! {
                send(tx, {
                    assert!(tx.close());
                    5
                }) -> r => r,
            };
            assert_eq!(res, Ok(()), "{flavour}");
            assert_eq!(rx.recv(), Ok(5), "{flavour}");
            assert!(rx.recv().is_err(), "{flavour}");
        }
        // Rendezvous: the reserved receiver gets it.
        let (tx, rx) = bounded::<u32>(0);
        let receiver = fiber::spawn(move || (rx.recv(), rx.recv().is_err()));
        wait_until("the receiver to park", 5, || tx.waiting().0 == 1);
        let res = fiber::select! {
            send(tx, {
                assert!(tx.close());
                5
            }) -> r => r,
        };
        assert_eq!(res, Ok(()));
        assert_eq!(receiver.join().unwrap(), (Ok(5), true));
    });
}

/// A `Select` whose arm body drops a clone of the receiver it just
/// selected, then selects again over the same (original) receiver: every
/// value once.
#[test]
fn a_select_loop_that_drops_and_remakes_receiver_clones() {
    on2(|| {
        let (tx, rx) = unbounded::<u32>();
        for i in 0..5 {
            tx.send(i).unwrap();
        }
        drop(tx);
        let mut seen = Vec::new();
        let mut clone = rx.clone();
        loop {
            let got = {
                let mut sel = fiber::chan::Select::new();
                let a = sel.recv(&rx);
                let b = sel.recv(&clone);
                let op = sel.select();
                match op.index() {
                    i if i == a => op.recv(&rx),
                    i if i == b => op.recv(&clone),
                    _ => unreachable!(),
                }
            };
            match got {
                Ok(v) => {
                    seen.push(v);
                    // Replace the clone the select just used.
                    clone = rx.clone();
                }
                Err(_) => break,
            }
        }
        seen.sort_unstable();
        assert_eq!(seen, vec![0, 1, 2, 3, 4]);
    });
}

// ---------------------------------------------------------------------------
// Jobs and join handles: unjoined values whose Drop calls back in
// ---------------------------------------------------------------------------

/// std's scoped threads: the value of a scoped thread nobody joins is
/// dropped while the scope still counts that thread, so a Drop that spawns
/// into the same scope is waited for by the scope.
#[test]
fn an_unjoined_scoped_value_whose_drop_spawns_into_the_scope_is_waited_for() {
    on2(|| {
        let ran = AtomicBool::new(false);
        let drops = AtomicUsize::new(0);
        struct Spawner<'scope, 'env> {
            s: &'scope fiber::Scope<'scope, 'env>,
            ran: &'env AtomicBool,
            drops: &'env AtomicUsize,
        }
        impl Drop for Spawner<'_, '_> {
            fn drop(&mut self) {
                self.drops.fetch_add(1, SeqCst);
                let ran = self.ran;
                self.s.spawn(move || {
                    fiber::sleep(ms(30)).unwrap();
                    ran.store(true, SeqCst);
                });
            }
        }
        fiber::scope(|s| {
            let (ran, drops) = (&ran, &drops);
            let h = s.spawn(move || Spawner { s, ran, drops });
            drop(h);
        });
        assert_eq!(drops.load(SeqCst), 1);
        assert!(
            ran.load(SeqCst),
            "the scope returned before the child its value spawned"
        );
    });
}

/// The same with std's order reversed: the handle is dropped after the
/// child finished, by the scope's body (the owner drops the value).
#[test]
fn a_scoped_value_dropped_by_its_handle_after_the_child_ended_may_spawn_into_the_scope() {
    on2(|| {
        let ran = AtomicBool::new(false);
        struct Spawner<'scope, 'env> {
            s: &'scope fiber::Scope<'scope, 'env>,
            ran: &'env AtomicBool,
        }
        impl Drop for Spawner<'_, '_> {
            fn drop(&mut self) {
                let ran = self.ran;
                self.s.spawn(move || {
                    fiber::sleep(ms(30)).unwrap();
                    ran.store(true, SeqCst);
                });
            }
        }
        fiber::scope(|s| {
            let ran = &ran;
            let h = s.spawn(move || Spawner { s, ran });
            while !h.is_finished() {
                fiber::sleep(ms(1)).unwrap();
            }
            drop(h);
        });
        assert!(ran.load(SeqCst));
    });
}

/// An unjoined scoped value whose Drop cancels the job it runs in
/// (`Job::current()`, the child's own): the child has already produced its
/// value, so the scope returns normally and its siblings are untouched.
#[test]
fn an_unjoined_scoped_value_whose_drop_cancels_the_current_job() {
    on2(|| {
        struct CancelsCurrent(Arc<AtomicUsize>);
        impl Drop for CancelsCurrent {
            fn drop(&mut self) {
                fiber::Job::current().cancel();
                self.0.fetch_add(1, SeqCst);
            }
        }
        let drops = counter();
        let out = fiber::scope(|s| {
            let d = drops.clone();
            drop(s.spawn(move || CancelsCurrent(d)));
            let sibling = s.spawn(|| {
                fiber::sleep(ms(40)).unwrap();
                7
            });
            sibling.join().unwrap()
        });
        assert_eq!(out, 7);
        assert_eq!(drops.load(SeqCst), 1);
        assert!(!fiber::is_cancelled());
        // try_scope too.
        let drops = counter();
        let out: Result<u32, ()> = fiber::try_scope(|s| {
            let d = drops.clone();
            drop(s.spawn(move || Ok(CancelsCurrent(d))));
            Ok(3)
        });
        assert_eq!(out, Ok(3));
        assert_eq!(drops.load(SeqCst), 1);
    });
}

/// A fiber's value whose Drop joins another fiber and spawns one: dropped
/// by the handle's owner (the fiber finished) and by the fiber itself (the
/// handle was detached first); both park in the Drop and come back.
#[test]
fn a_join_handle_value_whose_drop_joins_and_spawns() {
    struct JoinsOther {
        other: Option<fiber::JoinHandle<u32>>,
        out: Sender<u32>,
    }
    impl Drop for JoinsOther {
        fn drop(&mut self) {
            let v = self.other.take().unwrap().join().unwrap();
            let out = self.out.clone();
            fiber::spawn(move || out.send(v + 1).unwrap());
        }
    }
    on2(|| {
        let (out_tx, out_rx) = unbounded();
        // Dropped by the owner of a finished fiber's handle.
        let other = fiber::spawn(|| {
            fiber::sleep(ms(20)).unwrap();
            10
        });
        let o = out_tx.clone();
        let h = fiber::spawn(move || JoinsOther {
            other: Some(other),
            out: o,
        });
        while !h.is_finished() {
            fiber::sleep(ms(1)).unwrap();
        }
        drop(h);
        assert_eq!(out_rx.recv_timeout(ms(2000)), Ok(11));
        // Detached before it finishes: dropped inside the fiber.
        let (go_tx, go_rx) = bounded::<()>(0);
        let other = fiber::spawn(|| 20);
        let o = out_tx.clone();
        drop(fiber::spawn(move || {
            go_rx.recv().unwrap();
            JoinsOther {
                other: Some(other),
                out: o,
            }
        }));
        go_tx.send(()).unwrap();
        assert_eq!(out_rx.recv_timeout(ms(2000)), Ok(21));
    });
}

// ---------------------------------------------------------------------------
// fiber::sync: the lock's own value calls back into the lock
// ---------------------------------------------------------------------------

/// std: an old value replaced under a guard is dropped with the lock held;
/// a `try_lock` from its Drop sees `WouldBlock` (std's `Mutex` returns
/// `WouldBlock` for a lock held by the calling thread too). Same for
/// `RwLock`'s `try_read`/`try_write` under a write guard.
#[test]
fn an_old_value_dropped_under_the_guard_sees_its_lock_held() {
    struct Probe {
        m: Option<Arc<Mutex<Probe>>>,
        l: Option<Arc<RwLock<Probe>>>,
        seen: Arc<std::sync::Mutex<Vec<&'static str>>>,
    }
    impl Drop for Probe {
        fn drop(&mut self) {
            let mut seen = self.seen.lock().unwrap();
            if let Some(m) = self.m.take() {
                seen.push(match m.try_lock() {
                    Err(TryLockError::WouldBlock) => "mutex would block",
                    Err(TryLockError::Poisoned(_)) => "mutex poisoned",
                    Ok(_) => "mutex taken",
                });
            }
            if let Some(l) = self.l.take() {
                seen.push(match l.try_read() {
                    Err(TryLockError::WouldBlock) => "read would block",
                    _ => "read taken",
                });
                seen.push(match l.try_write() {
                    Err(TryLockError::WouldBlock) => "write would block",
                    _ => "write taken",
                });
            }
        }
    }
    let check = || {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let blank = |seen: &Arc<std::sync::Mutex<Vec<&'static str>>>| Probe {
            m: None,
            l: None,
            seen: seen.clone(),
        };
        let m = Arc::new(Mutex::new(blank(&seen)));
        m.lock().unwrap().m = Some(m.clone());
        *m.lock().unwrap() = blank(&seen);
        let l = Arc::new(RwLock::new(blank(&seen)));
        l.write().unwrap().l = Some(l.clone());
        *l.write().unwrap() = blank(&seen);
        assert!(!m.is_poisoned() && !l.is_poisoned());
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen, vec!["mutex would block", "read would block", "write would block"]);
    };
    check();
    on2(check);
}

/// std: a panic in an old value's Drop, run under the guard by an
/// assignment, poisons the lock; the lock is then usable through the
/// poison error (no lock left held, no hang).
#[test]
fn a_panicking_old_value_dropped_under_the_guard_poisons_like_std() {
    struct Bomb(bool);
    impl Drop for Bomb {
        fn drop(&mut self) {
            if self.0 {
                panic!("old value");
            }
        }
    }
    on2(|| {
        let m = Arc::new(Mutex::new(Bomb(true)));
        let m2 = m.clone();
        let r = fiber::spawn(move || {
            *m2.lock().unwrap() = Bomb(false);
        })
        .join();
        assert!(r.unwrap_err().is_panic());
        assert!(m.is_poisoned());
        let mut g = match m.lock() {
            Err(poisoned) => poisoned.into_inner(),
            Ok(_) => panic!("not poisoned"),
        };
        *g = Bomb(false);
        drop(g);
        assert!(m.try_lock().is_err_and(|e| matches!(e, TryLockError::Poisoned(_))));
    });
}

/// A `wait_while` condition (run with the lock held) that notifies the
/// same condvar and probes the same mutex: the probe sees `WouldBlock`,
/// the notify wakes nobody else, and the wait ends when another fiber
/// makes the condition true.
#[test]
fn a_wait_while_condition_that_notifies_and_probes_its_own_lock() {
    on2(|| {
        let pair = Arc::new((Mutex::new(false), Condvar::new()));
        let probes = counter();
        let setter = {
            let pair = pair.clone();
            fiber::spawn(move || {
                fiber::sleep(ms(30)).unwrap();
                *pair.0.lock().unwrap() = true;
                pair.1.notify_all();
            })
        };
        let (m, cv) = (&pair.0, &pair.1);
        let g = cv
            .wait_while(m.lock().unwrap(), |ready| {
                cv.notify_all();
                assert!(matches!(m.try_lock(), Err(TryLockError::WouldBlock)));
                probes.fetch_add(1, SeqCst);
                !*ready
            })
            .unwrap();
        assert!(*g);
        drop(g);
        setter.join().unwrap();
        assert!(probes.load(SeqCst) >= 2);
    });
}

/// An initializer that initializes another cell whose own initializer
/// reads the first (`get`, which never waits): no re-entrant init of one
/// cell, so no panic and no wait; `get` sees `None` mid-init (std's
/// `OnceLock::get`).
#[test]
fn oncelock_initializers_reading_each_other_with_get() {
    on2(|| {
        static A: OnceLock<u32> = OnceLock::new();
        static B: OnceLock<u32> = OnceLock::new();
        let a = *A.get_or_init(|| {
            assert_eq!(A.get(), None);
            *B.get_or_init(|| if A.get().is_none() { 2 } else { 99 }) + 1
        });
        assert_eq!(a, 3);
        assert_eq!(B.get(), Some(&2));
    });
}

// ---------------------------------------------------------------------------
// Fiber-locals: initializers and destructors that call back in
// ---------------------------------------------------------------------------

/// std's `thread_local!` with a lazy initializer that reads its own key
/// once (guarded by a flag): the outer initializer's value is the one
/// stored (the recursive one is replaced and dropped), and each value is
/// dropped once. A fiber-local must do as the thread-local does, in a
/// fiber and on a plain thread.
// Failed before the fix: the recursive (inner) initialization's value is kept and the outer initializer's value is dropped (seen 1 in a fiber, 3 on a thread), where std's thread_local! keeps the outer one (0 and 2).
#[test]
fn a_fiber_local_initializer_that_reads_its_own_key_keeps_the_outer_value_like_std() {
    use std::sync::atomic::AtomicU32;
    struct Val(u32, &'static AtomicUsize);
    impl Drop for Val {
        fn drop(&mut self) {
            self.1.fetch_add(1, SeqCst);
        }
    }
    // std first: what a thread-local does.
    static STD_NEXT: AtomicU32 = AtomicU32::new(0);
    static STD_DROPS: AtomicUsize = AtomicUsize::new(0);
    fn std_init() -> Val {
        let n = STD_NEXT.fetch_add(1, SeqCst);
        if n == 0 {
            STD_KEY.with(|_| ());
        }
        Val(n, &STD_DROPS)
    }
    thread_local! {
        static STD_KEY: Val = std_init();
    }
    let std_seen = std::thread::spawn(|| STD_KEY.with(|v| v.0)).join().unwrap();
    let std_drops = STD_DROPS.load(SeqCst);

    static NEXT: AtomicU32 = AtomicU32::new(0);
    static DROPS: AtomicUsize = AtomicUsize::new(0);
    fn init() -> Val {
        let n = NEXT.fetch_add(1, SeqCst);
        if n % 2 == 0 {
            KEY.with(|_| ());
        }
        Val(n, &DROPS)
    }
    fiber::fiber_local! {
        static KEY: Val = init();
    }
    // In a fiber.
    let fiber_seen = within(10, || {
        rt2().block_on(|| fiber::spawn(|| KEY.with(|v| v.0)).join().unwrap())
    });
    let fiber_drops = DROPS.load(SeqCst);
    // On a plain thread.
    let thread_seen = std::thread::spawn(|| KEY.with(|v| v.0)).join().unwrap();
    let thread_drops = DROPS.load(SeqCst) - fiber_drops;

    assert_eq!((std_seen, std_drops), (0, 2), "std's own behaviour changed");
    assert_eq!(fiber_drops, 2, "in a fiber, each value dropped once");
    assert_eq!(thread_drops, 2, "on a plain thread, each value dropped once");
    assert_eq!(
        (fiber_seen, thread_seen),
        (0, 2),
        "the outer initializer's value is the one kept, as std's thread_local! keeps it"
    );
}

/// On a plain thread (where a fiber-local is a thread-local), a value
/// replaced by a recursive initialization is dropped; its Drop reads
/// another fiber-local. With `thread_local!` that works; it must not panic
/// with a `RefCell` borrow error from the fiber-local map.
// Failed before the fix: the replaced value is dropped while the thread's fiber-local map is mutably borrowed, so its read of another fiber-local panics with "RefCell already mutably borrowed", where a thread_local! destructor may read other keys.
#[test]
fn a_replaced_fiber_local_whose_drop_reads_another_on_a_plain_thread() {
    use std::sync::atomic::AtomicU32;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    static READS: AtomicUsize = AtomicUsize::new(0);
    struct ReadsOther;
    impl Drop for ReadsOther {
        fn drop(&mut self) {
            OTHER.with(|o| READS.fetch_add(*o, SeqCst));
        }
    }
    fn init() -> ReadsOther {
        if NEXT.fetch_add(1, SeqCst) == 0 {
            KEY.with(|_| ());
        }
        ReadsOther
    }
    fiber::fiber_local! {
        static KEY: ReadsOther = init();
        static OTHER: usize = 1;
    }
    let r = within(10, || {
        std::thread::spawn(|| {
            OTHER.with(|_| ());
            KEY.with(|_| ());
        })
        .join()
    });
    assert!(
        r.is_ok(),
        "a fiber-local destructor run by a re-initialization panicked"
    );
    // One value dropped at the re-initialization, the kept one at thread exit.
    assert_eq!(READS.load(SeqCst), 2);
}

/// The same in a fiber: the replaced value's Drop reads another
/// fiber-local and makes a third one; everything is dropped once, in the
/// fiber, before its join returns.
#[test]
fn a_replaced_fiber_local_whose_drop_uses_other_locals_in_a_fiber() {
    use std::sync::atomic::AtomicU32;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    static DROPS: AtomicUsize = AtomicUsize::new(0);
    static FRESH_DROPS: AtomicUsize = AtomicUsize::new(0);
    static FRESH_MADE: AtomicUsize = AtomicUsize::new(0);
    struct UsesOthers;
    impl Drop for UsesOthers {
        fn drop(&mut self) {
            OTHER.with(|o| assert_eq!(*o, 5));
            FRESH.with(|_| ());
            DROPS.fetch_add(1, SeqCst);
        }
    }
    struct Fresh;
    impl Drop for Fresh {
        fn drop(&mut self) {
            FRESH_DROPS.fetch_add(1, SeqCst);
        }
    }
    fn init() -> UsesOthers {
        if NEXT.fetch_add(1, SeqCst) == 0 {
            KEY.with(|_| ());
        }
        UsesOthers
    }
    fiber::fiber_local! {
        static KEY: UsesOthers = init();
        static OTHER: u32 = 5;
        static FRESH: Fresh = {
            FRESH_MADE.fetch_add(1, SeqCst);
            Fresh
        };
    }
    on2(|| {
        fiber::spawn(|| {
            OTHER.with(|_| ());
            KEY.with(|_| ());
        })
        .join()
        .unwrap();
        assert_eq!(DROPS.load(SeqCst), 2);
        // The kept value's destructor runs at the fiber's end, after FRESH
        // was dropped: it gets a new FRESH (documented), dropped in turn.
        assert_eq!(FRESH_MADE.load(SeqCst), 2);
        assert_eq!(
            FRESH_DROPS.load(SeqCst),
            2,
            "each value made by a destructor is dropped once"
        );
    });
}

/// A chain of fiber-local destructors that each make a fiber-local not used
/// before, and use the runtime: send on a channel, sleep, spawn and join.
/// All run in the fiber (its id), once each, before the join returns.
#[test]
fn fiber_local_destructors_that_make_new_locals_and_use_the_runtime() {
    static LOG: std::sync::Mutex<Vec<(u32, fiber::FiberId)>> = std::sync::Mutex::new(Vec::new());
    static OUT: std::sync::OnceLock<Sender<u32>> = std::sync::OnceLock::new();
    struct Step(u32);
    impl Drop for Step {
        fn drop(&mut self) {
            let me = fiber::current().id();
            fiber::sleep(ms(2)).unwrap();
            let n = self.0;
            let doubled = fiber::spawn(move || n * 2).join().unwrap();
            OUT.get().unwrap().send(doubled).unwrap();
            LOG.lock().unwrap().push((self.0, me));
            match self.0 {
                1 => L2.with(|_| ()),
                2 => L3.with(|_| ()),
                _ => {}
            }
        }
    }
    fiber::fiber_local! {
        static L1: Step = Step(1);
        static L2: Step = Step(2);
        static L3: Step = Step(3);
    }
    on2(|| {
        let (tx, rx) = unbounded();
        OUT.set(tx).unwrap();
        let h = fiber::spawn(|| {
            L1.with(|_| ());
            fiber::current().id()
        });
        let id = h.join().unwrap();
        assert_eq!(*LOG.lock().unwrap(), vec![(1, id), (2, id), (3, id)]);
        let got: Vec<u32> = rx.try_iter().collect();
        assert_eq!(got, vec![2, 4, 6]);
    });
}

// ---------------------------------------------------------------------------
// Runtime callbacks: a tracing layer and a panic hook that call back in
// ---------------------------------------------------------------------------

/// The tracing scenario: a global subscriber whose layer runs `inspect`
/// on every event seen in a fiber, over a program that spawns scoped
/// children, cancels a fiber and times a block out. The program's result
/// must be exact and the layer must have been called.
fn tracing_scenario(name: &str, inspect: fn()) {
    use tracing::{Event, Subscriber};
    use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
    struct Inspect(Arc<AtomicUsize>, fn());
    impl<S: Subscriber> Layer<S> for Inspect {
        fn on_event(&self, _: &Event<'_>, _: Context<'_, S>) {
            if fiber::core::in_fiber() {
                (self.1)();
                self.0.fetch_add(1, SeqCst);
            }
        }
    }
    in_child(name, 30, || {
        let inspected = counter();
        let subscriber = tracing_subscriber::registry()
            .with(Inspect(inspected.clone(), inspect))
            .with(tracing_subscriber::filter::LevelFilter::TRACE);
        tracing::subscriber::set_global_default(subscriber).unwrap();
        let total = within(20, || {
            rt2().block_on(|| {
                let total = fiber::scope(|s| {
                    let hs: Vec<_> = (0..8u64)
                        .map(|i| {
                            s.spawn(move || {
                                fiber::sleep(ms(1)).unwrap();
                                i
                            })
                        })
                        .collect();
                    hs.into_iter().map(|h| h.join().unwrap()).sum::<u64>()
                });
                let slow = fiber::spawn(|| fiber::sleep(std::time::Duration::from_secs(60)));
                slow.cancel();
                assert!(!matches!(slow.join(), Ok(Ok(()))));
                let timed = fiber::with_timeout(ms(10), || fiber::sleep(std::time::Duration::from_secs(60)));
                assert!(timed.is_err());
                total
            })
        });
        assert_eq!(total, 28);
        assert!(inspected.load(SeqCst) > 0, "no runtime event reached the layer");
    });
}

/// A tracing layer whose `on_event` (called for the runtime's own events,
/// in the fiber that caused them) calls `fiber::dump()` and
/// `fiber::stats()`: no self-deadlock on the frame table or the counters.
#[test]
fn a_tracing_layer_that_dumps_and_reads_stats_on_every_event() {
    tracing_scenario("a_tracing_layer_that_dumps_and_reads_stats_on_every_event", || {
        assert!(!fiber::dump().to_string().is_empty());
        assert!(fiber::stats().runtime.fibers_alive >= 1);
    });
}

/// A tracing layer whose `on_event` asks for the running fiber's job
/// (`Job::try_current()`, a query) on the runtime's job events: the job
/// layer's own `JOB_CREATE` event for a fiber's root job is emitted before
/// that job is installed, so the layer's query makes another root job,
/// whose event calls the layer again, until the fiber's stack overflows
/// and the process aborts. tokio's `task::try_id()` and Go's runtime
/// queries are plain reads, safe from a subscriber.
// Failed before the fix: the layer's Job::try_current() recurses through the JOB_CREATE event until the fiber's stack overflows and the process aborts, instead of returning the fiber's job.
#[test]
fn a_tracing_layer_that_asks_for_the_current_job_on_every_event() {
    tracing_scenario("a_tracing_layer_that_asks_for_the_current_job_on_every_event", || {
        if let Some(job) = fiber::Job::try_current() {
            let _ = job.state();
        }
    });
}

/// A panic hook, run in the panicking fiber, that dumps the runtime,
/// cancels the fiber's own job, spawns a fiber and sends on a channel: the
/// panic still reaches the joiner, the spawned fiber runs, and the message
/// arrives.
#[test]
fn a_panic_hook_that_cancels_its_job_spawns_and_sends() {
    in_child("a_panic_hook_that_cancels_its_job_spawns_and_sends", 30, || {
        let (tx, rx) = unbounded::<String>();
        let hook_tx = std::sync::Mutex::new(tx);
        std::panic::set_hook(Box::new(move |info| {
            if !fiber::core::in_fiber() {
                return;
            }
            let text = fiber::dump().to_string();
            fiber::Job::current().cancel();
            let tx = hook_tx.lock().unwrap().clone();
            let msg = info
                .payload()
                .downcast_ref::<&str>()
                .copied()
                .unwrap_or("?")
                .to_string();
            fiber::spawn(move || tx.send(format!("{msg} {}", !text.is_empty())).unwrap());
        }));
        within(20, move || {
            rt2().block_on(move || {
                let h = fiber::spawn(|| -> u32 { panic!("boom") });
                let err = h.join().unwrap_err();
                assert!(err.is_panic());
                assert_eq!(rx.recv_timeout(ms(5000)), Ok("boom true".to_string()));
                // In a scope: the scope re-raises the child's panic.
                let r = std::panic::catch_unwind(|| {
                    fiber::scope(|s| {
                        s.spawn(|| panic!("scoped"));
                    })
                });
                assert!(r.is_err());
                assert_eq!(rx.recv_timeout(ms(5000)), Ok("scoped true".to_string()));
                assert!(
                    !fiber::is_cancelled(),
                    "the hook cancelled the child's job, not the root's"
                );
            });
        });
        let _ = std::panic::take_hook();
    });
}

// ---------------------------------------------------------------------------
// Runtimes and handles dropped from values that a teardown drops
// ---------------------------------------------------------------------------

/// A parked fiber of runtime A holds runtime B, whose parked fiber holds a
/// value with a `Handle` of A that spawns on A from its Drop. Dropping A
/// drops B during A's teardown, which drops the value during B's teardown:
/// the spawn on the shutting-down A fails or is dropped, nothing hangs, and
/// every value is dropped once.
#[test]
fn a_runtime_dropped_by_another_runtimes_teardown_with_a_value_spawning_back() {
    struct SpawnsBack(fiber::Handle, Arc<AtomicUsize>);
    impl Drop for SpawnsBack {
        fn drop(&mut self) {
            let _ = self.0.try_spawn(|| ());
            self.1.fetch_add(1, SeqCst);
        }
    }
    struct OwnsRuntime(Option<fiber::Runtime>, Arc<AtomicUsize>);
    impl Drop for OwnsRuntime {
        fn drop(&mut self) {
            drop(self.0.take());
            self.1.fetch_add(1, SeqCst);
        }
    }
    let drops = counter();
    let d = drops.clone();
    within(10, move || {
        let a = crate::common::rt_fixed_grace(2, ms(100));
        let b = crate::common::rt_fixed_grace(1, ms(100));
        let (parked_tx, parked_rx) = std::sync::mpsc::channel();
        let value = SpawnsBack(a.handle(), d.clone());
        let p = parked_tx.clone();
        drop(b.handle().spawn(move || {
            let _value = value;
            p.send(()).unwrap();
            crate::common::stubborn_sleep();
        }));
        parked_rx.recv().unwrap();
        let owner = OwnsRuntime(Some(b), d.clone());
        drop(a.handle().spawn(move || {
            let _owner = owner;
            parked_tx.send(()).unwrap();
            crate::common::stubborn_sleep();
        }));
        parked_rx.recv().unwrap();
        drop(a);
    });
    assert_eq!(drops.load(SeqCst), 2);
}

/// A value dropped by its runtime's teardown that holds the join handle of
/// another parked fiber of the same runtime and joins it: the join ends
/// (that fiber is torn down too), with a cancelled or finished result.
#[test]
fn a_value_dropped_at_teardown_joining_a_sibling_fiber() {
    struct Joins(Option<fiber::JoinHandle<u32>>, Arc<std::sync::Mutex<Option<bool>>>);
    impl Drop for Joins {
        fn drop(&mut self) {
            let r = self.0.take().unwrap().join();
            *self.1.lock().unwrap() = Some(r.is_err_and(|e| e.is_cancelled()));
        }
    }
    let seen = Arc::new(std::sync::Mutex::new(None));
    let s = seen.clone();
    within(10, move || {
        let rt = crate::common::rt_fixed_grace(2, ms(100));
        let (parked_tx, parked_rx) = std::sync::mpsc::channel();
        let p = parked_tx.clone();
        let sibling = rt.handle().spawn(move || {
            p.send(()).unwrap();
            let _ = fiber::sleep(std::time::Duration::from_secs(3600));
            1u32
        });
        parked_rx.recv().unwrap();
        let joins = Joins(Some(sibling), s);
        drop(rt.handle().spawn(move || {
            let _joins = joins;
            parked_tx.send(()).unwrap();
            crate::common::stubborn_sleep();
        }));
        parked_rx.recv().unwrap();
        drop(rt);
    });
    assert_eq!(
        *seen.lock().unwrap(),
        Some(true),
        "the sibling's join reported cancelled"
    );
}

/// One worker: a discarded message's Drop sends on a rendezvous channel
/// to a fiber that is not yet running, on the only worker; the send parks
/// the dropping fiber so the receiver can run (no worker blocked inside
/// the channel's discard).
#[test]
fn a_discard_on_one_worker_that_rendezvous_with_a_later_fiber() {
    struct Hands(Sender<u32>, u32);
    impl Drop for Hands {
        fn drop(&mut self) {
            self.0.send(self.1).unwrap();
        }
    }
    on1(|| {
        for (flavour, tx, rx) in buffered::<Hands>() {
            let (out_tx, out_rx) = bounded(0);
            for i in 0..3 {
                tx.send(Hands(out_tx.clone(), i)).unwrap();
            }
            drop(out_tx);
            let collector = fiber::spawn(move || out_rx.iter().collect::<Vec<u32>>());
            drop(rx);
            assert_eq!(collector.join().unwrap(), vec![0, 1, 2], "{flavour}");
        }
    });
}

/// `Job::current()` from code the runtime runs in the fiber after its
/// body returned: a fiber-local's destructor and the Drop of a detached
/// fiber's value. The fiber's job has ended and is gone there (documented
/// in `Job::current`'s Panics section): `Job::try_current()` is `None`, and
/// `Job::current()` panics with a message that says so, not that the code
/// runs "outside a fiber".
// Failed before the fix: Job::current() panicked with "called outside a fiber: plain threads have no job" inside a fiber (its fiber-local destructor, its detached value's Drop).
#[test]
fn job_current_from_a_fiber_local_destructor_and_a_detached_values_drop() {
    type Seen = (&'static str, Option<String>, bool);
    static SEEN: std::sync::Mutex<Vec<Seen>> = std::sync::Mutex::new(Vec::new());
    fn record(what: &'static str) {
        let in_fiber = fiber::core::in_fiber();
        assert!(in_fiber, "{what} runs in the fiber");
        let outcome = crate::common::panic_message(|| {
            let _ = fiber::Job::current().state();
        });
        let none = fiber::Job::try_current().is_none();
        SEEN.lock().unwrap().push((what, outcome, none));
    }
    struct AsksInLocal;
    impl Drop for AsksInLocal {
        fn drop(&mut self) {
            record("fiber-local destructor");
        }
    }
    struct AsksInValue;
    impl Drop for AsksInValue {
        fn drop(&mut self) {
            record("detached value");
        }
    }
    fiber::fiber_local! {
        static ASKS: AsksInLocal = AsksInLocal;
    }
    on2(|| {
        fiber::spawn(|| ASKS.with(|_| ())).join().unwrap();
        let (go_tx, go_rx) = bounded::<()>(0);
        let (done_tx, done_rx) = bounded::<()>(1);
        drop(fiber::spawn(move || {
            go_rx.recv().unwrap();
            // Dropped after this closure returns, before the fiber ends.
            let _signal = Signal(done_tx);
            AsksInValue
        }));
        go_tx.send(()).unwrap();
        let _ = done_rx.recv_timeout(ms(2000));
        wait_until("both records", 5, || SEEN.lock().unwrap().len() == 2);
    });
    struct Signal(Sender<()>);
    impl Drop for Signal {
        fn drop(&mut self) {
            let _ = self.0.try_send(());
        }
    }
    let seen = SEEN.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    for (what, message, none) in &seen {
        assert!(none, "{what}: Job::try_current() is None after the body");
        let message = message.as_deref().unwrap_or("(no panic)");
        assert!(
            message.contains("body has returned") && !message.contains("outside a fiber"),
            "{what}: {message}"
        );
    }
}

/// Destructors run by a runtime's teardown (a parked fiber's stack value
/// and fiber-local) that query the same runtime: `fiber::dump()`,
/// `fiber::stats()`, `Handle::current()`, `fiber::is_cancelled()`. The
/// teardown holds no lock they need: they return, once each, and the
/// runtime's drop ends.
#[test]
fn teardown_destructors_that_query_the_runtime_being_torn_down() {
    static SEEN: std::sync::Mutex<Vec<(&'static str, bool, bool)>> = std::sync::Mutex::new(Vec::new());
    fn query(what: &'static str) {
        let dump = fiber::dump().to_string();
        let alive = fiber::stats().runtime.fibers_alive;
        let _handle = fiber::Handle::current();
        SEEN.lock()
            .unwrap()
            .push((what, !dump.is_empty() && alive >= 1, fiber::is_cancelled()));
    }
    struct Queries(&'static str);
    impl Drop for Queries {
        fn drop(&mut self) {
            query(self.0);
        }
    }
    fiber::fiber_local! {
        static LOCAL: Queries = Queries("fiber-local");
    }
    within(10, || {
        let rt = crate::common::rt_fixed_grace(2, ms(100));
        let (parked_tx, parked_rx) = std::sync::mpsc::channel();
        for _ in 0..2 {
            let p = parked_tx.clone();
            drop(rt.handle().spawn(move || {
                let _value = Queries("stack value");
                LOCAL.with(|_| ());
                p.send(()).unwrap();
                crate::common::stubborn_sleep();
            }));
        }
        parked_rx.recv().unwrap();
        parked_rx.recv().unwrap();
        drop(rt);
    });
    let mut seen = SEEN.lock().unwrap().clone();
    seen.sort_unstable();
    assert_eq!(
        seen,
        vec![
            ("fiber-local", true, true),
            ("fiber-local", true, true),
            ("stack value", true, true),
            ("stack value", true, true),
        ]
    );
}

/// std: locking a mutex the calling thread holds "will not return" (it
/// may deadlock). Here the fiber parks for good; the worker is not
/// blocked (another fiber on the only worker runs to its end), and the
/// runtime's drop tears the stuck fiber down.
#[test]
fn relocking_a_mutex_in_the_holding_fiber_parks_only_that_fiber() {
    let released = Arc::new(AtomicBool::new(false));
    let r = released.clone();
    within(10, move || {
        let rt = crate::common::rt_fixed_grace(1, ms(100));
        let m = Arc::new(Mutex::new(0u32));
        let m2 = m.clone();
        struct SetsOnDrop(Arc<AtomicBool>);
        impl Drop for SetsOnDrop {
            fn drop(&mut self) {
                self.0.store(true, SeqCst);
            }
        }
        drop(rt.handle().spawn(move || {
            let _flag = SetsOnDrop(r);
            let _g = m2.lock().unwrap();
            let _again = m2.lock();
            unreachable!("a re-entrant lock returned");
        }));
        let other = rt.handle().spawn(|| {
            fiber::sleep(ms(20)).unwrap();
            5
        });
        assert_eq!(other.join().unwrap(), 5);
        crate::common::wait_parked(&rt, 1);
        assert!(matches!(m.try_lock(), Err(TryLockError::WouldBlock)));
        drop(rt);
    });
    assert!(released.load(SeqCst), "the stuck fiber's stack was unwound at teardown");
}

/// A panic payload whose Drop uses the runtime (records whether it runs
/// in a fiber, spawns a fiber there, and counts itself).
struct PayloadUsesRuntime(&'static str, Sender<(&'static str, bool)>);

impl Drop for PayloadUsesRuntime {
    fn drop(&mut self) {
        let in_fiber = fiber::core::in_fiber();
        if in_fiber {
            let _job = fiber::Job::try_current().map(|j| j.state());
            let tx = self.1.clone();
            let what = self.0;
            drop(fiber::spawn(move || {
                let _ = tx.send((what, true));
            }));
        } else {
            let _ = self.1.send((self.0, false));
        }
    }
}

/// Panic payloads whose Drop calls back into the runtime, dropped by every
/// path that discards one: the user's handling of a scope's re-raised
/// panic, a supervisor's unjoined failed children, a detached fiber's
/// panic and a joined one. Each is dropped exactly once, in a fiber (never
/// bare on a worker, where the runtime calls would be refused), and no lock
/// of the job tree is held while it runs.
#[test]
fn panic_payloads_whose_drop_uses_the_runtime_are_dropped_once_in_a_fiber() {
    on2(|| {
        let (tx, rx) = unbounded::<(&'static str, bool)>();
        // A scope re-raises its child's panic; the user drops it.
        let a = payload_panic("scope", &tx);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            fiber::scope(|s| {
                s.spawn(a);
            })
        }));
        drop(r);
        // A supervisor's unjoined failed children.
        let (c, d) = (payload_panic("supervised 1", &tx), payload_panic("supervised 2", &tx));
        fiber::supervisor_scope(|s| {
            s.spawn(c);
            s.spawn(d);
        });
        // A detached fiber and a joined one.
        drop(fiber::spawn(payload_panic("detached", &tx)));
        let joined = fiber::spawn(payload_panic("joined", &tx)).join();
        drop(joined);
        drop(tx);
        let seen = collect(&rx, 5);
        assert_eq!(
            seen,
            vec![
                ("detached", true),
                ("joined", true),
                ("scope", true),
                ("supervised 1", true),
                ("supervised 2", true),
            ]
        );
        // Nothing dropped twice.
        assert!(rx.recv_timeout(ms(50)).is_err());
    });
}

/// A closure that panics with a `PayloadUsesRuntime` named `what`.
fn payload_panic(what: &'static str, tx: &Sender<(&'static str, bool)>) -> impl FnOnce() + Send + 'static {
    let tx = tx.clone();
    move || std::panic::panic_any(PayloadUsesRuntime(what, tx))
}

/// Up to `n` records from `rx` (3 s at most for each), sorted.
fn collect(rx: &Receiver<(&'static str, bool)>, n: usize) -> Vec<(&'static str, bool)> {
    let mut seen = Vec::new();
    while seen.len() < n {
        match rx.recv_timeout(ms(3000)) {
            Ok(v) => seen.push(v),
            Err(_) => break,
        }
    }
    seen.sort_unstable();
    seen
}

/// std's `thread::scope`: the payload of every scoped thread that panicked
/// and was not joined is dropped by the time the scope returns (std
/// raises its own "a scoped thread panicked"; each packet's payload goes
/// with its thread). Here the scope re-raises the first child's payload;
/// the second failing child's payload must be gone when the scope has
/// returned too, not kept alive by the finished scope's job for as long as
/// the parent runs.
// Failed before the fix: the second child's payload stays in the finished scope's job (its later panics), which the parent's job keeps in its children list, so it is dropped only when the parent fiber ends (here after 3 s of waiting), not when the scope returns.
#[test]
fn a_second_failing_childs_payload_is_dropped_when_the_scope_returns() {
    on2(|| {
        let (tx, rx) = unbounded::<(&'static str, bool)>();
        let (a, b) = (payload_panic("first", &tx), payload_panic("second", &tx));
        let (second_running_tx, second_running_rx) = bounded::<()>(0);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            fiber::scope(|s| {
                s.spawn(move || {
                    // Fail only once the second child is running: both fail.
                    second_running_rx.recv().unwrap();
                    a()
                });
                s.spawn(move || {
                    second_running_tx.send(()).unwrap();
                    // Cancelled by the first child's failure, then fails too.
                    let _ = fiber::sleep(std::time::Duration::from_secs(5));
                    b()
                });
            })
        }));
        let raised = r.unwrap_err();
        assert_eq!(raised.downcast_ref::<PayloadUsesRuntime>().map(|p| p.0), Some("first"));
        drop(raised);
        drop(tx);
        assert_eq!(collect(&rx, 2), vec![("first", true), ("second", true)]);
    });
}

/// The rule of `fiber_local_destructors_never_run_outside_their_fiber`
/// (spec/facade.md: fiber-locals are "dropped when the fiber's body ends
/// (on its stack)"), for a fiber-local first made by a value the runtime
/// drops after the fiber's own fiber-locals are gone: a detached fiber's
/// returned value, and a scoped child's value nobody joins. Its destructor
/// must still run once, inside that fiber (as `thread_local!`s made by a
/// destructor at thread exit are destroyed on that thread).
// Failed before the fix: the fiber-local made by a detached fiber's dropped value is destroyed later at frame recycling, on a worker thread outside any fiber (a scoped child's unjoined value is fine), instead of in its fiber before it ends.
#[test]
fn a_fiber_local_first_made_by_a_dropped_result_is_destroyed_in_its_fiber() {
    static RECORDS: std::sync::Mutex<Vec<(&'static str, bool)>> = std::sync::Mutex::new(Vec::new());
    struct Late(&'static str);
    impl Drop for Late {
        fn drop(&mut self) {
            RECORDS.lock().unwrap().push((self.0, fiber::core::in_fiber()));
        }
    }
    fiber::fiber_local! {
        static LATE: std::cell::Cell<&'static str> = std::cell::Cell::new("");
        static LATE_OWNER: std::cell::RefCell<Option<Late>> = std::cell::RefCell::new(None);
    }
    struct TouchesLocal(&'static str);
    impl Drop for TouchesLocal {
        fn drop(&mut self) {
            let what = self.0;
            LATE.with(|l| l.set(what));
            LATE_OWNER.with(|o| *o.borrow_mut() = Some(Late(what)));
        }
    }
    on2(|| {
        let (go_tx, go_rx) = bounded::<()>(0);
        drop(fiber::spawn(move || {
            go_rx.recv().unwrap();
            TouchesLocal("detached value")
        }));
        go_tx.send(()).unwrap();
        fiber::scope(|s| {
            drop(s.spawn(|| {
                fiber::sleep(ms(10)).unwrap();
                TouchesLocal("unjoined scoped value")
            }));
        });
        // Fibers that reuse the frames, so that anything left for frame
        // recycling is dropped now.
        for _ in 0..64 {
            fiber::spawn(|| ()).join().unwrap();
        }
        wait_until("both destructors", 5, || RECORDS.lock().unwrap().len() >= 2);
    });
    let mut records = RECORDS.lock().unwrap().clone();
    records.sort_unstable();
    assert_eq!(
        records,
        vec![("detached value", true), ("unjoined scoped value", true)],
        "(destructor, ran in a fiber)"
    );
}

/// A `wait_while` condition that panics after a wake: the mutex is
/// poisoned (std: a panic with the guard held), and the panicking waiter
/// leaves nothing registered on the condvar: the next `notify_one` wakes
/// the fiber that waits now.
#[test]
fn a_panicking_wait_while_condition_leaves_no_waiter_behind() {
    on2(|| {
        let pair = Arc::new((Mutex::new(0u32), Condvar::new()));
        let p = pair.clone();
        let first = fiber::spawn(move || {
            let (m, cv) = (&p.0, &p.1);
            let mut calls = 0;
            let _ = cv.wait_while(m.lock().unwrap(), |_| {
                calls += 1;
                assert!(calls < 2, "condition panics on its second call");
                true
            });
        });
        wait_until("the first waiter", 5, || fiber::stats().runtime.fibers_parked >= 1);
        loop {
            pair.1.notify_all();
            if first.is_finished() {
                break;
            }
            fiber::sleep(ms(1)).unwrap();
        }
        assert!(first.join().unwrap_err().is_panic());
        assert!(pair.0.is_poisoned());
        let p = pair.clone();
        let second = fiber::spawn(move || {
            let (m, cv) = (&p.0, &p.1);
            let g = m.lock().unwrap_or_else(|e| e.into_inner());
            let g = cv.wait(g).unwrap_or_else(|e| e.into_inner());
            *g
        });
        wait_until("the second waiter", 5, || fiber::stats().runtime.fibers_parked >= 1);
        fiber::sleep(ms(10)).unwrap();
        *pair.0.lock().unwrap_or_else(|e| e.into_inner()) = 9;
        pair.1.notify_one();
        assert_eq!(second.join().unwrap(), 9);
    });
}

/// A panic hook that logs the job of the panicking fiber, run by a
/// fiber-local destructor that panics (documented as reported by the hook
/// and swallowed): the hook uses `Job::try_current()`, as documented for
/// code that may run where there is no job, and gets `None` there (the
/// body has returned); the panic is swallowed and the process goes on.
#[test]
fn a_panic_hook_logging_the_job_of_a_panicking_fiber_local_destructor() {
    struct PanicsOnDrop;
    impl Drop for PanicsOnDrop {
        fn drop(&mut self) {
            panic!("fiber-local destructor");
        }
    }
    fiber::fiber_local! {
        static BOOM: PanicsOnDrop = PanicsOnDrop;
    }
    in_child(
        "a_panic_hook_logging_the_job_of_a_panicking_fiber_local_destructor",
        30,
        || {
            let logged = counter();
            let l = logged.clone();
            std::panic::set_hook(Box::new(move |_| {
                if fiber::core::in_fiber() && fiber::Job::try_current().is_none() {
                    l.fetch_add(1, SeqCst);
                }
            }));
            let r = within(20, || {
                rt2().block_on(|| fiber::spawn(|| BOOM.with(|_| ())).join().is_ok())
            });
            let _ = std::panic::take_hook();
            assert!(r, "a panicking fiber-local destructor is swallowed");
            assert_eq!(logged.load(SeqCst), 1);
        },
    );
}

/// A child spawned into a failing scope starts cancelled and its closure
/// is dropped unrun; a capture whose Drop spawns another child into the
/// same scope (std's scoped threads may spawn through `s` from anywhere in
/// the scope) gets a child that is dropped unrun in turn. The scope waits
/// for all of them and re-raises the first failure; each capture is
/// dropped once.
#[test]
fn an_unrun_childs_capture_that_spawns_into_its_failing_scope() {
    on2(|| {
        let drops = AtomicUsize::new(0);
        let ran = AtomicUsize::new(0);
        struct Respawns<'scope, 'env> {
            s: &'scope fiber::Scope<'scope, 'env>,
            depth: u32,
            drops: &'env AtomicUsize,
            ran: &'env AtomicUsize,
        }
        impl Drop for Respawns<'_, '_> {
            fn drop(&mut self) {
                self.drops.fetch_add(1, SeqCst);
                if self.depth < 3 {
                    let next = Respawns {
                        s: self.s,
                        depth: self.depth + 1,
                        drops: self.drops,
                        ran: self.ran,
                    };
                    self.s.spawn(move || {
                        next.ran.fetch_add(1, SeqCst);
                        drop(next);
                    });
                }
            }
        }
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            fiber::scope(|s| {
                let (drops, ran) = (&drops, &ran);
                s.spawn(|| panic!("first"));
                while !s.job().is_cancelled() {
                    fiber::sleep(ms(1)).unwrap_or(());
                }
                let first = Respawns {
                    s,
                    depth: 0,
                    drops,
                    ran,
                };
                s.spawn(move || {
                    first.ran.fetch_add(1, SeqCst);
                    drop(first);
                });
            })
        }));
        let payload = r.unwrap_err();
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"first"));
        assert_eq!(drops.load(SeqCst), 4, "each capture once");
        assert_eq!(ran.load(SeqCst), 0, "children of a failed scope start cancelled");
    });
}

/// A destructor that panics while its fiber is being unwound by a panic
/// aborts the process, as on any thread (README, "Panics"): the runtime
/// does not catch the second panic somewhere that would let the process
/// go on in a half-dropped state.
#[test]
fn a_destructor_panicking_during_a_fibers_unwind_aborts_the_process() {
    struct PanicsOnDrop;
    impl Drop for PanicsOnDrop {
        fn drop(&mut self) {
            panic!("destructor panics during the unwind");
        }
    }
    const SCENARIO: &str = "a_destructor_panicking_during_a_fibers_unwind_aborts_the_process";
    let outcome = crate::common::child_outcome(SCENARIO, 30, &[], || {
        let rt = rt2();
        rt.block_on(|| {
            let h = fiber::spawn(|| {
                let _guard = PanicsOnDrop;
                panic!("the fiber's own panic");
            });
            let _ = h.join();
        });
        // Not reached: the process aborted in the fiber's unwind.
        std::process::exit(0);
    });
    if let Some((status, stderr)) = outcome {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(6), "aborted (SIGABRT): {status:?}\n{stderr}");
        assert!(stderr.contains("the fiber's own panic"), "{stderr}");
        assert!(stderr.contains("destructor panics during the unwind"), "{stderr}");
    }
}
