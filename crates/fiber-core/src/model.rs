//! Loom-only stand-ins for a fiber, so that models of the layers above can
//! run their production cancellation code against fiber-core's production
//! handshake (`enter_parking` / `wait_to_interrupt`). Compiled only under
//! `--cfg loom`.

use crate::state::{Actor, Claim, Commit, StateWord};
use crate::sync::{Arc, AtomicUsize, Ordering};

/// A fiber as a model sees it: its state word and how often a waker claimed
/// it (each claim is one enqueue).
#[derive(Debug)]
pub struct ModelFiber {
    state: StateWord,
    id: u64,
    enqueues: AtomicUsize,
}

impl ModelFiber {
    /// A RUNNING fiber with id `id`.
    pub fn running(id: u64) -> Arc<ModelFiber> {
        let state = StateWord::new();
        state.transition_to_runnable_from_init();
        state.transition_to_running();
        Arc::new(ModelFiber {
            state,
            id,
            enqueues: AtomicUsize::new(0),
        })
    }

    /// The fiber's id (as `FiberRef::id`).
    pub fn id(&self) -> crate::FiberIdModel {
        crate::FiberIdModel(self.id)
    }

    /// `FiberRef::interrupt`: the production canceller's half.
    pub fn interrupt(&self) {
        if let Some(ticket) = crate::wait::wait_to_interrupt(&self.state) {
            if self.state.wake(ticket) == Claim::Claimed {
                self.enqueues.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// A cancellable park, as `fiber_wait` does it: the production parker's
    /// half, then the worker's commit. Returns whether the fiber parked (or
    /// `false`: it saw the cancellation, or a wake aborted the commit).
    pub fn park_unless(&self, cancelled: impl FnOnce() -> bool) -> bool {
        if crate::wait::enter_parking(&self.state, true, cancelled).is_none() {
            return false;
        }
        self.state.transition_to_parked(Actor::Worker) == Commit::Parked
    }

    /// Is the fiber still PARKED (no waker has claimed it)? A waker that
    /// claimed it has moved it on (to WAKING) before it counts the
    /// enqueue.
    pub fn is_parked(&self) -> bool {
        // Acquire: pairs with a waker's claiming CAS.
        self.state.load(Ordering::Acquire).state() == crate::state::FiberState::Parked
    }

    /// Claims won by wakers (enqueues).
    pub fn enqueues(&self) -> usize {
        self.enqueues.load(Ordering::Relaxed)
    }
}
