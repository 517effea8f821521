//! The facade as a user sees it: std-style threads-and-channels code, run
//! on fibers. Only `fiber::` items are used.

use fiber::chan::{bounded, unbounded, RecvError, RecvTimeoutError, SendError, TrySendError};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[test]
fn run_returns_the_value_and_can_run_again_from_any_thread() {
    assert_eq!(fiber::run(|| 1 + 1), 2);
    assert_eq!(fiber::run(|| 3), 3);
    let other = std::thread::spawn(|| fiber::run(|| "from another thread"));
    assert_eq!(other.join().unwrap(), "from another thread");
}

#[test]
fn run_reraises_the_root_panic_with_its_payload() {
    let code = std::hint::black_box(42);
    let err =
        std::panic::catch_unwind(move || fiber::run(move || -> u8 { panic!("root failure {code}") })).unwrap_err();
    assert_eq!(
        err.downcast_ref::<String>().map(String::as_str),
        Some("root failure 42")
    );
}

#[test]
fn spawn_join_like_std_thread() {
    fiber::run(|| {
        let handle = fiber::spawn(|| 6 * 7);
        assert_eq!(handle.join().unwrap(), 42);
        let failing = fiber::spawn(|| -> () { panic!("child panic") });
        let err = failing.join().unwrap_err();
        assert!(err.is_panic());
        assert_eq!(*err.into_panic().downcast::<&str>().unwrap(), "child panic");
    });
}

#[test]
fn join_handle_is_send_and_reports_finished() {
    fn assert_send<T: Send>(_: &T) {}
    fiber::run(|| {
        let handle = fiber::spawn(|| 5);
        assert_send(&handle);
        while !handle.is_finished() {
            let _ = fiber::yield_now();
        }
        assert_eq!(handle.join().unwrap(), 5);
    });
}

#[test]
fn dropping_a_join_handle_detaches_the_fiber() {
    let done = Arc::new(AtomicUsize::new(0));
    let counted = done.clone();
    fiber::run(move || {
        let (tx, rx) = bounded(0);
        drop(fiber::spawn(move || {
            counted.fetch_add(1, Ordering::Relaxed);
            tx.send(()).unwrap();
        }));
        rx.recv().unwrap();
    });
    assert_eq!(done.load(Ordering::Relaxed), 1);
}

#[test]
fn cancel_a_parked_fiber() {
    fiber::run(|| {
        let (_tx, rx) = bounded::<u8>(0);
        let handle = fiber::spawn(move || rx.recv());
        let _ = fiber::sleep(Duration::from_millis(5));
        handle.cancel();
        assert!(handle.join().unwrap_err().is_cancelled());
    });
}

#[test]
fn channels_between_many_fibers() {
    let total = fiber::run(|| {
        let (tx, rx) = bounded(0);
        for p in 0..10u64 {
            let tx = tx.clone();
            fiber::spawn(move || {
                for i in 0..100 {
                    tx.send(p * 100 + i).unwrap();
                }
            });
        }
        drop(tx);
        rx.iter().sum::<u64>()
    });
    assert_eq!(total, (0..1000).sum::<u64>());
}

#[test]
fn channel_errors_return_values() {
    fiber::run(|| {
        let (tx, rx) = bounded::<String>(1);
        tx.send("a".into()).unwrap();
        assert_eq!(tx.try_send("b".into()), Err(TrySendError::Full("b".into())));
        drop(rx);
        assert_eq!(tx.send("c".into()), Err(SendError("c".into())));
        let (tx, rx) = unbounded::<u8>();
        drop(tx);
        assert_eq!(rx.recv(), Err(RecvError));
        let (_tx, rx) = bounded::<u8>(0);
        assert_eq!(
            rx.recv_timeout(Duration::from_millis(5)),
            Err(RecvTimeoutError::Timeout)
        );
    });
}

#[test]
fn select_with_timeout() {
    fiber::run(|| {
        let (tx, rx) = bounded::<u8>(0);
        let late = fiber::spawn(move || {
            let _ = fiber::sleep(Duration::from_millis(50));
            let _ = tx.send(1);
        });
        let start = Instant::now();
        let got = fiber::select! {
            recv(rx) -> v => v.ok(),
            default(Duration::from_millis(10)) => None,
        };
        assert_eq!(got, None);
        assert!(start.elapsed() >= Duration::from_millis(10));
        assert_eq!(rx.recv(), Ok(1));
        late.join().unwrap();
    });
}

#[test]
fn sleep_never_wakes_early() {
    fiber::run(|| {
        let start = Instant::now();
        let _ = fiber::sleep(Duration::from_millis(20));
        assert!(start.elapsed() >= Duration::from_millis(20));
        let deadline = Instant::now() + Duration::from_millis(5);
        let _ = fiber::sleep_until(deadline);
        assert!(Instant::now() >= deadline);
    });
}

