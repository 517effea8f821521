//! The waitable side of the contract: [`Waitable`], [`fiber_wait`] and
//! [`fiber_wake`] (spec sections 3 and 4).
//!
//! # Protocol
//!
//! `fiber_wait` (run by the waiting fiber):
//! 1. `try_complete` fast path.
//! 2. `RUNNING -> PARKING`, bumping the wait ticket `t`.
//! 3. `publish` a [`Waiter`] `(fiber, t)`; on failure return to RUNNING.
//! 4. Suspend to the worker, which commits `PARKING -> PARKED` on its own
//!    stack, or resumes the fiber at once if a waker set WAKE_PENDING.
//! 5. After resume, `unpublish` (idempotent) tells whether the waitable
//!    completed the operation; otherwise a deadline or cancellation ends the
//!    wait, and anything else was a spurious wake: go round again.
//!
//! `fiber_wake` (run by a waker holding a `Waiter`) validates the ticket and
//! claims PARKED in one CAS (`StateWord::wake`); only the winner enqueues.
//!
//! The same protocol serves plain OS threads: their waiter record names a
//! thread parker instead of a fiber, and the winner of the claim unparks
//! the thread instead of scheduling a fiber.

#[cfg(not(loom))]
use crate::fiber::{current, Fiber, Suspend};
#[cfg(not(loom))]
use crate::sched::{Runnable, Schedule};
use crate::state::{Actor, Claim, StateWord};
use crate::sync::{fence, Arc, Ordering};
use std::fmt;
use std::time::Instant;

/// How a wait ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WaitResult {
    /// The operation completed.
    Ok,
    /// The waitable is closed; nothing was transferred.
    Closed,
    /// The deadline passed first.
    TimedOut,
    /// The waiting fiber's task was cancelled first.
    Cancelled,
}

/// Cancellation was requested for the running fiber's job: the error of
/// every cancellable operation that has no error type of its own (sleep,
/// lock acquisition, joins, ...). Shared by every layer so that callers can
/// match one type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Cancelled;

impl fmt::Display for Cancelled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the job was cancelled")
    }
}

impl std::error::Error for Cancelled {}

/// A cancellation as an `io::Error` of kind `Other` whose inner error is
/// `Cancelled`: what a cancelled `fiber::net` call returns, so that
/// `fiber::sleep(d)?` works in a function returning `io::Result` and the
/// caller tells both apart the same way
/// (`e.get_ref().is_some_and(|e| e.is::<Cancelled>())`).
impl From<Cancelled> for std::io::Error {
    fn from(cancelled: Cancelled) -> std::io::Error {
        std::io::Error::other(cancelled)
    }
}

/// What [`Waitable::publish`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Publish {
    /// The waiter is discoverable: a wake after this call will be observed.
    Published,
    /// The waiter was not published; the wait ends with this result (for
    /// example `Closed`, or `Ok` when the operation completed under the
    /// waitable's lock).
    Ready(WaitResult),
}

/// Whether cancellation may interrupt a wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Interrupt {
    /// A cancellation request ends the wait with [`WaitResult::Cancelled`]
    /// unless the operation already completed.
    #[default]
    Cancellable,
    /// Cancellation does not end the wait: it goes on until the waitable
    /// completes it (or the deadline). Only the runtime's teardown (the
    /// last step of shutdown, once the grace time is over) ends it, by
    /// unwinding the fiber.
    NotCancellable,
    /// Nothing ends the wait but the waitable (or the deadline), not even
    /// teardown: for waits that keep borrowed memory alive (a scope waiting
    /// for the children that borrow its stack, a call running elsewhere on
    /// a borrow). A fiber that stays in one at teardown is abandoned, its
    /// stack leaked, never unwound.
    Never,
}

/// Options of one [`fiber_wait`] call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WaitOptions {
    /// End the wait with [`WaitResult::TimedOut`] at this instant.
    pub deadline: Option<Instant>,
    /// Whether cancellation interrupts the wait.
    pub interrupt: Interrupt,
    /// A clock read the caller took just before (the instant its deadline
    /// was computed from): the check for a deadline already passed uses it
    /// instead of reading the clock again.
    pub now: Option<Instant>,
}

impl WaitOptions {
    /// A cancellable wait with no deadline.
    pub const fn new() -> Self {
        WaitOptions {
            deadline: None,
            interrupt: Interrupt::Cancellable,
            now: None,
        }
    }

    /// Set the clock read the deadline was computed from (see
    /// [`WaitOptions::now`]).
    pub const fn now(mut self, now: Instant) -> Self {
        self.now = Some(now);
        self
    }

    /// Set the deadline.
    pub const fn deadline(mut self, deadline: Option<Instant>) -> Self {
        self.deadline = deadline;
        self
    }

    /// Set whether cancellation interrupts the wait.
    pub const fn interrupt(mut self, interrupt: Interrupt) -> Self {
        self.interrupt = interrupt;
        self
    }
}

/// Anything a fiber or thread can wait on (spec section 3, WaitableOps).
///
/// `Io` is the per-wait data the waitable and the waiter share (a channel's
/// wait node, a slot for the value). It lives on the waiter's stack for the
/// whole of [`fiber_wait`].
pub trait Waitable {
    /// Per-wait data.
    type Io: ?Sized;

    /// Fast path: complete without parking, or `None` to park.
    fn try_complete(&self, io: &mut Self::Io) -> Option<WaitResult>;

    /// Make `waiter` discoverable by wakers. After `Published`, the waiter
    /// must stay discoverable until a waker claims it or `unpublish` runs.
    /// It runs while the fiber is PARKING, so it must not wait or yield
    /// itself (with the state-machine checks on, that panics naming the
    /// transition); a panic from it puts the fiber back to RUNNING and is
    /// the wait's panic.
    fn publish(&self, waiter: &Waiter, io: &mut Self::Io) -> Publish;

