//! Loom models: threads wait through fiber-core's plain-thread park path, so
//! the channel code, the wait protocol and the state word all run for real.

use crate::{bounded, Select, SendError};
use loom::thread;

/// Send admission vs close on a buffered channel: a send admitted before
/// the close is delivered, one not admitted fails with its value; nothing
/// is lost or duplicated. Checking `closed` outside the lock (then pushing)
/// or dropping the buffer on close breaks it.
#[test]
fn loom_send_admission_vs_close() {
    loom::model(|| {
        let (tx, rx) = bounded::<u32>(1);
        let closed = std::sync::Arc::new(loom::sync::atomic::AtomicBool::new(false));
        let closer = {
            let (tx, closed) = (tx.clone(), closed.clone());
            thread::spawn(move || {
                tx.close();
                closed.store(true, loom::sync::atomic::Ordering::Release);
            })
        };
        // If the close is known to have happened, the send is not admitted.
        let closed_before = closed.load(loom::sync::atomic::Ordering::Acquire);
        let sent = tx.send(7);
        if closed_before {
            assert!(sent.is_err(), "a send after the close LP was admitted");
        }
        closer.join().unwrap();
        let received = rx.try_recv().ok();
        match sent {
            Ok(()) => assert_eq!(received, Some(7), "an admitted send must be delivered after close"),
            Err(SendError(v)) => {
                assert_eq!(v, 7);
                assert_eq!(received, None, "a refused send must not transfer data");
            }
        }
    });
}

/// Rendezvous hand-off racing close: the receiver gets the value iff the
/// sender succeeded, and nobody sleeps forever. A close that does not wake
/// parked receivers deadlocks here.
#[test]
fn loom_rendezvous_handoff_vs_close() {
    loom::model(|| {
        let (tx, rx) = bounded::<u32>(0);
        let receiver = thread::spawn(move || rx.recv().ok());
        let closer = {
            let tx = tx.clone();
            thread::spawn(move || {
                tx.close();
            })
        };
        let sent = tx.send(5);
        closer.join().unwrap();
        drop(tx);
        let got = receiver.join().unwrap();
        assert_eq!(sent.is_ok(), got == Some(5), "sent {sent:?}, received {got:?}");
    });
}

/// Two senders race to complete one select over their two rendezvous
/// channels: the select completes exactly one of them, and the other value
/// is still there for a plain receive afterwards (each value arrives
/// exactly once). Without the select group's winner CAS both senders hand
/// their values to the select: one is lost and the receive afterwards
/// waits for ever. (Three threads: the earlier form of this model, two
/// selects and two senders, took about 90 s of the CI gate.)
#[test]
fn loom_two_senders_race_to_complete_one_select() {
    loom::model(|| {
        let (tx_a, rx_a) = bounded::<u32>(0);
        let (tx_b, rx_b) = bounded::<u32>(0);
        // The senders' channels stay connected until the end (a
        // disconnected receive would be ready too).
        let (keep_a, keep_b) = (tx_a.clone(), tx_b.clone());
        let sender_a = thread::spawn(move || tx_a.send(1).unwrap());
        let sender_b = thread::spawn(move || tx_b.send(2).unwrap());
        let mut sel = Select::new();
        let a = sel.recv(&rx_a);
        let _b = sel.recv(&rx_b);
        let oper = sel.select();
        let (first, second) = if oper.index() == a {
            (oper.recv(&rx_a).unwrap(), rx_b.recv().unwrap())
        } else {
            (oper.recv(&rx_b).unwrap(), rx_a.recv().unwrap())
        };
        sender_a.join().unwrap();
        sender_b.join().unwrap();
        drop((keep_a, keep_b));
        let mut got = [first, second];
        got.sort();
        assert_eq!(got, [1, 2], "each value exactly once");
    });
}

