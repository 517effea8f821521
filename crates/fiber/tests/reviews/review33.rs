//! Review 33: `fiber::net` against `std::net` (from fibers and from plain
//! threads), cancellation of parked net operations, and `with_timeout`
//! during a runtime's shutdown (SpawnOptions::starts_in_shutdown).
use crate::common::*;

use fiber::net::{Shutdown, TcpListener, TcpStream, UdpSocket};
use std::io::{ErrorKind, Read, Write};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (s, _) = l.accept().unwrap();
    (c, s)
}

fn is_cancelled(e: &std::io::Error) -> bool {
    e.kind() == ErrorKind::Other && e.get_ref().is_some_and(|i| i.is::<fiber::core::Cancelled>())
}

fn closed_port() -> std::net::SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let a = l.local_addr().unwrap();
    drop(l);
    a
}

/// Run `f` both on a plain thread and as a fiber.
fn both(f: fn()) {
    within(20, move || {
        std::thread::spawn(f).join().unwrap();
        rt().block_on(f);
    });
}

// ---------------------------------------------------------------- std::net

#[test]
fn connect_to_a_closed_port_is_refused() {
    both(|| {
        let e = TcpStream::connect(closed_port()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e:?}");
        let e = TcpStream::connect_timeout(&closed_port(), Duration::from_secs(5)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e:?}");
    });
}

#[test]
fn zero_durations_are_invalid_input() {
    both(|| {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap();
        let e = TcpStream::connect_timeout(&a, Duration::ZERO).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        let (c, _s) = pair();
        assert_eq!(
            c.set_read_timeout(Some(Duration::ZERO)).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
        assert_eq!(
            c.set_write_timeout(Some(Duration::ZERO)).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
        // A refused setting changes nothing.
        assert_eq!(c.read_timeout().unwrap(), None);
        let u = UdpSocket::bind("127.0.0.1:0").unwrap();
        assert_eq!(
            u.set_read_timeout(Some(Duration::ZERO)).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
        assert_eq!(
            u.set_write_timeout(Some(Duration::ZERO)).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
    });
}

#[test]
fn read_timeout_is_would_block_and_kept_setting() {
    both(|| {
        let (c, _s) = pair();
        c.set_read_timeout(Some(ms(30))).unwrap();
        let start = Instant::now();
        let e = (&c).read(&mut [0; 8]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::WouldBlock, "{e:?}");
        assert!(start.elapsed() >= ms(25), "{:?}", start.elapsed());
        // peek obeys it too
        let e = c.peek(&mut [0; 8]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::WouldBlock, "{e:?}");
        // Data after a timeout is still read in full.
        (&_s).write_all(b"xyz").unwrap();
        let mut b = [0; 3];
        (&c).read_exact(&mut b).unwrap();
        assert_eq!(&b, b"xyz");
    });
}

#[test]
fn write_timeout_is_would_block() {
    both(|| {
        let (c, _s) = pair();
        c.set_write_timeout(Some(ms(30))).unwrap();
        let chunk = vec![7u8; 64 * 1024];
        let kind = write_until_error(|| (&c).write(&chunk));
        assert_eq!(kind, ErrorKind::WouldBlock);
    });
}

#[test]
fn peek_does_not_consume_and_empty_reads_return_zero() {
    both(|| {
        let (c, s) = pair();
        // Nothing queued, a read timeout: a 0-byte read and peek wait
        // it out and return 0, as std's blocking recv of 0 bytes does.
        c.set_read_timeout(Some(ms(30))).unwrap();
        let start = Instant::now();
        assert_eq!((&c).read(&mut []).unwrap(), 0);
        assert_eq!(c.peek(&mut []).unwrap(), 0);
        assert!(start.elapsed() >= ms(50), "{:?}", start.elapsed());
        c.set_read_timeout(None).unwrap();
        (&s).write_all(b"hello").unwrap();
        let mut b = [0; 5];
        let mut got = 0;
        while got < 5 {
            got = c.peek(&mut b).unwrap();
        }
        assert_eq!(&b, b"hello");
        let mut b2 = [0; 2];
        assert_eq!(c.peek(&mut b2).unwrap(), 2);
        assert_eq!(&b2, b"he");
        assert_eq!((&c).read(&mut []).unwrap(), 0);
        let mut all = [0; 5];
        (&c).read_exact(&mut all).unwrap();
        assert_eq!(&all, b"hello");
    });
}

#[test]
fn shutdown_read_then_read_returns_zero_on_both_handles() {
    both(|| {
        let (c, s) = pair();
        let c2 = c.try_clone().unwrap();
        // A short read first, so that the drained hint is on record.
        (&s).write_all(b"ab").unwrap();
        let mut b = [0; 16];
        assert_eq!((&c2).read(&mut b).unwrap(), 2);
        c.shutdown(Shutdown::Read).unwrap();
        assert_eq!((&c).read(&mut b).unwrap(), 0);
        let start = Instant::now();
        assert_eq!((&c2).read(&mut b).unwrap(), 0, "the clone's read after shutdown(Read)");
        assert!(start.elapsed() < Duration::from_secs(1));
        drop(s);
    });
}

#[test]
fn shutdown_write_breaks_own_writes_and_gives_peer_eof() {
    both(|| {
        let (c, s) = pair();
        c.shutdown(Shutdown::Write).unwrap();
        let e = (&c).write(b"x").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::BrokenPipe, "{e:?}");
        let c2 = c.try_clone().unwrap();
        assert_eq!((&c2).write(b"x").unwrap_err().kind(), ErrorKind::BrokenPipe);
        let mut v = Vec::new();
        (&s).read_to_end(&mut v).unwrap();
        assert!(v.is_empty());
        // The other direction still works.
        (&s).write_all(b"back").unwrap();
        let mut b = [0; 4];
        (&c).read_exact(&mut b).unwrap();
        assert_eq!(&b, b"back");
        c.shutdown(Shutdown::Both).unwrap();
        assert_eq!((&c).read(&mut b).unwrap(), 0);
    });
}

#[test]
fn try_clone_shares_timeouts_and_nonblocking() {
    both(|| {
        let (c, _s) = pair();
        let c2 = c.try_clone().unwrap();
        c2.set_read_timeout(Some(ms(40))).unwrap();
        assert!(c.read_timeout().unwrap().is_some());
        let e = (&c).read(&mut [0; 4]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::WouldBlock);
        c2.set_read_timeout(None).unwrap();
        assert_eq!(c.read_timeout().unwrap(), None);
        c.set_nonblocking(true).unwrap();
        let start = Instant::now();
        assert_eq!((&c2).read(&mut [0; 4]).unwrap_err().kind(), ErrorKind::WouldBlock);
        assert!(start.elapsed() < ms(500));
        // A clone of a clone too.
        let c3 = c2.try_clone().unwrap();
        assert_eq!((&c3).read(&mut [0; 4]).unwrap_err().kind(), ErrorKind::WouldBlock);
        c3.set_nodelay(true).unwrap();
        assert!(c.nodelay().unwrap());
    });
}

#[test]
fn nonblocking_read_never_parks_on_one_worker() {
    within(20, || {
        rt1().block_on(|| {
            let (c, _s) = pair();
            c.set_nonblocking(true).unwrap();
            let ran = Arc::new(AtomicBool::new(false));
            let r = ran.clone();
            let other = fiber::spawn(move || r.store(true, Ordering::SeqCst));
            for _ in 0..100 {
                assert_eq!((&c).read(&mut [0; 4]).unwrap_err().kind(), ErrorKind::WouldBlock);
                assert_eq!(c.peek(&mut [0; 4]).unwrap_err().kind(), ErrorKind::WouldBlock);
            }
            other.join().unwrap();
            assert!(ran.load(Ordering::SeqCst));
            // Set back: a read parks until data comes.
            c.set_nonblocking(false).unwrap();
            c.set_read_timeout(Some(ms(20))).unwrap();
            assert_eq!((&c).read(&mut [0; 4]).unwrap_err().kind(), ErrorKind::WouldBlock);
        });
    });
}

#[test]
fn listener_basics() {
    both(|| {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap();
        assert_eq!(a.ip(), std::net::Ipv4Addr::LOCALHOST);
        assert_ne!(a.port(), 0);
        assert!(l.take_error().unwrap().is_none());
        l.set_ttl(77).unwrap();
        assert_eq!(l.ttl().unwrap(), 77);
        l.set_nonblocking(true).unwrap();
        assert_eq!(l.accept().unwrap_err().kind(), ErrorKind::WouldBlock);
        assert_eq!(l.incoming().next().unwrap().unwrap_err().kind(), ErrorKind::WouldBlock);
        let c = std::net::TcpStream::connect(a).unwrap();
        l.set_nonblocking(false).unwrap();
        let s = l.incoming().next().unwrap().unwrap();
        assert_eq!(s.peer_addr().unwrap(), c.local_addr().unwrap());
        // The accepted stream is blocking (accept does not inherit O_NONBLOCK).
        s.set_read_timeout(Some(ms(20))).unwrap();
        assert_eq!((&s).read(&mut [0; 1]).unwrap_err().kind(), ErrorKind::WouldBlock);
        // A listener's own ttl and a second bind to the same port.
        let e = TcpListener::bind(a).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::AddrInUse);
    });
}

#[test]
fn accepted_stream_is_blocking_even_if_listener_nonblocking() {
    both(|| {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap();
        l.set_nonblocking(true).unwrap();
        let c = std::net::TcpStream::connect(a).unwrap();
        let s = loop {
            match l.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::yield_now(),
                Err(e) => panic!("{e}"),
            }
        };
        let w = std::thread::spawn(move || {
            std::thread::sleep(ms(50));
            (&c).write_all(b"late").unwrap();
            c
        });
        let mut b = [0; 4];
        (&s).read_exact(&mut b)
            .expect("the accepted stream must block as std's");
        assert_eq!(&b, b"late");
        w.join().unwrap();
    });
}

#[test]
fn udp_basics() {
    both(|| {
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        let ba = b.local_addr().unwrap();
        assert_eq!(a.send_to(b"0123456789", ba).unwrap(), 10);
        assert_eq!(a.send_to(b"second", ba).unwrap(), 6);
        assert_eq!(a.send_to(b"", ba).unwrap(), 0);
        let mut small = [0; 4];
        let (n, from) = b.peek_from(&mut small).unwrap();
        assert_eq!((n, from), (4, a.local_addr().unwrap()));
        let (n, _) = b.recv_from(&mut small).unwrap();
        assert_eq!(n, 4);
        assert_eq!(&small, b"0123");
        // The rest of the truncated datagram is gone.
        let mut big = [0; 64];
        let (n, _) = b.recv_from(&mut big).unwrap();
        assert_eq!(&big[..n], b"second");
        let (n, _) = b.recv_from(&mut big).unwrap();
        assert_eq!(n, 0);
        b.set_broadcast(true).unwrap();
        assert!(b.broadcast().unwrap());
        b.set_broadcast(false).unwrap();
        assert!(!b.broadcast().unwrap());
        // connect: send/recv/peek with the peer only
        a.connect(ba).unwrap();
        assert_eq!(a.peer_addr().unwrap(), ba);
        a.send(b"c").unwrap();
        let mut one = [0; 8];
        assert_eq!(b.recv_from(&mut one).unwrap().0, 1);
        b.set_read_timeout(Some(ms(20))).unwrap();
        assert_eq!(b.recv_from(&mut one).unwrap_err().kind(), ErrorKind::WouldBlock);
        b.set_nonblocking(true).unwrap();
        assert_eq!(b.recv_from(&mut one).unwrap_err().kind(), ErrorKind::WouldBlock);
    });
}

#[test]
fn udp_recv_into_an_empty_buffer_consumes_the_datagram() {
    both(|| {
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        a.send_to(b"first", b.local_addr().unwrap()).unwrap();
        a.send_to(b"second", b.local_addr().unwrap()).unwrap();
        let (n, from) = b.recv_from(&mut []).unwrap();
        assert_eq!((n, from), (0, a.local_addr().unwrap()));
        let mut buf = [0; 16];
        let (n, _) = b.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"second");
    });
}

