//! Adversarial: fiber calls from thread-local destructors at thread exit.
//! crossbeam-channel falls back to a fresh context when its thread-local
//! is gone, and std's mpsc works there too: a blocking receive, a wake of
//! a parked fiber (a `try_send`, dropping the last `Sender`) and
//! `Handle::spawn` ("spawn a fiber from anywhere") must work in such a
//! destructor, also on a thread that used fiber before (so fiber's own
//! thread-locals may be destroyed already). Before, each aborted the
//! process ("cannot access a Thread Local Storage value during or after
//! destruction").

use fiber::chan;
use std::cell::RefCell;
use std::sync::mpsc;
use std::time::Duration;

use crate::common::{in_child, ms, rt};

struct WaitsOnDrop {
    rx: chan::Receiver<u32>,
    out: mpsc::Sender<Result<u32, String>>,
}
impl Drop for WaitsOnDrop {
    fn drop(&mut self) {
        let r = self
            .rx
            .recv_timeout(Duration::from_secs(5))
            .map_err(|e| format!("{e:?}"));
        let _ = self.out.send(r);
    }
}
thread_local! {
    static WAITS_ON_EXIT: RefCell<Option<WaitsOnDrop>> = const { RefCell::new(None) };
}

/// crossbeam-channel (whose API fiber::chan mirrors) falls back to a fresh
/// context when its thread-local is gone, so a blocking receive works in a
/// thread-local destructor; std's mpsc does too.
#[test]
fn a_blocking_receive_in_a_thread_local_destructor_after_an_earlier_wait_works() {
    in_child(
        "a_blocking_receive_in_a_thread_local_destructor_after_an_earlier_wait_works",
        30,
        || {
            let (tx, rx) = chan::bounded::<u32>(0);
            let (out_tx, out_rx) = mpsc::channel();
            let t = std::thread::spawn(move || {
                // Registered first: destroyed after the ones registered later.
                WAITS_ON_EXIT.with(|k| *k.borrow_mut() = Some(WaitsOnDrop { rx, out: out_tx }));
                // A wait that blocks this thread once (sets up its parker).
                chan::after(ms(5)).recv().unwrap();
            });
            let sender = std::thread::spawn(move || {
                std::thread::sleep(ms(100));
                tx.send(9)
            });
            let joined = t.join();
            let got = out_rx.recv_timeout(Duration::from_secs(10));
            let _ = sender.join();
            assert!(joined.is_ok(), "the thread exited cleanly");
            assert_eq!(got, Ok(Ok(9)));
        },
    );
}

struct StdWaitsOnDrop {
    rx: std::sync::mpsc::Receiver<u32>,
    out: mpsc::Sender<Result<u32, String>>,
}
impl Drop for StdWaitsOnDrop {
    fn drop(&mut self) {
        let r = self
            .rx
            .recv_timeout(Duration::from_secs(5))
            .map_err(|e| format!("{e:?}"));
        let _ = self.out.send(r);
    }
}
thread_local! {
    static STD_WAITS_ON_EXIT: RefCell<Option<StdWaitsOnDrop>> = const { RefCell::new(None) };
}

/// Control: the same with std's mpsc.
#[test]
fn control_std_blocking_receive_in_a_thread_local_destructor_works() {
    in_child(
        "control_std_blocking_receive_in_a_thread_local_destructor_works",
        30,
        || {
            let (tx, rx) = std::sync::mpsc::sync_channel::<u32>(0);
            let (out_tx, out_rx) = mpsc::channel();
            let t = std::thread::spawn(move || {
                STD_WAITS_ON_EXIT.with(|k| *k.borrow_mut() = Some(StdWaitsOnDrop { rx, out: out_tx }));
                let (_a, b) = std::sync::mpsc::channel::<()>();
                let _ = b.recv_timeout(ms(5));
                std::thread::park_timeout(ms(1));
            });
            let sender = std::thread::spawn(move || {
                std::thread::sleep(ms(100));
                tx.send(9)
            });
            let joined = t.join();
            let got = out_rx.recv_timeout(Duration::from_secs(10));
            let _ = sender.join();
            assert!(joined.is_ok());
            assert_eq!(got, Ok(Ok(9)));
        },
    );
}

struct SpawnsOnDrop {
    handle: fiber::Handle,
    out: mpsc::Sender<u32>,
}
impl Drop for SpawnsOnDrop {
    fn drop(&mut self) {
        let out = self.out.clone();
        // Runtime::spawn / Handle::spawn: "Spawn a fiber from anywhere".
        drop(self.handle.spawn(move || {
            let _ = out.send(11);
        }));
    }
}
thread_local! {
    static SPAWNS_ON_EXIT: RefCell<Option<SpawnsOnDrop>> = const { RefCell::new(None) };
}

#[test]
fn handle_spawn_in_a_thread_local_destructor_after_an_earlier_spawn_works() {
    in_child(
        "handle_spawn_in_a_thread_local_destructor_after_an_earlier_spawn_works",
        30,
        || {
            let rt = rt();
            let handle = rt.handle();
            let (out_tx, out_rx) = mpsc::channel();
            let t = std::thread::spawn(move || {
                SPAWNS_ON_EXIT.with(|k| {
                    *k.borrow_mut() = Some(SpawnsOnDrop {
                        handle: handle.clone(),
                        out: out_tx,
                    })
                });
                // An earlier spawn from this thread (no wait on this thread).
                drop(handle.spawn(|| ()));
            });
            let joined = t.join();
            let got = out_rx.recv_timeout(Duration::from_secs(10));
            assert!(joined.is_ok(), "the thread exited cleanly");
            assert_eq!(got, Ok(11));
            drop(rt);
        },
    );
}

