//! Conformance: `fiber::chan` against the documented behaviour of
//! crossbeam-channel (whose API and error types it mirrors) and of Go
//! channels (close, rendezvous, `select` over a nil channel). Each test
//! names the documented rule it checks; every test runs on a plain thread
//! and in a fiber, under a hang guard.

use fiber::chan::{
    self, after, at, bounded, never, tick, unbounded, ReadyTimeoutError, Receiver, RecvError, RecvTimeoutError, Select,
    SelectTimeoutError, SendError, SendTimeoutError, TryReadyError, TryRecvError, TrySelectError, TrySendError,
};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{ms, rt, within};

/// Run `f` on a plain thread and in a fiber.
fn both(f: fn()) {
    within(30, move || {
        f();
        rt().block_on(f);
    })
}

/// Wait (without asserting anything about time) until `instant` has passed.
fn wait_past(instant: Instant) {
    while Instant::now() <= instant {
        std::thread::sleep(ms(2));
    }
}

// ---- crossbeam: sizes ----

#[test]
fn len_capacity_is_empty_and_is_full_match_crossbeam_for_every_flavor() {
    both(|| {
        // "A zero-capacity channel is always empty and full."
        let (s, r) = bounded::<u8>(0);
        for (len, cap, empty, full) in [
            (s.len(), s.capacity(), s.is_empty(), s.is_full()),
            (r.len(), r.capacity(), r.is_empty(), r.is_full()),
        ] {
            assert_eq!((len, cap, empty, full), (0, Some(0), true, true));
        }

        let (s, r) = bounded::<u8>(2);
        assert_eq!(
            (s.len(), s.capacity(), s.is_empty(), s.is_full()),
            (0, Some(2), true, false)
        );
        s.send(1).unwrap();
        assert_eq!((r.len(), r.is_empty(), r.is_full()), (1, false, false));
        s.send(2).unwrap();
        assert_eq!((s.len(), s.is_empty(), s.is_full()), (2, false, true));
        assert_eq!((r.len(), r.is_empty(), r.is_full()), (2, false, true));
        r.recv().unwrap();
        assert_eq!((s.len(), s.is_full()), (1, false));

        // "An unbounded channel is never full."
        let (s, r) = unbounded::<u8>();
        assert_eq!(
            (s.len(), s.capacity(), s.is_empty(), s.is_full()),
            (0, None, true, false)
        );
        for i in 0..100 {
            s.send(i).unwrap();
        }
        assert_eq!(
            (r.len(), r.capacity(), r.is_empty(), r.is_full()),
            (100, None, false, false)
        );

        // Timer channels are bounded with capacity 1; never has capacity 0.
        let a = after(Duration::from_secs(3600));
        assert_eq!(
            (a.len(), a.capacity(), a.is_empty(), a.is_full()),
            (0, Some(1), true, false)
        );
        let n = never::<u8>();
        assert_eq!((n.len(), n.capacity(), n.is_empty()), (0, Some(0), true));
    })
}

// ---- crossbeam: errors ----

#[test]
fn try_send_tells_full_from_disconnected_and_returns_the_value() {
    both(|| {
        // "If this is a zero-capacity channel, then the error indicates that
        // there was no receiver available to receive the message."
        let (s, r) = bounded(0);
        assert_eq!(s.try_send(1), Err(TrySendError::Full(1)));
        let (s1, r1) = bounded(1);
        assert_eq!(s1.try_send(1), Ok(()));
        let e = s1.try_send(2).unwrap_err();
        assert!(e.is_full() && !e.is_disconnected());
        assert_eq!(e.into_inner(), 2);
        drop(r);
        drop(r1);
        let e = s.try_send(3).unwrap_err();
        assert!(e.is_disconnected() && !e.is_full());
        assert_eq!(e, TrySendError::Disconnected(3));
        // A full channel whose receivers left reports Disconnected, not Full.
        assert_eq!(s1.try_send(4), Err(TrySendError::Disconnected(4)));
        assert_eq!(s1.send(5), Err(SendError(5)));
        assert_eq!(s1.send_timeout(6, ms(10)), Err(SendTimeoutError::Disconnected(6)));
    })
}

#[test]
fn send_fails_only_once_every_receiver_is_gone_and_returns_the_value() {
    both(|| {
        let (s, r) = unbounded();
        let r2 = r.clone();
        drop(r);
        s.send(1).unwrap();
        assert_eq!(r2.recv(), Ok(1));
        drop(r2);
        assert_eq!(s.send(2).unwrap_err().into_inner(), 2);
        assert!(s.is_closed());
    })
}

#[test]
fn receives_drain_buffered_messages_after_every_sender_left_then_fail() {
    both(|| {
        for cap in [Some(5), None] {
            let (s, r) = match cap {
                Some(c) => bounded(c),
                None => unbounded(),
            };
            let s2 = s.clone();
            s.send(1).unwrap();
            s2.send(2).unwrap();
            drop(s);
            assert_eq!(r.try_recv(), Ok(1), "one sender left: still open");
            s2.send(3).unwrap();
            drop(s2);
            assert_eq!(r.recv(), Ok(2));
            assert_eq!(r.recv_timeout(ms(10)), Ok(3));
            assert_eq!(r.recv(), Err(RecvError));
            assert_eq!(r.try_recv(), Err(TryRecvError::Disconnected));
            assert_eq!(r.recv_timeout(ms(10)), Err(RecvTimeoutError::Disconnected));
            assert!(r.try_recv().unwrap_err().is_disconnected());
        }
        // A rendezvous channel with no sender left fails at once.
        let (s, r) = bounded::<u8>(0);
        drop(s);
        assert_eq!(
            r.recv_deadline(Instant::now() + Duration::from_secs(60)),
            Err(RecvTimeoutError::Disconnected)
        );
    })
}

