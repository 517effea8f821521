//! [`OnceLock`]: `std::sync::OnceLock`'s API; callers that arrive while
//! another initializes park.
//!
//! # Protocol
//!
//! `state` goes `INCOMPLETE -> RUNNING -> COMPLETE` (or back to
//! `INCOMPLETE` if the initializer panics). The caller whose CAS moves it to
//! `RUNNING` runs the initializer, writes the value, stores `COMPLETE`
//! (Release) and then, under the queue lock, wakes every waiter. A waiter
//! re-reads `state` under the queue lock before queueing: the completer
//! either ran its wake pass after the waiter queued (and finds the node) or
//! before, in which case the queue lock orders the `COMPLETE` store before
//! the waiter's read.

use crate::queue::{Node, Status, WaitQueue};
use crate::sync::{AtomicBool, AtomicUsize, Ordering, SpinLock, UnsafeCell};
use fiber_core::{fiber_wait, Interrupt, Publish, WaitOptions, WaitResult, Waitable, Waiter};
use std::fmt;

const INCOMPLETE: usize = 0;
const RUNNING: usize = 1;
const COMPLETE: usize = 2;

/// A cell written once, with the API of [`std::sync::OnceLock`]. While one
/// caller runs the initializer of [`OnceLock::get_or_init`], the others
/// park (fibers) or block (threads) until the value is there; the
/// initializer runs once. Waiting here is not a cancellation point.
///
/// # Examples
///
/// ```
/// # mod fiber { pub(crate) use fiber_sync as sync; }
/// use fiber::sync::OnceLock;
///
/// static CONFIG: OnceLock<String> = OnceLock::new();
/// let value = CONFIG.get_or_init(|| "ready".to_string());
/// assert_eq!(value, "ready");
/// assert_eq!(CONFIG.set("again".to_string()), Err("again".to_string()));
/// ```
pub struct OnceLock<T> {
    state: AtomicUsize,
    queue: SpinLock<WaitQueue>,
    /// `Some` exactly when the state is COMPLETE (written once, under
    /// RUNNING). An `Option` rather than a `MaybeUninit`: the cell needs no
    /// `Drop` of its own, so, as with `std::sync::OnceLock` (whose `Drop`
    /// is `#[may_dangle]`), a value may borrow data that is dropped before
    /// the cell.
    value: UnsafeCell<Option<T>>,
    /// Who runs the initializer while the state is RUNNING (`caller_key`;
    /// 0 for none): only to turn a re-entrant call, which would wait for
    /// itself forever, into a panic that names it.
    initializer: AtomicUsize,
}

// SAFETY: as `std::sync::OnceLock`: the value is written by one thread and
// read by many (`T: Sync`), and may be dropped on another (`T: Send`).
unsafe impl<T: Sync + Send> Sync for OnceLock<T> {}
// SAFETY: moving the lock moves the value.
unsafe impl<T: Send> Send for OnceLock<T> {}

// As `std::sync::OnceLock`: a panicking initializer leaves the cell empty.
impl<T: std::panic::RefUnwindSafe + std::panic::UnwindSafe> std::panic::RefUnwindSafe for OnceLock<T> {}
impl<T: std::panic::UnwindSafe> std::panic::UnwindSafe for OnceLock<T> {}

impl<T> OnceLock<T> {
    /// An empty cell.
    #[cfg(not(loom))]
    pub const fn new() -> OnceLock<T> {
        OnceLock {
            state: AtomicUsize::new(INCOMPLETE),
            queue: SpinLock::new(WaitQueue::new()),
            value: UnsafeCell::new(None),
            initializer: AtomicUsize::new(0),
        }
    }

    /// An empty cell.
    #[cfg(loom)]
    pub fn new() -> OnceLock<T> {
        OnceLock {
            state: AtomicUsize::new(INCOMPLETE),
            queue: SpinLock::new(WaitQueue::new()),
            value: UnsafeCell::new(None),
            initializer: AtomicUsize::new(0),
        }
    }

    /// The value, if initialized (never waits).
    pub fn get(&self) -> Option<&T> {
        // Acquire: pairs with the Release store of COMPLETE in `complete`.
        if self.state.load(Ordering::Acquire) == COMPLETE {
            // SAFETY: COMPLETE means the value was written and is never
            // written again.
            Some(unsafe { self.value_ref() })
        } else {
            None
        }
    }

