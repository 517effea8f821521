//! [`Semaphore`]: a counting semaphore in tokio's shape, FIFO.
//!
//! # State
//!
//! One word: the available permits shifted left by one, and [`QUEUED`]
//! (the waiter queue is not empty; changed under the queue lock only).
//!
//! # Protocol
//!
//! * Acquire, fast path: while `QUEUED` is clear and enough permits are
//!   there, CAS them away. With waiters queued nobody takes permits past
//!   them: strict FIFO, so a large `acquire_many` is never starved by a
//!   stream of small ones.
//! * Acquire, slow path (`publish`, under the queue lock): set `QUEUED` in
//!   an RMW that also reads the permits; with the queue empty and enough
//!   permits, take them, else queue the node.
//! * Release: add the permits in a CAS that first checks the total
//!   against `MAX_PERMITS`; if the previous value had `QUEUED`,
//!   take the queue lock and grant permits to the queue's head nodes in
//!   order while they fit (`grant`). A release that raced a `publish` is
//!   ordered against it by the RMWs on the one word: either `publish` sees
//!   the permits, or the release sees `QUEUED` and grants.
//! * A waiter that leaves (cancelled) may have blocked the head: it runs
//!   `grant` after unlinking.

use crate::queue::{Node, Status, WaitQueue};
use crate::sync::{AtomicUsize, Ordering, SpinLock};
use fiber_core::{fiber_wait, Cancelled, Publish, WaitOptions, WaitResult, Waitable, Waiter};
use std::fmt;

/// The waiter queue is not empty.
const QUEUED: usize = 1;
/// Permits are counted above the flag bit.
const SHIFT: u32 = 1;

/// A counting semaphore, shaped like tokio's `Semaphore` (`try_acquire`
/// returns an `Option`, a cancelled `acquire` returns `Cancelled`, and there
/// is no `close`): `acquire` parks the
/// fiber (or blocks the thread) until a permit is free; the permit returns
/// when dropped. Waiters are served in FIFO order.
///
/// [`Semaphore::acquire`] and [`Semaphore::acquire_many`] are cancellation
/// points: they return `Err(Cancelled)` when the calling fiber's job is
/// cancelled while they wait.
///
/// # Examples
///
/// ```
/// # mod fiber { pub(crate) use fiber_sync as sync; }
/// use fiber::sync::Semaphore;
///
/// let sem = Semaphore::new(2);
/// let a = sem.acquire().unwrap();
/// let _b = sem.try_acquire().unwrap();
/// assert!(sem.try_acquire().is_none());
/// drop(a);
/// assert_eq!(sem.available_permits(), 1);
/// ```
pub struct Semaphore {
    state: AtomicUsize,
    queue: SpinLock<WaitQueue>,
}

// Like std's synchronization types: its permits and wait queue stay consistent when a
// panic unwinds through a caller (no user code runs under its lock).
impl std::panic::UnwindSafe for Semaphore {}
impl std::panic::RefUnwindSafe for Semaphore {}

/// Permits taken from a [`Semaphore`]; they return to it on drop.
#[must_use = "dropping the permit returns it at once"]
pub struct SemaphorePermit<'a> {
    sem: &'a Semaphore,
    permits: u32,
}

impl Semaphore {
    /// The most permits a semaphore can hold.
    pub const MAX_PERMITS: usize = usize::MAX >> 3;

    /// A semaphore with `permits` permits.
    ///
    /// # Panics
    ///
    /// If `permits` exceeds [`Semaphore::MAX_PERMITS`].
    pub fn new(permits: usize) -> Semaphore {
        assert!(
            permits <= Self::MAX_PERMITS,
            "fiber::sync::Semaphore::new: {permits} permits exceed MAX_PERMITS"
        );
        Semaphore {
            state: AtomicUsize::new(permits << SHIFT),
            queue: SpinLock::new(WaitQueue::new()),
        }
    }

    /// The permits available right now.
    pub fn available_permits(&self) -> usize {
        // Relaxed: a snapshot.
        self.state.load(Ordering::Relaxed) >> SHIFT
    }

