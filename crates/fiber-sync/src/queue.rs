//! The waiter queue every primitive shares: nodes on their owners' stacks,
//! linked by pointer into a FIFO under the primitive's small queue lock.
//! The list is intrusive and doubly linked, so a waiter that leaves
//! (deadline, cancellation, unwinding at shutdown) unlinks itself in O(1):
//! a scan for it made n waiters leaving cost O(n^2) under the lock (40,000
//! cancelled `Semaphore::acquire` calls took 11x as long as 10,000).
//!
//! # Rules
//!
//! * A node lives in its owner's frame for the whole of one `fiber_wait`
//!   (it is part of the wait's `Io`). While it is queued, the queue holds a
//!   pointer to it; every access through that pointer happens under the
//!   queue lock.
//! * The owner unlinks its node under the queue lock before the node goes
//!   away: in `Waitable::unpublish`, or in the `Drop` of the wait's `Io`
//!   when a parked fiber is unwound at shutdown. So no queued pointer ever
//!   dangles.
//! * A waker that takes a node off the queue sets its [`Status`] and clones
//!   its [`Waiter`] under the lock, and calls `fiber_wake` after releasing
//!   the lock.

use crate::sync::UnsafeCell;
use fiber_core::Waiter;
use std::marker::PhantomPinned;
use std::ptr;

/// Where a node stands. Changed under the queue lock only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Status {
    /// Not queued yet.
    Idle,
    /// Queued.
    Waiting,
    /// A waker completed the operation for this node (lock handed over,
    /// permits granted, notified, barrier released, ...).
    Granted,
    /// Taken off the queue and woken to retry (a mutex in normal mode).
    Woken,
    /// Unlinked by its owner while still waiting (spurious wake, deadline
    /// or cancellation).
    Removed,
}

/// How long a waiter has waited, for the fairness rule (spec/sync.md
/// "Fairness").
#[cfg(not(loom))]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Since(Option<std::time::Instant>);

/// A waiter that has waited this long is served first: the next unlock
/// hands the lock to it instead of letting a newcomer barge. Go's
/// `starvationThresholdNs` (1 ms); lower it for fairness, raise it for
/// throughput under contention.
#[cfg(not(loom))]
pub(crate) const STARVATION: std::time::Duration = std::time::Duration::from_millis(1);

#[cfg(not(loom))]
impl Since {
    /// Note the first enqueue.
    pub(crate) fn start(&mut self) {
        if self.0.is_none() {
            self.0 = Some(std::time::Instant::now());
        }
    }

    /// Has this waiter waited past [`STARVATION`]?
    pub(crate) fn is_starving(&self) -> bool {
        self.0.is_some_and(|t| t.elapsed() >= STARVATION)
    }

    /// Was it queued before (a woken waiter that lost the race)?
    pub(crate) fn is_requeue(&self) -> bool {
        self.0.is_some()
    }
}

/// Under loom time is not modelled: a waiter counts as starving once it has
/// been queued twice (woken once and lost the race), so the models explore
/// both the barging and the hand-off path deterministically.
#[cfg(loom)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Since(u32);

#[cfg(loom)]
impl Since {
    pub(crate) fn start(&mut self) {
        self.0 += 1;
    }

    pub(crate) fn is_starving(&self) -> bool {
        self.0 >= 2
    }

    pub(crate) fn is_requeue(&self) -> bool {
        self.0 >= 1
    }
}

/// One waiting operation (on its owner's stack).
#[derive(Debug)]
pub(crate) struct Node {
    waiter: UnsafeCell<Option<Waiter>>,
    status: UnsafeCell<Status>,
    since: UnsafeCell<Since>,
    /// What the node asks for (permits, read or write); set before the
    /// first publish, read-only afterwards.
    pub(crate) arg: usize,
    /// Owner-only: queued by `publish` and not yet unlinked by the owner.
    pub(crate) queued: bool,
    /// The neighbours towards the front and the back while queued (null at
    /// the ends); under the queue lock.
    prev: UnsafeCell<*const Node>,
    next: UnsafeCell<*const Node>,
    /// The queue and the neighbours reach a queued node through raw
    /// pointers while its owner still holds `&mut` to the wait's `Io`
    /// around it. `!Unpin` tells the compiler that such a `&mut` is not
    /// the only way in (no `noalias`), the rule intrusive lists in tokio
    /// and the standard library rely on as well.
    _pinned: PhantomPinned,
}

impl Node {
    pub(crate) fn new(arg: usize) -> Node {
        Node {
            waiter: UnsafeCell::new(None),
            status: UnsafeCell::new(Status::Idle),
            since: UnsafeCell::new(Since::default()),
            arg,
            queued: false,
            prev: UnsafeCell::new(ptr::null()),
            next: UnsafeCell::new(ptr::null()),
            _pinned: PhantomPinned,
        }
    }

