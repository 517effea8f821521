//! Adversarial review, round 53: the two newest shutdown commits.
//!
//! `b1eb204`: a runtime dropped on one of its own worker threads outside
//! its fibers (a hook, a thread-local destructor) hands its shutdown to a
//! thread of its own and returns at once. `a0940e6`: a worker that stops
//! at shutdown with a live fiber bound to it (pinned, or kept there for an
//! unwind) stays up (`serve_homed_fibers`) and resumes the fibers teardown
//! hands it (`FramePool::teardown_with_homes`), so their destructors run
//! on their home thread before its thread-locals go.
//!
//! Attacked here: workers that leave their loop by draining with a fiber
//! bound to them, pinned fibers inside `fiber::blocking` at a zero-grace
//! shutdown, pinned fibers first run by teardown itself and revived by the
//! reaper, nested runtimes dropped from a pinned fiber's destructor, a
//! runtime dropped from its own pinned fiber, pinned fibers that catch the
//! teardown unwind, a pinned `pinned(true)` scope spread over two workers,
//! a stuck worker beside a serving one, hooks that drop the runtime,
//! leaked threads, false reports on stderr and the shutdown's timing.
//!
//! Expected: what the README and spec/sched.md ("pinned fibers",
//! "Shutdown protocol") promise: a pinned fiber resumes only on its home
//! thread, every destructor runs once (or the fiber is reported given up),
//! no hang, no thread left behind, no false report.

use crate::common::shutdown::{counter, Tracked};
use crate::common::*;

use fiber::chan::unbounded;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

/// `fiber::spawn_pinned` from a plain thread (through a root fiber).
fn spawn_pinned_on<T: Send + 'static>(
    rt: &fiber::Runtime,
    f: impl FnOnce() -> T + Send + 'static,
) -> fiber::JoinHandle<T> {
    rt.block_on(move || fiber::spawn_pinned(f))
}

/// The number of threads of this process.
fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

/// Wait up to `secs` for the thread count to drop to `n` or below.
fn threads_settle_to(n: usize, secs: u64) -> usize {
    let start = Instant::now();
    loop {
        let now = thread_count();
        if now <= n || start.elapsed() > Duration::from_secs(secs) {
            return now;
        }
        std::thread::sleep(ms(10));
    }
}

/// Records, on drop, the thread it is dropped on and whether it was
/// created there.
struct HomeCheck {
    home: ThreadId,
    out: mpsc::Sender<(bool, &'static str)>,
    what: &'static str,
}

impl HomeCheck {
    fn new(what: &'static str, out: mpsc::Sender<(bool, &'static str)>) -> HomeCheck {
        HomeCheck {
            home: std::thread::current().id(),
            out,
            what,
        }
    }
}

impl Drop for HomeCheck {
    fn drop(&mut self) {
        let _ = self.out.send((std::thread::current().id() == self.home, self.what));
    }
}

// ---------------------------------------------------------------------------
// A worker that leaves its loop by draining, with a fiber bound to it.

