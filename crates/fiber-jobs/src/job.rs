//! The job: one state word, a parent, children, the first failure, the
//! cancel reason, waiters, and the fibers to interrupt on cancel.
//!
//! # States
//!
//! `ACTIVE -> COMPLETED | FAILED | CANCELLING`, `CANCELLING -> CANCELLED |
//! FAILED`. Terminal states never change. Every change goes through
//! [`transition`], which checks the edge and fails fast naming from, to and
//! actor.
//!
//! # Protocol
//!
//! * A job finalizes when its body is done and no attached child is active:
//!   FAILED if a failure was recorded (failure dominates cancellation),
//!   else CANCELLED if it was cancelling, else COMPLETED. Finalizing wakes
//!   every waiter once and reports to the parent.
//! * A child's failure, in a non-supervisor parent, is recorded as the
//!   parent's failure and cancels the parent (and so the siblings).
//! * `cancel(reason)`: ACTIVE -> CANCELLING by CAS (the first request wins
//!   the transition); a later explicit cancel replaces a `TimedOut` reason
//!   (timeout loses to an explicit reason), never the reverse. Then every
//!   fiber of the job is interrupted and every child cancelled.
//! * Cancel vs park: the job's flag is stored, then `fence(SeqCst)`, then
//!   fibers are interrupted; a parking fiber stores PARKING, fences, then
//!   reads the flag (fiber-core's Dekker pair), so no cancel is lost.

use crate::stats::{bump, Counter};
use crate::sync::{lock, AtomicBool, AtomicU8, Mutex, Ordering};
use fiber_core::{fiber_wait, Interrupt, Publish, WaitOptions, WaitResult, Waitable, Waiter};
use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::time::Instant;

/// Job states: `Active -> Completed | Failed | Cancelling`,
/// `Cancelling -> Cancelled | Failed`; terminal states never change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum JobState {
    /// Running (its body, or waiting for its children).
    Active = 0,
    /// Cancellation requested; finishing.
    Cancelling = 1,
    /// Ended by cancellation.
    Cancelled = 2,
    /// Ended normally.
    Completed = 3,
    /// Ended by a failure (its own, or a child's).
    Failed = 4,
}

impl JobState {
    fn from_u8(v: u8) -> JobState {
        match v {
            0 => JobState::Active,
            1 => JobState::Cancelling,
            2 => JobState::Cancelled,
            3 => JobState::Completed,
            4 => JobState::Failed,
            other => panic!("job state word holds an unknown state {other}"),
        }
    }

    /// Is this a terminal state?
    pub fn is_terminal(self) -> bool {
        matches!(self, JobState::Cancelled | JobState::Completed | JobState::Failed)
    }
}

/// Who changes a job's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobActor {
    /// A cancellation request (user, parent, timeout, failing sibling).
    Canceller,
    /// The finalizer (body done and no active child).
    Finalizer,
}

/// Is `from -> to` by `actor` a legal job transition?
pub fn is_legal(from: JobState, to: JobState, actor: JobActor) -> bool {
    use JobActor::*;
    use JobState::*;
    matches!(
        (from, to, actor),
        (Active, Cancelling, Canceller)
            | (Active, Completed | Failed, Finalizer)
            | (Cancelling, Cancelled | Failed, Finalizer)
    )
}

#[cold]
#[track_caller]
fn illegal(from: JobState, to: JobState, actor: JobActor) -> ! {
    panic!("illegal job transition {from:?} -> {to:?} by {actor:?} (spec/jobs.md, state machine)")
}

/// Why a job was cancelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CancelReason {
    /// `Job::cancel`, or a cancelled parent.
    Cancelled,
    /// `with_timeout`'s deadline.
    TimedOut,
    /// The job failed: its own body panicked (or, in `try_scope`, returned
    /// an error), or a child of it failed (non-supervisor parent).
    ChildFailed,
}

/// A panic payload that either the joiner or the scope takes.
pub(crate) type SharedPayload = Arc<Mutex<Option<Box<dyn Any + Send + 'static>>>>;

/// What a failed job holds for whoever joins.
pub(crate) enum Failure {
    /// A panic payload, shared with the failed child's join handle (the
    /// first to take it gets it).
    Panic(SharedPayload),
    /// A `try_scope` child returned an error (the value itself went to the
    /// scope, which returns it).
    Error,
}

impl fmt::Debug for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Panic(_) => f.write_str("Panic(..)"),
            Failure::Error => f.write_str("Error"),
        }
    }
}

struct Sync_ {
    /// Attached children (to cancel them with this job). A child that
    /// ends is not removed at once: its `Arc` stays until the job's own
    /// thread sweeps the finished ones (at the next attach once they are
    /// at least half, and when the scope owner's wait for its children
    /// returns; a standalone job, which has no owner thread, sweeps as its
    /// children end, see `on_child_terminal`). So attach and detach stay O(1) without hashing (design
    /// 4.18, "O(n) completion"), the child's last reference is usually
    /// dropped on the thread that allocated it (no cross-thread free,
    /// which with glibc's arenas takes the allocating arena's lock), and a
    /// finishing child takes the parent's lock only briefly.
    children: Vec<Arc<JobCore>>,
    active_children: usize,
    body_done: bool,
    /// Joiners of this job (woken when it ends).
    waiters: WaiterSet,
    /// The scope owner waiting for the children (woken when the last
    /// active child ends). Kept apart from `waiters`: a job whose children
    /// run one at a time reaches zero active children once per child, and
    /// waking every joiner each time (they found the job still running and
    /// parked again) made n children with n joiners cost O(n^2) wakes.
    child_waiter: Option<Waiter>,
    /// A second fiber waits for the children at the same time (not done by
    /// this crate's scopes; kept correct anyway): its record went to
    /// `waiters`, which the last child then wakes too.
    child_waiters_in_set: bool,
    failure: Option<Failure>,
    /// The failure was handed to the (non-supervisor) parent before this
    /// job ended (`FinalStep::HandUp`): the job still ends FAILED.
    failure_handed_up: bool,
    /// Panics of children that failed after `failure` was recorded (the
    /// first failure wins), kept so that a scope can still raise one whose
    /// payload no join took (almost always empty: no allocation).
    later_panics: Vec<SharedPayload>,
    /// Completion handlers (`Job::invoke_on_completion`), in registration
    /// order; taken by the finalize that ends the job and run once its
    /// lock is released (almost always empty: no allocation).
    on_completion: Vec<CompletionHandler>,
    /// The fibers running in this job (`ModelFiber`s under loom).
    /// Inline room for one: a job almost always runs exactly one fiber, and
    /// a heap buffer per job cost an allocation and a free per child.
    #[cfg(not(loom))]
    fibers: smallvec::SmallVec<[fiber_core::FiberRef; 1]>,
    #[cfg(loom)]
    fibers: Vec<Arc<fiber_core::FiberRef>>,
}

/// A scoped child's outcome (`scope.rs`'s `Outcome<T>`), type-erased so
/// that the job, allocated once per child, carries it too: a second
/// allocation per child (a separate slot shared by the child and its handle)
/// cost a malloc and, when the child ran on another worker, a cross-thread
/// free. Guarded by the job lock until the job ends; after that only the
/// handle touches it ([`OutcomeCell`]). Small outcomes live inline, larger
/// ones in a box.
///
/// Every access names the outcome type; all accesses to one job name the
/// same type (the child and its handle are made together, with one `T`).
/// A value still here when the job is dropped (its handle was leaked with
/// `mem::forget`) is leaked, never dropped: it may borrow from a scope that
/// has ended.
struct OutcomeSlot {
    data: std::mem::MaybeUninit<[usize; OUTCOME_INLINE_WORDS]>,
    /// A value is stored (inline, or as a box pointer in `data`).
    present: bool,
    /// The handle is gone: the child keeps (and drops) its own outcome.
    handle_gone: bool,
}

const OUTCOME_INLINE_WORDS: usize = 4;

impl Default for OutcomeSlot {
    fn default() -> Self {
        OutcomeSlot {
            data: std::mem::MaybeUninit::uninit(),
            present: false,
            handle_gone: false,
        }
    }
}

impl OutcomeSlot {
    const fn inline<V>() -> bool {
        std::mem::size_of::<V>() <= std::mem::size_of::<[usize; OUTCOME_INLINE_WORDS]>()
            && std::mem::align_of::<V>() <= std::mem::align_of::<usize>()
    }

    /// Store `value`, or give it back if the handle is gone or the job has
    /// ended (`job_ended`: the handle may read the slot without the lock).
    ///
    /// # Safety
    ///
    /// Every access to this slot names the same `V`, and `V` is `Send`
    /// (the value moves from the child's thread to the handle's).
    unsafe fn store<V>(&mut self, value: V, job_ended: bool) -> Option<V> {
        if self.handle_gone || job_ended {
            return Some(value);
        }
        debug_assert!(!self.present, "a child stores its outcome once");
        let at = self.data.as_mut_ptr().cast::<u8>();
        if Self::inline::<V>() {
            // SAFETY: `data` is big and aligned enough for a `V` (checked
            // above) and holds no value (`present` is false).
            unsafe { at.cast::<V>().write(value) };
        } else {
            // SAFETY: as above, for the box pointer.
            unsafe { at.cast::<*mut V>().write(Box::into_raw(Box::new(value))) };
        }
        self.present = true;
        None
    }

