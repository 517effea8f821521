//! Adversarial: shutdown while fibers are inside `fiber::blocking`. The
//! README gives cancelled fibers a grace time (`shutdown_timeout`) to
//! return; a fiber waiting for a blocking call, and what waits for it (a
//! lock it holds, a join, `block_on`), gets that grace time instead of
//! being abandoned after 50 ms because "every fiber is parked". A fiber
//! abandoned anyway (its call outlived the grace time) releases its
//! joiners with a cancellation. Dropping a runtime from one of its own
//! blocking-pool threads is refused like dropping it from its own fiber.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{in_child, ms, panic_message, rt_fixed_grace, within};

/// README: at shutdown fibers "get a grace time (`shutdown_timeout`, 5 s) to
/// return; what is left is unwound". A fiber whose cleanup waits for a lock
/// held by a fiber that is inside a `fiber::blocking` call (both parked, but
/// the blocking call makes progress on its own) must be allowed to finish
/// its cleanup well within the grace time.
#[test]
fn shutdown_grace_is_not_cut_short_while_a_blocking_call_is_in_flight() {
    within(40, || {
        let rt = fiber::Runtime::builder()
            .workers(2)
            .shutdown_timeout(Duration::from_secs(10))
            .build()
            .unwrap();
        let lock = Arc::new(fiber::sync::Mutex::new(0u32));
        let cleaned = Arc::new(AtomicBool::new(false));
        let flushed = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let lock = lock.clone();
            let flushed = flushed.clone();
            let tx = tx.clone();
            // The flusher: on cancellation, holds the lock across a 300 ms
            // blocking write.
            rt.spawn(move || {
                let _ = tx.send(());
                let _ = fiber::sleep(Duration::MAX);
                let mut g = lock.lock().unwrap();
                fiber::blocking(|| std::thread::sleep(ms(300)));
                *g += 1;
                flushed.store(true, Ordering::SeqCst);
            });
        }
        {
            let lock = lock.clone();
            let cleaned = cleaned.clone();
            rt.spawn(move || {
                let _ = tx.send(());
                let _ = fiber::sleep(Duration::MAX);
                // Let the flusher take the lock first.
                std::thread::sleep(ms(20));
                let g = lock.lock().unwrap();
                assert_eq!(*g, 1);
                cleaned.store(true, Ordering::SeqCst);
            });
        }
        rx.recv().unwrap();
        rx.recv().unwrap();
        std::thread::sleep(ms(50));
        let t = Instant::now();
        drop(rt);
        let took = t.elapsed();
        eprintln!(
            "PROBE grace: flushed={} cleaned={} shutdown took {took:?}",
            flushed.load(Ordering::SeqCst),
            cleaned.load(Ordering::SeqCst)
        );
        assert!(
            flushed.load(Ordering::SeqCst),
            "the flusher's blocking write was cut short"
        );
        assert!(
            cleaned.load(Ordering::SeqCst),
            "the second fiber's cleanup was unwound after ~50 ms although the grace time is 10 s and \
             the lock would be released after 300 ms (shutdown took {took:?})"
        );
    })
}

/// Simplest form: a fiber whose cleanup is a blocking call followed by more
/// cleanup code runs that cleanup on a worker within the grace time.
#[test]
fn a_cleanup_blocking_call_within_the_grace_time_completes_on_a_worker() {
    within(40, || {
        let rt = fiber::Runtime::builder()
            .workers(1)
            .thread_name("probe-w")
            .shutdown_timeout(Duration::from_secs(10))
            .build()
            .unwrap();
        let where_ = Arc::new(Mutex::new(String::new()));
        let w = where_.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        rt.spawn(move || {
            let _ = tx.send(());
            let _ = fiber::sleep(Duration::MAX);
            fiber::blocking(|| std::thread::sleep(ms(200)));
            fiber::blocking(|| std::thread::sleep(ms(200)));
            *w.lock().unwrap() = std::thread::current().name().unwrap_or("?").to_string();
        });
        rx.recv().unwrap();
        std::thread::sleep(ms(20));
        drop(rt);
        let at = where_.lock().unwrap().clone();
        eprintln!("PROBE cleanup ran on: {at:?}");
        assert!(
            at.starts_with("probe-w"),
            "cleanup did not run on a worker (ran on {at:?}): the grace time was cut short"
        );
    })
}