    /// What a fiber parked on this waits for, as the fiber dump names it.
    /// Asked once per wait that goes past `try_complete`, before the fiber
    /// starts to park (with [`wait_on`](Self::wait_on)): a panic from
    /// either is the wait's panic, with nothing published.
    fn kind(&self) -> crate::WaitKind {
        crate::WaitKind::Other
    }

    /// What exactly it waits on (operation and resource), for the fiber
    /// dump; `None` (the default) when the kind says enough. Called once
    /// per wait that may park, so it should be cheap (an `Arc` clone).
    fn wait_on(&self) -> Option<crate::WaitOn> {
        None
    }

    /// Remove `waiter` if it is still published. Idempotent, and safe when a
    /// waker already removed it. Returns `Some(result)` when a waker
    /// completed the operation for this waiter (the result wins over a
    /// deadline or cancellation), `None` when it had not.
    fn unpublish(&self, waiter: &Waiter, io: &mut Self::Io) -> Option<WaitResult>;
}

#[derive(Clone)]
enum Target {
    #[cfg(not(loom))]
    Fiber(Arc<Fiber>),
    Thread(Arc<ThreadParker>),
}

/// A waiter record: who waits, and for which publication (the wait ticket,
/// spec section 8). Cheap to clone; holding one keeps the frame's memory
/// alive, never the fiber itself.
pub struct Waiter {
    target: Target,
    ticket: u64,
}

impl Clone for Waiter {
    /// A record of the same wait. A clone made by the waiting fiber itself
    /// (a waitable's `publish` keeping the record) takes the count its frame
    /// kept from its last park, if any, instead of incrementing.
    fn clone(&self) -> Waiter {
        let target = match &self.target {
            #[cfg(not(loom))]
            Target::Fiber(fiber) => {
                let frame: *const Fiber = Arc::as_ptr(fiber);
                let spare = if current::get() == frame {
                    // SAFETY: `frame` is the fiber running on this thread,
                    // so its owner-only spare slot is ours to take (nobody
                    // else touches it while the fiber runs: its worker
                    // fills it only after the fiber switched away to park).
                    unsafe { fiber.take_spare() }
                } else {
                    None
                };
                Target::Fiber(spare.unwrap_or_else(|| fiber.clone()))
            }
            Target::Thread(parker) => Target::Thread(parker.clone()),
        };
        Waiter {
            target,
            ticket: self.ticket,
        }
    }
}

impl Waiter {
    /// The wait ticket of this record.
    pub fn ticket(&self) -> u64 {
        self.ticket
    }

    /// Has the wait this record names ended (its waiter has parked again
    /// since, or is no longer parked for it)? A snapshot: `false` may turn
    /// `true` at any time, never back. Structures that keep records after
    /// the wait may have ended (timers) use it to purge dead ones.
    pub fn is_stale(&self) -> bool {
        let now = self.state().load(Ordering::Relaxed);
        now.ticket() != self.ticket
            || !matches!(
                now.state(),
                crate::state::FiberState::Parking | crate::state::FiberState::Parked
            )
    }

    /// Ask the CPU to start loading the waiter's record (a fiber's frame):
    /// a caller about to wake a batch of records prefetches a few ahead, so
    /// that the wakes do not wait for one cold frame after another. A hint
    /// only: it has no effect on what the program observes.
    pub fn prefetch(&self) {
        #[cfg(not(loom))]
        if let Target::Fiber(fiber) = &self.target {
            Fiber::prefetch_frame(Arc::as_ptr(fiber));
        }
    }

    /// Do two records name the same wait (same waiter, same ticket)?
    pub fn same_wait(&self, other: &Waiter) -> bool {
        self.ticket == other.ticket
            && match (&self.target, &other.target) {
                #[cfg(not(loom))]
                (Target::Fiber(a), Target::Fiber(b)) => Arc::ptr_eq(a, b),
                (Target::Thread(a), Target::Thread(b)) => Arc::ptr_eq(a, b),
                #[cfg(not(loom))]
                _ => false,
            }
    }

    fn state(&self) -> &StateWord {
        match &self.target {
            #[cfg(not(loom))]
            Target::Fiber(f) => &f.state,
            Target::Thread(t) => &t.state,
        }
    }

    /// The waiting fiber's own record for one wait, without a reference
    /// count of its own: `fiber_wait` lends it to `publish` / `unpublish`
    /// by reference, and whoever keeps it (a waitable's queue, a timer)
    /// clones it, which takes a real count. Two atomic read-modify-writes
    /// less per park than an owned record.
    ///
    /// # Safety
    ///
    /// `fiber` is the running fiber's frame (alive, inside the pool's
    /// `Arc`, for as long as the record is used), and the record is never
    /// moved out of its `ManuallyDrop`.
    #[cfg(not(loom))]
    #[inline]
    pub(crate) unsafe fn lent_for_fiber(fiber: &Fiber, ticket: u64) -> std::mem::ManuallyDrop<Waiter> {
        let ptr: *const Fiber = fiber;
        // SAFETY: every frame lives in an `Arc` (see `frame_arc`); this
        // `Arc` is never dropped (`ManuallyDrop`), so it does not need a
        // count of its own, and it lives no longer than the caller's borrow
        // of the running frame (see the function's contract).
        let fiber = unsafe { Arc::from_raw(ptr) };
        std::mem::ManuallyDrop::new(Waiter {
            target: Target::Fiber(fiber),
            ticket,
        })
    }

    #[cfg(not(loom))]
    pub(crate) fn for_fiber(fiber: Arc<Fiber>, ticket: u64) -> Waiter {
        Waiter {
            target: Target::Fiber(fiber),
            ticket,
        }
    }
}

