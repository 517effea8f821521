//! Adversarial: `select!` with timer arms and the timer channels, against
//! crossbeam-channel's documented behaviour (`after`, `tick`, `never`,
//! `default(timeout)`) and Go's select (random choice among ready arms, a
//! closed channel is always ready, a nil channel never is).

use fiber::chan::{self, RecvTimeoutError, TryRecvError};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{in_child, ms, rt, rt1, within};

/// Run `f` in a fiber and on a plain thread.
fn both(f: fn()) {
    within(20, move || {
        f();
        rt().block_on(f);
    })
}

#[test]
fn after_delivers_exactly_one_instant_and_never_disconnects() {
    // crossbeam: "exactly one message will be sent after duration elapses";
    // capacity 1; never disconnected.
    both(|| {
        let start = Instant::now();
        let a = chan::after(ms(5));
        assert_eq!(a.capacity(), Some(1));
        let when = a.recv().unwrap();
        assert!(when >= start + ms(5), "the instant is not before the deadline");
        assert!(start.elapsed() >= ms(5), "after() never fires early");
        assert_eq!(a.recv_timeout(ms(20)), Err(RecvTimeoutError::Timeout));
        assert_eq!(a.try_recv(), Err(TryRecvError::Empty));
    })
}

#[test]
fn tick_buffers_at_most_one_message_and_is_never_early() {
    // crossbeam: tick is bounded with capacity 1 and never disconnected.
    both(|| {
        let start = Instant::now();
        let t = chan::tick(ms(25));
        let first = t.recv().unwrap();
        assert!(first >= start + ms(25));
        std::thread::sleep(ms(130));
        assert!(t.len() <= 1, "ticks do not pile up: len {}", t.len());
        assert!(t.try_recv().is_ok(), "a tick is waiting after 5 periods");
        assert_eq!(t.try_recv(), Err(TryRecvError::Empty), "only one tick was buffered");
        let mut last = first;
        for _ in 0..3 {
            let next = t.recv().unwrap();
            assert!(next > last, "tick instants increase");
            last = next;
        }
        assert!(!t.is_closed());
    })
}

#[test]
fn never_is_never_ready_and_never_disconnected() {
    both(|| {
        let n = chan::never::<u32>();
        assert_eq!(n.try_recv(), Err(TryRecvError::Empty));
        assert_eq!(n.recv_timeout(ms(5)), Err(RecvTimeoutError::Timeout));
        let (tx, rx) = chan::unbounded::<u32>();
        tx.send(3).unwrap();
        // Go: a nil channel's arm is never chosen.
        for _ in 0..20 {
            let v = fiber::select! {
                recv(n) -> _ => panic!("never() was selected"),
                recv(rx) -> v => v.unwrap(),
            };
            assert_eq!(v, 3);
            tx.send(3).unwrap();
        }
    })
}

#[test]
fn a_losing_timer_arm_keeps_its_tick_and_a_losing_channel_arm_keeps_its_value() {
    // Both arms ready: whichever loses must not have consumed.
    both(|| {
        let (mut channel_wins, mut timer_wins) = (0, 0);
        for _ in 0..200 {
            let (tx, rx) = chan::unbounded::<u32>();
            tx.send(1).unwrap();
            let timer = chan::after(Duration::ZERO);
            while timer.is_empty() {
                std::thread::yield_now();
            }
            fiber::select! {
                recv(rx) -> v => {
                    assert_eq!(v, Ok(1));
                    channel_wins += 1;
                    assert!(timer.try_recv().is_ok(), "the losing timer arm lost its tick");
                }
                recv(timer) -> t => {
                    assert!(t.is_ok());
                    timer_wins += 1;
                    assert_eq!(rx.try_recv(), Ok(1), "the losing channel arm lost its value");
                }
            }
        }
        // Go and crossbeam pick uniformly among ready arms.
        assert!(channel_wins > 20 && timer_wins > 20, "{channel_wins} vs {timer_wins}");
    })
}

