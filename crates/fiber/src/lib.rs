//! Stackful M:N fibers for Rust: plain blocking-style code (no `async`)
//! that runs hundreds of thousands of fibers on a few OS threads.
//!
//! `fiber` is the crate users depend on; it re-exports the layers: the
//! scheduler ([`Runtime`], [`Handle`], [`runtime::Builder`]), channels
//! ([`chan`], [`select!`]), locks that park fibers ([`sync`]), sockets
//! ([`net`]), structured concurrency ([`scope`], [`try_scope`],
//! [`with_timeout`], [`Job`]) and the core ([`spawn`], [`Builder`],
//! [`JoinHandle`], [`yield_now`]).
//!
//! # Examples
//!
//! ```
//! use fiber::chan;
//!
//! let total = fiber::run(|| {
//!     let (tx, rx) = chan::bounded(0);
//!     for i in 0..10u64 {
//!         let tx = tx.clone();
//!         fiber::spawn(move || tx.send(i * i).unwrap());
//!     }
//!     drop(tx);
//!     rx.iter().sum::<u64>()
//! });
//! assert_eq!(total, 285);
//! ```
//!
//! # Coming from std, crossbeam, tokio or Go
//!
//! | you know | std::thread | crossbeam-channel | tokio | Go | fiber |
//! | --- | --- | --- | --- | --- | --- |
//! | start | `main` | | `#[tokio::main]`, `Runtime::block_on` | `main` | `fiber::run(\|\| ..)`, `Runtime::block_on` (may borrow locals) |
//! | spawn | `thread::spawn` | | `tokio::spawn` | `go f()` | `fiber::spawn` |
//! | spawn with settings | `thread::Builder` | | `task::Builder` | | `fiber::Builder::new().name(..).stack_size(..).pinned(..)` |
//! | borrow in children | `thread::scope` | `crossbeam::scope` | | `sync.WaitGroup` | `fiber::scope`, `fiber::try_scope` (errgroup) |
//! | spawn from outside | | | `Handle::spawn` | | `fiber::Handle` (`Runtime::handle`, `Handle::current`) |
//! | channels | `mpsc::sync_channel` | `bounded`, `unbounded` | `mpsc::channel` | `make(chan T, n)` | `fiber::chan::bounded`, `unbounded` (MPMC, crossbeam's API); `fiber::sync::mpsc` under std's names |
//! | select | | `select!`, `Select` | `tokio::select!` | `select` | `fiber::select!`, `fiber::chan::Select` |
//! | timers | `thread::sleep` | `after`, `tick` | `time::sleep`, `interval` | `time.Sleep`, `time.After` | `fiber::sleep`, `fiber::chan::after`, `tick` |
//! | timeouts | | `recv_timeout` | `time::timeout` | `context.WithTimeout` | `fiber::with_timeout`, `recv_timeout`, `send_timeout` |
//! | cancellation | | | `JoinHandle::abort`, `CancellationToken` | `context.Context` | `JoinHandle::cancel`, `Job::cancel`, `fiber::is_cancelled` |
//! | mutex | `std::sync::Mutex` | | `tokio::sync::Mutex` | `sync.Mutex` | `fiber::sync::Mutex` (std's API and poisoning); `std::sync::Mutex` only if never held across a park |
//! | network | `std::net` | | `tokio::net` | `net` | `fiber::net` (std's API) |
//! | blocking calls | (all of them) | | `spawn_blocking` | (runtime does it) | `fiber::blocking(\|\| ..)` |
//! | thread-locals | `thread_local!` | | `task_local!` | | `fiber::fiber_local!`, or `fiber::spawn_pinned` to keep `thread_local!` caches |
//! | park | `thread::park`, `unpark` | | | | `fiber::park`, `fiber::current().unpark()` |
//!
//! From Kotlin's coroutines: `coroutineScope` / `supervisorScope` are
//! `fiber::scope` / `fiber::supervisor_scope`, `launch` is `s.spawn` (its
//! `Job` is `handle.job()`), `Job()` / `SupervisorJob()` with `complete()`
//! and `CoroutineScope(job).launch` are `Job::new` / `Job::new_supervisor`,
//! `job.complete()` and `job.spawn`, and `Job` has `cancel`, `join`,
//! `cancel_and_join`, `is_active` / `is_cancelled` / `is_completed`,
//! `children`, `parent`, `cancel_children` and `invoke_on_completion`;
//! `withTimeout` is `fiber::with_timeout`, `withContext(NonCancellable)` is
//! `fiber::non_cancellable`.
//!
//! # Cancellation points
//!
//! Cancellation is cooperative: a cancelled fiber (its `JoinHandle::cancel`,
//! its job or scope cancelled, a `with_timeout` deadline, runtime shutdown)
//! sees it at the next cancellation point, where the wait returns early with
//! an error, and at nothing else. The cancellation points:
//!
//! - `fiber::sleep`, `fiber::sleep_until`, `fiber::yield_now` (return `Err(Cancelled)`);
//! - `fiber::check_cancelled()` (and `fiber::is_cancelled()` to poll);
//! - channel operations that wait: `send`, `recv` and their `_timeout` and
//!   `_deadline` forms (a cancelled `send` gives its value back in the error);
//! - `select!` and `Select`'s blocking waits (a cancelled select runs its first
//!   channel arm with a failed result; the timed forms report a timeout);
//! - `JoinHandle::join`, `ScopedJoinHandle::join` and `Job::join` (the joined
//!   fiber runs on; `Job::join` checks even a job that has already ended, as
//!   Kotlin's `join`, while a finished fiber's handle still gives its result);
//! - `fiber::park` / `park_timeout` (return without parking);
//! - `fiber::sync`: `Semaphore::acquire`, `Condvar` waits, `Barrier::wait`,
//!   `WaitGroup::wait` (not `Mutex::lock` or `RwLock`, as in std);
//! - `fiber::net`: every blocking socket call (an `io::Error` of kind `Other`
//!   wrapping `Cancelled`).
//!
//! A fiber that never reaches one is not interrupted; at shutdown it gets the
//! grace time (`shutdown_timeout`) and is then unwound.

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(missing_docs)]

