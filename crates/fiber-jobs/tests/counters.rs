//! The job counters count each event exactly once (seed 002
//! §Observability). This file holds one test so that its process has no
//! other jobs running: the counters are process-wide.

use fiber_chan::bounded;
use fiber_jobs::*;

#[test]
fn counters_count_each_event_once() {
    let rt = fiber_sched::Runtime::builder()
        .workers(2)
        .max_workers(2)
        .build()
        .unwrap();
    rt.block_on(|| {
        // One job cancelled three times: one cancellation.
        let before = stats();
        scope(|s| {
            let child = s.spawn(|| {
                let (_tx, rx) = bounded::<()>(0);
                let _ = rx.recv();
            });
            child.cancel();
            child.cancel();
            child.cancel();
            let _ = child.join();
        });
        let after = stats();
        assert_eq!(after.cancellations_requested - before.cancellations_requested, 1);

        // 32 fibers blocked in Job::join on one job: 32 waiters registered,
        // each woken exactly once.
        let before = stats();
        let (job_tx, job_rx) = bounded::<Job>(1);
        let (release_tx, release_rx) = bounded::<()>(0);
        let target = fiber_core::spawn(move || {
            job_tx.send(Job::current()).unwrap();
            release_rx.recv().unwrap();
        });
        let job = job_rx.recv().unwrap();
        let joiners: Vec<_> = (0..32)
            .map(|_| {
                let job = job.clone();
                fiber_core::spawn(move || job.join().unwrap())
            })
            .collect();
        // Every joiner really parks in `Job::join` (no polling).
        while stats().waiters_registered - before.waiters_registered < 32 {
            let _ = fiber_core::yield_now();
        }
        release_tx.send(()).unwrap();
        for j in joiners {
            assert_eq!(j.join().unwrap(), JobState::Completed);
        }
        target.join().unwrap();
        let after = stats();
        assert_eq!(after.waiters_registered - before.waiters_registered, 32);
        assert_eq!(after.waiters_woken - before.waiters_woken, 32);

        // Cancelling a tree of 1,000 siblings: every job ends, none leaks.
        scope(|outer| {
            let inner = outer.spawn(|| {
                scope(|s| {
                    for _ in 0..1000 {
                        s.spawn(|| {
                            let (_tx, rx) = bounded::<()>(0);
                            let _ = rx.recv();
                        });
                    }
                    s.job().cancel();
                });
            });
            inner.join().unwrap();
        });
    });
    drop(rt);
    let end = stats();
    assert_eq!(
        end.jobs_created,
        end.jobs_completed + end.jobs_failed + end.jobs_cancelled,
        "every job created ended: {end:?}"
    );
}
