//! Review 42: a sweep of the facade's public API across calling contexts
//! (a plain thread with no runtime, a plain thread beside a runtime, a
//! `fiber::blocking` closure, destructors run by a panic's unwind and by a
//! runtime's teardown, objects used after their runtime is gone, objects of
//! one runtime used from another's fibers) and with extreme arguments.
use crate::common::*;

use fiber::chan;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

/// The message of `f`'s panic, which it must raise.
fn must_panic(what: &str, f: impl FnOnce()) -> String {
    panic_message(f).unwrap_or_else(|| panic!("{what} must panic here"))
}

// ---------------------------------------------------------------------------
// (a) a plain thread, no runtime at all
// ---------------------------------------------------------------------------

#[test]
fn fiber_only_calls_on_a_bare_thread_name_themselves() {
    within(20, || {
        for (name, f) in [
            (
                "current",
                Box::new(|| drop(fiber::current())) as Box<dyn FnOnce() + Send>,
            ),
            ("stats", Box::new(|| drop(fiber::stats()))),
            (
                "sleep",
                Box::new(|| {
                    let _ = fiber::sleep(Duration::ZERO);
                }),
            ),
            ("spawn", Box::new(|| drop(fiber::spawn(|| ())))),
            (
                "Builder::spawn",
                Box::new(|| drop(fiber::Builder::new().stack_size(0).spawn(|| ()))),
            ),
        ] {
            let msg = must_panic(name, f);
            assert!(
                msg.contains(&format!("fiber::{name} called outside a fiber")),
                "{name}: {msg}"
            );
        }
        // What works on a plain thread does what std would.
        assert_eq!(fiber::non_cancellable(|| 5), 5);
        assert!(fiber::yield_now().is_ok());
        assert!(!fiber::is_cancelled());
        fiber::park_timeout(Duration::ZERO);
        assert_eq!(fiber::blocking(|| 7), 7);
    })
}

#[test]
fn timer_channels_on_a_bare_thread_follow_crossbeam() {
    within(20, || {
        let start = Instant::now();
        assert!(
            chan::after(Duration::ZERO).try_recv().is_ok(),
            "after(0) is due at once"
        );
        let past = start.checked_sub(Duration::from_secs(1)).unwrap();
        assert_eq!(
            chan::at(past).recv().unwrap(),
            past,
            "at(past) delivers its instant at once"
        );
        let forever = chan::after(Duration::MAX);
        assert!(forever.recv_timeout(ms(5)).unwrap_err().is_timeout());
        assert!(forever.is_empty());
        let t = chan::tick(Duration::ZERO);
        for _ in 0..3 {
            t.recv_timeout(Duration::from_secs(5))
                .expect("a zero tick is always due");
        }
        assert!(chan::never::<u8>().recv_timeout(ms(2)).unwrap_err().is_timeout());
        assert!(chan::never::<u8>().recv_deadline(past).unwrap_err().is_timeout());
    })
}

// ---------------------------------------------------------------------------
// (b) a plain thread while a runtime runs elsewhere
// ---------------------------------------------------------------------------

#[test]
fn a_thread_beside_a_running_runtime_is_still_a_plain_thread() {
    within(30, || {
        let rt = rt();
        let handle = rt.handle();
        std::thread::spawn(move || {
            let msg = must_panic("spawn", || drop(fiber::spawn(|| ())));
            assert!(msg.contains("outside a fiber"), "{msg}");
            let msg = must_panic("Handle::current", || drop(fiber::Handle::current()));
            assert!(msg.contains("Handle::current"), "{msg}");
            assert!(fiber::Handle::try_current().is_none());
            assert!(fiber::Job::try_current().is_none());
            assert_eq!(fiber::blocking(|| 3), 3, "blocking on a thread just calls");
            // The handle works from here.
            assert_eq!(handle.spawn(|| 4).join().unwrap(), 4);
            assert_eq!(handle.block_on(|| 5), 5);
        })
        .join()
        .unwrap();
        drop(rt);
    })
}

// ---------------------------------------------------------------------------
// (c) inside a fiber::blocking closure
// ---------------------------------------------------------------------------

