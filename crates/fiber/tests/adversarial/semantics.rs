//! Adversarial: documented behaviour of the peers the API copies, checked
//! on fibers (and plain threads where both apply): crossbeam-channel / Go
//! channels, std::sync (Mutex, RwLock, Condvar, Barrier, OnceLock),
//! std::thread (join, scope, panics), std::net, and Kotlin jobs
//! (structured cancellation, supervisor, timeouts).

use fiber::chan::{self, RecvError, TryRecvError, TrySendError};
use fiber::sync::{Barrier, Condvar, Mutex, OnceLock, RwLock};
use std::collections::HashSet;
use std::io::{self, Read, Write};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{ms, on_runtime, rt, within};

// ---- channels: crossbeam-channel and Go ----

#[test]
fn rendezvous_try_send_is_full_without_a_waiting_receiver() {
    on_runtime(|| {
        let (tx, rx) = chan::bounded::<u8>(0);
        assert_eq!(tx.try_send(1), Err(TrySendError::Full(1)));
        assert_eq!(tx.capacity(), Some(0));
        let r = fiber::spawn(move || rx.recv());
        // Once the receiver is parked, try_send hands over directly.
        let start = Instant::now();
        loop {
            match tx.try_send(2) {
                Ok(()) => break,
                Err(TrySendError::Full(_)) => fiber::sleep(ms(1)).unwrap(),
                Err(e) => panic!("{e:?}"),
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the parked receiver never took it"
            );
        }
        assert_eq!(r.join().unwrap(), Ok(2));
    })
}

#[test]
fn disconnection_returns_values_and_drains_buffers() {
    on_runtime(|| {
        let (tx, rx) = chan::bounded::<String>(4);
        tx.send("a".into()).unwrap();
        tx.send("b".into()).unwrap();
        drop(tx);
        // crossbeam: buffered messages are received before Disconnected.
        assert_eq!(rx.recv().as_deref(), Ok("a"));
        assert_eq!(rx.try_recv().as_deref(), Ok("b"));
        assert_eq!(rx.recv(), Err(RecvError));
        assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));
        let (tx, rx) = chan::unbounded::<String>();
        drop(rx);
        assert_eq!(tx.send("lost?".into()).unwrap_err().into_inner(), "lost?");
        assert_eq!(tx.try_send("x".into()), Err(TrySendError::Disconnected("x".into())));
    })
}

#[test]
fn close_is_go_close_recv_drains_then_fails_and_close_twice_is_false() {
    on_runtime(|| {
        let (tx, rx) = chan::bounded::<u8>(2);
        tx.send(1).unwrap();
        assert!(tx.close(), "the first close closes");
        assert!(
            !tx.close() && !rx.close(),
            "a second close reports it was already closed"
        );
        assert!(tx.is_closed() && rx.is_closed());
        assert!(
            tx.send(2).is_err(),
            "Go: send on a closed channel fails (here: returns the value)"
        );
        assert_eq!(rx.recv(), Ok(1), "Go: buffered values are received after close");
        assert_eq!(rx.recv(), Err(RecvError));
        // A parked receiver is woken by close.
        let (tx, rx) = chan::bounded::<u8>(0);
        let r = fiber::spawn(move || rx.recv());
        fiber::sleep(ms(5)).unwrap();
        tx.close();
        assert_eq!(r.join().unwrap(), Err(RecvError));
    })
}

