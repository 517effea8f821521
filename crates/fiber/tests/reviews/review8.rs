//! Adversarial review 8: `fiber::net` against what `std::net` (and
//! `std::os::unix::net`) documents or does on Linux, in combinations the
//! earlier rounds did not cover. Where the rule is "what std does", the
//! same steps run on std's sockets in the same test and the two results
//! are compared.

use fiber::net::unix::{UnixDatagram, UnixListener, UnixStream};
use fiber::net::{TcpListener, TcpStream, UdpSocket};
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::sockets::{std_tcp_pair, tcp_pair};
use crate::common::{ms, rt, set_sock_timeout, within};

/// `body` in a fiber of a two-worker runtime, then on a plain thread.
fn in_fiber_and_thread(body: fn()) {
    within(30, move || rt().block_on(body));
    within(30, body);
}

fn is_nonblocking_fd(fd: std::os::fd::RawFd) -> bool {
    // SAFETY: F_GETFL on a descriptor the caller keeps open.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    assert!(flags >= 0);
    flags & libc::O_NONBLOCK != 0
}

// ---------------------------------------------------------------------
// Timeouts with partial data
// ---------------------------------------------------------------------

/// std: `read_exact` that times out after part of the buffer was filled
/// fails with the timeout's kind (`WouldBlock` on Linux) and the bytes it
/// read are consumed: the next read returns what came after them.
#[test]
fn read_exact_timing_out_midway_consumes_the_partial_bytes_like_std() {
    fn std_reference() -> (ErrorKind, Vec<u8>) {
        let (mut c, mut s) = std_tcp_pair();
        s.set_read_timeout(Some(ms(100))).unwrap();
        c.write_all(b"abc").unwrap();
        let mut buf = [0u8; 6];
        let kind = s.read_exact(&mut buf).unwrap_err().kind();
        c.write_all(b"def").unwrap();
        let mut rest = [0u8; 3];
        s.read_exact(&mut rest).unwrap();
        (kind, rest.to_vec())
    }
    let expected = within(30, std_reference);
    assert_eq!(expected, (ErrorKind::WouldBlock, b"def".to_vec()));
    in_fiber_and_thread(|| {
        let (mut c, mut s) = tcp_pair();
        s.set_read_timeout(Some(ms(100))).unwrap();
        c.write_all(b"abc").unwrap();
        let mut buf = [0u8; 6];
        let start = Instant::now();
        let kind = s.read_exact(&mut buf).unwrap_err().kind();
        assert!(start.elapsed() >= ms(90), "timed out early: {:?}", start.elapsed());
        c.write_all(b"def").unwrap();
        let mut rest = [0u8; 3];
        s.read_exact(&mut rest).unwrap();
        assert_eq!((kind, rest.to_vec()), (ErrorKind::WouldBlock, b"def".to_vec()));
    });
}

/// std: `write_all` of a buffer larger than the socket buffers to a peer
/// that never reads fails, once the write timeout expires, with kind
/// `WouldBlock` (Linux's `EAGAIN`), after writing part of it; what was
/// written reaches the peer intact.
#[test]
fn write_all_to_a_reader_that_stalls_times_out_like_std() {
    fn std_kind() -> ErrorKind {
        let (c, mut s) = std_tcp_pair();
        s.set_write_timeout(Some(ms(100))).unwrap();
        let big = vec![7u8; 16 << 20];
        let kind = s.write_all(&big).unwrap_err().kind();
        drop(c);
        kind
    }
    assert_eq!(within(30, std_kind), ErrorKind::WouldBlock);
    in_fiber_and_thread(|| {
        let (mut c, mut s) = tcp_pair();
        s.set_write_timeout(Some(ms(100))).unwrap();
        let big: Vec<u8> = (0..(16usize << 20)).map(|i| (i % 251) as u8).collect();
        let mut written = 0usize;
        let kind = loop {
            match s.write(&big[written..]) {
                Ok(n) => written += n,
                Err(e) => break e.kind(),
            }
        };
        assert_eq!(kind, ErrorKind::WouldBlock);
        assert!(written > 0 && written < big.len());
        s.shutdown(Shutdown::Write).unwrap();
        let mut got = Vec::new();
        c.read_to_end(&mut got).unwrap();
        assert_eq!(got.len(), written);
        assert!(got == big[..written], "bytes corrupted");
    });
}

// ---------------------------------------------------------------------
// Shutdown while parked
// ---------------------------------------------------------------------

/// std on Linux: a thread blocked in a TCP write on a full buffer fails
/// with `BrokenPipe` when another thread shuts the socket down for
/// writing (TCP's poll reports a send shutdown writable).
#[test]
fn own_write_shutdown_fails_a_parked_tcp_write_like_std() {
    fn std_kind() -> ErrorKind {
        let (_c, s) = std_tcp_pair();
        let s = Arc::new(s);
        let w = s.clone();
        let writer = std::thread::spawn(move || crate::common::write_until_error(|| (&*w).write(&[1u8; 65536])));
        std::thread::sleep(ms(200));
        s.shutdown(Shutdown::Write).unwrap();
        writer.join().unwrap()
    }
    assert_eq!(within(30, std_kind), ErrorKind::BrokenPipe);
    within(30, || {
        rt().block_on(|| {
            let (_c, s) = tcp_pair();
            let s = Arc::new(s);
            let w = s.clone();
            let writer = fiber::spawn(move || crate::common::write_until_error(|| (&*w).write(&[1u8; 65536])));
            fiber::sleep(ms(200)).unwrap();
            s.shutdown(Shutdown::Write).unwrap();
            assert_eq!(writer.join().unwrap(), ErrorKind::BrokenPipe);
        })
    });
}

/// std: a write blocked on a full buffer fails when the peer closes the
/// connection with unread data (Linux sends a reset): `ConnectionReset`
/// or `BrokenPipe`, never a hang.
#[test]
fn a_parked_write_fails_when_the_peer_resets() {
    in_fiber_and_thread(|| {
        let (c, s) = tcp_pair();
        let s = Arc::new(s);
        let w = s.clone();
        let (tx, rx) = fiber::chan::bounded::<ErrorKind>(1);
        let peer = std::thread::spawn(move || {
            std::thread::sleep(ms(200));
            // Unread data in the receive queue: close sends RST.
            drop(c);
        });
        let writer = std::thread::spawn(move || {
            // A plain thread (works from both contexts).
            let _ = tx.send(crate::common::write_until_error(|| (&*w).write(&[1u8; 65536])));
        });
        let kind = rx.recv().unwrap();
        assert!(
            matches!(kind, ErrorKind::ConnectionReset | ErrorKind::BrokenPipe),
            "{kind:?}"
        );
        writer.join().unwrap();
        peer.join().unwrap();
    });
}

// ---------------------------------------------------------------------
// Many waiters, cancellation, mixed threads and fibers
// ---------------------------------------------------------------------

/// std (and Go): several acceptors on one listener each get distinct
/// connections; every connection is accepted exactly once.
#[test]
fn many_fibers_accepting_on_one_listener_take_each_connection_once() {
    within(60, || {
        rt().block_on(|| {
            const ACCEPTORS: usize = 8;
            const CONNS: usize = 64;
            let listener = Arc::new(TcpListener::bind("127.0.0.1:0").unwrap());
            let addr = listener.local_addr().unwrap();
            let (tx, rx) = fiber::chan::unbounded::<u32>();
            let mut acceptors = Vec::new();
            for _ in 0..ACCEPTORS {
                let l = listener.clone();
                let tx = tx.clone();
                acceptors.push(fiber::spawn(move || loop {
                    let (mut s, _) = match l.accept() {
                        Ok(p) => p,
                        Err(e) => return e,
                    };
                    let mut id = [0u8; 4];
                    s.read_exact(&mut id).unwrap();
                    tx.send(u32::from_le_bytes(id)).unwrap();
                }));
            }
            drop(tx);
            // Clients from plain threads, in bursts.
            let clients: Vec<_> = (0..4u32)
                .map(|t| {
                    std::thread::spawn(move || {
                        let mut keep = Vec::new();
                        for i in 0..(CONNS as u32 / 4) {
                            let mut c = std::net::TcpStream::connect(addr).unwrap();
                            c.write_all(&(t * 1000 + i).to_le_bytes()).unwrap();
                            keep.push(c);
                        }
                        keep
                    })
                })
                .collect();
            let mut seen = std::collections::BTreeSet::new();
            for _ in 0..CONNS {
                let id = rx
                    .recv_timeout(Duration::from_secs(20))
                    .expect("a connection was never accepted");
                assert!(seen.insert(id), "connection {id} accepted twice");
            }
            for c in clients {
                c.join().unwrap();
            }
            for a in &acceptors {
                a.cancel();
            }
            for a in acceptors {
                match a.join() {
                    Ok(e) => assert_eq!(e.kind(), ErrorKind::Other),
                    Err(e) => assert!(e.is_cancelled()),
                }
            }
        })
    });
}

