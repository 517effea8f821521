//! [`RwLock`]: `std::sync::RwLock`'s API, parking waiters, writers not
//! starved.
//!
//! # State
//!
//! One word: [`WRITER`] (a writer holds the lock), [`QUEUED`] (the waiter
//! queue is not empty; changed under the queue lock only) and the reader
//! count in units of [`READER`].
//!
//! # Protocol
//!
//! * Fast paths (one CAS each): a reader adds [`READER`] while neither
//!   `WRITER` nor `QUEUED` is set; a writer CASes `0 -> WRITER`. With
//!   anyone queued, newcomers queue too: a waiting writer stops the stream
//!   of new readers, so it is not starved.
//! * `publish` (under the queue lock) sets `QUEUED` in an RMW that also
//!   reads the word; if the queue is empty and the lock is compatible it
//!   takes it at once, else the node is queued.
//! * Releases: the last reader (`fetch_sub` seeing one reader and
//!   `QUEUED`) and a writer whose fast CAS fails on `QUEUED` take the queue
//!   lock and `grant`: hand the lock to the head node if it is a writer, or
//!   to every reader at the head of the queue. Grants are hand-offs (the
//!   word is updated for the new owners before they are woken), in FIFO
//!   order.

use crate::poison;
use crate::queue::{Node, Status, WaitQueue};
use crate::sync::{AtomicUsize, Ordering, SpinLock, UnsafeCell};
use fiber_core::{fiber_wait, Interrupt, Publish, WaitOptions, WaitResult, Waitable, Waiter};
use std::fmt;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::{LockResult, TryLockError, TryLockResult};

/// A writer holds the lock.
const WRITER: usize = 1;
/// The waiter queue is not empty.
const QUEUED: usize = 2;
/// One reader.
const READER: usize = 4;

/// What a node asks for.
const WANT_READ: usize = 0;
const WANT_WRITE: usize = 1;

/// A reader-writer lock that parks the calling fiber (or blocks the
/// calling thread), with the API and poisoning of [`std::sync::RwLock`].
///
/// Waiters are served in FIFO order once anyone waits: a writer waiting
/// behind readers stops new readers from joining them, so writers are not
/// starved. A reader that already holds a read lock and asks for another
/// while a writer waits therefore deadlocks (as `std` warns it may).
///
/// Neither `read` nor `write` is a cancellation point (as with `std`).
///
/// # Examples
///
/// ```
/// # mod fiber { pub(crate) use fiber_sync as sync; }
/// use fiber::sync::RwLock;
///
/// let lock = RwLock::new(5);
/// {
///     let r1 = lock.read().unwrap();
///     let r2 = lock.read().unwrap();
///     assert_eq!(*r1 + *r2, 10);
/// }
/// *lock.write().unwrap() += 1;
/// assert_eq!(*lock.read().unwrap(), 6);
/// ```
pub struct RwLock<T: ?Sized> {
    state: AtomicUsize,
    queue: SpinLock<WaitQueue>,
    poison: poison::Flag,
    data: UnsafeCell<T>,
}

// SAFETY: as `std::sync::RwLock`: the value moves between holders on any
// thread (`T: Send`); readers share `&T` across threads (`T: Sync`).
unsafe impl<T: ?Sized + Send> Send for RwLock<T> {}
// SAFETY: as above.
unsafe impl<T: ?Sized + Send + Sync> Sync for RwLock<T> {}

// As `std::sync::RwLock`: a writer's panic poisons the lock, so a reference
// may cross `catch_unwind` whatever `T` is.
impl<T: ?Sized> std::panic::UnwindSafe for RwLock<T> {}
impl<T: ?Sized> std::panic::RefUnwindSafe for RwLock<T> {}

impl<T> RwLock<T> {
    /// An unlocked lock.
    #[cfg(not(loom))]
    pub const fn new(value: T) -> RwLock<T> {
        RwLock {
            state: AtomicUsize::new(0),
            queue: SpinLock::new(WaitQueue::new()),
            poison: poison::Flag::new(),
            data: UnsafeCell::new(value),
        }
    }

