//! Regression tests for values lost or operations that hung or spun in
//! `select!` and around close (spec/chan.md section 6). Each failed before
//! the fix it names.

mod common;
use common::{everywhere, go, on_schedulers, until};
use fiber_chan::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Run `f` on a helper thread and fail (instead of hanging the suite) if it
/// does not finish within a generous bound: hang detection only.
fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        let _ = tx.send(result);
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(Ok(v)) => v,
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        Err(_) => panic!("{what}: hung (no progress in 60 s)"),
    }
}

/// Pause without blocking a worker thread (a fiber parks, a thread sleeps).
fn pause(d: Duration) {
    let _ = fiber_core::wait_until(Some(Instant::now() + d), fiber_core::Interrupt::NotCancellable);
}

fn timer_arm_scenario(cap: Option<usize>) {
    const N: u64 = 2000;
    let (tx, rx) = match cap {
        Some(c) => bounded::<u64>(c),
        None => unbounded(),
    };
    let consumer = go(move || {
        let t = tick(Duration::from_micros(200));
        let mut got = 0u64;
        loop {
            select! {
                recv(t) -> _ => {}
                recv(rx) -> m => match m {
                    Ok(_) => got += 1,
                    Err(_) => break,
                }
            }
        }
        got
    });
    let mut sent = 0;
    for i in 0..N {
        if tx.send(i).is_ok() {
            sent += 1;
        }
        if i % 8 == 0 {
            pause(Duration::from_micros(300));
        }
    }
    drop(tx);
    assert_eq!(consumer.join(), sent, "cap {cap:?}: every value sent Ok is received");
}

#[test]
fn timer_arm_in_select_never_loses_messages() {
    for cap in [Some(0), Some(1), Some(16), None] {
        within("timer arm", move || timer_arm_scenario(cap));
        within("timer arm on fibers", move || {
            let rt = fiber_sched::Runtime::builder().workers(2).build().unwrap();
            rt.block_on(move || timer_arm_scenario(cap));
        });
    }
}

#[test]
fn send_and_recv_arms_on_one_rendezvous_channel_with_default() {
    within("send+recv with default", || {
        everywhere(|| {
            let (s, r) = bounded::<u32>(0);
            let chosen = select! {
                send(s, 1) -> _ => "send",
                recv(r) -> _ => "recv",
                default => "default",
            };
            assert_eq!(chosen, "default", "nothing can pair with itself");
            let chosen = select! {
                send(s, 1) -> _ => "send",
                recv(r) -> _ => "recv",
                default(Duration::from_millis(5)) => "timeout",
            };
            assert_eq!(chosen, "timeout", "nothing can pair with itself");
            let chosen = select! {
                recv(r) -> _ => "recv",
                send(s, 1) -> _ => "send",
                default(Duration::from_millis(5)) => "timeout",
            };
            assert_eq!(chosen, "timeout");
            assert_eq!(s.waiting(), (0, 0));
        })
    });
}

#[test]
fn send_and_recv_arms_on_one_rendezvous_channel_dynamic_parks() {
    within("send+recv dynamic", || {
        everywhere(|| {
            let (s, r) = bounded::<u32>(0);
            let mut sel = Select::new();
            sel.send(&s);
            sel.recv(&r);
            // A busy loop never parks: on the test scheduler the partner
            // would then never run. Here nothing comes, so it times out.
            assert!(sel.select_timeout(Duration::from_millis(20)).is_err());
            // With a partner receiving, the send arm completes.
            let (s2, r2) = (s.clone(), r.clone());
            let partner = go(move || r2.recv());
            let mut sel = Select::new();
            let si = sel.send(&s2);
            let _ri = sel.recv(&r);
            let oper = sel.select();
            assert_eq!(oper.index(), si);
            oper.send(&s2, 7).unwrap();
            assert_eq!(partner.join(), Ok(7));
        })
    });
}

