//! The poller thread's rest while workers take readiness events themselves
//! (the decision half; the driver does the parking).
//!
//! Under load, busy workers take ready events with non-blocking harvests
//! (fiber-core's `IoPoll` hook). An event the poller thread took instead
//! would cost a thread hop and a preempted worker, for an event a worker
//! would have taken at its next search anyway. So the poller rests (out of
//! `epoll_wait`, parked for at most the driver's rest period) while workers
//! harvest events, and goes back to `epoll_wait` when they stop.
//!
//! # Protocol
//!
//! * A worker harvest that took events calls [`PollerRest::note_harvest`]
//!   (sets `workers_took`).
//! * Before each `epoll_wait`, the poller calls [`PollerRest::begin`]. If
//!   `workers_took` was set (it swaps it out), the poller rests: it stores
//!   `resting`, `fence(SeqCst)`, then swaps out `worker_slept`. If a worker
//!   went to sleep meanwhile, it does not park at all. [`PollerRest::end`]
//!   clears `resting`.
//! * A worker about to sleep calls [`PollerRest::worker_sleeping`]: it
//!   stores `worker_slept`, `fence(SeqCst)`, then reads `resting`. If the
//!   poller rests, the worker unparks it.
//!
//! The fences make a Dekker pair. Either the poller sees `worker_slept`, or
//! the sleeping worker sees `resting`. So the last worker to sleep finds
//! the poller awake or wakes it, and no event waits for a rest to time out
//! while every worker sleeps. A worker that stays awake but stops
//! harvesting (one long CPU-bound fiber) delays readiness by at most one
//! rest period. Checked by `tests/loom_rest.rs`.

use crate::sync::{AtomicBool, Ordering};

#[cfg(not(loom))]
use std::sync::atomic::fence;

#[cfg(loom)]
use loom::sync::atomic::fence;

/// The three flags of the rest protocol.
#[derive(Debug, Default)]
pub(crate) struct PollerRest {
    workers_took: AtomicBool,
    resting: AtomicBool,
    worker_slept: AtomicBool,
}

impl PollerRest {
    /// An empty protocol state.
    #[cfg(not(loom))]
    pub(crate) const fn new() -> PollerRest {
        PollerRest {
            workers_took: AtomicBool::new(false),
            resting: AtomicBool::new(false),
            worker_slept: AtomicBool::new(false),
        }
    }

    /// A worker's harvest took events.
    #[inline]
    pub(crate) fn note_harvest(&self) {
        // Relaxed: a hint for the poller's next look; a stale value costs one
        // rest at most, or one `epoll_wait` that returns at the next event.
        // Read first so that busy workers do not write the line each time.
        if !self.workers_took.load(Ordering::Relaxed) {
            self.workers_took.store(true, Ordering::Relaxed);
        }
    }

    /// The poller's look before `epoll_wait`: `None` to wait in
    /// `epoll_wait`, `Some(park)` to rest instead (parking only if
    /// `park`), then call [`end`](Self::end).
    pub(crate) fn begin(&self) -> Option<bool> {
        // Relaxed: a hint, as in `note_harvest`.
        if !self.workers_took.swap(false, Ordering::Relaxed) {
            return None;
        }
        // Relaxed store, then the SeqCst fence, then the read: the poller's
        // half of the Dekker pair with `worker_sleeping`.
        self.resting.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        Some(!self.worker_slept.swap(false, Ordering::Relaxed))
    }

    /// The rest is over.
    pub(crate) fn end(&self) {
        // Relaxed: a worker that still reads `true` only unparks a poller
        // that is not parked (the unpark token makes its next rest short).
        self.resting.store(false, Ordering::Relaxed);
    }

    /// A worker is about to sleep: `true` if it must unpark the poller.
    pub(crate) fn worker_sleeping(&self) -> bool {
        // Relaxed store, then the SeqCst fence, then the read: the worker's
        // half of the Dekker pair with `begin`.
        self.worker_slept.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        self.resting.load(Ordering::Relaxed)
    }
}