#[doc(inline)]
pub use fiber_chan as chan;
#[doc(inline)]
pub use fiber_chan::{select, select_biased};
pub use fiber_core as core;
#[doc(inline)]
pub use fiber_core::{
    panicking, park, park_timeout, yield_now, Dump, FiberHandle, FiberId, FiberInfo, JoinError, JoinHandle, WaitKind,
};
#[doc(inline)]
pub use fiber_jobs::{
    check_cancelled, is_cancelled, scope, supervisor_scope, try_scope, with_timeout, CancelReason, Cancelled, Job,
    JobState, JobStats, Scope, ScopedJoinHandle, TimedOut, TryScope,
};
#[doc(inline)]
pub use fiber_net as net;
#[doc(inline)]
pub use fiber_sched::{blocking, Config, ConfigError, Handle, Runtime};
/// Locks and other synchronization that park a fiber instead of its
/// worker thread, with `std::sync`'s API ([`Mutex`](sync::Mutex),
/// [`RwLock`](sync::RwLock), [`Condvar`](sync::Condvar),
/// [`Barrier`](sync::Barrier), [`OnceLock`](sync::OnceLock),
/// [`Once`](sync::Once), [`LazyLock`](sync::LazyLock)), a FIFO
/// [`Semaphore`](sync::Semaphore), a [`WaitGroup`](sync::WaitGroup),
/// std's [`Arc`](sync::Arc), [`Weak`](sync::Weak) and
/// [`atomic`](sync::atomic) as they are, and [`mpsc`](sync::mpsc): std's
/// channel names over [`chan`]. A port from `std::sync` is an import
/// change. Everything here works from fibers and plain threads alike; the
/// rules (poisoning, fairness, which waits are cancellation points) are
/// in the `fiber-sync` crate's documentation and `spec/sync.md`.
///
/// ```
/// use fiber::sync::{Arc, Condvar, Mutex};
///
/// let pair = Arc::new((Mutex::new(false), Condvar::new()));
/// let pair2 = pair.clone();
/// fiber::run(move || {
///     let waiter = fiber::spawn(move || {
///         let (ready, cv) = &*pair2;
///         let ready = cv.wait_while(ready.lock().unwrap(), |ready| !*ready).unwrap();
///         *ready
///     });
///     let (ready, cv) = &*pair;
///     *ready.lock().unwrap() = true;
///     cv.notify_all();
///     assert!(waiter.join().unwrap());
/// });
/// ```
pub mod sync {
    #[doc(inline)]
    pub use fiber_sync::*;

