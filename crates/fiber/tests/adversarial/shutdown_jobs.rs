//! Adversarial: the jobs of fibers that shutdown cancels. spec/jobs.md: a
//! fiber's root job ends "CANCELLED if it was cancelled (through the job,
//! its JoinHandle, or its runtime's shutdown)", and a scoped child whose
//! job was cancelled before its closure returned ends cancelled. Shutdown
//! cancels through the runtime, not through the job tree, and only root
//! jobs heard of it: scoped children, scopes, supervisor scopes and
//! `with_timeout` blocks ended COMPLETED. And the root job of a fiber
//! abandoned at shutdown (a `blocking` call outliving the grace time)
//! never ended, so a `Job::join` on it waited for ever while the fiber's
//! `JoinHandle` had already reported cancelled.

use fiber::{Job, JobState};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::{in_child, ms, within};

struct Counted(Arc<AtomicUsize>);
impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, SeqCst);
    }
}

#[test]
fn shutdown_ends_every_job_and_handle_cancelled_and_drops_once() {
    let drops = Arc::new(AtomicUsize::new(0));
    let made = Arc::new(AtomicUsize::new(0));
    let jobs: Arc<Mutex<Vec<Job>>> = Arc::default();
    let (d, m, j) = (drops.clone(), made.clone(), jobs.clone());
    let handles = within(30, move || {
        let rt = fiber::Runtime::builder()
            .workers(2)
            .shutdown_timeout(ms(300))
            .build()
            .unwrap();
        let mut handles = vec![];
        for k in 0..3 {
            let (d, m, j) = (d.clone(), m.clone(), j.clone());
            handles.push(rt.spawn(move || {
                let _c = Counted(d.clone());
                m.fetch_add(1, SeqCst);
                j.lock().unwrap().push(Job::current());

                let r = fiber::with_timeout(Duration::from_secs(3600), || {
                    j.lock().unwrap().push(Job::current());
                    fiber::scope(|s| {
                        j.lock().unwrap().push(s.job());
                        for i in 0..2 {
                            let (d, m, j) = (d.clone(), m.clone(), j.clone());
                            s.spawn(move || {
                                let _c = Counted(d.clone());
                                m.fetch_add(1, SeqCst);
                                j.lock().unwrap().push(Job::current());
                                fiber::supervisor_scope(|s2| {
                                    j.lock().unwrap().push(s2.job());
                                    let (d, m, j) = (d.clone(), m.clone(), j.clone());
                                    s2.spawn(move || {
                                        let _c = Counted(d);
                                        m.fetch_add(1, SeqCst);
                                        j.lock().unwrap().push(Job::current());
                                        match (k + i) % 3 {
                                            0 => {
                                                let (_tx, rx) = fiber::chan::bounded::<u8>(0);
                                                let _ = rx.recv();
                                            }
                                            1 => fiber::park(),
                                            _ => {
                                                let _ = fiber::with_timeout(Duration::from_secs(999), || {
                                                    fiber::sleep(Duration::MAX)
                                                });
                                            }
                                        }
                                    });
                                });
                            });
                        }
                    })
                });
                r.is_ok()
            }));
        }
        std::thread::sleep(ms(100));
        drop(rt);
        handles
    });
    assert_eq!(made.load(SeqCst), 3 + 3 * 2 * 2);
    assert_eq!(
        drops.load(SeqCst),
        made.load(SeqCst),
        "each destructor ran exactly once"
    );
    for h in handles {
        let r = h.join();
        assert!(matches!(r, Err(ref e) if e.is_cancelled()), "{r:?}");
    }
    let jobs = jobs.lock().unwrap();
    assert_eq!(jobs.len(), 3 * (1 + 1 + 1 + 2 * 3));
    let states: Vec<_> = jobs.iter().map(|j| (j.id(), j.state(), j.cancel_reason())).collect();
    for job in jobs.iter() {
        assert_eq!(job.state(), JobState::Cancelled, "{job:?} all: {states:?}");
        assert_eq!(job.join(), Ok(JobState::Cancelled));
    }
}

