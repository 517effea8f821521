//! A wait that finds its fiber already cancelled returns at once, but it
//! still yields first (as a timed wait whose deadline has passed does):
//! a cancelled fiber that ignores the error in a polling loop, say clean-up
//! waiting for a flag another fiber sets, must not hold its worker for ever
//! on a fixed pool (trio's checkpoints yield before they raise `Cancelled`;
//! found by porting trio's `test_cancel_points`).

use crate::common::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The longest a poller loops before it gives up (the failure signal).
const GIVE_UP: Duration = Duration::from_secs(3);

/// On one worker: a fiber polls with `poll` until a flag is set (or until
/// it gives up); it is cancelled, then the root sets the flag. The root
/// gets the worker back only if one of the cancelled fiber's polls yields,
/// so the run ends well before the give-up time exactly when they do.
fn polls_let_others_run(poll: fn()) {
    let start = Instant::now();
    within(60, move || {
        rt1().block_on(move || {
            let started = Arc::new(AtomicBool::new(false));
            let flag = Arc::new(AtomicBool::new(false));
            let (s, f) = (started.clone(), flag.clone());
            let poller = fiber::spawn(move || {
                s.store(true, Ordering::Relaxed);
                let t = Instant::now();
                while !f.load(Ordering::Relaxed) && t.elapsed() < GIVE_UP {
                    poll();
                }
            });
            while !started.load(Ordering::Relaxed) {
                let _ = fiber::yield_now();
            }
            poller.cancel();
            // The cancelled poller runs next.
            let _ = fiber::yield_now();
            flag.store(true, Ordering::Relaxed);
            let _ = poller.join();
        })
    });
    assert!(
        start.elapsed() < GIVE_UP,
        "the cancelled poller held the only worker until it gave up ({:?})",
        start.elapsed()
    );
}

#[test]
fn a_cancelled_fibers_sleep_yields() {
    polls_let_others_run(|| {
        let _ = fiber::sleep(ms(1));
    });
}

#[test]
fn a_cancelled_fibers_zero_sleep_yields() {
    polls_let_others_run(|| {
        let _ = fiber::sleep(Duration::ZERO);
    });
}

#[test]
fn a_cancelled_fibers_zero_recv_timeout_yields() {
    polls_let_others_run(|| {
        let (_tx, rx) = fiber::chan::bounded::<u8>(0);
        let _ = rx.recv_timeout(Duration::ZERO);
    });
}

#[test]
fn a_cancelled_fibers_recv_yields() {
    polls_let_others_run(|| {
        let (_tx, rx) = fiber::chan::bounded::<u8>(0);
        let _ = rx.recv();
    });
}

#[test]
fn a_cancelled_fibers_park_timeout_yields() {
    polls_let_others_run(|| fiber::park_timeout(ms(1)));
}

#[test]
fn a_cancelled_fibers_join_yields() {
    polls_let_others_run(|| {
        let h = fiber::spawn(|| ());
        let _ = h.join();
    });
}

#[test]
fn a_cancelled_fibers_yield_now_yields() {
    polls_let_others_run(|| {
        let _ = fiber::yield_now();
    });
}

/// A cancelled fiber in the usual `while !ready { g = cv.wait(g) }` loop:
/// its waits end at once (cancelled), and each yields with the mutex
/// released (as std's wait releases it), so the notifier can take the
/// mutex and set the flag. Before, the wait yielded holding the mutex, and
/// the loop kept the notifier out on one worker and on two.
fn condvar_scenario(rt: fiber::Runtime) {
    let start = Instant::now();
    within(30, move || {
        rt.block_on(move || {
            let pair = Arc::new((fiber::sync::Mutex::new(false), fiber::sync::Condvar::new()));
            let (started_tx, started_rx) = fiber::chan::bounded::<()>(1);
            let p = pair.clone();
            let waiter = fiber::spawn(move || {
                let (m, cv) = &*p;
                let mut g = m.lock().unwrap();
                started_tx.send(()).unwrap();
                let t = Instant::now();
                while !*g && t.elapsed() < GIVE_UP {
                    g = cv.wait(g).unwrap();
                }
            });
            started_rx.recv().unwrap();
            // The waiter is parked in `wait` (mutex released) or about to.
            let _ = fiber::sleep(ms(20));
            waiter.cancel();
            let _ = fiber::sleep(ms(20));
            // The notifier: needs the mutex.
            {
                let (m, cv) = &*pair;
                *m.lock().unwrap() = true;
                cv.notify_all();
            }
            let _ = waiter.join();
        })
    });
    assert!(
        start.elapsed() < GIVE_UP,
        "the cancelled waiter held the mutex through its yields until it gave up ({:?})",
        start.elapsed()
    );
}

#[test]
fn a_cancelled_condvar_wait_loop_lets_the_notifier_take_the_mutex_on_one_worker() {
    condvar_scenario(rt1());
}

#[test]
fn a_cancelled_condvar_wait_loop_lets_the_notifier_take_the_mutex_on_two_workers() {
    condvar_scenario(rt2());
}
