//! Review 62: re-entrancy. User code that the library runs in the middle of
//! its own operation (a value's `Drop` when a channel drops it, a select
//! send arm's value expression while the arm holds a reservation, a
//! `Mutex`/`RwLock` value's `Drop` on assignment through a guard, a
//! `OnceLock`/`LazyLock`/`Once` initializer, a `Condvar::wait_while`
//! predicate, a scoped child's captures, a detached fiber's output) calling
//! back into the very same object. Each must work, or panic naming the
//! misuse, and leave the object usable: counting `Drop` impls and a
//! follow-up operation check that nothing was lost, duplicated or broken.

use crate::common::*;

use fiber::chan::{bounded, unbounded, Receiver, RecvTimeoutError, Select, Sender, TryRecvError, TrySendError};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A value that, when dropped, counts itself and (while `depth > 0`) sends
/// a successor into its own channel through the sender it carries.
struct Echo {
    tx: Option<Sender<Echo>>,
    depth: usize,
    drops: Arc<AtomicUsize>,
    refused: Arc<AtomicUsize>,
}

impl Drop for Echo {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Ordering::SeqCst);
        if let Some(tx) = self.tx.take() {
            if self.depth > 0 {
                let next = Echo {
                    tx: Some(tx.clone()),
                    depth: self.depth - 1,
                    drops: self.drops.clone(),
                    refused: self.refused.clone(),
                };
                // Every receiver is gone: the send must fail and hand the
                // value back (it is then dropped here, recursively).
                if tx.send(next).is_err() {
                    self.refused.fetch_add(1, Ordering::SeqCst);
                }
                // A close from inside the disconnect is a no-op.
                assert!(!tx.close(), "the channel was already closed");
            }
        }
    }
}

fn last_receiver_drop_with_reentrant_sends(make: fn() -> (Sender<Echo>, Receiver<Echo>), buffered: usize) {
    let drops = Arc::new(AtomicUsize::new(0));
    let refused = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = make();
    for _ in 0..buffered {
        let sent = tx.try_send(Echo {
            tx: Some(tx.clone()),
            depth: 3,
            drops: drops.clone(),
            refused: refused.clone(),
        });
        assert!(sent.is_ok(), "room for the value");
    }
    drop(tx);
    drop(rx);
    // Each buffered value: itself plus 3 successors, each refused once.
    assert_eq!(drops.load(Ordering::SeqCst), buffered * 4);
    assert_eq!(refused.load(Ordering::SeqCst), buffered * 3);
}

/// The last receiver drops buffered values whose destructors send into
/// (and close) the same channel: each send fails at once and hands its
/// value back, every value is dropped exactly once, nothing hangs.
#[test]
fn buffered_values_whose_drop_sends_into_their_own_channel_at_disconnect() {
    within(10, || {
        last_receiver_drop_with_reentrant_sends(|| bounded(4), 4);
        last_receiver_drop_with_reentrant_sends(unbounded, 5);
    });
}

/// The same inside a fiber (the disconnect's wake flush and the nested
/// sends run on a fiber stack).
#[test]
fn buffered_values_whose_drop_sends_into_their_own_channel_in_a_fiber() {
    on_runtime(|| {
        last_receiver_drop_with_reentrant_sends(|| bounded(3), 3);
        last_receiver_drop_with_reentrant_sends(unbounded, 3);
    });
}

/// A value that, when dropped, receives from and sends into its own
/// channel through the handles it carries.
struct Poke {
    tx: Sender<u32>,
    rx: Receiver<u32>,
    seen: Arc<AtomicUsize>,
}

impl Drop for Poke {
    fn drop(&mut self) {
        while let Ok(v) = self.rx.try_recv() {
            self.seen.fetch_add(v as usize, Ordering::SeqCst);
        }
        self.tx.send(100).unwrap();
    }
}

