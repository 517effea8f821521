//! Adversarial review, round 28: attacks on `1e36cf0` and `268075d`.
//! A `Mutex` waiter woken by a cancel keeps its queue node while awake
//! (`raw_mutex.rs`: `unpublish` / `publish` / `rewait` / `abandon`); a
//! channel wait that is over while a `select!` send arm holds its node
//! parks for the hand-off (`WaitKind::Handoff`, `wait_reservation_end`);
//! shutdown's reaper finishes fibers given up on while parked for a
//! hand-off; the deadlock monitor sweeps another runtime's dead timers.

use crate::common::{in_child, ms, panic_message, rt1, rt2, rt_fixed_grace, wait_parked, within};
use fiber::chan;
use fiber::sync::{Condvar, Mutex};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A value whose drops are counted.
struct Counted(Arc<AtomicUsize>, u32);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, SeqCst);
    }
}

/// Is fiber `id` of `rt` parked waiting for a channel hand-off?
fn parked_for_handoff(rt: &fiber::Runtime, id: fiber::FiberId) -> bool {
    rt.dump()
        .fibers
        .iter()
        .any(|f| f.id == id && f.state == fiber::core::state::FiberState::Parked && f.waiting.name() == "chan hand-off")
}

/// Wait (on a plain thread) until fiber `id` parks for a hand-off.
fn wait_handoff(rt: &fiber::Runtime, id: fiber::FiberId) {
    let start = Instant::now();
    while !parked_for_handoff(rt, id) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the fiber never parked for the held hand-off"
        );
        std::thread::sleep(ms(2));
    }
}

/// Wait (on a plain thread, up to 10 s) until `a` reaches `n`.
fn wait_count(a: &AtomicUsize, n: usize) {
    let start = Instant::now();
    while a.load(SeqCst) < n && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(ms(5));
    }
}

/// std's `Mutex` (and the project's spec/sync.md 3.1): at most one owner
/// at a time, and every `lock` eventually returns (a lock wait is no
/// cancellation point: a cancelled fiber still takes the lock). Fibers on
/// 2 workers and plain threads contend for one lock while every fiber is
/// cancelled at a random point of its run (the cancel wakes a queued
/// waiter, whose node stays queued while it is awake): no two owners, no
/// lock lost, every acquisition counted.
#[test]
fn mutex_exclusion_and_progress_with_cancelled_waiters_and_thread_holders() {
    within(90, || {
        let rt = rt2();
        const ROUNDS: usize = 30;
        const FIBERS: usize = 4;
        const PER: usize = 60;
        let m = Arc::new(Mutex::new(0usize));
        let inside = Arc::new(AtomicUsize::new(0));
        let crit = |m: &Mutex<usize>, inside: &AtomicUsize| {
            let mut g = m.lock().unwrap();
            assert_eq!(inside.fetch_add(1, SeqCst), 0, "two owners at once");
            for _ in 0..50 {
                std::hint::spin_loop();
            }
            *g += 1;
            inside.fetch_sub(1, SeqCst);
        };
        for round in 0..ROUNDS {
            let done = Arc::new(AtomicUsize::new(0));
            let started = Arc::new(AtomicUsize::new(0));
            let mut handles = Vec::new();
            for _ in 0..FIBERS {
                let (m, inside, done, started) = (m.clone(), inside.clone(), done.clone(), started.clone());
                handles.push(rt.spawn(move || {
                    started.fetch_add(1, SeqCst);
                    for _ in 0..PER {
                        crit(&m, &inside);
                    }
                    done.fetch_add(1, SeqCst);
                }));
            }
            let (m2, i2) = (m.clone(), inside.clone());
            let thread = std::thread::spawn(move || {
                for _ in 0..PER {
                    crit(&m2, &i2);
                }
            });
            // A fiber cancelled before it starts never runs its body: cancel
            // only running ones.
            while started.load(SeqCst) < FIBERS {
                std::thread::yield_now();
            }
            // Cancel each fiber at a varying point, some twice.
            for (i, h) in handles.iter().enumerate() {
                std::thread::sleep(Duration::from_micros(((round * 7 + i * 13) % 40) as u64 * 25));
                h.cancel();
                if i % 2 == 0 {
                    h.cancel();
                }
            }
            for h in handles {
                let _ = h.join();
            }
            thread.join().unwrap();
            assert_eq!(
                done.load(SeqCst),
                FIBERS,
                "round {round}: a fiber did not finish its locks"
            );
            assert_eq!(
                *m.lock().unwrap(),
                (round + 1) * (FIBERS + 1) * PER,
                "round {round}: acquisitions"
            );
            assert!(m.try_lock().is_ok(), "round {round}: the lock ends free");
        }
    });
}