/// A receiver on a rendezvous channel claims and wakes one parked select
/// send arm; the select it woke may complete another of its arms instead
/// (here a receive that a third thread made ready), and must then offer
/// the receiver on to the next parked send arm (`reoffer_send`). Without
/// the re-offer the second select waits for ever beside the waiting
/// receiver.
#[test]
fn loom_a_woken_send_arm_that_takes_another_arm_reoffers_the_receiver() {
    loom::model(|| {
        let (tx, rx) = bounded::<u32>(0);
        let (other1_tx, other1_rx) = bounded::<u32>(1);
        let (other2_tx, other2_rx) = bounded::<u32>(1);
        let select = |tx: crate::Sender<u32>, other: crate::Receiver<u32>, v: u32| {
            thread::spawn(move || {
                // Biased, the receive first: woken through its send arm
                // with both ready, it takes the receive.
                let mut sel = Select::new_biased();
                let recv = sel.recv(&other);
                let send = sel.send(&tx);
                let oper = sel.select();
                if oper.index() == send {
                    oper.send(&tx, v).unwrap();
                    true
                } else {
                    assert_eq!(oper.index(), recv);
                    oper.recv(&other).unwrap();
                    false
                }
            })
        };
        let s1 = select(tx.clone(), other1_rx, 1);
        let s2 = select(tx, other2_rx, 2);
        // (A select that already sent has dropped its other receiver: the
        // send then fails, which is fine.)
        let maker = thread::spawn(move || {
            let _ = other1_tx.send(0);
        });
        let got = rx.recv().unwrap();
        // Release the select that did not send (its other arm).
        let _ = other2_tx.send(0);
        maker.join().unwrap();
        let sent = [s1.join().unwrap(), s2.join().unwrap()];
        assert_eq!(
            sent.iter().filter(|&&s| s).count(),
            1,
            "exactly one select sent: {sent:?}"
        );
        assert_eq!(got, if sent[0] { 1 } else { 2 }, "the value of the select that sent");
    });
}

/// The last receiver leaving while a sender is parked: the sender wakes
/// with its value back. Not waking parked senders there deadlocks.
#[test]
fn loom_receiver_drop_vs_parked_sender() {
    loom::model(|| {
        let (tx, rx) = bounded::<String>(0);
        let dropper = thread::spawn(move || drop(rx));
        let result = tx.send("v".to_string());
        dropper.join().unwrap();
        assert_eq!(result, Err(SendError("v".to_string())));
    });
}

/// A select's send arm (a probe, then a reservation, then the value) meets
/// a plain receiver on a rendezvous channel, while a second select arm on
/// another channel may win instead: the value is delivered exactly when the
/// send arm was selected, and nobody sleeps forever. Not waking send probes
/// when a receiver queues deadlocks here.
#[test]
fn loom_select_send_arm_reserves_a_receiver() {
    loom::model(|| {
        let (tx, rx) = bounded::<u32>(0);
        let (other_tx, other_rx) = bounded::<u32>(1);
        let receiver = thread::spawn(move || rx.recv().ok());
        let other = thread::spawn(move || other_tx.send(9).is_ok());
        let mut sel = Select::new_biased();
        let send = sel.send(&tx);
        let recv = sel.recv(&other_rx);
        let oper = sel.select();
        let sent = if oper.index() == send {
            oper.send(&tx, 5).unwrap();
            true
        } else {
            assert_eq!(oper.index(), recv);
            assert_eq!(oper.recv(&other_rx), Ok(9));
            false
        };
        assert!(other.join().unwrap());
        if !sent {
            // The receiver still waits: give it its value now.
            tx.send(6).unwrap();
        }
        let got = receiver.join().unwrap();
        assert_eq!(got, Some(if sent { 5 } else { 6 }));
    });
}