/// A select takes a value and its `SelectedOperation` is dropped
/// uncompleted: the select drops the value, whose destructor drains and
/// refills the same channel. The drop panics (naming the misuse) and the
/// channel stays consistent: the refill is received afterwards.
#[test]
fn a_selected_receive_dropped_uncompleted_drops_a_value_that_reenters_its_channel() {
    within(10, || {
        let (tx, rx) = unbounded::<Poke>();
        let (itx, irx) = bounded::<u32>(8);
        let seen = Arc::new(AtomicUsize::new(0));
        itx.send(1).unwrap();
        itx.send(2).unwrap();
        tx.send(Poke {
            tx: itx.clone(),
            rx: irx.clone(),
            seen: seen.clone(),
        })
        .unwrap();
        let msg = panic_message(|| {
            let mut sel = Select::new();
            sel.recv(&rx);
            sel.recv(&irx);
            // Biased to nothing: whichever is ready; loop until the Poke
            // channel's operation is selected.
            loop {
                let op = sel.select();
                if op.index() == 0 {
                    drop(op);
                    unreachable!("dropping an uncompleted SelectedOperation panics");
                }
                let v = op.recv(&irx).unwrap();
                seen.fetch_add(v as usize, Ordering::SeqCst);
            }
        })
        .expect("the uncompleted operation panics");
        assert!(msg.contains("SelectedOperation"), "{msg}");
        // The destructor ran once: 1 + 2 were taken (by it or the loop) and
        // its 100 is in the channel.
        assert_eq!(seen.load(Ordering::SeqCst), 3);
        assert_eq!(irx.try_recv(), Ok(100));
        assert_eq!(irx.try_recv(), Err(TryRecvError::Empty));
        assert!(rx.try_recv().is_err());
        itx.send(7).unwrap();
        assert_eq!(irx.recv(), Ok(7));
    });
}

/// A select's send arm holds a reservation of the only slot of a
/// `bounded(1)` channel while its value expression runs; that expression
/// polls the same channel (`try_recv`, `try_send`, a short `recv_timeout`
/// and `send_timeout`). None of them may wait for the reservation the
/// caller itself holds: each reports empty / full / timed out at once, and
/// the arm's value is then delivered.
#[test]
fn a_send_arms_value_expression_polls_its_own_reserved_bounded_channel() {
    within(10, || {
        let (tx, rx) = bounded::<u32>(1);
        let mut seen = Vec::new();
        fiber::select! {
            send(tx, {
                seen.push(format!("{:?}", rx.try_recv()));
                seen.push(format!("{:?}", tx.try_send(9).map_err(|e| matches!(e, TrySendError::Full(9)))));
                seen.push(format!("{:?}", rx.recv_timeout(ms(20))));
                seen.push(format!("{:?}", tx.send_timeout(8, ms(20)).is_err()));
                5
            }) -> r => r.unwrap(),
        }
        assert_eq!(
            seen,
            ["Err(Empty)", "Err(true)", "Err(Timeout)", "true"],
            "the polls inside the reservation"
        );
        assert_eq!(rx.try_recv(), Ok(5));
        assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
        // Full capacity again.
        tx.try_send(1).unwrap();
        assert!(tx.is_full());
    });
}

/// As above, in a fiber, on an unbounded and a rendezvous channel (a
/// receiver parked in another fiber is the reservation).
#[test]
fn a_send_arms_value_expression_polls_its_own_reserved_channel_in_a_fiber() {
    on_runtime(|| {
        let (tx, rx) = unbounded::<u32>();
        fiber::select! {
            send(tx, {
                assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
                assert_eq!(rx.recv_timeout(ms(10)), Err(RecvTimeoutError::Timeout));
                6
            }) -> r => r.unwrap(),
        }
        assert_eq!(rx.try_recv(), Ok(6));

        let (tx, rx) = bounded::<u32>(0);
        let rx2 = rx.clone();
        let parked = fiber::spawn(move || rx2.recv());
        wait_fiber_parked(parked.id());
        fiber::select! {
            send(tx, {
                // The parked receiver is reserved for this arm: nobody
                // else takes it, and the arm's own polls find nothing.
                assert_eq!(tx.try_send(1), Err(TrySendError::Full(1)));
                assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
                7
            }) -> r => r.unwrap(),
        }
        assert_eq!(parked.join().unwrap(), Ok(7));
    });
}

