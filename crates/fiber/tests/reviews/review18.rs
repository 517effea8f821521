//! Review 18: `fiber::net` method by method against `std::net`, in the
//! combinations earlier rounds left out: zero, tiny and huge timeouts and
//! the error an expired call returns, for every kind of read and for
//! vectored writes; non-blocking mode on every call; shutdown as the peer
//! sees it; UDP without a peer; socket options; clones used from two
//! fibers at once; sockets crossing between fibers, plain threads and
//! runtimes; cancelled waits; conversions to and from std.
//!
//! Where std is the reference, the same steps run on std's sockets (on a
//! plain thread) in the test itself and the two records are compared.

use fiber::net::{Shutdown, TcpListener, TcpStream, UdpSocket};
use std::io::{ErrorKind, IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{FromRawFd, IntoRawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{ms, rt2, wait_parked, within};

/// `body` in a fiber of a two-worker runtime, then on a plain thread.
fn in_fiber_and_thread<T: Send + 'static>(body: fn() -> T) -> (T, T) {
    let in_fiber = within(20, move || rt2().block_on(body));
    let on_thread = within(20, body);
    (in_fiber, on_thread)
}

/// A connected pair `(client, server)` of listener type `$l` and stream
/// type `$s` over 127.0.0.1.
macro_rules! pair {
    ($l:ty, $s:ty) => {{
        let listener = <$l>::bind("127.0.0.1:0").unwrap();
        let client = <$s>::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        (client, server)
    }};
}

fn tcp_pair() -> (TcpStream, TcpStream) {
    pair!(TcpListener, TcpStream)
}

/// An error as a record line: its kind and errno.
fn err(e: std::io::Error) -> String {
    format!("{:?}/{:?}", e.kind(), e.raw_os_error())
}

/// A result as a record line.
fn res<T: std::fmt::Debug>(r: std::io::Result<T>) -> String {
    match r {
        Ok(v) => format!("Ok({v:?})"),
        Err(e) => format!("Err({})", err(e)),
    }
}

/// Timeouts: `Some(ZERO)` refused (and the previous value kept), tiny and
/// huge values read back, an expired call of every read kind, a vectored
/// write's expiry, and options set through a clone.
macro_rules! timeout_record {
    ($l:ty, $s:ty, $u:ty) => {{
        let mut seen: Vec<String> = Vec::new();
        let (c, s) = pair!($l, $s);
        c.set_read_timeout(Some(ms(30))).unwrap();
        c.set_write_timeout(Some(ms(40))).unwrap();
        seen.push(res(c.set_read_timeout(Some(Duration::ZERO))));
        seen.push(res(c.set_write_timeout(Some(Duration::ZERO))));
        seen.push(format!(
            "kept {:?} {:?}",
            c.read_timeout().unwrap(),
            c.write_timeout().unwrap()
        ));
        for d in [
            Duration::from_nanos(1),
            Duration::from_micros(1),
            Duration::from_micros(999),
            Duration::from_secs(1 << 33),
            Duration::from_secs(u64::MAX),
            Duration::MAX,
        ] {
            c.set_read_timeout(Some(d)).unwrap();
            c.set_write_timeout(Some(d)).unwrap();
            seen.push(format!(
                "{d:?} -> {:?} {:?}",
                c.read_timeout().unwrap(),
                c.write_timeout().unwrap()
            ));
        }
        // Expired reads of every kind: WouldBlock (EAGAIN).
        c.set_read_timeout(Some(Duration::from_nanos(1))).unwrap();
        seen.push(format!("read {}", res((&c).read(&mut [0u8; 4]))));
        seen.push(format!("peek {}", res(c.peek(&mut [0u8; 4]))));
        let mut a = [0u8; 2];
        let mut b = [0u8; 2];
        seen.push(format!(
            "read_vectored {}",
            res((&c).read_vectored(&mut [IoSliceMut::new(&mut a), IoSliceMut::new(&mut b)]))
        ));
        // Through a clone: the options are the socket's.
        let twin = c.try_clone().unwrap();
        twin.set_read_timeout(Some(ms(25))).unwrap();
        seen.push(format!("clone set {:?}", c.read_timeout().unwrap()));
        seen.push(format!("original read {}", res((&c).read(&mut [0u8; 4]))));
        c.set_read_timeout(None).unwrap();
        seen.push(format!("original cleared {:?}", twin.read_timeout().unwrap()));
        // The data after the expiries is whole.
        (&s).write_all(b"after").unwrap();
        let mut got = [0u8; 5];
        (&twin).read_exact(&mut got).unwrap();
        seen.push(format!("{:?}", std::str::from_utf8(&got).unwrap()));
        // A vectored write to a peer that never reads: WouldBlock.
        c.set_write_timeout(Some(ms(20))).unwrap();
        let chunk = vec![3u8; 1 << 15];
        let mut written = 0usize;
        let e = loop {
            match (&c).write_vectored(&[IoSlice::new(&chunk), IoSlice::new(&chunk)]) {
                Ok(n) => written += n,
                Err(e) => break e,
            }
            assert!(written < 1 << 30, "wrote 1 GiB to a peer that never reads");
        };
        seen.push(format!("write_vectored {}", err(e)));
        // UDP: the same refusals and expiries.
        let u = <$u>::bind("127.0.0.1:0").unwrap();
        seen.push(res(u.set_read_timeout(Some(Duration::ZERO))));
        seen.push(res(u.set_write_timeout(Some(Duration::ZERO))));
        u.set_read_timeout(Some(Duration::from_micros(1))).unwrap();
        seen.push(format!("udp {:?}", u.read_timeout().unwrap()));
        seen.push(format!("recv_from {}", res(u.recv_from(&mut [0u8; 4]).map(|r| r.0))));
        seen.push(format!("peek_from {}", res(u.peek_from(&mut [0u8; 4]).map(|r| r.0))));
        u.connect(u.local_addr().unwrap()).unwrap();
        seen.push(format!("recv {}", res(u.recv(&mut [0u8; 4]))));
        seen.push(format!("peek {}", res(u.peek(&mut [0u8; 4]))));
        seen.push(format!("recv empty {}", res(u.recv(&mut []))));
        seen
    }};
}

/// std: `set_read_timeout(Some(ZERO))` and `set_write_timeout(Some(ZERO))`
/// fail with `InvalidInput` and leave the previous timeout; a tiny
/// timeout reads back rounded up to the kernel's tick and a huge one as
/// the kernel keeps it; an expired `read`, `peek`, `read_vectored`,
/// `recv`, `recv_from`, `peek`, `peek_from` fails with `WouldBlock`
/// (`EAGAIN`, std's `set_read_timeout` docs: "On Unix … WouldBlock"),
/// as does a vectored write's; a timeout set through a `try_clone` handle
/// bounds the original's reads ("options set on one stream will be
/// propagated to the other"). The whole record equals std's.
#[test]
fn timeouts_zero_tiny_huge_and_expired_on_every_call_match_std() {
    let std_record = within(20, || {
        timeout_record!(std::net::TcpListener, std::net::TcpStream, std::net::UdpSocket)
    });
    let (in_fiber, on_thread) = in_fiber_and_thread(|| timeout_record!(TcpListener, TcpStream, UdpSocket));
    assert_eq!(in_fiber, std_record, "in a fiber");
    assert_eq!(on_thread, std_record, "on a plain thread");
}

/// Non-blocking mode on every call: each returns `WouldBlock` at once,
/// even with a long read timeout set; back in blocking mode the calls wait.
macro_rules! nonblocking_record {
    ($l:ty, $s:ty, $u:ty) => {{
        let mut seen: Vec<String> = Vec::new();
        let listener = <$l>::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        seen.push(format!("accept {}", res(listener.accept().map(|_| ()))));
        seen.push(format!(
            "incoming {}",
            res(listener.incoming().next().unwrap().map(|_| ()))
        ));
        let c = <$s>::connect(listener.local_addr().unwrap()).unwrap();
        // A connection is queued: the non-blocking accept takes it.
        let s = loop {
            match listener.incoming().next().unwrap() {
                Ok(s) => break s,
                Err(e) => assert_eq!(e.kind(), ErrorKind::WouldBlock),
            }
        };
        // Accepted from a non-blocking listener, it waits (std: the
        // accepted socket is blocking).
        s.set_read_timeout(Some(ms(30))).unwrap();
        let start = Instant::now();
        seen.push(format!("accepted read {}", res((&s).read(&mut [0u8; 4]))));
        seen.push(format!("accepted read waited {}", start.elapsed() >= ms(25)));
        s.set_read_timeout(None).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c.set_nonblocking(true).unwrap();
        let start = Instant::now();
        seen.push(format!("read {}", res((&c).read(&mut [0u8; 4]))));
        seen.push(format!("peek {}", res(c.peek(&mut [0u8; 4]))));
        let mut a = [0u8; 2];
        seen.push(format!(
            "read_vectored {}",
            res((&c).read_vectored(&mut [IoSliceMut::new(&mut a)]))
        ));
        seen.push(format!("read empty {}", res((&c).read(&mut []))));
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "a non-blocking read waited for its timeout"
        );
        let chunk = vec![5u8; 1 << 15];
        let mut written = 0usize;
        let e = loop {
            match (&c).write_vectored(&[IoSlice::new(&chunk)]) {
                Ok(n) => written += n,
                Err(e) => break e,
            }
            assert!(written < 1 << 30, "wrote 1 GiB to a peer that never reads");
        };
        seen.push(format!("write_vectored full {}", err(e)));
        seen.push(format!("write full {}", res((&c).write(&chunk))));
        // The peer drains; the bytes are all there.
        let mut drained = 0usize;
        let mut buf = vec![0u8; 1 << 16];
        while drained < written {
            let n = (&s).read(&mut buf).unwrap();
            assert!(buf[..n].iter().all(|&b| b == 5));
            drained += n;
        }
        seen.push(format!("drained {}", drained == written));
        c.set_nonblocking(false).unwrap();
        (&s).write_all(b"ok").unwrap();
        let mut got = [0u8; 2];
        (&c).read_exact(&mut got).unwrap();
        seen.push(format!("blocking again {:?}", got));
        let u = <$u>::bind("127.0.0.1:0").unwrap();
        u.set_nonblocking(true).unwrap();
        seen.push(format!("recv_from {}", res(u.recv_from(&mut [0u8; 4]).map(|r| r.0))));
        seen.push(format!("peek_from {}", res(u.peek_from(&mut [0u8; 4]).map(|r| r.0))));
        u.connect(u.local_addr().unwrap()).unwrap();
        seen.push(format!("recv {}", res(u.recv(&mut [0u8; 4]))));
        seen.push(format!("peek {}", res(u.peek(&mut [0u8; 4]))));
        seen.push(format!("send {}", res(u.send(b"self"))));
        seen.push(format!("recv {}", res(u.recv(&mut [0u8; 8]))));
        seen
    }};
}