    /// The handle takes the outcome (if the child left one) and is gone.
    ///
    /// # Safety
    ///
    /// Every access to this slot names the same `V`, and `V` is `Send`
    /// (the value moves from the child's thread to the handle's).
    unsafe fn take<V>(&mut self) -> Option<V> {
        self.handle_gone = true;
        if !std::mem::replace(&mut self.present, false) {
            return None;
        }
        let at = self.data.as_ptr().cast::<u8>();
        if Self::inline::<V>() {
            // SAFETY: `present` said `data` holds a `V` (same `V` as the
            // store: the caller's contract); it is moved out once.
            Some(unsafe { at.cast::<V>().read() })
        } else {
            // SAFETY: as above, `data` holds the pointer of a boxed `V`.
            Some(*unsafe { Box::from_raw(at.cast::<*mut V>().read()) })
        }
    }
}

/// The outcome slot of a job, outside the job's mutex so that a handle
/// that saw the job end takes its outcome without the lock (two locked
/// instructions less per join).
///
/// Discipline: the child stores its outcome and a handle that did not see
/// the job end takes it only while holding the job lock; once the job is
/// terminal (read with Acquire, pairing with the Release of the
/// finalizing transition, which the child's store under the lock
/// happens-before), nothing but the job's one handle touches the slot
/// again, so that handle may take it without the lock.
#[cfg(not(loom))]
struct OutcomeCell(std::cell::UnsafeCell<OutcomeSlot>);

// SAFETY: the slot holds a `Send` value (every access names a `V: Send`,
// `OutcomeSlot::store`'s contract) and is only accessed under the
// discipline above: by one thread at a time, each access ordered after the
// previous one by the job lock or by the terminal state's Release/Acquire.
#[cfg(not(loom))]
unsafe impl Sync for OutcomeCell {}

/// `reason` word: no reason recorded.
const NO_REASON: u8 = 0;

fn reason_to_word(reason: CancelReason) -> u8 {
    match reason {
        CancelReason::Cancelled => 1,
        CancelReason::TimedOut => 2,
        CancelReason::ChildFailed => 3,
    }
}

fn reason_from_word(word: u8) -> Option<CancelReason> {
    match word {
        NO_REASON => None,
        1 => Some(CancelReason::Cancelled),
        2 => Some(CancelReason::TimedOut),
        3 => Some(CancelReason::ChildFailed),
        _ => unreachable!("a job's reason word holds 0 to 3"),
    }
}

/// One job.
pub(crate) struct JobCore {
    pub(crate) id: u64,
    state: AtomicU8,
    pub(crate) supervisor: bool,
    /// Does a failure of this job travel to its parent through the tree?
    /// Spawned children: yes. Scopes and timeouts: no (their failure travels
    /// by unwinding or return value in the fiber that runs them).
    propagates: bool,
    /// Made by `Job::new` / `Job::new_supervisor`: no body runs in it. Its
    /// "body" is done when `complete` is called or when it leaves ACTIVE
    /// (cancelled, failed, timed out): from then on it ends as soon as its
    /// children have.
    standalone: bool,
    pub(crate) parent: Option<Arc<JobCore>>,
    /// For a job made directly inside `fiber::non_cancellable` (it has no
    /// parent there): the job the fiber was running in. Not a parent: no
    /// cancellation or failure travels along it; only the check that
    /// refuses a join waiting for itself reads it.
    pub(crate) enclosing: Option<Arc<JobCore>>,
    sync: Mutex<Sync_>,
    /// Why the job was cancelled (`reason_to_word`; `NO_REASON` while it
    /// was not). Written only under the job lock, before the job ends, and
    /// never after: read under the lock, or without it once the job is
    /// seen terminal (its final value).
    reason: AtomicU8,
    /// This CANCELLING job's fibers have been interrupted and every job
    /// below it is cancelling too: a cancel walk that reached this job went
    /// all the way down (or the job had no unfinished child), after the
    /// interrupts. Until then a second `cancel` of the job interrupts and
    /// walks as well instead of returning at once (see
    /// [`JobCore::cancel`]). Only ever set, never cleared.
    subtree_cancelled: AtomicBool,
    /// A scoped child's outcome, waiting for its handle.
    #[cfg(not(loom))]
    outcome: OutcomeCell,
    /// The earliest `with_timeout` deadline of this job or an ancestor
    /// (inherited at creation). Fibers running in the job see it as a
    /// cancellation as soon as it passes, even before the timeout's
    /// watchdog fiber gets a worker to cancel the job (spec/jobs.md,
    /// "Timeouts").
    deadline: Option<Instant>,
    /// The park token of the fiber a scope spawns for this job (the job is
    /// that fiber's per-fiber block: see `fiber_core::UnjoinedTask`).
    #[cfg(not(loom))]
    park: fiber_core::ParkToken,
}

#[cfg(not(loom))]
impl fiber_core::UnjoinedTask for JobCore {
    fn park_token(&self) -> &fiber_core::ParkToken {
        &self.park
    }
}

/// What the locked half of a finalize leaves to do once the lock is
/// released.
enum FinalStep {
    /// The job ended: count, wake, report (`after_finalize`).
    Ended(Finalized),
    /// The job will end FAILED and hands its failure to a non-supervisor
    /// parent: the parent records it and starts cancelling first, then the
    /// job ends (finalize again). Whoever sees the child ended sees its
    /// parent already cancelling, as in Kotlin, where a failing child
    /// cancels its parent before it completes.
    HandUp(Failure),
}

/// A handler run once when a job ends, with its final state.
pub(crate) type CompletionHandler = Box<dyn FnOnce(JobState) + Send>;

/// What a finalize does after it releases the job lock.
struct Finalized {
    /// The job passed its deadline while ACTIVE: ACTIVE -> CANCELLING
    /// was taken first, logged with the final transition.
    timed_out: bool,
    /// The transition, logged once the lock is released.
    from: JobState,
    reason: Option<CancelReason>,
    state: JobState,
    waiters: Taken,
    /// A failure that ends here, dropped once the lock is released.
    discard: Option<Failure>,
    /// The ended children still listed, dropped once the lock is released.
    children: Vec<Arc<JobCore>>,
    /// The completion handlers, run once the lock is released.
    handlers: Vec<CompletionHandler>,
}

/// Finished children swept out of a list (inline for a small sweep: no
/// allocation for the list itself).
type Finished = smallvec::SmallVec<[Arc<JobCore>; SWEEP_AT]>;

/// Sweep finished children out of a job's list once they are at least
/// half of it (and at least this many).
const SWEEP_AT: usize = 6;

/// Run completion handlers in order. A handler that panics (the panic
/// hook has reported it) does not keep the others from running, nor the
/// job's end from reaching its parent: its panic, and a panic of its
/// payload's destructor, stop here.
///
/// Handlers never run inside a job that has ended. On the fiber that ends
/// a job, the fiber's current job is an ended one (the job itself, or the
/// last child whose end ended it): read there, `fiber::is_cancelled()`
/// would say true after a normal end, and a scope opened there would
/// attach under the ended job and start cancelled. So while the handlers
/// run, that fiber's job is `parent` (the parent of the job whose
/// handlers these are, alive while they run: it counts that job as an
/// active child until after them), with the fiber registered in it so
/// that its cancel interrupts a handler's wait; or no job, for a job
/// without a parent.
fn run_completion_handlers(handlers: Vec<CompletionHandler>, state: JobState, parent: Option<&Arc<JobCore>>) {
    #[cfg(not(loom))]
    let _outside = OutsideEndedJob::enter(parent);
    #[cfg(loom)]
    let _ = parent;
    for handler in handlers {
        if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || handler(state))) {
            if let Err(again) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(payload))) {
                std::mem::forget(again);
            }
        }
    }
}

/// While alive, the running fiber's cancellation scope is a live job (or
/// none) instead of an ended one (see [`run_completion_handlers`]); put
/// back on drop, also when a handler unwinds past it.
#[cfg(not(loom))]
struct OutsideEndedJob {
    /// `None` when the fiber's job had not ended (nothing was changed).
    restore: Option<Restore>,
}

/// What [`OutsideEndedJob`] puts back.
#[cfg(not(loom))]
struct Restore {
    /// The fiber's cancellation scope before (the ended job).
    previous: Option<Arc<dyn fiber_core::CancelScope>>,
    /// The job the fiber was registered in meanwhile, if this did it.
    registered: Option<Arc<JobCore>>,
}

