//! `select!` and `Select`, on threads and on both schedulers.

mod common;
use common::{everywhere, go, until};
use fiber_chan::*;
use std::time::{Duration, Instant};

#[test]
fn select_picks_fairly_when_several_are_ready() {
    everywhere(|| {
        let (s1, r1) = unbounded();
        let (s2, r2) = unbounded();
        for i in 0..1000 {
            s1.send(i).unwrap();
            s2.send(i).unwrap();
        }
        let (mut first, mut second) = (0, 0);
        for _ in 0..1000 {
            select! {
                recv(r1) -> v => { v.unwrap(); first += 1; }
                recv(r2) -> v => { v.unwrap(); second += 1; }
            }
        }
        assert!(first > 300 && second > 300, "random start: {first} vs {second}");
    });
}

#[test]
fn select_default_and_default_timeout() {
    everywhere(|| {
        let (_s, r) = bounded::<u8>(1);
        let chosen = select! {
            recv(r) -> _ => "recv",
            default => "default",
        };
        assert_eq!(chosen, "default");
        let start = Instant::now();
        let chosen = select! {
            recv(r) -> _ => "recv",
            default(Duration::from_millis(20)) => "timeout",
        };
        assert_eq!(chosen, "timeout");
        assert!(fiber_core::in_fiber() || start.elapsed() >= Duration::from_millis(20));
    });
}

#[test]
fn select_send_arm_sends_only_when_selected() {
    everywhere(|| {
        let (s, r) = bounded(1);
        select! {
            send(s, 1) -> res => assert_eq!(res, Ok(())),
            default => panic!("room in the buffer: the send is ready"),
        }
        let sent_again = select! {
            send(s, 2) -> _ => true,
            default => false,
        };
        assert!(!sent_again, "the buffer is full");
        assert_eq!(
            r.try_iter().collect::<Vec<_>>(),
            [1],
            "the unselected value was not sent"
        );
    });
}

#[test]
fn select_recv_on_a_disconnected_channel_is_ready_with_an_error() {
    everywhere(|| {
        let (s, r) = unbounded::<u8>();
        drop(s);
        select! {
            recv(r) -> v => assert_eq!(v, Err(RecvError)),
            default(Duration::from_secs(5)) => panic!("a disconnected receive is ready"),
        }
    });
}

#[test]
fn select_waits_for_a_peer_and_removes_losing_waiters() {
    everywhere(|| {
        let (s1, r1) = bounded::<u32>(0);
        let (s2, r2) = bounded::<u32>(0);
        let peer = {
            let s2 = s2.clone();
            go(move || {
                until(|| s2.waiting().0 == 1);
                s2.send(9).unwrap();
            })
        };
        let got = select! {
            recv(r1) -> v => v.map(|v| v + 1000),
            recv(r2) -> v => v,
        };
        assert_eq!(got, Ok(9));
        peer.join();
        assert_eq!(s1.waiting(), (0, 0), "the losing receive was unlinked");
        assert_eq!(s2.waiting(), (0, 0));
    });
}

#[test]
fn dynamic_select_with_a_send_operation() {
    everywhere(|| {
        let (s, r) = bounded(1);
        let (_s2, r2) = bounded::<u8>(0);
        let mut sel = Select::new();
        let send_index = sel.send(&s);
        let recv_index = sel.recv(&r2);
        let oper = sel.select();
        assert_eq!(oper.index(), send_index);
        assert_ne!(send_index, recv_index);
        oper.send(&s, 5).unwrap();
        assert_eq!(r.recv(), Ok(5));
    });
}

#[test]
fn after_tick_and_never_in_select() {
    everywhere(|| {
        let timeout = after(Duration::from_millis(10));
        let nothing = never::<u8>();
        select! {
            recv(nothing) -> _ => panic!("never delivers"),
            recv(timeout) -> at => assert!(at.is_ok()),
        }
        assert!(timeout.try_recv().is_err(), "after delivers once");
        let ticker = tick(Duration::from_millis(2));
        let mut ticks = 0;
        while ticks < 3 {
            select! {
                recv(ticker) -> t => { t.unwrap(); ticks += 1; }
                recv(nothing) -> _ => unreachable!(),
            }
        }
    });
}