#[test]
fn fiber_only_calls_inside_blocking_name_the_blocking_pool() {
    let msgs = on_runtime(|| {
        fiber::blocking(|| {
            [
                ("current", panic_message(|| drop(fiber::current()))),
                ("stats", panic_message(|| drop(fiber::stats()))),
                ("dump", panic_message(|| drop(fiber::dump()))),
                ("spawn", panic_message(|| drop(fiber::spawn(|| ())))),
                ("spawn_pinned", panic_message(|| drop(fiber::spawn_pinned(|| ())))),
                (
                    "sleep_until",
                    panic_message(|| {
                        let _ = fiber::sleep_until(Instant::now());
                    }),
                ),
                (
                    "Builder::spawn",
                    panic_message(|| drop(fiber::Builder::new().spawn(|| ()))),
                ),
            ]
        })
    });
    for (name, msg) in msgs {
        let msg = msg.unwrap_or_else(|| panic!("fiber::{name} must panic inside blocking"));
        assert!(
            msg.contains(&format!("fiber::{name} called inside a fiber::blocking call")),
            "{name}: {msg}"
        );
    }
}

#[test]
fn inside_blocking_the_handle_of_the_runtime_spawns_and_block_ons() {
    let (spawned, rooted, yielded, same_job) = on_runtime(|| {
        let caller_job = fiber::Job::current().id();
        fiber::blocking(move || {
            let handle = fiber::Handle::current();
            let spawned = handle.spawn(|| 3).join().unwrap();
            let rooted = handle.block_on(|| fiber::spawn(|| 4).join().unwrap());
            let yielded = fiber::yield_now().is_ok();
            fiber::park_timeout(ms(1));
            let same_job = fiber::Job::try_current().map(|j| j.id() == caller_job);
            (spawned, rooted, yielded, same_job)
        })
    });
    assert_eq!((spawned, rooted), (3, 4));
    assert!(yielded);
    assert_ne!(same_job, Some(false), "a job seen inside blocking is the caller's");
}

#[test]
fn a_scope_borrowed_into_blocking_spawns_children_on_its_runtime() {
    let total = on_runtime(|| {
        let mut hits = 0;
        let r = fiber::scope(|s| {
            let a = fiber::blocking(|| s.spawn(|| fiber::current().id()).join().unwrap());
            let b = s.spawn(|| 2).join().unwrap();
            hits += 1;
            (a, b)
        });
        assert_eq!(r.1, 2);
        hits
    });
    assert_eq!(total, 1);
}

// ---------------------------------------------------------------------------
// (d) destructors run by a panic's unwind, and by teardown
// ---------------------------------------------------------------------------

#[test]
fn a_destructor_in_a_panic_unwind_uses_the_whole_api() {
    #[derive(Default, Debug)]
    struct Seen {
        spawned: Option<u32>,
        scoped: Option<u32>,
        timed: Option<Result<u32, fiber::TimedOut>>,
        blocked: Option<u32>,
        received: Option<u32>,
        slept: Option<bool>,
        job: Option<bool>,
    }
    static SEEN: StdMutex<Option<Seen>> = StdMutex::new(None);
    struct UsesApi(chan::Receiver<u32>);
    impl Drop for UsesApi {
        fn drop(&mut self) {
            let seen = Seen {
                spawned: fiber::spawn(|| 1).join().ok(),
                scoped: fiber::scope(|s| s.spawn(|| 2).join().ok()),
                timed: Some(fiber::with_timeout(Duration::from_secs(10), || 3)),
                blocked: Some(fiber::blocking(|| 4)),
                received: self.0.recv().ok(),
                slept: Some(fiber::sleep(ms(1)).is_ok()),
                job: Some(fiber::Job::try_current().is_some()),
            };
            *SEEN.lock().unwrap() = Some(seen);
        }
    }
    within(60, || {
        let rt = rt1();
        let err = rt.block_on(|| {
            let (tx, rx) = chan::bounded(0);
            let feeder = fiber::spawn(move || tx.send(5).is_ok());
            let victim = fiber::spawn(move || {
                let _guard = UsesApi(rx);
                panic!("boom-42");
            });
            let err = victim.join().unwrap_err();
            assert!(feeder.join().unwrap());
            err
        });
        assert!(err.is_panic());
        assert_eq!(err.downcast_ref::<&str>(), Some(&"boom-42"), "the original payload");
        let seen = SEEN.lock().unwrap().take().expect("the destructor ran");
        assert_eq!(seen.spawned, Some(1), "{seen:?}");
        assert_eq!(seen.scoped, Some(2), "{seen:?}");
        assert_eq!(seen.timed, Some(Ok(3)), "{seen:?}");
        assert_eq!(seen.blocked, Some(4), "{seen:?}");
        assert_eq!(seen.received, Some(5), "{seen:?}");
        assert_eq!(seen.slept, Some(true), "{seen:?}");
        assert_eq!(seen.job, Some(true), "{seen:?}");
    })
}

