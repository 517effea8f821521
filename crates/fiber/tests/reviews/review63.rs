//! Review 63: the most recently changed behaviour. An unwinding fiber's
//! `yield_now` loop that holds its thread for 200 ms and then switches
//! away (chains of such pollers on one and two workers, pinned, beside a
//! blocking call, inside scopes, at shutdown); a runtime dropped or
//! `block_on` called from odd threads (the runtime's monitor thread via a
//! tracing layer, a worker between fibers, a blocking-pool thread, another
//! runtime's worker, a plain thread's thread-local destructor); the
//! `Semaphore` release CAS at `MAX_PERMITS` under concurrent takers,
//! adders and cancelled waiters; and the reaper round that keeps a fiber
//! whose blocking call returned as the round gave up on it. Scenarios that
//! install a global subscriber, may abort or may hang run in a child
//! process.

use crate::common::*;

use crate::common::shutdown::{counter, Tracked};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::span::Id;
use tracing::Subscriber;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

// ---------------------------------------------------------------------------
// (a) `yield_now` polling loops in destructors of unwinding fibers.

/// A destructor that (optionally) sets `set`, then polls with `yield_now`
/// until `wait` is set; counts itself in `done` once the flag is seen, or
/// in `gave_up` after 10 s (so a failure is reported, not a hang).
struct PollFlag {
    wait: Arc<AtomicBool>,
    set: Option<Arc<AtomicBool>>,
    done: Arc<AtomicUsize>,
    gave_up: Arc<AtomicUsize>,
}

impl Drop for PollFlag {
    fn drop(&mut self) {
        if let Some(s) = &self.set {
            s.store(true, SeqCst);
        }
        let start = Instant::now();
        while !self.wait.load(SeqCst) {
            let _ = fiber::yield_now();
            if start.elapsed() > Duration::from_secs(10) {
                self.gave_up.fetch_add(1, SeqCst);
                return;
            }
        }
        self.done.fetch_add(1, SeqCst);
    }
}

fn flags(n: usize) -> Vec<Arc<AtomicBool>> {
    (0..n).map(|_| Arc::new(AtomicBool::new(false))).collect()
}

/// `n` fibers panic one after the other on the runtime of the caller; the
/// destructor of fiber `i` sets flag `i - 1` and polls flag `i` with
/// `yield_now`; flag `n - 1` is set by a plain fiber spawned last, which
/// also records whether it saw `panicking()` (several unwinds are parked on
/// its thread then). Every panic reaches its joiner with its own message,
/// every destructor sees its flag, and afterwards a fresh fiber finds its
/// thread clean.
fn chain_of_unwinding_pollers(n: usize, pinned: bool) {
    let f = flags(n);
    let done = Arc::new(AtomicUsize::new(0));
    let gave_up = Arc::new(AtomicUsize::new(0));
    let spawn = |body: Box<dyn FnOnce() + Send>| {
        if pinned {
            fiber::spawn_pinned(body)
        } else {
            fiber::spawn(body)
        }
    };
    // Each fiber has started (and is about to panic) before the next one
    // is spawned, whatever order the scheduler prefers.
    let (started_tx, started_rx) = fiber::chan::bounded::<()>(n);
    let start = Instant::now();
    let hs: Vec<_> = (0..n)
        .map(|i| {
            let guard = PollFlag {
                wait: f[i].clone(),
                set: i.checked_sub(1).map(|p| f[p].clone()),
                done: done.clone(),
                gave_up: gave_up.clone(),
            };
            let started = started_tx.clone();
            let h = spawn(Box::new(move || {
                let _g = guard;
                started.send(()).unwrap();
                std::panic::panic_any(format!("boom {i}"));
            }));
            started_rx.recv().unwrap();
            h
        })
        .collect();
    let last = f[n - 1].clone();
    let saw_panicking = Arc::new(AtomicBool::new(false));
    let sp = saw_panicking.clone();
    let setter = spawn(Box::new(move || {
        sp.store(fiber::core::panicking(), SeqCst);
        last.store(true, SeqCst);
    }));
    for (i, h) in hs.into_iter().enumerate() {
        let e = h.join().unwrap_err();
        assert!(e.is_panic(), "fiber {i}: {e}");
        assert_eq!(
            e.into_panic().downcast_ref::<String>().map(String::as_str),
            Some(format!("boom {i}").as_str())
        );
    }
    setter.join().unwrap();
    assert_eq!(gave_up.load(SeqCst), 0, "a polling destructor never saw its flag");
    assert_eq!(done.load(SeqCst), n);
    // Fiber 0 polled until fiber 1's destructor ran: the path was taken.
    let took = start.elapsed();
    eprintln!("R63 chain of {n} (pinned {pinned}): {took:?}");
    assert!(took < Duration::from_secs(20), "{took:?}");
    assert!(
        !saw_panicking.load(SeqCst),
        "the setter looked panicking beside parked unwinds"
    );
    let clean = (0..4)
        .map(|_| spawn(Box::new(|| assert!(!std::thread::panicking()))))
        .collect::<Vec<_>>();
    for c in clean {
        c.join().expect("a fresh fiber found its thread still panicking");
    }
}

/// Four chained pollers on one fixed worker (each waits for the next one's
/// destructor): the 200 ms bound lets every one of them run.
#[test]
fn a_chain_of_unwinding_yield_pollers_on_one_worker_all_finish() {
    let start = Instant::now();
    within(30, || rt1().block_on(|| chain_of_unwinding_pollers(4, false)));
    assert!(start.elapsed() < Duration::from_secs(10), "{:?}", start.elapsed());
}

/// The same chain of pinned fibers on two fixed workers.
#[test]
fn a_chain_of_pinned_unwinding_yield_pollers_on_two_workers_all_finish() {
    within(30, || rt2().block_on(|| chain_of_unwinding_pollers(6, true)));
}

/// The same chain, unpinned, on two fixed workers (the pollers are kept on
/// their worker for their unwinds, their neighbours may be stolen).
#[test]
fn a_chain_of_unwinding_yield_pollers_on_two_workers_all_finish() {
    within(30, || rt2().block_on(|| chain_of_unwinding_pollers(6, false)));
}

/// The same chain on a growing runtime (one worker, up to three): the
/// monitor sees the polling worker as stuck, drains it and adds another,
/// while the pollers switching away are bound to the drained worker.
#[test]
fn a_chain_of_unwinding_yield_pollers_on_a_growing_runtime_all_finish() {
    within(30, || {
        let rt = fiber::Runtime::builder()
            .workers(1)
            .max_workers(3)
            .shutdown_timeout(ms(300))
            .build()
            .unwrap();
        rt.block_on(|| chain_of_unwinding_pollers(5, false));
        let grew = rt.stats().scale_ups;
        eprintln!("R63 growing chain: {grew} growths");
    });
}