/// A send arm's value expression closes the channel while the arm holds
/// its reservation: the reservation was admitted before the close, so the
/// value is still delivered, and only then do receivers see the end.
#[test]
fn a_send_arms_value_expression_closes_its_own_channel() {
    on_runtime(|| {
        for flavor in 0..3 {
            let (tx, rx) = match flavor {
                0 => bounded::<u32>(1),
                1 => unbounded(),
                _ => bounded(0),
            };
            let parked = (flavor == 2).then(|| {
                let rx2 = rx.clone();
                let h = fiber::spawn(move || (rx2.recv(), rx2.recv()));
                wait_fiber_parked(h.id());
                h
            });
            fiber::select! {
                send(tx, {
                    assert!(tx.close(), "flavor {flavor}: first close");
                    3
                }) -> r => assert_eq!(r, Ok(()), "flavor {flavor}: admitted before the close"),
            }
            match parked {
                Some(h) => assert_eq!(h.join().unwrap(), (Ok(3), Err(fiber::chan::RecvError))),
                None => {
                    assert_eq!(rx.recv(), Ok(3), "flavor {flavor}");
                    assert!(rx.recv().is_err(), "flavor {flavor}");
                }
            }
            assert!(tx.send(4).is_err(), "flavor {flavor}: closed");
        }
    });
}

struct Counted(u32, Arc<AtomicUsize>);
impl Drop for Counted {
    fn drop(&mut self) {
        self.1.fetch_add(1, Ordering::SeqCst);
    }
}

/// A send arm's value expression drops the last receiver of the channel
/// it holds a reservation on: the arm fails and hands its value back
/// (dropped once), and values buffered before are dropped once.
#[test]
fn a_send_arms_value_expression_drops_the_last_receiver() {
    within(10, || {
        for flavor in 0..2 {
            let drops = Arc::new(AtomicUsize::new(0));
            let (tx, rx) = if flavor == 0 {
                bounded::<Counted>(2)
            } else {
                unbounded()
            };
            tx.send(Counted(1, drops.clone())).unwrap();
            let mut rx = Some(rx);
            let back = fiber::select! {
                send(tx, {
                    drop(rx.take());
                    assert_eq!(drops.load(Ordering::SeqCst), 1, "flavor {flavor}: the buffered value");
                    Counted(2, drops.clone())
                }) -> r => r.err().map(|e| e.into_inner().0),
            };
            assert_eq!(back, Some(2), "flavor {flavor}: the value comes back");
            assert_eq!(drops.load(Ordering::SeqCst), 2, "flavor {flavor}");
            assert!(tx.try_send(Counted(3, drops.clone())).is_err());
            assert_eq!(drops.load(Ordering::SeqCst), 3, "flavor {flavor}");
            drop(tx);
            assert_eq!(drops.load(Ordering::SeqCst), 3, "flavor {flavor}: no double drop");
        }
    });
}