/// std: after `set_nonblocking(true)` every call that would wait returns
/// `WouldBlock` at once (`EAGAIN`), whatever the read timeout ("If the
/// IO operation could not be completed and needs to be retried, an error
/// with kind WouldBlock is returned"), `incoming()` yields that error,
/// and `set_nonblocking(false)` makes the calls wait again. The record
/// equals std's.
#[test]
fn nonblocking_mode_on_every_call_matches_std() {
    let std_record = within(20, || {
        nonblocking_record!(std::net::TcpListener, std::net::TcpStream, std::net::UdpSocket)
    });
    let (in_fiber, on_thread) = in_fiber_and_thread(|| nonblocking_record!(TcpListener, TcpStream, UdpSocket));
    assert_eq!(in_fiber, std_record, "in a fiber");
    assert_eq!(on_thread, std_record, "on a plain thread");
}

/// After `set_nonblocking(false)` a fiber's read parks (its worker stays
/// free) and the bytes written then reach it.
#[test]
fn back_to_blocking_mode_a_read_parks_the_fiber_until_data() {
    within(20, || {
        let rt = rt2();
        let (c, s) = rt.block_on(tcp_pair);
        c.set_nonblocking(true).unwrap();
        assert_eq!((&c).read(&mut [0u8; 1]).unwrap_err().kind(), ErrorKind::WouldBlock);
        c.set_nonblocking(false).unwrap();
        let reader = rt.spawn(move || {
            let mut got = [0u8; 3];
            (&c).read_exact(&mut got).map(|()| got)
        });
        wait_parked(&rt, 1);
        (&s).write_all(b"abc").unwrap();
        assert_eq!(&reader.join().unwrap().unwrap(), b"abc");
    });
}