#[test]
fn mpmc_between_fibers_and_threads_loses_and_duplicates_nothing() {
    within(60, || {
        let rt = rt();
        for cap in [None, Some(0), Some(1), Some(16)] {
            let (tx, rx) = match cap {
                None => chan::unbounded::<u32>(),
                Some(n) => chan::bounded::<u32>(n),
            };
            let (out_tx, out_rx) = chan::unbounded::<u32>();
            let mut threads = Vec::new();
            let mut fibers = Vec::new();
            for p in 0..4u32 {
                let tx = tx.clone();
                let send = move || {
                    for i in 0..500 {
                        tx.send(p * 1000 + i).unwrap();
                    }
                };
                if p % 2 == 0 {
                    threads.push(std::thread::spawn(send));
                } else {
                    fibers.push(rt.spawn(send));
                }
            }
            for c in 0..4 {
                let (rx, out) = (rx.clone(), out_tx.clone());
                let recv = move || {
                    // Per-producer FIFO as seen by one consumer.
                    let mut last = [None::<u32>; 4];
                    for v in rx.iter() {
                        let p = (v / 1000) as usize;
                        assert!(last[p].is_none_or(|l| l < v), "producer {p} reordered");
                        last[p] = Some(v);
                        out.send(v).unwrap();
                    }
                };
                if c % 2 == 0 {
                    threads.push(std::thread::spawn(recv));
                } else {
                    fibers.push(rt.spawn(recv));
                }
            }
            drop((tx, rx, out_tx));
            for t in threads {
                t.join().unwrap();
            }
            for f in fibers {
                f.join().unwrap();
            }
            let got: Vec<u32> = out_rx.iter().collect();
            let unique: HashSet<u32> = got.iter().copied().collect();
            assert_eq!(got.len(), 2000, "{cap:?}: every value once");
            assert_eq!(unique.len(), 2000, "{cap:?}: no duplicates");
        }
    })
}

// ---- std::sync ----

#[test]
fn mutex_is_poisoned_by_a_panicking_fiber_and_recovers_like_std() {
    on_runtime(|| {
        let m = Arc::new(Mutex::new(1));
        let m2 = m.clone();
        let h = fiber::spawn(move || {
            let mut g = m2.lock().unwrap();
            *g = 2;
            fiber::yield_now().unwrap(); // held across a park
            panic!("poison");
        });
        assert!(h.join().unwrap_err().is_panic());
        assert!(m.is_poisoned());
        let err = m.lock().unwrap_err();
        assert_eq!(*err.into_inner(), 2, "the data is reachable through the PoisonError");
        assert!(matches!(m.try_lock(), Err(std::sync::TryLockError::Poisoned(_))));
        m.clear_poison();
        assert_eq!(*m.lock().unwrap(), 2);
        let m = Arc::try_unwrap(m).unwrap_or_else(|_| panic!("one owner"));
        assert_eq!(m.into_inner().unwrap(), 2);
    })
}