    /// Initialize with `value` if empty. If another caller is initializing,
    /// wait for it first.
    ///
    /// # Errors
    ///
    /// `Err(value)` if the cell was already initialized.
    #[track_caller]
    pub fn set(&self, value: T) -> Result<(), T> {
        let mut value = Some(value);
        self.get_or_init(|| value.take().expect("the initializer runs once"));
        match value {
            None => Ok(()),
            Some(v) => Err(v),
        }
    }

    /// The value, running `f` to make it if the cell is empty. Exactly one
    /// caller runs an initializer; the others wait for its value. If `f`
    /// panics the cell stays empty, the panic propagates, and one of the
    /// waiters runs its own initializer.
    ///
    /// # Panics
    ///
    /// If called (or [`set`](Self::set) or [`wait`](Self::wait)) on the
    /// same cell from inside its own initializer, by the fiber (or thread)
    /// that runs it: `std::sync::OnceLock` leaves that unspecified (it
    /// deadlocks today); here it panics, naming the re-entrant call,
    /// instead of waiting for itself forever.
    #[track_caller]
    pub fn get_or_init<F: FnOnce() -> T>(&self, f: F) -> &T {
        if let Some(value) = self.get() {
            return value;
        }
        self.init_slow(f)
    }

    /// The value through `&mut self`.
    pub fn get_mut(&mut self) -> Option<&mut T> {
        // SAFETY: `&mut self`: no other access (`Some` only once COMPLETE).
        self.value.with_mut(|p| unsafe { (*p).as_mut() })
    }

    /// Consume the cell and return its value, if any.
    pub fn into_inner(mut self) -> Option<T> {
        self.take()
    }

    /// Take the value out, leaving the cell empty (like
    /// `std::sync::OnceLock::take`).
    pub fn take(&mut self) -> Option<T> {
        if self.state_mut() != COMPLETE {
            return None;
        }
        self.state = AtomicUsize::new(INCOMPLETE);
        // SAFETY: `&mut self`: no other access.
        self.value.with_mut(|p| unsafe { (*p).take() })
    }

    /// The value, parking the fiber (or blocking the thread) until another
    /// caller initializes the cell, like `std::sync::OnceLock::wait`. Not a
    /// cancellation point. A cell nobody initializes waits forever.
    ///
    /// # Panics
    ///
    /// If called from inside the cell's own initializer by the caller that
    /// runs it (see [`get_or_init`](Self::get_or_init)).
    #[track_caller]
    pub fn wait(&self) -> &T {
        loop {
            if let Some(value) = self.get() {
                return value;
            }
            self.refuse_reentry("OnceLock::wait");
            let mut io = OnceIo {
                node: Node::new(0),
                queue: &self.queue,
            };
            fiber_wait(
                &OnceWait {
                    state: &self.state,
                    queue: &self.queue,
                    until_complete: true,
                    poisoned: None,
                },
                &mut io,
                WaitOptions::new().interrupt(Interrupt::NotCancellable),
            );
        }
    }

    fn state_mut(&mut self) -> usize {
        // Relaxed: `&mut self` orders everything.
        self.state.load(Ordering::Relaxed)
    }

    /// # Safety
    ///
    /// The state is COMPLETE (observed with Acquire).
    unsafe fn value_ref(&self) -> &T {
        // SAFETY: see the function's contract (COMPLETE: `Some`, never
        // written again).
        self.value
            .with(|p| unsafe { (*p).as_ref() })
            .expect("a COMPLETE cell holds its value")
    }

    #[cold]
    #[track_caller]
    fn init_slow<F: FnOnce() -> T>(&self, f: F) -> &T {
        self.init_named("OnceLock::get_or_init", f)
    }

    /// `get_or_init`'s slow path; `call` names the public call in the
    /// re-entry panic (`Once` and `LazyLock` are built on this cell).
    #[track_caller]
    fn init_named<F: FnOnce() -> T>(&self, call: &str, f: F) -> &T {
        let mut f = Some(f);
        loop {
            // Acquire: pairs with the Release in `complete`.
            match self
                .state
                .compare_exchange(INCOMPLETE, RUNNING, Ordering::Acquire, Ordering::Acquire)
            {
                Ok(_) => {
                    // Relaxed: read back only by this same caller (program
                    // order); another caller may see any value but its own.
                    self.initializer.store(caller_key(), Ordering::Relaxed);
                    let reset = ResetOnPanic(self);
                    let value = (f.take().expect("one initializer per call"))();
                    std::mem::forget(reset);
                    // SAFETY: RUNNING is ours: nobody else writes or reads
                    // the value until COMPLETE.
                    self.value.with_mut(|p| unsafe { *p = Some(value) });
                    self.finish(COMPLETE);
                }
                // SAFETY: COMPLETE seen with Acquire.
                Err(COMPLETE) => return unsafe { self.value_ref() },
                Err(_) => {
                    self.refuse_reentry(call);
                    let mut io = OnceIo {
                        node: Node::new(0),
                        queue: &self.queue,
                    };
                    fiber_wait(
                        &OnceWait {
                            state: &self.state,
                            queue: &self.queue,
                            until_complete: false,
                            poisoned: None,
                        },
                        &mut io,
                        WaitOptions::new().interrupt(Interrupt::NotCancellable),
                    );
                }
            }
        }
    }

