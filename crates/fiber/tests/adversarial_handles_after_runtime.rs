//! Finished join handles kept after their runtime was dropped must not keep
//! the fibers' stacks mapped (each handle holds its frame, and an idle frame
//! kept its stack: 5,000 handles kept about 1.6 GiB of address space until
//! they were joined). One test in its own process, so no other test's
//! memory shows in the numbers.

mod common;
use common::*;

fn vm_kib(field: &str) -> usize {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap()
}

/// Finished join handles kept after their runtime is dropped keep nothing
/// but their results: not their fibers' stacks.
#[test]
fn finished_handles_kept_after_the_runtime_pin_no_stacks() {
    within(120, || {
        let before = vm_kib("VmSize:");
        let rt = fiber::Runtime::builder().workers(2).build().unwrap();
        let h = rt.handle();
        let hs: Vec<fiber::JoinHandle<u8>> = rt.block_on(move || {
            // 5,000 fibers alive at once (so 5,000 frames and stacks).
            let (tx, rx) = fiber::chan::bounded::<()>(0);
            let hs: Vec<_> = (0..5000)
                .map(|_| {
                    let rx = rx.clone();
                    h.spawn(move || {
                        let _ = rx.recv();
                        1u8
                    })
                })
                .collect();
            let _ = fiber::sleep(ms(50));
            drop(tx);
            while !hs.iter().all(|h| h.is_finished()) {
                let _ = fiber::sleep(ms(5));
            }
            hs
        });
        let peak = vm_kib("VmSize:");
        drop(rt);
        std::thread::sleep(ms(100));
        let after_rt = vm_kib("VmSize:");
        let rss_rt = vm_kib("VmRSS:");
        let maps_rt = std::fs::read_to_string("/proc/self/maps").unwrap().lines().count();
        let sum: u32 = hs.into_iter().map(|h| h.join().unwrap() as u32).sum();
        assert_eq!(sum, 5000);
        let after_handles = vm_kib("VmSize:");
        let rss_h = vm_kib("VmRSS:");
        let maps_h = std::fs::read_to_string("/proc/self/maps").unwrap().lines().count();
        eprintln!("RSS KiB after runtime drop {rss_rt}, after joins {rss_h}; maps {maps_rt} -> {maps_h}");
        eprintln!(
            "VmSize KiB: before {before}, peak {peak}, runtime dropped {after_rt}, handles joined {after_handles}"
        );
        // What stays mapped once the handles are joined too (the
        // allocator's per-thread arenas, reserved address space) is the
        // baseline: the handles themselves may add little to it.
        assert!(
            after_rt < after_handles + 64 * 1024,
            "5,000 finished join handles keep {} MiB mapped after their runtime was dropped ({} MiB once joined)",
            (after_rt - before) / 1024,
            (after_handles.saturating_sub(before)) / 1024
        );
    });
}
