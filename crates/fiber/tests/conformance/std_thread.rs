//! Conformance with the documented behaviour of `std::thread` for the
//! parts of the facade that claim it: `spawn` / `JoinHandle`, `Builder`,
//! `scope`, `current`, `park` / `unpark`, `sleep`, `yield_now`.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::{ms, on_runtime, within};

/// std: `join` returns `Err` with the panic payload when the thread
/// panicked: a `&'static str` for `panic!("literal")`, a `String` for a
/// formatted message, any value for `panic_any`; `Ok(value)` otherwise.
#[test]
fn join_gives_the_panic_payload_as_std() {
    on_runtime(|| {
        assert_eq!(fiber::spawn(|| 7).join().unwrap(), 7);
        let err = fiber::spawn(|| panic!("literal")).join().unwrap_err();
        assert!(err.is_panic());
        assert_eq!(err.into_panic().downcast_ref::<&str>(), Some(&"literal"));
        let n = 3;
        let err = fiber::spawn(move || panic!("formatted {n}")).join().unwrap_err();
        assert_eq!(
            err.into_panic().downcast_ref::<String>().map(String::as_str),
            Some("formatted 3")
        );
        let err = fiber::spawn(|| std::panic::panic_any(42u64)).join().unwrap_err();
        assert_eq!(err.into_panic().downcast_ref::<u64>(), Some(&42));
        // A JoinHandle is Send: a plain thread can join a fiber, blocking.
        let h = fiber::spawn(|| "from a fiber");
        let got = std::thread::spawn(move || h.join().unwrap()).join().unwrap();
        assert_eq!(got, "from a fiber");
    });
}

/// std: `is_finished` is false while the thread runs and true once its
/// main function returned (or panicked), without joining.
#[test]
fn is_finished_as_std() {
    on_runtime(|| {
        let (tx, rx) = fiber::chan::bounded::<()>(0);
        let h = fiber::spawn(move || rx.recv().is_ok());
        assert!(!h.is_finished());
        tx.send(()).unwrap();
        while !h.is_finished() {
            fiber::yield_now().unwrap();
        }
        assert!(h.join().unwrap());
        let p = fiber::spawn(|| panic!("ends"));
        while !p.is_finished() {
            fiber::yield_now().unwrap();
        }
        assert!(p.join().is_err());
    });
}

/// std: every thread has a unique id; `JoinHandle::thread()` names the
/// spawned thread (`id`, `name`); `current()` inside it agrees; `name` is
/// `None` unless set with `Builder::name`.
#[test]
fn ids_names_and_current_as_std() {
    on_runtime(|| {
        let root = fiber::current().id();
        let handles: Vec<_> = (0..50).map(|_| fiber::spawn(|| fiber::current().id())).collect();
        let mut seen = HashSet::new();
        seen.insert(root);
        for h in handles {
            let from_handle = h.fiber().id();
            assert_eq!(h.id(), from_handle);
            let inside = h.join().unwrap();
            assert_eq!(inside, from_handle, "current().id() differs from the handle's id");
            assert!(seen.insert(inside), "fiber ids are not unique");
        }
        assert_eq!(
            fiber::spawn(|| fiber::current().name().map(str::to_owned))
                .join()
                .unwrap(),
            None
        );
        let h = fiber::Builder::new()
            .name("worker-x")
            .spawn(|| fiber::current().name().map(str::to_owned))
            .unwrap();
        assert_eq!(h.fiber().name(), Some("worker-x"));
        assert_eq!(h.join().unwrap().as_deref(), Some("worker-x"));
    });
}

/// std: `Builder::spawn` returns an `io::Result`; a stack size the system
/// cannot give is an error, not a crash; a tiny stack size still gives a
/// working thread (the minimum is used).
#[test]
fn builder_bad_stack_sizes_are_errors_not_crashes() {
    on_runtime(|| {
        let err = fiber::Builder::new().stack_size(usize::MAX).spawn(|| ()).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput, "{err}");
        let err = fiber::Builder::new()
            .stack_size(usize::MAX / 2)
            .spawn(|| ())
            .unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput, "{err}");
        assert_eq!(
            fiber::Builder::new().stack_size(0).spawn(|| 1).unwrap().join().unwrap(),
            1
        );
        assert_eq!(
            fiber::Builder::new().stack_size(1).spawn(|| 2).unwrap().join().unwrap(),
            2
        );
        // Any name without a NUL byte is only a label here; one with a NUL
        // makes the spawn panic, as std's does.
        let h = fiber::Builder::new().name("a b ü\n").spawn(|| 3).unwrap();
        assert_eq!(h.join().unwrap(), 3);
        let nul = std::panic::catch_unwind(|| fiber::Builder::new().name("a\0b").spawn(|| 4));
        assert!(nul.is_err(), "a name with a NUL byte was accepted");
        fiber::scope(|s| {
            let err = fiber::Builder::new()
                .stack_size(usize::MAX)
                .spawn_scoped(s, || ())
                .unwrap_err();
            assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
        });
    });
}

