//! [`Handle`]: a cheap, clonable reference to a runtime for spawning and
//! `block_on` from any thread, and the root-fiber runner behind
//! `Runtime::block_on` that lets the root closure borrow the caller's stack.

use crate::sync::lock;
use crate::worker::Shared;
use fiber_core::{try_spawn_on, JoinHandle, Schedule};
use std::fmt;
use std::io;
use std::sync::{Arc, Condvar, Mutex, PoisonError};

/// A handle to a [`Runtime`](crate::Runtime): spawn fibers and run a root
/// fiber with [`block_on`](Handle::block_on) from any thread, like tokio's
/// `runtime::Handle`. It is `Clone + Send + Sync`; it does not keep the
/// runtime running: once the runtime is shut down (or dropped), spawning
/// through a handle fails.
///
/// ```
/// # mod fiber { pub use fiber_sched::Runtime; }
/// let rt = fiber::Runtime::builder().workers(2).build().unwrap();
/// let handle = rt.handle();
/// let from_thread = std::thread::spawn(move || {
///     let child = handle.spawn(|| 20);
///     let words = vec!["a", "b"];
///     handle.block_on(|| words.len()) + child.join().unwrap()
/// });
/// assert_eq!(from_thread.join().unwrap(), 22);
/// ```
#[derive(Clone)]
pub struct Handle {
    pub(crate) shared: Arc<Shared>,
}

// Unwind safety as tokio declares it for its runtime and handle: their
// shared state lives behind atomics and locks that ignore poisoning, so a
// panic caught around a call on them leaves nothing half-changed that a
// later call could observe.
impl std::panic::UnwindSafe for Handle {}
impl std::panic::RefUnwindSafe for Handle {}

impl fmt::Debug for Handle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Handle").finish_non_exhaustive()
    }
}

impl Handle {
    /// The handle of the runtime the calling fiber runs on (not available
    /// on a plain thread, nor in an `on_thread_start` / `on_thread_stop`
    /// hook, which runs outside any fiber: capture a `Handle` before
    /// building the hook instead).
    ///
    /// Inside a `fiber::blocking` call it is the runtime whose blocking
    /// pool runs the call (as tokio's `Handle::current` inside
    /// `spawn_blocking`).
    ///
    /// # Panics
    ///
    /// Panics outside a fiber and outside a `fiber::blocking` call: there
    /// is no current runtime on a plain thread (use
    /// [`Handle::try_current`], or `Runtime::handle`).
    #[track_caller]
    pub fn current() -> Handle {
        match Handle::try_current() {
            Some(handle) => handle,
            None => panic!(
                "fiber::Handle::current called outside a fiber: a plain thread has no current runtime; \
                 pass a handle from Runtime::handle() to this thread, or use Handle::try_current"
            ),
        }
    }

    /// The handle of the current runtime (inside a `fiber::blocking`
    /// call: the runtime whose pool runs it), or `None` on a plain thread.
    pub fn try_current() -> Option<Handle> {
        current_shared()
            .or_else(blocking_pool_shared)
            .map(|shared| Handle { shared })
    }

    /// The runtime as the contract's scheduler.
    pub fn scheduler(&self) -> Arc<dyn Schedule> {
        self.shared.clone()
    }

    /// Spawn a fiber on the runtime, from any thread.
    ///
    /// # Panics
    ///
    /// Panics if the runtime is shut down or a stack taken at the spawn is
    /// refused (use [`Handle::try_spawn`] to get the error).
    #[track_caller]
    pub fn spawn<F, T>(&self, f: F) -> JoinHandle<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        match self.try_spawn(f) {
            Ok(handle) => handle,
            Err(e) => panic!("fiber::Handle::spawn: {e}"),
        }
    }

    /// Spawn a fiber, returning an error if the runtime is shut down or a
    /// stack taken at the spawn is refused (see
    /// [`fiber_core::try_spawn_on`]: a fiber of the runtime's stack size
    /// takes its stack when it first runs).
    #[track_caller]
    pub fn try_spawn<F, T>(&self, f: F) -> io::Result<JoinHandle<T>>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        try_spawn_on(&self.scheduler(), f)
    }

    /// Run `f` as a root fiber of the runtime and block this thread until
    /// it has finished, like `Runtime::block_on` (`f` may borrow the
    /// caller's stack). A panic of `f` is re-raised here.
    ///
    /// # Panics
    ///
    /// Panics when called from a fiber (it would block a worker thread:
    /// spawn a fiber and join it instead), on one of the runtime's own
    /// worker threads outside a fiber (a hook or a tracing callback there:
    /// the root could wait for that very thread), if the runtime is shut
    /// down, or with `f`'s panic.
    #[track_caller]
    pub fn block_on<F, T>(&self, f: F) -> T
    where
        F: FnOnce() -> T + Send,
        T: Send,
    {
        block_on_root(&self.shared, "Handle::block_on", f)
    }
}

