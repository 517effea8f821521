//! Runs one scenario on plain threads, on fiber-core's deterministic test
//! scheduler (FIFO and seeded random order) and on fiber-sched.

#![allow(dead_code)]

use fiber_core::testing::TestScheduler;
use fiber_sched::Runtime;

/// A spawned party: a fiber in a runtime, a thread outside one.
#[derive(Debug)]
pub enum Handle<T> {
    Fiber(fiber_core::JoinHandle<T>),
    Thread(std::thread::JoinHandle<T>),
}

impl<T: Send + 'static> Handle<T> {
    pub fn join(self) -> T {
        match self {
            Handle::Fiber(h) => h.join().unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic())),
            Handle::Thread(h) => h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)),
        }
    }
}

/// Spawn a fiber when running in one, else a thread.
pub fn go<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Handle<T> {
    if fiber_core::in_fiber() {
        Handle::Fiber(fiber_core::spawn(f))
    } else {
        Handle::Thread(std::thread::spawn(f))
    }
}

/// Spawn a plain OS thread whatever the caller is (mixed tests).
pub fn thread<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Handle<T> {
    Handle::Thread(std::thread::spawn(f))
}

/// Run `scenario` in every context.
pub fn everywhere(scenario: fn()) {
    scenario();
    TestScheduler::new().block_on(scenario);
    TestScheduler::with_seed(0x5EED).block_on(scenario);
    let rt = Runtime::builder().workers(2).build().unwrap();
    rt.block_on(scenario);
}

/// Run `scenario` on the two schedulers only (it needs fibers).
pub fn on_schedulers(scenario: fn()) {
    TestScheduler::new().block_on(scenario);
    TestScheduler::with_seed(0xC0FFEE).block_on(scenario);
    let rt = Runtime::builder().workers(2).build().unwrap();
    rt.block_on(scenario);
}

/// Wait (yielding) until `cond` holds: used to let other parties park
/// before acting, without sleeping.
pub fn until(mut cond: impl FnMut() -> bool) {
    while !cond() {
        let _ = fiber_core::yield_now();
    }
}
