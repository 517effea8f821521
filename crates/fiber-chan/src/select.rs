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
use crate::error::{ReadyTimeoutError, RecvError, SelectTimeoutError, SendError, TryRecvError, TrySelectError};
use fiber_core::{fiber_wait, Interrupt, Publish, WaitOptions, WaitResult, Waitable, Waiter};
use std::cell::Cell;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One operation of a select, type-erased.
trait Operation {
    /// Complete now if possible (a send reserves); with `ready_only`, only
    /// check readiness.
    fn try_now(&mut self, group: &SelectGroup, ready_only: bool) -> bool;
    /// Publish a node for the parked phase (timers and `never`: none).
    fn register(&mut self, group: &SelectGroup, index: usize, waiter: &Waiter, ready_only: bool) -> Reg;
    /// Unlink the node; what a peer did to it, if anything.
    fn unregister(&mut self) -> Option<WaitResult>;
    /// This operation won with `result` (read from its node).
    fn finish(&mut self, result: WaitResult);
    /// Has a result for `SelectedOperation` (a send arm woken by its probe
    /// still has to reserve).
    fn settled(&self) -> bool;
    /// The select was cancelled and picked this operation: it fails.
    fn fail(&mut self);
    /// Forget any result; give a reservation back.
    fn release(&mut self);
    /// A timer deadline this operation needs a wake-up for.
    fn deadline(&self) -> Option<Instant>;
    /// The channel's address (to check `SelectedOperation::recv` / `send`).
    fn addr(&self) -> usize;
    /// Is this a send operation?
    fn is_send(&self) -> bool;
    /// Is this an operation on a real channel (not a timer or `never`)?
    fn is_channel(&self) -> bool;
}

struct RecvOp<'a, T> {
    receiver: &'a Receiver<T>,
    node: Option<Node<T>>,
    result: Option<Result<T, RecvError>>,
}

impl<T> Operation for RecvOp<'_, T> {
    fn try_now(&mut self, _: &SelectGroup, ready_only: bool) -> bool {
        if ready_only {
            return match &self.receiver.flavor {
                Flavor::Chan(chan) => chan.is_recv_ready(),
                Flavor::Timer(timer, _) => timer.due().is_some_and(|d| d <= Instant::now()),
                Flavor::Never => false,
            };
        }
        match self.receiver.try_recv() {
            Ok(value) => self.result = Some(Ok(value)),
            Err(TryRecvError::Disconnected) => self.result = Some(Err(RecvError)),
            Err(TryRecvError::Empty) => return false,
        }
        true
    }

    fn register(&mut self, group: &SelectGroup, index: usize, waiter: &Waiter, ready_only: bool) -> Reg {
        let Flavor::Chan(chan) = &self.receiver.flavor else {
            return Reg::Queued;
        };
        let node = self.node.insert(Node::for_select(chan, ready_only, group, index));
        chan.register_recv(node, waiter)
    }

    fn unregister(&mut self) -> Option<WaitResult> {
        let Flavor::Chan(chan) = &self.receiver.flavor else {
            return None;
        };
        let node = self.node.as_mut()?;
        chan.unregister(node)
    }

    fn finish(&mut self, result: WaitResult) {
        let value = self.node.as_mut().and_then(|n| n.take_value());
        self.result = Some(match (result, value) {
            (WaitResult::Ok, Some(value)) => Ok(value),
            _ => Err(RecvError),
        });
    }

    fn settled(&self) -> bool {
        self.result.is_some()
    }

    fn fail(&mut self) {
        self.result = Some(Err(RecvError));
    }

    fn release(&mut self) {
        self.result = None;
    }

    fn deadline(&self) -> Option<Instant> {
        match &self.receiver.flavor {
            Flavor::Timer(timer, _) => timer.due(),
            _ => None,
        }
    }

    fn addr(&self) -> usize {
        let me = self.receiver as *const Receiver<T> as *const () as usize;
        if me == removed_ref() as *const Receiver<()> as *const () as usize {
            REMOVED
        } else {
            self.receiver.addr()
        }
    }

    fn is_send(&self) -> bool {
        false
    }

    fn is_channel(&self) -> bool {
        matches!(self.receiver.flavor, Flavor::Chan(_))
    }
}

/// What a selected send arm holds until its value is given.
enum SendOutcome<T> {
    /// A receiver or a buffer slot is reserved for the value.
    Reserved(Reservation<T>),
    /// Ready for `Select::ready` (nothing reserved).
    Ready,
    /// Disconnected (or the select was cancelled): the send fails.
    Failed,
}

