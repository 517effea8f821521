//! Adversarial: `std::thread` parity of scopes and fiber-locals. std's
//! scope panics only for automatically joined threads (a panic the body
//! joined and handled is handled); a scoped join returns after the child's
//! thread-local destructors ran; a thread-local destructor reads another
//! thread-local's current value; a panicking destructor does not leak the
//! other locals; outside fibers a fiber-local behaves like a thread-local
//! (an initializer may use another one; a destructor at thread exit may
//! read one without aborting the process).

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::common::{in_child, ms, on_runtime, within};

/// std::thread::scope: "If any of the automatically joined threads
/// panicked, this function will panic." A child that panicked and was
/// joined by the body (its `Err` handled) is not automatically joined:
/// std's scope returns the body's value.
#[test]
fn scope_child_panic_joined_and_handled_by_the_body_does_not_panic_the_scope() {
    on_runtime(|| {
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            fiber::scope(|s| {
                let h = s.spawn(|| -> u32 { panic!("handled by the body") });
                match h.join() {
                    Ok(_) => 0,
                    Err(e) => {
                        assert!(e.is_panic());
                        41 + 1
                    }
                }
            })
        }));
        match out {
            Ok(v) => assert_eq!(v, 42),
            Err(p) => panic!(
                "fiber::scope panicked although the body joined and handled the child's panic: {:?}",
                p.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            ),
        }
    });
}

/// std: `JoinHandle::join` (and `ScopedJoinHandle::join`) join the native
/// thread, so the thread's thread-local destructors have run when `join`
/// returns. fiber's `JoinHandle::join` gives the same guarantee (locals
/// die before the outcome is published). A scoped child's handle must not
/// return while the child's fiber-local destructors are still running.
#[test]
fn scoped_join_returns_only_after_the_childs_fiber_locals_are_dropped() {
    static DROPPED: AtomicUsize = AtomicUsize::new(0);
    struct SlowDrop;
    impl Drop for SlowDrop {
        fn drop(&mut self) {
            let _ = fiber::sleep(ms(20));
            DROPPED.fetch_add(1, Ordering::SeqCst);
        }
    }
    fiber::fiber_local! {
        static SLOT: RefCell<Option<SlowDrop>> = RefCell::new(None);
    }
    on_runtime(|| {
        // Control: a plain JoinHandle.
        DROPPED.store(0, Ordering::SeqCst);
        fiber::spawn(|| SLOT.with(|s| *s.borrow_mut() = Some(SlowDrop)))
            .join()
            .unwrap();
        assert_eq!(
            DROPPED.load(Ordering::SeqCst),
            1,
            "JoinHandle::join returned before the locals died"
        );

        DROPPED.store(0, Ordering::SeqCst);
        let seen_after_join = fiber::scope(|s| {
            let h = s.spawn(|| SLOT.with(|s| *s.borrow_mut() = Some(SlowDrop)));
            h.join().unwrap();
            DROPPED.load(Ordering::SeqCst)
        });
        assert_eq!(
            seen_after_join, 1,
            "ScopedJoinHandle::join returned before the child's fiber-local destructor ran"
        );
    });
}

/// std: the destructor of one thread-local may read another thread-local
/// that has no destructor (`Cell<u32>`): it sees the current value (std
/// never re-runs an initializer for it). In a fiber, the local's
/// destructor must see the value the fiber left (7), not a fresh one (1).
#[test]
fn a_fiber_local_destructor_reads_the_current_value_of_another_local() {
    static SEEN: AtomicUsize = AtomicUsize::new(0);
    static INITS: AtomicUsize = AtomicUsize::new(0);
    fiber::fiber_local! {
        static A: Cell<u32> = { INITS.fetch_add(1, Ordering::SeqCst); Cell::new(1) };
    }
    struct ReadsA;
    impl Drop for ReadsA {
        fn drop(&mut self) {
            SEEN.store(A.with(|a| a.get()) as usize, Ordering::SeqCst);
        }
    }
    fiber::fiber_local! {
        static B: RefCell<Option<ReadsA>> = RefCell::new(None);
    }
    // Control: std's thread_local! on a plain thread.
    thread_local! {
        static STD_A: Cell<u32> = const { Cell::new(1) };
        static STD_B: RefCell<Option<StdReadsA>> = const { RefCell::new(None) };
    }
    static STD_SEEN: AtomicUsize = AtomicUsize::new(0);
    struct StdReadsA;
    impl Drop for StdReadsA {
        fn drop(&mut self) {
            STD_SEEN.store(STD_A.with(|a| a.get()) as usize, Ordering::SeqCst);
        }
    }
    std::thread::spawn(|| {
        STD_A.with(|a| a.set(7));
        STD_B.with(|b| *b.borrow_mut() = Some(StdReadsA));
    })
    .join()
    .unwrap();
    assert_eq!(STD_SEEN.load(Ordering::SeqCst), 7, "std control");

    on_runtime(|| {
        fiber::spawn(|| {
            A.with(|a| a.set(7));
            B.with(|b| *b.borrow_mut() = Some(ReadsA));
        })
        .join()
        .unwrap();
    });
    assert_eq!(
        (SEEN.load(Ordering::SeqCst), INITS.load(Ordering::SeqCst)),
        (7, 1),
        "(value seen by the destructor, initializer runs): the destructor saw a re-initialised A"
    );
}

