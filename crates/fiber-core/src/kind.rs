//! What a parked fiber waits for, as diagnostics name it.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// What a parked fiber waits for (see `Waitable::kind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum WaitKind {
    /// Not waiting (or nothing recorded).
    None = 0,
    /// `sleep`, `sleep_until`, a plain deadline.
    Sleep = 1,
    /// A channel receive.
    Recv = 2,
    /// A channel send.
    Send = 3,
    /// A `select!` / `Select` over several operations.
    Select = 4,
    /// Joining a fiber or a job, or a scope waiting for its children.
    Join = 5,
    /// `fiber::park`.
    Park = 6,
    /// A fiber-aware lock, condition variable, semaphore, barrier or group.
    Lock = 7,
    /// Socket readiness (read, write, accept, connect).
    Io = 8,
    /// Any other waitable.
    Other = 9,
    /// A call running on the blocking pool (`fiber::blocking`).
    Blocking = 10,
    /// A channel operation whose wait was over (a deadline or a cancel)
    /// but whose value another party's `select!` send arm had already
    /// claimed: it waits for that hand-off to be completed or given back,
    /// which its holder does even while it unwinds. Not cancellable.
    Handoff = 11,
}

impl WaitKind {
    /// May a plain thread end a wait of this kind (send or receive on a
    /// channel a thread shares, `unpark` through a handle, release a lock)?
    /// Shutdown keeps its grace time for such a wait when cancellation
    /// does not end it (a lock; clean-up inside `non_cancellable`).
    pub(crate) fn may_end_from_a_thread(self) -> bool {
        matches!(
            self,
            WaitKind::Recv | WaitKind::Send | WaitKind::Select | WaitKind::Park | WaitKind::Lock | WaitKind::Handoff
        )
    }

    pub(crate) fn from_u8(v: u8) -> WaitKind {
        match v {
            1 => WaitKind::Sleep,
            2 => WaitKind::Recv,
            3 => WaitKind::Send,
            4 => WaitKind::Select,
            5 => WaitKind::Join,
            6 => WaitKind::Park,
            7 => WaitKind::Lock,
            8 => WaitKind::Io,
            9 => WaitKind::Other,
            10 => WaitKind::Blocking,
            11 => WaitKind::Handoff,
            _ => WaitKind::None,
        }
    }

    /// A short human name ("chan receive", "sleep", ...).
    pub fn name(self) -> &'static str {
        match self {
            WaitKind::None => "nothing",
            WaitKind::Sleep => "sleep",
            WaitKind::Recv => "chan receive",
            WaitKind::Send => "chan send",
            WaitKind::Select => "select",
            WaitKind::Join => "join",
            WaitKind::Park => "park",
            WaitKind::Lock => "waiting for lock",
            WaitKind::Io => "I/O",
            WaitKind::Other => "wait",
            WaitKind::Blocking => "blocking call",
            WaitKind::Handoff => "chan hand-off",
        }
    }
}

impl fmt::Display for WaitKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a wait is on, beyond its [`WaitKind`]: the operation and the
/// resource, as the fiber dump shows them (`read` on
/// `127.0.0.1:8080 <- 127.0.0.1:51000`). Given by [`crate::Waitable::wait_on`];
/// sockets give one, channels and locks do not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaitOn {
    /// The operation (`read`, `write`, `accept`, `connect`, ...).
    pub op: &'static str,
    /// The resource, e.g. a socket's addresses.
    pub resource: std::sync::Arc<str>,
}

impl fmt::Display for WaitOn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} on {}", self.op, self.resource)
    }
}

static PARK_BACKTRACES: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Capture a backtrace at every park from now on (`true`), for the fiber
/// dump, or stop (`false`). Process-wide; fiber-sched turns it on for
/// `FIBER_BACKTRACE=1` or `Builder::park_backtraces(true)`.
///
/// Cost: a full `std::backtrace::Backtrace` capture (a stack walk, tens of
/// microseconds) and an allocation per park, so it is a debugging switch,
/// not something to leave on in production.
pub fn set_park_backtraces(on: bool) {
    // Relaxed: a setting; a park that misses the change by a moment is fine.
    PARK_BACKTRACES.store(on, Ordering::Relaxed);
}

