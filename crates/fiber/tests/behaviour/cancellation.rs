//! One cancellation model (spec/jobs.md): every fiber runs in a job,
//! `JoinHandle::cancel` cancels that job, a job cancelled before it
//! finishes ends cancelled even if its closure returns a value, and every
//! parking operation is a cancellation point.

use fiber::chan;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Counts its drops.
#[derive(Debug)]
struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

#[test]
fn a_fiber_cancelled_before_it_finishes_ends_cancelled_even_if_it_returns_a_value() {
    let drops = Arc::new(AtomicUsize::new(0));
    let d = drops.clone();
    let cancelled = fiber::run(move || {
        let (started_tx, started_rx) = chan::bounded::<()>(1);
        let handle = fiber::spawn(move || {
            started_tx.send(()).unwrap();
            // Ignores the cancellation and returns a value anyway.
            let _ = fiber::sleep(Duration::from_secs(3600));
            Counted(d)
        });
        started_rx.recv().unwrap();
        handle.cancel();
        handle.join().unwrap_err().is_cancelled()
    });
    assert!(cancelled);
    assert_eq!(drops.load(Ordering::Relaxed), 1, "the value is dropped exactly once");
}

#[test]
fn a_fiber_that_cancels_itself_ends_cancelled() {
    let r = fiber::run(|| {
        fiber::spawn(|| {
            fiber::Job::current().cancel();
            assert!(fiber::is_cancelled());
            7
        })
        .join()
    });
    assert!(r.unwrap_err().is_cancelled());
}

#[test]
fn cancel_after_completion_is_a_no_op() {
    let r = fiber::run(|| {
        let h = fiber::spawn(|| 5);
        while !h.is_finished() {
            let _ = fiber::yield_now();
        }
        h.cancel();
        h.join()
    });
    assert_eq!(r.unwrap(), 5);
}

#[test]
fn a_panic_after_cancellation_is_a_panic() {
    let r = fiber::run(|| {
        fiber::spawn(|| {
            fiber::Job::current().cancel();
            panic!("after cancel");
        })
        .join()
    });
    assert!(r.unwrap_err().is_panic());
}

#[test]
fn a_fiber_that_only_yields_sees_its_cancellation() {
    let rounds = fiber::run(|| {
        let h = fiber::spawn(|| {
            let mut n = 0u64;
            loop {
                n += 1;
                if fiber::yield_now().is_err() {
                    return n;
                }
            }
        });
        let _ = fiber::sleep(ms(5));
        h.cancel();
        h.join()
    });
    assert!(rounds.unwrap_err().is_cancelled());
}

#[test]
fn sleep_loops_end_when_cancelled() {
    let r = fiber::run(|| {
        let h = fiber::spawn(|| -> Result<(), fiber::Cancelled> {
            loop {
                fiber::sleep(ms(1))?;
            }
        });
        let _ = fiber::sleep(ms(5));
        h.cancel();
        h.join()
    });
    assert!(r.unwrap_err().is_cancelled());
}

#[test]
fn join_handle_cancel_cancels_the_scopes_the_fiber_opened() {
    let children_cancelled = Arc::new(AtomicUsize::new(0));
    let c = children_cancelled.clone();
    let r = fiber::run(move || {
        let (_keep, rx) = chan::bounded::<u8>(0);
        let (ready_tx, ready_rx) = chan::bounded::<()>(4);
        let h = fiber::spawn(move || {
            fiber::scope(|s| {
                for _ in 0..4 {
                    let (rx, c, ready) = (rx.clone(), c.clone(), ready_tx.clone());
                    s.spawn(move || {
                        ready.send(()).unwrap();
                        if rx.recv().is_err() && fiber::is_cancelled() {
                            c.fetch_add(1, Ordering::Relaxed);
                        }
                    });
                }
            });
        });
        for _ in 0..4 {
            ready_rx.recv().unwrap();
        }
        h.cancel();
        h.join()
    });
    assert!(r.unwrap_err().is_cancelled());
    assert_eq!(children_cancelled.load(Ordering::Relaxed), 4);
}

