//! Conformance with the documented behaviour of `std::net` (and
//! `std::os::unix::net`) for `fiber::net`, whose sockets claim std's API:
//! each rule runs inside a fiber runtime and on a plain thread.

use fiber::net::unix::{UnixDatagram, UnixStream};
use fiber::net::{TcpListener, TcpStream, UdpSocket};
use std::io::{ErrorKind, Read, Write};
use std::net::Shutdown;
use std::time::Duration;

use crate::common::{ms, rt, within};

/// `body` in a fiber of a two-worker runtime, then on a plain thread.
fn in_fiber_and_thread(body: fn()) {
    within(30, move || rt().block_on(body));
    within(30, body);
}

/// A connected pair over 127.0.0.1 (ephemeral port).
fn tcp_pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let client = TcpStream::connect(addr).unwrap();
    let (server, peer) = listener.accept().unwrap();
    assert_eq!(peer, client.local_addr().unwrap());
    (client, server)
}

/// std: binding port 0 picks a free port that `local_addr` reports; the
/// accepted stream's `peer_addr` is the client's `local_addr` and vice
/// versa; `incoming()` yields one stream per connection.
#[test]
fn bind_port_zero_addresses_and_incoming() {
    in_fiber_and_thread(|| {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        assert!(addr.ip().is_loopback() && addr.port() != 0);
        let clients: Vec<_> = (0..3).map(|_| TcpStream::connect(addr).unwrap()).collect();
        let accepted: Vec<_> = listener.incoming().take(3).map(|s| s.unwrap()).collect();
        let mut client_ports: Vec<_> = clients.iter().map(|c| c.local_addr().unwrap()).collect();
        let mut peer_ports: Vec<_> = accepted.iter().map(|s| s.peer_addr().unwrap()).collect();
        client_ports.sort();
        peer_ports.sort();
        assert_eq!(client_ports, peer_ports);
        for c in &clients {
            assert_eq!(c.peer_addr().unwrap(), addr);
        }
        assert!(listener.take_error().unwrap().is_none());
        listener.set_ttl(42).unwrap();
        assert_eq!(listener.ttl().unwrap(), 42);
    });
}

/// std: `connect` to a port nobody listens on fails with
/// `ConnectionRefused`.
#[test]
fn connect_to_a_closed_port_is_connection_refused() {
    in_fiber_and_thread(|| {
        let addr = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let err = TcpStream::connect(addr).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ConnectionRefused, "{err}");
        let err = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ConnectionRefused, "{err}");
    });
}

/// std: a zero timeout is `InvalidInput` for `set_read_timeout`,
/// `set_write_timeout` and `connect_timeout`; getters report what was set;
/// an expired read timeout is `WouldBlock` (or `TimedOut`) and leaves the
/// stream usable; `Duration::MAX` is accepted and does not expire.
#[test]
fn tcp_timeouts_are_std_s() {
    in_fiber_and_thread(|| {
        let (client, server) = tcp_pair();
        for r in [
            client.set_read_timeout(Some(Duration::ZERO)),
            client.set_write_timeout(Some(Duration::ZERO)),
        ] {
            assert_eq!(r.unwrap_err().kind(), ErrorKind::InvalidInput);
        }
        let addr = server.local_addr().unwrap();
        let err = TcpStream::connect_timeout(&addr, Duration::ZERO).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
        assert_eq!(client.read_timeout().unwrap(), None);
        assert_eq!(client.write_timeout().unwrap(), None);
        client.set_read_timeout(Some(ms(30))).unwrap();
        client.set_write_timeout(Some(ms(40))).unwrap();
        assert_eq!(client.read_timeout().unwrap(), std_rounded(ms(30)));
        assert_eq!(client.write_timeout().unwrap(), std_rounded(ms(40)));
        let mut buf = [0u8; 8];
        let err = (&client).read(&mut buf).unwrap_err();
        assert!(
            matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
            "expired read timeout: {err:?}"
        );
        (&server).write_all(b"late").unwrap();
        let mut got = [0u8; 4];
        (&client).read_exact(&mut got).unwrap();
        assert_eq!(&got, b"late");
        client.set_read_timeout(Some(Duration::MAX)).unwrap();
        (&server).write_all(b"x").unwrap();
        assert_eq!((&client).read(&mut buf).unwrap(), 1);
        client.set_read_timeout(None).unwrap();
        assert_eq!(client.read_timeout().unwrap(), None);
    });
}