/// The chain of [`chain_of_unwinding_pollers`] spawned from outside on one
/// fixed worker with a 3 s grace, and the runtime dropped as soon as the
/// first poller runs: the fibers not started yet have their closures
/// (and so their guards) dropped unrun or run; either way every guard's
/// destructor sees its flag and the drop ends well within the grace.
#[test]
fn a_runtime_dropped_as_a_chain_of_unwinding_pollers_starts() {
    in_child("a_runtime_dropped_as_a_chain_of_unwinding_pollers_starts", 60, || {
        within(30, || {
            const N: usize = 4;
            let rt = rt_fixed_grace(1, Duration::from_secs(3));
            let f = flags(N);
            let done = Arc::new(AtomicUsize::new(0));
            let gave_up = Arc::new(AtomicUsize::new(0));
            let (first_tx, first_rx) = mpsc::channel::<()>();
            let first_tx = Mutex::new(Some(first_tx));
            let first_tx = Arc::new(first_tx);
            for i in 0..N {
                let guard = PollFlag {
                    wait: f[i].clone(),
                    set: i.checked_sub(1).map(|p| f[p].clone()),
                    done: done.clone(),
                    gave_up: gave_up.clone(),
                };
                let ft = first_tx.clone();
                drop(rt.spawn(move || {
                    let _g = guard;
                    if let Some(tx) = ft.lock().unwrap().take() {
                        tx.send(()).unwrap();
                    }
                    panic!("boom {i}");
                }));
            }
            // Sets the last flag when dropped: whether its fiber runs or
            // is cancelled before it starts (its closure dropped unrun).
            struct SetOnDrop(Arc<AtomicBool>);
            impl Drop for SetOnDrop {
                fn drop(&mut self) {
                    self.0.store(true, SeqCst);
                }
            }
            let last = SetOnDrop(f[N - 1].clone());
            drop(rt.spawn(move || drop(last)));
            first_rx.recv_timeout(Duration::from_secs(10)).unwrap();
            let start = Instant::now();
            drop(rt);
            let took = start.elapsed();
            eprintln!(
                "R63 chain at shutdown: took {took:?}, done {}, gave_up {}",
                done.load(SeqCst),
                gave_up.load(SeqCst)
            );
            assert!(took < Duration::from_secs(3), "the drop took {took:?}");
            assert_eq!(gave_up.load(SeqCst), 0);
            assert_eq!(done.load(SeqCst), N);
        })
    });
}

/// The reverse chain on one worker: fiber `i` waits until fiber `i + 1`'s
/// destructor is done (the last for a plain fiber). Each resume of a
/// poller whose flag is not set yet holds the thread again for up to
/// 200 ms (its streak restarts after a gap of 50 ms), so this costs about
/// n(n+1)/2 x 200 ms; it must still finish.
#[test]
fn a_reverse_chain_of_unwinding_yield_pollers_on_one_worker_finishes() {
    const N: usize = 4;
    let start = Instant::now();
    within(30, || {
        rt1().block_on(|| {
            let f = flags(N + 1);
            let gave_up = Arc::new(AtomicUsize::new(0));
            let (started_tx, started_rx) = fiber::chan::bounded::<()>(N);
            let hs: Vec<_> = (0..N)
                .map(|i| {
                    // `done` of fiber i + 1 is flag i: counted once seen.
                    let mine = f[i].clone();
                    let next_done = f[i + 1].clone();
                    let g = gave_up.clone();
                    let started = started_tx.clone();
                    let h = fiber::spawn(move || {
                        struct Reverse(Arc<AtomicBool>, Arc<AtomicBool>, Arc<AtomicUsize>);
                        impl Drop for Reverse {
                            fn drop(&mut self) {
                                let start = Instant::now();
                                while !self.1.load(SeqCst) {
                                    let _ = fiber::yield_now();
                                    if start.elapsed() > Duration::from_secs(20) {
                                        self.2.fetch_add(1, SeqCst);
                                        return;
                                    }
                                }
                                self.0.store(true, SeqCst);
                            }
                        }
                        // Fiber 0's own flag is only read by nobody; the
                        // guard marks `mine` once `next_done` is seen.
                        let _g = Reverse(mine, next_done, g);
                        started.send(()).unwrap();
                        panic!("reverse");
                    });
                    // Started (and holding the thread) before the next.
                    started_rx.recv().unwrap();
                    h
                })
                .collect();
            let last = f[N].clone();
            fiber::spawn(move || last.store(true, SeqCst)).join().unwrap();
            for h in hs {
                assert!(h.join().unwrap_err().is_panic());
            }
            assert_eq!(gave_up.load(SeqCst), 0);
            assert!(f.iter().all(|x| x.load(SeqCst)));
        })
    });
    let took = start.elapsed();
    eprintln!("R63 reverse chain of {N}: {took:?}");
    // Fiber 0 held the thread for its first 200 ms at least.
    assert!(took >= ms(200), "the pollers never waited: {took:?}");
}

/// One fixed worker: a panicking fiber's destructor polls with `yield_now`
/// for a flag that another fiber sets once its `fiber::blocking` call
/// returns. The blocking call's fiber is woken while the poller holds the
/// thread; it runs once the poller switches away.
#[test]
fn an_unwinding_yield_poller_waits_for_a_fiber_in_a_blocking_call_on_one_worker() {
    within(30, || {
        rt1().block_on(|| {
            let flag = Arc::new(AtomicBool::new(false));
            let (done, gave_up) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
            let f2 = flag.clone();
            let (in_call_tx, in_call_rx) = fiber::chan::bounded::<()>(1);
            let blocker = fiber::spawn(move || {
                let r = fiber::blocking(move || {
                    in_call_tx.send(()).unwrap();
                    std::thread::sleep(ms(30));
                    17
                });
                f2.store(true, SeqCst);
                r
            });
            in_call_rx.recv().unwrap();
            let guard = PollFlag {
                wait: flag,
                set: None,
                done: done.clone(),
                gave_up: gave_up.clone(),
            };
            let poller = fiber::spawn(move || {
                let _g = guard;
                panic!("poller");
            });
            assert!(poller.join().unwrap_err().is_panic());
            assert_eq!(blocker.join().unwrap(), 17);
            assert_eq!((done.load(SeqCst), gave_up.load(SeqCst)), (1, 0));
        })
    });
}

