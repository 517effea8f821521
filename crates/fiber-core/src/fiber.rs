//! Fiber frames: the pooled per-fiber record, its coroutine, and the worker
//! side of running one (`Running::resume`).
//!
//! # Fields
//!
//! `state` is the only field shared between threads without ownership. The
//! other fields sit in `UnsafeCell`s and belong to whoever owns the fiber by
//! the state machine: the spawner while INIT, the holder of the `Runnable` /
//! `Running` token, the fiber itself while it runs, the waker that won the
//! claim until it hands the token to `schedule`, and the pool while DONE.
//!
//! # Safety: moving fibers between threads
//!
//! `corosensei::Coroutine` is `!Send` because its stack may hold `!Send`
//! values. A fiber's stack holds only (a) the spawned closure, which is
//! `Send + 'static`, (b) fiber-core's own frames, which hold only `Send`
//! data, and (c) whatever the user's code keeps in locals across a park. For
//! (c) the rule, stated in `spec/lifecycle.md`, is the same as for
//! `std::thread` + channels: a fiber may resume on another worker after any
//! park or yield, so holding a `!Send` value (an `Rc`, a `MutexGuard`, a
//! reference into a `thread_local!`) across one is a bug in user code that
//! the type system cannot see through a stackful switch. The facade's
//! fiber-local storage is the supported replacement for thread-locals.

use crate::pool::Phase;
use crate::sched::{Runnable, Schedule};
use crate::stack::{FiberStack, StackBounds};
use crate::state::{Actor, Commit, FiberState, StateWord};
use crate::sync::{Arc, AtomicBool, AtomicUsize, Ordering, UnsafeCell};
use crate::task::TaskRef;
use corosensei::{Coroutine, CoroutineResult, Yielder};
use std::fmt;
use std::panic::Location;

/// What a fiber asks of its worker when it switches away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Suspend {
    /// Cooperative yield: make me RUNNABLE again.
    Yield,
    /// I am PARKING: commit the park on your stack.
    Park,
}

/// How a fiber's body ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Exit {
    Done,
    Cancelled,
}

pub(crate) type FiberCoroutine = Coroutine<(), Suspend, Exit, FiberStack>;

/// What happened when a worker resumed a fiber.
#[derive(Debug)]
#[must_use]
pub enum RunOutcome {
    /// The fiber yielded; it is RUNNABLE and the worker must enqueue it.
    Yielded(Runnable),
    /// The fiber is PARKED; a waker owns its next enqueue.
    Parked,
    /// The fiber finished (DONE or CANCELLED); its frame is back in the pool.
    Finished,
}

/// A fiber's identity, unique for the life of the process (frames are
/// recycled; ids are not).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FiberId(pub u64);

impl fmt::Display for FiberId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "fiber {}", self.0)
    }
}

