//! Review 72: runtime shutdown (the drop of a `Runtime`,
//! `Runtime::shutdown_timeout`, a `Handle` used during and after the
//! shutdown, `FIBER_SHUTDOWN_TIMEOUT_MS` against the builder's grace) while
//! user work is parked in every place at once, as a user of tokio, Go or
//! `std::thread` reads the docs: scope owners parked in joins of scopes
//! nested three deep (`scope`, `try_scope`, `supervisor_scope`), children
//! parked in bounded, rendezvous and unbounded channel operations, in
//! `select!` with timer arms and `default(Duration::MAX)`, in
//! `fiber::sync` lock, condvar and barrier waits, in `fiber::net` accepts
//! and reads, in `sleep(Duration::MAX)`, in joins of fibers and `Job`s,
//! fibers spinning on `yield_now` or ignoring their cancellation, fibers
//! whose destructors block (a fiber lock, a channel receive, a sleep) or
//! panic, and plain threads that spawn, `block_on`, join and use channels
//! while the runtime goes away. What must hold: the shutdown returns
//! within the grace time plus a bounded time, every destructor runs
//! exactly once (counted), no channel value is lost or duplicated, no
//! plain thread hangs (it gets an error or a panic naming the shutdown),
//! and nothing aborts. Found: a destructor unwound at teardown that locks
//! a `fiber::sync::Mutex` an older fiber still holds aborts the process
//! (teardown would unwind that holder next and free the lock); a
//! destructor that returned from its cancellation and waits for a lock
//! through the grace time is itself unwound out of `Mutex::lock` at
//! teardown when a second such destructor waits too (cut short, though
//! the same teardown frees the lock). Both are fixed: the first wait
//! parks while the pass unwinds the holder, and teardown leaves lock waits
//! made in clean-up parked while anything else can run.

use crate::common::*;

use fiber::chan::{after, bounded, unbounded};
use fiber::sync::{Barrier, Condvar, Mutex, RwLock};
use std::io::Read;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Counts what was made and what was dropped.
#[derive(Clone, Default)]
struct Ledger {
    made: Arc<AtomicUsize>,
    dropped: Arc<AtomicUsize>,
}

impl Ledger {
    fn token(&self) -> Token {
        self.made.fetch_add(1, SeqCst);
        Token {
            dropped: self.dropped.clone(),
        }
    }

    fn made(&self) -> usize {
        self.made.load(SeqCst)
    }

    fn dropped(&self) -> usize {
        self.dropped.load(SeqCst)
    }
}

/// A value that counts its drop in its ledger.
struct Token {
    dropped: Arc<AtomicUsize>,
}

impl Drop for Token {
    fn drop(&mut self) {
        self.dropped.fetch_add(1, SeqCst);
    }
}

/// Wait on a plain thread (up to 20 s) until `cond` holds.
fn thread_wait(what: &str, cond: impl Fn() -> bool) {
    let t = Instant::now();
    while !cond() {
        assert!(t.elapsed() < Duration::from_secs(20), "timed out waiting for {what}");
        std::thread::sleep(ms(2));
    }
}

/// A bound for the drop of a runtime: its grace time, the 2 s worker
/// bound, and generous slack for a loaded 2-core machine.
fn drop_bound(grace: Duration) -> Duration {
    grace + Duration::from_secs(12)
}

/// Ignore every cancellation and keep sleeping (teardown must unwind it).
fn stubborn() {
    stubborn_sleep()
}

/// Everything the parked tree shares: the ledger, how many fibers entered
/// their parking call, and the objects they park on.
struct Places {
    ledger: Ledger,
    entered: AtomicUsize,
    lock: Mutex<u32>,
    rw: RwLock<u32>,
    cv_lock: Mutex<bool>,
    cv: Condvar,
    barrier: Barrier,
    listener: fiber::net::TcpListener,
    /// The client end of a connection whose server end a fiber reads.
    client: std::sync::Mutex<Option<std::net::TcpStream>>,
}

impl Places {
    fn new(ledger: &Ledger) -> Arc<Places> {
        let listener = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
        Arc::new(Places {
            ledger: ledger.clone(),
            entered: AtomicUsize::new(0),
            lock: Mutex::new(0),
            rw: RwLock::new(0),
            cv_lock: Mutex::new(false),
            cv: Condvar::new(),
            barrier: Barrier::new(3),
            listener,
            client: std::sync::Mutex::new(None),
        })
    }

    fn enter(&self) {
        self.entered.fetch_add(1, SeqCst);
    }
}

/// How many fibers of [`parked_tree`] call [`Places::enter`].
const TREE_ENTERS: usize = 21;

