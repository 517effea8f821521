//! The scheduler contract: `schedule` / `worker_next` on the scheduler side,
//! [`fiber_wait`](crate::fiber_wait) / [`fiber_wake`](crate::fiber_wake) on
//! the waitable side (spec 3.1).
//!
//! A scheduler owns run queues and worker threads; fiber-core owns fiber
//! state. The only things that cross are [`Runnable`] tokens: one exists per
//! RUNNABLE fiber, it is not `Clone`, and it is created only by the edge that
//! made the fiber RUNNABLE (spawn, yield, or a won wake claim). So "enqueue
//! exactly once" (F4) holds by construction, and "only RUNNABLE fibers in run
//! queues" (F2) is checked when the token is made.

use crate::fiber::{Fiber, FiberId, RunOutcome};
use crate::pool::FramePool;
use crate::state::{check_enqueue, Actor};
use crate::sync::{Arc, Ordering};
use crate::wait::Waiter;
use std::fmt;
use std::time::Instant;

/// The scheduler side of the contract.
///
/// Implementations must be cheap to call from any thread, including from
/// inside a running fiber and from timer or waker threads.
pub trait Schedule: Send + Sync + 'static {
    /// Enqueue a RUNNABLE fiber. Called exactly once per RUNNABLE edge; the
    /// implementation must make the fiber visible to some worker and then
    /// wake a worker if all are asleep (publish the fiber before signalling a worker).
    fn schedule(&self, fiber: Runnable);

    /// Arrange for [`fiber_wake`](crate::fiber_wake)`(&waiter)` to be called
    /// at or after `deadline` (the timer hook used by deadlines on
    /// [`fiber_wait`](crate::fiber_wait)). Waking a stale waiter is harmless,
    /// so implementations need not remove timers whose wait ended early.
    fn wake_at(&self, deadline: Instant, waiter: Waiter);

    /// The scheduler's clock. Deadlines are compared against it, which lets a
    /// test scheduler run on virtual time.
    fn now(&self) -> Instant {
        Instant::now()
    }

    /// The frame pool fibers of this scheduler are spawned from.
    fn frames(&self) -> &FramePool;

    /// Should every fiber spawned on this scheduler be pinned (hard
    /// affinity: after its first run it resumes only on that worker)?
    fn pins_fibers(&self) -> bool {
        false
    }
}

/// The worker side of the contract.
pub trait Worker {
    /// The next fiber to run, already transitioned RUNNABLE -> RUNNING, or
    /// `None` when the worker has nothing to do and may go idle.
    fn worker_next(&mut self) -> Option<Running>;
}

/// Ownership of one RUNNABLE fiber: the token a run queue holds.
pub struct Runnable {
    fiber: Arc<Fiber>,
}

impl Runnable {
    /// Wrap a fiber that the caller has just made RUNNABLE.
    #[inline]
    #[track_caller]
    pub(crate) fn new(fiber: Arc<Fiber>, actor: Actor) -> Runnable {
        check_enqueue(fiber.state.load(Ordering::Relaxed).state(), actor);
        Runnable { fiber }
    }

    /// `RUNNABLE -> RUNNING`: take execution ownership. The worker then calls
    /// [`Running::resume`].
    #[inline]
    pub fn into_running(self) -> Running {
        self.fiber.state.transition_to_running();
        Running { fiber: self.fiber }
    }

    /// The fiber's id.
    #[inline]
    pub fn id(&self) -> FiberId {
        self.fiber.id()
    }

    pub(crate) fn fiber_ref(&self) -> &Fiber {
        &self.fiber
    }

    /// Ask the CPU to start loading this fiber's frame: a scheduler that
    /// takes a batch of fibers written on another core (a steal) calls it
    /// for each before running them one by one, then
    /// [`prefetch_stack`](Self::prefetch_stack) for each. A hint only: it
    /// changes nothing the program sees.
    pub fn prefetch(&self) {
        Fiber::prefetch_frame(Arc::as_ptr(&self.fiber));
    }

