//! Adversarial review, round 51: runtime shutdown and teardown.
//!
//! A runtime dropped (or shut down) while its fibers are parked on every
//! kind of wait the sync layer offers (a condvar whose mutex a stubborn
//! fiber holds, an `RwLock` writer and readers behind a stubborn reader, a
//! `Semaphore::acquire_many` behind stubborn holders, a `Barrier` inside
//! `non_cancellable`, a `WaitGroup` a plain thread waits on), while plain
//! threads are blocked on channels whose other end the fibers own, or on a
//! timer channel the runtime armed; destructors that spawn and hand the
//! handle to a plain thread; a second runtime kept in a worker thread's
//! thread-local (registered by `on_thread_start`, so destroyed after the
//! runtime's own thread-locals) holding a fiber that ignores cancellation;
//! an `on_thread_stop` hook that blocks on a channel a parked fiber owns;
//! `fiber::blocking` from clean-up code in the grace time and from a
//! destructor at teardown; a pinned runtime's parked fibers; and repeated
//! explicit `shutdown_timeout` calls racing plain-thread joins.
//!
//! Expected: what std, tokio and Go users expect, and what the README and
//! `spec/reliability.md` ("Shutdown protocol") promise: no undefined
//! behaviour, no hang, no silently lost value, every destructor exactly
//! once, sync objects usable afterwards, clear panics naming misuse.

use crate::common::shutdown::{counter, Tracked};
use crate::common::*;

use fiber::chan::{bounded, unbounded, RecvError};
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------
// Sync objects at teardown.

/// A condvar waiter woken by the shutdown must take its mutex back, and a
/// fiber that ignores cancellation holds it through the grace time. The
/// waiter (spawned later, so torn down first) parks on the mutex; the
/// holder's unwind releases it (poisoned) and the waiter then ends too.
/// Both destructors run once, the drop returns, and the mutex is usable
/// from the test thread afterwards.
#[test]
fn a_condvar_waiter_behind_a_stubborn_mutex_holder_at_shutdown() {
    within(30, || {
        let drops = counter();
        let pair = Arc::new((fiber::sync::Mutex::new(0u32), fiber::sync::Condvar::new()));
        let rt = rt_fixed_grace(2, ms(200));
        let (held_tx, held_rx) = mpsc::channel();
        {
            let (pair, d) = (pair.clone(), drops.clone());
            rt.spawn(move || {
                let _t = Tracked(d);
                let g = pair.0.lock().unwrap();
                held_tx.send(()).unwrap();
                // Wait until the waiter is queued on the condvar (it
                // needs the mutex to get there, so release it in between).
                drop(g);
                let _ = fiber::sleep(ms(50));
                let _g = pair.0.lock().unwrap();
                stubborn_sleep();
            });
        }
        held_rx.recv().unwrap();
        {
            let (pair, d) = (pair.clone(), drops.clone());
            rt.spawn(move || {
                let _t = Tracked(d);
                let g = pair.0.lock().unwrap();
                let g = pair.1.wait(g).unwrap_or_else(|e| e.into_inner());
                drop(g);
                stubborn_sleep();
            });
        }
        wait_parked(&rt, 2);
        std::thread::sleep(ms(100));
        let start = Instant::now();
        drop(rt);
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "drop took {:?}",
            start.elapsed()
        );
        assert_eq!(drops.load(SeqCst), 2, "each fiber's destructor ran once");
        let g = pair.0.try_lock();
        assert!(
            !matches!(g, Err(std::sync::TryLockError::WouldBlock)),
            "the mutex is free after the runtime is gone"
        );
    });
}

