//! Review 66: standalone jobs (`Job::new`, `Job::new_supervisor`,
//! `complete`, `Job::spawn`, late children of an ended job) and completion
//! handlers run outside the ended job (`OutsideEndedJob`): where a handler
//! runs, what a scope it opens attaches to, races of `complete` with
//! cancel / failure / spawn, standalone jobs under timeouts,
//! `non_cancellable` and supervisors, and at runtime shutdown.

use crate::common::*;

use fiber::{Job, JobState};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn quiet() {
    crate::common::fuzz::quiet_panics(|p| {
        p.downcast_ref::<&str>().is_some_and(|s| s.starts_with("r66:"))
            || p.downcast_ref::<String>().is_some_and(|s| s.starts_with("r66:"))
    });
}

/// What a handler saw where it ran.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    state: JobState,
    current: Option<Job>,
    cancelled: bool,
}

fn record(into: &Arc<Mutex<Vec<Seen>>>) -> impl FnOnce(JobState) + Send + 'static {
    let into = into.clone();
    move |state| {
        into.lock().unwrap().push(Seen {
            state,
            current: Job::try_current(),
            cancelled: fiber::is_cancelled(),
        })
    }
}

/// Counts drops (a handler or closure freed).
struct DropFlag(Arc<AtomicUsize>);
impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.fetch_add(1, SeqCst);
    }
}

// ---------------------------------------------------------------------------
// (a) Where a standalone job's handler runs.

/// A parentless standalone job completed while its child still runs ends
/// on the child's fiber: its handler runs in no job (spec), not cancelled.
#[test]
fn handler_of_a_parentless_standalone_job_ended_by_its_last_child_runs_in_no_job() {
    on_runtime(|| {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let job = Job::new(None);
        job.invoke_on_completion(record(&seen));
        let (tx, rx) = fiber::chan::bounded::<()>(0);
        let child = job.spawn(move || rx.recv().is_ok());
        assert!(job.complete());
        assert!(job.is_active(), "ACTIVE until its child ends");
        tx.send(()).unwrap();
        assert!(child.join().unwrap());
        assert_eq!(job.join(), Ok(JobState::Completed));
        // A join that finds the job ended returns at once: the handler may
        // still be running on the child's fiber.
        wait_until("the handler ran", 10, || seen.lock().unwrap().len() == 1);
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].state, JobState::Completed);
        assert_eq!(seen[0].current, None, "in no job");
        assert!(!seen[0].cancelled, "no phantom cancellation");
    });
}

/// A standalone job with a parent (a scope's job), ended on its last
/// child's fiber: the handler runs in the parent; a scope it opens is the
/// parent's child, ends before the handler returns, and the parent's
/// scope waits for all of it.
#[test]
fn handler_of_a_standalone_child_opens_a_scope_in_the_parent() {
    on_runtime(|| {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let inner_ran = Arc::new(AtomicUsize::new(0));
        let outer_job = fiber::scope(|s| {
            let job = Job::new(Some(&s.job()));
            let seen2 = seen.clone();
            let inner_ran2 = inner_ran.clone();
            job.invoke_on_completion(move |state| {
                let parent_of_scope = fiber::scope(|inner| {
                    let r = inner_ran2.clone();
                    inner.spawn(move || {
                        fiber::yield_now().unwrap();
                        r.fetch_add(1, SeqCst);
                    });
                    inner.job().parent()
                });
                seen2
                    .lock()
                    .unwrap()
                    .push((state, Job::try_current(), parent_of_scope, fiber::is_cancelled()));
            });
            let (tx, rx) = fiber::chan::bounded::<()>(0);
            let child = job.spawn(move || rx.recv().is_ok());
            assert!(job.complete());
            s.spawn(move || tx.send(()).unwrap());
            assert!(child.join().unwrap());
            assert_eq!(job.join(), Ok(JobState::Completed));
            s.job()
        });
        assert_eq!(inner_ran.load(SeqCst), 1);
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].0, JobState::Completed);
        assert_eq!(seen[0].1.as_ref(), Some(&outer_job), "the handler ran in the parent");
        assert_eq!(seen[0].2.as_ref(), Some(&outer_job), "its scope attached to the parent");
        assert!(!seen[0].3);
        assert_eq!(outer_job.state(), JobState::Completed);
        assert!(outer_job.children().is_empty());
    });
}

