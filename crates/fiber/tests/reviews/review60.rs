//! Adversarial review, round 60: the scheduler and the facade as a user
//! coming from `std::thread`, tokio and Go meets them: `FIBER_*` values at
//! their documented edges (whitespace, `+`, a space before a size suffix,
//! the largest numbers, mixed case where any case is allowed) and just
//! past them, non-UTF-8 values of every variable, tiny and unaligned
//! stacks, `block_on` from a `fiber::blocking` call, from another
//! runtime's fiber, from an `on_thread_stop` hook and from a worker thread
//! outside its fibers (a tracing span callback), nested `blocking`, a
//! spinning fiber beside a `with_timeout` deadline while the pool can
//! grow, `yield_now` round-robin on one worker, counters after
//! quiescence, shutdown grace of zero and `Duration::MAX`, joins across
//! two runtimes (one dropped meanwhile), thread names, and a root panic
//! whose payload panics when dropped.
//!
//! Expected: README "Configuration" and "Guarantees and caveats",
//! spec/sched.md, spec/facade.md, the rustdoc of `fiber`,
//! `fiber::runtime::Builder` and `Handle`, and std / tokio where fiber
//! documents no difference.

use crate::common::*;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tracing::span::Id;
use tracing::Subscriber;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// Counts its drops.
struct Guard(Arc<AtomicUsize>);

impl Drop for Guard {
    fn drop(&mut self) {
        self.0.fetch_add(1, SeqCst);
    }
}

/// The configuration error `Runtime::builder().config()` gives now.
fn config_error() -> fiber::ConfigError {
    fiber::Runtime::builder()
        .config()
        .expect_err("expected a configuration error")
}

// ---------------------------------------------------------------------------
// (a) `FIBER_*` values at and past their documented edges.

/// Every variable at an accepted edge at once: `+` and whitespace around a
/// count, the largest counts, a space before a size suffix in upper case,
/// the largest idle time (`u64::MAX` ms, never reached), a zero grace,
/// signal and unguarded words in odd case, switches spelled as words. The
/// values land as written and the runtime runs fibers, a blocking call
/// and a timer with them, and shuts down.
#[test]
fn every_variable_at_an_accepted_edge_builds_and_runs() {
    let envs = [
        ("FIBER_WORKERS", " +1 "),
        ("FIBER_MAX_WORKERS", "1024"),
        ("FIBER_STACK_SIZE", " 64 K "),
        ("FIBER_IDLE_TIMEOUT_MS", "18446744073709551615"),
        ("FIBER_SHUTDOWN_TIMEOUT_MS", "0"),
        ("FIBER_MAX_BLOCKING", "65536"),
        ("FIBER_DUMP_SIGNAL", " Usr2 "),
        ("FIBER_UNGUARDED", "ALLOW"),
        ("FIBER_IO_HARVEST", "on"),
        ("FIBER_IO_PARK", "no"),
        ("FIBER_STATS", "off"),
        ("FIBER_DEBUG_STALL", "yes"),
        ("FIBER_DEADLOCK_ABORT", "false"),
        ("FIBER_BACKTRACE", "0"),
        ("FIBER_TRACE_SPANS", "false"),
    ];
    let name = "every_variable_at_an_accepted_edge_builds_and_runs";
    if let Some((status, stderr)) = child_outcome(name, 30, &envs, || {
        let config = fiber::Runtime::builder().config().unwrap();
        assert_eq!(config.workers, 1);
        assert_eq!(config.max_workers, 1024);
        assert_eq!(config.stacks.size, 64 * 1024);
        assert_eq!(config.idle_timeout, Duration::from_millis(u64::MAX));
        assert_eq!(config.shutdown_timeout, Duration::ZERO);
        assert_eq!(config.max_blocking_threads, 65536);
        assert_eq!(config.dump_signal, Some(libc::SIGUSR2));
        assert!(config.io_harvest && !config.io_park && config.stall_report);
        assert!(!config.print_stats && !config.deadlock_abort && !config.fiber_spans);
        let rt = fiber::Runtime::new().unwrap();
        let got = rt.block_on(|| {
            let kids: Vec<_> = (0..4u64).map(|i| fiber::spawn(move || i * 10)).collect();
            fiber::sleep(ms(2)).unwrap();
            let b = fiber::blocking(|| 5u64);
            kids.into_iter().map(|k| k.join().unwrap()).sum::<u64>() + b
        });
        assert_eq!(got, 65);
        let t = Instant::now();
        drop(rt);
        assert!(t.elapsed() < Duration::from_secs(5), "shutdown took {:?}", t.elapsed());
    }) {
        assert!(status.success(), "child failed ({status:?}):\n{stderr}");
    }
}

