//! [`Condvar`]: `std::sync::Condvar`'s API for [`crate::Mutex`] guards.
//!
//! # Protocol
//!
//! A wait queues its node on the condvar's queue (under the condvar's
//! queue lock) *before* it releases the mutex, inside `publish`. A notifier
//! changes the shared state under the mutex, so it runs after that release
//! and finds the node: no notification sent after the waiter checked its
//! condition is lost. `notify_*` marks the nodes it takes `Granted` under
//! the queue lock and wakes them after releasing it. The woken waiter
//! re-acquires the mutex (not a cancellation point) before returning.
//!
//! A wait ended by cancellation, by its deadline or by a stray wake-up
//! unlinks its node and returns as a spurious wake-up would.

use crate::mutex::MutexGuard;
use crate::poison;
use crate::queue::{Node, Status, WaitQueue};
use crate::raw_mutex::RawMutex;
use crate::sync::{fence, AtomicUsize, Ordering, SpinLock};
use fiber_core::{Publish, WaitOptions, WaitResult, Waitable, Waiter};
use std::fmt;
use std::sync::LockResult;
use std::time::{Duration, Instant};

/// A condition variable: park until notified, releasing a
/// [`crate::Mutex`] meanwhile. `std::sync::Condvar`'s API.
///
/// Every wait is a cancellation point: when the calling fiber's job is
/// cancelled the wait returns early, with the guard re-acquired, exactly
/// like a spurious wake-up; callers that loop on their condition should
/// also check for cancellation (for example `fiber::is_cancelled()`).
/// [`Condvar::wait_while`] and [`Condvar::wait_timeout_while`] stop looping
/// when cancelled and return the guard with the condition possibly still
/// true. A cancelled timed wait reports a timeout
/// ([`WaitTimeoutResult::timed_out`] is `true`; for `wait_timeout_while`,
/// when the condition still holds), as the channels' timed operations do,
/// so that std's idiom, a loop that ends when `timed_out()` says so, ends
/// in a cancelled fiber instead of returning at once until its deadline.
///
/// Using one condvar with two different mutexes panics.
///
/// # Examples
///
/// ```
/// # mod fiber { pub(crate) use fiber_sync as sync; }
/// use fiber::sync::{Condvar, Mutex};
///
/// let queue = Mutex::new(Vec::new());
/// let ready = Condvar::new();
/// std::thread::scope(|s| {
///     s.spawn(|| {
///         queue.lock().unwrap().push(1);
///         ready.notify_one();
///     });
///     let items = ready.wait_while(queue.lock().unwrap(), |q| q.is_empty()).unwrap();
///     assert_eq!(*items, [1]);
/// });
/// ```
pub struct Condvar {
    queue: SpinLock<WaitQueue>,
    /// Nodes queued (changed under the queue lock): lets `notify_*` skip
    /// the lock when nobody waits.
    waiting: AtomicUsize,
    /// Address of the mutex the waits in progress use (changed under the
    /// queue lock; meaningful while `users > 0`).
    mutex: AtomicUsize,
    /// Waits in progress (changed under the queue lock). A mutex may move
    /// between waits (nothing borrows it then), so the address binds only
    /// while a wait is in progress.
    users: AtomicUsize,
    /// Changed by every `notify_all` and by a `notify_one` that found
    /// nobody queued: a wait that was off the queue for a while (a fiber
    /// that unwinds waits in slices, leaving the queue between two) reads
    /// it to tell a notify it missed from nothing (`CondWait::try_complete`).
    notifies: AtomicUsize,
}

// Like std's synchronization types: its wait queue stay consistent when a
// panic unwinds through a caller (no user code runs under its lock).
impl std::panic::UnwindSafe for Condvar {}
impl std::panic::RefUnwindSafe for Condvar {}

/// Whether a timed wait ended by its deadline, like
/// `std::sync::WaitTimeoutResult`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitTimeoutResult(bool);

impl WaitTimeoutResult {
    /// Did the wait end because its time ran out?
    pub fn timed_out(&self) -> bool {
        self.0
    }
}

/// How one wait ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Woke {
    Notified,
    TimedOut,
    Cancelled,
}

