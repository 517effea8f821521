//! The contract on real OS threads: a minimal multi-worker scheduler (one
//! shared FIFO, N workers) written against `Schedule` alone, used to force
//! fiber migration between workers (PITFALLS 1).

use super::Event;
use crate::pool::FramePool;
use crate::sched::{Runnable, Schedule};
use crate::stack::StackConfig;
use crate::{current_worker, fiber_wait, spawn_on, yield_now, RunOutcome, WaitOptions, WaitResult, Waiter};
use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

struct SharedQueue {
    queue: Mutex<VecDeque<Runnable>>,
    ready: Condvar,
    stop: AtomicBool,
    pool: FramePool,
}

impl Schedule for SharedQueue {
    fn schedule(&self, fiber: Runnable) {
        self.queue.lock().unwrap().push_back(fiber);
        self.ready.notify_one();
    }

    fn wake_at(&self, _: Instant, _: Waiter) {
        panic!("this test scheduler has no timers");
    }

    fn frames(&self) -> &FramePool {
        &self.pool
    }
}

thread_local! {
    static WORKER: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// Read the worker id through a non-inlined accessor, as runtime code must.
#[inline(never)]
fn worker_of_this_thread() -> usize {
    WORKER.with(|w| w.get())
}

fn worker_loop(sched: Arc<SharedQueue>, index: usize) {
    WORKER.with(|w| w.set(index));
    loop {
        let next = {
            let mut queue = sched.queue.lock().unwrap();
            loop {
                if let Some(fiber) = queue.pop_front() {
                    break Some(fiber);
                }
                if sched.stop.load(Ordering::Acquire) {
                    break None;
                }
                queue = sched.ready.wait(queue).unwrap();
            }
        };
        let Some(fiber) = next else { return };
        if let RunOutcome::Yielded(fiber) = fiber.into_running().resume(index) {
            sched.schedule(fiber);
        }
    }
}

#[test]
fn fibers_migrate_between_workers_and_see_the_right_worker() {
    const FIBERS: usize = 200;
    const ROUNDS: usize = 50;
    const WORKERS: usize = 3;
    let sched = Arc::new(SharedQueue {
        queue: Mutex::new(VecDeque::new()),
        ready: Condvar::new(),
        stop: AtomicBool::new(false),
        pool: FramePool::new(StackConfig::default()),
    });
    let workers: Vec<_> = (0..WORKERS)
        .map(|i| {
            let sched = sched.clone();
            std::thread::spawn(move || worker_loop(sched, i))
        })
        .collect();
    let dyn_sched: Arc<dyn Schedule> = sched.clone();
    let events: Arc<Vec<Vec<Event>>> = Arc::new(
        (0..FIBERS)
            .map(|_| (0..ROUNDS).map(|_| Event::default()).collect())
            .collect(),
    );
    let migrations = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..FIBERS)
        .map(|f| {
            let (events, migrations) = (events.clone(), migrations.clone());
            spawn_on(&dyn_sched, move || {
                let mut last = worker_of_this_thread();
                for round in 0..ROUNDS {
                    assert_eq!(
                        fiber_wait(&events[f][round], &mut (), WaitOptions::new()),
                        WaitResult::Ok
                    );
                    let now = worker_of_this_thread();
                    assert_eq!(
                        Some(now),
                        current_worker(),
                        "the thread-local seen after resume is the resuming worker's"
                    );
                    if now != last {
                        migrations.fetch_add(1, Ordering::Relaxed);
                    }
                    last = now;
                    let _ = yield_now();
                    assert_eq!(Some(worker_of_this_thread()), current_worker());
                }
                f
            })
        })
        .collect();
    let wakers: Vec<_> = (0..2)
        .map(|w| {
            let events = events.clone();
            std::thread::spawn(move || {
                for round in 0..ROUNDS {
                    for f in (w..FIBERS).step_by(2) {
                        events[f][round].set();
                    }
                }
            })
        })
        .collect();
    for w in wakers {
        w.join().unwrap();
    }
    for (i, h) in handles.into_iter().enumerate() {
        assert_eq!(h.join().unwrap(), i);
    }
    {
        // Under the queue lock: a worker checks `stop` under it before it
        // waits, so the store cannot fall between its check and its wait
        // (set without the lock, the notification could come first and a
        // worker then waited for ever; seen once in a CI run).
        let _queue = sched.queue.lock().unwrap();
        sched.stop.store(true, Ordering::Release);
    }
    sched.ready.notify_all();
    for w in workers {
        w.join().unwrap();
    }
    assert!(
        migrations.load(Ordering::Relaxed) > 0,
        "with {WORKERS} workers some fiber must have migrated"
    );
    assert_eq!(sched.pool.stats().in_use, 0);
    assert_eq!(sched.pool.idle_in_global(), sched.pool.stats().allocated);
}