/// Values just past an edge, or spelled in a way the README does not
/// list, are each an `InvalidInput` error naming the variable, also when
/// the builder sets the same value (a set variable is still checked).
#[test]
fn values_just_past_an_edge_are_errors_naming_the_variable() {
    in_child("values_just_past_an_edge_are_errors_naming_the_variable", 30, || {
        let cases: &[(&str, &str)] = &[
            ("FIBER_STACK_SIZE", "16 kb"),
            ("FIBER_STACK_SIZE", "1.5m"),
            ("FIBER_STACK_SIZE", "0"),
            ("FIBER_STACK_SIZE", "16383"),
            ("FIBER_STACK_SIZE", "1073741825"),
            ("FIBER_STACK_SIZE", " "),
            ("FIBER_WORKERS", "1_000"),
            ("FIBER_WORKERS", "\u{0661}"),
            ("FIBER_WORKERS", "-0"),
            ("FIBER_MAX_WORKERS", "1025"),
            ("FIBER_MAX_BLOCKING", "+-1"),
            ("FIBER_IDLE_TIMEOUT_MS", "18446744073709551616"),
            ("FIBER_SHUTDOWN_TIMEOUT_MS", "5s"),
            ("FIBER_DEBUG_STALL", "On"),
            ("FIBER_BACKTRACE", ""),
            ("FIBER_TRACE_SPANS", "2"),
            ("FIBER_DUMP_SIGNAL", "SIGUSR3"),
            ("FIBER_DUMP_SIGNAL", "10"),
            ("FIBER_UNGUARDED", ""),
        ];
        for (var, value) in cases {
            std::env::set_var(var, value);
            let e = config_error();
            assert_eq!(e.setting, *var, "{var}={value:?}: {e}");
            let io = fiber::Runtime::builder()
                .workers(1)
                .max_workers(1)
                .stack_size(64 * 1024)
                .max_blocking_threads(4)
                .idle_timeout(ms(100))
                .shutdown_timeout(ms(100))
                .build()
                .expect_err("a bad variable under a builder value still fails the build");
            assert_eq!(io.kind(), std::io::ErrorKind::InvalidInput);
            assert!(io.to_string().contains(var), "{var}={value:?}: {io}");
            std::env::remove_var(var);
        }
        assert!(fiber::Runtime::builder().config().is_ok());
    });
}

