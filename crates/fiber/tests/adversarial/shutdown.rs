//! Adversarial: runtime shutdown racing with spawns from other threads,
//! destructors that block the OS thread, and parked scopes. Shutdown must
//! end in bounded time, run each destructor once, and never resume a fiber
//! that is still running on a stuck worker. Risky scenarios run in a child
//! process so that a crash fails the test instead of the test binary.

use fiber::chan;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use crate::common::{in_child, ms, rt_fixed_grace, stubborn_sleep, wait_parked, within};

struct Counted(Arc<AtomicUsize>);
impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn a_destructor_that_blocks_its_worker_thread_at_shutdown_does_not_stop_the_teardown() {
    in_child(
        "a_destructor_that_blocks_its_worker_thread_at_shutdown_does_not_stop_the_teardown",
        40,
        || {
            static RELEASE: AtomicBool = AtomicBool::new(false);
            struct BlocksThread;
            impl Drop for BlocksThread {
                fn drop(&mut self) {
                    // Blocks the OS thread (not fiber-aware) for a while.
                    let start = Instant::now();
                    while !RELEASE.load(Ordering::Acquire) && start.elapsed() < Duration::from_secs(8) {
                        std::thread::sleep(ms(5));
                    }
                }
            }
            let drops = Arc::new(AtomicUsize::new(0));
            let rt = fiber::Runtime::builder()
                .workers(1)
                .max_workers(1)
                .shutdown_timeout(ms(200))
                .build()
                .unwrap();
            let d = drops.clone();
            rt.block_on(move || {
                // B: parked in a receive, holding a counted value.
                let (_tx, rx) = chan::bounded::<u8>(0);
                let d2 = d.clone();
                fiber::spawn(move || {
                    let _c = Counted(d2);
                    let _keep = _tx;
                    let _ = rx.recv();
                });
                // A: returns when cancelled, and its destructor then blocks
                // the only worker thread.
                fiber::spawn(move || {
                    let _c = Counted(d);
                    let _b = BlocksThread;
                    let _ = fiber::sleep(Duration::MAX);
                });
                fiber::sleep(ms(10)).unwrap();
            });
            let start = Instant::now();
            drop(rt);
            let took = start.elapsed();
            RELEASE.store(true, Ordering::Release);
            assert!(took < Duration::from_secs(20), "shutdown took {took:?}");
            // B was torn down; A's destructors finish on the released
            // worker. Each exactly once.
            let wait = Instant::now();
            while drops.load(Ordering::SeqCst) < 2 && wait.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(ms(5));
            }
            std::thread::sleep(ms(50));
            assert_eq!(drops.load(Ordering::SeqCst), 2, "each destructor once");
        },
    );
}

#[test]
fn spawns_from_other_threads_racing_with_shutdown_are_ok_or_errors() {
    within(30, || {
        for _ in 0..5 {
            let rt = fiber::Runtime::builder()
                .workers(2)
                .shutdown_timeout(ms(200))
                .build()
                .unwrap();
            let handle = rt.handle();
            let stop = Arc::new(AtomicBool::new(false));
            let ran = Arc::new(AtomicUsize::new(0));
            let spawner = {
                let (stop, ran) = (stop.clone(), ran.clone());
                std::thread::spawn(move || {
                    let mut handles = Vec::new();
                    let mut refused = 0;
                    while !stop.load(Ordering::Acquire) {
                        let ran = ran.clone();
                        match handle.try_spawn(move || {
                            ran.fetch_add(1, Ordering::SeqCst);
                            fiber::sleep(ms(1))
                        }) {
                            Ok(h) => handles.push(h),
                            Err(_) => {
                                refused += 1;
                                if refused > 10 {
                                    break;
                                }
                            }
                        }
                    }
                    // Every accepted spawn's join returns: a value or Cancelled.
                    for h in handles {
                        match h.join() {
                            Ok(_) => {}
                            Err(e) => assert!(e.is_cancelled(), "{e:?}"),
                        }
                    }
                })
            };
            std::thread::sleep(ms(10));
            drop(rt);
            stop.store(true, Ordering::Release);
            spawner.join().unwrap();
        }
    })
}

