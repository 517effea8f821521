//! Cancelling a tree of n parked children is linear and leaks no job: the
//! counters (process-wide, so this file holds one test and its process has
//! no other jobs) show exactly n + 1 jobs created, n + 1 cancellation
//! requests that changed a state (one per job, however the cancel reached
//! it) and n + 1 jobs ended CANCELLED, for n = 1,000 and n = 2,000: the work
//! of the cancel grows by exactly the factor the tree does.

use fiber_chan::bounded;
use fiber_jobs::*;

fn cancel_tree(n: usize) -> JobStats {
    let before = stats();
    let job = scope(|s| {
        let (tx, rx) = bounded::<()>(0);
        for _ in 0..n {
            let rx = rx.clone();
            s.spawn(move || {
                // Parked until the cancel reaches it.
                assert!(rx.recv().is_err());
                assert!(is_cancelled());
            });
        }
        // Every child parks before the cancel.
        while tx.waiting().0 < n {
            let _ = fiber_core::yield_now();
        }
        s.job().cancel();
        s.job()
    });
    assert_eq!(job.state(), JobState::Cancelled);
    let after = stats();
    JobStats {
        jobs_created: after.jobs_created - before.jobs_created,
        cancellations_requested: after.cancellations_requested - before.cancellations_requested,
        jobs_completed: after.jobs_completed - before.jobs_completed,
        jobs_failed: after.jobs_failed - before.jobs_failed,
        jobs_cancelled: after.jobs_cancelled - before.jobs_cancelled,
        waiters_registered: after.waiters_registered - before.waiters_registered,
        waiters_woken: after.waiters_woken - before.waiters_woken,
    }
}

#[test]
fn cancel_of_a_1k_tree_is_linear_and_leaks_no_job() {
    let rt = fiber_sched::Runtime::builder()
        .workers(2)
        .max_workers(2)
        .build()
        .unwrap();
    rt.block_on(|| {
        // The root fiber's own job is created on first use: not part of
        // the trees counted below.
        let _root = Job::current();
        for n in [1000usize, 2000] {
            let d = cancel_tree(n);
            let jobs = n as u64 + 1;
            assert_eq!(d.jobs_created, jobs, "n = {n}: {d:?}");
            assert_eq!(d.cancellations_requested, jobs, "one request per job: {d:?}");
            assert_eq!(d.jobs_cancelled, jobs, "every job ended: {d:?}");
            assert_eq!(d.jobs_completed + d.jobs_failed, 0, "{d:?}");
        }
    });
}
