//! fiber-core switch costs, with a bare corosensei switch as the floor.
//!
//! * `switch/corosensei::resume_suspend`: a bare coroutine resume + suspend.
//! * `switch/fiber_core::yield`: a fiber yields and its worker resumes it
//!   (resume + suspend + RUNNING <-> RUNNABLE transitions).
//! * `switch/fiber_core::park_wake`: a fiber parks on a waitable and is woken
//!   through `fiber_wake` (ticket claim, schedule) and resumed, all on one
//!   thread, so the number is the protocol's cost without cross-core traffic.

use criterion::{criterion_group, criterion_main, Criterion};
use fiber_core::{
    fiber_wait, fiber_wake, spawn_on, yield_now, FramePool, Publish, RunOutcome, Runnable, Schedule, StackConfig,
    WaitOptions, WaitResult, Waitable, Waiter,
};
use std::cell::Cell;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A scheduler with one slot: the bench thread is its only worker.
struct Slot {
    next: Mutex<Option<Runnable>>,
    pool: FramePool,
}

impl Schedule for Slot {
    fn schedule(&self, fiber: Runnable) {
        let previous = self.next.lock().unwrap().replace(fiber);
        assert!(previous.is_none(), "one fiber at a time in this bench");
    }
    fn wake_at(&self, _: Instant, _: Waiter) {
        unreachable!("no timers in this bench")
    }
    fn frames(&self) -> &FramePool {
        &self.pool
    }
}

impl Slot {
    fn new() -> Arc<Slot> {
        Arc::new(Slot {
            next: Mutex::new(None),
            pool: FramePool::new(StackConfig::default()),
        })
    }
    fn take(&self) -> Runnable {
        self.next.lock().unwrap().take().expect("a runnable fiber")
    }
}

/// A flag the fiber waits for; the bench thread sets it and wakes the fiber.
#[derive(Default)]
struct Flag {
    set: AtomicBool,
    waiter: Mutex<Option<Waiter>>,
}

impl Waitable for Flag {
    type Io = ();
    fn try_complete(&self, _: &mut ()) -> Option<WaitResult> {
        self.set.swap(false, Ordering::Acquire).then_some(WaitResult::Ok)
    }
    fn publish(&self, waiter: &Waiter, _: &mut ()) -> Publish {
        let mut slot = self.waiter.lock().unwrap();
        if self.set.swap(false, Ordering::Acquire) {
            return Publish::Ready(WaitResult::Ok);
        }
        *slot = Some(waiter.clone());
        Publish::Published
    }
    fn unpublish(&self, _: &Waiter, _: &mut ()) -> Option<WaitResult> {
        let mut slot = self.waiter.lock().unwrap();
        let still_published = slot.take().is_some();
        (!still_published || self.set.swap(false, Ordering::Acquire)).then_some(WaitResult::Ok)
    }
}

impl Flag {
    fn set_and_wake(&self) {
        let waiter = {
            let mut slot = self.waiter.lock().unwrap();
            self.set.store(true, Ordering::Release);
            slot.take()
        };
        if let Some(w) = waiter {
            self.set.store(false, Ordering::Relaxed);
            fiber_wake(&w);
        }
    }
}

fn bench_switch(c: &mut Criterion) {
    let mut group = c.benchmark_group("switch");

    group.bench_function("corosensei::resume_suspend", |b| {
        let mut co = corosensei::Coroutine::new(|yielder: &corosensei::Yielder<(), ()>, ()| loop {
            yielder.suspend(());
        });
        b.iter(|| black_box(co.resume(())));
    });

    group.bench_function("fiber_core::yield", |b| {
        b.iter_custom(|iters| {
            let sched = Slot::new();
            let dyn_sched: Arc<dyn Schedule> = sched.clone();
            let handle = spawn_on(&dyn_sched, move || {
                for _ in 0..iters {
                    let _ = yield_now();
                }
            });
            let start = Instant::now();
            let mut runnable = sched.take();
            loop {
                match runnable.into_running().resume(0) {
                    RunOutcome::Yielded(next) => runnable = next,
                    RunOutcome::Finished => break,
                    RunOutcome::Parked => unreachable!(),
                }
            }
            let elapsed = start.elapsed();
            handle.join().unwrap();
            elapsed
        });
    });

    group.bench_function("fiber_core::park_wake", |b| {
        b.iter_custom(|iters| {
            let sched = Slot::new();
            let dyn_sched: Arc<dyn Schedule> = sched.clone();
            let flag = Arc::new(Flag::default());
            let waiting = flag.clone();
            let handle = spawn_on(&dyn_sched, move || {
                for _ in 0..iters {
                    assert_eq!(fiber_wait(&*waiting, &mut (), WaitOptions::new()), WaitResult::Ok);
                }
            });
            let parks = Cell::new(0u64);
            let start = Instant::now();
            let mut runnable = sched.take();
            loop {
                match runnable.into_running().resume(0) {
                    RunOutcome::Parked => {
                        parks.set(parks.get() + 1);
                        flag.set_and_wake();
                        runnable = sched.take();
                    }
                    RunOutcome::Finished => break,
                    RunOutcome::Yielded(_) => unreachable!(),
                }
            }
            let elapsed = start.elapsed();
            handle.join().unwrap();
            assert_eq!(parks.get(), iters, "every iteration parked and was woken");
            elapsed
        });
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = bench_switch
}
criterion_main!(benches);
