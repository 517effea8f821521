use crate::common::*;

// Adversarial review, round 57: fiber channels and `select!`
// (crates/fiber-chan, re-exported as `fiber::chan`), against the
// documented behaviour of crossbeam-channel and of Go channels.
//
// Attacked here: rendezvous hand-offs by zero-time sends, capacity
// exactness across many laps of the ring, `Duration::ZERO` /
// `Duration::MAX` / past deadlines, `tick(0)` and `after(0)`, fairness of
// `select!` between a due timer, a closed channel and always-ready
// channels, two selects with a send and a receive arm each on one
// rendezvous channel (they must pair up), values never lost or
// duplicated when a select loses a race or a timeout fires with a send,
// drops of values left in a channel, and a runtime shutdown while fibers
// are parked in send, receive and select with plain threads on the other
// side.
//
// Expected: what spec/chan.md, the rustdoc of fiber-chan and the
// documentation of crossbeam-channel / Go promise.

use crate::common::shutdown::{counter, Tracked};
use fiber::chan::{
    self, after, bounded, tick, unbounded, RecvTimeoutError, Select, SendError, SendTimeoutError, TryRecvError,
    TrySendError,
};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Run `f` on a plain thread and as the root fiber of a runtime, each
/// under a hang guard.
fn both(f: fn()) {
    within(60, f);
    on_runtime(f);
}

/// Wait (a fiber sleeps, a thread sleeps) until `(receivers, senders)`
/// are parked on the channel of `tx`.
fn wait_waiting<T>(tx: &chan::Sender<T>, receivers: usize, senders: usize) {
    let start = Instant::now();
    while tx.waiting() != (receivers, senders) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "peers never parked: {:?}",
            tx.waiting()
        );
        if fiber::core::in_fiber() {
            fiber::sleep(ms(1)).unwrap();
        } else {
            std::thread::sleep(ms(1));
        }
    }
}

/// Spawn `f` on a plain thread or as a fiber (`fiber`), and return a
/// joiner.
fn spawn_peer<T: Send + 'static>(fiber: bool, f: impl FnOnce() -> T + Send + 'static) -> Box<dyn FnOnce() -> T> {
    if fiber {
        let h = fiber::spawn(f);
        Box::new(move || h.join().unwrap())
    } else {
        let h = std::thread::spawn(f);
        Box::new(move || h.join().unwrap())
    }
}

// ---------------------------------------------------------------------------
// (a) Rendezvous: zero-time sends and receives meet parked peers.

/// crossbeam: "If the channel is ... zero-capacity, this method waits
/// until the message is received" - `send_timeout(v, 0)` hands over to a
/// receiver already waiting, and times out (value back, nothing left in
/// the channel) when none waits.
#[test]
fn rendezvous_zero_time_sends_hand_over_to_a_parked_receiver_and_leave_nothing_otherwise() {
    both(|| {
        for peer_is_fiber in [false, true] {
            if peer_is_fiber && !fiber::core::in_fiber() {
                continue;
            }
            let (tx, rx) = bounded::<u32>(0);
            // Nobody waits: every zero-time form fails with its value.
            assert_eq!(tx.send_timeout(1, Duration::ZERO), Err(SendTimeoutError::Timeout(1)));
            assert_eq!(tx.send_deadline(2, Instant::now()), Err(SendTimeoutError::Timeout(2)));
            assert_eq!(tx.try_send(3), Err(TrySendError::Full(3)));
            assert_eq!(
                rx.try_recv(),
                Err(TryRecvError::Empty),
                "a failed send left a value behind"
            );

            // A parked plain receiver takes each zero-time send.
            for (i, how) in ["send_timeout", "send_deadline", "try_send"].into_iter().enumerate() {
                let rx2 = rx.clone();
                let join = spawn_peer(peer_is_fiber, move || rx2.recv());
                wait_waiting(&tx, 1, 0);
                let v = 10 + i as u32;
                let r = match how {
                    "send_timeout" => tx.send_timeout(v, Duration::ZERO).map_err(|e| e.into_inner()),
                    "send_deadline" => tx.send_deadline(v, Instant::now()).map_err(|e| e.into_inner()),
                    _ => tx.try_send(v).map_err(|e| e.into_inner()),
                };
                assert_eq!(
                    r,
                    Ok(()),
                    "{how} to a parked receiver failed (peer fiber: {peer_is_fiber})"
                );
                assert_eq!(join(), Ok(v));
            }

            // A select parked on a receive arm takes a zero-time send too.
            let rx2 = rx.clone();
            let join = spawn_peer(peer_is_fiber, move || {
                let (_keep, never_rx) = bounded::<u32>(0);
                fiber::select! {
                    recv(rx2) -> v => v.ok(),
                    recv(never_rx) -> _ => None,
                }
            });
            wait_waiting(&tx, 1, 0);
            assert_eq!(tx.send_timeout(77, Duration::ZERO), Ok(()));
            assert_eq!(join(), Some(77));
        }
    });
}

/// The mirror: zero-time receives take a parked sender's value; with no
/// sender they time out; on a disconnected channel they are
/// `Disconnected`, not `Timeout` (crossbeam).
#[test]
fn rendezvous_zero_time_receives_take_a_parked_senders_value() {
    both(|| {
        let (tx, rx) = bounded::<u32>(0);
        assert_eq!(rx.recv_timeout(Duration::ZERO), Err(RecvTimeoutError::Timeout));
        assert_eq!(rx.recv_deadline(Instant::now()), Err(RecvTimeoutError::Timeout));
        for i in 0..3u32 {
            let tx2 = tx.clone();
            let t = std::thread::spawn(move || tx2.send(i));
            wait_waiting(&tx, 0, 1);
            let got = match i {
                0 => rx.recv_timeout(Duration::ZERO),
                1 => rx.recv_deadline(Instant::now()),
                _ => rx.try_recv().map_err(|_| RecvTimeoutError::Timeout),
            };
            assert_eq!(got, Ok(i));
            assert_eq!(t.join().unwrap(), Ok(()));
        }
        drop(tx);
        assert_eq!(rx.recv_timeout(Duration::ZERO), Err(RecvTimeoutError::Disconnected));
        assert_eq!(rx.recv_deadline(Instant::now()), Err(RecvTimeoutError::Disconnected));
        assert_eq!(rx.recv_timeout(Duration::MAX), Err(RecvTimeoutError::Disconnected));
    });
}

