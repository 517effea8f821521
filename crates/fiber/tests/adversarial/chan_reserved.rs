//! Adversarial: a buffered channel whose head slot is reserved by a
//! select's send arm that is still computing its value (its expression
//! parks). Two defects, found by reading `fiber-chan`:
//!
//! * a `select!` receive counted a parked plain sender as "ready" although
//!   the full ring had no room to move its value into, so it retried
//!   without ever parking or yielding: on one worker the reserving fiber
//!   never ran again (a hang), elsewhere a core burned until it did;
//! * a receive that took a hole (a reservation given back) and then met a
//!   reserved slot freed that slot but told nobody, so a parked sender
//!   slept next to free room until the reservation ended, user code that
//!   may be waiting for that very sender.

use fiber::chan::{bounded, select};
use std::sync::mpsc;

use crate::common::{ms, rt1, rt2, wait_parked, within};

/// One worker: a select's send arm reserves the only slot of a full
/// `bounded(1)` and parks in its value expression, a plain sender parks
/// behind it, and a third fiber selects on the receive side. The receive
/// must park (nothing can be taken until the reservation is filled), so
/// the reserving fiber gets the worker back and fills its slot.
// Failed before the fix: hang: the receiving select spins on the only worker, the reserving fiber never runs again
#[test]
fn a_select_receive_behind_a_reserved_head_parks_instead_of_spinning() {
    within(20, || {
        let rt = rt1();
        let (tx, rx) = bounded::<u32>(1);
        let (gate_tx, gate_rx) = bounded::<()>(0);
        let reserver = {
            let tx = tx.clone();
            rt.spawn(move || {
                select! {
                    send(tx, { gate_rx.recv().unwrap(); 1 }) -> r => r.unwrap(),
                }
            })
        };
        wait_parked(&rt, 1);
        let parked_sender = {
            let tx = tx.clone();
            rt.spawn(move || tx.send(2).unwrap())
        };
        wait_parked(&rt, 2);
        let receiver = {
            let rx = rx.clone();
            rt.spawn(move || {
                select! {
                    recv(rx) -> v => v.unwrap(),
                }
            })
        };
        wait_parked(&rt, 3);
        gate_tx.send(()).unwrap();
        assert_eq!(receiver.join().unwrap(), 1, "the reserved slot's value comes first");
        reserver.join().unwrap();
        parked_sender.join().unwrap();
        assert_eq!(rx.recv().unwrap(), 2);
    });
}

/// A select's send arm value that never comes: the expression panics.
fn explode() -> u32 {
    panic!("a value expression that panics")
}

/// `bounded(3)`: a hole (a select's send arm whose expression panicked
/// gave its slot back) sits before a reserved slot (a second select still
/// computing), and the ring is full. A sender parks. A `try_recv` takes
/// the hole, which frees a slot, and stops at the reservation: the parked
/// sender must move into the freed slot now, not when the reservation
/// ends (here it ends only after the sender is seen to finish).
// Failed before the fix: the parked sender stayed parked next to the freed slot until the reservation ended
#[test]
fn a_receive_that_frees_a_hole_before_a_reservation_lets_a_parked_sender_in() {
    within(20, || {
        let rt = rt2();
        let (tx, rx) = bounded::<u32>(3);
        tx.send(0).unwrap();
        let (a_gate_tx, a_gate_rx) = bounded::<()>(0);
        let (b_gate_tx, b_gate_rx) = bounded::<()>(0);
        let giver_back = {
            let tx = tx.clone();
            rt.spawn(move || {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    select! {
                        send(tx, { a_gate_rx.recv().unwrap(); explode() }) -> _ => {},
                    }
                }))
                .is_err()
            })
        };
        wait_parked(&rt, 1);
        let reserver = {
            let tx = tx.clone();
            rt.spawn(move || {
                select! {
                    send(tx, { b_gate_rx.recv().unwrap(); 3 }) -> r => r.unwrap(),
                }
            })
        };
        wait_parked(&rt, 2);
        a_gate_tx.send(()).unwrap();
        assert!(giver_back.join().unwrap(), "the value expression panicked");
        // Ring: value 0, hole, reserved. Take 0 and fill the free slot:
        // hole, reserved, value 4 (full).
        assert_eq!(rx.try_recv(), Ok(0));
        tx.send(4).unwrap();
        let (sent_tx, sent_rx) = mpsc::channel();
        let sender = {
            let tx = tx.clone();
            rt.spawn(move || {
                tx.send(5).unwrap();
                sent_tx.send(()).unwrap();
            })
        };
        wait_parked(&rt, 2);
        // Takes the hole (a slot frees) and stops at the reservation.
        assert!(rx.try_recv().is_err(), "nothing to take before the reservation");
        let moved_in = sent_rx.recv_timeout(ms(5_000)).is_ok();
        b_gate_tx.send(()).unwrap();
        reserver.join().unwrap();
        sender.join().unwrap();
        assert!(
            moved_in,
            "the parked sender stayed parked next to the freed slot until the reservation ended"
        );
        let got: Vec<u32> = (0..3).map(|_| rx.recv().unwrap()).collect();
        assert_eq!(got, vec![3, 4, 5]);
    });
}