/// `connect_timeout` with a 1 ns timeout to a listener on 127.0.0.1, 20
/// times: std's documented contract ("if the timeout elapses, TimedOut")
/// allows a connection or `TimedOut`. std checks the clock before its
/// first poll and so always gives `TimedOut` here (the kernel has
/// finished the loopback handshake by then); fiber tries the call first
/// and returns the connected stream, which the listener accepts and which
/// carries data. A zero timeout is `InvalidInput` for both.
#[test]
fn connect_timeout_of_one_nanosecond_to_a_live_listener_connects() {
    let std_kinds = within(20, || {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let zero = std::net::TcpStream::connect_timeout(&addr, Duration::ZERO)
            .unwrap_err()
            .kind();
        let tiny: Vec<_> = (0..20)
            .map(|_| {
                std::net::TcpStream::connect_timeout(&addr, Duration::from_nanos(1))
                    .map(|_| ())
                    .map_err(|e| e.kind())
            })
            .collect();
        (zero, tiny)
    });
    assert_eq!(std_kinds.0, ErrorKind::InvalidInput);
    assert!(
        std_kinds
            .1
            .iter()
            .all(|r| matches!(r, Ok(()) | Err(ErrorKind::TimedOut))),
        "{std_kinds:?}"
    );
    in_fiber_and_thread(|| {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let zero = TcpStream::connect_timeout(&addr, Duration::ZERO).unwrap_err();
        assert_eq!(zero.kind(), ErrorKind::InvalidInput);
        for _ in 0..20 {
            let c = TcpStream::connect_timeout(&addr, Duration::from_nanos(1)).unwrap();
            assert_eq!(c.peer_addr().unwrap(), addr);
            let (s, from) = listener.accept().unwrap();
            assert_eq!(from, c.local_addr().unwrap());
            (&c).write_all(b"hi").unwrap();
            let mut got = [0u8; 2];
            (&s).read_exact(&mut got).unwrap();
            assert_eq!(&got, b"hi");
        }
    });
}

/// A socket used from the runtime's blocking pool (`fiber::blocking`),
/// a plain thread of the runtime: its read timeout expires with
/// `WouldBlock` after the timeout, and its read waits for the bytes a
/// fiber writes.
#[test]
fn a_socket_used_on_the_blocking_pool_times_out_and_reads_like_std() {
    within(20, || {
        rt2().block_on(|| {
            let (c, s) = tcp_pair();
            let c = Arc::new(c);
            let c2 = c.clone();
            let (e, waited) = fiber::blocking(move || {
                c2.set_read_timeout(Some(ms(30))).unwrap();
                let start = Instant::now();
                let e = (&*c2).read(&mut [0u8; 4]).unwrap_err();
                (e, start.elapsed())
            });
            assert_eq!(
                (e.kind(), e.raw_os_error()),
                (ErrorKind::WouldBlock, Some(libc::EAGAIN))
            );
            assert!(waited >= ms(25), "the read returned after {waited:?}");
            c.set_read_timeout(None).unwrap();
            let writer = fiber::spawn(move || (&s).write_all(b"pool"));
            let got = fiber::blocking(move || {
                let mut got = [0u8; 4];
                (&*c).read_exact(&mut got).map(|()| got)
            });
            writer.join().unwrap().unwrap();
            assert_eq!(&got.unwrap(), b"pool");
        })
    });
}