/// Two fibers parked reading one stream; one is cancelled; the other
/// still gets the data that arrives afterwards, and the cancelled one
/// took none of it.
#[test]
fn cancelling_one_of_two_parked_readers_leaves_the_other_the_data() {
    within(30, || {
        let rt = rt();
        rt.block_on(|| {
            let (mut c, s) = tcp_pair();
            let s = Arc::new(s);
            let (a, b) = (s.clone(), s.clone());
            let r1 = fiber::spawn(move || {
                let mut buf = [0u8; 16];
                (&*a).read(&mut buf).map(|n| buf[..n].to_vec())
            });
            let r2 = fiber::spawn(move || {
                let mut buf = [0u8; 16];
                (&*b).read(&mut buf).map(|n| buf[..n].to_vec())
            });
            fiber::sleep(ms(100)).unwrap();
            r1.cancel();
            match r1.join() {
                Ok(r) => {
                    let e = r.unwrap_err();
                    assert_eq!(e.kind(), ErrorKind::Other);
                    assert!(e.get_ref().unwrap().is::<fiber::Cancelled>());
                }
                Err(e) => assert!(e.is_cancelled()),
            }
            c.write_all(b"hello").unwrap();
            assert_eq!(r2.join().unwrap().unwrap(), b"hello".to_vec());
        })
    });
}

/// A fiber parked in a read on one handle is cancelled while another
/// fiber keeps writing through a `try_clone` of it: the writes are not
/// disturbed, and a new read on the first handle gets the peer's reply.
#[test]
fn cancelling_a_parked_reader_does_not_disturb_a_writer_on_a_clone() {
    within(30, || {
        rt().block_on(|| {
            let (mut c, s) = tcp_pair();
            let writer_handle = s.try_clone().unwrap();
            let s = Arc::new(s);
            let rs = s.clone();
            let reader = fiber::spawn(move || {
                let mut buf = [0u8; 8];
                (&*rs).read(&mut buf)
            });
            let writer = fiber::spawn(move || {
                let mut w = writer_handle;
                for i in 0..200u32 {
                    w.write_all(&i.to_le_bytes()).unwrap();
                    if i == 50 {
                        fiber::sleep(ms(20)).unwrap();
                    }
                }
            });
            fiber::sleep(ms(10)).unwrap();
            reader.cancel();
            assert!(reader.join().map_or(true, |r| r.is_err()));
            writer.join().unwrap();
            let mut got = vec![0u8; 800];
            c.read_exact(&mut got).unwrap();
            for (i, chunk) in got.chunks(4).enumerate() {
                assert_eq!(u32::from_le_bytes(chunk.try_into().unwrap()), i as u32);
            }
            c.write_all(b"reply").unwrap();
            let mut buf = [0u8; 5];
            (&*s).read_exact(&mut buf).unwrap();
            assert_eq!(&buf, b"reply");
        })
    });
}

/// One socket read at once by a plain thread and by a fiber: each message
/// goes to exactly one of them and both wake (std's rule for two threads).
#[test]
fn a_plain_thread_and_a_fiber_reading_one_socket_share_the_data() {
    within(30, || {
        rt().block_on(|| {
            let (mut c, s) = tcp_pair();
            let s = Arc::new(s);
            let total = Arc::new(AtomicUsize::new(0));
            let reader = |s: Arc<TcpStream>, total: Arc<AtomicUsize>| {
                move || {
                    let mut buf = [0u8; 1];
                    let mut mine = 0;
                    loop {
                        match (&*s).read(&mut buf) {
                            Ok(0) => return mine,
                            Ok(n) => {
                                mine += n;
                                total.fetch_add(n, Ordering::SeqCst);
                            }
                            Err(e) => panic!("{e}"),
                        }
                    }
                }
            };
            let t = std::thread::spawn(reader(s.clone(), total.clone()));
            let f = fiber::spawn(reader(s.clone(), total.clone()));
            for _ in 0..200 {
                c.write_all(b"x").unwrap();
                fiber::sleep(Duration::from_micros(300)).unwrap();
            }
            c.shutdown(Shutdown::Write).unwrap();
            let (a, b) = (t.join().unwrap(), f.join().unwrap());
            assert_eq!(a + b, 200);
            assert_eq!(total.load(Ordering::SeqCst), 200);
        })
    });
}

/// std: a thread already blocked in `read` stays blocked when another
/// thread sets the socket non-blocking afterwards, and then gets the data
/// (the mode is read at the start of a call). Fiber's parked reader must
/// likewise get the data, not a `WouldBlock`.
#[test]
fn set_nonblocking_while_a_reader_is_parked_then_data_arrives() {
    within(30, || {
        rt().block_on(|| {
            let (mut c, s) = tcp_pair();
            let s = Arc::new(s);
            let r = s.clone();
            let reader = fiber::spawn(move || {
                let mut buf = [0u8; 8];
                (&*r).read(&mut buf).map(|n| buf[..n].to_vec())
            });
            fiber::sleep(ms(50)).unwrap();
            s.set_nonblocking(true).unwrap();
            c.write_all(b"data").unwrap();
            assert_eq!(reader.join().unwrap().unwrap(), b"data".to_vec());
            let mut buf = [0u8; 8];
            assert_eq!((&*s).read(&mut buf).unwrap_err().kind(), ErrorKind::WouldBlock);
        })
    });
}

// ---------------------------------------------------------------------
// Connect
// ---------------------------------------------------------------------

fn closed_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let a = l.local_addr().unwrap();
    drop(l);
    a
}

/// std: `connect_timeout` to a closed local port fails with
/// `ConnectionRefused` at once, and to an address nobody answers (a
/// non-routable one) with the same result std gets (`TimedOut` when the
/// packets vanish, an unreachable-network error at once, or a connection
/// where a transparent proxy answers for every address).
#[test]
fn connect_timeout_to_a_closed_port_and_to_a_black_hole_match_std() {
    let refused = closed_port();
    let hole: SocketAddr = "10.255.255.1:81".parse().unwrap();
    let std_hole = within(30, move || {
        std::net::TcpStream::connect_timeout(&hole, ms(300))
            .map(drop)
            .map_err(|e| e.kind())
    });
    let std_refused = within(30, move || {
        std::net::TcpStream::connect_timeout(&refused, ms(300))
            .unwrap_err()
            .kind()
    });
    assert_eq!(std_refused, ErrorKind::ConnectionRefused);
    let check = move || {
        let start = Instant::now();
        assert_eq!(
            TcpStream::connect_timeout(&refused, ms(300)).unwrap_err().kind(),
            std_refused
        );
        assert!(start.elapsed() < ms(250));
        let start = Instant::now();
        let kind = TcpStream::connect_timeout(&hole, ms(300))
            .map(drop)
            .map_err(|e| e.kind());
        assert_eq!(kind, std_hole);
        if kind == Err(ErrorKind::TimedOut) {
            let took = start.elapsed();
            assert!(took >= ms(290) && took < ms(3000), "took {took:?}");
        }
    };
    within(30, move || rt().block_on(check));
    within(30, check);
}

// ---------------------------------------------------------------------
// Descriptors and std's options on the socket
// ---------------------------------------------------------------------

/// std: `set_nonblocking(true)` sets `O_NONBLOCK` on the socket, so a
/// descriptor taken out with `into_raw_fd` / `OwnedFd::from` is
/// non-blocking, and its reads return `WouldBlock`.
#[test]
/// Was (before the fix): a fiber socket set non-blocking hands out a blocking descriptor (into_owned_fd clears O_NONBLOCK unconditionally)
fn a_socket_set_nonblocking_hands_out_a_nonblocking_descriptor_like_std() {
    // std reference.
    let (_c, s) = std_tcp_pair();
    s.set_nonblocking(true).unwrap();
    let fd = s.into_raw_fd();
    assert!(is_nonblocking_fd(fd));
    // SAFETY: the descriptor was just taken out and is owned here.
    drop(unsafe { OwnedFd::from_raw_fd(fd) });

    within(30, || {
        rt().block_on(|| {
            let (_c, s) = tcp_pair();
            s.set_nonblocking(true).unwrap();
            let fd = s.into_raw_fd();
            let nb = is_nonblocking_fd(fd);
            // SAFETY: as above.
            let mut std_s = unsafe { std::net::TcpStream::from_raw_fd(fd) };
            assert!(nb, "descriptor of a non-blocking socket came out blocking");
            std_s.set_read_timeout(Some(ms(50))).unwrap();
            let mut buf = [0u8; 4];
            assert_eq!(std_s.read(&mut buf).unwrap_err().kind(), ErrorKind::WouldBlock);
        })
    });
}

