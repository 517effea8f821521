//! [`WaitGroup`]: crossbeam's `WaitGroup` shape over a counter and a
//! waiter queue.
//!
//! # Protocol
//!
//! The count is the number of live handles. Dropping the last one (count
//! to 0, AcqRel) takes the queue lock and releases every queued waiter. A
//! waiter re-reads the count under the queue lock before queueing, so it
//! either sees 0 or is queued before the last drop's wake pass.

use crate::queue::{Node, Status, WaitQueue};
use crate::sync::{Arc, AtomicUsize, Ordering, SpinLock};
use fiber_core::{fiber_wait, Publish, WaitOptions, WaitResult, Waitable, Waiter};
use std::fmt;

/// Wait for a group of fibers (or threads) to finish, in the shape of
/// crossbeam's `WaitGroup`: every clone is one member; dropping a clone
/// means "done"; [`WaitGroup::wait`] drops its own handle and parks until
/// every other clone is gone.
///
/// `wait` is a cancellation point: it returns early when the calling
/// fiber's job is cancelled (check with `fiber::is_cancelled()`).
///
/// # Examples
///
/// ```
/// # mod fiber { pub(crate) use fiber_sync as sync; }
/// use fiber::sync::WaitGroup;
///
/// let wg = WaitGroup::new();
/// for _ in 0..4 {
///     let wg = wg.clone();
///     std::thread::spawn(move || {
///         // ... work ...
///         drop(wg);
///     });
/// }
/// wg.wait();
/// ```
pub struct WaitGroup {
    inner: Arc<Inner>,
}

// Like std's synchronization types: its count and wait queue stay consistent when a
// panic unwinds through a caller (no user code runs under its lock).
impl std::panic::UnwindSafe for WaitGroup {}
impl std::panic::RefUnwindSafe for WaitGroup {}

struct Inner {
    count: AtomicUsize,
    queue: SpinLock<WaitQueue>,
}

impl WaitGroup {
    /// A group with one member (this handle).
    pub fn new() -> WaitGroup {
        WaitGroup {
            inner: Arc::new(Inner {
                count: AtomicUsize::new(1),
                queue: SpinLock::new(WaitQueue::new()),
            }),
        }
    }

    /// Drop this handle and park until every other clone is dropped, or
    /// until the calling fiber's job is cancelled.
    #[track_caller]
    pub fn wait(self) {
        fiber_core::coop_point();
        let inner = self.inner.clone();
        drop(self);
        let mut io = WgIo {
            node: Node::new(0),
            inner: &inner,
        };
        let _ = fiber_wait(&WgWait(&inner), &mut io, WaitOptions::new());
    }
}

impl Default for WaitGroup {
    fn default() -> Self {
        WaitGroup::new()
    }
}

impl Clone for WaitGroup {
    fn clone(&self) -> Self {
        // Relaxed: a new member is made from a live one, so the count
        // cannot be 0 here (as `Arc::clone`).
        self.inner.count.fetch_add(1, Ordering::Relaxed);
        WaitGroup {
            inner: self.inner.clone(),
        }
    }
}

impl Drop for WaitGroup {
    fn drop(&mut self) {
        // AcqRel: Release publishes this member's work to the waiter
        // (pairs with the Acquire loads in the waitable); Acquire makes
        // the last dropper see the others' before it wakes.
        if self.inner.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            let wakes = self.inner.queue.lock().drain(Status::Granted);
            WaitQueue::wake_all(wakes);
        }
    }
}

impl fmt::Debug for WaitGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Relaxed: a snapshot.
        let count = self.inner.count.load(Ordering::Relaxed);
        f.debug_struct("WaitGroup").field("count", &count).finish()
    }
}

/// The `Io` of one wait.
struct WgIo<'a> {
    node: Node,
    inner: &'a Inner,
}

impl Drop for WgIo<'_> {
    fn drop(&mut self) {
        if self.node.queued {
            // Unwound while parked (shutdown): leave the queue.
            self.inner.queue.lock().unlink(&mut self.node);
        }
    }
}

/// A group wait as a fiber-core waitable.
struct WgWait<'a>(&'a Inner);

impl<'a> Waitable for WgWait<'a> {
    type Io = WgIo<'a>;

    fn kind(&self) -> fiber_core::WaitKind {
        fiber_core::WaitKind::Lock
    }

    fn try_complete(&self, _: &mut WgIo<'a>) -> Option<WaitResult> {
        // Acquire: pairs with the AcqRel decrement in `drop`.
        (self.0.count.load(Ordering::Acquire) == 0).then_some(WaitResult::Ok)
    }

    fn publish(&self, waiter: &Waiter, io: &mut WgIo<'a>) -> Publish {
        let mut queue = self.0.queue.lock();
        // Acquire: as in `try_complete`; under the queue lock (module docs).
        if self.0.count.load(Ordering::Acquire) == 0 {
            return Publish::Ready(WaitResult::Ok);
        }
        queue.push(&mut io.node, waiter, false);
        Publish::Published
    }

    fn unpublish(&self, _: &Waiter, io: &mut WgIo<'a>) -> Option<WaitResult> {
        let status = self.0.queue.lock().unlink(&mut io.node);
        (status == Status::Granted).then_some(WaitResult::Ok)
    }
}