/// Shutdown as each side sees it.
macro_rules! shutdown_record {
    ($l:ty, $s:ty) => {{
        let mut seen: Vec<String> = Vec::new();
        let (c, s) = pair!($l, $s);
        (&c).write_all(b"last words").unwrap();
        c.shutdown(Shutdown::Write).unwrap();
        let mut all = Vec::new();
        seen.push(format!("peer read_to_end {}", res((&s).read_to_end(&mut all))));
        seen.push(format!("{:?}", String::from_utf8(all).unwrap()));
        seen.push(format!("peer peek at EOF {}", res(s.peek(&mut [0u8; 4]))));
        seen.push(format!("write after own shutdown {}", res((&c).write(b"x"))));
        seen.push(format!(
            "write_vectored after own shutdown {}",
            res((&c).write_vectored(&[IoSlice::new(b"y")]))
        ));
        seen.push(format!("empty write after own shutdown {}", res((&c).write(&[]))));
        (&s).write_all(b"reply").unwrap();
        let mut got = [0u8; 5];
        (&c).read_exact(&mut got).unwrap();
        seen.push(format!("other direction {:?}", std::str::from_utf8(&got).unwrap()));
        c.shutdown(Shutdown::Read).unwrap();
        seen.push(format!("read after shutdown(Read) {}", res((&c).read(&mut [0u8; 4]))));
        seen.push(format!("peek after shutdown(Read) {}", res(c.peek(&mut [0u8; 4]))));
        let mut a = [0u8; 4];
        seen.push(format!(
            "read_vectored after shutdown(Read) {}",
            res((&c).read_vectored(&mut [IoSliceMut::new(&mut a)]))
        ));
        seen.push(format!("take_error {:?}", c.take_error().unwrap().map(err)));
        let (c, s) = pair!($l, $s);
        c.shutdown(Shutdown::Both).unwrap();
        seen.push(format!("peer read after Both {}", res((&s).read(&mut [0u8; 4]))));
        seen.push(format!("write after Both {}", res((&c).write(b"x"))));
        seen.push(format!("read after Both {}", res((&c).read(&mut [0u8; 4]))));
        seen.push(format!("shutdown(Write) again {}", res(c.shutdown(Shutdown::Write))));
        seen.push(format!(
            "local_addr port set {}",
            c.local_addr().map(|a| a.port() != 0).unwrap_or(false)
        ));
        seen
    }};
}

/// std: `shutdown(Write)` gives the peer end-of-file after the data sent
/// before it (its `read_to_end` and `peek` end), and our later writes fail
/// with `BrokenPipe` (`EPIPE`; an empty write returns 0) while the other
/// direction keeps working; `shutdown(Read)` makes `read`, `peek` and
/// `read_vectored` return 0; after `shutdown(Both)` the peer reads EOF.
/// The record equals std's.
#[test]
fn shutdown_as_both_sides_see_it_matches_std() {
    let std_record = within(20, || shutdown_record!(std::net::TcpListener, std::net::TcpStream));
    let (in_fiber, on_thread) = in_fiber_and_thread(|| shutdown_record!(TcpListener, TcpStream));
    assert_eq!(in_fiber, std_record, "in a fiber");
    assert_eq!(on_thread, std_record, "on a plain thread");
}

/// UDP without a peer, oversized datagrams, truncation through a
/// connected socket, a datagram queued before `connect`, and options.
macro_rules! udp_record {
    ($u:ty) => {{
        let mut seen: Vec<String> = Vec::new();
        let a = <$u>::bind("127.0.0.1:0").unwrap();
        let b = <$u>::bind("127.0.0.1:0").unwrap();
        let stranger = <$u>::bind("127.0.0.1:0").unwrap();
        let b_addr = b.local_addr().unwrap();
        seen.push(format!("send unconnected {}", res(a.send(b"x"))));
        seen.push(format!("peer_addr unconnected {}", res(a.peer_addr())));
        seen.push(format!(
            "send_to oversized {}",
            res(a.send_to(&vec![0u8; 70_000], b_addr))
        ));
        seen.push(format!("send_to max {}", res(a.send_to(&vec![1u8; 65_507], b_addr))));
        let mut big = vec![0u8; 70_000];
        seen.push(format!("recv_from max {}", res(b.recv_from(&mut big).map(|r| r.0))));
        // Queued before connect, from a sender the connect then filters.
        stranger.send_to(b"early", b_addr).unwrap();
        b.connect(a.local_addr().unwrap()).unwrap();
        stranger.send_to(b"late", b_addr).unwrap();
        a.send_to(b"0123456789", b_addr).unwrap();
        a.send_to(b"ab", b_addr).unwrap();
        let mut small = [0u8; 4];
        let mut texts = Vec::new();
        b.set_read_timeout(Some(ms(30))).unwrap();
        loop {
            match b.peek(&mut small) {
                Ok(n) => {
                    let peeked = small[..n].to_vec();
                    let n = b.recv(&mut small).unwrap();
                    assert_eq!(peeked, &small[..n], "peek then recv differ");
                    texts.push(String::from_utf8(peeked).unwrap());
                }
                Err(e) => {
                    texts.push(err(e));
                    break;
                }
            }
        }
        seen.push(format!("connected receives {texts:?}"));
        seen.push(format!(
            "send_to another while connected {}",
            res(b.send_to(b"z", stranger.local_addr().unwrap()))
        ));
        seen.push(format!("ttl {}", res(a.ttl())));
        seen.push(format!("set_ttl 0 {}", res(a.set_ttl(0))));
        seen.push(format!("set_ttl 256 {}", res(a.set_ttl(256))));
        seen.push(format!("set_ttl 255 {} {}", res(a.set_ttl(255)), res(a.ttl())));
        seen.push(format!("take_error {:?}", a.take_error().unwrap().map(err)));
        seen
    }};
}