/// In a fiber: a scope, a `try_scope` inside one of its children and a
/// `supervisor_scope` inside one of those, with children parked in every
/// kind of wait. Each fiber holds a token; values in channels are tokens.
fn parked_tree(p: &Arc<Places>) -> u32 {
    let _own = p.ledger.token();
    let (tx_b, rx_b) = bounded::<Token>(2);
    let (tx_r, rx_r) = bounded::<Token>(0);
    let (_tx_u, rx_u) = unbounded::<Token>();
    // One value waits in the bounded channel, for nobody.
    tx_b.send(p.ledger.token()).unwrap();
    fiber::scope(|s| {
        // Level 1: channel waits, a lock holder and its waiter, sleep(MAX).
        s.spawn(|| {
            let _t = p.ledger.token();
            p.enter();
            let _ = rx_u.recv();
        });
        s.spawn(|| {
            let _t = p.ledger.token();
            p.enter();
            let v = p.ledger.token();
            if let Err(e) = tx_r.send(v) {
                drop(e);
            }
        });
        s.spawn(|| {
            let _t = p.ledger.token();
            // The bounded channel holds one; fill it and park on the third.
            let _ = tx_b.send(p.ledger.token());
            p.enter();
            let _ = tx_b.send(p.ledger.token());
        });
        s.spawn(|| {
            let _t = p.ledger.token();
            let _g = p.lock.lock().unwrap();
            p.enter();
            let _ = fiber::sleep(Duration::MAX);
        });
        s.spawn(|| {
            let _t = p.ledger.token();
            while p.lock.try_lock().is_ok() {
                // The holder has not taken it yet.
                if fiber::sleep(ms(1)).is_err() {
                    return;
                }
            }
            p.enter();
            let _g = p.lock.lock().unwrap();
        });
        s.spawn(|| {
            let _t = p.ledger.token();
            p.enter();
            let _ = fiber::sleep(Duration::MAX);
        });
        // Level 2: a try_scope.
        s.spawn(|| {
            let _t = p.ledger.token();
            let r: Result<(), String> = fiber::try_scope(|ts| {
                ts.spawn(|| {
                    let _t = p.ledger.token();
                    p.enter();
                    fiber::select! {
                        recv(rx_r) -> v => drop(v),
                        recv(after(Duration::from_secs(3600))) -> _ => {},
                    }
                    Ok(())
                });
                ts.spawn(|| {
                    let _t = p.ledger.token();
                    p.enter();
                    fiber::select! {
                        recv(rx_b) -> v => drop(v),
                        default(Duration::MAX) => {},
                    }
                    Ok(())
                });
                ts.spawn(|| {
                    let _t = p.ledger.token();
                    let g = p.cv_lock.lock().unwrap();
                    p.enter();
                    let _g = p.cv.wait_while(g, |ready| !*ready);
                    Ok(())
                });
                ts.spawn(|| {
                    let _t = p.ledger.token();
                    p.enter();
                    let _ = p.barrier.wait();
                    Ok(())
                });
                ts.spawn(|| {
                    let _t = p.ledger.token();
                    let _r = p.rw.read().unwrap();
                    p.enter();
                    let _ = fiber::sleep(Duration::MAX);
                    Ok(())
                });
                ts.spawn(|| {
                    let _t = p.ledger.token();
                    while p.rw.try_write().is_ok() {
                        if fiber::sleep(ms(1)).is_err() {
                            return Ok(());
                        }
                    }
                    p.enter();
                    let _w = p.rw.write().unwrap();
                    Ok(())
                });
                // Level 3: a supervisor scope.
                ts.spawn(|| {
                    let _t = p.ledger.token();
                    fiber::supervisor_scope(|ss| {
                        ss.spawn(|| {
                            let _t = p.ledger.token();
                            let other = {
                                let t = p.ledger.token();
                                fiber::spawn(move || {
                                    let _t = t;
                                    let _ = fiber::sleep(Duration::MAX);
                                })
                            };
                            p.enter();
                            let _ = other.join();
                        });
                        ss.spawn(|| {
                            let _t = p.ledger.token();
                            let job = fiber::Job::new(None);
                            let t = p.ledger.token();
                            let child = job.spawn(move || {
                                let _t = t;
                                let _ = fiber::sleep(Duration::MAX);
                            });
                            p.enter();
                            let _ = job.join();
                            drop(child);
                        });
                        ss.spawn(|| {
                            let _t = p.ledger.token();
                            p.enter();
                            // Spins on yield_now, ignoring its cancellation.
                            loop {
                                let _ = fiber::yield_now();
                            }
                        });
                        ss.spawn(|| {
                            let _t = p.ledger.token();
                            p.enter();
                            let _ = p.listener.accept();
                        });
                        ss.spawn(|| {
                            let _t = p.ledger.token();
                            let addr = p.listener.local_addr().unwrap();
                            let client = std::net::TcpStream::connect(addr).unwrap();
                            // Queued for the accept above (taken or not).
                            *p.client.lock().unwrap() = Some(client);
                            p.enter();
                            let _ = fiber::sleep(Duration::MAX);
                        });
                        ss.spawn(|| {
                            let _t = p.ledger.token();
                            p.enter();
                            stubborn();
                        });
                        ss.spawn(|| {
                            let _t = p.ledger.token();
                            p.enter();
                            // A read on a connection nobody writes to.
                            let l = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
                            let c = fiber::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
                            let (mut server, _) = l.accept().unwrap();
                            let mut buf = [0u8; 8];
                            let _ = server.read(&mut buf);
                            drop(c);
                        });
                    });
                    Ok(())
                });
                p.enter();
                Ok(())
            });
            drop(r);
        });
        p.enter();
        7
    })
}

/// Build the tree on `rt`, wait until every fiber of it entered its wait
/// and the runtime shows them parked, then return the owner's handle.
fn start_tree(rt: &fiber::Runtime, p: &Arc<Places>) -> fiber::JoinHandle<u32> {
    let p2 = p.clone();
    let h = rt.handle().spawn(move || parked_tree(&p2));
    thread_wait("every fiber of the tree entered its wait", || {
        p.entered.load(SeqCst) >= TREE_ENTERS
    });
    // All but the yield_now spinner park (and the one accepting may
    // take the connection): most of the tree is parked.
    wait_parked(rt, TREE_ENTERS - 4);
    h
}

// ---------------------------------------------------------------------------
// 1. The whole tree, dropped.

#[test]
fn dropping_a_runtime_with_a_three_deep_scope_tree_parked_everywhere_drops_every_value_once() {
    within(120, || {
        for round in 0..3 {
            let ledger = Ledger::default();
            let p = Places::new(&ledger);
            let rt = rt2();
            let grace = rt.config().shutdown_timeout;
            let owner = start_tree(&rt, &p);
            let t = Instant::now();
            drop(rt);
            let took = t.elapsed();
            assert!(took < drop_bound(grace), "round {round}: drop took {took:?}");
            let r = owner.join();
            assert!(
                matches!(r, Ok(7)) || r.as_ref().is_err_and(|e| e.is_cancelled()),
                "round {round}: the tree's owner ended {r:?}"
            );
            drop(p);
            assert_eq!(
                ledger.dropped(),
                ledger.made(),
                "round {round}: every token (fibers' and channels') dropped exactly once"
            );
        }
    });
}

// ---------------------------------------------------------------------------
// 2. The same tree under a plain thread's block_on, shut down by
//    shutdown_timeout with a short grace.

#[test]
fn shutdown_timeout_releases_a_plain_threads_block_on_over_the_tree_and_drops_every_value_once() {
    within(120, || {
        let ledger = Ledger::default();
        let p = Places::new(&ledger);
        let rt = rt_fixed_grace(2, Duration::from_secs(60));
        let handle = rt.handle();
        let p2 = p.clone();
        let blocked = std::thread::spawn(move || {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handle.block_on(|| parked_tree(&p2))))
        });
        thread_wait("every fiber of the tree entered its wait", || {
            p.entered.load(SeqCst) >= TREE_ENTERS
        });
        wait_parked(&rt, TREE_ENTERS - 4);
        let t = Instant::now();
        rt.shutdown_timeout(ms(100));
        let took = t.elapsed();
        // The builder's 60 s grace is replaced by 100 ms.
        assert!(took < drop_bound(ms(100)), "shutdown_timeout(100 ms) took {took:?}");
        let r = blocked.join().unwrap();
        match r {
            Ok(v) => assert_eq!(v, 7),
            Err(payload) => {
                let msg = hold::message(payload);
                assert!(msg.contains("cancel"), "block_on's panic names the cancellation: {msg}");
            }
        }
        drop(p);
        assert_eq!(ledger.dropped(), ledger.made(), "every token dropped exactly once");
    });
}

