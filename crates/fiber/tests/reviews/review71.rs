//! Review 71: combinations of features, two or three at once (every
//! feature alone has had seventy rounds). A `select!` whose only arms are
//! timers, or whose `default(d)` is `Duration::MAX`, inside a scope that is
//! cancelled or a `with_timeout` that fires; `Duration::MAX` given to every
//! timed API and then cancelled (by the scope, by the runtime's shutdown);
//! a supervisor scope whose children wait on `fiber::sync` locks, a
//! condvar, a semaphore and `fiber::net` sockets when it is cancelled
//! (locks released, permits kept, sockets closed); channels shared by a
//! plain thread and the fibers of two runtimes, one of them dropped in
//! the middle of the exchange (every value delivered once or given back,
//! counted by drop counters); `JoinHandle::cancel` racing a join from a
//! fiber, a plain thread and the runtime's drop; completion handlers that
//! send on channels and take locks at shutdown; fibers that spin without a
//! yield point beside timers, sockets and a deadline. Found: a scope owner
//! whose children are given up inside `fiber::blocking` at shutdown is
//! abandoned for good (its destructors never run; a `Handle::block_on`
//! root hangs); a `fiber::sync::Mutex::lock` in code run after a fiber's
//! body at teardown (a completion handler, a fiber-local destructor)
//! returns without the lock; a scoped child dropped unrun at shutdown
//! ends its job COMPLETED.

use crate::common::*;

use fiber::chan::{after, bounded, never, tick, unbounded, Select};
use fiber::sync::{Barrier, Condvar, Mutex, Semaphore};
use std::collections::HashSet;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A value that counts its drops (and panics if dropped twice).
struct Token {
    id: usize,
    dropped: Arc<AtomicUsize>,
    alive: bool,
}

impl Token {
    fn new(id: usize, dropped: &Arc<AtomicUsize>) -> Token {
        Token {
            id,
            dropped: dropped.clone(),
            alive: true,
        }
    }
}

impl Drop for Token {
    fn drop(&mut self) {
        assert!(self.alive, "token {} dropped twice", self.id);
        self.alive = false;
        self.dropped.fetch_add(1, SeqCst);
    }
}

/// In a fiber: spawn `f` as a child of a scope, wait until it is parked,
/// cancel the scope, and return what the child returned (with how long the
/// cancellation took to end it).
fn cancel_parked_child<T: Send>(f: impl FnOnce() -> T + Send) -> (Result<T, fiber::JoinError>, Duration) {
    fiber::scope(|s| {
        let h = s.spawn(f);
        wait_fiber_parked(h.id());
        let t = Instant::now();
        s.cancel();
        let r = h.join();
        (r, t.elapsed())
    })
}

// ---------------------------------------------------------------------------
// 1. select! with timer arms, cancelled or timed out while parked.

#[test]
fn a_select_of_only_timer_arms_in_a_with_timeout_ends_at_the_deadline_with_its_first_arm_failed() {
    on_runtime(|| {
        let first_arm = Arc::new(AtomicUsize::new(0));
        let f = first_arm.clone();
        let t = Instant::now();
        let r = fiber::with_timeout(ms(50), move || {
            fiber::select! {
                recv(after(Duration::from_secs(3600))) -> r => { assert!(r.is_err(), "a cancelled select's first arm fails"); f.store(1, SeqCst) }
                recv(never::<u8>()) -> _ => f.store(2, SeqCst),
            }
        });
        assert!(r.is_err(), "with_timeout reports the timeout");
        assert!(t.elapsed() < Duration::from_secs(3), "took {:?}", t.elapsed());
        assert_eq!(first_arm.load(SeqCst), 1, "the first channel arm ran, failed");
    });
}

#[test]
fn a_select_with_default_duration_max_in_a_cancelled_scope_takes_default_at_once() {
    on_runtime(|| {
        let (_tx, rx) = bounded::<u32>(0);
        let (r, took) = cancel_parked_child(move || {
            fiber::select! {
                recv(rx) -> _ => "recv",
                default(Duration::MAX) => "default",
            }
        });
        assert!(took < Duration::from_secs(3), "took {took:?}");
        // Cancelled before it returned: the join reports the cancellation.
        assert!(r.unwrap_err().is_cancelled());
    });
}

#[test]
fn a_select_loop_on_a_tick_inside_with_timeout_counts_its_ticks_and_ends() {
    on_runtime(|| {
        let count = Arc::new(AtomicUsize::new(0));
        let c = count.clone();
        let (_tx, rx) = bounded::<u32>(0);
        let t = Instant::now();
        let r = fiber::with_timeout(ms(120), move || {
            let ticker = tick(ms(10));
            loop {
                fiber::select! {
                    recv(rx) -> _ => return,
                    recv(ticker) -> m => {
                        if m.is_err() {
                            return;
                        }
                        c.fetch_add(1, SeqCst);
                    }
                }
                if fiber::is_cancelled() {
                    return;
                }
            }
        });
        assert!(r.is_err());
        assert!(t.elapsed() < Duration::from_secs(3), "took {:?}", t.elapsed());
        let n = count.load(SeqCst);
        assert!((3..=13).contains(&n), "{n} ticks of 10 ms in 120 ms");
    });
}

#[test]
fn a_select_timeout_max_and_ready_timeout_max_end_on_cancel() {
    on_runtime(|| {
        let (_tx, rx) = bounded::<u32>(0);
        let rx2 = rx.clone();
        let (r, took) = cancel_parked_child(move || {
            let mut sel = Select::new();
            sel.recv(&rx);
            let r = sel.select_timeout(Duration::MAX).is_err();
            r
        });
        assert!(took < Duration::from_secs(3), "select_timeout(MAX): {took:?}");
        assert!(r.unwrap_err().is_cancelled());
        let (r, took) = cancel_parked_child(move || {
            let mut sel = Select::new();
            sel.recv(&rx2);
            sel.ready_timeout(Duration::MAX).is_err()
        });
        assert!(took < Duration::from_secs(3), "ready_timeout(MAX): {took:?}");
        assert!(r.unwrap_err().is_cancelled());
    });
}

#[test]
fn a_select_parked_at_shutdown_with_a_value_whose_drop_counts_loses_nothing() {
    // A fiber parks in a select with a send arm (value made only when
    // chosen) and a timer arm; the runtime is dropped. Every value made is
    // dropped exactly once, and the plain thread that receives later sees
    // at most what was made.
    within(30, || {
        for _ in 0..20 {
            let dropped = Arc::new(AtomicUsize::new(0));
            let made = Arc::new(AtomicUsize::new(0));
            let (tx, rx) = bounded::<Token>(0);
            let rt = rt2();
            for i in 0..4 {
                let (tx, dropped, made) = (tx.clone(), dropped.clone(), made.clone());
                drop(rt.handle().spawn(move || loop {
                    fiber::select! {
                        send(tx, { made.fetch_add(1, SeqCst); Token::new(i, &dropped) }) -> r => if r.is_err() { return },
                        recv(after(Duration::from_secs(3600))) -> _ => return,
                    }
                }));
            }
            drop(tx);
            let received = std::thread::spawn(move || {
                let mut n = 0;
                for _ in 0..3 {
                    if rx.recv().is_ok() {
                        n += 1;
                    }
                }
                n
            })
            .join()
            .unwrap();
            drop(rt);
            assert_eq!(received, 3);
            assert_eq!(
                dropped.load(SeqCst),
                made.load(SeqCst),
                "every value made is dropped once"
            );
        }
    });
}

// ---------------------------------------------------------------------------
// 2. Duration::MAX given to every timed API, then cancelled.

#[test]
fn every_timed_wait_given_duration_max_ends_when_its_scope_is_cancelled() {
    on_runtime(|| {
        let check = |what: &str, r: Result<bool, fiber::JoinError>, took: Duration| {
            assert!(took < Duration::from_secs(3), "{what}: the cancel took {took:?}");
            match r {
                Err(e) => assert!(e.is_cancelled(), "{what}: {e:?}"),
                Ok(ok) => panic!("{what}: returned {ok} instead of being cancelled"),
            }
        };
        let (r, t) = cancel_parked_child(|| fiber::sleep(Duration::MAX).is_err());
        check("sleep", r, t);
        let (_tx, rx) = bounded::<u8>(0);
        let (r, t) = cancel_parked_child(|| rx.recv_timeout(Duration::MAX).is_err());
        check("recv_timeout", r, t);
        let (tx, _rx) = bounded::<u8>(0);
        let (r, t) = cancel_parked_child(|| tx.send_timeout(1, Duration::MAX).is_err());
        check("send_timeout", r, t);
        let (r, t) = cancel_parked_child(|| after(Duration::MAX).recv().is_err());
        check("after(MAX).recv", r, t);
        let (r, t) = cancel_parked_child(|| tick(Duration::MAX).recv().is_err());
        check("tick(MAX).recv", r, t);
        let (r, t) = cancel_parked_child(|| {
            fiber::park_timeout(Duration::MAX);
            true
        });
        check("park_timeout", r, t);
        let pair = (Mutex::new(false), Condvar::new());
        let (r, t) = cancel_parked_child(|| {
            let g = pair.0.lock().unwrap();
            let (_g, res) = pair.1.wait_timeout(g, Duration::MAX).unwrap();
            res.timed_out()
        });
        check("Condvar::wait_timeout", r, t);
        assert!(pair.0.try_lock().is_ok(), "the mutex is free again");
        let (r, t) = cancel_parked_child(|| {
            let g = pair.0.lock().unwrap();
            let (_g, res) = pair.1.wait_timeout_while(g, Duration::MAX, |ready| !*ready).unwrap();
            res.timed_out()
        });
        check("Condvar::wait_timeout_while", r, t);
        let (r, t) =
            cancel_parked_child(|| fiber::with_timeout(Duration::MAX, || fiber::sleep(Duration::MAX)).is_err());
        check("with_timeout(MAX, sleep(MAX))", r, t);
        let (_stx, srx) = fiber::sync::mpsc::channel::<u8>();
        let (r, t) = cancel_parked_child(|| srx.recv_timeout(Duration::MAX).is_err());
        check("mpsc::Receiver::recv_timeout", r, t);
    });
}

