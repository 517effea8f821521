//! The lock word and waiter queue behind [`crate::Mutex`] (and the mutex
//! half of [`crate::Condvar`]).
//!
//! # State
//!
//! One word: [`LOCKED`] (someone holds the lock) and [`QUEUED`] (the waiter
//! queue is not empty). `QUEUED` changes only under the queue lock, and
//! under that lock it always equals "the queue is not empty".
//!
//! # Protocol
//!
//! * Lock, fast path: one CAS `0 -> LOCKED`. Unlock, fast path: one CAS
//!   `LOCKED -> 0`. Neither touches the queue or allocates.
//! * Lock, slow path: spin briefly, then `fiber_wait`. `try_complete`
//!   barges (takes a free lock whatever the queue holds). `publish`, under
//!   the queue lock, sets `QUEUED` and re-checks `LOCKED` in the same RMW:
//!   a free lock is taken at once, a held one means the node is queued.
//!   Because the unlock fast path is a CAS on the same word, either it ran
//!   first (and `publish` sees the lock free) or it fails on `QUEUED` and
//!   the unlocker takes the slow path, which finds the node. No lost
//!   wake-up.
//! * Unlock, slow path (under the queue lock): if the first waiter has
//!   waited past [`crate::queue::STARVATION`], hand the lock over: `LOCKED`
//!   stays set and the node is `Granted`. Otherwise clear `LOCKED`, mark
//!   the node `Woken` and wake it to compete with newcomers (barging, for
//!   throughput). A woken waiter that loses re-queues at the front.

use crate::queue::{Node, Status, WaitQueue};
use crate::sync::{AtomicUsize, Ordering, SpinLock};
use fiber_core::{fiber_wait, Interrupt, Publish, WaitOptions, WaitResult, Waitable, Waiter};

/// Someone holds the lock.
pub(crate) const LOCKED: usize = 1;
/// The waiter queue is not empty (changed under the queue lock only).
pub(crate) const QUEUED: usize = 2;

/// Spins on a held lock before parking: a short critical section on
/// another worker usually ends within this many `spin_loop` hints. Go
/// spins 4 x 30 `PAUSE`; re-tune with the contended `sync_contended` row.
#[cfg(not(loom))]
const SPINS: u32 = 100;
/// Longest run of `spin_loop` hints between two probes of the lock word.
#[cfg(not(loom))]
const MAX_SPIN_STEP: u32 = 32;

/// The raw lock: no data, no poisoning.
#[derive(Debug)]
pub(crate) struct RawMutex {
    state: AtomicUsize,
    queue: SpinLock<WaitQueue>,
}

impl RawMutex {
    #[cfg(not(loom))]
    pub(crate) const fn new() -> RawMutex {
        RawMutex {
            state: AtomicUsize::new(0),
            queue: SpinLock::new(WaitQueue::new()),
        }
    }

    #[cfg(loom)]
    pub(crate) fn new() -> RawMutex {
        RawMutex {
            state: AtomicUsize::new(0),
            queue: SpinLock::new(WaitQueue::new()),
        }
    }

    /// Take the lock if it is free (barging past queued waiters).
    #[inline]
    pub(crate) fn try_lock(&self) -> bool {
        // Acquire: pairs with the Release of `unlock` / `unlock_slow`, so
        // the previous holder's writes are visible to us.
        match self
            .state
            .compare_exchange(0, LOCKED, Ordering::Acquire, Ordering::Relaxed)
        {
            Ok(_) => true,
            Err(seen) => self.try_lock_from(seen),
        }
    }

    fn try_lock_from(&self, mut seen: usize) -> bool {
        while seen & LOCKED == 0 {
            // Acquire: as in `try_lock`.
            match self
                .state
                .compare_exchange_weak(seen, seen | LOCKED, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(s) => seen = s,
            }
        }
        false
    }

    /// Take the lock, parking (a fiber) or blocking (a thread) while it is
    /// held. Not a cancellation point.
    #[inline]
    #[track_caller]
    pub(crate) fn lock(&self) {
        // Acquire: as in `try_lock`.
        if self
            .state
            .compare_exchange_weak(0, LOCKED, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_slow();
        }
    }

