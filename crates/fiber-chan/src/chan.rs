//! The channel core: one lock per channel guarding the buffer, the close
//! state and the two wait queues. Waiting goes through fiber-core's
//! `fiber_wait` / `fiber_wake` only (`Waiter::wake` is `fiber_wake` by value).
//!
//! # Wait nodes
//!
//! A blocked operation owns a [`Node`] on its own stack (the `Io` of the
//! wait). While it waits, the channel's queue holds a pointer to it. Every
//! access to a queued node happens under the channel lock, and the owner
//! unlinks its node under the lock before the node goes away (`unpublish`,
//! or the node's `Drop` when a fiber is unwound at shutdown), so no pointer
//! in a queue ever dangles. A node a select's send arm has *reserved*
//! (state `Reserved`, popped from the queue) stays alive because its owner
//! does not leave `unregister` until the reservation is completed or
//! released.
//!
//! # Lock discipline
//!
//! Wakes are collected under the lock into a [`Wakes`] and flushed after
//! the lock is released (collect, unlock, wake); debug builds assert that no
//! wake is flushed and no wait starts while the thread holds a channel lock.
//!
//! # Linearization points (spec 5)
//!
//! * Close: `closed = true` under the lock (`Chan::close`).
//! * Send admission: a claimed receiver node, a buffer slot taken (or
//!   reserved by a select's send arm), or a sender node queued, each under
//!   the lock while not closed.
//! * Receive admission: a buffer pop, a claimed sender node, or a receiver
//!   node queued while not closed.
//!
//! A claim of a node that belongs to a select first wins the select's group
//! (one CAS) and skips nodes whose select already has a winner; a select
//! never claims a node of its own group.

use crate::ring::{Claim, Head, NoRoom, Pop, Ring};
use crate::sync::{backoff, depth, fence, lock, spin, AtomicU8, AtomicUsize, Mutex, MutexGuard, Ordering, UnsafeCell};
use fiber_core::{fiber_wait, Interrupt, Publish, WaitOptions, WaitResult, Waitable, Waiter};
use std::collections::VecDeque;
use std::time::Instant;

/// What happened to a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum NodeState {
    /// Not queued.
    Idle,
    /// Queued, waiting for a peer.
    Waiting,
    /// A peer completed the operation (value handed over).
    Done,
    /// The channel closed (or lost its peers) while it waited.
    Closed,
    /// A receiver node claimed by a select's send arm, which is evaluating
    /// the value it will hand over: out of the queue, committed.
    Reserved,
}

impl NodeState {
    #[inline]
    fn from_u8(bits: u8) -> NodeState {
        match bits {
            0 => NodeState::Idle,
            1 => NodeState::Waiting,
            2 => NodeState::Done,
            3 => NodeState::Closed,
            4 => NodeState::Reserved,
            other => unreachable!("a node state word holds {other}"),
        }
    }
}

/// The group of a select: the first claim wins.
#[derive(Debug)]
pub(crate) struct SelectGroup {
    winner: AtomicUsize,
}

const NO_WINNER: usize = usize::MAX;

/// How long a non-blocking receive that woke a select's parked send arm
/// waits, as a parked receiver, for that select to run and hand its value
/// over (see `Chan::try_recv`). Long enough for the woken fiber to be
/// scheduled on a busy runtime; paid in full only when the select then
/// takes another of its arms.
const SELECT_SEND_WAIT: std::time::Duration = std::time::Duration::from_millis(10);

impl SelectGroup {
    pub(crate) fn new() -> SelectGroup {
        SelectGroup {
            winner: AtomicUsize::new(NO_WINNER),
        }
    }

