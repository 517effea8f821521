//! Adversarial review, round 59: `fiber::net` in combinations earlier
//! rounds did not cover, checked against std's documented behaviour
//! (`std::net`, `std::os::unix::net`, Linux semantics) and spec/net.md.
//!
//! Attacked here: several fibers (and plain threads) accepting, reading or
//! receiving on one socket through a shared reference and through
//! `try_clone` at once (every connection, byte and datagram taken exactly
//! once, every waiter woken at the end); timeouts and non-blocking mode
//! changed while a call is parked (std: the parked call keeps what it
//! started with); UDP truncation, zero-length datagrams, oversize sends and
//! an ICMP refusal arriving while a receive is parked; a reset waking a
//! parked writer and reader; a write loop cancelled while parked (every
//! byte it reported is delivered, no other); `read_exact` / `write_all`
//! with partial progress then a timeout (as std: what was consumed is gone,
//! nothing is duplicated); a runtime shut down with fibers parked in
//! accept, read, write, connect and receive (every descriptor closed, no
//! waiter left counted); descriptor numbers reused by new sockets while a
//! clone of the old one is parked; a socket read in another runtime after
//! its reader's runtime shut down; `fiber::blocking` with a std socket;
//! zero timeouts on every socket type; address lists; hundreds of
//! concurrent connections.

use crate::common::*;