    /// An unlocked lock.
    #[cfg(loom)]
    pub fn new(value: T) -> RwLock<T> {
        RwLock {
            state: AtomicUsize::new(0),
            queue: SpinLock::new(WaitQueue::new()),
            poison: poison::Flag::new(),
            data: UnsafeCell::new(value),
        }
    }

    /// Consume the lock and return the value.
    ///
    /// # Errors
    ///
    /// `Err` (holding the value) if the lock is poisoned.
    pub fn into_inner(self) -> LockResult<T> {
        let poisoned = self.poison.get();
        poison::map_result(poisoned, self.data.into_inner())
    }
}

impl<T: ?Sized> RwLock<T> {
    /// Shared access, parking while a writer holds the lock or waits for
    /// it. Not a cancellation point.
    ///
    /// # Errors
    ///
    /// `Err` (holding the guard) if the lock is poisoned.
    #[track_caller]
    pub fn read(&self) -> LockResult<RwLockReadGuard<'_, T>> {
        fiber_core::coop_point();
        if !self.try_read_raw() {
            self.wait(WANT_READ);
        }
        let guard = RwLockReadGuard::new(self);
        poison::map_result(self.poison.get(), guard)
    }

    /// Exclusive access, parking while anyone holds the lock. Not a
    /// cancellation point.
    ///
    /// # Errors
    ///
    /// `Err` (holding the guard) if the lock is poisoned.
    #[track_caller]
    pub fn write(&self) -> LockResult<RwLockWriteGuard<'_, T>> {
        fiber_core::coop_point();
        if !self.try_write_raw() {
            self.wait(WANT_WRITE);
        }
        self.write_guard()
    }

    /// Shared access if available right now (never parks; in a fiber, a
    /// call that finds nothing to do counts toward the poll budget, and
    /// every `fiber_core::POLL_BUDGET` (128) such misses the fiber yields,
    /// so a loop that polls lets other fibers run.)
    ///
    /// # Errors
    ///
    /// [`TryLockError::WouldBlock`] if a writer holds or awaits the lock,
    /// [`TryLockError::Poisoned`] (holding the guard) if it is poisoned.
    pub fn try_read(&self) -> TryLockResult<RwLockReadGuard<'_, T>> {
        fiber_core::coop_point();
        let result = self.try_read_quiet();
        if matches!(result, Err(TryLockError::WouldBlock)) {
            // A failed poll: counts toward the fiber's budget yield.
            fiber_core::poll_missed();
        }
        result
    }

    /// [`try_read`](Self::try_read) without the poll accounting (never a
    /// yield point: `Debug` uses it).
    fn try_read_quiet(&self) -> TryLockResult<RwLockReadGuard<'_, T>> {
        if !self.try_read_raw() {
            return Err(TryLockError::WouldBlock);
        }
        let guard = RwLockReadGuard::new(self);
        Ok(poison::map_result(self.poison.get(), guard)?)
    }

    /// Exclusive access if available right now (never parks; in a fiber, a
    /// call that finds nothing to do counts toward the poll budget, and
    /// every `fiber_core::POLL_BUDGET` (128) such misses the fiber yields,
    /// so a loop that polls lets other fibers run.)
    ///
    /// # Errors
    ///
    /// [`TryLockError::WouldBlock`] if the lock is held or awaited,
    /// [`TryLockError::Poisoned`] (holding the guard) if it is poisoned.
    pub fn try_write(&self) -> TryLockResult<RwLockWriteGuard<'_, T>> {
        fiber_core::coop_point();
        if !self.try_write_raw() {
            // A failed poll: counts toward the fiber's budget yield.
            fiber_core::poll_missed();
            return Err(TryLockError::WouldBlock);
        }
        Ok(self.write_guard()?)
    }

    /// Did a writer panic while holding the lock?
    pub fn is_poisoned(&self) -> bool {
        self.poison.get()
    }

    /// Clear the poison flag.
    pub fn clear_poison(&self) {
        self.poison.clear();
    }

    /// The value, through `&mut self`.
    ///
    /// # Errors
    ///
    /// `Err` (still giving access) if the lock is poisoned.
    pub fn get_mut(&mut self) -> LockResult<&mut T> {
        let poisoned = self.poison.get();
        // SAFETY: `&mut self` excludes every other access.
        let value = self.data.with_mut(|p| unsafe { &mut *p });
        poison::map_result(poisoned, value)
    }

    fn write_guard(&self) -> LockResult<RwLockWriteGuard<'_, T>> {
        let guard = RwLockWriteGuard {
            lock: self,
            poison: self.poison.guard(),
            _not_send: PhantomData,
        };
        poison::map_result(self.poison.get(), guard)
    }

    #[inline]
    fn try_read_raw(&self) -> bool {
        // Relaxed: the CAS below acquires.
        let mut seen = self.state.load(Ordering::Relaxed);
        while seen & (WRITER | QUEUED) == 0 {
            // Acquire: pairs with the Release of the last writer's unlock.
            match self
                .state
                .compare_exchange_weak(seen, seen + READER, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(s) => seen = s,
            }
        }
        false
    }

    #[inline]
    fn try_write_raw(&self) -> bool {
        // Acquire: pairs with the Release of the previous holders' unlocks.
        self.state
            .compare_exchange(0, WRITER, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    #[cold]
    #[track_caller]
    fn wait(&self, want: usize) {
        let mut io = RwIo {
            node: Node::new(want),
            lock: self.as_raw(),
        };
        let result = fiber_wait(
            &RwWait(self.as_raw()),
            &mut io,
            WaitOptions::new().interrupt(Interrupt::NotCancellable),
        );
        // A real assertion: a lock wait that came back without the lock
        // would hand out a second guard (a data race), never worth the
        // one comparison it costs.
        assert_eq!(
            result,
            WaitResult::Ok,
            "a non-cancellable lock wait ends only by locking"
        );
    }

    fn as_raw(&self) -> Raw<'_> {
        Raw {
            state: &self.state,
            queue: &self.queue,
        }
    }

    fn unlock_write(&self) {
        self.as_raw().unlock_write();
    }
}

