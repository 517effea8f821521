//! Review 23: `fiber::chan` against crossbeam-channel's documented `Select`
//! API and Go's channel rules, in combinations: readiness and self-pairing
//! on one rendezvous channel, durations at the extremes, drops of values
//! (re-entrant destructors, panicking ones, values in flight), iterators
//! while senders come and go, size queries of every flavour, fairness.

use fiber::chan::{self, RecvTimeoutError, Select, TryRecvError};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{last_instant, ms, panic_message, rt2, wait_parked, within};

/// A value that counts its drops.
struct Counted(Arc<AtomicUsize>);
impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, SeqCst);
    }
}

/// crossbeam: a `Select::ready` with a send and a receive on one
/// rendezvous channel and no peer is not ready (its own two operations do
/// not make each other ready).
#[test]
fn ready_with_send_and_recv_on_one_rendezvous_channel_is_not_self_ready() {
    within(10, || {
        let (tx, rx) = chan::bounded::<u8>(0);
        let mut sel = Select::new();
        sel.send(&tx);
        sel.recv(&rx);
        assert!(sel.try_ready().is_err());
        assert!(sel.ready_timeout(ms(30)).is_err());
        assert!(sel.try_select().is_err());
        assert!(sel.select_timeout(ms(30)).is_err());
        drop(sel);
        rt2().block_on(move || {
            let mut sel = Select::new();
            sel.send(&tx);
            sel.recv(&rx);
            assert!(sel.try_ready().is_err());
            assert!(sel.ready_timeout(ms(30)).is_err());
            assert!(sel.select_timeout(ms(30)).is_err());
        });
    })
}

/// Go: two goroutines each running `select { case c <- v: case <-c: }` on
/// one unbuffered channel pair with each other: one sends, the other
/// receives that value. Fibers and plain threads mixed.
#[test]
fn two_selects_with_both_directions_on_one_rendezvous_channel_pair_up() {
    within(20, || {
        let rt = rt2();
        for round in 0..100u32 {
            let (tx, rx) = chan::bounded::<u32>(0);
            let one = |tx: chan::Sender<u32>, rx: chan::Receiver<u32>, v: u32| {
                move || {
                    fiber::select! {
                        send(tx, v) -> r => { r.unwrap(); None },
                        recv(rx) -> r => Some(r.unwrap()),
                    }
                }
            };
            let a = one(tx.clone(), rx.clone(), round * 2);
            let b = one(tx, rx, round * 2 + 1);
            let (ra, rb) = if round % 2 == 0 {
                let h = rt.spawn(a);
                let rb = rt.block_on(b);
                (h.join().unwrap(), rb)
            } else {
                let t = std::thread::spawn(a);
                let rb = rt.block_on(b);
                (t.join().unwrap(), rb)
            };
            match (ra, rb) {
                (None, Some(v)) => assert_eq!(v, round * 2),
                (Some(v), None) => assert_eq!(v, round * 2 + 1),
                other => panic!("round {round}: {other:?}"),
            }
        }
    })
}

/// A value buffered in a channel whose `Drop` uses the same channel
/// (sends a fresh value, closes, asks its length) while the last receiver
/// drops the buffer: no deadlock, every value dropped exactly once, the
/// re-entrant sends fail with their values.
#[test]
fn reentrant_drops_of_buffered_values_when_the_last_receiver_leaves() {
    struct Re {
        tx: Option<chan::Sender<Re>>,
        drops: Arc<AtomicUsize>,
        failed: Arc<AtomicUsize>,
    }
    impl Drop for Re {
        fn drop(&mut self) {
            self.drops.fetch_add(1, SeqCst);
            if let Some(tx) = self.tx.take() {
                let _ = tx.len();
                let _ = tx.is_full();
                let fresh = Re {
                    tx: None,
                    drops: self.drops.clone(),
                    failed: self.failed.clone(),
                };
                if let Err(e) = tx.try_send(fresh) {
                    self.failed.fetch_add(1, SeqCst);
                    drop(e.into_inner());
                }
                let fresh = Re {
                    tx: None,
                    drops: self.drops.clone(),
                    failed: self.failed.clone(),
                };
                if let Err(e) = tx.send_timeout(fresh, ms(1)) {
                    self.failed.fetch_add(1, SeqCst);
                    drop(e.into_inner());
                }
                tx.close();
            }
        }
    }
    within(10, || {
        for cap in [None, Some(1), Some(4)] {
            let (tx, rx) = match cap {
                None => chan::unbounded::<Re>(),
                Some(c) => chan::bounded::<Re>(c),
            };
            let drops = Arc::new(AtomicUsize::new(0));
            let failed = Arc::new(AtomicUsize::new(0));
            let n = cap.unwrap_or(4);
            for _ in 0..n {
                tx.try_send(Re {
                    tx: Some(tx.clone()),
                    drops: drops.clone(),
                    failed: failed.clone(),
                })
                .ok()
                .unwrap();
            }
            drop(rx);
            assert_eq!(failed.load(SeqCst), 2 * n, "cap {cap:?}: every re-entrant send failed");
            assert_eq!(drops.load(SeqCst), 3 * n, "cap {cap:?}: each value dropped once");
            drop(tx);
        }
    })
}