#[test]
fn shutdown_with_nested_parked_scopes_and_timeouts_unwinds_everything_once() {
    let drops = Arc::new(AtomicUsize::new(0));
    let d = drops.clone();
    let expected = within(30, move || {
        let rt = fiber::Runtime::builder()
            .workers(2)
            .shutdown_timeout(ms(300))
            .build()
            .unwrap();
        let made = Arc::new(AtomicUsize::new(0));
        let m = made.clone();
        rt.spawn(move || {
            let outer = Counted(d.clone());
            m.fetch_add(1, Ordering::SeqCst);
            let _ = fiber::with_timeout(Duration::from_secs(3600), || {
                fiber::scope(|s| {
                    for _ in 0..3 {
                        let (d, m) = (d.clone(), m.clone());
                        s.spawn(move || {
                            let _c = Counted(d.clone());
                            m.fetch_add(1, Ordering::SeqCst);
                            fiber::supervisor_scope(|s2| {
                                let (d, m) = (d.clone(), m.clone());
                                s2.spawn(move || {
                                    let _c = Counted(d);
                                    m.fetch_add(1, Ordering::SeqCst);
                                    // Parked in a non-cancellable-looking
                                    // place: a rendezvous nobody completes.
                                    let (_tx, rx) = chan::bounded::<u8>(0);
                                    let _ = rx.recv();
                                });
                            });
                        });
                    }
                });
            });
            drop(outer);
        });
        std::thread::sleep(ms(30));
        drop(rt);
        made.load(Ordering::SeqCst)
    });
    assert_eq!(expected, 7, "every fiber started before the shutdown");
    assert_eq!(drops.load(Ordering::SeqCst), 7, "each destructor ran exactly once");
}

#[test]
fn a_lock_deadlock_at_shutdown_is_torn_down_with_locals_and_fiber_locals_dropped_once() {
    // Two fibers deadlocked on fiber::sync mutexes (`lock` is not a
    // cancellation point, as in std): shutdown's cancel cannot end them, so
    // the teardown unwinds them; their stack values and fiber-locals drop
    // exactly once, on the right fiber.
    fiber::fiber_local! {
        static LOCAL: std::cell::RefCell<Option<Counted>> = std::cell::RefCell::new(None);
    }
    in_child(
        "a_lock_deadlock_at_shutdown_is_torn_down_with_locals_and_fiber_locals_dropped_once",
        40,
        || {
            let drops = Arc::new(AtomicUsize::new(0));
            let rt = fiber::Runtime::builder()
                .workers(2)
                .shutdown_timeout(ms(200))
                .build()
                .unwrap();
            let d = drops.clone();
            rt.block_on(move || {
                let a = Arc::new(fiber::sync::Mutex::new(()));
                let b = Arc::new(fiber::sync::Mutex::new(()));
                let barrier = Arc::new(fiber::sync::Barrier::new(2));
                for (first, second) in [(a.clone(), b.clone()), (b, a)] {
                    let (d, barrier) = (d.clone(), barrier.clone());
                    fiber::spawn(move || {
                        let _stack = Counted(d.clone());
                        LOCAL.with(|l| *l.borrow_mut() = Some(Counted(d)));
                        let _g1 = first.lock().unwrap();
                        barrier.wait();
                        let _g2 = second.lock().unwrap(); // deadlock
                    });
                }
                fiber::sleep(ms(20)).unwrap();
            });
            let start = Instant::now();
            drop(rt);
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "shutdown took {:?}",
                start.elapsed()
            );
            assert_eq!(
                drops.load(Ordering::SeqCst),
                4,
                "2 stack values and 2 fiber-locals, once each"
            );
        },
    );
}

#[test]
fn a_panicking_on_thread_stop_hook_does_not_hang_or_abort_shutdown() {
    in_child(
        "a_panicking_on_thread_stop_hook_does_not_hang_or_abort_shutdown",
        30,
        || {
            let rt = fiber::Runtime::builder()
                .workers(2)
                .shutdown_timeout(ms(100))
                .on_thread_stop(|| panic!("on_thread_stop hook"))
                .build()
                .unwrap();
            assert_eq!(rt.block_on(|| fiber::spawn(|| 1).join().unwrap()), 1);
            let start = Instant::now();
            drop(rt);
            assert!(start.elapsed() < Duration::from_secs(20));
        },
    );
}