/// A value that is not UTF-8 is an error naming the variable, for every
/// variable the runtime reads (not only `FIBER_WORKERS`), and `fiber::run`
/// panics naming it instead of starting with a default.
#[test]
fn a_non_utf8_value_of_any_variable_is_an_error_naming_it() {
    in_child("a_non_utf8_value_of_any_variable_is_an_error_naming_it", 30, || {
        use std::os::unix::ffi::OsStrExt;
        let bad = std::ffi::OsStr::from_bytes(b"1\xff");
        for var in [
            "FIBER_WORKERS",
            "FIBER_MAX_WORKERS",
            "FIBER_STACK_SIZE",
            "FIBER_IDLE_TIMEOUT_MS",
            "FIBER_SHUTDOWN_TIMEOUT_MS",
            "FIBER_STATS",
            "FIBER_DEBUG_STALL",
            "FIBER_DEADLOCK_ABORT",
            "FIBER_DUMP_SIGNAL",
            "FIBER_BACKTRACE",
            "FIBER_IO_HARVEST",
            "FIBER_IO_PARK",
            "FIBER_TRACE_SPANS",
            "FIBER_UNGUARDED",
            "FIBER_MAX_BLOCKING",
        ] {
            std::env::set_var(var, bad);
            let e = config_error();
            assert_eq!(e.setting, var, "{e}");
            assert!(e.reason.contains("UTF-8"), "{e}");
            let msg = panic_message(|| fiber::run(|| ())).expect("fiber::run started anyway");
            assert!(msg.contains(var), "{msg}");
            std::env::remove_var(var);
        }
    });
}

// ---------------------------------------------------------------------------
// (b) Stacks: tiny, unaligned, huge, and an overflow.

/// The documented minimum stack (16 KiB) carries the runtime's own paths
/// in a debug build: a channel hand-off, a sleep, a join, a scope, a
/// `with_timeout` that fires and a panicking child whose join reports it
/// (panic hook without a backtrace: with `RUST_BACKTRACE=1` std's own
/// 16 KiB threads overflow printing one, too).
#[test]
fn the_minimum_stack_carries_the_runtimes_own_paths() {
    let name = "the_minimum_stack_carries_the_runtimes_own_paths";
    if let Some((status, stderr)) = child_outcome(name, 30, &[("RUST_BACKTRACE", "0")], || {
        let rt = fiber::Runtime::builder()
            .workers(2)
            .stack_size(16 * 1024)
            .shutdown_timeout(ms(300))
            .build()
            .unwrap();
        rt.block_on(|| {
            let (tx, rx) = fiber::chan::bounded(0);
            let h = fiber::spawn(move || {
                tx.send(1u32).unwrap();
                fiber::sleep(ms(1)).unwrap();
                2u32
            });
            assert_eq!(rx.recv().unwrap(), 1);
            assert_eq!(h.join().unwrap(), 2);
            assert_eq!(fiber::scope(|s| s.spawn(|| 3).join().unwrap()), 3);
            let t = fiber::with_timeout(ms(5), || fiber::sleep(Duration::from_secs(5)));
            assert!(t.is_err());
            let p = fiber::spawn(|| -> u32 { panic!("r60 small stack") });
            assert!(p.join().unwrap_err().is_panic());
        });
    }) {
        assert!(status.success(), "child failed ({status:?}):\n{stderr}");
    }
}

#[inline(never)]
fn recurse(depth: u64) -> u64 {
    let pad = std::hint::black_box([depth as u8; 512]);
    if depth == 0 {
        return pad[0] as u64;
    }
    recurse(depth - 1) + std::hint::black_box(pad[1]) as u64
}

/// Overflowing a 16 KiB stack hits its guard: the process aborts with the
/// runtime's report naming the fiber and the stack size, never a silent
/// corruption.
#[test]
fn overflowing_a_tiny_stack_is_a_clean_guard_report() {
    let name = "overflowing_a_tiny_stack_is_a_clean_guard_report";
    if let Some((status, stderr)) = child_outcome(name, 30, &[], || {
        let rt = fiber::Runtime::builder()
            .workers(1)
            .stack_size(16 * 1024)
            .build()
            .unwrap();
        let n = rt.block_on(|| fiber::spawn(|| recurse(100_000)).join());
        println!("survived: {n:?}");
    }) {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGABRT), "{status:?}:\n{stderr}");
        assert!(stderr.contains("has overflowed its stack"), "{stderr}");
        assert!(stderr.contains("16384"), "{stderr}");
    }
}

