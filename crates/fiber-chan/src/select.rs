//! Waiting on several channel operations at once: the dynamic [`Select`]
//! builder and the [`select!`](crate::select!) macro.
//!
//! # Protocol
//!
//! 1. Try every operation once, from a random start (in order when biased).
//!    A receive takes its value; a send *reserves* (a parked receiver or a
//!    buffer slot) and its value is produced only afterwards, by
//!    [`SelectedOperation::send`].
//! 2. Otherwise publish one node per channel operation, all in one select
//!    group, and park (a cancellation point). A peer that claims any node
//!    must first win the group by CAS (one winner per select, chosen before
//!    any transfer and any wake); it skips nodes of a select that already
//!    has a winner, and a select never claims its own nodes. Send arms
//!    publish probes: a receiver claiming one only wakes the select, which
//!    then reserves.
//! 3. After waking, unlink every node from every channel; the winner is the
//!    group's CAS winner and nothing else: an operation that did not win
//!    never consumes (timer arms have no node; they are read in step 1 of
//!    the next round).

use crate::chan::{Node, Reg, Reservation, SelectGroup};
use crate::channel::{sleep_until, Flavor, Receiver, Sender};
use crate::error::{
    ReadyTimeoutError, RecvError, SelectTimeoutError, SendError, TryReadyError, TryRecvError, TrySelectError,
};
use fiber_core::{fiber_wait, Interrupt, Publish, WaitOptions, WaitResult, Waitable, Waiter};
use smallvec::SmallVec;
use std::cell::Cell;
use std::fmt;
use std::mem::{align_of, size_of, MaybeUninit};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Operations kept inline in a [`Select`] (more spill to the heap).
const INLINE_OPS: usize = 8;

/// Untyped storage for one operation's outcome: a received value (inline
/// if it fits, else boxed) or a send reservation (one word).
type Slot = [MaybeUninit<u64>; 4];

const fn fits<T>() -> bool {
    size_of::<T>() <= size_of::<Slot>() && align_of::<T>() <= align_of::<Slot>()
}

/// # Safety
///
/// The slot holds no value (nothing is overwritten without a drop).
unsafe fn slot_put<T>(slot: &mut Slot, value: T) {
    let p = slot.as_mut_ptr();
    if fits::<T>() {
        // SAFETY: `T` fits the slot's size and alignment (checked above).
        unsafe { p.cast::<T>().write(value) }
    } else {
        // SAFETY: a `Box` is one word, which fits.
        unsafe { p.cast::<Box<T>>().write(Box::new(value)) }
    }
}

/// # Safety
///
/// The slot holds a `T` written by `slot_put::<T>`; it is taken once.
unsafe fn slot_take<T>(slot: &mut Slot) -> T {
    let p = slot.as_ptr();
    if fits::<T>() {
        // SAFETY: see the function's contract.
        unsafe { p.cast::<T>().read() }
    } else {
        // SAFETY: as above (boxed by `slot_put`).
        *unsafe { p.cast::<Box<T>>().read() }
    }
}

/// What an operation's slot holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    /// Nothing (not selected, or a send arm woken that still has to
    /// reserve).
    Empty,
    /// A received value of the receiver's type.
    Value,
    /// The receive failed (disconnected, or the select was cancelled).
    RecvFailed,
    /// A send reservation (`Reservation::into_raw`).
    Reserved,
    /// The send fails (disconnected, or the select was cancelled).
    SendFailed,
    /// Ready (`Select::ready`); nothing taken.
    Ready,
}

/// The receive side of a select operation, untyped (implemented by
/// `Receiver<T>`; the value moves through a [`Slot`]).
trait RecvHandle {
    /// Take a value now: `Value` (in `slot`), `RecvFailed` or `Empty`.
    /// Take a value now, if one is there. `since`: when the select began
    /// waiting, once it has parked (a timer arm keeps its schedule, as
    /// `Receiver::recv` does: `TimerChan::try_take_since`).
    fn try_take(&self, slot: &mut Slot, since: Option<Instant>) -> Status;
    fn is_ready(&self) -> bool;
    fn timer_due(&self) -> Option<Instant>;
    fn addr(&self) -> usize;
    fn is_channel(&self) -> bool;
    /// # Safety
    ///
    /// `slot` holds a value taken by this handle.
    unsafe fn drop_value(&self, slot: &mut Slot);
    /// Put the parked-phase operation into `place` (on the selecting
    /// fiber's stack).
    fn park_in<'s>(&'s self, place: &mut ParkSlot<'s>);
}

/// The send side of a select operation, untyped (implemented by
/// `Sender<T>`).
trait SendHandle {
    /// Reserve now: `Reserved` (in `slot`), `SendFailed` or `Empty`.
    fn try_reserve(&self, group: &SelectGroup, slot: &mut Slot) -> Status;
    fn is_ready(&self) -> bool;
    fn addr(&self) -> usize;
    /// # Safety
    ///
    /// `slot` holds a reservation made by this handle.
    unsafe fn release(&self, slot: &mut Slot);
    fn park_in<'s>(&'s self, place: &mut ParkSlot<'s>);
    /// The select was woken through this arm and did not send: offer the
    /// room it was told of to the next parked send arm.
    fn reoffer(&self);
}

/// Words of inline room for one operation's parked-phase state (a
/// `ParkedRecv`/`ParkedSend` and its channel node): enough for values of up
/// to 32 bytes, like [`Slot`]; larger ones are boxed.
const PARK_WORDS: usize = 24;

