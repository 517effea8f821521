//! Admission of spawns from outside a runtime against its teardown
//! (`FramePool::admit_spawn`), on its own so that loom can model it.

use crate::sync::{fence, AtomicU8, AtomicUsize, Ordering};

/// Admission of spawns from outside the runtime (a plain thread's
/// `Handle::spawn`) against teardown. A spawn that found the pool open
/// schedules its fiber after the check; if teardown's last look at the
/// queues came in between, the fiber sat in a queue nobody drains and its
/// join never returned (two threads spawning while the runtime was
/// dropped: a hang within a few hundred rounds). A Dekker pair:
///
/// * spawn (`enter`): increment `in_flight`; `fence(SeqCst)`; read the
///   phase; refused (and decremented) unless open. Admitted, it
///   decrements (`leave`, Release) only after its fiber is scheduled.
/// * teardown (`wait_for_admitted`): the phase is stored first;
///   `fence(SeqCst)`; then it reads `in_flight` (Acquire) until zero,
///   before its first drain.
///
/// With the two fences at least one side sees the other's write: either
/// the spawn sees the phase and is refused, or teardown sees it in flight
/// and waits until its fiber is in a queue that teardown then drains.
/// (SeqCst loads and stores alone, without the fences, were not enough
/// for loom, which models SeqCst accesses as acquire/release.)
/// Loom: `tests/loom_park.rs::loom_spawn_admission_racing_teardown`.
pub(crate) struct SpawnGate {
    in_flight: AtomicUsize,
}

impl SpawnGate {
    pub(crate) fn new() -> SpawnGate {
        SpawnGate {
            in_flight: AtomicUsize::new(0),
        }
    }

    /// Admit a spawn if `phase` still reads `open`.
    pub(crate) fn enter(&self, phase: &AtomicU8, open: u8) -> bool {
        // Relaxed increment, then the fence: pairs with the fence in
        // `wait_for_admitted` (teardown: phase stored; fence; count read).
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if phase.load(Ordering::Relaxed) == open {
            return true;
        }
        self.leave();
        false
    }

    /// An admitted spawn has scheduled its fiber (or failed).
    pub(crate) fn leave(&self) {
        // Release: the fiber's enqueue happens before teardown's Acquire
        // read of the count that this brings to zero.
        self.in_flight.fetch_sub(1, Ordering::Release);
    }

    /// Teardown, after storing its phase: wait until every admitted spawn
    /// has scheduled its fiber. Each holds the gate for an acquire, a
    /// prepare and an enqueue: no wait inside.
    pub(crate) fn wait_for_admitted(&self) {
        // Pairs with the fence in `enter` (the phase was stored before).
        fence(Ordering::SeqCst);
        // Acquire: pairs with `leave`'s Release.
        while self.in_flight.load(Ordering::Acquire) != 0 {
            crate::sync::yield_now();
        }
    }
}