/// An unpinned fiber blocks its worker past the idle timeout, so the
/// monitor drains that worker (a replacement starts). The fiber then
/// panics, and a destructor on its stack waits for a value a plain thread
/// sends only after a second: an unwinding fiber waits on its thread for
/// 200 ms, then parks there, kept on that worker for its unwind (its home
/// until it ends). The drained worker then leaves its loop (`run_loop`
/// checks DRAINING before anything else) although a fiber is bound to
/// it, and its thread exits. When the plain thread's value comes, the
/// fiber is woken, found by the other worker, sent "home" to a dead slot
/// and put in `Shared::orphans`: never resumed while the runtime runs, its
/// destructor never finishes, and at shutdown (`serve_homed_fibers` runs
/// for `Leave::Shutdown` only) it is given up.
// Failed before the fix: a worker drained by the monitor exits with a fiber kept on it for an unwind; the fiber is orphaned for good and its destructor never finishes
#[test]
fn a_fiber_kept_for_an_unwind_on_a_drained_worker_finishes_its_destructor() {
    in_child(
        "a_fiber_kept_for_an_unwind_on_a_drained_worker_finishes_its_destructor",
        60,
        || {
            within(40, || {
                struct WaitsInDrop {
                    rx: fiber::chan::Receiver<u32>,
                    done: mpsc::Sender<Option<u32>>,
                }
                impl Drop for WaitsInDrop {
                    fn drop(&mut self) {
                        let got = self.rx.recv().ok();
                        let _ = self.done.send(got);
                    }
                }
                let rt = fiber::Runtime::builder()
                    .workers(1)
                    .max_workers(2)
                    .idle_timeout(ms(50))
                    .shutdown_timeout(ms(200))
                    .build()
                    .unwrap();
                let (tx, rx) = unbounded::<u32>();
                let (done_tx, done_rx) = mpsc::channel();
                let h = rt.spawn(move || {
                    let _w = WaitsInDrop { rx, done: done_tx };
                    // No yield point for well past the idle timeout: the
                    // monitor drains this worker.
                    std::thread::sleep(ms(400));
                    panic!("boom (expected)");
                });
                // The value comes long after the fiber parked mid-unwind.
                let sender = std::thread::spawn(move || {
                    std::thread::sleep(ms(1500));
                    tx.send(7).unwrap();
                    tx
                });
                let got = done_rx.recv_timeout(Duration::from_secs(6));
                let _tx = sender.join().unwrap();
                let joined = std::thread::spawn(move || h.join().is_err());
                let stats = rt.stats();
                eprintln!("R53 drained: stats {stats:?}");
                drop(rt);
                let late = done_rx.recv_timeout(Duration::from_secs(3));
                assert_eq!(
                    got,
                    Ok(Some(7)),
                    "the destructor never got the value while the runtime ran (after drop: {late:?})"
                );
                assert!(joined.join().unwrap(), "the fiber's join reports its panic");
            })
        },
    );
}

// ---------------------------------------------------------------------------
// Pinned fibers the first teardown cannot finish.

/// A pinned fiber inside `fiber::blocking` when the runtime is shut down
/// with a zero grace: teardown cannot unwind it while the call borrows its
/// stack, so it is left for the reaper, which takes it back once the call
/// returns. By then its home worker has exited (the serving workers leave
/// as soon as the first teardown ends), so the reaper gives it up: its
/// destructors never run, and a plain thread receiving from the channel
/// whose `Sender` it owns waits for ever (the case review 51 fixed for
/// pinned fibers that are merely parked). An unpinned fiber in the same
/// place is unwound by the reaper (the control below).
fn pinned_fiber_in_blocking_at_zero_grace(scenario: &str, pinned: bool) {
    in_child(scenario, 60, move || {
        within(30, move || {
            let drops = counter();
            let rt = rt_fixed_grace(2, Duration::from_secs(5));
            let (tx, rx) = unbounded::<u32>();
            let (in_call_tx, in_call_rx) = mpsc::channel();
            let d = drops.clone();
            let body = move || {
                let _t = Tracked(d);
                let _tx = tx;
                fiber::blocking(move || {
                    let _ = in_call_tx.send(());
                    std::thread::sleep(ms(300));
                });
                stubborn_sleep();
            };
            if pinned {
                rt.block_on(move || drop(fiber::spawn_pinned(body)));
            } else {
                drop(rt.spawn(body));
            }
            in_call_rx.recv_timeout(Duration::from_secs(5)).unwrap();
            let receiver = std::thread::spawn(move || rx.recv());
            rt.shutdown_timeout(Duration::ZERO);
            let (done_tx, done_rx) = mpsc::channel();
            std::thread::spawn(move || done_tx.send(receiver.join().unwrap()));
            let got = done_rx.recv_timeout(Duration::from_secs(5));
            // The `Sender` is dropped before the `Tracked` declared ahead
            // of it: the receiver's end may be seen first.
            let t0 = Instant::now();
            while drops.load(SeqCst) == 0 && t0.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(ms(1));
            }
            assert_eq!(drops.load(SeqCst), 1, "the fiber's destructor never ran, or ran twice");
            assert!(got.is_ok(), "the plain thread's recv never ended");
        })
    });
}

/// Control: unpinned, the reaper unwinds the fiber once its call returns.
#[test]
fn an_unpinned_fiber_in_blocking_at_a_zero_grace_shutdown_is_unwound_later() {
    pinned_fiber_in_blocking_at_zero_grace(
        "an_unpinned_fiber_in_blocking_at_a_zero_grace_shutdown_is_unwound_later",
        false,
    );
}

