//! Structured concurrency for fibers: every fiber of a scope belongs to a
//! job; jobs form a tree; a scope returns only when its children are done;
//! cancellation and failure travel the tree by fixed rules (spec/jobs.md).
//!
//! # Examples
//!
//! ```
//! # mod fiber { pub(crate) use fiber_core as core; pub use fiber_jobs::scope; }
//! use fiber::core::testing::TestScheduler;
//!
//! let total = TestScheduler::new().block_on(|| {
//!     let data = vec![1u64, 2, 3, 4];
//!     fiber::scope(|s| {
//!         let halves: Vec<_> = data.chunks(2).map(|c| s.spawn(move || c.iter().sum::<u64>())).collect();
//!         halves.into_iter().map(|h| h.join().unwrap()).sum::<u64>()
//!     })
//! });
//! assert_eq!(total, 10);
//! ```

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]
#![cfg_attr(loom, allow(dead_code, unused_imports))]

mod sync;

mod job;
#[cfg(not(loom))]
mod scope;
mod stats;

/// A `tracing` event at trace level (free when tracing is disabled).
#[macro_export]
#[doc(hidden)]
macro_rules! trace_event {
    ($event:literal, $job:expr) => {
        ::tracing::trace!(target: "fiber_jobs", event = $event, job = $job)
    };
    ($event:literal, $job:expr, $field:ident = $value:expr) => {
        ::tracing::trace!(target: "fiber_jobs", event = $event, job = $job, $field = ?$value)
    };
}

pub use job::{is_legal, CancelReason, JobActor, JobState};
#[cfg(not(loom))]
pub use scope::{
    check_cancelled, is_cancelled, scope, supervisor_scope, try_scope, with_timeout, Cancelled, Job, Scope,
    ScopedJoinHandle, TimedOut, TryScope,
};
pub use stats::{stats, JobStats};

#[cfg(all(test, loom))]
mod tests;
