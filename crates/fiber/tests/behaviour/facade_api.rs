//! The facade's everyday API: borrowing `run` / `block_on`, the spawn
//! `Builder`, the runtime `Handle`, and refusing a nested runtime.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};

fn small_runtime() -> fiber::Runtime {
    fiber::Runtime::builder().workers(2).build().unwrap()
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

#[test]
fn run_borrows_a_local_vec_and_a_mut_counter() {
    let words: Vec<String> = ["a", "bb", "ccc"].map(String::from).into();
    let mut counter = 0usize;
    let total = fiber::run(|| {
        let lengths: usize = fiber::scope(|s| {
            let handles: Vec<_> = words.iter().map(|w| s.spawn(move || w.len())).collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        counter += lengths;
        fiber::yield_now().unwrap();
        counter += 1;
        words.len()
    });
    assert_eq!(total, 3);
    assert_eq!(counter, 7);
    assert_eq!(words[2], "ccc", "the Vec is still ours after run");
}

#[test]
fn block_on_borrows_and_returns_a_borrowing_value() {
    let rt = small_runtime();
    let data = vec![1u64, 2, 3];
    let mut seen = Vec::new();
    let first: &u64 = rt.block_on(|| {
        seen.extend(data.iter().copied());
        &data[0]
    });
    assert_eq!(*first, 1);
    assert_eq!(seen, data);
}

#[test]
fn a_panicking_borrowing_root_returns_only_after_the_root_is_done() {
    struct Marks<'a>(&'a AtomicUsize);
    impl Drop for Marks<'_> {
        fn drop(&mut self) {
            // Runs on the root fiber, during the unwind; the caller's
            // counter must still be alive.
            fiber::yield_now().ok();
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let dropped = AtomicUsize::new(0);
    let result = catch_unwind(AssertUnwindSafe(|| {
        fiber::run(|| {
            let _marks = Marks(&dropped);
            panic!("root failed");
        })
    }));
    let payload = result.expect_err("the root's panic is re-raised");
    assert_eq!(panic_text(&*payload), "root failed");
    assert_eq!(
        dropped.load(Ordering::SeqCst),
        1,
        "the root's locals were dropped before run returned"
    );
}

#[test]
fn builder_names_a_fiber_everywhere() {
    fiber::run(|| {
        let named = fiber::Builder::new()
            .name("conn-42")
            .spawn(|| fiber::current().name().map(str::to_owned))
            .unwrap();
        assert_eq!(named.join().unwrap().as_deref(), Some("conn-42"));
        assert_eq!(fiber::current().name(), None, "the root has no name");

        let (tx, rx) = fiber::chan::bounded::<()>(0);
        let parked = fiber::Builder::new()
            .name("waiter-7")
            .spawn(move || {
                let _ = rx.recv();
            })
            .unwrap();
        while !fiber::dump().to_string().contains("waiter-7") {
            fiber::sleep(std::time::Duration::from_millis(1)).unwrap();
        }
        drop(tx);
        parked.join().unwrap();

        let failing = fiber::Builder::new()
            .name("worker-3")
            .spawn(|| -> () { panic!("disk full") })
            .unwrap();
        let id = failing.id();
        let err = failing.join().unwrap_err();
        assert_eq!(err.name(), Some("worker-3"));
        let display = err.to_string();
        assert!(display.contains(&id.to_string()), "{display}");
        assert!(display.contains("worker-3"), "{display}");
        assert!(display.contains("disk full"), "{display}");
        let debug = format!("{err:?}");
        assert!(debug.contains("worker-3") && debug.contains("disk full"), "{debug}");
    });
}

/// Recursion that needs about `frames` x 1 KiB of stack.
fn deep(frames: u32) -> u32 {
    let pad = std::hint::black_box([1u8; 1024]);
    if frames == 0 {
        u32::from(pad[0])
    } else {
        deep(frames - 1) + u32::from(pad[1023])
    }
}

#[test]
fn builder_stack_size_above_the_pool_gets_a_stack_of_its_own() {
    let rt = fiber::Runtime::builder()
        .workers(1)
        .stack_size(128 * 1024)
        .build()
        .unwrap();
    rt.block_on(|| {
        let small = fiber::Builder::new().stack_size(64 * 1024).spawn(|| 5).unwrap();
        assert_eq!(small.join().unwrap(), 5);
        let exact = fiber::Builder::new().stack_size(128 * 1024).spawn(|| 6).unwrap();
        assert_eq!(exact.join().unwrap(), 6);
        // About 2 MiB of recursion: far past the pool's 128 KiB stacks
        // (which would hit their guard and abort the process).
        let big = fiber::Builder::new().stack_size(4 << 20).spawn(|| deep(2_000)).unwrap();
        assert_eq!(big.join().unwrap(), 2_001);
        // Several at once, and ordinary fibers after them.
        let many: Vec<_> = (0..4)
            .map(|_| fiber::Builder::new().stack_size(3 << 20).spawn(|| deep(1_500)).unwrap())
            .collect();
        for h in many {
            assert_eq!(h.join().unwrap(), 1_501);
        }
        let plain: Vec<_> = (0..16).map(|i| fiber::spawn(move || i)).collect();
        assert_eq!(plain.into_iter().map(|h| h.join().unwrap()).sum::<i32>(), 120);
        let err = fiber::Builder::new().stack_size((1 << 30) + 1).spawn(|| 7).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
        assert!(err.to_string().contains("stack size"), "{err}");
    });
}

#[test]
fn builder_spawn_scoped_borrows_and_names() {
    fiber::run(|| {
        let mut hits = 0;
        let name = fiber::scope(|s| {
            let h = fiber::Builder::new()
                .name("scoped-1")
                .spawn_scoped(s, || {
                    hits += 1;
                    fiber::current().name().map(str::to_owned)
                })
                .unwrap();
            h.join().unwrap()
        });
        assert_eq!(hits, 1);
        assert_eq!(name.as_deref(), Some("scoped-1"));
        let err = fiber::supervisor_scope(|s| {
            fiber::Builder::new()
                .name("scoped-2")
                .spawn_scoped(s, || -> () { panic!("boom") })
                .unwrap()
                .join()
                .unwrap_err()
        });
        assert!(err.to_string().contains("scoped-2"), "{err}");
    });
}

#[test]
fn builder_pinned_fiber_resumes_on_its_worker() {
    let rt = fiber::Runtime::builder().workers(2).build().unwrap();
    rt.block_on(|| {
        let h = fiber::Builder::new()
            .pinned(true)
            .spawn(|| {
                let first = fiber::core::current_worker();
                for _ in 0..50 {
                    fiber::yield_now().unwrap();
                    assert_eq!(fiber::core::current_worker(), first);
                }
            })
            .unwrap();
        h.join().unwrap();
    });
}

#[test]
fn handle_spawns_and_blocks_on_from_plain_threads() {
    let rt = small_runtime();
    let handle = rt.handle();
    let total = std::thread::scope(|t| {
        let workers: Vec<_> = (0..3u64)
            .map(|i| {
                let handle = handle.clone();
                t.spawn(move || {
                    let spawned = handle.spawn(move || i * 10);
                    let local: Vec<u64> = std::iter::repeat_n(i, 2).collect();
                    let rooted = handle.block_on(|| local.iter().sum::<u64>());
                    spawned.join().unwrap() + rooted
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).sum::<u64>()
    });
    assert_eq!(total, 12 * 3, "sum over i of (10 i + 2 i)");
}

#[test]
fn handle_current_inside_a_fiber_and_none_outside() {
    assert!(fiber::Handle::try_current().is_none());
    let err = catch_unwind(fiber::Handle::current).unwrap_err();
    let text = panic_text(&*err);
    assert!(
        text.contains("Handle::current") && text.contains("outside a fiber"),
        "{text}"
    );

    let rt = small_runtime();
    let handle = rt.block_on(|| {
        let handle = fiber::Handle::current();
        assert!(fiber::Handle::try_current().is_some());
        handle
    });
    // The handle outlives the fiber that took it and still spawns.
    let h = std::thread::spawn(move || handle.spawn(|| 9).join().unwrap());
    assert_eq!(h.join().unwrap(), 9);
}

#[test]
fn run_inside_a_fiber_is_refused_with_advice() {
    fiber::run(|| {
        let nested = fiber::spawn(|| catch_unwind(|| fiber::run(|| 1)).map_err(|p| panic_text(&*p)));
        let text = nested.join().unwrap().unwrap_err();
        assert!(text.contains("fiber::run called inside a fiber"), "{text}");
        assert!(text.contains("fiber::spawn") && text.contains("Handle"), "{text}");
    });
}

#[test]
fn block_on_inside_a_fiber_is_refused_with_advice() {
    let rt = small_runtime();
    let handle = rt.handle();
    let text = rt.block_on(|| {
        catch_unwind(AssertUnwindSafe(|| handle.block_on(|| 1)))
            .map_err(|p| panic_text(&*p))
            .unwrap_err()
    });
    assert!(text.contains("Handle::block_on called inside a fiber"), "{text}");
    assert!(text.contains("spawn"), "{text}");
    // The runtime is fine afterwards.
    assert_eq!(rt.block_on(|| 2), 2);
}

#[test]
fn handle_spawn_after_shutdown_is_an_error() {
    let rt = small_runtime();
    let handle = rt.handle();
    drop(rt);
    let err = handle.try_spawn(|| ()).unwrap_err();
    assert!(err.to_string().contains("shutting down"), "{err}");
}

#[test]
fn a_scoped_spawn_that_fails_drops_its_closure_once_and_the_scope_returns() {
    struct Guard<'a>(&'a std::sync::atomic::AtomicUsize);
    impl Drop for Guard<'_> {
        fn drop(&mut self) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
    fiber::run(|| {
        let drops = std::sync::atomic::AtomicUsize::new(0);
        let err = fiber::scope(|s| {
            let guard = Guard(&drops);
            // Above the 1 GiB limit: refused before the fiber exists.
            fiber::Builder::new()
                .stack_size(2 << 30)
                .spawn_scoped(s, move || {
                    let _guard = guard;
                    [0u64; 64]
                })
                .unwrap_err()
        });
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
        assert_eq!(
            drops.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "the unrun closure was dropped once"
        );
    });
}