    /// Panic if the caller is the one running this cell's initializer: it
    /// would wait for itself.
    #[track_caller]
    fn refuse_reentry(&self, call: &str) {
        // Under loom the model threads share one OS thread (and have no
        // fiber): no key tells them apart, and the check is not protocol.
        if cfg!(loom) {
            return;
        }
        // Relaxed: our own store (program order) is the only value that
        // can equal our key; `finish` clears it before the state changes.
        if self.initializer.load(Ordering::Relaxed) == caller_key() {
            panic!(
                "fiber_sync::{call} called from inside the cell's own initializer: \
                 the cell would wait for itself forever"
            );
        }
    }

    /// Leave RUNNING for `to` and wake every waiter.
    fn finish(&self, to: usize) {
        // Relaxed: see `refuse_reentry`; cleared by the initializer itself,
        // so it never reads its own stale key after this.
        self.initializer.store(0, Ordering::Relaxed);
        // Release: pairs with the Acquire loads in `get` / `init_slow` /
        // the waitable, publishing the value.
        self.state.store(to, Ordering::Release);
        let wakes = self.queue.lock().drain(Status::Granted);
        WaitQueue::wake_all(wakes);
    }
}

/// Who is calling, for `OnceLock::initializer`: the running fiber, or the
/// plain thread (never 0; fibers and threads never share a key).
fn caller_key() -> usize {
    #[cfg(not(loom))]
    if let Some(id) = fiber_core::current_id() {
        return (id.0 as usize).wrapping_mul(2).wrapping_add(2);
    }
    std::thread_local! {
        static THREAD_KEY: usize = {
            static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
            // Relaxed: a unique number, no data.
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) * 2 + 1
        };
    }
    THREAD_KEY.with(|k| *k)
}

/// Puts the cell back to INCOMPLETE (and wakes the waiters) when the
/// initializer panics.
struct ResetOnPanic<'a, T>(&'a OnceLock<T>);

impl<T> Drop for ResetOnPanic<'_, T> {
    fn drop(&mut self) {
        self.0.finish(INCOMPLETE);
    }
}

impl<T> Default for OnceLock<T> {
    fn default() -> Self {
        OnceLock::new()
    }
}

impl<T> From<T> for OnceLock<T> {
    fn from(value: T) -> Self {
        let cell = OnceLock::new();
        let _ = cell.set(value);
        cell
    }
}

impl<T: Clone> Clone for OnceLock<T> {
    /// A new cell holding a clone of the value, if any (as std).
    fn clone(&self) -> Self {
        let cell = OnceLock::new();
        if let Some(value) = self.get() {
            let _ = cell.set(value.clone());
        }
        cell
    }
}

impl<T: PartialEq> PartialEq for OnceLock<T> {
    /// Equal when both are empty or both hold equal values (as std).
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
}

impl<T: Eq> Eq for OnceLock<T> {}

impl<T: fmt::Debug> fmt::Debug for OnceLock<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_tuple("OnceLock");
        match self.get() {
            Some(v) => d.field(v),
            None => d.field(&format_args!("<uninit>")),
        };
        d.finish()
    }
}

/// The `Io` of one wait.
struct OnceIo<'a> {
    node: Node,
    queue: &'a SpinLock<WaitQueue>,
}

impl Drop for OnceIo<'_> {
    fn drop(&mut self) {
        if self.node.queued {
            // Unwound while parked (shutdown): leave the queue.
            self.queue.lock().unlink(&mut self.node);
        }
    }
}