/// crossbeam's size queries for every flavour.
#[test]
fn size_queries_of_every_flavour() {
    within(10, || {
        let (tx, rx) = chan::bounded::<u8>(0);
        assert_eq!(
            (tx.len(), tx.is_empty(), tx.is_full(), tx.capacity()),
            (0, true, true, Some(0))
        );
        assert_eq!(
            (rx.len(), rx.is_empty(), rx.is_full(), rx.capacity()),
            (0, true, true, Some(0))
        );
        let (tx, rx) = chan::bounded::<u8>(2);
        tx.send(1).unwrap();
        assert_eq!((rx.len(), rx.is_empty(), rx.is_full()), (1, false, false));
        tx.send(2).unwrap();
        assert_eq!((tx.len(), tx.is_full(), rx.is_full()), (2, true, true));
        let (tx, rx) = chan::unbounded::<u8>();
        for i in 0..100 {
            tx.send(i).unwrap();
        }
        assert_eq!((rx.len(), rx.is_full(), rx.capacity()), (100, false, None));
        let n = chan::never::<u8>();
        assert_eq!(
            (n.len(), n.is_empty(), n.is_full(), n.capacity()),
            (0, true, true, Some(0))
        );
        assert!(n.same_channel(&chan::never()));
        let a = chan::after(ms(20));
        assert_eq!(
            (a.len(), a.is_empty(), a.is_full(), a.capacity()),
            (0, true, false, Some(1))
        );
        std::thread::sleep(ms(25));
        assert_eq!((a.len(), a.is_empty(), a.is_full()), (1, false, true));
        a.recv().unwrap();
        assert_eq!((a.len(), a.is_empty(), a.is_full()), (0, true, false));
        let t = chan::tick(Duration::ZERO);
        assert_eq!((t.len(), t.is_full(), t.capacity()), (1, true, Some(1)));
        assert!(t.same_channel(&t.clone()));
        assert!(!t.same_channel(&chan::tick(Duration::ZERO)));
        assert!(!t.same_channel(&chan::never()));
        let p = chan::at(Instant::now());
        assert_eq!(p.len(), 1);
    })
}

/// A select that reserved a ring slot for its send and has not completed
/// it yet: a `try_recv` on the same thread must not wait for that slot
/// (it would wait for itself), and `recv_timeout` must time out.
#[test]
fn try_recv_while_this_thread_holds_a_send_reservation_does_not_wait_for_it() {
    within(10, || {
        for cap in [1usize, 3] {
            let (tx, rx) = chan::bounded::<u32>(cap);
            let mut sel = Select::new();
            sel.send(&tx);
            let op = sel.select();
            assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
            assert_eq!(rx.recv_timeout(ms(20)), Err(RecvTimeoutError::Timeout));
            op.send(&tx, 7).unwrap();
            assert_eq!(rx.try_recv(), Ok(7));
        }
    })
}

