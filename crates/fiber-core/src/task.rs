//! Spawning a fiber and joining it: the per-spawn shared block that carries
//! the result (or the panic payload) to whoever joins, and cancellation
//! requests to the fiber.

use crate::block::{BlockArc, BlockDyn};
use crate::fiber::{current, Exit, Fiber, FiberId};
use crate::sched::{Runnable, Schedule};
use crate::state::Actor;
use crate::sync::{lock, Arc, AtomicBool, Mutex, Ordering, UnsafeCell};
use crate::wait::{fiber_wait, fiber_wake, wake_current_wait, Publish, WaitOptions, WaitResult, Waitable, Waiter};
use std::any::Any;
use std::fmt;
use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe, Location};

/// What the fiber frame needs to know about the task it runs.
pub(crate) trait TaskControl: Send + Sync {
    fn park_token(&self) -> &crate::park::ParkToken;
    /// Make `scope` the task's root cancellation scope (a layer's job for
    /// this fiber): `JoinHandle::cancel` then cancels it too. Returns
    /// `Some(true)` if the task was already cancelled (the caller cancels
    /// the scope itself), `None` if this kind of task takes no root scope.
    fn install_root_scope(&self, scope: Arc<dyn crate::CancelScope>) -> Option<bool>;
    /// The fiber's body has ended: close the task to cancellation (a later
    /// `JoinHandle::cancel` is a no-op, so the outcome decided from here on
    /// stands) and to new root scopes, and take the root scope back.
    fn take_root_scope(&self) -> Option<Arc<dyn crate::CancelScope>>;
    /// Does `install_root_scope` accept a scope (`Some`) for this task?
    fn takes_root_scope(&self) -> bool {
        true
    }
    /// The fiber was abandoned at teardown (parked on a wait nothing will
    /// complete in time, such as a `blocking` call that outlived the grace
    /// time): it will never finish, so release its joiners now. The
    /// default does nothing (a layer that spawned it carries its outcome).
    fn abandon(&self) {}
}

/// Did the fiber see (or has it been asked for) its cancellation, read once
/// its body has ended? The fiber's cancellation scope may be a user's
/// `CancelScope` whose `is_cancelled` panics: the panic is returned, never
/// let into the worker that runs the fiber's end.
///
/// # Safety
///
/// Called by the running fiber on its own stack, with its own frame
/// (`current::get`).
unsafe fn cancel_seen_at_end(fiber: *const Fiber) -> std::thread::Result<bool> {
    // SAFETY: see the function's contract: the running fiber reads its
    // owner-only slots.
    catch_unwind(AssertUnwindSafe(|| unsafe {
        (*fiber).cancel_seen() || (*fiber).is_cancel_requested()
    }))
}

/// The body's outcome becomes the panic `late` (its cancellation scope's,
/// asked after the body): a value the body returned is dropped where it
/// lies, on the fiber's stack (a large value is never moved; a panic of
/// its destructor is dropped quietly); a panic of the body stays, and
/// `late` is dropped.
#[cold]
#[inline(never)]
fn fail_outcome_in_place<T>(outcome: &mut std::thread::Result<T>, late: Box<dyn Any + Send>) {
    let Ok(value) = outcome else {
        drop_quietly(late);
        return;
    };
    let value: *mut T = value;
    // SAFETY: `value` points at the live value in `*outcome`, dropped
    // exactly once here; a destructor that panics part way is not resumed,
    // and the slot is overwritten below without another drop.
    if let Err(payload) = catch_unwind(AssertUnwindSafe(|| unsafe { std::ptr::drop_in_place(value) })) {
        drop_quietly(payload);
    }
    // SAFETY: `outcome` is valid for writes; its value was dropped above
    // (and `value` is not used again), so it is written without a drop.
    unsafe { std::ptr::write(outcome, Err(late)) };
}

/// The frame's (and a `FiberHandle`'s) reference to the task a fiber runs:
/// the core's join block, or a layer's own block (`try_spawn_unjoined`).
#[derive(Clone)]
pub(crate) enum TaskRef {
    Joined(BlockDyn<dyn TaskControl>),
    Shared(Arc<dyn TaskControl>),
}

impl TaskRef {
    fn joined<T: Send + 'static>(task: &BlockArc<Task<T>>) -> TaskRef {
        // SAFETY: an unsizing cast; `Task<T>` is `TaskControl`, `Send` and
        // `Sync` (`T: Send`).
        TaskRef::Joined(unsafe { task.erase(|t| t as *const dyn TaskControl) })
    }
}

impl std::ops::Deref for TaskRef {
    type Target = dyn TaskControl;

    fn deref(&self) -> &(dyn TaskControl + 'static) {
        match self {
            TaskRef::Joined(task) => &**task,
            TaskRef::Shared(task) => &**task,
        }
    }
}

/// Why a join did not produce the fiber's value.
pub struct JoinError {
    repr: Repr,
    id: FiberId,
    name: Option<std::sync::Arc<str>>,
}

enum Repr {
    Panic(Payload),
    Cancelled,
    TimedOut,
    Failed,
    /// The joining fiber was cancelled while it waited.
    JoinCancelled,
}

/// A panic payload, kept so that `JoinError` is `Sync` (as tokio's is: a
/// join error converts into `Box<dyn Error + Send + Sync>`, `anyhow`'s
/// error, or `io::Error`). A string (the payload of every `panic!` with a
/// message) is `Sync` and lent out by reference; any other payload
/// (`std::panic::panic_any`) is only handed back by value.
enum Payload {
    Shared(Box<dyn Any + Send + Sync + 'static>),
    Owned(OwnedOnly),
}

/// A payload that may not be `Sync`: reachable only by moving it out. Its
/// type, read when it was taken in (by its owner), answers
/// [`JoinError::is`] without a reference to it.
struct OwnedOnly(Box<dyn Any + Send + 'static>, std::any::TypeId);

// SAFETY: the only `&OwnedOnly` access that reaches the payload is
// `JoinError::downcast_ref::<T>`, which lends it only as a `T` that is
// `Sync` (the type must match exactly); otherwise it is only moved out, by
// `JoinError::try_into_panic`, and dropped by its owner. So sharing
// `&JoinError` between threads shares nothing that may not be `Sync`.
unsafe impl Sync for OwnedOnly {}

impl Payload {
    fn new(payload: Box<dyn Any + Send + 'static>) -> Payload {
        match payload.downcast::<&'static str>() {
            Ok(s) => Payload::Shared(s),
            Err(payload) => match payload.downcast::<String>() {
                Ok(s) => Payload::Shared(s),
                Err(payload) => {
                    let type_id = (*payload).type_id();
                    Payload::Owned(OwnedOnly(payload, type_id))
                }
            },
        }
    }

    fn shared(&self) -> Option<&(dyn Any + Send + Sync + 'static)> {
        match self {
            Payload::Shared(p) => Some(&**p),
            Payload::Owned(_) => None,
        }
    }

    fn into_box(self) -> Box<dyn Any + Send + 'static> {
        match self {
            Payload::Shared(p) => p,
            Payload::Owned(p) => p.0,
        }
    }
}

impl JoinError {
    /// Did the fiber panic?
    pub fn is_panic(&self) -> bool {
        matches!(self.repr, Repr::Panic(_))
    }