#[cfg(not(loom))]
impl OutsideEndedJob {
    fn enter(parent: Option<&Arc<JobCore>>) -> OutsideEndedJob {
        let Some(current) = fiber_core::current_cancel_scope() else {
            return OutsideEndedJob { restore: None };
        };
        let current: Arc<dyn Any + Send + Sync> = current;
        let ended = current.downcast::<JobCore>().is_ok_and(|job| job.state().is_terminal());
        if !ended {
            return OutsideEndedJob { restore: None };
        }
        let parent = parent.cloned();
        // Registered for the handlers' time unless it is already (the
        // fiber runs the parent's body too): only an entry made here is
        // taken out again.
        let registered = match (&parent, fiber_core::current_fiber()) {
            (Some(parent), Some(me)) => parent.add_fiber_if_absent(me).then(|| parent.clone()),
            _ => None,
        };
        let previous = fiber_core::swap_cancel_scope(parent.map(|p| p as Arc<dyn fiber_core::CancelScope>));
        OutsideEndedJob {
            restore: Some(Restore { previous, registered }),
        }
    }
}

#[cfg(not(loom))]
impl Drop for OutsideEndedJob {
    fn drop(&mut self) {
        if let Some(Restore { previous, registered }) = self.restore.take() {
            drop(fiber_core::swap_cancel_scope(previous));
            if let (Some(job), Some(me)) = (registered, fiber_core::current_id()) {
                job.remove_one_fiber(me);
            }
        }
    }
}

/// Move the finished children out of `children` (their `Arc`s are dropped
/// by the caller, after it releases the lock).
fn take_finished(children: &mut Vec<Arc<JobCore>>) -> Finished {
    let mut finished = Finished::new();
    let mut i = 0;
    while i < children.len() {
        if children[i].state().is_terminal() {
            finished.push(children.swap_remove(i));
        } else {
            i += 1;
        }
    }
    finished
}

impl fmt::Debug for JobCore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Job")
            .field("id", &self.id)
            .field("state", &self.state())
            .finish_non_exhaustive()
    }
}

fn next_job_id() -> u64 {
    // Not a protocol: a unique counter. Padded, like fiber-core's fiber id
    // counter: every job creation writes it, and no flag that workers read
    // on their hot paths may share its line.
    static NEXT: crossbeam_utils::CachePadded<std::sync::atomic::AtomicU64> =
        crossbeam_utils::CachePadded::new(std::sync::atomic::AtomicU64::new(1));
    thread_local! {
        static BLOCK: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
    }
    // Taken in blocks per thread: unique, not in creation order across
    // threads.
    fiber_core::unique_id_from(&NEXT, &BLOCK)
}

/// Apply a checked transition. Returns `false` if the word was not `from`.
///
/// Every caller holds the job lock (the `_locked` borrow of the lock's
/// data says so), and only this function writes the word, so it cannot
/// change between the check and the store: a plain load and store are
/// exact, where a compare-exchange was a locked instruction for nothing,
/// two per job.
fn transition(word: &AtomicU8, from: JobState, to: JobState, actor: JobActor, _locked: &Sync_) -> bool {
    if !is_legal(from, to, actor) {
        illegal(from, to, actor);
    }
    // Relaxed: the previous transition's store happened before this
    // caller took the lock (its writer released it since).
    if word.load(Ordering::Relaxed) != from as u8 {
        return false;
    }
    // Release: publishes the job's recorded failure/reason (written under
    // the lock before) to `state()` readers' Acquire loads.
    word.store(to as u8, Ordering::Release);
    true
}

impl JobCore {
    /// The `tracing` event of one state transition (DEBUG, target
    /// `fiber_jobs`): job id, parent id, from, to and reason, by name.
    fn trace_transition(&self, from: JobState, to: JobState, reason: Option<CancelReason>) {
        tracing::debug!(
            target: "fiber_jobs",
            job = self.id,
            parent = ?self.parent.as_ref().map(|p| p.id),
            from = ?from,
            to = ?to,
            reason = ?reason,
            "job state"
        );
    }

    /// A new ACTIVE job, attached to `parent` unless `detached`.
    pub(crate) fn new(parent: Option<Arc<JobCore>>, supervisor: bool, propagates: bool) -> Arc<JobCore> {
        JobCore::with_deadline(parent, supervisor, propagates, None)
    }

    /// A standalone job (`Job::new`): ACTIVE, no body, attached to
    /// `parent` (whose failure handling it joins, as a spawned child) if
    /// given.
    pub(crate) fn standalone(parent: Option<Arc<JobCore>>, supervisor: bool) -> Arc<JobCore> {
        let propagates = parent.is_some();
        JobCore::make(parent, supervisor, propagates, None, true)
    }

    /// [`JobCore::new`] with a deadline of its own (`with_timeout`'s job);
    /// the job keeps the earlier of it and its parent's.
    pub(crate) fn with_deadline(
        parent: Option<Arc<JobCore>>,
        supervisor: bool,
        propagates: bool,
        deadline: Option<Instant>,
    ) -> Arc<JobCore> {
        JobCore::make(parent, supervisor, propagates, deadline, false)
    }

    fn make(
        parent: Option<Arc<JobCore>>,
        supervisor: bool,
        propagates: bool,
        deadline: Option<Instant>,
        standalone: bool,
    ) -> Arc<JobCore> {
        let inherited = parent.as_ref().and_then(|p| p.deadline);
        let deadline = match (deadline, inherited) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let fresh =
            |parent: Option<Arc<JobCore>>| JobCore::alloc(parent, None, supervisor, propagates, deadline, standalone);
        let Some(parent) = parent else {
            let job = fresh(None);
            job.count_root_created();
            return job;
        };
        // Allocated before the parent's lock is taken (a short critical
        // section), attached under it. The job takes the caller's
        // reference to its parent (no second count update).
        let job = fresh(Some(parent));
        let parent = job.parent.as_ref().expect("a child job has its parent");
        let attached = job.clone();
        let (cancelling, finished) = {
            let mut sync = lock(&parent.sync);
            let finished = if sync.children.len() >= SWEEP_AT && sync.children.len() >= 2 * sync.active_children {
                take_finished(&mut sync.children)
            } else {
                Finished::new()
            };
            sync.children.push(attached);
            sync.active_children += 1;
            // A parent past its (own or inherited) `with_timeout` deadline
            // reads as cancelling: its new child starts cancelled too.
            (parent.state() != JobState::Active || parent.deadline_passed(), finished)
        };
        // The finished children's last references, outside the lock.
        drop(finished);
        bump(Counter::JobsCreated, 1);
        crate::trace_event!("JOB_CREATE", job.id, parent = Some(parent.id));
        crate::trace_event!("JOB_CHILD_ATTACH", job.id, parent = parent.id);
        if cancelling {
            // A child of a cancelling job starts cancelled.
            job.cancel_contained(CancelReason::Cancelled);
        }
        job
    }

    /// A new ACTIVE job with no parent, made directly inside
    /// `fiber::non_cancellable` while the fiber ran in `enclosing` (see
    /// the field). Its own deadline only: the held-off job's does not
    /// reach it either.
    #[cfg(not(loom))]
    pub(crate) fn held_off(
        enclosing: Option<Arc<JobCore>>,
        supervisor: bool,
        deadline: Option<Instant>,
    ) -> Arc<JobCore> {
        let job = JobCore::alloc(None, enclosing, supervisor, false, deadline, false);
        job.count_root_created();
        job
    }

    /// A new ACTIVE job's memory: no counting, no tracing, not attached.
    fn alloc(
        parent: Option<Arc<JobCore>>,
        enclosing: Option<Arc<JobCore>>,
        supervisor: bool,
        propagates: bool,
        deadline: Option<Instant>,
        standalone: bool,
    ) -> Arc<JobCore> {
        // The job counters join the runtime's shutdown report (FIBER_STATS=1).
        static REPORTER: std::sync::Once = std::sync::Once::new();
        REPORTER.call_once(|| fiber_core::register_stats_reporter(crate::stats::report));
        Arc::new(JobCore {
            id: next_job_id(),
            state: AtomicU8::new(JobState::Active as u8),
            supervisor,
            propagates,
            standalone,
            parent,
            enclosing,
            deadline,
            sync: Mutex::new(Sync_ {
                children: Vec::new(),
                active_children: 0,
                body_done: false,
                waiters: WaiterSet::default(),
                child_waiter: None,
                child_waiters_in_set: false,
                failure: None,
                failure_handed_up: false,
                later_panics: Vec::new(),
                on_completion: Vec::new(),
                fibers: Default::default(),
            }),
            reason: AtomicU8::new(NO_REASON),
            subtree_cancelled: AtomicBool::new(false),
            #[cfg(not(loom))]
            outcome: OutcomeCell(std::cell::UnsafeCell::new(OutcomeSlot::default())),
            #[cfg(not(loom))]
            park: fiber_core::ParkToken::default(),
        })
    }

    /// A new ACTIVE root job (no parent), neither counted nor traced yet:
    /// the caller does that ([`count_root_created`](Self::count_root_created))
    /// once the job is where a nested lookup finds it. A fiber's lazily
    /// made root job is installed first: a `tracing` layer that asks for
    /// the current job from the creation event would otherwise find none
    /// and make another, and so on until the stack overflowed.
    #[cfg(not(loom))]
    pub(crate) fn new_root_uncounted() -> Arc<JobCore> {
        JobCore::alloc(None, None, false, false, None, false)
    }