/// One fixed worker, a 500 ms grace (longer than the 200 ms hold): a
/// neighbour fiber sleeps (parked);
/// then a fiber panics and its destructor polls with `yield_now` for a
/// flag that the neighbour sets once its sleep ends (it ignores the
/// cancellation); the runtime is dropped while the poller holds the
/// thread. The shutdown cancels the neighbour's sleep, so the flag comes
/// as soon as the neighbour runs: the poller's destructor must see it,
/// and every destructor must run once, in bounded time.
#[test]
fn a_runtime_dropped_while_an_unwinding_fiber_polls_for_a_started_neighbour() {
    in_child(
        "a_runtime_dropped_while_an_unwinding_fiber_polls_for_a_started_neighbour",
        60,
        || {
            within(30, || {
                let rt = rt_fixed_grace(1, ms(500));
                let flag = Arc::new(AtomicBool::new(false));
                let (done, gave_up) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
                let drops = counter();
                let f2 = flag.clone();
                let (nb_tx, nb_rx) = mpsc::channel::<()>();
                drop(rt.spawn(move || {
                    nb_tx.send(()).unwrap();
                    let _ = fiber::sleep(Duration::from_secs(3600));
                    f2.store(true, SeqCst);
                }));
                nb_rx.recv_timeout(Duration::from_secs(10)).unwrap();
                wait_parked(&rt, 1);
                let (polling_tx, polling_rx) = mpsc::channel::<()>();
                let f3 = flag.clone();
                let (d, g, t) = (done.clone(), gave_up.clone(), drops.clone());
                drop(rt.spawn(move || {
                    let _outer = Tracked(t);
                    struct Announce(Option<mpsc::Sender<()>>);
                    impl Drop for Announce {
                        fn drop(&mut self) {
                            let _ = self.0.take().unwrap().send(());
                        }
                    }
                    let _poll = PollFlag {
                        wait: f3,
                        set: None,
                        done: d,
                        gave_up: g,
                    };
                    let _announce = Announce(Some(polling_tx));
                    panic!("unwinding at shutdown");
                }));
                polling_rx.recv_timeout(Duration::from_secs(10)).unwrap();
                let start = Instant::now();
                drop(rt);
                let took = start.elapsed();
                let t0 = Instant::now();
                while drops.load(SeqCst) == 0 && t0.elapsed() < Duration::from_secs(3) {
                    std::thread::sleep(ms(2));
                }
                eprintln!(
                    "R63 drop took {took:?}; done {} gave_up {} drops {} flag {}",
                    done.load(SeqCst),
                    gave_up.load(SeqCst),
                    drops.load(SeqCst),
                    flag.load(SeqCst)
                );
                assert!(took < Duration::from_secs(5), "the drop took {took:?}");
                assert!(flag.load(SeqCst), "the neighbour never set the flag");
                assert_eq!(gave_up.load(SeqCst), 0);
                assert_eq!(done.load(SeqCst), 1, "the polling destructor never finished");
                assert_eq!(drops.load(SeqCst), 1, "the fiber's other destructor never ran");
            })
        },
    );
}

/// A runtime dropped while a scope owner waits for three children (one
/// fixed worker, 100 ms grace): child 0 panics and polls with `yield_now`
/// for a flag child 1 sets once its receive ends (cancelled by the
/// shutdown); child 2 sleeps stubbornly. Every destructor runs exactly
/// once and the drop ends in bounded time.
#[test]
fn shutdown_with_a_scope_whose_child_polls_with_yield_while_unwinding() {
    in_child(
        "shutdown_with_a_scope_whose_child_polls_with_yield_while_unwinding",
        60,
        || {
            within(30, || {
                let rt = rt_fixed_grace(1, ms(100));
                let drops = counter();
                let flag = Arc::new(AtomicBool::new(false));
                let (done, gave_up) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
                let (ready_tx, ready_rx) = mpsc::channel::<()>();
                let (t, f, d, g) = (drops.clone(), flag.clone(), done.clone(), gave_up.clone());
                drop(rt.spawn(move || {
                    let _owner = Tracked(t.clone());
                    let (_keep_tx, rx) = fiber::chan::bounded::<()>(0);
                    fiber::scope(|s| {
                        let (t0, t1, t2) = (t.clone(), t.clone(), t.clone());
                        let f1 = f.clone();
                        let poll = PollFlag {
                            wait: f.clone(),
                            set: None,
                            done: d,
                            gave_up: g,
                        };
                        let rx1 = rx.clone();
                        s.spawn(move || {
                            let _t = Tracked(t1);
                            let _ = rx1.recv();
                            f1.store(true, SeqCst);
                        });
                        s.spawn(move || {
                            let _t = Tracked(t2);
                            stubborn_sleep();
                        });
                        let ready = ready_tx.clone();
                        s.spawn(move || {
                            let _t = Tracked(t0);
                            let _p = poll;
                            let _ = ready.send(());
                            // Wait for the shutdown, then panic.
                            let _ = fiber::sleep(Duration::from_secs(3600));
                            panic!("child panics on its cancel");
                        });
                    });
                }));
                ready_rx.recv_timeout(Duration::from_secs(10)).unwrap();
                wait_parked(&rt, 4);
                let start = Instant::now();
                drop(rt);
                let took = start.elapsed();
                let wait_for = Instant::now();
                while drops.load(SeqCst) < 4 && wait_for.elapsed() < Duration::from_secs(5) {
                    std::thread::sleep(ms(2));
                }
                eprintln!(
                    "R63 scope shutdown took {took:?}; drops {} done {} gave_up {}",
                    drops.load(SeqCst),
                    done.load(SeqCst),
                    gave_up.load(SeqCst)
                );
                assert!(took < Duration::from_secs(5), "the drop took {took:?}");
                assert_eq!(drops.load(SeqCst), 4, "a destructor never ran or ran twice");
                assert_eq!((done.load(SeqCst), gave_up.load(SeqCst)), (1, 0));
            })
        },
    );
}

// ---------------------------------------------------------------------------
// (b) A runtime dropped, or `block_on` called, on odd threads.

/// The message field of an event.
struct Message(String);
impl tracing::field::Visit for Message {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

static MON_RT: Mutex<Option<fiber::Runtime>> = Mutex::new(None);
static MON_HANDLE: Mutex<Option<fiber::Handle>> = Mutex::new(None);
static MON_OUTCOME: Mutex<Option<String>> = Mutex::new(None);

/// On the first "worker pool grew" event (the monitor thread emits it
/// when it adds a worker): drop the runtime kept in [`MON_RT`], or, if
/// there is none, `block_on` on [`MON_HANDLE`]; record the thread and the
/// outcome.
struct OnGrowth;
impl<S: Subscriber> Layer<S> for OnGrowth {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let mut m = Message(String::new());
        event.record(&mut m);
        if !m.0.contains("worker pool grew") || MON_OUTCOME.lock().unwrap().is_some() {
            return;
        }
        let thread = std::thread::current().name().unwrap_or("?").to_string();
        let rt = MON_RT.lock().unwrap().take();
        let outcome = if let Some(rt) = rt {
            let r = panic_message(move || drop(rt));
            format!("thread:{thread} drop panic:{r:?}")
        } else {
            let h = MON_HANDLE.lock().unwrap().clone().unwrap();
            let mut v = None;
            let r = panic_message(|| v = Some(h.block_on(|| 7)));
            format!("thread:{thread} block_on:{v:?} panic:{r:?}")
        };
        *MON_OUTCOME.lock().unwrap() = Some(outcome);
    }
}