// ---------------------------------------------------------------------------
// 3. Destructors that block: a fiber lock, a channel receive, a sleep.

/// How a [`Blocking`] destructor waits.
#[derive(Clone, Copy, Debug)]
enum DropWait {
    /// Lock `Shared::lock` (which a stubborn fiber may hold).
    Lock,
    /// Receive from a channel nobody sends on (its sender kept alive).
    Recv,
    /// Receive from a channel that holds a value.
    RecvReady,
    /// Sleep 20 ms.
    Sleep,
    /// Send on a rendezvous channel a plain thread receives from.
    SendToThread,
}

struct DropShared {
    lock: Mutex<u32>,
    idle_tx: fiber::chan::Sender<Token>,
    idle_rx: fiber::chan::Receiver<Token>,
    ready_rx: fiber::chan::Receiver<Token>,
    out_tx: fiber::chan::Sender<Token>,
    ledger: Ledger,
    started: AtomicUsize,
    finished: AtomicUsize,
    /// Per destructor: how it waits, whether it began during an unwind,
    /// whether it reached its end.
    log: std::sync::Mutex<Vec<(DropWait, bool, bool)>>,
}

/// A destructor that waits as `how`, counting its start and its end.
struct Blocking {
    how: DropWait,
    shared: Arc<DropShared>,
    _t: Token,
}

impl Drop for Blocking {
    fn drop(&mut self) {
        let s = &self.shared;
        s.started.fetch_add(1, SeqCst);
        let at = {
            let mut log = s.log.lock().unwrap();
            log.push((self.how, std::thread::panicking(), false));
            log.len() - 1
        };
        match self.how {
            DropWait::Lock => {
                let g = s.lock.lock();
                drop(g);
            }
            DropWait::Recv => drop(s.idle_rx.recv_timeout(Duration::from_secs(3600))),
            DropWait::RecvReady => drop(s.ready_rx.recv()),
            DropWait::Sleep => drop(fiber::sleep(ms(20))),
            DropWait::SendToThread => {
                if let Err(e) = s.out_tx.send(s.ledger.token()) {
                    drop(e);
                }
            }
        }
        s.log.lock().unwrap()[at].2 = true;
        s.finished.fetch_add(1, SeqCst);
    }
}

#[test]
fn destructors_that_lock_receive_sleep_and_send_at_shutdown_run_once_each_and_end() {
    within(120, || {
        for round in 0..3 {
            let ledger = Ledger::default();
            let (idle_tx, idle_rx) = bounded::<Token>(1);
            let (ready_tx, ready_rx) = unbounded::<Token>();
            let (out_tx, out_rx) = bounded::<Token>(0);
            let hows = [
                DropWait::Lock,
                DropWait::Recv,
                DropWait::RecvReady,
                DropWait::Sleep,
                DropWait::SendToThread,
            ];
            for _ in 0..hows.len() * 2 {
                ready_tx.send(ledger.token()).unwrap();
            }
            let shared = Arc::new(DropShared {
                lock: Mutex::new(0),
                idle_tx,
                idle_rx,
                ready_rx,
                out_tx,
                ledger: ledger.clone(),
                started: AtomicUsize::new(0),
                finished: AtomicUsize::new(0),
                log: std::sync::Mutex::new(Vec::new()),
            });
            // A plain thread takes what the destructors send, until the
            // channel's last sender is gone.
            let receiver = std::thread::spawn(move || out_rx.iter().count());
            let rt = rt2();
            let grace = rt.config().shutdown_timeout;
            let entered = Arc::new(AtomicUsize::new(0));
            let mut expected = 0;
            for &how in &hows {
                // One that returns when cancelled (its destructor runs in
                // the grace time), one that ignores it (unwound at
                // teardown), one in a scope owned by a stubborn owner.
                let mk = |s: &Arc<DropShared>| Blocking {
                    how,
                    shared: s.clone(),
                    _t: s.ledger.token(),
                };
                let (s, e) = (shared.clone(), entered.clone());
                let b = mk(&s);
                drop(rt.handle().spawn(move || {
                    let _b = b;
                    e.fetch_add(1, SeqCst);
                    let _ = s.idle_tx.send(s.ledger.token());
                    let _ = fiber::sleep(Duration::MAX);
                }));
                // (A lock in a destructor unwound at teardown aborts when an
                // older fiber holds the lock: the ignored test in section 11.)
                if !matches!(how, DropWait::Lock) {
                    let (s, e) = (shared.clone(), entered.clone());
                    let b = mk(&s);
                    drop(rt.handle().spawn(move || {
                        let _b = b;
                        e.fetch_add(1, SeqCst);
                        stubborn();
                    }));
                    expected += 1;
                }
                if matches!(how, DropWait::Lock) {
                    // One lock waiter only: a second one's lock is unwound
                    // at teardown (the ignored test in section 12).
                    expected += 1;
                    continue;
                }
                let (s, e) = (shared.clone(), entered.clone());
                let b = mk(&s);
                drop(rt.handle().spawn(move || {
                    fiber::scope(|sc| {
                        sc.spawn(|| {
                            let _b = b;
                            e.fetch_add(1, SeqCst);
                            let _ = s.idle_rx.recv();
                        });
                        stubborn();
                    })
                }));
                expected += 2;
            }
            // A stubborn fiber holds the lock through the shutdown; it is the
            // youngest, so teardown (descending ids) unwinds it first.
            {
                let (s, e) = (shared.clone(), entered.clone());
                drop(rt.handle().spawn(move || {
                    let _g = s.lock.lock().unwrap();
                    e.fetch_add(1, SeqCst);
                    stubborn();
                }));
            }
            thread_wait("every fiber entered", || entered.load(SeqCst) > expected);
            wait_parked(&rt, expected + 1);
            let t = Instant::now();
            drop(rt);
            let took = t.elapsed();
            assert!(took < drop_bound(grace), "round {round}: drop took {took:?}");
            let started = shared.started.load(SeqCst);
            let finished = shared.finished.load(SeqCst);
            let log = shared.log.lock().unwrap().clone();
            drop(shared);
            let received = receiver.join().unwrap();
            drop(ready_tx);
            assert_eq!(
                started, expected,
                "round {round}: every blocking destructor started once"
            );
            assert_eq!(finished, expected, "round {round}: and ran to its end: {log:?}");
            assert!(received <= 3, "round {round}: {received} values received");
            assert_eq!(
                ledger.dropped(),
                ledger.made(),
                "round {round}: every token dropped once"
            );
        }
    });
}

