//! Workers: the shared scheduler state, the per-worker queues, the worker
//! loop and `Schedule::schedule`.
//!
//! # Queues
//!
//! Each worker has a LIFO slot (`runnext`, the fiber it spawned or woke
//! last), a local FIFO deque others can steal from (crossbeam-deque), and an
//! inbox (MPSC in use; crossbeam `SegQueue`) for pushes from other threads.
//! One global injection queue serves everyone (`queue.rs`).
//!
//! # Worker loop
//!
//! runnext -> local -> inbox -> global -> randomized steal -> brief spin ->
//! sleep (`idle.rs`). Every [`GLOBAL_CHECK_INTERVAL`] fibers the global queue
//! goes first, and once a chain of runnext hand-offs has run for
//! [`RUNNEXT_SLICE_MS`] its fiber goes behind everything else queued (the
//! chain shares one time slice, as Go's runnext inherits the slice), so
//! nothing starves.
//!
//! # Placement
//!
//! * Spawn or wake from a worker of this runtime: that worker's runnext
//!   (communication locality, like Go's `runnext`); the displaced fiber goes
//!   to its stealable deque, and a sleeping worker is woken to steal.
//! * Spawn from outside: round-robin over the workers' inboxes.
//! * Wake from outside (a plain thread, the timer): the fiber's last worker's
//!   inbox (soft affinity), unless that worker is stalled, retiring, or its
//!   inbox holds [`INBOX_LIMIT`] fibers; then the global queue.

use crate::config::Config;
use crate::idle::{Idle, Retract};
use crate::queue::GlobalQueue;
use crate::stats::Counters;
use crate::sync::{fence, lock, AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Mutex, Ordering};
use crate::timer::{Armed, Timers, NEVER};
use crossbeam_deque::{Steal, Stealer, Worker as Deque};
use crossbeam_queue::SegQueue;
use crossbeam_utils::CachePadded;
use fiber_core::{fiber_wake, fiber_wake_via, FramePool, RunOutcome, Runnable, Running, Schedule, Waiter, Worker as _};
use std::cell::{Cell, RefCell};
use std::panic::Location;
use std::sync::atomic::AtomicPtr;
use std::sync::Arc;
use std::time::Instant;

/// Fibers run between two looks at the global queue first (fairness).
pub const GLOBAL_CHECK_INTERVAL: u64 = 61;
/// Milliseconds (coarse clock) a chain of runnext hand-offs may run before
/// its fiber goes behind the worker's other queued fibers (Go's 10 ms time
/// slice, which a runnext goroutine inherits).
pub const RUNNEXT_SLICE_MS: u64 = 10;

/// Every this many looks of a chain of runnext hand-offs, the worker
/// advances the coarse clock itself (a clock read): the monitor, which
/// advances it otherwise, can be held up (a slow tracing subscriber or a
/// full stderr in one of its reports), and a chain that only the clock
/// ends would then keep its worker for as long (review 43: yielders beside
/// a ping-pong pair waited the whole 5 s of a held monitor).
pub const CHAIN_CLOCK_EVERY: u32 = 256;

/// Every this many global checks (so every 61 x 16 looks), the oldest
/// fiber of the LIFO local deque runs first: a bound on how long a fiber
/// at its bottom can wait while the top keeps being refilled.
pub const OLDEST_LOCAL_EVERY: u64 = 16;

/// Milliseconds (coarse clock) after which a worker's next look is a
/// fairness look anyway, the oldest local fiber included, however few
/// looks it made: a worker whose fibers compute for milliseconds between
/// parks makes its 61st (or 976th) look seconds late (Go shares time the
/// same way, with a 10 ms slice).
pub const FAIR_LOOK_MS: u64 = 10;
/// Inbox length past which wakes divert to the global queue.
pub const INBOX_LIMIT: usize = 256;
/// Fibers moved from the global queue to the local deque in one grab.
pub const GLOBAL_BATCH: usize = 16;
/// Rounds of looking for work before a worker sleeps.
pub const SEARCH_ROUNDS: u32 = 32;
/// A searching worker takes ready I/O (a non-blocking `epoll_wait`) every
/// this many rounds, not every round: an event waits a few microseconds at
/// most, and an idle worker no longer spends 32 system calls per search.
/// Those calls took CPU time from the busy worker and from clients on the
/// same cores: `http_hello` under `wrk -c50` on 2 cores had a p99 of
/// 2.6 ms with a harvest every round and 1.8 ms with one every 8th
/// (medians of 10 alternating runs; requests/s level). Every 16th round
/// left too many events to the poller thread (15% fewer requests/s).
pub const SEARCH_HARVEST_EVERY: u32 = 8;
/// Loop turns between two looks at the worker's own timer wheel.
pub const TIMER_POLL: u32 = 4;

/// Worker slot states.
pub(crate) const DEAD: u8 = 0;
pub(crate) const STARTING: u8 = 1;
pub(crate) const ACTIVE: u8 = 2;
pub(crate) const DRAINING: u8 = 3;

/// Does a worker in `state` take fibers pushed to its inbox? A STARTING
/// worker does (its thread is about to run its loop); a DRAINING or DEAD
/// one does not (pushers then move its inbox to the global queue, and idle
/// workers take what is left there, see `steal`).
#[inline]
fn accepts_inbox(state: u8) -> bool {
    state == ACTIVE || state == STARTING
}

/// Per-worker shared state (one cache-padded slot per possible worker).
///
/// `repr(C)` in three groups, each starting on a 128-byte boundary (two
/// cache lines: the adjacent-line prefetcher pulls pairs): the fields the
/// owner writes at every spawn, wake and run; the fields other threads
/// read or write (stealers, state, the futex word); and the inbox (whose
/// ends are padded by `SegQueue` itself). With the first two groups on
/// one line, a thief's every look at `stealer` took the line holding
/// `runnext` from the owner, and the owner's next spawn paid a cross-core
/// miss for it (W1 spawn-join: 11% of the profile on that one exchange).
#[repr(C)]
pub(crate) struct Slot {
    // ---- Owner-written (read by others only for diagnostics, the
    // ---- monitor's samples, or when the owner is stuck).
    /// The fiber this worker runs next (its latest spawn or wake). Only the
    /// owner fills it; the owner takes it, and so does the monitor when the
    /// owner is stuck (it moves the fiber to the global queue).
    pub(crate) runnext: RunnextSlot,
    /// Owner-written counters (Relaxed).
    pub(crate) enqueued: AtomicU64,
    pub(crate) dequeued: AtomicU64,
    pub(crate) steals: AtomicU64,
    pub(crate) spawns: AtomicU64,
    pub(crate) parks: AtomicU64,
    pub(crate) wakes: AtomicU64,
    /// Bumped by the worker at each fiber it starts and when it goes idle
    /// (Relaxed; read by the monitor only).
    pub(crate) heartbeat: AtomicU64,
    /// Id of the fiber running now, 0 when none (Relaxed; diagnostics).
    pub(crate) running: AtomicU64,
    pub(crate) running_at: AtomicPtr<Location<'static>>,
    /// Live pinned fibers whose home is this worker (owner-written,
    /// Relaxed): a worker with any never retires, so they can resume.
    pub(crate) homed: AtomicU64,
    /// Is the worker inside `blocking`?
    pub(crate) blocking: AtomicBool,
    _shared_group: LineGroup,
    // ---- Read (and some written) by other threads.
    pub(crate) state: AtomicU8,
    /// Set by the monitor while the worker makes no progress.
    pub(crate) stalled: AtomicBool,
    pub(crate) futex: AtomicU32,
    /// Steals from the LIFO deque of spawned and woken fibers.
    pub(crate) stealer: Stealer<Runnable>,
    /// Steals from the FIFO deque of yielded fibers.
    pub(crate) yield_stealer: Stealer<Runnable>,
    /// Successful steals from this worker's deques, bumped by the thieves
    /// (Relaxed; read by the monitor only): while it moves, the fibers
    /// queued here are being taken, so the monitor need not move them to
    /// the global queue when this worker is stuck.
    pub(crate) stolen_from: AtomicU64,
    /// Set while the worker sleeps in the I/O driver (`io_park`).
    pub(crate) io_waiting: crate::idle::IoWaiting,
    /// The worker's wait in the I/O driver, made at its first `io_park`
    /// sleep (`None` inside if the I/O layer has none).
    pub(crate) io_waiter: std::sync::OnceLock<Option<Box<dyn fiber_core::IoWaiter>>>,
    /// The deques' owner ends, parked here while no thread owns the slot.
    pub(crate) deque: Mutex<Option<(Deque<Runnable>, Deque<Runnable>)>>,
    _inbox_group: LineGroup,
    // ---- Pushed to by other threads, popped by the owner.
    pub(crate) inbox: SegQueue<Runnable>,
}

/// A zero-sized field that starts the next field of a `repr(C)` struct on
/// a 128-byte boundary.
#[derive(Default)]
#[repr(align(128))]
struct LineGroup;

/// A one-fiber slot that the owner fills and any thread may empty (a
/// `Runnable` kept as a raw pointer).
#[derive(Default)]
pub(crate) struct RunnextSlot(std::sync::atomic::AtomicPtr<()>);

impl RunnextSlot {
    /// Put `fiber` in, returning the one it displaced. Owner only.
    pub(crate) fn put(&self, fiber: Runnable) -> Option<Runnable> {
        // Only the owner fills the slot; others can only empty it. So an
        // empty slot stays empty until this store, and a plain store (no
        // read-modify-write) is exact: the common case of a worker that
        // runs its runnext fiber before it wakes the next one.
        // Relaxed: nothing to take from a null slot.
        if self.0.load(std::sync::atomic::Ordering::Relaxed).is_null() {
            // Release: hands the fiber to whoever takes it (their Acquire
            // swap in `take`).
            self.0
                .store(fiber.into_raw().as_ptr(), std::sync::atomic::Ordering::Release);
            return None;
        }
        // AcqRel: Release hands the fiber to whoever takes it (their
        // Acquire swap); Acquire takes the displaced one from its putter.
        let old = self
            .0
            .swap(fiber.into_raw().as_ptr(), std::sync::atomic::Ordering::AcqRel);
        // SAFETY: every non-null value in the slot came from `into_raw`, and
        // the swap moved it out of the slot to us alone.
        std::ptr::NonNull::new(old).map(|p| unsafe { Runnable::from_raw(p) })
    }