#[test]
fn error_types_convert_and_print_like_crossbeam() {
    struct Opaque;
    let e: TrySendError<u8> = SendError(1).into();
    assert_eq!(e, TrySendError::Disconnected(1));
    let e: SendTimeoutError<u8> = SendError(2).into();
    assert_eq!(e, SendTimeoutError::Disconnected(2));
    assert!(e.is_disconnected() && !e.is_timeout());
    let e: TryRecvError = RecvError.into();
    assert_eq!(e, TryRecvError::Disconnected);
    let e: RecvTimeoutError = RecvError.into();
    assert_eq!(e, RecvTimeoutError::Disconnected);
    assert!(RecvTimeoutError::Timeout.is_timeout() && TryRecvError::Empty.is_empty());
    // Debug never needs `T: Debug` (crossbeam prints `SendTimeoutError(..)`
    // for both variants; ours names the variant).
    assert_eq!(format!("{:?}", SendTimeoutError::Timeout(Opaque)), "Timeout(..)");
    assert_eq!(format!("{:?}", TrySendError::Disconnected(Opaque)), "Disconnected(..)");
    assert_eq!(
        SendTimeoutError::Timeout(0).to_string(),
        "timed out waiting on send operation"
    );
    assert_eq!(
        SendTimeoutError::Disconnected(0).to_string(),
        "sending on a disconnected channel"
    );
    assert_eq!(TrySendError::Full(0).to_string(), "sending on a full channel");
    assert_eq!(
        TryRecvError::Disconnected.to_string(),
        "receiving on an empty and disconnected channel"
    );
    assert_eq!(
        RecvTimeoutError::Disconnected.to_string(),
        "channel is empty and disconnected"
    );
    assert_eq!(TrySelectError.to_string(), "all operations in select would block");
    assert_eq!(SelectTimeoutError.to_string(), "timed out waiting on select");
    assert_eq!(ReadyTimeoutError.to_string(), "timed out waiting on ready");
    assert_eq!(TryReadyError.to_string(), "all operations in select would block");
    let boxed: Vec<Box<dyn std::error::Error + Send + Sync>> = vec![
        Box::new(TryReadyError),
        Box::new(TrySelectError),
        Box::new(SendTimeoutError::Timeout(1u8)),
    ];
    assert_eq!(boxed.len(), 3);
}

#[test]
fn handles_and_iterators_debug_print_without_the_element_type() {
    struct Opaque;
    let (s, r) = unbounded::<Opaque>();
    assert_eq!(format!("{s:?}"), "Sender { .. }");
    assert_eq!(format!("{r:?}"), "Receiver { .. }");
    assert_eq!(format!("{:?}", r.iter()), "Iter { .. }");
    assert_eq!(format!("{:?}", r.try_iter()), "TryIter { .. }");
    assert_eq!(format!("{:?}", r.into_iter()), "IntoIter { .. }");
}

// ---- crossbeam: iterators ----

#[test]
fn iter_try_iter_and_into_iter_follow_crossbeam() {
    both(|| {
        // try_iter: what is there now, never blocks, and the receiver stays
        // usable afterwards.
        let (s, r) = unbounded();
        s.send(1).unwrap();
        s.send(2).unwrap();
        assert_eq!(r.try_iter().collect::<Vec<_>>(), [1, 2]);
        assert_eq!(r.try_iter().next(), None, "empty: try_iter ends at once");
        s.send(3).unwrap();
        assert_eq!(r.try_iter().next(), Some(3));

        // iter: blocks for more until every sender left.
        let (s, r) = bounded(0);
        let t = std::thread::spawn(move || {
            for i in 0..5 {
                s.send(i).unwrap();
            }
        });
        assert_eq!(r.iter().collect::<Vec<_>>(), [0, 1, 2, 3, 4]);
        t.join().unwrap();
        assert_eq!(r.iter().next(), None, "disconnected: iter ends at once");

        // into_iter and `for v in &r`.
        let (s, r) = bounded(4);
        for i in 0..4 {
            s.send(i).unwrap();
        }
        drop(s);
        let mut seen = Vec::new();
        for v in &r {
            seen.push(v);
            if seen.len() == 2 {
                break;
            }
        }
        assert_eq!(seen, [0, 1]);
        assert_eq!(r.into_iter().collect::<Vec<_>>(), [2, 3]);
    })
}

// ---- crossbeam: timer channels ----

#[test]
fn at_delivers_exactly_its_instant() {
    // crossbeam: "The message is the instant at which it is sent, which is
    // the same as `when`."
    both(|| {
        let when = Instant::now() + ms(20);
        let r = at(when);
        assert_eq!(r.recv().unwrap(), when);
        // Even when received late.
        let when = Instant::now() + ms(1);
        let r = at(when);
        wait_past(when + ms(30));
        assert_eq!(r.try_recv().unwrap(), when);
        // An instant in the past is delivered at once, still as itself.
        let past = Instant::now() - ms(100);
        assert_eq!(at(past).try_recv(), Ok(past));
    })
}

#[test]
fn after_delivers_the_instant_it_was_due_not_when_it_was_received() {
    // crossbeam: after(100 ms) received at 500 ms yields start + 100 ms.
    both(|| {
        let d = ms(5);
        let before = Instant::now();
        let r = after(d);
        let made = Instant::now();
        wait_past(made + d + ms(40));
        let msg = r.recv().unwrap();
        assert!(
            msg >= before + d && msg <= made + d,
            "the message is the due instant ({:?} after creation), not the receive time",
            msg.saturating_duration_since(before)
        );
        // The same through select!.
        let before = Instant::now();
        let r = after(d);
        let made = Instant::now();
        wait_past(made + d + ms(40));
        let msg = fiber::select! { recv(r) -> m => m.unwrap() };
        assert!(msg >= before + d && msg <= made + d);
    })
}

#[test]
fn tick_delivers_due_instants_and_restarts_its_period_from_a_late_receive() {
    // crossbeam: tick(100 ms) received at 100, then at 600 (the message says
    // 200), then at 700 (the message says 700).
    both(|| {
        let d = ms(10);
        let before = Instant::now();
        let r = tick(d);
        let made = Instant::now();
        wait_past(made + d + ms(40));
        let t0 = Instant::now();
        let first = r.recv().unwrap();
        let t1 = Instant::now();
        assert!(
            first >= before + d && first <= made + d,
            "the first tick is its due instant"
        );
        // The next one is due one period after the late receive.
        let second = r.recv().unwrap();
        assert!(
            second >= t0 + d && second <= t1 + d,
            "the next tick is due a period after the late receive"
        );
        assert!(!r.is_closed());
    })
}

#[test]
fn timer_channels_of_duration_max_never_fire_and_never_disconnect() {
    both(|| {
        let a = after(Duration::MAX);
        let t = tick(Duration::MAX);
        assert_eq!(a.try_recv(), Err(TryRecvError::Empty));
        assert_eq!(t.recv_timeout(ms(5)), Err(RecvTimeoutError::Timeout));
        let v = fiber::select! {
            recv(a) -> _ => unreachable!("after(MAX) fired"),
            recv(t) -> _ => unreachable!("tick(MAX) fired"),
            default(ms(10)) => 7,
        };
        assert_eq!(v, 7);
    })
}

// ---- crossbeam: select! ----