/// Is [`set_park_backtraces`] on?
pub fn park_backtraces() -> bool {
    PARK_BACKTRACES.load(Ordering::Relaxed)
}

static FIBER_SPANS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Give every fiber spawned from now on a `tracing` span (INFO, target
/// `fiber`, name `fiber`, fields `id` and `name`), entered on the worker
/// thread for as long as the fiber runs and closed when it ends, so events
/// logged by the fiber's code carry its id and name. Process-wide;
/// fiber-sched turns it on for `FIBER_TRACE_SPANS=1` or
/// `Builder::fiber_spans(true)`. Off by default: a span per fiber and an
/// enter/exit per switch cost what the subscriber makes them cost.
pub fn set_fiber_spans(on: bool) {
    // Relaxed: a setting, read at each spawn.
    FIBER_SPANS.store(on, Ordering::Relaxed);
}

/// Is [`set_fiber_spans`] on?
pub fn fiber_spans() -> bool {
    FIBER_SPANS.load(Ordering::Relaxed)
}

/// A source of readiness events that a scheduler's workers drain without
/// blocking (fiber-net's epoll instance): `poll_ready` takes the events that
/// are ready now and wakes the fibers they concern with `fiber_wake`, from
/// the calling thread. A worker that calls it while it is busy (every few
/// dozen fibers) or before it sleeps gets those fibers on its own queues,
/// with no thread hop. It never blocks; waiting for I/O while every worker
/// sleeps stays the I/O layer's own business (fiber-net's poller thread).
pub trait IoPoll: Send + Sync {
    /// Take the ready events, wake their fibers; returns how many events.
    fn poll_ready(&self) -> usize;

    /// A worker found nothing to run and is about to sleep: from now on it
    /// takes no events, so the I/O layer makes sure someone waits for
    /// them (fiber-net's poller thread may be resting while busy workers
    /// take the events themselves). Called on every worker sleep: cheap
    /// when there is nothing to do.
    fn before_sleep(&self) {}

    /// A way for one idle worker to wait for I/O readiness itself, instead
    /// of sleeping on its own wake-up word while another thread waits for
    /// the events (tokio's and Go's idle worker that blocks in the poller).
    /// `None` if the I/O layer cannot provide one. Each worker asks once
    /// and keeps its waiter.
    fn io_waiter(&self) -> Option<Box<dyn IoWaiter>> {
        None
    }
}

/// An idle worker's wait for I/O readiness (see [`IoPoll::io_waiter`]).
pub trait IoWaiter: Send + Sync {
    /// Block the calling thread until readiness events may be waiting (the
    /// caller then takes them with [`IoPoll::poll_ready`]), [`wake`] is
    /// called, or `timeout` passes (`None`: no timeout). May return early.
    ///
    /// [`wake`]: IoWaiter::wake
    fn wait(&self, timeout: Option<std::time::Duration>);

    /// End a current or the next [`wait`](IoWaiter::wait) at once, from any
    /// thread.
    fn wake(&self);
}

static IO_POLL: std::sync::OnceLock<&'static dyn IoPoll> = std::sync::OnceLock::new();

/// Install the process's [`IoPoll`] (fiber-net does, when its driver
/// starts). The first one stays; returns `false` if one was installed.
pub fn set_io_poll(poll: &'static dyn IoPoll) -> bool {
    IO_POLL.set(poll).is_ok()
}

/// The installed [`IoPoll`], if any I/O layer is in use.
#[inline]
pub fn io_poll() -> Option<&'static dyn IoPoll> {
    IO_POLL.get().copied()
}

/// Waiters parked on something outside every scheduler (socket readiness):
/// a root fiber parked while any exist is not deadlocked, since the outside
/// world may still wake it.
static EXTERNAL_WAITERS: AtomicU64 = AtomicU64::new(0);

/// Count one waiter parked on an outside event (socket readiness) while
/// the returned guard lives. Layers such as fiber-net hold one per parked
/// I/O wait; deadlock reports read [`external_waiters`].
pub fn external_wait() -> ExternalWait {
    // Relaxed: a diagnostic count.
    EXTERNAL_WAITERS.fetch_add(1, Ordering::Relaxed);
    ExternalWait(())
}

