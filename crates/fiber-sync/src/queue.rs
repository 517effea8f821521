//! The waiter queue every primitive shares: nodes on their owners' stacks,
//! linked by pointer into a FIFO under the primitive's small queue lock.
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
use std::collections::VecDeque;

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
}

impl Node {
    pub(crate) fn new(arg: usize) -> Node {
        Node {
            waiter: UnsafeCell::new(None),
            status: UnsafeCell::new(Status::Idle),
            since: UnsafeCell::new(Since::default()),
            arg,
            queued: false,
        }
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

/// A queued node pointer.
#[derive(Debug)]
struct NodePtr(*const Node);

// SAFETY: the pointee is only touched under the queue lock and its owner
// keeps it alive while it is queued (module rules).
unsafe impl Send for NodePtr {}

/// The FIFO of waiting nodes. Lives inside a `SpinLock`; every method runs
/// with that lock held.
#[derive(Debug, Default)]
pub(crate) struct WaitQueue {
    nodes: VecDeque<NodePtr>,
}

impl WaitQueue {
    #[cfg(not(loom))]
    pub(crate) const fn new() -> WaitQueue {
        WaitQueue { nodes: VecDeque::new() }
    }

    #[cfg(loom)]
    pub(crate) fn new() -> WaitQueue {
        WaitQueue { nodes: VecDeque::new() }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.nodes.is_empty()
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
        let ptr = NodePtr(node);
        if front {
            self.nodes.push_front(ptr);
        } else {
            self.nodes.push_back(ptr);
        }
    }

    /// Was `node` queued before (woken once, lost the race)? Owner only.
    pub(crate) fn is_requeue(node: &Node) -> bool {
        // SAFETY: under the queue lock (module rules).
        node.since.with(|s| unsafe { (*s).is_requeue() })
    }

    /// The first node. Under the lock, so the node is alive while queued.
    pub(crate) fn front(&self) -> Option<&Node> {
        // SAFETY: queued nodes are alive and only touched under the lock,
        // which the caller holds (`&self` borrows the locked queue).
        self.nodes.front().map(|p| unsafe { &*p.0 })
    }

    /// Take the first node off the queue and complete it as `status`.
    pub(crate) fn pop_front(&mut self, status: Status) -> Option<Option<Waiter>> {
        let ptr = self.nodes.pop_front()?;
        // SAFETY: it was queued, so alive; we hold the lock.
        let node = unsafe { &*ptr.0 };
        Some(node.complete(status))
    }

    /// Complete every queued node as `status`; returns their waiters.
    pub(crate) fn drain(&mut self, status: Status) -> Vec<Waiter> {
        let mut wakes = Vec::with_capacity(self.nodes.len());
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
            let me: *const Node = node;
            if let Some(i) = self.nodes.iter().position(|p| p.0 == me) {
                self.nodes.remove(i);
            }
            node.waiter.with_mut(|w| {
                // SAFETY: under the lock, and the node is no longer queued.
                unsafe { *w = None }
            });
            node.set_status(Status::Removed);
        }
        status
    }

    /// Wake every waiter in `wakes` (after the lock is released).
    pub(crate) fn wake_all(wakes: &[Waiter]) {
        for w in wakes {
            fiber_core::fiber_wake(w);
        }
    }
}