#[test]
fn shutdown_while_a_borrowing_blocking_call_runs_keeps_the_borrow_alive() {
    // `fiber::blocking(f)`: f may borrow the fiber's stack and its wait is
    // not cancellable. A shutdown with a short grace must neither free the
    // stack under f (teardown waits or leaks it) nor hang.
    in_child(
        "shutdown_while_a_borrowing_blocking_call_runs_keeps_the_borrow_alive",
        40,
        || {
            static CHECKED: AtomicUsize = AtomicUsize::new(0);
            let rt = fiber::Runtime::builder()
                .workers(2)
                .shutdown_timeout(ms(50))
                .build()
                .unwrap();
            let (started_tx, started_rx) = mpsc::channel();
            rt.spawn(move || {
                let mut buf = [0xA5u8; 4096];
                let buf_ref = &mut buf;
                fiber::blocking(move || {
                    started_tx.send(()).unwrap();
                    std::thread::sleep(ms(400));
                    // Still our bytes: nobody reused the fiber's stack.
                    assert!(buf_ref.iter().all(|&b| b == 0xA5), "the borrowed stack was reused");
                    buf_ref.fill(0x5A);
                    CHECKED.fetch_add(1, Ordering::SeqCst);
                });
                assert!(buf.iter().all(|&b| b == 0x5A));
            });
            started_rx.recv().unwrap();
            let start = Instant::now();
            drop(rt);
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "shutdown took {:?}",
                start.elapsed()
            );
            // Let the blocking call finish before the process exits.
            let wait = Instant::now();
            while CHECKED.load(Ordering::SeqCst) == 0 && wait.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(ms(10));
            }
            std::thread::sleep(ms(50));
            assert_eq!(
                CHECKED.load(Ordering::SeqCst),
                1,
                "the blocking call completed its check"
            );
        },
    );
}

#[test]
fn shutdown_while_a_try_recv_loop_waits_on_a_select_send_arm_ends_and_loses_nothing() {
    // A non-blocking receive that wakes a select parked on a send arm
    // waits briefly as a parked receiver (spec/chan.md): shutdown may find
    // it there, or the select mid-hand-over. Shutdown ends in bounded time,
    // and every value the select reports sent was received.
    within(30, || {
        for _ in 0..20 {
            let rt = fiber::Runtime::builder().workers(2).max_workers(2).build().unwrap();
            let sent = Arc::new(AtomicUsize::new(0));
            let received = Arc::new(AtomicUsize::new(0));
            let (s, r) = chan::bounded::<u8>(0);
            let (_stop_s, stop_r) = chan::bounded::<()>(0);
            {
                let sent = sent.clone();
                rt.handle().spawn(move || loop {
                    fiber::select! {
                        send(s, 1) -> res => {
                            if res.is_err() { break }
                            sent.fetch_add(1, Ordering::SeqCst);
                        }
                        recv(stop_r) -> _ => break,
                    }
                });
            }
            {
                let received = received.clone();
                rt.handle().spawn(move || loop {
                    if r.try_recv().is_ok() {
                        received.fetch_add(1, Ordering::SeqCst);
                    }
                    if fiber::yield_now().is_err() {
                        break;
                    }
                });
            }
            std::thread::sleep(ms(5));
            let start = Instant::now();
            drop(rt);
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "shutdown took {:?}",
                start.elapsed()
            );
            assert_eq!(sent.load(Ordering::SeqCst), received.load(Ordering::SeqCst));
        }
    })
}

/// Two fibers that ignore cancellation are unwound at teardown, and a
/// destructor of one opens a `fiber::scope`. That fiber parks at its scope
/// wait in the middle of its unwind, which leaves the teardown thread
/// counting as panicking; the other fiber, resumed on that thread, then
/// got `Cancelled` at once from every `fiber::sleep` (a wait during an
/// unwind) without ever being unwound, and looped for ever: dropping the
/// runtime hung. Such a fiber is now abandoned after a bound
/// (spec/reliability.md: shutdown ends in bounded time; a fiber that keeps
/// waiting is not looped on).
#[test]
fn teardown_ends_when_a_destructor_opens_a_scope_next_to_a_fiber_looping_on_sleep() {
    in_child(
        "teardown_ends_when_a_destructor_opens_a_scope_next_to_a_fiber_looping_on_sleep",
        20,
        || {
            struct OpensScope;
            impl Drop for OpensScope {
                fn drop(&mut self) {
                    fiber::scope(|s| {
                        s.spawn(|| {});
                    });
                }
            }
            let rt = fiber::Runtime::builder()
                .workers(2)
                .shutdown_timeout(ms(300))
                .build()
                .unwrap();
            rt.block_on(|| {
                for _ in 0..2 {
                    drop(fiber::spawn(|| {
                        let _v = OpensScope;
                        loop {
                            // Ignores cancellation: unwound at teardown.
                            let _ = fiber::sleep(ms(5));
                        }
                    }));
                }
                fiber::sleep(ms(10)).unwrap();
            });
            drop(rt);
        },
    );
}