    /// Try to make `index` the winner. AcqRel: pairs with the Acquire load
    /// in `winner` (the selecting party reads the winner after unlinking;
    /// the node's state itself is read under the channel lock).
    pub(crate) fn try_win(&self, index: usize) -> bool {
        self.winner
            .compare_exchange(NO_WINNER, index, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Acquire: pairs with the AcqRel CAS in `try_win`.
    pub(crate) fn winner(&self) -> Option<usize> {
        match self.winner.load(Ordering::Acquire) {
            NO_WINNER => None,
            w => Some(w),
        }
    }

    /// Only while none of the group's nodes is queued. Release: pairs with
    /// the Acquire of the next round's CAS.
    pub(crate) fn reset(&self) {
        self.winner.store(NO_WINNER, Ordering::Release);
    }
}

/// Wakes collected under a channel lock, flushed after it is released (on
/// `flush` or drop; declare it before the guard so it drops after).
pub(crate) struct Wakes {
    one: Option<Waiter>,
    more: Vec<Waiter>,
}

impl Wakes {
    pub(crate) fn new() -> Wakes {
        Wakes {
            one: None,
            more: Vec::new(),
        }
    }

    fn push(&mut self, waiter: Option<Waiter>) {
        let Some(w) = waiter else { return };
        if self.one.is_none() {
            self.one = Some(w);
        } else {
            self.more.push(w);
        }
    }

    fn count(&self) -> usize {
        usize::from(self.one.is_some()) + self.more.len()
    }

    #[inline]
    pub(crate) fn flush(&mut self) {
        if let Some(w) = self.one.take() {
            Self::flush_all(w, &mut self.more);
        }
    }

    fn flush_all(first: Waiter, more: &mut Vec<Waiter>) {
        depth::assert_unlocked("fiber-chan: a wake flush");
        // By value: each record's frame reference moves into the run queue.
        first.wake();
        if !more.is_empty() {
            for w in more.drain(..) {
                w.wake();
            }
        }
    }
}

impl Drop for Wakes {
    #[inline]
    fn drop(&mut self) {
        self.flush();
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
    /// A `NodeState`. Written under the channel lock, except by the owner
    /// once the wait is over (`finish_unlocked`), and read without the lock
    /// only by the owner, to end its wait without locking (see
    /// `Node::complete`).
    state: AtomicU8,
    /// Send: the value to hand over. Receive: where the value arrives.
    slot: UnsafeCell<Option<T>>,
    /// A node that only waits for readiness (a select's send arm, or
    /// `Select::ready`): no value moves through it.
    probe: bool,
    /// A `Select::ready` probe: it reports readiness and never transfers
    /// (unlike a select's send arm, which sends once it wakes).
    ready_only: bool,
    /// The select this node belongs to, and its index there.
    select: Option<(*const SelectGroup, usize)>,
    /// The channel the node may be queued in (for unlinking on drop).
    chan: *const Chan<T>,
    /// Owner-only: queued by `publish` and not yet unlinked by `unpublish`.
    queued: std::cell::Cell<bool>,
    /// Its place in a wait queue (under the channel lock).
    link: UnsafeCell<Link<T>>,
    /// Wakers and neighbours reach a queued node through raw pointers
    /// while its owner holds `&mut` to it (the wait's `Io`). `!Unpin`
    /// tells the compiler that such a `&mut` is not the only way in (no
    /// `noalias`), as intrusive lists in tokio and the standard library
    /// rely on.
    _pinned: std::marker::PhantomPinned,
}

impl<T> Node<T> {
    /// A blocking operation's node, its value slot empty.
    pub(crate) fn new(chan: &Chan<T>) -> Node<T> {
        Node {
            waiter: UnsafeCell::new(None),
            state: AtomicU8::new(NodeState::Idle as u8),
            slot: UnsafeCell::new(None),
            probe: false,
            ready_only: false,
            select: None,
            chan,
            queued: std::cell::Cell::new(false),
            link: UnsafeCell::new(Link::UNLINKED),
            _pinned: std::marker::PhantomPinned,
        }
    }

    /// A select's node: `probe` for a send arm or a readiness probe,
    /// `ready_only` for a `Select::ready` probe (which is also a probe).
    pub(crate) fn for_select(
        chan: &Chan<T>,
        probe: bool,
        ready_only: bool,
        group: &SelectGroup,
        index: usize,
    ) -> Node<T> {
        debug_assert!(probe || !ready_only, "a readiness node is a probe");
        Node {
            waiter: UnsafeCell::new(None),
            state: AtomicU8::new(NodeState::Idle as u8),
            slot: UnsafeCell::new(None),
            probe,
            ready_only,
            select: Some((group, index)),
            chan,
            queued: std::cell::Cell::new(false),
            link: UnsafeCell::new(Link::UNLINKED),
            _pinned: std::marker::PhantomPinned,
        }
    }

    /// Does this node only wait for readiness?
    pub(crate) fn is_probe(&self) -> bool {
        self.probe
    }

    fn group(&self) -> *const SelectGroup {
        self.select.map_or(std::ptr::null(), |(g, _)| g)
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
    fn enqueue(&mut self, queue: &mut WaitQueue<T>, waiter: &Waiter) {
        // SAFETY: the node is ours (`&mut`) and not yet queued.
        self.waiter.with_mut(|w| unsafe { *w = Some(waiter.clone()) });
        self.set_state(NodeState::Waiting);
        self.queued.set(true);
        queue.push_back(self);
    }

    /// Under the channel lock: the node's links.
    fn link(&self) -> Link<T> {
        // SAFETY: links are read and written only under the channel lock.
        self.link.with(|l| unsafe { *l })
    }

    /// Under the channel lock: set the node's links.
    fn set_link(&self, link: Link<T>) {
        // SAFETY: as in `link`.
        self.link.with_mut(|l| unsafe { *l = link });
    }

    /// The value slot, for the owner once the node is not queued (or
    /// before it is): `f` moves a value in or out in place.
    pub(crate) fn with_value<R>(&mut self, f: impl FnOnce(&mut Option<T>) -> R) -> R {
        // SAFETY: `&mut self` and the node is not queued (callers only
        // touch it after `unpublish` or before `publish`), so no peer can.
        self.slot.with_mut(|s| f(unsafe { &mut *s }))
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

    /// Under the channel lock: the node's state.
    fn state(&self) -> NodeState {
        // Relaxed: the channel lock orders every write made under it.
        NodeState::from_u8(self.state.load(Ordering::Relaxed))
    }

    /// Under the channel lock: a state that does not end the wait (Done
    /// and Closed go through `complete`).
    fn set_state(&self, state: NodeState) {
        debug_assert!(!matches!(state, NodeState::Done | NodeState::Closed));
        // Relaxed: the channel lock orders it for every reader but the
        // owner's lock-free look in `finish_unlocked`, which acts only on
        // Done and Closed.
        self.state.store(state as u8, Ordering::Relaxed);
    }

    /// Under the lock, by the party that took this node out of its queue
    /// (or completes its reservation): end the node's wait with `state`
    /// (Done or Closed) and return the record to wake its owner with.
    ///
    /// This store is that party's LAST access to the node: every other
    /// step (moving the value in or out, taking the waiter record) comes
    /// before it. The owner may see it without the lock
    /// (`finish_unlocked`), return from its wait and free the node at once.
    #[must_use]
    fn complete(&self, state: NodeState) -> Option<Waiter> {
        debug_assert!(matches!(state, NodeState::Done | NodeState::Closed));
        let waiter = self.take_waiter();
        // Release: pairs with the Acquire load in `finish_unlocked`; the
        // owner that sees the final state sees the value handed over (or
        // taken) and the record taken out.
        self.state.store(state as u8, Ordering::Release);
        waiter
    }

    /// By the owner after its wake, without the lock: if a peer completed
    /// the node (`complete`), the wait is over and nobody else touches the
    /// node any more; return the result. `None`: look under the lock.
    fn finish_unlocked(&self) -> Option<WaitResult> {
        // Acquire: pairs with the Release store in `complete`.
        let result = match NodeState::from_u8(self.state.load(Ordering::Acquire)) {
            NodeState::Done => WaitResult::Ok,
            NodeState::Closed => WaitResult::Closed,
            NodeState::Idle | NodeState::Waiting | NodeState::Reserved => return None,
        };
        self.queued.set(false);
        // Relaxed: owner-only now (the node is in no queue and no party
        // holds a reservation on it).
        self.state.store(NodeState::Idle as u8, Ordering::Relaxed);
        Some(result)
    }

    /// Under the lock, by the party that took this node out of its queue
    /// (or that completes its reservation): the record to wake it with.
    /// Moved out, not cloned: a node leaves the queue once per `publish`,
    /// and the next `enqueue` stores a fresh record.
    fn take_waiter(&self) -> Option<Waiter> {
        // SAFETY: as in `state`.
        self.waiter.with_mut(|w| unsafe { (*w).take() })
    }

    /// Under the lock: move the value out of `value` into this (claimed)
    /// receiver node and complete it; the record to wake its owner with.
    #[must_use]
    fn deliver(&self, value: &mut Option<T>) -> Option<Waiter> {
        debug_assert!(value.is_some(), "a delivery carries a value");
        self.with_claimed_slot(|slot| std::mem::swap(slot, value));
        self.complete(NodeState::Done)
    }

    /// Under the lock, on a claimed node (out of its queue, or reserved):
    /// its value slot. A receiver's owner reads the slot only after
    /// seeing `Done` (its Acquire in `finish_unlocked`, or under the
    /// lock); a sender's owner only once its wait is over.
    ///
    /// Values move between slots by `mem::swap` of the `Option`s, never
    /// by value through the call chain: a value of many KiB then costs
    /// the stack only its own copy (see `spec/chan.md`, "Large values").
    fn with_claimed_slot<R>(&self, f: impl FnOnce(&mut Option<T>) -> R) -> R {
        // SAFETY: the node is claimed and we hold the lock (see above).
        self.slot.with_mut(|s| f(unsafe { &mut *s }))
    }

    /// Under the lock: move the value of this (claimed) sender node into
    /// the empty `out`.
    fn take_sent(&self, out: &mut Option<T>) {
        self.with_claimed_slot(|slot| {
            assert!(slot.is_some(), "a parked sender holds its value");
            std::mem::swap(slot, out)
        });
    }
}

impl<T> Node<T> {
    /// Under the channel lock: remove from both queues if still waiting.
    fn unlink(inner: &mut Inner<T>, node: &Node<T>) {
        node.queued.set(false);
        if node.state() == NodeState::Waiting {
            // O(1): the node knows its queue and its neighbours.
            match node.link().queue {
                RECV_QUEUE => inner.recvq.remove(node),
                SEND_QUEUE => inner.sendq.remove(node),
                _ => {}
            }
            node.set_state(NodeState::Idle);
        }
    }
}

/// The end of a select send arm's reservation on a node whose owner is
/// being unwound (`Chan::wait_reservation_end`). The owner's record in the
/// node is replaced by this wait's, under the channel lock while the node
/// is still reserved, so the party that completes or gives back the
/// reservation (`complete_reservation`, `release_reservation`: both take
/// the node's record under that lock) wakes this wait.
#[cfg(not(loom))]
struct ReservationEnd<'a, T> {
    chan: &'a Chan<T>,
    node: &'a Node<T>,
}

#[cfg(not(loom))]
impl<T> ReservationEnd<'_, T> {
    /// Under the lock: has the reservation ended?
    fn ended(&self) -> Option<WaitResult> {
        (self.node.state() != NodeState::Reserved).then_some(WaitResult::Ok)
    }
}

#[cfg(not(loom))]
impl<T> Waitable for ReservationEnd<'_, T> {
    type Io = ();

    fn kind(&self) -> fiber_core::WaitKind {
        fiber_core::WaitKind::Handoff
    }

    fn try_complete(&self, _: &mut ()) -> Option<WaitResult> {
        let _inner = self.chan.lock();
        self.ended()
    }

    fn publish(&self, waiter: &Waiter, _: &mut ()) -> Publish {
        let replaced = {
            let _inner = self.chan.lock();
            if let Some(result) = self.ended() {
                return Publish::Ready(result);
            }
            // SAFETY: the node's record is read and written under the
            // channel lock (held), and a reserved node's record is taken
            // only by the reservation's holder, under it too.
            self.node.waiter.with_mut(|w| unsafe { (*w).replace(waiter.clone()) })
        };
        // The owner's old record (of the wait it was unwound from) is
        // dropped outside the lock.
        drop(replaced);
        Publish::Published
    }

    fn unpublish(&self, _: &Waiter, _: &mut ()) -> Option<WaitResult> {
        let _inner = self.chan.lock();
        self.ended()
    }
}

impl<T> Drop for Node<T> {
    fn drop(&mut self) {
        // A node can only be queued while its owner waits; if the owner is
        // unwound mid-wait (shutdown), unlink it here.
        if self.queued.get() {
            // SAFETY: `chan` points to the channel this node was made for;
            // the owner holds a handle (Sender/Receiver) to it for the
            // node's life.
            let chan = unsafe { &*self.chan };
            #[cfg(not(loom))]
            if fiber_core::in_fiber() {
                chan.wait_reservation_end(self);
            }
            let _ = chan.unregister(self, false);
        }
        // Under loom the node's end counts as a write of its cells (its
        // memory goes away with the owner's frame), so a peer that still
        // touches them after the owner could return is a reported race.
        #[cfg(loom)]
        {
            self.slot.with_mut(|_| ());
            self.waiter.with_mut(|_| ());
            self.link.with_mut(|_| ());
        }
    }
}

/// A queued node pointer.
struct NodeRef<T>(*const Node<T>);

impl<T> Clone for NodeRef<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for NodeRef<T> {}

/// No queue (`Link::queue`).
const NO_QUEUE: u8 = 0;
/// The receivers' queue.
const RECV_QUEUE: u8 = 1;
/// The senders' queue.
const SEND_QUEUE: u8 = 2;

/// A node's place in a [`WaitQueue`]: its neighbours and which queue holds
/// it. Read and written only under the channel lock.
struct Link<T> {
    prev: *const Node<T>,
    next: *const Node<T>,
    queue: u8,
}

impl<T> Clone for Link<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Link<T> {}

impl<T> Link<T> {
    const UNLINKED: Link<T> = Link {
        prev: std::ptr::null(),
        next: std::ptr::null(),
        queue: NO_QUEUE,
    };
}

/// A FIFO of parked nodes, linked through the nodes themselves: push, pop
/// and the unlink of any node (a cancelled or timed-out waiter leaving) are
/// O(1), so 1,000 receivers cancelled at once cost 1,000 steps, not a
/// scan each.
///
/// Every node in a queue is alive (its owner unlinks it under the lock
/// before the node goes away, module docs) and the queue is reachable only
/// through the channel lock, which every method's caller holds (`&mut
/// Inner`).
struct WaitQueue<T> {
    head: *const Node<T>,
    tail: *const Node<T>,
    len: usize,
    /// `RECV_QUEUE` or `SEND_QUEUE`, stamped into the links of its nodes.
    id: u8,
}

impl<T> WaitQueue<T> {
    const fn new(id: u8) -> WaitQueue<T> {
        WaitQueue {
            head: std::ptr::null(),
            tail: std::ptr::null(),
            len: 0,
            id,
        }
    }

    fn is_empty(&self) -> bool {
        self.head.is_null()
    }

    fn len(&self) -> usize {
        self.len
    }

    #[cfg(loom)]
    fn front(&self) -> Option<NodeRef<T>> {
        (!self.head.is_null()).then_some(NodeRef(self.head))
    }

    /// Queue `node` (alive, in no queue) at the back.
    fn push_back(&mut self, node: &Node<T>) {
        debug_assert_eq!(node.link().queue, NO_QUEUE, "a node is in one queue at a time");
        node.set_link(Link {
            prev: self.tail,
            next: std::ptr::null(),
            queue: self.id,
        });
        if self.tail.is_null() {
            self.head = node;
        } else {
            // SAFETY: the tail is a queued node, so alive (type docs).
            let tail = unsafe { &*self.tail };
            tail.set_link(Link {
                next: node,
                ..tail.link()
            });
        }
        self.tail = node;
        self.len += 1;
    }

    /// Put a node just popped from this queue back at the front.
    fn push_front(&mut self, node: NodeRef<T>) {
        // SAFETY: the caller popped it under the lock it still holds; its
        // owner waits until the node completes, so it is alive.
        let n = unsafe { node.get() };
        debug_assert_eq!(n.link().queue, NO_QUEUE, "a node is in one queue at a time");
        n.set_link(Link {
            prev: std::ptr::null(),
            next: self.head,
            queue: self.id,
        });
        if self.head.is_null() {
            self.tail = node.0;
        } else {
            // SAFETY: the head is a queued node, so alive.
            let head = unsafe { &*self.head };
            head.set_link(Link {
                prev: node.0,
                ..head.link()
            });
        }
        self.head = node.0;
        self.len += 1;
    }

    /// Unlink `node`, which is in this queue.
    fn remove(&mut self, node: &Node<T>) {
        let link = node.link();
        debug_assert_eq!(
            link.queue, self.id,
            "unlinking a node from a queue that does not hold it"
        );
        if link.prev.is_null() {
            self.head = link.next;
        } else {
            // SAFETY: a neighbour in the queue is a queued node, so alive.
            let prev = unsafe { &*link.prev };
            prev.set_link(Link {
                next: link.next,
                ..prev.link()
            });
        }
        if link.next.is_null() {
            self.tail = link.prev;
        } else {
            // SAFETY: as above.
            let next = unsafe { &*link.next };
            next.set_link(Link {
                prev: link.prev,
                ..next.link()
            });
        }
        node.set_link(Link::UNLINKED);
        self.len -= 1;
    }

    /// The queued nodes, front to back. The caller may unlink the node it
    /// was just given (the iterator has read its successor already), and
    /// no other.
    fn cursor(&self) -> Cursor<T> {
        Cursor { next: self.head }
    }

    fn iter(&self) -> impl Iterator<Item = NodeRef<T>> + '_ {
        let mut cursor = self.cursor();
        std::iter::from_fn(move || cursor.next())
    }
}

/// A walk over a [`WaitQueue`] (see `WaitQueue::cursor`).
struct Cursor<T> {
    next: *const Node<T>,
}

impl<T> Cursor<T> {
    fn next(&mut self) -> Option<NodeRef<T>> {
        if self.next.is_null() {
            return None;
        }
        let node = self.next;
        // SAFETY: a queued node is alive; the walk reads the successor
        // before handing the node out, so unlinking it does not break the
        // walk.
        self.next = unsafe { &*node }.link().next;
        Some(NodeRef(node))
    }
}

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

/// An unbounded channel's buffer keeps at least this many slots' capacity
/// however far it drains.
const BUF_KEEP: usize = 64;

/// Give back the memory of a burst as an unbounded channel's buffer
/// drains (crossbeam's list flavour frees each block once it is read;
/// a `VecDeque` keeps its largest capacity until dropped: 100,000 values
/// of 512 bytes, received, kept 50 MiB resident): below a quarter full,
/// the capacity halves. Each halving moves fewer values than the
/// receives since the capacity last changed, so a receive stays O(1)
/// amortized, and growing again takes a quarter of the capacity in sends.
fn shrink_drained<T>(buf: &mut VecDeque<T>) {
    let cap = buf.capacity();
    if cap > BUF_KEEP && buf.len() < cap / 4 {
        buf.shrink_to((cap / 2).max(BUF_KEEP));
    }
}

struct Inner<T> {
    buf: VecDeque<T>,
    /// Buffer slots reserved by selects' send arms (counted as full).
    reserved: usize,
    closed: bool,
    receivers_gone: bool,
    recvq: WaitQueue<T>,
    sendq: WaitQueue<T>,
}

/// Pop the first node another party may claim: nodes of the group `own`
/// (the caller's select) stay queued; nodes whose select already won are
/// dropped from the queue; a node of a select is claimed by winning its
/// group.
#[inline]
fn pop_claim<T>(queue: &mut WaitQueue<T>, own: *const SelectGroup) -> Option<NodeRef<T>> {
    pop_claim_where(queue, own, |_| true)
}

/// As [`pop_claim`], over the nodes `eligible` accepts (the others are
/// left queued and unclaimed).
fn pop_claim_where<T>(
    queue: &mut WaitQueue<T>,
    own: *const SelectGroup,
    eligible: impl Fn(&Node<T>) -> bool,
) -> Option<NodeRef<T>> {
    let mut cursor = queue.cursor();
    while let Some(node) = cursor.next() {
        // SAFETY: we hold the channel lock (every caller does).
        let n = unsafe { node.get() };
        if !eligible(n) {
            continue;
        }
        if let Some((group, index)) = n.select {
            if group == own {
                continue;
            }
            // SAFETY: the select's group outlives its queued nodes (the
            // select unlinks every node before it returns).
            if !unsafe { &*group }.try_win(index) {
                queue.remove(n);
                n.set_state(NodeState::Idle);
                continue;
            }
        }
        queue.remove(n);
        return Some(node);
    }
    None
}

/// Drop every value; a panicking `Drop` of one does not stop the others,
/// and the first panic is resumed at the end.
fn drop_each<T>(values: Vec<T>) {
    let mut first_panic = None;
    for value in values {
        if let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(value))) {
            if first_panic.is_none() {
                first_panic = Some(panic);
            } else {
                drop_payload(panic);
            }
        }
    }
    if let Some(panic) = first_panic {
        std::panic::resume_unwind(panic);
    }
}