// A receive or send of a value that fits a `Slot` parks without a box.
#[cfg(not(loom))]
const _: () = {
    assert!(size_of::<ParkedRecv<'static, [u64; 4]>>() <= size_of::<[u64; PARK_WORDS]>());
    assert!(size_of::<ParkedSend<'static, [u64; 4]>>() <= size_of::<[u64; PARK_WORDS]>());
    assert!(align_of::<ParkedRecv<'static, [u64; 4]>>() <= align_of::<u64>());
};

/// The storage of one operation's parked-phase state, on the selecting
/// fiber's stack (`Select::run_inner`): no allocation per select for values
/// that fit. It never moves once filled: channel queues point into it while
/// the select is parked.
///
/// Other threads write the nodes inside `buf` (under their channels'
/// locks) while the select holds `&mut` or `&` to its slots: the bytes are
/// in an `UnsafeCell` (a shared reference does not freeze them) and the
/// slot is `!Unpin` (a `&mut` to it is not taken as exclusive), as for
/// `Node` itself.
struct ParkSlot<'a> {
    buf: std::cell::UnsafeCell<MaybeUninit<[u64; PARK_WORDS]>>,
    /// The object: in `buf`, or boxed when it does not fit.
    obj: Option<(*mut (dyn Parked + 'a), bool)>,
    _pinned: std::marker::PhantomPinned,
}

impl<'a> ParkSlot<'a> {
    fn empty() -> ParkSlot<'a> {
        ParkSlot {
            buf: std::cell::UnsafeCell::new(MaybeUninit::uninit()),
            obj: None,
            _pinned: std::marker::PhantomPinned,
        }
    }

    fn put<P: Parked + 'a>(&mut self, parked: P) {
        debug_assert!(self.obj.is_none(), "a park slot is filled once");
        if size_of::<P>() <= size_of::<[u64; PARK_WORDS]>() && align_of::<P>() <= align_of::<u64>() {
            let p = self.buf.get().cast::<P>();
            // SAFETY: `P` fits the buffer's size and alignment (checked
            // above) and the buffer holds nothing (filled once).
            unsafe { p.write(parked) };
            self.obj = Some((p as *mut (dyn Parked + 'a), false));
        } else {
            self.obj = Some((Box::into_raw(Box::new(parked)) as *mut (dyn Parked + 'a), true));
        }
    }

    fn get(&mut self) -> Option<&mut (dyn Parked + 'a)> {
        // SAFETY: `obj` points to the live object written by `put` (in our
        // buffer, which has not moved since: the slot is not moved while
        // filled, or a box we own); `&mut self` makes the access unique.
        self.obj.map(|(p, _)| unsafe { &mut *p })
    }
}

impl Drop for ParkSlot<'_> {
    fn drop(&mut self) {
        match self.obj.take() {
            // SAFETY: the box came from `Box::into_raw` in `put`.
            Some((p, true)) => drop(unsafe { Box::from_raw(p) }),
            // SAFETY: the object lives in our buffer, written by `put` and
            // dropped once (`obj` is taken).
            Some((p, false)) => unsafe { std::ptr::drop_in_place(p) },
            None => {}
        }
    }
}

/// An operation's node for the parked phase.
trait Parked {
    fn register(&mut self, group: &SelectGroup, index: usize, waiter: &Waiter, ready_only: bool) -> Reg;
    /// Unlink the node; what a peer did to it, if anything
    /// (`fiber_may_yield`: see `Chan::unregister`).
    fn unregister(&mut self, fiber_may_yield: bool) -> Option<WaitResult>;
    /// This operation won with `result`: move its outcome into `slot`.
    fn finish(&mut self, result: WaitResult, slot: &mut Slot) -> Status;
    /// Is the node reserved by a peer's send arm (which will complete it
    /// or give it back, and wake the owner either way)?
    fn is_reserved(&mut self) -> bool {
        false
    }
}

impl<T> RecvHandle for Receiver<T> {
    fn try_take(&self, slot: &mut Slot, since: Option<Instant>) -> Status {
        let taken = match (&self.flavor, since) {
            (Flavor::Timer(timer, convert), Some(since)) => timer
                .try_take_since(Instant::now(), since)
                .map(convert)
                .ok_or(TryRecvError::Empty),
            _ => self.try_recv_quiet(),
        };
        match taken {
            Ok(value) => {
                // SAFETY: callers pass an empty slot (`Op::release` first).
                unsafe { slot_put(slot, value) };
                Status::Value
            }
            Err(TryRecvError::Disconnected) => Status::RecvFailed,
            Err(TryRecvError::Empty) => Status::Empty,
        }
    }

    fn is_ready(&self) -> bool {
        match &self.flavor {
            Flavor::Chan(chan) => chan.is_recv_ready(),
            Flavor::Timer(timer, _) => timer.due().is_some_and(|d| d <= Instant::now()),
            Flavor::Never => false,
        }
    }

    fn timer_due(&self) -> Option<Instant> {
        match &self.flavor {
            Flavor::Timer(timer, _) => timer.due(),
            _ => None,
        }
    }

    fn addr(&self) -> usize {
        Receiver::addr(self)
    }

    fn is_channel(&self) -> bool {
        matches!(self.flavor, Flavor::Chan(_))
    }

    unsafe fn drop_value(&self, slot: &mut Slot) {
        // SAFETY: see the trait's contract.
        drop(unsafe { slot_take::<T>(slot) });
    }

    fn park_in<'s>(&'s self, place: &mut ParkSlot<'s>) {
        place.put(ParkedRecv {
            receiver: self,
            node: None,
        });
    }
}

impl<T> SendHandle for Sender<T> {
    fn try_reserve(&self, group: &SelectGroup, slot: &mut Slot) -> Status {
        match self.chan.try_reserve(group) {
            Ok(Some(reservation)) => {
                // SAFETY: callers pass an empty slot; a word fits.
                unsafe { slot_put(slot, reservation.into_raw()) };
                Status::Reserved
            }
            Ok(None) => Status::Empty,
            Err(()) => Status::SendFailed,
        }
    }

    fn is_ready(&self) -> bool {
        self.chan.is_send_ready()
    }

    fn addr(&self) -> usize {
        Arc::as_ptr(&self.chan) as *const () as usize
    }

    unsafe fn release(&self, slot: &mut Slot) {
        // SAFETY: see the trait's contract: the word is a `Reservation<T>`
        // of this channel.
        let reservation = unsafe { Reservation::<T>::from_raw(slot_take::<usize>(slot)) };
        self.chan.release_reservation(reservation);
    }

    fn park_in<'s>(&'s self, place: &mut ParkSlot<'s>) {
        place.put(ParkedSend {
            sender: self,
            node: None,
        });
    }

    fn reoffer(&self) {
        self.chan.reoffer_send();
    }
}

struct ParkedRecv<'r, T> {
    receiver: &'r Receiver<T>,
    node: Option<Node<T>>,
}

impl<T> Parked for ParkedRecv<'_, T> {
    fn register(&mut self, group: &SelectGroup, index: usize, waiter: &Waiter, ready_only: bool) -> Reg {
        let Flavor::Chan(chan) = &self.receiver.flavor else {
            return Reg::Queued;
        };
        let node = self
            .node
            .insert(Node::for_select(chan, ready_only, ready_only, group, index));
        chan.register_recv(node, waiter)
    }

    fn unregister(&mut self, fiber_may_yield: bool) -> Option<WaitResult> {
        let Flavor::Chan(chan) = &self.receiver.flavor else {
            return None;
        };
        chan.unregister(self.node.as_ref()?, fiber_may_yield)
    }

    fn is_reserved(&mut self) -> bool {
        match (&self.receiver.flavor, &self.node) {
            (Flavor::Chan(chan), Some(node)) => chan.is_reserved(node),
            _ => false,
        }
    }

    fn finish(&mut self, result: WaitResult, slot: &mut Slot) -> Status {
        match (result, self.node.as_mut().and_then(|n| n.take_value())) {
            (WaitResult::Ok, Some(value)) => {
                // SAFETY: a winning operation's slot is empty (released
                // before each run).
                unsafe { slot_put(slot, value) };
                Status::Value
            }
            // A readiness probe (`Select::ready`) takes nothing.
            (WaitResult::Ok, None) if self.node.as_ref().is_some_and(|n| n.is_probe()) => Status::Ready,
            // Won, but a lock-free receive took the ring's value first
            // (`Chan::settle`): try again.
            (WaitResult::Ok, None) => Status::Empty,
            _ => Status::RecvFailed,
        }
    }
}

struct ParkedSend<'r, T> {
    sender: &'r Sender<T>,
    node: Option<Node<T>>,
}

impl<T> Parked for ParkedSend<'_, T> {
    fn register(&mut self, group: &SelectGroup, index: usize, waiter: &Waiter, ready_only: bool) -> Reg {
        let chan = &self.sender.chan;
        let node = self.node.insert(Node::for_select(chan, true, ready_only, group, index));
        chan.register_send(node, waiter)
    }

    fn unregister(&mut self, fiber_may_yield: bool) -> Option<WaitResult> {
        self.sender.chan.unregister(self.node.as_ref()?, fiber_may_yield)
    }

    fn finish(&mut self, result: WaitResult, _: &mut Slot) -> Status {
        // The probe fired: the send can proceed (it reserves next), or the
        // channel is disconnected.
        if result == WaitResult::Ok {
            Status::Empty
        } else {
            Status::SendFailed
        }
    }
}

#[derive(Clone, Copy)]
enum Handle<'a> {
    Recv(&'a (dyn RecvHandle + 'a)),
    Send(&'a (dyn SendHandle + 'a)),
    Removed,
}