#[test]
fn select_biased_takes_the_first_ready_arm_even_a_timer() {
    both(|| {
        for _ in 0..20 {
            let (tx, rx) = chan::unbounded::<u32>();
            tx.send(1).unwrap();
            let timer = chan::after(Duration::ZERO);
            while timer.is_empty() {
                std::thread::yield_now();
            }
            let first = fiber::chan::select_biased! {
                recv(timer) -> _ => "timer",
                recv(rx) -> _ => "channel",
            };
            assert_eq!(first, "timer");
            assert_eq!(rx.try_recv(), Ok(1));
        }
    })
}

#[test]
fn default_timeout_is_never_early_and_zero_means_try() {
    both(|| {
        let (_tx, rx) = chan::bounded::<u32>(0);
        let start = Instant::now();
        let r = fiber::select! {
            recv(rx) -> _ => "recv",
            default(ms(15)) => "timeout",
        };
        assert_eq!(r, "timeout");
        assert!(
            start.elapsed() >= ms(15),
            "default(timeout) fired early: {:?}",
            start.elapsed()
        );
        let r = fiber::select! {
            recv(rx) -> _ => "recv",
            default(Duration::ZERO) => "now",
        };
        assert_eq!(r, "now");
        // A timer arm shorter than the default wins.
        let r = fiber::select! {
            recv(chan::after(ms(1))) -> _ => "after",
            default(Duration::from_secs(10)) => "default",
        };
        assert_eq!(r, "after");
    })
}

#[test]
fn a_disconnected_channel_is_always_ready_in_select() {
    // crossbeam / Go: receiving from a closed channel completes at once.
    both(|| {
        let (tx, rx) = chan::bounded::<u32>(1);
        tx.send(4).unwrap();
        drop(tx);
        let got = fiber::select! {
            recv(rx) -> v => v,
            recv(chan::after(Duration::from_secs(10))) -> _ => panic!("waited on a closed channel"),
        };
        assert_eq!(got, Ok(4), "buffered values come first");
        let got = fiber::select! {
            recv(rx) -> v => v.is_err(),
            default(Duration::from_secs(10)) => panic!("waited on a closed channel"),
        };
        assert!(got);
        let (tx, rx) = chan::bounded::<u32>(0);
        drop(rx);
        let sent = fiber::select! {
            send(tx, 1) -> r => r.is_err(),
            default(Duration::from_secs(10)) => panic!("waited on a channel with no receiver"),
        };
        assert!(sent, "a send arm to a disconnected channel completes with the error");
    })
}

#[test]
fn a_send_arms_value_is_evaluated_only_if_selected() {
    both(|| {
        static EVALUATED: AtomicUsize = AtomicUsize::new(0);
        EVALUATED.store(0, Ordering::SeqCst);
        let value = || {
            EVALUATED.fetch_add(1, Ordering::SeqCst);
            7u32
        };
        let (tx, _rx) = chan::bounded::<u32>(0); // nobody receives
        let r = fiber::select! {
            send(tx, value()) -> _ => "sent",
            recv(chan::after(ms(5))) -> _ => "timer",
        };
        assert_eq!(r, "timer");
        assert_eq!(
            EVALUATED.load(Ordering::SeqCst),
            0,
            "the losing send arm's value was evaluated"
        );
        let (tx, rx) = chan::bounded::<u32>(1);
        let r = fiber::select! {
            send(tx, value()) -> res => res.is_ok(),
            default(ms(5)) => false,
        };
        assert!(r);
        assert_eq!(EVALUATED.load(Ordering::SeqCst), 1);
        assert_eq!(rx.try_recv(), Ok(7));
    })
}