    /// `std::sync::mpsc`'s names over [`fiber::chan`](crate::chan):
    /// [`channel`](mpsc::channel) is [`chan::unbounded`](crate::chan::unbounded),
    /// [`sync_channel`](mpsc::sync_channel) is [`chan::bounded`](crate::chan::bounded) (a
    /// bound of 0 is a rendezvous, as in std), and
    /// [`SyncSender`](mpsc::SyncSender) is the same
    /// [`Sender`](mpsc::Sender). The channels park fibers and block plain threads,
    /// and they are a superset of std's: the receiver can be cloned
    /// (several consumers), and both ends have `close`, `len` and the
    /// timed forms of [`chan`](crate::chan).
    ///
    /// ```
    /// use fiber::sync::mpsc;
    ///
    /// let sum = fiber::run(|| {
    ///     let (tx, rx) = mpsc::sync_channel(0);
    ///     for i in 1..=4u32 {
    ///         let tx: mpsc::SyncSender<u32> = tx.clone();
    ///         fiber::spawn(move || tx.send(i).unwrap());
    ///     }
    ///     drop(tx);
    ///     rx.iter().sum::<u32>()
    /// });
    /// assert_eq!(sum, 10);
    /// ```
    pub mod mpsc {
        #[doc(inline)]
        pub use fiber_chan::{
            IntoIter, Iter, Receiver, RecvError, RecvTimeoutError, SendError, Sender, TryIter, TryRecvError,
            TrySendError,
        };

        /// The sending half of a [`sync_channel`]: the same type as
        /// [`Sender`] (std keeps two types; here every sender has `send`,
        /// `try_send` and the timed forms).
        pub type SyncSender<T> = Sender<T>;

        /// A channel with no bound: `send` never waits (std's
        /// `mpsc::channel`; [`chan::unbounded`](crate::chan::unbounded)).
        pub fn channel<T>() -> (Sender<T>, Receiver<T>) {
            fiber_chan::unbounded()
        }

        /// A channel holding at most `bound` values; with a bound of 0,
        /// every `send` waits for a `recv` to take its value (std's
        /// `mpsc::sync_channel`; [`chan::bounded`](crate::chan::bounded)).
        pub fn sync_channel<T>(bound: usize) -> (SyncSender<T>, Receiver<T>) {
            fiber_chan::bounded(bound)
        }
    }
}
mod builder;
pub use builder::Builder;

/// Building and configuring a [`Runtime`]: [`runtime::Builder`] (what
/// [`Runtime::builder`] returns), [`Config`], [`Handle`].
pub mod runtime {
    #[doc(inline)]
    pub use fiber_sched::{Builder, Config, ConfigError, Handle, Runtime, Stats};
}

use std::fmt;
use std::time::Duration;