/// A wait for the initializer as a fiber-core waitable: until the state
/// leaves RUNNING (`get_or_init`), or until it is COMPLETE (`wait`).
/// `finish` wakes every queued node on each change, so a `wait` woken by
/// an initializer that panicked queues again.
struct OnceWait<'a> {
    state: &'a AtomicUsize,
    queue: &'a SpinLock<WaitQueue>,
    until_complete: bool,
    /// `Once::wait`: a poisoned `Once` ends the wait too (the waiter
    /// panics). Set before the failed initializer's `finish`; read under
    /// the queue lock in `publish`, which orders it after that `finish`'s
    /// wake pass or before the waiter's node is queued (and woken by it).
    poisoned: Option<&'a AtomicBool>,
}

impl OnceWait<'_> {
    fn done(&self, state: usize) -> bool {
        if self.until_complete {
            // Relaxed: ordered by the state's Acquire or the queue lock
            // (field docs). A poisoned `Once` whose forced closure runs is
            // RUNNING, not poisoned, for a waiter (as std's).
            state == COMPLETE || (state != RUNNING && self.poisoned.is_some_and(|p| p.load(Ordering::Relaxed)))
        } else {
            state != RUNNING
        }
    }
}

impl<'a> Waitable for OnceWait<'a> {
    type Io = OnceIo<'a>;

    fn kind(&self) -> fiber_core::WaitKind {
        fiber_core::WaitKind::Lock
    }

    fn try_complete(&self, _: &mut Self::Io) -> Option<WaitResult> {
        // Acquire: pairs with the Release in `finish`.
        self.done(self.state.load(Ordering::Acquire)).then_some(WaitResult::Ok)
    }

    fn publish(&self, waiter: &Waiter, io: &mut Self::Io) -> Publish {
        let mut queue = self.queue.lock();
        // Acquire: pairs with the Release in `finish`; under the queue lock
        // (module docs).
        if self.done(self.state.load(Ordering::Acquire)) {
            return Publish::Ready(WaitResult::Ok);
        }
        queue.push(&mut io.node, waiter, false);
        Publish::Published
    }

    fn unpublish(&self, _: &Waiter, io: &mut Self::Io) -> Option<WaitResult> {
        let status = self.queue.lock().unlink(&mut io.node);
        (status == Status::Granted).then_some(WaitResult::Ok)
    }
}

/// A one-time initialization, with the API of [`std::sync::Once`]: the
/// first [`call_once`](Once::call_once) runs its closure, and every caller
/// that arrives meanwhile parks (fibers) or blocks (threads) until it is
/// done. Waiting here is not a cancellation point.
///
/// As with std, a closure that panics *poisons* the `Once`: later
/// [`call_once`](Once::call_once) and [`wait`](Once::wait) calls panic,
/// while [`call_once_force`](Once::call_once_force) runs its closure with
/// [`OnceState::is_poisoned`] set (and clears the poison if it returns).
///
/// # Examples
///
/// ```
/// # mod fiber { pub(crate) use fiber_sync as sync; }
/// use fiber::sync::Once;
///
/// static INIT: Once = Once::new();
/// let mut runs = 0;
/// INIT.call_once(|| runs += 1);
/// INIT.call_once(|| runs += 1);
/// assert_eq!(runs, 1);
/// assert!(INIT.is_completed());
/// ```
pub struct Once {
    cell: OnceLock<()>,
    /// Set when a closure panicked; cleared by a `call_once_force` that
    /// completes. Written only by the caller running a closure (the
    /// cell's RUNNING owner).
    poisoned: AtomicBool,
}

/// What [`Once::call_once_force`] tells its closure (as
/// [`std::sync::OnceState`]).
#[derive(Debug)]
pub struct OnceState {
    poisoned: bool,
}

impl OnceState {
    /// Did an earlier closure of this `Once` panic?
    pub fn is_poisoned(&self) -> bool {
        self.poisoned
    }
}

impl Once {
    /// A `Once` whose closure has not run.
    #[cfg(not(loom))]
    pub const fn new() -> Once {
        Once {
            cell: OnceLock::new(),
            poisoned: AtomicBool::new(false),
        }
    }

    /// A `Once` whose closure has not run.
    #[cfg(loom)]
    pub fn new() -> Once {
        Once {
            cell: OnceLock::new(),
            poisoned: AtomicBool::new(false),
        }
    }

