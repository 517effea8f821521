//! The public channel handles: [`bounded`], [`unbounded`], [`after`],
//! [`tick`], [`never`], [`Sender`] and [`Receiver`].

use crate::chan::{Chan, Try};
use crate::error::{RecvError, RecvTimeoutError, SendError, SendTimeoutError, TryRecvError, TrySendError};
use crate::sync::{lock, Mutex, Ordering};
use fiber_core::WaitResult;
use std::fmt;
use std::panic::{RefUnwindSafe, UnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A channel of capacity `cap`; `bounded(0)` is a rendezvous channel: a send
/// completes only when a receiver takes the value.
///
/// The buffer is allocated up front, as crossbeam's array channel does.
///
/// # Panics
///
/// Panics, naming the capacity, if `cap` slots cannot be addressed or
/// allocated (more than `isize::MAX` bytes, or a capacity past a quarter
/// of `usize::MAX`); an allocation that the system refuses aborts, as any
/// allocation does. Use [`unbounded`] for a channel without a limit.
#[track_caller]
pub fn bounded<T>(cap: usize) -> (Sender<T>, Receiver<T>) {
    crate::ring::check_capacity::<T>(cap);
    let chan = Arc::new(Chan::new(Some(cap)));
    (
        Sender { chan: chan.clone() },
        Receiver {
            flavor: Flavor::Chan(chan),
        },
    )
}

/// A channel without a capacity limit: sends never block.
pub fn unbounded<T>() -> (Sender<T>, Receiver<T>) {
    let chan = Arc::new(Chan::new(None));
    (
        Sender { chan: chan.clone() },
        Receiver {
            flavor: Flavor::Chan(chan),
        },
    )
}

/// A receiver that delivers one message after `duration`: the instant it
/// was due (creation plus `duration`), however late it is received.
pub fn after(duration: Duration) -> Receiver<Instant> {
    let at = Instant::now().checked_add(duration);
    Receiver {
        flavor: Flavor::Timer(Arc::new(TimerChan::new(at, None)), identity),
    }
}

/// A receiver that delivers one message at `when`: the message is `when`
/// itself (delivered at once if `when` is in the past).
pub fn at(when: Instant) -> Receiver<Instant> {
    Receiver {
        flavor: Flavor::Timer(Arc::new(TimerChan::new(Some(when), None)), identity),
    }
}

/// A receiver that delivers a message every `duration`: each message is
/// the instant it was due. A message not received is not queued up (at
/// most one is pending); after a late receive the next one is due
/// `duration` after that receive, as in crossbeam.
pub fn tick(duration: Duration) -> Receiver<Instant> {
    let at = Instant::now().checked_add(duration);
    Receiver {
        flavor: Flavor::Timer(Arc::new(TimerChan::new(at, Some(duration))), identity),
    }
}

/// A receiver that never delivers anything (a `select!` arm that never
/// fires).
pub fn never<T>() -> Receiver<T> {
    Receiver { flavor: Flavor::Never }
}

fn identity(at: Instant) -> Instant {
    at
}

/// A timer channel: the next delivery instant, `None` when exhausted.
pub(crate) struct TimerChan {
    next: Mutex<Option<Instant>>,
    period: Option<Duration>,
}

impl TimerChan {
    fn new(at: Option<Instant>, period: Option<Duration>) -> TimerChan {
        TimerChan {
            next: Mutex::new(at),
            period,
        }
    }

    /// When the next message is due.
    pub(crate) fn due(&self) -> Option<Instant> {
        *lock(&self.next)
    }

    /// Take the message if it is due. The message is the instant it was
    /// due (crossbeam: "the instant at which it is sent"; `at(when)`
    /// delivers `when`), not the instant it is received.
    pub(crate) fn try_take(&self, now: Instant) -> Option<Instant> {
        self.try_take_since(now, now)
    }

    /// [`try_take`](Self::try_take) by a receive that began waiting at
    /// `since`. The next tick is one period after the later of this
    /// delivery's due instant and `since`: a receive that was already
    /// waiting keeps the schedule (how late its wake-up came does not
    /// push the next tick back), a late one restarts the period from when
    /// it came, so ticks never pile up. As crossbeam's `tick`.
    pub(crate) fn try_take_since(&self, now: Instant, since: Instant) -> Option<Instant> {
        let mut next = lock(&self.next);
        let due = (*next)?;
        if due > now {
            return None;
        }
        *next = self.period.and_then(|p| due.max(since).checked_add(p));
        Some(due)
    }
}

/// Wait until `deadline` (or forever): park a fiber, block a thread.
/// `false` if cancelled first (a cancellation point). The fiber dump names
/// the user's call (a timer or `never` receive) as the wait's site. A
/// deadline already passed returns `true` at once, after a yield in a
/// fiber (fiber-core's zero wait), so a loop polling a timer channel lets
/// the fibers queued behind it run; not a cancellation point then (a due
/// timer's tick is taken even by a cancelled fiber, as a ready channel's
/// value is).
#[track_caller]
pub(crate) fn sleep_until(deadline: Option<Instant>) -> bool {
    crate::sync::depth::assert_unlocked("fiber-chan: a wait");
    if deadline.is_some_and(|d| d <= Instant::now()) {
        fiber_core::wait_until(deadline, fiber_core::Interrupt::NotCancellable);
        return true;
    }
    matches!(
        fiber_core::wait_until(deadline, fiber_core::Interrupt::Cancellable),
        WaitResult::TimedOut
    )
}

pub(crate) enum Flavor<T> {
    Chan(Arc<Chan<T>>),
    Timer(Arc<TimerChan>, fn(Instant) -> T),
    Never,
}

/// The sending half of a channel. Clone it for more producers; the channel
/// closes when the last `Sender` is dropped.
pub struct Sender<T> {
    pub(crate) chan: Arc<Chan<T>>,
}

/// The receiving half of a channel. Clone it for more consumers.
pub struct Receiver<T> {
    pub(crate) flavor: Flavor<T>,
}

impl<T> Sender<T> {
    /// Send, blocking while the channel is full (for a rendezvous channel:
    /// until a receiver takes the value). In a fiber this parks the fiber;
    /// on a plain thread it blocks the thread. Fails, returning the value,
    /// once the channel is closed or every receiver is gone.
    ///
    /// # Cancellation
    ///
    /// A cancellation point: a fiber cancelled while it waits gets
    /// `Err(SendError(value))` with its value, and nothing was sent (a
    /// hand-off a receiver already committed to completes: then the send
    /// returns `Ok`). Cancellation never closes the channel. Tell a
    /// cancelled send from a disconnected channel with
    /// `fiber::is_cancelled()` (or [`Sender::is_closed`]).
    #[track_caller]
    pub fn send(&self, value: T) -> Result<(), SendError<T>> {
        if budget_cancelled() {
            return Err(SendError(value));
        }
        // The value stays in this one slot until it moves to its place in
        // the channel (or comes back): see `spec/chan.md`, "Large values".
        let mut value = Some(value);
        match self.chan.send(&mut value, None) {
            Ok(()) => Ok(()),
            Err(_) => {
                // Disconnected or cancelled: such a send returns at once,
                // so a loop that retries it is polling (see `failed_wait`).
                failed_wait();
                Err(SendError(unsent(value)))
            }
        }
    }

    /// Send without blocking (never parks; in a fiber, a call that fails
    /// (the channel full or disconnected) counts toward the poll budget, and every
    /// `fiber_core::POLL_BUDGET` (128) such misses the fiber yields, so a
    /// loop that polls lets other fibers run.)
    pub fn try_send(&self, value: T) -> Result<(), TrySendError<T>> {
        fiber_core::coop_point();
        let mut value = Some(value);
        match self.chan.try_send(&mut value) {
            Ok(()) => Ok(()),
            Err(true) => {
                failed_wait();
                Err(TrySendError::Disconnected(unsent(value)))
            }
            Err(false) => {
                // A poll that found no room: counts toward the fiber's
                // budget yield (a fiber polling in a loop lets others run).
                fiber_core::poll_missed();
                Err(TrySendError::Full(unsent(value)))
            }
        }
    }

    /// Send, waiting at most `timeout`.
    #[track_caller]
    pub fn send_timeout(&self, value: T, timeout: Duration) -> Result<(), SendTimeoutError<T>> {
        // A timeout past the end of `Instant` waits without a deadline, but
        // keeps the timed form's errors (a cancelled wait is `Timeout`,
        // never `Disconnected`).
        self.send_until(value, Instant::now().checked_add(timeout))
    }

    /// Send, waiting until `deadline` at most. A fiber cancelled while it
    /// waits gets `Timeout` (with its value back; see [`Sender::send`]).
    #[track_caller]
    pub fn send_deadline(&self, value: T, deadline: Instant) -> Result<(), SendTimeoutError<T>> {
        self.send_until(value, Some(deadline))
    }

    /// The timed send; `None`: no deadline.
    #[track_caller]
    fn send_until(&self, value: T, deadline: Option<Instant>) -> Result<(), SendTimeoutError<T>> {
        if budget_cancelled() {
            return Err(SendTimeoutError::Timeout(value));
        }
        let mut value = Some(value);
        match self.chan.send(&mut value, deadline) {
            Ok(()) => Ok(()),
            Err(result) => {
                if result != WaitResult::TimedOut {
                    failed_wait();
                }
                if result == WaitResult::Closed {
                    Err(SendTimeoutError::Disconnected(unsent(value)))
                } else {
                    Err(SendTimeoutError::Timeout(unsent(value)))
                }
            }
        }
    }

    /// Close the channel: no send is admitted afterwards; buffered values
    /// and parked senders' values are still delivered; receivers then see
    /// `Disconnected`. Returns `false` if it was already closed.
    pub fn close(&self) -> bool {
        self.chan.close()
    }

    /// Is the channel closed (explicitly, by the last sender leaving, or by
    /// the last receiver leaving)?
    pub fn is_closed(&self) -> bool {
        self.chan.is_closed()
    }

    /// Values in the buffer.
    pub fn len(&self) -> usize {
        self.chan.len()
    }

    /// Is the buffer empty?
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Is the buffer full? (A rendezvous channel is always full.)
    pub fn is_full(&self) -> bool {
        self.chan.capacity().is_some_and(|cap| self.len() >= cap)
    }

    /// The capacity; `None` for an unbounded channel.
    pub fn capacity(&self) -> Option<usize> {
        self.chan.capacity()
    }

    /// Operations parked on the channel now: (receivers, senders). A racy
    /// snapshot for tests and diagnostics.
    #[doc(hidden)]
    pub fn waiting(&self) -> (usize, usize) {
        self.chan.waiting()
    }

    /// Wakes this channel has issued so far (a diagnostic: each parked
    /// operation woken counts once).
    #[doc(hidden)]
    pub fn wakes_issued(&self) -> usize {
        self.chan.wakes_issued()
    }

    /// Do both handles belong to one channel?
    pub fn same_channel(&self, other: &Sender<T>) -> bool {
        Arc::ptr_eq(&self.chan, &other.chan)
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        self.chan.senders.fetch_add(1, Ordering::Relaxed);
        Sender {
            chan: self.chan.clone(),
        }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        // AcqRel: the last sender's close sees every other sender's work.
        if self.chan.senders.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.chan.close();
        }
    }
}