#[test]
fn dropping_the_original_does_not_disturb_a_reader_parked_on_its_clone() {
    within(20, || {
        let rt = rt();
        rt.block_on(|| {
            let (c, s) = pair();
            let c2 = c.try_clone().unwrap();
            let reader = fiber::spawn(move || {
                let mut b = [0; 5];
                (&c2).read_exact(&mut b).map(|_| b)
            });
            fiber::sleep(ms(50)).unwrap();
            drop(c);
            fiber::sleep(ms(20)).unwrap();
            (&s).write_all(b"still").unwrap();
            assert_eq!(&reader.join().unwrap().unwrap(), b"still");
        });
    });
}

#[test]
fn dropping_a_listener_clone_leaves_accepts_on_the_other() {
    within(20, || {
        rt().block_on(|| {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let a = l.local_addr().unwrap();
            let l2 = l.try_clone().unwrap();
            let acceptor = fiber::spawn(move || l2.accept().map(|(_, p)| p));
            fiber::sleep(ms(50)).unwrap();
            drop(l);
            let c = std::net::TcpStream::connect(a).unwrap();
            assert_eq!(acceptor.join().unwrap().unwrap(), c.local_addr().unwrap());
        });
    });
}

#[test]
fn shutdown_both_on_one_handle_wakes_a_reader_parked_on_a_clone() {
    within(20, || {
        let rt = rt();
        rt.block_on(|| {
            let (c, _s) = pair();
            let c2 = c.try_clone().unwrap();
            let reader = fiber::spawn(move || (&c2).read(&mut [0; 8]));
            fiber::sleep(ms(50)).unwrap();
            c.shutdown(Shutdown::Both).unwrap();
            assert_eq!(reader.join().unwrap().unwrap(), 0);
        });
    });
}

#[test]
fn plain_thread_reader_woken_by_fiber_peer() {
    within(20, || {
        let rt = rt();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            let mut v = Vec::new();
            (&s).read_to_end(&mut v).unwrap();
            v.len()
        });
        rt.block_on(move || {
            let c = TcpStream::connect(a).unwrap();
            let chunk = vec![1u8; 100_000];
            for _ in 0..10 {
                (&c).write_all(&chunk).unwrap();
            }
        });
        assert_eq!(t.join().unwrap(), 1_000_000);
    });
}

// ---------------------------------------------------------------- cancellation

#[test]
fn cancelled_accept_errors_promptly_and_loses_no_connection() {
    within(20, || {
        let rt = rt2();
        rt.block_on(|| {
            let l = Arc::new(TcpListener::bind("127.0.0.1:0").unwrap());
            let a = l.local_addr().unwrap();
            let l2 = l.clone();
            let h = fiber::spawn(move || l2.accept().map(|_| ()));
            fiber::sleep(ms(30)).unwrap();
            let start = Instant::now();
            h.cancel();
            let r = h.join();
            assert!(start.elapsed() < Duration::from_secs(1));
            match r {
                Ok(Err(e)) => assert!(is_cancelled(&e), "{e:?}"),
                Err(e) => assert!(e.is_cancelled()),
                Ok(Ok(())) => panic!("accepted a connection nobody made"),
            }
            let c = std::net::TcpStream::connect(a).unwrap();
            let (s, p) = l.accept().unwrap();
            assert_eq!(p, c.local_addr().unwrap());
            drop(s);
        });
    });
}

#[test]
fn cancelled_read_leaves_the_bytes_for_the_next_read() {
    within(20, || {
        rt2().block_on(|| {
            let (c, s) = pair();
            let c = Arc::new(c);
            let c2 = c.clone();
            let h = fiber::spawn(move || (&*c2).read(&mut [0; 16]));
            fiber::sleep(ms(30)).unwrap();
            h.cancel();
            match h.join() {
                Ok(Err(e)) => assert!(is_cancelled(&e), "{e:?}"),
                Err(e) => assert!(e.is_cancelled()),
                Ok(Ok(n)) => panic!("read {n} bytes nobody sent"),
            }
            (&s).write_all(b"kept").unwrap();
            let mut b = [0; 4];
            (&*c).read_exact(&mut b).unwrap();
            assert_eq!(&b, b"kept");
        });
    });
}

/// Readers cancelled at random moments while a writer streams a
/// numbered sequence: every byte is read exactly once, in order.
#[test]
fn racing_cancels_of_readers_neither_lose_nor_duplicate_bytes() {
    within(25, || {
        rt2().block_on(|| {
            let (c, s) = pair();
            let c = Arc::new(c);
            const N: usize = 200_000;
            let writer = std::thread::spawn(move || {
                let data: Vec<u8> = (0..N).map(|i| (i % 251) as u8).collect();
                for chunk in data.chunks(997) {
                    (&s).write_all(chunk).unwrap();
                    if chunk[0] % 3 == 0 {
                        std::thread::yield_now();
                    }
                }
                s
            });
            let mut got: Vec<u8> = Vec::with_capacity(N);
            let sink = Arc::new(std::sync::Mutex::new(Vec::new()));
            let start = Instant::now();
            let mut round = 0u64;
            while got.len() < N {
                round += 1;
                let c2 = c.clone();
                let sink2 = sink.clone();
                let h = fiber::spawn(move || {
                    let sink = sink2;
                    let mut b = vec![0; 1500];
                    loop {
                        match (&*c2).read(&mut b) {
                            Ok(0) => return None,
                            Ok(n) => sink.lock().unwrap().extend_from_slice(&b[..n]),
                            Err(e) => return Some(e),
                        }
                    }
                });
                if round % 2 == 0 {
                    fiber::yield_now().unwrap();
                } else {
                    fiber::sleep(Duration::from_micros(200)).unwrap();
                }
                h.cancel();
                match h.join() {
                    Ok(err) => {
                        if let Some(e) = err {
                            assert!(is_cancelled(&e), "{e:?}");
                        }
                    }
                    Err(e) => assert!(e.is_cancelled()),
                }
                got = std::mem::take(&mut *sink.lock().unwrap());
                assert!(
                    start.elapsed() < Duration::from_secs(15),
                    "stuck at {} of {N} bytes",
                    got.len()
                );
                sink.lock().unwrap().extend_from_slice(&got);
            }
            assert_eq!(got.len(), N);
            for (i, b) in got.iter().enumerate() {
                assert_eq!(*b, (i % 251) as u8, "byte {i} out of order");
            }
            drop(writer.join().unwrap());
        });
    });
}