#[test]
fn a_destructor_at_teardown_gets_clear_outcomes_from_the_api() {
    in_child("a_destructor_at_teardown_gets_clear_outcomes_from_the_api", 60, || {
        #[derive(Default, Debug)]
        struct Seen {
            spawn_join_cancelled: Option<bool>,
            blocked: Option<u32>,
            current_ok: bool,
            sleep_cancelled: Option<bool>,
            timed: Option<Result<u32, fiber::TimedOut>>,
            stats_ok: bool,
        }
        static SEEN: StdMutex<Option<Seen>> = StdMutex::new(None);
        struct AtTeardown;
        impl Drop for AtTeardown {
            fn drop(&mut self) {
                let seen = Seen {
                    spawn_join_cancelled: Some(fiber::spawn(|| 1).join().is_err_and(|e| e.is_cancelled())),
                    blocked: Some(fiber::blocking(|| 4)),
                    current_ok: panic_message(|| drop(fiber::current())).is_none(),
                    sleep_cancelled: Some(fiber::sleep(Duration::from_secs(30)).is_err()),
                    timed: Some(fiber::with_timeout(Duration::from_secs(30), || 6)),
                    stats_ok: panic_message(|| drop(fiber::stats())).is_none(),
                };
                *SEEN.lock().unwrap() = Some(seen);
            }
        }
        within(40, || {
            let rt = rt_fixed_grace(1, ms(50));
            let (tx, rx) = std::sync::mpsc::channel();
            rt.spawn(move || {
                let _guard = AtTeardown;
                tx.send(()).unwrap();
                stubborn_sleep();
            });
            rx.recv().unwrap();
            wait_parked(&rt, 1);
            drop(rt);
            let seen = SEEN.lock().unwrap().take().expect("the destructor ran at teardown");
            assert_eq!(seen.spawn_join_cancelled, Some(true), "{seen:?}");
            assert_eq!(seen.blocked, Some(4), "{seen:?}");
            assert!(seen.current_ok, "{seen:?}");
            assert_eq!(seen.sleep_cancelled, Some(true), "{seen:?}");
            assert!(matches!(seen.timed, Some(Ok(6)) | Some(Err(_))), "{seen:?}");
            assert!(seen.stats_ok, "fiber::stats in a teardown destructor: {seen:?}");
        });
    });
}

// ---------------------------------------------------------------------------
// (e) after the runtime was dropped
// ---------------------------------------------------------------------------

#[test]
fn objects_of_a_dropped_runtime_report_its_end() {
    within(30, || {
        let rt = rt();
        let lock = Arc::new(fiber::sync::Mutex::new(0u32));
        let rw = Arc::new(fiber::sync::RwLock::new(0u32));
        let sem = Arc::new(fiber::sync::Semaphore::new(1));
        let (job_tx, job_rx) = std::sync::mpsc::channel();
        let (tx, rx) = chan::bounded::<u32>(1);
        let (l, w, s) = (lock.clone(), rw.clone(), sem.clone());
        let sleeper = rt.spawn(move || {
            let _g = l.lock().unwrap();
            let _w = w.write().unwrap();
            let _p = s.acquire().unwrap();
            let _rx = rx;
            job_tx.send((fiber::Job::current(), fiber::current())).unwrap();
            stubborn_sleep();
        });
        let (job, fiber_handle) = job_rx.recv().unwrap();
        wait_parked(&rt, 1);
        drop(rt);
        assert!(sleeper.is_finished());
        assert!(sleeper.join().unwrap_err().is_cancelled());
        fiber_handle.unpark();
        assert!(job.is_completed(), "{job:?}");
        assert!(job.join().is_ok(), "a plain thread joins the ended job");
        job.cancel();
        assert!(tx.send(1).is_err(), "the receiver went with its fiber");
        assert_eq!(sem.available_permits(), 1, "the permit came back");
        assert!(lock.is_poisoned(), "documented: a guard the shutdown unwinds poisons");
        assert!(rw.is_poisoned(), "a write guard the shutdown unwinds poisons");
        assert!(lock
            .try_lock()
            .is_err_and(|e| matches!(e, fiber::sync::TryLockError::Poisoned(_))));
    })
}

#[test]
fn a_handle_of_a_dropped_runtime_refuses_clearly() {
    within(30, || {
        let rt = rt();
        let handle = rt.handle();
        drop(rt);
        let e = handle.try_spawn(|| ()).unwrap_err();
        assert!(e.to_string().contains("shutting down"), "{e}");
        let msg = must_panic("Handle::spawn", || drop(handle.spawn(|| ())));
        assert!(msg.contains("Handle::spawn"), "{msg}");
        let msg = must_panic("Handle::block_on", || handle.block_on(|| ()));
        assert!(msg.contains("block_on"), "{msg}");
    })
}

// ---------------------------------------------------------------------------
// (f) objects of runtime B used from fibers of runtime A
// ---------------------------------------------------------------------------