    /// Take the fiber out, if any.
    pub(crate) fn take(&self) -> Option<Runnable> {
        if self.0.load(std::sync::atomic::Ordering::Relaxed).is_null() {
            return None;
        }
        // AcqRel: Acquire pairs with the Release of `put`.
        let old = self.0.swap(std::ptr::null_mut(), std::sync::atomic::Ordering::AcqRel);
        // SAFETY: as in `put`: the swap gave us the only copy.
        std::ptr::NonNull::new(old).map(|p| unsafe { Runnable::from_raw(p) })
    }

    /// Is a fiber in the slot (a snapshot)?
    pub(crate) fn is_occupied(&self) -> bool {
        !self.0.load(std::sync::atomic::Ordering::Relaxed).is_null()
    }
}

impl Drop for RunnextSlot {
    fn drop(&mut self) {
        drop(self.take());
    }
}

impl std::fmt::Debug for RunnextSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("RunnextSlot").field(&self.is_occupied()).finish()
    }
}

/// State shared by every worker, the monitor and the runtime handle.
pub(crate) struct Shared {
    pub(crate) id: usize,
    pub(crate) config: Config,
    pub(crate) pool: Arc<FramePool>,
    pub(crate) global: GlobalQueue,
    pub(crate) slots: Box<[CachePadded<Slot>]>,
    pub(crate) idle: Idle,
    pub(crate) timers: Timers,
    pub(crate) counters: Counters,
    pub(crate) shutdown: AtomicBool,
    /// Why a worker failed to start (its `on_thread_start` hook panicked).
    pub(crate) start_failure: Mutex<Option<String>>,
    /// Worker threads alive (ACTIVE or STARTING or DRAINING).
    pub(crate) alive: AtomicUsize,
    /// Alive workers that count toward the minimum (`config.workers`): all
    /// but those that are leaving. An idle worker retires only by taking
    /// one off while more than the minimum stay (`try_leave`), so the pool
    /// never shrinks below it by retirement, whichever slots are left.
    pub(crate) staying: AtomicUsize,
    /// Round-robin cursor for spawns from outside.
    pub(crate) round_robin: AtomicUsize,
    /// Enqueues made from outside the workers (Relaxed).
    pub(crate) external_enqueued: AtomicU64,
    pub(crate) threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    pub(crate) monitor: Mutex<Option<std::thread::Thread>>,
    /// Ids of the `block_on` root fibers running now (deadlock reports;
    /// several plain threads may each run a `block_on`).
    pub(crate) root_fibers: Mutex<Vec<u64>>,
    /// Pinned fibers woken after their home worker stopped (shutdown):
    /// they must not run on another thread (their stacks may point into
    /// the home thread's thread-locals), so they wait here for teardown,
    /// which gives them up.
    pub(crate) orphans: Mutex<Vec<Runnable>>,
    /// A worker sleeps in the I/O driver (`io_park`): at most one at a
    /// time, the others sleep on their words.
    pub(crate) io_sleeper: AtomicBool,
    /// Shutdown: per slot, the receiving end through which teardown hands
    /// a worker its pinned fibers to unwind (set before the workers are
    /// told to stop; a worker that stops with such a fiber alive takes
    /// its end and serves it, see `serve_homed_fibers`).
    pub(crate) home_requests: Mutex<Vec<Option<std::sync::mpsc::Receiver<HomeRequest>>>>,
    /// Shutdown: the worker threads that left their loops and stay up to
    /// resume their pinned fibers for teardown (slot index, thread).
    pub(crate) serving: Mutex<Vec<(usize, std::thread::ThreadId)>>,
}

/// A pinned fiber that teardown hands to its home worker, and where the
/// worker sends the outcome of resuming it there.
pub(crate) type HomeRequest = (Runnable, std::sync::mpsc::SyncSender<RunOutcome>);

