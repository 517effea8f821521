//! Adversarial: a fiber's `JoinHandle` and its root job report one outcome
//! (spec/jobs.md: `JoinHandle::cancel` is one code path with the job tree),
//! also when a cancel from another thread races the body's return; jobs
//! torn down by their runtime's shutdown end CANCELLED, not FAILED (in
//! Kotlin, cancellation is not a failure); and no job made while a fiber's
//! locals are dropped is left alive.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::{in_child, ms, rt1, within};

fn job_stats() -> fiber::JobStats {
    rt1().block_on(|| fiber::stats().jobs)
}

fn assert_no_live_jobs(what: &str) {
    let s = job_stats();
    let ended = s.jobs_completed + s.jobs_failed + s.jobs_cancelled;
    assert_eq!(s.jobs_created, ended, "{what}: jobs left alive: {s:?}");
}

#[test]
fn join_handle_outcome_and_root_job_state_agree_when_cancelled_from_a_thread() {
    within(120, || {
        let rt = crate::common::rt();
        let mut mismatches = Vec::new();
        let mut outcomes = [0usize; 2];
        for i in 0..10000u64 {
            let (tx, rx) = std::sync::mpsc::channel::<fiber::Job>();
            let go = Arc::new(AtomicBool::new(false));
            let go2 = go.clone();
            let h = rt.spawn(move || {
                tx.send(fiber::Job::current()).unwrap();
                while !go2.load(Ordering::Acquire) {
                    std::hint::spin_loop();
                }
                1u32
            });
            let job = rx.recv().unwrap();
            go.store(true, Ordering::Release);
            for _ in 0..(i % 400) {
                std::hint::spin_loop();
            }
            h.cancel();
            let r = h.join();
            let st = job.join().unwrap();
            outcomes[r.is_ok() as usize] += 1;
            let consistent = match &r {
                Ok(_) => st == fiber::JobState::Completed,
                Err(e) if e.is_cancelled() => st == fiber::JobState::Cancelled,
                Err(_) => false,
            };
            if !consistent {
                mismatches.push((i, format!("{r:?}"), st));
            }
        }
        eprintln!("cancelled/ok = {outcomes:?}");
        assert!(
            mismatches.is_empty(),
            "JoinHandle and root job disagree {} times: {:?}",
            mismatches.len(),
            &mismatches[..mismatches.len().min(5)]
        );
    })
}

/// The same race through the job itself (`Job::cancel`): the handle follows
/// the job's final state.
#[test]
fn join_handle_outcome_and_root_job_state_agree_when_the_job_is_cancelled_from_a_thread() {
    within(120, || {
        let rt = crate::common::rt();
        let mut mismatches = Vec::new();
        let mut outcomes = [0usize; 2];
        for i in 0..10000u64 {
            let (tx, rx) = std::sync::mpsc::channel::<fiber::Job>();
            let go = Arc::new(AtomicBool::new(false));
            let go2 = go.clone();
            let h = rt.spawn(move || {
                tx.send(fiber::Job::current()).unwrap();
                while !go2.load(Ordering::Acquire) {
                    std::hint::spin_loop();
                }
                1u32
            });
            let job = rx.recv().unwrap();
            go.store(true, Ordering::Release);
            for _ in 0..(i % 400) {
                std::hint::spin_loop();
            }
            job.cancel();
            let r = h.join();
            let st = job.join().unwrap();
            outcomes[r.is_ok() as usize] += 1;
            let consistent = match &r {
                Ok(_) => st == fiber::JobState::Completed,
                Err(e) if e.is_cancelled() => st == fiber::JobState::Cancelled,
                Err(_) => false,
            };
            if !consistent {
                mismatches.push((i, format!("{r:?}"), st));
            }
        }
        eprintln!("cancelled/ok = {outcomes:?}");
        assert!(
            mismatches.is_empty(),
            "JoinHandle and root job disagree {} times: {:?}",
            mismatches.len(),
            &mismatches[..mismatches.len().min(5)]
        );
    })
}