/// A `select!` arm body re-enters `select!` on the same channels (a
/// recursive drain): every value is taken once, in order per channel.
#[test]
fn select_arm_bodies_that_reenter_select_on_the_same_channels() {
    fn drain(a: &Receiver<u32>, b: &Receiver<u32>, out: &mut Vec<u32>, depth: usize) {
        if depth == 0 {
            return;
        }
        fiber::select! {
            recv(a) -> v => { out.push(v.unwrap()); drain(a, b, out, depth - 1) },
            recv(b) -> v => { out.push(v.unwrap()); drain(a, b, out, depth - 1) },
            default => {},
        }
    }
    on_runtime(|| {
        let (ta, ra) = unbounded();
        let (tb, rb) = bounded(8);
        for i in 0..8 {
            ta.send(i).unwrap();
            tb.send(100 + i).unwrap();
        }
        let mut out = Vec::new();
        drain(&ra, &rb, &mut out, 64);
        assert_eq!(out.len(), 16);
        let a: Vec<u32> = out.iter().copied().filter(|v| *v < 100).collect();
        let b: Vec<u32> = out.iter().copied().filter(|v| *v >= 100).collect();
        assert_eq!(a, (0..8).collect::<Vec<_>>());
        assert_eq!(b, (100..108).collect::<Vec<_>>());
        assert!(ra.is_empty() && rb.is_empty());
    });
}

/// `rx.iter()` whose loop body drops the only sender: the loop still
/// yields every buffered value, then ends.
#[test]
fn an_iterator_loop_that_drops_the_only_sender_drains_then_ends() {
    on_runtime(|| {
        for flavor in 0..2 {
            let (tx, rx) = if flavor == 0 { bounded(4) } else { unbounded() };
            for i in 0..4 {
                tx.send(i).unwrap();
            }
            let mut tx = Some(tx);
            let mut got = Vec::new();
            for v in rx.iter() {
                drop(tx.take());
                got.push(v);
            }
            assert_eq!(got, [0, 1, 2, 3], "flavor {flavor}");
        }
    });
}

/// A value whose destructor calls `try_lock`/`lock` on its own mutex
/// (std: deadlock-or-panic for the blocking relock). Replacing it through
/// the guard runs the destructor with the lock held: `try_lock` reports
/// `WouldBlock`, as std's does; the new value is in place and the mutex
/// is usable afterwards.
#[test]
fn a_mutex_values_drop_on_assignment_tries_the_same_mutex() {
    struct Probe(u32, Arc<fiber::sync::Mutex<Option<Probe>>>, Arc<AtomicUsize>);
    impl Drop for Probe {
        fn drop(&mut self) {
            if matches!(self.1.try_lock(), Err(std::sync::TryLockError::WouldBlock)) {
                self.2.fetch_add(1, Ordering::SeqCst);
            }
        }
    }
    on_runtime(|| {
        let m = Arc::new(fiber::sync::Mutex::new(None));
        let blocked = Arc::new(AtomicUsize::new(0));
        *m.lock().unwrap() = Some(Probe(1, m.clone(), blocked.clone()));
        {
            let mut g = m.lock().unwrap();
            *g = Some(Probe(2, m.clone(), blocked.clone()));
        }
        assert_eq!(
            blocked.load(Ordering::SeqCst),
            1,
            "try_lock under the guard would block"
        );
        assert_eq!(m.lock().unwrap().as_ref().map(|p| p.0), Some(2));
        // Break the cycle; the destructor runs with the lock held again.
        let old = m.lock().unwrap().take();
        drop(old);
        assert_eq!(blocked.load(Ordering::SeqCst), 1, "dropped after the guard: lock free");
        assert!(m.try_lock().is_ok());
    });
}

/// A value's destructor panics while run by `*guard = new`: as with
/// std's mutex, the new value is in place and the mutex is poisoned (the
/// guard drops during the unwind); a follow-up lock still works.
#[test]
fn a_mutex_values_panicking_drop_on_assignment_matches_std() {
    struct Bomb(u32);
    impl Drop for Bomb {
        fn drop(&mut self) {
            if self.0 == 1 {
                panic!("bomb");
            }
        }
    }
    on_runtime(|| {
        let std_m = std::sync::Mutex::new(Bomb(1));
        let fib_m = fiber::sync::Mutex::new(Bomb(1));
        assert!(panic_message(|| *std_m.lock().unwrap() = Bomb(2)).is_some());
        assert!(panic_message(|| *fib_m.lock().unwrap() = Bomb(2)).is_some());
        assert_eq!(std_m.is_poisoned(), fib_m.is_poisoned());
        let s = std_m.lock().unwrap_or_else(|e| e.into_inner()).0;
        let f = fib_m.lock().unwrap_or_else(|e| e.into_inner()).0;
        assert_eq!(s, f);
        assert_eq!(f, 2);
        fib_m.clear_poison();
        assert!(fib_m.lock().is_ok());
        assert_eq!(fib_m.into_inner().unwrap().0, 2);
    });
}