// ---------------------------------------------------------------------------
// 4. Destructors that panic while their fiber returns from its
//    cancellation (not during an unwind: that aborts, as documented).

struct PanicOnDrop(#[allow(dead_code)] Token);

impl Drop for PanicOnDrop {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            panic!("review72: a destructor panics at shutdown");
        }
    }
}

#[test]
fn destructors_that_panic_as_cancelled_fibers_return_at_shutdown_fail_their_scopes_without_abort() {
    in_child(
        "destructors_that_panic_as_cancelled_fibers_return_at_shutdown_fail_their_scopes_without_abort",
        90,
        || {
            let ledger = Ledger::default();
            // A long grace: every fiber returns in it (it ends early once
            // they are all parked), none is unwound at teardown.
            let rt = rt_fixed_grace(2, Duration::from_secs(30));
            let entered = Arc::new(AtomicUsize::new(0));
            let (_keep, rx) = bounded::<u8>(0);
            let mut owners = Vec::new();
            for _ in 0..4 {
                let (l, e, rx1) = (ledger.clone(), entered.clone(), rx.clone());
                owners.push(rt.handle().spawn(move || {
                    let rx = rx1;
                    let _own = l.token();
                    fiber::scope(|s| {
                        for _ in 0..3 {
                            s.spawn(|| {
                                let _p = PanicOnDrop(l.token());
                                e.fetch_add(1, SeqCst);
                                let _ = rx.recv();
                            });
                        }
                        let _ = rx.recv();
                    })
                }));
                let (l, e, rx2) = (ledger.clone(), entered.clone(), rx.clone());
                owners.push(rt.handle().spawn(move || {
                    let rx = rx2;
                    let _p = PanicOnDrop(l.token());
                    e.fetch_add(1, SeqCst);
                    let _ = rx.recv();
                }));
            }
            thread_wait("every fiber entered", || entered.load(SeqCst) >= 16);
            wait_parked(&rt, 20);
            let t = Instant::now();
            drop(rt);
            assert!(t.elapsed() < Duration::from_secs(20), "drop took {:?}", t.elapsed());
            for h in owners {
                let e = h.join().unwrap_err();
                assert!(e.is_panic() || e.is_cancelled(), "{e}");
            }
            assert_eq!(ledger.dropped(), ledger.made(), "every token dropped once");
        },
    );
}

// ---------------------------------------------------------------------------
// 5. Plain threads using the handle and channels during and after the
//    shutdown.

#[test]
fn plain_threads_spawning_blocking_on_joining_and_using_channels_through_the_drop_all_return() {
    within(120, || {
        let ledger = Ledger::default();
        let rt = rt2();
        let grace = rt.config().shutdown_timeout;
        let handle = rt.handle();
        let stop = Arc::new(AtomicBool::new(false));
        let ran = Arc::new(AtomicUsize::new(0));
        // A spawner: every closure it hands over runs or is dropped, once;
        // every handle it gets joins.
        let spawner = {
            let (handle, stop, l, ran) = (handle.clone(), stop.clone(), ledger.clone(), ran.clone());
            std::thread::spawn(move || {
                let mut handles = Vec::new();
                let mut refused = 0usize;
                while !stop.load(SeqCst) || refused == 0 {
                    let t = l.token();
                    let ran = ran.clone();
                    match handle.try_spawn(move || {
                        let _t = t;
                        ran.fetch_add(1, SeqCst);
                        let _ = fiber::sleep(Duration::MAX);
                    }) {
                        Ok(h) => handles.push(h),
                        Err(_) => refused += 1,
                    }
                    if handles.len() > 2000 {
                        std::thread::sleep(ms(1));
                    }
                }
                let n = handles.len();
                for h in handles {
                    let r = h.join();
                    assert!(r.as_ref().is_err_and(|e| e.is_cancelled()), "{r:?}");
                }
                (n, refused)
            })
        };
        // A block_on caller: each root returns, or the call panics naming
        // the shutdown.
        let blocker = {
            let (handle, stop) = (handle.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut messages = Vec::new();
                while !stop.load(SeqCst) || messages.is_empty() {
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        handle.block_on(|| fiber::sleep(Duration::MAX).is_err())
                    }));
                    match r {
                        Ok(cancelled) => assert!(cancelled, "sleep(MAX) returned without a cancel"),
                        Err(p) => messages.push(hold::message(p)),
                    }
                }
                messages
            })
        };
        // A receiver whose senders are fibers, and a sender whose receiver is.
        let (to_thread, from_fibers) = bounded::<Token>(0);
        let (to_fiber, from_thread) = bounded::<Token>(0);
        let got = Arc::new(AtomicUsize::new(0));
        {
            let (l, tx) = (ledger.clone(), to_thread.clone());
            drop(rt.handle().spawn(move || loop {
                if tx.send(l.token()).is_err() {
                    return;
                }
            }));
            let rx = from_thread.clone();
            drop(rt.handle().spawn(move || {
                while let Ok(t) = rx.recv() {
                    drop(t);
                }
            }));
        }
        drop(to_thread);
        drop(from_thread);
        let receiver = {
            let got = got.clone();
            std::thread::spawn(move || {
                for t in from_fibers.iter() {
                    got.fetch_add(1, SeqCst);
                    drop(t);
                }
            })
        };
        let sender = {
            let l = ledger.clone();
            std::thread::spawn(move || {
                let mut returned = 0;
                loop {
                    match to_fiber.send(l.token()) {
                        Ok(()) => {}
                        Err(e) => {
                            drop(e);
                            returned += 1;
                            return returned;
                        }
                    }
                }
            })
        };
        // A joiner of a stubborn fiber, and of a Job with a parked child.
        let stubborn_h = rt.handle().spawn(stubborn);
        let joiner = std::thread::spawn(move || stubborn_h.join().map_err(|e| e.is_cancelled()));
        let (job_tx, job_rx) = std::sync::mpsc::channel();
        drop(rt.handle().spawn(move || {
            let job = fiber::Job::new(None);
            drop(job.spawn(|| fiber::sleep(Duration::MAX)));
            // No more work of its own: it ends once its child has.
            job.complete();
            job_tx.send(job).unwrap();
            let _ = fiber::sleep(Duration::MAX);
        }));
        let job = job_rx.recv().unwrap();
        let job_joiner = std::thread::spawn(move || job.join());
        thread_wait("the spawner's fibers to run", || ran.load(SeqCst) >= 50);
        std::thread::sleep(ms(50));
        let t = Instant::now();
        drop(rt);
        let took = t.elapsed();
        stop.store(true, SeqCst);
        assert!(took < drop_bound(grace), "drop took {took:?}");
        let (spawned, refused) = spawner.join().unwrap();
        assert!(spawned >= 50 && refused >= 1);
        let messages = blocker.join().unwrap();
        assert!(
            messages
                .iter()
                .any(|m| m.contains("shutting down") || m.contains("dropped")),
            "block_on after the shutdown names it: {messages:?}"
        );
        receiver.join().unwrap();
        assert_eq!(sender.join().unwrap(), 1);
        assert_eq!(
            joiner.join().unwrap(),
            Err(true),
            "the stubborn fiber's join says cancelled"
        );
        let j = job_joiner.join().unwrap();
        assert!(
            j.is_ok_and(|s| s.is_terminal()),
            "a plain thread's Job::join returns when the runtime drops: {j:?}"
        );
        // After the drop: errors, and panics that say why.
        assert!(handle.try_spawn(|| ()).is_err());
        let msg = panic_message(|| drop(handle.spawn(|| ()))).expect("Handle::spawn after the drop panics");
        assert!(msg.contains("shutting down"), "{msg}");
        let msg = panic_message(|| handle.block_on(|| ())).expect("Handle::block_on after the drop panics");
        assert!(msg.contains("shutting down"), "{msg}");
        assert_eq!(ledger.dropped(), ledger.made(), "every token dropped once");
        assert!(got.load(SeqCst) >= 1 || ledger.made() > 0);
    });
}

