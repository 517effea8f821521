//! Adversarial: many selects parked on a send arm of one channel, the
//! common `select! { send(tx, v), recv(quit) }` producer. Each freed slot
//! (or, on a rendezvous channel, each waiting receiver) woke every parked
//! send arm; one sent and the rest parked again, so n producers cost n
//! wakes per message (1,000 producers and a consumer that pauses: about
//! 1,000 parks per message). Now a send arm is woken per unit of room,
//! and a woken select that takes another arm offers the room on.

use fiber::chan::{bounded, Select};

use crate::common::{ms, within};

/// `n` producers each send one value through a select (a send arm on
/// `tx`, a receive arm on `quit`); the consumer takes them all, pausing
/// 1 ms after each, from a channel of capacity `cap` (0: rendezvous).
/// Returns the parks per message during the drain.
fn parks_per_message(n: usize, cap: usize) -> f64 {
    let rt = crate::common::rt_fixed_grace(2, ms(300));
    let (tx, rx) = bounded::<usize>(cap);
    let (quit_tx, quit_rx) = bounded::<()>(0);
    for _ in 0..cap {
        // Full: every producer parks.
        tx.send(usize::MAX).unwrap();
    }
    for i in 0..n {
        let (tx, quit_rx) = (tx.clone(), quit_rx.clone());
        rt.spawn(move || {
            let mut sel = Select::new();
            let s = sel.send(&tx);
            let _q = sel.recv(&quit_rx);
            let op = sel.select();
            if op.index() == s {
                op.send(&tx, i).unwrap();
            } else {
                let _ = op.recv(&quit_rx);
            }
        });
    }
    crate::common::wait_parked(&rt, n);
    let before = rt.stats().parks;
    let got = rt.block_on(move || {
        let mut got = Vec::new();
        for _ in 0..n + cap {
            got.push(rx.recv().unwrap());
            fiber::sleep(ms(1)).unwrap();
        }
        got
    });
    let parks = rt.stats().parks - before;
    drop(quit_tx);
    let mut sent: Vec<_> = got.into_iter().filter(|&v| v != usize::MAX).collect();
    sent.sort_unstable();
    assert_eq!(sent, (0..n).collect::<Vec<_>>(), "every producer's value arrived once");
    parks as f64 / n as f64
}

#[test]
fn a_freed_slot_wakes_one_select_sender_not_all() {
    within(120, || {
        for cap in [1, 0] {
            let per = parks_per_message(400, cap);
            // The consumer's own sleep and receive park about twice per
            // message; a herd parked every other producer again (about
            // 400 per message here).
            assert!(
                per < 20.0,
                "capacity {cap}: {per:.1} parks per message with 400 select senders"
            );
        }
    });
}

/// Two selects wait to send on a full channel of capacity one; the first
/// also has a receive arm. The consumer takes the buffered value (which
/// wakes one send arm) and at once makes the first select's receive arm
/// ready. If the woken select takes that arm, the freed slot must still
/// reach the other select: its send fits in the buffer, and nothing else
/// will wake it (the consumer does not receive again; it joins).
#[test]
fn a_woken_select_that_takes_another_arm_passes_the_room_on() {
    within(60, || {
        let rt = crate::common::rt_fixed_grace(1, ms(300));
        let mut passed_on = 0;
        for round in 0..200 {
            let (tx, rx) = bounded::<u32>(1);
            let (quit_tx, quit_rx) = bounded::<()>(1);
            tx.send(0).unwrap();
            let (tx1, tx2) = (tx.clone(), tx.clone());
            let first = rt.spawn(move || {
                let mut sel = Select::new();
                let s = sel.send(&tx1);
                let _q = sel.recv(&quit_rx);
                let op = sel.select();
                if op.index() == s {
                    op.send(&tx1, 1).unwrap();
                    true
                } else {
                    op.recv(&quit_rx).unwrap();
                    false
                }
            });
            let second = rt.spawn(move || {
                let mut sel = Select::new();
                let _s = sel.send(&tx2);
                let op = sel.select();
                op.send(&tx2, 2).unwrap();
            });
            crate::common::wait_parked(&rt, 2);
            let (rx, first_sent) = rt.block_on(move || {
                assert_eq!(rx.recv().unwrap(), 0);
                quit_tx.send(()).unwrap();
                let first_sent = first.join().unwrap();
                if first_sent {
                    // The slot went to the first select: make room again.
                    assert_eq!(rx.recv().unwrap(), 1, "round {round}");
                }
                // Hangs here if the freed slot reached nobody who sends.
                second.join().unwrap();
                (rx, first_sent)
            });
            passed_on += usize::from(!first_sent);
            assert_eq!(rx.try_recv(), Ok(2), "round {round}");
        }
        assert!(passed_on > 0, "the first select never took its receive arm");
    });
}