/// spec/sync.md 3.1: a cancel's wake leaves the waiter's node queued; a
/// `try_lock` (barging) while it is awake, and unlocks that hand the lock
/// to it, must never make two owners, and once the holders are gone the
/// lock is free (no `QUEUED` left behind by a node taken out by `abandon`).
/// The waiter is cancelled while a thread holds the lock; the thread then
/// unlocks and barges back in with `try_lock` in a tight loop.
#[test]
fn try_lock_barging_while_a_cancelled_waiter_is_awake_never_makes_two_owners() {
    within(90, || {
        let rt = rt2();
        let m = Arc::new(Mutex::new(()));
        let inside = Arc::new(AtomicUsize::new(0));
        for round in 0..150 {
            let g = m.lock().unwrap();
            let got = Arc::new(AtomicUsize::new(0));
            let mut waiters = Vec::new();
            for _ in 0..2 {
                let (m, inside, got) = (m.clone(), inside.clone(), got.clone());
                waiters.push(rt.spawn(move || {
                    let _g = m.lock().unwrap();
                    assert_eq!(inside.fetch_add(1, SeqCst), 0, "two owners at once");
                    std::hint::spin_loop();
                    inside.fetch_sub(1, SeqCst);
                    got.fetch_add(1, SeqCst);
                }));
            }
            wait_parked(&rt, 2);
            if round % 3 != 2 {
                // Past the 1 ms starvation threshold now and then.
                std::thread::sleep(Duration::from_micros((round % 5) as u64 * 400));
            }
            waiters[round % 2].cancel();
            drop(g);
            // Barge in while the cancelled waiter may be awake.
            for _ in 0..20 {
                if let Ok(g2) = m.try_lock() {
                    assert_eq!(inside.fetch_add(1, SeqCst), 0, "try_lock: two owners at once");
                    inside.fetch_sub(1, SeqCst);
                    drop(g2);
                }
            }
            for w in waiters {
                let _ = w.join();
            }
            assert_eq!(got.load(SeqCst), 2, "round {round}: a waiter never got the lock");
            assert!(m.try_lock().is_ok(), "round {round}: the lock ends free");
        }
    });
}

/// std's `Condvar`: a wait releases the mutex and re-acquires it before it
/// returns; the project's `Condvar::wait_while` also returns early when
/// the fiber is cancelled (with the lock held). Consumers cancelled while
/// they wait or re-lock (through the same mutex, whose waiter keeps its
/// node across a cancel's wake) lose no item and take none twice, and
/// the mutex never has two owners.
#[test]
fn condvar_consumers_cancelled_mid_wait_lose_and_duplicate_no_item() {
    within(90, || {
        let rt = rt2();
        const ITEMS: usize = 400;
        struct State {
            queue: std::collections::VecDeque<usize>,
            closed: bool,
        }
        let state = Arc::new((
            Mutex::new(State {
                queue: Default::default(),
                closed: false,
            }),
            Condvar::new(),
        ));
        let inside = Arc::new(AtomicUsize::new(0));
        let seen = Arc::new(std::sync::Mutex::new(vec![0u8; ITEMS]));
        let mut consumers = Vec::new();
        for _ in 0..4 {
            let (state, inside, seen) = (state.clone(), inside.clone(), seen.clone());
            consumers.push(rt.spawn(move || loop {
                let (m, cv) = &*state;
                let mut g = cv
                    .wait_while(m.lock().unwrap(), |s| s.queue.is_empty() && !s.closed)
                    .unwrap();
                assert_eq!(inside.fetch_add(1, SeqCst), 0, "two owners at once");
                let item = g.queue.pop_front();
                let stop = g.closed || (item.is_none() && fiber::is_cancelled());
                inside.fetch_sub(1, SeqCst);
                drop(g);
                if let Some(i) = item {
                    seen.lock().unwrap()[i] += 1;
                } else if stop {
                    return;
                }
            }));
        }
        // Producers: one fiber, one thread.
        let produce = move |state: &(Mutex<State>, Condvar), inside: &AtomicUsize, range: std::ops::Range<usize>| {
            for i in range {
                let (m, cv) = state;
                let mut g = m.lock().unwrap();
                assert_eq!(inside.fetch_add(1, SeqCst), 0, "two owners at once");
                g.queue.push_back(i);
                inside.fetch_sub(1, SeqCst);
                drop(g);
                cv.notify_one();
            }
        };
        let (s1, i1) = (state.clone(), inside.clone());
        let pf = rt.spawn(move || produce(&s1, &i1, 0..ITEMS / 2));
        let (s2, i2) = (state.clone(), inside.clone());
        let pt = std::thread::spawn(move || produce(&s2, &i2, ITEMS / 2..ITEMS));
        // Cancel two of the consumers while items flow.
        std::thread::sleep(ms(2));
        consumers[0].cancel();
        std::thread::sleep(ms(1));
        consumers[2].cancel();
        pf.join().unwrap();
        pt.join().unwrap();
        {
            let (m, cv) = &*state;
            m.lock().unwrap().closed = true;
            cv.notify_all();
        }
        for c in consumers {
            let _ = c.join();
        }
        // What the consumers left is taken here.
        let left: Vec<usize> = state.0.lock().unwrap().queue.drain(..).collect();
        let mut seen = seen.lock().unwrap();
        for i in left {
            seen[i] += 1;
        }
        let wrong: Vec<(usize, u8)> = seen.iter().copied().enumerate().filter(|&(_, n)| n != 1).collect();
        assert!(wrong.is_empty(), "items not taken exactly once: {wrong:?}");
    });
}