/// A writer parked on a full buffer is cancelled: the peer receives
/// exactly the bytes the writer's calls reported written.
#[test]
fn cancelled_write_reports_exactly_what_went_out() {
    within(20, || {
        rt2().block_on(|| {
            let (c, s) = pair();
            let written = Arc::new(AtomicUsize::new(0));
            let w = written.clone();
            let (etx, erx) = std::sync::mpsc::channel();
            let h = fiber::spawn(move || {
                let chunk = vec![9u8; 7777];
                loop {
                    match (&c).write(&chunk) {
                        Ok(n) => {
                            w.fetch_add(n, Ordering::SeqCst);
                        }
                        Err(e) => {
                            etx.send(e).unwrap();
                            return;
                        }
                    }
                }
            });
            fiber::sleep(ms(100)).unwrap();
            let start = Instant::now();
            h.cancel();
            let _ = h.join();
            let e = erx.try_recv().unwrap();
            assert!(start.elapsed() < Duration::from_secs(1));
            assert!(is_cancelled(&e), "{e:?}");
            // `c` is dropped with the fiber: the peer reads to end of file.
            let mut total = 0;
            let mut b = vec![0; 65536];
            loop {
                match (&s).read(&mut b).unwrap() {
                    0 => break,
                    n => total += n,
                }
            }
            assert_eq!(total, written.load(Ordering::SeqCst));
        });
    });
}

#[test]
fn cancelled_recv_from_leaves_the_datagram() {
    within(20, || {
        rt2().block_on(|| {
            let u = Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
            let u2 = u.clone();
            let h = fiber::spawn(move || u2.recv_from(&mut [0; 16]).map(|(n, _)| n));
            fiber::sleep(ms(30)).unwrap();
            h.cancel();
            match h.join() {
                Ok(Err(e)) => assert!(is_cancelled(&e), "{e:?}"),
                Err(e) => assert!(e.is_cancelled()),
                Ok(Ok(n)) => panic!("received {n}"),
            }
            let s = UdpSocket::bind("127.0.0.1:0").unwrap();
            s.send_to(b"dgram", u.local_addr().unwrap()).unwrap();
            let mut b = [0; 16];
            let (n, _) = u.recv_from(&mut b).unwrap();
            assert_eq!(&b[..n], b"dgram");
        });
    });
}

#[test]
fn cancelling_a_job_ends_a_read_in_its_scope() {
    within(20, || {
        rt2().block_on(|| {
            let (c, _s) = pair();
            let start = Instant::now();
            let r = fiber::with_timeout(ms(50), || (&c).read(&mut [0; 4]));
            assert!(r.is_err(), "{r:?}");
            assert!(start.elapsed() < Duration::from_secs(2));
            // A scope whose job is cancelled.
            let r = fiber::scope(|s| {
                let h = s.spawn(|| (&c).read(&mut [0; 4]));
                fiber::sleep(ms(30)).unwrap();
                fiber::Job::current().cancel();
                h.join()
            });
            let _ = r;
            // The stream still works afterwards.
            (&_s).write_all(b"z").unwrap();
            let mut b = [0; 1];
            (&c).read_exact(&mut b).unwrap();
            assert_eq!(&b, b"z");
        });
    });
}

#[test]
fn cancelled_fiber_still_reads_data_already_there() {
    within(20, || {
        rt2().block_on(|| {
            let (c, s) = pair();
            (&s).write_all(b"ready").unwrap();
            fiber::sleep(ms(20)).unwrap();
            let h = fiber::spawn(move || {
                let mut b = [0; 5];
                let r = (&c).read(&mut b).map(|n| b[..n].to_vec());
                // Now nothing is there: the next read is cancelled.
                let r2 = (&c).read(&mut b);
                (r, r2.map_err(|e| is_cancelled(&e)))
            });
            h.cancel();
            match h.join() {
                Ok((r, r2)) => {
                    if let Ok(v) = r {
                        assert_eq!(v, b"ready");
                    }
                    assert!(!matches!(r2, Ok(n) if n > 0), "{r2:?}");
                }
                Err(e) => assert!(e.is_cancelled()),
            }
        });
    });
}

// ---------------------------------------------------------------- with_timeout in shutdown

/// Start a runtime with `grace`, run `cleanup` in a handle-spawned fiber
/// once shutdown cancels it, drop the runtime; the cleanup's result and
/// how long the drop took.
fn in_shutdown<T: Send + 'static>(
    grace: Duration,
    cleanup: impl FnOnce() -> T + Send + 'static,
) -> (Option<T>, Duration) {
    let (tx, rx) = std::sync::mpsc::channel();
    let took = within(20, move || {
        let rt = rt_fixed_grace(2, grace);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        rt.handle().spawn(move || {
            ready_tx.send(()).unwrap();
            while fiber::sleep(ms(2)).is_ok() {}
            let _ = tx.send(cleanup());
        });
        ready_rx.recv().unwrap();
        let start = Instant::now();
        drop(rt);
        start.elapsed()
    });
    (rx.try_recv().ok(), took)
}

#[test]
fn with_timeout_max_in_non_cancellable_during_shutdown_returns_the_value() {
    let (r, took) = in_shutdown(Duration::from_secs(3), || {
        fiber::non_cancellable(|| {
            fiber::with_timeout(Duration::MAX, || {
                fiber::sleep(ms(20)).unwrap();
                7
            })
        })
    });
    assert_eq!(r, Some(Ok(7)));
    assert!(took < Duration::from_secs(2), "drop took {took:?}");
}

#[test]
fn with_timeout_zero_during_shutdown_is_timed_out_at_once() {
    let (r, took) = in_shutdown(Duration::from_secs(3), || {
        let a = fiber::with_timeout(Duration::ZERO, || 1).is_err();
        let b = fiber::non_cancellable(|| fiber::with_timeout(Duration::ZERO, || 1)).is_err();
        (a, b)
    });
    assert_eq!(r, Some((true, true)));
    assert!(took < Duration::from_secs(2), "drop took {took:?}");
}

#[test]
fn nested_with_timeouts_in_non_cancellable_during_shutdown() {
    let (r, took) = in_shutdown(Duration::from_secs(4), || {
        fiber::non_cancellable(|| {
            let start = Instant::now();
            let inner_first = fiber::with_timeout(Duration::from_secs(10), || {
                fiber::with_timeout(ms(50), || fiber::sleep(Duration::from_secs(30)))
            });
            let t1 = start.elapsed();
            let start = Instant::now();
            let outer_first = fiber::with_timeout(ms(50), || {
                fiber::with_timeout(Duration::from_secs(10), || fiber::sleep(Duration::from_secs(30)))
            });
            let t2 = start.elapsed();
            (matches!(inner_first, Ok(Err(_))), outer_first.is_err(), t1, t2)
        })
    });
    let (a, b, t1, t2) = r.expect("the clean-up never finished");
    assert!(a, "the inner 50 ms timeout did not fire as the inner's");
    assert!(b, "the outer 50 ms timeout did not fire");
    assert!(t1 < Duration::from_secs(1), "{t1:?}");
    assert!(t2 < Duration::from_secs(1), "{t2:?}");
    assert!(took < Duration::from_secs(3), "drop took {took:?}");
}

#[test]
fn with_timeout_outside_non_cancellable_during_shutdown_does_not_hang() {
    let (r, took) = in_shutdown(Duration::from_secs(3), || {
        let start = Instant::now();
        let r = fiber::with_timeout(Duration::from_secs(10), || fiber::sleep(Duration::from_secs(30)));
        (r.map(|s| s.is_err()), start.elapsed())
    });
    let (r, elapsed) = r.expect("never finished");
    // The fiber is cancelled: the body's sleep is cancelled at once.
    assert_eq!(r, Ok(true));
    assert!(elapsed < Duration::from_secs(1), "{elapsed:?}");
    assert!(took < Duration::from_secs(2), "drop took {took:?}");
}