/// Stack sizes that are not page multiples work (runtime and spawn
/// builder); a spawn's stack above 1 GiB, up to `usize::MAX` (where
/// rounding up to a page would overflow), is an `InvalidInput` error, and
/// zero takes the pool's stack, as std's `Builder` accepts it.
#[test]
fn unaligned_and_extreme_stack_sizes_work_or_are_errors() {
    within(30, || {
        for size in [16 * 1024 + 1, 65_535, 100_001] {
            let rt = fiber::Runtime::builder()
                .workers(1)
                .max_workers(1)
                .stack_size(size)
                .build()
                .unwrap();
            let v = rt.block_on(|| {
                let a = fiber::spawn(|| 9).join().unwrap();
                let b = fiber::Builder::new()
                    .stack_size(size * 3 + 7)
                    .spawn(|| recurse(8))
                    .unwrap()
                    .join()
                    .unwrap();
                a + b
            });
            assert_eq!(v, 9 + recurse(8), "size {size}");
        }
        let e = fiber::Runtime::builder().stack_size(usize::MAX).build().unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("stack_size"), "{e}");
        rt1().block_on(|| {
            for size in [usize::MAX, usize::MAX - 4095, (1 << 30) + 1] {
                let e = fiber::Builder::new().stack_size(size).spawn(|| ()).unwrap_err();
                assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{size}: {e}");
            }
            assert_eq!(
                fiber::Builder::new().stack_size(0).spawn(|| 5).unwrap().join().unwrap(),
                5
            );
        });
    });
}

// ---------------------------------------------------------------------------
// (c) `block_on` and `blocking` from every kind of thread.

/// From a `fiber::blocking` call (a pool thread, not a worker), both a
/// captured handle's `block_on` and `Handle::current().block_on` work on
/// one fixed worker (the waiting fiber is parked, the worker free), as
/// tokio's `Handle::block_on` works in `spawn_blocking`.
#[test]
fn block_on_from_inside_a_blocking_call_works_on_one_worker() {
    let r = within(10, || {
        let rt = rt1();
        let h = rt.handle();
        rt.block_on(move || fiber::blocking(move || h.block_on(|| 40 + 2)))
    });
    assert_eq!(r, 42);
    let r = within(10, || {
        rt1().block_on(|| {
            fiber::blocking(|| {
                let h = fiber::Handle::current();
                let spawned = h.spawn(|| 3).join().unwrap();
                h.block_on(|| 4) + spawned
            })
        })
    });
    assert_eq!(r, 7);
}

/// `blocking` inside a `blocking` call runs inline; `fiber::run` there
/// starts a second runtime and returns its value.
#[test]
fn blocking_and_run_nested_in_a_blocking_call() {
    let r = within(10, || rt1().block_on(|| fiber::blocking(|| fiber::blocking(|| 5))));
    assert_eq!(r, 5);
    let r = within(20, || rt1().block_on(|| fiber::blocking(|| fiber::run(|| 7))));
    assert_eq!(r, 7);
}

/// Another runtime's `block_on` inside a fiber is refused like the own
/// runtime's, naming the call, and the fiber goes on.
#[test]
fn another_runtimes_block_on_inside_a_fiber_is_refused() {
    let (msg, after) = within(10, || {
        let a = rt1();
        let b = rt1();
        let hb = b.handle();
        a.block_on(move || {
            let msg = panic_message(|| {
                hb.block_on(|| 1);
            });
            (msg, hb.spawn(|| 2).join().unwrap())
        })
    });
    let msg = msg.expect("block_on of another runtime inside a fiber did not panic");
    assert!(msg.contains("block_on") && msg.contains("inside a fiber"), "{msg}");
    assert_eq!(after, 2);
}