/// One operation of a select.
struct Op<'a> {
    handle: Handle<'a>,
    status: Status,
    slot: Slot,
}

impl<'a> Op<'a> {
    fn new(handle: Handle<'a>) -> Op<'a> {
        Op {
            handle,
            status: Status::Empty,
            slot: [MaybeUninit::uninit(); 4],
        }
    }

    /// Complete now if possible (a send reserves); with `ready_only`, only
    /// check readiness.
    fn try_now(&mut self, group: &SelectGroup, ready_only: bool, since: Option<Instant>) -> bool {
        debug_assert_eq!(self.status, Status::Empty);
        self.status = match self.handle {
            Handle::Recv(h) if ready_only => {
                if h.is_ready() {
                    Status::Ready
                } else {
                    Status::Empty
                }
            }
            Handle::Send(h) if ready_only => {
                if h.is_ready() {
                    Status::Ready
                } else {
                    Status::Empty
                }
            }
            Handle::Recv(h) => h.try_take(&mut self.slot, since),
            Handle::Send(h) => h.try_reserve(group, &mut self.slot),
            Handle::Removed => Status::Empty,
        };
        self.status != Status::Empty
    }

    /// Publish a node for the parked phase in `park` (timers and `never`:
    /// none).
    fn register(
        &mut self,
        park: &mut ParkSlot<'a>,
        group: &SelectGroup,
        index: usize,
        waiter: &Waiter,
        ready_only: bool,
    ) -> Reg {
        if park.obj.is_none() {
            match self.handle {
                Handle::Recv(h) => h.park_in(park),
                Handle::Send(h) => h.park_in(park),
                Handle::Removed => return Reg::Queued,
            }
        }
        park.get()
            .expect("filled above")
            .register(group, index, waiter, ready_only)
    }

    fn unregister(park: &mut ParkSlot<'a>, fiber_may_yield: bool) -> Option<WaitResult> {
        park.get()?.unregister(fiber_may_yield)
    }

    fn finish(&mut self, park: &mut ParkSlot<'a>, result: WaitResult) {
        let parked = park.get().expect("a winner has a node");
        self.status = parked.finish(result, &mut self.slot);
    }

    fn settled(&self) -> bool {
        self.status != Status::Empty
    }

    /// The select was cancelled and picked this operation: it fails.
    fn fail(&mut self) {
        self.release();
        self.status = match self.handle {
            Handle::Send(_) => Status::SendFailed,
            _ => Status::RecvFailed,
        };
    }

    /// Forget the outcome: drop a received value, give a reservation back.
    fn release(&mut self) {
        // Empty first: a value whose `Drop` panics must not be found again
        // by this operation's own drop during the unwind (a double drop).
        let status = std::mem::replace(&mut self.status, Status::Empty);
        match (status, self.handle) {
            // SAFETY: the slot holds a value this handle took (the status
            // said so), and the status no longer does: it is taken once.
            (Status::Value, Handle::Recv(h)) => unsafe { h.drop_value(&mut self.slot) },
            // SAFETY: the slot holds a reservation this handle made, taken
            // once as above.
            (Status::Reserved, Handle::Send(h)) => unsafe { h.release(&mut self.slot) },
            _ => {}
        }
    }

    fn deadline(&self) -> Option<Instant> {
        match self.handle {
            Handle::Recv(h) => h.timer_due(),
            _ => None,
        }
    }

    /// Is this a receive from a timer channel (`after`, `at`, `tick`)?
    /// (`never` is one too, but never completes.)
    fn is_timer(&self) -> bool {
        matches!(self.handle, Handle::Recv(h) if !h.is_channel())
    }

    fn addr(&self) -> usize {
        match self.handle {
            Handle::Recv(h) => h.addr(),
            Handle::Send(h) => h.addr(),
            Handle::Removed => REMOVED,
        }
    }

    fn is_send(&self) -> bool {
        matches!(self.handle, Handle::Send(_))
    }

    /// See [`SendHandle::reoffer`].
    fn reoffer(&self) {
        if let Handle::Send(h) = self.handle {
            h.reoffer();
        }
    }

    fn is_channel(&self) -> bool {
        match self.handle {
            Handle::Recv(h) => h.is_channel(),
            Handle::Send(_) => true,
            Handle::Removed => false,
        }
    }
}

impl Drop for Op<'_> {
    fn drop(&mut self) {
        self.release();
    }
}