#[test]
fn scope_borrows_from_the_caller() {
    fiber::run(|| {
        let data = [1u32, 2, 3, 4, 5, 6];
        let mut results = Vec::new();
        fiber::scope(|s| {
            let handles: Vec<_> = data.chunks(2).map(|c| s.spawn(move || c.iter().sum::<u32>())).collect();
            results = handles.into_iter().map(|h| h.join().unwrap()).collect();
        });
        assert_eq!(results, [3, 7, 11]);
    });
}

#[test]
fn try_scope_returns_the_first_error() {
    fiber::run(|| {
        let r: Result<(), String> = fiber::try_scope(|s| {
            s.spawn(|| Err::<(), _>("boom".to_string()));
            Ok(())
        });
        assert_eq!(r, Err("boom".to_string()));
    });
}

#[test]
fn with_timeout_and_supervisor_scope() {
    fiber::run(|| {
        assert_eq!(
            fiber::with_timeout(Duration::from_millis(10), || fiber::sleep(Duration::from_secs(5))),
            Err(fiber::TimedOut)
        );
        let (a, b) = fiber::supervisor_scope(|s| {
            let bad = s.spawn(|| -> u8 { panic!("supervised") });
            let good = s.spawn(|| 1u8);
            (bad.join().is_err(), good.join().unwrap())
        });
        assert!(a);
        assert_eq!(b, 1);
    });
}

#[test]
fn blocking_calls_do_not_stall_other_fibers() {
    let rt = fiber::Runtime::builder().workers(1).max_workers(2).build().unwrap();
    rt.block_on(|| {
        let blocker = fiber::spawn(|| fiber::blocking(|| std::thread::sleep(Duration::from_millis(100))));
        let quick = fiber::spawn(|| 7);
        assert_eq!(quick.join().unwrap(), 7);
        blocker.join().unwrap();
    });
}

fiber::fiber_local! {
    static DEPTH: Cell<u32> = Cell::new(0);
    static NAMES: Mutex<Vec<String>> = Mutex::new(Vec::new());
}

#[test]
fn fiber_locals_are_per_fiber_and_survive_migration() {
    fiber::run(|| {
        let handles: Vec<_> = (0..50u32)
            .map(|i| {
                fiber::spawn(move || {
                    DEPTH.with(|d| d.set(i));
                    for _ in 0..10 {
                        let _ = fiber::yield_now();
                        let _ = fiber::sleep(Duration::from_micros(100));
                        assert_eq!(DEPTH.with(|d| d.get()), i, "the value follows the fiber across workers");
                    }
                    NAMES.with(|n| n.lock().unwrap().push(format!("f{i}")));
                    NAMES.with(|n| n.lock().unwrap().len())
                })
            })
            .collect();
        for h in handles {
            assert_eq!(h.join().unwrap(), 1, "each fiber has its own list");
        }
    });
}

#[test]
fn builder_rejects_bad_settings_with_an_error() {
    let err = fiber::Runtime::builder().workers(0).build().unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    assert!(err.to_string().contains("workers"), "{err}");
    let err = fiber::Runtime::builder().stack_size(1024).build().unwrap_err();
    assert!(err.to_string().contains("stack_size"), "{err}");
    let err = fiber::Runtime::builder().workers(4).max_workers(2).build().unwrap_err();
    assert!(err.to_string().contains("max_workers"), "{err}");
}

#[test]
fn thread_hooks_run_on_every_worker() {
    let started = Arc::new(AtomicUsize::new(0));
    let stopped = Arc::new(AtomicUsize::new(0));
    let (s, t) = (started.clone(), stopped.clone());
    let rt = fiber::Runtime::builder()
        .workers(2)
        .max_workers(2)
        .thread_name("hooked")
        .on_thread_start(move || {
            s.fetch_add(1, Ordering::Relaxed);
        })
        .on_thread_stop(move || {
            t.fetch_add(1, Ordering::Relaxed);
        })
        .build()
        .unwrap();
    assert_eq!(
        rt.block_on(|| std::thread::current().name().map(|n| n.starts_with("hooked"))),
        Some(true)
    );
    rt.shutdown_timeout(Duration::from_secs(1));
    assert_eq!(started.load(Ordering::Relaxed), 2);
    assert_eq!(stopped.load(Ordering::Relaxed), 2);
}

#[test]
fn misuse_outside_a_runtime_names_the_function() {
    for (name, f) in [
        (
            "spawn",
            Box::new(|| drop(fiber::spawn(|| ()))) as Box<dyn Fn() + std::panic::RefUnwindSafe>,
        ),
        (
            "sleep",
            Box::new(|| {
                let _ = fiber::sleep(Duration::from_millis(1));
            }),
        ),
        ("stats", Box::new(|| drop(fiber::stats()))),
        ("current", Box::new(|| drop(fiber::current()))),
    ] {
        let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_err();
        let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.contains(&format!("fiber::{name} called outside a fiber")), "{msg}");
        assert!(msg.contains("fiber::run"), "says how to start one: {msg}");
    }
}

#[test]
fn stats_inside_a_runtime() {
    fiber::run(|| {
        let handles: Vec<_> = (0..10).map(|_| fiber::spawn(|| ())).collect();
        for h in handles {
            h.join().unwrap();
        }
        let stats = fiber::stats();
        assert!(stats.runtime.spawns >= 10);
        assert!(stats.runtime.workers >= 1);
    });
}

