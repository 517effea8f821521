//! [`Mutex`]: `std::sync::Mutex`'s API over the parking lock word of
//! `raw_mutex.rs`.

use crate::poison;
use crate::raw_mutex::RawMutex;
use crate::sync::UnsafeCell;
use std::fmt;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::{LockResult, TryLockError, TryLockResult};

/// A mutual exclusion lock that parks the calling fiber (or blocks the
/// calling thread) while another holder has it, with the API and the
/// poisoning of [`std::sync::Mutex`].
///
/// Unlike `std::sync::Mutex`, the guard may be held across a park
/// (`fiber::sleep`, a channel operation, another lock): waiters park and
/// their workers run other fibers, so the holder gets scheduled and unlocks.
/// Fibers and plain threads can share one lock.
///
/// Uncontended, locking and unlocking are one compare-and-swap each.
/// Under contention waiters queue in FIFO order; a newcomer may take a
/// just-released lock first, until the oldest waiter has waited about a
/// millisecond, after which the lock is handed to waiters in order
/// (`spec/sync.md`, "Fairness").
///
/// `lock` is not a cancellation point (as with `std`): a cancelled fiber
/// still waits for the lock.
///
/// Poisoning reads the dropping fiber's own panic state
/// (`fiber_core::panicking`), not only its thread's: a fiber that waits
/// during its own unwind (a destructor that sleeps or locks) keeps its
/// worker thread to itself for up to 200 ms and then parks, leaving that
/// thread counted as panicking by std until its unwind ends; guards that
/// other fibers of that worker drop meanwhile do not poison
/// (`spec/lifecycle.md` section 10). A guard held by a fiber that a
/// runtime's shutdown unwinds is dropped by that unwind and poisons the
/// lock, as a thread's unwind would.
///
/// # Examples
///
/// ```
/// # mod fiber { pub(crate) use fiber_sync as sync; }
/// use fiber::sync::Mutex;
/// use std::sync::Arc;
///
/// let counter = Arc::new(Mutex::new(0));
/// let threads: Vec<_> = (0..4)
///     .map(|_| {
///         let counter = counter.clone();
///         std::thread::spawn(move || *counter.lock().unwrap() += 1)
///     })
///     .collect();
/// for t in threads {
///     t.join().unwrap();
/// }
/// assert_eq!(*counter.lock().unwrap(), 4);
/// ```
pub struct Mutex<T: ?Sized> {
    raw: RawMutex,
    poison: poison::Flag,
    data: UnsafeCell<T>,
}

// SAFETY: the lock hands `T` from holder to holder, possibly on other
// threads, so `T: Send` is needed and enough (as for `std::sync::Mutex`).
unsafe impl<T: ?Sized + Send> Send for Mutex<T> {}
// SAFETY: shared access only ever yields `&mut T` to one holder at a time.
unsafe impl<T: ?Sized + Send> Sync for Mutex<T> {}

// As `std::sync::Mutex`: a panic while the lock is held poisons it, so a
// reference may cross `catch_unwind` whatever `T` is.
impl<T: ?Sized> std::panic::UnwindSafe for Mutex<T> {}
impl<T: ?Sized> std::panic::RefUnwindSafe for Mutex<T> {}

impl<T> Mutex<T> {
    /// Create an unlocked mutex.
    #[cfg(not(loom))]
    pub const fn new(value: T) -> Mutex<T> {
        Mutex {
            raw: RawMutex::new(),
            poison: poison::Flag::new(),
            data: UnsafeCell::new(value),
        }
    }

    /// Create an unlocked mutex.
    #[cfg(loom)]
    pub fn new(value: T) -> Mutex<T> {
        Mutex {
            raw: RawMutex::new(),
            poison: poison::Flag::new(),
            data: UnsafeCell::new(value),
        }
    }

    /// Consume the mutex and return the value; `Err` (still holding the
    /// value) if it is poisoned.
    pub fn into_inner(self) -> LockResult<T> {
        let poisoned = self.poison.get();
        poison::map_result(poisoned, self.data.into_inner())
    }
}