#[test]
fn a_fiber_of_one_runtime_uses_another_runtimes_objects() {
    within(60, || {
        let a = rt();
        let b = rt2();
        let hb = b.handle();
        let (tx, rx) = chan::bounded::<u32>(0);
        let b_fiber = b.spawn(move || {
            let v = rx.recv().unwrap();
            (v, fiber::Job::current())
        });
        let out = a.block_on(move || {
            tx.send(7).unwrap();
            let (v, job) = b_fiber.join().unwrap();
            assert_eq!(job.join(), Ok(fiber::JobState::Completed));
            let child = hb.spawn(|| fiber::Handle::current().spawn(|| 9).join().unwrap());
            let msg = must_panic("block_on", || hb.block_on(|| ()));
            assert!(msg.contains("inside a fiber"), "{msg}");
            (v, child.join().unwrap())
        });
        assert_eq!(out, (7, 9));
    })
}

#[test]
fn dropping_a_runtime_inside_another_runtimes_fiber_poisons_as_documented() {
    within(60, || {
        let a = rt();
        let lock = Arc::new(fiber::sync::Mutex::new(0u32));
        let l = lock.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let holder = a.spawn(move || {
            let _g = l.lock().unwrap();
            tx.send(()).unwrap();
            stubborn_sleep();
        });
        rx.recv().unwrap();
        wait_parked(&a, 1);
        let b = rt();
        let l = lock.clone();
        let poisoned = b.block_on(move || {
            drop(a);
            l.is_poisoned()
        });
        assert!(holder.join().unwrap_err().is_cancelled());
        assert!(poisoned, "the shutdown unwind of the holder poisons the lock");
    })
}

// ---------------------------------------------------------------------------
// (g) extreme arguments
// ---------------------------------------------------------------------------

#[test]
fn runtime_builder_rejects_extremes_naming_the_setting() {
    within(30, || {
        let cases: [(&str, fiber::runtime::Builder); 6] = [
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
            ("thread_name", {
                let mut b = fiber::Runtime::builder();
                b.thread_name("a\0b");
                b
            }),
            ("max_blocking_threads", {
                let mut b = fiber::Runtime::builder();
                b.max_blocking_threads(0);
                b
            }),
        ];
        for (setting, builder) in cases {
            let e = builder.build().expect_err(setting);
            assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{setting}: {e}");
            assert!(e.to_string().contains(setting), "{setting}: {e}");
        }
    })
}

#[test]
fn fiber_builder_extremes() {
    on_runtime(|| {
        let h = fiber::Builder::new().stack_size(0).spawn(|| 1).unwrap();
        assert_eq!(h.join().unwrap(), 1, "a zero stack size takes the pool's stack");
        let e = fiber::Builder::new().stack_size(usize::MAX).spawn(|| 1).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{e}");
        let msg = must_panic("name with NUL", || {
            drop(fiber::Builder::new().name("a\0b").spawn(|| ()))
        });
        assert!(msg.contains("null"), "{msg}");
        let named = fiber::Builder::new()
            .name("")
            .spawn(|| fiber::current().name().map(str::to_owned));
        assert_eq!(named.unwrap().join().unwrap().as_deref(), Some(""));
    });
}

#[test]
fn channel_and_sync_extremes() {
    within(30, || {
        let msg = must_panic("bounded(usize::MAX)", || drop(chan::bounded::<u64>(usize::MAX)));
        assert!(msg.contains(&usize::MAX.to_string()), "names the capacity: {msg}");
        let msg = must_panic("bounded::<()>(usize::MAX)", || drop(chan::bounded::<()>(usize::MAX)));
        assert!(msg.contains(&usize::MAX.to_string()), "names the capacity: {msg}");
        let b = fiber::sync::Barrier::new(0);
        assert!(b.wait().is_leader(), "Barrier(0) acts as Barrier(1)");
        let sem = fiber::sync::Semaphore::new(fiber::sync::Semaphore::MAX_PERMITS);
        let p = sem.acquire_many(u32::MAX).unwrap();
        assert_eq!(p.num_permits(), u32::MAX as usize);
        drop(p);
        let msg = must_panic("add_permits past MAX", || sem.add_permits(1));
        assert!(msg.contains("MAX_PERMITS"), "{msg}");
        assert_eq!(sem.available_permits(), fiber::sync::Semaphore::MAX_PERMITS);
        assert!(sem.acquire_many(0).is_ok());
        let (tx, rx) = chan::bounded::<u8>(1);
        assert!(tx.send_timeout(1, Duration::MAX).is_ok());
        let far_past = Instant::now().checked_sub(Duration::from_secs(1)).unwrap();
        assert!(tx.send_deadline(2, far_past).unwrap_err().is_timeout());
        assert_eq!(
            rx.recv_deadline(far_past),
            Ok(1),
            "a ready value is taken even past the deadline"
        );
    })
}

