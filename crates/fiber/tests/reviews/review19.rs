//! Review 19: `fiber::sync` against std (and against fiber's own rule for
//! cancelled fibers, which follows Go and Kotlin: an operation that needs no
//! wait completes, cancelled or not), mixed fiber and plain-thread parties,
//! shutdown while fibers wait on something a plain thread holds, timer arms
//! in `select!` and `Select::ready`, and destructors that panic at shutdown.

use fiber::chan::{after, never, tick, Select};
use fiber::sync::{Barrier, Condvar, Mutex, OnceLock, RwLock, Semaphore, WaitGroup};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{ms, rt2, rt_fixed_grace, wait_parked, within};

/// std: exactly one `wait` per generation is the leader; here two fibers and
/// two plain threads share a barrier of 4 for 40 generations.
#[test]
fn a_barrier_shared_by_fibers_and_plain_threads_has_one_leader_per_generation() {
    within(20, || {
        let rt = rt2();
        let b = Arc::new(Barrier::new(4));
        let leaders = Arc::new(AtomicUsize::new(0));
        const GENS: usize = 40;
        let mut fibers = Vec::new();
        for _ in 0..2 {
            let (b, l) = (b.clone(), leaders.clone());
            fibers.push(rt.spawn(move || {
                for _ in 0..GENS {
                    if b.wait().is_leader() {
                        l.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }));
        }
        let mut threads = Vec::new();
        for _ in 0..2 {
            let (b, l) = (b.clone(), leaders.clone());
            threads.push(std::thread::spawn(move || {
                for _ in 0..GENS {
                    if b.wait().is_leader() {
                        l.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }));
        }
        for f in fibers {
            f.join().unwrap();
        }
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(leaders.load(Ordering::SeqCst), GENS);
        assert_eq!(b.generation(), GENS as u64);
    })
}

/// A fiber parked in `Condvar::wait` is cancelled at shutdown and must take
/// the mutex back, which a plain thread holds past the grace time: teardown
/// ends that lock wait, and once the thread lets go the mutex is free (no
/// second unlock, no guard handed to a fiber that is gone).
#[test]
fn shutdown_of_a_condvar_waiter_whose_mutex_a_thread_holds_leaves_the_mutex_usable() {
    within(20, || {
        let rt = rt_fixed_grace(2, ms(100));
        let pair = Arc::new((Mutex::new(0u32), Condvar::new()));
        let p = pair.clone();
        let _h = rt.spawn(move || {
            let (m, cv) = &*p;
            let mut g = m.lock().unwrap();
            loop {
                g = cv.wait(g).unwrap();
                if *g == 99 {
                    break;
                }
            }
        });
        wait_parked(&rt, 1);
        let (tx, rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let p = pair.clone();
        let holder = std::thread::spawn(move || {
            let g = p.0.lock().unwrap();
            tx.send(()).unwrap();
            go_rx.recv().unwrap();
            drop(g);
        });
        rx.recv().unwrap();
        drop(rt);
        go_tx.send(()).unwrap();
        holder.join().unwrap();
        let g = pair.0.try_lock();
        assert!(g.is_ok(), "mutex must be free: {:?}", g.is_err());
    })
}

/// A fiber in `OnceLock::wait` while a plain thread runs the initializer keeps
/// the grace time (spec/reliability.md step 2) and gets the value, and the
/// drop ends soon after, not at the end of the grace time.
#[test]
fn a_once_lock_wait_at_shutdown_gets_a_threads_value_within_the_grace_time() {
    within(20, || {
        let rt = rt_fixed_grace(2, ms(2000));
        let cell = Arc::new(OnceLock::<u32>::new());
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let c = cell.clone();
        let init = std::thread::spawn(move || {
            *c.get_or_init(|| {
                started_tx.send(()).unwrap();
                go_rx.recv().unwrap();
                7
            })
        });
        started_rx.recv().unwrap();
        let c = cell.clone();
        let got = Arc::new(AtomicUsize::new(0));
        let g2 = got.clone();
        let h = rt.spawn(move || g2.store(*c.wait() as usize, Ordering::SeqCst));
        wait_parked(&rt, 1);
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(ms(100));
            go_tx.send(()).unwrap();
        });
        let t0 = Instant::now();
        drop(rt);
        releaser.join().unwrap();
        assert_eq!(init.join().unwrap(), 7);
        let _ = h.join();
        assert!(t0.elapsed() < ms(1900), "ended early once the value came");
        assert_eq!(got.load(Ordering::SeqCst), 7);
    })
}

/// crossbeam: `after` delivers one message; once it is taken the channel is
/// empty for good, so `Select::ready_timeout` times out and `len` is 0.
#[test]
fn a_consumed_after_channel_is_never_ready_again() {
    within(20, || {
        let body = || {
            let a = after(ms(5));
            let mut sel = Select::new();
            sel.recv(&a);
            assert_eq!(sel.ready(), 0);
            a.recv().unwrap();
            let mut sel = Select::new();
            sel.recv(&a);
            assert!(
                sel.ready_timeout(ms(50)).is_err(),
                "a consumed after is never ready again"
            );
            assert_eq!(a.len(), 0);
            assert!(a.is_empty());
            assert!(a.try_recv().is_err());
        };
        body();
        rt2().block_on(body);
    })
}

/// `default(Duration::MAX)` beside a `tick` and a `never` arm: the select
/// waits (no overflow, no early default) and takes each tick.
#[test]
fn a_select_of_tick_never_and_default_max_takes_every_tick() {
    within(20, || {
        let body = || {
            let t = tick(ms(5));
            let n = never::<u8>();
            for _ in 0..3 {
                let got = fiber::select! {
                    recv(n) -> _ => 0,
                    recv(t) -> m => { assert!(m.is_ok()); 1 },
                    default(Duration::MAX) => 2,
                };
                assert_eq!(got, 1);
            }
        };
        body();
        rt2().block_on(body);
    })
}

/// `add_permits` past `MAX_PERMITS` panics and leaves the count as it was;
/// the largest `try_acquire_many` still works.
#[test]
fn a_refused_semaphore_overflow_keeps_the_count() {
    let sem = Semaphore::new(Semaphore::MAX_PERMITS);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sem.add_permits(1)));
    assert!(r.is_err());
    assert_eq!(sem.available_permits(), Semaphore::MAX_PERMITS);
    let p = sem.try_acquire_many(u32::MAX).unwrap();
    drop(p);
    assert_eq!(sem.available_permits(), Semaphore::MAX_PERMITS);
}

/// crossbeam's `WaitGroup`: `wait` returns once every clone is dropped, with
/// members and waiters both fibers and plain threads.
#[test]
fn a_wait_group_shared_by_fibers_and_threads_waits_for_every_member() {
    within(20, || {
        let rt = rt2();
        let wg = WaitGroup::new();
        let n = Arc::new(AtomicUsize::new(0));
        for _ in 0..10 {
            let (wg1, n1) = (wg.clone(), n.clone());
            rt.spawn(move || {
                fiber::sleep(ms(5)).unwrap();
                n1.fetch_add(1, Ordering::SeqCst);
                drop(wg1);
            });
            let (wg, n) = (wg.clone(), n.clone());
            std::thread::spawn(move || {
                std::thread::sleep(ms(5));
                n.fetch_add(1, Ordering::SeqCst);
                drop(wg);
            });
        }
        let w2 = wg.clone();
        let h = rt.spawn(move || w2.wait());
        wg.wait();
        assert_eq!(n.load(Ordering::SeqCst), 20);
        h.join().unwrap();
    })
}

/// std: a writer that panicked poisons the lock; `try_read` and `try_write`
/// then return `TryLockError::Poisoned`; `clear_poison` clears it.
#[test]
fn rwlock_try_read_and_try_write_report_poison_like_std() {
    within(20, || {
        let rt = rt2();
        let l = Arc::new(RwLock::new(1));
        let l2 = l.clone();
        let r = rt.spawn(move || {
            let _g = l2.write().unwrap();
            panic!("boom");
        });
        assert!(r.join().is_err());
        assert!(l.is_poisoned());
        assert!(matches!(l.try_read(), Err(std::sync::TryLockError::Poisoned(_))));
        assert!(matches!(l.try_write(), Err(std::sync::TryLockError::Poisoned(_))));
        l.clear_poison();
        assert!(l.try_read().is_ok());
    })
}

/// A plain thread in `wait_timeout_while(Duration::MAX)` is ended by a
/// fiber's change and `notify_all`, and reports no timeout (std).
#[test]
fn a_plain_threads_wait_timeout_while_max_is_ended_by_a_fibers_notify() {
    within(20, || {
        let rt = rt2();
        let pair = Arc::new((Mutex::new(false), Condvar::new()));
        let p = pair.clone();
        let h = std::thread::spawn(move || {
            let (m, cv) = &*p;
            let g = m.lock().unwrap();
            let (g, r) = cv.wait_timeout_while(g, Duration::MAX, |ready| !*ready).unwrap();
            assert!(*g);
            r.timed_out()
        });
        let p = pair.clone();
        rt.block_on(move || {
            fiber::sleep(ms(20)).unwrap();
            *p.0.lock().unwrap() = true;
            p.1.notify_all();
        });
        assert!(!h.join().unwrap());
    })
}

/// In a cancelled fiber, operations that need no wait complete: a select
/// with a ready arm, an accept of a pending connection, a read of buffered
/// bytes, a `park` with a stored token.
#[test]
fn a_cancelled_fiber_completes_operations_that_need_no_wait() {
    within(20, || {
        let rt = rt2();
        let out = rt.block_on(|| {
            use std::io::{Read, Write};
            let (tx, rx) = fiber::chan::bounded(1);
            tx.send(5).unwrap();
            let l = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let mut c = fiber::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
            c.write_all(b"hi").unwrap();
            let c2 = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
            fiber::sleep(ms(20)).unwrap();
            fiber::Job::current().cancel();
            let sel = fiber::select! { recv(rx) -> v => v.ok(), default(ms(10)) => None };
            let (mut s, _) = match l.accept() {
                Ok(x) => x,
                Err(e) => return format!("accept {e:?}"),
            };
            let mut buf = [0u8; 2];
            let rd = s.read(&mut buf).map_err(|e| e.kind());
            let acc2 = l.accept().map(|_| ()).map_err(|e| e.kind());
            drop(c2);
            fiber::current().unpark();
            let t0 = Instant::now();
            fiber::park();
            format!("{sel:?} {rd:?} {acc2:?} {:?}", t0.elapsed() < ms(5))
        });
        assert_eq!(out, "Some(5) Ok(2) Ok(()) true");
    })
}

/// A fiber parked in a select over a channel, a 1 h tick and `after(MAX)`
/// returns when shutdown cancels it; its value's destructor panics outside
/// any unwind (an ordinary panic, spec/reliability.md), runs once, and the
/// process does not abort (child process).
#[test]
fn shutdown_of_a_select_loop_whose_value_panics_in_drop_runs_it_once() {
    crate::common::in_child(
        "shutdown_of_a_select_loop_whose_value_panics_in_drop_runs_it_once",
        20,
        || {
            struct Bomb(Arc<AtomicUsize>);
            impl Drop for Bomb {
                fn drop(&mut self) {
                    self.0.fetch_add(1, Ordering::SeqCst);
                    panic!("bomb");
                }
            }
            let rt = rt_fixed_grace(2, ms(300));
            let drops = Arc::new(AtomicUsize::new(0));
            let (_tx, rx) = fiber::chan::bounded::<u8>(0);
            let d = drops.clone();
            let h = rt.spawn(move || {
                let _bomb = Bomb(d);
                let t = tick(Duration::from_secs(3600));
                loop {
                    fiber::select! {
                        recv(rx) -> m => if m.is_err() { break },
                        recv(t) -> _ => {},
                        recv(after(Duration::MAX)) -> _ => {},
                    }
                    if fiber::is_cancelled() {
                        break;
                    }
                }
            });
            wait_parked(&rt, 1);
            drop(rt);
            assert_eq!(drops.load(Ordering::SeqCst), 1);
            let e = h.join().unwrap_err();
            assert!(e.is_panic() || e.is_cancelled(), "{e:?}");
        },
    );
}

/// std: the condition of `wait_timeout_while` runs with the lock held, so a
/// panic there poisons the mutex; a later wait reports the poison with the
/// guard and the timeout.
#[test]
fn a_panicking_wait_timeout_while_condition_poisons_the_mutex_like_std() {
    within(20, || {
        let rt = rt2();
        let pair = Arc::new((Mutex::new(0), Condvar::new()));
        let p = pair.clone();
        let r = rt.spawn(move || {
            let g = p.0.lock().unwrap();
            let _ = p.1.wait_timeout_while(g, ms(5), |v| {
                if *v == 0 {
                    *v = 1;
                    true
                } else {
                    panic!("cond")
                }
            });
        });
        assert!(r.join().is_err());
        assert!(pair.0.is_poisoned());
        let p = pair.clone();
        let r2 = std::thread::spawn(move || {
            let g = p.0.lock().unwrap_or_else(|e| e.into_inner());
            let (g, t) = p.1.wait_timeout_while(g, ms(5), |_| true).unwrap_err().into_inner();
            (*g, t.timed_out())
        })
        .join()
        .unwrap();
        assert_eq!(r2, (1, true));
    })
}

/// The completing arrival at a barrier needs no wait: the `n`-th caller
/// releases the generation and leads (std). In a cancelled fiber fiber's
/// other operations that need no wait complete (a send with room, a
/// buffered receive, a free semaphore permit: spec/sync.md 2, "a permit
/// that is free when the call looks is taken without a wait, cancelled or
/// not", as Go's `Acquire` and Kotlin's suspending functions, which do not
/// check for cancellation when they do not suspend). `Barrier::wait`
/// refuses the arrival instead: the generation is not released, the party
/// parked at the barrier stays parked, and `Barrier::new(1).wait()` (which
/// never blocks in std) reports no leader.
// Failed before the fix: a cancelled fiber's completing Barrier::wait is refused, so the parties already parked there are never released
#[test]
fn a_cancelled_fibers_completing_barrier_arrival_releases_the_generation() {
    within(20, || {
        let rt = rt2();
        let b = Arc::new(Barrier::new(2));
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let b2 = b.clone();
        let _parked = rt.spawn(move || {
            let r = b2.wait();
            let _ = done_tx.send(r.is_leader());
        });
        wait_parked(&rt, 1);
        let b3 = b.clone();
        let (others, mine, solo) = rt.block_on(move || {
            let (tx, rx) = fiber::chan::bounded(1);
            let sem = Semaphore::new(1);
            fiber::Job::current().cancel();
            // The rule the barrier should follow: no wait needed, done.
            let others = (tx.send(1).is_ok(), rx.recv().is_ok(), sem.acquire().is_ok());
            let r = b3.wait();
            let solo = Barrier::new(1).wait();
            (
                others,
                (r.is_leader(), r.is_cancelled()),
                (solo.is_leader(), solo.is_cancelled()),
            )
        });
        assert_eq!(others, (true, true, true));
        assert_eq!(
            mine,
            (true, false),
            "the second arrival completes the generation and leads"
        );
        assert_eq!(solo, (true, false), "Barrier::new(1).wait() never blocks: it leads");
        assert_eq!(b.generation(), 1);
        assert_eq!(
            done_rx.recv_timeout(Duration::from_secs(2)),
            Ok(false),
            "the party parked at the barrier is released"
        );
    })
}