/// A growing runtime (one worker, up to two) whose only worker is held by
/// a spinning fiber, so the monitor adds one and logs it; a parked fiber
/// owns a counted value. Returns the handle, the spinner's stop flag and
/// the drop count.
fn growing_runtime_with_a_parked_fiber() -> (fiber::Runtime, Arc<AtomicBool>, Arc<AtomicUsize>) {
    tracing::subscriber::set_global_default(
        tracing_subscriber::registry()
            .with(OnGrowth)
            .with(tracing_subscriber::filter::LevelFilter::DEBUG),
    )
    .unwrap();
    let rt = fiber::Runtime::builder()
        .workers(1)
        .max_workers(2)
        .shutdown_timeout(ms(100))
        .build()
        .unwrap();
    let drops = counter();
    let t = drops.clone();
    let (parked_tx, parked_rx) = mpsc::channel();
    drop(rt.spawn(move || {
        let _t = Tracked(t);
        parked_tx.send(()).unwrap();
        stubborn_sleep();
    }));
    parked_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    wait_parked(&rt, 1);
    let stop = Arc::new(AtomicBool::new(false));
    (rt, stop, drops)
}

fn wait_outcome() -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(o) = MON_OUTCOME.lock().unwrap().clone() {
            return o;
        }
        assert!(Instant::now() < deadline, "the monitor never logged a growth");
        std::thread::sleep(ms(2));
    }
}

/// A tracing layer drops the runtime from the monitor thread (the last
/// owner, on the "worker pool grew" event). That thread is neither a
/// worker nor one of the runtime's fibers, and the shutdown it runs
/// stops and joins the monitor, i.e. itself. Expected: the shutdown
/// completes (the parked fiber's destructor runs, spawns are refused, a
/// plain thread's `block_on` returns) without a panic, as for a drop on a
/// worker thread outside a fiber.
// Failed before the fix: a runtime dropped on its own monitor thread (a tracing layer on a monitor event) panics "failed to join thread: Resource deadlock avoided" half way through its shutdown: parked fibers are never unwound and a block_on caller hangs
#[test]
fn a_layer_dropping_its_runtime_on_the_monitor_thread_shuts_it_down() {
    in_child(
        "a_layer_dropping_its_runtime_on_the_monitor_thread_shuts_it_down",
        60,
        || {
            let (rt, stop, drops) = growing_runtime_with_a_parked_fiber();
            let h = rt.handle();
            // A plain thread blocked in `block_on` on a root that ignores
            // cancellation: the shutdown must unwind that root.
            let hb = h.clone();
            let (rooted_tx, rooted_rx) = mpsc::channel();
            let (returned_tx, returned_rx) = mpsc::channel();
            std::thread::spawn(move || {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    hb.block_on(move || {
                        rooted_tx.send(()).unwrap();
                        stubborn_sleep();
                    })
                }));
                let _ = returned_tx.send(r.is_err());
            });
            rooted_rx.recv_timeout(Duration::from_secs(10)).unwrap();
            wait_parked(&rt, 2);
            *MON_RT.lock().unwrap() = Some(rt);
            let s = stop.clone();
            drop(h.spawn(move || spin_until(&s, Duration::from_secs(10))));
            let outcome = wait_outcome();
            stop.store(true, SeqCst);
            let deadline = Instant::now() + Duration::from_secs(10);
            while drops.load(SeqCst) == 0 && Instant::now() < deadline {
                std::thread::sleep(ms(2));
            }
            let refused = h.try_spawn(|| ()).is_err();
            let returned = returned_rx.recv_timeout(Duration::from_secs(5));
            eprintln!(
                "R63 monitor drop: {outcome}; drops {}; spawns refused {refused}; block_on caller returned {returned:?}",
                drops.load(SeqCst)
            );
            assert!(outcome.contains("monitor"), "{outcome}");
            assert!(refused, "the runtime still takes spawns");
            assert!(outcome.ends_with("panic:None"), "{outcome}");
            assert_eq!(
                drops.load(SeqCst),
                1,
                "the parked fiber was never unwound: the shutdown did not finish"
            );
            assert!(returned.is_ok(), "a plain thread's block_on never returned");
        },
    );
}

/// A tracing layer calls `Handle::block_on` on the monitor thread (the
/// "worker pool grew" event): not a worker, so it is allowed, and the
/// root runs on the worker just added.
#[test]
fn block_on_from_a_layer_on_the_monitor_thread_runs_its_root() {
    in_child("block_on_from_a_layer_on_the_monitor_thread_runs_its_root", 60, || {
        let (rt, stop, _drops) = growing_runtime_with_a_parked_fiber();
        *MON_HANDLE.lock().unwrap() = Some(rt.handle());
        let s = stop.clone();
        drop(rt.spawn(move || spin_until(&s, Duration::from_secs(10))));
        let outcome = wait_outcome();
        stop.store(true, SeqCst);
        assert!(outcome.contains("monitor"), "{outcome}");
        assert!(outcome.ends_with("block_on:Some(7) panic:None"), "{outcome}");
        within(10, move || drop(rt));
    });
}

static RUN_IN_CLOSE: AtomicBool = AtomicBool::new(false);
static RUN_OUTCOME: Mutex<Option<String>> = Mutex::new(None);

/// On the next span close once armed: `fiber::run` (a new runtime) from
/// the worker thread between fibers, and `block_on` of the worker's own
/// runtime there.
struct RunsOnClose;
impl<S: Subscriber> Layer<S> for RunsOnClose {
    fn on_close(&self, _: Id, _: Context<'_, S>) {
        if !RUN_IN_CLOSE.swap(false, SeqCst) {
            return;
        }
        let in_fiber = fiber::core::in_fiber();
        let mut v = None;
        let r = panic_message(|| v = Some(fiber::run(|| fiber::spawn(|| 5).join().unwrap())));
        let own = MON_HANDLE.lock().unwrap().clone().unwrap();
        let own = panic_message(move || own.block_on(|| ()));
        *RUN_OUTCOME.lock().unwrap() = Some(format!("in_fiber:{in_fiber} run:{v:?} panic:{r:?} own:{own:?}"));
    }
}