#[test]
fn fiber_waits_with_extreme_times() {
    on_runtime(|| {
        let far_past = Instant::now().checked_sub(Duration::from_secs(1)).unwrap();
        assert!(fiber::sleep_until(far_past).is_ok());
        assert!(fiber::sleep(Duration::ZERO).is_ok());
        assert_eq!(fiber::with_timeout(Duration::MAX, || 1), Ok(1));
        assert_eq!(fiber::with_timeout(Duration::ZERO, || 1), Err(fiber::TimedOut));
        let forever = fiber::spawn(|| fiber::sleep_until(last_instant()));
        let max = fiber::spawn(|| fiber::sleep(Duration::MAX));
        wait_until("both parked", 10, || {
            fiber::stats().runtime.fibers_parked >= 2 && !forever.is_finished() && !max.is_finished()
        });
        forever.cancel();
        max.cancel();
        assert!(forever.join().unwrap_err().is_cancelled());
        assert!(max.join().unwrap_err().is_cancelled());
        let parker = fiber::spawn(|| {
            fiber::park_timeout(Duration::MAX);
            true
        });
        wait_fiber_parked(parker.id());
        parker.fiber().unpark();
        assert!(parker.join().unwrap());
    });
}

// ---------------------------------------------------------------------------
// batch 2: initializers, waiters and handles across a teardown
// ---------------------------------------------------------------------------

/// A plain thread waits on a `fiber::sync` once-cell whose initializer runs
/// in a fiber that the runtime's shutdown unwinds: as with std's, an
/// initializer that unwinds leaves the cell for the next caller
/// (`OnceLock`) or poisons it (`Once`, `LazyLock`); the waiter never hangs.
#[test]
fn once_cells_whose_initializer_is_torn_down_release_their_waiters() {
    within(60, || {
        let rt = rt_fixed_grace(2, ms(50));
        let cell = Arc::new(fiber::sync::OnceLock::<u32>::new());
        let once = Arc::new(fiber::sync::Once::new());
        let (tx, rx) = std::sync::mpsc::channel();
        let (c, o, t) = (cell.clone(), once.clone(), tx.clone());
        rt.spawn(move || {
            c.get_or_init(|| {
                t.send(()).unwrap();
                stubborn_sleep();
                1
            });
        });
        rt.spawn(move || {
            o.call_once(|| {
                tx.send(()).unwrap();
                stubborn_sleep();
            });
        });
        rx.recv().unwrap();
        rx.recv().unwrap();
        wait_parked(&rt, 2);
        let (c, o) = (cell.clone(), once.clone());
        let cell_waiter = std::thread::spawn(move || *c.get_or_init(|| 2));
        let once_waiter = std::thread::spawn(move || panic_message(|| o.call_once(|| ())));
        drop(rt);
        assert_eq!(cell_waiter.join().unwrap(), 2, "the next caller initializes");
        let msg = once_waiter.join().unwrap();
        assert!(
            msg.is_some_and(|m| m.contains("poisoned")) || once.is_completed(),
            "a Once whose initializer unwound is poisoned (or the waiter ran it)"
        );
    })
}

#[test]
fn a_plain_thread_waiting_for_a_lock_a_torn_down_fiber_holds_gets_it_poisoned() {
    within(60, || {
        let rt = rt_fixed_grace(2, ms(50));
        let lock = Arc::new(fiber::sync::Mutex::new(1u32));
        let sem = Arc::new(fiber::sync::Semaphore::new(1));
        let (tx, rx) = std::sync::mpsc::channel();
        let (l, s) = (lock.clone(), sem.clone());
        rt.spawn(move || {
            let _g = l.lock().unwrap();
            let _p = s.acquire().unwrap();
            tx.send(()).unwrap();
            stubborn_sleep();
        });
        rx.recv().unwrap();
        wait_parked(&rt, 1);
        let (l, s) = (lock.clone(), sem.clone());
        let waiter = std::thread::spawn(move || {
            let permit = s.acquire().is_ok();
            let poisoned = l.lock().is_err();
            (permit, poisoned)
        });
        drop(rt);
        assert_eq!(waiter.join().unwrap(), (true, true));
    })
}

