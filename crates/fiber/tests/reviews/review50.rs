//! Adversarial review 50: a short attack on the operation budget's rules as
//! changed after review 48. A run of operations that never wait looks at
//! the clock every `OP_BUDGET` (128) operations and yields once it has
//! lasted `OP_SLICE` (2 ms); at a look, a cancelled fiber's cancellable
//! operation (channel `send` / `recv`) ends as cancelled only if no
//! cancellation point told the fiber yet, and a look that finds the fiber
//! not cancelled re-arms it; in teardown a look cuts nothing and unwinds a
//! run of 8,192 operations. The programs here tell a fiber of one
//! cancellation (a `with_timeout` that expired, a `sleep` that returned
//! `Cancelled`) and then cancel it again, in another way, before any look
//! found it not cancelled: a later `JoinHandle::cancel`, the next
//! `with_timeout` of an outer loop, an enclosing `with_timeout`; or they
//! re-arm a told fiber inside `non_cancellable` and then run its clean-up.

use crate::common::*;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a cancelled loop of successful operations may take to end
/// (it ends within 128 operations; generous for a noisy machine).
const LIMIT: Duration = Duration::from_secs(3);

/// A loop of receives and sends on a bounded(1) channel the fiber keeps
/// fed itself: no operation ever waits. Ends on the first cancelled
/// operation, or when `stop` is set (the test's rescue from a hang).
fn self_fed_loop(stop: &AtomicBool) -> &'static str {
    let (tx, rx) = fiber::chan::bounded(1);
    tx.send(7u64).unwrap();
    loop {
        let Ok(v) = rx.recv() else {
            return "recv cancelled";
        };
        if stop.load(SeqCst) {
            return "stopped by the flag";
        }
        if tx.send(v).is_err() {
            return "send cancelled";
        }
    }
}

