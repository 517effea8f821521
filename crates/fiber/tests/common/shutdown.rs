//! Shutdown test helpers: a drop counter, and a runtime that counts its
//! workers' `on_thread_stop` hooks.

use super::ms;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Counts its drops.
pub struct Tracked(pub Arc<AtomicUsize>);

impl Drop for Tracked {
    fn drop(&mut self) {
        self.0.fetch_add(1, SeqCst);
    }
}

/// A fresh drop count for [`Tracked`].
pub fn counter() -> Arc<AtomicUsize> {
    Arc::new(AtomicUsize::new(0))
}

/// The runtime of the serving-worker tests: two fixed workers, a short
/// grace, counting its workers' `on_thread_stop` hooks.
pub fn counted_rt(stops: &Arc<AtomicUsize>) -> fiber::Runtime {
    let s = stops.clone();
    fiber::Runtime::builder()
        .workers(2)
        .max_workers(2)
        .shutdown_timeout(ms(50))
        .on_thread_stop(move || {
            s.fetch_add(1, SeqCst);
        })
        .build()
        .unwrap()
}

/// Wait up to `limit` for `n` hooks to have run; how many did.
pub fn stops_within(stops: &AtomicUsize, n: usize, limit: Duration) -> usize {
    let t0 = Instant::now();
    while stops.load(SeqCst) < n && t0.elapsed() < limit {
        std::thread::sleep(ms(5));
    }
    stops.load(SeqCst)
}