/// A handler (running in the parent) that joins the parent, which waits
/// for the job whose handler this is: refused (panic, reported and
/// contained), not a self-deadlock.
#[test]
fn handler_joining_the_parent_it_runs_in_does_not_deadlock() {
    quiet();
    let out = within(10, || {
        rt().block_on(|| {
            let joined = Arc::new(Mutex::new(None));
            let j2 = joined.clone();
            let end = fiber::scope(|s| {
                let job = Job::new(Some(&s.job()));
                job.invoke_on_completion(move |_| {
                    if let Some(p) = Job::try_current() {
                        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p.join()));
                        *j2.lock().unwrap() = Some(r.is_err());
                    }
                });
                let (tx, rx) = fiber::chan::bounded::<()>(0);
                let child = job.spawn(move || rx.recv().is_ok());
                job.complete();
                tx.send(()).unwrap();
                child.join().unwrap();
                job.join()
            });
            let j = *joined.lock().unwrap();
            (end, j)
        })
    });
    assert_eq!(out.0, Ok(JobState::Completed));
    assert_eq!(out.1, Some(true), "the self-join was refused with a panic");
}

/// The parent cancelled while a handler (running in it) waits: the
/// handler's wait is interrupted (the fiber was registered in the parent).
#[test]
fn cancel_of_the_parent_interrupts_a_waiting_handler() {
    on_runtime(|| {
        let got = Arc::new(Mutex::new(None));
        let g2 = got.clone();
        let (started_tx, started_rx) = fiber::chan::bounded::<()>(1);
        let parent = Job::new(None);
        let job = Job::new(Some(&parent));
        job.invoke_on_completion(move |_| {
            started_tx.send(()).unwrap();
            let r = fiber::sleep(Duration::from_secs(20));
            *g2.lock().unwrap() = Some(r.is_err());
        });
        let (tx, rx) = fiber::chan::bounded::<()>(0);
        let child = job.spawn(move || rx.recv().is_ok());
        assert!(job.complete());
        tx.send(()).unwrap();
        started_rx.recv().unwrap();
        parent.cancel();
        assert!(child.join().unwrap());
        assert_eq!(job.join(), Ok(JobState::Completed));
        assert_eq!(parent.join(), Ok(JobState::Cancelled));
        assert_eq!(*got.lock().unwrap(), Some(true), "the handler's sleep was interrupted");
    });
}

/// A scope opened inside `non_cancellable` has no parent: its handler,
/// run by the owner at the scope's end, runs in a live job (the owner's)
/// and sees no cancellation; after the section the fiber is back in its
/// own job.
#[test]
fn handler_of_a_detached_scope_in_non_cancellable() {
    on_runtime(|| {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let me = Job::current();
        fiber::non_cancellable(|| {
            fiber::scope(|s| {
                s.job().invoke_on_completion(record(&seen));
                assert_eq!(s.job().parent(), None);
            });
        });
        assert_eq!(Job::try_current().as_ref(), Some(&me), "back in the fiber's job");
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].state, JobState::Completed);
        assert!(!seen[0].cancelled);
        // The owner ended the scope after it was back in its own job: the
        // handler runs there (neither "the parent" nor "no job", as the
        // rustdoc words it, but a live job).
        assert_eq!(seen[0].current.as_ref(), Some(&me));
    });
}

/// A parentless standalone job's handler on its last child's fiber opens
/// a scope (in no job): it runs its children and the scope's job is
/// parentless, ACTIVE-free at the end.
#[test]
fn scope_in_a_handler_that_runs_in_no_job_works() {
    on_runtime(|| {
        let got = Arc::new(Mutex::new(None));
        let g2 = got.clone();
        let job = Job::new(None);
        job.invoke_on_completion(move |_| {
            let (v, sj) = fiber::scope(|s| (s.spawn(|| 7).join().unwrap(), s.job()));
            *g2.lock().unwrap() = Some((v, sj.parent(), sj.state(), Job::try_current()));
        });
        let (tx, rx) = fiber::chan::bounded::<()>(0);
        let child = job.spawn(move || rx.recv().is_ok());
        job.complete();
        tx.send(()).unwrap();
        child.join().unwrap();
        assert_eq!(job.join(), Ok(JobState::Completed));
        // A join that finds the job ended returns at once, possibly while
        // the handler (which waits here: its scope joins a child) still
        // runs on the fiber that ended the job; only parked joiners are
        // woken after the handlers.
        wait_until("the handler ran", 10, || got.lock().unwrap().is_some());
        let got = got.lock().unwrap().take().expect("the handler ran");
        assert_eq!(got.0, 7);
        assert_eq!(got.1, None);
        assert_eq!(got.2, JobState::Completed);
        assert_eq!(got.3, None, "no root job was left installed in the handler");
    });
}