/// A write guard's value whose destructor (run by `*w = new`) tries the
/// same `RwLock` for reading and writing: both would block; the lock is
/// usable afterwards for readers and writers.
#[test]
fn an_rwlock_values_drop_under_the_write_guard_tries_the_same_lock() {
    struct Probe(Arc<fiber::sync::RwLock<Vec<Probe>>>, Arc<AtomicUsize>);
    impl Drop for Probe {
        fn drop(&mut self) {
            let r = matches!(self.0.try_read(), Err(std::sync::TryLockError::WouldBlock));
            let w = matches!(self.0.try_write(), Err(std::sync::TryLockError::WouldBlock));
            if r && w {
                self.1.fetch_add(1, Ordering::SeqCst);
            }
        }
    }
    on_runtime(|| {
        let l = Arc::new(fiber::sync::RwLock::new(Vec::new()));
        let blocked = Arc::new(AtomicUsize::new(0));
        l.write().unwrap().push(Probe(l.clone(), blocked.clone()));
        *l.write().unwrap() = Vec::new();
        assert_eq!(blocked.load(Ordering::SeqCst), 1);
        let r1 = l.read().unwrap();
        let r2 = l.try_read().unwrap();
        assert!(r1.is_empty() && r2.is_empty());
        drop((r1, r2));
        l.write().unwrap().clear();
    });
}

/// `OnceLock` A's initializer initializes cell B, whose initializer calls
/// back into A: A is being initialized by this very fiber, so the inner
/// call panics naming the re-entrant call (spec/sync.md 3.5). Both cells
/// are left empty and usable: a later `get_or_init` of each works.
#[test]
fn once_lock_initializers_that_reenter_each_other_panic_and_leave_both_usable() {
    static A: fiber::sync::OnceLock<u32> = fiber::sync::OnceLock::new();
    static B: fiber::sync::OnceLock<u32> = fiber::sync::OnceLock::new();
    on_runtime(|| {
        let msg = panic_message(|| {
            A.get_or_init(|| *B.get_or_init(|| *A.get_or_init(|| 1) + 1) + 1);
        })
        .expect("re-entry panics");
        assert!(msg.contains("OnceLock::get_or_init"), "{msg}");
        assert_eq!(A.get(), None);
        assert_eq!(B.get(), None);
        // Another fiber is not the initializer: no false re-entry panic.
        let h = fiber::spawn(|| *B.get_or_init(|| 20));
        assert_eq!(h.join().unwrap(), 20);
        assert_eq!(*A.get_or_init(|| *B.get().unwrap() + 1), 21);
    });
}

/// `LazyLock::force` from inside its own initializer panics naming
/// `LazyLock::force`; afterwards the lock is poisoned (std's text), not
/// hung. `Once::call_once` inside its own closure panics too, and a
/// `call_once_force` then recovers the `Once`.
#[test]
fn lazy_lock_and_once_reentered_from_their_own_initializers() {
    static LAZY: fiber::sync::LazyLock<u32> = fiber::sync::LazyLock::new(|| *LAZY + 1);
    static ONCE: fiber::sync::Once = fiber::sync::Once::new();
    on_runtime(|| {
        let msg = panic_message(|| {
            let _ = *LAZY;
        })
        .expect("re-entry panics");
        assert!(msg.contains("LazyLock::force"), "{msg}");
        let again = panic_message(|| {
            let _ = *LAZY;
        })
        .expect("poisoned");
        assert!(again.contains("poisoned"), "{again}");

        let ran = AtomicUsize::new(0);
        let msg = panic_message(|| ONCE.call_once(|| ONCE.call_once(|| unreachable!()))).expect("re-entry panics");
        assert!(!msg.is_empty());
        assert!(!ONCE.is_completed());
        ONCE.call_once_force(|state| {
            assert!(state.is_poisoned());
            ran.fetch_add(1, Ordering::SeqCst);
        });
        assert!(ONCE.is_completed());
        ONCE.call_once(|| unreachable!());
        assert_eq!(ran.load(Ordering::SeqCst), 1);
    });
}