/// Start a runtime with the defaults (and the `FIBER_*` environment), run
/// `f` as its root fiber, shut the runtime down and return `f`'s value. A
/// panic in `f` is re-raised here with its original payload. `run` may be
/// called again after it returns, from any thread. Like
/// `std::thread::scope`, `f` may borrow the caller's stack: `run` returns
/// only after the root fiber is done with it.
///
/// ```
/// let mut counter = 0;
/// let words = vec!["a", "b"];
/// fiber::run(|| counter += words.len());
/// assert_eq!(counter, 2);
/// ```
///
/// # Panics
///
/// Panics when called inside a fiber (spawn a fiber with [`spawn`]
/// instead, or use a [`Handle`] from a plain thread), if a `FIBER_*`
/// variable is invalid (the message names it), if the worker threads cannot
/// start, or with `f`'s own panic.
#[track_caller]
pub fn run<F, T>(f: F) -> T
where
    F: FnOnce() -> T + Send,
    T: Send,
{
    if fiber_core::in_fiber() {
        panic!(
            "fiber::run called inside a fiber: it would start a second runtime and block this worker \
             thread; spawn a fiber (fiber::spawn or a scope) instead, or from a plain thread use \
             fiber::Handle::block_on"
        );
    }
    let runtime = match Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => panic!("fiber::run: cannot start the runtime: {e}"),
    };
    runtime.block_on(f)
}

#[track_caller]
fn outside(function: &str) -> ! {
    if fiber_sched::on_blocking_thread() {
        panic!(
            "fiber::{function} called inside a fiber::blocking call: the call runs on a plain thread of \
             the blocking pool, not in a fiber; use the std equivalent there (std::thread::sleep, a \
             Handle captured before the call for spawning), or do this in the fiber around the call"
        )
    }
    panic!(
        "fiber::{function} called outside a fiber: there is no runtime here; start one with \
         fiber::run(|| ...) or Runtime::block_on, and call fiber::{function} from inside it"
    )
}

/// Run `f` with cancellation held off for the calling fiber (Kotlin's
/// `withContext(NonCancellable)`): inside it, waits are not interrupted by
/// a cancelled task or job, `yield_now` returns `Ok` and
/// [`is_cancelled`] is false, so clean-up code of a cancelled fiber can
/// still sleep, send a last message or join. A cancellation requested
/// meanwhile is seen again once `f` returns (or unwinds). A runtime's
/// shutdown still ends such waits once its grace time is over. Sections
/// nest. On a plain thread this just calls `f`.
///
/// ```
/// use std::time::Duration;
///
/// fiber::run(|| {
///     let (tx, rx) = fiber::chan::bounded(1);
///     let worker = fiber::spawn(move || {
///         tx.send("started").unwrap();
///         while fiber::sleep(Duration::from_millis(1)).is_ok() {}
///         // Cancelled: the last report still goes out.
///         fiber::non_cancellable(|| {
///             fiber::sleep(Duration::from_millis(1)).unwrap();
///             tx.send("stopped").unwrap();
///         });
///         assert!(fiber::is_cancelled());
///     });
///     assert_eq!(rx.recv().unwrap(), "started");
///     worker.cancel();
///     assert_eq!(rx.recv().unwrap(), "stopped");
///     assert!(worker.join().unwrap_err().is_cancelled());
/// });
/// ```
pub fn non_cancellable<R>(f: impl FnOnce() -> R) -> R {
    fiber_core::non_cancellable(f)
}

/// Spawn a fiber on the current runtime. Dropping the handle detaches the
/// fiber, as with `std::thread::spawn`. Inside a [`scope`], `fiber::spawn`
/// still makes a detached fiber (as `std::thread::spawn` does inside
/// `std::thread::scope`); use the scope's `s.spawn` for a child the scope
/// waits for.
///
/// # Thread-locals
///
/// A fiber may resume on another worker thread after any park or yield
/// (sleep, channel operations, joins, locks, `yield_now`). Holding a
/// reference into a `thread_local!`, an `Rc` taken from one, a
/// `std::sync::MutexGuard`, or any other `!Send` value across such a point
/// is a bug the compiler cannot see through a stackful switch. Use
/// `fiber_local!` for per-fiber state, `fiber::sync` locks instead of
/// `std::sync` ones across a park, and [`spawn_pinned`] (or
/// `Runtime::builder().pinned(true)`) for code that must keep thread-local
/// caches: a pinned fiber always resumes on the worker it first ran on.
///
/// Do not hold a `std::sync::Mutex` guard across a park (`sleep`, a channel
/// operation, a join): waiters block their worker threads. Use
/// [`sync::Mutex`] and the other [`sync`] types, which park the fiber.
///
/// # Panics
///
/// Panics outside a runtime, naming this function and how to start one.
#[track_caller]
pub fn spawn<F, T>(f: F) -> JoinHandle<T>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    if !fiber_core::in_fiber() {
        outside("spawn");
    }
    fiber_core::spawn(f)
}