#[test]
fn a_joiner_cancelled_while_waiting_gets_cancelled_and_the_joined_fiber_runs_on() {
    let (r, joined) = fiber::run(|| {
        let (release_tx, release_rx) = chan::bounded::<u8>(0);
        let target = fiber::spawn(move || release_rx.recv().unwrap());
        let target_handle = target.fiber();
        let _ = target_handle;
        let (inner_tx, inner_rx) = chan::bounded::<bool>(1);
        let joiner = fiber::spawn(move || {
            let r = target.join();
            inner_tx.send(r.is_err_and(|e| e.is_cancelled())).unwrap();
        });
        let _ = fiber::sleep(ms(5));
        joiner.cancel();
        let saw = inner_rx.recv().unwrap();
        // The target was not disturbed: it still takes its value.
        release_tx.send(9).unwrap();
        (saw, joiner.join().is_err())
    });
    assert!(r, "the joiner's join reported Cancelled");
    assert!(joined);
}

#[test]
fn with_timeout_reports_timed_out_when_the_block_overruns_without_yielding() {
    let r = fiber::run(|| {
        fiber::with_timeout(ms(20), || {
            // Busy, never at a cancellation point.
            let start = Instant::now();
            while start.elapsed() < ms(60) {
                std::hint::spin_loop();
            }
            3
        })
    });
    assert!(r.is_err(), "the deadline passed before the block returned");
}

#[test]
fn a_scoped_child_whose_job_is_cancelled_before_it_ends_reports_cancelled() {
    let drops = Arc::new(AtomicUsize::new(0));
    let d = drops.clone();
    let r = fiber::run(move || {
        fiber::scope(|s| {
            let h = s.spawn(move || {
                fiber::Job::current().cancel();
                Counted(d)
            });
            h.join().map(|_| ()).map_err(|e| e.is_cancelled())
        })
    });
    assert_eq!(r, Err(true));
    assert_eq!(drops.load(Ordering::Relaxed), 1);
}

#[test]
fn every_fiber_has_a_job_and_plain_threads_have_none() {
    let (active, cancelled) = fiber::run(|| {
        fiber::spawn(|| {
            let job = fiber::Job::current();
            (job.is_active(), job.is_cancelled())
        })
        .join()
        .unwrap()
    });
    assert!(active && !cancelled);
    assert!(fiber::Job::try_current().is_none());
}

#[test]
fn a_root_job_handed_to_another_fiber_can_be_joined() {
    let state = fiber::run(|| {
        let (tx, rx) = chan::bounded(1);
        let h = fiber::spawn(move || {
            tx.send(fiber::Job::current()).unwrap();
            let _ = fiber::sleep(ms(2));
        });
        let job = rx.recv().unwrap();
        let state = job.join().unwrap();
        h.join().unwrap();
        state
    });
    assert_eq!(state, fiber::JobState::Completed);
}

/// A joiner cancelled while it waits: its join reports a cancelled join
/// (`is_join_cancelled`, and `is_cancelled` as Kotlin's `join()` throws the
/// caller's cancellation), naming the joined fiber without calling it
/// cancelled; the joined fiber runs on to its end. A fiber that was itself
/// cancelled is not a cancelled join.
#[test]
fn a_cancelled_join_says_the_join_was_cancelled_not_the_joined_fiber() {
    fiber::run(|| {
        let (go_tx, go_rx) = chan::bounded::<()>(0);
        let (done_tx, done_rx) = chan::bounded::<u32>(1);
        let joined = fiber::spawn(move || {
            go_rx.recv().unwrap();
            done_tx.send(7).unwrap();
            7u32
        });
        let joined_id = joined.id();
        // The joiner ends cancelled (its value would be dropped): it hands
        // its join's error over first.
        let (err_tx, err_rx) = chan::bounded(1);
        let joiner = fiber::spawn(move || err_tx.send(joined.join().unwrap_err()).unwrap());
        // Parked in its join or not yet there: either way the join ends
        // cancelled.
        fiber::sleep(ms(20)).unwrap();
        joiner.cancel();
        let err = err_rx.recv().unwrap();
        assert!(joiner.join().unwrap_err().is_cancelled());
        assert!(err.is_cancelled() && err.is_join_cancelled(), "{err:?}");
        assert_eq!(err.id(), joined_id);
        let text = err.to_string();
        assert!(
            text.contains("the join of") && text.contains("the joining fiber was cancelled"),
            "{text}"
        );
        // The joined fiber was not cancelled: it runs on to its end.
        go_tx.send(()).unwrap();
        assert_eq!(done_rx.recv().unwrap(), 7);

        let sleeper = fiber::spawn(|| fiber::sleep(Duration::from_secs(3600)));
        sleeper.cancel();
        let err = sleeper.join().unwrap_err();
        assert!(err.is_cancelled() && !err.is_join_cancelled(), "{err:?}");
    });
}