    /// Count and trace the creation of a root job made by
    /// [`new_root_uncounted`](Self::new_root_uncounted) (or by `new`).
    pub(crate) fn count_root_created(&self) {
        bump(Counter::JobsCreated, 1);
        crate::trace_event!("JOB_CREATE", self.id, parent = None::<u64>);
    }

    /// Has this job's `with_timeout` deadline (its own or an ancestor's)
    /// passed? One clock read, and none for a job without a deadline.
    pub(crate) fn deadline_passed(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    pub(crate) fn state(&self) -> JobState {
        // Acquire: pairs with the Release of `transition`.
        JobState::from_u8(self.state.load(Ordering::Acquire))
    }

    pub(crate) fn is_cancelled(&self) -> bool {
        self.state() != JobState::Active
    }

    /// Was this job cancelled on its own (its handle's `cancel`), with its
    /// parent still ACTIVE and not past a deadline? Then the error its
    /// body returns is that cancellation passed on, not a failure of the
    /// group (Kotlin's parents ignore a child's `CancellationException`).
    #[cfg(not(loom))]
    pub(crate) fn cancelled_alone(&self) -> bool {
        self.is_cancelled()
            && self
                .parent
                .as_ref()
                .is_some_and(|p| p.observed_state() == JobState::Active)
    }

    /// The state a user sees (`Job::state`): an ACTIVE job past its
    /// `with_timeout` deadline (its own or an ancestor's) is CANCELLING from
    /// that instant, as the fiber's own cancellation check sees it
    /// (`CancelScope::is_cancelled` below), even before the timer has
    /// cancelled it. Only reads.
    #[cfg(not(loom))]
    pub(crate) fn observed_state(&self) -> JobState {
        match self.state() {
            JobState::Active if self.deadline_passed() => JobState::Cancelling,
            state => state,
        }
    }

    /// The recorded cancel reason. Written at most once (when the job
    /// leaves ACTIVE), so a read without the lock sees either no reason or
    /// the final one.
    pub(crate) fn reason(&self) -> Option<CancelReason> {
        // Relaxed: the word is written once, under the job lock; a reader
        // that must see it (a joiner after the end) is ordered after that
        // write by the terminal state's Acquire.
        reason_from_word(self.reason.load(Ordering::Relaxed))
    }

    /// Record the reason as the job leaves ACTIVE (under its lock: the
    /// guard is the proof).
    fn set_reason(&self, _locked: &mut Sync_, reason: CancelReason) {
        // Relaxed: see `reason`; the state transition that follows under
        // the same lock (or a later one's release) publishes it.
        self.reason.store(reason_to_word(reason), Ordering::Relaxed);
    }

    /// Run `handler` once with the job's final state: now, on the caller,
    /// if the job has ended; otherwise when it ends, on the thread that
    /// ends it (decided under the job lock that the finalize holds while it
    /// takes the handlers, so a handler is never lost or run twice).
    pub(crate) fn invoke_on_completion(&self, handler: CompletionHandler) {
        let ended = {
            let mut sync = lock(&self.sync);
            let state = self.state();
            if state.is_terminal() {
                Some((state, handler))
            } else {
                sync.on_completion.push(handler);
                None
            }
        };
        if let Some((state, handler)) = ended {
            run_completion_handlers(vec![handler], state, self.parent.as_ref());
        }
    }

    /// `Job::complete` of a standalone job: its body is done, so it ends
    /// (COMPLETED, or as its children's failures decide) once its children
    /// have. `false` if it had left ACTIVE or was completed already.
    pub(crate) fn complete(self: &Arc<Self>) -> bool {
        debug_assert!(self.standalone, "only a standalone job has no body of its own to end");
        let step = {
            let mut sync = lock(&self.sync);
            if sync.body_done || self.state() != JobState::Active {
                return false;
            }
            self.mark_body_done_locked(&mut sync)
        };
        self.finish_finalize(step);
        true
    }

    /// Was this job made by `Job::new` / `Job::new_supervisor`?
    pub(crate) fn is_standalone(&self) -> bool {
        self.standalone
    }

    /// The attached children that have not ended (a snapshot taken under
    /// the job's lock; in no particular order: the sweep of ended children
    /// reorders the list).
    #[cfg(not(loom))]
    pub(crate) fn live_children(&self) -> Vec<Arc<JobCore>> {
        let sync = lock(&self.sync);
        sync.children
            .iter()
            .filter(|c| !c.state().is_terminal())
            .cloned()
            .collect()
    }

    /// The reason a user sees (`Job::cancel_reason`): the recorded one, or
    /// `TimedOut` for an ACTIVE job past its deadline (as
    /// [`observed_state`](Self::observed_state) reads it CANCELLING). Read
    /// under the job lock, where the state and the reason change together:
    /// a cancel landing between two separate reads would otherwise show a
    /// job that was never timed out as `TimedOut` for a moment.
    #[cfg(not(loom))]
    pub(crate) fn observed_reason(&self) -> Option<CancelReason> {
        let _sync = lock(&self.sync);
        match self.reason() {
            None if self.state() == JobState::Active && self.deadline_passed() => Some(CancelReason::TimedOut),
            reason => reason,
        }
    }

    /// Register a fiber running in this job (to interrupt on cancel).
    #[cfg(loom)]
    pub(crate) fn add_model_fiber(&self, fiber: Arc<fiber_core::FiberRef>) {
        let cancelled = {
            let mut sync = lock(&self.sync);
            sync.fibers.push(fiber.clone());
            self.is_cancelled()
        };
        if cancelled {
            fiber.interrupt();
        }
    }

    /// Does a fiber that has neither ended nor been given up by its
    /// runtime run in this job (see `fiber_abandoned`)?
    #[cfg(not(loom))]
    fn runs_a_live_fiber(&self) -> bool {
        lock(&self.sync).fibers.iter().any(|f| !f.has_ended_or_been_given_up())
    }

    #[cfg(loom)]
    fn runs_a_live_fiber(&self) -> bool {
        false
    }

    /// Register a fiber running in this job (to interrupt on cancel).
    #[cfg(not(loom))]
    pub(crate) fn add_fiber(&self, fiber: fiber_core::FiberRef) {
        // The list takes the caller's reference; a second one is made only
        // in the rare case that needs it (two atomic updates per child
        // otherwise).
        let to_interrupt = {
            let mut sync = lock(&self.sync);
            let cancelled = self.is_cancelled().then(|| fiber.clone());
            sync.fibers.push(fiber);
            cancelled
        };
        if let Some(fiber) = to_interrupt {
            fiber.interrupt();
        }
    }

    #[cfg(not(loom))]
    pub(crate) fn remove_fiber(&self, id: fiber_core::FiberId) {
        lock(&self.sync).fibers.retain(|f| f.id() != id);
    }

    /// [`add_fiber`](Self::add_fiber) unless the fiber is registered
    /// already; whether it added it (then [`remove_one_fiber`](Self::remove_one_fiber)
    /// takes that entry out again, and any earlier one stays).
    #[cfg(not(loom))]
    fn add_fiber_if_absent(&self, fiber: fiber_core::FiberRef) -> bool {
        let to_interrupt = {
            let mut sync = lock(&self.sync);
            if sync.fibers.iter().any(|f| f.id() == fiber.id()) {
                return false;
            }
            let cancelled = self.is_cancelled().then(|| fiber.clone());
            sync.fibers.push(fiber);
            cancelled
        };
        if let Some(fiber) = to_interrupt {
            fiber.interrupt();
        }
        true
    }

    /// Take one registration of the fiber `id` out (see
    /// [`add_fiber_if_absent`](Self::add_fiber_if_absent)).
    #[cfg(not(loom))]
    fn remove_one_fiber(&self, id: fiber_core::FiberId) {
        let mut sync = lock(&self.sync);
        if let Some(at) = sync.fibers.iter().position(|f| f.id() == id) {
            sync.fibers.remove(at);
        }
    }

    /// Request cancellation (and of every child). When this returns, the
    /// job and every job below it are cancelling (or ended), as Go's
    /// `context` cancel leaves every derived context done: a job found
    /// CANCELLING already, whose first canceller is still part way down
    /// its subtree (or parked in a `tracing` callback there), is walked
    /// again here rather than taken as done. A fiber that cancels an
    /// enclosing job and then checks `fiber::is_cancelled()` sees `true`.
    pub(crate) fn cancel(&self, reason: CancelReason) {
        if let Some(payload) = self.cancel_collect(reason) {
            std::panic::resume_unwind(payload);
        }
    }

    /// [`cancel`](Self::cancel) made by the runtime on its own (a scope
    /// closing after its body failed, a failure handed up, a deadline, a
    /// shutdown): a `tracing` layer's panic is reported and contained
    /// (spec/lifecycle.md section 10), never raised part way through the
    /// step that called it. Raised, it unwound a closing scope before its
    /// children were joined (they still borrowed the scope owner's stack)
    /// and skipped the step that ends a job, so its scope waited for ever
    /// (`adversarial/layer_panics.rs`).
    pub(crate) fn cancel_contained(&self, reason: CancelReason) {
        if let Some(payload) = self.cancel_collect(reason) {
            #[cfg(not(loom))]
            fiber_core::layer_panicked("tracing a job's cancellation", payload);
            // (The models install no layer.)
            #[cfg(loom)]
            std::panic::resume_unwind(payload);
        }
    }

    /// Record a failure (the first one is kept) and cancel the job so the
    /// rest of it stops (`ChildFailed` when it came from a child); a
    /// `tracing` layer's panic is contained as in
    /// [`cancel_contained`](Self::cancel_contained).
    pub(crate) fn fail_contained(&self, failure: Failure, reason: CancelReason) {
        self.record_failure(failure);
        self.cancel_contained(reason);
    }

    /// The walk of [`cancel`](Self::cancel); returns the first panic of a
    /// `tracing` layer met on the way, for the caller to raise or report.
    fn cancel_collect(&self, reason: CancelReason) -> Option<Box<dyn Any + Send>> {
        // The subtree is walked with a list, not by recursion: a chain of
        // hundreds of nested scopes would overflow the canceller's stack (a
        // fiber's is 256 KiB).
        // A `tracing` layer's callback (the "job state" event of each job
        // turned CANCELLING) may panic: the walk still goes all the way
        // down, and the first such panic reaches the caller after it, so
        // no job is left reading cancelled with its fibers asleep (Kotlin
        // runs every cancellation handler before it reports one that
        // threw).
        let mut panicked = None;
        let Some(mut pending) = self.cancel_one(reason, &mut panicked) else {
            return panicked;
        };
        // The jobs with children this walk went down into: their subtrees
        // are cancelled once the walk is over (a job without one was
        // marked by `cancel_one`).
        let root_walked = !pending.is_empty();
        let mut walked: Vec<Arc<JobCore>> = Vec::new();
        while let Some(child) = pending.pop() {
            if let Some(grandchildren) = child.cancel_one(CancelReason::Cancelled, &mut panicked) {
                if !grandchildren.is_empty() {
                    walked.push(child);
                }
                // Listed in reverse: children are cancelled in the order
                // they were added, each subtree before the next sibling.
                pending.extend(grandchildren);
            }
        }
        if root_walked {
            self.mark_subtree_cancelled();
        }
        for job in walked {
            job.mark_subtree_cancelled();
        }
        panicked
    }

    /// Record that this job's fibers were interrupted and its subtree
    /// cancelled (see `subtree_cancelled`).
    fn mark_subtree_cancelled(&self) {
        // Release: pairs with the Acquire in `cancel_one`; a canceller that
        // reads the mark and returns at once is ordered after every state
        // change and interrupt of this walk, so it then sees the subtree
        // cancelling.
        self.subtree_cancelled.store(true, Ordering::Release);
    }

    /// Move this job alone to CANCELLING and interrupt its fibers. Returns
    /// the children still to cancel (in reverse order), or `None` if there
    /// is nothing below it to do for this request: the job ended, or it
    /// was cancelling already and a finished walk cancelled its subtree.
    /// A job cancelling already whose subtree is not known to be cancelled
    /// yet (its canceller is still on its way down) has its fibers
    /// interrupted again (a spurious wake-up at worst) and its children
    /// returned: a second canceller does the walk too, so that it returns
    /// only once the subtree is cancelled.
    ///
    /// A panic of the `tracing` callback that logs the state change is
    /// kept in `panicked` (the first one; a later one is dropped) for the
    /// caller to raise once its walk is over.
    fn cancel_one(
        &self,
        reason: CancelReason,
        panicked: &mut Option<Box<dyn Any + Send>>,
    ) -> Option<Vec<Arc<JobCore>>> {
        crate::trace_event!("JOB_CANCEL_REQ", self.id);
        let (reason, fibers, children, ended) = {
            let mut sync = lock(&self.sync);
            let first = match self.state() {
                JobState::Active => {
                    // A request that arrives after this job's deadline
                    // passed (its timer not fired yet: a busy machine)
                    // comes second: the job timed out first.
                    let reason = match (reason, self.deadline) {
                        (CancelReason::Cancelled, Some(d)) if Instant::now() >= d => CancelReason::TimedOut,
                        _ => reason,
                    };
                    self.set_reason(&mut sync, reason);
                    let moved = transition(
                        &self.state,
                        JobState::Active,
                        JobState::Cancelling,
                        JobActor::Canceller,
                        &sync,
                    );
                    debug_assert!(moved, "state changes only under the job lock");
                    // Counted once per job: only the request that changed
                    // the state.
                    bump(Counter::CancellationsRequested, 1);
                    true
                }
                // The first reason stands (Kotlin keeps the first
                // cancellation cause): an explicit cancel after a timeout
                // does not turn it into an explicit one, and a timeout
                // never replaces an explicit reason. Only the walk below
                // may still be unfinished.
                // Acquire: pairs with the Release of
                // `mark_subtree_cancelled`.
                JobState::Cancelling if !self.subtree_cancelled.load(Ordering::Acquire) => false,
                _ => return None,
            };
            // A standalone job (`Job::new`) has no body that could return:
            // leaving ACTIVE is its body's end, and with no child running
            // it ends here (under this lock, as every finalize).
            let ended = if first && self.standalone {
                self.mark_body_done_locked(&mut sync)
            } else {
                None
            };
            // Finished children (not swept yet) need no cancel.
            let children = sync
                .children
                .iter()
                .rev()
                .filter(|c| !c.state().is_terminal())
                .cloned()
                .collect::<Vec<_>>();
            (first.then(|| self.reason()), sync.fibers.clone(), children, ended)
        };
        // Logged outside the job's lock: a subscriber's callback may park
        // the calling fiber (`tracing_layers.rs`).
        if let Some(reason) = reason {
            let traced = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.trace_transition(JobState::Active, JobState::Cancelling, reason)
            }));
            if let Err(payload) = traced {
                if panicked.is_none() {
                    *panicked = Some(payload);
                } else {
                    // Said on stderr: only one panic can reach the caller.
                    #[cfg(not(loom))]
                    fiber_core::layer_panicked("logging a job's cancellation (a second panic in one cancel)", payload);
                    #[cfg(loom)]
                    drop(payload);
                }
            }
        }
        // After the CANCELLING transition's log: the end is logged next.
        if ended.is_some() {
            self.finish_finalize(ended);
        }
        // `interrupt` is the canceller's half of fiber-core's handshake
        // (`wait.rs::enter_parking`): state stored; fence(SeqCst); read the
        // fiber's state; wake it if it is PARKING or PARKED.
        for fiber in &fibers {
            fiber.interrupt();
        }
        if children.is_empty() {
            // Nothing below to walk (a child attached from now on starts
            // cancelled: `with_deadline`), and the fibers are interrupted:
            // marked only now, so a second canceller never returns before
            // a fiber parked in this job was woken.
            self.mark_subtree_cancelled();
        }
        Some(children)
    }

    /// Keep `failure` (the first one wins; later panics are kept aside).
    fn record_failure(&self, failure: Failure) {
        let mut sync = lock(&self.sync);
        match failure {
            failure if sync.failure.is_none() => sync.failure = Some(failure),
            Failure::Panic(payload) => sync.later_panics.push(payload),
            Failure::Error => {}
        }
    }

    /// The payloads of children that failed after the first (see
    /// `later_panics`), taken out of the job: the closing scope raises at
    /// most one of them and drops the rest.
    pub(crate) fn take_later_panics(&self) -> Vec<SharedPayload> {
        std::mem::take(&mut lock(&self.sync).later_panics)
    }

    /// The body returned (successfully or not); finalize if no child is
    /// active.
    pub(crate) fn body_done(self: &Arc<Self>) {
        let step = {
            let mut sync = lock(&self.sync);
            self.mark_body_done_locked(&mut sync)
        };
        self.finish_finalize(step);
    }

    /// A child ended in `state` (`Completed` for a child whose failure
    /// does not travel through the tree). A failed child that fails this
    /// job did so before it ended (`FinalStep::HandUp`).
    fn on_child_terminal(self: &Arc<Self>, state: JobState) {
        debug_assert!(
            state != JobState::Failed || self.supervisor || self.state() != JobState::Active,
            "a failed child cancelled its non-supervisor parent before it ended"
        );
        let mut sync = lock(&self.sync);
        // The child stays in `children` until a sweep (see the field).
        sync.active_children -= 1;
        // A standalone job has no owner thread to sweep its list, and may
        // be dropped without ever ending: its ended children are swept
        // here, all of them once none is active (amortized otherwise), so
        // that no ended child's `parent` link keeps it alive in a cycle
        // through the list.
        //
        // A job that had ended already (a child attached after its end: a
        // standalone job's `spawn` then, the child started cancelled) no
        // longer drops its list at a finalize, so its late children are
        // taken out here, or each would keep the other alive. (Read under
        // the lock: a job ends only under it.)
        let ended = self.state().is_terminal();
        let swept = if ended
            || self.standalone
                && (sync.active_children == 0 || sync.children.len() >= 2 * sync.active_children + SWEEP_AT)
        {
            take_finished(&mut sync.children)
        } else {
            Finished::new()
        };
        if sync.active_children != 0 {
            drop(sync);
            // Their last references, outside the lock.
            drop(swept);
            return;
        }
        // Wake whoever waits for the children (the scope owner), not the
        // joiners of this job: it has not ended.
        let mut waiters = Taken::new();
        waiters.push(sync.child_waiter.take());
        if std::mem::take(&mut sync.child_waiters_in_set) {
            waiters.extend(sync.waiters.take_all());
        }
        if !sync.body_done {
            drop(sync);
            Self::after_last_child(swept, waiters);
            return;
        }
        // A job whose body is done ends here, in the same critical section
        // that saw its last child end: released and taken again, the lock
        // let a child attach in between (a standalone job's `spawn` after
        // `complete`), and the job ended with that child running
        // (`loom_late_attach_racing_a_completed_standalone_jobs_last_child_end`).
        let step = self.finalize_locked(&mut sync);
        drop(sync);
        Self::after_last_child(swept, waiters);
        self.finish_finalize(step);
    }

    /// Outside the job lock, once a job's last active child has ended:
    /// drop the swept children's last references and wake the children's
    /// waiters.
    fn after_last_child(swept: Finished, waiters: Taken) {
        drop(swept);
        // Consumed: each record's frame reference moves into the run queue.
        // (Taken out in place: a by-value iterator would copy the list.)
        let mut waiters = waiters;
        for waiter in waiters.iter_mut().filter_map(Option::take) {
            waiter.wake();
        }
    }

    /// The unlocked half of a finalize: hand a failure up first if the
    /// locked half asked for it (then finalize again), or report the end.
    fn finish_finalize(&self, mut step: Option<FinalStep>) {
        loop {
            match step {
                None => return,
                Some(FinalStep::Ended(finalized)) => return self.after_finalize(finalized),
                Some(FinalStep::HandUp(failure)) => {
                    // Outside this job's lock: the parent's cancel takes
                    // the parent's lock, then its children's.
                    if let Some(parent) = &self.parent {
                        parent.fail_contained(failure, CancelReason::ChildFailed);
                    }
                    step = {
                        let mut sync = lock(&self.sync);
                        // Nothing attaches to a job whose body is done and
                        // whose children have ended; if something did, its
                        // end finalizes.
                        if sync.active_children == 0 {
                            self.finalize_locked(&mut sync)
                        } else {
                            None
                        }
                    };
                }
            }
        }
    }

    /// The body is done (it returned, or a standalone job's body counts as
    /// done): with no child running the job ends here, under the job lock
    /// the caller holds, as every finalize; the caller passes the step to
    /// [`finish_finalize`](Self::finish_finalize) once the lock is released.
    fn mark_body_done_locked(&self, sync: &mut Sync_) -> Option<FinalStep> {
        sync.body_done = true;
        if sync.active_children == 0 {
            self.finalize_locked(sync)
        } else {
            None
        }
    }

    /// The locked half of a finalize: the transition,
    /// and what to do once the lock is released. `None` if the job is
    /// already terminal.
    fn finalize_locked(&self, sync: &mut Sync_) -> Option<FinalStep> {
        {
            let mut current = self.state();
            if current.is_terminal() {
                return None;
            }
            // A failure this job hands to its parent goes there before the
            // job ends (`FinalStep::HandUp`). A job holding a failure is
            // already CANCELLING (`fail` cancels it), so the parent's
            // cancel finds nothing to do here.
            if sync.failure.is_some() && self.propagates && self.parent.as_ref().is_some_and(|p| !p.supervisor) {
                sync.failure_handed_up = true;
                return sync.failure.take().map(FinalStep::HandUp);
            }
            // An ACTIVE job past its deadline has read as cancelling since
            // that instant (`observed_state`), whether or not the timer's
            // cancel has run yet (a busy worker): it ends as if it had, so
            // no job is seen CANCELLING and then COMPLETED, and the result
            // does not depend on when the timer got a worker.
            let timed_out = current == JobState::Active && self.deadline_passed();
            if timed_out {
                self.set_reason(sync, CancelReason::TimedOut);
                let moved = transition(
                    &self.state,
                    JobState::Active,
                    JobState::Cancelling,
                    JobActor::Canceller,
                    sync,
                );
                debug_assert!(moved, "state changes only under the job lock");
                bump(Counter::CancellationsRequested, 1);
                current = JobState::Cancelling;
            }
            debug_assert_eq!(
                sync.active_children, 0,
                "invariant 1: terminal jobs have no active children"
            );
            let to = if sync.failure.is_some() || sync.failure_handed_up {
                JobState::Failed
            } else if current == JobState::Cancelling {
                JobState::Cancelled
            } else {
                JobState::Completed
            };
            let moved = transition(&self.state, current, to, JobActor::Finalizer, sync);
            debug_assert!(moved, "state changes only under the job lock");
            sync.fibers.clear();
            // A failed child handed its failure to a non-supervisor parent
            // (which re-raises or returns it) above; otherwise it stays
            // here.
            let hand_up = sync.failure_handed_up;
            // A child's failure that stays with it (a supervisor's child)
            // is not kept in the job: its panic payload would be dropped
            // with the job's last reference, which can be a frame being
            // recycled on a bare worker. It is dropped by the finishing
            // fiber instead (its handle holds its own reference).
            let discard = if self.propagates && !hand_up {
                sync.failure.take()
            } else {
                None
            };
            Some(FinalStep::Ended(Finalized {
                timed_out,
                from: current,
                reason: self.reason(),
                state: to,
                waiters: {
                    let mut waiters = sync.waiters.take_all();
                    // Normally woken already, when the last child ended.
                    if let Some(waiter) = sync.child_waiter.take() {
                        waiters.push(Some(waiter));
                    }
                    waiters
                },
                discard,
                // Every child has ended: the list goes, so no child's
                // `parent` link keeps a reference cycle alive.
                children: std::mem::take(&mut sync.children),
                handlers: std::mem::take(&mut sync.on_completion),
            }))
        }
    }

    /// The unlocked half of a finalize (called by [`finish_finalize`](Self::finish_finalize)): count, wake the
    /// waiters, report to the parent.
    fn after_finalize(&self, finalized: Finalized) {
        let Finalized {
            timed_out,
            from,
            reason,
            state: final_state,
            waiters,
            discard,
            children,
            handlers,
        } = finalized;
        // Outside the job's lock (see `cancel_one`).
        if timed_out {
            self.trace_transition(JobState::Active, JobState::Cancelling, reason);
        }
        self.trace_transition(from, final_state, reason);
        crate::trace_event!("JOB_FINALIZE", self.id, state = final_state);
        drop(children);
        // A panicking payload destructor must not stop the report to the
        // parent below (the scope would wait for this child forever).
        if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(discard))) {
            if let Err(again) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(payload))) {
                std::mem::forget(again);
            }
        }
        let counter = match final_state {
            JobState::Completed => Counter::JobsCompleted,
            JobState::Failed => Counter::JobsFailed,
            _ => Counter::JobsCancelled,
        };
        bump(counter, 1);
        // Every waiter taken here is woken once (a waker that finds it
        // still PARKING leaves WAKE_PENDING, which wakes it just the same).
        let woken = waiters.iter().flatten().count() as u64;
        if woken > 0 {
            bump(Counter::WaitersWoken, woken);
        }
        // Before the parked joiners wake and the parent hears of the end:
        // the scope the job is a child of returns only after they ran.
        if !handlers.is_empty() {
            run_completion_handlers(handlers, final_state, self.parent.as_ref());
        }
        // Consumed (`Waiter::wake`): each record's frame reference moves
        // into the run queue instead of a clone and a drop.
        // (Taken out in place: a by-value iterator would copy the list.)
        let mut waiters = waiters;
        for waiter in waiters.iter_mut().filter_map(Option::take) {
            waiter.wake();
            crate::trace_event!("JOB_WAIT_WAKE", self.id);
        }
        if let Some(parent) = &self.parent {
            let reported = if self.propagates {
                final_state
            } else {
                JobState::Completed
            };
            parent.on_child_terminal(reported);
        }
    }

    /// A scoped child's body ended with `outcome`: unregister its `fiber`,
    /// leave the outcome for the handle and mark the body done, under one
    /// lock. With the handle gone, the
    /// outcome comes back and the body is not marked done: the child drops
    /// the outcome, then calls [`body_done`](Self::body_done).
    ///
    /// # Safety
    ///
    /// Every outcome access on this job names the same `V`, and `V` is
    /// `Send`.
    #[cfg(not(loom))]
    pub(crate) unsafe fn finish_with_outcome<V>(
        self: &Arc<Self>,
        outcome: V,
        fiber: Option<fiber_core::FiberId>,
    ) -> Option<V> {
        let finalize = {
            let mut sync = lock(&self.sync);
            // The body's fiber leaves the job here, under the same lock.
            if let Some(fiber) = fiber {
                // Usually the job's only fiber.
                if sync.fibers.len() == 1 && sync.fibers[0].id() == fiber {
                    sync.fibers.clear();
                } else {
                    sync.fibers.retain(|f| f.id() != fiber);
                }
            }
            // A job ended before its body returned (a teardown ended it:
            // `fiber_abandoned`): its handle may already read the slot
            // without the lock, so the body keeps its outcome and drops it.
            // (Passed down rather than returned here: a second move of a
            // big outcome costs its size again in a debug build's frame.)
            let ended = self.state().is_terminal();
            // SAFETY: the caller's contract; the job lock is held and, if
            // the job has ended (read under the lock every end takes), the
            // slot is not touched.
            if let Some(unwanted) = unsafe { self.outcome_slot(&mut sync).store(outcome, ended) } {
                return Some(unwanted);
            }
            // No child left: finalized under this same lock.
            self.mark_body_done_locked(&mut sync)
        };
        self.finish_finalize(finalize);
        None
    }

    /// The handle takes the child's outcome, if it left one; from now on
    /// the child drops its own.
    ///
    /// # Safety
    ///
    /// Every outcome access on this job names the same `V`, and `V` is
    /// `Send`.
    #[cfg(not(loom))]
    pub(crate) unsafe fn take_outcome<V>(&self) -> Option<V> {
        let mut sync = lock(&self.sync);
        // SAFETY: the caller's contract; the job lock is held.
        unsafe { self.outcome_slot(&mut sync).take() }
    }

    /// [`take_outcome`](Self::take_outcome) and the cancel reason, as a
    /// join reads both. Without the job lock when the job has ended (the
    /// usual case: the join waited for that), under it otherwise.
    ///
    /// # Safety
    ///
    /// As for `take_outcome`, and the caller is the job's handle (no other
    /// handle exists: the slot has one taker).
    #[cfg(not(loom))]
    pub(crate) unsafe fn take_outcome_and_reason<V>(&self) -> (Option<V>, Option<CancelReason>) {
        // Acquire (in `state`): pairs with the Release of the finalizing
        // transition, after the child's store into the slot and the
        // reason's write (both under the job lock, before it). One call
        // site for the take: a large outcome is not copied once per path
        // (debug builds keep a stack slot for each).
        let _locked = if self.state().is_terminal() {
            None
        } else {
            Some(lock(&self.sync))
        };
        // SAFETY: the caller's contract; either the job lock is held, or
        // the job has ended, so no child store or lock holder touches the
        // slot again, and this handle is its only other user
        // (`OutcomeCell`).
        let outcome = unsafe { (*self.outcome.0.get()).take() };
        (outcome, self.reason())
    }

    /// The outcome slot, borrowed under the job lock (the guard's
    /// borrow is the proof, and bounds the slot's).
    ///
    /// # Safety
    ///
    /// No access to the slot without the lock runs at the same time: only
    /// the handle's after the job ended (`take_outcome_and_reason`), which
    /// no locked access follows, since after the end only that handle
    /// touches the slot, and it consumes itself.
    #[cfg(not(loom))]
    unsafe fn outcome_slot<'a>(&'a self, _locked: &'a mut Sync_) -> &'a mut OutcomeSlot {
        // SAFETY: the lock is held (the guard's borrow) and the contract
        // rules out an unlocked access at the same time.
        unsafe { &mut *self.outcome.0.get() }
    }

    /// Take the recorded failure (the scope re-raises or returns it).
    pub(crate) fn take_failure(&self) -> Option<Failure> {
        lock(&self.sync).failure.take()
    }

    /// Wait until the job is terminal. A cancellable point: if the waiting
    /// fiber's own job is cancelled first, returns `None`.
    #[track_caller]
    pub(crate) fn join(self: &Arc<Self>) -> Option<JobState> {
        // A job that already ended needs no wait (and no `Arc` clone).
        let state = self.state();
        if state.is_terminal() {
            return Some(state);
        }
        // Logged before the wait, not where the waiter is published (the
        // fiber is PARKING there, under the job's lock, and a subscriber
        // may park the calling fiber).
        crate::trace_event!("JOB_WAIT_REGISTER", self.id);
        match fiber_wait(&Join(self), &mut WaitSlot::default(), WaitOptions::new()) {
            WaitResult::Ok => Some(self.state()),
            _ => None,
        }
    }

    /// [`join`](Self::join) that cancellation does not end: a scope (or a
    /// fiber of it) joining one of its children, which is cancelled
    /// whenever the joiner is (it is below the joiner's job), so it ends
    /// soon; std's scoped join waits for the thread, and the value or the
    /// panic it reports is the caller's to handle.
    ///
    /// Not even teardown ends it (as the scope's own wait for its
    /// children): teardown ends the child, which is all the wait needs,
    /// and a joiner that is unwinding there (a destructor that opens a
    /// scope) must park at once so that teardown's thread can run the
    /// child, rather than hold that thread as for a lock
    /// (`a_scoped_join_in_a_destructor_run_by_teardown_reports_cancelled`).
    #[track_caller]
    pub(crate) fn join_child(self: &Arc<Self>) -> Option<JobState> {
        let state = self.state();
        if state.is_terminal() {
            return Some(state);
        }
        // As in `join`.
        crate::trace_event!("JOB_WAIT_REGISTER", self.id);
        match fiber_wait(
            &Join(self),
            &mut WaitSlot::default(),
            WaitOptions::new().interrupt(Interrupt::Never),
        ) {
            WaitResult::Ok => Some(self.state()),
            _ => None,
        }
    }

    /// Wait until no attached child is active (the scope's exit).
    #[cfg_attr(loom, allow(dead_code))]
    #[track_caller]
    pub(crate) fn join_children(self: &Arc<Self>) {
        let result = fiber_wait(
            &Children(self),
            &mut WaitSlot::default(),
            // The children borrow the scope owner's stack: not even
            // teardown may unwind the owner out of this wait.
            WaitOptions::new().interrupt(Interrupt::Never),
        );
        debug_assert_eq!(result, WaitResult::Ok);
        // Every child has ended: the owner drops their last references
        // here, on its own thread (see `Sync_::children`).
        let finished = take_finished(&mut lock(&self.sync).children);
        drop(finished);
    }
}