/// The word and queue of a lock, without its data (so the waitable is not
/// generic over `T`).
#[derive(Clone, Copy)]
struct Raw<'a> {
    state: &'a AtomicUsize,
    queue: &'a SpinLock<WaitQueue>,
}

impl Raw<'_> {
    fn unlock_read(&self) {
        // Release: pairs with the Acquire of the next writer (fast CAS or
        // `grant`).
        let prev = self.state.fetch_sub(READER, Ordering::Release);
        debug_assert!(prev >= READER, "read unlock without a reader");
        if prev & !WRITER == READER | QUEUED {
            self.grant_now();
        }
    }

    fn unlock_write(&self) {
        // Release: pairs with the Acquire of the next holder.
        if self
            .state
            .compare_exchange(WRITER, 0, Ordering::Release, Ordering::Relaxed)
            .is_err()
        {
            let wakes = {
                let mut queue = self.queue.lock();
                // Release: as above (for the grant below, and anyone who
                // takes the lock after the queue empties).
                self.state.fetch_and(!WRITER, Ordering::Release);
                self.grant(&mut queue)
            };
            WaitQueue::wake_all(wakes);
        }
    }

    /// The writer becomes one reader (`WRITER` to `READER` in one RMW,
    /// `QUEUED` kept); with waiters queued, `grant` then lets in the readers
    /// at the head (a head writer waits for the last reader, whose unlock
    /// grants as usual).
    fn downgrade(&self) {
        // WRITER is set, so adding `READER - WRITER` clears it and adds a
        // reader without touching the other bits. Release: pairs with the
        // Acquire of the readers who get in from now on (fast CAS or
        // `grant`), publishing the writer's changes.
        let prev = self.state.fetch_add(READER - WRITER, Ordering::Release);
        debug_assert!(prev & WRITER != 0, "downgrade without the write lock");
        if prev & QUEUED != 0 {
            self.grant_now();
        }
    }

    fn grant_now(&self) {
        let wakes = {
            let mut queue = self.queue.lock();
            self.grant(&mut queue)
        };
        WaitQueue::wake_all(wakes);
    }

    /// Under the queue lock: hand the lock to the head of the queue (one
    /// writer, or every reader at the head) if it is free enough; keep
    /// `QUEUED` equal to "the queue is not empty".
    fn grant(&self, queue: &mut WaitQueue) -> Vec<Waiter> {
        let mut wakes = Vec::new();
        while let Some(first) = queue.front() {
            // Acquire: pairs with the Release of the unlocks, so the new
            // owners see the previous holders' writes (through our queue
            // lock release and their unpublish).
            let seen = self.state.load(Ordering::Acquire);
            if first.arg == WANT_WRITE {
                if seen & !QUEUED != 0 {
                    break;
                }
                // Only read-unlocks (which cannot apply: no readers) and
                // queue-lock holders change the word now, so a plain RMW
                // suffices. Acquire: as above.
                self.state.fetch_or(WRITER, Ordering::Acquire);
                wakes.extend(queue.pop_front(Status::Granted).flatten());
                break;
            }
            if seen & WRITER != 0 {
                break;
            }
            // Acquire: as above.
            self.state.fetch_add(READER, Ordering::Acquire);
            wakes.extend(queue.pop_front(Status::Granted).flatten());
        }
        if queue.is_empty() {
            // Relaxed: QUEUED is only a hint outside the queue lock.
            self.state.fetch_and(!QUEUED, Ordering::Relaxed);
        }
        wakes
    }
}