/// The project's shutdown (spec/sched.md) unwinds a fiber parked in a
/// non-cancellable lock wait; spec/sync.md 3.1: its `Io`'s drop takes
/// the node out (passing on a lock handed to it). Fibers queued behind a
/// plain thread's hold, some of them awake from a cancel at the moment,
/// are unwound by a runtime drop while the thread unlocks concurrently:
/// the drop returns, the dropping thread is not left panicking, and the
/// lock ends free (a plain thread can take it again, and `try_lock`
/// succeeds after that): no node of a freed stack is left in the queue.
#[test]
fn runtime_drop_with_cancelled_lock_waiters_queued_behind_a_thread_holder() {
    in_child(
        "runtime_drop_with_cancelled_lock_waiters_queued_behind_a_thread_holder",
        60,
        || {
            for round in 0..20u64 {
                let rt = rt_fixed_grace(2, ms(30));
                let m = Arc::new(Mutex::new(0u32));
                // The holder thread takes the lock first.
                let (locked_tx, locked_rx) = std::sync::mpsc::channel::<()>();
                let (tx, rx) = std::sync::mpsc::channel::<()>();
                let m2 = m.clone();
                let holder = std::thread::spawn(move || {
                    let g = m2.lock().unwrap();
                    locked_tx.send(()).unwrap();
                    let _ = rx.recv();
                    std::thread::sleep(Duration::from_micros(round * 300));
                    drop(g);
                    // Take it again from this thread.
                    *m2.lock().unwrap() += 100;
                });
                locked_rx.recv().unwrap();
                let mut hs = Vec::new();
                for _ in 0..3 {
                    let m = m.clone();
                    hs.push(rt.spawn(move || {
                        *m.lock().unwrap() += 1;
                    }));
                }
                wait_parked(&rt, 3);
                hs[0].cancel();
                hs[2].cancel();
                // The holder unlocks while the runtime is being dropped (or
                // after, on even rounds).
                if round % 2 == 1 {
                    tx.send(()).unwrap();
                }
                let start = Instant::now();
                drop(rt);
                assert!(start.elapsed() < Duration::from_secs(10), "round {round}: the drop");
                assert!(
                    !std::thread::panicking(),
                    "round {round}: the dropping thread is left panicking"
                );
                let _ = tx.send(());
                holder.join().unwrap();
                let g = m.try_lock().expect("the lock ends free");
                assert!(*g >= 100, "round {round}: the thread never took the lock again");
                drop(g);
                drop(hs);
            }
        },
    );
}