/// Linux copies a listening socket's `SO_RCVTIMEO` / `SO_SNDTIMEO` to the
/// sockets it accepts, so std's accepted stream reports (and obeys) the
/// timeouts set on the listener (e.g. with socket2 or `setsockopt`). A
/// fiber accepted stream should read back and obey the same timeouts.
#[test]
/// Was (before the fix): an accepted fiber stream ignores the SO_RCVTIMEO/SO_SNDTIMEO it inherits from the listener (getter None, read parks for ever)
fn accepted_streams_inherit_the_listeners_socket_timeouts_like_std() {
    // std reference.
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    set_sock_timeout(std_listener.as_raw_fd(), libc::SO_RCVTIMEO, ms(100));
    set_sock_timeout(std_listener.as_raw_fd(), libc::SO_SNDTIMEO, ms(200));
    let _c = std::net::TcpStream::connect(std_listener.local_addr().unwrap()).unwrap();
    let (mut s, _) = std_listener.accept().unwrap();
    assert_eq!(s.read_timeout().unwrap(), Some(ms(100)));
    assert_eq!(s.write_timeout().unwrap(), Some(ms(200)));
    let mut buf = [0u8; 4];
    assert_eq!(s.read(&mut buf).unwrap_err().kind(), ErrorKind::WouldBlock);

    within(30, || {
        rt().block_on(|| {
            // The options are set on a std listener that is then adopted
            // (an option set behind a fiber handle's back, through its raw
            // descriptor, is not seen: spec/net.md).
            let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            set_sock_timeout(std_listener.as_raw_fd(), libc::SO_RCVTIMEO, ms(100));
            set_sock_timeout(std_listener.as_raw_fd(), libc::SO_SNDTIMEO, ms(200));
            let listener = TcpListener::from_std(std_listener).unwrap();
            let _c = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let (mut s, _) = listener.accept().unwrap();
            let got = (s.read_timeout().unwrap(), s.write_timeout().unwrap());
            // Guard so the failure is an assertion, not a hang.
            let (tx, rx) = fiber::chan::bounded(1);
            let reader = fiber::spawn(move || {
                let mut buf = [0u8; 4];
                let _ = tx.send(s.read(&mut buf).map_err(|e| e.kind()));
            });
            let read = rx.recv_timeout(Duration::from_secs(2));
            reader.cancel();
            let _ = reader.join();
            assert_eq!(got, (Some(ms(100)), Some(ms(200))));
            assert_eq!(read, Ok(Err(ErrorKind::WouldBlock)));
        })
    });
}

// ---------------------------------------------------------------------
// Binding
// ---------------------------------------------------------------------

/// std sets `SO_REUSEADDR` on a TCP listener (Unix), so a port whose last
/// connection is in TIME_WAIT on the server side can be bound again at
/// once; it does not set it on UDP sockets, so a second UDP bind of a
/// bound port is `AddrInUse`.
#[test]
fn rebinding_a_port_is_std_s_for_tcp_and_udp() {
    in_fiber_and_thread(|| {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mut c = TcpStream::connect(addr).unwrap();
        let (s, _) = listener.accept().unwrap();
        // The server closes first: its side goes to TIME_WAIT.
        drop(s);
        let mut buf = [0u8; 1];
        assert_eq!(c.read(&mut buf).unwrap(), 0);
        drop(c);
        drop(listener);
        let again = TcpListener::bind(addr).expect("rebinding a TIME_WAIT port (std sets SO_REUSEADDR)");
        drop(again);
        // A live TCP listener's port is in use, as with std.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        assert_eq!(
            TcpListener::bind(l.local_addr().unwrap()).unwrap_err().kind(),
            ErrorKind::AddrInUse
        );
        let u = UdpSocket::bind("127.0.0.1:0").unwrap();
        let ua = u.local_addr().unwrap();
        assert_eq!(UdpSocket::bind(ua).unwrap_err().kind(), ErrorKind::AddrInUse);
        assert_eq!(std::net::UdpSocket::bind(ua).unwrap_err().kind(), ErrorKind::AddrInUse);
    });
}

// ---------------------------------------------------------------------
// Unix sockets
// ---------------------------------------------------------------------

/// std: an abstract name of the longest length Linux takes (107 bytes)
/// binds and connects; one byte longer is an error (std's kind).
#[test]
fn unix_abstract_names_at_the_length_limit_are_std_s() {
    use std::os::linux::net::SocketAddrExt;
    in_fiber_and_thread(|| {
        let mut name = format!("fiber-adv8-{}-", std::process::id()).into_bytes();
        name.resize(107, b'z');
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(&name).unwrap();
        let listener = UnixListener::bind_addr(&addr).unwrap();
        let mut c = UnixStream::connect_addr(&addr).unwrap();
        let (mut s, _) = listener.accept().unwrap();
        c.write_all(b"ok").unwrap();
        let mut buf = [0u8; 2];
        s.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"ok");
        assert_eq!(listener.local_addr().unwrap().as_abstract_name(), Some(&name[..]));
        let mut long = name.clone();
        long.push(b'z');
        let std_err = std::os::unix::net::SocketAddr::from_abstract_name(&long)
            .unwrap_err()
            .kind();
        assert_eq!(std_err, ErrorKind::InvalidInput);
    });
}

/// std: a `UnixDatagram` send blocked because the connected peer's queue
/// is full resumes when the peer receives; with a write timeout and no
/// receiver it fails with `WouldBlock`.
#[test]
fn unix_datagram_send_blocked_on_a_full_peer_resumes_when_it_receives() {
    in_fiber_and_thread(|| {
        let (a, b) = UnixDatagram::pair().unwrap();
        a.set_write_timeout(Some(ms(200))).unwrap();
        let mut sent = 0usize;
        let kind = loop {
            match a.send(&[9u8; 512]) {
                Ok(_) => sent += 1,
                Err(e) => break e.kind(),
            }
            assert!(sent < 1_000_000);
        };
        assert_eq!(kind, ErrorKind::WouldBlock);
        a.set_write_timeout(None).unwrap();
        let a = Arc::new(a);
        let a2 = a.clone();
        let sender = std::thread::spawn(move || a2.send(b"last").map_err(|e| e.kind()));
        std::thread::sleep(ms(100));
        // Drain the queue.
        let mut buf = [0u8; 512];
        b.set_read_timeout(Some(ms(500))).unwrap();
        let mut got = 0usize;
        let mut last = false;
        while got <= sent {
            let n = b.recv(&mut buf).expect("recv");
            if &buf[..n] == b"last" {
                last = true;
                break;
            }
            got += 1;
        }
        assert_eq!(sender.join().unwrap(), Ok(4));
        assert!(last || got == sent);
    });
}

/// Same as above, the blocked sender being a fiber of the runtime and the
/// receiver a second fiber (wake through the peer's queue).
#[test]
fn unix_datagram_sender_fiber_parked_on_a_full_peer_is_woken_by_a_receiving_fiber() {
    within(30, || {
        rt().block_on(|| {
            let (a, b) = UnixDatagram::pair().unwrap();
            a.set_nonblocking(true).unwrap();
            let mut sent = 0usize;
            while a.send(&[9u8; 512]).is_ok() {
                sent += 1;
            }
            a.set_nonblocking(false).unwrap();
            let sender = fiber::spawn(move || a.send(b"last").map_err(|e| e.kind()));
            fiber::sleep(ms(100)).unwrap();
            let receiver = fiber::spawn(move || {
                let mut buf = [0u8; 512];
                for _ in 0..=sent {
                    let n = b.recv(&mut buf).unwrap();
                    if &buf[..n] == b"last" {
                        return true;
                    }
                }
                false
            });
            assert_eq!(sender.join().unwrap(), Ok(4));
            assert!(receiver.join().unwrap());
        })
    });
}

