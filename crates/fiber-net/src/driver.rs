//! The I/O driver: one poller thread per process, started on first use,
//! that waits in `epoll_wait` (through mio) and turns readiness events into
//! [`Readiness::set_ready`] calls, which wake the parked fibers with
//! `fiber_wake` like any other waitable.
//!
//! Registration: a socket is registered once, edge-triggered, for both
//! directions, under a token that names its slot in the driver's table
//! plus the slot's generation (so an event for a deregistered socket never
//! reaches a socket that reused the slot). Deregistration removes the
//! socket from epoll and from the table, then closes its readiness (waking
//! any waiter with an error), then the fd is closed.

use crate::readiness::Readiness;
use crate::rest::PollerRest;
use crate::sync::{lock, Arc, Mutex};
use mio::event::Source;
use mio::{Events, Interest, Poll, Registry, Token};
use std::io;
use std::sync::OnceLock;

/// Readiness events delivered by the poller thread and by workers (the
/// `IoPoll` hook). Relaxed counters: diagnostics only.
static POLLER_EVENTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static WORKER_EVENTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Where the process's socket readiness events were taken from kernel so
/// far: by the poller thread (each then a wake from outside the workers) or
/// by a worker's non-blocking harvest (the woken fiber runs on that worker).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PollStats {
    /// Events the poller thread took.
    pub poller_events: u64,
    /// Events workers took themselves.
    pub worker_events: u64,
    /// Times the poller thread rested (stayed out of `epoll_wait` for up
    /// to a millisecond) because workers were taking the events.
    pub poller_rests: u64,
    /// Waits of idle workers for readiness in the I/O driver itself (the
    /// scheduler's `io_park` option), instead of on their wake-up word.
    pub worker_io_waits: u64,
}

/// The counters of [`PollStats`] now.
pub fn poll_stats() -> PollStats {
    use std::sync::atomic::Ordering::Relaxed;
    PollStats {
        poller_events: POLLER_EVENTS.load(Relaxed),
        worker_events: WORKER_EVENTS.load(Relaxed),
        poller_rests: RESTS.load(Relaxed),
        worker_io_waits: IO_WAITS.load(Relaxed),
    }
}

/// Events taken from the kernel per `epoll_wait`.
const EVENTS_PER_POLL: usize = 1024;

/// Bits of a token that hold the slot index (the rest is the generation).
const INDEX_BITS: u32 = 32;

struct Entry {
    generation: usize,
    readiness: Option<Arc<Readiness>>,
}

#[derive(Default)]
struct Table {
    entries: Vec<Entry>,
    free: Vec<usize>,
}

impl Table {
    fn insert(&mut self, readiness: Arc<Readiness>) -> Token {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                self.entries.push(Entry {
                    generation: 0,
                    readiness: None,
                });
                self.entries.len() - 1
            }
        };
        let entry = &mut self.entries[index];
        entry.generation = entry.generation.wrapping_add(1) & ((1 << (usize::BITS - INDEX_BITS)) - 1);
        entry.readiness = Some(readiness);
        Token(entry.generation << INDEX_BITS | index)
    }

    fn get(&self, token: Token) -> Option<&Arc<Readiness>> {
        let index = token.0 & ((1 << INDEX_BITS) - 1);
        let entry = self.entries.get(index)?;
        if entry.generation != token.0 >> INDEX_BITS {
            return None;
        }
        entry.readiness.as_ref()
    }

    fn remove(&mut self, token: Token) {
        let index = token.0 & ((1 << INDEX_BITS) - 1);
        if let Some(entry) = self.entries.get_mut(index) {
            if entry.generation == token.0 >> INDEX_BITS && entry.readiness.take().is_some() {
                self.free.push(index);
            }
        }
    }
}

struct Driver {
    registry: Registry,
    table: Mutex<Table>,
    /// The epoll instance the poller thread waits on (it lives as long as
    /// the process: the thread never exits), for the workers' non-blocking
    /// harvest.
    epoll: std::os::fd::RawFd,
}

static DRIVER: OnceLock<Driver> = OnceLock::new();