/// std: `send` on an unconnected UDP socket fails (`EDESTADDRREQ`) and
/// `peer_addr` is `NotConnected`; a datagram over 65,507 bytes fails with
/// `EMSGSIZE`; a datagram larger than the buffer is truncated (`peek` and
/// `recv` fill the buffer and the rest is dropped); `connect` filters
/// later senders but a datagram queued before it is still received (the
/// kernel does not purge the queue); a connected socket still sends to
/// others with `send_to`; `set_ttl(0)` and `set_ttl(256)` fail. The
/// record equals std's.
#[test]
fn udp_without_a_peer_oversized_and_truncated_datagrams_match_std() {
    let std_record = within(20, || udp_record!(std::net::UdpSocket));
    let (in_fiber, on_thread) = in_fiber_and_thread(|| udp_record!(UdpSocket));
    assert_eq!(in_fiber, std_record, "in a fiber");
    assert_eq!(on_thread, std_record, "on a plain thread");
}

/// TCP socket options.
macro_rules! tcp_options_record {
    ($l:ty, $s:ty) => {{
        let mut seen: Vec<String> = Vec::new();
        let (c, s) = pair!($l, $s);
        seen.push(format!("nodelay {} {}", res(c.nodelay()), res(s.nodelay())));
        seen.push(format!("ttl {}", res(c.ttl())));
        seen.push(format!("set_ttl 0 {}", res(c.set_ttl(0))));
        seen.push(format!("set_ttl 256 {}", res(c.set_ttl(256))));
        c.set_ttl(7).unwrap();
        c.set_nodelay(true).unwrap();
        let twin = c.try_clone().unwrap();
        seen.push(format!("clone sees {} {}", res(twin.ttl()), res(twin.nodelay())));
        seen.push(format!("take_error {:?}", c.take_error().unwrap().map(err)));
        seen.push(format!(
            "timeouts {:?} {:?}",
            c.read_timeout().unwrap(),
            c.write_timeout().unwrap()
        ));
        seen
    }};
}

/// std: `nodelay` starts off, `ttl` at the system default (64), `set_ttl`
/// refuses 0 and 256, options set on one handle are seen by its
/// `try_clone`, and a healthy socket has no pending error. The record
/// equals std's.
#[test]
fn tcp_options_match_std() {
    let std_record = within(20, || tcp_options_record!(std::net::TcpListener, std::net::TcpStream));
    let (in_fiber, on_thread) = in_fiber_and_thread(|| tcp_options_record!(TcpListener, TcpStream));
    assert_eq!(in_fiber, std_record, "in a fiber");
    assert_eq!(on_thread, std_record, "on a plain thread");
}

const MIB: usize = 1 << 20;

fn pattern(seed: u8) -> Vec<u8> {
    (0..MIB).map(|i| (i % 251) as u8 ^ seed).collect()
}

/// One fiber reads a socket through a `try_clone` handle while another
/// writes through the original, at once, a MiB each way (so both park on
/// full buffers); the peer is a plain thread doing the same. Every byte
/// arrives, in order.
#[test]
fn a_clone_read_by_one_fiber_while_another_writes_moves_a_mib_each_way() {
    within(20, || {
        let rt = rt2();
        let (c, s) = rt.block_on(tcp_pair);
        let peer = std::thread::spawn(move || {
            let reader = s.try_clone().unwrap();
            let t = std::thread::spawn(move || {
                let mut got = vec![0u8; MIB];
                (&reader).read_exact(&mut got).unwrap();
                got
            });
            (&s).write_all(&pattern(0x55)).unwrap();
            t.join().unwrap()
        });
        let reader = c.try_clone().unwrap();
        let r = rt.spawn(move || {
            let mut got = vec![0u8; MIB];
            (&reader).read_exact(&mut got).unwrap();
            got
        });
        let w = rt.spawn(move || (&c).write_all(&pattern(0xAA)));
        w.join().unwrap().unwrap();
        assert!(r.join().unwrap() == pattern(0x55), "the fiber reader's bytes");
        assert!(peer.join().unwrap() == pattern(0xAA), "the thread reader's bytes");
    });
}

