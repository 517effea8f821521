//! No runnable fiber waits behind a busy worker (spec/sched.md, "runnext"):
//! a fiber left in the runnext slot of a worker that then runs without a
//! yield point is taken by another worker within the monitor's stuck
//! threshold, with growth off and on.

use fiber::chan;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn runtime(max_workers: usize) -> fiber::Runtime {
    fiber::Runtime::builder()
        .workers(2)
        .max_workers(max_workers)
        .build()
        .unwrap()
}

fn child_runs_while_its_parent_spins(max_workers: usize) {
    let rt = runtime(max_workers);
    let ran = rt.block_on(|| {
        fiber::spawn(|| {
            let flag = Arc::new(AtomicBool::new(false));
            let f = flag.clone();
            // Lands in this worker's runnext slot...
            let _child = fiber::spawn(move || f.store(true, Ordering::Release));
            // ...and this fiber never yields while it waits for it.
            let deadline = Instant::now() + Duration::from_secs(20);
            while !flag.load(Ordering::Acquire) {
                if Instant::now() > deadline {
                    return false;
                }
                std::hint::spin_loop();
            }
            true
        })
        .join()
        .unwrap()
    });
    assert!(ran, "the child never ran (max_workers {max_workers})");
}

#[test]
fn a_child_in_runnext_runs_while_its_parent_spins_growth_off() {
    child_runs_while_its_parent_spins(2);
}

#[test]
fn a_child_in_runnext_runs_while_its_parent_spins_growth_on() {
    child_runs_while_its_parent_spins(4);
}

fn woken_fiber_starts_while_its_waker_computes(max_workers: usize) {
    let rt = runtime(max_workers);
    let (received_at, sender_done_at) = rt.block_on(|| {
        let (tx, rx) = chan::bounded::<u8>(0);
        let (ready_tx, ready_rx) = chan::bounded::<()>(1);
        let receiver = fiber::spawn(move || {
            ready_tx.send(()).unwrap();
            rx.recv().unwrap();
            Instant::now()
        });
        // The receiver is parked in `recv` before the sender starts, so the
        // sender's send wakes it into the sender's worker.
        ready_rx.recv().unwrap();
        let _ = fiber::sleep(Duration::from_millis(20));
        let sender = fiber::spawn(move || {
            tx.send(1).unwrap();
            // Computes for 1.5 s without a yield point.
            let start = Instant::now();
            while start.elapsed() < Duration::from_millis(1500) {
                std::hint::spin_loop();
            }
            Instant::now()
        });
        (receiver.join().unwrap(), sender.join().unwrap())
    });
    assert!(
        received_at + Duration::from_millis(500) < sender_done_at,
        "the woken fiber waited for its waker's computation (max_workers {max_workers})"
    );
}

#[test]
fn a_woken_fiber_starts_while_its_waker_computes_growth_off() {
    woken_fiber_starts_while_its_waker_computes(2);
}

#[test]
fn a_woken_fiber_starts_while_its_waker_computes_growth_on() {
    woken_fiber_starts_while_its_waker_computes(4);
}

#[test]
fn timers_of_waits_that_ended_early_do_not_accumulate() {
    let rt = runtime(2);
    let pending = rt.block_on(|| {
        let (tx, rx) = chan::bounded::<u32>(1);
        for i in 0..100_000u32 {
            tx.send(i).unwrap();
            // Completes at once; its one-hour timer is dead from here on.
            assert_eq!(rx.recv_timeout(Duration::from_secs(3600)).unwrap(), i);
            // A receive that has to park, so a timer is really armed.
            if i % 2 == 0 {
                let tx = tx.clone();
                fiber::spawn(move || tx.send(u32::MAX).unwrap());
                assert_eq!(rx.recv_timeout(Duration::from_secs(3600)).unwrap(), u32::MAX);
            }
        }
        fiber::stats().runtime.timers_pending
    });
    assert!(
        pending <= 4096,
        "{pending} timers pending after 100,000 early-ended waits"
    );
}