impl<T> Receiver<T> {
    /// Receive, blocking while the channel is empty and open. In a fiber
    /// this parks the fiber; on a plain thread it blocks the thread. Fails
    /// once the channel is closed and empty.
    ///
    /// # Cancellation
    ///
    /// A cancellation point (timer and never channels included): a fiber
    /// cancelled while it waits gets `Err(RecvError)` and took nothing (a
    /// value a sender already handed over is returned). Cancellation never
    /// closes the channel; tell the two apart with `fiber::is_cancelled()`
    /// (or [`Receiver::is_closed`]).
    #[track_caller]
    pub fn recv(&self) -> Result<T, RecvError> {
        if budget_cancelled() {
            return Err(RecvError);
        }
        match &self.flavor {
            Flavor::Chan(chan) => {
                let mut out = None;
                match chan.recv(None, &mut out) {
                    Ok(()) => Ok(received(out)),
                    Err(_) => {
                        failed_wait();
                        Err(RecvError)
                    }
                }
            }
            Flavor::Timer(timer, convert) => loop {
                let since = Instant::now();
                // Wait for the due instant (forever when exhausted); a
                // cancellation ends the receive.
                if !sleep_until(timer.due()) {
                    failed_wait();
                    return Err(RecvError);
                }
                if let Some(at) = timer.try_take_since(Instant::now(), since) {
                    return Ok(convert(at));
                }
            },
            Flavor::Never => {
                let cancelled = !sleep_until(None);
                debug_assert!(cancelled, "a wait without a deadline ends only by cancellation");
                failed_wait();
                Err(RecvError)
            }
        }
    }