/// crossbeam-channel / Go: once a select's send arm is chosen the value is
/// handed over; the project's spec/chan.md: a fiber whose wait is over (a
/// cancel) while its node is reserved parks ("chan hand-off") until the
/// reservation ends, and the hand-off still completes. The receiver is
/// cancelled while a plain thread's select holds its node: it parks for
/// the hand-off, then receives the value (not lost), which is dropped
/// exactly once.
#[test]
fn a_receiver_cancelled_during_a_thread_held_hand_off_still_receives_the_value() {
    within(30, || {
        for workers in [1, 2] {
            let rt = rt_fixed_grace(workers, ms(300));
            let drops = Arc::new(AtomicUsize::new(0));
            let (tx, rx) = chan::bounded::<Counted>(0);
            let got = Arc::new(std::sync::Mutex::new(None));
            let g2 = got.clone();
            let receiver = rt.spawn(move || {
                let r = rx.recv();
                let v = r.map(|c| c.1);
                *g2.lock().unwrap() = Some(v);
                // Keep the channel's receiving side alive until here.
                drop(rx);
            });
            while tx.waiting().0 < 1 {
                std::thread::yield_now();
            }
            let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
            let entered = Arc::new(AtomicBool::new(false));
            let (e2, d2) = (entered.clone(), drops.clone());
            let holder = std::thread::spawn(move || {
                fiber::select! {
                    send(tx, {
                        e2.store(true, SeqCst);
                        go_rx.recv().unwrap();
                        Counted(d2, 9)
                    }) -> r => r.is_ok(),
                }
            });
            while !entered.load(SeqCst) {
                std::thread::yield_now();
            }
            receiver.cancel();
            wait_handoff(&rt, receiver.id());
            go_tx.send(()).unwrap();
            assert!(holder.join().unwrap(), "{workers} workers: the send arm failed");
            let _ = receiver.join();
            assert_eq!(
                got.lock().unwrap().take(),
                Some(Ok(9)),
                "{workers} workers: the receiver's result"
            );
            assert_eq!(drops.load(SeqCst), 1, "{workers} workers: the value's drops");
        }
    });
}

/// crossbeam-channel's `select!` with a timeout arm and Go's select: once
/// the other side's send arm is chosen the value is handed over, even if
/// the receiving select's own timeout passes while the value expression
/// runs (spec/chan.md: the receiver parks for the hand-off). Both sides
/// are selects; the receiving select has several arms, only one of them
/// reserved; the receiving fiber waits as "chan hand-off" and then gets
/// that arm with the value.
#[test]
fn a_receiving_select_with_several_arms_whose_timeout_passes_during_a_hand_off_gets_the_value() {
    within(30, || {
        for workers in [1, 2] {
            let rt = rt_fixed_grace(workers, ms(300));
            let drops = Arc::new(AtomicUsize::new(0));
            let (tx1, rx1) = chan::bounded::<Counted>(0);
            let (tx2, rx2) = chan::bounded::<Counted>(0);
            let (_tx3, rx3) = chan::bounded::<Counted>(1);
            let receiver = rt.spawn(move || {
                fiber::select! {
                    recv(rx1) -> v => v.map(|c| (1, c.1)).ok(),
                    recv(rx2) -> v => v.map(|c| (2, c.1)).ok(),
                    recv(rx3) -> v => v.map(|c| (3, c.1)).ok(),
                    default(ms(40)) => None,
                }
            });
            while tx2.waiting().0 < 1 {
                std::thread::yield_now();
            }
            let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
            let entered = Arc::new(AtomicBool::new(false));
            let (e2, d2) = (entered.clone(), drops.clone());
            let holder = std::thread::spawn(move || {
                let (_keep, never) = chan::bounded::<u32>(0);
                fiber::select! {
                    recv(never) -> _ => false,
                    send(tx2, {
                        e2.store(true, SeqCst);
                        go_rx.recv().unwrap();
                        Counted(d2, 5)
                    }) -> r => r.is_ok(),
                }
            });
            while !entered.load(SeqCst) {
                std::thread::yield_now();
            }
            wait_handoff(&rt, receiver.id());
            go_tx.send(()).unwrap();
            assert!(holder.join().unwrap(), "{workers} workers: the send arm failed");
            assert_eq!(receiver.join().unwrap(), Some((2, 5)), "{workers} workers");
            assert_eq!(drops.load(SeqCst), 1, "{workers} workers: the value's drops");
            drop(tx1);
        }
    });
}

