//! crossbeam-channel's documented `select!` / `Select` idioms, ported as
//! written: they compile and behave alike, on threads and on both
//! schedulers.

mod common;
use common::{everywhere, go, until};
use fiber_chan::*;
use std::time::{Duration, Instant};

#[test]
fn receivers_made_in_the_arm() {
    everywhere(|| {
        let (_s, r) = unbounded::<i32>();
        let start = Instant::now();
        select! {
            recv(r) -> _ => panic!("nothing was sent"),
            recv(after(Duration::from_millis(10))) -> _ => {}
        }
        assert!(fiber_core::in_fiber() || start.elapsed() >= Duration::from_millis(10));
        let timeout: Option<Duration> = Some(Duration::from_millis(5));
        let fired = select! {
            recv(r) -> _ => false,
            recv(timeout.map(after).unwrap_or_else(never)) -> _ => true,
        };
        assert!(fired);
        let no_timeout: Option<Duration> = None;
        let got = select! {
            recv(r) -> _ => "msg",
            recv(no_timeout.map(after).unwrap_or_else(never)) -> _ => "timer",
            default(Duration::from_millis(5)) => "default",
        };
        assert_eq!(got, "default");
        select! {
            recv(never::<i32>()) -> _ => unreachable!(),
            default => {}
        }
    });
}

#[test]
fn an_arm_may_replace_the_receiver_it_used() {
    everywhere(|| {
        let (s1, mut r1) = unbounded::<i32>();
        let (s2, mut r2) = unbounded::<i32>();
        s1.send(1).unwrap();
        s2.send(2).unwrap();
        drop((s1, s2));
        let mut got = Vec::new();
        // Each channel is read until it disconnects, then replaced by never.
        while got.len() < 2 || !(r1.is_empty() && r2.is_empty()) {
            select! {
                recv(r1) -> m => match m {
                    Ok(v) => got.push(v),
                    Err(_) => r1 = never(),
                },
                recv(r2) -> m => match m {
                    Ok(v) => got.push(v),
                    Err(_) => r2 = never(),
                },
                default(Duration::from_millis(20)) => break,
            }
        }
        got.sort();
        assert_eq!(got, [1, 2]);
    });
}

// The first send arm's body panics, so in that branch (value and body run
// together, as crossbeam's) the increment is never read.
#[test]
#[allow(unused_assignments)]
fn send_values_are_evaluated_only_for_the_selected_arm() {
    everywhere(|| {
        let (s, r) = bounded::<i32>(0); // no receiver: the send is never ready
        let (s2, r2) = unbounded::<i32>();
        s2.send(9).unwrap();
        let mut queue = vec![1, 2, 3];
        let mut evaluated = 0;
        select! {
            send(s, { evaluated += 1; queue.pop().unwrap() }) -> _ => panic!("no receiver"),
            recv(r2) -> v => assert_eq!(v, Ok(9)),
        }
        assert_eq!(evaluated, 0, "the losing send arm's value was not evaluated");
        assert_eq!(queue, [1, 2, 3], "nothing popped for an arm that lost");
        drop(r);
        // The selected arm evaluates it once.
        let (s3, r3) = bounded::<i32>(1);
        select! {
            send(s3, { evaluated += 1; queue.pop().unwrap() }) -> res => res.unwrap(),
        }
        assert_eq!((evaluated, r3.recv()), (1, Ok(3)));
    });
}

#[test]
fn rendezvous_send_arm_meets_a_receiving_select() {
    everywhere(|| {
        for _ in 0..50 {
            let (s, r) = bounded::<u32>(0);
            let (_keep, idle) = bounded::<u32>(0);
            let receiver = go(move || {
                select! {
                    recv(r) -> v => v,
                    recv(idle) -> _ => unreachable!(),
                }
            });
            let (_keep2, idle2) = bounded::<u32>(0);
            select! {
                send(s, 11) -> res => res.unwrap(),
                recv(idle2) -> _ => unreachable!(),
            }
            assert_eq!(receiver.join(), Ok(11));
        }
    });
}

#[test]
fn select_biased_prefers_the_first_ready_arm() {
    everywhere(|| {
        let (s1, r1) = unbounded();
        let (s2, r2) = unbounded();
        for i in 0..100 {
            s1.send(i).unwrap();
            s2.send(i).unwrap();
        }
        for i in 0..100 {
            select_biased! {
                recv(r1) -> v => assert_eq!(v, Ok(i)),
                recv(r2) -> _ => panic!("r1 is ready and first"),
            }
        }
        let mut sel = Select::new_biased();
        let a = sel.recv(&r1);
        let b = sel.recv(&r2);
        let oper = sel.select();
        assert_eq!(oper.index(), b, "r1 is empty now");
        assert_ne!(a, b);
        assert_eq!(oper.recv(&r2), Ok(0));
    });
}

#[test]
fn dynamic_select_remove_timeout_try_and_ready_deadline() {
    everywhere(|| {
        let (s1, r1) = unbounded::<u8>();
        let (s2, r2) = unbounded::<u8>();
        let mut sel = Select::new();
        let i1 = sel.recv(&r1);
        let i2 = sel.recv(&r2);
        assert!(sel.try_select().is_err());
        assert!(sel.select_timeout(Duration::from_millis(5)).is_err());
        assert!(sel.select_deadline(Instant::now() + Duration::from_millis(5)).is_err());
        assert_eq!(
            sel.ready_deadline(Instant::now() + Duration::from_millis(5)),
            Err(ReadyTimeoutError)
        );
        s1.send(1).unwrap();
        s2.send(2).unwrap();
        sel.remove(i1);
        let oper = sel.try_select().unwrap();
        assert_eq!(oper.index(), i2, "the removed operation is never chosen");
        assert_eq!(oper.recv(&r2), Ok(2));
        assert_eq!(r1.try_recv(), Ok(1));
        let peer = go(move || {
            until(|| s2.is_empty());
            s2.send(3).unwrap();
        });
        assert_eq!(sel.ready_deadline(Instant::now() + Duration::from_secs(30)), Ok(i2));
        assert_eq!(r2.recv(), Ok(3));
        peer.join();
    });
}

#[test]
fn same_channel() {
    let (s, r) = unbounded::<u8>();
    let (s2, r2) = unbounded::<u8>();
    assert!(s.same_channel(&s.clone()) && !s.same_channel(&s2));
    assert!(r.same_channel(&r.clone()) && !r.same_channel(&r2));
    let t = after(Duration::from_secs(1));
    assert!(t.same_channel(&t.clone()) && !t.same_channel(&after(Duration::from_secs(1))));
}

#[test]
fn dropping_a_selected_send_gives_its_reservation_back() {
    everywhere(|| {
        let (s, r) = bounded::<u8>(1);
        let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut sel = Select::new();
            sel.send(&s);
            let oper = sel.select();
            drop(oper);
        }));
        assert!(dropped.is_err(), "dropping a selected operation panics");
        // The slot is free again: a send fits, and nothing phantom arrives.
        s.try_send(4).unwrap();
        assert_eq!(r.try_recv(), Ok(4));
        assert_eq!(r.try_recv(), Err(TryRecvError::Empty));
    });
}