/// adversarial/handles.rs establishes that a plain thread in
/// `Handle::block_on` returns (with a panic) when the runtime is dropped.
/// The same with the root fiber inside a short `fiber::blocking` call: the
/// call ends after 300 ms, so `block_on` must return soon after, not hang.
#[test]
fn block_on_returns_when_the_runtime_is_dropped_during_a_blocking_call() {
    in_child(
        "block_on_returns_when_the_runtime_is_dropped_during_a_blocking_call",
        40,
        || {
            let rt = fiber::Runtime::builder()
                .workers(2)
                .shutdown_timeout(Duration::from_secs(5))
                .build()
                .unwrap();
            let handle = rt.handle();
            let (tx, rx) = std::sync::mpsc::channel();
            let (in_tx, in_rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    handle.block_on(move || {
                        fiber::blocking(move || {
                            in_tx.send(()).unwrap();
                            std::thread::sleep(ms(300));
                        });
                        "returned"
                    })
                }));
                let _ = tx.send(r.map_err(|p| {
                    p.downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                }));
            });
            in_rx.recv().unwrap();
            let t = Instant::now();
            drop(rt);
            eprintln!("PROBE drop took {:?}", t.elapsed());
            match rx.recv_timeout(Duration::from_secs(15)) {
                Ok(r) => eprintln!("PROBE block_on ended: {r:?}"),
                Err(_) => panic!(
                    "hang: Handle::block_on never returned after the runtime was dropped while its root \
                     fiber was in a 300 ms fiber::blocking call"
                ),
            }
        },
    );
}

/// A plain thread joining a fiber that is inside a short `fiber::blocking`
/// call when the runtime is dropped: the join must end (Ok or an error).
#[test]
fn join_from_a_thread_ends_when_the_runtime_is_dropped_during_a_blocking_call() {
    in_child(
        "join_from_a_thread_ends_when_the_runtime_is_dropped_during_a_blocking_call",
        40,
        || {
            let rt = fiber::Runtime::builder().workers(2).build().unwrap();
            let (in_tx, in_rx) = std::sync::mpsc::channel();
            let h = rt.spawn(move || {
                fiber::blocking(move || {
                    in_tx.send(()).unwrap();
                    std::thread::sleep(ms(300));
                });
                5
            });
            in_rx.recv().unwrap();
            drop(rt);
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let _ = tx.send(h.join().map_err(|e| e.to_string()));
            });
            match rx.recv_timeout(Duration::from_secs(15)) {
                Ok(r) => eprintln!("PROBE join ended: {r:?}"),
                Err(_) => panic!("hang: joining a fiber that was in fiber::blocking at shutdown never returns"),
            }
        },
    );
}

/// Dropping a runtime from one of its own blocking-pool threads (while the
/// calling fiber is parked in `fiber::blocking`): the README's rule "a
/// runtime cannot wait for itself" applies, as for a drop inside one of its
/// fibers: the drop panics naming the misuse, the shutdown goes on on a
/// thread of its own, and the caller's `block_on` returns (the root was
/// cancelled by that shutdown), never hangs.
#[test]
fn dropping_a_runtime_from_its_own_blocking_pool_thread_is_refused_and_does_not_hang() {
    in_child(
        "dropping_a_runtime_from_its_own_blocking_pool_thread_is_refused_and_does_not_hang",
        40,
        || {
            let rt = fiber::Runtime::builder()
                .workers(1)
                .shutdown_timeout(ms(200))
                .build()
                .unwrap();
            let slot = Arc::new(Mutex::new(None::<fiber::Runtime>));
            let refusal = Arc::new(Mutex::new(None::<String>));
            let handle = rt.handle();
            *slot.lock().unwrap() = Some(rt);
            let (s, seen) = (slot.clone(), refusal.clone());
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    handle.block_on(move || {
                        fiber::blocking(move || {
                            let rt = s.lock().unwrap().take();
                            *seen.lock().unwrap() = panic_message(move || drop(rt));
                        })
                    })
                }));
                let _ = tx.send(r.is_ok());
            });
            rx.recv_timeout(Duration::from_secs(20))
                .expect("hang: dropping the runtime from its own blocking-pool thread never returned");
            let msg = refusal.lock().unwrap().clone();
            assert!(
                msg.as_deref().is_some_and(|m| m.contains("cannot wait for itself")),
                "the drop was not refused: {msg:?}"
            );
        },
    );
}

