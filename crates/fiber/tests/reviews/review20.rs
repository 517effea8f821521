//! Review 20: combinations of Kotlin job rules (nested timeouts, supervisor
//! scopes, non-cancellable clean-up, joins of cancelled jobs), Go channel
//! and select rules (both directions on one channel, closed arms,
//! rendezvous hand-off with cancellations) and std::thread parity.

use fiber::chan;
use fiber::{CancelReason, Job, JobState, TimedOut};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{ms, rt2, wait_parked, within};

/// Kotlin's nested `withTimeout`: an inner timeout shorter than the outer
/// one times out on its own and the outer block goes on uncancelled; an
/// inner one longer than the outer one is cut by the outer deadline, both
/// levels report the timeout, and a scoped child inside the inner block
/// reports `is_timed_out` to its joiner.
#[test]
fn nested_timeouts_inner_shorter_goes_on_outer_shorter_cuts_inner_and_child() {
    let r = within(10, || {
        rt2().block_on(|| {
            fiber::with_timeout(Duration::from_secs(5), || {
                let inner = fiber::with_timeout(ms(20), || fiber::sleep(Duration::from_secs(3600)));
                (inner, fiber::yield_now(), Job::current().state())
            })
        })
    });
    let (inner, outer_yield, outer_state) = r.expect("the outer timeout must not fire");
    assert_eq!(inner, Err(TimedOut));
    assert_eq!(outer_yield, Ok(()));
    assert_eq!(outer_state, JobState::Active);

    let (outer, inner, child_err) = within(10, || {
        rt2().block_on(|| {
            let inner_seen = Arc::new(std::sync::Mutex::new(None));
            let child_seen = Arc::new(std::sync::Mutex::new(None));
            let (i2, c2) = (inner_seen.clone(), child_seen.clone());
            let outer = fiber::with_timeout(ms(30), move || {
                let inner = fiber::with_timeout(Duration::from_secs(5), || {
                    fiber::scope(|s| {
                        let h = s.spawn(|| fiber::sleep(Duration::from_secs(3600)));
                        let e = h.join().expect_err("the child was cut by the deadline");
                        *c2.lock().unwrap() = Some((e.is_cancelled(), e.is_timed_out()));
                    })
                });
                *i2.lock().unwrap() = Some(inner);
            });
            let inner = inner_seen.lock().unwrap().take();
            let child = child_seen.lock().unwrap().take();
            (outer, inner, child)
        })
    });
    assert_eq!(outer, Err(TimedOut));
    assert_eq!(inner, Some(Err(TimedOut)));
    assert_eq!(
        child_err,
        Some((true, true)),
        "(is_cancelled, is_timed_out) of the child's join"
    );
}

/// Kotlin: a timeout that passes while the block is inside
/// `withContext(NonCancellable)` lets the section run to its end; the block
/// sees the cancellation after it, and `withTimeout` reports the timeout.
#[test]
fn a_timeout_passing_inside_a_non_cancellable_section_lands_after_it() {
    let (r, section_ok, after, took) = within(10, || {
        rt2().block_on(|| {
            let start = Instant::now();
            let section_ok = Arc::new(AtomicBool::new(false));
            let after = Arc::new(std::sync::Mutex::new(None));
            let (s2, a2) = (section_ok.clone(), after.clone());
            let r = fiber::with_timeout(ms(10), move || {
                let ok = fiber::non_cancellable(|| fiber::sleep(ms(60)).is_ok());
                s2.store(ok, SeqCst);
                *a2.lock().unwrap() = Some(fiber::yield_now());
                7
            });
            let a = *after.lock().unwrap();
            (r, section_ok.load(SeqCst), a, start.elapsed())
        })
    });
    assert_eq!(r, Err(TimedOut));
    assert!(section_ok, "the non-cancellable sleep was interrupted");
    assert_eq!(after, Some(Err(fiber::Cancelled)));
    assert!(took >= ms(60), "returned after {took:?}");
}

