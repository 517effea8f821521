//! The runtime handle: building, spawning, `block_on`, `sleep`, `blocking`,
//! statistics and shutdown.
//!
//! # Shutdown
//!
//! In order (seed 003): optionally wait for live fibers (bounded by the
//! timeout), stop the workers and the monitor and join their threads, then on
//! the calling thread discard every runnable fiber and unwind every parked
//! one (destructors run exactly once; joiners get `Cancelled`), clear the
//! timers, and drop the frame pool. No frame outlives the runtime, and no
//! worker thread either, except one stuck in a fiber that never yields: it
//! is waited for up to 2 s (`WORKER_STOP_BOUND`), reported, and left
//! running; that fiber is unwound at its next yield point.

use crate::config::{Config, ConfigError, Overrides};
use crate::handle::Handle;
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

    /// Worker threads at start (default: the number of cores, lowered to
    /// an explicit [`max_workers`](Self::max_workers) below that). Above a
    /// `FIBER_MAX_WORKERS` from the environment, it raises that ceiling
    /// (builder values win).
    pub fn workers(&mut self, n: usize) -> &mut Self {
        self.overrides.workers = Some(n);
        self
    }

    /// Ceiling of the elastic pool (default: twice the cores, at least
    /// `workers`). Equal to `workers` turns growth off. Set alone, below
    /// the core count, it lowers the default worker count too:
    /// `max_workers(1)` runs one worker on any machine, also beside a
    /// larger `FIBER_WORKERS` (builder values win); below the builder's
    /// own [`workers`](Self::workers) it is an error.
    pub fn max_workers(&mut self, n: usize) -> &mut Self {
        self.overrides.max_workers = Some(n);
        self
    }

    /// Usable bytes of each fiber stack (default 256 KiB, 1 MiB in a build
    /// with debug assertions; minimum 16 KiB).
    pub fn stack_size(&mut self, bytes: usize) -> &mut Self {
        self.overrides.stack_size = Some(bytes);
        self
    }

    /// Name prefix of the runtime's threads.
    pub fn thread_name(&mut self, name: impl Into<String>) -> &mut Self {
        self.overrides.thread_name = Some(name.into());
        self
    }

    /// How long an extra worker stays idle before it retires (default 5 s).
    ///
    /// The same interval is the retire interval for a worker that makes no
    /// progress: one that has run the same fiber without a yield point for
    /// this long (a fiber blocking its thread or computing) is drained (its
    /// queued fibers move to the other workers) and, below `max_workers`,
    /// replaced by a new worker; it exits once that fiber gives its thread
    /// back. A very short value therefore starts many replacement threads
    /// for fibers that compute for longer than it.
    pub fn idle_timeout(&mut self, timeout: Duration) -> &mut Self {
        self.overrides.idle_timeout = Some(timeout);
        self
    }

    /// Grace time at shutdown (default 5 s): after the runtime cancels
    /// every fiber, how long they get to return on the workers before what
    /// is left is unwound on the shutting-down thread. `Duration::MAX`
    /// waits forever.
    pub fn shutdown_timeout(&mut self, grace: Duration) -> &mut Self {
        self.overrides.shutdown_timeout = Some(grace);
        self
    }

    /// Pin every fiber of the runtime to the worker it first runs on: after
    /// its first run a fiber resumes only on that worker's thread, so code
    /// that keeps thread-local state (or any `!Send` value) across a park
    /// stays sound. It costs load balance: a pinned fiber is never stolen
    /// once it has run, and a worker that is home to pinned fibers never
    /// retires. `fiber::spawn_pinned` pins one fiber.
    pub fn pinned(&mut self, pinned: bool) -> &mut Self {
        self.overrides.pinned = Some(pinned);
        self
    }

    /// Capture a backtrace at every park, so that the fiber dump shows where
    /// each parked fiber is in full (as `FIBER_BACKTRACE=1`). A debugging
    /// switch: each park then costs a stack walk and an allocation. It is
    /// process-wide: once a runtime turns it on, it stays on.
    pub fn park_backtraces(&mut self, on: bool) -> &mut Self {
        self.overrides.park_backtraces = Some(on);
        self
    }

    /// Give every fiber a `tracing` span (INFO, target `fiber`, fields `id`
    /// and `name`), entered while it runs, so that events from its code
    /// carry them (as `FIBER_TRACE_SPANS=1`). Off by default; process-wide
    /// once a runtime turns it on.
    pub fn fiber_spans(&mut self, on: bool) -> &mut Self {
        self.overrides.fiber_spans = Some(on);
        self
    }

    /// Whether workers take ready socket events themselves (fiber-core's
    /// `IoPoll` hook, a non-blocking poll every 61 fibers and before they
    /// sleep) or leave them all to the I/O layer's poller thread (as
    /// `FIBER_IO_HARVEST=0`). On by default.
    pub fn io_harvest(&mut self, on: bool) -> &mut Self {
        self.overrides.io_harvest = Some(on);
        self
    }

    /// Whether one idle worker at a time waits for socket readiness in the
    /// I/O driver itself (fiber-core's `IoWaiter`, as tokio's and Go's idle
    /// workers do) instead of sleeping while fiber-net's poller thread
    /// waits and then wakes it (as `FIBER_IO_PARK=1`). Needs `io_harvest`.
    pub fn io_park(&mut self, on: bool) -> &mut Self {
        self.overrides.io_park = Some(on);
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

    /// How long a thread of the blocking pool waits idle for another
    /// [`blocking`](crate::blocking) call before it exits (default 10 s, as
    /// tokio's `thread_keep_alive`; `Duration::ZERO`: right after its call;
    /// `Duration::MAX`: not until the runtime shuts down). Overrides
    /// `FIBER_BLOCKING_KEEP_ALIVE_MS`.
    ///
    /// ```
    /// use std::time::Duration;
    /// let rt = fiber_sched::Runtime::builder()
    ///     .thread_keep_alive(Duration::from_millis(100))
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(rt.block_on(|| fiber_sched::blocking(|| 6 * 7)), 42);
    /// ```
    pub fn thread_keep_alive(&mut self, keep_alive: Duration) -> &mut Self {
        self.overrides.thread_keep_alive = Some(keep_alive);
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

// Unwind safety as tokio declares it for its runtime and handle: their
// shared state lives behind atomics and locks that ignore poisoning, so a
// panic caught around a call on them leaves nothing half-changed that a
// later call could observe.
impl std::panic::UnwindSafe for Runtime {}
impl std::panic::RefUnwindSafe for Runtime {}

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

    /// A runtime with a validated configuration, taken as it is: no
    /// `FIBER_*` variable is read and no bound is moved (a `workers`
    /// above `max_workers` is an error). Start from
    /// [`Config::resolve`](crate::Config::resolve), or use
    /// [`Runtime::builder`], for the environment and the builder's rules.
    pub fn with_config(config: Config) -> io::Result<Runtime> {
        config.validate()?;
        // Installed now (not when the monitor starts), so that a signal
        // sent once `build` returns is counted; the monitor owns it, and
        // its exit (or a failed start) puts the previous action back.
        let dump_requests = crate::dumpsig::DumpRequests::register(config.dump_signal);
        if config.park_backtraces {
            fiber_core::set_park_backtraces(true);
        }
        if config.fiber_spans {
            fiber_core::set_fiber_spans(true);
        }
        let shared = Arc::new(Shared::new(config));
        crate::handle::register_live(&shared);
        for index in 0..shared.config.workers {
            if !spawn_worker(&shared, index) {
                stop_started_threads(&shared);
                return Err(io::Error::other(format!("could not start worker thread {index}")));
            }
        }
        let monitor = match monitor::start(&shared, dump_requests) {
            Ok(monitor) => monitor,
            Err(e) => {
                // No `Runtime` exists to shut the workers down: they stop
                // here, so that a failed build leaves no thread behind.
                stop_started_threads(&shared);
                return Err(io::Error::new(
                    e.kind(),
                    format!("could not start the monitor thread: {e}"),
                ));
            }
        };
        let runtime = Runtime {
            shared,
            monitor: Some(monitor),
        };
        // Wait for the first workers to be running, so that a failing
        // `on_thread_start` hook is an error here, not a dead slot later.
        let started = Instant::now();
        loop {
            if let Some(failure) = lock(&runtime.shared.start_failure).take() {
                return Err(io::Error::other(failure));
            }
            let starting = runtime.shared.slots[..runtime.shared.config.workers]
                .iter()
                .any(|slot| slot.state.load(Ordering::Acquire) == crate::worker::STARTING);
            if !starting || started.elapsed() > Duration::from_secs(10) {
                break;
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        Ok(runtime)
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

    /// Spawn, returning an error instead of panicking when the runtime is
    /// shut down or a stack taken at the spawn is refused (see
    /// [`fiber_core::try_spawn_on`]).
    #[track_caller]
    pub fn try_spawn<F, T>(&self, f: F) -> io::Result<JoinHandle<T>>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        try_spawn_on(&self.scheduler(), f)
    }

    /// Run `f` as the root fiber and block this thread until it has
    /// finished; its panic is re-raised here with the original payload.
    /// `f` may borrow the caller's stack (like `std::thread::scope`): this
    /// returns only after the root fiber is done with `f`. When `f`
    /// returns, its value is returned, also if the root fiber's job was
    /// cancelled meanwhile (cancellation is cooperative: `f` saw it and
    /// chose what to return).
    ///
    /// # Panics
    ///
    /// Panics when called from a fiber (it would block a worker thread
    /// while a second root runs: spawn a fiber and join it instead, or use
    /// a [`Handle`] from a plain thread), or on one of this runtime's own
    /// worker threads outside a fiber (an `on_thread_start` or
    /// `on_thread_stop` hook, a tracing callback: the root could wait for
    /// that very thread), or with `f`'s panic.
    #[track_caller]
    pub fn block_on<F, T>(&self, f: F) -> T
    where
        F: FnOnce() -> T + Send,
        T: Send,
    {
        crate::handle::block_on_root(&self.shared, "Runtime::block_on", f)
    }

    /// A handle to this runtime (`Clone + Send + Sync`): spawn and
    /// `block_on` from other threads.
    pub fn handle(&self) -> Handle {
        Handle {
            shared: self.shared.clone(),
        }
    }

    /// Every live fiber of this runtime: its state, what it waits on, for
    /// how long, and the call that parked it (a racy snapshot; `Display`
    /// prints it like Go's goroutine dump).
    pub fn dump(&self) -> fiber_core::Dump {
        fiber_core::advance_coarse_clock();
        self.shared.pool.dump()
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Stats {
        stats_of(&self.shared)
    }

    /// Shut down with `grace` as the grace time (instead of the configured
    /// one): cancel every fiber, wait up to `grace` for them to return,
    /// then unwind what is left (children before the scopes they borrow
    /// from). The workers are then waited for up to 2 s more; one stuck in
    /// a fiber that never yields is reported and left running, and that
    /// fiber is unwound at its next yield point. `Duration::MAX` waits
    /// forever.
    ///
    /// # Panics
    ///
    /// Panics when called from one of this runtime's own fibers, or from
    /// one of its [`fiber::blocking`](crate::blocking) calls (a runtime
    /// cannot wait for itself); the shutdown then goes on, on a thread of
    /// its own, so no thread leaks. On another of its own threads (a
    /// worker outside its fibers: its `on_thread_stop` hook, a
    /// thread-local destructor as the thread exits, a tracing callback the
    /// worker runs between two fibers; its monitor thread, in a tracing
    /// callback for a growth, stall or deadlock event; a blocking-pool
    /// thread between calls, in a thread-local destructor as it retires)
    /// it does not panic: it returns at once, and the shutdown goes on, on
    /// a thread of its own, which joins this one once it has exited. The
    /// same holds for dropping the runtime there.
    pub fn shutdown_timeout(mut self, grace: Duration) {
        self.shutdown_or_hand_off(grace);
    }

    fn shutdown_or_hand_off(&mut self, grace: Duration) {
        if self.monitor.is_none() {
            return;
        }
        // A blocking-pool thread of this runtime in the middle of a call
        // is the same case: the fiber that waits for the call is one of
        // the fibers the shutdown would wait for.
        // On a worker thread outside its fibers (a tracing callback the
        // scheduling loop runs around a resume) no fiber waits on this
        // thread: that is the hand-off below, without a panic
        // (`reviews/review61.rs`).
        let in_own_fiber = on_worker_of(self.shared.id) && fiber_core::in_fiber();
        if in_own_fiber || crate::blocking::in_call_of(self.shared.id) {
            let handed_off = match self.shutdown_elsewhere(grace) {
                Ok(_) => true,
                Err((rest, _)) => {
                    // No thread to be had: leaked, never shut down on a
                    // thread it would wait for.
                    std::mem::forget(rest);
                    false
                }
            };
            if !std::thread::panicking() {
                panic!(
                    "a fiber runtime was dropped (or shut down) from inside one of its own fibers (or one of \
                     its fiber::blocking calls); a runtime cannot wait for itself: shut it down from the \
                     thread that created it{}",
                    if handed_off {
                        " (its shutdown goes on, on a thread of its own)"
                    } else {
                        ""
                    }
                );
            }
            return;
        }
        // One of its worker threads outside its fibers (its
        // `on_thread_start` or `on_thread_stop` hook, a thread-local
        // destructor as it exits, a tracing callback between two fibers),
        // its monitor thread (a tracing layer called for a growth, stall
        // or deadlock event: `reviews/review63.rs`) or one of its
        // blocking-pool threads between calls (a thread-local destructor
        // as it retires): no fiber waits on this thread, but the shutdown
        // joins it (or waits for it to leave the pool). The shutdown runs
        // on a thread of its own, which joins this one once it has exited;
        // this drop returns at once, without a panic (one in a
        // thread-local destructor would abort the process).
        if crate::worker::thread_of(self.shared.id)
            || crate::monitor::thread_of(self.shared.id)
            || crate::blocking::on_pool_thread_of(self.shared.id)
        {
            if let Err((rest, err)) = self.shutdown_elsewhere(grace) {
                // No thread to be had: the runtime stays up, leaked,
                // rather than waiting for this thread on this thread.
                eprintln!("fiber: a runtime dropped on one of its own threads could not start its shutdown ({err})");
                std::mem::forget(rest);
            }
            return;
        }
        // A thread that is unwinding a panic (a runtime owned by a failing
        // thread, or one dropped by a destructor during another runtime's
        // teardown) must not run the teardown itself: std counts "this
        // thread is panicking" per OS thread, so every fiber resumed on it
        // would look already unwinding (no shutdown unwind could start, and
        // each would be abandoned, its destructors never run). The protocol
        // runs on a thread of its own, and this one waits for it.
        if std::thread::panicking() {
            match self.shutdown_elsewhere(grace) {
                Ok(thread) => {
                    let _ = thread.join();
                }
                // No thread to be had: shut down here, as before.
                Err((mut rest, _)) => rest.shutdown(grace),
            }
            return;
        }
        self.shutdown(grace);
    }

    /// Run the shutdown protocol on a thread of its own (this value keeps
    /// nothing to shut down); or, if no thread can be started, give back
    /// the runtime that was to be shut down there.
    fn shutdown_elsewhere(&mut self, grace: Duration) -> Result<std::thread::JoinHandle<()>, (Runtime, io::Error)> {
        let rest = Runtime {
            shared: self.shared.clone(),
            monitor: self.monitor.take(),
        };
        // Sent once the thread exists: a failed spawn drops its closure,
        // and a runtime dropped there would start this all over again.
        let (rest_tx, rest_rx) = std::sync::mpsc::channel::<Runtime>();
        let spawned = std::thread::Builder::new()
            .name(format!("{}-shutdown", self.shared.config.thread_name))
            .spawn(move || {
                if let Ok(mut rest) = rest_rx.recv() {
                    rest.shutdown(grace);
                }
            });
        match spawned {
            Ok(thread) => {
                let _ = rest_tx.send(rest);
                Ok(thread)
            }
            Err(err) => Err((rest, err)),
        }
    }

    /// The shutdown protocol (module docs). Runs on a thread that is not a
    /// worker of this runtime.
    fn shutdown(&mut self, grace: Duration) {
        let Some(monitor) = self.monitor.take() else { return };
        let shared = self.shared.clone();
        // 1 + 2: refuse spawns from outside, cancel every fiber, wake the
        // parked ones at their cancellation points.
        shared.pool.begin_cancel();
        let deadline = Instant::now().checked_add(grace);
        let mut all_parked_since: Option<Instant> = None;
        while shared.pool.stats().in_use > 0 && deadline.is_none_or(|d| Instant::now() < d) {
            // Fibers parked on waits that cancellation does not end (a
            // scope waiting for its children, a lock) make no progress on
            // their own: once every live fiber is parked for a while, go on.
            // Not while a `blocking` call is in flight: its fiber resumes
            // when the call returns, and what waits for it (a lock it
            // holds, a join) with it, so the grace time is theirs too.
            if shared.pool.all_parked() && crate::blocking::in_flight(shared.id) == 0 {
                let since = *all_parked_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= ALL_PARKED_GRACE {
                    break;
                }
            } else {
                all_parked_since = None;
            }
            // A sleep, not `park_timeout`: this is the user's thread, and
            // its park token is the user's.
            std::thread::sleep(Duration::from_millis(1));
        }
        // The worker numbers of the report are those of the running pool,
        // taken before the workers stop (after, every worker has exited).
        let running = shared.config.print_stats.then(|| stats_of(&shared));
        // 3: stop the workers and the monitor.
        // First, each worker's channel for its pinned fibers: a worker that
        // stops with one alive stays up to resume it for the teardown of
        // step 5 (`serve_homed_fibers`).
        let homes: Vec<std::sync::mpsc::Sender<crate::worker::HomeRequest>> = {
            let mut requests = lock(&shared.home_requests);
            requests.clear();
            (0..shared.slots.len())
                .map(|_| {
                    let (tx, rx) = std::sync::mpsc::channel();
                    requests.push(Some(rx));
                    tx
                })
                .collect()
        };
        // The flag, a fence, then NOTIFIED in every worker's word (the
        // sleep handshake's shutdown half); then wake every sleeper.
        crate::idle::Idle::publish_shutdown(&shared.shutdown, shared.slots.iter().map(|slot| &slot.futex));
        for (i, slot) in shared.slots.iter().enumerate() {
            crate::sync::futex_wake_one(&slot.futex);
            shared.wake_io(i);
        }
        monitor.thread().unpark();
        let _ = monitor.join();
        // 4: join the workers with a bound; a worker stuck in a fiber that
        // never yields is reported and left running (with everything it may
        // touch), never waited for forever.
        // A worker that stays up for its pinned fibers counts as stopped.
        let stop_by = Instant::now() + WORKER_STOP_BOUND;
        let mut stuck = Vec::new();
        let mut serving = Vec::new();
        let serving_slot = |thread: &std::thread::JoinHandle<()>| {
            let id = thread.thread().id();
            lock(&shared.serving)
                .iter()
                .find(|(_, serving)| *serving == id)
                .map(|&(slot, _)| slot)
        };
        loop {
            let threads: Vec<_> = lock(&shared.threads).drain(..).collect();
            if threads.is_empty() {
                break;
            }
            for thread in threads {
                while !thread.is_finished() && serving_slot(&thread).is_none() && Instant::now() < stop_by {
                    std::thread::sleep(Duration::from_millis(1));
                }
                if thread.is_finished() {
                    let _ = thread.join();
                } else if let Some(slot) = serving_slot(&thread) {
                    serving.push((slot, thread));
                } else {
                    stuck.push(thread);
                }
            }
        }
        // The channels nobody took (a stuck worker, one that stopped with
        // no pinned fiber alive) close: a fiber sent home there is given
        // up at once, never waited for.
        lock(&shared.home_requests).clear();
        if let Some(running) = running {
            eprintln!("{}", shutdown_report(running, stats_of(&shared)));
        }
        if !stuck.is_empty() {
            let running: Vec<String> = shared
                .slots
                .iter()
                .enumerate()
                .filter(|(_, slot)| slot.running.load(Ordering::Relaxed) != 0)
                .map(|(i, slot)| format!("worker {i} runs fiber {}", slot.running.load(Ordering::Relaxed)))
                .collect();
            let why = if running.is_empty() {
                // A loaded machine (or a thousand workers on two cores)
                // had not scheduled them yet: no fiber is to blame.
                "none of them runs a fiber (they were not scheduled in time)".to_string()
            } else {
                format!("a fiber runs without a yield point ({})", running.join(", "))
            };
            eprintln!(
                "fiber: shutdown: {} worker thread(s) did not stop within {:?}: {why}; the other fibers are \
                 unwound now, the fiber(s) still running at their next yield point",
                stuck.len(),
                WORKER_STOP_BOUND,
            );
            shared
                .counters
                .leaked_threads
                .fetch_add(stuck.len() as u64, Ordering::Relaxed);
        }
        // 5: unwind what is left, children first. A fiber that a stuck
        // worker still runs is not waited for; what waits on it (a scope
        // whose child it is) stays parked for the last round below.
        let mut drain = || drain_queues(&shared);
        let mut homes = Homes {
            senders: homes.into_iter().map(Some).collect(),
            serving,
        };
        // SAFETY: every worker thread has been joined, or (stuck) is still
        // in the one fiber it ran when shutdown began: its loop checks for
        // shutdown before it takes any other fiber (`run_loop`), so it
        // resumes no other, or (serving) has left its loop and resumes only
        // the fiber `Homes::resume` hands it, while this thread waits for
        // it (`serve_homed_fibers`); the monitor has been joined.
        let report = unsafe {
            shared
                .pool
                .teardown_with_homes(&mut drain, &mut |fiber| homes.resume(fiber), !stuck.is_empty())
        };
        report_abandoned(&report);
        // 6: the blocking pool's threads exit (an abandoned call's thread
        // once its call returns) instead of waiting out their keep-alive.
        crate::blocking::close(shared.id);
        if !stuck.is_empty() || report.abandoned_for_later() > 0 {
            // The serving workers that a fiber given up for later is still
            // bound to stay up for the reaper (a pinned fiber given up in a
            // blocking call resumes at home once it returns); the others
            // exit now.
            homes.close_unneeded(&shared.pool);
            reap_later(shared, stuck, homes, &report);
            return;
        }
        homes.close();
        shared.timers.clear();
        // No fiber of this runtime starts again: its idle stacks go now,
        // not when the last `Handle` does.
        shared.pool.release_idle_stacks();
        if report.must_leak() {
            std::mem::forget(shared);
        }
    }
}

/// What teardown could not finish yet, finished by a reaper thread once it
/// can be. The stuck workers' fibers end (unwinding) at their next yield
/// point, on those workers, which then leave their loop: the reaper joins
/// them and unwinds what they left (fibers they woke, the scopes that
/// waited on them). Fibers given up on inside a blocking call resume when
/// the call returns (its wake queues them, before the in-flight count
/// drops): the reaper waits for the runtime's calls, takes those fibers
/// back and unwinds them, so what they own (sockets, files) is released.
/// Fibers given up on while they waited for a channel hand-off another
/// party holds are finished the same way once it ends: a holder of this
/// runtime ends it as it unwinds in the same teardown; one elsewhere (a
/// `select!` of another runtime or of a plain thread) when it completes or
/// gives the hand-off back, which the reaper waits for
/// (`reviews/review26.rs`). It keeps the runtime's memory alive
/// meanwhile, and frees it unless a fiber was given up on for good.
fn reap_later(
    shared: Arc<Shared>,
    stuck: Vec<std::thread::JoinHandle<()>>,
    mut homes: Homes,
    first: &fiber_core::TeardownReport,
) {
    let lost_for_good = first.abandoned > first.abandoned_for_later();
    let reaper_shared = shared.clone();
    let reaper = std::thread::Builder::new()
        .name(format!("{}-reaper", shared.config.thread_name))
        .spawn(move || {
            for thread in stuck {
                let _ = thread.join();
            }
            let shared = reaper_shared;
            // A pass that gives a fiber up for good means the runtime's
            // memory stays (later passes report only what they give up).
            let mut lost_later = false;
            let report = loop {
                wait_for(|| crate::blocking::in_flight(shared.id) == 0);
                // SAFETY: every worker thread of the runtime has now been
                // joined (the others before this thread started), except
                // those serving their pinned fibers, which resume only what
                // `Homes::resume` hands them while this thread waits; and
                // no blocking call of this runtime is in flight.
                let report = unsafe {
                    shared.pool.revive_abandoned_in_blocking();
                    shared.pool.teardown_with_homes(
                        &mut || drain_queues(&shared),
                        &mut |fiber| homes.resume(fiber),
                        false,
                    )
                };
                homes.close_unneeded(&shared.pool);
                let later = report.abandoned_for_later();
                lost_later |= report.abandoned > later;
                // Fibers given up beside those (a scope owner whose
                // children were in their calls) are revived one per pass
                // once no call or hand-off is waited for.
                if report.abandoned_in_blocking == 0
                    && report.abandoned_in_handoff == 0
                    && shared.pool.abandoned_awaiting_handoff() == 0
                    && shared.pool.abandoned_dependents() > 0
                {
                    continue;
                }
                // Done; or some are lost for good anyway; or what is left
                // waits for blocking calls only, and none is in flight
                // (one that began in an unwind's destructor is waited for),
                // nor has one just returned to a fiber this round gave up
                // on: that fiber is kept runnable, and nothing else would
                // signal it, so it runs in another round.
                let calls = crate::blocking::in_flight(shared.id);
                let kept = shared.pool.holds_given_up_woken();
                if later == 0 || report.abandoned > later || (report.abandoned_in_handoff == 0 && calls == 0 && !kept) {
                    break report;
                }
                if kept {
                    continue;
                }
                // Fibers wait for hand-offs held outside this runtime:
                // go round again once one has ended (or a call began).
                let waiting = report.abandoned_in_handoff;
                wait_for(|| {
                    shared.pool.abandoned_awaiting_handoff() < waiting || crate::blocking::in_flight(shared.id) > 0
                });
            };
            report_abandoned(&report);
            homes.close();
            shared.timers.clear();
            shared.pool.release_idle_stacks();
            if lost_for_good || lost_later || report.must_leak() {
                std::mem::forget(shared);
            }
        });
    if reaper.is_err() {
        // No thread for the reaper: what it would have finished stays as
        // it is, for good.
        std::mem::forget(shared);
    }
}

/// Sleep (backing off to 100 ms) until `done` holds: the reaper's wait for
/// what only other threads can end.
fn wait_for(done: impl Fn() -> bool) {
    let mut pause = Duration::from_millis(1);
    while !done() {
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// Every runnable fiber the scheduler's queues still hold (shutdown step 5).
fn drain_queues(shared: &Shared) -> Vec<fiber_core::Runnable> {
    let mut out = std::mem::take(&mut *lock(&shared.orphans));
    while let Some(fiber) = shared.global.pop() {
        out.push(fiber);
    }
    for slot in shared.slots.iter() {
        while let Some(fiber) = slot.inbox.pop() {
            out.push(fiber);
        }
        if let Some((deque, yields)) = lock(&slot.deque).as_ref() {
            while let Some(fiber) = deque.pop().or_else(|| yields.pop()) {
                out.push(fiber);
            }
        }
    }
    out
}

/// Tell the user which fibers teardown gave up on (their stacks leak).
fn report_abandoned(report: &fiber_core::TeardownReport) {
    if !report.must_leak() {
        return;
    }
    let fibers: Vec<String> = report
        .abandoned_fibers
        .iter()
        .map(|(id, at)| format!("{id} (spawned at {at})"))
        .collect();
    let blocking = "waiting for a fiber::blocking call that has not returned, whose closure may borrow the \
                    fiber's stack, for a channel hand-off another select holds, or for such a fiber (a scope \
                    for its child): unwound once it ends";
    let lost = "parked on a wait nothing completes, pinned to a worker that has stopped, or catching the shutdown \
                unwind: their stacks and the runtime's memory are leaked";
    let why = match (report.abandoned_for_later(), report.abandoned) {
        (0, _) => lost.to_string(),
        (b, all) if b == all => blocking.to_string(),
        (b, all) => format!("{b} {blocking}; {} {lost}", all - b),
    };
    eprintln!(
        "fiber: shutdown: {} fiber(s) could not be unwound now ({why}): {}",
        report.abandoned,
        fibers.join(", ")
    );
}

/// The workers that stayed up at shutdown to resume the fibers bound to
/// them (`serve_homed_fibers`), and the channel to each (one per slot; a
/// closed one, or none, gives the fiber back).
struct Homes {
    senders: Vec<Option<std::sync::mpsc::Sender<crate::worker::HomeRequest>>>,
    serving: Vec<(usize, std::thread::JoinHandle<()>)>,
}

impl Homes {
    /// Resume `fiber` on its home worker and wait for the outcome, or give
    /// it back if that worker does not serve (gone, stuck, or it had no
    /// fiber bound to it when it stopped).
    fn resume(&self, fiber: fiber_core::Runnable) -> Result<fiber_core::RunOutcome, fiber_core::Runnable> {
        let Some(home) = fiber.home().and_then(|home| self.senders.get(home)?.as_ref()) else {
            return Err(fiber);
        };
        let (reply_tx, reply_rx) = std::sync::mpsc::sync_channel(1);
        match home.send((fiber, reply_tx)) {
            Ok(()) => Ok(reply_rx.recv().unwrap_or_else(|_| {
                // Its worker died in the resume (a bug in the runtime,
                // reported by that thread's panic): nothing to resume.
                eprintln!("fiber: shutdown: a worker failed while unwinding one of its pinned fibers");
                fiber_core::RunOutcome::Parked
            })),
            Err(std::sync::mpsc::SendError((fiber, _))) => Err(fiber),
        }
    }

    /// Close the channels: the serving workers exit. Each is waited for
    /// with the bound of shutdown step 4 (its `on_thread_stop` hook runs
    /// now); one still running after it is left to finish on its own.
    fn close(self) {
        drop(self.senders);
        join_bounded(self.serving.into_iter().map(|(_, thread)| thread));
    }

    /// Close the channels of the serving workers that no fiber still to
    /// be unwound is bound to (`FramePool::any_homed_at`): they exit now,
    /// not when the reaper ends (which waits for every blocking call).
    fn close_unneeded(&mut self, pool: &fiber_core::FramePool) {
        let (keep, done): (Vec<_>, Vec<_>) = std::mem::take(&mut self.serving)
            .into_iter()
            .partition(|(slot, _)| pool.any_homed_at(*slot));
        for (slot, _) in &done {
            self.senders[*slot] = None;
        }
        self.serving = keep;
        join_bounded(done.into_iter().map(|(_, thread)| thread));
    }
}

/// Join each of `threads`, waiting for all of them together at most the
/// bound of shutdown step 4; one still running after it is left to finish
/// on its own.
fn join_bounded(threads: impl Iterator<Item = std::thread::JoinHandle<()>>) {
    let stop_by = Instant::now() + WORKER_STOP_BOUND;
    for thread in threads {
        while !thread.is_finished() && Instant::now() < stop_by {
            std::thread::sleep(Duration::from_millis(1));
        }
        if thread.is_finished() {
            let _ = thread.join();
        }
    }
}

/// How long every live fiber must have been parked before shutdown stops
/// waiting for them to return on their own.
const ALL_PARKED_GRACE: Duration = Duration::from_millis(50);

/// How long shutdown waits for each worker thread to stop.
const WORKER_STOP_BOUND: Duration = Duration::from_secs(2);

/// A build that failed after some workers started: stop them and join
/// their threads (no fiber has run yet, so there is nothing to unwind).
fn stop_started_threads(shared: &Shared) {
    // As in `shutdown`, step 3.
    crate::idle::Idle::publish_shutdown(&shared.shutdown, shared.slots.iter().map(|slot| &slot.futex));
    for (i, slot) in shared.slots.iter().enumerate() {
        crate::sync::futex_wake_one(&slot.futex);
        shared.wake_io(i);
    }
    let threads: Vec<_> = lock(&shared.threads).drain(..).collect();
    for thread in threads {
        let _ = thread.join();
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        let grace = self.shared.config.shutdown_timeout;
        self.shutdown_or_hand_off(grace);
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
        gate_cooldown: c.gate_cooldown.load(Ordering::Relaxed),
        gate_passes: c.gate_passes.load(Ordering::Relaxed),
        promoted_workers: c.scale_ups.load(Ordering::Relaxed),
        current_pressure: c.current_pressure.load(Ordering::Relaxed),
        pressure_positive_samples: c.positive_samples.load(Ordering::Relaxed),
        pressure_negative_samples: c.negative_samples.load(Ordering::Relaxed),
        pressure_negative_streak_max: c.neg_streak_max.load(Ordering::Relaxed),
        timers_pending: shared.timers.len(),
        stall_reports: c.stall_reports.load(Ordering::Relaxed),
        deadlock_reports: c.deadlock_reports.load(Ordering::Relaxed),
        workers_drained_stuck: c.drained_stuck.load(Ordering::Relaxed),
        frames_allocated: pool.allocated,
    }
}

/// Park the running fiber for `duration` (at least; timers fire late, never
/// early). Returns `Err(WaitResult::Cancelled)` if the fiber's task was
/// cancelled first. On a plain thread this is `std::thread::sleep`.
#[track_caller]
pub fn sleep(duration: Duration) -> Result<(), WaitResult> {
    let now = Instant::now();
    // A deadline past the end of time (`Duration::MAX`) sleeps forever
    // (until cancelled).
    let deadline = now.checked_add(duration);
    if !fiber_core::in_fiber() {
        return sleep_deadline(deadline);
    }
    // The wait checks for a deadline already passed against this clock
    // read instead of taking another (one read less per sleep; a zero
    // sleep still ends at once).
    match fiber_core::wait_until_from(now, deadline, fiber_core::Interrupt::Cancellable) {
        WaitResult::TimedOut => Ok(()),
        other => Err(other),
    }
}

/// Park the running fiber until `deadline` (see [`sleep`]).
#[track_caller]
pub fn sleep_until(deadline: Instant) -> Result<(), WaitResult> {
    sleep_deadline(Some(deadline))
}

#[track_caller]
fn sleep_deadline(deadline: Option<Instant>) -> Result<(), WaitResult> {
    if !fiber_core::in_fiber() {
        match deadline {
            Some(deadline) => {
                let now = Instant::now();
                if deadline > now {
                    std::thread::sleep(deadline - now);
                }
            }
            None => loop {
                std::thread::park();
            },
        }
        return Ok(());
    }
    match fiber_core::wait_until(deadline, fiber_core::Interrupt::Cancellable) {
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
/// be abandoned. A call that is still waiting for a free pool thread
/// (`max_blocking_threads` busy) when the runtime shuts down never starts:
/// the calling fiber is unwound by the shutdown and drops `f` unrun.
/// Outside a runtime's fiber it just calls `f`.
///
/// Sockets do not need this (`fiber::net` parks on readiness); files do:
/// Linux reports regular files as always ready, so a read from a slow disk
/// would hold a worker in the kernel.
#[track_caller]
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

/// The `FIBER_STATS=1` report: the counters at the end of the shutdown
/// with the worker numbers of the running pool, then the layers' lines
/// (jobs), as `fiber::stats()` prints them.
fn shutdown_report(running: Stats, end: Stats) -> String {
    let stats = Stats {
        workers: running.workers,
        sleeping_workers: running.sleeping_workers,
        ..end
    };
    let mut report = stats.to_string();
    for lines in fiber_core::stats_reports() {
        if !report.ends_with('\n') {
            report.push('\n');
        }
        report.push_str(&lines);
    }
    report
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
    crate::handle::current_shared().map(|shared| stats_of(&shared))
}