// ---------------------------------------------------------------------
// Runtime shutdown with half-open connections
// ---------------------------------------------------------------------

/// A detached fiber parked reading a connection when the runtime is
/// dropped: its stack unwinds, the socket is closed, and the peer (a
/// plain thread, as a Go client would) sees end-of-file instead of a
/// connection left half-open for ever.
#[test]
fn dropping_the_runtime_closes_the_connections_its_parked_fibers_held() {
    within(30, || {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let rt = rt();
        rt.block_on(move || {
            let s = TcpStream::connect(addr).unwrap();
            fiber::spawn(move || {
                let mut buf = [0u8; 8];
                let _ = (&s).read(&mut buf);
                // Unwinding or returning, `s` is dropped here.
            });
            fiber::sleep(ms(50)).unwrap();
        });
        let (mut peer, _) = listener.accept().unwrap();
        drop(rt);
        peer.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(peer.read(&mut buf).unwrap(), 0, "the connection stayed open");
    });
}

// ---------------------------------------------------------------------
// Misc std rules
// ---------------------------------------------------------------------

/// std on Linux: after `shutdown(Both)`, `local_addr` still works,
/// `peer_addr` too (the socket is still connected until the FIN
/// handshake ends), a second `shutdown` succeeds, and `write` is
/// `BrokenPipe`. Compared with std's results.
/// Local address known, two shutdowns, a read and a write.
type Outcome = (
    bool,
    Result<(), ErrorKind>,
    Result<(), ErrorKind>,
    Result<usize, ErrorKind>,
    Result<usize, ErrorKind>,
);

#[test]
fn addresses_and_repeated_shutdowns_after_shutdown_both_match_std() {
    fn outcome<S: Read + Write>(
        s: &mut S,
        shutdown: impl Fn(Shutdown) -> std::io::Result<()>,
        local: impl Fn() -> std::io::Result<SocketAddr>,
    ) -> Outcome {
        let first = shutdown(Shutdown::Both).map_err(|e| e.kind());
        let second = shutdown(Shutdown::Both).map_err(|e| e.kind());
        let mut buf = [0u8; 4];
        let read = s.read(&mut buf).map_err(|e| e.kind());
        let write = s.write(b"x").map_err(|e| e.kind());
        (local().is_ok(), first, second, read, write)
    }
    let expected = within(30, || {
        let (_c, mut s) = std_tcp_pair();
        let t = s.try_clone().unwrap();
        let t2 = s.try_clone().unwrap();
        outcome(&mut s, |h| t.shutdown(h), || t2.local_addr())
    });
    assert!(expected.0);
    let check = move || {
        let (_c, mut s) = tcp_pair();
        let t = s.try_clone().unwrap();
        let t2 = s.try_clone().unwrap();
        assert_eq!(outcome(&mut s, |h| t.shutdown(h), || t2.local_addr()), expected);
    };
    within(30, move || rt().block_on(check));
    within(30, check);
}

/// std: `peek` does not consume, a following `read` gets the same bytes,
/// and a `peek` parked on an empty socket returns when data arrives; two
/// fibers peeking and one reading see the same first bytes.
#[test]
fn parked_peeks_and_a_read_all_see_the_same_bytes() {
    within(30, || {
        rt().block_on(|| {
            let (mut c, s) = tcp_pair();
            let s = Arc::new(s);
            let peekers: Vec<_> = (0..2)
                .map(|_| {
                    let s = s.clone();
                    fiber::spawn(move || {
                        let mut buf = [0u8; 5];
                        let n = s.peek(&mut buf).unwrap();
                        buf[..n].to_vec()
                    })
                })
                .collect();
            fiber::sleep(ms(50)).unwrap();
            c.write_all(b"hello").unwrap();
            for p in peekers {
                let got = p.join().unwrap();
                assert!(!got.is_empty() && b"hello".starts_with(&got), "{got:?}");
            }
            let mut buf = [0u8; 5];
            (&*s).read_exact(&mut buf).unwrap();
            assert_eq!(&buf, b"hello");
        })
    });
}

/// std: a UDP socket with a read timeout, its `recv_from` parked in one
/// fiber and a `send_to` to itself from another fiber through a clone:
/// the datagram arrives, and a later receive times out with `WouldBlock`
/// after the timeout.
#[test]
fn udp_clone_sends_to_itself_while_the_original_is_parked() {
    in_fiber_and_thread(|| {
        let u = UdpSocket::bind("127.0.0.1:0").unwrap();
        u.set_read_timeout(Some(ms(150))).unwrap();
        let clone = u.try_clone().unwrap();
        assert_eq!(clone.read_timeout().unwrap(), u.read_timeout().unwrap());
        let addr = u.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            std::thread::sleep(ms(30));
            clone.send_to(b"me", addr).unwrap();
        });
        let mut buf = [0u8; 8];
        let (n, from) = u.recv_from(&mut buf).unwrap();
        assert_eq!((&buf[..n], from), (&b"me"[..], addr));
        t.join().unwrap();
        let start = Instant::now();
        assert_eq!(u.recv_from(&mut buf).unwrap_err().kind(), ErrorKind::WouldBlock);
        assert!(start.elapsed() >= ms(140));
    });
}