    /// The neighbour towards the front. Under the lock.
    fn prev(&self) -> *const Node {
        // SAFETY: the links are written and read under the queue lock only
        // (module rules).
        self.prev.with(|p| unsafe { *p })
    }

    /// The neighbour towards the back. Under the lock.
    fn next(&self) -> *const Node {
        // SAFETY: as in `prev`.
        self.next.with(|p| unsafe { *p })
    }

    /// Set both links. Under the lock.
    fn set_links(&self, prev: *const Node, next: *const Node) {
        // SAFETY: as in `prev`.
        self.prev.with_mut(|p| unsafe { *p = prev });
        // SAFETY: as in `prev`.
        self.next.with_mut(|p| unsafe { *p = next });
    }

    /// The node's status. Callers hold the queue lock, or own the node
    /// while it is not queued.
    pub(crate) fn status(&self) -> Status {
        // SAFETY: wakers write the status under the queue lock only; the
        // caller holds that lock or the node is not queued (module rules).
        self.status.with(|s| unsafe { *s })
    }

    /// Set the status (same rule as [`Node::status`]).
    pub(crate) fn set_status(&self, status: Status) {
        // SAFETY: as in `status`.
        self.status.with_mut(|s| unsafe { *s = status })
    }

    /// Has the node waited past the starvation threshold? Under the lock.
    pub(crate) fn is_starving(&self) -> bool {
        // SAFETY: `since` is written by the owner under the queue lock
        // (`WaitQueue::push`) and read under it.
        self.since.with(|s| unsafe { (*s).is_starving() })
    }

    /// Take the node off the queue as `status` and return its waiter to
    /// wake once the lock is released. Under the lock.
    pub(crate) fn complete(&self, status: Status) -> Option<Waiter> {
        self.set_status(status);
        // SAFETY: under the queue lock (module rules).
        self.waiter.with_mut(|w| unsafe { (*w).take() })
    }
}

/// The FIFO of waiting nodes, an intrusive doubly linked list through the
/// nodes' `prev` / `next`. Lives inside a `SpinLock`; every method runs
/// with that lock held.
#[derive(Debug)]
pub(crate) struct WaitQueue {
    head: *const Node,
    tail: *const Node,
}

// SAFETY: the nodes the pointers reach are only touched under the queue
// lock, and their owners keep them alive (and in place) while queued
// (module rules), so the queue may move to and be used from any thread.
unsafe impl Send for WaitQueue {}

impl Default for WaitQueue {
    fn default() -> WaitQueue {
        WaitQueue::new()
    }
}

impl WaitQueue {
    #[cfg(not(loom))]
    pub(crate) const fn new() -> WaitQueue {
        WaitQueue {
            head: ptr::null(),
            tail: ptr::null(),
        }
    }