struct SendsOnDrop(chan::Sender<u32>);
impl Drop for SendsOnDrop {
    fn drop(&mut self) {
        // A fiber is parked in recv: this send wakes it (and must not block).
        let _ = self.0.try_send(12);
    }
}
thread_local! {
    static SENDS_ON_EXIT: RefCell<Option<SendsOnDrop>> = const { RefCell::new(None) };
}

#[test]
fn waking_a_fiber_from_a_thread_local_destructor_after_an_earlier_wake_works() {
    in_child(
        "waking_a_fiber_from_a_thread_local_destructor_after_an_earlier_wake_works",
        30,
        || {
            let rt = rt();
            let (tx, rx) = chan::bounded::<u32>(0);
            let (tx0, rx0) = chan::bounded::<u32>(0);
            let fib = rt.spawn(move || {
                let a = rx0.recv().unwrap();
                let b = rx.recv().unwrap();
                a + b
            });
            let t = std::thread::spawn(move || {
                SENDS_ON_EXIT.with(|k| *k.borrow_mut() = Some(SendsOnDrop(tx)));
                // An earlier wake from this thread: wait until the fiber is parked.
                std::thread::sleep(ms(50));
                while tx0.try_send(1).is_err() {
                    std::thread::sleep(ms(1));
                }
                std::thread::sleep(ms(50));
            });
            let joined = t.join();
            assert!(joined.is_ok(), "the thread exited cleanly");
            assert_eq!(fib.join().unwrap(), 13);
            drop(rt);
        },
    );
}

thread_local! {
    static LOG_TX: RefCell<Option<chan::Sender<u32>>> = const { RefCell::new(None) };
}

/// A thread keeps a Sender in a thread_local, sends a few messages to a
/// fiber during its life, and exits: the thread-local destructor drops the
/// last Sender, which disconnects the channel and wakes the receiving fiber.
#[test]
fn a_sender_kept_in_a_thread_local_is_dropped_cleanly_at_thread_exit() {
    in_child(
        "a_sender_kept_in_a_thread_local_is_dropped_cleanly_at_thread_exit",
        30,
        || {
            let rt = rt();
            let (tx, rx) = chan::unbounded::<u32>();
            let consumer = rt.spawn(move || rx.iter().sum::<u32>());
            let t = std::thread::spawn(move || {
                LOG_TX.with(|k| *k.borrow_mut() = Some(tx));
                for i in 1..=3 {
                    LOG_TX.with(|k| k.borrow().as_ref().unwrap().send(i).unwrap());
                    std::thread::sleep(ms(20)); // the consumer parks again in between
                }
            });
            assert!(t.join().is_ok(), "the thread exited cleanly");
            assert_eq!(consumer.join().unwrap(), 6);
            drop(rt);
        },
    );
}

thread_local! {
    static BLOCKING_CACHE: RefCell<Option<chan::Sender<u32>>> = const { RefCell::new(None) };
}

/// A `fiber::blocking` closure leaves a Sender in a thread_local of the
/// pool thread (a per-thread cache); when the idle pool thread retires
/// (after its keep-alive, here 100 ms), its thread-locals are dropped and the Sender's drop
/// wakes the fiber waiting on the channel.
#[test]
fn a_blocking_pool_thread_retiring_with_a_sender_in_a_thread_local_is_clean() {
    in_child(
        "a_blocking_pool_thread_retiring_with_a_sender_in_a_thread_local_is_clean",
        40,
        || {
            // The sender goes when the pool thread retires, after its
            // keep-alive.
            let rt = fiber::Runtime::builder()
                .thread_keep_alive(std::time::Duration::from_millis(100))
                .build()
                .unwrap();
            let got = rt.block_on(|| {
                let (tx, rx) = chan::unbounded::<u32>();
                let consumer = fiber::spawn(move || rx.iter().sum::<u32>());
                fiber::blocking(move || {
                    BLOCKING_CACHE.with(|c| *c.borrow_mut() = Some(tx));
                    BLOCKING_CACHE.with(|c| c.borrow().as_ref().unwrap().send(1).unwrap());
                });
                consumer.join().unwrap()
            });
            assert_eq!(got, 1);
        },
    );
}

thread_local! {
    static WORKER_CACHE: RefCell<Option<chan::Sender<u32>>> = const { RefCell::new(None) };
}

/// README: "Code that must keep thread-local caches runs pinned:
/// fiber::spawn_pinned(f)". A pinned fiber of runtime 1 caches a Sender in
/// a thread_local of its worker and uses it; when runtime 1 shuts down its
/// worker threads exit and drop the cache, which disconnects the channel
/// and wakes the receiving fiber of runtime 2.
#[test]
fn a_pinned_fibers_thread_local_cache_is_dropped_cleanly_when_its_worker_exits() {
    in_child(
        "a_pinned_fibers_thread_local_cache_is_dropped_cleanly_when_its_worker_exits",
        30,
        || {
            let rt1 = rt();
            let rt2 = rt();
            let (tx, rx) = chan::unbounded::<u32>();
            let consumer = rt2.spawn(move || rx.iter().sum::<u32>());
            rt1.block_on(move || {
                fiber::spawn_pinned(move || {
                    WORKER_CACHE.with(|c| *c.borrow_mut() = Some(tx));
                    for i in 1..=3 {
                        fiber::sleep(ms(10)).unwrap();
                        WORKER_CACHE.with(|c| c.borrow().as_ref().unwrap().send(i).unwrap());
                    }
                })
                .join()
                .unwrap();
            });
            drop(rt1);
            let total = consumer.join().unwrap();
            assert_eq!(total, 6);
            drop(rt2);
        },
    );
}