#[test]
fn send_and_recv_arms_on_one_rendezvous_channel_dynamic_does_not_spin() {
    within("send+recv dynamic spin", || {
        fiber_core::testing::TestScheduler::new().block_on(|| {
            let (s, r) = bounded::<u32>(0);
            let ran = Arc::new(AtomicUsize::new(0));
            let other = {
                let ran = ran.clone();
                go(move || ran.fetch_add(1, Ordering::SeqCst))
            };
            let mut sel = Select::new();
            sel.send(&s);
            sel.recv(&r);
            assert!(sel.select_timeout(Duration::from_millis(20)).is_err());
            assert_eq!(
                ran.load(Ordering::SeqCst),
                1,
                "the select parked (a busy loop keeps the only worker from running the other fiber)"
            );
            other.join();
            // Receive registered first: its own node must not make the send
            // arm look ready.
            let mut sel = Select::new();
            sel.recv(&r);
            sel.send(&s);
            assert!(
                sel.select_timeout(Duration::from_millis(20)).is_err(),
                "a select's send arm cannot pair with its own receive"
            );
        })
    });
}

#[test]
fn send_and_recv_arms_on_one_rendezvous_channel_complete_with_a_partner() {
    within("send+recv with partner", || {
        everywhere(|| {
            let (s, r) = bounded::<u32>(0);
            let r2 = r.clone();
            let s2 = s.clone();
            let partner = go(move || {
                until(|| s2.waiting() != (0, 0));
                r2.recv()
            });
            let chosen = select! {
                send(s, 5) -> res => { res.unwrap(); "send" }
                recv(r) -> _ => "recv",
            };
            assert_eq!(chosen, "send");
            assert_eq!(partner.join(), Ok(5));
        })
    });
}

#[test]
fn dropping_a_selected_operation_without_completing_it_panics() {
    let (s, r) = unbounded::<u32>();
    s.send(1).unwrap();
    let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut sel = Select::new();
        sel.recv(&r);
        let oper = sel.select();
        drop(oper);
    }))
    .expect_err("dropping a selected operation is a misuse");
    let msg = err
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| err.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    assert!(msg.contains("without completing the operation"), "{msg}");
}

struct Bomb(bool);

impl Drop for Bomb {
    fn drop(&mut self) {
        if self.0 && !std::thread::panicking() {
            panic!("boom");
        }
    }
}

#[test]
fn panicking_drop_of_buffered_values_still_wakes_parked_senders() {
    within("panicking drop", || {
        everywhere(|| {
            let (tx, rx) = bounded::<Bomb>(1);
            tx.send(Bomb(true)).unwrap();
            let parked = {
                let tx = tx.clone();
                go(move || tx.send(Bomb(false)).map_err(|e| e.into_inner().0))
            };
            until(|| tx.waiting().1 == 1);
            let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(rx)));
            assert!(dropped.is_err(), "the value's panic reaches the dropper");
            assert_eq!(parked.join(), Err(false), "the parked sender got its value back");
        })
    });
}

#[test]
fn cancelled_timer_and_never_receives_park_and_return() {
    within("cancelled timer receive", || {
        on_schedulers(|| {
            let spins = Arc::new(AtomicUsize::new(0));
            let a = fiber_core::spawn(|| after(Duration::from_secs(3600)).recv().is_err());
            let b = fiber_core::spawn(|| never::<u8>().recv().is_err());
            let c = fiber_core::spawn(|| never::<u8>().recv_timeout(Duration::from_secs(3600)).is_err());
            let d = fiber_core::spawn(|| {
                after(Duration::from_secs(3600))
                    .recv_timeout(Duration::from_secs(3600))
                    .is_err()
            });
            let _ = &spins;
            for _ in 0..10 {
                let _ = fiber_core::yield_now();
            }
            for h in [a, b, c, d] {
                h.cancel();
                match h.join() {
                    Ok(failed) => assert!(failed, "a cancelled receive takes nothing"),
                    Err(e) => assert!(e.is_cancelled(), "{e}"),
                }
            }
        })
    });
}

/// A selected send completed with the wrong sender panics, and gives its
/// reservation back on the way out: the reserved buffer slot does not stay
/// taken for good (it did while a completion flag was set before the
/// handle check).
#[test]
fn a_selected_send_given_the_wrong_sender_gives_its_reservation_back() {
    let (tx, rx) = fiber_chan::bounded::<u32>(1);
    let (other_tx, _other_rx) = fiber_chan::bounded::<u32>(1);
    let mut sel = fiber_chan::Select::new();
    sel.send(&tx);
    let oper = sel.select();
    let misuse = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| oper.send(&other_tx, 1)));
    let message = misuse.expect_err("the wrong sender is refused");
    let message = message
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| message.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    assert!(message.contains("not the one of the selected operation"), "{message}");
    assert_eq!(tx.try_send(2), Ok(()), "the reserved slot was given back");
    assert_eq!(rx.try_recv(), Ok(2));
}