struct SendOp<'a, T> {
    sender: &'a Sender<T>,
    node: Option<Node<T>>,
    outcome: Option<SendOutcome<T>>,
}

impl<T> Operation for SendOp<'_, T> {
    fn try_now(&mut self, group: &SelectGroup, ready_only: bool) -> bool {
        if ready_only {
            if self.sender.chan.is_send_ready() {
                self.outcome = Some(SendOutcome::Ready);
                return true;
            }
            return false;
        }
        match self.sender.chan.try_reserve(group) {
            Ok(Some(reservation)) => self.outcome = Some(SendOutcome::Reserved(reservation)),
            Ok(None) => return false,
            Err(()) => self.outcome = Some(SendOutcome::Failed),
        }
        true
    }

    fn register(&mut self, group: &SelectGroup, index: usize, waiter: &Waiter, _: bool) -> Reg {
        let chan = &self.sender.chan;
        let node = self.node.insert(Node::for_select(chan, true, group, index));
        chan.register_send(node, waiter)
    }

    fn unregister(&mut self) -> Option<WaitResult> {
        let node = self.node.as_mut()?;
        self.sender.chan.unregister(node)
    }

    fn finish(&mut self, result: WaitResult) {
        // The probe fired: the send can proceed (it reserves next), or the
        // channel is disconnected.
        if result != WaitResult::Ok {
            self.outcome = Some(SendOutcome::Failed);
        }
    }

    fn settled(&self) -> bool {
        self.outcome.is_some()
    }

    fn fail(&mut self) {
        self.release();
        self.outcome = Some(SendOutcome::Failed);
    }

    fn release(&mut self) {
        if let Some(SendOutcome::Reserved(reservation)) = self.outcome.take() {
            self.sender.chan.release_reservation(reservation);
        }
    }

    fn deadline(&self) -> Option<Instant> {
        None
    }

    fn addr(&self) -> usize {
        Arc::as_ptr(&self.sender.chan) as *const () as usize
    }

    fn is_send(&self) -> bool {
        true
    }

    fn is_channel(&self) -> bool {
        true
    }
}

/// Park until any operation completes (the parked phase of a select).
struct SelectWait<'s, 'a> {
    ops: &'s mut Vec<Box<dyn Operation + 'a>>,
    group: &'s SelectGroup,
    chosen: Cell<Option<usize>>,
    ready_only: bool,
}

impl SelectWait<'_, '_> {
    /// Unlink every node; the winner is the group's CAS winner, and only it
    /// reads a result (PITFALLS 16: losers never consume).
    fn unregister_all(&mut self) -> Option<usize> {
        let mut won = None;
        for (i, op) in self.ops.iter_mut().enumerate() {
            if let Some(result) = op.unregister() {
                debug_assert!(won.is_none(), "two operations of one select completed");
                won = Some((i, result));
            }
        }
        let (i, result) = won?;
        debug_assert_eq!(self.group.winner(), Some(i), "a completed node is its group's winner");
        self.ops[i].finish(result);
        Some(i)
    }
}

/// The parked phase as a fiber-core waitable; its io is the select state.
struct SelectWaitable<'s, 'a>(std::marker::PhantomData<(&'s (), &'a ())>);

impl<'s, 'a: 's> Waitable for SelectWaitable<'s, 'a> {
    type Io = SelectWait<'s, 'a>;

    fn try_complete(&self, _: &mut Self::Io) -> Option<WaitResult> {
        None
    }

    fn publish(&self, waiter: &Waiter, wait: &mut Self::Io) -> Publish {
        // No node of this group is queued now: the reset races with nobody.
        wait.group.reset();
        for i in 0..wait.ops.len() {
            match wait.ops[i].register(wait.group, i, waiter, wait.ready_only) {
                Reg::Queued => {}
                Reg::Completed(result) => {
                    let other = wait.unregister_all();
                    debug_assert!(other.is_none(), "the group had one winner");
                    wait.ops[i].finish(result);
                    wait.chosen.set(Some(i));
                    return Publish::Ready(WaitResult::Ok);
                }
                Reg::Lost | Reg::Retry => {
                    // Lost: a peer completed a node registered earlier.
                    // Retry: nothing to take after all; go round.
                    let winner = wait.unregister_all();
                    wait.chosen.set(winner);
                    return Publish::Ready(WaitResult::Ok);
                }
            }
        }
        Publish::Published
    }

    fn unpublish(&self, _: &Waiter, wait: &mut Self::Io) -> Option<WaitResult> {
        let winner = wait.unregister_all();
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
}