/// Go: a receive from a closed channel is always ready, so a select with a
/// `default` never takes the default while such an arm exists; buffered
/// values come out first, in order, then the closed arm fires.
#[test]
fn select_with_default_drains_a_closed_buffered_channel_then_sees_the_close() {
    within(10, || {
        rt2().block_on(|| {
            let (tx, rx) = chan::bounded::<u32>(3);
            let (_etx, erx) = chan::bounded::<u32>(0);
            for i in 0..3 {
                tx.send(i).unwrap();
            }
            assert!(tx.close());
            assert!(rx.is_closed());
            assert_eq!((rx.len(), rx.is_full(), rx.capacity()), (3, true, Some(3)));
            let mut got = Vec::new();
            let mut closed = 0;
            for _ in 0..10 {
                fiber::select! {
                    recv(rx) -> r => match r {
                        Ok(v) => got.push(v),
                        Err(_) => closed += 1,
                    },
                    recv(erx) -> _ => panic!("nothing sends on erx"),
                    default => panic!("a closed channel's receive is always ready"),
                }
            }
            assert_eq!(got, vec![0, 1, 2]);
            assert_eq!(closed, 7);
            assert_eq!((rx.len(), rx.is_empty(), rx.is_full()), (0, true, false));
        })
    })
}

/// Go: on an unbuffered channel, many senders and receivers, a third of
/// the senders and half of the receivers cancelled while parked: every
/// value a send reported `Ok` is received exactly once, every failed send
/// got its value back. Outcomes are recorded inside the fibers: a
/// cancelled fiber's join reports `Cancelled` even if its body returned.
#[test]
fn rendezvous_with_cancelled_senders_and_receivers_loses_and_duplicates_nothing() {
    within(20, || {
        let rt = rt2();
        let (tx, rx) = chan::bounded::<u32>(0);
        const N: u32 = 30;
        let sent_ok = Arc::new(std::sync::Mutex::new(Vec::new()));
        let returned = Arc::new(std::sync::Mutex::new(Vec::new()));
        let received = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut senders = Vec::new();
        for i in 0..N {
            let (tx, ok, back) = (tx.clone(), sent_ok.clone(), returned.clone());
            senders.push(rt.spawn(move || match tx.send(i) {
                Ok(()) => ok.lock().unwrap().push(i),
                Err(e) => back.lock().unwrap().push(e.into_inner()),
            }));
        }
        wait_parked(&rt, N as usize);
        for (i, h) in senders.iter().enumerate() {
            if i % 3 == 0 {
                h.cancel();
            }
        }
        let mut receivers = Vec::new();
        for _ in 0..N {
            let (rx, got) = (rx.clone(), received.clone());
            receivers.push(rt.spawn(move || {
                if let Ok(v) = rx.recv() {
                    got.lock().unwrap().push(v);
                }
            }));
        }
        for (i, h) in receivers.iter().enumerate() {
            if i % 2 == 0 {
                h.cancel();
            }
        }
        // Close: parked senders stay admitted (their values are still
        // received), receivers with nothing left see the close; then the
        // last receiver leaves and the senders still parked get their
        // values back.
        assert!(tx.close());
        for h in receivers {
            let _ = h.join();
        }
        drop(rx);
        for h in senders {
            let _ = h.join();
        }
        drop(tx);
        let mut sent_ok = sent_ok.lock().unwrap().clone();
        let mut received = received.lock().unwrap().clone();
        let returned = returned.lock().unwrap().clone();
        sent_ok.sort();
        received.sort();
        assert_eq!(sent_ok, received, "received exactly the values sent Ok");
        let mut all: Vec<u32> = sent_ok.iter().chain(returned.iter()).copied().collect();
        all.sort();
        assert_eq!(
            all,
            (0..N).collect::<Vec<_>>(),
            "every value either delivered once or given back"
        );
    })
}