    /// Was the fiber cancelled? A fiber whose cancellation was requested
    /// before it ended is cancelled whatever its body did next (it never
    /// started, it returned `Err(Cancelled)` from a wait, or it ignored the
    /// request and returned a value, which is then dropped), unless it
    /// panicked: that is [`is_panic`](Self::is_panic). True also when the cancellation came from a
    /// `with_timeout` deadline ([`is_timed_out`](Self::is_timed_out)): a
    /// timeout is a cancellation with a reason, as in Kotlin.
    pub fn is_cancelled(&self) -> bool {
        matches!(self.repr, Repr::Cancelled | Repr::TimedOut | Repr::JoinCancelled)
    }

    /// Was it the join that was cancelled: the joining fiber was cancelled
    /// while it waited, so the joined fiber's own outcome is not known (it
    /// runs on)? [`is_cancelled`](Self::is_cancelled) is true as well, as
    /// a Kotlin `join()` in a cancelled coroutine throws its caller's
    /// cancellation.
    pub fn is_join_cancelled(&self) -> bool {
        matches!(self.repr, Repr::JoinCancelled)
    }

    /// Was the fiber cancelled by a `with_timeout` deadline (its job's
    /// cancel reason is `TimedOut`)?
    pub fn is_timed_out(&self) -> bool {
        matches!(self.repr, Repr::TimedOut)
    }

    /// Did the fiber return an error that its scope took (`try_scope`)?
    pub fn is_failed(&self) -> bool {
        matches!(self.repr, Repr::Failed)
    }

    /// A cancellation error for fiber `id` (for layers above the core).
    pub fn cancelled(id: FiberId) -> JoinError {
        JoinError {
            repr: Repr::Cancelled,
            id,
            name: None,
        }
    }

    /// The join of fiber `id` was cancelled (the joining fiber was
    /// cancelled while it waited; for layers above the core).
    pub fn join_cancelled(id: FiberId) -> JoinError {
        JoinError {
            repr: Repr::JoinCancelled,
            id,
            name: None,
        }
    }

    /// A timeout error for fiber `id` (for layers above the core).
    pub fn timed_out(id: FiberId) -> JoinError {
        JoinError {
            repr: Repr::TimedOut,
            id,
            name: None,
        }
    }

    /// "Returned an error that its scope took" for fiber `id`.
    pub fn failed(id: FiberId) -> JoinError {
        JoinError {
            repr: Repr::Failed,
            id,
            name: None,
        }
    }

    /// A panic error for fiber `id` carrying `payload`.
    pub fn panicked(id: FiberId, payload: Box<dyn Any + Send + 'static>) -> JoinError {
        JoinError {
            repr: Repr::Panic(Payload::new(payload)),
            id,
            name: None,
        }
    }

    /// The panic payload. Panics if the fiber did not panic.
    #[track_caller]
    pub fn into_panic(self) -> Box<dyn Any + Send + 'static> {
        self.try_into_panic()
            .expect("JoinError::into_panic called on a JoinError that is not a panic")
    }

    /// The panic payload, or the error back if the fiber did not panic.
    pub fn try_into_panic(self) -> Result<Box<dyn Any + Send + 'static>, JoinError> {
        match self.repr {
            Repr::Panic(payload) => Ok(payload.into_box()),
            _ => Err(self),
        }
    }

    /// The panic payload, by reference, if the fiber panicked with a
    /// message (a `&'static str` or `String` payload: every `panic!` with
    /// a message). A payload of another type (`std::panic::panic_any`) is
    /// handed back only by value, by [`into_panic`](Self::into_panic):
    /// that keeps `JoinError` `Sync` whatever the payload.
    pub fn panic_payload(&self) -> Option<&(dyn Any + Send + 'static)> {
        match &self.repr {
            Repr::Panic(payload) => payload.shared().map(|p| p as &(dyn Any + Send)),
            _ => None,
        }
    }

    /// The panic payload as a `T`, if the fiber panicked with one: what
    /// `downcast_ref` on the `Box<dyn Any + Send>` that
    /// `std::thread::JoinHandle::join` returns gives, so std's idiom reads
    /// the same here, for any payload type that is `Sync` (a `&str`, a
    /// `String`, an `i32` of `panic_any(7)`). `None` for any other error.
    /// A payload that is not `Sync` (a `Cell`) is handed out only by value
    /// ([`downcast`](Self::downcast), [`into_panic`](Self::into_panic)):
    /// `JoinError` is `Sync`, and a shared reference to such a payload
    /// could reach two threads.
    ///
    /// ```
    /// # mod fiber { pub(crate) use fiber_core as core; }
    /// let sched = fiber::core::testing::TestScheduler::new();
    /// let h = sched.spawn(|| -> u32 { panic!("boom") });
    /// let g = sched.spawn(|| -> u32 { std::panic::panic_any(7i32) });
    /// sched.run();
    /// let err = h.join().unwrap_err();
    /// assert_eq!(err.downcast_ref::<&str>(), Some(&"boom"));
    /// assert!(err.downcast_ref::<String>().is_none());
    /// assert_eq!(g.join().unwrap_err().downcast_ref::<i32>(), Some(&7));
    /// ```
    pub fn downcast_ref<T: Any + Sync>(&self) -> Option<&T> {
        match &self.repr {
            Repr::Panic(Payload::Shared(p)) => p.downcast_ref::<T>(),
            // A reference to the owned payload only as a `T: Sync` (see
            // `OwnedOnly`'s `Sync`).
            Repr::Panic(Payload::Owned(p)) => p.0.downcast_ref::<T>(),
            _ => None,
        }
    }

    /// Did the fiber panic with a payload of type `T` (any type, also one
    /// [`downcast_ref`](Self::downcast_ref) cannot lend)? What `is` on
    /// the `Box<dyn Any + Send>` of `std::thread::JoinHandle::join` says.
    /// False for an error that is not a panic.
    ///
    /// ```
    /// # mod fiber { pub(crate) use fiber_core as core; }
    /// let sched = fiber::core::testing::TestScheduler::new();
    /// let h = sched.spawn(|| -> u32 { std::panic::panic_any(7u8) });
    /// sched.run();
    /// let err = h.join().unwrap_err();
    /// assert!(err.is::<u8>());
    /// assert!(!err.is::<&str>());
    /// ```
    pub fn is<T: Any>(&self) -> bool {
        match &self.repr {
            Repr::Panic(Payload::Shared(p)) => (**p).is::<T>(),
            Repr::Panic(Payload::Owned(p)) => p.1 == std::any::TypeId::of::<T>(),
            _ => false,
        }
    }

    /// The panic payload as a `Box<T>`, by value, if the fiber panicked
    /// with a `T`; otherwise the error back unchanged. std's
    /// `err.downcast::<T>()` on the error of
    /// `std::thread::JoinHandle::join`, for any payload type.
    ///
    /// ```
    /// # mod fiber { pub(crate) use fiber_core as core; }
    /// let sched = fiber::core::testing::TestScheduler::new();
    /// let code = std::env::args().count(); // a value known only at run time
    /// let h = sched.spawn(move || -> u32 { panic!("code {code}") });
    /// sched.run();
    /// let err = h.join().unwrap_err();
    /// let err = err.downcast::<&str>().unwrap_err(); // a formatted message is a String
    /// assert_eq!(*err.downcast::<String>().unwrap(), format!("code {code}"));
    /// ```
    pub fn downcast<T: Any>(self) -> Result<Box<T>, JoinError> {
        if !self.is::<T>() {
            return Err(self);
        }
        let JoinError { repr, id, name } = self;
        match repr {
            Repr::Panic(payload) => match payload.into_box().downcast::<T>() {
                Ok(value) => Ok(value),
                // `is` said it is a `T`: not reached, but the payload is
                // handed back rather than lost.
                Err(payload) => Err(JoinError {
                    repr: Repr::Panic(Payload::new(payload)),
                    id,
                    name,
                }),
            },
            repr => Err(JoinError { repr, id, name }),
        }
    }

    /// The id of the fiber joined: the one that failed, or, when the join
    /// itself was cancelled ([`is_join_cancelled`](Self::is_join_cancelled)),
    /// the one that was waited for.
    pub fn id(&self) -> FiberId {
        self.id
    }

    /// The name of the fiber joined, if it was spawned with one
    /// (`fiber::Builder::name`).
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// This error, naming the fiber `name` (for layers above the core).
    pub fn with_name(mut self, name: Option<std::sync::Arc<str>>) -> JoinError {
        self.name = name;
        self
    }

    /// "fiber 7" or "fiber 7 (\"conn-42\")".
    fn who(&self) -> String {
        match &self.name {
            Some(name) => format!("{} ({:?})", self.id, name),
            None => self.id.to_string(),
        }
    }
}