use crate::common::sockets::{std_tcp_pair, tcp_pair};
use fiber::net::unix::{UnixDatagram, UnixListener, UnixStream};
use fiber::net::{Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::collections::BTreeSet;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

fn is_cancelled(e: &std::io::Error) -> bool {
    e.kind() == ErrorKind::Other && e.get_ref().is_some_and(|i| i.is::<fiber::Cancelled>())
}

fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

fn temp_path(name: &str) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("fiber-r59-{}-{name}", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

/// Fill `s`'s send path until a write would block (the socket must be
/// non-blocking for the call); the bytes written.
fn fill(s: &TcpStream) -> usize {
    s.set_nonblocking(true).unwrap();
    let chunk = vec![7u8; 64 * 1024];
    let mut total = 0;
    loop {
        match (&*s).write(&chunk) {
            Ok(n) => total += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) => panic!("fill: {e}"),
        }
    }
    s.set_nonblocking(false).unwrap();
    total
}

// ---------------------------------------------------------------------------
// (a) Many waiters on one socket: every item taken exactly once, every
// waiter woken at the end.

/// Six acceptors, three on a shared `&TcpListener` and three on a
/// `try_clone` of it, take 300 connections (each sends its number) and then
/// one sentinel each: every number is accepted exactly once.
#[test]
fn acceptors_on_a_shared_listener_and_its_clone_take_every_connection_once() {
    const N: u32 = 300;
    const ACCEPTORS: usize = 6;
    let got = within(30, || {
        rt2().block_on(|| {
            let listener = Arc::new(TcpListener::bind("127.0.0.1:0").unwrap());
            let clone = Arc::new(listener.try_clone().unwrap());
            let addr = listener.local_addr().unwrap();
            let seen = Arc::new(Mutex::new(Vec::new()));
            let acceptors: Vec<_> = (0..ACCEPTORS)
                .map(|i| {
                    let l = if i % 2 == 0 { listener.clone() } else { clone.clone() };
                    let seen = seen.clone();
                    fiber::spawn(move || loop {
                        let (mut s, _) = l.accept().unwrap();
                        let mut b = [0u8; 4];
                        s.read_exact(&mut b).unwrap();
                        let n = u32::from_le_bytes(b);
                        if n == u32::MAX {
                            return;
                        }
                        seen.lock().unwrap().push(n);
                    })
                })
                .collect();
            let clients: Vec<_> = (0..4u32)
                .map(|k| {
                    fiber::spawn(move || {
                        for n in (k..N).step_by(4) {
                            let mut c = TcpStream::connect(addr).unwrap();
                            c.write_all(&n.to_le_bytes()).unwrap();
                        }
                    })
                })
                .collect();
            for c in clients {
                c.join().unwrap();
            }
            wait_until("every number accepted", 20, || seen.lock().unwrap().len() == N as usize);
            for _ in 0..ACCEPTORS {
                let mut c = TcpStream::connect(addr).unwrap();
                c.write_all(&u32::MAX.to_le_bytes()).unwrap();
            }
            for a in acceptors {
                a.join().unwrap();
            }
            let v = seen.lock().unwrap().clone();
            v
        })
    });
    let set: BTreeSet<u32> = got.iter().copied().collect();
    assert_eq!(got.len(), N as usize, "a connection accepted twice or lost");
    assert_eq!(set, (0..N).collect::<BTreeSet<_>>());
}

/// Four receivers (two on the socket, two on a clone) of one UDP socket
/// take 400 datagrams, sent with at most 32 outstanding, and one sentinel
/// each: every datagram is received exactly once.
#[test]
fn receivers_on_one_udp_socket_and_its_clone_take_every_datagram_once() {
    const N: u32 = 400;
    const RECEIVERS: usize = 4;
    let got = within(30, || {
        rt2().block_on(|| {
            let sock = Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
            let clone = Arc::new(sock.try_clone().unwrap());
            let to = sock.local_addr().unwrap();
            let seen = Arc::new(Mutex::new(Vec::new()));
            let receivers: Vec<_> = (0..RECEIVERS)
                .map(|i| {
                    let s = if i % 2 == 0 { sock.clone() } else { clone.clone() };
                    let seen = seen.clone();
                    fiber::spawn(move || loop {
                        let mut b = [0u8; 8];
                        let (n, _) = s.recv_from(&mut b).unwrap();
                        assert_eq!(n, 4);
                        let v = u32::from_le_bytes(b[..4].try_into().unwrap());
                        if v == u32::MAX {
                            return;
                        }
                        seen.lock().unwrap().push(v);
                    })
                })
                .collect();
            let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
            for n in 0..N {
                while n as usize >= seen.lock().unwrap().len() + 32 {
                    fiber::sleep(ms(1)).unwrap();
                }
                tx.send_to(&n.to_le_bytes(), to).unwrap();
            }
            wait_until("every datagram received", 20, || {
                seen.lock().unwrap().len() == N as usize
            });
            for _ in 0..RECEIVERS {
                tx.send_to(&u32::MAX.to_le_bytes(), to).unwrap();
            }
            for r in receivers {
                r.join().unwrap();
            }
            let v = seen.lock().unwrap().clone();
            v
        })
    });
    assert_eq!(got.len(), N as usize, "a datagram received twice or lost");
    assert_eq!(
        got.iter().copied().collect::<BTreeSet<_>>(),
        (0..N).collect::<BTreeSet<_>>()
    );
}

/// Two fibers and a plain thread read one connection through a shared
/// `&TcpStream` with 7-byte buffers (short reads, and the short-read
/// shortcut, on every side) while the peer writes 20,000 bytes in uneven
/// chunks and then shuts its write half: every byte arrives exactly once
/// and all three readers see the end of file.
#[test]
fn fibers_and_a_plain_thread_reading_one_stream_get_every_byte_once_and_all_see_eof() {
    const TOTAL: usize = 20_000;
    within(30, || {
        let (client, server) = tcp_pair();
        let server = Arc::new(server);
        let read_all = |s: Arc<TcpStream>| {
            let mut got = Vec::new();
            let mut b = [0u8; 7];
            loop {
                match (&*s).read(&mut b) {
                    Ok(0) => return got,
                    Ok(n) => got.extend_from_slice(&b[..n]),
                    Err(e) => panic!("read: {e}"),
                }
            }
        };
        let s3 = server.clone();
        let thread = std::thread::spawn(move || read_all(s3));
        let mut all = rt2().block_on(move || {
            let readers: Vec<_> = (0..2)
                .map(|_| {
                    let s = server.clone();
                    fiber::spawn(move || read_all(s))
                })
                .collect();
            let mut client = client;
            let mut sent = 0usize;
            let mut k = 1usize;
            while sent < TOTAL {
                let n = (k * 37 % 23 + 1).min(TOTAL - sent);
                let chunk: Vec<u8> = (sent..sent + n).map(|i| (i % 251) as u8).collect();
                client.write_all(&chunk).unwrap();
                sent += n;
                k += 1;
                if k % 50 == 0 {
                    fiber::sleep(ms(1)).unwrap();
                }
            }
            client.shutdown(Shutdown::Write).unwrap();
            let mut all = Vec::new();
            for r in readers {
                all.extend(r.join().unwrap());
            }
            all
        });
        all.extend(thread.join().unwrap());
        assert_eq!(all.len(), TOTAL, "bytes lost or duplicated among the readers");
        let mut counts = [0usize; 251];
        for b in all {
            counts[b as usize] += 1;
        }
        let mut expected = [0usize; 251];
        for i in 0..TOTAL {
            expected[i % 251] += 1;
        }
        assert_eq!(counts, expected);
    });
}

// ---------------------------------------------------------------------------
// (b) Settings changed while a call is parked: as std on Linux, the parked
// call keeps the timeout and mode it started with.

/// What a parked read does when another handle changes the timeout under
/// it: `(first read stayed parked past the new timeout, what it then read,
/// the next read's error kind, the timed read's result after the timeout
/// was lifted)`.
macro_rules! timeout_change_record {
    ($pair:expr, $spawn:expr, $sleep:expr) => {{
        let (mut a, b) = $pair;
        let b = Arc::new(b);
        let done = Arc::new(AtomicBool::new(false));
        let (b2, d2) = (b.clone(), done.clone());
        let r = $spawn(Box::new(move || {
            let mut x = [0u8; 1];
            let r = (&*b2).read(&mut x).map(|n| x[..n].to_vec()).map_err(|e| e.kind());
            d2.store(true, SeqCst);
            r
        }));
        $sleep(ms(50));
        b.set_read_timeout(Some(ms(30))).unwrap();
        $sleep(ms(200));
        let stayed = !done.load(SeqCst);
        a.write_all(b"z").unwrap();
        let first = r();
        let next = (&*b).read(&mut [0u8; 1]).map_err(|e| e.kind());
        // A read parked with a 150 ms timeout, lifted (None) while parked:
        // it still ends at 150 ms.
        b.set_read_timeout(Some(ms(150))).unwrap();
        let b3 = b.clone();
        let r2 = $spawn(Box::new(move || {
            (&*b3).read(&mut [0u8; 1]).map(|n| vec![0; n]).map_err(|e| e.kind())
        }));
        $sleep(ms(40));
        b.set_read_timeout(None).unwrap();
        let lifted = r2();
        (stayed, first, next, lifted)
    }};
}

#[test]
fn a_timeout_changed_while_a_read_is_parked_applies_from_the_next_call_like_std() {
    let std_record = within(20, || {
        timeout_change_record!(
            std_tcp_pair(),
            |f: Box<dyn FnOnce() -> Result<Vec<u8>, ErrorKind> + Send>| {
                let h = std::thread::spawn(f);
                move || h.join().unwrap()
            },
            std::thread::sleep
        )
    });
    assert_eq!(
        std_record,
        (
            true,
            Ok(b"z".to_vec()),
            Err(ErrorKind::WouldBlock),
            Err(ErrorKind::WouldBlock)
        ),
        "the std reference"
    );
    let fiber_record = within(20, || {
        rt2().block_on(|| {
            timeout_change_record!(
                tcp_pair(),
                |f: Box<dyn FnOnce() -> Result<Vec<u8>, ErrorKind> + Send>| {
                    let h = fiber::spawn(f);
                    move || h.join().unwrap()
                },
                |d| fiber::sleep(d).unwrap()
            )
        })
    });
    assert_eq!(fiber_record, std_record);
}

/// `set_nonblocking(true)` while a read is parked: the parked read stays
/// parked (std's blocked `recv` keeps blocking), a new read returns
/// `WouldBlock` at once, the parked one gets the data that comes, and
/// `set_nonblocking(false)` makes reads park again.
#[test]
fn set_nonblocking_while_a_read_is_parked_leaves_it_parked_and_new_calls_would_block() {
    within(20, || {
        rt2().block_on(|| {
            let (mut a, b) = tcp_pair();
            let b = Arc::new(b);
            let done = Arc::new(AtomicBool::new(false));
            let (b2, d2) = (b.clone(), done.clone());
            let parked = fiber::spawn(move || {
                let mut x = [0u8; 4];
                let r = (&*b2).read(&mut x).map(|n| x[..n].to_vec());
                d2.store(true, SeqCst);
                r
            });
            wait_fiber_parked(parked.id());
            b.set_nonblocking(true).unwrap();
            let start = Instant::now();
            let now = (&*b).read(&mut [0u8; 4]).map_err(|e| e.kind());
            assert_eq!(now, Err(ErrorKind::WouldBlock));
            assert!(start.elapsed() < ms(500), "a non-blocking read waited");
            fiber::sleep(ms(100)).unwrap();
            assert!(!done.load(SeqCst), "the parked read returned on set_nonblocking");
            a.write_all(b"abcd").unwrap();
            assert_eq!(parked.join().unwrap().unwrap(), b"abcd");
            b.set_nonblocking(false).unwrap();
            b.set_read_timeout(Some(ms(40))).unwrap();
            let start = Instant::now();
            assert_eq!(
                (&*b).read(&mut [0u8; 4]).map_err(|e| e.kind()),
                Err(ErrorKind::WouldBlock)
            );
            assert!(
                start.elapsed() >= ms(35),
                "blocking mode back: the read waits its timeout"
            );
        })
    });
}

// ---------------------------------------------------------------------------
// (c) UDP edges against std.

/// Truncation and zero-length datagrams, `peek_from` with a small buffer, an
/// oversize send and a timed-out receive: the same results as std's.
macro_rules! udp_edges_record {
    ($bind:expr) => {{
        let a = $bind;
        let b = $bind;
        let to = b.local_addr().unwrap();
        let from = a.local_addr().unwrap();
        let mut seen: Vec<String> = Vec::new();
        for d in [&b"hello world"[..], b"xy", b"", b"last"] {
            seen.push(format!("send {:?}", a.send_to(d, to).map_err(|e| e.kind())));
        }
        let mut small = [0u8; 5];
        let r = b.peek_from(&mut small).map(|(n, f)| (n, f == from));
        seen.push(format!("peek5 {r:?} {:?}", &small));
        let r = b.recv_from(&mut small).map(|(n, f)| (n, f == from));
        seen.push(format!("recv5 {r:?} {:?}", &small));
        let r = b.recv_from(&mut []).map(|(n, f)| (n, f == from));
        seen.push(format!("recv0 {r:?}"));
        let mut big = [0u8; 16];
        let r = b.recv_from(&mut big).map(|(n, f)| (n, f == from));
        seen.push(format!("recv-empty {r:?}"));
        let mut two = [0u8; 2];
        let r = b.recv_from(&mut two).map(|(n, _)| n);
        seen.push(format!("recv2 {r:?} {:?}", &two));
        let huge = vec![0u8; 70_000];
        let r = a.send_to(&huge, to).map_err(|e| (e.kind(), e.raw_os_error()));
        seen.push(format!("oversize {r:?}"));
        b.set_read_timeout(Some(ms(30))).unwrap();
        let r = b.recv_from(&mut big).map(|(n, _)| n).map_err(|e| e.kind());
        seen.push(format!("timed {r:?}"));
        seen
    }};
}

#[test]
fn udp_truncation_empty_datagrams_and_oversize_sends_match_std() {
    let std_record = within(20, || {
        udp_edges_record!(std::net::UdpSocket::bind("127.0.0.1:0").unwrap())
    });
    let fiber_record = within(20, || {
        rt2().block_on(|| udp_edges_record!(UdpSocket::bind("127.0.0.1:0").unwrap()))
    });
    let thread_record = within(20, || udp_edges_record!(UdpSocket::bind("127.0.0.1:0").unwrap()));
    assert_eq!(fiber_record, std_record, "in a fiber");
    assert_eq!(thread_record, std_record, "on a plain thread");
}

/// A connected UDP socket whose peer port is closed: a receive parked when
/// the ICMP refusal arrives (after a `send` from another fiber) ends with
/// `ConnectionRefused`, as std's blocked `recv` does, and the error is
/// consumed (the next receive times out).
#[test]
fn a_parked_connected_udp_receive_wakes_with_connection_refused_like_std() {
    fn closed_port() -> SocketAddr {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        s.local_addr().unwrap()
    }
    let std_record = within(20, || {
        let s = Arc::new(std::net::UdpSocket::bind("127.0.0.1:0").unwrap());
        s.connect(closed_port()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let s2 = s.clone();
        let t = std::thread::spawn(move || s2.recv(&mut [0u8; 8]).map_err(|e| e.kind()));
        std::thread::sleep(ms(100));
        s.send(b"ping").unwrap();
        let first = t.join().unwrap();
        s.set_read_timeout(Some(ms(30))).unwrap();
        (first, s.recv(&mut [0u8; 8]).map_err(|e| e.kind()))
    });
    assert_eq!(
        std_record,
        (Err(ErrorKind::ConnectionRefused), Err(ErrorKind::WouldBlock))
    );
    let fiber_record = within(20, || {
        rt2().block_on(|| {
            let s = Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
            s.connect(closed_port()).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let s2 = s.clone();
            let r = fiber::spawn(move || s2.recv(&mut [0u8; 8]).map_err(|e| e.kind()));
            wait_fiber_parked(r.id());
            s.send(b"ping").unwrap();
            let first = r.join().unwrap();
            s.set_read_timeout(Some(ms(30))).unwrap();
            (first, s.recv(&mut [0u8; 8]).map_err(|e| e.kind()))
        })
    });
    assert_eq!(fiber_record, std_record);
}

/// Broadcast and TTL options: a send to the limited broadcast address
/// without and with `SO_BROADCAST`, bad TTL values: std's results.
#[test]
fn udp_broadcast_and_ttl_options_match_std() {
    macro_rules! record {
        ($s:expr) => {{
            let s = $s;
            let mut seen = Vec::new();
            let bc: SocketAddr = "255.255.255.255:9".parse().unwrap();
            seen.push(format!("{:?}", s.broadcast().map_err(|e| e.kind())));
            seen.push(format!("{:?}", s.send_to(b"x", bc).map_err(|e| e.raw_os_error())));
            s.set_broadcast(true).unwrap();
            seen.push(format!("{:?}", s.broadcast().map_err(|e| e.kind())));
            seen.push(format!("{:?}", s.send_to(b"x", bc).map_err(|e| e.raw_os_error())));
            seen.push(format!("{:?}", s.set_ttl(0).map_err(|e| e.raw_os_error())));
            seen.push(format!("{:?}", s.set_ttl(256).map_err(|e| e.raw_os_error())));
            seen.push(format!("{:?}", s.set_ttl(7).map_err(|e| e.raw_os_error())));
            seen.push(format!("{:?}", s.ttl().map_err(|e| e.raw_os_error())));
            seen.push(format!(
                "{:?}",
                s.set_multicast_ttl_v4(300).map_err(|e| e.raw_os_error())
            ));
            seen.push(format!("{:?}", s.multicast_ttl_v4().map_err(|e| e.raw_os_error())));
            seen
        }};
    }
    let std_record = record!(std::net::UdpSocket::bind("0.0.0.0:0").unwrap());
    let fiber_record = within(20, || {
        rt2().block_on(|| {
            let s = UdpSocket::bind("0.0.0.0:0").unwrap();
            let rec = record!(&s);
            // The options belong to the socket: a clone reads them back.
            let c = s.try_clone().unwrap();
            assert!(c.broadcast().unwrap());
            assert_eq!(c.ttl().unwrap(), 7);
            rec
        })
    });
    assert_eq!(fiber_record, std_record);
}

// ---------------------------------------------------------------------------
// (d) Resets, cancellation and partial progress.

/// The peer resets the connection (`SO_LINGER` 0, with unread data) while
/// one fiber is parked writing into a full buffer and another is parked
/// reading: both wake, the writer with an error, the reader with the reset
/// or end of file; one of them reports `ConnectionReset`.
#[test]
fn a_reset_wakes_a_parked_writer_and_a_parked_reader() {
    within(20, || {
        rt2().block_on(|| {
            let (a, b) = tcp_pair();
            fill(&a);
            // Unread data on b's side too, so b's close resets.
            b.set_nonblocking(false).unwrap();
            let a = Arc::new(a);
            let (aw, ar) = (a.clone(), a.clone());
            let writer = fiber::spawn(move || {
                let chunk = vec![1u8; 64 * 1024];
                loop {
                    if let Err(e) = (&*aw).write(&chunk) {
                        return e.kind();
                    }
                }
            });
            let reader = fiber::spawn(move || (&*ar).read(&mut [0u8; 16]).map_err(|e| e.kind()));
            wait_fiber_parked(writer.id());
            wait_fiber_parked(reader.id());
            crate::common::sockets::reset_on_close(b.as_raw_fd());
            drop(b);
            let w = writer.join().unwrap();
            let r = reader.join().unwrap();
            assert!(
                matches!(w, ErrorKind::ConnectionReset | ErrorKind::BrokenPipe),
                "writer: {w:?}"
            );
            assert!(matches!(r, Ok(0) | Err(ErrorKind::ConnectionReset)), "reader: {r:?}");
            assert!(
                w == ErrorKind::ConnectionReset || r == Err(ErrorKind::ConnectionReset),
                "nobody saw the reset: writer {w:?}, reader {r:?}"
            );
            // Afterwards: end of file for reads, an error for writes.
            assert_eq!((&*a).read(&mut [0u8; 4]).map_err(|e| e.kind()), Ok(0));
            assert!((&*a).write(b"x").is_err());
        })
    });
}

/// A write loop parked on a full socket is cancelled: every byte its
/// `write` calls reported is delivered, and no other (the cancelled call
/// wrote nothing), in order.
#[test]
fn a_write_loop_cancelled_while_parked_delivers_exactly_the_reported_bytes() {
    within(30, || {
        let (a, mut b) = tcp_pair();
        let (tx, rx) = mpsc::channel();
        rt2().block_on(move || {
            let w = fiber::spawn(move || {
                let a = a;
                let mut written = 0usize;
                let err = loop {
                    let chunk: Vec<u8> = (written..written + 50_000).map(|i| (i % 251) as u8).collect();
                    match (&a).write(&chunk) {
                        Ok(n) => written += n,
                        Err(e) => break e,
                    }
                };
                let _ = tx.send((written, is_cancelled(&err)));
                // `a` dropped: the peer reads to end of file.
            });
            wait_fiber_parked(w.id());
            w.cancel();
            let _ = w.join();
        });
        let (written, cancelled) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert!(cancelled, "the write loop ended with an error other than Cancelled");
        let mut got = Vec::new();
        b.read_to_end(&mut got).unwrap();
        assert_eq!(got.len(), written, "delivered bytes differ from the reported ones");
        assert!(
            got.iter().enumerate().all(|(i, &x)| x == (i % 251) as u8),
            "the delivered bytes are not the stream written, in order"
        );
    });
}

/// `read_exact` that gets part of its buffer and then times out, then the
/// rest arrives; `write_all` that writes part and then times out: as std,
/// what was consumed is gone (the next read gets only the new bytes) and
/// what the peer receives is a prefix of the buffer.
macro_rules! partial_progress_record {
    ($pair:expr, $sleep:expr) => {{
        let (mut a, mut b) = $pair;
        b.set_read_timeout(Some(ms(40))).unwrap();
        a.write_all(b"abcd").unwrap();
        let mut ten = [0u8; 10];
        let first = b.read_exact(&mut ten).map_err(|e| e.kind());
        a.write_all(b"efghij").unwrap();
        $sleep(ms(20));
        let mut next = [0u8; 10];
        let n = b.read(&mut next).unwrap();
        let after = next[..n].to_vec();
        // write_all into a peer that does not read.
        a.set_write_timeout(Some(ms(60))).unwrap();
        let data: Vec<u8> = (0..16 * 1024 * 1024usize).map(|i| (i % 253) as u8).collect();
        let wrote = a.write_all(&data).map_err(|e| e.kind());
        drop(a);
        b.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut got = Vec::new();
        b.read_to_end(&mut got).unwrap();
        let prefix = !got.is_empty() && got.len() < data.len() && got[..] == data[..got.len()];
        (first, after, wrote, prefix)
    }};
}

#[test]
fn read_exact_and_write_all_with_partial_progress_then_a_timeout_match_std() {
    let std_record = within(30, || partial_progress_record!(std_tcp_pair(), std::thread::sleep));
    assert_eq!(
        std_record,
        (
            Err(ErrorKind::WouldBlock),
            b"efghij".to_vec(),
            Err(ErrorKind::WouldBlock),
            true
        ),
        "the std reference"
    );
    let fiber_record = within(30, || {
        rt2().block_on(|| partial_progress_record!(tcp_pair(), |d| fiber::sleep(d).unwrap()))
    });
    assert_eq!(fiber_record, std_record);
}

// ---------------------------------------------------------------------------
// (e) Shutdown of a runtime with fibers parked on sockets; descriptors.

/// A runtime dropped while fibers are parked in TCP accept, read, write and
/// connect (to a listener whose backlog is full), UDP receive, unix accept
/// and read: every socket the fibers owned is closed (the descriptor count
/// is back where it was) and no socket waiter is left counted.
#[test]
fn runtime_shutdown_with_fibers_parked_on_every_kind_of_socket_call_closes_every_fd() {
    in_child(
        "runtime_shutdown_with_fibers_parked_on_every_kind_of_socket_call_closes_every_fd",
        60,
        || {
            // Start the driver (its epoll descriptor stays for the process).
            drop(UdpSocket::bind("127.0.0.1:0").unwrap());
            let base = fd_count();
            let path = temp_path("shutdown.sock");
            let p2 = path.clone();
            {
                let rt = rt_fixed_grace(2, ms(300));
                rt.block_on(move || {
                    // A listener with a backlog of 0, never accepting:
                    // connects past the first ones stay in SYN_SENT.
                    // SAFETY: plain socket calls on a fresh descriptor.
                    let full = unsafe {
                        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
                        assert!(fd >= 0);
                        let mut sa: libc::sockaddr_in = std::mem::zeroed();
                        sa.sin_family = libc::AF_INET as libc::sa_family_t;
                        sa.sin_addr.s_addr = u32::from_be_bytes([127, 0, 0, 1]).to_be();
                        let r = libc::bind(
                            fd,
                            (&raw const sa).cast(),
                            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
                        );
                        assert_eq!(r, 0);
                        assert_eq!(libc::listen(fd, 0), 0);
                        <std::net::TcpListener as std::os::fd::FromRawFd>::from_raw_fd(fd)
                    };
                    let full_addr = full.local_addr().unwrap();
                    let mut spawned = 0;
                    let _keeper = fiber::spawn(move || {
                        let _full = full;
                        stubborn_sleep();
                    });
                    spawned += 1;
                    for _ in 0..4 {
                        fiber::spawn(move || {
                            if let Ok(s) = TcpStream::connect(full_addr) {
                                let _ = (&s).read(&mut [0u8; 1]);
                            }
                            stubborn_sleep();
                        });
                        spawned += 1;
                    }
                    let l = TcpListener::bind("127.0.0.1:0").unwrap();
                    fiber::spawn(move || {
                        let _ = l.accept();
                        stubborn_sleep();
                    });
                    let (a, _a_peer) = tcp_pair();
                    fiber::spawn(move || {
                        let _a_peer = _a_peer;
                        let _ = (&a).read(&mut [0u8; 1]);
                        stubborn_sleep();
                    });
                    let (b, _b_peer) = tcp_pair();
                    fiber::spawn(move || {
                        let _b_peer = _b_peer;
                        fill(&b);
                        let _ = (&b).write(&[0u8; 65536]);
                        stubborn_sleep();
                    });
                    let u = UdpSocket::bind("127.0.0.1:0").unwrap();
                    fiber::spawn(move || {
                        let _ = u.recv_from(&mut [0u8; 8]);
                        stubborn_sleep();
                    });
                    let ul = UnixListener::bind(&p2).unwrap();
                    fiber::spawn(move || {
                        let _ = ul.accept();
                        stubborn_sleep();
                    });
                    let (ua, _ub) = UnixStream::pair().unwrap();
                    fiber::spawn(move || {
                        let _ub = _ub;
                        let _ = (&ua).read(&mut [0u8; 1]);
                        stubborn_sleep();
                    });
                    spawned += 6;
                    wait_until("every fiber parked", 20, || {
                        fiber::dump()
                            .fibers
                            .iter()
                            .filter(|f| f.state == fiber::core::state::FiberState::Parked)
                            .count()
                            >= spawned
                    });
                    // Give the connects their SYNs.
                    fiber::sleep(ms(50)).unwrap();
                });
            }
            let _ = std::fs::remove_file(&path);
            assert_eq!(fiber::net::io_waiters(), 0, "socket waiters left counted");
            assert_eq!(fiber::core::external_waiters(), 0, "external waits left counted");
            assert_eq!(fd_count(), base, "descriptors left open after the runtime shut down");
        },
    );
}

/// A clone parks in `accept` and in `read` after the original handles are
/// dropped; new sockets then take the freed descriptor numbers. Their
/// connections and bytes go to their own callers; the parked clones get
/// theirs, from the right peers.
#[test]
fn descriptors_reused_while_a_clone_is_parked_do_not_misdirect_anything() {
    within(20, || {
        rt2().block_on(|| {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let old_addr = l.local_addr().unwrap();
            let clone = l.try_clone().unwrap();
            let (peer, s) = tcp_pair();
            let s_clone = s.try_clone().unwrap();
            let acceptor = fiber::spawn(move || clone.accept().map(|(c, a)| (c.peer_addr().unwrap(), a)));
            let reader = fiber::spawn(move || {
                let mut b = [0u8; 8];
                let n = (&s_clone).read(&mut b).unwrap();
                b[..n].to_vec()
            });
            wait_fiber_parked(acceptor.id());
            wait_fiber_parked(reader.id());
            drop(l);
            drop(s);
            // New sockets, likely on the freed numbers.
            let nl = TcpListener::bind("127.0.0.1:0").unwrap();
            let (mut np, ns) = tcp_pair();
            let nc = TcpStream::connect(nl.local_addr().unwrap()).unwrap();
            let (_, from) = nl.accept().unwrap();
            assert_eq!(from, nc.local_addr().unwrap());
            np.write_all(b"new").unwrap();
            let mut b = [0u8; 8];
            let n = (&ns).read(&mut b).unwrap();
            assert_eq!(&b[..n], b"new");
            (&np).write_all(b"n").unwrap();
            fiber::sleep(ms(50)).unwrap();
            assert!(
                !acceptor.is_finished(),
                "the parked accept returned for another listener"
            );
            assert!(!reader.is_finished(), "the parked read returned for another socket");
            let c = TcpStream::connect(old_addr).unwrap();
            let (pa, _) = acceptor.join().unwrap().unwrap();
            assert_eq!(pa, c.local_addr().unwrap());
            (&peer).write_all(b"old").unwrap();
            assert_eq!(reader.join().unwrap(), b"old");
        })
    });
}

/// A fiber of one runtime parks reading a shared stream; that runtime is
/// shut down (the read ends cancelled, having taken nothing). A fiber of
/// another runtime then reads everything the peer wrote, before and after.
#[test]
fn a_stream_whose_readers_runtime_shut_down_mid_read_serves_another_runtime_without_loss() {
    within(30, || {
        let (mut a, b) = tcp_pair();
        let b = Arc::new(b);
        let (tx, rx) = mpsc::channel();
        {
            let b2 = b.clone();
            let rt = rt_fixed_grace(1, ms(200));
            rt.block_on(move || {
                let h = fiber::spawn(move || {
                    let r = (&*b2).read(&mut [0u8; 16]);
                    let _ = tx.send(r.map_err(|e| is_cancelled(&e)));
                    stubborn_sleep();
                });
                wait_fiber_parked(h.id());
            });
        }
        // Torn down without returning is fine too: nothing was taken.
        if let Ok(r) = rx.recv_timeout(Duration::from_secs(5)) {
            assert_eq!(
                r,
                Err(true),
                "the shut-down runtime's read took data or failed otherwise"
            );
        }
        a.write_all(b"after shutdown").unwrap();
        let got = rt2().block_on(move || {
            let mut buf = [0u8; 14];
            (&*b).read_exact(&mut buf).unwrap();
            buf.to_vec()
        });
        assert_eq!(got, b"after shutdown");
    });
}

// ---------------------------------------------------------------------------
// (f) Odds and ends.

/// A std blocking socket read inside `fiber::blocking` on a one-worker
/// runtime does not hold the worker: a fiber on that worker writes the
/// bytes it waits for.
#[test]
fn a_std_socket_read_in_fiber_blocking_leaves_the_worker_free() {
    within(20, || {
        rt1().block_on(|| {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let std_client = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let (server, _) = l.accept().unwrap();
            let reader = fiber::spawn(move || {
                fiber::blocking(move || {
                    let mut c = std_client;
                    let mut b = [0u8; 5];
                    c.read_exact(&mut b).unwrap();
                    b
                })
            });
            let writer = fiber::spawn(move || {
                fiber::sleep(ms(30)).unwrap();
                (&server).write_all(b"hello").unwrap();
                server
            });
            assert_eq!(&reader.join().unwrap(), b"hello");
            drop(writer.join().unwrap());
        })
    });
}

/// A zero timeout is `InvalidInput` on every socket type, for reads and
/// writes, and leaves the timeout set before in force (std calls nothing).
#[test]
fn zero_timeouts_are_refused_on_every_socket_type_and_keep_the_old_one() {
    within(20, || {
        rt2().block_on(|| {
            macro_rules! check {
                ($what:expr, $s:expr) => {{
                    let s = $s;
                    s.set_read_timeout(Some(ms(50))).unwrap();
                    s.set_write_timeout(Some(ms(60))).unwrap();
                    let (r0, w0) = (s.read_timeout().unwrap(), s.write_timeout().unwrap());
                    let e = s.set_read_timeout(Some(Duration::ZERO)).unwrap_err();
                    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{} read", $what);
                    let e = s.set_write_timeout(Some(Duration::ZERO)).unwrap_err();
                    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{} write", $what);
                    assert_eq!(s.read_timeout().unwrap(), r0, "{}: the old read timeout", $what);
                    assert_eq!(s.write_timeout().unwrap(), w0, "{}: the old write timeout", $what);
                    assert!(r0.is_some() && w0.is_some());
                }};
            }
            let (c, _s) = tcp_pair();
            check!("tcp", &c);
            check!("udp", &UdpSocket::bind("127.0.0.1:0").unwrap());
            let (u, _v) = UnixStream::pair().unwrap();
            check!("unix stream", &u);
            let (d, _e) = UnixDatagram::pair().unwrap();
            check!("unix datagram", &d);
            // The old timeout still bounds a read.
            let start = Instant::now();
            assert_eq!(
                (&c).read(&mut [0u8; 1]).map_err(|e| e.kind()),
                Err(ErrorKind::WouldBlock)
            );
            assert!(start.elapsed() >= ms(45));
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let e = TcpStream::connect_timeout(&l.local_addr().unwrap(), Duration::ZERO).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidInput);
        })
    });
}

/// Address lists as std takes them: `connect` goes on past a refusing
/// address, `bind` past one in use, UDP `connect` takes the first.
#[test]
fn address_lists_are_tried_in_turn_like_std() {
    within(20, || {
        rt2().block_on(|| {
            let refused = {
                let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
                l.local_addr().unwrap()
            };
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let good = l.local_addr().unwrap();
            let c = TcpStream::connect(&[refused, good][..]).unwrap();
            assert_eq!(c.peer_addr().unwrap(), good);
            let e = TcpStream::connect(&[refused][..]).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::ConnectionRefused);
            let free: SocketAddr = "127.0.0.1:0".parse().unwrap();
            let l2 = TcpListener::bind(&[good, free][..]).unwrap();
            assert_ne!(l2.local_addr().unwrap(), good);
            let u = UdpSocket::bind("127.0.0.1:0").unwrap();
            u.connect(&[good, refused][..]).unwrap();
            assert_eq!(u.peer_addr().unwrap(), good);
            let none: &[SocketAddr] = &[];
            assert_eq!(
                TcpStream::connect(none).unwrap_err().kind(),
                std::net::TcpStream::connect(none).unwrap_err().kind()
            );
        })
    });
}