/// std: reading a stream whose peer closed returns `Ok(0)` (after the data
/// sent before the close); `shutdown(Write)` gives the peer end-of-file
/// while the other direction keeps working; `shutdown(Read)` makes local
/// reads return `Ok(0)`; an empty write returns `Ok(0)`. (An empty read
/// waits for data, as a blocking std socket's does on Linux.)
#[test]
fn eof_shutdown_and_empty_buffers_are_std_s() {
    in_fiber_and_thread(|| {
        let (mut client, mut server) = tcp_pair();
        assert_eq!(client.write(&[]).unwrap(), 0);
        client.write_all(b"bye").unwrap();
        client.shutdown(Shutdown::Write).unwrap();
        let mut all = Vec::new();
        server.read_to_end(&mut all).unwrap();
        assert_eq!(all, b"bye");
        assert_eq!(server.read(&mut [0; 4]).unwrap(), 0, "EOF again");
        server.write_all(b"still").unwrap();
        let mut got = [0u8; 5];
        client.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"still");
        drop(server);
        assert_eq!(client.read(&mut [0; 4]).unwrap(), 0, "peer closed");
        let (client, _server) = tcp_pair();
        client.shutdown(Shutdown::Read).unwrap();
        assert_eq!((&client).read(&mut [0; 4]).unwrap(), 0, "after shutdown(Read)");
    });
}

/// std: `peek` returns data without consuming it; `try_clone` gives a
/// second handle on the same stream, and options set on one handle are
/// seen by the other ("options set on one stream will be propagated to the
/// other stream").
#[test]
fn peek_and_try_clone_are_std_s() {
    in_fiber_and_thread(|| {
        let (client, server) = tcp_pair();
        (&client).write_all(b"hello").unwrap();
        let mut buf = [0u8; 5];
        let mut seen = 0;
        while seen < 5 {
            seen = server.peek(&mut buf).unwrap();
        }
        assert_eq!(&buf, b"hello");
        let clone = server.try_clone().unwrap();
        let mut got = [0u8; 5];
        (&clone).read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hello", "peek consumed the data");
        (&server).write_all(b"via original").unwrap();
        drop(server);
        (&clone).write_all(b" and clone").unwrap();
        drop(clone);
        let mut all = String::new();
        (&client).read_to_string(&mut all).unwrap();
        assert_eq!(all, "via original and clone");
        // Options are the socket's, shared by both handles.
        let (client, _server) = tcp_pair();
        let clone = client.try_clone().unwrap();
        client.set_nodelay(true).unwrap();
        assert!(clone.nodelay().unwrap());
        client.set_read_timeout(Some(ms(20))).unwrap();
        assert_eq!(
            clone.read_timeout().unwrap(),
            Some(ms(20)),
            "read timeout not shared with the clone"
        );
        let err = (&clone).read(&mut [0; 1]).unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut));
        clone.set_nonblocking(true).unwrap();
        let err = (&client).read(&mut [0; 1]).unwrap_err();
        assert_eq!(
            err.kind(),
            ErrorKind::WouldBlock,
            "nonblocking not shared with the original"
        );
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let twin = listener.try_clone().unwrap();
        twin.set_nonblocking(true).unwrap();
        assert_eq!(listener.accept().unwrap_err().kind(), ErrorKind::WouldBlock);
    });
}

