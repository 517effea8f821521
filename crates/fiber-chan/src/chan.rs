//! The channel core: one lock per channel guarding the buffer, the close
//! state and the two wait queues. Waiting goes through fiber-core's
//! `fiber_wait` / `fiber_wake` only.
//!
//! # Wait nodes
//!
//! A blocked operation owns a [`Node`] on its own stack (the `Io` of the
//! wait). While it waits, the channel's queue holds a pointer to it. Every
//! access to a queued node happens under the channel lock, and the owner
//! unlinks its node under the lock before the node goes away (`unpublish`,
//! or the node's `Drop` when a fiber is unwound at shutdown), so no pointer
//! in a queue ever dangles.
//!
//! # Linearization points (spec 5)
//!
//! * Close: `closed = true` under the lock (`Chan::close`).
//! * Send admission: a claimed receiver node, a buffer slot taken, or a
//!   sender node queued, each under the lock while not closed.
//! * Receive admission: a buffer pop, a claimed sender node, or a receiver
//!   node queued while not closed.
//!
//! A claim of a node that belongs to a select first wins the select's group
//! (one CAS) and skips nodes whose select already has a winner.

use crate::sync::{lock, AtomicUsize, Mutex, Ordering, UnsafeCell};
use fiber_core::{fiber_wait, fiber_wake, Publish, WaitOptions, WaitResult, Waitable, Waiter};
use std::collections::VecDeque;
use std::time::Instant;

/// What happened to a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NodeState {
    /// Not queued.
    Idle,
    /// Queued, waiting for a peer.
    Waiting,
    /// A peer completed the operation (value handed over).
    Done,
    /// The channel closed (or lost its peers) while it waited.
    Closed,
}

/// The group of a select: the first claim wins.
#[derive(Debug)]
pub(crate) struct SelectGroup {
    winner: AtomicUsize,
}

const NO_WINNER: usize = usize::MAX;

impl SelectGroup {
    pub(crate) fn new() -> SelectGroup {
        SelectGroup {
            winner: AtomicUsize::new(NO_WINNER),
        }
    }

    /// Try to make `index` the winner. AcqRel: the winning claim orders the
    /// peer's transfer before the selecting fiber reads it (it reads under
    /// the channel lock anyway); losers see the winner.
    pub(crate) fn try_win(&self, index: usize) -> bool {
        self.winner
            .compare_exchange(NO_WINNER, index, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    pub(crate) fn winner(&self) -> Option<usize> {
        match self.winner.load(Ordering::Acquire) {
            NO_WINNER => None,
            w => Some(w),
        }
    }

    pub(crate) fn reset(&self) {
        self.winner.store(NO_WINNER, Ordering::Release);
    }
}

/// Which queue a select's node goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Recv,
    Send,
}

/// Outcome of registering a select's node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reg {
    /// Queued; a peer may complete it later.
    Queued,
    /// Completed now (this select won).
    Completed(WaitResult),
    /// Another operation of the same select already won.
    Lost,
    /// Won the select but nothing was claimable after all: retry.
    Retry,
}

/// A waiting operation (on its owner's stack).
pub(crate) struct Node<T> {
    waiter: UnsafeCell<Option<Waiter>>,
    state: UnsafeCell<NodeState>,
    /// Send: the value to hand over. Receive: where the value arrives.
    slot: UnsafeCell<Option<T>>,
    /// A send node of a select that only waits for readiness (no value).
    probe: bool,
    /// The select this node belongs to, and its index there.
    select: Option<(*const SelectGroup, usize)>,
    /// The channel the node may be queued in (for unlinking on drop).
    chan: *const Chan<T>,
    /// Owner-only: queued by `publish` and not yet unlinked by `unpublish`.
    queued: std::cell::Cell<bool>,
}

impl<T> Node<T> {
    pub(crate) fn new(chan: &Chan<T>, value: Option<T>) -> Node<T> {
        Node {
            waiter: UnsafeCell::new(None),
            state: UnsafeCell::new(NodeState::Idle),
            slot: UnsafeCell::new(value),
            probe: false,
            select: None,
            chan,
            queued: std::cell::Cell::new(false),
        }
    }