/// Go/crossbeam: a select parked on a send arm of a rendezvous channel,
/// cancelled while a receiver arrives: either the send arm completed (the
/// receiver has its value) or it failed with the value back and the
/// receiver still waits (it sees the close that follows). Never both,
/// never neither.
#[test]
fn cancel_of_a_select_send_arm_racing_a_receiver_loses_and_duplicates_nothing() {
    within(30, || {
        let rt = rt2();
        let (mut delivered, mut given_back) = (0, 0);
        for round in 0..300u32 {
            let (tx, rx) = chan::bounded::<u32>(0);
            let (qtx, qrx) = chan::bounded::<()>(0);
            let outcome = Arc::new(std::sync::Mutex::new(None));
            let o = outcome.clone();
            let a = rt.spawn(move || {
                let r = fiber::select! {
                    send(tx, round) -> r => r.map_err(|e| e.into_inner()),
                    recv(qrx) -> _ => panic!("the quit arm fired"),
                };
                *o.lock().unwrap() = Some(r);
            });
            wait_parked(&rt, 1);
            let b = rt.spawn(move || rx.recv_timeout(Duration::from_secs(5)));
            if round % 2 == 0 {
                std::thread::yield_now();
            }
            a.cancel();
            // The handle of a cancelled fiber reports Cancelled even if the
            // select completed: the outcome is what the select returned.
            let _ = a.join();
            drop(qtx);
            // A has ended and dropped its sender: B either has A's value or
            // sees the channel closed.
            let got = b.join().unwrap();
            let sent = outcome.lock().unwrap().take().expect("the select returned");
            match (sent, got) {
                (Ok(()), Ok(v)) => {
                    assert_eq!(v, round);
                    delivered += 1;
                }
                (Err(v), Err(chan::RecvTimeoutError::Disconnected)) => {
                    assert_eq!(v, round);
                    given_back += 1;
                }
                other => panic!("round {round}: select and receiver disagree: {other:?}"),
            }
        }
        assert_eq!(delivered + given_back, 300);
    })
}

/// std: `JoinHandle::is_finished` is false while a cancelled fiber still
/// runs its non-cancellable clean-up, and `join` returns only after it.
#[test]
fn a_cancelled_fibers_handle_waits_for_its_clean_up() {
    within(10, || {
        let rt = rt2();
        let cleaned = Arc::new(AtomicBool::new(false));
        let c = cleaned.clone();
        let h = rt.spawn(move || {
            let r = fiber::sleep(Duration::from_secs(3600));
            fiber::non_cancellable(|| fiber::sleep(ms(80)).unwrap());
            c.store(true, SeqCst);
            r
        });
        wait_parked(&rt, 1);
        h.cancel();
        let t = Instant::now();
        while t.elapsed() < ms(40) {
            assert!(cleaned.load(SeqCst) || !h.is_finished(), "finished before its clean-up");
            std::thread::yield_now();
        }
        let r = h.join();
        assert!(cleaned.load(SeqCst), "join returned before the clean-up ended");
        assert!(r.unwrap_err().is_cancelled());
    })
}

/// Kotlin: a failure inside a nested scope or timeout block goes to its
/// caller (an exception), not to the enclosing job. Caught by the caller,
/// it leaves the caller's job current and active, the failed block's job
/// ends FAILED, and a timeout opened afterwards still works.
#[test]
fn a_panic_caught_out_of_nested_blocks_restores_the_callers_job() {
    within(10, || {
        rt2().block_on(|| {
            fiber::scope(|s| {
                let outer = s.job();
                assert_eq!(Job::current().id(), outer.id());
                let (jtx, jrx) = chan::bounded::<Job>(2);
                let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    let _ = fiber::with_timeout(Duration::from_secs(5), || {
                        jtx.send(Job::current()).unwrap();
                        fiber::supervisor_scope(|_| {
                            jtx.send(Job::current()).unwrap();
                            std::panic::panic_any(42u8);
                        })
                    });
                }));
                assert_eq!(caught.unwrap_err().downcast_ref::<u8>(), Some(&42));
                assert_eq!(Job::current().id(), outer.id(), "the caller's job is current again");
                assert!(outer.is_active());
                assert_eq!(fiber::yield_now(), Ok(()));
                let timeout_job = jrx.recv().unwrap();
                let sup_job = jrx.recv().unwrap();
                assert_eq!(sup_job.state(), JobState::Failed);
                assert_eq!(timeout_job.state(), JobState::Failed);
                assert_eq!(
                    fiber::with_timeout(ms(20), || fiber::sleep(Duration::from_secs(3600))),
                    Err(TimedOut)
                );
                let h = s.spawn(|| Job::current().id());
                let child = h.join().unwrap();
                assert_ne!(child, outer.id());
                assert_eq!(Job::current().id(), outer.id());
            });
        })
    })
}