    /// Acquire one permit, parking until one is free (FIFO).
    ///
    /// # Errors
    ///
    /// [`Cancelled`] if the calling fiber's job was cancelled while it
    /// waited: no permit is taken, even if one was handed to it after the
    /// cancel (it goes to the next waiter). A permit that is free when the
    /// call looks is taken without a wait, cancelled or not (as Go's
    /// `Acquire` on a done context may succeed).
    #[track_caller]
    pub fn acquire(&self) -> Result<SemaphorePermit<'_>, Cancelled> {
        self.acquire_many(1)
    }

    /// Acquire `n` permits at once, parking until they are free (FIFO: no
    /// later request is served first). Zero permits are granted at once,
    /// even while others wait.
    ///
    /// # Errors
    ///
    /// [`Cancelled`] if the calling fiber's job was cancelled while it
    /// waited (no permit is taken: see [`acquire`](Self::acquire)).
    #[track_caller]
    pub fn acquire_many(&self, n: u32) -> Result<SemaphorePermit<'_>, Cancelled> {
        fiber_core::coop_point();
        if let Some(permit) = self.try_take(n) {
            return Ok(permit);
        }
        let mut io = SemIo {
            node: Node::new(n as usize),
            sem: self,
        };
        match fiber_wait(&SemWait(self), &mut io, WaitOptions::new()) {
            // Granted, but the fiber was cancelled before it ran again (the
            // cancel may even have come first: it only made the fiber
            // runnable, and the release then served the queue's head). The
            // permits go back, to the next waiter: a cancelled acquire takes
            // nothing, as Go's `Weighted.Acquire` and Kotlin's
            // `Semaphore.acquire` promise.
            // Not in teardown: there a cancellation is an unwind, which
            // this wait did not take (it was granted first), and a fiber
            // inside `non_cancellable` reads as cancelled too; the grant
            // stands, as it did before. (The loom models have no
            // cancellation scopes.)
            #[cfg(not(loom))]
            WaitResult::Ok if fiber_core::is_cancel_requested() && !fiber_core::is_tearing_down() => {
                self.release(n as usize);
                Err(Cancelled)
            }
            WaitResult::Ok => Ok(SemaphorePermit { sem: self, permits: n }),
            WaitResult::Cancelled => Err(Cancelled),
            other => unreachable!("a semaphore wait has no deadline and never closes: {other:?}"),
        }
    }

    /// Take one permit if one is free and nobody waits (never parks; in a
    /// fiber, a call that finds nothing to do counts toward the poll
    /// budget, and every `fiber_core::POLL_BUDGET` (128) such misses the
    /// fiber yields, so a loop that polls lets other fibers run.)
    pub fn try_acquire(&self) -> Option<SemaphorePermit<'_>> {
        self.try_acquire_many(1)
    }

    /// Take `n` permits if they are free and nobody waits (zero permits:
    /// always).
    pub fn try_acquire_many(&self, n: u32) -> Option<SemaphorePermit<'_>> {
        fiber_core::coop_point();
        let permit = self.try_take(n);
        if permit.is_none() {
            // A failed poll: counts toward the fiber's budget yield (a
            // fiber spinning on `try_acquire` lets the holders run).
            fiber_core::poll_missed();
        }
        permit
    }

    /// [`try_acquire_many`](Self::try_acquire_many) without the poll
    /// accounting (the first attempt of a waiting acquire).
    fn try_take(&self, n: u32) -> Option<SemaphorePermit<'_>> {
        if n == 0 {
            // Nothing to take, so nothing to wait for, even behind queued
            // waiters (tokio's `acquire_many(0)` is ready at once):
            // `acquire_many(batch.len())` of an empty batch must not block.
            return Some(SemaphorePermit { sem: self, permits: 0 });
        }
        // Always true on 64-bit targets (a `u32` is far below the limit);
        // on 32-bit ones a request above the limit could never be granted
        // and its shifted count would overflow, so it is refused loudly.
        assert!(
            n as usize <= Self::MAX_PERMITS,
            "fiber::sync::Semaphore: a request for {n} permits exceeds MAX_PERMITS"
        );
        let need = (n as usize) << SHIFT;
        // Relaxed: the CAS below acquires.
        let mut seen = self.state.load(Ordering::Relaxed);
        while seen & QUEUED == 0 && seen >= need {
            // Acquire: pairs with the Release in `release`, so what the
            // previous holder wrote is visible to us.
            match self
                .state
                .compare_exchange_weak(seen, seen - need, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => return Some(SemaphorePermit { sem: self, permits: n }),
                Err(s) => seen = s,
            }
        }
        None
    }

    /// Add `n` permits (waiters are served first, in order).
    ///
    /// # Panics
    ///
    /// If the total would exceed [`Semaphore::MAX_PERMITS`].
    pub fn add_permits(&self, n: usize) {
        assert!(
            n <= Self::MAX_PERMITS,
            "fiber::sync::Semaphore::add_permits: {n} permits exceed MAX_PERMITS"
        );
        self.release(n);
    }

    fn release(&self, n: usize) {
        if n == 0 {
            return;
        }
        // A CAS rather than a `fetch_add` undone on overflow: the count
        // never shows more than MAX_PERMITS, not even for a moment, so no
        // taker can get permits that the undo then takes back below zero.
        // Relaxed load: the CAS below rechecks it.
        let mut prev = self.state.load(Ordering::Relaxed);
        loop {
            assert!(
                (prev >> SHIFT) + n <= Self::MAX_PERMITS,
                "fiber::sync::Semaphore: adding {n} permits to {} exceeds MAX_PERMITS",
                prev >> SHIFT
            );
            // Release: pairs with the Acquire of the next taker (fast path
            // CAS or `grant`). Failure Relaxed: only a new value to retry.
            match self
                .state
                .compare_exchange_weak(prev, prev + (n << SHIFT), Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(seen) => prev = seen,
            }
        }
        if prev & QUEUED != 0 {
            let wakes = {
                let mut queue = self.queue.lock();
                self.grant(&mut queue)
            };
            WaitQueue::wake_all(wakes);
        }
    }

    /// Under the queue lock: give permits to the head nodes in order while
    /// they fit; keep `QUEUED` equal to "the queue is not empty".
    fn grant(&self, queue: &mut WaitQueue) -> Vec<Waiter> {
        let mut wakes = Vec::new();
        while let Some(first) = queue.front() {
            let need = first.arg << SHIFT;
            // Acquire: pairs with the Release in `release`.
            let mut seen = self.state.load(Ordering::Acquire);
            let mut taken = false;
            while seen >= need + QUEUED {
                // Acquire: as above.
                match self
                    .state
                    .compare_exchange_weak(seen, seen - need, Ordering::Acquire, Ordering::Acquire)
                {
                    Ok(_) => {
                        taken = true;
                        break;
                    }
                    Err(s) => seen = s,
                }
            }
            if !taken {
                break;
            }
            wakes.extend(queue.pop_front(Status::Granted).flatten());
        }
        if queue.is_empty() {
            // Relaxed: QUEUED is read as a hint outside the queue lock; the
            // permits it guards are ordered by the CASes above.
            self.state.fetch_and(!QUEUED, Ordering::Relaxed);
        }
        wakes
    }
}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore")
            .field("permits", &self.available_permits())
            .finish_non_exhaustive()
    }
}