    /// Could a peer claim this node (its select has no winner yet)?
    fn is_claimable(&self) -> bool {
        // SAFETY: the group outlives the select's queued nodes (the select
        // unlinks every node before it returns).
        self.select.is_none_or(|(g, _)| unsafe { &*g }.winner().is_none())
    }

    /// Win this node's select (plain nodes always win).
    fn win(&self) -> bool {
        // SAFETY: the group outlives the select's nodes.
        self.select.is_none_or(|(g, i)| unsafe { &*g }.try_win(i))
    }

    /// Under the channel lock, by the owner: queue this node in `queue`.
    fn enqueue(&mut self, queue: &mut VecDeque<NodeRef<T>>, waiter: &Waiter) {
        // SAFETY: the node is ours (`&mut`) and not yet queued.
        self.waiter.with_mut(|w| unsafe { *w = Some(waiter.clone()) });
        self.set_state(NodeState::Waiting);
        self.queued.set(true);
        queue.push_back(NodeRef(self));
    }

    pub(crate) fn for_select(
        chan: &Chan<T>,
        value: Option<T>,
        probe: bool,
        group: &SelectGroup,
        index: usize,
    ) -> Node<T> {
        Node {
            waiter: UnsafeCell::new(None),
            state: UnsafeCell::new(NodeState::Idle),
            slot: UnsafeCell::new(value),
            probe,
            select: Some((group, index)),
            chan,
            queued: std::cell::Cell::new(false),
        }
    }

    /// The value slot, for the owner once the node is not queued.
    pub(crate) fn take_value(&mut self) -> Option<T> {
        self.slot.with_mut(|s| {
            // SAFETY: `&mut self` and the node is not queued (callers only
            // take after `unpublish` or before `publish`), so no peer can
            // touch it.
            unsafe { (*s).take() }
        })
    }

    pub(crate) fn put_value(&mut self, value: T) {
        // SAFETY: as in `take_value`.
        self.slot.with_mut(|s| unsafe { *s = Some(value) });
    }

    /// Under the channel lock: the node's state.
    fn state(&self) -> NodeState {
        // SAFETY: called with the channel lock held, which guards queued
        // nodes' fields (module docs).
        self.state.with(|s| unsafe { *s })
    }

    fn set_state(&self, state: NodeState) {
        // SAFETY: as in `state`.
        self.state.with_mut(|s| unsafe { *s = state })
    }

    fn waiter(&self) -> Option<Waiter> {
        // SAFETY: as in `state`.
        self.waiter.with(|w| unsafe { (*w).clone() })
    }
}

impl<T> Node<T> {
    /// Under the channel lock: remove from both queues if still waiting.
    fn unlink(inner: &mut Inner<T>, node: &Node<T>) {
        node.queued.set(false);
        if node.state() == NodeState::Waiting {
            let me: *const Node<T> = node;
            inner.recvq.retain(|n| n.0 != me);
            inner.sendq.retain(|n| n.0 != me);
            node.set_state(NodeState::Idle);
        }
    }
}

impl<T> Drop for Node<T> {
    fn drop(&mut self) {
        // A node can only be queued while its owner waits; if the owner is
        // unwound mid-wait (shutdown), unlink it here.
        if !self.queued.get() {
            return;
        }
        // SAFETY: `chan` points to the channel this node was made for; the
        // owner holds a handle (Sender/Receiver) to it for the node's life.
        let chan = unsafe { &*self.chan };
        let mut inner = lock(&chan.inner);
        Self::unlink(&mut inner, self);
    }
}

/// A queued node pointer.
struct NodeRef<T>(*const Node<T>);

// SAFETY: the pointee is only touched under the channel lock, and the owner
// keeps it alive while queued (module docs); `T: Send` because the value
// moves between threads through it.
unsafe impl<T: Send> Send for NodeRef<T> {}

impl<T> NodeRef<T> {
    /// # Safety
    ///
    /// The caller holds the channel lock (the node is queued, so alive).
    unsafe fn get(&self) -> &Node<T> {
        // SAFETY: see the function's contract.
        unsafe { &*self.0 }
    }
}

struct Inner<T> {
    buf: VecDeque<T>,
    closed: bool,
    receivers_gone: bool,
    recvq: VecDeque<NodeRef<T>>,
    sendq: VecDeque<NodeRef<T>>,
}

