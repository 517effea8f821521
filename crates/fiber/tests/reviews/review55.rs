//! Adversarial review, round 55: the newest commit `9082835`.
//!
//! `9082835`: a tell records whether its scope's deadline had passed, so a
//! deadline passing later in the same scope is told after a task tell; a
//! tell inside `non_cancellable` is not recorded as the task's; serving
//! workers that no fiber still to be unwound is bound to exit before the
//! reaper ends (`Homes::close_unneeded`, `FramePool::any_homed_at`); an
//! undone drain is counted back.
//!
//! Attacked here: clean-up after a task tell that runs a `non_cancellable`
//! section with an expiring `with_timeout` inside (no send after it may be
//! cut: the task was told already), nested `with_timeout` +
//! `non_cancellable` loops (each passed deadline is told, once), sends in
//! a scope whose deadline has not passed after the task tell, and a pinned
//! fiber whose unwind makes a second blocking call after the reaper's
//! first round (its home must stay up for it).
//!
//! Expected: what spec/lifecycle.md (operation budget, non_cancellable,
//! teardown) and spec/sched.md (shutdown, serving workers) promise.

use crate::common::budget::{after_handle_cancel, self_fed_loop, sends_made};
use crate::common::shutdown::{counted_rt, stops_within};
use crate::common::*;

use std::sync::atomic::AtomicUsize;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------
// (a) Tells after a task tell, `non_cancellable`, nested deadlines.

// Failed before the fix: a tell inside non_cancellable overwrites an earlier task tell with task=false, so the already-told task cancellation is told again after the section and a clean-up send is cut
#[test]
fn a_told_task_is_not_told_again_after_a_section_whose_with_timeout_expired() {
    let (inner, after) = after_handle_cancel(|res| {
        // Told: the task's cancellation. What follows is clean-up.
        assert!(fiber::sleep(Duration::from_secs(10)).is_err());
        // A bounded, uncancellable step of the clean-up: its deadline ends
        // its wait (told inside the section).
        let inner =
            fiber::non_cancellable(|| fiber::with_timeout(ms(5), || fiber::sleep(Duration::from_secs(10)).is_err()));
        // Back in the root scope: no new deadline has passed, and the
        // task's cancellation was told before the section.
        let after = sends_made(2000);
        let _ = res.send((inner.is_err() || inner == Ok(true), after));
    });
    assert!(inner, "the section's with_timeout ended its wait");
    assert_eq!(
        after, 2000,
        "a clean-up send after the section was cut: the task's cancellation, told before it, was told again"
    );
}

// Failed before the fix: same defect reached through a budget look inside the section (a loop bounded by a with_timeout under non_cancellable), not a wait
#[test]
fn a_told_task_is_not_told_again_after_a_section_whose_loop_hit_its_deadline() {
    let (ended, after) = after_handle_cancel(|res| {
        assert!(fiber::sleep(Duration::from_secs(10)).is_err());
        let mut ended = None;
        fiber::non_cancellable(|| {
            let _ = fiber::with_timeout(ms(5), || ended = self_fed_loop(Duration::from_secs(2)));
        });
        let after = sends_made(2000);
        let _ = res.send((ended, after));
    });
    assert!(ended.is_some(), "the loop in the section ended at its deadline");
    assert_eq!(after, 2000, "a clean-up send after the section was cut");
}

/// Control: the same clean-up without the `with_timeout` in the section
/// (nothing told inside it) cuts no send after it.
#[test]
fn a_told_task_runs_a_plain_section_then_sends_without_a_cut() {
    let (held, after) = after_handle_cancel(|res| {
        assert!(fiber::sleep(Duration::from_secs(10)).is_err());
        let held = fiber::non_cancellable(|| {
            fiber::sleep(ms(5)).unwrap();
            sends_made(2000)
        });
        let after = sends_made(2000);
        let _ = res.send((held, after));
    });
    assert_eq!(held, 2000, "a send inside non_cancellable was cut");
    assert_eq!(after, 2000, "a send after the section was cut");
}

/// After the task tell inside a `with_timeout` whose deadline has not
/// passed, sends in that scope are not cut; once the deadline passes the
/// loop in it ends (told once), and the sends after the `with_timeout`
/// returned are not cut.
#[test]
fn after_a_task_tell_in_a_scope_sends_are_cut_only_by_its_deadline() {
    let (before, ended, after) = after_handle_cancel(|res| {
        let mut before = 0;
        let mut ended = None;
        let _ = fiber::with_timeout(ms(150), || {
            assert!(fiber::sleep(Duration::from_secs(10)).is_err(), "the task's tell");
            before = sends_made(2000);
            ended = self_fed_loop(Duration::from_secs(3));
        });
        let after = sends_made(2000);
        let _ = res.send((before, ended, after));
    });
    assert_eq!(before, 2000, "a send cut before the scope's deadline passed");
    assert!(ended.is_some(), "the deadline passing later never ended the loop");
    assert_eq!(after, 2000, "a send after the with_timeout was cut");
}

/// No task cancellation: an outer `with_timeout` held off by a
/// `non_cancellable` section in which an inner `with_timeout` expired;
/// after the section, a loop still ends at the outer deadline, and the
/// section's sends after the inner deadline are not cut.
#[test]
fn an_outer_deadline_held_off_by_a_section_is_told_after_it() {
    within(30, || {
        let (ended_inner, held, ended_outer, took) = rt1().block_on(|| {
            let t0 = Instant::now();
            let mut ended_inner = None;
            let mut held = 0;
            let mut ended_outer = None;
            let _ = fiber::with_timeout(ms(60), || {
                fiber::non_cancellable(|| {
                    let _ = fiber::with_timeout(ms(5), || ended_inner = self_fed_loop(Duration::from_secs(2)));
                    // The outer deadline passes here, held off.
                    fiber::sleep(ms(80)).unwrap();
                    held = sends_made(2000);
                });
                ended_outer = self_fed_loop(Duration::from_secs(2));
            });
            (ended_inner, held, ended_outer, t0.elapsed())
        });
        assert!(ended_inner.is_some(), "the inner deadline never ended its loop");
        assert_eq!(held, 2000, "a send inside the section was cut");
        assert!(
            ended_outer.is_some() && took < Duration::from_secs(1),
            "the outer deadline, held off by the section, never ended the loop after it ({ended_outer:?}, {took:?})"
        );
    });
}

