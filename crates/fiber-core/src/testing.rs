//! A tiny deterministic single-threaded scheduler that implements the
//! contract. fiber-core's own park/wake tests run on it, and so do the
//! channel and job suites (besides fiber-sched): it is how we show that the
//! scheduler is swappable.
//!
//! * One thread (the caller of [`TestScheduler::run`]) runs every fiber.
//! * The run queue is FIFO, or a seeded random pick ([`TestScheduler::with_seed`])
//!   to explore other interleavings reproducibly.
//! * Time is virtual: the clock jumps to the earliest timer whenever no fiber
//!   is runnable, so timeouts are exact and tests never sleep.
//! * Wakes may come from other OS threads; `run` blocks until they arrive,
//!   and reports a deadlock (panics) if nothing happens for
//!   [`DEADLOCK_AFTER`] while fibers are still alive.

use crate::fiber::RunOutcome;
use crate::pool::{FramePool, PoolStats};
use crate::sched::{Runnable, Running, Schedule, Worker};
use crate::stack::StackConfig;
use crate::sync::{lock, Arc, Condvar, Mutex};
use crate::task::{spawn_on, JoinHandle};
use crate::wait::{fiber_wake, Waiter};
use std::cmp::Ordering as CmpOrdering;
use std::collections::{BinaryHeap, VecDeque};
use std::fmt;
use std::time::{Duration, Instant};

/// How long `run` waits for an outside wake before declaring a deadlock.
pub const DEADLOCK_AFTER: Duration = Duration::from_secs(20);

struct Timer {
    deadline: Instant,
    seq: u64,
    waiter: Waiter,
}

impl PartialEq for Timer {
    fn eq(&self, other: &Self) -> bool {
        self.deadline == other.deadline && self.seq == other.seq
    }
}
impl Eq for Timer {}
impl PartialOrd for Timer {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}
impl Ord for Timer {
    fn cmp(&self, other: &Self) -> CmpOrdering {
        // Min-heap on (deadline, seq).
        (other.deadline, other.seq).cmp(&(self.deadline, self.seq))
    }
}

struct Queue {
    runnable: VecDeque<Runnable>,
    timers: BinaryHeap<Timer>,
    seq: u64,
    elapsed: Duration,
    rng: Option<u64>,
}

struct Inner {
    queue: Mutex<Queue>,
    ready: Condvar,
    pool: FramePool,
    base: Instant,
    /// Held while fibers are resumed (`run`, `run_until_idle`) and by
    /// `shutdown`'s teardown, which must be the only resumer.
    running: Mutex<()>,
    /// `shutdown` has begun: `run` and `run_until_idle` resume nothing.
    shut_down: std::sync::atomic::AtomicBool,
}

impl Schedule for Inner {
    fn schedule(&self, fiber: Runnable) {
        lock(&self.queue).runnable.push_back(fiber);
        self.ready.notify_one();
    }

    fn wake_at(&self, deadline: Instant, waiter: Waiter) {
        let mut queue = lock(&self.queue);
        queue.seq += 1;
        let seq = queue.seq;
        queue.timers.push(Timer { deadline, seq, waiter });
    }

    fn now(&self) -> Instant {
        self.base + lock(&self.queue).elapsed
    }

    fn frames(&self) -> &FramePool {
        &self.pool
    }
}

/// The deterministic single-threaded scheduler.
#[derive(Clone)]
pub struct TestScheduler {
    inner: Arc<Inner>,
}

impl Default for TestScheduler {
    fn default() -> Self {
        Self::new()
    }
}

impl TestScheduler {
    /// FIFO order, default stacks.
    pub fn new() -> Self {
        Self::build(None, StackConfig::default())
    }

    /// Seeded random pick among runnable fibers.
    pub fn with_seed(seed: u64) -> Self {
        Self::build(Some(seed | 1), StackConfig::default())
    }

    /// FIFO order with the given stack settings.
    pub fn with_stacks(stacks: StackConfig) -> Self {
        Self::build(None, stacks)
    }

    fn build(rng: Option<u64>, stacks: StackConfig) -> Self {
        TestScheduler {
            inner: Arc::new(Inner {
                queue: Mutex::new(Queue {
                    runnable: VecDeque::new(),
                    timers: BinaryHeap::new(),
                    seq: 0,
                    elapsed: Duration::ZERO,
                    rng,
                }),
                ready: Condvar::new(),
                running: Mutex::new(()),
                shut_down: std::sync::atomic::AtomicBool::new(false),
                pool: FramePool::new(stacks),
                base: Instant::now(),
            }),
        }
    }

    /// This scheduler as the contract's trait object.
    pub fn scheduler(&self) -> Arc<dyn Schedule> {
        self.inner.clone()
    }

