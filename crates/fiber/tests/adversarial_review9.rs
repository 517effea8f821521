//! Adversarial review 9: structured concurrency (fiber-jobs) against
//! kotlinx.coroutines' documented job rules, and fiber::sync against Go's
//! `sync` and std's rules, in combinations: cancellation racing completion
//! with exact accounting (every job ends once, in one state, and the
//! process-wide counters agree with what the joins report), nested
//! supervisor / scope / with_timeout with explicit cancels at each level,
//! failures while the parent is already cancelling, `Job` handles used from
//! plain threads and from another runtime, jobs that outlive their runtime,
//! and sync primitives used across cancellation by fibers and threads.
//!
//! Every test takes `SERIAL`: the job counters are process-wide, so the
//! tests that compare counter deltas must not overlap with other tests of
//! this binary.

#![allow(clippy::type_complexity)]
use fiber::chan;
use fiber::sync::{Barrier, Condvar, Mutex, Semaphore, WaitGroup};
use fiber::{CancelReason, Job, JobState};
use std::panic::{catch_unwind, panic_any, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
use common::{ms, within};

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Job counters, read from inside a fiber.
fn jobs() -> fiber::JobStats {
    fiber::stats().jobs
}

fn delta(a: fiber::JobStats, b: fiber::JobStats) -> fiber::JobStats {
    fiber::JobStats {
        jobs_created: b.jobs_created - a.jobs_created,
        cancellations_requested: b.cancellations_requested - a.cancellations_requested,
        jobs_completed: b.jobs_completed - a.jobs_completed,
        jobs_failed: b.jobs_failed - a.jobs_failed,
        jobs_cancelled: b.jobs_cancelled - a.jobs_cancelled,
        waiters_registered: b.waiters_registered - a.waiters_registered,
        waiters_woken: b.waiters_woken - a.waiters_woken,
    }
}

/// Silence the default panic hook while `f` runs (intended panics by the
/// thousand would flood stderr). Tests are serialized, so the swap is safe.
fn quiet<T>(f: impl FnOnce() -> T) -> T {
    let old = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = catch_unwind(AssertUnwindSafe(f));
    std::panic::set_hook(old);
    match r {
        Ok(v) => v,
        Err(p) => std::panic::resume_unwind(p),
    }
}

fn park_until_cancelled() {
    while fiber::sleep(Duration::from_secs(60)).is_ok() {}
}

fn wait_until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "timed out waiting for: {what}");
        if fiber::core::in_fiber() {
            let _ = fiber::non_cancellable(|| fiber::sleep(ms(1)));
        } else {
            std::thread::sleep(ms(1));
        }
    }
}