// ---------------------------------------------------------------------------
// 6. The grace time from the environment and from the builder.

/// A fiber stuck in a non-cancellable receive nothing ends: the shutdown
/// waits for the whole grace time, then unwinds it.
fn stuck_section(rt: &fiber::Runtime, ledger: &Ledger) {
    let l = ledger.clone();
    let (tx, rx) = bounded::<u8>(0);
    drop(rt.handle().spawn(move || {
        let _t = l.token();
        let _tx = tx;
        fiber::non_cancellable(|| {
            let _ = rx.recv();
        });
    }));
    wait_parked(rt, 1);
}

#[test]
fn fiber_shutdown_timeout_ms_sets_the_grace_and_the_builder_overrides_it() {
    let scenario = "fiber_shutdown_timeout_ms_sets_the_grace_and_the_builder_overrides_it";
    let outcome = child_outcome(scenario, 120, &[("FIBER_SHUTDOWN_TIMEOUT_MS", "400")], || {
        let ledger = Ledger::default();
        // From the environment: 400 ms.
        let rt = fiber::Runtime::builder().workers(2).build().unwrap();
        assert_eq!(rt.config().shutdown_timeout, ms(400));
        stuck_section(&rt, &ledger);
        let t = Instant::now();
        drop(rt);
        let took = t.elapsed();
        assert!(took >= ms(350), "the stuck section got its grace: {took:?}");
        assert!(took < drop_bound(ms(400)), "env grace 400 ms: drop took {took:?}");
        // The builder wins: 60 s would be a hang; 50 ms is quick.
        let rt = fiber::Runtime::builder()
            .workers(2)
            .shutdown_timeout(ms(50))
            .build()
            .unwrap();
        assert_eq!(rt.config().shutdown_timeout, ms(50));
        stuck_section(&rt, &ledger);
        let t = Instant::now();
        drop(rt);
        assert!(t.elapsed() < drop_bound(ms(50)), "builder grace: {:?}", t.elapsed());
        // shutdown_timeout wins over both.
        let rt = fiber::Runtime::builder()
            .workers(2)
            .shutdown_timeout(Duration::from_secs(3600))
            .build()
            .unwrap();
        stuck_section(&rt, &ledger);
        let t = Instant::now();
        rt.shutdown_timeout(ms(50));
        assert!(t.elapsed() < drop_bound(ms(50)), "shutdown_timeout: {:?}", t.elapsed());
        assert_eq!(ledger.dropped(), ledger.made());
    });
    if let Some((status, stderr)) = outcome {
        assert!(status.success(), "child failed ({status:?}):\n{stderr}");
    }
}

// ---------------------------------------------------------------------------
// 7. The tree with no grace at all: everything is unwound at teardown.

#[test]
fn shutdown_timeout_zero_unwinds_the_whole_parked_tree_at_teardown_dropping_every_value_once() {
    within(120, || {
        for round in 0..2 {
            let ledger = Ledger::default();
            let p = Places::new(&ledger);
            let rt = rt2();
            let owner = start_tree(&rt, &p);
            let t = Instant::now();
            rt.shutdown_timeout(Duration::ZERO);
            let took = t.elapsed();
            assert!(took < drop_bound(Duration::ZERO), "round {round}: took {took:?}");
            let r = owner.join();
            assert!(
                matches!(r, Ok(7)) || r.as_ref().is_err_and(|e| e.is_cancelled()),
                "round {round}: the tree's owner ended {r:?}"
            );
            drop(p);
            assert_eq!(
                ledger.dropped(),
                ledger.made(),
                "round {round}: every token dropped once"
            );
        }
    });
}

// ---------------------------------------------------------------------------
// 8. Waits that must take a lock back, whose lock an older stubborn fiber
//    holds when teardown reaches them first (descending ids).