/// A job's waiters (joiners and the scope owner waiting for children): a
/// slab, so a waiter that leaves (cancelled, or spuriously woken) is removed
/// in O(1) by the slot index its wait keeps.
///
/// Room for two inline: a job usually has one joiner (or one scope owner),
/// and a heap buffer per job for it cost an allocation and a free each.
#[derive(Default)]
pub(crate) struct WaiterSet {
    slots: smallvec::SmallVec<[Option<Waiter>; 2]>,
    free: smallvec::SmallVec<[usize; 2]>,
}

/// The waiters a finalize (or the last child) takes to wake.
pub(crate) type Taken = smallvec::SmallVec<[Option<Waiter>; 2]>;

impl WaiterSet {
    fn insert(&mut self, waiter: Waiter) -> usize {
        match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(waiter);
                i
            }
            None => {
                self.slots.push(Some(waiter));
                self.slots.len() - 1
            }
        }
    }

    /// Remove the record at `index` if it is still `waiter`'s.
    fn remove(&mut self, index: usize, waiter: &Waiter) {
        if let Some(slot) = self.slots.get_mut(index) {
            if slot.as_ref().is_some_and(|w| w.same_wait(waiter)) {
                *slot = None;
                self.free.push(index);
            }
        }
    }

    fn take_all(&mut self) -> Taken {
        self.free.clear();
        std::mem::take(&mut self.slots)
    }
}