struct Counted(Arc<AtomicUsize>);
impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[derive(Debug)]
struct E(&'static str);

// ---------------------------------------------------------------------------
// Cancellation racing completion, exact accounting
// ---------------------------------------------------------------------------

/// Kotlin (Job docs): a job ends in exactly one final state; `cancel` of a
/// completed job has no effect. Here a plain thread cancels a scoped child
/// at the instant its body returns a value, 10,000 times. Each round: the
/// scope's join reports `Ok` iff the child's job ended COMPLETED, `Err`
/// (cancelled, not a panic) iff it ended CANCELLED with reason `Cancelled`;
/// the thread's own `Job::join` (a plain thread blocking) reports the same
/// state; the value is dropped exactly once; the scope itself completes.
/// Counters: every job created ends, none fails, and exactly one
/// cancellation request is counted per job that ends CANCELLED.
#[test]
fn scoped_child_returning_while_a_thread_cancels_it_10k_rounds_exact_accounting() {
    let _s = serial();
    within(600, || {
        let rt = common::rt();
        let (to_thread, from_owner) = std::sync::mpsc::channel::<(Job, Arc<AtomicBool>)>();
        let (ack_tx, ack_rx) = chan::unbounded::<JobState>();
        let canceller = std::thread::spawn(move || {
            for (job, go) in from_owner {
                go.store(true, Ordering::Release);
                job.cancel();
                // A plain thread blocks in Job::join until the job ends.
                let state = job.join().expect("a plain thread's join is not cancelled");
                ack_tx.send(state).unwrap();
            }
        });
        rt.block_on(move || {
            let _ = Job::current();
            const N: usize = 10_000;
            let drops = Arc::new(AtomicUsize::new(0));
            let before = jobs();
            let (mut ok, mut cancelled) = (0usize, 0usize);
            let mut bad = Vec::new();
            for round in 0..N {
                let slot: Arc<std::sync::Mutex<Option<Job>>> = Default::default();
                let (res, scope_job) = fiber::scope(|s| {
                    let (slot, tx, drops) = (slot.clone(), to_thread.clone(), drops.clone());
                    let h = s.spawn(move || {
                        let me = Job::current();
                        *slot.lock().unwrap() = Some(me.clone());
                        let go = Arc::new(AtomicBool::new(false));
                        tx.send((me, go.clone())).unwrap();
                        while !go.load(Ordering::Acquire) {
                            std::hint::spin_loop();
                        }
                        Counted(drops)
                    });
                    (h.join(), s.job())
                });
                let thread_state = ack_rx.recv().unwrap();
                let job = slot.lock().unwrap().take().unwrap();
                let state = job.state();
                match &res {
                    Ok(_) => {
                        ok += 1;
                        if state != JobState::Completed || job.cancel_reason().is_some() {
                            bad.push(format!(
                                "round {round}: join Ok but job {state:?} {:?}",
                                job.cancel_reason()
                            ));
                        }
                    }
                    Err(e) => {
                        cancelled += 1;
                        if !e.is_cancelled() || e.is_panic() || e.is_timed_out() || e.is_join_cancelled() {
                            bad.push(format!("round {round}: join error {e:?}"));
                        }
                        if state != JobState::Cancelled || job.cancel_reason() != Some(CancelReason::Cancelled) {
                            bad.push(format!(
                                "round {round}: join Err but job {state:?} {:?}",
                                job.cancel_reason()
                            ));
                        }
                    }
                }
                if thread_state != state {
                    bad.push(format!(
                        "round {round}: thread joined {thread_state:?}, job reads {state:?}"
                    ));
                }
                if scope_job.state() != JobState::Completed {
                    bad.push(format!("round {round}: scope ended {:?}", scope_job.state()));
                }
                drop(res);
                if drops.load(Ordering::SeqCst) != round + 1 {
                    bad.push(format!(
                        "round {round}: value dropped {} times in total",
                        drops.load(Ordering::SeqCst)
                    ));
                }
                if bad.len() > 10 {
                    break;
                }
            }
            drop(to_thread);
            let d = delta(before, jobs());
            assert!(bad.is_empty(), "{bad:#?}");
            assert_eq!(ok + cancelled, N);
            assert_eq!(d.jobs_created, 2 * N as u64, "{d:?}");
            assert_eq!(
                d.jobs_completed + d.jobs_cancelled + d.jobs_failed,
                d.jobs_created,
                "a job left alive: {d:?}"
            );
            assert_eq!(d.jobs_failed, 0, "{d:?}");
            assert_eq!(
                d.jobs_cancelled, cancelled as u64,
                "{d:?} (ok {ok}, cancelled {cancelled})"
            );
            assert_eq!(d.cancellations_requested, cancelled as u64, "{d:?}");
        });
        canceller.join().unwrap();
    })
}

/// Kotlin: failure dominates cancellation (a job that throws while
/// cancelling is failed, `isCancelled` and the exception is kept). A plain
/// thread cancels a supervisor's child at the instant it panics, 2,000
/// times: every child ends FAILED (never CANCELLED), its join reports the
/// panic with its payload, the thread's `Job::join` reports FAILED, and the
/// supervisor scope completes (it keeps its children's failures).
#[test]
fn supervisor_child_panicking_while_a_thread_cancels_it_always_ends_failed() {
    let _s = serial();
    within(600, || {
        quiet(|| {
            let rt = common::rt();
            let (to_thread, from_owner) = std::sync::mpsc::channel::<(Job, Arc<AtomicBool>)>();
            let (ack_tx, ack_rx) = chan::unbounded::<JobState>();
            let canceller = std::thread::spawn(move || {
                for (job, go) in from_owner {
                    go.store(true, Ordering::Release);
                    job.cancel();
                    ack_tx.send(job.join().unwrap()).unwrap();
                }
            });
            rt.block_on(move || {
                let _ = Job::current();
                const N: usize = 2_000;
                let before = jobs();
                let mut bad = Vec::new();
                for round in 0..N {
                    let slot: Arc<std::sync::Mutex<Option<Job>>> = Default::default();
                    let (res, sup_job) = fiber::supervisor_scope(|s| {
                        let (slot, tx) = (slot.clone(), to_thread.clone());
                        let h = s.spawn(move || -> u32 {
                            let me = Job::current();
                            *slot.lock().unwrap() = Some(me.clone());
                            let go = Arc::new(AtomicBool::new(false));
                            tx.send((me, go.clone())).unwrap();
                            while !go.load(Ordering::Acquire) {
                                std::hint::spin_loop();
                            }
                            panic_any(E("child"))
                        });
                        (h.join(), s.job())
                    });
                    let thread_state = ack_rx.recv().unwrap();
                    let job = slot.lock().unwrap().take().unwrap();
                    match res {
                        Ok(_) => bad.push(format!("round {round}: join Ok")),
                        Err(e) if e.is_panic() => {
                            let p = e.into_panic();
                            if p.downcast_ref::<E>().map(|e| e.0) != Some("child") {
                                bad.push(format!("round {round}: wrong payload"));
                            }
                        }
                        Err(e) => bad.push(format!("round {round}: join {e:?} (failure must dominate)")),
                    }
                    if job.state() != JobState::Failed || thread_state != JobState::Failed {
                        bad.push(format!(
                            "round {round}: job {:?}, thread joined {thread_state:?}",
                            job.state()
                        ));
                    }
                    if sup_job.state() != JobState::Completed {
                        bad.push(format!("round {round}: supervisor ended {:?}", sup_job.state()));
                    }
                    if bad.len() > 10 {
                        break;
                    }
                }
                drop(to_thread);
                let d = delta(before, jobs());
                assert!(bad.is_empty(), "{bad:#?}");
                assert_eq!(d.jobs_created, 2 * N as u64, "{d:?}");
                assert_eq!(d.jobs_failed, N as u64, "{d:?}");
                assert_eq!(d.jobs_completed, N as u64, "{d:?}");
                assert_eq!(d.jobs_cancelled, 0, "{d:?}");
            });
            canceller.join().unwrap();
        })
    })
}

/// Kotlin: a scope (coroutineScope) whose block returned stays "completing"
/// until its children end; a cancel in that window makes it cancelled. A
/// plain thread cancels the scope's job while its only child is returning,
/// 5,000 times: the scope job ends COMPLETED or CANCELLED (reason
/// `Cancelled`), the thread's join agrees, the child never ends COMPLETED
/// while its scope ended CANCELLED through a cancel that reached it
/// (checked through the counters: requests == jobs ended CANCELLED).
#[test]
fn scope_job_cancelled_by_a_thread_while_its_last_child_returns_5k_rounds() {
    let _s = serial();
    within(600, || {
        let rt = common::rt();
        let (to_thread, from_owner) = std::sync::mpsc::channel::<(Job, Arc<AtomicBool>)>();
        let (ack_tx, ack_rx) = chan::unbounded::<JobState>();
        let canceller = std::thread::spawn(move || {
            for (job, go) in from_owner {
                go.store(true, Ordering::Release);
                job.cancel();
                ack_tx.send(job.join().unwrap()).unwrap();
            }
        });
        rt.block_on(move || {
            let _ = Job::current();
            const N: usize = 5_000;
            let before = jobs();
            let mut bad = Vec::new();
            let mut states = [0usize; 2];
            for round in 0..N {
                let child: Arc<std::sync::Mutex<Option<Job>>> = Default::default();
                let scope_job = fiber::scope(|s| {
                    let tx = to_thread.clone();
                    let sj = s.job();
                    let c = child.clone();
                    s.spawn(move || {
                        *c.lock().unwrap() = Some(Job::current());
                        let go = Arc::new(AtomicBool::new(false));
                        tx.send((sj, go.clone())).unwrap();
                        while !go.load(Ordering::Acquire) {
                            std::hint::spin_loop();
                        }
                        7u8
                    });
                    s.job()
                });
                let thread_state = ack_rx.recv().unwrap();
                let st = scope_job.state();
                let child_state = child.lock().unwrap().take().unwrap().state();
                match st {
                    JobState::Completed => states[0] += 1,
                    JobState::Cancelled => {
                        states[1] += 1;
                        if scope_job.cancel_reason() != Some(CancelReason::Cancelled) {
                            bad.push(format!("round {round}: reason {:?}", scope_job.cancel_reason()));
                        }
                    }
                    other => bad.push(format!("round {round}: scope ended {other:?}")),
                }
                if !matches!(child_state, JobState::Completed | JobState::Cancelled) {
                    bad.push(format!("round {round}: child ended {child_state:?}"));
                }
                if st == JobState::Completed && child_state != JobState::Completed {
                    bad.push(format!("round {round}: scope COMPLETED with a CANCELLED child"));
                }
                if thread_state != st {
                    bad.push(format!(
                        "round {round}: thread joined {thread_state:?}, scope job {st:?}"
                    ));
                }
                if bad.len() > 10 {
                    break;
                }
            }
            drop(to_thread);
            let d = delta(before, jobs());
            assert!(bad.is_empty(), "{bad:#?}");
            assert_eq!(d.jobs_created, 2 * N as u64, "{d:?}");
            assert_eq!(d.jobs_completed + d.jobs_cancelled, d.jobs_created, "{d:?}");
            assert_eq!(
                d.cancellations_requested, d.jobs_cancelled,
                "{d:?} (scope outcomes {states:?})"
            );
        });
        canceller.join().unwrap();
    })
}

// ---------------------------------------------------------------------------
// Nested supervisor in scope in with_timeout, explicit cancels per level
// ---------------------------------------------------------------------------

/// Jobs of the three levels, sent out of the block.
struct Levels {
    timeout: Job,
    scope: Job,
    supervisor: Job,
    failing: Job,
    parked: Job,
}

/// with_timeout(300 ms) { scope { child: supervisor_scope { a child that
/// panics on its cancellation; a child parked } } }, with `cancel` applied
/// to one level by a plain thread once every job exists.
fn nested(level: Option<&'static str>) -> (Result<u32, fiber::TimedOut>, Levels, Duration) {
    let (tx, rx) = std::sync::mpsc::channel::<Levels>();
    let (jobs_tx, jobs_rx) = std::sync::mpsc::channel::<Levels>();
    let canceller = std::thread::spawn(move || {
        let l = rx.recv().unwrap();
        match level {
            Some("timeout") => l.timeout.cancel(),
            Some("scope") => l.scope.cancel(),
            Some("supervisor") => l.supervisor.cancel(),
            Some("parked") => l.parked.cancel(),
            _ => {}
        }
        jobs_tx.send(l).unwrap();
    });
    let start = Instant::now();
    let r = fiber::with_timeout(ms(300), || {
        let timeout = Job::current();
        fiber::scope(|s| {
            let scope = s.job();
            let tx = tx.clone();
            s.spawn(move || {
                fiber::supervisor_scope(|ss| {
                    let (ftx, frx) = std::sync::mpsc::channel();
                    let (ptx, prx) = std::sync::mpsc::channel();
                    ss.spawn(move || {
                        ftx.send(Job::current()).unwrap();
                        park_until_cancelled();
                        panic_any(E("on cancel"));
                    });
                    ss.spawn(move || {
                        ptx.send(Job::current()).unwrap();
                        park_until_cancelled();
                    });
                    let failing = frx.recv().unwrap();
                    let parked = prx.recv().unwrap();
                    tx.send(Levels {
                        timeout,
                        scope,
                        supervisor: ss.job(),
                        failing,
                        parked,
                    })
                    .unwrap();
                });
            });
        });
        5u32
    });
    let elapsed = start.elapsed();
    canceller.join().unwrap();
    (r, jobs_rx.recv().unwrap(), elapsed)
}

#[test]
fn nested_supervisor_scope_timeout_with_no_explicit_cancel_times_out_and_contains_the_failure() {
    let _s = serial();
    within(60, || {
        quiet(|| {
            common::rt().block_on(|| {
                let (r, l, _) = nested(None);
                // Kotlin: withTimeout's deadline cancels the whole subtree;
                // supervisorScope keeps its child's failure; the block is
                // timed out.
                assert_eq!(r, Err(fiber::TimedOut));
                assert_eq!(l.timeout.state(), JobState::Cancelled);
                assert_eq!(l.timeout.cancel_reason(), Some(CancelReason::TimedOut));
                assert_eq!(l.scope.state(), JobState::Cancelled);
                assert_eq!(l.supervisor.state(), JobState::Cancelled);
                assert_eq!(l.failing.state(), JobState::Failed);
                assert_eq!(l.parked.state(), JobState::Cancelled);
                assert_eq!(l.parked.cancel_reason(), Some(CancelReason::TimedOut));
                assert!(!fiber::is_cancelled(), "the caller of with_timeout is not cancelled");
            })
        })
    })
}

#[test]
fn nested_cancel_of_the_supervisor_ends_its_subtree_and_the_block_returns_in_time() {
    let _s = serial();
    within(60, || {
        quiet(|| {
            common::rt().block_on(|| {
                let (r, l, elapsed) = nested(Some("supervisor"));
                // Cancelling a child job does not cancel its parent (Kotlin:
                // a CancellationException of a child is not a failure).
                assert_eq!(r, Ok(5));
                assert!(elapsed < ms(300), "the block returned before its deadline: {elapsed:?}");
                assert_eq!(l.supervisor.state(), JobState::Cancelled);
                assert_eq!(l.supervisor.cancel_reason(), Some(CancelReason::Cancelled));
                assert_eq!(l.failing.state(), JobState::Failed);
                assert_eq!(l.parked.state(), JobState::Cancelled);
                assert_eq!(l.scope.state(), JobState::Completed);
                assert_eq!(l.timeout.state(), JobState::Completed);
                assert_eq!(l.timeout.cancel_reason(), None);
            })
        })
    })
}

#[test]
fn nested_cancel_of_the_scope_spares_the_timeout_block() {
    let _s = serial();
    within(60, || {
        quiet(|| {
            common::rt().block_on(|| {
                let (r, l, elapsed) = nested(Some("scope"));
                assert_eq!(r, Ok(5));
                assert!(elapsed < ms(300), "{elapsed:?}");
                assert_eq!(l.scope.state(), JobState::Cancelled);
                assert_eq!(l.scope.cancel_reason(), Some(CancelReason::Cancelled));
                assert_eq!(l.supervisor.state(), JobState::Cancelled);
                assert_eq!(l.failing.state(), JobState::Failed);
                assert_eq!(l.parked.cancel_reason(), Some(CancelReason::Cancelled));
                assert_eq!(l.timeout.state(), JobState::Completed);
            })
        })
    })
}

#[test]
fn nested_cancel_of_the_timeout_block_keeps_the_explicit_reason_all_the_way_down() {
    let _s = serial();
    within(60, || {
        quiet(|| {
            common::rt().block_on(|| {
                let (r, l, elapsed) = nested(Some("timeout"));
                // Documented (spec/jobs.md): the first reason stands, the
                // block's value is returned (not TimedOut).
                assert_eq!(r, Ok(5));
                assert!(elapsed < ms(300), "{elapsed:?}");
                for (name, j) in [
                    ("timeout", &l.timeout),
                    ("scope", &l.scope),
                    ("supervisor", &l.supervisor),
                    ("parked", &l.parked),
                ] {
                    assert_eq!(j.state(), JobState::Cancelled, "{name}");
                    assert_eq!(j.cancel_reason(), Some(CancelReason::Cancelled), "{name}");
                }
                assert_eq!(l.failing.state(), JobState::Failed);
            })
        })
    })
}

#[test]
fn nested_cancel_of_one_supervised_child_leaves_the_rest_to_the_timeout() {
    let _s = serial();
    within(60, || {
        quiet(|| {
            common::rt().block_on(|| {
                let (r, l, elapsed) = nested(Some("parked"));
                assert_eq!(r, Err(fiber::TimedOut));
                assert!(elapsed >= ms(300), "{elapsed:?}");
                assert_eq!(l.parked.state(), JobState::Cancelled);
                assert_eq!(l.parked.cancel_reason(), Some(CancelReason::Cancelled));
                assert_eq!(l.failing.state(), JobState::Failed);
                assert_eq!(l.supervisor.cancel_reason(), Some(CancelReason::TimedOut));
                assert_eq!(l.timeout.cancel_reason(), Some(CancelReason::TimedOut));
            })
        })
    })
}

// ---------------------------------------------------------------------------
// Children failing while the parent is already cancelling
// ---------------------------------------------------------------------------

/// Kotlin (exception aggregation): when several children fail, the first
/// exception wins, the others are suppressed. The scope is cancelled from a
/// plain thread; child A panics on the cancellation first, child B (which
/// waits in `non_cancellable` until A's job has ended) panics second. The
/// scope re-raises A's payload and ends FAILED with reason ChildFailed or
/// Cancelled (the first reason stands).
#[test]
fn two_children_failing_in_order_on_an_outside_cancel_the_first_payload_wins() {
    let _s = serial();
    within(60, || {
        quiet(|| {
            common::rt().block_on(|| {
                for round in 0..50 {
                    let (tx, rx) = std::sync::mpsc::channel::<Job>();
                    let t = std::thread::spawn(move || {
                        let j = rx.recv().unwrap();
                        j.cancel();
                        j.join().unwrap()
                    });
                    let scope_job: Arc<std::sync::Mutex<Option<Job>>> = Default::default();
                    let sj = scope_job.clone();
                    let p = catch_unwind(AssertUnwindSafe(|| {
                        fiber::scope(|s| {
                            *sj.lock().unwrap() = Some(s.job());
                            let (atx, arx) = std::sync::mpsc::channel::<Job>();
                            s.spawn(move || {
                                atx.send(Job::current()).unwrap();
                                park_until_cancelled();
                                panic_any(E("A"));
                            });
                            let a = arx.recv().unwrap();
                            s.spawn(move || {
                                park_until_cancelled();
                                fiber::non_cancellable(|| {
                                    wait_until("A ended", Duration::from_secs(10), || a.is_completed())
                                });
                                panic_any(E("B"));
                            });
                            tx.send(s.job()).unwrap();
                        })
                    }))
                    .expect_err("the scope re-raises a child's panic");
                    let thread_state = t.join().unwrap();
                    assert_eq!(
                        p.downcast_ref::<E>().map(|e| e.0),
                        Some("A"),
                        "round {round}: the first failure wins"
                    );
                    let j = scope_job.lock().unwrap().take().unwrap();
                    assert_eq!(j.state(), JobState::Failed, "round {round}");
                    assert_eq!(thread_state, JobState::Failed, "round {round}");
                    assert_eq!(
                        j.cancel_reason(),
                        Some(CancelReason::Cancelled),
                        "round {round}: first reason stands"
                    );
                }
            })
        })
    })
}

/// Same rule for try_scope: after an outside cancel child A returns
/// `Err("A")`, then child B panics on the same cancellation. The first
/// failure (A's error) is what try_scope reports; B's later panic does not
/// replace it (Kotlin: later exceptions are suppressed into the first).
#[test]
fn try_scope_child_err_then_sibling_panic_on_the_same_cancel_the_err_wins() {
    let _s = serial();
    within(60, || {
        quiet(|| {
            common::rt().block_on(|| {
                let (tx, rx) = std::sync::mpsc::channel::<Job>();
                let t = std::thread::spawn(move || rx.recv().unwrap().cancel());
                let r = catch_unwind(AssertUnwindSafe(|| {
                    fiber::try_scope(|s| -> Result<(), &'static str> {
                        let (atx, arx) = std::sync::mpsc::channel::<Job>();
                        s.spawn(move || -> Result<(), &'static str> {
                            atx.send(Job::current()).unwrap();
                            park_until_cancelled();
                            Err("A")
                        });
                        let a = arx.recv().unwrap();
                        s.spawn(move || -> Result<(), &'static str> {
                            park_until_cancelled();
                            fiber::non_cancellable(|| {
                                wait_until("A ended", Duration::from_secs(10), || a.is_completed())
                            });
                            panic_any(E("B"))
                        });
                        tx.send(s.job()).unwrap();
                        Ok(())
                    })
                }));
                t.join().unwrap();
                match r {
                    Ok(v) => assert_eq!(v, Err("A"), "the first failure wins"),
                    Err(p) => panic!(
                        "try_scope raised the later panic {:?} instead of returning the first failure Err(\"A\")",
                        p.downcast_ref::<E>()
                    ),
                }
            })
        })
    })
}