/// A semaphore acquire inside `non_cancellable`, granted during teardown
/// (the holder is unwound first): the grant stands. A cancelled acquire
/// gives back a grant only outside teardown, where the wait itself would
/// have returned `Cancelled`.
#[test]
fn a_non_cancellable_acquire_granted_in_teardown_is_not_err_cancelled() {
    in_child(
        "a_non_cancellable_acquire_granted_in_teardown_is_not_err_cancelled",
        40,
        || {
            static SAW_ERR: AtomicBool = AtomicBool::new(false);
            let rt = rt_fixed_grace(1, ms(100));
            let sem = Arc::new(fiber::sync::Semaphore::new(1));
            let seen = Arc::new(std::sync::Mutex::new(String::new()));
            let (tx, rx) = std::sync::mpsc::channel();
            // F (lower id): waits for the permit in a non-cancellable section.
            {
                let sem = sem.clone();
                let seen = seen.clone();
                let tx = tx.clone();
                rt.spawn(move || {
                    rx_ready(&tx);
                    while sem.available_permits() > 0 {
                        let _ = fiber::yield_now();
                    }
                    fiber::non_cancellable(|| {
                        let r = sem.acquire();
                        if r.is_err() {
                            SAW_ERR.store(true, Ordering::SeqCst);
                        }
                        *seen.lock().unwrap() = format!("{:?}", r.map(|p| p.num_permits()));
                    });
                });
            }
            // G (higher id, unwound first at teardown): holds the permit and
            // ignores its cancellation.
            {
                let sem = sem.clone();
                rt.spawn(move || {
                    let _permit = sem.try_acquire().expect("free");
                    tx.send(()).unwrap();
                    stubborn_sleep();
                });
            }
            rx.recv().unwrap();
            rx.recv().unwrap();
            wait_parked(&rt, 2);
            drop(rt);
            let seen = seen.lock().unwrap().clone();
            assert!(
                !SAW_ERR.load(Ordering::SeqCst),
                "non_cancellable acquire returned {seen} (granted in teardown, given back)"
            );
        },
    );
}

fn rx_ready(tx: &std::sync::mpsc::Sender<()>) {
    tx.send(()).unwrap();
}

/// Two plain threads spawn as fast as they can while the runtime is
/// dropped, 200 times: every spawn is refused or its join returns. A spawn
/// that found the runtime open could schedule its fiber after teardown's
/// last drain; nobody ran it and its join never returned (a hang within a
/// few dozen rounds). Teardown now waits for spawns admitted
/// before it started (`fiber-core/src/gate.rs`).
#[test]
fn spawns_admitted_just_before_teardown_are_run_or_cancelled() {
    within(120, || {
        for round in 0..200 {
            let rt = fiber::Runtime::builder()
                .workers(2)
                .shutdown_timeout(Duration::ZERO)
                .build()
                .unwrap();
            let stop = Arc::new(AtomicBool::new(false));
            let spawners: Vec<_> = (0..2)
                .map(|_| {
                    let (handle, stop) = (rt.handle(), stop.clone());
                    std::thread::spawn(move || {
                        let mut handles = Vec::new();
                        let mut refused = 0;
                        while !stop.load(Ordering::Acquire) && refused <= 10 {
                            match handle.try_spawn(|| fiber::sleep(ms(1))) {
                                Ok(h) => handles.push(h),
                                Err(_) => refused += 1,
                            }
                        }
                        handles
                    })
                })
                .collect();
            std::thread::sleep(Duration::from_micros(500));
            drop(rt);
            stop.store(true, Ordering::Release);
            for spawner in spawners {
                let handles = spawner.join().unwrap();
                let n = handles.len();
                let (tx, rx) = std::sync::mpsc::channel();
                std::thread::spawn(move || {
                    for h in handles {
                        if let Err(e) = h.join() {
                            assert!(e.is_cancelled(), "{e:?}");
                        }
                    }
                    let _ = tx.send(());
                });
                assert!(
                    rx.recv_timeout(Duration::from_secs(10)).is_ok(),
                    "round {round}: a join of {n} spawns admitted around the drop never returned"
                );
            }
        }
    })
}