#[test]
fn a_cancelled_select_runs_the_first_channel_arm_with_an_error_and_a_timed_one_times_out() {
    within(20, || {
        rt().block_on(|| {
            let (_tx, rx) = chan::bounded::<u32>(0);
            let rx2 = rx.clone();
            let (report, reports) = chan::unbounded::<(&str, String)>();
            let report2 = report.clone();
            let blocking = fiber::spawn(move || {
                let r = fiber::select! {
                    recv(rx2) -> v => format!("first {v:?}"),
                    recv(chan::after(Duration::MAX)) -> _ => "timer".to_string(),
                };
                report2.send(("blocking", r)).unwrap();
            });
            let timed = fiber::spawn(move || {
                let r = fiber::select! {
                    recv(rx) -> v => format!("first {v:?}"),
                    default(Duration::MAX) => "default".to_string(),
                };
                report.send(("timed", r)).unwrap();
            });
            fiber::sleep(ms(10)).unwrap();
            blocking.cancel();
            timed.cancel();
            // The fibers were cancelled before finishing: their joins say so.
            assert!(blocking.join().unwrap_err().is_cancelled());
            assert!(timed.join().unwrap_err().is_cancelled());
            let mut seen: Vec<_> = reports.try_iter().collect();
            seen.sort();
            assert_eq!(
                seen,
                vec![
                    ("blocking", "first Err(RecvError)".to_string()),
                    ("timed", "default".to_string())
                ],
                "documented: the first channel arm with an error; the timed form times out"
            );
        })
    })
}

#[test]
fn select_loop_with_a_tick_arm_and_a_done_channel() {
    // The Go idiom: for { select { case <-ticker.C: ...; case <-done: return } }
    within(20, || {
        rt().block_on(|| {
            let (done_tx, done_rx) = chan::bounded::<()>(0);
            let ticks = Arc::new(AtomicUsize::new(0));
            let t = ticks.clone();
            let worker = fiber::spawn(move || {
                let ticker = chan::tick(ms(1));
                loop {
                    fiber::select! {
                        recv(ticker) -> _ => { t.fetch_add(1, Ordering::SeqCst); }
                        recv(done_rx) -> _ => return,
                    }
                }
            });
            while ticks.load(Ordering::SeqCst) < 5 {
                fiber::sleep(ms(1)).unwrap();
            }
            drop(done_tx); // closing `done` ends the loop
            worker.join().unwrap();
        })
    })
}

#[test]
fn many_timed_selects_in_a_loop_leave_no_timers_behind() {
    within(20, || {
        rt().block_on(|| {
            let (tx, rx) = chan::unbounded::<u32>();
            for i in 0..2_000 {
                tx.send(i).unwrap();
                let got = fiber::select! {
                    recv(rx) -> v => v.unwrap(),
                    recv(chan::after(Duration::from_secs(3600))) -> _ => unreachable!(),
                    default(Duration::from_secs(3600)) => unreachable!(),
                };
                assert_eq!(got, i);
            }
            // Drop the after() receivers of the loop above: their timers
            // (an hour ahead) must not stay armed.
            let pending = fiber::stats().runtime.timers_pending;
            assert!(pending < 100, "{pending} timers left armed by 2,000 finished selects");
        })
    })
}

#[test]
fn two_selects_pair_with_each_other_over_rendezvous_channels() {
    // Go: two goroutines, each `select { case a <- x: case <-b: }` with the
    // mirror image, always make progress: one select's send pairs with the
    // other's receive. Neither may wait forever for a plain send/recv.
    within(30, || {
        let rt = rt();
        for round in 0..200 {
            let (a_tx, a_rx) = chan::bounded::<u32>(0);
            let (b_tx, b_rx) = chan::bounded::<u32>(0);
            let x = move || {
                fiber::select! {
                    send(a_tx, 1) -> r => { r.unwrap(); "x sent" }
                    recv(b_rx) -> v => { assert_eq!(v, Ok(2)); "x received" }
                }
            };
            let y = move || {
                fiber::select! {
                    send(b_tx, 2) -> r => { r.unwrap(); "y sent" }
                    recv(a_rx) -> v => { assert_eq!(v, Ok(1)); "y received" }
                }
            };
            // Fibers and a plain thread, alternating.
            let (rx_, ry_) = if round % 2 == 0 {
                let hx = rt.spawn(x);
                let hy = rt.spawn(y);
                (hx.join().unwrap(), hy.join().unwrap())
            } else {
                let hx = std::thread::spawn(x);
                let hy = rt.spawn(y);
                (hx.join().unwrap(), hy.join().unwrap())
            };
            assert!(
                (rx_, ry_) == ("x sent", "y received") || (rx_, ry_) == ("x received", "y sent"),
                "round {round}: {rx_} / {ry_}"
            );
        }
    })
}