#[test]
fn select_default_runs_only_when_no_operation_is_ready() {
    both(|| {
        let (s, r) = unbounded::<u8>();
        let ran_default = fiber::select! {
            recv(r) -> _ => false,
            default => true,
        };
        assert!(ran_default);
        s.send(1).unwrap();
        let got = fiber::select! {
            recv(r) -> v => v.unwrap(),
            default => panic!("default ran while a message was ready"),
        };
        assert_eq!(got, 1);
        // A disconnected channel is ready (with an error), so default does
        // not run.
        drop(s);
        let disconnected = fiber::select! {
            recv(r) -> v => v == Err(RecvError),
            default => false,
        };
        assert!(disconnected);
        // default(timeout): runs once the timeout passed with nothing ready.
        let (_s, r) = unbounded::<u8>();
        let start = Instant::now();
        fiber::select! {
            recv(r) -> _ => panic!("nothing was sent"),
            default(ms(20)) => {}
        }
        assert!(start.elapsed() >= ms(20), "default(timeout) is never early");
    })
}

#[test]
fn select_may_name_one_channel_in_several_arms() {
    // crossbeam: "It is also possible to use the same channel in multiple
    // arms."
    both(|| {
        let (s, r) = bounded::<u32>(4);
        for i in 0..4 {
            s.send(i).unwrap();
        }
        let mut got = Vec::new();
        for _ in 0..4 {
            fiber::select! {
                recv(r) -> v => got.push(v.unwrap()),
                recv(r) -> v => got.push(v.unwrap() + 100),
            }
        }
        let mut base: Vec<u32> = got.iter().map(|v| v % 100).collect();
        base.sort_unstable();
        assert_eq!(base, [0, 1, 2, 3], "each message once: {got:?}");
        // Two send arms on one channel: exactly one sends.
        fiber::select! {
            send(s, 10) -> res => res.unwrap(),
            send(s, 20) -> res => res.unwrap(),
        }
        let v = r.try_recv().unwrap();
        assert!(v == 10 || v == 20);
        assert_eq!(r.try_recv(), Err(TryRecvError::Empty));
    })
}

#[test]
fn select_send_arm_to_a_disconnected_channel_is_ready_with_the_value_back() {
    both(|| {
        let (s, r) = bounded::<String>(0);
        drop(r);
        let back = fiber::select! {
            send(s, "hello".to_string()) -> res => res.unwrap_err().into_inner(),
            default(Duration::from_secs(60)) => panic!("a send to a disconnected channel is ready"),
        };
        assert_eq!(back, "hello");
    })
}

#[test]
fn select_over_never_and_a_timer_takes_the_timer() {
    // Go: a nil channel's case never proceeds; crossbeam's never() the same.
    both(|| {
        let start = Instant::now();
        let v = fiber::select! {
            recv(never::<u8>()) -> _ => unreachable!("never() fired"),
            recv(after(ms(15))) -> t => t.unwrap(),
        };
        assert!(v >= start + ms(15));
        let r = fiber::select! {
            recv(never::<u8>()) -> _ => 1,
            default => 2,
        };
        assert_eq!(r, 2);
    })
}

#[test]
fn dynamic_select_timeout_try_and_ready_report_crossbeam_errors() {
    both(|| {
        let (s, r) = unbounded::<u8>();
        let mut sel = Select::new();
        let i = sel.recv(&r);
        assert_eq!(sel.try_select().map(|op| op.index()).err(), Some(TrySelectError));
        assert_eq!(sel.try_ready(), Err(TryReadyError));
        assert!(matches!(sel.select_timeout(ms(10)), Err(SelectTimeoutError)));
        assert_eq!(sel.ready_timeout(ms(10)), Err(ReadyTimeoutError));
        s.send(9).unwrap();
        assert_eq!(sel.ready(), i);
        assert_eq!(sel.try_ready(), Ok(i));
        // ready did not take the message.
        let op = sel.select_timeout(ms(10)).unwrap();
        assert_eq!(op.index(), i);
        assert_eq!(op.recv(&r), Ok(9));
        // A send operation on an unbounded channel is always ready.
        let mut sel = Select::new();
        let j = sel.send(&s);
        assert_eq!(sel.ready(), j);
        let op = sel.select();
        op.send(&s, 5).unwrap();
        assert_eq!(r.try_recv(), Ok(5));
    })
}

#[test]
fn select_picks_randomly_among_ready_arms() {
    // crossbeam: "If multiple operations are ready at the same time, a
    // random one is chosen" (Go likewise). Loose bound: each of two always
    // ready arms wins at least once in 400 rounds.
    both(|| {
        let (s1, r1) = unbounded::<u8>();
        let (s2, r2) = unbounded::<u8>();
        let mut wins = [0usize; 2];
        for _ in 0..400 {
            s1.send(1).unwrap();
            s2.send(2).unwrap();
            fiber::select! {
                recv(r1) -> _ => wins[0] += 1,
                recv(r2) -> _ => wins[1] += 1,
            }
            // Empty both again.
            let _ = r1.try_recv();
            let _ = r2.try_recv();
        }
        assert!(wins[0] > 0 && wins[1] > 0, "both arms win sometimes: {wins:?}");
    })
}

#[test]
fn same_channel_for_clones_timers_and_never() {
    let (s, r) = bounded::<u8>(1);
    assert!(s.same_channel(&s.clone()) && r.same_channel(&r.clone()));
    let t = tick(ms(100));
    assert!(t.same_channel(&t.clone()) && !t.same_channel(&tick(ms(100))));
    // crossbeam: every never() is the same channel.
    assert!(never::<u8>().same_channel(&never()));
    assert!(!r.same_channel(&never()));
}

// ---- Go: close and rendezvous ----

#[test]
fn close_wakes_every_parked_receiver_on_every_flavor() {
    // Go: "close ... after the last sent value is received, any receive
    // from the closed channel succeeds without blocking" (here: fails with
    // RecvError, crossbeam style, never blocks).
    within(30, || {
        rt().block_on(|| {
            for cap in [Some(0), Some(3), None] {
                let (s, r) = match cap {
                    Some(c) => bounded::<u8>(c),
                    None => unbounded(),
                };
                let woken = Arc::new(AtomicUsize::new(0));
                let mut handles = Vec::new();
                for _ in 0..4 {
                    let r = r.clone();
                    let woken = woken.clone();
                    handles.push(fiber::spawn(move || {
                        assert_eq!(r.recv(), Err(RecvError));
                        woken.fetch_add(1, Ordering::SeqCst);
                    }));
                }
                let r2 = r.clone();
                let t = std::thread::spawn(move || r2.recv());
                while s.waiting().0 < 5 {
                    fiber::yield_now().unwrap();
                }
                assert!(s.close());
                assert!(!s.close(), "a second close reports it was closed");
                for h in handles {
                    h.join().unwrap();
                }
                assert_eq!(t.join().unwrap(), Err(RecvError));
                assert_eq!(woken.load(Ordering::SeqCst), 4);
                assert_eq!(s.send(1), Err(SendError(1)), "send after close fails");
            }
        })
    })
}