    /// Run `f` if no closure of this `Once` has completed yet; if another
    /// caller is running one, wait for it. When this returns, a closure has
    /// completed (this one or another).
    ///
    /// # Panics
    ///
    /// If the `Once` is poisoned (an earlier closure panicked), and if `f`
    /// panics (which poisons it). Also if called from inside its own
    /// closure by the caller running it (std deadlocks there).
    #[track_caller]
    pub fn call_once<F: FnOnce()>(&self, f: F) {
        if self.is_completed() {
            return;
        }
        self.run("Once::call_once", false, |_| f());
    }

    /// As [`call_once`](Self::call_once), but a poisoned `Once` runs `f`
    /// too, with [`OnceState::is_poisoned`] set; if `f` returns, the `Once`
    /// is complete and no longer poisoned.
    ///
    /// # Panics
    ///
    /// If `f` panics (the `Once` stays poisoned), or if called from inside
    /// its own closure by the caller running it.
    #[track_caller]
    pub fn call_once_force<F: FnOnce(&OnceState)>(&self, f: F) {
        self.force_named("Once::call_once_force", f);
    }

    /// `call_once_force` for a type built on this one (`LazyLock`), whose
    /// public call `call` names in the re-entry panic.
    #[track_caller]
    pub(crate) fn force_named<F: FnOnce(&OnceState)>(&self, call: &str, f: F) {
        if self.is_completed() {
            return;
        }
        self.run(call, true, f);
    }

    /// Has a closure completed (never waits)?
    pub fn is_completed(&self) -> bool {
        self.cell.get().is_some()
    }

    /// Park the fiber (or block the thread) until a closure has completed,
    /// like `std::sync::Once::wait`. A `Once` nobody completes waits for
    /// ever.
    ///
    /// # Panics
    ///
    /// If the `Once` is poisoned (also one poisoned while this waits), or
    /// if called from inside its own closure by the caller running it.
    #[track_caller]
    pub fn wait(&self) {
        self.wait_for("Once::wait", false);
    }

    /// As [`wait`](Self::wait), ignoring poisoning: waits until a closure
    /// completes.
    ///
    /// # Panics
    ///
    /// If called from inside its own closure by the caller running it.
    #[track_caller]
    pub fn wait_force(&self) {
        self.wait_for("Once::wait_force", true);
    }

    #[track_caller]
    fn run(&self, call: &str, force: bool, f: impl FnOnce(&OnceState)) {
        self.cell.init_named(call, || {
            // Relaxed: written only by RUNNING owners, whose hand-over the
            // cell's state orders (Release in `finish`, Acquire in the CAS).
            let poisoned = self.poisoned.load(Ordering::Relaxed);
            if poisoned && !force {
                panic!("Once instance has previously been poisoned");
            }
            let guard = PoisonOnUnwind(&self.poisoned);
            f(&OnceState { poisoned });
            std::mem::forget(guard);
            // Relaxed: as above; published by the COMPLETE store.
            self.poisoned.store(false, Ordering::Relaxed);
        });
    }

    #[track_caller]
    fn wait_for(&self, call: &str, force: bool) {
        loop {
            if self.is_completed() {
                return;
            }
            // Relaxed: a panicked closure's poison is ordered before its
            // `finish` (which woke us) by the cell's state (Acquire) and
            // queue lock. While a `call_once_force` closure recovers a
            // poisoned `Once` it is RUNNING: the wait waits (as std's).
            if !force && self.cell.state.load(Ordering::Acquire) != RUNNING && self.poisoned.load(Ordering::Relaxed) {
                panic!("Once instance has previously been poisoned");
            }
            self.cell.refuse_reentry(call);
            let mut io = OnceIo {
                node: Node::new(0),
                queue: &self.cell.queue,
            };
            fiber_wait(
                &OnceWait {
                    state: &self.cell.state,
                    queue: &self.cell.queue,
                    until_complete: true,
                    poisoned: (!force).then_some(&self.poisoned),
                },
                &mut io,
                WaitOptions::new().interrupt(Interrupt::NotCancellable),
            );
        }
    }
}

/// Sets the poison flag when a `Once` closure unwinds (before the cell's
/// own reset wakes the waiters, which then see it).
struct PoisonOnUnwind<'a>(&'a AtomicBool);

impl Drop for PoisonOnUnwind<'_> {
    fn drop(&mut self) {
        // Relaxed: published by the cell's `finish` (Release, queue lock).
        self.0.store(true, Ordering::Relaxed);
    }
}

impl Default for Once {
    fn default() -> Self {
        Once::new()
    }
}

impl fmt::Debug for Once {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Once").finish_non_exhaustive()
    }
}
