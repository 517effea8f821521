//! The frame pool: fiber frames and stacks are recycled, apart: a spawn
//! takes a frame, and the fiber takes a stack when it first runs, on the
//! worker that runs it (so a fiber that has not started holds no stack, and
//! the stack a worker's last fiber ended on, warm in that core's cache, is
//! the next one it starts on). Only [`FramePool::trim`] gives idle stacks'
//! pages and idle frames beyond a cap back before the pool itself is
//! dropped at runtime shutdown (spec 1.1).
//!
//! A per-thread cache of [`LOCAL_CACHE`] frames and as many stacks sits in
//! front of global lock-free queues (crossbeam-queue's `SegQueue`): a worker
//! that finishes a fiber and then spawns one reuses the frame without
//! touching shared state. Frames move between a thread's cache and the
//! global side in batches of [`TRANSFER_BATCH`]: when one worker spawns and
//! another runs and finishes the fibers (spawn-join, fan-out), the frames
//! flow from the finishing worker to the spawning one with one queue
//! operation per batch instead of a push and a pop per frame, and the
//! stacks stay with the finishing worker.

use crate::fiber::Fiber;
use crate::fiber::RunOutcome;
use crate::sched::Runnable;
use crate::stack::{FiberStack, StackAllocator, StackConfig};
use crate::state::{Actor, FiberState};
use crate::sync::{lock, Arc, AtomicIsize, AtomicU8, AtomicUsize, Mutex, Ordering};
use std::cell::RefCell;

use std::fmt;
use std::io;

/// Frames a thread keeps for itself before handing them to the global queue.
/// Large enough to absorb a spawn/finish burst of one worker, small enough
/// that idle workers do not hoard frames.
pub const LOCAL_CACHE: usize = 64;
/// One registered thread's part of a pool's in-use count: written by that
/// thread only (a load and a store, no read-modify-write), read by
/// [`FramePool::stats`]. A cache line of its own.
type InUseCell = Arc<crossbeam_utils::CachePadded<AtomicIsize>>;

/// Frames moved at once between a thread's cache and the global side: a
/// full cache hands its older half over, an empty one takes a batch back.
pub const TRANSFER_BATCH: usize = LOCAL_CACHE / 2;

/// Idle stacks in the global queue that keep their pages through a
/// [`FramePool::trim`] (beyond them, stacks give their pages back), and
/// idle frames the monitor's trim always leaves alone.
pub const IDLE_WATERMARK: usize = 32;

/// Stacks above the pool's size (a spawn's `stack_size`) kept for reuse by
/// later such spawns; beyond them, one that comes back is unmapped.
const BIG_STACKS_CAP: usize = 64;

/// Idle frames in the global queue kept through a [`FramePool::trim`];
/// beyond them, frames are freed.
pub const IDLE_CAP: usize = 1024;

fn next_pool_id() -> usize {
    // Not a protocol: a unique counter, never modeled.
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Counters of a [`FramePool`] at one instant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Frames ever created by this pool.
    pub allocated: usize,
    /// Frames currently running a fiber (spawned, not yet finished).
    pub in_use: usize,
    /// Stacks made with a hardware guard (page-table guard region or
    /// `mprotect` guard page).
    pub guarded_stacks: usize,
    /// Stacks made without one (only by opt-in, `UnguardedPolicy::Allow`).
    pub unguarded_stacks: usize,
}

/// A parked fiber, as diagnostics see it.
#[derive(Clone, Debug)]
pub struct ParkedFiber {
    /// Its id.
    pub id: crate::FiberId,
    /// The type it waits on (`std::any::type_name` of the waitable).
    pub waiting_on: &'static str,
    /// Where it was spawned.
    pub spawned_at: &'static std::panic::Location<'static>,
}

/// Pooled fiber frames and stacks of one runtime.
pub struct FramePool {
    pub(crate) id: usize,
    idle: crossbeam_queue::SegQueue<Arc<Fiber>>,
    /// Stacks no fiber runs on, beyond the threads' caches: a fiber takes
    /// its stack when it first runs and gives it back when it ends.
    idle_stacks: crossbeam_queue::SegQueue<FiberStack>,
    /// Stacks above the pool's size that came back (at most
    /// `BIG_STACKS_CAP`), for later spawns that ask for as much.
    big_stacks: crossbeam_queue::SegQueue<FiberStack>,
    /// Batches of `TRANSFER_BATCH` idle frames handed over by full thread
    /// caches, taken whole by empty ones.
    batches: crossbeam_queue::SegQueue<Vec<Arc<Fiber>>>,
    /// Frames in `batches` (for `idle_in_global`).
    batched: AtomicUsize,
    /// Every frame this pool created, for shutdown and diagnostics.
    all: Mutex<Vec<Arc<Fiber>>>,
    /// Teardown: fibers given up for later (their blocking call or
    /// hand-off ended while a teardown gave up on them) whose wake queued
    /// them before it ended: held here, runnable, for the teardown after
    /// [`FramePool::revive_abandoned_in_blocking`], which runs them (their
    /// wake will not come again).
    given_up_woken: Mutex<Vec<Runnable>>,
    allocated: AtomicUsize,
    /// Frames in use, as a sum of parts: bumped at every spawn on the
    /// spawner's part and dropped at every finish on the finishing
    /// thread's, so in spawn-join (one worker spawns, another finishes) no
    /// counter line moves between the two cores. A registered thread has a
    /// cell of its own ([`InUseCell`], listed in `in_use_cells`), which it
    /// alone writes, with a plain load and store: no locked instruction
    /// per spawn or finish. Threads that did not register share
    /// `in_use_shared` (read-modify-writes). A part may go negative; the
    /// sum is exact once the changes are visible. A thread that
    /// unregisters folds its cell into `in_use_retired` and removes it,
    /// both under the list's lock, which [`stats`](Self::stats) holds
    /// while it sums.
    in_use_shared: crossbeam_utils::CachePadded<AtomicIsize>,
    in_use_cells: Mutex<Vec<InUseCell>>,
    in_use_retired: AtomicIsize,
    guarded: AtomicUsize,
    unguarded: AtomicUsize,
    stacks: StackAllocator,
    /// [`Phase`] as a byte (SeqCst writes; see `begin_cancel`).
    phase: AtomicU8,
    /// Spawns from outside the runtime in flight (`SpawnGate`).
    gate: crate::gate::SpawnGate,
}

/// Add `delta` to the calling thread's own in-use cell: it is the cell's
/// only writer, so a load and a store do (no locked instruction).
#[inline]
fn add_own(cell: &InUseCell, delta: isize) {
    use Ordering::Relaxed;
    // Relaxed: statistics; a reader sums the cells (`in_use_sum`) and
    // tolerates a change becoming visible late.
    cell.store(cell.load(Relaxed) + delta, Relaxed);
}

thread_local! {
    /// This thread's frame cache: (pool id, frames).
    static CACHE: RefCell<LocalCache> = const { RefCell::new(LocalCache { pool: 0, in_use: None, frames: Vec::new(), stacks: Vec::new(), owner: None }) };
}

struct LocalCache {
    pool: usize,
    /// This thread's cell of `pool`'s in-use count (`None` until the
    /// thread registers).
    in_use: Option<InUseCell>,
    frames: Vec<Arc<Fiber>>,
    /// Stacks of `pool` that fibers finished on this thread left, for the
    /// next fibers that start here (most recent last: the warmest).
    stacks: Vec<FiberStack>,
    /// Where to return the frames when the thread exits.
    owner: Option<std::sync::Weak<FramePool>>,
}

