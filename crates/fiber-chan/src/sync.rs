//! The one place where fiber-chan names its synchronization primitives
//! (loom-visible under `--cfg loom`).

#[cfg(not(loom))]
mod imp {
    pub(crate) use std::sync::atomic::{fence, AtomicBool, AtomicU8, AtomicUsize, Ordering};

    /// A small spin lock for the channel's short critical sections (a few
    /// pointer moves). Fibers must not block their worker thread in the
    /// kernel on a briefly held lock, so waiting spins, then yields the
    /// thread. Same API shape as `std::sync::Mutex` (never poisoned).
    #[derive(Debug, Default)]
    pub(crate) struct Mutex<T> {
        locked: std::sync::atomic::AtomicBool,
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
                locked: std::sync::atomic::AtomicBool::new(false),
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
            super::depth::enter();
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
            super::depth::exit();
        }
    }

    /// `UnsafeCell` with loom's closure-based access API.
    #[derive(Debug)]
    pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

    impl<T> UnsafeCell<T> {
        pub(crate) const fn new(value: T) -> Self {
            Self(std::cell::UnsafeCell::new(value))
        }

        // Part of loom's cell API, which this stand-in mirrors.
        #[allow(dead_code)]
        #[inline(always)]
        pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
            f(self.0.get())
        }

        #[inline(always)]
        pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
            f(self.0.get())
        }
    }
}

#[cfg(loom)]
mod imp {
    pub(crate) use loom::cell::UnsafeCell;
    pub(crate) use loom::sync::atomic::{fence, AtomicBool, AtomicU8, AtomicUsize, Ordering};
    pub(crate) use loom::sync::{Mutex, MutexGuard};
}

pub(crate) use imp::*;

/// Debug builds count the channel locks each OS thread holds, so that a
/// wake flush or a park under a channel lock fails an assertion (spec
/// section 2, lock discipline). A fiber never parks holding a channel lock,
/// so the per-thread count is the per-fiber count.
#[cfg(all(debug_assertions, not(loom)))]
pub(crate) mod depth {
    use std::cell::Cell;

    std::thread_local! {
        static DEPTH: Cell<usize> = const { Cell::new(0) };
    }

    #[inline]
    pub(crate) fn enter() {
        DEPTH.with(|d| d.set(d.get() + 1));
    }

    #[inline]
    pub(crate) fn exit() {
        DEPTH.with(|d| d.set(d.get() - 1));
    }

    /// Panics if the calling thread holds a channel lock.
    #[track_caller]
    pub(crate) fn assert_unlocked(what: &str) {
        let held = DEPTH.with(Cell::get);
        assert!(held == 0, "{what} while holding {held} channel lock(s)");
    }
}

/// Release builds and loom: no counting.
#[cfg(not(all(debug_assertions, not(loom))))]
pub(crate) mod depth {
    #[cfg(not(loom))]
    #[inline(always)]
    pub(crate) fn enter() {}
    #[cfg(not(loom))]
    #[inline(always)]
    pub(crate) fn exit() {}
    #[inline(always)]
    pub(crate) fn assert_unlocked(_: &str) {}
}

/// Give way while another party finishes a short step (a committed
/// hand-off): yield the fiber (only if `fiber_may_yield`: not while the
/// fiber is between PARKING and its park, i.e. inside a waitable's
/// `publish`, nor while it is unwound), or else the thread.
pub(crate) fn backoff(fiber_may_yield: bool) {
    #[cfg(loom)]
    {
        let _ = fiber_may_yield;
        loom::thread::yield_now();
    }
    #[cfg(not(loom))]
    {
        if fiber_may_yield && fiber_core::in_fiber() {
            // (`yield_now` may report a cancellation: the caller is seeing a
            // committed step through, which cancellation never interrupts.)
            #[allow(clippy::let_unit_value, clippy::ignored_unit_patterns)]
            let _ = fiber_core::yield_now();
        } else {
            std::thread::yield_now();
        }
    }
}

/// A SeqCst read-modify-write (the ring's position CAS) is part of the
/// single total order of SeqCst operations, so a later SeqCst load cannot
/// move before it (C++ [atomics.order]; on x86 the locked instruction is a
/// full barrier). Loom models SeqCst accesses as AcqRel only (it would
/// report false failures), but models `fence(SeqCst)`: under loom this is
/// that fence, at the point where the CAS sits in the total order; in real
/// builds it costs nothing.
#[inline(always)]
pub(crate) fn seqcst_rmw_point() {
    #[cfg(loom)]
    if SEQCST_RMW_POINT.with(std::cell::Cell::get) {
        fence(Ordering::SeqCst);
    }
}

#[cfg(loom)]
std::thread_local! {
    /// Loom only: does `seqcst_rmw_point` put its fence in? On by default;
    /// a model of a protocol with no park handshake turns it off
    /// ([`without_seqcst_rmw_point`]): the fence also acts as an acquire
    /// fence for a load made just before the CAS, so it would hide the
    /// loss of that load's own Acquire (the ring's stamp loads).
    static SEQCST_RMW_POINT: std::cell::Cell<bool> = const { std::cell::Cell::new(true) };
}

/// Loom only: run `f` (a `loom::model`, whose threads run on this OS
/// thread) with `seqcst_rmw_point` a no-op, as in real builds.
#[cfg(loom)]
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn without_seqcst_rmw_point<R>(f: impl FnOnce() -> R) -> R {
    struct Restore;
    impl Drop for Restore {
        fn drop(&mut self) {
            SEQCST_RMW_POINT.with(|s| s.set(true));
        }
    }
    SEQCST_RMW_POINT.with(|s| s.set(false));
    let _restore = Restore;
    f()
}

/// One step of waiting for another party to finish a short, lock-free step
/// (a ring slot between its claim and its publication): spin a little,
/// then yield the OS thread (the other party may be a descheduled thread;
/// it never needs our lock or our fiber to finish).
pub(crate) fn spin(step: &mut u32) {
    #[cfg(loom)]
    {
        let _ = step;
        loom::thread::yield_now();
    }
    #[cfg(not(loom))]
    {
        if *step < 64 {
            *step += 1;
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

/// A lock-free loop saw its position move on and looks again. Free in a
/// real run (the other party has already made progress); under loom a
/// yield, so that a model does not spin on a stale relaxed load while the
/// thread that moved the position never gets scheduled.
#[inline]
pub(crate) fn moved_on() {
    #[cfg(loom)]
    loom::thread::yield_now();
}

/// Back off after losing a CAS race on a contended ring end: spin
/// `2^step` times (up to 64), so that the cores competing for the line stop
/// taking it from each other on every attempt. Never yields the thread:
/// the winner has already moved on.
#[inline]
pub(crate) fn cas_backoff(step: &mut u32) {
    #[cfg(loom)]
    {
        let _ = step;
    }
    #[cfg(not(loom))]
    {
        for _ in 0..1u32 << *step {
            std::hint::spin_loop();
        }
        if *step < 6 {
            *step += 1;
        }
    }
}

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