#[test]
fn with_timeout_duration_max_is_no_deadline_and_an_inner_max_keeps_the_outer_deadline() {
    on_runtime(|| {
        assert_eq!(
            fiber::with_timeout(Duration::MAX, || {
                fiber::sleep(ms(20)).unwrap();
                7
            }),
            Ok(7)
        );
        let t = Instant::now();
        let r = fiber::with_timeout(ms(50), || {
            fiber::with_timeout(Duration::MAX, || fiber::sleep(Duration::MAX))
        });
        assert!(r.is_err() || r.is_ok_and(|inner| inner.is_err()));
        assert!(t.elapsed() < Duration::from_secs(3), "took {:?}", t.elapsed());
        // `Job::new` under a MAX timeout is cancelled when its parent is.
        let job = fiber::Job::current();
        let (r, took) = cancel_parked_child(move || {
            fiber::with_timeout(Duration::MAX, || {
                let inner = fiber::Job::new(Some(&fiber::Job::current()));
                let h = inner.spawn(|| fiber::sleep(Duration::MAX));
                h.join().unwrap_err().is_cancelled()
            })
            .unwrap()
        });
        assert!(took < Duration::from_secs(3));
        assert!(r.unwrap_err().is_cancelled());
        assert!(job.is_active());
    });
}

#[test]
fn socket_reads_with_a_duration_max_timeout_end_when_cancelled() {
    on_runtime(|| {
        let listener = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let client = fiber::net::TcpStream::connect(addr).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        server.set_read_timeout(Some(Duration::MAX)).unwrap();
        let (r, took) = cancel_parked_child(move || {
            let mut buf = [0u8; 8];
            server.read(&mut buf)
        });
        assert!(took < Duration::from_secs(3), "took {took:?}");
        assert!(r.unwrap_err().is_cancelled());
        // The server stream was dropped with the child: the client reads EOF.
        let mut client = client;
        client.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(client.read(&mut buf).unwrap(), 0);

        let udp = fiber::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        udp.set_read_timeout(Some(Duration::MAX)).unwrap();
        let (r, took) = cancel_parked_child(move || {
            let mut buf = [0u8; 8];
            udp.recv_from(&mut buf).map(|(n, _)| n)
        });
        assert!(took < Duration::from_secs(3), "udp took {took:?}");
        assert!(r.unwrap_err().is_cancelled());
    });
}

#[test]
fn a_socket_read_with_a_duration_max_timeout_still_gets_its_data() {
    on_runtime(|| {
        let listener = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mut client = fiber::net::TcpStream::connect_timeout(&addr, Duration::MAX).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        server.set_read_timeout(Some(Duration::MAX)).unwrap();
        let reader = fiber::spawn(move || {
            let mut buf = [0u8; 4];
            server.read_exact(&mut buf).map(|_| buf)
        });
        fiber::sleep(ms(20)).unwrap();
        client.write_all(b"ping").unwrap();
        assert_eq!(&reader.join().unwrap().unwrap(), b"ping");
    });
}

#[test]
fn duration_max_waits_end_at_runtime_shutdown_within_the_grace_time() {
    within(30, || {
        let rt = rt_fixed_grace(2, Duration::from_secs(20));
        let ended = Arc::new(AtomicUsize::new(0));
        let (_tx, rx) = bounded::<u8>(0);
        let pair = Arc::new((Mutex::new(()), Condvar::new()));
        let sem = Arc::new(Semaphore::new(0));
        let mut n = 0;
        let mut go = |f: Box<dyn FnOnce() + Send>| {
            let ended = ended.clone();
            n += 1;
            drop(rt.handle().spawn(move || {
                f();
                ended.fetch_add(1, SeqCst);
            }));
        };
        go(Box::new(|| {
            let _ = fiber::sleep(Duration::MAX);
        }));
        let r = rx.clone();
        go(Box::new(move || {
            let _ = r.recv_timeout(Duration::MAX);
        }));
        let r = rx.clone();
        go(Box::new(move || {
            fiber::select! { recv(r) -> _ => {}, default(Duration::MAX) => {} }
        }));
        go(Box::new(|| fiber::park_timeout(Duration::MAX)));
        let p = pair.clone();
        go(Box::new(move || {
            let g = p.0.lock().unwrap();
            drop(p.1.wait_timeout(g, Duration::MAX));
        }));
        let s = sem.clone();
        go(Box::new(move || drop(s.acquire_many(3))));
        go(Box::new(|| {
            let _ = fiber::with_timeout(Duration::MAX, || fiber::sleep(Duration::MAX));
        }));
        wait_parked(&rt, n);
        let t = Instant::now();
        drop(rt);
        assert!(t.elapsed() < Duration::from_secs(5), "the drop took {:?}", t.elapsed());
        assert_eq!(ended.load(SeqCst), n, "every fiber returned from its wait");
        assert_eq!(sem.available_permits(), 0);
        assert!(pair.0.try_lock().is_ok());
    });
}

// ---------------------------------------------------------------------------
// 3. A supervisor scope of lock, condvar, semaphore and socket waiters,
// cancelled mid-wait.

#[test]
fn a_cancelled_supervisor_scope_releases_locks_keeps_permits_and_closes_sockets() {
    on_runtime(|| {
        let state = Mutex::new(0u32);
        let cv = Condvar::new();
        let rw = fiber::sync::RwLock::new(0u32);
        let sem = Semaphore::new(1);
        let listener = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mut client = fiber::net::TcpStream::connect(addr).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        let listener2 = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr2 = listener2.local_addr().unwrap();
        let permit = sem.acquire().unwrap();
        let results = fiber::supervisor_scope(|s| {
            let mut hs = Vec::new();
            // The holder: takes the write lock and waits on the condvar.
            hs.push(s.spawn(|| {
                let _w = rw.write().unwrap();
                let g = state.lock().unwrap();
                let g = cv.wait_while(g, |v| *v == 0).unwrap();
                *g
            }));
            hs.push(s.spawn(|| sem.acquire().map(|_p| 1).unwrap_or(0)));
            hs.push(s.spawn(move || {
                let mut buf = [0u8; 8];
                server.read(&mut buf).map(|n| n as u32).unwrap_or(99)
            }));
            hs.push(s.spawn(move || listener2.accept().map(|_| 1).unwrap_or(98)));
            for h in &hs {
                wait_fiber_parked(h.id());
            }
            // A reader queued behind the writer (not a cancellation point).
            let reader = s.spawn(|| *rw.read().unwrap());
            fiber::sleep(ms(20)).unwrap();
            s.cancel();
            let out: Vec<_> = hs.into_iter().map(|h| h.join()).collect();
            (out, reader.join())
        });
        let (out, reader) = results;
        for (i, r) in out.iter().enumerate() {
            assert!(r.as_ref().is_err_and(|e| e.is_cancelled()), "child {i}: {r:?}");
        }
        // The reader was queued on a lock, not cancellable: it got the lock
        // once the writer's cancelled child left, and its scope cancelled it.
        assert!(reader.as_ref().is_err_and(|e| e.is_cancelled()), "reader: {reader:?}");
        assert!(!state.is_poisoned() && state.try_lock().is_ok(), "the mutex is free");
        assert!(rw.try_write().is_ok(), "the rwlock is free");
        drop(permit);
        assert_eq!(sem.available_permits(), 1, "the cancelled acquire took nothing");
        client.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(client.read(&mut buf).unwrap(), 0, "the server side was closed");
        // The listener was closed with its child: a connect is refused.
        assert!(std::net::TcpStream::connect(addr2).is_err(), "listener2 still accepts");
    });
}

#[test]
fn semaphore_permits_are_conserved_when_a_release_races_the_cancel_of_the_waiter() {
    within(60, || {
        let rt = rt2();
        rt.block_on(|| {
            for round in 0..300 {
                let sem = Arc::new(Semaphore::new(0));
                let s = sem.clone();
                let got = Arc::new(AtomicBool::new(false));
                let g = got.clone();
                let h = fiber::spawn(move || {
                    if let Ok(p) = s.acquire_many(2) {
                        g.store(true, SeqCst);
                        drop(p);
                    }
                });
                wait_fiber_parked(h.id());
                let s = sem.clone();
                let releaser = fiber::spawn(move || s.add_permits(2));
                if round % 2 == 0 {
                    h.cancel();
                } else {
                    fiber::yield_now().unwrap();
                    h.cancel();
                }
                releaser.join().unwrap();
                let _ = h.join();
                assert_eq!(sem.available_permits(), 2, "round {round}: got={}", got.load(SeqCst));
            }
        });
    });
}

#[test]
fn a_condvar_notify_one_racing_the_cancel_of_one_waiter_still_wakes_the_other() {
    within(60, || {
        let rt = rt2();
        rt.block_on(|| {
            for round in 0..300 {
                let pair = Arc::new((Mutex::new(false), Condvar::new()));
                let saw = Arc::new(AtomicUsize::new(0));
                let spawn_waiter = || {
                    let (p, saw) = (pair.clone(), saw.clone());
                    fiber::spawn(move || {
                        let g = p.0.lock().unwrap();
                        let g = p.1.wait_while(g, |ready| !*ready).unwrap();
                        if *g {
                            saw.fetch_add(1, SeqCst);
                        }
                        *g
                    })
                };
                let a = spawn_waiter();
                wait_fiber_parked(a.id());
                let b = spawn_waiter();
                wait_fiber_parked(b.id());
                let p = pair.clone();
                let notifier = fiber::spawn(move || {
                    *p.0.lock().unwrap() = true;
                    p.1.notify_one();
                });
                if round % 2 == 1 {
                    fiber::yield_now().unwrap();
                }
                a.cancel();
                notifier.join().unwrap();
                // `a` either took the notification (and returned true) or was
                // cancelled; if it was cancelled, `b` must not sleep on while
                // the condition holds and a notify_one was made for it.
                let a_r = a.join();
                let start = Instant::now();
                while saw.load(SeqCst) == 0 && start.elapsed() < Duration::from_secs(2) {
                    fiber::sleep(ms(1)).unwrap();
                }
                assert!(
                    saw.load(SeqCst) >= 1,
                    "round {round}: a={a_r:?}: neither waiter returned seeing the condition"
                );
                pair.1.notify_all();
                b.join().unwrap();
            }
        });
    });
}