impl LocalCache {
    /// Give the frames and stacks back to the pool they came from (if it
    /// still exists) and forget it.
    fn hand_back(&mut self) {
        let frames: Vec<_> = self.frames.drain(..).collect();
        let stacks: Vec<_> = self.stacks.drain(..).collect();
        let cell = self.in_use.take();
        if let Some(pool) = self.owner.take().and_then(|w| w.upgrade()) {
            frames.into_iter().for_each(|frame| pool.idle.push(frame));
            stacks.into_iter().for_each(|stack| pool.idle_stacks.push(stack));
            if let Some(cell) = cell {
                pool.retire_in_use_cell(&cell);
            }
        }
        self.pool = 0;
    }
}

impl Drop for LocalCache {
    fn drop(&mut self) {
        self.hand_back();
    }
}

impl Drop for FramePool {
    fn drop(&mut self) {
        // No fiber of a dropped pool runs again: its idle stacks go now
        // (each holds its slab mapped; a frame holds no stack between
        // incarnations, so the handles a program keeps after its runtime
        // hold none: `adversarial_handles_after_runtime.rs`). Stacks in the
        // caches of threads still alive go when those threads exit or
        // register with another pool.
        self.release_idle_stacks();
    }
}

impl FramePool {
    /// A pool whose stacks follow `config` (validated by the caller).
    pub fn new(config: StackConfig) -> FramePool {
        FramePool {
            id: next_pool_id(),
            idle: crossbeam_queue::SegQueue::new(),
            idle_stacks: crossbeam_queue::SegQueue::new(),
            big_stacks: crossbeam_queue::SegQueue::new(),
            batches: crossbeam_queue::SegQueue::new(),
            batched: AtomicUsize::new(0),
            all: Mutex::new(Vec::new()),
            given_up_woken: Mutex::new(Vec::new()),
            allocated: AtomicUsize::new(0),
            in_use_shared: crossbeam_utils::CachePadded::new(AtomicIsize::new(0)),
            in_use_cells: Mutex::new(Vec::new()),
            in_use_retired: AtomicIsize::new(0),
            guarded: AtomicUsize::new(0),
            unguarded: AtomicUsize::new(0),
            stacks: StackAllocator::new(config),
            phase: AtomicU8::new(Phase::Open as u8),
            gate: crate::gate::SpawnGate::new(),
        }
    }

    /// Admit a spawn from outside the runtime: `false` once the runtime is
    /// shutting down. An admitted spawn calls [`spawn_done`](Self::spawn_done)
    /// once its fiber is scheduled (see `SpawnGate`).
    pub(crate) fn admit_spawn(&self) -> bool {
        self.gate.enter(&self.phase, Phase::Open as u8)
    }

    /// An admitted spawn scheduled its fiber (or gave up).
    pub(crate) fn spawn_done(&self) {
        self.gate.leave();
    }

    /// Let this thread cache frames of `pool` (workers call this once at
    /// start). Without it, frames go straight to the global queue. The
    /// thread also keeps a bank of its scheduler's reference counts for
    /// the frames it prepares and finishes (`counts.rs`), given back by
    /// [`unregister_thread`](Self::unregister_thread) or at thread exit.
    pub fn register_thread(pool: &std::sync::Arc<FramePool>) {
        crate::counts::enable(pool.id);
        CACHE.with(|c| {
            let mut cache = c.borrow_mut();
            cache.hand_back();
            cache.pool = pool.id;
            let cell: InUseCell = Arc::new(crossbeam_utils::CachePadded::new(AtomicIsize::new(0)));
            lock(&pool.in_use_cells).push(cell.clone());
            cache.in_use = Some(cell);
            cache.owner = Some(std::sync::Arc::downgrade(pool));
        });
    }

    /// Return this thread's cached frames to the global queue and its
    /// banked scheduler counts to their scheduler (workers call this before
    /// they exit).
    pub fn unregister_thread() {
        crate::counts::disable();
        CACHE.with(|c| c.borrow_mut().hand_back());
    }

    /// Add `delta` to the in-use count, on this thread's cell if it has
    /// one for this pool.
    fn count_in_use(&self, delta: isize) {
        let counted = CACHE
            .try_with(|c| {
                let cache = c.borrow();
                if cache.pool != self.id {
                    return false;
                }
                cache.in_use.as_ref().is_some_and(|cell| {
                    add_own(cell, delta);
                    true
                })
            })
            .unwrap_or(false);
        if !counted {
            // Relaxed: a count read for statistics and the test
            // scheduler's end check, which tolerate a change becoming
            // visible late.
            self.in_use_shared.fetch_add(delta, Ordering::Relaxed);
        }
    }