/// crossbeam-channel: a select whose send arm's value expression panics
/// sends nothing and propagates the panic; Go/crossbeam `recv_timeout`
/// returns `Timeout` once its deadline passed with nothing received (the
/// channel still connected). The receiver, parked for the hand-off after
/// its deadline, is released by the holder's unwind and times out; the
/// panic reaches the holder's caller with its own message.
#[test]
fn a_hand_off_whose_value_expression_panics_releases_the_timed_out_receiver() {
    within(30, || {
        for workers in [1, 2] {
            let rt = rt_fixed_grace(workers, ms(300));
            let (tx, rx) = chan::bounded::<u32>(0);
            let rx2 = rx.clone();
            let receiver = rt.spawn(move || rx2.recv_timeout(ms(30)));
            while tx.waiting().0 < 1 {
                std::thread::yield_now();
            }
            let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
            let entered = Arc::new(AtomicBool::new(false));
            let e2 = entered.clone();
            let t2 = tx.clone();
            let holder = std::thread::spawn(move || {
                panic_message(move || {
                    fiber::select! {
                        send(t2, {
                            e2.store(true, SeqCst);
                            go_rx.recv().unwrap();
                            if true {
                                panic!("value expression failed");
                            }
                            1
                        }) -> _ => {},
                    }
                })
            });
            while !entered.load(SeqCst) {
                std::thread::yield_now();
            }
            wait_handoff(&rt, receiver.id());
            go_tx.send(()).unwrap();
            assert_eq!(holder.join().unwrap().as_deref(), Some("value expression failed"));
            assert_eq!(
                receiver.join().unwrap(),
                Err(chan::RecvTimeoutError::Timeout),
                "{workers} workers"
            );
            // The channel still works both ways.
            let r2 = rt.spawn({
                let tx = tx.clone();
                move || tx.send(3)
            });
            assert_eq!(rt.block_on(move || rx.recv_timeout(Duration::from_secs(5))), Ok(3));
            r2.join().unwrap().unwrap();
        }
    });
}

/// crossbeam: the value of a chosen send arm is handed over even if the
/// receiver's deadline passes meanwhile. The holder is a fiber of the same
/// one-worker runtime whose value expression runs `fiber::blocking`: the
/// receiver parks for the hand-off (its worker free for the holder's
/// return) and gets the value; `send_timeout` on the other side of a
/// second channel is held the same way by a receiving select.
#[test]
fn hand_offs_held_across_a_blocking_call_complete_for_recv_timeout() {
    within(30, || {
        let rt = rt1();
        let (tx, rx) = chan::bounded::<u32>(0);
        let receiver = rt.spawn(move || rx.recv_timeout(ms(20)));
        wait_parked(&rt, 1);
        let holder = rt.spawn(move || {
            fiber::select! {
                send(tx, fiber::blocking(|| {
                    std::thread::sleep(ms(200));
                    11
                })) -> r => r.is_ok(),
            }
        });
        assert!(holder.join().unwrap());
        assert_eq!(receiver.join().unwrap(), Ok(11));
    });
}

/// The project's shutdown (runtime.rs `reap_later`, spec/chan.md): a fiber
/// given up on while it waits for a hand-off held on a plain thread is
/// finished once the hand-off ends; the value handed into its node is
/// dropped by its unwind, exactly once; the runtime's drop returns at once
/// and does not leave the dropping thread panicking.
#[test]
fn shutdown_finishes_a_receiver_whose_hand_off_a_thread_holds_long() {
    in_child(
        "shutdown_finishes_a_receiver_whose_hand_off_a_thread_holds_long",
        40,
        || {
            for workers in [1, 2] {
                let rt = rt_fixed_grace(workers, ms(30));
                let drops = Arc::new(AtomicUsize::new(0));
                let unwound = Arc::new(AtomicUsize::new(0));
                let (tx, rx) = chan::bounded::<Counted>(0);
                let u2 = unwound.clone();
                let receiver = rt.spawn(move || {
                    let _flag = Counted(u2, 0);
                    let _ = rx.recv();
                });
                while tx.waiting().0 < 1 {
                    std::thread::yield_now();
                }
                let entered = Arc::new(AtomicBool::new(false));
                let (e2, d2) = (entered.clone(), drops.clone());
                let holder = std::thread::spawn(move || {
                    fiber::select! {
                        send(tx, {
                            e2.store(true, SeqCst);
                            std::thread::sleep(ms(600));
                            Counted(d2, 1)
                        }) -> r => r.is_ok(),
                    }
                });
                while !entered.load(SeqCst) {
                    std::thread::yield_now();
                }
                drop(receiver);
                let start = Instant::now();
                drop(rt);
                assert!(
                    start.elapsed() < ms(450),
                    "{workers} workers: the drop waited for the holder"
                );
                assert!(
                    !std::thread::panicking(),
                    "{workers} workers: the dropping thread is left panicking"
                );
                assert!(holder.join().unwrap(), "{workers} workers: the send arm failed");
                wait_count(&unwound, 1);
                wait_count(&drops, 1);
                // Give a double drop a chance to show.
                std::thread::sleep(ms(50));
                assert_eq!(unwound.load(SeqCst), 1, "{workers} workers: the receiver's unwinds");
                assert_eq!(drops.load(SeqCst), 1, "{workers} workers: the value's drops");
            }
        },
    );
}

