//! Loom models of the timer handshakes (`timer.rs`), run by
//! `cargo xtask loom`. They run the production `Timers` (its wheels, locks,
//! `next` hints and the monitor's planned wake-up) with a test item in
//! place of a fiber's waiter.

use crate::timer::{Armed, Expire, Timers, GRACE_TICKS};
use loom::sync::Arc;
use loom::thread;

/// A timer's payload in the models: an id; never dead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Item(u32);

impl Expire for Item {
    fn is_dead(&self) -> bool {
        false
    }
}

/// The monitor plans to sleep until tick 100 while a thread arms a timer
/// due at tick 5: either the monitor's plan covers the new deadline (it
/// read the new `next` after its fence) or the armer is told to unpark it
/// (it read the plan after its fence). `wheel` is a worker's (with grace)
/// or `None` (the shared wheel).
fn monitor_plan_races_an_earlier_arm(wheel: Option<usize>) {
    loom::model(move || {
        let timers = Arc::new(Timers::<Item>::new(1));
        let armer = {
            let timers = timers.clone();
            thread::spawn(move || match timers.arm(wheel, 5, Item(1)) {
                Armed::Queued(unpark) => unpark,
                Armed::Due(_) => unreachable!("tick 5 is ahead of a fresh wheel"),
            })
        };
        let wake = timers.plan_monitor_sleep(100);
        let unpark = armer.join().unwrap();
        let grace = if wheel.is_some() { GRACE_TICKS } else { 0 };
        assert!(
            unpark || wake <= 5 + grace,
            "the monitor sleeps until tick {wake} past a deadline at tick 5 and nobody unparks it"
        );
    });
}

/// Removing the fence in `Timers::arm` or in `Timers::plan_monitor_sleep`
/// lets both sides miss each other: the monitor oversleeps the deadline.
#[test]
fn loom_monitor_plan_races_an_earlier_arm_in_a_worker_wheel() {
    monitor_plan_races_an_earlier_arm(Some(0));
}

/// The same handshake for the shared wheel (arms from outside the
/// workers), which has no grace.
#[test]
fn loom_monitor_plan_races_an_earlier_arm_in_the_shared_wheel() {
    monitor_plan_races_an_earlier_arm(None);
}

/// The owner arms two timers and fires its wheel while the monitor, seeing
/// the wheel due through its `next` hint, fires it too (the owner's fiber
/// is busy): every timer fires exactly once, and a last monitor pass (the
/// one the handshake above guarantees) finds whatever is still due.
#[test]
fn loom_owner_and_monitor_fire_one_wheel_exactly_once() {
    loom::model(|| {
        let timers = Arc::new(Timers::<Item>::new(1));
        let owner = {
            let timers = timers.clone();
            thread::spawn(move || {
                let mut fired = Vec::new();
                assert!(matches!(timers.arm(Some(0), 1, Item(1)), Armed::Queued(_)));
                timers.advance(Some(0), 1, &mut fired);
                match timers.arm(Some(0), 2, Item(2)) {
                    Armed::Queued(_) => {}
                    // The monitor advanced the clock to 2 first.
                    Armed::Due(item) => fired.push(item),
                }
                fired
            })
        };
        let mut fired = Vec::new();
        if timers.is_due(Some(0), 2) {
            timers.advance(Some(0), 2, &mut fired);
        }
        fired.extend(owner.join().unwrap());
        // The monitor's next pass.
        if timers.is_due(Some(0), 2) {
            timers.advance(Some(0), 2, &mut fired);
        }
        fired.sort_by_key(|i| i.0);
        assert_eq!(fired, vec![Item(1), Item(2)], "each timer fires exactly once");
        assert!(!timers.any_pending());
    });
}
