//! Adversarial: `fiber::net` against std on edges of the socket API.
//! TCP urgent data: Linux stops a read at the urgent mark with more data
//! queued, so "a short read drained the socket" must not park the next
//! read (std returns the bytes behind the mark). `into_std` of one handle
//! while a `try_clone` of it is open: the clone keeps parking (its read
//! timeout works, its worker is not blocked in the kernel). A Unix
//! datagram socket after `shutdown(Read)`: std's `Shutdown::Read` says
//! "all currently blocked and future reads will return Ok(0)"; Linux gives
//! a non-blocking datagram receive `EAGAIN` there and no further event, so
//! such a receive parked for ever.

use fiber::net::{TcpListener, TcpStream};
use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::common::sockets::tcp_pair;
use crate::common::{ms, rt, within};

fn rt_n(workers: usize) -> fiber::Runtime {
    fiber::Runtime::builder()
        .workers(workers)
        .max_workers(workers)
        .shutdown_timeout(ms(500))
        .build()
        .unwrap()
}

extern "C" {
    fn send(fd: i32, buf: *const u8, len: usize, flags: i32) -> isize;
}
const MSG_OOB: i32 = 1;

/// Send "abc", one urgent byte, "def"; read twice after it all arrived.
fn oob_body() -> Vec<u8> {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let sender = std::thread::spawn(move || {
        let s = std::net::TcpStream::connect(addr).unwrap();
        (&s).write_all(b"abc").unwrap();
        // SAFETY: valid fd and a 1-byte buffer.
        let n = unsafe { send(s.as_raw_fd(), b"X".as_ptr(), 1, MSG_OOB) };
        assert_eq!(n, 1);
        (&s).write_all(b"def").unwrap();
        std::thread::sleep(ms(3000));
        drop(s);
    });
    let (mut conn, _) = listener.accept().unwrap();
    // Let everything arrive and the readiness event be delivered.
    std::thread::sleep(ms(300));
    conn.set_read_timeout(Some(ms(1500))).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    // Two reads: std gives "abc" then "def" (both already queued).
    for _ in 0..2 {
        match conn.read(&mut buf) {
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => panic!(
                "read after {:?} failed: {e} ({:?}); std returns the queued bytes",
                String::from_utf8_lossy(&got),
                e.kind()
            ),
        }
    }
    sender.join().unwrap();
    got
}

#[test]
fn oob_reference_std() {
    within(20, || {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let sender = std::thread::spawn(move || {
            let s = std::net::TcpStream::connect(addr).unwrap();
            (&s).write_all(b"abc").unwrap();
            // SAFETY: valid fd and a 1-byte buffer.
            unsafe { send(s.as_raw_fd(), b"X".as_ptr(), 1, MSG_OOB) };
            (&s).write_all(b"def").unwrap();
            std::thread::sleep(ms(3000));
        });
        let (mut conn, _) = listener.accept().unwrap();
        std::thread::sleep(ms(300));
        conn.set_read_timeout(Some(ms(1500))).unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        for _ in 0..2 {
            let n = conn.read(&mut buf).unwrap();
            got.extend_from_slice(&buf[..n]);
        }
        sender.join().unwrap();
        assert_eq!(got, b"abcdef");
    });
}

#[test]
fn oob_short_read_then_queued_data_on_a_thread() {
    let got = within(20, oob_body);
    assert_eq!(got, b"abcdef");
}

#[test]
fn oob_short_read_then_queued_data_in_a_fiber() {
    let got = within(20, || rt().block_on(oob_body));
    assert_eq!(got, b"abcdef");
}

#[test]
fn into_std_of_the_original_leaves_a_clone_with_working_timeouts() {
    within(20, || {
        rt().block_on(|| {
            let (client, _server) = tcp_pair();
            let clone = client.try_clone().unwrap();
            let std_stream = client.into_std().unwrap();
            clone.set_read_timeout(Some(ms(200))).unwrap();
            let (tx, rx) = mpsc::channel();
            std::thread::spawn(move || {
                let start = Instant::now();
                let r = (&clone).read(&mut [0u8; 8]);
                let _ = tx.send((r.map_err(|e| e.kind()), start.elapsed()));
                drop(clone);
            });
            let (r, took) = rx
                .recv_timeout(Duration::from_secs(5))
                .expect("the clone's read with a 200 ms timeout was still blocked after 5 s");
            assert_eq!(r, Err(ErrorKind::WouldBlock));
            assert!(took < Duration::from_secs(2), "{took:?}");
            drop(std_stream);
        })
    });
}