/// A fiber-local destructor that panics must not stop the other
/// fiber-locals of that fiber from being dropped (std aborts the process
/// on a panicking TLS destructor, so it never silently leaks the rest;
/// fiber catches the panic, so every other destructor must still run).
#[test]
fn a_panicking_fiber_local_destructor_does_not_leak_the_other_locals() {
    in_child(
        "a_panicking_fiber_local_destructor_does_not_leak_the_other_locals",
        60,
        || {
            static DROPS: AtomicUsize = AtomicUsize::new(0);
            struct Counted;
            impl Drop for Counted {
                fn drop(&mut self) {
                    DROPS.fetch_add(1, Ordering::SeqCst);
                }
            }
            struct Bomb;
            impl Drop for Bomb {
                fn drop(&mut self) {
                    panic!("fiber-local destructor panics");
                }
            }
            fiber::fiber_local! {
                static C0: Counted = Counted;
                static C1: Counted = Counted;
                static C2: Counted = Counted;
                static C3: Counted = Counted;
                static C4: Counted = Counted;
                static C5: Counted = Counted;
                static C6: Counted = Counted;
                static C7: Counted = Counted;
                static BOMB: Bomb = Bomb;
            }
            std::panic::set_hook(Box::new(|_| {}));
            let rt = crate::common::rt();
            let mut total_expected = 0;
            rt.block_on(|| {
                for _ in 0..10 {
                    let _ = fiber::spawn(|| {
                        for k in [&C0, &C1, &C2, &C3, &C4, &C5, &C6, &C7] {
                            k.with(|_| ());
                        }
                        BOMB.with(|_| ());
                    })
                    .join();
                    total_expected += 8;
                }
            });
            drop(rt);
            let _ = std::panic::take_hook();
            assert_eq!(
                DROPS.load(Ordering::SeqCst),
                total_expected,
                "fiber-locals of fibers whose other local panicked on drop were never dropped"
            );
        },
    );
}

/// spec/facade.md: fiber-locals are "dropped when the fiber's body ends
/// (on its stack)". A destructor that keeps re-creating a local is
/// re-run 8 times in the fiber, then the leftover is dropped at frame
/// recycling on the worker thread, outside the fiber (`current()` panics
/// there), its re-created value lands in the worker's thread-local map, and
/// the worker's exit aborts the process ("thread local panicked on drop").
/// std also aborts, but at once, on the thread that owned the key.
/// Low severity: a contract breach (off-fiber destructor), not a std gap.
#[test]
fn fiber_local_destructors_never_run_outside_their_fiber() {
    in_child("fiber_local_destructors_never_run_outside_their_fiber", 30, || {
        static OUTSIDE: AtomicUsize = AtomicUsize::new(0);
        static RUNS: AtomicUsize = AtomicUsize::new(0);
        struct Revives;
        impl Drop for Revives {
            fn drop(&mut self) {
                if !fiber::core::in_fiber() {
                    OUTSIDE.fetch_add(1, Ordering::SeqCst);
                    eprintln!(
                        "Revives::drop outside any fiber, on {:?}",
                        std::thread::current().name()
                    );
                }
                if RUNS.fetch_add(1, Ordering::SeqCst) < 12 {
                    // Re-register, as a per-fiber pool that flushes on drop might.
                    R.with(|_| ());
                }
            }
        }
        fiber::fiber_local! {
            static R: Revives = Revives;
        }
        crate::common::rt().block_on(|| {
            fiber::spawn(|| R.with(|_| ())).join().unwrap();
            fiber::sleep(ms(50)).unwrap();
        });
        assert_eq!(
            (OUTSIDE.load(Ordering::SeqCst), RUNS.load(Ordering::SeqCst)),
            (0, 13),
            "(destructor runs outside any fiber, destructor runs)"
        );
    });
}

/// Outside fibers a fiber-local "behaves like a thread-local" (README).
/// std: a thread-local's initializer may use another thread-local.
#[test]
fn plain_thread_fiber_local_initializer_may_use_another_fiber_local() {
    fiber::fiber_local! {
        static BASE: u32 = 40;
        static DERIVED: u32 = BASE.with(|b| *b + 2);
    }
    // In a fiber (control).
    assert_eq!(on_runtime(|| DERIVED.with(|d| *d)), 42);
    // On a plain thread.
    let got = within(10, || std::thread::spawn(|| DERIVED.with(|d| *d)).join());
    match got {
        Ok(v) => assert_eq!(v, 42),
        Err(p) => panic!(
            "on a plain thread, a fiber-local initializer using another fiber-local panicked: {:?}",
            p.downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        ),
    }
}

