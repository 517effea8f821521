//! Synchronization for fibers and threads: [`Mutex`], [`RwLock`],
//! [`Condvar`], [`Barrier`], [`OnceLock`], `Once` and `LazyLock` with
//! `std::sync`'s API, a
//! FIFO [`Semaphore`] in tokio's shape and a [`WaitGroup`] in crossbeam's.
//!
//! In a fiber a blocking call parks the fiber, so its worker runs other
//! fibers meanwhile (a `std::sync::Mutex` guard held across a park can
//! block every worker); on a plain thread it blocks the thread; fibers and
//! threads can share one lock. Waiting goes through fiber-core's
//! `fiber_wait` / `fiber_wake` only. The rules are in `spec/sync.md`.
//!
//! Cancellation points: [`Semaphore::acquire`], the [`Condvar`] waits,
//! [`Barrier::wait`] and [`WaitGroup::wait`] return early when the calling
//! fiber's job is cancelled. [`Mutex::lock`], [`RwLock`] and
//! [`OnceLock::get_or_init`] (and `Once` / `LazyLock`) are not (as with
//! `std`).
//!
//! # Examples
//!
//! ```
//! # mod fiber { pub(crate) use fiber_sync as sync; }
//! use fiber::sync::{Condvar, Mutex};
//! use std::sync::Arc;
//!
//! let pair = Arc::new((Mutex::new(false), Condvar::new()));
//! let pair2 = pair.clone();
//! let t = std::thread::spawn(move || {
//!     let (ready, cv) = &*pair2;
//!     *ready.lock().unwrap() = true;
//!     cv.notify_one();
//! });
//! let (ready, cv) = &*pair;
//! let guard = cv.wait_while(ready.lock().unwrap(), |ready| !*ready).unwrap();
//! assert!(*guard);
//! drop(guard);
//! t.join().unwrap();
//! ```

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(missing_docs)]
#![cfg_attr(loom, allow(dead_code))]

mod sync;

mod barrier;
mod condvar;
#[cfg(not(loom))]
mod lazy;
mod mutex;
mod once;
mod poison;
mod queue;
mod raw_mutex;
mod rwlock;
mod semaphore;
mod waitgroup;

pub use barrier::{Barrier, BarrierWaitResult};
pub use condvar::{Condvar, WaitTimeoutResult};
pub use fiber_core::Cancelled;
#[cfg(not(loom))]
pub use lazy::LazyLock;
pub use mutex::{Mutex, MutexGuard};
pub use once::OnceLock;
pub use once::{Once, OnceState};
pub use rwlock::{RwLock, RwLockReadGuard, RwLockWriteGuard};
pub use semaphore::{Semaphore, SemaphorePermit};
/// std's shared-ownership pointers and atomics (nothing here parks, so
/// std's serve fibers as they are): re-exported so that
/// `use std::sync::{Arc, Mutex, Condvar}` ports as an import change.
pub use std::sync::{atomic, Arc, Weak};
/// std's poisoning and `try_*` result types, which the locks here return:
/// re-exported so that a port from `std::sync` is an import change.
pub use std::sync::{LockResult, PoisonError, TryLockError, TryLockResult};
pub use waitgroup::WaitGroup;

#[cfg(all(test, loom))]
mod tests;