/// A stream made in a fiber blocks a plain thread that reads it (until a
/// fiber writes), and one made on a plain thread parks a fiber that reads
/// it (until the thread writes): a socket is not tied to where it was made.
#[test]
fn sockets_cross_between_fibers_and_plain_threads_both_ways() {
    within(20, || {
        let rt = rt2();
        // Made in a fiber, read on a thread.
        let (c, s) = rt.block_on(tcp_pair);
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            tx.send(()).unwrap();
            let mut got = [0u8; 4];
            (&c).read_exact(&mut got).unwrap();
            got
        });
        rx.recv().unwrap();
        rt.block_on(move || (&s).write_all(b"from").unwrap());
        assert_eq!(&thread.join().unwrap(), b"from");
        // Made on a thread, read in a fiber.
        let (c, s) = tcp_pair();
        let reader = rt.spawn(move || {
            let mut got = [0u8; 6];
            (&c).read_exact(&mut got).map(|()| got)
        });
        wait_parked(&rt, 1);
        (&s).write_all(b"thread").unwrap();
        assert_eq!(&reader.join().unwrap().unwrap(), b"thread");
    });
}

/// A UDP socket made in a fiber keeps working after its runtime is gone:
/// its timeout still expires with `WouldBlock`, its clone works, and a
/// plain thread blocked in `recv_from` on it while the runtime was dropped
/// gets the datagram sent afterwards. A fiber parked on a clone when the
/// runtime shuts down ends cancelled, and the datagram it did not take
/// goes to the next receiver.
#[test]
fn a_udp_socket_outlives_its_runtime_and_a_fiber_parked_on_it() {
    within(20, || {
        let rt = rt2();
        let (socket, twin) = rt.block_on(|| {
            let s = UdpSocket::bind("127.0.0.1:0").unwrap();
            s.set_read_timeout(Some(ms(20))).unwrap();
            let t = s.try_clone().unwrap();
            (s, t)
        });
        let socket = Arc::new(socket);
        twin.set_read_timeout(None).unwrap();
        let parked = rt.spawn(move || twin.recv_from(&mut [0u8; 16]).map(|r| r.0));
        wait_parked(&rt, 1);
        let s2 = socket.clone();
        let thread = std::thread::spawn(move || {
            s2.set_read_timeout(None).unwrap();
            let mut buf = [0u8; 16];
            let (n, _) = s2.recv_from(&mut buf).unwrap();
            buf[..n].to_vec()
        });
        drop(rt);
        let outcome = parked.join();
        assert!(
            matches!(&outcome, Err(e) if e.is_cancelled())
                || matches!(&outcome, Ok(Err(e)) if e.get_ref().is_some_and(|i| i.is::<fiber::Cancelled>())),
            "the parked fiber's end: {outcome:?}"
        );
        let sender = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        sender.send_to(b"after", socket.local_addr().unwrap()).unwrap();
        assert_eq!(thread.join().unwrap(), b"after");
        socket.set_read_timeout(Some(ms(20))).unwrap();
        let e = socket.recv_from(&mut [0u8; 4]).unwrap_err();
        assert_eq!(
            (e.kind(), e.raw_os_error()),
            (ErrorKind::WouldBlock, Some(libc::EAGAIN))
        );
        let clone = socket.try_clone().unwrap();
        sender.send_to(b"clone", clone.local_addr().unwrap()).unwrap();
        let mut buf = [0u8; 8];
        let (n, from) = clone.recv_from(&mut buf).unwrap();
        assert_eq!((&buf[..n], from), (&b"clone"[..], sender.local_addr().unwrap()));
    });
}

/// A fiber parked in a read on a `try_clone` handle stays parked when
/// another fiber drops the original, then reads the bytes the peer sends,
/// then end-of-file when the peer closes (std: each handle closes only
/// its own descriptor).
#[test]
fn a_read_parked_on_a_clone_survives_another_fiber_dropping_the_original() {
    within(20, || {
        let rt = rt2();
        let (c, s) = rt.block_on(tcp_pair);
        let twin = c.try_clone().unwrap();
        let reader = rt.spawn(move || {
            let mut got = [0u8; 3];
            (&twin).read_exact(&mut got)?;
            let eof = (&twin).read(&mut [0u8; 4])?;
            Ok::<_, std::io::Error>((got, eof))
        });
        wait_parked(&rt, 1);
        rt.spawn(move || drop(c)).join().unwrap();
        (&s).write_all(b"xyz").unwrap();
        drop(s);
        assert_eq!(reader.join().unwrap().unwrap(), (*b"xyz", 0));
    });
}

fn is_cancelled_io(e: &std::io::Error) -> bool {
    e.kind() == ErrorKind::Other && e.get_ref().is_some_and(|i| i.is::<fiber::Cancelled>())
}

