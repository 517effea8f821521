//! The frame pool: fiber frames (and the stacks they keep) are recycled;
//! only [`FramePool::trim`] gives idle stacks' pages and idle frames beyond a
//! cap back before the pool itself is dropped at runtime shutdown (spec 1.1).
//!
//! A per-thread cache of [`LOCAL_CACHE`] frames sits in front of a global
//! lock-free queue (crossbeam-queue's `SegQueue`): a worker that finishes a
//! fiber and then spawns one reuses the frame without touching shared state.

use crate::fiber::Fiber;
use crate::stack::{FiberStack, StackAllocator, StackConfig};
use crate::sync::{lock, Arc, AtomicUsize, Mutex, Ordering};
use std::cell::RefCell;
use std::fmt;
use std::io;

/// Frames a thread keeps for itself before handing them to the global queue.
/// Large enough to absorb a spawn/finish burst of one worker, small enough
/// that idle workers do not hoard frames.
pub const LOCAL_CACHE: usize = 64;

/// Idle frames in the global queue that keep their stack's pages through a
/// [`FramePool::trim`]; beyond them, stacks give their pages back.
pub const IDLE_WATERMARK: usize = 32;

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
    id: usize,
    idle: crossbeam_queue::SegQueue<Arc<Fiber>>,
    /// Every frame this pool created, for shutdown and diagnostics.
    all: Mutex<Vec<Arc<Fiber>>>,
    allocated: AtomicUsize,
    in_use: AtomicUsize,
    guarded: AtomicUsize,
    unguarded: AtomicUsize,
    stacks: StackAllocator,
}

thread_local! {
    /// This thread's frame cache: (pool id, frames).
    static CACHE: RefCell<LocalCache> = const { RefCell::new(LocalCache { pool: 0, frames: Vec::new(), owner: None }) };
}

struct LocalCache {
    pool: usize,
    frames: Vec<Arc<Fiber>>,
    /// Where to return the frames when the thread exits.
    owner: Option<std::sync::Weak<FramePool>>,
}

impl Drop for LocalCache {
    fn drop(&mut self) {
        if let Some(pool) = self.owner.take().and_then(|w| w.upgrade()) {
            for frame in self.frames.drain(..) {
                pool.idle.push(frame);
            }
        }
    }
}

impl FramePool {
    /// A pool whose stacks follow `config` (validated by the caller).
    pub fn new(config: StackConfig) -> FramePool {
        FramePool {
            id: next_pool_id(),
            idle: crossbeam_queue::SegQueue::new(),
            all: Mutex::new(Vec::new()),
            allocated: AtomicUsize::new(0),
            in_use: AtomicUsize::new(0),
            guarded: AtomicUsize::new(0),
            unguarded: AtomicUsize::new(0),
            stacks: StackAllocator::new(config),
        }
    }

    /// Let this thread cache frames of `pool` (workers call this once at
    /// start). Without it, frames go straight to the global queue.
    pub fn register_thread(pool: &std::sync::Arc<FramePool>) {
        CACHE.with(|c| {
            let mut cache = c.borrow_mut();
            let old: Vec<_> = cache.frames.drain(..).collect();
            if let Some(prev) = cache.owner.take().and_then(|w| w.upgrade()) {
                for frame in old {
                    prev.idle.push(frame);
                }
            }
            cache.pool = pool.id;
            cache.owner = Some(std::sync::Arc::downgrade(pool));
        });
    }

    /// Return this thread's cached frames to the global queue (workers call
    /// this before they exit).
    pub fn unregister_thread() {
        CACHE.with(|c| {
            let mut cache = c.borrow_mut();
            let frames: Vec<_> = cache.frames.drain(..).collect();
            if let Some(pool) = cache.owner.take().and_then(|w| w.upgrade()) {
                for frame in frames {
                    pool.idle.push(frame);
                }
            }
            cache.pool = 0;
        });
    }

    /// Usable bytes of each stack.
    pub fn stack_size(&self) -> usize {
        self.stacks.stack_size()
    }