/// `try_iter` on a rendezvous channel takes the values of parked senders
/// (each `try_recv` takes one) and stops at the first miss.
#[test]
fn try_iter_on_a_rendezvous_channel_takes_each_parked_senders_value_once() {
    both(|| {
        let (tx, rx) = bounded::<u32>(0);
        let threads: Vec<_> = (0..3u32)
            .map(|i| {
                let tx = tx.clone();
                std::thread::spawn(move || tx.send(i))
            })
            .collect();
        wait_waiting(&tx, 0, 3);
        let mut got: Vec<u32> = rx.try_iter().collect();
        got.sort_unstable();
        assert_eq!(got, [0, 1, 2]);
        for t in threads {
            assert_eq!(t.join().unwrap(), Ok(()));
        }
        assert_eq!(rx.try_iter().count(), 0);
        assert_eq!(tx.len(), 0);
        assert!(
            tx.is_full() && tx.is_empty(),
            "a rendezvous channel is always empty and full"
        );
    });
}

// ---------------------------------------------------------------------------
// (b) Capacity exactness.

/// `bounded(n)` holds exactly `n` values, lap after lap of its ring, for
/// capacities on either side of a power of two; `len`, `is_full`,
/// `is_empty` agree with the count, and the order is FIFO.
#[test]
fn bounded_capacity_is_exact_lap_after_lap() {
    both(|| {
        for cap in [1usize, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 63] {
            let (tx, rx) = bounded::<usize>(cap);
            assert_eq!(tx.capacity(), Some(cap));
            let mut next_in = 0usize;
            let mut next_out = 0usize;
            for round in 0..(4 * cap + 11) {
                // Fill to the brim.
                while tx.try_send(next_in).is_ok() {
                    next_in += 1;
                }
                assert_eq!(
                    next_in - next_out,
                    cap,
                    "cap {cap} round {round}: held a different count"
                );
                assert_eq!(tx.len(), cap);
                assert_eq!(rx.len(), cap);
                assert!(tx.is_full() && rx.is_full() && !rx.is_empty());
                assert!(matches!(tx.try_send(usize::MAX), Err(TrySendError::Full(usize::MAX))));
                assert_eq!(
                    tx.send_timeout(usize::MAX, Duration::ZERO),
                    Err(SendTimeoutError::Timeout(usize::MAX))
                );
                // Take a varying number out.
                let take = 1 + round % cap;
                for _ in 0..take {
                    assert_eq!(rx.try_recv(), Ok(next_out), "cap {cap}: FIFO broken");
                    next_out += 1;
                }
                assert_eq!(rx.len(), cap - take);
                assert_eq!(rx.is_full(), take == 0);
            }
            // Drain: the channel ends empty.
            while let Ok(v) = rx.try_recv() {
                assert_eq!(v, next_out);
                next_out += 1;
            }
            assert_eq!(next_out, next_in);
            assert_eq!(rx.len(), 0);
            assert!(rx.is_empty() && !rx.is_full());
        }
    });
}

/// Parked senders beyond the capacity are admitted one per freed slot:
/// a receive of one value lets exactly one parked sender in, and `len`
/// never goes over the capacity.
#[test]
fn a_freed_slot_admits_exactly_one_parked_sender() {
    on_runtime(|| {
        let (tx, rx) = bounded::<u32>(2);
        tx.send(0).unwrap();
        tx.send(1).unwrap();
        let senders: Vec<_> = (2..6u32)
            .map(|i| {
                let tx = tx.clone();
                std::thread::spawn(move || tx.send(i))
            })
            .collect();
        wait_waiting(&tx, 0, 4);
        for round in 0..4usize {
            let v = rx.recv().unwrap();
            assert!(v < 6);
            // One sender gets in: the channel is full again, three (two,
            // ...) still wait.
            wait_waiting(&tx, 0, 3 - round);
            assert_eq!(
                tx.len(),
                2,
                "round {round}: len {} over or under the capacity",
                tx.len()
            );
        }
        let mut rest: Vec<u32> = vec![rx.recv().unwrap(), rx.recv().unwrap()];
        rest.sort_unstable();
        assert!(rx.try_recv().is_err());
        for s in senders {
            assert_eq!(s.join().unwrap(), Ok(()));
        }
        assert_eq!(rx.len(), 0);
    });
}

// ---------------------------------------------------------------------------
// (c) Duration::MAX, past deadlines, disconnection while waiting.

/// A wait of `Duration::MAX` waits (no overflow panic, no instant
/// timeout) and ends with `Disconnected`, the value back for a send, when
/// the other side leaves.
#[test]
fn duration_max_waits_end_with_disconnected_when_the_other_side_leaves() {
    both(|| {
        let (tx, rx) = unbounded::<u32>();
        let t = std::thread::spawn(move || {
            std::thread::sleep(ms(20));
            drop(tx);
        });
        assert_eq!(rx.recv_timeout(Duration::MAX), Err(RecvTimeoutError::Disconnected));
        t.join().unwrap();

        let (tx, rx) = bounded::<u32>(1);
        tx.send(1).unwrap();
        let t = std::thread::spawn(move || {
            std::thread::sleep(ms(20));
            drop(rx);
        });
        assert_eq!(
            tx.send_timeout(2, Duration::MAX),
            Err(SendTimeoutError::Disconnected(2))
        );
        t.join().unwrap();

        let (tx, rx) = bounded::<u32>(0);
        let t = std::thread::spawn(move || {
            std::thread::sleep(ms(20));
            drop(rx);
        });
        assert_eq!(
            tx.send_timeout(3, Duration::MAX),
            Err(SendTimeoutError::Disconnected(3))
        );
        t.join().unwrap();

        // And a value arriving ends it with the value.
        let (tx, rx) = bounded::<u32>(0);
        let t = std::thread::spawn(move || {
            std::thread::sleep(ms(20));
            tx.send(9)
        });
        assert_eq!(rx.recv_timeout(Duration::MAX), Ok(9));
        assert_eq!(t.join().unwrap(), Ok(()));
    });
}