pub(crate) fn next_fiber_id() -> FiberId {
    // Not a protocol: a unique counter, never modeled, handed out to
    // threads in blocks (`unique_id_above`): unique, above the spawner's
    // id, but not in spawn order across threads. Padded: every block
    // writes it, and unpadded it shared a line with statics that every
    // worker reads on its hot paths (`tracing`'s dispatcher state, the
    // coarse clock's epoch), so each spawn took that line from the other
    // cores and their next read took it back.
    static NEXT: crossbeam_utils::CachePadded<std::sync::atomic::AtomicU64> =
        crossbeam_utils::CachePadded::new(std::sync::atomic::AtomicU64::new(1));
    thread_local! {
        static BLOCK: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
    }
    // A child's id is above its spawner's: teardown unwinds in descending
    // id order so that a scoped child goes before the fiber whose stack it
    // borrows (`FramePool::teardown`).
    let spawner = current::get();
    if spawner.is_null() {
        // A plain thread (a `blocking` call, a thread holding a `Scope`)
        // may spawn a scoped child of a fiber it knows nothing of, so a
        // block it took earlier could be below that fiber's id: take a
        // fresh id from the counter, above every id handed out so far
        // (`adversarial/id_order.rs`). Relaxed: uniqueness needs only
        // the read-modify-write's atomicity.
        return FiberId(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    }
    // SAFETY: the running fiber reads its own id.
    let floor = unsafe { (*spawner).id().0 };
    FiberId(crate::kind::unique_id_above(&NEXT, &BLOCK, floor))
}

const NO_WORKER: usize = usize::MAX;

/// One pooled fiber frame.
///
/// `repr(C)`, hot fields first: a spawn, a start, a park, a wake and a
/// finish each touch the fields above `stack`, so they share as few cache
/// lines as possible (with 100,000 parked fibers every frame is cold when
/// its fiber is resumed: each line is a miss). `stack` (between
/// incarnations), the name, the park details and the `tracing` span come
/// last.
#[repr(C)]
pub(crate) struct Fiber {
    pub(crate) state: StateWord,
    /// `JoinHandle::cancel` (`Canceller::cancel`) asked this incarnation to
    /// stop: the task's cancel flag, kept in the frame's first line (every
    /// cancellation check reads it, at each wait and each `yield_now`, and
    /// the task's block is another, often cold, line). Set by a canceller
    /// under the task's joiners lock while the task has not finished (so
    /// before the frame can be released, and before `prepare` clears it
    /// for the next incarnation); read Relaxed by the fiber (a wait's
    /// handshake fences after it, see `wake_current_wait`).
    task_cancel: AtomicBool,
    /// A hint only (Relaxed, never a protocol): the stack pointer at the
    /// fiber's last park (or where its first frames go, before it first
    /// runs), for [`Fiber::prefetch_stack`].
    parked_sp: AtomicUsize,
    sched: UnsafeCell<Option<Arc<dyn Schedule>>>,
    task: UnsafeCell<Option<TaskRef>>,
    /// The cancellation scope the fiber runs in now (fiber-jobs' job), if any.
    cancel_scope: UnsafeCell<Option<Arc<dyn crate::CancelScope>>>,
    coroutine: UnsafeCell<Option<FiberCoroutine>>,
    yielder: UnsafeCell<*const Yielder<(), Suspend>>,
    bounds: UnsafeCell<StackBounds>,
    /// Diagnostics only (Relaxed): id of the current incarnation.
    id: std::sync::atomic::AtomicU64,
    /// Affinity hint only (Relaxed).
    last_worker: AtomicUsize,
    /// Diagnostics (Relaxed): where this incarnation was spawned.
    spawned_at: std::sync::atomic::AtomicPtr<Location<'static>>,
    /// Diagnostics (Relaxed): `type_name` of what the fiber waits on, as a
    /// `fn() -> &'static str` (null when it does not wait).
    waiting_on: std::sync::atomic::AtomicPtr<()>,
    /// Diagnostics (Relaxed): what the fiber parked on, where, and when.
    park_site: std::sync::atomic::AtomicPtr<Location<'static>>,
    parked_tick: std::sync::atomic::AtomicU64,
    /// Fiber-local values (owner-only; dropped when the body ends).
    locals: UnsafeCell<Option<Box<LocalMap>>>,
    /// `span` is set (owner-only): the resume and the finish read this
    /// flag in the hot lines, not the span's line.
    has_span: UnsafeCell<bool>,
    /// Teardown unwinds raised in this incarnation (owner-only).
    teardown_raises: UnsafeCell<u32>,
    /// Depth of [`non_cancellable`] sections the fiber is in (owner-only).
    cancel_mask: UnsafeCell<u32>,
    /// The cancellation scope the innermost section holds off (its `Arc`'s
    /// address, 0 for none; owner-only): a scope installed inside the
    /// section (`with_timeout`, a nested `scope`) still cancels.
    mask_scope: UnsafeCell<usize>,
    /// The root cancellation scope a layer installed in this incarnation
    /// (`install_root_scope`; its address, 0 for none; owner-only). A
    /// section entered before it existed (`mask_scope` 0: the fiber's own
    /// level) holds it off too: it stands for the fiber's own cancellation.
    root_scope: UnsafeCell<usize>,
    /// Non-blocking operations that found nothing to do since the last
    /// budget yield ([`poll_missed`]; owner-only).
    poll_misses: UnsafeCell<u32>,
    /// Operations that completed without a switch since the fiber last
    /// switched away ([`coop_point`]; owner-only).
    ops_unswitched: UnsafeCell<u32>,
    /// The body has returned (or unwound, or will never run): what runs
    /// now is cleanup (fiber-local destructors, dropping a cancelled
    /// fiber's value or a never-started fiber's closure), where
    /// a teardown unwind would only be caught and cut the cleanup short
    /// (owner-only).
    body_returned: UnsafeCell<bool>,
    /// Set when a cancellable wait returned `Cancelled` to this incarnation.
    cancel_seen: UnsafeCell<bool>,
    /// Given up on at teardown: never resumed or released again
    /// (`ABANDONED`, then `ABANDON_REPORTED` once reported); and
    /// `ABANDONED_DEPENDENT`: given up while it waited on another fiber
    /// that was itself given up for later (in a `blocking` call or a
    /// hand-off): a scope waiting for its children, a lock's waiter,
    /// revived with them (see `FramePool::revive_abandoned_in_blocking`).
    /// One word, so that a revive is one store and a waker's "lost for
    /// good?" one load: as two flags, a waker could read the old
    /// "abandoned" and the new "not dependent" of a revive in progress and
    /// skip a fiber that was being revived.
    abandoned: std::sync::atomic::AtomicU8,
    /// Hard affinity: once it has run, this incarnation resumes only on the
    /// worker it first ran on (written at prepare, read by schedulers).
    pinned: std::sync::atomic::AtomicBool,
    /// The fiber's panic bookkeeping (see [`panicking`]), one word so that
    /// a resume reads one byte: `UNWIND_PINNED` (kept on its worker because
    /// it switched away while its thread counted as panicking; read by
    /// schedulers through `Runnable::home`), `UNWINDING` (it switched away
    /// in the middle of its own unwind), `AMBIENT_PANICKING` (its thread
    /// already counted as panicking when it was last resumed: another
    /// fiber's parked unwind). Written only by the fiber's owner (the fiber
    /// or the worker running it); Relaxed.
    unwind_flags: std::sync::atomic::AtomicU8,
    has_name: std::sync::atomic::AtomicBool,
    wait_kind: std::sync::atomic::AtomicU8,
    has_park_extra: std::sync::atomic::AtomicBool,
    /// A stack of its own size that a spawn mapped for this incarnation,
    /// from the spawn to the first run (empty otherwise: the first run
    /// takes a stack from the pool, and the finish gives it back).
    stack: UnsafeCell<Option<FiberStack>>,
    /// The body, from the spawn to the first run, which makes its
    /// coroutine (see [`PendingBody`]); owner-only.
    pending: UnsafeCell<PendingBody>,
    /// The incarnation's name, if it was given one (written at prepare,
    /// read by the fiber and by the dump; locked only when a name is or was
    /// set, see `has_name`).
    name: std::sync::Mutex<Option<std::sync::Arc<str>>>,
    /// Optional park details (what exactly, a backtrace): locked only when
    /// the last park had some, see `has_park_extra`.
    park_extra: std::sync::Mutex<ParkExtra>,
    /// The incarnation's `tracing` span (`set_fiber_spans`): set while
    /// INIT by the spawner, entered by the worker around each resume,
    /// dropped (closed) at finish. Owner-only, like the other cells.
    span: UnsafeCell<Option<tracing::Span>>,
    /// A strong count of this frame kept for the fiber's next waiter
    /// record (owner-only): the worker leaves its `Running` reference here
    /// when the fiber parks instead of dropping it, and the next clone of a
    /// record of this fiber made on this fiber takes it instead of
    /// incrementing (`Waiter::clone`). Saves an atomic increment and
    /// decrement per park. Dropped when the frame is recycled.
    spare: UnsafeCell<Option<Arc<Fiber>>>,
    /// When the current run of operations reached its first
    /// [`OP_BUDGET`] (owner-only): recorded at that point of every run,
    /// read at the later ones (cold: only a fiber that makes that many
    /// operations in a row without switching away touches it).
    ops_run_since: UnsafeCell<Option<std::time::Instant>>,
    /// When the fiber's current streak of `yield_now` calls while it
    /// unwinds began, and when the last one was (owner-only; cold: see
    /// [`Fiber::unwinding_yield_stays`]).
    unwind_yields: UnsafeCell<Option<(std::time::Instant, std::time::Instant)>>,
    /// A cancellation point told this fiber of its cancellation (a wait or
    /// `yield_now` returned `Cancelled`, or a budget look ended an
    /// operation as cancelled), and no budget look has found it not
    /// cancelled since (owner-only; see `budget_tells_cancel`): the
    /// clean-up the fiber runs after being told is not cut short at a look.
    budget_cancel_told: UnsafeCell<Option<Told>>,
}

/// The optional details of the last park.
#[derive(Default)]
struct ParkExtra {
    on: Option<crate::WaitOn>,
    backtrace: Option<std::sync::Arc<std::backtrace::Backtrace>>,
}

/// Fiber-local values by key (the address of their static).
type LocalMap = std::collections::HashMap<usize, LocalEntry>;

/// One fiber-local value, with the order it was made in: destructors run
/// newest first (as thread-local destructors do), so one made after
/// another may still read it while it is dropped.
struct LocalEntry {
    made: u64,
    value: Box<dyn std::any::Any + Send>,
}

impl LocalEntry {
    /// The value, out of its entry, to be dropped as a plain value (where
    /// the caller is, with that place's fiber-locals).
    fn into_value(mut self) -> Box<dyn std::any::Any + Send> {
        std::mem::replace(&mut self.value, Box::new(()))
    }

    fn new(value: Box<dyn std::any::Any + Send>) -> LocalEntry {
        // Not a protocol: an ordering stamp (Relaxed).
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        LocalEntry {
            made: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            value,
        }
    }
}

impl Drop for LocalEntry {
    fn drop(&mut self) {
        // Dropped outside the fiber that made it (a fiber's leftovers at
        // recycling or with its frame; a plain thread's values at its
        // exit): a fiber-local its destructor reads is a fresh temporary,
        // never a value stored in whatever storage is current here (that
        // of a worker thread, for a fiber's leftovers).
        if current::get().is_null() && DETACHED_DROPS.with(|d| d.get()) == 0 {
            let _detached = DetachedDrop::enter();
            drop(std::mem::replace(&mut self.value, Box::new(())));
        }
    }
}

thread_local! {
    /// Pins taken (+1) and ended (-1) for unwinds by fibers that ran on
    /// this thread since the scheduler last looked ([`take_unwind_pin_delta`]).
    static UNWIND_PIN_DELTA: std::cell::Cell<i64> = const { std::cell::Cell::new(0) };
}

/// A tracing subscriber's callback panicked where the runtime called it on
/// its own threads (a fiber's span entered, exited or closed by a worker;
/// a runtime event): the runtime goes on, and says so on stderr (not
/// through `tracing`, whose layer just panicked). The payload is dropped
/// here (a panic of its own destructor too).
#[cold]
pub fn layer_panicked(what: &str, payload: Box<dyn std::any::Any + Send>) {
    let msg = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string panic".to_string());
    crate::task::drop_quietly(payload);
    eprintln!(
        "fiber: a tracing subscriber panicked while {what} on a runtime thread ({msg}); the runtime \
         goes on without that callback"
    );
}

/// `Fiber::unwind_flags` bits.
const UNWIND_PINNED: u8 = 1;
const UNWINDING: u8 = 2;
const AMBIENT_PANICKING: u8 = 4;

/// Never inlined: a fiber may resume on another thread, so the
/// thread-local's address must not be kept across a switch (PITFALLS 1).
#[inline(never)]
pub(crate) fn unwind_pin_delta(d: i64) {
    // Relaxed: a fast-path hint for `take_unwind_pin_delta` on this thread
    // (the same thread reads the delta it wrote).
    ANY_UNWIND_PIN.store(true, Ordering::Relaxed);
    let _ = UNWIND_PIN_DELTA.try_with(|c| c.set(c.get() + d));
}

/// Has any fiber of this process ever been kept on its worker for an
/// unwind? Until one has, [`take_unwind_pin_delta`] is one load.
static ANY_UNWIND_PIN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

#[inline(never)]
fn take_unwind_pin_delta_slow() -> i64 {
    UNWIND_PIN_DELTA.try_with(|c| c.replace(0)).unwrap_or(0)
}

/// For schedulers: how many fibers that ran on this thread since the last
/// call were kept on their worker for an unwind (positive), minus those
/// whose pin ended (the thread was clean again at a resume, or the fiber
/// ended). A fiber that switches away while its thread counts as panicking
/// (`std::thread::panicking`, which std keeps per OS thread) must resume on
/// the same thread: `Runnable::home` names its worker until then, and a
/// scheduler that keeps a worker alive while fibers are homed there (as for
/// pinned fibers) adds this to that worker's count after each resume.
///
/// # Safety
///
/// Only the scheduler that resumes fibers on this thread calls it, right
/// after each resume: a count taken by anyone else is lost to that
/// scheduler, which may then retire the worker a fiber is kept on, and the
/// fiber would finish its unwind on another thread (std's panic counts of
/// both threads wrong).
#[inline]
pub unsafe fn take_unwind_pin_delta() -> i64 {
    if !ANY_UNWIND_PIN.load(Ordering::Relaxed) {
        return 0;
    }
    take_unwind_pin_delta_slow()
}

/// Is `fiber` (the running fiber) unwinding? See [`panicking`].
#[inline]
pub(crate) fn fiber_panicking(fiber: &Fiber) -> bool {
    std::thread::panicking() && {
        let flags = fiber.unwind_flags.load(Ordering::Relaxed);
        flags & UNWINDING != 0 || flags & AMBIENT_PANICKING == 0
    }
}

/// Is the caller unwinding from a panic? `std::thread::panicking`, per
/// fiber: std counts panics per OS thread, and a fiber whose destructor
/// waits during an unwind may park on its worker (past a bound), which
/// then counts as panicking for every fiber it runs. In a fiber this
/// answers for that fiber: a fiber resumed on a thread that already counted
/// as panicking is taken as not unwinding unless it was unwinding when it
/// switched away. (A fiber that begins a panic of its own after such a
/// resume is taken as not unwinding until its thread is clean; its lock
/// guards then do not poison.) On a plain thread this is
/// `std::thread::panicking()`.
///
/// ```
/// # mod fiber { pub(crate) use fiber_core as core; }
/// assert!(!fiber::core::panicking());
/// ```
#[inline]
pub fn panicking() -> bool {
    // Inlined to this test (every lock guard asks twice: std's global
    // panic count, one load); the per-fiber answer is out of line.
    if !std::thread::panicking() {
        return false;
    }
    panicking_slow()
}

#[cold]
#[inline(never)]
fn panicking_slow() -> bool {
    let fiber = current::get();
    if fiber.is_null() {
        return true;
    }
    // SAFETY: a non-null current pointer is the running fiber's frame, alive
    // while it runs.
    fiber_panicking(unsafe { &*fiber })
}

thread_local! {
    /// Drops of fiber-local values outside their fiber under way on this
    /// thread (`LocalEntry`'s drop).
    static DETACHED_DROPS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    /// A fresh temporary fiber-local (see `with_fresh`) is being dropped on
    /// this thread.
    static FRESH_DROPPING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A span of `DETACHED_DROPS` (left on unwind too).
struct DetachedDrop;

impl DetachedDrop {
    fn enter() -> DetachedDrop {
        DETACHED_DROPS.with(|d| d.set(d.get() + 1));
        DetachedDrop
    }
}

impl Drop for DetachedDrop {
    fn drop(&mut self) {
        DETACHED_DROPS.with(|d| d.set(d.get() - 1));
    }
}

/// `f` with a fresh value of a fiber-local that has no storage to live
/// in here (its thread's storage is being destroyed, or a value is being
/// dropped outside its fiber). The value is dropped after `f`; one made
/// while such a value is being dropped (its destructor reads its own
/// fiber-local, or two destructors read each other's) is leaked instead,
/// which ends the chain: each drop would otherwise make the next, without
/// end (a stack overflow).
fn with_fresh<T, R>(init: fn() -> T, f: impl FnOnce(&T) -> R) -> R {
    struct Fresh<T>(std::mem::ManuallyDrop<T>);
    impl<T> Drop for Fresh<T> {
        fn drop(&mut self) {
            if FRESH_DROPPING.with(|d| d.replace(true)) {
                // Made by the destructor of another fresh value: leaked.
                return;
            }
            struct Reset;
            impl Drop for Reset {
                fn drop(&mut self) {
                    FRESH_DROPPING.with(|d| d.set(false));
                }
            }
            let _reset = Reset;
            // SAFETY: dropped once, here; the value is not used again.
            unsafe { std::mem::ManuallyDrop::drop(&mut self.0) }
        }
    }
    let value = Fresh(std::mem::ManuallyDrop::new(init()));
    f(&value.0)
}

// SAFETY: every field is either atomic or an `UnsafeCell` accessed only by
// the fiber's current owner as defined by the state machine (module docs);
// the coroutine's stack holds only `Send` data by the rule in the module
// docs and `spec/lifecycle.md`, which is what corosensei's "# `Send`"
// section requires for sending a coroutine.
unsafe impl Send for Fiber {}
// SAFETY: shared access from other threads touches only `state`, `id` and
// `last_worker`, which are atomics; the cells are owner-only (see above).
unsafe impl Sync for Fiber {}

impl Fiber {
    /// A fresh INIT frame with no stack yet.
    pub(crate) fn new() -> Fiber {
        Fiber {
            state: StateWord::new(),
            task_cancel: AtomicBool::new(false),
            parked_sp: AtomicUsize::new(0),
            id: std::sync::atomic::AtomicU64::new(0),
            last_worker: AtomicUsize::new(NO_WORKER),
            sched: UnsafeCell::new(None),
            coroutine: UnsafeCell::new(None),
            stack: UnsafeCell::new(None),
            pending: UnsafeCell::new(PendingBody::empty()),
            yielder: UnsafeCell::new(std::ptr::null()),
            bounds: UnsafeCell::new(StackBounds::default()),
            task: UnsafeCell::new(None),
            spawned_at: std::sync::atomic::AtomicPtr::new(Location::caller() as *const _ as *mut _),
            waiting_on: std::sync::atomic::AtomicPtr::new(std::ptr::null_mut()),
            cancel_seen: UnsafeCell::new(false),
            cancel_mask: UnsafeCell::new(0),
            mask_scope: UnsafeCell::new(0),
            root_scope: UnsafeCell::new(0),
            poll_misses: UnsafeCell::new(0),
            ops_unswitched: UnsafeCell::new(0),
            ops_run_since: UnsafeCell::new(None),
            unwind_yields: UnsafeCell::new(None),
            budget_cancel_told: UnsafeCell::new(None),
            cancel_scope: UnsafeCell::new(None),
            locals: UnsafeCell::new(None),
            teardown_raises: UnsafeCell::new(0),
            body_returned: UnsafeCell::new(false),
            abandoned: std::sync::atomic::AtomicU8::new(NOT_ABANDONED),
            pinned: std::sync::atomic::AtomicBool::new(false),
            unwind_flags: std::sync::atomic::AtomicU8::new(0),
            name: std::sync::Mutex::new(None),
            has_name: std::sync::atomic::AtomicBool::new(false),
            wait_kind: std::sync::atomic::AtomicU8::new(0),
            park_site: std::sync::atomic::AtomicPtr::new(std::ptr::null_mut()),
            parked_tick: std::sync::atomic::AtomicU64::new(0),
            park_extra: std::sync::Mutex::new(ParkExtra {
                on: None,
                backtrace: None,
            }),
            has_park_extra: std::sync::atomic::AtomicBool::new(false),
            span: UnsafeCell::new(None),
            spare: UnsafeCell::new(None),
            has_span: UnsafeCell::new(false),
        }
    }

    #[inline]
    pub(crate) fn id(&self) -> FiberId {
        FiberId(self.id.load(std::sync::atomic::Ordering::Relaxed))
    }

    #[inline]
    pub(crate) fn last_worker(&self) -> Option<usize> {
        match self.last_worker.load(Ordering::Relaxed) {
            NO_WORKER => None,
            w => Some(w),
        }
    }

    /// Prepare an INIT frame for a new incarnation running `body`.
    ///
    /// # Safety
    ///
    /// The caller owns the frame (it is INIT and came from the pool) and
    /// `this` points to the frame inside an `Arc` that the pool keeps alive
    /// for as long as the coroutine exists. Whatever `body` borrows stays
    /// valid until the body has run to its end or been dropped (the
    /// coroutine holds it: a `'static` body satisfies this trivially; a
    /// layer that spawns borrowing bodies waits for that, as
    /// `try_spawn_unjoined` requires).
    pub(crate) unsafe fn prepare<'a>(
        this: &Arc<Fiber>,
        id: FiberId,
        sched: Arc<dyn Schedule>,
        task: TaskRef,
        spawned_at: &'static Location<'static>,
        stack: Option<FiberStack>,
        body: impl FnOnce() -> Exit + Send + 'a,
    ) {
        // No stack yet: nothing for `prefetch_stack` until the first run
        // (a hint; Relaxed).
        this.parked_sp.store(0, Ordering::Relaxed);
        // Relaxed: the last incarnation's canceller stored under its task's
        // lock before that task finished, which happened before the frame
        // came back to the pool (see the field).
        this.task_cancel.store(false, Ordering::Relaxed);
        // The body waits in the frame and its coroutine is made by the
        // first resume, on the worker that runs it, on a stack that worker
        // takes then (its warmest: the last one a fiber ended on there):
        // the spawner writes no line of any stack, and a fiber that has
        // not started holds none (`start_pending`). A body too big for the
        // frame is boxed, and only its box waits there.
        // SAFETY: the caller owns the INIT frame (contract above), whose
        // slot is empty (its last body started or was never put); the
        // first resume takes both back.
        unsafe {
            this.stack.with_mut(|s| *s = stack);
            this.pending.with_mut(|p| (*p).put(body));
        }
        this.id.store(id.0, std::sync::atomic::Ordering::Relaxed);
        this.last_worker.store(NO_WORKER, Ordering::Relaxed);
        this.spawned_at
            .store(spawned_at as *const _ as *mut _, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: the caller owns the INIT frame (contract above).
        unsafe {
            this.sched.with_mut(|s| *s = Some(sched));
            this.task.with_mut(|t| *t = Some(task));
            this.cancel_seen.with_mut(|c| *c = false);
            this.teardown_raises.with_mut(|c| *c = 0);
            this.cancel_mask.with_mut(|c| *c = 0);
            this.mask_scope.with_mut(|c| *c = 0);
            this.root_scope.with_mut(|c| *c = 0);
            this.poll_misses.with_mut(|c| *c = 0);
            this.ops_unswitched.with_mut(|c| *c = 0);
            this.budget_cancel_told.with_mut(|c| *c = None);
            this.unwind_yields.with_mut(|c| *c = None);
            this.body_returned.with_mut(|b| *b = false);
        }
        this.unwind_flags.store(0, Ordering::Relaxed);
    }

    /// The coroutine that records its yielder in the frame and runs `body`.
    ///
    /// # Safety
    ///
    /// As [`Fiber::prepare`]: `fiber_ptr` is the frame that will own the
    /// coroutine, and `body`'s borrows outlive its run or its drop.
    unsafe fn coroutine<'a>(
        fiber_ptr: *const Fiber,
        stack: FiberStack,
        body: impl FnOnce() -> Exit + Send + 'a,
    ) -> FiberCoroutine {
        let entry = move |yielder: &Yielder<(), Suspend>, ()| {
            // SAFETY: the frame owns this coroutine and outlives it
            // (`prepare`'s contract), and this fiber is the owner while it
            // runs, so writing its own yielder slot is exclusive.
            unsafe { (*fiber_ptr).yielder.with_mut(|y| *y = yielder as *const _) };
            // SAFETY: as above (the frame outlives its coroutine).
            unsafe { (*fiber_ptr).note_resumed() };
            body()
        };
        // SAFETY: the body's borrows outlive its run or its drop (the
        // caller's contract); everything else the coroutine holds is
        // `'static`.
        unsafe { Coroutine::with_stack_unchecked(stack, entry) }
    }

    /// The scheduler this fiber runs on.
    ///
    /// # Safety
    ///
    /// The caller owns the fiber (it is the running fiber, or won its wake
    /// claim), so the slot is not being written.
    pub(crate) unsafe fn scheduler(&self) -> Arc<dyn Schedule> {
        // SAFETY: see the function's contract.
        self.sched
            .with(|s| unsafe { (*s).clone() })
            .expect("a live fiber has a scheduler")
    }

    /// The scheduler this fiber runs on, borrowed from its slot.
    ///
    /// # Safety
    ///
    /// As for [`Fiber::scheduler`]; the borrow must end before the slot can
    /// change (the running fiber's own slot does not change while it runs).
    pub(crate) unsafe fn scheduler_ref(&self) -> Option<&dyn Schedule> {
        // SAFETY: see the function's contract.
        self.sched.with(|s| unsafe { (*s).as_deref() })
    }

    /// Does this fiber's scheduler slot hold `sched`?
    ///
    /// # Safety
    ///
    /// As for [`Fiber::scheduler`].
    pub(crate) unsafe fn scheduler_ptr_eq(&self, sched: &dyn Schedule) -> bool {
        // SAFETY: see the function's contract.
        self.sched.with(|s| unsafe {
            (*s).as_deref()
                .is_some_and(|mine| std::ptr::addr_eq(mine as *const dyn Schedule, sched as *const dyn Schedule))
        })
    }

    /// Run `f` with a borrow of the scheduler this fiber runs on, without
    /// cloning the `Arc` (its count is shared by every worker: a clone and
    /// a drop per call would bounce its cache line between cores).
    ///
    /// # Safety
    ///
    /// Called by the running fiber itself (nobody else writes the slot
    /// while it runs, and it does not finish during `f`).
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) unsafe fn with_scheduler<R>(&self, f: impl FnOnce(&Arc<dyn Schedule>) -> R) -> R {
        // SAFETY: see the function's contract.
        self.sched
            .with(|s| f(unsafe { (*s).as_ref() }.expect("a live fiber has a scheduler")))
    }

    /// May the running fiber yield from where it is now, outside any wait
    /// it asked for (a budget yield, the yield of a wait whose deadline
    /// passed)? Only from RUNNING: a `Waitable`'s `publish` (user code, a
    /// safe trait) runs while the fiber is PARKING, and a yield there would
    /// corrupt the park. Not while the fiber unwinds (it stays on its
    /// thread) and not in teardown.
    ///
    /// # Safety
    ///
    /// Called by the running fiber itself.
    pub(crate) unsafe fn may_yield_here(&self) -> bool {
        // Relaxed: only this fiber moves its word out of RUNNING, so its
        // own read is exact for that question.
        self.state.load(Ordering::Relaxed).state() == crate::state::FiberState::Running
            // SAFETY: see the function's contract.
            && unsafe { self.phase() } != Phase::Teardown
            && !fiber_panicking(self)
    }

    /// Where [`Fiber::may_yield_here`] says no because the fiber unwinds
    /// (or, at teardown, runs its clean-up after its body), may a missed
    /// poll's budget yield switch it away all the same? A loop of missed
    /// `try_*` calls in a destructor otherwise never let the fiber it polls
    /// for run (`adversarial/unwinding_polls.rs`):
    /// - on a worker, once the unwind has kept its thread for the bound
    ///   (as `yield_now` does: [`Fiber::unwinding_yield_stays`]); it stays
    ///   bound to the worker (`suspend`);
    /// - at teardown, at once: the pass runs one fiber at a time, and the
    ///   fiber polled for may be the next one; the pass resumes the
    ///   yielded fiber in its next round, at most `TEARDOWN_MAX_RESUMES`
    ///   times.
    ///
    /// Never from a state other than RUNNING (a `Waitable`'s `publish`).
    ///
    /// # Safety
    ///
    /// Called by the running fiber itself.
    pub(crate) unsafe fn unwinding_may_yield(&self) -> bool {
        // Relaxed: as in `may_yield_here`.
        if self.state.load(Ordering::Relaxed).state() != crate::state::FiberState::Running {
            return false;
        }
        // SAFETY: see the function's contract (owner-only slots).
        unsafe {
            if self.phase() == Phase::Teardown {
                fiber_panicking(self) || self.body_has_returned()
            } else {
                fiber_panicking(self) && !self.unwinding_yield_stays()
            }
        }
    }

    /// Has cancellation been requested for the task this fiber runs?
    ///
    /// # Safety
    ///
    /// Called by the running fiber itself.
    pub(crate) unsafe fn is_cancel_requested(&self) -> bool {
        // SAFETY: see the function's contract (an owner-only slot).
        if unsafe { self.cancel_mask.with(|m| *m) } > 0 {
            // Inside `non_cancellable`: the task's flag and the scope the
            // section holds off do not count; a scope installed inside it
            // does, and so does teardown (the workers have stopped).
            // SAFETY: as above (owner-only slots).
            return unsafe {
                self.phase() == Phase::Teardown
                    || self.cancel_scope.with(|c| {
                        (*c).as_ref()
                            .is_some_and(|c| !self.holds_off(scope_addr(c)) && c.is_cancelled())
                    })
            };
        }
        // SAFETY: see the function's contract.
        let task = unsafe { self.is_task_cancel_requested() };
        // SAFETY: as above.
        task || unsafe { self.phase() } != Phase::Open
            || self
                .cancel_scope
                .with(|c| unsafe { (*c).as_ref().is_some_and(|c| c.is_cancelled()) })
    }

    /// Is the fiber inside a [`non_cancellable`] section (its waits are not
    /// ended by the cancellation it held off, nor by shutdown before its
    /// teardown)?
    ///
    /// # Safety
    ///
    /// Called by the running fiber itself (an owner-only slot).
    pub(crate) unsafe fn in_non_cancellable(&self) -> bool {
        // SAFETY: see the function's contract.
        unsafe { self.cancel_mask.with(|m| *m) > 0 }
    }

    /// Does the innermost [`non_cancellable`] section hold off the scope at
    /// `addr`: the scope current when it was entered, or, for a section
    /// entered at the fiber's own level (no scope yet), the root scope
    /// installed since.
    ///
    /// # Safety
    ///
    /// Called by the running fiber itself (owner-only slots).
    unsafe fn holds_off(&self, addr: usize) -> bool {
        // SAFETY: see the function's contract.
        let held = unsafe { self.mask_scope.with(|m| *m) };
        // SAFETY: as above.
        addr == held || (held == 0 && addr == unsafe { self.root_scope.with(|r| *r) })
    }

    /// Did a layer install a root cancellation scope in this incarnation
    /// (`install_root_scope`)?
    ///
    /// # Safety
    ///
    /// Called by the running fiber itself (owner-only slot).
    pub(crate) unsafe fn has_root_scope(&self) -> bool {
        // SAFETY: see the function's contract.
        unsafe { self.root_scope.with(|r| *r != 0) }
    }

    /// The shutdown phase of the runtime this fiber runs on.
    ///
    /// # Safety
    ///
    /// Called by the running fiber itself (its scheduler slot is set).
    pub(crate) unsafe fn phase(&self) -> Phase {
        // SAFETY: see the function's contract; we borrow the slot, no clone.
        self.sched
            .with(|s| unsafe { (*s).as_ref().map_or(Phase::Open, |s| s.frames().phase()) })
    }

    /// Does this fiber run on the scheduler that owns `pool`?
    ///
    /// # Safety
    ///
    /// Called by the running fiber itself.
    pub(crate) unsafe fn scheduler_is(&self, pool: &crate::pool::FramePool) -> bool {
        // SAFETY: see the function's contract.
        self.sched
            .with(|s| unsafe { (*s).as_ref().is_some_and(|s| std::ptr::eq(s.frames(), pool)) })
    }

    /// Is `sched` this fiber's scheduler (the same allocation)?
    ///
    /// # Safety
    ///
    /// Called by the running fiber itself.
    #[inline]
    pub(crate) unsafe fn scheduler_ptr_is(&self, sched: &Arc<dyn Schedule>) -> bool {
        // SAFETY: see the function's contract.
        self.sched.with(|s| unsafe {
            (*s).as_ref()
                .is_some_and(|s| std::ptr::addr_eq(Arc::as_ptr(s), Arc::as_ptr(sched)))
        })
    }

    /// The body has returned or unwound: cleanup follows.
    ///
    /// # Safety
    ///
    /// Called by the running fiber itself.
    pub(crate) unsafe fn note_body_returned(&self) {
        // SAFETY: see the function's contract.
        self.body_returned.with_mut(|b| unsafe { *b = true });
    }

    /// Has the body returned (see `body_returned`)?
    ///
    /// # Safety
    ///
    /// Called by the running fiber itself.
    pub(crate) unsafe fn body_has_returned(&self) -> bool {
        // SAFETY: see the function's contract.
        self.body_returned.with(|b| unsafe { *b })
    }

    /// Count one teardown unwind raised in this incarnation; returns the
    /// count so far.
    ///
    /// # Safety
    ///
    /// Called by the running fiber itself.
    pub(crate) unsafe fn note_teardown_raise(&self) -> u32 {
        // SAFETY: see the function's contract.
        self.teardown_raises.with_mut(|c| unsafe {
            *c += 1;
            *c
        })
    }

    pub(crate) fn set_pinned(&self, pinned: bool) {
        self.pinned.store(pinned, std::sync::atomic::Ordering::Relaxed);
    }

    #[inline]
    pub(crate) fn is_pinned(&self) -> bool {
        self.pinned.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Set the incarnation's name (at prepare). Unnamed spawns after
    /// unnamed spawns take no lock.
    pub(crate) fn set_name(&self, name: Option<std::sync::Arc<str>>) {
        let named = name.is_some();
        if named || self.has_name.load(std::sync::atomic::Ordering::Relaxed) {
            *self.name.lock().unwrap_or_else(|e| e.into_inner()) = name;
            self.has_name.store(named, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// The incarnation's name.
    pub(crate) fn name(&self) -> Option<std::sync::Arc<str>> {
        if !self.has_name.load(std::sync::atomic::Ordering::Relaxed) {
            return None;
        }
        self.name.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Give the incarnation its `tracing` span.
    ///
    /// # Safety
    ///
    /// The caller owns the INIT frame (the spawner, before scheduling it).
    pub(crate) unsafe fn set_span(&self, span: tracing::Span) {
        // SAFETY: see the function's contract.
        unsafe {
            self.span.with_mut(|s| *s = Some(span));
            self.has_span.with_mut(|h| *h = true);
        }
    }

    /// Record a park (diagnostics): what, where, when, and optionally on
    /// what exactly and a backtrace (`set_park_backtraces`).
    pub(crate) fn note_park(
        &self,
        kind: crate::dump::WaitKind,
        uncancellable: bool,
        timed: bool,
        site: &'static Location<'static>,
        on: Option<crate::WaitOn>,
    ) {
        use std::sync::atomic::Ordering::Relaxed;
        let mut flags = if uncancellable { PARK_UNCANCELLABLE } else { 0 };
        if timed {
            flags |= PARK_TIMED;
        }
        // SAFETY: the running fiber (the only caller, parking itself) reads
        // its own owner-only slots.
        if uncancellable && unsafe { self.in_clean_up() } {
            flags |= PARK_IN_CLEAN_UP;
        }
        self.wait_kind.store(kind as u8 | flags, Relaxed);
        self.park_site.store(site as *const _ as *mut _, Relaxed);
        self.parked_tick.store(crate::dump::coarse_now(), Relaxed);
        let backtrace =
            crate::kind::park_backtraces().then(|| std::sync::Arc::new(std::backtrace::Backtrace::force_capture()));
        let extra = on.is_some() || backtrace.is_some();
        if extra || self.has_park_extra.load(Relaxed) {
            *self.park_extra.lock().unwrap_or_else(|e| e.into_inner()) = ParkExtra { on, backtrace };
            self.has_park_extra.store(extra, Relaxed);
        }
    }

    /// The optional details of the last park.
    fn park_extra(&self) -> (Option<crate::WaitOn>, Option<std::sync::Arc<std::backtrace::Backtrace>>) {
        if !self.has_park_extra.load(std::sync::atomic::Ordering::Relaxed) {
            return (None, None);
        }
        let extra = self.park_extra.lock().unwrap_or_else(|e| e.into_inner());
        (extra.on.clone(), extra.backtrace.clone())
    }

    /// The park is over (diagnostics).
    #[inline]
    pub(crate) fn note_unpark(&self) {
        self.wait_kind.store(0, std::sync::atomic::Ordering::Relaxed);
    }

    /// This frame as the dump shows it, if it runs a fiber.
    pub(crate) fn info(&self) -> Option<crate::dump::FiberInfo> {
        use std::sync::atomic::Ordering::Relaxed;
        let state = self.state.load(Relaxed).state();
        if matches!(state, FiberState::Init | FiberState::Done | FiberState::Cancelled) {
            return None;
        }
        let parked = matches!(state, FiberState::Parked | FiberState::Parking | FiberState::Waking);
        let waiting = if parked {
            crate::dump::WaitKind::from_u8(self.wait_kind.load(Relaxed) & PARK_KIND_MASK)
        } else {
            crate::dump::WaitKind::None
        };
        let site = self.park_site.load(Relaxed);
        let since = if parked {
            let ticks = crate::dump::coarse_now().saturating_sub(self.parked_tick.load(Relaxed));
            std::time::Duration::from_millis(ticks)
        } else {
            std::time::Duration::ZERO
        };
        let (on, backtrace) = if parked { self.park_extra() } else { (None, None) };
        Some(crate::dump::FiberInfo {
            id: self.id(),
            on,
            backtrace,
            name: self.name(),
            state,
            waiting,
            since,
            // SAFETY: the slot only ever holds `&'static Location`s (or null).
            parked_at: (parked && !site.is_null()).then(|| unsafe { &*site }),
            spawned_at: self.spawned_at(),
        })
    }

    /// What the fiber's current (or last) park waits on. Meaningful while
    /// it is PARKED.
    pub(crate) fn last_park_kind(&self) -> crate::dump::WaitKind {
        crate::dump::WaitKind::from_u8(self.wait_kind.load(std::sync::atomic::Ordering::Relaxed) & PARK_KIND_MASK)
    }

    /// Is the fiber's current (or last) park on a wait that cancellation
    /// does not end? Meaningful while it is PARKED.
    pub(crate) fn parked_uncancellable(&self) -> bool {
        self.wait_kind.load(std::sync::atomic::Ordering::Relaxed) & PARK_UNCANCELLABLE != 0
    }

    /// Is the fiber's current (or last) park a non-cancellable wait (a
    /// lock) made in clean-up: after it was told of its task's or the
    /// runtime's cancellation (a cancelled wait returned to it), while it
    /// unwinds, or past its body? Meaningful while it is PARKED.
    pub(crate) fn parked_in_clean_up(&self) -> bool {
        self.wait_kind.load(std::sync::atomic::Ordering::Relaxed) & PARK_IN_CLEAN_UP != 0
    }

    /// See [`Fiber::parked_in_clean_up`].
    ///
    /// # Safety
    ///
    /// Called by the running fiber itself (owner-only slots).
    unsafe fn in_clean_up(&self) -> bool {
        // SAFETY: see the function's contract.
        unsafe {
            fiber_panicking(self)
                || self.body_has_returned()
                || self.budget_cancel_told.with(|t| (*t).as_ref().is_some_and(|t| t.task))
        }
    }

    /// May the fiber's current (or last) park end without another fiber
    /// of its runtime acting: it has a deadline (its timer fires), or it
    /// waits for a socket (the peer may act) or a blocking-pool call?
    /// Meaningful while it is PARKED.
    pub(crate) fn parked_until_outside_event(&self) -> bool {
        let word = self.wait_kind.load(std::sync::atomic::Ordering::Relaxed);
        word & PARK_TIMED != 0
            || matches!(
                crate::dump::WaitKind::from_u8(word & PARK_KIND_MASK),
                crate::dump::WaitKind::Io | crate::dump::WaitKind::Blocking
            )
    }

    pub(crate) fn mark_abandoned(&self) {
        // Release: pairs with the Acquire in `is_given_up_for_good`, so a
        // waker that sees this also sees what teardown did before.
        // Otherwise read by teardown after it took the fiber (a claim or a
        // runnable token orders it) or by the fiber itself. An OR keeps an
        // abandonment that was already reported reported, and the
        // dependent mark set before it.
        self.abandoned.fetch_or(ABANDONED, std::sync::atomic::Ordering::Release);
    }

    /// Undo an abandonment (teardown gave up on the fiber while it waited
    /// for a call that has returned since: it may run to its end now).
    /// One store clears both the abandonment and the dependent mark.
    pub(crate) fn revive(&self) {
        // Release: as in `mark_abandoned`.
        self.abandoned
            .store(NOT_ABANDONED, std::sync::atomic::Ordering::Release);
    }

    /// Mark a fiber given up on as waiting on fibers given up for later
    /// (teardown only, before `mark_abandoned`): it is revived with them.
    pub(crate) fn mark_abandoned_dependent(&self) {
        // Release: as in `mark_abandoned` (teardown threads only, one at a
        // time: the pool's teardown rounds run on one thread at a time).
        self.abandoned
            .fetch_or(ABANDONED_DEPENDENT, std::sync::atomic::Ordering::Release);
    }

    pub(crate) fn is_abandoned_dependent(&self) -> bool {
        // Relaxed: read by teardown, which wrote it.
        self.abandoned.load(std::sync::atomic::Ordering::Relaxed) & ABANDONED_DEPENDENT != 0
    }

    /// Given up at a teardown and not to be revived: not waiting for a
    /// blocking call or a hand-off, nor given up beside fibers that do
    /// (`Later` in the pool). See `Waiter::is_lost`.
    pub(crate) fn is_given_up_for_good(&self) -> bool {
        // Acquire: pairs with the Release in `mark_abandoned` and
        // `revive`. One load: the dependent mark is set before the
        // abandonment and cleared with it, so a fiber to be revived is
        // never seen lost.
        let word = self.abandoned.load(std::sync::atomic::Ordering::Acquire);
        word & ABANDONED != 0
            && word & ABANDONED_DEPENDENT == 0
            && !matches!(
                self.last_park_kind(),
                crate::dump::WaitKind::Blocking | crate::dump::WaitKind::Handoff
            )
    }

    pub(crate) fn is_abandoned(&self) -> bool {
        // Relaxed: see `mark_abandoned`.
        self.abandoned.load(std::sync::atomic::Ordering::Relaxed) & ABANDONED != 0
    }

    /// Abandoned and not yet reported: `true` exactly once per abandoned
    /// fiber (a runtime whose worker was stuck tears down twice).
    pub(crate) fn take_abandon_report(&self) -> bool {
        // Relaxed: the report's own bookkeeping; only an abandoned fiber
        // not yet reported changes, and the other bits stay.
        self.abandoned
            .fetch_update(
                std::sync::atomic::Ordering::Relaxed,
                std::sync::atomic::Ordering::Relaxed,
                |word| (word & (ABANDONED | ABANDON_REPORTED) == ABANDONED).then_some(word | ABANDON_REPORTED),
            )
            .is_ok()
    }

    /// Has cancellation been requested for the fiber's own task (its
    /// `JoinHandle::cancel`), as opposed to a cancellation scope it runs in?
    ///
    /// # Safety
    ///
    /// Called by the running fiber itself.
    pub(crate) unsafe fn is_task_cancel_requested(&self) -> bool {
        self.task_cancel_flag()
    }

    /// Record a `JoinHandle::cancel` of this incarnation (see the field
    /// `task_cancel`). Called by the canceller under the task's joiners
    /// lock, while the task has not finished.
    pub(crate) fn request_task_cancel(&self) {
        // Relaxed: see the field.
        self.task_cancel.store(true, Ordering::Relaxed);
    }

    /// The task cancel flag as the fiber's own end reads it (`complete`,
    /// `install_root_scope`: the fiber itself, or under the joiners lock).
    pub(crate) fn task_cancel_flag(&self) -> bool {
        // Relaxed: see the field.
        self.task_cancel.load(Ordering::Relaxed)
    }

    /// Replace the fiber's cancellation scope, returning the previous one.
    ///
    /// # Safety
    ///
    /// Called by the running fiber itself.
    pub(crate) unsafe fn swap_cancel_scope(
        &self,
        scope: Option<Arc<dyn crate::CancelScope>>,
    ) -> Option<Arc<dyn crate::CancelScope>> {
        // SAFETY: see the function's contract.
        self.cancel_scope
            .with_mut(|c| unsafe { std::mem::replace(&mut *c, scope) })
    }

    /// The fiber's cancellation scope.
    ///
    /// # Safety
    ///
    /// Called by the running fiber itself.
    pub(crate) unsafe fn cancel_scope(&self) -> Option<Arc<dyn crate::CancelScope>> {
        // SAFETY: see the function's contract.
        self.cancel_scope.with(|c| unsafe { (*c).clone() })
    }

    /// The task this incarnation runs.
    ///
    /// # Safety
    ///
    /// Called by the running fiber itself.
    pub(crate) unsafe fn task(&self) -> Option<TaskRef> {
        // SAFETY: see the function's contract.
        self.task.with(|t| unsafe { (*t).clone() })
    }

    /// The task of a fiber that teardown abandoned.
    ///
    /// # Safety
    ///
    /// The fiber is abandoned and not running: nothing writes its task
    /// slot any more (only the running fiber and `prepare` do).
    pub(crate) unsafe fn abandoned_task(&self) -> Option<TaskRef> {
        // SAFETY: see the function's contract.
        self.task.with(|t| unsafe { (*t).clone() })
    }

    /// Record that a cancellable wait returned `Cancelled`.
    ///
    /// # Safety
    ///
    /// Called by the running fiber itself.
    pub(crate) unsafe fn note_cancel_seen(&self) {
        // SAFETY: see the function's contract.
        self.cancel_seen.with_mut(|c| unsafe { *c = true });
    }

    /// Did this incarnation observe its cancellation?
    ///
    /// # Safety
    ///
    /// Called by the running fiber itself.
    pub(crate) unsafe fn cancel_seen(&self) -> bool {
        // SAFETY: see the function's contract.
        self.cancel_seen.with(|c| unsafe { *c })
    }

    /// Where the current incarnation was spawned.
    #[inline]
    pub(crate) fn spawned_at(&self) -> &'static Location<'static> {
        let at = self.spawned_at.load(std::sync::atomic::Ordering::Relaxed);
        // SAFETY: the slot only ever holds `&'static Location`s.
        unsafe { &*at }
    }

    /// Record what the fiber is about to wait on (diagnostics).
    #[inline]
    pub(crate) fn set_waiting_on(&self, name: Option<fn() -> &'static str>) {
        let ptr = name.map_or(std::ptr::null_mut(), |f| f as *mut ());
        self.waiting_on.store(ptr, std::sync::atomic::Ordering::Relaxed);
    }

    /// What the fiber waits on, if it waits (diagnostics).
    pub(crate) fn waiting_on(&self) -> Option<&'static str> {
        let ptr = self.waiting_on.load(std::sync::atomic::Ordering::Relaxed);
        if ptr.is_null() {
            return None;
        }
        // SAFETY: `set_waiting_on` is the only writer and stores only
        // `fn() -> &'static str` pointers (or null).
        let f: fn() -> &'static str = unsafe { std::mem::transmute::<*mut (), fn() -> &'static str>(ptr) };
        Some(f())
    }

    /// Switch back to the worker with `request`. Checks for stack overflow
    /// first (the unguarded regime's check "no later than the next switch").
    ///
    /// # Safety
    ///
    /// Called by the running fiber itself, on its own stack.
    pub(crate) unsafe fn suspend(&self, request: Suspend) {
        let marker = 0u8;
        let sp = std::ptr::addr_of!(marker) as usize;
        // SAFETY: the running fiber owns its `bounds` and `yielder` slots;
        // the yielder lives in the coroutine's entry frame, below us on this
        // stack, for as long as the coroutine runs.
        unsafe {
            if self.bounds.with(|b| (*b).overflowed(sp)) {
                stack_overflow_abort(self);
            }
            let yielder = self.yielder.with(|y| *y);
            if request == Suspend::Park {
                // Relaxed: a prefetch hint for whoever wakes us (a yield
                // skips it: its fiber is queued warm).
                self.parked_sp.store(sp, Ordering::Relaxed);
            }
            if std::thread::panicking() {
                self.note_switch_while_panicking();
            }
            (*yielder).suspend(request);
            // Switched away and back: a new run of operations begins
            // (`coop_point`).
            self.ops_unswitched.with_mut(|c| *c = 0);
        }
        self.note_resumed();
    }

    /// The running fiber switches away while its thread counts as
    /// panicking. If the panic is its own, its unwind must end on this
    /// thread (std counts panics per thread: ended on another, it leaves
    /// this one panicking for good and wraps the other's count), and it is
    /// marked unwinding. Either way it stays on this worker until a resume
    /// finds the thread clean: a fiber that began to unwind after a resume
    /// on a thread that was already panicking cannot be told apart.
    #[cold]
    fn note_switch_while_panicking(&self) {
        let mut flags = self.unwind_flags.load(Ordering::Relaxed);
        if fiber_panicking(self) {
            flags |= UNWINDING;
        }
        if !self.is_pinned() && flags & UNWIND_PINNED == 0 {
            flags |= UNWIND_PINNED;
            unwind_pin_delta(1);
        }
        self.unwind_flags.store(flags, Ordering::Relaxed);
    }

    /// The fiber runs again (or for the first time) on this thread: note
    /// whether the thread already counts as panicking because of another
    /// fiber, and end a pin taken for an unwind once the thread is clean.
    #[inline]
    fn note_resumed(&self) {
        if std::thread::panicking() {
            self.note_resumed_panicking();
        } else {
            // One load on the common path: the frame's line is not written
            // at every resume.
            self.end_unwind_pin();
        }
    }

    #[cold]
    fn note_resumed_panicking(&self) {
        let flags = self.unwind_flags.load(Ordering::Relaxed);
        let flags = if flags & UNWINDING != 0 {
            flags & !AMBIENT_PANICKING
        } else {
            flags | AMBIENT_PANICKING
        };
        self.unwind_flags.store(flags, Ordering::Relaxed);
    }

    /// The running fiber starts an unwind of its own (the runtime raises
    /// it): from here its thread's panic count includes it, whatever it
    /// counted at the resume.
    fn note_own_unwind(&self) {
        // Relaxed: owner-only, as for the other flags (see below).
        let flags = self.unwind_flags.load(Ordering::Relaxed);
        if flags & AMBIENT_PANICKING != 0 {
            self.unwind_flags.store(flags & !AMBIENT_PANICKING, Ordering::Relaxed);
        }
    }

    /// The unwind `note_own_unwind` marked was caught while its thread
    /// still counts as panicking (another fiber's parked unwind): take the
    /// thread's state as ambient again.
    fn note_own_unwind_caught(&self) {
        // Relaxed: owner-only, as for the other flags (see below).
        let flags = self.unwind_flags.load(Ordering::Relaxed);
        if flags & (UNWINDING | AMBIENT_PANICKING) == 0 {
            self.unwind_flags.store(flags | AMBIENT_PANICKING, Ordering::Relaxed);
        }
    }

    /// Drop a pin taken for an unwind (the thread is clean again, or the
    /// fiber ends on it).
    ///
    /// Only the fiber's owner (the fiber itself, or the worker that runs it)
    /// writes these flags, so plain loads and stores do.
    #[inline]
    fn end_unwind_pin(&self) {
        let flags = self.unwind_flags.load(Ordering::Relaxed);
        if flags != 0 {
            self.unwind_flags.store(0, Ordering::Relaxed);
            if flags & UNWIND_PINNED != 0 {
                unwind_pin_delta(-1);
            }
        }
    }

    /// Is this incarnation kept on its worker for an unwind (see
    /// [`Fiber::note_switch_while_panicking`])?
    #[inline]
    pub(crate) fn is_unwind_pinned(&self) -> bool {
        self.unwind_flags.load(Ordering::Relaxed) & UNWIND_PINNED != 0
    }

    /// A `yield_now` (or a missed `try_*` poll's budget yield) of this
    /// fiber while it unwinds (a destructor, or a panic hook, polling in a
    /// loop): may it yield the thread only, staying on it? Yes for the
    /// first [`UNWINDING_WAIT_BOUND`](crate::wait::UNWINDING_WAIT_BOUND)
    /// of the unwind's streak (see [`Fiber::unwinding_stay_until`]), as an
    /// unwinding wait blocks its thread that long first; after that the
    /// fiber switches away like a parked unwind, so what it polls for can
    /// come from a fiber this thread would run (one worker, growth off):
    /// without the bound such a loop held its worker for ever
    /// (`reviews/review61.rs`; a loop of missed `try_recv`s too:
    /// `adversarial/unwinding_polls.rs`).
    ///
    /// # Safety
    ///
    /// Called by the running fiber itself (an owner-only slot).
    #[cfg(not(loom))]
    #[cold]
    pub(crate) unsafe fn unwinding_yield_stays(&self) -> bool {
        // SAFETY: see the function's contract.
        std::time::Instant::now() < unsafe { self.unwinding_stay_until() }
    }

    /// Under loom: always stays (no clock).
    #[cfg(loom)]
    pub(crate) unsafe fn unwinding_yield_stays(&self) -> bool {
        true
    }

    /// Until when may this unwinding fiber keep its thread (block it in a
    /// wait, or yield only the thread)? [`UNWINDING_WAIT_BOUND`](crate::wait::UNWINDING_WAIT_BOUND)
    /// from the start of its streak: the yields and waits of an unwind
    /// less than 50 ms apart (counted from the end of a wait), so a loop
    /// of short waits or polls shares one bound. Counted per call, each
    /// 1 ms sleep of a destructor's loop blocked its worker, and each
    /// rendezvous send of a destructor waited out the whole bound before
    /// it parked (`adversarial/unwinding_polls.rs`). Starts or extends the
    /// streak.
    ///
    /// # Safety
    ///
    /// Called by the running fiber itself (an owner-only slot).
    #[cfg(not(loom))]
    pub(crate) unsafe fn unwinding_stay_until(&self) -> std::time::Instant {
        let now = std::time::Instant::now();
        // SAFETY: see the function's contract.
        let since = unsafe {
            self.unwind_yields.with_mut(|streak| {
                let since = match *streak {
                    Some((since, last)) if now.saturating_duration_since(last) < UNWIND_STREAK_GAP => since,
                    _ => now,
                };
                *streak = Some((since, now));
                since
            })
        };
        since + crate::wait::UNWINDING_WAIT_BOUND
    }

    /// An unwinding wait of this fiber ended now: the streak goes on from
    /// here (a wait longer than the gap does not start a new one).
    ///
    /// # Safety
    ///
    /// Called by the running fiber itself (an owner-only slot).
    #[cfg(not(loom))]
    pub(crate) unsafe fn unwinding_wait_ended(&self) {
        let now = std::time::Instant::now();
        // SAFETY: see the function's contract.
        unsafe {
            self.unwind_yields.with_mut(|streak| {
                if let Some((_, last)) = (*streak).as_mut() {
                    *last = now;
                }
            })
        }
    }

    /// Ask the CPU to start loading the hot lines of the frame at `this`
    /// (the reference counts before it, and the fields up to `stack`):
    /// a caller about to touch many cold frames in a row (a timer firing a
    /// batch) prefetches a few entries ahead.
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) fn prefetch_frame(this: *const Fiber) {
        let start = (this as usize).wrapping_sub(16);
        let end = (this as usize).wrapping_add(std::mem::offset_of!(Fiber, stack));
        prefetch::range(start, end);
    }

    /// Ask the CPU to start loading the parked fiber's stack around where
    /// it switched away (the frames its resume returns through), so that
    /// the worker that resumes it finds them in cache: with many parked
    /// fibers every stack is cold, a miss per line.
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) fn prefetch_stack(&self) {
        // Relaxed: a hint; a stale value only prefetches useless lines.
        let sp = self.parked_sp.load(Ordering::Relaxed);
        if sp != 0 {
            prefetch::range(sp.wrapping_sub(64), sp.wrapping_add(PREFETCH_STACK_BYTES));
        } else {
            // Not started (no stack yet): its first run reads the body the
            // spawner wrote into the frame, on another core as often as
            // not.
            let start = std::ptr::addr_of!(self.stack) as usize;
            let end = std::ptr::addr_of!(self.pending) as usize + std::mem::size_of::<PendingBody>();
            prefetch::range(start, end);
        }
    }

    /// The worker side: resume the coroutine until it yields, parks or ends.
    pub(crate) fn run(mut fiber: Arc<Fiber>, worker: usize) -> RunOutcome {
        fiber.last_worker.store(worker, Ordering::Relaxed);
        // SAFETY: we hold execution ownership (the `Running` token): the
        // coroutine slot and the start's slots are ours.
        if fiber.coroutine.with(|c| unsafe { (*c).is_none() }) {
            // SAFETY: as above; the fiber has no coroutine yet.
            match unsafe { fiber.start_pending() } {
                // SAFETY: as above.
                Ok(coroutine) => fiber.coroutine.with_mut(|c| unsafe { *c = Some(coroutine) }),
                Err(e) => return Fiber::fail_start(fiber, &e),
            }
        }
        loop {
            // The span is entered and exited on the worker's stack, with
            // the worker's `current` (not the fiber's): a subscriber's
            // callback that parks or yields there (a `fiber::sync` lock in
            // a layer) then acts as plain-thread code, instead of
            // suspending a stack that is not the fiber's
            // (`tracing_layers.rs`).
            // SAFETY: we hold execution ownership (the `Running` token), so
            // the span slot is ours until the commit below; the guard is
            // dropped before any transition that gives the fiber away.
            // A layer's callback that panics here must not unwind into the
            // worker (it killed the worker thread with this fiber RUNNING
            // for good): the fiber runs without its span entered, and the
            // layer's panic is reported.
            let entered = fiber
                .has_span
                .with(|h| unsafe { *h })
                .then(|| fiber.span.with(|s| unsafe { (*s).as_ref() }))
                .flatten()
                .and_then(|span| {
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| span.enter()))
                        .map_err(|payload| layer_panicked("entering a fiber's span", payload))
                        .ok()
                });
            let previous = current::replace(Arc::as_ptr(&fiber));
            // SAFETY: as above for the coroutine slot; the fiber never
            // touches it.
            let result = fiber
                .coroutine
                .with_mut(|c| unsafe { (*c).as_mut().expect("a RUNNING fiber has a coroutine").resume(()) });
            current::replace(previous);
            if let Some(entered) = entered {
                if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(entered))) {
                    layer_panicked("exiting a fiber's span", payload);
                }
            }
            match result {
                CoroutineResult::Yield(Suspend::Yield) => {
                    fiber.state.transition_to_runnable_from_running();
                    return RunOutcome::Yielded(Runnable::new(fiber, Actor::Worker));
                }
                CoroutineResult::Yield(Suspend::Park) => {
                    // Yield before commit: the fiber's stack is quiescent now.
                    let frame: *const Fiber = Arc::as_ptr(&fiber);
                    // SAFETY: the fiber is PARKING: this worker owns it (and
                    // its spare slot) until the commit below.
                    let kept = unsafe { Fiber::keep_spare(fiber) };
                    // SAFETY: the frame is alive: the pool holds it, and so
                    // does its spare slot or `kept`.
                    let frame = unsafe { &*frame };
                    match frame.state.transition_to_parked(Actor::Worker) {
                        Commit::Parked => {
                            // From here a waker may own the fiber: do not
                            // touch it again (dropping `kept` only gives
                            // back a count).
                            drop(kept);
                            return RunOutcome::Parked;
                        }
                        Commit::Aborted => {
                            // SAFETY: still ours (the commit failed).
                            fiber = kept.unwrap_or_else(|| unsafe { frame.take_spare() }.expect("just kept"));
                            continue;
                        }
                    }
                }
                CoroutineResult::Return(exit) => {
                    // On the thread it ran on, before the frame is given
                    // back: a pin taken for an unwind ends with the fiber.
                    fiber.end_unwind_pin();
                    Fiber::finish(fiber, exit);
                    return RunOutcome::Finished;
                }
            }
        }
    }

    /// Make the coroutine of a body that waited in the frame for its first
    /// run (`prepare`), on the stack kept with it.
    ///
    /// # Safety
    ///
    /// The caller owns the fiber (the worker holding `Running`) and it has
    /// no coroutine yet.
    unsafe fn start_pending(&self) -> std::io::Result<FiberCoroutine> {
        // SAFETY: owner-only slot (the contract); `prepare` filled it for
        // a stack of its own size.
        let stack = match unsafe { self.stack.with_mut(|s| (*s).take()) } {
            Some(stack) => stack,
            None => {
                // SAFETY: the owner reads its scheduler slot, set at prepare.
                let sched = unsafe { self.scheduler_ref() }.expect("a live fiber has a scheduler");
                sched.frames().start_stack()?
            }
        };
        let top = corosensei::stack::Stack::base(&stack).get();
        // Where the first frames go, for `prefetch_stack` (a hint;
        // Relaxed).
        self.parked_sp
            .store(top.saturating_sub(PREFETCH_STACK_BYTES), Ordering::Relaxed);
        // SAFETY: owner-only slots (the contract). This frame owns the
        // coroutine and outlives it, and the body's borrows outlive its run
        // or drop (`prepare`'s contract).
        let started = unsafe {
            self.bounds.with_mut(|b| *b = stack.bounds());
            self.pending.with_mut(|p| (*p).start(self, stack))
        };
        match started {
            Ok(coroutine) => Ok(coroutine),
            Err(_) => panic!("a RUNNING fiber has a coroutine or a body to start"),
        }
    }

    /// A fiber whose first run found no stack (the kernel refused to map
    /// one): it ends CANCELLED without running. Its body is dropped unrun
    /// here, on the worker (as a frame dropped before its fiber ran drops
    /// it), with [`start_failure`] saying why while it drops: a joined
    /// fiber's join then reports a panic whose payload is that message (a
    /// `String`), and a layer's fiber reports the same to its layer from
    /// the body's destructor (a scoped child fails its scope). A notice on
    /// stderr says why too.
    #[cold]
    #[inline(never)]
    fn fail_start(fiber: Arc<Fiber>, e: &std::io::Error) -> RunOutcome {
        let why = format!(
            "fiber {} could not start: no stack could be mapped for it ({e})",
            fiber.id().0
        );
        eprintln!("fiber: fiber {} cannot start: no stack could be mapped for it ({e}); it ends without running, and its join reports this as its panic", fiber.id().0);
        // SAFETY: the worker holding `Running` owns every slot; the body
        // never started.
        let pending = unsafe {
            fiber
                .pending
                .with_mut(|p| std::mem::replace(&mut *p, PendingBody::empty()))
        };
        let previous = START_FAILURE.with(|f| f.replace(Some(why)));
        {
            // Outside the fiber, as leftovers at a recycle are: a
            // capture's fiber-local gets a value of its own for the drop,
            // not the resuming thread's (or fiber's) storage.
            let _detached = DetachedDrop::enter();
            crate::task::drop_quietly(pending);
        }
        START_FAILURE.with(|f| f.replace(previous));
        // SAFETY: as above; the body is gone.
        let sched = unsafe { fiber.clear_for_recycle() }.expect("a live fiber has a scheduler");
        fiber
            .state
            .transition_to_final(FiberState::Running, FiberState::Cancelled);
        sched.frames().release_frame(fiber);
        crate::counts::release(sched);
        RunOutcome::Finished
    }

    /// After the body returned: keep the stack, publish the final state and
    /// give the frame back to its pool.
    fn finish(fiber: Arc<Fiber>, exit: Exit) {
        // SAFETY: the body returned, so the worker holding `Running` is the
        // only owner of every slot.
        let sched = unsafe {
            let stack = fiber.coroutine.with_mut(|c| {
                let coroutine = (*c).take().expect("a finished fiber has a coroutine");
                coroutine.into_stack()
            });
            (stack, fiber.clear_for_recycle())
        };
        let (stack, sched) = sched;
        let sched = sched.expect("a live fiber has a scheduler");
        let to = match exit {
            Exit::Done => FiberState::Done,
            Exit::Cancelled => FiberState::Cancelled,
        };
        fiber.state.transition_to_final(FiberState::Running, to);
        sched.frames().release(fiber, stack);
        crate::counts::release(sched);
    }

    /// Keep `fiber` (a strong count of its own frame) in the frame's spare
    /// slot if it is empty; otherwise give it back.
    ///
    /// # Safety
    ///
    /// The caller owns the fiber (the running fiber itself, or its worker
    /// before the park commit).
    unsafe fn keep_spare(fiber: Arc<Fiber>) -> Option<Arc<Fiber>> {
        let frame: *const Fiber = Arc::as_ptr(&fiber);
        // SAFETY: see the function's contract; the frame is alive (we hold
        // a count).
        unsafe {
            (*frame).spare.with_mut(|s| {
                if (*s).is_none() {
                    *s = Some(fiber);
                    None
                } else {
                    Some(fiber)
                }
            })
        }
    }

    /// Take the count kept in the spare slot, if any.
    ///
    /// # Safety
    ///
    /// As for [`Fiber::keep_spare`].
    pub(crate) unsafe fn take_spare(&self) -> Option<Arc<Fiber>> {
        // SAFETY: see the function's contract.
        self.spare.with_mut(|s| unsafe { (*s).take() })
    }

    /// Clear the per-incarnation slots; returns the scheduler reference.
    ///
    /// # Safety
    ///
    /// The caller owns the fiber and its body no longer runs.
    pub(crate) unsafe fn clear_for_recycle(&self) -> Option<Arc<dyn Schedule>> {
        // SAFETY: see the function's contract.
        unsafe {
            self.task.with_mut(|t| *t = None);
            self.cancel_scope.with_mut(|c| *c = None);
            // Values a fiber-local destructor re-created after the body's
            // own clean-up must not leak into the next incarnation.
            if let Some(locals) = self.locals.with_mut(|l| (*l).take()) {
                // Their destructors get fresh temporaries of the
                // fiber-locals they read (`LocalEntry`'s drop).
                let _detached = DetachedDrop::enter();
                crate::task::drop_quietly(locals);
            }
            self.bounds.with_mut(|b| *b = StackBounds::default());
            // Closing the span ends it for the subscriber.
            if self.has_span.with_mut(|h| std::mem::replace(&mut *h, false)) {
                let span = self.span.with_mut(|s| (*s).take());
                if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(span))) {
                    layer_panicked("closing a fiber's span", payload);
                }
            }
            // The frame's count of itself: the pool holds the frame.
            drop(self.spare.with_mut(|s| (*s).take()));
            self.sched.with_mut(|s| (*s).take())
        }
    }
}