    /// A frame in INIT with a stack, ready for `Fiber::prepare`.
    pub(crate) fn acquire(&self) -> io::Result<(Arc<Fiber>, FiberStack)> {
        let frame = self.pop_local().or_else(|| self.idle.pop());
        let frame = match frame {
            Some(frame) => frame,
            None => {
                let frame = Arc::new(Fiber::new());
                lock(&self.all).push(frame.clone());
                self.allocated.fetch_add(1, Ordering::Relaxed);
                frame
            }
        };
        // SAFETY: a frame popped from the pool (or just made) is INIT and
        // owned by us alone.
        let stack = match unsafe { frame.take_stack() } {
            Some(stack) => stack,
            None => match self.stacks.allocate() {
                Ok(stack) if stack.was_recycled() => stack,
                Ok(stack) => {
                    let counter = if stack.is_guarded() {
                        &self.guarded
                    } else {
                        &self.unguarded
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                    stack
                }
                Err(e) => {
                    self.idle.push(frame);
                    return Err(e);
                }
            },
        };
        self.in_use.fetch_add(1, Ordering::Relaxed);
        Ok((frame, stack))
    }

    /// Take back a frame whose fiber finished (DONE or CANCELLED).
    pub(crate) fn release(&self, frame: Arc<Fiber>) {
        frame.state.transition_to_init();
        self.in_use.fetch_sub(1, Ordering::Relaxed);
        if let Some(frame) = self.push_local(frame) {
            self.idle.push(frame);
        }
    }

    /// Give idle memory back: idle frames in the global queue beyond
    /// `IDLE_WATERMARK` (32) hand their stack's pages to the kernel
    /// (`MADV_DONTNEED`, guards stay), and frames beyond `IDLE_CAP` (1,024) are
    /// freed. Returns how many stacks gave their pages back. Safe at any
    /// time (it touches only idle frames). Not on the spawn or release
    /// path, so that a burst that repeats keeps its warm stacks: it is
    /// meant for a caller that sees the pool has gone quiet (a periodic
    /// monitor, or the program after a burst).
    pub fn trim(&self) -> usize {
        let mut kept = Vec::new();
        let mut retired = Vec::new();
        let mut stacks = Vec::new();
        for _ in 0..self.idle.len() {
            let Some(frame) = self.idle.pop() else { break };
            if kept.len() < IDLE_WATERMARK {
                kept.push(frame);
                continue;
            }
            // SAFETY: an idle frame is INIT and, popped, owned by us alone.
            if let Some(stack) = unsafe { frame.take_stack() } {
                stacks.push(stack);
            }
            if kept.len() < IDLE_CAP {
                kept.push(frame);
            } else {
                retired.push(frame);
            }
        }
        kept.into_iter().for_each(|frame| self.idle.push(frame));
        let released = stacks.len();
        self.stacks.recycle_many(stacks);
        if !retired.is_empty() {
            let gone: std::collections::HashSet<*const Fiber> = retired.iter().map(Arc::as_ptr).collect();
            lock(&self.all).retain(|frame| !gone.contains(&Arc::as_ptr(frame)));
        }
        released
    }

    fn pop_local(&self) -> Option<Arc<Fiber>> {
        CACHE
            .try_with(|c| {
                let mut cache = c.borrow_mut();
                if cache.pool == self.id {
                    cache.frames.pop()
                } else {
                    None
                }
            })
            .ok()
            .flatten()
    }

    fn push_local(&self, frame: Arc<Fiber>) -> Option<Arc<Fiber>> {
        let mut frame = Some(frame);
        let _ = CACHE.try_with(|c| {
            let mut cache = c.borrow_mut();
            if cache.pool == self.id && cache.frames.len() < LOCAL_CACHE {
                cache.frames.push(frame.take().expect("frame is present"));
            }
        });
        frame
    }

    /// Counters at this instant.
    pub fn stats(&self) -> PoolStats {
        PoolStats {
            allocated: self.allocated.load(Ordering::Relaxed),
            in_use: self.in_use.load(Ordering::Relaxed),
            guarded_stacks: self.guarded.load(Ordering::Relaxed),
            unguarded_stacks: self.unguarded.load(Ordering::Relaxed),
        }
    }

    /// Frames currently idle in the global queue (thread caches not counted).
    pub fn idle_in_global(&self) -> usize {
        self.idle.len()
    }

    /// The fibers parked right now (a racy snapshot, for diagnostics such
    /// as deadlock reports).
    pub fn parked_fibers(&self) -> Vec<ParkedFiber> {
        let all = lock(&self.all).clone();
        all.iter()
            .filter(|f| f.state.load(Ordering::Relaxed).state() == crate::state::FiberState::Parked)
            .map(|f| ParkedFiber {
                id: f.id(),
                waiting_on: f.waiting_on().unwrap_or("(nothing recorded)"),
                spawned_at: f.spawned_at(),
            })
            .collect()
    }

    /// Shutdown: unwind every PARKED fiber of this pool on the calling
    /// thread (running its destructors exactly once, completing its join
    /// with `Cancelled`) and return its frame to the pool. Returns how many
    /// fibers were unwound. Call only after every worker has stopped, so no
    /// fiber is RUNNABLE or RUNNING.
    pub fn unwind_parked(&self) -> usize {
        let all = lock(&self.all).clone();
        let mut unwound = 0;
        for frame in &all {
            let seen = frame.state.load(Ordering::Acquire);
            if seen.state() != crate::state::FiberState::Parked {
                continue;
            }
            if frame.state.wake(seen.ticket()) != crate::state::Claim::Claimed {
                continue;
            }
            Fiber::discard(frame.clone(), self);
            unwound += 1;
        }
        unwound
    }
}

impl fmt::Debug for FramePool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FramePool")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}