impl fmt::Debug for Waiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let who = match &self.target {
            #[cfg(not(loom))]
            Target::Fiber(fiber) => format!("{}", fiber.id()),
            Target::Thread(_) => "thread".to_string(),
        };
        f.debug_struct("Waiter")
            .field("waiter", &who)
            .field("ticket", &self.ticket)
            .finish()
    }
}

/// Unwinding out of `Waitable::publish` (a panic in the waitable) takes the
/// waiter from PARKING back to RUNNING, so the panic reaches the fiber's
/// boundary (or the thread's caller) with the state word legal. Forgotten
/// on the normal path.
struct BackToRunning<'a>(&'a StateWord);

impl Drop for BackToRunning<'_> {
    fn drop(&mut self) {
        self.0.transition_to_running_from_parking(Actor::Fiber);
    }
}

/// Wake the waiter of `record`. Returns `true` if this call won
/// the wake claim and enqueued the fiber (or unparked the thread); `false`
/// if the record was stale, the fiber was already awake, or it was still
/// PARKING (then WAKE_PENDING makes its worker resume it).
///
/// The waitable must have recorded the wake's outcome (data handed over,
/// closed, ...) before calling this.
pub fn fiber_wake(record: &Waiter) -> bool {
    match record.state().wake(record.ticket) {
        Claim::Claimed => {
            match &record.target {
                #[cfg(not(loom))]
                Target::Fiber(fiber) => {
                    fiber.prefetch_stack();
                    schedule_claimed(fiber.clone())
                }
                Target::Thread(parker) => parker.unpark(),
            }
            true
        }
        Claim::Pending | Claim::Stale => false,
    }
}

impl Waiter {
    /// Was the waiter given up for good by its runtime's teardown (a fiber
    /// that could be neither unwound nor finished: parked while it
    /// unwinds, bound to a thread that is gone)? It never runs again, so
    /// completing its wait hands the resource to no one: a lock granted
    /// to it would stay locked for ever. A queue skips such a waiter and
    /// serves the next (`fiber::sync`). A fiber given up only for later
    /// (it waits for a blocking call or a hand-off, or beside fibers that
    /// do) is not lost: it is revived and keeps what it is handed.
    ///
    /// The answer can turn `true` right after a `false` (the teardown
    /// gives up while the caller looks); what is handed to it then is
    /// lost with it, as before this check.
    pub fn is_lost(&self) -> bool {
        match &self.target {
            #[cfg(not(loom))]
            Target::Fiber(fiber) => fiber.is_given_up_for_good(),
            Target::Thread(_) => false,
        }
    }

    /// [`fiber_wake`] that consumes the record: the same claim and the
    /// same outcome, but the record's reference to the waiter's frame moves
    /// into the run queue's token instead of being cloned and dropped (one
    /// reference-count round trip less per wake, like `Waker::wake` next to
    /// `Waker::wake_by_ref`).
    pub fn wake(self) -> bool {
        match self.state().wake(self.ticket) {
            Claim::Claimed => {
                match self.target {
                    #[cfg(not(loom))]
                    Target::Fiber(fiber) => {
                        fiber.prefetch_stack();
                        schedule_claimed(fiber)
                    }
                    Target::Thread(parker) => parker.unpark(),
                }
                true
            }
            Claim::Pending | Claim::Stale => false,
        }
    }
}

/// Hand a fiber whose wake claim we won to its scheduler.
///
/// The scheduler is borrowed, not cloned, when the caller is a fiber of the
/// same scheduler (a fiber waking its partner, the common case): the
/// running fiber's own slot holds a reference to that scheduler for as long
/// as this call runs (the running fiber cannot finish or be recycled under
/// its own call), while the woken fiber's slot may be cleared as soon as
/// `schedule` has published it (it may run and finish on another worker
/// before `schedule` returns). Otherwise the reference is cloned from the
/// woken fiber's slot, which we own until `schedule` takes the token.
#[cfg(not(loom))]
fn schedule_claimed(fiber: Arc<Fiber>) {
    let runnable = Runnable::new(fiber, Actor::Waker);
    let me = current::get();
    // SAFETY: a non-null current pointer is the frame of the fiber running
    // on this thread (alive, and its scheduler slot is set and unchanging
    // while it runs; see `current_id`). The woken fiber is ours (claim won)
    // until `schedule` takes the token, so reading its slot is exclusive.
    unsafe {
        if !me.is_null() {
            if let Some(sched) = (*me).scheduler_ref() {
                if runnable.fiber_ref().scheduler_ptr_eq(sched) {
                    sched.schedule(runnable);
                    return;
                }
            }
        }
        let sched = runnable.fiber_ref().scheduler();
        sched.schedule(runnable);
    }
}

/// As [`fiber_wake`], for a caller that holds the scheduler the waiter's
/// fiber runs on (a worker firing its runtime's timers): when the fiber's
/// scheduler is `sched`, the fiber is handed to `sched` without cloning the
/// scheduler's `Arc` (one contended read-modify-write and its drop less
/// per wake). Any other record (a thread, another runtime's fiber) is woken
/// as by [`fiber_wake`].
#[cfg(not(loom))]
pub fn fiber_wake_via(record: &Waiter, sched: &dyn Schedule) -> bool {
    match record.state().wake(record.ticket) {
        Claim::Claimed => {
            match &record.target {
                Target::Fiber(fiber) => {
                    fiber.prefetch_stack();
                    // SAFETY: we won the wake claim, so we own the fiber
                    // until `schedule` takes the token; the slot is not
                    // written meanwhile.
                    let same = unsafe { fiber.with_scheduler(|own| std::ptr::addr_eq(Arc::as_ptr(own), sched)) };
                    let runnable = Runnable::new(fiber.clone(), Actor::Waker);
                    if same {
                        // The caller keeps `sched` alive for the call.
                        sched.schedule(runnable);
                    } else {
                        // SAFETY: as above.
                        unsafe { fiber.scheduler() }.schedule(runnable);
                    }
                }
                Target::Thread(parker) => parker.unpark(),
            }
            true
        }
        Claim::Pending | Claim::Stale => false,
    }
}