fn panic_message(payload: &(dyn Any + Send + Sync)) -> Option<&str> {
    payload
        .downcast_ref::<&'static str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
}

impl fmt::Debug for JoinError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let who = self.who();
        match &self.repr {
            Repr::Panic(p) => match p.shared().and_then(panic_message) {
                Some(msg) => write!(f, "JoinError::Panic({who}, {msg:?}, ..)"),
                None => write!(f, "JoinError::Panic({who}, ..)"),
            },
            Repr::Cancelled => write!(f, "JoinError::Cancelled({who})"),
            Repr::TimedOut => write!(f, "JoinError::TimedOut({who})"),
            Repr::Failed => write!(f, "JoinError::Failed({who})"),
            Repr::JoinCancelled => write!(f, "JoinError::JoinCancelled({who})"),
        }
    }
}

impl fmt::Display for JoinError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let who = self.who();
        match &self.repr {
            Repr::Panic(p) => match p.shared().and_then(panic_message) {
                Some(msg) => write!(f, "{who} panicked with message {msg:?}"),
                None => write!(f, "{who} panicked"),
            },
            Repr::Cancelled => write!(f, "{who} was cancelled"),
            Repr::TimedOut => write!(f, "{who} timed out"),
            Repr::Failed => write!(f, "{who} failed with an error its scope returned"),
            Repr::JoinCancelled => write!(f, "the join of {who} was cancelled (the joining fiber was cancelled)"),
        }
    }
}

impl std::error::Error for JoinError {}

/// A join error as the error of std's `JoinHandle::join` (a
/// `Box<dyn Any + Send>`), so `std::panic::resume_unwind(err.into())`
/// re-raises a fiber's panic with its own payload, as std's idiom does
/// with the error of a thread's join. An error that is not a panic (a
/// cancelled or abandoned fiber) is boxed itself.
///
/// ```
/// # mod fiber { pub(crate) use fiber_core as core; }
/// let sched = fiber::core::testing::TestScheduler::new();
/// let h = sched.spawn(|| -> u32 { std::panic::panic_any(7i32) });
/// sched.run();
/// let payload: Box<dyn std::any::Any + Send> = h.join().unwrap_err().into();
/// assert_eq!(payload.downcast_ref::<i32>(), Some(&7));
/// ```
impl From<JoinError> for Box<dyn Any + Send + 'static> {
    fn from(err: JoinError) -> Self {
        match err.try_into_panic() {
            Ok(payload) => payload,
            Err(err) => Box::new(err),
        }
    }
}

/// As tokio's: a join error as an `io::Error` (kind `Other`, with the join
/// error as its source), so `h.join()?` works in a function that returns
/// `io::Result`.
impl From<JoinError> for std::io::Error {
    fn from(err: JoinError) -> std::io::Error {
        std::io::Error::other(err)
    }
}

/// Join bookkeeping under the task lock.
struct Joiners {
    finished: bool,
    /// The `JoinHandle` is gone: the fiber drops its own outcome.
    detached: bool,
    /// Inline room for one: a task almost always has at most one joiner
    /// (its handle's), and a heap buffer for it cost an allocation and a
    /// free per joined task.
    waiters: smallvec::SmallVec<[Waiter; 1]>,
    /// The fiber's root job, once a layer made one (see `install_root_scope`).
    root_scope: Option<Arc<dyn crate::CancelScope>>,
    /// The body has ended (`take_root_scope`): the cancel flag is final and
    /// no root scope is installed any more.
    closed: bool,
}

/// The block shared by a spawned fiber and its [`JoinHandle`].
struct Task<T> {
    id: FiberId,
    /// Fast-path copy of `Joiners::finished` (Release on completion).
    finished: AtomicBool,
    /// The body has ended (`Task::close`). Written by the fiber only, and
    /// read by it (no root scope is installed after its body), so the
    /// close of a fiber that never made a root job takes no lock; a
    /// canceller reads it as a hint (a cancel that does not see it lands
    /// before `complete`, which decides the outcome under the lock).
    ended: AtomicBool,
    joiners: Mutex<Joiners>,
    /// Written once by the fiber before `finished`; read once by the joiner
    /// after it.
    result: UnsafeCell<Option<Result<T, JoinError>>>,
    /// `park` / `unpark` token.
    park: crate::park::ParkToken,
    /// The fiber's name (`SpawnOptions::name`).
    name: Option<std::sync::Arc<str>>,
    /// The frame running this task (to wake it on cancel). The frame may be
    /// recycled after the task finishes; `cancel` checks `finished` first,
    /// and a wake of a later incarnation would only be spurious.
    fiber: Arc<Fiber>,
}

// SAFETY: `result` is written by the fiber strictly before `finished` is set
// (Release) and read by the single `JoinHandle` strictly after it observed
// `finished` (Acquire); every other field is Sync. `T: Send` because the
// value moves from the fiber's thread to the joiner's.
unsafe impl<T: Send> Sync for Task<T> {}
// SAFETY: as above; the block owns a `T` only when `T: Send`.
unsafe impl<T: Send> Send for Task<T> {}

impl<T: Send> TaskControl for Task<T> {
    fn park_token(&self) -> &crate::park::ParkToken {
        &self.park
    }

    fn install_root_scope(&self, scope: Arc<dyn crate::CancelScope>) -> Option<bool> {
        // Relaxed: the fiber's own earlier store (it alone calls this).
        if self.ended.load(Ordering::Relaxed) {
            // The body has ended (a fiber-local destructor asking for its
            // job): a root job made now would never hear the end.
            return None;
        }
        let mut joiners = lock(&self.joiners);
        if joiners.closed {
            // The body has ended (a fiber-local destructor asking for its
            // job): a root job made now would never hear the end.
            return None;
        }
        joiners.root_scope = Some(scope);
        // The cancel flag lives in the frame (`Fiber::task_cancel`).
        Some(self.fiber.task_cancel_flag())
    }