fn next_runtime_id() -> usize {
    // Not a protocol: a unique counter.
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl Shared {
    pub(crate) fn new(config: Config) -> Shared {
        let slots: Vec<CachePadded<Slot>> = (0..config.max_workers)
            .map(|_| {
                let deque = Deque::new_lifo();
                let yields = Deque::new_fifo();
                CachePadded::new(Slot {
                    state: AtomicU8::new(DEAD),
                    futex: AtomicU32::new(0),
                    heartbeat: AtomicU64::new(0),
                    running: AtomicU64::new(0),
                    homed: AtomicU64::new(0),
                    runnext: RunnextSlot::default(),
                    io_waiting: crate::idle::IoWaiting::default(),
                    io_waiter: std::sync::OnceLock::new(),
                    running_at: AtomicPtr::new(std::ptr::null_mut()),
                    stalled: AtomicBool::new(false),
                    inbox: SegQueue::new(),
                    stealer: deque.stealer(),
                    yield_stealer: yields.stealer(),
                    stolen_from: AtomicU64::new(0),
                    deque: Mutex::new(Some((deque, yields))),
                    enqueued: AtomicU64::new(0),
                    dequeued: AtomicU64::new(0),
                    steals: AtomicU64::new(0),
                    spawns: AtomicU64::new(0),
                    parks: AtomicU64::new(0),
                    wakes: AtomicU64::new(0),
                    blocking: AtomicBool::new(false),
                    _shared_group: LineGroup,
                    _inbox_group: LineGroup,
                })
            })
            .collect();
        Shared {
            id: next_runtime_id(),
            pool: Arc::new(FramePool::new(config.stacks)),
            global: GlobalQueue::new(),
            idle: Idle::new(config.max_workers),
            timers: Timers::new(config.max_workers),
            counters: Counters::default(),
            shutdown: AtomicBool::new(false),
            io_sleeper: AtomicBool::new(false),
            start_failure: Mutex::new(None),
            alive: AtomicUsize::new(0),
            staying: AtomicUsize::new(0),
            round_robin: AtomicUsize::new(0),
            external_enqueued: AtomicU64::new(0),
            threads: Mutex::new(Vec::new()),
            monitor: Mutex::new(None),
            root_fibers: Mutex::new(Vec::new()),
            orphans: Mutex::new(Vec::new()),
            home_requests: Mutex::new(Vec::new()),
            serving: Mutex::new(Vec::new()),
            slots: slots.into_boxed_slice(),
            config,
        }
    }

    pub(crate) fn word_of(&self, worker: usize) -> &AtomicU32 {
        &self.slots[worker].futex
    }

    /// Wake one sleeping worker if none is searching.
    pub(crate) fn notify_one(&self) {
        if let Some(worker) = self.idle.notify_one(|i| self.word_of(i)) {
            self.wake_io(worker);
            self.counters.wakeups.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// After `worker`'s word was set: if it sleeps in the I/O driver
    /// (`io_park`), it does not watch the word; wake that wait too.
    pub(crate) fn wake_io(&self, worker: usize) {
        if !self.config.io_park {
            return;
        }
        let slot = &self.slots[worker];
        if slot.io_waiting.must_wake() {
            if let Some(Some(waiter)) = slot.io_waiter.get() {
                waiter.wake();
            }
        }
    }

    pub(crate) fn is_shutdown(&self) -> bool {
        // Acquire: pairs with the Release store in `Runtime::shutdown`.
        self.shutdown.load(Ordering::Acquire)
    }

    /// Does any queue hold a fiber (what a worker checks before sleeping)?
    pub(crate) fn has_work(&self, me: Option<usize>) -> bool {
        if !self.global.is_empty() {
            return true;
        }
        self.slots.iter().enumerate().any(|(i, slot)| {
            (Some(i) == me && !slot.inbox.is_empty())
                || (slot.stalled.load(Ordering::Relaxed) && slot.runnext.is_occupied())
                || !slot.stealer.is_empty()
                || !slot.yield_stealer.is_empty()
                || (!accepts_inbox(slot.state.load(Ordering::Relaxed))
                    && !slot.inbox.is_empty()
                    && !self.inbox_stays(i))
        })
    }

    /// Worker `i` is drained (not shut down) with fibers bound to it: it
    /// takes up its work again once its slice ends (`run_loop`) and runs
    /// its inbox itself, so the inbox is no work for the others.
    fn inbox_stays(&self, i: usize) -> bool {
        let slot = &self.slots[i];
        slot.state.load(Ordering::Relaxed) == DRAINING && !self.is_shutdown() && slot.homed.load(Ordering::Relaxed) > 0
    }

    /// Push to worker `target`'s inbox; if it is no longer ACTIVE, move its
    /// inbox to the global queue ourselves (retirement never strands work).
    fn push_inbox(&self, target: usize, fiber: Runnable) {
        let slot = &self.slots[target];
        slot.inbox.push(fiber);
        self.counters.inbox_pushes.fetch_add(1, Ordering::Relaxed);
        // SeqCst fence: Dekker pair with `retire` (DRAINING; fence; drain
        // inbox) vs (push; fence; read state).
        fence(Ordering::SeqCst);
        let state = slot.state.load(Ordering::Relaxed);
        if !accepts_inbox(state) {
            // A drained worker with fibers bound to it takes up its work
            // again (`run_loop`): those stay in its inbox, only the others
            // move. Moved too, a pinned fiber came back here from the
            // global queue at once (`worker_next` sends it home), and
            // workers went round that loop until the drained worker's
            // slice ended.
            let keep_homed = state == DRAINING && !self.is_shutdown();
            let mut kept = Vec::new();
            let mut moved = false;
            while let Some(fiber) = slot.inbox.pop() {
                if keep_homed && fiber.home() == Some(target) {
                    kept.push(fiber);
                } else {
                    self.global.push(fiber);
                    moved = true;
                }
            }
            for fiber in kept {
                slot.inbox.push(fiber);
            }
            if moved {
                self.notify_one();
            }
        } else if deferred::record(target) {
            // A batch (timer firing) notifies each target once at its end.
        } else if !self.idle.notify_worker(target, &slot.futex) {
            // Awake (or searching): it will see its inbox.
        } else {
            self.wake_io(target);
            self.counters.wakeups.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Push a pinned fiber to its home worker's inbox; gives it back if
    /// that worker no longer takes work (the runtime is shutting down). A
    /// home being drained takes it and keeps it (`push_inbox`, `steal`): a
    /// worker with a fiber bound to it does not leave when drained
    /// (`run_loop`), it takes up its work again.
    pub(crate) fn send_home(&self, home: usize, fiber: Runnable) -> Option<Runnable> {
        let slot = &self.slots[home];
        let state = slot.state.load(Ordering::Relaxed);
        let draining_home = state == DRAINING && !self.is_shutdown();
        if !accepts_inbox(state) && !draining_home {
            return Some(fiber);
        }
        self.push_inbox(home, fiber);
        None
    }

    /// Placement of a fiber scheduled from outside the workers.
    fn schedule_external(&self, fiber: Runnable) {
        self.external_enqueued.fetch_add(1, Ordering::Relaxed);
        if fiber.last_worker().is_none() {
            self.counters.external_spawns.fetch_add(1, Ordering::Relaxed);
        }
        let target = match fiber.last_worker() {
            _ if deferred::to_global() => None,
            Some(w) if w < self.slots.len() => Some(w).filter(|&w| {
                let slot = &self.slots[w];
                accepts_inbox(slot.state.load(Ordering::Relaxed))
                    && !slot.stalled.load(Ordering::Relaxed)
                    && slot.inbox.len() < INBOX_LIMIT
            }),
            Some(_) => None,
            None => self.round_robin_target(),
        };
        match target {
            Some(w) => self.push_inbox(w, fiber),
            None => {
                self.global.push(fiber);
                self.counters.global_pushes.fetch_add(1, Ordering::Relaxed);
                if !deferred::record(usize::MAX) {
                    self.notify_one();
                }
            }
        }
    }

    fn round_robin_target(&self) -> Option<usize> {
        let n = self.slots.len();
        let start = self.round_robin.fetch_add(1, Ordering::Relaxed);
        (0..n).map(|k| (start + k) % n).find(|&w| {
            let slot = &self.slots[w];
            accepts_inbox(slot.state.load(Ordering::Relaxed)) && !slot.stalled.load(Ordering::Relaxed)
        })
    }
}

impl Schedule for Shared {
    fn schedule(&self, fiber: Runnable) {
        let ctx = context::get();
        if !ctx.is_null() {
            // SAFETY: a non-null context is the live `WorkerCtx` of this
            // thread's worker loop (set for the loop's whole run); we only
            // use it on this thread.
            let ctx = unsafe { &*ctx };
            if ctx.shared_id == self.id {
                match fiber.home() {
                    Some(home) if home != ctx.index => {
                        let slot = &self.slots[ctx.index];
                        let counter = if fiber.last_worker().is_none() {
                            &slot.spawns
                        } else {
                            &slot.wakes
                        };
                        match self.send_home(home, fiber) {
                            // Queued in its home's inbox: counted here as
                            // queued, since its run there counts it taken
                            // (uncounted, every such wake left the pressure
                            // one lower for good, and growth and the
                            // monitor's backstop read "nothing runnable").
                            None => {
                                bump(counter);
                                bump(&slot.enqueued);
                            }
                            Some(fiber) => ctx.push_local(self, fiber),
                        }
                    }
                    _ if ctx.timer_pass.get() => ctx.timer_woken.borrow_mut().push(fiber),
                    _ if ctx.harvesting.get() => ctx.push_harvested(self, fiber),
                    _ => ctx.push_local(self, fiber),
                }
                return;
            }
        }
        self.schedule_external(fiber);
    }

    fn wake_at(&self, deadline: Instant, waiter: Waiter) {
        // A worker of this runtime arms in its own wheel; anyone else in
        // the shared one (the monitor drives it).
        let ctx = context::get();
        // SAFETY: a non-null context is this thread's live `WorkerCtx` (as
        // in `schedule`); we only use it on this thread.
        let ctx = (!ctx.is_null())
            .then(|| unsafe { &*ctx })
            .filter(|c| c.shared_id == self.id);
        let at = self.timers.tick_of(deadline);
        if let Some(ctx) = ctx {
            // The loop polls its wheel while this copy says it is not empty.
            ctx.own_next.set(ctx.own_next.get().min(at));
        }
        match self.timers.arm(ctx.map(|c| c.index), at, waiter) {
            Armed::Due(waiter) => {
                fiber_wake(&waiter);
            }
            Armed::Queued(true) => {
                // The monitor plans to sleep past this deadline: tell it.
                if let Some(monitor) = lock(&self.monitor).as_ref() {
                    monitor.unpark();
                }
            }
            Armed::Queued(false) => {}
        }
    }

    fn frames(&self) -> &FramePool {
        &self.pool
    }

    fn pins_fibers(&self) -> bool {
        self.config.pinned
    }
}

/// The worker thread's own state.
pub(crate) struct WorkerCtx {
    shared_id: usize,
    shared: Arc<Shared>,
    pub(crate) index: usize,
    local: Deque<Runnable>,
    /// Is a chain of runnext hand-offs running (the last look took the
    /// runnext slot's fiber)?
    in_chain: Cell<bool>,
    /// The coarse clock when the current runnext chain started.
    chain_since_ms: Cell<u64>,
    /// Looks of the current chain (`CHAIN_CLOCK_EVERY`).
    chain_looks: Cell<u32>,
    /// Does the current chain go on after this look (it took the runnext
    /// slot's fiber, or the chain's fiber that a wake displaced from that
    /// slot, or a late fairness look interrupted the chain)?
    picked_runnext: Cell<bool>,
    /// The chain's next fiber, pushed down onto the local deque when a
    /// wake or spawn took its runnext slot during the chain (the first one
    /// pushed down, if several were). Until it is popped again, every pop
    /// from the deque goes on with the chain's slice: the fibers above it
    /// (later wakes of the same timer pass, a batch from the global queue)
    /// come out first.
    chain_displaced: Cell<Option<fiber_core::FiberId>>,
    /// The coarse clock at the last fairness look (`FAIR_LOOK_MS`).
    fair_look_ms: Cell<u64>,
    /// The coarse clock at the last look that aged out the local deque
    /// (`age_out_local`); apart from `fair_look_ms`, which every counted
    /// look resets.
    age_look_ms: Cell<u64>,
    /// Late fairness looks so far: where the next one starts.
    late_looks: Cell<u32>,
    /// Fibers that yielded, in order, behind everything else (stealable).
    yielded: Deque<Runnable>,
    tick: Cell<u64>,
    rng: Cell<u64>,
    /// Reused buffer of fired timers.
    due: RefCell<Vec<Waiter>>,
    /// Loop turns, for polling the worker's own wheel.
    timer_poll: Cell<u32>,
    /// This thread's copy of its wheel's `next` (`NEVER`: empty), lowered
    /// when it arms and refreshed when it polls: the loop's check costs
    /// one load from this thread's own state while the wheel is empty.
    own_next: Cell<u64>,
    /// Set while this worker takes ready I/O (`IoPoll`): the fibers it
    /// wakes queue FIFO behind the others (`yielded`), not in the LIFO
    /// runnext slot and deque, so under load no connection's fiber is
    /// pushed back by the ones woken after it.
    harvesting: Cell<bool>,
    /// Set while this worker wakes the fibers of a timer wheel pass
    /// (`fire_wheel`): they are claimed in deadline order (so the effects
    /// of the wakes keep that order) but collected in `timer_woken` and
    /// queued after the pass, latest first, so that the LIFO runnext slot
    /// and deque run them in deadline order.
    timer_pass: Cell<bool>,
    timer_woken: RefCell<Vec<Runnable>>,
    /// Where a steal lands first (always empty between steals): the
    /// stolen fibers pass through `stolen` on their way to our deques, so
    /// that their frames and stacks can be prefetched (see `steal`).
    steal_scratch: Deque<Runnable>,
    stolen: RefCell<Vec<Runnable>>,
}

/// Owner-only counter bump (single writer, Relaxed).
#[inline]
fn bump(counter: &AtomicU64) {
    counter.store(counter.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
}

impl WorkerCtx {
    /// The runtime this worker belongs to.
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Queue a fiber woken by this worker's I/O harvest: FIFO and
    /// stealable, so a sleeper is woken for it as for a displaced fiber.
    fn push_harvested(&self, shared: &Shared, fiber: Runnable) {
        let slot = &shared.slots[self.index];
        bump(&slot.wakes);
        self.yielded.push(fiber);
        bump(&slot.enqueued);
        // The notifier's half of the idle handshake, as in `push_local`.
        shared.notify_one();
    }

    /// Take the ready I/O events (fiber-core's `IoPoll` hook); the fibers
    /// they wake queue FIFO on this worker. Returns how many events.
    fn harvest_io(&self, io: &dyn fiber_core::IoPoll) -> usize {
        self.harvesting.set(true);
        let n = io.poll_ready();
        self.harvesting.set(false);
        n
    }

    fn push_local(&self, shared: &Shared, fiber: Runnable) {
        let slot = &shared.slots[self.index];
        bump(if fiber.last_worker().is_none() {
            &slot.spawns
        } else {
            &slot.wakes
        });
        if slot.state.load(Ordering::Relaxed) == DRAINING {
            // This worker is leaving (drained for no progress): its fiber's
            // spawns and wakes go where the others can take them.
            bump(&slot.enqueued);
            shared.global.push(fiber);
            shared.notify_one();
            return;
        }
        let displaced = slot.runnext.put(fiber);
        bump(&slot.enqueued);
        let Some(previous) = displaced else {
            // Only the runnext slot holds new work: this worker runs it as
            // soon as the current fiber parks or yields, which is what a
            // spawn-then-join or a send-then-recv does next. Waking a
            // sleeper for it would cost a futex wake per handoff for a
            // worker that finds nothing to steal. If the current fiber keeps
            // running instead, the monitor moves the slot's fiber to the
            // global queue (and wakes a sleeper) within its stuck threshold.
            return;
        };
        if self.in_chain.get() && self.chain_displaced.get().is_none() {
            self.chain_displaced.set(Some(previous.id()));
        }
        self.local.push(previous);
        // The notifier's half of the idle handshake: `Idle::notify_one`
        // fences (publish work; fence; read sleepers) against a sleeper's
        // (announce; fence; look for work), so a worker going to sleep
        // either sees the stealable fiber or is counted and woken here.
        shared.notify_one();
    }

    fn next_random(&self) -> u64 {
        let mut x = self.rng.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng.set(x);
        x
    }
}

/// Deferred notification for batches of wakes from outside the workers
/// (the monitor firing thousands of timers): each push records its target
/// instead of notifying; the batch notifies every target once at its end.
pub(crate) mod deferred {
    use std::cell::{Cell, RefCell};

    thread_local! {
        static TARGETS: RefCell<Option<Vec<usize>>> = const { RefCell::new(None) };
        static TO_GLOBAL: Cell<bool> = const { Cell::new(false) };
    }

    /// Does the open batch send every fiber to the global queue (the
    /// monitor firing a busy worker's timers: its inbox would wait for it)?
    pub(crate) fn to_global() -> bool {
        TO_GLOBAL.with(|g| g.get())
    }

    /// Run `f` as a batch whose fibers all go to the global queue.
    pub(crate) fn batch_to_global<R>(f: impl FnOnce() -> R) -> (R, Vec<usize>) {
        TO_GLOBAL.with(|g| g.set(true));
        let out = batch(f);
        TO_GLOBAL.with(|g| g.set(false));
        out
    }

    /// Record `target` (`usize::MAX`: the global queue) if a batch is open.
    /// A wake from a thread-local destructor at thread exit may find
    /// `TARGETS` destroyed: no batch is open there, the push notifies.
    pub(crate) fn record(target: usize) -> bool {
        TARGETS
            .try_with(|t| match t.borrow_mut().as_mut() {
                Some(targets) => {
                    if !targets.contains(&target) {
                        targets.push(target);
                    }
                    true
                }
                None => false,
            })
            .unwrap_or(false)
    }

    /// Run `f` as a batch; returns its value and the recorded targets.
    /// (Where `TARGETS` is gone, `record` declines and every push notifies
    /// at once.)
    pub(crate) fn batch<R>(f: impl FnOnce() -> R) -> (R, Vec<usize>) {
        let _ = TARGETS.try_with(|t| *t.borrow_mut() = Some(Vec::new()));
        let r = f();
        let targets = TARGETS
            .try_with(|t| t.borrow_mut().take())
            .ok()
            .flatten()
            .unwrap_or_default();
        (r, targets)
    }
}

impl Shared {
    /// The monitor's timer pass at `now`: fire the shared wheel if due,
    /// and each worker's wheel that is overdue by `GRACE` (its owner is busy
    /// in a fiber that does not yield, or gone). The fibers woken go to the
    /// global queue (not to the busy owner's inbox), and sleepers are
    /// notified once at the end. Returns how many timers fired.
    pub(crate) fn fire_timers_from_monitor(&self, now: Instant) -> usize {
        let tick = self.timers.now_tick(now);
        let late = tick.saturating_sub(crate::timer::GRACE_TICKS);
        let mut due = Vec::new();
        if self.timers.is_due(None, tick) {
            self.timers.advance(None, tick, &mut due);
        }
        for index in 0..self.slots.len() {
            let owner_gone = !accepts_inbox(self.slots[index].state.load(Ordering::Relaxed));
            let cutoff = if owner_gone { tick } else { late };
            if self.timers.is_due(Some(index), cutoff) {
                self.timers.advance(Some(index), tick, &mut due);
            }
        }
        if due.is_empty() {
            return 0;
        }
        let (fired, targets) = deferred::batch_to_global(|| {
            for waiter in &due {
                fiber_wake(waiter);
            }
            due.len()
        });
        drop(due);
        for target in targets {
            if target == usize::MAX {
                let sleeping = self.idle.sleeping();
                for _ in 0..sleeping.max(1) {
                    self.notify_one();
                }
            } else if self.idle.notify_worker(target, &self.slots[target].futex) {
                self.wake_io(target);
                self.counters.wakeups.fetch_add(1, Ordering::Relaxed);
            }
        }
        fired
    }
}

/// The worker context of this thread (PITFALLS 1: read through a
/// non-inlined accessor, never cached across a fiber switch).
pub(crate) mod context {
    use super::WorkerCtx;
    use std::cell::Cell;

    thread_local! {
        static CONTEXT: Cell<*const WorkerCtx> = const { Cell::new(std::ptr::null()) };
    }

    #[inline(never)]
    pub(crate) fn get() -> *const WorkerCtx {
        CONTEXT.with(|c| c.get())
    }

    #[inline(never)]
    pub(crate) fn set(ctx: *const WorkerCtx) {
        CONTEXT.with(|c| c.set(ctx))
    }
}

/// Start a worker thread in slot `index` (DEAD -> STARTING). Returns `false`
/// if the slot is taken or the thread could not start.
pub(crate) fn spawn_worker(shared: &Arc<Shared>, index: usize) -> bool {
    let slot = &shared.slots[index];
    if slot
        .state
        .compare_exchange(DEAD, STARTING, Ordering::AcqRel, Ordering::Relaxed)
        .is_err()
    {
        return false;
    }
    let Some(deque) = lock(&slot.deque).take() else {
        slot.state.store(DEAD, Ordering::Release);
        return false;
    };
    shared.alive.fetch_add(1, Ordering::AcqRel);
    // Relaxed: a count for retirement decisions, changed by CAS only.
    shared.staying.fetch_add(1, Ordering::Relaxed);
    let worker_shared = shared.clone();
    let name = format!("{}-{}", shared.config.thread_name, index);
    // The deques reach the thread through a hand-off slot, not inside the
    // closure: a spawn that fails drops the closure, and the slot's stealer
    // is tied to the deque's owner end, so the slot keeps it and can be
    // started again later (one failed growth used to lose the slot).
    let handoff = std::sync::Arc::new(std::sync::Mutex::new(Some(deque)));
    let theirs = handoff.clone();
    match std::thread::Builder::new().name(name).spawn(move || {
        let deque = theirs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
            .expect("the deques are handed over once");
        drop(theirs);
        worker_main(worker_shared, index, deque)
    }) {
        Ok(handle) => {
            lock(&shared.threads).push(handle);
            true
        }
        Err(_) => {
            // The slot gets its deques back and is DEAD again: a later
            // growth may try it again. Count the failure.
            *lock(&slot.deque) = handoff.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
            shared.alive.fetch_sub(1, Ordering::AcqRel);
            shared.staying.fetch_sub(1, Ordering::Relaxed);
            shared.counters.spawn_failures.fetch_add(1, Ordering::Relaxed);
            slot.state.store(DEAD, Ordering::Release);
            false
        }
    }
}

fn worker_main(shared: Arc<Shared>, index: usize, deques: (Deque<Runnable>, Deque<Runnable>)) {
    let (deque, yields) = deques;
    // For the thread's whole life, hooks and thread-local destructors
    // included (the worker context is cleared before those run).
    WORKER_THREAD_OF.with(|id| id.set(shared.id));
    if let Some(hook) = &shared.config.on_thread_start {
        if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (hook.0)())) {
            // The worker never starts: its slot goes back to DEAD (with its
            // deque, so it can be started again) and the failure is kept
            // for `Runtime::build` to report.
            let msg = panic_message(&*payload);
            *lock(&shared.start_failure) = Some(format!("on_thread_start panicked on worker {index}: {msg}"));
            let slot = &shared.slots[index];
            *lock(&slot.deque) = Some((deque, yields));
            slot.state.store(DEAD, Ordering::Release);
            shared.alive.fetch_sub(1, Ordering::AcqRel);
            shared.staying.fetch_sub(1, Ordering::Relaxed);
            // Whatever was pushed to its inbox while it was STARTING moves
            // to the global queue.
            while let Some(fiber) = slot.inbox.pop() {
                shared.global.push(fiber);
            }
            shared.notify_one();
            return;
        }
    }
    FramePool::register_thread(&shared.pool);
    let ctx = WorkerCtx {
        shared_id: shared.id,
        shared: shared.clone(),
        index,
        local: deque,
        in_chain: Cell::new(false),
        chain_since_ms: Cell::new(0),
        chain_looks: Cell::new(0),
        picked_runnext: Cell::new(false),
        chain_displaced: Cell::new(None),
        fair_look_ms: Cell::new(fiber_core::coarse_clock_ms()),
        age_look_ms: Cell::new(fiber_core::coarse_clock_ms()),
        late_looks: Cell::new(0),
        yielded: yields,
        tick: Cell::new(0),
        rng: Cell::new(0x9E37_79B9_7F4A_7C15 ^ ((index as u64 + 1) << 17)),
        due: RefCell::new(Vec::new()),
        timer_poll: Cell::new(0),
        // The slot's wheel outlives its threads (a retired worker's timers
        // stay for the next one).
        own_next: Cell::new(shared.timers.wheel(Some(index)).next_tick()),
        harvesting: Cell::new(false),
        timer_pass: Cell::new(false),
        timer_woken: RefCell::new(Vec::new()),
        steal_scratch: Deque::new_fifo(),
        stolen: RefCell::new(Vec::new()),
    };
    context::set(&ctx);
    let slot = &shared.slots[index];
    slot.state.store(ACTIVE, Ordering::Release);
    let leave = run_loop(&shared, &ctx);
    if leave == Leave::Shutdown {
        // Retirement and draining gave up the count already.
        shared.staying.fetch_sub(1, Ordering::Relaxed);
    }
    // Leaving (shutdown, retirement or draining): nothing runnable stays
    // behind.
    slot.state.store(DRAINING, Ordering::Release);
    fence(Ordering::SeqCst);
    let moved = drain_to_global(&shared, &ctx);
    if moved > 0 && !shared.is_shutdown() {
        // Now, not after the `on_thread_stop` hook: a fiber a plain thread
        // pushed to this worker's inbox as it retired would otherwise wait
        // in the global queue for as long as the hook runs, or for the
        // monitor's backstop, while the other workers sleep.
        shared.notify_one();
    }
    if leave == Leave::Shutdown {
        serve_homed_fibers(&shared, &ctx);
    }
    context::set(std::ptr::null());
    FramePool::unregister_thread();
    let WorkerCtx { local, yielded, .. } = ctx;
    *lock(&slot.deque) = Some((local, yielded));
    slot.running.store(0, Ordering::Relaxed);
    if let Some(hook) = &shared.config.on_thread_stop {
        // A panicking hook must not skip the bookkeeping below (the slot
        // stayed counted alive with no thread: the pool could never grow
        // again).
        if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (hook.0)())) {
            let msg = panic_message(&*payload);
            // Its own destructor may panic too: never here.
            if let Err(again) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(payload))) {
                std::mem::forget(again);
            }
            eprintln!("fiber: on_thread_stop panicked on worker {index} ({msg}); the worker stopped all the same");
        }
    }
    slot.state.store(DEAD, Ordering::Release);
    shared.alive.fetch_sub(1, Ordering::AcqRel);
}