/// An `RwLock` writer queued behind a reader that ignores cancellation,
/// and a reader queued behind that writer: at teardown every guard is
/// released and the lock is free afterwards.
#[test]
fn rwlock_waiters_behind_a_stubborn_reader_at_shutdown() {
    within(30, || {
        let drops = counter();
        let lock = Arc::new(fiber::sync::RwLock::new(0u32));
        let rt = rt_fixed_grace(2, ms(200));
        let (tx, rx) = mpsc::channel();
        {
            let (lock, d) = (lock.clone(), drops.clone());
            rt.spawn(move || {
                let _t = Tracked(d);
                let _r = lock.read().unwrap();
                tx.send(()).unwrap();
                stubborn_sleep();
            });
        }
        rx.recv().unwrap();
        {
            let (lock, d) = (lock.clone(), drops.clone());
            rt.spawn(move || {
                let _t = Tracked(d);
                let mut w = lock.write().unwrap_or_else(|e| e.into_inner());
                *w += 1;
                stubborn_sleep();
            });
        }
        wait_parked(&rt, 2);
        {
            let (lock, d) = (lock.clone(), drops.clone());
            rt.spawn(move || {
                let _t = Tracked(d);
                let r = lock.read().unwrap_or_else(|e| e.into_inner());
                assert!(*r <= 1);
                stubborn_sleep();
            });
        }
        wait_parked(&rt, 3);
        drop(rt);
        assert_eq!(drops.load(SeqCst), 3, "each fiber's destructor ran once");
        assert!(
            !matches!(lock.try_write(), Err(std::sync::TryLockError::WouldBlock)),
            "the lock is free after the runtime is gone"
        );
    });
}

/// `acquire_many` queued behind holders that ignore cancellation: the
/// shutdown ends the wait, teardown releases the holders' permits, and no
/// permit is lost or created.
#[test]
fn semaphore_permits_all_come_back_after_shutdown() {
    within(30, || {
        let sem = Arc::new(fiber::sync::Semaphore::new(3));
        let rt = rt_fixed_grace(2, ms(200));
        for n in [1u32, 1] {
            let sem = sem.clone();
            rt.spawn(move || {
                let _p = sem.acquire_many(n).unwrap();
                stubborn_sleep();
            });
        }
        wait_parked(&rt, 2);
        assert_eq!(sem.available_permits(), 1);
        let (res_tx, res_rx) = mpsc::channel();
        {
            let sem = sem.clone();
            rt.spawn(move || {
                let r = sem.acquire_many(3).map(|p| p.num_permits());
                res_tx.send(r.is_err()).unwrap();
                stubborn_sleep();
            });
        }
        wait_parked(&rt, 3);
        drop(rt);
        assert_eq!(
            res_rx.recv_timeout(ms(100)),
            Ok(true),
            "the queued acquire ended Cancelled"
        );
        assert_eq!(sem.available_permits(), 3, "every permit is back");
        assert_eq!(sem.try_acquire_many(3).map(|p| p.num_permits()), Some(3));
    });
}

/// Two fibers wait at a barrier of three inside `non_cancellable`, and are
/// unwound by teardown. Their arrivals must be withdrawn: a single plain
/// thread arriving afterwards is not released, three are.
#[test]
fn barrier_arrivals_of_fibers_unwound_at_teardown_are_withdrawn() {
    within(30, || {
        let barrier = Arc::new(fiber::sync::Barrier::new(3));
        let rt = rt_fixed_grace(2, ms(100));
        for _ in 0..2 {
            let barrier = barrier.clone();
            rt.spawn(move || fiber::non_cancellable(|| barrier.wait()));
        }
        wait_parked(&rt, 2);
        drop(rt);
        let released = Arc::new(AtomicUsize::new(0));
        let spawn = |released: &Arc<AtomicUsize>| {
            let (b, r) = (barrier.clone(), released.clone());
            std::thread::spawn(move || {
                let leader = b.wait().is_leader();
                r.fetch_add(1, SeqCst);
                leader
            })
        };
        let first = spawn(&released);
        std::thread::sleep(ms(200));
        assert_eq!(
            released.load(SeqCst),
            0,
            "a lone arrival was released by the arrivals of unwound fibers"
        );
        let others = [spawn(&released), spawn(&released)];
        let leaders = std::iter::once(first)
            .chain(others)
            .map(|t| t.join().unwrap())
            .filter(|l| *l)
            .count();
        assert_eq!(leaders, 1);
    });
}

/// A plain thread waits on a `WaitGroup` whose other members are owned by
/// fibers parked for ever: dropping the runtime drops them, and the
/// thread's wait returns.
#[test]
fn a_plain_threads_waitgroup_wait_ends_when_the_runtime_drops_the_members() {
    within(30, || {
        let rt = rt_fixed_grace(2, ms(100));
        let wg = fiber::sync::WaitGroup::new();
        for _ in 0..3 {
            let member = wg.clone();
            rt.spawn(move || {
                let _m = member;
                stubborn_sleep();
            });
        }
        wait_parked(&rt, 3);
        let (done_tx, done_rx) = mpsc::channel();
        let t = std::thread::spawn(move || {
            wg.wait();
            done_tx.send(()).unwrap();
        });
        std::thread::sleep(ms(50));
        assert!(done_rx.try_recv().is_err(), "the wait ended before the members left");
        drop(rt);
        done_rx
            .recv_timeout(Duration::from_secs(5))
            .expect("the thread's WaitGroup::wait ended once the fibers were torn down");
        t.join().unwrap();
    });
}

