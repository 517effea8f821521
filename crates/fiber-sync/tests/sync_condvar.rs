//! Condvar: lost-wake-up-free producer/consumer from fibers, threads and
//! both; timeouts; cancellation returns with the guard re-acquired.

mod common;

use common::{everywhere, go, join_all, runtime, thread, until, within};
use fiber_sync::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

const ITEMS: usize = 2_000;

type Queue = Arc<(Mutex<VecDeque<usize>>, Condvar, Condvar)>;

/// Bounded producer/consumer over two condvars (not empty, not full):
/// every item arrives exactly once; a lost wake-up would hang.
fn produce_consume(mixed: bool) {
    let q: Queue = Arc::new((Mutex::new(VecDeque::new()), Condvar::new(), Condvar::new()));
    let producers: Vec<_> = (0..2)
        .map(|p| {
            let q = q.clone();
            let work = move || {
                let (m, not_empty, not_full) = &*q;
                for i in 0..ITEMS {
                    let mut g = not_full.wait_while(m.lock().unwrap(), |q| q.len() >= 4).unwrap();
                    g.push_back(p * ITEMS + i);
                    drop(g);
                    not_empty.notify_one();
                }
                Vec::new()
            };
            if mixed && p == 0 {
                thread(work)
            } else {
                go(work)
            }
        })
        .collect();
    let consumers: Vec<_> = (0..2)
        .map(|c| {
            let q = q.clone();
            let work = move || {
                let (m, not_empty, not_full) = &*q;
                let mut got = Vec::new();
                for _ in 0..ITEMS {
                    let mut g = not_empty.wait_while(m.lock().unwrap(), |q| q.is_empty()).unwrap();
                    got.push(g.pop_front().unwrap());
                    drop(g);
                    not_full.notify_one();
                }
                got
            };
            if mixed && c == 1 {
                thread(work)
            } else {
                go(work)
            }
        })
        .collect();
    let mut handles = producers;
    handles.extend(consumers);
    let mut all: Vec<usize> = join_all(handles).into_iter().flatten().collect();
    all.sort();
    assert_eq!(all, (0..2 * ITEMS).collect::<Vec<_>>());
}

#[test]
fn condvar_producer_consumer_no_lost_wakeup() {
    everywhere(|| produce_consume(false));
    everywhere(|| produce_consume(true));
}

#[test]
fn condvar_notify_all_wakes_everyone() {
    everywhere(|| {
        let pair = Arc::new((Mutex::new(false), Condvar::new()));
        let woken = Arc::new(AtomicUsize::new(0));
        let waiters: Vec<_> = (0..5)
            .map(|i| {
                let (pair, woken) = (pair.clone(), woken.clone());
                let work = move || {
                    let (m, cv) = &*pair;
                    let _g = cv.wait_while(m.lock().unwrap(), |go| !*go).unwrap();
                    woken.fetch_add(1, Ordering::SeqCst);
                };
                if i == 0 {
                    thread(work)
                } else {
                    go(work)
                }
            })
            .collect();
        let (m, cv) = &*pair;
        *m.lock().unwrap() = true;
        cv.notify_all();
        join_all(waiters);
        assert_eq!(woken.load(Ordering::SeqCst), 5);
    });
}

#[test]
fn condvar_wait_timeout_times_out_and_notified_does_not() {
    within(|| {
        let check = || {
            let pair = Arc::new((Mutex::new(0), Condvar::new()));
            let (m, cv) = &*pair;
            let (g, r) = cv.wait_timeout(m.lock().unwrap(), Duration::from_millis(20)).unwrap();
            assert!(r.timed_out());
            drop(g);
            let (g, r) = cv
                .wait_timeout_while(m.lock().unwrap(), Duration::from_millis(20), |v| *v == 0)
                .unwrap();
            assert!(r.timed_out());
            assert_eq!(*g, 0);
            drop(g);
            let setter = {
                let pair = pair.clone();
                go(move || {
                    let (m, cv) = &*pair;
                    *m.lock().unwrap() = 1;
                    cv.notify_one();
                })
            };
            let (g, r) = cv
                .wait_timeout_while(m.lock().unwrap(), Duration::from_secs(60), |v| *v == 0)
                .unwrap();
            assert!(!r.timed_out());
            assert_eq!(*g, 1);
            drop(g);
            setter.join();
        };
        check();
        runtime().block_on(check);
    });
}

/// A cancelled fiber's condvar wait returns at once, holding the lock
/// again, like a spurious wake-up; `wait_while` stops looping.
#[test]
fn condvar_cancelled_wait_returns_with_the_guard() {
    within(|| {
        runtime().block_on(|| {
            let pair = Arc::new((Mutex::new(0u32), Condvar::new()));
            let parked = Arc::new(AtomicUsize::new(0));
            let waiter = {
                let (pair, parked) = (pair.clone(), parked.clone());
                fiber_core::spawn(move || {
                    let (m, cv) = &*pair;
                    let g = m.lock().unwrap();
                    parked.store(1, Ordering::SeqCst);
                    let mut g = cv.wait_while(g, |v| *v == 0).unwrap();
                    // The guard is held again: we can write under it.
                    *g += 10;
                    parked.store(2, Ordering::SeqCst);
                })
            };
            until(|| parked.load(Ordering::SeqCst) == 1);
            // The waiter holds the lock until it parks in `wait`.
            drop(pair.0.lock().unwrap());
            waiter.cancel();
            let _ = waiter.join();
            assert_eq!(parked.load(Ordering::SeqCst), 2);
            assert_eq!(*pair.0.lock().unwrap(), 10);
        })
    });
}

/// Two waits in progress with two different mutexes: the second panics
/// (std may panic on a condvar used with more than one mutex). Between
/// waits a mutex may move (`adversarial/scope_failures.rs` in the facade
/// crate), so only waits in progress bind it.
#[test]
fn condvar_with_two_mutexes_at_once_panics() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let cv = Arc::new(Condvar::new());
    let a = Arc::new(Mutex::new(false));
    let started = Arc::new(AtomicBool::new(false));
    let waiter = {
        let (cv, a, started) = (cv.clone(), a.clone(), started.clone());
        std::thread::spawn(move || {
            let mut ready = a.lock().unwrap();
            started.store(true, Ordering::SeqCst);
            while !*ready {
                ready = cv.wait(ready).unwrap();
            }
        })
    };
    while !started.load(Ordering::SeqCst) {
        std::thread::yield_now();
    }
    // The waiter releases `a` only inside its wait, after binding it.
    drop(a.lock().unwrap());
    let b = Mutex::new(());
    let msg = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = cv.wait_timeout(b.lock().unwrap(), Duration::from_millis(1));
    }));
    *a.lock().unwrap() = true;
    cv.notify_all();
    waiter.join().unwrap();
    let payload = msg.expect_err("a second mutex while a wait is in progress panics");
    let text = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    assert!(text.contains("two mutexes"), "{text}");
}