    /// Receive without blocking (never parks; in a fiber, a call that fails
    /// (the channel empty or disconnected) counts toward the poll budget, and every
    /// `fiber_core::POLL_BUDGET` (128) such misses the fiber yields, so a
    /// loop that polls lets other fibers run.)
    pub fn try_recv(&self) -> Result<T, TryRecvError> {
        fiber_core::coop_point();
        let result = self.try_recv_quiet();
        if result.is_err() {
            // A poll that found nothing: counts toward the fiber's budget
            // yield (a fiber polling in a loop lets others run).
            fiber_core::poll_missed();
        }
        result
    }

    /// [`try_recv`](Self::try_recv) without the poll accounting: a
    /// select's pass over its arms (its own miss is counted once, and it
    /// must not yield between arms).
    pub(crate) fn try_recv_quiet(&self) -> Result<T, TryRecvError> {
        let mut out = None;
        match &self.flavor {
            Flavor::Chan(chan) => match chan.try_recv(&mut out) {
                Try::Done => Ok(received(out)),
                Try::WouldBlock => Err(TryRecvError::Empty),
                Try::Disconnected => Err(TryRecvError::Disconnected),
            },
            Flavor::Timer(timer, convert) => timer.try_take(Instant::now()).map(convert).ok_or(TryRecvError::Empty),
            Flavor::Never => Err(TryRecvError::Empty),
        }
    }