// ---------------------------------------------------------------------------
// Channels and timers shared with plain threads.

/// A plain thread blocked in `send` on a full channel whose receiver a
/// parked fiber owns, and another blocked in `recv` on a channel whose
/// sender a parked fiber owns: dropping the runtime disconnects both; the
/// sender gets its value back, the buffered value is dropped once, nothing
/// is lost silently.
#[test]
fn plain_threads_blocked_on_channels_owned_by_parked_fibers_are_released_with_their_values() {
    within(30, || {
        let drops = counter();
        let rt = rt_fixed_grace(2, ms(100));
        let (full_tx, full_rx) = bounded::<Tracked>(1);
        let (idle_tx, idle_rx) = unbounded::<u32>();
        full_tx.send(Tracked(drops.clone())).unwrap();
        rt.spawn(move || {
            let _keep = (full_rx, idle_tx);
            stubborn_sleep();
        });
        wait_parked(&rt, 1);
        let d = drops.clone();
        let sender = std::thread::spawn(move || match full_tx.send(Tracked(d)) {
            Ok(()) => None,
            Err(e) => Some(e.into_inner()),
        });
        let receiver = std::thread::spawn(move || idle_rx.recv());
        std::thread::sleep(ms(100));
        drop(rt);
        let back = sender.join().unwrap();
        assert!(back.is_some(), "the blocked send got its value back");
        assert_eq!(drops.load(SeqCst), 1, "the buffered value was dropped once");
        drop(back);
        assert_eq!(drops.load(SeqCst), 2);
        assert_eq!(receiver.join().unwrap(), Err(RecvError));
    });
}

/// A plain thread blocked in `recv` on an `after` channel the runtime made
/// and armed, while the runtime is dropped: the timer still fires on time
/// for the thread (shutdown clears the runtime's timers).
#[test]
fn a_plain_thread_on_an_after_channel_the_dropped_runtime_armed_gets_its_tick() {
    within(30, || {
        let rt = rt_fixed_grace(1, ms(100));
        let late = rt.block_on(|| {
            let late = fiber::chan::after(ms(400));
            assert!(late.recv_timeout(ms(1)).is_err());
            late
        });
        let start = Instant::now();
        let t = std::thread::spawn(move || late.recv());
        std::thread::sleep(ms(50));
        drop(rt);
        let got = t.join().unwrap();
        assert!(got.is_ok(), "the after channel fired: {got:?}");
        let took = start.elapsed();
        assert!(took < Duration::from_secs(3), "the tick came {took:?} late");
    });
}

/// A fiber parked in a `select!` whose arms are a receive from a plain
/// thread and a timer, inside `non_cancellable`, at a drop: the plain
/// thread's message sent during the grace time is received, not lost.
#[test]
fn a_non_cancellable_select_gets_a_threads_message_sent_during_the_grace() {
    within(30, || {
        let rt = rt_fixed_grace(2, ms(1500));
        let (tx, rx) = bounded::<u32>(0);
        let (got_tx, got_rx) = mpsc::channel();
        rt.spawn(move || {
            let got = fiber::non_cancellable(|| {
                fiber::select! {
                    recv(rx) -> v => v.ok(),
                    recv(fiber::chan::after(Duration::from_secs(3600))) -> _ => None,
                }
            });
            got_tx.send(got).unwrap();
        });
        wait_parked(&rt, 1);
        let t = std::thread::spawn(move || {
            std::thread::sleep(ms(300));
            tx.send(7)
        });
        let start = Instant::now();
        drop(rt);
        assert_eq!(t.join().unwrap(), Ok(()), "the rendezvous send was taken");
        assert_eq!(got_rx.recv_timeout(ms(100)), Ok(Some(7)), "and received");
        assert!(start.elapsed() < Duration::from_secs(5));
    });
}