impl Condvar {
    /// A condvar nobody waits on.
    #[cfg(not(loom))]
    pub const fn new() -> Condvar {
        Condvar {
            queue: SpinLock::new(WaitQueue::new()),
            waiting: AtomicUsize::new(0),
            mutex: AtomicUsize::new(0),
            users: AtomicUsize::new(0),
            notifies: AtomicUsize::new(0),
        }
    }

    /// A condvar nobody waits on.
    #[cfg(loom)]
    pub fn new() -> Condvar {
        Condvar {
            queue: SpinLock::new(WaitQueue::new()),
            waiting: AtomicUsize::new(0),
            mutex: AtomicUsize::new(0),
            users: AtomicUsize::new(0),
            notifies: AtomicUsize::new(0),
        }
    }

    /// Release the guard's mutex and park until notified, then re-acquire
    /// it. May wake spuriously; a cancelled fiber returns early (see the
    /// type docs).
    ///
    /// # Errors
    ///
    /// `Err` (holding the guard) if the mutex is poisoned on return.
    ///
    /// # Panics
    ///
    /// If another fiber or thread is waiting on this condvar with a
    /// different mutex at the same time (one condvar used with two mutexes
    /// one after the other is not detected).
    #[track_caller]
    pub fn wait<'a, T>(&self, guard: MutexGuard<'a, T>) -> LockResult<MutexGuard<'a, T>> {
        self.wait_inner(guard, None).0
    }

    /// Wait until `condition` returns `false` (checked under the lock), or
    /// until the calling fiber's job is cancelled.
    ///
    /// # Errors
    ///
    /// `Err` (holding the guard) if the mutex is poisoned.
    ///
    /// # Panics
    ///
    /// As [`Condvar::wait`].
    #[track_caller]
    pub fn wait_while<'a, T, F>(&self, guard: MutexGuard<'a, T>, mut condition: F) -> LockResult<MutexGuard<'a, T>>
    where
        F: FnMut(&mut T) -> bool,
    {
        let mut guard = guard;
        loop {
            if !condition(&mut *guard) {
                return Ok(guard);
            }
            let (result, woke) = self.wait_inner(guard, None);
            guard = result?;
            if woke == Woke::Cancelled {
                return Ok(guard);
            }
        }
    }

    /// As [`Condvar::wait`], giving up after `timeout`. In a cancelled
    /// fiber it returns at once, reporting a timeout.
    ///
    /// # Errors
    ///
    /// `Err` (holding the guard and the result) if the mutex is poisoned.
    ///
    /// # Panics
    ///
    /// As [`Condvar::wait`].
    #[track_caller]
    pub fn wait_timeout<'a, T>(
        &self,
        guard: MutexGuard<'a, T>,
        timeout: Duration,
    ) -> LockResult<(MutexGuard<'a, T>, WaitTimeoutResult)> {
        let deadline = Instant::now().checked_add(timeout);
        let (result, woke) = self.wait_inner(guard, deadline);
        // A cancelled wait reads as timed out (see the type docs).
        let timed_out = WaitTimeoutResult(matches!(woke, Woke::TimedOut | Woke::Cancelled));
        match result {
            Ok(guard) => Ok((guard, timed_out)),
            Err(e) => Err(std::sync::PoisonError::new((e.into_inner(), timed_out))),
        }
    }

    /// Wait until `condition` returns `false`, for at most `timeout`
    /// overall (or until the fiber's job is cancelled). The result says
    /// whether the time ran out with the condition still true.
    ///
    /// # Errors
    ///
    /// `Err` (holding the guard and the result) if the mutex is poisoned.
    ///
    /// # Panics
    ///
    /// As [`Condvar::wait`].
    #[track_caller]
    pub fn wait_timeout_while<'a, T, F>(
        &self,
        guard: MutexGuard<'a, T>,
        timeout: Duration,
        mut condition: F,
    ) -> LockResult<(MutexGuard<'a, T>, WaitTimeoutResult)>
    where
        F: FnMut(&mut T) -> bool,
    {
        let deadline = Instant::now().checked_add(timeout);
        let mut guard = guard;
        loop {
            if !condition(&mut *guard) {
                return Ok((guard, WaitTimeoutResult(false)));
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok((guard, WaitTimeoutResult(true)));
            }
            let (result, woke) = self.wait_inner(guard, deadline);
            let poisoned = result.is_err();
            guard = result.unwrap_or_else(|e| e.into_inner());
            // A cancelled wait reads as timed out (see the type docs).
            let timed_out = matches!(woke, Woke::TimedOut | Woke::Cancelled) && condition(&mut *guard);
            if poisoned {
                return Err(std::sync::PoisonError::new((guard, WaitTimeoutResult(timed_out))));
            }
            if woke != Woke::Notified {
                return Ok((guard, WaitTimeoutResult(timed_out)));
            }
        }
    }

    /// Change `notifies` (see there), then look for queued waiters: the
    /// notifier's half of a Dekker pair with a waiter that queues again
    /// after a wake-up that brought no notify (`CondWait::publish`): its
    /// re-queue is not ordered by the mutex, so either this notifier sees
    /// it queued, or it sees this change and ends its wait. A load and a
    /// store, not an atomic add: concurrent notifies may lose an
    /// increment, but each leaves a value other than what a wait off the
    /// queue read before. Returns whether any waiter is queued.
    fn note_notify(&self) -> bool {
        let seen = self.notifies.load(Ordering::Relaxed);
        self.notifies.store(seen.wrapping_add(1), Ordering::Relaxed);
        // SeqCst fence: pairs with the fence in `CondWait::publish`
        // (notifier: change `notifies`; fence; read `waiting`. Waiter:
        // count itself in `waiting`; fence; read `notifies`).
        fence(Ordering::SeqCst);
        // Relaxed: ordered by the fence above.
        self.waiting.load(Ordering::Relaxed) != 0
    }

    /// Wake one waiter, if any (the one that has waited longest).
    pub fn notify_one(&self) {
        // Always counted, also when a waiter is queued: one that left the
        // queue for a wake-up that brought no notify (a cancel inside
        // `non_cancellable`, the end of an unwinding wait's slice) and is
        // about to queue again would otherwise miss this notify when the
        // queue is empty by the time the lock is taken. At worst two
        // waiters wake for one notify (a spurious wake-up, which std allows).
        if !self.note_notify() {
            return;
        }
        let wake = {
            let mut queue = self.queue.lock();
            let wake = queue.pop_front(Status::Granted);
            if wake.is_some() {
                // Relaxed: changed under the queue lock.
                self.waiting.fetch_sub(1, Ordering::Relaxed);
            }
            wake.flatten()
        };
        if let Some(w) = wake {
            // Consumed: the frame reference moves into the run queue.
            w.wake();
        }
    }

    /// Wake every waiter.
    pub fn notify_all(&self) {
        if !self.note_notify() {
            return;
        }
        let wakes = {
            let mut queue = self.queue.lock();
            let wakes = queue.drain(Status::Granted);
            // Relaxed: changed under the queue lock.
            self.waiting.store(0, Ordering::Relaxed);
            wakes
        };
        WaitQueue::wake_all(wakes);
    }

    /// A wait begins with `raw`: every wait in progress must use the same
    /// mutex (std panics on a condvar used with two). Between waits the
    /// mutex may have moved, so only waits in progress bind the address.
    /// Undone by `CondIo`'s drop (`leave_mutex`).
    fn enter_mutex(&self, raw: &RawMutex) {
        let addr = raw as *const RawMutex as usize;
        let same = {
            let _queue = self.queue.lock();
            // Relaxed (both): written only under the queue lock we hold.
            let users = self.users.load(Ordering::Relaxed);
            let same = users == 0 || self.mutex.load(Ordering::Relaxed) == addr;
            if same {
                self.mutex.store(addr, Ordering::Relaxed);
                self.users.store(users + 1, Ordering::Relaxed);
            }
            same
        };
        if !same {
            panic!("fiber::sync::Condvar: attempted to use a condition variable with two mutexes (another waiter waits with a different one)");
        }
    }

    fn leave_mutex(&self) {
        let _queue = self.queue.lock();
        // Relaxed: written only under the queue lock we hold.
        let users = self.users.load(Ordering::Relaxed);
        self.users.store(users - 1, Ordering::Relaxed);
    }

    #[track_caller]
    fn wait_inner<'a, T>(
        &self,
        guard: MutexGuard<'a, T>,
        deadline: Option<Instant>,
    ) -> (LockResult<MutexGuard<'a, T>>, Woke) {
        self.wait_with(guard, deadline, |wait, io, options, site| {
            #[cfg(not(loom))]
            return fiber_core::fiber_wait_at(&wait, io, options, site);
            // Loom's build has no call sites to record.
            #[cfg(loom)]
            {
                let _ = site;
                fiber_core::fiber_wait(&wait, io, options)
            }
        })
    }

    /// [`Condvar::wait_inner`] with the queued wait made by `wait` (the
    /// loom models wrap it to fire its records: `tests::Spy`).
    #[track_caller]
    pub(crate) fn wait_with<'a, 'c, T>(
        &'c self,
        guard: MutexGuard<'a, T>,
        deadline: Option<Instant>,
        wait: impl FnOnce(CondWait<'c>, &mut CondIo<'c>, WaitOptions, &'static std::panic::Location<'static>) -> WaitResult,
    ) -> (LockResult<MutexGuard<'a, T>>, Woke)
    where
        'a: 'c,
    {
        let mutex = guard.mutex();
        let raw = mutex.raw();
        self.enter_mutex(raw);
        // The guard's unlock happens inside `publish`, after the node is
        // queued; its poison bookkeeping happens here.
        let poison = guard.take_for_wait();
        let mut io = CondIo {
            node: Node::new(0),
            raw,
            unlocked: false,
            condvar: self,
            held: Some((mutex.poison_flag(), poison)),
            // Relaxed: see `Condvar::notifies`.
            notifies: self.notifies.load(Ordering::Relaxed),
        };
        // One clock read for both this check and `fiber_wait`'s: with two,
        // a deadline falling between them took the wait's zero-timeout
        // path, which returns without releasing the mutex.
        let now = Instant::now();
        let passed = deadline.is_some_and(|d| d <= now);
        let result = if passed || cancelled() {
            // A zero (or passed) timeout, or a fiber already cancelled:
            // nothing to queue for, but std releases the mutex for the
            // wait, and the wait is a yield point in a fiber: release it,
            // give the others a turn (a notifier that needs the mutex
            // included), take it back below. (A cancelled fiber's wait
            // would otherwise yield with the mutex held, and a cancelled
            // `while !ready { g = cv.wait(g) }` loop kept the notifier out
            // for ever.) `io` still ends the wait's binding of the mutex on
            // drop.
            raw.unlock();
            io.unlocked = true;
            let deadline = if passed { deadline } else { Some(Instant::now()) };
            fiber_core::wait_until(deadline, fiber_core::Interrupt::Cancellable)
        } else {
            // The user's call site, for the dump (a closure has none).
            let site = std::panic::Location::caller();
            wait(
                CondWait(self),
                &mut io,
                WaitOptions::new().deadline(deadline).now(now),
                site,
            )
        };
        debug_assert!(!io.node.queued, "a finished wait left its node queued");
        if io.unlocked {
            raw.lock();
        }
        // Returned: the guard made below holds the lock now.
        io.held = None;
        drop(io);
        let woke = match result {
            WaitResult::TimedOut => Woke::TimedOut,
            WaitResult::Cancelled => Woke::Cancelled,
            WaitResult::Ok | WaitResult::Closed => Woke::Notified,
        };
        // SAFETY: we hold the lock again (or never released it).
        let guard = unsafe { MutexGuard::relock(mutex, poison) };
        (poison::map_result(mutex.is_poisoned(), guard), woke)
    }
}