#[test]
fn a_stuck_body_of_with_timeout_max_in_non_cancellable_does_not_hang_the_drop() {
    in_child(
        "a_stuck_body_of_with_timeout_max_in_non_cancellable_does_not_hang_the_drop",
        20,
        || {
            let (_r, took) = in_shutdown(ms(300), || {
                fiber::non_cancellable(|| fiber::with_timeout(Duration::MAX, stubborn_sleep))
            });
            assert!(took < Duration::from_secs(5), "drop took {took:?}");
        },
    );
}

#[test]
fn a_long_with_timeout_opened_before_shutdown_does_not_hang_the_drop() {
    in_child(
        "a_long_with_timeout_opened_before_shutdown_does_not_hang_the_drop",
        20,
        || {
            within(15, || {
                let rt = rt_fixed_grace(2, ms(300));
                let (ready_tx, ready_rx) = std::sync::mpsc::channel();
                rt.handle().spawn(move || {
                    fiber::non_cancellable(|| {
                        fiber::with_timeout(Duration::from_secs(60), || {
                            ready_tx.send(()).unwrap();
                            let _ = fiber::sleep(Duration::from_secs(60));
                        })
                    })
                });
                ready_rx.recv().unwrap();
                let start = Instant::now();
                drop(rt);
                assert!(
                    start.elapsed() < Duration::from_secs(5),
                    "drop took {:?}",
                    start.elapsed()
                );
            });
        },
    );
}

struct TimeoutInDrop(std::sync::mpsc::Sender<bool>);
impl Drop for TimeoutInDrop {
    fn drop(&mut self) {
        let r = fiber::non_cancellable(|| fiber::with_timeout(ms(50), || fiber::sleep(Duration::from_secs(30))));
        let _ = self.0.send(r.is_err());
    }
}

/// A destructor that runs in teardown (a fiber that ignored the
/// cancellation is unwound) opens a `with_timeout`: no hang, no abort.
#[test]
fn with_timeout_in_a_destructor_run_by_teardown() {
    in_child("with_timeout_in_a_destructor_run_by_teardown", 20, || {
        within(15, || {
            let rt = rt_fixed_grace(2, ms(200));
            let (tx, rx) = std::sync::mpsc::channel();
            let (ready_tx, ready_rx) = std::sync::mpsc::channel();
            rt.handle().spawn(move || {
                let _g = TimeoutInDrop(tx);
                ready_tx.send(()).unwrap();
                stubborn_sleep();
            });
            ready_rx.recv().unwrap();
            let start = Instant::now();
            drop(rt);
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "drop took {:?}",
                start.elapsed()
            );
            // The destructor ran (whatever its outcome).
            assert!(
                rx.recv_timeout(Duration::from_secs(2)).is_ok(),
                "the destructor never finished"
            );
        });
    });
}

#[test]
fn many_with_timeouts_in_non_cancellable_all_fire_in_the_grace() {
    let (tx, rx) = std::sync::mpsc::channel();
    let took = within(20, move || {
        let rt = rt_fixed_grace(2, Duration::from_secs(4));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        for _ in 0..50 {
            let (tx, ready_tx) = (tx.clone(), ready_tx.clone());
            rt.handle().spawn(move || {
                ready_tx.send(()).unwrap();
                while fiber::sleep(ms(2)).is_ok() {}
                let r =
                    fiber::non_cancellable(|| fiber::with_timeout(ms(30), || fiber::sleep(Duration::from_secs(30))));
                let _ = tx.send(r.is_err());
            });
        }
        for _ in 0..50 {
            ready_rx.recv().unwrap();
        }
        let start = Instant::now();
        drop(rt);
        start.elapsed()
    });
    let fired = rx.try_iter().filter(|t| *t).count();
    assert_eq!(fired, 50);
    assert!(took < Duration::from_secs(3), "drop took {took:?}");
}

/// A net read bounded by a `with_timeout` in clean-up code during the
/// shutdown grace.
#[test]
fn with_timeout_bounds_a_socket_read_during_shutdown() {
    let (r, took) = in_shutdown(Duration::from_secs(3), || {
        let (c, _s) = fiber::non_cancellable(pair);
        let start = Instant::now();
        let r = fiber::non_cancellable(|| fiber::with_timeout(ms(50), || (&c).read(&mut [0; 4])));
        (r.is_err(), start.elapsed())
    });
    let (timed_out, elapsed) = r.expect("never finished");
    assert!(timed_out);
    assert!(elapsed < Duration::from_secs(1), "{elapsed:?}");
    assert!(took < Duration::from_secs(2), "drop took {took:?}");
}

// ---------------------------------------------------------------- batch 2

/// The outcome of an operation, comparable across std and fiber.
fn kind_of(r: std::io::Result<usize>) -> Result<usize, ErrorKind> {
    r.map_err(|e| e.kind())
}

/// Empty-buffer reads on a connection with nothing queued and a 30 ms read
/// timeout: fiber's stream gives what std's gives, on a plain thread and
/// in a fiber (Linux: a blocking recv of 0 bytes waits the timeout out
/// and returns 0; `read_vectored` is `readv`, the same receive).
#[test]
fn empty_buffer_reads_with_a_timeout_match_std() {
    both(|| {
        use std::io::IoSliceMut;
        let sl = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let sc = std::net::TcpStream::connect(sl.local_addr().unwrap()).unwrap();
        let _ss = sl.accept().unwrap();
        let (fc, _fs) = pair();
        sc.set_read_timeout(Some(ms(30))).unwrap();
        fc.set_read_timeout(Some(ms(30))).unwrap();
        let std_read = kind_of((&sc).read(&mut []));
        let fib_read = kind_of((&fc).read(&mut []));
        assert_eq!(fib_read, std_read, "read(&mut [])");
        let std_peek = kind_of(sc.peek(&mut []));
        let fib_peek = kind_of(fc.peek(&mut []));
        assert_eq!(fib_peek, std_peek, "peek(&mut [])");
        let std_v0 = kind_of((&sc).read_vectored(&mut []));
        let fib_v0 = kind_of((&fc).read_vectored(&mut []));
        assert_eq!(fib_v0, std_v0, "read_vectored(&mut [])");
        let (mut a, mut b) = ([0u8; 0], [0u8; 0]);
        let std_v1 = kind_of((&sc).read_vectored(&mut [IoSliceMut::new(&mut a)]));
        let fib_v1 = kind_of((&fc).read_vectored(&mut [IoSliceMut::new(&mut b)]));
        assert_eq!(fib_v1, std_v1, "read_vectored(&mut [empty slice])");
    });
}

#[test]
fn connect_timeout_with_duration_max() {
    both(|| {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap();
        let c = TcpStream::connect_timeout(&a, Duration::MAX).unwrap();
        assert_eq!(c.peer_addr().unwrap(), a);
        let e = TcpStream::connect_timeout(&closed_port(), Duration::MAX).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ConnectionRefused);
        // A timeout with sub-millisecond precision still connects on loopback.
        let c = TcpStream::connect_timeout(&a, Duration::from_secs(1) + Duration::from_nanos(1)).unwrap();
        drop(c);
    });
}

/// A connected UDP socket whose peer port is closed: the ICMP error ends
/// a blocking `recv` with `ConnectionRefused` (std on Linux).
#[test]
fn udp_recv_after_icmp_refusal_matches_std() {
    both(|| {
        let dead = {
            let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            s.local_addr().unwrap()
        };
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        s.connect(dead).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        s.send(b"x").unwrap();
        let std_r = s.recv(&mut [0; 8]).map_err(|e| e.kind());
        let f = UdpSocket::bind("127.0.0.1:0").unwrap();
        f.connect(dead).unwrap();
        f.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        f.send(b"x").unwrap();
        let start = Instant::now();
        let fib_r = f.recv(&mut [0; 8]).map_err(|e| e.kind());
        assert_eq!(fib_r, std_r);
        assert!(start.elapsed() < Duration::from_secs(1), "{:?}", start.elapsed());
    });
}

/// The peer resets the connection while a reader is parked: the read
/// ends with `ConnectionReset` as std's.
#[test]
fn reset_by_peer_wakes_a_parked_reader() {
    within(20, || {
        rt2().block_on(|| {
            let (c, s) = pair();
            let c = Arc::new(c);
            let c2 = c.clone();
            let reader = fiber::spawn(move || (&*c2).read(&mut [0; 8]).map_err(|e| e.kind()));
            fiber::sleep(ms(50)).unwrap();
            use std::os::fd::AsRawFd;
            crate::common::sockets::reset_on_close(s.as_raw_fd());
            drop(s);
            assert_eq!(reader.join().unwrap(), Err(ErrorKind::ConnectionReset));
        });
    });
}