/// std: `scope` returns the closure's value only after every spawned
/// thread ended; if one panicked, `scope` panics after all are joined (the
/// payload is the child's); scoped threads may borrow from the caller.
#[test]
fn scope_joins_everything_then_reraises_as_std() {
    on_runtime(|| {
        let mut data = vec![1, 2, 3];
        let total = AtomicUsize::new(0);
        let r = fiber::scope(|s| {
            for x in &data {
                let total = &total;
                s.spawn(move || total.fetch_add(*x, Ordering::Relaxed));
            }
            "value"
        });
        assert_eq!(r, "value");
        assert_eq!(total.load(Ordering::Relaxed), 6);
        data.push(4); // The borrows ended with the scope.

        // Each child owns a token whose drop counts it as ended (run to
        // the end, unwound, or dropped unrun after a cancellation).
        struct Ended<'a>(&'a AtomicUsize);
        impl Drop for Ended<'_> {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let ended = AtomicUsize::new(0);
        let n = 8;
        let payload = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            fiber::scope(|s| {
                for i in 0..n {
                    let token = Ended(&ended);
                    s.spawn(move || {
                        let _token = token;
                        if i == 3 {
                            panic!("child three");
                        }
                        // Some work without a cancellation point.
                        std::hint::black_box((0..1000).sum::<u64>())
                    });
                }
            })
        }))
        .unwrap_err();
        assert_eq!(
            ended.load(Ordering::SeqCst),
            n,
            "scope returned before every child ended"
        );
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"child three"));
    });
}

/// std: `unpark` makes the token available: a `park` after an `unpark`
/// returns at once; tokens do not accumulate; `park_timeout` with zero
/// returns, with `Duration::MAX` waits for an `unpark` (from a plain
/// thread too).
#[test]
fn park_unpark_tokens_as_std() {
    on_runtime(|| {
        let me = fiber::current();
        me.unpark();
        me.unpark();
        fiber::park(); // the token is there: returns at once
        fiber::park_timeout(Duration::ZERO);
        fiber::park_timeout(ms(1));
        let waiter = fiber::spawn(|| fiber::park_timeout(Duration::MAX));
        let handle = waiter.fiber();
        std::thread::spawn(move || handle.unpark()).join().unwrap();
        waiter.join().unwrap();
    });
}

/// std-like sleeps: zero returns at once (`Ok`), `Duration::MAX` does not
/// panic and ends when the fiber is cancelled; `yield_now` returns `Ok`.
#[test]
fn sleep_zero_and_max_and_yield() {
    on_runtime(|| {
        fiber::sleep(Duration::ZERO).unwrap();
        fiber::yield_now().unwrap();
        let started = Arc::new(AtomicUsize::new(0));
        let s = started.clone();
        let sleeper = fiber::spawn(move || {
            s.store(1, Ordering::SeqCst);
            fiber::sleep(Duration::MAX)
        });
        while started.load(Ordering::SeqCst) == 0 {
            fiber::yield_now().unwrap();
        }
        sleeper.cancel();
        match sleeper.join() {
            Ok(r) => assert!(r.is_err(), "sleep(Duration::MAX) returned Ok"),
            Err(e) => assert!(e.is_cancelled()),
        }
        let until = std::time::Instant::now();
        fiber::sleep_until(until).unwrap();
    });
}