impl Default for Condvar {
    fn default() -> Self {
        Condvar::new()
    }
}

impl fmt::Debug for Condvar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Condvar").finish_non_exhaustive()
    }
}

/// The `Io` of one wait.
pub(crate) struct CondIo<'a> {
    node: Node,
    raw: &'a RawMutex,
    /// `publish` released the mutex.
    unlocked: bool,
    condvar: &'a Condvar,
    /// Until the wait returns: the mutex's poison flag and the forgotten
    /// guard's poison state. An unwind out of the wait before the mutex
    /// was released (a panic in a cancellation check, a teardown unwind
    /// of a wait that never queued) releases and poisons it here, as the
    /// guard's drop would; otherwise the mutex stayed locked for ever.
    held: Option<(&'a crate::poison::Flag, crate::poison::Guard)>,
    /// `Condvar::notifies` when the wait began.
    notifies: usize,
}

impl Drop for CondIo<'_> {
    fn drop(&mut self) {
        if let Some((flag, poison)) = self.held.take() {
            if !self.unlocked {
                flag.done(poison);
                self.raw.unlock();
            }
        }
        if self.node.queued {
            // Unwound while parked (shutdown): leave the queue.
            let mut queue = self.condvar.queue.lock();
            if queue.unlink(&mut self.node) == Status::Waiting {
                // Relaxed: as in `notify_one`.
                self.condvar.waiting.fetch_sub(1, Ordering::Relaxed);
            }
        }
        // The wait is over (returned or unwound): it no longer binds the
        // mutex's address.
        self.condvar.leave_mutex();
    }
}

