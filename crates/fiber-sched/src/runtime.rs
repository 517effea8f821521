//! The runtime handle: building, spawning, `block_on`, `sleep`, `blocking`,
//! statistics and shutdown.
//!
//! # Shutdown
//!
//! In order (seed 003): optionally wait for live fibers (bounded by the
//! timeout), stop the workers and the monitor and join their threads, then on
//! the calling thread discard every runnable fiber and unwind every parked
//! one (destructors run exactly once; joiners get `Cancelled`), clear the
//! timers, and drop the frame pool. No worker thread and no frame outlives
//! the runtime.

use crate::config::{Config, ConfigError, Overrides};
use crate::monitor;
use crate::stats::Stats;
use crate::sync::{lock, Ordering};
use crate::worker::{current_worker_index, on_worker_of, pressure, spawn_worker, Shared};
use fiber_core::{spawn_on, try_spawn_on, JoinHandle, Schedule, WaitResult};
use std::fmt;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Configures and builds a [`Runtime`]. Explicit settings win over the
/// `FIBER_*` environment variables, which win over the defaults.
#[derive(Clone, Debug, Default)]
pub struct Builder {
    overrides: Overrides,
}

impl Builder {
    /// A builder with nothing set.
    pub fn new() -> Builder {
        Builder::default()
    }

    /// Worker threads at start (default: the number of cores).
    pub fn workers(&mut self, n: usize) -> &mut Self {
        self.overrides.workers = Some(n);
        self
    }

    /// Ceiling of the elastic pool (default: twice the cores, at least
    /// `workers`). Equal to `workers` turns growth off.
    pub fn max_workers(&mut self, n: usize) -> &mut Self {
        self.overrides.max_workers = Some(n);
        self
    }

    /// Usable bytes of each fiber stack (default 256 KiB, minimum 16 KiB).
    pub fn stack_size(&mut self, bytes: usize) -> &mut Self {
        self.overrides.stack_size = Some(bytes);
        self
    }

    /// Name prefix of the runtime's threads.
    pub fn thread_name(&mut self, name: impl Into<String>) -> &mut Self {
        self.overrides.thread_name = Some(name.into());
        self
    }

    /// How long an extra worker stays idle before it retires.
    pub fn idle_timeout(&mut self, timeout: Duration) -> &mut Self {
        self.overrides.idle_timeout = Some(timeout);
        self
    }

    /// Run `f` on every worker thread when it starts.
    pub fn on_thread_start(&mut self, f: impl Fn() + Send + Sync + 'static) -> &mut Self {
        self.overrides.on_thread_start = Some(crate::config::ThreadHook(Arc::new(f)));
        self
    }

    /// Run `f` on every worker thread just before it exits.
    pub fn on_thread_stop(&mut self, f: impl Fn() + Send + Sync + 'static) -> &mut Self {
        self.overrides.on_thread_stop = Some(crate::config::ThreadHook(Arc::new(f)));
        self
    }

    /// Cap on the threads of the blocking pool that runs
    /// [`blocking`](crate::blocking) calls (default 512; they are not
    /// workers and do not count against `max_workers`).
    pub fn max_blocking_threads(&mut self, n: usize) -> &mut Self {
        self.overrides.max_blocking_threads = Some(n);
        self
    }

    /// Cap on guard-paged stacks for this runtime (testing the unguarded
    /// regime); the process-wide `vm.max_map_count` budget always applies.
    #[doc(hidden)]
    pub fn max_guarded_stacks(&mut self, n: usize) -> &mut Self {
        self.overrides.max_guarded_stacks = Some(n);
        self
    }

    /// The configuration this builder would use.
    pub fn config(&self) -> Result<Config, ConfigError> {
        Config::resolve(&self.overrides)
    }

    /// Start the runtime. Invalid settings are an `InvalidInput` error
    /// naming the setting.
    pub fn build(&self) -> io::Result<Runtime> {
        Runtime::with_config(self.config()?)
    }
}

/// A fiber runtime: worker threads, a monitor, and the fibers they run.
pub struct Runtime {
    pub(crate) shared: Arc<Shared>,
    monitor: Option<std::thread::JoinHandle<()>>,
}

impl fmt::Debug for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runtime")
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

impl Runtime {
    /// A builder.
    pub fn builder() -> Builder {
        Builder::new()
    }

    /// A runtime with the defaults and the `FIBER_*` environment.
    pub fn new() -> io::Result<Runtime> {
        Builder::new().build()
    }

    /// A runtime with a validated configuration.
    pub fn with_config(config: Config) -> io::Result<Runtime> {
        config.validate()?;
        let shared = Arc::new(Shared::new(config));
        for index in 0..shared.config.workers {
            if !spawn_worker(&shared, index) {
                shared.shutdown.store(true, Ordering::Release);
                return Err(io::Error::other(format!("could not start worker thread {index}")));
            }
        }
        let monitor = monitor::start(&shared)?;
        Ok(Runtime {
            shared,
            monitor: Some(monitor),
        })
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.shared.config
    }