/// A select's send arm reserves a buffer slot, then sends, racing a close
/// and a parked receiver: a reservation made before the close is admitted
/// and delivered (the receiver waits for it rather than reporting the
/// channel disconnected); one refused by the close fails with its value.
/// Letting a receive report `Disconnected` while a slot is reserved breaks
/// it (the receiver misses an admitted value).
#[test]
fn loom_reserved_slot_vs_close() {
    loom::model(|| {
        let (tx, rx) = bounded::<u32>(1);
        let closer = {
            let tx = tx.clone();
            thread::spawn(move || {
                tx.close();
            })
        };
        let receiver = thread::spawn(move || (rx.recv().ok(), rx.recv().ok()));
        let mut sel = Select::new();
        sel.send(&tx);
        let sent = sel.select().send(&tx, 5);
        closer.join().unwrap();
        let (first, second) = receiver.join().unwrap();
        match sent {
            Ok(()) => assert_eq!(first, Some(5), "an admitted (reserved) value is delivered"),
            Err(SendError(v)) => {
                assert_eq!(v, 5);
                assert_eq!(first, None, "a refused send transfers nothing");
            }
        }
        assert_eq!(second, None);
    });
}

/// The ring (a bounded channel's lock-free buffer): two sends race a close
/// and a receiver that drains until disconnected. A send is `Ok` exactly
/// when its value is received, once; a refused send gets its value back.
/// A receive that reads a claimed but unwritten position (a send between
/// its claim and its write) as empty once the close mark is set loses the
/// value.
#[test]
fn loom_ring_send_vs_close() {
    loom::model(|| {
        let (tx, rx) = bounded::<u32>(2);
        let receiver = thread::spawn(move || {
            let mut got = Vec::new();
            while let Ok(v) = rx.recv() {
                got.push(v);
            }
            got
        });
        let sender = {
            let tx = tx.clone();
            thread::spawn(move || tx.send(1))
        };
        let closer = tx.clone();
        let sent2 = tx.send(2);
        closer.close();
        drop(closer);
        let sent1 = sender.join().unwrap();
        drop(tx);
        let mut got = receiver.join().unwrap();
        got.sort_unstable();
        let mut expected = Vec::new();
        for (v, sent) in [(1, &sent1), (2, &sent2)] {
            match sent {
                Ok(()) => expected.push(v),
                Err(SendError(back)) => assert_eq!(*back, v, "a refused send gets its own value back"),
            }
        }
        assert_eq!(got, expected, "received exactly the values whose send succeeded");
    });
}

/// A receiver parking on an empty ring races a lock-free send: the value
/// reaches it and it wakes. Without the SeqCst fence between the send's
/// ring write and its read of `parked` (`after_ring_op`), the send can
/// miss the parking receiver, which sleeps forever.
#[test]
fn loom_ring_receiver_parks_vs_send() {
    loom::model(|| {
        let (tx, rx) = bounded::<u32>(1);
        let receiver = thread::spawn(move || rx.recv().ok());
        tx.send(5).unwrap();
        assert_eq!(receiver.join().unwrap(), Some(5));
        drop(tx);
    });
}

/// A sender parking on a full ring races a lock-free receive: the freed
/// slot admits the parked value and the sender wakes; FIFO holds. Without
/// the SeqCst fence between the parking sender's `parked` announcement and
/// its re-check of the ring (`announce`), the receive can miss it, and the
/// sender sleeps forever next to a free slot.
#[test]
fn loom_ring_sender_parks_vs_recv() {
    loom::model(|| {
        let (tx, rx) = bounded::<u32>(1);
        tx.try_send(1).unwrap();
        let sender = thread::spawn(move || tx.send(2));
        assert_eq!(rx.recv(), Ok(1));
        // The freed slot alone must complete the send (no second receive
        // comes to the rescue).
        assert_eq!(sender.join().unwrap(), Ok(()));
        assert_eq!(rx.try_recv(), Ok(2));
    });
}