/// Park until any operation completes (the parked phase of a select).
struct SelectWait<'s, 'a> {
    ops: &'s mut [Op<'a>],
    /// One per operation, same index.
    parks: &'s mut [ParkSlot<'a>],
    group: &'s SelectGroup,
    /// The order in which the operations queue their nodes: random for a
    /// select that is not biased, so that of several nodes of this select
    /// on one channel a peer does not always find the same one first.
    order: &'s [usize],
    chosen: Cell<Option<usize>>,
    ready_only: bool,
}

impl SelectWait<'_, '_> {
    /// Is the group's winner a node that a peer reserved?
    fn winner_is_reserved(&mut self) -> bool {
        let Some(winner) = self.group.winner() else {
            return false;
        };
        self.parks[winner].get().is_some_and(|parked| parked.is_reserved())
    }

    /// Unlink every node; the winner is the group's CAS winner, and only it
    /// reads a result (PITFALLS 16: losers never consume).
    fn unregister_all(&mut self, fiber_may_yield: bool) -> Option<usize> {
        let mut won = None;
        for (i, park) in self.parks.iter_mut().enumerate() {
            if let Some(result) = Op::unregister(park, fiber_may_yield) {
                debug_assert!(won.is_none(), "two operations of one select completed");
                won = Some((i, result));
            }
        }
        let (i, result) = won?;
        debug_assert_eq!(self.group.winner(), Some(i), "a completed node is its group's winner");
        self.ops[i].finish(&mut self.parks[i], result);
        Some(i)
    }
}

/// The parked phase as a fiber-core waitable; its io is the select state.
struct SelectWaitable<'s, 'a>(std::marker::PhantomData<(&'s (), &'a ())>);

impl<'s, 'a: 's> Waitable for SelectWaitable<'s, 'a> {
    type Io = SelectWait<'s, 'a>;

    fn kind(&self) -> fiber_core::WaitKind {
        fiber_core::WaitKind::Select
    }

    fn try_complete(&self, _: &mut Self::Io) -> Option<WaitResult> {
        None
    }

    fn publish(&self, waiter: &Waiter, wait: &mut Self::Io) -> Publish {
        // No node of this group is queued now: the reset races with nobody.
        wait.group.reset();
        for &i in wait.order {
            match wait.ops[i].register(&mut wait.parks[i], wait.group, i, waiter, wait.ready_only) {
                Reg::Queued => {}
                Reg::Completed(result) => {
                    let other = wait.unregister_all(false);
                    debug_assert!(other.is_none(), "the group had one winner");
                    wait.ops[i].finish(&mut wait.parks[i], result);
                    wait.chosen.set(Some(i));
                    return Publish::Ready(WaitResult::Ok);
                }
                Reg::Lost if wait.winner_is_reserved() => {
                    // A peer's send arm reserved the winning node while we
                    // queued the others: it evaluates its value (user code,
                    // which may wait for a fiber of this very worker) and
                    // then completes the node or gives it back, waking us
                    // through the node's record either way. Park until then
                    // (`unpublish` collects the outcome): waiting for it
                    // here, where a fiber cannot yield, spun the worker that
                    // the peer's value could need, for ever.
                    return Publish::Published;
                }
                Reg::Lost | Reg::Retry => {
                    // Lost: a peer completed a node registered earlier.
                    // Retry: nothing to take after all; go round.
                    let winner = wait.unregister_all(false);
                    wait.chosen.set(winner);
                    return Publish::Ready(WaitResult::Ok);
                }
            }
        }
        Publish::Published
    }

    fn unpublish(&self, _: &Waiter, wait: &mut Self::Io) -> Option<WaitResult> {
        let winner = wait.unregister_all(true);
        wait.chosen.set(winner);
        winner.map(|_| WaitResult::Ok)
    }
}

/// How long a select may wait.
#[derive(Clone, Copy)]
enum Mode {
    Try,
    Block,
    Until(Instant),
    /// A timed form whose deadline is past the end of `Instant`: waits
    /// like `Block`, but a cancellation (or an empty set) is a timeout.
    Forever,
}

/// A dynamic set of channel operations to wait on (crossbeam's `Select`).
///
/// ```
/// # mod fiber { pub(crate) use fiber_chan as chan; }
/// use fiber::chan::{unbounded, Select};
///
/// let (s1, r1) = unbounded::<i32>();
/// let (_s2, r2) = unbounded::<i32>();
/// s1.send(10).unwrap();
///
/// let mut sel = Select::new();
/// let i1 = sel.recv(&r1);
/// let i2 = sel.recv(&r2);
/// let oper = sel.select();
/// match oper.index() {
///     i if i == i1 => assert_eq!(oper.recv(&r1), Ok(10)),
///     i if i == i2 => panic!("r2 is empty"),
///     _ => unreachable!(),
/// }
/// ```
///
/// # Cancellation
///
/// The parked phase is a cancellation point. A fiber cancelled while a
/// blocking [`select`](Select::select) waits gets its first operation on a
/// channel (the first operation not removed if there is none), which fails as if
/// disconnected: `recv` gives `Err(RecvError)` and took nothing, `send`
/// gives the value back in `Err(SendError(v))`. `select_timeout` /
/// `select_deadline` / `ready_timeout` report a timeout instead. An
/// operation a peer already committed to completes normally. Tell the cases
/// apart with `fiber::is_cancelled()`.
pub struct Select<'a> {
    ops: SmallVec<[Op<'a>; INLINE_OPS]>,
    group: SelectGroup,
    rng: u64,
    biased: bool,
}

