//! Park/wake on real stacks, on the deterministic test scheduler and on a
//! minimal multi-threaded scheduler written here (the contract is all a
//! scheduler needs).

#[cfg(loom)]
mod loom_park;

#[cfg(loom)]
mod loom_commit_stack;

#[cfg(not(loom))]
mod overflow;
#[cfg(not(loom))]
mod park_wake;
#[cfg(not(loom))]
mod sched_threads;

#[cfg(not(loom))]
pub(crate) use event::Event;

#[cfg(not(loom))]
mod event {
    use crate::{fiber_wake, Publish, WaitResult, Waitable, Waiter};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    /// A one-shot event: `set` completes every present and future wait.
    #[derive(Default)]
    pub(crate) struct Event {
        pub(crate) state: Mutex<EventState>,
        pub(crate) publishes: AtomicUsize,
    }

    #[derive(Default)]
    pub(crate) struct EventState {
        pub(crate) set: bool,
        pub(crate) waiters: Vec<Waiter>,
    }

    impl Event {
        pub(crate) fn set(&self) -> usize {
            let waiters = {
                let mut state = self.state.lock().unwrap();
                state.set = true;
                std::mem::take(&mut state.waiters)
            };
            waiters.iter().filter(|w| fiber_wake(w)).count()
        }

        /// The waiter records currently published (for stale-ticket tests).
        pub(crate) fn records(&self) -> Vec<Waiter> {
            self.state.lock().unwrap().waiters.clone()
        }
    }

    impl Waitable for Event {
        type Io = ();

        fn try_complete(&self, _: &mut ()) -> Option<WaitResult> {
            self.state.lock().unwrap().set.then_some(WaitResult::Ok)
        }

        fn publish(&self, waiter: &Waiter, _: &mut ()) -> Publish {
            let mut state = self.state.lock().unwrap();
            if state.set {
                return Publish::Ready(WaitResult::Ok);
            }
            self.publishes.fetch_add(1, Ordering::Relaxed);
            state.waiters.push(waiter.clone());
            Publish::Published
        }

        fn unpublish(&self, waiter: &Waiter, _: &mut ()) -> Option<WaitResult> {
            let mut state = self.state.lock().unwrap();
            state.waiters.retain(|w| !w.same_wait(waiter));
            state.set.then_some(WaitResult::Ok)
        }
    }
}