// Failed before the fix: a pinned fiber inside fiber::blocking at shutdown is given up by the reaper (its home worker exited after the first teardown): destructors lost, a plain receiver of its Sender hangs
#[test]
fn a_pinned_fiber_in_blocking_at_a_zero_grace_shutdown_is_unwound_later() {
    pinned_fiber_in_blocking_at_zero_grace(
        "a_pinned_fiber_in_blocking_at_a_zero_grace_shutdown_is_unwound_later",
        true,
    );
}

/// A destructor run by teardown (the fiber unwinding on the thread that
/// drops the runtime) calls `fiber::blocking` for longer than teardown
/// waits: the fiber parks mid-unwind, kept on the teardown thread for its
/// unwind (std counts panics per OS thread), and is left for the reaper.
/// The reaper must not finish that unwind on its own thread: the dropping
/// thread would count as panicking for good, and the reaper's count would
/// go below zero.
#[test]
fn a_fiber_kept_on_the_teardown_thread_for_an_unwind_is_not_finished_elsewhere() {
    in_child(
        "a_fiber_kept_on_the_teardown_thread_for_an_unwind_is_not_finished_elsewhere",
        60,
        || {
            within(30, || {
                struct BlocksInDrop(mpsc::Sender<ThreadId>);
                impl Drop for BlocksInDrop {
                    fn drop(&mut self) {
                        fiber::blocking(|| std::thread::sleep(ms(600)));
                        let _ = self.0.send(std::thread::current().id());
                    }
                }
                let rt = rt_fixed_grace(2, ms(50));
                let (out_tx, out_rx) = mpsc::channel();
                drop(rt.spawn(move || {
                    let _b = BlocksInDrop(out_tx);
                    stubborn_sleep();
                }));
                wait_parked(&rt, 1);
                let dropper = std::thread::current().id();
                drop(rt);
                let panicking_after_drop = std::thread::panicking();
                let got = out_rx.recv_timeout(Duration::from_secs(5));
                eprintln!("R53 unwind kept on teardown thread: dropper {dropper:?}, got {got:?}");
                assert!(
                    !panicking_after_drop,
                    "the dropping thread counts as panicking after the drop"
                );
                if let Ok(on) = got {
                    assert_eq!(on, dropper, "the unwind was finished on another thread");
                }
            })
        },
    );
}

// ---------------------------------------------------------------------------
// Serving workers: threads, timing, reports.

/// Pinned fibers alive after the grace time on both workers: each worker
/// stays up for teardown, unwinds its fibers on its own thread, then exits;
/// the drop returns promptly, every destructor runs once on its home
/// thread, no thread is left behind and nothing false is reported.
#[test]
fn pinned_fibers_on_both_workers_leave_no_thread_and_no_report() {
    let out = child_outcome(
        "pinned_fibers_on_both_workers_leave_no_thread_and_no_report",
        60,
        &[],
        || {
            within(30, || {
                let before = thread_count();
                let rt = rt_fixed_grace(2, ms(100));
                let (out_tx, out_rx) = mpsc::channel();
                let (started_tx, started_rx) = mpsc::channel();
                let gate = Arc::new(std::sync::Barrier::new(2));
                for _ in 0..2 {
                    let out = out_tx.clone();
                    let started = started_tx.clone();
                    let gate = gate.clone();
                    // Both first runs meet at a plain barrier: one on each
                    // worker.
                    drop(spawn_pinned_on(&rt, move || {
                        let _h = HomeCheck::new("pinned", out);
                        let _ = started.send(std::thread::current().id());
                        gate.wait();
                        stubborn_sleep();
                    }));
                }
                drop(out_tx);
                let a = started_rx.recv_timeout(Duration::from_secs(5)).unwrap();
                let b = started_rx.recv_timeout(Duration::from_secs(5)).unwrap();
                assert_ne!(a, b, "one pinned fiber on each worker");
                wait_parked(&rt, 2);
                let start = Instant::now();
                drop(rt);
                let took = start.elapsed();
                let got: Vec<_> = out_rx.iter().collect();
                assert_eq!(got, vec![(true, "pinned"); 2], "each destructor once, at home");
                assert!(took < Duration::from_secs(1), "the drop took {took:?}");
                let after = threads_settle_to(before, 5);
                assert!(after <= before, "threads before {before}, after {after}");
            })
        },
    );
    if let Some((status, stderr)) = out {
        assert!(status.success(), "child failed ({status:?}):\n{stderr}");
        for false_report in ["did not stop", "could not be unwound", "failed while unwinding"] {
            assert!(!stderr.contains(false_report), "a false report:\n{stderr}");
        }
    }
}