// ---------------------------------------------------------------------------
// Destructors and hooks at teardown.

/// A destructor run by teardown spawns a fiber and hands its handle to a
/// plain thread, which joins it: the join returns (the child was
/// cancelled before it started, or ran), never hangs, and the child's
/// closure is dropped exactly once.
#[test]
fn a_plain_thread_joins_a_fiber_spawned_by_a_teardown_destructor() {
    struct SpawnOnDrop {
        to: mpsc::Sender<fiber::JoinHandle<u32>>,
        capture: Arc<AtomicUsize>,
    }
    impl Drop for SpawnOnDrop {
        fn drop(&mut self) {
            let c = Tracked(self.capture.clone());
            let h = fiber::spawn(move || {
                let _c = c;
                5
            });
            let _ = self.to.send(h);
        }
    }
    within(30, || {
        let capture = counter();
        let rt = rt_fixed_grace(1, ms(50));
        let (to, from) = mpsc::channel();
        let c = capture.clone();
        rt.spawn(move || {
            let _s = SpawnOnDrop { to, capture: c };
            stubborn_sleep();
        });
        wait_parked(&rt, 1);
        let joiner = std::thread::spawn(move || {
            let h = from.recv().unwrap();
            h.join().map_err(|e| e.is_cancelled())
        });
        drop(rt);
        let r = joiner.join().unwrap();
        assert!(matches!(r, Ok(5) | Err(true)), "join: {r:?}");
        assert_eq!(capture.load(SeqCst), 1, "the child's capture dropped once");
    });
}

/// `fiber::blocking` from clean-up code in `non_cancellable` during the
/// grace time runs its closure (clean-up that flushes through the blocking
/// pool), and from a destructor at teardown runs it too (inline).
#[test]
fn blocking_calls_from_clean_up_in_the_grace_and_in_teardown_run() {
    within(30, || {
        let ran = counter();
        let rt = rt_fixed_grace(2, ms(500));
        {
            let ran = ran.clone();
            rt.spawn(move || {
                let _ = fiber::sleep(Duration::MAX);
                fiber::non_cancellable(|| {
                    let r = ran.clone();
                    fiber::blocking(move || {
                        std::thread::sleep(ms(20));
                        r.fetch_add(1, SeqCst);
                    });
                });
            });
        }
        struct BlockingOnDrop(Arc<AtomicUsize>);
        impl Drop for BlockingOnDrop {
            fn drop(&mut self) {
                let r = self.0.clone();
                fiber::blocking(move || {
                    r.fetch_add(10, SeqCst);
                });
            }
        }
        {
            let ran = ran.clone();
            rt.spawn(move || {
                let _b = BlockingOnDrop(ran);
                stubborn_sleep();
            });
        }
        wait_parked(&rt, 2);
        drop(rt);
        assert_eq!(ran.load(SeqCst), 11, "both blocking closures ran once");
    });
}

/// An `on_thread_stop` hook that waits for a message on a channel whose
/// sender a parked, stubborn fiber owns: the hook runs on the worker after
/// its loop, and the fiber is unwound only by teardown, after the workers
/// were joined. The drop must still return, and the fiber's destructor run
/// once.
#[test]
fn an_on_thread_stop_hook_waiting_on_a_channel_a_parked_fiber_owns() {
    in_child(
        "an_on_thread_stop_hook_waiting_on_a_channel_a_parked_fiber_owns",
        60,
        || {
            within(30, || {
                let drops = counter();
                let (tx, rx) = unbounded::<()>();
                let rx = Arc::new(std::sync::Mutex::new(rx));
                let hook_rx = rx.clone();
                let rt = fiber::Runtime::builder()
                    .workers(1)
                    .max_workers(1)
                    .shutdown_timeout(ms(100))
                    .on_thread_stop(move || {
                        let _ = hook_rx.lock().unwrap().recv_timeout(Duration::from_secs(20));
                    })
                    .build()
                    .unwrap();
                let d = drops.clone();
                rt.spawn(move || {
                    let _t = Tracked(d);
                    let _tx = tx;
                    stubborn_sleep();
                });
                wait_parked(&rt, 1);
                let start = Instant::now();
                drop(rt);
                let took = start.elapsed();
                // The reaper may finish the teardown after the drop returns.
                let t0 = Instant::now();
                while drops.load(SeqCst) == 0 && t0.elapsed() < Duration::from_secs(10) {
                    std::thread::sleep(ms(5));
                }
                assert_eq!(drops.load(SeqCst), 1, "the fiber's destructor ran once");
                assert!(took < Duration::from_secs(10), "drop took {took:?}");
            })
        },
    );
}

