//! The fiber scheduler: work-stealing workers, a global injection queue, an
//! elastic pool from 1x to 2x cores, timers and runtime diagnostics. It
//! implements fiber-core's `Schedule` / `Worker` contract over OS threads;
//! the rules are in `spec/sched.md`.
//!
//! # Examples
//!
//! ```
//! # mod fiber { pub use fiber_core::spawn; pub use fiber_sched::{sleep, Runtime}; }
//! use fiber::{sleep, Runtime};
//! use std::time::Duration;
//!
//! let rt = Runtime::builder().workers(2).build().unwrap();
//! let sum = rt.block_on(|| {
//!     let children: Vec<_> = (0..100u64)
//!         .map(|i| fiber::spawn(move || { sleep(Duration::from_millis(1)).unwrap(); i }))
//!         .collect();
//!     children.into_iter().map(|c| c.join().unwrap()).sum::<u64>()
//! });
//! assert_eq!(sum, 4950);
//! ```

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]
#![cfg_attr(loom, allow(dead_code, unused_imports))]

mod sync;

mod idle;

#[cfg(not(loom))]
mod blocking;
#[cfg(not(loom))]
pub mod config;
#[cfg(not(loom))]
mod dumpsig;
#[cfg(not(loom))]
mod handle;
#[cfg(not(loom))]
mod monitor;
#[cfg(not(loom))]
mod queue;
#[cfg(not(loom))]
mod runtime;
#[cfg(not(loom))]
mod stats;
mod timer;
#[cfg(not(loom))]
mod worker;

#[cfg(not(loom))]
pub use blocking::on_blocking_thread;
#[cfg(not(loom))]
pub use config::{Config, ConfigError, ThreadHook};
#[cfg(not(loom))]
pub use handle::Handle;
#[cfg(not(loom))]
pub use runtime::{blocking, current_stats, sleep, sleep_until, Builder, Runtime};
#[cfg(not(loom))]
pub use stats::Stats;

/// Emit a runtime event (`f` calls a `tracing` macro) on a runtime
/// thread: a subscriber's callback that panics there must not kill the
/// worker or the monitor (it left the worker counted alive with a fiber
/// RUNNING for good, or the monitor gone for the runtime's life); the
/// panic is reported on stderr and the runtime goes on.
#[cfg(not(loom))]
pub(crate) fn emit(what: &str, f: impl FnOnce()) {
    if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        fiber_core::layer_panicked(what, payload);
    }
}

#[cfg(test)]
mod tests;