/// Deadlines already in the past: a send that has room or a waiting
/// receiver succeeds, a receive with a value takes it, a full / empty
/// channel times out, a disconnected one reports `Disconnected`
/// (crossbeam's rules for `*_deadline`).
#[test]
fn deadlines_in_the_past_poll_once() {
    both(|| {
        let past = Instant::now();
        std::thread::sleep(ms(2));
        for cap in [Some(1usize), Some(3), None] {
            let (tx, rx) = match cap {
                Some(c) => bounded::<u32>(c),
                None => unbounded(),
            };
            assert_eq!(rx.recv_deadline(past), Err(RecvTimeoutError::Timeout));
            assert_eq!(
                tx.send_deadline(1, past),
                Ok(()),
                "{cap:?}: room, yet a past deadline failed"
            );
            if cap == Some(1) {
                assert_eq!(tx.send_deadline(2, past), Err(SendTimeoutError::Timeout(2)));
            }
            assert_eq!(rx.recv_deadline(past), Ok(1));
            drop(rx);
            assert_eq!(tx.send_deadline(3, past), Err(SendTimeoutError::Disconnected(3)));
            let (tx, rx) = match cap {
                Some(c) => bounded::<u32>(c),
                None => unbounded(),
            };
            tx.send(5).unwrap();
            drop(tx);
            assert_eq!(
                rx.recv_deadline(past),
                Ok(5),
                "{cap:?}: a buffered value after the close"
            );
            assert_eq!(rx.recv_deadline(past), Err(RecvTimeoutError::Disconnected));
        }
    });
}

// ---------------------------------------------------------------------------
// (d) Timer channels at the edges.

/// crossbeam's `tick(Duration::ZERO)`: every receive gets a message at
/// once (the next delivery is due "now" again); `try_recv` too.
#[test]
fn tick_zero_delivers_on_every_receive() {
    both(|| {
        let t = tick(Duration::ZERO);
        for _ in 0..500 {
            t.recv().unwrap();
        }
        for _ in 0..500 {
            assert!(t.try_recv().is_ok(), "tick(0) had nothing for a try_recv");
        }
        for _ in 0..100 {
            let got = fiber::select! {
                recv(t) -> v => v.is_ok(),
                default => false,
            };
            assert!(got, "a select with default missed a tick(0) message");
        }
    });
}

/// `after(0)` delivers exactly one message (however it is received),
/// then behaves as `never`: nothing more, and it never disconnects.
#[test]
fn after_zero_delivers_once_then_nothing() {
    both(|| {
        let start = Instant::now();
        let a = after(Duration::ZERO);
        let b = a.clone();
        assert_eq!(a.len(), 1);
        let first = a.recv().unwrap();
        assert!(first >= start && first <= Instant::now());
        assert_eq!(
            b.try_recv(),
            Err(TryRecvError::Empty),
            "a clone delivered the message twice"
        );
        assert_eq!(b.recv_timeout(ms(10)), Err(RecvTimeoutError::Timeout));
        assert!(a.is_empty() && !a.is_full());
        let took = fiber::select! {
            recv(a) -> _ => true,
            default(ms(10)) => false,
        };
        assert!(!took, "after(0) delivered twice in a select");
    });
}

// ---------------------------------------------------------------------------
// (e) Select fairness.

/// A due `tick` arm is taken next to a channel that is always ready: each
/// select picks uniformly among ready arms (spec/chan.md section 4, step
/// 1), so the tick is not starved. The test needs 20 ticks; starvation
/// hangs it.
#[test]
fn a_due_tick_is_not_starved_by_an_always_ready_channel() {
    both(|| {
        let (tx, rx) = unbounded::<u32>();
        let t = tick(ms(1));
        let (mut ticks, mut values) = (0u32, 0u32);
        while ticks < 20 {
            if rx.is_empty() {
                for i in 0..64 {
                    tx.send(i).unwrap();
                }
            }
            fiber::select! {
                recv(rx) -> v => { v.unwrap(); values += 1; }
                recv(t) -> v => { v.unwrap(); ticks += 1; }
            }
        }
        assert!(values > 0);
    });
}

/// A closed channel's receive arm is ready (it fails at once, crossbeam
/// and Go); next to an always-ready channel each is picked about half the
/// time, so neither starves.
#[test]
fn a_closed_arm_and_a_ready_arm_are_both_taken() {
    both(|| {
        let (tx, rx) = unbounded::<u32>();
        let (ctx, crx) = unbounded::<u32>();
        drop(ctx);
        let (mut closed, mut values) = (0u32, 0u32);
        for i in 0..400 {
            tx.send(i).unwrap();
            fiber::select! {
                recv(rx) -> v => { assert_eq!(v, Ok(i)); values += 1; }
                recv(crx) -> v => { assert!(v.is_err()); closed += 1; assert_eq!(rx.recv(), Ok(i)); }
            }
        }
        assert!(
            closed >= 100 && values >= 100,
            "closed {closed}, values {values} of 400"
        );
    });
}

/// The same channel in two receive arms and in two send arms: both arms of
/// each pair are taken, and every value arrives exactly once.
#[test]
fn the_same_channel_in_two_arms_splits_evenly_and_loses_nothing() {
    both(|| {
        let (tx, rx) = unbounded::<u32>();
        let (mut first, mut second) = (0u32, 0u32);
        for i in 0..400u32 {
            fiber::select! {
                send(tx, 2 * i) -> r => { r.unwrap(); first += 1; }
                send(tx, 2 * i + 1) -> r => { r.unwrap(); second += 1; }
            }
        }
        assert!(first >= 100 && second >= 100, "send arms: {first} / {second}");
        let (mut a, mut b) = (0u32, 0u32);
        let mut seen = Vec::new();
        for _ in 0..400 {
            fiber::select! {
                recv(rx) -> v => { seen.push(v.unwrap()); a += 1; }
                recv(rx) -> v => { seen.push(v.unwrap()); b += 1; }
            }
        }
        assert!(a >= 100 && b >= 100, "recv arms: {a} / {b}");
        assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
        for (i, v) in seen.into_iter().enumerate() {
            assert_eq!(v / 2, i as u32, "a value lost, duplicated or out of order");
        }
    });
}

// ---------------------------------------------------------------------------
// (f) Two selects meeting on one rendezvous channel.