/// A `fiber::blocking` call still running when its runtime is dropped:
/// inside it, the runtime's handle refuses to spawn and `block_on`
/// panics naming the shut-down runtime; the fiber waiting for the call is
/// finished once it returns.
#[test]
fn a_blocking_call_that_outlives_its_runtime_sees_it_shut_down() {
    within(60, || {
        let rt = rt_fixed_grace(2, ms(50));
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let (in_tx, in_rx) = std::sync::mpsc::channel::<()>();
        let (out_tx, out_rx) = std::sync::mpsc::channel();
        let caller = rt.spawn(move || {
            fiber::blocking(move || {
                in_tx.send(()).unwrap();
                go_rx.recv().unwrap();
                let handle = fiber::Handle::try_current();
                let spawn_err = handle.as_ref().map(|h| h.try_spawn(|| ()).is_err());
                let block_on = handle.as_ref().map(|h| panic_message(|| h.block_on(|| ())));
                out_tx.send((spawn_err, block_on)).unwrap();
            })
        });
        in_rx.recv().unwrap();
        drop(rt);
        go_tx.send(()).unwrap();
        let (spawn_err, block_on) = out_rx.recv().unwrap();
        assert_ne!(spawn_err, Some(false), "a shut-down runtime refuses spawns");
        if let Some(msg) = block_on {
            let msg = msg.expect("block_on on a shut-down runtime panics");
            assert!(msg.contains("block_on"), "{msg}");
        }
        let r = caller.join();
        assert!(r.is_ok() || r.is_err_and(|e| e.is_cancelled()));
    })
}

#[test]
fn a_rendezvous_channel_reports_crossbeams_len_with_a_parked_sender() {
    on_runtime(|| {
        let (tx, rx) = chan::bounded::<u8>(0);
        let t2 = tx.clone();
        let sender = fiber::spawn(move || t2.send(1));
        wait_until("the sender parked", 10, || tx.waiting().1 == 1);
        assert_eq!((rx.len(), rx.is_empty(), rx.is_full()), (0, true, true));
        assert_eq!((tx.len(), tx.is_empty(), tx.is_full()), (0, true, true));
        assert_eq!(rx.capacity(), Some(0));
        assert_eq!(rx.recv(), Ok(1));
        assert!(sender.join().unwrap().is_ok());
    });
}

#[test]
fn a_job_of_one_runtime_is_cancelled_and_joined_from_another() {
    within(60, || {
        let a = rt();
        let b = rt();
        let (tx, rx) = std::sync::mpsc::channel();
        let victim = b.spawn(move || {
            tx.send(fiber::Job::current()).unwrap();
            fiber::sleep(Duration::MAX)
        });
        let job = rx.recv().unwrap();
        let state = a.block_on(move || job.cancel_and_join());
        assert_eq!(state, Ok(fiber::JobState::Cancelled));
        assert!(victim.join().unwrap_err().is_cancelled());
        let hb = b.handle();
        let timed = a.block_on(move || {
            fiber::with_timeout(ms(30), || {
                let h = hb.spawn(|| fiber::sleep(Duration::MAX));
                h.join().is_err()
            })
        });
        assert_eq!(timed, Err(fiber::TimedOut));
    })
}

#[test]
fn select_and_select_macro_on_a_bare_thread() {
    within(20, || {
        let (tx, rx) = chan::bounded::<u8>(1);
        let timeout = chan::after(ms(5));
        let r = fiber::select! {
            recv(rx) -> v => v.ok(),
            recv(timeout) -> _ => None,
        };
        assert_eq!(r, None, "the timer arm fires on a plain thread");
        tx.send(3).unwrap();
        let r = fiber::select! {
            recv(rx) -> v => v.ok(),
            default => None,
        };
        assert_eq!(r, Some(3));
        let mut sel = chan::Select::new();
        sel.recv(&rx);
        assert!(sel.select_timeout(Duration::ZERO).is_err());
        let past = Instant::now().checked_sub(ms(1)).unwrap();
        assert!(sel.select_deadline(past).is_err());
        assert!(sel.try_select().is_err());
        drop(tx);
        let op = sel.select_timeout(Duration::MAX).expect("a disconnected arm is ready");
        assert!(op.recv(&rx).is_err());
    })
}