/// Drop a panic payload that is not re-raised; a payload whose own `Drop`
/// panics must not unwind out of here (the rest would then be dropped in
/// an unwind, or the panic escape its caller): that second payload is
/// leaked.
fn drop_payload(payload: Box<dyn std::any::Any + Send>) {
    if let Err(again) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(payload))) {
        std::mem::forget(again);
    }
}

/// Take a value from the ring now into the empty `out` (under the lock: a
/// slot still being written counts as empty; its writer settles
/// afterwards). `true` if one was taken.
fn pop_value<T>(ring: &Ring<T>, out: &mut Option<T>) -> bool {
    matches!(ring.pop(out), Pop::Value)
}

/// How often `try_send` retries a ring slot that a receive is finishing
/// before it reports full (under loom: once, which covers the retry path).
/// (`try_recv` waits out a slot being written: see `Chan::try_recv`.)
#[cfg(not(loom))]
const RING_PATIENCE: u32 = 64;
#[cfg(loom)]
const RING_PATIENCE: u32 = 1;

/// Is a real (non-probe) partner of another group waiting in `queue`?
fn has_partner<T>(queue: &WaitQueue<T>, own: *const SelectGroup) -> bool {
    queue.iter().any(|n| {
        // SAFETY: under the lock (every caller holds it).
        let n = unsafe { n.get() };
        // A plain node is everybody's partner: its null group must not be
        // mistaken for the caller's when the caller has none (`own` null,
        // as for `Select::ready`'s first pass).
        !n.probe && n.select.is_none_or(|(g, _)| g != own) && n.is_claimable()
    })
}

/// Is a select's send arm of another group parked in `queue` (a send
/// queue), still claimable? It sends once woken, so a readiness probe on
/// the receiving side counts it as a ready sender (crossbeam's zero-capacity
/// `is_ready` counts a blocked select's send operation too). A
/// `Select::ready` send probe does not count: it never sends.
fn has_select_sender<T>(queue: &WaitQueue<T>, own: *const SelectGroup) -> bool {
    queue.iter().any(|n| {
        // SAFETY: under the lock (every caller holds it).
        let n = unsafe { n.get() };
        n.probe && !n.ready_only && n.group() != own && n.is_claimable()
    })
}

/// A select's send arm's claim on the channel, made before its value is
/// evaluated.
pub(crate) enum Reservation<T> {
    /// A buffer slot (`Inner::reserved`; unbounded channels).
    Slot,
    /// A claimed ring position (its slot index; bounded channels).
    Ring(usize),
    /// A parked receiver, taken out of the queue in state `Reserved`.
    Receiver(*const Node<T>),
}

impl<T> Reservation<T> {
    /// As one word (a select keeps it untyped): 0 for a slot, an odd word
    /// for a ring position, else the (aligned, so even) node address.
    pub(crate) fn into_raw(self) -> usize {
        match self {
            Reservation::Slot => 0,
            Reservation::Ring(index) => (index << 1) | 1,
            Reservation::Receiver(node) => node as usize,
        }
    }

    /// # Safety
    ///
    /// `raw` came from `into_raw` of a `Reservation<T>` of the same `T`,
    /// and is used once.
    pub(crate) unsafe fn from_raw(raw: usize) -> Reservation<T> {
        match raw {
            0 => Reservation::Slot,
            odd if odd & 1 == 1 => Reservation::Ring(odd >> 1),
            node => Reservation::Receiver(node as *const Node<T>),
        }
    }
}

/// The shared channel.
pub(crate) struct Chan<T> {
    inner: Mutex<Inner<T>>,
    /// The buffer of a bounded channel with `cap > 0` (lock-free; `Inner::
    /// buf` is then unused). Rendezvous and unbounded channels buffer in
    /// `Inner::buf` under the lock.
    ring: Option<Ring<T>>,
    /// Nonzero while an operation is parked (or about to park) on a ring
    /// channel: `recvq.len() + sendq.len()`, written under the lock on
    /// every unlock, and set to 1 by a parking operation before it
    /// re-checks the ring (`announce`). A lock-free ring operation reads it
    /// after its own step (`after_ring_op`) and then settles the waiters
    /// under the lock (spec section 2a).
    parked: AtomicUsize,
    cap: Option<usize>,
    pub(crate) senders: AtomicUsize,
    pub(crate) receivers: AtomicUsize,
    /// Wakes issued (diagnostics and tests: each wake counted once).
    wakes: AtomicUsize,
    /// [`RECV_HINT`]: a receive might find something (a buffered value, a
    /// parked sender or probe, or the close); [`SEND_HINT`] (channels
    /// without a ring): a send might complete or fail at once (a parked
    /// receiver, room in the buffer, or the close). Written on every
    /// unlock, so `try_recv` skips the lock of an empty open channel (a
    /// select's readiness pass over many channels), and a blocking send's
    /// first attempt skips the lock when it would only fail and park
    /// (its `publish` makes the same attempt under the lock).
    hints: AtomicUsize,
}

/// `Chan::hints`: a receive may complete without waiting.
const RECV_HINT: usize = 1;
/// `Chan::hints`: a send may complete without waiting.
const SEND_HINT: usize = 2;