#[test]
fn rwlock_readers_share_writers_exclude_and_a_writer_panic_poisons() {
    on_runtime(|| {
        let lock = Arc::new(RwLock::new(0u32));
        // Two readers hold the lock at the same time (each waits for the
        // other while holding it).
        let barrier = Arc::new(Barrier::new(2));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (lock, barrier) = (lock.clone(), barrier.clone());
                fiber::spawn(move || {
                    let g = lock.read().unwrap();
                    barrier.wait();
                    *g
                })
            })
            .collect();
        for r in readers {
            assert_eq!(r.join().unwrap(), 0);
        }
        let writers: Vec<_> = (0..8)
            .map(|_| {
                let lock = lock.clone();
                fiber::spawn(move || {
                    for _ in 0..50 {
                        let mut g = lock.write().unwrap();
                        let v = *g;
                        fiber::yield_now().unwrap();
                        *g = v + 1;
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        assert_eq!(*lock.read().unwrap(), 400, "no lost update under write locks");
        let l2 = lock.clone();
        let _ = fiber::spawn(move || {
            let _g = l2.write().unwrap();
            panic!("poison the rwlock");
        })
        .join();
        assert!(lock.is_poisoned());
        assert!(lock.read().is_err() && lock.write().is_err());
    })
}

#[test]
fn condvar_wait_timeout_is_not_early_and_notify_all_wakes_every_waiter() {
    on_runtime(|| {
        let pair = Arc::new((Mutex::new(0u32), Condvar::new()));
        let (m, cv) = &*pair;
        let start = Instant::now();
        let (_g, res) = cv.wait_timeout(m.lock().unwrap(), ms(15)).unwrap();
        // std: spurious wakeups are allowed, but a timed-out result means
        // the time has passed.
        if res.timed_out() {
            assert!(start.elapsed() >= ms(15), "timed out early: {:?}", start.elapsed());
        }
        drop(_g);
        let woken = Arc::new(AtomicUsize::new(0));
        let waiters: Vec<_> = (0..6)
            .map(|_| {
                let (pair, woken) = (pair.clone(), woken.clone());
                fiber::spawn(move || {
                    let (m, cv) = &*pair;
                    let g = cv.wait_while(m.lock().unwrap(), |gen| *gen == 0).unwrap();
                    woken.fetch_add(1, Ordering::SeqCst);
                    drop(g);
                })
            })
            .collect();
        fiber::sleep(ms(10)).unwrap();
        *m.lock().unwrap() = 1;
        cv.notify_all();
        for w in waiters {
            w.join().unwrap();
        }
        assert_eq!(woken.load(Ordering::SeqCst), 6);
    })
}

#[test]
fn barrier_has_one_leader_per_generation_with_fibers_and_threads() {
    within(30, || {
        let rt = rt();
        let barrier = Arc::new(Barrier::new(4));
        let leaders = Arc::new(AtomicUsize::new(0));
        let mut threads = Vec::new();
        let mut fibers = Vec::new();
        for i in 0..4 {
            let (b, l) = (barrier.clone(), leaders.clone());
            let body = move || {
                for _ in 0..5 {
                    if b.wait().is_leader() {
                        l.fetch_add(1, Ordering::SeqCst);
                    }
                }
            };
            if i < 2 {
                threads.push(std::thread::spawn(body));
            } else {
                fibers.push(rt.spawn(body));
            }
        }
        threads.into_iter().for_each(|t| t.join().unwrap());
        fibers.into_iter().for_each(|f| f.join().unwrap());
        assert_eq!(
            leaders.load(Ordering::SeqCst),
            5,
            "std: exactly one leader per generation"
        );
    })
}

#[test]
fn once_lock_initialises_once_and_a_panicking_init_leaves_it_empty() {
    on_runtime(|| {
        let cell = Arc::new(OnceLock::<u32>::new());
        let calls = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let (cell, calls) = (cell.clone(), calls.clone());
                fiber::spawn(move || {
                    *cell.get_or_init(|| {
                        calls.fetch_add(1, Ordering::SeqCst);
                        fiber::sleep(ms(5)).unwrap(); // park inside init
                        i
                    })
                })
            })
            .collect();
        let values: HashSet<u32> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(values.len(), 1, "everyone sees the one value");
        assert_eq!(calls.load(Ordering::SeqCst), 1, "init ran once");
        let cell = Arc::new(OnceLock::<u32>::new());
        let c2 = cell.clone();
        let r = fiber::spawn(move || *c2.get_or_init(|| panic!("init fails"))).join();
        assert!(r.unwrap_err().is_panic());
        assert_eq!(cell.get(), None, "std: a panicking init leaves the cell uninitialised");
        assert_eq!(*cell.get_or_init(|| 9), 9, "and a later init runs");
        assert_eq!(cell.set(10), Err(10));
    })
}

// ---- std::thread ----

#[test]
fn scope_joins_every_child_then_reraises_an_unjoined_childs_panic() {
    on_runtime(|| {
        /// Counts the sibling's end, whether it ran (and was cancelled in
        /// its sleep) or was cancelled before it started (its closure,
        /// and this guard with it, dropped unrun): both happen before the
        /// scope may return.
        struct Ended<'a>(&'a AtomicUsize);
        impl Drop for Ended<'_> {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let finished = AtomicUsize::new(0);
        let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
            fiber::scope(|s| {
                s.spawn(|| panic!("child failed"));
                let ended = Ended(&finished);
                s.spawn(move || {
                    let _ended = ended;
                    // A sibling that waits: cancelled (documented), and the
                    // scope still waits for it to end.
                    let _ = fiber::sleep(Duration::from_secs(30));
                });
            })
        }));
        assert!(
            r.is_err(),
            "std::thread::scope: a child's panic is re-raised by the scope"
        );
        assert_eq!(
            finished.load(Ordering::SeqCst),
            1,
            "the scope returned only after every child ended"
        );
    })
}