/// `fiber::run` from a tracing callback on a worker between two fibers
/// builds and runs a runtime of its own (allowed: it is another runtime);
/// `block_on` of the worker's own runtime there panics naming the misuse.
#[test]
fn fiber_run_from_a_layer_between_fibers_and_block_on_of_the_own_runtime() {
    in_child(
        "fiber_run_from_a_layer_between_fibers_and_block_on_of_the_own_runtime",
        60,
        || {
            tracing::subscriber::set_global_default(tracing_subscriber::registry().with(RunsOnClose)).unwrap();
            let rt = fiber::Runtime::builder()
                .workers(2)
                .max_workers(2)
                .fiber_spans(true)
                .shutdown_timeout(ms(100))
                .build()
                .unwrap();
            *MON_HANDLE.lock().unwrap() = Some(rt.handle());
            let h = rt.handle();
            within(20, move || {
                h.block_on(|| {
                    fiber::spawn(|| RUN_IN_CLOSE.store(true, SeqCst)).join().unwrap();
                    wait_until("the layer's run", 10, || RUN_OUTCOME.lock().unwrap().is_some());
                })
            });
            let o = RUN_OUTCOME.lock().unwrap().clone().unwrap();
            assert!(o.starts_with("in_fiber:false run:Some(5) panic:None own:Some("), "{o}");
            assert!(o.contains("worker threads"), "{o}");
            MON_HANDLE.lock().unwrap().take();
            within(10, move || drop(rt));
        },
    );
}

/// `Handle::block_on` of the same runtime from a `fiber::blocking` call
/// (a blocking-pool thread, not a worker) on one fixed worker: the caller
/// fiber is parked, so the root runs on the worker.
#[test]
fn block_on_of_the_same_runtime_from_its_blocking_pool_works() {
    within(30, || {
        let rt = rt1();
        let h = rt.handle();
        let v = rt.block_on(move || {
            fiber::blocking(move || {
                h.block_on(|| {
                    fiber::sleep(ms(5)).unwrap();
                    fiber::spawn(|| 40).join().unwrap() + 2
                })
            })
        });
        assert_eq!(v, 42);
    });
}

/// `block_on` of runtime A from runtime B's `on_thread_start` hook (a
/// worker thread, but of another runtime): allowed, it runs A's root.
#[test]
fn block_on_from_another_runtimes_thread_start_hook_runs() {
    within(30, || {
        let a = rt2();
        let ha = a.handle();
        let (tx, rx) = mpsc::channel();
        let tx = Mutex::new(tx);
        let b = fiber::Runtime::builder()
            .workers(1)
            .max_workers(1)
            .shutdown_timeout(ms(100))
            .on_thread_start(move || {
                let mut v = None;
                let r = panic_message(|| v = Some(ha.block_on(|| fiber::spawn(|| 8).join().unwrap())));
                tx.lock().unwrap().send((v, r)).unwrap();
            })
            .build()
            .unwrap();
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), (Some(8), None));
        assert_eq!(b.block_on(|| 1), 1);
        drop(b);
        drop(a);
    });
}

/// A plain thread's `thread_local!` destructor, as the thread exits,
/// calls `Handle::block_on` on a live runtime, `fiber::run`, and drops
/// another runtime that has a parked fiber. Each works (the thread-local
/// machinery fiber uses may be torn down already on that thread: a panic
/// there would abort the process).
#[test]
fn block_on_run_and_runtime_drop_from_a_plain_threads_tls_destructor() {
    in_child(
        "block_on_run_and_runtime_drop_from_a_plain_threads_tls_destructor",
        60,
        || {
            struct AtExit(Option<(fiber::Handle, fiber::Runtime, mpsc::Sender<String>)>);
            impl Drop for AtExit {
                fn drop(&mut self) {
                    let (h, rt, tx) = self.0.take().unwrap();
                    let a = h.block_on(|| fiber::spawn(|| 1).join().unwrap());
                    let b = fiber::run(|| fiber::spawn(|| 2).join().unwrap());
                    let start = Instant::now();
                    drop(rt);
                    let _ = tx.send(format!("{a} {b} {}", start.elapsed() < Duration::from_secs(5)));
                }
            }
            thread_local! {
                static AT_EXIT: std::cell::RefCell<AtExit> = const { std::cell::RefCell::new(AtExit(None)) };
            }
            let live = rt2();
            let dropped = rt_fixed_grace(1, ms(50));
            let drops = counter();
            let t = drops.clone();
            let (ptx, prx) = mpsc::channel();
            drop(dropped.spawn(move || {
                let _t = Tracked(t);
                ptx.send(()).unwrap();
                stubborn_sleep();
            }));
            prx.recv_timeout(Duration::from_secs(10)).unwrap();
            let (tx, rx) = mpsc::channel();
            let h = live.handle();
            std::thread::spawn(move || {
                // Touch fiber's thread-locals on this thread first.
                assert_eq!(h.block_on(|| 0), 0);
                AT_EXIT.with(|a| a.borrow_mut().0 = Some((h, dropped, tx)));
            })
            .join()
            .unwrap();
            assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), "1 2 true");
            assert_eq!(drops.load(SeqCst), 1);
            within(10, move || drop(live));
        },
    );
}

// ---------------------------------------------------------------------------
// (c) Semaphore at MAX_PERMITS.

/// A semaphore a few permits below `MAX_PERMITS`: fibers on two runtimes
/// and plain threads take and return permits, and others add one permit
/// at a time (each refused add panics) and forget one taken permit for
/// each accepted add. A watcher never sees more than `MAX_PERMITS`, and
/// the final count equals the start plus accepted adds minus forgotten.
/// (In a child: it silences the panic hook.)
#[test]
fn semaphore_at_max_permits_under_concurrent_takers_and_adders() {
    in_child(
        "semaphore_at_max_permits_under_concurrent_takers_and_adders",
        120,
        semaphore_at_max_permits_body,
    );
}