#[test]
fn a_rendezvous_send_waits_for_a_receiver_on_a_plain_thread_and_a_fiber() {
    both(|| {
        let (s, r) = bounded::<u32>(0);
        let (done_tx, done_rx) = unbounded();
        let t = std::thread::spawn(move || {
            s.send(5).unwrap();
            done_tx.send(()).unwrap();
        });
        assert_eq!(
            done_rx.recv_timeout(ms(30)),
            Err(RecvTimeoutError::Timeout),
            "no receiver yet"
        );
        assert_eq!(r.recv(), Ok(5));
        done_rx.recv().unwrap();
        t.join().unwrap();
    })
}

// ---- drops ----

/// A value that counts its drops in its own test's counter (tests run in
/// parallel) and, if asked, panics when dropped.
struct Counted(u32, bool, &'static AtomicUsize);

impl Drop for Counted {
    fn drop(&mut self) {
        self.2.fetch_add(1, Ordering::SeqCst);
        if self.1 && !std::thread::panicking() {
            panic!("drop of value {} panics", self.0);
        }
    }
}

#[test]
fn values_left_in_a_channel_drop_exactly_once_even_if_one_drop_panics() {
    static DROPS: AtomicUsize = AtomicUsize::new(0);
    within(30, || {
        for cap in [Some(1), Some(16), None] {
            DROPS.store(0, Ordering::SeqCst);
            let (s, r) = match cap {
                Some(c) => bounded(c),
                None => unbounded(),
            };
            let n = cap.unwrap_or(16) as u32;
            for i in 0..n {
                s.send(Counted(i, false, &DROPS)).unwrap();
            }
            assert_eq!(r.recv().map(|c| c.0).unwrap(), 0);
            assert_eq!(DROPS.load(Ordering::SeqCst), 1);
            if n > 1 {
                // Replace one buffered value with a panicking one.
                s.send(Counted(99, true, &DROPS)).unwrap();
            }
            drop(s);
            // The last handle drops the buffered values: each once.
            let dropped = std::panic::catch_unwind(AssertUnwindSafe(move || drop(r)));
            let expected = n as usize + usize::from(n > 1);
            assert_eq!(DROPS.load(Ordering::SeqCst), expected, "cap {cap:?}");
            assert_eq!(dropped.is_err(), n > 1, "the panicking drop is reported once");
        }
    })
}

#[test]
fn the_last_receiver_leaving_drops_buffered_values_while_senders_live() {
    // crossbeam: when all receivers are gone, messages still in the channel
    // are dropped (they can never be received).
    static DROPS: AtomicUsize = AtomicUsize::new(0);
    within(30, || {
        let (s, r) = bounded(4);
        s.send(Counted(1, false, &DROPS)).unwrap();
        s.send(Counted(2, false, &DROPS)).unwrap();
        let r2 = r.clone();
        drop(r);
        assert_eq!(DROPS.load(Ordering::SeqCst), 0, "a receiver is left");
        drop(r2);
        assert_eq!(DROPS.load(Ordering::SeqCst), 2);
        let e = s.send(Counted(3, false, &DROPS)).unwrap_err();
        assert_eq!(e.0 .0, 3);
        drop(e);
        assert_eq!(DROPS.load(Ordering::SeqCst), 3);
        drop(s);
        assert_eq!(DROPS.load(Ordering::SeqCst), 3);
    })
}

#[test]
fn chan_module_paths_match_crossbeam() {
    // `fiber::chan` exports the crossbeam names used by ported code.
    let _: fn(usize) -> (chan::Sender<u8>, Receiver<u8>) = chan::bounded::<u8>;
    let _: fn() -> (chan::Sender<u8>, Receiver<u8>) = chan::unbounded::<u8>;
    let _: fn(Duration) -> Receiver<Instant> = chan::after;
    let _: fn(Instant) -> Receiver<Instant> = chan::at;
    let _: fn(Duration) -> Receiver<Instant> = chan::tick;
    let _: fn() -> Receiver<u8> = chan::never::<u8>;
}

#[test]
fn handles_are_send_sync_clone_and_unwind_safe_like_crossbeam() {
    // crossbeam: `Sender<T>` and `Receiver<T>` are `Send + Sync` for
    // `T: Send`, and `UnwindSafe + RefUnwindSafe` for every `T`, so a
    // closure using them can go to `catch_unwind` as it is.
    fn send_sync<T: Send + Sync>() {}
    fn unwind_safe<T: std::panic::UnwindSafe + std::panic::RefUnwindSafe>() {}
    send_sync::<chan::Sender<std::cell::Cell<u8>>>();
    send_sync::<Receiver<std::cell::Cell<u8>>>();
    unwind_safe::<chan::Sender<std::cell::Cell<u8>>>();
    unwind_safe::<Receiver<std::cell::Cell<u8>>>();
    let (s, r) = bounded::<u8>(1);
    let sent = std::panic::catch_unwind(|| s.send(1));
    assert_eq!(sent.unwrap(), Ok(()));
    let got = std::panic::catch_unwind(|| r.recv());
    assert_eq!(got.unwrap(), Ok(1));
}

#[test]
fn a_select_can_be_cloned_with_its_operations_and_indices() {
    // crossbeam: `Select` is `Clone`; the copy has the same operations
    // (removed ones stay removed) and the same indices.
    both(|| {
        let (s1, r1) = unbounded::<u8>();
        let (s2, r2) = unbounded::<u8>();
        let (_s3, r3) = unbounded::<u8>();
        let mut sel = Select::new_biased();
        let i1 = sel.recv(&r1);
        let i3 = sel.recv(&r3);
        let i2 = sel.recv(&r2);
        sel.remove(i3);
        let mut copy = sel.clone();
        s2.send(2).unwrap();
        s1.send(1).unwrap();
        // Biased is kept: the first added ready operation wins.
        assert_eq!(copy.ready(), i1);
        let op = copy.select();
        assert_eq!(op.index(), i1);
        assert_eq!(op.recv(&r1), Ok(1));
        let op = sel.select();
        assert_eq!(op.index(), i2);
        assert_eq!(op.recv(&r2), Ok(2));
        let _default = Select::default();
    })
}

#[test]
fn a_rendezvous_try_recv_takes_from_a_parked_sender_and_len_stays_zero() {
    // crossbeam: on a zero-capacity channel, try_recv succeeds when a sender
    // is waiting; the channel is always empty and full.
    both(|| {
        let (s, r) = bounded::<u8>(0);
        let t = std::thread::spawn(move || s.send(3));
        let got = loop {
            assert_eq!((r.len(), r.is_empty(), r.is_full()), (0, true, true));
            match r.try_recv() {
                Ok(v) => break v,
                Err(TryRecvError::Empty) => std::thread::yield_now(),
                Err(e) => panic!("{e:?}"),
            }
        };
        assert_eq!(got, 3);
        assert_eq!(t.join().unwrap(), Ok(()));
    })
}

#[test]
fn len_never_counts_parked_senders_beyond_the_capacity() {
    // Go: len(ch) <= cap(ch); crossbeam: len is the number of messages in
    // the channel.
    within(30, || {
        rt().block_on(|| {
            let (s, r) = bounded::<u32>(2);
            s.send(0).unwrap();
            s.send(1).unwrap();
            let senders: Vec<_> = (2..5)
                .map(|i| {
                    let s = s.clone();
                    fiber::spawn(move || s.send(i))
                })
                .collect();
            while s.waiting().1 < 3 {
                fiber::yield_now().unwrap();
            }
            assert_eq!((s.len(), r.len(), s.is_full()), (2, 2, true));
            let mut got: Vec<u32> = (0..5).map(|_| r.recv().unwrap()).collect();
            for h in senders {
                h.join().unwrap().unwrap();
            }
            assert_eq!(&got[..2], &[0, 1], "FIFO: buffered values first");
            got.sort_unstable();
            assert_eq!(got, [0, 1, 2, 3, 4]);
            assert_eq!(r.len(), 0);
        })
    })
}

#[test]
fn crossbeams_send_or_receive_example_pairs_everyone_but_at_most_one() {
    // crossbeam's select! example: five parties either send their name or
    // receive someone else's over `bounded(1)`; at most one name is left.
    fn seek(name: &'static str, s: chan::Sender<&'static str>, r: Receiver<&'static str>) -> Option<&'static str> {
        fiber::select! {
            recv(r) -> peer => Some(peer.unwrap()),
            send(s, name) -> res => { res.unwrap(); None },
        }
    }
    within(30, || {
        for round in 0..20 {
            let (s, r) = bounded(1);
            let people = ["Anna", "Bob", "Cody", "Dave", "Eva"];
            let received: Vec<Option<&str>> = if round % 2 == 0 {
                rt().block_on(|| {
                    let hs: Vec<_> = people
                        .iter()
                        .map(|&n| {
                            let (s, r) = (s.clone(), r.clone());
                            fiber::spawn(move || seek(n, s, r))
                        })
                        .collect();
                    hs.into_iter().map(|h| h.join().unwrap()).collect()
                })
            } else {
                let hs: Vec<_> = people
                    .iter()
                    .map(|&n| {
                        let (s, r) = (s.clone(), r.clone());
                        std::thread::spawn(move || seek(n, s, r))
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            };
            let receivers = received.iter().filter(|x| x.is_some()).count();
            let left = r.try_recv().ok();
            // Each receiver got someone's name; a name sent and not received
            // is still in the channel.
            assert_eq!(
                receivers + usize::from(left.is_some()),
                5 - receivers,
                "round {round}: {received:?} {left:?}"
            );
            assert!(left.is_none() || receivers == 2, "at most one unmatched send");
        }
    })
}

#[test]
fn select_macro_accepts_crossbeams_syntax_variants() {
    both(|| {
        let (s, r) = bounded::<u8>(1);
        // Trailing commas inside the argument lists, `default()` as a plain
        // default, blocks without a comma, a final arm without a comma.
        fiber::select! {
            send(s, 1,) -> res => res.unwrap(),
            default() => panic!("a free slot is ready"),
        }
        let v = fiber::select! {
            recv(r,) -> m => { m.unwrap() }
            default(ms(50),) => 0
        };
        assert_eq!(v, 1);
        // A `mut` pattern binds as in a `let`.
        s.send(4).unwrap();
        fiber::select! {
            recv(r) -> mut m => {
                m = m.map(|v| v * 2);
                assert_eq!(m, Ok(8));
            }
        }
    })
}

#[test]
fn select_with_only_a_default_runs_it() {
    // crossbeam: with no operations, `default` runs at once and
    // `default(timeout)` after the timeout.
    both(|| {
        assert_eq!(fiber::select! { default => 3 }, 3);
        let start = Instant::now();
        assert_eq!(fiber::select! { default(ms(10)) => 4 }, 4);
        assert!(start.elapsed() >= ms(10));
    })
}

#[test]
fn parked_selects_are_woken_by_close_and_by_the_last_receiver_leaving() {
    // Go: close wakes every receiver, including those blocked in select; a
    // send blocked in select fails once nobody can receive (crossbeam:
    // disconnection makes the operation ready with an error).
    within(30, || {
        rt().block_on(|| {
            for cap in [Some(0), Some(1), None] {
                let (s, r) = match cap {
                    Some(c) => bounded::<u8>(c),
                    None => unbounded(),
                };
                let (_keep, other) = unbounded::<u8>();
                let mut waiters = Vec::new();
                for _ in 0..3 {
                    let (r, other) = (r.clone(), other.clone());
                    waiters.push(fiber::spawn(move || {
                        fiber::select! {
                            recv(other) -> _ => panic!("nothing is sent on the other channel"),
                            recv(r) -> v => v,
                        }
                    }));
                }
                let (r2, other2) = (r.clone(), other.clone());
                let thread = std::thread::spawn(move || {
                    fiber::select! {
                        recv(r2) -> v => v,
                        recv(other2) -> _ => panic!("nothing is sent on the other channel"),
                    }
                });
                while s.waiting().0 < 4 {
                    fiber::yield_now().unwrap();
                }
                s.close();
                for w in waiters {
                    assert_eq!(w.join().unwrap(), Err(RecvError), "cap {cap:?}");
                }
                assert_eq!(thread.join().unwrap(), Err(RecvError));
            }
            // A send arm parked on a full channel gets its value back when
            // the last receiver leaves.
            for cap in [0usize, 1] {
                let (s, r) = bounded::<String>(cap);
                if cap == 1 {
                    s.send("filler".into()).unwrap();
                }
                let (_keep, other) = unbounded::<u8>();
                let sender = {
                    let s = s.clone();
                    fiber::spawn(move || {
                        fiber::select! {
                            send(s, "mine".to_string()) -> res => res.map_err(|e| e.into_inner()),
                            recv(other) -> _ => unreachable!(),
                        }
                    })
                };
                while s.waiting().1 < 1 {
                    fiber::yield_now().unwrap();
                }
                drop(r);
                assert_eq!(sender.join().unwrap(), Err("mine".to_string()), "cap {cap}");
            }
        })
    })
}

#[test]
fn each_consumer_sees_each_producers_values_in_the_order_sent() {
    // Go: "Channels act as first-in-first-out queues": with several
    // producers and consumers (fibers and threads), each consumer receives
    // each producer's values in increasing order, and every value once.
    const PER: u32 = 1500;
    within(60, || {
        rt().block_on(|| {
            for cap in [Some(0), Some(4), None] {
                let (s, r) = match cap {
                    Some(c) => bounded::<(u32, u32)>(c),
                    None => unbounded(),
                };
                let mut producers = Vec::new();
                let mut threads = Vec::new();
                for id in 0..3u32 {
                    let s = s.clone();
                    let send_all = move || {
                        for seq in 0..PER {
                            s.send((id, seq)).unwrap();
                        }
                    };
                    if id == 2 {
                        threads.push(std::thread::spawn(send_all));
                    } else {
                        producers.push(fiber::spawn(send_all));
                    }
                }
                drop(s);
                let check = |got: &[(u32, u32)]| {
                    let mut last = [None::<u32>; 3];
                    for &(id, seq) in got {
                        let prev = &mut last[id as usize];
                        assert!(
                            prev.is_none_or(|p| p < seq),
                            "producer {id}: {prev:?} then {seq} (cap {cap:?})"
                        );
                        *prev = Some(seq);
                    }
                };
                let consumers: Vec<_> = (0..2)
                    .map(|_| {
                        let r = r.clone();
                        fiber::spawn(move || r.iter().collect::<Vec<_>>())
                    })
                    .collect();
                let r2 = r.clone();
                let consumer_thread = std::thread::spawn(move || r2.iter().collect::<Vec<_>>());
                drop(r);
                let mut all = Vec::new();
                for c in consumers {
                    let got = c.join().unwrap();
                    check(&got);
                    all.extend(got);
                }
                let got = consumer_thread.join().unwrap();
                check(&got);
                all.extend(got);
                for p in producers {
                    p.join().unwrap();
                }
                for t in threads {
                    t.join().unwrap();
                }
                all.sort_unstable();
                let expected: Vec<_> = (0..3).flat_map(|id| (0..PER).map(move |s| (id, s))).collect();
                assert!(all == expected, "every value exactly once (cap {cap:?})");
            }
        })
    })
}

#[test]
fn select_operands_may_borrow_temporaries() {
    // crossbeam: temporaries made while evaluating an operand live until
    // the select ends, e.g. `recv(r.unwrap_or(&never()))` for an optional
    // receiver.
    both(|| {
        let (s, r) = unbounded::<u8>();
        s.send(1).unwrap();
        let mut maybe = Some(&r);
        let got = fiber::select! {
            recv(maybe.unwrap_or(&never())) -> v => v.unwrap(),
            default => panic!("the receiver holds a value"),
        };
        assert_eq!(got, 1);
        maybe = None;
        fiber::select! {
            recv(maybe.unwrap_or(&never())) -> _ => panic!("never() is never ready"),
            default => {}
        }
        let (s2, r2) = bounded::<u8>(1);
        let maybe_s = if r2.is_empty() { Some(&s2) } else { None };
        fiber::select! {
            send(maybe_s.unwrap_or(&bounded(1).0), 7) -> res => res.unwrap(),
            recv(maybe.unwrap_or(&never())) -> _ => unreachable!(),
        }
        assert_eq!(r2.try_recv(), Ok(7));
    })
}

#[test]
fn select_is_uniform_among_ready_arms_whatever_arms_are_not_ready() {
    // Go: "a single one [of the communications that can proceed] is chosen
    // via a uniform pseudo-random selection"; crossbeam: "a random one is
    // chosen". Two always-ready arms behind two never-ready ones must each
    // win about half the time (bounds far outside the noise of 2,000
    // trials: 35% .. 65%).
    both(|| {
        let (_e1, empty1) = unbounded::<u8>();
        let (_e2, empty2) = unbounded::<u8>();
        let (s1, r1) = unbounded::<u8>();
        let (s2, r2) = unbounded::<u8>();
        s1.send(1).unwrap();
        s2.send(2).unwrap();
        let mut wins = [0u32; 2];
        for _ in 0..2000 {
            fiber::select! {
                recv(empty1) -> _ => unreachable!(),
                recv(empty2) -> _ => unreachable!(),
                recv(r1) -> v => { wins[0] += 1; s1.send(v.unwrap()).unwrap(); }
                recv(r2) -> v => { wins[1] += 1; s2.send(v.unwrap()).unwrap(); }
            }
        }
        assert!((700..=1300).contains(&wins[0]), "unfair select: {wins:?}");
        // The same for the dynamic `Select`.
        let mut wins = [0u32; 2];
        for _ in 0..2000 {
            let mut sel = Select::new();
            sel.recv(&empty1);
            sel.recv(&empty2);
            let a = sel.recv(&r1);
            let b = sel.recv(&r2);
            let op = sel.select();
            let i = op.index();
            if i == a {
                wins[0] += 1;
                s1.send(op.recv(&r1).unwrap()).unwrap();
            } else {
                assert_eq!(i, b);
                wins[1] += 1;
                s2.send(op.recv(&r2).unwrap()).unwrap();
            }
        }
        assert!((700..=1300).contains(&wins[0]), "unfair Select: {wins:?}");
    })
}

#[test]
fn two_send_arms_on_one_rendezvous_channel_are_chosen_at_random_after_parking() {
    // Go's TestPseudoRandomSend: a select with `send(c, 0)` and
    // `send(c, 1)` on an unbuffered channel, parked before the receiver
    // comes, still sends each value sometimes.
    within(30, || {
        let (s, r) = bounded::<u32>(0);
        let probe = s.clone();
        const ROUNDS: usize = 200;
        let receiver = std::thread::spawn(move || {
            let mut got = Vec::new();
            for _ in 0..ROUNDS {
                // Let the select park both send arms first.
                while probe.waiting().1 < 2 {
                    std::thread::yield_now();
                }
                got.push(r.recv().unwrap());
            }
            got
        });
        for _ in 0..ROUNDS {
            fiber::select! {
                send(s, 0) -> res => res.unwrap(),
                send(s, 1) -> res => res.unwrap(),
            }
        }
        let got = receiver.join().unwrap();
        let ones = got.iter().filter(|&&v| v == 1).count();
        assert!(
            (ROUNDS / 10..=ROUNDS - ROUNDS / 10).contains(&ones),
            "want pseudo-random, got {ones} ones in {ROUNDS}"
        );
    })
}

#[test]
fn try_ready_sees_a_peer_already_parked_on_a_rendezvous_channel() {
    // crossbeam: `try_ready` reports an operation that would complete now;
    // on a zero-capacity channel a send is ready when a receiver waits, a
    // receive when a sender waits.
    both(|| {
        let (s, r) = bounded::<u8>(0);
        let probe = s.clone();
        let receiver = std::thread::spawn(move || r.recv());
        while probe.waiting().0 < 1 {
            std::thread::yield_now();
        }
        let mut sel = Select::new();
        let i = sel.send(&s);
        assert_eq!(sel.try_ready(), Ok(i), "a receiver is parked");
        assert_eq!(sel.ready_timeout(ms(10)), Ok(i));
        s.send(5).unwrap();
        assert_eq!(receiver.join().unwrap(), Ok(5));

        let (s, r) = bounded::<u8>(0);
        let probe = s.clone();
        let sender = std::thread::spawn(move || s.send(6));
        while probe.waiting().1 < 1 {
            std::thread::yield_now();
        }
        let mut sel = Select::new();
        let j = sel.recv(&r);
        assert_eq!(sel.try_ready(), Ok(j), "a sender is parked");
        assert_eq!(r.recv(), Ok(6));
        assert_eq!(sender.join().unwrap(), Ok(()));
    })
}

#[test]
fn ready_then_try_completes_against_parked_rendezvous_peers() {
    // crossbeam's `ready` idiom: `ready()` names an operation that can
    // proceed, then the caller performs it with `try_recv` / `try_send`.
    // On zero-capacity channels the peer is parked: the try must succeed.
    within(60, || {
        const ROUNDS: u32 = 500;
        let (s1, r1) = bounded::<u32>(0);
        let (s2, r2) = bounded::<u32>(0);
        let (s3, r3) = bounded::<()>(100);
        let peer = std::thread::spawn(move || {
            for i in 0..ROUNDS {
                s1.send(i).unwrap();
                assert_eq!(r2.recv().unwrap(), i);
                r3.recv().unwrap();
            }
        });
        for i in 0..ROUNDS {
            for _ in 0..2 {
                let mut sel = Select::new();
                let a = sel.recv(&r1);
                let b = sel.send(&s2);
                let k = sel.ready();
                if k == a {
                    assert_eq!(r1.try_recv(), Ok(i));
                } else {
                    assert_eq!(k, b);
                    assert_eq!(s2.try_send(i), Ok(()));
                }
            }
            s3.send(()).unwrap();
        }
        peer.join().unwrap();
    })
}

#[test]
fn duplicate_receive_arms_parked_on_one_channel_are_chosen_at_random() {
    // crossbeam's `fairness_duplicates`: a select with the same receive arm
    // five times, parked before the sender comes, still lets every arm
    // win sometimes (the queue order of its waiters is random too).
    within(30, || {
        const ROUNDS: usize = 250;
        let (s, r) = bounded::<u32>(0);
        let probe = s.clone();
        let sender = std::thread::spawn(move || {
            for i in 0..ROUNDS as u32 {
                while probe.waiting().0 < 5 {
                    std::thread::yield_now();
                }
                probe.send(i).unwrap();
            }
        });
        let mut hits = [0usize; 5];
        for _ in 0..ROUNDS {
            fiber::select! {
                recv(r) -> _ => hits[0] += 1,
                recv(r) -> _ => hits[1] += 1,
                recv(r) -> _ => hits[2] += 1,
                recv(r) -> _ => hits[3] += 1,
                recv(r) -> _ => hits[4] += 1,
            }
        }
        sender.join().unwrap();
        drop(s);
        assert!(
            hits.iter().all(|&h| h >= ROUNDS / 5 / 4),
            "every arm wins sometimes: {hits:?}"
        );
    })
}

#[test]
fn try_recv_after_a_completed_send_never_reports_empty() {
    // crossbeam's `linearizable`: with as many threads as slots, each
    // sending then try-receiving, a try_recv always finds a value (its own
    // completed send, at least, is in the channel), even while another
    // sender is between claiming a slot and writing it.
    within(60, || {
        const THREADS: usize = 4;
        const COUNT: usize = 20_000;
        let (s, r) = bounded::<u8>(THREADS);
        std::thread::scope(|scope| {
            for _ in 0..THREADS {
                scope.spawn(|| {
                    for _ in 0..COUNT {
                        s.send(0).unwrap();
                        assert_eq!(r.try_recv(), Ok(0), "a completed send is in the channel");
                    }
                });
            }
        });
    })
}

#[test]
fn a_single_try_recv_takes_the_value_of_a_parked_rendezvous_sender() {
    // crossbeam's zero::try_recv: once a sender is blocked in `send`, one
    // `try_recv` receives its value.
    both(|| {
        let (s, r) = bounded::<u8>(0);
        let probe = s.clone();
        let sender = std::thread::spawn(move || s.send(7));
        while probe.waiting().1 < 1 {
            std::thread::yield_now();
        }
        assert_eq!(r.try_recv(), Ok(7));
        assert_eq!(sender.join().unwrap(), Ok(()));
        drop(probe);
        assert_eq!(r.try_recv(), Err(TryRecvError::Disconnected));
    })
}

/// A select parked on a send arm of `s` (and of a channel nobody reads),
/// on a thread of its own; returns which arm it took.
fn select_parked_on_a_send_arm(s: chan::Sender<u8>) -> std::thread::JoinHandle<usize> {
    let (idle, idle_r) = bounded::<u8>(0);
    let probe = s.clone();
    let t = std::thread::spawn(move || {
        let _keep = idle_r;
        fiber::select! {
            send(s, 42) -> r => { r.unwrap(); 0 }
            send(idle, 7) -> r => { r.unwrap(); 1 }
        }
    });
    while probe.waiting().1 < 1 {
        std::thread::yield_now();
    }
    t
}

/// Yield the thread or the fiber, whichever runs this.
fn yield_here() {
    if fiber::core::in_fiber() {
        fiber::yield_now().unwrap();
    } else {
        std::thread::yield_now();
    }
}

#[test]
fn a_polling_try_recv_takes_the_value_of_a_select_parked_on_a_send_arm() {
    // Go: a non-blocking receive proceeds when a sender is ready, and a
    // goroutine blocked in `select` on a send case is one; crossbeam's
    // `try_recv` pairs with a select blocked on a send operation. A polling
    // loop used to wake the select forever and never get the value.
    both(|| {
        let (s, r) = bounded::<u8>(0);
        let t = select_parked_on_a_send_arm(s);
        let give_up = Instant::now() + Duration::from_secs(10);
        let value = loop {
            match r.try_recv() {
                Ok(v) => break v,
                Err(TryRecvError::Empty) => {
                    assert!(Instant::now() < give_up, "try_recv never took the select's value");
                    yield_here();
                }
                Err(TryRecvError::Disconnected) => panic!("the select still holds its sender"),
            }
        };
        assert_eq!(value, 42);
        assert_eq!(t.join().unwrap(), 0, "the select took its send arm");
    })
}

#[test]
fn a_polling_select_with_default_takes_the_value_of_a_select_parked_on_a_send_arm() {
    // Go's `select { case v := <-c: ...; default: }` against a goroutine
    // blocked in `select { case c <- 42: ... }`.
    both(|| {
        let (s, r) = bounded::<u8>(0);
        let t = select_parked_on_a_send_arm(s);
        let give_up = Instant::now() + Duration::from_secs(10);
        let value = loop {
            let got = fiber::select! {
                recv(r) -> m => Some(m.unwrap()),
                default => None,
            };
            if let Some(v) = got {
                break v;
            }
            assert!(Instant::now() < give_up, "the polling select never took the value");
            yield_here();
        };
        assert_eq!(value, 42);
        assert_eq!(t.join().unwrap(), 0);
    })
}

#[test]
fn a_try_recv_racing_a_select_that_may_take_another_arm_loses_and_duplicates_nothing() {
    // Whichever arm the select takes, the value reaches the receiver iff
    // the select reports its send arm.
    both(|| {
        for _ in 0..50 {
            let (s, r) = bounded::<u8>(0);
            let (other_s, other_r) = bounded::<u8>(1);
            let probe = s.clone();
            let t = std::thread::spawn(move || {
                fiber::select! {
                    send(s, 42) -> res => { res.unwrap(); 0 }
                    recv(other_r) -> m => { assert_eq!(m, Ok(9)); 1 }
                }
            });
            while probe.waiting().1 < 1 {
                std::thread::yield_now();
            }
            other_s.send(9).unwrap();
            let got = r.try_recv();
            let arm = t.join().unwrap();
            match arm {
                0 => assert_eq!(got, Ok(42), "the select sent: the value was received"),
                _ => {
                    assert_eq!(got, Err(TryRecvError::Empty), "the select took its receive arm");
                    assert_eq!(r.try_recv(), Err(TryRecvError::Empty));
                }
            }
        }
    })
}

/// crossbeam's `tick`: a blocking receive computes the next delivery as
/// `max(delivery, now) + duration` with `now` taken before it waits, so a
/// receiver that is already waiting when a tick is due gets the next one
/// exactly one period later, however late its wake-up came. Each receive
/// below that began before its tick was due must see a gap of exactly one
/// period (the tick pushed the schedule back by every wake-up's delay, so
/// a `tick(1 ms)` on a fiber gave about half its messages).
#[test]
fn tick_keeps_its_schedule_for_a_receiver_that_was_waiting() {
    both(|| {
        for timed in [false, true] {
            let d = ms(5);
            let r = fiber::chan::tick(d);
            let mut last = r.recv().unwrap();
            // Was the previous receive waiting before its tick was due (so
            // that this tick is due one period after that one)? Unknown
            // for the first.
            let mut previous_waited = false;
            let mut checked = 0;
            for _ in 0..20 {
                let called = Instant::now();
                let m = if timed {
                    r.recv_timeout(Duration::from_secs(10)).unwrap()
                } else {
                    r.recv().unwrap()
                };
                let waited = called < m;
                if waited && previous_waited {
                    assert_eq!(m - last, d, "a waiting receiver's tick came off schedule");
                    checked += 1;
                }
                previous_waited = waited;
                last = m;
            }
            assert!(checked > 0, "no receive began before its tick was due");
        }
    });
}

/// crossbeam: `Iter` and `IntoIter` are `FusedIterator`s.
#[test]
fn iter_and_into_iter_are_fused_like_crossbeam() {
    fn fused<I: std::iter::FusedIterator>(_: &I) {}
    let (s, r) = fiber::chan::unbounded::<u8>();
    drop(s);
    let mut it = r.iter();
    fused(&it);
    assert_eq!((it.next(), it.next()), (None, None));
    let mut it = r.into_iter();
    fused(&it);
    assert_eq!((it.next(), it.next()), (None, None));
}

/// crossbeam's `select!` evaluates a send arm's value and runs that arm's
/// body in one branch, so the value is moved only if that arm is chosen:
/// the default body or another arm's body may still use it. Code written
/// for crossbeam did not compile here (E0382, "use of moved value").
#[test]
fn a_send_arms_value_stays_usable_by_the_other_arms() {
    both(|| {
        let (s, r) = bounded::<String>(0);
        let mut pending = Vec::new();
        let item = String::from("x");
        fiber::select! {
            send(s, item) -> res => res.unwrap(),
            default => pending.push(item),
        }
        assert_eq!(pending, ["x"]);
        let item = String::from("w");
        fiber::select! {
            send(s, item) -> res => res.unwrap(),
            default(ms(1)) => pending.push(item),
        }
        assert_eq!(pending, ["x", "w"]);
        drop(r);

        let (s, _r) = bounded::<String>(0);
        let (s2, r2) = unbounded::<u8>();
        s2.send(1).unwrap();
        let item = String::from("y");
        let kept = fiber::select! {
            send(s, item) -> _ => None,
            recv(r2) -> _ => Some(item),
        };
        assert_eq!(kept.as_deref(), Some("y"));
    });
}

/// A body may replace the channel its arm used (the select's borrows have
/// ended when a body runs), in every form of the macro.
#[test]
fn a_select_body_may_replace_the_channel_it_used() {
    both(|| {
        let (s, mut r) = unbounded::<u8>();
        s.send(1).unwrap();
        drop(s);
        let mut got = Vec::new();
        // The value, then the disconnect (which swaps in `never()`).
        for _ in 0..2 {
            fiber::select! {
                recv(r) -> m => match m {
                    Ok(v) => got.push(v),
                    Err(_) => r = never(),
                },
            }
        }
        assert_eq!(got, [1]);
        fiber::select! {
            recv(r) -> _ => unreachable!("never() is never ready"),
            default => r = unbounded().1,
        }
        assert!(r.is_empty());
    });
}