#[test]
fn a_joined_panic_does_not_fail_the_std_style_join_and_carries_its_payload() {
    on_runtime(|| {
        let h = fiber::Builder::new()
            .name("worker-7")
            .spawn(|| -> u32 { std::panic::panic_any(42u64) })
            .unwrap();
        let err = h.join().unwrap_err();
        assert!(err.is_panic() && !err.is_cancelled());
        assert_eq!(err.name(), Some("worker-7"));
        assert_eq!(*err.into_panic().downcast::<u64>().unwrap(), 42);
    })
}

// ---- Kotlin jobs ----

#[test]
fn cancelling_a_scope_cancels_grandchildren_and_waits_for_them() {
    // Kotlin: cancellation of a parent cancels its whole subtree, and the
    // parent completes only after its children did.
    on_runtime(|| {
        let done = Arc::new(AtomicUsize::new(0));
        let d = done.clone();
        fiber::scope(|s| {
            let job = s.job();
            s.spawn(move || {
                fiber::scope(|inner| {
                    for _ in 0..3 {
                        let d = d.clone();
                        inner.spawn(move || {
                            assert!(fiber::sleep(Duration::from_secs(30)).is_err(), "grandchild cancelled");
                            d.fetch_add(1, Ordering::SeqCst);
                        });
                    }
                })
            });
            fiber::sleep(ms(10)).unwrap();
            job.cancel();
            assert!(job.is_cancelled());
        });
        assert_eq!(done.load(Ordering::SeqCst), 3);
    })
}

#[test]
fn a_child_spawned_into_a_cancelled_scope_starts_cancelled() {
    // Kotlin: launching in a cancelled scope gives a cancelled child.
    on_runtime(|| {
        let ran = AtomicUsize::new(0);
        fiber::scope(|s| {
            s.job().cancel();
            let h = s.spawn(|| {
                ran.fetch_add(1, Ordering::SeqCst);
                fiber::check_cancelled().is_err()
            });
            match h.join() {
                Ok(saw_cancel) => assert!(saw_cancel, "a child that runs sees the cancellation"),
                Err(e) => assert!(e.is_cancelled(), "{e:?}"),
            }
        });
    })
}

#[test]
fn try_scope_first_error_cancels_siblings_supervisor_does_not() {
    on_runtime(|| {
        let r: Result<(), &str> = fiber::try_scope(|s| {
            s.spawn(|| Err::<(), _>("first"));
            s.spawn(|| {
                fiber::sleep(Duration::from_secs(30)).map_err(|_| "sibling saw the cancel")?;
                Ok(())
            });
            Ok(())
        });
        assert_eq!(r, Err("first"), "the first error wins, not the cancelled sibling's");
        let sibling_finished = AtomicUsize::new(0);
        fiber::supervisor_scope(|s| {
            let bad = s.spawn(|| panic!("supervised failure"));
            let good = s.spawn(|| {
                fiber::sleep(ms(20)).expect("a supervisor does not cancel siblings");
                sibling_finished.fetch_add(1, Ordering::SeqCst);
            });
            assert!(bad.join().unwrap_err().is_panic());
            good.join().unwrap();
        });
        assert_eq!(sibling_finished.load(Ordering::SeqCst), 1);
    })
}

#[test]
fn job_states_follow_kotlin_active_cancelling_cancelled() {
    on_runtime(|| {
        let (tx, rx) = chan::bounded::<fiber::Job>(1);
        let h = fiber::spawn(move || {
            tx.send(fiber::Job::current()).unwrap();
            let _ = fiber::sleep(Duration::from_secs(30));
        });
        let job = rx.recv().unwrap();
        assert!(job.is_active() && !job.is_cancelled() && !job.is_completed());
        assert_eq!(job.cancel_and_join(), Ok(fiber::JobState::Cancelled));
        assert!(job.is_cancelled() && job.is_completed() && !job.is_active());
        assert_eq!(job.cancel_reason(), Some(fiber::CancelReason::Cancelled));
        job.cancel(); // idempotent
        assert_eq!(job.state(), fiber::JobState::Cancelled);
        assert!(h.join().unwrap_err().is_cancelled());
    })
}