/// Two parties each run `select! { send(tx, me), recv(rx) }` on the same
/// rendezvous channel: a select never pairs with itself, so each round one
/// party's send arm must meet the other party's receive arm (crossbeam's
/// "send_or_receive" pattern with two parties). Round k of one pairs with
/// round k of the other, so both finish every round, and each receives
/// exactly the other's values. Fibers and threads, mixed.
#[test]
fn two_selects_with_a_send_and_a_receive_arm_on_one_rendezvous_channel_pair_up() {
    for (a_fiber, b_fiber) in [(false, false), (true, true), (true, false)] {
        within(60, move || {
            let rt = rt();
            let (tx, rx) = bounded::<u32>(0);
            let party = move |me: u32, tx: chan::Sender<u32>, rx: chan::Receiver<u32>| {
                move || {
                    let (mut sent, mut got) = (0u32, Vec::new());
                    for _ in 0..300 {
                        fiber::select! {
                            send(tx, me) -> r => { r.unwrap(); sent += 1; }
                            recv(rx) -> v => got.push(v.unwrap()),
                        }
                    }
                    (sent, got)
                }
            };
            let fa = party(1, tx.clone(), rx.clone());
            let fb = party(2, tx.clone(), rx.clone());
            drop((tx, rx));
            let ha: Box<dyn FnOnce() -> (u32, Vec<u32>) + Send> = if a_fiber {
                let h = rt.spawn(fa);
                Box::new(move || h.join().unwrap())
            } else {
                let h = std::thread::spawn(fa);
                Box::new(move || h.join().unwrap())
            };
            let hb: Box<dyn FnOnce() -> (u32, Vec<u32>) + Send> = if b_fiber {
                let h = rt.spawn(fb);
                Box::new(move || h.join().unwrap())
            } else {
                let h = std::thread::spawn(fb);
                Box::new(move || h.join().unwrap())
            };
            let (sa, ga) = ha();
            let (sb, gb) = hb();
            assert!(ga.iter().all(|&v| v == 2), "a party received its own value");
            assert!(gb.iter().all(|&v| v == 1), "a party received its own value");
            assert_eq!(sa as usize, gb.len());
            assert_eq!(sb as usize, ga.len());
            assert_eq!(sa + sb, 300);
        });
    }
}

// ---------------------------------------------------------------------------
// (g) No value lost or duplicated when a select loses a race or a timeout
// fires together with a send.

/// Producers (threads and fibers) `send_timeout` on two rendezvous
/// channels with tiny timeouts; a consumer selects over both with a
/// `default(1 ms)` timeout. Every send that returned `Ok` is received
/// exactly once; every other value came back in its error.
#[test]
fn a_select_timing_out_together_with_sends_loses_and_duplicates_nothing() {
    within(60, || {
        let rt = rt();
        let (ta, ra) = bounded::<u32>(0);
        let (tb, rb) = bounded::<u32>(0);
        let stop = Arc::new(AtomicBool::new(false));
        let consumer = {
            let stop = stop.clone();
            rt.spawn(move || {
                let mut got = Vec::new();
                while !stop.load(SeqCst) {
                    fiber::select! {
                        // Err: every producer is done (disconnected).
                        recv(ra) -> v => got.extend(v.ok()),
                        recv(rb) -> v => got.extend(v.ok()),
                        default(ms(1)) => {}
                    }
                }
                // Drain what a producer still hands over.
                while let Ok(v) = ra.recv_timeout(ms(20)) {
                    got.push(v);
                }
                while let Ok(v) = rb.recv_timeout(ms(20)) {
                    got.push(v);
                }
                got
            })
        };
        let producer = move |base: u32, ta: chan::Sender<u32>, tb: chan::Sender<u32>| {
            move || {
                let mut ok = Vec::new();
                for i in 0..400u32 {
                    let v = base + i;
                    let s = if i % 2 == 0 { &ta } else { &tb };
                    match s.send_timeout(v, Duration::from_micros(u64::from(i % 7) * 150)) {
                        Ok(()) => ok.push(v),
                        Err(e) => assert_eq!(e.into_inner(), v, "a failed send lost its value"),
                    }
                }
                ok
            }
        };
        let p1 = std::thread::spawn(producer(0, ta.clone(), tb.clone()));
        let p2 = rt.spawn(producer(10_000, ta.clone(), tb.clone()));
        let p3 = rt.spawn(producer(20_000, ta, tb));
        let mut sent = p1.join().unwrap();
        sent.extend(p2.join().unwrap());
        sent.extend(p3.join().unwrap());
        stop.store(true, SeqCst);
        let mut got = consumer.join().unwrap();
        sent.sort_unstable();
        got.sort_unstable();
        assert_eq!(got, sent, "received values differ from the sends that succeeded");
        assert!(!sent.is_empty());
    });
}

/// `recv_timeout` racing `send_timeout` on a rendezvous channel, both with
/// the same tiny timeouts, between a fiber and a thread: a value is
/// received iff its send returned `Ok`.
#[test]
fn racing_timeouts_on_a_rendezvous_channel_agree_on_every_value() {
    within(60, || {
        let rt = rt();
        let (tx, rx) = bounded::<u32>(0);
        let received = rt.spawn(move || {
            let mut got = Vec::new();
            loop {
                match rx.recv_timeout(Duration::from_micros(200)) {
                    Ok(v) => got.push(v),
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => return got,
                }
            }
        });
        let mut ok = Vec::new();
        for i in 0..3000u32 {
            if tx.send_timeout(i, Duration::from_micros(200)).is_ok() {
                ok.push(i);
            }
        }
        drop(tx);
        assert_eq!(received.join().unwrap(), ok);
    });
}