#[test]
fn a_barrier_arrival_withdrawn_by_a_with_timeout_does_not_count() {
    on_runtime(|| {
        let barrier = Arc::new(Barrier::new(2));
        let b = barrier.clone();
        let r = fiber::with_timeout(ms(30), move || b.wait().is_cancelled());
        assert!(r.is_err());
        let leaders = Arc::new(AtomicUsize::new(0));
        let released = Arc::new(AtomicUsize::new(0));
        let spawn = || {
            let (b, l, r) = (barrier.clone(), leaders.clone(), released.clone());
            fiber::spawn(move || {
                let res = b.wait();
                if res.is_leader() {
                    l.fetch_add(1, SeqCst);
                }
                r.fetch_add(1, SeqCst);
            })
        };
        let first = spawn();
        wait_fiber_parked(first.id());
        fiber::sleep(ms(20)).unwrap();
        assert_eq!(released.load(SeqCst), 0, "one arrival of two released the barrier");
        let second = spawn();
        first.join().unwrap();
        second.join().unwrap();
        assert_eq!((leaders.load(SeqCst), released.load(SeqCst)), (1, 2));
    });
}

// ---------------------------------------------------------------------------
// 4. Channels between a plain thread and the fibers of two runtimes.

#[test]
fn a_plain_thread_blocked_sending_to_a_fiber_of_a_dropped_runtime_gets_its_value_back() {
    within(60, || {
        for _ in 0..20 {
            let dropped = Arc::new(AtomicUsize::new(0));
            let (tx, rx) = bounded::<Token>(0);
            let received = Arc::new(std::sync::Mutex::new(Vec::new()));
            let rt = rt2();
            let rec = received.clone();
            drop(rt.handle().spawn(move || {
                while let Ok(t) = rx.recv() {
                    rec.lock().unwrap().push(t.id);
                }
            }));
            let d = dropped.clone();
            let sender = std::thread::spawn(move || {
                let mut returned = Vec::new();
                for i in 0..1_000_000 {
                    if let Err(e) = tx.send(Token::new(i, &d)) {
                        returned.push(e.into_inner().id);
                        break;
                    }
                }
                returned
            });
            std::thread::sleep(ms(5));
            drop(rt);
            let returned = sender.join().unwrap();
            let received = received.lock().unwrap().clone();
            assert_eq!(returned.len(), 1, "the blocked send came back with its value");
            let set: HashSet<_> = received.iter().copied().collect();
            assert_eq!(set.len(), received.len(), "a value was received twice");
            assert!(!set.contains(&returned[0]), "a value both received and given back");
            assert_eq!(received.len() + 1, dropped.load(SeqCst), "each value dropped once");
            assert_eq!(
                returned[0],
                received.len(),
                "values are received in order, none skipped"
            );
        }
    });
}

#[test]
fn a_channel_between_fibers_of_two_runtimes_loses_and_duplicates_nothing_when_one_is_dropped() {
    within(90, || {
        for round in 0..10 {
            let dropped = Arc::new(AtomicUsize::new(0));
            let made = Arc::new(AtomicUsize::new(0));
            let (tx, rx) = bounded::<Token>(4);
            let producer_rt = rt2();
            let consumer_rt = rt2();
            let received = Arc::new(std::sync::Mutex::new(Vec::new()));
            let returned = Arc::new(std::sync::Mutex::new(Vec::new()));
            let mut producers = Vec::new();
            for p in 0..3 {
                let (tx, d, m, ret) = (tx.clone(), dropped.clone(), made.clone(), returned.clone());
                producers.push(producer_rt.handle().spawn(move || {
                    for i in 0.. {
                        m.fetch_add(1, SeqCst);
                        let t = Token::new(p * 1_000_000 + i, &d);
                        match tx.send_timeout(t, Duration::from_secs(20)) {
                            Ok(()) => {}
                            Err(e) => {
                                ret.lock().unwrap().push(e.into_inner().id);
                                return;
                            }
                        }
                    }
                }));
            }
            drop(tx);
            for _ in 0..2 {
                let (rx, rec) = (rx.clone(), received.clone());
                drop(consumer_rt.handle().spawn(move || {
                    while let Ok(t) = rx.recv() {
                        rec.lock().unwrap().push(t.id);
                        if t.id % 7 == 0 {
                            fiber::yield_now().ok();
                        }
                    }
                }));
            }
            drop(rx);
            std::thread::sleep(ms(10 + round));
            drop(consumer_rt);
            // The producers now see every receiver gone: each gets its value
            // back and returns.
            for h in producers {
                producer_rt.block_on(|| h.join().unwrap());
            }
            drop(producer_rt);
            let received = received.lock().unwrap().clone();
            let returned = returned.lock().unwrap().clone();
            let set: HashSet<_> = received.iter().copied().collect();
            assert_eq!(set.len(), received.len(), "round {round}: a value received twice");
            assert_eq!(
                returned.len(),
                3,
                "round {round}: each producer got its last value back"
            );
            assert!(
                returned.iter().all(|r| !set.contains(r)),
                "round {round}: received and returned"
            );
            assert_eq!(
                made.load(SeqCst),
                dropped.load(SeqCst),
                "round {round}: every value dropped once"
            );
        }
    });
}

#[test]
fn a_plain_thread_select_over_channels_of_fibers_of_a_dropped_runtime_wakes_disconnected() {
    within(30, || {
        let rt = rt2();
        let (tx1, rx1) = bounded::<u32>(0);
        let (tx2, rx2) = bounded::<u32>(0);
        let (ready_tx, ready_rx) = bounded::<()>(2);
        for tx in [tx1, tx2] {
            let ready = ready_tx.clone();
            drop(rt.handle().spawn(move || {
                ready.send(()).unwrap();
                // Holds its sender parked in a long sleep.
                let _ = fiber::sleep(Duration::from_secs(3600));
                drop(tx);
            }));
        }
        ready_rx.recv().unwrap();
        ready_rx.recv().unwrap();
        let t = std::thread::spawn(move || {
            let mut closed = 0;
            while closed < 2 {
                fiber::select! {
                    recv(rx1) -> r => { assert!(r.is_err()); closed += 1; }
                    recv(rx2) -> r => { assert!(r.is_err()); closed += 1; }
                    recv(after(Duration::from_secs(20))) -> _ => return false,
                }
                if closed == 1 {
                    // One arm is disconnected for good: poll the other.
                    return rx1.recv().is_err() && rx2.recv().is_err();
                }
            }
            true
        });
        std::thread::sleep(ms(20));
        drop(rt);
        assert!(t.join().unwrap(), "the thread's select waited out its 20 s timer");
    });
}

#[test]
fn timer_channels_made_in_a_fiber_still_fire_on_a_plain_thread_after_the_runtime_is_dropped() {
    within(30, || {
        let rt = rt2();
        let (a, tk) = rt.block_on(|| (after(ms(150)), tick(ms(30))));
        drop(rt);
        let t = Instant::now();
        assert!(a.recv().is_ok());
        assert!(t.elapsed() < Duration::from_secs(3));
        for _ in 0..3 {
            assert!(tk.recv_timeout(Duration::from_secs(3)).is_ok());
        }
    });
}

// ---------------------------------------------------------------------------
// 5. JoinHandle::cancel racing a join, and the runtime's drop.

#[test]
fn join_handle_cancel_racing_a_plain_thread_join_and_the_runtime_drop_never_hangs() {
    within(90, || {
        for round in 0..60 {
            let rt = rt2();
            let dropped = Arc::new(AtomicUsize::new(0));
            let made = Arc::new(AtomicUsize::new(0));
            let (d, m) = (dropped.clone(), made.clone());
            let h = rt.handle().spawn(move || {
                m.fetch_add(1, SeqCst);
                let t = Token::new(round, &d);
                let _ = fiber::sleep(ms(round as u64 % 5));
                t
            });
            let canceller = h.canceller();
            let joiner = std::thread::spawn(move || h.join().map(drop).map_err(|e| e.is_cancelled()));
            let c = rt.handle().spawn(move || canceller.cancel());
            if round % 3 == 0 {
                std::thread::sleep(ms(1));
            }
            drop(c);
            drop(rt);
            let r = joiner.join().unwrap();
            assert!(matches!(r, Ok(()) | Err(true)), "round {round}: {r:?}");
            assert_eq!(
                dropped.load(SeqCst),
                made.load(SeqCst),
                "round {round}: the fiber's value dropped once"
            );
            if r == Ok(()) {
                assert_eq!(made.load(SeqCst), 1, "round {round}: joined Ok without running");
            }
        }
    });
}

#[test]
fn a_fiber_joining_a_handle_of_another_runtime_gets_cancelled_when_that_runtime_is_dropped() {
    within(30, || {
        let a = rt2();
        let b = rt2();
        let hb = b.handle().spawn(stubborn_sleep);
        let joiner = a.handle().spawn(move || hb.join().map_err(|e| e.is_cancelled()));
        std::thread::sleep(ms(20));
        let t = Instant::now();
        drop(b);
        let r = a.block_on(|| joiner.join().unwrap());
        assert_eq!(r.err(), Some(true), "the join reports the other runtime's teardown");
        assert!(t.elapsed() < Duration::from_secs(5));
    });
}