#[test]
fn socket_calls_with_empty_or_invalid_addresses_fail_fast() {
    fn check(ctx: &str) {
        let none: &[std::net::SocketAddr] = &[];
        let e = fiber::net::TcpStream::connect(none).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{ctx}: {e}");
        let e = fiber::net::TcpListener::bind(none).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{ctx}: {e}");
        assert!(fiber::net::TcpListener::bind("not an address").is_err(), "{ctx}");
        let udp = fiber::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let e = udp.send_to(b"x", none).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{ctx}: {e}");
        let e = udp.connect(none).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{ctx}: {e}");
        assert!(udp.set_read_timeout(Some(Duration::ZERO)).is_err(), "{ctx}");
        let e = fiber::net::unix::UnixListener::bind("a\0b").unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{ctx}: {e}");
        let e = fiber::net::unix::UnixStream::connect("a\0b").unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{ctx}: {e}");
        let addr: std::net::SocketAddr = "127.0.0.1:1".parse().unwrap();
        let e = fiber::net::TcpStream::connect_timeout(&addr, Duration::ZERO).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{ctx}: {e}");
        // Port 1 on loopback: refused at once, never a hang.
        assert!(
            fiber::net::TcpStream::connect_timeout(&addr, Duration::MAX).is_err(),
            "{ctx}"
        );
    }
    within(30, || check("plain thread"));
    on_runtime(|| check("fiber"));
    on_runtime(|| fiber::blocking(|| check("blocking")));
}

fn named(name: &str, workers: usize) -> fiber::Runtime {
    fiber::Runtime::builder()
        .workers(workers)
        .max_workers(workers)
        .thread_name(name)
        .shutdown_timeout(ms(300))
        .build()
        .unwrap()
}

fn thread_name() -> String {
    std::thread::current().name().unwrap_or("").to_string()
}

/// Fibers of runtime A woken from fibers of runtime B (park token, channel,
/// lock, semaphore, condvar) resume on A's workers, never on B's.
#[test]
fn fibers_woken_from_another_runtime_resume_on_their_own() {
    within(60, || {
        let a = named("ra42", 2);
        let b = named("rb42", 2);
        for round in 0..20 {
            let (h_tx, h_rx) = std::sync::mpsc::channel();
            let (tx, rx) = chan::bounded::<u32>(0);
            let lock = Arc::new(fiber::sync::Mutex::new(()));
            let sem = Arc::new(fiber::sync::Semaphore::new(0));
            let guard_taken = Arc::new(fiber::sync::Barrier::new(2));
            let (l, s, g) = (lock.clone(), sem.clone(), guard_taken.clone());
            let pinned = round % 2 == 0;
            let body = move || {
                let mut seen = Vec::new();
                h_tx.send(fiber::current()).unwrap();
                fiber::park();
                seen.push(thread_name());
                rx.recv().unwrap();
                seen.push(thread_name());
                g.wait();
                drop(l.lock().unwrap());
                seen.push(thread_name());
                s.acquire().unwrap().forget();
                seen.push(thread_name());
                seen
            };
            let victim = if pinned {
                a.block_on(|| fiber::spawn_pinned(body))
            } else {
                a.spawn(body)
            };
            let handle = h_rx.recv().unwrap();
            let (l, s) = (lock.clone(), sem.clone());
            b.block_on(move || {
                handle.unpark();
                tx.send(1).unwrap();
                let guard = l.lock().unwrap();
                guard_taken.wait();
                fiber::sleep(ms(1)).unwrap();
                drop(guard);
                s.add_permits(1);
            });
            let seen = victim.join().unwrap();
            for name in &seen {
                assert!(name.starts_with("ra42"), "round {round}: resumed on {name:?}: {seen:?}");
            }
        }
    })
}

fiber::fiber_local! {
    static EXIT_LOCAL: std::cell::Cell<u32> = std::cell::Cell::new(0);
    static JOB_IN_DTOR: std::cell::RefCell<Option<JobProbe>> = std::cell::RefCell::new(None);
}

/// `FiberLocal::try_with`'s doc: a destructor that runs as the thread
/// exits sees a value for that call only (never a panic, which would
/// abort in a thread-local destructor).
#[test]
fn a_fiber_local_used_by_a_thread_exit_destructor_gets_a_fresh_value() {
    in_child(
        "a_fiber_local_used_by_a_thread_exit_destructor_gets_a_fresh_value",
        30,
        || {
            static SEEN: StdMutex<Vec<u32>> = StdMutex::new(Vec::new());
            struct AtExit;
            impl Drop for AtExit {
                fn drop(&mut self) {
                    EXIT_LOCAL.set(9);
                    let got = EXIT_LOCAL.try_with(|c| c.get()).unwrap();
                    SEEN.lock().unwrap().push(got);
                }
            }
            std::thread_local! {
                static GUARD: std::cell::RefCell<Option<AtExit>> = const { std::cell::RefCell::new(None) };
            }
            std::thread::spawn(|| {
                EXIT_LOCAL.set(1);
                GUARD.with(|g| *g.borrow_mut() = Some(AtExit));
            })
            .join()
            .unwrap();
            let seen = SEEN.lock().unwrap().clone();
            assert_eq!(seen.len(), 1, "the destructor ran once");
            assert!(seen[0] == 0 || seen[0] == 9, "a value, never a panic: {seen:?}");
        },
    );
}