/// The text of a hook's panic payload, for the report.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string panic".to_string())
}

fn drain_to_global(shared: &Shared, ctx: &WorkerCtx) -> usize {
    let mut moved = 0;
    if let Some(fiber) = shared.slots[ctx.index].runnext.take() {
        shared.global.push(fiber);
        moved += 1;
    }
    while let Some(fiber) = ctx.local.pop() {
        shared.global.push(fiber);
        moved += 1;
    }
    while let Some(fiber) = ctx.yielded.pop() {
        shared.global.push(fiber);
        moved += 1;
    }
    while let Some(fiber) = shared.slots[ctx.index].inbox.pop() {
        shared.global.push(fiber);
        moved += 1;
    }
    moved
}

/// Shutdown, after this worker's loop has ended: if a live fiber is bound
/// to this thread (pinned here, or kept here for an unwind), stay up and
/// resume the fibers teardown hands over (`FramePool::teardown_with_homes`)
/// until the shutdown drops its end: their stacks may point into this
/// thread's thread-locals, which live until this thread exits, so this is
/// the one thread that may unwind them. One at a time, while the teardown
/// thread waits; what a resume schedules goes to the global queue, where
/// teardown drains it.
fn serve_homed_fibers(shared: &Shared, ctx: &WorkerCtx) {
    let requests = lock(&shared.home_requests).get_mut(ctx.index).and_then(Option::take);
    let Some(requests) = requests else { return };
    // Exact here: this worker resumes no fiber of its own any more, so no
    // fiber can become bound to it.
    if !shared.pool.any_homed_at(ctx.index) {
        return;
    }
    lock(&shared.serving).push((ctx.index, std::thread::current().id()));
    while let Ok((runnable, reply)) = requests.recv() {
        let outcome = runnable.into_running().resume(ctx.index);
        // Pins for unwinds are the teardown's business now (as on the
        // teardown thread).
        // SAFETY: this thread resumed the fiber just now.
        let _ = unsafe { fiber_core::take_unwind_pin_delta() };
        drain_to_global(shared, ctx);
        let _ = reply.send(outcome);
    }
}