    fn take_root_scope(&self) -> Option<Arc<dyn crate::CancelScope>> {
        let mut joiners = lock(&self.joiners);
        joiners.closed = true;
        joiners.root_scope.take()
    }

    fn abandon(&self) {
        let (waiters, root) = {
            let mut joiners = lock(&self.joiners);
            if joiners.finished {
                return;
            }
            if !joiners.detached {
                // SAFETY: `finished` is false, so nobody has written the
                // result; the fiber never runs again (abandoned), and if it
                // did, its `complete` sees `finished` under this lock and
                // keeps its outcome. The handle reads only after `finished`.
                self.result
                    .with_mut(|r| unsafe { *r = Some(Err(JoinError::cancelled(self.id))) });
            }
            joiners.finished = true;
            joiners.closed = true;
            // Release: as in `complete`.
            self.finished.store(true, Ordering::Release);
            (std::mem::take(&mut joiners.waiters), joiners.root_scope.take())
        };
        for waiter in &waiters {
            fiber_wake(waiter);
        }
        // The fiber's root job ends with its handle (they agree), outside
        // the lock: it runs the job layer's code.
        if let Some(root) = root {
            let _ = catch_unwind(AssertUnwindSafe(move || {
                root.fiber_abandoned(crate::fiber::RootScopeCall::new())
            }));
        }
    }

    fn takes_root_scope(&self) -> bool {
        // Relaxed: as in `install_root_scope`.
        !self.ended.load(Ordering::Relaxed) && !lock(&self.joiners).closed
    }
}

impl<T: Send> Task<T> {
    /// Store the outcome, moved out of `outcome` in place (a large value is
    /// not copied through the call), and wake every joiner (called by the
    /// fiber, once). What no joiner will see stays in `outcome` (the handle
    /// is gone, or a cancel came first and the value is unwanted): the
    /// fiber drops it on its own stack, so user `Drop` code never runs bare
    /// on a worker.
    fn complete(&self, outcome: &mut Option<Result<T, JoinError>>) -> bool {
        let mut unwanted = false;
        let waiters = {
            let mut joiners = lock(&self.joiners);
            if joiners.finished {
                // Abandoned at a teardown (`abandon`) and resumed after
                // all: the joiners already have their answer.
                return false;
            }
            if !joiners.detached {
                // The outcome is decided here, under the lock that a cancel
                // request takes too: a task cancelled before this point
                // ends cancelled even if its closure returned a value (the
                // value stays with the fiber, which drops it once); a later
                // cancel is a no-op.
                unwanted = self.fiber.task_cancel_flag() && matches!(outcome, Some(Ok(_)));
                // SAFETY: only the fiber writes, once, before `finished`;
                // the handle reads only after it (under this lock or after
                // the Acquire below). The slot is empty until then, and it
                // and `outcome` are distinct places.
                self.result.with_mut(|r| unsafe {
                    if unwanted {
                        *r = Some(Err(JoinError::cancelled(self.id)));
                    } else {
                        std::ptr::swap_nonoverlapping(r, outcome, 1);
                    }
                });
            }
            joiners.finished = true;
            // Release: pairs with the Acquire in `try_complete`/`is_finished`
            // so a joiner that sees `finished` sees `result`.
            self.finished.store(true, Ordering::Release);
            std::mem::take(&mut joiners.waiters)
        };
        for waiter in &waiters {
            fiber_wake(waiter);
        }
        unwanted
    }

    /// The body has ended: from here no root scope is installed (a
    /// fiber-local destructor that asks for its job gets none) and a
    /// `JoinHandle::cancel` is a no-op once it sees this. Returns the
    /// fiber's root scope, if it has one (`had_root`: the fiber's own
    /// record). Without one, nothing else reads the close under the lock,
    /// so it takes none: a flag only the fiber reads back.
    fn close(&self, had_root: bool) -> Option<Arc<dyn crate::CancelScope>> {
        // Relaxed: read back by this fiber, and as a hint by cancellers
        // (see the field).
        self.ended.store(true, Ordering::Relaxed);
        if had_root {
            self.take_root_scope()
        } else {
            None
        }
    }

    fn request_cancel(&self) {
        let root_scope = {
            let joiners = lock(&self.joiners);
            // Relaxed `ended`: a hint (see the field); a cancel that misses
            // it still lands before `complete`, which sees the flag.
            if joiners.finished || joiners.closed || self.ended.load(Ordering::Relaxed) {
                // Cancelling a finished task is a no-op: it keeps its
                // outcome. So is cancelling one whose body has ended: its
                // outcome (and its root job's) is being decided from the
                // flag as it was then.
                return;
            }
            // In the frame, which is this task's until it finishes (see
            // `Fiber::task_cancel`).
            self.fiber.request_task_cancel();
            joiners.root_scope.clone()
        };
        // `wake_current_wait` fences (the canceller's half of the
        // handshake in `wait.rs::enter_parking`) before it reads the state.
        if !self.finished.load(Ordering::Acquire) {
            wake_current_wait(&self.fiber);
        }
        // The fiber's job (and its subtree: scopes it opened) is cancelled
        // too: one cancellation model.
        if let Some(scope) = root_scope {
            scope.cancel();
        }
    }
}

impl<T: Send> Waitable for Task<T> {
    type Io = ();

    fn kind(&self) -> crate::WaitKind {
        crate::WaitKind::Join
    }

    fn try_complete(&self, _: &mut ()) -> Option<WaitResult> {
        // Acquire: pairs with the Release in `complete`.
        self.finished.load(Ordering::Acquire).then_some(WaitResult::Ok)
    }

    fn publish(&self, waiter: &Waiter, _: &mut ()) -> Publish {
        let mut joiners = lock(&self.joiners);
        if joiners.finished {
            return Publish::Ready(WaitResult::Ok);
        }
        joiners.waiters.push(waiter.clone());
        Publish::Published
    }

    fn unpublish(&self, waiter: &Waiter, _: &mut ()) -> Option<WaitResult> {
        let mut joiners = lock(&self.joiners);
        joiners.waiters.retain(|w| !w.same_wait(waiter));
        joiners.finished.then_some(WaitResult::Ok)
    }
}

/// Completes the task exactly once: explicitly when the body ends, or with
/// `Cancelled` when the body is dropped without finishing (never started and
/// discarded at shutdown, or unwound at shutdown).
struct Completion<T: Send> {
    task: BlockArc<Task<T>>,
    id: FiberId,
    armed: bool,
    /// The fiber's name, for the join error.
    name: Option<std::sync::Arc<str>>,
}

impl<T: Send> Completion<T> {
    /// Complete with the outcome in `outcome` (moved out in place; see
    /// `Task::complete`); what no joiner will see is dropped here.
    /// Returns `true` if a cancel that came first made the value unwanted
    /// (the join reports `Cancelled`; the value was dropped here).
    fn finish(&mut self, outcome: &mut Option<Result<T, JoinError>>) -> bool {
        self.armed = false;
        if let Some(Err(e)) = outcome {
            e.name = self.name.clone();
        }
        let unwanted = self.task.complete(outcome);
        drop_in_place_quietly(outcome);
        unwanted
    }