/// Kotlin: `supervisorScope` inside `coroutineScope`: a failing supervisor
/// child does not touch its siblings or the outer scope; a failing child of
/// the outer scope cancels the supervisor's children too (they are in its
/// subtree), and the outer scope re-raises that failure after everything
/// ended.
#[test]
fn supervisor_inside_a_plain_scope_keeps_its_own_failures_but_not_the_outer_ones() {
    let seen = within(10, || {
        rt2().block_on(|| {
            let sup_child = Arc::new(std::sync::Mutex::new(None));
            let sc = sup_child.clone();
            // The survivor's sleep was cancelled, or the outer failure
            // cancelled it before it ever ran (then its body never runs).
            let survivor_cancelled = Arc::new(AtomicBool::new(true));
            let sv = survivor_cancelled.clone();
            let (go_tx, go_rx) = chan::bounded::<()>(0);
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                fiber::scope(|s| {
                    s.spawn(move || {
                        fiber::supervisor_scope(|ss| {
                            let bad = ss.spawn(|| panic!("supervised"));
                            let survivor = ss.spawn(move || {
                                sv.store(false, SeqCst);
                                let r = fiber::sleep(Duration::from_secs(3600));
                                sv.store(r.is_err(), SeqCst);
                            });
                            let e = bad.join().unwrap_err();
                            *sc.lock().unwrap() =
                                Some(e.panic_payload().and_then(|p| p.downcast_ref::<&str>().copied()));
                            // The supervisor is untouched: tell the sibling to fail now.
                            assert!(Job::current().is_active());
                            go_tx.send(()).unwrap();
                            let _ = survivor.join();
                        })
                    });
                    s.spawn(move || {
                        go_rx.recv().unwrap();
                        panic!("outer sibling");
                    });
                })
            }));
            let payload = r.unwrap_err();
            let sup = sup_child.lock().unwrap().take();
            (
                sup,
                survivor_cancelled.load(SeqCst),
                payload.downcast_ref::<&str>().copied(),
            )
        })
    });
    assert_eq!(seen.0, Some(Some("supervised")));
    assert!(seen.1, "the supervisor's child was not cancelled by the outer failure");
    assert_eq!(seen.2, Some("outer sibling"));
}

/// fiber's close rule on a full buffered channel: a plain sender parked
/// before the close was admitted and is delivered; a select parked on a
/// send arm was not (its value does not exist yet): the close wakes it and
/// its arm fails with the value. Receivers drain the buffer, then the
/// admitted sender's value, then see the close.
#[test]
fn close_of_a_full_buffered_channel_with_a_parked_sender_and_a_parked_send_arm() {
    within(10, || {
        let rt = rt2();
        let (tx, rx) = chan::bounded::<u32>(1);
        tx.send(1).unwrap();
        let (_qtx, qrx) = chan::bounded::<()>(0);
        let plain = rt.spawn({
            let tx = tx.clone();
            move || tx.send(2).map_err(|e| e.into_inner())
        });
        wait_parked(&rt, 1);
        let arm = rt.spawn({
            let tx = tx.clone();
            move || {
                fiber::select! {
                    send(tx, 3) -> r => r.map_err(|e| e.into_inner()),
                    recv(qrx) -> _ => Ok(()),
                }
            }
        });
        wait_parked(&rt, 2);
        assert!(tx.close());
        assert_eq!(arm.join().unwrap(), Err(3));
        assert_eq!(rx.recv(), Ok(1));
        assert_eq!(rx.recv(), Ok(2));
        assert_eq!(plain.join().unwrap(), Ok(()));
        assert_eq!(rx.recv(), Err(chan::RecvError));
        assert_eq!((rx.len(), rx.is_empty(), rx.is_full()), (0, true, false));
    })
}