/// Why a worker's loop ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Leave {
    Shutdown,
    /// Idle for its timeout with more than the minimum staying.
    Retired,
    /// Drained by the monitor for making no progress.
    Drained,
}

/// Take one worker off `staying` if more than the minimum would stay.
pub(crate) fn try_leave(shared: &Shared) -> bool {
    let mut n = shared.staying.load(Ordering::Relaxed);
    while n > shared.config.workers {
        // Relaxed: the count is the only data; CAS makes it exact.
        match shared
            .staying
            .compare_exchange_weak(n, n - 1, Ordering::Relaxed, Ordering::Relaxed)
        {
            Ok(_) => return true,
            Err(now) => n = now,
        }
    }
    false
}

fn run_loop(shared: &Arc<Shared>, ctx: &WorkerCtx) -> Leave {
    let state = &shared.slots[ctx.index].state;
    loop {
        // DRAINING: the monitor gave up on this worker for making no
        // progress (seed 000 §6.2); it takes no new work and exits after the
        // slice that just ended. (Checked first: the monitor already took
        // it off `staying`, even if a shutdown began meanwhile.)
        if state.load(Ordering::Relaxed) == DRAINING {
            // Unless a fiber became bound to this thread in the slice that
            // got it drained (one that panicked and parked mid-unwind is
            // kept here until its unwind ends): then this worker is its
            // only possible home, and it takes up its work again (exact:
            // only this worker's own runs make the count grow). Its wakes
            // meanwhile came to its inbox (`send_home`).
            if shared.slots[ctx.index].homed.load(Ordering::Relaxed) > 0
                && state
                    .compare_exchange(DRAINING, ACTIVE, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
            {
                shared.staying.fetch_add(1, Ordering::Relaxed);
                // The drain was counted as a shrink (and a drain): counted
                // back, so ups minus downs stays the pool's size over its
                // minimum and drains count workers that left.
                shared.counters.drained_stuck.fetch_sub(1, Ordering::Relaxed);
                shared.counters.record_grow(format!(
                    "+1 worker (slot {}): drain undone, a fiber kept on it for an unwind is bound to it",
                    ctx.index
                ));
                continue;
            }
            return Leave::Drained;
        }
        if shared.is_shutdown() {
            return Leave::Shutdown;
        }
        // Our own wheel first: the fibers it wakes land in our queues. The
        // clock is read every `TIMER_POLL` turns (timers have 1 ms
        // resolution; a turn that runs long is covered by the monitor's
        // grace), and not at all while the wheel is empty.
        if ctx.own_next.get() != NEVER {
            let polls = ctx.timer_poll.get().wrapping_add(1);
            ctx.timer_poll.set(polls);
            if polls % TIMER_POLL == 0 {
                let now = shared.timers.now_tick(Instant::now());
                if shared.timers.is_due(Some(ctx.index), now) {
                    fire_wheel(shared, ctx, Some(ctx.index), now);
                }
                // Others may have fired it too: refresh our copy.
                ctx.own_next.set(shared.timers.wheel(Some(ctx.index)).next_tick());
            }
        }
        let mut worker = WorkerSide { shared, ctx };
        if let Some(fiber) = worker.worker_next() {
            run(shared, ctx, fiber);
            continue;
        }
        // Ready I/O first: fibers it wakes land on this worker, no hop
        // through the poller thread.
        if fiber_core::io_poll()
            .filter(|_| shared.config.io_harvest)
            .is_some_and(|io| ctx.harvest_io(io) > 0)
        {
            continue;
        }
        // Search briefly before sleeping, unless enough others search.
        if !shared.idle.try_start_searching(search_limit(shared)) {
            if !sleep(shared, ctx) {
                return Leave::Retired;
            }
            continue;
        }
        let mut found = None;
        for round in 0..SEARCH_ROUNDS {
            // Due timers first, any wheel's (an idle worker fires for a busy
            // one): a fiber they wake from this thread lands in our runnext,
            // which the look below takes.
            fire_any_due(shared, ctx);
            // And ready I/O, every few rounds (`SEARCH_HARVEST_EVERY`): an
            // event that arrives while this worker searches is taken here
            // rather than by the poller thread, which would have to wake a
            // worker for it.
            if round % SEARCH_HARVEST_EVERY == 0 {
                if let Some(io) = fiber_core::io_poll().filter(|_| shared.config.io_harvest) {
                    ctx.harvest_io(io);
                }
            }
            if let Some(fiber) = worker.worker_next() {
                found = Some(fiber);
                break;
            }
            if round < SEARCH_ROUNDS / 2 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        let last_searcher = shared.idle.stop_searching();
        if let Some(fiber) = found {
            if last_searcher {
                // Others may have skipped waking anyone because we were
                // searching: pass the search on.
                shared.notify_one();
            }
            run(shared, ctx, fiber);
            continue;
        }
        if !sleep(shared, ctx) {
            return Leave::Retired;
        }
    }
}

/// How many workers may search for work at once: half the configured
/// workers (at least 2, at most [`MAX_SEARCHERS`]).
fn search_limit(shared: &Shared) -> usize {
    (shared.config.workers / 2).clamp(2, MAX_SEARCHERS)
}

/// The most workers that search for work at once, however many there are.
const MAX_SEARCHERS: usize = 16;

/// Go to sleep; returns `false` if this worker should retire.
fn sleep(shared: &Shared, ctx: &WorkerCtx) -> bool {
    let slot = &shared.slots[ctx.index];
    shared.idle.prepare_sleep(ctx.index, &slot.futex);
    // Our own runnext counts too (only this thread can fill it, but it must
    // never be left behind while we sleep).
    let own_runnext = slot.runnext.is_occupied() || !ctx.yielded.is_empty();
    if own_runnext || shared.has_work(Some(ctx.index)) || shared.is_shutdown() {
        if shared.idle.retract(ctx.index) == Retract::Notified {
            wait_notified(slot, None);
        }
        return true;
    }
    slot.heartbeat.fetch_add(1, Ordering::Relaxed);
    shared.counters.sleeps.fetch_add(1, Ordering::Relaxed);
    // With `io_park`, one idle worker waits for I/O in the driver itself;
    // otherwise this worker stops taking I/O events, and the I/O layer's
    // poller takes over if it was resting.
    let io_park = io_park_waiter(shared, ctx);
    if io_park.is_none() {
        if let Some(io) = fiber_core::io_poll() {
            io.before_sleep();
        }
    }
    // An extra worker (more than the minimum stay) retires after its idle
    // timeout, unless pinned fibers call it home.
    let extra =
        shared.staying.load(Ordering::Relaxed) > shared.config.workers && slot.homed.load(Ordering::Relaxed) == 0;
    // `Duration::MAX` (or any timeout past the end of time) waits forever.
    let retire_at = extra
        .then(|| Instant::now().checked_add(shared.config.idle_timeout))
        .flatten();
    // Only this thread arms timers in our wheel, so its next deadline
    // cannot move earlier while we sleep (others only fire it).
    let timer_at = match shared.timers.wheel(Some(ctx.index)).next_tick() {
        NEVER => None,
        tick => Some(shared.timers.instant_of(tick)),
    };
    let wake_at = match (retire_at, timer_at) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let awake = match io_park {
        Some((io, waiter)) => {
            let awake = wait_in_io(shared, ctx, io, waiter, wake_at);
            // Release: pairs with the Acquire CAS of the next io sleeper.
            shared.io_sleeper.store(false, Ordering::Release);
            awake
        }
        None => wait_notified(slot, wake_at),
    };
    if awake {
        return true;
    }
    // Our timer is due, or idle for the whole timeout: go back to the loop
    // (or retire), unless a notifier got us first.
    match shared.idle.retract(ctx.index) {
        Retract::Notified => {
            wait_notified(slot, None);
            true
        }
        Retract::Retracted if retire_at.is_none_or(|at| Instant::now() < at) => true,
        // Another worker retired first and the minimum is reached: stay.
        Retract::Retracted if !try_leave(shared) => true,
        Retract::Retracted => {
            shared.counters.record_shrink(format!(
                "worker {} idle for {:?}",
                ctx.index, shared.config.idle_timeout
            ));
            false
        }
    }
}

/// This worker's wait in the I/O driver, if it is to sleep there
/// (`io_park` on, the I/O layer offers one, and no other worker sleeps
/// there: it takes the role, `Shared::io_sleeper`).
fn io_park_waiter<'a>(
    shared: &'a Shared,
    ctx: &WorkerCtx,
) -> Option<(&'static dyn fiber_core::IoPoll, &'a dyn fiber_core::IoWaiter)> {
    if !shared.config.io_park || !shared.config.io_harvest {
        return None;
    }
    let io = fiber_core::io_poll()?;
    // A failed setup (no descriptor left, or the driver not yet in
    // place) is not kept: the next idle moment tries again.
    let cell = &shared.slots[ctx.index].io_waiter;
    let waiter = match cell.get() {
        Some(w) => w.as_deref()?,
        None => {
            let w = io.io_waiter()?;
            cell.get_or_init(|| Some(w)).as_deref()?
        }
    };
    // Acquire: pairs with the Release store when the previous io sleeper
    // leaves the role.
    shared
        .io_sleeper
        .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
        .ok()?;
    Some((io, waiter))
}

/// Sleep in the I/O driver (`io_park`), announced as a sleeper like
/// `wait_notified`: returns `true` when awake (notified, or I/O it took
/// woke fibers onto this worker), `false` when `deadline` passed first.
fn wait_in_io(
    shared: &Shared,
    ctx: &WorkerCtx,
    io: &dyn fiber_core::IoPoll,
    waiter: &dyn fiber_core::IoWaiter,
    deadline: Option<Instant>,
) -> bool {
    let slot = &shared.slots[ctx.index];
    loop {
        // The handshake with `Shared::wake_io`: a notifier that sets the
        // word after our look wakes the driver wait.
        if slot.io_waiting.enter(&slot.futex) {
            return true;
        }
        let timeout = match deadline {
            Some(d) => {
                let now = Instant::now();
                if now >= d {
                    slot.io_waiting.leave();
                    return false;
                }
                Some(d - now)
            }
            None => None,
        };
        waiter.wait(timeout);
        slot.io_waiting.leave();
        if Idle::is_notified(&slot.futex) {
            return true;
        }
        if ctx.harvest_io(io) > 0 {
            // Fibers woke onto our own queues while we are announced as a
            // sleeper: take the announcement back (or, if a notifier popped
            // us meanwhile, wait for its word, which it is setting).
            if shared.idle.retract(ctx.index) == Retract::Notified {
                wait_notified(slot, None);
            }
            return true;
        }
    }
}

/// How many timer records ahead `fire_wheel` prefetches.
const PREFETCH_AHEAD: usize = 8;

/// Fire the due timers of `wheel` (ours, another worker's, or the shared
/// one) at tick `now` from this worker: the fibers woken go to our queues.
fn fire_wheel(shared: &Shared, ctx: &WorkerCtx, wheel: Option<usize>, now: u64) {
    let mut due = ctx.due.borrow_mut();
    shared.timers.advance(wheel, now, &mut due);
    // With many sleepers every frame is cold: start loading a few frames
    // ahead of the one being woken (the wake itself prefetches the stack
    // of the fiber it queues).
    for waiter in due.iter().take(PREFETCH_AHEAD) {
        waiter.prefetch();
    }
    // Woken in deadline order: a wake's effects (an `after` channel's
    // message, a timeout) happen in the order of their deadlines, so a
    // `recv_timeout(1ms)` on `after(10ms)` that both come due in one late
    // pass times out, as it would have on time. (Woken latest first, the
    // message completed the receive before its timeout fired.) The fibers
    // this worker's scheduler gets are queued after the pass, latest
    // first (`TimerPass`), so that they also run in deadline order.
    let pass = TimerPass::begin(shared, ctx);
    for i in 0..due.len() {
        if let Some(ahead) = due.get(i + PREFETCH_AHEAD) {
            ahead.prefetch();
        }
        fiber_wake_via(&due[i], shared);
    }
    drop(pass);
    due.clear();
}

/// A timer wheel pass of this worker: while it lasts, the fibers its wakes
/// hand to this worker's scheduler are collected (`WorkerCtx::timer_woken`);
/// when it ends (also on an unwind), they are queued latest first, each as
/// a wake from this worker is (`push_local`: runnext, displacing onto the
/// LIFO deque), so the earliest deadline ends in runnext and the rest
/// leave the deque in deadline order.
struct TimerPass<'a> {
    shared: &'a Shared,
    ctx: &'a WorkerCtx,
}