/// A receiver woken by a third party (what a cancellation or a deadline
/// does to a fiber) while a sender completes its node: after the wake it
/// learns the outcome without the channel lock (`Node::finish_unlocked`)
/// and reads the value the sender put in the node. Without the Release
/// store of the final state in `Node::complete` (or the Acquire load that
/// reads it) the read of the value races with the sender's write; the value
/// is delivered exactly once either way.
#[test]
fn loom_woken_receiver_reads_a_completed_node_without_the_lock() {
    loom::model(|| {
        let (tx, rx) = bounded::<u32>(0);
        let receiver = thread::spawn(move || rx.recv().ok());
        let interrupter = {
            let chan = tx.chan.clone();
            thread::spawn(move || {
                if let Some(record) = chan.first_receiver_record() {
                    fiber_core::fiber_wake(&record);
                }
            })
        };
        assert_eq!(tx.send(5), Ok(()));
        interrupter.join().unwrap();
        assert_eq!(receiver.join().unwrap(), Some(5));
    });
}

/// The mirror case: a parked sender woken by a third party while a
/// receiver takes its value out of its node. The receiver must take the
/// value before it completes the node (`Node::complete` is its last
/// access): the sender may see the final state at once and drop the node.
/// Completing first makes the two touch the node's value concurrently.
#[test]
fn loom_woken_sender_sees_its_value_taken_without_the_lock() {
    loom::model(|| {
        let (tx, rx) = bounded::<u32>(0);
        let chan = tx.chan.clone();
        let sender = thread::spawn(move || tx.send(5));
        let interrupter = thread::spawn(move || {
            if let Some(record) = chan.first_sender_record() {
                fiber_core::fiber_wake(&record);
            }
        });
        assert_eq!(rx.recv(), Ok(5));
        interrupter.join().unwrap();
        assert_eq!(sender.join().unwrap(), Ok(()));
    });
}

/// A value that counts its drops (read after every thread has joined).
struct Counted(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The last receiver leaves while a select holds a reserved ring position
/// and a plain send races it: with a sender still alive, every value is
/// dropped once (refused sends get theirs back; admitted ones are dropped
/// by the receiver's drop or, behind the reservation, by its completion).
/// Removing the SeqCst fence from `disconnect_receivers`, or the
/// completion's `drop_abandoned`, leaves a value in the ring.
#[test]
fn loom_last_receiver_drop_vs_reserved_slot_completion() {
    loom::model(|| {
        let drops = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (tx, rx) = bounded::<Counted>(2);
        let dropper = thread::spawn(move || drop(rx));
        let mut sel = Select::new();
        sel.send(&tx);
        let op = sel.select();
        let _ = tx.try_send(Counted(drops.clone()));
        let _ = op.send(&tx, Counted(drops.clone()));
        dropper.join().unwrap();
        drop(sel);
        assert_eq!(
            drops.load(std::sync::atomic::Ordering::Relaxed),
            2,
            "a value outlived the last receiver"
        );
        drop(tx);
    });
}

/// A reservation given back while a plain sender waits for room on a
/// full channel: the position is rolled back (or becomes a hole that is
/// skipped) and the sender gets in by itself; nothing is lost. Without
/// `after_ring_fill` on the give-back path the parked sender is never
/// told (a deadlock).
#[test]
fn loom_given_back_reservation_vs_parked_sender() {
    loom::model(|| {
        let (tx, rx) = bounded::<u32>(1);
        let mut sel = Select::new();
        sel.send(&tx);
        let op = sel.select();
        let sender = {
            let tx = tx.clone();
            thread::spawn(move || tx.send(7))
        };
        // Give the reservation back without a value (the select's value
        // expression panicked, say).
        let released = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(op)));
        assert!(released.is_err(), "dropping an uncompleted SelectedOperation panics");
        drop(sel);
        // The sender gets the freed room on its own (no receive helps).
        assert_eq!(sender.join().unwrap(), Ok(()));
        assert_eq!(rx.try_recv(), Ok(7));
        assert!(rx.try_recv().is_err());
    });
}