/// The rule "an operation that needs no wait completes, cancelled or not"
/// (Go has no cancellation; Kotlin's `trySend`/`tryReceive` ignore it;
/// spec/sync.md section 2) for channels: in a cancelled fiber a receive of
/// a buffered value, a send into room, a select whose arm is ready (a
/// buffered value, a due timer) complete; only a select with nothing ready
/// fails its first channel arm.
#[test]
fn ready_channel_operations_complete_in_a_cancelled_fiber() {
    let out = within(10, || {
        rt2().block_on(|| {
            let out = Arc::new(std::sync::Mutex::new(Vec::new()));
            let o = out.clone();
            let h = fiber::spawn(move || {
                let mut out = o.lock().unwrap();
                Job::current().cancel();
                assert!(fiber::is_cancelled());
                let (tx, rx) = chan::bounded::<u32>(4);
                out.push(format!("send {:?}", tx.send(1)));
                tx.send(2).unwrap();
                out.push(format!("recv {:?}", rx.recv()));
                let (_etx, erx) = chan::bounded::<u32>(0);
                fiber::select! {
                    recv(erx) -> r => out.push(format!("select empty arm {r:?}")),
                    recv(rx) -> r => out.push(format!("select ready arm {r:?}")),
                }
                let due = chan::after(Duration::ZERO);
                fiber::select! {
                    recv(erx) -> r => out.push(format!("select empty arm {r:?}")),
                    recv(due) -> r => out.push(format!("select due timer {}", r.is_ok())),
                }
                fiber::select! {
                    recv(erx) -> r => out.push(format!("select nothing ready {r:?}")),
                    recv(chan::never::<u32>()) -> r => out.push(format!("select never {r:?}")),
                }
            });
            assert!(h.join().unwrap_err().is_cancelled());
            let v = out.lock().unwrap().clone();
            v
        })
    });
    assert_eq!(
        out,
        vec![
            "send Ok(())",
            "recv Ok(1)",
            "select ready arm Ok(2)",
            "select due timer true",
            "select nothing ready Err(RecvError)",
        ]
    );
}

struct CountDrop<'a>(&'a AtomicUsize);
impl Drop for CountDrop<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, SeqCst);
    }
}

/// Kotlin: a child launched in a cancelled scope never runs its body; std:
/// the scope's borrows end when `scope` returns. A closure that borrows
/// the caller's stack, spawned after the scope was cancelled (from the body
/// and from a running child), is dropped unrun before `scope` returns, its
/// join reports `Cancelled`, and the scope's job ends CANCELLED.
#[test]
fn closures_spawned_into_a_cancelled_scope_are_dropped_before_it_returns() {
    within(10, || {
        rt2().block_on(|| {
            let dropped = AtomicUsize::new(0);
            let ran = AtomicUsize::new(0);
            let (jtx, jrx) = chan::bounded::<Job>(1);
            fiber::scope(|s| {
                let (dropped, ran) = (&dropped, &ran);
                jtx.send(s.job()).unwrap();
                // A running child that spawns once the scope is cancelled.
                let (stx, srx) = chan::bounded::<()>(1);
                let parent = s.spawn(move || {
                    stx.send(()).unwrap();
                    let cancelled = fiber::sleep(Duration::from_secs(3600)).is_err();
                    let g = CountDrop(dropped);
                    let h = s.spawn(move || {
                        let _g = g;
                        ran.fetch_add(1, SeqCst);
                    });
                    (cancelled, h.join().map(|_| ()).map_err(|e| e.is_cancelled()))
                });
                srx.recv().unwrap();
                s.cancel();
                let g = CountDrop(dropped);
                let h = s.spawn(move || {
                    let _g = g;
                    ran.fetch_add(1, SeqCst);
                });
                assert!(h.join().unwrap_err().is_cancelled());
                // The parent was cancelled, so its own join reports that.
                assert!(parent.join().unwrap_err().is_cancelled());
            });
            assert_eq!(ran.load(SeqCst), 0, "a body ran in a cancelled scope");
            assert_eq!(dropped.load(SeqCst), 2, "an unrun closure outlived its scope");
            assert_eq!(jrx.recv().unwrap().state(), JobState::Cancelled);
        })
    })
}

