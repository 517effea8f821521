//! The blocking pool's keep-alive (`Builder::thread_keep_alive`, tokio's
//! option of the same name): an idle pool thread exits after it, never
//! before a call it could take, and `Duration::MAX` keeps it until the
//! runtime shuts down.

use std::time::{Duration, Instant};

use crate::common::threads_named;

fn runtime(keep_alive: Duration) -> fiber::Runtime {
    fiber::Runtime::builder()
        .workers(1)
        .thread_name("ka-test")
        .thread_keep_alive(keep_alive)
        .build()
        .unwrap()
}

/// The pool's threads are named after the workers: `ka-test-blocking`,
/// cut to `ka-test-blockin`.
const POOL: &str = "ka-test-block";

/// Wait until no pool thread is left; fail with `what` 20 s after `since`.
fn wait_for_no_pool_thread(since: Instant, what: &str) {
    while threads_named(POOL) > 0 {
        assert!(since.elapsed() < Duration::from_secs(20), "{what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn an_idle_pool_thread_exits_after_its_keep_alive() {
    crate::common::in_child("an_idle_pool_thread_exits_after_its_keep_alive", 60, || {
        let rt = runtime(Duration::from_millis(200));
        // The keep-alive starts after the call returned on the pool thread.
        let done = rt.block_on(|| fiber::blocking(Instant::now));
        // (It may have gone already on a loaded machine.)
        assert!(threads_named(POOL) <= 1, "one pool thread for one call");
        wait_for_no_pool_thread(done, "the pool thread outlived a 200 ms keep-alive by 20 s");
        assert!(
            done.elapsed() >= Duration::from_millis(200),
            "the pool thread left {:?} after its call, before its 200 ms keep-alive",
            done.elapsed()
        );
        // A new call makes a new thread.
        assert_eq!(rt.block_on(|| fiber::blocking(|| 8)), 8);
    });
}

#[test]
fn a_zero_keep_alive_ends_the_thread_after_its_call_and_the_pool_still_serves() {
    crate::common::in_child(
        "a_zero_keep_alive_ends_the_thread_after_its_call_and_the_pool_still_serves",
        60,
        || {
            let rt = runtime(Duration::ZERO);
            let sum: u64 = rt.block_on(|| (0..50u64).map(|i| fiber::blocking(move || i)).sum());
            assert_eq!(sum, 49 * 50 / 2);
            let done = Instant::now();
            wait_for_no_pool_thread(done, "a pool thread stayed");
        },
    );
}

/// `Duration::MAX` (no deadline; `Instant + Duration::MAX` would overflow)
/// keeps the idle thread, and the runtime's drop still ends it.
#[test]
fn a_keep_alive_of_duration_max_keeps_the_thread_until_the_runtime_drops() {
    crate::common::in_child(
        "a_keep_alive_of_duration_max_keeps_the_thread_until_the_runtime_drops",
        60,
        || {
            let rt = runtime(Duration::MAX);
            assert_eq!(rt.block_on(|| fiber::blocking(|| 1)), 1);
            std::thread::sleep(Duration::from_millis(300));
            assert_eq!(threads_named(POOL), 1, "the idle pool thread left");
            drop(rt);
            let dropped = Instant::now();
            wait_for_no_pool_thread(dropped, "the pool thread outlived its runtime");
        },
    );
}