/// `WaitSlot::index` of the record in `Sync_::child_waiter`.
const CHILD_WAITER: usize = usize::MAX;

/// Per-wait data of a job wait: where the record sits, and whether this
/// wait was counted in `waiters_registered` (once per wait, however many
/// times it re-publishes after a spurious wake).
#[derive(Default)]
pub(crate) struct WaitSlot {
    index: Option<usize>,
    counted: bool,
}

/// Joining a job: a fiber-core waitable over the job's waiter list (a
/// borrow: the joiner holds the job for the whole wait, and a clone would
/// cost two atomic updates per join).
struct Join<'a>(&'a JobCore);

impl Waitable for Join<'_> {
    type Io = WaitSlot;

    fn kind(&self) -> fiber_core::WaitKind {
        fiber_core::WaitKind::Join
    }

    fn try_complete(&self, _: &mut WaitSlot) -> Option<WaitResult> {
        self.0.state().is_terminal().then_some(WaitResult::Ok)
    }

    fn publish(&self, waiter: &Waiter, io: &mut WaitSlot) -> Publish {
        let mut sync = lock(&self.0.sync);
        // Checked under the lock that `finalize` holds while it takes the
        // waiters: a waiter is either seen by finalize or sees terminal.
        if self.0.state().is_terminal() {
            return Publish::Ready(WaitResult::Ok);
        }
        io.index = Some(sync.waiters.insert(waiter.clone()));
        if !io.counted {
            io.counted = true;
            bump(Counter::WaitersRegistered, 1);
        }
        Publish::Published
    }

    fn unpublish(&self, waiter: &Waiter, io: &mut WaitSlot) -> Option<WaitResult> {
        // Terminal (Acquire, pairs with the transition's Release): the
        // finalize that made it so took every waiter in the same locked
        // section, ours included (we published under the lock, before it),
        // so there is no record left to remove.
        if self.0.state().is_terminal() {
            io.index = None;
            return Some(WaitResult::Ok);
        }
        let mut sync = lock(&self.0.sync);
        if let Some(index) = io.index.take() {
            sync.waiters.remove(index, waiter);
        }
        self.0.state().is_terminal().then_some(WaitResult::Ok)
    }
}