    /// This runtime as the contract's scheduler.
    pub fn scheduler(&self) -> Arc<dyn Schedule> {
        self.shared.clone()
    }

    /// Spawn a fiber from anywhere (round-robin over the workers when called
    /// from outside them).
    #[track_caller]
    pub fn spawn<F, T>(&self, f: F) -> JoinHandle<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        spawn_on(&self.scheduler(), f)
    }

    /// Spawn, returning an error instead of panicking when no stack can be
    /// mapped.
    #[track_caller]
    pub fn try_spawn<F, T>(&self, f: F) -> io::Result<JoinHandle<T>>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        try_spawn_on(&self.scheduler(), f)
    }

    /// Run `f` as the root fiber and block this thread until it returns;
    /// its panic is re-raised here with the original payload.
    #[track_caller]
    pub fn block_on<F, T>(&self, f: F) -> T
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let handle = self.spawn(f);
        self.shared.root_fiber.store(handle.id().0, Ordering::Relaxed);
        let result = handle.join();
        self.shared.root_fiber.store(0, Ordering::Relaxed);
        match result {
            Ok(value) => value,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => panic!("block_on: the root fiber ended without a value: {e}"),
        }
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Stats {
        stats_of(&self.shared)
    }

    /// Wait up to `timeout` for every fiber to finish, then shut down (see
    /// the module docs). Fibers still alive are unwound.
    pub fn shutdown_timeout(mut self, timeout: Duration) {
        self.shutdown(timeout);
    }

    fn shutdown(&mut self, timeout: Duration) {
        if on_worker_of(self.shared.id) {
            panic!(
                "a fiber runtime was dropped (or shut down) from inside one of its own fibers; \
                 shut it down from the thread that created it"
            );
        }
        let Some(monitor) = self.monitor.take() else { return };
        let deadline = Instant::now() + timeout;
        while self.shared.pool.stats().in_use > 0 && Instant::now() < deadline {
            std::thread::park_timeout(Duration::from_millis(1).min(deadline - Instant::now()));
        }
        // Release: pairs with the Acquire in `Shared::is_shutdown`.
        self.shared.shutdown.store(true, Ordering::Release);
        for slot in self.shared.slots.iter() {
            // Wake every sleeper (a wake always writes, then wakes).
            slot.futex.store(crate::idle::NOTIFIED, Ordering::Release);
            crate::sync::futex_wake_one(&slot.futex);
        }
        monitor.thread().unpark();
        let _ = monitor.join();
        loop {
            let threads: Vec<_> = lock(&self.shared.threads).drain(..).collect();
            if threads.is_empty() {
                break;
            }
            for thread in threads {
                let _ = thread.join();
            }
        }
        if self.shared.config.print_stats {
            eprintln!("{}", stats_of(&self.shared));
        }
        // Nothing runs any more: discard runnable fibers, unwind parked ones.
        for slot in self.shared.slots.iter() {
            while let Some(fiber) = slot.inbox.pop() {
                fiber.discard(&self.shared.pool);
            }
            if let Some((deque, yields)) = lock(&slot.deque).as_ref() {
                while let Some(fiber) = deque.pop().or_else(|| yields.pop()) {
                    fiber.discard(&self.shared.pool);
                }
            }
        }
        while let Some(fiber) = self.shared.global.pop() {
            fiber.discard(&self.shared.pool);
        }
        // Unwinding may run destructors that wake or spawn fibers: repeat
        // until nothing is left.
        loop {
            let mut progress = self.shared.pool.unwind_parked();
            while let Some(fiber) = self.shared.global.pop() {
                fiber.discard(&self.shared.pool);
                progress += 1;
            }
            for slot in self.shared.slots.iter() {
                while let Some(fiber) = slot.inbox.pop() {
                    fiber.discard(&self.shared.pool);
                    progress += 1;
                }
            }
            if progress == 0 {
                break;
            }
        }
        self.shared.timers.clear();
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if self.monitor.is_some() {
            self.shutdown(Duration::ZERO);
        }
    }
}

