//! A scoped child's value travels to its handle inside the child's job (one
//! allocation per child): small values inline, large ones boxed. Each value
//! is dropped exactly once, by whoever ends up with it, before the scope
//! returns; a handle leaked with `mem::forget` leaks its value instead of
//! dropping it after the scope. On both schedulers.

use fiber_core::testing::TestScheduler;
use fiber_jobs::*;
use std::sync::atomic::{AtomicUsize, Ordering};

fn on_both(scenario: fn()) {
    TestScheduler::new().block_on(scenario);
    TestScheduler::with_seed(0x5EED).block_on(scenario);
    let rt = fiber_sched::Runtime::builder().workers(2).build().unwrap();
    rt.block_on(scenario);
}

/// Counts its drops in a counter that lives on the scope owner's stack.
struct Counted<'a, const N: usize> {
    drops: &'a AtomicUsize,
    payload: [u64; N],
}

impl<const N: usize> Drop for Counted<'_, N> {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Ordering::SeqCst);
    }
}

fn each_path<const N: usize>() {
    let drops = AtomicUsize::new(0);
    let joined = scope(|s| {
        // Joined: the value reaches the handle intact.
        let joined = s.spawn(|| Counted::<N> {
            drops: &drops,
            payload: [7; N],
        });
        // Handle dropped before the child ends: the child drops its value.
        let (tx, rx) = fiber_chan::bounded::<()>(0);
        let drops_ref = &drops;
        let early = s.spawn(move || {
            let _ = rx.recv();
            Counted::<N> {
                drops: drops_ref,
                payload: [1; N],
            }
        });
        drop(early);
        drop(tx);
        // Handle dropped after the child ended: the handle drops it.
        let late = s.spawn(|| Counted::<N> {
            drops: &drops,
            payload: [2; N],
        });
        while !late.is_finished() {
            let _ = fiber_core::yield_now();
        }
        drop(late);
        joined.join().unwrap().payload
    });
    assert_eq!(joined, [7; N]);
    assert_eq!(drops.load(Ordering::SeqCst), 3, "each value dropped exactly once");
}

#[test]
fn small_and_large_values_reach_their_handles_and_drop_once() {
    on_both(|| {
        each_path::<1>();
        each_path::<3>();
        each_path::<64>();
    });
}

#[test]
fn a_forgotten_handle_leaks_its_value_instead_of_dropping_it_late() {
    on_both(|| {
        let drops = AtomicUsize::new(0);
        scope(|s| {
            for _ in 0..2 {
                let small = s.spawn(|| Counted::<1> {
                    drops: &drops,
                    payload: [0; 1],
                });
                let large = s.spawn(|| Counted::<64> {
                    drops: &drops,
                    payload: [0; 64],
                });
                while !(small.is_finished() && large.is_finished()) {
                    let _ = fiber_core::yield_now();
                }
                std::mem::forget(small);
                std::mem::forget(large);
            }
        });
        // The scope has ended: `drops` is still borrowed by nothing, and no
        // value was dropped after its scope (none was dropped at all).
        assert_eq!(drops.load(Ordering::SeqCst), 0);
    });
}

#[test]
fn a_panicking_child_and_a_cancelled_one_report_through_the_same_slot() {
    on_both(|| {
        let outcomes = supervisor_scope(|s| {
            let panicked = s.spawn(|| -> [u64; 16] { panic!("child boom") });
            let cancelled = s.spawn(|| {
                Job::current().cancel();
                [5u64; 16]
            });
            (panicked.join(), cancelled.join())
        });
        let (panicked, cancelled) = outcomes;
        assert!(panicked.unwrap_err().is_panic());
        assert!(cancelled.unwrap_err().is_cancelled());
    });
}