/// Spin for `d` without any operation, yield or wait.
fn spin_for(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// Wait (on this plain thread) until `done()` or `LIMIT`; whether it came.
fn came_within_limit(done: impl Fn() -> bool) -> bool {
    let t = Instant::now();
    while !done() && t.elapsed() < LIMIT {
        std::thread::sleep(ms(1));
    }
    done()
}

// Failed with the first version of the review-48 budget change (a single "told" flag): a fiber told of an expired with_timeout is never told of a later JoinHandle::cancel: its recv loop runs for ever
#[test]
fn join_handle_cancel_after_an_expired_with_timeout_stops_a_loop_of_successful_recvs_two_workers() {
    within(30, || {
        let rt = rt2();
        let ready = Arc::new(AtomicBool::new(false));
        let go = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let (r, g, s) = (ready.clone(), go.clone(), stop.clone());
        let h = rt.spawn(move || {
            // Told of the timeout by the sleep's cancelled wait.
            let timed = fiber::with_timeout(ms(5), || fiber::sleep(Duration::from_secs(10)));
            assert!(!matches!(timed, Ok(Ok(()))), "the sleep outlived its timeout");
            r.store(true, SeqCst);
            // The JoinHandle's cancel lands here, before any budget look.
            while !g.load(SeqCst) {
                std::hint::spin_loop();
            }
            self_fed_loop(&s)
        });
        while !ready.load(SeqCst) {
            std::thread::sleep(ms(1));
        }
        h.cancel();
        go.store(true, SeqCst);
        let ended = came_within_limit(|| h.is_finished());
        stop.store(true, SeqCst);
        let how = h.join();
        drop(rt);
        assert!(ended, "the cancelled fiber kept looping for {LIMIT:?} ({how:?})");
    });
}

// Failed with the first version of the review-48 budget change (a single "told" flag): the second with_timeout of an outer loop, past its deadline before the body's first look, is never told: its recv loop runs for ever
#[test]
fn each_with_timeout_of_an_outer_loop_ends_its_loop_of_successful_recvs_even_if_it_expired_before_a_look_one_worker() {
    within(30, || {
        let rt = rt1();
        let rounds = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (r, s) = (rounds.clone(), stop.clone());
        let h = rt.spawn(move || {
            for _ in 0..3 {
                let round = fiber::with_timeout(ms(20), || {
                    // Computing past the deadline, then draining.
                    spin_for(ms(40));
                    self_fed_loop(&s)
                });
                assert!(round.is_err(), "a round outlived its timeout: {round:?}");
                r.fetch_add(1, SeqCst);
            }
        });
        let ended = came_within_limit(|| h.is_finished());
        let done = rounds.load(SeqCst);
        stop.store(true, SeqCst);
        let how = h.join();
        drop(rt);
        assert!(ended, "{done} of 3 rounds ended in {LIMIT:?} ({how:?})");
    });
}

// Failed with the first version of the review-48 budget change (a single "told" flag): an outer with_timeout that expires after an inner one told the fiber is never told: the loop after the inner one runs for ever
#[test]
fn an_enclosing_with_timeout_ends_a_loop_of_successful_recvs_after_an_inner_one_expired_one_worker() {
    within(30, || {
        let rt = rt1();
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let h = rt.spawn(move || {
            fiber::with_timeout(ms(30), || {
                let inner = fiber::with_timeout(ms(5), || fiber::sleep(Duration::from_secs(10)));
                assert!(!matches!(inner, Ok(Ok(()))), "the sleep outlived its timeout");
                spin_for(ms(60));
                self_fed_loop(&s)
            })
        });
        let ended = came_within_limit(|| h.is_finished());
        stop.store(true, SeqCst);
        let how = h.join();
        drop(rt);
        assert!(
            ended,
            "the loop outlived its enclosing with_timeout by {LIMIT:?} ({how:?})"
        );
    });
}

// Failed with the first version of the review-48 budget change (a single "told" flag): non_cancellable clean-up re-arms a told fiber, so a send of its clean-up after the section is cut (1299 of 1300 made)
#[test]
fn a_told_fibers_clean_up_after_a_non_cancellable_section_makes_every_send_one_worker() {
    within(30, || {
        let rt = rt1();
        let made = Arc::new(AtomicUsize::new(0));
        let sleeping = Arc::new(AtomicBool::new(false));
        let (m, z) = (made.clone(), sleeping.clone());
        let (tx, rx) = fiber::chan::unbounded::<u32>();
        let h = rt.spawn(move || {
            z.store(true, SeqCst);
            assert!(fiber::sleep(Duration::from_secs(10)).is_err(), "not cancelled");
            // Clean-up: part of it held off, the rest after.
            fiber::core::non_cancellable(|| {
                for i in 0..300 {
                    if tx.send(i).is_ok() {
                        m.fetch_add(1, SeqCst);
                    }
                }
            });
            for i in 300..1300 {
                if tx.send(i).is_ok() {
                    m.fetch_add(1, SeqCst);
                }
            }
        });
        while !sleeping.load(SeqCst) {
            std::thread::sleep(ms(1));
        }
        std::thread::sleep(ms(20));
        h.cancel();
        let _ = h.join();
        drop(rt);
        let received = std::iter::from_fn(|| rx.try_recv().ok()).count();
        assert_eq!(
            (made.load(SeqCst), received),
            (1300, 1300),
            "clean-up sends made / received"
        );
    });
}

// The run's clock starts at its first look (a clock read at every
// resume would cost every switch), so a run of slow operations yields at
// its second look: 256 locks of 100 us here, not 128 (documented with
// `OP_SLICE`).
#[test]
fn a_run_of_slow_operations_yields_by_its_second_look_one_worker() {
    within(30, || {
        let rt = rt1();
        let ran_after = rt.block_on(|| {
            let sibling = Arc::new(AtomicBool::new(false));
            let s = sibling.clone();
            let h = fiber::spawn(move || s.store(true, SeqCst));
            let m = fiber::sync::Mutex::new(0u64);
            let mut n = 0u32;
            while !sibling.load(SeqCst) {
                spin_for(Duration::from_micros(100));
                *m.lock().unwrap() += 1;
                n += 1;
            }
            h.join().unwrap();
            n
        });
        drop(rt);
        // At the 256th lock the run has lasted 12.8 ms since its first
        // look, over `OP_SLICE` (2 ms).
        assert!(
            ran_after <= 2 * fiber::core::OP_BUDGET,
            "the sibling ran after {ran_after} locks of 100 us each"
        );
    });
}

// ---------------------------------------------------------------------------
// What held.

#[test]
fn each_with_timeout_of_an_outer_loop_ends_its_loop_of_successful_recvs_one_worker() {
    within(30, || {
        let rt = rt1();
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let h = rt.spawn(move || {
            let mut how = Vec::new();
            for _ in 0..3 {
                let round = fiber::with_timeout(ms(20), || self_fed_loop(&s));
                how.push(round.is_err());
            }
            how
        });
        let ended = came_within_limit(|| h.is_finished());
        stop.store(true, SeqCst);
        let how = h.join();
        drop(rt);
        assert!(ended, "the rounds did not end in {LIMIT:?}");
        assert_eq!(how.ok(), Some(vec![true; 3]), "each round timed out");
    });
}

#[test]
fn a_told_fibers_clean_up_makes_every_send_and_a_later_cancel_ends_its_loop_two_workers() {
    within(30, || {
        let rt = rt2();
        let made = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (m, s) = (made.clone(), stop.clone());
        let (tx, rx) = fiber::chan::unbounded::<u32>();
        let h = rt.spawn(move || {
            // Told by the timeout; the clean-up after it is not cut.
            let timed = fiber::with_timeout(ms(5), || fiber::sleep(Duration::from_secs(10)));
            assert!(timed.is_err() || matches!(timed, Ok(Err(_))));
            for i in 0..1000 {
                if tx.send(i).is_ok() {
                    m.fetch_add(1, SeqCst);
                }
            }
            drop(tx);
            // A look here finds the fiber not cancelled (re-armed), so a
            // later cancel ends the loop.
            self_fed_loop(&s)
        });
        assert!(wait_until_made(&made, 1000), "clean-up sends: {}", made.load(SeqCst));
        std::thread::sleep(ms(20));
        h.cancel();
        let ended = came_within_limit(|| h.is_finished());
        stop.store(true, SeqCst);
        let _ = h.join();
        drop(rt);
        assert!(ended, "the cancel did not end the loop in {LIMIT:?}");
        assert_eq!(std::iter::from_fn(|| rx.try_recv().ok()).count(), 1000);
    });
}

fn wait_until_made(made: &AtomicUsize, n: usize) -> bool {
    came_within_limit(|| made.load(SeqCst) >= n)
}

#[test]
fn a_loop_of_successful_recvs_past_the_shutdown_grace_is_unwound_and_the_drop_returns_one_worker() {
    within(30, || {
        let rt = rt1();
        let started = Arc::new(AtomicBool::new(false));
        let st = started.clone();
        let stop = Arc::new(AtomicBool::new(false));
        rt.spawn(move || {
            st.store(true, SeqCst);
            // Not cancellable: only the teardown's unwind at a look ends it.
            fiber::core::non_cancellable(|| self_fed_loop(&stop));
        });
        while !started.load(SeqCst) {
            std::thread::sleep(ms(1));
        }
        let t = Instant::now();
        drop(rt);
        assert!(t.elapsed() < Duration::from_secs(5), "the drop took {:?}", t.elapsed());
    });
}

#[test]
fn a_scope_child_looping_on_successful_recvs_ends_when_its_told_parent_is_cancelled_two_workers() {
    within(30, || {
        let rt = rt2();
        let looping = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let (l, s) = (looping.clone(), stop.clone());
        let h = rt.spawn(move || {
            // The parent is told first (an expired with_timeout).
            let timed = fiber::with_timeout(ms(5), || fiber::sleep(Duration::from_secs(10)));
            assert!(!matches!(timed, Ok(Ok(()))), "the sleep outlived its timeout");
            fiber::scope(|sc| {
                sc.spawn(|| {
                    l.store(true, SeqCst);
                    self_fed_loop(&s)
                });
            })
        });
        while !looping.load(SeqCst) {
            std::thread::sleep(ms(1));
        }
        h.cancel();
        let ended = came_within_limit(|| h.is_finished());
        stop.store(true, SeqCst);
        let how = h.join();
        drop(rt);
        assert!(ended, "the scope child kept looping for {LIMIT:?} ({how:?})");
    });
}