#[cold]
#[inline(never)]
fn stack_overflow_abort(fiber: &Fiber) -> ! {
    eprintln!(
        "\nfiber {} has overflowed its stack (unguarded stack beyond the vm.max_map_count \
         guard-page budget, detected at a switch)\nfatal runtime error: stack overflow; raise \
         the stack size (Builder::stack_size / FIBER_STACK_SIZE) or vm.max_map_count",
        fiber.id().0
    );
    std::process::abort()
}

/// Bytes of a parked fiber's stack above its saved stack pointer that a
/// wake prefetches (the switch frame and the frames of a typical park).
const PREFETCH_STACK_BYTES: usize = 768;

/// The largest body (closure with its captures) kept in the frame as is
/// until its first run; a bigger one (or one aligned above 16) is boxed and
/// the frame keeps the box. A spawn's body (the caller's closure with the
/// join block and the fiber's bookkeeping) is 40 to 64 bytes when the
/// closure captures a few words.
const PENDING_BODY_MAX: usize = 128;

/// The bytes of a pending body.
#[repr(C, align(16))]
struct BodyBytes([std::mem::MaybeUninit<u8>; PENDING_BODY_MAX]);

/// What starts or drops the body in a [`PendingBody`]'s bytes.
#[derive(Clone, Copy)]
struct BodyFns {
    /// Moves the body out of the bytes into a new coroutine on the stack.
    start: unsafe fn(*const Fiber, FiberStack, *const u8) -> FiberCoroutine,
    /// Drops the body in the bytes in place.
    drop: unsafe fn(*mut u8),
}