// The root job of a fiber cancelled by shutdown ends CANCELLED (spec); a
// scoped child of it, cancelled by the same shutdown (its recv returned
// Err and fiber::is_cancelled() was true inside), must not end COMPLETED.
#[test]
fn scoped_child_cancelled_by_shutdown_ends_cancelled_like_the_root_job() {
    let jobs: Arc<Mutex<Vec<(&'static str, Job)>>> = Arc::default();
    let saw_cancel = Arc::new(AtomicUsize::new(0));
    let (j, sc) = (jobs.clone(), saw_cancel.clone());
    within(30, move || {
        let rt = fiber::Runtime::builder()
            .workers(2)
            .shutdown_timeout(ms(300))
            .build()
            .unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        rt.spawn(move || {
            j.lock().unwrap().push(("root", Job::current()));
            fiber::scope(|s| {
                j.lock().unwrap().push(("scope", s.job()));
                let (j, sc) = (j.clone(), sc.clone());
                s.spawn(move || {
                    j.lock().unwrap().push(("child", Job::current()));
                    let (_keep, rx2) = fiber::chan::bounded::<u8>(0);
                    tx.send(()).unwrap();
                    let r = rx2.recv();
                    if r.is_err() && fiber::is_cancelled() {
                        sc.fetch_add(1, SeqCst);
                    }
                    drop(_keep);
                });
            });
        });
        rx.recv().unwrap();
        std::thread::sleep(ms(50));
        drop(rt);
    });
    assert_eq!(saw_cancel.load(SeqCst), 1, "the child saw its cancellation");
    let jobs = jobs.lock().unwrap();
    let states: Vec<_> = jobs.iter().map(|(n, j)| (*n, j.state(), j.cancel_reason())).collect();
    assert_eq!(jobs[0].1.state(), JobState::Cancelled, "{states:?}");
    for (name, job) in jobs.iter() {
        assert!(job.is_cancelled(), "{name} job: {states:?}");
    }
}

// spec/jobs.md: "The handle and the root job agree." A fiber abandoned at
// shutdown (a blocking call outliving the grace time): its JoinHandle join
// is released with Cancelled (spec/reliability.md); its root job must end
// too, so a plain thread in Job::join is not left waiting forever.
#[test]
fn root_job_of_a_fiber_abandoned_in_a_long_blocking_call_ends() {
    in_child("root_job_of_a_fiber_abandoned_in_a_long_blocking_call_ends", 40, || {
        let rt = fiber::Runtime::builder()
            .workers(1)
            .shutdown_timeout(ms(100))
            .build()
            .unwrap();
        let (in_tx, in_rx) = std::sync::mpsc::channel();
        let h = rt.spawn(move || {
            let job = Job::current();
            fiber::blocking(move || {
                in_tx.send(job).unwrap();
                std::thread::sleep(ms(6_000));
            });
            5
        });
        let job = in_rx.recv().unwrap();
        drop(rt);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(h.join().map_err(|e| e.is_cancelled()));
        });
        let r = rx
            .recv_timeout(Duration::from_secs(2))
            .expect("handle join never returned");
        assert_eq!(r, Err(true));
        let (tx, rx) = std::sync::mpsc::channel();
        let j = job.clone();
        std::thread::spawn(move || {
            let _ = tx.send(j.join());
        });
        let r = rx.recv_timeout(Duration::from_secs(2));
        assert!(
            matches!(r, Ok(Ok(JobState::Cancelled))),
            "Job::join of the abandoned fiber's root job: {r:?}; job state {:?}",
            job.state()
        );
        std::process::exit(0);
    });
}