// ---------------------------------------------------------------------------
// (b) Races on two workers and from plain threads.

/// `complete` from a plain thread racing `spawn` from a fiber: the job
/// always ends COMPLETED; a child spawned before the end ran (the job
/// ended after it), one spawned after started cancelled.
#[test]
fn complete_from_a_thread_racing_spawn_from_a_fiber() {
    within(30, || {
        let rt = rt2();
        for _ in 0..200 {
            let job = Job::new(None);
            let j2 = job.clone();
            let completer = std::thread::spawn(move || j2.complete());
            let (res, child_state) = rt.block_on({
                let job = job.clone();
                move || {
                    let h = job.spawn(|| 5u32);
                    let cj = h.job();
                    (h.join(), cj)
                }
            });
            assert!(completer.join().unwrap());
            assert_eq!(job.join(), Ok(JobState::Completed));
            match res {
                Ok(v) => assert_eq!(v, 5),
                Err(e) => assert!(e.is_cancelled(), "{e:?}"),
            }
            assert!(child_state.state().is_terminal());
        }
    });
}

/// `complete` racing `cancel` from two plain threads, with and without a
/// live child: exactly one of them wins, and the final state says which.
#[test]
fn complete_racing_cancel_from_threads() {
    within(30, || {
        let rt = rt2();
        for round in 0..300 {
            let job = Job::new(None);
            let (tx, rx) = fiber::chan::bounded::<()>(0);
            let child = if round % 2 == 0 {
                let job = job.clone();
                Some(rt.block_on(move || job.spawn(move || rx.recv().is_ok())))
            } else {
                None
            };
            let (a, b) = (job.clone(), job.clone());
            let c = std::thread::spawn(move || a.complete());
            let k = std::thread::spawn(move || b.cancel());
            let completed = c.join().unwrap();
            k.join().unwrap();
            drop(tx);
            let end = job.join().unwrap();
            if child.is_some() {
                // Cancel always lands (the child still runs): CANCELLED.
                assert_eq!(end, JobState::Cancelled);
            } else if completed {
                assert_eq!(end, JobState::Completed);
            } else {
                assert_eq!(end, JobState::Cancelled);
            }
            if let Some(h) = child {
                let _ = rt.block_on(move || h.join());
            }
        }
    });
}

/// A child's panic racing `complete`: a plain standalone job ends FAILED
/// whichever came first; a supervisor ends COMPLETED.
#[test]
fn child_failure_racing_complete() {
    quiet();
    within(30, || {
        let rt = rt2();
        for round in 0..200 {
            let sup = round % 2 == 1;
            let job = if sup { Job::new_supervisor(None) } else { Job::new(None) };
            let j2 = job.clone();
            let h = rt.block_on(move || j2.spawn(|| -> u32 { panic!("r66: child fails") }));
            let completed = job.complete();
            let end = job.join().unwrap();
            if sup {
                assert!(completed);
                assert_eq!(end, JobState::Completed);
            } else {
                assert_eq!(end, JobState::Failed, "completed={completed}");
            }
            let e = rt.block_on(move || h.join().unwrap_err());
            assert!(e.is_panic());
        }
    });
}

// ---------------------------------------------------------------------------
// (c) Standalone jobs under other parents.

/// A standalone job under a `with_timeout` job, never completed, while the
/// `with_timeout` body is still running at the deadline: the watchdog's
/// cancel reaches it, its child is cancelled, `with_timeout` returns
/// `Err(TimedOut)` and the job ends CANCELLED.
#[test]
fn standalone_job_under_with_timeout_whose_body_runs_past_the_deadline() {
    on_runtime(|| {
        let slot = Arc::new(Mutex::new(None));
        let s2 = slot.clone();
        let r = fiber::with_timeout(ms(100), move || {
            let job = Job::new(Some(&Job::current()));
            let _child = job.spawn(|| fiber::sleep(Duration::from_secs(20)).is_ok());
            *s2.lock().unwrap() = Some(job);
            let _ = fiber::sleep(Duration::from_secs(20));
        });
        let job = slot.lock().unwrap().take().unwrap();
        assert!(r.is_err(), "timed out");
        assert_eq!(job.join(), Ok(JobState::Cancelled));
    });
}