fn semaphore_at_max_permits_body() {
    use fiber::sync::Semaphore;
    const START: usize = Semaphore::MAX_PERMITS - 3;
    within(60, || {
        let sem = Arc::new(Semaphore::new(START));
        let stop = Arc::new(AtomicBool::new(false));
        let added = Arc::new(AtomicUsize::new(0));
        let forgot = Arc::new(AtomicUsize::new(0));
        let refused = Arc::new(AtomicUsize::new(0));
        let watcher = {
            let (sem, stop) = (sem.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut most = 0;
                while !stop.load(SeqCst) {
                    most = most.max(sem.available_permits());
                }
                most
            })
        };
        let taker = |sem: Arc<Semaphore>| {
            move || {
                for i in 0..3_000u32 {
                    let p = if i % 2 == 0 {
                        sem.acquire_many(1 + i % 3).unwrap()
                    } else {
                        match sem.try_acquire_many(1 + i % 3) {
                            Some(p) => p,
                            None => continue,
                        }
                    };
                    if i % 7 == 0 {
                        fiber::yield_now().unwrap();
                    }
                    drop(p);
                }
            }
        };
        let adder =
            |sem: Arc<Semaphore>, added: Arc<AtomicUsize>, forgot: Arc<AtomicUsize>, refused: Arc<AtomicUsize>| {
                move || {
                    for _ in 0..3_000 {
                        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sem.add_permits(1)));
                        if r.is_ok() {
                            added.fetch_add(1, SeqCst);
                            // Take one back for good, so the count stays near MAX.
                            loop {
                                if let Some(p) = sem.try_acquire() {
                                    p.forget();
                                    forgot.fetch_add(1, SeqCst);
                                    break;
                                }
                                std::thread::yield_now();
                            }
                        } else {
                            refused.fetch_add(1, SeqCst);
                        }
                    }
                }
            };
        std::panic::set_hook(Box::new(|_| {}));
        let (a, b) = (rt2(), rt2());
        let mut fibers = Vec::new();
        for rt in [&a, &b] {
            for _ in 0..2 {
                fibers.push(rt.spawn(taker(sem.clone())));
            }
        }
        let threads: Vec<_> = (0..2)
            .map(|_| std::thread::spawn(taker(sem.clone())))
            .chain(
                (0..2).map(|_| std::thread::spawn(adder(sem.clone(), added.clone(), forgot.clone(), refused.clone()))),
            )
            .collect();
        let adder_fiber = a.spawn(adder(sem.clone(), added.clone(), forgot.clone(), refused.clone()));
        for t in threads {
            t.join().unwrap();
        }
        let ha = a.handle();
        ha.block_on(move || adder_fiber.join().unwrap());
        let (ha, hb) = (a.handle(), b.handle());
        for (i, f) in fibers.into_iter().enumerate() {
            if i < 2 {
                ha.block_on(move || f.join().unwrap());
            } else {
                hb.block_on(move || f.join().unwrap());
            }
        }
        stop.store(true, SeqCst);
        let most = watcher.join().unwrap();
        let (added, forgot, refused) = (added.load(SeqCst), forgot.load(SeqCst), refused.load(SeqCst));
        eprintln!("R63 semaphore: added {added} forgot {forgot} refused {refused} most {most}");
        assert!(most <= Semaphore::MAX_PERMITS, "the count showed {most}");
        assert_eq!(added + refused, 9_000);
        assert_eq!(added, forgot);
        assert_eq!(sem.available_permits(), START + added - forgot);
    });
}

/// A permit returned to a semaphore that was topped up to `MAX_PERMITS`
/// meanwhile: the release panics naming `MAX_PERMITS` (as tokio's does)
/// and the count stays at `MAX_PERMITS`; the semaphore still serves.
#[test]
fn a_permit_returned_to_a_full_semaphore_panics_and_keeps_the_count() {
    use fiber::sync::Semaphore;
    let sem = Semaphore::new(Semaphore::MAX_PERMITS);
    let p = sem.try_acquire_many(2).unwrap();
    sem.add_permits(1);
    let msg = panic_message(move || drop(p)).expect("the release past MAX_PERMITS did not panic");
    assert!(msg.contains("MAX_PERMITS"), "{msg}");
    assert_eq!(sem.available_permits(), Semaphore::MAX_PERMITS - 1);
    let q = sem.try_acquire().unwrap();
    drop(q);
    assert_eq!(sem.available_permits(), Semaphore::MAX_PERMITS - 1);
}

/// Fibers queued for more permits than a semaphore has are cancelled while
/// others take, return and add permits from threads: no cancelled
/// acquire takes a permit, and once everything is returned the count is
/// the start plus what was added.
#[test]
fn cancelled_waiters_beside_adds_and_releases_leave_the_count_exact() {
    use fiber::sync::Semaphore;
    within(60, || {
        let rt = rt2();
        let sem = Arc::new(Semaphore::new(4));
        let h = rt.handle();
        let s2 = sem.clone();
        let added = h.block_on(move || {
            let mut added = 0usize;
            for round in 0..200u32 {
                let waiters: Vec<_> = (0..4u32)
                    .map(|k| {
                        let s = s2.clone();
                        fiber::spawn(move || s.acquire_many(5 + k).map(|p| p.num_permits()))
                    })
                    .collect();
                let adder = {
                    let s = s2.clone();
                    std::thread::spawn(move || {
                        s.add_permits(1);
                        let p = s.try_acquire();
                        drop(p);
                    })
                };
                fiber::yield_now().unwrap();
                for (k, w) in waiters.iter().enumerate() {
                    if (round as usize + k) % 2 == 0 {
                        w.cancel();
                    }
                }
                adder.join().unwrap();
                added += 1;
                // Make room for every waiter left, then take it all back.
                s2.add_permits(40);
                added += 40;
                for w in waiters {
                    match w.join() {
                        Ok(Ok(n)) => assert!((5..9).contains(&n)),
                        Ok(Err(_)) => {}
                        Err(e) => assert!(e.is_cancelled(), "{e}"),
                    }
                }
            }
            added
        });
        assert_eq!(sem.available_permits(), 4 + added);
        drop(rt);
    });
}

// ---------------------------------------------------------------------------
// (d) The reaper and blocking calls ending around a zero-grace shutdown.

/// Repeatedly: four fibers on two workers each own a counted value and
/// are in `fiber::blocking` calls of staggered lengths (0 to 9 ms) when
/// the runtime is shut down with a zero grace, so calls return before,
/// during and after the teardown's rounds. Every fiber's destructor runs
/// exactly once, within 5 s, in every round.
#[test]
fn blocking_calls_ending_around_a_zero_grace_shutdown_lose_no_destructor() {
    in_child(
        "blocking_calls_ending_around_a_zero_grace_shutdown_lose_no_destructor",
        120,
        || {
            within(100, || {
                for round in 0..30u64 {
                    let rt = rt_fixed_grace(2, Duration::ZERO);
                    let drops = counter();
                    let (in_call_tx, in_call_rx) = mpsc::channel();
                    for k in 0..4u64 {
                        let d = drops.clone();
                        let tx = in_call_tx.clone();
                        let pinned = k == 3;
                        let body = move || {
                            let _t = Tracked(d);
                            fiber::blocking(move || {
                                let _ = tx.send(());
                                std::thread::sleep(Duration::from_micros(((round + k * 3) % 10) * 1000));
                            });
                            stubborn_sleep();
                        };
                        if pinned {
                            drop(rt.block_on(move || fiber::spawn_pinned(body)));
                        } else {
                            drop(rt.spawn(body));
                        }
                    }
                    for _ in 0..4 {
                        in_call_rx.recv_timeout(Duration::from_secs(5)).unwrap();
                    }
                    rt.shutdown_timeout(Duration::ZERO);
                    let t0 = Instant::now();
                    while drops.load(SeqCst) < 4 && t0.elapsed() < Duration::from_secs(5) {
                        std::thread::sleep(ms(1));
                    }
                    assert_eq!(drops.load(SeqCst), 4, "round {round}: a destructor was lost");
                }
            })
        },
    );
}

