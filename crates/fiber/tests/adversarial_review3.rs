//! Hostile-review probes, third round: runtime configuration and misuse,
//! nested runtimes, std::thread-shaped details, fiber::sync edge paths
//! (OnceLock re-entrancy, Condvar with two mutexes, RwLock poisoning),
//! the blocking pool, fiber-locals, and fiber::net edge values.
//! Each probe states the upstream rule it checks.

mod common;

use common::*;
use std::io::{ErrorKind, Read, Write};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn threads_now() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

// ------------------------------------------------------- configuration

/// tokio's `Builder::build` / std's `Builder::spawn` style: every bad
/// setting is an `InvalidInput` error that names the setting.
#[test]
fn bad_builder_settings_are_errors_naming_the_setting() {
    within(30, || {
        let cases: Vec<(&str, fiber::runtime::Builder)> = vec![
            ("workers", {
                let mut b = fiber::Runtime::builder();
                b.workers(0);
                b
            }),
            ("workers", {
                let mut b = fiber::Runtime::builder();
                b.workers(usize::MAX);
                b
            }),
            ("max_workers", {
                let mut b = fiber::Runtime::builder();
                b.workers(3).max_workers(2);
                b
            }),
            ("max_workers", {
                let mut b = fiber::Runtime::builder();
                b.workers(1).max_workers(usize::MAX);
                b
            }),
            ("stack_size", {
                let mut b = fiber::Runtime::builder();
                b.stack_size(0);
                b
            }),
            ("stack_size", {
                let mut b = fiber::Runtime::builder();
                b.stack_size(usize::MAX);
                b
            }),
            ("max_blocking_threads", {
                let mut b = fiber::Runtime::builder();
                b.max_blocking_threads(0);
                b
            }),
            ("max_blocking_threads", {
                let mut b = fiber::Runtime::builder();
                b.max_blocking_threads(usize::MAX);
                b
            }),
            ("thread_name", {
                let mut b = fiber::Runtime::builder();
                b.thread_name("a\0b");
                b
            }),
        ];
        for (setting, b) in cases {
            let err = match b.build() {
                Ok(_) => panic!("{setting}: a bad value built a runtime"),
                Err(e) => e,
            };
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{setting}: {err}");
            assert!(err.to_string().contains(setting), "{setting}: {err}");
        }
    });
}

/// Huge but representable durations must not overflow an `Instant`
/// somewhere inside the runtime (std's `Instant + Duration` panics on
/// overflow): a runtime with `idle_timeout` and `shutdown_timeout` of
/// `Duration::MAX` runs fibers, a spinning fiber, timers, and shuts down.
#[test]
fn duration_max_idle_and_shutdown_timeouts_run_and_shut_down() {
    within(60, || {
        let rt = fiber::Runtime::builder()
            .workers(1)
            .max_workers(2)
            .idle_timeout(Duration::MAX)
            .shutdown_timeout(Duration::MAX)
            .build()
            .unwrap();
        let v = rt.block_on(|| {
            let spin = fiber::spawn(|| {
                let t = Instant::now();
                while t.elapsed() < ms(50) {
                    std::hint::spin_loop();
                }
                1
            });
            let nap = fiber::spawn(|| {
                fiber::sleep(ms(20)).unwrap();
                2
            });
            spin.join().unwrap() + nap.join().unwrap()
        });
        assert_eq!(v, 3);
        drop(rt);
    });
}

/// An `idle_timeout` of zero ("how long a worker may run one fiber
/// without a yield point before it is drained") must not make ordinary
/// fibers fail or the runtime thrash forever.
#[test]
fn zero_idle_timeout_still_runs_fibers_to_completion() {
    within(60, || {
        let rt = fiber::Runtime::builder()
            .workers(1)
            .max_workers(2)
            .idle_timeout(Duration::ZERO)
            .shutdown_timeout(ms(300))
            .build()
            .unwrap();
        let sum = rt.block_on(|| {
            let hs: Vec<_> = (0..50u64)
                .map(|i| {
                    fiber::spawn(move || {
                        let t = Instant::now();
                        while t.elapsed() < ms(2) {
                            std::hint::spin_loop();
                        }
                        fiber::sleep(ms(1)).unwrap();
                        i
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum::<u64>()
        });
        assert_eq!(sum, (0..50).sum::<u64>());
    });
}

/// README: "A bad value ... is an error naming the variable, never a
/// silent default." Values near the edges of each parser.
#[test]
fn edge_environment_values_are_errors_naming_the_variable() {
    let cases: &[(&str, &str)] = &[
        ("FIBER_WORKERS", "-1"),
        ("FIBER_WORKERS", "1025"),
        ("FIBER_WORKERS", "2.0"),
        ("FIBER_WORKERS", "99999999999999999999999"),
        ("FIBER_STACK_SIZE", "18446744073709551615g"),
        ("FIBER_STACK_SIZE", "1t"),
        ("FIBER_STACK_SIZE", "k"),
        ("FIBER_STACK_SIZE", "15k"),
        ("FIBER_STACK_SIZE", "2g"),
        ("FIBER_SHUTDOWN_TIMEOUT_MS", "-5"),
        ("FIBER_SHUTDOWN_TIMEOUT_MS", "99999999999999999999999"),
        ("FIBER_IDLE_TIMEOUT_MS", "1.5"),
        ("FIBER_MAX_BLOCKING", "0"),
        ("FIBER_MAX_BLOCKING", "65537"),
        ("FIBER_DUMP_SIGNAL", "SIGINT"),
        ("FIBER_UNGUARDED", "maybe"),
        ("FIBER_STATS", "2"),
        ("FIBER_STATS", "TRUE"),
    ];
    for (name, value) in cases {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "env_child_builds_a_runtime",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("ADV3_ENV_CHILD", "1")
            .env(name, value)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        assert!(
            text.contains("ADV3 ERR") && text.contains(name),
            "{name}={value:?}: expected an error naming the variable, got:\n{text}"
        );
    }
}

/// The child of `edge_environment_values_are_errors_naming_the_variable`.
#[test]
fn env_child_builds_a_runtime() {
    if std::env::var("ADV3_ENV_CHILD").is_err() {
        return;
    }
    match fiber::Runtime::new() {
        Ok(rt) => {
            println!("ADV3 OK");
            drop(rt);
        }
        Err(e) => println!("ADV3 ERR {e}"),
    }
}

/// Building and dropping runtimes that used sockets, timers and the
/// blocking pool leaves no threads behind (net's poller included).
#[test]
fn many_runtimes_with_sockets_and_timers_leave_no_threads() {
    within(120, || {
        // Warm up once: a process-wide poller thread may start lazily.
        let one = || {
            let rt = rt();
            rt.block_on(|| {
                let l = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
                let addr = l.local_addr().unwrap();
                let c = fiber::spawn(move || {
                    let mut s = fiber::net::TcpStream::connect(addr).unwrap();
                    s.write_all(b"x").unwrap();
                });
                let (mut a, _) = l.accept().unwrap();
                let mut b = [0u8; 1];
                a.read_exact(&mut b).unwrap();
                c.join().unwrap();
                fiber::sleep(ms(1)).unwrap();
                fiber::blocking(|| std::thread::sleep(ms(1)));
            });
        };
        one();
        std::thread::sleep(ms(200));
        let base = threads_now();
        for _ in 0..15 {
            one();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while threads_now() > base && Instant::now() < deadline {
            std::thread::sleep(ms(20));
        }
        assert!(
            threads_now() <= base,
            "threads: {} after, {} before",
            threads_now(),
            base
        );
    });
}

/// `fiber::run` documents a panic when called inside a fiber; a second
/// runtime's `block_on` inside a fiber of the first is the same misuse.
/// It must panic (or work), never hang the worker.
#[test]
fn another_runtimes_block_on_inside_a_fiber_panics_or_works_never_hangs() {
    within(30, || {
        let outer = rt2();
        let r = outer.block_on(|| {
            let inner = rt1();
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| inner.block_on(|| 7)));
            drop(inner);
            r.map_err(|p| {
                p.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default()
            })
        });
        match r {
            Ok(v) => assert_eq!(v, 7),
            Err(msg) => assert!(msg.contains("fiber"), "unclear panic: {msg}"),
        }
    });
}

/// A runtime created, used from a plain thread and dropped inside a fiber
/// of another runtime (its shutdown blocks that worker for a while, but
/// must finish).
#[test]
fn a_runtime_built_and_dropped_inside_a_fiber_of_another() {
    within(30, || {
        let outer = rt2();
        let v = outer.block_on(|| {
            let inner = rt1();
            let h = inner.handle();
            let v = fiber::blocking(move || h.block_on(|| fiber::spawn(|| 5).join().unwrap()));
            let j = inner.spawn(|| {
                let _ = fiber::sleep(Duration::from_secs(3600));
            });
            drop(inner);
            let _ = j;
            v
        });
        assert_eq!(v, 5);
    });
}

/// `fiber::run` inside `fiber::blocking` inside `fiber::run`: the pool
/// thread is a plain thread, so a fresh runtime runs there.
#[test]
fn run_inside_blocking_spawns_and_joins_fibers() {
    within(60, || {
        let v = rt2().block_on(|| {
            fiber::blocking(|| {
                fiber::run(|| {
                    let hs: Vec<_> = (0..10u32).map(|i| fiber::spawn(move || i * 2)).collect();
                    hs.into_iter().map(|h| h.join().unwrap()).sum::<u32>()
                })
            })
        });
        assert_eq!(v, 90);
    });
}

/// Dropping the `Runtime` while a plain thread is inside `block_on`
/// through a `Handle`: the thread's call must return (a value or a clear
/// panic), never hang.
#[test]
fn dropping_the_runtime_while_a_thread_is_in_handle_block_on() {
    within(30, || {
        let rt = rt_fixed_grace(2, ms(300));
        let h = rt.handle();
        let (tx, rx) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                h.block_on(move || {
                    tx.send(()).unwrap();
                    let _ = fiber::sleep(Duration::from_secs(3600));
                    1
                })
            }))
            .is_ok()
        });
        rx.recv().unwrap();
        drop(rt);
        let _returned_normally = t.join().unwrap();
    });
}

// ------------------------------------------------ std::thread-shaped API