/// A frame's slot for a fiber body, moved in type-erased at the spawn and
/// out by the first resume, which makes its coroutine
/// ([`Fiber::start_pending`]); the body is written and read in place (one
/// move each way). Dropping the slot with a body in it drops the body unrun
/// (a frame dropped before its fiber first ran).
struct PendingBody {
    fns: Option<BodyFns>,
    bytes: BodyBytes,
}

impl PendingBody {
    const fn empty() -> PendingBody {
        PendingBody {
            fns: None,
            bytes: BodyBytes([std::mem::MaybeUninit::uninit(); PENDING_BODY_MAX]),
        }
    }

    /// Move `body` in, boxed when it does not fit.
    ///
    /// # Safety
    ///
    /// The slot is empty.
    unsafe fn put<B: FnOnce() -> Exit + Send>(&mut self, body: B) {
        assert!(
            self.fns.is_none(),
            "a pending body is started or dropped before the next"
        );
        if std::mem::size_of::<B>() > PENDING_BODY_MAX || std::mem::align_of::<B>() > 16 {
            // SAFETY: the caller's contract; a box fits.
            unsafe { self.put_fitting(Box::new(body)) }
        } else {
            // SAFETY: the caller's contract; `B` fits (checked).
            unsafe { self.put_fitting(body) }
        }
    }

