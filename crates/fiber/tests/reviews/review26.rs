//! Adversarial review, round 26: attacks on the changes of `55cc3e7..52d27d0`
//! (a dropped reserved channel node parks on `ReservationEnd`; per-thread
//! in-use cells of the frame pool; `try_scope` children cancelled on their
//! own; `Handle::current` inside `fiber::blocking`; the deadlock report
//! held off while another runtime acts; `max_workers` alone lowering the
//! default worker count; `RwLock` waiters keeping their place across a
//! cancel's wake; a cancelled n-th `Barrier` arrival releasing the
//! generation; unix listener timeouts and empty unix reads).

use crate::common::{child_outcome, ms, rt2, rt_fixed_grace, wait_parked, within};
use fiber::chan;
use fiber::sync::{Barrier, RwLock};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// std's `Barrier`: of the n callers of a generation exactly one is the
/// leader, and the barrier is reusable. The project's doc (barrier.rs):
/// a cancelled fiber that would have to wait withdraws and returns
/// `is_cancelled`, without counting; a cancelled n-th arrival releases the
/// generation and leads. Over many generations mixing both, every
/// generation has one leader, no uncancelled caller is stranded and no
/// cancelled one is released as a party.
#[test]
fn a_barrier_mixing_cancelled_arrivals_over_generations_keeps_one_leader_each() {
    within(30, || {
        rt2().block_on(|| {
            const ROUNDS: usize = 40;
            let barrier = Arc::new(Barrier::new(3));
            let leaders = Arc::new(AtomicUsize::new(0));
            let released = Arc::new(AtomicUsize::new(0));
            for round in 0..ROUNDS {
                fiber::scope(|s| {
                    // A cancelled arrival before the other two: it must not
                    // count (it would have to wait).
                    let (b, l) = (barrier.clone(), leaders.clone());
                    let (estart_tx, estart_rx) = chan::bounded::<()>(1);
                    let early = s.spawn(move || {
                        estart_tx.send(()).unwrap();
                        while !fiber::is_cancelled() {
                            let _ = fiber::yield_now();
                        }
                        let r = b.wait();
                        if r.is_leader() {
                            l.fetch_add(1, SeqCst);
                        }
                        r.is_cancelled()
                    });
                    estart_rx.recv().unwrap();
                    early.cancel();
                    let _ = early.join();
                    // Two parties wait, the third arrives cancelled (or not,
                    // every other round): it completes the generation.
                    let mut waiters = Vec::new();
                    for _ in 0..2 {
                        let (b, l, r) = (barrier.clone(), leaders.clone(), released.clone());
                        waiters.push(s.spawn(move || {
                            let res = b.wait();
                            assert!(!res.is_cancelled());
                            if res.is_leader() {
                                l.fetch_add(1, SeqCst);
                            }
                            r.fetch_add(1, SeqCst);
                        }));
                    }
                    // Both queued before the last arrives.
                    while barrier_waiting(&barrier) < 2 {
                        let _ = fiber::yield_now();
                    }
                    let (b, l, r) = (barrier.clone(), leaders.clone(), released.clone());
                    let cancel_last = round % 2 == 0;
                    let last_outcome = Arc::new(AtomicUsize::new(0));
                    let lo = last_outcome.clone();
                    // It runs before it is cancelled (a fiber cancelled
                    // before its start never runs its body).
                    let (started_tx, started_rx) = chan::bounded::<()>(1);
                    let last = s.spawn(move || {
                        started_tx.send(()).unwrap();
                        if cancel_last {
                            while !fiber::is_cancelled() {
                                let _ = fiber::yield_now();
                            }
                        }
                        let res = b.wait();
                        lo.store(if res.is_cancelled() { 2 } else { 1 }, SeqCst);
                        if res.is_leader() {
                            l.fetch_add(1, SeqCst);
                        }
                        r.fetch_add(1, SeqCst);
                    });
                    started_rx.recv().unwrap();
                    if cancel_last {
                        last.cancel();
                    }
                    // A cancelled fiber's join says cancelled whatever its
                    // body did: its outcome comes through `last_outcome`.
                    let _ = last.join();
                    let outcome = last_outcome.load(SeqCst);
                    assert_eq!(
                        outcome, 1,
                        "round {round}: the last arrival (2: cancelled, 0: no return)"
                    );
                    for w in waiters {
                        w.join().unwrap();
                    }
                });
                assert_eq!(leaders.load(SeqCst), round + 1, "round {round}: leaders");
                assert_eq!(released.load(SeqCst), 3 * (round + 1), "round {round}: released");
            }
            assert_eq!(barrier.generation(), ROUNDS as u64);
        })
    });
}