/// One fixed worker: a fiber's `fiber::blocking` call runs `block_on` of
/// the same runtime (allowed on a blocking-pool thread) with a root that
/// ignores cancellation. The runtime is dropped: the teardown unwinds the
/// root, which ends the blocking call, whose fiber the teardown had given
/// up on for later (it was in a blocking call). The reaper must finish
/// that fiber: its destructor runs once and the drop ends in bounded time.
#[test]
fn a_blocking_call_whose_block_on_root_the_teardown_unwinds_is_finished() {
    in_child(
        "a_blocking_call_whose_block_on_root_the_teardown_unwinds_is_finished",
        60,
        || {
            within(30, || {
                let rt = rt_fixed_grace(1, ms(100));
                let h = rt.handle();
                let drops = counter();
                let (t, (rooted_tx, rooted_rx)) = (drops.clone(), mpsc::channel::<()>());
                let (out_tx, out_rx) = mpsc::channel::<String>();
                drop(rt.spawn(move || {
                    let _t = Tracked(t);
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        fiber::blocking(move || {
                            h.block_on(move || {
                                rooted_tx.send(()).unwrap();
                                stubborn_sleep();
                            })
                        })
                    }));
                    let _ = out_tx.send(match r {
                        Ok(()) => "returned".to_string(),
                        Err(p) => format!("panicked: {:?}", p.downcast_ref::<String>()),
                    });
                }));
                rooted_rx.recv_timeout(Duration::from_secs(10)).unwrap();
                wait_parked(&rt, 2);
                let start = Instant::now();
                drop(rt);
                let took = start.elapsed();
                let t0 = Instant::now();
                while drops.load(SeqCst) == 0 && t0.elapsed() < Duration::from_secs(5) {
                    std::thread::sleep(ms(2));
                }
                let out = out_rx.try_recv();
                eprintln!(
                    "R63 blocking block_on at shutdown: took {took:?}, drops {}, {out:?}",
                    drops.load(SeqCst)
                );
                assert!(took < Duration::from_secs(5), "the drop took {took:?}");
                assert_eq!(drops.load(SeqCst), 1, "the fiber around the blocking call was lost");
            })
        },
    );
}

static HOOK_RT: Mutex<Option<fiber::Runtime>> = Mutex::new(None);
static HOOK_OUTCOME: Mutex<Option<String>> = Mutex::new(None);

/// A std panic hook that, for the panic of a fiber of the runtime, drops
/// that runtime (its last owner): on the runtime's own worker, inside one
/// of its fibers, while that fiber's panic begins. The drop must neither
/// panic (a panic in the hook aborts) nor hang; the shutdown goes on
/// elsewhere and finishes (a parked fiber's destructor runs).
#[test]
fn a_panic_hook_dropping_the_runtime_of_the_panicking_fiber() {
    in_child("a_panic_hook_dropping_the_runtime_of_the_panicking_fiber", 60, || {
        std::panic::set_hook(Box::new(|_| {
            let Some(rt) = HOOK_RT.lock().unwrap().take() else {
                return;
            };
            let in_fiber = fiber::core::in_fiber();
            let start = Instant::now();
            drop(rt);
            *HOOK_OUTCOME.lock().unwrap() = Some(format!("in_fiber:{in_fiber} quick:{}", start.elapsed() < ms(500)));
        }));
        let rt = rt_fixed_grace(2, ms(100));
        let h = rt.handle();
        let drops = counter();
        let t = drops.clone();
        let (ptx, prx) = mpsc::channel();
        drop(rt.spawn(move || {
            let _t = Tracked(t);
            ptx.send(()).unwrap();
            stubborn_sleep();
        }));
        prx.recv_timeout(Duration::from_secs(10)).unwrap();
        wait_parked(&rt, 1);
        *HOOK_RT.lock().unwrap() = Some(rt);
        drop(h.spawn(|| panic!("the hook drops my runtime")));
        let deadline = Instant::now() + Duration::from_secs(10);
        while drops.load(SeqCst) == 0 && Instant::now() < deadline {
            std::thread::sleep(ms(2));
        }
        let outcome = HOOK_OUTCOME.lock().unwrap().clone();
        let _ = std::panic::take_hook();
        assert_eq!(outcome.as_deref(), Some("in_fiber:true quick:true"));
        assert_eq!(drops.load(SeqCst), 1, "the shutdown never finished");
        assert!(h.try_spawn(|| ()).is_err());
    });
}

/// A runtime whose last owner is a `thread_local!` of one of its own
/// blocking-pool threads: the thread retires after its 10 s keep-alive
/// and its thread-local destructor drops the runtime there, outside any
/// call (no fiber waits on that thread). The rustdoc of
/// `Runtime::shutdown_timeout` promises, for a worker thread's
/// thread-local destructor, a hand-off without a panic (a panic there
/// aborts the process); a pool thread at its exit is the same case.
// Failed before the fix: a runtime dropped by a thread-local destructor of its own retiring blocking-pool thread panics "dropped from inside one of its own fibers" there, and the process aborts ("thread local panicked on drop")
#[test]
fn a_runtime_dropped_by_a_blocking_pool_threads_tls_destructor_at_retirement() {
    in_child(
        "a_runtime_dropped_by_a_blocking_pool_threads_tls_destructor_at_retirement",
        60,
        || {
            thread_local! {
                static KEEP: std::cell::RefCell<Option<fiber::Runtime>> = const { std::cell::RefCell::new(None) };
            }
            let rt = fiber::Runtime::builder()
                .workers(2)
                .max_workers(2)
                .shutdown_timeout(ms(100))
                .thread_keep_alive(ms(200))
                .build()
                .unwrap();
            let h = rt.handle();
            let drops = counter();
            let t = drops.clone();
            let (ptx, prx) = mpsc::channel();
            drop(rt.spawn(move || {
                let _t = Tracked(t);
                ptx.send(()).unwrap();
                stubborn_sleep();
            }));
            prx.recv_timeout(Duration::from_secs(10)).unwrap();
            within(10, {
                let h = h.clone();
                move || h.block_on(move || fiber::blocking(move || KEEP.with(|k| *k.borrow_mut() = Some(rt))))
            });
            // The pool thread retires after its keep-alive (200 ms).
            let deadline = Instant::now() + Duration::from_secs(30);
            while drops.load(SeqCst) == 0 && Instant::now() < deadline {
                std::thread::sleep(ms(10));
            }
            assert_eq!(drops.load(SeqCst), 1, "the runtime was never shut down");
            assert!(h.try_spawn(|| ()).is_err());
            // The retiring pool thread must also end cleanly (a panic in
            // its thread-local destructor aborts the process): wait for it
            // to be gone (thread names are cut to 15 bytes).
            let pool_threads = || {
                std::fs::read_dir("/proc/self/task")
                    .unwrap()
                    .flatten()
                    .filter(|t| {
                        std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == "fiber-worker-bl")
                    })
                    .count()
            };
            let deadline = Instant::now() + Duration::from_secs(10);
            while pool_threads() > 0 {
                assert!(Instant::now() < deadline, "the pool thread never exited");
                std::thread::sleep(ms(5));
            }
        },
    );
}