    /// Move `body` in.
    ///
    /// # Safety
    ///
    /// The slot is empty and `B` fits in it (size and alignment).
    unsafe fn put_fitting<B: FnOnce() -> Exit + Send>(&mut self, body: B) {
        assert!(std::mem::size_of::<B>() <= PENDING_BODY_MAX && std::mem::align_of::<B>() <= 16);
        /// # Safety
        ///
        /// `bytes` holds a `B` that is not used again; as [`Fiber::prepare`]
        /// for `fiber` and the body's borrows.
        unsafe fn start<B: FnOnce() -> Exit + Send>(
            fiber: *const Fiber,
            stack: FiberStack,
            bytes: *const u8,
        ) -> FiberCoroutine {
            // SAFETY: `bytes` holds a valid `B`, read once (the contract).
            let body = unsafe { std::ptr::read(bytes.cast::<B>()) };
            // SAFETY: the contract.
            unsafe { Fiber::coroutine(fiber, stack, body) }
        }
        /// # Safety
        ///
        /// `bytes` holds a `B` that is not used again.
        unsafe fn drop_body<B>(bytes: *mut u8) {
            // SAFETY: the contract.
            unsafe { std::ptr::drop_in_place(bytes.cast::<B>()) }
        }
        // SAFETY: `bytes` is 16-aligned and `PENDING_BODY_MAX` long, which
        // holds a `B` (checked above), and holds no body now.
        unsafe { std::ptr::write(self.bytes.0.as_mut_ptr().cast::<B>(), body) };
        self.fns = Some(BodyFns {
            start: start::<B>,
            drop: drop_body::<B>,
        });
    }

    /// Move the body out into the coroutine that runs it; `None` when the
    /// slot is empty.
    ///
    /// # Safety
    ///
    /// As [`Fiber::prepare`]: `fiber` owns the coroutine and outlives it,
    /// and the body's borrows outlive its run or its drop.
    unsafe fn start(&mut self, fiber: *const Fiber, stack: FiberStack) -> Result<FiberCoroutine, FiberStack> {
        let Some(fns) = self.fns.take() else { return Err(stack) };
        // SAFETY: the bytes hold the body that `fns` belongs to, moved out
        // once here (`fns` is cleared, so `drop` does not see it again).
        Ok(unsafe { (fns.start)(fiber, stack, self.bytes.0.as_ptr().cast()) })
    }
}

