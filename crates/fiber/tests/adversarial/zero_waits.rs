//! Adversarial: a fiber that polls with a wait whose deadline has already
//! passed (`sleep(ZERO)`, `sleep_until(now)`, a zero `park_timeout`, a zero
//! `recv_timeout`, a zero `Condvar::wait_timeout`, a select with a zero
//! timeout) on a fixed pool. Each such wait returns at once, and it never
//! gave up the worker: the fiber that would end the loop, queued behind
//! it, never ran (Go preempts such a loop; tokio's budget yields it). Each
//! is now a yield point.

use std::time::{Duration, Instant};

use crate::common::{ms, poller_lets_others_run, within};

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

/// A zero `Condvar::wait_timeout` releases the mutex for its yield, as
/// std releases it for the wait: a notifier that needs the mutex runs.
#[test]
fn a_zero_condvar_wait_timeout_releases_the_mutex_for_its_yield() {
    within(30, || {
        let rt = crate::common::rt_fixed_grace(1, ms(200));
        rt.block_on(|| {
            let pair = std::sync::Arc::new((fiber::sync::Mutex::new(false), fiber::sync::Condvar::new()));
            let p2 = pair.clone();
            let (started_tx, started_rx) = fiber::chan::bounded(1);
            let waiter = fiber::spawn(move || {
                let (lock, cv) = &*p2;
                let mut done = lock.lock().unwrap();
                started_tx.send(()).unwrap();
                let mut rounds = 0u64;
                while !*done {
                    done = cv.wait_timeout(done, Duration::ZERO).unwrap().0;
                    rounds += 1;
                }
                rounds
            });
            started_rx.recv().unwrap();
            let p3 = pair.clone();
            let notifier = fiber::spawn(move || {
                let (lock, cv) = &*p3;
                *lock.lock().unwrap() = true;
                cv.notify_all();
            });
            notifier.join().unwrap();
            assert!(waiter.join().unwrap() >= 1);
            // The condvar is free for another mutex once the waits end.
            let other = fiber::sync::Mutex::new(());
            let g = other.lock().unwrap();
            drop(pair.1.wait_timeout(g, Duration::ZERO).unwrap());
        });
    });
}

/// A due timer's tick is taken even by a cancelled fiber, as a ready
/// channel's value is (the zero wait's yield is not a cancellation point).
#[test]
fn a_cancelled_fiber_still_takes_a_due_tick() {
    within(30, || {
        let rt = crate::common::rt_fixed_grace(1, ms(200));
        rt.block_on(|| {
            let (ready_tx, ready_rx) = fiber::chan::bounded(0);
            let (out_tx, out_rx) = fiber::chan::bounded(1);
            let h = fiber::spawn(move || {
                ready_tx.send(()).unwrap();
                while fiber::sleep(Duration::MAX).is_ok() {}
                let due = fiber::chan::after(Duration::ZERO).recv().is_ok();
                let (tx, rx) = fiber::chan::bounded(1);
                tx.send(1u8).unwrap();
                out_tx.send((due, rx.recv().is_ok())).unwrap();
            });
            ready_rx.recv().unwrap();
            h.cancel();
            assert!(h.join().unwrap_err().is_cancelled());
            assert_eq!(out_rx.recv().unwrap(), (true, true));
        });
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
        let rt = crate::common::rt_fixed_grace(1, ms(200));
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