/// A condvar wait as a fiber-core waitable.
pub(crate) struct CondWait<'a>(&'a Condvar);

impl<'a> Waitable for CondWait<'a> {
    type Io = CondIo<'a>;

    fn kind(&self) -> fiber_core::WaitKind {
        fiber_core::WaitKind::Lock
    }

    fn try_complete(&self, io: &mut CondIo<'a>) -> Option<WaitResult> {
        // Not queued here, so the owner reads its own node. A node unlinked
        // by its owner (a stray wake, a slice of an unwinding fiber's wait
        // ending) ends the wait as a spurious wake-up if a notify came
        // meanwhile: it may have found the node off the queue and woken
        // nobody (`adversarial/unwind_park.rs`). Otherwise the wait goes
        // on: ended at every slice, an unwinding fiber's `wait_while` loop
        // started its slices over for ever, never parking, and the
        // notifier on its worker never ran (`reviews/review56.rs`).
        match io.node.status() {
            Status::Idle => None,
            // Relaxed: see `Condvar::notifies`.
            Status::Removed if self.0.notifies.load(Ordering::Relaxed) == io.notifies => None,
            _ => Some(WaitResult::Ok),
        }
    }

    fn publish(&self, waiter: &Waiter, io: &mut CondIo<'a>) -> Publish {
        {
            let mut queue = self.0.queue.lock();
            queue.push(&mut io.node, waiter, false);
            // Relaxed: changed under the queue lock; a notifier reads it
            // after its fence (`Condvar::note_notify`).
            self.0.waiting.fetch_add(1, Ordering::Relaxed);
        }
        // Only now, with the node discoverable, release the mutex: a
        // notifier that needs it runs after this and finds the node.
        if !io.unlocked {
            io.unlocked = true;
            io.raw.unlock();
            return Publish::Published;
        }
        // Queued again after a wake-up that brought no notify, with the
        // mutex released all along: a notifier that read `waiting` before
        // the count above found nobody. SeqCst fence: pairs with the one
        // in `Condvar::note_notify` (count in `waiting`; fence; read
        // `notifies`): either it sees this node, or this sees its change
        // and the wait ends as a (possibly spurious) wake-up. Without it a
        // notify was lost (`tests/loom_sync.rs::loom_condvar_requeue_after_a_stray_wake_vs_notify`).
        fence(Ordering::SeqCst);
        // Relaxed: ordered by the fence above.
        if self.0.notifies.load(Ordering::Relaxed) != io.notifies {
            let mut queue = self.0.queue.lock();
            return match queue.unlink(&mut io.node) {
                Status::Waiting => {
                    // Relaxed: changed under the queue lock.
                    self.0.waiting.fetch_sub(1, Ordering::Relaxed);
                    Publish::Ready(WaitResult::Ok)
                }
                // Granted by a notifier meanwhile (popped, so already
                // uncounted): notified. Its wake of this record finds the
                // wait over (the ticket is spent) and does nothing.
                _ => Publish::Ready(WaitResult::Ok),
            };
        }
        Publish::Published
    }

    fn unpublish(&self, _: &Waiter, io: &mut CondIo<'a>) -> Option<WaitResult> {
        let mut queue = self.0.queue.lock();
        match queue.unlink(&mut io.node) {
            Status::Granted => Some(WaitResult::Ok),
            Status::Waiting => {
                // Relaxed: as in `notify_one`.
                self.0.waiting.fetch_sub(1, Ordering::Relaxed);
                None
            }
            _ => None,
        }
    }
}

/// Is the running fiber cancelled (its cancellable waits end at once)? The
/// loom models have no cancellation scopes.
fn cancelled() -> bool {
    #[cfg(not(loom))]
    return fiber_core::is_cancel_requested();
    #[cfg(loom)]
    false
}
