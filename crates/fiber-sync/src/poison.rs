//! Poisoning as `std::sync` does it: a guard dropped while its thread (or
//! fiber) panics marks the lock poisoned.

use crate::sync::{AtomicBool, Ordering};

/// The poison flag of a lock.
#[derive(Debug)]
pub(crate) struct Flag(AtomicBool);

/// Whether the guard's owner was already panicking when it took the lock.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Guard {
    panicking: bool,
}

impl Flag {
    #[cfg(not(loom))]
    pub(crate) const fn new() -> Flag {
        Flag(AtomicBool::new(false))
    }

    #[cfg(loom)]
    pub(crate) fn new() -> Flag {
        Flag(AtomicBool::new(false))
    }

    #[inline]
    pub(crate) fn get(&self) -> bool {
        // Relaxed: the flag carries no data; the lock orders the data.
        self.0.load(Ordering::Relaxed)
    }

    pub(crate) fn clear(&self) {
        // Relaxed: as in `get`.
        self.0.store(false, Ordering::Relaxed)
    }

    /// Note the panic state when a guard is made (the calling fiber's own,
    /// `fiber_core::panicking`: its worker thread may count as panicking
    /// because another fiber parked in the middle of an unwind there).
    #[inline]
    pub(crate) fn guard(&self) -> Guard {
        Guard {
            panicking: fiber_core::panicking(),
        }
    }

    /// When the guard is dropped: a panic that began while it was held
    /// poisons the lock.
    #[inline]
    pub(crate) fn done(&self, guard: Guard) {
        if !guard.panicking && fiber_core::panicking() {
            // Relaxed: as in `get`.
            self.0.store(true, Ordering::Relaxed);
        }
    }
}

/// Build a `LockResult` from a guard and the flag.
pub(crate) fn map_result<G>(poisoned: bool, guard: G) -> std::sync::LockResult<G> {
    if poisoned {
        Err(std::sync::PoisonError::new(guard))
    } else {
        Ok(guard)
    }
}