/// Spawn a pinned fiber: once it has run, it resumes only on the worker
/// thread it first ran on (it may still be taken by an idle worker before
/// its first run). Thread-local state it holds across a park therefore
/// stays on its thread (see [`spawn`]'s "Thread-locals").
///
/// # Panics
///
/// Panics outside a runtime, or if the fiber cannot be spawned.
#[track_caller]
pub fn spawn_pinned<F, T>(f: F) -> JoinHandle<T>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let Some(sched) = fiber_core::current_scheduler() else {
        outside("spawn_pinned")
    };
    let options = fiber_core::SpawnOptions {
        pinned: true,
        ..Default::default()
    };
    match fiber_core::try_spawn_with(&sched, options, f) {
        Ok(handle) => handle,
        Err(e) => panic!("fiber::spawn_pinned: {e}"),
    }
}

/// Every live fiber of the current runtime: its state, what it waits on
/// (sleep, channel receive or send, select, join, park, lock, I/O), for how
/// long, and the user's call that parked it. `Display` prints it like Go's
/// goroutine dump, grouping fibers parked the same way at the same place.
/// `Runtime::dump` does the same from outside; `FIBER_DUMP_SIGNAL=SIGUSR1`
/// prints it when the process gets that signal.
///
/// # Panics
///
/// Panics outside a runtime.
#[track_caller]
pub fn dump() -> fiber_core::Dump {
    match fiber_core::current_scheduler() {
        Some(sched) => {
            fiber_core::advance_coarse_clock();
            sched.frames().dump()
        }
        None => outside("dump"),
    }
}

/// A handle to the running fiber (its id, name and `unpark`), like
/// `std::thread::current`.
///
/// # Panics
///
/// Panics outside a fiber.
#[track_caller]
pub fn current() -> FiberHandle {
    match fiber_core::current_handle() {
        Some(handle) => handle,
        None => outside("current"),
    }
}

/// Park the running fiber for at least `duration` (`Duration::MAX`: until
/// cancelled). A cancellation point: returns `Err(Cancelled)` early once
/// the fiber's job is cancelled, so `loop { work(); fiber::sleep(d)?; }`
/// ends when cancelled.
///
/// # Panics
///
/// Panics outside a runtime (use `std::thread::sleep` there).
#[track_caller]
pub fn sleep(duration: Duration) -> Result<(), Cancelled> {
    if !fiber_core::in_fiber() {
        outside("sleep");
    }
    fiber_sched::sleep(duration).map_err(|_| Cancelled)
}

/// Park the running fiber until `deadline` (at least). A cancellation
/// point, like [`sleep`].
///
/// # Panics
///
/// Panics outside a runtime.
#[track_caller]
pub fn sleep_until(deadline: std::time::Instant) -> Result<(), Cancelled> {
    if !fiber_core::in_fiber() {
        outside("sleep_until");
    }
    fiber_sched::sleep_until(deadline).map_err(|_| Cancelled)
}

/// A snapshot of the current runtime's counters and of the job counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Scheduler counters: workers, fibers alive/parked/runnable, spawns,
    /// steals, scale events, ...
    pub runtime: fiber_sched::Stats,
    /// Job counters (process-wide).
    pub jobs: JobStats,
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.runtime)?;
        write!(f, "{}", self.jobs)
    }
}