/// Waiting for a job's children (the scope body is done; the job is not
/// terminal until this returns and the scope finalizes).
struct Children<'a>(&'a JobCore);

impl Waitable for Children<'_> {
    type Io = WaitSlot;

    fn kind(&self) -> fiber_core::WaitKind {
        fiber_core::WaitKind::Join
    }

    fn try_complete(&self, _: &mut WaitSlot) -> Option<WaitResult> {
        (lock(&self.0.sync).active_children == 0).then_some(WaitResult::Ok)
    }

    fn publish(&self, waiter: &Waiter, io: &mut WaitSlot) -> Publish {
        let mut sync = lock(&self.0.sync);
        if sync.active_children == 0 {
            return Publish::Ready(WaitResult::Ok);
        }
        if sync.child_waiter.is_none() {
            sync.child_waiter = Some(waiter.clone());
            io.index = Some(CHILD_WAITER);
        } else {
            sync.child_waiters_in_set = true;
            io.index = Some(sync.waiters.insert(waiter.clone()));
        }
        Publish::Published
    }

    fn unpublish(&self, waiter: &Waiter, io: &mut WaitSlot) -> Option<WaitResult> {
        let mut sync = lock(&self.0.sync);
        match io.index.take() {
            Some(CHILD_WAITER) if sync.child_waiter.as_ref().is_some_and(|w| w.same_wait(waiter)) => {
                sync.child_waiter = None;
            }
            Some(CHILD_WAITER) => {}
            Some(index) => sync.waiters.remove(index, waiter),
            None => {}
        }
        (sync.active_children == 0).then_some(WaitResult::Ok)
    }
}