/// Pop the first claimable node (skipping nodes whose select already won).
fn pop_claim<T>(queue: &mut VecDeque<NodeRef<T>>) -> Option<NodeRef<T>> {
    while let Some(node) = queue.pop_front() {
        // SAFETY: we hold the channel lock (every caller does).
        let n = unsafe { node.get() };
        if let Some((group, index)) = n.select {
            // SAFETY: the select's group outlives its queued nodes (the
            // select unlinks every node before it returns).
            if !unsafe { &*group }.try_win(index) {
                n.set_state(NodeState::Idle);
                continue;
            }
        }
        return Some(node);
    }
    None
}

/// The shared channel.
pub(crate) struct Chan<T> {
    inner: Mutex<Inner<T>>,
    cap: Option<usize>,
    pub(crate) senders: AtomicUsize,
    pub(crate) receivers: AtomicUsize,
}

// SAFETY: all interior state is behind the mutex (node pointers included,
// see `NodeRef`); values cross threads, hence `T: Send`.
unsafe impl<T: Send> Send for Chan<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for Chan<T> {}

/// Outcome of a non-blocking attempt.
pub(crate) enum Try<T> {
    Done(T),
    WouldBlock,
    Disconnected,
}

impl<T> Chan<T> {
    pub(crate) fn new(cap: Option<usize>) -> Chan<T> {
        Chan {
            inner: Mutex::new(Inner {
                buf: VecDeque::with_capacity(cap.unwrap_or(0).min(1024)),
                closed: false,
                receivers_gone: false,
                recvq: VecDeque::new(),
                sendq: VecDeque::new(),
            }),
            cap,
            senders: AtomicUsize::new(1),
            receivers: AtomicUsize::new(1),
        }
    }

    pub(crate) fn capacity(&self) -> Option<usize> {
        self.cap
    }

    pub(crate) fn len(&self) -> usize {
        lock(&self.inner).buf.len()
    }

    /// Queued (receivers, senders), for tests and diagnostics.
    pub(crate) fn waiting(&self) -> (usize, usize) {
        let inner = lock(&self.inner);
        (inner.recvq.len(), inner.sendq.len())
    }

    pub(crate) fn is_closed(&self) -> bool {
        let inner = lock(&self.inner);
        inner.closed || inner.receivers_gone
    }

