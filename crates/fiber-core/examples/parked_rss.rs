//! Resident memory per parked fiber: spawn N fibers that each park on a
//! waitable, read the peak RSS, then wake them all.
//!
//! `cargo run --release -p fiber-core --example parked_rss [N]`

use fiber_core::testing::TestScheduler;
use fiber_core::{fiber_wait, fiber_wake, Publish, WaitOptions, WaitResult, Waitable, Waiter};
use std::sync::{Arc, Mutex};

/// A one-slot mailbox per fiber, so each parked fiber holds its own state.
#[derive(Default)]
struct Slot(Mutex<(Option<u64>, Option<Waiter>)>);

impl Waitable for Slot {
    type Io = Option<u64>;
    fn try_complete(&self, io: &mut Option<u64>) -> Option<WaitResult> {
        let mut slot = self.0.lock().unwrap();
        slot.0.take().map(|v| {
            *io = Some(v);
            WaitResult::Ok
        })
    }
    fn publish(&self, waiter: &Waiter, io: &mut Option<u64>) -> Publish {
        let mut slot = self.0.lock().unwrap();
        if let Some(v) = slot.0.take() {
            *io = Some(v);
            return Publish::Ready(WaitResult::Ok);
        }
        slot.1 = Some(waiter.clone());
        Publish::Published
    }
    fn unpublish(&self, _: &Waiter, io: &mut Option<u64>) -> Option<WaitResult> {
        let mut slot = self.0.lock().unwrap();
        slot.1 = None;
        slot.0.take().map(|v| {
            *io = Some(v);
            WaitResult::Ok
        })
    }
}

fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"))
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("N must be a number"))
        .unwrap_or(100_000);
    let sched = TestScheduler::new();
    let slots: Arc<Vec<Slot>> = Arc::new((0..n).map(|_| Slot::default()).collect());
    let baseline = status_kib("VmRSS:");
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let slots = slots.clone();
            sched.spawn(move || {
                let mut value = None;
                assert_eq!(fiber_wait(&slots[i], &mut value, WaitOptions::new()), WaitResult::Ok);
                value.expect("a value was handed over")
            })
        })
        .collect();
    sched.run_until_idle();
    let peak = status_kib("VmHWM:");
    let stats = sched.pool_stats();
    for (i, slot) in slots.iter().enumerate() {
        let waiter = {
            let mut s = slot.0.lock().unwrap();
            s.0 = Some(i as u64);
            s.1.take()
        };
        if let Some(w) = waiter {
            fiber_wake(&w);
        }
    }
    sched.run();
    let sum: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    let expected = (n as u64) * (n as u64 - 1) / 2;
    if sum != expected {
        eprintln!("CHECK FAILED: sum {sum} != {expected}");
        std::process::exit(1);
    }
    let per_fiber = (peak.saturating_sub(baseline)) as f64 / n as f64;
    println!(
        "parked fibers: {n}; stacks guarded/unguarded: {}/{}; peak RSS - baseline = {} KiB; {per_fiber:.2} KiB per parked fiber",
        stats.guarded_stacks,
        stats.unguarded_stacks,
        peak.saturating_sub(baseline)
    );
}