    /// Complete with an error.
    fn fail(&mut self, error: JoinError) {
        let _ = self.finish(&mut Some(Err(error)));
    }
}

impl<T: Send> Drop for Completion<T> {
    fn drop(&mut self) {
        if self.armed {
            // Dropped unrun: cancelled before it started (or at shutdown),
            // or its first run found no stack, which the join reports as
            // a panic naming the cause (`Fiber::fail_start`).
            let error = match crate::fiber::start_failure() {
                Some(why) => JoinError::panicked(self.id, Box::new(why)),
                None => JoinError::cancelled(self.id),
            };
            self.fail(error);
        }
    }
}

/// Drop the running fiber's fiber-locals (`drop_fiber_locals`), containing
/// a panic of a destructor (and of its payload's `Drop`): never into the
/// worker.
///
/// # Safety
///
/// As for `drop_fiber_locals`: called on the fiber's own stack with no
/// `with_fiber_local` reference of this fiber alive.
unsafe fn drop_locals_quietly() {
    // SAFETY: the caller's contract.
    if let Err(payload) = catch_unwind(|| unsafe { crate::fiber::drop_fiber_locals() }) {
        // The payload's own `Drop` may panic: never into the worker.
        drop_quietly(payload);
    }
}

/// Empty `slot`, dropping its value where it is, containing a panic of its
/// destructor as [`drop_quietly`] does. (Assigning `None` drops the old
/// value in place; on a panic the slot still ends `None`.)
fn drop_in_place_quietly<V>(slot: &mut Option<V>) {
    if slot.is_none() {
        return;
    }
    if let Err(payload) = catch_unwind(AssertUnwindSafe(|| *slot = None)) {
        drop_quietly(payload);
    }
}

/// Drop `value`, containing a panic of its destructor (and of the panic
/// payload's own destructor, which is leaked if it panics too).
pub(crate) fn drop_quietly<V>(value: V) {
    if let Err(payload) = catch_unwind(AssertUnwindSafe(move || drop(value))) {
        if let Err(again) = catch_unwind(AssertUnwindSafe(move || drop(payload))) {
            std::mem::forget(again);
        }
    }
}

/// Drop `value`; a panic of its destructor comes back as its payload.
fn drop_caught<V>(value: V) -> Result<(), Box<dyn Any + Send>> {
    catch_unwind(AssertUnwindSafe(move || drop(value)))
}

/// An owned permission to join a fiber (its result, or its panic).
///
/// Dropping the handle detaches the fiber, as with `std::thread`.
pub struct JoinHandle<T> {
    task: BlockArc<Task<T>>,
}

// Unwind safety as tokio declares it for its `JoinHandle<T>`: the handle's
// state (the join block) changes only through atomics and a lock that
// ignores poisoning, and the value is moved out whole or not at all.
impl<T> std::panic::UnwindSafe for JoinHandle<T> {}
impl<T> std::panic::RefUnwindSafe for JoinHandle<T> {}

impl<T> Drop for JoinHandle<T> {
    fn drop(&mut self) {
        let unjoined = {
            let mut joiners = lock(&self.task.joiners);
            joiners.detached = true;
            if joiners.finished {
                // SAFETY: `finished` under the lock: the fiber's write is
                // done, and this handle is the only reader.
                self.task.result.with_mut(|r| unsafe { (*r).take() })
            } else {
                None
            }
        };
        // A finished, never-joined outcome is dropped here, by the owner
        // of the handle.
        drop(unjoined);
    }
}

impl<T: Send> JoinHandle<T> {
    /// Wait for the fiber to finish and take its result. In a fiber this
    /// parks the fiber; on a plain thread it blocks the thread.
    ///
    /// A cancellation point: if the joining fiber is cancelled while it
    /// waits, this returns an error whose `is_cancelled()` and
    /// `is_join_cancelled()` are true, and the joined fiber runs on,
    /// detached.
    ///
    /// # Panics
    ///
    /// Panics if called by the fiber this handle joins (it would wait for
    /// itself forever), as `std::thread::JoinHandle::join` does for a
    /// thread joining itself.
    #[track_caller]
    pub fn join(self) -> Result<T, JoinError> {
        // The fiber's operation budget: a loop joining finished fibers lets
        // the fibers beside it run.
        crate::coop_point();
        // A self-join can never see `finished`: check only when not
        // finished, off the join-of-a-finished-fiber fast path.
        if !self.is_finished() {
            if crate::fiber::current_id() == Some(self.task.id) {
                panic!(
                    "JoinHandle::join called by the fiber it joins ({}): a fiber cannot wait for its own end",
                    self.task.id
                );
            }
            // Inside a `fiber::blocking` call of the fiber it joins: that
            // fiber waits for the call.
            if crate::fiber::behalf_fiber_id() == Some(self.task.id) {
                panic!(
                    "JoinHandle::join called inside a fiber::blocking call of the fiber it joins ({}): the \
                     fiber waits for the call, the join would wait for itself",
                    self.task.id
                );
            }
        }
        // A cancellation point: a joiner cancelled while it waits gets
        // `Cancelled`, and the fiber it joined runs on, detached.
        let result = fiber_wait(&*self.task, &mut (), WaitOptions::new());
        if result != WaitResult::Ok {
            return Err(JoinError::join_cancelled(self.task.id).with_name(self.task.name.clone()));
        }
        self.take_result()
    }

    fn take_result(self) -> Result<T, JoinError> {
        // The fiber has finished (`fiber_wait` saw `finished`): it never
        // reads `detached` again, so the handle's `Drop`, which takes the
        // joiners lock to set it, has nothing left to do and is skipped.
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: `this` is a `ManuallyDrop` that is never used again, so
        // its only field is moved out exactly once and nothing is dropped
        // twice.
        let task: BlockArc<Task<T>> = unsafe { std::ptr::read(&this.task) };
        // SAFETY: `finished` was observed (Acquire) by `fiber_wait`, so the
        // fiber's write happened before; this handle is the only reader.
        task.result
            .with_mut(|r| unsafe { (*r).take() })
            .unwrap_or_else(|| Err(JoinError::cancelled(task.id).with_name(task.name.clone())))
    }

    /// Has the fiber finished?
    pub fn is_finished(&self) -> bool {
        self.task.finished.load(Ordering::Acquire)
    }

    /// Ask the fiber to stop: if it has not started it never runs; if it is
    /// parked at a cancellable wait it is woken and the wait returns
    /// `Cancelled`. A fiber that never reaches such a point is not
    /// interrupted.
    pub fn cancel(&self) {
        self.task.request_cancel()
    }

    /// The fiber's id.
    pub fn id(&self) -> FiberId {
        self.task.id
    }

    /// A handle to the fiber (its id, and `unpark`), like
    /// `std::thread::JoinHandle::thread`.
    pub fn fiber(&self) -> crate::park::FiberHandle
    where
        T: 'static,
    {
        crate::park::FiberHandle::new(self.task.id, TaskRef::joined(&self.task), self.task.name.clone())
    }