/// `Condvar::wait_while` predicates that notify the same condvar (one
/// and all) while two fibers wait on it: no waiter is lost or left
/// parked; both see the final state.
#[test]
fn condvar_predicates_that_notify_their_own_condvar() {
    on_runtime(|| {
        let pair = Arc::new((fiber::sync::Mutex::new(0u32), fiber::sync::Condvar::new()));
        let mut hs = Vec::new();
        for i in 0..2 {
            let p = pair.clone();
            hs.push(fiber::spawn(move || {
                let (m, cv) = &*p;
                let mut checks = 0;
                let g = cv
                    .wait_while(m.lock().unwrap(), |v| {
                        checks += 1;
                        if i == 0 {
                            cv.notify_one();
                        } else {
                            cv.notify_all();
                        }
                        *v < 3
                    })
                    .unwrap();
                (*g, checks)
            }));
        }
        for k in 1..=3 {
            let (m, cv) = &*pair;
            *m.lock().unwrap() = k;
            cv.notify_all();
            fiber::yield_now().unwrap();
        }
        for h in hs {
            let (v, checks) = h.join().unwrap();
            assert_eq!(v, 3);
            assert!(checks >= 1);
        }
        let (m, cv) = &*pair;
        let g = cv.wait_timeout(m.lock().unwrap(), ms(1)).unwrap();
        assert!(g.1.timed_out());
    });
}

/// A scoped child's capture spawns another child of the same scope from
/// its `Drop` (run when the child's closure returns): the scope waits for
/// that grandchild too, and its work is visible when the scope returns.
#[test]
fn a_scoped_childs_capture_spawns_on_the_scope_from_its_drop() {
    on_runtime(|| {
        let done = AtomicUsize::new(0);
        struct OnDrop<F: FnOnce()>(Option<F>);
        impl<F: FnOnce()> Drop for OnDrop<F> {
            fn drop(&mut self) {
                (self.0.take().unwrap())();
            }
        }
        fiber::scope(|s| {
            let done = &done;
            let sp = OnDrop(Some(move || {
                let _ = s.spawn(move || {
                    fiber::sleep(ms(5)).unwrap();
                    done.fetch_add(10, Ordering::SeqCst);
                });
            }));
            s.spawn(move || {
                let sp = sp;
                done.fetch_add(1, Ordering::SeqCst);
                drop(sp);
            });
        });
        assert_eq!(done.load(Ordering::SeqCst), 11);
    });
}