/// Kotlin: `withTimeout` returns (throws) only after the children of the
/// block ended, their non-cancellable clean-up included; a fiber that is
/// itself cancelled can still `cancelAndJoin` another job inside
/// `withContext(NonCancellable)` and gets its final state.
#[test]
fn a_timeout_waits_for_its_childrens_clean_up_and_a_cancelled_fiber_joins_in_non_cancellable() {
    within(10, || {
        rt2().block_on(|| {
            let cleaned = Arc::new(AtomicUsize::new(0));
            let c = cleaned.clone();
            let t = Instant::now();
            let r = fiber::with_timeout(ms(20), move || {
                fiber::scope(|s| {
                    for _ in 0..3 {
                        let c = c.clone();
                        s.spawn(move || {
                            let _ = fiber::sleep(Duration::from_secs(3600));
                            fiber::non_cancellable(|| fiber::sleep(ms(60)).unwrap());
                            c.fetch_add(1, SeqCst);
                        });
                    }
                })
            });
            assert_eq!(r, Err(TimedOut));
            assert_eq!(
                cleaned.load(SeqCst),
                3,
                "with_timeout returned before the clean-ups ended"
            );
            assert!(t.elapsed() >= ms(80));

            // A cancelled fiber joins another job from a non-cancellable section.
            let (jtx, jrx) = chan::bounded::<Job>(1);
            let other = fiber::spawn(move || {
                jtx.send(Job::current()).unwrap();
                let _ = fiber::sleep(Duration::from_secs(3600));
                fiber::non_cancellable(|| fiber::sleep(ms(30)).unwrap());
            });
            let job = jrx.recv().unwrap();
            let seen = Arc::new(std::sync::Mutex::new(None));
            let seen2 = seen.clone();
            let joiner = fiber::spawn(move || {
                Job::current().cancel();
                let outside = job.join();
                let t = Instant::now();
                let inside = fiber::non_cancellable(|| job.cancel_and_join());
                let waited = t.elapsed();
                *seen2.lock().unwrap() = Some((outside, inside, job.cancel_reason(), waited));
            });
            // The joiner's own handle reports its cancellation.
            assert!(joiner.join().unwrap_err().is_cancelled());
            let (outside, inside, reason, waited) = seen.lock().unwrap().take().unwrap();
            assert_eq!(outside, Err(fiber::Cancelled));
            assert_eq!(inside, Ok(JobState::Cancelled));
            assert_eq!(reason, Some(CancelReason::Cancelled));
            assert!(waited >= ms(25), "the join did not wait for the clean-up: {waited:?}");
            assert!(other.join().unwrap_err().is_cancelled());
        })
    })
}

/// Go: a select picks uniformly among ready cases, and a receive from a
/// closed channel is as ready as one with a value; a send arm to a channel
/// whose receivers are gone is ready too (crossbeam: it fails at once).
#[test]
fn select_is_uniform_between_a_closed_arm_a_value_arm_and_a_disconnected_send_arm() {
    within(20, || {
        rt2().block_on(|| {
            let (ctx, crx) = chan::unbounded::<u32>();
            drop(ctx);
            let (vtx, vrx) = chan::unbounded::<u32>();
            let (stx, srx) = chan::bounded::<u32>(0);
            drop(srx);
            const N: usize = 3000;
            for i in 0..N as u32 {
                vtx.send(i).unwrap();
            }
            let mut counts = [0usize; 3];
            for _ in 0..N {
                fiber::select! {
                    recv(crx) -> r => { assert!(r.is_err()); counts[0] += 1 }
                    recv(vrx) -> r => { assert!(r.is_ok()); counts[1] += 1 }
                    send(stx, 9) -> r => { assert_eq!(r.unwrap_err().into_inner(), 9); counts[2] += 1 }
                }
            }
            for c in counts {
                assert!((700..=1300).contains(&c), "picks {counts:?}");
            }
        })
    })
}

/// Kotlin: cancelling one child (`job.cancel()`) is not a failure: the
/// child ends with a CancellationException, which its parent ignores
/// ("cancellation exceptions are ignored by parents"), and the siblings
/// and the scope go on. Here a running `try_scope` child is cancelled
/// through its own handle and passes the cancellation on with `?` (the
/// pattern `with_timeout`'s documentation recommends), returning
/// `Err(Cancelled)`: that fails the whole scope, cancels the sibling and
/// `try_scope` returns `Err(Cancelled)` although nothing failed.
// Failed before the fix: a try_scope child cancelled through its own handle that returns Err(Cancelled) via `?` fails the scope and cancels its siblings (Kotlin: a child's cancellation is ignored by its parent)
#[test]
fn cancelling_one_running_try_scope_child_does_not_fail_the_scope() {
    let (r, sibling_done, victim) = within(10, || {
        rt2().block_on(|| {
            let sibling_done = AtomicBool::new(false);
            let mut victim_err = String::new();
            let r = fiber::try_scope(|s| -> Result<u32, fiber::Cancelled> {
                let sibling_done = &sibling_done;
                let (stx, srx) = chan::bounded::<()>(1);
                let victim = s.spawn(move || -> Result<(), fiber::Cancelled> {
                    stx.send(()).unwrap();
                    fiber::sleep(Duration::from_secs(3600))?;
                    Ok(())
                });
                let sibling = s.spawn(move || -> Result<u32, fiber::Cancelled> {
                    fiber::sleep(ms(50))?;
                    sibling_done.store(true, SeqCst);
                    Ok(5)
                });
                srx.recv().unwrap(); // the victim runs
                victim.cancel();
                let e = victim.join().unwrap_err();
                victim_err = format!("{e} (cancelled {}, failed {})", e.is_cancelled(), e.is_failed());
                sibling.join().map_err(|_| fiber::Cancelled)
            });
            (r, sibling_done.load(SeqCst), victim_err)
        })
    });
    assert_eq!(
        (r, sibling_done),
        (Ok(5), true),
        "cancelling one child failed the scope and cancelled its sibling"
    );
    assert!(
        victim.contains("(cancelled true, failed false)"),
        "the victim's join reports a cancellation: {victim}"
    );
}