/// Serializes starts: a failed start (no descriptor left for the epoll
/// instance, no thread for the poller) is not kept: like std's calls, the
/// socket call that met it fails with the OS error, and a later one tries
/// again.
static STARTING: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn driver() -> io::Result<&'static Driver> {
    if let Some(driver) = DRIVER.get() {
        return Ok(driver);
    }
    let _starting = STARTING.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(driver) = DRIVER.get() {
        return Ok(driver);
    }
    let driver = start()?;
    Ok(DRIVER.get_or_init(|| driver))
}

fn start() -> io::Result<Driver> {
    let poll = Poll::new()?;
    let registry = poll.registry().try_clone()?;
    let epoll = std::os::fd::AsRawFd::as_raw_fd(&poll);
    std::thread::Builder::new()
        .name("fiber-net-poller".to_string())
        .spawn(move || run(poll))?;
    fiber_core::set_io_poll(&WorkerPoll);
    Ok(Driver {
        registry,
        table: Mutex::new(Table::default()),
        epoll,
    })
}

/// One event as delivered to a socket: its readiness, then readable,
/// writable, read side closed.
type ReadyEvent = (Arc<Readiness>, bool, bool, bool);

/// Events a worker takes per non-blocking harvest.
const EVENTS_PER_HARVEST: usize = 256;

/// The poller thread's rest while workers take the events themselves
/// (the protocol is in `rest.rs`).
static REST_STATE: PollerRest = PollerRest::new();
static POLLER_THREAD: OnceLock<std::thread::Thread> = OnceLock::new();
/// The first rest: how late readiness can be when a worker that was
/// harvesting stays busy without harvesting (one long CPU-bound fiber).
const REST: std::time::Duration = std::time::Duration::from_millis(1);
/// Consecutive rests double up to this: under a steady load the workers
/// keep taking the events and the poller wakes 125 times a second instead
/// of 1,000 (each wake can preempt a worker on a small machine). A worker
/// that goes to sleep still wakes the poller at once (`before_sleep`).
const REST_MAX: std::time::Duration = std::time::Duration::from_millis(8);
/// How often the poller rested (diagnostics).
static RESTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The workers' side of the driver (fiber-core's `IoPoll` hook): a
/// non-blocking `epoll_wait` on the poller's epoll instance. Edge-triggered
/// events go to exactly one of the threads waiting on an epoll instance,
/// so the poller thread and the workers never see the same event twice;
/// a fiber woken here is scheduled on the harvesting worker itself (no
/// thread hop, no futex wake), which is how tokio's and Go's workers take
/// I/O readiness while they are busy.
struct WorkerPoll;

impl fiber_core::IoPoll for WorkerPoll {
    fn poll_ready(&self) -> usize {
        let Some(driver) = DRIVER.get() else {
            return 0;
        };
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; EVENTS_PER_HARVEST];
        // SAFETY: `events` is a writable array of EVENTS_PER_HARVEST
        // epoll_event records; `driver.epoll` is the poller's epoll fd,
        // open for the life of the process; a zero timeout never blocks.
        let n = unsafe { libc::epoll_wait(driver.epoll, events.as_mut_ptr(), EVENTS_PER_HARVEST as i32, 0) };
        if n <= 0 {
            return 0;
        }
        REST_STATE.note_harvest();
        WORKER_EVENTS.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        let mut batch: smallvec::SmallVec<[ReadyEvent; 16]> = smallvec::SmallVec::new();
        {
            let table = lock(&driver.table);
            for event in &events[..n as usize] {
                let bits = event.events as i32;
                let error = bits & libc::EPOLLERR != 0;
                let hup = bits & libc::EPOLLHUP != 0;
                let read = bits & (libc::EPOLLIN | libc::EPOLLPRI | libc::EPOLLRDHUP) != 0 || hup || error;
                let write = bits & libc::EPOLLOUT != 0 || hup || error;
                // Urgent data (`EPOLLPRI`) also ends the short-read
                // shortcut: a read stops at the urgent mark with more
                // queued behind it (`Readiness::note_read_closed`).
                let read_closed = bits & (libc::EPOLLRDHUP | libc::EPOLLPRI) != 0 || hup || error;
                if let Some(readiness) = table.get(Token(event.u64 as usize)) {
                    batch.push((readiness.clone(), read, write, read_closed));
                }
            }
        }
        // Wake outside the table lock, as the poller thread does.
        for (readiness, read, write, read_closed) in batch {
            if read_closed {
                readiness.note_read_closed();
            }
            readiness.set_ready(read, write);
        }
        n as usize
    }

    fn before_sleep(&self) {
        if REST_STATE.worker_sleeping() {
            if let Some(poller) = POLLER_THREAD.get() {
                poller.unpark();
            }
        }
    }

    fn io_waiter(&self) -> Option<Box<dyn fiber_core::IoWaiter>> {
        let driver = DRIVER.get()?;
        EpollWaiter::new(driver.epoll)
            .ok()
            .map(|w| Box::new(w) as Box<dyn fiber_core::IoWaiter>)
    }
}