/// Go/crossbeam: a select chooses uniformly among ready arms of every
/// kind: a buffered value, an unbounded value, room on an unbounded
/// channel, a due `tick(0)`, a closed channel.
#[test]
fn select_is_uniform_among_ready_arms_of_every_kind() {
    within(10, || {
        let (btx, brx) = chan::bounded::<u32>(1);
        let (utx, urx) = chan::unbounded::<u32>();
        let (stx, srx) = chan::unbounded::<u32>();
        let (ctx, crx) = chan::bounded::<u32>(1);
        ctx.close();
        let t = chan::tick(Duration::ZERO);
        let mut counts = [0u32; 5];
        const N: u32 = 10_000;
        for _ in 0..N {
            if brx.is_empty() {
                btx.send(1).unwrap();
            }
            if urx.is_empty() {
                utx.send(2).unwrap();
            }
            let i = fiber::select! {
                recv(brx) -> v => { assert_eq!(v, Ok(1)); 0 },
                recv(urx) -> v => { assert_eq!(v, Ok(2)); 1 },
                send(stx, 3) -> r => { r.unwrap(); 2 },
                recv(t) -> v => { v.unwrap(); 3 },
                recv(crx) -> v => { assert!(v.is_err()); 4 },
            };
            counts[i] += 1;
            while srx.try_recv().is_ok() {}
        }
        for c in counts {
            // Expected 2,000 each; the bound is over 8 standard deviations.
            assert!((1_680..=2_320).contains(&c), "{counts:?}");
        }
    })
}

/// crossbeam: a `Select::ready` over a timer reports it once due, and
/// the caller's receive then gets the due instant; `at` in the past
/// delivers its own instant at once, exactly once, shared by clones.
#[test]
fn ready_on_timers_and_at_in_the_past_shared_by_clones() {
    within(10, || {
        let when = Instant::now() - ms(500);
        let a = chan::at(when);
        let b = a.clone();
        let mut sel = Select::new();
        sel.recv(&a);
        sel.recv(&b);
        assert!(sel.try_ready().is_ok());
        assert_eq!(b.try_recv(), Ok(when));
        assert_eq!(a.try_recv(), Err(TryRecvError::Empty));
        assert!(sel.ready_timeout(ms(20)).is_err());
        assert_eq!(a.recv_timeout(ms(10)), Err(RecvTimeoutError::Timeout));
        let start = Instant::now();
        let af = chan::after(ms(30));
        let mut sel = Select::new();
        sel.recv(&af);
        assert_eq!(sel.ready_timeout(Duration::MAX), Ok(0));
        assert!(start.elapsed() >= ms(30));
        let due = af.try_recv().unwrap();
        assert!(due >= start + ms(30) && due <= Instant::now());
    })
}

/// crossbeam: a zero-time send on a rendezvous channel hands its value to
/// a receiver already waiting, whether a plain `recv` or a select's recv
/// arm, in a fiber or on a plain thread (`send_timeout(ZERO)`,
/// `send_deadline(now)`, `try_send`).
#[test]
fn zero_time_sends_hand_off_to_a_parked_select_recv_arm() {
    within(10, || {
        let rt = rt2();
        for (round, how) in ["timeout", "deadline", "try"].iter().cycle().take(12).enumerate() {
            let (tx, rx) = chan::bounded::<u32>(0);
            let (_otx, orx) = chan::bounded::<u32>(0);
            let on_thread = round % 2 == 1;
            let body = move || {
                fiber::select! {
                    recv(rx) -> v => v.ok(),
                    recv(orx) -> _ => None,
                }
            };
            let (fh, th) = if on_thread {
                (None, Some(std::thread::spawn(body)))
            } else {
                (Some(rt.spawn(body)), None)
            };
            while tx.waiting().0 < 1 {
                std::thread::yield_now();
            }
            let sent = match *how {
                "timeout" => tx.send_timeout(round as u32, Duration::ZERO).is_ok(),
                "deadline" => tx.send_deadline(round as u32, Instant::now()).is_ok(),
                _ => tx.try_send(round as u32).is_ok(),
            };
            assert!(
                sent,
                "round {round} ({how}, thread {on_thread}): the waiting select was not taken"
            );
            let got = match (fh, th) {
                (Some(h), _) => h.join().unwrap(),
                (_, Some(t)) => t.join().unwrap(),
                _ => unreachable!(),
            };
            assert_eq!(got, Some(round as u32));
        }
    })
}