/// Hundreds of connections at once, each echoed by its own server fiber:
/// every echo comes back whole, and no socket waiter is left afterwards
/// on these sockets (the handlers all ended).
#[test]
fn hundreds_of_concurrent_echo_connections_all_complete() {
    // 300, not 1,000: both ends live in this process, beside the other
    // tests of this file, under a default soft limit of 1,024 descriptors.
    const N: usize = 300;
    let ok = within(60, || {
        rt2().block_on(|| {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            let handlers = Arc::new(AtomicUsize::new(0));
            let h2 = handlers.clone();
            let server = fiber::spawn(move || {
                for _ in 0..N {
                    let (mut s, _) = l.accept().unwrap();
                    let h = h2.clone();
                    fiber::spawn(move || {
                        let mut b = [0u8; 8];
                        s.read_exact(&mut b).unwrap();
                        s.write_all(&b).unwrap();
                        h.fetch_add(1, SeqCst);
                    });
                }
            });
            let clients: Vec<_> = (0..N as u64)
                .map(|i| {
                    fiber::spawn(move || {
                        let mut c = TcpStream::connect(addr).unwrap();
                        c.write_all(&i.to_le_bytes()).unwrap();
                        let mut b = [0u8; 8];
                        c.read_exact(&mut b).unwrap();
                        u64::from_le_bytes(b) == i
                    })
                })
                .collect();
            let ok = clients.into_iter().map(|c| c.join().unwrap()).filter(|&x| x).count();
            server.join().unwrap();
            wait_until("every handler done", 20, || handlers.load(SeqCst) == N);
            ok
        })
    });
    assert_eq!(ok, N);
}