    /// Spawn a fiber (it runs when [`run`](Self::run) is called).
    #[track_caller]
    pub fn spawn<F, T>(&self, f: F) -> JoinHandle<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        spawn_on(&self.scheduler(), f)
    }

    /// Run `f` as a fiber, run every fiber to completion, return `f`'s value
    /// (re-raising its panic).
    #[track_caller]
    pub fn block_on<F, T>(&self, f: F) -> T
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let handle = self.spawn(f);
        self.run();
        match handle.join() {
            Ok(value) => value,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => panic!("block_on: the root fiber ended without a value: {e}"),
        }
    }

    /// Frame pool counters.
    pub fn pool_stats(&self) -> PoolStats {
        self.inner.pool.stats()
    }

    /// The virtual time elapsed since the scheduler was made.
    pub fn elapsed(&self) -> Duration {
        lock(&self.inner.queue).elapsed
    }

    /// Run fibers on this thread until none is alive.
    pub fn run(&self) {
        let _running = lock(&self.inner.running);
        while let Some(fiber) = self.next_unless_shut_down() {
            match fiber.into_running().resume(0) {
                RunOutcome::Yielded(fiber) => self.inner.schedule(fiber),
                RunOutcome::Parked | RunOutcome::Finished => {}
            }
        }
    }

    /// Shut down as a runtime does: cancel every fiber and wake the parked
    /// ones, run what becomes runnable, then unwind whatever is still
    /// alive, children before owners (`FramePool::teardown`). Returns the
    /// teardown's report.
    ///
    /// # Panics
    ///
    /// Panics if a `run` or `run_until_idle` of this scheduler is in
    /// progress (on another thread, or in a fiber it runs).
    pub fn shutdown(&self) -> crate::pool::TeardownReport {
        self.inner.pool.begin_cancel();
        self.run_until_idle();
        let _running = match self.inner.running.try_lock() {
            Ok(guard) => guard,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                panic!("TestScheduler::shutdown while a run of the same scheduler is in progress")
            }
        };
        // Relaxed: read under `running`, which this thread holds.
        self.inner.shut_down.store(true, std::sync::atomic::Ordering::Relaxed);
        let inner = self.inner.clone();
        let mut drain = move || lock(&inner.queue).runnable.drain(..).collect::<Vec<_>>();
        // SAFETY: `running` is held and `shut_down` set: no `run` or
        // `run_until_idle` of this scheduler resumes a fiber from now on,
        // and they are its only resumers.
        unsafe { self.inner.pool.teardown(&mut drain) }
    }

    /// Run fibers until none is runnable, without waiting for outside wakes
    /// or firing timers. Returns how many resumes it made.
    pub fn run_until_idle(&self) -> usize {
        let _running = lock(&self.inner.running);
        // Relaxed: written under `running`, which this thread holds.
        if self.inner.shut_down.load(std::sync::atomic::Ordering::Relaxed) {
            return 0;
        }
        let mut resumes = 0;
        let mut worker = self.clone();
        while let Some(fiber) = worker.worker_next() {
            resumes += 1;
            if let RunOutcome::Yielded(fiber) = fiber.resume(0) {
                self.inner.schedule(fiber);
            }
        }
        resumes
    }

    fn next_unless_shut_down(&self) -> Option<Runnable> {
        // Relaxed: written under `running`, which the caller holds.
        if self.inner.shut_down.load(std::sync::atomic::Ordering::Relaxed) {
            return None;
        }
        self.next()
    }

    fn next(&self) -> Option<Runnable> {
        let mut queue = lock(&self.inner.queue);
        let mut idle_since = None;
        loop {
            if let Some(fiber) = pick(&mut queue) {
                return Some(fiber);
            }
            if self.inner.pool.stats().in_use == 0 {
                return None;
            }
            if let Some(first) = queue.timers.peek() {
                // Nothing runnable: jump the virtual clock to the timer.
                let due = first.deadline.saturating_duration_since(self.inner.base);
                if due > queue.elapsed {
                    queue.elapsed = due;
                }
                let now = self.inner.base + queue.elapsed;
                let mut fired = Vec::new();
                while queue.timers.peek().is_some_and(|t| t.deadline <= now) {
                    fired.push(queue.timers.pop().expect("peeked").waiter);
                }
                drop(queue);
                for waiter in &fired {
                    fiber_wake(waiter);
                }
                queue = lock(&self.inner.queue);
                continue;
            }
            let since = *idle_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= DEADLOCK_AFTER {
                panic!(
                    "test scheduler deadlock: {} fiber(s) alive, none runnable, no timer pending, \
                     and no wake arrived for {:?}",
                    self.inner.pool.stats().in_use,
                    DEADLOCK_AFTER
                );
            }
            queue = match self.inner.ready.wait_timeout(queue, Duration::from_millis(100)) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }
}

fn pick(queue: &mut Queue) -> Option<Runnable> {
    match queue.rng.as_mut() {
        None => queue.runnable.pop_front(),
        Some(state) if !queue.runnable.is_empty() => {
            // xorshift64: deterministic for a seed.
            *state ^= *state << 13;
            *state ^= *state >> 7;
            *state ^= *state << 17;
            let index = (*state % queue.runnable.len() as u64) as usize;
            queue.runnable.swap_remove_back(index)
        }
        Some(_) => None,
    }
}

impl Worker for TestScheduler {
    /// The next runnable fiber (FIFO, or the seeded pick), already RUNNING;
    /// `None` when nothing is runnable right now (no waiting, no timers).
    fn worker_next(&mut self) -> Option<Running> {
        let next = pick(&mut lock(&self.inner.queue));
        next.map(Runnable::into_running)
    }
}

impl fmt::Debug for TestScheduler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestScheduler")
            .field("pool", &self.inner.pool)
            .finish_non_exhaustive()
    }
}