#[test]
fn condvar_rwlock_and_barrier_waiters_whose_lock_an_older_stubborn_fiber_holds_are_unwound_once() {
    within(120, || {
        for grace in [Duration::ZERO, ms(200)] {
            let ledger = Ledger::default();
            let rt = rt2();
            let pair = Arc::new((Mutex::new(0u32), Condvar::new()));
            let rw = Arc::new(RwLock::new(0u32));
            let barrier = Arc::new(Barrier::new(4));
            let go = Arc::new(AtomicBool::new(false));
            let holding = Arc::new(AtomicUsize::new(0));
            // The older fibers: they take the locks only once the younger
            // ones wait, then hold them through the shutdown.
            {
                let (go2, holding2) = (go.clone(), holding.clone());
                let (pair, go, holding, l) = (pair.clone(), go.clone(), holding.clone(), ledger.clone());
                drop(rt.handle().spawn(move || {
                    let _t = l.token();
                    while !go.load(SeqCst) {
                        let _ = fiber::sleep(ms(1));
                    }
                    let _g = pair.0.lock().unwrap();
                    holding.fetch_add(1, SeqCst);
                    stubborn();
                }));
                let (rw, go, holding, l) = (rw.clone(), go2, holding2, ledger.clone());
                drop(rt.handle().spawn(move || {
                    let _t = l.token();
                    while !go.load(SeqCst) {
                        let _ = fiber::sleep(ms(1));
                    }
                    let _g = rw.read().unwrap();
                    holding.fetch_add(1, SeqCst);
                    stubborn();
                }));
            }
            let waiting = Arc::new(AtomicUsize::new(0));
            for _ in 0..3 {
                let (pair, w, l) = (pair.clone(), waiting.clone(), ledger.clone());
                drop(rt.handle().spawn(move || {
                    let _t = l.token();
                    let g = pair.0.lock().unwrap();
                    w.fetch_add(1, SeqCst);
                    // Stubborn: wait again after every wake.
                    let mut g = g;
                    loop {
                        g = match pair.1.wait(g) {
                            Ok(g) => g,
                            Err(p) => p.into_inner(),
                        };
                        *g += 1;
                    }
                }));
                let (b, w, l) = (barrier.clone(), waiting.clone(), ledger.clone());
                drop(rt.handle().spawn(move || {
                    let _t = l.token();
                    w.fetch_add(1, SeqCst);
                    let _ = b.wait();
                    stubborn();
                }));
            }
            thread_wait("the waiters", || waiting.load(SeqCst) >= 6);
            wait_parked(&rt, 6);
            go.store(true, SeqCst);
            thread_wait("the holders", || holding.load(SeqCst) >= 2);
            // A writer that parks behind the older reader.
            {
                let (rw, w, l) = (rw.clone(), waiting.clone(), ledger.clone());
                drop(rt.handle().spawn(move || {
                    let _t = l.token();
                    w.fetch_add(1, SeqCst);
                    let _g = rw.write();
                    stubborn();
                }));
            }
            thread_wait("the writer", || waiting.load(SeqCst) >= 7);
            wait_parked(&rt, 9);
            let t = Instant::now();
            rt.shutdown_timeout(grace);
            assert!(
                t.elapsed() < drop_bound(grace),
                "grace {grace:?}: took {:?}",
                t.elapsed()
            );
            assert_eq!(
                ledger.dropped(),
                ledger.made(),
                "grace {grace:?}: every token dropped once"
            );
            // The locks are usable after: nothing was left held.
            // (Poisoned is fine: a guard dropped by an unwind poisons, as in std.)
            assert!(
                !matches!(pair.0.try_lock(), Err(fiber::sync::TryLockError::WouldBlock)),
                "grace {grace:?}: the condvar's mutex is free"
            );
            assert!(
                !matches!(rw.try_write(), Err(fiber::sync::TryLockError::WouldBlock)),
                "grace {grace:?}: the rwlock is free"
            );
        }
    });
}

// ---------------------------------------------------------------------------
// 9. Channel conservation at the drop: producers and consumers of every
//    kind of channel parked in fibers, plain threads on the other side.

#[test]
fn values_in_flight_on_bounded_rendezvous_and_unbounded_channels_at_the_drop_are_neither_lost_nor_duplicated() {
    within(120, || {
        for round in 0..4 {
            let ledger = Ledger::default();
            let rt = rt2();
            let received = Arc::new(AtomicUsize::new(0));
            let sent_ok = Arc::new(AtomicUsize::new(0));
            let mut thread_sides = Vec::new();
            for cap in [Some(0usize), Some(3), None] {
                let (tx, rx) = match cap {
                    Some(c) => bounded::<Token>(c),
                    None => unbounded::<Token>(),
                };
                // Fiber producers, some stubborn, some in select loops.
                for k in 0..3 {
                    let (tx, l, ok) = (tx.clone(), ledger.clone(), sent_ok.clone());
                    drop(rt.handle().spawn(move || loop {
                        // Ok(true): a value went; Ok(false): the timer arm.
                        let r: Result<bool, ()> = match k {
                            0 => tx.send(l.token()).map(|()| true).map_err(drop),
                            1 => fiber::select! {
                                send(tx, l.token()) -> r => r.map(|()| true).map_err(drop),
                                recv(after(Duration::from_secs(3600))) -> _ => Ok(false),
                            },
                            _ => tx.send_timeout(l.token(), Duration::MAX).map(|()| true).map_err(drop),
                        };
                        match r {
                            Ok(true) => {
                                ok.fetch_add(1, SeqCst);
                                // Slow the unbounded producers down.
                                let _ = fiber::sleep(ms(1));
                            }
                            Ok(false) => {}
                            Err(()) if k == 0 => return,
                            // Stubborn: try again after an error.
                            Err(()) => {
                                let _ = fiber::sleep(Duration::MAX);
                            }
                        }
                    }));
                }
                drop(tx);
                // A plain thread takes some, then holds the receiver until
                // after the drop, then takes the rest.
                let got = received.clone();
                let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
                let t = std::thread::spawn(move || {
                    for _ in 0..20 {
                        match rx.recv() {
                            Ok(v) => {
                                got.fetch_add(1, SeqCst);
                                drop(v);
                            }
                            Err(_) => break,
                        }
                    }
                    release_rx.recv().unwrap();
                    for v in rx.iter() {
                        got.fetch_add(1, SeqCst);
                        drop(v);
                    }
                });
                thread_sides.push((t, release_tx));
            }
            std::thread::sleep(ms(30));
            let grace = if round % 2 == 0 { Duration::ZERO } else { ms(200) };
            let t = Instant::now();
            rt.shutdown_timeout(grace);
            assert!(t.elapsed() < drop_bound(grace), "round {round}: took {:?}", t.elapsed());
            for (t, release) in thread_sides {
                release.send(()).unwrap();
                t.join().unwrap();
            }
            assert_eq!(
                received.load(SeqCst),
                sent_ok.load(SeqCst),
                "round {round}: every value sent Ok was received once"
            );
            assert_eq!(
                ledger.dropped(),
                ledger.made(),
                "round {round}: every value dropped once"
            );
        }
    });
}

// ---------------------------------------------------------------------------
// 10. Destructors that spawn and join fibers during the shutdown.

/// A destructor that spawns a fiber carrying a token, and joins it.
struct SpawnsOnDrop {
    ledger: Ledger,
    joined: Arc<AtomicUsize>,
    job: bool,
    /// Per destructor: (a job's spawn, unwinding at its start, the last
    /// step it reached: 1 spawned, 2 joined).
    log: Arc<std::sync::Mutex<Vec<(bool, bool, u8)>>>,
}

impl Drop for SpawnsOnDrop {
    fn drop(&mut self) {
        let t = self.ledger.token();
        let at = {
            let mut log = self.log.lock().unwrap();
            log.push((self.job, std::thread::panicking(), 0));
            log.len() - 1
        };
        let step = |n: u8| self.log.lock().unwrap()[at].2 = n;
        if self.job {
            let job = fiber::Job::new(None);
            let h = job.spawn(move || {
                let _t = t;
                let _ = fiber::sleep(Duration::MAX);
            });
            step(1);
            job.complete();
            let _ = h.join();
            let _ = job.join();
        } else {
            let h = fiber::spawn(move || {
                let _t = t;
                let _ = fiber::sleep(Duration::MAX);
            });
            step(1);
            let _ = h.join();
        }
        step(2);
        self.joined.fetch_add(1, SeqCst);
    }
}