impl JobCore {
    /// End a fiber's root job with its body (`CancelScope::fiber_finished`):
    /// failed if it `panicked`, cancelled if the fiber saw a cancellation,
    /// otherwise completed. Returns whether it ended cancelled, read after
    /// `body_done` (a racing `Job::cancel` lands before it or not at all),
    /// or `None` while a child still runs.
    pub(crate) fn end_as_root(self: &Arc<Self>, panicked: bool, cancelled: bool) -> Option<bool> {
        if panicked {
            self.fail_contained(Failure::Panic(Arc::new(Mutex::new(None))), CancelReason::ChildFailed);
        } else if cancelled {
            self.cancel_contained(CancelReason::Cancelled);
        }
        self.body_done();
        match self.state() {
            JobState::Cancelled => Some(true),
            JobState::Completed | JobState::Failed => Some(false),
            _ => None,
        }
    }
}

#[cfg(not(loom))]
impl fiber_core::CancelScope for JobCore {
    /// Cancelled, or past a `with_timeout` deadline: a body that only polls
    /// (`fiber::is_cancelled` in a loop with no wait) sees its timeout even
    /// when the watchdog fiber that cancels the job cannot get a worker
    /// (every worker busy, e.g. one worker spinning in that very body).
    /// Only reads: the job itself is cancelled by the watchdog or when
    /// `with_timeout`'s body returns.
    fn is_cancelled(&self) -> bool {
        self.observed_state() != JobState::Active
    }

    /// `JoinHandle::cancel` of the fiber whose root job this is.
    fn cancel(&self) {
        JobCore::cancel(self, CancelReason::Cancelled);
    }

    /// Past its `with_timeout` deadline (its own, or an enclosing one's).
    fn deadline_passed(&self) -> bool {
        JobCore::deadline_passed(self)
    }

    /// The root job of a fiber ends with its body: failed if it panicked,
    /// cancelled if the fiber was cancelled (its task, this job, or its
    /// runtime shutting down), otherwise completed. Its final state is what
    /// the fiber's `JoinHandle` reports: a cancel of this job that lands
    /// before `body_done` makes it CANCELLED, and the handle follows.
    fn fiber_finished(
        self: Arc<Self>,
        _call: fiber_core::RootScopeCall,
        panicked: bool,
        cancelled: bool,
    ) -> Option<bool> {
        if let Some(me) = fiber_core::current_id() {
            self.remove_fiber(me);
        }
        self.end_as_root(panicked, cancelled)
    }

    /// The fiber was abandoned at teardown: its root job ends CANCELLED,
    /// and so does every job below it that has not ended and runs no live
    /// fiber. Teardown is over when this is called, so every fiber of this
    /// runtime that ran a body in this tree (the fiber itself in its
    /// scopes, their scoped children) has finished or was abandoned too: a
    /// job whose body has not returned never will, and one that waits for
    /// such a child would wait for ever (a `Job::join` on it with it). The
    /// fibers stay in the jobs' lists: they never run again, and the lists
    /// die with the jobs. A job whose body runs on a fiber of another
    /// runtime (`Job` is `Send`, and `Job::spawn` starts on the caller's
    /// runtime) is only cancelled: it ends with its body, as usual. Ended
    /// here, a scope there returned while its child still ran on the
    /// scope's stack (`adversarial/shutdown_jobs.rs`).
    /// Cancelled only, it keeps its parents open until it ends.
    fn fiber_abandoned(self: Arc<Self>, _call: fiber_core::RootScopeCall) {
        self.cancel_contained(CancelReason::Cancelled);
        // Every job of the tree that has not ended, parents before their
        // children (a list, not recursion: trees can be deep).
        let mut open = Vec::new();
        let mut pending = vec![self];
        while let Some(job) = pending.pop() {
            if job.state().is_terminal() {
                continue;
            }
            pending.extend(
                lock(&job.sync)
                    .children
                    .iter()
                    .filter(|c| !c.state().is_terminal())
                    .cloned(),
            );
            open.push(job);
        }
        // Children first: each ends as soon as its own children have, and
        // reports to its parent, which then ends with its own `body_done`.
        for job in open.iter().rev() {
            if job.runs_a_live_fiber() {
                continue;
            }
            job.body_done();
        }
    }
}

#[cfg(all(test, not(loom)))]
mod sweep_tests {
    use super::*;

    /// A job that outlives many short children (a fiber's root job opening
    /// scope after scope) keeps at most about `SWEEP_AT` finished ones, and
    /// every finished child's job is freed once swept.
    #[test]
    fn finished_children_are_swept_and_freed() {
        let parent = JobCore::new(None, false, false);
        let mut weak = Vec::new();
        for _ in 0..10_000 {
            let child = JobCore::new(Some(parent.clone()), false, true);
            weak.push(Arc::downgrade(&child));
            child.body_done();
            assert_eq!(child.state(), JobState::Completed);
        }
        let kept = lock(&parent.sync).children.len();
        assert!(kept <= SWEEP_AT + 1, "{kept} finished children kept");
        let alive = weak.iter().filter(|w| w.strong_count() > 0).count();
        assert_eq!(alive, kept, "every swept child's job was freed");
        // Live children are never swept.
        let live = JobCore::new(Some(parent.clone()), false, true);
        for _ in 0..200 {
            JobCore::new(Some(parent.clone()), false, true).body_done();
        }
        assert!(lock(&parent.sync).children.iter().any(|c| Arc::ptr_eq(c, &live)));
        live.body_done();
        parent.body_done();
        assert_eq!(parent.state(), JobState::Completed);
        // A finalized job lists no children: no parent/child cycle is left
        // to leak either of them.
        assert!(lock(&parent.sync).children.is_empty());
        let parent_weak = Arc::downgrade(&parent);
        let child_weak = Arc::downgrade(&live);
        drop((parent, live));
        assert_eq!(parent_weak.strong_count(), 0, "the parent job was freed");
        assert_eq!(child_weak.strong_count(), 0, "the child job was freed");
    }

    /// A child attached to a standalone job after it ended starts
    /// cancelled, and once it ends it is out of the ended job's list: the
    /// two do not keep each other alive.
    #[test]
    fn a_late_child_of_an_ended_standalone_job_is_freed() {
        let job = JobCore::standalone(None, false);
        assert!(job.complete());
        assert_eq!(job.state(), JobState::Completed);
        let late = JobCore::new(Some(job.clone()), false, true);
        assert_eq!(late.state(), JobState::Cancelling, "a late child starts cancelled");
        assert_eq!(lock(&job.sync).children.len(), 1);
        late.body_done();
        assert_eq!(late.state(), JobState::Cancelled);
        assert!(
            lock(&job.sync).children.is_empty(),
            "the late child left the ended job's list"
        );
        assert_eq!(job.state(), JobState::Completed, "the ended job stays as it ended");
        let (job_weak, late_weak) = (Arc::downgrade(&job), Arc::downgrade(&late));
        drop((job, late));
        assert_eq!(job_weak.strong_count(), 0, "the job was freed");
        assert_eq!(late_weak.strong_count(), 0, "the late child was freed");
    }
}