/// The project's `reap_later`: the reaper waits for what only other
/// threads can end by sleeping (backing off to 100 ms), not spinning; the
/// runtime's drop returns at once. A holder whose value expression does
/// not end for a long time: the drop returns, the dropping thread is not
/// panicking, the process stays idle (the reaper does not spin hot) while
/// the holder runs, and once it ends the value is dropped exactly once.
#[test]
fn the_reaper_waits_idle_for_a_hand_off_that_takes_long_to_end() {
    in_child(
        "the_reaper_waits_idle_for_a_hand_off_that_takes_long_to_end",
        40,
        || {
            let rt = rt_fixed_grace(2, ms(30));
            let drops = Arc::new(AtomicUsize::new(0));
            let unwound = Arc::new(AtomicUsize::new(0));
            let (tx, rx) = chan::bounded::<Counted>(0);
            let u2 = unwound.clone();
            rt.spawn(move || {
                let _flag = Counted(u2, 0);
                let _ = rx.recv();
            });
            while tx.waiting().0 < 1 {
                std::thread::yield_now();
            }
            let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
            let entered = Arc::new(AtomicBool::new(false));
            let (e2, d2) = (entered.clone(), drops.clone());
            let holder = std::thread::spawn(move || {
                fiber::select! {
                    send(tx, {
                        e2.store(true, SeqCst);
                        go_rx.recv().unwrap();
                        Counted(d2, 1)
                    }) -> r => r.is_ok(),
                }
            });
            while !entered.load(SeqCst) {
                std::thread::yield_now();
            }
            let start = Instant::now();
            drop(rt);
            assert!(
                start.elapsed() < Duration::from_secs(3),
                "the drop waited for the holder"
            );
            assert!(!std::thread::panicking(), "the dropping thread is left panicking");
            // Let the reaper settle into its wait, then measure.
            std::thread::sleep(ms(300));
            let (cpu0, wall0) = (crate::common::cpu_time(), Instant::now());
            std::thread::sleep(ms(1000));
            let (cpu, wall) = (crate::common::cpu_time() - cpu0, wall0.elapsed());
            assert!(
                cpu < wall / 4,
                "the process burnt {cpu:?} of CPU in {wall:?} of waiting"
            );
            assert_eq!(
                unwound.load(SeqCst),
                0,
                "the receiver was unwound before its hand-off ended"
            );
            go_tx.send(()).unwrap();
            assert!(holder.join().unwrap());
            wait_count(&unwound, 1);
            wait_count(&drops, 1);
            std::thread::sleep(ms(50));
            assert_eq!(unwound.load(SeqCst), 1, "the receiver's unwinds");
            assert_eq!(drops.load(SeqCst), 1, "the value's drops");
        },
    );
}

