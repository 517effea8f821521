//! Adversarial: cancellation in the middle of `fiber::sync` waits and
//! socket calls must leave the primitive exactly as std would after a
//! waiter gave up (counts, lock ownership, registrations), and std's
//! nonblocking and EOF conventions hold.

use fiber::chan;
use fiber::sync::{Barrier, Condvar, Mutex, Semaphore};
use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use crate::common::{ms, on_runtime, within};

#[test]
fn a_cancelled_condvar_wait_returns_with_the_mutex_locked() {
    on_runtime(|| {
        let pair = Arc::new((Mutex::new(0u32), Condvar::new()));
        let p = pair.clone();
        let (report_tx, report_rx) = chan::bounded::<bool>(1);
        let (release_tx, release_rx) = chan::bounded::<()>(0);
        let waiter = fiber::spawn(move || {
            let (m, cv) = &*p;
            let guard = cv.wait(m.lock().unwrap()).unwrap();
            // Cancelled: the guard must hold the lock again.
            report_tx.send(m.try_lock().is_err()).unwrap();
            let _ = release_rx.recv();
            drop(guard);
        });
        fiber::sleep(ms(10)).unwrap();
        waiter.cancel();
        let locked = report_rx.recv_timeout(ms(5000)).expect("the cancelled wait returned");
        assert!(locked, "a cancelled Condvar::wait returned a guard without the lock");
        drop(release_tx);
        let _ = waiter.join();
        let (m, _) = &*pair;
        assert!(m.try_lock().is_ok(), "the guard's drop unlocked the mutex");
    })
}

#[test]
fn a_cancelled_barrier_wait_withdraws_its_arrival() {
    on_runtime(|| {
        let barrier = Arc::new(Barrier::new(2));
        let b = barrier.clone();
        let early = fiber::spawn(move || b.wait().is_cancelled());
        fiber::sleep(ms(10)).unwrap();
        early.cancel();
        let r = early.join();
        assert!(r.unwrap_or_else(|e| e.is_cancelled()), "the early waiter was cancelled");
        // The withdrawn arrival must not count: one new waiter alone must
        // not pass a barrier of two.
        let b = barrier.clone();
        let alone = fiber::spawn(move || b.wait().is_leader());
        fiber::sleep(ms(20)).unwrap();
        assert!(!alone.is_finished(), "a barrier of 2 released a single waiter");
        let leader_here = barrier.wait().is_leader();
        let leader_there = alone.join().unwrap();
        assert!(leader_here ^ leader_there, "exactly one leader");
    })
}

#[test]
fn a_cancelled_waitgroup_wait_and_a_cancelled_semaphore_acquire_leave_counts_intact() {
    on_runtime(|| {
        let wg = fiber::sync::WaitGroup::new();
        let member = wg.clone();
        let w = wg.clone();
        let waiter = fiber::spawn(move || w.wait());
        fiber::sleep(ms(10)).unwrap();
        waiter.cancel();
        let _ = waiter.join();
        // The cancelled waiter's own handle was dropped by `wait`; the
        // group still waits for `member`.
        let done = Arc::new(AtomicUsize::new(0));
        let d = done.clone();
        let m = fiber::spawn(move || {
            fiber::sleep(ms(10)).unwrap();
            d.store(1, Ordering::SeqCst);
            drop(member);
        });
        wg.wait();
        assert_eq!(
            done.load(Ordering::SeqCst),
            1,
            "wait returned before the last member left"
        );
        m.join().unwrap();

        let sem = Arc::new(Semaphore::new(1));
        let held = sem.try_acquire().unwrap();
        let s = sem.clone();
        let blocked = fiber::spawn(move || s.acquire().map(drop).is_err());
        fiber::sleep(ms(10)).unwrap();
        blocked.cancel();
        let _ = blocked.join();
        drop(held);
        assert_eq!(
            sem.available_permits(),
            1,
            "the cancelled acquirer neither took nor leaked a permit"
        );
        let s = sem.clone();
        assert!(fiber::spawn(move || s.acquire().is_ok()).join().unwrap());
    })
}

#[test]
fn a_plain_thread_and_fibers_contend_on_one_mutex_held_across_parks() {
    within(30, || {
        let rt = fiber::Runtime::builder().workers(2).build().unwrap();
        let m = Arc::new(Mutex::new(0u64));
        let fibers: Vec<_> = (0..4)
            .map(|_| {
                let m = m.clone();
                rt.spawn(move || {
                    for _ in 0..50 {
                        let mut g = m.lock().unwrap();
                        let v = *g;
                        fiber::yield_now().unwrap();
                        *g = v + 1;
                    }
                })
            })
            .collect();
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let m = m.clone();
                std::thread::spawn(move || {
                    for _ in 0..50 {
                        let mut g = m.lock().unwrap();
                        let v = *g;
                        std::thread::yield_now();
                        *g = v + 1;
                    }
                })
            })
            .collect();
        fibers.into_iter().for_each(|f| f.join().unwrap());
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(*m.lock().unwrap(), 300);
    })
}