/// A shutdown with no pinned fiber does not wait for anything new: 2 000
/// parked stubborn fibers on two workers and a zero grace (the workers'
/// `any_homed_at` scans of the pool, the channels made for them).
#[test]
fn a_zero_grace_shutdown_with_no_pinned_fiber_stays_fast() {
    within(60, || {
        let mut worst = Duration::ZERO;
        for _ in 0..3 {
            let rt = rt_fixed_grace(2, Duration::from_secs(10));
            for _ in 0..2000 {
                drop(rt.spawn(stubborn_sleep));
            }
            wait_parked(&rt, 2000);
            let start = Instant::now();
            rt.shutdown_timeout(Duration::ZERO);
            worst = worst.max(start.elapsed());
        }
        assert!(worst < Duration::from_millis(1500), "a shutdown took {worst:?}");
    });
}

/// A worker stuck in a fiber without a yield point at shutdown beside a
/// worker that stays up for its pinned fiber: the stuck one is reported
/// (truly), the pinned fiber is unwound at home meanwhile, and the stuck
/// fiber's end lets its worker go; no thread is left behind.
#[test]
fn a_stuck_worker_beside_a_serving_one() {
    let out = child_outcome("a_stuck_worker_beside_a_serving_one", 60, &[], || {
        within(40, || {
            let before = thread_count();
            let rt = rt_fixed_grace(2, ms(50));
            let (out_tx, out_rx) = mpsc::channel();
            let (home_tx, home_rx) = mpsc::channel();
            let release = Arc::new(AtomicBool::new(false));
            let spinning = Arc::new(AtomicBool::new(false));
            let r = release.clone();
            let s = spinning.clone();
            let ran = spawn_pinned_on(&rt, move || {
                let _h = HomeCheck::new("pinned", out_tx);
                let _ = home_tx.send(std::thread::current().id());
                stubborn_sleep();
            });
            let home = home_rx.recv_timeout(Duration::from_secs(5)).unwrap();
            wait_parked(&rt, 1);
            drop(rt.spawn(move || {
                s.store(true, SeqCst);
                // No yield point until released.
                while !r.load(SeqCst) {
                    std::hint::spin_loop();
                }
            }));
            assert!(spin_until(&spinning, Duration::from_secs(5)), "the spinner never ran");
            let releaser = {
                let release = release.clone();
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_secs(3));
                    release.store(true, SeqCst);
                })
            };
            drop(rt);
            let got = out_rx.recv_timeout(Duration::from_secs(5));
            assert_eq!(
                got,
                Ok((true, "pinned")),
                "the pinned fiber was unwound at home ({home:?})"
            );
            assert!(ran.join().is_err(), "the pinned fiber ended cancelled");
            releaser.join().unwrap();
            let after = threads_settle_to(before, 10);
            assert!(after <= before, "threads before {before}, after {after}");
        })
    });
    if let Some((status, stderr)) = out {
        assert!(status.success(), "child failed ({status:?}):\n{stderr}");
        assert!(
            stderr.contains("did not stop"),
            "the stuck worker is reported:\n{stderr}"
        );
        assert!(!stderr.contains("failed while unwinding"), "a false report:\n{stderr}");
    }
}

// ---------------------------------------------------------------------------
// Pinned fibers doing odd things at teardown.