/// Fibers parked on a lock-kind wait (a barrier's queued parties here:
/// nothing else in the test parks on one).
fn barrier_waiting(_: &Barrier) -> usize {
    fiber::dump()
        .fibers
        .iter()
        .filter(|f| f.waiting == fiber::WaitKind::Lock && f.state == fiber::core::state::FiberState::Parked)
        .count()
}

/// std's `RwLock` on Linux (and spec/sync.md section 3.2, strict FIFO):
/// a waiting writer is not passed by readers that come after it. Here the
/// writer's fiber is cancelled while it waits (the cancel wakes it
/// and it parks again in its place, `WaitQueue::rewait`), while the lock
/// changes hands between two other writers ahead of it: the order of
/// acquisition stays the queue order, and nothing is lost.
#[test]
fn a_writer_woken_by_cancels_while_the_lock_changes_hands_keeps_its_place() {
    within(30, || {
        let rt = rt_fixed_grace(2, ms(300));
        let order = Arc::new(Mutex::new(Vec::<&'static str>::new()));
        let lock = Arc::new(RwLock::new(0u32));
        let (l, o) = (lock.clone(), order.clone());
        let (hold_tx, hold_rx) = chan::bounded::<()>(0);
        let (held_tx, held_rx) = chan::bounded::<()>(0);
        let w1 = rt.spawn(move || {
            let mut g = l.write().unwrap();
            held_tx.send(()).unwrap();
            hold_rx.recv().unwrap();
            *g += 1;
            o.lock().unwrap().push("w1");
        });
        held_rx.recv().unwrap();
        // W2 queues first, then the victim writer, then a reader.
        let (l, o) = (lock.clone(), order.clone());
        let (hold2_tx, hold2_rx) = chan::bounded::<()>(0);
        let w2 = rt.spawn(move || {
            let mut g = l.write().unwrap();
            hold2_rx.recv().unwrap();
            *g += 1;
            o.lock().unwrap().push("w2");
        });
        wait_parked(&rt, 2);
        let (l, o) = (lock.clone(), order.clone());
        let victim = rt.spawn(move || {
            let mut g = l.write().unwrap();
            *g += 1;
            o.lock().unwrap().push("victim");
        });
        wait_parked(&rt, 3);
        let (l, o) = (lock.clone(), order.clone());
        let reader = rt.spawn(move || {
            let g = l.read().unwrap();
            o.lock().unwrap().push("reader");
            *g
        });
        wait_parked(&rt, 4);
        victim.cancel();
        std::thread::sleep(ms(20));
        // Lock passes to W2 while the victim may be awake from the cancel.
        hold_tx.send(()).unwrap();
        w1.join().unwrap();
        std::thread::sleep(ms(20));
        assert!(lock.try_read().is_err(), "a reader got in while writers wait");
        hold2_tx.send(()).unwrap();
        w2.join().unwrap();
        let _ = victim.join();
        assert_eq!(reader.join().unwrap(), 3);
        assert_eq!(*order.lock().unwrap(), ["w1", "w2", "victim", "reader"]);
        assert!(lock.try_write().is_ok(), "the lock ends free");
    });
}

/// Kotlin: a child's `CancellationException` is ignored by its parent;
/// the project's doc (`try_scope`): a child cancelled on its own that
/// returns `Err` ends cancelled and the scope goes on. A child whose own
/// nested `try_scope` is cancelled through it (its grandchildren fail
/// with the cancellation and the nested scope returns their `Err`) is the
/// same case one level down: the outer scope still succeeds, its other
/// child finishes.
#[test]
fn a_cancelled_child_whose_nested_try_scope_returns_err_does_not_fail_the_outer_scope() {
    let r = within(15, || {
        rt2().block_on(|| {
            fiber::try_scope(|s| -> Result<u32, fiber::Cancelled> {
                let (ready_tx, ready_rx) = chan::bounded::<()>(1);
                let victim = s.spawn(move || -> Result<(), fiber::Cancelled> {
                    fiber::try_scope(|inner| -> Result<(), fiber::Cancelled> {
                        let a = inner.spawn(|| -> Result<(), fiber::Cancelled> {
                            fiber::sleep(Duration::from_secs(3600))?;
                            Ok(())
                        });
                        ready_tx.send(()).unwrap();
                        fiber::sleep(Duration::from_secs(3600))?;
                        a.join().map_err(|_| fiber::Cancelled)?;
                        Ok(())
                    })
                });
                let sibling = s.spawn(|| -> Result<u32, fiber::Cancelled> {
                    fiber::sleep(ms(100))?;
                    Ok(7)
                });
                ready_rx.recv().unwrap();
                victim.cancel();
                let _ = victim.join();
                sibling.join().map_err(|_| fiber::Cancelled)
            })
        })
    });
    assert_eq!(r, Ok(7));
}

/// tokio's `Handle::current` inside `spawn_blocking` names the runtime
/// whose pool runs the call (the project documents the same). With two
/// runtimes of different sizes, a blocking call of each names its own:
/// a fiber spawned through it sees that runtime's worker count.
#[test]
fn handle_current_inside_blocking_names_each_runtime_s_own_pool() {
    within(20, || {
        let a = rt_fixed_grace(1, ms(300));
        let b = rt_fixed_grace(3, ms(300));
        let on = |rt: &fiber::Runtime| {
            rt.block_on(|| {
                fiber::blocking(|| {
                    let h = fiber::Handle::current();
                    h.spawn(|| fiber::stats().runtime.workers).join().unwrap()
                })
            })
        };
        assert_eq!(on(&a), 1);
        assert_eq!(on(&b), 3);
        assert_eq!(on(&a), 1);
        // From a fiber of `b` spawned by a fiber of `a`'s blocking call.
        let hb = b.handle();
        let w = a.block_on(move || {
            fiber::blocking(move || {
                hb.spawn(|| {
                    fiber::blocking(|| fiber::Handle::current().spawn(|| fiber::stats().runtime.workers).join())
                })
                .join()
                .unwrap()
                .unwrap()
            })
        });
        assert_eq!(w, 3);
    });
}

/// The README (`FIBER_MAX_WORKERS`): "alone, it lowers the default worker
/// count"; the builder's `max_workers` documents the same. `max_workers(1)`
/// alone runs one worker and no growth; `max_workers(0)` alone is an
/// `InvalidInput` error (a ceiling of 0), not a runtime.
#[test]
fn max_workers_alone_lowers_the_default_and_zero_is_an_error() {
    within(20, || {
        let rt = fiber::Runtime::builder()
            .max_workers(1)
            .shutdown_timeout(ms(300))
            .build()
            .unwrap();
        let s = rt.block_on(fiber::stats).runtime;
        assert_eq!((s.workers, s.max_workers), (1, 1));
        drop(rt);
        let e = match fiber::Runtime::builder().max_workers(0).build() {
            Ok(_) => panic!("max_workers(0) built a runtime"),
            Err(e) => e,
        };
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("max_workers"), "{e}");
    });
}

/// Go reports "all goroutines are asleep - deadlock!" when nothing can
/// wake a goroutine; the README holds the report off only while another
/// runtime *acts* (a fiber running or runnable, a timer pending, a
/// blocking call). Another runtime that merely exists, idle, with a root
/// that already returned and no fibers, must not hide a real deadlock.
#[test]
fn a_real_deadlock_is_reported_while_another_runtime_is_merely_idle() {
    const C: &str = "a_real_deadlock_is_reported_while_another_runtime_is_merely_idle";
    let outcome = child_outcome(C, 25, &[("FIBER_DEADLOCK_ABORT", "1")], || {
        let other = rt2();
        assert_eq!(other.block_on(|| 1), 1);
        let a = rt2();
        let (_tx, rx) = chan::bounded::<u32>(0);
        let _tx2 = _tx.clone();
        // Nothing ever sends: a real deadlock of `a`'s root.
        let _ = a.block_on(move || rx.recv());
        drop(other);
    });
    if let Some((status, stderr)) = outcome {
        assert!(
            !status.success() && stderr.contains("deadlock"),
            "status {status:?}, stderr:\n{stderr}"
        );
    }
}

/// std's `UnixStream`: an expiring `set_write_timeout` on a full socket
/// fails the write with `WouldBlock` (`EAGAIN`), after about the timeout,
/// having written nothing more; the same through a fiber stream.
#[test]
fn a_unix_write_timeout_on_a_full_socket_is_would_block_like_std() {
    use std::io::Write;
    within(20, || {
        // std's reference behaviour.
        let (mut s, _peer) = std::os::unix::net::UnixStream::pair().unwrap();
        s.set_write_timeout(Some(ms(50))).unwrap();
        let buf = vec![7u8; 64 * 1024];
        let std_kind = loop {
            match s.write(&buf) {
                Ok(n) => assert!(n > 0),
                Err(e) => break e.kind(),
            }
        };
        rt2().block_on(move || {
            let (mut s, _peer) = fiber::net::unix::UnixStream::pair().unwrap();
            s.set_write_timeout(Some(ms(50))).unwrap();
            let buf = vec![7u8; 64 * 1024];
            let start = Instant::now();
            let kind = loop {
                match s.write(&buf) {
                    Ok(n) => assert!(n > 0),
                    Err(e) => break e.kind(),
                }
            };
            assert_eq!(kind, std_kind);
            assert!(start.elapsed() >= ms(45));
        });
    });
}

/// std's `UnixStream`: a read into an empty buffer with an expiring
/// timeout and no data fails with `WouldBlock` (the kernel waits for one
/// byte even for an empty buffer); once data is queued it returns 0 at
/// once and leaves the data for the next read; after the peer closes it
/// returns 0. The project documents the same (`stream_io!`).
#[test]
fn empty_unix_reads_follow_std_with_data_without_data_and_at_eof() {
    use std::io::{Read, Write};
    within(20, || {
        let std_results = {
            let (mut a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
            a.set_read_timeout(Some(ms(30))).unwrap();
            let r1 = a.read(&mut []).map_err(|e| e.kind());
            b.write_all(b"xy").unwrap();
            let r2 = a.read(&mut []).map_err(|e| e.kind());
            let mut two = [0u8; 2];
            let r3 = a.read(&mut two).map_err(|e| e.kind());
            drop(b);
            let r4 = a.read(&mut []).map_err(|e| e.kind());
            (r1, r2, r3, r4)
        };
        let fiber_results = rt2().block_on(|| {
            let (mut a, mut b) = fiber::net::unix::UnixStream::pair().unwrap();
            a.set_read_timeout(Some(ms(30))).unwrap();
            let r1 = a.read(&mut []).map_err(|e| e.kind());
            b.write_all(b"xy").unwrap();
            let r2 = a.read(&mut []).map_err(|e| e.kind());
            let mut two = [0u8; 2];
            let r3 = a.read(&mut two).map_err(|e| e.kind());
            drop(b);
            let r4 = a.read(&mut []).map_err(|e| e.kind());
            (r1, r2, r3, r4)
        });
        assert_eq!(fiber_results, std_results);
    });
}

/// spec/chan.md (reservations): a node dropped while a select's send arm
/// holds its reservation waits for the reservation's end. Here the
/// receiver's wait ends by unwinding at shutdown while the reserving
/// select's value expression is itself parked in `non_cancellable` on a
/// channel the receiver side will never feed, with one worker: teardown
/// must unwind both and return, the value's destructor running once.
#[test]
fn shutdown_with_a_reserving_value_expression_parked_for_good_returns() {
    crate::common::in_child(
        "shutdown_with_a_reserving_value_expression_parked_for_good_returns",
        15,
        || {
            struct Counted(Arc<AtomicUsize>);
            impl Drop for Counted {
                fn drop(&mut self) {
                    self.0.fetch_add(1, SeqCst);
                }
            }
            for workers in [1, 2] {
                let rt = rt_fixed_grace(workers, ms(50));
                let drops = Arc::new(AtomicUsize::new(0));
                let (tx, rx) = chan::bounded::<Counted>(0);
                let (never_tx, never_rx) = chan::bounded::<()>(0);
                let entered = Arc::new(AtomicUsize::new(0));
                let (rx2, e2) = (rx.clone(), entered.clone());
                rt.spawn(move || {
                    let _ = rx2.recv();
                });
                let (t2, d2) = (tx.clone(), drops.clone());
                while tx.waiting().0 < 1 {
                    std::thread::yield_now();
                }
                rt.spawn(move || {
                    fiber::select! {
                        send(t2, {
                            e2.store(1, SeqCst);
                            fiber::non_cancellable(|| {
                                let _ = never_rx.recv();
                            });
                            Counted(d2)
                        }) -> _ => {},
                    }
                });
                while entered.load(SeqCst) == 0 {
                    std::thread::yield_now();
                }
                let start = Instant::now();
                drop(rt);
                assert!(start.elapsed() < Duration::from_secs(5), "{workers} workers");
                drop(never_tx);
                // The value was never produced (the expression was
                // unwound): nothing to drop, nothing dropped twice.
                assert_eq!(drops.load(SeqCst), 0, "{workers} workers");
                assert_eq!(tx.waiting(), (0, 0), "{workers} workers");
                drop(rx);
            }
        },
    );
}

/// Go reports "all goroutines are asleep - deadlock!" when nothing can
/// wake a goroutine; the README holds the report off while another
/// runtime *acts*, a pending timer counting, and the monitor's own check
/// says a dead timer entry ("left by a wait that ended early (a
/// `recv_timeout(1h)` answered at once) wakes nobody, and must not hide a
/// deadlock for an hour"). Another runtime whose only trace is such an
/// entry (a `recv_timeout(1h)` answered, a `sleep(1h)` cancelled: no
/// fiber left at all) must not hide this runtime's real deadlock.
// Failed before the fix: the report never comes (the child hangs until killed): another runtime's dead 1-hour timer entries count as "acting"
#[test]
fn a_real_deadlock_is_reported_while_another_runtime_holds_only_dead_timer_entries() {
    const C: &str = "a_real_deadlock_is_reported_while_another_runtime_holds_only_dead_timer_entries";
    let outcome = child_outcome(C, 20, &[("FIBER_DEADLOCK_ABORT", "1")], || {
        let other = rt2();
        other.block_on(|| {
            // A receive with a 1-hour timeout, answered after it parked.
            let (tx, rx) = chan::bounded::<u32>(0);
            let h = fiber::spawn(move || rx.recv_timeout(Duration::from_secs(3600)));
            while tx.waiting().0 < 1 {
                let _ = fiber::yield_now();
            }
            tx.send(1).unwrap();
            assert_eq!(h.join().unwrap(), Ok(1));
            // A 1-hour sleep, cancelled after it parked.
            let (started_tx, started_rx) = chan::bounded::<()>(1);
            let h = fiber::spawn(move || {
                started_tx.send(()).unwrap();
                fiber::sleep(Duration::from_secs(3600))
            });
            started_rx.recv().unwrap();
            fiber::sleep(ms(20)).unwrap();
            h.cancel();
            let _ = h.join();
        });
        let a = rt2();
        let (tx, rx) = chan::bounded::<u32>(0);
        // Nothing ever sends: a real deadlock of `a`'s root.
        let _ = a.block_on(move || rx.recv());
        drop((tx, other));
    });
    if let Some((status, stderr)) = outcome {
        assert!(
            !status.success() && stderr.contains("deadlock"),
            "status {status:?}, stderr:\n{stderr}"
        );
    }
}

/// std on Linux: a stream accepted from a non-blocking listener is itself
/// blocking (`accept4` is called without `SOCK_NONBLOCK`; the file status
/// flags are not inherited), for TCP and unix sockets alike, and it starts
/// without the listener's unix timeouts (the project's
/// `UnixListener::accept`). So a read with a 100 ms timeout and no data
/// waits about 100 ms and then fails with `WouldBlock`, as std's does.
#[test]
fn streams_accepted_from_a_non_blocking_listener_block_like_std() {
    use std::io::Read;
    within(20, || {
        // std's reference, unix.
        let dir = std::env::temp_dir().join(format!("fiber-r26-nb-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let std_path = dir.join("std.sock");
        let _ = std::fs::remove_file(&std_path);
        let l = std::os::unix::net::UnixListener::bind(&std_path).unwrap();
        l.set_nonblocking(true).unwrap();
        let _c = std::os::unix::net::UnixStream::connect(&std_path).unwrap();
        let (mut s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(ms(100))).unwrap();
        let start = Instant::now();
        let std_kind = s.read(&mut [0u8; 4]).map_err(|e| e.kind());
        assert!(start.elapsed() >= ms(90));
        let fiber_path = dir.join("fiber.sock");
        let _ = std::fs::remove_file(&fiber_path);
        let (unix_kind, unix_waited, tcp_kind, tcp_waited) = rt2().block_on(move || {
            let l = fiber::net::unix::UnixListener::bind(&fiber_path).unwrap();
            l.set_nonblocking(true).unwrap();
            let _c = fiber::net::unix::UnixStream::connect(&fiber_path).unwrap();
            let mut s = loop {
                match l.accept() {
                    Ok((s, _)) => break s,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        let _ = fiber::yield_now();
                    }
                    Err(e) => panic!("accept: {e}"),
                }
            };
            s.set_read_timeout(Some(ms(100))).unwrap();
            let start = Instant::now();
            let unix_kind = s.read(&mut [0u8; 4]).map_err(|e| e.kind());
            let unix_waited = start.elapsed();

            let l = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.set_nonblocking(true).unwrap();
            let _c = fiber::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let mut s = loop {
                match l.accept() {
                    Ok((s, _)) => break s,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        let _ = fiber::yield_now();
                    }
                    Err(e) => panic!("accept: {e}"),
                }
            };
            s.set_read_timeout(Some(ms(100))).unwrap();
            let start = Instant::now();
            let tcp_kind = s.read(&mut [0u8; 4]).map_err(|e| e.kind());
            let tcp_waited = start.elapsed();
            (unix_kind, unix_waited >= ms(90), tcp_kind, tcp_waited >= ms(90))
        });
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!((unix_kind, unix_waited), (std_kind, true), "unix");
        assert_eq!((tcp_kind, tcp_waited), (std_kind, true), "tcp");
    });
}

/// tokio: `Handle::block_on` may be called inside `spawn_blocking` (a
/// blocking-pool thread is no worker). The project's `Handle::block_on`
/// panics only "when called from a fiber". Inside `fiber::blocking`,
/// `Handle::current().block_on` runs a root fiber of the pool's runtime
/// and returns its value, even on a one-worker runtime whose only worker
/// is free.
#[test]
fn handle_current_block_on_inside_blocking_runs_a_root_of_the_pool_s_runtime() {
    let v = within(20, || {
        rt_fixed_grace(1, ms(300)).block_on(|| {
            fiber::blocking(|| {
                fiber::Handle::current().block_on(|| {
                    fiber::sleep(ms(10)).unwrap();
                    fiber::stats().runtime.workers + 41
                })
            })
        })
    });
    assert_eq!(v, 42);
}

/// spec/chan.md (reservations) and the project's `Chan::wait_reservation_end`:
/// a node dropped while a select's send arm holds its reservation parks
/// until the reservation ends. Here the receiver belongs to runtime B,
/// which is dropped, and the reserving select is a fiber of runtime A
/// whose value expression takes 300 ms: B's drop returns, the value is
/// dropped exactly once (no double drop, no use of B's freed memory), A's
/// select ends and A goes on working.
// Failed before the fix: B's drop abandons the receiver as "parked on a wait nothing completes" (B's memory leaked) and A's value, handed into its leaked node, is never dropped (0 drops)
#[test]
fn dropping_a_runtime_whose_receiver_is_reserved_by_another_runtime_s_select() {
    crate::common::in_child(
        "dropping_a_runtime_whose_receiver_is_reserved_by_another_runtime_s_select",
        20,
        || {
            struct Counted(Arc<AtomicUsize>);
            impl Drop for Counted {
                fn drop(&mut self) {
                    self.0.fetch_add(1, SeqCst);
                }
            }
            for workers in [1, 2] {
                let a = rt_fixed_grace(workers, ms(50));
                let b = rt_fixed_grace(workers, ms(50));
                let drops = Arc::new(AtomicUsize::new(0));
                let (tx, rx) = chan::bounded::<Counted>(0);
                let entered = Arc::new(AtomicUsize::new(0));
                let rx2 = rx.clone();
                b.spawn(move || {
                    let _ = rx2.recv();
                });
                while tx.waiting().0 < 1 {
                    std::thread::yield_now();
                }
                let (t2, d2, e2) = (tx.clone(), drops.clone(), entered.clone());
                let sel = a.spawn(move || {
                    fiber::select! {
                        send(t2, {
                            e2.store(1, SeqCst);
                            fiber::non_cancellable(|| {
                                let _ = fiber::sleep(ms(300));
                            });
                            Counted(d2)
                        }) -> r => r.is_ok(),
                    }
                });
                while entered.load(SeqCst) == 0 {
                    std::thread::yield_now();
                }
                let start = Instant::now();
                drop(b);
                assert!(start.elapsed() < Duration::from_secs(5), "{workers} workers: B's drop");
                let _sent = sel.join().unwrap();
                // A still works.
                assert_eq!(a.block_on(|| 5), 5);
                drop(a);
                drop((tx, rx));
                // B's reaper finishes the receiver once the hand-off ended:
                // the value reached its node and is dropped by its fiber.
                let deadline = Instant::now() + Duration::from_secs(8);
                while drops.load(SeqCst) == 0 && Instant::now() < deadline {
                    std::thread::sleep(ms(10));
                }
                assert_eq!(drops.load(SeqCst), 1, "{workers} workers: the value's drops");
            }
        },
    );
}

/// The project's shutdown (runtime.rs `reap_later`): a fiber given up on
/// inside a `fiber::blocking` call is unwound once the call returns, "so
/// what they own (sockets, files) is released". `Chan::wait_reservation_end`
/// documents that a receiver unwound while a select's send arm holds its
/// reservation parks until "its holder's unwind". Here the holder's value
/// expression is in a 300 ms blocking call at shutdown: once the call
/// returns the holder unwinds and gives the reservation back, so the
/// receiver, too, must be unwound (its destructors run), not leaked.
// Failed before the fix: the receiver is reported "parked on a wait nothing completes" and never unwound (its destructor never runs; the runtime is leaked), although the holder's unwind ends its wait
#[test]
fn a_receiver_reserved_by_a_select_in_a_blocking_call_at_shutdown_is_unwound_later() {
    crate::common::in_child(
        "a_receiver_reserved_by_a_select_in_a_blocking_call_at_shutdown_is_unwound_later",
        20,
        || {
            struct Flag(Arc<AtomicUsize>);
            impl Drop for Flag {
                fn drop(&mut self) {
                    self.0.fetch_add(1, SeqCst);
                }
            }
            let rt = rt_fixed_grace(1, ms(50));
            let unwound = Arc::new(AtomicUsize::new(0));
            let (tx, rx) = chan::bounded::<u32>(0);
            let entered = Arc::new(AtomicUsize::new(0));
            let (r2, u2) = (rx.clone(), unwound.clone());
            rt.spawn(move || {
                let _flag = Flag(u2);
                let _ = r2.recv();
            });
            while tx.waiting().0 < 1 {
                std::thread::yield_now();
            }
            let (t2, e2, u3) = (tx.clone(), entered.clone(), unwound.clone());
            rt.spawn(move || {
                let _flag = Flag(u3);
                fiber::select! {
                    send(t2, {
                        e2.store(1, SeqCst);
                        fiber::blocking(|| std::thread::sleep(ms(300)));
                        5
                    }) -> _ => {},
                }
            });
            while entered.load(SeqCst) == 0 {
                std::thread::yield_now();
            }
            drop(rt);
            // The receiver waited for the hand-off before its unwind began,
            // so no unwind was left half-done on this thread.
            assert!(!std::thread::panicking(), "the dropping thread is left panicking");
            // The blocking call returns within 300 ms; the reaper unwinds
            // the holder, whose unwind ends the receiver's wait.
            let deadline = Instant::now() + Duration::from_secs(8);
            while unwound.load(SeqCst) < 2 && Instant::now() < deadline {
                std::thread::sleep(ms(20));
            }
            assert_eq!(unwound.load(SeqCst), 2, "fibers unwound (holder and receiver)");
        },
    );
}

/// crossbeam-channel's `Select` and Go's `select`: once a send arm is
/// chosen its value is handed over; the receiver's own deadline that
/// passes meanwhile does not undo the hand-off (`recv_timeout` returns the
/// value). While the holder's value expression runs (here it sleeps
/// 300 ms), the receiver whose deadline passed waits for the hand-off
/// parked, as "chan hand-off" in the dump, instead of burning its worker
/// in a yield loop (one worker: a spinning receiver would also hold back
/// every other fiber's turn).
#[test]
// Failed before the fix: a receiver whose recv_timeout expires while a select's send arm holds its node yields in a loop for the whole value expression instead of parking
fn a_receiver_whose_deadline_passes_during_a_held_hand_off_parks_for_it() {
    within(20, || {
        let rt = crate::common::rt1();
        let (tx, rx) = chan::bounded::<u32>(0);
        let receiver = rt.spawn(move || rx.recv_timeout(ms(30)));
        wait_parked(&rt, 1);
        let holder = rt.spawn(move || {
            fiber::select! {
                send(tx, {
                    let _ = fiber::sleep(ms(300));
                    7
                }) -> r => r.is_ok(),
            }
        });
        let id = receiver.id();
        let start = Instant::now();
        loop {
            let parked_for_handoff = rt.dump().fibers.iter().any(|f| {
                f.id == id && f.state == fiber::core::state::FiberState::Parked && f.waiting.name() == "chan hand-off"
            });
            if parked_for_handoff {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "the receiver never parked for the held hand-off"
            );
            std::thread::sleep(ms(2));
        }
        assert_eq!(receiver.join().unwrap(), Ok(7));
        assert!(holder.join().unwrap());
    })
}