/// A value queued behind a select's reserved ring slot, whose `Drop`
/// re-enters the channel, when the last receiver leaves before the
/// reservation completes: the completion fails with its value, the queued
/// value is dropped once (by the completion), its re-entrant send fails.
#[test]
fn a_reentrant_value_behind_a_reservation_is_dropped_once_without_deadlock() {
    struct Re {
        tx: Option<chan::Sender<Re>>,
        drops: Arc<AtomicUsize>,
    }
    impl Drop for Re {
        fn drop(&mut self) {
            self.drops.fetch_add(1, SeqCst);
            if let Some(tx) = self.tx.take() {
                let fresh = Re {
                    tx: None,
                    drops: self.drops.clone(),
                };
                assert!(tx.try_send(fresh).is_err());
                assert!(tx.is_closed());
                tx.close();
            }
        }
    }
    within(10, || {
        let drops = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = chan::bounded::<Re>(3);
        let mut sel = Select::new();
        sel.send(&tx);
        let op = sel.select();
        tx.try_send(Re {
            tx: Some(tx.clone()),
            drops: drops.clone(),
        })
        .ok()
        .unwrap();
        drop(rx);
        assert_eq!(drops.load(SeqCst), 0, "queued behind the reservation: still alive");
        let back = op
            .send(
                &tx,
                Re {
                    tx: None,
                    drops: drops.clone(),
                },
            )
            .expect_err("every receiver left");
        assert_eq!(
            drops.load(SeqCst),
            2,
            "the queued value and its re-entrant send's value"
        );
        drop(back);
        assert_eq!(drops.load(SeqCst), 3);
    })
}

/// A `SelectedOperation` holding a received value whose `Drop` panics,
/// dropped uncompleted: the value's panic comes out, the value is dropped
/// exactly once, and the select stays usable.
#[test]
fn an_uncompleted_selected_recv_holding_a_panicking_value_drops_it_once() {
    struct Bomb(Arc<AtomicUsize>);
    impl Drop for Bomb {
        fn drop(&mut self) {
            self.0.fetch_add(1, SeqCst);
            panic!("bomb");
        }
    }
    within(10, || {
        let drops = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = chan::unbounded::<Bomb>();
        tx.send(Bomb(drops.clone())).ok().unwrap();
        tx.send(Bomb(drops.clone())).ok().unwrap();
        let mut sel = Select::new();
        sel.recv(&rx);
        let msg = panic_message(|| {
            let op = sel.select();
            drop(op);
        })
        .unwrap();
        assert_eq!(drops.load(SeqCst), 1);
        assert!(msg.contains("bomb") || msg.contains("without completing"), "{msg}");
        let op = sel.try_select().unwrap();
        let v = op.recv(&rx).ok().unwrap();
        std::mem::forget(v);
        drop(sel);
        assert_eq!(drops.load(SeqCst), 1);
    })
}

/// spec/chan.md: a select's send arm that reserved (a parked receiver, a
/// ring slot, an unbounded slot) is admitted: a close that happens while
/// its value expression runs (here: the expression itself closes) does
/// not refuse it; the receiver gets the value, then sees the close.
#[test]
fn a_send_arm_value_expression_that_closes_its_channel_still_delivers() {
    within(10, || {
        for cap in [Some(0), Some(1), Some(3), None] {
            let (tx, rx) = match cap {
                Some(c) => chan::bounded::<u32>(c),
                None => chan::unbounded::<u32>(),
            };
            let r2 = rx.clone();
            let receiver = std::thread::spawn(move || (r2.recv(), r2.recv()));
            if cap == Some(0) {
                while tx.waiting().0 < 1 {
                    std::thread::yield_now();
                }
            }
            let r = fiber::select! {
                send(tx, { assert!(tx.close()); 5 }) -> r => r,
            };
            assert_eq!(r, Ok(()), "cap {cap:?}");
            let (a, b) = receiver.join().unwrap();
            assert_eq!(a, Ok(5), "cap {cap:?}");
            assert!(b.is_err(), "cap {cap:?}");
            assert!(tx.send(6).is_err());
        }
    })
}