// ---------------------------------------------------------------------------
// Job handles from plain threads, other runtimes, and after the runtime
// ---------------------------------------------------------------------------

/// Kotlin: `join` suspends until the job is complete, for every joiner; the
/// job is unaffected by its joiners. Eight plain threads and eight fibers of
/// another runtime join one scoped child; a ninth thread cancels it. All 16
/// get CANCELLED, and `is_*` read consistently from threads before and after.
#[test]
fn one_job_joined_by_threads_and_by_fibers_of_another_runtime_all_see_one_end() {
    let _s = serial();
    within(60, || {
        let rt_a = common::rt();
        let rt_b = common::rt();
        let (job_tx, job_rx) = std::sync::mpsc::channel::<Job>();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let owner = rt_a.spawn(move || {
            fiber::scope(|s| {
                s.spawn(move || {
                    job_tx.send(Job::current()).unwrap();
                    park_until_cancelled();
                });
            });
            done_tx.send(()).unwrap();
        });
        let job = job_rx.recv().unwrap();
        assert!(job.is_active() && !job.is_cancelled() && !job.is_completed());
        assert_eq!(job.state(), JobState::Active);
        let before = rt_b.block_on(jobs);
        let mut threads = Vec::new();
        for _ in 0..8 {
            let j = job.clone();
            threads.push(std::thread::spawn(move || j.join()));
        }
        let mut fibers = Vec::new();
        for _ in 0..8 {
            let j = job.clone();
            fibers.push(rt_b.spawn(move || j.join()));
        }
        // Let every joiner register (a wait; the assertion holds either way).
        std::thread::sleep(ms(50));
        assert!(job.is_active(), "joiners do not change the job");
        let j = job.clone();
        std::thread::spawn(move || j.cancel()).join().unwrap();
        for t in threads {
            assert_eq!(t.join().unwrap(), Ok(JobState::Cancelled));
        }
        for f in fibers {
            assert_eq!(f.join().unwrap(), Ok(JobState::Cancelled));
        }
        done_rx.recv_timeout(Duration::from_secs(5)).expect("the scope ended");
        owner.join().unwrap();
        assert!(job.is_completed() && job.is_cancelled() && !job.is_active());
        let d = delta(before, rt_b.block_on(jobs));
        assert_eq!(
            d.waiters_registered, d.waiters_woken,
            "every registered joiner was woken once: {d:?}"
        );
    })
}