impl<'a> TimerPass<'a> {
    fn begin(shared: &'a Shared, ctx: &'a WorkerCtx) -> TimerPass<'a> {
        ctx.timer_pass.set(true);
        TimerPass { shared, ctx }
    }
}

impl Drop for TimerPass<'_> {
    fn drop(&mut self) {
        self.ctx.timer_pass.set(false);
        let woken = std::mem::take(&mut *self.ctx.timer_woken.borrow_mut());
        for fiber in woken.into_iter().rev() {
            self.ctx.push_local(self.shared, fiber);
        }
    }
}

/// An idle worker's timer pass: every wheel that is due.
fn fire_any_due(shared: &Shared, ctx: &WorkerCtx) {
    // No clock read while no wheel holds a timer: a searching worker calls
    // this every round, and a clock read costs tens of nanoseconds in a VM.
    if !shared.timers.any_pending() {
        return;
    }
    let now = shared.timers.now_tick(Instant::now());
    if shared.timers.is_due(Some(ctx.index), now) {
        fire_wheel(shared, ctx, Some(ctx.index), now);
    }
    for index in shared.timers.due_workers(now) {
        fire_wheel(shared, ctx, Some(index), now);
    }
    if shared.timers.is_due(None, now) {
        fire_wheel(shared, ctx, None, now);
    }
}

/// Wait for the futex word to be set; `false` if `deadline` passed first.
fn wait_notified(slot: &Slot, deadline: Option<Instant>) -> bool {
    loop {
        if Idle::is_notified(&slot.futex) {
            return true;
        }
        let remaining = match deadline {
            Some(d) => {
                let now = Instant::now();
                if now >= d {
                    return false;
                }
                Some(d - now)
            }
            None => None,
        };
        crate::sync::futex_wait(&slot.futex, crate::idle::WAITING, remaining);
    }
}

/// The next fiber to run. One taken from anywhere but the runnext slot
/// ends the current runnext chain: the next hand-off starts a new one,
/// with a new time slice (`RUNNEXT_SLICE_MS`). Two kinds of take do not end
/// it: a late fairness look in the middle of the chain, and pops from the
/// local deque after a wake displaced the chain's fiber from runnext, up to
/// and including that fiber (`WorkerCtx::chain_displaced`); the chain keeps
/// its slice.
fn find_work(shared: &Shared, ctx: &WorkerCtx) -> Option<Runnable> {
    ctx.picked_runnext.set(false);
    let found = look_for_work(shared, ctx);
    if !ctx.picked_runnext.get() {
        ctx.in_chain.set(false);
        ctx.chain_displaced.set(None);
    }
    found
}