#[test]
fn destructors_that_spawn_and_join_fibers_during_the_shutdown_drop_every_closure_once_and_end() {
    // In a child: a spawn refused inside an unwinding destructor would abort.
    in_child(
        "destructors_that_spawn_and_join_fibers_during_the_shutdown_drop_every_closure_once_and_end",
        120,
        || {
            for grace in [Duration::ZERO, ms(200)] {
                let ledger = Ledger::default();
                let joined = Arc::new(AtomicUsize::new(0));
                let log = Arc::new(std::sync::Mutex::new(Vec::new()));
                let rt = rt2();
                let entered = Arc::new(AtomicUsize::new(0));
                let mut n = 0;
                for job in [false, true] {
                    for stubborn_body in [false, true] {
                        let d = SpawnsOnDrop {
                            ledger: ledger.clone(),
                            joined: joined.clone(),
                            job,
                            log: log.clone(),
                        };
                        let e = entered.clone();
                        drop(rt.handle().spawn(move || {
                            let _d = d;
                            e.fetch_add(1, SeqCst);
                            if stubborn_body {
                                stubborn();
                            } else {
                                let _ = fiber::sleep(Duration::MAX);
                            }
                        }));
                        // The same, as a scoped child.
                        let d = SpawnsOnDrop {
                            ledger: ledger.clone(),
                            joined: joined.clone(),
                            job,
                            log: log.clone(),
                        };
                        let e = entered.clone();
                        drop(rt.handle().spawn(move || {
                            fiber::scope(|s| {
                                s.spawn(|| {
                                    let _d = d;
                                    e.fetch_add(1, SeqCst);
                                    if stubborn_body {
                                        stubborn();
                                    } else {
                                        let _ = fiber::sleep(Duration::MAX);
                                    }
                                });
                            })
                        }));
                        n += 2;
                    }
                }
                thread_wait("every fiber entered", || entered.load(SeqCst) >= n);
                wait_parked(&rt, n);
                let t = Instant::now();
                rt.shutdown_timeout(grace);
                assert!(
                    t.elapsed() < drop_bound(grace),
                    "grace {grace:?}: took {:?}",
                    t.elapsed()
                );
                let log = log.lock().unwrap().clone();
                assert_eq!(log.len(), n, "grace {grace:?}: every destructor started once: {log:?}");
                if grace.is_zero() {
                    // No grace: a destructor caught part way on a worker
                    // (parked in its join) is unwound at teardown, as the
                    // docs say of every cancellable wait there; it still
                    // spawned its fiber, whose closure is dropped.
                    assert!(log.iter().all(|e| e.2 >= 1), "{log:?}");
                } else {
                    assert_eq!(
                        joined.load(SeqCst),
                        n,
                        "grace {grace:?}: every destructor ran to its end once: {log:?}"
                    );
                }
                assert_eq!(
                    ledger.dropped(),
                    ledger.made(),
                    "grace {grace:?}: every spawned closure dropped once"
                );
            }
        },
    );
}

// ---------------------------------------------------------------------------
// 11. A destructor unwound at teardown that locks a mutex an older
//     stubborn fiber holds: teardown unwinds that fiber next, which
//     releases the lock.

/// Locks its mutex when dropped, counting the drops that got the lock.
struct LocksOnDrop {
    lock: Arc<Mutex<u32>>,
    locked: Arc<AtomicUsize>,
}

impl Drop for LocksOnDrop {
    fn drop(&mut self) {
        let g = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.lock.lock())) {
            Ok(g) => g,
            Err(p) => {
                let what = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "an unwind without a message (the shutdown's)".into());
                eprintln!("review72: Mutex::lock in a destructor was ended by: {what}");
                std::panic::resume_unwind(p)
            }
        };
        // Poisoned is fine (the holder was unwound): the lock is ours.
        let mut g = g.unwrap_or_else(|p| p.into_inner());
        *g += 1;
        self.locked.fetch_add(1, SeqCst);
    }
}

// Failed before the fix: the process aborts ("nothing will release now") though teardown is about to unwind the holder
#[test]
fn a_destructor_unwound_at_teardown_locking_a_mutex_an_older_stubborn_fiber_holds_gets_it_without_abort() {
    in_child(
        "a_destructor_unwound_at_teardown_locking_a_mutex_an_older_stubborn_fiber_holds_gets_it_without_abort",
        60,
        || {
            let rt = rt2();
            let grace = rt.config().shutdown_timeout;
            let lock = Arc::new(Mutex::new(0u32));
            let locked = Arc::new(AtomicUsize::new(0));
            let holding = Arc::new(AtomicBool::new(false));
            {
                let (lock, holding) = (lock.clone(), holding.clone());
                // The older fiber: holds the lock, ignores its cancellation.
                drop(rt.handle().spawn(move || {
                    let _g = lock.lock().unwrap();
                    holding.store(true, SeqCst);
                    stubborn();
                }));
            }
            thread_wait("the holder", || holding.load(SeqCst));
            let d = LocksOnDrop {
                lock: lock.clone(),
                locked: locked.clone(),
            };
            // The younger one: ignores its cancellation too, so teardown
            // unwinds it (first: descending ids), and its destructor locks.
            drop(rt.handle().spawn(move || {
                let _d = d;
                stubborn();
            }));
            wait_parked(&rt, 2);
            let t = Instant::now();
            drop(rt);
            assert!(t.elapsed() < drop_bound(grace), "drop took {:?}", t.elapsed());
            assert_eq!(locked.load(SeqCst), 1, "the destructor got the lock once");
            assert_eq!(*lock.lock().unwrap_or_else(|p| p.into_inner()), 1);
        },
    );
}

// ---------------------------------------------------------------------------
// 12. A fiber that returned when cancelled and whose destructor waits for a
//     lock a younger stubborn fiber holds through the grace time.

