//! Port of the test suite of `may` (github.com/Xudong-Huang/may) to `fiber`.
//! Every ported test runs in up to three modes, each under a 60 s watchdog:
//! W1 (inside a fiber, workers=max_workers=1), W2 (workers=max_workers=2),
//! TH (body on a plain thread; `go` spawns through a Runtime handle).
// The ports keep the shapes of the upstream tests.
#![allow(clippy::all)]

use fiber::chan::{self, RecvTimeoutError, TryRecvError};
use fiber::JoinHandle;
use std::cell::RefCell;
use std::io::{Read, Write};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------- harness

#[derive(Clone, Copy, Debug)]
enum Mode {
    W1,
    W2,
    TH,
}

thread_local! {
    static HANDLE: RefCell<Option<fiber::Handle>> = const { RefCell::new(None) };
}

fn panic_msg(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "<non-string panic>".into()
    }
}

fn run_mode(name: &str, mode: Mode, body: fn()) {
    let label = format!("{name} [{mode:?}]");
    let (tx, rx) = std::sync::mpsc::channel();
    thread::Builder::new()
        .name(label.clone())
        .spawn(move || {
            let r = std::panic::catch_unwind(AssertUnwindSafe(|| match mode {
                Mode::W1 | Mode::W2 => {
                    let n = if let Mode::W1 = mode { 1 } else { 2 };
                    let rt = fiber::Runtime::builder().workers(n).max_workers(n).build().unwrap();
                    rt.block_on(body);
                }
                Mode::TH => {
                    let rt = fiber::Runtime::builder().workers(2).max_workers(2).build().unwrap();
                    HANDLE.with(|h| *h.borrow_mut() = Some(rt.handle()));
                    body();
                    HANDLE.with(|h| *h.borrow_mut() = None);
                    drop(rt);
                }
            }));
            let _ = tx.send(r.map_err(|p| panic_msg(&*p)));
        })
        .unwrap();
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(Ok(())) => {}
        Ok(Err(m)) => panic!("{label}: panicked: {m}"),
        Err(_) => panic!("{label}: HANG (60 s watchdog expired)"),
    }
}

/// `go!`: a fiber; from a plain thread, through the mode's runtime handle.
fn go<F, T>(f: F) -> JoinHandle<T>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    if fiber::core::in_fiber() {
        fiber::spawn(f)
    } else if let Some(h) = HANDLE.with(|h| h.borrow().clone()) {
        h.spawn(f)
    } else {
        fiber::Handle::current().spawn(f)
    }
}

/// may's `coroutine::sleep` works in both contexts.
fn msleep(ms: u64) {
    if fiber::core::in_fiber() {
        let _ = fiber::sleep(Duration::from_millis(ms));
    } else {
        thread::sleep(Duration::from_millis(ms));
    }
}

/// Join a std thread without blocking the worker thread (README "Blocking calls").
fn tjoin<T: Send + 'static>(t: thread::JoinHandle<T>) -> thread::Result<T> {
    if fiber::core::in_fiber() {
        fiber::blocking(move || t.join())
    } else {
        t.join()
    }
}

fn yield_any() {
    if fiber::core::in_fiber() {
        let _ = fiber::yield_now();
    } else {
        thread::yield_now();
    }
}

macro_rules! port {
    ($name:ident, [$($mode:ident),*], $body:block) => {
        #[test]
        fn $name() {
            fn body() $body
            $( run_mode(stringify!($name), Mode::$mode, body); )*
        }
    };
    ($name:ident, $body:block) => { port!($name, [W1, W2, TH], $body); };
}

fn tmp_path(tag: &str) -> std::path::PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "fiber_conformance_may_{}_{}_{}",
        std::process::id(),
        tag,
        N.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

// ---------------------------------------------------------------- tests/lib.rs

port!(lib_panic_coroutine, {
    let j: JoinHandle<()> = go(move || panic!("panic inside coroutine"));
    match j.join() {
        Ok(_) => panic!("test should return panic"),
        Err(e) => {
            assert!(e.is_panic());
            let p = e.into_panic();
            assert_eq!(p.downcast_ref::<&str>(), Some(&"panic inside coroutine"));
        }
    }
});

port!(lib_cancel_coroutine, {
    let j = go(move || {
        fiber::park();
        // may: the next "sys call" raises Cancel; fiber: the wait returns Err.
        fiber::sleep(Duration::from_secs(1_000_000))
    });
    msleep(10);
    j.cancel();
    match j.join() {
        Ok(v) => panic!("cancelled fiber joined Ok({v:?})"),
        Err(e) => assert!(e.is_cancelled(), "{e:?}"),
    }
});

port!(lib_cancel_io_coroutine, {
    let listener = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (tx, rx) = chan::bounded(1);
    let j = go(move || {
        tx.send(()).unwrap();
        for stream in listener.incoming() {
            match stream {
                Ok(_s) => {}
                Err(e) => return Err(e), // may panics with Cancel here
            }
        }
        Ok(())
    });
    rx.recv().unwrap();
    msleep(10);
    j.cancel();
    match j.join() {
        Ok(v) => panic!("cancelled accept joined Ok({v:?})"),
        Err(e) => assert!(e.is_cancelled(), "{e:?}"),
    }
});

port!(lib_one_coroutine, {
    go(move || {}).join().unwrap();
});

port!(lib_coroutine_result, {
    assert_eq!(go(move || 100).join().unwrap(), 100);
});

port!(lib_multi_coroutine, {
    let n = Arc::new(AtomicUsize::new(0));
    for _ in 0..10 {
        let n = n.clone();
        go(move || {
            n.fetch_add(1, Ordering::SeqCst);
        });
    }
    let t = Instant::now();
    while n.load(Ordering::SeqCst) != 10 && t.elapsed() < Duration::from_secs(5) {
        msleep(10);
    }
    assert_eq!(n.load(Ordering::SeqCst), 10);
});

port!(lib_test_yield, {
    go(move || {
        fiber::yield_now().unwrap();
    })
    .join()
    .unwrap();
});