/// A blocking call that outlives the grace time: its fiber is abandoned
/// (it cannot be unwound while the call may use its stack), and a plain
/// thread joining it gets a cancellation instead of waiting forever.
#[test]
fn join_of_a_fiber_abandoned_in_a_long_blocking_call_ends_cancelled() {
    in_child(
        "join_of_a_fiber_abandoned_in_a_long_blocking_call_ends_cancelled",
        40,
        || {
            let rt = fiber::Runtime::builder()
                .workers(1)
                .shutdown_timeout(ms(100))
                .build()
                .unwrap();
            let (in_tx, in_rx) = std::sync::mpsc::channel();
            let h = rt.spawn(move || {
                fiber::blocking(move || {
                    in_tx.send(()).unwrap();
                    std::thread::sleep(ms(3_000));
                });
                5
            });
            in_rx.recv().unwrap();
            drop(rt);
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let _ = tx.send(h.join().map_err(|e| e.is_cancelled()));
            });
            let r = rx
                .recv_timeout(Duration::from_secs(2))
                .expect("joining a fiber abandoned at shutdown never returned");
            assert_eq!(r, Err(true), "an abandoned fiber's join reports a cancellation");
        },
    );
}

/// A fiber still in a `fiber::blocking` call when the grace time ends is
/// given up (the call's closure may borrow its stack, so it is never
/// unwound). The shutdown report said it was "parked on a wait nothing
/// completes, or catching the shutdown unwind", which sends the reader
/// looking for the wrong bug; it now names the blocking call.
#[test]
fn a_fiber_in_a_blocking_call_at_teardown_is_reported_as_such() {
    const CHILD: &str = "FIBER_TEST_BLOCKING_REPORT_CHILD";
    if std::env::var_os(CHILD).is_some() {
        let rt = fiber::Runtime::builder()
            .workers(2)
            .shutdown_timeout(ms(100))
            .build()
            .unwrap();
        let started = Arc::new(AtomicBool::new(false));
        let s = started.clone();
        rt.spawn(move || {
            fiber::blocking(move || {
                s.store(true, Ordering::SeqCst);
                std::thread::sleep(ms(1500));
            })
        });
        while !started.load(Ordering::SeqCst) {
            std::thread::sleep(ms(1));
        }
        drop(rt);
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            &crate::common::full_test_name("a_fiber_in_a_blocking_call_at_teardown_is_reported_as_such"),
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr
            .contains("1 fiber(s) could not be unwound now (waiting for a fiber::blocking call that has not returned"),
        "{stderr}"
    );
}

/// What a fiber given up on inside a long blocking call owns is released
/// once the call returns: the fiber is unwound then (by the runtime's
/// reaper), so its socket's descriptor is closed. It stayed open for the
/// rest of the process, with everything else the fiber owned.
#[test]
fn a_fiber_given_up_on_in_a_blocking_call_is_unwound_when_the_call_returns() {
    in_child(
        "a_fiber_given_up_on_in_a_blocking_call_is_unwound_when_the_call_returns",
        40,
        || {
            fn fds() -> usize {
                std::fs::read_dir("/proc/self/fd").unwrap().count()
            }
            static DROPPED: AtomicBool = AtomicBool::new(false);
            struct Owned;
            impl Drop for Owned {
                fn drop(&mut self) {
                    DROPPED.store(true, Ordering::SeqCst);
                }
            }
            // Start the I/O driver first: its descriptors are not the fiber's.
            drop(fiber::net::UdpSocket::bind("127.0.0.1:0").unwrap());
            let base = fds();
            let rt = fiber::Runtime::builder()
                .workers(2)
                .shutdown_timeout(ms(100))
                .build()
                .unwrap();
            let socket = fiber::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            let (in_tx, in_rx) = std::sync::mpsc::channel();
            let owned = Owned;
            rt.spawn(move || {
                let (_socket, _owned) = (socket, owned);
                fiber::blocking(move || {
                    in_tx.send(()).unwrap();
                    std::thread::sleep(ms(600));
                });
            });
            in_rx.recv().unwrap();
            drop(rt);
            assert!(
                !DROPPED.load(Ordering::SeqCst),
                "still in its call when the runtime was dropped"
            );
            let until = Instant::now() + Duration::from_secs(20);
            while !(DROPPED.load(Ordering::SeqCst) && fds() <= base) {
                assert!(
                    Instant::now() < until,
                    "never unwound: {} descriptors, {base} before",
                    fds()
                );
                std::thread::sleep(ms(10));
            }
        },
    );
}