#[test]
fn plain_threads_and_fibers_share_channels() {
    let (tx, rx) = bounded::<u32>(0);
    let consumer = std::thread::spawn(move || rx.iter().sum::<u32>());
    fiber::run(move || {
        for i in 0..100 {
            tx.send(i).unwrap();
        }
    });
    assert_eq!(consumer.join().unwrap(), 4950);
}

#[test]
fn a_panic_in_drop_of_a_cancelled_fibers_value_reaches_the_joiner() {
    struct ExplodesOnDrop;
    impl Drop for ExplodesOnDrop {
        fn drop(&mut self) {
            panic!("drop panicked");
        }
    }
    fiber::run(|| {
        let (_tx, rx) = bounded::<u8>(0);
        let handle = fiber::spawn(move || {
            let _bomb = ExplodesOnDrop;
            let _ = rx.recv(); // parked until cancelled
        });
        let _ = fiber::sleep(Duration::from_millis(5));
        handle.cancel();
        let err = handle.join().unwrap_err();
        assert!(err.is_panic(), "the destructor's panic is the fiber's failure: {err}");
        assert_eq!(*err.into_panic().downcast::<&str>().unwrap(), "drop panicked");
        // The worker survived: the runtime still runs fibers.
        assert_eq!(fiber::spawn(|| 1).join().unwrap(), 1);
    });
}

#[test]
fn shutdown_mid_select_and_mid_rendezvous_runs_destructors_once() {
    struct Counted(Arc<AtomicUsize>);
    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
    let drops = Arc::new(AtomicUsize::new(0));
    let rt = fiber::Runtime::builder().workers(2).build().unwrap();
    let (tx, rx) = bounded::<u32>(0);
    let (_tx2, rx2) = bounded::<u32>(0);
    let parked = Arc::new(AtomicUsize::new(0));
    for i in 0..20 {
        let (tx, rx, rx2, drops, parked) = (tx.clone(), rx.clone(), rx2.clone(), drops.clone(), parked.clone());
        rt.spawn(move || {
            let _guard = Counted(drops);
            parked.fetch_add(1, Ordering::Relaxed);
            if i % 2 == 0 {
                let _ = tx.send(i); // mid-rendezvous: no receiver comes
            } else {
                fiber::select! {
                    recv(rx) -> _ => {},
                    recv(rx2) -> _ => {},
                }
            }
        });
    }
    while parked.load(Ordering::Relaxed) < 20 {
        std::thread::yield_now();
    }
    // Whether each fiber is parked yet or still runnable, shutdown must run
    // its destructor exactly once.
    let start = Instant::now();
    drop(rt);
    assert!(start.elapsed() < Duration::from_secs(5), "bounded shutdown");
    assert_eq!(drops.load(Ordering::Relaxed), 20, "each destructor ran exactly once");
    assert_eq!(tx.waiting(), (0, 0), "no waiter is left in the channel");
}

#[test]
fn park_and_unpark_like_std_thread() {
    fiber::run(|| {
        let (tx, rx) = bounded(1);
        let parked = fiber::spawn(move || {
            tx.send(fiber::current()).unwrap();
            fiber::park();
            "unparked"
        });
        let handle = rx.recv().unwrap();
        assert_eq!(handle.id(), parked.id());
        handle.unpark();
        assert_eq!(parked.join().unwrap(), "unparked");

        // A token made available before park is consumed at once.
        fiber::current().unpark();
        fiber::park();
        // park_timeout returns after the timeout without a token.
        let start = Instant::now();
        fiber::park_timeout(Duration::from_millis(10));
        assert!(start.elapsed() >= Duration::from_millis(10));

        // Unpark from a plain thread through the join handle's fiber().
        let waiting = fiber::spawn(|| {
            fiber::park();
            1
        });
        let fiber_handle = waiting.fiber();
        std::thread::spawn(move || fiber_handle.unpark()).join().unwrap();
        assert_eq!(waiting.join().unwrap(), 1);
    });
}

#[test]
fn scoped_children_park_and_unpark_through_their_own_token() {
    fiber::run(|| {
        let (tx, rx) = bounded(1);
        let woke = fiber::scope(|s| {
            let parked = s.spawn(move || {
                tx.send(fiber::current()).unwrap();
                // A spurious return is allowed: park until the flag says so.
                fiber::park();
                "unparked"
            });
            let handle = rx.recv().unwrap();
            assert_eq!(handle.id(), parked.id());
            handle.unpark();
            parked.join().unwrap()
        });
        assert_eq!(woke, "unparked");

        // A token made available before the child parks is consumed at once,
        // and a cancelled child's park returns.
        let outcome = fiber::scope(|s| {
            let child = s.spawn(|| {
                fiber::current().unpark();
                fiber::park();
                fiber::Job::current().cancel();
                fiber::park();
                fiber::is_cancelled()
            });
            child.join()
        });
        assert!(
            outcome.unwrap_err().is_cancelled(),
            "a job cancelled before it ended ends cancelled"
        );
    });
}
