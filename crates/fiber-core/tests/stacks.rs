//! Fiber stacks at skynet scale: every stack guarded on default limits.

#![cfg(not(loom))]

use fiber_core::testing::TestScheduler;
use fiber_core::{spawn, StackConfig};

/// Skynet: a tree of fibers, ten children per node, each leaf returning its
/// number and each node the sum of its children.
fn skynet(num: u64, size: u64) -> u64 {
    if size == 1 {
        // A fiber takes its stack when it first runs: a leaf that yields
        // holds its stack until every leaf queued before it has started.
        let _ = fiber_core::yield_now();
        return num;
    }
    let div = size / 10;
    let children: Vec<_> = (0..10).map(|i| spawn(move || skynet(num + i * div, div))).collect();
    children.into_iter().map(|c| c.join().unwrap()).sum()
}

/// A test scheduler with 32 KiB stacks, or `None` (the test is skipped)
/// on a kernel without `MADV_GUARD_INSTALL`.
fn small_stacks_with_page_table_guards() -> Option<TestScheduler> {
    if !fiber_core::stack::page_table_guards_supported() {
        eprintln!("skipped: this kernel has no MADV_GUARD_INSTALL");
        return None;
    }
    Some(TestScheduler::with_stacks(StackConfig {
        size: 32 * 1024,
        ..StackConfig::default()
    }))
}

#[test]
fn skynet_scale_spawns_are_all_guarded() {
    // Before Linux 6.13 the default policy refuses stacks past the mapping
    // budget, so a run this large cannot be all guarded.
    let Some(sched) = small_stacks_with_page_table_guards() else {
        return;
    };
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

#[test]
fn a_fiber_takes_its_stack_when_it_first_runs() {
    // Without page-table guards the default policy may refuse a stack (the
    // `mprotect` budget), so every spawn takes its stack at once
    // (`a_stack_the_allocator_may_refuse_is_taken_at_the_spawn`).
    let Some(sched) = small_stacks_with_page_table_guards() else {
        return;
    };
    // Spawned, not yet run: frames, no stacks.
    let handles: Vec<_> = (0..1_000u64).map(|i| sched.spawn(move || i)).collect();
    let stats = sched.pool_stats();
    assert_eq!(stats.in_use, 1_000, "{stats:?}");
    assert_eq!(
        stats.guarded_stacks + stats.unguarded_stacks,
        0,
        "a fiber that has not started holds no stack: {stats:?}"
    );
    // Each runs to its end before the next starts: they share a stack.
    sched.run();
    let sum: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(sum, 999 * 1_000 / 2);
    let stats = sched.pool_stats();
    assert_eq!(stats.in_use, 0, "{stats:?}");
    assert_eq!(
        stats.guarded_stacks + stats.unguarded_stacks,
        1,
        "one stack, reused: {stats:?}"
    );
}

#[test]
fn a_stack_the_allocator_may_refuse_is_taken_at_the_spawn() {
    // A cap on guarded stacks with the refusing policy: the third spawn
    // finds no stack and says so itself, instead of its fiber failing
    // later when it first runs.
    let sched = TestScheduler::with_stacks(StackConfig {
        size: 32 * 1024,
        max_guarded: Some(2),
        unguarded: fiber_core::stack::UnguardedPolicy::Refuse,
    });
    let on = sched.scheduler();
    let a = fiber_core::try_spawn_on(&on, || 1).expect("first stack");
    let b = fiber_core::try_spawn_on(&on, || 2).expect("second stack");
    let err = fiber_core::try_spawn_on(&on, || 3).map(drop).unwrap_err();
    assert!(err.to_string().contains("fiber stack refused"), "{err}");
    sched.run();
    assert_eq!(a.join().unwrap() + b.join().unwrap(), 3);
    // Their stacks came back: a spawn gets one again.
    let c = fiber_core::try_spawn_on(&on, || 4).expect("a stack came back");
    sched.run();
    assert_eq!(c.join().unwrap(), 4);
    assert_eq!(sched.pool_stats().guarded_stacks, 2);
}

#[test]
fn stacks_above_the_pools_size_are_kept_for_spawns_that_ask_for_as_much() {
    let sched = TestScheduler::with_stacks(StackConfig {
        size: 32 * 1024,
        ..StackConfig::default()
    });
    let on = sched.scheduler();
    let big = || fiber_core::SpawnOptions {
        stack_size: Some(1 << 20),
        ..Default::default()
    };
    // One after another: each big-stack fiber ends before the next spawn,
    // which finds the stack it left (and normal fibers never take it).
    for i in 0..200u64 {
        let h = fiber_core::try_spawn_with(&on, big(), move || i).expect("a big stack");
        let small = fiber_core::try_spawn_on(&on, move || i + 1).expect("a pool stack");
        sched.run();
        assert_eq!(h.join().unwrap() + 1, small.join().unwrap());
    }
    let stats = sched.pool_stats();
    assert!(
        stats.guarded_stacks <= 2,
        "one big stack and one pool stack, reused 200 times: {stats:?}"
    );
    // A trim unmaps the kept big stack; the next big spawn maps one again.
    assert!(sched.scheduler().frames().trim() >= 1);
    let h = fiber_core::try_spawn_with(&on, big(), || 7).expect("a new big stack");
    sched.run();
    assert_eq!(h.join().unwrap(), 7);
    assert_eq!(sched.pool_stats().guarded_stacks, stats.guarded_stacks + 1);
}