impl fmt::Debug for Select<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Select")
            .field("operations", &self.ops.len())
            .field("biased", &self.biased)
            .finish()
    }
}

/// A copy with the same operations (removed ones stay removed, so indices
/// match) and the same bias (crossbeam's `Select` is `Clone`). A select
/// holds no outcome between calls (a `SelectedOperation` borrows it
/// mutably), so the copy starts with none.
impl<'a> Clone for Select<'a> {
    fn clone(&self) -> Select<'a> {
        let mut copy = Select {
            biased: self.biased,
            ..Select::new()
        };
        for op in &self.ops {
            copy.push_op(op.handle);
        }
        copy
    }
}

impl Default for Select<'_> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(loom)]
fn seed() -> u64 {
    // Loom replays executions: the start must be deterministic.
    0x9E37_79B9_7F4A_7C15
}

#[cfg(not(loom))]
fn seed() -> u64 {
    // Not a protocol: a per-thread xorshift stream (no shared cache line
    // between threads that select), seeded from the thread's address space.
    std::thread_local! {
        static NEXT: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    }
    NEXT.with(|next| {
        let mut x = next.get();
        if x == 0 {
            x = (next as *const _ as u64) ^ 0x9E37_79B9_7F4A_7C15;
        }
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        next.set(x);
        x | 1
    })
}