/// The same while another worker is stuck in a fiber that never yields:
/// shutdown then hands the rest to a reaper thread, which unwound what the
/// stuck worker left but never waited for the blocking calls, so a fiber
/// inside one was given up on for good (its values never dropped).
#[test]
fn a_fiber_in_a_blocking_call_is_unwound_when_a_worker_is_stuck_too() {
    in_child(
        "a_fiber_in_a_blocking_call_is_unwound_when_a_worker_is_stuck_too",
        40,
        || {
            static DROPPED: AtomicBool = AtomicBool::new(false);
            struct Owned;
            impl Drop for Owned {
                fn drop(&mut self) {
                    DROPPED.store(true, Ordering::SeqCst);
                }
            }
            let rt = rt_fixed_grace(2, ms(100));
            let stop = Arc::new(AtomicBool::new(false));
            let (in_tx, in_rx) = std::sync::mpsc::channel();
            let spinning = in_tx.clone();
            let s = stop.clone();
            // Never yields until released, after the runtime is dropped.
            rt.spawn(move || {
                spinning.send(()).unwrap();
                while !s.load(Ordering::SeqCst) {
                    std::hint::spin_loop();
                }
            });
            let owned = Owned;
            rt.spawn(move || {
                let _owned = owned;
                // Longer than the stuck worker: the reaper's teardown comes
                // while the call still runs.
                fiber::blocking(move || {
                    in_tx.send(()).unwrap();
                    std::thread::sleep(ms(4000));
                });
            });
            in_rx.recv().unwrap();
            in_rx.recv().unwrap();
            let releaser = std::thread::spawn(move || {
                std::thread::sleep(ms(2500));
                stop.store(true, Ordering::SeqCst);
            });
            drop(rt);
            let until = Instant::now() + Duration::from_secs(20);
            while !DROPPED.load(Ordering::SeqCst) {
                assert!(
                    Instant::now() < until,
                    "the fiber in the blocking call was never unwound"
                );
                std::thread::sleep(ms(10));
            }
            releaser.join().unwrap();
        },
    );
}