/// The token of a worker waiter's own eventfd in its epoll set.
const WAKE_TOKEN: u64 = u64::MAX;

/// An idle worker's wait for readiness (`fiber_core::IoWaiter`): an epoll
/// set of its own holding the driver's epoll instance (readable while any
/// registered socket has an event waiting) and an eventfd that `wake`
/// writes. The worker waits on its own set, so a wake always reaches it
/// (two threads waiting on one epoll instance would each get only some of
/// its events, the wake-up included); the events themselves stay in the
/// driver's instance for `poll_ready`.
struct EpollWaiter {
    epoll: std::os::fd::OwnedFd,
    event: std::os::fd::OwnedFd,
}

impl EpollWaiter {
    fn new(driver_epoll: std::os::fd::RawFd) -> io::Result<EpollWaiter> {
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        // SAFETY: plain system calls; each fd returned is checked and then
        // owned exactly once.
        let epoll = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if epoll < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `epoll` is a fresh fd owned by nobody else.
        let epoll = unsafe { OwnedFd::from_raw_fd(epoll) };
        // SAFETY: as above.
        let event = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if event < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `event` is a fresh fd owned by nobody else.
        let event = unsafe { OwnedFd::from_raw_fd(event) };
        for (fd, token) in [(driver_epoll, 0), (event.as_raw_fd(), WAKE_TOKEN)] {
            // Level-triggered: readable for as long as the driver holds
            // events (or the eventfd a count).
            let mut ev = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: token,
            };
            // SAFETY: both fds are open; `ev` is a valid epoll_event.
            if unsafe { libc::epoll_ctl(epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) } < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(EpollWaiter { epoll, event })
    }
}