impl SemaphorePermit<'_> {
    /// How many permits this holds.
    pub fn num_permits(&self) -> usize {
        self.permits as usize
    }

    /// Keep the permits out of the semaphore for good.
    pub fn forget(mut self) {
        self.permits = 0;
    }
}

impl Drop for SemaphorePermit<'_> {
    fn drop(&mut self) {
        self.sem.release(self.permits as usize);
    }
}

impl fmt::Debug for SemaphorePermit<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SemaphorePermit")
            .field("permits", &self.permits)
            .finish_non_exhaustive()
    }
}

/// The `Io` of one acquire.
struct SemIo<'a> {
    node: Node,
    sem: &'a Semaphore,
}

impl Drop for SemIo<'_> {
    fn drop(&mut self) {
        if !self.node.queued {
            return;
        }
        // Unwound while parked (shutdown): leave, or give back a grant.
        let (status, wakes) = {
            let mut queue = self.sem.queue.lock();
            let status = queue.unlink(&mut self.node);
            let wakes = self.sem.grant(&mut queue);
            (status, wakes)
        };
        WaitQueue::wake_all(wakes);
        if status == Status::Granted {
            self.sem.release(self.node.arg);
        }
    }
}

/// An acquire as a fiber-core waitable.
struct SemWait<'a>(&'a Semaphore);

impl<'a> Waitable for SemWait<'a> {
    type Io = SemIo<'a>;

    fn kind(&self) -> fiber_core::WaitKind {
        fiber_core::WaitKind::Lock
    }

    fn try_complete(&self, io: &mut SemIo<'a>) -> Option<WaitResult> {
        let permit = self.0.try_take(io.node.arg as u32)?;
        std::mem::forget(permit);
        Some(WaitResult::Ok)
    }

    fn publish(&self, waiter: &Waiter, io: &mut SemIo<'a>) -> Publish {
        let sem = self.0;
        let need = io.node.arg << SHIFT;
        let mut queue = sem.queue.lock();
        // Still in the queue after a wake that granted nothing (see
        // `unpublish`): granted since, or parks again in its place.
        if let Some(publish) = queue.take_up_kept(&mut io.node, waiter) {
            return publish;
        }
        // Relaxed on the RMW: its place in the word's modification order
        // against `release`'s compare-exchange loop is what matters (module
        // docs); the CAS below acquires.
        let mut seen = sem.state.fetch_or(QUEUED, Ordering::Relaxed) | QUEUED;
        if queue.is_empty() {
            while seen >= need + QUEUED {
                // Acquire: pairs with the Release in `release`. The queue
                // is empty, so QUEUED is cleared again.
                match sem.state.compare_exchange_weak(
                    seen,
                    (seen - need) & !QUEUED,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => return Publish::Ready(WaitResult::Ok),
                    Err(s) => seen = s,
                }
            }
        }
        queue.push(&mut io.node, waiter, false);
        Publish::Published
    }

    fn unpublish(&self, _: &Waiter, io: &mut SemIo<'a>) -> Option<WaitResult> {
        let mut queue = self.0.queue.lock();
        if io.node.status() == Status::Waiting {
            // Woken while still queued (a cancel's interrupt inside
            // `non_cancellable`, the end of an unwinding wait's slice): the
            // node keeps its place, as a lock waiter's does. Unlinked and
            // queued again at the back, a large request was passed by a
            // later, smaller one that the freed head let in (FIFO broken:
            // `adversarial/sync_waiters.rs`). `publish` parks it again there (or
            // finds it granted); if the wait ends otherwise (a timeout, a
            // cancel), the `Io`'s drop unlinks it, serves whoever fits
            // behind it, and gives back a grant made meanwhile.
            return None;
        }
        (queue.unlink(&mut io.node) == Status::Granted).then_some(WaitResult::Ok)
    }
}