/// One stream read at once by a fiber of one runtime, a fiber of another
/// and a plain thread, each parked for one byte: three bytes written one
/// at a time reach one reader each, and all three return.
#[test]
fn a_stream_read_by_two_runtimes_and_a_plain_thread_at_once_gives_each_byte_once() {
    within(30, || {
        let (mut a, b) = tcp_pair();
        let b = Arc::new(b);
        let read_one = |s: Arc<TcpStream>| {
            let mut x = [0u8; 1];
            assert_eq!((&*s).read(&mut x).unwrap(), 1);
            x[0]
        };
        let (rt_a, rt_b) = (rt1(), rt1());
        let (ba, bb, bt) = (b.clone(), b.clone(), b.clone());
        let ha = rt_a.handle().spawn(move || read_one(ba));
        let hb = rt_b.handle().spawn(move || read_one(bb));
        let t = std::thread::spawn(move || read_one(bt));
        wait_parked(&rt_a, 1);
        wait_parked(&rt_b, 1);
        std::thread::sleep(ms(30));
        let mut got = Vec::new();
        for byte in [b'x', b'y', b'z'] {
            a.write_all(&[byte]).unwrap();
            std::thread::sleep(ms(20));
        }
        got.push(rt_a.block_on(move || ha.join().unwrap()));
        got.push(rt_b.block_on(move || hb.join().unwrap()));
        got.push(t.join().unwrap());
        got.sort();
        assert_eq!(got, b"xyz");
    });
}