#[test]
fn a_fiber_joining_another_runtimes_fiber_under_with_timeout_leaves_it_running() {
    within(30, || {
        let a = rt2();
        let b = rt2();
        let (tx, rx) = bounded::<u32>(1);
        let hb = b.handle().spawn(move || {
            fiber::sleep(ms(200)).unwrap();
            tx.send(5).unwrap();
            9
        });
        let r = a.block_on(move || {
            let r = fiber::with_timeout(ms(30), || hb.join());
            (r.is_err(), rx.recv().unwrap())
        });
        assert_eq!(r, (true, 5), "the joined fiber ran on after its joiner timed out");
    });
}

// ---------------------------------------------------------------------------
// 6. Completion handlers that send and lock, at shutdown.

#[test]
fn completion_handlers_that_send_and_lock_run_once_each_at_shutdown() {
    within(30, || {
        let rt = rt2();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = unbounded::<(usize, fiber::JobState)>();
        let (ready_tx, ready_rx) = bounded::<()>(100);
        let n = 50;
        for i in 0..n {
            let (log, tx, ready) = (log.clone(), tx.clone(), ready_tx.clone());
            drop(rt.handle().spawn(move || {
                fiber::scope(|s| {
                    // The child signals once it runs (a child dropped unrun
                    // at shutdown is `scoped_children_ending_during_shutdown_never_end_completed`).
                    let h = s.spawn(move || {
                        ready.send(()).unwrap();
                        fiber::sleep(Duration::from_secs(3600))
                    });
                    h.job().invoke_on_completion(move |state| {
                        log.lock().unwrap().push(i);
                        tx.send((i, state)).unwrap();
                    });
                    let _ = h.join();
                });
            }));
        }
        drop(tx);
        for _ in 0..n {
            ready_rx.recv().unwrap();
        }
        drop(rt);
        let got: Vec<_> = rx.iter().collect();
        assert_eq!(got.len(), n, "each handler ran exactly once");
        assert!(got.iter().all(|(_, s)| *s == fiber::JobState::Cancelled), "{got:?}");
        let mut ids = log.lock().unwrap().clone();
        ids.sort_unstable();
        assert_eq!(ids, (0..n).collect::<Vec<_>>());
    });
}

#[test]
fn a_completion_handler_on_a_job_cancelled_by_with_timeout_sees_the_reason_and_may_lock() {
    on_runtime(|| {
        let lock = Arc::new(Mutex::new(0));
        let (tx, rx) = bounded::<(fiber::JobState, Option<fiber::CancelReason>)>(1);
        let l = lock.clone();
        let r = fiber::with_timeout(ms(30), move || {
            let job = fiber::Job::current();
            let j = job.clone();
            let id = job.id();
            job.invoke_on_completion(move |state| {
                *l.lock().unwrap() += 1;
                let _ = id;
                tx.send((state, j.cancel_reason())).unwrap();
            });
            fiber::sleep(Duration::MAX)
        });
        assert!(r.is_err());
        let (state, reason) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(state, fiber::JobState::Cancelled);
        assert_eq!(reason, Some(fiber::CancelReason::TimedOut));
        assert_eq!(*lock.lock().unwrap(), 1);
    });
}

// ---------------------------------------------------------------------------
// 7. Spinning fibers beside timers, sockets and a deadline.

#[test]
fn deadlines_and_socket_timeouts_fire_beside_fibers_that_spin_without_yielding() {
    within(60, || {
        // The default elastic pool: 2 workers to start, growth on.
        let rt = rt();
        rt.block_on(|| {
            let stop = Arc::new(AtomicBool::new(false));
            let mut spinners = Vec::new();
            for _ in 0..2 {
                let stop = stop.clone();
                spinners.push(fiber::spawn(move || spin_until(&stop, Duration::from_secs(3))));
            }
            let listener = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let _client = fiber::net::TcpStream::connect(addr).unwrap();
            let (server, _) = listener.accept().unwrap();
            let t = Instant::now();
            let timed = fiber::spawn(move || {
                fiber::with_timeout(ms(100), || {
                    let mut buf = [0u8; 8];
                    (&server).read(&mut buf)
                })
                .is_err()
            });
            let mut s2 = fiber::net::TcpStream::connect(addr).unwrap();
            let _ = s2.set_read_timeout(Some(ms(100)));
            let _accepted = listener.accept().unwrap();
            let sock = fiber::spawn(move || {
                let mut buf = [0u8; 8];
                s2.read(&mut buf).unwrap_err().kind()
            });
            let ticks = fiber::spawn(|| {
                let tk = tick(ms(20));
                (0..5).all(|_| tk.recv().is_ok())
            });
            assert!(timed.join().unwrap(), "with_timeout fired");
            let kind = sock.join().unwrap();
            assert!(
                matches!(kind, std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
                "{kind:?}"
            );
            assert!(ticks.join().unwrap());
            let took = t.elapsed();
            stop.store(true, SeqCst);
            for s in spinners {
                assert!(s.join().unwrap(), "a spinner ran out its 3 s: the others waited for it");
            }
            assert!(
                took < Duration::from_secs(2),
                "the timed waits took {took:?} beside the spinners"
            );
        });
    });
}

#[test]
fn a_spinning_scoped_child_under_a_deadline_polls_is_cancelled_one_worker() {
    within(30, || {
        let rt = rt1();
        rt.block_on(|| {
            let t = Instant::now();
            let r = fiber::with_timeout(ms(50), || {
                fiber::scope(|s| {
                    let h = s.spawn(|| {
                        let mut n = 0u64;
                        while !fiber::is_cancelled() {
                            n += 1;
                            std::hint::spin_loop();
                        }
                        n
                    });
                    let (tx, rx) = bounded::<u8>(0);
                    let waiter = s.spawn(move || {
                        fiber::select! { recv(rx) -> _ => 1, recv(after(Duration::from_secs(3600))) -> _ => 2 }
                    });
                    let _ = tx;
                    (h.join(), waiter.join())
                })
            });
            assert!(r.is_err());
            assert!(t.elapsed() < Duration::from_secs(3), "took {:?}", t.elapsed());
        });
    });
}

// ---------------------------------------------------------------------------
// 8. fiber::blocking inside scoped children, cancelled at shutdown.

// Failed before the fix: the scope owner of children given up in fiber::blocking is abandoned for good at teardown: its destructors never run, its socket stays open
#[test]
fn blocking_calls_of_scoped_children_at_shutdown_end_and_their_scope_owner_is_unwound() {
    within(30, || {
        let rt = rt_fixed_grace(2, ms(100));
        let finished = Arc::new(AtomicUsize::new(0));
        let dropped = Arc::new(AtomicUsize::new(0));
        let (f, d) = (finished.clone(), dropped.clone());
        let (ready_tx, ready_rx) = bounded::<()>(4);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let h = rt.handle().spawn(move || {
            // The scope owner owns a token and a socket.
            let _owned = Token::new(0, &d);
            let owner_sock = fiber::net::TcpStream::connect(addr).unwrap();
            let mut slots = [0u64; 4];
            fiber::scope(|s| {
                for (i, slot) in slots.iter_mut().enumerate() {
                    let (f, ready, d) = (f.clone(), ready_tx.clone(), d.clone());
                    let sock = fiber::net::TcpStream::connect(addr).unwrap();
                    s.spawn(move || {
                        let _child_token = Token::new(1 + i, &d);
                        ready.send(()).unwrap();
                        fiber::blocking(|| {
                            std::thread::sleep(ms(300));
                            *slot = 0xABCD_0000 + i as u64;
                            f.fetch_add(1, SeqCst);
                        });
                        drop(sock);
                        // After the call: a cancellation point.
                        fiber::sleep(Duration::from_secs(3600))
                    });
                }
            });
            drop(owner_sock);
            slots
        });
        let mut accepted: Vec<_> = (0..5).map(|_| listener.accept().unwrap().0).collect();
        for _ in 0..4 {
            ready_rx.recv().unwrap();
        }
        std::thread::sleep(ms(20));
        let t = Instant::now();
        drop(rt);
        assert!(t.elapsed() < Duration::from_secs(5));
        let r = h.join();
        assert!(r.is_err_and(|e| e.is_cancelled()));
        // Once the calls return, the children and then their scope's owner
        // are unwound: every token dropped, every socket closed.
        let start = Instant::now();
        while dropped.load(SeqCst) < 5 && start.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(ms(10));
        }
        assert_eq!(finished.load(SeqCst), 4, "every blocking call ran to its end");
        let open: Vec<usize> = accepted
            .iter_mut()
            .enumerate()
            .filter(|(_, s)| {
                s.set_read_timeout(Some(ms(500))).unwrap();
                let mut buf = [0u8; 4];
                !matches!((&**s).read(&mut buf), Ok(0))
            })
            .map(|(i, _)| i)
            .collect();
        assert_eq!(
            (dropped.load(SeqCst), open.len()),
            (5, 0),
            "tokens dropped (of 5: the owner's and 4 children's), sockets still open (of 5, in connect order): {open:?}"
        );
    });
}

// ---------------------------------------------------------------------------
// 9. Locks held by fibers, waited for by plain threads, at shutdown.

#[test]
fn a_plain_thread_waiting_for_a_lock_held_by_a_fiber_gets_it_when_the_runtime_drops() {
    within(30, || {
        for stubborn in [false, true] {
            let rt = rt_fixed_grace(2, ms(100));
            let lock = Arc::new(Mutex::new(0u32));
            let l = lock.clone();
            let (ready_tx, ready_rx) = bounded::<()>(1);
            drop(rt.handle().spawn(move || {
                let mut g = l.lock().unwrap();
                *g = 1;
                ready_tx.send(()).unwrap();
                if stubborn {
                    stubborn_sleep();
                } else {
                    let _ = fiber::sleep(Duration::MAX);
                }
                *g = 2;
            }));
            ready_rx.recv().unwrap();
            let l = lock.clone();
            let waiter = std::thread::spawn(move || match l.lock() {
                Ok(g) => (*g, false),
                Err(p) => (*p.into_inner(), true),
            });
            std::thread::sleep(ms(20));
            drop(rt);
            let (v, poisoned) = waiter.join().unwrap();
            if stubborn {
                assert_eq!((v, poisoned), (1, true), "unwound holding the guard: poisoned");
            } else {
                assert_eq!((v, poisoned), (2, false), "returned normally: not poisoned");
            }
        }
    });
}