/// The channel lock held; on release it refreshes `Chan::hints`.
struct Locked<'c, T> {
    chan: &'c Chan<T>,
    guard: MutexGuard<'c, Inner<T>>,
}

impl<T> std::ops::Deref for Locked<'_, T> {
    type Target = Inner<T>;
    fn deref(&self) -> &Inner<T> {
        &self.guard
    }
}

impl<T> std::ops::DerefMut for Locked<'_, T> {
    fn deref_mut(&mut self) -> &mut Inner<T> {
        &mut self.guard
    }
}

impl<T> Drop for Locked<'_, T> {
    fn drop(&mut self) {
        let inner = &*self.guard;
        let recv = !inner.buf.is_empty() || !inner.sendq.is_empty() || inner.closed;
        let send = inner.closed
            || inner.receivers_gone
            || !inner.recvq.is_empty()
            || (self.chan.ring.is_none() && self.chan.cap.is_none_or(|cap| inner.buf.len() + inner.reserved < cap));
        let hints = if recv { RECV_HINT } else { 0 } | if send { SEND_HINT } else { 0 };
        // Release (still under the lock, before the unlock): pairs with the
        // Acquire loads in `try_recv` and `may_send`; a reader that happens
        // after this critical section sees its state.
        self.chan.hints.store(hints, Ordering::Release);
        // Relaxed: only lock holders write it, and it is exact whenever the
        // lock is free; the handshake's ordering comes from `announce`'s
        // fence (its store is Relaxed) and from the readers' SeqCst CAS and
        // load (`after_ring_op`) or fence (`after_ring_fill`).
        self.chan
            .parked
            .store(inner.recvq.len() + inner.sendq.len(), Ordering::Relaxed);
    }
}

// SAFETY: all interior state is behind the mutex (node pointers included,
// see `NodeRef`); values cross threads, hence `T: Send`.
unsafe impl<T: Send> Send for Chan<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for Chan<T> {}

/// Outcome of a non-blocking attempt.
pub(crate) enum Try {
    /// A value was moved into the caller's slot.
    Done,
    WouldBlock,
    Disconnected,
}

impl<T> Chan<T> {
    pub(crate) fn new(cap: Option<usize>) -> Chan<T> {
        Chan {
            inner: Mutex::new(Inner {
                buf: VecDeque::new(),
                reserved: 0,
                closed: false,
                receivers_gone: false,
                recvq: WaitQueue::new(RECV_QUEUE),
                sendq: WaitQueue::new(SEND_QUEUE),
            }),
            ring: cap.filter(|&c| c > 0).map(Ring::new),
            parked: AtomicUsize::new(0),
            cap,
            senders: AtomicUsize::new(1),
            receivers: AtomicUsize::new(1),
            wakes: AtomicUsize::new(0),
            hints: AtomicUsize::new(if cap == Some(0) { 0 } else { SEND_HINT }),
        }
    }