/// `block_on` in an `on_thread_stop` hook at shutdown (a worker thread,
/// the runtime closed): a clear panic naming the misuse (one of the
/// runtime's own worker threads; it said "shutting down" before that
/// check came first), and the drop still finishes.
#[test]
fn block_on_in_on_thread_stop_at_shutdown_panics_clearly() {
    let seen: Arc<Mutex<Vec<Option<String>>>> = Arc::new(Mutex::new(Vec::new()));
    let cell: Arc<OnceLock<fiber::Handle>> = Arc::new(OnceLock::new());
    let (s, c) = (seen.clone(), cell.clone());
    let rt = fiber::Runtime::builder()
        .workers(1)
        .max_workers(1)
        .on_thread_stop(move || {
            let h = c.get().unwrap().clone();
            s.lock().unwrap().push(panic_message(move || {
                h.block_on(|| 1);
            }));
        })
        .build()
        .unwrap();
    cell.set(rt.handle()).ok().unwrap();
    within(10, move || drop(rt));
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1, "{seen:?}");
    let msg = seen[0].as_deref().expect("block_on at shutdown returned");
    assert!(msg.contains("block_on") && msg.contains("own worker threads"), "{msg}");
}

static HANDLE: OnceLock<fiber::Handle> = OnceLock::new();
static ARMED: AtomicBool = AtomicBool::new(false);
static OUTCOME: Mutex<Option<Result<u32, String>>> = Mutex::new(None);

/// A layer whose next `on_enter` on a worker thread (outside any fiber)
/// calls `block_on` on that worker's own runtime.
struct BlockOnInEnter;
impl<S: Subscriber> Layer<S> for BlockOnInEnter {
    fn on_enter(&self, _: &Id, _: Context<'_, S>) {
        if fiber::core::in_fiber() || !ARMED.swap(false, SeqCst) {
            return;
        }
        let h = HANDLE.get().unwrap().clone();
        let r = std::panic::catch_unwind(move || h.block_on(|| 5u32))
            .map_err(|p| p.downcast_ref::<String>().cloned().unwrap_or_default());
        *OUTCOME.lock().unwrap() = Some(r);
    }
}

/// `block_on` on one of the runtime's own worker threads outside its
/// fibers (here a tracing span's `on_enter`, which the worker runs around
/// a resume): tokio panics ("Cannot start a runtime from within a
/// runtime"); fiber refuses `block_on` inside a fiber and, for `Drop`,
/// already tells its own worker threads apart. On one worker the root can
/// never run: it must panic (or work), not hang the worker for good.
// Failed before the fix: block_on on a runtime's own worker thread outside a fiber deadlocks (no worker-thread check in block_on_root)
#[test]
fn block_on_on_the_runtimes_own_worker_thread_outside_a_fiber_does_not_hang() {
    let name = "block_on_on_the_runtimes_own_worker_thread_outside_a_fiber_does_not_hang";
    if let Some((status, stderr)) = child_outcome(name, 20, &[("FIBER_DEBUG_STALL", "0")], || {
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(BlockOnInEnter)).unwrap();
        let rt = fiber::Runtime::builder()
            .workers(1)
            .max_workers(1)
            .fiber_spans(true)
            .shutdown_timeout(ms(100))
            .build()
            .unwrap();
        HANDLE.set(rt.handle()).ok().unwrap();
        ARMED.store(true, SeqCst);
        let h = rt.handle();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(h.block_on(|| 1));
        });
        let outer = rx.recv_timeout(Duration::from_secs(5));
        let inner = OUTCOME.lock().unwrap().clone();
        // Leave at once: a hung worker would keep the drop waiting.
        if outer.is_err() {
            eprintln!("HANG: outer block_on {outer:?}, inner block_on {inner:?}");
            std::process::exit(3);
        }
        match inner {
            Some(Ok(v)) => panic!("block_on on the worker's own thread returned {v} instead of refusing"),
            Some(Err(msg)) => assert!(msg.contains("block_on") && msg.contains("own worker threads"), "{msg}"),
            None => panic!("on_enter never ran"),
        }
        std::process::exit(0);
    }) {
        assert!(status.success(), "child failed ({status:?}):\n{stderr}");
    }
}