/// std: nonblocking sockets return `WouldBlock` instead of waiting, and
/// `set_nonblocking(false)` makes them wait again.
#[test]
fn nonblocking_mode_is_std_s() {
    in_fiber_and_thread(|| {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        assert_eq!(listener.accept().unwrap_err().kind(), ErrorKind::WouldBlock);
        let addr = listener.local_addr().unwrap();
        let client = TcpStream::connect(addr).unwrap();
        listener.set_nonblocking(false).unwrap();
        let (server, _) = listener.accept().unwrap();
        client.set_nonblocking(true).unwrap();
        assert_eq!((&client).read(&mut [0; 1]).unwrap_err().kind(), ErrorKind::WouldBlock);
        client.set_nonblocking(false).unwrap();
        (&server).write_all(b"z").unwrap();
        assert_eq!((&client).read(&mut [0; 1]).unwrap(), 1);
        let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
        udp.set_nonblocking(true).unwrap();
        assert_eq!(udp.recv_from(&mut [0; 1]).unwrap_err().kind(), ErrorKind::WouldBlock);
    });
}

/// std: `recv_from` with a buffer smaller than the datagram fills the
/// buffer and discards the rest (the next call gets the next datagram);
/// `peek_from` does not consume; an empty datagram is received as 0
/// bytes; `connect` filters senders and enables `send`/`recv`; a zero
/// timeout is `InvalidInput`; an expired read timeout is `WouldBlock`.
#[test]
fn udp_is_std_s() {
    in_fiber_and_thread(|| {
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b_addr = b.local_addr().unwrap();
        assert_eq!(a.send_to(b"0123456789", b_addr).unwrap(), 10);
        assert_eq!(a.send_to(b"next", b_addr).unwrap(), 4);
        assert_eq!(a.send_to(b"", b_addr).unwrap(), 0);
        let mut small = [0u8; 4];
        let (n, from) = b.peek_from(&mut small).unwrap();
        assert_eq!((n, &small[..n], from), (4, &b"0123"[..], a.local_addr().unwrap()));
        let (n, _) = b.recv_from(&mut small).unwrap();
        assert_eq!(&small[..n], b"0123", "truncated to the buffer");
        let mut big = [0u8; 64];
        let (n, _) = b.recv_from(&mut big).unwrap();
        assert_eq!(&big[..n], b"next", "the rest of a truncated datagram was not discarded");
        let (n, _) = b.recv_from(&mut big).unwrap();
        assert_eq!(n, 0, "an empty datagram");
        // connect: send/recv with the peer; other senders are filtered.
        let c = UdpSocket::bind("127.0.0.1:0").unwrap();
        b.connect(a.local_addr().unwrap()).unwrap();
        assert_eq!(b.peer_addr().unwrap(), a.local_addr().unwrap());
        c.send_to(b"stranger", b_addr).unwrap();
        a.send_to(b"friend", b_addr).unwrap();
        let n = b.recv(&mut big).unwrap();
        assert_eq!(&big[..n], b"friend");
        b.send(b"reply").unwrap();
        let (n, from) = a.recv_from(&mut big).unwrap();
        assert_eq!((&big[..n], from), (&b"reply"[..], b_addr));
        // peer_addr of an unconnected socket: NotConnected.
        assert_eq!(a.peer_addr().unwrap_err().kind(), ErrorKind::NotConnected);
        assert_eq!(
            a.set_read_timeout(Some(Duration::ZERO)).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
        assert_eq!(
            a.set_write_timeout(Some(Duration::ZERO)).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
        a.set_read_timeout(Some(ms(20))).unwrap();
        assert_eq!(a.read_timeout().unwrap(), std_rounded(ms(20)));
        let err = a.recv_from(&mut big).unwrap_err();
        assert!(
            matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
            "{err:?}"
        );
        let twin = a.try_clone().unwrap();
        assert_eq!(
            twin.read_timeout().unwrap(),
            Some(ms(20)),
            "UDP read timeout not shared with the clone"
        );
        a.set_broadcast(true).unwrap();
        assert!(twin.broadcast().unwrap());
    });
}

/// `std::os::unix::net`: a stream pair carries data both ways, EOF after
/// the peer drops; datagram pairs keep message boundaries and truncate.
#[test]
fn unix_sockets_are_std_s() {
    in_fiber_and_thread(|| {
        let (mut x, mut y) = UnixStream::pair().unwrap();
        x.write_all(b"ping").unwrap();
        let mut buf = [0u8; 4];
        y.read_exact(&mut buf).unwrap();
        y.write_all(b"pong").unwrap();
        x.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"pong");
        assert_eq!(
            x.set_read_timeout(Some(Duration::ZERO)).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
        drop(y);
        assert_eq!(x.read(&mut buf).unwrap(), 0);
        let (p, q) = UnixDatagram::pair().unwrap();
        p.send(b"abcdef").unwrap();
        p.send(b"gh").unwrap();
        let mut small = [0u8; 3];
        assert_eq!(q.recv(&mut small).unwrap(), 3);
        assert_eq!(&small, b"abc");
        assert_eq!(q.recv(&mut small).unwrap(), 2);
        assert_eq!(&small[..2], b"gh");
    });
}

/// std: binding an address a listener holds is `AddrInUse`; `connect`
/// tries each address in turn and returns the first that connects; a
/// write timeout expires with `WouldBlock` (or `TimedOut`) once the
/// peer stops reading and the buffers are full.
#[test]
fn addr_in_use_address_lists_and_write_timeouts_are_std_s() {
    in_fiber_and_thread(|| {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        assert_eq!(TcpListener::bind(addr).unwrap_err().kind(), ErrorKind::AddrInUse);
        let closed = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let client = TcpStream::connect(&[closed, addr][..]).unwrap();
        assert_eq!(client.peer_addr().unwrap(), addr);
        let (_server, _) = listener.accept().unwrap();
        client.set_write_timeout(Some(ms(20))).unwrap();
        let chunk = vec![7u8; 1 << 16];
        let mut written = 0usize;
        let err = loop {
            match (&client).write(&chunk) {
                Ok(n) => written += n,
                Err(e) => break e,
            }
            assert!(written < 1 << 30, "wrote 1 GiB to a peer that never reads");
        };
        assert!(
            matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
            "expired write timeout: {err:?}"
        );
    });
}

/// std on Linux: a connected UDP socket whose datagram was refused (ICMP
/// port unreachable) reports `ConnectionRefused` on its next `recv`, also
/// when the `recv` was already waiting when the error arrived.
#[test]
fn udp_refused_datagram_wakes_a_waiting_recv_with_the_error() {
    in_fiber_and_thread(|| {
        let closed = std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let socket = std::sync::Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
        socket.connect(closed).unwrap();
        let s = socket.clone();
        let recv = move || s.recv(&mut [0; 8]);
        // Wait until the receiver (or another test's socket) is parked.
        let parked = || fiber::net::io_waiters() > 0;
        let result = if fiber::core::in_fiber() {
            let receiver = fiber::spawn(recv);
            while !parked() && !receiver.is_finished() {
                fiber::yield_now().unwrap();
            }
            socket.send(b"x").unwrap();
            receiver.join().unwrap()
        } else {
            let receiver = std::thread::spawn(recv);
            while !parked() && !receiver.is_finished() {
                std::thread::yield_now();
            }
            socket.send(b"x").unwrap();
            receiver.join().unwrap()
        };
        let err = result.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ConnectionRefused, "{err:?}");
    });
}

/// std's stable socket calls that `fiber::net` lacked: UDP multicast
/// options and group membership; the rest of `UnixDatagram`'s calls
/// (`try_clone`, timeouts' getters, `set_nonblocking`, `take_error`) and
/// the `*_addr` forms taking a `std::os::unix::net::SocketAddr`.
#[test]
fn udp_multicast_options_and_the_rest_of_unix_sockets_are_std_s() {
    in_fiber_and_thread(|| {
        let udp = UdpSocket::bind("0.0.0.0:0").unwrap();
        udp.set_multicast_loop_v4(false).unwrap();
        assert!(!udp.multicast_loop_v4().unwrap());
        udp.set_multicast_ttl_v4(7).unwrap();
        assert_eq!(udp.multicast_ttl_v4().unwrap(), 7);
        let group = std::net::Ipv4Addr::new(239, 255, 42, 99);
        // Joining needs a multicast-capable interface; where there is one
        // (loopback usually is not), leaving must work too.
        if udp.join_multicast_v4(&group, &std::net::Ipv4Addr::UNSPECIFIED).is_ok() {
            udp.leave_multicast_v4(&group, &std::net::Ipv4Addr::UNSPECIFIED)
                .unwrap();
        }
        if let Ok(v6) = UdpSocket::bind("[::1]:0") {
            v6.set_multicast_loop_v6(false).unwrap();
            assert!(!v6.multicast_loop_v6().unwrap());
            let g6: std::net::Ipv6Addr = "ff02::1:3".parse().unwrap();
            if v6.join_multicast_v6(&g6, 0).is_ok() {
                v6.leave_multicast_v6(&g6, 0).unwrap();
            }
        }

        let dir = std::env::temp_dir().join(format!(
            "fiber-conf-{}-{}",
            std::process::id(),
            if fiber::core::in_fiber() { "f" } else { "t" }
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let a = UnixDatagram::bind(dir.join("a")).unwrap();
        let b_addr = std::os::unix::net::SocketAddr::from_pathname(dir.join("b")).unwrap();
        let b = UnixDatagram::bind_addr(&b_addr).unwrap();
        assert!(a.take_error().unwrap().is_none());
        a.send_to_addr(b"to b", &b_addr).unwrap();
        let mut buf = [0u8; 8];
        let (n, from) = b.recv_from(&mut buf).unwrap();
        assert_eq!(
            (&buf[..n], from.as_pathname()),
            (&b"to b"[..], Some(dir.join("a").as_path()))
        );
        b.connect_addr(&a.local_addr().unwrap()).unwrap();
        let twin = b.try_clone().unwrap();
        twin.send(b"twin").unwrap();
        assert_eq!(a.recv(&mut buf).unwrap(), 4);
        assert_eq!(b.read_timeout().unwrap(), None);
        b.set_read_timeout(Some(ms(20))).unwrap();
        b.set_write_timeout(Some(ms(30))).unwrap();
        assert_eq!(twin.read_timeout().unwrap(), std_rounded(ms(20)));
        assert_eq!(twin.write_timeout().unwrap(), std_rounded(ms(30)));
        let err = twin.recv(&mut buf).unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut));
        b.set_nonblocking(true).unwrap();
        assert_eq!(twin.recv(&mut buf).unwrap_err().kind(), ErrorKind::WouldBlock);
        // Listener and stream by address.
        let l_addr = std::os::unix::net::SocketAddr::from_pathname(dir.join("l")).unwrap();
        let listener = fiber::net::unix::UnixListener::bind_addr(&l_addr).unwrap();
        let mut client = UnixStream::connect_addr(&l_addr).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        client.write_all(b"by addr").unwrap();
        let mut got = [0u8; 7];
        server.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"by addr");
        std::fs::remove_dir_all(&dir).unwrap();
    });
}