    fn lock(&self) -> Locked<'_, T> {
        Locked {
            chan: self,
            guard: lock(&self.inner),
        }
    }

    pub(crate) fn capacity(&self) -> Option<usize> {
        self.cap
    }

    pub(crate) fn len(&self) -> usize {
        match &self.ring {
            Some(ring) => ring.len(),
            None => self.lock().buf.len(),
        }
    }

    /// The record of the first queued receiver (a clone; the node stays
    /// queued): loom models wake it from a third party, as a cancellation
    /// or a deadline wakes a fiber.
    #[cfg(loom)]
    pub(crate) fn first_receiver_record(&self) -> Option<Waiter> {
        self.first_record(false)
    }

    /// As `first_receiver_record`, for the first queued sender.
    #[cfg(loom)]
    pub(crate) fn first_sender_record(&self) -> Option<Waiter> {
        self.first_record(true)
    }

    #[cfg(loom)]
    fn first_record(&self, sender: bool) -> Option<Waiter> {
        let inner = self.lock();
        let node = if sender {
            inner.sendq.front()
        } else {
            inner.recvq.front()
        }?;
        // SAFETY: under the lock; a queued node is alive.
        let node = unsafe { node.get() };
        // SAFETY: as in `Node::state`: the lock guards a queued node.
        node.waiter.with(|w| unsafe { (*w).clone() })
    }

    /// Queued (receivers, senders), for tests and diagnostics.
    pub(crate) fn waiting(&self) -> (usize, usize) {
        let inner = self.lock();
        (inner.recvq.len(), inner.sendq.len())
    }

    /// Wakes issued so far (tests and diagnostics).
    pub(crate) fn wakes_issued(&self) -> usize {
        self.wakes.load(Ordering::Relaxed)
    }

    /// Count the wakes collected since `before`. Called under the channel
    /// lock only (every caller holds it), so the lock orders the writers
    /// and a load and a store count exactly, without a read-modify-write
    /// on the hand-off path.
    #[inline]
    fn note(&self, wakes: &Wakes, before: usize) {
        let n = wakes.count() - before;
        if n > 0 {
            // Relaxed: a statistic, written under the lock only.
            let now = self.wakes.load(Ordering::Relaxed);
            self.wakes.store(now + n, Ordering::Relaxed);
        }
    }

    pub(crate) fn is_closed(&self) -> bool {
        let inner = self.lock();
        inner.closed || inner.receivers_gone
    }

    fn has_room(&self, inner: &Inner<T>) -> bool {
        match &self.ring {
            Some(ring) => ring.has_room(),
            None => self.cap.is_none_or(|cap| inner.buf.len() + inner.reserved < cap),
        }
    }

    /// Under the lock, by an operation about to park on a ring channel,
    /// before it re-checks the ring (spec section 2a, the park handshake).
    /// A store-then-load handshake on two locations (PITFALLS 3), SeqCst
    /// on both sides: this store and a SeqCst fence, then the re-check's
    /// loads of `head`/`tail`; on the other side a lock-free step's SeqCst
    /// CAS of `head`/`tail`, then its SeqCst load of `parked`
    /// (`after_ring_op`). In the single total order either the fence comes
    /// before that load (which then sees this store), or the CAS comes
    /// before the fence (and the re-check sees the CAS: the slot is then
    /// ready, or busy for a moment, and the re-check waits for it, never
    /// parks on it). A reservation's `fill` has no CAS: it pairs its
    /// SeqCst fence (`after_ring_fill`) with this fence instead.
    fn announce(&self) {
        if self.ring.is_some() {
            // Relaxed: ordered by the SeqCst fence after it (see above).
            self.parked.store(1, Ordering::Relaxed);
            fence(Ordering::SeqCst);
        }
    }

    /// After a lock-free ring step whose SeqCst CAS on `head`/`tail` came
    /// before (a send or a receive): if anybody is parked, settle under the
    /// lock.
    fn after_ring_op(&self) {
        // SeqCst: after the step's SeqCst CAS in the total order (see
        // `announce`).
        if self.parked.load(Ordering::SeqCst) != 0 {
            self.settle_now();
        }
    }

    /// After a reserved position was filled or given back (no CAS of
    /// ours): the SeqCst fence pairs with the one in `announce`.
    fn after_ring_fill(&self) {
        fence(Ordering::SeqCst);
        // Relaxed: ordered by the fence above.
        if self.parked.load(Ordering::Relaxed) != 0 {
            self.settle_now();
        }
    }

    #[cold]
    fn settle_now(&self) {
        let mut wakes = Wakes::new();
        let mut inner = self.lock();
        self.settle(&mut inner, &mut wakes);
    }

    /// A parking operation's re-check of `head`: waits out a busy slot.
    fn head_settled(ring: &Ring<T>) -> Head {
        let mut step = 0;
        loop {
            match ring.head() {
                Head::Busy => spin(&mut step),
                head => return head,
            }
        }
    }

    /// A parking operation's re-check of `tail`: waits out a busy slot.
    fn room_settled(ring: &Ring<T>) -> bool {
        let mut step = 0;
        loop {
            match ring.room() {
                Err(NoRoom::Busy) => spin(&mut step),
                room => return room.is_ok(),
            }
        }
    }

    /// Ring channels, under the lock: move buffered values to parked
    /// receivers and free slots to parked senders (a plain sender's value
    /// goes into the ring: it was admitted when it parked, so it ignores
    /// the close mark), tell select probes, and fail parked receivers once
    /// the channel is closed and drained. Every party that changes the
    /// ring while somebody may be parked ends here, so no waiter sleeps
    /// next to a value or a free slot.
    fn settle(&self, inner: &mut Inner<T>, wakes: &mut Wakes) {
        let Some(ring) = &self.ring else { return };
        if inner.recvq.is_empty() && inner.sendq.is_empty() {
            // Nobody to hand a value or a slot to, nobody to fail.
            return;
        }
        let before = wakes.count();
        let mut probes_woken = 0usize;
        loop {
            let mut progress = false;
            while !inner.recvq.is_empty() && ring.has_ready() {
                let Some(node) = pop_claim(&mut inner.recvq, std::ptr::null()) else {
                    break;
                };
                // SAFETY: claimed under the lock; alive while queued.
                let n = unsafe { node.get() };
                if n.probe {
                    wakes.push(n.complete(NodeState::Done));
                    progress = true;
                    continue;
                }
                if n.with_claimed_slot(|slot| pop_value(ring, slot)) {
                    wakes.push(n.complete(NodeState::Done));
                    progress = true;
                    continue;
                }
                // A lock-free receive took it first.
                if n.select.is_none() {
                    inner.recvq.push_front(node);
                } else {
                    // The select is won already: it wakes without a value
                    // and tries again (`ParkedRecv::finish`).
                    wakes.push(n.complete(NodeState::Done));
                }
                break;
            }
            while !inner.sendq.is_empty() && ring.has_room() {
                // A select's send arm (a probe) is told of room, but only as
                // many as there are free slots: it takes none until it runs,
                // and waking every parked one for each freed slot made n
                // selects cost n wakes per message. A woken select that
                // takes another arm offers the room on (`reoffer_send`).
                let budget = ring.free().saturating_sub(probes_woken);
                let Some(node) = pop_claim_where(&mut inner.sendq, std::ptr::null(), |n| {
                    !n.probe || n.ready_only || budget > 0
                }) else {
                    break;
                };
                // SAFETY: claimed under the lock; alive while queued.
                let n = unsafe { node.get() };
                if n.probe {
                    probes_woken += usize::from(!n.ready_only);
                    wakes.push(n.complete(NodeState::Done));
                    progress = true;
                    continue;
                }
                match ring.claim(true) {
                    Ok(claim) => {
                        n.with_claimed_slot(|slot| {
                            assert!(slot.is_some(), "a parked sender holds its value");
                            ring.write(claim, slot)
                        });
                        wakes.push(n.complete(NodeState::Done));
                        progress = true;
                    }
                    Err(_) => {
                        // A lock-free send took the slot: wait on.
                        inner.sendq.push_front(node);
                        break;
                    }
                }
            }
            if !progress {
                break;
            }
        }
        Self::fail_receivers_if_drained_ring(ring, inner, wakes);
        self.note(wakes, before);
    }

    /// Ring channels: closed, nothing claimed in the ring, and no admitted
    /// (parked, plain) sender left: a receive fails.
    fn ring_disconnected(ring: &Ring<T>, inner: &Inner<T>) -> bool {
        inner.closed
            && ring.is_drained()
            && !inner.sendq.iter().any(|n| {
                // SAFETY: under the lock (every caller holds it).
                !unsafe { n.get() }.probe
            })
    }

    fn fail_receivers_if_drained_ring(ring: &Ring<T>, inner: &mut Inner<T>, wakes: &mut Wakes) {
        if !Self::ring_disconnected(ring, inner) {
            return;
        }
        while let Some(node) = pop_claim(&mut inner.recvq, std::ptr::null()) {
            // SAFETY: claimed under the lock.
            let node = unsafe { node.get() };
            wakes.push(node.complete(NodeState::Closed));
        }
    }

    /// Might a send complete (or fail) without waiting? `false` only on a
    /// channel without a ring whose last critical section left no parked
    /// receiver, no room and no close: a blocking send then goes straight
    /// to its `publish`, which decides under the lock.
    fn may_send(&self) -> bool {
        // Acquire: pairs with the Release store in `Locked::drop`.
        self.ring.is_some() || self.hints.load(Ordering::Acquire) & SEND_HINT != 0
    }

    /// Send the value in `value` without blocking; `Err(disconnected)`
    /// leaves it there. (Every internal send path moves the value out of
    /// the caller's slot in place: see `Node::with_claimed_slot`.)
    pub(crate) fn try_send(&self, value: &mut Option<T>) -> Result<(), bool> {
        if let Some(ring) = &self.ring {
            let mut spins = 0;
            return loop {
                match ring.claim(false) {
                    Ok(claim) => {
                        ring.write(claim, value);
                        self.after_ring_op();
                        break Ok(());
                    }
                    Err(NoRoom::Closed) => break Err(true),
                    Err(NoRoom::Busy) if spins < RING_PATIENCE => {
                        spins += 1;
                        std::hint::spin_loop();
                    }
                    Err(NoRoom::Full | NoRoom::Busy) => break Err(false),
                }
            };
        }
        let mut wakes = Wakes::new();
        let mut inner = self.lock();
        self.send_locked(&mut inner, value, &mut wakes)
    }

    /// The send fast path under the lock. `Err(disconnected)` leaves the
    /// value in `value`.
    fn send_locked(&self, inner: &mut Inner<T>, value: &mut Option<T>, wakes: &mut Wakes) -> Result<(), bool> {
        if inner.closed || inner.receivers_gone {
            return Err(true);
        }
        self.hand_to_receiver(inner, value, std::ptr::null(), wakes);
        if value.is_none() {
            return Ok(());
        }
        if !self.has_room(inner) {
            return Err(false);
        }
        Self::buffer(inner, value);
        self.wake_recv_probes(inner, wakes);
        Ok(())
    }

    /// Move the value in `value` to the back of the (lock-based) buffer.
    fn buffer(inner: &mut Inner<T>, value: &mut Option<T>) {
        inner
            .buf
            .push_back(value.take().expect("a buffered send carries a value"));
    }

    /// Rendezvous first: hand the value to a waiting receiver; the value
    /// back if there is none. `Select::ready` receive probes are left
    /// queued: a value handed to a receiver, or one that a `try_send`
    /// takes back, is nothing they could receive. They are told once a
    /// value is buffered or a sender has parked (`wake_recv_probes`), so a
    /// `ready` that names a receive finds the value or the parked sender
    /// there.
    ///
    /// The value moves out of `value` when a receiver takes it.
    fn hand_to_receiver(
        &self,
        inner: &mut Inner<T>,
        value: &mut Option<T>,
        own: *const SelectGroup,
        wakes: &mut Wakes,
    ) {
        if inner.recvq.is_empty() {
            return;
        }
        let before = wakes.count();
        let mut cursor = inner.recvq.cursor();
        while let Some(node) = cursor.next() {
            // SAFETY: under the lock; the node is alive while queued.
            let n = unsafe { node.get() };
            if n.probe {
                continue;
            }
            if let Some((group, index)) = n.select {
                if group == own {
                    continue;
                }
                // SAFETY: the select's group outlives its queued nodes.
                if !unsafe { &*group }.try_win(index) {
                    // Its select completed another operation.
                    inner.recvq.remove(n);
                    n.set_state(NodeState::Idle);
                    continue;
                }
            }
            inner.recvq.remove(n);
            wakes.push(n.deliver(value));
            break;
        }
        self.note(wakes, before);
    }

    /// Something can be received now (a value was buffered, or a sender
    /// parked): claim and wake every `Select::ready` receive probe.
    #[inline]
    fn wake_recv_probes(&self, inner: &mut Inner<T>, wakes: &mut Wakes) {
        if inner.recvq.is_empty() {
            // Nobody waits to receive (the common case on the send path).
            return;
        }
        let before = wakes.count();
        Self::wake_probes(&mut inner.recvq, std::ptr::null(), wakes);
        self.note(wakes, before);
    }

    /// Claim and wake every parked probe in `queue` (a select's send arm
    /// or `Select::ready` probe) of a group other than `own` (null: every
    /// probe; a probe always belongs to a select). A probe whose select was
    /// already won elsewhere is only unlinked.
    fn wake_probes(queue: &mut WaitQueue<T>, own: *const SelectGroup, wakes: &mut Wakes) {
        Self::wake_probes_up_to(queue, own, wakes, usize::MAX);
    }

    /// As [`wake_probes`](Self::wake_probes), waking at most `budget`
    /// select send arms (every `Select::ready` probe still: they report
    /// readiness and take nothing).
    fn wake_probes_up_to(queue: &mut WaitQueue<T>, own: *const SelectGroup, wakes: &mut Wakes, mut budget: usize) {
        let mut cursor = queue.cursor();
        while let Some(node) = cursor.next() {
            // SAFETY: under the lock.
            let n = unsafe { node.get() };
            if !n.probe || n.group() == own || (budget == 0 && !n.ready_only) {
                continue;
            }
            queue.remove(n);
            if n.win() {
                budget -= usize::from(!n.ready_only);
                wakes.push(n.complete(NodeState::Done));
            } else {
                n.set_state(NodeState::Idle);
            }
        }
    }

    /// Receive without blocking.
    #[inline]
    /// Receive without blocking into the empty `out`.
    pub(crate) fn try_recv(&self, out: &mut Option<T>) -> Try {
        let mut probed = false;
        match self.try_recv_now(&mut probed, out) {
            // Only a select's parked send arm could give a value, and it
            // has none until it runs again: it was woken to reserve a
            // receiver and hand its value over, and a receiver that does
            // not wait would never be there for it (a polling `try_recv`
            // loop would wake it forever). So wait for it, briefly, as a
            // parked receiver (crossbeam's `try_recv` waits for a selected
            // sender's value too). `Empty` if it chose another arm. Not a
            // cancellation point (a cancelled fiber still gets the value
            // that was handed to it); at teardown it unwinds like any wait.
            Try::WouldBlock if probed => {
                let until = Instant::now() + SELECT_SEND_WAIT;
                match self.recv_with(Some(until), Interrupt::NotCancellable, out) {
                    Ok(()) => Try::Done,
                    Err(WaitResult::Closed) => Try::Disconnected,
                    Err(_) => Try::WouldBlock,
                }
            }
            other => other,
        }
    }

    /// One attempt, never waiting: `probed` says a select's send arm was
    /// woken (it will hand its value to a receiver that waits for it).
    /// What a blocking receive's wait tries (it waits as a receiver
    /// anyway): calling `try_recv` there would nest its brief wait inside
    /// the wait, again and again (a stack overflow).
    #[inline]
    fn try_recv_now(&self, probed: &mut bool, out: &mut Option<T>) -> Try {
        if let Some(ring) = &self.ring {
            let mut spins = 0;
            loop {
                match ring.pop(out) {
                    Pop::Value => {
                        self.after_ring_op();
                        return Try::Done;
                    }
                    // The slot at `head` is claimed by a send that has not
                    // written it yet, and `tail` is past it: a later send
                    // may have completed, so the channel is not empty
                    // (reporting `Empty` would not be linearizable, as in
                    // crossbeam's `linearizable` test). The writer awaits
                    // nothing: wait it out (spin, then yield the thread).
                    Pop::Busy => crate::sync::spin(&mut spins),
                    Pop::Reserved { freed } => {
                        if freed {
                            // Holes taken on the way freed slots: parked
                            // senders may move in (`settle`).
                            self.after_ring_op();
                        }
                        return Try::WouldBlock;
                    }
                    Pop::Empty { closed: false } => return Try::WouldBlock,
                    Pop::Empty { closed: true } => {
                        // Closed and empty: parked (admitted) senders may
                        // still hold values; decide under the lock.
                        let mut wakes = Wakes::new();
                        let mut inner = self.lock();
                        return self.recv_locked(&mut inner, std::ptr::null(), &mut wakes, &mut false, out);
                    }
                }
            }
        }
        // Acquire: pairs with the Release store in `Locked::drop`.
        if self.hints.load(Ordering::Acquire) & RECV_HINT == 0 {
            return Try::WouldBlock;
        }
        self.try_recv_locked(probed, out)
    }

    fn try_recv_locked(&self, probed: &mut bool, out: &mut Option<T>) -> Try {
        let mut wakes = Wakes::new();
        let mut inner = self.lock();
        self.recv_locked(&mut inner, std::ptr::null(), &mut wakes, probed, out)
    }

    fn recv_locked(
        &self,
        inner: &mut Inner<T>,
        own: *const SelectGroup,
        wakes: &mut Wakes,
        probed: &mut bool,
        out: &mut Option<T>,
    ) -> Try {
        let before = wakes.count();
        let result = self.recv_locked_inner(inner, own, wakes, probed, out);
        self.note(wakes, before);
        result
    }

    fn recv_locked_inner(
        &self,
        inner: &mut Inner<T>,
        own: *const SelectGroup,
        wakes: &mut Wakes,
        probed: &mut bool,
        out: &mut Option<T>,
    ) -> Try {
        if let Some(ring) = &self.ring {
            let mut step = 0;
            loop {
                match ring.pop(out) {
                    Pop::Value => {
                        // A slot freed: parked senders may move in.
                        self.settle(inner, wakes);
                        return Try::Done;
                    }
                    // Never park on a busy slot (see `announce`).
                    Pop::Busy => spin(&mut step),
                    // Its completion settles (`after_ring_fill`); holes
                    // taken on the way freed slots for parked senders.
                    Pop::Reserved { freed } => {
                        if freed {
                            self.settle(inner, wakes);
                        }
                        return Try::WouldBlock;
                    }
                    Pop::Empty { .. } => {
                        // Admitted senders parked in a race move in first.
                        self.settle(inner, wakes);
                        if ring.has_ready() {
                            continue;
                        }
                        if Self::ring_disconnected(ring, inner) {
                            return Try::Disconnected;
                        }
                        return Try::WouldBlock;
                    }
                }
            }
        }
        if !inner.buf.is_empty() {
            debug_assert!(out.is_none(), "a receive moves into an empty slot");
            *out = inner.buf.pop_front();
            shrink_drained(&mut inner.buf);
            // Room appeared: admit the first parked sender into the buffer.
            self.admit_sender(inner, wakes);
            return Try::Done;
        }
        // Rendezvous: take straight from a parked sender. A `Select::ready`
        // send probe has nothing to hand over: it is left queued (a
        // receiver that parks tells it, `register`), so a `try_recv` never
        // waits for it.
        let mut woke_probe = false;
        loop {
            let skip_probes = woke_probe;
            let Some(node) = pop_claim_where(&mut inner.sendq, own, |n| !(n.ready_only || (n.probe && skip_probes)))
            else {
                break;
            };
            // SAFETY: claimed under the lock.
            let node = unsafe { node.get() };
            if node.probe {
                // A select's send arm: it wakes, reserves a receiver, and
                // hands its value then. Keep looking for a plain sender,
                // but wake no more send arms: this one receiver is all the
                // room there is (a select that takes another arm offers it
                // on, `reoffer_send`).
                wakes.push(node.complete(NodeState::Done));
                *probed = true;
                woke_probe = true;
                continue;
            }
            node.take_sent(out);
            wakes.push(node.complete(NodeState::Done));
            return Try::Done;
        }
        if inner.closed && inner.reserved == 0 {
            return Try::Disconnected;
        }
        Try::WouldBlock
    }

    /// Move the first parked sender's value into the buffer (after a pop);
    /// a probe (a select's send arm) is told there is room.
    fn admit_sender(&self, inner: &mut Inner<T>, wakes: &mut Wakes) {
        let mut probes_woken = 0usize;
        while self.has_room(inner) {
            // As many probes as free slots (see `settle`).
            let free = self
                .cap
                .map_or(usize::MAX, |cap| cap.saturating_sub(inner.buf.len() + inner.reserved));
            let budget = free.saturating_sub(probes_woken);
            let Some(node) = pop_claim_where(&mut inner.sendq, std::ptr::null(), |n| {
                !n.probe || n.ready_only || budget > 0
            }) else {
                return;
            };
            // SAFETY: claimed under the lock.
            let node = unsafe { node.get() };
            if node.probe {
                probes_woken += usize::from(!node.ready_only);
                wakes.push(node.complete(NodeState::Done));
            } else {
                node.with_claimed_slot(|slot| Self::buffer(inner, slot));
                wakes.push(node.complete(NodeState::Done));
                return;
            }
        }
    }

    /// Closed, nothing buffered, nothing reserved: parked receivers can
    /// never get a value; wake each once with `Closed`.
    fn fail_receivers_if_drained(inner: &mut Inner<T>, wakes: &mut Wakes) {
        if !(inner.closed && inner.buf.is_empty() && inner.reserved == 0) {
            return;
        }
        while let Some(node) = pop_claim(&mut inner.recvq, std::ptr::null()) {
            // SAFETY: claimed under the lock.
            let node = unsafe { node.get() };
            wakes.push(node.complete(NodeState::Closed));
        }
    }

    /// Close (explicit, or the last sender left). Wakes every parked
    /// receiver (they have nothing to take, or they would not wait) exactly
    /// once; parked senders stay queued: they were admitted and their values
    /// are still delivered. Returns `false` if already closed.
    pub(crate) fn close(&self) -> bool {
        let mut wakes = Wakes::new();
        let mut inner = self.lock();
        if inner.closed {
            return false;
        }
        inner.closed = true;
        let before = wakes.count();
        match &self.ring {
            Some(ring) => {
                ring.close();
                self.settle(&mut inner, &mut wakes);
            }
            None => Self::fail_receivers_if_drained(&mut inner, &mut wakes),
        }
        // Select send arms (probes) learn of the close too: their send is
        // now ready (it fails).
        let mut cursor = inner.sendq.cursor();
        while let Some(node) = cursor.next() {
            // SAFETY: under the lock.
            let n = unsafe { node.get() };
            if n.probe {
                inner.sendq.remove(n);
                if n.win() {
                    wakes.push(n.complete(NodeState::Closed));
                } else {
                    n.set_state(NodeState::Idle);
                }
            }
        }
        self.note(&wakes, before);
        true
    }

    /// The last receiver left: no value can be delivered any more. Parked
    /// senders get their values back; buffered values are dropped, after
    /// the wakes and outside the lock; a panicking `Drop` of one value does
    /// not stop the others from being dropped, and the first panic is
    /// resumed at the end.
    pub(crate) fn disconnect_receivers(&self) {
        let mut wakes = Wakes::new();
        let dropped = {
            let mut inner = self.lock();
            inner.receivers_gone = true;
            inner.closed = true;
            if let Some(ring) = &self.ring {
                ring.close();
            }
            let before = wakes.count();
            while let Some(node) = pop_claim(&mut inner.sendq, std::ptr::null()) {
                // SAFETY: claimed under the lock.
                let node = unsafe { node.get() };
                wakes.push(node.complete(NodeState::Closed));
            }
            while let Some(node) = pop_claim(&mut inner.recvq, std::ptr::null()) {
                // SAFETY: claimed under the lock.
                let node = unsafe { node.get() };
                wakes.push(node.complete(NodeState::Closed));
            }
            self.note(&wakes, before);
            std::mem::take(&mut inner.buf)
        };
        wakes.flush();
        let mut dropped: Vec<T> = dropped.into();
        if self.ring.is_some() {
            // SeqCst: pairs with the fence in `after_ring_fill` of a select
            // completing (or giving back) a reserved position: either it
            // reads `receivers == 0` after its fill and drops what is
            // queued from there (`drop_abandoned`), or our pops below see
            // its fill.
            fence(Ordering::SeqCst);
            self.take_ring_values(&mut dropped);
        }
        drop_each(dropped);
    }

    /// Take every value of the ring up to the first reserved position (or
    /// the end), waiting out a send between its claim and its write (a
    /// moment, as crossbeam's disconnect does). Values behind a reserved
    /// position are taken by that reservation's completion
    /// (`drop_abandoned`).
    fn take_ring_values(&self, into: &mut Vec<T>) {
        let Some(ring) = &self.ring else { return };
        let mut step = 0;
        loop {
            let mut out = None;
            match ring.pop(&mut out) {
                Pop::Value => into.extend(out),
                Pop::Busy => spin(&mut step),
                Pop::Empty { .. } | Pop::Reserved { .. } => return,
            }
        }
    }

    /// After a reserved position was filled or given back (and
    /// `after_ring_fill`'s fence): if every receiver has left meanwhile,
    /// nobody else will take what is queued from there, so drop it now
    /// instead of when the last sender leaves (see `disconnect_receivers`).
    fn drop_abandoned(&self) {
        // Relaxed: ordered by the SeqCst fence in `after_ring_fill` (which
        // the caller ran after its fill), paired with the one in
        // `disconnect_receivers`.
        if self.receivers.load(Ordering::Relaxed) == 0 {
            let mut dropped = Vec::new();
            self.take_ring_values(&mut dropped);
            drop_each(dropped);
        }
    }

    /// Blocking send of the value in `value`, with an optional deadline.
    /// `Err(why)` leaves the value there.
    #[track_caller]
    pub(crate) fn send(&self, value: &mut Option<T>, deadline: Option<Instant>) -> Result<(), WaitResult> {
        depth::assert_unlocked("fiber-chan: a wait");
        // A ring channel's lock-free step first, without building a node
        // (`fiber_wait` would try the same first: same result).
        if self.ring.is_some() {
            match self.try_send(value) {
                Ok(()) => return Ok(()),
                Err(true) => return Err(WaitResult::Closed),
                Err(false) => {}
            }
        }
        let mut node = Node::new(self);
        node.with_value(|slot| std::mem::swap(slot, value));
        let result = fiber_wait(&SendWait(self), &mut node, WaitOptions::new().deadline(deadline));
        match result {
            WaitResult::Ok => Ok(()),
            why => {
                node.with_value(|slot| {
                    assert!(slot.is_some(), "an unsent value stays in the node");
                    std::mem::swap(slot, value)
                });
                Err(why)
            }
        }
    }

    /// Blocking receive into the empty `out`, with an optional deadline.
    /// `Err(why)`.
    #[track_caller]
    pub(crate) fn recv(&self, deadline: Option<Instant>, out: &mut Option<T>) -> Result<(), WaitResult> {
        self.recv_with(deadline, Interrupt::Cancellable, out)
    }

    /// [`recv`](Self::recv) with the wait's interrupt policy.
    #[track_caller]
    fn recv_with(
        &self,
        deadline: Option<Instant>,
        interrupt: Interrupt,
        out: &mut Option<T>,
    ) -> Result<(), WaitResult> {
        depth::assert_unlocked("fiber-chan: a wait");
        // As in `send`.
        if self.ring.is_some() {
            match self.try_recv_now(&mut false, out) {
                Try::Done => return Ok(()),
                Try::Disconnected => return Err(WaitResult::Closed),
                Try::WouldBlock => {}
            }
        }
        let mut node = Node::new(self);
        match fiber_wait(
            &RecvWait(self),
            &mut node,
            WaitOptions::new().deadline(deadline).interrupt(interrupt),
        ) {
            WaitResult::Ok => {
                node.with_value(|slot| {
                    assert!(slot.is_some(), "a completed receive holds its value");
                    std::mem::swap(slot, out)
                });
                Ok(())
            }
            why => Err(why),
        }
    }

    /// A select's send arm: claim a parked receiver or a buffer slot before
    /// the value exists. `Err(())` if the channel is disconnected.
    pub(crate) fn try_reserve(&self, own: &SelectGroup) -> Result<Option<Reservation<T>>, ()> {
        if let Some(ring) = &self.ring {
            // A position of the ring, claimed now, written on completion
            // (receivers that reach it meanwhile park; the writer settles).
            return match ring.claim(false) {
                Ok(claim) => {
                    ring.reserve(claim);
                    Ok(Some(Reservation::Ring(claim.0)))
                }
                Err(NoRoom::Closed) => Err(()),
                Err(NoRoom::Full | NoRoom::Busy) => Ok(None),
            };
        }
        let mut wakes = Wakes::new();
        let mut inner = self.lock();
        if inner.closed || inner.receivers_gone {
            return Err(());
        }
        let before = wakes.count();
        let own: *const SelectGroup = own;
        while let Some(node) = pop_claim(&mut inner.recvq, own) {
            // SAFETY: claimed under the lock.
            let n = unsafe { node.get() };
            if n.probe {
                wakes.push(n.complete(NodeState::Done));
                continue;
            }
            n.set_state(NodeState::Reserved);
            self.note(&wakes, before);
            return Ok(Some(Reservation::Receiver(node.0)));
        }
        self.note(&wakes, before);
        if self.has_room(&inner) {
            inner.reserved += 1;
            return Ok(Some(Reservation::Slot));
        }
        Ok(None)
    }

    /// Complete a reservation with the value. `Err(value)` if every
    /// receiver left meanwhile (a reserved slot only: a reserved receiver
    /// is a receiver that is still there).
    ///
    /// The value moves out of `value`; on `Err(())` it stays there.
    pub(crate) fn complete_reservation(&self, reservation: Reservation<T>, value: &mut Option<T>) -> Result<(), ()> {
        if let Reservation::Ring(index) = reservation {
            let ring = self
                .ring
                .as_ref()
                .expect("a ring reservation is made on a ring channel");
            // Acquire: pairs with the AcqRel decrement in `Receiver::drop`.
            let result = if self.receivers.load(Ordering::Acquire) == 0 {
                ring.fill(Claim(index), &mut None);
                ring.skip_holes();
                Err(())
            } else {
                // Admitted when reserved: delivered even after a close.
                ring.fill(Claim(index), value);
                Ok(())
            };
            self.after_ring_fill();
            self.drop_abandoned();
            return result;
        }
        let mut wakes = Wakes::new();
        let mut inner = self.lock();
        let before = wakes.count();
        let result = match reservation {
            Reservation::Receiver(node) => {
                // SAFETY: a reserved node's owner waits in `unregister`
                // until its state leaves `Reserved`, so it is alive; we hold
                // the lock.
                let node = unsafe { &*node };
                wakes.push(node.deliver(value));
                Ok(())
            }
            Reservation::Ring(_) => unreachable!("handled above"),
            Reservation::Slot => {
                inner.reserved -= 1;
                if inner.receivers_gone {
                    Err(())
                } else {
                    // Admitted when reserved: delivered even after a close.
                    self.hand_to_receiver(&mut inner, value, std::ptr::null(), &mut wakes);
                    if value.is_some() {
                        Self::buffer(&mut inner, value);
                        self.wake_recv_probes(&mut inner, &mut wakes);
                    }
                    Self::fail_receivers_if_drained(&mut inner, &mut wakes);
                    Ok(())
                }
            }
        };
        self.note(&wakes, before);
        result
    }

    /// Give a reservation up without sending: the receiver goes back to
    /// waiting (it sees a spurious wake and retries), the slot is freed.
    pub(crate) fn release_reservation(&self, reservation: Reservation<T>) {
        if let Reservation::Ring(index) = reservation {
            let ring = self
                .ring
                .as_ref()
                .expect("a ring reservation is made on a ring channel");
            // Rolled back if it was the last position claimed, else a hole
            // that receivers skip.
            if !ring.give_back(Claim(index)) {
                ring.skip_holes();
            }
            self.after_ring_fill();
            self.drop_abandoned();
            return;
        }
        let mut wakes = Wakes::new();
        let mut inner = self.lock();
        let before = wakes.count();
        match reservation {
            Reservation::Receiver(node) => {
                // SAFETY: as in `complete_reservation`.
                let node = unsafe { &*node };
                let waiter = node.take_waiter();
                node.set_state(NodeState::Idle);
                wakes.push(waiter);
            }
            Reservation::Ring(_) => unreachable!("handled above"),
            Reservation::Slot => {
                inner.reserved -= 1;
                self.admit_sender(&mut inner, &mut wakes);
                Self::fail_receivers_if_drained(&mut inner, &mut wakes);
            }
        }
        self.note(&wakes, before);
    }

    /// A select's receive: complete now (after winning the select), queue
    /// the node, or report that the select was already won elsewhere.
    pub(crate) fn register_recv(&self, node: &mut Node<T>, waiter: &Waiter) -> Reg {
        self.register(node, waiter, Side::Recv)
    }

    /// A select's send arm (a probe): as `register_recv`.
    pub(crate) fn register_send(&self, node: &mut Node<T>, waiter: &Waiter) -> Reg {
        self.register(node, waiter, Side::Send)
    }

    /// Shared by both sides: if the operation is ready, win the select and
    /// complete it (a probe completes without a transfer); otherwise queue.
    fn register(&self, node: &mut Node<T>, waiter: &Waiter, side: Side) -> Reg {
        let mut wakes = Wakes::new();
        let mut inner = self.lock();
        self.announce();
        let own = node.group();
        let ready = match side {
            Side::Recv if node.ready_only => self.recv_ready_for_probe(&inner, own),
            Side::Recv => self.recv_ready(&inner, own),
            Side::Send => self.send_ready(&inner, own),
        };
        if !ready {
            let before = wakes.count();
            match side {
                Side::Recv => {
                    if !node.probe && self.ring.is_none() {
                        // A receiver now waits: selects' send arms parked
                        // here can now proceed; tell them.
                        Self::wake_send_probes(&mut inner, own, &mut wakes);
                    }
                    node.enqueue(&mut inner.recvq, waiter);
                }
                Side::Send => {
                    if !node.ready_only && self.ring.is_none() {
                        // A select's send arm now waits on a rendezvous
                        // channel: `Select::ready` receive probes parked
                        // here count it as a ready sender; tell them (the
                        // only probes in the receive queue are those).
                        Self::wake_probes(&mut inner.recvq, own, &mut wakes);
                    }
                    node.enqueue(&mut inner.sendq, waiter)
                }
            }
            self.note(&wakes, before);
            return Reg::Queued;
        }
        if !node.win() {
            return Reg::Lost;
        }
        if node.probe {
            // Readiness only: take nothing (a send arm reserves after it
            // wakes; `Select::ready` reports only).
            let closed = side == Side::Send && (inner.closed || inner.receivers_gone);
            return Reg::Completed(if closed { WaitResult::Closed } else { WaitResult::Ok });
        }
        match node.with_value(|slot| self.recv_locked(&mut inner, own, &mut wakes, &mut false, slot)) {
            Try::Done => Reg::Completed(WaitResult::Ok),
            Try::Disconnected => Reg::Completed(WaitResult::Closed),
            Try::WouldBlock => Reg::Retry,
        }
    }

    /// A receiver now waits on a rendezvous channel: claim and wake one
    /// parked select send arm of another group (the receiver is room for
    /// one value; a select that takes another arm offers it on,
    /// `reoffer_send`), and every `Select::ready` send probe.
    fn wake_send_probes(inner: &mut Inner<T>, own: *const SelectGroup, wakes: &mut Wakes) {
        Self::wake_probes_up_to(&mut inner.sendq, own, wakes, 1);
    }

    /// A select woken through its send arm on this channel (told of room
    /// or of a waiting receiver) completed another operation, or none: the
    /// room it was told of may be unused. Offer it to the next parked send
    /// arm, as if it had just appeared, so no select waits next to room
    /// that nobody was told of.
    pub(crate) fn reoffer_send(&self) {
        let mut wakes = Wakes::new();
        let mut inner = self.lock();
        let before = wakes.count();
        if let Some(ring) = &self.ring {
            if ring.has_room() {
                self.settle(&mut inner, &mut wakes);
            }
        } else if self.cap.is_some() && self.has_room(&inner) {
            self.admit_sender(&mut inner, &mut wakes);
        } else if self.ring.is_none() && has_partner(&inner.recvq, std::ptr::null()) {
            Self::wake_send_probes(&mut inner, std::ptr::null(), &mut wakes);
        }
        self.note(&wakes, before);
    }

    fn recv_ready(&self, inner: &Inner<T>, own: *const SelectGroup) -> bool {
        if let Some(ring) = &self.ring {
            // A parked plain sender helps only once its value can move in
            // (`settle`): with the ring full behind a reserved head it
            // cannot, and counting it made a select retry without ever
            // parking or yielding for as long as the reservation lasted
            // (`adversarial/chan_reserved.rs`).
            return Self::head_settled(ring) == Head::Ready
                || Self::ring_disconnected(ring, inner)
                || (has_partner(&inner.sendq, own) && Self::room_settled(ring));
        }
        !inner.buf.is_empty() || (inner.closed && inner.reserved == 0) || has_partner(&inner.sendq, own)
    }

    /// Readiness as `Select::ready` sees it: `recv_ready`, or a select
    /// parked on a send arm of this rendezvous channel (a receive wakes it
    /// and waits for its value: see `try_recv`).
    fn recv_ready_for_probe(&self, inner: &Inner<T>, own: *const SelectGroup) -> bool {
        self.recv_ready(inner, own) || (self.ring.is_none() && has_select_sender(&inner.sendq, own))
    }

    /// Would a receive complete (or fail as disconnected) right now?
    pub(crate) fn is_recv_ready(&self) -> bool {
        self.recv_ready_for_probe(&self.lock(), std::ptr::null())
    }

    /// Would a send complete (or fail as disconnected) right now?
    pub(crate) fn is_send_ready(&self) -> bool {
        self.send_ready(&self.lock(), std::ptr::null())
    }

    fn send_ready(&self, inner: &Inner<T>, own: *const SelectGroup) -> bool {
        if let Some(ring) = &self.ring {
            return inner.closed || inner.receivers_gone || Self::room_settled(ring);
        }
        inner.closed || inner.receivers_gone || self.has_room(inner) || has_partner(&inner.recvq, own)
    }

    /// Blocking-operation publish (not a select): complete now or queue.
    fn register_plain_recv(&self, node: &mut Node<T>, waiter: &Waiter) -> Option<WaitResult> {
        let mut wakes = Wakes::new();
        let mut inner = self.lock();
        self.announce();
        match node.with_value(|slot| self.recv_locked(&mut inner, std::ptr::null(), &mut wakes, &mut false, slot)) {
            Try::Done => Some(WaitResult::Ok),
            Try::Disconnected => Some(WaitResult::Closed),
            Try::WouldBlock => {
                let before = wakes.count();
                if self.ring.is_none() {
                    // A receiver now waits on a rendezvous channel: tell the
                    // `Select::ready` send probes (`recv_locked` leaves them
                    // queued; it woke a select's send arm already, if one
                    // was parked, so no budget for more here).
                    Self::wake_probes_up_to(&mut inner.sendq, std::ptr::null(), &mut wakes, 0);
                }
                node.enqueue(&mut inner.recvq, waiter);
                self.note(&wakes, before);
                None
            }
        }
    }

    fn register_plain_send(&self, node: &mut Node<T>, waiter: &Waiter) -> Option<WaitResult> {
        let mut wakes = Wakes::new();
        let mut inner = self.lock();
        if let Some(ring) = &self.ring {
            self.announce();
            if inner.closed || inner.receivers_gone {
                return Some(WaitResult::Closed);
            }
            let mut step = 0;
            return loop {
                match ring.claim(false) {
                    Ok(claim) => {
                        node.with_value(|slot| ring.write(claim, slot));
                        self.settle(&mut inner, &mut wakes);
                        break Some(WaitResult::Ok);
                    }
                    Err(NoRoom::Closed) => break Some(WaitResult::Closed),
                    // Never park on a busy slot (see `announce`).
                    Err(NoRoom::Busy) => spin(&mut step),
                    Err(NoRoom::Full) => {
                        // Whoever frees the slot sees `parked` and settles.
                        node.enqueue(&mut inner.sendq, waiter);
                        break None;
                    }
                }
            };
        }
        match node.with_value(|slot| {
            assert!(slot.is_some(), "a send node holds its value");
            self.send_locked(&mut inner, slot, &mut wakes)
        }) {
            Ok(()) => Some(WaitResult::Ok),
            Err(disconnected) => {
                if disconnected {
                    return Some(WaitResult::Closed);
                }
                // A sender now waits: `Select::ready` receive probes learn
                // it (the node is queued first, so a `ready` woken here
                // finds it).
                node.enqueue(&mut inner.sendq, waiter);
                self.wake_recv_probes(&mut inner, &mut wakes);
                None
            }
        }
    }

    /// Is `node` reserved by a select's send arm (which will complete it or
    /// give it back)? Read under the lock, where reservations change.
    pub(crate) fn is_reserved(&self, node: &Node<T>) -> bool {
        let _inner = self.lock();
        node.state() == NodeState::Reserved
    }

    /// Unlink `node` if still queued; report a completion that raced. A
    /// node reserved by a select's send arm is a committed hand-off: wait
    /// until the value arrives or the reservation is released (a fiber
    /// parks for it, a thread yields).
    ///
    /// `fiber_may_yield`: false when called from a `publish` (the fiber is
    /// PARKING and must not yield) or from a node's drop.
    #[inline]
    pub(crate) fn unregister(&self, node: &Node<T>, fiber_may_yield: bool) -> Option<WaitResult> {
        // The common end of a wait: a peer completed the node and woke us.
        // No lock needed to learn it (see `Node::complete`).
        if let Some(result) = node.finish_unlocked() {
            return Some(result);
        }
        self.unregister_locked(node, fiber_may_yield)
    }

    /// A fiber's wait on `node` is over (a deadline, a cancel, shutdown) or
    /// its node is dropped mid-wait, while a select's send arm holds a
    /// reservation on it: park until the reservation is completed or given
    /// back, instead of spinning. The holder's value expression may park
    /// (or run a blocking call) for as long as it likes; teardown runs
    /// every fiber on one thread, and the holder could run (or be unwound,
    /// which gives the reservation back) only if this one let the thread
    /// go, so a spin there never ended
    /// (`reviews/review23.rs::shutdown_unwinding_a_receiver_reserved_by_a_parked_send_arm_returns`).
    /// Parked as `WaitKind::Handoff`: a shutdown that gives up on the
    /// fiber here takes it back once the hand-off ends, as it does a fiber
    /// in a blocking call (`reviews/review26.rs`). Waiting from
    /// `unpublish`, before any unwind begins, also keeps the fiber from
    /// parking in the middle of one (which would pin it, and its panic
    /// count, to the thread). The wait is not cancellable: the reservation
    /// is a committed hand-off that ends soon or with its holder's unwind.
    #[cfg(not(loom))]
    #[cold]
    fn wait_reservation_end(&self, node: &Node<T>) {
        while node.state() == NodeState::Reserved {
            let result = fiber_wait(
                &ReservationEnd { chan: self, node },
                &mut (),
                WaitOptions::new().interrupt(Interrupt::Never),
            );
            debug_assert_eq!(result, WaitResult::Ok);
        }
    }

    #[inline(never)]
    fn unregister_locked(&self, node: &Node<T>, fiber_may_yield: bool) -> Option<WaitResult> {
        loop {
            let mut inner = self.lock();
            if node.state() == NodeState::Reserved {
                drop(inner);
                #[cfg(not(loom))]
                if fiber_may_yield && fiber_core::in_fiber() {
                    self.wait_reservation_end(node);
                    continue;
                }
                backoff(fiber_may_yield);
                continue;
            }
            return Self::unpublish_locked(&mut inner, node);
        }
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
            NodeState::Reserved => unreachable!("unregister waits out a reservation"),
        }
    }
}