#[test]
fn a_listener_still_accepts_after_a_cancelled_accept() {
    on_runtime(|| {
        let listener = Arc::new(fiber::net::TcpListener::bind("127.0.0.1:0").unwrap());
        let addr = listener.local_addr().unwrap();
        let l = listener.clone();
        let first = fiber::spawn(move || l.accept().map(|_| ()));
        fiber::sleep(ms(10)).unwrap();
        first.cancel();
        match first.join() {
            Ok(r) => assert_eq!(r.unwrap_err().kind(), io::ErrorKind::Other),
            Err(e) => assert!(e.is_cancelled()),
        }
        let l = listener.clone();
        let second = fiber::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            s.write_all(b"ok").unwrap();
        });
        let mut c = fiber::net::TcpStream::connect(addr).unwrap();
        let mut buf = [0u8; 2];
        c.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"ok");
        second.join().unwrap();
    })
}

#[test]
fn two_fibers_reading_one_socket_each_get_data_and_nothing_is_lost() {
    on_runtime(|| {
        let listener = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mut client = fiber::net::TcpStream::connect(addr).unwrap();
        let (server, _) = listener.accept().unwrap();
        let total = Arc::new(AtomicUsize::new(0));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let mut s = server.try_clone().unwrap();
                let total = total.clone();
                fiber::spawn(move || {
                    let mut buf = [0u8; 64];
                    loop {
                        match s.read(&mut buf) {
                            Ok(0) => return,
                            Ok(n) => {
                                total.fetch_add(n, Ordering::SeqCst);
                            }
                            Err(e) => panic!("{e}"),
                        }
                    }
                })
            })
            .collect();
        for _ in 0..10 {
            client.write_all(&[7u8; 10]).unwrap();
            fiber::sleep(ms(2)).unwrap();
        }
        client.shutdown(std::net::Shutdown::Write).unwrap();
        // Both readers see EOF (each read after EOF returns 0 again).
        for r in readers {
            r.join().unwrap();
        }
        assert_eq!(total.load(Ordering::SeqCst), 100);
    })
}

#[test]
fn nonblocking_sockets_return_would_block_like_std() {
    on_runtime(|| {
        let listener = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let err = listener.accept().unwrap_err();
        assert_eq!(
            err.kind(),
            io::ErrorKind::WouldBlock,
            "std: a nonblocking accept with no client"
        );
        let addr = listener.local_addr().unwrap();
        let mut c = fiber::net::TcpStream::connect(addr).unwrap();
        c.set_nonblocking(true).unwrap();
        let err = c.read(&mut [0u8; 4]).unwrap_err();
        assert_eq!(
            err.kind(),
            io::ErrorKind::WouldBlock,
            "std: a nonblocking read with no data"
        );
        let udp = fiber::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        udp.set_nonblocking(true).unwrap();
        let err = udp.recv_from(&mut [0u8; 4]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
        // Back to blocking: the read parks and gets the data.
        c.set_nonblocking(false).unwrap();
        let (mut s, _) = loop {
            match listener.accept() {
                Ok(pair) => break pair,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => fiber::sleep(ms(1)).unwrap(),
                Err(e) => panic!("{e}"),
            }
        };
        let writer = fiber::spawn(move || {
            fiber::sleep(ms(10)).unwrap();
            s.write_all(b"late").unwrap();
        });
        let mut buf = [0u8; 4];
        c.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"late");
        writer.join().unwrap();
    })
}

#[test]
fn sockets_work_from_plain_threads_blocking_the_thread() {
    within(30, || {
        let listener = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = [0u8; 5];
            s.read_exact(&mut buf).unwrap();
            s.write_all(&buf).unwrap();
        });
        let mut c = fiber::net::TcpStream::connect(addr).unwrap();
        c.set_read_timeout(Some(ms(20))).unwrap();
        let err = c.read(&mut [0u8; 1]).unwrap_err();
        assert!(
            matches!(err.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut),
            "{err:?}"
        );
        c.set_read_timeout(None).unwrap();
        c.write_all(b"hello").unwrap();
        let mut back = [0u8; 5];
        c.read_exact(&mut back).unwrap();
        assert_eq!(&back, b"hello");
        t.join().unwrap();
    })
}