impl<T: Default> Default for RwLock<T> {
    fn default() -> Self {
        RwLock::new(T::default())
    }
}

impl<T> From<T> for RwLock<T> {
    fn from(value: T) -> Self {
        RwLock::new(value)
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for RwLock<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("RwLock");
        match self.try_read_quiet() {
            Ok(guard) => d.field("data", &&*guard),
            Err(TryLockError::Poisoned(err)) => d.field("data", &&**err.get_ref()),
            Err(TryLockError::WouldBlock) => d.field("data", &format_args!("<locked>")),
        };
        d.field("poisoned", &self.poison.get());
        d.finish_non_exhaustive()
    }
}

/// Shared access to an [`RwLock`]'s value; releases on drop.
#[must_use = "if unused the RwLock will immediately unlock"]
pub struct RwLockReadGuard<'a, T: ?Sized + 'a> {
    /// The value, as a pointer rather than through `&'a RwLock<T>`: the
    /// lock holds it in an `UnsafeCell`, which would make the guard
    /// invariant in `T`; std's read guard is covariant (a
    /// `RwLockReadGuard<&'long U>` passes where a `&'short U` one is
    /// expected).
    data: NonNull<T>,
    raw: Raw<'a>,
    /// Borrows the value for `'a` (covariant), and is not `Send`: the
    /// unlock belongs to the holder, as with std's guards.
    _borrow: PhantomData<(&'a T, *const ())>,
}

// As std's read guard (whose fields give these automatically): the lock's
// queue behind `raw` is never left half-changed by an unwind, and the
// value is only read through the guard.
impl<T: ?Sized + std::panic::RefUnwindSafe> std::panic::UnwindSafe for RwLockReadGuard<'_, T> {}
impl<T: ?Sized + std::panic::RefUnwindSafe> std::panic::RefUnwindSafe for RwLockReadGuard<'_, T> {}

impl<'a, T: ?Sized> RwLockReadGuard<'a, T> {
    /// The guard of a read lock the caller has just taken.
    fn new(lock: &'a RwLock<T>) -> RwLockReadGuard<'a, T> {
        RwLockReadGuard {
            data: lock
                .data
                .with(|p| NonNull::new(p.cast_mut()).expect("a cell's address is not null")),
            raw: lock.as_raw(),
            _borrow: PhantomData,
        }
    }
}

// SAFETY: a shared guard gives `&T` only.
unsafe impl<T: ?Sized + Sync> Sync for RwLockReadGuard<'_, T> {}

/// Exclusive access to an [`RwLock`]'s value; releases on drop.
#[must_use = "if unused the RwLock will immediately unlock"]
pub struct RwLockWriteGuard<'a, T: ?Sized + 'a> {
    lock: &'a RwLock<T>,
    poison: poison::Guard,
    _not_send: PhantomData<*const ()>,
}

// SAFETY: a shared guard gives `&T` only.
unsafe impl<T: ?Sized + Sync> Sync for RwLockWriteGuard<'_, T> {}

impl<T: ?Sized> Deref for RwLockReadGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: `data` points into the lock, which outlives the guard
        // (`'a`), and a read guard holds a read lock: no writer exists.
        unsafe { self.data.as_ref() }
    }
}