/// A blocking send as a fiber-core waitable.
struct SendWait<'a, T>(&'a Chan<T>);

impl<T> Waitable for SendWait<'_, T> {
    type Io = Node<T>;

    fn kind(&self) -> fiber_core::WaitKind {
        fiber_core::WaitKind::Send
    }

    fn try_complete(&self, node: &mut Node<T>) -> Option<WaitResult> {
        if !self.0.may_send() {
            // Nothing to complete with now (a hint, not a decision:
            // `publish` tries again under the lock before it queues).
            return None;
        }
        node.with_value(|slot| {
            slot.as_ref()?;
            match self.0.try_send(slot) {
                Ok(()) => Some(WaitResult::Ok),
                Err(disconnected) => disconnected.then_some(WaitResult::Closed),
            }
        })
    }

    fn publish(&self, waiter: &Waiter, node: &mut Node<T>) -> Publish {
        match self.0.register_plain_send(node, waiter) {
            Some(result) => Publish::Ready(result),
            None => Publish::Published,
        }
    }

    fn unpublish(&self, _: &Waiter, node: &mut Node<T>) -> Option<WaitResult> {
        self.0.unregister(node, true)
    }
}

/// A blocking receive as a fiber-core waitable.
struct RecvWait<'a, T>(&'a Chan<T>);