/// `Select`'s rustdoc: a cancelled blocking select "gets its first
/// operation on a channel (the first operation not removed if there is
/// none)". With the channel operation removed and a timer left, it returned
/// the removed index, which no `recv` could complete.
#[test]
fn a_cancelled_select_never_returns_a_removed_index() {
    within(30, || {
        rt().block_on(|| {
            let (out_s, out_r) = chan::unbounded();
            let h = fiber::spawn(move || {
                let (_s, r) = chan::unbounded::<u8>();
                let t = chan::after(Duration::from_secs(3600));
                let mut sel = chan::Select::new();
                let i0 = sel.recv(&r);
                let i1 = sel.recv(&t);
                sel.remove(i0);
                let oper = sel.select();
                let i = oper.index();
                let completed = if i == i1 {
                    oper.recv(&t).is_err()
                } else {
                    std::mem::forget(oper);
                    false
                };
                out_s.send((i, i1, completed)).unwrap();
            });
            fiber::sleep(ms(20)).unwrap();
            h.cancel();
            let _ = h.join();
            let (i, i1, completed) = out_r.recv().unwrap();
            assert_eq!(i, i1, "the cancelled select returned the removed index");
            assert!(completed, "the timer operation fails as if disconnected");
        })
    })
}

/// One round: a fiber's biased select over a rendezvous channel `r1` and
/// many others, on a runtime of one fixed worker, while a plain thread
/// polls a select whose send arm to `r1` evaluates its value only after it
/// reserved the fiber's node (crossbeam evaluates a send arm's value after
/// the choice); that value waits for fiber `H` on the same worker. When the
/// reservation landed while the fiber was still queueing its nodes, the
/// fiber lost a later arm, and waited for the reservation's completion
/// inside its publish, where a fiber cannot yield: it spun on the one
/// worker that `H` needed, for ever. Returns whether the select got 42.
fn reserved_during_publish_round() -> bool {
    let rt = rt1();
    let (s1, r1) = chan::bounded::<u64>(0);
    let others: Vec<_> = (0..3000).map(|_| chan::bounded::<u64>(0)).collect();
    let (ready_s, ready_r) = chan::bounded::<()>(1);
    let (go_s, go_r) = chan::bounded::<()>(1);
    let (late_s, late_r) = chan::bounded::<u64>(1);
    // H: parked on the worker; the thread's send value needs it to run.
    rt.spawn(move || {
        if ready_r.recv().is_ok() {
            let _ = go_s.send(());
        }
    });
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    let poller = std::thread::spawn(move || loop {
        if stop2.load(Ordering::SeqCst) {
            return;
        }
        fiber::select! {
            send(s1, {
                // Makes the fiber's last arm ready, then waits for H.
                let _ = late_s.try_send(1);
                let _ = ready_s.send(());
                go_r.recv().unwrap();
                42
            }) -> res => {
                res.unwrap();
                return;
            },
            default => {},
        }
    });
    let (done_s, done_r) = chan::bounded::<u64>(1);
    rt.spawn(move || {
        let mut sel = chan::Select::new_biased();
        let first = sel.recv(&r1);
        for (_, r) in &others {
            sel.recv(r);
        }
        sel.recv(&late_r);
        let op = sel.select();
        assert_eq!(op.index(), first, "the reserved arm wins");
        done_s.send(op.recv(&r1).unwrap()).unwrap();
    });
    let got = done_r.recv_timeout(Duration::from_secs(10));
    stop.store(true, Ordering::SeqCst);
    if got.is_err() {
        // The worker spins for ever: leave without joining anything.
        eprintln!("hang: the fiber's select never completed");
        std::process::exit(3);
    }
    poller.join().unwrap();
    got == Ok(42)
}

#[test]
fn a_select_whose_node_is_reserved_while_it_publishes_parks_instead_of_spinning() {
    in_child(
        "a_select_whose_node_is_reserved_while_it_publishes_parks_instead_of_spinning",
        200,
        || {
            for _ in 0..15 {
                assert!(reserved_during_publish_round());
            }
        },
    );
}