// ---------------------------------------------------------------------------
// (d) Spinning fibers, timers and `yield_now`.

/// One worker that may grow to two: a fiber spins without a yield point
/// until the root sets a flag; the root's `with_timeout` deadline still
/// fires (the monitor fires the timer, a grown worker runs the root), so
/// the root sets the flag before the spinner's own 8 s limit.
#[test]
fn a_deadline_fires_beside_a_spinning_fiber_when_the_pool_can_grow() {
    within(20, || {
        let rt = fiber::Runtime::builder()
            .workers(1)
            .max_workers(2)
            .shutdown_timeout(ms(300))
            .build()
            .unwrap();
        rt.block_on(|| {
            let flag = Arc::new(AtomicBool::new(false));
            let f = flag.clone();
            let spinner = fiber::spawn(move || spin_until(&f, Duration::from_secs(8)));
            fiber::yield_now().unwrap();
            let r = fiber::with_timeout(ms(50), || fiber::sleep(Duration::from_secs(30)));
            flag.store(true, SeqCst);
            assert!(r.is_err(), "the deadline did not fire");
            assert!(spinner.join().unwrap(), "the root ran only after the spinner gave up");
        });
        assert!(rt.stats().scale_ups >= 1, "{:?}", rt.stats());
    });
}

/// Three fibers yielding in a loop on one worker take strict turns: a
/// yield lets every other fiber of the worker run first (spec/sched.md
/// section 2), so no fiber ever gets two turns ahead of another.
#[test]
fn yield_now_takes_strict_turns_on_one_worker() {
    let order = within(10, || {
        rt1().block_on(|| {
            let log = Arc::new(Mutex::new(Vec::new()));
            let hs: Vec<_> = (0..3usize)
                .map(|i| {
                    let log = log.clone();
                    fiber::spawn(move || {
                        for _ in 0..50 {
                            log.lock().unwrap().push(i);
                            fiber::yield_now().unwrap();
                        }
                    })
                })
                .collect();
            for h in hs {
                h.join().unwrap();
            }
            Arc::try_unwrap(log).unwrap().into_inner().unwrap()
        })
    });
    assert_eq!(order.len(), 150);
    let mut counts = [0usize; 3];
    for (at, &i) in order.iter().enumerate() {
        counts[i] += 1;
        if at >= 2 {
            let (lo, hi) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
            assert!(hi - lo <= 1, "unfair at {at}: {counts:?} in {order:?}");
        }
    }
}

// ---------------------------------------------------------------------------
// (e) Counters, shutdown, two runtimes.

/// After a burst of every kind of spawn, a growth and the retirement of
/// the extra worker, the counters agree: no fiber alive, runnable or
/// parked, the pool back at its floor with as many scale-downs as
/// scale-ups, and every spawn counted.
#[test]
fn counters_agree_after_quiescence() {
    within(30, || {
        let rt = fiber::Runtime::builder()
            .workers(1)
            .max_workers(2)
            .idle_timeout(ms(50))
            .shutdown_timeout(ms(300))
            .build()
            .unwrap();
        let before = rt.stats().spawns;
        let h = rt.handle();
        let outside: Vec<_> = (0..5u64).map(|i| h.spawn(move || i)).collect();
        let inside = rt.block_on(|| {
            let mut n = 0u64;
            let flag = Arc::new(AtomicBool::new(false));
            let f = flag.clone();
            let spinner = fiber::spawn(move || spin_until(&f, Duration::from_secs(5)));
            n += 1;
            let pinned = fiber::spawn_pinned(|| 1u64);
            let built = fiber::Builder::new()
                .name("r60")
                .stack_size(4 << 20)
                .spawn(|| 2u64)
                .unwrap();
            n += 2;
            let scoped: u64 = fiber::scope(|s| (0..4u64).map(|i| s.spawn(move || i)).map(|c| c.join().unwrap()).sum());
            n += 4;
            wait_until("the pool to grow", 10, || fiber::stats().runtime.scale_ups >= 1);
            flag.store(true, SeqCst);
            assert!(spinner.join().unwrap());
            assert_eq!(pinned.join().unwrap() + built.join().unwrap() + scoped, 9);
            n
        });
        let sum: u64 = outside.into_iter().map(|o| o.join().unwrap()).sum();
        assert_eq!(sum, 10);
        let start = Instant::now();
        loop {
            let st = rt.stats();
            if st.fibers_alive == 0 && st.workers == st.min_workers && st.scale_ups == st.scale_downs {
                assert_eq!(st.fibers_runnable, 0, "{st:?}");
                assert_eq!(st.fibers_parked, 0, "{st:?}");
                assert!(st.scale_ups >= 1, "{st:?}");
                // The five outside spawns, the root and the fibers it made.
                assert!(st.spawns - before >= 5 + 1 + inside, "{st:?}");
                break;
            }
            assert!(start.elapsed() < Duration::from_secs(10), "never settled: {st:?}");
            std::thread::sleep(ms(5));
        }
    });
}