impl<T> Waitable for RecvWait<'_, T> {
    type Io = Node<T>;

    fn kind(&self) -> fiber_core::WaitKind {
        fiber_core::WaitKind::Recv
    }

    fn try_complete(&self, node: &mut Node<T>) -> Option<WaitResult> {
        // Never `try_recv`: this wait is already a receiver's (see
        // `try_recv_now`).
        match node.with_value(|slot| self.0.try_recv_now(&mut false, slot)) {
            Try::Done => Some(WaitResult::Ok),
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
        self.0.unregister(node, true)
    }
}

#[cfg(all(test, debug_assertions, not(loom)))]
mod lock_discipline {
    use super::*;

    fn panics(f: impl FnOnce()) -> String {
        let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).expect_err("the misuse is caught");
        err.downcast_ref::<String>().cloned().unwrap_or_default()
    }

    #[test]
    fn a_wake_flush_under_a_channel_lock_is_caught() {
        let chan = Chan::<u8>::new(Some(1));
        let msg = panics(|| {
            let _held = chan.lock();
            depth::assert_unlocked("fiber-chan: a wake flush");
        });
        assert!(msg.contains("while holding 1 channel lock"), "{msg}");
        // Released: no complaint.
        depth::assert_unlocked("fiber-chan: a wake flush");
    }

    #[test]
    fn a_wait_under_a_channel_lock_is_caught() {
        let a = Chan::<u8>::new(Some(0));
        let b = Chan::<u8>::new(Some(0));
        let msg = panics(|| {
            let _held = a.lock();
            let _ = b.recv(None, &mut None);
        });
        assert!(msg.contains("a wait while holding"), "{msg}");
    }
}