/// Set once the root closure has been consumed (returned, unwound or
/// dropped unrun), by the closure's own wrapper.
#[derive(Default)]
struct Done {
    done: Mutex<bool>,
    cv: Condvar,
}

impl Done {
    fn set(&self) {
        *self.done.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.cv.notify_all();
    }

    fn wait(&self) {
        let mut done = self.done.lock().unwrap_or_else(PoisonError::into_inner);
        while !*done {
            done = self.cv.wait(done).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// Where the root's value goes: the caller's stack.
struct Slot<T>(*mut Option<T>);

// SAFETY: the pointer is written once, by the root fiber, while the caller
// is blocked in `block_on_root` (which owns the pointee and reads it only
// after `Done` is set); `T: Send` because the value moves to the caller.
unsafe impl<T: Send> Send for Slot<T> {}

/// The root closure with its slot and completion signal. Its `Drop` signals
/// `done` after the user's closure is gone, however it goes: returned,
/// unwound by a panic or a shutdown unwind, or dropped without running.
struct Root<F, T> {
    f: Option<F>,
    slot: Slot<T>,
    done: Arc<Done>,
}

impl<F: FnOnce() -> T, T> Root<F, T> {
    fn run(mut self) {
        if let Some(f) = self.f.take() {
            let value = f();
            // SAFETY: see `Slot`: the caller is still blocked in
            // `block_on_root` (it waits for `done`, set only when `self`
            // drops below), so the pointee is alive and nobody else
            // touches it.
            unsafe { *self.slot.0 = Some(value) };
        }
    }
}

impl<F, T> Drop for Root<F, T> {
    fn drop(&mut self) {
        /// Sets `done` when dropped: after the closure, and on every path
        /// (a capture's destructor that panics or is unwound included),
        /// so the caller in `block_on_root` never waits for ever.
        struct SetDone<'a>(&'a Done);
        impl Drop for SetDone<'_> {
            fn drop(&mut self) {
                self.0.set();
            }
        }
        let _set = SetDone(&self.done);
        // The user's closure (and what it captured) goes first; only then
        // may the caller return.
        drop(self.f.take());
    }
}

/// Blocks until the root closure is gone, when dropped (on every path out
/// of `block_on_root`, unwinding included).
struct WaitDone(Arc<Done>);

impl Drop for WaitDone {
    fn drop(&mut self) {
        self.0.wait();
    }
}

/// Run `f` as the root fiber of `shared` and block until it has finished.
#[track_caller]
pub(crate) fn block_on_root<F, T>(shared: &Arc<Shared>, what: &str, f: F) -> T
where
    F: FnOnce() -> T + Send,
    T: Send,
{
    if fiber_core::in_fiber() {
        panic!(
            "fiber::{what} called inside a fiber: it would block this worker thread while a second \
             root fiber runs; spawn a fiber (fiber::spawn) and join it instead, or call block_on from a \
             plain thread (with a Handle from Runtime::handle / Handle::current)"
        );
    }
    if crate::worker::thread_of(shared.id) {
        // Outside a fiber but on one of this runtime's own worker threads
        // (a hook, a tracing callback, a thread-local destructor): the
        // root fiber would need this thread, or a worker that may be
        // blocked the same way, and the call waited for ever
        // (`reviews/review60.rs`). tokio refuses the same.
        panic!(
            "fiber::{what} called on one of this runtime's own worker threads, outside a fiber (an \
             on_thread_start or on_thread_stop hook, a tracing callback, a thread-local destructor): the \
             root fiber could wait for this very thread; call block_on from a plain thread, or spawn a \
             fiber (Handle::spawn) instead"
        );
    }
    let mut value: Option<T> = None;
    let done = Arc::new(Done::default());
    let root = Root {
        f: Some(f),
        slot: Slot(&mut value),
        done: done.clone(),
    };
    let body: Box<dyn FnOnce() + Send + '_> = Box::new(move || root.run());
    // SAFETY: `body` borrows the caller's stack (`value` and whatever `f`
    // borrows) for less than 'static. This function does not return or
    // unwind before `done` is set, and `done` is set by `Root::drop` only
    // after the user's closure has been consumed (it returned, or it was
    // unwound, or dropped unrun) and the slot written: after that the
    // fiber never touches the borrowed data again. Every path below waits
    // for `done` first: the normal join, a join error (panic, cancellation,
    // shutdown of the runtime from another thread), a failed spawn (the
    // body is dropped inside `try_spawn_on`, before it returns) and any
    // unwind (`WaitDone` waits in its `Drop`). `wait` is a plain condvar
    // wait (we are on a plain thread, checked above), which cannot unwind. If the root fiber were never resumed and never dropped
    // (abandoned at a shutdown), this thread waits forever rather than
    // return while the borrow is live: a hang, never a use after return.
    let body: Box<dyn FnOnce() + Send + 'static> = unsafe { std::mem::transmute(body) };
    // Waits for `done` when dropped: also if anything below unwinds.
    let wait_done = WaitDone(done);
    let handle = match try_spawn_on(&(shared.clone() as Arc<dyn Schedule>), body) {
        Ok(handle) => handle,
        Err(e) => {
            drop(wait_done);
            panic!("fiber::{what}: cannot spawn the root fiber: {e}");
        }
    };
    let root_id = handle.id().0;
    lock(&shared.root_fibers).push(root_id);
    let result = handle.join();
    drop(wait_done);
    lock(&shared.root_fibers).retain(|&id| id != root_id);
    match (result, value) {
        (Err(e), _) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // `f` returned: its value is the caller's, also when the root's job
        // was cancelled meanwhile (the join then says `Cancelled`, but
        // cancellation is cooperative and `f` chose to return a value).
        (_, Some(value)) => value,
        (Ok(()), None) => unreachable!("the root fiber finished without storing its value"),
        (Err(e), None) => panic!("fiber::{what}: the root fiber ended without a value: {e}"),
    }
}

/// Every runtime built in this process and not yet freed, for
/// [`current_shared`]'s slow path.
static LIVE: Mutex<Vec<std::sync::Weak<Shared>>> = Mutex::new(Vec::new());

/// Note a new runtime (its `Runtime::build`).
pub(crate) fn register_live(shared: &Arc<Shared>) {
    let mut live = LIVE.lock().unwrap_or_else(PoisonError::into_inner);
    live.retain(|w| w.strong_count() > 0);
    live.push(Arc::downgrade(shared));
}

/// Is a runtime other than `id` built and not shut down in this process?
/// (Deadlock reports: a fiber joining another runtime's fiber or job may
/// be woken by that runtime's timers, sockets or threads.)
pub(crate) fn another_runtime_running(id: usize) -> bool {
    let live = LIVE.lock().unwrap_or_else(PoisonError::into_inner);
    live.iter()
        .filter_map(|w| w.upgrade())
        .any(|shared| shared.id != id && !shared.is_shutdown())
}

/// Does a runtime other than `id`, built and not shut down, still act
/// (`monitor::may_still_act`)? Its fibers may wake one of `id`'s through
/// a channel, a lock or a park token, so `id`'s quiet is no deadlock.
pub(crate) fn another_runtime_acting(id: usize) -> bool {
    let others: Vec<Arc<Shared>> = {
        let live = LIVE.lock().unwrap_or_else(PoisonError::into_inner);
        live.iter()
            .filter_map(|w| w.upgrade())
            .filter(|shared| shared.id != id && !shared.is_shutdown())
            .collect()
    };
    // Looked at outside the registry's lock (a look takes the other
    // runtime's own locks).
    others.iter().any(|shared| crate::monitor::may_still_act(shared))
}

/// The runtime the calling code belongs to: the running fiber's (a fiber
/// of one runtime can run on another's thread: torn down there when its
/// runtime was dropped inside the other's fiber, or on a plain thread),
/// else the worker thread's. `None` on a plain thread outside any fiber
/// (and on a blocking-pool thread: see `blocking_pool_shared`).
pub(crate) fn current_shared() -> Option<Arc<Shared>> {
    let ctx = crate::worker::context::get();
    let fiber_sched = fiber_core::current_scheduler();
    if !ctx.is_null() {
        // SAFETY: a non-null context is this thread's live worker context.
        let shared = unsafe { (*ctx).shared() };
        let same = fiber_sched
            .as_ref()
            .is_none_or(|s| std::ptr::addr_eq(Arc::as_ptr(s), Arc::as_ptr(shared)));
        if same {
            return Some(shared.clone());
        }
    }
    let sched = fiber_sched?;
    let live = LIVE.lock().unwrap_or_else(PoisonError::into_inner);
    live.iter()
        .filter_map(|w| w.upgrade())
        .find(|shared| std::ptr::addr_eq(Arc::as_ptr(shared), Arc::as_ptr(&sched)))
}

/// On a blocking-pool thread, the runtime that pool serves (while it is
/// not freed): what `Handle::current` names there.
fn blocking_pool_shared() -> Option<Arc<Shared>> {
    let id = crate::blocking::pool_runtime()?;
    let live = LIVE.lock().unwrap_or_else(PoisonError::into_inner);
    live.iter().filter_map(|w| w.upgrade()).find(|shared| shared.id == id)
}