// ---------------------------------------------------------------------------
// 10. Sockets closed at shutdown and on cancel (file descriptors counted).

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[test]
fn sockets_of_cancelled_accepts_racing_connects_are_all_closed() {
    in_child(
        "sockets_of_cancelled_accepts_racing_connects_are_all_closed",
        60,
        || {
            let rt = rt2();
            // Warm up the poller and the runtime.
            rt.block_on(|| drop(fiber::net::TcpListener::bind("127.0.0.1:0").unwrap()));
            let before = open_fds();
            rt.block_on(|| {
                for round in 0..100 {
                    let listener = Arc::new(fiber::net::TcpListener::bind("127.0.0.1:0").unwrap());
                    let addr = listener.local_addr().unwrap();
                    let l = listener.clone();
                    let h = fiber::spawn(move || l.accept().map(|(s, _)| s));
                    wait_fiber_parked(h.id());
                    let connector = std::thread::spawn(move || std::net::TcpStream::connect(addr));
                    if round % 2 == 0 {
                        std::thread::yield_now();
                    }
                    h.cancel();
                    let accepted = h.join();
                    let client = connector.join().unwrap();
                    drop(accepted);
                    drop(client);
                    drop(listener);
                }
            });
            let after = open_fds();
            assert!(after <= before, "file descriptors: {before} before, {after} after");
            drop(rt);
        },
    );
}

#[test]
fn sockets_of_fibers_torn_down_at_shutdown_are_closed() {
    in_child("sockets_of_fibers_torn_down_at_shutdown_are_closed", 60, || {
        let warm = rt2();
        warm.block_on(|| drop(fiber::net::UdpSocket::bind("127.0.0.1:0").unwrap()));
        drop(warm);
        let before = open_fds();
        let rt = rt_fixed_grace(2, ms(100));
        let (ready_tx, ready_rx) = bounded::<()>(64);
        for i in 0..30 {
            let ready = ready_tx.clone();
            drop(rt.handle().spawn(move || {
                fiber::supervisor_scope(|s| {
                    let listener = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
                    let addr = listener.local_addr().unwrap();
                    let client = fiber::net::TcpStream::connect(addr).unwrap();
                    let (server, _) = listener.accept().unwrap();
                    let udp = fiber::net::UdpSocket::bind("127.0.0.1:0").unwrap();
                    s.spawn(move || {
                        let mut buf = [0u8; 8];
                        let _ = (&server).read(&mut buf);
                        if i % 2 == 0 {
                            stubborn_sleep();
                        }
                    });
                    s.spawn(move || {
                        let mut buf = [0u8; 8];
                        let _ = udp.recv_from(&mut buf);
                    });
                    s.spawn(move || listener.accept().map(drop));
                    ready.send(()).unwrap();
                    let _ = fiber::sleep(Duration::MAX);
                    drop(client);
                });
            }));
        }
        for _ in 0..30 {
            ready_rx.recv().unwrap();
        }
        std::thread::sleep(ms(20));
        drop(rt);
        // The poller's and blocking pool's threads may take a moment to go.
        let start = Instant::now();
        while open_fds() > before && start.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(ms(10));
        }
        assert!(
            open_fds() <= before,
            "file descriptors: {before} before, {} after",
            open_fds()
        );
    });
}

// ---------------------------------------------------------------------------
// 11. Values whose Drop panics, in channels of cancelled scopes.

struct PanicOnDrop(Arc<AtomicUsize>);

impl Drop for PanicOnDrop {
    fn drop(&mut self) {
        self.0.fetch_add(1, SeqCst);
        if !std::thread::panicking() {
            panic!("drop of a buffered value");
        }
    }
}

#[test]
fn a_cancelled_scope_child_dropping_a_channel_with_panicking_values_fails_the_scope_once() {
    on_runtime(|| {
        let drops = Arc::new(AtomicUsize::new(0));
        let d = drops.clone();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            fiber::scope(|s| {
                let (tx, rx) = bounded::<PanicOnDrop>(8);
                for _ in 0..3 {
                    tx.send(PanicOnDrop(d.clone())).unwrap();
                }
                let (_block_tx, block_rx) = bounded::<u8>(0);
                let h = s.spawn(move || {
                    let _keep = rx;
                    let _ = block_rx.recv();
                });
                drop(tx);
                wait_fiber_parked(h.id());
                s.cancel();
            })
        }));
        assert_eq!(drops.load(SeqCst), 3, "every buffered value dropped once");
        let msg = r.unwrap_err();
        let msg = msg
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| msg.downcast_ref::<String>().cloned());
        assert_eq!(msg.as_deref(), Some("drop of a buffered value"));
    });
}

// ---------------------------------------------------------------------------
// 12. Completion handlers that cancel, locks and semaphores queued behind
// fibers that leave, once-cells whose initializer is torn down.

#[test]
fn a_completion_handler_of_a_failed_supervisor_child_may_cancel_the_supervisor() {
    on_runtime(|| {
        let t = Instant::now();
        let (panicked, other) = fiber::supervisor_scope(|s| {
            let scope_job = s.job();
            let failing = s.spawn(|| {
                fiber::sleep(ms(10)).unwrap();
                panic!("child failed");
            });
            failing.job().invoke_on_completion(move |state| {
                if state == fiber::JobState::Failed {
                    scope_job.cancel();
                }
            });
            let other = s.spawn(|| fiber::sleep(Duration::from_secs(3600)));
            (failing.join().unwrap_err().is_panic(), other.join())
        });
        assert!(panicked);
        assert!(other.unwrap_err().is_cancelled());
        assert!(t.elapsed() < Duration::from_secs(3));
    });
}

#[test]
fn a_supervisor_childs_join_under_with_timeout_reports_timed_out() {
    on_runtime(|| {
        let seen = Arc::new(std::sync::Mutex::new(None));
        let s2 = seen.clone();
        let r = fiber::with_timeout(ms(30), move || {
            fiber::supervisor_scope(|s| {
                let h = s.spawn(|| fiber::sleep(Duration::MAX));
                let e = h.join().unwrap_err();
                *s2.lock().unwrap() = Some((e.is_cancelled(), e.is_timed_out()));
            })
        });
        assert!(r.is_err());
        assert_eq!(*seen.lock().unwrap(), Some((true, true)));
    });
}

#[test]
fn a_plain_thread_reader_queued_behind_a_fiber_writer_gets_the_lock_when_the_runtime_drops() {
    within(30, || {
        let lock = Arc::new(fiber::sync::RwLock::new(0u32));
        let held = lock.read().unwrap();
        let rt = rt_fixed_grace(2, ms(100));
        let l = lock.clone();
        let writer = rt.handle().spawn(move || {
            *l.write().unwrap() += 1;
        });
        // Give the writer time to queue.
        std::thread::sleep(ms(50));
        let l = lock.clone();
        let reader = std::thread::spawn(move || *l.read().unwrap());
        std::thread::sleep(ms(20));
        // The fiber writer waits on (not a cancellation point) until the
        // teardown unwinds it; the read guard is still held meanwhile.
        drop(rt);
        assert!(writer.join().unwrap_err().is_cancelled());
        drop(held);
        assert_eq!(reader.join().unwrap(), 0, "the queued reader got the lock");
        assert!(lock.try_write().is_ok(), "the lock is usable");
    });
}

#[test]
fn a_plain_thread_queued_behind_a_fiber_on_a_semaphore_is_served_when_the_fiber_times_out() {
    within(30, || {
        let rt = rt2();
        let sem = Arc::new(Semaphore::new(3));
        let s = sem.clone();
        let (queued_tx, queued_rx) = bounded::<()>(1);
        let h = rt.handle().spawn(move || {
            fiber::with_timeout(ms(100), || {
                queued_tx.send(()).unwrap();
                s.acquire_many(5).map(|p| p.forget()).is_ok()
            })
        });
        queued_rx.recv().unwrap();
        std::thread::sleep(ms(20));
        let s = sem.clone();
        let t = Instant::now();
        let thread = std::thread::spawn(move || s.acquire().map(|p| p.forget()).is_ok());
        assert!(thread.join().unwrap());
        assert!(t.elapsed() < Duration::from_secs(3));
        let r = rt.block_on(|| h.join().unwrap());
        assert!(r.is_err(), "the large request timed out");
        assert_eq!(sem.available_permits(), 2);
    });
}

#[test]
fn a_plain_thread_queued_behind_a_fiber_on_a_semaphore_is_served_when_the_runtime_drops() {
    within(30, || {
        let rt = rt2();
        let sem = Arc::new(Semaphore::new(3));
        let s = sem.clone();
        let (queued_tx, queued_rx) = bounded::<()>(1);
        drop(rt.handle().spawn(move || {
            queued_tx.send(()).unwrap();
            let _ = s.acquire_many(5).map(|p| p.forget());
        }));
        queued_rx.recv().unwrap();
        std::thread::sleep(ms(20));
        let s = sem.clone();
        let thread = std::thread::spawn(move || s.acquire().map(|p| p.forget()).is_ok());
        std::thread::sleep(ms(20));
        drop(rt);
        assert!(thread.join().unwrap());
        assert_eq!(sem.available_permits(), 2);
    });
}