/// Sets its flag when dropped.
struct Flag(&'static AtomicBool);

impl Drop for Flag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// One fixed worker, a blocking pool of one thread, a short grace time.
fn one_blocking_thread() -> fiber::Runtime {
    fiber::Runtime::builder()
        .workers(1)
        .max_workers(1)
        .max_blocking_threads(1)
        .shutdown_timeout(ms(100))
        .build()
        .unwrap()
}

/// Spawn a fiber whose blocking call holds the pool's one thread until the
/// returned sender sends (or is dropped); returns once the call runs.
fn occupy_the_pool_thread(rt: &fiber::Runtime) -> std::sync::mpsc::Sender<()> {
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    rt.spawn(move || {
        fiber::blocking(move || {
            started_tx.send(()).unwrap();
            let _ = release_rx.recv();
        })
    });
    started_rx.recv().unwrap();
    release_tx
}

/// A call still queued when the runtime shuts down (every blocking thread
/// busy) never starts: its closure is dropped unrun, as tokio's blocking
/// pool drops a `spawn_blocking` task that has not started, and its fiber
/// is unwound once teardown resumes it. Before, the closure ran after the
/// runtime was gone, whenever a thread came free.
#[test]
fn a_call_still_queued_at_shutdown_is_dropped_unrun_and_its_fiber_unwound() {
    in_child(
        "a_call_still_queued_at_shutdown_is_dropped_unrun_and_its_fiber_unwound",
        40,
        || {
            static RAN: AtomicBool = AtomicBool::new(false);
            static CLOSURE_DROPPED: AtomicBool = AtomicBool::new(false);
            static STACK_DROPPED: AtomicBool = AtomicBool::new(false);
            let rt = one_blocking_thread();
            // The pool's one thread: busy until released.
            let release_tx = occupy_the_pool_thread(&rt);
            // A second call, queued behind it.
            rt.spawn(|| {
                let _on_stack = Flag(&STACK_DROPPED);
                let in_closure = Flag(&CLOSURE_DROPPED);
                fiber::blocking(move || {
                    let _in_closure = in_closure;
                    RAN.store(true, Ordering::SeqCst);
                });
            });
            crate::common::wait_parked(&rt, 2);
            drop(rt);
            // The closure goes back to its fiber, which drops it as it
            // unwinds, once no call of the runtime is in flight any more.
            release_tx.send(()).unwrap();
            let until = Instant::now() + Duration::from_secs(20);
            while !(CLOSURE_DROPPED.load(Ordering::SeqCst) && STACK_DROPPED.load(Ordering::SeqCst)) {
                assert!(
                    Instant::now() < until,
                    "the queued call's fiber was never unwound (closure dropped: {})",
                    CLOSURE_DROPPED.load(Ordering::SeqCst)
                );
                std::thread::sleep(ms(10));
            }
            // (It never reached a thread: the queue was emptied at shutdown.)
            assert!(
                !RAN.load(Ordering::SeqCst),
                "the queued call ran after the runtime was dropped"
            );
        },
    );
}

/// A destructor that runs after its fiber's body (the fiber's value,
/// dropped at teardown) and makes a blocking call that is still queued at
/// shutdown: teardown lets such a destructor run to its end (its waits
/// return `Cancelled` instead of unwinding), so the call, handed back
/// unrun, runs on the fiber itself and the destructor finishes.
static AFTER_BODY_DROP_FINISHED: AtomicBool = AtomicBool::new(false);
static AFTER_BODY_PANICS: AtomicUsize = AtomicUsize::new(0);

struct AfterBodyFlush;
impl Drop for AfterBodyFlush {
    fn drop(&mut self) {
        fiber::blocking(|| ());
        AFTER_BODY_DROP_FINISHED.store(true, Ordering::SeqCst);
    }
}

#[test]
fn a_value_destructors_blocking_call_queued_at_shutdown_does_not_panic() {
    in_child(
        "a_value_destructors_blocking_call_queued_at_shutdown_does_not_panic",
        40,
        || {
            let hook = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                if info.to_string().contains("fiber::blocking") {
                    AFTER_BODY_PANICS.fetch_add(1, Ordering::SeqCst);
                }
                hook(info)
            }));
            let rt = one_blocking_thread();
            // The pool's only thread: busy until released (after the drop).
            let release_tx = occupy_the_pool_thread(&rt);
            // Returns a value after its cancellation: the fiber drops it after
            // its body, and the value's destructor queues a blocking call.
            rt.spawn(|| {
                let _ = fiber::sleep(Duration::MAX);
                AfterBodyFlush
            });
            crate::common::wait_parked(&rt, 2);
            drop(rt);
            release_tx.send(()).unwrap();
            let until = Instant::now() + Duration::from_secs(10);
            while !AFTER_BODY_DROP_FINISHED.load(Ordering::SeqCst) && AFTER_BODY_PANICS.load(Ordering::SeqCst) == 0 {
                assert!(Instant::now() < until, "the fiber was never taken back");
                std::thread::sleep(ms(10));
            }
            assert_eq!(
                AFTER_BODY_PANICS.load(Ordering::SeqCst),
                0,
                "fiber::blocking panicked in a destructor run after the body (cut short: finished={})",
                AFTER_BODY_DROP_FINISHED.load(Ordering::SeqCst)
            );
            assert!(
                AFTER_BODY_DROP_FINISHED.load(Ordering::SeqCst),
                "the destructor did not run to its end"
            );
        },
    );
}

/// Waits until every flag is set, or `secs` pass; says which.
fn wait_for(flags: &[&AtomicBool], secs: u64) -> bool {
    let until = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < until {
        if flags.iter().all(|f| f.load(Ordering::SeqCst)) {
            return true;
        }
        std::thread::sleep(ms(10));
    }
    false
}

