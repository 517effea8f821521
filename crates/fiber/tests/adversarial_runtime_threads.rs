//! Adversarial: spec/reliability.md says dropping a runtime "leaves no
//! thread". Its `fiber::blocking` pool threads waited out their 10 s
//! keep-alive after the drop: 200 runtimes that each made one blocking
//! call took the process from 4 to 204 threads.

use std::time::{Duration, Instant};

mod common;
use common::{ms, within};

/// The names of this process's threads that start with `prefix`.
fn threads_named(prefix: &str) -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("comm")).ok())
        .map(|s| s.trim().to_string())
        .filter(|n| n.starts_with(prefix))
        .collect()
}

/// Wait (at most 3 s, far below the 10 s keep-alive) until no thread named
/// `prefix*` is left; returns what is left.
fn left_after_drop(prefix: &str) -> Vec<String> {
    let start = Instant::now();
    loop {
        let left = threads_named(prefix);
        if left.is_empty() || start.elapsed() > Duration::from_secs(3) {
            return left;
        }
        std::thread::sleep(ms(20));
    }
}

#[test]
fn dropping_a_runtime_ends_its_blocking_pool_threads() {
    within(60, || {
        let rt = fiber::Runtime::builder()
            .workers(1)
            .thread_name("advrt-one")
            .build()
            .unwrap();
        rt.block_on(|| {
            // Several at once, so the pool has several threads.
            let calls: Vec<_> = (0..4)
                .map(|_| fiber::spawn(|| fiber::blocking(|| std::thread::sleep(ms(20)))))
                .collect();
            for c in calls {
                c.join().unwrap();
            }
        });
        assert!(!threads_named("advrt-one").is_empty());
        drop(rt);
        let left = left_after_drop("advrt-one");
        assert!(left.is_empty(), "threads of the dropped runtime still alive: {left:?}");
    });
}

#[test]
fn many_runtimes_with_blocking_calls_leave_no_threads() {
    within(120, || {
        for _ in 0..50 {
            let rt = fiber::Runtime::builder()
                .workers(1)
                .shutdown_timeout(ms(50))
                .thread_name("advrt-many")
                .build()
                .unwrap();
            rt.block_on(|| fiber::blocking(|| ()));
            drop(rt);
        }
        let left = left_after_drop("advrt-many");
        assert!(
            left.is_empty(),
            "{} threads of dropped runtimes still alive",
            left.len()
        );
    });
}

/// A call still running when its runtime is dropped (abandoned after the
/// grace time) keeps its thread until it returns, then the thread ends.
#[test]
fn a_blocking_call_outliving_its_runtime_ends_its_thread_when_it_returns() {
    within(60, || {
        let rt = fiber::Runtime::builder()
            .workers(1)
            .shutdown_timeout(ms(50))
            .thread_name("advrt-late")
            .build()
            .unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let _h = rt.spawn(move || {
            fiber::blocking(move || {
                tx.send(()).unwrap();
                std::thread::sleep(ms(400));
            })
        });
        rx.recv().unwrap();
        drop(rt);
        let left = left_after_drop("advrt-late");
        assert!(
            left.is_empty(),
            "the abandoned call's thread did not end after the call: {left:?}"
        );
    });
}