    /// Receive, waiting at most `timeout`.
    #[track_caller]
    pub fn recv_timeout(&self, timeout: Duration) -> Result<T, RecvTimeoutError> {
        let now = Instant::now();
        match now.checked_add(timeout) {
            Some(deadline) => match &self.flavor {
                Flavor::Chan(chan) => {
                    if budget_cancelled() {
                        return Err(RecvTimeoutError::Timeout);
                    }
                    recv_timed_from(chan, deadline, now)
                }
                _ => self.recv_deadline(deadline),
            },
            // Past the end of `Instant`: no deadline, but the timed form's
            // errors (a cancelled wait is `Timeout`, never `Disconnected`).
            None => match &self.flavor {
                Flavor::Chan(chan) => {
                    if budget_cancelled() {
                        return Err(RecvTimeoutError::Timeout);
                    }
                    recv_timed(chan, None)
                }
                // Timer and never channels never disconnect: their receive
                // fails only when cancelled.
                Flavor::Timer(..) | Flavor::Never => self.recv().map_err(|_| RecvTimeoutError::Timeout),
            },
        }
    }

    /// Receive, waiting until `deadline` at most. A fiber cancelled while it
    /// waits gets `Timeout`.
    #[track_caller]
    pub fn recv_deadline(&self, deadline: Instant) -> Result<T, RecvTimeoutError> {
        if budget_cancelled() {
            return Err(RecvTimeoutError::Timeout);
        }
        match &self.flavor {
            Flavor::Chan(chan) => recv_timed_from(chan, deadline, Instant::now()),
            Flavor::Timer(timer, convert) => loop {
                let since = Instant::now();
                let until = timer.due().map_or(deadline, |due| due.min(deadline));
                let cancelled = !sleep_until(Some(until));
                if let Some(at) = timer.try_take_since(Instant::now(), since) {
                    return Ok(convert(at));
                }
                if cancelled || Instant::now() >= deadline {
                    return Err(RecvTimeoutError::Timeout);
                }
            },
            Flavor::Never => {
                sleep_until(Some(deadline));
                Err(RecvTimeoutError::Timeout)
            }
        }
    }