/// `Builder::pinned(true)`: a scope owner and its children are all pinned,
/// spread over both workers, all ignoring cancellation. Teardown unwinds
/// the children (each on its own home) before their owner (on its home).
#[test]
fn a_pinned_runtimes_scope_spread_over_two_workers_is_unwound_at_home() {
    in_child(
        "a_pinned_runtimes_scope_spread_over_two_workers_is_unwound_at_home",
        60,
        || {
            within(30, || {
                let rt = fiber::Runtime::builder()
                    .workers(2)
                    .max_workers(2)
                    .pinned(true)
                    .shutdown_timeout(ms(100))
                    .build()
                    .unwrap();
                let (out_tx, out_rx) = mpsc::channel();
                let homes = Arc::new(Mutex::new(Vec::new()));
                let hs = homes.clone();
                drop(rt.spawn(move || {
                    let _h = HomeCheck::new("owner", out_tx.clone());
                    hs.lock().unwrap().push(std::thread::current().id());
                    fiber::scope(|s| {
                        for _ in 0..6 {
                            let out = out_tx.clone();
                            let hs = hs.clone();
                            s.spawn(move || {
                                let _h = HomeCheck::new("child", out);
                                hs.lock().unwrap().push(std::thread::current().id());
                                // Keep the worker a moment: the others go
                                // to the second worker.
                                std::thread::sleep(ms(5));
                                stubborn_sleep();
                            });
                        }
                    });
                }));
                wait_parked(&rt, 7);
                let mut distinct = homes.lock().unwrap().clone();
                distinct.sort_by_key(|t| format!("{t:?}"));
                distinct.dedup();
                eprintln!("R53 pinned scope homes: {} threads", distinct.len());
                drop(rt);
                let got: Vec<_> = out_rx.iter().collect();
                assert_eq!(got.len(), 7, "every destructor once: {got:?}");
                assert!(got.iter().all(|(home, _)| *home), "unwound off its home: {got:?}");
                assert_eq!(got[6].1, "owner", "the owner after its children: {got:?}");
            })
        },
    );
}

/// A pinned fiber that catches the teardown unwind and waits again, for
/// ever: teardown gives it up after its bound (reported), its home worker
/// still exits, and the drop returns.
#[test]
fn a_pinned_fiber_that_catches_every_teardown_unwind_is_given_up() {
    let out = child_outcome(
        "a_pinned_fiber_that_catches_every_teardown_unwind_is_given_up",
        60,
        &[],
        || {
            within(30, || {
                let before = thread_count();
                let rt = rt_fixed_grace(2, ms(50));
                let caught = counter();
                let c = caught.clone();
                rt.block_on(move || {
                    drop(fiber::spawn_pinned(move || loop {
                        let r = std::panic::catch_unwind(stubborn_sleep);
                        if r.is_err() {
                            c.fetch_add(1, SeqCst);
                        }
                    }));
                });
                wait_parked(&rt, 1);
                let start = Instant::now();
                drop(rt);
                let took = start.elapsed();
                assert!(took < Duration::from_secs(3), "the drop took {took:?}");
                assert!(caught.load(SeqCst) >= 1, "the fiber was never unwound at home");
                let after = threads_settle_to(before, 5);
                assert!(after <= before, "threads before {before}, after {after}");
            })
        },
    );
    if let Some((status, stderr)) = out {
        assert!(status.success(), "child failed ({status:?}):\n{stderr}");
        assert!(
            stderr.contains("could not be unwound"),
            "the give-up is reported:\n{stderr}"
        );
        assert!(!stderr.contains("did not stop"), "a false report:\n{stderr}");
    }
}

/// A pinned fiber that catches the teardown unwind, then panics with a
/// payload of its own: it ends (failed) on its home worker, which survives
/// to exit normally; a plain thread's join gets an error.
#[test]
fn a_pinned_fiber_that_panics_after_catching_the_teardown_unwind() {
    let out = child_outcome(
        "a_pinned_fiber_that_panics_after_catching_the_teardown_unwind",
        60,
        &[],
        || {
            within(30, || {
                let rt = rt_fixed_grace(2, ms(50));
                let (out_tx, out_rx) = mpsc::channel();
                let h = spawn_pinned_on(&rt, move || {
                    let _h = HomeCheck::new("pinned", out_tx);
                    let _ = std::panic::catch_unwind(stubborn_sleep);
                    panic!("its own panic after teardown (expected)");
                });
                wait_parked(&rt, 1);
                let joiner = std::thread::spawn(move || h.join().is_err());
                drop(rt);
                assert_eq!(out_rx.recv_timeout(Duration::from_secs(5)), Ok((true, "pinned")));
                assert!(joiner.join().unwrap(), "the join reports the failure");
            })
        },
    );
    if let Some((status, stderr)) = out {
        assert!(status.success(), "child failed ({status:?}):\n{stderr}");
        assert!(!stderr.contains("failed while unwinding"), "a false report:\n{stderr}");
        assert!(!stderr.contains("could not be unwound"), "a false report:\n{stderr}");
    }
}