fn temp_path(name: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("fiber-adv8-{}-{name}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path
}

/// std: an unconnected `UnixDatagram::send_to` to a receiver whose queue
/// is full blocks until the receiver takes a datagram, then sends. (The
/// sender's own socket stays "writable" for poll the whole time: the
/// kernel reports nothing when the receiver's queue gets room.)
#[test]
fn unix_datagram_send_to_a_full_unconnected_receiver_resumes_when_it_receives() {
    fn scenario(name: &'static str, in_fiber: bool) {
        let path = temp_path(name);
        let receiver = UnixDatagram::bind(&path).unwrap();
        let sender = UnixDatagram::unbound().unwrap();
        sender.set_nonblocking(true).unwrap();
        let mut queued = 0usize;
        loop {
            match sender.send_to(b"fill", &path) {
                Ok(_) => queued += 1,
                Err(e) => {
                    assert_eq!(e.kind(), ErrorKind::WouldBlock);
                    break;
                }
            }
            assert!(queued < 1_000_000);
        }
        sender.set_nonblocking(false).unwrap();
        let p = path.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let send_last = move || {
            let _ = tx.send(sender.send_to(b"last", &p).map_err(|e| e.kind()));
        };
        let fiber_sender = if in_fiber {
            Some(fiber::spawn(send_last))
        } else {
            std::thread::spawn(send_last);
            None
        };
        std::thread::sleep(ms(100));
        let mut buf = [0u8; 8];
        receiver.set_read_timeout(Some(ms(500))).unwrap();
        // Take a few: room for the blocked sender.
        for _ in 0..3 {
            receiver.recv(&mut buf).unwrap();
        }
        let got = rx.recv_timeout(Duration::from_secs(3));
        if let Some(f) = fiber_sender {
            if got.is_err() {
                f.cancel();
            }
            let _ = f.join();
        }
        let _ = std::fs::remove_file(&path);
        assert_eq!(got, Ok(Ok(4)), "the blocked send_to never resumed ({queued} queued)");
    }
    // std reference.
    within(30, || {
        let path = temp_path("std");
        let receiver = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        let sender = std::os::unix::net::UnixDatagram::unbound().unwrap();
        sender.set_nonblocking(true).unwrap();
        while sender.send_to(b"fill", &path).is_ok() {}
        sender.set_nonblocking(false).unwrap();
        let p = path.clone();
        let t = std::thread::spawn(move || sender.send_to(b"last", &p).map_err(|e| e.kind()));
        std::thread::sleep(ms(100));
        let mut buf = [0u8; 8];
        for _ in 0..3 {
            receiver.recv(&mut buf).unwrap();
        }
        assert_eq!(t.join().unwrap(), Ok(4));
        let _ = std::fs::remove_file(&path);
    });
    within(30, || scenario("thread", false));
    within(30, || rt().block_on(|| scenario("fiber", true)));
}

/// std on Linux: `shutdown(2)` (`SHUT_RD`) of a TCP listener fails a
/// blocked `accept` with `EINVAL`; a fiber parked in accept must wake
/// and fail the same way.
#[test]
fn a_tcp_listener_shut_down_fails_a_parked_accept_like_std() {
    fn std_errno() -> Option<i32> {
        let l = Arc::new(std::net::TcpListener::bind("127.0.0.1:0").unwrap());
        let l2 = l.clone();
        let t = std::thread::spawn(move || l2.accept().map(drop).map_err(|e| e.raw_os_error()));
        std::thread::sleep(ms(100));
        // SAFETY: the listener is open for the call.
        assert_eq!(unsafe { libc::shutdown(l.as_raw_fd(), libc::SHUT_RD) }, 0);
        t.join().unwrap().unwrap_err()
    }
    let expected = within(30, std_errno);
    assert_eq!(expected, Some(libc::EINVAL));
    within(30, move || {
        rt().block_on(move || {
            let l = Arc::new(TcpListener::bind("127.0.0.1:0").unwrap());
            let l2 = l.clone();
            let f = fiber::spawn(move || l2.accept().map(drop).map_err(|e| e.raw_os_error()));
            fiber::sleep(ms(100)).unwrap();
            // SAFETY: as above.
            assert_eq!(unsafe { libc::shutdown(l.as_raw_fd(), libc::SHUT_RD) }, 0);
            let (tx, rx) = fiber::chan::bounded(1);
            let g = fiber::spawn(move || {
                let _ = tx.send(f.join());
            });
            let got = rx.recv_timeout(Duration::from_secs(3));
            g.cancel();
            let _ = g.join();
            assert!(matches!(got, Ok(Ok(Err(e))) if e == expected), "{got:?}");
        })
    });
}

/// std on Linux: after `shutdown(Read)` of a TCP stream, a read with
/// nothing queued returns 0; data the peer sends afterwards is still
/// queued and read (Linux does not discard it). Compared with std.
#[test]
fn tcp_shutdown_read_then_the_peer_writes_matches_std() {
    fn run<S: Read>(mut s: S, shutdown: impl Fn(), mut peer_write: impl FnMut(&[u8])) -> (usize, Vec<u8>) {
        shutdown();
        let mut buf = [0u8; 8];
        let first = s.read(&mut buf).unwrap();
        peer_write(b"late");
        std::thread::sleep(ms(100));
        let n = s.read(&mut buf).unwrap();
        (first, buf[..n].to_vec())
    }
    let expected = within(30, || {
        let (mut c, s) = std_tcp_pair();
        let h = s.try_clone().unwrap();
        run(s, || h.shutdown(Shutdown::Read).unwrap(), |b| c.write_all(b).unwrap())
    });
    let check = |expected: (usize, Vec<u8>)| {
        move || {
            let (mut c, s) = tcp_pair();
            let h = s.try_clone().unwrap();
            assert_eq!(
                run(s, || h.shutdown(Shutdown::Read).unwrap(), |b| c.write_all(b).unwrap()),
                expected
            );
        }
    };
    let in_fiber = check(expected.clone());
    within(30, move || rt().block_on(in_fiber));
    within(30, check(expected));
}

/// std: connecting to a socket file whose listener is gone is
/// `ConnectionRefused`; to a path that does not exist, `NotFound`; binding
/// an abstract name already bound, `AddrInUse`. Compared with std.
#[test]
fn unix_connect_and_bind_failures_match_std() {
    use std::os::linux::net::SocketAddrExt;
    let stale = temp_path("stale");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    let missing = temp_path("missing");
    let std_stale = std::os::unix::net::UnixStream::connect(&stale).unwrap_err().kind();
    let std_missing = std::os::unix::net::UnixStream::connect(&missing).unwrap_err().kind();
    assert_eq!(
        (std_stale, std_missing),
        (ErrorKind::ConnectionRefused, ErrorKind::NotFound)
    );
    let name = format!("fiber-adv8-inuse-{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let held = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
    let std_inuse = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap_err().kind();
    let check = move || {
        assert_eq!(UnixStream::connect(&stale).unwrap_err().kind(), std_stale);
        assert_eq!(UnixStream::connect(&missing).unwrap_err().kind(), std_missing);
        assert_eq!(UnixListener::bind_addr(&addr).unwrap_err().kind(), std_inuse);
        // Stale socket file: bind is AddrInUse, as std.
        assert_eq!(
            UnixListener::bind(&stale).unwrap_err().kind(),
            std::os::unix::net::UnixListener::bind(&stale).unwrap_err().kind()
        );
    };
    let c2 = check.clone();
    within(30, move || rt().block_on(c2));
    within(30, check);
    drop(held);
    let _ = std::fs::remove_file(temp_path("stale"));
}

/// std on Linux: a listener bound to `[::]` takes IPv4 connections too
/// (`IPV6_V6ONLY` off, the kernel default), and the accepted stream's
/// `peer_addr` is the v4-mapped IPv6 address. Compared with std (skipped
/// where the host has no IPv6).
#[test]
fn a_dual_stack_listener_matches_std() {
    let Ok(std_l) = std::net::TcpListener::bind("[::]:0") else {
        return;
    };
    let port = std_l.local_addr().unwrap().port();
    let c = std::net::TcpStream::connect(("127.0.0.1", port))
        .map(|_| ())
        .map_err(|e| e.kind());
    let expected = c.map(|()| std_l.accept().unwrap().1.ip().is_ipv6());
    drop(std_l);
    let check = move || {
        let l = TcpListener::bind("[::]:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let c = TcpStream::connect(("127.0.0.1", port))
            .map(|_| ())
            .map_err(|e| e.kind());
        let got = c.map(|()| l.accept().unwrap().1.ip().is_ipv6());
        assert_eq!(got, expected);
    };
    within(30, move || rt().block_on(check));
    within(30, check);
}

/// What std's accepted unix stream reports for timeouts set on its
/// listener with `setsockopt` (Linux does not copy them to unix sockets,
/// unlike TCP): fiber's must report the same.
#[test]
fn unix_accepted_stream_timeouts_match_std() {
    let path = temp_path("inherit-std");
    let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
    set_sock_timeout(l.as_raw_fd(), libc::SO_RCVTIMEO, ms(100));
    let _c = std::os::unix::net::UnixStream::connect(&path).unwrap();
    let expected = l.accept().unwrap().0.read_timeout().unwrap();
    let _ = std::fs::remove_file(&path);
    within(30, move || {
        rt().block_on(move || {
            let path = temp_path("inherit-fiber");
            let l = UnixListener::bind(&path).unwrap();
            set_sock_timeout(l.as_raw_fd(), libc::SO_RCVTIMEO, ms(100));
            let _c = UnixStream::connect(&path).unwrap();
            let got = l.accept().unwrap().0.read_timeout().unwrap();
            let _ = std::fs::remove_file(&path);
            assert_eq!(got, expected);
        })
    });
}

/// Every kind of socket wait that ends without its event (cancelled,
/// timed out, or woken and served) leaves no waiter behind:
/// `fiber::net::io_waiters()` returns to zero. Run in a child process,
/// since the count is process-wide.
#[test]
fn socket_waits_ended_every_way_leave_no_published_waiters() {
    crate::common::in_child("socket_waits_ended_every_way_leave_no_published_waiters", 60, || {
        rt().block_on(|| {
            let (c, s) = tcp_pair();
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
            let (ua, ub) = UnixDatagram::pair().unwrap();
            let (wa, _wb) = tcp_pair();
            // Fill wa's buffers so a write parks.
            wa.set_nonblocking(true).unwrap();
            while (&wa).write(&[0u8; 65536]).is_ok() {}
            wa.set_nonblocking(false).unwrap();
            let (s, listener, udp, ua, wa) = (
                Arc::new(s),
                Arc::new(listener),
                Arc::new(udp),
                Arc::new(ua),
                Arc::new(wa),
            );
            let mut handles: Vec<fiber::JoinHandle<()>> = Vec::new();
            for _ in 0..3 {
                let s1 = s.clone();
                handles.push(fiber::spawn(move || {
                    let _ = (&*s1).read(&mut [0u8; 4]);
                }));
                let s2 = s.clone();
                handles.push(fiber::spawn(move || {
                    let _ = s2.peek(&mut [0u8; 4]);
                }));
                let l = listener.clone();
                handles.push(fiber::spawn(move || {
                    let _ = l.accept();
                }));
                let u = udp.clone();
                handles.push(fiber::spawn(move || {
                    let _ = u.recv_from(&mut [0u8; 4]);
                }));
                let u = ua.clone();
                handles.push(fiber::spawn(move || {
                    let _ = u.recv(&mut [0u8; 4]);
                }));
                let w = wa.clone();
                handles.push(fiber::spawn(move || {
                    let _ = (&*w).write(&[0u8; 65536]);
                }));
            }
            let start = Instant::now();
            while fiber::net::io_waiters() < handles.len() {
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "only {} parked",
                    fiber::net::io_waiters()
                );
                fiber::sleep(ms(5)).unwrap();
            }
            // Cancel half, serve the reads/recvs by data, time out the rest.
            for h in handles.iter().step_by(2) {
                h.cancel();
            }
            (&c).write_all(b"data").unwrap();
            ub.send(b"d").unwrap();
            udp.set_read_timeout(Some(ms(50))).unwrap();
            // Wake the rest: close the peers and shut things down.
            c.shutdown(Shutdown::Both).unwrap();
            drop(ub);
            udp.send_to(b"x", udp.local_addr().unwrap()).unwrap();
            udp.send_to(b"x", udp.local_addr().unwrap()).unwrap();
            udp.send_to(b"x", udp.local_addr().unwrap()).unwrap();
            let _ = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let _ = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let _ = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            wa.shutdown(Shutdown::Write).unwrap();
            for h in handles {
                let _ = h.join();
            }
            // A timed-out read on a plain thread, too.
            let (_c2, s2) = tcp_pair();
            s2.set_read_timeout(Some(ms(30))).unwrap();
            let t = std::thread::spawn(move || (&s2).read(&mut [0u8; 4]).unwrap_err().kind());
            assert_eq!(t.join().unwrap(), ErrorKind::WouldBlock);
            assert_eq!(fiber::net::io_waiters(), 0);
        });
    });
}

/// std: `connect_timeout` with `Duration::MAX` to a local listener
/// connects (no overflow, no instant timeout).
#[test]
fn connect_timeout_of_duration_max_connects_like_std() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    assert!(std::net::TcpStream::connect_timeout(&addr, Duration::MAX).is_ok());
    let check = move || assert!(TcpStream::connect_timeout(&addr, Duration::MAX).is_ok());
    within(30, move || rt().block_on(check));
    within(30, check);
}

/// A socket handed to std and back (`into_std` / `from_std`) while a
/// fiber is parked on a `try_clone` of it: the parked fiber still gets its
/// data, the re-adopted handle works, and once the clone is gone
/// `into_std` gives a blocking std socket again.
#[test]
fn round_trips_through_std_while_a_clone_is_parked() {
    within(30, || {
        rt().block_on(|| {
            let (mut c, s) = tcp_pair();
            let clone = s.try_clone().unwrap();
            let parked = fiber::spawn(move || {
                let mut buf = [0u8; 5];
                (&clone).read_exact(&mut buf).map(|()| buf)
            });
            fiber::sleep(ms(50)).unwrap();
            let std_s = s.into_std().unwrap();
            let s = TcpStream::from_std(std_s).unwrap();
            c.write_all(b"first").unwrap();
            assert_eq!(&parked.join().unwrap().unwrap(), b"first");
            c.write_all(b"again").unwrap();
            let mut buf = [0u8; 5];
            (&s).read_exact(&mut buf).unwrap();
            assert_eq!(&buf, b"again");
            let std_s = s.into_std().unwrap();
            assert!(!is_nonblocking_fd(std_s.as_raw_fd()));
        })
    });
}

/// What std does on Linux: a listener's blocking `accept` obeys the
/// socket's `SO_RCVTIMEO` (set with socket2 or `setsockopt` before the
/// listener is handed over), failing with `WouldBlock` when it expires; a
/// fiber listener adopted with `from_std` parks for ever instead.
#[test]
/// Was (before the fix): TcpListener/UnixListener::from_std ignore the listener's SO_RCVTIMEO, so accept parks past it (std: WouldBlock after the timeout)
fn an_adopted_listener_s_accept_obeys_its_so_rcvtimeo_like_std() {
    // std reference, TCP and unix.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    set_sock_timeout(l.as_raw_fd(), libc::SO_RCVTIMEO, ms(100));
    assert_eq!(l.accept().unwrap_err().kind(), ErrorKind::WouldBlock);
    let path = temp_path("rcvtimeo-std");
    let u = std::os::unix::net::UnixListener::bind(&path).unwrap();
    set_sock_timeout(u.as_raw_fd(), libc::SO_RCVTIMEO, ms(100));
    assert_eq!(u.accept().unwrap_err().kind(), ErrorKind::WouldBlock);
    let _ = std::fs::remove_file(&path);

    within(30, move || {
        rt().block_on(move || {
            let l = TcpListener::from_std(l).unwrap();
            let path = temp_path("rcvtimeo-fiber");
            let u = std::os::unix::net::UnixListener::bind(&path).unwrap();
            set_sock_timeout(u.as_raw_fd(), libc::SO_RCVTIMEO, ms(100));
            let u = UnixListener::from_std(u).unwrap();
            let (tx, rx) = fiber::chan::bounded(2);
            let tx2 = tx.clone();
            let a = fiber::spawn(move || {
                let _ = tx.send(("tcp", l.accept().map(drop).map_err(|e| e.kind())));
            });
            let b = fiber::spawn(move || {
                let _ = tx2.send(("unix", u.accept().map(drop).map_err(|e| e.kind())));
            });
            let first = rx.recv_timeout(Duration::from_secs(2));
            let second = rx.recv_timeout(ms(500));
            a.cancel();
            b.cancel();
            let _ = (a.join(), b.join());
            let _ = std::fs::remove_file(&path);
            assert!(matches!(first, Ok((_, Err(ErrorKind::WouldBlock)))), "{first:?}");
            assert!(matches!(second, Ok((_, Err(ErrorKind::WouldBlock)))), "{second:?}");
        })
    });
}

/// What std does on Linux: a TCP `peek` into an empty buffer on a socket
/// with a read timeout and no data returns `Ok(0)` when the timeout
/// expires (a blocking `recv(MSG_PEEK)` of 0 bytes, like the empty `read`
/// that fiber already matches); `read_vectored` with no room returns
/// `Ok(0)` at once.
#[test]
/// Was (before the fix): TCP peek(&mut []) whose read timeout expires returns Err(WouldBlock) where std returns Ok(0) (peek skips the empty_read rule that read has)
fn empty_peek_and_empty_read_vectored_with_a_timeout_match_std() {
    fn run(
        peek: impl Fn(&mut [u8]) -> std::io::Result<usize>,
        readv: impl Fn() -> std::io::Result<usize>,
    ) -> (Result<usize, ErrorKind>, Result<usize, ErrorKind>) {
        (peek(&mut []).map_err(|e| e.kind()), readv().map_err(|e| e.kind()))
    }
    let expected = within(30, || {
        let (_c, s) = std_tcp_pair();
        s.set_read_timeout(Some(ms(100))).unwrap();
        run(|b| s.peek(b), || (&s).read_vectored(&mut []))
    });
    let check = move || {
        let (_c, s) = tcp_pair();
        s.set_read_timeout(Some(ms(100))).unwrap();
        assert_eq!(run(|b| s.peek(b), || (&s).read_vectored(&mut [])), expected);
    };
    within(30, move || rt().block_on(check));
    within(30, check);
}

/// A plain thread and a fiber both blocked in `accept` on one listener:
/// each connection goes to exactly one of them, and the second connection
/// reaches the one still waiting.
#[test]
fn a_plain_thread_and_a_fiber_accepting_on_one_listener_each_get_one() {
    within(30, || {
        rt().block_on(|| {
            let l = Arc::new(TcpListener::bind("127.0.0.1:0").unwrap());
            let addr = l.local_addr().unwrap();
            let (tx, rx) = fiber::chan::unbounded::<(&'static str, SocketAddr)>();
            let (l1, tx1) = (l.clone(), tx.clone());
            let t = std::thread::spawn(move || {
                let (_s, peer) = l1.accept().unwrap();
                tx1.send(("thread", peer)).unwrap();
            });
            let (l2, tx2) = (l.clone(), tx);
            let f = fiber::spawn(move || {
                let (_s, peer) = l2.accept().unwrap();
                tx2.send(("fiber", peer)).unwrap();
            });
            fiber::sleep(ms(50)).unwrap();
            let c1 = TcpStream::connect(addr).unwrap();
            let first = rx.recv_timeout(Duration::from_secs(5)).unwrap();
            assert_eq!(first.1, c1.local_addr().unwrap());
            let c2 = TcpStream::connect(addr).unwrap();
            let second = rx
                .recv_timeout(Duration::from_secs(5))
                .expect("the second acceptor never got the second connection");
            assert_eq!(second.1, c2.local_addr().unwrap());
            assert_ne!(first.0, second.0);
            t.join().unwrap();
            f.join().unwrap();
        })
    });
}

/// Two fibers parked writing to one full stream; one is cancelled; once
/// the peer reads, the other's write completes, and the bytes the peer
/// gets are the pre-filled ones followed by the surviving writer's.
#[test]
fn cancelling_one_of_two_parked_writers_leaves_the_other_to_finish() {
    within(30, || {
        rt().block_on(|| {
            let (c, s) = tcp_pair();
            s.set_nonblocking(true).unwrap();
            let mut filled = 0usize;
            while let Ok(n) = (&s).write(&[0u8; 65536]) {
                filled += n;
            }
            s.set_nonblocking(false).unwrap();
            let s = Arc::new(s);
            let (a, b) = (s.clone(), s.clone());
            let wa = fiber::spawn(move || (&*a).write_all(&[1u8; 1000]).map_err(|e| e.kind()));
            let wb = fiber::spawn(move || (&*b).write_all(&[2u8; 1000]).map_err(|e| e.kind()));
            fiber::sleep(ms(50)).unwrap();
            wa.cancel();
            let a_result = wa.join();
            let reader = std::thread::spawn(move || {
                let mut c = c;
                c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let mut got = vec![0u8; filled + 1000];
                c.read_exact(&mut got).map(|()| got)
            });
            assert_eq!(wb.join().unwrap(), Ok(()));
            let got = reader.join().unwrap().expect("the surviving writer's bytes never came");
            assert!(got[..filled].iter().all(|&b| b == 0));
            // The cancelled writer wrote nothing (it was parked), so the
            // next 1000 bytes are all the survivor's.
            if matches!(a_result, Err(ref e) if e.is_cancelled()) || matches!(a_result, Ok(Err(ErrorKind::Other))) {
                assert!(got[filled..].iter().all(|&b| b == 2));
            }
        })
    });
}

/// std: every call that would wait on a socket set non-blocking returns
/// `WouldBlock` at once, for the unix types too (accept, stream read,
/// peek, datagram recv/recv_from, and a datagram send to a full peer),
/// and an empty-buffer receive on a datagram socket with a read timeout
/// fails with `WouldBlock` (unlike TCP's empty read). Compared with std.
#[test]
fn unix_and_udp_nonblocking_and_empty_receives_match_std() {
    type Row = Vec<Result<usize, ErrorKind>>;
    fn k<T>(r: std::io::Result<T>, f: impl Fn(T) -> usize) -> Result<usize, ErrorKind> {
        r.map(f).map_err(|e| e.kind())
    }
    let expected: Row = within(30, || {
        use std::os::unix::net as un;
        let path = temp_path("nb-std");
        let l = un::UnixListener::bind(&path).unwrap();
        l.set_nonblocking(true).unwrap();
        let (a, _b) = un::UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        let (da, db) = un::UnixDatagram::pair().unwrap();
        da.set_nonblocking(true).unwrap();
        db.set_nonblocking(true).unwrap();
        while db.send(b"fill").is_ok() {}
        let u = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        u.set_read_timeout(Some(ms(50))).unwrap();
        let (ta, _tb) = un::UnixDatagram::pair().unwrap();
        ta.set_read_timeout(Some(ms(50))).unwrap();
        let row = vec![
            k(l.accept(), |_| 0),
            k((&a).read(&mut [0u8; 4]), |n| n),
            k(da.recv_from(&mut [0u8; 4]), |p| p.0),
            k(db.send(b"more"), |n| n),
            k(u.recv(&mut []), |n| n),
            k(u.recv_from(&mut []), |p| p.0),
            k(ta.recv(&mut []), |n| n),
        ];
        let _ = std::fs::remove_file(&path);
        row
    });
    let check = move || {
        let path = temp_path(&format!("nb-{:?}", std::thread::current().id()));
        let l = UnixListener::bind(&path).unwrap();
        l.set_nonblocking(true).unwrap();
        let (a, _b) = UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        let (da, db) = UnixDatagram::pair().unwrap();
        da.set_nonblocking(true).unwrap();
        db.set_nonblocking(true).unwrap();
        while db.send(b"fill").is_ok() {}
        let u = UdpSocket::bind("127.0.0.1:0").unwrap();
        u.set_read_timeout(Some(ms(50))).unwrap();
        let (ta, _tb) = UnixDatagram::pair().unwrap();
        ta.set_read_timeout(Some(ms(50))).unwrap();
        let row: Row = vec![
            k(l.accept(), |_| 0),
            k((&a).read(&mut [0u8; 4]), |n| n),
            k(da.recv_from(&mut [0u8; 4]), |p| p.0),
            k(db.send(b"more"), |n| n),
            k(u.recv(&mut []), |n| n),
            k(u.recv_from(&mut []), |p| p.0),
            k(ta.recv(&mut []), |n| n),
        ];
        let _ = std::fs::remove_file(&path);
        assert_eq!(row, expected);
    };
    let c2 = check.clone();
    within(30, move || rt().block_on(c2));
    within(30, check);
}

/// std's `TcpListener::incoming` iterator is a `FusedIterator` (since
/// Rust 1.64), so generic code that asks for one takes it; fiber's
/// `Incoming` should be one too for a port to stay an import change.
/// (Checked with autoref specialisation, so the file compiles either way.)
#[test]
/// Was (before the fix): fiber::net::Incoming does not implement FusedIterator (std::net::Incoming does)
fn tcp_incoming_is_a_fused_iterator_like_std() {
    fn fused<T: std::iter::FusedIterator>() {}
    fused::<std::net::Incoming<'static>>();
    fused::<fiber::net::Incoming<'static>>();
    fused::<fiber::net::unix::Incoming<'static>>();
}

/// Autoref-specialisation probe: does `$t` implement `$($bound)+`?
macro_rules! implements {
    ($t:ty : $($bound:tt)+) => {{
        #[allow(dead_code)]
        struct Probe<T: ?Sized>(std::marker::PhantomData<T>);
        #[allow(dead_code)]
        trait Yes {
            fn get(&self) -> bool {
                true
            }
        }
        impl<T: ?Sized + $($bound)+> Yes for Probe<T> {}
        #[allow(dead_code)]
        trait No {
            fn get(&self) -> bool {
                false
            }
        }
        impl<T: ?Sized> No for &Probe<T> {}
        (&Probe::<$t>(std::marker::PhantomData)).get()
    }};
}

/// The traits std's socket types implement, one by one, for fiber's twin
/// types: every one std has, fiber's should have (a port is an import
/// change). Lists the missing ones.
#[test]
/// Was (before the fix): &fiber::net::unix::UnixListener is not IntoIterator (std's is: `for s in &listener`), as unix incoming() returns an unnamed impl Iterator instead of an Incoming type
fn socket_types_implement_the_traits_std_s_implement() {
    macro_rules! compare {
        ($missing:ident, $ours:ty, $std:ty, [$($name:literal => ($($bound:tt)+)),* $(,)?]) => {
            $(
                if implements!($std : $($bound)+) && !implements!($ours : $($bound)+) {
                    $missing.push(format!("{}: {}", stringify!($ours), $name));
                }
            )*
        };
    }
    let mut missing: Vec<String> = Vec::new();
    macro_rules! common_traits {
        ($ours:ty, $std:ty) => {
            compare!(missing, $ours, $std, [
                "Send" => (Send), "Sync" => (Sync),
                "UnwindSafe" => (std::panic::UnwindSafe),
                "RefUnwindSafe" => (std::panic::RefUnwindSafe),
                "Debug" => (std::fmt::Debug),
                "AsFd" => (std::os::fd::AsFd), "AsRawFd" => (std::os::fd::AsRawFd),
                "FromRawFd" => (std::os::fd::FromRawFd), "IntoRawFd" => (std::os::fd::IntoRawFd),
                "From<OwnedFd>" => (From<OwnedFd>), "Into<OwnedFd>" => (Into<OwnedFd>),
                "Read" => (Read), "Write" => (Write),
            ]);
        };
    }
    common_traits!(TcpStream, std::net::TcpStream);
    common_traits!(TcpListener, std::net::TcpListener);
    common_traits!(UdpSocket, std::net::UdpSocket);
    common_traits!(UnixStream, std::os::unix::net::UnixStream);
    common_traits!(UnixListener, std::os::unix::net::UnixListener);
    common_traits!(UnixDatagram, std::os::unix::net::UnixDatagram);
    compare!(missing, &'static TcpStream, &'static std::net::TcpStream, ["Read" => (Read), "Write" => (Write)]);
    compare!(missing, &'static UnixStream, &'static std::os::unix::net::UnixStream, ["Read" => (Read), "Write" => (Write)]);
    compare!(missing, &'static UnixListener, &'static std::os::unix::net::UnixListener, ["IntoIterator" => (IntoIterator)]);
    compare!(missing, &'static TcpListener, &'static std::net::TcpListener, ["IntoIterator" => (IntoIterator)]);
    compare!(missing, fiber::net::Incoming<'static>, std::net::Incoming<'static>, [
        "Send" => (Send), "Sync" => (Sync), "Debug" => (std::fmt::Debug),
    ]);
    assert!(missing.is_empty(), "missing: {missing:?}");
}

/// Unix datagram and stream edge results compared with std's: a receive
/// on a datagram socket whose connected peer is gone (with a timeout), a
/// send to it, a zero-length datagram, a stream connect to a datagram
/// socket's path and a datagram send to a stream listener's path.
#[test]
fn unix_dead_peers_wrong_socket_types_and_empty_datagrams_match_std() {
    type Row = Vec<Result<usize, ErrorKind>>;
    fn k<T>(r: std::io::Result<T>, f: impl Fn(T) -> usize) -> Result<usize, ErrorKind> {
        r.map(f).map_err(|e| e.kind())
    }
    let expected: Row = within(30, || {
        use std::os::unix::net as un;
        let (a, b) = un::UnixDatagram::pair().unwrap();
        a.set_read_timeout(Some(ms(100))).unwrap();
        drop(b);
        let dpath = temp_path("types-std-d");
        let spath = temp_path("types-std-s");
        let d = un::UnixDatagram::bind(&dpath).unwrap();
        let _l = un::UnixListener::bind(&spath).unwrap();
        let (e1, e2) = un::UnixDatagram::pair().unwrap();
        let sender = un::UnixDatagram::unbound().unwrap();
        let row = vec![
            k(a.recv(&mut [0u8; 4]), |n| n),
            k(a.send(b"x"), |n| n),
            k(a.recv(&mut [0u8; 4]), |n| n),
            k(e1.send(b""), |n| n),
            k(e2.recv(&mut [0u8; 4]), |n| n),
            k(un::UnixStream::connect(&dpath), |_| 0),
            k(sender.send_to(b"x", &spath), |n| n),
        ];
        drop(d);
        let _ = std::fs::remove_file(&dpath);
        let _ = std::fs::remove_file(&spath);
        row
    });
    let check = move || {
        let tag = format!("{:?}", std::thread::current().id());
        let (a, b) = UnixDatagram::pair().unwrap();
        a.set_read_timeout(Some(ms(100))).unwrap();
        drop(b);
        let dpath = temp_path(&format!("types-d-{tag}"));
        let spath = temp_path(&format!("types-s-{tag}"));
        let d = UnixDatagram::bind(&dpath).unwrap();
        let _l = UnixListener::bind(&spath).unwrap();
        let (e1, e2) = UnixDatagram::pair().unwrap();
        let sender = UnixDatagram::unbound().unwrap();
        let row: Row = vec![
            k(a.recv(&mut [0u8; 4]), |n| n),
            k(a.send(b"x"), |n| n),
            k(a.recv(&mut [0u8; 4]), |n| n),
            k(e1.send(b""), |n| n),
            k(e2.recv(&mut [0u8; 4]), |n| n),
            k(UnixStream::connect(&dpath), |_| 0),
            k(sender.send_to(b"x", &spath), |n| n),
        ];
        drop(d);
        let _ = std::fs::remove_file(&dpath);
        let _ = std::fs::remove_file(&spath);
        assert_eq!(row, expected);
    };
    let c2 = check.clone();
    within(30, move || rt().block_on(c2));
    within(30, check);
}

/// A connected UDP socket sending to a closed port: Linux reports the
/// ICMP error on the next call, whichever it is. The sequence send,
/// (ICMP arrives), send, recv with a timeout, take_error, send gives
/// std's results step by step.
#[test]
fn udp_refusals_surface_on_the_next_call_like_std() {
    type Row = Vec<Result<usize, ErrorKind>>;
    fn k<T>(r: std::io::Result<T>, f: impl Fn(T) -> usize) -> Result<usize, ErrorKind> {
        r.map(f).map_err(|e| e.kind())
    }
    let dead = {
        let u = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        u.local_addr().unwrap()
    };
    let expected: Row = within(30, move || {
        let u = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        u.connect(dead).unwrap();
        u.set_read_timeout(Some(ms(100))).unwrap();
        let first = k(u.send(b"a"), |n| n);
        std::thread::sleep(ms(100));
        vec![
            first,
            k(u.send(b"b"), |n| n),
            k(u.recv(&mut [0u8; 4]), |n| n),
            k(u.send(b"c"), |n| n),
            {
                std::thread::sleep(ms(100));
                k(u.take_error(), |e| e.map_or(0, |_| 1))
            },
            k(u.recv(&mut [0u8; 4]), |n| n),
        ]
    });
    let check = move || {
        let u = UdpSocket::bind("127.0.0.1:0").unwrap();
        u.connect(dead).unwrap();
        u.set_read_timeout(Some(ms(100))).unwrap();
        let first = k(u.send(b"a"), |n| n);
        std::thread::sleep(ms(100));
        let row: Row = vec![
            first,
            k(u.send(b"b"), |n| n),
            k(u.recv(&mut [0u8; 4]), |n| n),
            k(u.send(b"c"), |n| n),
            {
                std::thread::sleep(ms(100));
                k(u.take_error(), |e| e.map_or(0, |_| 1))
            },
            k(u.recv(&mut [0u8; 4]), |n| n),
        ];
        assert_eq!(row, expected);
    };
    let c2 = check.clone();
    within(30, move || rt().block_on(c2));
    within(30, check);
}

/// The peer writes and then resets the connection (`SO_LINGER` 0): the
/// reads that follow (data first, then the reset, then what comes after)
/// and a write give std's results step by step, also when the reader was
/// parked before the data came.
#[test]
fn reads_after_a_peer_reset_match_std() {
    type Row = Vec<Result<usize, ErrorKind>>;
    fn steps(s: &mut dyn Read, w: &mut dyn Write) -> Row {
        let mut buf = [0u8; 16];
        let mut row: Row = (0..3).map(|_| s.read(&mut buf).map_err(|e| e.kind())).collect();
        row.push(w.write(b"x").map_err(|e| e.kind()));
        row
    }
    let expected: Row = within(30, || {
        let (mut c, s) = std_tcp_pair();
        c.write_all(b"hello").unwrap();
        crate::common::sockets::reset_on_close(c.as_raw_fd());
        drop(c);
        std::thread::sleep(ms(100));
        let mut w = s.try_clone().unwrap();
        steps(&mut &s, &mut w)
    });
    let exp2 = expected.clone();
    let check = move || {
        // Reader reading after the reset.
        let (mut c, s) = tcp_pair();
        c.write_all(b"hello").unwrap();
        crate::common::sockets::reset_on_close(c.as_raw_fd());
        drop(c);
        std::thread::sleep(ms(100));
        let mut w = s.try_clone().unwrap();
        assert_eq!(steps(&mut &s, &mut w), exp2);
    };
    let c2 = check.clone();
    within(30, move || rt().block_on(c2));
    within(30, check);
    // Reader parked before the data and the reset arrive.
    within(30, move || {
        rt().block_on(move || {
            let (c, s) = tcp_pair();
            let s = Arc::new(s);
            let r = s.clone();
            let reader = fiber::spawn(move || {
                let mut buf = [0u8; 16];
                (&*r).read(&mut buf).map_err(|e| e.kind())
            });
            fiber::sleep(ms(50)).unwrap();
            let mut c = c;
            c.write_all(b"hello").unwrap();
            crate::common::sockets::reset_on_close(c.as_raw_fd());
            drop(c);
            let first = reader.join().unwrap();
            fiber::sleep(ms(100)).unwrap();
            let mut buf = [0u8; 16];
            let mut row: Row = vec![first];
            row.extend((0..2).map(|_| (&*s).read(&mut buf).map_err(|e| e.kind())));
            row.push((&*s).write(b"x").map_err(|e| e.kind()));
            assert_eq!(row, expected);
        })
    });
}