#[test]
fn a_once_lock_whose_initializing_fiber_is_torn_down_is_initialized_by_a_waiting_thread() {
    within(30, || {
        for stubborn in [false, true] {
            let cell = Arc::new(fiber::sync::OnceLock::<u32>::new());
            let rt = rt_fixed_grace(2, ms(100));
            let c = cell.clone();
            let (started_tx, started_rx) = bounded::<()>(1);
            drop(rt.handle().spawn(move || {
                c.get_or_init(|| {
                    started_tx.send(()).unwrap();
                    if stubborn {
                        stubborn_sleep();
                    }
                    let _ = fiber::sleep(Duration::from_secs(3600));
                    1
                });
            }));
            started_rx.recv().unwrap();
            let c = cell.clone();
            let thread = std::thread::spawn(move || *c.get_or_init(|| 2));
            std::thread::sleep(ms(20));
            drop(rt);
            let v = thread.join().unwrap();
            if stubborn {
                assert_eq!(v, 2, "the torn-down initializer left the cell to the thread");
            } else {
                assert_eq!(v, 1, "the cancelled initializer returned its value");
            }
            assert_eq!(cell.get(), Some(&v));
        }
    });
}

#[test]
fn a_wait_group_waited_on_by_a_plain_thread_is_released_when_its_fibers_are_torn_down() {
    within(30, || {
        let rt = rt_fixed_grace(2, ms(100));
        let wg = fiber::sync::WaitGroup::new();
        for i in 0..10 {
            let wg = wg.clone();
            drop(rt.handle().spawn(move || {
                let _wg = wg;
                if i % 2 == 0 {
                    stubborn_sleep();
                } else {
                    let _ = fiber::sleep(Duration::MAX);
                }
            }));
        }
        let waiter = std::thread::spawn(move || wg.wait());
        std::thread::sleep(ms(30));
        drop(rt);
        waiter.join().unwrap();
    });
}

#[test]
fn a_barrier_shared_by_two_runtimes_and_threads_withdraws_the_arrival_of_a_dropped_runtimes_fiber() {
    within(30, || {
        let barrier = Arc::new(Barrier::new(3));
        let a = rt2();
        let b = rt2();
        let leaders = Arc::new(AtomicUsize::new(0));
        let arrive = |l: Arc<AtomicUsize>, bar: Arc<Barrier>| {
            move || {
                let r = bar.wait();
                if r.is_leader() {
                    l.fetch_add(1, SeqCst);
                }
                r.is_cancelled()
            }
        };
        let ha = a.handle().spawn(arrive(leaders.clone(), barrier.clone()));
        let hb = b.handle().spawn(arrive(leaders.clone(), barrier.clone()));
        wait_parked(&a, 1);
        wait_parked(&b, 1);
        drop(a);
        // `a`'s fiber withdrew its arrival: one thread more is needed.
        let t1 = std::thread::spawn(arrive(leaders.clone(), barrier.clone()));
        std::thread::sleep(ms(50));
        assert!(!t1.is_finished(), "two live arrivals of three released the barrier");
        let t2 = std::thread::spawn(arrive(leaders.clone(), barrier.clone()));
        assert!(!t1.join().unwrap());
        assert!(!t2.join().unwrap());
        assert!(!b.block_on(|| hb.join().unwrap()));
        assert!(ha.join().is_err_and(|e| e.is_cancelled()));
        assert_eq!(leaders.load(SeqCst), 1);
    });
}

// ---------------------------------------------------------------------------
// 13. Fiber-locals, values and jobs across the runtime's drop.

struct ReportOnDrop(Option<(usize, fiber::chan::Sender<usize>)>);

impl Drop for ReportOnDrop {
    fn drop(&mut self) {
        if let Some((id, tx)) = self.0.take() {
            let _ = tx.send(id);
        }
    }
}

fiber::fiber_local! {
    static LOCAL_GUARD: std::cell::RefCell<ReportOnDrop> = std::cell::RefCell::new(ReportOnDrop(None));
}

#[test]
fn fiber_local_destructors_of_scoped_children_torn_down_at_shutdown_run_once_each() {
    within(30, || {
        let rt = rt_fixed_grace(2, ms(100));
        let (tx, rx) = unbounded::<usize>();
        let (ready_tx, ready_rx) = bounded::<()>(64);
        let n = 12;
        for owner in 0..3 {
            let (tx, ready) = (tx.clone(), ready_tx.clone());
            drop(rt.handle().spawn(move || {
                fiber::scope(|s| {
                    for k in 0..4 {
                        let (tx, ready) = (tx.clone(), ready.clone());
                        let id = owner * 4 + k;
                        s.spawn(move || {
                            LOCAL_GUARD.with(|g| g.borrow_mut().0 = Some((id, tx)));
                            ready.send(()).unwrap();
                            if id % 2 == 0 {
                                stubborn_sleep();
                            } else {
                                let _ = fiber::sleep(Duration::MAX);
                            }
                        });
                    }
                });
            }));
        }
        drop(tx);
        for _ in 0..n {
            ready_rx.recv().unwrap();
        }
        drop(rt);
        let mut got: Vec<usize> = rx.iter().collect();
        got.sort_unstable();
        assert_eq!(got, (0..n).collect::<Vec<_>>(), "each fiber-local destructor ran once");
    });
}

#[test]
fn a_value_returned_after_its_joiner_in_another_runtime_was_dropped_is_dropped_once() {
    within(30, || {
        let a = rt2();
        let b = rt2();
        let dropped = Arc::new(AtomicUsize::new(0));
        let d = dropped.clone();
        let (go_tx, go_rx) = bounded::<()>(0);
        let h = a.handle().spawn(move || {
            let _ = go_rx.recv();
            Token::new(7, &d)
        });
        let joiner = b.handle().spawn(move || h.join().map(|t| t.id));
        wait_parked(&b, 1);
        drop(b);
        assert!(joiner.join().is_err_and(|e| e.is_cancelled()));
        go_tx.send(()).unwrap();
        drop(a);
        assert_eq!(dropped.load(SeqCst), 1, "the unjoined value was dropped exactly once");
    });
}

#[test]
fn a_plain_threads_cancel_and_join_of_a_fibers_job_returns_when_the_runtime_drops() {
    within(30, || {
        let rt = rt_fixed_grace(2, ms(100));
        let (job_tx, job_rx) = bounded::<fiber::Job>(1);
        drop(rt.handle().spawn(move || {
            job_tx.send(fiber::Job::current()).unwrap();
            stubborn_sleep();
        }));
        let job = job_rx.recv().unwrap();
        let j = job.clone();
        let joiner = std::thread::spawn(move || j.join());
        std::thread::sleep(ms(20));
        drop(rt);
        assert_eq!(joiner.join().unwrap(), Ok(fiber::JobState::Cancelled));
        assert_eq!(job.state(), fiber::JobState::Cancelled);
    });
}

#[test]
fn with_timeout_around_a_blocking_call_reports_timed_out_after_the_call_returns() {
    on_runtime(|| {
        let ran = Arc::new(AtomicBool::new(false));
        let r2 = ran.clone();
        let t = Instant::now();
        let r = fiber::with_timeout(ms(30), move || {
            fiber::blocking(|| {
                std::thread::sleep(ms(150));
                r2.store(true, SeqCst);
            });
            5
        });
        assert!(r.is_err(), "the block overran its deadline");
        assert!(ran.load(SeqCst));
        assert!(t.elapsed() >= ms(150));
    });
}

// Failed before the fix: Handle::block_on hangs for ever when its root's scope waits for a child given up in fiber::blocking at shutdown
#[test]
fn a_plain_threads_block_on_whose_scope_waits_for_blocking_children_returns_when_the_runtime_drops() {
    within(30, || {
        let rt = rt_fixed_grace(2, ms(100));
        let handle = rt.handle();
        let finished = Arc::new(AtomicUsize::new(0));
        let f = finished.clone();
        let (ready_tx, ready_rx) = bounded::<()>(2);
        let t = std::thread::spawn(move || {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                handle.block_on(|| {
                    let mut local = 0u64;
                    fiber::scope(|s| {
                        let (f, ready) = (f.clone(), ready_tx.clone());
                        let local = &mut local;
                        s.spawn(move || {
                            ready.send(()).unwrap();
                            fiber::blocking(|| {
                                std::thread::sleep(ms(300));
                                *local = 1;
                                f.fetch_add(1, SeqCst);
                            });
                        });
                    });
                    local
                })
            }))
            .is_ok()
        });
        ready_rx.recv().unwrap();
        std::thread::sleep(ms(20));
        drop(rt);
        // The call returns after 300 ms; then the child unwinds, the scope
        // ends, and the root returns (or is unwound): block_on returns.
        let start = Instant::now();
        while !t.is_finished() && start.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(ms(10));
        }
        assert_eq!(finished.load(SeqCst), 1);
        assert!(
            t.is_finished(),
            "block_on still waits 5 s after its blocking call returned"
        );
        let _ = t.join();
    });
}

// ---------------------------------------------------------------------------
// 14. Socket calls cancelled while data (or a connection) arrives: nothing
// the kernel handed over is lost.

#[test]
fn a_socket_write_loop_cut_by_with_timeout_counts_every_byte_the_peer_reads() {
    on_runtime(|| {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = std_listener.local_addr().unwrap();
        let mut stream = fiber::net::TcpStream::connect(addr).unwrap();
        let (peer, _) = std_listener.accept().unwrap();
        let buf = vec![7u8; 64 * 1024];
        let mut written = 0usize;
        let r = fiber::with_timeout(ms(100), || loop {
            match stream.write(&buf) {
                Ok(n) => written += n,
                Err(e) => return e,
            }
        });
        assert!(r.is_err(), "the writes filled the socket and timed out");
        drop(stream);
        let read = fiber::blocking(move || {
            let mut peer = peer;
            let mut all = Vec::new();
            peer.read_to_end(&mut all).unwrap();
            all.len()
        });
        assert_eq!(read, written, "bytes written by the calls that returned Ok");
    });
}