#[test]
fn with_timeout_is_a_timeout_not_a_cancellation_of_the_caller() {
    // Kotlin: withTimeout's TimeoutCancellationException cancels the block,
    // not the coroutine that called it.
    on_runtime(|| {
        let r = fiber::with_timeout(ms(10), || fiber::sleep(Duration::from_secs(30)));
        assert_eq!(r, Err(fiber::TimedOut));
        assert!(!fiber::is_cancelled(), "the caller goes on");
        assert_eq!(fiber::sleep(ms(1)), Ok(()));
        // The timeout also cancels the block's scoped children.
        let r = fiber::with_timeout(ms(10), || {
            fiber::scope(|s| {
                let child = s.spawn(|| fiber::sleep(Duration::from_secs(30)));
                // Cancelled before it ended: its join says so.
                assert!(child.join().unwrap_err().is_cancelled());
            })
        });
        assert!(r.is_err());
    })
}

// ---- std::net ----

#[test]
fn tcp_behaves_like_std_net_eof_refused_and_cancel() {
    on_runtime(|| {
        let listener = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = fiber::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut got = Vec::new();
            s.read_to_end(&mut got).unwrap(); // until the client shuts down writing
            s.write_all(&got).unwrap();
            drop(s); // EOF for the client
                     // Then wait in accept: cancelled below.
            let err = listener.accept().unwrap_err();
            (got, err.kind())
        });
        let mut c = fiber::net::TcpStream::connect(addr).unwrap();
        c.write_all(b"ping").unwrap();
        c.shutdown(std::net::Shutdown::Write).unwrap();
        let mut back = Vec::new();
        c.read_to_end(&mut back).unwrap();
        assert_eq!(back, b"ping");
        assert_eq!(c.read(&mut [0u8; 4]).unwrap(), 0, "std: EOF reads return 0 again");
        fiber::sleep(ms(10)).unwrap();
        server.cancel();
        match server.join() {
            Ok((got, kind)) => {
                assert_eq!(got, b"ping");
                assert_eq!(kind, io::ErrorKind::Other, "a cancelled socket call is an Other error");
            }
            Err(e) => assert!(e.is_cancelled()),
        }
        // Connecting to a port nobody listens on: refused, like std.
        let free = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let err = fiber::net::TcpStream::connect(free).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused);
    })
}

#[test]
fn failed_jobs_end_failed_and_joining_them_returns_normally() {
    // Kotlin: a job whose child failed ends in the failed (cancelled with a
    // cause) state; join() on it returns normally, it does not rethrow.
    on_runtime(|| {
        let (tx, rx) = chan::unbounded::<fiber::Job>();
        let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
            fiber::scope(|s| {
                tx.send(s.job()).unwrap();
                s.spawn(|| panic!("child failure"));
            })
        }));
        assert!(r.is_err());
        let scope_job = rx.recv().unwrap();
        assert_eq!(scope_job.join(), Ok(fiber::JobState::Failed));
        assert!(scope_job.is_cancelled(), "Kotlin: a failed job reports isCancelled");
        assert_eq!(scope_job.cancel_reason(), Some(fiber::CancelReason::ChildFailed));
        // In a supervisor scope the child's own job fails, the scope's does not.
        fiber::supervisor_scope(|s| {
            let t = tx.clone();
            let h = s.spawn(move || {
                t.send(fiber::Job::current()).unwrap();
                panic!("supervised");
            });
            assert!(h.join().is_err());
            let child_job = rx.recv().unwrap();
            assert_eq!(child_job.join(), Ok(fiber::JobState::Failed));
            assert!(s.job().is_active(), "the supervisor is untouched");
        });
    })
}