    /// Ask the CPU to start loading the part of this fiber's stack where it
    /// resumes. It reads the frame (where the fiber last switched away), so
    /// on a batch call it after [`prefetch`](Self::prefetch) of every
    /// fiber, not right after each: it would wait for that frame's line.
    pub fn prefetch_stack(&self) {
        self.fiber.prefetch_stack();
    }

    pub(crate) fn into_fiber(self) -> Arc<Fiber> {
        self.fiber
    }

    /// The worker that last ran this fiber (soft-affinity hint), if any.
    #[inline]
    pub fn last_worker(&self) -> Option<usize> {
        self.fiber.last_worker()
    }

    /// Give up the token as a raw pointer, to keep it in a lock-free slot.
    /// The fiber stays RUNNABLE and owned by whoever turns the pointer back
    /// into a token ([`Runnable::from_raw`]), exactly once.
    #[inline]
    pub fn into_raw(self) -> std::ptr::NonNull<()> {
        let ptr = Arc::into_raw(self.fiber) as *mut ();
        // SAFETY: `Arc::into_raw` never returns null.
        unsafe { std::ptr::NonNull::new_unchecked(ptr) }
    }

    /// Take back a token given up with [`Runnable::into_raw`].
    ///
    /// # Safety
    ///
    /// `ptr` came from `into_raw` and is turned back into a token exactly
    /// once (a second token for the same fiber would let two workers run
    /// it).
    #[inline]
    pub unsafe fn from_raw(ptr: std::ptr::NonNull<()>) -> Runnable {
        // SAFETY: see the function's contract: the pointer is an
        // `Arc<Fiber>` from `into_raw`, reclaimed once.
        let fiber = unsafe { Arc::from_raw(ptr.as_ptr() as *const Fiber) };
        Runnable { fiber }
    }

    /// The worker this fiber must resume on: `Some` for a pinned fiber
    /// that has run (hard affinity) and for a fiber that switched away while
    /// its thread counted as panicking (until a resume finds the thread
    /// clean; see [`crate::take_unwind_pin_delta`]), `None` when any worker
    /// may run it.
    #[inline]
    pub fn home(&self) -> Option<usize> {
        if self.fiber.is_pinned() || self.fiber.is_unwind_pinned() {
            self.fiber.last_worker()
        } else {
            None
        }
    }
}

impl fmt::Debug for Runnable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runnable").field("fiber", &self.fiber.id()).finish()
    }
}

/// Execution ownership of one RUNNING fiber (invariant F1).
pub struct Running {
    fiber: Arc<Fiber>,
}

impl Running {
    /// Run the fiber on this thread until it yields, parks or finishes.
    /// `worker` is recorded as the fiber's last worker (affinity hint).
    ///
    /// The park commit happens here, on the worker's stack, after the fiber
    /// has switched away (yield before commit).
    #[inline]
    pub fn resume(self, worker: usize) -> RunOutcome {
        Fiber::run(self.fiber, worker)
    }

    /// The fiber's id.
    #[inline]
    pub fn id(&self) -> FiberId {
        self.fiber.id()
    }

    /// Where the fiber was spawned (diagnostics: stall and deadlock reports).
    #[inline]
    pub fn spawn_location(&self) -> &'static std::panic::Location<'static> {
        self.fiber.spawned_at()
    }

    /// Is the fiber pinned (hard affinity to the worker it first runs on)?
    #[inline]
    pub fn is_pinned(&self) -> bool {
        self.fiber.is_pinned()
    }

    /// The fiber's name, if it was spawned with one (diagnostics, traces).
    pub fn name(&self) -> Option<std::sync::Arc<str>> {
        self.fiber.name()
    }

    /// Has the fiber run before (on any worker)?
    #[inline]
    pub fn has_run(&self) -> bool {
        self.fiber.last_worker().is_some()
    }
}

impl fmt::Debug for Running {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Running").field("fiber", &self.fiber.id()).finish()
    }
}
