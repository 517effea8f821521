//! Adversarial: a fiber that polls with a wait whose deadline has already
//! passed (`sleep(ZERO)`, `sleep_until(now)`, a zero `park_timeout`, a zero
//! `recv_timeout`, a zero `Condvar::wait_timeout`, a select with a zero
//! timeout) on a fixed pool. Each such wait returns at once, and it never
//! gave up the worker: the fiber that would end the loop, queued behind
//! it, never ran (Go preempts such a loop; tokio's budget yields it). Each
//! is now a yield point.

use std::time::{Duration, Instant};

mod common;
use common::{ms, poller_lets_others_run, within};

#[test]
fn sleep_zero_is_a_yield_point() {
    poller_lets_others_run(|| fiber::sleep(Duration::ZERO).unwrap());
}

#[test]
fn sleep_until_now_or_the_past_is_a_yield_point() {
    poller_lets_others_run(|| fiber::sleep_until(Instant::now()).unwrap());
    poller_lets_others_run(|| {
        let past = Instant::now()
            .checked_sub(Duration::from_secs(1))
            .unwrap_or_else(Instant::now);
        fiber::sleep_until(past).unwrap();
    });
}

#[test]
fn a_zero_park_timeout_is_a_yield_point() {
    poller_lets_others_run(|| fiber::park_timeout(Duration::ZERO));
}

#[test]
fn a_zero_recv_timeout_on_an_empty_channel_is_a_yield_point() {
    poller_lets_others_run(|| {
        let (_tx, rx) = fiber::chan::bounded::<u8>(1);
        assert!(rx.recv_timeout(Duration::ZERO).is_err());
    });
    poller_lets_others_run(|| {
        let (_tx, rx) = fiber::chan::bounded::<u8>(0);
        fiber::chan::select! {
            recv(rx) -> _ => unreachable!("nothing is sent"),
            default(Duration::ZERO) => {}
        }
    });
}

#[test]
fn a_due_timer_channel_is_a_yield_point() {
    poller_lets_others_run(|| {
        fiber::chan::after(Duration::ZERO).recv().unwrap();
    });
    poller_lets_others_run(|| {
        assert!(fiber::chan::never::<u8>().recv_timeout(Duration::ZERO).is_err());
    });
}

#[test]
fn a_zero_condvar_wait_timeout_is_a_yield_point() {
    poller_lets_others_run(|| {
        let lock = fiber::sync::Mutex::new(());
        let cv = fiber::sync::Condvar::new();
        let guard = lock.lock().unwrap();
        let (_guard, timeout) = cv.wait_timeout(guard, Duration::ZERO).unwrap();
        assert!(timeout.timed_out());
    });
}

/// The zero wait still returns at once when nothing else is runnable, and
/// reports the timeout (not a cancellation) in a fiber that is not
/// cancelled; a cancelled fiber's zero sleep still reports `Cancelled`.
#[test]
fn a_zero_wait_still_times_out_at_once() {
    within(30, || {
        let rt = common::rt_fixed_grace(1, ms(200));
        rt.block_on(|| {
            let start = Instant::now();
            for _ in 0..1000 {
                fiber::sleep(Duration::ZERO).unwrap();
            }
            assert!(start.elapsed() < Duration::from_secs(5));
            let (ready_tx, ready_rx) = fiber::chan::bounded(0);
            let h = fiber::spawn(move || {
                ready_tx.send(()).unwrap();
                while fiber::sleep(Duration::MAX).is_ok() {}
                fiber::sleep(Duration::ZERO)
            });
            ready_rx.recv().unwrap();
            h.cancel();
            assert!(h.join().unwrap_err().is_cancelled());
        });
    });
}