/// Cleanup entered before shutdown: `non_cancellable(with_timeout(..))`
/// whose body sleeps across the start of the shutdown: shutdown's cancel
/// is held off for the body too, and the with_timeout returns the value.
#[test]
fn with_timeout_in_non_cancellable_spanning_the_start_of_shutdown() {
    let (tx, rx) = std::sync::mpsc::channel();
    let took = within(20, move || {
        let rt = rt_fixed_grace(2, Duration::from_secs(3));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        rt.handle().spawn(move || {
            let r = fiber::non_cancellable(|| {
                fiber::with_timeout(Duration::from_secs(5), || {
                    ready_tx.send(()).unwrap();
                    let slept = fiber::sleep(ms(200));
                    (slept.is_ok(), fiber::is_cancelled())
                })
            });
            let _ = tx.send(r.map_err(|_| ()));
        });
        ready_rx.recv().unwrap();
        let start = Instant::now();
        drop(rt);
        start.elapsed()
    });
    let r = rx.try_recv().expect("never finished");
    assert_eq!(r, Ok((true, false)));
    assert!(took < Duration::from_secs(2), "{took:?}");
}

/// A zero shutdown grace: `non_cancellable(with_timeout(..))` in clean-up
/// must neither hang the drop nor abort.
#[test]
fn with_timeout_during_a_zero_grace_shutdown() {
    in_child("with_timeout_during_a_zero_grace_shutdown", 20, || {
        within(15, || {
            let rt = rt_fixed_grace(2, Duration::ZERO);
            let (ready_tx, ready_rx) = std::sync::mpsc::channel();
            for _ in 0..8 {
                let ready_tx = ready_tx.clone();
                rt.handle().spawn(move || {
                    ready_tx.send(()).unwrap();
                    while fiber::sleep(ms(1)).is_ok() {}
                    let _ = fiber::non_cancellable(|| {
                        fiber::with_timeout(ms(20), || fiber::sleep(Duration::from_secs(30)))
                    });
                    let _ = fiber::non_cancellable(|| fiber::with_timeout(Duration::MAX, || 1));
                });
            }
            for _ in 0..8 {
                ready_rx.recv().unwrap();
            }
            let start = Instant::now();
            drop(rt);
            assert!(start.elapsed() < Duration::from_secs(5), "{:?}", start.elapsed());
        });
    });
}

/// Accept and a plain thread: a listener accept parked in a fiber is
/// woken by a connection a plain thread makes, and a plain thread
/// blocked in `accept` is woken by a fiber's connect.
#[test]
fn cross_accepts_between_fibers_and_threads() {
    within(20, || {
        let rt = rt();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap();
        let t = std::thread::spawn(move || l.accept().map(|(s, _)| s.peer_addr().unwrap()));
        let local = rt.block_on(move || {
            fiber::sleep(ms(30)).unwrap();
            let c = TcpStream::connect(a).unwrap();
            c.local_addr().unwrap()
        });
        assert_eq!(t.join().unwrap().unwrap(), local);
    });
}

/// A reader parked on one fiber, a writer on another, both on the same
/// `&TcpStream`, full duplex with a plain thread echoing: no deadlock.
#[test]
fn full_duplex_on_one_shared_stream() {
    within(20, || {
        rt2().block_on(|| {
            let (c, s) = pair();
            let echo = std::thread::spawn(move || {
                let mut b = vec![0; 8192];
                let mut total = 0;
                loop {
                    let n = (&s).read(&mut b).unwrap();
                    if n == 0 {
                        return total;
                    }
                    total += n;
                    (&s).write_all(&b[..n]).unwrap();
                }
            });
            let c = Arc::new(c);
            let cw = c.clone();
            const N: usize = 2_000_000;
            let writer = fiber::spawn(move || {
                let chunk = vec![3u8; 50_000];
                for _ in 0..N / 50_000 {
                    (&*cw).write_all(&chunk).unwrap();
                }
                cw.shutdown(Shutdown::Write).unwrap();
            });
            let mut v = Vec::new();
            (&*c).read_to_end(&mut v).unwrap();
            writer.join().unwrap();
            assert_eq!(v.len(), N);
            assert_eq!(echo.join().unwrap(), N);
        });
    });
}

// ---------------------------------------------------------------- batch 3

/// Timeout getters after odd settings read back what std's read back.
#[test]
fn timeout_getters_match_std_for_odd_durations() {
    both(|| {
        let sl = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let sc = std::net::TcpStream::connect(sl.local_addr().unwrap()).unwrap();
        let (fc, _fs) = pair();
        let su = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let fu = UdpSocket::bind("127.0.0.1:0").unwrap();
        for d in [
            Duration::from_nanos(1),
            Duration::from_micros(1500),
            Duration::new(1, 999_999_999),
            Duration::from_secs(1 << 40),
            Duration::from_secs(u64::MAX),
            Duration::MAX,
        ] {
            sc.set_read_timeout(Some(d)).unwrap();
            fc.set_read_timeout(Some(d)).unwrap();
            assert_eq!(fc.read_timeout().unwrap(), sc.read_timeout().unwrap(), "read {d:?}");
            sc.set_write_timeout(Some(d)).unwrap();
            fc.set_write_timeout(Some(d)).unwrap();
            assert_eq!(fc.write_timeout().unwrap(), sc.write_timeout().unwrap(), "write {d:?}");
            su.set_read_timeout(Some(d)).unwrap();
            fu.set_read_timeout(Some(d)).unwrap();
            assert_eq!(fu.read_timeout().unwrap(), su.read_timeout().unwrap(), "udp read {d:?}");
        }
    });
}

#[test]
fn connect_timeout_to_a_full_listener_times_out_as_std() {
    both(|| {
        let (l, _filled) = crate::common::sockets::full_listener();
        let a = l.local_addr().unwrap();
        let start = Instant::now();
        let e = TcpStream::connect_timeout(&a, ms(150)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::TimedOut, "{e:?}");
        let took = start.elapsed();
        assert!(took >= ms(140) && took < Duration::from_secs(2), "{took:?}");
    });
}

#[test]
fn cancelled_connect_errors_promptly() {
    within(20, || {
        rt2().block_on(|| {
            let (l, _filled) = crate::common::sockets::full_listener();
            let a = l.local_addr().unwrap();
            let h = fiber::spawn(move || TcpStream::connect(a).map(|_| ()));
            fiber::sleep(ms(50)).unwrap();
            let start = Instant::now();
            h.cancel();
            let r = h.join();
            assert!(start.elapsed() < Duration::from_secs(1), "{:?}", start.elapsed());
            match r {
                Ok(Err(e)) => assert!(is_cancelled(&e), "{e:?}"),
                Err(e) => assert!(e.is_cancelled()),
                Ok(Ok(())) => panic!("connected to a full listener"),
            }
            // with_timeout bounds a connect too.
            let start = Instant::now();
            let r = fiber::with_timeout(ms(100), || TcpStream::connect(a).map(|_| ()));
            assert!(r.is_err(), "{r:?}");
            assert!(start.elapsed() < Duration::from_secs(1), "{:?}", start.elapsed());
        });
    });
}

/// Sockets made in a runtime that is gone: plain threads still park and
/// wake on them (the driver is process-wide), and a new runtime's fibers
/// too.
#[test]
fn sockets_outlive_the_runtime_that_made_them() {
    within(20, || {
        let (c, s) = rt().block_on(pair);
        let writer = std::thread::spawn(move || {
            std::thread::sleep(ms(50));
            (&s).write_all(b"one").unwrap();
            std::thread::sleep(ms(50));
            (&s).write_all(b"two").unwrap();
            s
        });
        let mut b = [0; 3];
        (&c).read_exact(&mut b).unwrap();
        assert_eq!(&b, b"one");
        let c = rt().block_on(move || {
            let mut b = [0; 3];
            (&c).read_exact(&mut b).unwrap();
            assert_eq!(&b, b"two");
            c
        });
        drop(writer.join().unwrap());
        let mut rest = Vec::new();
        (&c).read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty());
    });
}

/// A panic in a `with_timeout` body during the shutdown grace (in
/// `non_cancellable`) reaches the caller with its message, and the
/// drop still returns promptly.
#[test]
fn panicking_with_timeout_body_during_shutdown() {
    let (r, took) = in_shutdown(Duration::from_secs(3), || {
        panic_message(|| {
            let _ = fiber::non_cancellable(|| fiber::with_timeout(Duration::from_secs(5), || panic!("boom 33")));
        })
    });
    assert_eq!(r, Some(Some("boom 33".to_string())));
    assert!(took < Duration::from_secs(2), "{took:?}");
}