/// A second runtime kept in a worker thread's thread-local: the slot is
/// first touched by `on_thread_start`, so its destructor runs after the
/// outer runtime's own thread-locals on that thread are gone. The inner
/// runtime holds a fiber that ignores cancellation, so its teardown has to
/// unwind it on that exiting thread. No abort, and the fiber's destructor
/// runs once.
#[test]
fn a_runtime_in_a_worker_thread_local_is_shut_down_when_the_worker_exits() {
    thread_local! {
        static HELD: RefCell<Option<fiber::Runtime>> = const { RefCell::new(None) };
    }
    in_child(
        "a_runtime_in_a_worker_thread_local_is_shut_down_when_the_worker_exits",
        60,
        || {
            within(40, || {
                let drops = counter();
                let outer = fiber::Runtime::builder()
                    .workers(1)
                    .max_workers(1)
                    .shutdown_timeout(ms(100))
                    .on_thread_start(|| HELD.with(|_| ()))
                    .build()
                    .unwrap();
                let d = drops.clone();
                outer.block_on(move || {
                    let inner = rt_fixed_grace(1, ms(100));
                    inner.spawn(move || {
                        let _t = Tracked(d);
                        stubborn_sleep();
                    });
                    wait_parked(&inner, 1);
                    HELD.with_borrow_mut(|s| *s = Some(inner));
                });
                drop(outer);
                assert_eq!(drops.load(SeqCst), 1, "the inner fiber's destructor ran once");
            })
        },
    );
}

/// A pinned runtime: fibers parked in cancellable waits return on their
/// own workers within the grace time, so their destructors run (only a
/// pinned fiber still alive after the grace is given up on).
#[test]
fn a_pinned_runtimes_parked_fibers_drop_their_values_at_shutdown() {
    within(30, || {
        let drops = counter();
        let rt = fiber::Runtime::builder()
            .workers(2)
            .max_workers(2)
            .pinned(true)
            .shutdown_timeout(ms(500))
            .build()
            .unwrap();
        let (tx, rx) = unbounded::<u32>();
        for i in 0..4 {
            let d = drops.clone();
            let rx = rx.clone();
            rt.spawn(move || {
                let _t = Tracked(d);
                if i % 2 == 0 {
                    let _ = fiber::sleep(Duration::MAX);
                } else {
                    let _ = rx.recv();
                }
            });
        }
        wait_parked(&rt, 4);
        drop(rt);
        drop(tx);
        assert_eq!(drops.load(SeqCst), 4);
    });
}

/// Plain threads join fibers while the runtime is shut down explicitly
/// with a zero grace: every join returns, a finished fiber's value is
/// kept, the others report `Cancelled`.
#[test]
fn plain_thread_joins_racing_an_explicit_zero_grace_shutdown() {
    within(30, || {
        for round in 0..20 {
            let rt = rt_fixed_grace(2, Duration::from_secs(5));
            let go = Arc::new(AtomicBool::new(false));
            let mut joiners = Vec::new();
            for i in 0..6u32 {
                let h = rt.spawn(move || {
                    if i % 2 == 0 {
                        i
                    } else {
                        let _ = fiber::sleep(Duration::MAX);
                        stubborn_sleep();
                        unreachable!()
                    }
                });
                let go = go.clone();
                joiners.push(std::thread::spawn(move || {
                    while !go.load(SeqCst) {
                        std::hint::spin_loop();
                    }
                    (i, h.join())
                }));
            }
            go.store(true, SeqCst);
            if round % 2 == 0 {
                std::thread::yield_now();
            }
            rt.shutdown_timeout(Duration::ZERO);
            for j in joiners {
                let (i, r) = j.join().unwrap();
                match r {
                    Ok(v) => assert_eq!(v, i),
                    Err(e) => assert!(e.is_cancelled(), "fiber {i}: {e:?}"),
                }
            }
        }
    });
}

// ---------------------------------------------------------------------------
// Pinned fibers alive after the grace time.