#[test]
fn root_job_of_a_fiber_torn_down_in_a_lock_ends_cancelled_like_its_handle() {
    in_child(
        "root_job_of_a_fiber_torn_down_in_a_lock_ends_cancelled_like_its_handle",
        30,
        || {
            let (tx, rx) = std::sync::mpsc::channel::<fiber::Job>();
            let rt = crate::common::rt();
            let lock = Arc::new(fiber::sync::Mutex::new(()));
            let g = lock.lock().unwrap();
            let l2 = lock.clone();
            let h = rt.spawn(move || {
                tx.send(fiber::Job::current()).unwrap();
                let _g = l2.lock(); // not a cancellation point: unwound at teardown
            });
            let job = rx.recv().unwrap();
            std::thread::sleep(ms(30));
            drop(rt);
            let r = h.join();
            let st = within(5, move || job.join());
            drop(g);
            eprintln!("handle: {r:?}, job: {st:?}");
            assert!(r.unwrap_err().is_cancelled());
            assert_eq!(
                st,
                Ok(fiber::JobState::Cancelled),
                "spec/jobs.md: a root job cancelled by shutdown ends CANCELLED"
            );
            assert_no_live_jobs("root job torn down");
        },
    );
}

#[test]
fn teardown_of_a_scope_owner_in_a_lock_ends_its_jobs_cancelled() {
    in_child(
        "teardown_of_a_scope_owner_in_a_lock_ends_its_jobs_cancelled",
        30,
        || {
            let (tx, rx) = std::sync::mpsc::channel::<fiber::Job>();
            let rt = crate::common::rt();
            let lock = Arc::new(fiber::sync::Mutex::new(()));
            let g = lock.lock().unwrap();
            let l2 = lock.clone();
            rt.block_on(move || {
                drop(fiber::spawn(move || {
                    fiber::scope(|s| {
                        tx.send(s.job()).unwrap();
                        s.spawn(|| {
                            let _ = fiber::sleep(Duration::MAX);
                        });
                        let _g = l2.lock(); // non-cancellable: unwound at teardown
                    });
                }));
                fiber::sleep(ms(30)).unwrap();
            });
            let job = rx.recv().unwrap();
            drop(rt);
            let st = within(5, move || job.join());
            drop(g);
            eprintln!("scope job after teardown: {st:?}");
            assert_no_live_jobs("scope owner torn down in a lock");
            assert_eq!(
                st,
                Ok(fiber::JobState::Cancelled),
                "a scope torn down by shutdown is cancelled, not failed"
            );
        },
    );
}

#[test]
fn teardown_of_with_timeout_body_in_a_lock_ends_its_jobs() {
    in_child("teardown_of_with_timeout_body_in_a_lock_ends_its_jobs", 30, || {
        let (tx, rx) = std::sync::mpsc::channel::<fiber::Job>();
        let rt = crate::common::rt();
        let lock = Arc::new(fiber::sync::Mutex::new(()));
        let g = lock.lock().unwrap();
        let l2 = lock.clone();
        rt.block_on(move || {
            drop(fiber::spawn(move || {
                let _ = fiber::with_timeout(Duration::from_secs(3600), || {
                    tx.send(fiber::Job::current()).unwrap();
                    let _g = l2.lock();
                });
            }));
            fiber::sleep(ms(30)).unwrap();
        });
        let job = rx.recv().unwrap();
        drop(rt);
        let st = within(5, move || job.join());
        drop(g);
        eprintln!("with_timeout job after teardown: {st:?}");
        assert_no_live_jobs("with_timeout torn down in a lock");
        assert_eq!(
            st,
            Ok(fiber::JobState::Cancelled),
            "a with_timeout job torn down by shutdown is cancelled, not failed"
        );
    });
}

static LOCAL_JOB: std::sync::Mutex<Option<fiber::Job>> = std::sync::Mutex::new(None);