#[test]
fn into_std_of_the_original_makes_a_clone_block_its_worker() {
    within(20, || {
        let rt = rt_n(1);
        let (tx, rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel();
        let h = rt.handle();
        std::thread::spawn(move || {
            let r = h.block_on(|| {
                let (client, _server) = tcp_pair();
                let clone = client.try_clone().unwrap();
                let _std_stream = client.into_std().unwrap();
                clone.set_read_timeout(Some(ms(200))).unwrap();
                let ticker = fiber::spawn(move || {
                    fiber::sleep(ms(50)).unwrap();
                    tx.send(()).unwrap();
                });
                let r = (&clone).read(&mut [0u8; 8]).map_err(|e| e.kind());
                ticker.join().unwrap();
                r
            });
            let _ = done_tx.send(r);
        });
        let ticked = rx.recv_timeout(Duration::from_secs(3)).is_ok();
        let r = done_rx.recv_timeout(Duration::from_secs(3));
        assert!(
            ticked,
            "another fiber never ran: the worker is blocked in the clone's read ({r:?})"
        );
        assert_eq!(r.unwrap(), Err(ErrorKind::WouldBlock));
        std::mem::forget(rt);
    });
}

fn in_fiber_and_thread(body: fn()) {
    within(10, move || rt().block_on(body));
    within(10, body);
}

#[test]
fn unix_datagram_receive_after_shutdown_read_returns_zero() {
    in_fiber_and_thread(|| {
        use std::net::Shutdown;
        for how in [Shutdown::Read, Shutdown::Both] {
            let (a, b) = fiber::net::unix::UnixDatagram::pair().unwrap();
            b.send(b"abc").unwrap();
            a.shutdown(how).unwrap();
            // What was queued first, then end of data, as std.
            assert_eq!(a.recv(&mut [0u8; 8]).unwrap(), 3);
            assert_eq!(a.recv(&mut [0u8; 8]).unwrap(), 0);
            let (n, addr) = a.recv_from(&mut [0u8; 8]).unwrap();
            assert_eq!(n, 0);
            assert!(addr.is_unnamed());
            // In non-blocking mode the kernel's `WouldBlock` stands, as std.
            a.set_nonblocking(true).unwrap();
            assert_eq!(a.recv(&mut [0u8; 8]).unwrap_err().kind(), ErrorKind::WouldBlock);
        }
    });
}

#[test]
fn unix_datagram_receive_parked_when_a_clone_shuts_reading_down_returns_zero() {
    in_fiber_and_thread(|| {
        let (a, _b) = fiber::net::unix::UnixDatagram::pair().unwrap();
        let a2 = a.try_clone().unwrap();
        let t = std::thread::spawn(move || {
            std::thread::sleep(ms(100));
            a2.shutdown(std::net::Shutdown::Read).unwrap();
            a2
        });
        assert_eq!(a.recv(&mut [0u8; 8]).unwrap(), 0);
        drop(t.join().unwrap());
    });
}

// std's sockets are blocking: a descriptor taken out of a fiber socket
// (`OwnedFd::from`) is too, as `into_std` documents for its own hand-over.
#[test]
fn an_owned_fd_taken_from_a_fiber_socket_is_blocking_like_std() {
    within(30, || {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        let fd: std::os::fd::OwnedFd = client.into();
        let std_client = std::net::TcpStream::from(fd);
        let t = std::thread::spawn(move || {
            std::thread::sleep(ms(200));
            (&server).write_all(b"late").unwrap();
            server
        });
        let mut b = [0u8; 4];
        let r = (&std_client).read(&mut b);
        t.join().unwrap();
        assert_eq!(
            r.map_err(|e| e.kind()),
            Ok(4),
            "a std read on the handed-over descriptor waits"
        );
    })
}

// std on Linux: a read timeout of `Duration::MAX` is kept by the kernel as
// none, and the getter says `None`; a long but smaller one reads back.
#[test]
fn read_timeout_getter_after_duration_max_matches_std() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let s = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
    s.set_read_timeout(Some(Duration::MAX)).unwrap();
    let std_val = s.read_timeout().unwrap();
    let u = fiber::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    u.set_read_timeout(Some(Duration::MAX)).unwrap();
    assert_eq!(u.read_timeout().unwrap(), std_val);
    let thousand_years = Duration::from_secs(1000 * 365 * 86400);
    u.set_read_timeout(Some(thousand_years)).unwrap();
    assert_eq!(u.read_timeout().unwrap(), Some(thousand_years));
}