    /// The same as [`fiber`](Self::fiber), under std's name
    /// (`std::thread::JoinHandle::thread`), so that `handle.thread().id()`
    /// and `handle.thread().unpark()` port unchanged. It returns the handle
    /// by value, where std lends one.
    pub fn thread(&self) -> crate::park::FiberHandle
    where
        T: 'static,
    {
        self.fiber()
    }

    /// A type-erased handle that can cancel this fiber.
    pub fn canceller(&self) -> Canceller
    where
        T: 'static,
    {
        Canceller {
            // SAFETY: an unsizing cast; `Task<T>` is `Cancel`, `Send` and
            // `Sync` (`T: Send`).
            task: unsafe { self.task.erase(|t| t as *const dyn Cancel) },
        }
    }
}

/// Cancels one spawned fiber (see [`JoinHandle::cancel`]).
#[derive(Clone)]
pub struct Canceller {
    task: BlockDyn<dyn Cancel>,
}

impl Canceller {
    /// Request cancellation.
    pub fn cancel(&self) {
        self.task.cancel()
    }
}

impl fmt::Debug for Canceller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad("Canceller { .. }")
    }
}

trait Cancel: Send + Sync {
    fn cancel(&self);
}

impl<T: Send> Cancel for Task<T> {
    fn cancel(&self) {
        self.request_cancel()
    }
}

impl<T> fmt::Debug for JoinHandle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JoinHandle")
            .field("fiber", &self.task.id)
            .finish_non_exhaustive()
    }
}

/// Per-spawn options: what `std::thread::Builder` sets for a thread.
#[derive(Clone, Debug, Default)]
pub struct SpawnOptions {
    /// The fiber's name (shown by `current_name`, diagnostics and join
    /// errors).
    pub name: Option<std::sync::Arc<str>>,
    /// Hard affinity: once the fiber has run, it resumes only on the worker
    /// it first ran on (it may still be stolen before its first run), so
    /// that thread-local state it holds across a park stays on its thread.
    pub pinned: bool,
    /// The stack the fiber needs, in bytes (`None`: the pool's). A request
    /// at or below the pool's stack size gets a pool stack; a larger one
    /// gets a stack mapped for it (up to 1 GiB; above that the spawn fails
    /// with `io::ErrorKind::InvalidInput`).
    pub stack_size: Option<usize>,
    /// Take the fiber's stack at the spawn instead of at its first run,
    /// so that a kernel refusing to map one is this spawn's error (as
    /// `std::thread::Builder::spawn` reports a thread it cannot create).
    /// Otherwise a fiber whose first run finds no stack never runs, and
    /// its join reports the failure as a panic (see [`try_spawn_with`]).
    pub stack_now: bool,
    /// Start the fiber even if its runtime is shutting down by then (in
    /// its grace time, not in teardown), instead of cancelling it before
    /// it runs as every other fiber spawned then is. For a fiber a layer
    /// spawns to serve clean-up code (the deadline of a `with_timeout`
    /// opened in `non_cancellable` while the runtime shuts down).
    pub starts_in_shutdown: bool,
}

/// Spawn `f` as a fiber of `sched`. Fails if the runtime is shutting down,
/// or if the stack allocator refuses a stack (see [`SpawnOptions`] and
/// `spec/lifecycle.md` section 8: a fiber takes its stack when it first
/// runs, except where the allocator may refuse one for want of a guard,
/// and for a `stack_size` above the pool's, which are taken at the spawn
/// so that a refusal is this error (as is any with
/// [`SpawnOptions::stack_now`]); a fiber whose first run finds no stack
/// because the kernel refuses to map one never runs: its closure is
/// dropped unrun, its join reports a panic whose payload (a `String`)
/// names the cause, and stderr says so).
#[track_caller]
pub fn try_spawn_on<F, T>(sched: &Arc<dyn Schedule>, f: F) -> io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    try_spawn_with(sched, SpawnOptions::default(), f)
}

