//! Adversarial review 10: `fiber::select!` / `select_biased!` and
//! `fiber::chan::Select` against crossbeam-channel's documented `select!`
//! rules (crossbeam-channel `src/select_macro.rs`, `src/select.rs`,
//! `tests/select_macro.rs`, `tests/select.rs`) and Go's select semantics,
//! aimed at what `conformance/crossbeam.rs` and `adversarial/select*.rs`
//! do not cover: when and how often operands, send values and timeouts
//! are evaluated; control flow (`break`, `continue`, labels, `return`,
//! `?`) in bodies and in send values; patterns and moves of received
//! values; hygiene of the macro's internal names; one channel in several
//! arms; many arms; `never()` and disconnected arms; `Select::remove`,
//! `select_timeout`, `select_deadline`, `try_ready`, `ready_deadline`;
//! `SelectedOperation` misuse; polling receives against a select parked on
//! a send arm.
//!
//! Every body runs three ways (plain threads, fibers on 1 and on 2
//! workers), each under a hang guard (`common/three_ways.rs`).

#![allow(
    clippy::never_loop,
    clippy::diverging_sub_expression,
    unreachable_code,
    clippy::needless_return,
    clippy::let_unit_value,
    clippy::redundant_closure_call,
    unused_labels,
    unused_assignments
)]

use fiber::chan::{
    after, bounded, never, select, select_biased, tick, unbounded, Receiver, RecvError, RecvTimeoutError, Select,
    SendError, Sender, TryRecvError,
};
use std::cell::{Cell, RefCell};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::three_ways::*;

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "<non-string panic>".into()
    }
}

/// Run `f`, which must panic; return the panic's text (the default hook is
/// left alone: the expected panic prints, which is harmless).
fn must_panic(f: impl FnOnce()) -> String {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(()) => panic!("expected a panic"),
        Err(p) => panic_text(&*p),
    }
}

/// Poll `cond` (yielding in between) until it holds or `limit` passes.
fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if cond() {
            return true;
        }
        relax();
    }
    cond()
}

// ---------------------------------------------------------------------------
// Evaluation: order and count of operands, send values and timeouts.

/// crossbeam (`select_macro.rs`, `@add`/`@complete`): operands are
/// evaluated once each, in the order written; the `default(timeout)`
/// expression once, after every operand; a send arm's value only if that
/// arm is selected, after the selection, and never for a losing arm or the
/// default.
fn evaluation_order_and_counts() {
    let log = RefCell::new(Vec::<&'static str>::new());
    let (s1, r1) = bounded::<i32>(0); // never ready: nobody receives
    let (s2, r2) = bounded::<i32>(1); // ready
    let (_s3, r3) = unbounded::<i32>(); // empty
    let op = |name| log.borrow_mut().push(name);
    select! {
        send({ op("s1"); &s1 }, { op("v1"); 1 }) -> _ => panic!("rendezvous send without a receiver"),
        recv({ op("r3"); &r3 }) -> _ => panic!("empty"),
        send({ op("s2"); &s2 }, { op("v2"); 2 }) -> res => assert_eq!(res, Ok(())),
        default({ op("timeout"); ms(1000) }) => panic!("s2 had room"),
    }
    assert_eq!(*log.borrow(), ["s1", "r3", "s2", "timeout", "v2"]);
    assert_eq!(r2.try_recv(), Ok(2));

    // Nothing ready: the default runs, no value is evaluated.
    log.borrow_mut().clear();
    select! {
        send({ op("s1"); &s1 }, { op("v1"); 1 }) -> _ => panic!(),
        recv({ op("r3"); &r3 }) -> _ => panic!(),
        default({ op("timeout"); ms(20) }) => op("default"),
    }
    assert_eq!(*log.borrow(), ["s1", "r3", "timeout", "default"]);

    // A plain default: same.
    log.borrow_mut().clear();
    select! {
        send({ op("s1"); &s1 }, { op("v1"); 1 }) -> _ => panic!(),
        default => op("default"),
    }
    assert_eq!(*log.borrow(), ["s1", "default"]);

    // A disconnected send arm is selected and its value evaluated once,
    // returned in the error.
    let (s4, r4) = bounded::<String>(0);
    drop(r4);
    log.borrow_mut().clear();
    let got = select! {
        send({ op("s4"); &s4 }, { op("v4"); String::from("kept") }) -> res => res,
        send({ op("s1"); &s1 }, { op("v1"); 1 }) -> _ => panic!(),
    };
    assert_eq!(got, Err(SendError(String::from("kept"))));
    assert_eq!(*log.borrow(), ["s4", "s1", "v4"]);
    drop((r1, r2));
}

/// A send arm's value that loses stays with the caller: the default (or
/// another arm) may still use it (Go evaluates it up front; crossbeam moves
/// it only in the arm's own branch).
fn a_losing_send_value_is_still_owned_by_the_caller() {
    let (s, r) = bounded::<Vec<u8>>(1);
    s.send(vec![0]).unwrap(); // full
    let item = vec![1, 2, 3];
    let kept = select! {
        send(s, item) -> _ => panic!("full"),
        default => item,
    };
    assert_eq!(kept, [1, 2, 3]);

    let (s2, r2) = unbounded::<i32>();
    s2.send(9).unwrap();
    let item = vec![4];
    let kept = select_biased! {
        recv(r2) -> v => (v, item),
        send(s, item) -> _ => panic!("full"),
    };
    assert_eq!(kept, (Ok(9), vec![4]));
    assert_eq!(r.try_recv(), Ok(vec![0]));
}

/// The value of a send arm is evaluated exactly once even when the select
/// had to park before its arm was chosen (crossbeam evaluates it after the
/// selection, once), and the received value is exactly it.
fn a_parked_send_arms_value_is_evaluated_once() {
    let evals = Arc::new(AtomicUsize::new(0));
    let (s, r) = bounded::<usize>(0);
    let (_s_other, r_other) = bounded::<usize>(0);
    let e = evals.clone();
    let peer = go(move || {
        sleep(ms(50));
        r.recv().unwrap()
    });
    select! {
        send(s, e.fetch_add(1, Ordering::SeqCst) + 100) -> res => assert_eq!(res, Ok(())),
        recv(r_other) -> _ => panic!(),
    }
    assert_eq!(peer.join(), 100);
    assert_eq!(evals.load(Ordering::SeqCst), 1);
}

/// `default(timeout)`'s expression is evaluated even when an operation is
/// ready at once (crossbeam passes it to `select_timeout`), once.
fn the_timeout_expression_is_evaluated_once_even_when_an_arm_is_ready() {
    let calls = Cell::new(0);
    let t = |d| {
        calls.set(calls.get() + 1);
        d
    };
    let (s, r) = unbounded::<i32>();
    s.send(1).unwrap();
    select! {
        recv(r) -> v => assert_eq!(v, Ok(1)),
        default(t(ms(1000))) => panic!(),
    }
    assert_eq!(calls.get(), 1);
    select! {
        recv(r) -> _ => panic!(),
        default(t(Duration::ZERO)) => {}
    }
    assert_eq!(calls.get(), 2);
}

// ---------------------------------------------------------------------------
// Control flow.

fn break_continue_and_labels_in_bodies() {
    let (s, r) = unbounded::<i32>();
    for i in 0..10 {
        s.send(i).unwrap();
    }
    drop(s);
    let mut seen = Vec::new();
    loop {
        select! {
            recv(r) -> v => match v {
                Ok(x) if x % 2 == 0 => continue,
                Ok(x) => seen.push(x),
                Err(_) => break,
            },
        }
    }
    assert_eq!(seen, [1, 3, 5, 7, 9]);

    // A labeled break out of two loops, from inside an arm's body, with a
    // value.
    let (s, r) = unbounded::<i32>();
    for i in 0..5 {
        s.send(i).unwrap();
    }
    let found = 'outer: loop {
        for _ in 0..3 {
            select! {
                recv(r) -> v => {
                    if v == Ok(3) {
                        break 'outer v.unwrap() * 10;
                    }
                }
                default => break 'outer -1,
            }
        }
    };
    assert_eq!(found, 30);
    assert_eq!(r.try_recv(), Ok(4), "nothing past the break was taken");

    // `continue 'label` from a default body.
    let mut n = 0;
    'retry: for _ in 0..3 {
        select! {
            recv(r) -> _ => panic!("empty"),
            default => {
                n += 1;
                continue 'retry;
            }
        }
        unreachable!();
    }
    assert_eq!(n, 3);
}