/// `find_work`'s search, in the loop's order (module docs).
fn look_for_work(shared: &Shared, ctx: &WorkerCtx) -> Option<Runnable> {
    let mut late_in_chain = false;
    let runnext = &shared.slots[ctx.index].runnext;
    if ctx.in_chain.get() && runnext.is_occupied() {
        let looks = ctx.chain_looks.get().wrapping_add(1);
        ctx.chain_looks.set(looks);
        if looks % CHAIN_CLOCK_EVERY == 0 {
            fiber_core::advance_coarse_clock();
        }
        let now_ms = fiber_core::coarse_clock_ms();
        if now_ms >= ctx.chain_since_ms.get() + RUNNEXT_SLICE_MS {
            // The chain used up its slice (its fibers compute for
            // milliseconds a turn, or hand off for that long): its fiber
            // goes behind everything this worker has queued, as a yield
            // does (Go preempts a runnext chain after its 10 ms slice onto
            // the global queue), and the search below goes on. Counted in
            // hand-offs only, a pair computing 20 ms a turn let the deque's
            // top fiber run once every 16 turns, and 20 fibers sleeping
            // 10 ms in a loop beside it waited up to 2 s a sleep
            // (`reviews/review12.rs::twenty_sleeper_loops_beside_pairs_one_worker`).
            if let Some(fiber) = runnext.take() {
                ctx.yielded.push(fiber);
            }
            // The chain ended: a fiber of it pushed down onto the deque
            // starts a new one when it runs.
            ctx.chain_displaced.set(None);
        } else if now_ms < ctx.fair_look_ms.get() + FAIR_LOOK_MS {
            // A chain of hand-offs goes on within its slice, however many
            // hand-offs it makes, and its looks are not counted (only the
            // timed fairness look interrupts it): each pair of a ping-pong
            // gets whole slices, as in Go, where a goroutine taken from
            // runnext inherits the time slice and the schedule tick. (Cut
            // after 16 hand-offs, or interrupted by the counted fairness
            // looks, a pair handing off every microsecond got 16 to 61 us
            // per 10 ms turn of a pair computing 1 ms a hand-off, 1/570 of
            // the time: Go's `TestPingPongHog`,
            // `conformance/go_runtime.rs::ping_pong_hog`.)
            if let Some(fiber) = runnext.take() {
                ctx.picked_runnext.set(true);
                return Some(fiber);
            }
        } else {
            // The timed fairness look is due: it goes first, and the
            // chain's fiber waits in its slot. (Without it, a tree whose
            // fibers compute 5 ms and spawn into runnext kept the oldest
            // fiber of the deque waiting 1.4 s:
            // `adversarial/starvation.rs::the_oldest_fiber_of_a_refilled_lifo_deque_runs_within_a_time_bound`.)
            // The chain keeps its slice across the interruption: it ends
            // at `chain_since_ms + RUNNEXT_SLICE_MS` as before (restarted
            // at each interruption, a chain could keep its worker for good).
            late_in_chain = true;
            ctx.picked_runnext.set(true);
        }
    }
    let tick = ctx.tick.get().wrapping_add(1);
    ctx.tick.set(tick);
    // A look counts in time as well as in looks: a worker whose fibers run
    // long between parks (a ping-pong pair computing 10 ms a turn) made its
    // 976th look, the one that reaches the bottom of the LIFO deque, tens
    // of seconds late, and a timer-woken fiber there waited that long
    // (`conformance/go_runtime.rs::a_sleeper_wakes_beside_a_compute_heavy_ping_pong_pair`).
    // (Read on every 4th look: a look of a yield loop costs about 20 ns,
    // and reading the clock on each one showed.)
    let late = late_in_chain
        || tick % 4 == 0 && {
            let now_ms = fiber_core::coarse_clock_ms();
            now_ms >= ctx.fair_look_ms.get() + FAIR_LOOK_MS
        };
    if tick % GLOBAL_CHECK_INTERVAL == 0 || late {
        ctx.fair_look_ms.set(fiber_core::coarse_clock_ms());
        // A busy worker takes the I/O readiness that is ready now itself
        // (tokio's `event_interval`): the fibers it wakes land on this
        // worker's queues, and below they compete with the rest.
        if let Some(io) = fiber_core::io_poll().filter(|_| shared.config.io_harvest) {
            ctx.harvest_io(io);
        }
        // A late look (the time-based one) starts at a different source
        // each time, so none of them waits behind the others for long: with
        // a fixed order, a global queue that a stuck-worker rescue refilled
        // before every look kept the oldest fiber of the deque waiting for
        // the count-based look, 976 turns away (seconds, when turns take
        // milliseconds).
        let first = if late {
            let turn = ctx.late_looks.get();
            ctx.late_looks.set(turn.wrapping_add(1));
            turn as usize % FAIR_SOURCES
        } else {
            0
        };
        for k in 0..FAIR_SOURCES {
            let found = match (first + k) % FAIR_SOURCES {
                0 => take_global_batch(shared, ctx),
                // Outside wakes and yielded fibers get a turn too, or a
                // LIFO local deque that keeps refilling would starve them.
                1 => shared.slots[ctx.index].inbox.pop(),
                // Unless the last turn ran so long that the monitor took
                // this worker for stuck (`stalled`) and moved the fibers
                // waiting here to the global queue: the yielded deque then
                // holds just the fiber that yielded at the end of that
                // turn, which would run again at once, ahead of all of them
                // (one turn in eight beside three waiting fibers:
                // `reviews/review36.rs::a_fiber_yielding_after_a_long_turn_does_not_run_again_ahead_of_the_others_one_worker`);
                // the global queue is served first, as Go's `Gosched` puts
                // the goroutine behind it. (Checked here, on the rare
                // fairness look, not on every yield.)
                2 if shared.slots[ctx.index].stalled.load(Ordering::Relaxed) && !shared.global.is_empty() => None,
                2 => ctx.yielded.pop(),
                // And, more rarely, the oldest fiber of the local deque: it
                // is LIFO, so a worker whose fibers keep pushing onto it
                // would otherwise never get back to the bottom one. (Taken
                // through this worker's own stealer, from the oldest end, as
                // a thief would; not on every 61st look: in a fan-out tree
                // the oldest entry is the largest subtree, and taking it
                // that often made W2 skynet 30% slower, by breaking the
                // depth-first walk.)
                // Once per `FAIR_LOOK_MS`, the older half of a long deque
                // goes to the global queue (`age_out_local`).
                _ if {
                    let now_ms = fiber_core::coarse_clock_ms();
                    now_ms >= ctx.age_look_ms.get() + FAIR_LOOK_MS && {
                        ctx.age_look_ms.set(now_ms);
                        true
                    }
                } =>
                {
                    age_out_local(shared, ctx)
                }
                _ if tick % (GLOBAL_CHECK_INTERVAL * OLDEST_LOCAL_EVERY) == 0 || late => take_oldest_local(shared, ctx),
                _ => None,
            };
            if found.is_some() {
                return found;
            }
        }
    }
    if let Some(fiber) = shared.slots[ctx.index].runnext.take() {
        // A chain of hand-offs starts here (the clock is read only where
        // runnext is in use: a yield loop never reads it), unless this is
        // the chain a late fairness look found nothing to interrupt with.
        if !late_in_chain {
            ctx.chain_since_ms.set(fiber_core::coarse_clock_ms());
            ctx.chain_looks.set(0);
        }
        ctx.in_chain.set(true);
        ctx.picked_runnext.set(true);
        return Some(fiber);
    }
    if let Some(fiber) = ctx.local.pop() {
        if let Some(displaced) = ctx.chain_displaced.get().filter(|_| ctx.in_chain.get()) {
            // The chain's own fiber, displaced from runnext by wakes that
            // this worker runs first, or one of those wakes above it: the
            // chain goes on, in the same slice, until its fiber is popped.
            // (Restarted here, a sleeper woken every 5 ms beside a chain of
            // 200 us links gave that chain a new slice at each wake: it
            // kept its worker for seconds while 19 other chains and 1,200
            // fibers spawned beside them ran one per fairness look, and
            // the last of them waited 7 s:
            // `reviews/review69.rs::the_bottom_of_a_deque_just_over_the_threshold_runs_soon`.
            // Matching the chain's fiber alone, two sleepers woken in one
            // timer pass hid it under the second one.)
            if fiber.id() == displaced {
                ctx.chain_displaced.set(None);
            }
            ctx.picked_runnext.set(true);
        }
        return Some(fiber);
    }
    // A fiber that yielded goes behind the fibers woken or spawned for
    // this worker from outside (its inbox) and behind the global queue
    // (timer wakes the monitor fires, fibers it moved off a stuck worker),
    // as Go's `Gosched` puts the goroutine on the global queue: a fiber
    // that yields in a loop would keep them out for as long as it loops.
    // (With the global queue after the yielded fibers, two yield loops let
    // it in one fiber per `GLOBAL_CHECK_INTERVAL` rounds: 500 timer wakes
    // came up to 13 s late; `yield_loops_do_not_starve_the_global_queue`.)
    // The yielded fibers still get a turn first on every
    // `GLOBAL_CHECK_INTERVAL`th round above. (`is_empty` first: plain
    // loads, where a `pop` on an empty queue also pays a SeqCst fence, on
    // every round of a yield loop; a push it misses is seen on the next
    // round, and the idle handshake re-checks with its own fence before
    // the worker sleeps.)
    let inbox = &shared.slots[ctx.index].inbox;
    if !inbox.is_empty() {
        if let Some(fiber) = inbox.pop() {
            return Some(fiber);
        }
    }
    if !shared.global.is_empty() {
        if let Some(fiber) = take_global_batch(shared, ctx) {
            return Some(fiber);
        }
    }
    if let Some(fiber) = ctx.yielded.pop() {
        return Some(fiber);
    }
    steal(shared, ctx)
}

/// The sources a fairness look serves: global queue, inbox, yielded
/// fibers, the oldest fiber of the local deque.
const FAIR_SOURCES: usize = 4;

/// One fiber of the global queue and, behind it in this worker's deque, a
/// batch more, as when the worker runs out of local work: taking one fiber
/// per fairness look drained the global queue at one fiber per
/// `GLOBAL_CHECK_INTERVAL` turns of a busy worker (2,000 fibers moved off a
/// stuck worker took over a second behind a ping-pong pair;
/// `many_children_in_a_spinning_workers_deque_run_while_the_other_worker_ping_pongs`).
fn take_global_batch(shared: &Shared, ctx: &WorkerCtx) -> Option<Runnable> {
    let fiber = shared.global.pop()?;
    // The rest go into the LIFO deque newest first, so that they come out
    // in the global queue's order (timer wakes the monitor queued in
    // deadline order run in deadline order; pushed in that order, they ran
    // newest first).
    let mut rest: [Option<Runnable>; GLOBAL_BATCH - 1] = std::array::from_fn(|_| None);
    let mut taken = 0;
    while taken < rest.len() {
        match shared.global.pop() {
            Some(more) => {
                rest[taken] = Some(more);
                taken += 1;
            }
            None => break,
        }
    }
    for more in rest[..taken].iter_mut().rev() {
        ctx.local.push(more.take().expect("taken above"));
    }
    Some(fiber)
}

/// A fairness look's turn at the local deque, once per `FAIR_LOOK_MS`
/// (coarse clock): its oldest fiber, and, when the deque is long, the
/// oldest of the rest moved to the global queue, oldest first (a fiber
/// homed here to the inbox): half of them (up to `AGE_OUT_MAX`) from
/// `AGE_OUT_MIN` fibers on, an eighth from `AGE_OUT_SMALL` on. The LIFO deque keeps a
/// worker on the newest work; a worker that more work keeps reaching
/// (sleepers woken faster than it can run them, a tree that keeps
/// spawning) got back to its bottom only through the counted looks, one
/// fiber per `GLOBAL_CHECK_INTERVAL * OLDEST_LOCAL_EVERY` looks (the timed
/// look never came: every counted look resets its clock): beside 4,000
/// sleeper loops of 1 ms on one worker some sleeps ended seconds late,
/// beside 100,000 of 10 ms up to 91 s
/// (`reviews/review67.rs::sleeper_loops_beyond_one_workers_capacity_are_late_by_a_pass_not_seconds`).
/// Moved, they wait in FIFO order where every look serves a batch of them
/// and any other worker can take them, as Go moves half of a full local
/// queue to its global queue.
fn age_out_local(shared: &Shared, ctx: &WorkerCtx) -> Option<Runnable> {
    let first = take_oldest_local(shared, ctx)?;
    let len = ctx.local.len();
    let batch = if len >= AGE_OUT_MIN {
        (len / 2).min(AGE_OUT_MAX)
    } else if len >= AGE_OUT_SMALL {
        len / 8
    } else {
        0
    };
    if batch > 0 {
        let mut moved = 0;
        for _ in 0..batch {
            let Some(fiber) = take_oldest_local(shared, ctx) else {
                break;
            };
            if fiber.home() == Some(ctx.index) {
                shared.slots[ctx.index].inbox.push(fiber);
            } else {
                shared.global.push(fiber);
                moved += 1;
            }
        }
        if moved > 0 {
            shared.counters.global_pushes.fetch_add(moved, Ordering::Relaxed);
            // Another worker may take them (the idle handshake's notifier
            // half, as for any push where others look).
            shared.notify_one();
        }
    }
    Some(first)
}

/// A local deque at least this long has half of it aged out at its look
/// ([`age_out_local`]). A spawn tree's depth-first walk keeps its deques
/// shorter, mostly: W2 skynet's pass 256, and with this threshold at 256
/// its largest subtrees went round the global queue every 10 ms and W2
/// ran about 30% slower; from 1,024 on it is level with no aging.
pub const AGE_OUT_MIN: usize = 1024;
/// A deque at least this long (and under `AGE_OUT_MIN`) has an eighth of
/// it aged out at its look: with the half rule alone, 950 fibers at the
/// bottom of a refilled deque waited over 6 s
/// (`reviews/review69.rs::the_bottom_of_a_deque_just_under_the_threshold_does_not_starve`).
pub const AGE_OUT_SMALL: usize = 64;
/// The most fibers one timed fairness look moves out of the local deque.
pub const AGE_OUT_MAX: usize = 4096;

/// The oldest fiber of this worker's own deque (from the end thieves take).
fn take_oldest_local(shared: &Shared, ctx: &WorkerCtx) -> Option<Runnable> {
    loop {
        match shared.slots[ctx.index].stealer.steal() {
            Steal::Success(fiber) => return Some(fiber),
            Steal::Empty => return None,
            Steal::Retry => std::hint::spin_loop(),
        }
    }
}