impl<'a> Select<'a> {
    /// An empty select; when several operations are ready, one is picked at
    /// random.
    pub fn new() -> Select<'a> {
        Select {
            ops: SmallVec::new(),
            group: SelectGroup::new(),
            rng: seed(),
            biased: false,
        }
    }

    /// An empty select that, when several operations are ready, picks the
    /// one added first (crossbeam's `new_biased`).
    pub fn new_biased() -> Select<'a> {
        Select {
            biased: true,
            ..Select::new()
        }
    }

    /// Append an operation. While there is room, it is written in place:
    /// building an `Op` and moving it in copies the whole struct with wide
    /// loads of values just written with narrow stores (its 32-byte
    /// outcome slot holds nothing yet), a store-forwarding stall per add
    /// that showed in every select.
    #[inline]
    fn push_op(&mut self, handle: Handle<'a>) -> usize {
        let index = self.ops.len();
        if index < self.ops.capacity() {
            // SAFETY: `index < capacity`, so the element at `index` is
            // allocated and unused; both fields that need a value are
            // written before `set_len` makes it part of the vector, and the
            // slot is `MaybeUninit` storage that holds nothing until an
            // outcome is put in it.
            unsafe {
                let op = self.ops.as_mut_ptr().add(index);
                std::ptr::addr_of_mut!((*op).handle).write(handle);
                std::ptr::addr_of_mut!((*op).status).write(Status::Empty);
                self.ops.set_len(index + 1);
            }
        } else {
            self.ops.push(Op::new(handle));
        }
        index
    }

    /// Add a receive; returns its index.
    pub fn recv<T>(&mut self, receiver: &'a Receiver<T>) -> usize {
        self.push_op(Handle::Recv(receiver))
    }

    /// Add a send; returns its index. When it is selected, a receiver or a
    /// buffer slot is already reserved for it, and the value is given to
    /// [`SelectedOperation::send`] (so it is produced only if this
    /// operation is selected).
    pub fn send<T>(&mut self, sender: &'a Sender<T>) -> usize {
        self.push_op(Handle::Send(sender))
    }

    /// Remove an operation (by index); the indices of the others do not
    /// change (crossbeam's `remove`).
    ///
    /// # Panics
    ///
    /// Panics if there is no operation with that index, or it was removed.
    pub fn remove(&mut self, index: usize) {
        assert!(
            index < self.ops.len() && self.ops[index].addr() != REMOVED,
            "Select::remove: no operation with index {index}"
        );
        self.ops[index] = Op::new(Handle::Removed);
    }

    /// Wait until one operation completes (blocks forever if none ever
    /// does; see the type's docs for cancellation).
    ///
    /// # Panics
    ///
    /// Panics if no operation was added: such a select could never return.
    #[track_caller]
    pub fn select(&mut self) -> SelectedOperation<'_, 'a> {
        self.assert_live("select");
        let index = self
            .run(Mode::Block, false)
            .expect("a blocking select returns an operation");
        SelectedOperation::new(self, index)
    }

    /// Complete an operation that is ready now, if any (never parks; in a
    /// fiber, a call that finds nothing to do counts toward the poll
    /// budget, and every `fiber_core::POLL_BUDGET` (128) such misses the
    /// fiber yields, so a loop that polls lets other fibers run.)
    pub fn try_select(&mut self) -> Result<SelectedOperation<'_, 'a>, TrySelectError> {
        match self.run(Mode::Try, false) {
            Some(index) => Ok(SelectedOperation::new(self, index)),
            None => Err(TrySelectError),
        }
    }

    /// Wait at most `timeout` for an operation to complete.
    #[track_caller]
    pub fn select_timeout(&mut self, timeout: Duration) -> Result<SelectedOperation<'_, 'a>, SelectTimeoutError> {
        match Instant::now().checked_add(timeout) {
            Some(deadline) => self.select_deadline(deadline),
            None => match self.run(Mode::Forever, false) {
                Some(index) => Ok(SelectedOperation::new(self, index)),
                None => Err(SelectTimeoutError),
            },
        }
    }

    /// Wait until `deadline` at most for an operation to complete.
    #[track_caller]
    pub fn select_deadline(&mut self, deadline: Instant) -> Result<SelectedOperation<'_, 'a>, SelectTimeoutError> {
        match self.run(Mode::Until(deadline), false) {
            Some(index) => Ok(SelectedOperation::new(self, index)),
            None => Err(SelectTimeoutError),
        }
    }

    /// Wait until some operation is ready and return its index, without
    /// performing it (crossbeam's `ready`); the caller then does it, e.g.
    /// with `try_recv`, which may find it taken by another thread.
    ///
    /// A cancellation point: in a cancelled fiber it returns at once (after
    /// a yield) with an index whose operation may not be ready (a channel
    /// operation's, else the first one's), as a spurious wake-up would. A
    /// loop that retries after such a miss, as is usual with crossbeam,
    /// should also stop on [`fiber::is_cancelled()`](fiber_core::is_cancel_requested)
    /// (or use [`ready_timeout`](Self::ready_timeout), whose cancellation is
    /// an error); otherwise it runs until the runtime's shutdown unwinds it.
    ///
    /// ```
    /// # mod fiber { pub(crate) use fiber_chan as chan; pub use fiber_core::is_cancel_requested as is_cancelled; }
    /// use fiber::chan::{unbounded, Select};
    ///
    /// let (tx, rx) = unbounded::<u32>();
    /// tx.send(7).unwrap();
    /// let mut sel = Select::new();
    /// sel.recv(&rx);
    /// let value = loop {
    ///     let _index = sel.ready();
    ///     if let Ok(v) = rx.try_recv() {
    ///         break Some(v);
    ///     }
    ///     if fiber::is_cancelled() {
    ///         break None; // cancelled: the index was not a ready one
    ///     }
    /// };
    /// assert_eq!(value, Some(7));
    /// ```
    ///
    /// # Panics
    ///
    /// Panics if no operation was added.
    #[track_caller]
    pub fn ready(&mut self) -> usize {
        self.assert_live("ready");
        self.run(Mode::Block, true).expect("a blocking ready returns an index")
    }

    /// The index of an operation that is ready now, if any.
    pub fn try_ready(&mut self) -> Result<usize, TryReadyError> {
        self.run(Mode::Try, true).ok_or(TryReadyError)
    }

    /// Wait at most `timeout` for an operation to become ready.
    #[track_caller]
    pub fn ready_timeout(&mut self, timeout: Duration) -> Result<usize, ReadyTimeoutError> {
        match Instant::now().checked_add(timeout) {
            Some(deadline) => self.ready_deadline(deadline),
            None => self.run(Mode::Forever, true).ok_or(ReadyTimeoutError),
        }
    }

    /// Wait until `deadline` at most for an operation to become ready.
    #[track_caller]
    pub fn ready_deadline(&mut self, deadline: Instant) -> Result<usize, ReadyTimeoutError> {
        self.run(Mode::Until(deadline), true).ok_or(ReadyTimeoutError)
    }

    fn assert_live(&self, what: &str) {
        assert!(
            self.ops.iter().any(|op| !matches!(op.handle, Handle::Removed)),
            "Select::{what} (or select! without arms) called with no operations: it would block forever; add \
             an operation first"
        );
    }

    fn next_random(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// A uniform draw in `0..bound` (`bound` > 0), by
    /// multiply-and-shift (a 64-bit divide costs more than the rest of a
    /// ready select's first pass).
    fn random_below(&mut self, bound: usize) -> usize {
        ((u128::from(self.next_random()) * bound as u128) >> 64) as usize
    }

    /// Try every operation once, in a uniformly random order (in the order
    /// added for a biased select); the first that completes (or, with
    /// `ready_only`, is ready) wins. A random permutation, as Go's
    /// `pollorder` and crossbeam's shuffle: each ready operation is equally
    /// likely to be the first one met, whatever the others are (a random
    /// start with a linear scan favours an operation that follows
    /// operations that are not ready).
    fn try_pass(&mut self, ready_only: bool, since: Option<Instant>) -> Option<usize> {
        let n = self.ops.len();
        if self.biased || n <= 1 {
            return (0..n).find(|&i| self.ops[i].try_now(&self.group, ready_only, since));
        }
        if n == 2 {
            // A random start is already a uniform permutation of two.
            let first = self.random_below(2);
            return [first, 1 - first]
                .into_iter()
                .find(|&i| self.ops[i].try_now(&self.group, ready_only, since));
        }
        // Fisher-Yates, drawn lazily: the k-th operation tried is uniform
        // among those not tried yet.
        if n <= 8 {
            // Up to 8 (the common case): the order in a byte array, and one
            // 64-bit draw for all steps (each step takes the high word of
            // `x * (n - k)` and keeps the low word as the next draw: it
            // loses a few low bits per step, which the high word never
            // depends on for so few steps).
            let mut order: [u8; 8] = [0, 1, 2, 3, 4, 5, 6, 7];
            let mut x = self.next_random();
            for k in 0..n {
                let wide = u128::from(x) * (n - k) as u128;
                let j = k + (wide >> 64) as usize;
                x = wide as u64;
                order.swap(k, j);
                let i = usize::from(order[k]);
                if self.ops[i].try_now(&self.group, ready_only, since) {
                    return Some(i);
                }
            }
            return None;
        }
        let mut order: SmallVec<[usize; INLINE_OPS]> = (0..n).collect();
        for k in 0..n {
            let j = k + self.random_below(n - k);
            order.swap(k, j);
            let i = order[k];
            if self.ops[i].try_now(&self.group, ready_only, since) {
                return Some(i);
            }
        }
        None
    }

    #[track_caller]
    fn run(&mut self, mode: Mode, ready_only: bool) -> Option<usize> {
        // Every outcome of an earlier run was consumed or given back (by
        // `SelectedOperation`, or below for `ready`): nothing to clear.
        debug_assert!(self.ops.iter().all(|op| op.status == Status::Empty));
        // Before anything is reserved: the fiber's operation budget.
        fiber_core::coop_point();
        let index = self.run_inner(mode, ready_only);
        if ready_only {
            if let Some(i) = index {
                // `ready` reports an index; it holds nothing.
                self.ops[i].release();
            }
        }
        index
    }

    #[track_caller]
    fn run_inner(&mut self, mode: Mode, ready_only: bool) -> Option<usize> {
        let mut fired = None;
        let index = self.run_loop(mode, ready_only, &mut fired);
        if let Some(i) = fired {
            if index != Some(i) {
                // Woken through send arm `i` (told of room or of a waiting
                // receiver, which wakes one send arm at a time), it then
                // completed another operation: the room it was told of may
                // be unused, so the next parked send arm hears of it.
                self.ops[i].reoffer();
            }
        }
        index
    }

    /// `run_inner`'s loop; `fired` is the send arm whose wake (a probe)
    /// led to the last pass, if that pass found anything.
    #[track_caller]
    fn run_loop(&mut self, mode: Mode, ready_only: bool, fired: &mut Option<usize>) -> Option<usize> {
        // The parked-phase state of each operation, on this stack, made
        // only when the select parks (up to `INLINE_OPS` operations without
        // allocating); it stays put until the select returns, and its
        // nodes are unlinked before then (or by their drop, if the fiber
        // is unwound while parked).
        let mut parks: SmallVec<[ParkSlot<'a>; INLINE_OPS]> = SmallVec::new();
        // When the select began waiting (set at its first park): a tick
        // taken after a late wake-up keeps its schedule.
        let mut since: Option<Instant> = None;
        // Has this select parked (or slept) yet? A select whose timed park
        // ended at its deadline returns at once: the yield below is for a
        // select that never parked (`parks` stays empty for one with no
        // operation, which sleeps instead).
        let mut parked = false;
        loop {
            let n = self.ops.len();
            if let Some(i) = self.try_pass(ready_only, since) {
                if parks.is_empty() && self.ops[i].is_timer() {
                    // A timer arm already due, taken without parking: a
                    // yield point in a fiber, as a receive on a due timer
                    // channel is (`channel::sleep_until`). The usual
                    // `select! { recv(rx), recv(after(remaining)) }` loop
                    // otherwise held a fixed worker for ever once
                    // `remaining` reached zero. Fiber-core's zero wait
                    // yields and returns at once; the tick is ours already.
                    fiber_core::wait_until(Some(Instant::now()), Interrupt::NotCancellable);
                }
                return Some(i);
            }
            // Nothing ready: the room a probe was told of went to somebody
            // else meanwhile.
            *fired = None;
            let deadline = match mode {
                Mode::Try => {
                    // A poll that found nothing ready (`try_select`,
                    // `try_ready`, `select!`'s `default`): counts toward
                    // the fiber's budget yield.
                    fiber_core::poll_missed();
                    return None;
                }
                Mode::Block | Mode::Forever => None,
                Mode::Until(d) if Instant::now() >= d => {
                    // Timed out without parking: still a yield point in a
                    // fiber (a select with a zero timeout polled in a loop
                    // must let the fibers queued behind it run), through
                    // fiber-core's zero wait, which yields and returns at
                    // once. One that parked until its deadline has given
                    // the worker up already: a second turn through the
                    // yield queue made it the latest of the timed waits
                    // (`reviews/review67.rs`).
                    if !parked {
                        fiber_core::wait_until(Some(d), Interrupt::NotCancellable);
                    }
                    return None;
                }
                Mode::Until(d) => Some(d),
            };
            if since.is_none() && self.ops.iter().any(|op| op.deadline().is_some()) {
                since = Some(Instant::now());
            }
            let timer = self.ops.iter().filter_map(|op| op.deadline()).min();
            let wake_at = match (deadline, timer) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            if parks.is_empty() {
                parks.extend((0..n).map(|_| ParkSlot::empty()));
            }
            let mut order: SmallVec<[usize; INLINE_OPS]> = (0..n).collect();
            if !self.biased {
                for k in (1..n).rev() {
                    let j = self.random_below(k + 1);
                    order.swap(k, j);
                }
            }
            let mut wait = SelectWait {
                ops: &mut self.ops[..],
                parks: &mut parks[..],
                group: &self.group,
                order: &order,
                chosen: Cell::new(None),
                ready_only,
            };
            crate::sync::depth::assert_unlocked("fiber-chan: a select wait");
            let options = WaitOptions::new().deadline(wake_at).interrupt(Interrupt::Cancellable);
            parked = true;
            let result = if n == 0 {
                // Nothing to publish (`Select` with every operation removed
                // under a deadline): just wait.
                if sleep_until(wake_at) {
                    WaitResult::TimedOut
                } else {
                    WaitResult::Cancelled
                }
            } else {
                fiber_wait(&SelectWaitable(std::marker::PhantomData), &mut wait, options)
            };
            if let Some(i) = wait.chosen.get() {
                if self.ops[i].settled() {
                    return Some(i);
                }
                if !ready_only && self.ops[i].is_send() {
                    *fired = Some(i);
                }
                // A probe fired (a send arm, or any arm of `ready`): the
                // operation can proceed, but so may others. Go round: the
                // next pass picks among every ready operation in a random
                // order (two send arms on one rendezvous channel would
                // otherwise always give the receiver the first one queued).
                continue;
            }
            if result == WaitResult::Cancelled {
                return match mode {
                    Mode::Block => {
                        // A channel operation, else the first one not
                        // removed (a removed index is no operation).
                        let i = self
                            .ops
                            .iter()
                            .position(|op| op.is_channel())
                            .or_else(|| self.ops.iter().position(|op| !matches!(op.handle, Handle::Removed)))
                            .unwrap_or(0);
                        if !ready_only {
                            self.ops[i].fail();
                        }
                        Some(i)
                    }
                    _ => None,
                };
            }
            // Timed out, a timer is due, a retry, or spurious: go round.
        }
    }
}

/// The address of removed operations.
const REMOVED: usize = 1;

/// The operation a select completed; finish it with `recv` or `send` on the
/// same handle it was added with.
///
/// Dropping it without calling `recv` or `send` panics ("dropped without
/// completing the operation"), as in crossbeam: a received value it holds
/// is dropped, and a reservation it holds for a send is given back first,
/// so no peer waits for it. (While the thread is already panicking, it
/// only gives back; so does a `recv` or `send` that panics because it was
/// given the wrong handle.)
///
/// Two words, so that it is returned and passed in registers: a third
/// field (a completion flag) made every `select` hand it back through
/// memory, with a store-forwarding stall on the way.
#[must_use = "a selected operation must be completed with `recv` or `send` (dropping it uncompleted panics)"]
pub struct SelectedOperation<'s, 'a> {
    select: &'s mut Select<'a>,
    index: usize,
}

impl fmt::Debug for SelectedOperation<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SelectedOperation").field("index", &self.index).finish()
    }
}