/// A fiber's output holds the join handle of a second fiber and joins it
/// in its `Drop`. The first fiber's handle is dropped (detached) while the
/// second still waits: the output's drop must be able to wait (on one
/// worker too), and the second fiber's result arrives.
#[test]
fn a_detached_fibers_output_joins_another_fiber_in_its_drop() {
    struct JoinOnDrop(Option<fiber::JoinHandle<u32>>, Sender<u32>);
    impl Drop for JoinOnDrop {
        fn drop(&mut self) {
            let v = self.0.take().unwrap().join().unwrap();
            self.1.send(v).unwrap();
        }
    }
    within(15, || {
        let rt = rt1();
        rt.block_on(|| {
            let (out_tx, out_rx) = unbounded();
            let (go_tx, go_rx) = bounded::<u32>(0);
            let b = fiber::spawn(move || go_rx.recv().unwrap() * 2);
            let out_tx2 = out_tx.clone();
            let a = fiber::spawn(move || JoinOnDrop(Some(b), out_tx2));
            // Detach `a` before or after it completes (it runs first on
            // this worker once we park below).
            drop(a);
            go_tx.send(21).unwrap();
            assert_eq!(out_rx.recv_timeout(ms(5000)), Ok(42));

            // Completed before the handle is dropped: the drop runs here.
            let (go_tx, go_rx) = bounded::<u32>(0);
            let b = fiber::spawn(move || go_rx.recv().unwrap() + 1);
            let a = fiber::spawn(move || JoinOnDrop(Some(b), out_tx));
            while !a.is_finished() {
                fiber::yield_now().unwrap();
            }
            let g = fiber::spawn(move || go_tx.send(1).unwrap());
            drop(a);
            g.join().unwrap();
            assert_eq!(out_rx.recv_timeout(ms(5000)), Ok(2));
        });
    });
}

/// A send arm's value expression closes its own channel and then panics
/// (the reservation is given back, after the close) while a receiver is
/// parked on the channel: the receiver must learn of the close (closed
/// and empty), not sleep for ever; the channel stays closed and empty.
#[test]
fn a_send_arms_value_expression_closes_then_panics_wakes_the_parked_receiver() {
    on_runtime(|| {
        for flavor in 0..3 {
            let (tx, rx) = match flavor {
                0 => bounded::<u32>(1),
                1 => unbounded(),
                _ => bounded(0),
            };
            let rx2 = rx.clone();
            let parked = fiber::spawn(move || rx2.recv_timeout(ms(3000)));
            wait_fiber_parked(parked.id());
            let msg = panic_message(|| {
                fiber::select! {
                    send(tx, {
                        assert!(tx.close());
                        if flavor < 3 {
                            panic!("value expression fails");
                        }
                        0
                    }) -> _r => unreachable!(),
                }
            });
            assert_eq!(msg.as_deref(), Some("value expression fails"), "flavor {flavor}");
            assert_eq!(
                parked.join().unwrap(),
                Err(RecvTimeoutError::Disconnected),
                "flavor {flavor}: the parked receiver sees the close"
            );
            assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected), "flavor {flavor}");
            assert!(tx.try_send(1).is_err(), "flavor {flavor}");
        }
    });
}

/// A send arm's value expression makes a blocking send into the same
/// channel while the arm holds a reservation: on a `bounded(2)` the other
/// slot takes it, on a rendezvous channel the second parked receiver does.
/// Both values arrive once; the channel keeps its capacity.
#[test]
fn a_send_arms_value_expression_sends_into_its_own_channel() {
    on_runtime(|| {
        let (tx, rx) = bounded::<u32>(2);
        fiber::select! {
            send(tx, {
                tx.send(9).unwrap();
                5
            }) -> r => r.unwrap(),
        }
        let mut got = vec![rx.try_recv().unwrap(), rx.try_recv().unwrap()];
        got.sort();
        assert_eq!(got, [5, 9]);
        assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
        tx.try_send(1).unwrap();
        tx.try_send(2).unwrap();
        assert!(tx.try_send(3).is_err());

        let (tx, rx) = bounded::<u32>(0);
        let mut hs = Vec::new();
        for _ in 0..2 {
            let r = rx.clone();
            let h = fiber::spawn(move || r.recv());
            wait_fiber_parked(h.id());
            hs.push(h);
        }
        fiber::select! {
            send(tx, {
                tx.send_timeout(9, ms(5000)).unwrap();
                5
            }) -> r => r.unwrap(),
        }
        let mut got: Vec<u32> = hs.into_iter().map(|h| h.join().unwrap().unwrap()).collect();
        got.sort();
        assert_eq!(got, [5, 9]);
    });
}