/// A send arm whose value expression drops the last receiver: the
/// completion fails with the value (crossbeam: a disconnected send), which
/// is dropped exactly once, and values queued behind the reservation are
/// dropped too.
#[test]
fn a_send_arm_value_expression_that_drops_the_last_receiver() {
    within(10, || {
        for cap in [Some(2), Some(5), None] {
            let drops = Arc::new(AtomicUsize::new(0));
            let (tx, rx) = match cap {
                Some(c) => chan::bounded::<Counted>(c),
                None => chan::unbounded::<Counted>(),
            };
            let mut rx = Some(rx);
            let d = drops.clone();
            let t2 = tx.clone();
            let r = fiber::select! {
                send(tx, {
                    t2.try_send(Counted(d.clone())).ok().unwrap();
                    drop(rx.take());
                    Counted(d.clone())
                }) -> r => r,
            };
            let back = r.expect_err("every receiver left");
            assert_eq!(drops.load(SeqCst), 1, "cap {cap:?}: the value queued behind");
            drop(back);
            assert_eq!(drops.load(SeqCst), 2, "cap {cap:?}");
            drop((tx, t2));
            assert_eq!(drops.load(SeqCst), 2, "cap {cap:?}");
        }
    })
}

/// crossbeam's documented `Select::ready` idiom on both sides (wait until
/// ready, then `try_recv` / `try_send`, retry on a miss), producers and
/// consumers on fibers and plain threads: every value arrives exactly
/// once and nobody sleeps next to a ready operation.
#[test]
fn ready_then_try_on_both_sides_delivers_everything() {
    within(20, || {
        let rt = rt2();
        // Not `bounded(0)`: there a `try_send` needs a parked receiver and a
        // `try_recv` a parked sender, so with `ready` probes on both sides
        // nothing ever hands off (crossbeam's zero-capacity readiness
        // counts only blocked operations as well).
        for cap in [Some(2), Some(1), None] {
            let (tx, rx) = match cap {
                Some(c) => chan::bounded::<u32>(c),
                None => chan::unbounded::<u32>(),
            };
            const PER: u32 = 500;
            let produce = |tx: chan::Sender<u32>, base: u32| {
                move || {
                    let mut sel = Select::new();
                    sel.send(&tx);
                    for i in 0..PER {
                        let mut v = base + i;
                        loop {
                            let _ = sel.ready();
                            match tx.try_send(v) {
                                Ok(()) => break,
                                Err(e) => v = e.into_inner(),
                            }
                        }
                    }
                }
            };
            let consume = |rx: chan::Receiver<u32>| {
                move || {
                    let mut sel = Select::new();
                    sel.recv(&rx);
                    let mut got = Vec::new();
                    loop {
                        let _ = sel.ready();
                        match rx.try_recv() {
                            Ok(v) => got.push(v),
                            Err(TryRecvError::Empty) => {}
                            Err(TryRecvError::Disconnected) => return got,
                        }
                    }
                }
            };
            let pf: Vec<_> = (0..2).map(|k| rt.spawn(produce(tx.clone(), k * 10_000))).collect();
            let pt: Vec<_> = (2..4)
                .map(|k| std::thread::spawn(produce(tx.clone(), k * 10_000)))
                .collect();
            drop(tx);
            let cf: Vec<_> = (0..2).map(|_| rt.spawn(consume(rx.clone()))).collect();
            let ct: Vec<_> = (0..2).map(|_| std::thread::spawn(consume(rx.clone()))).collect();
            drop(rx);
            for h in pf {
                h.join().unwrap();
            }
            for t in pt {
                t.join().unwrap();
            }
            let mut all = Vec::new();
            for h in cf {
                all.extend(h.join().unwrap());
            }
            for t in ct {
                all.extend(t.join().unwrap());
            }
            all.sort();
            let want: Vec<u32> = (0..4).flat_map(|k| (0..PER).map(move |i| k * 10_000 + i)).collect();
            assert_eq!(all, want, "cap {cap:?}");
        }
    })
}