    #[cold]
    #[track_caller]
    fn lock_slow(&self) {
        // No spinning under loom: the spin adds states, not protocol.
        #[cfg(not(loom))]
        if self.spin() {
            return;
        }
        let mut node = LockIo {
            node: Node::new(0),
            raw: self,
        };
        let result = fiber_wait(
            &LockWait(self),
            &mut node,
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

    /// Spin for the lock a little before parking; `true` if taken.
    /// Exponential backoff: fewer probes of a contended line means less
    /// cache-line traffic for the holder's unlock and re-lock.
    #[cfg(not(loom))]
    fn spin(&self) -> bool {
        let mut step = 1;
        let mut spun = 0;
        while spun < SPINS {
            // Relaxed: only a hint; the CAS in `try_lock_from` acquires.
            let seen = self.state.load(Ordering::Relaxed);
            if seen & LOCKED == 0 && self.try_lock_from(seen) {
                return true;
            }
            for _ in 0..step {
                crate::sync::spin_loop();
            }
            spun += step;
            step = (step * 2).min(MAX_SPIN_STEP);
        }
        false
    }

    /// Release the lock.
    #[inline]
    pub(crate) fn unlock(&self) {
        // Release: pairs with the Acquire of the next `lock`/`try_lock`.
        if self
            .state
            .compare_exchange(LOCKED, 0, Ordering::Release, Ordering::Relaxed)
            .is_err()
        {
            self.unlock_slow();
        }
    }

    #[cold]
    fn unlock_slow(&self) {
        let wake = {
            let mut queue = self.queue.lock();
            match queue.front() {
                // The queue emptied since our CAS failed: a waiter left, or
                // `front` just took the nodes of waiters given up by a
                // teardown. QUEUED goes too: in the second case nobody
                // else clears it, and every later unlock would take this
                // slow path.
                None => {
                    // Release: as in `unlock`.
                    self.state.fetch_and(!(LOCKED | QUEUED), Ordering::Release);
                    None
                }
                Some(first) if first.is_starving() => {
                    // Hand-off: LOCKED stays set, the new owner is the
                    // first waiter. Its `unpublish` reads `Granted` under
                    // this queue lock, which orders our critical section
                    // before its own.
                    let wake = queue.pop_front(Status::Granted).flatten();
                    if queue.is_empty() {
                        // Relaxed: QUEUED is only read as a hint outside
                        // the queue lock; the queue lock orders it inside.
                        self.state.fetch_and(!QUEUED, Ordering::Relaxed);
                    }
                    wake
                }
                Some(_) => {
                    let wake = queue.pop_front(Status::Woken).flatten();
                    let clear = if queue.is_empty() { LOCKED | QUEUED } else { LOCKED };
                    // Release: pairs with the Acquire of whoever locks next
                    // (the woken waiter or a barging newcomer).
                    self.state.fetch_and(!clear, Ordering::Release);
                    wake
                }
            }
        };
        if let Some(w) = wake {
            // Consumed: the frame reference moves into the run queue.
            w.wake();
        }
    }

    /// A wait ends with its node still queued: its fiber barged in after a
    /// wake that kept the node in place (`unpublish`), or its parked frame
    /// is being unwound (runtime shutdown). Undo whatever the node stands
    /// for.
    fn abandon(&self, node: &mut Node) {
        let status = {
            let mut queue = self.queue.lock();
            let status = queue.unlink(node);
            if status == Status::Waiting && queue.is_empty() {
                // Relaxed: as in `unlock_slow`.
                self.state.fetch_and(!QUEUED, Ordering::Relaxed);
            }
            status
        };
        match status {
            // The lock was handed to us: pass it on.
            Status::Granted => self.unlock(),
            // We were woken to retry and the lock may be free with nobody
            // else to wake the queue: wake the next waiter if so. (A wait
            // that barged in holds the lock: `try_lock` fails, and its
            // own unlock serves the queue.)
            Status::Woken if self.try_lock() => self.unlock(),
            _ => {}
        }
    }
}

/// The `Io` of one lock wait.
struct LockIo<'a> {
    node: Node,
    raw: &'a RawMutex,
}

impl Drop for LockIo<'_> {
    fn drop(&mut self) {
        if self.node.queued {
            self.raw.abandon(&mut self.node);
        }
    }
}

/// A lock wait as a fiber-core waitable.
struct LockWait<'a>(&'a RawMutex);

impl<'a> Waitable for LockWait<'a> {
    type Io = LockIo<'a>;

    fn kind(&self) -> fiber_core::WaitKind {
        fiber_core::WaitKind::Lock
    }

    fn try_complete(&self, _: &mut LockIo<'a>) -> Option<WaitResult> {
        self.0.try_lock().then_some(WaitResult::Ok)
    }

