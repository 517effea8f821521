//! Per-socket readiness: the part of the I/O protocol that fibers, threads
//! and the poller race on (spec/net.md, "Readiness vs park").
//!
//! Each registered socket has one [`Readiness`]. For each direction (read,
//! write) it keeps a *readiness sequence*: the number of readiness events
//! the poller has delivered for that direction. An operation:
//!
//! 1. takes a snapshot of the sequence,
//! 2. tries the non-blocking system call,
//! 3. on `WouldBlock`, waits through `fiber_wait` with the snapshot; the
//!    waitable's `publish` compares the sequence with the snapshot **under
//!    the same lock the poller bumps it with**: if an event arrived since
//!    step 1 the wait ends at once (retry), otherwise the waiter is stored
//!    and the next bump wakes it.
//!
//! The sockets are registered edge-triggered, so an event that arrives
//! between the `WouldBlock` of step 2 and the publication of step 3 is
//! never repeated by the kernel: without the re-check in `publish` that
//! event would be lost and the waiter would sleep forever (the loom model
//! `loom_readiness_vs_park` shows it).

use crate::sync::{lock, AtomicBool, AtomicUsize, Mutex, Ordering};
use fiber_core::{fiber_wait, fiber_wake, Cancelled, Publish, WaitOptions, WaitResult, Waitable, Waiter};
use std::io;
use std::sync::Arc;
use std::time::Instant;

/// `Readiness::read_drained` when no short read is on record.
const NOT_DRAINED: usize = usize::MAX;

/// Index of the read direction.
pub(crate) const READ: usize = 0;
/// Index of the write direction.
pub(crate) const WRITE: usize = 1;

/// Waiters currently parked on a socket, process-wide (diagnostics only:
/// not part of any protocol, so a plain std atomic).
static IO_WAITERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Fibers and threads parked on a socket of this crate right now
/// (published waiters). A wait that is being published or has just been
/// woken may or may not be counted.
pub fn io_waiters() -> usize {
    IO_WAITERS.load(std::sync::atomic::Ordering::Relaxed)
}

/// What a waiter waits for, as a type: fiber-core names the waitable's type
/// in fiber dumps and stall reports, so a fiber parked on a socket shows as
/// e.g. `ReadyWait<fiber_net::readiness::op::Accept>`.
pub(crate) mod op {
    /// The operation's name, as the fiber dump shows it.
    pub(crate) trait Name {
        const NAME: &'static str;
    }

    /// Waiting for an incoming connection.
    pub(crate) struct Accept;
    /// Waiting for an outgoing connection to complete.
    pub(crate) struct Connect;
    /// Waiting for bytes to read.
    pub(crate) struct Read;
    /// Waiting for room to write.
    pub(crate) struct Write;
    /// Waiting for a datagram.
    pub(crate) struct Recv;
    /// Waiting for room to send a datagram.
    pub(crate) struct Send;

    impl Name for Accept {
        const NAME: &'static str = "accept";
    }
    impl Name for Connect {
        const NAME: &'static str = "connect";
    }
    impl Name for Read {
        const NAME: &'static str = "read";
    }
    impl Name for Write {
        const NAME: &'static str = "write";
    }
    impl Name for Recv {
        const NAME: &'static str = "recv";
    }
    impl Name for Send {
        const NAME: &'static str = "send";
    }
}

/// What an expired deadline turns into (std on Linux: a read or write
/// timeout is `EAGAIN`, `connect_timeout` is `TimedOut`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OnTimeout {
    WouldBlock,
    TimedOut,
}

/// The waiters of one direction. Usually one waiter (one reader, one
/// writer); more when several fibers share `&TcpStream` (or accept on
/// one listener, receive on one UDP socket). Those go in a slab: a wait
/// keeps its record's index, so a waiter that leaves (cancelled, timed
/// out, unwound) is removed in O(1). A search for it made n waiters
/// leaving one socket cost O(n^2) under the socket's lock.
#[derive(Default)]
struct Slot {
    first: Option<Waiter>,
    more: Vec<Option<Waiter>>,
    /// Free indices of `more`.
    free: Vec<usize>,
}