fn first_even(r: &Receiver<i32>) -> Option<i32> {
    loop {
        select! {
            recv(r) -> v => match v {
                Ok(x) if x % 2 == 0 => return Some(x),
                Ok(_) => {}
                Err(_) => return None,
            },
        }
    }
}

fn sum_until_closed(r: &Receiver<i32>, s: &Sender<i32>) -> Result<i32, RecvError> {
    let mut sum = 0;
    loop {
        select! {
            recv(r) -> v => sum += v?,
            send(s, sum) -> res => res.map_err(|_| RecvError)?,
        }
        if sum >= 6 {
            return Ok(sum);
        }
    }
}

fn return_and_question_mark_in_bodies() {
    let (s, r) = unbounded::<i32>();
    for x in [1, 3, 4, 5] {
        s.send(x).unwrap();
    }
    assert_eq!(first_even(&r), Some(4));
    drop(s);
    assert_eq!(first_even(&r), None);
    assert!(r.try_recv().is_err(), "5 was consumed by the second call");

    // `?` on a receive error leaves the function.
    let (s, r) = unbounded::<i32>();
    let (out_s, _out_r) = bounded::<i32>(0); // never ready
    s.send(2).unwrap();
    drop(s);
    assert_eq!(sum_until_closed(&r, &out_s), Err(RecvError));
    let (s, r) = unbounded::<i32>();
    for x in [2, 4] {
        s.send(x).unwrap();
    }
    assert_eq!(sum_until_closed(&r, &out_s), Ok(6));
}