/// The same, but the `with_timeout` body returns before the deadline
/// (Kotlin: `withTimeout(100) { Job(coroutineContext.job) }` times out,
/// cancelling the job). The watchdog exits when the body returns, so
/// nothing ever cancels the standalone child: it reads CANCELLING once
/// the deadline passed (`observed_state`) but its raw state stays ACTIVE
/// and its "body" is never marked done (only `cancel_one` / `complete` do
/// that), so it never ends and `with_timeout` waits for it for ever. The
/// spec (jobs.md 1, "Standalone jobs") says the body counts as done when
/// the job leaves ACTIVE through "an inherited deadline".
// Failed before the fix: with_timeout never returns: its standalone child is never cancelled at the deadline once the body returned (watchdog gone), so it never ends
#[test]
fn standalone_job_under_with_timeout_whose_body_returned_ends_at_the_deadline() {
    in_child(
        "standalone_job_under_with_timeout_whose_body_returned_ends_at_the_deadline",
        4,
        || {
            rt().block_on(|| {
                let slot = Arc::new(Mutex::new(None));
                let s2 = slot.clone();
                let r = fiber::with_timeout(ms(100), move || {
                    let job = Job::new(Some(&Job::current()));
                    *s2.lock().unwrap() = Some(job);
                });
                let job = slot.lock().unwrap().take().unwrap();
                assert!(r.is_err(), "timed out");
                assert_eq!(job.join(), Ok(JobState::Cancelled));
            })
        },
    );
}

/// The same with a child parked in the standalone job: the child's own
/// wait ends at the inherited deadline, but the standalone job does not.
// Failed before the fix: as above; the child times out on its own, the standalone job stays (raw) ACTIVE with no child and never ends
#[test]
fn standalone_job_with_a_child_under_with_timeout_whose_body_returned() {
    in_child(
        "standalone_job_with_a_child_under_with_timeout_whose_body_returned",
        4,
        || {
            rt().block_on(|| {
                let slot = Arc::new(Mutex::new(None));
                let s2 = slot.clone();
                let r = fiber::with_timeout(ms(100), move || {
                    let job = Job::new(Some(&Job::current()));
                    let child = job.spawn(|| fiber::sleep(Duration::from_secs(20)).is_ok());
                    *s2.lock().unwrap() = Some((job, child));
                });
                let (job, child) = slot.lock().unwrap().take().unwrap();
                assert!(r.is_err(), "timed out");
                assert!(child.join().is_err());
                assert_eq!(job.join(), Ok(JobState::Cancelled));
            })
        },
    );
}

/// A standalone job made with an explicit parent inside `non_cancellable`
/// is that parent's child; cancelling the parent inside the section still
/// reaches it (the section holds off the fiber's own waits only).
#[test]
fn standalone_job_with_an_explicit_parent_inside_non_cancellable() {
    on_runtime(|| {
        let parent = Job::new(None);
        let job = fiber::non_cancellable(|| Job::new(Some(&parent)));
        assert_eq!(job.parent(), Some(parent.clone()));
        let child = job.spawn(|| fiber::sleep(Duration::from_secs(20)).is_ok());
        parent.cancel();
        assert!(child.join().unwrap_err().is_cancelled());
        assert_eq!(job.join(), Ok(JobState::Cancelled));
        assert_eq!(parent.join(), Ok(JobState::Cancelled));
    });
}

/// A supervisor standalone parent: a failing standalone child fails
/// itself only.
#[test]
fn standalone_child_of_a_standalone_supervisor_fails_alone() {
    quiet();
    on_runtime(|| {
        let sup = Job::new_supervisor(None);
        let a = Job::new(Some(&sup));
        let b = Job::new(Some(&sup));
        let hb = b.spawn(|| fiber::sleep(ms(50)).is_ok());
        let ha = a.spawn(|| -> () { panic!("r66: a fails") });
        assert!(ha.join().unwrap_err().is_panic());
        assert_eq!(a.join(), Ok(JobState::Failed));
        assert!(sup.is_active());
        assert!(b.complete());
        assert!(hb.join().unwrap());
        assert_eq!(b.join(), Ok(JobState::Completed));
        assert!(sup.complete());
        assert_eq!(sup.join(), Ok(JobState::Completed));
    });
}

// ---------------------------------------------------------------------------
// (d) Shutdown, late children, handler lifetime.

