//! The core of the fiber runtime: the fiber state machine, wait tickets, the
//! park/wake protocol, and fiber frames on real stacks.
//!
//! Layers above talk to this crate only through the four-call contract:
//! [`Schedule::schedule`] and [`Worker::worker_next`] for schedulers,
//! [`fiber_wait`] and [`fiber_wake`] for anything fibers wait on. The rules
//! are in `spec/lifecycle.md`.
//!
//! # Examples
//!
//! Park a fiber on a waitable and wake it from another OS thread, on the
//! deterministic test scheduler:
//!
//! ```
//! # mod fiber { pub(crate) use fiber_core as core; }
//! use fiber::core::testing::TestScheduler;
//! use fiber::core::{fiber_wait, fiber_wake, Publish, WaitOptions, WaitResult, Waitable, Waiter};
//! use std::sync::Mutex;
//!
//! /// A one-shot event.
//! #[derive(Default)]
//! struct Event(Mutex<(bool, Option<Waiter>)>);
//!
//! impl Waitable for Event {
//!     type Io = ();
//!     fn try_complete(&self, _: &mut ()) -> Option<WaitResult> {
//!         self.0.lock().unwrap().0.then_some(WaitResult::Ok)
//!     }
//!     fn publish(&self, waiter: &Waiter, _: &mut ()) -> Publish {
//!         let mut state = self.0.lock().unwrap();
//!         if state.0 {
//!             return Publish::Ready(WaitResult::Ok);
//!         }
//!         state.1 = Some(waiter.clone());
//!         Publish::Published
//!     }
//!     fn unpublish(&self, _: &Waiter, _: &mut ()) -> Option<WaitResult> {
//!         let mut state = self.0.lock().unwrap();
//!         state.1 = None;
//!         state.0.then_some(WaitResult::Ok)
//!     }
//! }
//!
//! impl Event {
//!     fn set(&self) {
//!         let waiter = {
//!             let mut state = self.0.lock().unwrap();
//!             state.0 = true;
//!             state.1.take()
//!         };
//!         if let Some(waiter) = waiter {
//!             fiber_wake(&waiter);
//!         }
//!     }
//! }
//!
//! let event = std::sync::Arc::new(Event::default());
//! let sched = TestScheduler::new();
//! let waiting = event.clone();
//! let handle = sched.spawn(move || fiber_wait(&*waiting, &mut (), WaitOptions::new()));
//! let setter = std::thread::spawn(move || event.set());
//! sched.run();
//! setter.join().unwrap();
//! assert_eq!(handle.join().unwrap(), WaitResult::Ok);
//! ```

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]
#![cfg_attr(loom, allow(dead_code, unused_imports))]

mod block;
#[cfg(not(loom))]
mod counts;
mod sync;

pub mod state;

#[cfg(not(loom))]
mod dump;
#[cfg(not(loom))]
mod fiber;
mod gate;
mod kind;
#[cfg(loom)]
pub mod model;
#[cfg(loom)]
pub use model::ModelFiber as FiberRef;
/// A fiber id under loom (`FiberId` is not compiled there).
#[cfg(loom)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FiberIdModel(pub u64);
#[cfg(not(loom))]
mod park;
#[cfg(not(loom))]
mod pool;
mod report;
#[cfg(not(loom))]
mod sched;
#[cfg(not(loom))]
pub mod stack;
#[cfg(not(loom))]
mod task;
#[cfg(not(loom))]
pub mod testing;
mod wait;

pub use block::{trim_join_blocks, trim_join_blocks_at};
#[cfg(not(loom))]
pub use dump::{advance_coarse_clock, coarse_clock_ms, Dump, FiberInfo};
#[cfg(not(loom))]
pub use fiber::{
    accepts_root_scope, behalf_cancel_scope, behalf_fiber_id, cancellation_held_off, coop_point, current_cancel_scope,
    current_cancel_scope_is, current_fiber, current_id, current_name, current_spawn_location, current_worker,
    drop_fiber_locals, in_fiber, install_root_scope, is_cancel_requested, is_shutdown_unwind, is_shutting_down,
    is_tearing_down, layer_panicked, non_cancellable, panicking, poll_missed, run_on_behalf_of, start_failure,
    swap_cancel_scope, take_unwind_pin_delta, with_fiber_local, yield_now, CancelScope, FiberId, FiberRef, OnBehalf,
    RootScopeCall, RunOutcome, OP_BUDGET, OP_SLICE, POLL_BUDGET,
};
/// Under loom there are no fibers: a failed poll costs nothing.
#[cfg(loom)]
pub fn poll_missed() {}
/// Under loom there are no fibers: an operation costs nothing.
#[cfg(loom)]
pub fn coop_point() {}
/// Under loom there are no fibers: the thread's panic state.
#[cfg(loom)]
pub fn panicking() -> bool {
    std::thread::panicking()
}
pub use kind::{
    external_wait, external_waiters, fiber_spans, io_poll, note_external_wait, park_backtraces, set_fiber_spans,
    set_io_poll, set_park_backtraces, ExternalWait, IoPoll, IoWaiter, WaitKind, WaitOn,
};
pub use kind::{unique_id_above, unique_id_from};
#[cfg(not(loom))]
pub use park::{current_handle, park, park_timeout, FiberHandle, ParkToken};
#[cfg(not(loom))]
pub use pool::{FramePool, ParkedFiber, Phase, PoolStats, TeardownReport, IDLE_WATERMARK, TEARDOWN_WORKER};
pub use report::{register_stats_reporter, stats_reports};
#[cfg(not(loom))]
pub use sched::{Runnable, Running, Schedule, Worker};
#[cfg(not(loom))]
pub use stack::{StackConfig, UnguardedPolicy};
#[cfg(not(loom))]
pub use task::{
    current_scheduler, spawn, spawn_on, try_spawn_on, try_spawn_unjoined, try_spawn_with, Canceller, JoinError,
    JoinHandle, SpawnOptions, UnjoinedTask,
};
pub use wait::{
    coop_point_cancellable, fiber_wait, fiber_wake, wait_until, wait_until_from, Cancelled, Interrupt, Publish,
    WaitOptions, WaitResult, Waitable, Waiter,
};
#[cfg(not(loom))]
pub use wait::{fiber_wait_at, fiber_wake_via};

#[cfg(test)]
mod tests;