/// Very long but representable timeouts (an `Instant` exists for them) do
/// not overflow into an early wake-up, a panic or a hang: each wait below
/// runs until it is cancelled (sleep, park, condvar) or notified.
#[test]
fn huge_timeouts_neither_fire_early_nor_panic() {
    on_runtime(|| {
        for secs in [u64::MAX / 4, i64::MAX as u64 / 1_000, 1 << 40, 365 * 24 * 3600 * 1000] {
            let d = Duration::from_secs(secs);
            let started = Arc::new(AtomicUsize::new(0));
            let s = started.clone();
            let sleeper = fiber::spawn(move || {
                s.store(1, Ordering::SeqCst);
                let slept = fiber::sleep(d);
                let cv = fiber::sync::Condvar::new();
                let m = fiber::sync::Mutex::new(());
                let (_g, waited) = cv.wait_timeout(m.lock().unwrap(), d).unwrap();
                (slept, waited.timed_out())
            });
            while started.load(Ordering::SeqCst) == 0 {
                fiber::yield_now().unwrap();
            }
            sleeper.cancel();
            match sleeper.join() {
                Ok((slept, timed_out)) => {
                    assert!(slept.is_err(), "sleep({secs} s) ended by itself");
                    assert!(!timed_out, "wait_timeout({secs} s) timed out");
                }
                Err(e) => assert!(e.is_cancelled(), "{e}"),
            }
            let (tx, rx) = fiber::chan::bounded::<u8>(1);
            let _ = std::thread::spawn(move || tx.send(9)).join();
            assert_eq!(rx.recv_timeout(d), Ok(9));
            assert!(rx.recv_timeout(d).is_err(), "disconnected: an error at once");
            let parker = fiber::spawn(move || fiber::park_timeout(d));
            let h = parker.fiber();
            h.unpark();
            parker.join().unwrap();
        }
    });
}

/// std: scoped threads may spawn more threads into the same scope (the
/// scope is shared by reference); `ScopedJoinHandle::join` gives the value
/// and `is_finished` turns true; if the scope's own closure panics, the
/// scope still waits for every child before the panic goes on.
#[test]
fn scope_nested_spawns_handles_and_a_panicking_body_as_std() {
    on_runtime(|| {
        let hits = AtomicUsize::new(0);
        let got = fiber::scope(|s| {
            let outer = s.spawn(|| {
                let inner: Vec<_> = (0..4).map(|i| s.spawn(move || i * 10)).collect();
                hits.fetch_add(1, Ordering::SeqCst);
                inner.into_iter().map(|h| h.join().unwrap()).sum::<usize>()
            });
            let sum = outer.join().unwrap();
            let quick = s.spawn(|| 5);
            while !quick.is_finished() {
                fiber::yield_now().unwrap();
            }
            sum + quick.join().unwrap()
        });
        assert_eq!(got, 65);
        assert_eq!(hits.load(Ordering::SeqCst), 1);

        struct Ended<'a>(&'a AtomicUsize);
        impl Drop for Ended<'_> {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let ended = AtomicUsize::new(0);
        let payload = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            fiber::scope(|s| {
                for _ in 0..4 {
                    let token = Ended(&ended);
                    s.spawn(move || {
                        let _token = token;
                        std::hint::black_box((0..1000).sum::<u64>())
                    });
                }
                panic!("the body");
            })
        }))
        .unwrap_err();
        assert_eq!(
            ended.load(Ordering::SeqCst),
            4,
            "the scope's panic left before its children ended"
        );
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"the body"));
    });
}

/// `Duration::MAX` everywhere a duration is taken: no overflow panic, no
/// early expiry, and the operation still completes when it can.
#[test]
fn duration_max_is_accepted_everywhere() {
    on_runtime(|| {
        assert_eq!(fiber::with_timeout(Duration::MAX, || 4), Ok(4));
        let after = fiber::chan::after(Duration::MAX);
        let tick = fiber::chan::tick(Duration::MAX);
        fiber::yield_now().unwrap();
        assert!(after.try_recv().is_err(), "after(Duration::MAX) fired");
        assert!(tick.try_recv().is_err(), "tick(Duration::MAX) fired");
        let (tx, rx) = fiber::chan::bounded::<u8>(1);
        tx.send_timeout(1, Duration::MAX).unwrap();
        let mut sel = fiber::chan::Select::new();
        let i = sel.recv(&rx);
        let op = sel.select_timeout(Duration::MAX).unwrap();
        assert_eq!(op.index(), i);
        assert_eq!(op.recv(&rx), Ok(1));
        fiber::park_timeout(Duration::ZERO);
        let pair = (fiber::sync::Mutex::new(true), fiber::sync::Condvar::new());
        let (g, r) = pair
            .1
            .wait_timeout_while(pair.0.lock().unwrap(), Duration::MAX, |go| !*go)
            .unwrap();
        assert!(*g && !r.timed_out());
        drop(g);
        let s = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = fiber::net::TcpStream::connect_timeout(&s.local_addr().unwrap(), Duration::MAX).unwrap();
        c.set_write_timeout(Some(Duration::MAX)).unwrap();
    });
}

