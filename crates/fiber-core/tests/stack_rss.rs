//! Memory goes back after a burst: resident set size (from
//! `/proc/self/statm`) returns near its baseline once a burst of fibers
//! has finished. One test in its own process, so no other test's memory
//! shows in the numbers.

#![cfg(not(loom))]

use fiber_core::testing::TestScheduler;
use fiber_core::StackConfig;
use std::hint::black_box;

/// Resident set size of this process in bytes.
fn rss() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("read /proc/self/statm");
    let pages: usize = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    // SAFETY: sysconf has no preconditions.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize
}

/// Touch `bytes` of stack below the caller.
#[inline(never)]
fn touch_stack(bytes: usize) -> u8 {
    let mut chunk = [1u8; 4096];
    black_box(&mut chunk);
    if bytes <= 4096 {
        return chunk[black_box(5)];
    }
    touch_stack(bytes - 4096).wrapping_add(chunk[black_box(9)])
}

const MIB: usize = 1024 * 1024;

#[test]
fn stack_pages_and_frames_go_back_after_a_burst() {
    let sched = TestScheduler::with_stacks(StackConfig::default());
    // Warm up: more idle frames than the pool keeps warm, each with a touched stack.
    // (A fiber takes its stack when it first runs: each yields first, so
    // that all of them have started, on stacks of their own, before any
    // ends.)
    let warm: Vec<_> = (0..300)
        .map(|_| {
            sched.spawn(|| {
                let _ = fiber_core::yield_now();
                touch_stack(16 * 1024)
            })
        })
        .collect();
    sched.run();
    warm.into_iter().for_each(|h| drop(h.join()));
    sched.scheduler().frames().trim();
    let baseline = rss();

    // 200 fibers that each touch 200 KiB of stack: 40 MiB while they run.
    let deep: Vec<_> = (0..200)
        .map(|_| {
            sched.spawn(|| {
                let _ = fiber_core::yield_now();
                touch_stack(200 * 1024)
            })
        })
        .collect();
    sched.run();
    deep.into_iter().for_each(|h| drop(h.join()));
    let before_deep_trim = rss();
    sched.scheduler().frames().trim();
    let after_deep = rss();

    // A burst of 100,000 fibers alive at once, each touching 8 KiB.
    let burst: Vec<_> = (0..100_000)
        .map(|_| {
            sched.spawn(|| {
                let _ = fiber_core::yield_now();
                touch_stack(8 * 1024)
            })
        })
        .collect();
    sched.run();
    burst.into_iter().for_each(|h| drop(h.join()));
    let before_trim = rss();
    let released = sched.scheduler().frames().trim();
    // The join blocks the burst's fibers freed wait in the block pool for
    // the next burst until a trim finds them unused since the previous
    // trim (a runtime's monitor trims once a second): two trims, a second
    // apart on the pool's clock.
    let now = std::time::Instant::now();
    fiber_core::trim_join_blocks_at(now);
    let blocks_freed = fiber_core::trim_join_blocks_at(now + std::time::Duration::from_secs(1));
    let freed_to_malloc = rss();
    // What the runtime freed (frames, join blocks) sits in glibc's heap,
    // which keeps free memory until asked; ask, so the number below is what
    // the runtime still holds.
    // SAFETY: malloc_trim has no preconditions.
    unsafe { libc::malloc_trim(0) };
    let after_burst = rss();
    let stats = sched.pool_stats();
    eprintln!(
        "RSS baseline {} KiB; 200 x 200 KiB: {} KiB before trim, {} KiB after; \
         100,000-fiber burst: {} KiB before trim, {} KiB after ({released} stacks gave pages back), \
         {} KiB after malloc_trim ({blocks_freed} join blocks freed); {stats:?}",
        baseline / 1024,
        before_deep_trim / 1024,
        after_deep / 1024,
        before_trim / 1024,
        freed_to_malloc / 1024,
        after_burst / 1024
    );
    assert!(released > 90_000, "{released}");
    assert!(blocks_freed > 90_000, "{blocks_freed} join blocks freed");
    assert_eq!(stats.in_use, 0);
    assert!(
        before_deep_trim > baseline + 30 * MIB,
        "200 fibers held 200 KiB of stack each at once: baseline {baseline}, before the trim {before_deep_trim}"
    );
    assert!(
        after_deep < baseline + 8 * MIB,
        "200 x 200 KiB of stack went back: baseline {baseline}, after {after_deep}"
    );
    assert!(
        after_burst < baseline + 8 * MIB,
        "a 100,000-fiber burst went back: baseline {baseline}, after {after_burst}"
    );
}