/// std: `JoinHandle::is_finished` becomes true once the thread has
/// finished, without a join; `JoinHandle::thread().id()` is the id the
/// thread sees as `current().id()`, and ids are unique.
#[test]
fn join_handle_identity_and_is_finished() {
    on_runtime(|| {
        let (tx, rx) = fiber::chan::bounded::<()>(0);
        let h = fiber::spawn(move || {
            rx.recv().unwrap();
            fiber::current().id()
        });
        assert!(!h.is_finished());
        assert_eq!(h.fiber().id(), h.id());
        tx.send(()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !h.is_finished() {
            assert!(Instant::now() < deadline, "is_finished never became true");
            fiber::sleep(ms(1)).unwrap();
        }
        let id = h.id();
        assert_eq!(h.join().unwrap(), id);
        let ids: std::collections::HashSet<_> = (0..200)
            .map(|_| fiber::spawn(|| fiber::current().id()))
            .map(|h| h.join().unwrap())
            .collect();
        assert_eq!(ids.len(), 200);
        assert!(!ids.contains(&fiber::current().id()));
    });
}

/// std: `Builder::name` with an interior NUL makes `spawn` panic ("thread
/// name may not contain interior null bytes"); fiber's `Builder` does the
/// same (`spawn` and `spawn_scoped`), so code ported from threads keeps
/// its check, and a name without one reads back as given.
#[test]
fn a_fiber_name_with_interior_nul_is_refused_as_std_does() {
    on_runtime(|| {
        let msg = panic_message(|| {
            let _ = fiber::Builder::new().name("a\0b").spawn(|| ());
        });
        assert_eq!(msg.as_deref(), Some("fiber name may not contain interior null bytes"));
        let msg = panic_message(|| {
            fiber::scope(|s| {
                let _ = fiber::Builder::new().name("\0").spawn_scoped(s, || ());
            });
        });
        assert_eq!(msg.as_deref(), Some("fiber name may not contain interior null bytes"));
        let name = fiber::Builder::new()
            .name("a b")
            .spawn(|| fiber::current().name().map(str::to_owned))
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(name.as_deref(), Some("a b"));
    });
}

/// std's `park_timeout` with a token present returns at once and
/// consumes it; a second `park_timeout` then waits its full time.
#[test]
fn park_timeout_consumes_the_token_then_waits_full_time() {
    on_runtime(|| {
        let me = fiber::current();
        me.unpark();
        me.unpark();
        let t = Instant::now();
        fiber::park_timeout(Duration::from_secs(5));
        assert!(t.elapsed() < Duration::from_secs(2));
        let t = Instant::now();
        fiber::park_timeout(ms(100));
        assert!(t.elapsed() >= ms(100), "returned early: {:?}", t.elapsed());
    });
}

/// `fiber::sleep` / `sleep_until` / `park_timeout` never return early.
#[test]
fn timed_waits_never_return_early() {
    on_runtime(|| {
        for d in [1u64, 3, 7, 15, 33] {
            let t = Instant::now();
            fiber::sleep(ms(d)).unwrap();
            assert!(t.elapsed() >= ms(d), "sleep({d} ms) took {:?}", t.elapsed());
            let t = Instant::now();
            fiber::sleep_until(t + ms(d)).unwrap();
            assert!(t.elapsed() >= ms(d), "sleep_until(+{d} ms) took {:?}", t.elapsed());
            let t = Instant::now();
            fiber::park_timeout(ms(d));
            // A spurious wake-up is allowed for park_timeout (std too),
            // but not for the channel timeout.
            let (_tx, rx) = fiber::chan::bounded::<()>(0);
            let t2 = Instant::now();
            assert!(rx.recv_timeout(ms(d)).is_err());
            assert!(t2.elapsed() >= ms(d), "recv_timeout({d} ms) took {:?}", t2.elapsed());
            let _ = t;
        }
        // sleep_until a past instant returns promptly.
        let t = Instant::now();
        fiber::sleep_until(t - ms(10)).unwrap();
        assert!(t.elapsed() < ms(500));
    });
}

/// std: `yield_now` works on any thread; fiber documents it as
/// `std::thread::yield_now` (and `Ok`) on a plain thread.
#[test]
fn yield_now_on_a_plain_thread_is_ok() {
    within(10, || {
        for _ in 0..100 {
            assert!(fiber::yield_now().is_ok());
        }
    });
}

// ------------------------------------------------------------ fiber::sync

/// std: a reader that panics does not poison an RwLock (only a writer
/// does, "An RwLock is poisoned whenever a writer panics while holding an
/// exclusive lock"); a writer that panics does.
#[test]
fn rwlock_is_poisoned_by_a_panicking_writer_only() {
    on_runtime(|| {
        let l = Arc::new(fiber::sync::RwLock::new(1));
        let l2 = l.clone();
        let r = fiber::spawn(move || {
            let _g = l2.read().unwrap();
            panic!("reader");
        })
        .join();
        assert!(r.is_err());
        assert!(!l.is_poisoned(), "a panicking reader poisoned the RwLock");
        assert!(l.read().is_ok());
        let l3 = l.clone();
        let r = fiber::spawn(move || {
            let _g = l3.write().unwrap();
            panic!("writer");
        })
        .join();
        assert!(r.is_err());
        assert!(l.is_poisoned());
        assert!(l.read().is_err());
        assert!(matches!(l.try_write(), Err(std::sync::TryLockError::Poisoned(_))));
        l.clear_poison();
        assert!(!l.is_poisoned());
        assert_eq!(*l.write().unwrap(), 1);
    });
}

/// std: `try_lock` on a poisoned, locked mutex is `WouldBlock` (the lock
/// is checked before the flag); on a poisoned, free one `Poisoned`.
/// `get_mut` and `into_inner` of a poisoned mutex are `Err` holding the data.
#[test]
fn mutex_poison_paths_match_std() {
    on_runtime(|| {
        let m = Arc::new(fiber::sync::Mutex::new(vec![1]));
        let m2 = m.clone();
        let _ = fiber::spawn(move || {
            let mut g = m2.lock().unwrap();
            g.push(2);
            panic!("poison");
        })
        .join();
        assert!(m.is_poisoned());
        let held = match m.lock() {
            Err(p) => p.into_inner(),
            Ok(_) => panic!("not poisoned"),
        };
        assert!(matches!(m.try_lock(), Err(std::sync::TryLockError::WouldBlock)));
        drop(held);
        assert!(matches!(m.try_lock(), Err(std::sync::TryLockError::Poisoned(_))));
        let mut m = Arc::try_unwrap(m).unwrap();
        assert_eq!(*m.get_mut().unwrap_err().into_inner(), vec![1, 2]);
        assert_eq!(m.into_inner().unwrap_err().into_inner(), vec![1, 2]);
    });
}

/// std: a Condvar used with two different mutexes at once panics (std's
/// doc: "may panic"; fiber documents and implements the panic). The
/// first waiter must be unaffected and still wake.
#[test]
fn condvar_with_two_mutexes_panics_the_second_waiter_only() {
    on_runtime(|| {
        let cv = Arc::new(fiber::sync::Condvar::new());
        let m1 = Arc::new(fiber::sync::Mutex::new(false));
        let (c, m) = (cv.clone(), m1.clone());
        let first = fiber::spawn(move || {
            let mut g = m.lock().unwrap();
            while !*g {
                g = c.wait(g).unwrap();
            }
            true
        });
        while fiber::stats().runtime.fibers_parked < 1 {
            fiber::sleep(ms(1)).unwrap();
        }
        fiber::sleep(ms(20)).unwrap();
        let c = cv.clone();
        let second = fiber::spawn(move || {
            let m2 = fiber::sync::Mutex::new(());
            let g = m2.lock().unwrap();
            let _ = c.wait_timeout(g, ms(200));
        });
        let err = second.join().unwrap_err();
        assert!(err.is_panic());
        *m1.lock().unwrap() = true;
        cv.notify_all();
        assert!(fiber::with_timeout(Duration::from_secs(5), || first.join().unwrap()).unwrap());
    });
}

/// std: the Barrier leader is exactly one per generation, and a barrier
/// is reusable across generations.
#[test]
fn barrier_one_leader_per_generation_over_many_generations() {
    on_runtime(|| {
        let n = 5;
        let gens = 40;
        let b = Arc::new(fiber::sync::Barrier::new(n));
        let leaders = Arc::new(AtomicUsize::new(0));
        let hs: Vec<_> = (0..n)
            .map(|_| {
                let (b, leaders) = (b.clone(), leaders.clone());
                fiber::spawn(move || {
                    for _ in 0..gens {
                        if b.wait().is_leader() {
                            leaders.fetch_add(1, SeqCst);
                        }
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(leaders.load(SeqCst), gens);
    });
}

/// std: `Barrier::new(0)` and `Barrier::new(1)`: every wait returns at
/// once and is the leader.
#[test]
fn barrier_of_zero_or_one_never_blocks_and_always_leads() {
    on_runtime(|| {
        for n in [0, 1] {
            let b = fiber::sync::Barrier::new(n);
            for _ in 0..3 {
                assert!(b.wait().is_leader(), "Barrier::new({n})");
            }
        }
    });
}

/// tokio: `acquire_many(0)` / `try_acquire_many(0)` succeed at once.
#[test]
fn semaphore_zero_permit_acquires_succeed_at_once() {
    on_runtime(|| {
        let s = fiber::sync::Semaphore::new(0);
        let p = fiber::with_timeout(Duration::from_secs(2), || s.acquire_many(0).map(|p| p.num_permits()));
        assert_eq!(p.unwrap().unwrap(), 0);
        assert_eq!(s.try_acquire_many(0).map(|p| p.num_permits()), Some(0));
        assert_eq!(s.available_permits(), 0);
    });
}

// ----------------------------------------------------------- blocking pool

/// std `thread::spawn(..).join()` gives the panic payload back; so does
/// `fiber::blocking`, re-raising it with its original type.
#[test]
fn blocking_panic_payload_keeps_its_type() {
    on_runtime(|| {
        let r = std::panic::catch_unwind(|| fiber::blocking(|| std::panic::panic_any(42u64)));
        assert_eq!(*r.unwrap_err().downcast::<u64>().unwrap(), 42);
        // The pool still works afterwards.
        assert_eq!(fiber::blocking(|| 5), 5);
    });
}

/// A blocking call that calls `fiber::blocking` again ("outside a
/// runtime's fiber it just calls f") and spawns fibers through a Handle.
#[test]
fn blocking_inside_blocking_and_spawning_from_the_pool() {
    on_runtime(|| {
        let h = fiber::Handle::current();
        let v = fiber::blocking(move || {
            let inner = fiber::blocking(|| 20);
            let j = h.spawn(|| 1);
            inner + j.join().unwrap()
        });
        assert_eq!(v, 21);
    });
}

/// The cap: with `max_blocking_threads(2)`, 8 concurrent blocking calls
/// all complete and never more than 2 run at once.
#[test]
fn the_blocking_cap_bounds_concurrency_and_every_call_completes() {
    within(60, || {
        let rt = fiber::Runtime::builder()
            .workers(2)
            .max_blocking_threads(2)
            .shutdown_timeout(ms(300))
            .build()
            .unwrap();
        let (done, peak) = rt.block_on(|| {
            let now = Arc::new(AtomicUsize::new(0));
            let peak = Arc::new(AtomicUsize::new(0));
            let hs: Vec<_> = (0..8)
                .map(|i| {
                    let (now, peak) = (now.clone(), peak.clone());
                    fiber::spawn(move || {
                        fiber::blocking(move || {
                            let n = now.fetch_add(1, SeqCst) + 1;
                            peak.fetch_max(n, SeqCst);
                            std::thread::sleep(ms(30));
                            now.fetch_sub(1, SeqCst);
                            i
                        })
                    })
                })
                .collect();
            let done: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
            (done, peak.load(SeqCst))
        });
        assert_eq!(done, (0..8).collect::<Vec<_>>());
        assert!((1..=2).contains(&peak), "peak {peak}");
    });
}

/// `fiber::blocking` from a plain thread just calls `f` (documented).
#[test]
fn blocking_from_a_plain_thread_runs_inline() {
    within(10, || {
        let me = std::thread::current().id();
        assert!(fiber::blocking(move || std::thread::current().id() == me));
    });
}

// ----------------------------------------------------------- fiber-locals

fiber::fiber_local! {
    static SLOT: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Fiber-locals are per fiber even when fibers share one worker and
/// interleave at every yield.
#[test]
fn fiber_locals_are_per_fiber_on_one_worker_across_yields() {
    within(30, || {
        rt1().block_on(|| {
            let hs: Vec<_> = (1..=20u32)
                .map(|i| {
                    fiber::spawn(move || {
                        for _ in 0..20 {
                            SLOT.set(SLOT.get() + i);
                            fiber::yield_now().unwrap();
                        }
                        SLOT.get()
                    })
                })
                .collect();
            for (i, h) in (1..=20u32).zip(hs) {
                assert_eq!(h.join().unwrap(), i * 20);
            }
            assert_eq!(SLOT.get(), 0);
        });
    });
}

// ------------------------------------------------------------- fiber::net

/// std (and the OS): a UDP datagram read into a smaller buffer is cut to
/// the buffer's size and the rest is discarded; `peek_from` does not
/// consume it.
#[test]
fn udp_recv_from_truncates_and_peek_from_does_not_consume() {
    on_runtime(|| {
        let a = fiber::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = fiber::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let b_addr = b.local_addr().unwrap();
        a.send_to(b"hello world", b_addr).unwrap();
        a.send_to(b"second", b_addr).unwrap();
        let mut small = [0u8; 5];
        let (n, from) = b.peek_from(&mut small).unwrap();
        assert_eq!((n, &small[..n], from), (5, &b"hello"[..], a.local_addr().unwrap()));
        let (n, _) = b.recv_from(&mut small).unwrap();
        assert_eq!(&small[..n], b"hello");
        let mut big = [0u8; 64];
        let (n, _) = b.recv_from(&mut big).unwrap();
        assert_eq!(&big[..n], b"second", "the truncated rest must be discarded");
    });
}

/// std: a connected UDP socket only receives from its peer; `send`
/// without `connect` is an error, not a hang.
#[test]
fn udp_connect_filters_and_send_without_connect_errors() {
    on_runtime(|| {
        let a = fiber::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = fiber::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let other = fiber::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        assert!(a.send(b"x").is_err());
        assert!(a.peer_addr().is_err());
        a.connect(b.local_addr().unwrap()).unwrap();
        b.connect(a.local_addr().unwrap()).unwrap();
        other.send_to(b"stranger", b.local_addr().unwrap()).unwrap();
        a.send(b"friend").unwrap();
        let mut buf = [0u8; 32];
        let n = b.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"friend");
    });
}

/// Linux (and so std): a blocking `recv` of 0 bytes on a TCP socket waits
/// until data arrives (tcp_recvmsg waits once even for len 0), then
/// returns `Ok(0)` without consuming anything; a `write` of nothing is
/// `Ok(0)`. fiber parks the same way and must be woken by the data.
#[test]
fn tcp_empty_read_waits_for_data_then_returns_zero_without_consuming() {
    // The control: what std does on this kernel.
    let std_waited = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (_s, _) = l.accept().unwrap();
        c.set_read_timeout(Some(ms(100))).unwrap();
        let t = Instant::now();
        let r = c.read(&mut []);
        (t.elapsed() >= ms(90), r.map_err(|e| e.kind()))
    };
    on_runtime(move || {
        let l = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = fiber::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        c.set_read_timeout(Some(ms(100))).unwrap();
        let t = Instant::now();
        let r = c.read(&mut []);
        assert_eq!((t.elapsed() >= ms(90), r.map_err(|e| e.kind())), std_waited);
        c.set_read_timeout(None).unwrap();
        let writer = fiber::spawn(move || {
            fiber::sleep(ms(30)).unwrap();
            (&s).write_all(b"abc").unwrap();
            s
        });
        let r = fiber::with_timeout(Duration::from_secs(5), || c.read(&mut []).unwrap());
        assert_eq!(r.expect("an empty read was not woken by data"), 0);
        let _s = writer.join().unwrap();
        assert_eq!(c.write(&[]).unwrap(), 0);
        let mut b = [0u8; 3];
        c.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"abc", "the empty read consumed nothing");
    });
}

/// std: after `shutdown(Write)` the peer reads EOF, and the reverse
/// direction still works.
#[test]
fn tcp_half_close_then_reply() {
    on_runtime(|| {
        let l = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let server = fiber::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut all = Vec::new();
            s.read_to_end(&mut all).unwrap();
            s.write_all(&all).unwrap();
            all.len()
        });
        let mut c = fiber::net::TcpStream::connect(addr).unwrap();
        c.write_all(b"ping").unwrap();
        c.shutdown(std::net::Shutdown::Write).unwrap();
        let mut back = Vec::new();
        c.read_to_end(&mut back).unwrap();
        assert_eq!(back, b"ping");
        assert_eq!(server.join().unwrap(), 4);
        // A write after shutdown(Write) is an error (EPIPE), not a hang.
        assert!(c.write(b"more").is_err());
    });
}

/// std: `set_read_timeout(Some(ZERO))` is `InvalidInput` on every socket
/// type, and leaves the old timeout in place.
#[test]
fn zero_socket_timeouts_are_invalid_input_everywhere() {
    on_runtime(|| {
        let l = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = fiber::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        // Whole seconds: the kernel keeps SO_RCVTIMEO in jiffies (std's
        // own `timeouts` test uses whole seconds too).
        c.set_read_timeout(Some(Duration::from_secs(7))).unwrap();
        assert_eq!(
            c.set_read_timeout(Some(Duration::ZERO)).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
        assert_eq!(
            c.set_write_timeout(Some(Duration::ZERO)).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
        assert_eq!(c.read_timeout().unwrap(), Some(Duration::from_secs(7)));
        let u = fiber::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        assert_eq!(
            u.set_read_timeout(Some(Duration::ZERO)).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
        assert_eq!(
            u.set_write_timeout(Some(Duration::ZERO)).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
        let (a, _b) = fiber::net::unix::UnixStream::pair().unwrap();
        assert_eq!(
            a.set_read_timeout(Some(Duration::ZERO)).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
        let (d, _e) = fiber::net::unix::UnixDatagram::pair().unwrap();
        assert_eq!(
            d.set_read_timeout(Some(Duration::ZERO)).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
        assert_eq!(
            fiber::net::TcpStream::connect_timeout(&l.local_addr().unwrap(), Duration::ZERO)
                .unwrap_err()
                .kind(),
            ErrorKind::InvalidInput
        );
    });
}

/// std: a read timeout ends a read with `WouldBlock` (Unix) after at
/// least the timeout; a tiny timeout (1 ns) is valid and not rounded to
/// "no timeout".
#[test]
fn tcp_read_timeout_kind_and_tiny_timeout() {
    on_runtime(|| {
        let l = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = fiber::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (_s, _) = l.accept().unwrap();
        c.set_read_timeout(Some(ms(40))).unwrap();
        let t = Instant::now();
        let e = c.read(&mut [0u8; 4]).unwrap_err();
        assert!(matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut), "{e:?}");
        assert!(t.elapsed() >= ms(40));
        c.set_read_timeout(Some(Duration::from_nanos(1))).unwrap();
        let r = fiber::with_timeout(Duration::from_secs(2), || c.read(&mut [0u8; 4]).map_err(|e| e.kind()));
        let r = r.expect("a 1 ns read timeout waited for ever");
        assert!(matches!(r, Err(ErrorKind::WouldBlock | ErrorKind::TimedOut)), "{r:?}");
    });
}

/// std: `set_nodelay` / `set_ttl` round-trip; `peek` does not consume.
#[test]
fn tcp_options_round_trip_and_peek() {
    on_runtime(|| {
        let l = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = fiber::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        c.set_nodelay(true).unwrap();
        assert!(c.nodelay().unwrap());
        c.set_nodelay(false).unwrap();
        assert!(!c.nodelay().unwrap());
        c.set_ttl(17).unwrap();
        assert_eq!(c.ttl().unwrap(), 17);
        l.set_ttl(33).unwrap();
        assert_eq!(l.ttl().unwrap(), 33);
        (&c).write_all(b"abc").unwrap();
        let mut buf = [0u8; 8];
        let n = s.peek(&mut buf).unwrap();
        assert!(n >= 1 && buf[..n] == b"abc"[..n]);
        let mut all = [0u8; 3];
        s.read_exact(&mut all).unwrap();
        assert_eq!(&all, b"abc");
    });
}

/// std: `try_clone` gives a second handle to the same socket; one fiber
/// reads while another writes, concurrently, through the two handles.
#[test]
fn try_clone_reader_and_writer_fibers_on_one_socket() {
    on_runtime(|| {
        let l = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let echo = fiber::spawn(move || {
            let (s, _) = l.accept().unwrap();
            let mut r = s.try_clone().unwrap();
            let mut w = s;
            std::io::copy(&mut r, &mut w).unwrap()
        });
        let c = fiber::net::TcpStream::connect(addr).unwrap();
        let mut r = c.try_clone().unwrap();
        let mut w = c;
        const N: usize = 1 << 20;
        let writer = fiber::spawn(move || {
            let data: Vec<u8> = (0..N).map(|i| i as u8).collect();
            w.write_all(&data).unwrap();
            w.shutdown(std::net::Shutdown::Write).unwrap();
        });
        let mut got = Vec::new();
        r.read_to_end(&mut got).unwrap();
        writer.join().unwrap();
        assert_eq!(got.len(), N);
        assert!(got.iter().enumerate().all(|(i, &b)| b == i as u8));
        assert_eq!(echo.join().unwrap(), N as u64);
    });
}

/// std: `incoming()` yields accepted connections in order, forever.
#[test]
fn tcp_incoming_yields_each_connection() {
    on_runtime(|| {
        let l = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let clients = fiber::spawn(move || {
            for i in 0..3u8 {
                let mut c = fiber::net::TcpStream::connect(addr).unwrap();
                c.write_all(&[i]).unwrap();
            }
        });
        let mut seen = Vec::new();
        for s in l.incoming().take(3) {
            let mut b = [0u8; 1];
            s.unwrap().read_exact(&mut b).unwrap();
            seen.push(b[0]);
        }
        clients.join().unwrap();
        seen.sort();
        assert_eq!(seen, vec![0, 1, 2]);
    });
}

/// std (Linux): abstract-namespace Unix sockets bind, accept and connect;
/// `local_addr` gives the abstract name back; `pair()` ends are unnamed.
#[test]
fn unix_abstract_addresses_and_pair_addresses() {
    use std::os::linux::net::SocketAddrExt;
    on_runtime(|| {
        let name = format!("fiber-adv3-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let l = fiber::net::unix::UnixListener::bind_addr(&addr).unwrap();
        assert_eq!(l.local_addr().unwrap().as_abstract_name(), Some(name.as_bytes()));
        let a2 = addr.clone();
        let c = fiber::spawn(move || {
            let mut s = fiber::net::unix::UnixStream::connect_addr(&a2).unwrap();
            s.write_all(b"hi").unwrap();
            s.peer_addr().unwrap().as_abstract_name().map(|n| n.to_vec())
        });
        let (mut s, peer) = l.accept().unwrap();
        assert!(peer.is_unnamed());
        let mut b = [0u8; 2];
        s.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"hi");
        assert_eq!(c.join().unwrap().as_deref(), Some(name.as_bytes()));
        let (p, q) = fiber::net::unix::UnixStream::pair().unwrap();
        assert!(p.local_addr().unwrap().is_unnamed());
        assert!(q.peer_addr().unwrap().is_unnamed());
        // An unbound datagram socket sends; the receiver sees an unnamed source.
        let dir = std::env::temp_dir().join(format!("fiber-adv3-dg-{}", std::process::id()));
        let _ = std::fs::remove_file(&dir);
        let rx = fiber::net::unix::UnixDatagram::bind(&dir).unwrap();
        let tx = fiber::net::unix::UnixDatagram::unbound().unwrap();
        tx.send_to(b"dg", &dir).unwrap();
        let mut buf = [0u8; 1];
        let (n, from) = rx.recv_from(&mut buf).unwrap();
        assert_eq!((n, buf[0]), (1, b'd'), "truncated like a UDP datagram");
        assert!(from.is_unnamed());
        let _ = std::fs::remove_file(&dir);
    });
}

/// std: an accept on a non-blocking listener with nothing pending is
/// `WouldBlock` at once; a connect to a closed port is refused, not hung.
#[test]
fn nonblocking_accept_and_refused_connect_return_at_once() {
    on_runtime(|| {
        let l = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        assert_eq!(l.accept().unwrap_err().kind(), ErrorKind::WouldBlock);
        let closed = {
            let t = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            t.local_addr().unwrap()
        };
        let r = fiber::with_timeout(Duration::from_secs(5), || {
            fiber::net::TcpStream::connect(closed).map(|_| ())
        });
        assert_eq!(
            r.expect("connect hung").unwrap_err().kind(),
            ErrorKind::ConnectionRefused
        );
    });
}

/// The OS: a UDP datagram larger than the maximum is an error (EMSGSIZE),
/// returned at once, not a park for ever.
#[test]
fn an_oversized_udp_datagram_is_an_error_not_a_hang() {
    on_runtime(|| {
        let a = fiber::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = fiber::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let big = vec![0u8; 70_000];
        let r = fiber::with_timeout(Duration::from_secs(2), || {
            a.send_to(&big, b.local_addr().unwrap()).map(|_| ())
        });
        assert!(r.expect("send_to hung").is_err());
    });
}

// ------------------------------------------------------ second batch

/// Run this test binary's `scenario` in a child for `secs`, then kill it
/// if still running; its stderr and whether it exited by itself.
fn child_stderr_for(scenario: &str, secs: u64) -> (String, Option<std::process::ExitStatus>) {
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", scenario, "--nocapture", "--test-threads=1"])
        .env("ADV3_CHILD", scenario)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut pipe = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = pipe.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if start.elapsed() > Duration::from_secs(secs) {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(ms(20));
    };
    (reader.join().unwrap(), status)
}

fn is_child(scenario: &str) -> bool {
    std::env::var("ADV3_CHILD").as_deref() == Ok(scenario)
}

/// std's `OnceLock::get_or_init`: "It is an error to reentrantly
/// initialize the cell from f. The exact outcome is unspecified. Current
/// implementation deadlocks, but this may be changed to a panic in the
/// future." The fiber version must not hang silently: within a few
/// seconds it panics or the deadlock report names the stuck fiber.
#[test]
fn once_lock_reentrant_init_is_reported_not_silent() {
    if is_child("once_lock_reentrant_init_is_reported_not_silent") {
        let rt = rt1();
        rt.block_on(|| {
            static CELL: fiber::sync::OnceLock<u32> = fiber::sync::OnceLock::new();
            let v = CELL.get_or_init(|| *CELL.get_or_init(|| 1) + 1);
            eprintln!("ADV3 value {v}");
        });
        return;
    }
    let (stderr, status) = child_stderr_for("once_lock_reentrant_init_is_reported_not_silent", 6);
    let reported = stderr.contains("deadlock") || stderr.contains("panicked");
    assert!(reported, "no report within 6 s (exited: {status:?}); stderr:\n{stderr}");
}

/// std (futex RwLock on Linux) and Go's RWMutex: a waiting writer is not
/// starved by readers that keep overlapping ("a blocked Lock call
/// excludes new readers from acquiring the lock", Go sync.RWMutex).
#[test]
fn a_writer_is_not_starved_by_overlapping_readers() {
    on_runtime(|| {
        let l = Arc::new(fiber::sync::RwLock::new(0u64));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let readers: Vec<_> = (0..4)
            .map(|_| {
                let (l, stop) = (l.clone(), stop.clone());
                fiber::spawn(move || {
                    while !stop.load(SeqCst) {
                        let g = l.read().unwrap();
                        fiber::sleep(ms(2)).unwrap();
                        drop(g);
                    }
                })
            })
            .collect();
        fiber::sleep(ms(20)).unwrap();
        let l2 = l.clone();
        let got = fiber::with_timeout(Duration::from_secs(5), move || {
            *l2.write().unwrap() += 1;
        });
        stop.store(true, SeqCst);
        for r in readers {
            r.join().unwrap();
        }
        assert!(got.is_ok(), "the writer waited 5 s behind overlapping readers");
    });
}

/// std: `RwLockWriteGuard::downgrade` keeps the lock read-locked: other
/// readers get in at once, writers still wait until the read guard goes.
#[test]
fn rwlock_downgrade_admits_readers_not_writers() {
    on_runtime(|| {
        let l = Arc::new(fiber::sync::RwLock::new(1));
        let mut w = l.write().unwrap();
        *w = 2;
        let r = fiber::sync::RwLockWriteGuard::downgrade(w);
        assert_eq!(*l.try_read().unwrap(), 2);
        assert!(matches!(l.try_write(), Err(std::sync::TryLockError::WouldBlock)));
        let l2 = l.clone();
        let writer = fiber::spawn(move || {
            *l2.write().unwrap() = 3;
        });
        fiber::sleep(ms(30)).unwrap();
        assert!(!writer.is_finished());
        assert_eq!(*r, 2);
        drop(r);
        writer.join().unwrap();
        assert_eq!(*l.read().unwrap(), 3);
    });
}

/// std: a panic in `Condvar::wait_while`'s predicate unwinds with the
/// guard held: the mutex ends poisoned and unlocked (a later `lock`
/// returns `Err(Poisoned)` at once rather than waiting for ever).
#[test]
fn a_panicking_wait_while_predicate_poisons_and_unlocks() {
    on_runtime(|| {
        let pair = Arc::new((fiber::sync::Mutex::new(0u32), fiber::sync::Condvar::new()));
        let p = pair.clone();
        let waiter = fiber::spawn(move || {
            let (m, cv) = &*p;
            let g = m.lock().unwrap();
            let _g = cv.wait_while(g, |v| {
                if *v == 1 {
                    panic!("predicate");
                }
                true
            });
        });
        while fiber::stats().runtime.fibers_parked < 1 {
            fiber::sleep(ms(1)).unwrap();
        }
        *pair.0.lock().unwrap() = 1;
        pair.1.notify_all();
        assert!(waiter.join().unwrap_err().is_panic());
        let r = fiber::with_timeout(Duration::from_secs(2), || pair.0.lock().is_err());
        assert!(r.expect("the mutex stayed locked"), "not poisoned");
    });
}

fiber::fiber_local! {
    static FLAKY: u32 = {
        static TRIES: AtomicUsize = AtomicUsize::new(0);
        if TRIES.fetch_add(1, SeqCst) == 0 {
            panic!("first init fails");
        }
        7
    };
}

/// std: a panicking `thread_local!` initializer propagates to the
/// accessor and leaves the key uninitialized: the next access runs the
/// initializer again.
#[test]
fn a_panicking_fiber_local_initializer_runs_again_next_time() {
    on_runtime(|| {
        let v = fiber::spawn(|| {
            let first = std::panic::catch_unwind(|| FLAKY.with(|v| *v));
            assert!(first.is_err());
            FLAKY.with(|v| *v)
        })
        .join()
        .unwrap();
        assert_eq!(v, 7);
    });
}

/// tokio's Semaphore (fiber: "FIFO ... a large acquire_many is never
/// starved by a stream of small ones"): with an `acquire_many(3)` queued
/// first, a later `acquire()` waits behind it even if a permit is free;
/// once enough permits come back the big one is served first.
#[test]
fn semaphore_fifo_with_a_big_request_at_the_head() {
    on_runtime(|| {
        let s = Arc::new(fiber::sync::Semaphore::new(1));
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (s1, o1) = (s.clone(), order.clone());
        let big = fiber::spawn(move || {
            let p = s1.acquire_many(3).unwrap();
            o1.lock().unwrap().push("big");
            drop(p);
        });
        while fiber::stats().runtime.fibers_parked < 1 {
            fiber::sleep(ms(1)).unwrap();
        }
        let (s2, o2) = (s.clone(), order.clone());
        let small = fiber::spawn(move || {
            let _p = s2.acquire().unwrap();
            o2.lock().unwrap().push("small");
        });
        fiber::sleep(ms(30)).unwrap();
        assert!(
            order.lock().unwrap().is_empty(),
            "small jumped the queue: {:?}",
            order.lock().unwrap()
        );
        assert!(s.try_acquire().is_none(), "try_acquire jumped the queue");
        s.add_permits(2);
        big.join().unwrap();
        small.join().unwrap();
        assert_eq!(*order.lock().unwrap(), vec!["big", "small"]);
        assert_eq!(s.available_permits(), 3);
    });
}

/// std: `try_clone` handles share one socket, so `set_nonblocking` and
/// the timeouts set through one apply to the other (they are socket
/// state: O_NONBLOCK on the shared file description, SO_RCVTIMEO).
#[test]
fn try_clone_handles_share_nonblocking_and_timeouts() {
    // Control: std.
    {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let _s = l.accept().unwrap();
        let mut b = a.try_clone().unwrap();
        a.set_nonblocking(true).unwrap();
        assert_eq!(b.read(&mut [0u8; 1]).unwrap_err().kind(), ErrorKind::WouldBlock);
    }
    on_runtime(|| {
        let l = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = fiber::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let _s = l.accept().unwrap();
        let mut b = a.try_clone().unwrap();
        a.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        assert_eq!(b.read_timeout().unwrap(), Some(Duration::from_secs(3)));
        a.set_nonblocking(true).unwrap();
        let r = fiber::with_timeout(Duration::from_secs(2), || b.read(&mut [0u8; 1]).map_err(|e| e.kind()));
        assert_eq!(r.expect("the clone still blocks"), Err(ErrorKind::WouldBlock));
        // And the other way round, after a clone made later.
        a.set_nonblocking(false).unwrap();
        let c = b.try_clone().unwrap();
        c.set_nonblocking(true).unwrap();
        let mut a = a;
        let r = fiber::with_timeout(Duration::from_secs(2), || a.read(&mut [0u8; 1]).map_err(|e| e.kind()));
        assert_eq!(r.expect("the original still blocks"), Err(ErrorKind::WouldBlock));
    });
}

/// std: two threads may `accept` on clones of one listener; each
/// connection goes to exactly one of them.
#[test]
fn two_fibers_accept_on_cloned_listeners() {
    on_runtime(|| {
        let l = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let l2 = l.try_clone().unwrap();
        let count = Arc::new(AtomicUsize::new(0));
        let acceptors: Vec<_> = [l, l2]
            .into_iter()
            .map(|l| {
                let count = count.clone();
                fiber::spawn(move || {
                    while count.load(SeqCst) < 10 {
                        let r = fiber::with_timeout(ms(500), || l.accept());
                        if let Ok(Ok(_)) = r {
                            count.fetch_add(1, SeqCst);
                        }
                    }
                })
            })
            .collect();
        let conns: Vec<_> = (0..10).map(|_| fiber::net::TcpStream::connect(addr).unwrap()).collect();
        for a in acceptors {
            a.join().unwrap();
        }
        assert_eq!(count.load(SeqCst), 10);
        drop(conns);
    });
}

/// std/the OS: a connected Unix datagram socket whose peer is gone fails
/// its `send` (ECONNREFUSED) instead of parking; `recv` with a read
/// timeout gives `WouldBlock` after it.
#[test]
fn unix_datagram_send_to_a_gone_peer_errors_and_recv_times_out() {
    on_runtime(|| {
        let (a, b) = fiber::net::unix::UnixDatagram::pair().unwrap();
        drop(b);
        let r = fiber::with_timeout(Duration::from_secs(2), || a.send(b"x").map_err(|e| e.kind()));
        assert!(r.expect("send to a gone peer parked").is_err());
        let (c, _d) = fiber::net::unix::UnixDatagram::pair().unwrap();
        c.set_read_timeout(Some(ms(30))).unwrap();
        let t = Instant::now();
        let e = c.recv(&mut [0u8; 4]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::WouldBlock);
        assert!(t.elapsed() >= ms(30));
    });
}

/// std: a UDP `recv` with a read timeout ends with `WouldBlock` after at
/// least the timeout; a non-blocking one at once.
#[test]
fn udp_recv_timeout_and_nonblocking() {
    on_runtime(|| {
        let u = fiber::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        u.set_read_timeout(Some(ms(30))).unwrap();
        let t = Instant::now();
        assert_eq!(u.recv_from(&mut [0u8; 4]).unwrap_err().kind(), ErrorKind::WouldBlock);
        assert!(t.elapsed() >= ms(30));
        u.set_nonblocking(true).unwrap();
        let t = Instant::now();
        assert_eq!(u.recv(&mut [0u8; 4]).unwrap_err().kind(), ErrorKind::WouldBlock);
        assert!(t.elapsed() < ms(500));
    });
}

/// `fiber::current()` and `fiber::sleep` inside a `fiber::blocking`
/// closure (a pool thread, not a fiber) panic with a message saying
/// where they may be called, and the panic comes back to the caller.
#[test]
fn fiber_only_calls_inside_blocking_panic_clearly() {
    on_runtime(|| {
        let r = std::panic::catch_unwind(|| fiber::blocking(|| fiber::current().id()));
        let p = r.unwrap_err();
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        assert!(msg.contains("current"), "unclear: {msg}");
        assert_eq!(fiber::blocking(|| 3), 3);
    });
}

// ------------------------------------------------------- third batch

/// std: `thread::sleep` / timed waits "will never sleep less than the
/// specified duration". Sub-millisecond and fractional-millisecond
/// durations must not be rounded down by a millisecond timer wheel.
#[test]
fn sub_millisecond_timed_waits_never_return_early() {
    on_runtime(|| {
        let ds = [1u64, 100, 999, 1001, 1500, 2999, 3001];
        for us in ds {
            let d = Duration::from_micros(us);
            let t = Instant::now();
            fiber::sleep(d).unwrap();
            assert!(t.elapsed() >= d, "sleep({d:?}) took {:?}", t.elapsed());
            let t = Instant::now();
            fiber::sleep_until(t + d).unwrap();
            assert!(t.elapsed() >= d, "sleep_until(+{d:?}) took {:?}", t.elapsed());
            let (_tx, rx) = fiber::chan::bounded::<()>(0);
            let t = Instant::now();
            assert!(rx.recv_timeout(d).is_err());
            assert!(t.elapsed() >= d, "recv_timeout({d:?}) took {:?}", t.elapsed());
            let t = Instant::now();
            let after = fiber::chan::after(d);
            after.recv().unwrap();
            assert!(t.elapsed() >= d, "after({d:?}) took {:?}", t.elapsed());
            let t = Instant::now();
            let r = fiber::with_timeout(d, || fiber::sleep(Duration::from_secs(10)));
            assert!(r.is_err());
            assert!(t.elapsed() >= d, "with_timeout({d:?}) fired after {:?}", t.elapsed());
            let m = fiber::sync::Mutex::new(());
            let cv = fiber::sync::Condvar::new();
            let t = Instant::now();
            let (_g, res) = cv.wait_timeout(m.lock().unwrap(), d).unwrap();
            if res.timed_out() {
                assert!(
                    t.elapsed() >= d,
                    "wait_timeout({d:?}) timed out after {:?}",
                    t.elapsed()
                );
            }
            let t = Instant::now();
            let deadline = t + d;
            let (_tx2, rx2) = fiber::chan::bounded::<()>(0);
            let mut sel = fiber::chan::Select::new();
            sel.recv(&rx2);
            assert!(sel.select_deadline(deadline).is_err());
            assert!(t.elapsed() >= d, "select_deadline(+{d:?}) took {:?}", t.elapsed());
        }
    });
}

fn vm_kib(field: &str) -> usize {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap()
}

/// Building and dropping runtimes that each ran a thousand fibers gives
/// their stacks back: the address space does not grow run after run.
#[test]
fn many_runtimes_with_many_fibers_do_not_grow_the_address_space() {
    in_child(
        "many_runtimes_with_many_fibers_do_not_grow_the_address_space",
        240,
        || {
            let one = || {
                let rt = rt();
                rt.block_on(|| {
                    let hs: Vec<_> = (0..1000u32)
                        .map(|i| {
                            fiber::spawn(move || {
                                fiber::yield_now().unwrap();
                                i
                            })
                        })
                        .collect();
                    assert_eq!(hs.into_iter().map(|h| h.join().unwrap() as u64).sum::<u64>(), 499_500);
                });
            };
            for _ in 0..3 {
                one();
            }
            let before = vm_kib("VmSize:");
            for _ in 0..20 {
                one();
            }
            let after = vm_kib("VmSize:");
            assert!(
                after < before + 256 * 1024,
                "VmSize grew from {before} KiB to {after} KiB over 20 runtimes"
            );
        },
    );
}

/// A panicking `on_thread_start` must not leave `build` or `block_on`
/// hanging: an error, a panic naming the callback, or a worker that
/// goes on regardless, within seconds.
#[test]
fn a_panicking_on_thread_start_does_not_hang() {
    if is_child("a_panicking_on_thread_start_does_not_hang") {
        let rt = fiber::Runtime::builder()
            .workers(2)
            .on_thread_start(|| panic!("start hook"))
            .shutdown_timeout(ms(200))
            .build();
        match rt {
            Err(e) => eprintln!("ADV3 build error: {e}"),
            Ok(rt) => {
                let v = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| rt.block_on(|| 5)));
                eprintln!("ADV3 block_on: {:?}", v.is_ok());
                drop(rt);
                eprintln!("ADV3 dropped");
            }
        }
        return;
    }
    let (stderr, status) = child_stderr_for("a_panicking_on_thread_start_does_not_hang", 20);
    assert!(status.is_some(), "hung; stderr:\n{stderr}");
    assert!(
        stderr.contains("ADV3"),
        "the child died without a result ({status:?}); stderr:\n{stderr}"
    );
}

/// The documented top of the range, `workers(1024)`, builds, runs a
/// fiber on every worker's watch, and shuts down.
#[test]
fn the_maximum_worker_count_builds_runs_and_shuts_down() {
    in_child("the_maximum_worker_count_builds_runs_and_shuts_down", 120, || {
        let rt = fiber::Runtime::builder()
            .workers(1024)
            .shutdown_timeout(ms(500))
            .build()
            .unwrap();
        let n = rt.block_on(|| {
            let hs: Vec<_> = (0..2000u32).map(|i| fiber::spawn(move || i % 2)).collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum::<u32>()
        });
        assert_eq!(n, 1000);
        drop(rt);
    });
}

// ------------------------------------------------------- fourth batch

/// A worker started later by the elastic pool whose `on_thread_start`
/// panics (the hook passed at build time) must not leave the runtime
/// hung: the fibers still finish and the runtime drops.
#[test]
fn a_start_hook_panicking_only_on_a_grown_worker_does_not_hang() {
    in_child(
        "a_start_hook_panicking_only_on_a_grown_worker_does_not_hang",
        60,
        || {
            let starts = Arc::new(AtomicUsize::new(0));
            let s = starts.clone();
            let rt = fiber::Runtime::builder()
                .workers(1)
                .max_workers(3)
                .shutdown_timeout(ms(300))
                .on_thread_start(move || {
                    if s.fetch_add(1, SeqCst) >= 1 {
                        panic!("hook fails on a grown worker");
                    }
                })
                .build()
                .unwrap();
            let v = rt.block_on(|| {
                let spinner = fiber::spawn(|| {
                    let t = Instant::now();
                    while t.elapsed() < ms(300) {
                        std::hint::spin_loop();
                    }
                    1
                });
                let sleepers: Vec<_> = (0..10)
                    .map(|i| {
                        fiber::spawn(move || {
                            fiber::sleep(ms(5)).unwrap();
                            i
                        })
                    })
                    .collect();
                spinner.join().unwrap() + sleepers.into_iter().map(|h| h.join().unwrap()).sum::<i32>()
            });
            assert_eq!(v, 46);
            drop(rt);
            eprintln!("starts: {}", starts.load(SeqCst));
        },
    );
}

/// Stale handles of many finished fibers (never joined) must not reach
/// the fibers that reuse their frames: no stale cancel, no stale token.
#[test]
fn stale_handles_of_many_finished_fibers_do_not_reach_new_fibers() {
    on_runtime(|| {
        let old: Vec<_> = (0..200).map(|_| fiber::spawn(|| fiber::current())).collect();
        while !old.iter().all(|h| h.is_finished()) {
            fiber::sleep(ms(1)).unwrap();
        }
        let cancellers: Vec<_> = old.iter().map(|h| h.canceller()).collect();
        let fibers: Vec<_> = old.iter().map(|h| h.fiber()).collect();
        let new: Vec<_> = (0..200)
            .map(|_| {
                fiber::spawn(|| {
                    let t = Instant::now();
                    let slept = fiber::sleep(ms(100));
                    (slept.is_err() || fiber::is_cancelled(), t.elapsed())
                })
            })
            .collect();
        fiber::sleep(ms(10)).unwrap();
        for c in &cancellers {
            c.cancel();
        }
        for f in &fibers {
            f.unpark();
        }
        for h in &old {
            h.cancel();
        }
        for h in new {
            let (cancelled, took) = h.join().unwrap();
            assert!(!cancelled, "a stale cancel reached a new fiber");
            assert!(took >= ms(100));
        }
        for h in old {
            let _ = h.join().unwrap();
        }
    });
}

/// std: `TcpStream::connect` with several addresses tries each in turn
/// and returns the first that connects; an empty list is `InvalidInput`.
#[test]
fn connect_tries_each_address_in_turn() {
    on_runtime(|| {
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let l = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let open = l.local_addr().unwrap();
        let c = fiber::net::TcpStream::connect(&[closed, open][..]).unwrap();
        assert_eq!(c.peer_addr().unwrap(), open);
        let none: &[std::net::SocketAddr] = &[];
        assert_eq!(
            fiber::net::TcpStream::connect(none).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
        // bind: the first address that binds.
        let taken = l.local_addr().unwrap();
        let other = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
        let l2 = fiber::net::TcpListener::bind(&[taken, other][..]).unwrap();
        assert_ne!(l2.local_addr().unwrap(), taken);
    });
}

/// std: `Mutex<T: ?Sized>` and `RwLock<T: ?Sized>` hold unsized values
/// (`Arc<Mutex<dyn Trait>>`, `&RwLock<[u8]>`).
#[test]
fn unsized_values_in_mutex_and_rwlock() {
    on_runtime(|| {
        let m: Arc<fiber::sync::Mutex<dyn FnMut() -> u32 + Send>> = Arc::new(fiber::sync::Mutex::new({
            let mut n = 0;
            move || {
                n += 1;
                n
            }
        }));
        let m2 = m.clone();
        fiber::spawn(move || (m2.lock().unwrap())()).join().unwrap();
        assert_eq!((m.lock().unwrap())(), 2);
        let rw: &fiber::sync::RwLock<[u8]> = &fiber::sync::RwLock::new([1u8, 2, 3]);
        rw.write().unwrap()[0] = 9;
        assert_eq!(&*rw.read().unwrap(), &[9, 2, 3]);
    });
}

struct NameOnDrop(Arc<std::sync::Mutex<Vec<String>>>);
impl Drop for NameOnDrop {
    fn drop(&mut self) {
        let me = fiber::current();
        let v = fiber::blocking(|| 2);
        self.0
            .lock()
            .unwrap()
            .push(format!("{}:{}", me.name().unwrap_or("?"), v));
    }
}

fiber::fiber_local! {
    static DROPPER: std::cell::RefCell<Option<NameOnDrop>> = const { std::cell::RefCell::new(None) };
}

/// A fiber-local's destructor runs in its fiber: `fiber::current()`
/// still names that fiber there, and it may use `fiber::blocking`.
#[test]
fn a_fiber_local_destructor_sees_its_fiber_and_may_block() {
    on_runtime(|| {
        let log = Arc::new(std::sync::Mutex::new(Vec::new()));
        let l = log.clone();
        fiber::Builder::new()
            .name("worker-a")
            .spawn(move || DROPPER.with_borrow_mut(|d| *d = Some(NameOnDrop(l))))
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(*log.lock().unwrap(), vec!["worker-a:2".to_string()]);
    });
}

/// A worker blocked in the kernel (a std channel `recv`, no yield) while
/// the fiber that would unblock it sits in that worker's queue: with
/// growth on, the monitor must move the queued fiber to a new worker
/// ("made no progress ... drained and replaced").
#[test]
fn a_worker_blocked_on_a_std_channel_is_rescued_by_growth() {
    within(60, || {
        let rt = fiber::Runtime::builder()
            .workers(1)
            .max_workers(2)
            .idle_timeout(ms(200))
            .shutdown_timeout(ms(300))
            .build()
            .unwrap();
        let v = rt.block_on(|| {
            let (tx, rx) = std::sync::mpsc::channel();
            let _sender = fiber::spawn(move || tx.send(42u32).unwrap());
            rx.recv_timeout(Duration::from_secs(20)).expect("the sender never ran")
        });
        assert_eq!(v, 42);
    });
}

/// The same with `std::thread::scope` in a fiber whose scoped thread
/// enters the runtime through `Handle::block_on`.
#[test]
fn a_fiber_in_std_thread_scope_whose_thread_block_ons_the_same_runtime() {
    within(60, || {
        let rt = fiber::Runtime::builder()
            .workers(1)
            .max_workers(2)
            .idle_timeout(ms(200))
            .shutdown_timeout(ms(300))
            .build()
            .unwrap();
        let h = rt.handle();
        let v = rt.block_on(move || {
            std::thread::scope(|s| {
                s.spawn(|| h.block_on(|| fiber::spawn(|| 5).join().unwrap()))
                    .join()
                    .unwrap()
            })
        });
        assert_eq!(v, 5);
    });
}

// -------------------------------------------------------- fifth batch

/// `spawn_pinned`: "resumes a fiber only on the worker it first ran on".
/// A pinned fiber parked while another fiber spins on its home worker
/// past the idle timeout (that worker is drained and replaced) must,
/// once woken, still resume on its home thread (after the spinner), and
/// so must every later wake (timer, channel, lock, blocking call).
#[test]
fn a_pinned_fiber_whose_home_worker_is_drained_by_a_spinner_stays_home() {
    within(60, || {
        let rt = fiber::Runtime::builder()
            .workers(1)
            .max_workers(3)
            .idle_timeout(ms(50))
            .shutdown_timeout(ms(300))
            .build()
            .unwrap();
        let threads = rt.block_on(|| {
            let (tx, rx) = fiber::chan::bounded::<u32>(0);
            let m = Arc::new(fiber::sync::Mutex::new(()));
            let m2 = m.clone();
            let (home_tx, home_rx) = fiber::chan::bounded(1);
            let (ack_tx, ack_rx) = fiber::chan::bounded::<()>(1);
            let pinned = fiber::spawn_pinned(move || {
                let mut seen = vec![std::thread::current().id()];
                home_tx.send(()).unwrap();
                for _ in 0..3 {
                    rx.recv().unwrap();
                    seen.push(std::thread::current().id());
                    fiber::sleep(ms(5)).unwrap();
                    seen.push(std::thread::current().id());
                    drop(m2.lock().unwrap());
                    seen.push(std::thread::current().id());
                    fiber::blocking(|| std::thread::sleep(ms(1)));
                    seen.push(std::thread::current().id());
                    ack_tx.send(()).unwrap();
                }
                seen
            });
            home_rx.recv().unwrap();
            for round in 0..3u32 {
                // A spinner on the pinned fiber's home worker (the only
                // worker when growth has not happened yet; otherwise a
                // pinned spinner spawned from the pinned fiber's worker
                // would be needed, so spin from several fibers).
                let spinners: Vec<_> = (0..2)
                    .map(|_| {
                        fiber::spawn(|| {
                            let t = Instant::now();
                            while t.elapsed() < ms(150) {
                                std::hint::spin_loop();
                            }
                        })
                    })
                    .collect();
                let g = m.lock().unwrap();
                tx.send(round).unwrap();
                fiber::sleep(ms(10)).unwrap();
                drop(g);
                for s in spinners {
                    s.join().unwrap();
                }
                // Wait for the round to finish before locking again (the
                // root re-locking first would be a lock-order deadlock
                // of this test's own making).
                ack_rx.recv().unwrap();
            }
            pinned.join().unwrap()
        });
        drop(rt);
        let home = threads[0];
        assert!(threads.iter().all(|t| *t == home), "a pinned fiber moved: {threads:?}");
    });
}

/// Timer-wheel level boundaries (64 ms, 4096 ms on a 1 ms tick with 64
/// slots per level): deadlines just below, at and above them, started at
/// staggered phases, never fire early.
#[test]
fn timers_at_wheel_level_boundaries_never_fire_early() {
    on_runtime(|| {
        let ds_us: Vec<u64> = vec![
            63_500, 64_000, 64_001, 65_000, 127_999, 128_000, 4_095_000, 4_096_000, 4_097_500,
        ];
        let hs: Vec<_> = ds_us
            .iter()
            .enumerate()
            .flat_map(|(i, &us)| {
                (0..3u64).map(move |phase| {
                    fiber::spawn(move || {
                        fiber::sleep(Duration::from_micros(phase * 333 + i as u64 * 17)).unwrap();
                        let d = Duration::from_micros(us);
                        let t = Instant::now();
                        fiber::sleep(d).unwrap();
                        let a = t.elapsed();
                        let t = Instant::now();
                        let (_tx, rx) = fiber::chan::bounded::<()>(0);
                        assert!(rx.recv_timeout(d).is_err());
                        let b = t.elapsed();
                        (d, a, b)
                    })
                })
            })
            .collect();
        for h in hs {
            let (d, a, b) = h.join().unwrap();
            assert!(a >= d, "sleep({d:?}) returned after {a:?}");
            assert!(b >= d, "recv_timeout({d:?}) returned after {b:?}");
        }
    });
}

/// A reader whose short reads mark the socket drained must not miss data
/// that arrives just after such a read (a lost readiness edge would park
/// the reader for ever with bytes queued). A plain thread writes small
/// pieces with no pauses, racing the fiber's reads, under each I/O mode.
#[test]
fn short_reads_racing_a_writer_never_lose_a_wakeup() {
    for (harvest, park) in [(true, false), (false, false), (true, true)] {
        within(120, move || {
            let rt = fiber::Runtime::builder()
                .workers(2)
                .io_harvest(harvest)
                .io_park(park)
                .shutdown_timeout(ms(300))
                .build()
                .unwrap();
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            const N: usize = 200_000;
            let writer = std::thread::spawn(move || {
                let (mut s, _) = l.accept().unwrap();
                s.set_nodelay(true).unwrap();
                let mut sent = 0;
                let mut k = 0usize;
                while sent < N {
                    let n = (1 + k % 7).min(N - sent);
                    let buf: Vec<u8> = (sent..sent + n).map(|i| i as u8).collect();
                    s.write_all(&buf).unwrap();
                    sent += n;
                    k += 1;
                    if k % 64 == 0 {
                        std::thread::yield_now();
                    }
                }
            });
            let got = rt.block_on(move || {
                let mut c = fiber::net::TcpStream::connect(addr).unwrap();
                let mut total = 0usize;
                let mut buf = [0u8; 16];
                let r = fiber::with_timeout(Duration::from_secs(60), || {
                    while total < N {
                        let n = c.read(&mut buf).unwrap();
                        assert!(n > 0, "EOF after {total}");
                        for (j, &b) in buf[..n].iter().enumerate() {
                            assert_eq!(b, (total + j) as u8);
                        }
                        total += n;
                    }
                });
                (r.is_ok(), total)
            });
            writer.join().unwrap();
            assert_eq!(got, (true, N), "harvest={harvest} park={park}");
        });
    }
}

/// Several fibers parked in `recv_from` on one UDP socket (clones and
/// the socket itself): each datagram is received by exactly one of them
/// and none is left unreceived (a lost readiness edge between waiters
/// would leave a datagram queued while every receiver stays parked).
#[test]
fn many_receivers_on_one_udp_socket_lose_no_datagram() {
    for harvest in [true, false] {
        within(120, move || {
            let rt = fiber::Runtime::builder()
                .workers(2)
                .io_harvest(harvest)
                .shutdown_timeout(ms(300))
                .build()
                .unwrap();
            let sock = fiber::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            let addr = sock.local_addr().unwrap();
            let (ack_tx, ack_rx) = std::sync::mpsc::channel::<u32>();
            let h = rt.handle();
            let receivers: Vec<_> = (0..4)
                .map(|_| {
                    let s = sock.try_clone().unwrap();
                    let ack = ack_tx.clone();
                    h.spawn(move || {
                        let mut buf = [0u8; 4];
                        loop {
                            match s.recv_from(&mut buf) {
                                Ok((4, _)) => {
                                    let v = u32::from_le_bytes(buf);
                                    if v == u32::MAX {
                                        return;
                                    }
                                    ack.send(v).unwrap();
                                }
                                Ok(_) => panic!("short datagram"),
                                Err(_) => return,
                            }
                        }
                    })
                })
                .collect();
            let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            for i in 0..3000u32 {
                tx.send_to(&i.to_le_bytes(), addr).unwrap();
                let got = ack_rx
                    .recv_timeout(Duration::from_secs(5))
                    .unwrap_or_else(|_| panic!("datagram {i} never received (harvest={harvest})"));
                assert_eq!(got, i);
            }
            for _ in 0..4 {
                tx.send_to(&u32::MAX.to_le_bytes(), addr).unwrap();
            }
            for r in receivers {
                r.join().unwrap();
            }
            drop(sock);
        });
    }
}

/// `Builder::spawn_scoped` "from a fiber or from a plain thread that
/// borrows the scope": a plain thread inside the scope body spawns
/// scoped children that borrow the caller's data; the scope waits for
/// them.
#[test]
fn a_plain_thread_spawns_into_a_fiber_scope() {
    on_runtime(|| {
        let data = [1u32, 2, 3];
        let total = AtomicUsize::new(0);
        fiber::scope(|s| {
            std::thread::scope(|ts| {
                ts.spawn(|| {
                    for _ in 0..3 {
                        fiber::Builder::new()
                            .name("from-thread")
                            .spawn_scoped(s, || {
                                fiber::sleep(ms(20)).unwrap();
                                total.fetch_add(data.iter().sum::<u32>() as usize, SeqCst);
                            })
                            .unwrap();
                    }
                    s.spawn(|| total.fetch_add(100, SeqCst));
                });
            });
        });
        assert_eq!(total.load(SeqCst), 118);
    });
}

/// std: `Condvar::wait_timeout` on a mutex poisoned while waiting
/// returns `Err` holding both the guard and the timeout result.
#[test]
fn condvar_wait_timeout_on_a_mutex_poisoned_meanwhile() {
    on_runtime(|| {
        let pair = Arc::new((fiber::sync::Mutex::new(0), fiber::sync::Condvar::new()));
        let p = pair.clone();
        let waiter = fiber::spawn(move || {
            let (m, cv) = &*p;
            let g = m.lock().unwrap();
            match cv.wait_timeout(g, Duration::from_secs(5)) {
                Err(e) => {
                    let (g, res) = e.into_inner();
                    (true, *g, res.timed_out())
                }
                Ok((g, res)) => (false, *g, res.timed_out()),
            }
        });
        while fiber::stats().runtime.fibers_parked < 1 {
            fiber::sleep(ms(1)).unwrap();
        }
        let p = pair.clone();
        let _ = fiber::spawn(move || {
            let mut g = p.0.lock().unwrap();
            *g = 9;
            p.1.notify_all();
            panic!("poison while the waiter waits");
        })
        .join();
        assert_eq!(waiter.join().unwrap(), (true, 9, false));
    });
}

/// std: Unix socket paths with an interior NUL or longer than
/// `sun_path` are `InvalidInput` errors (not a panic, not a truncated
/// path); binding an existing path is `AddrInUse`; connecting a stream to
/// a datagram socket's path fails at once.
#[test]
fn unix_socket_path_edge_values_are_errors_like_std() {
    use fiber::net::unix::{UnixDatagram, UnixListener, UnixStream};
    on_runtime(|| {
        let nul = "/tmp/fiber-adv3-a\0b";
        let long = format!("/tmp/{}", "x".repeat(200));
        for p in [nul, long.as_str()] {
            let std_kind = std::os::unix::net::UnixListener::bind(p).unwrap_err().kind();
            assert_eq!(UnixListener::bind(p).unwrap_err().kind(), std_kind, "bind {p:?}");
            let std_kind = std::os::unix::net::UnixStream::connect(p).unwrap_err().kind();
            let r = fiber::with_timeout(Duration::from_secs(2), || UnixStream::connect(p).map(|_| ()));
            assert_eq!(r.expect("connect hung").unwrap_err().kind(), std_kind, "connect {p:?}");
            let std_kind = std::os::unix::net::UnixDatagram::bind(p).unwrap_err().kind();
            assert_eq!(UnixDatagram::bind(p).unwrap_err().kind(), std_kind, "dgram bind {p:?}");
            let d = UnixDatagram::unbound().unwrap();
            let sd = std::os::unix::net::UnixDatagram::unbound().unwrap();
            assert_eq!(
                d.send_to(b"x", p).unwrap_err().kind(),
                sd.send_to(b"x", p).unwrap_err().kind(),
                "send_to {p:?}"
            );
        }
        let dir = std::env::temp_dir().join(format!("fiber-adv3-u-{}", std::process::id()));
        let _ = std::fs::remove_file(&dir);
        let _l = UnixListener::bind(&dir).unwrap();
        assert_eq!(UnixListener::bind(&dir).unwrap_err().kind(), ErrorKind::AddrInUse);
        let _ = std::fs::remove_file(&dir);
        let dg = UnixDatagram::bind(&dir).unwrap();
        let r = fiber::with_timeout(Duration::from_secs(2), || UnixStream::connect(&dir).map(|_| ()));
        assert!(r.expect("a stream connect to a datagram socket hung").is_err());
        drop(dg);
        let _ = std::fs::remove_file(&dir);
    });
}

/// std: after `shutdown(Both)` on a Unix stream, reads return 0 and
/// writes fail with `BrokenPipe`, at once, on this handle and its clone.
#[test]
fn unix_stream_shutdown_both_ends_reads_and_writes_at_once() {
    on_runtime(|| {
        let (a, _b) = fiber::net::unix::UnixStream::pair().unwrap();
        let c = a.try_clone().unwrap();
        a.shutdown(std::net::Shutdown::Both).unwrap();
        for s in [&a, &c] {
            let r = fiber::with_timeout(Duration::from_secs(2), || {
                let mut s = s;
                (
                    s.read(&mut [0u8; 4]).map_err(|e| e.kind()),
                    s.write(b"x").map_err(|e| e.kind()),
                )
            });
            assert_eq!(r.expect("hung after shutdown"), (Ok(0), Err(ErrorKind::BrokenPipe)));
        }
    });
}

/// The smallest stack size the configuration accepts (16k) must still
/// run ordinary fiber code (spawn, join, a channel, a sleep, a lock, a
/// socket) in the build the tests use, or be refused at `build()`: an
/// accepted setting that makes every fiber overflow is an abort, not an
/// error.
#[test]
fn the_minimum_accepted_stack_size_runs_ordinary_fibers() {
    let (stderr, status) = child_stderr_for("min_stack_child", 60);
    assert!(
        status.map(|s| s.success()).unwrap_or(false),
        "exited {status:?}; stderr:\n{stderr}"
    );
}

#[test]
fn min_stack_child() {
    if !is_child("min_stack_child") {
        return;
    }
    let rt = match fiber::Runtime::builder()
        .workers(2)
        .stack_size(16 * 1024)
        .shutdown_timeout(ms(300))
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("refused at build: {e}");
            return;
        }
    };
    let v = rt.block_on(|| {
        let (tx, rx) = fiber::chan::bounded(1);
        let h = fiber::spawn(move || {
            fiber::sleep(ms(1)).unwrap();
            tx.send(2u32).unwrap();
            3u32
        });
        let m = fiber::sync::Mutex::new(4u32);
        let got = rx.recv().unwrap() + h.join().unwrap() + *m.lock().unwrap();
        let l = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = fiber::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        drop(c);
        got
    });
    assert_eq!(v, 9);
}

fn fds_now() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Runtimes with the dump signal installed, sockets, timers and blocking
/// calls, built and dropped in a loop: no threads and no descriptors are
/// left behind (signal handling threads, epoll/eventfd descriptors).
#[test]
fn many_runtimes_with_a_dump_signal_leave_no_threads_or_fds() {
    in_child("many_runtimes_with_a_dump_signal_leave_no_threads_or_fds", 120, || {
        let one = || {
            let mut b = fiber::Runtime::builder();
            b.workers(2).shutdown_timeout(ms(300));
            let mut config = b.config().unwrap();
            config.dump_signal = Some(libc::SIGUSR2);
            let rt = fiber::Runtime::with_config(config).unwrap();
            rt.block_on(|| {
                let l = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
                let a = l.local_addr().unwrap();
                let c = fiber::spawn(move || fiber::net::TcpStream::connect(a).unwrap());
                let (_s, _) = l.accept().unwrap();
                let _c = c.join().unwrap();
                let u = fiber::net::UdpSocket::bind("127.0.0.1:0").unwrap();
                u.set_read_timeout(Some(ms(2))).unwrap();
                let _ = u.recv(&mut [0u8; 1]);
                let (p, q) = fiber::net::unix::UnixStream::pair().unwrap();
                drop((p, q));
                fiber::blocking(|| 1);
                fiber::sleep(ms(1)).unwrap();
            });
        };
        for _ in 0..3 {
            one();
        }
        std::thread::sleep(ms(300));
        let (t0, f0) = (threads_now(), fds_now());
        for _ in 0..20 {
            one();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while (threads_now() > t0 || fds_now() > f0) && Instant::now() < deadline {
            std::thread::sleep(ms(20));
        }
        assert!(threads_now() <= t0, "threads {} -> {}", t0, threads_now());
        assert!(fds_now() <= f0, "fds {} -> {}", f0, fds_now());
        // The signal still prints a dump for a live runtime, not for the
        // dropped ones (no crash). With none alive, the signal's previous
        // action is back (`adversarial_dump_signal.rs`), so one is kept.
        let mut b = fiber::Runtime::builder();
        b.workers(1).shutdown_timeout(ms(300));
        let mut config = b.config().unwrap();
        config.dump_signal = Some(libc::SIGUSR2);
        let live = fiber::Runtime::with_config(config).unwrap();
        // SAFETY: `raise` only sends a signal to this process; the live
        // runtime has installed a handler for SIGUSR2 (its dump signal).
        unsafe { libc::raise(libc::SIGUSR2) };
        std::thread::sleep(ms(100));
        drop(live);
    });
}

/// A tiny xorshift for the stress probes.
fn rng(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

/// RwLock under a mix of fibers and plain threads doing read, write,
/// try_read, try_write and write-then-downgrade, with parks inside
/// critical sections: the invariant (writers exclusive, readers see a
/// consistent pair) holds and nobody is left waiting.
#[test]
fn rwlock_mixed_threads_and_fibers_with_downgrade_stress() {
    within(120, || {
        let rt = rt_fixed_grace(2, ms(300));
        let lock = Arc::new(fiber::sync::RwLock::new((0u64, 0u64)));
        let body = |lock: Arc<fiber::sync::RwLock<(u64, u64)>>, mut seed: u64, in_fiber: bool| {
            let mut writes = 0u64;
            for _ in 0..1500 {
                match rng(&mut seed) % 5 {
                    0 => {
                        let g = lock.read().unwrap();
                        assert_eq!(g.0, g.1);
                        if in_fiber && seed % 3 == 0 {
                            fiber::yield_now().unwrap();
                        }
                        assert_eq!(g.0, g.1);
                    }
                    1 => {
                        let mut g = lock.write().unwrap();
                        g.0 += 1;
                        if in_fiber && seed % 3 == 0 {
                            fiber::yield_now().unwrap();
                        }
                        g.1 += 1;
                        writes += 1;
                    }
                    2 => {
                        if let Ok(g) = lock.try_read() {
                            assert_eq!(g.0, g.1);
                        }
                    }
                    3 => {
                        if let Ok(mut g) = lock.try_write() {
                            g.0 += 1;
                            g.1 += 1;
                            writes += 1;
                        }
                    }
                    _ => {
                        let mut g = lock.write().unwrap();
                        g.0 += 1;
                        g.1 += 1;
                        writes += 1;
                        let r = fiber::sync::RwLockWriteGuard::downgrade(g);
                        assert_eq!(r.0, r.1);
                        if in_fiber {
                            fiber::yield_now().unwrap();
                        }
                        assert_eq!(r.0, r.1);
                    }
                }
            }
            writes
        };
        let threads: Vec<_> = (0..2u64)
            .map(|i| {
                let l = lock.clone();
                std::thread::spawn(move || body(l, 0x9E37_79B9 + i, false))
            })
            .collect();
        let l = lock.clone();
        let fibers_writes = rt.block_on(move || {
            let hs: Vec<_> = (0..6u64)
                .map(|i| {
                    let l = l.clone();
                    fiber::spawn(move || body(l, 0xDEAD_BEEF + i * 7, true))
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum::<u64>()
        });
        let thread_writes: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
        let g = lock.read().unwrap();
        assert_eq!(g.0, fibers_writes + thread_writes);
        assert_eq!(g.0, g.1);
    });
}

/// A bounded queue built from one Mutex and two Condvars, used by fibers
/// and plain threads, producers using `wait_timeout` and consumers
/// `wait_while`, with `notify_one` only: every item is delivered once
/// and nobody waits for ever (a lost notify_one would hang it).
#[test]
fn condvar_bounded_queue_with_notify_one_threads_and_fibers() {
    within(120, || {
        struct Q {
            m: fiber::sync::Mutex<std::collections::VecDeque<u64>>,
            not_empty: fiber::sync::Condvar,
            not_full: fiber::sync::Condvar,
        }
        let q = Arc::new(Q {
            m: fiber::sync::Mutex::new(Default::default()),
            not_empty: fiber::sync::Condvar::new(),
            not_full: fiber::sync::Condvar::new(),
        });
        const PER: u64 = 3000;
        let produce = |q: Arc<Q>, base: u64| {
            for i in 0..PER {
                let mut g = q.m.lock().unwrap();
                while g.len() >= 4 {
                    g = q.not_full.wait_timeout(g, ms(50)).unwrap().0;
                }
                g.push_back(base + i);
                drop(g);
                q.not_empty.notify_one();
            }
        };
        let consume = |q: Arc<Q>, n: u64| {
            let mut sum = 0u64;
            for _ in 0..n {
                let g = q.m.lock().unwrap();
                let mut g = q.not_empty.wait_while(g, |d| d.is_empty()).unwrap();
                sum += g.pop_front().unwrap();
                drop(g);
                q.not_full.notify_one();
            }
            sum
        };
        let rt = rt_fixed_grace(2, ms(300));
        let (q1, q2) = (q.clone(), q.clone());
        let tp = std::thread::spawn(move || produce(q1, 1_000_000));
        let tc = std::thread::spawn(move || consume(q2, PER));
        let q3 = q.clone();
        let fiber_sum = rt.block_on(move || {
            let ps: Vec<_> = (0..2u64)
                .map(|k| {
                    let q = q3.clone();
                    fiber::spawn(move || produce(q, (k + 2) * 1_000_000))
                })
                .collect();
            let cs: Vec<_> = (0..2)
                .map(|_| {
                    let q = q3.clone();
                    fiber::spawn(move || consume(q, PER))
                })
                .collect();
            for p in ps {
                p.join().unwrap();
            }
            cs.into_iter().map(|c| c.join().unwrap()).sum::<u64>()
        });
        tp.join().unwrap();
        let total = fiber_sum + tc.join().unwrap();
        let expect: u64 = [1u64, 2, 3]
            .iter()
            .map(|b| (0..PER).map(|i| b * 1_000_000 + i).sum::<u64>())
            .sum();
        assert_eq!(total, expect);
    });
}

/// std: `unpark` before the thread parks leaves a token, even when the
/// thread has not started running yet (`JoinHandle::thread().unpark()`
/// right after `spawn`). The fiber's first `park` then returns at once.
#[test]
fn unpark_of_a_fiber_that_has_not_started_yet_is_kept() {
    within(30, || {
        rt1().block_on(|| {
            let a = fiber::spawn(|| {
                fiber::park();
                1
            });
            a.fiber().unpark();
            let b = fiber::Builder::new()
                .name("b")
                .spawn(|| {
                    fiber::park();
                    2
                })
                .unwrap();
            b.fiber().unpark();
            let c = fiber::spawn_pinned(|| {
                fiber::park_timeout(Duration::from_secs(20));
                3
            });
            c.fiber().unpark();
            let r = fiber::with_timeout(Duration::from_secs(5), || {
                a.join().unwrap() + b.join().unwrap() + c.join().unwrap()
            });
            assert_eq!(r.expect("a token given before the first run was lost"), 6);
        });
    });
}

/// std: `Builder::spawn` reports a thread that cannot be created as an
/// error. When `build()` fails because a later worker thread cannot be
/// started, the workers already started must end too (no leaked,
/// forever-parked threads), and a later runtime still works.
#[test]
fn a_build_failing_at_a_later_worker_leaves_no_threads() {
    in_child("a_build_failing_at_a_later_worker_leaves_no_threads", 60, || {
        let before = threads_now();
        let mut outcome = None;
        // Find a limit at which some but not all workers start.
        for extra_mib in [3u64, 5, 7, 9, 12, 16, 24] {
            let vm = vm_kib("VmSize:") as u64 * 1024;
            limit_address_space(vm + extra_mib * 1024 * 1024);
            let r = fiber::Runtime::builder()
                .workers(8)
                .max_workers(8)
                .shutdown_timeout(ms(200))
                .build();
            limit_address_space(u64::MAX);
            match r {
                Err(e) => {
                    outcome = Some(e.to_string());
                    if !e.to_string().contains("worker thread 0") {
                        break;
                    }
                }
                Ok(rt) => {
                    drop(rt);
                    break;
                }
            }
        }
        eprintln!("outcome: {outcome:?}");
        let deadline = Instant::now() + Duration::from_secs(5);
        while threads_now() > before && Instant::now() < deadline {
            std::thread::sleep(ms(20));
        }
        let names: Vec<String> = std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("comm")).ok())
            .map(|s| s.trim().to_string())
            .collect();
        assert!(
            threads_now() <= before,
            "threads left after a failed build: {names:?} ({outcome:?})"
        );
        assert_eq!(rt2().block_on(|| 5), 5);
    });
}

/// As above, for the thread `build()` starts after the workers (the
/// monitor): with the address space capped so that one worker thread
/// (its 2 MiB stack and its signal stack) fits but a second thread does
/// not, `build()` fails, and the worker it already started must end.
#[test]
fn a_build_failing_after_its_workers_started_leaves_no_threads() {
    in_child(
        "a_build_failing_after_its_workers_started_leaves_no_threads",
        60,
        || {
            let before = threads_now();
            let mut outcomes = Vec::new();
            // From one worker's stack and signal stack upwards, in 32 KiB
            // steps, until a build gets past the worker (fails on the next
            // thread, or succeeds).
            for step in 0..64u64 {
                let vm = vm_kib("VmSize:") as u64 * 1024;
                limit_address_space(vm + (2048 + 96) * 1024 + step * 32 * 1024);
                let r = fiber::Runtime::builder()
                    .workers(1)
                    .max_workers(1)
                    .shutdown_timeout(ms(200))
                    .build();
                limit_address_space(u64::MAX);
                match r {
                    Err(e) if e.to_string().contains("worker thread") => outcomes.push(e.to_string()),
                    Err(e) => {
                        outcomes.push(e.to_string());
                        break;
                    }
                    Ok(rt) => {
                        drop(rt);
                        outcomes.push("ok".into());
                        break;
                    }
                }
            }
            outcomes.dedup();
            let deadline = Instant::now() + Duration::from_secs(5);
            while threads_now() > before && Instant::now() < deadline {
                std::thread::sleep(ms(20));
            }
            let names: Vec<String> = std::fs::read_dir("/proc/self/task")
                .unwrap()
                .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("comm")).ok())
                .map(|s| s.trim().to_string())
                .collect();
            assert!(
                threads_now() <= before,
                "threads left after failed builds: {names:?} (outcomes: {outcomes:?})"
            );
        },
    );
}

/// A worker drained for making no progress exits once its fiber returns;
/// a replacement is started "at once if the pool is below its ceiling".
/// When the replacement thread cannot be created at that moment (the
/// address space is full while the spinner spins) the runtime must not
/// end up with no worker at all once resources are back: the sleeping
/// fibers still finish.
#[test]
fn a_failed_replacement_of_a_drained_worker_does_not_leave_the_runtime_empty() {
    in_child(
        "a_failed_replacement_of_a_drained_worker_does_not_leave_the_runtime_empty",
        60,
        || {
            let rt = fiber::Runtime::builder()
                .workers(1)
                .max_workers(2)
                .idle_timeout(ms(50))
                .shutdown_timeout(ms(300))
                .build()
                .unwrap();
            let (tx, rx) = std::sync::mpsc::channel();
            let h = rt.handle();
            let sleepers: Vec<_> = (0..4)
                .map(|i| {
                    h.spawn(move || {
                        fiber::sleep(ms(600)).unwrap();
                        i
                    })
                })
                .collect();
            let spinner = h.spawn(move || {
                let vm = vm_kib("VmSize:") as u64 * 1024;
                // Room for the heap to grow a few times (the monitor logs
                // the drain meanwhile; with 256 KiB a small allocation
                // failed now and then and aborted the child; with 1 MiB a
                // thread start once found no room for std's alternate
                // signal stack and aborted), not for a thread's 2 MiB
                // stack: the replacement worker cannot start.
                limit_address_space(vm + 1792 * 1024);
                let t = Instant::now();
                while t.elapsed() < ms(400) {
                    std::hint::spin_loop();
                }
                limit_address_space(u64::MAX);
                tx.send(()).unwrap();
            });
            rx.recv_timeout(Duration::from_secs(10)).expect("the spinner never ran");
            let (done_tx, done_rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let sum: i32 = sleepers.into_iter().map(|s| s.join().unwrap()).sum();
                spinner.join().unwrap();
                done_tx.send(sum).unwrap();
            });
            let sum = done_rx
                .recv_timeout(Duration::from_secs(15))
                .unwrap_or_else(|_| panic!("fibers never finished; stats: {}", rt.stats()));
            assert_eq!(sum, 6);
            eprintln!("{}", rt.stats());
        },
    );
}

/// README: "A fiber that spins for more than 10 ms makes the pool grow
/// (up to max_workers)". A growth whose thread could not be created once
/// (the address space was full for a moment) must not cost the pool that
/// worker slot for good: a later spinner still gets the pool to grow, so
/// the fiber that releases it runs.
#[test]
fn a_failed_growth_does_not_disable_growth_for_good() {
    in_child("a_failed_growth_does_not_disable_growth_for_good", 60, || {
        let rt = fiber::Runtime::builder()
            .workers(1)
            .max_workers(2)
            .shutdown_timeout(ms(300))
            .build()
            .unwrap();
        let released = rt.block_on(|| {
            // Phase 1: a spinner while no thread can be created, and a
            // fiber that becomes runnable behind it (so growth is tried).
            let waiting = fiber::spawn(|| fiber::sleep(ms(30)).unwrap());
            fiber::spawn(|| {
                let vm = vm_kib("VmSize:") as u64 * 1024;
                limit_address_space(vm + 256 * 1024);
                let t = Instant::now();
                while t.elapsed() < ms(300) {
                    std::hint::spin_loop();
                }
                limit_address_space(u64::MAX);
            })
            .join()
            .unwrap();
            waiting.join().unwrap();
            fiber::sleep(ms(100)).unwrap();
            // Phase 2: a spinner that only another fiber can release.
            let flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let f = flag.clone();
            let spinner = fiber::spawn(move || {
                let t = Instant::now();
                while !f.load(SeqCst) {
                    // Give up before the 5 s drain of a worker that makes
                    // no progress (a drain without a replacement empties
                    // the pool: see the test above).
                    if t.elapsed() > Duration::from_secs(3) {
                        return false;
                    }
                    std::hint::spin_loop();
                }
                true
            });
            let f = flag.clone();
            let setter = fiber::spawn(move || {
                fiber::sleep(ms(20)).unwrap();
                f.store(true, SeqCst);
            });
            setter.join().unwrap();
            spinner.join().unwrap()
        });
        let stats = rt.stats();
        eprintln!("{stats}");
        assert!(released, "the pool never grew again after one failed growth:\n{stats}");
    });
}
