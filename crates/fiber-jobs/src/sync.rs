//! The one place where fiber-jobs names its synchronization primitives
//! (loom-visible under `--cfg loom`).

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU8, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};

/// Lock a mutex; no code in this crate panics while holding one.
#[inline]
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}