/// Fibers given up on in blocking calls are taken back only once no call
/// of the runtime is in flight. Taking one back as soon as its own call
/// returned let its destructor wait for a lock that a fiber still in its
/// call held, and the unwinding wait's bound aborted the process.
#[test]
fn a_destructor_locking_what_a_later_fiber_holds_in_its_call_does_not_abort() {
    in_child(
        "a_destructor_locking_what_a_later_fiber_holds_in_its_call_does_not_abort",
        30,
        || {
            static A_DONE: AtomicBool = AtomicBool::new(false);
            static B_DONE: AtomicBool = AtomicBool::new(false);
            struct LockOnDrop(std::sync::Arc<fiber::sync::Mutex<u32>>);
            impl Drop for LockOnDrop {
                fn drop(&mut self) {
                    *self.0.lock().unwrap() += 1;
                    B_DONE.store(true, Ordering::SeqCst);
                }
            }
            let rt = fiber::Runtime::builder()
                .workers(2)
                .max_workers(2)
                .shutdown_timeout(ms(50))
                .build()
                .unwrap();
            let m = std::sync::Arc::new(fiber::sync::Mutex::new(0u32));
            let (locked_tx, locked_rx) = std::sync::mpsc::channel::<()>();
            let mb = m.clone();
            let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
            rt.spawn(move || {
                let _flush = LockOnDrop(mb);
                // Wait (for real) until A holds the mutex.
                fiber::blocking(move || {
                    go_rx.recv().unwrap();
                    std::thread::sleep(ms(300));
                });
                let _ = fiber::sleep(Duration::MAX);
            });
            rt.spawn(move || {
                let g = m.lock().unwrap();
                locked_tx.send(()).unwrap();
                fiber::blocking(|| std::thread::sleep(ms(1500)));
                drop(g);
                A_DONE.store(true, Ordering::SeqCst);
            });
            locked_rx.recv().unwrap();
            go_tx.send(()).unwrap();
            crate::common::wait_parked(&rt, 2);
            drop(rt);
            assert!(
                wait_for(&[&A_DONE, &B_DONE], 10),
                "A done {}, B done {}",
                A_DONE.load(Ordering::SeqCst),
                B_DONE.load(Ordering::SeqCst)
            );
        },
    );
}

/// The same guard from the other side: a given-up fiber taken back early
/// made its next blocking call inline on the reaper thread, which then
/// waited for a sender that a fiber still in its call owned, for ever.
#[test]
fn a_second_blocking_call_of_a_given_up_fiber_does_not_hold_the_reaper() {
    in_child(
        "a_second_blocking_call_of_a_given_up_fiber_does_not_hold_the_reaper",
        30,
        || {
            static A_DONE: AtomicBool = AtomicBool::new(false);
            static B_DONE: AtomicBool = AtomicBool::new(false);
            let rt = fiber::Runtime::builder()
                .workers(2)
                .max_workers(2)
                .shutdown_timeout(ms(50))
                .build()
                .unwrap();
            let (tx, rx) = std::sync::mpsc::channel::<()>();
            rt.spawn(move || {
                let _f = Flag(&A_DONE);
                fiber::blocking(|| std::thread::sleep(ms(300)));
                let _ = fiber::blocking(move || rx.recv());
            });
            rt.spawn(move || {
                let _f = Flag(&B_DONE);
                let _tx = tx;
                fiber::blocking(|| std::thread::sleep(ms(1500)));
            });
            crate::common::wait_parked(&rt, 2);
            drop(rt);
            assert!(
                wait_for(&[&A_DONE, &B_DONE], 10),
                "reaper stuck: A done {}, B done {}",
                A_DONE.load(Ordering::SeqCst),
                B_DONE.load(Ordering::SeqCst)
            );
        },
    );
}

/// Scopes two deep whose innermost children are in `fiber::blocking` calls
/// at shutdown: both scope owners (and the outer fiber) run to their ends
/// once the calls return, every destructor once.
#[test]
fn nested_scopes_over_blocking_children_at_shutdown_end_after_the_calls() {
    in_child(
        "nested_scopes_over_blocking_children_at_shutdown_end_after_the_calls",
        30,
        || {
            static DROPS: AtomicUsize = AtomicUsize::new(0);
            struct Counted;
            impl Drop for Counted {
                fn drop(&mut self) {
                    DROPS.fetch_add(1, Ordering::SeqCst);
                }
            }
            let rt = rt_fixed_grace(2, ms(50));
            let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
            rt.spawn(move || {
                let _outer = Counted;
                fiber::scope(|s| {
                    s.spawn(|| {
                        let _middle = Counted;
                        fiber::scope(|s| {
                            for _ in 0..2 {
                                let ready = ready_tx.clone();
                                s.spawn(move || {
                                    let _inner = Counted;
                                    ready.send(()).unwrap();
                                    fiber::blocking(|| std::thread::sleep(ms(400)));
                                });
                            }
                        });
                    });
                });
            });
            for _ in 0..2 {
                ready_rx.recv().unwrap();
            }
            crate::common::wait_parked(&rt, 4);
            drop(rt);
            let start = Instant::now();
            while DROPS.load(Ordering::SeqCst) < 4 && start.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(ms(10));
            }
            assert_eq!(
                DROPS.load(Ordering::SeqCst),
                4,
                "outer, middle and two inner destructors"
            );
        },
    );
}