/// A select whose receive arms lose every race to a plain receiver on the
/// same channels takes nothing twice: each value reaches exactly one of
/// them.
#[test]
fn a_select_and_plain_receivers_racing_for_values_split_them_exactly() {
    within(60, || {
        let rt = rt();
        let (ta, ra) = bounded::<u32>(1);
        let (tb, rb) = bounded::<u32>(0);
        let n = 3000u32;
        let sel = {
            let (ra, rb) = (ra.clone(), rb.clone());
            rt.spawn(move || {
                let mut got = Vec::new();
                loop {
                    fiber::select! {
                        recv(ra) -> v => match v { Ok(v) => got.push(v), Err(_) => break },
                        recv(rb) -> v => match v { Ok(v) => got.push(v), Err(_) => break },
                    }
                }
                // One channel is closed; drain the other.
                got.extend(ra.iter());
                got.extend(rb.iter());
                got
            })
        };
        let plain_a = std::thread::spawn(move || ra.iter().collect::<Vec<_>>());
        let plain_b = rt.spawn(move || rb.iter().collect::<Vec<_>>());
        let p1 = std::thread::spawn(move || {
            for i in 0..n {
                ta.send(i).unwrap();
            }
        });
        let p2 = rt.spawn(move || {
            for i in n..2 * n {
                tb.send(i).unwrap();
            }
        });
        p1.join().unwrap();
        p2.join().unwrap();
        let mut all = sel.join().unwrap();
        all.extend(plain_a.join().unwrap());
        all.extend(plain_b.join().unwrap());
        all.sort_unstable();
        assert_eq!(all, (0..2 * n).collect::<Vec<_>>());
    });
}

/// More than the 8 operations a `Select` keeps inline: with every
/// operation ready, each is taken; with none ready, a value on the last
/// one wakes the parked select, which returns that operation.
#[test]
fn a_select_of_many_operations_is_fair_and_wakes_on_any() {
    both(|| {
        const N: usize = 12;
        let chans: Vec<_> = (0..N).map(|_| unbounded::<usize>()).collect();
        let mut hits = [0u32; N];
        for round in 0..(N * 150) {
            for (i, (tx, _)) in chans.iter().enumerate() {
                if tx.is_empty() {
                    tx.send(i).unwrap();
                }
            }
            let mut sel = Select::new();
            for (_, rx) in &chans {
                sel.recv(rx);
            }
            let op = sel.select();
            let i = op.index();
            assert_eq!(op.recv(&chans[i].1), Ok(i), "round {round}");
            hits[i] += 1;
        }
        assert!(hits.iter().all(|&h| h >= 40), "an operation starved: {hits:?}");
        // Drain, then wake a parked select through each index in turn.
        for (_, rx) in &chans {
            while rx.try_recv().is_ok() {}
        }
        for target in [N - 1, 0, N / 2] {
            let tx = chans[target].0.clone();
            let feeder = std::thread::spawn(move || {
                std::thread::sleep(ms(5));
                tx.send(1000 + target).unwrap();
            });
            let mut sel = Select::new();
            for (_, rx) in &chans {
                sel.recv(rx);
            }
            let op = sel.select();
            assert_eq!(op.index(), target);
            assert_eq!(op.recv(&chans[target].1), Ok(1000 + target));
            feeder.join().unwrap();
        }
    });
}

// ---------------------------------------------------------------------------
// (h) Values left in a channel are dropped exactly once.

/// Every flavour: dropping a receiver clone drops nothing; the last
/// receiver drops what is buffered at once (crossbeam), even while
/// senders live; values sent afterwards come back in the error and are
/// dropped by the caller; nothing is dropped twice when the senders go.
#[test]
fn values_left_in_a_channel_are_dropped_once_by_the_last_receiver() {
    both(|| {
        for cap in [None, Some(1usize), Some(4), Some(64)] {
            let drops = counter();
            let (tx, rx) = match cap {
                Some(c) => bounded::<Tracked>(c),
                None => unbounded(),
            };
            let n = cap.unwrap_or(10);
            for _ in 0..n {
                tx.send(Tracked(drops.clone())).unwrap();
            }
            let rx2 = rx.clone();
            drop(rx);
            assert_eq!(drops.load(SeqCst), 0, "{cap:?}: a receiver clone's drop dropped values");
            assert_eq!(rx2.len(), n);
            drop(rx2.recv().unwrap());
            assert_eq!(drops.load(SeqCst), 1);
            drop(rx2);
            assert_eq!(
                drops.load(SeqCst),
                n,
                "{cap:?}: the last receiver left values undropped"
            );
            let back = tx.send(Tracked(drops.clone())).unwrap_err();
            assert_eq!(drops.load(SeqCst), n);
            drop(back);
            assert_eq!(drops.load(SeqCst), n + 1);
            let back = tx.try_send(Tracked(drops.clone())).unwrap_err();
            assert!(back.is_disconnected());
            drop(back);
            drop(tx);
            assert_eq!(drops.load(SeqCst), n + 2, "{cap:?}: a value dropped twice");
        }
    });
}

/// The senders leave first: the values stay receivable; an `IntoIter`
/// dropped halfway drops the rest exactly once.
#[test]
fn an_into_iter_dropped_halfway_drops_the_rest_once() {
    both(|| {
        for cap in [None, Some(8usize)] {
            let drops = counter();
            let (tx, rx) = match cap {
                Some(c) => bounded::<Tracked>(c),
                None => unbounded(),
            };
            for _ in 0..8 {
                tx.send(Tracked(drops.clone())).unwrap();
            }
            drop(tx);
            let mut it = rx.into_iter();
            for _ in 0..3 {
                drop(it.next().unwrap());
            }
            assert_eq!(drops.load(SeqCst), 3);
            drop(it);
            assert_eq!(drops.load(SeqCst), 8, "{cap:?}");
        }
    });
}

/// A panicking `Drop` among the values left: every value is dropped once
/// and the receiver's drop re-raises one panic (spec/chan.md, where fiber
/// differs from crossbeam); the channel's senders then see it
/// disconnected.
#[test]
fn panicking_drops_of_values_left_drop_every_value_once() {
    struct Bomb(Arc<AtomicUsize>, bool);
    impl Drop for Bomb {
        fn drop(&mut self) {
            self.0.fetch_add(1, SeqCst);
            if self.1 {
                panic!("bomb");
            }
        }
    }
    both(|| {
        for cap in [None, Some(0usize), Some(1), Some(6)] {
            let drops = Arc::new(AtomicUsize::new(0));
            let (tx, rx) = match cap {
                Some(c) => bounded::<Bomb>(c),
                None => unbounded(),
            };
            let buffered = cap.unwrap_or(6);
            for i in 0..buffered {
                tx.send(Bomb(drops.clone(), i % 2 == 0)).unwrap();
            }
            let msg = panic_message(move || drop(rx));
            if buffered > 0 {
                assert_eq!(msg.as_deref(), Some("bomb"), "{cap:?}");
            } else {
                assert_eq!(msg, None);
            }
            assert_eq!(drops.load(SeqCst), buffered, "{cap:?}: not every value dropped once");
            let back = tx.send(Bomb(drops.clone(), false)).unwrap_err();
            drop(back);
            drop(tx);
            assert_eq!(drops.load(SeqCst), buffered + 1);
        }
    });
}