    /// An unregistering thread's cell leaves the sum: its value moves to
    /// `in_use_retired` under the list's lock, so a concurrent
    /// [`stats`](Self::stats) sees it in exactly one place.
    fn retire_in_use_cell(&self, cell: &InUseCell) {
        let mut cells = lock(&self.in_use_cells);
        if let Some(at) = cells.iter().position(|c| Arc::ptr_eq(c, cell)) {
            cells.swap_remove(at);
            // Relaxed: the lock orders this against `stats`' sum; the
            // cell's own writes were this thread's.
            self.in_use_retired
                .fetch_add(cell.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }

    /// Usable bytes of each stack.
    pub fn stack_size(&self) -> usize {
        self.stacks.stack_size()
    }

    /// A frame in INIT, ready for `Fiber::prepare`. Its stack comes when
    /// the fiber first runs ([`start_stack`](Self::start_stack)).
    #[inline]
    pub(crate) fn acquire(&self) -> Arc<Fiber> {
        let (local, counted) = self.pop_local();
        let frame = local.or_else(|| self.idle.pop()).or_else(|| self.pop_batch());
        let frame = match frame {
            Some(frame) => frame,
            None => {
                let frame = Arc::new(Fiber::new());
                lock(&self.all).push(frame.clone());
                self.allocated.fetch_add(1, Ordering::Relaxed);
                frame
            }
        };
        // Counted on this thread's cell with the cache access (one
        // thread-local access instead of two), or on the shared part.
        if !counted {
            self.count_in_use(1);
        }
        frame
    }

    /// As [`acquire`](Self::acquire), with a stack of its own when the
    /// spawn asks for more than the pool's size (`min_stack`): mapped now,
    /// so that a size that cannot be mapped is the spawn's error; it
    /// joins the pool's stacks when its fiber ends.
    pub(crate) fn acquire_with(
        &self,
        min_stack: Option<usize>,
        stack_now: bool,
    ) -> io::Result<(Arc<Fiber>, Option<FiberStack>)> {
        let Some(wanted) = min_stack.filter(|&wanted| wanted > self.stacks.stack_size()) else {
            if stack_now || self.stacks.may_refuse() {
                // A stack the allocator may refuse (or one the spawn asks
                // for now, `SpawnOptions::stack_now`) is taken now, so that
                // a refusal is the spawn's error (`try_spawn`), not the
                // fiber's when it first runs.
                let stack = self.start_stack()?;
                return Ok((self.acquire(), Some(stack)));
            }
            return Ok((self.acquire(), None));
        };
        // A big stack that came back, if it is big enough (one look: the
        // queue holds stacks of whatever sizes spawns asked for).
        let stack = match self.big_stacks.pop() {
            Some(stack) if stack.size() >= wanted => stack,
            other => {
                if let Some(smaller) = other {
                    self.put_back_big(smaller);
                }
                let stack = self.stacks.allocate_dedicated(wanted)?;
                self.count_new_stack(&stack);
                stack
            }
        };
        Ok((self.acquire(), Some(stack)))
    }

    /// Keep a stack above the pool's size for a later spawn that asks for
    /// as much, or unmap it when `BIG_STACKS_CAP` are kept already.
    fn put_back_big(&self, stack: FiberStack) {
        if self.big_stacks.len() < BIG_STACKS_CAP {
            self.big_stacks.push(stack);
        }
    }

    fn count_new_stack(&self, stack: &FiberStack) {
        let counter = if stack.is_guarded() {
            &self.guarded
        } else {
            &self.unguarded
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// A stack for a fiber's first run: the warmest one this thread's
    /// fibers left, else one from the global side, else a new one.
    #[inline]
    pub(crate) fn start_stack(&self) -> io::Result<FiberStack> {
        let local = CACHE
            .try_with(|c| {
                let mut cache = c.borrow_mut();
                if cache.pool != self.id {
                    return None;
                }
                cache.stacks.pop()
            })
            .ok()
            .flatten();
        match local {
            Some(stack) => Ok(stack),
            None => self.start_stack_slow(),
        }
    }

    /// [`start_stack`](Self::start_stack) when this thread's cache has
    /// none: the global side, else a new stack.
    #[cold]
    #[inline(never)]
    fn start_stack_slow(&self) -> io::Result<FiberStack> {
        if let Some(stack) = self.idle_stacks.pop() {
            return Ok(stack);
        }
        let stack = self.stacks.allocate()?;
        if !stack.was_recycled() {
            self.count_new_stack(&stack);
        }
        Ok(stack)
    }

    /// Take back a frame whose fiber finished (DONE or CANCELLED), and
    /// the stack it ran on: this thread's next fiber to start takes that
    /// stack (warm in this core's cache), the next spawn the frame.
    pub(crate) fn release(&self, frame: Arc<Fiber>, stack: FiberStack) {
        frame.state.transition_to_init();
        self.put_back(frame, Some(stack));
    }

    /// Take back the frame of a fiber that ended without a stack (its first
    /// run found none, `Fiber::fail_start`).
    pub(crate) fn release_frame(&self, frame: Arc<Fiber>) {
        frame.state.transition_to_init();
        self.put_back(frame, None);
    }

    /// The pool's side of [`release`](Self::release): the frame (INIT)
    /// and the stack go to this thread's caches, or to the global side.
    fn put_back(&self, frame: Arc<Fiber>, mut stack: Option<FiberStack>) {
        // A stack above the pool's size goes where only spawns that ask
        // for one look: a fiber's first run takes any stack.
        if stack.as_ref().is_some_and(|s| s.size() > self.stacks.stack_size()) {
            self.put_back_big(stack.take().expect("checked above"));
        }
        let mut rest = Some((frame, stack));
        let _ = CACHE.try_with(|c| {
            let mut cache = c.borrow_mut();
            if cache.pool != self.id {
                return;
            }
            match &cache.in_use {
                Some(cell) => add_own(cell, -1),
                None => {
                    // Relaxed: as in `count_in_use`.
                    self.in_use_shared.fetch_add(-1, Ordering::Relaxed);
                }
            }
            let (frame, stack) = rest.take().expect("frame and stack are present");
            if cache.stacks.len() >= LOCAL_CACHE {
                // The older (colder) half goes to the global side.
                cache
                    .stacks
                    .drain(..TRANSFER_BATCH)
                    .for_each(|old| self.idle_stacks.push(old));
            }
            cache.stacks.extend(stack);
            if cache.frames.len() >= LOCAL_CACHE {
                // Hand the older (colder) half over as one batch; the
                // warmest frames stay here for this thread's next spawns.
                let batch: Vec<_> = cache.frames.drain(..TRANSFER_BATCH).collect();
                self.batched.fetch_add(batch.len(), Ordering::Relaxed);
                self.batches.push(batch);
            }
            cache.frames.push(frame);
        });
        if let Some((frame, stack)) = rest {
            self.count_in_use(-1);
            stack.into_iter().for_each(|stack| self.idle_stacks.push(stack));
            self.idle.push(frame);
        }
    }

    /// Give idle memory back: idle stacks in the global queue beyond
    /// `IDLE_WATERMARK` (32) hand their pages to the kernel
    /// (`MADV_DONTNEED`, guards stay), and idle frames beyond `IDLE_CAP`
    /// (1,024) are freed. Returns how many stacks gave their pages back.
    /// Safe at any time (it touches only idle frames and stacks). Not on the spawn or release
    /// path, so that a burst that repeats keeps its warm stacks: it is
    /// meant for a caller that knows the pool has gone quiet (the program
    /// after a burst). A periodic caller that cannot know that uses
    /// [`trim_surplus`](Self::trim_surplus).
    pub fn trim(&self) -> usize {
        self.trim_surplus(usize::MAX, usize::MAX, usize::MAX)
    }

    /// As [`trim`](Self::trim), for at most `surplus` idle frames and
    /// `stack_surplus` idle stacks: the others, and always
    /// `IDLE_WATERMARK` of each, stay as they are (warm, with their pages).
    /// The monitor passes the frames and stacks that stayed idle for a
    /// whole trim interval (the lowest idle counts it saw), so that a
    /// program whose bursts come back within the interval keeps what they
    /// take: trimming it only made the next burst fault the pages in again
    /// and map new stacks. `big_surplus`: idle stacks above the pool's size
    /// (a spawn's `stack_size`) to unmap, with no watermark: each is a
    /// mapping of its own, up to 1 GiB, so none is kept past an interval
    /// in which it stayed idle.
    pub fn trim_surplus(&self, surplus: usize, stack_surplus: usize, big_surplus: usize) -> usize {
        // Batches count as idle frames like any other.
        while let Some(batch) = self.batches.pop() {
            self.batched.fetch_sub(batch.len(), Ordering::Relaxed);
            batch.into_iter().for_each(|frame| self.idle.push(frame));
        }
        let idle = self.idle.len();
        let untouched = idle.saturating_sub(surplus).max(IDLE_WATERMARK);
        // Only the surplus leaves the queues, from their fronts (idle
        // longest): the others stay where spawns running meanwhile find
        // them.
        let mut kept = Vec::new();
        let mut retired = Vec::new();
        for _ in untouched..idle {
            let Some(frame) = self.idle.pop() else { break };
            if untouched + kept.len() < IDLE_CAP {
                kept.push(frame);
            } else {
                retired.push(frame);
            }
        }
        kept.into_iter().for_each(|frame| self.idle.push(frame));
        if !retired.is_empty() {
            let gone: std::collections::HashSet<*const Fiber> = retired.iter().map(Arc::as_ptr).collect();
            lock(&self.all).retain(|frame| !gone.contains(&Arc::as_ptr(frame)));
        }
        let idle_stacks = self.idle_stacks.len();
        let untouched = idle_stacks.saturating_sub(stack_surplus).max(IDLE_WATERMARK);
        let stacks: Vec<_> = (untouched..idle_stacks).map_while(|_| self.idle_stacks.pop()).collect();
        // Stacks above the pool's size are unmapped (their own mappings).
        let big = self.big_stacks.len();
        let big_kept = big.saturating_sub(big_surplus);
        let big_gone: Vec<_> = (big_kept..big).map_while(|_| self.big_stacks.pop()).collect();
        let released = stacks.len() + big_gone.len();
        drop(big_gone);
        self.stacks.recycle_many(stacks);
        released
    }

    /// Unmap every idle stack (the pool's size and bigger ones), for a pool
    /// whose runtime has shut down: no fiber starts on it again, but the
    /// pool itself lives on as long as a `Handle` of that runtime does,
    /// and without this its idle stacks would stay mapped until then (10 GB
    /// of address space after 10,000 fibers;
    /// `reviews/review68.rs::a_handle_kept_after_its_runtime_pins_no_stacks`),
    /// and so would the allocator's recycled stacks and the slab it carves.
    /// A stack that a fiber of the pool leaves later (one finished by a
    /// reaper) goes when the pool does. Returns how many idle stacks of the
    /// pool's queues were dropped.
    pub fn release_idle_stacks(&self) -> usize {
        let mut released = 0;
        while self.idle_stacks.pop().is_some() {
            released += 1;
        }
        while self.big_stacks.pop().is_some() {
            released += 1;
        }
        // And what the allocator keeps: its recycled stacks and the slabs
        // it is carving (each slab mapped until its last stack goes).
        self.stacks.release_unused();
        released
    }

    /// One frame of a batch that a worker handed over, the rest of the
    /// batch going to the global queue: for a thread without a cache of
    /// this pool (a plain thread calling `block_on` or `Handle::spawn`),
    /// whose `pop_local` never looks at the batches. Without it such a
    /// thread never reused a frame: the frames its fibers left on the
    /// workers went into their caches and batches, and each outside spawn
    /// mapped a new stack (20,000 frames for 20,000 sequential `block_on`,
    /// until the monitor's trim;
    /// `outside_spawns_reuse_frames_finished_on_the_workers`).
    fn pop_batch(&self) -> Option<Arc<Fiber>> {
        let mut batch = self.batches.pop()?;
        self.batched.fetch_sub(batch.len(), Ordering::Relaxed);
        let frame = batch.pop();
        batch.into_iter().for_each(|rest| self.idle.push(rest));
        frame
    }

    /// A frame from this thread's cache, and whether the frame that
    /// [`acquire`](Self::acquire) hands out was counted in use on this
    /// thread's cell (false for a thread without a cache of this pool).
    fn pop_local(&self) -> (Option<Arc<Fiber>>, bool) {
        CACHE
            .try_with(|c| {
                let mut cache = c.borrow_mut();
                if cache.pool != self.id {
                    return (None, false);
                }
                let counted = cache.in_use.as_ref().is_some_and(|cell| {
                    add_own(cell, 1);
                    true
                });
                if cache.frames.is_empty() {
                    // Refill with a whole batch another thread handed over.
                    let Some(batch) = self.batches.pop() else {
                        return (None, counted);
                    };
                    self.batched.fetch_sub(batch.len(), Ordering::Relaxed);
                    cache.frames.extend(batch);
                }
                (cache.frames.pop(), counted)
            })
            .unwrap_or((None, false))
    }

    /// The in-use count: every part summed under the cell list's lock.
    fn in_use_sum(&self) -> isize {
        use Ordering::Relaxed;
        let cells = lock(&self.in_use_cells);
        // Relaxed: statistics (see `in_use_shared`); the lock keeps a
        // retiring cell from being counted twice or not at all.
        let registered: isize = cells.iter().map(|cell| cell.load(Relaxed)).sum();
        registered + self.in_use_shared.load(Relaxed) + self.in_use_retired.load(Relaxed)
    }

    /// Counters at this instant.
    pub fn stats(&self) -> PoolStats {
        PoolStats {
            allocated: self.allocated.load(Ordering::Relaxed),
            in_use: self.in_use_sum().max(0) as usize,
            guarded_stacks: self.guarded.load(Ordering::Relaxed),
            unguarded_stacks: self.unguarded.load(Ordering::Relaxed),
        }
    }

    /// Frames currently idle in the global queue and its batches (thread
    /// caches not counted).
    pub fn idle_in_global(&self) -> usize {
        self.idle.len() + self.batched.load(Ordering::Relaxed)
    }

    /// Stacks no fiber runs on, in the global queues (thread caches not
    /// counted).
    pub fn idle_stacks_in_global(&self) -> usize {
        self.idle_stacks.len()
    }

    /// Idle stacks above the pool's size, kept for later spawns that ask
    /// for one (`SpawnOptions::stack_size`).
    pub fn idle_big_stacks(&self) -> usize {
        self.big_stacks.len()
    }

    /// The fibers parked right now (a racy snapshot, for diagnostics such
    /// as deadlock reports).
    pub fn parked_fibers(&self) -> Vec<ParkedFiber> {
        let all = lock(&self.all).clone();
        all.iter()
            .filter(|f| f.state.load(Ordering::Relaxed).state() == FiberState::Parked)
            .map(|f| ParkedFiber {
                id: f.id(),
                waiting_on: f.waiting_on().unwrap_or("(nothing recorded)"),
                spawned_at: f.spawned_at(),
            })
            .collect()
    }

    /// Is every live fiber of this pool parked right now, none of them on
    /// a wait that cancellation does not end ([`Interrupt::NotCancellable`]:
    /// a lock, a `OnceLock` being initialised, which a plain thread may
    /// release; inside `non_cancellable`, a channel or `park` wait, which a
    /// thread may end too: `WaitKind::may_end_from_a_thread`) or that may end without the pool's fibers (a wait with a
    /// deadline, a socket, a blocking-pool call: clean-up in
    /// `non_cancellable` that sleeps or flushes)? A racy snapshot; `false`
    /// when none is alive. Shutdown uses it to stop waiting early for
    /// fibers that only other fibers of the pool can wake.
    ///
    /// [`Interrupt::NotCancellable`]: crate::Interrupt::NotCancellable
    pub fn all_parked(&self) -> bool {
        let all = lock(&self.all);
        let mut live = 0;
        for frame in all.iter() {
            // Acquire: pairs with the Release of the fiber's PARKING ->
            // PARKED step, so the park notes made before it are seen.
            match frame.state.load(Ordering::Acquire).state() {
                FiberState::Init | FiberState::Done | FiberState::Cancelled => {}
                FiberState::Parked if !frame.parked_uncancellable() && !frame.parked_until_outside_event() => live += 1,
                _ => return false,
            }
        }
        live > 0
    }

    /// Is some fiber of this pool parked on a wait of `kind` right now (a
    /// racy snapshot)? Stops at the first one and copies nothing.
    pub fn any_parked_on(&self, kind: crate::WaitKind) -> bool {
        lock(&self.all).iter().any(|frame| {
            frame.state.load(Ordering::Relaxed).state() == FiberState::Parked && frame.last_park_kind() == kind
        })
    }

    /// Every live fiber of this pool, with what it waits on and where (a
    /// racy snapshot; see [`Dump`](crate::Dump)).
    pub fn dump(&self) -> crate::Dump {
        let all = lock(&self.all).clone();
        crate::Dump::new(all.iter().filter_map(|f| f.info()).collect())
    }

    /// The shutdown phase of this pool's runtime.
    pub fn phase(&self) -> Phase {
        // Acquire: pairs with the Release half of the SeqCst swap in
        // `begin_cancel` / `teardown`.
        Phase::from_u8(self.phase.load(Ordering::Acquire))
    }

    /// Shutdown step 2: from now on every cancellable wait of this pool's
    /// fibers ends with `Cancelled` (and yields once, so its worker stays
    /// responsive), fibers that have not started never run their closure,
    /// and spawns from outside the runtime are refused. Every fiber parked
    /// right now is woken so that it sees this at its cancellation point and
    /// can return normally on a worker. Returns `false` if the pool was
    /// already past [`Phase::Open`]. Safe at any time: it only cancels.
    pub fn begin_cancel(&self) -> bool {
        if self
            .phase
            .compare_exchange(
                Phase::Open as u8,
                Phase::Cancelling as u8,
                Ordering::SeqCst,
                Ordering::Relaxed,
            )
            .is_err()
        {
            return false;
        }
        // `wake_current_wait` is the canceller's half of the handshake in
        // `wait.rs::enter_parking` (phase stored; fence; read state): either
        // a fiber sees the phase before it parks, or we wake it.
        let all = lock(&self.all).clone();
        for frame in &all {
            crate::wait::wake_current_wait(frame);
        }
        true
    }

    /// Shutdown step 3: resume every fiber that is still alive, children
    /// before their scope owners (descending fiber id: a child is always
    /// spawned after the fiber whose stack it borrows from), on the calling
    /// thread, until each has returned. In this phase a cancellable wait
    /// unwinds the fiber's stack (a normal Rust unwind on the fiber's own
    /// stack, caught at the fiber's entry and reported to joiners as
    /// `Cancelled`), and a wait inside a destructor that is already
    /// unwinding returns `Cancelled` at once. A fiber that keeps catching the
    /// unwind and waiting again, or that stays parked on a wait nothing will
    /// complete, is abandoned: its stack is never resumed nor unwound, and
    /// the report says so; the caller must then leak the pool
    /// ([`TeardownReport::must_leak`]) and everything the abandoned fibers
    /// may still point to.
    ///
    /// With `panic = "abort"` no fiber is resumed (an unwind would abort
    /// the process): all are abandoned, with a notice.
    ///
    /// `drain` hands over every runnable fiber the scheduler still holds in
    /// its queues (called once per round, after the previous round may have
    /// scheduled more).
    ///
    /// A pinned fiber that has run is not resumed here (its home worker,
    /// whose thread-locals its stack may point into, has stopped): it is
    /// abandoned ([`teardown_with_homes`](Self::teardown_with_homes) lets
    /// a scheduler resume it on its home worker instead).
    ///
    /// Safe code cannot start a teardown under running workers:
    ///
    /// ```compile_fail,E0133
    /// # mod fiber { pub(crate) use fiber_core as core; }
    /// let pool = fiber::core::FramePool::new(fiber::core::StackConfig::default());
    /// pool.teardown(&mut Vec::new);
    /// ```
    ///
    /// # Safety
    ///
    /// The scheduler's workers have stopped: no thread but the caller
    /// resumes any fiber of this pool from now on. (Teardown takes a fiber
    /// only the way a waker does, so no fiber ever runs on two threads; but
    /// an abandoned fiber's root job is ended, which wakes a scope owner
    /// waiting for the abandoned fiber's children, and a worker that
    /// resumed that owner would let its scope return while an abandoned
    /// child, never unwound, may still be in a call that borrows the
    /// owner's stack.)
    pub unsafe fn teardown(&self, drain: &mut dyn FnMut() -> Vec<Runnable>) -> TeardownReport {
        self.teardown_rounds(drain, &mut Err, false, true)
    }

    /// [`teardown`](Self::teardown) (`around_running` false) or
    /// [`teardown_around_running`](Self::teardown_around_running) (true),
    /// with the scheduler's help for pinned fibers: a fiber that must
    /// resume on its home worker (pinned, or kept there for an unwind) is
    /// handed to `at_home`, which resumes it on that worker's thread (still
    /// alive, out of its scheduling loop, its thread-locals intact) and
    /// returns the outcome while the caller waits, or gives it back when
    /// that worker's thread cannot (gone, or stuck in a fiber): it is then
    /// abandoned, as [`teardown`](Self::teardown) abandons every pinned
    /// fiber that has run. One fiber runs at a time either way, in the
    /// same children-first order.
    ///
    /// # Safety
    ///
    /// As for [`teardown`](Self::teardown) (or
    /// [`teardown_around_running`](Self::teardown_around_running)), except
    /// that `at_home` resumes the fiber it is given on another thread, the
    /// fiber's home worker, which resumes no other fiber of this pool and
    /// returns before `at_home` does.
    pub unsafe fn teardown_with_homes(
        &self,
        drain: &mut dyn FnMut() -> Vec<Runnable>,
        at_home: &mut dyn FnMut(Runnable) -> Result<RunOutcome, Runnable>,
        around_running: bool,
    ) -> TeardownReport {
        self.teardown_rounds(drain, at_home, true, !around_running)
    }

    /// Is a live fiber of this pool bound to `worker`'s thread (pinned
    /// after running there, or kept there for an unwind), and not given up
    /// for good by a teardown? A racy snapshot;
    /// exact once that worker has stopped resuming fibers (no fiber can
    /// become bound to it then). A worker that stops at shutdown stays to
    /// resume such fibers for [`teardown_with_homes`](Self::teardown_with_homes).
    pub fn any_homed_at(&self, worker: usize) -> bool {
        lock(&self.all).iter().any(|frame| {
            // Relaxed: read by the worker after its own last resume (same
            // thread), or by the teardown thread after that worker's reply
            // for the last fiber it resumed (the reply channel orders the
            // fiber's writes before this read): either way after what
            // wrote it.
            !matches!(
                frame.state.load(Ordering::Relaxed).state(),
                FiberState::Init | FiberState::Done | FiberState::Cancelled
            ) && (frame.is_pinned() || frame.is_unwind_pinned())
                && frame.last_worker() == Some(worker)
                // One given up for good needs no home any more.
                && (!frame.is_abandoned() || unwinds_later(frame, true).is_some())
        })
    }

    /// [`teardown`](Self::teardown) while some fibers still run on threads
    /// that have not stopped (a worker stuck in a fiber that never yields):
    /// the same rounds, except that a fiber left parked is not abandoned
    /// (what it waits for may be one of the running fibers, a scope's
    /// child); a later [`teardown`](Self::teardown), once those threads
    /// have stopped, ends it or abandons it.
    ///
    /// # Safety
    ///
    /// As for [`teardown`](Self::teardown), except that a worker may still
    /// be running the one fiber it was running when it was told to stop,
    /// provided it resumes no other fiber afterwards.
    pub unsafe fn teardown_around_running(&self, drain: &mut dyn FnMut() -> Vec<Runnable>) -> TeardownReport {
        self.teardown_rounds(drain, &mut Err, false, false)
    }

    /// Take back the fibers a teardown gave up on because they waited for a
    /// blocking call (`WaitKind::Blocking`, a wait teardown never ends) or
    /// for a channel hand-off another party holds (`WaitKind::Handoff`),
    /// once every such call has returned: a later
    /// [`teardown`](Self::teardown) then resumes them (the call's wake
    /// queued them; one still waiting for its hand-off parks again, and
    /// its holder's unwind in that teardown, or the holder's completion
    /// elsewhere, wakes it), and they run to their end, their destructors
    /// with them (sockets and files closed). Returns how many.
    ///
    /// # Safety
    ///
    /// As for [`teardown`](Self::teardown); and no blocking call of these
    /// fibers is still running (their closures may borrow their stacks).
    pub unsafe fn revive_abandoned_in_blocking(&self) -> usize {
        let all = lock(&self.all);
        let waits_for_call = |frame: &Arc<Fiber>| {
            frame.is_abandoned() && matches!(unwinds_later(frame, true), Some(Later::Blocking | Later::Handoff))
        };
        let calls_left = all.iter().any(waits_for_call);
        let mut revived = 0;
        for frame in all.iter().filter(|frame| waits_for_call(frame)) {
            frame.revive();
            revived += 1;
        }
        // A fiber given up beside them (`Later::Dependent`) runs only once
        // none waits for a call or a hand-off any more, one at a time,
        // newest first: its jobs ended when it was given up (a scope
        // owner's join returns at once), so every fiber that could use its
        // stack (its scoped children, spawned after it) must have ended, or
        // be lost for good (never resumed), before it leaves its scope.
        if !calls_left {
            let newest = all
                .iter()
                .filter(|frame| frame.is_abandoned() && unwinds_later(frame, true) == Some(Later::Dependent))
                .max_by_key(|frame| frame.id());
            if let Some(frame) = newest {
                frame.revive();
                revived += 1;
            }
        }
        revived
    }

    /// How many fibers given up beside fibers that waited for a call or a
    /// hand-off (`Later::Dependent`) wait to be revived, one per pass, by
    /// [`revive_abandoned_in_blocking`](Self::revive_abandoned_in_blocking)?
    pub fn abandoned_dependents(&self) -> usize {
        lock(&self.all)
            .iter()
            .filter(|frame| frame.is_abandoned() && unwinds_later(frame, true) == Some(Later::Dependent))
            .count()
    }

    /// How many fibers a teardown gave up on still wait for a channel
    /// hand-off (`WaitKind::Handoff`) that nothing has ended yet: its
    /// holder is in another runtime, a plain thread, or this runtime's
    /// blocking call. Once it ends (the holder's wake makes the fiber
    /// runnable), [`revive_abandoned_in_blocking`](Self::revive_abandoned_in_blocking)
    /// and a [`teardown`](Self::teardown) finish the fiber.
    pub fn abandoned_awaiting_handoff(&self) -> usize {
        lock(&self.all)
            .iter()
            .filter(|frame| {
                // Acquire: pairs with the Release of the holder's claim
                // (`fiber_wake`), so a frame seen woken is queued for the
                // next teardown's drain once the waker's push is done.
                frame.is_abandoned()
                    && unwinds_later(frame, true) == Some(Later::Handoff)
                    && frame.state.load(Ordering::Acquire).state() == FiberState::Parked
            })
            .count()
    }

    /// Does a teardown keep fibers given up for later whose wake had
    /// already queued them (see `give_up`)? Their blocking call or
    /// hand-off has ended, so nothing else will signal them: the caller
    /// runs another [`revive_abandoned_in_blocking`](Self::revive_abandoned_in_blocking)
    /// and teardown to finish them.
    pub fn holds_given_up_woken(&self) -> bool {
        !lock(&self.given_up_woken).is_empty()
    }

    /// Is a fiber (not given up on) RUNNABLE or WAKING while every queue
    /// teardown drains was empty: claimed by a waker on another thread
    /// that has not queued it yet?
    fn any_in_transit(&self) -> bool {
        lock(&self.all).iter().any(|frame| {
            // Acquire: pairs with the Release of a waker's claim CAS; the
            // loop drains again after seeing it, and the waker's push to
            // a queue (under that queue's own synchronisation) is what
            // the drain then finds.
            !frame.is_abandoned()
                && matches!(
                    frame.state.load(Ordering::Acquire).state(),
                    FiberState::Runnable | FiberState::Waking
                )
        })
    }

    /// Give up on a fiber in a teardown. One given up for later (its
    /// blocking call or hand-off ended, and its wake queued it: it is
    /// runnable and will not be woken again) is kept with its place in
    /// the queues, `given_up_woken`, for the teardown after
    /// [`revive_abandoned_in_blocking`](Self::revive_abandoned_in_blocking);
    /// dropped, a revived fiber was in no queue and never ran, its
    /// destructors lost (`reviews/review53.rs`, the unpinned control,
    /// failed about 1 run in 20 under load).
    fn give_up(&self, runnable: Runnable, homes: bool) {
        if unwinds_later(runnable.fiber_ref(), homes).is_some() {
            runnable.fiber_ref().mark_abandoned();
            lock(&self.given_up_woken).push(runnable);
        } else {
            runnable.abandon();
        }
    }

    /// Is a fiber in transit (see [`any_in_transit`](Self::any_in_transit))
    /// and the pass's budget of waits for one not spent? Then wait a
    /// little (64 thread yields, then 100 us sleeps) and say so: the
    /// caller drains again.
    fn waited_for_transit(&self, waits: &mut u32) -> bool {
        if *waits >= TEARDOWN_TRANSIT_WAITS || !self.any_in_transit() {
            return false;
        }
        *waits += 1;
        if *waits <= 64 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
        true
    }

    fn teardown_rounds(
        &self,
        drain: &mut dyn FnMut() -> Vec<Runnable>,
        at_home: &mut dyn FnMut(Runnable) -> Result<RunOutcome, Runnable>,
        homes: bool,
        last: bool,
    ) -> TeardownReport {
        // What the fiber running this teardown (if any) has pending for its
        // own scheduler; given back at the end.
        // SAFETY: this thread's pending count is given back below, untouched.
        let outer_pins = unsafe { crate::fiber::take_unwind_pin_delta() };
        let report = self.teardown_rounds_inner(drain, at_home, homes, last);
        crate::fiber::unwind_pin_delta(outer_pins);
        report
    }

    fn teardown_rounds_inner(
        &self,
        drain: &mut dyn FnMut() -> Vec<Runnable>,
        at_home: &mut dyn FnMut(Runnable) -> Result<RunOutcome, Runnable>,
        homes: bool,
        last: bool,
    ) -> TeardownReport {
        self.begin_cancel();
        self.phase.store(Phase::Teardown as u8, Ordering::SeqCst);
        // Spawns from outside that were admitted before the store put their
        // fibers in a queue before the first drain (`SpawnGate`).
        self.gate.wait_for_admitted();
        let mut report = TeardownReport::default();
        let mut idle_rounds = 0;
        let mut resumes: std::collections::HashMap<u64, u32> = std::collections::HashMap::new();
        let mut requeue = Vec::new();
        let mut transit_waits = 0;
        let mut first_round = true;
        loop {
            let mut batch = drain();
            batch.append(&mut requeue);
            // Those given up for later and since revived run now.
            {
                let mut held = lock(&self.given_up_woken);
                let (revived, still): (Vec<_>, Vec<_>) = std::mem::take(&mut *held)
                    .into_iter()
                    .partition(|r| !r.fiber_ref().is_abandoned());
                *held = still;
                batch.extend(revived);
            }
            // The parked fibers are woken (to be unwound) in the first
            // round and whenever no other work is left or the last round
            // ended nothing. Not in every round: a chain of hand-offs (a
            // lock passed from waiter to waiter) runs one fiber per round,
            // and rescanning every fiber each time made a pass over many
            // waiters quadratic (`adversarial/sync_waiters.rs`).
            if first_round || batch.is_empty() || idle_rounds > 0 {
                let all = lock(&self.all).clone();
                // A non-cancellable wait (a lock) made in clean-up (after a
                // cancelled wait told the fiber of the shutdown, or while it
                // unwinds) is left parked while anything else can run: what
                // it waits for may be released by this pass (its holder
                // unwound), and ending it would cut the clean-up short, a
                // destructor taking the lock (`reviews/review72.rs`). Once
                // the pass makes no progress without it, it is woken too.
                // (One not told yet is unwound at the wait, its
                // cancellation point, as tokio drops a task at its await.)
                let stalled = idle_rounds > 0;
                wake_parked(&all, stalled, &mut batch);
                if batch.is_empty() && !stalled {
                    wake_parked(&all, true, &mut batch);
                }
            }
            first_round = false;
            if batch.is_empty() {
                // A fiber that another thread is waking right now (a
                // blocking call returning, a plain thread's send) is
                // RUNNABLE before it reaches a queue: neither parked nor
                // drained, it would be neither run nor given up on, and its
                // joiners would wait for ever
                // (`reviews/review27.rs::a_fiber_given_up_in_a_blocking_call_can_be_joined_after_the_runtime_is_dropped`).
                // Its waker is in the middle of a few lines: wait for it.
                if self.waited_for_transit(&mut transit_waits) {
                    continue;
                }
                break;
            }
            batch.sort_by_key(|r| std::cmp::Reverse(r.id()));
            let mut finished = 0;
            for runnable in batch {
                if runnable.fiber_ref().is_abandoned() {
                    // Woken after an earlier teardown gave up on it (what
                    // it waited for ended on a thread that was still
                    // running): its task is already ended; never resume it
                    // here. One given up for later is kept, runnable, for
                    // the teardown after its revival.
                    self.give_up(runnable, homes);
                    continue;
                }
                let id = runnable.id();
                let count = resumes.entry(id.0).or_insert(0);
                *count += 1;
                if cfg!(panic = "abort") || *count > TEARDOWN_MAX_RESUMES {
                    runnable.abandon();
                    continue;
                }
                // A pinned fiber that has run resumes on its home worker
                // only: its stack may point into that thread's
                // thread-locals. The scheduler resumes it there if that
                // thread is still up; if not, it is not resumed (nor
                // unwound) at all: given up. (One kept on this thread for
                // an unwind that parked here is resumed here.)
                let outcome = if runnable.home().is_some_and(|home| home != TEARDOWN_WORKER) {
                    match at_home(runnable) {
                        Ok(outcome) => outcome,
                        Err(runnable) => {
                            runnable.abandon();
                            continue;
                        }
                    }
                } else {
                    let outcome = runnable.into_running().resume(TEARDOWN_WORKER);
                    // Pins for unwinds on this thread are this loop's
                    // business, not the scheduler's (this may be another
                    // runtime's worker).
                    // SAFETY: teardown is the scheduler resuming here; the
                    // count from before it was set aside above.
                    let _ = unsafe { crate::fiber::take_unwind_pin_delta() };
                    outcome
                };
                match outcome {
                    RunOutcome::Finished => {
                        finished += 1;
                        report.finished += 1;
                    }
                    RunOutcome::Parked => {}
                    // yield_now unwinds in teardown: only a fiber that
                    // caught the unwind gets here; it goes round again.
                    RunOutcome::Yielded(again) => requeue.push(again),
                }
            }
            if finished == 0 {
                idle_rounds += 1;
                if idle_rounds > TEARDOWN_IDLE_ROUNDS {
                    // What is left waits on something nothing will complete
                    // (unless a fiber still running elsewhere completes it).
                    if last {
                        let all = lock(&self.all);
                        let mut parked = Vec::new();
                        // While some fiber waits for a blocking call or a
                        // hand-off, to be finished later, the others left
                        // parked may wait on it (a scope on its child, a
                        // lock's waiter on its holder): they are finished
                        // later too, or given up for good then
                        // (`reviews/review71.rs`: a scope owner whose
                        // children were in `fiber::blocking` was lost).
                        let mut any_later = false;
                        for frame in all.iter() {
                            let is_parked = frame.state.load(Ordering::Acquire).state() == FiberState::Parked;
                            if is_parked {
                                parked.push(frame);
                            }
                            any_later |= (is_parked || frame.is_abandoned())
                                && matches!(unwinds_later(frame, homes), Some(Later::Blocking | Later::Handoff));
                        }
                        // Dependent before given up: a lock's waker that
                        // sees the fiber given up but not dependent takes it
                        // as lost for good and skips it (`Waiter::is_lost`).
                        for frame in parked {
                            if any_later {
                                frame.mark_abandoned_dependent();
                            }
                            frame.mark_abandoned();
                        }
                    }
                    let mut rest = drain();
                    rest.append(&mut requeue);
                    for runnable in rest {
                        self.give_up(runnable, homes);
                    }
                    // A fiber that a thread outside the pass woke while the
                    // parked ones were given up (a blocking call returning)
                    // was RUNNABLE, so neither given up nor drained: ended
                    // here, it would never run, and its joiners (no reaper
                    // started for it) would wait for ever. Wait for its
                    // waker's push and go round again, to run it.
                    if self.waited_for_transit(&mut transit_waits) {
                        continue;
                    }
                    break;
                }
            } else {
                idle_rounds = 0;
            }
        }
        let mut abandoned = Vec::new();
        for frame in lock(&self.all).iter() {
            if frame.take_abandon_report() {
                let later = unwinds_later(frame, homes);
                report.note_abandoned(frame.id(), frame.spawned_at(), later);
                // SAFETY: abandoned, so not resumed in this pass: teardown
                // skips it, the workers have stopped (a worker stuck in a
                // fiber that never yields leaves its loop once that fiber
                // returns, without resuming another), and a fiber that
                // abandoned itself parks for good without touching its
                // task slot: nobody writes that slot now. (One given up
                // for later runs again only in a later pass, on the
                // thread that runs that pass.)
                abandoned.extend(unsafe { frame.abandoned_task() });
            }
        }
        // Its joiners learn it ended cancelled (outside the pool's lock:
        // a wake may schedule a joiner), and its jobs end (spec/jobs.md:
        // the handle and the root job agree). A scope owner given up for
        // later sees its scope's children ended so: it is revived only
        // once every fiber that could still use its stack has ended or is
        // lost for good (`revive_abandoned_in_blocking`).
        for task in abandoned {
            task.abandon();
        }
        if cfg!(panic = "abort") && report.abandoned > 0 {
            eprintln!(
                "fiber: {} fiber(s) were still parked at shutdown; with panic = \"abort\" they cannot be \
                 unwound, so their stacks are leaked (their destructors do not run)",
                report.abandoned
            );
        }
        report
    }
}

/// Claim every parked fiber of `all` for a teardown round (those in a
/// non-cancellable wait made in clean-up only with `uncancellable`).
fn wake_parked(all: &[Arc<Fiber>], uncancellable: bool, batch: &mut Vec<Runnable>) {
    for frame in all {
        if frame.is_abandoned() {
            continue;
        }
        let seen = frame.state.load(Ordering::Acquire);
        if seen.state() != FiberState::Parked
            || (!uncancellable && frame.parked_uncancellable() && frame.parked_in_clean_up())
        {
            continue;
        }
        if frame.state.wake(seen.ticket()) == crate::state::Claim::Claimed {
            batch.push(Runnable::new(frame.clone(), Actor::Waker));
        }
    }
}

/// How many times teardown looks again for a fiber being woken when its
/// queues are empty: 64 thread yields, then 100 us sleeps (about 1 s in
/// all, for a waker descheduled in the middle of its wake).
const TEARDOWN_TRANSIT_WAITS: u32 = 64 + 10_000;

/// Resume budget of one fiber during teardown: a fiber that catches the
/// teardown unwind and waits again this many times is abandoned.
const TEARDOWN_MAX_RESUMES: u32 = 16;

/// Rounds in a row with no fiber finishing before teardown gives up on the
/// rest.
const TEARDOWN_IDLE_ROUNDS: u32 = 3;

/// The worker index that teardown resumes fibers with (not a worker: a
/// scheduler sends anything it schedules to its shared queue).
pub const TEARDOWN_WORKER: usize = usize::MAX - 1;

/// Shutdown phases of a pool (and its runtime), in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Phase {
    /// Running normally.
    Open = 0,
    /// Shutting down: waits are cancelled, fibers finish on the workers.
    Cancelling = 1,
    /// Workers stopped: what is left is unwound on the shutdown thread.
    Teardown = 2,
}

impl Phase {
    fn from_u8(v: u8) -> Phase {
        match v {
            0 => Phase::Open,
            1 => Phase::Cancelling,
            _ => Phase::Teardown,
        }
    }
}

/// What [`FramePool::teardown`] did.
#[derive(Debug, Default)]
pub struct TeardownReport {
    /// Fibers that returned (normally or by unwinding) during teardown.
    pub finished: usize,
    /// Fibers given up on: never resumed again, stacks leaked.
    pub abandoned: usize,
    /// Ids and spawn sites of the abandoned fibers (at most 16 listed).
    pub abandoned_fibers: Vec<(crate::FiberId, &'static std::panic::Location<'static>)>,
    /// How many of the abandoned fibers wait for a `blocking` call that
    /// has not returned (its closure may borrow their stacks).
    pub abandoned_in_blocking: usize,
    /// How many of the abandoned fibers wait for a channel hand-off that
    /// another party (a `select!` send arm in a blocking call, in another
    /// runtime, or on a plain thread) holds: they can be finished once it
    /// ends ([`FramePool::abandoned_awaiting_handoff`]).
    pub abandoned_in_handoff: usize,
    /// How many of the abandoned fibers were left parked on another wait
    /// while some waited for a blocking call or a hand-off: what they wait
    /// for may be one of those (a scope for its child), so they are
    /// revived and run with them, and given up for good only if they are
    /// still parked once those have ended.
    pub abandoned_dependent: usize,
}

impl TeardownReport {
    /// The pool (and anything the abandoned fibers' stacks point to) must
    /// never be freed.
    pub fn must_leak(&self) -> bool {
        self.abandoned > 0
    }

    /// Fibers given up on that a later teardown can finish (they wait for
    /// a blocking call or a hand-off, or were left parked beside such
    /// fibers); the rest are lost for good.
    pub fn abandoned_for_later(&self) -> usize {
        self.abandoned_in_blocking + self.abandoned_in_handoff + self.abandoned_dependent
    }

    fn note_abandoned(&mut self, id: crate::FiberId, at: &'static std::panic::Location<'static>, later: Option<Later>) {
        self.abandoned += 1;
        self.abandoned_in_blocking += usize::from(later == Some(Later::Blocking));
        self.abandoned_in_handoff += usize::from(later == Some(Later::Handoff));
        self.abandoned_dependent += usize::from(later == Some(Later::Dependent));
        if self.abandoned_fibers.len() < 16 {
            self.abandoned_fibers.push((id, at));
        }
    }
}

/// What a fiber given up on by a teardown waits for that ends without the
/// teardown: a later teardown can finish it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Later {
    /// A `fiber::blocking` call: it returns on its pool thread.
    Blocking,
    /// A channel hand-off another party holds (`WaitKind::Handoff`).
    Handoff,
    /// Another wait, left when fibers were given up for later: what it
    /// waits for may be one of them (a scope for its child in a blocking
    /// call), so it is revived with them.
    Dependent,
}

/// Will a fiber given up on inside a `fiber::blocking` call (or while it
/// waits for a channel hand-off) be unwound once the call returns (the
/// hand-off ends), by [`FramePool::revive_abandoned_in_blocking`] and a
/// later teardown? A pinned one (or one pinned for an unwind) resumes only
/// on its home worker: only if the scheduler keeps its workers serving
/// their fibers for teardown (`homes`, [`FramePool::teardown_with_homes`]);
/// otherwise teardown gives it up for good, the shutdown report must say
/// so, and the runtime's memory stays leaked
/// (`reviews/review21.rs::a_pinned_fiber_given_up_in_a_blocking_call_is_unwound_or_reported_as_lost`).
/// (A later teardown whose home does not serve it gives it up then.)
fn unwinds_later(frame: &Fiber, homes: bool) -> Option<Later> {
    let bound = frame.is_pinned() || frame.is_unwind_pinned();
    if bound && (!homes || frame.last_worker() == Some(TEARDOWN_WORKER)) {
        // Bound to the thread of the pass that last ran it (an unwind it
        // parked in the middle of, std's panic count of that thread; or
        // thread-locals): a later pass runs on the reaper's thread.
        return None;
    }
    match frame.last_park_kind() {
        crate::dump::WaitKind::Blocking => Some(Later::Blocking),
        crate::dump::WaitKind::Handoff => Some(Later::Handoff),
        _ if frame.is_abandoned_dependent() => Some(Later::Dependent),
        _ => None,
    }
}

impl Runnable {
    /// Give up on this fiber for good (teardown).
    fn abandon(self) {
        // The frame stays in `all` and is never released: its stack may be
        // borrowed by other abandoned fibers.
        self.into_fiber().mark_abandoned();
    }
}

impl fmt::Debug for FramePool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FramePool")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// `release` without the state step (these frames never ran).
    fn give_back(pool: &FramePool, frame: Arc<Fiber>) {
        pool.put_back(frame, None);
    }

    /// Frames a finishing thread gives back reach a spawning thread in
    /// batches: nothing is lost, no new frame is made while idle ones
    /// exist, and the global side holds exactly the frames no cache holds.
    /// `n` frames taken on a thread of their own that registered with
    /// `pool` (their stacks are dropped: the tests are about frames).
    fn take_on_a_registered_thread(pool: &std::sync::Arc<FramePool>, n: usize) -> Vec<Arc<Fiber>> {
        let pool = pool.clone();
        std::thread::spawn(move || {
            FramePool::register_thread(&pool);
            let taken: Vec<_> = (0..n).map(|_| pool.acquire()).collect();
            FramePool::unregister_thread();
            taken
        })
        .join()
        .unwrap()
    }

    #[test]
    fn the_in_use_count_sums_the_threads_parts() {
        let pool = std::sync::Arc::new(FramePool::new(StackConfig::default()));
        const N: usize = 100;
        // Taken on one registered thread, given back on another and on an
        // unregistered one: each thread's shard alone is off, the sum is
        // the frames in use.
        let taken = take_on_a_registered_thread(&pool, N);
        assert_eq!(pool.stats().in_use, N);
        let mut taken = taken.into_iter();
        {
            let pool = pool.clone();
            let half: Vec<_> = taken.by_ref().take(N / 2).collect();
            std::thread::spawn(move || {
                FramePool::register_thread(&pool);
                half.into_iter().for_each(|frame| give_back(&pool, frame));
                FramePool::unregister_thread();
            })
            .join()
            .unwrap();
        }
        assert_eq!(pool.stats().in_use, N - N / 2);
        taken.for_each(|frame| give_back(&pool, frame));
        assert_eq!(pool.stats().in_use, 0);
    }

    #[test]
    fn frames_flow_between_thread_caches_in_batches() {
        let pool = std::sync::Arc::new(FramePool::new(StackConfig::default()));
        const N: usize = 3 * LOCAL_CACHE;
        // A spawning thread takes N frames (their stacks are dropped: the
        // test is about frames).
        let taken = take_on_a_registered_thread(&pool, N);
        assert_eq!(pool.stats().allocated, N);
        // A finishing thread gives them all back: its cache keeps at most
        // LOCAL_CACHE, the rest goes to the global side in whole batches.
        let (to_main, from_finisher) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let finisher = {
            let pool = pool.clone();
            std::thread::spawn(move || {
                FramePool::register_thread(&pool);
                taken.into_iter().for_each(|frame| give_back(&pool, frame));
                to_main.send(pool.idle_in_global()).unwrap();
                go_rx.recv().unwrap();
                FramePool::unregister_thread();
            })
        };
        let global = from_finisher.recv().unwrap();
        assert!(global >= N - LOCAL_CACHE, "{global} frames handed over");
        assert_eq!(global % TRANSFER_BATCH, 0, "handed over in whole batches");
        assert_eq!(pool.idle.len(), 0, "no frame went over one by one");
        // Another thread reuses them, a batch at a time.
        let reused = {
            let pool = pool.clone();
            std::thread::spawn(move || {
                FramePool::register_thread(&pool);
                let got: Vec<_> = (0..global).map(|_| pool.acquire()).collect();
                let n = got.len();
                got.into_iter().for_each(|frame| give_back(&pool, frame));
                FramePool::unregister_thread();
                n
            })
            .join()
            .unwrap()
        };
        assert_eq!(reused, global);
        assert_eq!(pool.stats().allocated, N, "no frame was made while idle ones existed");
        go_tx.send(()).unwrap();
        finisher.join().unwrap();
        assert_eq!(pool.idle_in_global(), N, "every frame is back on the global side");
        assert_eq!(pool.stats().in_use, 0);
    }
}