/// A pinned fiber that loops on `yield_now` (never parks, ignores its
/// cancellation) when the runtime is shut down with a zero grace: its home
/// worker leaves its loop with the fiber queued, stays up for it, and
/// teardown unwinds it there; the drop returns at once.
#[test]
fn a_yielding_pinned_fiber_at_a_zero_grace_shutdown_is_unwound_at_home() {
    in_child(
        "a_yielding_pinned_fiber_at_a_zero_grace_shutdown_is_unwound_at_home",
        60,
        || {
            within(30, || {
                for _ in 0..5 {
                    let rt = rt_fixed_grace(2, ms(50));
                    let (out_tx, out_rx) = mpsc::channel();
                    let (run_tx, run_rx) = mpsc::channel();
                    drop(spawn_pinned_on(&rt, move || {
                        let _h = HomeCheck::new("pinned", out_tx);
                        let _ = run_tx.send(());
                        loop {
                            let _ = fiber::yield_now();
                        }
                    }));
                    run_rx.recv_timeout(Duration::from_secs(5)).unwrap();
                    let start = Instant::now();
                    rt.shutdown_timeout(Duration::ZERO);
                    let took = start.elapsed();
                    assert_eq!(out_rx.recv_timeout(Duration::from_secs(5)), Ok((true, "pinned")));
                    assert!(took < Duration::from_secs(1), "the drop took {took:?}");
                }
            })
        },
    );
}

// ---------------------------------------------------------------------------
// Runtimes dropped in odd places.

/// A pinned fiber of runtime A owns runtime B (built `pinned(true)`), whose
/// own fiber ignores cancellation. Dropping A unwinds the pinned fiber on
/// its home worker, which drops B there mid-unwind (B's shutdown runs on a
/// thread of its own, as for any drop on a panicking thread): B's fiber is
/// unwound on its own home. Every destructor once, each at home.
#[test]
fn a_nested_runtime_dropped_by_a_pinned_fibers_unwind() {
    in_child("a_nested_runtime_dropped_by_a_pinned_fibers_unwind", 60, || {
        within(30, || {
            let outer = rt_fixed_grace(2, ms(50));
            let (out_tx, out_rx) = mpsc::channel();
            let (ready_tx, ready_rx) = mpsc::channel();
            drop(spawn_pinned_on(&outer, move || {
                let _h = HomeCheck::new("outer", out_tx.clone());
                let inner = fiber::Runtime::builder()
                    .workers(1)
                    .max_workers(1)
                    .pinned(true)
                    .shutdown_timeout(ms(50))
                    .build()
                    .unwrap();
                let out = out_tx.clone();
                drop(inner.spawn(move || {
                    let _h = HomeCheck::new("inner", out);
                    stubborn_sleep();
                }));
                wait_parked(&inner, 1);
                let _inner = inner;
                let _ = ready_tx.send(());
                stubborn_sleep();
            }));
            ready_rx.recv_timeout(Duration::from_secs(5)).unwrap();
            wait_parked(&outer, 1);
            drop(outer);
            let mut got: Vec<_> = out_rx.iter().collect();
            got.sort();
            assert_eq!(got, vec![(true, "inner"), (true, "outer")]);
        })
    });
}