/// [`WaitIo::index`] of the record in [`Slot::first`].
const FIRST: usize = usize::MAX;

impl Slot {
    /// Record `waiter`; returns where, for [`Slot::remove`].
    fn push(&mut self, waiter: Waiter) -> usize {
        if self.first.is_none() {
            self.first = Some(waiter);
            return FIRST;
        }
        match self.free.pop() {
            Some(i) => {
                self.more[i] = Some(waiter);
                i
            }
            None => {
                self.more.push(Some(waiter));
                self.more.len() - 1
            }
        }
    }

    /// Remove `waiter`'s record at `index` if it is still there (a wake
    /// may have taken it, and the index may hold another wait's record
    /// since); returns whether it was.
    fn remove(&mut self, index: usize, waiter: &Waiter) -> bool {
        let slot = if index == FIRST {
            &mut self.first
        } else {
            match self.more.get_mut(index) {
                Some(slot) => slot,
                None => return false,
            }
        };
        if !slot.as_ref().is_some_and(|w| w.same_wait(waiter)) {
            return false;
        }
        *slot = None;
        if index != FIRST {
            self.free.push(index);
        }
        true
    }

    fn take(&mut self) -> (Option<Waiter>, Vec<Option<Waiter>>) {
        let more = if self.more.is_empty() {
            Vec::new()
        } else {
            self.free.clear();
            std::mem::take(&mut self.more)
        };
        (self.first.take(), more)
    }
}

/// The per-wait data of a socket wait: the readiness sequence it saw, and
/// where its record sits while published.
pub(crate) struct WaitIo {
    snapshot: usize,
    index: Option<usize>,
}

/// Readiness state of one registered socket.
pub(crate) struct Readiness {
    /// Readiness events delivered per direction. Written only under
    /// `waiters`' lock (so `publish` sees a total order with the bumps);
    /// read without it for the snapshot and the fast path.
    seq: [AtomicUsize; 2],
    /// Set once by [`Readiness::close`] (deregistration), under the lock.
    closed: AtomicBool,
    /// The read sequence at which a stream read came back short (fewer
    /// bytes than asked for, but some): the socket's receive queue was
    /// empty then, so while the sequence still has this value a read would
    /// only return `WouldBlock` and can park without the system call.
    /// `NOT_DRAINED` when unknown. A hint for the calling side only: the
    /// park itself re-checks the sequence under the lock as always.
    read_drained: AtomicUsize,
    /// An event reported the read side closed (end of stream, hang-up or
    /// error): a read returns at once from now on, so a short read no
    /// longer means the next one would block. Also set by urgent data
    /// (`EPOLLPRI`): a read stops short at the urgent mark with more data
    /// queued. Set before the sequence bump of that event.
    read_closed: AtomicBool,
    waiters: Mutex<[Slot; 2]>,
    /// The socket's addresses as the fiber dump shows them, computed at
    /// the first park (not a protocol: a diagnostic set once).
    label: std::sync::OnceLock<Arc<str>>,
}

impl Default for Readiness {
    fn default() -> Self {
        Readiness::new()
    }
}

impl Readiness {
    pub(crate) fn new() -> Readiness {
        Readiness {
            seq: [AtomicUsize::new(0), AtomicUsize::new(0)],
            closed: AtomicBool::new(false),
            read_drained: AtomicUsize::new(NOT_DRAINED),
            read_closed: AtomicBool::new(false),
            waiters: Mutex::new([Slot::default(), Slot::default()]),
            label: std::sync::OnceLock::new(),
        }
    }

