//! The Rust standard library's own unit tests (rust-lang/rust,
//! `library/std/src/sync/*/tests.rs` and `library/std/tests/sync/*.rs`,
//! `library/std/src/thread/tests.rs` and `library/std/tests/thread.rs`,
//! `library/std/src/net/{tcp,udp}/tests.rs`,
//! `library/std/src/os/unix/net/tests.rs`), ported to the `fiber`
//! counterparts of the std items they exercise. Each port runs in a fiber
//! of a fixed two-worker runtime, in a fiber of a fixed one-worker runtime
//! (where a blocking std primitive would deadlock) and, where the fiber
//! type claims to work on plain threads, on a plain thread. The peers that
//! upstream runs on `std::thread::spawn` are fibers inside a runtime and
//! threads outside it; coordination uses `fiber::chan`, which serves both.
//!
//! Rules already covered by `conformance_std_{sync,thread,net,traits}.rs`
//! are not repeated here unless the upstream test adds something to them.

use fiber::sync::{Barrier, Condvar, Mutex, OnceLock, RwLock, RwLockWriteGuard, TryLockError};
use std::any::Any;
use std::io::{ErrorKind, IoSlice, IoSliceMut, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{ms, rt1, rt2, within};

// ---------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------

/// `body` as the root fiber of a fixed 2-worker and of a fixed 1-worker
/// runtime.
fn in_fibers(body: fn()) {
    within(60, move || rt2().block_on(body));
    within(60, move || rt1().block_on(body));
}

/// `body` in fibers ([`in_fibers`]) and then on a plain thread.
fn everywhere(body: fn()) {
    in_fibers(body);
    within(60, body);
}

/// A concurrent task: a fiber when called in a fiber (as upstream's
/// `thread::spawn`), else a plain thread.
enum Task<T> {
    Fiber(fiber::JoinHandle<T>),
    Thread(std::thread::JoinHandle<T>),
}

fn go<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Task<T> {
    if fiber::core::in_fiber() {
        Task::Fiber(fiber::spawn(f))
    } else {
        Task::Thread(std::thread::spawn(f))
    }
}

/// Always a plain thread (to mix threads into fiber runs).
fn go_thread<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Task<T> {
    Task::Thread(std::thread::spawn(f))
}

impl<T: Send + 'static> Task<T> {
    /// As `std::thread::JoinHandle::join`: the payload on a panic.
    fn join(self) -> std::thread::Result<T> {
        match self {
            Task::Fiber(h) => h.join().map_err(|e| {
                if e.is_panic() {
                    e.into_panic()
                } else {
                    Box::new(format!("not a panic: {e}")) as Box<dyn Any + Send>
                }
            }),
            Task::Thread(h) => {
                // A fiber must not block its worker in a std join (the
                // thread may wait for a fiber that worker has to run).
                if fiber::core::in_fiber() {
                    while !h.is_finished() {
                        fiber::sleep(ms(1)).unwrap();
                    }
                }
                h.join()
            }
        }
    }
}

/// Sleep the calling fiber or thread.
fn nap(d: Duration) {
    if fiber::core::in_fiber() {
        fiber::sleep(d).unwrap();
    } else {
        std::thread::sleep(d);
    }
}

/// Yield the calling fiber or thread.
fn yield_now() {
    if fiber::core::in_fiber() {
        fiber::yield_now().unwrap();
    } else {
        std::thread::yield_now();
    }
}

/// A channel that fibers and threads can both wait on.
fn channel<T: Send>() -> (fiber::chan::Sender<T>, fiber::chan::Receiver<T>) {
    fiber::chan::unbounded()
}

/// A small deterministic generator (upstream's `test_rng`).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn one_in(&mut self, n: u64) -> bool {
        self.next() % n == 0
    }
}

#[derive(Eq, PartialEq, Debug)]
struct NonCopy(i32);

struct DropCounter(Arc<AtomicUsize>);
impl Drop for DropCounter {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

// ---------------------------------------------------------------------------
// std::sync::Mutex (library/std/tests/sync/mutex.rs, src/sync/mutex/tests.rs)
// ---------------------------------------------------------------------------

/// Upstream `smoke`, `try_lock`, `test_into_inner`, `test_into_inner_drop`,
/// `test_get_mut`, `test_mutex_unsized` (through a plain reference).
#[test]
fn mutex_smoke_try_lock_into_inner_get_mut() {
    everywhere(|| {
        let m = Mutex::new(());
        drop(m.lock().unwrap());
        drop(m.lock().unwrap());
        *m.try_lock().unwrap() = ();

        let m = Mutex::new(NonCopy(10));
        assert_eq!(m.into_inner().unwrap(), NonCopy(10));

        let drops = Arc::new(AtomicUsize::new(0));
        let m = Mutex::new(DropCounter(drops.clone()));
        assert_eq!(drops.load(Ordering::SeqCst), 0);
        {
            let _inner = m.into_inner().unwrap();
            assert_eq!(drops.load(Ordering::SeqCst), 0, "into_inner dropped the value");
        }
        assert_eq!(drops.load(Ordering::SeqCst), 1);

        let mut m = Mutex::new(NonCopy(10));
        *m.get_mut().unwrap() = NonCopy(20);
        assert_eq!(m.into_inner().unwrap(), NonCopy(20));

        let mutex: &Mutex<[i32]> = &Mutex::new([1, 2, 3]);
        {
            let b = &mut *mutex.lock().unwrap();
            b[0] = 4;
            b[2] = 5;
        }
        assert_eq!(&*mutex.lock().unwrap(), &[4, 2, 5][..]);
    });
}

/// Upstream `lots_and_lots`: 2*K tasks add J each under the lock. In a
/// runtime one task of each pair is a fiber and the other a plain thread.
#[test]
fn mutex_lots_and_lots() {
    everywhere(|| {
        const J: u32 = 1000;
        const K: u32 = 3;
        let m = Arc::new(Mutex::new(0));
        fn inc(m: &Mutex<u32>) {
            for _ in 0..J {
                *m.lock().unwrap() += 1;
            }
        }
        let (tx, rx) = channel();
        for _ in 0..K {
            let (tx2, m2) = (tx.clone(), m.clone());
            drop(go(move || {
                inc(&m2);
                tx2.send(()).unwrap();
            }));
            let (tx2, m2) = (tx.clone(), m.clone());
            drop(go_thread(move || {
                inc(&m2);
                tx2.send(()).unwrap();
            }));
        }
        drop(tx);
        for _ in 0..2 * K {
            rx.recv().unwrap();
        }
        assert_eq!(*m.lock().unwrap(), J * K * 2);
    });
}

/// A mutex poisoned by a panic inside `catch_unwind` in the caller itself
/// (upstream `new_poisoned_mutex`).
fn new_poisoned_mutex<T>(value: T) -> Mutex<T> {
    let mutex = Mutex::new(value);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _guard = mutex.lock().unwrap();
        panic!("test panic to poison mutex");
    }));
    assert!(r.is_err());
    assert!(mutex.is_poisoned());
    mutex
}

/// Upstream `test_into_inner_poison`, `test_get_mut_poison`,
/// `test_mutex_arc_poison` (a failed assertion in another task) and
/// `test_panics` (three panics under the lock in a row: each unwinds and
/// unlocks, none deadlocks).
#[test]
fn mutex_poisoning_upstream() {
    everywhere(|| {
        let m = new_poisoned_mutex(NonCopy(10));
        match m.into_inner() {
            Err(e) => assert_eq!(e.into_inner(), NonCopy(10)),
            Ok(x) => panic!("into_inner of poisoned Mutex is Ok: {x:?}"),
        }
        let mut m = new_poisoned_mutex(NonCopy(10));
        match m.get_mut() {
            Err(e) => assert_eq!(*e.into_inner(), NonCopy(10)),
            Ok(x) => panic!("get_mut of poisoned Mutex is Ok: {x:?}"),
        }

        let arc = Arc::new(Mutex::new(1));
        assert!(!arc.is_poisoned());
        let arc2 = arc.clone();
        let r = go(move || {
            let lock = arc2.lock().unwrap();
            assert_eq!(*lock, 2, "deliberate assertion failure to poison the mutex");
        })
        .join();
        assert!(r.is_err());
        assert!(arc.lock().is_err());
        assert!(arc.is_poisoned());

        let mutex = Mutex::new(42);
        for round in 0..3 {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let _guard = mutex.lock().unwrap();
                panic!("test panic with mutex, round {round}");
            }));
            assert!(r.is_err());
        }
        assert!(matches!(mutex.try_lock(), Err(TryLockError::Poisoned(_))));
        assert_eq!(*mutex.lock().unwrap_err().into_inner(), 42);
    });
}

/// Upstream `test_mutex_arc_condvar`: the waiter holds the lock, tells the
/// other task it may go, and waits until the flag is set.
#[test]
fn mutex_arc_condvar() {
    everywhere(|| {
        let packet = Arc::new((Mutex::new(false), Condvar::new()));
        let packet2 = packet.clone();
        let (tx, rx) = channel();
        let _t = go(move || {
            rx.recv().unwrap();
            let (lock, cvar) = &*packet2;
            let mut lock = lock.lock().unwrap();
            *lock = true;
            cvar.notify_one();
        });
        let (lock, cvar) = &*packet;
        let mut lock = lock.lock().unwrap();
        tx.send(()).unwrap();
        assert!(!*lock);
        while !*lock {
            lock = cvar.wait(lock).unwrap();
        }
    });
}

/// Upstream `test_arc_condvar_poison`: the notifier panics while holding
/// the mutex; the waiter's `wait` then returns `Err` (and before that,
/// every `Ok` it gets still shows 1).
#[test]
fn mutex_arc_condvar_poison() {
    everywhere(|| {
        let packet = Arc::new((Mutex::new(1), Condvar::new()));
        let packet2 = packet.clone();
        let (tx, rx) = channel();
        let t = go(move || {
            rx.recv().unwrap();
            let (lock, cvar) = &*packet2;
            let _g = lock.lock().unwrap();
            cvar.notify_one();
            panic!("the waiter should fail when it wakes up");
        });
        let (lock, cvar) = &*packet;
        let mut lock = lock.lock().unwrap();
        tx.send(()).unwrap();
        let mut saw_err = false;
        while *lock == 1 {
            match cvar.wait(lock) {
                Ok(l) => {
                    lock = l;
                    assert_eq!(*lock, 1);
                }
                Err(e) => {
                    saw_err = true;
                    lock = e.into_inner();
                    break;
                }
            }
        }
        assert!(saw_err, "the wait after the notifier's panic was not Err");
        drop(lock);
        assert!(t.join().is_err());
    });
}

/// Upstream `test_mutex_arc_nested` and `test_mutex_arc_access_in_unwind`.
#[test]
fn mutex_nested_and_access_in_unwind() {
    everywhere(|| {
        let arc = Arc::new(Mutex::new(1));
        let arc2 = Arc::new(Mutex::new(arc));
        let (tx, rx) = channel();
        let _t = go(move || {
            let lock = arc2.lock().unwrap();
            let lock2 = lock.lock().unwrap();
            assert_eq!(*lock2, 1);
            tx.send(()).unwrap();
        });
        rx.recv().unwrap();

        let arc = Arc::new(Mutex::new(1));
        let arc2 = arc.clone();
        let r = go(move || {
            struct Unwinder {
                i: Arc<Mutex<i32>>,
            }
            impl Drop for Unwinder {
                fn drop(&mut self) {
                    *self.i.lock().unwrap() += 1;
                }
            }
            let _u = Unwinder { i: arc2 };
            panic!("unwind");
        })
        .join();
        assert!(r.is_err());
        assert_eq!(*arc.lock().unwrap(), 2);
    });
}

// ---------------------------------------------------------------------------
// std::sync::RwLock (library/std/tests/sync/rwlock.rs, src/sync/rwlock/tests.rs)
// ---------------------------------------------------------------------------

/// Upstream `smoke`, `test_rwlock_unsized`, `test_rwlock_try_write`,
/// `test_into_inner`, `test_into_inner_drop`, `test_get_mut`,
/// `test_downgrade_basic`.
#[test]
fn rwlock_smoke_unsized_try_write_into_inner_get_mut() {
    everywhere(|| {
        let l = RwLock::new(());
        drop(l.read().unwrap());
        drop(l.write().unwrap());
        drop((l.read().unwrap(), l.read().unwrap()));
        drop(l.write().unwrap());

        let rw: &RwLock<[i32]> = &RwLock::new([1, 2, 3]);
        {
            let b = &mut *rw.write().unwrap();
            b[0] = 4;
            b[2] = 5;
        }
        assert_eq!(&*rw.read().unwrap(), &[4, 2, 5][..]);

        let lock = RwLock::new(0isize);
        let read_guard = lock.read().unwrap();
        match lock.try_write() {
            Err(TryLockError::WouldBlock) => (),
            Ok(_) => panic!("try_write should not succeed while read_guard is in scope"),
            Err(_) => panic!("unexpected error"),
        }
        drop(read_guard);
        assert!(lock.try_write().is_ok());

        let m = RwLock::new(NonCopy(10));
        assert_eq!(m.into_inner().unwrap(), NonCopy(10));
        let drops = Arc::new(AtomicUsize::new(0));
        let m = RwLock::new(DropCounter(drops.clone()));
        {
            let _inner = m.into_inner().unwrap();
            assert_eq!(drops.load(Ordering::SeqCst), 0);
        }
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        let mut m = RwLock::new(NonCopy(10));
        *m.get_mut().unwrap() = NonCopy(20);
        assert_eq!(m.into_inner().unwrap(), NonCopy(20));

        let r = RwLock::new(());
        let write_guard = r.write().unwrap();
        let _read_guard = RwLockWriteGuard::downgrade(write_guard);
    });
}