/// A hole (a reservation given back) before a live reservation on a full
/// ring, and a plain sender parked for room: a `try_recv` takes the hole,
/// which frees a slot, and stops at the reservation. The sender must get
/// the freed slot then, not when the reservation ends (here it ends only
/// after the sender has finished). Without the settle after a `Reserved`
/// pop that took holes, the sender sleeps next to the free slot (a
/// deadlock).
#[test]
fn loom_hole_taken_before_a_reservation_vs_parked_sender() {
    loom::model(|| {
        let (tx, rx) = bounded::<u32>(3);
        // A value at the head keeps the hole below from being skipped at
        // once.
        assert_eq!(tx.try_send(0), Ok(()));
        let mut first = Select::new();
        first.send(&tx);
        let given_back = first.select();
        let mut second = Select::new();
        second.send(&tx);
        let held = second.select();
        // The first reservation is given back behind the second: a hole.
        let released = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(given_back)));
        assert!(released.is_err(), "dropping an uncompleted SelectedOperation panics");
        drop(first);
        // Value 0, hole, reserved: take 0 and fill the ring again (hole,
        // reserved, value 4).
        assert_eq!(rx.try_recv(), Ok(0));
        assert_eq!(tx.try_send(4), Ok(()));
        let sender = {
            let tx = tx.clone();
            thread::spawn(move || tx.send(7))
        };
        // Takes the hole and stops at the live reservation.
        assert!(rx.try_recv().is_err());
        assert_eq!(sender.join().unwrap(), Ok(()));
        assert_eq!(held.send(&tx, 3), Ok(()));
        drop(second);
        assert_eq!(rx.try_recv(), Ok(3));
        assert_eq!(rx.try_recv(), Ok(4));
        assert_eq!(rx.try_recv(), Ok(7));
    });
}

/// The last receiver leaves while a plain send is between its claim and
/// its write: the receiver's drop waits for the write and drops the value
/// (the sender is still alive). Treating that busy position as the end
/// leaves the value in the ring.
#[test]
fn loom_last_receiver_drop_vs_plain_send() {
    loom::model(|| {
        let drops = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (tx, rx) = bounded::<Counted>(1);
        let dropper = thread::spawn(move || drop(rx));
        let _ = tx.try_send(Counted(drops.clone()));
        dropper.join().unwrap();
        assert_eq!(
            drops.load(std::sync::atomic::Ordering::Relaxed),
            1,
            "a value outlived the last receiver"
        );
        drop(tx);
    });
}

/// A select's send arm reserves a receiving select's node while that select
/// is still queueing its nodes, and makes the receiver's later arm ready
/// before it delivers: the receiving select loses that arm to the
/// reservation, parks (it must not wait for the delivery inside its
/// publish: a fiber cannot yield there, and the reserving side may need a
/// fiber of the same worker), and is woken by the delivery with exactly
/// the reserved value. Without the reservation's wake it sleeps for ever.
#[test]
fn loom_reservation_while_the_receiving_select_publishes() {
    loom::model(|| {
        let (s1, r1) = bounded::<u32>(0);
        let (late_tx, late_rx) = bounded::<u32>(1);
        let receiver = thread::spawn(move || {
            let mut sel = Select::new_biased();
            let first = sel.recv(&r1);
            let late = sel.recv(&late_rx);
            let oper = sel.select();
            let got = if oper.index() == first {
                oper.recv(&r1).unwrap()
            } else {
                assert_eq!(oper.index(), late);
                oper.recv(&late_rx).unwrap() + 100
            };
            (got, late_rx.try_recv().ok())
        });
        let mut sel = Select::new();
        let send = sel.send(&s1);
        let oper = sel.select();
        assert_eq!(oper.index(), send);
        // The value is computed after the choice: here it makes the other
        // arm ready first.
        late_tx.send(1).unwrap();
        oper.send(&s1, 5).unwrap();
        let (got, left) = receiver.join().unwrap();
        assert_eq!((got, left), (5, Some(1)), "the reserved arm wins; the late value stays");
    });
}
