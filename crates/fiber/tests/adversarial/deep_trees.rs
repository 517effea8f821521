//! Adversarial: deep job trees. A chain of nested scopes (each level opened
//! by a scoped child of the level above) runs on one small fiber per
//! level, so its depth is bounded by memory, not by a stack; cancelling it
//! must not be either. The cancel walked the tree by recursion, two frames
//! a level, and overflowed the canceller's 256 KiB stack (about 120 levels
//! in a debug build, 600 in release): the process aborted.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::common::{in_child, ms};

fn chain(depth: usize, ready: &AtomicUsize) {
    if depth == 0 {
        ready.fetch_add(1, Ordering::SeqCst);
        let _ = fiber::sleep(Duration::MAX);
        return;
    }
    fiber::scope(|s| {
        s.spawn(|| chain(depth - 1, ready));
    });
}

fn runtime() -> fiber::Runtime {
    fiber::Runtime::builder()
        .workers(2)
        .shutdown_timeout(ms(2000))
        .build()
        .unwrap()
}

#[test]
fn cancel_of_a_1000_deep_scope_chain_from_a_fiber_ends_it() {
    in_child("cancel_of_a_1000_deep_scope_chain_from_a_fiber_ends_it", 120, || {
        let cancelled = runtime().block_on(|| {
            let ready = AtomicUsize::new(0);
            let job = fiber::scope(|s| {
                let r = &ready;
                s.spawn(move || chain(1000, r));
                while ready.load(Ordering::SeqCst) == 0 {
                    fiber::sleep(ms(5)).unwrap();
                }
                // From this fiber, on its 256 KiB stack.
                s.job().cancel();
                s.job()
            });
            job.is_cancelled()
        });
        assert!(cancelled, "the scope's job ends cancelled");
    });
}

#[test]
fn with_timeout_over_a_300_deep_scope_chain_times_out() {
    in_child("with_timeout_over_a_300_deep_scope_chain_times_out", 120, || {
        let r = runtime().block_on(|| {
            let ready = AtomicUsize::new(0);
            fiber::with_timeout(ms(200), || chain(300, &ready))
        });
        assert_eq!(r, Err(fiber::TimedOut));
    });
}