/// Explicit `Runtime::shutdown_timeout` with clean-up using with_timeout.
#[test]
fn explicit_shutdown_timeout_with_a_cleanup_timeout() {
    let (tx, rx) = std::sync::mpsc::channel();
    within(20, move || {
        let rt = rt_fixed_grace(2, Duration::from_secs(30));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        rt.handle().spawn(move || {
            ready_tx.send(()).unwrap();
            while fiber::sleep(ms(2)).is_ok() {}
            let start = Instant::now();
            let r = fiber::non_cancellable(|| fiber::with_timeout(ms(50), || fiber::sleep(Duration::from_secs(60))));
            let _ = tx.send((r.is_err(), start.elapsed()));
        });
        ready_rx.recv().unwrap();
        let start = Instant::now();
        rt.shutdown_timeout(Duration::from_secs(3));
        assert!(start.elapsed() < Duration::from_secs(2), "{:?}", start.elapsed());
    });
    let (timed_out, elapsed) = rx.try_recv().expect("never finished");
    assert!(timed_out);
    assert!(elapsed < Duration::from_secs(1), "{elapsed:?}");
}

/// Plain threads only: a thread blocked reading a clone wakes with 0 when
/// another thread shuts the connection down for reading, and one blocked
/// in a clone's read is not disturbed when the original is dropped.
#[test]
fn plain_threads_shutdown_and_drop_around_a_blocked_reader() {
    within(20, || {
        let (c, s) = pair();
        let c2 = c.try_clone().unwrap();
        let reader = std::thread::spawn(move || (&c2).read(&mut [0; 8]).map_err(|e| e.kind()));
        std::thread::sleep(ms(50));
        c.shutdown(Shutdown::Read).unwrap();
        assert_eq!(reader.join().unwrap(), Ok(0));
        drop(s);
        let (c, s) = pair();
        let c2 = c.try_clone().unwrap();
        let reader = std::thread::spawn(move || {
            let mut b = [0; 4];
            (&c2).read_exact(&mut b).map(|_| b).map_err(|e| e.kind())
        });
        std::thread::sleep(ms(50));
        drop(c);
        std::thread::sleep(ms(20));
        (&s).write_all(b"live").unwrap();
        assert_eq!(reader.join().unwrap(), Ok(*b"live"));
    });
}

/// Fill `c`'s send path until a write would block (non-blocking probe),
/// then set it back to blocking.
fn fill(c: &TcpStream) {
    c.set_nonblocking(true).unwrap();
    let chunk = vec![5u8; 65536];
    loop {
        match (&*c).write(&chunk) {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) => panic!("{e}"),
        }
    }
    c.set_nonblocking(false).unwrap();
}

/// A write parked on a full buffer, then the connection's write side is
/// shut down through another handle: the write fails with `BrokenPipe`
/// at once (Linux wakes a blocked send on `shutdown(SHUT_WR)`).
#[test]
fn shutdown_write_through_a_clone_ends_a_parked_write() {
    type Waiter = Box<dyn FnOnce() -> Result<(), ErrorKind> + Send>;
    fn scenario(spawn_writer: &dyn Fn(Arc<TcpStream>) -> Waiter) {
        let (c, _s) = pair();
        fill(&c);
        let c = Arc::new(c);
        let clone = c.try_clone().unwrap();
        let wait = spawn_writer(c);
        std::thread::sleep(ms(80));
        let start = Instant::now();
        clone.shutdown(Shutdown::Write).unwrap();
        assert_eq!(wait(), Err(ErrorKind::BrokenPipe));
        assert!(start.elapsed() < Duration::from_secs(2), "{:?}", start.elapsed());
    }
    within(20, || {
        // A plain thread.
        scenario(&|c| {
            let t = std::thread::spawn(move || (&*c).write_all(&[1; 1000]).map_err(|e| e.kind()));
            Box::new(move || t.join().unwrap())
        });
        // A fiber.
        let rt = rt2();
        let handle = rt.handle();
        scenario(&|c| {
            let j = handle.spawn(move || (&*c).write_all(&[1; 1000]).map_err(|e| e.kind()));
            Box::new(move || j.join().unwrap())
        });
        drop(rt);
    });
}

/// A write parked on a full buffer when the peer closes with unread data
/// (a reset): the write fails promptly, as std's blocked send does.
#[test]
fn peer_reset_ends_a_parked_write() {
    within(20, || {
        rt2().block_on(|| {
            let (c, s) = pair();
            fill(&c);
            let c = Arc::new(c);
            let c2 = c.clone();
            let w = fiber::spawn(move || (&*c2).write_all(&[1; 100_000]).map_err(|e| e.kind()));
            fiber::sleep(ms(80)).unwrap();
            let start = Instant::now();
            drop(s); // unread data: the kernel sends RST
            let r = w.join().unwrap();
            assert!(
                matches!(r, Err(ErrorKind::ConnectionReset) | Err(ErrorKind::BrokenPipe)),
                "{r:?}"
            );
            assert!(start.elapsed() < Duration::from_secs(2), "{:?}", start.elapsed());
        });
    });
}

/// Clean-up during the shutdown grace reads a reply in `non_cancellable`:
/// the shutdown's cancel is held off, and the read gets the bytes.
#[test]
fn non_cancellable_read_during_shutdown_gets_its_data() {
    let (r, took) = in_shutdown(Duration::from_secs(3), || {
        let (c, s) = fiber::non_cancellable(pair);
        let t = std::thread::spawn(move || {
            std::thread::sleep(ms(100));
            (&s).write_all(b"bye!").unwrap();
            s
        });
        let r = fiber::non_cancellable(|| {
            let mut b = [0; 4];
            (&c).read_exact(&mut b).map(|_| b).map_err(|e| e.kind())
        });
        drop(t.join().unwrap());
        r
    });
    assert_eq!(r, Some(Ok(*b"bye!")));
    assert!(took < Duration::from_secs(2), "{took:?}");
}

/// A read parked in `non_cancellable` for ever: teardown ends it and the
/// drop returns soon after the grace.
#[test]
fn non_cancellable_read_for_ever_does_not_hang_the_drop() {
    in_child("non_cancellable_read_for_ever_does_not_hang_the_drop", 20, || {
        let (_r, took) = in_shutdown(ms(300), || {
            let (c, _s) = fiber::non_cancellable(pair);
            fiber::non_cancellable(|| {
                let _ = (&c).read(&mut [0; 4]);
            });
        });
        assert!(took < Duration::from_secs(5), "{took:?}");
    });
}

/// Every way a socket wait ends leaves the process-wide waiter count
/// balanced: data, timeout, cancel, non-blocking, teardown.
#[test]
fn io_waiters_balance_after_every_kind_of_ending() {
    in_child("io_waiters_balance_after_every_kind_of_ending", 20, || {
        within(15, || {
            let rt = rt2();
            rt.block_on(|| {
                let (c, s) = pair();
                let c = Arc::new(c);
                // cancelled
                let hs: Vec<_> = (0..20)
                    .map(|_| {
                        let c = c.clone();
                        fiber::spawn(move || (&*c).read(&mut [0; 4]).map(|_| ()))
                    })
                    .collect();
                fiber::sleep(ms(50)).unwrap();
                cancel_from_the_back(hs);
                // timed out
                c.set_read_timeout(Some(ms(10))).unwrap();
                assert!((&*c).read(&mut [0; 4]).is_err());
                c.set_read_timeout(None).unwrap();
                // data
                let c2 = c.clone();
                let h = fiber::spawn(move || (&*c2).read(&mut [0; 4]).unwrap());
                fiber::sleep(ms(30)).unwrap();
                (&s).write_all(b"d").unwrap();
                assert_eq!(h.join().unwrap(), 1);
                // with_timeout
                assert!(fiber::with_timeout(ms(20), || (&*c).read(&mut [0; 4])).is_err());
                // a UDP receive cancelled
                let u = Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
                let u2 = u.clone();
                let h = fiber::spawn(move || u2.recv_from(&mut [0; 4]).map(|_| ()));
                fiber::sleep(ms(30)).unwrap();
                h.cancel();
                let _ = h.join();
            });
            // teardown of a read parked for ever
            let (ready_tx, ready_rx) = std::sync::mpsc::channel();
            rt.handle().spawn(move || {
                let (c, _s) = pair();
                ready_tx.send(()).unwrap();
                fiber::non_cancellable(|| {
                    let _ = (&c).read(&mut [0; 4]);
                });
            });
            ready_rx.recv().unwrap();
            wait_parked(&rt, 1);
            drop(rt);
            assert_eq!(fiber::net::io_waiters(), 0);
        });
    });
}

