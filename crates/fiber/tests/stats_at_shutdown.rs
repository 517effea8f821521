//! `FIBER_STATS=1`: the shutdown report prints what `fiber::stats()`
//! prints (the job counters too) with the running pool's worker numbers.
//! The report goes to stderr, so the test runs itself as a child process.

use std::process::Command;

const CHILD: &str = "FIBER_STATS_TEST_CHILD";

#[test]
fn shutdown_report_has_job_counters_and_live_worker_numbers() {
    if std::env::var_os(CHILD).is_some() {
        // The child: a runtime with 2 workers that runs some jobs.
        let rt = fiber::Runtime::builder().workers(2).max_workers(4).build().unwrap();
        let sum = rt.block_on(|| {
            fiber::scope(|s| {
                (0..4u64)
                    .map(|i| s.spawn(move || i))
                    .map(|h| h.join().unwrap())
                    .sum::<u64>()
            })
        });
        assert_eq!(sum, 6);
        drop(rt);
        return;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "shutdown_report_has_job_counters_and_live_worker_numbers",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .env("FIBER_STATS", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed: {stderr}");
    assert!(stderr.contains("fiber runtime stats"), "{stderr}");
    let workers_line = stderr
        .lines()
        .find(|l| l.trim_start().starts_with("workers "))
        .expect("a workers line");
    assert!(workers_line.contains("(min 2, max 4)"), "{workers_line}");
    let alive: usize = workers_line.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(
        alive >= 2,
        "the report shows the running pool, not the stopped one: {workers_line}"
    );
    let jobs_line = stderr
        .lines()
        .find(|l| l.trim_start().starts_with("jobs: "))
        .expect("a jobs line");
    let created: u64 = jobs_line.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(created >= 5, "the scope and its 4 children are jobs: {jobs_line}");
}