/// std on Linux: `read(&mut [])` on a stream with a read timeout and no
/// data waits out the timeout and returns `Ok(0)` (`Read::read`: `Ok(0)`
/// when "the buffer specified was 0 bytes in length"), also right after a
/// short read; a socket set non-blocking keeps `WouldBlock`.
#[test]
fn an_empty_read_with_a_timeout_returns_zero_like_std() {
    fn body() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(ms(50))).unwrap();
        assert_eq!(s.read(&mut []).map_err(|e| e.kind()), Ok(0));
        c.write_all(b"abc").unwrap();
        let mut b = [0u8; 64];
        assert_eq!(s.read(&mut b).unwrap(), 3);
        assert_eq!(s.read(&mut []).map_err(|e| e.kind()), Ok(0));
        s.set_nonblocking(true).unwrap();
        assert_eq!(s.read(&mut []).map_err(|e| e.kind()), std_nonblocking_empty_read());
    }
    // What std gives for the non-blocking case.
    fn std_nonblocking_empty_read() -> Result<usize, ErrorKind> {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let _c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        s.set_nonblocking(true).unwrap();
        s.read(&mut []).map_err(|e| e.kind())
    }
    within(30, || {
        body();
        rt().block_on(body);
    })
}

/// `connect` to several addresses, cancelled while it waits on the first:
/// the call ends there with the cancellation (spec/net.md: a cancelled call
/// is kind `Other` with `Cancelled` inside). It went on to the next
/// address, and came back with a connected stream (or that address's own
/// error) for a fiber already cancelled.
// Failed before the fix: the cancelled connect went on to the second address and connected
#[test]
fn a_cancelled_connect_does_not_go_on_to_the_next_address() {
    within(30, || {
        let (full, _filled) = crate::common::sockets::full_listener();
        let live = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addrs = [full.local_addr().unwrap(), live.local_addr().unwrap()];
        let rt = crate::common::rt2();
        let (tx, rx) = mpsc::channel();
        let h = rt.spawn(move || {
            let r = TcpStream::connect(&addrs[..]);
            tx.send(r.map(|_| ()).map_err(|e| {
                let cancelled = e.get_ref().is_some_and(|inner| inner.is::<fiber::Cancelled>());
                (e.kind(), cancelled)
            }))
            .unwrap();
        });
        crate::common::wait_parked(&rt, 1);
        h.cancel();
        let r = rx.recv().unwrap();
        assert_eq!(r, Err((ErrorKind::Other, true)), "the connect after its cancel");
    });
}

/// A read with a short timeout must not time out while bytes sit in the
/// socket's receive queue at the time of the call (std's `recv` returns
/// them whatever its `SO_RCVTIMEO`). After a short read, the next read
/// parks without a system call until a readiness event moves the socket's
/// sequence; that event is applied only when a worker or the poller
/// harvests it, which can come after a 2 ms deadline on a busy worker.
/// The timed-out read now makes one real attempt before it reports the
/// timeout.
#[test]
fn a_read_timeout_never_expires_with_bytes_already_queued() {
    within(60, || {
        let rt = rt_n(1);
        rt.block_on(|| {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let a = l.local_addr().unwrap();
            let peer = std::thread::spawn(move || {
                let mut s = std::net::TcpStream::connect(a).unwrap();
                s.set_nodelay(true).unwrap();
                for _ in 0..600 {
                    if s.write_all(b"x").is_err() {
                        break;
                    }
                    std::thread::sleep(Duration::from_micros(1500));
                }
            });
            let (r, _) = l.accept().unwrap();
            r.set_read_timeout(Some(ms(2))).unwrap();
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let mut busy = Vec::new();
            for _ in 0..40 {
                let stop = stop.clone();
                busy.push(fiber::spawn(move || {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let until = Instant::now() + Duration::from_micros(200);
                        while Instant::now() < until {
                            std::hint::spin_loop();
                        }
                        if fiber::yield_now().is_err() {
                            break;
                        }
                    }
                }));
            }
            let mut buf = [0u8; 64];
            let mut spurious = 0;
            let mut got = 0;
            while got < 600 {
                // Let the busy fibers run (and bytes arrive) between reads.
                let _ = fiber::yield_now();
                // Bytes queued now? (`MSG_PEEK | MSG_DONTWAIT` leaves the
                // socket's readiness alone.)
                // SAFETY: recv on a valid socket into a valid buffer.
                let queued = unsafe {
                    libc::recv(
                        r.as_raw_fd(),
                        buf.as_mut_ptr().cast(),
                        1,
                        libc::MSG_PEEK | libc::MSG_DONTWAIT,
                    )
                } > 0;
                match (&r).read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => got += n,
                    Err(e) if e.kind() == ErrorKind::WouldBlock && queued => spurious += 1,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                    Err(e) => panic!("{e}"),
                }
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            for b in busy {
                let _ = b.join();
            }
            drop(r);
            peer.join().unwrap();
            assert_eq!(spurious, 0, "{spurious} reads timed out with bytes already queued");
        });
    });
}