/// Cancelling fibers parked in a TCP `read`, `peek` and `read_vectored`
/// and in a UDP `recv_from` and `peek_from`: each call returns an error
/// of kind `Other` wrapping `fiber::Cancelled`, and no byte or datagram
/// is lost: the next reads get everything sent afterwards.
#[test]
fn cancelled_parked_reads_of_every_kind_lose_no_data() {
    within(20, || {
        let rt = rt2();
        let (c, s) = rt.block_on(tcp_pair);
        let c = Arc::new(c);
        let u = Arc::new(rt.block_on(|| UdpSocket::bind("127.0.0.1:0").unwrap()));
        let mut handles = Vec::new();
        for k in 0..3 {
            let c = c.clone();
            handles.push(rt.spawn(move || match k {
                0 => (&*c).read(&mut [0u8; 8]),
                1 => c.peek(&mut [0u8; 8]),
                _ => {
                    let mut a = [0u8; 8];
                    (&*c).read_vectored(&mut [IoSliceMut::new(&mut a)])
                }
            }));
        }
        for k in 0..2 {
            let u = u.clone();
            handles.push(rt.spawn(move || {
                let mut buf = [0u8; 8];
                if k == 0 {
                    u.recv_from(&mut buf).map(|r| r.0)
                } else {
                    u.peek_from(&mut buf).map(|r| r.0)
                }
            }));
        }
        wait_parked(&rt, 5);
        for h in &handles {
            h.cancel();
        }
        for h in handles {
            match h.join() {
                Ok(Err(e)) => assert!(is_cancelled_io(&e), "{e:?}"),
                Err(e) => assert!(e.is_cancelled(), "{e:?}"),
                Ok(Ok(n)) => panic!("a cancelled read returned {n} bytes"),
            }
        }
        (&s).write_all(b"kept").unwrap();
        let sender = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        sender.send_to(b"one", u.local_addr().unwrap()).unwrap();
        sender.send_to(b"two", u.local_addr().unwrap()).unwrap();
        let (got, dgrams) = rt.block_on(move || {
            let mut got = [0u8; 4];
            (&*c).read_exact(&mut got).unwrap();
            let mut dgrams = Vec::new();
            for _ in 0..2 {
                let mut buf = [0u8; 8];
                let (n, _) = u.recv_from(&mut buf).unwrap();
                dgrams.push(buf[..n].to_vec());
            }
            (got, dgrams)
        });
        assert_eq!(&got, b"kept");
        assert_eq!(dgrams, vec![b"one".to_vec(), b"two".to_vec()]);
    });
}

/// std: a socket handed to std keeps what was set on it: after
/// `set_nonblocking(true)` then `(false)` and a read timeout, `into_std`
/// gives a blocking std stream whose read waits for the timeout and fails
/// with `WouldBlock`, its `read_timeout` the same; `into_raw_fd` gives a
/// descriptor std adopts with `from_raw_fd`; a std descriptor adopted
/// with `FromRawFd` parks a fiber's read; a connected UDP socket keeps its
/// peer through `into_std`.
#[test]
fn sockets_converted_to_and_from_std_behave_as_std_documents() {
    within(20, || {
        let rt = rt2();
        let (c, s) = rt.block_on(tcp_pair);
        c.set_nonblocking(true).unwrap();
        c.set_nonblocking(false).unwrap();
        c.set_read_timeout(Some(ms(50))).unwrap();
        let timeout = c.read_timeout().unwrap();
        let std_c = c.into_std().unwrap();
        assert_eq!(std_c.read_timeout().unwrap(), timeout);
        let start = Instant::now();
        let e = (&std_c).read(&mut [0u8; 4]).unwrap_err();
        assert_eq!(
            (e.kind(), e.raw_os_error()),
            (ErrorKind::WouldBlock, Some(libc::EAGAIN))
        );
        assert!(start.elapsed() >= ms(45), "the std stream was left non-blocking");
        (&s).write_all(b"std").unwrap();
        let mut got = [0u8; 3];
        (&std_c).read_exact(&mut got).unwrap();
        assert_eq!(&got, b"std");
        // Raw descriptors both ways.
        let raw = s.into_raw_fd();
        // SAFETY: `raw` is the open TCP socket `into_raw_fd` just gave up.
        let std_s = unsafe { std::net::TcpStream::from_raw_fd(raw) };
        (&std_s).write_all(b"raw").unwrap();
        (&std_c).read_exact(&mut got).unwrap();
        assert_eq!(&got, b"raw");
        let raw = std_c.into_raw_fd();
        // SAFETY: as above, the std stream's descriptor given up.
        let fiber_c = unsafe { TcpStream::from_raw_fd(raw) };
        assert_eq!(
            fiber_c.read_timeout().unwrap(),
            timeout,
            "the adopted socket's SO_RCVTIMEO"
        );
        fiber_c.set_read_timeout(None).unwrap();
        let reader = rt.spawn(move || {
            let mut got = [0u8; 5];
            (&fiber_c).read_exact(&mut got).map(|()| got)
        });
        wait_parked(&rt, 1);
        (&std_s).write_all(b"again").unwrap();
        assert_eq!(&reader.join().unwrap().unwrap(), b"again");
        // UDP: connected, then handed to std.
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        a.connect(b.local_addr().unwrap()).unwrap();
        let std_a = a.into_std().unwrap();
        assert_eq!(std_a.peer_addr().unwrap(), b.local_addr().unwrap());
        std_a.send(b"peer").unwrap();
        let mut buf = [0u8; 8];
        let (n, from) = b.recv_from(&mut buf).unwrap();
        assert_eq!((&buf[..n], from), (&b"peer"[..], std_a.local_addr().unwrap()));
    });
}

/// Bytes queued in `fd`'s receive buffer (`FIONREAD`).
fn queued(fd: std::os::fd::RawFd) -> usize {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD on an open socket writes one c_int to `n`.
    assert_eq!(unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n) }, 0);
    n as usize
}