/// Receivers cancelled at random moments while datagrams are queued:
/// every datagram is received exactly once, in order.
#[test]
fn racing_cancels_of_udp_receivers_neither_lose_nor_duplicate() {
    within(25, || {
        rt2().block_on(|| {
            let u = Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
            let to = u.local_addr().unwrap();
            const N: u32 = 150;
            let sender = std::thread::spawn(move || {
                let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
                for i in 0..N {
                    s.send_to(&i.to_le_bytes(), to).unwrap();
                    if i % 7 == 0 {
                        std::thread::sleep(Duration::from_micros(300));
                    }
                }
            });
            let sink = Arc::new(std::sync::Mutex::new(Vec::new()));
            let start = Instant::now();
            let mut round = 0u64;
            while sink.lock().unwrap().len() < N as usize {
                round += 1;
                let (u2, sink2) = (u.clone(), sink.clone());
                let h = fiber::spawn(move || loop {
                    let mut b = [0; 8];
                    match u2.recv_from(&mut b) {
                        Ok((4, _)) => sink2.lock().unwrap().push(u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
                        Ok((n, _)) => panic!("a datagram of {n} bytes"),
                        Err(e) => return e,
                    }
                });
                if round % 2 == 0 {
                    fiber::yield_now().unwrap();
                } else {
                    fiber::sleep(Duration::from_micros(300)).unwrap();
                }
                h.cancel();
                if let Ok(e) = h.join() {
                    assert!(is_cancelled(&e), "{e:?}");
                }
                assert!(
                    start.elapsed() < Duration::from_secs(15),
                    "stuck at {} of {N} datagrams",
                    sink.lock().unwrap().len()
                );
            }
            sender.join().unwrap();
            let got = sink.lock().unwrap().clone();
            assert_eq!(got, (0..N).collect::<Vec<_>>());
        });
    });
}

/// Acceptors cancelled at random moments while connections come in:
/// every connection is accepted exactly once.
#[test]
fn racing_cancels_of_acceptors_neither_lose_nor_duplicate() {
    within(25, || {
        rt2().block_on(|| {
            let l = Arc::new(TcpListener::bind("127.0.0.1:0").unwrap());
            let a = l.local_addr().unwrap();
            const N: usize = 60;
            let connector = std::thread::spawn(move || {
                (0..N)
                    .map(|i| {
                        if i % 5 == 0 {
                            std::thread::sleep(Duration::from_micros(500));
                        }
                        std::net::TcpStream::connect(a).unwrap()
                    })
                    .collect::<Vec<_>>()
            });
            let sink = Arc::new(std::sync::Mutex::new(Vec::new()));
            let start = Instant::now();
            let mut round = 0u64;
            while sink.lock().unwrap().len() < N {
                round += 1;
                let (l2, sink2) = (l.clone(), sink.clone());
                let h = fiber::spawn(move || loop {
                    match l2.accept() {
                        Ok((s, p)) => sink2.lock().unwrap().push((p, s)),
                        Err(e) => return e,
                    }
                });
                if round % 2 == 0 {
                    fiber::yield_now().unwrap();
                } else {
                    fiber::sleep(Duration::from_micros(300)).unwrap();
                }
                h.cancel();
                if let Ok(e) = h.join() {
                    assert!(is_cancelled(&e), "{e:?}");
                }
                assert!(
                    start.elapsed() < Duration::from_secs(15),
                    "stuck at {} of {N} connections",
                    sink.lock().unwrap().len()
                );
            }
            let clients = connector.join().unwrap();
            let mut peers: Vec<_> = sink.lock().unwrap().iter().map(|(p, _)| *p).collect();
            let mut locals: Vec<_> = clients.iter().map(|c| c.local_addr().unwrap()).collect();
            peers.sort();
            locals.sort();
            assert_eq!(peers, locals);
        });
    });
}

/// A socket read inside `fiber::blocking` runs on a pool thread as on a
/// plain thread: it waits for the data (a cancel of the calling fiber
/// does not reach into it: the blocking call is not cancellable), and
/// its read timeout is `WouldBlock`.
#[test]
fn socket_reads_inside_blocking_behave_as_on_a_plain_thread() {
    within(20, || {
        rt2().block_on(|| {
            let (c, s) = pair();
            let c = Arc::new(c);
            let c2 = c.clone();
            let h = fiber::spawn(move || {
                fiber::blocking(|| {
                    let mut b = [0; 4];
                    (&*c2).read_exact(&mut b).map(|_| b).map_err(|e| e.kind())
                })
            });
            fiber::sleep(ms(50)).unwrap();
            h.cancel();
            fiber::sleep(ms(50)).unwrap();
            (&s).write_all(b"pool").unwrap();
            // The fiber's value is dropped (it was cancelled) but the
            // bytes went to the blocking read, not back to the socket.
            let _ = h.join();
            c.set_read_timeout(Some(ms(50))).unwrap();
            let r = fiber::blocking(|| (&*c).read(&mut [0; 4]).map_err(|e| e.kind()));
            assert_eq!(r, Err(ErrorKind::WouldBlock));
        });
    });
}

/// std: options set on one handle of a `try_clone` pair apply to both
/// (UDP timeouts and non-blocking mode, a listener's non-blocking mode),
/// including after the original is gone.
#[test]
fn udp_and_listener_clones_share_settings() {
    both(|| {
        let u = UdpSocket::bind("127.0.0.1:0").unwrap();
        u.set_read_timeout(Some(ms(30))).unwrap();
        let u2 = u.try_clone().unwrap();
        assert!(u2.read_timeout().unwrap().is_some());
        assert_eq!(u2.recv_from(&mut [0; 4]).unwrap_err().kind(), ErrorKind::WouldBlock);
        u2.set_nonblocking(true).unwrap();
        drop(u);
        let u3 = u2.try_clone().unwrap();
        u2.set_read_timeout(None).unwrap();
        drop(u2);
        assert_eq!(u3.read_timeout().unwrap(), None);
        let start = Instant::now();
        assert_eq!(u3.recv_from(&mut [0; 4]).unwrap_err().kind(), ErrorKind::WouldBlock);
        assert!(start.elapsed() < ms(25));

        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let l2 = l.try_clone().unwrap();
        l2.set_nonblocking(true).unwrap();
        assert_eq!(l.accept().unwrap_err().kind(), ErrorKind::WouldBlock);
        l.set_nonblocking(false).unwrap();
        let a = l.local_addr().unwrap();
        let c = std::net::TcpStream::connect(a).unwrap();
        let (_s, p) = l2.accept().unwrap();
        assert_eq!(p, c.local_addr().unwrap());
    });
}

/// Huge but representable timeouts (the deadline fits an `Instant`) are
/// long waits, never early expiries: a socket read timeout of 2^40 s,
/// `connect_timeout` and `with_timeout` of 2^62 s, from fibers and threads.
#[test]
fn huge_representable_timeouts_do_not_expire_early() {
    both(|| {
        let (c, s) = pair();
        c.set_read_timeout(Some(Duration::from_secs(1 << 40))).unwrap();
        c.set_write_timeout(Some(Duration::from_secs(1 << 40))).unwrap();
        let t = std::thread::spawn(move || {
            std::thread::sleep(ms(60));
            (&s).write_all(b"late").unwrap();
            s
        });
        let mut b = [0; 4];
        (&c).read_exact(&mut b).unwrap();
        assert_eq!(&b, b"late");
        drop(t.join().unwrap());
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap();
        TcpStream::connect_timeout(&a, Duration::from_secs(1 << 62)).unwrap();
        let u = UdpSocket::bind("127.0.0.1:0").unwrap();
        u.set_read_timeout(Some(Duration::from_secs(1 << 40))).unwrap();
        let to = u.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            std::thread::sleep(ms(60));
            std::net::UdpSocket::bind("127.0.0.1:0")
                .unwrap()
                .send_to(b"u", to)
                .unwrap();
        });
        assert_eq!(u.recv_from(&mut [0; 4]).unwrap().0, 1);
        t.join().unwrap();
    });
    within(20, || {
        rt().block_on(|| {
            let r = fiber::with_timeout(Duration::from_secs(1 << 62), || fiber::sleep(ms(60)));
            assert_eq!(r.map(|s| s.is_ok()), Ok(true));
            let r =
                fiber::non_cancellable(|| fiber::with_timeout(Duration::from_secs(1 << 62), || fiber::sleep(ms(60))));
            assert_eq!(r.map(|s| s.is_ok()), Ok(true));
        });
    });
}

static NB: std::sync::OnceLock<(TcpStream, TcpStream, TcpListener, UdpSocket)> = std::sync::OnceLock::new();
static EOF_PAIR: std::sync::OnceLock<TcpStream> = std::sync::OnceLock::new();