impl<T: ?Sized> Drop for RwLockReadGuard<'_, T> {
    fn drop(&mut self) {
        self.raw.unlock_read();
    }
}

impl<T: ?Sized> Deref for RwLockWriteGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the write guard holds the lock exclusively.
        self.lock.data.with(|p| unsafe { &*p })
    }
}

impl<T: ?Sized> DerefMut for RwLockWriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the write guard holds the lock exclusively.
        self.lock.data.with_mut(|p| unsafe { &mut *p })
    }
}

impl<T: ?Sized> Drop for RwLockWriteGuard<'_, T> {
    fn drop(&mut self) {
        self.lock.poison.done(self.poison);
        self.lock.unlock_write();
    }
}

impl<T: ?Sized + fmt::Display> fmt::Display for RwLockReadGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&**self, f)
    }
}

impl<T: ?Sized + fmt::Display> fmt::Display for RwLockWriteGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&**self, f)
    }
}

impl<'a, T: ?Sized> RwLockWriteGuard<'a, T> {
    /// Turn a write guard into a read guard without unlocking, like
    /// `std::sync::RwLockWriteGuard::downgrade`: no writer can take the
    /// lock in between, and the readers at the head of the queue get in
    /// along with the caller (a writer at the head goes on waiting).
    ///
    /// ```
    /// # mod fiber { pub(crate) use fiber_sync as sync; }
    /// use fiber::sync::{RwLock, RwLockWriteGuard};
    ///
    /// let lock = RwLock::new(1);
    /// let mut w = lock.write().unwrap();
    /// *w = 2;
    /// let r = RwLockWriteGuard::downgrade(w);
    /// assert_eq!(*r, 2);
    /// assert_eq!(*lock.try_read().unwrap(), 2);
    /// assert!(lock.try_write().is_err());
    /// ```
    pub fn downgrade(s: Self) -> RwLockReadGuard<'a, T> {
        let lock = s.lock;
        // A panic after this point happens while holding a read lock,
        // which does not poison (as std).
        lock.poison.done(s.poison);
        std::mem::forget(s);
        lock.as_raw().downgrade();
        RwLockReadGuard::new(lock)
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for RwLockReadGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for RwLockWriteGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

/// The `Io` of one wait.
struct RwIo<'a> {
    node: Node,
    lock: Raw<'a>,
}

impl Drop for RwIo<'_> {
    fn drop(&mut self) {
        if !self.node.queued {
            return;
        }
        // Unwound while parked (shutdown): leave, or give back a grant.
        let (status, wakes) = {
            let mut queue = self.lock.queue.lock();
            let status = queue.unlink(&mut self.node);
            (status, self.lock.grant(&mut queue))
        };
        WaitQueue::wake_all(wakes);
        if status == Status::Granted {
            if self.node.arg == WANT_WRITE {
                self.lock.unlock_write();
            } else {
                self.lock.unlock_read();
            }
        }
    }
}

/// A lock wait as a fiber-core waitable.
struct RwWait<'a>(Raw<'a>);

impl<'a> Waitable for RwWait<'a> {
    type Io = RwIo<'a>;

    fn kind(&self) -> fiber_core::WaitKind {
        fiber_core::WaitKind::Lock
    }