/// Sockets are not tied to a runtime: made in a fiber, they keep working
/// from plain threads after that runtime is gone (as std sockets are
/// independent of the thread that made them).
#[test]
fn sockets_outlive_the_runtime_that_made_them() {
    within(30, || {
        let rt = fiber::Runtime::builder().workers(2).build().unwrap();
        let (listener, client, server) = rt.block_on(|| {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let (client, server) = {
                let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
                let (server, _) = listener.accept().unwrap();
                (client, server)
            };
            (listener, client, server)
        });
        drop(rt);
        let addr = listener.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            let mut buf = [0u8; 3];
            (&s).read_exact(&mut buf).unwrap();
            buf
        });
        (&TcpStream::connect(addr).unwrap()).write_all(b"new").unwrap();
        assert_eq!(&t.join().unwrap(), b"new");
        let reader = std::thread::spawn(move || {
            let mut got = String::new();
            (&server).read_to_string(&mut got).unwrap();
            got
        });
        (&client).write_all(b"after the runtime").unwrap();
        drop(client);
        assert_eq!(reader.join().unwrap(), "after the runtime");
    });
}

/// A std socket's timeouts survive `from_std`: a port that configures a
/// std socket and then wraps it keeps its read timeout (it was dropped: the
/// non-blocking socket ignores `SO_RCVTIMEO`, and a read parked for ever).
#[test]
fn from_std_keeps_the_std_sockets_timeouts() {
    in_fiber_and_thread(|| {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let std_client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (_server, _) = listener.accept().unwrap();
        std_client.set_read_timeout(Some(ms(50))).unwrap();
        std_client.set_write_timeout(Some(ms(70))).unwrap();
        // (The kernel rounds to its tick: compare with what std reads back.)
        let want = (std_client.read_timeout().unwrap(), std_client.write_timeout().unwrap());
        assert!(want.0.is_some() && want.1.is_some());
        let mut client = TcpStream::from_std(std_client).unwrap();
        assert_eq!((client.read_timeout().unwrap(), client.write_timeout().unwrap()), want);
        let err = client.read(&mut [0u8; 4]).unwrap_err();
        assert!(
            matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
            "{err:?}"
        );

        let std_udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        std_udp.set_read_timeout(Some(ms(50))).unwrap();
        let want = std_udp.read_timeout().unwrap();
        let udp = UdpSocket::from_std(std_udp).unwrap();
        assert_eq!(udp.read_timeout().unwrap(), want);
        assert!(udp.recv_from(&mut [0u8; 4]).is_err());

        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        a.set_read_timeout(Some(ms(50))).unwrap();
        let want = a.read_timeout().unwrap();
        let mut a = UnixStream::from_std(a).unwrap();
        assert_eq!(a.read_timeout().unwrap(), want);
        assert!(a.read(&mut [0u8; 4]).is_err());

        let (d, _e) = std::os::unix::net::UnixDatagram::pair().unwrap();
        d.set_read_timeout(Some(ms(50))).unwrap();
        let want = d.read_timeout().unwrap();
        let d = UnixDatagram::from_std(d).unwrap();
        assert_eq!(d.read_timeout().unwrap(), want);
        assert!(d.recv(&mut [0u8; 4]).is_err());
    });
}