/// A standalone job whose children are parked when the runtime is
/// dropped: the children are cancelled by the shutdown; from a plain
/// thread afterwards, `complete` ends the job (no hang).
#[test]
fn standalone_job_after_runtime_shutdown_completes_from_a_thread() {
    within(10, || {
        let job = Job::new(None);
        let handles = {
            let rt = rt2();
            let j2 = job.clone();
            let hs = rt.block_on(move || {
                (0..4)
                    .map(|_| j2.spawn(|| fiber::sleep(Duration::from_secs(30)).is_ok()))
                    .collect::<Vec<_>>()
            });
            drop(rt);
            hs
        };
        assert!(job.children().is_empty(), "the shutdown ended every child");
        assert!(job.is_active(), "nobody completed or cancelled it");
        assert!(job.complete());
        assert_eq!(job.join(), Ok(JobState::Completed));
        for h in handles {
            assert!(h.is_finished());
        }
    });
}

/// Same, ended with `cancel` from a plain thread.
#[test]
fn standalone_job_after_runtime_shutdown_cancels_from_a_thread() {
    within(10, || {
        let job = Job::new(None);
        {
            let rt = rt2();
            let j2 = job.clone();
            rt.block_on(move || {
                for _ in 0..3 {
                    j2.spawn(|| fiber::sleep(Duration::from_secs(30)).is_ok());
                }
            });
        }
        job.cancel();
        assert_eq!(job.join(), Ok(JobState::Cancelled));
    });
}

/// Spawns into an ended job: each child starts cancelled, its closure is
/// dropped unrun, and nothing stays in the ended job's list.
#[test]
fn late_children_of_an_ended_job_are_released() {
    on_runtime(|| {
        let job = Job::new(None);
        assert!(job.complete());
        let drops = Arc::new(AtomicUsize::new(0));
        let mut handles = Vec::new();
        for _ in 0..50 {
            let flag = DropFlag(drops.clone());
            handles.push(job.spawn(move || {
                let _f = flag;
                1u8
            }));
        }
        for h in handles {
            assert!(h.join().unwrap_err().is_cancelled());
        }
        assert_eq!(drops.load(SeqCst), 50, "every closure dropped");
        assert!(job.children().is_empty());
        assert_eq!(job.state(), JobState::Completed);
    });
}

/// A handler capturing its own job is freed at the job's end (no cycle
/// through the handler list).
#[test]
fn handler_capturing_its_job_is_dropped_at_the_end() {
    on_runtime(|| {
        let drops = Arc::new(AtomicUsize::new(0));
        let job = Job::new(None);
        let (j2, flag) = (job.clone(), DropFlag(drops.clone()));
        job.invoke_on_completion(move |_| {
            let _keep = (&j2, &flag);
        });
        let h = job.spawn(|| fiber::yield_now().is_ok());
        job.complete();
        h.join().unwrap();
        job.join().unwrap();
        // As above: the handler (and its drop) may still be under way.
        wait_until("the handler was dropped", 10, || drops.load(SeqCst) == 1);
        assert_eq!(drops.load(SeqCst), 1);
    });
}

/// A handler that spawns into the standalone job whose handler it is
/// (ended): the late child starts cancelled, and the job stays as it
/// ended.
#[test]
fn handler_spawning_into_its_own_ended_job() {
    on_runtime(|| {
        let got = Arc::new(Mutex::new(None));
        let g2 = got.clone();
        let job = Job::new(None);
        let j2 = job.clone();
        job.invoke_on_completion(move |_| {
            let h = j2.spawn(|| 1u8);
            *g2.lock().unwrap() = Some(h.join().map_err(|e| e.is_cancelled()));
        });
        let h = job.spawn(|| fiber::yield_now().is_ok());
        job.complete();
        h.join().unwrap();
        assert_eq!(job.join(), Ok(JobState::Completed));
        // As above: the handler waits (its join), so it may still run.
        wait_until("the handler ran", 10, || got.lock().unwrap().is_some());
        assert_eq!(*got.lock().unwrap(), Some(Err(true)));
        assert_eq!(job.state(), JobState::Completed);
        assert!(job.children().is_empty());
    });
}

/// `invoke_on_completion` on a standalone job ended by a cancel from a
/// plain thread runs on that thread with CANCELLED.
#[test]
fn handler_of_a_standalone_job_cancelled_from_a_thread() {
    within(10, || {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let job = Job::new(None);
        job.invoke_on_completion(record(&seen));
        job.cancel();
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 1, "ran during cancel");
        assert_eq!(seen[0].state, JobState::Cancelled);
        assert_eq!(seen[0].current, None);
        assert_eq!(job.join(), Ok(JobState::Cancelled));
        assert!(!job.complete());
    });
}