/// `shutdown_timeout(Duration::ZERO)`: a fiber sleeping inside
/// `non_cancellable` is unwound at once (README: a shutdown still ends
/// such waits once its grace time is over), its destructors run once,
/// and the drop does not wait for the 30 s sleep.
#[test]
fn a_zero_grace_unwinds_a_non_cancellable_sleeper_at_once() {
    within(20, || {
        let rt = rt_fixed_grace(1, Duration::ZERO);
        let drops = Arc::new(AtomicUsize::new(0));
        let d = drops.clone();
        let h = rt.handle().spawn(move || {
            let _g = Guard(d);
            fiber::non_cancellable(|| fiber::sleep(Duration::from_secs(30)))
        });
        wait_parked(&rt, 1);
        let t = Instant::now();
        drop(rt);
        assert!(t.elapsed() < Duration::from_secs(10), "drop took {:?}", t.elapsed());
        assert_eq!(drops.load(SeqCst), 1);
        assert!(h.join().is_err());
    });
}

/// `Duration::MAX` grace ("waits forever") still ends as soon as the
/// cancelled fibers return: a sleeper, a receiver whose sender another
/// parked fiber holds, and a joiner of that fiber.
#[test]
fn a_max_grace_ends_once_the_cancelled_fibers_return() {
    within(20, || {
        let rt = rt_fixed_grace(2, Duration::MAX);
        let returned = Arc::new(AtomicUsize::new(0));
        rt.block_on(|| {
            let (tx, rx) = fiber::chan::bounded::<u32>(0);
            let r = returned.clone();
            let holder = fiber::spawn(move || {
                let _tx = tx;
                let out = fiber::sleep(Duration::from_secs(3600));
                r.fetch_add(1, SeqCst);
                out
            });
            let r = returned.clone();
            fiber::spawn(move || {
                assert!(rx.recv().is_err());
                r.fetch_add(1, SeqCst);
            });
            let r = returned.clone();
            fiber::spawn(move || {
                let _ = holder.join();
                r.fetch_add(1, SeqCst);
            });
        });
        wait_parked(&rt, 3);
        let t = Instant::now();
        drop(rt);
        assert!(t.elapsed() < Duration::from_secs(10), "drop took {:?}", t.elapsed());
        assert_eq!(returned.load(SeqCst), 3);
    });
}