/// A dynamic set of channel operations to wait on (crossbeam's `Select`).
///
/// ```
/// use fiber_chan::{unbounded, Select};
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
/// channel (the first operation if there is none), which fails as if
/// disconnected: `recv` gives `Err(RecvError)` and took nothing, `send`
/// gives the value back in `Err(SendError(v))`. `select_timeout` /
/// `select_deadline` / `ready_timeout` report a timeout instead. An
/// operation a peer already committed to completes normally. Tell the cases
/// apart with `fiber::is_cancelled()`.
pub struct Select<'a> {
    ops: Vec<Box<dyn Operation + 'a>>,
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
    // Not a protocol: a per-process counter mixed into each select's seed.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0x9E37_79B9_7F4A_7C15);
    NEXT.fetch_add(0x6A09_E667_F3BC_C909, std::sync::atomic::Ordering::Relaxed) | 1
}

impl<'a> Select<'a> {
    /// An empty select; when several operations are ready, one is picked at
    /// random.
    pub fn new() -> Select<'a> {
        Select {
            ops: Vec::new(),
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

    /// Add a receive; returns its index.
    pub fn recv<T>(&mut self, receiver: &'a Receiver<T>) -> usize {
        self.ops.push(Box::new(RecvOp {
            receiver,
            node: None,
            result: None,
        }));
        self.ops.len() - 1
    }

    /// Add a send; returns its index. When it is selected, a receiver or a
    /// buffer slot is already reserved for it, and the value is given to
    /// [`SelectedOperation::send`] (so it is produced only if this
    /// operation is selected).
    pub fn send<T>(&mut self, sender: &'a Sender<T>) -> usize {
        self.ops.push(Box::new(SendOp {
            sender,
            node: None,
            outcome: None,
        }));
        self.ops.len() - 1
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
        self.ops[index] = Box::new(RecvOp::<()> {
            receiver: removed_ref(),
            node: None,
            result: None,
        });
    }

    /// Wait until one operation completes (blocks forever if none ever
    /// does; see the type's docs for cancellation).
    ///
    /// # Panics
    ///
    /// Panics if no operation was added: such a select could never return.
    pub fn select(&mut self) -> SelectedOperation<'_, 'a> {
        self.assert_live("select");
        let index = self
            .run(Mode::Block, false)
            .expect("a blocking select returns an operation");
        SelectedOperation::new(self, index)
    }

    /// Complete an operation that is ready now, if any.
    pub fn try_select(&mut self) -> Result<SelectedOperation<'_, 'a>, TrySelectError> {
        match self.run(Mode::Try, false) {
            Some(index) => Ok(SelectedOperation::new(self, index)),
            None => Err(TrySelectError),
        }
    }

    /// Wait at most `timeout` for an operation to complete.
    pub fn select_timeout(&mut self, timeout: Duration) -> Result<SelectedOperation<'_, 'a>, SelectTimeoutError> {
        match Instant::now().checked_add(timeout) {
            Some(deadline) => self.select_deadline(deadline),
            None => Ok(self.select()),
        }
    }

    /// Wait until `deadline` at most for an operation to complete.
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
    /// # Panics
    ///
    /// Panics if no operation was added.
    pub fn ready(&mut self) -> usize {
        self.assert_live("ready");
        self.run(Mode::Block, true).expect("a blocking ready returns an index")
    }

    /// The index of an operation that is ready now, if any.
    pub fn try_ready(&mut self) -> Result<usize, TrySelectError> {
        self.run(Mode::Try, true).ok_or(TrySelectError)
    }

    /// Wait at most `timeout` for an operation to become ready.
    pub fn ready_timeout(&mut self, timeout: Duration) -> Result<usize, ReadyTimeoutError> {
        match Instant::now().checked_add(timeout) {
            Some(deadline) => self.ready_deadline(deadline),
            None => Ok(self.ready()),
        }
    }

    /// Wait until `deadline` at most for an operation to become ready.
    pub fn ready_deadline(&mut self, deadline: Instant) -> Result<usize, ReadyTimeoutError> {
        self.run(Mode::Until(deadline), true).ok_or(ReadyTimeoutError)
    }

    fn assert_live(&self, what: &str) {
        assert!(
            self.ops.iter().any(|op| op.addr() != REMOVED),
            "Select::{what} called with no operations: it would block forever; add an operation first"
        );
    }

    fn next_random(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    fn run(&mut self, mode: Mode, ready_only: bool) -> Option<usize> {
        for op in self.ops.iter_mut() {
            op.release();
        }
        loop {
            let n = self.ops.len();
            if n > 0 {
                let start = if self.biased {
                    0
                } else {
                    (self.next_random() % n as u64) as usize
                };
                for k in 0..n {
                    let i = (start + k) % n;
                    if self.ops[i].try_now(&self.group, ready_only) {
                        return Some(i);
                    }
                }
            }
            let deadline = match mode {
                Mode::Try => return None,
                Mode::Block => None,
                Mode::Until(d) if Instant::now() >= d => return None,
                Mode::Until(d) => Some(d),
            };
            let timer = self.ops.iter().filter_map(|op| op.deadline()).min();
            let wake_at = match (deadline, timer) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let mut wait = SelectWait {
                ops: &mut self.ops,
                group: &self.group,
                chosen: Cell::new(None),
                ready_only,
            };
            crate::sync::depth::assert_unlocked("fiber-chan: a select wait");
            let options = WaitOptions::new().deadline(wake_at).interrupt(Interrupt::Cancellable);
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
                // A send arm woken by its probe reserves now; if the
                // chance passed, go round.
                if ready_only || self.ops[i].settled() || self.ops[i].try_now(&self.group, false) {
                    return Some(i);
                }
                continue;
            }
            if result == WaitResult::Cancelled {
                return match mode {
                    Mode::Block => {
                        let i = self.ops.iter().position(|op| op.is_channel()).unwrap_or(0);
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

/// A receiver that never delivers, standing in for removed operations.
fn removed_ref() -> &'static Receiver<()> {
    static REMOVED_OP: Receiver<()> = Receiver { flavor: Flavor::Never };
    &REMOVED_OP
}

/// The operation a select completed; finish it with `recv` or `send` on the
/// same handle it was added with.
///
/// Dropping it without calling `recv` or `send` panics ("dropped without
/// completing the operation"), as in crossbeam: a received value it holds
/// is dropped, and a reservation it holds for a send is given back first,
/// so no peer waits for it. (While the thread is already panicking, it
/// only gives back.)
pub struct SelectedOperation<'s, 'a> {
    select: &'s mut Select<'a>,
    index: usize,
    completed: bool,
}

impl fmt::Debug for SelectedOperation<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SelectedOperation").field("index", &self.index).finish()
    }
}

impl Drop for SelectedOperation<'_, '_> {
    fn drop(&mut self) {
        if self.completed {
            return;
        }
        self.select.ops[self.index].release();
        if !std::thread::panicking() {
            panic!("dropped `SelectedOperation` without completing the operation");
        }
    }
}

impl<'s, 'a> SelectedOperation<'s, 'a> {
    fn new(select: &'s mut Select<'a>, index: usize) -> Self {
        SelectedOperation {
            select,
            index,
            completed: false,
        }
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
        self.completed = true;
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
        let op: *mut (dyn Operation + 'a) = &mut **op;
        // SAFETY: the selected operation is a receive on the channel at
        // `receiver.addr()` (checked above, and not `never`, whose address
        // is shared); it was created by `Select::recv::<T>` on a receiver of
        // that channel, and a channel has one element type, so the
        // operation is a `RecvOp<'a, T>`.
        let op = unsafe { &mut *(op as *mut RecvOp<'a, T>) };
        op.result.take().expect("the selected receive holds its result")
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
        self.completed = true;
        let op = &mut self.select.ops[self.index];
        assert!(
            op.is_send() && op.addr() == Arc::as_ptr(&sender.chan) as *const () as usize,
            "SelectedOperation::send: this sender is not the one of the selected operation"
        );
        let op: *mut (dyn Operation + 'a) = &mut **op;
        // SAFETY: as in `recv`: a send operation on this channel is a
        // `SendOp<'a, T>`.
        let op = unsafe { &mut *(op as *mut SendOp<'a, T>) };
        match op.outcome.take() {
            Some(SendOutcome::Reserved(reservation)) => {
                sender.chan.complete_reservation(reservation, value).map_err(SendError)
            }
            Some(SendOutcome::Failed) => Err(SendError(value)),
            Some(SendOutcome::Ready) | None => unreachable!("a selected send holds a reservation or a failure"),
        }
    }
}
