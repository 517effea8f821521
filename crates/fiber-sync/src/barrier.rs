//! [`Barrier`]: `std::sync::Barrier`'s API, reusable across generations.
//!
//! # Protocol
//!
//! The arrival count and the waiter queue sit under one small lock. A
//! caller that is the n-th arrival resets the count, releases every queued
//! node (`Granted`) and returns as the leader, without a wait and so even
//! when its fiber is cancelled (`try_complete`, before fiber-core's
//! cancellation check). Any other caller arrives in `publish`, after that
//! check: it counts itself and queues its node. A waiter that leaves before
//! the release (cancelled) unlinks its node and takes its arrival back, so
//! the generation still needs n live callers.

use crate::queue::{Node, Status, WaitQueue};
use crate::sync::SpinLock;
use fiber_core::{fiber_wait, Publish, WaitOptions, WaitResult, Waitable, Waiter};
use std::fmt;

/// A barrier for `n` parties, with the API of [`std::sync::Barrier`]:
/// each [`Barrier::wait`] parks until `n` callers have arrived, then all
/// return and the barrier is ready for the next generation.
///
/// `wait` is a cancellation point: a fiber whose job is cancelled while it
/// waits (or before it would have to) withdraws its arrival and returns
/// early with [`BarrierWaitResult::is_cancelled`] set. The n-th arrival
/// needs no wait: it releases the generation and leads even in a cancelled
/// fiber, so the parties already waiting are never stranded by it.
///
/// # Examples
///
/// ```
/// # mod fiber { pub(crate) use fiber_sync as sync; }
/// use fiber::sync::Barrier;
/// use std::sync::Arc;
///
/// let barrier = Arc::new(Barrier::new(3));
/// let threads: Vec<_> = (0..3)
///     .map(|_| {
///         let barrier = barrier.clone();
///         std::thread::spawn(move || barrier.wait().is_leader())
///     })
///     .collect();
/// let leaders = threads.into_iter().map(|t| t.join().unwrap()).filter(|l| *l).count();
/// assert_eq!(leaders, 1);
/// ```
pub struct Barrier {
    n: usize,
    inner: SpinLock<Inner>,
}

// Like std's synchronization types: its count and wait queue stay consistent when a
// panic unwinds through a caller (no user code runs under its lock).
impl std::panic::UnwindSafe for Barrier {}
impl std::panic::RefUnwindSafe for Barrier {}

#[derive(Debug)]
struct Inner {
    arrived: usize,
    generation: u64,
    queue: WaitQueue,
}

/// What [`Barrier::wait`] returns.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct BarrierWaitResult {
    leader: bool,
    cancelled: bool,
}

impl BarrierWaitResult {
    /// Is this the one caller of its generation chosen as leader (the last
    /// to arrive)?
    pub fn is_leader(&self) -> bool {
        self.leader
    }

    /// Did the wait end because the calling fiber's job was cancelled
    /// (the caller's arrival was withdrawn)?
    pub fn is_cancelled(&self) -> bool {
        self.cancelled
    }
}

impl Barrier {
    /// A barrier that releases callers `n` at a time (`n` of 0 acts as 1).
    /// `const`, as std's, so a barrier can be a `static`.
    #[cfg(not(loom))]
    pub const fn new(n: usize) -> Barrier {
        Barrier {
            n: if n == 0 { 1 } else { n },
            inner: SpinLock::new(Inner {
                arrived: 0,
                generation: 0,
                queue: WaitQueue::new(),
            }),
        }
    }

    /// A barrier that releases callers `n` at a time (`n` of 0 acts as 1).
    #[cfg(loom)]
    pub fn new(n: usize) -> Barrier {
        Barrier {
            n: n.max(1),
            inner: SpinLock::new(Inner {
                arrived: 0,
                generation: 0,
                queue: WaitQueue::new(),
            }),
        }
    }