/// A plain thread parked in `recv` on a rendezvous channel, reserved by a
/// select fiber whose send-arm value expression waits and ignores
/// cancellation, when the runtime shuts down: teardown unwinds the select,
/// the reservation is given back, and the thread's receive goes on to get
/// a later value.
#[test]
fn a_plain_receiver_reserved_by_a_select_unwound_at_shutdown_gets_a_later_value() {
    crate::common::in_child(
        "a_plain_receiver_reserved_by_a_select_unwound_at_shutdown_gets_a_later_value",
        10,
        || {
            let rt = crate::common::rt_fixed_grace(1, ms(50));
            let (tx, rx) = chan::bounded::<u32>(0);
            let thread = std::thread::spawn(move || rx.recv());
            while tx.waiting().0 < 1 {
                std::thread::yield_now();
            }
            let in_value = Arc::new(AtomicUsize::new(0));
            let (iv, t2) = (in_value.clone(), tx.clone());
            rt.spawn(move || {
                fiber::select! {
                    send(t2, {
                        iv.store(1, SeqCst);
                        crate::common::stubborn_sleep();
                        5
                    }) -> _ => {},
                }
            });
            while in_value.load(SeqCst) == 0 {
                std::thread::yield_now();
            }
            drop(rt);
            tx.send(7).unwrap();
            assert_eq!(thread.join().unwrap(), Ok(7));
            assert_eq!(tx.waiting(), (0, 0));
        },
    );
}

/// A receiver fiber parked on a rendezvous channel whose node a select
/// fiber's send arm reserved; the select's value expression takes 300 ms
/// in a non-cancellable section. Dropping the runtime (50 ms grace) must
/// end: either the value arrives or teardown unwinds both fibers. Instead,
/// when teardown unwinds the receiver first, its node's drop
/// (`Node::drop` -> `Chan::unregister(node, false)`) spins on the
/// reservation with `sched_yield` for ever, on the very thread that would
/// have to run or unwind the select: shutdown never returns (100% CPU).
#[test]
// Failed before the fix: runtime shutdown spins for ever when it unwinds a receiver fiber whose node a parked select's send arm reserved
fn shutdown_unwinding_a_receiver_reserved_by_a_parked_send_arm_returns() {
    crate::common::in_child(
        "shutdown_unwinding_a_receiver_reserved_by_a_parked_send_arm_returns",
        10,
        || {
            struct Flag(Arc<AtomicUsize>);
            impl Drop for Flag {
                fn drop(&mut self) {
                    self.0.fetch_add(1, SeqCst);
                }
            }
            for (workers, select_arm) in [(1, false), (2, false), (1, true), (2, true)] {
                let rt = crate::common::rt_fixed_grace(workers, ms(50));
                let unwound = Arc::new(AtomicUsize::new(0));
                let (tx, rx) = chan::bounded::<u32>(0);
                let (gate_tx, gate_rx) = chan::bounded::<()>(0);
                let in_value = Arc::new(AtomicUsize::new(0));
                let (iv, t2) = (in_value.clone(), tx.clone());
                // The select fiber first (teardown reaches the receiver
                // before it), then the receiver.
                rt.spawn(move || {
                    let _ = gate_rx.recv();
                    fiber::select! {
                        send(t2, {
                            iv.store(1, SeqCst);
                            fiber::non_cancellable(|| {
                                let _ = fiber::sleep(ms(300));
                            });
                            5
                        }) -> _ => {},
                    }
                });
                let (r2, u2) = (rx.clone(), unwound.clone());
                rt.spawn(move || {
                    let _flag = Flag(u2);
                    if select_arm {
                        fiber::select! {
                            recv(r2) -> _ => {},
                        }
                    } else {
                        let _ = r2.recv();
                    }
                });
                while tx.waiting().0 < 1 {
                    std::thread::yield_now();
                }
                gate_tx.send(()).unwrap();
                while in_value.load(SeqCst) == 0 {
                    std::thread::yield_now();
                }
                let start = Instant::now();
                drop(rt);
                assert!(start.elapsed() < Duration::from_secs(3), "{workers} workers");
                assert_eq!(tx.waiting(), (0, 0));
                // The receiver was unwound to its end (its destructors
                // ran), not abandoned.
                assert_eq!(unwound.load(SeqCst), 1, "{workers} workers, select arm {select_arm}");
            }
        },
    );
}

