//! Fiber stacks at skynet scale: every stack guarded on default limits.

#![cfg(not(loom))]

use fiber_core::testing::TestScheduler;
use fiber_core::{spawn, StackConfig};

/// Skynet: a tree of fibers, ten children per node, each leaf returning its
/// number and each node the sum of its children.
fn skynet(num: u64, size: u64) -> u64 {
    if size == 1 {
        return num;
    }
    let div = size / 10;
    let children: Vec<_> = (0..10).map(|i| spawn(move || skynet(num + i * div, div))).collect();
    children.into_iter().map(|c| c.join().unwrap()).sum()
}

#[test]
fn skynet_scale_spawns_are_all_guarded() {
    if !fiber_core::stack::page_table_guards_supported() {
        // Before Linux 6.13 the default policy refuses stacks past the
        // mapping budget, so a run this large cannot be all guarded.
        eprintln!("skipped: this kernel has no MADV_GUARD_INSTALL");
        return;
    }
    let sched = TestScheduler::with_stacks(StackConfig {
        size: 32 * 1024,
        ..StackConfig::default()
    });
    // The root (1) runs its ten subtrees (111,111 fibers each) one after the
    // other: 1,111,111 fibers in all, about 111,000 live at the peak (the
    // scheduler runs breadth-first), well past the 28,600 stacks the
    // default vm.max_map_count allowed guard pages for.
    let sum = sched.block_on(|| {
        (0..10u64)
            .map(|i| spawn(move || skynet(i * 100_000, 100_000)).join().unwrap())
            .sum::<u64>()
    });
    assert_eq!(sum, 499_999_500_000);
    let stats = sched.pool_stats();
    assert_eq!(stats.in_use, 0, "{stats:?}");
    assert!(stats.allocated > 100_000, "the peak was past the old budget: {stats:?}");
    assert_eq!(stats.unguarded_stacks, 0, "every stack guarded: {stats:?}");
    assert!(stats.guarded_stacks > 100_000, "{stats:?}");
}