/// Two runtimes: a fiber of A spawns into B and joins it, a fiber of B
/// joins a fiber of A; then a fiber of A joins a sleeping fiber of B while
/// a plain thread drops B: the join ends as cancelled (B's shutdown), and
/// A runs on.
#[test]
fn joins_across_two_runtimes_and_one_dropped_meanwhile() {
    within(20, || {
        let a = rt2();
        let b = rt_fixed_grace(1, ms(200));
        let hb = b.handle();
        let ha = a.handle();
        let (x, y) = a.block_on(move || {
            let from_b = hb.spawn(|| 6).join().unwrap();
            let mine = fiber::spawn(|| 7);
            let cross = hb.spawn(move || mine.join().unwrap() * 10).join().unwrap();
            (from_b, cross)
        });
        assert_eq!((x, y), (6, 70));
        let sleeper = b.handle().spawn(|| fiber::sleep(Duration::from_secs(30)));
        let (tx, rx) = mpsc::channel();
        let joiner = ha.spawn(move || {
            tx.send(()).unwrap();
            sleeper.join()
        });
        rx.recv().unwrap();
        wait_parked(&a, 1);
        drop(b);
        let r = joiner.join().unwrap();
        let e = r.expect_err("the joined fiber of a dropped runtime finished");
        assert!(e.is_cancelled(), "{e}");
        assert_eq!(a.block_on(|| fiber::spawn(|| 1).join().unwrap()), 1);
    });
}

// ---------------------------------------------------------------------------
// (f) Thread names and a root panic whose payload panics when dropped.

/// Worker threads are named `<prefix>-<index>` (as `std::thread::current`
/// reports inside a fiber), an empty or a long non-ASCII prefix works, and
/// a NUL in it is an error naming `thread_name`.
#[test]
fn worker_threads_take_the_prefix_and_a_nul_is_an_error() {
    within(20, || {
        for prefix in ["r60-pool", "", "ßßßßßßßßßßßßßßßßß"] {
            let rt = fiber::Runtime::builder()
                .workers(2)
                .max_workers(2)
                .thread_name(prefix)
                .build()
                .unwrap();
            let name = rt.block_on(|| std::thread::current().name().map(str::to_string));
            let name = name.expect("worker thread without a name");
            let index = name
                .strip_prefix(&format!("{prefix}-"))
                .unwrap_or_else(|| panic!("{name:?}"));
            assert!(index == "0" || index == "1", "{name:?}");
        }
        let e = fiber::Runtime::builder().thread_name("a\0b").build().unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("thread_name"), "{e}");
    });
}

/// A payload whose `Drop` panics.
struct BadPayload(Arc<AtomicUsize>);

impl Drop for BadPayload {
    fn drop(&mut self) {
        self.0.fetch_add(1, SeqCst);
        panic!("r60: payload dropped");
    }
}

/// A root that panics with a payload whose `Drop` panics: `block_on`
/// re-raises that very payload (the runtime drops nothing of it on the
/// way), the caller's drop of it panics in the caller once, and the
/// runtime keeps working; a fiber that joins such a child gets the
/// payload too.
#[test]
fn a_root_panic_payload_that_panics_on_drop_comes_back_whole() {
    within(20, || {
        let rt = rt2();
        let drops = Arc::new(AtomicUsize::new(0));
        let d = drops.clone();
        let payload = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            rt.block_on(move || std::panic::panic_any(BadPayload(d)));
        }))
        .expect_err("the root's panic was not re-raised");
        assert!(payload.is::<BadPayload>());
        assert_eq!(drops.load(SeqCst), 0);
        let again = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(payload)));
        assert!(again.is_err());
        assert_eq!(drops.load(SeqCst), 1);
        let d = drops.clone();
        let got = rt.block_on(move || {
            let child = fiber::spawn(move || std::panic::panic_any(BadPayload(d)));
            let e = child.join().unwrap_err();
            let p = e.into_panic();
            let is_bad = p.is::<BadPayload>();
            std::mem::forget(p);
            is_bad
        });
        assert!(got);
        assert_eq!(drops.load(SeqCst), 1);
        assert_eq!(rt.block_on(|| fiber::spawn(|| 3).join().unwrap()), 3);
    });
}