/// Nested `with_timeout`s in clean-up after the task tell, the inner one
/// inside a `non_cancellable` section with no deadline of its own passing:
/// the outer deadline (passed while held off) ends the loop after the
/// section, and nothing after the outer `with_timeout` is cut.
#[test]
fn a_clean_up_deadline_held_off_by_a_section_is_told_after_it_once() {
    let (ended, after) = after_handle_cancel(|res| {
        assert!(fiber::sleep(Duration::from_secs(10)).is_err());
        let mut ended = None;
        let _ = fiber::with_timeout(ms(20), || {
            fiber::non_cancellable(|| {
                let _ = fiber::with_timeout(Duration::from_secs(3600), || fiber::sleep(ms(40)).unwrap());
            });
            ended = self_fed_loop(Duration::from_secs(2));
        });
        let after = sends_made(2000);
        let _ = res.send((ended, after));
    });
    assert!(ended.is_some(), "the passed outer deadline never ended the loop");
    assert_eq!(after, 2000, "a send after the outer with_timeout was cut");
}

// ---------------------------------------------------------------------------
// (b) Serving workers at shutdown.

/// A pinned fiber in a blocking call at shutdown whose unwind (a
/// destructor) makes a second blocking call: after the reaper's round that
/// resumed it, it is given up for later again and its home must stay up
/// (not closed as unneeded); the rest of the destructor runs on the home
/// thread, and then the home's hook runs.
#[test]
fn a_pinned_fibers_second_blocking_call_in_its_unwind_keeps_its_home() {
    in_child(
        "a_pinned_fibers_second_blocking_call_in_its_unwind_keeps_its_home",
        60,
        || {
            within(30, || {
                let stops = Arc::new(AtomicUsize::new(0));
                let rt = counted_rt(&stops);
                let (in_call_tx, in_call_rx) = mpsc::channel();
                let (home_tx, home_rx) = mpsc::channel();
                rt.block_on(move || {
                    drop(fiber::spawn_pinned(move || {
                        struct Home(std::thread::ThreadId, mpsc::Sender<(bool, bool)>);
                        impl Drop for Home {
                            fn drop(&mut self) {
                                let before = std::thread::current().id() == self.0;
                                // A last flush that blocks, in the unwind.
                                fiber::blocking(|| std::thread::sleep(ms(400)));
                                let after = std::thread::current().id() == self.0;
                                let _ = self.1.send((before, after));
                            }
                        }
                        let _h = Home(std::thread::current().id(), home_tx);
                        fiber::blocking(move || {
                            let _ = in_call_tx.send(());
                            std::thread::sleep(ms(400));
                        });
                        stubborn_sleep();
                    }))
                });
                in_call_rx.recv_timeout(Duration::from_secs(5)).unwrap();
                drop(rt);
                assert!(
                    stops_within(&stops, 1, Duration::from_secs(1)) >= 1,
                    "the worker with no fiber bound exits"
                );
                assert_eq!(
                    home_rx.recv_timeout(Duration::from_secs(5)),
                    Ok((true, true)),
                    "the destructor ran, wholly on its home thread"
                );
                assert_eq!(
                    stops_within(&stops, 2, Duration::from_secs(4)),
                    2,
                    "the home's hook ran"
                );
            })
        },
    );
}

/// Two pinned fibers in blocking calls of different lengths at shutdown
/// (homes as they fall): each is unwound on its own home thread, and
/// every hook runs once the calls returned.
#[test]
fn pinned_fibers_in_blocking_calls_of_different_lengths_are_each_unwound_at_home() {
    in_child(
        "pinned_fibers_in_blocking_calls_of_different_lengths_are_each_unwound_at_home",
        60,
        || {
            within(30, || {
                let stops = Arc::new(AtomicUsize::new(0));
                let rt = counted_rt(&stops);
                let (in_call_tx, in_call_rx) = mpsc::channel();
                let (home_tx, home_rx) = mpsc::channel();
                for len in [150u64, 700] {
                    let in_call_tx = in_call_tx.clone();
                    let home_tx = home_tx.clone();
                    drop(rt.spawn(move || {
                        drop(fiber::spawn_pinned(move || {
                            struct Home(std::thread::ThreadId, mpsc::Sender<bool>);
                            impl Drop for Home {
                                fn drop(&mut self) {
                                    let _ = self.1.send(std::thread::current().id() == self.0);
                                }
                            }
                            let _h = Home(std::thread::current().id(), home_tx);
                            fiber::blocking(move || {
                                let _ = in_call_tx.send(());
                                std::thread::sleep(ms(len));
                            });
                            stubborn_sleep();
                        }));
                    }));
                }
                for _ in 0..2 {
                    in_call_rx.recv_timeout(Duration::from_secs(5)).unwrap();
                }
                drop(rt);
                for _ in 0..2 {
                    assert_eq!(
                        home_rx.recv_timeout(Duration::from_secs(5)),
                        Ok(true),
                        "a pinned fiber was unwound off its home (or never)"
                    );
                }
                assert_eq!(stops_within(&stops, 2, Duration::from_secs(4)), 2, "every hook ran");
            })
        },
    );
}
