//! Adversarial: many fibers join a scope's job while the scope runs its
//! children one at a time. Each child that ended brought the job's active
//! children to zero, and that woke every joiner of the job (which found it
//! still running and parked again): n children with n joiners cost O(n^2)
//! wakes (2,000 of each: about 4 million wakes). Only the scope owner
//! waits for the children; joiners wake when the job ends.

use crate::common::{ms, within};

#[test]
fn sequential_children_do_not_wake_the_jobs_joiners() {
    within(60, || {
        const JOINERS: usize = 1_000;
        const CHILDREN: usize = 200;
        let rt = crate::common::rt_fixed_grace(2, ms(300));
        let (job_tx, job_rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = fiber::chan::bounded::<()>(1);
        let runner = rt.spawn(move || {
            fiber::scope(|s| {
                job_tx.send(s.job()).unwrap();
                go_rx.recv().unwrap();
                (0..CHILDREN)
                    .map(|i| {
                        let v = s.spawn(move || i).join().unwrap();
                        // Time for the joiners woken by this child's end
                        // (before the fix) to run and park again.
                        fiber::sleep(ms(1)).unwrap();
                        v
                    })
                    .sum::<usize>()
            })
        });
        let job: fiber::Job = job_rx.recv().unwrap();
        let joiners: Vec<_> = (0..JOINERS)
            .map(|_| {
                let job = job.clone();
                rt.spawn(move || job.join().is_ok())
            })
            .collect();
        // The runner and every joiner.
        crate::common::wait_parked(&rt, JOINERS + 1);
        let before = rt.stats().wakes;
        go_tx.send(()).unwrap();
        assert_eq!(runner.join().unwrap(), CHILDREN * (CHILDREN - 1) / 2);
        assert!(
            joiners.into_iter().all(|j| j.join().unwrap()),
            "every joiner sees the job end"
        );
        let wakes = rt.stats().wakes - before;
        // The runner's go signal, its joins of its children and its sleeps
        // (at most one wake each), the joiners once each when the job ends;
        // before, every child's end woke all 1,000 joiners (about 200,000
        // wakes).
        assert!(
            wakes <= (JOINERS + 3 * CHILDREN) as u64,
            "{wakes} wakes for {CHILDREN} sequential children with {JOINERS} joiners"
        );
    });
}