    /// Park until `n` callers have called `wait` in this generation.
    /// Exactly one caller per generation gets a leader result. A
    /// cancellation point (see the type docs).
    #[track_caller]
    pub fn wait(&self) -> BarrierWaitResult {
        fiber_core::coop_point();
        let mut io = BarrierIo {
            node: Node::new(0),
            barrier: self,
            arrived: false,
            leader: false,
        };
        let result = fiber_wait(&BarrierWait(self), &mut io, WaitOptions::new());
        BarrierWaitResult {
            leader: io.leader,
            cancelled: result == WaitResult::Cancelled,
        }
    }

    /// Under the lock, as the n-th arrival: start the next generation,
    /// lead it, and take every queued node (granted) to wake.
    fn release(&self, inner: &mut Inner, io: &mut BarrierIo<'_>) -> Vec<Waiter> {
        inner.arrived = 0;
        inner.generation += 1;
        io.leader = true;
        inner.queue.drain(Status::Granted)
    }

    /// The number of completed generations (for diagnostics and tests).
    pub fn generation(&self) -> u64 {
        self.inner.lock().generation
    }
}

impl fmt::Debug for Barrier {
    /// `Barrier { .. }`, as std's.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Barrier").finish_non_exhaustive()
    }
}

impl fmt::Debug for BarrierWaitResult {
    /// `BarrierWaitResult { is_leader: .. }`, as std's, with
    /// `cancelled: true` added for a wait that a cancellation ended.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("BarrierWaitResult");
        d.field("is_leader", &self.leader);
        if self.cancelled {
            d.field("cancelled", &true);
        }
        d.finish()
    }
}

/// The `Io` of one wait.
struct BarrierIo<'a> {
    node: Node,
    barrier: &'a Barrier,
    /// Counted in the current generation and not released yet.
    arrived: bool,
    leader: bool,
}

impl BarrierIo<'_> {
    /// Under the barrier lock: unlink the node; if it was still waiting,
    /// take the arrival back. Returns the node's status.
    fn leave(&mut self, inner: &mut Inner) -> Status {
        let status = inner.queue.unlink(&mut self.node);
        if status == Status::Waiting && self.arrived {
            inner.arrived -= 1;
        }
        self.arrived = false;
        status
    }
}

impl Drop for BarrierIo<'_> {
    fn drop(&mut self) {
        if self.node.queued {
            // Unwound while parked (shutdown): withdraw.
            let barrier = self.barrier;
            let mut inner = barrier.inner.lock();
            self.leave(&mut inner);
        }
    }
}

/// A barrier wait as a fiber-core waitable.
struct BarrierWait<'a>(&'a Barrier);

impl<'a> Waitable for BarrierWait<'a> {
    type Io = BarrierIo<'a>;

    fn kind(&self) -> fiber_core::WaitKind {
        fiber_core::WaitKind::Lock
    }

    fn try_complete(&self, io: &mut BarrierIo<'a>) -> Option<WaitResult> {
        // The n-th arrival needs no wait: it completes the generation here,
        // before fiber-core's cancellation check, so a cancelled fiber
        // still releases the parties already waiting (as a free semaphore
        // permit is taken, cancelled or not). An arrival that would have
        // to wait happens in `publish`, after that check: a cancelled
        // fiber never counts there.
        let wakes = {
            let mut inner = self.0.inner.lock();
            if inner.arrived + 1 < self.0.n {
                return None;
            }
            self.0.release(&mut inner, io)
        };
        WaitQueue::wake_all(wakes);
        Some(WaitResult::Ok)
    }

    fn publish(&self, waiter: &Waiter, io: &mut BarrierIo<'a>) -> Publish {
        let wakes = {
            let mut inner = self.0.inner.lock();
            if inner.arrived + 1 < self.0.n {
                inner.arrived += 1;
                io.arrived = true;
                inner.queue.push(&mut io.node, waiter, false);
                return Publish::Published;
            }
            self.0.release(&mut inner, io)
        };
        WaitQueue::wake_all(wakes);
        Publish::Ready(WaitResult::Ok)
    }

    fn unpublish(&self, _: &Waiter, io: &mut BarrierIo<'a>) -> Option<WaitResult> {
        let barrier = self.0;
        let mut inner = barrier.inner.lock();
        (io.leave(&mut inner) == Status::Granted).then_some(WaitResult::Ok)
    }
}