fn take_or_bail(s: &Sender<i32>, value: Result<i32, &'static str>) -> Result<(), &'static str> {
    select! {
        send(s, value?) -> res => res.map_err(|_| "closed"),
    }
}

/// A send value that leaves the `select!` (`break`, `return`, `?`) sends
/// nothing and gives its reservation back: the channel keeps its capacity
/// and a receiver it had reserved is served by the next send. (crossbeam
/// panics here: its `SelectedOperation`, already moved into the call, is
/// dropped without completing; fiber documents giving it back.)
fn a_send_value_that_leaves_the_select_sends_nothing() {
    // Ring channel: the reserved slot comes back.
    let (s, r) = bounded::<i32>(1);
    for _ in 0..3 {
        loop {
            select! {
                send(s, break) -> _ => panic!("nothing to send"),
            }
        }
        assert_eq!(take_or_bail(&s, Err("bail")), Err("bail"));
    }
    assert_eq!(s.try_send(5), Ok(()), "the slot was given back");
    assert_eq!(r.try_recv(), Ok(5));
    assert_eq!(r.try_recv(), Err(TryRecvError::Empty));

    // Rendezvous: a parked receiver reserved by the arm is not lost.
    let (s, r) = bounded::<i32>(0);
    let receiver = go(move || r.recv_timeout(ms(5000)));
    // Wait until the receiver parks (a send arm is then ready at once).
    assert!(eventually(ms(5000), || {
        let mut sel = Select::new();
        sel.send(&s);
        sel.try_ready().is_ok()
    }));
    assert_eq!(take_or_bail(&s, Err("bail")), Err("bail"));
    loop {
        select! { send(s, break) -> _ => unreachable!() }
    }
    s.send(7).unwrap();
    assert_eq!(receiver.join(), Ok(7));
}

/// `select!` inside closures: bodies capture, return from the closure, and
/// the closure may be called many times.
fn select_inside_closures() {
    let (s, r) = unbounded::<String>();
    let mut log = Vec::new();
    let mut pump = |text: &str| -> Option<usize> {
        s.send(text.to_string()).unwrap();
        select! {
            recv(r) -> v => {
                let v = v.ok()?;
                log.push(v.clone());
                Some(v.len())
            }
        }
    };
    assert_eq!(pump("ab"), Some(2));
    assert_eq!(pump("abc"), Some(3));
    assert_eq!(log, ["ab", "abc"]);
    let f = move || select! { recv(never::<u8>()) -> _ => 0, default(ms(1)) => 1 };
    assert_eq!(f() + f(), 2);
}

// ---------------------------------------------------------------------------
// Patterns, moves, drop timing.

struct Flag(Arc<AtomicUsize>);

impl Drop for Flag {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn patterns_and_moves_of_received_values() {
    let (s, r) = unbounded::<(String, Vec<u8>)>();
    s.send(("a".into(), vec![1])).unwrap();
    s.send(("b".into(), vec![2])).unwrap();
    // A `mut` binding, reassigned in the body.
    let first = select! {
        recv(r) -> mut v => {
            if let Ok((name, _)) = &mut v {
                name.push('!');
            }
            v
        }
    };
    assert_eq!(first, Ok(("a!".to_string(), vec![1])));
    // The received value moved out of the arm into an outer variable.
    let mut outer = None;
    select! {
        recv(r) -> v => outer = Some(v.unwrap().1),
    }
    assert_eq!(outer, Some(vec![2]));
    // A parenthesized pattern and a send result bound by `ref`.
    let (s2, r2) = bounded::<String>(0);
    drop(r2);
    select! {
        send(s2, "x".to_string()) -> ref res => assert_eq!(res.as_ref().unwrap_err().0, "x"),
    }
    select! {
        send(s2, "y".to_string()) -> res @ Err(_) | res @ Ok(()) => assert_eq!(res, Err(SendError("y".to_string()))),
    }
}

/// `recv(r) -> _`: the value is not bound; crossbeam (`let _ = _res;`
/// after binding it to a local) drops it after the body has run. Drops
/// happen once, whatever the pattern.
fn a_value_matched_by_underscore_is_dropped_after_the_body_once() {
    let drops = Arc::new(AtomicUsize::new(0));
    let (s, r) = unbounded::<Flag>();
    s.send(Flag(drops.clone())).unwrap();
    let d = drops.clone();
    select! {
        recv(r) -> _ => assert_eq!(d.load(Ordering::SeqCst), 0, "dropped before the body"),
    }
    assert_eq!(drops.load(Ordering::SeqCst), 1);
    s.send(Flag(drops.clone())).unwrap();
    let kept = select! { recv(r) -> v => v.unwrap() };
    assert_eq!(drops.load(Ordering::SeqCst), 1);
    drop(kept);
    assert_eq!(drops.load(Ordering::SeqCst), 2);
    // A value sent by a send arm is dropped by the receiver only.
    let (s, r) = bounded::<Flag>(1);
    select! { send(s, Flag(drops.clone())) -> res => assert!(res.is_ok()) }
    assert_eq!(drops.load(Ordering::SeqCst), 2);
    drop(r);
    assert_eq!(drops.load(Ordering::SeqCst), 3);
}

// ---------------------------------------------------------------------------
// Hygiene: user names like the macro's internals.

#[allow(non_snake_case, clippy::just_underscores_and_digits)]
fn user_names_like_the_macros_internals() {
    let (s, r) = unbounded::<i32>();
    let __select = r.clone();
    let __chosen = s.clone();
    let __index = 40;
    let __res = 2;
    let __h = 1;
    let __i = 10;
    let __o = 100;
    let sel = 3;
    let oper = 4;
    let _oper = 5;
    let i = 6;
    let _sel = 7;
    let _r = 8;
    let _s = 9;
    let _res = 11;
    let _oper0 = 12;
    let _LEN = 13;
    let _IS_BIASED = 14;
    let _handle = 15;
    let got = select! {
        send(__chosen, __index + __res) -> res => {
            res.unwrap();
            __h + __i + __o
        }
        recv(__select) -> _ => unreachable!("empty before the send"),
    };
    assert_eq!(got, 111);
    let got = select! {
        recv(__select) -> __res => __res.unwrap() + sel + oper + _oper + i,
        default(Duration::from_millis(__i as u64)) => -1,
    };
    assert_eq!(got, 42 + 3 + 4 + 5 + 6);
    let got = select_biased! {
        send(__chosen, _sel + _r + _s) -> __chosen => { __chosen.unwrap(); _res + _oper0 + _LEN + _IS_BIASED + _handle }
    };
    assert_eq!(got, 11 + 12 + 13 + 14 + 15);
    assert_eq!(r.try_recv(), Ok(24));
}

// ---------------------------------------------------------------------------
// Nesting.

/// `select!` inside a send arm's value (evaluated while the outer select
/// holds its reservation), inside a body, and inside a default's timeout.
fn nested_selects_in_values_bodies_and_timeouts() {
    let (s, r) = bounded::<i32>(1);
    let (s2, r2) = unbounded::<i32>();
    s2.send(5).unwrap();
    select! {
        send(s, select! { recv(r2) -> v => v.unwrap() * 2 }) -> res => res.unwrap(),
    }
    assert_eq!(r.try_recv(), Ok(10));

    // Inner select on the very channel whose slot the outer one reserved:
    // it sees the channel full (the slot is taken by the reservation).
    select! {
        send(s, select! {
            send(s, 1) -> _ => panic!("the only slot is reserved"),
            default => 2,
        }) -> res => res.unwrap(),
    }
    assert_eq!(r.try_recv(), Ok(2));
    assert_eq!(r.try_recv(), Err(TryRecvError::Empty));

    s2.send(3).unwrap();
    let t = select! {
        default(select! { recv(r2) -> v => ms(v.unwrap() as u64) }) => 1,
    };
    assert_eq!(t, 1);
}

// ---------------------------------------------------------------------------
// One channel in several arms.

/// Two receive arms on one channel: each value is taken once, and a
/// parked select with both arms queued takes one value per select, leaving
/// no stale node that would swallow the next value.
fn two_receive_arms_on_one_channel() {
    let (s, r) = bounded::<i32>(0);
    let peer = go(move || {
        for i in 0..20 {
            s.send(i).unwrap();
        }
    });
    let mut got = Vec::new();
    let mut arms = [0; 2];
    for _ in 0..20 {
        select! {
            recv(r) -> v => { arms[0] += 1; got.push(v.unwrap()); }
            recv(r) -> v => { arms[1] += 1; got.push(v.unwrap()); }
        }
    }
    peer.join();
    assert_eq!(arms[0] + arms[1], 20);
    assert_eq!(got, (0..20).collect::<Vec<_>>());
    assert_eq!(r.try_recv(), Err(TryRecvError::Disconnected));
}

/// Two send arms on one rendezvous channel and one receiver: exactly one
/// value is sent per select.
fn two_send_arms_on_one_rendezvous_channel_send_once() {
    for _ in 0..20 {
        let (s, r) = bounded::<i32>(0);
        let r2 = r.clone();
        let peer = go(move || {
            let v = r2.recv().unwrap();
            // Any second value would be there by now or never.
            (v, r2.recv_timeout(ms(30)))
        });
        let which = select! {
            send(s, 1) -> res => { res.unwrap(); 1 }
            send(s, 2) -> res => { res.unwrap(); 2 }
        };
        let (v, second) = peer.join();
        assert_eq!(v, which);
        assert_eq!(second, Err(RecvTimeoutError::Timeout));
        drop(r);
    }
}

/// Send and receive arms on one rendezvous channel never pair with each
/// other; a blocking such select is completed by a plain peer on either
/// side.
fn send_and_recv_arms_on_one_rendezvous_channel_wait_for_a_peer() {
    for round in 0..6 {
        let (s, r) = bounded::<i32>(0);
        let (s2, r2) = (s.clone(), r.clone());
        let peer = go(move || {
            sleep(ms(10));
            if round % 2 == 0 {
                r2.recv().map(|v| ("peer received", v))
            } else {
                s2.send(-1).map(|()| ("peer sent", -1)).map_err(|_| RecvError)
            }
        });
        let mine = select! {
            send(s, round) -> res => { res.unwrap(); ("select sent", round) }
            recv(r) -> v => ("select received", v.unwrap()),
        };
        let theirs = peer.join().unwrap();
        if round % 2 == 0 {
            assert_eq!((mine, theirs), (("select sent", round), ("peer received", round)));
        } else {
            assert_eq!((mine, theirs), (("select received", -1), ("peer sent", -1)));
        }
    }
}

// ---------------------------------------------------------------------------
// Many arms.

/// 36 arms with expression bodies (crossbeam allows at most 32 arms; a
/// block body followed by a comma costs more macro recursion: 28 of those
/// fit the default recursion limit, in crossbeam too).
fn thirty_six_expression_arms() {
    let chans: Vec<_> = (0..36).map(|_| bounded::<usize>(0)).collect();
    let rs: Vec<Receiver<usize>> = chans.iter().map(|c| c.1.clone()).collect();
    let senders: Vec<Sender<usize>> = chans.iter().map(|c| c.0.clone()).collect();
    drop(chans);
    for target in [35usize, 0, 17] {
        let s = senders[target].clone();
        let peer = go(move || {
            sleep(ms(10));
            s.send(target * 3).unwrap();
        });
        let mut got = None;
        select! {
            recv(rs[0]) -> v => got = Some((0, v)),
            recv(rs[1]) -> v => got = Some((1, v)),
            recv(rs[2]) -> v => got = Some((2, v)),
            recv(rs[3]) -> v => got = Some((3, v)),
            recv(rs[4]) -> v => got = Some((4, v)),
            recv(rs[5]) -> v => got = Some((5, v)),
            recv(rs[6]) -> v => got = Some((6, v)),
            recv(rs[7]) -> v => got = Some((7, v)),
            recv(rs[8]) -> v => got = Some((8, v)),
            recv(rs[9]) -> v => got = Some((9, v)),
            recv(rs[10]) -> v => got = Some((10, v)),
            recv(rs[11]) -> v => got = Some((11, v)),
            recv(rs[12]) -> v => got = Some((12, v)),
            recv(rs[13]) -> v => got = Some((13, v)),
            recv(rs[14]) -> v => got = Some((14, v)),
            recv(rs[15]) -> v => got = Some((15, v)),
            recv(rs[16]) -> v => got = Some((16, v)),
            recv(rs[17]) -> v => got = Some((17, v)),
            recv(rs[18]) -> v => got = Some((18, v)),
            recv(rs[19]) -> v => got = Some((19, v)),
            recv(rs[20]) -> v => got = Some((20, v)),
            recv(rs[21]) -> v => got = Some((21, v)),
            recv(rs[22]) -> v => got = Some((22, v)),
            recv(rs[23]) -> v => got = Some((23, v)),
            recv(rs[24]) -> v => got = Some((24, v)),
            recv(rs[25]) -> v => got = Some((25, v)),
            recv(rs[26]) -> v => got = Some((26, v)),
            recv(rs[27]) -> v => got = Some((27, v)),
            recv(rs[28]) -> v => got = Some((28, v)),
            recv(rs[29]) -> v => got = Some((29, v)),
            recv(rs[30]) -> v => got = Some((30, v)),
            recv(rs[31]) -> v => got = Some((31, v)),
            recv(rs[32]) -> v => got = Some((32, v)),
            recv(rs[33]) -> v => got = Some((33, v)),
            recv(rs[34]) -> v => got = Some((34, v)),
            recv(rs[35]) -> v => got = Some((35, v)),
        }
        peer.join();
        assert_eq!(got, Some((target, Ok(target * 3))));
    }
}

/// 28 arms written `=> { .. },` (the rustfmt style) compile and work.
fn twenty_eight_block_arms() {
    let chans: Vec<_> = (0..28).map(|_| unbounded::<usize>()).collect();
    let rs: Vec<Receiver<usize>> = chans.iter().map(|c| c.1.clone()).collect();
    chans[27].0.send(1).unwrap();
    chans[3].0.send(2).unwrap();
    let mut got = Vec::new();
    for _ in 0..2 {
        select_biased! {
            recv(rs[0]) -> v => { got.push((0, v)); },
            recv(rs[1]) -> v => { got.push((1, v)); },
            recv(rs[2]) -> v => { got.push((2, v)); },
            recv(rs[3]) -> v => { got.push((3, v)); },
            recv(rs[4]) -> v => { got.push((4, v)); },
            recv(rs[5]) -> v => { got.push((5, v)); },
            recv(rs[6]) -> v => { got.push((6, v)); },
            recv(rs[7]) -> v => { got.push((7, v)); },
            recv(rs[8]) -> v => { got.push((8, v)); },
            recv(rs[9]) -> v => { got.push((9, v)); },
            recv(rs[10]) -> v => { got.push((10, v)); },
            recv(rs[11]) -> v => { got.push((11, v)); },
            recv(rs[12]) -> v => { got.push((12, v)); },
            recv(rs[13]) -> v => { got.push((13, v)); },
            recv(rs[14]) -> v => { got.push((14, v)); },
            recv(rs[15]) -> v => { got.push((15, v)); },
            recv(rs[16]) -> v => { got.push((16, v)); },
            recv(rs[17]) -> v => { got.push((17, v)); },
            recv(rs[18]) -> v => { got.push((18, v)); },
            recv(rs[19]) -> v => { got.push((19, v)); },
            recv(rs[20]) -> v => { got.push((20, v)); },
            recv(rs[21]) -> v => { got.push((21, v)); },
            recv(rs[22]) -> v => { got.push((22, v)); },
            recv(rs[23]) -> v => { got.push((23, v)); },
            recv(rs[24]) -> v => { got.push((24, v)); },
            recv(rs[25]) -> v => { got.push((25, v)); },
            recv(rs[26]) -> v => { got.push((26, v)); },
            recv(rs[27]) -> v => { got.push((27, v)); },
        }
    }
    assert_eq!(got, [(3, Ok(2)), (27, Ok(1))]);
}

/// A dynamic `Select` of 64 operations (past the inline 8): every ready
/// one is picked sometimes; a parked one is completed by the right peer;
/// the same channel 40 times takes one value per select.
fn a_select_of_64_operations() {
    let chans: Vec<_> = (0..64).map(|_| unbounded::<usize>()).collect();
    for (i, (s, _)) in chans.iter().enumerate() {
        for _ in 0..40 {
            s.send(i).unwrap();
        }
    }
    let mut sel = Select::new();
    for (_, r) in &chans {
        sel.recv(r);
    }
    let mut hits = [0usize; 64];
    for _ in 0..64 * 20 {
        let op = sel.select();
        let i = op.index();
        assert_eq!(op.recv(&chans[i].1), Ok(i));
        hits[i] += 1;
    }
    assert!(hits.iter().all(|&h| h > 0), "some operation was never picked: {hits:?}");
    drop(sel);

    let (s, r) = bounded::<i32>(0);
    let mut sel = Select::new();
    for _ in 0..40 {
        sel.recv(&r);
    }
    let peer = go(move || {
        for v in 0..3 {
            sleep(ms(5));
            s.send(v).unwrap();
        }
    });
    for v in 0..3 {
        let op = sel.select();
        let i = op.index();
        assert_eq!(op.recv(&r), Ok(v));
        assert!(i < 40);
    }
    peer.join();
    let op = sel.select();
    let i = op.index();
    assert_eq!(op.recv(&r), Err(RecvError));
    assert!(i < 40);
}

// ---------------------------------------------------------------------------
// default arms.

fn default_with_zero_and_max_timeouts() {
    // ZERO: a poll.
    let (s, r) = unbounded::<i32>();
    let start = Instant::now();
    select! {
        recv(r) -> _ => panic!(),
        default(Duration::ZERO) => {}
    }
    assert!(start.elapsed() < ms(500));
    s.send(1).unwrap();
    select! {
        recv(r) -> v => assert_eq!(v, Ok(1)),
        default(Duration::ZERO) => panic!("ready"),
    }
    // MAX: waits like a select without default (crossbeam: `select_timeout`
    // with an overflowing deadline is a blocking `select`).
    let peer = go(move || {
        sleep(ms(30));
        s.send(2).unwrap();
    });
    select! {
        recv(r) -> v => assert_eq!(v, Ok(2)),
        default(Duration::MAX) => panic!("MAX never times out"),
    }
    peer.join();
    select! {
        recv(r) -> v => assert_eq!(v, Err(RecvError)),
        default(Duration::MAX) => panic!(),
    }
    // A timeout just short of overflowing `Instant` behaves the same.
    let (s, r) = unbounded::<i32>();
    let peer = go(move || {
        sleep(ms(30));
        s.send(3).unwrap();
    });
    select! {
        recv(r) -> v => assert_eq!(v, Ok(3)),
        default(Duration::from_secs(u64::MAX / 4)) => panic!(),
    }
    peer.join();
}

/// `never()` arms never fire; a disconnected receiver is always ready.
fn never_and_disconnected_arms() {
    let start = Instant::now();
    select! {
        recv(never::<i32>()) -> _ => panic!(),
        recv(never::<String>()) -> _ => panic!(),
        default(ms(30)) => {}
    }
    assert!(start.elapsed() >= ms(30));
    let (_, r) = unbounded::<i32>();
    for _ in 0..50 {
        select! {
            recv(never::<i32>()) -> _ => panic!(),
            recv(r) -> v => assert_eq!(v, Err(RecvError)),
            recv(never::<i32>()) -> _ => panic!(),
        }
    }
    select_biased! {
        recv(never::<i32>()) -> _ => panic!(),
        recv(r) -> v => assert_eq!(v, Err(RecvError)),
    }
    // A never arm next to a timer arm: the timer fires.
    let at = select! {
        recv(never::<i32>()) -> _ => panic!(),
        recv(after(ms(10))) -> v => v.unwrap(),
    };
    assert!(at <= Instant::now());
}

/// crossbeam: `select! {}` is a compile error ("empty `select!` block");
/// fiber's compiles and panics at run time.
fn an_empty_select_panics() {
    let text = must_panic(|| select! {});
    assert!(text.contains("no operations"), "{text}");
    // A select of only a default runs it.
    let ran = select! { default => 1 };
    assert_eq!(ran, 1);
}

// ---------------------------------------------------------------------------
// Select: remove, timeouts, deadlines, readiness.

fn select_remove_rules() {
    let (s1, r1) = unbounded::<i32>();
    let (_, r2) = unbounded::<i32>();
    let mut sel = Select::new();
    let o1 = sel.recv(&r1);
    let o2 = sel.recv(&r2);
    // crossbeam's `remove` example: the disconnected one is selected first.
    let op = sel.select();
    assert_eq!(op.index(), o2);
    assert!(op.recv(&r2).is_err());
    sel.remove(o2);
    s1.send(10).unwrap();
    let op = sel.select();
    assert_eq!(op.index(), o1);
    assert_eq!(op.recv(&r1), Ok(10));
    // Indices of removed operations are not reused.
    let o3 = sel.recv(&r2);
    assert_eq!(o3, 2);
    // Removing twice, or an index never handed out, panics.
    let text = must_panic(|| sel.remove(o2));
    assert!(text.contains("no operation"), "{text}");
    let text = must_panic(|| sel.remove(99));
    assert!(!text.is_empty());
    // The select is still usable after those panics.
    let op = sel.select();
    assert_eq!(op.index(), o3);
    assert!(op.recv(&r2).is_err());
    // A clone keeps the removed slots (same indices).
    let mut copy = sel.clone();
    copy.remove(o3);
    s1.send(11).unwrap();
    let op = copy.select();
    assert_eq!(op.index(), o1);
    assert_eq!(op.recv(&r1), Ok(11));
    // Every operation removed: `select` panics (crossbeam: "no operations
    // have been added"), `try_select` fails, `select_timeout` waits for its
    // timeout and fails.
    copy.remove(o1);
    let text = must_panic(|| {
        let _ = copy.select();
    });
    assert!(text.contains("no operations"), "{text}");
    assert!(copy.try_select().is_err());
    assert!(copy.try_ready().is_err());
    let start = Instant::now();
    assert!(copy.select_timeout(ms(30)).is_err());
    assert!(start.elapsed() >= ms(30));
    let start = Instant::now();
    assert!(copy.ready_timeout(ms(30)).is_err());
    assert!(start.elapsed() >= ms(30));
}

fn select_timeouts_and_deadlines() {
    let (s, r) = unbounded::<i32>();
    let mut sel = Select::new();
    let i = sel.recv(&r);
    // Past deadline, nothing ready: fails without waiting.
    let start = Instant::now();
    assert!(sel.select_deadline(Instant::now() - ms(100)).is_err());
    assert!(sel.select_timeout(Duration::ZERO).is_err());
    assert!(sel.ready_deadline(Instant::now() - ms(100)).is_err());
    assert!(start.elapsed() < ms(500));
    // Past deadline, something ready: it is taken (crossbeam tries first).
    s.send(1).unwrap();
    let op = sel.select_deadline(Instant::now() - ms(100)).unwrap();
    assert_eq!(op.index(), i);
    assert_eq!(op.recv(&r), Ok(1));
    s.send(2).unwrap();
    assert_eq!(sel.ready_deadline(Instant::now() - ms(100)), Ok(i));
    assert_eq!(sel.try_ready(), Ok(i));
    assert_eq!(sel.ready_timeout(Duration::ZERO), Ok(i));
    // Readiness consumes nothing.
    assert_eq!(r.try_recv(), Ok(2));
    // A deadline in the future: a peer's send completes it.
    let peer = go(move || {
        sleep(ms(20));
        s.send(3).unwrap();
    });
    assert_eq!(sel.ready_deadline(Instant::now() + ms(5000)), Ok(i));
    let op = sel.select_timeout(ms(5000)).unwrap();
    assert_eq!(op.recv(&r), Ok(3));
    peer.join();
    // MAX: waits; a disconnected channel is ready.
    let op = sel.select_timeout(Duration::MAX).unwrap();
    assert_eq!(op.recv(&r), Err(RecvError));
    assert_eq!(sel.ready_timeout(Duration::MAX), Ok(i));
}

/// A timer arm is ready once due; readiness does not consume the tick.
fn readiness_of_timer_arms() {
    let t = tick(ms(10));
    let a = after(ms(10));
    let mut sel = Select::new();
    let it = sel.recv(&t);
    let ia = sel.recv(&a);
    assert!(sel.try_ready().is_err());
    let i = sel.ready_deadline(Instant::now() + ms(5000)).unwrap();
    assert!(i == it || i == ia);
    assert_eq!(sel.try_ready().map(|i| i == it || i == ia), Ok(true));
    assert!(t.try_recv().is_ok());
    assert!(a.recv_timeout(ms(5000)).is_ok());
    assert!(a.try_recv().is_err());
}

// ---------------------------------------------------------------------------
// SelectedOperation misuse.

/// crossbeam: "dropped `SelectedOperation` without completing the
/// operation". The select and the channels stay usable; a send
/// reservation of a parked receiver is given back, not lost.
fn an_uncompleted_selected_operation_panics_and_gives_back() {
    let (s, r) = bounded::<i32>(0);
    let receiver = go(move || r.recv_timeout(ms(5000)));
    let mut sel = Select::new();
    let i = sel.send(&s);
    let text = must_panic(|| {
        let op = sel.select();
        assert_eq!(op.index(), i);
    });
    assert_eq!(text, "dropped `SelectedOperation` without completing the operation");
    let op = sel.select();
    assert_eq!(op.send(&s, 42), Ok(()));
    assert_eq!(receiver.join(), Ok(42));

    // A received value held by the dropped operation is dropped once.
    let drops = Arc::new(AtomicUsize::new(0));
    let (s, r) = unbounded::<Flag>();
    s.send(Flag(drops.clone())).unwrap();
    s.send(Flag(drops.clone())).unwrap();
    let mut sel = Select::new();
    sel.recv(&r);
    let text = must_panic(|| {
        let _op = sel.select();
    });
    assert!(text.contains("without completing"), "{text}");
    assert_eq!(drops.load(Ordering::SeqCst), 1);
    assert_eq!(r.len(), 1);
    let op = sel.select();
    drop(op.recv(&r).unwrap());
    assert_eq!(drops.load(Ordering::SeqCst), 2);
}

/// crossbeam: completing with a handle other than the selected one
/// panics ("passed a receiver/sender that wasn't selected"). Here: the
/// wrong channel, the wrong direction, or a `never()`.
fn completing_with_the_wrong_handle_panics() {
    let (s1, r1) = unbounded::<i32>();
    let (s2, r2) = unbounded::<i32>();
    for v in 1..=3 {
        s1.send(v).unwrap();
    }
    let mut sel = Select::new();
    sel.recv(&r1);
    let text = must_panic(|| {
        let op = sel.select();
        let _ = op.recv(&r2);
    });
    assert!(text.contains("not the one"), "{text}");
    let text = must_panic(|| {
        let op = sel.select();
        let _ = op.send(&s1, 5);
    });
    assert!(text.contains("not the one"), "{text}");
    let text = must_panic(|| {
        let op = sel.select();
        let _ = op.recv(&never::<i32>());
    });
    assert!(text.contains("not the one"), "{text}");
    assert_eq!(
        r1.try_recv(),
        Err(TryRecvError::Empty),
        "each panic dropped the value it held"
    );
    drop(sel);
    // A send selected, completed through a receiver: panics, the slot is
    // given back.
    let (s3, r3) = bounded::<i32>(1);
    let mut sel = Select::new();
    sel.send(&s3);
    let text = must_panic(|| {
        let op = sel.select();
        let _ = op.recv(&r3);
    });
    assert!(text.contains("not the one"), "{text}");
    drop(sel);
    assert_eq!(s3.try_send(9), Ok(()));
    assert_eq!(r3.try_recv(), Ok(9));
    drop((s2, r2));
}

// ---------------------------------------------------------------------------
// Polling receives against a select parked on a send arm.

/// A select parked on a rendezvous send arm is a ready sender (crossbeam
/// counts its operation as a waiting sender, and a receive that selects it
/// waits for the value). A receive polled with a zero timeout, or a
/// `select!` polled with `default(Duration::ZERO)` / `select_timeout(0)`,
/// must eventually take the value, as `try_recv` does (spec/chan.md
/// covers `try_recv` and `default`).
fn polling_with_zero_timeouts_takes_the_value_of_a_parked_send_arm(kind: u8) {
    let (s, r) = bounded::<i32>(0);
    let (_keep, other) = bounded::<i32>(0);
    let sender = go(move || {
        select! {
            send(s, 5) -> res => res.is_ok(),
            recv(other) -> _ => false,
        }
    });
    sleep(ms(20)); // let the select park (the assertion holds either way)
    let end = Instant::now() + ms(3000);
    let mut got = None;
    while Instant::now() < end && got.is_none() {
        got = match kind {
            0 => r.recv_timeout(Duration::ZERO).ok(),
            1 => r.recv_deadline(Instant::now()).ok(),
            4 => r.recv_timeout(ms(1)).ok(),
            2 => select! { recv(r) -> v => v.ok(), default(Duration::ZERO) => None },
            _ => {
                let mut sel = Select::new();
                sel.recv(&r);
                let got = match sel.select_timeout(Duration::ZERO) {
                    Ok(op) => op.recv(&r).ok(),
                    Err(_) => None,
                };
                got
            }
        };
        relax();
    }
    assert_eq!(got, Some(5), "the parked send arm's value was never taken");
    assert!(sender.join());
}

fn polling_recv_timeout_zero() {
    polling_with_zero_timeouts_takes_the_value_of_a_parked_send_arm(0)
}
fn polling_recv_deadline_now() {
    polling_with_zero_timeouts_takes_the_value_of_a_parked_send_arm(1)
}
fn polling_recv_timeout_one_ms() {
    polling_with_zero_timeouts_takes_the_value_of_a_parked_send_arm(4)
}
fn polling_select_default_zero() {
    polling_with_zero_timeouts_takes_the_value_of_a_parked_send_arm(2)
}
fn polling_select_timeout_zero() {
    polling_with_zero_timeouts_takes_the_value_of_a_parked_send_arm(3)
}

/// A receiver with a timeout reserved by a send arm whose value
/// expression then leaves without a value: the receiver is released and
/// times out (or gets a later value); it does not hang.
fn a_receiver_reserved_by_an_abandoned_send_arm_still_times_out() {
    let (s, r) = bounded::<i32>(0);
    let receiver = go(move || {
        let start = Instant::now();
        (r.recv_timeout(ms(100)), start.elapsed())
    });
    assert!(eventually(ms(5000), || {
        let mut sel = Select::new();
        sel.send(&s);
        sel.try_ready().is_ok()
    }));
    loop {
        select! {
            send(s, {
                // Hold the reservation past the receiver's timeout.
                sleep(ms(200));
                break;
            }) -> _ => unreachable!(),
            default => break,
        }
    }
    let (res, waited) = receiver.join();
    // Either the receiver had timed out before the arm reserved it (then the
    // default ran... or the loop broke anyway), or it was reserved and then
    // released: a timeout either way, not a value and not a hang.
    assert_eq!(res, Err(RecvTimeoutError::Timeout));
    assert!(waited >= ms(100));
}

// ---------------------------------------------------------------------------
// select_macro.rs forms not ported elsewhere: case_blocks, deref,
// infer_types, parse_nesting, nesting, preflight1..3.

#[allow(clippy::match_single_binding, clippy::unused_unit)]
fn case_blocks_and_expression_bodies() {
    let (s, r) = unbounded::<i32>();
    let x: f64 = select! {
        recv(r) -> _ => 3.0,
        recv(r) -> _ => loop {
            unreachable!()
        },
        recv(r) -> _ => match 7 + 3 {
            _ => unreachable!()
        },
        default => 7.
    };
    assert_eq!(x, 7.0);
    select! {
        recv(r) -> msg => if msg.is_ok() {
            unreachable!()
        },
        default => ()
    }
    drop(s);
}

/// crossbeam's `deref`: operands that deref to a `Sender` / `Receiver`.
fn operands_that_deref_to_handles() {
    struct S<T>(Sender<T>);
    struct R<T>(Receiver<T>);
    impl<T> std::ops::Deref for S<T> {
        type Target = Sender<T>;
        fn deref(&self) -> &Sender<T> {
            &self.0
        }
    }
    impl<T> std::ops::Deref for R<T> {
        type Target = Receiver<T>;
        fn deref(&self) -> &Receiver<T> {
            &self.0
        }
    }
    let (s, r) = bounded::<i32>(0);
    let (s, r) = (S(s), R(r));
    select! {
        send(s, 0) -> _ => panic!(),
        recv(r) -> _ => panic!(),
        default => {}
    }
    let (s2, r2) = bounded::<i32>(1);
    let (s2, r2) = (S(s2), R(r2));
    select! { send(s2, 4) -> res => res.unwrap() }
    select! { recv(r2) -> v => assert_eq!(v, Ok(4)) }
}

fn inferred_element_types() {
    let (s, r) = unbounded();
    select! {
        recv(r) -> _ => {}
        default => {}
    }
    s.send(()).unwrap();
    let (s, r) = unbounded();
    select! { send(s, ()) -> _ => {} }
    r.recv().unwrap();
}

fn nesting_with_the_macro() {
    let (s, r) = unbounded::<i32>();
    select! {
        send(s, 0) -> _ => {
            select! {
                recv(r) -> v => {
                    assert_eq!(v, Ok(0));
                    select! {
                        send(s, 1) -> _ => {
                            select! {
                                recv(r) -> v => assert_eq!(v, Ok(1)),
                            }
                        }
                    }
                }
            }
        }
    }
    let (_, r) = unbounded::<i32>();
    select! {
        recv(r) -> _ => {}
        recv(r) -> _ => {
            select! {
                recv(r) -> _ => {}
                recv(r) -> _ => {
                    select! { default => {} }
                }
            }
        }
    }
}

fn preflight_with_the_macro() {
    let (s, r) = unbounded();
    s.send(()).unwrap();
    select! { recv(r) -> _ => {} }

    let (s, r) = unbounded();
    drop(s.clone());
    s.send(()).unwrap();
    drop(s);
    select! { recv(r) -> v => assert!(v.is_ok()) }
    assert_eq!(r.try_recv(), Err(TryRecvError::Disconnected));

    let (s, r) = unbounded();
    drop(s.clone());
    s.send(()).unwrap();
    drop(s);
    r.recv().unwrap();
    select! { recv(r) -> v => assert!(v.is_err()) }
}

// ---------------------------------------------------------------------------
// Losers never consume, also while a body parks.

/// A select whose body parks (sleeps) after taking one arm: its other
/// arm's node must be gone, so a peer's timed send on that arm either
/// reaches a later select or times out; no value is lost.
fn a_parking_body_leaves_no_node_that_swallows_values() {
    let (s1, r1) = bounded::<i32>(0);
    let (s2, r2) = bounded::<i32>(0);
    let (done_s, done_r) = bounded::<()>(0);
    let peer = go(move || {
        let mut sent = Vec::new();
        for v in 0..40 {
            if s2.send_timeout(v, ms(3)).is_ok() {
                sent.push(v);
            }
        }
        drop(s2);
        done_r.recv().unwrap();
        sent
    });
    let ticker = go(move || {
        for _ in 0..10 {
            if s1.send(0).is_err() {
                break;
            }
            sleep(ms(2));
        }
    });
    let mut got = Vec::new();
    let mut r1_open = true;
    let nothing = never::<i32>();
    loop {
        select! {
            recv(if r1_open { &r1 } else { &nothing }) -> v => {
                if v.is_err() {
                    r1_open = false;
                } else {
                    sleep(ms(5)); // park inside the body
                }
            }
            recv(r2) -> v => match v {
                Ok(v) => got.push(v),
                Err(_) => break,
            },
        }
    }
    done_s.send(()).unwrap();
    // The loop ends when the peer is done, which can be before the ticker
    // is: its next send on the rendezvous channel must fail, not wait for
    // a receiver that stopped receiving (it hung the test about once in
    // 30 runs when the peer finished first).
    drop(r1);
    ticker.join();
    let sent = peer.join();
    assert_eq!(got, sent, "a value the peer sent was not received");
}

// ---------------------------------------------------------------------------
// Reservations held across a slow value; value layouts.

/// A receiving `select!` with `default(timeout)` reserved by a send arm
/// whose value takes longer than that timeout: crossbeam's selected
/// receiver waits for the packet; either way the outcome must agree on
/// both sides (the value is received iff the send reports `Ok`).
fn a_slow_send_value_and_a_timed_receiving_select_agree() {
    for _ in 0..3 {
        let (s, r) = bounded::<i32>(0);
        let receiver = go(move || {
            select! {
                recv(r) -> v => Some(v.unwrap()),
                default(ms(40)) => None,
            }
        });
        // Wait until the receiver parks, then send with a slow value.
        let parked = eventually(ms(5000), || {
            let mut sel = Select::new();
            sel.send(&s);
            sel.try_ready().is_ok()
        });
        let sent = select! {
            send(s, { sleep(ms(80)); 9 }) -> res => res.is_ok(),
            default => false,
        };
        let got = receiver.join();
        assert_eq!(
            got.is_some(),
            sent,
            "parked {parked}: received {got:?}, send reported ok = {sent}"
        );
        if sent {
            assert_eq!(got, Some(9));
        }
    }
}

#[derive(Debug, PartialEq)]
#[repr(align(64))]
struct OverAligned(u64);

#[derive(Debug, PartialEq)]
struct Big([u64; 12], String);

/// Values larger than the inline slot, over-aligned values and
/// zero-sized values go through every select path: ready, parked, a send
/// arm, and an uncompleted operation (dropped once).
fn unusual_layouts_through_select() {
    let (s, r) = bounded::<OverAligned>(0);
    let peer = go(move || {
        sleep(ms(5));
        s.send(OverAligned(7)).unwrap();
        s
    });
    let v = select! { recv(r) -> v => v.unwrap() };
    assert_eq!(v, OverAligned(7));
    assert_eq!(&v as *const OverAligned as usize % 64, 0);
    let s = peer.join();
    let peer = go(move || r.recv().unwrap());
    select! { send(s, OverAligned(8)) -> res => res.unwrap() }
    assert_eq!(peer.join(), OverAligned(8));

    let (s, r) = unbounded::<Big>();
    s.send(Big([1; 12], "a".into())).unwrap();
    s.send(Big([2; 12], "b".into())).unwrap();
    let mut sel = Select::new();
    sel.recv(&r);
    must_panic(|| {
        let _op = sel.select();
    });
    let op = sel.select();
    assert_eq!(op.recv(&r), Ok(Big([2; 12], "b".into())));
    drop(sel);
    let (s2, r2) = bounded::<Big>(1);
    select! {
        send(s2, Big([3; 12], "c".into())) -> res => res.unwrap(),
        recv(r) -> _ => panic!("empty"),
    }
    assert_eq!(r2.try_recv(), Ok(Big([3; 12], "c".into())));

    let (s, r) = bounded::<()>(0);
    let peer = go(move || {
        sleep(ms(5));
        s.send(()).unwrap();
    });
    select! { recv(r) -> v => assert_eq!(v, Ok(())) }
    peer.join();
    select! { recv(r) -> v => assert_eq!(v, Err(RecvError)) }
}

/// crossbeam checks that `SelectedOperation::recv` gets the very
/// `Receiver` that was added (it compares the handles' addresses: a clone
/// of it panics, "passed a receiver that wasn't selected"); fiber compares
/// channels, so a clone of the handle completes the operation. (Recorded,
/// not a defect: see the report's design questions.)
fn completing_with_a_clone_of_the_handle_is_accepted() {
    let (s, r) = unbounded::<i32>();
    s.send(1).unwrap();
    let clone = r.clone();
    let mut sel = Select::new();
    sel.recv(&r);
    let op = sel.select();
    assert_eq!(op.recv(&clone), Ok(1));
    let s2 = s.clone();
    let mut sel = Select::new();
    sel.send(&s);
    let op = sel.select();
    assert_eq!(op.send(&s2, 2), Ok(()));
    assert_eq!(r.try_recv(), Ok(2));
}

// ---------------------------------------------------------------------------
// Go: "a single one that can proceed is chosen via a uniform
// pseudo-random selection".

fn uniform_choice_among_the_ready_subset() {
    for (n, ready) in [
        (8usize, vec![6usize, 7]),
        (8, vec![0, 7]),
        (12, vec![3, 9, 11]),
        (3, vec![0, 1, 2]),
    ] {
        let chans: Vec<_> = (0..n).map(|_| unbounded::<()>()).collect();
        let rounds = 3000;
        for &i in &ready {
            for _ in 0..rounds {
                chans[i].0.send(()).unwrap();
            }
        }
        let mut sel = Select::new();
        for (_, r) in &chans {
            sel.recv(r);
        }
        let mut hits = vec![0usize; n];
        for _ in 0..rounds {
            let op = sel.select();
            let i = op.index();
            op.recv(&chans[i].1).unwrap();
            hits[i] += 1;
        }
        let fair = rounds / ready.len();
        for &i in &ready {
            assert!(
                hits[i] > fair * 3 / 4 && hits[i] < fair * 5 / 4,
                "n = {n}, ready {ready:?}: {hits:?}"
            );
        }
    }
}

/// A plain thread's `select!` and a fiber's meet over rendezvous
/// channels, in both directions.
fn a_thread_select_and_a_fiber_select_meet() {
    if in_fiber() {
        return; // the body below makes its own runtime
    }
    let rt = crate::common::rt2();
    for round in 0..10 {
        let (s, r) = bounded::<i32>(0);
        let (s2, r2) = (s.clone(), r.clone());
        let fiber_side = rt.spawn(move || {
            if round % 2 == 0 {
                select! { recv(r2) -> v => v.unwrap(), default(ms(5000)) => -1 }
            } else {
                select! { send(s2, round) -> res => { res.unwrap(); round }, default(ms(5000)) => -1 }
            }
        });
        let mine = if round % 2 == 0 {
            select! { send(s, round) -> res => { res.unwrap(); round } }
        } else {
            select! { recv(r) -> v => v.unwrap() }
        };
        assert_eq!(fiber_side.join().unwrap(), mine);
        assert_eq!(mine, round);
    }
}

port!(
    evaluation_order_and_counts,
    a_losing_send_value_is_still_owned_by_the_caller,
    a_parked_send_arms_value_is_evaluated_once,
    the_timeout_expression_is_evaluated_once_even_when_an_arm_is_ready,
    break_continue_and_labels_in_bodies,
    return_and_question_mark_in_bodies,
    a_send_value_that_leaves_the_select_sends_nothing,
    select_inside_closures,
    patterns_and_moves_of_received_values,
    a_value_matched_by_underscore_is_dropped_after_the_body_once,
    user_names_like_the_macros_internals,
    nested_selects_in_values_bodies_and_timeouts,
    two_receive_arms_on_one_channel,
    two_send_arms_on_one_rendezvous_channel_send_once,
    send_and_recv_arms_on_one_rendezvous_channel_wait_for_a_peer,
    thirty_six_expression_arms,
    twenty_eight_block_arms,
    a_select_of_64_operations,
    default_with_zero_and_max_timeouts,
    never_and_disconnected_arms,
    an_empty_select_panics,
    select_remove_rules,
    select_timeouts_and_deadlines,
    readiness_of_timer_arms,
    an_uncompleted_selected_operation_panics_and_gives_back,
    completing_with_the_wrong_handle_panics,
    polling_recv_timeout_one_ms,
    polling_select_default_zero,
    polling_select_timeout_zero,
    a_receiver_reserved_by_an_abandoned_send_arm_still_times_out,
    case_blocks_and_expression_bodies,
    operands_that_deref_to_handles,
    inferred_element_types,
    nesting_with_the_macro,
    preflight_with_the_macro,
    a_parking_body_leaves_no_node_that_swallows_values,
    a_slow_send_value_and_a_timed_receiving_select_agree,
    unusual_layouts_through_select,
    completing_with_a_clone_of_the_handle_is_accepted,
    uniform_choice_among_the_ready_subset,
    a_thread_select_and_a_fiber_select_meet,
);

/// `recv_timeout(ZERO)` / `recv_deadline(now)` polled against a select
/// parked on a rendezvous send arm: crossbeam takes the value on the first
/// call (its zero-capacity `recv` selects the waiting send operation and
/// waits for the packet); fiber's plain-thread receive gets it too, a
/// fiber's never does.
mod polling_recv_timeout_zero {
    #[test]
    fn threads() {
        crate::three_ways::run(crate::three_ways::Mode::Threads, super::polling_recv_timeout_zero)
    }
    // Was (before the fix): in a fiber a passed deadline skips publishing the receiver (fiber-core wait.rs:547), so the parked send arm is woken by every poll but never finds a receiver: the value is never taken
    #[test]
    fn fibers_1w() {
        crate::three_ways::run(crate::three_ways::Mode::Fibers1, super::polling_recv_timeout_zero)
    }
    // Was (before the fix): same as fibers_1w
    #[test]
    fn fibers_2w() {
        crate::three_ways::run(crate::three_ways::Mode::Fibers2, super::polling_recv_timeout_zero)
    }
}

mod polling_recv_deadline_now {
    #[test]
    fn threads() {
        crate::three_ways::run(crate::three_ways::Mode::Threads, super::polling_recv_deadline_now)
    }
    // Was (before the fix): as polling_recv_timeout_zero (a past deadline in a fiber never publishes the receiver)
    #[test]
    fn fibers_1w() {
        crate::three_ways::run(crate::three_ways::Mode::Fibers1, super::polling_recv_deadline_now)
    }
    // Was (before the fix): same as fibers_1w
    #[test]
    fn fibers_2w() {
        crate::three_ways::run(crate::three_ways::Mode::Fibers2, super::polling_recv_deadline_now)
    }
}