fn steal(shared: &Shared, ctx: &WorkerCtx) -> Option<Runnable> {
    let n = shared.slots.len();
    let start = (ctx.next_random() % n as u64) as usize;
    for k in 0..n {
        let victim = (start + k) % n;
        if victim == ctx.index {
            continue;
        }
        let slot = &shared.slots[victim];
        let state = slot.state.load(Ordering::Relaxed);
        if !accepts_inbox(state) {
            // Nobody will run what is left in a retired worker's inbox. A
            // drained one's fibers bound to it stay (see `push_inbox`).
            if let Some(fiber) = slot.inbox.pop() {
                if state == DRAINING && !shared.is_shutdown() && fiber.home() == Some(victim) {
                    slot.inbox.push(fiber);
                } else {
                    return Some(fiber);
                }
            }
        }
        // A stalled worker (its fiber has run past the stuck threshold
        // without a yield point) will not get to its runnext slot soon, and
        // `has_work` counts that slot: take it, or an idle worker that sees
        // it keeps searching instead of sleeping, yet never runs it (only
        // the monitor's next scan moved it). Any thread may empty the slot.
        // A fiber pinned to the victim goes to its inbox, which the victim
        // serves and `has_work` does not count for others.
        if slot.stalled.load(Ordering::Relaxed) {
            if let Some(fiber) = slot.runnext.take() {
                if fiber.home() == Some(victim) {
                    slot.inbox.push(fiber);
                } else {
                    bump(&shared.slots[ctx.index].steals);
                    return Some(fiber);
                }
            }
        }
        for (stealer, into, lifo) in [
            (&shared.slots[victim].stealer, &ctx.local, true),
            (&shared.slots[victim].yield_stealer, &ctx.yielded, false),
        ] {
            loop {
                match stealer.steal_batch_and_pop(&ctx.steal_scratch) {
                    Steal::Success(fiber) => {
                        bump(&shared.slots[ctx.index].steals);
                        // Relaxed: a hint for the monitor (see the field).
                        shared.slots[victim].stolen_from.fetch_add(1, Ordering::Relaxed);
                        // It runs next: its frame loads while the rest
                        // of the batch is moved.
                        fiber.prefetch();
                        take_stolen(ctx, into, lifo);
                        fiber.prefetch_stack();
                        return Some(fiber);
                    }
                    Steal::Empty => break,
                    Steal::Retry => std::hint::spin_loop(),
                }
            }
        }
    }
    None
}

/// Move a stolen batch from the scratch deque to `into`, in the order a
/// direct steal into `into` would give (crossbeam puts the oldest stolen
/// fiber on top of a LIFO destination), prefetching each fiber's frame and
/// stack on the way: they were written on the victim's core (spawned or
/// parked there), and this worker runs them next, one cold line after
/// another otherwise.
fn take_stolen(ctx: &WorkerCtx, into: &Deque<Runnable>, lifo: bool) {
    let mut stolen = ctx.stolen.borrow_mut();
    while let Some(fiber) = ctx.steal_scratch.pop() {
        fiber.prefetch();
        stolen.push(fiber);
    }
    // The frames are on their way; what they hold says which stack lines
    // to load.
    stolen.iter().for_each(Runnable::prefetch_stack);
    if lifo {
        stolen.drain(..).rev().for_each(|fiber| into.push(fiber));
    } else {
        stolen.drain(..).for_each(|fiber| into.push(fiber));
    }
}

/// The worker side of fiber-core's contract for one worker thread.
struct WorkerSide<'a> {
    shared: &'a Shared,
    ctx: &'a WorkerCtx,
}

impl fiber_core::Worker for WorkerSide<'_> {
    /// The next fiber, already RUNNING (`Runnable::into_running`), found in
    /// the loop's order (module docs), or `None` to go idle.
    fn worker_next(&mut self) -> Option<Running> {
        loop {
            let fiber = find_work(self.shared, self.ctx)?;
            match fiber.home() {
                // A pinned fiber found here (stolen, or woken from this
                // worker) goes back to its home worker's inbox.
                Some(home) if home != self.ctx.index => {
                    if let Some(fiber) = self.shared.send_home(home, fiber) {
                        // Its home is gone (shutdown): it must not run on
                        // this thread; teardown gives it up.
                        lock(&self.shared.orphans).push(fiber);
                    }
                }
                _ => return Some(fiber.into_running()),
            }
        }
    }
}

fn run(shared: &Shared, ctx: &WorkerCtx, running: Running) {
    let slot = &shared.slots[ctx.index];
    bump(&slot.dequeued);
    slot.running.store(running.id().0, Ordering::Relaxed);
    slot.running_at.store(
        running.spawn_location() as *const Location<'static> as *mut _,
        Ordering::Relaxed,
    );
    bump(&slot.heartbeat);
    let first_pinned_run = running.is_pinned() && !running.has_run();
    let pinned = running.is_pinned();
    if first_pinned_run {
        // This worker is the fiber's home from its first instruction on
        // (it may keep references into this thread's thread-locals from
        // then): counted before it runs, so a first run that holds the
        // thread past the idle timeout cannot get its home drained or
        // retired under it.
        slot.homed.fetch_add(1, Ordering::Relaxed);
    }
    // One relaxed load when tracing is off (the start/finish events are TRACE).
    let traced = tracing::level_enabled!(tracing::Level::TRACE);
    let id = running.id();
    if traced && !running.has_run() {
        crate::emit("logging a fiber's start", || {
            tracing::trace!(
                target: "fiber_sched",
                fiber = id.0,
                name = ?running.name(),
                spawned_at = %running.spawn_location(),
                worker = ctx.index,
                "fiber started"
            )
        });
    }
    let outcome = running.resume(ctx.index);
    // Fibers kept here for an unwind count as homed here until their pin
    // ends (fiber-core's `take_unwind_pin_delta`), so that this worker is
    // neither retired nor drained under them.
    // SAFETY: this worker resumed the fiber on this thread just now.
    match unsafe { fiber_core::take_unwind_pin_delta() } {
        0 => {}
        d if d > 0 => {
            slot.homed.fetch_add(d as u64, Ordering::Relaxed);
        }
        d => {
            slot.homed.fetch_sub(d.unsigned_abs(), Ordering::Relaxed);
        }
    }
    if traced && matches!(outcome, RunOutcome::Finished) {
        crate::emit(
            "logging a fiber's end",
            || tracing::trace!(target: "fiber_sched", fiber = id.0, worker = ctx.index, "fiber finished"),
        );
    }
    slot.running.store(0, Ordering::Relaxed);
    if pinned && matches!(outcome, RunOutcome::Finished) {
        slot.homed.fetch_sub(1, Ordering::Relaxed);
    }
    match outcome {
        RunOutcome::Yielded(fiber) => {
            // Behind everything this worker has queued (the local deque is
            // LIFO): the worker's private FIFO of yielded fibers.
            ctx.yielded.push(fiber);
            bump(&slot.enqueued);
        }
        RunOutcome::Parked => bump(&slot.parks),
        RunOutcome::Finished => {}
    }
}

/// Pressure: runnable fibers enqueued minus dequeued (signed; transiently
/// negative under races, spec 7.1).
pub(crate) fn pressure(shared: &Shared) -> i64 {
    let mut total = shared.external_enqueued.load(Ordering::Relaxed) as i64;
    for slot in shared.slots.iter() {
        total += slot.enqueued.load(Ordering::Relaxed) as i64;
        total -= slot.dequeued.load(Ordering::Relaxed) as i64;
    }
    total
}

std::thread_local! {
    /// On a worker thread: the id of the runtime it was started for (0 on
    /// any other thread; runtime ids start at 1). Set before the thread's
    /// `on_thread_start` hook and never cleared, so it still answers in
    /// `on_thread_stop` and in the thread's thread-local destructors (no
    /// destructor of its own: readable while those run).
    static WORKER_THREAD_OF: Cell<usize> = const { Cell::new(0) };
}

/// Is this thread one of runtime `shared_id`'s worker threads, whether or
/// not it is in its scheduling loop now (a hook, a thread-local destructor
/// at its exit)? A shutdown cannot join the thread it runs on.
pub(crate) fn thread_of(shared_id: usize) -> bool {
    WORKER_THREAD_OF.try_with(|id| id.get() == shared_id).unwrap_or(false)
}

/// Is the current thread a worker of `shared`, in its scheduling loop or
/// in one of its fibers? (Used to refuse misuse.)
pub(crate) fn on_worker_of(shared_id: usize) -> bool {
    let ctx = context::get();
    // SAFETY: as in `Schedule::schedule`.
    !ctx.is_null() && unsafe { (*ctx).shared_id } == shared_id
}

/// The index of the worker this thread runs, if it is one of `shared`'s.
pub(crate) fn current_worker_index(shared_id: usize) -> Option<usize> {
    let ctx = context::get();
    // SAFETY: as in `Schedule::schedule`.
    (!ctx.is_null() && unsafe { (*ctx).shared_id } == shared_id).then(|| unsafe { (*ctx).index })
}

#[cfg(test)]
mod slot_layout_tests {
    use super::Slot;
    use std::mem::offset_of;

    /// The fields a worker writes at every spawn, wake and run share no
    /// 128-byte group with the fields other threads touch on their own
    /// paths (stealing, notifying, pushing to the inbox).
    #[test]
    fn owner_written_fields_share_no_line_pair_with_fields_others_touch() {
        let group = |offset: usize| offset / 128;
        let owner = [
            offset_of!(Slot, runnext),
            offset_of!(Slot, enqueued),
            offset_of!(Slot, dequeued),
            offset_of!(Slot, steals),
            offset_of!(Slot, spawns),
            offset_of!(Slot, parks),
            offset_of!(Slot, wakes),
            offset_of!(Slot, heartbeat),
            offset_of!(Slot, running),
            offset_of!(Slot, running_at),
            offset_of!(Slot, homed),
            offset_of!(Slot, blocking),
        ];
        let shared = [
            offset_of!(Slot, state),
            offset_of!(Slot, stalled),
            offset_of!(Slot, futex),
            offset_of!(Slot, stealer),
            offset_of!(Slot, stealer) + std::mem::size_of::<crossbeam_deque::Stealer<fiber_core::Runnable>>() - 1,
            offset_of!(Slot, yield_stealer),
            offset_of!(Slot, io_waiting),
            offset_of!(Slot, inbox),
        ];
        for o in owner {
            for s in shared {
                assert_ne!(
                    group(o),
                    group(s),
                    "owner field at {o} shares a line pair with a shared field at {s}"
                );
            }
        }
    }
}
