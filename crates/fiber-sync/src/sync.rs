//! The one place where fiber-sync names its synchronization primitives
//! (loom-visible under `--cfg loom`).
//!
//! Waiter queues sit behind [`SpinLock`]: their critical sections are a few
//! pointer moves, and a fiber must not put its worker thread to sleep in
//! the kernel for that. Under loom the spin lock is loom's `Mutex`, so the
//! models explore every interleaving of the queue hand-offs too.

#[cfg(not(loom))]
mod imp {
    pub(crate) use std::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};
    pub(crate) use std::sync::Arc;

    /// Spins before yielding the OS thread while waiting for a queue lock.
    const SPINS: u32 = 64;

    /// A small spin lock for the waiter queues (spin, then yield the
    /// thread). Never poisoned: no code in this crate panics holding it.
    #[derive(Debug, Default)]
    pub(crate) struct SpinLock<T> {
        locked: AtomicBool,
        value: std::cell::UnsafeCell<T>,
    }

    // SAFETY: the lock gives exclusive access to `value`; `T: Send` because
    // the value is used from whichever thread holds the lock.
    unsafe impl<T: Send> Sync for SpinLock<T> {}
    // SAFETY: as above.
    unsafe impl<T: Send> Send for SpinLock<T> {}

    impl<T> SpinLock<T> {
        pub(crate) const fn new(value: T) -> SpinLock<T> {
            SpinLock {
                locked: AtomicBool::new(false),
                value: std::cell::UnsafeCell::new(value),
            }
        }

        #[inline]
        pub(crate) fn lock(&self) -> SpinGuard<'_, T> {
            // Acquire: pairs with the Release store in `SpinGuard::drop`.
            if self
                .locked
                .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                self.lock_slow();
            }
            SpinGuard { lock: self }
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

    /// Exclusive access to a [`SpinLock`]'s value.
    pub(crate) struct SpinGuard<'a, T> {
        lock: &'a SpinLock<T>,
    }

    impl<T> std::ops::Deref for SpinGuard<'_, T> {
        type Target = T;
        fn deref(&self) -> &T {
            // SAFETY: the guard holds the lock.
            unsafe { &*self.lock.value.get() }
        }
    }

    impl<T> std::ops::DerefMut for SpinGuard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            // SAFETY: the guard holds the lock.
            unsafe { &mut *self.lock.value.get() }
        }
    }

    impl<T> Drop for SpinGuard<'_, T> {
        fn drop(&mut self) {
            // Release: pairs with the Acquire in `SpinLock::lock`.
            self.lock.locked.store(false, Ordering::Release);
        }
    }

    /// `UnsafeCell` with loom's closure-based access API.
    #[derive(Debug)]
    pub(crate) struct UnsafeCell<T: ?Sized>(std::cell::UnsafeCell<T>);

    impl<T> UnsafeCell<T> {
        pub(crate) const fn new(value: T) -> Self {
            Self(std::cell::UnsafeCell::new(value))
        }

        pub(crate) fn into_inner(self) -> T {
            self.0.into_inner()
        }
    }

    impl<T: ?Sized> UnsafeCell<T> {
        #[inline(always)]
        pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
            f(self.0.get())
        }

        #[inline(always)]
        pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
            f(self.0.get())
        }
    }

    /// Spin hint for the bounded spin before parking.
    #[inline]
    pub(crate) fn spin_loop() {
        std::hint::spin_loop();
    }
}

#[cfg(loom)]
mod imp {
    pub(crate) use loom::cell::UnsafeCell;
    pub(crate) use loom::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};
    pub(crate) use loom::sync::Arc;

    /// loom's `Mutex` behind the spin lock's API.
    #[derive(Debug)]
    pub(crate) struct SpinLock<T>(loom::sync::Mutex<T>);

    pub(crate) type SpinGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

    impl<T> SpinLock<T> {
        pub(crate) fn new(value: T) -> SpinLock<T> {
            SpinLock(loom::sync::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> SpinGuard<'_, T> {
            match self.0.lock() {
                Ok(guard) => guard,
                Err(poisoned) => poisoned.into_inner(),
            }
        }
    }

    impl<T: Default> Default for SpinLock<T> {
        fn default() -> Self {
            SpinLock::new(T::default())
        }
    }

    /// Under loom a spin is a yield, so the model can run the lock holder.
    pub(crate) fn spin_loop() {
        loom::thread::yield_now();
    }
}

pub(crate) use imp::*;