/// The parker's half of the cancellation handshake (spec 4.4): enter
/// PARKING (a new ticket) and, for an interruptible wait, a SeqCst fence
/// and a look at the cancellation state. `None` when cancellation was seen
/// (the waiter is RUNNING again and must not park).
///
/// The fence is one side of a Dekker pair with [`wait_to_interrupt`]
/// (canceller: store its cancellation state; fence; read the waiter's
/// state) against ours (store PARKING; fence; read the cancellation
/// state): at least one side sees the other's store, so either the waiter
/// does not park or the canceller sees it PARKING/PARKED and wakes it
/// (PITFALLS 3). Both halves run in production and in the loom model
/// `loom_cancel_is_never_lost`.
///
/// `cancelled` may run user code (a `CancelScope::is_cancelled`) while the
/// fiber is PARKING: if it panics, the state word is put back to RUNNING
/// first, so the panic reaches the wait's caller with the fiber legal
/// (`reviews/review49.rs::a_cancel_scope_that_panics_in_a_wait_leaves_the_fiber_legal`).
pub(crate) fn enter_parking(state: &StateWord, interruptible: bool, cancelled: impl FnOnce() -> bool) -> Option<u64> {
    let ticket = state.transition_to_parking();
    if interruptible {
        fence(Ordering::SeqCst);
        let guard = BackToRunning(state);
        let seen = cancelled();
        std::mem::forget(guard);
        if seen {
            state.transition_to_running_from_parking(Actor::Fiber);
            return None;
        }
    }
    Some(ticket)
}

/// The canceller's half of the handshake (see [`enter_parking`]): called
/// after the canceller stored its cancellation state. Returns the ticket of
/// the wait to interrupt if the waiter is PARKING or PARKED now.
pub(crate) fn wait_to_interrupt(state: &StateWord) -> Option<u64> {
    fence(Ordering::SeqCst);
    // Acquire: pairs with the Release of the park commit (as a waker's).
    let seen = state.load(Ordering::Acquire);
    matches!(
        seen.state(),
        crate::state::FiberState::Parking | crate::state::FiberState::Parked
    )
    .then(|| seen.ticket())
}

#[cfg(not(loom))]
/// Wake `fiber` for whatever it waits on now, if it waits (used by
/// cancellation, which has no waiter record), after the caller stored its
/// cancellation state. The waitable sees a spurious wake; `fiber_wait` then
/// checks for cancellation.
pub(crate) fn wake_current_wait(fiber: &Arc<Fiber>) {
    if let Some(ticket) = wait_to_interrupt(&fiber.state) {
        let _ = fiber_wake(&Waiter::for_fiber(fiber.clone(), ticket));
    }
}

/// Wait on `waitable`. In a fiber this parks the fiber; on a
/// plain thread it blocks the thread. Returns how the wait ended.
///
/// The caller's location is what the fiber dump shows as the park site:
/// layers put `#[track_caller]` on their public parking functions so that
/// it is the user's call.
#[track_caller]
pub fn fiber_wait<W: Waitable + ?Sized>(waitable: &W, io: &mut W::Io, options: WaitOptions) -> WaitResult {
    if let Some(result) = waitable.try_complete(io) {
        return result;
    }
    #[cfg(loom)]
    return thread_wait(waitable, io, options);
    #[cfg(not(loom))]
    fiber_or_thread_wait(waitable, io, options, std::panic::Location::caller())
}

/// [`fiber_wait`] with an explicit park site for the fiber dump: for a
/// helper fiber a layer runs on the user's behalf (a `with_timeout`
/// watchdog), whose wait is in a closure that `#[track_caller]` cannot
/// reach; `site` is the user's call that made it.
#[cfg(not(loom))]
pub fn fiber_wait_at<W: Waitable + ?Sized>(
    waitable: &W,
    io: &mut W::Io,
    options: WaitOptions,
    site: &'static std::panic::Location<'static>,
) -> WaitResult {
    if let Some(result) = waitable.try_complete(io) {
        return result;
    }
    fiber_or_thread_wait(waitable, io, options, site)
}