fn nb() -> &'static (TcpStream, TcpStream, TcpListener, UdpSocket) {
    NB.get_or_init(|| {
        let (c, s) = pair();
        c.set_nonblocking(true).unwrap();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let u = UdpSocket::bind("127.0.0.1:0").unwrap();
        u.set_nonblocking(true).unwrap();
        (c, s, l, u)
    })
}

fn eof() -> &'static TcpStream {
    EOF_PAIR.get_or_init(|| {
        let (c, s) = pair();
        drop(s);
        c
    })
}

/// A loop polling this on one worker lets another fiber run.
#[test]
fn polling_loop_lets_others_run_nonblocking_read() {
    in_child("polling_loop_lets_others_run_nonblocking_read", 6, || {
        nb();
        poller_lets_others_run(|| {
            let _ = (&nb().0).read(&mut [0; 4]);
        });
    });
}

/// A loop polling this on one worker lets another fiber run.
#[test]
fn polling_loop_lets_others_run_nonblocking_peek() {
    in_child("polling_loop_lets_others_run_nonblocking_peek", 6, || {
        nb();
        poller_lets_others_run(|| {
            let _ = nb().0.peek(&mut [0; 4]);
        });
    });
}

/// A loop polling this on one worker lets another fiber run.
#[test]
fn polling_loop_lets_others_run_nonblocking_accept() {
    in_child("polling_loop_lets_others_run_nonblocking_accept", 6, || {
        nb();
        poller_lets_others_run(|| {
            let _ = nb().2.accept();
        });
    });
}

/// A loop polling this on one worker lets another fiber run.
#[test]
fn polling_loop_lets_others_run_nonblocking_recv_from() {
    in_child("polling_loop_lets_others_run_nonblocking_recv_from", 6, || {
        nb();
        poller_lets_others_run(|| {
            let _ = nb().3.recv_from(&mut [0; 4]);
        });
    });
}

/// A loop polling this on one worker lets another fiber run.
#[test]
fn polling_loop_lets_others_run_nonblocking_read_vectored() {
    in_child("polling_loop_lets_others_run_nonblocking_read_vectored", 6, || {
        nb();
        poller_lets_others_run(|| {
            let _ = (&nb().0).read_vectored(&mut [std::io::IoSliceMut::new(&mut [0; 4])]);
        });
    });
}

/// A loop polling this on one worker lets another fiber run.
#[test]
fn polling_loop_lets_others_run_eof_read() {
    in_child("polling_loop_lets_others_run_eof_read", 6, || {
        eof();
        poller_lets_others_run(|| {
            let _ = eof().read(&mut [0; 4]);
        });
    });
}

/// A loop polling this on one worker lets another fiber run (`read` at
/// end-of-file counts as polling: readiness.rs `poll_stream_read`).
// Failed before the fix: a fiber looping on TcpStream::peek at end-of-file never yields (no poll_missed for peek's Ok(0)), starving other fibers on its worker
#[test]
fn polling_loop_lets_others_run_eof_peek() {
    in_child("polling_loop_lets_others_run_eof_peek", 6, || {
        eof();
        poller_lets_others_run(|| {
            let _ = eof().peek(&mut [0; 4]);
        });
    });
}

/// A loop polling this on one worker lets another fiber run (`read` at
/// end-of-file counts as polling: readiness.rs `poll_stream_read`).
// Failed before the fix: a fiber looping on TcpStream::read_vectored at end-of-file never yields (no poll_missed for its Ok(0)), starving other fibers on its worker
#[test]
fn polling_loop_lets_others_run_eof_read_vectored() {
    in_child("polling_loop_lets_others_run_eof_read_vectored", 6, || {
        eof();
        poller_lets_others_run(|| {
            let _ = eof().read_vectored(&mut [std::io::IoSliceMut::new(&mut [0; 4])]);
        });
    });
}

static UDP_SHUT: std::sync::OnceLock<UdpSocket> = std::sync::OnceLock::new();

fn udp_shut() -> &'static UdpSocket {
    UDP_SHUT.get_or_init(|| {
        use std::os::fd::AsRawFd;
        let u = UdpSocket::bind("127.0.0.1:0").unwrap();
        let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
        u.connect(peer.local_addr().unwrap()).unwrap();
        // SAFETY: an open socket.
        assert_eq!(unsafe { libc::shutdown(u.as_raw_fd(), libc::SHUT_RD) }, 0);
        // The receive sees the shutdown at once (an event came).
        let start = Instant::now();
        assert_eq!(u.recv(&mut [0; 4]).unwrap(), 0);
        assert!(start.elapsed() < Duration::from_secs(2));
        u
    })
}

/// A loop polling this on one worker lets another fiber run (a receive
/// that returns at once without data, as `read` at end-of-file, is polling).
// Failed before the fix: a fiber looping on a connected UdpSocket::recv after shutdown(SHUT_RD) gets Ok(0) each time and never yields (or_shut_down skips poll_missed), starving other fibers on its worker
#[test]
fn polling_loop_lets_others_run_udp_recv_after_shutdown() {
    in_child("polling_loop_lets_others_run_udp_recv_after_shutdown", 6, || {
        udp_shut();
        poller_lets_others_run(|| {
            let _ = udp_shut().recv(&mut [0; 4]);
        });
    });
}

/// A loop polling this on one worker lets another fiber run (a receive
/// that returns at once without data, as `read` at end-of-file, is polling).
// Failed before the fix: a fiber looping on UdpSocket::peek after shutdown(SHUT_RD) gets Ok(0) each time and never yields, starving other fibers on its worker
#[test]
fn polling_loop_lets_others_run_udp_peek_after_shutdown() {
    in_child("polling_loop_lets_others_run_udp_peek_after_shutdown", 6, || {
        udp_shut();
        poller_lets_others_run(|| {
            let _ = udp_shut().peek(&mut [0; 4]);
        });
    });
}

static CLOSED: std::sync::OnceLock<std::net::SocketAddr> = std::sync::OnceLock::new();

/// The retry-until-the-server-is-up loop: `connect` to a closed port
/// fails at once each time; the loop must let the other fibers run.
#[test]
fn polling_loop_lets_others_run_refused_connect() {
    in_child("polling_loop_lets_others_run_refused_connect", 6, || {
        CLOSED.get_or_init(closed_port);
        poller_lets_others_run(|| {
            let _ = TcpStream::connect(*CLOSED.get().unwrap());
        });
    });
}

/// A server fiber binds after the client fiber started retrying its
/// connect, on a one-worker runtime: the client gets through.
#[test]
fn connect_retry_loop_reaches_a_server_started_later_on_one_worker() {
    in_child(
        "connect_retry_loop_reaches_a_server_started_later_on_one_worker",
        10,
        || {
            within(8, || {
                rt1().block_on(|| {
                    // Reserve a port, free it, and let the server take it.
                    let addr = closed_port();
                    let (go_tx, go_rx) = fiber::chan::bounded::<()>(1);
                    let client = fiber::spawn(move || {
                        go_tx.send(()).unwrap();
                        let mut tries = 0u64;
                        loop {
                            tries += 1;
                            if let Ok(s) = TcpStream::connect(addr) {
                                return (s.peer_addr().unwrap(), tries);
                            }
                        }
                    });
                    go_rx.recv().unwrap();
                    let server = fiber::spawn(move || {
                        let l = TcpListener::bind(addr).unwrap();
                        l.accept().unwrap().1
                    });
                    let (peer, _tries) = client.join().unwrap();
                    assert_eq!(peer, addr);
                    server.join().unwrap();
                });
            });
        },
    );
}

static UNIX_SHUT: std::sync::OnceLock<(fiber::net::unix::UnixDatagram, fiber::net::unix::UnixDatagram)> =
    std::sync::OnceLock::new();

/// A connected unix datagram socket shut down for reading (its peer kept
/// open): every `recv` returns `Ok(0)` at once, as std's blocking one.
fn unix_shut() -> &'static fiber::net::unix::UnixDatagram {
    &UNIX_SHUT
        .get_or_init(|| {
            let (a, b) = fiber::net::unix::UnixDatagram::pair().unwrap();
            a.shutdown(Shutdown::Read).unwrap();
            (a, b)
        })
        .0
}

/// A loop polling this on one worker lets another fiber run.
/// Failed before the fix: as the UDP case, `recv`'s `Ok(0)` after
/// `shutdown(Read)` did not count as polling.
#[test]
fn polling_loop_lets_others_run_unix_datagram_recv_after_shutdown() {
    in_child(
        "polling_loop_lets_others_run_unix_datagram_recv_after_shutdown",
        6,
        || {
            assert_eq!(unix_shut().recv(&mut [0; 4]).unwrap(), 0);
            poller_lets_others_run(|| {
                let _ = unix_shut().recv(&mut [0; 4]);
            });
        },
    );
}
