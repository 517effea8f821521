//! Waiting on several channel operations at once: the dynamic [`Select`]
//! builder and the [`select!`](crate::select!) macro.
//!
//! # Protocol
//!
//! 1. Try every operation once, starting at a random one (fairness).
//! 2. Otherwise publish one node per operation, all in one select group,
//!    and park. A peer that claims any node must first win the group by CAS
//!    (one winner per select, chosen before any wake); it skips nodes of a
//!    select that already has a winner.
//! 3. After waking, unlink every node from every channel (losers included)
//!    before returning; the winner's result is read under its channel lock.

use crate::chan::{Node, Reg, SelectGroup};
use crate::channel::{sleep_until, Flavor, Receiver, Sender, TimerChan};
use crate::error::{RecvError, SelectTimeoutError, SendError, TryRecvError, TrySelectError};
use fiber_core::{fiber_wait, Interrupt, Publish, WaitOptions, WaitResult, Waitable, Waiter};
use std::cell::Cell;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One operation of a select, type-erased.
trait Operation {
    /// Complete now if possible (with `ready_only`, only check readiness).
    fn try_now(&mut self, ready_only: bool) -> bool;
    /// Publish a node for the parked phase.
    fn register(&mut self, group: &SelectGroup, index: usize, waiter: &Waiter, ready_only: bool) -> Reg;
    /// Unlink the node; `true` if a peer completed the operation.
    fn unregister(&mut self) -> bool;
    /// A timer deadline this operation needs a wake-up for.
    fn deadline(&self) -> Option<Instant>;
    /// The channel's address (to check `SelectedOperation::recv` / `send`).
    fn addr(&self) -> usize;
    /// Is this a send operation?
    fn is_send(&self) -> bool;
}

struct RecvOp<'a, T> {
    receiver: &'a Receiver<T>,
    node: Option<Node<T>>,
    result: Option<Result<T, RecvError>>,
}

impl<T> Operation for RecvOp<'_, T> {
    fn try_now(&mut self, ready_only: bool) -> bool {
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
        let node = self.node.insert(Node::for_select(chan, None, ready_only, group, index));
        let reg = chan.register_recv(node, waiter);
        if let Reg::Completed(result) = reg {
            self.finish(result);
        }
        reg
    }

    fn unregister(&mut self) -> bool {
        let Flavor::Chan(chan) = &self.receiver.flavor else {
            return self.timer_fired();
        };
        let Some(node) = self.node.as_mut() else { return false };
        match chan.unregister(node) {
            Some(result) => {
                self.finish(result);
                true
            }
            None => false,
        }
    }

    fn deadline(&self) -> Option<Instant> {
        match &self.receiver.flavor {
            Flavor::Timer(timer, _) => timer.due(),
            _ => None,
        }
    }

    fn addr(&self) -> usize {
        self.receiver.addr()
    }

    fn is_send(&self) -> bool {
        false
    }
}

impl<T> RecvOp<'_, T> {
    fn finish(&mut self, result: WaitResult) {
        let value = self.node.as_mut().and_then(|n| n.take_value());
        self.result = Some(match (result, value) {
            (WaitResult::Ok, Some(value)) => Ok(value),
            _ => Err(RecvError),
        });
    }

    fn timer_fired(&mut self) -> bool {
        if let Flavor::Timer(timer, convert) = &self.receiver.flavor {
            if let Some(at) = TimerChan::try_take(timer, Instant::now()) {
                self.result = Some(Ok(convert(at)));
                return true;
            }
        }
        false
    }
}

struct SendOp<'a, T> {
    sender: &'a Sender<T>,
    /// `Some` for the macro (the value is sent iff selected); `None` for a
    /// readiness probe (the dynamic API sends after selection).
    value: Option<T>,
    probe: bool,
    node: Option<Node<T>>,
    result: Option<Result<(), SendError<T>>>,
}

impl<T> Operation for SendOp<'_, T> {
    fn try_now(&mut self, ready_only: bool) -> bool {
        if self.probe || ready_only {
            if self.sender.chan.is_send_ready() {
                self.result = Some(Ok(()));
                return true;
            }
            return false;
        }
        let value = self
            .value
            .take()
            .expect("a send operation holds its value until selected");
        match self.sender.try_send(value) {
            Ok(()) => self.result = Some(Ok(())),
            Err(crate::TrySendError::Disconnected(value)) => self.result = Some(Err(SendError(value))),
            Err(crate::TrySendError::Full(value)) => {
                self.value = Some(value);
                return false;
            }
        }
        true
    }

    fn register(&mut self, group: &SelectGroup, index: usize, waiter: &Waiter, ready_only: bool) -> Reg {
        let chan = &self.sender.chan;
        let probe = self.probe || ready_only;
        let value = if probe { None } else { self.value.take() };
        let node = self.node.insert(Node::for_select(chan, value, probe, group, index));
        let reg = chan.register_send(node, waiter);
        match reg {
            Reg::Completed(result) => self.finish(result),
            Reg::Lost | Reg::Retry => self.value = node.take_value(),
            Reg::Queued => {}
        }
        reg
    }

    fn unregister(&mut self) -> bool {
        let Some(node) = self.node.as_mut() else { return false };
        let outcome = self.sender.chan.unregister(node);
        match outcome {
            Some(result) => {
                self.finish(result);
                true
            }
            None => {
                self.value = self.node.as_mut().and_then(|n| n.take_value());
                false
            }
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
}

impl<T> SendOp<'_, T> {
    fn finish(&mut self, result: WaitResult) {
        let leftover = self
            .node
            .as_mut()
            .and_then(|n| n.take_value())
            .or_else(|| self.value.take());
        self.result = Some(match result {
            WaitResult::Ok => Ok(()),
            _ => Err(SendError(leftover.expect("a failed send keeps its value"))),
        });
        // A probe has no value; a failed probe reports readiness anyway.
    }
}

