//! A tour of what the runtime does today.
//!
//! `cargo run --release --example tour`
//!
//! The multi-worker scheduler, channels and jobs are still to come; this
//! tour runs on fiber-core's deterministic scheduler and shows the pieces
//! they stand on: fibers on real stacks, parking and waking across OS
//! threads, cancellation, panics captured for the joiner, and the frame
//! pool.

use fiber::core::testing::TestScheduler;
use fiber::core::{fiber_wait, fiber_wake, spawn, yield_now, Publish, WaitOptions, WaitResult, Waitable, Waiter};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A latch: waits complete once it is opened.
#[derive(Default)]
struct Latch(Mutex<(bool, Vec<Waiter>)>);

impl Waitable for Latch {
    type Io = ();
    fn try_complete(&self, _: &mut ()) -> Option<WaitResult> {
        self.0.lock().unwrap().0.then_some(WaitResult::Ok)
    }
    fn publish(&self, waiter: &Waiter, _: &mut ()) -> Publish {
        let mut latch = self.0.lock().unwrap();
        if latch.0 {
            return Publish::Ready(WaitResult::Ok);
        }
        latch.1.push(waiter.clone());
        Publish::Published
    }
    fn unpublish(&self, waiter: &Waiter, _: &mut ()) -> Option<WaitResult> {
        let mut latch = self.0.lock().unwrap();
        latch.1.retain(|w| !w.same_wait(waiter));
        latch.0.then_some(WaitResult::Ok)
    }
}

impl Latch {
    fn open(&self) -> usize {
        let waiters = {
            let mut latch = self.0.lock().unwrap();
            latch.0 = true;
            std::mem::take(&mut latch.1)
        };
        waiters.iter().filter(|w| fiber_wake(w)).count()
    }
}

fn main() {
    const FIBERS: u64 = 100_000;
    let sched = TestScheduler::new();

    // 1. 100,000 fibers that each yield once and return a number.
    let start = Instant::now();
    let sum = sched.block_on(|| {
        let handles: Vec<_> = (0..FIBERS)
            .map(|i| {
                spawn(move || {
                    yield_now();
                    i
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum::<u64>()
    });
    assert_eq!(sum, FIBERS * (FIBERS - 1) / 2);
    println!(
        "spawned, yielded and joined {FIBERS} fibers in {:?} (sum {sum})",
        start.elapsed()
    );

    // 2. Fibers parked on a latch, opened from another OS thread.
    let latch = Arc::new(Latch::default());
    let woken = Arc::new(AtomicU64::new(0));
    for _ in 0..1_000 {
        let (latch, woken) = (latch.clone(), woken.clone());
        sched.spawn(move || {
            assert_eq!(fiber_wait(&*latch, &mut (), WaitOptions::new()), WaitResult::Ok);
            woken.fetch_add(1, Ordering::Relaxed);
        });
    }
    sched.run_until_idle();
    let opener = {
        let latch = latch.clone();
        std::thread::spawn(move || latch.open())
    };
    sched.run();
    println!(
        "1000 fibers parked; another thread opened the latch and claimed {} of them; {} resumed",
        opener.join().unwrap(),
        woken.load(Ordering::Relaxed)
    );

    // 3. A deadline on virtual time, a cancellation, and a captured panic.
    let never = Arc::new(Latch::default());
    let scheduler = sched.scheduler();
    let waiting = never.clone();
    let timed = sched.spawn(move || {
        let deadline = scheduler.now() + Duration::from_millis(500);
        fiber_wait(&*waiting, &mut (), WaitOptions::new().deadline(Some(deadline)))
    });
    let waiting = never.clone();
    let cancelled = sched.spawn(move || fiber_wait(&*waiting, &mut (), WaitOptions::new()));
    let panicked = sched.spawn(|| -> u32 { panic!("this fiber fails on purpose") });
    sched.run_until_idle();
    cancelled.cancel();
    sched.run();
    println!("a wait with a 500 ms deadline ended {:?}", timed.join().unwrap());
    println!("a cancelled fiber: {}", cancelled.join().unwrap_err());
    println!("a panicking fiber: {}", panicked.join().unwrap_err());

    let stats = sched.pool_stats();
    println!(
        "frame pool: {} frames allocated, {} in use, {} guarded stacks, {} unguarded",
        stats.allocated, stats.in_use, stats.guarded_stacks, stats.unguarded_stacks
    );
    assert_eq!(stats.in_use, 0);
}