#[cfg(not(loom))]
fn fiber_or_thread_wait<W: Waitable + ?Sized>(
    waitable: &W,
    io: &mut W::Io,
    options: WaitOptions,
    site: &'static std::panic::Location<'static>,
) -> WaitResult {
    let fiber = current::get();
    if fiber.is_null() {
        return thread_wait(waitable, io, options);
    }
    // SAFETY: a non-null current pointer is the running fiber's frame, alive
    // while it runs (its worker holds `Running`). After each resume we keep
    // using this pointer, never a thread-local read from before the switch.
    let fiber = unsafe { &*fiber };
    // A deadline already passed (a zero timeout) ends the wait now, as
    // std's and crossbeam's timed waits do: armed, it would wait for the
    // timer wheel's next 1 ms tick. A cancellable wait of a cancelled fiber
    // still reports the cancellation (the usual path below).
    //
    // It is still a yield point: the fiber goes to the back of its
    // worker's queue first (nothing is published yet, so nothing can
    // complete the wait meanwhile). A loop that polls with `sleep(ZERO)`,
    // `sleep_until(past)` or a zero `recv_timeout` would otherwise never
    // let a fiber queued behind it run on a fixed pool (Go preempts such
    // a loop; tokio's budget yields it).
    if let Some(deadline) = options.deadline {
        if deadline <= options.now.unwrap_or_else(Instant::now)
            // SAFETY: the running fiber reads its own task slot.
            && !(options.interrupt == Interrupt::Cancellable && unsafe { fiber.is_cancel_requested() })
            // Once teardown began, a fiber that is not unwinding yet takes
            // the usual path, which unwinds it there: returning at once (no
            // yield is allowed in teardown) let a loop of zero waits that
            // ignores its cancellation (a `select!` taking a due timer arm,
            // a due timer `recv`) spin for ever on the thread dropping the
            // runtime (`reviews/review38.rs`).
            // SAFETY: the running fiber reads its own scheduler slot.
            && (unsafe { fiber.phase() } != crate::pool::Phase::Teardown || crate::fiber::fiber_panicking(fiber))
        {
            // SAFETY: the running fiber reads its own slots and suspends
            // itself on its own stack; `fiber` is its frame, alive across
            // the switch (not re-read from the thread-local). Only from
            // RUNNING (not from a `publish` of a wait in progress), not
            // while it unwinds (it stays on its thread, see
            // `unwinding_fiber_wait`) and not once teardown began.
            unsafe {
                if fiber.may_yield_here() {
                    fiber.suspend(Suspend::Yield);
                }
            }
            return WaitResult::TimedOut;
        }
    }
    // Unwinding (this fiber's own panic, not another's parked on this
    // thread: see `crate::panicking`).
    if crate::fiber::fiber_panicking(fiber) {
        return unwinding_fiber_wait(fiber, waitable, io, options, site);
    }
    fiber_wait_slow(fiber, waitable, io, options, site)
}

/// How long an unwinding fiber blocks its thread before it looks for
/// cancellation again (see [`unwinding_fiber_wait`]).
#[cfg(not(loom))]
const UNWINDING_WAIT_SLICE: std::time::Duration = std::time::Duration::from_millis(10);

/// How long an unwinding fiber blocks its thread in all before it parks
/// instead (see [`unwinding_fiber_wait`]).
#[cfg(not(loom))]
pub(crate) const UNWINDING_WAIT_BOUND: std::time::Duration = std::time::Duration::from_millis(200);

/// A wait of a fiber that is unwinding (a destructor that waits while a
/// panic propagates). std keeps "this thread is panicking" per OS thread,
/// so a fiber that switched away mid-unwind would leave its worker thread
/// panicking for every other fiber it runs (`std::thread::panicking()`
/// true, guards they drop poisoning their locks), and finishing the unwind
/// on another worker would unbalance both threads' counts. So the fiber
/// first waits without switching: it blocks its thread like a plain thread
/// (the scheduler sees a busy worker and may add one), in slices of
/// [`UNWINDING_WAIT_SLICE`] between which it checks for cancellation as a
/// parked fiber would. What the wait needs may come only from a fiber that
/// this thread would run (one worker, growth off; teardown's single
/// thread): after [`UNWINDING_WAIT_BOUND`] the fiber parks as usual, trading
/// the panic state's accuracy for progress.
///
/// At teardown a non-cancellable wait (a lock) of an unwinding fiber can
/// be ended neither by a second unwind (a panic escaping a destructor
/// during an unwind aborts) nor by `Cancelled` (the caller would go on
/// without the lock): it parks at once, as a scope's wait for its
/// children does. Several unwinds may be in progress on one thread, each
/// on its own stack, so the pass goes on to the next fibers (the lock's
/// holder among them) and resumes this one when the lock is handed to it;
/// if nothing ever releases the lock, the pass gives the fiber up.
#[cfg(not(loom))]
#[cold]
#[track_caller]
fn unwinding_fiber_wait<W: Waitable + ?Sized>(
    fiber: &Fiber,
    waitable: &W,
    io: &mut W::Io,
    options: WaitOptions,
    site: &'static std::panic::Location<'static>,
) -> WaitResult {
    // SAFETY: the running fiber reads its own scheduler slot.
    let teardown = unsafe { fiber.phase() } == crate::pool::Phase::Teardown;
    if teardown && options.interrupt != Interrupt::Cancellable {
        // What it waits for (a scope's children, a lock's holder) is torn
        // down by this thread's pass, which goes on to the next fibers
        // while this unwind is parked: park. (A lock wait here used to
        // block the thread for the bound and then abort the process,
        // though the holder was the next fiber to unwind:
        // `reviews/review72.rs`.) If nothing releases it, the pass gives
        // the fiber up (its stack leaks; the shutdown report names it).
        return fiber_wait_slow(fiber, waitable, io, options, site);
    }
    // The bound counts from the start of the unwind's streak of waits and
    // yields, not from this call: a loop of short waits (a destructor's
    // 1 ms sleeps, its rendezvous sends) otherwise kept the thread for
    // ever, or waited out the whole bound at every call.
    // SAFETY: the running fiber updates its own owner-only slot.
    let give_up = unsafe { fiber.unwinding_stay_until() };
    let _streak = StreakEnd(fiber);
    loop {
        let interruptible = options.interrupt == Interrupt::Cancellable;
        // SAFETY: the running fiber reads its own task slot.
        if interruptible && unsafe { fiber.is_cancel_requested() } {
            // SAFETY: the running fiber, RUNNING, on its own stack; it is
            // panicking, so this neither yields nor starts an unwind.
            return unsafe { cancelled_wait(fiber, false) };
        }
        let now = Instant::now();
        if now >= give_up {
            return fiber_wait_slow(fiber, waitable, io, options, site);
        }
        let slice_end = (now + UNWINDING_WAIT_SLICE).min(give_up);
        let last = options.deadline.is_some_and(|d| d <= slice_end);
        let slice = WaitOptions {
            deadline: Some(if last {
                options.deadline.unwrap_or(slice_end)
            } else {
                slice_end
            }),
            ..options
        };
        match thread_wait(waitable, io, slice) {
            WaitResult::TimedOut if !last => {
                // Between two slices the waiter is off the queue: what
                // happened meanwhile (a condvar's notify, which finds no
                // one to wake) is seen here or not at all. A condvar wait
                // ends as a spurious wake-up (its caller checks its
                // predicate); a lock is tried.
                if let Some(result) = waitable.try_complete(io) {
                    return result;
                }
            }
            result => return result,
        }
    }
}