/// Spawn `f` as a fiber of `sched` with `options`.
#[track_caller]
pub fn try_spawn_with<F, T>(sched: &Arc<dyn Schedule>, options: SpawnOptions, f: F) -> io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let location = Location::caller();
    let starts_in_shutdown = options.starts_in_shutdown;
    // Fibers of the runtime may still spawn while it shuts down (their
    // children are cancelled before they start, unless
    // `starts_in_shutdown`); nobody else may, and a
    // spawn from outside holds the pool's gate until its fiber is in a
    // queue, so that teardown's drain finds it (`SpawnGate`). The id and
    // the span come first: a span's creation runs a subscriber's code,
    // which must not run while the gate is held (teardown waits on it).
    let outside = outside_spawn(sched)?;
    let id = crate::fiber::next_fiber_id();
    let span = crate::kind::fiber_spans().then(|| fiber_span(id, options.name.as_deref()));
    let _admitted = enter_gate(sched, outside)?;
    let (frame, stack) = sched.frames().acquire_with(options.stack_size, options.stack_now)?;
    // Three owners: the handle, the completion and the frame.
    let [task, completion_task, frame_task] = BlockArc::new_owners(Task {
        id,
        finished: AtomicBool::new(false),
        ended: AtomicBool::new(false),
        joiners: Mutex::new(Joiners {
            finished: false,
            detached: false,
            waiters: smallvec::SmallVec::new(),
            root_scope: None,
            closed: false,
        }),
        result: UnsafeCell::new(None),
        park: crate::park::ParkToken::default(),
        name: options.name.clone(),
        fiber: frame.clone(),
    });
    let mut completion = Completion {
        task: completion_task,
        id,
        armed: true,
        name: options.name.clone(),
    };
    let body = move || -> Exit {
        let fiber = current::get();
        // SAFETY: this body runs on the fiber's own stack, so `current` is
        // this fiber's frame and the running fiber owns its slots.
        let refused = match unsafe { (*fiber).phase() } {
            crate::pool::Phase::Open => false,
            crate::pool::Phase::Cancelling => !starts_in_shutdown,
            crate::pool::Phase::Teardown => true,
        };
        // SAFETY: as above.
        if refused || unsafe { (*fiber).is_task_cancel_requested() } {
            // Never started: the closure is dropped here, on the fiber's
            // stack, not by whoever discards the frame. Its drop is
            // clean-up after a body that will never run: a wait in a
            // capture's destructor at teardown gets `Cancelled` and the
            // destructor runs to its end (no teardown unwind raised into it).
            // SAFETY: the running fiber marks its own slot.
            unsafe { (*fiber).note_body_returned() };
            completion.fail(match drop_caught(f) {
                Ok(()) => JoinError::cancelled(id),
                Err(payload) => JoinError::panicked(id, payload),
            });
            // Fiber-locals the closure's captures made as they dropped.
            // SAFETY: the body never ran: no `with_fiber_local` reference
            // of this fiber is alive.
            unsafe { drop_locals_quietly() };
            return Exit::Cancelled;
        }
        let mut outcome = catch_unwind(AssertUnwindSafe(f));
        // SAFETY: the running fiber marks its own slot.
        unsafe { (*fiber).note_body_returned() };
        // Closed: from here no root job is made; with a root job, a
        // `JoinHandle::cancel` is a no-op from here too, so the flag read
        // below is the one the outcome is decided from. Without one, a
        // cancel may still land until `complete`, which then decides.
        // SAFETY: the running fiber reads its own slot.
        let had_root = unsafe { (*fiber).has_root_scope() };
        let root = completion.task.close(had_root);
        // A fiber whose task or job was cancelled before its closure
        // returned ends cancelled (its value is dropped), and so does one
        // still running when its runtime began to shut down.
        // SAFETY: the running fiber, on its own stack, with its own frame.
        let mut cancel_seen = match unsafe { cancel_seen_at_end(fiber) } {
            Ok(seen) => seen,
            // The scope the body left installed (`swap_cancel_scope`: a
            // user's `CancelScope`) panicked when asked: that is the
            // fiber's panic, never one that escapes into the worker.
            Err(late) => {
                fail_outcome_in_place(&mut outcome, late);
                false
            }
        };
        // The fiber's root job learns how the body ended, on the fiber; the
        // handle reports what the job ended as (a cancel of the job itself
        // may still land before it ends), so the two always agree. Torn
        // down by shutdown is a cancellation, not a panic.
        if let Some(root) = root {
            let teardown = matches!(&outcome, Err(p) if crate::fiber::is_shutdown_unwind(&**p));
            let panicked = outcome.is_err() && !teardown;
            let cancelled = cancel_seen || teardown;
            if let Ok(Some(ended_cancelled)) = catch_unwind(AssertUnwindSafe(move || {
                root.fiber_finished(crate::fiber::RootScopeCall::new(), panicked, cancelled)
            })) {
                cancel_seen = ended_cancelled;
            }
        }
        // Fiber-locals and the job the fiber ran in die with the body, on
        // the fiber's own stack. The job is taken out first: a fiber-local
        // destructor runs with no job (as a scoped child's do), and no root
        // job is made for it (the task is closed).
        let scope = crate::fiber::swap_cancel_scope(None);
        // SAFETY: the body has returned: no `with_fiber_local` reference
        // of this fiber is alive.
        unsafe { drop_locals_quietly() };
        // Left over only when a destructor kept re-creating its value and
        // the clean-up gave up (its bound): not retried below.
        let locals_gave_up = crate::fiber::has_fiber_locals();
        drop_quietly(scope);
        let exit = match outcome {
            Ok(value) if cancel_seen => {
                // The value of a fiber that acknowledged its cancellation is
                // dropped here, once; a panic of its destructor is what the
                // joiner sees.
                completion.fail(match drop_caught(value) {
                    Ok(()) => JoinError::cancelled(id),
                    Err(payload) => JoinError::panicked(id, payload),
                });
                Exit::Cancelled
            }
            Ok(value) => {
                if completion.finish(&mut Some(Ok(value))) {
                    Exit::Cancelled
                } else {
                    Exit::Done
                }
            }
            Err(payload) if crate::fiber::is_shutdown_unwind(&*payload) => {
                drop_quietly(payload);
                completion.fail(JoinError::cancelled(id));
                Exit::Cancelled
            }
            Err(payload) => {
                completion.fail(JoinError::panicked(id, payload));
                Exit::Done
            }
        };
        // A value or payload dropped above (one nobody joins, or a
        // cancelled fiber's) may have made fiber-locals in its `Drop`: they
        // die here too, on the fiber's stack, not bare on a worker when
        // the frame is recycled. One null check when there are none.
        if !locals_gave_up {
            // SAFETY: as above.
            unsafe { drop_locals_quietly() };
        }
        exit
    };
    // SAFETY: an unsizing cast; `Task<T>` is `TaskControl`, `Send` and
    // `Sync` (`T: Send`).
    let frame_task = TaskRef::Joined(unsafe { frame_task.into_dyn(|t| t as *const dyn TaskControl) });
    // SAFETY: the frame came from the pool in INIT and is ours; the pool's
    // `all` list keeps it alive for as long as the coroutine exists.
    unsafe {
        Fiber::prepare(
            &frame,
            id,
            crate::counts::acquire(sched),
            frame_task,
            location,
            stack,
            body,
        );
    }
    if let Some(span) = span {
        // SAFETY: the frame is still INIT and ours (not scheduled yet).
        unsafe { frame.set_span(span) };
    }
    frame.set_name(options.name);
    frame.set_pinned(options.pinned || sched.pins_fibers());
    frame.state.transition_to_runnable_from_init();
    sched.schedule(Runnable::new(frame, Actor::Spawner));
    Ok(JoinHandle { task })
}

/// The per-fiber block of a layer that spawns fibers it joins by its own
/// means ([`try_spawn_unjoined`]): a scope's child, whose outcome travels
/// through the scope's own handle. The core needs only the fiber's park
/// token from it.
pub trait UnjoinedTask: Send + Sync + 'static {
    /// The fiber's `park` / `unpark` token (see [`ParkToken`](crate::ParkToken)).
    fn park_token(&self) -> &crate::park::ParkToken;
}

// No `JoinHandle` can cancel such a fiber (its frame's task cancel flag is
// never set): its layer cancels it through the cancellation scope it runs
// in.
impl<U: UnjoinedTask> TaskControl for U {
    fn park_token(&self) -> &crate::park::ParkToken {
        UnjoinedTask::park_token(self)
    }

    fn install_root_scope(&self, _: Arc<dyn crate::CancelScope>) -> Option<bool> {
        // Its layer runs the body in a scope of its own.
        None
    }

    fn take_root_scope(&self) -> Option<Arc<dyn crate::CancelScope>> {
        None
    }

    fn takes_root_scope(&self) -> bool {
        false
    }
}