/// Jobs outlive their runtime: Job handles of a with_timeout block, a scope,
/// a supervisor scope, their children and a root job, taken while they run
/// and kept past the runtime's drop, all read ended; a plain thread's join
/// returns at once with that state; a cancel of an ended job changes
/// nothing and is not counted.
#[test]
fn job_handles_outliving_their_runtime_read_ended_and_ignore_cancels() {
    let _s = serial();
    within(60, || {
        let rt = common::rt();
        let (tx, rx) = std::sync::mpsc::channel::<(&'static str, Job)>();
        let t2 = tx.clone();
        rt.spawn(move || {
            t2.send(("root", Job::current())).unwrap();
            let _ = fiber::with_timeout(Duration::from_secs(60), || {
                t2.send(("timeout", Job::current())).unwrap();
                fiber::scope(|s| {
                    t2.send(("scope", s.job())).unwrap();
                    let t3 = t2.clone();
                    s.spawn(move || {
                        fiber::supervisor_scope(|ss| {
                            t3.send(("supervisor", ss.job())).unwrap();
                            let t4 = t3.clone();
                            ss.spawn(move || {
                                t4.send(("leaf", Job::current())).unwrap();
                                park_until_cancelled();
                            });
                        })
                    });
                })
            });
        });
        drop(tx);
        let mut got = Vec::new();
        for _ in 0..5 {
            got.push(rx.recv_timeout(Duration::from_secs(5)).expect("every job made"));
        }
        let before = rt.block_on(jobs);
        drop(rt);
        for (name, job) in &got {
            assert!(
                job.is_completed(),
                "{name}: {:?} after the runtime was dropped",
                job.state()
            );
            assert_eq!(job.state(), JobState::Cancelled, "{name}: ended by the shutdown");
            let j = job.clone();
            let state = std::thread::spawn(move || {
                let t = Instant::now();
                let s = j.join();
                (s, t.elapsed())
            })
            .join()
            .unwrap();
            assert_eq!(state.0, Ok(JobState::Cancelled), "{name}");
            assert!(state.1 < ms(500), "{name}: join of an ended job waited {:?}", state.1);
            job.cancel();
            job.cancel_and_join().unwrap();
            assert_eq!(job.state(), JobState::Cancelled, "{name}");
        }
        let after = common::rt().block_on(jobs);
        assert_eq!(
            after.cancellations_requested - before.cancellations_requested,
            6,
            "shutdown moved each of the 6 jobs (the 5 above and the scoped child running the supervisor) ACTIVE -> CANCELLING once; the later cancels count nothing"
        );
    })
}

/// A plain thread blocked in `Job::join` of a scoped child while that
/// child's runtime is dropped gets the child's end (CANCELLED), and the
/// handle of the owner fiber reports cancelled too.
#[test]
fn a_thread_blocked_in_join_of_a_grandchild_returns_when_the_runtime_is_dropped() {
    let _s = serial();
    within(60, || {
        let rt = common::rt();
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        let owner = rt.spawn(move || {
            fiber::scope(|s| {
                s.spawn(move || {
                    fiber::scope(|s2| {
                        s2.spawn(move || {
                            tx.send(Job::current()).unwrap();
                            park_until_cancelled();
                        });
                    })
                });
            })
        });
        let leaf = rx.recv().unwrap();
        let j = leaf.clone();
        let joiner = std::thread::spawn(move || j.join());
        std::thread::sleep(ms(20));
        drop(rt);
        assert_eq!(joiner.join().unwrap(), Ok(JobState::Cancelled));
        let r = owner.join();
        assert!(matches!(&r, Err(e) if e.is_cancelled()), "{r:?}");
    })
}

// ---------------------------------------------------------------------------
// fiber::sync across cancellation
// ---------------------------------------------------------------------------

/// Go (semaphore.Weighted.Acquire): "On failure, returns ctx.Err() and
/// leaves the semaphore unchanged." A plain thread adds one permit and
/// cancels the waiting fiber at the same instant, 10,000 times; each round
/// the fiber either holds the permit (and gives it back) or got Cancelled.
/// No permit is lost or duplicated: in the end the semaphore holds exactly
/// the 10,000 permits the thread added, and the stolen-permit check inside
/// (`available_permits` never above what was added minus held) holds.
#[test]
fn semaphore_release_racing_cancel_of_the_waiter_10k_rounds_no_lost_permit() {
    let _s = serial();
    within(600, || {
        let rt = common::rt();
        let sem = Arc::new(Semaphore::new(0));
        let (to_thread, from_owner) = std::sync::mpsc::channel::<fiber::JoinHandle<bool>>();
        let (ack_tx, ack_rx) = chan::unbounded::<bool>();
        let s2 = sem.clone();
        let thread = std::thread::spawn(move || {
            for h in from_owner {
                s2.add_permits(1);
                h.cancel();
                let got = h.join().unwrap_or(false);
                ack_tx.send(got).unwrap();
            }
        });
        let s3 = sem.clone();
        let (granted, cancelled) = rt.block_on(move || {
            let (mut granted, mut cancelled) = (0usize, 0usize);
            for _ in 0..10_000 {
                let s = s3.clone();
                let (ready_tx, ready_rx) = chan::bounded::<()>(1);
                let h = fiber::spawn(move || {
                    ready_tx.send(()).unwrap();
                    match s.acquire() {
                        Ok(p) => {
                            // Held: give it back by forgetting nothing (drop).
                            drop(p);
                            true
                        }
                        Err(_) => false,
                    }
                });
                ready_rx.recv().unwrap();
                to_thread.send(h).unwrap();
                if ack_rx.recv().unwrap() {
                    granted += 1;
                } else {
                    cancelled += 1;
                }
            }
            drop(to_thread);
            (granted, cancelled)
        });
        thread.join().unwrap();
        assert_eq!(granted + cancelled, 10_000);
        assert_eq!(
            sem.available_permits(),
            10_000,
            "every added permit is back in the semaphore (granted {granted}, cancelled {cancelled})"
        );
    })
}

/// Barrier shared by a plain thread and fibers, with cancellations racing
/// the release: 2,000 generations of a barrier of 2. The thread waits; a
/// fiber arrives and is cancelled at the same instant. If the fiber's wait
/// was cancelled its arrival is withdrawn and a second fiber releases the
/// thread. Exactly one leader per generation, `generation()` counts the
/// releases, and no cancelled wait ever reports a leader.
#[test]
fn barrier_mixed_thread_and_fibers_with_cancel_racing_release_keeps_generations_exact() {
    let _s = serial();
    within(600, || {
        const N: u64 = 2_000;
        let rt = common::rt();
        let barrier = Arc::new(Barrier::new(2));
        let b = barrier.clone();
        let thread_leads = Arc::new(AtomicUsize::new(0));
        let tl = thread_leads.clone();
        let thread = std::thread::spawn(move || {
            for _ in 0..N {
                let r = b.wait();
                assert!(!r.is_cancelled(), "a plain thread is never cancelled");
                if r.is_leader() {
                    tl.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
        let b = barrier.clone();
        let fiber_leads = rt.block_on(move || {
            let mut leads = 0usize;
            let mut withdrawn = 0usize;
            for round in 0..N {
                let gen0 = b.generation();
                let bx = b.clone();
                // The wait's own result, recorded by the fiber: its join
                // reports Cancelled for a fiber cancelled before it returned,
                // even if the wait passed (documented), so it cannot tell.
                let seen = Arc::new(AtomicUsize::new(0));
                let sx = seen.clone();
                let x = fiber::spawn(move || {
                    let r = bx.wait();
                    sx.store(
                        match (r.is_cancelled(), r.is_leader()) {
                            (true, true) => 4,
                            (true, false) => 3,
                            (false, true) => 2,
                            (false, false) => 1,
                        },
                        Ordering::SeqCst,
                    );
                });
                // Cancel at about the time it arrives.
                if round % 3 != 0 {
                    fiber::yield_now().unwrap();
                }
                x.cancel();
                let _ = x.join();
                let passed = match seen.load(Ordering::SeqCst) {
                    1 => true,
                    2 => {
                        leads += 1;
                        true
                    }
                    3 => false,
                    4 => panic!("round {round}: a cancelled wait reported a leader"),
                    _ => false, // cancelled before it ran: never arrived
                };
                if !passed {
                    withdrawn += 1;
                    let by = b.clone();
                    let r = fiber::spawn(move || fiber::non_cancellable(|| by.wait()))
                        .join()
                        .unwrap();
                    assert!(!r.is_cancelled());
                    if r.is_leader() {
                        leads += 1;
                    }
                }
                assert_eq!(b.generation(), gen0 + 1, "round {round}: one release per round");
            }
            let _ = withdrawn;
            leads
        });
        thread.join().unwrap();
        assert_eq!(barrier.generation(), N);
        assert_eq!(
            fiber_leads + thread_leads.load(Ordering::SeqCst),
            N as usize,
            "exactly one leader per generation"
        );
    })
}

/// crossbeam's WaitGroup: `wait` drops the caller's member and blocks until
/// every other member is dropped. Members held by plain threads and fibers;
/// two waiters, a fiber that is cancelled and a plain thread. The cancelled
/// waiter returns early; the thread's wait still waits for all the others
/// and returns only after the last member is gone.
#[test]
fn waitgroup_mixed_members_a_cancelled_fiber_waiter_does_not_release_the_thread_waiter() {
    let _s = serial();
    within(60, || {
        let rt = common::rt();
        let wg = WaitGroup::new();
        let dropped = Arc::new(AtomicUsize::new(0));
        // 4 thread members, 4 fiber members, each released by a channel.
        let (rel_tx, rel_rx) = chan::unbounded::<()>();
        let mut threads = Vec::new();
        for _ in 0..4 {
            let (m, r, d) = (wg.clone(), rel_rx.clone(), dropped.clone());
            threads.push(std::thread::spawn(move || {
                r.recv().unwrap();
                d.fetch_add(1, Ordering::SeqCst);
                drop(m);
            }));
        }
        let mut fibers = Vec::new();
        for _ in 0..4 {
            let (m, r, d) = (wg.clone(), rel_rx.clone(), dropped.clone());
            fibers.push(rt.spawn(move || {
                fiber::non_cancellable(|| r.recv()).unwrap();
                d.fetch_add(1, Ordering::SeqCst);
                drop(m);
            }));
        }
        let w = wg.clone();
        let fiber_waiter = rt.spawn(move || {
            w.wait();
            fiber::is_cancelled()
        });
        let (w, d) = (wg.clone(), dropped.clone());
        let thread_waiter = std::thread::spawn(move || {
            w.wait();
            d.load(Ordering::SeqCst)
        });
        drop(wg);
        std::thread::sleep(ms(20));
        fiber_waiter.cancel();
        assert!(fiber_waiter.join().unwrap_or(true), "the cancelled waiter returned");
        std::thread::sleep(ms(20));
        assert!(
            !thread_waiter.is_finished(),
            "the thread's wait returned with 8 members alive"
        );
        for _ in 0..8 {
            rel_tx.send(()).unwrap();
        }
        assert_eq!(thread_waiter.join().unwrap(), 8, "returned after every member dropped");
        for t in threads {
            t.join().unwrap();
        }
        for f in fibers {
            f.join().unwrap();
        }
    })
}

/// Condvar consumers cancelled at random while a producer (a plain thread)
/// pushes items with `notify_one`: consumers loop `wait_while(q.is_empty())`
/// and take an item when they return with one present, then quit if
/// cancelled. No notification is lost to a cancelled waiter: the surviving
/// consumers take every item (Java's Condition contract: a signal consumed
/// by an interrupted waiter is redirected; here the cancelled waiter takes
/// the item or the signal goes on).
#[test]
fn condvar_notify_one_with_cancelled_consumers_loses_no_item() {
    let _s = serial();
    within(120, || {
        let rt = common::rt();
        let pair = Arc::new((Mutex::new(std::collections::VecDeque::<u32>::new()), Condvar::new()));
        let taken = Arc::new(AtomicUsize::new(0));
        const ITEMS: u32 = 3_000;
        let mut consumers = Vec::new();
        for _ in 0..16 {
            let (p, t) = (pair.clone(), taken.clone());
            consumers.push(rt.spawn(move || loop {
                let (m, cv) = &*p;
                let g = m.lock().unwrap();
                let mut g = cv.wait_while(g, |q| q.is_empty()).unwrap();
                if let Some(v) = g.pop_front() {
                    t.fetch_add(1, Ordering::SeqCst);
                    if v == u32::MAX {
                        return;
                    }
                }
                drop(g);
                if fiber::is_cancelled() {
                    return;
                }
            }));
        }
        let p = pair.clone();
        let producer = std::thread::spawn(move || {
            for i in 0..ITEMS {
                let (m, cv) = &*p;
                m.lock().unwrap().push_back(i);
                cv.notify_one();
                if i % 64 == 0 {
                    std::thread::yield_now();
                }
            }
        });
        // Cancel half the consumers while the producer runs.
        for (i, c) in consumers.iter().enumerate() {
            if i % 2 == 0 {
                std::thread::sleep(Duration::from_micros(300));
                c.cancel();
            }
        }
        producer.join().unwrap();
        // Every item is taken by someone (cancelled consumers may take some).
        let start = Instant::now();
        while taken.load(Ordering::SeqCst) < ITEMS as usize {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "items lost: {} of {ITEMS} taken, {} left in the queue",
                taken.load(Ordering::SeqCst),
                pair.0.lock().unwrap().len()
            );
            std::thread::sleep(ms(5));
        }
        // Stop the rest with sentinels.
        {
            let (m, cv) = &*pair;
            let mut q = m.lock().unwrap();
            for _ in 0..16 {
                q.push_back(u32::MAX);
            }
            cv.notify_all();
        }
        for c in consumers {
            let _ = c.join();
        }
    })
}

/// A Semaphore shared by threads and fibers, with acquire_many of different
/// sizes and cancellations of queued fibers from a thread: FIFO order is
/// kept for the rest, and the final count is exact (Go:
/// TestLargeAcquireDoesntStarve / TestAllocCancelDoesntStarve, combined
/// with thread holders).
#[test]
fn semaphore_mixed_threads_and_fibers_cancelled_waiters_keep_fifo_and_count() {
    let _s = serial();
    within(60, || {
        let rt = common::rt();
        let sem = Arc::new(Semaphore::new(10));
        // A thread holds all 10.
        let s = sem.clone();
        let (rel_tx, rel_rx) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            let p = s.acquire_many(10).unwrap();
            rel_rx.recv().unwrap();
            drop(p);
        });
        wait_until("holder", Duration::from_secs(5), || sem.available_permits() == 0);
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut hs = Vec::new();
        // Queue: f0 wants 8, f1 wants 5, f2 wants 2, f3 wants 3 (FIFO).
        for (i, n) in [8u32, 5, 2, 3].into_iter().enumerate() {
            let (s, o) = (sem.clone(), order.clone());
            hs.push(rt.spawn(move || {
                let p = s.acquire_many(n)?;
                o.lock().unwrap().push(i);
                fiber::non_cancellable(|| fiber::sleep(ms(20))).unwrap();
                drop(p);
                Ok::<_, fiber::Cancelled>(())
            }));
            std::thread::sleep(ms(10));
        }
        // Cancel the head (8) and f2 from a plain thread.
        hs[0].cancel();
        hs[2].cancel();
        rel_tx.send(()).unwrap();
        holder.join().unwrap();
        let mut results = Vec::new();
        for h in hs {
            results.push(h.join());
        }
        assert!(matches!(&results[0], Ok(Err(_)) | Err(_)), "{:?}", results[0]);
        assert!(matches!(&results[2], Ok(Err(_)) | Err(_)), "{:?}", results[2]);
        assert!(matches!(&results[1], Ok(Ok(()))));
        assert!(matches!(&results[3], Ok(Ok(()))));
        let mut got = order.lock().unwrap().clone();
        got.sort();
        // 5 + 3 fit in the 10 released at once: both are served.
        assert_eq!(got, vec![1, 3], "both survivors served");
        assert_eq!(sem.available_permits(), 10);
    })
}

/// Go (Weighted.Acquire): a cancelled acquire leaves the semaphore
/// unchanged, so a permit released at the instant the head waiter is
/// cancelled goes to the next waiter. Two fibers wait on an empty
/// semaphore; a plain thread adds one permit and cancels the head at the
/// same instant, 3,000 times. If the head got Cancelled, the second
/// waiter must get that very permit (nothing else is added); if the head
/// got it, the second gets the next one. In the end every permit is back.
#[test]
fn semaphore_permit_released_while_the_head_is_cancelled_goes_to_the_next_waiter() {
    let _s = serial();
    within(600, || {
        let rt = common::rt();
        let sem = Arc::new(Semaphore::new(0));
        let s0 = sem.clone();
        let (head_cancelled, added) = rt.block_on(move || {
            let mut head_cancelled = 0usize;
            let mut added = 0usize;
            for round in 0..3_000 {
                let (a_in, a_rx) = chan::bounded::<()>(1);
                let sa = s0.clone();
                let a_got = Arc::new(AtomicUsize::new(0));
                let ag = a_got.clone();
                let a = fiber::spawn(move || {
                    a_in.send(()).unwrap();
                    if let Ok(p) = sa.acquire() {
                        ag.store(1, Ordering::SeqCst);
                        // Keep it until the round's accounting is done.
                        p.forget();
                    }
                });
                a_rx.recv().unwrap();
                // Let A queue first (FIFO): wait until it is parked.
                wait_until("A queued", Duration::from_secs(5), || {
                    fiber::yield_now().ok();
                    true
                });
                let (b_in, b_rx) = chan::bounded::<()>(1);
                let sb = s0.clone();
                let b = fiber::spawn(move || {
                    b_in.send(()).unwrap();
                    let p = fiber::non_cancellable(|| sb.acquire()).expect("B is not cancelled");
                    p.forget();
                });
                b_rx.recv().unwrap();
                fiber::yield_now().unwrap();
                let s1 = s0.clone();
                let ah = Arc::new(a);
                let ah2 = ah.clone();
                std::thread::spawn(move || {
                    s1.add_permits(1);
                    ah2.cancel();
                })
                .join()
                .unwrap();
                added += 1;
                let a = Arc::try_unwrap(ah).ok().unwrap();
                let _ = a.join();
                if a_got.load(Ordering::SeqCst) == 0 {
                    head_cancelled += 1;
                    // B must get the permit A gave up, with nothing added.
                    let start = Instant::now();
                    while !b.is_finished() {
                        assert!(
                            start.elapsed() < Duration::from_secs(5),
                            "round {round}: the head was cancelled but the released permit did not reach the next \
                             waiter (available {})",
                            s0.available_permits()
                        );
                        fiber::sleep(ms(1)).unwrap();
                    }
                } else {
                    s0.add_permits(1);
                    added += 1;
                }
                b.join().unwrap();
                assert_eq!(s0.available_permits(), 0, "round {round}: no permit duplicated");
            }
            (head_cancelled, added)
        });
        let _ = (head_cancelled, added);
        assert_eq!(sem.available_permits(), 0);
    })
}

/// Kotlin: a scope (coroutineScope) cancelled while its block waits for a
/// child that is returning: the block's join reports the child's own end
/// (its value, or Cancelled if the cancel reached the child first), and the
/// two always agree with the child's job state. 10,000 rounds, cancel from
/// a plain thread on the scope's job; counters exact.
#[test]
fn scope_job_cancelled_while_the_body_joins_a_returning_child_10k_rounds() {
    let _s = serial();
    within(600, || {
        let rt = common::rt();
        let (to_thread, from_owner) = std::sync::mpsc::channel::<(Job, Arc<AtomicBool>)>();
        let (ack_tx, ack_rx) = chan::unbounded::<()>();
        let canceller = std::thread::spawn(move || {
            for (job, go) in from_owner {
                go.store(true, Ordering::Release);
                job.cancel();
                ack_tx.send(()).unwrap();
            }
        });
        rt.block_on(move || {
            let _ = Job::current();
            const N: usize = 10_000;
            let drops = Arc::new(AtomicUsize::new(0));
            let before = jobs();
            let mut bad = Vec::new();
            let mut outcomes = [0usize; 2];
            for round in 0..N {
                let slot: Arc<std::sync::Mutex<Option<Job>>> = Default::default();
                let (res, scope_job) = fiber::scope(|s| {
                    let (slot, tx, drops, sj) = (slot.clone(), to_thread.clone(), drops.clone(), s.job());
                    let h = s.spawn(move || {
                        *slot.lock().unwrap() = Some(Job::current());
                        let go = Arc::new(AtomicBool::new(false));
                        tx.send((sj, go.clone())).unwrap();
                        while !go.load(Ordering::Acquire) {
                            std::hint::spin_loop();
                        }
                        Counted(drops)
                    });
                    (h.join().map(|_| ()), s.job())
                });
                ack_rx.recv().unwrap();
                let child = slot.lock().unwrap().take().unwrap();
                match (&res, child.state()) {
                    (Ok(()), JobState::Completed) => outcomes[0] += 1,
                    (Err(e), JobState::Cancelled) if e.is_cancelled() && !e.is_join_cancelled() => outcomes[1] += 1,
                    (r, st) => bad.push(format!("round {round}: join {r:?}, child {st:?}")),
                }
                if !scope_job.state().is_terminal() || scope_job.state() == JobState::Failed {
                    bad.push(format!("round {round}: scope {:?}", scope_job.state()));
                }
                if scope_job.state() == JobState::Completed && child.state() == JobState::Cancelled {
                    bad.push(format!("round {round}: scope completed, child cancelled"));
                }
                if drops.load(Ordering::SeqCst) != round + 1 {
                    bad.push(format!("round {round}: drops {}", drops.load(Ordering::SeqCst)));
                }
                if bad.len() > 10 {
                    break;
                }
            }
            drop(to_thread);
            let d = delta(before, jobs());
            assert!(bad.is_empty(), "{bad:#?} {outcomes:?}");
            assert_eq!(d.jobs_created, 2 * N as u64, "{d:?}");
            assert_eq!(d.jobs_completed + d.jobs_cancelled, d.jobs_created, "{d:?}");
            assert_eq!(d.cancellations_requested, d.jobs_cancelled, "{d:?} {outcomes:?}");
        });
        canceller.join().unwrap();
    })
}

/// Kotlin (withTimeout): the block either returns its value before the
/// deadline or the call throws; never both. A body that returns right at
/// its 1 ms deadline, with a scoped child doing the same, 5,000 times:
/// `Ok` iff the block's job COMPLETED without a reason, `Err(TimedOut)` iff
/// it ended CANCELLED with `TimedOut`; the child's join agrees with the
/// child's state; the value is dropped exactly once either way.
#[test]
fn with_timeout_body_returning_at_its_deadline_5k_rounds_reports_one_outcome() {
    let _s = serial();
    within(600, || {
        common::rt().block_on(|| {
            let _ = Job::current();
            const N: usize = 5_000;
            let drops = Arc::new(AtomicUsize::new(0));
            let before = jobs();
            let mut bad = Vec::new();
            let mut outcomes = [0usize; 2];
            let mut expected_drops = 0usize;
            for round in 0..N {
                let slot: Arc<std::sync::Mutex<Option<(Job, Result<(), fiber::JoinError>, Option<Job>)>>> =
                    Default::default();
                let sl = slot.clone();
                let d = drops.clone();
                let d2 = drops.clone();
                let r = fiber::with_timeout(ms(1), move || {
                    let me = Job::current();
                    let (res, child) = fiber::scope(|s| {
                        let (ctx, crx) = std::sync::mpsc::channel();
                        let h = s.spawn(move || {
                            ctx.send(Job::current()).unwrap();
                            let end = Instant::now() + ms(1);
                            while Instant::now() < end {
                                std::hint::spin_loop();
                            }
                            Counted(d2)
                        });
                        let res = h.join().map(drop);
                        // None: the child was made past the deadline and
                        // never ran (documented).
                        (res, crx.recv().ok())
                    });
                    *sl.lock().unwrap() = Some((me, res, child));
                    Counted(d)
                });
                let (me, child_res, child) = slot.lock().unwrap().take().unwrap();
                match (&r, me.state(), me.cancel_reason()) {
                    (Ok(_), JobState::Completed, None) => outcomes[0] += 1,
                    (Err(fiber::TimedOut), JobState::Cancelled, Some(CancelReason::TimedOut)) => outcomes[1] += 1,
                    (r, st, why) => bad.push(format!(
                        "round {round}: {:?} but job {st:?} {why:?}",
                        r.as_ref().map(|_| ())
                    )),
                }
                match (&child_res, child.as_ref().map(|c| c.state())) {
                    (Ok(()), Some(JobState::Completed)) => {}
                    (Err(e), Some(JobState::Cancelled) | None) if e.is_timed_out() => {}
                    (cr, st) => bad.push(format!("round {round}: child join {cr:?} state {st:?}")),
                }
                if r.is_ok() && child_res.is_err() {
                    bad.push(format!("round {round}: block Ok but child {child_res:?}"));
                }
                drop(r);
                // The block's value always; the child's only if it ran.
                expected_drops += 1 + child.is_some() as usize;
                if drops.load(Ordering::SeqCst) != expected_drops {
                    bad.push(format!(
                        "round {round}: drops {} want {expected_drops}",
                        drops.load(Ordering::SeqCst)
                    ));
                }
                if bad.len() > 10 {
                    break;
                }
            }
            let d = delta(before, jobs());
            assert!(bad.is_empty(), "{bad:#?} {outcomes:?}");
            assert_eq!(d.jobs_created, 3 * N as u64, "{d:?}");
            assert_eq!(d.jobs_completed + d.jobs_cancelled, d.jobs_created, "{d:?}");
            assert_eq!(d.cancellations_requested, d.jobs_cancelled, "{d:?} {outcomes:?}");
        })
    })
}

/// std (OnceLock): if the initializer panics, the cell stays uninitialized
/// and another caller may initialize it. An initializer running in a fiber
/// that is unwound at teardown (it sleeps in `non_cancellable` past the
/// grace time) while a plain thread waits in `get_or_init`: the thread then
/// runs its own initializer and gets its value, instead of waiting forever.
#[test]
fn once_lock_initializer_unwound_at_teardown_lets_a_waiting_thread_initialize() {
    let _s = serial();
    within(60, || {
        quiet(|| {
            let rt = common::rt_grace(2, ms(200));
            let cell = Arc::new(fiber::sync::OnceLock::<u32>::new());
            let c = cell.clone();
            let (started_tx, started_rx) = std::sync::mpsc::channel();
            rt.spawn(move || {
                c.get_or_init(|| {
                    started_tx.send(()).unwrap();
                    fiber::non_cancellable(|| loop {
                        let _ = fiber::sleep(Duration::from_secs(60));
                    })
                });
            });
            started_rx.recv().unwrap();
            let c = cell.clone();
            let waiter = std::thread::spawn(move || *c.get_or_init(|| 2));
            std::thread::sleep(ms(20));
            assert!(!waiter.is_finished(), "the thread waits for the running initializer");
            drop(rt);
            assert_eq!(waiter.join().unwrap(), 2);
            assert_eq!(cell.get(), Some(&2));
        })
    })
}

/// Go (WaitGroup): "calls with a positive delta that occur when the counter
/// is greater than zero may happen at any time", so a member added while
/// a Wait is in progress is waited for. crossbeam's shape: a member cloned
/// from a live one during a fiber's wait, then the original dropped: the
/// wait goes on until the clone is dropped too.
#[test]
fn waitgroup_member_cloned_during_a_wait_is_waited_for() {
    let _s = serial();
    common::on_runtime(|| {
        let wg = WaitGroup::new();
        let m1 = wg.clone();
        let w = fiber::spawn(move || wg.wait());
        fiber::sleep(ms(10)).unwrap();
        let m2 = m1.clone();
        drop(m1);
        fiber::sleep(ms(20)).unwrap();
        assert!(!w.is_finished(), "the wait returned with a member alive");
        drop(m2);
        w.join().unwrap();
    })
}

/// Kotlin (cancelAndJoin from outside): the job is cancelling (not active,
/// not completed, isCancelled) while a child runs non-cancellable clean-up,
/// and a plain thread's `cancel_and_join` returns only after it, with
/// CANCELLED.
#[test]
fn cancel_and_join_from_a_thread_waits_for_non_cancellable_cleanup_of_a_grandchild() {
    let _s = serial();
    within(60, || {
        let rt = common::rt();
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        let cleaned = Arc::new(AtomicBool::new(false));
        let c = cleaned.clone();
        let owner = rt.spawn(move || {
            fiber::scope(|s| {
                tx.send(s.job()).unwrap();
                s.spawn(move || {
                    fiber::scope(|s2| {
                        s2.spawn(move || {
                            park_until_cancelled();
                            fiber::non_cancellable(|| fiber::sleep(ms(100))).unwrap();
                            c.store(true, Ordering::SeqCst);
                        });
                    })
                });
            })
        });
        let job = rx.recv().unwrap();
        std::thread::sleep(ms(10));
        let j = job.clone();
        let t = std::thread::spawn(move || {
            let start = Instant::now();
            (j.cancel_and_join(), start.elapsed())
        });
        std::thread::sleep(ms(30));
        assert!(!job.is_active() && !job.is_completed() && job.is_cancelled());
        assert_eq!(job.state(), JobState::Cancelling);
        let (r, waited) = t.join().unwrap();
        assert_eq!(r, Ok(JobState::Cancelled));
        assert!(
            cleaned.load(Ordering::SeqCst),
            "returned only after the clean-up ({waited:?})"
        );
        owner.join().unwrap();
    })
}

/// std: `Mutex::lock` is not a cancellation point (spec/sync.md section 5).
/// A fiber waits for a mutex a plain thread holds; another plain thread
/// cancels the fiber's root job: the job is CANCELLING (not active, not
/// completed) while the wait goes on, a third thread's `Job::join` blocks,
/// and when the holder unlocks, the fiber gets the lock, returns, and both
/// the handle and the job report cancelled (cancelled before it finished),
/// with the lock usable afterwards.
#[test]
fn root_job_cancelled_from_a_thread_while_its_fiber_waits_for_a_thread_held_mutex() {
    let _s = serial();
    within(60, || {
        let rt = common::rt();
        let m = Arc::new(Mutex::new(0u32));
        let (hold_tx, hold_rx) = std::sync::mpsc::channel::<()>();
        let (locked_tx, locked_rx) = std::sync::mpsc::channel::<()>();
        let m1 = m.clone();
        let holder = std::thread::spawn(move || {
            let mut g = m1.lock().unwrap();
            locked_tx.send(()).unwrap();
            hold_rx.recv().unwrap();
            *g += 1;
        });
        locked_rx.recv().unwrap();
        let (job_tx, job_rx) = std::sync::mpsc::channel::<Job>();
        let m2 = m.clone();
        let f = rt.spawn(move || {
            job_tx.send(Job::current()).unwrap();
            let mut g = m2.lock().unwrap();
            *g += 10;
            *g
        });
        let job = job_rx.recv().unwrap();
        std::thread::sleep(ms(20));
        let j = job.clone();
        std::thread::spawn(move || j.cancel()).join().unwrap();
        assert_eq!(job.state(), JobState::Cancelling);
        let j = job.clone();
        let joiner = std::thread::spawn(move || j.join());
        std::thread::sleep(ms(20));
        assert!(
            !joiner.is_finished(),
            "the job cannot end while its fiber waits for the lock"
        );
        assert!(!f.is_finished(), "Mutex::lock is not a cancellation point");
        hold_tx.send(()).unwrap();
        holder.join().unwrap();
        assert_eq!(joiner.join().unwrap(), Ok(JobState::Cancelled));
        let r = f.join();
        assert!(matches!(&r, Err(e) if e.is_cancelled()), "{r:?}");
        assert_eq!(*m.lock().unwrap(), 11, "the fiber did take the lock and write");
        assert!(!m.is_poisoned());
    })
}

/// Go (RWMutex): "If any goroutine calls Lock while the lock is already
/// locked by one or more readers, concurrent calls to RLock will block
/// until the writer has acquired (and released) the lock." With a plain
/// thread holding a read lock, a fiber writer queued, and a fiber reader
/// arriving after it; the writer's job is cancelled (not a cancellation
/// point): the reader still waits behind the writer; when the thread lets
/// go, the writer goes first, then the reader.
/// Was (before the fix): a cancel interrupts the writer's non-cancellable wait, which unpublishes (granting the reader behind it) and re-queues at the back
#[test]
fn rwlock_writer_preference_holds_across_cancel_of_the_waiting_writer_with_a_thread_reader() {
    let _s = serial();
    within(60, || {
        let rt = common::rt();
        let l = Arc::new(fiber::sync::RwLock::new(Vec::<&'static str>::new()));
        let (rel_tx, rel_rx) = std::sync::mpsc::channel::<()>();
        let (in_tx, in_rx) = std::sync::mpsc::channel::<()>();
        let l1 = l.clone();
        let reader_thread = std::thread::spawn(move || {
            let g = l1.read().unwrap();
            in_tx.send(()).unwrap();
            rel_rx.recv().unwrap();
            drop(g);
        });
        in_rx.recv().unwrap();
        let l2 = l.clone();
        let writer = rt.spawn(move || {
            l2.write().unwrap().push("writer");
        });
        std::thread::sleep(ms(20));
        let l3 = l.clone();
        let reader = rt.spawn(move || {
            let g = l3.read().unwrap();
            g.clone()
        });
        std::thread::sleep(ms(20));
        assert!(
            !reader.is_finished(),
            "before the cancel: a reader arriving after a waiting writer waits"
        );
        assert!(!writer.is_finished());
        writer.cancel();
        std::thread::sleep(ms(20));
        assert!(
            !reader.is_finished(),
            "after the writer's cancel: a reader arriving after a waiting writer waits (writer preference)"
        );
        assert!(l.try_read().is_err(), "try_read fails while a writer waits");
        rel_tx.send(()).unwrap();
        reader_thread.join().unwrap();
        let _ = writer.join();
        assert_eq!(reader.join().unwrap(), vec!["writer"], "the writer went first");
    })
}

/// Go (sync.Mutex, starvation mode): "ownership of the mutex is directly
/// handed off from the unlocking goroutine to the waiter at the front of the
/// queue". A plain thread holds the mutex for 30 ms; fiber A queues, then
/// fiber B (both starving by then: spec/sync.md section 4, 1 ms). A's root
/// job is cancelled (a lock wait is not a cancellation point, so A waits
/// on, and keeps its place). On unlock the head, A, must get the lock
/// first.
#[test]
fn mutex_starving_head_keeps_its_place_when_its_job_is_cancelled() {
    let _s = serial();
    within(60, || {
        let rt = common::rt();
        let m = Arc::new(Mutex::new(Vec::<&'static str>::new()));
        let (rel_tx, rel_rx) = std::sync::mpsc::channel::<()>();
        let (in_tx, in_rx) = std::sync::mpsc::channel::<()>();
        let m0 = m.clone();
        let holder = std::thread::spawn(move || {
            let g = m0.lock().unwrap();
            in_tx.send(()).unwrap();
            rel_rx.recv().unwrap();
            drop(g);
        });
        in_rx.recv().unwrap();
        let ma = m.clone();
        let a = rt.spawn(move || {
            ma.lock().unwrap().push("A");
        });
        std::thread::sleep(ms(15));
        let mb = m.clone();
        let b = rt.spawn(move || {
            mb.lock().unwrap().push("B");
        });
        std::thread::sleep(ms(15));
        a.cancel();
        std::thread::sleep(ms(10));
        rel_tx.send(()).unwrap();
        holder.join().unwrap();
        let _ = a.join();
        let _ = b.join();
        assert_eq!(
            *m.lock().unwrap(),
            vec!["A", "B"],
            "the starving head keeps its place across a cancel"
        );
    })
}