/// Marks the end of an unwinding wait in its fiber's streak (on every
/// return, including a park after the bound).
#[cfg(not(loom))]
struct StreakEnd<'a>(&'a Fiber);

#[cfg(not(loom))]
impl Drop for StreakEnd<'_> {
    fn drop(&mut self) {
        // SAFETY: dropped by the running fiber that made it, on its stack.
        unsafe { self.0.unwinding_wait_ended() };
    }
}

#[cfg(not(loom))]
#[inline(never)]
fn fiber_wait_slow<W: Waitable + ?Sized>(
    fiber: &Fiber,
    waitable: &W,
    io: &mut W::Io,
    options: WaitOptions,
    site: &'static std::panic::Location<'static>,
) -> WaitResult {
    let cancellable = options.interrupt == Interrupt::Cancellable;
    // A non-cancellable wait still ends at teardown (unwinding the fiber).
    let interruptible = || {
        cancellable
            || (options.interrupt == Interrupt::NotCancellable
                // SAFETY: the running fiber reads its own scheduler slot.
                && unsafe { fiber.phase() } == crate::pool::Phase::Teardown
                // A fiber already unwinding cannot be unwound again, and a
                // `Cancelled` would send the caller on without its lock.
                && !crate::fiber::fiber_panicking(fiber)
                // Nor is one past its body (a completion handler, a
                // fiber-local destructor): its teardown unwind returns
                // instead (`teardown_unwind`), and a `fiber::sync` lock
                // would have returned without the lock
                // (`reviews/review71.rs`).
                // SAFETY: as above.
                && !unsafe { fiber.body_has_returned() })
    };
    // The wait has not parked yet: a cancellation seen now ends it without
    // the fiber ever leaving its worker.
    let mut first = true;
    // What the dump names, asked while the fiber is RUNNING: these are the
    // waitable's code, and a panic from them must not leave the fiber
    // PARKING with its waiter published (only `publish` runs in that
    // window, under `BackToRunning`).
    let kind = waitable.kind();
    let wait_on = waitable.wait_on();
    loop {
        // SAFETY: the running fiber reads its own task slot.
        let entered = enter_parking(&fiber.state, interruptible(), || unsafe { fiber.is_cancel_requested() });
        let Some(ticket) = entered else {
            // SAFETY: as above.
            return unsafe { cancelled_wait(fiber, first) };
        };
        first = false;
        // SAFETY: `fiber` is the running fiber's frame, alive for this whole
        // call; the record is dropped below only through `ManuallyDrop`, so
        // the reference count it did not take is never given back.
        let waiter = unsafe { Waiter::lent_for_fiber(fiber, ticket) };
        // A panicking `publish` must not leave the fiber PARKING.
        let guard = BackToRunning(&fiber.state);
        let published = waitable.publish(&waiter, io);
        std::mem::forget(guard);
        if let Publish::Ready(result) = published {
            fiber.state.transition_to_running_from_parking(Actor::Fiber);
            return result;
        }
        if let Some(deadline) = options.deadline {
            // SAFETY: the running fiber reads its own scheduler slot.
            unsafe { fiber.with_scheduler(|s| s.wake_at(deadline, Waiter::clone(&waiter))) };
        }
        fiber.set_waiting_on(Some(std::any::type_name::<W>));
        fiber.note_park(
            kind,
            options.interrupt == Interrupt::NotCancellable
                // SAFETY: the running fiber reads its own owner-only slot.
                || (unsafe { fiber.in_non_cancellable() } && kind.may_end_from_a_thread()),
            options.deadline.is_some(),
            site,
            wait_on.clone(),
        );
        // SAFETY: the running fiber suspends itself on its own stack.
        unsafe { fiber.suspend(Suspend::Park) };
        fiber.set_waiting_on(None);
        fiber.note_unpark();
        // Resumed: RUNNING again (woken, or the commit was aborted).
        if let Some(result) = waitable.unpublish(&waiter, io) {
            return result;
        }
        // SAFETY: the running fiber reads its own task slot.
        if interruptible() && unsafe { fiber.is_cancel_requested() } {
            // SAFETY: as above. It parked: it has yielded already.
            return unsafe { cancelled_wait(fiber, false) };
        }
        if let Some(deadline) = options.deadline {
            // SAFETY: the running fiber reads its own scheduler slot.
            let now = unsafe { fiber.with_scheduler(|s| s.now()) };
            if now >= deadline {
                return WaitResult::TimedOut;
            }
        }
        if let Some(result) = waitable.try_complete(io) {
            return result;
        }
    }
}