/// Shutdown with parked fibers, seen from plain threads: after the runtime
/// is dropped, joining its fibers' handles returns at once with an error
/// (whether they were parked at a cancellable wait or in a lock a plain
/// thread held), and the locks they waited for stay usable.
#[test]
fn join_from_a_thread_after_shutdown_returns_and_locks_stay_usable() {
    within(30, || {
        let m = Arc::new(fiber::sync::Mutex::new(0));
        let l = Arc::new(fiber::sync::RwLock::new(0));
        let held = m.lock().unwrap();
        let write = l.write().unwrap();
        let rt = fiber::Runtime::builder()
            .workers(2)
            .shutdown_timeout(ms(100))
            .build()
            .unwrap();
        let parked = Arc::new(AtomicUsize::new(0));
        let (m2, l2, p) = (m.clone(), l.clone(), parked.clone());
        let on_lock = rt.spawn(move || {
            p.fetch_add(1, Ordering::SeqCst);
            *m2.lock().unwrap() += 1;
        });
        let p = parked.clone();
        let on_rwlock = rt.spawn(move || {
            p.fetch_add(1, Ordering::SeqCst);
            *l2.write().unwrap() += 1;
        });
        let p = parked.clone();
        let sleeping = rt.spawn(move || {
            p.fetch_add(1, Ordering::SeqCst);
            fiber::sleep(Duration::MAX)
        });
        while parked.load(Ordering::SeqCst) < 3 {
            std::thread::yield_now();
        }
        drop(rt);
        assert!(on_lock.join().is_err());
        assert!(on_rwlock.join().is_err());
        match sleeping.join() {
            Ok(r) => assert!(r.is_err(), "sleep(Duration::MAX) returned Ok"),
            Err(e) => assert!(e.is_cancelled(), "{e}"),
        }
        drop(held);
        drop(write);
        // The fibers never got the locks: only this thread's additions.
        *m.lock().unwrap_or_else(|e| e.into_inner()) += 10;
        *l.write().unwrap_or_else(|e| e.into_inner()) += 10;
        assert_eq!(*m.lock().unwrap_or_else(|e| e.into_inner()), 10);
        assert_eq!(*l.read().unwrap_or_else(|e| e.into_inner()), 10);
    });
}

/// std: `sleep` puts the caller to sleep "for at least the specified
/// amount of time"; a `Condvar::wait_timeout` that reports `timed_out()`
/// has waited at least its timeout; an expired socket read timeout has too.
/// (Lower bounds only: no upper bound is asserted.)
#[test]
fn timed_waits_last_at_least_their_duration() {
    fn check() {
        for d in [ms(1), ms(3), ms(7), ms(12), Duration::from_micros(1500)] {
            let start = std::time::Instant::now();
            if fiber::core::in_fiber() {
                fiber::sleep(d).unwrap();
                let slept = start.elapsed();
                assert!(slept >= d, "fiber::sleep({d:?}) returned after {slept:?}");
            }
            let m = fiber::sync::Mutex::new(());
            let cv = fiber::sync::Condvar::new();
            let start = std::time::Instant::now();
            let (_g, r) = cv.wait_timeout(m.lock().unwrap(), d).unwrap();
            let waited = start.elapsed();
            assert!(
                !r.timed_out() || waited >= d,
                "wait_timeout({d:?}) timed out after {waited:?}"
            );
            let start = std::time::Instant::now();
            let (_g, r) = cv.wait_timeout_while(_g, d, |_| true).unwrap();
            let waited = start.elapsed();
            assert!(
                r.timed_out() && waited >= d,
                "wait_timeout_while({d:?}) timed out after {waited:?}"
            );
            let udp = fiber::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            udp.set_read_timeout(Some(d)).unwrap();
            let start = std::time::Instant::now();
            assert!(udp.recv_from(&mut [0; 1]).is_err());
            let waited = start.elapsed();
            assert!(waited >= d, "a read timeout of {d:?} expired after {waited:?}");
        }
    }
    on_runtime(check);
    within(30, check);
}