/// Spawn `f` as a fiber of `sched` that no [`JoinHandle`] tracks: the
/// caller carries its outcome (and its cancellation) itself, and `task` is
/// its per-fiber block. Saves the core's join block, and lets `f` borrow.
/// Returns the fiber's id.
///
/// The fiber's body is `f`; when the runtime is shutting down before it
/// starts, `f` is dropped unrun, on the fiber's stack (or with its frame).
///
/// # Safety
///
/// Whatever `f` borrows must stay valid until `f` has returned or been
/// dropped; the caller must learn of that from `f` itself (it signals, as
/// its last act or from its destructor) and wait for it before the borrows
/// end, as `std::thread::scope` waits for its threads.
#[track_caller]
pub unsafe fn try_spawn_unjoined<'a, U, F>(
    sched: &Arc<dyn Schedule>,
    options: SpawnOptions,
    task: Arc<U>,
    f: F,
) -> io::Result<FiberId>
where
    U: UnjoinedTask,
    F: FnOnce() + Send + 'a,
{
    let location = Location::caller();
    // As in `try_spawn_with`.
    let outside = outside_spawn(sched)?;
    let id = crate::fiber::next_fiber_id();
    let span = crate::kind::fiber_spans().then(|| fiber_span(id, options.name.as_deref()));
    let _admitted = enter_gate(sched, outside)?;
    let (frame, stack) = sched.frames().acquire_with(options.stack_size, options.stack_now)?;
    let body = move || -> Exit {
        let fiber = current::get();
        // SAFETY: this body runs on the fiber's own stack, so `current` is
        // this fiber's frame and the running fiber owns its slots.
        if unsafe { (*fiber).phase() } != crate::pool::Phase::Open {
            // Never started: `f` is dropped here, on the fiber's stack, as
            // clean-up after a body that will never run (as above).
            // SAFETY: the running fiber marks its own slot.
            unsafe { (*fiber).note_body_returned() };
            drop_quietly(f);
            return Exit::Cancelled;
        }
        let outcome = catch_unwind(AssertUnwindSafe(f));
        // SAFETY: the running fiber marks its own slot.
        unsafe { (*fiber).note_body_returned() };
        // A scope left installed that panics when asked (see `try_spawn_with`)
        // ends nothing here: the layer already has the outcome.
        // SAFETY: as above (the running fiber, its own frame).
        let cancel_seen = unsafe { cancel_seen_at_end(fiber) }.unwrap_or_else(|late| {
            drop_quietly(late);
            false
        });
        // SAFETY: the body has returned: no `with_fiber_local` reference
        // of this fiber is alive.
        if let Err(payload) = catch_unwind(|| unsafe { crate::fiber::drop_fiber_locals() }) {
            // The payload's own `Drop` may panic: never into the worker.
            drop_quietly(payload);
        }
        drop_quietly(crate::fiber::swap_cancel_scope(None));
        match outcome {
            Ok(()) if !cancel_seen => Exit::Done,
            Ok(()) => Exit::Cancelled,
            Err(payload) => {
                drop_quietly(payload);
                Exit::Cancelled
            }
        }
    };
    let task = TaskRef::Shared(task);
    // SAFETY: the frame came from the pool in INIT and is ours; the pool's
    // `all` list keeps it alive for as long as the coroutine exists; `f`'s
    // borrows outlive its run or drop (this function's contract).
    unsafe {
        Fiber::prepare(&frame, id, crate::counts::acquire(sched), task, location, stack, body);
    }
    if let Some(span) = span {
        // SAFETY: the frame is still INIT and ours (not scheduled yet).
        unsafe { frame.set_span(span) };
    }
    frame.set_name(options.name);
    frame.set_pinned(options.pinned || sched.pins_fibers());
    frame.state.transition_to_runnable_from_init();
    sched.schedule(Runnable::new(frame, Actor::Spawner));
    Ok(id)
}

/// The span of a new fiber (`fiber_spans`): a root span, not a child of
/// the spawner's (which would stay open until its last descendant's span
/// closed, however long ago the spawner ended, and whose close then
/// recursed down the whole chain), linked to the spawner's span by
/// `follows_from` instead.
fn fiber_span(id: FiberId, name: Option<&str>) -> tracing::Span {
    let span = tracing::info_span!(target: "fiber", parent: None, "fiber", id = id.0, name = name.unwrap_or(""));
    span.follows_from(tracing::Span::current());
    span
}

/// A spawn's admission: a fiber of the runtime (on one of its workers, or
/// its teardown) always; anyone else only while the pool is open, holding
/// the pool's gate until dropped (after the fiber is scheduled: the
/// guard is the spawn's last local to go).
struct Admitted<'a>(Option<&'a crate::pool::FramePool>);

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        if let Some(pool) = self.0 {
            pool.spawn_done();
        }
    }
}

/// Is this a spawn from outside `sched`'s runtime (a plain thread, or a
/// fiber of another runtime)? Refused at once if the runtime is no longer
/// open: such a spawn never touches the gate.
fn outside_spawn(sched: &Arc<dyn Schedule>) -> io::Result<bool> {
    let fiber = current::get();
    // SAFETY: the running fiber reads its own scheduler slot. (A pointer
    // comparison first: this is on every spawn. Then the pool, for a
    // scheduler that hands its fibers another object than the one spawned
    // on: a fiber of the runtime is one whose scheduler owns this pool.)
    if !fiber.is_null() && unsafe { (*fiber).scheduler_ptr_is(sched) || (*fiber).scheduler_is(sched.frames()) } {
        return Ok(false);
    }
    if sched.frames().phase() != crate::pool::Phase::Open {
        return Err(refused());
    }
    Ok(true)
}

/// Take the pool's gate for a spawn from outside (`SpawnGate`): held until
/// the returned guard drops, after the fiber is scheduled. Nothing that
/// runs user code (a tracing subscriber, a destructor) may run while it is
/// held.
fn enter_gate(sched: &Arc<dyn Schedule>, outside: bool) -> io::Result<Admitted<'_>> {
    if !outside {
        return Ok(Admitted(None));
    }
    let pool = sched.frames();
    if pool.admit_spawn() {
        Ok(Admitted(Some(pool)))
    } else {
        Err(refused())
    }
}

fn refused() -> io::Error {
    io::Error::other("fiber spawn refused: the runtime is shutting down (or was dropped)")
}

/// Spawn `f` as a fiber of `sched`, panicking where [`try_spawn_on`]
/// returns an error.
#[track_caller]
pub fn spawn_on<F, T>(sched: &Arc<dyn Schedule>, f: F) -> JoinHandle<T>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    match try_spawn_on(sched, f) {
        Ok(handle) => handle,
        Err(e) => panic!("fiber spawn failed: {e}"),
    }
}

/// Spawn `f` on the scheduler of the running fiber.
///
/// # Panics
///
/// Panics when called outside a fiber, naming the function; start a runtime
/// first (or use [`spawn_on`] with a scheduler).
#[track_caller]
pub fn spawn<F, T>(f: F) -> JoinHandle<T>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let fiber = current::get();
    if fiber.is_null() {
        panic!(
            "fiber_core::spawn called outside a fiber: there is no scheduler to spawn on; start a \
             runtime (fiber::run) or call fiber_core::spawn_on with a scheduler"
        );
    }
    // A borrow, not a clone (the count is shared by every worker), taken
    // out of the closure so that `spawn_on` still sees our caller.
    // SAFETY: the running fiber reads its own scheduler slot, which nobody
    // writes while it runs; spawning does not finish it, so the slot's
    // `Arc` outlives the call.
    let sched: *const Arc<dyn Schedule> = unsafe { (*fiber).with_scheduler(|s| s as *const _) };
    // SAFETY: as above.
    spawn_on(unsafe { &*sched }, f)
}

/// The scheduler of the running fiber, or `None` on a plain thread.
pub fn current_scheduler() -> Option<Arc<dyn Schedule>> {
    let fiber = current::get();
    // SAFETY: the running fiber reads its own scheduler slot.
    (!fiber.is_null()).then(|| unsafe { (*fiber).scheduler() })
}

#[cfg(all(test, not(loom)))]
mod block_tests {
    use super::*;

    #[test]
    fn a_join_handle_is_unpin_whatever_its_value_as_with_arc() {
        fn unpin<U: Unpin>() {}
        unpin::<JoinHandle<std::marker::PhantomPinned>>();
        unpin::<Canceller>();
    }

    #[test]
    fn the_join_block_of_a_small_value_comes_from_the_pool() {
        assert!(
            crate::block::pooled::<Task<()>>(),
            "Task<()> outgrew the pool's size class"
        );
        assert!(
            crate::block::pooled::<Task<[u64; 4]>>(),
            "Task<[u64; 4]> outgrew the pool's size class"
        );
    }
}