/// The counters of the runtime the caller runs on.
///
/// # Panics
///
/// Panics outside a runtime (use [`Runtime::stats`] there: the
/// scheduler's counters only, without the process-wide `jobs` this adds).
#[track_caller]
pub fn stats() -> Stats {
    match fiber_sched::current_stats() {
        Some(runtime) => Stats {
            runtime,
            jobs: fiber_jobs::stats(),
        },
        None => outside("stats"),
    }
}

/// A fiber-local value: the replacement for `thread_local!` inside fibers
/// (a fiber may resume on another worker thread after any park, so a
/// `thread_local!` is the wrong scope there). Each fiber sees its own value,
/// created on first use and dropped when the fiber ends. Outside fibers it
/// behaves like a thread-local. Declare with [`fiber_local!`].
pub struct FiberLocal<T: 'static> {
    init: fn() -> T,
}

impl<T: 'static> fmt::Debug for FiberLocal<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad("FiberLocal { .. }")
    }
}

impl<T: Send + 'static> FiberLocal<T> {
    /// A key whose value starts as `init()` (used by [`fiber_local!`]).
    #[doc(hidden)]
    pub const fn new(init: fn() -> T) -> FiberLocal<T> {
        FiberLocal { init }
    }

    /// Run `f` with this fiber's value.
    pub fn with<R>(&'static self, f: impl FnOnce(&T) -> R) -> R {
        fiber_core::with_fiber_local(self as *const Self as usize, self.init, f)
    }

    /// [`with`](Self::with), in the shape of `LocalKey::try_with`, for code
    /// moved over from `thread_local!`. It does not fail: where std's
    /// `try_with` fails (the value is being or has been destroyed), a
    /// fiber-local gets a fresh value: a destructor that reads a
    /// fiber-local dropped before it sees a new one (dropped in turn), and
    /// one that runs as the thread exits sees a value for that call only.
    ///
    /// # Errors
    ///
    /// None today; the `Result` keeps call sites written for std compiling.
    pub fn try_with<R>(&'static self, f: impl FnOnce(&T) -> R) -> Result<R, AccessError> {
        Ok(self.with(f))
    }
}

/// The error type of [`FiberLocal::try_with`], in the place of
/// `std::thread::AccessError` (never returned: see `try_with`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct AccessError;

impl fmt::Display for AccessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("cannot access a fiber-local value")
    }
}

impl std::error::Error for AccessError {}