    fn publish(&self, waiter: &Waiter, io: &mut LockIo<'a>) -> Publish {
        let raw = self.0;
        let mut queue = raw.queue.lock();
        // Still in the queue after a wake that handed nothing over (see
        // `unpublish`): handed over since, still waiting (parks again in its
        // place), or woken to retry and beaten to it (queues again at the
        // front below, as any woken waiter that lost).
        if let Some(publish) = queue.take_up_kept(&mut io.node, waiter) {
            return publish;
        }
        // Relaxed on the RMW itself: what matters is its place in the
        // word's modification order against the unlock CAS (module docs);
        // the CAS below acquires.
        let mut seen = raw.state.fetch_or(QUEUED, Ordering::Relaxed) | QUEUED;
        while seen & LOCKED == 0 {
            let next = if queue.is_empty() { LOCKED } else { seen | LOCKED };
            // Acquire: as in `try_lock`.
            match raw
                .state
                .compare_exchange_weak(seen, next, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => return Publish::Ready(WaitResult::Ok),
                Err(s) => seen = s,
            }
        }
        let front = WaitQueue::is_requeue(&io.node);
        queue.push(&mut io.node, waiter, front);
        Publish::Published
    }

    fn unpublish(&self, _: &Waiter, io: &mut LockIo<'a>) -> Option<WaitResult> {
        let mut queue = self.0.queue.lock();
        if io.node.status() == Status::Waiting {
            // Woken while still queued (a cancel's interrupt: a lock wait
            // is no cancellation point and goes on): the node keeps its
            // place and `QUEUED` stays set, so an unlock while its fiber is
            // awake still hands the lock to it when its turn has come;
            // `publish` parks it again there (or finds the lock handed
            // over), and the `Io`'s drop takes it out if the wait ends
            // otherwise (a barging `try_complete`, or unwinding at
            // teardown)
            // (`reviews/review24.rs::mutex_starving_first_waiter_keeps_its_hand_off_when_its_fiber_is_cancelled`).
            return None;
        }
        // Handed over (the lock is ours), or woken to retry.
        (queue.unlink(&mut io.node) == Status::Granted).then_some(WaitResult::Ok)
    }
}

/// A lock waiter woken while its node is still `Waiting` (on a fiber, a
/// cancel's interrupt; here a third thread fires the waiter's record, the
/// same claim) keeps its node in place and parks again with a new record
/// (`WaitQueue::rewait`), so the unlock that comes later wakes the record
/// it now parks on. Mutation caught: `publish` leaves the old record in the
/// kept node (no `rewait`): the unlock wakes a stale ticket and the waiter
/// sleeps for ever (loom: deadlock).
#[cfg(all(test, loom))]
mod loom_spurious_wake {
    use super::*;
    use crate::tests::{fire, Spy};
    use loom::sync::Arc;
    use loom::thread;

    #[test]
    fn loom_mutex_waiter_woken_spuriously_keeps_its_node_and_gets_the_lock() {
        loom::model(|| {
            let raw = Arc::new(RawMutex::new());
            let last = Arc::new(loom::sync::Mutex::new(None::<Waiter>));
            let owners = Arc::new(loom::sync::atomic::AtomicUsize::new(0));
            raw.lock();
            let waiter = {
                let (raw, last, owners) = (raw.clone(), last.clone(), owners.clone());
                thread::spawn(move || {
                    let mut io = LockIo {
                        node: Node::new(0),
                        raw: &raw,
                    };
                    let spy = Spy {
                        inner: LockWait(&raw),
                        last: &last,
                    };
                    let result = fiber_wait(&spy, &mut io, WaitOptions::new().interrupt(Interrupt::NotCancellable));
                    assert_eq!(result, WaitResult::Ok);
                    drop(io);
                    assert_eq!(owners.fetch_add(1, Ordering::Relaxed), 0, "two owners");
                    owners.fetch_sub(1, Ordering::Relaxed);
                    raw.unlock();
                })
            };
            let spurious = {
                let last = last.clone();
                thread::spawn(move || fire(&last))
            };
            assert_eq!(owners.fetch_add(1, Ordering::Relaxed), 0, "two owners");
            owners.fetch_sub(1, Ordering::Relaxed);
            raw.unlock();
            spurious.join().unwrap();
            waiter.join().unwrap();
            assert!(raw.try_lock(), "the lock ends free");
        });
    }
}
