//! The global injection queue: a lock-free ring of [`GLOBAL_QUEUE_SLOTS`]
//! (crossbeam-queue's `ArrayQueue`) in front of an unbounded lock-free
//! overflow list (`SegQueue`), so a push never blocks and never fails.
//!
//! Order: pops take the ring first, then the overflow. While the overflow
//! holds anything, pushes go to the overflow too, so a fiber pushed later
//! never overtakes the ring by much.

use crate::config::GLOBAL_QUEUE_SLOTS;
use crossbeam_queue::{ArrayQueue, SegQueue};
use fiber_core::Runnable;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The global MPMC run queue.
#[derive(Debug)]
pub(crate) struct GlobalQueue {
    ring: ArrayQueue<Runnable>,
    overflow: SegQueue<Runnable>,
    /// Pushes that went to the overflow (diagnostics; Relaxed).
    overflowed: AtomicUsize,
}

impl GlobalQueue {
    pub(crate) fn new() -> GlobalQueue {
        GlobalQueue {
            ring: ArrayQueue::new(GLOBAL_QUEUE_SLOTS),
            overflow: SegQueue::new(),
            overflowed: AtomicUsize::new(0),
        }
    }

    /// Push; never blocks, never fails.
    pub(crate) fn push(&self, fiber: Runnable) {
        let fiber = if self.overflow.is_empty() {
            match self.ring.push(fiber) {
                Ok(()) => return,
                Err(fiber) => fiber,
            }
        } else {
            fiber
        };
        self.overflowed.fetch_add(1, Ordering::Relaxed);
        self.overflow.push(fiber);
    }

    pub(crate) fn pop(&self) -> Option<Runnable> {
        self.ring.pop().or_else(|| self.overflow.pop())
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.ring.is_empty() && self.overflow.is_empty()
    }

    pub(crate) fn overflowed(&self) -> usize {
        self.overflowed.load(Ordering::Relaxed)
    }
}