/// std: `read_to_end` and `read_to_string` that fail part way (there: the
/// read timeout expiring after some bytes came) return the error and keep
/// the bytes read so far in the buffer. A fiber cancelled while parked in
/// them after "abc" came does the same: the error wraps
/// `fiber::Cancelled`, and the buffer holds "abc".
#[test]
fn a_cancelled_read_to_end_keeps_the_bytes_it_read_like_std_on_timeout() {
    let std_record = within(20, || {
        let (c, s) = pair!(std::net::TcpListener, std::net::TcpStream);
        (&s).write_all(b"abc").unwrap();
        c.set_read_timeout(Some(ms(30))).unwrap();
        let mut bytes = Vec::new();
        let e = (&c).read_to_end(&mut bytes).unwrap_err();
        (&s).write_all(b"def").unwrap();
        let mut text = String::new();
        let e2 = (&c).read_to_string(&mut text).unwrap_err();
        (e.kind(), bytes, e2.kind(), text)
    });
    assert_eq!(
        std_record,
        (
            ErrorKind::WouldBlock,
            b"abc".to_vec(),
            ErrorKind::WouldBlock,
            "def".to_string()
        )
    );
    within(20, || {
        let rt = rt2();
        let (c, s) = rt.block_on(tcp_pair);
        let c = Arc::new(c);
        let fd = std::os::fd::AsRawFd::as_raw_fd(&*c);
        for (data, to_string) in [(b"abc", false), (b"def", true)] {
            let out = Arc::new(std::sync::Mutex::new(None));
            let reader = {
                let (c, out) = (c.clone(), out.clone());
                rt.spawn(move || {
                    let got = if to_string {
                        let mut text = String::new();
                        let r = (&*c).read_to_string(&mut text);
                        (r, text.into_bytes())
                    } else {
                        let mut bytes = Vec::new();
                        let r = (&*c).read_to_end(&mut bytes);
                        (r, bytes)
                    };
                    *out.lock().unwrap() = Some(got);
                })
            };
            wait_parked(&rt, 1);
            (&s).write_all(data).unwrap();
            // The reader took the bytes (so it ran after the write) and then
            // parked again.
            let start = Instant::now();
            while queued(fd) > 0 {
                assert!(start.elapsed() < Duration::from_secs(10), "the bytes were never read");
                std::thread::sleep(ms(1));
            }
            wait_parked(&rt, 1);
            reader.cancel();
            // The fiber's end reads as cancelled; what its call returned
            // is in `out`.
            assert!(reader.join().is_err_and(|e| e.is_cancelled()));
            let (r, bytes) = out.lock().unwrap().take().expect("the read returned");
            let e = r.unwrap_err();
            assert!(is_cancelled_io(&e), "{e:?}");
            assert_eq!(bytes, data, "the bytes read before the cancellation");
        }
    });
}

/// A read parked under `fiber::with_timeout` ends when the deadline
/// passes: `with_timeout` reports the time-out, the read inside returned
/// an error wrapping `fiber::Cancelled` (not a socket timeout: the
/// socket's own read timeout is longer), and the bytes sent afterwards
/// all reach the next read. A socket read timeout shorter than the
/// deadline expires first, with std's `WouldBlock`.
#[test]
fn a_read_ended_by_with_timeout_loses_no_bytes() {
    within(20, || {
        rt2().block_on(|| {
            let (c, s) = tcp_pair();
            c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut inner = None;
            let outer = fiber::with_timeout(ms(30), || {
                inner = Some((&c).read(&mut [0u8; 8]));
            });
            assert!(outer.is_err(), "with_timeout did not time out");
            let e = inner.expect("the read returned").unwrap_err();
            assert!(is_cancelled_io(&e), "{e:?}");
            (&s).write_all(b"intact").unwrap();
            let mut got = [0u8; 6];
            (&c).read_exact(&mut got).unwrap();
            assert_eq!(&got, b"intact");
            c.set_read_timeout(Some(ms(20))).unwrap();
            let r = fiber::with_timeout(Duration::from_secs(5), || (&c).read(&mut [0u8; 8]));
            let e = r.expect("with_timeout expired first").unwrap_err();
            assert_eq!(
                (e.kind(), e.raw_os_error()),
                (ErrorKind::WouldBlock, Some(libc::EAGAIN))
            );
        })
    });
}

/// std: switching a listener to non-blocking mode does not end an
/// `accept` already blocked on it (the mode is read when a call starts):
/// the blocked call returns the next connection, and only later calls
/// return `WouldBlock`. Here the switch is made through a `try_clone`
/// handle by another fiber while the first is parked in `accept`.
#[test]
fn set_nonblocking_through_a_clone_leaves_a_parked_accept_waiting() {
    within(20, || {
        let rt = rt2();
        let listener = Arc::new(rt.block_on(|| TcpListener::bind("127.0.0.1:0").unwrap()));
        let addr = listener.local_addr().unwrap();
        let twin = listener.try_clone().unwrap();
        let l = listener.clone();
        let acceptor = rt.spawn(move || l.accept().map(|(s, from)| (s.local_addr().unwrap(), from)));
        wait_parked(&rt, 1);
        rt.spawn(move || twin.set_nonblocking(true)).join().unwrap().unwrap();
        let client = TcpStream::connect(addr).unwrap();
        let (local, from) = acceptor.join().unwrap().unwrap();
        assert_eq!((local, from), (addr, client.local_addr().unwrap()));
        let e = listener.accept().unwrap_err();
        assert_eq!(
            (e.kind(), e.raw_os_error()),
            (ErrorKind::WouldBlock, Some(libc::EAGAIN))
        );
    });
}