/// Unix sockets against std: datagram truncation and empty datagrams; a
/// stream whose peer closes with unread data (the parked read gets
/// `ConnectionReset`, then end of file); a client whose listener is
/// dropped before accepting it.
macro_rules! unix_edges_record {
    ($dpair:expr, $spair:expr, $bind:expr, $connect:expr, $spawn:expr, $sleep:expr) => {{
        let mut seen: Vec<String> = Vec::new();
        let (d1, d2) = $dpair;
        for m in [&b"hello world"[..], b"", b"xy"] {
            seen.push(format!("send {:?}", d1.send(m).map_err(|e| e.kind())));
        }
        let mut five = [0u8; 5];
        seen.push(format!(
            "recv5 {:?} {:?}",
            d2.recv(&mut five).map_err(|e| e.kind()),
            five
        ));
        seen.push(format!("recv-empty {:?}", d2.recv(&mut five).map_err(|e| e.kind())));
        seen.push(format!("recv0 {:?}", d2.recv(&mut []).map_err(|e| e.kind())));
        d2.set_read_timeout(Some(ms(30))).unwrap();
        seen.push(format!("timed {:?}", d2.recv(&mut five).map_err(|e| e.kind())));
        let (s1, s2) = $spair;
        let s1 = Arc::new(s1);
        let r1 = s1.clone();
        let reader = $spawn(Box::new(move || (&*r1).read(&mut [0u8; 8]).map_err(|e| e.kind())));
        $sleep(ms(50));
        // s2 has unread data when it closes.
        (&*s1).write_all(b"unread").unwrap();
        $sleep(ms(20));
        drop(s2);
        seen.push(format!("parked read {:?}", reader()));
        seen.push(format!(
            "next read {:?}",
            (&*s1).read(&mut [0u8; 8]).map_err(|e| e.kind())
        ));
        seen.push(format!("write {:?}", (&*s1).write(b"x").map_err(|e| e.kind())));
        let path = temp_path(&format!("edges-{}", seen.len()));
        let l = $bind(&path);
        let c = $connect(&path);
        drop(l);
        let _ = std::fs::remove_file(&path);
        let mut c = c;
        seen.push(format!("orphan read {:?}", c.read(&mut [0u8; 8]).map_err(|e| e.kind())));
        seen.push(format!("orphan write {:?}", c.write(b"x").map_err(|e| e.kind())));
        seen
    }};
}