/// A cancellable wait saw cancellation: the result is `Cancelled`. A wait
/// that ends so without having parked (`unparked`: the fiber was cancelled
/// before it called) first yields once, as every timed wait does: a
/// cancelled fiber that ignores the error in a polling loop (`while !flag
/// { let _ = fiber::sleep(ms) }`, clean-up waiting for another fiber)
/// would otherwise hold its worker for ever on a fixed pool (trio's
/// checkpoints yield before they raise `Cancelled`). While the runtime
/// shuts down, every such wait yields once, and in teardown the fiber's
/// stack unwinds from here (see `FramePool::teardown`).
///
/// # Safety
///
/// Called by the running fiber itself, RUNNING, on its own stack.
#[cfg(not(loom))]
unsafe fn cancelled_wait(fiber: &Fiber, unparked: bool) -> WaitResult {
    // SAFETY: see the function's contract.
    unsafe {
        note_if_task_cancelled(fiber);
        crate::fiber::note_cancel_told(fiber);
        match fiber.phase() {
            crate::pool::Phase::Open => {
                // Only from RUNNING, not while unwinding (see
                // `may_yield_here`).
                if unparked && fiber.may_yield_here() {
                    fiber.suspend(Suspend::Yield);
                } else if fiber.unwinding_may_yield() {
                    // Unwinding past the bound: a destructor's loop of
                    // cancelled waits (a condvar's `while !ready`) otherwise
                    // held the worker for ever
                    // (`adversarial/unwinding_polls.rs`).
                    fiber.suspend(Suspend::Yield);
                }
            }
            crate::pool::Phase::Cancelling => {
                if !crate::fiber::fiber_panicking(fiber) || fiber.unwinding_may_yield() {
                    fiber.suspend(Suspend::Yield);
                }
            }
            crate::pool::Phase::Teardown => crate::fiber::teardown_unwind(fiber),
        }
    }
    WaitResult::Cancelled
}

/// [`coop_point`](crate::coop_point) of a cancellable operation (a channel
/// `send` or `recv`, a blocking socket call): `true` when this operation
/// is one of the budget's looks (every [`OP_BUDGET`](crate::OP_BUDGET)-th
/// of a run that did not switch away) and the fiber's cancellation is
/// requested (once for each stretch of requested cancellation, see
/// `budget_tells_cancel`, and not while it unwinds). The caller then ends the operation as cancelled without
/// making it, as if it had waited: a loop whose operations never wait (a
/// receive from a channel a thread keeps full) sees its cancellation
/// within `OP_BUDGET` operations instead of never, and the clean-up it
/// runs afterwards (a destructor's sends, in normal flow or while it
/// unwinds) is not cut short by the budget.
#[cfg(not(loom))]
pub fn coop_point_cancellable() -> bool {
    let look = crate::fiber::coop_point_look();
    if look.fiber.is_null() {
        return false;
    }
    // SAFETY: the running fiber reads and notes its own slots, on its own
    // stack (if it yielded, it was resumed: still the current fiber).
    unsafe {
        let fiber = &*look.fiber;
        if crate::fiber::fiber_panicking(fiber) {
            return false;
        }
        if fiber.phase() == crate::pool::Phase::Teardown {
            if look.yielded && !fiber.body_has_returned() {
                // Teardown began while it yielded: unwound, as a cancelled
                // wait is.
                crate::fiber::teardown_unwind(fiber);
            }
            // Teardown ends a loop of such operations by unwinding it
            // (`coop_point`, after `TEARDOWN_LOOP_OPS`) and cuts no
            // operation short: a destructor's sends at the end of a body
            // that ran on through the grace time are all made.
            return false;
        }
        if crate::fiber::budget_tells_cancel(fiber) {
            note_if_task_cancelled(fiber);
            return true;
        }
    }
    false
}

/// Under loom there are no fibers: never cancelled.
#[cfg(loom)]
pub fn coop_point_cancellable() -> bool {
    false
}

/// A wait ended by the fiber's own task cancellation marks the task as
/// having observed it (its join then reports `Cancelled`); a wait ended by a
/// cancellation scope (a job) does not: the scope decides what that means.
///
/// # Safety
///
/// Called by the running fiber itself.
#[cfg(not(loom))]
unsafe fn note_if_task_cancelled(fiber: &Fiber) {
    // SAFETY: see the function's contract.
    unsafe {
        if fiber.is_task_cancel_requested() {
            fiber.note_cancel_seen();
        }
    }
}

/// The `Arc` of a frame from a reference to it.
#[cfg(not(loom))]
pub(crate) fn frame_arc(fiber: &Fiber) -> Arc<Fiber> {
    let ptr: *const Fiber = fiber;
    // SAFETY: every frame lives in an `Arc` held by its pool (`FramePool::
    // all`), so the strong count is at least one; we add one before making a
    // second `Arc` from the same pointer.
    unsafe {
        Arc::increment_strong_count(ptr);
        Arc::from_raw(ptr)
    }
}

/// The park side for plain threads. It blocks on a futex word of its own,
/// not on the thread's `std::thread::park` token: a plain thread waiting in
/// fiber code (a lock, a channel, a join) must neither consume a token the
/// user's code set with `Thread::unpark` (the user's next `park` would then
/// block) nor leave one of ours behind.
pub(crate) struct ThreadParker {
    state: StateWord,
    /// 1: woken since the last park (a token of our own). Under loom the
    /// model's own park token plays this part.
    #[cfg(not(loom))]
    notified: std::sync::atomic::AtomicU32,
    #[cfg(loom)]
    thread: loom::thread::Thread,
}

impl ThreadParker {
    fn for_this_thread() -> Arc<ThreadParker> {
        Arc::new(ThreadParker {
            state: StateWord::new_running(),
            #[cfg(not(loom))]
            notified: std::sync::atomic::AtomicU32::new(0),
            #[cfg(loom)]
            thread: loom::thread::current(),
        })
    }

    /// Wake the thread blocked in [`park`](Self::park) (or make its next
    /// park return at once).
    fn unpark(&self) {
        #[cfg(not(loom))]
        {
            // Release: pairs with the Acquire swap in `park`, so the woken
            // thread sees what the waker did before the wake.
            self.notified.store(1, Ordering::Release);
            atomic_wait::wake_one(&self.notified);
        }
        #[cfg(loom)]
        self.thread.unpark();
    }