impl Drop for PendingBody {
    fn drop(&mut self) {
        if let Some(fns) = self.fns.take() {
            // SAFETY: the bytes hold the body `fns` belongs to, never
            // started.
            unsafe { (fns.drop)(self.bytes.0.as_mut_ptr().cast()) }
        }
    }
}

thread_local! {
    /// Why the body being dropped on this thread never ran, while
    /// `Fiber::fail_start` drops it (see [`start_failure`]).
    static START_FAILURE: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Inside the drop of a fiber's body that never ran because its first run
/// found no stack (the kernel refused to map one): why, as a message
/// naming the fiber and the error. `None` anywhere else (a body dropped
/// unrun because its fiber was cancelled first, or at shutdown). A layer
/// whose body reports its own outcome from its destructor (fiber-jobs'
/// scoped child) reads it to report a failure, not a cancellation; the
/// join of a spawned fiber reports it as the fiber's panic.
pub fn start_failure() -> Option<String> {
    START_FAILURE.try_with(|f| f.borrow().clone()).ok().flatten()
}

/// Software prefetch: a hint to the CPU, never a memory access in the
/// language's sense.
mod prefetch {
    /// Prefetch every cache line that overlaps `[start, end)`.
    #[inline]
    pub(super) fn range(start: usize, end: usize) {
        let mut line = start & !63;
        while line < end {
            one(line);
            line += 64;
        }
    }

    #[inline]
    fn one(addr: usize) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: PREFETCHT0 is a hint: it never faults (an unmapped or
        // guard address is dropped), reads nothing the program can observe
        // and writes nothing, so any address is fine.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(addr as *const i8);
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = addr;
    }
}

/// The running fiber of this thread.
///
/// PITFALLS 1: the compiler may cache a thread-local's address across a call
/// it believes cannot migrate threads. Every access therefore goes through an
/// `#[inline(never)]` function, and no reference into the thread-local is
/// ever held across a switch.
pub(crate) mod current {
    use super::Fiber;
    use std::cell::Cell;

    thread_local! {
        static CURRENT: Cell<*const Fiber> = const { Cell::new(std::ptr::null()) };
    }

    /// The fiber running on this thread, or null.
    #[inline(never)]
    pub(crate) fn get() -> *const Fiber {
        CURRENT.with(|c| c.get())
    }

    /// Set the running fiber, returning the previous value.
    #[inline(never)]
    pub(crate) fn replace(fiber: *const Fiber) -> *const Fiber {
        CURRENT.with(|c| c.replace(fiber))
    }
}

impl fmt::Debug for Fiber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fiber")
            .field("id", &self.id())
            .field("state", &self.state.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// The id of the running fiber, or `None` on a plain thread.
pub fn current_id() -> Option<FiberId> {
    let fiber = current::get();
    // SAFETY: a non-null current pointer is the frame of the fiber running on
    // this thread, kept alive by its worker's `Running` token.
    (!fiber.is_null()).then(|| unsafe { (*fiber).id() })
}

/// The worker that last resumed the running fiber (the index its scheduler
/// passed to `Running::resume`), or `None` on a plain thread.
pub fn current_worker() -> Option<usize> {
    let fiber = current::get();
    if fiber.is_null() {
        return None;
    }
    // SAFETY: as in `current_id`.
    unsafe { (*fiber).last_worker() }
}

/// The running fiber's id for the stack-overflow signal handler: reads only
/// a const-initialized thread-local cell and an atomic (async-signal-safe).
pub(crate) fn current_id_for_signal() -> u64 {
    let fiber = current::get();
    if fiber.is_null() {
        return 0;
    }
    // SAFETY: the frame of the fiber running on this thread is alive.
    unsafe { (*fiber).id.load(std::sync::atomic::Ordering::Relaxed) }
}

/// The running fiber's name, if it was spawned with one.
pub fn current_name() -> Option<std::sync::Arc<str>> {
    let fiber = current::get();
    if fiber.is_null() {
        return None;
    }
    // SAFETY: as in `current_id`.
    unsafe { (*fiber).name() }
}

/// Is the caller running inside a fiber?
pub fn in_fiber() -> bool {
    !current::get().is_null()
}

/// Where the running fiber was spawned (`#[track_caller]` of the spawn).
pub fn current_spawn_location() -> Option<&'static Location<'static>> {
    let fiber = current::get();
    // SAFETY: as in `current_id`.
    (!fiber.is_null()).then(|| unsafe { (*fiber).spawned_at() })
}

/// How many failed polls ([`poll_missed`]) a fiber makes between two
/// budget yields (tokio's coop budget is 128 operations).
pub const POLL_BUDGET: u32 = 128;

/// A layer's non-blocking operation found nothing to do: an empty
/// `try_recv`, a full `try_send`, a `try_select` or `select!` `default`
/// with nothing ready, a failed `try_lock`; or a blocking one failed at
/// once (a channel operation on a disconnected channel, or in a cancelled
/// fiber), which a retry loop calls again. Every [`POLL_BUDGET`] such
/// misses the running fiber yields (to the back of its worker's queue), so
/// a fiber that polls in a loop lets the fibers queued behind it run, the
/// one that would end the loop included (Go preempts such a loop; tokio's
/// budget yields it). Nothing on a plain thread, while the fiber unwinds
/// (it stays on its thread) or in teardown. Not a cancellation point.
#[inline]
pub fn poll_missed() {
    let fiber = current::get();
    if fiber.is_null() {
        return;
    }
    // SAFETY: the running fiber updates its own owner-only slot.
    let misses = unsafe {
        (*fiber).poll_misses.with_mut(|m| {
            *m += 1;
            *m
        })
    };
    if misses >= POLL_BUDGET {
        // SAFETY: as above; the fiber suspends itself on its own stack and
        // its frame outlives the switch (see `yield_now`).
        unsafe { budget_yield(&*fiber) };
    }
}

/// Operations (channel, select, socket, lock and semaphore calls, waits
/// that complete without parking) between two looks at the clock by a
/// fiber that makes them in a row without switching away (tokio's
/// cooperative budget is the same 128 operations).
pub const OP_BUDGET: u32 = 128;

/// Two yields or waits of an unwinding fiber at most this far apart belong
/// to one streak (see [`Fiber::unwinding_stay_until`]).
#[cfg(not(loom))]
const UNWIND_STREAK_GAP: std::time::Duration = std::time::Duration::from_millis(50);

/// How long a run of operations that never wait may keep its worker
/// before one of them yields first: looked at every [`OP_BUDGET`]
/// operations, counted from the first such look of the run (a clock read
/// at every resume would cost every switch, so a run of slow operations,
/// 128 of which last longer than this, yields at its second look). Below
/// the monitor's stuck threshold (10 ms), so a run of quick operations
/// never reads as a stuck worker; a runnext hand-off chain beside it keeps
/// its 10 ms slice, so the run gets a fifth of the worker against it, not
/// 128 operations a slice.
pub const OP_SLICE: std::time::Duration = std::time::Duration::from_millis(2);

/// In teardown, how many operations in a row that never wait a fiber may
/// make before it is unwound at one of them: clean-up code (a destructor's
/// thousand sends) finishes, a loop that keeps going ends. A count, not a
/// time: what a destructor may do does not depend on the machine's load.
const TEARDOWN_LOOP_OPS: u32 = 64 * OP_BUDGET;

/// The running fiber is about to make an operation (or a wait of it
/// completed without parking). A run of such operations that did not
/// switch away yields here once it has lasted [`OP_SLICE`] (looked at
/// every [`OP_BUDGET`] operations): a loop on operations that always
/// succeed at once (a receive from a channel a thread keeps full, an
/// uncontended lock, a read of a socket that always has data) lets the
/// fibers queued behind it run, as Go preempts such a loop and tokio's
/// budget yields it. Called where nothing of the operation is held yet
/// (or where it has completed). Not a cancellation point; in teardown
/// the fiber is unwound from here once the run has made 8,192 operations
/// (such a loop has no other point where the runtime's drop could end it;
/// shorter clean-up code runs to its end). Nothing on a plain thread or while the
/// fiber unwinds.
#[inline]
pub fn coop_point() {
    let _ = coop_point_look();
}

/// A look of [`coop_point_look`]: made at every [`OP_BUDGET`]-th operation
/// of a run.
pub(crate) struct BudgetLook {
    /// The running fiber's frame if this operation was a look, else null.
    pub(crate) fiber: *const Fiber,
    /// The look found the run's slice used up and the fiber yielded.
    pub(crate) yielded: bool,
}

/// [`coop_point`], telling whether this operation was a look at the budget
/// and whether the fiber yielded there (a fiber that may not yield, while
/// it unwinds, is looked at again [`OP_BUDGET`] operations on: a
/// destructor's operations during an unwind are not cut short).
#[inline]
pub(crate) fn coop_point_look() -> BudgetLook {
    let fiber = current::get();
    if fiber.is_null() {
        return BudgetLook { fiber, yielded: false };
    }
    // SAFETY: the running fiber updates its own owner-only slot.
    let ops = unsafe {
        (*fiber).ops_unswitched.with_mut(|m| {
            *m = (*m).wrapping_add(1);
            *m
        })
    };
    if ops % OP_BUDGET != 0 {
        return BudgetLook {
            fiber: std::ptr::null(),
            yielded: false,
        };
    }
    // SAFETY: as above; the fiber suspends itself on its own stack and
    // its frame outlives the switch (see `yield_now`).
    let yielded = unsafe { op_budget_yield(&*fiber, ops) };
    BudgetLook { fiber, yielded }
}

/// The look at the clock of [`coop_point`], and its yield, out of line,
/// at the run's `ops`-th operation (the first look records when the run
/// began).
///
/// # Safety
///
/// `fiber` is the running fiber's frame, on its own stack.
/// Returns whether the fiber yielded.
#[cold]
#[inline(never)]
unsafe fn op_budget_yield(fiber: &Fiber, ops: u32) -> bool {
    let first = ops == OP_BUDGET;
    let now = std::time::Instant::now();
    // SAFETY: see the function's contract (owner-only slot).
    let since = unsafe {
        fiber.ops_run_since.with_mut(|s| {
            if first || (*s).is_none() {
                *s = Some(now);
            }
            (*s).unwrap_or(now)
        })
    };
    let run = now.saturating_duration_since(since);
    // SAFETY: see the function's contract. Where a yield is not allowed
    // (while unwinding), the next look comes `OP_BUDGET` operations on.
    unsafe {
        if fiber.phase() == Phase::Teardown {
            // Not unwound while it panics, nor in the clean-up after its
            // body (fiber-local destructors), nor before its run has made
            // `TEARDOWN_LOOP_OPS` operations: a destructor's operations are
            // not cut short (a raise counts towards the fiber being
            // abandoned). It never yields here (teardown resumes no one).
            if ops >= TEARDOWN_LOOP_OPS && !fiber_panicking(fiber) && !fiber.body_has_returned() {
                teardown_unwind(fiber);
            }
            return false;
        }
        if run >= OP_SLICE && (fiber.may_yield_here() || fiber.unwinding_may_yield()) {
            fiber.suspend(Suspend::Yield);
            return true;
        }
    }
    false
}

/// A cancellation point returned `Cancelled` to the running fiber (see
/// the field `budget_cancel_told`).
///
/// # Safety
///
/// Called by the running fiber itself (owner-only slot).
pub(crate) unsafe fn note_cancel_told(fiber: &Fiber) {
    // SAFETY: see the function's contract.
    unsafe {
        let told = told_now(fiber);
        fiber.budget_cancel_told.with_mut(|t| *t = Some(told));
    }
}

/// What a cancellation point told the fiber (see `budget_tells_cancel`).
pub(crate) struct Told {
    /// Its task (or the runtime's shutdown) was cancelled: no cancellation
    /// from further out can come, so it is told again only in another
    /// scope whose deadline has passed (`CancelScope::deadline_passed`).
    task: bool,
    /// The cancellation scope current when it was told. Weak: it keeps
    /// the scope's allocation, so a scope freed since and another made at
    /// the same address is not taken for the one told.
    scope: Option<std::sync::Weak<dyn crate::CancelScope>>,
    /// That scope's deadline had passed when told.
    deadline: bool,
}

/// The cancellation the running fiber sees now, as a tell would record it.
///
/// # Safety
///
/// Called by the running fiber itself (owner-only slots).
unsafe fn told_now(fiber: &Fiber) -> Told {
    // SAFETY: see the function's contract.
    unsafe {
        let held_off = fiber.cancel_mask.with(|m| *m) > 0;
        Told {
            // Inside `non_cancellable` the task's cancellation is held
            // off, so a tell there is not of it (only teardown's is), but
            // one told before the section stays told (review 55: it was
            // told again after the section, and a clean-up send cut).
            task: if held_off {
                fiber.phase() == Phase::Teardown
                    || fiber.budget_cancel_told.with(|t| (*t).as_ref().is_some_and(|t| t.task))
            } else {
                fiber.is_task_cancel_requested() || fiber.phase() != Phase::Open
            },
            scope: fiber.cancel_scope.with(|c| (*c).as_ref().map(Arc::downgrade)),
            deadline: fiber
                .cancel_scope
                .with(|c| (*c).as_ref().is_some_and(|scope| scope.deadline_passed())),
        }
    }
}

/// At a budget look of a cancellable operation: should it end as
/// cancelled? Only if the fiber is cancelled and has not been told of
/// this cancellation yet (by a look, a wait or `yield_now`), so the
/// clean-up a told fiber runs afterwards (a destructor's sends after
/// `sleep(d)?`) is not cut short at a look. It is told again when the
/// cancellation it sees now is another: its task or the runtime's
/// shutdown after only a scope was told (`JoinHandle::cancel` after an
/// expired `with_timeout`), or another scope than the one told (the next
/// `with_timeout` of an outer loop, or an enclosing one after an inner one
/// expired); after its task was told, only another scope whose deadline
/// has passed (a `with_timeout` opened in clean-up: its deadline still
/// ends a loop in it, while the task's cancellation, told already, cuts
/// no clean-up short; `reviews/review52.rs`). A look outside `non_cancellable` that finds the fiber not
/// cancelled forgets the tell; inside the section a held-off cancellation
/// has not ended, so the tell stands
/// (`reviews/review50.rs`).
///
/// # Safety
///
/// Called by the running fiber itself (owner-only slots).
pub(crate) unsafe fn budget_tells_cancel(fiber: &Fiber) -> bool {
    // SAFETY: see the function's contract.
    unsafe {
        let requested = fiber.is_cancel_requested();
        if !requested {
            // Inside `non_cancellable` the held-off cancellation is not
            // an end of it: no re-arm there.
            if fiber.cancel_mask.with(|m| *m) == 0 {
                fiber.budget_cancel_told.with_mut(|t| *t = None);
            }
            return false;
        }
        let now = told_now(fiber);
        let tell = fiber.budget_cancel_told.with(|t| match &*t {
            None => true,
            Some(t) if !t.task && now.task => true,
            Some(t) => {
                let cur = fiber
                    .cancel_scope
                    .with(|c| (*c).as_ref().map(|a| Arc::as_ptr(a) as *const ()));
                let was = t.scope.as_ref().map(|w| w.as_ptr() as *const ());
                // After a task tell, a new scope must have a cancellation
                // of its own: a passed deadline.
                let passed = || {
                    fiber
                        .cancel_scope
                        .with(|c| (*c).as_ref().is_some_and(|scope| scope.deadline_passed()))
                };
                (cur != was && (!t.task || passed())) || (t.task && cur == was && !t.deadline && passed())
            }
        });
        if tell {
            fiber.budget_cancel_told.with_mut(|t| *t = Some(now));
        }
        tell
    }
}

/// The yield of [`poll_missed`], out of line.
///
/// # Safety
///
/// `fiber` is the running fiber's frame.
#[cold]
#[inline(never)]
unsafe fn budget_yield(fiber: &Fiber) {
    // SAFETY: see the function's contract.
    if !unsafe { fiber.may_yield_here() || fiber.unwinding_may_yield() } {
        // Counted again at the next miss, where a yield may be allowed.
        return;
    }
    // SAFETY: as above (owner-only slots; the fiber suspends itself).
    unsafe {
        fiber.poll_misses.with_mut(|m| *m = 0);
        fiber.suspend(Suspend::Yield);
    }
}

/// Yield the running fiber to its scheduler (it becomes RUNNABLE and is
/// enqueued again). A cancellation point: `Err(Cancelled)` once the fiber's
/// task or job is cancelled (the yield still happens). On a plain thread
/// this is `std::thread::yield_now` and always `Ok`.
pub fn yield_now() -> Result<(), crate::Cancelled> {
    let fiber = current::get();
    if fiber.is_null() {
        std::thread::yield_now();
        return Ok(());
    }
    // SAFETY: the running fiber suspends itself on its own stack and reads
    // its own slots; `fiber` is its frame (see `current_id`). The pointer is
    // re-read after resume only through `current::get`, never cached from
    // the thread-local.
    unsafe {
        // Relaxed: only this fiber moves its word out of RUNNING, so its
        // own read is exact. Anything else is a `Waitable::publish` (the
        // fiber is PARKING) that yields: a panic there is the wait's own
        // (`fiber_wait_slow` puts the word back), where a yield would move
        // the word of a parking fiber (an illegal transition on the
        // worker's stack in checked builds; a lost wake otherwise).
        if (*fiber).state.load(Ordering::Relaxed).state() != crate::state::FiberState::Running {
            panic!(
                "fiber::yield_now called inside a Waitable's publish (the fiber is parking): a publish must \
                 not yield, sleep or wait"
            );
        }
        if (*fiber).phase() == Phase::Teardown {
            teardown_unwind(&*fiber);
            return Err(crate::Cancelled);
        }
        if fiber_panicking(&*fiber) && (*fiber).unwinding_yield_stays() {
            // Unwinding: stay on this thread (see `wait::unwinding_fiber_wait`).
            std::thread::yield_now();
        } else {
            // Unwinding for longer than the bound: progress wins, as for a
            // wait (the fiber stays bound to this worker: `suspend`).
            (*fiber).suspend(Suspend::Yield);
        }
        if (*fiber).is_cancel_requested() {
            note_cancel_told(&*fiber);
            return Err(crate::Cancelled);
        }
    }
    Ok(())
}

/// The panic payload of a teardown unwind (see [`is_shutdown_unwind`]).
struct ShutdownUnwind;

impl Drop for ShutdownUnwind {
    /// The unwind was caught (the payload dies with its catch): if its
    /// thread still counts as panicking, that is another fiber's unwind
    /// again, as it was before `note_own_unwind`.
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let fiber = current::get();
        if !fiber.is_null() {
            // SAFETY: a non-null current pointer is the running fiber's
            // frame, alive while it runs; its unwind flags are written by
            // it (or its worker) only.
            unsafe { &*fiber }.note_own_unwind_caught();
        }
    }
}

/// Is `payload` the unwind that runtime teardown raises in a fiber at a
/// cancellation point? Code that catches panics (`catch_unwind`) and wants
/// to let shutdown proceed should resume such a payload.
pub fn is_shutdown_unwind(payload: &(dyn std::any::Any + Send)) -> bool {
    payload.is::<ShutdownUnwind>()
}

/// `Fiber::wait_kind` bit: the park is on an `Interrupt::NotCancellable`
/// wait (above every `WaitKind` value).
const PARK_UNCANCELLABLE: u8 = 0x80;

/// `Fiber::wait_kind` bit: the park has a deadline.
const PARK_TIMED: u8 = 0x40;

/// `Fiber::wait_kind` bit: a non-cancellable park made in clean-up (see
/// [`Fiber::parked_in_clean_up`]).
const PARK_IN_CLEAN_UP: u8 = 0x20;

/// The `WaitKind` part of `Fiber::wait_kind`.
const PARK_KIND_MASK: u8 = 0x1f;

/// `Fiber::abandoned`: not given up on.
const NOT_ABANDONED: u8 = 0;
/// `Fiber::abandoned` bit: given up on at teardown.
const ABANDONED: u8 = 1;
/// `Fiber::abandoned` bit: the abandonment was reported, its joiners told.
const ABANDON_REPORTED: u8 = 2;
/// `Fiber::abandoned` bit: given up beside fibers given up for later.
const ABANDONED_DEPENDENT: u8 = 4;

/// Teardown unwinds a fiber may catch before it is abandoned.
const TEARDOWN_MAX_RAISES: u32 = 8;

/// The running fiber reached a cancellation point while its runtime is in
/// teardown: unwind its stack. Returns without unwinding when the fiber is
/// already unwinding (a wait inside a destructor: starting a second panic
/// would abort), so the caller reports `Cancelled`. A fiber that caught
/// the unwind too many times is abandoned: it parks for good, unpublished.
///
/// # Safety
///
/// Called by the running fiber itself, on its own stack.
pub(crate) unsafe fn teardown_unwind(fiber: &Fiber) {
    // Waits that return `Cancelled` at once because the thread is
    // panicking count too: the thread may be "panicking" only because
    // another fiber parked in the middle of its unwind (spec/lifecycle.md
    // section 10), and a fiber that loops on such a wait would otherwise
    // spin on the teardown thread for ever instead of being abandoned.
    // After the body: a fiber-local destructor (or the drop of a cancelled
    // fiber's value) that waits gets `Cancelled` and runs to its end, as a
    // destructor during an unwind does; an unwind raised there would be
    // caught at once and cut the rest of the destructor short.
    // SAFETY: see the function's contract.
    let panicking = fiber_panicking(fiber) || unsafe { fiber.body_has_returned() };
    let limit = if panicking {
        TEARDOWN_MAX_PANICKING_WAITS
    } else {
        TEARDOWN_MAX_RAISES
    };
    // SAFETY: see the function's contract.
    if unsafe { fiber.note_teardown_raise() } > limit {
        fiber.mark_abandoned();
        loop {
            fiber.state.transition_to_parking();
            // SAFETY: see the function's contract. Nobody holds a waiter
            // record for this park, and teardown skips abandoned frames.
            unsafe { fiber.suspend(Suspend::Park) };
        }
    }
    if panicking {
        return;
    }
    // This unwind is the fiber's own: resumed on a thread that already
    // counted as panicking (another fiber parked mid-unwind), it would
    // otherwise be taken as not unwinding, and its lock guards would not
    // poison (`conformance::std_sync::a_destructor_locking_at_teardown_never_shares_the_lock`).
    fiber.note_own_unwind();
    std::panic::resume_unwind(Box::new(ShutdownUnwind))
}

/// Cancelled waits a fiber may make at teardown while its thread counts
/// as panicking (a destructor's waits during an unwind return at once)
/// before it is abandoned as looping.
const TEARDOWN_MAX_PANICKING_WAITS: u32 = 1024;

/// A cancellation scope a fiber can run in (fiber-jobs' jobs implement it):
/// while set, a cancellable wait of the fiber ends with `Cancelled` once the
/// scope reports cancellation.
///
/// The layer that installed a scope gets its own type back by upcasting the
/// `Arc<dyn CancelScope>` to `Arc<dyn Any + Send + Sync>` and calling
/// `Arc::downcast`, which checks the real type (no method a user type could
/// implement is trusted for that).
pub trait CancelScope: Send + Sync + std::any::Any {
    /// Has this scope been cancelled?
    ///
    /// Asked at every cancellable wait of a fiber running in the scope (at
    /// the point where the wait commits to parking, so it should be a load
    /// or two, and it must not wait itself). A panic from it is the
    /// panic of the wait that asked, raised with the fiber running again,
    /// or, asked once the fiber's body has ended, the fiber's own panic
    /// (its join reports it): it never reaches the worker thread.
    fn is_cancelled(&self) -> bool;

    /// Cancel this scope (called by `JoinHandle::cancel` on a fiber's root
    /// scope). The default does nothing.
    fn cancel(&self) {}

    /// Has a deadline of this scope passed (its own, or one it took from
    /// an enclosing scope)? A cancellation that the fiber's task being
    /// cancelled does not explain: a fiber already told of its task's
    /// cancellation is told again at an operation-budget look when it
    /// runs in a scope whose deadline has passed (a `with_timeout` opened
    /// in clean-up after `sleep(d)?` still ends a loop of operations that
    /// never wait). Asked only then; like
    /// [`is_cancelled`](Self::is_cancelled) it must not wait. It runs on
    /// the fiber, inside the operation that looks at its budget: a panic
    /// from it unwinds out of that operation as its own panic. The default
    /// is `false` (no deadline).
    fn deadline_passed(&self) -> bool {
        false
    }

    /// The fiber whose root scope this is has finished its body, called on
    /// that fiber: `panicked` if it panicked, `cancelled` if the fiber saw a
    /// cancellation (its task's, this scope's, or its runtime's shutdown).
    /// Returns whether the scope ended cancelled (`None`: not ended yet);
    /// the fiber's `JoinHandle` reports the same. The default ends nothing
    /// and returns `None`.
    ///
    /// Only fiber-core calls it: the [`RootScopeCall`] argument cannot be
    /// made anywhere else, so code holding the scope (from
    /// [`current_cancel_scope`]) cannot end a live fiber's root scope.
    fn fiber_finished(self: Arc<Self>, call: RootScopeCall, panicked: bool, cancelled: bool) -> Option<bool> {
        let _ = (call, panicked, cancelled);
        None
    }

    /// The fiber whose root scope this is was abandoned at its runtime's
    /// teardown (it did not return within the grace time: e.g. a
    /// `blocking` call outlived it) and never finishes its body: end the
    /// scope as cancelled, as its `JoinHandle` reports. Called on the
    /// teardown thread, not on the fiber, and only by fiber-core (see
    /// [`RootScopeCall`]). The default does nothing.
    fn fiber_abandoned(self: Arc<Self>, call: RootScopeCall) {
        let _ = call;
    }
}

/// The proof, passed to [`CancelScope::fiber_finished`] and
/// [`CancelScope::fiber_abandoned`], that fiber-core makes the call: only
/// fiber-core can make one (its field is private), so those hooks cannot be
/// called on a scope by anyone else:
///
/// ```compile_fail,E0451
/// # mod fiber { pub(crate) use fiber_core as core; }
/// // A fiber's own root job, reachable from safe code...
/// if let Some(job) = fiber::core::current_cancel_scope() {
///     // ...cannot be ended behind the fiber's back.
///     job.fiber_abandoned(fiber::core::RootScopeCall { _private: () });
/// }
/// ```
#[derive(Debug)]
pub struct RootScopeCall {
    _private: (),
}

impl RootScopeCall {
    pub(crate) fn new() -> RootScopeCall {
        RootScopeCall { _private: () }
    }
}

/// Make `scope` the running fiber's root cancellation scope: it becomes the
/// fiber's current scope, `JoinHandle::cancel` cancels it, and it hears
/// `fiber_finished` when the body ends. Returns `Ok(true)` if the fiber's
/// task was already cancelled (the caller should cancel the scope), and
/// gives the scope back on a plain thread or when the fiber already runs in
/// a scope.
pub fn install_root_scope(scope: Arc<dyn CancelScope>) -> Result<bool, Arc<dyn CancelScope>> {
    let fiber = current::get();
    if fiber.is_null() {
        return Err(scope);
    }
    // SAFETY: the running fiber reads and writes its own slots.
    unsafe {
        if (*fiber).cancel_scope().is_some() {
            return Err(scope);
        }
        let Some(task) = (*fiber).task() else {
            return Err(scope);
        };
        let Some(cancelled) = task.install_root_scope(scope.clone()) else {
            return Err(scope);
        };
        (*fiber).root_scope.with_mut(|r| *r = scope_addr(&scope));
        (*fiber).swap_cancel_scope(Some(scope));
        Ok(cancelled)
    }
}

/// Would [`install_root_scope`] accept a scope now: the caller is a fiber,
/// outside any cancellation scope, whose task takes a root scope (a fiber
/// spawned with a `JoinHandle`; not one a layer spawned with
/// `try_spawn_unjoined`, after its body). Lets a layer skip making a scope
/// it could not install.
pub fn accepts_root_scope() -> bool {
    let fiber = current::get();
    if fiber.is_null() {
        return false;
    }
    // SAFETY: the running fiber reads its own slots.
    unsafe { (*fiber).cancel_scope().is_none() && (*fiber).task().is_some_and(|t| t.takes_root_scope()) }
}

/// Has the running fiber been asked to stop: its task cancelled
/// (`JoinHandle::cancel`), the job it runs in cancelled, or its runtime
/// shutting down? `false` on a plain thread.
pub fn is_cancel_requested() -> bool {
    let fiber = current::get();
    // SAFETY: the running fiber reads its own slots.
    !fiber.is_null() && unsafe { (*fiber).is_cancel_requested() }
}

/// Run `f` with cancellation held off for the calling fiber (Kotlin's
/// `withContext(NonCancellable)`): inside it, waits are not interrupted by
/// a cancelled task or job, `yield_now` returns `Ok` and
/// `fiber::is_cancelled()` is false, so clean-up code of a cancelled fiber
/// can still sleep, send a last message or join. A cancellation requested
/// meanwhile is not lost: it is seen again once `f` returns (or unwinds).
/// A runtime's shutdown still ends such waits once its grace time is over
/// (teardown). Nested sections nest. On a plain thread this just calls `f`.
///
/// ```
/// # mod fiber { pub(crate) use fiber_core as core; }
/// // On a plain thread it just runs the closure.
/// assert_eq!(fiber::core::non_cancellable(|| 1 + 1), 2);
/// ```
pub fn non_cancellable<R>(f: impl FnOnce() -> R) -> R {
    /// Ends the section on the fiber that entered it, on return or unwind,
    /// giving back the enclosing section's held-off scope.
    struct Unmask(*const Fiber, usize);
    impl Drop for Unmask {
        fn drop(&mut self) {
            // SAFETY: the frame of the fiber that entered the section and
            // is running it still (a fiber's frame outlives its body); the
            // slots are owner-only.
            unsafe {
                (*self.0).cancel_mask.with_mut(|m| *m -= 1);
                (*self.0).mask_scope.with_mut(|m| *m = self.1);
            }
        }
    }
    let fiber = current::get();
    if fiber.is_null() {
        return f();
    }
    // SAFETY: the running fiber's own owner-only slots.
    let outer = unsafe {
        let scope = (*fiber).cancel_scope.with(|c| (*c).as_ref().map_or(0, scope_addr));
        (*fiber).cancel_mask.with_mut(|m| *m += 1);
        (*fiber).mask_scope.with_mut(|m| std::mem::replace(&mut *m, scope))
    };
    let _unmask = Unmask(fiber, outer);
    f()
}

/// The address that identifies a cancellation scope.
fn scope_addr(scope: &Arc<dyn CancelScope>) -> usize {
    Arc::as_ptr(scope) as *const () as usize
}

/// Is the running fiber directly inside a [`non_cancellable`] section (its
/// cancellation scope is the one the section holds off)? A job layer makes
/// the jobs it creates there (a `scope`, a `with_timeout`) without a parent,
/// so that the cancellation held off does not reach them (Kotlin: the
/// children of `NonCancellable` are not cancelled with the outer job).
/// `false` on a plain thread.
pub fn cancellation_held_off() -> bool {
    let fiber = current::get();
    if fiber.is_null() {
        return false;
    }
    // SAFETY: the running fiber's own owner-only slots.
    unsafe {
        (*fiber).cancel_mask.with(|m| *m) > 0
            && (*fiber).holds_off((*fiber).cancel_scope.with(|c| (*c).as_ref().map_or(0, scope_addr)))
    }
}

/// Is the running fiber's runtime past its shutdown's grace time, tearing
/// its fibers down (a cancellable wait unwinds the fiber instead of
/// returning `Cancelled`)? `false` on a plain thread.
pub fn is_tearing_down() -> bool {
    let fiber = current::get();
    // SAFETY: the running fiber reads its own slots.
    !fiber.is_null() && unsafe { (*fiber).phase() } == Phase::Teardown
}

/// Is the running fiber's runtime shutting down (its fibers are being
/// cancelled)? `false` on a plain thread. A job layer ends the jobs a
/// fiber finishes from here on as cancelled, as the fiber's own outcome is.
pub fn is_shutting_down() -> bool {
    let fiber = current::get();
    // SAFETY: the running fiber reads its own slots.
    !fiber.is_null() && unsafe { (*fiber).phase() } != Phase::Open
}

/// Replace the running fiber's cancellation scope, returning the previous
/// one (`None` and no effect on a plain thread).
pub fn swap_cancel_scope(scope: Option<Arc<dyn CancelScope>>) -> Option<Arc<dyn CancelScope>> {
    let fiber = current::get();
    if fiber.is_null() {
        return None;
    }
    // SAFETY: the running fiber updates its own slot.
    unsafe { (*fiber).swap_cancel_scope(scope) }
}

/// The running fiber's cancellation scope.
pub fn current_cancel_scope() -> Option<Arc<dyn CancelScope>> {
    let fiber = current::get();
    if fiber.is_null() {
        return None;
    }
    // SAFETY: the running fiber reads its own slot.
    unsafe { (*fiber).cancel_scope() }
}

/// The fiber a plain thread works for (a `fiber::blocking` call it waits
/// for): its id and its cancellation scope, taken on the fiber with
/// [`OnBehalf::of_current`] and set on the pool thread with
/// [`run_on_behalf_of`]. For misuse checks only (a join there of the
/// waiting fiber itself, or of a job it runs in, would wait for itself).
#[cfg(not(loom))]
#[derive(Clone, Default)]
pub struct OnBehalf {
    fiber: Option<FiberId>,
    scope: Option<Arc<dyn CancelScope>>,
}

#[cfg(not(loom))]
impl OnBehalf {
    /// The running fiber's id and scope (empty on a plain thread).
    pub fn of_current() -> OnBehalf {
        OnBehalf {
            fiber: current_id(),
            scope: current_cancel_scope(),
        }
    }
}

#[cfg(not(loom))]
impl fmt::Debug for OnBehalf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OnBehalf")
            .field("fiber", &self.fiber)
            .finish_non_exhaustive()
    }
}