    /// A blocking iterator: yields until the channel is closed and empty
    /// (or the fiber is cancelled: each step is a [`Receiver::recv`]).
    pub fn iter(&self) -> Iter<'_, T> {
        Iter {
            receiver: self,
            done: false,
        }
    }

    /// A non-blocking iterator over what can be received now.
    pub fn try_iter(&self) -> TryIter<'_, T> {
        TryIter { receiver: self }
    }

    /// Close the channel (see [`Sender::close`]).
    pub fn close(&self) -> bool {
        match &self.flavor {
            Flavor::Chan(chan) => chan.close(),
            _ => false,
        }
    }

    /// Is the channel closed?
    pub fn is_closed(&self) -> bool {
        match &self.flavor {
            Flavor::Chan(chan) => chan.is_closed(),
            _ => false,
        }
    }

    /// Values in the buffer.
    pub fn len(&self) -> usize {
        match &self.flavor {
            Flavor::Chan(chan) => chan.len(),
            Flavor::Timer(timer, _) => usize::from(timer.due().is_some_and(|d| d <= Instant::now())),
            Flavor::Never => 0,
        }
    }

    /// Is the buffer empty?
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Is the buffer full?
    pub fn is_full(&self) -> bool {
        match &self.flavor {
            Flavor::Chan(chan) => chan.capacity().is_some_and(|cap| chan.len() >= cap),
            Flavor::Timer(..) => self.len() == 1,
            Flavor::Never => true,
        }
    }

    /// The capacity; `None` for an unbounded channel.
    pub fn capacity(&self) -> Option<usize> {
        match &self.flavor {
            Flavor::Chan(chan) => chan.capacity(),
            Flavor::Timer(..) => Some(1),
            Flavor::Never => Some(0),
        }
    }

    /// Do both handles belong to one channel?
    pub fn same_channel(&self, other: &Receiver<T>) -> bool {
        match (&self.flavor, &other.flavor) {
            (Flavor::Chan(a), Flavor::Chan(b)) => Arc::ptr_eq(a, b),
            (Flavor::Timer(a, _), Flavor::Timer(b, _)) => Arc::ptr_eq(a, b),
            (Flavor::Never, Flavor::Never) => true,
            _ => false,
        }
    }

    /// Address identifying the channel (select bookkeeping).
    pub(crate) fn addr(&self) -> usize {
        match &self.flavor {
            Flavor::Chan(chan) => Arc::as_ptr(chan) as *const () as usize,
            Flavor::Timer(timer, _) => Arc::as_ptr(timer) as *const () as usize,
            Flavor::Never => 0,
        }
    }
}

impl<T> Clone for Receiver<T> {
    fn clone(&self) -> Self {
        let flavor = match &self.flavor {
            Flavor::Chan(chan) => {
                chan.receivers.fetch_add(1, Ordering::Relaxed);
                Flavor::Chan(chan.clone())
            }
            Flavor::Timer(timer, convert) => Flavor::Timer(timer.clone(), *convert),
            Flavor::Never => Flavor::Never,
        };
        Receiver { flavor }
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        if let Flavor::Chan(chan) = &self.flavor {
            // AcqRel: the last receiver's disconnect sees the others' work.
            if chan.receivers.fetch_sub(1, Ordering::AcqRel) == 1 {
                chan.disconnect_receivers();
            }
        }
    }
}

// As in crossbeam: a panic never leaves a channel broken (its lock guards
// only pointer moves; user code, such as a value's destructor or a send
// arm's value expression, runs outside it), so the handles may cross a
// `catch_unwind` boundary as they are.
impl<T> UnwindSafe for Sender<T> {}
impl<T> RefUnwindSafe for Sender<T> {}
impl<T> UnwindSafe for Receiver<T> {}
impl<T> RefUnwindSafe for Receiver<T> {}

impl<T> fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad("Sender { .. }")
    }
}

impl<T> fmt::Debug for Receiver<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad("Receiver { .. }")
    }
}

/// Blocking iterator of a [`Receiver`].
pub struct Iter<'a, T> {
    receiver: &'a Receiver<T>,
    /// Returned `None` once: fused (a cancelled receive fails, but the
    /// channel may still deliver later).
    done: bool,
}

// Printed as crossbeam prints them, without requiring `T: Debug`.
impl<T> fmt::Debug for Iter<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad("Iter { .. }")
    }
}

impl<T> fmt::Debug for TryIter<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad("TryIter { .. }")
    }
}

impl<T> fmt::Debug for IntoIter<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad("IntoIter { .. }")
    }
}

impl<T> Iterator for Iter<'_, T> {
    type Item = T;
    // The dump names the user's `for` loop as the wait's site.
    #[track_caller]
    fn next(&mut self) -> Option<T> {
        if self.done {
            return None;
        }
        let next = self.receiver.recv().ok();
        self.done = next.is_none();
        next
    }
}

// Disconnection is for good; a cancelled receive is not (the channel may
// deliver to a later receive), so the iterator remembers its first `None`.
impl<T> std::iter::FusedIterator for Iter<'_, T> {}

/// Non-blocking iterator of a [`Receiver`].
pub struct TryIter<'a, T> {
    receiver: &'a Receiver<T>,
}

impl<T> Iterator for TryIter<'_, T> {
    type Item = T;
    fn next(&mut self) -> Option<T> {
        self.receiver.try_recv().ok()
    }
}