/// The contrast: the same cancelled child in a plain `scope`, returning
/// its `Err(Cancelled)` as a value, leaves the sibling and the scope alone.
#[test]
fn cancelling_one_running_scope_child_leaves_its_sibling_and_scope_alone() {
    let (r, sibling_done) = within(10, || {
        rt2().block_on(|| {
            let sibling_done = AtomicBool::new(false);
            let r = fiber::scope(|s| {
                let sibling_done = &sibling_done;
                let (stx, srx) = chan::bounded::<()>(1);
                let victim = s.spawn(move || -> Result<(), fiber::Cancelled> {
                    stx.send(()).unwrap();
                    fiber::sleep(Duration::from_secs(3600))?;
                    Ok(())
                });
                let sibling = s.spawn(move || {
                    let r = fiber::sleep(ms(50));
                    sibling_done.store(r.is_ok(), SeqCst);
                    5
                });
                srx.recv().unwrap();
                victim.cancel();
                assert!(victim.join().unwrap_err().is_cancelled());
                assert!(Job::current().is_active());
                sibling.join().unwrap()
            });
            (r, sibling_done.load(SeqCst))
        })
    });
    assert_eq!((r, sibling_done), (5, true));
}

/// std's park tokens inside `non_cancellable` in a cancelled fiber: the
/// cancellation is held off, so after three unparks one park takes the
/// one token and a timed park without a token waits its time, one with a token (an `unpark` from a plain thread) returns at
/// once and consumes it; after the section a park returns at once.
#[test]
fn park_in_a_non_cancellable_section_of_a_cancelled_fiber_keeps_token_semantics() {
    let (no_token, with_token, second, after) = within(10, || {
        rt2().block_on(|| {
            let out = Arc::new(std::sync::Mutex::new(None));
            let o = out.clone();
            let h = fiber::spawn(move || {
                Job::current().cancel();
                let (no_token, with_token, second) = fiber::non_cancellable(|| {
                    // Three unparks leave one token, not three.
                    let me = fiber::current();
                    me.unpark();
                    me.unpark();
                    me.unpark();
                    fiber::park();
                    let t = Instant::now();
                    fiber::park_timeout(ms(60));
                    let no_token = t.elapsed();
                    let me = fiber::current();
                    std::thread::spawn(move || me.unpark()).join().unwrap();
                    let t = Instant::now();
                    fiber::park_timeout(Duration::from_secs(5));
                    let with_token = t.elapsed();
                    let t = Instant::now();
                    fiber::park_timeout(ms(60));
                    (no_token, with_token, t.elapsed())
                });
                let t = Instant::now();
                fiber::park();
                *o.lock().unwrap() = Some((no_token, with_token, second, t.elapsed()));
            });
            assert!(h.join().unwrap_err().is_cancelled());
            let v = out.lock().unwrap().take().unwrap();
            v
        })
    });
    assert!(no_token >= ms(50), "a held-off park returned after {no_token:?}");
    assert!(
        with_token < Duration::from_secs(2),
        "the token was lost: {with_token:?}"
    );
    assert!(second >= ms(50), "the token was not consumed: {second:?}");
    assert!(after < Duration::from_secs(2), "a cancelled park waited {after:?}");
}