/// Parked rendezvous senders (threads and fibers) get their values back
/// when the last receiver leaves; nothing is dropped by the channel.
#[test]
fn parked_rendezvous_senders_get_their_values_back_when_the_receiver_leaves() {
    on_runtime(|| {
        let drops = counter();
        let (tx, rx) = bounded::<Tracked>(0);
        let mut joins = Vec::new();
        for i in 0..4 {
            let tx = tx.clone();
            let d = drops.clone();
            joins.push(spawn_peer(i % 2 == 0, move || match tx.send(Tracked(d)) {
                Err(SendError(v)) => {
                    // Still ours: dropped here, once.
                    drop(v);
                    true
                }
                Ok(()) => false,
            }));
        }
        wait_waiting(&tx, 0, 4);
        drop(rx);
        for j in joins {
            assert!(j(), "a parked sender's send succeeded with no receiver");
        }
        assert_eq!(drops.load(SeqCst), 4);
        drop(tx);
        assert_eq!(drops.load(SeqCst), 4);
    });
}

// ---------------------------------------------------------------------------
// (i) Runtime shutdown while fibers are parked in send, receive and select.

/// Fibers parked in a rendezvous send, a send on a full bounded channel, a
/// receive, and a select with a send arm, when the runtime is dropped: the
/// plain thread on the other side of each channel sees the fiber's handle
/// gone (disconnected), the parked values are dropped exactly once and
/// never delivered, and a select's send value is never evaluated.
#[test]
fn shutdown_with_fibers_parked_in_send_recv_and_select_disconnects_and_drops_once() {
    within(60, || {
        let drops = counter();
        let evaluated = Arc::new(AtomicBool::new(false));
        let rt = rt_fixed_grace(2, ms(200));
        let (tx1, rx1) = bounded::<Tracked>(0);
        let (tx2, rx2) = bounded::<Tracked>(1);
        tx2.send(Tracked(drops.clone())).unwrap();
        let (tx3, rx3) = unbounded::<Tracked>();
        let (tx4, rx4) = bounded::<Tracked>(0);
        let (tx5, rx5) = bounded::<Tracked>(0);
        let d = drops.clone();
        let a = rt.spawn(move || {
            let _ = tx1.send(Tracked(d));
        });
        let d = drops.clone();
        let b = rt.spawn(move || {
            let _ = tx2.send(Tracked(d));
        });
        let c = rt.spawn(move || {
            let _ = rx3.recv();
        });
        let d = drops.clone();
        let e = evaluated.clone();
        let s = rt.spawn(move || {
            fiber::select! {
                recv(rx4) -> _ => {}
                send(tx5, { e.store(true, SeqCst); Tracked(d) }) -> _ => {}
            }
        });
        let ids = [a.id(), b.id(), c.id(), s.id()];
        let handle = rt.handle();
        handle.block_on(move || {
            for id in ids {
                wait_fiber_parked(id);
            }
        });
        drop(rt);
        for h in [a, b, c, s] {
            assert!(h.join().unwrap_err().is_cancelled());
        }
        // Two parked values and the one buffered in `tx2`'s channel exist.
        assert_eq!(rx1.try_recv().err(), Some(TryRecvError::Disconnected));
        let buffered = rx2.try_recv().expect("the buffered value stays receivable");
        assert_eq!(
            rx2.try_recv().err(),
            Some(TryRecvError::Disconnected),
            "an unwound send was delivered"
        );
        drop(buffered);
        assert_eq!(drops.load(SeqCst), 3, "each parked or buffered value dropped once");
        let back = tx3.send(Tracked(drops.clone())).unwrap_err();
        drop(back);
        assert_eq!(drops.load(SeqCst), 4);
        assert!(tx4.send(Tracked(drops.clone())).is_err());
        assert_eq!(rx5.try_recv().err(), Some(TryRecvError::Disconnected));
        assert!(!evaluated.load(SeqCst), "an unselected send arm's value was evaluated");
        assert_eq!(drops.load(SeqCst), 5);
    });
}

/// Plain threads blocked on channels whose other side is held only by
/// fibers parked at shutdown wake when the runtime is dropped: a blocked
/// receive and a blocked select see `Disconnected`, a blocked send gets
/// its value back.
#[test]
fn plain_threads_blocked_on_fibers_parked_at_shutdown_wake_disconnected() {
    within(60, || {
        let rt = rt_fixed_grace(2, ms(200));
        let (tx1, rx1) = bounded::<u32>(0);
        let (tx2, rx2) = bounded::<u32>(0);
        let (tx3, rx3) = unbounded::<u32>();
        let (tx4, rx4) = bounded::<u32>(2);
        tx4.send(1).unwrap();
        tx4.send(2).unwrap();
        let holder = rt.spawn(move || {
            let _keep = (tx1, rx2, tx3, rx4);
            let _ = fiber::sleep(Duration::from_secs(3600));
        });
        let probe = tx2.clone();
        let t1 = std::thread::spawn(move || rx1.recv());
        let t2 = std::thread::spawn(move || tx2.send(7));
        let t3 = std::thread::spawn(move || {
            let (_keep, other) = bounded::<u32>(0);
            fiber::select! {
                recv(rx3) -> v => v.is_err(),
                recv(other) -> _ => false,
            }
        });
        let t4 = std::thread::spawn(move || tx4.send(3));
        wait_waiting(&probe, 0, 1);
        std::thread::sleep(ms(10));
        drop(rt);
        assert!(holder.join().unwrap_err().is_cancelled());
        assert_eq!(t1.join().unwrap(), Err(chan::RecvError));
        assert_eq!(t2.join().unwrap(), Err(SendError(7)));
        assert!(t3.join().unwrap(), "the select did not see the disconnection");
        assert_eq!(t4.join().unwrap(), Err(SendError(3)));
    });
}