#[test]
fn unix_truncation_resets_and_orphaned_clients_match_std() {
    let std_record = within(20, || {
        unix_edges_record!(
            std::os::unix::net::UnixDatagram::pair().unwrap(),
            std::os::unix::net::UnixStream::pair().unwrap(),
            |p: &std::path::Path| std::os::unix::net::UnixListener::bind(p).unwrap(),
            |p: &std::path::Path| std::os::unix::net::UnixStream::connect(p).unwrap(),
            |f: Box<dyn FnOnce() -> Result<usize, ErrorKind> + Send>| {
                let h = std::thread::spawn(f);
                move || h.join().unwrap()
            },
            std::thread::sleep
        )
    });
    let fiber_record = within(20, || {
        rt2().block_on(|| {
            unix_edges_record!(
                UnixDatagram::pair().unwrap(),
                UnixStream::pair().unwrap(),
                |p: &std::path::Path| UnixListener::bind(p).unwrap(),
                |p: &std::path::Path| UnixStream::connect(p).unwrap(),
                |f: Box<dyn FnOnce() -> Result<usize, ErrorKind> + Send>| {
                    let h = fiber::spawn(f);
                    move || h.join().unwrap()
                },
                |d| fiber::sleep(d).unwrap()
            )
        })
    });
    assert_eq!(fiber_record, std_record);
}