/// Park until any operation completes (the parked phase of a select).
struct SelectWait<'s, 'a> {
    ops: &'s mut Vec<Box<dyn Operation + 'a>>,
    group: &'s SelectGroup,
    chosen: Cell<Option<usize>>,
    retry: Cell<bool>,
    ready_only: bool,
}

impl SelectWait<'_, '_> {
    fn unregister_all(&mut self) -> Option<usize> {
        let mut winner = None;
        for (i, op) in self.ops.iter_mut().enumerate() {
            if op.unregister() && winner.is_none() {
                winner = Some(i);
            }
        }
        winner
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
        wait.group.reset();
        for i in 0..wait.ops.len() {
            match wait.ops[i].register(wait.group, i, waiter, wait.ready_only) {
                Reg::Queued => {}
                Reg::Completed(_) => {
                    wait.unregister_all();
                    wait.chosen.set(Some(i));
                    return Publish::Ready(WaitResult::Ok);
                }
                Reg::Lost => {
                    // A node registered earlier was completed by a peer.
                    let winner = wait.unregister_all();
                    wait.chosen.set(winner);
                    return Publish::Ready(WaitResult::Ok);
                }
                Reg::Retry => {
                    wait.unregister_all();
                    wait.retry.set(true);
                    return Publish::Ready(WaitResult::Ok);
                }
            }
        }
        Publish::Published
    }