impl fiber_core::IoWaiter for EpollWaiter {
    fn wait(&self, timeout: Option<std::time::Duration>) {
        use std::os::fd::AsRawFd;
        // Rounded up, so a timeout never ends early; `None` waits forever.
        let ms = match timeout {
            None => -1,
            Some(d) => i32::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(i32::MAX),
        };
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; 2];
        // SAFETY: `events` is a writable array of 2 records; the fd is ours.
        let n = unsafe { libc::epoll_wait(self.epoll.as_raw_fd(), events.as_mut_ptr(), 2, ms) };
        if n > 0 && events[..n as usize].iter().any(|e| e.u64 == WAKE_TOKEN) {
            let mut count = 0u64;
            // SAFETY: reads 8 bytes into `count` from our non-blocking
            // eventfd (resets it; EAGAIN if another read got it first).
            let _ = unsafe { libc::read(self.event.as_raw_fd(), (&mut count as *mut u64).cast(), 8) };
        }
        IO_WAITS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    fn wake(&self) {
        use std::os::fd::AsRawFd;
        let one = 1u64;
        // SAFETY: writes 8 bytes from `one` to our eventfd; a full counter
        // (EAGAIN) still leaves it readable, which is all a wake needs.
        let _ = unsafe { libc::write(self.event.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }
}

/// Waits of idle workers in `EpollWaiter` (diagnostics).
static IO_WAITS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Rest instead of waiting in `epoll_wait` while workers take the events
/// (`rest.rs`); `true` if the poller rested (or decided to and then saw a
/// worker go to sleep).
fn rest_while_workers_harvest(rest: &mut std::time::Duration) -> bool {
    let Some(park) = REST_STATE.begin() else {
        // Back to `epoll_wait`: the next run of rests starts short again.
        *rest = REST;
        return false;
    };
    if park {
        RESTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        std::thread::park_timeout(*rest);
        *rest = (*rest * 2).min(REST_MAX);
    }
    REST_STATE.end();
    true
}

/// The poller thread: runs for the life of the process.
fn run(mut poll: Poll) {
    // Workers and plain-thread waits use the epoll descriptor `poll` owns
    // by number (`Driver::epoll`): were this thread to unwind, `poll` would
    // close it and the number could name another file. Nothing here is
    // expected to panic (layer callbacks on wakes are contained where they
    // are made); if something does, stop loudly rather than let every
    // socket wait hang on a closed or reused descriptor.
    let _abort = AbortOnUnwind;
    let _ = POLLER_THREAD.set(std::thread::current());
    let mut events = Events::with_capacity(EVENTS_PER_POLL);
    let mut batch: Vec<ReadyEvent> = Vec::with_capacity(EVENTS_PER_POLL);
    let mut rest = REST;
    loop {
        if rest_while_workers_harvest(&mut rest) {
            continue;
        }
        if let Err(e) = poll.poll(&mut events, None) {
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            // epoll_wait fails only on a bad epoll fd or bad arguments: no
            // socket could ever be woken again, so fail loudly.
            eprintln!("fiber-net: the I/O poller failed: {e}; aborting");
            std::process::abort();
        }
        let Some(driver) = DRIVER.get() else {
            continue;
        };
        POLLER_EVENTS.fetch_add(events.iter().count() as u64, std::sync::atomic::Ordering::Relaxed);
        {
            let table = lock(&driver.table);
            for event in events.iter() {
                if let Some(readiness) = table.get(event.token()) {
                    let error = event.is_error();
                    let read = event.is_readable() || event.is_read_closed() || error;
                    let write = event.is_writable() || event.is_write_closed() || error;
                    // Urgent data ends the short-read shortcut too (as
                    // in `harvest`).
                    let no_skip = event.is_read_closed() || event.is_priority() || error;
                    let read = read || event.is_priority();
                    batch.push((readiness.clone(), read, write, no_skip));
                }
            }
        }
        // Wake outside the table lock: a wake may schedule a fiber, which
        // can take its scheduler's locks.
        for (readiness, read, write, read_closed) in batch.drain(..) {
            if read_closed {
                readiness.note_read_closed();
            }
            readiness.set_ready(read, write);
        }
    }
}

/// Aborts the process if dropped while its thread unwinds (see `run`).
struct AbortOnUnwind;

impl Drop for AbortOnUnwind {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "fiber-net: the I/O poller thread panicked; no socket could be woken again and its \
                 epoll descriptor would close under the workers: aborting"
            );
            std::process::abort();
        }
    }
}

/// A socket registered with the driver. Dropping it deregisters the socket
/// and wakes every waiter with an error before the fd is closed.
pub(crate) struct Registration {
    token: Token,
    pub(crate) readiness: Arc<Readiness>,
}

impl Registration {
    /// Register `source` for both directions, edge-triggered, and for
    /// urgent data (`EPOLLPRI`: a TCP read stops short at the urgent mark
    /// although more data is queued, which the short-read shortcut must
    /// know; spec/net.md section 4a).
    pub(crate) fn new(source: &mut impl Source) -> io::Result<Registration> {
        #[cfg(test)]
        if tests_fail::take() {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        let driver = driver()?;
        let readiness = Arc::new(Readiness::new());
        let token = lock(&driver.table).insert(readiness.clone());
        if let Err(e) = driver.registry.register(
            source,
            token,
            Interest::READABLE | Interest::WRITABLE | Interest::PRIORITY,
        ) {
            lock(&driver.table).remove(token);
            return Err(e);
        }
        Ok(Registration { token, readiness })
    }

    /// Deregister `source` (which must be the registered one, still open).
    pub(crate) fn deregister(&self, source: &mut impl Source) {
        if let Ok(driver) = driver() {
            // An error here means the fd was already gone from epoll;
            // nothing is left to undo.
            let _ = driver.registry.deregister(source);
            lock(&driver.table).remove(self.token);
        }
        self.readiness.close();
    }
}

/// Unit tests: make this thread's next registration fail, as `epoll_ctl`
/// does past `fs.epoll.max_user_watches`.
#[cfg(test)]
pub(crate) mod tests_fail {
    use std::cell::Cell;

    std::thread_local! {
        static FAIL_NEXT: Cell<bool> = const { Cell::new(false) };
    }

    pub(crate) fn fail_next_registration() {
        FAIL_NEXT.with(|f| f.set(true));
    }

    pub(crate) fn take() -> bool {
        FAIL_NEXT.with(|f| f.replace(false))
    }
}