/// Upstream `frob`: N tasks each take the lock M times, a write one time
/// in N, a read otherwise (a mix of fibers and threads in a runtime).
#[test]
fn rwlock_frob() {
    everywhere(|| {
        const N: u64 = 10;
        const M: usize = 1000;
        let r = Arc::new(RwLock::new(0u64));
        let (tx, rx) = channel::<()>();
        for i in 0..N {
            let (tx, r) = (tx.clone(), r.clone());
            let body = move || {
                let mut rng = Lcg(i + 1);
                for _ in 0..M {
                    if rng.one_in(N) {
                        *r.write().unwrap() += 1;
                    } else {
                        drop(r.read().unwrap());
                    }
                }
                drop(tx);
            };
            if i % 3 == 0 {
                drop(go_thread(body));
            } else {
                drop(go(body));
            }
        }
        drop(tx);
        assert!(rx.recv().is_err(), "every task dropped its sender");
        let _ = *r.read().unwrap();
    });
}

/// Upstream `test_rw_arc_poison_wr`, `_ww`, `test_rw_arc_no_poison_rr`,
/// `_rw`: a panicking writer poisons both `read` and `write`; a panicking
/// reader poisons nothing.
#[test]
fn rwlock_poisoning_upstream() {
    everywhere(|| {
        let arc = Arc::new(RwLock::new(1));
        let arc2 = arc.clone();
        let _ = go(move || {
            let _lock = arc2.write().unwrap();
            panic!("writer");
        })
        .join();
        assert!(arc.read().is_err());

        let arc = Arc::new(RwLock::new(1));
        assert!(!arc.is_poisoned());
        let arc2 = arc.clone();
        let _ = go(move || {
            let _lock = arc2.write().unwrap();
            panic!("writer");
        })
        .join();
        assert!(arc.write().is_err());
        assert!(arc.is_poisoned());

        let arc = Arc::new(RwLock::new(1));
        let arc2 = arc.clone();
        let _ = go(move || {
            let _lock = arc2.read().unwrap();
            panic!("reader");
        })
        .join();
        assert_eq!(*arc.read().unwrap(), 1);
        let arc2 = arc.clone();
        let _ = go(move || {
            let _lock = arc2.read().unwrap();
            panic!("reader");
        })
        .join();
        assert_eq!(*arc.write().unwrap(), 1);

        // test_into_inner_poison / test_get_mut_poison
        let m = Arc::new(RwLock::new(NonCopy(10)));
        let m2 = m.clone();
        let _ = go(move || {
            let _lock = m2.write().unwrap();
            panic!("test panic in inner task to poison RwLock");
        })
        .join();
        assert!(m.is_poisoned());
        let mut m = Arc::try_unwrap(m).unwrap();
        match m.get_mut() {
            Err(e) => assert_eq!(*e.into_inner(), NonCopy(10)),
            Ok(x) => panic!("get_mut of poisoned RwLock is Ok: {x:?}"),
        }
        match m.into_inner() {
            Err(e) => assert_eq!(e.into_inner(), NonCopy(10)),
            Ok(x) => panic!("into_inner of poisoned RwLock is Ok: {x:?}"),
        }
    });
}

/// Upstream `test_rw_arc`: a writer holds the lock while it yields ten
/// times with the value at -1 in between; readers must never see -1.
#[test]
fn rwlock_readers_never_catch_the_writer() {
    everywhere(|| {
        let arc = Arc::new(RwLock::new(0));
        let arc2 = arc.clone();
        let (tx, rx) = channel();
        let _w = go(move || {
            let mut lock = arc2.write().unwrap();
            for _ in 0..10 {
                let tmp = *lock;
                *lock = -1;
                yield_now();
                *lock = tmp + 1;
            }
            tx.send(()).unwrap();
        });
        let mut children = Vec::new();
        for i in 0..5 {
            let arc3 = arc.clone();
            let body = move || {
                let lock = arc3.read().unwrap();
                assert!(*lock >= 0);
            };
            children.push(if i % 2 == 0 { go(body) } else { go_thread(body) });
        }
        for r in children {
            assert!(r.join().is_ok());
        }
        rx.recv().unwrap();
        assert_eq!(*arc.read().unwrap(), 10);
    });
}

/// Upstream `test_rw_arc_access_in_unwind`: a destructor running during
/// the unwind takes the write lock, which is not poisoned by it.
#[test]
fn rwlock_access_in_unwind() {
    everywhere(|| {
        let arc = Arc::new(RwLock::new(1));
        let arc2 = arc.clone();
        let r = go(move || {
            struct Unwinder {
                i: Arc<RwLock<isize>>,
            }
            impl Drop for Unwinder {
                fn drop(&mut self) {
                    *self.i.write().unwrap() += 1;
                }
            }
            let _u = Unwinder { i: arc2 };
            panic!("unwind");
        })
        .join();
        assert!(r.is_err());
        assert_eq!(*arc.read().unwrap(), 2);
    });
}

