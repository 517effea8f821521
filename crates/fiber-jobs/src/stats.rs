//! Job counters: each bumped exactly once per event, in per-thread blocks
//! summed on read (diagnostics).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The counters, by index into a thread's block.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Counter {
    JobsCreated,
    CancellationsRequested,
    JobsCompleted,
    JobsFailed,
    JobsCancelled,
    WaitersRegistered,
    WaitersWoken,
}

const COUNTERS: usize = 7;

/// One thread's counts. Only its thread writes them (a load and a store,
/// no read-modify-write: no locked instruction and no cache line shared
/// between cores on the job path); readers sum every block. Relaxed
/// throughout: diagnostics, not a protocol.
#[derive(Debug, Default)]
struct Block {
    counts: [AtomicU64; COUNTERS],
}

/// Every live thread's block, and the counts of threads that have exited
/// (each folds its block in here, under the lock, as it exits).
struct Registry {
    live: Vec<Arc<Block>>,
    retired: [u64; COUNTERS],
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    live: Vec::new(),
    retired: [0; COUNTERS],
});

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A thread's handle on its block: registered on first use, folded into
/// `retired` when the thread exits.
struct Mine(Arc<Block>);

impl Mine {
    fn new() -> Mine {
        let block = Arc::new(Block::default());
        registry().live.push(block.clone());
        Mine(block)
    }
}

impl Drop for Mine {
    fn drop(&mut self) {
        let mut registry = registry();
        for (sum, count) in registry.retired.iter_mut().zip(&self.0.counts) {
            *sum += count.load(Ordering::Relaxed);
        }
        registry.live.retain(|b| !Arc::ptr_eq(b, &self.0));
    }
}

thread_local! {
    static MINE: Mine = Mine::new();
}

/// Count `n` events of `counter` on this thread. Never inlined: it reads
/// a thread-local, and a fiber may resume on another thread, so the
/// thread-local's address must not be computed once and kept across a
/// fiber switch in an inlining caller (PITFALLS 1).
#[inline(never)]
pub(crate) fn bump(counter: Counter, n: u64) {
    let counted = MINE.try_with(|mine| {
        let cell = &mine.0.counts[counter as usize];
        // Only this thread writes its block.
        cell.store(cell.load(Ordering::Relaxed) + n, Ordering::Relaxed);
    });
    if counted.is_err() {
        // This thread's block is gone (a destructor running at thread
        // exit): count straight into the retired sums.
        registry().retired[counter as usize] += n;
    }
}

fn sums() -> [u64; COUNTERS] {
    let registry = registry();
    let mut sums = registry.retired;
    for block in &registry.live {
        for (sum, count) in sums.iter_mut().zip(&block.counts) {
            *sum += count.load(Ordering::Relaxed);
        }
    }
    sums
}

/// Process-wide job counters at one instant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JobStats {
    /// Jobs created (scopes, children, timeouts, detached).
    pub jobs_created: u64,
    /// Cancellation requests (including propagated ones).
    pub cancellations_requested: u64,
    /// Jobs that ended COMPLETED.
    pub jobs_completed: u64,
    /// Jobs that ended FAILED.
    pub jobs_failed: u64,
    /// Jobs that ended CANCELLED.
    pub jobs_cancelled: u64,
    /// Join waiters registered.
    pub waiters_registered: u64,
    /// Join waiters woken by a finalize.
    pub waiters_woken: u64,
}

/// The job counters now.
pub fn stats() -> JobStats {
    let c = sums();
    JobStats {
        jobs_created: c[Counter::JobsCreated as usize],
        cancellations_requested: c[Counter::CancellationsRequested as usize],
        jobs_completed: c[Counter::JobsCompleted as usize],
        jobs_failed: c[Counter::JobsFailed as usize],
        jobs_cancelled: c[Counter::JobsCancelled as usize],
        waiters_registered: c[Counter::WaitersRegistered as usize],
        waiters_woken: c[Counter::WaitersWoken as usize],
    }
}

impl std::fmt::Display for JobStats {
    /// One line, as printed by `fiber::stats()` and at shutdown with
    /// `FIBER_STATS=1`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "  jobs: {} created, {} completed, {} failed, {} cancelled, {} cancel requests",
            self.jobs_created, self.jobs_completed, self.jobs_failed, self.jobs_cancelled, self.cancellations_requested
        )
    }
}

/// The shutdown report's job line (registered with fiber-core).
pub(crate) fn report() -> String {
    stats().to_string()
}