/// What std reads back for a socket timeout of `d`: the kernel keeps it
/// rounded up to its clock tick, and so do `fiber::net`'s getters.
fn std_rounded(d: std::time::Duration) -> Option<std::time::Duration> {
    let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    s.set_read_timeout(Some(d)).unwrap();
    s.read_timeout().unwrap()
}

/// std's socket timeouts live in the kernel, which rounds them up to its
/// clock tick, and std's getters read them back (1 ns and 1.5 ms read
/// back as one tick). `fiber::net`'s getters returned the value as given.
#[test]
fn timeout_getters_read_back_what_std_reads_back() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let std_client = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let client = fiber::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let udp = fiber::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    for d in [Duration::from_nanos(1), Duration::from_micros(1500), ms(5), ms(123)] {
        std_client.set_read_timeout(Some(d)).unwrap();
        std_client.set_write_timeout(Some(d)).unwrap();
        client.set_read_timeout(Some(d)).unwrap();
        client.set_write_timeout(Some(d)).unwrap();
        udp.set_read_timeout(Some(d)).unwrap();
        let want = std_client.read_timeout().unwrap();
        assert_eq!(client.read_timeout().unwrap(), want, "{d:?}");
        assert_eq!(
            client.write_timeout().unwrap(),
            std_client.write_timeout().unwrap(),
            "{d:?}"
        );
        assert_eq!(udp.read_timeout().unwrap(), want, "{d:?}");
    }
    // A socket handed to std keeps them, as a std socket's would.
    let back = client.into_std().unwrap();
    assert_eq!(back.read_timeout().unwrap(), std_client.read_timeout().unwrap());
}