/// Upstream `test_downgrade_observe`: W writers each increment N times,
/// downgrade, and still read their own value.
#[test]
fn rwlock_downgrade_observe() {
    everywhere(|| {
        const W: usize = 20;
        const N: usize = 100;
        let rw = Arc::new(RwLock::new(0));
        let handles: Vec<_> = (0..W)
            .map(|i| {
                let rw = rw.clone();
                let body = move || {
                    for _ in 0..N {
                        let mut write_guard = rw.write().unwrap();
                        *write_guard += 1;
                        let cur_val = *write_guard;
                        let read_guard = RwLockWriteGuard::downgrade(write_guard);
                        assert_eq!(cur_val, *read_guard);
                    }
                };
                if i % 4 == 0 {
                    go_thread(body)
                } else {
                    go(body)
                }
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(*rw.read().unwrap(), W * N);
    });
}

/// Upstream `test_downgrade_atomic`: W writers queue behind the main
/// writer; once it downgrades, none may slip in before it reads its value.
#[test]
fn rwlock_downgrade_atomic() {
    everywhere(|| {
        const NEW_VALUE: i32 = -1;
        const W: usize = 20;
        let rwlock = Arc::new(RwLock::new(0));
        let mut main_write_guard = rwlock.write().unwrap();
        let handles: Vec<_> = (0..W)
            .map(|i| {
                let rwlock = rwlock.clone();
                let body = move || {
                    let mut evil_guard = rwlock.write().unwrap();
                    *evil_guard += 1;
                };
                if i % 4 == 0 {
                    go_thread(body)
                } else {
                    go(body)
                }
            })
            .collect();
        // Not needed for the assertion: lets the writers queue first.
        nap(ms(42));
        *main_write_guard = NEW_VALUE;
        let main_read_guard = RwLockWriteGuard::downgrade(main_write_guard);
        assert_eq!(*main_read_guard, NEW_VALUE, "`downgrade` was not atomic");
        drop(main_read_guard);
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(*rwlock.read().unwrap(), W as i32 + NEW_VALUE);
    });
}

// ---------------------------------------------------------------------------
// std::sync::Condvar (library/std/tests/sync/condvar.rs)
// ---------------------------------------------------------------------------

/// Upstream `smoke` and `notify_one`: the waiter holds the lock while the
/// other task starts, so the notification finds it waiting.
#[test]
fn condvar_smoke_and_notify_one() {
    everywhere(|| {
        let c = Condvar::new();
        c.notify_one();
        c.notify_all();

        let m = Arc::new(Mutex::new(()));
        let m2 = m.clone();
        let c = Arc::new(Condvar::new());
        let c2 = c.clone();
        let g = m.lock().unwrap();
        let _t = go(move || {
            let _g = m2.lock().unwrap();
            c2.notify_one();
        });
        let g = c.wait(g).unwrap();
        drop(g);
    });
}

/// Upstream `notify_all`: N tasks count themselves in and wait for the
/// count to go back to 0; one `notify_all` releases every one.
#[test]
fn condvar_notify_all() {
    everywhere(|| {
        const N: usize = 10;
        let data = Arc::new((Mutex::new(0), Condvar::new()));
        let (tx, rx) = channel();
        for i in 0..N {
            let (data, tx) = (data.clone(), tx.clone());
            let body = move || {
                let (lock, cond) = &*data;
                let mut cnt = lock.lock().unwrap();
                *cnt += 1;
                if *cnt == N {
                    tx.send(()).unwrap();
                }
                while *cnt != 0 {
                    cnt = cond.wait(cnt).unwrap();
                }
                tx.send(()).unwrap();
            };
            if i % 3 == 0 {
                drop(go_thread(body));
            } else {
                drop(go(body));
            }
        }
        drop(tx);
        let (lock, cond) = &*data;
        rx.recv().unwrap();
        let mut cnt = lock.lock().unwrap();
        *cnt = 0;
        cond.notify_all();
        drop(cnt);
        for _ in 0..N {
            rx.recv().unwrap();
        }
    });
}

/// Upstream `wait_while`, `wait_timeout_wait`, `wait_timeout_while_wait`,
/// `wait_timeout_while_instant_satisfy`.
#[test]
fn condvar_wait_while_and_timeouts() {
    everywhere(|| {
        let pair = Arc::new((Mutex::new(false), Condvar::new()));
        let pair2 = pair.clone();
        let _t = go(move || {
            let (lock, cvar) = &*pair2;
            let mut started = lock.lock().unwrap();
            *started = true;
            cvar.notify_one();
        });
        let (lock, cvar) = &*pair;
        let guard = cvar.wait_while(lock.lock().unwrap(), |started| !*started);
        assert!(*guard.unwrap());

        let m = Arc::new(Mutex::new(()));
        let c = Arc::new(Condvar::new());
        loop {
            let g = m.lock().unwrap();
            let (_g, no_timeout) = c.wait_timeout(g, ms(1)).unwrap();
            // A spurious wake-up is allowed: try again.
            if no_timeout.timed_out() {
                break;
            }
        }
        let g = m.lock().unwrap();
        let (g, wait) = c.wait_timeout_while(g, ms(1), |_| true).unwrap();
        assert!(wait.timed_out(), "wait_timeout_while has no spurious wake-ups");
        let (_g, wait) = c.wait_timeout_while(g, ms(0), |_| false).unwrap();
        assert!(!wait.timed_out(), "the condition held at once: not a timeout");
    });
}

/// Upstream `wait_timeout_while_wake` and `wait_timeout_wake`: a wait of
/// `Duration::from_millis(u64::MAX)` ends with the notification, not with
/// a timeout (or an overflow panic).
#[test]
fn condvar_huge_timeout_waits_end_with_the_notification() {
    everywhere(|| {
        let pair = Arc::new((Mutex::new(false), Condvar::new()));
        let pair_copy = pair.clone();
        let (m, c) = &*pair;
        let g = m.lock().unwrap();
        let _t = go(move || {
            let (lock, cvar) = &*pair_copy;
            let mut started = lock.lock().unwrap();
            nap(ms(1));
            *started = true;
            cvar.notify_one();
        });
        let (g2, wait) = c
            .wait_timeout_while(g, Duration::from_millis(u64::MAX), |&mut notified| !notified)
            .unwrap();
        assert!(!wait.timed_out());
        assert!(*g2);
        drop(g2);

        let m = Arc::new(Mutex::new(()));
        let c = Arc::new(Condvar::new());
        loop {
            let g = m.lock().unwrap();
            let (c2, m2) = (c.clone(), m.clone());
            let notified = Arc::new(AtomicBool::new(false));
            let notified_copy = notified.clone();
            let t = go(move || {
                let _g = m2.lock().unwrap();
                nap(ms(1));
                notified_copy.store(true, Ordering::Relaxed);
                c2.notify_one();
            });
            let (g, timeout_res) = c.wait_timeout(g, Duration::from_millis(u64::MAX)).unwrap();
            assert!(!timeout_res.timed_out());
            if !notified.load(Ordering::Relaxed) {
                // A spurious wake-up: try again.
                drop(g);
                t.join().unwrap();
                continue;
            }
            drop(g);
            t.join().unwrap();
            break;
        }
    });
}

// ---------------------------------------------------------------------------
// std::sync::Barrier (library/std/tests/sync/barrier.rs)
// ---------------------------------------------------------------------------

/// Upstream `test_barrier`: N-1 tasks wait and send whether they led; none
/// gets through before the N-th arrives; exactly one leads.
#[test]
fn barrier_upstream() {
    everywhere(|| {
        const N: usize = 10;
        let barrier = Arc::new(Barrier::new(N));
        let (tx, rx) = channel();
        for i in 0..N - 1 {
            let (c, tx) = (barrier.clone(), tx.clone());
            let body = move || {
                tx.send(c.wait().is_leader()).unwrap();
            };
            if i % 3 == 0 {
                drop(go_thread(body));
            } else {
                drop(go(body));
            }
        }
        // Give the others time to arrive (not needed for the assertion).
        nap(ms(10));
        assert!(rx.try_recv().is_err(), "a party passed the barrier early");
        let mut leader_found = barrier.wait().is_leader();
        for _ in 0..N - 1 {
            if rx.recv().unwrap() {
                assert!(!leader_found, "two leaders");
                leader_found = true;
            }
        }
        assert!(leader_found);
        fn check<T: std::panic::RefUnwindSafe>(_: T) {}
        check(barrier);
    });
}

// ---------------------------------------------------------------------------
// std::sync::OnceLock (library/std/tests/sync/once_lock.rs)
// ---------------------------------------------------------------------------

/// Upstream `sync_once_cell`: a static cell filled in another task; a
/// later `get_or_init` with a panicking initializer does not run it.
#[test]
fn once_lock_static_cell() {
    static ONCE_CELL: OnceLock<i32> = OnceLock::new();
    fn body() {
        let t = go(|| {
            ONCE_CELL.get_or_init(|| 92);
            assert_eq!(ONCE_CELL.get(), Some(&92));
        });
        t.join().unwrap();
        ONCE_CELL.get_or_init(|| panic!("Kaboom!"));
        assert_eq!(ONCE_CELL.get(), Some(&92));
    }
    assert!(ONCE_CELL.get().is_none());
    everywhere(body);
}

/// Upstream `sync_once_cell_get_mut`, `sync_once_cell_drop`,
/// `sync_once_cell_drop_empty`, `clone`, `from_impl`, `partialeq_impl`,
/// `into_inner`, `is_sync_send`, `eval_once_macro`.
#[test]
fn once_lock_api_upstream() {
    everywhere(|| {
        let mut c = OnceLock::new();
        assert!(c.get_mut().is_none());
        c.set(90).unwrap();
        *c.get_mut().unwrap() += 2;
        assert_eq!(c.get_mut(), Some(&mut 92));

        let drops = Arc::new(AtomicUsize::new(0));
        let x = OnceLock::new();
        let d = drops.clone();
        go(move || {
            x.get_or_init(|| DropCounter(d.clone()));
            assert_eq!(d.load(Ordering::SeqCst), 0);
            drop(x);
        })
        .join()
        .unwrap();
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        drop(OnceLock::<String>::new());

        let s = OnceLock::new();
        let c = s.clone();
        assert!(c.get().is_none());
        s.set("hello".to_string()).unwrap();
        let c = s.clone();
        assert_eq!(c.get().map(String::as_str), Some("hello"));

        assert_eq!(OnceLock::from("value").get(), Some(&"value"));
        assert_ne!(OnceLock::from("foo").get(), Some(&"bar"));
        assert!(OnceLock::from("value") == OnceLock::from("value"));
        assert!(OnceLock::from("foo") != OnceLock::from("bar"));
        assert!(OnceLock::<String>::new() == OnceLock::new());
        assert!(OnceLock::<String>::new() != OnceLock::from("value".to_owned()));

        let cell: OnceLock<String> = OnceLock::new();
        assert_eq!(cell.into_inner(), None);
        let cell = OnceLock::new();
        cell.set("hello".to_string()).unwrap();
        assert_eq!(cell.into_inner(), Some("hello".to_string()));

        fn assert_traits<T: Send + Sync>() {}
        assert_traits::<OnceLock<String>>();

        macro_rules! eval_once {
            (|| -> $ty:ty { $($body:tt)* }) => {{
                static ONCE_CELL: OnceLock<$ty> = OnceLock::new();
                fn init() -> $ty { $($body)* }
                ONCE_CELL.get_or_init(init)
            }};
        }
        let fib: &'static Vec<i32> = eval_once! {
            || -> Vec<i32> {
                let mut res = vec![1, 1];
                for i in 0..10 {
                    let next = res[i] + res[i + 1];
                    res.push(next);
                }
                res
            }
        };
        assert_eq!(fib[5], 8);
    });
}

/// Upstream `sync_once_cell_does_not_leak_partially_constructed_boxes`:
/// readers poll `get` while writers race to `set`; every reader sees the
/// whole value. (The readers yield in their loop, as upstream's do on
/// SGX: a fiber that spins without yielding would keep a one-worker
/// runtime from running the writers.)
#[test]
fn once_lock_readers_never_see_a_partial_value() {
    fn body() {
        let cell: &'static OnceLock<String> = Box::leak(Box::new(OnceLock::new()));
        const MSG: &str = "Hello, World";
        let (tx, rx) = channel();
        for i in 0..10 {
            let tx = tx.clone();
            let reader = move || loop {
                if let Some(msg) = cell.get() {
                    tx.send(msg).unwrap();
                    break;
                }
                yield_now();
            };
            if i % 3 == 0 {
                drop(go_thread(reader));
            } else {
                drop(go(reader));
            }
        }
        for _ in 0..3 {
            drop(go(move || {
                let _ = cell.set(MSG.to_owned());
            }));
        }
        for _ in 0..10 {
            assert_eq!(rx.recv().unwrap(), MSG);
        }
    }
    everywhere(body);
}

// ---------------------------------------------------------------------------
// std::thread (library/std/src/thread/tests.rs, library/std/tests/thread.rs)
// onto fiber::{spawn, Builder, scope, park, current, JoinHandle}: fibers only.
// ---------------------------------------------------------------------------

/// Upstream `test_unnamed_thread`, `test_named_thread` (a `String` name)
/// and `test_named_thread_truncation` (the full long name is remembered).
#[test]
fn fiber_names_upstream() {
    in_fibers(|| {
        fiber::spawn(|| assert!(fiber::current().name().is_none()))
            .join()
            .expect("fiber panicked");
        fiber::Builder::new()
            .name("ada lovelace".to_string())
            .spawn(|| assert!(fiber::current().name().unwrap() == "ada lovelace"))
            .unwrap()
            .join()
            .unwrap();
        let long_name = std::iter::once("test_named_thread_truncation")
            .chain(std::iter::repeat_n(" yada", 100))
            .collect::<String>();
        let expected = long_name.clone();
        fiber::Builder::new()
            .name(long_name)
            .spawn(move || assert_eq!(fiber::current().name(), Some(expected.as_str())))
            .unwrap()
            .join()
            .unwrap();
    });
}

/// Upstream `test_run_basic`, `test_spawn_sched` (a chain of ten detached
/// spawns, the last one reports), `test_spawn_sched_childs_on_default_sched`,
/// `test_simple_newsched_spawn`, `test_child_doesnt_ref_parent`.
#[test]
fn spawn_chains_upstream() {
    in_fibers(|| {
        let (tx, rx) = channel();
        let _ = fiber::spawn(move || tx.send(()).unwrap());
        rx.recv().unwrap();

        fn f(i: i32, tx: fiber::chan::Sender<()>) {
            let tx = tx.clone();
            let _ = fiber::spawn(move || {
                if i == 0 {
                    tx.send(()).unwrap();
                } else {
                    f(i - 1, tx);
                }
            });
        }
        let (tx, rx) = channel();
        f(10, tx);
        rx.recv().unwrap();

        let (tx, rx) = channel();
        let _ = fiber::spawn(move || {
            let _ = fiber::spawn(move || tx.send(()).unwrap());
        });
        rx.recv().unwrap();

        let _ = fiber::spawn(|| {});

        const GENERATIONS: u32 = 16;
        fn child_no(x: u32, done: fiber::chan::Sender<u32>) -> Box<dyn Fn() + Send> {
            Box::new(move || {
                if x < GENERATIONS {
                    let done = done.clone();
                    let _ = fiber::spawn(move || child_no(x + 1, done)());
                } else {
                    done.send(x).unwrap();
                }
            })
        }
        let (tx, rx) = channel();
        let _ = fiber::spawn(move || child_no(0, tx)());
        assert_eq!(rx.recv().unwrap(), GENERATIONS);
    });
}

/// Upstream `test_avoid_copying_the_body_{spawn,thread_spawn,join}`: the
/// closure's boxed capture is the same allocation in the child.
#[test]
fn spawn_does_not_copy_the_body() {
    fn avoid_copying_the_body(spawnfn: impl FnOnce(Box<dyn Fn() + Send>)) {
        let (tx, rx) = channel();
        let x: Box<i32> = Box::new(1);
        let x_in_parent = (&*x as *const i32) as usize;
        spawnfn(Box::new(move || {
            let x_in_child = (&*x as *const i32) as usize;
            tx.send(x_in_child).unwrap();
        }));
        assert_eq!(x_in_parent, rx.recv().unwrap());
    }
    in_fibers(|| {
        avoid_copying_the_body(|v| {
            let _ = fiber::spawn(v);
        });
        avoid_copying_the_body(|f| {
            let _ = fiber::spawn(f);
        });
        avoid_copying_the_body(|f| {
            let _ = fiber::spawn(f).join();
        });
    });
}

/// Upstream `test_join_panic`, `test_try_panic_message_string_literal`,
/// `test_try_panic_any_message_owned_str`, `test_try_panic_any_message_any`
/// (a boxed `dyn Any` payload is itself the payload, not unwrapped),
/// `test_try_panic_any_message_unit_struct`.
#[test]
fn join_panic_payloads_upstream() {
    in_fibers(|| {
        assert!(fiber::spawn(move || panic!()).join().is_err());

        let e = fiber::spawn(|| panic!("static string"))
            .join()
            .unwrap_err()
            .into_panic();
        assert!(e.is::<&'static str>());
        assert_eq!(*e.downcast::<&'static str>().unwrap(), "static string");

        let e = fiber::spawn(|| std::panic::panic_any("owned string".to_string()))
            .join()
            .unwrap_err()
            .into_panic();
        assert!(e.is::<String>());
        assert_eq!(*e.downcast::<String>().unwrap(), "owned string");

        let e = fiber::spawn(|| std::panic::panic_any(Box::new(413u16) as Box<dyn Any + Send>))
            .join()
            .unwrap_err()
            .into_panic();
        type T = Box<dyn Any + Send>;
        assert!(e.is::<T>(), "the boxed payload was unwrapped");
        let any = e.downcast::<T>().unwrap();
        assert!(any.is::<u16>());
        assert_eq!(*any.downcast::<u16>().unwrap(), 413);

        struct Juju;
        let e = fiber::spawn(|| std::panic::panic_any(Juju)).join().unwrap_err();
        assert!(
            e.is_panic() && e.into_panic().is::<Juju>(),
            "the unit-struct payload was lost"
        );
    });
}

/// Upstream `test_is_finished`: false while the fiber waits at a barrier,
/// true within a reasonable time after, and the join is then quick.
#[test]
fn is_finished_upstream() {
    in_fibers(|| {
        let b = Arc::new(Barrier::new(2));
        let t = fiber::spawn({
            let b = b.clone();
            move || {
                b.wait();
                1234
            }
        });
        assert!(!t.is_finished());
        b.wait();
        let start = Instant::now();
        while !t.is_finished() {
            assert!(start.elapsed() < Duration::from_secs(2));
            fiber::sleep(ms(15)).unwrap();
        }
        let join_time = Instant::now();
        assert_eq!(t.join().unwrap(), 1234);
        assert!(join_time.elapsed() < Duration::from_secs(2));
    });
}

/// Upstream `test_park_unpark_before`, `test_park_timeout_unpark_before`,
/// `test_park_timeout_unpark_not_called`.
#[test]
fn park_unpark_before_upstream() {
    in_fibers(|| {
        for _ in 0..10 {
            fiber::current().unpark();
            fiber::park();
        }
        for _ in 0..10 {
            fiber::current().unpark();
            let start = Instant::now();
            fiber::park_timeout(Duration::from_millis(u32::MAX as u64));
            assert!(start.elapsed() < Duration::from_secs(10), "the token was not consumed");
        }
        for _ in 0..10 {
            fiber::park_timeout(ms(10));
        }
    });
}

/// Upstream `test_park_unpark_called_other_thread` and
/// `test_park_timeout_unpark_called_other_thread`: another fiber (or a
/// plain thread) unparks the parked fiber later. Upstream relies on
/// `spawn` not consuming the caller's park token; so does this.
#[test]
fn park_unpark_called_from_elsewhere_upstream() {
    in_fibers(|| {
        for i in 0..10 {
            let th = fiber::current();
            let unparker = move || {
                nap(ms(20));
                th.unpark();
            };
            let _guard = if i % 2 == 0 { go(unparker) } else { go_thread(unparker) };
            fiber::park();
        }
        for i in 0..10 {
            let th = fiber::current();
            let unparker = move || {
                nap(ms(20));
                th.unpark();
            };
            let _guard = if i % 2 == 0 { go(unparker) } else { go_thread(unparker) };
            fiber::park_timeout(Duration::from_millis(u32::MAX as u64));
        }
        // The token set before a spawn is still there after it.
        fiber::current().unpark();
        let _child = fiber::spawn(|| ());
        fiber::yield_now().unwrap();
        let start = Instant::now();
        fiber::park_timeout(Duration::from_secs(5));
        assert!(
            start.elapsed() < Duration::from_secs(4),
            "spawn consumed the park token"
        );
    });
}

/// Upstream `sleep_ms_smoke`, `test_thread_id_equal`,
/// `test_thread_id_not_equal` and `sleep_until` (at least the period).
#[test]
fn ids_and_sleeps_upstream() {
    in_fibers(|| {
        fiber::sleep(ms(2)).unwrap();
        assert!(fiber::current().id() == fiber::current().id());
        let spawned_id = fiber::spawn(|| fiber::current().id()).join().unwrap();
        assert!(fiber::current().id() != spawned_id);
        let now = Instant::now();
        let period = ms(100);
        fiber::sleep_until(now + period).unwrap();
        assert!(now.elapsed() >= period);
    });
}

/// Upstream `test_scoped_threads_drop_result_before_join`: a scoped
/// child's unjoined result is dropped before the scope ends, and the
/// fiber its destructor spawns into the same scope is waited for too.
#[test]
fn scope_drops_results_before_join_upstream() {
    in_fibers(|| {
        let actually_finished = &AtomicBool::new(false);
        struct X<'scope, 'env>(&'scope fiber::Scope<'scope, 'env>, &'env AtomicBool);
        impl Drop for X<'_, '_> {
            fn drop(&mut self) {
                fiber::sleep(ms(20)).unwrap();
                let actually_finished = self.1;
                self.0.spawn(move || {
                    fiber::sleep(ms(20)).unwrap();
                    actually_finished.store(true, Ordering::Relaxed);
                });
            }
        }
        fiber::scope(|s| {
            s.spawn(move || {
                fiber::sleep(ms(20)).unwrap();
                X(s, actually_finished)
            });
        });
        assert!(
            actually_finished.load(Ordering::Relaxed),
            "the scope ended before the fiber spawned by a result's destructor"
        );
    });
}

/// Upstream `test_scoped_threads_nll` (a compile test) and `scope_join_race`.
#[test]
fn scope_nll_and_join_race_upstream() {
    // The upstream compile test's exact shape: a match on a borrowed capture.
    #[allow(clippy::match_single_binding)]
    fn foo(x: &u8) {
        fiber::scope(|s| {
            s.spawn(|| match x {
                _ => (),
            });
        });
    }
    in_fibers(|| {
        let x = 42_u8;
        foo(&x);
        for _ in 0..100 {
            let a_bool = AtomicBool::new(false);
            let seen = AtomicUsize::new(0);
            fiber::scope(|s| {
                for _ in 0..10 {
                    s.spawn(|| {
                        a_bool.load(Ordering::Relaxed);
                        seen.fetch_add(1, Ordering::Relaxed);
                    });
                }
            });
            assert_eq!(seen.load(Ordering::Relaxed), 10);
        }
    });
}

// ---------------------------------------------------------------------------
// std::net::TcpListener / TcpStream (library/std/src/net/tcp/tests.rs)
// ---------------------------------------------------------------------------

use fiber::net::{TcpListener, TcpStream, UdpSocket};

/// Upstream `each_ip`: the body once over IPv4 and once over IPv6
/// loopback, with a listener bound to an ephemeral port.
fn each_ip(f: &mut dyn FnMut(TcpListener, SocketAddr)) {
    for any in ["127.0.0.1:0", "[::1]:0"] {
        let listener = TcpListener::bind(any).unwrap();
        let addr = listener.local_addr().unwrap();
        f(listener, addr);
    }
}

/// Upstream `bind_error` (TCP and UDP), `connect_error`, `double_bind`.
#[test]
fn tcp_bind_and_connect_errors_upstream() {
    everywhere(|| {
        match TcpListener::bind("1.1.1.1:9999") {
            Ok(..) => panic!("bound a non-local address"),
            Err(e) => assert_eq!(e.kind(), ErrorKind::AddrNotAvailable, "{e}"),
        }
        match UdpSocket::bind("1.1.1.1:9999") {
            Ok(..) => panic!("bound a non-local address"),
            Err(e) => assert_eq!(e.kind(), ErrorKind::AddrNotAvailable, "{e}"),
        }
        match TcpStream::connect("0.0.0.0:1") {
            Ok(..) => panic!("connected to 0.0.0.0:1"),
            Err(e) => assert!(
                matches!(
                    e.kind(),
                    ErrorKind::ConnectionRefused
                        | ErrorKind::InvalidInput
                        | ErrorKind::AddrInUse
                        | ErrorKind::AddrNotAvailable
                ),
                "bad error: {e} {:?}",
                e.kind()
            ),
        }
        each_ip(&mut |listener1, addr| match TcpListener::bind(addr) {
            Ok(listener2) => panic!("double binding allowed: {listener1:?} and {listener2:?}"),
            Err(e) => assert!(
                matches!(e.kind(), ErrorKind::ConnectionRefused | ErrorKind::AddrInUse),
                "unknown error: {e} {:?}",
                e.kind()
            ),
        });
    });
}

/// Upstream `listen_localhost`, `connect_loopback`, `smoke_test`,
/// `socket_and_peer_name`: connecting by host name and port, and the
/// accepted peer address is the client's local address.
#[test]
fn tcp_connect_by_name_and_smoke_upstream() {
    everywhere(|| {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let _t = go(move || {
            let mut stream = TcpStream::connect(("localhost", port)).unwrap();
            stream.write_all(&[144]).unwrap();
        });
        let mut stream = listener.accept().unwrap().0;
        let mut buf = [0];
        stream.read_exact(&mut buf).unwrap();
        assert_eq!(buf[0], 144);

        each_ip(&mut |acceptor, addr| {
            let _t = go(move || {
                let host = match addr {
                    SocketAddr::V4(..) => "127.0.0.1",
                    SocketAddr::V6(..) => "::1",
                };
                let mut stream = TcpStream::connect((host, addr.port())).unwrap();
                stream.write_all(&[66]).unwrap();
            });
            let mut stream = acceptor.accept().unwrap().0;
            let mut buf = [0];
            stream.read_exact(&mut buf).unwrap();
            assert_eq!(buf[0], 66);
        });

        each_ip(&mut |acceptor, addr| {
            let (tx, rx) = channel();
            let _t = go(move || {
                let mut stream = TcpStream::connect(addr).unwrap();
                stream.write_all(&[99]).unwrap();
                tx.send(stream.local_addr().unwrap()).unwrap();
            });
            let (mut stream, peer) = acceptor.accept().unwrap();
            let mut buf = [0];
            stream.read_exact(&mut buf).unwrap();
            assert_eq!(buf[0], 99);
            assert_eq!(peer, rx.recv().unwrap());
        });

        each_ip(&mut |listener, addr| {
            assert_eq!(listener.local_addr().unwrap(), addr);
            let _t = go(move || {
                listener.accept().unwrap();
            });
            let stream = TcpStream::connect(addr).unwrap();
            assert_eq!(addr, stream.peer_addr().unwrap());
        });
    });
}

/// Upstream `read_eof`, `write_close`, `partial_read`.
#[test]
fn tcp_eof_write_after_close_partial_read_upstream() {
    everywhere(|| {
        each_ip(&mut |acceptor, addr| {
            let _t = go(move || {
                let _stream = TcpStream::connect(addr).unwrap();
            });
            let mut stream = acceptor.accept().unwrap().0;
            let mut buf = [0];
            assert_eq!(stream.read(&mut buf).unwrap(), 0);
            assert_eq!(stream.read(&mut buf).unwrap(), 0);
        });
        each_ip(&mut |acceptor, addr| {
            let (tx, rx) = channel();
            let _t = go(move || {
                drop(TcpStream::connect(addr).unwrap());
                tx.send(()).unwrap();
            });
            let mut stream = acceptor.accept().unwrap().0;
            rx.recv().unwrap();
            match stream.write(&[0]) {
                Ok(n) => assert!(n <= 1),
                Err(e) => assert!(
                    matches!(
                        e.kind(),
                        ErrorKind::ConnectionReset | ErrorKind::BrokenPipe | ErrorKind::ConnectionAborted
                    ),
                    "unknown error: {e}"
                ),
            }
        });
        each_ip(&mut |srv, addr| {
            let (tx, rx) = channel();
            let _t = go(move || {
                let mut cl = srv.accept().unwrap().0;
                cl.write_all(&[10]).unwrap();
                let mut b = [0];
                cl.read_exact(&mut b).unwrap();
                tx.send(()).unwrap();
            });
            let mut c = TcpStream::connect(addr).unwrap();
            let mut b = [0; 10];
            assert_eq!(c.read(&mut b).unwrap(), 1);
            c.write_all(&[1]).unwrap();
            rx.recv().unwrap();
        });
    });
}

/// Upstream `multiple_connect_serial` (through `incoming`) and
/// `multiple_connect_interleaved_{greedy,lazy}_schedule` (each connector
/// connects, starts the next one and joins it before writing; the
/// acceptor hands each connection to a task of its own).
#[test]
fn tcp_multiple_connects_upstream() {
    everywhere(|| {
        each_ip(&mut |acceptor, addr| {
            let max = 10;
            let _t = go(move || {
                for _ in 0..max {
                    let mut stream = TcpStream::connect(addr).unwrap();
                    stream.write_all(&[99]).unwrap();
                }
            });
            for stream in acceptor.incoming().take(max) {
                let mut stream = stream.unwrap();
                let mut buf = [0];
                stream.read_exact(&mut buf).unwrap();
                assert_eq!(buf[0], 99);
            }
        });

        const MAX: usize = 10;
        fn connect(i: usize, addr: SocketAddr, greedy: bool) {
            if i == MAX {
                return;
            }
            let t = go(move || {
                let mut stream = TcpStream::connect(addr).unwrap();
                connect(i + 1, addr, greedy);
                stream.write_all(&[if greedy { i as u8 } else { 99 }]).unwrap();
            });
            assert!(t.join().is_ok(), "connector panicked");
        }
        for greedy in [true, false] {
            each_ip(&mut |acceptor, addr| {
                let (done_tx, done_rx) = channel();
                let _t = go(move || {
                    // With the greedy schedule, connection i is accepted i-th.
                    for (i, stream) in acceptor.incoming().enumerate().take(MAX) {
                        let done_tx = done_tx.clone();
                        let _t = go(move || {
                            let mut stream = stream.unwrap();
                            let mut buf = [0];
                            stream.read_exact(&mut buf).unwrap();
                            let want = if greedy { i as u8 } else { 99 };
                            done_tx.send(buf[0] == want).unwrap();
                        });
                    }
                });
                connect(0, addr, greedy);
                for _ in 0..MAX {
                    assert!(done_rx.recv().unwrap(), "a connection carried the wrong byte");
                }
            });
        }
    });
}

/// Upstream `read_vectored` and `write_vectored` (a vectored call may
/// use only the first non-empty buffer).
#[test]
fn tcp_vectored_io_upstream() {
    everywhere(|| {
        each_ip(&mut |srv, addr| {
            let mut s1 = TcpStream::connect(addr).unwrap();
            let mut s2 = srv.accept().unwrap().0;
            assert_eq!(s1.write(&[10, 11, 12]).unwrap(), 3);
            let mut a = [];
            let mut b = [0];
            let mut c = [0; 3];
            let len = s2
                .read_vectored(&mut [
                    IoSliceMut::new(&mut a),
                    IoSliceMut::new(&mut b),
                    IoSliceMut::new(&mut c),
                ])
                .unwrap();
            assert!(len > 0);
            assert_eq!(b, [10]);
            assert!(len == 1 || c == [11, 12, 0]);
        });
        each_ip(&mut |srv, addr| {
            let mut s1 = TcpStream::connect(addr).unwrap();
            let mut s2 = srv.accept().unwrap().0;
            let a = [];
            let b = [10];
            let c = [11, 12];
            let written = s1
                .write_vectored(&[IoSlice::new(&a), IoSlice::new(&b), IoSlice::new(&c)])
                .unwrap();
            assert!(written == 1 || written == 3, "{written}");
            let mut buf = [0; 4];
            let len = s2.read(&mut buf).unwrap();
            if len == 1 {
                assert_eq!(buf, [10, 0, 0, 0]);
            } else {
                // (The three bytes may arrive in two reads.)
                let mut len = len;
                while len < 3 {
                    len += s2.read(&mut buf[len..]).unwrap();
                }
                assert_eq!(buf, [10, 11, 12, 0]);
            }
        });
    });
}

/// Upstream `tcp_clone_smoke`, `tcp_clone_two_read`, `tcp_clone_two_write`:
/// a clone used by another task while the original reads or writes.
#[test]
fn tcp_clones_upstream() {
    everywhere(|| {
        each_ip(&mut |acceptor, addr| {
            let _t = go(move || {
                let mut s = TcpStream::connect(addr).unwrap();
                let mut buf = [0, 0];
                assert_eq!(s.read(&mut buf).unwrap(), 1);
                assert_eq!(buf[0], 1);
                s.write_all(&[2]).unwrap();
            });
            let mut s1 = acceptor.accept().unwrap().0;
            let s2 = s1.try_clone().unwrap();
            let (tx1, rx1) = channel();
            let (tx2, rx2) = channel();
            let _t = go(move || {
                let mut s2 = s2;
                rx1.recv().unwrap();
                s2.write_all(&[1]).unwrap();
                tx2.send(()).unwrap();
            });
            tx1.send(()).unwrap();
            let mut buf = [0, 0];
            assert_eq!(s1.read(&mut buf).unwrap(), 1);
            assert_eq!(buf[0], 2);
            rx2.recv().unwrap();
        });

        each_ip(&mut |acceptor, addr| {
            let (tx1, rx) = channel();
            let tx2 = tx1.clone();
            let _t = go(move || {
                let mut s = TcpStream::connect(addr).unwrap();
                s.write_all(&[1]).unwrap();
                rx.recv().unwrap();
                s.write_all(&[2]).unwrap();
                rx.recv().unwrap();
            });
            let mut s1 = acceptor.accept().unwrap().0;
            let s2 = s1.try_clone().unwrap();
            let (done, rx) = channel();
            let _t = go(move || {
                let mut s2 = s2;
                let mut buf = [0, 0];
                assert!(s2.read(&mut buf).unwrap() >= 1);
                tx2.send(()).unwrap();
                done.send(()).unwrap();
            });
            let mut buf = [0, 0];
            assert!(s1.read(&mut buf).unwrap() >= 1);
            tx1.send(()).unwrap();
            rx.recv().unwrap();
        });

        each_ip(&mut |acceptor, addr| {
            let reader = go(move || {
                let mut s = TcpStream::connect(addr).unwrap();
                let mut got = Vec::new();
                s.read_to_end(&mut got).unwrap();
                got.sort();
                got
            });
            let mut s1 = acceptor.accept().unwrap().0;
            let s2 = s1.try_clone().unwrap();
            let (done, rx) = channel();
            let _t = go(move || {
                let mut s2 = s2;
                s2.write_all(&[1]).unwrap();
                done.send(()).unwrap();
            });
            s1.write_all(&[2]).unwrap();
            rx.recv().unwrap();
            drop(s1);
            assert_eq!(reader.join().unwrap(), vec![1, 2]);
        });
    });
}

/// Upstream `shutdown_smoke`, `close_readwrite_smoke` (the shutdown
/// affects earlier and later clones), `close_read_wakes_up` (a clone
/// parked in a read wakes with EOF on the original's `shutdown(Read)`).
#[test]
fn tcp_shutdown_upstream() {
    everywhere(|| {
        each_ip(&mut |a, addr| {
            let _t = go(move || {
                let mut c = a.accept().unwrap().0;
                let mut b = [0];
                assert_eq!(c.read(&mut b).unwrap(), 0);
                c.write_all(&[1]).unwrap();
            });
            let mut s = TcpStream::connect(addr).unwrap();
            s.shutdown(Shutdown::Write).unwrap();
            assert!(s.write(&[1]).is_err());
            let mut b = [0, 0];
            assert_eq!(s.read(&mut b).unwrap(), 1);
            assert_eq!(b[0], 1);
        });

        each_ip(&mut |a, addr| {
            let (tx, rx) = channel::<()>();
            let _t = go(move || {
                let _s = a.accept().unwrap();
                let _ = rx.recv();
            });
            let mut b = [0];
            let mut s = TcpStream::connect(addr).unwrap();
            let mut s2 = s.try_clone().unwrap();
            s.shutdown(Shutdown::Write).unwrap();
            assert!(s.write(&[0]).is_err());
            s.shutdown(Shutdown::Read).unwrap();
            assert_eq!(s.read(&mut b).unwrap(), 0);
            assert!(s2.write(&[0]).is_err(), "the earlier clone can still write");
            assert_eq!(s2.read(&mut b).unwrap(), 0, "the earlier clone can still read");
            let mut s3 = s.try_clone().unwrap();
            assert!(s3.write(&[0]).is_err(), "a later clone can still write");
            assert_eq!(s3.read(&mut b).unwrap(), 0, "a later clone can still read");
            let _ = s2.shutdown(Shutdown::Read);
            let _ = s2.shutdown(Shutdown::Write);
            let _ = s3.shutdown(Shutdown::Read);
            let _ = s3.shutdown(Shutdown::Write);
            drop(tx);
        });

        each_ip(&mut |a, addr| {
            let (tx1, rx) = channel::<()>();
            let _t = go(move || {
                let _s = a.accept().unwrap();
                let _ = rx.recv();
            });
            let s = TcpStream::connect(addr).unwrap();
            let s2 = s.try_clone().unwrap();
            let (tx, rx) = channel();
            let _t = go(move || {
                let mut s2 = s2;
                assert_eq!(s2.read(&mut [0]).unwrap(), 0);
                tx.send(()).unwrap();
            });
            // Not needed for the assertion: lets the reader park first.
            nap(ms(20));
            s.shutdown(Shutdown::Read).unwrap();
            rx.recv().unwrap();
            drop(tx1);
        });
    });
}

/// Upstream `clone_while_reading`, `clone_accept_smoke`,
/// `clone_accept_concurrent`.
#[test]
fn tcp_clone_while_reading_and_accepting_upstream() {
    everywhere(|| {
        each_ip(&mut |accept, addr| {
            let (tx, rx) = channel();
            let (txdone, rxdone) = channel();
            let txdone2 = txdone.clone();
            let _t = go(move || {
                let mut tcp = TcpStream::connect(addr).unwrap();
                rx.recv().unwrap();
                tcp.write_all(&[0]).unwrap();
                txdone2.send(()).unwrap();
            });
            let tcp = accept.accept().unwrap().0;
            let tcp2 = tcp.try_clone().unwrap();
            let txdone3 = txdone.clone();
            let _t = go(move || {
                let mut tcp2 = tcp2;
                tcp2.read_exact(&mut [0]).unwrap();
                txdone3.send(()).unwrap();
            });
            for _ in 0..50 {
                yield_now();
            }
            let _ = tcp.try_clone().unwrap();
            tx.send(()).unwrap();
            rxdone.recv().unwrap();
            rxdone.recv().unwrap();
        });

        each_ip(&mut |a, addr| {
            let a2 = a.try_clone().unwrap();
            let _t = go(move || {
                let _ = TcpStream::connect(addr);
            });
            let _t = go(move || {
                let _ = TcpStream::connect(addr);
            });
            a.accept().unwrap();
            a2.accept().unwrap();
        });

        each_ip(&mut |a, addr| {
            let a2 = a.try_clone().unwrap();
            let (tx, rx) = channel();
            let tx2 = tx.clone();
            let _t = go(move || {
                tx.send(a.accept().unwrap()).unwrap();
            });
            let _t = go(move || {
                tx2.send(a2.accept().unwrap()).unwrap();
            });
            let _t = go(move || {
                let _ = TcpStream::connect(addr);
            });
            let _t = go(move || {
                let _ = TcpStream::connect(addr);
            });
            rx.recv().unwrap();
            rx.recv().unwrap();
        });
    });
}

/// Upstream `timeouts` (a long timeout reads back exactly; `None` after
/// clearing) and `test_timeout_zero_duration`.
#[test]
fn tcp_timeout_getters_upstream() {
    everywhere(|| {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = TcpStream::connect(("localhost", listener.local_addr().unwrap().port())).unwrap();
        let dur = Duration::new(15410, 0);
        assert_eq!(None, stream.read_timeout().unwrap());
        stream.set_read_timeout(Some(dur)).unwrap();
        assert_eq!(Some(dur), stream.read_timeout().unwrap());
        assert_eq!(None, stream.write_timeout().unwrap());
        stream.set_write_timeout(Some(dur)).unwrap();
        assert_eq!(Some(dur), stream.write_timeout().unwrap());
        stream.set_read_timeout(None).unwrap();
        assert_eq!(None, stream.read_timeout().unwrap());
        stream.set_write_timeout(None).unwrap();
        assert_eq!(None, stream.write_timeout().unwrap());
        let err = stream.set_write_timeout(Some(Duration::new(0, 0))).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
        let err = stream.set_read_timeout(Some(Duration::new(0, 0))).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
    });
}

/// How long the read-timeout ports wait, and the least that must pass
/// (upstream: 1000 ms, more than 400 ms).
const READ_TIMEOUT: Duration = Duration::from_millis(500);
const READ_TIMEOUT_FLOOR: Duration = Duration::from_millis(200);

/// Upstream `test_read_timeout` and `test_read_with_timeout`: a
/// `read_exact` that gets no (more) data fails with `WouldBlock` or
/// `TimedOut` after about the timeout.
#[test]
fn tcp_read_timeouts_upstream() {
    everywhere(|| {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut stream = TcpStream::connect(("localhost", port)).unwrap();
        stream.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
        let mut buf = [0; 10];
        let start = Instant::now();
        let kind = stream.read_exact(&mut buf).expect_err("expected error").kind();
        assert!(matches!(kind, ErrorKind::WouldBlock | ErrorKind::TimedOut), "{kind:?}");
        assert!(start.elapsed() > READ_TIMEOUT_FLOOR, "{:?}", start.elapsed());

        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut stream = TcpStream::connect(("localhost", port)).unwrap();
        stream.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
        let mut other_end = listener.accept().unwrap().0;
        other_end.write_all(b"hello world").unwrap();
        let mut buf = [0; 11];
        stream.read_exact(&mut buf).unwrap();
        assert_eq!(b"hello world", &buf[..]);
        let start = Instant::now();
        let kind = stream.read_exact(&mut buf).expect_err("expected error").kind();
        assert!(matches!(kind, ErrorKind::WouldBlock | ErrorKind::TimedOut), "{kind:?}");
        assert!(start.elapsed() > READ_TIMEOUT_FLOOR, "{:?}", start.elapsed());
    });
}

/// Upstream `nodelay`, `ttl`, `set_nonblocking`, `peek` (twice without
/// consuming, then a non-blocking peek is `WouldBlock`),
/// `connect_timeout_valid`.
#[test]
fn tcp_options_peek_nonblocking_upstream() {
    everywhere(|| {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let stream = TcpStream::connect(("localhost", port)).unwrap();
        assert!(!stream.nodelay().unwrap());
        stream.set_nodelay(true).unwrap();
        assert!(stream.nodelay().unwrap());
        stream.set_nodelay(false).unwrap();
        assert!(!stream.nodelay().unwrap());

        let ttl = 100;
        listener.set_ttl(ttl).unwrap();
        assert_eq!(ttl, listener.ttl().unwrap());
        stream.set_ttl(ttl).unwrap();
        assert_eq!(ttl, stream.ttl().unwrap());

        listener.set_nonblocking(true).unwrap();
        listener.set_nonblocking(false).unwrap();
        let mut stream = TcpStream::connect(("localhost", port)).unwrap();
        stream.set_nonblocking(false).unwrap();
        stream.set_nonblocking(true).unwrap();
        match stream.read(&mut [0]) {
            Ok(_) => panic!("expected error"),
            Err(ref e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => panic!("unexpected error {e}"),
        }

        each_ip(&mut |srv, addr| {
            let (txdone, rxdone) = channel();
            let _t = go(move || {
                let mut cl = srv.accept().unwrap().0;
                cl.write_all(&[1, 3, 3, 7]).unwrap();
                let _ = rxdone.recv();
            });
            let mut c = TcpStream::connect(addr).unwrap();
            let mut b = [0; 10];
            // (The four bytes are written at once; loopback delivers them
            // together.)
            for _ in 1..3 {
                let mut len = c.peek(&mut b).unwrap();
                while len < 4 {
                    yield_now();
                    len = c.peek(&mut b).unwrap();
                }
                assert_eq!(len, 4);
            }
            assert_eq!(c.read(&mut b).unwrap(), 4);
            c.set_nonblocking(true).unwrap();
            match c.peek(&mut b) {
                Ok(_) => panic!("expected error"),
                Err(ref e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => panic!("unexpected error {e}"),
            }
            txdone.send(()).unwrap();
        });

        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap();
    });
}

// ---------------------------------------------------------------------------
// std::net::UdpSocket (library/std/src/net/udp/tests.rs)
// ---------------------------------------------------------------------------

/// Upstream `each_ip` for UDP: two sockets on IPv4, then on IPv6 loopback.
fn each_udp(f: &mut dyn FnMut(UdpSocket, UdpSocket)) {
    for any in ["127.0.0.1:0", "[::1]:0"] {
        f(UdpSocket::bind(any).unwrap(), UdpSocket::bind(any).unwrap());
    }
}

/// Upstream `socket_smoke_test_ip4` and `socket_and_peer_name`.
#[test]
fn udp_smoke_and_names_upstream() {
    everywhere(|| {
        each_udp(&mut |server, client| {
            let server_ip = server.local_addr().unwrap();
            let client_ip = client.local_addr().unwrap();
            let (tx1, rx1) = channel();
            let (tx2, rx2) = channel();
            let _t = go(move || {
                rx1.recv().unwrap();
                client.send_to(&[99], server_ip).unwrap();
                tx2.send(()).unwrap();
            });
            tx1.send(()).unwrap();
            let mut buf = [0];
            let (nread, src) = server.recv_from(&mut buf).unwrap();
            assert_eq!(nread, 1);
            assert_eq!(buf[0], 99);
            assert_eq!(src, client_ip);
            rx2.recv().unwrap();
        });
        each_udp(&mut |sock1, sock2| {
            let addr1 = sock1.local_addr().unwrap();
            let addr2 = sock2.local_addr().unwrap();
            assert_eq!(sock1.peer_addr().unwrap_err().kind(), ErrorKind::NotConnected);
            assert!(addr1.ip().is_loopback());
            sock1.connect(addr2).unwrap();
            sock2.connect(addr1).unwrap();
            assert_eq!(addr2, sock1.peer_addr().unwrap());
            assert_eq!(addr1, sock2.peer_addr().unwrap());
        });
    });
}

/// Upstream `udp_clone_smoke`, `udp_clone_two_read`, `udp_clone_two_write`.
#[test]
fn udp_clones_upstream() {
    everywhere(|| {
        each_udp(&mut |sock1, sock2| {
            let addr1 = sock1.local_addr().unwrap();
            let addr2 = sock2.local_addr().unwrap();
            let _t = go(move || {
                let mut buf = [0, 0];
                let res = sock2.recv_from(&mut buf).unwrap();
                assert_eq!(res.0, 1);
                assert_eq!(res.1, addr1);
                assert_eq!(buf[0], 1);
                sock2.send_to(&[2], addr1).unwrap();
            });
            let sock3 = sock1.try_clone().unwrap();
            let (tx1, rx1) = channel();
            let (tx2, rx2) = channel();
            let _t = go(move || {
                rx1.recv().unwrap();
                sock3.send_to(&[1], addr2).unwrap();
                tx2.send(()).unwrap();
            });
            tx1.send(()).unwrap();
            let mut buf = [0, 0];
            let res = sock1.recv_from(&mut buf).unwrap();
            assert_eq!(res.0, 1);
            assert_eq!(res.1, addr2);
            rx2.recv().unwrap();
        });

        each_udp(&mut |sock1, sock2| {
            let addr1 = sock1.local_addr().unwrap();
            let (tx1, rx) = channel();
            let tx2 = tx1.clone();
            let _t = go(move || {
                sock2.send_to(&[1], addr1).unwrap();
                rx.recv().unwrap();
                sock2.send_to(&[2], addr1).unwrap();
                rx.recv().unwrap();
            });
            let sock3 = sock1.try_clone().unwrap();
            let (done, rx) = channel();
            let _t = go(move || {
                let mut buf = [0, 0];
                sock3.recv_from(&mut buf).unwrap();
                tx2.send(()).unwrap();
                done.send(()).unwrap();
            });
            let mut buf = [0, 0];
            sock1.recv_from(&mut buf).unwrap();
            tx1.send(()).unwrap();
            rx.recv().unwrap();
        });

        each_udp(&mut |sock1, sock2| {
            let addr2 = sock2.local_addr().unwrap();
            let (tx, rx) = channel();
            let (serv_tx, serv_rx) = channel();
            let _t = go(move || {
                let mut buf = [0, 1];
                rx.recv().unwrap();
                sock2.recv_from(&mut buf).unwrap();
                serv_tx.send(()).unwrap();
            });
            let sock3 = sock1.try_clone().unwrap();
            let (done, done_rx) = channel();
            let tx2 = tx.clone();
            let _t = go(move || {
                if sock3.send_to(&[1], addr2).is_ok() {
                    let _ = tx2.send(());
                }
                done.send(()).unwrap();
            });
            if sock1.send_to(&[2], addr2).is_ok() {
                let _ = tx.send(());
            }
            drop(tx);
            done_rx.recv().unwrap();
            serv_rx.recv().unwrap();
        });
    });
}

/// Upstream `timeouts`, `test_timeout_zero_duration`, `ttl`,
/// `hop_limit` (not in std's stable API; skipped), `set_nonblocking`.
#[test]
fn udp_timeout_getters_ttl_nonblocking_upstream() {
    everywhere(|| {
        let stream = UdpSocket::bind("127.0.0.1:0").unwrap();
        let dur = Duration::new(15410, 0);
        assert_eq!(None, stream.read_timeout().unwrap());
        stream.set_read_timeout(Some(dur)).unwrap();
        assert_eq!(Some(dur), stream.read_timeout().unwrap());
        assert_eq!(None, stream.write_timeout().unwrap());
        stream.set_write_timeout(Some(dur)).unwrap();
        assert_eq!(Some(dur), stream.write_timeout().unwrap());
        stream.set_read_timeout(None).unwrap();
        assert_eq!(None, stream.read_timeout().unwrap());
        stream.set_write_timeout(None).unwrap();
        assert_eq!(None, stream.write_timeout().unwrap());
        assert_eq!(
            stream.set_write_timeout(Some(Duration::new(0, 0))).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
        assert_eq!(
            stream.set_read_timeout(Some(Duration::new(0, 0))).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
        stream.set_ttl(100).unwrap();
        assert_eq!(100, stream.ttl().unwrap());

        each_udp(&mut |socket, _| {
            let addr = socket.local_addr().unwrap();
            socket.set_nonblocking(true).unwrap();
            socket.set_nonblocking(false).unwrap();
            socket.connect(addr).unwrap();
            socket.set_nonblocking(false).unwrap();
            socket.set_nonblocking(true).unwrap();
            match socket.recv(&mut [0]) {
                Ok(_) => panic!("expected error"),
                Err(ref e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => panic!("unexpected error {e}"),
            }
        });
    });
}

/// Upstream `test_read_timeout` and `test_read_with_timeout` (UDP).
#[test]
fn udp_read_timeouts_upstream() {
    everywhere(|| {
        let stream = UdpSocket::bind("127.0.0.1:0").unwrap();
        stream.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
        let mut buf = [0; 10];
        let start = Instant::now();
        loop {
            let kind = stream.recv_from(&mut buf).expect_err("expected error").kind();
            if kind != ErrorKind::Interrupted {
                assert!(matches!(kind, ErrorKind::WouldBlock | ErrorKind::TimedOut), "{kind:?}");
                break;
            }
        }
        assert!(start.elapsed() > READ_TIMEOUT_FLOOR);

        let addr = stream.local_addr().unwrap();
        stream.send_to(b"hello world", addr).unwrap();
        let mut buf = [0; 11];
        stream.recv_from(&mut buf).unwrap();
        assert_eq!(b"hello world", &buf[..]);
        let start = Instant::now();
        loop {
            let kind = stream.recv_from(&mut buf).expect_err("expected error").kind();
            if kind != ErrorKind::Interrupted {
                assert!(matches!(kind, ErrorKind::WouldBlock | ErrorKind::TimedOut), "{kind:?}");
                break;
            }
        }
        assert!(start.elapsed() > READ_TIMEOUT_FLOOR);
    });
}

/// Upstream `connect_send_recv`, `connect_send_peek_recv`, `peek_from`.
#[test]
fn udp_connect_send_peek_recv_upstream() {
    everywhere(|| {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = socket.local_addr().unwrap();
        socket.connect(addr).unwrap();
        socket.send(b"hello world").unwrap();
        let mut buf = [0; 11];
        socket.recv(&mut buf).unwrap();
        assert_eq!(b"hello world", &buf[..]);

        each_udp(&mut |socket, _| {
            let addr = socket.local_addr().unwrap();
            socket.connect(addr).unwrap();
            socket.send(b"hello world").unwrap();
            for _ in 1..3 {
                let mut buf = [0; 11];
                let size = socket.peek(&mut buf).unwrap();
                assert_eq!(b"hello world", &buf[..]);
                assert_eq!(size, 11);
            }
            let mut buf = [0; 11];
            assert_eq!(socket.recv(&mut buf).unwrap(), 11);
            assert_eq!(b"hello world", &buf[..]);
        });
        each_udp(&mut |socket, _| {
            let addr = socket.local_addr().unwrap();
            socket.send_to(b"hello world", addr).unwrap();
            for _ in 1..3 {
                let mut buf = [0; 11];
                let (size, _) = socket.peek_from(&mut buf).unwrap();
                assert_eq!(b"hello world", &buf[..]);
                assert_eq!(size, 11);
            }
            let mut buf = [0; 11];
            let (size, _) = socket.recv_from(&mut buf).unwrap();
            assert_eq!(b"hello world", &buf[..]);
            assert_eq!(size, 11);
        });
    });
}

/// Upstream `send_datagram_larger_than_c_int_max` (#115325): a datagram
/// longer than `c_int::MAX` bytes is rejected rather than truncated, by
/// `send_to` and by `send`. (A read-only anonymous mapping stands for the
/// buffer, as upstream's does: the kernel never reads it.)
#[test]
fn udp_datagram_larger_than_c_int_max_is_rejected() {
    struct Map(*mut libc::c_void, usize);
    impl Drop for Map {
        fn drop(&mut self) {
            // SAFETY: unmaps the mapping made below, once.
            unsafe { libc::munmap(self.0, self.1) };
        }
    }
    fn body() {
        let len = libc::c_int::MAX as usize + 1;
        // SAFETY: a fresh private anonymous read-only mapping.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let map = Map(p, len);
        // SAFETY: `len` readable bytes at `p`, alive while `map` lives.
        let data = unsafe { std::slice::from_raw_parts(map.0 as *const u8, map.1) };
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = socket.local_addr().unwrap();
        let r = socket.send_to(data, addr);
        assert!(r.is_err(), "send_to of {len} bytes: {r:?}");
        socket.connect(addr).unwrap();
        let r = socket.send(data);
        assert!(r.is_err(), "send of {len} bytes: {r:?}");
    }
    everywhere(body);
}

// ---------------------------------------------------------------------------
// std::os::unix::net (library/std/src/os/unix/net/tests.rs)
// ---------------------------------------------------------------------------

use fiber::net::unix::{SocketAddr as UnixAddr, UnixDatagram, UnixListener, UnixStream};
use std::os::linux::net::SocketAddrExt;
use std::path::{Path, PathBuf};

/// A fresh temporary directory, removed on drop (upstream `tmpdir`).
struct TempDir(PathBuf);
impl TempDir {
    fn new() -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "fiber-stdport-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    fn path(&self) -> &Path {
        &self.0
    }
}
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// An abstract name no other test (or run) uses.
fn abstract_name(tag: &str) -> Vec<u8> {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "fiber-stdport-{}-{tag}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
    .into_bytes()
}

/// Upstream `basic`, `pair`, `try_clone`, `iter`, `vectored`.
#[test]
fn unix_stream_basics_upstream() {
    everywhere(|| {
        let dir = TempDir::new();
        let socket_path = dir.path().join("sock");
        let msg1 = b"hello";
        let msg2 = b"world!";
        let listener = UnixListener::bind(&socket_path).unwrap();
        assert_eq!(Some(&*socket_path), listener.local_addr().unwrap().as_pathname());
        let t = go(move || {
            let mut stream = listener.accept().unwrap().0;
            let mut buf = [0; 5];
            stream.read_exact(&mut buf).unwrap();
            assert_eq!(&msg1[..], &buf[..]);
            stream.write_all(msg2).unwrap();
        });
        let mut stream = UnixStream::connect(&socket_path).unwrap();
        assert_eq!(Some(&*socket_path), stream.peer_addr().unwrap().as_pathname());
        stream.write_all(msg1).unwrap();
        let mut buf = vec![];
        stream.read_to_end(&mut buf).unwrap();
        assert_eq!(&msg2[..], &buf[..]);
        drop(stream);
        t.join().unwrap();

        let (mut s1, mut s2) = UnixStream::pair().unwrap();
        assert!(s1.local_addr().unwrap().is_unnamed());
        assert!(s2.peer_addr().unwrap().is_unnamed());
        let t = go(move || {
            let mut buf = [0; 5];
            s1.read_exact(&mut buf).unwrap();
            assert_eq!(&msg1[..], &buf[..]);
            s1.write_all(msg2).unwrap();
        });
        s2.write_all(msg1).unwrap();
        let mut buf = vec![];
        s2.read_to_end(&mut buf).unwrap();
        assert_eq!(&msg2[..], &buf[..]);
        drop(s2);
        t.join().unwrap();

        let socket_path = dir.path().join("sock2");
        let listener = UnixListener::bind(&socket_path).unwrap();
        let t = go(move || {
            let mut stream = listener.accept().unwrap().0;
            stream.write_all(b"hello").unwrap();
            stream.write_all(b"world").unwrap();
        });
        let mut stream = UnixStream::connect(&socket_path).unwrap();
        let mut stream2 = stream.try_clone().unwrap();
        let mut buf = [0; 5];
        stream.read_exact(&mut buf).unwrap();
        assert_eq!(b"hello", &buf);
        stream2.read_exact(&mut buf).unwrap();
        assert_eq!(b"world", &buf);
        t.join().unwrap();

        let socket_path = dir.path().join("sock3");
        let listener = UnixListener::bind(&socket_path).unwrap();
        let t = go(move || {
            for stream in listener.incoming().take(2) {
                let mut stream = stream.unwrap();
                let mut buf = [0];
                stream.read_exact(&mut buf).unwrap();
            }
        });
        for _ in 0..2 {
            let mut stream = UnixStream::connect(&socket_path).unwrap();
            stream.write_all(&[0]).unwrap();
        }
        t.join().unwrap();

        let (mut s1, mut s2) = UnixStream::pair().unwrap();
        let len = s1
            .write_vectored(&[IoSlice::new(b"hello"), IoSlice::new(b" "), IoSlice::new(b"world!")])
            .unwrap();
        assert_eq!(len, 12);
        let mut buf1 = [0; 6];
        let mut buf2 = [0; 7];
        let len = s2
            .read_vectored(&mut [IoSliceMut::new(&mut buf1), IoSliceMut::new(&mut buf2)])
            .unwrap();
        assert_eq!(len, 12);
        assert_eq!(&buf1, b"hello ");
        assert_eq!(&buf2, b"world!\0");
    });
}

/// Upstream `long_path` (a path longer than `sun_path` is `InvalidInput`
/// for connect, listener bind and datagram bind),
/// `abstract_namespace_not_allowed_connect` (a path starting with NUL is
/// not taken as an abstract name) and `test_unix_datagram_max_path`.
#[test]
fn unix_path_limits_upstream() {
    everywhere(|| {
        const SUN_PATH_MAX_LEN: usize = 108;
        let dir = TempDir::new();
        let dir_len = dir.path().as_os_str().len() + 1;
        let sock = format!("sock{}", "a".repeat(SUN_PATH_MAX_LEN.saturating_sub(dir_len)));
        let socket_path = dir.path().join(sock);
        match UnixStream::connect(&socket_path) {
            Err(ref e) if e.kind() == ErrorKind::InvalidInput => {}
            Err(e) => panic!("connect: unexpected error {e} ({:?})", e.kind()),
            Ok(_) => panic!("connect: unexpected success"),
        }
        match UnixListener::bind(&socket_path) {
            Err(ref e) if e.kind() == ErrorKind::InvalidInput => {}
            Err(e) => panic!("listener bind: unexpected error {e} ({:?})", e.kind()),
            Ok(_) => panic!("listener bind: unexpected success"),
        }
        match UnixDatagram::bind(&socket_path) {
            Err(ref e) if e.kind() == ErrorKind::InvalidInput => {}
            Err(e) => panic!("datagram bind: unexpected error {e} ({:?})", e.kind()),
            Ok(_) => panic!("datagram bind: unexpected success"),
        }
        assert!(UnixStream::connect("\0asdf").is_err());

        let sock1 = format!("sock{}", "a".repeat(SUN_PATH_MAX_LEN.saturating_sub(5 + dir_len)));
        let sock2 = format!("sock{}", "b".repeat(SUN_PATH_MAX_LEN.saturating_sub(5 + dir_len)));
        let path1 = dir.path().join(sock1);
        let path2 = dir.path().join(sock2);
        let sock1 = UnixDatagram::bind(&path1).unwrap();
        let sock2 = UnixDatagram::bind(&path2).unwrap();
        sock1.send_to(b"hello world", &path2).unwrap();
        let mut buf = [0; 11];
        sock2.recv_from(&mut buf).unwrap();
        assert_eq!(b"hello world", &buf);
    });
}

/// Upstream `timeouts`, `test_read_timeout`, `test_read_with_timeout`,
/// `test_unix_stream_timeout_zero_duration`,
/// `test_unix_datagram_timeout_zero_duration`.
#[test]
fn unix_timeouts_upstream() {
    everywhere(|| {
        let dir = TempDir::new();
        let socket_path = dir.path().join("sock");
        let listener = UnixListener::bind(&socket_path).unwrap();
        let stream = UnixStream::connect(&socket_path).unwrap();
        let dur = Duration::new(15410, 0);
        assert_eq!(None, stream.read_timeout().unwrap());
        stream.set_read_timeout(Some(dur)).unwrap();
        assert_eq!(Some(dur), stream.read_timeout().unwrap());
        assert_eq!(None, stream.write_timeout().unwrap());
        stream.set_write_timeout(Some(dur)).unwrap();
        assert_eq!(Some(dur), stream.write_timeout().unwrap());
        stream.set_read_timeout(None).unwrap();
        assert_eq!(None, stream.read_timeout().unwrap());
        stream.set_write_timeout(None).unwrap();
        assert_eq!(None, stream.write_timeout().unwrap());
        assert_eq!(
            stream.set_write_timeout(Some(Duration::new(0, 0))).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
        assert_eq!(
            stream.set_read_timeout(Some(Duration::new(0, 0))).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );

        let mut stream = UnixStream::connect(&socket_path).unwrap();
        stream.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
        let mut buf = [0; 10];
        let kind = stream.read_exact(&mut buf).expect_err("expected error").kind();
        assert!(matches!(kind, ErrorKind::WouldBlock | ErrorKind::TimedOut), "{kind:?}");

        let mut stream = UnixStream::connect(&socket_path).unwrap();
        stream.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
        // The listener's backlog holds the first two connections.
        let _first = listener.accept().unwrap();
        let _second = listener.accept().unwrap();
        let mut other_end = listener.accept().unwrap().0;
        other_end.write_all(b"hello world").unwrap();
        let mut buf = [0; 11];
        stream.read_exact(&mut buf).unwrap();
        assert_eq!(b"hello world", &buf);
        let kind = stream.read_exact(&mut buf).expect_err("expected error").kind();
        assert!(matches!(kind, ErrorKind::WouldBlock | ErrorKind::TimedOut), "{kind:?}");

        let datagram = UnixDatagram::bind(dir.path().join("dgram")).unwrap();
        assert_eq!(
            datagram
                .set_write_timeout(Some(Duration::new(0, 0)))
                .unwrap_err()
                .kind(),
            ErrorKind::InvalidInput
        );
        assert_eq!(
            datagram.set_read_timeout(Some(Duration::new(0, 0))).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
    });
}

/// Upstream `test_unix_datagram`, `test_unnamed_unix_datagram`,
/// `test_unix_datagram_connect_to_recv_addr`, `test_connect_unix_datagram`
/// (connecting again changes the default peer), `test_unix_datagram_recv`,
/// `datagram_pair`.
#[test]
fn unix_datagrams_upstream() {
    everywhere(|| {
        let dir = TempDir::new();
        let path1 = dir.path().join("sock1");
        let path2 = dir.path().join("sock2");
        let sock1 = UnixDatagram::bind(&path1).unwrap();
        let sock2 = UnixDatagram::bind(&path2).unwrap();
        let msg = b"hello world";
        sock1.send_to(msg, &path2).unwrap();
        let mut buf = [0; 11];
        sock2.recv_from(&mut buf).unwrap();
        assert_eq!(msg, &buf);

        let sock3 = UnixDatagram::unbound().unwrap();
        sock3.send_to(msg, &path1).unwrap();
        let (n, addr) = sock1.recv_from(&mut buf).unwrap();
        assert_eq!(n, 11);
        assert!(addr.is_unnamed());
        assert_eq!(msg, &buf);

        let sock1_addr = sock1.local_addr().unwrap();
        sock2.send_to_addr(msg, &sock1_addr).unwrap();
        let (_, addr) = sock1.recv_from(&mut buf).unwrap();
        let new_msg = b"hello back";
        let mut new_buf = [0; 10];
        sock1.connect_addr(&addr).unwrap();
        sock1.send(new_msg).unwrap();
        assert_eq!(sock2.recv(&mut new_buf).unwrap(), 10);
        assert_eq!(new_msg, &new_buf);

        let path3 = dir.path().join("sock3");
        let path4 = dir.path().join("sock4");
        let bsock1 = UnixDatagram::bind(&path3).unwrap();
        let bsock2 = UnixDatagram::bind(&path4).unwrap();
        let sock = UnixDatagram::unbound().unwrap();
        sock.connect(&path3).unwrap();
        let msg = b"hello there";
        sock.send(msg).unwrap();
        let (n, addr) = bsock1.recv_from(&mut buf).unwrap();
        assert_eq!(n, 11);
        assert!(addr.is_unnamed());
        assert_eq!(msg, &buf);
        sock.connect(&path4).unwrap();
        sock.send(msg).unwrap();
        bsock2.recv_from(&mut buf).unwrap();

        let path5 = dir.path().join("sock5");
        let sock5 = UnixDatagram::bind(&path5).unwrap();
        let sock6 = UnixDatagram::unbound().unwrap();
        sock6.connect(&path5).unwrap();
        sock6.send(b"hello world").unwrap();
        assert_eq!(sock5.recv(&mut buf).unwrap(), 11);
        assert_eq!(b"hello world", &buf);

        let (s1, s2) = UnixDatagram::pair().unwrap();
        let t = go(move || {
            let mut buf = [0; 5];
            s1.recv(&mut buf).unwrap();
            assert_eq!(b"hello", &buf);
            s1.send(b"world!").unwrap();
        });
        s2.send(b"hello").unwrap();
        let mut buf = [0; 6];
        s2.recv(&mut buf).unwrap();
        assert_eq!(b"world!", &buf);
        drop(s2);
        t.join().unwrap();
    });
}

/// Upstream `test_abstract_stream_connect`, `test_abstract_stream_iter`,
/// `test_abstract_datagram_bind_send_to_addr`,
/// `test_abstract_datagram_connect_addr` (Linux abstract names).
#[test]
fn unix_abstract_names_upstream() {
    everywhere(|| {
        let name = abstract_name("stream");
        let socket_addr = UnixAddr::from_abstract_name(&name).unwrap();
        let listener = UnixListener::bind_addr(&socket_addr).unwrap();
        let t = go(move || {
            let mut stream = listener.accept().unwrap().0;
            let mut buf = [0; 5];
            stream.read_exact(&mut buf).unwrap();
            assert_eq!(b"hello", &buf);
            stream.write_all(b"world").unwrap();
        });
        let mut stream = UnixStream::connect_addr(&socket_addr).unwrap();
        assert_eq!(stream.peer_addr().unwrap().as_abstract_name().unwrap(), &name[..]);
        stream.write_all(b"hello").unwrap();
        let mut buf = vec![];
        stream.read_to_end(&mut buf).unwrap();
        assert_eq!(b"world", &buf[..]);
        drop(stream);
        t.join().unwrap();

        let addr = UnixAddr::from_abstract_name(abstract_name("iter")).unwrap();
        let listener = UnixListener::bind_addr(&addr).unwrap();
        let t = go(move || {
            for stream in listener.incoming().take(2) {
                let mut stream = stream.unwrap();
                stream.read_exact(&mut [0]).unwrap();
            }
        });
        for _ in 0..2 {
            let mut stream = UnixStream::connect_addr(&addr).unwrap();
            stream.write_all(&[0]).unwrap();
        }
        t.join().unwrap();

        let n1 = abstract_name("ns1");
        let addr1 = UnixAddr::from_abstract_name(&n1).unwrap();
        let sock1 = UnixDatagram::bind_addr(&addr1).unwrap();
        assert_eq!(sock1.local_addr().unwrap().as_abstract_name().unwrap(), &n1[..]);
        let addr2 = UnixAddr::from_abstract_name(abstract_name("ns2")).unwrap();
        let sock2 = UnixDatagram::bind_addr(&addr2).unwrap();
        sock1.send_to_addr(b"hello world", &addr2).unwrap();
        let mut buf = [0; 11];
        let (len, addr) = sock2.recv_from(&mut buf).unwrap();
        assert_eq!(b"hello world", &buf);
        assert_eq!(len, 11);
        assert_eq!(addr.as_abstract_name().unwrap(), &n1[..]);

        let addr3 = UnixAddr::from_abstract_name(abstract_name("ns3")).unwrap();
        let bsock1 = UnixDatagram::bind_addr(&addr3).unwrap();
        let sock = UnixDatagram::unbound().unwrap();
        sock.connect_addr(&addr3).unwrap();
        sock.send(b"hello world").unwrap();
        let (len, addr) = bsock1.recv_from(&mut buf).unwrap();
        assert_eq!(len, 11);
        assert!(addr.is_unnamed());
        let addr4 = UnixAddr::from_abstract_name(abstract_name("ns4")).unwrap();
        let bsock2 = UnixDatagram::bind_addr(&addr4).unwrap();
        sock.connect_addr(&addr4).unwrap();
        sock.send(b"hello world").unwrap();
        bsock2.recv_from(&mut buf).unwrap();
    });
}

// ---------------------------------------------------------------------------
// thread_local! (library/std/tests/thread_local/tests.rs) onto fiber_local!
// ---------------------------------------------------------------------------

use std::cell::{Cell, RefCell};

/// A one-shot flag fibers and threads can wait for (upstream `Signal`).
#[derive(Clone, Default)]
struct Signal(Arc<(Mutex<bool>, Condvar)>);
impl Signal {
    fn notify(&self) {
        let (set, cvar) = &*self.0;
        *set.lock().unwrap() = true;
        cvar.notify_one();
    }
    fn wait(&self) {
        let (set, cvar) = &*self.0;
        let mut set = set.lock().unwrap();
        while !*set {
            set = cvar.wait(set).unwrap();
        }
    }
    fn is_set(&self) -> bool {
        *self.0 .0.lock().unwrap()
    }
}
struct NotifyOnDrop(Signal);
impl Drop for NotifyOnDrop {
    fn drop(&mut self) {
        self.0.notify();
    }
}

fiber::fiber_local! {
    static SMOKE: Cell<i32> = Cell::new(1);
    static SMOKE_CONST: Cell<i32> = const { Cell::new(1) };
    static DTOR: RefCell<Option<NotifyOnDrop>> = RefCell::new(None);
    static K1: RefCell<Option<S1>> = RefCell::new(None);
    static K2: RefCell<Option<S2>> = RefCell::new(None);
    static D1: RefCell<Option<DtorS1>> = RefCell::new(None);
    static D2: RefCell<Option<NotifyOnDrop>> = RefCell::new(None);
}

/// Upstream `smoke_no_dtor` (each fiber starts from the initializer; a
/// child's value does not leak into its parent) and `smoke_dtor` (the
/// value is dropped when the fiber ends).
#[test]
fn fiber_local_smoke_upstream() {
    in_fibers(|| {
        for key in [&SMOKE, &SMOKE_CONST] {
            key.with(|f| {
                assert_eq!(f.get(), 1);
                f.set(2);
            });
            fiber::spawn(move || key.with(|f| assert_eq!(f.get(), 1)))
                .join()
                .unwrap();
            key.with(|f| assert_eq!(f.get(), 2));
        }
        let signal = Signal::default();
        let signal2 = signal.clone();
        let t = fiber::spawn(move || {
            DTOR.with(|f| *f.borrow_mut() = Some(NotifyOnDrop(signal2)));
        });
        signal.wait();
        assert!(signal.is_set());
        t.join().unwrap();
    });
}

static HITS: AtomicUsize = AtomicUsize::new(0);
struct S1;
struct S2;
impl Drop for S1 {
    fn drop(&mut self) {
        let hits = HITS.fetch_add(1, Ordering::SeqCst) + 1;
        if hits == 1 {
            K2.with(|s| *s.borrow_mut() = Some(S2));
        } else {
            assert_eq!(hits, 3);
        }
    }
}
impl Drop for S2 {
    fn drop(&mut self) {
        let hits = HITS.fetch_add(1, Ordering::SeqCst) + 1;
        assert!(K1.try_with(|_| ()).is_ok());
        assert_eq!(hits, 2);
        K1.with(|s| *s.borrow_mut() = Some(S1));
    }
}

/// Upstream `circular`: a destructor stores a value into another
/// fiber-local whose destructor stores one back into the first; each runs
/// exactly once, in that order, when the fiber ends.
#[test]
fn fiber_local_circular_upstream() {
    in_fibers(|| {
        HITS.store(0, Ordering::SeqCst);
        fiber::spawn(|| drop(S1)).join().unwrap();
        assert_eq!(HITS.load(Ordering::SeqCst), 3);
    });
}

struct DtorS1(Signal);
impl Drop for DtorS1 {
    fn drop(&mut self) {
        let signal = self.0.clone();
        let _ = D2.try_with(|s| *s.borrow_mut() = Some(NotifyOnDrop(signal)));
    }
}

/// Upstream `dtors_in_dtors_in_dtors`: a value a destructor stores in
/// another fiber-local is dropped too (the waiter would wait forever).
#[test]
fn fiber_local_dtors_in_dtors_upstream() {
    in_fibers(|| {
        let signal = Signal::default();
        let signal2 = signal.clone();
        let _t = fiber::spawn(move || {
            D1.with(|s| *s.borrow_mut() = Some(DtorS1(signal2)));
        });
        signal.wait();
    });
}

/// Upstream `join_orders_after_tls_destructors` (simplified: the
/// destructor yields a while before it records that it ran) and
/// `thread_current_in_dtor` (`current()` still names the fiber in a
/// fiber-local destructor).
#[test]
fn fiber_local_destructors_run_before_join_and_see_current() {
    struct SlowDrop(Arc<AtomicBool>);
    impl Drop for SlowDrop {
        fn drop(&mut self) {
            for _ in 0..50 {
                let _ = fiber::yield_now();
            }
            self.0.store(true, Ordering::SeqCst);
        }
    }
    struct RetrieveName(Arc<std::sync::Mutex<Option<String>>>);
    impl Drop for RetrieveName {
        fn drop(&mut self) {
            *self.0.lock().unwrap() = fiber::core::current_handle().and_then(|h| h.name().map(str::to_owned));
        }
    }
    fiber::fiber_local! {
        static SLOW: RefCell<Option<SlowDrop>> = RefCell::new(None);
        static RETRIEVE: RefCell<Option<RetrieveName>> = RefCell::new(None);
    }
    in_fibers(|| {
        for _ in 0..10 {
            let done = Arc::new(AtomicBool::new(false));
            let d = done.clone();
            let h = fiber::Builder::new()
                .name("thread1")
                .spawn(move || SLOW.with(|s| *s.borrow_mut() = Some(SlowDrop(d))))
                .unwrap();
            h.join().unwrap();
            assert!(
                done.load(Ordering::SeqCst),
                "join returned before the fiber-local destructors ran"
            );
        }
        let name = Arc::new(std::sync::Mutex::new(None));
        let n = name.clone();
        fiber::Builder::new()
            .name("test")
            .spawn(move || RETRIEVE.with(|s| *s.borrow_mut() = Some(RetrieveName(n))))
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(name.lock().unwrap().as_deref(), Some("test"));
    });
}

// ---------------------------------------------------------------------------
// Further std rules (std's documentation) that a port relies on
// ---------------------------------------------------------------------------

/// std's `Debug` texts for the lock types (what a log line ported from std
/// prints): `Mutex { data: .., poisoned: .., .. }`, `<locked>` while held,
/// `RwLock` alike, `OnceLock(<uninit>)`, `WaitTimeoutResult(..)`,
/// `Condvar { .. }`, `Barrier { .. }`, `BarrierWaitResult { is_leader: .. }`.
#[test]
fn sync_debug_texts_are_std_s() {
    everywhere(|| {
        let mut diffs = Vec::new();
        let mut check = |what: &str, ours: String, theirs: String| {
            if ours != theirs {
                diffs.push(format!("{what}: fiber {ours:?}, std {theirs:?}"));
            }
        };
        let ours = Mutex::new(1);
        let theirs = std::sync::Mutex::new(1);
        check("Mutex", format!("{ours:?}"), format!("{theirs:?}"));
        {
            let _a = ours.lock().unwrap();
            let _b = theirs.lock().unwrap();
            check("locked Mutex", format!("{ours:?}"), format!("{theirs:?}"));
        }
        let ours = new_poisoned_mutex(2);
        let theirs = std::sync::Mutex::new(2);
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _g = theirs.lock().unwrap();
            panic!("poison");
        }));
        check("poisoned Mutex", format!("{ours:?}"), format!("{theirs:?}"));
        let ours = RwLock::new("x");
        let theirs = std::sync::RwLock::new("x");
        check("RwLock", format!("{ours:?}"), format!("{theirs:?}"));
        {
            let _a = ours.write().unwrap();
            let _b = theirs.write().unwrap();
            check("write-locked RwLock", format!("{ours:?}"), format!("{theirs:?}"));
        }
        check(
            "empty OnceLock",
            format!("{:?}", OnceLock::<u8>::new()),
            format!("{:?}", std::sync::OnceLock::<u8>::new()),
        );
        check(
            "full OnceLock",
            format!("{:?}", OnceLock::from(5)),
            format!("{:?}", std::sync::OnceLock::from(5)),
        );
        let m = Mutex::new(());
        let (_g, r) = Condvar::new().wait_timeout(m.lock().unwrap(), ms(1)).unwrap();
        let sm = std::sync::Mutex::new(());
        let (_sg, sr) = std::sync::Condvar::new()
            .wait_timeout(sm.lock().unwrap(), ms(1))
            .unwrap();
        check("WaitTimeoutResult", format!("{r:?}"), format!("{sr:?}"));
        check(
            "Condvar",
            format!("{:?}", Condvar::new()),
            format!("{:?}", std::sync::Condvar::new()),
        );
        check(
            "BarrierWaitResult",
            format!("{:?}", Barrier::new(1).wait()),
            format!("{:?}", std::sync::Barrier::new(1).wait()),
        );
        check(
            "Barrier",
            format!("{:?}", Barrier::new(3)),
            format!("{:?}", std::sync::Barrier::new(3)),
        );
        assert!(diffs.is_empty(), "Debug texts differ from std's:\n{}", diffs.join("\n"));
    });
}

/// std: `connect`, `bind` and `send_to` given an address list that
/// resolves to nothing fail with `InvalidInput`.
#[test]
fn empty_address_lists_are_invalid_input() {
    everywhere(|| {
        let none: &[SocketAddr] = &[];
        assert_eq!(TcpStream::connect(none).unwrap_err().kind(), ErrorKind::InvalidInput);
        assert_eq!(TcpListener::bind(none).unwrap_err().kind(), ErrorKind::InvalidInput);
        assert_eq!(UdpSocket::bind(none).unwrap_err().kind(), ErrorKind::InvalidInput);
        let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
        assert_eq!(udp.send_to(b"x", none).unwrap_err().kind(), ErrorKind::InvalidInput);
        assert_eq!(udp.connect(none).unwrap_err().kind(), ErrorKind::InvalidInput);
    });
}

/// std (`Thread::unpark`): "if the token was already available, ...;
/// otherwise it becomes available" -- also for a thread that has not run
/// yet. The handle's `unpark` before the child's first `park` is kept.
#[test]
fn unpark_through_the_handle_before_the_child_parks() {
    in_fibers(|| {
        for _ in 0..10 {
            let h = fiber::spawn(|| {
                fiber::park();
                1
            });
            h.fiber().unpark();
            assert_eq!(h.join().unwrap(), 1);
        }
    });
}

/// std (`OnceLock::set`): "May block if another thread is currently
/// attempting to initialize the cell. The cell is guaranteed to contain a
/// value when set returns, though not necessarily the one provided"; `get`
/// never blocks (`None` while the initializer runs).
#[test]
fn once_lock_set_during_an_initialization_waits_for_it() {
    everywhere(|| {
        let cell: Arc<OnceLock<u32>> = Arc::new(OnceLock::new());
        let (started_tx, started_rx) = channel();
        let (go_tx, go_rx) = channel::<()>();
        let c = cell.clone();
        let init = go(move || {
            *c.get_or_init(|| {
                started_tx.send(()).unwrap();
                go_rx.recv().unwrap();
                1
            })
        });
        started_rx.recv().unwrap();
        assert_eq!(cell.get(), None, "get during the initialization");
        let c = cell.clone();
        let setter = go(move || {
            let r = c.set(2);
            (r, c.get().copied())
        });
        nap(ms(20));
        go_tx.send(()).unwrap();
        assert_eq!(setter.join().unwrap(), (Err(2), Some(1)));
        assert_eq!(init.join().unwrap(), 1);
    });
}

/// std on Linux: a UDP `recv_from` into an empty buffer takes the next
/// datagram, returns 0 bytes and its sender, and discards it; `peek_from`
/// into an empty buffer leaves it queued.
#[test]
fn udp_empty_buffer_receives_discard_a_datagram_like_std() {
    everywhere(|| {
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b_addr = b.local_addr().unwrap();
        a.send_to(b"first", b_addr).unwrap();
        a.send_to(b"second", b_addr).unwrap();
        let (n, from) = b.peek_from(&mut []).unwrap();
        assert_eq!((n, from), (0, a.local_addr().unwrap()));
        let (n, from) = b.recv_from(&mut []).unwrap();
        assert_eq!((n, from), (0, a.local_addr().unwrap()));
        let mut buf = [0u8; 16];
        let (n, _) = b.recv_from(&mut buf).unwrap();
        assert_eq!(
            &buf[..n],
            b"second",
            "the empty receive did not discard the first datagram"
        );
    });
}

/// The error kinds std reports on this machine for common failures, for
/// the same calls on `fiber::net` (compared with std's own result).
#[test]
fn error_kinds_match_std_s() {
    everywhere(|| {
        let dir = TempDir::new();
        let mut diffs = Vec::new();
        let mut check = |what: &str, ours: std::io::Result<()>, theirs: std::io::Result<()>| {
            let o = ours.map_err(|e| e.kind());
            let t = theirs.map_err(|e| e.kind());
            if o != t {
                diffs.push(format!("{what}: fiber {o:?}, std {t:?}"));
            }
        };
        let missing = dir.path().join("missing");
        check(
            "UnixStream::connect(missing path)",
            UnixStream::connect(&missing).map(drop),
            std::os::unix::net::UnixStream::connect(&missing).map(drop),
        );
        let file = dir.path().join("file");
        std::fs::write(&file, b"").unwrap();
        check(
            "UnixStream::connect(regular file)",
            UnixStream::connect(&file).map(drop),
            std::os::unix::net::UnixStream::connect(&file).map(drop),
        );
        let taken = dir.path().join("taken");
        let _l = UnixListener::bind(&taken).unwrap();
        check(
            "UnixListener::bind(path in use)",
            UnixListener::bind(&taken).map(drop),
            std::os::unix::net::UnixListener::bind(&taken).map(drop),
        );
        check(
            "UnixDatagram::bind(path in use)",
            UnixDatagram::bind(&taken).map(drop),
            std::os::unix::net::UnixDatagram::bind(&taken).map(drop),
        );
        let ours = UnixDatagram::unbound().unwrap();
        let theirs = std::os::unix::net::UnixDatagram::unbound().unwrap();
        check(
            "UnixDatagram::send_to(missing path)",
            ours.send_to(b"x", &missing).map(drop),
            theirs.send_to(b"x", &missing).map(drop),
        );
        check(
            "UnixDatagram::send(unconnected)",
            ours.send(b"x").map(drop),
            theirs.send(b"x").map(drop),
        );
        check(
            "UnixDatagram::connect(missing path)",
            ours.connect(&missing),
            theirs.connect(&missing),
        );
        let ours = UdpSocket::bind("127.0.0.1:0").unwrap();
        let theirs = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        check(
            "UdpSocket::send(unconnected)",
            ours.send(b"x").map(drop),
            theirs.send(b"x").map(drop),
        );
        check(
            "UdpSocket::send_to(IPv6 target from an IPv4 socket)",
            ours.send_to(b"x", "[::1]:9").map(drop),
            theirs.send_to(b"x", "[::1]:9").map(drop),
        );
        let (ours_a, _ours_b) = UnixStream::pair().unwrap();
        let (theirs_a, _theirs_b) = std::os::unix::net::UnixStream::pair().unwrap();
        check(
            "UnixStream::set_write_timeout(Some(0))",
            ours_a.set_write_timeout(Some(Duration::ZERO)),
            theirs_a.set_write_timeout(Some(Duration::ZERO)),
        );
        let (ours_a, _ours_b) = UnixDatagram::pair().unwrap();
        let (theirs_a, _theirs_b) = std::os::unix::net::UnixDatagram::pair().unwrap();
        ours_a.shutdown(Shutdown::Write).unwrap();
        theirs_a.shutdown(Shutdown::Write).unwrap();
        check(
            "UnixDatagram::send after shutdown(Write)",
            ours_a.send(b"x").map(drop),
            theirs_a.send(b"x").map(drop),
        );
        assert!(diffs.is_empty(), "error kinds differ from std's:\n{}", diffs.join("\n"));
    });
}

/// std::thread::scope docs: scoped threads may borrow mutably, and the
/// borrows end when the scope returns; `Builder::spawn_scoped` names the
/// child; a panicking child that the body did not join makes `scope`
/// panic after all children ended.
#[test]
fn scope_doc_examples() {
    in_fibers(|| {
        let mut a = vec![1, 2, 3];
        let mut x = 0;
        fiber::scope(|s| {
            s.spawn(|| {
                assert_eq!(a.len(), 3);
            });
            s.spawn(|| {
                x += a[0] + a[2];
            });
        });
        a.push(4);
        assert_eq!(x, a.len());
        let name = fiber::scope(|s| {
            fiber::Builder::new()
                .name("scoped-x")
                .spawn_scoped(s, || fiber::current().name().map(str::to_owned))
                .unwrap()
                .join()
                .unwrap()
        });
        assert_eq!(name.as_deref(), Some("scoped-x"));
        let finished = AtomicUsize::new(0);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            fiber::scope(|s| {
                s.spawn(|| panic!("unjoined"));
                s.spawn(|| {
                    finished.fetch_add(1, Ordering::SeqCst);
                });
            })
        }));
        assert!(r.is_err(), "an unjoined panicking child did not make scope panic");
    });
}