    /// Has an event reported the read side closed (or urgent data, or an
    /// error: see `read_closed`)? A cheap filter before asking the kernel
    /// whether a socket was shut down for reading: a shutdown always
    /// produces such an event, set before the sequence bump that wakes the
    /// retry which asks.
    pub(crate) fn saw_read_closed(&self) -> bool {
        // Relaxed: ordered by the caller's Acquire `snapshot` (see
        // `note_read_closed`).
        self.read_closed.load(Ordering::Relaxed)
    }

    /// Step 1 of an operation: the readiness sequence of `dir`.
    #[inline]
    pub(crate) fn snapshot(&self, dir: usize) -> usize {
        // Acquire: pairs with the Release bump in `set_ready`, so a system
        // call made after this load sees what the event announced.
        self.seq[dir].load(Ordering::Acquire)
    }

    /// The poller saw readiness: bump the sequence of each direction that
    /// is ready and wake its waiters.
    pub(crate) fn set_ready(&self, read: bool, write: bool) {
        let mut woken = [(None, Vec::new()), (None, Vec::new())];
        {
            let mut slots = lock(&self.waiters);
            for (dir, ready) in [(READ, read), (WRITE, write)] {
                if ready {
                    // Release: pairs with the Acquire in `snapshot` and in
                    // `try_complete`; the lock orders it with `publish`.
                    self.seq[dir].fetch_add(1, Ordering::Release);
                    woken[dir] = slots[dir].take();
                }
            }
        }
        wake_all(woken);
    }

    /// The poller saw the read side closed (`EPOLLRDHUP`, `EPOLLHUP` or
    /// `EPOLLERR`) or urgent data (`EPOLLPRI`); called before the event's
    /// `set_ready`, whose Release
    /// bump publishes it to a reader that sees the new sequence.
    pub(crate) fn note_read_closed(&self) {
        // Relaxed: ordered before the Release bump of `set_ready` that
        // follows on this thread; read after the Acquire `snapshot`.
        self.read_closed.store(true, Ordering::Relaxed);
    }

    /// Deregistration: every present and future wait on this socket ends
    /// with `Closed`.
    pub(crate) fn close(&self) {
        let woken = {
            let mut slots = lock(&self.waiters);
            // Release: pairs with the Acquire in `try_complete`; the lock
            // orders it with `publish`.
            self.closed.store(true, Ordering::Release);
            [slots[READ].take(), slots[WRITE].take()]
        };
        wake_all(woken);
    }

    /// Steps 1 to 3: run the non-blocking `op` until it does not report
    /// `WouldBlock`, parking between tries. `nonblocking` returns the
    /// `WouldBlock` to the caller instead (std's `set_nonblocking`).
    #[cfg(any(test, loom))]
    #[track_caller]
    pub(crate) fn poll_io<K: op::Name, R>(
        &self,
        dir: usize,
        deadline: Option<Instant>,
        on_timeout: OnTimeout,
        nonblocking: bool,
        op: impl FnMut() -> io::Result<R>,
    ) -> io::Result<R> {
        self.poll_io_described::<K, R>(dir, deadline, on_timeout, nonblocking, &|| None, op)
    }