#[cfg(not(loom))]
thread_local! {
    /// The fiber a plain thread works for (see [`run_on_behalf_of`]).
    static ON_BEHALF_OF: std::cell::RefCell<OnBehalf> = std::cell::RefCell::new(OnBehalf::default());
}

/// Run `f` on this plain thread on behalf of the fiber `of` describes (a
/// blocking-pool call: that fiber waits for it), so that
/// [`behalf_cancel_scope`] and [`behalf_fiber_id`] can tell a layer whose
/// work this is. Restored when `f` returns or unwinds.
#[cfg(not(loom))]
pub fn run_on_behalf_of<R>(of: OnBehalf, f: impl FnOnce() -> R) -> R {
    struct Restore(OnBehalf);
    impl Drop for Restore {
        fn drop(&mut self) {
            let previous = std::mem::take(&mut self.0);
            let _ = ON_BEHALF_OF.try_with(|c| *c.borrow_mut() = previous);
        }
    }
    let previous = ON_BEHALF_OF.try_with(|c| c.replace(of)).unwrap_or_default();
    let _restore = Restore(previous);
    f()
}

/// The cancellation scope of the fiber this plain thread works for (inside
/// [`run_on_behalf_of`]), if any; `None` in a fiber.
#[cfg(not(loom))]
pub fn behalf_cancel_scope() -> Option<Arc<dyn CancelScope>> {
    if !current::get().is_null() {
        return None;
    }
    ON_BEHALF_OF.try_with(|c| c.borrow().scope.clone()).ok().flatten()
}