/// Deadlines at the very last representable `Instant`: every timed
/// channel operation and timer waits (no overflow panic inside the wait),
/// a value arriving later is taken, and in a fiber a cancellation ends
/// each wait with the timed form's error.
#[test]
fn deadlines_at_the_last_representable_instant() {
    within(20, || {
        let end = last_instant();
        // Plain threads: a late value is taken.
        let (tx, rx) = chan::bounded::<u32>(0);
        let t = std::thread::spawn(move || rx.recv_deadline(end));
        std::thread::sleep(ms(20));
        tx.send_deadline(1, end).unwrap();
        assert_eq!(t.join().unwrap(), Ok(1));
        let (tx, rx) = chan::bounded::<u32>(0);
        let t = std::thread::spawn(move || {
            let timer = chan::at(end);
            let mut sel = Select::new();
            let i = sel.recv(&rx);
            sel.recv(&timer);
            let op = sel.select_deadline(end).unwrap();
            assert_eq!(op.index(), i);
            op.recv(&rx)
        });
        std::thread::sleep(ms(20));
        tx.send(2).unwrap();
        assert_eq!(t.join().unwrap(), Ok(2));
        // Fibers: each wait parks, then a cancellation ends it with the
        // timed form's error (a blocking select: its channel arm, failed).
        // Outcomes are recorded inside: a cancelled fiber joins `Cancelled`.
        let rt = rt2();
        let (tx, rx) = chan::bounded::<u32>(0);
        // Nobody receives from `stx`'s channel.
        let (stx, _srx) = chan::bounded::<u32>(0);
        let out = Arc::new(std::sync::Mutex::new(Vec::<(usize, String)>::new()));
        let rec = |i: usize, f: Box<dyn FnOnce() -> String + Send>| {
            let out = out.clone();
            rt.spawn(move || {
                let s = f();
                out.lock().unwrap().push((i, s));
            })
        };
        let (r1, r2, r3, r4) = (rx.clone(), rx.clone(), rx.clone(), rx.clone());
        let hs = vec![
            rec(0, Box::new(move || format!("{:?}", r1.recv_deadline(end)))),
            rec(
                1,
                Box::new(move || format!("{:?}", stx.send_deadline(9, end).map_err(|e| e.is_timeout()))),
            ),
            rec(2, Box::new(move || format!("{:?}", chan::at(end).recv_deadline(end)))),
            rec(
                3,
                Box::new(move || {
                    let mut sel = Select::new();
                    sel.recv(&r2);
                    format!("{:?}", sel.select_deadline(end).map(|op| op.recv(&r2)))
                }),
            ),
            rec(
                4,
                Box::new(move || {
                    let mut sel = Select::new();
                    sel.recv(&r3);
                    format!("{:?}", sel.ready_deadline(end))
                }),
            ),
            rec(
                5,
                Box::new(move || {
                    let timer = chan::at(end);
                    fiber::select! {
                        recv(r4) -> r => format!("recv {r:?}"),
                        recv(timer) -> _ => "timer".to_string(),
                    }
                }),
            ),
        ];
        wait_parked(&rt, hs.len());
        for h in &hs {
            assert!(!h.is_finished());
            h.cancel();
        }
        for h in hs {
            let _ = h.join();
        }
        let mut got = out.lock().unwrap().clone();
        got.sort();
        let got: Vec<String> = got.into_iter().map(|(_, s)| s).collect();
        assert_eq!(
            got,
            [
                "Err(Timeout)",
                "Err(true)",
                "Err(Timeout)",
                "Err(SelectTimeoutError)",
                "Err(ReadyTimeoutError)",
                "recv Err(RecvError)"
            ]
        );
        drop((tx, rx));
    })
}

/// A value with an id: construction and each drop are recorded, a second
/// drop of one id is flagged.
struct Tracked {
    id: u64,
    book: Arc<Book>,
}