/// std: on a plain thread, a thread-local destructor may read another
/// thread-local without a destructor (std control below). A fiber-local,
/// which "behaves like a thread-local outside fibers", must allow the same
/// without aborting the process.
#[test]
fn plain_thread_fiber_local_destructor_may_read_another_fiber_local() {
    in_child(
        "plain_thread_fiber_local_destructor_may_read_another_fiber_local",
        30,
        || {
            static SEEN: AtomicUsize = AtomicUsize::new(0);
            fiber::fiber_local! {
                static A: Cell<u32> = Cell::new(1);
            }
            struct ReadsA;
            impl Drop for ReadsA {
                fn drop(&mut self) {
                    SEEN.store(A.with(|a| a.get()) as usize, Ordering::SeqCst);
                }
            }
            fiber::fiber_local! {
                static B: RefCell<Option<ReadsA>> = RefCell::new(None);
            }
            std::thread::spawn(|| {
                A.with(|a| a.set(7));
                B.with(|b| *b.borrow_mut() = Some(ReadsA));
            })
            .join()
            .unwrap();
            // The process did not abort and the destructor ran. On a plain
            // thread every fiber-local lives in one thread-local, being
            // destroyed at that point, so the read gets a fresh value (1)
            // rather than 7 (README, "fiber-locals").
            assert_ne!(SEEN.load(Ordering::SeqCst), 0, "the destructor did not run");
        },
    );
}

/// A fiber-local whose destructor reads its own fiber-local. On a plain
/// thread at exit, the read gets a fresh value, whose destructor read
/// another fresh one, and so on: the thread overflowed its stack inside
/// its thread-local destructors (SIGSEGV, no message). Now a value made
/// while a fresh one is dropped is leaked, which ends the chain.
#[test]
fn plain_thread_fiber_local_destructor_reading_itself_ends() {
    in_child("plain_thread_fiber_local_destructor_reading_itself_ends", 30, || {
        static DROPS: AtomicUsize = AtomicUsize::new(0);
        struct ReadsItself(u32);
        impl Drop for ReadsItself {
            fn drop(&mut self) {
                DROPS.fetch_add(1, Ordering::SeqCst);
                let _ = SELF_READER.with(|t| t.0);
            }
        }
        fiber::fiber_local! {
            static SELF_READER: ReadsItself = ReadsItself(0);
        }
        std::thread::spawn(|| SELF_READER.with(|t| t.0)).join().unwrap();
        // The stored value and the fresh one its destructor read.
        assert_eq!(DROPS.load(Ordering::SeqCst), 2);
    });
}

/// The same in a fiber: the fiber's own clean-up re-creates the value in
/// each of its rounds and gives up after 1,024; the leftover was dropped
/// on the worker thread outside any fiber, where its destructor's read
/// stored a new value in the worker thread's own fiber-locals (a fiber's
/// value moved into a worker), and that one's destructor chain overflowed
/// the worker's stack when the runtime was dropped.
#[test]
fn fiber_local_destructor_reading_itself_stays_in_its_fiber() {
    in_child("fiber_local_destructor_reading_itself_stays_in_its_fiber", 30, || {
        static DROPS: AtomicUsize = AtomicUsize::new(0);
        struct ReadsItself(u32);
        impl Drop for ReadsItself {
            fn drop(&mut self) {
                DROPS.fetch_add(1, Ordering::SeqCst);
                let _ = SELF_READER.with(|t| t.0);
            }
        }
        fiber::fiber_local! {
            static SELF_READER: ReadsItself = ReadsItself(0);
        }
        let rt = fiber::Runtime::builder().workers(1).max_workers(1).build().unwrap();
        rt.block_on(|| fiber::spawn(|| SELF_READER.with(|t| t.0)).join().unwrap());
        drop(rt);
        // 1,024 rounds in the fiber, then the leftover and the fresh value
        // its destructor read (none stored in the worker, whose exit would
        // have dropped it).
        let drops = DROPS.load(Ordering::SeqCst);
        assert!((1024..=1026).contains(&drops), "{drops} drops");
    });
}

/// Two fiber-locals whose destructors read each other, at thread exit.
#[test]
fn plain_thread_fiber_locals_reading_each_other_in_destructors_end() {
    in_child(
        "plain_thread_fiber_locals_reading_each_other_in_destructors_end",
        30,
        || {
            struct ReadsB;
            impl Drop for ReadsB {
                fn drop(&mut self) {
                    B.with(|_| ());
                }
            }
            struct ReadsA;
            impl Drop for ReadsA {
                fn drop(&mut self) {
                    A.with(|_| ());
                }
            }
            fiber::fiber_local! {
                static A: ReadsB = ReadsB;
                static B: ReadsA = ReadsA;
            }
            std::thread::spawn(|| {
                A.with(|_| ());
                B.with(|_| ());
            })
            .join()
            .unwrap();
        },
    );
}
