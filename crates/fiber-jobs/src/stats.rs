//! Job counters: each bumped exactly once per event (Relaxed; diagnostics).

use std::sync::atomic::{AtomicU64, Ordering};

/// A counter alone on its cache line: jobs are created on one core and
/// end on another, and counters sharing a line would bounce it between
/// them at every job.
pub(crate) type Counter = crossbeam_utils::CachePadded<AtomicU64>;

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) jobs_created: Counter,
    pub(crate) cancellations_requested: Counter,
    pub(crate) jobs_completed: Counter,
    pub(crate) jobs_failed: Counter,
    pub(crate) jobs_cancelled: Counter,
    pub(crate) waiters_registered: Counter,
    pub(crate) waiters_woken: Counter,
    pub(crate) joins: Counter,
}

pub(crate) static COUNTERS: Counters = Counters {
    jobs_created: Counter::new(AtomicU64::new(0)),
    cancellations_requested: Counter::new(AtomicU64::new(0)),
    jobs_completed: Counter::new(AtomicU64::new(0)),
    jobs_failed: Counter::new(AtomicU64::new(0)),
    jobs_cancelled: Counter::new(AtomicU64::new(0)),
    waiters_registered: Counter::new(AtomicU64::new(0)),
    waiters_woken: Counter::new(AtomicU64::new(0)),
    joins: Counter::new(AtomicU64::new(0)),
};

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
    let c = &COUNTERS;
    JobStats {
        jobs_created: c.jobs_created.load(Ordering::Relaxed),
        cancellations_requested: c.cancellations_requested.load(Ordering::Relaxed),
        jobs_completed: c.jobs_completed.load(Ordering::Relaxed),
        jobs_failed: c.jobs_failed.load(Ordering::Relaxed),
        jobs_cancelled: c.jobs_cancelled.load(Ordering::Relaxed),
        waiters_registered: c.waiters_registered.load(Ordering::Relaxed),
        waiters_woken: c.waiters_woken.load(Ordering::Relaxed),
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