/// The id of the fiber this plain thread works for (inside
/// [`run_on_behalf_of`]), if any; `None` in a fiber.
#[cfg(not(loom))]
pub fn behalf_fiber_id() -> Option<FiberId> {
    if !current::get().is_null() {
        return None;
    }
    ON_BEHALF_OF.try_with(|c| c.borrow().fiber).ok().flatten()
}

/// Is the running fiber's cancellation scope the one whose `Arc` data
/// pointer is `scope`? Compares addresses only (no reference is taken or
/// given out); `false` on a plain thread or outside any scope. A cheap
/// test for layers that would otherwise clone the scope to compare it.
pub fn current_cancel_scope_is(scope: *const ()) -> bool {
    let fiber = current::get();
    if fiber.is_null() {
        return false;
    }
    // SAFETY: the running fiber reads its own slot; only the address of
    // the scope is read, nothing escapes the closure.
    unsafe {
        (*fiber)
            .cancel_scope
            .with(|c| (*c).as_ref().is_some_and(|s| Arc::as_ptr(s) as *const () == scope))
    }
}

/// A handle to a fiber that can interrupt its current wait (used to deliver
/// cancellation: the woken wait re-checks its cancellation state).
#[derive(Clone)]
pub struct FiberRef {
    fiber: Arc<Fiber>,
    id: FiberId,
}

impl FiberRef {
    /// Wake the fiber from whatever it waits on now, if it is still the same
    /// incarnation and waits; a fiber that is running is unaffected (it sees
    /// cancellation at its next cancellable wait). Spurious wakes are
    /// harmless: waits re-check their condition.
    pub fn interrupt(&self) {
        if self.fiber.id() == self.id {
            crate::wait::wake_current_wait(&self.fiber);
        }
    }

    /// The fiber's id.
    pub fn id(&self) -> FiberId {
        self.id
    }

    /// Has this incarnation of the fiber ended, or did its runtime's
    /// teardown give it up (for good, or to be revived later)? A fiber for
    /// which this is `false` may still run code: a job layer must not end
    /// the job it runs in behind its back.
    pub fn has_ended_or_been_given_up(&self) -> bool {
        self.fiber.id() != self.id || self.fiber.is_abandoned()
    }
}

impl fmt::Debug for FiberRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FiberRef").field("id", &self.id).finish()
    }
}

/// A handle to the running fiber, or `None` on a plain thread.
pub fn current_fiber() -> Option<FiberRef> {
    let fiber = current::get();
    if fiber.is_null() {
        return None;
    }
    // SAFETY: as in `current_id`.
    let fiber = unsafe { &*fiber };
    Some(FiberRef {
        fiber: crate::wait::frame_arc(fiber),
        id: fiber.id(),
    })
}

thread_local! {
    /// Fiber-local values of code that runs outside any fiber.
    static THREAD_LOCALS: std::cell::RefCell<LocalMap> = std::cell::RefCell::new(LocalMap::new());
}

/// The fiber-local value for `key` (initialized by `init` on first use) in
/// the running fiber, or in the calling thread outside fibers. The value
/// lives until the fiber's body ends. The facade's `fiber_local!` builds on
/// this.
pub fn with_fiber_local<T: Send + 'static, R>(key: usize, init: fn() -> T, f: impl FnOnce(&T) -> R) -> R {
    let fiber = current::get();
    if DETACHED_DROPS.with(|d| d.get()) > 0 {
        return with_fresh(init, f);
    }
    type Displaced = Option<Box<dyn std::any::Any + Send>>;
    let value: (*const T, Displaced) = if fiber.is_null() {
        let found = THREAD_LOCALS.try_with(|map| {
            let known = map.borrow().contains_key(&key);
            if !known {
                // Initialize with no borrow held: `init` may itself use
                // other fiber-locals.
                let value: Box<dyn std::any::Any + Send> = Box::new(init());
                // An `init` that used this same key made a value already:
                // the outer one stays, as with `thread_local!`, and the
                // displaced one is dropped once the map is no longer
                // borrowed (its `Drop` may use fiber-locals too).
                let displaced = map.borrow_mut().insert(key, LocalEntry::new(value));
                drop(displaced.map(LocalEntry::into_value));
            }
            let map = map.borrow();
            map[&key]
                .value
                .downcast_ref::<T>()
                .expect("one type per fiber-local key") as *const T
        });
        match found {
            Ok(value) => (value, None),
            // The thread is exiting and its fiber-locals are being
            // dropped (a destructor reads a fiber-local): a fresh value,
            // for this call only, rather than a panic in a thread-local
            // destructor (which aborts the process).
            Err(_) => return with_fresh(init, f),
        }
    } else {
        // SAFETY: the running fiber owns its locals slot; the borrow of the
        // map ends before `f` runs, so a nested `with` can insert safely.
        unsafe {
            (*fiber).locals.with_mut(|slot| {
                let map = (*slot).get_or_insert_with(Default::default);
                let mut displaced = None;
                if !map.contains_key(&key) {
                    // Initialize outside the map borrow's critical part:
                    // `init` may itself use other fiber-locals.
                    let value: Box<dyn std::any::Any + Send> = Box::new(init());
                    let map = (*slot).get_or_insert_with(Default::default);
                    // As on a thread: the outer value stays, and the one a
                    // nested use of this key made is dropped below, after
                    // the map access.
                    displaced = map.insert(key, LocalEntry::new(value)).map(LocalEntry::into_value);
                }
                let map = (*slot).as_ref().expect("just created");
                let value = map[&key]
                    .value
                    .downcast_ref::<T>()
                    .expect("one type per fiber-local key") as *const T;
                (value, displaced)
            })
        }
    };
    // The value a nested initialization made, replaced by the outer one
    // (no reference to it is alive: the nested `with` has returned).
    let (value, displaced) = value;
    drop(displaced);
    // SAFETY: values are boxed, so their addresses survive later inserts;
    // they are dropped only when the fiber's body ends (or the thread
    // exits), after every `with` of that fiber or thread has returned.
    f(unsafe { &*value })
}

/// Does the running fiber hold fiber-local values (none outside a fiber)?
pub(crate) fn has_fiber_locals() -> bool {
    let fiber = current::get();
    // SAFETY: the running fiber reads its own locals slot.
    !fiber.is_null()
        && unsafe {
            (*fiber)
                .locals
                .with(|slot| (*slot).as_ref().is_some_and(|m| !m.is_empty()))
        }
}

/// Drop the running fiber's fiber-local values now, on its own stack (the
/// end of its body; a scope's child calls it before its handle's join
/// returns, as std's scoped join waits for thread-local destructors).
///
/// One value at a time, newest first, the others staying in place: a
/// destructor that reads a fiber-local made before its own sees its current
/// value (as with `thread_local!`), and one that re-creates a fiber-local
/// has it dropped in a later round. A destructor that panics does not keep the others
/// from being dropped; the first such panic is resumed at the end. Outside
/// a fiber it does nothing.
///
/// # Safety
///
/// No reference handed out by [`with_fiber_local`] on the running fiber
/// may be alive: call it where the fiber's body has returned (its own top
/// frame), never from inside a `with_fiber_local` closure, whose value it
/// would drop while the closure still uses it.
pub unsafe fn drop_fiber_locals() {
    let fiber = current::get();
    if fiber.is_null() {
        return;
    }
    // SAFETY: the running fiber reads its own locals slot.
    if unsafe { (*fiber).locals.with(|slot| (*slot).is_none()) } {
        // The common case: the fiber never made a fiber-local.
        return;
    }
    let mut first_panic = None;
    // Bounded: a destructor that keeps re-creating a fiber-local (its own,
    // say) leaves the rest for recycling.
    for _ in 0..1024 {
        // SAFETY: the running fiber owns its locals slot; the entry is
        // taken out before its destructor runs, and no borrow of the map is
        // held while it does.
        let entry = unsafe {
            (*fiber).locals.with_mut(|slot| {
                let map = (*slot).as_mut()?;
                // Newest first, as thread-local destructors run.
                let key = map.iter().max_by_key(|(_, entry)| entry.made).map(|(key, _)| *key)?;
                map.remove(&key)
            })
        };
        let Some(value) = entry else { break };
        if let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(value))) {
            if first_panic.is_none() {
                first_panic = Some(panic);
            } else {
                // A later payload is dropped here; one whose own `Drop`
                // panics must not unwind out of this loop.
                crate::task::drop_quietly(panic);
            }
        }
    }
    if let Some(panic) = first_panic {
        std::panic::resume_unwind(panic);
    }
}

#[cfg(all(test, not(loom)))]
mod abandon_word_tests {
    use super::Fiber;

    /// The abandonment, its report and the dependent mark share one word:
    /// a revive clears both marks in one store, a report keeps the marks,
    /// and a report is taken once per abandonment.
    #[test]
    fn the_abandon_word_keeps_its_marks_apart() {
        let f = Fiber::new();
        assert!(!f.is_abandoned() && !f.is_abandoned_dependent() && !f.is_given_up_for_good());
        assert!(!f.take_abandon_report(), "a live fiber has nothing to report");
        f.mark_abandoned_dependent();
        assert!(!f.is_abandoned() && f.is_abandoned_dependent());
        f.mark_abandoned();
        assert!(
            f.is_abandoned() && !f.is_given_up_for_good(),
            "a dependent is revived later, not lost"
        );
        f.revive();
        assert!(!f.is_abandoned() && !f.is_abandoned_dependent() && !f.is_given_up_for_good());
        f.mark_abandoned();
        assert!(f.is_given_up_for_good());
        assert!(f.take_abandon_report());
        assert!(!f.take_abandon_report(), "reported twice");
        f.mark_abandoned();
        assert!(
            f.is_abandoned() && !f.take_abandon_report(),
            "a second give-up keeps the report"
        );
    }
}