/// Fill the unix datagram socket at `path` from an unrelated std socket
/// until the kernel refuses (its queue holds `net.unix.max_dgram_qlen`).
fn fill_unix_dgram(path: &std::path::Path) -> std::os::unix::net::UnixDatagram {
    let filler = std::os::unix::net::UnixDatagram::unbound().unwrap();
    filler.set_nonblocking(true).unwrap();
    let mut n = 0;
    loop {
        match filler.send_to(b"fill", path) {
            Ok(_) => n += 1,
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::WouldBlock, "{e:?}");
                break;
            }
        }
        assert!(n < 1_000_000);
    }
    filler
}

/// A send parked on a full unix datagram receiver (connected, and
/// unconnected with `send_to`) when the receiver is closed: std's blocked
/// send wakes and fails (`ConnectionRefused`); the fiber's must too, not
/// wait for ever.
macro_rules! dgram_receiver_closed_record {
    ($unbound:expr, $spawn:expr, $sleep:expr, $tag:expr) => {{
        let mut seen = Vec::new();
        for connected in [true, false] {
            let path = temp_path(&format!("closed-recv-{}-{connected}", $tag));
            let receiver = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
            let _filler = fill_unix_dgram(&path);
            let sender = $unbound;
            sender.set_write_timeout(Some(Duration::from_secs(3))).unwrap();
            if connected {
                sender.connect(&path).unwrap();
            }
            let p = path.clone();
            let send = $spawn(Box::new(move || {
                let start = Instant::now();
                let r = if connected {
                    sender.send(b"x")
                } else {
                    sender.send_to(b"x", &p)
                };
                (r.map_err(|e| e.kind()), start.elapsed() < Duration::from_secs(2))
            }));
            $sleep(ms(100));
            drop(receiver);
            seen.push(send());
            let _ = std::fs::remove_file(&path);
        }
        seen
    }};
}

#[test]
fn a_unix_datagram_send_parked_on_a_full_receiver_fails_when_the_receiver_closes_like_std() {
    type Out = (Result<usize, ErrorKind>, bool);
    let std_record = within(20, || {
        dgram_receiver_closed_record!(
            std::os::unix::net::UnixDatagram::unbound().unwrap(),
            |f: Box<dyn FnOnce() -> Out + Send>| {
                let h = std::thread::spawn(f);
                move || h.join().unwrap()
            },
            std::thread::sleep,
            "std"
        )
    });
    let fiber_record = within(20, || {
        rt2().block_on(|| {
            dgram_receiver_closed_record!(
                UnixDatagram::unbound().unwrap(),
                |f: Box<dyn FnOnce() -> Out + Send>| {
                    let h = fiber::spawn(f);
                    move || h.join().unwrap()
                },
                |d| fiber::sleep(d).unwrap(),
                "fiber"
            )
        })
    });
    assert_eq!(fiber_record, std_record);
}