/// A fiber doing clean-up inside `non_cancellable` that waits for an ack
/// nobody sends, while it owns the `Sender` a plain thread receives from.
/// A runtime drop gives it the grace time and must then end it (its
/// destructors run, the thread's `recv` ends with a disconnect).
fn sender_owner_at_shutdown(scenario: &str, pinned: bool) {
    in_child(scenario, 60, move || {
        within(30, move || {
            let drops = counter();
            let rt = rt_fixed_grace(2, ms(200));
            let (tx, rx) = unbounded::<u32>();
            let (_ack_tx, ack_rx) = unbounded::<()>();
            let d = drops.clone();
            rt.block_on(move || {
                let body = move || {
                    let _t = Tracked(d);
                    let _tx = tx;
                    fiber::non_cancellable(|| ack_rx.recv())
                };
                if pinned {
                    fiber::spawn_pinned(body);
                } else {
                    fiber::spawn(body);
                }
            });
            wait_parked(&rt, 1);
            let receiver = std::thread::spawn(move || rx.recv());
            drop(rt);
            let (done_tx, done_rx) = mpsc::channel();
            std::thread::spawn(move || done_tx.send(receiver.join().unwrap()));
            let got = done_rx.recv_timeout(Duration::from_secs(5));
            assert_eq!(
                drops.load(SeqCst),
                1,
                "the fiber's destructor never ran (it was abandoned)"
            );
            assert_eq!(got, Ok(Err(RecvError)), "the plain thread's recv never ended");
        })
    });
}

/// Control: unpinned, teardown unwinds the fiber after the grace time.
#[test]
fn an_unpinned_fibers_sender_is_dropped_at_shutdown_so_a_plain_receiver_ends() {
    sender_owner_at_shutdown(
        "an_unpinned_fibers_sender_is_dropped_at_shutdown_so_a_plain_receiver_ends",
        false,
    );
}

/// Pinned (`spawn_pinned`, the README's answer for thread-local state):
/// the fiber must be unwound too, on its home worker (which stays up for
/// it), so its `Sender` is dropped and the plain thread's `recv` ends.
// Failed before the fix: a pinned fiber alive after the grace is abandoned, not unwound on its home worker: its destructors never run and a thread waiting on what it owns hangs
#[test]
fn a_pinned_fibers_sender_is_dropped_at_shutdown_so_a_plain_receiver_ends() {
    sender_owner_at_shutdown(
        "a_pinned_fibers_sender_is_dropped_at_shutdown_so_a_plain_receiver_ends",
        true,
    );
}

/// A plain thread's `Handle::block_on` whose root ignores cancellation,
/// while the runtime is dropped: teardown must end the root, and
/// `block_on` return (or panic).
fn stubborn_block_on_root_at_shutdown(scenario: &str, pinned: bool) {
    in_child(scenario, 60, move || {
        within(30, move || {
            let rt = fiber::Runtime::builder()
                .workers(2)
                .max_workers(2)
                .pinned(pinned)
                .shutdown_timeout(ms(200))
                .build()
                .unwrap();
            let handle = rt.handle();
            let (done_tx, done_rx) = mpsc::channel();
            std::thread::spawn(move || {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    handle.block_on(stubborn_sleep);
                }));
                let _ = done_tx.send(r.is_ok());
            });
            wait_parked(&rt, 1);
            drop(rt);
            assert!(
                done_rx.recv_timeout(Duration::from_secs(5)).is_ok(),
                "Handle::block_on never returned (or panicked) after the runtime was dropped"
            );
        })
    });
}

/// Control: on an unpinned runtime teardown unwinds the root.
#[test]
fn a_plain_threads_block_on_returns_when_the_runtime_drops() {
    stubborn_block_on_root_at_shutdown("a_plain_threads_block_on_returns_when_the_runtime_drops", false);
}

/// On a runtime built with `pinned(true)` every fiber is pinned, the root
/// of a plain thread's `Handle::block_on` included: the root is given up
/// on at the drop, and `block_on` then waits for ever (it may not return
/// while the root's stack could borrow from the caller).
// Failed before the fix: Handle::block_on on a pinned(true) runtime never returns once its stubborn root is abandoned at shutdown
#[test]
fn a_plain_threads_block_on_of_a_pinned_runtime_returns_when_the_runtime_drops() {
    stubborn_block_on_root_at_shutdown(
        "a_plain_threads_block_on_of_a_pinned_runtime_returns_when_the_runtime_drops",
        true,
    );
}