    fn try_complete(&self, io: &mut RwIo<'a>) -> Option<WaitResult> {
        let state = self.0.state;
        let ok = if io.node.arg == WANT_WRITE {
            // Acquire: as in `try_write_raw`.
            state
                .compare_exchange(0, WRITER, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        } else {
            // Relaxed: the CAS acquires.
            let seen = state.load(Ordering::Relaxed);
            // Acquire: as in `try_read_raw`.
            seen & (WRITER | QUEUED) == 0
                && state
                    .compare_exchange(seen, seen + READER, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
        };
        ok.then_some(WaitResult::Ok)
    }

    fn publish(&self, waiter: &Waiter, io: &mut RwIo<'a>) -> Publish {
        let state = self.0.state;
        let mut queue = self.0.queue.lock();
        if io.node.queued {
            // Still in the queue after a wake that granted nothing (see
            // `unpublish`): granted since, or parks again in its place.
            if io.node.status() == Status::Granted {
                queue.unlink(&mut io.node);
                return Publish::Ready(WaitResult::Ok);
            }
            queue.rewait(&io.node, waiter);
            return Publish::Published;
        }
        // Relaxed on the RMW: its place in the word's modification order
        // against the unlocks is what matters; the CAS below acquires.
        let mut seen = state.fetch_or(QUEUED, Ordering::Relaxed) | QUEUED;
        if queue.is_empty() {
            loop {
                let next = if io.node.arg == WANT_WRITE {
                    (seen & !QUEUED == 0).then_some(WRITER)
                } else {
                    (seen & WRITER == 0).then_some((seen + READER) & !QUEUED)
                };
                let Some(next) = next else { break };
                // Acquire: pairs with the Release of the unlocks. The queue
                // is empty, so QUEUED is cleared again.
                match state.compare_exchange_weak(seen, next, Ordering::Acquire, Ordering::Relaxed) {
                    Ok(_) => return Publish::Ready(WaitResult::Ok),
                    Err(s) => seen = s,
                }
            }
        }
        // A node woken without a grant never leaves the queue (see
        // `unpublish`): every push is a first one, at the back (strict
        // FIFO, section 3.2).
        queue.push(&mut io.node, waiter, false);
        Publish::Published
    }

    fn unpublish(&self, _: &Waiter, io: &mut RwIo<'a>) -> Option<WaitResult> {
        let mut queue = self.0.queue.lock();
        if io.node.status() == Status::Waiting {
            // Woken without a grant (a cancel's interrupt: a lock wait is
            // no cancellation point and goes on): the node keeps its place
            // in the queue and `QUEUED` stays set, so no reader passes a
            // waiting writer and no grant skips it while its fiber is
            // awake; `publish` parks it again there (or finds it granted
            // meanwhile), and the `Io`'s drop takes it out if the fiber is
            // unwound instead
            // (`reviews/review24.rs::rwlock_try_read_never_passes_a_waiting_writer_whose_fiber_is_cancelled`).
            return None;
        }
        // Granted (the lock is ours), or handed out of the queue otherwise.
        let status = queue.unlink(&mut io.node);
        drop(queue);
        (status == Status::Granted).then_some(WaitResult::Ok)
    }
}

/// A waiting writer woken while its node is still `Waiting` (on a fiber, a
/// cancel's interrupt; here a third thread fires the writer's record, the
/// same claim) keeps its node, and `QUEUED`, in place and parks again with
/// a new record (`WaitQueue::rewait`): a reader arriving meanwhile queues
/// behind it, and the last reader's unlock grants the writer the record it
/// now parks on. Mutations caught: `publish` leaves the old record in the
/// kept node (no `rewait`): the grant wakes a stale ticket and the writer
/// sleeps for ever (loom: deadlock).
#[cfg(all(test, loom))]
mod loom_spurious_wake {
    use super::*;
    use crate::tests::{fire, Spy};
    use loom::sync::Arc;
    use loom::thread;

    #[test]
    fn loom_rwlock_writer_woken_spuriously_keeps_its_place_and_gets_the_lock() {
        loom::model(|| {
            let lock = Arc::new(RwLock::new(0u32));
            let last = Arc::new(loom::sync::Mutex::new(None::<Waiter>));
            let held = lock.read().unwrap();
            let writer = {
                let (lock, last) = (lock.clone(), last.clone());
                thread::spawn(move || {
                    let mut io = RwIo {
                        node: Node::new(WANT_WRITE),
                        lock: lock.as_raw(),
                    };
                    let spy = Spy {
                        inner: RwWait(lock.as_raw()),
                        last: &last,
                    };
                    let result = fiber_wait(&spy, &mut io, WaitOptions::new().interrupt(Interrupt::NotCancellable));
                    assert_eq!(result, WaitResult::Ok);
                    drop(io);
                    // The writer holds the lock: no reader may be inside.
                    assert_eq!(lock.state.load(Ordering::Relaxed) & !QUEUED, WRITER);
                    lock.unlock_write();
                })
            };
            let spurious = {
                let last = last.clone();
                thread::spawn(move || fire(&last))
            };
            drop(held);
            spurious.join().unwrap();
            writer.join().unwrap();
            assert!(lock.try_write().is_ok(), "the lock ends free");
        });
    }
}