// ---------------------------------------------------------------------------
// (j) A seeded mix: every value is dropped exactly once, whatever path it
// took (received, returned in an error, left in a channel, held by a fiber
// parked at shutdown, never evaluated by an unselected send arm).

/// A value that counts its drops in its own slot.
struct Val {
    id: usize,
    drops: Arc<Vec<AtomicUsize>>,
}

impl Drop for Val {
    fn drop(&mut self) {
        self.drops[self.id].fetch_add(1, SeqCst);
    }
}

struct Maker {
    next: Arc<AtomicUsize>,
    drops: Arc<Vec<AtomicUsize>>,
}

impl Maker {
    fn make(&self) -> Val {
        let id = self.next.fetch_add(1, SeqCst);
        assert!(id < self.drops.len(), "more values than slots");
        Val {
            id,
            drops: self.drops.clone(),
        }
    }
}

/// Received values: an id seen twice is a duplicate.
fn note_received(seen: &std::sync::Mutex<HashSet<usize>>, v: Val) {
    assert!(seen.lock().unwrap().insert(v.id), "value {} received twice", v.id);
}

fn mixed_program(seed: u64) {
    use crate::common::fuzz::Rng;
    const OPS: usize = 60;
    let mut rng = Rng::new(seed);
    let actors = 3 + rng.below(4) as usize;
    let drops: Arc<Vec<AtomicUsize>> = Arc::new((0..actors * OPS * 2 + 16).map(|_| AtomicUsize::new(0)).collect());
    let next = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(std::sync::Mutex::new(HashSet::new()));
    let caps: Vec<Option<usize>> = (0..3)
        .map(|_| match rng.below(4) {
            0 => Some(0),
            1 => Some(1),
            2 => Some(3),
            _ => None,
        })
        .collect();
    let chans: Vec<(chan::Sender<Val>, chan::Receiver<Val>)> = caps
        .iter()
        .map(|c| match c {
            Some(c) => bounded(*c),
            None => unbounded(),
        })
        .collect();
    let rt = rt_fixed_grace(1 + rng.below(2) as usize, ms(100));
    let mut threads = Vec::new();
    let mut fibers = Vec::new();
    for _ in 0..actors {
        let mut r = rng.fork();
        let in_fiber = r.chance(60);
        let cancel = r.chance(40);
        let txs: Vec<_> = chans.iter().map(|c| c.0.clone()).collect();
        let rxs: Vec<_> = chans.iter().map(|c| c.1.clone()).collect();
        let maker = Maker {
            next: next.clone(),
            drops: drops.clone(),
        };
        let seen = seen.clone();
        let body = move || {
            let t = |r: &mut Rng| Duration::from_micros(r.below(1500));
            for _ in 0..OPS {
                let (a, b) = (r.below(3) as usize, r.below(3) as usize);
                match r.below(9) {
                    // Blocking forms only in a fiber (a shutdown unwinds
                    // it); a thread uses timed ones.
                    0 if in_fiber => {
                        if let Err(SendError(v)) = txs[a].send(maker.make()) {
                            drop(v);
                        }
                    }
                    0 | 1 => {
                        if let Err(e) = txs[a].send_timeout(maker.make(), t(&mut r)) {
                            drop(e.into_inner());
                        }
                    }
                    2 => {
                        if let Err(e) = txs[a].try_send(maker.make()) {
                            drop(e.into_inner());
                        }
                    }
                    3 if in_fiber => {
                        if let Ok(v) = rxs[a].recv() {
                            note_received(&seen, v);
                        }
                    }
                    3 | 4 => {
                        if let Ok(v) = rxs[a].recv_timeout(t(&mut r)) {
                            note_received(&seen, v);
                        }
                    }
                    5 => {
                        if let Ok(v) = rxs[a].try_recv() {
                            note_received(&seen, v);
                        }
                    }
                    6 => {
                        let d = t(&mut r);
                        fiber::select! {
                            send(txs[a], maker.make()) -> res => if let Err(SendError(v)) = res { drop(v) },
                            recv(rxs[b]) -> v => if let Ok(v) = v { note_received(&seen, v) },
                            default(d) => {}
                        }
                    }
                    7 => {
                        let d = t(&mut r);
                        fiber::select! {
                            send(txs[a], maker.make()) -> res => if let Err(SendError(v)) = res { drop(v) },
                            send(txs[b], maker.make()) -> res => if let Err(SendError(v)) = res { drop(v) },
                            recv(after(d)) -> _ => {}
                        }
                    }
                    _ => {
                        let d = t(&mut r);
                        if in_fiber && r.chance(50) {
                            fiber::select! {
                                recv(rxs[a]) -> v => if let Ok(v) = v { note_received(&seen, v) },
                                recv(rxs[b]) -> v => if let Ok(v) = v { note_received(&seen, v) },
                            }
                        } else {
                            fiber::select! {
                                recv(rxs[a]) -> v => if let Ok(v) = v { note_received(&seen, v) },
                                recv(rxs[b]) -> v => if let Ok(v) = v { note_received(&seen, v) },
                                default(d) => {}
                            }
                        }
                    }
                }
                if r.chance(2) {
                    // Close a channel (from either side): admitted values
                    // are still delivered or dropped once.
                    if r.chance(50) {
                        txs[a].close();
                    } else {
                        rxs[a].close();
                    }
                }
                if r.chance(2) {
                    // Leave early: this actor's handles go.
                    break;
                }
            }
        };
        if in_fiber {
            fibers.push((cancel, rt.spawn(body)));
        } else {
            threads.push(std::thread::spawn(body));
        }
    }
    drop(chans);
    // Cancel some fibers while they run (each wait ends cancelled, values
    // come back in the errors).
    std::thread::sleep(Duration::from_micros(rng.below(3000)));
    for (cancel, h) in &fibers {
        if *cancel {
            h.cancel();
        }
    }
    drop(fibers);
    for t in threads {
        t.join().unwrap();
    }
    // Fibers still parked (a blocking send or receive with nobody left on
    // the other side that is not itself parked) are unwound here.
    drop(rt);
    let made = next.load(SeqCst);
    for (id, d) in drops.iter().enumerate().take(made) {
        assert_eq!(
            d.load(SeqCst),
            1,
            "seed {seed}: value {id} dropped {} times",
            d.load(SeqCst)
        );
    }
}