/// What `select!` runs on: a select that owns itself and the index it
/// chose (`None`: none, for a `default` arm). Moving it into
/// [`recv`](Self::recv) or [`send`](Self::send) (or dropping it) ends every
/// borrow the select held, so the arm's body runs with the handles free: a
/// body may replace the channel it used. Not public API.
#[doc(hidden)]
pub struct __MacroSelect<'a> {
    select: Select<'a>,
    index: Option<usize>,
}

impl fmt::Debug for __MacroSelect<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("__MacroSelect").field("index", &self.index).finish()
    }
}

impl<'a> Select<'a> {
    /// `select!`'s blocking select (see [`__MacroSelect`]).
    #[doc(hidden)]
    #[track_caller]
    pub fn __select_owned(mut self) -> __MacroSelect<'a> {
        self.assert_live("select");
        let index = self.run(Mode::Block, false);
        debug_assert!(index.is_some(), "a blocking select returns an operation");
        __MacroSelect { select: self, index }
    }

    /// `select!`'s `default` arm: `try_select` (see [`__MacroSelect`]).
    #[doc(hidden)]
    pub fn __try_select_owned(mut self) -> __MacroSelect<'a> {
        let index = self.run(Mode::Try, false);
        __MacroSelect { select: self, index }
    }

    /// `select!`'s `default(timeout)` arm: `select_timeout` (see
    /// [`__MacroSelect`]).
    #[doc(hidden)]
    #[track_caller]
    pub fn __select_timeout_owned(mut self, timeout: Duration) -> __MacroSelect<'a> {
        let index = match Instant::now().checked_add(timeout) {
            Some(deadline) => self.run(Mode::Until(deadline), false),
            None => self.run(Mode::Forever, false),
        };
        __MacroSelect { select: self, index }
    }
}