/// Count one more (`true`) or one fewer (`false`) waiter parked on an
/// outside event, for layers whose begin and end are in different places
/// (each begin must be matched by one end; the count is diagnostic only).
pub fn note_external_wait(begins: bool) {
    if begins {
        EXTERNAL_WAITERS.fetch_add(1, Ordering::Relaxed);
    } else {
        EXTERNAL_WAITERS.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Waiters parked on outside events right now.
pub fn external_waiters() -> u64 {
    EXTERNAL_WAITERS.load(Ordering::Relaxed)
}

/// Counts one outside waiter until dropped (see [`external_wait`]).
#[derive(Debug)]
pub struct ExternalWait(());

impl Drop for ExternalWait {
    fn drop(&mut self) {
        EXTERNAL_WAITERS.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Ids a thread takes from a shared counter at once.
const ID_BLOCK: u64 = 256;

/// The next id of the shared `counter`, taken from this thread's block of
/// it (`block`: next and end of the block; a thread's first call, and
/// every 256th, takes a new block). Ids are unique, and increasing on each
/// thread, but not in call order across threads (as
/// `std::thread::ThreadId`); the point is that a thread that makes many
/// ids writes the shared counter's line once per block, not once per id.
pub fn unique_id_from(
    counter: &std::sync::atomic::AtomicU64,
    block: &'static std::thread::LocalKey<std::cell::Cell<(u64, u64)>>,
) -> u64 {
    unique_id_above(counter, block, 0)
}

/// [`unique_id_from`], with an id greater than `floor`, an id the same
/// counter gave out before: a thread whose block is at or below it takes a
/// new block (every block taken after `floor`'s starts above it).
pub fn unique_id_above(
    counter: &std::sync::atomic::AtomicU64,
    block: &'static std::thread::LocalKey<std::cell::Cell<(u64, u64)>>,
    floor: u64,
) -> u64 {
    // Relaxed: uniqueness needs only the read-modify-write's atomicity.
    let take = |n: u64| counter.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    block
        .try_with(|cell| {
            let (next, end) = cell.get();
            if next < end && next > floor {
                cell.set((next + 1, end));
                return next;
            }
            let start = take(ID_BLOCK);
            cell.set((start + 1, start + ID_BLOCK));
            start
        })
        // During thread-local teardown: one id at a time.
        .unwrap_or_else(|_| take(1))
}

#[cfg(all(test, not(loom)))]
mod id_tests {
    use super::*;

    static COUNTER: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static BLOCK: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
    }

    #[test]
    fn ids_from_blocks_are_unique_across_threads_and_increasing_on_each() {
        let per_thread: Vec<Vec<u64>> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..4)
                .map(|_| s.spawn(|| (0..1000).map(|_| unique_id_from(&COUNTER, &BLOCK)).collect::<Vec<_>>()))
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        for ids in &per_thread {
            assert!(ids.windows(2).all(|w| w[0] < w[1]), "increasing on one thread");
        }
        let mut all: Vec<u64> = per_thread.into_iter().flatten().collect();
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n, "every id is unique");
        assert!(all[0] >= 1, "ids start at the counter's first value");
    }

    #[test]
    fn an_id_above_a_floor_from_another_threads_newer_block_is_above_it() {
        static COUNTER2: AtomicU64 = AtomicU64::new(1);
        thread_local! {
            static BLOCK2: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
        }
        // This thread's block is older than the other thread's.
        let mine = unique_id_from(&COUNTER2, &BLOCK2);
        let theirs = std::thread::spawn(|| unique_id_from(&COUNTER2, &BLOCK2))
            .join()
            .unwrap();
        assert!(theirs > mine);
        // A child of the fiber with id `theirs`, spawned here, gets a
        // greater id even though this thread's block has ids below it.
        let child = unique_id_above(&COUNTER2, &BLOCK2, theirs);
        assert!(child > theirs, "{child} > {theirs}");
        assert!(unique_id_from(&COUNTER2, &BLOCK2) > child, "the new block continues");
    }
}