#[test]
fn a_socket_read_cancelled_as_data_arrives_loses_no_byte() {
    on_runtime(|| {
        let listener = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let writer = std::thread::spawn(move || {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.set_nodelay(true).unwrap();
            for i in 0..300u32 {
                s.write_all(&i.to_le_bytes()).unwrap();
                std::thread::sleep(Duration::from_micros(200));
            }
        });
        let (stream, _) = listener.accept().unwrap();
        let stream = Arc::new(stream);
        let got = Arc::new(std::sync::Mutex::new(Vec::new()));
        let eof = Arc::new(AtomicBool::new(false));
        // Reader fibers, each cancelled at a random moment; every byte a
        // read returns is recorded at once.
        let mut round = 0u64;
        while !eof.load(SeqCst) {
            round += 1;
            let (s, got, eof) = (stream.clone(), got.clone(), eof.clone());
            let h = fiber::spawn(move || {
                let mut buf = [0u8; 64];
                loop {
                    match (&*s).read(&mut buf) {
                        Ok(0) => {
                            eof.store(true, SeqCst);
                            return;
                        }
                        Ok(n) => got.lock().unwrap().extend_from_slice(&buf[..n]),
                        Err(_) => return,
                    }
                }
            });
            for _ in 0..round % 4 {
                fiber::yield_now().unwrap();
            }
            if round % 5 == 0 {
                fiber::sleep(Duration::from_micros(300)).unwrap();
            }
            h.cancel();
            let _ = h.join();
        }
        writer.join().unwrap();
        let got = got.lock().unwrap().clone();
        let expected: Vec<u8> = (0..300u32).flat_map(|i| i.to_le_bytes()).collect();
        assert_eq!(
            got.len(),
            expected.len(),
            "bytes lost or duplicated over {round} cancelled readers"
        );
        assert!(got == expected, "the bytes arrived out of order");
    });
}

#[test]
fn a_udp_recv_cancelled_as_datagrams_arrive_loses_none() {
    on_runtime(|| {
        let sock = Arc::new(fiber::net::UdpSocket::bind("127.0.0.1:0").unwrap());
        let addr = sock.local_addr().unwrap();
        let sender = std::thread::spawn(move || {
            let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            for i in 0..300u32 {
                s.send_to(&i.to_le_bytes(), addr).unwrap();
                std::thread::sleep(Duration::from_micros(200));
            }
            s.send_to(b"end!!", addr).unwrap();
        });
        let got = Arc::new(std::sync::Mutex::new(Vec::new()));
        let end = Arc::new(AtomicBool::new(false));
        let mut round = 0u64;
        while !end.load(SeqCst) {
            round += 1;
            let (s, got, end) = (sock.clone(), got.clone(), end.clone());
            let h = fiber::spawn(move || {
                let mut buf = [0u8; 16];
                while let Ok((n, _)) = s.recv_from(&mut buf) {
                    if n == 5 {
                        end.store(true, SeqCst);
                        return;
                    }
                    got.lock()
                        .unwrap()
                        .push(u32::from_le_bytes(buf[..4].try_into().unwrap()));
                }
            });
            for _ in 0..round % 4 {
                fiber::yield_now().unwrap();
            }
            if round % 5 == 0 {
                fiber::sleep(Duration::from_micros(300)).unwrap();
            }
            h.cancel();
            let _ = h.join();
        }
        sender.join().unwrap();
        let got = got.lock().unwrap().clone();
        assert_eq!(
            got,
            (0..300u32).collect::<Vec<_>>(),
            "datagrams lost over {round} cancelled receivers"
        );
    });
}

#[test]
fn a_connection_whose_accept_was_cancelled_is_accepted_by_the_next_accept() {
    on_runtime(|| {
        let listener = Arc::new(fiber::net::TcpListener::bind("127.0.0.1:0").unwrap());
        let addr = listener.local_addr().unwrap();
        for round in 0..100 {
            let l = listener.clone();
            // What the accept returns is handed over at once (a std channel
            // never fails), even if the fiber was cancelled meanwhile.
            let (tx, rx) = std::sync::mpsc::channel();
            let h = fiber::spawn(move || {
                if let Ok((s, _)) = l.accept() {
                    tx.send(s).unwrap();
                }
            });
            wait_fiber_parked(h.id());
            let connector = std::thread::spawn(move || {
                let mut c = std::net::TcpStream::connect(addr).unwrap();
                c.write_all(&[round as u8]).unwrap();
                c
            });
            if round % 2 == 0 {
                std::thread::yield_now();
            }
            h.cancel();
            let _client = connector.join().unwrap();
            let _ = h.join();
            let mut stream = match rx.try_recv() {
                Ok(s) => s,
                Err(_) => {
                    let l = listener.clone();
                    fiber::with_timeout(Duration::from_secs(5), move || l.accept().map(|(s, _)| s))
                        .expect("the connection stayed in the backlog")
                        .unwrap()
                }
            };
            let mut b = [0u8; 1];
            stream.read_exact(&mut b).unwrap();
            assert_eq!(b[0], round as u8, "round {round}: another connection");
        }
    });
}

// ---------------------------------------------------------------------------
// 15. Duration::MAX in the runtime's own settings; the I/O-park mode with
// timers, thread wakes and sockets; a timer channel shared by runtimes.

#[test]
fn a_runtime_with_duration_max_grace_and_idle_timeout_shuts_down_once_its_fibers_return() {
    within(30, || {
        let rt = fiber::Runtime::builder()
            .workers(1)
            .max_workers(3)
            .idle_timeout(Duration::MAX)
            .shutdown_timeout(Duration::MAX)
            .build()
            .unwrap();
        let (_tx, rx) = bounded::<u8>(0);
        for _ in 0..4 {
            let rx = rx.clone();
            drop(rt.handle().spawn(move || {
                let _ = rx.recv();
            }));
        }
        // A spinner long enough for the pool to grow.
        rt.block_on(|| {
            let stop = Arc::new(AtomicBool::new(false));
            let s = stop.clone();
            let h = fiber::spawn(move || spin_until(&s, ms(200)));
            fiber::sleep(ms(100)).unwrap();
            stop.store(true, SeqCst);
            h.join().unwrap();
        });
        wait_parked(&rt, 4);
        let t = Instant::now();
        drop(rt);
        assert!(t.elapsed() < Duration::from_secs(5), "the drop took {:?}", t.elapsed());
        let rt = fiber::Runtime::builder().workers(2).build().unwrap();
        let rx2 = rx.clone();
        drop(rt.handle().spawn(move || {
            let _ = rx2.recv();
        }));
        wait_parked(&rt, 1);
        let t = Instant::now();
        rt.shutdown_timeout(Duration::MAX);
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "shutdown_timeout(MAX) took {:?}",
            t.elapsed()
        );
    });
}

#[test]
fn io_park_mode_serves_timers_thread_wakes_and_sockets_on_one_worker() {
    within(60, || {
        let rt = fiber::Runtime::builder()
            .workers(1)
            .max_workers(1)
            .io_park(true)
            .shutdown_timeout(ms(300))
            .build()
            .unwrap();
        let (tx, rx) = bounded::<u32>(0);
        let thread = std::thread::spawn(move || {
            for i in 0..50 {
                std::thread::sleep(ms(2));
                tx.send(i).unwrap();
            }
        });
        let worst = rt.block_on(move || {
            let listener = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let echo = fiber::spawn(move || {
                let (mut s, _) = listener.accept().unwrap();
                let mut buf = [0u8; 4];
                for _ in 0..20 {
                    s.read_exact(&mut buf).unwrap();
                    s.write_all(&buf).unwrap();
                }
            });
            let sleeper = fiber::spawn(|| {
                let mut worst = Duration::ZERO;
                for _ in 0..20 {
                    let t = Instant::now();
                    fiber::sleep(ms(5)).unwrap();
                    worst = worst.max(t.elapsed());
                }
                worst
            });
            let receiver = fiber::spawn(move || rx.iter().count());
            let mut c = fiber::net::TcpStream::connect(addr).unwrap();
            let mut buf = [0u8; 4];
            for i in 0..20u32 {
                c.write_all(&i.to_le_bytes()).unwrap();
                c.read_exact(&mut buf).unwrap();
                assert_eq!(u32::from_le_bytes(buf), i);
            }
            echo.join().unwrap();
            assert_eq!(receiver.join().unwrap(), 50);
            sleeper.join().unwrap()
        });
        thread.join().unwrap();
        assert!(worst < ms(500), "a 5 ms sleep took {worst:?} in io_park mode");
    });
}

#[test]
fn an_after_channel_shared_by_two_runtimes_and_a_thread_delivers_exactly_once() {
    within(30, || {
        for _ in 0..20 {
            let a = rt2();
            let b = rt2();
            let timer = after(ms(20));
            let got = Arc::new(AtomicUsize::new(0));
            let mut hs = Vec::new();
            for rt in [&a, &b] {
                for _ in 0..2 {
                    let (t, g) = (timer.clone(), got.clone());
                    hs.push(rt.handle().spawn(move || {
                        if t.recv_timeout(ms(300)).is_ok() {
                            g.fetch_add(1, SeqCst);
                        }
                    }));
                }
            }
            let (t, g) = (timer.clone(), got.clone());
            let thread = std::thread::spawn(move || {
                if t.recv_timeout(ms(300)).is_ok() {
                    g.fetch_add(1, SeqCst);
                }
            });
            thread.join().unwrap();
            for h in hs {
                h.join().unwrap();
            }
            assert_eq!(got.load(SeqCst), 1, "one message, taken once");
        }
    });
}

// ---------------------------------------------------------------------------
// 16. A scope whose child spins through the shutdown (a stuck worker).