struct GrabJobOnDrop;
impl Drop for GrabJobOnDrop {
    fn drop(&mut self) {
        let job = fiber::Job::try_current();
        // a scope in a destructor is legitimate structured code
        let n = fiber::scope(|s| s.spawn(|| 3).join().unwrap());
        assert_eq!(n, 3);
        *LOCAL_JOB.lock().unwrap() = job;
    }
}

fiber::fiber_local! {
    static GRAB: std::cell::RefCell<Option<GrabJobOnDrop>> = std::cell::RefCell::new(None);
}

#[test]
fn a_job_made_in_a_fiber_local_destructor_ends() {
    in_child("a_job_made_in_a_fiber_local_destructor_ends", 30, || {
        let rt = crate::common::rt();
        let h = rt.spawn(|| {
            GRAB.with(|g| *g.borrow_mut() = Some(GrabJobOnDrop));
            7
        });
        assert_eq!(h.join().unwrap(), 7);
        std::thread::sleep(ms(50));
        let job = LOCAL_JOB.lock().unwrap().take();
        eprintln!("job seen by the fiber-local destructor: {job:?}");
        if let Some(job) = job {
            let st = within(5, move || job.join());
            eprintln!("its end: {st:?}");
        }
        drop(rt);
        assert_no_live_jobs("job made in a fiber-local destructor");
    });
}

struct ScopeOnDrop;
impl Drop for ScopeOnDrop {
    fn drop(&mut self) {
        fiber::scope(|s| {
            s.spawn(|| ());
        });
    }
}

fiber::fiber_local! {
    static SCOPE_ON_DROP: std::cell::RefCell<Option<ScopeOnDrop>> = std::cell::RefCell::new(None);
}

#[test]
fn a_scope_in_a_fiber_local_destructor_leaves_no_live_job() {
    in_child("a_scope_in_a_fiber_local_destructor_leaves_no_live_job", 30, || {
        let rt = crate::common::rt();
        rt.block_on(|| {
            fiber::spawn(|| SCOPE_ON_DROP.with(|g| *g.borrow_mut() = Some(ScopeOnDrop)))
                .join()
                .unwrap();
        });
        drop(rt);
        assert_no_live_jobs("scope opened in a fiber-local destructor");
    });
}

/// `CancelReason::ChildFailed` is documented as "its own body panicked
/// (or, in `try_scope`, returned an error), or a child of it failed":
/// a fiber's root job and a scope whose own body failed said `Cancelled`,
/// which reads as a cancel from outside.
// Failed before the fix: a root job whose own fiber panicked read cancel_reason() == Some(Cancelled)
#[test]
fn a_job_whose_own_body_failed_reads_child_failed() {
    crate::common::on_runtime(|| {
        let (tx, rx) = fiber::chan::bounded(1);
        let h = fiber::spawn(move || {
            tx.send(fiber::Job::current()).unwrap();
            std::panic::panic_any("the body panics");
        });
        assert!(h.join().is_err());
        let root = rx.recv().unwrap();
        assert_eq!(root.cancel_reason(), Some(fiber::CancelReason::ChildFailed));

        let (tx, rx) = fiber::chan::bounded(1);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            fiber::scope(|s| {
                tx.send(s.job().clone()).unwrap();
                std::panic::panic_any("the scope body panics");
            })
        }));
        assert!(r.is_err());
        let scope_job = rx.recv().unwrap();
        assert_eq!(scope_job.cancel_reason(), Some(fiber::CancelReason::ChildFailed));

        let (tx, rx) = fiber::chan::bounded(1);
        let r = fiber::try_scope(|s| -> Result<(), &'static str> {
            tx.send(s.job().clone()).unwrap();
            Err("the body failed")
        });
        assert_eq!(r, Err("the body failed"));
        let scope_job = rx.recv().unwrap();
        assert_eq!(scope_job.cancel_reason(), Some(fiber::CancelReason::ChildFailed));
    });
}