    fn unpublish(&self, _: &Waiter, wait: &mut Self::Io) -> Option<WaitResult> {
        let winner = wait.unregister_all();
        if winner.is_some() {
            wait.chosen.set(winner);
        }
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
pub struct Select<'a> {
    ops: Vec<Box<dyn Operation + 'a>>,
    group: SelectGroup,
    rng: u64,
}

impl fmt::Debug for Select<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Select").field("operations", &self.ops.len()).finish()
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
    /// An empty select.
    pub fn new() -> Select<'a> {
        Select {
            ops: Vec::new(),
            group: SelectGroup::new(),
            rng: seed(),
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

    /// Add a send; returns its index. The select waits until the send can
    /// proceed; the value is given to [`SelectedOperation::send`].
    pub fn send<T>(&mut self, sender: &'a Sender<T>) -> usize {
        self.ops.push(Box::new(SendOp {
            sender,
            value: None,
            probe: true,
            node: None,
            result: None,
        }));
        self.ops.len() - 1
    }

    /// Add a send of `value` that happens if and only if this operation is
    /// selected (used by `select!`); returns its index.
    #[doc(hidden)]
    pub fn send_value<T>(&mut self, sender: &'a Sender<T>, value: T) -> usize {
        self.ops.push(Box::new(SendOp {
            sender,
            value: Some(value),
            probe: false,
            node: None,
            result: None,
        }));
        self.ops.len() - 1
    }

    /// Remove an operation (by index); later indices stay valid because the
    /// slot is kept as an operation that is never ready.
    pub fn remove(&mut self, index: usize) {
        assert!(
            index < self.ops.len(),
            "Select::remove: no operation with index {index}"
        );
        self.ops[index] = Box::new(RecvOp::<()> {
            receiver: never_ref(),
            node: None,
            result: None,
        });
    }

    /// Wait until one operation completes (blocks forever if none ever
    /// does).
    ///
    /// # Panics
    ///
    /// Panics if no operation was added: such a select could never return.
    pub fn select(&mut self) -> SelectedOperation<'_, 'a> {
        assert!(
            !self.ops.is_empty(),
            "Select::select called with no operations: it would block forever; add an operation first"
        );
        let index = self.run(Mode::Block).expect("a blocking select returns an operation");
        SelectedOperation { select: self, index }
    }

    /// Complete an operation that is ready now, if any.
    pub fn try_select(&mut self) -> Result<SelectedOperation<'_, 'a>, TrySelectError> {
        match self.run(Mode::Try) {
            Some(index) => Ok(SelectedOperation { select: self, index }),
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
        match self.run(Mode::Until(deadline)) {
            Some(index) => Ok(SelectedOperation { select: self, index }),
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
        assert!(
            !self.ops.is_empty(),
            "Select::ready called with no operations: it would block forever; add an operation first"
        );
        self.run_with(Mode::Block, true)
            .expect("a blocking ready returns an index")
    }

    /// The index of an operation that is ready now, if any.
    pub fn try_ready(&mut self) -> Result<usize, TrySelectError> {
        self.run_with(Mode::Try, true).ok_or(TrySelectError)
    }

    /// Wait at most `timeout` for an operation to become ready.
    pub fn ready_timeout(&mut self, timeout: Duration) -> Result<usize, crate::ReadyTimeoutError> {
        match Instant::now().checked_add(timeout) {
            Some(deadline) => self
                .run_with(Mode::Until(deadline), true)
                .ok_or(crate::ReadyTimeoutError),
            None => Ok(self.ready()),
        }
    }

    fn next_random(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    fn run(&mut self, mode: Mode) -> Option<usize> {
        self.run_with(mode, false)
    }

    fn run_with(&mut self, mode: Mode, ready_only: bool) -> Option<usize> {
        loop {
            let n = self.ops.len();
            if n > 0 {
                let start = (self.next_random() % n as u64) as usize;
                for k in 0..n {
                    let i = (start + k) % n;
                    if self.ops[i].try_now(ready_only) {
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
            if n == 0 {
                sleep_until(deadline);
                continue;
            }
            let timer = self.ops.iter().filter_map(|op| op.deadline()).min();
            let wake_at = match (deadline, timer) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let mut wait = SelectWait {
                ops: &mut self.ops,
                group: &self.group,
                chosen: Cell::new(None),
                retry: Cell::new(false),
                ready_only,
            };
            let options = WaitOptions::new()
                .deadline(wake_at)
                .interrupt(Interrupt::NotCancellable);
            let _ = fiber_wait(&SelectWaitable(std::marker::PhantomData), &mut wait, options);
            if let Some(i) = wait.chosen.get() {
                return Some(i);
            }
            // Timed out, a timer is due, a retry, or spurious: go round.
        }
    }
}

/// A receiver that never delivers, shared by removed operations.
fn never_ref() -> &'static Receiver<()> {
    static NEVER: Receiver<()> = Receiver { flavor: Flavor::Never };
    &NEVER
}

/// The operation a select completed; finish it with `recv` or `send` on the
/// same handle it was added with.
pub struct SelectedOperation<'s, 'a> {
    select: &'s mut Select<'a>,
    index: usize,
}

impl fmt::Debug for SelectedOperation<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SelectedOperation").field("index", &self.index).finish()
    }
}

impl<'s, 'a> SelectedOperation<'s, 'a> {
    /// The index of the selected operation.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The result of the selected receive.
    ///
    /// # Panics
    ///
    /// Panics if `receiver` is not the receiver of the selected operation.
    pub fn recv<T: 'a>(self, receiver: &Receiver<T>) -> Result<T, RecvError> {
        let op = &mut self.select.ops[self.index];
        assert!(
            !op.is_send() && op.addr() == receiver.addr() && receiver.addr() != 0,
            "SelectedOperation::recv: this receiver is not the one of the selected operation"
        );
        let op: *mut (dyn Operation + 'a) = &mut **op;
        // SAFETY: the selected operation is a receive on the channel at
        // `receiver.addr()` (checked above); it was created by
        // `Select::recv::<T>` on a receiver of that channel, and a channel
        // has one element type, so the operation is a `RecvOp<'a, T>`.
        let op = unsafe { &mut *(op as *mut RecvOp<'a, T>) };
        op.result.take().expect("the selected receive holds its result")
    }

    /// Complete the selected send with `value`. For an operation added with
    /// [`Select::send`] the send happens now (the channel was ready when it
    /// was selected); for `select!`'s sends it already happened.
    ///
    /// # Panics
    ///
    /// Panics if `sender` is not the sender of the selected operation.
    pub fn send<T: 'a>(self, sender: &Sender<T>, value: T) -> Result<(), SendError<T>> {
        let op = &mut self.select.ops[self.index];
        assert!(
            op.is_send() && op.addr() == Arc::as_ptr(&sender.chan) as *const () as usize,
            "SelectedOperation::send: this sender is not the one of the selected operation"
        );
        let op: *mut (dyn Operation + 'a) = &mut **op;
        // SAFETY: as in `recv`: a send operation on this channel is a
        // `SendOp<'a, T>`.
        let op = unsafe { &mut *(op as *mut SendOp<'a, T>) };
        if op.probe {
            op.result = None;
            return sender.send(value);
        }
        drop(value);
        op.result.take().expect("the selected send holds its result")
    }

    /// The result of a send added with `Select::send_value` (`select!`).
    #[doc(hidden)]
    pub fn send_result<T: 'a>(self, sender: &Sender<T>) -> Result<(), SendError<T>> {
        let op = &mut self.select.ops[self.index];
        assert!(op.is_send() && op.addr() == Arc::as_ptr(&sender.chan) as *const () as usize);
        let op: *mut (dyn Operation + 'a) = &mut **op;
        // SAFETY: as in `send`.
        let op = unsafe { &mut *(op as *mut SendOp<'a, T>) };
        op.result.take().expect("the selected send holds its result")
    }
}