#[derive(Default)]
struct Book {
    made: AtomicUsize,
    dropped: std::sync::Mutex<std::collections::HashSet<u64>>,
    twice: AtomicUsize,
}

impl Tracked {
    fn new(book: &Arc<Book>, id: u64) -> Tracked {
        book.made.fetch_add(1, SeqCst);
        Tracked { id, book: book.clone() }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        if !self.book.dropped.lock().unwrap().insert(self.id) {
            self.book.twice.fetch_add(1, SeqCst);
        }
    }
}

fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// Random traffic over every flavour (plain, timed and try operations,
/// `select!` with send and receive arms, `Select::ready`), fibers
/// cancelled at random, plain threads, then every handle dropped with
/// values still buffered, parked or reserved: every value made is dropped
/// exactly once.
#[test]
fn random_traffic_with_cancellations_drops_every_value_exactly_once() {
    within(30, || {
        let book = Arc::new(Book::default());
        let rt = rt2();
        let chans: Vec<(chan::Sender<Tracked>, chan::Receiver<Tracked>)> =
            vec![chan::bounded(0), chan::bounded(1), chan::bounded(3), chan::unbounded()];
        let next_id = Arc::new(AtomicUsize::new(0));
        let actor = |seed: u64| {
            let chans = chans.clone();
            let book = book.clone();
            let next_id = next_id.clone();
            move || {
                let mut x = seed | 1;
                let mut kept = Vec::new();
                for _ in 0..2000 {
                    let a = (xorshift(&mut x) % 4) as usize;
                    let b = (xorshift(&mut x) % 4) as usize;
                    let (tx, rx) = &chans[a];
                    let (tx2, rx2) = &chans[b];
                    let mk = || Tracked::new(&book, next_id.fetch_add(1, SeqCst) as u64);
                    match xorshift(&mut x) % 8 {
                        0 => drop(tx.send_timeout(mk(), ms(2))),
                        1 => drop(tx.try_send(mk())),
                        2 => drop(rx.recv_timeout(ms(2))),
                        3 => drop(rx.try_recv()),
                        4 => fiber::select! {
                            send(tx, mk()) -> r => drop(r),
                            recv(rx2) -> v => drop(v),
                            default(ms(2)) => {},
                        },
                        5 => fiber::select! {
                            recv(rx) -> v => if let Ok(v) = v { kept.push(v) },
                            send(tx2, mk()) -> r => drop(r),
                            recv(chan::after(ms(2))) -> _ => {},
                        },
                        6 => {
                            let mut sel = Select::new();
                            sel.recv(rx);
                            sel.send(tx2);
                            if let Ok(i) = sel.ready_timeout(ms(2)) {
                                if i == 0 {
                                    drop(rx.try_recv());
                                } else {
                                    drop(tx2.try_send(mk()));
                                }
                            }
                        }
                        _ => {
                            let mut sel = Select::new();
                            sel.send(tx);
                            sel.recv(rx2);
                            let op = sel.select_timeout(ms(2));
                            if let Ok(op) = op {
                                if op.index() == 0 {
                                    drop(op.send(tx, mk()));
                                } else {
                                    drop(op.recv(rx2));
                                }
                            }
                        }
                    }
                    if kept.len() > 3 {
                        kept.clear();
                    }
                }
            }
        };
        let mut fibers = Vec::new();
        for s in 0..6u64 {
            fibers.push(rt.spawn(actor(0x9E37_79B9 * (s + 1))));
        }
        let threads: Vec<_> = (0..2u64)
            .map(|s| std::thread::spawn(actor(0x1234_5678 * (s + 7))))
            .collect();
        std::thread::sleep(ms(30));
        for (i, h) in fibers.iter().enumerate() {
            if i % 2 == 0 {
                h.cancel();
            }
        }
        for h in fibers {
            let _ = h.join();
        }
        for t in threads {
            t.join().unwrap();
        }
        drop(rt);
        drop(chans);
        assert_eq!(book.twice.load(SeqCst), 0, "values dropped twice");
        assert_eq!(
            book.dropped.lock().unwrap().len(),
            book.made.load(SeqCst),
            "every value made is dropped once"
        );
    })
}