// The same with the blocking call in a scoped child: the child fiber and
// the scope's owner are both abandoned (the scope waits for a child that
// waits for a call that outlives the grace time). Every job of the tree
// (the owner's root job, the scope's job, the child's job) must still end,
// so no Job::join hangs.
#[test]
fn jobs_of_a_fiber_abandoned_with_an_open_scope_end() {
    in_child("jobs_of_a_fiber_abandoned_with_an_open_scope_end", 40, || {
        let rt = fiber::Runtime::builder()
            .workers(1)
            .shutdown_timeout(ms(100))
            .build()
            .unwrap();
        let (in_tx, in_rx) = std::sync::mpsc::channel();
        let h = rt.spawn(move || {
            let root = Job::current();
            fiber::scope(|s| {
                let scope_job = Job::current();
                s.spawn(move || {
                    let child = Job::current();
                    fiber::blocking(move || {
                        in_tx.send([root, scope_job, child]).unwrap();
                        std::thread::sleep(ms(6_000));
                    });
                });
            });
            5
        });
        let jobs = in_rx.recv().unwrap();
        drop(rt);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(h.join().map_err(|e| e.is_cancelled()));
        });
        let r = rx
            .recv_timeout(Duration::from_secs(2))
            .expect("handle join never returned");
        assert_eq!(r, Err(true));
        for (name, job) in ["root", "scope", "child"].iter().zip(jobs.iter()) {
            let (tx, rx) = std::sync::mpsc::channel();
            let j = job.clone();
            std::thread::spawn(move || {
                let _ = tx.send(j.join());
            });
            let r = rx.recv_timeout(Duration::from_secs(2));
            assert!(
                matches!(r, Ok(Ok(JobState::Cancelled))),
                "Job::join of the {name} job: {r:?}; job state {:?}",
                job.state()
            );
        }
        std::process::exit(0);
    });
}

/// A job made under a fiber of runtime A runs a child on runtime B (`Job`
/// is `Send`; `Job::spawn` starts on the caller's runtime), and that child
/// opens a scope whose child borrows its stack inside `fiber::blocking`.
/// Runtime A shuts down and gives its fiber up (it sits in a blocking
/// call): ending the given-up fiber's job tree must not end the jobs whose
/// bodies still run on B. Ended, the scope on B returned with its child
/// still running on the borrowed stack.
// Failed before the fix: a scope on runtime B returned while its child still ran
#[test]
fn a_shutdown_leaves_the_jobs_of_its_tree_that_run_on_another_runtime_alone() {
    within(30, || {
        let rt_a = crate::common::rt_fixed_grace(1, ms(20));
        let rt_b = crate::common::rt2();
        let (job_tx, job_rx) = std::sync::mpsc::channel();
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let (seen_tx, seen_rx) = std::sync::mpsc::channel::<bool>();
        rt_a.spawn(move || {
            job_tx.send(Job::new(Some(&Job::current()))).unwrap();
            fiber::blocking(move || {
                let _ = held_tx.send(());
                std::thread::sleep(ms(600));
            });
        });
        let job = job_rx.recv().unwrap();
        held_rx.recv().unwrap();
        let outcome = rt_b.spawn(move || {
            job.spawn(move || {
                let child_done = std::sync::atomic::AtomicBool::new(false);
                fiber::scope(|s| {
                    s.spawn(|| {
                        fiber::blocking(|| {
                            go_tx.send(()).unwrap();
                            std::thread::sleep(ms(300));
                            child_done.store(true, SeqCst);
                        })
                    });
                });
                // The scope returned: its child must have ended.
                seen_tx.send(child_done.load(SeqCst)).unwrap();
            })
            .join()
        });
        go_rx.recv().unwrap();
        drop(rt_a);
        assert!(
            seen_rx.recv().unwrap(),
            "a scope on runtime B returned while its child still ran"
        );
        // The shutdown of A cancelled the tree (B's job included): the job
        // ends cancelled, once its body has returned.
        let joined = outcome.join().unwrap();
        assert!(joined.as_ref().is_err_and(|e| e.is_cancelled()), "{joined:?}");
    });
}