#[test]
fn blocking_reraises_the_closures_panic_and_keeps_its_value_when_cancelled() {
    on_runtime(|| {
        let r = std::panic::catch_unwind(|| fiber::blocking(|| -> u8 { panic!("in the pool") }));
        let payload = r.unwrap_err();
        assert_eq!(payload.downcast_ref::<&str>().copied(), Some("in the pool"));
        assert_eq!(fiber::blocking(|| 5), 5, "the pool still works");
        // `blocking` is not a cancellation point: a cancelled caller still
        // gets the closure's value (nothing is lost or run twice).
        let runs = Arc::new(AtomicUsize::new(0));
        let r2 = runs.clone();
        let h = fiber::spawn(move || {
            fiber::blocking(move || {
                std::thread::sleep(ms(30));
                r2.fetch_add(1, Ordering::SeqCst);
                7
            })
        });
        fiber::sleep(ms(5)).unwrap();
        h.cancel();
        match h.join() {
            Ok(v) => assert_eq!(v, 7),
            Err(e) => assert!(e.is_cancelled()),
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1, "the closure ran exactly once");
    })
}

/// On one worker: while fiber A waits for something a plain thread holds,
/// fiber B must still run (A parks, it does not block the worker). The
/// thread releases only after seeing B's progress.
type Waiter = Box<dyn FnOnce() + Send>;

fn waiting_parks_not_blocks(hold: impl FnOnce(Arc<std::sync::atomic::AtomicBool>) -> Waiter + Send + 'static) {
    use std::sync::atomic::AtomicBool;
    within(30, move || {
        let rt = fiber::Runtime::builder().workers(1).max_workers(1).build().unwrap();
        let progressed = Arc::new(AtomicBool::new(false));
        let wait = hold(progressed.clone());
        rt.block_on(move || {
            let a = fiber::spawn(wait);
            fiber::sleep(ms(5)).unwrap();
            // B: runs on the only worker while A waits.
            let b = fiber::spawn(move || progressed.store(true, Ordering::SeqCst));
            b.join().unwrap();
            a.join().unwrap();
        });
    })
}

/// Spin a plain thread until `flag` is set (or 20 s), then run `release`.
fn release_after(flag: Arc<std::sync::atomic::AtomicBool>, release: impl FnOnce() + Send + 'static) {
    std::thread::spawn(move || {
        let start = std::time::Instant::now();
        while !flag.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(ms(1));
        }
        assert!(
            flag.load(Ordering::SeqCst),
            "the other fiber never ran while one waited"
        );
        release();
    });
}

#[test]
fn a_fiber_waiting_for_a_mutex_held_by_a_thread_parks_instead_of_blocking_its_worker() {
    waiting_parks_not_blocks(|flag| {
        let m = Arc::new(Mutex::new(0u32));
        let (locked_tx, locked_rx) = mpsc::channel();
        let m2 = m.clone();
        std::thread::spawn(move || {
            let g = m2.lock().unwrap();
            locked_tx.send(()).unwrap();
            let start = std::time::Instant::now();
            while !flag.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(20) {
                std::thread::sleep(ms(1));
            }
            assert!(
                flag.load(Ordering::SeqCst),
                "the other fiber never ran while one waited"
            );
            drop(g);
        });
        locked_rx.recv().unwrap();
        Box::new(move || *m.lock().unwrap() += 1)
    });
}

#[test]
fn a_fiber_waiting_on_a_thread_initialised_once_lock_or_rwlock_parks() {
    waiting_parks_not_blocks(|flag| {
        let l = Arc::new(fiber::sync::RwLock::new(0u32));
        let (locked_tx, locked_rx) = mpsc::channel();
        let l2 = l.clone();
        std::thread::spawn(move || {
            let g = l2.write().unwrap();
            locked_tx.send(()).unwrap();
            let start = std::time::Instant::now();
            while !flag.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(20) {
                std::thread::sleep(ms(1));
            }
            drop(g);
        });
        locked_rx.recv().unwrap();
        Box::new(move || assert_eq!(*l.read().unwrap(), 0))
    });
    waiting_parks_not_blocks(|flag| {
        let cell = Arc::new(fiber::sync::OnceLock::<u32>::new());
        let (started_tx, started_rx) = mpsc::channel();
        let c2 = cell.clone();
        std::thread::spawn(move || {
            c2.get_or_init(|| {
                started_tx.send(()).unwrap();
                let start = std::time::Instant::now();
                while !flag.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(20) {
                    std::thread::sleep(ms(1));
                }
                1
            });
        });
        started_rx.recv().unwrap();
        Box::new(move || assert_eq!(*cell.get_or_init(|| 2), 1))
    });
    waiting_parks_not_blocks(|flag| {
        let sem = Arc::new(Semaphore::new(0));
        let s2 = sem.clone();
        release_after(flag, move || s2.add_permits(1));
        Box::new(move || drop(sem.acquire().unwrap()))
    });
}

#[test]
fn cancel_and_join_of_the_callers_own_job_returns_cancelled_at_once() {
    // Kotlin: cancelAndJoin() on the coroutine's own job cancels it, and
    // the join then fails with CancellationException instead of waiting.
    on_runtime(|| {
        let h = fiber::spawn(|| fiber::Job::current().cancel_and_join());
        let r = h.join();
        match r {
            Ok(inner) => assert!(inner.is_err(), "{inner:?}"),
            Err(e) => assert!(e.is_cancelled()),
        }
    })
}