/// The project's `reap_later` (spec/sched.md): fibers given up on while
/// they wait for hand-offs held elsewhere are each finished once their own
/// hand-off ends, whatever the others do. Three receivers: one held by a
/// thread that completes after 200 ms, one by a thread that completes
/// after 700 ms, one by a thread whose value expression panics (gives the
/// hand-off back) after 400 ms. Every receiver is unwound exactly once and
/// each value produced is dropped exactly once.
#[test]
fn the_reaper_finishes_receivers_with_mixed_holders_each_once() {
    in_child("the_reaper_finishes_receivers_with_mixed_holders_each_once", 40, || {
        let rt = rt_fixed_grace(2, ms(30));
        let drops = Arc::new(AtomicUsize::new(0));
        let unwound = Arc::new(AtomicUsize::new(0));
        let mut holders = Vec::new();
        let mut keep = Vec::new();
        for (i, (delay, panics)) in [(200, false), (700, false), (400, true)].into_iter().enumerate() {
            let (tx, rx) = chan::bounded::<Counted>(0);
            let u2 = unwound.clone();
            rt.spawn(move || {
                let _flag = Counted(u2, 0);
                let _ = rx.recv();
            });
            while tx.waiting().0 < 1 {
                std::thread::yield_now();
            }
            let entered = Arc::new(AtomicBool::new(false));
            let (e2, d2) = (entered.clone(), drops.clone());
            let t2 = tx.clone();
            keep.push(tx);
            holders.push(std::thread::spawn(move || {
                let _ = panic_message(move || {
                    fiber::select! {
                        send(t2, {
                            e2.store(true, SeqCst);
                            std::thread::sleep(ms(delay));
                            if panics {
                                panic!("holder {i} gives up");
                            }
                            Counted(d2, i as u32)
                        }) -> _ => {},
                    }
                });
            }));
            while !entered.load(SeqCst) {
                std::thread::yield_now();
            }
        }
        let start = Instant::now();
        drop(rt);
        assert!(start.elapsed() < ms(190), "the drop waited for a holder");
        assert!(!std::thread::panicking(), "the dropping thread is left panicking");
        for h in holders {
            h.join().unwrap();
        }
        wait_count(&unwound, 3);
        wait_count(&drops, 2);
        std::thread::sleep(ms(100));
        assert_eq!(unwound.load(SeqCst), 3, "receivers unwound");
        assert_eq!(drops.load(SeqCst), 2, "values dropped (2 produced)");
        drop(keep);
    });
}

/// The project's `reap_later` and spec/chan.md: a holder in another
/// runtime ends the hand-off when its select completes or gives it back;
/// a runtime's teardown unwinds a fiber parked in a `non_cancellable`
/// sleep, and a select unwound in its value expression gives the
/// reservation back. Runtime B's receiver is held by runtime A's select;
/// B is dropped first, then A (before the select could complete): both
/// drops return, nothing is sent (no value exists), and B's receiver is
/// unwound once A's holder gave the hand-off back.
#[test]
fn a_receiver_held_by_another_runtime_dropped_before_its_select_completes_is_finished() {
    in_child(
        "a_receiver_held_by_another_runtime_dropped_before_its_select_completes_is_finished",
        40,
        || {
            for workers in [1, 2] {
                let a = rt_fixed_grace(workers, ms(30));
                let b = rt_fixed_grace(workers, ms(30));
                let drops = Arc::new(AtomicUsize::new(0));
                let unwound = Arc::new(AtomicUsize::new(0));
                let (tx, rx) = chan::bounded::<Counted>(0);
                let u2 = unwound.clone();
                b.spawn(move || {
                    let _flag = Counted(u2, 0);
                    let _ = rx.recv();
                });
                while tx.waiting().0 < 1 {
                    std::thread::yield_now();
                }
                let entered = Arc::new(AtomicBool::new(false));
                let (e2, d2, u3) = (entered.clone(), drops.clone(), unwound.clone());
                let t2 = tx.clone();
                a.spawn(move || {
                    let _flag = Counted(u3, 0);
                    fiber::select! {
                        send(t2, {
                            e2.store(true, SeqCst);
                            fiber::non_cancellable(|| {
                                let _ = fiber::sleep(Duration::from_secs(30));
                            });
                            Counted(d2, 1)
                        }) -> _ => {},
                    }
                });
                while !entered.load(SeqCst) {
                    std::thread::yield_now();
                }
                let start = Instant::now();
                drop(b);
                assert!(start.elapsed() < Duration::from_secs(3), "{workers} workers: B's drop");
                assert!(!std::thread::panicking(), "{workers} workers: panicking after B's drop");
                let start = Instant::now();
                drop(a);
                assert!(start.elapsed() < Duration::from_secs(3), "{workers} workers: A's drop");
                assert!(!std::thread::panicking(), "{workers} workers: panicking after A's drop");
                wait_count(&unwound, 2);
                std::thread::sleep(ms(50));
                assert_eq!(
                    unwound.load(SeqCst),
                    2,
                    "{workers} workers: holder and receiver unwound"
                );
                assert_eq!(drops.load(SeqCst), 0, "{workers} workers: no value was produced");
                assert_eq!(tx.waiting(), (0, 0), "{workers} workers: nothing left queued");
            }
        },
    );
}

