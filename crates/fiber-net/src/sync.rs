//! The one place where fiber-net names its synchronization primitives
//! (loom-visible under `--cfg loom`, so the models in `src/tests/` run the
//! readiness protocol of [`crate::readiness`] for real).

#[cfg(not(loom))]
mod imp {
    pub(crate) use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    pub(crate) use std::sync::Arc;

    /// A small spin lock for the readiness state's short critical sections
    /// (a counter bump and a waiter move). A fiber must not block its worker
    /// thread in the kernel on a briefly held lock, so waiting spins, then
    /// yields the thread. Same API shape as `std::sync::Mutex` (never
    /// poisoned).
    #[derive(Debug, Default)]
    pub(crate) struct Mutex<T> {
        locked: AtomicBool,
        value: std::cell::UnsafeCell<T>,
    }

    // SAFETY: the lock gives exclusive access to `value`; `T: Send` because
    // the value is used from whichever thread holds the lock.
    unsafe impl<T: Send> Sync for Mutex<T> {}
    // SAFETY: as above.
    unsafe impl<T: Send> Send for Mutex<T> {}

    /// Spins before yielding the OS thread while waiting for the lock.
    const SPINS: u32 = 64;

    impl<T> Mutex<T> {
        pub(crate) const fn new(value: T) -> Mutex<T> {
            Mutex {
                locked: AtomicBool::new(false),
                value: std::cell::UnsafeCell::new(value),
            }
        }

        #[inline]
        pub(crate) fn lock(&self) -> Result<MutexGuard<'_, T>, std::convert::Infallible> {
            // Acquire: pairs with the Release store in `MutexGuard::drop`.
            if self
                .locked
                .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                self.lock_slow();
            }
            Ok(MutexGuard { mutex: self })
        }

        #[cold]
        fn lock_slow(&self) {
            let mut spins = 0;
            loop {
                while self.locked.load(Ordering::Relaxed) {
                    if spins < SPINS {
                        std::hint::spin_loop();
                        spins += 1;
                    } else {
                        std::thread::yield_now();
                    }
                }
                // Acquire: as in `lock`.
                if self
                    .locked
                    .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    return;
                }
            }
        }
    }

    /// Exclusive access to a [`Mutex`]'s value.
    pub(crate) struct MutexGuard<'a, T> {
        mutex: &'a Mutex<T>,
    }

    impl<T> std::ops::Deref for MutexGuard<'_, T> {
        type Target = T;
        fn deref(&self) -> &T {
            // SAFETY: the guard holds the lock.
            unsafe { &*self.mutex.value.get() }
        }
    }

    impl<T> std::ops::DerefMut for MutexGuard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            // SAFETY: the guard holds the lock.
            unsafe { &mut *self.mutex.value.get() }
        }
    }

    impl<T> Drop for MutexGuard<'_, T> {
        fn drop(&mut self) {
            // Release: pairs with the Acquire in `Mutex::lock`.
            self.mutex.locked.store(false, Ordering::Release);
        }
    }
}

#[cfg(loom)]
mod imp {
    pub(crate) use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    pub(crate) use loom::sync::{Arc, Mutex, MutexGuard};
}

pub(crate) use imp::*;

/// Lock a mutex; no code in this crate panics while holding one.
#[cfg(loom)]
#[inline]
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// Lock a mutex.
#[cfg(not(loom))]
#[inline]
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(never) => match never {},
    }
}