fiber::fiber_local! {
    static CONST_INIT: std::cell::Cell<u32> = const { std::cell::Cell::new(7) };
    static LIST: std::cell::RefCell<Vec<u32>> = std::cell::RefCell::new(Vec::new());
}

/// Code moved over from `thread_local!` compiles and behaves alike: a
/// `const { .. }` initializer, `try_with`, and the `Cell` / `RefCell`
/// shortcuts (`get`, `set`, `take`, `replace`, `with_borrow`,
/// `with_borrow_mut`), each fiber with its own value, and a plain thread
/// with its own.
#[test]
fn fiber_locals_take_the_thread_local_shapes() {
    fn exercise(seed: u32) -> (u32, u32, Vec<u32>) {
        assert_eq!(CONST_INIT.get(), 7, "a fresh value per fiber or thread");
        CONST_INIT.set(seed);
        let _ = fiber::yield_now();
        let old = CONST_INIT.replace(seed + 1);
        assert_eq!(CONST_INIT.try_with(|c| c.get()), Ok(seed + 1));
        LIST.with_borrow_mut(|v| v.push(seed));
        let _ = fiber::yield_now();
        LIST.set(vec![seed, seed * 2]);
        let len = LIST.with_borrow(|v| v.len()) as u32;
        let taken = LIST.take();
        assert!(LIST.with_borrow(|v| v.is_empty()));
        assert_eq!(LIST.replace(vec![1]), Vec::<u32>::new());
        assert_eq!(CONST_INIT.take(), seed + 1);
        (old, len, taken)
    }
    on_runtime(|| {
        let handles: Vec<_> = (1..=8u32).map(|i| fiber::spawn(move || exercise(i * 10))).collect();
        for (i, h) in (1..=8u32).zip(handles) {
            assert_eq!(h.join().unwrap(), (i * 10, 2, vec![i * 10, i * 20]));
        }
    });
    std::thread::spawn(|| assert_eq!(exercise(3), (3, 2, vec![3, 6])))
        .join()
        .unwrap();
}

/// std's idiom for a panicked thread's message,
/// `handle.join().unwrap_err().downcast_ref::<&str>()`, compiles and reads
/// the same on a fiber's `JoinError` (and `String` payloads through
/// `downcast_ref::<String>()`); other errors have no payload.
#[test]
fn join_error_downcast_ref_reads_the_panic_payload_as_std_does() {
    crate::common::on_runtime(|| {
        let h = fiber::spawn(|| -> u32 { panic!("static message") });
        let err = h.join().unwrap_err();
        assert_eq!(err.downcast_ref::<&str>(), Some(&"static message"));
        assert!(err.downcast_ref::<String>().is_none());
        assert!(err.panic_payload().is_some());
        let n = std::hint::black_box(7);
        let h = fiber::spawn(move || -> u32 { panic!("formatted {n}") });
        let err = h.join().unwrap_err();
        assert_eq!(err.downcast_ref::<String>().map(String::as_str), Some("formatted 7"));
        let h = fiber::spawn(|| loop {
            if fiber::yield_now().is_err() {
                return 1u32;
            }
        });
        h.cancel();
        let err = h.join().unwrap_err();
        assert!(err.is_cancelled());
        assert!(err.downcast_ref::<&str>().is_none() && err.panic_payload().is_none());
    });
}

/// std's idiom for handing a thread's panic on: `resume_unwind` with the
/// error of its join. Here `err.into()` gives that box (the payload
/// itself), and `downcast_ref` reads a payload that is not a string.
#[test]
fn a_join_error_converts_into_std_s_panic_box_for_resume_unwind() {
    crate::common::on_runtime(|| {
        let err = fiber::spawn(|| -> u32 { std::panic::panic_any(42i32) })
            .join()
            .unwrap_err();
        assert_eq!(err.downcast_ref::<i32>(), Some(&42));
        let payload: Box<dyn std::any::Any + Send> = err.into();
        let caught =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| std::panic::resume_unwind(payload))).unwrap_err();
        assert_eq!(caught.downcast_ref::<i32>(), Some(&42));
    });
}