/// std's sockets adopt and hand out descriptors through `From<OwnedFd>`,
/// `FromRawFd` and `IntoRawFd`; so do `fiber::net`'s (porting such code is
/// an import change). They did not compile.
#[test]
fn sockets_convert_from_and_into_descriptors_as_std_s() {
    use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd};
    let listener = fiber::net::TcpListener::from(OwnedFd::from(std::net::TcpListener::bind("127.0.0.1:0").unwrap()));
    let addr = listener.local_addr().unwrap();
    let raw = std::net::TcpStream::connect(addr).unwrap().into_raw_fd();
    // SAFETY: `raw` is an open TCP socket that this test owns and gives up.
    let mut client = unsafe { fiber::net::TcpStream::from_raw_fd(raw) };
    let (server, _) = listener.accept().unwrap();
    let mut server = fiber::net::TcpStream::from(OwnedFd::from(server));
    client.write_all(b"ping").unwrap();
    let mut buf = [0u8; 4];
    server.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"ping");
    // Out again: a blocking std socket that still works.
    // SAFETY: `into_raw_fd` gave this test the descriptor.
    let mut std_server = unsafe { std::net::TcpStream::from_raw_fd(server.into_raw_fd()) };
    std_server.write_all(b"pong").unwrap();
    client.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"pong");
    let udp = fiber::net::UdpSocket::from(OwnedFd::from(std::net::UdpSocket::bind("127.0.0.1:0").unwrap()));
    assert!(udp.local_addr().is_ok());
    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    let mut a = fiber::net::unix::UnixStream::from(OwnedFd::from(a));
    let mut b = fiber::net::unix::UnixStream::from(OwnedFd::from(b));
    a.write_all(b"unix").unwrap();
    b.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"unix");
    let (d1, _d2) = std::os::unix::net::UnixDatagram::pair().unwrap();
    let d1 = fiber::net::unix::UnixDatagram::from(OwnedFd::from(d1));
    assert!(d1.local_addr().is_ok());
}