/// Two fixed workers: a panicking fiber's destructor polls with
/// `yield_now` for 600 ms (past the 200 ms hold, so it switches away many
/// times) beside busy neighbours that yield too, with the other worker
/// free to steal. Its unwind must end on the thread it began on (every
/// resume of the poller is on that thread), and afterwards fresh fibers on
/// both workers find their threads clean.
#[test]
fn an_unwinding_yield_poller_past_its_hold_stays_on_its_thread() {
    within(30, || {
        rt2().block_on(|| {
            struct Record(Arc<Mutex<Vec<std::thread::ThreadId>>>, Arc<AtomicBool>);
            impl Drop for Record {
                fn drop(&mut self) {
                    let start = Instant::now();
                    while start.elapsed() < ms(600) {
                        // Still its own unwind after every switch (recorded:
                        // an assert here would abort the process).
                        if !(fiber::core::panicking() && std::thread::panicking()) {
                            self.1.store(true, SeqCst);
                        }
                        self.0.lock().unwrap().push(std::thread::current().id());
                        let _ = fiber::yield_now();
                    }
                    self.0.lock().unwrap().push(std::thread::current().id());
                }
            }
            let seen = Arc::new(Mutex::new(Vec::new()));
            let stop = Arc::new(AtomicBool::new(false));
            let busy: Vec<_> = (0..3)
                .map(|_| {
                    let s = stop.clone();
                    fiber::spawn(move || {
                        let mut n = 0u64;
                        while !s.load(SeqCst) {
                            assert!(!fiber::core::panicking());
                            fiber::yield_now().unwrap();
                            n += 1;
                        }
                        n
                    })
                })
                .collect();
            let s2 = seen.clone();
            let not_unwinding = Arc::new(AtomicBool::new(false));
            let nu = not_unwinding.clone();
            let poller = fiber::spawn(move || {
                let _r = Record(s2, nu);
                panic!("poll past the hold");
            });
            assert!(poller.join().unwrap_err().is_panic());
            stop.store(true, SeqCst);
            let rounds: u64 = busy.into_iter().map(|b| b.join().unwrap()).sum();
            let seen = seen.lock().unwrap().clone();
            assert!(seen.len() > 2);
            assert!(
                seen.iter().all(|t| *t == seen[0]),
                "the unwinding poller was resumed on another thread"
            );
            assert!(rounds > 0, "the neighbours never ran");
            assert!(
                !not_unwinding.load(SeqCst),
                "the poller stopped looking unwinding after a switch"
            );
            let clean: Vec<_> = (0..8).map(|_| fiber::spawn(|| !std::thread::panicking())).collect();
            for c in clean {
                assert!(c.join().unwrap(), "a worker thread was left panicking");
            }
        })
    });
}

static ENTER_RT: Mutex<Option<fiber::Runtime>> = Mutex::new(None);
static DROP_ON_ENTER: AtomicBool = AtomicBool::new(false);
static ENTER_OUTCOME: Mutex<Option<String>> = Mutex::new(None);

/// Once armed, drops the runtime kept in [`ENTER_RT`] from the next span
/// enter: on the worker, just before it resumes a fiber.
struct DropsRuntimeOnEnter;
impl<S: Subscriber> Layer<S> for DropsRuntimeOnEnter {
    fn on_enter(&self, _: &Id, _: Context<'_, S>) {
        if !DROP_ON_ENTER.swap(false, SeqCst) {
            return;
        }
        let rt = ENTER_RT.lock().unwrap().take();
        let in_fiber = fiber::core::in_fiber();
        let start = Instant::now();
        let r = panic_message(move || drop(rt));
        *ENTER_OUTCOME.lock().unwrap() = Some(format!(
            "in_fiber:{in_fiber} panic:{r:?} quick:{}",
            start.elapsed() < ms(500)
        ));
    }
}

/// One fixed worker with fiber spans: a scope owner parked waiting for two
/// children parked on a channel, and a stubborn fiber. A layer drops the
/// runtime (its last owner) from `on_enter` of the next resume, on the
/// worker outside any fiber; the worker then resumes that fiber while the
/// shutdown runs on a thread of its own. No panic, the drop returns at
/// once, and every destructor runs exactly once.
#[test]
fn a_layer_dropping_its_runtime_before_a_resume_with_a_scope_parked() {
    in_child(
        "a_layer_dropping_its_runtime_before_a_resume_with_a_scope_parked",
        60,
        || {
            tracing::subscriber::set_global_default(tracing_subscriber::registry().with(DropsRuntimeOnEnter)).unwrap();
            let rt = fiber::Runtime::builder()
                .workers(1)
                .max_workers(1)
                .fiber_spans(true)
                .shutdown_timeout(ms(100))
                .build()
                .unwrap();
            let h = rt.handle();
            let drops = counter();
            let (t, t2) = (drops.clone(), drops.clone());
            let (ready_tx, ready_rx) = mpsc::channel::<()>();
            drop(rt.spawn(move || {
                let _owner = Tracked(t.clone());
                let (_keep, rx) = fiber::chan::bounded::<()>(0);
                fiber::scope(|s| {
                    for _ in 0..2 {
                        let (t, rx) = (t.clone(), rx.clone());
                        s.spawn(move || {
                            let _t = Tracked(t);
                            let _ = rx.recv();
                        });
                    }
                    ready_tx.send(()).unwrap();
                });
            }));
            drop(rt.spawn(move || {
                let _t = Tracked(t2);
                stubborn_sleep();
            }));
            ready_rx.recv_timeout(Duration::from_secs(10)).unwrap();
            wait_parked(&rt, 4);
            *ENTER_RT.lock().unwrap() = Some(rt);
            DROP_ON_ENTER.store(true, SeqCst);
            // A fiber to resume: its span enter drops the runtime.
            let (ran_tx, ran_rx) = mpsc::channel::<bool>();
            drop(h.spawn(move || {
                let _ = ran_tx.send(fiber::core::in_fiber());
            }));
            let deadline = Instant::now() + Duration::from_secs(10);
            while drops.load(SeqCst) < 4 && Instant::now() < deadline {
                std::thread::sleep(ms(2));
            }
            let outcome = ENTER_OUTCOME.lock().unwrap().clone();
            eprintln!(
                "R63 drop on enter: {outcome:?}, drops {}, ran {:?}",
                drops.load(SeqCst),
                ran_rx.try_recv()
            );
            assert_eq!(outcome.as_deref(), Some("in_fiber:false panic:None quick:true"));
            assert_eq!(drops.load(SeqCst), 4, "a destructor never ran or ran twice");
            assert!(h.try_spawn(|| ()).is_err());
        },
    );
}