// ---------------------------------------------------------------------------
// A runtime dropped from its own worker thread outside any fiber.

/// The runtime, kept in a global slot, is dropped by its own
/// `on_thread_stop` hook when a grown worker retires: on one of its own
/// worker threads, outside any fiber. A runtime cannot wait for itself
/// there either (shutdown joins every worker, this one included), so this
/// should be refused with a panic naming the misuse and handed off (as a
/// drop inside its own fiber or blocking call is), or shut down cleanly;
/// never a 2 s wait for itself reported as "a fiber runs without a yield
/// point".
// Failed before the fix: a runtime dropped on its own worker thread outside a fiber (on_thread_stop, a worker thread-local) waits 2 s for itself and reports a false stuck fiber
#[test]
fn a_runtime_dropped_by_its_own_on_thread_stop_hook_at_retirement() {
    static SLOT: std::sync::Mutex<Option<fiber::Runtime>> = std::sync::Mutex::new(None);
    static OUT: std::sync::Mutex<Option<(Duration, Option<String>)>> = std::sync::Mutex::new(None);
    let out = child_outcome(
        "a_runtime_dropped_by_its_own_on_thread_stop_hook_at_retirement",
        60,
        &[],
        || {
            within(40, || {
                let rt = fiber::Runtime::builder()
                    .workers(1)
                    .max_workers(2)
                    .idle_timeout(ms(50))
                    .shutdown_timeout(ms(100))
                    .on_thread_stop(|| {
                        let taken = SLOT.lock().unwrap().take();
                        if let Some(rt) = taken {
                            let start = Instant::now();
                            let msg = panic_message(move || drop(rt));
                            *OUT.lock().unwrap() = Some((start.elapsed(), msg));
                        }
                    })
                    .build()
                    .unwrap();
                let handle = rt.handle();
                *SLOT.lock().unwrap() = Some(rt);
                handle.block_on(|| {
                    let other = fiber::spawn(|| fiber::sleep(ms(1)));
                    // Hold the only worker without a yield point: the
                    // monitor grows a second one for `other`.
                    std::thread::sleep(ms(300));
                    other.join().unwrap().unwrap();
                });
                let start = Instant::now();
                while OUT.lock().unwrap().is_none() {
                    assert!(start.elapsed() < Duration::from_secs(20), "no worker retired");
                    std::thread::sleep(ms(10));
                }
                let (took, msg) = OUT.lock().unwrap().take().unwrap();
                eprintln!("R51 drop in hook took {took:?}, panic: {msg:?}");
                assert!(
                    took < Duration::from_secs(1) || msg.is_some(),
                    "the drop waited {took:?} for its own worker thread"
                );
            })
        },
    );
    if let Some((status, stderr)) = out {
        assert!(status.success(), "child failed ({status:?}):\n{stderr}");
        assert!(
            !stderr.contains("without a yield point"),
            "a false stuck-fiber report:\n{stderr}"
        );
    }
}