/// `Debug` prints what std's does for the same socket: the addresses that
/// are known (no `Some(..)` around them), and the descriptor.
#[test]
fn debug_output_is_std_s() {
    use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd};
    // The same descriptor seen through std's type prints std's text; the
    // descriptor is handed back before either handle could close it.
    fn as_std<S: AsRawFd, T: FromRawFd + IntoRawFd + std::fmt::Debug>(ours: &S) -> String {
        // SAFETY: the descriptor stays owned by `ours`; the std handle is
        // turned back into a raw descriptor right after printing.
        let theirs = unsafe { T::from_raw_fd(ours.as_raw_fd()) };
        let text = format!("{theirs:?}");
        let _ = theirs.into_raw_fd();
        // std's unix sockets print their descriptor's internal wrapper
        // (`FileDesc(OwnedFd { fd: N })`); the number is what counts.
        let fd = ours.as_raw_fd();
        text.replace(&format!("FileDesc(OwnedFd {{ fd: {fd} }})"), &fd.to_string())
    }
    in_fiber_and_thread(|| {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        assert_eq!(format!("{listener:?}"), as_std::<_, std::net::TcpListener>(&listener));
        let (client, server) = tcp_pair();
        assert_eq!(format!("{client:?}"), as_std::<_, std::net::TcpStream>(&client));
        assert_eq!(format!("{server:?}"), as_std::<_, std::net::TcpStream>(&server));
        let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
        assert_eq!(format!("{udp:?}"), as_std::<_, std::net::UdpSocket>(&udp));
        assert!(!format!("{udp:?}").contains("Some("));
        let (a, _b) = UnixStream::pair().unwrap();
        assert_eq!(format!("{a:?}"), as_std::<_, std::os::unix::net::UnixStream>(&a));
        let (d, _e) = UnixDatagram::pair().unwrap();
        assert_eq!(format!("{d:?}"), as_std::<_, std::os::unix::net::UnixDatagram>(&d));
        let path = std::env::temp_dir().join(format!(
            "fiber-debug-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_file(&path);
        let unix_listener = fiber::net::unix::UnixListener::bind(&path).unwrap();
        assert_eq!(
            format!("{unix_listener:?}"),
            as_std::<_, std::os::unix::net::UnixListener>(&unix_listener)
        );
        let _ = std::fs::remove_file(&path);
    });
}