    /// Send without blocking; `Err(value)` with why.
    pub(crate) fn try_send(&self, value: T) -> Result<(), (T, bool)> {
        let mut inner = lock(&self.inner);
        match self.send_locked(&mut inner, value) {
            Ok(wake) => {
                drop(inner);
                if let Some(w) = wake {
                    fiber_wake(&w);
                }
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// The send fast path under the lock. `Err((value, disconnected))`.
    fn send_locked(&self, inner: &mut Inner<T>, value: T) -> Result<Option<Waiter>, (T, bool)> {
        if inner.closed || inner.receivers_gone {
            return Err((value, true));
        }
        // Rendezvous first: hand the value to a waiting receiver.
        while let Some(node) = pop_claim(&mut inner.recvq) {
            // SAFETY: claimed under the lock; the node is alive while queued.
            let node = unsafe { node.get() };
            node.set_state(NodeState::Done);
            if node.probe {
                // A select waiting for receive readiness (`Select::ready`):
                // tell it, and keep looking for a real receiver.
                if let Some(w) = node.waiter() {
                    fiber_wake(&w);
                }
                continue;
            }
            // SAFETY: as above; the lock guards the slot.
            node.slot.with_mut(|s| unsafe { *s = Some(value) });
            return Ok(node.waiter());
        }
        if self.cap.is_none_or(|cap| inner.buf.len() < cap) {
            inner.buf.push_back(value);
            return Ok(None);
        }
        Err((value, false))
    }

    /// Receive without blocking.
    pub(crate) fn try_recv(&self) -> Try<T> {
        let mut inner = lock(&self.inner);
        let (result, wake) = self.recv_locked(&mut inner);
        drop(inner);
        if let Some(w) = wake {
            fiber_wake(&w);
        }
        result
    }

    fn recv_locked(&self, inner: &mut Inner<T>) -> (Try<T>, Option<Waiter>) {
        if let Some(value) = inner.buf.pop_front() {
            // Room appeared: admit the first parked sender into the buffer.
            let wake = self.admit_sender(inner);
            return (Try::Done(value), wake);
        }
        // Rendezvous: take straight from a parked sender.
        while let Some(node) = pop_claim(&mut inner.sendq) {
            // SAFETY: claimed under the lock.
            let node = unsafe { node.get() };
            node.set_state(NodeState::Done);
            if node.probe {
                // A select waiting for send readiness: tell it, keep looking.
                if let Some(w) = node.waiter() {
                    fiber_wake(&w);
                }
                continue;
            }
            // SAFETY: as above; the lock guards the slot.
            let value = node
                .slot
                .with_mut(|s| unsafe { (*s).take() })
                .expect("a parked sender holds its value");
            return (Try::Done(value), node.waiter());
        }
        if inner.closed {
            return (Try::Disconnected, None);
        }
        (Try::WouldBlock, None)
    }

    /// Move the first parked sender's value into the buffer (after a pop).
    fn admit_sender(&self, inner: &mut Inner<T>) -> Option<Waiter> {
        if let Some(node) = pop_claim(&mut inner.sendq) {
            // SAFETY: claimed under the lock.
            let node = unsafe { node.get() };
            node.set_state(NodeState::Done);
            if !node.probe {
                // SAFETY: as above.
                let value = node
                    .slot
                    .with_mut(|s| unsafe { (*s).take() })
                    .expect("a parked sender holds its value");
                inner.buf.push_back(value);
            }
            return node.waiter();
        }
        None
    }

    /// Close (explicit, or the last sender left). Wakes every parked
    /// receiver (they have nothing to take, or they would not wait) exactly
    /// once; parked senders stay queued: they were admitted and their values
    /// are still delivered. Returns `false` if already closed.
    pub(crate) fn close(&self) -> bool {
        let wakes: Vec<Waiter> = {
            let mut inner = lock(&self.inner);
            if inner.closed {
                return false;
            }
            inner.closed = true;
            let mut wakes = Vec::new();
            while let Some(node) = pop_claim(&mut inner.recvq) {
                // SAFETY: claimed under the lock.
                let node = unsafe { node.get() };
                node.set_state(NodeState::Closed);
                wakes.extend(node.waiter());
            }
            // Select probes for send readiness learn of the close too.
            let mut keep = VecDeque::new();
            while let Some(node) = inner.sendq.pop_front() {
                // SAFETY: under the lock.
                let n = unsafe { node.get() };
                if n.probe {
                    // SAFETY: the group outlives its queued nodes.
                    if n.select.is_none_or(|(g, i)| unsafe { &*g }.try_win(i)) {
                        n.set_state(NodeState::Closed);
                        wakes.extend(n.waiter());
                    } else {
                        n.set_state(NodeState::Idle);
                    }
                } else {
                    keep.push_back(node);
                }
            }
            inner.sendq = keep;
            wakes
        };
        for w in &wakes {
            fiber_wake(w);
        }
        true
    }

    /// The last receiver left: no value can be delivered any more. Parked
    /// senders get their values back; buffered values are dropped.
    pub(crate) fn disconnect_receivers(&self) {
        let (wakes, dropped) = {
            let mut inner = lock(&self.inner);
            inner.receivers_gone = true;
            inner.closed = true;
            let mut wakes = Vec::new();
            while let Some(node) = pop_claim(&mut inner.sendq) {
                // SAFETY: claimed under the lock.
                let node = unsafe { node.get() };
                node.set_state(NodeState::Closed);
                wakes.extend(node.waiter());
            }
            while let Some(node) = pop_claim(&mut inner.recvq) {
                // SAFETY: claimed under the lock.
                let node = unsafe { node.get() };
                node.set_state(NodeState::Closed);
                wakes.extend(node.waiter());
            }
            (wakes, std::mem::take(&mut inner.buf))
        };
        drop(dropped);
        for w in &wakes {
            fiber_wake(w);
        }
    }

    /// Blocking send with an optional deadline. `Err((value, disconnected))`.
    pub(crate) fn send(&self, value: T, deadline: Option<Instant>) -> Result<(), (T, bool)> {
        let mut node = Node::new(self, Some(value));
        let result = fiber_wait(&SendWait(self), &mut node, WaitOptions::new().deadline(deadline));
        match result {
            WaitResult::Ok => Ok(()),
            WaitResult::Closed => Err((node.take_value().expect("an unsent value stays in the node"), true)),
            WaitResult::TimedOut | WaitResult::Cancelled => {
                Err((node.take_value().expect("an unsent value stays in the node"), false))
            }
        }
    }

    /// Blocking receive with an optional deadline. `Err(disconnected)`.
    pub(crate) fn recv(&self, deadline: Option<Instant>) -> Result<T, bool> {
        let mut node = Node::new(self, None);
        match fiber_wait(&RecvWait(self), &mut node, WaitOptions::new().deadline(deadline)) {
            WaitResult::Ok => Ok(node.take_value().expect("a completed receive holds its value")),
            WaitResult::Closed => Err(true),
            WaitResult::TimedOut | WaitResult::Cancelled => Err(false),
        }
    }

    /// A select's receive: complete now (after winning the select), queue
    /// the node, or report that the select was already won elsewhere.
    pub(crate) fn register_recv(&self, node: &mut Node<T>, waiter: &Waiter) -> Reg {
        self.register(node, waiter, Side::Recv)
    }

    /// A select's send (a value, or a readiness probe): as `register_recv`.
    pub(crate) fn register_send(&self, node: &mut Node<T>, waiter: &Waiter) -> Reg {
        self.register(node, waiter, Side::Send)
    }

    /// Shared by both sides: if the operation is ready, win the select and
    /// complete it (a probe completes without a transfer); otherwise queue.
    fn register(&self, node: &mut Node<T>, waiter: &Waiter, side: Side) -> Reg {
        let mut inner = lock(&self.inner);
        let ready = match side {
            Side::Recv => Self::recv_ready(&inner),
            Side::Send => self.send_ready(&inner),
        };
        if !ready {
            let queue = match side {
                Side::Recv => &mut inner.recvq,
                Side::Send => &mut inner.sendq,
            };
            node.enqueue(queue, waiter);
            return Reg::Queued;
        }
        if !node.win() {
            return Reg::Lost;
        }
        if node.probe && side == Side::Recv {
            // Readiness only (`Select::ready`): take nothing. (Send probes
            // complete in `publish_send`, which also checks readiness.)
            return Reg::Completed(WaitResult::Ok);
        }
        let published = match side {
            Side::Recv => self.publish_recv(&mut inner, node, waiter),
            Side::Send => self.publish_send(&mut inner, node, waiter),
        };
        match published {
            Some(result) => Reg::Completed(result),
            None => {
                // Nothing claimable after all (a racing select took it):
                // undo and let the select retry.
                Node::unlink(&mut inner, node);
                Reg::Retry
            }
        }
    }

    fn recv_ready(inner: &Inner<T>) -> bool {
        !inner.buf.is_empty()
            || inner.closed
            || inner.sendq.iter().any(|n| {
                // SAFETY: under the lock (every caller holds it).
                let n = unsafe { n.get() };
                !n.probe && n.is_claimable()
            })
    }

    /// Would a receive complete (or fail as disconnected) right now?
    pub(crate) fn is_recv_ready(&self) -> bool {
        Self::recv_ready(&lock(&self.inner))
    }

    /// Would a send complete (or fail as disconnected) right now?
    pub(crate) fn is_send_ready(&self) -> bool {
        self.send_ready(&lock(&self.inner))
    }

    fn send_ready(&self, inner: &Inner<T>) -> bool {
        inner.closed
            || inner.receivers_gone
            || self.cap.is_none_or(|cap| inner.buf.len() < cap)
            || inner.recvq.iter().any(|n| {
                // SAFETY: under the lock (every caller holds it).
                let n = unsafe { n.get() };
                !n.probe && n.is_claimable()
            })
    }

    /// Blocking-operation publish (not a select): complete now or queue.
    fn register_plain_recv(&self, node: &mut Node<T>, waiter: &Waiter) -> Option<WaitResult> {
        let mut inner = lock(&self.inner);
        self.publish_recv(&mut inner, node, waiter)
    }

    fn register_plain_send(&self, node: &mut Node<T>, waiter: &Waiter) -> Option<WaitResult> {
        let mut inner = lock(&self.inner);
        self.publish_send(&mut inner, node, waiter)
    }

    /// Unlink `node` if still queued; report a completion that raced.
    pub(crate) fn unregister(&self, node: &Node<T>) -> Option<WaitResult> {
        let mut inner = lock(&self.inner);
        Self::unpublish_locked(&mut inner, node)
    }

    fn publish_recv(&self, inner: &mut Inner<T>, node: &mut Node<T>, waiter: &Waiter) -> Option<WaitResult> {
        let (result, wake) = self.recv_locked(inner);
        if let Some(w) = wake {
            fiber_wake(&w);
        }
        match result {
            Try::Done(value) => {
                node.put_value(value);
                Some(WaitResult::Ok)
            }
            Try::Disconnected => Some(WaitResult::Closed),
            Try::WouldBlock => {
                node.enqueue(&mut inner.recvq, waiter);
                None
            }
        }
    }

    fn publish_send(&self, inner: &mut Inner<T>, node: &mut Node<T>, waiter: &Waiter) -> Option<WaitResult> {
        if inner.closed || inner.receivers_gone {
            return Some(WaitResult::Closed);
        }
        if node.probe {
            let receiver_waits = inner.recvq.iter().any(|n| {
                // SAFETY: under the lock (every caller holds it).
                let n = unsafe { n.get() };
                !n.probe && n.is_claimable()
            });
            if receiver_waits || self.cap.is_none_or(|cap| inner.buf.len() < cap) {
                return Some(WaitResult::Ok);
            }
        } else {
            let value = node.take_value().expect("a send node holds its value");
            match self.send_locked(inner, value) {
                Ok(wake) => {
                    if let Some(w) = wake {
                        fiber_wake(&w);
                    }
                    return Some(WaitResult::Ok);
                }
                Err((value, disconnected)) => {
                    node.put_value(value);
                    if disconnected {
                        return Some(WaitResult::Closed);
                    }
                }
            }
        }
        node.enqueue(&mut inner.sendq, waiter);
        None
    }

    fn unpublish_locked(inner: &mut Inner<T>, node: &Node<T>) -> Option<WaitResult> {
        node.queued.set(false);
        match node.state() {
            NodeState::Waiting => {
                Node::unlink(inner, node);
                None
            }
            NodeState::Done => {
                node.set_state(NodeState::Idle);
                Some(WaitResult::Ok)
            }
            NodeState::Closed => {
                node.set_state(NodeState::Idle);
                Some(WaitResult::Closed)
            }
            NodeState::Idle => None,
        }
    }
}

/// A blocking send as a fiber-core waitable.
struct SendWait<'a, T>(&'a Chan<T>);

impl<T> Waitable for SendWait<'_, T> {
    type Io = Node<T>;

    fn try_complete(&self, node: &mut Node<T>) -> Option<WaitResult> {
        let value = node.take_value()?;
        match self.0.try_send(value) {
            Ok(()) => Some(WaitResult::Ok),
            Err((value, disconnected)) => {
                node.put_value(value);
                disconnected.then_some(WaitResult::Closed)
            }
        }
    }

    fn publish(&self, waiter: &Waiter, node: &mut Node<T>) -> Publish {
        match self.0.register_plain_send(node, waiter) {
            Some(result) => Publish::Ready(result),
            None => Publish::Published,
        }
    }

    fn unpublish(&self, _: &Waiter, node: &mut Node<T>) -> Option<WaitResult> {
        self.0.unregister(node)
    }
}

/// A blocking receive as a fiber-core waitable.
struct RecvWait<'a, T>(&'a Chan<T>);

impl<T> Waitable for RecvWait<'_, T> {
    type Io = Node<T>;

    fn try_complete(&self, node: &mut Node<T>) -> Option<WaitResult> {
        match self.0.try_recv() {
            Try::Done(value) => {
                node.put_value(value);
                Some(WaitResult::Ok)
            }
            Try::Disconnected => Some(WaitResult::Closed),
            Try::WouldBlock => None,
        }
    }

    fn publish(&self, waiter: &Waiter, node: &mut Node<T>) -> Publish {
        match self.0.register_plain_recv(node, waiter) {
            Some(result) => Publish::Ready(result),
            None => Publish::Published,
        }
    }

    fn unpublish(&self, _: &Waiter, node: &mut Node<T>) -> Option<WaitResult> {
        self.0.unregister(node)
    }
}