/// What a fiber-local destructor saw: `Job::try_current()` was `None`,
/// `Job::current()`'s panic message, `fiber::current()` worked.
type ProbeSeen = (bool, Option<String>, bool);

struct JobProbe(Arc<StdMutex<Option<ProbeSeen>>>);
impl Drop for JobProbe {
    fn drop(&mut self) {
        let try_none = fiber::Job::try_current().is_none();
        let msg = panic_message(|| drop(fiber::Job::current()));
        let current_ok = panic_message(|| drop(fiber::current())).is_none();
        *self.0.lock().unwrap() = Some((try_none, msg, current_ok));
    }
}

#[test]
fn job_current_in_a_fiber_local_destructor_names_the_ended_body() {
    let out = Arc::new(StdMutex::new(None));
    let o = out.clone();
    on_runtime(move || {
        fiber::spawn(move || JOB_IN_DTOR.with(|p| *p.borrow_mut() = Some(JobProbe(o))))
            .join()
            .unwrap();
    });
    let (try_none, msg, current_ok) = out.lock().unwrap().take().expect("the destructor ran");
    assert!(try_none, "no job after the body");
    let msg = msg.expect("Job::current panics there");
    assert!(msg.contains("body has returned"), "{msg}");
    assert!(current_ok, "fiber::current still works in a fiber-local destructor");
}

#[test]
fn block_on_returns_the_roots_value_when_its_job_was_cancelled() {
    within(30, || {
        let rt = rt();
        assert_eq!(
            rt.block_on(|| {
                fiber::Job::current().cancel();
                assert!(fiber::sleep(ms(1)).is_err());
                5
            }),
            5
        );
        let handle = rt.handle();
        let v = std::thread::spawn(move || {
            handle.block_on(|| {
                fiber::Job::current().cancel();
                6
            })
        })
        .join()
        .unwrap();
        assert_eq!(v, 6);
    })
}

/// A fiber joining its own handle inside its `fiber::blocking` call
/// would wait for itself: a panic naming the misuse, never a hang.
#[test]
fn joining_ones_own_handle_inside_blocking_names_the_misuse() {
    let msg = on_runtime(|| {
        let (tx, rx) = chan::bounded::<fiber::JoinHandle<()>>(1);
        let (out_tx, out_rx) = chan::bounded(1);
        let me = fiber::spawn(move || {
            let own = rx.recv().unwrap();
            let msg = fiber::blocking(move || panic_message(move || drop(own.join())));
            out_tx.send(msg).unwrap();
        });
        tx.send(me).unwrap();
        out_rx.recv().unwrap()
    });
    let msg = msg.expect("the join panics");
    assert!(msg.contains("join"), "{msg}");
}

#[test]
fn a_late_tick_receive_restarts_the_period_as_documented() {
    on_runtime(|| {
        let period = ms(20);
        let start = Instant::now();
        let t = chan::tick(period);
        fiber::sleep(ms(70)).unwrap();
        let first = t.recv().unwrap();
        let received = Instant::now();
        assert!(
            first >= start + period && first + period <= received,
            "the first message is its due instant, not the receive's"
        );
        let second = t.recv().unwrap();
        assert!(
            second >= received,
            "after a late receive the next is due a period after it: {:?} vs {:?}",
            second.duration_since(start),
            received.duration_since(start)
        );
        let twin = t.clone();
        let (a, b) = (t.recv_timeout(Duration::from_secs(5)), twin.try_recv());
        assert!(a.is_ok());
        assert!(b.is_err(), "one message goes to one receiver");
    });
}

/// `Runtime::shutdown_timeout` from the runtime's own `fiber::blocking`
/// call: refused with a panic naming the misuse, the shutdown goes on on a
/// thread of its own, and nothing hangs.
#[test]
fn shutting_a_runtime_down_from_its_own_blocking_call_names_the_misuse() {
    within(60, || {
        let rt = rt_fixed_grace(2, ms(100));
        let handle = rt.handle();
        let (tx, rx) = std::sync::mpsc::channel();
        let _caller = handle.spawn(move || {
            let msg = fiber::blocking(move || panic_message(move || rt.shutdown_timeout(ms(10))));
            let _ = tx.send(msg);
        });
        let msg = rx.recv_timeout(Duration::from_secs(30)).expect("the call returned");
        let msg = msg.expect("the shutdown from its own blocking call panics");
        assert!(msg.contains("cannot wait for itself"), "{msg}");
        let start = Instant::now();
        while handle.try_spawn(|| ()).is_ok() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "the handed-off shutdown never began"
            );
            std::thread::yield_now();
        }
    })
}