port!(lib_multi_yield, {
    let n = Arc::new(AtomicUsize::new(0));
    let hs: Vec<_> = (0..10)
        .map(|_| {
            let n = n.clone();
            go(move || {
                n.fetch_add(1, Ordering::SeqCst);
                fiber::yield_now().unwrap();
                n.fetch_add(1, Ordering::SeqCst);
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    assert_eq!(n.load(Ordering::SeqCst), 20);
});

port!(lib_spawn_inside, [W1, W2], {
    let done = Arc::new(AtomicUsize::new(0));
    let d = done.clone();
    fiber::Builder::new()
        .name("parent")
        .spawn(move || {
            let me = fiber::current();
            assert_eq!(me.name(), Some("parent"));
            for _ in 0..10 {
                let d = d.clone();
                fiber::spawn(move || {
                    fiber::yield_now().unwrap();
                    d.fetch_add(1, Ordering::SeqCst);
                });
            }
            fiber::yield_now().unwrap();
        })
        .unwrap_or_else(|e| panic!("{e}"))
        .join()
        .unwrap();
    let t = Instant::now();
    while done.load(Ordering::SeqCst) != 10 && t.elapsed() < Duration::from_secs(5) {
        msleep(10);
    }
    assert_eq!(done.load(Ordering::SeqCst), 10);
});

port!(lib_wait_join, {
    let j = go(move || {
        let join: Vec<_> = (0..10)
            .map(|i| {
                fiber::spawn(move || {
                    fiber::yield_now().unwrap();
                    i
                })
            })
            .collect();
        join.into_iter().map(|j| j.join().unwrap()).sum::<i32>()
    });
    assert_eq!(j.join().unwrap(), 45);
});

port!(lib_scoped_coroutine, [W1, W2], {
    let mut array = [1, 2, 3];
    fiber::scope(|s| {
        for i in &mut array {
            s.spawn(move || *i += 1);
        }
    });
    assert_eq!(array, [2, 3, 4]);
});

port!(lib_unpark, [W1, W2], {
    let mut a = 0;
    let mut b = 0;
    let (htx, hrx) = chan::bounded(1);
    fiber::scope(|s| {
        s.spawn(|| {
            let co = fiber::current();
            htx.send(co.clone()).unwrap();
            co.unpark();
            a = 5;
            b += a;
            fiber::park();
            a = 10;
            b += a;
            fiber::park();
        });
        let h = hrx.recv().unwrap();
        let _ = fiber::sleep(Duration::from_millis(100));
        h.unpark();
    });
    assert_eq!(a, 10);
    assert_eq!(b, 15);
});

port!(lib_unpark_handle, {
    let a = Arc::new(AtomicUsize::new(0));
    let b = Arc::new(AtomicUsize::new(0));
    let (a2, b2) = (a.clone(), b.clone());
    let h = go(move || {
        let co = fiber::current();
        co.unpark();
        a2.store(5, Ordering::SeqCst);
        b2.fetch_add(5, Ordering::SeqCst);
        fiber::park();
        a2.store(10, Ordering::SeqCst);
        b2.fetch_add(10, Ordering::SeqCst);
        fiber::park();
    });
    msleep(100);
    h.fiber().unpark();
    msleep(50);
    h.fiber().unpark();
    h.join().unwrap();
    assert_eq!(a.load(Ordering::SeqCst), 10);
    assert_eq!(b.load(Ordering::SeqCst), 15);
});

port!(lib_park_timeout, {
    let a = Arc::new(AtomicUsize::new(0));
    let a2 = a.clone();
    let h = go(move || {
        let co = fiber::current();
        co.unpark();
        a2.store(5, Ordering::SeqCst);
        fiber::park_timeout(Duration::from_millis(100));
        let now = Instant::now();
        fiber::park_timeout(Duration::from_millis(10));
        assert!(now.elapsed() >= Duration::from_millis(10), "{:?}", now.elapsed());
        fiber::park_timeout(Duration::from_millis(100));
        assert_eq!(a2.load(Ordering::SeqCst), 5);
        a2.store(10, Ordering::SeqCst);
    });
    msleep(50);
    h.fiber().unpark();
    h.join().unwrap();
    assert_eq!(a.load(Ordering::SeqCst), 10);
});

port!(lib_test_sleep, [W1, W2], {
    let now = Instant::now();
    fiber::sleep(Duration::from_millis(500)).unwrap();
    assert!(now.elapsed() >= Duration::from_millis(500));
    fiber::scope(|s| {
        for _ in 0..1000 {
            s.spawn(|| {
                let now = Instant::now();
                fiber::sleep(Duration::from_millis(100)).unwrap();
                assert!(now.elapsed() >= Duration::from_millis(100));
            });
        }
    });
});

// may's join! = run the blocks concurrently and wait for all.
port!(lib_join_macro, [W1, W2], {
    let (tx1, rx1) = chan::unbounded();
    let (tx2, rx2) = chan::unbounded();
    fiber::spawn(move || {
        tx2.send("hello").unwrap();
        fiber::sleep(Duration::from_millis(100)).unwrap();
        tx1.send(42).unwrap();
    });
    fiber::scope(|s| {
        s.spawn(|| fiber::sleep(Duration::from_millis(1000)).unwrap());
        s.spawn(|| assert_eq!(rx1.recv().unwrap(), 42));
        s.spawn(|| assert_eq!(rx2.recv().unwrap(), "hello"));
    });
    assert!(rx1.try_recv().is_err());
    assert!(rx2.try_recv().is_err());
});

port!(lib_go_with_macro, {
    let (tx2, rx2) = chan::unbounded();
    let b = fiber::Builder::new().name("test_task").stack_size(64 * 1024);
    let f = move || {
        let task = fiber::current();
        tx2.send(task.name().map(ToOwned::to_owned)).unwrap();
    };
    let h = if fiber::core::in_fiber() {
        b.spawn(f).unwrap()
    } else {
        HANDLE
            .with(|h| h.borrow().clone())
            .unwrap()
            .block_on(move || b.spawn(f).unwrap())
    };
    h.join().unwrap();
    assert_eq!(rx2.recv().unwrap(), Some("test_task".to_owned()));
});

// ---------------------------------------------------------------- tests/local.rs

fiber::fiber_local!(static FOO3: i32 = 3);
fn square(i: i32) -> i32 {
    i * i
}
fiber::fiber_local!(static FOO9: i32 = square(3));
fiber::fiber_local!(static FOOA: AtomicUsize = AtomicUsize::new(0));

port!(local_in_thread, {
    FOO3.with(|f| assert_eq!(*f, 3));
});

port!(local_coroutine_local, {
    go(|| FOO9.with(|f| assert_eq!(*f, 9))).join().unwrap();
});

port!(local_coroutine_local_many, [W1, W2], {
    fiber::scope(|s| {
        for i in 0..10 {
            s.spawn(move || {
                FOOA.with(|f| {
                    assert_eq!(f.load(Ordering::Relaxed), 0);
                    f.store(i, Ordering::Relaxed);
                    let _ = fiber::yield_now();
                    assert_eq!(f.load(Ordering::Relaxed), i);
                });
            });
        }
    });
    FOOA.with(|f| assert_eq!(f.load(Ordering::Relaxed), 0));
});

port!(local_coroutine_local_many_thread_after, [TH], {
    let hs: Vec<_> = (1..=10)
        .map(|i| {
            go(move || {
                FOOA.with(|f| {
                    assert_eq!(f.load(Ordering::Relaxed), 0);
                    f.store(i, Ordering::Relaxed);
                })
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    FOOA.with(|f| assert_eq!(f.load(Ordering::Relaxed), 0));
});

// ---------------------------------------------------------------- src/sync/mutex.rs

use fiber::sync::{Barrier, Condvar, Mutex, RwLock, Semaphore, WaitGroup};

#[derive(Eq, PartialEq, Debug)]
struct NonCopy(i32);

port!(mutex_smoke, {
    let m = Mutex::new(());
    drop(m.lock().unwrap());
    drop(m.lock().unwrap());
});

port!(mutex_lots_and_lots, {
    const J: u32 = 1000;
    const K: u32 = 3;
    let m = Arc::new(Mutex::new(0));
    fn inc(m: &Mutex<u32>) {
        for _ in 0..J {
            *m.lock().unwrap() += 1;
        }
    }
    let (tx, rx) = chan::unbounded();
    for _ in 0..K {
        let tx2 = tx.clone();
        let m2 = m.clone();
        thread::spawn(move || {
            inc(&m2);
            tx2.send(()).unwrap();
        });
        let tx2 = tx.clone();
        let m2 = m.clone();
        go(move || {
            inc(&m2);
            tx2.send(()).unwrap();
        });
    }
    drop(tx);
    for _ in 0..2 * K {
        rx.recv().unwrap();
    }
    assert_eq!(*m.lock().unwrap(), J * K * 2);
});

port!(mutex_try_lock, {
    let m = Mutex::new(());
    *m.try_lock().unwrap() = ();
});

port!(mutex_into_inner, {
    let m = Mutex::new(NonCopy(10));
    assert_eq!(m.into_inner().unwrap(), NonCopy(10));
});

struct DropCount(Arc<AtomicUsize>);
impl Drop for DropCount {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

port!(mutex_into_inner_drop, {
    let num_drops = Arc::new(AtomicUsize::new(0));
    let m = Mutex::new(DropCount(num_drops.clone()));
    assert_eq!(num_drops.load(Ordering::SeqCst), 0);
    {
        let _inner = m.into_inner().unwrap();
        assert_eq!(num_drops.load(Ordering::SeqCst), 0);
    }
    assert_eq!(num_drops.load(Ordering::SeqCst), 1);
});

port!(mutex_into_inner_poison, {
    let m = Arc::new(Mutex::new(NonCopy(10)));
    let m2 = m.clone();
    let _ = thread::spawn(move || {
        let _lock = m2.lock().unwrap();
        panic!("test panic in inner thread to poison mutex");
    })
    .join();
    assert!(m.is_poisoned());
    match Arc::try_unwrap(m).unwrap().into_inner() {
        Err(e) => assert_eq!(e.into_inner(), NonCopy(10)),
        Ok(x) => panic!("into_inner of poisoned Mutex is Ok: {x:?}"),
    }
});

port!(mutex_into_inner_poison_fiber, {
    let m = Arc::new(Mutex::new(NonCopy(10)));
    let m2 = m.clone();
    let r = go(move || {
        let _lock = m2.lock().unwrap();
        panic!("test panic in inner fiber to poison mutex");
    })
    .join();
    assert!(r.is_err());
    assert!(m.is_poisoned());
    match Arc::try_unwrap(m).unwrap().into_inner() {
        Err(e) => assert_eq!(e.into_inner(), NonCopy(10)),
        Ok(x) => panic!("into_inner of poisoned Mutex is Ok: {x:?}"),
    }
});

port!(mutex_get_mut, {
    let mut m = Mutex::new(NonCopy(10));
    *m.get_mut().unwrap() = NonCopy(20);
    assert_eq!(m.into_inner().unwrap(), NonCopy(20));
});

port!(mutex_get_mut_poison, {
    let m = Arc::new(Mutex::new(NonCopy(10)));
    let m2 = m.clone();
    let _ = go(move || {
        let _lock = m2.lock().unwrap();
        panic!("test panic in inner fiber to poison mutex");
    })
    .join();
    assert!(m.is_poisoned());
    match Arc::try_unwrap(m).unwrap().get_mut() {
        Err(e) => assert_eq!(*e.into_inner(), NonCopy(10)),
        Ok(x) => panic!("get_mut of poisoned Mutex is Ok: {x:?}"),
    }
});

port!(mutex_arc_condvar, {
    let packet = Arc::new((Mutex::new(false), Condvar::new()));
    let packet2 = packet.clone();
    let (tx, rx) = chan::unbounded();
    let _t = thread::spawn(move || {
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

port!(mutex_arc_condvar_fiber_notifier, {
    let packet = Arc::new((Mutex::new(false), Condvar::new()));
    let packet2 = packet.clone();
    let (tx, rx) = chan::unbounded();
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

port!(mutex_arc_condvar_poison, {
    let packet = Arc::new((Mutex::new(1), Condvar::new()));
    let packet2 = packet.clone();
    let (tx, rx) = chan::unbounded();
    let _t = thread::spawn(move || {
        rx.recv().unwrap();
        let (lock, cvar) = &*packet2;
        let _g = lock.lock().unwrap();
        cvar.notify_one();
        panic!();
    });
    let (lock, cvar) = &*packet;
    let mut lock = lock.lock().unwrap();
    tx.send(()).unwrap();
    let mut poisoned = false;
    while *lock == 1 {
        match cvar.wait(lock) {
            Ok(l) => {
                lock = l;
                assert_eq!(*lock, 1);
            }
            Err(..) => {
                poisoned = true;
                break;
            }
        }
    }
    assert!(poisoned);
});

port!(mutex_arc_poison, {
    let arc = Arc::new(Mutex::new(1));
    assert!(!arc.is_poisoned());
    let arc2 = arc.clone();
    let _ = go(move || {
        let lock = arc2.lock().unwrap();
        assert_eq!(*lock, 2);
    })
    .join();
    assert!(arc.lock().is_err());
    assert!(arc.is_poisoned());
});

port!(mutex_arc_nested, {
    let arc = Arc::new(Mutex::new(1));
    let arc2 = Arc::new(Mutex::new(arc));
    let (tx, rx) = chan::unbounded();
    let _t = go(move || {
        let lock = arc2.lock().unwrap();
        let lock2 = lock.lock().unwrap();
        assert_eq!(*lock2, 1);
        tx.send(()).unwrap();
    });
    rx.recv().unwrap();
});

port!(mutex_arc_access_in_unwind, {
    let arc = Arc::new(Mutex::new(1));
    let arc2 = arc.clone();
    let _ = go(move || {
        struct Unwinder {
            i: Arc<Mutex<i32>>,
        }
        impl Drop for Unwinder {
            fn drop(&mut self) {
                *self.i.lock().unwrap() += 1;
            }
        }
        let _u = Unwinder { i: arc2 };
        panic!();
    })
    .join();
    let lock = arc.lock().unwrap();
    assert_eq!(*lock, 2);
});

port!(mutex_unsized, {
    let mutex: &Mutex<[i32]> = &Mutex::new([1, 2, 3]);
    {
        let b = &mut *mutex.lock().unwrap();
        b[0] = 4;
        b[2] = 5;
    }
    let comp: &[i32] = &[4, 2, 5];
    assert_eq!(&*mutex.lock().unwrap(), comp);
});

// may: a fiber waiting in lock() is cancelled out of the queue. fiber:
// Mutex::lock is not a cancellation point (README "Cancellation points"),
// so h1 gets the lock later and still increments; its join reports
// cancelled (JoinError::is_cancelled doc). Checked: no lost wake-up, h2 runs.
port!(mutex_canceled, {
    let mutex1 = Arc::new(Mutex::new(0));
    let mutex2 = mutex1.clone();
    let mutex3 = mutex1.clone();
    let g = mutex1.lock().unwrap();
    let h1 = go(move || {
        let mut g = mutex2.lock().unwrap();
        *g += 1;
    });
    let h2 = go(move || {
        msleep(50);
        let mut g = mutex3.lock().unwrap();
        *g += 1;
    });
    msleep(100);
    h1.cancel();
    drop(g);
    let e = h1.join().unwrap_err();
    assert!(e.is_cancelled());
    h2.join().unwrap();
    let g = mutex1.lock().unwrap();
    assert_eq!(*g, 2, "documented: lock() is not a cancellation point");
});

port!(mutex_canceled_by_other_wait, {
    let mutex1 = Arc::new(Mutex::new(0));
    let mutex2 = mutex1.clone();
    let mutex3 = mutex1.clone();
    let g = mutex1.lock().unwrap();
    let h1 = go(move || {
        let mut g = mutex2.lock().unwrap();
        // cancelled while holding the lock: the sleep returns Err; no poison
        if fiber::sleep(Duration::from_secs(10000)).is_err() {
            return;
        }
        *g += 1;
    });
    let h2 = go(move || {
        msleep(50);
        let mut g = mutex3.lock().unwrap();
        *g += 1;
    });
    msleep(100);
    drop(g);
    msleep(50);
    h1.cancel();
    h1.join().unwrap_err();
    h2.join().unwrap();
    assert!(!mutex1.is_poisoned());
    let g = mutex1.lock().unwrap();
    assert_eq!(*g, 1);
});

// ---------------------------------------------------------------- src/sync/condvar.rs

port!(condvar_smoke, {
    let c = Condvar::new();
    c.notify_one();
    c.notify_all();
});

port!(condvar_notify_one, {
    let m = Arc::new(Mutex::new(()));
    let m2 = m.clone();
    let c = Arc::new(Condvar::new());
    let c2 = c.clone();
    let g = m.lock().unwrap();
    let _t = thread::spawn(move || {
        let _g = m2.lock().unwrap();
        c2.notify_one();
    });
    let g = c.wait(g).unwrap();
    drop(g);
});

port!(condvar_notify_all, {
    const N: usize = 10;
    let data = Arc::new((Mutex::new(0), Condvar::new()));
    let (tx, rx) = chan::unbounded();
    for i in 0..N {
        let data = data.clone();
        let tx = tx.clone();
        let f = move || {
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
        // may uses threads; mix threads and fibers
        if i % 2 == 0 {
            thread::spawn(f);
        } else {
            go(f);
        }
    }
    drop(tx);
    let (lock, cond) = &*data;
    rx.recv().unwrap();
    let mut cnt = lock.lock().unwrap();
    assert_eq!(*cnt, N);
    *cnt = 0;
    cond.notify_all();
    drop(cnt);
    for _ in 0..N {
        rx.recv().unwrap();
    }
});

port!(condvar_wait_timeout, {
    let m = Arc::new(Mutex::new(()));
    let m2 = m.clone();
    let c = Arc::new(Condvar::new());
    let c2 = c.clone();
    let g = m.lock().unwrap();
    let (g, _no_timeout) = c.wait_timeout(g, Duration::from_millis(1)).unwrap();
    let _t = thread::spawn(move || {
        let _g = m2.lock().unwrap();
        c2.notify_one();
    });
    let (g, timeout_res) = c.wait_timeout(g, Duration::from_millis(u32::MAX as u64)).unwrap();
    assert!(!timeout_res.timed_out());
    drop(g);
});

port!(condvar_canceled, {
    const N: usize = 10;
    let data = Arc::new((Mutex::new(0), Condvar::new()));
    let (tx, rx) = chan::unbounded();
    let mut vec = vec![];
    for _ in 0..N {
        let data = data.clone();
        let tx = tx.clone();
        let h = go(move || {
            let (lock, cond) = &*data;
            let mut cnt = lock.lock().unwrap();
            *cnt += 1;
            if *cnt == N {
                tx.send(()).unwrap();
            }
            while *cnt != 0 {
                cnt = cond.wait(cnt).unwrap();
                if fiber::is_cancelled() {
                    return;
                }
            }
            tx.send(()).unwrap();
        });
        vec.push(h);
    }
    drop(tx);
    let (lock, cond) = &*data;
    rx.recv().unwrap();
    let mut cnt = lock.lock().unwrap();
    assert_eq!(*cnt, N);
    *cnt = 0;
    drop(cnt);
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    const M: usize = 3;
    for co in vec.iter().take(M) {
        co.cancel();
    }
    cond.notify_all();
    let mut got = 0;
    while rx.recv().is_ok() {
        got += 1;
    }
    assert!(got >= N - M && got <= N, "got {got}");
    for h in vec {
        h.join().ok();
    }
});

// ---------------------------------------------------------------- src/sync/rwlock.rs

port!(rwlock_smoke, {
    let l = RwLock::new(());
    drop(l.read().unwrap());
    drop(l.write().unwrap());
    drop((l.read().unwrap(), l.read().unwrap()));
    drop(l.write().unwrap());
});

port!(rwlock_frob, {
    const N: usize = 10;
    const M: usize = 1000;
    let r = Arc::new(RwLock::new(()));
    let (tx, rx) = chan::unbounded::<()>();
    for i in 0..N {
        let tx = tx.clone();
        let r = r.clone();
        let f = move || {
            for i in 0..M {
                if i % 5 == 0 {
                    drop(r.write().unwrap());
                } else {
                    drop(r.read().unwrap());
                }
            }
            drop(tx);
        };
        if i % 2 == 0 {
            go(f);
        } else {
            thread::spawn(f);
        }
    }
    drop(tx);
    let _ = rx.recv();
});

fn poison_with<F: FnOnce() + Send + 'static>(fib: bool, f: F) {
    if fib {
        let _ = go(f).join();
    } else {
        let _ = thread::spawn(f).join();
    }
}

port!(rwlock_arc_poison_wr, {
    for fib in [false, true] {
        let arc = Arc::new(RwLock::new(1));
        let arc2 = arc.clone();
        poison_with(fib, move || {
            let _lock = arc2.write().unwrap();
            panic!();
        });
        assert!(arc.read().is_err(), "fib={fib}");
    }
});

port!(rwlock_arc_poison_ww, {
    for fib in [false, true] {
        let arc = Arc::new(RwLock::new(1));
        assert!(!arc.is_poisoned());
        let arc2 = arc.clone();
        poison_with(fib, move || {
            let _lock = arc2.write().unwrap();
            panic!();
        });
        assert!(arc.write().is_err());
        assert!(arc.is_poisoned());
    }
});

port!(rwlock_arc_no_poison_rr, {
    for fib in [false, true] {
        let arc = Arc::new(RwLock::new(1));
        let arc2 = arc.clone();
        poison_with(fib, move || {
            let _lock = arc2.read().unwrap();
            panic!();
        });
        let lock = arc.read().unwrap();
        assert_eq!(*lock, 1);
    }
});

port!(rwlock_arc_no_poison_rw, {
    for fib in [false, true] {
        let arc = Arc::new(RwLock::new(1));
        let arc2 = arc.clone();
        poison_with(fib, move || {
            let _lock = arc2.read().unwrap();
            panic!();
        });
        let lock = arc.write().unwrap();
        assert_eq!(*lock, 1);
    }
});

port!(rwlock_arc, {
    let arc = Arc::new(RwLock::new(0i32));
    let arc2 = arc.clone();
    let (tx, rx) = chan::unbounded();
    go(move || {
        let mut lock = arc2.write().unwrap();
        for _ in 0..10 {
            let tmp = *lock;
            *lock = -1;
            let _ = fiber::yield_now();
            *lock = tmp + 1;
        }
        tx.send(()).unwrap();
    });
    let mut children = Vec::new();
    for _ in 0..5 {
        let arc3 = arc.clone();
        children.push(go(move || {
            let lock = arc3.read().unwrap();
            assert!(*lock >= 0);
        }));
    }
    for r in children {
        assert!(r.join().is_ok());
    }
    rx.recv().unwrap();
    let lock = arc.read().unwrap();
    assert_eq!(*lock, 10);
});

port!(rwlock_arc_access_in_unwind, {
    let arc = Arc::new(RwLock::new(1));
    let arc2 = arc.clone();
    let _ = go(move || {
        struct Unwinder {
            i: Arc<RwLock<isize>>,
        }
        impl Drop for Unwinder {
            fn drop(&mut self) {
                let mut lock = self.i.write().unwrap();
                *lock += 1;
            }
        }
        let _u = Unwinder { i: arc2 };
        panic!();
    })
    .join();
    let lock = arc.read().unwrap();
    assert_eq!(*lock, 2);
});

port!(rwlock_unsized, {
    let rw: &RwLock<[i32]> = &RwLock::new([1, 2, 3]);
    {
        let b = &mut *rw.write().unwrap();
        b[0] = 4;
        b[2] = 5;
    }
    let comp: &[i32] = &[4, 2, 5];
    assert_eq!(&*rw.read().unwrap(), comp);
});

port!(rwlock_try_write, {
    let lock = RwLock::new(0isize);
    let read_guard = lock.read().unwrap();
    let write_result = lock.try_write();
    match write_result {
        Err(std::sync::TryLockError::WouldBlock) => (),
        Ok(_) => panic!("try_write should not succeed while read_guard is in scope"),
        Err(_) => panic!("unexpected error"),
    }
    drop(read_guard);
});

port!(rwlock_into_inner, {
    let m = RwLock::new(NonCopy(10));
    assert_eq!(m.into_inner().unwrap(), NonCopy(10));
});

port!(rwlock_into_inner_drop, {
    let num_drops = Arc::new(AtomicUsize::new(0));
    let m = RwLock::new(DropCount(num_drops.clone()));
    {
        let _inner = m.into_inner().unwrap();
        assert_eq!(num_drops.load(Ordering::SeqCst), 0);
    }
    assert_eq!(num_drops.load(Ordering::SeqCst), 1);
});

port!(rwlock_into_inner_poison, {
    let m = Arc::new(RwLock::new(NonCopy(10)));
    let m2 = m.clone();
    poison_with(true, move || {
        let _lock = m2.write().unwrap();
        panic!("test panic in inner fiber to poison RwLock");
    });
    assert!(m.is_poisoned());
    match Arc::try_unwrap(m).unwrap().into_inner() {
        Err(e) => assert_eq!(e.into_inner(), NonCopy(10)),
        Ok(x) => panic!("into_inner of poisoned RwLock is Ok: {x:?}"),
    }
});

port!(rwlock_get_mut, {
    let mut m = RwLock::new(NonCopy(10));
    *m.get_mut().unwrap() = NonCopy(20);
    assert_eq!(m.into_inner().unwrap(), NonCopy(20));
});

port!(rwlock_get_mut_poison, {
    let m = Arc::new(RwLock::new(NonCopy(10)));
    let m2 = m.clone();
    poison_with(true, move || {
        let _lock = m2.write().unwrap();
        panic!("test panic in inner fiber to poison RwLock");
    });
    assert!(m.is_poisoned());
    match Arc::try_unwrap(m).unwrap().get_mut() {
        Err(e) => assert_eq!(*e.into_inner(), NonCopy(10)),
        Ok(x) => panic!("get_mut of poisoned RwLock is Ok: {x:?}"),
    }
});

// may cancels a fiber queued for write(); fiber's write() is not a
// cancellation point, so the cancelled one still takes its turn. The test
// checks the hand-off chain still completes (every id seen exactly once).
port!(rwlock_write_canceled, {
    const N: usize = 10;
    let sync = Arc::new((Mutex::new(0usize), Condvar::new()));
    let (tx, rx) = chan::unbounded();
    let mut vec = vec![];
    let rwlock = Arc::new(RwLock::new(0));
    for i in 1..N + 1 {
        let sync = sync.clone();
        let tx = tx.clone();
        let rwlock = rwlock.clone();
        let h = go(move || {
            tx.send(0).unwrap();
            let _wlock = rwlock.write().unwrap();
            tx.send(i).unwrap();
            let (lock, cond) = &*sync;
            let mut cnt = lock.lock().unwrap();
            while *cnt != i {
                cnt = cond.wait(cnt).unwrap();
                if fiber::is_cancelled() {
                    return; // may: a Cancel panic here
                }
            }
        });
        vec.push(h);
    }
    drop(tx);
    let mut id = 0;
    for _ in 1..N + 2 {
        let a = rx.recv().unwrap();
        if a != 0 {
            id = a;
        }
    }
    let mut cancel_id = id + 1;
    if cancel_id == N + 1 {
        cancel_id = 1;
    }
    vec[cancel_id - 1].cancel();
    let (lock, cond) = &*sync;
    let mut seen = vec![id];
    loop {
        let mut cnt = lock.lock().unwrap();
        *cnt = id;
        cond.notify_all();
        drop(cnt);
        match rx.recv() {
            Ok(n) => {
                id = n;
                seen.push(n);
            }
            Err(_) => break,
        }
    }
    seen.sort();
    assert_eq!(seen, (1..=N).collect::<Vec<_>>());
    for h in vec {
        let _ = h.join();
    }
});

port!(rwlock_read_canceled, {
    let (tx, rx) = chan::unbounded();
    let rwlock = Arc::new(RwLock::new(0));
    let wlock = rwlock.write().unwrap();
    let h = {
        let tx = tx.clone();
        let rwlock = rwlock.clone();
        go(move || {
            tx.send(0).unwrap();
            let _rlock = rwlock.read().unwrap();
            tx.send(1).unwrap();
        })
    };
    assert_eq!(rx.recv().unwrap(), 0);
    let rwlock1 = rwlock.clone();
    let tx1 = tx.clone();
    thread::spawn(move || {
        let _wlock = rwlock1.write().unwrap();
        tx1.send(10).unwrap();
    });
    h.cancel();
    // may joins here (the reader was cancelled out of the queue); fiber's
    // read() is not a cancellation point: release first, then join.
    drop(wlock);
    assert!(h.join().unwrap_err().is_cancelled());
    let mut got = vec![rx.recv().unwrap(), rx.recv().unwrap()];
    got.sort();
    assert_eq!(got, vec![1, 10]);
});

// ---------------------------------------------------------------- src/sync/semphore.rs (Semaphore)

port!(sem_sanity_1, {
    let sem = Arc::new(Semaphore::new(0));
    let sem2 = sem.clone();
    thread::spawn(move || sem2.add_permits(1));
    sem.acquire().unwrap().forget();
});

port!(sem_sanity_2, {
    let total = 10;
    let init = 5;
    let sem = Arc::new(Semaphore::new(init));
    let (tx, rx) = chan::unbounded();
    for i in 0..total {
        let sem2 = sem.clone();
        let tx2 = tx.clone();
        go(move || {
            sem2.acquire().unwrap().forget();
            tx2.send(i).unwrap();
        });
    }
    let mut sum = 0;
    for _ in 0..init {
        sum += rx.recv().unwrap();
    }
    msleep(20);
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    for _ in 0..total - init {
        sem.add_permits(1);
    }
    for _ in 0..total - init {
        sum += rx.recv().unwrap();
    }
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    assert_eq!(sum, (0..total).sum());
});

port!(sem_canceled, {
    let sem1 = Arc::new(Semaphore::new(0));
    let sem2 = sem1.clone();
    let sem3 = sem1.clone();
    let h1 = go(move || sem2.acquire().map(|p| p.forget()));
    let h2 = go(move || {
        msleep(50);
        sem3.acquire().unwrap().forget();
    });
    msleep(100);
    h1.cancel();
    h1.join().unwrap_err();
    sem1.add_permits(1);
    h2.join().unwrap();
    assert_eq!(sem1.available_permits(), 0);
});

// may: wait_timeout(10ms) -> false. fiber has no timed acquire: with_timeout.
port!(sem_co_timeout, {
    let sem1 = Arc::new(Semaphore::new(0));
    let sem2 = sem1.clone();
    let sem3 = sem1.clone();
    let h1 = go(move || {
        let r = fiber::with_timeout(Duration::from_millis(10), || sem2.acquire().map(|p| p.forget()));
        assert!(matches!(r, Err(_) | Ok(Err(_))), "acquire did not time out");
    });
    let h2 = go(move || {
        msleep(50);
        sem3.acquire().unwrap().forget();
    });
    h1.join().unwrap();
    sem1.add_permits(1);
    h2.join().unwrap();
});

// ---------------------------------------------------------------- src/sync/wait_group.rs

const THREADS: usize = 10;

port!(wg_wait, {
    let wg = WaitGroup::new();
    let (tx, rx) = chan::unbounded();
    for _ in 0..THREADS {
        let wg = wg.clone();
        let tx = tx.clone();
        go(move || {
            wg.wait();
            tx.send(()).unwrap();
        });
    }
    msleep(100);
    assert!(rx.try_recv().is_err());
    wg.wait();
    for _ in 0..THREADS {
        rx.recv().unwrap();
    }
});

port!(wg_wait_and_drop, {
    let wg = WaitGroup::new();
    let wg2 = WaitGroup::new();
    let (tx, rx) = chan::unbounded();
    for _ in 0..THREADS {
        let wg = wg.clone();
        let wg2 = wg2.clone();
        let tx = tx.clone();
        go(move || {
            wg2.wait();
            tx.send(()).unwrap();
            drop(wg);
        });
    }
    assert!(rx.try_recv().is_err());
    drop(wg2);
    wg.wait();
    for _ in 0..THREADS {
        rx.try_recv().unwrap();
    }
});

// ---------------------------------------------------------------- src/sync/barrier.rs

port!(barrier_test, {
    const N: usize = 10;
    let barrier = Arc::new(Barrier::new(N));
    let (tx, rx) = chan::unbounded();
    for _ in 0..N - 1 {
        let c = barrier.clone();
        let tx = tx.clone();
        go(move || {
            tx.send(c.wait().is_leader()).unwrap();
        });
    }
    assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)));
    let mut leader_found = barrier.wait().is_leader();
    for _ in 0..N - 1 {
        if rx.recv().unwrap() {
            assert!(!leader_found);
            leader_found = true;
        }
    }
    assert!(leader_found);
});

// ---------------------------------------------------------------- src/sync/mpsc.rs (also mpmc.rs, spsc.rs: same tests)
// may's mpsc/mpmc/spsc channels are unbounded: chan::unbounded.

use chan::unbounded as channel;

port!(mpsc_smoke, {
    let (tx, rx) = channel::<i32>();
    tx.send(1).unwrap();
    assert_eq!(rx.recv().unwrap(), 1);
});

port!(mpsc_drop_full, {
    let (tx, _rx) = channel::<Box<isize>>();
    tx.send(Box::new(1)).unwrap();
});

port!(mpsc_drop_full_shared, {
    let (tx, _rx) = channel::<Box<isize>>();
    drop(tx.clone());
    drop(tx.clone());
    tx.send(Box::new(1)).unwrap();
});

port!(mpsc_smoke_shared, {
    let (tx, rx) = channel::<i32>();
    tx.send(1).unwrap();
    assert_eq!(rx.recv().unwrap(), 1);
    let tx = tx.clone();
    tx.send(1).unwrap();
    assert_eq!(rx.recv().unwrap(), 1);
});

port!(mpsc_smoke_threads, {
    let (tx, rx) = channel::<i32>();
    let _t = thread::spawn(move || tx.send(1).unwrap());
    assert_eq!(rx.recv().unwrap(), 1);
});

port!(mpsc_smoke_coroutine, {
    let (tx, rx) = channel::<i32>();
    let _t = go(move || tx.send(1).unwrap());
    assert_eq!(rx.recv().unwrap(), 1);
});

port!(mpsc_smoke_port_gone, {
    let (tx, rx) = channel::<i32>();
    drop(rx);
    assert!(tx.send(1).is_err());
});

port!(mpsc_smoke_shared_port_gone2, {
    let (tx, rx) = channel::<i32>();
    drop(rx);
    let tx2 = tx.clone();
    drop(tx);
    assert!(tx2.send(1).is_err());
});

port!(mpsc_port_gone_concurrent, {
    let (tx, rx) = channel::<i32>();
    let _t = thread::spawn(move || {
        rx.recv().unwrap();
    });
    while tx.send(1).is_ok() {
        yield_any();
    }
});

port!(mpsc_port_gone_concurrent1, {
    let (tx, rx) = channel::<i32>();
    let _t = go(move || {
        rx.recv().unwrap();
    });
    // an unbounded send never parks: yield so the receiver fiber runs (W1)
    while tx.send(1).is_ok() {
        yield_any();
    }
});

port!(mpsc_port_gone_concurrent_shared, {
    let (tx, rx) = channel::<i32>();
    let tx2 = tx.clone();
    let _t = thread::spawn(move || {
        rx.recv().unwrap();
    });
    while tx.send(1).is_ok() && tx2.send(1).is_ok() {
        yield_any();
    }
});

port!(mpsc_smoke_chan_gone, {
    let (tx, rx) = channel::<i32>();
    drop(tx);
    assert!(rx.recv().is_err());
});

port!(mpsc_smoke_chan_gone_shared, {
    let (tx, rx) = channel::<()>();
    let tx2 = tx.clone();
    drop(tx);
    drop(tx2);
    assert!(rx.recv().is_err());
});

port!(mpsc_chan_gone_concurrent, {
    let (tx, rx) = channel::<i32>();
    let _t = go(move || {
        tx.send(1).unwrap();
        tx.send(1).unwrap();
    });
    while rx.recv().is_ok() {}
});

port!(mpsc_stress, {
    let (tx, rx) = channel::<i32>();
    let t = thread::spawn(move || {
        for _ in 0..10000 {
            tx.send(1).unwrap();
        }
    });
    for _ in 0..10000 {
        assert_eq!(rx.recv().unwrap(), 1);
    }
    tjoin(t).ok().unwrap();
});

port!(mpsc_stress_shared, {
    const AMT: u32 = 10000;
    const NTHREADS: u32 = 8;
    let (tx, rx) = channel::<i32>();
    let t = thread::spawn(move || {
        for _ in 0..AMT * NTHREADS {
            assert_eq!(rx.recv().unwrap(), 1);
        }
        if rx.try_recv().is_ok() {
            panic!();
        }
    });
    for _ in 0..NTHREADS {
        let tx = tx.clone();
        go(move || {
            for _ in 0..AMT {
                tx.send(1).unwrap();
            }
        });
    }
    drop(tx);
    tjoin(t).ok().unwrap();
});

port!(mpsc_send_from_outside_runtime, {
    let (tx1, rx1) = channel::<()>();
    let (tx2, rx2) = channel::<i32>();
    let t1 = go(move || {
        tx1.send(()).unwrap();
        for _ in 0..40 {
            assert_eq!(rx2.recv().unwrap(), 1);
        }
    });
    rx1.recv().unwrap();
    let t2 = go(move || {
        for _ in 0..40 {
            tx2.send(1).unwrap();
        }
    });
    t1.join().ok().unwrap();
    t2.join().ok().unwrap();
});

port!(mpsc_recv_from_outside_runtime, {
    let (tx, rx) = channel::<i32>();
    let t = thread::spawn(move || {
        for _ in 0..40 {
            assert_eq!(rx.recv().unwrap(), 1);
        }
    });
    for _ in 0..40 {
        tx.send(1).unwrap();
    }
    tjoin(t).ok().unwrap();
});

port!(mpsc_no_runtime, {
    let (tx1, rx1) = channel::<i32>();
    let (tx2, rx2) = channel::<i32>();
    let t1 = thread::spawn(move || {
        assert_eq!(rx1.recv().unwrap(), 1);
        tx2.send(2).unwrap();
    });
    let t2 = go(move || {
        tx1.send(1).unwrap();
        assert_eq!(rx2.recv().unwrap(), 2);
    });
    tjoin(t1).ok().unwrap();
    t2.join().ok().unwrap();
});

port!(mpsc_oneshot_close_port_first, {
    let (_tx, rx) = channel::<i32>();
    drop(rx);
});

port!(mpsc_oneshot_close_chan_first, {
    let (tx, _rx) = channel::<i32>();
    drop(tx);
});

port!(mpsc_oneshot_send_port_close, {
    let (tx, rx) = channel::<Box<i32>>();
    drop(rx);
    assert!(tx.send(Box::new(0)).is_err());
});

port!(mpsc_oneshot_recv_chan_close, {
    let res = go(move || {
        let (tx, rx) = channel::<i32>();
        drop(tx);
        rx.recv().unwrap();
    })
    .join();
    assert!(res.unwrap_err().is_panic());
});

port!(mpsc_oneshot_send_then_recv, {
    let (tx, rx) = channel::<Box<i32>>();
    tx.send(Box::new(10)).unwrap();
    assert!(*rx.recv().unwrap() == 10);
});

port!(mpsc_oneshot_try_send_open, {
    let (tx, rx) = channel::<i32>();
    assert!(tx.send(10).is_ok());
    assert!(rx.recv().unwrap() == 10);
});

port!(mpsc_oneshot_try_send_closed, {
    let (tx, rx) = channel::<i32>();
    drop(rx);
    assert!(tx.send(10).is_err());
});

port!(mpsc_oneshot_try_recv_open, {
    let (tx, rx) = channel::<i32>();
    tx.send(10).unwrap();
    assert!(rx.recv() == Ok(10));
});

port!(mpsc_oneshot_try_recv_closed, {
    let (tx, rx) = channel::<i32>();
    drop(tx);
    assert!(rx.recv().is_err());
});

port!(mpsc_oneshot_peek_data, {
    let (tx, rx) = channel::<i32>();
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    tx.send(10).unwrap();
    assert_eq!(rx.try_recv(), Ok(10));
});

port!(mpsc_oneshot_peek_close, {
    let (tx, rx) = channel::<i32>();
    drop(tx);
    assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));
    assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));
});

port!(mpsc_oneshot_peek_open, {
    let (_tx, rx) = channel::<i32>();
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
});

port!(mpsc_oneshot_multi_task_recv_then_send, {
    let (tx, rx) = channel::<Box<i32>>();
    let t = go(move || assert!(*rx.recv().unwrap() == 10));
    tx.send(Box::new(10)).unwrap();
    t.join().unwrap();
});

port!(mpsc_oneshot_multi_task_recv_then_close, {
    let (tx, rx) = channel::<Box<i32>>();
    let _t = go(move || drop(tx));
    let res = go(move || assert!(*rx.recv().unwrap() == 10)).join();
    assert!(res.is_err());
});

port!(mpsc_oneshot_multi_thread_close_stress, {
    for _ in 0..20 {
        let (tx, rx) = channel::<i32>();
        let _t = go(move || drop(rx));
        drop(tx);
    }
});

port!(mpsc_oneshot_multi_thread_send_close_stress, {
    for _ in 0..20 {
        let (tx, rx) = channel::<i32>();
        let _t = go(move || drop(rx));
        let _ = go(move || {
            tx.send(1).unwrap();
        })
        .join();
    }
});

port!(mpsc_oneshot_multi_thread_recv_close_stress, {
    let mut hs = vec![];
    for _ in 0..20 {
        let (tx, rx) = channel::<i32>();
        hs.push(go(move || {
            let res = fiber::spawn(move || {
                rx.recv().unwrap();
            })
            .join();
            assert!(res.is_err());
        }));
        let _t = go(move || {
            fiber::spawn(move || drop(tx));
        });
    }
    for h in hs {
        h.join().unwrap();
    }
});

port!(mpsc_oneshot_multi_thread_send_recv_stress, {
    for _ in 0..20 {
        let (tx, rx) = channel::<Box<isize>>();
        let _t = go(move || tx.send(Box::new(10)).unwrap());
        assert!(*rx.recv().unwrap() == 10);
    }
});

port!(mpsc_stream_send_recv_stress, {
    let (done_tx, done_rx) = channel();
    let (tx, rx) = channel();
    fn send(tx: chan::Sender<Box<i32>>, i: i32) {
        if i == 10 {
            return;
        }
        go(move || {
            tx.send(Box::new(i)).unwrap();
            send(tx, i + 1);
        });
    }
    fn recv(rx: chan::Receiver<Box<i32>>, i: i32, done: chan::Sender<()>) {
        if i == 10 {
            done.send(()).unwrap();
            return;
        }
        go(move || {
            assert!(*rx.recv().unwrap() == i);
            recv(rx, i + 1, done);
        });
    }
    send(tx, 0);
    recv(rx, 0, done_tx);
    done_rx.recv().unwrap();
});

port!(mpsc_oneshot_recv_timeout, {
    let (tx, rx) = channel();
    tx.send(()).unwrap();
    assert_eq!(rx.recv_timeout(Duration::from_millis(1)), Ok(()));
    assert_eq!(
        rx.recv_timeout(Duration::from_millis(1)),
        Err(RecvTimeoutError::Timeout)
    );
    tx.send(()).unwrap();
    assert_eq!(rx.recv_timeout(Duration::from_millis(1)), Ok(()));
});

port!(mpsc_stress_recv_timeout_two_threads, {
    let (tx, rx) = channel();
    let stress = 101;
    let timeout = Duration::from_millis(1);
    thread::spawn(move || {
        for i in 0..stress {
            if i % 2 == 0 {
                thread::sleep(timeout * 2);
            }
            tx.send(1usize).unwrap();
        }
    });
    let mut recv_count = 0;
    loop {
        match rx.recv_timeout(timeout) {
            Ok(n) => {
                assert_eq!(n, 1usize);
                recv_count += 1;
            }
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    assert_eq!(recv_count, stress);
});

port!(mpsc_stress_recv_timeout_two_fibers, {
    let (tx, rx) = channel();
    let stress = 101;
    let timeout = Duration::from_millis(1);
    go(move || {
        for i in 0..stress {
            if i % 2 == 0 {
                fiber::sleep(timeout * 2).unwrap();
            }
            tx.send(1usize).unwrap();
        }
    });
    let mut recv_count = 0;
    loop {
        match rx.recv_timeout(timeout) {
            Ok(n) => {
                assert_eq!(n, 1usize);
                recv_count += 1;
            }
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    assert_eq!(recv_count, stress);
});

port!(mpsc_recv_timeout_upgrade, {
    let (tx, rx) = channel::<()>();
    let timeout = Duration::from_millis(1);
    let _tx_clone = tx.clone();
    let start = Instant::now();
    assert_eq!(rx.recv_timeout(timeout), Err(RecvTimeoutError::Timeout));
    assert!(Instant::now() >= start + timeout);
});

port!(mpsc_stress_recv_timeout_shared, {
    let (tx, rx) = channel();
    let stress = 101;
    for i in 0..stress {
        let tx = tx.clone();
        go(move || {
            fiber::sleep(Duration::from_millis(i as u64 * 3)).unwrap();
            tx.send(1usize).unwrap();
        });
    }
    drop(tx);
    let mut recv_count = 0;
    loop {
        match rx.recv_timeout(Duration::from_millis(10)) {
            Ok(n) => {
                assert_eq!(n, 1usize);
                recv_count += 1;
            }
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    assert_eq!(recv_count, stress);
});

port!(mpsc_recv_a_lot, {
    let (tx, rx) = channel();
    for _ in 0..10000 {
        tx.send(()).unwrap();
    }
    for _ in 0..10000 {
        rx.recv().unwrap();
    }
});

port!(mpsc_shared_recv_timeout, {
    let (tx, rx) = channel();
    let total = 5;
    for _ in 0..total {
        let tx = tx.clone();
        go(move || tx.send(()).unwrap());
    }
    for _ in 0..total {
        rx.recv().unwrap();
    }
    assert_eq!(
        rx.recv_timeout(Duration::from_millis(1)),
        Err(RecvTimeoutError::Timeout)
    );
    tx.send(()).unwrap();
    assert_eq!(rx.recv_timeout(Duration::from_millis(1)), Ok(()));
});

port!(mpsc_shared_chan_stress, {
    let (tx, rx) = channel();
    let total = 101;
    for _ in 0..total {
        let tx = tx.clone();
        go(move || tx.send(()).unwrap());
    }
    for _ in 0..total {
        rx.recv().unwrap();
    }
});

port!(mpsc_nested_recv_iter, {
    let (tx, rx) = channel::<i32>();
    let (total_tx, total_rx) = channel::<i32>();
    let _t = go(move || {
        let mut acc = 0;
        for x in rx.iter() {
            acc += x;
        }
        total_tx.send(acc).unwrap();
    });
    tx.send(3).unwrap();
    tx.send(1).unwrap();
    tx.send(2).unwrap();
    drop(tx);
    assert_eq!(total_rx.recv().unwrap(), 6);
});

port!(mpsc_recv_iter_break, {
    let (tx, rx) = channel::<i32>();
    let (count_tx, count_rx) = channel();
    let _t = go(move || {
        let mut count = 0;
        for x in rx.iter() {
            if count >= 3 {
                break;
            } else {
                count += x;
            }
        }
        count_tx.send(count).unwrap();
    });
    tx.send(2).unwrap();
    tx.send(2).unwrap();
    tx.send(2).unwrap();
    let _ = tx.send(2);
    drop(tx);
    assert_eq!(count_rx.recv().unwrap(), 4);
});

port!(mpsc_recv_try_iter, {
    let (request_tx, request_rx) = channel();
    let (response_tx, response_rx) = channel();
    let t = go(move || {
        let mut count = 0;
        loop {
            for x in response_rx.try_iter() {
                count += x;
                if count == 6 {
                    return count;
                }
            }
            request_tx.send(()).unwrap();
            let _ = fiber::yield_now();
        }
    });
    for _ in request_rx.iter() {
        if response_tx.send(2).is_err() {
            break;
        }
    }
    assert_eq!(t.join().unwrap(), 6);
});

port!(mpsc_recv_into_iter_owned, {
    let mut iter = {
        let (tx, rx) = channel::<i32>();
        tx.send(1).unwrap();
        tx.send(2).unwrap();
        rx.into_iter()
    };
    assert_eq!(iter.next().unwrap(), 1);
    assert_eq!(iter.next().unwrap(), 2);
    assert!(iter.next().is_none());
});

port!(mpsc_recv_into_iter_borrowed, {
    let (tx, rx) = channel::<i32>();
    tx.send(1).unwrap();
    tx.send(2).unwrap();
    drop(tx);
    let mut iter = (&rx).into_iter();
    assert_eq!(iter.next().unwrap(), 1);
    assert_eq!(iter.next().unwrap(), 2);
    assert!(iter.next().is_none());
});

port!(mpsc_try_recv_states, {
    let (tx1, rx1) = channel::<i32>();
    let (tx2, rx2) = channel::<()>();
    let (tx3, rx3) = channel::<()>();
    let _t = go(move || {
        rx2.recv().unwrap();
        tx1.send(1).unwrap();
        tx3.send(()).unwrap();
        rx2.recv().unwrap();
        drop(tx1);
        tx3.send(()).unwrap();
    });
    assert_eq!(rx1.try_recv(), Err(TryRecvError::Empty));
    tx2.send(()).unwrap();
    rx3.recv().unwrap();
    assert_eq!(rx1.try_recv(), Ok(1));
    assert_eq!(rx1.try_recv(), Err(TryRecvError::Empty));
    tx2.send(()).unwrap();
    rx3.recv().unwrap();
    assert_eq!(rx1.try_recv(), Err(TryRecvError::Disconnected));
});

port!(mpsc_destroy_upgraded_shared_port_when_sender_still_active, {
    let (tx, rx) = channel();
    let (tx2, rx2) = channel();
    let _t = go(move || {
        rx.recv().unwrap();
        drop(rx);
        tx2.send(()).unwrap();
    });
    for _ in 0..5000 {
        yield_any();
    }
    let t = tx.clone();
    drop(tx);
    t.send(()).unwrap();
    rx2.recv().unwrap();
});

// mpmc.rs only
port!(mpmc_stress_multi_recv, {
    let (tx, rx) = channel();
    let (tx1, rx1) = channel();
    let stress = 101;
    for i in 0..10 {
        let rx = rx.clone();
        let tx = tx1.clone();
        let f = move || {
            while let Ok(v) = rx.recv() {
                tx.send((i, v)).unwrap();
            }
        };
        if i % 2 == 0 {
            thread::spawn(f);
        } else {
            go(f);
        }
    }
    for i in 0..stress {
        tx.send(i).unwrap();
    }
    let mut recv_count = 0;
    let mut seen = vec![false; stress];
    while let Ok((_id, v)) = rx1.recv() {
        assert!(!seen[v]);
        seen[v] = true;
        recv_count += 1;
        if recv_count == stress {
            break;
        }
    }
    drop(tx);
    assert!(rx1.try_recv().is_err());
});

// mpsc.rs sync_tests (commented out in may; std's sync_channel tests)
port!(sync_send1, {
    let (tx, rx) = chan::bounded::<i32>(0);
    let _t = go(move || {
        rx.recv().unwrap();
    });
    assert_eq!(tx.send(1), Ok(()));
});

port!(sync_send2, {
    let (tx, rx) = chan::bounded::<i32>(0);
    let _t = go(move || drop(rx));
    assert!(tx.send(1).is_err());
});

port!(sync_send3, {
    let (tx, rx) = chan::bounded::<i32>(1);
    assert_eq!(tx.send(1), Ok(()));
    let _t = go(move || drop(rx));
    assert!(tx.send(1).is_err());
});

port!(sync_send4, {
    let (tx, rx) = chan::bounded::<i32>(0);
    let tx2 = tx.clone();
    let (done, done_rx) = channel();
    let done2 = done.clone();
    let _t = go(move || {
        assert!(tx.send(1).is_err());
        done.send(()).unwrap();
    });
    let _t = go(move || {
        assert!(tx2.send(2).is_err());
        done2.send(()).unwrap();
    });
    msleep(10);
    drop(rx);
    done_rx.recv().unwrap();
    done_rx.recv().unwrap();
});

port!(sync_try_send, {
    let (tx, _rx) = chan::bounded::<i32>(0);
    assert_eq!(tx.try_send(1), Err(chan::TrySendError::Full(1)));
    let (tx, rx) = chan::bounded::<i32>(1);
    assert_eq!(tx.try_send(1), Ok(()));
    assert_eq!(tx.try_send(1), Err(chan::TrySendError::Full(1)));
    drop(rx);
    assert_eq!(tx.try_send(1), Err(chan::TrySendError::Disconnected(1)));
});

port!(sync_recv_timeout, {
    let (tx, rx) = chan::bounded::<i32>(1);
    assert_eq!(
        rx.recv_timeout(Duration::from_millis(1)),
        Err(RecvTimeoutError::Timeout)
    );
    tx.send(1).unwrap();
    assert_eq!(rx.recv_timeout(Duration::from_millis(1)), Ok(1));
});

port!(sync_issue_15761, {
    for _ in 0..100 {
        let (tx1, rx1) = chan::bounded::<()>(3);
        let (tx2, rx2) = chan::bounded::<()>(3);
        let _t = go(move || {
            rx1.recv().unwrap();
            tx2.try_send(()).unwrap();
        });
        tx1.try_send(()).unwrap();
        rx2.recv().unwrap();
    }
});

port!(mpsc_fmt_debug, {
    let (tx, rx) = channel::<i32>();
    let s = format!("{tx:?} {rx:?}");
    assert!(s.contains("Sender") && s.contains("Receiver"), "{s}");
});

// ---------------------------------------------------------------- src/os/unix/net.rs

use fiber::net::unix::{UnixDatagram, UnixListener, UnixStream};

macro_rules! or_panic {
    ($e:expr) => {
        match $e {
            Ok(e) => e,
            Err(e) => panic!("{}: {}", stringify!($e), e),
        }
    };
}

port!(unix_basic, {
    let dir = tmp_path("basic");
    let socket_path = dir.join("sock");
    let msg1 = b"hello";
    let msg2 = b"world!";
    let listener = or_panic!(UnixListener::bind(&socket_path));
    let thread = go(move || {
        let mut stream = or_panic!(listener.accept()).0;
        let mut buf = [0; 5];
        or_panic!(stream.read_exact(&mut buf));
        assert_eq!(&msg1[..], &buf[..]);
        or_panic!(stream.write_all(msg2));
    });
    let mut stream = or_panic!(UnixStream::connect(&socket_path));
    assert_eq!(Some(&*socket_path), stream.peer_addr().unwrap().as_pathname());
    or_panic!(stream.write_all(msg1));
    let mut buf = vec![];
    or_panic!(stream.read_to_end(&mut buf));
    assert_eq!(&msg2[..], &buf[..]);
    drop(stream);
    thread.join().unwrap();
    let _ = std::fs::remove_dir_all(dir);
});

port!(unix_pair, {
    let msg1 = b"hello";
    let msg2 = b"world!";
    let (mut s1, mut s2) = or_panic!(UnixStream::pair());
    let thread = go(move || {
        let mut buf = [0; 5];
        or_panic!(s1.read_exact(&mut buf));
        assert_eq!(&msg1[..], &buf[..]);
        or_panic!(s1.write_all(msg2));
    });
    or_panic!(s2.write_all(msg1));
    let mut buf = vec![];
    or_panic!(s2.read_to_end(&mut buf));
    assert_eq!(&msg2[..], &buf[..]);
    drop(s2);
    thread.join().unwrap();
});

port!(unix_try_clone, {
    let dir = tmp_path("clone");
    let socket_path = dir.join("sock");
    let msg1 = b"hello";
    let msg2 = b"world";
    let listener = or_panic!(UnixListener::bind(&socket_path));
    let thread = go(move || {
        let mut stream = or_panic!(listener.accept()).0;
        or_panic!(stream.write_all(msg1));
        or_panic!(stream.write_all(msg2));
    });
    let mut stream = or_panic!(UnixStream::connect(&socket_path));
    let mut stream2 = or_panic!(stream.try_clone());
    let mut buf = [0; 5];
    or_panic!(stream.read_exact(&mut buf));
    assert_eq!(&msg1[..], &buf[..]);
    or_panic!(stream2.read_exact(&mut buf));
    assert_eq!(&msg2[..], &buf[..]);
    thread.join().unwrap();
    let _ = std::fs::remove_dir_all(dir);
});

port!(unix_iter, {
    let dir = tmp_path("iter");
    let socket_path = dir.join("sock");
    let listener = or_panic!(UnixListener::bind(&socket_path));
    let thread = go(move || {
        for stream in listener.incoming().take(2) {
            let mut stream = or_panic!(stream);
            let mut buf = [0];
            or_panic!(stream.read_exact(&mut buf));
        }
    });
    for _ in 0..2 {
        let mut stream = or_panic!(UnixStream::connect(&socket_path));
        or_panic!(stream.write_all(&[0]));
    }
    thread.join().unwrap();
    let _ = std::fs::remove_dir_all(dir);
});

port!(unix_long_path, {
    let dir = tmp_path("long");
    let socket_path = dir.join(
        "asdfasdfasdfasdfasdfasdfasdfasdfasdfasdfasdfasdfasdfasdfasdfa\
         sasdfasdfasdasdfasdfasdfadfasdfasdfasdfasdfasdf",
    );
    match UnixStream::connect(&socket_path) {
        Err(ref e) if e.kind() == std::io::ErrorKind::InvalidInput => {}
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("unexpected success"),
    }
    match UnixListener::bind(&socket_path) {
        Err(ref e) if e.kind() == std::io::ErrorKind::InvalidInput => {}
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("unexpected success"),
    }
    match UnixDatagram::bind(&socket_path) {
        Err(ref e) if e.kind() == std::io::ErrorKind::InvalidInput => {}
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("unexpected success"),
    }
    let _ = std::fs::remove_dir_all(dir);
});

// may: cfg(feature = "io_timeout")
port!(unix_timeouts, {
    let dir = tmp_path("timeouts");
    let socket_path = dir.join("sock");
    let _listener = or_panic!(UnixListener::bind(&socket_path));
    let stream = or_panic!(UnixStream::connect(&socket_path));
    let dur = Duration::new(15410, 0);
    assert_eq!(None, or_panic!(stream.read_timeout()));
    or_panic!(stream.set_read_timeout(Some(dur)));
    assert_eq!(Some(dur), or_panic!(stream.read_timeout()));
    assert_eq!(None, or_panic!(stream.write_timeout()));
    or_panic!(stream.set_write_timeout(Some(dur)));
    assert_eq!(Some(dur), or_panic!(stream.write_timeout()));
    or_panic!(stream.set_read_timeout(None));
    assert_eq!(None, or_panic!(stream.read_timeout()));
    or_panic!(stream.set_write_timeout(None));
    assert_eq!(None, or_panic!(stream.write_timeout()));
    let _ = std::fs::remove_dir_all(dir);
});

port!(unix_read_timeout, {
    let dir = tmp_path("rt");
    let socket_path = dir.join("sock");
    let _listener = or_panic!(UnixListener::bind(&socket_path));
    let mut stream = or_panic!(UnixStream::connect(&socket_path));
    or_panic!(stream.set_read_timeout(Some(Duration::from_millis(200))));
    let mut buf = [0; 10];
    let t = Instant::now();
    let kind = stream.read(&mut buf).expect_err("expected error").kind();
    assert!(
        kind == std::io::ErrorKind::WouldBlock || kind == std::io::ErrorKind::TimedOut,
        "{kind:?}"
    );
    assert!(t.elapsed() >= Duration::from_millis(150), "{:?}", t.elapsed());
    let _ = std::fs::remove_dir_all(dir);
});

port!(unix_read_with_timeout, {
    let dir = tmp_path("rwt");
    let socket_path = dir.join("sock");
    let listener = or_panic!(UnixListener::bind(&socket_path));
    let mut stream = or_panic!(UnixStream::connect(&socket_path));
    or_panic!(stream.set_read_timeout(Some(Duration::from_millis(200))));
    let mut other_end = or_panic!(listener.accept()).0;
    or_panic!(other_end.write_all(b"hello world"));
    let mut buf = [0; 11];
    or_panic!(stream.read_exact(&mut buf));
    assert_eq!(b"hello world", &buf[..]);
    let kind = stream.read_exact(&mut buf).expect_err("expected error").kind();
    assert!(
        kind == std::io::ErrorKind::WouldBlock || kind == std::io::ErrorKind::TimedOut,
        "{kind:?}"
    );
    let _ = std::fs::remove_dir_all(dir);
});

port!(unix_datagram, {
    let dir = tmp_path("dg");
    let path1 = dir.join("sock1");
    let path2 = dir.join("sock2");
    let sock1 = or_panic!(UnixDatagram::bind(path1));
    let sock2 = or_panic!(UnixDatagram::bind(&path2));
    let msg = b"hello world";
    or_panic!(sock1.send_to(msg, &path2));
    let mut buf = [0; 11];
    or_panic!(sock2.recv_from(&mut buf));
    assert_eq!(msg, &buf[..]);
    let _ = std::fs::remove_dir_all(dir);
});

port!(unix_unnamed_datagram, {
    let dir = tmp_path("udg");
    let path1 = dir.join("sock1");
    let sock1 = or_panic!(UnixDatagram::bind(&path1));
    let sock2 = or_panic!(UnixDatagram::unbound());
    let msg = b"hello world";
    or_panic!(sock2.send_to(msg, &path1));
    let mut buf = [0; 11];
    let (usize, addr) = or_panic!(sock1.recv_from(&mut buf));
    assert_eq!(usize, 11);
    assert!(addr.is_unnamed());
    assert_eq!(msg, &buf[..]);
    let _ = std::fs::remove_dir_all(dir);
});

port!(unix_connect_datagram, {
    let dir = tmp_path("cdg");
    let path1 = dir.join("sock1");
    let path2 = dir.join("sock2");
    let bsock1 = or_panic!(UnixDatagram::bind(&path1));
    let bsock2 = or_panic!(UnixDatagram::bind(&path2));
    let sock = or_panic!(UnixDatagram::unbound());
    or_panic!(sock.connect(&path1));
    let msg = b"hello there";
    or_panic!(sock.send(msg));
    let mut buf = [0; 11];
    let (usize, addr) = or_panic!(bsock1.recv_from(&mut buf));
    assert_eq!(usize, 11);
    assert!(addr.is_unnamed());
    assert_eq!(msg, &buf[..]);
    or_panic!(sock.connect(&path2));
    or_panic!(sock.send(msg));
    or_panic!(bsock2.recv_from(&mut buf));
    let _ = std::fs::remove_dir_all(dir);
});

port!(unix_datagram_recv, {
    let dir = tmp_path("dgr");
    let path1 = dir.join("sock1");
    let sock1 = or_panic!(UnixDatagram::bind(&path1));
    let sock2 = or_panic!(UnixDatagram::unbound());
    or_panic!(sock2.connect(&path1));
    let msg = b"hello world";
    or_panic!(sock2.send(msg));
    let mut buf = [0; 11];
    let size = or_panic!(sock1.recv(&mut buf));
    assert_eq!(size, 11);
    assert_eq!(msg, &buf[..]);
    let _ = std::fs::remove_dir_all(dir);
});

port!(unix_datagram_pair, {
    let msg1 = b"hello";
    let msg2 = b"world!";
    let (s1, s2) = or_panic!(UnixDatagram::pair());
    let thread = go(move || {
        let mut buf = [0; 5];
        or_panic!(s1.recv(&mut buf));
        assert_eq!(&msg1[..], &buf[..]);
        or_panic!(s1.send(msg2));
    });
    or_panic!(s2.send(msg1));
    let mut buf = [0; 6];
    or_panic!(s2.recv(&mut buf));
    assert_eq!(&msg2[..], &buf[..]);
    drop(s2);
    thread.join().unwrap();
});

port!(unix_abstract_namespace_not_allowed, {
    assert!(UnixStream::connect("\0asdf").is_err());
});

// ---------------------------------------------------------------- examples/

// examples/spawn.rs
port!(ex_spawn, {
    let h = go(move || {
        let v: Vec<_> = (0..100)
            .map(|i| {
                fiber::spawn(move || {
                    fiber::yield_now().unwrap();
                    i
                })
            })
            .collect();
        fiber::yield_now().unwrap();
        v.into_iter().map(|h| h.join().unwrap()).sum::<i32>()
    });
    assert_eq!(h.join().unwrap(), 4950);
});

// examples/scoped.rs (nested scopes)
port!(ex_scoped, [W1, W2], {
    let mut array = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10];
    fiber::scope(|s| {
        for i in &mut array {
            s.spawn(move || {
                fiber::scope(|s2| {
                    s2.spawn(|| {
                        fiber::yield_now().unwrap();
                        *i += 1;
                    });
                });
                fiber::yield_now().unwrap();
                *i += 1;
            });
        }
    });
    assert_eq!(array, [3, 4, 5, 6, 7, 8, 9, 10, 11, 12]);
});

// examples/select.rs: may's select! races arbitrary blocking calls; fiber's
// is over channels: the listener arm becomes a fiber that reports accepts.
port!(ex_select, {
    let (tx1, rx1) = channel();
    let (tx2, rx2) = channel();
    let listener = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (acc_tx, acc_rx) = channel::<()>();
    let acceptor = go(move || {
        if listener.accept().is_ok() {
            let _ = acc_tx.send(());
        }
    });
    go(move || {
        tx2.send("hello").unwrap();
        fiber::sleep(Duration::from_millis(100)).unwrap();
        tx1.send(42).unwrap();
    });
    let timer = chan::after(Duration::from_millis(1000));
    let id = fiber::select! {
        recv(acc_rx) -> _ => 0,
        recv(timer) -> _ => 1,
        recv(rx1) -> _ => 2,
        recv(rx2) -> a => { assert_eq!(a, Ok("hello")); 3 },
    };
    assert_eq!(id, 3);
    assert_eq!(rx1.recv(), Ok(42));
    acceptor.cancel();
    assert!(acceptor.join().unwrap_err().is_cancelled());
});

// examples/loop_select.rs: select until every channel delivered once.
port!(ex_loop_select, {
    let (sx1, rx1) = channel();
    let (sx2, rx2) = channel();
    sx1.send(100i32).unwrap();
    sx2.send(200i32).unwrap();
    let (mut v1, mut v2) = (None, None);
    while v1.is_none() || v2.is_none() {
        let mut sel = chan::Select::new();
        let i1 = if v1.is_none() { Some(sel.recv(&rx1)) } else { None };
        let i2 = if v2.is_none() { Some(sel.recv(&rx2)) } else { None };
        let op = sel.select_timeout(Duration::from_secs(5)).expect("timed out");
        let idx = op.index();
        if Some(idx) == i1 {
            v1 = Some(op.recv(&rx1).unwrap());
        } else if Some(idx) == i2 {
            v2 = Some(op.recv(&rx2).unwrap());
        } else {
            unreachable!()
        }
    }
    assert_eq!((v1, v2), (Some(100), Some(200)));
});

fn echo_server() -> (std::net::SocketAddr, JoinHandle<()>) {
    let listener = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = go(move || {
        while let Ok((mut stream, _)) = listener.accept() {
            fiber::spawn(move || {
                let mut buf = vec![0; 1024 * 8];
                while let Ok(n) = stream.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    stream.write_all(&buf[0..n]).unwrap();
                }
            });
        }
    });
    (addr, server)
}

// examples/single_thread_schedule.rs (and echo.rs + echo_client.rs)
port!(ex_single_thread_schedule, [W1, W2], {
    let (addr, server) = echo_server();
    fiber::scope(|s| {
        for i in 0..100u8 {
            s.spawn(move || {
                let mut buf = [i; 100];
                let mut conn = fiber::net::TcpStream::connect(addr).unwrap();
                conn.write_all(&buf).unwrap();
                conn.read_exact(&mut buf).unwrap();
                for v in buf.iter() {
                    assert_eq!(*v, i);
                }
            });
        }
    });
    server.cancel();
    assert!(server.join().unwrap_err().is_cancelled());
});

port!(ex_echo_clients_from_threads, [TH], {
    let (addr, server) = echo_server();
    let ts: Vec<_> = (0..8u8)
        .map(|i| {
            thread::spawn(move || {
                let mut conn = fiber::net::TcpStream::connect(addr).unwrap();
                for _ in 0..50 {
                    let mut buf = [i; 1000];
                    conn.write_all(&buf).unwrap();
                    conn.read_exact(&mut buf).unwrap();
                    assert!(buf.iter().all(|v| *v == i));
                }
            })
        })
        .collect();
    for t in ts {
        t.join().unwrap();
    }
    server.cancel();
    assert!(server.join().unwrap_err().is_cancelled());
});

// examples/echo_udp.rs + echo_udp_client.rs
port!(ex_echo_udp, {
    let sock = fiber::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = sock.local_addr().unwrap();
    let mut handlers = Vec::new();
    for _ in 0..2 {
        let sock = sock.try_clone().unwrap();
        handlers.push(go(move || {
            let mut buf = vec![0u8; 1024 * 16];
            loop {
                let (len, peer) = match sock.recv_from(&mut buf) {
                    Ok(v) => v,
                    Err(_) => return,
                };
                sock.send_to(&buf[..len], peer).unwrap();
            }
        }));
    }
    let clients: Vec<_> = (0..4u8)
        .map(|i| {
            go(move || {
                let s = fiber::net::UdpSocket::bind("127.0.0.1:0").unwrap();
                s.connect(addr).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                for _ in 0..20 {
                    s.send(&[i; 64]).unwrap();
                    let mut buf = [0u8; 128];
                    let n = s.recv(&mut buf).unwrap();
                    assert_eq!(&buf[..n], &[i; 64][..]);
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    for h in handlers {
        h.cancel();
        assert!(h.join().unwrap_err().is_cancelled());
    }
});

// examples/http.rs (tiny HTTP/1.1 server, keep-alive) + a client
port!(ex_http, {
    let listener = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = go(move || {
        while let Ok((mut stream, _)) = listener.accept() {
            fiber::spawn(move || {
                let mut buf = Vec::new();
                let mut tmp = [0u8; 512];
                loop {
                    while let Some(pos) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        buf.drain(..pos + 4);
                        let resp = b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\nHello World!";
                        if stream.write_all(resp).is_err() {
                            return;
                        }
                    }
                    match stream.read(&mut tmp) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&tmp[..n]),
                    }
                }
            });
        }
    });
    let mut c = fiber::net::TcpStream::connect(addr).unwrap();
    for _ in 0..10 {
        c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut resp = vec![0u8; 51];
        c.read_exact(&mut resp).unwrap();
        assert!(resp.ends_with(b"Hello World!"), "{:?}", String::from_utf8_lossy(&resp));
    }
    drop(c);
    server.cancel();
    assert!(server.join().unwrap_err().is_cancelled());
});

// ---------------------------------------------------------------- extensions of may's *_canceled tests:
// cancellation racing with the wake-up must not lose the resource.

use std::sync::atomic::AtomicBool;

// may semphore test_semphore_canceled, with the post racing the cancel.
port!(race_sem_cancel_vs_post, {
    for round in 0..300 {
        let sem = Arc::new(Semaphore::new(0));
        let got = Arc::new(AtomicBool::new(false));
        let (s2, g2) = (sem.clone(), got.clone());
        let (rtx, rrx) = chan::bounded(1);
        let h = go(move || {
            rtx.send(()).unwrap();
            if let Ok(p) = s2.acquire() {
                p.forget();
                g2.store(true, Ordering::SeqCst);
            }
        });
        rrx.recv().unwrap();
        if round % 3 == 0 {
            yield_any();
        }
        if round % 2 == 0 {
            sem.add_permits(1);
            h.cancel();
        } else {
            h.cancel();
            sem.add_permits(1);
        }
        let _ = h.join();
        let consumed = got.load(Ordering::SeqCst) as usize;
        assert_eq!(consumed + sem.available_permits(), 1, "round {round}: permit lost");
    }
});

// may mpsc + cancel: a recv cancelled while a send races must not lose the message.
port!(race_chan_recv_cancel_vs_send, {
    for round in 0..300 {
        let (tx, rx) = chan::unbounded::<u32>();
        let got = Arc::new(AtomicUsize::new(0));
        let g2 = got.clone();
        let rx2 = rx.clone();
        let (rtx, rrx) = chan::bounded(1);
        let h = go(move || {
            rtx.send(()).unwrap();
            if rx2.recv().is_ok() {
                g2.fetch_add(1, Ordering::SeqCst);
            }
        });
        rrx.recv().unwrap();
        if round % 3 == 0 {
            yield_any();
        }
        if round % 2 == 0 {
            tx.send(7).unwrap();
            h.cancel();
        } else {
            h.cancel();
            tx.send(7).unwrap();
        }
        let _ = h.join();
        let left = rx.try_iter().count();
        assert_eq!(
            got.load(Ordering::SeqCst) + left,
            1,
            "round {round}: message lost or duplicated"
        );
    }
});

// rendezvous: a send that returned Ok was received; a cancelled receive gives nothing.
port!(race_rendezvous_recv_cancel_vs_send, {
    for round in 0..300 {
        let (tx, rx) = chan::bounded::<u32>(0);
        let got = Arc::new(AtomicUsize::new(0));
        let g2 = got.clone();
        let (rtx, rrx) = chan::bounded(1);
        let h = go(move || {
            rtx.send(()).unwrap();
            if rx.recv().is_ok() {
                g2.fetch_add(1, Ordering::SeqCst);
            }
        });
        rrx.recv().unwrap();
        if round % 3 == 0 {
            yield_any();
        }
        h.cancel();
        let sent = tx.send_timeout(7, Duration::from_millis(20)).is_ok() as usize;
        let _ = h.join();
        assert_eq!(got.load(Ordering::SeqCst), sent, "round {round}");
    }
});

// may condvar test_condvar_canceled, with notify_one instead of notify_all
// (the contention the may comment mentions): after the cancelled fibers
// have left, each notify_one must wake one of the remaining waiters.
port!(race_condvar_cancel_then_notify_one, {
    const N: usize = 10;
    const M: usize = 3;
    for _round in 0..20 {
        let data = Arc::new((Mutex::new((0usize, 0usize)), Condvar::new()));
        let (tx, rx) = chan::unbounded();
        let mut vec = vec![];
        for _ in 0..N {
            let data = data.clone();
            let tx = tx.clone();
            vec.push(go(move || {
                let (lock, cond) = &*data;
                let mut st = lock.lock().unwrap();
                st.0 += 1;
                if st.0 == N {
                    tx.send(()).unwrap();
                }
                // wait for a ticket
                while st.1 == 0 {
                    st = cond.wait(st).unwrap();
                    if fiber::is_cancelled() {
                        return;
                    }
                }
                st.1 -= 1;
                drop(st);
                tx.send(()).unwrap();
            }));
        }
        drop(tx);
        rx.recv().unwrap();
        let mut it = vec.into_iter();
        for h in it.by_ref().take(M) {
            h.cancel();
            assert!(h.join().unwrap_err().is_cancelled());
        }
        let (lock, cond) = &*data;
        for _ in 0..N - M {
            lock.lock().unwrap().1 += 1;
            cond.notify_one();
        }
        for i in 0..N - M {
            match rx.recv_timeout(Duration::from_secs(5)) {
                Ok(()) => {}
                Err(e) => panic!("waiter {i} of {} not woken: {e:?}", N - M),
            }
        }
        for h in it {
            h.join().unwrap();
        }
    }
});

// condvar wait_timeout racing notify_one: if the timed waiter reports a
// time-out, the notification must reach the other waiter.
port!(race_condvar_timeout_vs_notify_one, {
    for round in 0..200 {
        let data = Arc::new((Mutex::new((0u32, false)), Condvar::new()));
        let (d1, d2) = (data.clone(), data.clone());
        let (rtx, rrx) = chan::unbounded();
        let rtx2 = rtx.clone();
        let a = go(move || {
            let (l, c) = &*d1;
            let mut g = l.lock().unwrap();
            g.0 += 1;
            rtx.send(()).unwrap();
            let (g2, r) = c.wait_timeout(g, Duration::from_millis(2)).unwrap();
            g = g2;
            if !r.timed_out() && g.1 {
                g.1 = false; // took the ticket
                return true;
            }
            false
        });
        let b = go(move || {
            let (l, c) = &*d2;
            let mut g = l.lock().unwrap();
            g.0 += 1;
            rtx2.send(()).unwrap();
            let deadline = Instant::now() + Duration::from_secs(3);
            while !g.1 {
                let (g2, r) = c.wait_timeout(g, Duration::from_secs(3)).unwrap();
                g = g2;
                if r.timed_out() || Instant::now() > deadline {
                    return false;
                }
            }
            g.1 = false;
            true
        });
        rrx.recv().unwrap();
        rrx.recv().unwrap();
        if round % 2 == 0 {
            msleep(2);
        }
        {
            let (l, c) = &*data;
            let mut g = l.lock().unwrap();
            g.1 = true;
            c.notify_one();
            drop(g);
            let _ = c; // nothing else
        }
        let ra = a.join().unwrap();
        if ra {
            // A took the ticket; B still waits: release it.
            let (l, c) = &*data;
            l.lock().unwrap().1 = true;
            c.notify_all();
        }
        let rb = b.join().unwrap();
        assert!(rb || ra, "round {round}: notification lost (a timed out, b not woken)");
    }
});

// may join + cancel: a cancelled join leaves the joined fiber running.
port!(ext_join_cancelled_joined_runs_on, {
    let (tx, rx) = chan::bounded(1);
    let inner = go(move || {
        fiber::non_cancellable(|| fiber::sleep(Duration::from_millis(50)).unwrap());
        tx.send(5).unwrap();
        9
    });
    let (jtx, jrx) = chan::bounded(1);
    let joiner = go(move || {
        jtx.send(()).unwrap();
        inner.join()
    });
    jrx.recv().unwrap();
    msleep(5);
    joiner.cancel();
    assert!(joiner.join().unwrap_err().is_cancelled());
    assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok(5));
});

// WaitGroup::wait is a cancellation point
port!(ext_waitgroup_cancel, {
    let wg = WaitGroup::new();
    let w2 = wg.clone();
    let (rtx, rrx) = chan::bounded(1);
    let keep = wg.clone();
    let h = go(move || {
        rtx.send(()).unwrap();
        w2.wait();
    });
    rrx.recv().unwrap();
    msleep(10);
    h.cancel();
    assert!(h.join().unwrap_err().is_cancelled());
    drop(keep);
    drop(wg);
});

// Barrier::wait cancelled: the barrier still trips for the others later?
port!(ext_barrier_cancel, {
    let b = Arc::new(Barrier::new(2));
    let b2 = b.clone();
    let h = go(move || b2.wait().is_cancelled());
    msleep(10);
    h.cancel();
    let _ = h.join();
    // a cancelled waiter left: two fresh waiters must still trip it
    let b3 = b.clone();
    let h2 = go(move || b3.wait().is_leader());
    let l1 = b.wait().is_leader();
    let l2 = h2.join().unwrap();
    assert!(l1 ^ l2);
});

// tests/lib.rs go_with_macro: may spawns with 8192 and 10240-byte stacks.
port!(lib_go_with_small_stacks, [W1, W2], {
    for size in [8192usize, 10240] {
        let (tx, rx) = chan::bounded(1);
        let h = fiber::Builder::new()
            .name("test_task")
            .stack_size(size)
            .spawn(move || {
                let mut v = [0u8; 1024];
                v[size % 1024] = 1;
                tx.send((fiber::current().name().map(ToOwned::to_owned), v.iter().sum::<u8>()))
                    .unwrap();
            })
            .unwrap();
        h.join().unwrap();
        assert_eq!(rx.recv().unwrap(), (Some("test_task".to_owned()), 1));
    }
});

// may cancel semantics of a coroutine that has not run yet: fiber's doc says
// "if it has not started it never runs".
port!(ext_cancel_before_start, [W1], {
    let ran = Arc::new(AtomicBool::new(false));
    let r2 = ran.clone();
    let h = fiber::spawn(move || r2.store(true, Ordering::SeqCst));
    h.cancel();
    let e = h.join().unwrap_err();
    assert!(e.is_cancelled());
    assert!(!ran.load(Ordering::SeqCst));
});

port!(ext_is_finished, {
    let h = go(|| msleep(20));
    assert!(!h.is_finished());
    let t = Instant::now();
    while !h.is_finished() && t.elapsed() < Duration::from_secs(5) {
        msleep(5);
    }
    assert!(h.is_finished());
    h.join().unwrap();
});