/// The `LocalKey<Cell<T>>` shortcuts of std.
///
/// ```
/// use std::cell::Cell;
///
/// fiber::fiber_local! {
///     static HITS: Cell<u32> = const { Cell::new(0) };
/// }
///
/// fiber::run(|| {
///     HITS.set(HITS.get() + 1);
///     assert_eq!(HITS.replace(10), 1);
///     assert_eq!(HITS.take(), 10);
///     assert_eq!(HITS.get(), 0);
/// });
/// ```
impl<T: Send + 'static> FiberLocal<std::cell::Cell<T>> {
    /// This fiber's value (a copy).
    pub fn get(&'static self) -> T
    where
        T: Copy,
    {
        self.with(std::cell::Cell::get)
    }

    /// Set this fiber's value.
    pub fn set(&'static self, value: T) {
        self.with(|cell| cell.set(value));
    }

    /// Take this fiber's value, leaving `T::default()`.
    pub fn take(&'static self) -> T
    where
        T: Default,
    {
        self.with(std::cell::Cell::take)
    }

    /// Replace this fiber's value, returning the old one.
    pub fn replace(&'static self, value: T) -> T {
        self.with(|cell| cell.replace(value))
    }
}

/// The `LocalKey<RefCell<T>>` shortcuts of std.
///
/// ```
/// use std::cell::RefCell;
///
/// fiber::fiber_local! {
///     static SEEN: RefCell<Vec<u32>> = RefCell::new(Vec::new());
/// }
///
/// fiber::run(|| {
///     SEEN.with_borrow_mut(|v| v.push(1));
///     SEEN.set(vec![2, 3]);
///     assert_eq!(SEEN.with_borrow(|v| v.len()), 2);
///     assert_eq!(SEEN.take(), vec![2, 3]);
///     assert_eq!(SEEN.replace(vec![4]), Vec::<u32>::new());
/// });
/// ```
impl<T: Send + 'static> FiberLocal<std::cell::RefCell<T>> {
    /// Run `f` with a shared borrow of this fiber's value.
    ///
    /// # Panics
    ///
    /// Panics if the value is mutably borrowed.
    pub fn with_borrow<R>(&'static self, f: impl FnOnce(&T) -> R) -> R {
        self.with(|cell| f(&cell.borrow()))
    }

    /// Run `f` with a mutable borrow of this fiber's value.
    ///
    /// # Panics
    ///
    /// Panics if the value is borrowed.
    pub fn with_borrow_mut<R>(&'static self, f: impl FnOnce(&mut T) -> R) -> R {
        self.with(|cell| f(&mut cell.borrow_mut()))
    }

    /// Set this fiber's value.
    ///
    /// # Panics
    ///
    /// Panics if the value is borrowed.
    pub fn set(&'static self, value: T) {
        self.with(|cell| *cell.borrow_mut() = value);
    }

    /// Take this fiber's value, leaving `T::default()`.
    ///
    /// # Panics
    ///
    /// Panics if the value is borrowed.
    pub fn take(&'static self) -> T
    where
        T: Default,
    {
        self.with(std::cell::RefCell::take)
    }

    /// Replace this fiber's value, returning the old one.
    ///
    /// # Panics
    ///
    /// Panics if the value is borrowed.
    pub fn replace(&'static self, value: T) -> T {
        self.with(|cell| cell.replace(value))
    }
}

/// Declare fiber-local values, like `thread_local!` (an initializer may be
/// written `const { .. }`, as there; it still runs on each fiber's first use).
///
/// ```
/// use std::cell::Cell;
///
/// fiber::fiber_local! {
///     static COUNTER: Cell<u32> = Cell::new(0);
/// }
///
/// fiber::run(|| {
///     let children: Vec<_> = (0..4)
///         .map(|_| {
///             fiber::spawn(|| {
///                 COUNTER.with(|c| c.set(c.get() + 1));
///                 let _ = fiber::yield_now();
///                 COUNTER.with(|c| c.get())
///             })
///         })
///         .collect();
///     for child in children {
///         assert_eq!(child.join().unwrap(), 1, "each fiber has its own counter");
///     }
/// });
/// ```
#[macro_export]
macro_rules! fiber_local {
    () => {};
    // `= const { .. }`, as `thread_local!` takes it (the value is still
    // made on each fiber's first use).
    ($(#[$attr:meta])* $vis:vis static $name:ident: $t:ty = const $init:block; $($rest:tt)*) => {
        $crate::fiber_local!($(#[$attr])* $vis static $name: $t = $init; $($rest)*);
    };
    ($(#[$attr:meta])* $vis:vis static $name:ident: $t:ty = const $init:block) => {
        $crate::fiber_local!($(#[$attr])* $vis static $name: $t = $init;);
    };
    ($(#[$attr:meta])* $vis:vis static $name:ident: $t:ty = $init:expr; $($rest:tt)*) => {
        $(#[$attr])*
        $vis static $name: $crate::FiberLocal<$t> = $crate::FiberLocal::new({
            fn __fiber_local_init() -> $t {
                $init
            }
            __fiber_local_init
        });
        $crate::fiber_local!($($rest)*);
    };
    ($(#[$attr:meta])* $vis:vis static $name:ident: $t:ty = $init:expr) => {
        $crate::fiber_local!($(#[$attr])* $vis static $name: $t = $init;);
    };
}

/// The README's examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
mod readme {}