    /// [`poll_io`](Self::poll_io), naming the socket in the fiber dump:
    /// `describe` gives its addresses (`None` while they are not known
    /// yet, e.g. before a connect completes); it runs only when a wait is
    /// about to park and the label is not set yet.
    #[track_caller]
    pub(crate) fn poll_io_described<K: op::Name, R>(
        &self,
        dir: usize,
        deadline: Option<Instant>,
        on_timeout: OnTimeout,
        nonblocking: bool,
        describe: &dyn Fn() -> Option<String>,
        mut op: impl FnMut() -> io::Result<R>,
    ) -> io::Result<R> {
        // The fiber's operation budget: a loop on a socket that always has
        // data (or room) still lets the fibers beside it run, and a
        // cancelled one sees its cancellation (the call ends as a cancelled
        // wait does, without being made).
        if nonblocking {
            fiber_core::coop_point();
        } else if fiber_core::coop_point_cancellable() {
            fiber_core::poll_missed();
            return Err(io::Error::other(Cancelled));
        }
        loop {
            let snapshot = self.snapshot(dir);
            match op() {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && !nonblocking => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // An error at once (`WouldBlock` on a non-blocking
                    // socket, a reset or closed connection): a loop that
                    // retries is polling, and counts toward the fiber's
                    // budget yield, as a `try_recv` miss does.
                    fiber_core::poll_missed();
                    return Err(e);
                }
                other => return other,
            }
            if self.label.get().is_none() {
                if let Some(label) = describe() {
                    let _ = self.label.set(label.into());
                }
            }
            let wait = ReadyWait::<K> {
                io: self,
                dir,
                op: std::marker::PhantomData,
            };
            let mut io = WaitIo { snapshot, index: None };
            match fiber_wait(&wait, &mut io, WaitOptions::new().deadline(deadline)) {
                WaitResult::Ok => {}
                WaitResult::TimedOut => {
                    // One real attempt before the timeout is reported: what
                    // arrived during the wait wakes the waiter only once a
                    // worker or the poller has applied its event (the
                    // poller rests up to 8 ms while workers harvest, and a
                    // busy worker harvests every 61 fibers), so a short
                    // timeout expired with bytes already queued, and a
                    // read after a short read did not even look (section
                    // 4a's record). std's `recv` returns queued bytes
                    // whatever its `SO_RCVTIMEO`. One system call per
                    // expired timeout.
                    if dir == READ {
                        self.forget_drained();
                    }
                    return match op() {
                        Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {
                            Err(timeout_error(on_timeout))
                        }
                        other => other,
                    };
                }
                WaitResult::Cancelled => return Err(io::Error::other(Cancelled)),
                WaitResult::Closed => return Err(closed_error()),
            }
        }
    }
}

impl Readiness {
    /// A stream read of `len` bytes (`op`), as
    /// [`poll_io_described`](Self::poll_io_described) for `READ`, with one
    /// system call saved per message: a read that returns fewer bytes than
    /// asked for (but some) drained the socket's receive queue, so the
    /// next read, if no readiness event came in since, parks at once
    /// instead of first getting `WouldBlock` from the kernel (the sockets
    /// are edge-triggered: bytes that arrive later always bring an event,
    /// which moves the sequence). A request-response connection thus
    /// costs one `recv` per message instead of two. End of file (0 bytes)
    /// never counts as drained, and a non-blocking socket always makes
    /// the call.
    #[track_caller]
    pub(crate) fn poll_stream_read<K: op::Name>(
        &self,
        len: usize,
        deadline: Option<Instant>,
        nonblocking: bool,
        describe: &dyn Fn() -> Option<String>,
        mut op: impl FnMut() -> io::Result<usize>,
    ) -> io::Result<usize> {
        self.poll_io_described::<K, usize>(READ, deadline, OnTimeout::WouldBlock, nonblocking, describe, || {
            // Taken before the call: an event counted before it is for bytes
            // that arrived before the call, which a short read took; bytes
            // that arrive after it bring an event that moves the sequence
            // past this value. (A value read after the call could already
            // count the event of bytes that came in behind the read, and
            // the next read would park next to them.)
            let before = self.snapshot(READ);
            // Relaxed: a hint for this socket's readers; `poll_io_described`
            // parks with a snapshot taken before this one, and the sequence
            // only grows, so it equals `before` here and the park's re-check
            // under the lock is the usual one.
            // Relaxed (`read_closed`): the Acquire in `snapshot` above saw
            // the bump that follows a close's store.
            if !nonblocking
                && self.read_drained.load(Ordering::Relaxed) == before
                && !self.read_closed.load(Ordering::Relaxed)
            {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            let result = op();
            if matches!(result, Ok(n) if n > 0 && n < len) {
                // Relaxed: as above.
                self.read_drained.store(before, Ordering::Relaxed);
            }
            if matches!(result, Ok(0)) && len > 0 {
                // End of file, which every later read returns at once too:
                // a loop that reads on is polling (as for an error above).
                fiber_core::poll_missed();
            }
            result
        })
    }

    /// Forget a recorded short read (after `shutdown(Read)`, which ends
    /// reads without data arriving).
    pub(crate) fn forget_drained(&self) {
        // Relaxed: a hint (see `read_drained`).
        self.read_drained.store(NOT_DRAINED, Ordering::Relaxed);
    }
}

fn wake_all(woken: [(Option<Waiter>, Vec<Option<Waiter>>); 2]) {
    for (first, more) in woken {
        for waiter in first.iter().chain(more.iter().flatten()) {
            {
                IO_WAITERS.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                fiber_core::note_external_wait(false);
            }
            fiber_wake(waiter);
        }
    }
}

/// The error of a wait that ended because the socket was deregistered.
pub(crate) fn closed_error() -> io::Error {
    io::Error::new(
        io::ErrorKind::NotConnected,
        "the socket was closed while this call waited on it",
    )
}

pub(crate) fn timeout_error(on_timeout: OnTimeout) -> io::Error {
    match on_timeout {
        OnTimeout::WouldBlock => io::Error::from_raw_os_error(libc::EAGAIN),
        OnTimeout::TimedOut => io::Error::new(io::ErrorKind::TimedOut, "connection timed out"),
    }
}

/// The waitable of one direction of one socket; the per-wait data is the
/// snapshot of step 1. `K` (an [`op`] marker) only names the operation.
struct ReadyWait<'a, K> {
    io: &'a Readiness,
    dir: usize,
    op: std::marker::PhantomData<fn() -> K>,
}