    /// Block until [`unpark`](Self::unpark) or `timeout`; may return
    /// spuriously (the caller re-checks its state word).
    fn park(&self, timeout: Option<std::time::Duration>) {
        #[cfg(not(loom))]
        {
            // Acquire: pairs with the Release store in `unpark`.
            if self.notified.swap(0, Ordering::Acquire) == 1 {
                return;
            }
            match timeout {
                None => atomic_wait::wait(&self.notified, 0),
                Some(timeout) => futex_wait_timeout(&self.notified, timeout),
            }
            // Acquire: as above (consume the wake that ended the block).
            self.notified.swap(0, Ordering::Acquire);
        }
        // Under loom there are no timed parks: models use no deadlines.
        #[cfg(loom)]
        {
            let _ = timeout;
            loom::thread::park();
        }
    }
}

/// Block while `word` is 0, for `timeout` at most (spurious returns
/// allowed).
#[cfg(all(not(loom), target_os = "linux"))]
fn futex_wait_timeout(word: &std::sync::atomic::AtomicU32, timeout: std::time::Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(libc::time_t::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: FUTEX_WAIT_PRIVATE reads the aligned u32 behind `word`
    // (alive for the call) and the timespec on our stack; it writes
    // nothing. A relative timeout, as FUTEX_WAIT takes.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            0u32,
            &ts as *const libc::timespec,
        );
    }
}

/// Elsewhere: short sleeps, re-checking the word (no timed futex there).
#[cfg(all(not(loom), not(target_os = "linux")))]
fn futex_wait_timeout(word: &std::sync::atomic::AtomicU32, timeout: std::time::Duration) {
    let end = Instant::now() + timeout.min(std::time::Duration::from_secs(3600));
    while word.load(Ordering::Acquire) == 0 && Instant::now() < end {
        std::thread::sleep(std::time::Duration::from_micros(200).min(timeout));
    }
}

#[cfg(not(loom))]
thread_local! {
    static PARKER: Arc<ThreadParker> = ThreadParker::for_this_thread();
}

#[cfg(loom)]
loom::thread_local! {
    static PARKER: Arc<ThreadParker> = ThreadParker::for_this_thread();
}

fn thread_wait<W: Waitable + ?Sized>(waitable: &W, io: &mut W::Io, options: WaitOptions) -> WaitResult {
    // A wait from a thread-local destructor at thread exit may find the
    // thread's parker already destroyed: that wait gets a parker of its own
    // (nothing else can hold it, as no wait of this thread is in progress).
    let parker = PARKER
        .try_with(|p| p.clone())
        .unwrap_or_else(|_| ThreadParker::for_this_thread());
    loop {
        let ticket = parker.state.transition_to_parking();
        let waiter = Waiter {
            target: Target::Thread(parker.clone()),
            ticket,
        };
        let guard = BackToRunning(&parker.state);
        let published = waitable.publish(&waiter, io);
        std::mem::forget(guard);
        if let Publish::Ready(result) = published {
            parker.state.transition_to_running_from_parking(Actor::Fiber);
            return result;
        }
        // A thread has no second stack that another worker could resume, so
        // it commits its own park.
        if parker.state.transition_to_parked(Actor::Fiber) == crate::state::Commit::Parked {
            park_until_claimed(&parker, ticket, options.deadline);
        }
        if let Some(result) = waitable.unpublish(&waiter, io) {
            return result;
        }
        if options.deadline.is_some_and(|d| Instant::now() >= d) {
            return WaitResult::TimedOut;
        }
        if let Some(result) = waitable.try_complete(io) {
            return result;
        }
    }
}

/// Block the thread until a waker claims `(PARKED, ticket)` or the deadline
/// passes (then self-claim). Returns with the parker RUNNING.
fn park_until_claimed(parker: &ThreadParker, ticket: u64, deadline: Option<Instant>) {
    use crate::state::FiberState;
    let mut deadline = deadline;
    loop {
        // Acquire: pairs with the Release of the claim CAS in `wake`.
        let seen = parker.state.load(Ordering::Acquire);
        if seen.state() == FiberState::Runnable {
            parker.state.transition_to_running_after_claim();
            return;
        }
        match deadline {
            Some(d) => {
                let now = Instant::now();
                if now >= d {
                    if parker.state.self_claim(ticket) {
                        return;
                    }
                    // A waker claimed first; its unpark is on the way.
                    deadline = None;
                    continue;
                }
                parker.park(Some(d - now));
            }
            None => parker.park(None),
        }
    }
}

/// A wait nothing completes: only its deadline (or a cancellation) ends it.
struct Deadline;

impl Waitable for Deadline {
    type Io = ();
    fn try_complete(&self, _: &mut ()) -> Option<WaitResult> {
        None
    }
    fn publish(&self, _: &Waiter, _: &mut ()) -> Publish {
        Publish::Published
    }
    fn unpublish(&self, _: &Waiter, _: &mut ()) -> Option<WaitResult> {
        None
    }
    fn kind(&self) -> crate::WaitKind {
        crate::WaitKind::Sleep
    }
}

/// Wait until `deadline` (forever with `None`): park a fiber, block a
/// thread. Returns `TimedOut` at the deadline, or `Cancelled` first if the
/// wait is cancellable and the fiber's task or job is cancelled.
#[track_caller]
pub fn wait_until(deadline: Option<Instant>, interrupt: Interrupt) -> WaitResult {
    fiber_wait(
        &Deadline,
        &mut (),
        WaitOptions::new().deadline(deadline).interrupt(interrupt),
    )
}

/// [`wait_until`] for a deadline computed from `now`, a clock read the
/// caller just took (a sleep of a duration): the wait does not read the
/// clock again before it parks.
#[track_caller]
pub fn wait_until_from(now: Instant, deadline: Option<Instant>, interrupt: Interrupt) -> WaitResult {
    fiber_wait(
        &Deadline,
        &mut (),
        WaitOptions::new().deadline(deadline).interrupt(interrupt).now(now),
    )
}