/// A pinned fiber drops its own runtime (taken from a global slot): the
/// drop panics naming the misuse and the shutdown goes on, on a thread of
/// its own; the fiber catches the panic and then ignores cancellation. The
/// handed-off shutdown unwinds it on its home worker, and every thread
/// exits.
#[test]
fn a_pinned_fiber_that_drops_its_own_runtime_is_unwound_at_home() {
    static SLOT: Mutex<Option<fiber::Runtime>> = Mutex::new(None);
    in_child(
        "a_pinned_fiber_that_drops_its_own_runtime_is_unwound_at_home",
        60,
        || {
            within(30, || {
                let before = thread_count();
                let rt = rt_fixed_grace(2, ms(50));
                let (out_tx, out_rx) = mpsc::channel();
                let (msg_tx, msg_rx) = mpsc::channel();
                let handle = rt.handle();
                *SLOT.lock().unwrap() = Some(rt);
                let h = handle.block_on(move || {
                    fiber::spawn_pinned(move || {
                        let _h = HomeCheck::new("pinned", out_tx);
                        let rt = SLOT.lock().unwrap().take().unwrap();
                        let _ = msg_tx.send(panic_message(move || drop(rt)));
                        stubborn_sleep();
                    })
                });
                let msg = msg_rx.recv_timeout(Duration::from_secs(5)).unwrap();
                assert!(
                    msg.as_deref().is_some_and(|m| m.contains("cannot wait for itself")),
                    "{msg:?}"
                );
                assert_eq!(out_rx.recv_timeout(Duration::from_secs(5)), Ok((true, "pinned")));
                assert!(h.join().is_err(), "the fiber ended cancelled");
                let after = threads_settle_to(before, 5);
                assert!(after <= before, "threads before {before}, after {after}");
            })
        },
    );
}

/// b1eb204: the runtime, kept in a global slot, is dropped by its own
/// `on_thread_start` hook as the monitor grows a worker: on its worker
/// thread outside its loop. The drop returns at once, the shutdown goes on
/// on a thread of its own (the new worker leaves its loop at once), the
/// fiber the root waits on is cancelled, and no thread is left behind and
/// nothing false is reported.
#[test]
fn a_runtime_dropped_by_its_own_on_thread_start_hook_at_growth() {
    static SLOT: Mutex<Option<fiber::Runtime>> = Mutex::new(None);
    static TOOK: Mutex<Option<Duration>> = Mutex::new(None);
    let out = child_outcome(
        "a_runtime_dropped_by_its_own_on_thread_start_hook_at_growth",
        60,
        &[],
        || {
            within(40, || {
                let before = thread_count();
                let rt = fiber::Runtime::builder()
                    .workers(1)
                    .max_workers(2)
                    .idle_timeout(ms(50))
                    .shutdown_timeout(ms(100))
                    .on_thread_start(|| {
                        let taken = SLOT.lock().unwrap().take();
                        if let Some(rt) = taken {
                            let start = Instant::now();
                            drop(rt);
                            *TOOK.lock().unwrap() = Some(start.elapsed());
                        }
                    })
                    .build()
                    .unwrap();
                let handle = rt.handle();
                *SLOT.lock().unwrap() = Some(rt);
                let drops = counter();
                // Made outside the fiber: dropped whether or not the
                // fiber starts before the shutdown.
                let t = Tracked(drops.clone());
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    handle.block_on(move || {
                        let other = fiber::spawn(move || {
                            let _t = t;
                            stubborn_sleep();
                        });
                        // Hold the only worker without a yield point: the
                        // monitor grows a second one for `other`.
                        std::thread::sleep(ms(300));
                        other.join().is_err()
                    })
                }));
                eprintln!("R53 on_thread_start drop: block_on gave {r:?}");
                let start = Instant::now();
                while TOOK.lock().unwrap().is_none() {
                    assert!(start.elapsed() < Duration::from_secs(20), "no worker grew");
                    std::thread::sleep(ms(10));
                }
                let took = TOOK.lock().unwrap().unwrap();
                assert!(took < Duration::from_millis(500), "the drop in the hook took {took:?}");
                let start = Instant::now();
                while drops.load(SeqCst) == 0 && start.elapsed() < Duration::from_secs(10) {
                    std::thread::sleep(ms(10));
                }
                assert_eq!(drops.load(SeqCst), 1, "the fiber's destructor ran once");
                assert!(matches!(r, Ok(true)), "the root saw its child cancelled: {r:?}");
                let after = threads_settle_to(before, 10);
                assert!(after <= before, "threads before {before}, after {after}");
            })
        },
    );
    if let Some((status, stderr)) = out {
        assert!(status.success(), "child failed ({status:?}):\n{stderr}");
        for false_report in ["did not stop", "could not be unwound", "could not start its shutdown"] {
            assert!(!stderr.contains(false_report), "a false report:\n{stderr}");
        }
    }
}