/// Go's deadlock report fires only when nothing can wake a goroutine; the
/// README holds the report off while another runtime *acts*, a pending
/// (live) timer counting. Here another runtime's fiber sleeps 2.5 s (a
/// live timer, among many dead entries of answered `recv_timeout(1h)`s),
/// then sends to this runtime's root: no deadlock may be reported
/// (`FIBER_DEADLOCK_ABORT=1` would abort), the root receives the value.
#[test]
fn no_deadlock_report_while_another_runtime_holds_a_live_timer_among_dead_ones() {
    const C: &str = "no_deadlock_report_while_another_runtime_holds_a_live_timer_among_dead_ones";
    let outcome = crate::common::child_outcome(C, 30, &[("FIBER_DEADLOCK_ABORT", "1")], || {
        let other = rt2();
        let (tx, rx) = chan::bounded::<u32>(0);
        let feeder = other.spawn(move || {
            // Dead entries: answered long receives.
            for i in 0..50 {
                let (t, r) = chan::bounded::<u32>(1);
                t.send(i).unwrap();
                let h = fiber::spawn(move || r.recv_timeout(Duration::from_secs(3600)));
                assert_eq!(h.join().unwrap(), Ok(i));
            }
            for _ in 0..20 {
                let (t, r) = chan::bounded::<u32>(0);
                let h = fiber::spawn(move || r.recv_timeout(Duration::from_secs(3600)));
                while t.waiting().0 < 1 {
                    let _ = fiber::yield_now();
                }
                t.send(1).unwrap();
                assert_eq!(h.join().unwrap(), Ok(1));
            }
            fiber::sleep(ms(2500)).unwrap();
            tx.send(42).unwrap();
        });
        let a = rt2();
        assert_eq!(a.block_on(move || rx.recv()), Ok(42));
        feeder.join().unwrap();
    });
    if let Some((status, stderr)) = outcome {
        assert!(
            status.success() && !stderr.contains("deadlock"),
            "status {status:?}, stderr:\n{stderr}"
        );
    }
}

/// crossbeam-channel / Go: a value whose send arm reports success was
/// received by exactly one receiver, and a value is never lost nor
/// duplicated; spec/chan.md: a receive whose deadline passes while a
/// select's send arm holds its node still takes that value. Receivers
/// with short deadlines on 2 workers race thread selects whose value
/// expressions take a varying time: every success reported by a send arm
/// matches one received value, and every value made is dropped once.
#[test]
fn short_deadlines_racing_slow_value_expressions_lose_and_duplicate_nothing() {
    within(60, || {
        let rt = rt2();
        let drops = Arc::new(AtomicUsize::new(0));
        let made = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = chan::bounded::<Counted>(0);
        let stop = Arc::new(AtomicBool::new(false));
        let received = Arc::new(AtomicUsize::new(0));
        let mut receivers = Vec::new();
        for r in 0..3u64 {
            let (rx, stop, received) = (rx.clone(), stop.clone(), received.clone());
            receivers.push(rt.spawn(move || {
                let mut i = 0u64;
                while !stop.load(SeqCst) {
                    i += 1;
                    if let Ok(v) = rx.recv_timeout(Duration::from_micros(200 + (i * 37 + r * 101) % 900)) {
                        received.fetch_add(1, SeqCst);
                        drop(v);
                    }
                }
            }));
        }
        let mut holders = Vec::new();
        for h in 0..2u64 {
            let (tx, drops, made) = (tx.clone(), drops.clone(), made.clone());
            holders.push(std::thread::spawn(move || {
                let mut sent = 0usize;
                for i in 0..150u64 {
                    let ok = fiber::select! {
                        send(tx, {
                            std::thread::sleep(Duration::from_micros((i * 53 + h * 17) % 1500));
                            made.fetch_add(1, SeqCst);
                            Counted(drops.clone(), i as u32)
                        }) -> r => r.is_ok(),
                        default(ms(3)) => false,
                    };
                    sent += usize::from(ok);
                }
                sent
            }));
        }
        let sent: usize = holders.into_iter().map(|h| h.join().unwrap()).sum();
        stop.store(true, SeqCst);
        for r in receivers {
            r.join().unwrap();
        }
        drop((tx, rx));
        assert_eq!(received.load(SeqCst), sent, "values received against sends reported");
        assert_eq!(drops.load(SeqCst), made.load(SeqCst), "values made against dropped");
    });
}
