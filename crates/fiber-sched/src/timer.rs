//! Timers: deadlines of `fiber_wait` and `sleep`.
//!
//! One min-heap under a lock (O(log n) per insert and expiry, whatever the
//! number of sleepers), drained by the monitor thread at each deadline and by
//! idle workers before they sleep. An entry whose wait ended early (a
//! `recv_timeout(1h)` that completed at once) is dead: it would wake nobody
//! (its ticket is stale). Dead entries are purged in bulk whenever the heap
//! has doubled since the last purge, so at most about as many dead entries
//! as live ones are kept, at O(1) amortized cost per insert.

use crate::sync::{lock, AtomicU64, Mutex, Ordering};
use fiber_core::{fiber_wake, Waiter};
use std::cmp::Ordering as CmpOrdering;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

/// Timers fired per drain call, so one drain stays bounded.
pub(crate) const FIRE_BATCH: usize = 4096;

struct Entry {
    deadline: Instant,
    seq: u64,
    waiter: Waiter,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        (self.deadline, self.seq) == (other.deadline, other.seq)
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    fn cmp(&self, other: &Self) -> CmpOrdering {
        (other.deadline, other.seq).cmp(&(self.deadline, self.seq))
    }
}

struct Heap {
    entries: BinaryHeap<Entry>,
    seq: u64,
    /// Entries left by the last purge (the next purge runs at twice this).
    after_purge: usize,
}

/// Below this many entries the heap is never purged.
const PURGE_FLOOR: usize = 1024;

/// The timer structure of one runtime.
pub(crate) struct Timers {
    heap: Mutex<Heap>,
    base: Instant,
    /// Earliest deadline as nanoseconds after `base`; `u64::MAX` when empty.
    /// Relaxed: a hint for sleepers; the heap under its lock is the truth.
    next: AtomicU64,
}

impl Timers {
    pub(crate) fn new() -> Timers {
        Timers {
            heap: Mutex::new(Heap {
                entries: BinaryHeap::new(),
                seq: 0,
                after_purge: 0,
            }),
            base: Instant::now(),
            next: AtomicU64::new(u64::MAX),
        }
    }

    fn to_nanos(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.base)
            .as_nanos()
            .min(u64::MAX as u128 - 1) as u64
    }

    /// Add a timer. Returns `true` if it is now the earliest.
    pub(crate) fn insert(&self, deadline: Instant, waiter: Waiter) -> bool {
        let mut heap = lock(&self.heap);
        heap.seq += 1;
        let seq = heap.seq;
        if heap.entries.len() >= PURGE_FLOOR.max(2 * heap.after_purge) {
            // Drop the entries whose wait already ended.
            heap.entries.retain(|e| !e.waiter.is_stale());
            heap.after_purge = heap.entries.len();
        }
        heap.entries.push(Entry { deadline, seq, waiter });
        let nanos = self.to_nanos(deadline);
        let earliest = nanos < self.next.load(Ordering::Relaxed);
        if earliest {
            self.next.store(nanos, Ordering::Relaxed);
        }
        earliest
    }

    /// The earliest pending deadline, if any.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        match self.next.load(Ordering::Relaxed) {
            u64::MAX => None,
            nanos => Some(self.base + Duration::from_nanos(nanos)),
        }
    }

    /// Is a timer due at `now`?
    pub(crate) fn is_due(&self, now: Instant) -> bool {
        self.next_deadline().is_some_and(|d| d <= now)
    }

    /// Fire up to [`FIRE_BATCH`] timers due at `now`; returns how many fired.
    pub(crate) fn fire_due(&self, now: Instant) -> usize {
        let mut due = Vec::new();
        {
            let mut heap = lock(&self.heap);
            while due.len() < FIRE_BATCH && heap.entries.peek().is_some_and(|e| e.deadline <= now) {
                due.push(heap.entries.pop().expect("peeked").waiter);
            }
            let next = heap.entries.peek().map_or(u64::MAX, |e| self.to_nanos(e.deadline));
            self.next.store(next, Ordering::Relaxed);
        }
        for waiter in &due {
            fiber_wake(waiter);
        }
        due.len()
    }

    /// Pending entries (including stale ones).
    pub(crate) fn len(&self) -> usize {
        lock(&self.heap).entries.len()
    }

    /// Drop every entry (shutdown).
    pub(crate) fn clear(&self) {
        lock(&self.heap).entries.clear();
        self.next.store(u64::MAX, Ordering::Relaxed);
    }
}

impl std::fmt::Debug for Timers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Timers").field("pending", &self.len()).finish()
    }
}