impl<K> ReadyWait<'_, K> {
    /// Under the lock or not: has anything happened since the snapshot?
    fn changed(&self, snapshot: usize, order: Ordering) -> Option<WaitResult> {
        if self.io.closed.load(order) {
            Some(WaitResult::Closed)
        } else if self.io.seq[self.dir].load(order) != snapshot {
            Some(WaitResult::Ok)
        } else {
            None
        }
    }
}

impl<K: op::Name> Waitable for ReadyWait<'_, K> {
    type Io = WaitIo;

    fn kind(&self) -> fiber_core::WaitKind {
        fiber_core::WaitKind::Io
    }

    fn wait_on(&self) -> Option<fiber_core::WaitOn> {
        Some(fiber_core::WaitOn {
            op: K::NAME,
            resource: self.io.label.get()?.clone(),
        })
    }

    fn try_complete(&self, io: &mut WaitIo) -> Option<WaitResult> {
        // Acquire: pairs with the Release bump in `set_ready` / store in
        // `close`.
        self.changed(io.snapshot, Ordering::Acquire)
    }

    fn publish(&self, waiter: &Waiter, io: &mut WaitIo) -> Publish {
        let mut slots = lock(&self.io.waiters);
        // The re-check: the sequence only moves under this lock, so either
        // the bump is visible here or the bump's `take` will find us.
        // Relaxed: the lock orders this load after any bump made under it.
        if let Some(result) = self.changed(io.snapshot, Ordering::Relaxed) {
            return Publish::Ready(result);
        }
        io.index = Some(slots[self.dir].push(waiter.clone()));
        {
            IO_WAITERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            fiber_core::note_external_wait(true);
        }
        Publish::Published
    }

    fn unpublish(&self, waiter: &Waiter, io: &mut WaitIo) -> Option<WaitResult> {
        let mut slots = lock(&self.io.waiters);
        if io
            .index
            .take()
            .is_some_and(|index| slots[self.dir].remove(index, waiter))
        {
            {
                IO_WAITERS.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                fiber_core::note_external_wait(false);
            }
        }
        // Relaxed: under the lock, as in `publish`.
        self.changed(io.snapshot, Ordering::Relaxed)
    }
}