    #[cfg(loom)]
    pub(crate) fn new() -> WaitQueue {
        WaitQueue {
            head: ptr::null(),
            tail: ptr::null(),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.head.is_null()
    }

    /// Queue `node` for `waiter`: at the back, or at the front for a waiter
    /// that was woken and lost the race (`front`).
    pub(crate) fn push(&mut self, node: &mut Node, waiter: &Waiter, front: bool) {
        self.push_inner(node, waiter, front);
        node.queued = true;
    }

    fn push_inner(&mut self, node: &Node, waiter: &Waiter, front: bool) {
        // SAFETY: under the queue lock (module rules).
        node.waiter.with_mut(|w| unsafe { *w = Some(waiter.clone()) });
        // SAFETY: as above.
        node.since.with_mut(|s| unsafe { (*s).start() });
        node.set_status(Status::Waiting);
        let me: *const Node = node;
        if self.head.is_null() {
            node.set_links(ptr::null(), ptr::null());
            self.head = me;
            self.tail = me;
        } else if front {
            node.set_links(ptr::null(), self.head);
            // SAFETY: a queued node is alive and we hold the lock.
            unsafe { (*self.head).prev.with_mut(|p| *p = me) };
            self.head = me;
        } else {
            node.set_links(self.tail, ptr::null());
            // SAFETY: as above.
            unsafe { (*self.tail).next.with_mut(|p| *p = me) };
            self.tail = me;
        }
    }

    /// A node still queued after a wake that did not complete it (a
    /// cancel's interrupt of a wait that goes on): its owner parks again
    /// with a new record, keeping its place. Under the lock.
    pub(crate) fn rewait(&mut self, node: &Node, waiter: &Waiter) {
        debug_assert_eq!(node.status(), Status::Waiting, "only a waiting node keeps its place");
        // SAFETY: under the queue lock (module rules).
        node.waiter.with_mut(|w| unsafe { *w = Some(waiter.clone()) });
    }

    /// `publish` of a wait whose node may still be queued after a wake
    /// that granted nothing (see `rewait`): granted since (unlinked; the
    /// wait ends `Ok`), still waiting (parks again in its place), or
    /// neither (unlinked; `None`: the caller queues it as new). `None` too
    /// for a node that is not queued. Under the lock.
    pub(crate) fn take_up_kept(&mut self, node: &mut Node, waiter: &Waiter) -> Option<fiber_core::Publish> {
        if !node.queued {
            return None;
        }
        match node.status() {
            Status::Granted => {
                self.unlink(node);
                Some(fiber_core::Publish::Ready(fiber_core::WaitResult::Ok))
            }
            Status::Waiting => {
                self.rewait(node, waiter);
                Some(fiber_core::Publish::Published)
            }
            _ => {
                self.unlink(node);
                None
            }
        }
    }

    /// Take `node` (queued) out of the list. Under the lock.
    fn detach(&mut self, node: &Node) {
        let (prev, next) = (node.prev(), node.next());
        if prev.is_null() {
            self.head = next;
        } else {
            // SAFETY: a queued neighbour is alive and we hold the lock.
            unsafe { (*prev).next.with_mut(|p| *p = next) };
        }
        if next.is_null() {
            self.tail = prev;
        } else {
            // SAFETY: as above.
            unsafe { (*next).prev.with_mut(|p| *p = prev) };
        }
        node.set_links(ptr::null(), ptr::null());
    }

    /// Was `node` queued before (woken once, lost the race)? Owner only.
    pub(crate) fn is_requeue(node: &Node) -> bool {
        // SAFETY: under the queue lock (module rules).
        node.since.with(|s| unsafe { (*s).is_requeue() })
    }

    /// The first node. Under the lock, so the node is alive while queued.
    pub(crate) fn front(&mut self) -> Option<&Node> {
        self.skip_lost();
        // SAFETY: queued nodes are alive and only touched under the lock,
        // which the caller holds (`&mut self` borrows the locked queue).
        (!self.head.is_null()).then(|| unsafe { &*self.head })
    }

    /// Take the nodes of waiters given up for good by their runtime's
    /// teardown off the front (`Waiter::is_lost`): they never run again,
    /// so what they were granted (a lock, permits, a notify) would be lost
    /// with them, a lock left locked for ever. Their nodes live on leaked
    /// stacks; each becomes `Removed` and is never touched again. (A
    /// condvar's waiting count keeps such a node: it only makes the
    /// condvar's next notifies take the queue lock.)
    fn skip_lost(&mut self) {
        while !self.head.is_null() {
            // SAFETY: it is queued, so alive (a lost fiber's stack is
            // never freed); we hold the lock.
            let node = unsafe { &*self.head };
            // SAFETY: under the queue lock (module rules).
            let lost = node
                .waiter
                .with(|w| unsafe { (*w).as_ref().is_some_and(Waiter::is_lost) });
            if !lost {
                return;
            }
            self.detach(node);
            drop(node.complete(Status::Removed));
        }
    }

    /// Take the first node off the queue and complete it as `status`.
    pub(crate) fn pop_front(&mut self, status: Status) -> Option<Option<Waiter>> {
        self.skip_lost();
        if self.head.is_null() {
            return None;
        }
        // SAFETY: it is queued, so alive; we hold the lock.
        let node = unsafe { &*self.head };
        self.detach(node);
        Some(node.complete(status))
    }

    /// Complete every queued node as `status`; returns their waiters.
    pub(crate) fn drain(&mut self, status: Status) -> Vec<Waiter> {
        let mut wakes = Vec::new();
        while let Some(w) = self.pop_front(status) {
            wakes.extend(w);
        }
        wakes
    }

    /// Unlink `node` if it is still waiting (owner, under the lock); the
    /// node becomes `Removed`. Returns the status it had.
    pub(crate) fn unlink(&mut self, node: &mut Node) -> Status {
        node.queued = false;
        let status = node.status();
        if status == Status::Waiting {
            // Waiting means queued: only this owner or a waker (which sets
            // another status) takes a node out.
            self.detach(node);
            node.waiter.with_mut(|w| {
                // SAFETY: under the lock, and the node is no longer queued.
                unsafe { *w = None }
            });
            node.set_status(Status::Removed);
        }
        status
    }

    /// Wake every waiter in `wakes` (after the lock is released).
    /// The records are consumed: each frame reference moves into the run
    /// queue (no clone and drop per wake).
    pub(crate) fn wake_all(wakes: impl IntoIterator<Item = Waiter>) {
        for w in wakes {
            w.wake();
        }
    }
}