#[test]
fn a_scope_owner_whose_child_spins_through_the_shutdown_is_unwound_once_the_child_yields() {
    within(30, || {
        let rt = rt_fixed_grace(2, ms(100));
        let dropped = Arc::new(AtomicUsize::new(0));
        let d = dropped.clone();
        let (ready_tx, ready_rx) = bounded::<()>(1);
        let h = rt.handle().spawn(move || {
            let _owned = Token::new(0, &d);
            fiber::scope(|s| {
                let d = d.clone();
                s.spawn(move || {
                    let _child = Token::new(1, &d);
                    ready_tx.send(()).unwrap();
                    // 1.5 s without a yield point, then one.
                    let t = Instant::now();
                    while t.elapsed() < ms(1500) {
                        std::hint::spin_loop();
                    }
                    stubborn_sleep();
                });
            });
        });
        ready_rx.recv().unwrap();
        std::thread::sleep(ms(20));
        drop(rt);
        assert!(h.join().is_err_and(|e| e.is_cancelled()));
        let start = Instant::now();
        while dropped.load(SeqCst) < 2 && start.elapsed() < Duration::from_secs(8) {
            std::thread::sleep(ms(10));
        }
        assert_eq!(
            dropped.load(SeqCst),
            2,
            "the child's and its scope owner's tokens were dropped"
        );
    });
}

// ---------------------------------------------------------------------------
// 17. Teardown order against locks: a completion handler that waits for a
// lock an older fiber holds; a condvar wait that re-acquires a mutex a
// plain thread holds past the grace time.

/// A `fiber::sync::Mutex` and a flag its holder sets while it holds it.
struct Guarded {
    lock: Mutex<u32>,
    held: AtomicBool,
}

/// Take `g.lock` (poisoned or not) in code a fiber runs after its body
/// returned, at teardown: `Ok(())` if it then held the lock alone,
/// `Err(why)` otherwise (the panic message, or "shared").
fn lock_after_the_body(g: &Guarded) -> Result<(), String> {
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut guard = g.lock.lock().unwrap_or_else(|p| p.into_inner());
        let alone = !g.held.load(SeqCst);
        *guard += 1;
        alone
    }));
    match r {
        Ok(true) => Ok(()),
        Ok(false) => Err("the guard was handed out while the older fiber held the lock".into()),
        Err(p) => Err(p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default()),
    }
}

/// The older fiber (lower id: torn down after the younger one) holds the
/// lock through the shutdown, ignoring its cancellation.
fn hold_through_the_shutdown(rt: &fiber::Runtime, g: &Arc<Guarded>) {
    let (ready_tx, ready_rx) = bounded::<()>(1);
    let g = g.clone();
    drop(rt.handle().spawn(move || {
        let _guard = g.lock.lock().unwrap();
        g.held.store(true, SeqCst);
        ready_tx.send(()).unwrap();
        struct Clear(Arc<Guarded>);
        impl Drop for Clear {
            fn drop(&mut self) {
                self.0.held.store(false, SeqCst);
            }
        }
        let _clear = Clear(g.clone());
        stubborn_sleep();
    }));
    ready_rx.recv().unwrap();
}

// Failed before the fix: a fiber::sync::Mutex::lock in a completion handler run at teardown returns without the lock (debug_assert fires; release hands out a second guard)
#[test]
fn a_completion_handler_locking_a_mutex_an_older_fiber_holds_at_teardown_waits_for_it() {
    within(30, || {
        let rt = rt_fixed_grace(2, ms(100));
        let g = Arc::new(Guarded {
            lock: Mutex::new(0),
            held: AtomicBool::new(false),
        });
        hold_through_the_shutdown(&rt, &g);
        let outcome = Arc::new(std::sync::Mutex::new(None));
        let (ready_tx, ready_rx) = bounded::<()>(1);
        let (g2, out) = (g.clone(), outcome.clone());
        drop(rt.handle().spawn(move || {
            fiber::Job::current().invoke_on_completion(move |_| {
                *out.lock().unwrap() = Some(lock_after_the_body(&g2));
            });
            ready_tx.send(()).unwrap();
            stubborn_sleep();
        }));
        ready_rx.recv().unwrap();
        std::thread::sleep(ms(20));
        let t = Instant::now();
        drop(rt);
        assert!(t.elapsed() < Duration::from_secs(10), "the drop took {:?}", t.elapsed());
        let start = Instant::now();
        while outcome.lock().unwrap().is_none() && start.elapsed() < Duration::from_secs(3) {
            std::thread::sleep(ms(10));
        }
        let outcome = outcome.lock().unwrap().clone();
        assert_eq!(outcome, Some(Ok(())), "the handler's lock()");
        assert_eq!(*g.lock.lock().unwrap_or_else(|p| p.into_inner()), 1);
    });
}

/// Where a lock attempt after the body reports its outcome.
type Outcome = Arc<std::sync::Mutex<Option<Result<(), String>>>>;

struct LockOnDrop(Option<(Arc<Guarded>, Outcome)>);

impl Drop for LockOnDrop {
    fn drop(&mut self) {
        if let Some((g, out)) = self.0.take() {
            *out.lock().unwrap() = Some(lock_after_the_body(&g));
        }
    }
}

fiber::fiber_local! {
    static LOCK_ON_DROP: std::cell::RefCell<LockOnDrop> = std::cell::RefCell::new(LockOnDrop(None));
}

// Failed before the fix: a fiber::sync::Mutex::lock in a fiber-local destructor run at teardown returns without the lock (debug_assert fires; release hands out a second guard)
#[test]
fn a_fiber_local_destructor_locking_a_mutex_an_older_fiber_holds_at_teardown_waits_for_it() {
    within(30, || {
        let rt = rt_fixed_grace(2, ms(100));
        let g = Arc::new(Guarded {
            lock: Mutex::new(0),
            held: AtomicBool::new(false),
        });
        hold_through_the_shutdown(&rt, &g);
        let outcome = Arc::new(std::sync::Mutex::new(None));
        let (ready_tx, ready_rx) = bounded::<()>(1);
        let (g2, out) = (g.clone(), outcome.clone());
        drop(rt.handle().spawn(move || {
            LOCK_ON_DROP.with(|l| l.borrow_mut().0 = Some((g2, out)));
            ready_tx.send(()).unwrap();
            stubborn_sleep();
        }));
        ready_rx.recv().unwrap();
        std::thread::sleep(ms(20));
        drop(rt);
        let start = Instant::now();
        while outcome.lock().unwrap().is_none() && start.elapsed() < Duration::from_secs(3) {
            std::thread::sleep(ms(10));
        }
        let outcome = outcome.lock().unwrap().clone();
        assert_eq!(outcome, Some(Ok(())), "the destructor's lock()");
    });
}

#[test]
fn a_condvar_wait_cancelled_at_shutdown_while_a_thread_holds_the_mutex_leaves_it_usable() {
    within(30, || {
        let rt = rt_fixed_grace(2, ms(100));
        let pair = Arc::new((Mutex::new(0u32), Condvar::new()));
        let p = pair.clone();
        let waiter = rt.handle().spawn(move || {
            let g = p.0.lock().unwrap();
            let (g, _) = p.1.wait_timeout(g, Duration::MAX).unwrap();
            *g
        });
        wait_parked(&rt, 1);
        let p = pair.clone();
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let holder = std::thread::spawn(move || {
            let mut g = p.0.lock().unwrap();
            held_tx.send(()).unwrap();
            std::thread::sleep(ms(600));
            *g = 5;
        });
        held_rx.recv().unwrap();
        let t = Instant::now();
        drop(rt);
        assert!(t.elapsed() < Duration::from_secs(5));
        holder.join().unwrap();
        assert!(waiter.join().is_err_and(|e| e.is_cancelled()));
        let g = match pair.0.try_lock() {
            Ok(g) => *g,
            Err(std::sync::TryLockError::Poisoned(p)) => *p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => panic!("the mutex is still held"),
        };
        assert_eq!(g, 5);
        // And the condvar still works between threads.
        let p = pair.clone();
        let t2 = std::thread::spawn(move || {
            let g = p.0.lock().unwrap_or_else(|e| e.into_inner());
            let (g, res) =
                p.1.wait_timeout_while(g, Duration::from_secs(5), |v| *v != 6)
                    .unwrap_or_else(|e| e.into_inner());
            (*g, res.timed_out())
        });
        std::thread::sleep(ms(20));
        *pair.0.lock().unwrap_or_else(|e| e.into_inner()) = 6;
        pair.1.notify_all();
        assert_eq!(t2.join().unwrap(), (6, false));
    });
}

// ---------------------------------------------------------------------------
// 18. A scoped child that ends while its runtime shuts down ends CANCELLED.

// Failed before the fix: a scoped child dropped unrun at shutdown ends its job COMPLETED (ChildBody::drop records Cancelled but never cancels the job)
#[test]
fn scoped_children_ending_during_shutdown_never_end_completed() {
    within(120, || {
        let mut completed = Vec::new();
        for round in 0..200 {
            let rt = rt2();
            let (tx, rx) = unbounded::<(fiber::JobState, u8)>();
            let (ready_tx, ready_rx) = bounded::<()>(1);
            drop(rt.handle().spawn(move || {
                fiber::scope(|s| {
                    let started = Arc::new(AtomicUsize::new(0));
                    let st = started.clone();
                    let h = s.spawn(move || {
                        st.store(1, SeqCst);
                        if fiber::sleep(Duration::from_secs(3600)).is_err() {
                            st.store(2, SeqCst);
                        }
                    });
                    h.job().invoke_on_completion(move |state| {
                        tx.send((state, started.load(SeqCst) as u8)).unwrap();
                    });
                    ready_tx.send(()).unwrap();
                    let _ = h.join();
                });
            }));
            ready_rx.recv().unwrap();
            drop(rt);
            let (state, started) = rx.recv().unwrap();
            if state != fiber::JobState::Cancelled {
                completed.push((round, state, started));
            }
        }
        assert!(
            completed.is_empty(),
            "scoped children that ended during the shutdown ended (round, state, body started 1 / saw its cancel 2): {completed:?}"
        );
    });
}