/// Owning blocking iterator of a [`Receiver`].
pub struct IntoIter<T> {
    receiver: Receiver<T>,
    /// As in [`Iter`].
    done: bool,
}

impl<T> Iterator for IntoIter<T> {
    type Item = T;
    #[track_caller]
    fn next(&mut self) -> Option<T> {
        if self.done {
            return None;
        }
        let next = self.receiver.recv().ok();
        self.done = next.is_none();
        next
    }
}

impl<T> std::iter::FusedIterator for IntoIter<T> {}

impl<'a, T> IntoIterator for &'a Receiver<T> {
    type Item = T;
    type IntoIter = Iter<'a, T>;
    fn into_iter(self) -> Iter<'a, T> {
        self.iter()
    }
}

impl<T> IntoIterator for Receiver<T> {
    type Item = T;
    type IntoIter = IntoIter<T>;
    fn into_iter(self) -> IntoIter<T> {
        IntoIter {
            receiver: self,
            done: false,
        }
    }
}

/// A blocking operation failed without waiting its time out: the channel
/// is disconnected, or the fiber is cancelled. Either holds for every
/// later try as well, so a loop that retries is polling: it counts toward
/// the fiber's budget yield as a `try_recv` miss does
/// (`fiber_core::poll_missed`), and a retry loop lets the fibers queued
/// behind it run, the one that would end the loop included.
fn failed_wait() {
    fiber_core::poll_missed();
}

/// The fiber's operation budget (`fiber_core::coop_point_cancellable`) at
/// the start of a blocking operation: every `fiber_core::OP_BUDGET` (128)
/// operations in a row that did not switch away, the fiber yields here,
/// and if it is cancelled the operation ends as cancelled without being
/// made (as if it had waited; a failed wait, so a loop that retries it is
/// polling). A loop on a channel that never makes it wait (a thread keeps
/// it full) thus lets the fibers beside it run, and sees its cancellation.
#[inline]
fn budget_cancelled() -> bool {
    if fiber_core::coop_point_cancellable() {
        failed_wait();
        return true;
    }
    false
}

/// Is the calling fiber's cancellation requested? (Never under loom: the
/// models run no fibers.)
fn cancel_requested() -> bool {
    #[cfg(not(loom))]
    {
        fiber_core::is_cancel_requested()
    }
    #[cfg(loom)]
    {
        false
    }
}

/// The value a failed send left in its slot.
fn unsent<T>(value: Option<T>) -> T {
    value.expect("a failed send keeps its value")
}

/// The value a completed receive moved into its slot.
fn received<T>(out: Option<T>) -> T {
    out.expect("a completed receive holds its value")
}

/// A timed receive of a channel (`None`: no deadline, with the timed
/// form's errors). The value moves into this function's one slot; a
/// large value costs the stack few copies (`spec/chan.md`, "Large
/// values").
#[track_caller]
/// A receive with `deadline`, read at `now`. One already passed (a zero
/// timeout) is a poll first, as `try_recv`: that waits briefly for the
/// value of a select's send arm it woke, where the wait's own zero-time
/// path returns at once, so a loop polling with a zero timeout against a
/// select blocked on a send arm woke that arm for ever and never got its
/// value (crossbeam's gets it at once). Then the zero-time wait (a yield
/// point in a fiber) reports the timeout. A cancelled fiber takes the wait
/// path as before.
fn recv_timed_from<T>(chan: &Chan<T>, deadline: Instant, now: Instant) -> Result<T, RecvTimeoutError> {
    if deadline <= now && !cancel_requested() {
        let mut out = None;
        match chan.try_recv(&mut out) {
            Try::Done => return Ok(received(out)),
            Try::Disconnected => {
                failed_wait();
                return Err(RecvTimeoutError::Disconnected);
            }
            Try::WouldBlock => {}
        }
    }
    recv_timed(chan, Some(deadline))
}

fn recv_timed<T>(chan: &Chan<T>, deadline: Option<Instant>) -> Result<T, RecvTimeoutError> {
    let mut out = None;
    match chan.recv(deadline, &mut out) {
        Ok(()) => Ok(received(out)),
        Err(result) => {
            if result != WaitResult::TimedOut {
                failed_wait();
            }
            if result == WaitResult::Closed {
                Err(RecvTimeoutError::Disconnected)
            } else {
                Err(RecvTimeoutError::Timeout)
            }
        }
    }
}