impl<'a> __MacroSelect<'a> {
    /// The chosen index, `None` if none (a `default` arm runs).
    pub fn index(&self) -> Option<usize> {
        self.index
    }

    /// Complete the chosen receive, as [`SelectedOperation::recv`].
    #[track_caller]
    pub fn recv<T: 'a>(mut self, receiver: &Receiver<T>) -> Result<T, RecvError> {
        let index = self.index.expect("select! completes the operation it chose");
        SelectedOperation::new(&mut self.select, index).recv(receiver)
    }

    /// Complete the chosen send, as [`SelectedOperation::send`].
    #[track_caller]
    pub fn send<T: 'a>(mut self, sender: &Sender<T>, value: T) -> Result<(), SendError<T>> {
        let index = self.index.expect("select! completes the operation it chose");
        SelectedOperation::new(&mut self.select, index).send(sender, value)
    }
}

impl Drop for SelectedOperation<'_, '_> {
    fn drop(&mut self) {
        // Not completed (`recv` and `send` forget `self` once they consumed
        // the outcome).
        self.select.ops[self.index].release();
        if !std::thread::panicking() {
            panic!("dropped `SelectedOperation` without completing the operation");
        }
    }
}

impl<'s, 'a> SelectedOperation<'s, 'a> {
    fn new(select: &'s mut Select<'a>, index: usize) -> Self {
        SelectedOperation { select, index }
    }

    /// The index of the selected operation.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The result of the selected receive.
    ///
    /// # Panics
    ///
    /// Panics if `receiver` is not the receiver of the selected operation.
    pub fn recv<T: 'a>(mut self, receiver: &Receiver<T>) -> Result<T, RecvError> {
        let result = self.take_recv(receiver);
        // Completed: the outcome is consumed, nothing for `Drop` to give
        // back.
        std::mem::forget(self);
        if result.is_err() {
            // A failed arm (disconnected, or the select was cancelled)
            // returns at once: a loop that selects again is polling, and
            // counts toward the fiber's budget yield like `try_recv`.
            fiber_core::poll_missed();
        }
        result
    }

    fn take_recv<T: 'a>(&mut self, receiver: &Receiver<T>) -> Result<T, RecvError> {
        let op = &mut self.select.ops[self.index];
        let never = matches!(receiver.flavor, Flavor::Never);
        assert!(
            !op.is_send() && op.addr() == receiver.addr() && op.addr() != REMOVED,
            "SelectedOperation::recv: this receiver is not the one of the selected operation"
        );
        if never {
            // `never()` receivers share address 0 whatever their type; one
            // is selected only when the select was cancelled.
            op.release();
            return Err(RecvError);
        }
        match op.status {
            Status::Value => {
                op.status = Status::Empty;
                // SAFETY: the selected operation is a receive on the channel
                // at `receiver.addr()` (checked above, and not `never`,
                // whose address is shared); it was added by
                // `Select::recv::<T>` with a receiver of that channel, and a
                // channel has one element type, so its slot holds a `T`.
                Ok(unsafe { slot_take::<T>(&mut op.slot) })
            }
            Status::RecvFailed => {
                op.status = Status::Empty;
                Err(RecvError)
            }
            other => unreachable!("a selected receive holds a value or a failure, not {other:?}"),
        }
    }

    /// Complete the selected send with `value`: a receiver or a buffer slot
    /// was reserved for it when it was selected, so it does not block.
    /// `Err(SendError(value))` if the channel was disconnected (or the
    /// select was cancelled).
    ///
    /// # Panics
    ///
    /// Panics if `sender` is not the sender of the selected operation.
    pub fn send<T: 'a>(mut self, sender: &Sender<T>, value: T) -> Result<(), SendError<T>> {
        let result = self.give_send(sender, value);
        // Completed: as in `recv`.
        std::mem::forget(self);
        if result.is_err() {
            // As in `recv`.
            fiber_core::poll_missed();
        }
        result
    }

    fn give_send<T: 'a>(&mut self, sender: &Sender<T>, value: T) -> Result<(), SendError<T>> {
        let op = &mut self.select.ops[self.index];
        assert!(
            op.is_send() && op.addr() == Arc::as_ptr(&sender.chan) as *const () as usize,
            "SelectedOperation::send: this sender is not the one of the selected operation"
        );
        match op.status {
            Status::Reserved => {
                op.status = Status::Empty;
                // SAFETY: as in `recv`: a send operation on this channel was
                // added with a `Sender<T>`, so its slot holds the word of a
                // `Reservation<T>`, taken once here.
                let reservation = unsafe { Reservation::<T>::from_raw(slot_take::<usize>(&mut op.slot)) };
                let mut value = Some(value);
                match sender.chan.complete_reservation(reservation, &mut value) {
                    Ok(()) => Ok(()),
                    Err(()) => Err(SendError(value.expect("a failed send keeps its value"))),
                }
            }
            Status::SendFailed => {
                op.status = Status::Empty;
                Err(SendError(value))
            }
            other => unreachable!("a selected send holds a reservation or a failure, not {other:?}"),
        }
    }
}