// Failed before the fix: with two or more such destructors, teardown unwinds a later waiter out of Mutex::lock (its destructor cut short) while the lock is being handed on
#[test]
fn a_destructor_waiting_in_the_grace_for_a_lock_a_younger_stubborn_fiber_holds_gets_it_at_teardown() {
    within(120, || {
        for round in 0..6 {
            let ledger = Ledger::default();
            let rt = rt2();
            let grace = rt.config().shutdown_timeout;
            let lock = Arc::new(Mutex::new(0u32));
            let locked = Arc::new(AtomicUsize::new(0));
            let entered = Arc::new(AtomicUsize::new(0));
            let waiters = 1 + round % 3;
            for _ in 0..waiters {
                let d = LocksOnDrop {
                    lock: lock.clone(),
                    locked: locked.clone(),
                };
                let (l, e) = (ledger.clone(), entered.clone());
                // Returns when cancelled; its destructor then waits for
                // the lock.
                drop(rt.handle().spawn(move || {
                    let _t = l.token();
                    let _d = d;
                    e.fetch_add(1, SeqCst);
                    let _ = fiber::sleep(Duration::MAX);
                }));
            }
            thread_wait("the waiters", || entered.load(SeqCst) == waiters);
            {
                let (lock, l, e) = (lock.clone(), ledger.clone(), entered.clone());
                drop(rt.handle().spawn(move || {
                    let _t = l.token();
                    let _g = lock.lock().unwrap();
                    e.fetch_add(1, SeqCst);
                    stubborn();
                }));
            }
            thread_wait("the holder", || entered.load(SeqCst) == waiters + 1);
            wait_parked(&rt, waiters + 1);
            let t = Instant::now();
            drop(rt);
            assert!(
                t.elapsed() < drop_bound(grace),
                "round {round}: drop took {:?}",
                t.elapsed()
            );
            assert_eq!(
                ledger.dropped(),
                ledger.made(),
                "round {round}: every token dropped once"
            );
            assert_eq!(
                locked.load(SeqCst),
                waiters,
                "round {round}: every destructor got the lock (waiters: {waiters})"
            );
        }
    });
}

// ---------------------------------------------------------------------------
// 13. Plain threads in Handle::block_on when the runtime drops, with roots
//     that return, ignore their cancellation, or wait in nested scopes.

#[test]
fn block_on_callers_whose_roots_return_ignore_cancellation_or_wait_in_scopes_all_return_at_the_drop() {
    within(120, || {
        let ledger = Ledger::default();
        let rt = rt2();
        let grace = rt.config().shutdown_timeout;
        let entered = Arc::new(AtomicUsize::new(0));
        let mut callers = Vec::new();
        for kind in 0..5u32 {
            let (handle, l, e) = (rt.handle(), ledger.clone(), entered.clone());
            callers.push(std::thread::spawn(move || {
                let borrowed = l.token();
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    handle.block_on(|| {
                        let _t = l.token();
                        let _b = &borrowed;
                        e.fetch_add(1, SeqCst);
                        match kind {
                            // Returns when cancelled.
                            0 => u32::from(fiber::sleep(Duration::MAX).is_err()),
                            // A select that ignores its cancellation.
                            1 => loop {
                                let (_tx, rx) = bounded::<u8>(0);
                                fiber::select! {
                                    recv(rx) -> _ => {},
                                    default(Duration::MAX) => {},
                                }
                            },
                            // Nested scopes, a stubborn grandchild.
                            2 => fiber::scope(|s| {
                                s.spawn(|| {
                                    fiber::supervisor_scope(|ss| {
                                        ss.spawn(|| {
                                            let _t = l.token();
                                            stubborn()
                                        });
                                    })
                                });
                                2
                            }),
                            // A join of a Job whose child is stubborn.
                            3 => {
                                let job = fiber::Job::new(None);
                                let lt = l.token();
                                drop(job.spawn(move || {
                                    let _t = lt;
                                    stubborn()
                                }));
                                job.complete();
                                u32::from(job.join().is_err()) + 3
                            }
                            // A yield_now spinner that ignores its cancellation.
                            _ => loop {
                                let _ = fiber::yield_now();
                            },
                        }
                    })
                }))
                .map_err(hold::message)
            }));
        }
        thread_wait("every root entered", || entered.load(SeqCst) >= 5);
        wait_parked(&rt, 4);
        let t = Instant::now();
        drop(rt);
        let took = t.elapsed();
        assert!(took < drop_bound(grace), "drop took {took:?}");
        for (kind, c) in callers.into_iter().enumerate() {
            match c.join().unwrap() {
                Ok(v) => assert!(kind <= 3, "root {kind} returned {v}"),
                Err(msg) => assert!(
                    msg.contains("cancel") || msg.contains("shut"),
                    "root {kind}: block_on's panic names the cause: {msg}"
                ),
            }
        }
        assert_eq!(ledger.dropped(), ledger.made(), "every token dropped once");
    });
}

// ---------------------------------------------------------------------------
// 14. Socket waits inside non_cancellable keep the grace time, then are
//     unwound; their sockets are closed.

#[test]
fn non_cancellable_accepts_and_reads_keep_the_grace_then_are_unwound_and_their_sockets_closed() {
    within(120, || {
        let ledger = Ledger::default();
        let rt = rt_fixed_grace(2, ms(400));
        let listener = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let reader_l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let peer = std::net::TcpStream::connect(reader_l.local_addr().unwrap()).unwrap();
        let (server_side, _) = reader_l.accept().unwrap();
        let entered = Arc::new(AtomicUsize::new(0));
        {
            let (l, e) = (ledger.clone(), entered.clone());
            drop(rt.handle().spawn(move || {
                let _t = l.token();
                e.fetch_add(1, SeqCst);
                fiber::non_cancellable(|| drop(listener.accept()));
            }));
        }
        let (l, e) = (ledger.clone(), entered.clone());
        let (ptx, prx) = std::sync::mpsc::channel();
        drop(rt.handle().spawn(move || {
            let _t = l.token();
            // Read from the accepted side through fiber's type.
            let mut own = fiber::net::TcpStream::from_std(server_side).unwrap();
            ptx.send(()).unwrap();
            e.fetch_add(1, SeqCst);
            let mut buf = [0u8; 4];
            fiber::non_cancellable(|| drop(own.read(&mut buf)));
        }));
        prx.recv().unwrap();
        thread_wait("both entered", || entered.load(SeqCst) == 2);
        wait_parked(&rt, 2);
        let t = Instant::now();
        drop(rt);
        let took = t.elapsed();
        assert!(
            took >= ms(300),
            "socket waits in non_cancellable keep the grace: {took:?}"
        );
        assert!(took < drop_bound(ms(400)), "drop took {took:?}");
        assert_eq!(ledger.dropped(), ledger.made(), "both fibers' tokens dropped once");
        // The listener is closed: a connect is refused.
        assert!(std::net::TcpStream::connect(addr).is_err(), "the listener was closed");
        // The read side is closed: the peer reads end of file.
        let mut peer = peer;
        peer.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut buf = [0u8; 4];
        assert_eq!(peer.read(&mut buf).unwrap(), 0, "the reader's socket was closed");
    });
}