#[test]
fn select_with_no_operations_is_refused() {
    let mut sel = Select::new();
    assert_eq!(sel.try_select().map(|o| o.index()), Err(TrySelectError));
    let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut sel = Select::new();
        let oper = sel.select();
        oper.index()
    }))
    .unwrap_err();
    let msg = err
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| err.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    assert!(msg.contains("no operations"), "{msg}");
}

#[test]
fn selected_operation_checks_its_handle() {
    let (s, r) = unbounded::<u8>();
    let (_s2, r2) = unbounded::<u8>();
    s.send(1).unwrap();
    let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut sel = Select::new();
        sel.recv(&r);
        let oper = sel.select();
        let _ = oper.recv(&r2);
    }))
    .unwrap_err();
    let msg = err.downcast_ref::<&str>().map(|s| s.to_string()).unwrap_or_default();
    assert!(msg.contains("not the one of the selected operation"), "{msg}");
}

#[test]
fn at_delivers_once_at_the_instant() {
    everywhere(|| {
        let when = Instant::now() + Duration::from_millis(5);
        let r = at(when);
        let got = r.recv().unwrap();
        assert!(got >= when);
        assert_eq!(r.try_recv(), Err(TryRecvError::Empty));
    });
}

#[test]
fn ready_reports_without_performing() {
    everywhere(|| {
        let (s1, r1) = unbounded::<u32>();
        let (_s2, r2) = unbounded::<u32>();
        let mut sel = Select::new();
        let i1 = sel.recv(&r1);
        let i2 = sel.recv(&r2);
        assert_eq!(sel.try_ready(), Err(TryReadyError));
        assert_eq!(sel.ready_timeout(Duration::from_millis(5)), Err(ReadyTimeoutError));
        s1.send(7).unwrap();
        assert_eq!(sel.ready(), i1);
        assert_ne!(i1, i2);
        assert_eq!(r1.try_recv(), Ok(7), "ready() did not take the value");
        // Blocking until a peer arrives.
        let peer = go(move || {
            until(|| s1.waiting().0 > 0 || s1.is_empty());
            s1.send(8).unwrap();
        });
        assert_eq!(sel.ready(), i1);
        assert_eq!(r1.recv(), Ok(8));
        peer.join();
    });
}

#[test]
fn ready_for_a_rendezvous_send_waits_for_a_receiver() {
    everywhere(|| {
        let (s, r) = bounded::<u32>(0);
        let mut sel = Select::new();
        let i = sel.send(&s);
        assert_eq!(sel.try_ready(), Err(TryReadyError), "no receiver waits");
        let receiver = go(move || r.recv());
        assert_eq!(sel.ready(), i);
        s.send(3).unwrap();
        assert_eq!(receiver.join(), Ok(3));
    });
}

#[test]
fn select_moves_large_and_small_values_and_drops_each_once() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static DROPS: AtomicUsize = AtomicUsize::new(0);
    struct Counted(#[allow(dead_code)] [u64; 16]);
    impl Drop for Counted {
        fn drop(&mut self) {
            DROPS.fetch_add(1, Ordering::SeqCst);
        }
    }
    let (s1, r1) = unbounded::<Counted>();
    let (s2, r2) = unbounded::<String>();
    s1.send(Counted([7; 16])).unwrap();
    s2.send("small".to_string()).unwrap();
    let mut got = 0;
    for _ in 0..2 {
        select! {
            recv(r1) -> v => { assert_eq!(v.unwrap().0[15], 7); got += 1; }
            recv(r2) -> v => { assert_eq!(v.unwrap(), "small"); got += 1; }
        }
    }
    assert_eq!((got, DROPS.load(Ordering::SeqCst)), (2, 1));
    // A selected value dropped with its SelectedOperation is dropped once.
    s1.send(Counted([1; 16])).unwrap();
    let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut sel = Select::new();
        sel.recv(&r1);
        let _oper = sel.select();
    }));
    assert!(dropped.is_err());
    assert_eq!(DROPS.load(Ordering::SeqCst), 2);
}
