//! Runs one scenario on plain threads, on fiber-core's deterministic test
//! scheduler (FIFO and seeded random order) and on fiber-sched with two
//! workers; spawns fibers or threads to match.

#![allow(dead_code)]

use fiber_core::testing::TestScheduler;
use fiber_sched::Runtime;
use std::time::Duration;

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
            // A fiber must not block its worker on a thread join: the
            // fibers queued on that worker would wait with it.
            Handle::Thread(h) if fiber_core::in_fiber() => {
                fiber_sched::blocking(|| h.join()).unwrap_or_else(|e| std::panic::resume_unwind(e))
            }
            Handle::Thread(h) => h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)),
        }
    }
}

/// Join every handle, fibers first (they park), then threads: a fiber
/// that blocks its worker on a thread join early could strand fibers
/// queued behind it on that worker.
pub fn join_all<T: Send + 'static>(handles: Vec<Handle<T>>) -> Vec<T> {
    let mut out: Vec<Option<T>> = handles.iter().map(|_| None).collect();
    let mut threads = Vec::new();
    for (i, h) in handles.into_iter().enumerate() {
        match h {
            Handle::Fiber(_) => out[i] = Some(h.join()),
            Handle::Thread(_) => threads.push((i, h)),
        }
    }
    for (i, h) in threads {
        out[i] = Some(h.join());
    }
    out.into_iter().map(|v| v.expect("joined")).collect()
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
    within(scenario);
    within(move || TestScheduler::new().block_on(scenario));
    within(move || TestScheduler::with_seed(0x5EED).block_on(scenario));
    within(move || runtime().block_on(scenario));
}

/// Run `scenario` on the two schedulers only (it needs fibers).
pub fn on_schedulers(scenario: fn()) {
    within(move || TestScheduler::new().block_on(scenario));
    within(move || TestScheduler::with_seed(0xC0FFEE).block_on(scenario));
    within(move || runtime().block_on(scenario));
}

/// A fiber-sched runtime with two workers.
pub fn runtime() -> Runtime {
    Runtime::builder().workers(2).build().unwrap()
}

/// Hang detection only: a scenario that does not finish within this is a
/// deadlock (generous for a loaded 2-core machine).
pub const HANG: Duration = Duration::from_secs(120);

/// Run `f` on a helper thread; panic if it does not return within
/// [`HANG`], re-raise its panic.
pub fn within<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        let _ = tx.send(());
        r
    });
    if rx.recv_timeout(HANG).is_err() {
        panic!("scenario did not finish within {HANG:?}: deadlock");
    }
    match t.join().unwrap() {
        Ok(v) => v,
        Err(p) => std::panic::resume_unwind(p),
    }
}

/// Wait (yielding) until `cond` holds: used to let other parties park
/// before acting, without sleeping.
pub fn until(mut cond: impl FnMut() -> bool) {
    while !cond() {
        if fiber_core::in_fiber() {
            let _ = fiber_core::yield_now();
        } else {
            std::thread::yield_now();
        }
    }
}