/// The same runtime kept in a thread-local of one of its own worker
/// threads (moved there by `on_thread_stop` as a grown worker retires):
/// the thread-local's destructor drops it as the thread exits. The drop
/// must neither panic (a panic in a thread-local destructor aborts the
/// process) nor wait for the thread it runs on.
// Failed before the fix: the shutdown joined the thread it ran on, and the join's panic in the thread-local destructor aborted the process
#[test]
fn a_runtime_dropped_by_a_thread_local_of_its_own_retiring_worker() {
    static SLOT: std::sync::Mutex<Option<fiber::Runtime>> = std::sync::Mutex::new(None);
    static DROPPED: std::sync::Mutex<Option<Duration>> = std::sync::Mutex::new(None);
    struct Keeper(Option<fiber::Runtime>);
    impl Drop for Keeper {
        fn drop(&mut self) {
            if let Some(rt) = self.0.take() {
                let start = Instant::now();
                drop(rt);
                *DROPPED.lock().unwrap() = Some(start.elapsed());
            }
        }
    }
    std::thread_local! {
        static KEPT: std::cell::RefCell<Keeper> = const { std::cell::RefCell::new(Keeper(None)) };
    }
    let out = child_outcome(
        "a_runtime_dropped_by_a_thread_local_of_its_own_retiring_worker",
        60,
        &[],
        || {
            within(40, || {
                let rt = fiber::Runtime::builder()
                    .workers(1)
                    .max_workers(2)
                    .idle_timeout(ms(50))
                    .shutdown_timeout(ms(100))
                    .on_thread_stop(|| {
                        if let Some(rt) = SLOT.lock().unwrap().take() {
                            KEPT.with(|k| k.borrow_mut().0 = Some(rt));
                        }
                    })
                    .build()
                    .unwrap();
                let handle = rt.handle();
                *SLOT.lock().unwrap() = Some(rt);
                handle.block_on(|| {
                    let other = fiber::spawn(|| fiber::sleep(ms(1)));
                    // Hold the only worker without a yield point: the
                    // monitor grows a second one for `other`.
                    std::thread::sleep(ms(300));
                    other.join().unwrap().unwrap();
                });
                let start = Instant::now();
                while DROPPED.lock().unwrap().is_none() {
                    assert!(start.elapsed() < Duration::from_secs(20), "no worker retired");
                    std::thread::sleep(ms(10));
                }
                let took = DROPPED.lock().unwrap().unwrap();
                assert!(
                    took < Duration::from_secs(1),
                    "the drop waited {took:?} for its own worker thread"
                );
            })
        },
    );
    if let Some((status, stderr)) = out {
        assert!(status.success(), "child failed ({status:?}):\n{stderr}");
        assert!(
            !stderr.contains("without a yield point"),
            "a false stuck-fiber report:\n{stderr}"
        );
    }
}

/// A pinned fiber alive after the grace time is unwound on its own worker
/// thread (its stack may point into that thread's thread-locals), before
/// that thread's thread-locals are destroyed; so is a pinned scope owner
/// whose unpinned children are still alive, after them.
// Failed before the fix: the pinned owner was abandoned (its destructor never ran)
#[test]
fn pinned_fibers_are_unwound_on_their_home_thread_children_first() {
    in_child(
        "pinned_fibers_are_unwound_on_their_home_thread_children_first",
        60,
        || {
            within(30, || {
                std::thread_local! {
                    static ALIVE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
                }
                struct Home {
                    home: std::thread::ThreadId,
                    what: &'static str,
                    out: mpsc::Sender<(&'static str, bool, bool)>,
                }
                impl Drop for Home {
                    fn drop(&mut self) {
                        let same = std::thread::current().id() == self.home;
                        // The home thread's thread-locals are still there.
                        let tls = ALIVE.try_with(|a| a.get()).unwrap_or(false);
                        let _ = self.out.send((self.what, same, tls));
                    }
                }
                let rt = fiber::Runtime::builder()
                    .workers(2)
                    .max_workers(2)
                    .shutdown_timeout(ms(100))
                    .on_thread_start(|| ALIVE.with(|a| a.set(true)))
                    .build()
                    .unwrap();
                let (out_tx, out_rx) = mpsc::channel();
                let (_never_tx, never_rx) = unbounded::<()>();
                rt.block_on(move || {
                    let owner_out = out_tx.clone();
                    fiber::spawn_pinned(move || {
                        let _home = Home {
                            home: std::thread::current().id(),
                            what: "owner",
                            out: owner_out,
                        };
                        fiber::scope(|s| {
                            for _ in 0..2 {
                                let out = out_tx.clone();
                                let never = never_rx.clone();
                                s.spawn(move || {
                                    let _home = Home {
                                        home: std::thread::current().id(),
                                        what: "child",
                                        out,
                                    };
                                    // Children migrate freely; whichever thread
                                    // unwinds them is fine, so record only that
                                    // they ran their destructors.
                                    fiber::non_cancellable(|| never.recv())
                                });
                            }
                        });
                    });
                });
                wait_parked(&rt, 3);
                drop(rt);
                let mut got = Vec::new();
                while let Ok(event) = out_rx.recv_timeout(Duration::from_secs(5)) {
                    got.push(event);
                }
                assert_eq!(got.len(), 3, "every destructor runs once: {got:?}");
                let (what, same, tls) = got[2];
                assert_eq!(what, "owner", "the scope owner is unwound after its children: {got:?}");
                assert!(same, "the pinned owner was unwound off its home thread");
                assert!(
                    tls,
                    "the pinned owner was unwound after its thread's thread-locals were gone"
                );
            })
        },
    );
}