fn stats_of(shared: &Shared) -> Stats {
    let c = &shared.counters;
    let pool = shared.pool.stats();
    let mut spawns = c.external_spawns.load(Ordering::Relaxed);
    let mut parks = 0;
    let mut wakes = 0;
    let mut steals = 0;
    let mut running = 0;
    for slot in shared.slots.iter() {
        spawns += slot.spawns.load(Ordering::Relaxed);
        parks += slot.parks.load(Ordering::Relaxed);
        wakes += slot.wakes.load(Ordering::Relaxed);
        steals += slot.steals.load(Ordering::Relaxed);
        running += usize::from(slot.running.load(Ordering::Relaxed) != 0);
    }
    wakes += shared
        .external_enqueued
        .load(Ordering::Relaxed)
        .saturating_sub(c.external_spawns.load(Ordering::Relaxed));
    let runnable = pressure(shared).max(0) as usize;
    Stats {
        workers: shared.alive.load(Ordering::Relaxed),
        min_workers: shared.config.workers,
        max_workers: shared.config.max_workers,
        sleeping_workers: shared.idle.sleeping(),
        fibers_alive: pool.in_use,
        fibers_runnable: runnable,
        fibers_parked: pool.in_use.saturating_sub(runnable + running),
        spawns,
        parks,
        wakes,
        steals,
        inbox_pushes: c.inbox_pushes.load(Ordering::Relaxed),
        global_pushes: c.global_pushes.load(Ordering::Relaxed),
        global_overflow_pushes: shared.global.overflowed() as u64,
        worker_wakeups: c.wakeups.load(Ordering::Relaxed),
        worker_sleeps: c.sleeps.load(Ordering::Relaxed),
        scale_ups: c.scale_ups.load(Ordering::Relaxed),
        scale_downs: c.scale_downs.load(Ordering::Relaxed),
        scale_events: lock(&c.events).clone(),
        gate_no_work: c.gate_no_work.load(Ordering::Relaxed),
        gate_nonpositive: c.gate_nonpositive.load(Ordering::Relaxed),
        gate_idle_capacity: c.gate_idle_capacity.load(Ordering::Relaxed),
        gate_not_stuck: c.gate_not_stuck.load(Ordering::Relaxed),
        gate_at_max: c.gate_at_max.load(Ordering::Relaxed),
        pressure_positive_samples: c.positive_samples.load(Ordering::Relaxed),
        pressure_negative_samples: c.negative_samples.load(Ordering::Relaxed),
        pressure_negative_streak_max: c.neg_streak_max.load(Ordering::Relaxed),
        timers_pending: shared.timers.len(),
        stall_reports: c.stall_reports.load(Ordering::Relaxed),
        deadlock_reports: c.deadlock_reports.load(Ordering::Relaxed),
        frames_allocated: pool.allocated,
    }
}

/// Park the running fiber for `duration` (at least; timers fire late, never
/// early). Returns `Err(WaitResult::Cancelled)` if the fiber's task was
/// cancelled first. On a plain thread this is `std::thread::sleep`.
pub fn sleep(duration: Duration) -> Result<(), WaitResult> {
    sleep_until(Instant::now() + duration)
}

/// Park the running fiber until `deadline` (see [`sleep`]).
pub fn sleep_until(deadline: Instant) -> Result<(), WaitResult> {
    if !fiber_core::in_fiber() {
        let now = Instant::now();
        if deadline > now {
            std::thread::sleep(deadline - now);
        }
        return Ok(());
    }
    match fiber_core::wait_until(Some(deadline), fiber_core::Interrupt::Cancellable) {
        WaitResult::TimedOut => Ok(()),
        other => Err(other),
    }
}

/// Run a blocking call (a blocking read, file I/O, `std::thread::sleep`, a
/// lock held by a thread, a long computation) from a fiber: `f` runs on the
/// runtime's blocking pool, threads that are not workers, while the calling
/// fiber parks, so other fibers keep every worker. `f` may borrow from the
/// caller (the call returns only after `f` ran and was dropped); a panic in
/// `f` is re-raised here. The wait is not cancellable: a running `f` cannot
/// be abandoned. Outside a runtime's fiber it just calls `f`.
///
/// Sockets do not need this (`fiber::net` parks on readiness); files do:
/// Linux reports regular files as always ready, so a read from a slow disk
/// would hold a worker in the kernel.
pub fn blocking<F, R>(f: F) -> R
where
    F: FnOnce() -> R + Send,
    R: Send,
{
    let Some(sched) = fiber_core::current_scheduler() else {
        return f();
    };
    let Some(shared) = as_shared(&sched) else { return f() };
    if current_worker_index(shared.id).is_none() {
        return f();
    }
    crate::blocking::run(shared, f)
}

/// Downcast the contract's scheduler to this crate's runtime, if it is one.
fn as_shared(sched: &Arc<dyn Schedule>) -> Option<&Arc<Shared>> {
    // The runtime registers itself as `Arc<Shared>`; compare data pointers
    // with the worker context instead of `Any` (the trait is not `Any`).
    let ctx = crate::worker::context::get();
    if ctx.is_null() {
        return None;
    }
    // SAFETY: a non-null context is this thread's live worker context.
    let shared = unsafe { (*ctx).shared() };
    let same = std::ptr::addr_eq(Arc::as_ptr(shared), Arc::as_ptr(sched));
    same.then_some(shared)
}

/// The counters of the runtime the calling fiber runs on, if any.
pub fn current_stats() -> Option<Stats> {
    let ctx = crate::worker::context::get();
    if ctx.is_null() {
        return None;
    }
    // SAFETY: a non-null context is this thread's live worker context.
    let shared = unsafe { (*ctx).shared() };
    Some(stats_of(shared))
}