#[test]
fn a_seeded_mix_of_sends_receives_selects_and_shutdown_drops_every_value_exactly_once() {
    within(120, || {
        let start = crate::common::fuzz::env_u64("FUZZ_START", 0);
        for seed in start..start + crate::common::fuzz::env_u64("FUZZ_SEEDS", 40) {
            mixed_program(seed);
        }
    });
}

// ---------------------------------------------------------------------------
// (k) `Select` reuse, removal, readiness on timers.

/// A `Select` is reusable: indices never shift after `remove`, a new
/// operation gets the next index (crossbeam), a removed ready operation is
/// never chosen, and a reused select with a `tick` takes one tick per call.
#[test]
fn a_reused_select_keeps_its_indices_and_never_picks_a_removed_operation() {
    both(|| {
        let (ta, ra) = unbounded::<u32>();
        let (tb, rb) = unbounded::<u32>();
        let (tc, rc) = unbounded::<u32>();
        let mut sel = Select::new();
        assert_eq!(sel.recv(&ra), 0);
        assert_eq!(sel.recv(&rb), 1);
        sel.remove(0);
        assert_eq!(sel.recv(&rc), 2);
        ta.send(1).unwrap();
        assert!(sel.try_select().is_err(), "the removed operation was chosen");
        for i in 0..50 {
            tb.send(i).unwrap();
            tc.send(i).unwrap();
            let op = sel.select();
            match op.index() {
                1 => assert_eq!(op.recv(&rb), Ok(i)),
                2 => assert_eq!(op.recv(&rc), Ok(i)),
                other => panic!("index {other} chosen"),
            }
            // Take the other one too, so both are empty again.
            let _ = rb.try_recv();
            let _ = rc.try_recv();
        }
        assert_eq!(ra.try_recv(), Ok(1), "a removed receive took the value");

        let t = tick(ms(1));
        let mut sel = Select::new();
        let ti = sel.recv(&t);
        let mut last = None;
        for _ in 0..20 {
            let op = sel.select();
            assert_eq!(op.index(), ti);
            let at = op.recv(&t).unwrap();
            assert!(last.is_none_or(|l| at > l), "a tick delivered twice");
            last = Some(at);
        }
    });
}

/// `Select::ready` on a timer reports it without taking its message (the
/// caller's `try_recv` then gets it); on a closed channel it reports it at
/// once.
#[test]
fn ready_on_timers_and_closed_channels_takes_nothing() {
    both(|| {
        let a = after(ms(5));
        let mut sel = Select::new();
        sel.recv(&a);
        assert_eq!(sel.ready(), 0);
        assert!(a.try_recv().is_ok(), "ready consumed the timer's message");
        assert!(
            sel.ready_timeout(ms(10)).is_err(),
            "an exhausted after() is never ready again"
        );

        let (tx, rx) = unbounded::<u32>();
        tx.send(4).unwrap();
        drop(tx);
        let mut sel = Select::new();
        sel.recv(&rx);
        assert_eq!(sel.ready(), 0);
        assert_eq!(sel.try_ready(), Ok(0));
        assert_eq!(rx.try_recv(), Ok(4), "ready consumed the value");
        assert_eq!(sel.ready_timeout(Duration::ZERO), Ok(0), "a closed channel is ready");
        assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));
    });
}

/// A select of timers only, on a plain thread and in a fiber: the earliest
/// one wins with the instant it was due, never early.
#[test]
fn a_select_of_timers_only_takes_the_earliest_when_it_is_due() {
    both(|| {
        let start = Instant::now();
        let early = after(ms(15));
        let late = after(ms(400));
        let (due, which) = fiber::select! {
            recv(late) -> t => (t.unwrap(), "late"),
            recv(early) -> t => (t.unwrap(), "early"),
        };
        assert_eq!(which, "early");
        assert!(due >= start + ms(15) && Instant::now() >= due, "a timer fired early");
        // The late one is still pending and delivers its own instant.
        assert!(late.try_recv().is_err());
    });
}

// ---------------------------------------------------------------------------
// (l) A receiver's wake of one parked send arm racing the shutdown that
// unwinds that arm's fiber.

/// A plain receiver that queues on a rendezvous channel wakes one parked
/// select send arm (spec/chan.md section 4: one per receive attempt). If
/// that arm's fiber is being unwound by a shutdown at that moment, the
/// other parked send arm (a plain thread's select) must still be told:
/// the receiver gets a value from one of the two. Many rounds, racing the
/// receive against the runtime's drop.
#[test]
fn a_receiver_still_gets_a_value_when_the_send_arm_it_woke_is_unwound_at_shutdown() {
    within(120, || {
        for round in 0..150u32 {
            let rt = rt_fixed_grace(1, Duration::ZERO);
            let (ctx, crx) = bounded::<u32>(0);
            let (_dtx, drx) = bounded::<u32>(0);
            let (quit_tx, quit_rx) = bounded::<u32>(0);
            let c1 = ctx.clone();
            let s1 = rt.spawn(move || {
                fiber::non_cancellable(|| {
                    fiber::select! {
                        send(c1, 1) -> _ => {}
                        recv(drx) -> _ => {}
                    }
                })
            });
            rt.handle().block_on({
                let id = s1.id();
                move || wait_fiber_parked(id)
            });
            let c2 = ctx.clone();
            let s2 = std::thread::spawn(move || {
                fiber::select! {
                    send(c2, 2) -> r => r.is_ok(),
                    recv(quit_rx) -> _ => false,
                }
            });
            wait_waiting(&ctx, 0, 2);
            let go = Arc::new(AtomicBool::new(false));
            let r = {
                let go = go.clone();
                std::thread::spawn(move || {
                    while !go.load(SeqCst) {
                        std::hint::spin_loop();
                    }
                    crx.recv_timeout(Duration::from_secs(3))
                })
            };
            go.store(true, SeqCst);
            drop(rt);
            let got = r.join().unwrap();
            drop(quit_tx);
            let s2_sent = s2.join().unwrap();
            let _ = s1.join();
            match got {
                Ok(1) => assert!(!s2_sent),
                Ok(2) => assert!(s2_sent),
                other => {
                    panic!("round {round}: the receiver got {other:?} while a send arm waited (s2 sent: {s2_sent})")
                }
            }
        }
    });
}