impl<T: ?Sized> Mutex<T> {
    /// Acquire the lock, parking the fiber (or blocking the thread) until
    /// it is free. Not a cancellation point.
    ///
    /// # Errors
    ///
    /// `Err` if a holder panicked while holding the lock; the error still
    /// holds the guard ([`std::sync::PoisonError::into_inner`]).
    #[track_caller]
    pub fn lock(&self) -> LockResult<MutexGuard<'_, T>> {
        fiber_core::coop_point();
        self.raw.lock();
        // SAFETY: we just took the lock.
        unsafe { MutexGuard::new(self) }
    }

    /// Acquire the lock if it is free right now (never parks; in a fiber, a
    /// call that finds nothing to do counts toward the poll budget, and
    /// every `fiber_core::POLL_BUDGET` (128) such misses the fiber yields,
    /// so a loop that polls lets other fibers run.)
    ///
    /// # Errors
    ///
    /// [`TryLockError::WouldBlock`] if it is held,
    /// [`TryLockError::Poisoned`] if it is poisoned (holding the guard).
    pub fn try_lock(&self) -> TryLockResult<MutexGuard<'_, T>> {
        fiber_core::coop_point();
        let result = self.try_lock_quiet();
        if matches!(result, Err(TryLockError::WouldBlock)) {
            // A failed poll: counts toward the fiber's budget yield (a
            // fiber spinning on `try_lock` lets the holder run).
            fiber_core::poll_missed();
        }
        result
    }

    /// [`try_lock`](Self::try_lock) without the poll accounting (never a
    /// yield point: `Debug` uses it, and formatting may run under
    /// stdout's lock or a caller's std guard).
    fn try_lock_quiet(&self) -> TryLockResult<MutexGuard<'_, T>> {
        if self.raw.try_lock() {
            // SAFETY: we just took the lock.
            Ok(unsafe { MutexGuard::new(self) }?)
        } else {
            Err(TryLockError::WouldBlock)
        }
    }

    /// Did a holder panic while holding the lock?
    pub fn is_poisoned(&self) -> bool {
        self.poison.get()
    }

    /// Clear the poison flag.
    pub fn clear_poison(&self) {
        self.poison.clear();
    }

    /// The value, through `&mut self` (no locking needed).
    ///
    /// # Errors
    ///
    /// `Err` (still giving access) if the mutex is poisoned.
    pub fn get_mut(&mut self) -> LockResult<&mut T> {
        let poisoned = self.poison.get();
        // SAFETY: `&mut self` excludes every other access.
        let value = self.data.with_mut(|p| unsafe { &mut *p });
        poison::map_result(poisoned, value)
    }

    pub(crate) fn raw(&self) -> &RawMutex {
        &self.raw
    }

    /// The poison flag (a condvar wait unwound while it holds the lock
    /// poisons through it, as the guard's drop would).
    pub(crate) fn poison_flag(&self) -> &poison::Flag {
        &self.poison
    }
}

impl<T: Default> Default for Mutex<T> {
    fn default() -> Self {
        Mutex::new(T::default())
    }
}

impl<T> From<T> for Mutex<T> {
    fn from(value: T) -> Self {
        Mutex::new(value)
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for Mutex<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Mutex");
        match self.try_lock_quiet() {
            Ok(guard) => d.field("data", &&*guard),
            Err(TryLockError::Poisoned(err)) => d.field("data", &&**err.get_ref()),
            // std's text on the supported toolchain: a quoted placeholder.
            Err(TryLockError::WouldBlock) => d.field("data", &"<locked>"),
        };
        d.field("poisoned", &self.poison.get());
        d.finish_non_exhaustive()
    }
}

/// Exclusive access to a [`Mutex`]'s value; unlocks on drop. Like
/// `std`'s guard it is not `Send`.
#[must_use = "if unused the Mutex will immediately unlock"]
pub struct MutexGuard<'a, T: ?Sized + 'a> {
    mutex: &'a Mutex<T>,
    poison: poison::Guard,
    _not_send: PhantomData<*const ()>,
}

// SAFETY: a shared guard gives `&T` only.
unsafe impl<T: ?Sized + Sync> Sync for MutexGuard<'_, T> {}

impl<'a, T: ?Sized> MutexGuard<'a, T> {
    /// # Safety
    ///
    /// The caller holds `mutex`'s lock.
    unsafe fn new(mutex: &'a Mutex<T>) -> LockResult<MutexGuard<'a, T>> {
        let guard = MutexGuard {
            mutex,
            poison: mutex.poison.guard(),
            _not_send: PhantomData,
        };
        poison::map_result(mutex.poison.get(), guard)
    }

    /// The mutex this guard locks (for `Condvar`).
    pub(crate) fn mutex(&self) -> &'a Mutex<T> {
        self.mutex
    }

    /// Give up the guard without unlocking (a condvar wait unlocks the raw
    /// lock itself); returns the poison bookkeeping for [`Self::relock`].
    pub(crate) fn take_for_wait(self) -> poison::Guard {
        let poison = self.poison;
        std::mem::forget(self);
        poison
    }

    /// A guard again after a condvar wait.
    ///
    /// # Safety
    ///
    /// The caller holds `mutex`'s lock.
    pub(crate) unsafe fn relock(mutex: &'a Mutex<T>, poison: poison::Guard) -> MutexGuard<'a, T> {
        MutexGuard {
            mutex,
            poison,
            _not_send: PhantomData,
        }
    }
}

impl<T: ?Sized> Deref for MutexGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the lock.
        self.mutex.data.with(|p| unsafe { &*p })
    }
}

impl<T: ?Sized> DerefMut for MutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard holds the lock.
        self.mutex.data.with_mut(|p| unsafe { &mut *p })
    }
}

impl<T: ?Sized> Drop for MutexGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        self.mutex.poison.done(self.poison);
        self.mutex.raw.unlock();
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for MutexGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

impl<T: ?Sized + fmt::Display> fmt::Display for MutexGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&**self, f)
    }
}
