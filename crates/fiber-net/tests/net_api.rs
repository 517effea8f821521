//! Every call of the `std::net`-shaped API, from fibers and from plain
//! threads, on 127.0.0.1 only.

use fiber_core::Cancelled;
use fiber_net::{TcpListener, TcpStream, UdpSocket};
use fiber_sched::Runtime;
use std::io::{self, ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::sync::mpsc;
use std::time::Duration;

/// Hang detection only: far above any healthy run on a loaded machine.
const HANG: Duration = Duration::from_secs(30);

fn rt() -> Runtime {
    Runtime::builder().workers(2).build().unwrap()
}

/// Run `f` once in a fiber of a fresh runtime and once on a plain thread.
fn in_fiber_and_thread(f: fn()) {
    rt().block_on(f);
    std::thread::spawn(f).join().unwrap();
}

fn is_cancelled(e: &io::Error) -> bool {
    e.kind() == ErrorKind::Other && e.get_ref().is_some_and(|inner| inner.is::<Cancelled>())
}

#[test]
fn listener_calls() {
    in_fiber_and_thread(|| {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        assert!(addr.ip().is_loopback());
        listener.set_ttl(42).unwrap();
        assert_eq!(listener.ttl().unwrap(), 42);
        assert!(listener.take_error().unwrap().is_none());
        let clone = listener.try_clone().unwrap();
        assert_eq!(clone.local_addr().unwrap(), addr);
        let clients = std::thread::spawn(move || {
            (0..3)
                .map(|_| std::net::TcpStream::connect(addr).unwrap())
                .collect::<Vec<_>>()
        });
        // accept on the original, incoming on the clone: one queue.
        let (first, peer) = listener.accept().unwrap();
        assert_eq!(first.peer_addr().unwrap(), peer);
        let more: Vec<TcpStream> = clone.incoming().take(2).map(Result::unwrap).collect();
        assert_eq!(more.len(), 2);
        let clients = clients.join().unwrap();
        assert_eq!(clients.len(), 3);
        // into_std gives a blocking std listener; from_std takes it back.
        let std_listener = listener.into_std().unwrap();
        assert_eq!(std_listener.local_addr().unwrap(), addr);
        let again = TcpListener::from_std(std_listener).unwrap();
        again.set_nonblocking(true).unwrap();
        assert_eq!(again.accept().unwrap_err().kind(), ErrorKind::WouldBlock);
    });
}

#[test]
fn stream_calls() {
    in_fiber_and_thread(|| {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut buf = [0; 5];
            conn.read_exact(&mut buf).unwrap();
            (&conn).write_all(&buf).unwrap();
            let mut rest = Vec::new();
            conn.read_to_end(&mut rest).unwrap();
            rest
        });
        let stream = TcpStream::connect(addr).unwrap();
        // into_std / from_std round trip keeps the connection.
        let std_stream = stream.into_std().unwrap();
        assert_eq!(std_stream.peer_addr().unwrap(), addr);
        let mut stream = TcpStream::from_std(std_stream).unwrap();
        assert_eq!(stream.peer_addr().unwrap(), addr);
        assert!(stream.local_addr().unwrap().ip().is_loopback());
        stream.set_nodelay(true).unwrap();
        assert!(stream.nodelay().unwrap());
        stream.set_ttl(33).unwrap();
        assert_eq!(stream.ttl().unwrap(), 33);
        stream.write_all(b"hello").unwrap();
        let mut peeked = [0; 5];
        let n = stream.peek(&mut peeked).unwrap();
        assert!(n > 0 && peeked[..n] == b"hello"[..n]);
        let mut buf = [0; 5];
        (&stream).read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"hello");
        assert_eq!(stream.read_timeout().unwrap(), None);
        stream.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        assert_eq!(stream.read_timeout().unwrap(), std_rounded(Duration::from_millis(50)));
        // Nothing more comes: the read times out with std's Linux kind.
        let err = stream.read(&mut buf).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::WouldBlock, "{err}");
        assert_eq!(
            stream.set_read_timeout(Some(Duration::ZERO)).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
        stream.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
        assert_eq!(stream.write_timeout().unwrap(), std_rounded(Duration::from_secs(5)));
        (&stream).write_all(b" world").unwrap();
        stream.flush().unwrap();
        stream.shutdown(Shutdown::Write).unwrap();
        assert_eq!(server.join().unwrap(), b" world");
        // The server closed: end-of-file.
        stream.set_read_timeout(None).unwrap();
        assert_eq!(stream.read(&mut buf).unwrap(), 0);
        assert!(stream.take_error().unwrap().is_none());
    });
}

#[test]
fn write_timeout_expires_when_the_peer_does_not_read() {
    in_fiber_and_thread(|| {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (_peer, _) = listener.accept().unwrap();
        stream.set_write_timeout(Some(Duration::from_millis(50))).unwrap();
        let chunk = vec![7u8; 1 << 16];
        let err = loop {
            if let Err(e) = (&stream).write(&chunk) {
                break e;
            }
        };
        assert_eq!(err.kind(), ErrorKind::WouldBlock, "{err}");
    });
}

#[test]
fn connect_errors_and_timeout() {
    in_fiber_and_thread(|| {
        // A port nobody listens on: refused.
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let err = TcpStream::connect(closed).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ConnectionRefused, "{err}");
        assert_eq!(
            TcpStream::connect_timeout(&closed, Duration::ZERO).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
        // A listener whose accept queue is full drops further SYNs: a
        // connect then times out.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&listener);
        // SAFETY: a valid listening fd; listen(2) again only changes the
        // backlog.
        let relisten = unsafe { libc::listen(fd, 0) };
        assert_eq!(relisten, 0);
        let addr = listener.local_addr().unwrap();
        let mut held = Vec::new();
        let mut timed_out = None;
        for _ in 0..16 {
            match TcpStream::connect_timeout(&addr, Duration::from_millis(100)) {
                Ok(s) => held.push(s),
                Err(e) => {
                    timed_out = Some(e);
                    break;
                }
            }
        }
        let err = timed_out.expect("a full accept queue never timed a connect out");
        assert_eq!(err.kind(), ErrorKind::TimedOut, "{err}");
        // A good connect with a timeout.
        let ok = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let s = TcpStream::connect_timeout(&ok.local_addr().unwrap(), Duration::from_secs(10)).unwrap();
        assert_eq!(s.peer_addr().unwrap(), ok.local_addr().unwrap());
        // A name that resolves: "localhost".
        let port = ok.local_addr().unwrap().port();
        TcpStream::connect(("localhost", port)).unwrap();
    });
}

#[test]
fn reader_and_writer_fibers_share_a_connection() {
    rt().block_on(|| {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let echo = fiber_core::spawn(move || {
            let (conn, _) = listener.accept().unwrap();
            let mut buf = [0; 1024];
            loop {
                let n = (&conn).read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                (&conn).write_all(&buf[..n]).unwrap();
            }
        });
        let stream = TcpStream::connect(addr).unwrap();
        let reader = stream.try_clone().unwrap();
        const TOTAL: usize = 256 * 1024;
        // The reader parks first, the writer then feeds the echo.
        let reading = fiber_core::spawn(move || {
            let mut reader = reader;
            let mut got = vec![0; TOTAL];
            reader.read_exact(&mut got).unwrap();
            got
        });
        let writing = fiber_core::spawn(move || {
            let mut stream = stream;
            let data: Vec<u8> = (0..TOTAL).map(|i| (i % 251) as u8).collect();
            stream.write_all(&data).unwrap();
            stream.shutdown(Shutdown::Write).unwrap();
        });
        writing.join().unwrap();
        let got = reading.join().unwrap();
        assert!(got.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
        echo.join().unwrap();
    });
}

#[test]
fn udp_calls() {
    in_fiber_and_thread(|| {
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        let (a_addr, b_addr) = (a.local_addr().unwrap(), b.local_addr().unwrap());
        assert_eq!(a.send_to(b"one", b_addr).unwrap(), 3);
        let mut buf = [0; 16];
        let (n, from) = b.peek_from(&mut buf).unwrap();
        assert_eq!((&buf[..n], from), (&b"one"[..], a_addr));
        let (n, from) = b.recv_from(&mut buf).unwrap();
        assert_eq!((&buf[..n], from), (&b"one"[..], a_addr));
        a.connect(b_addr).unwrap();
        b.connect(a_addr).unwrap();
        assert_eq!(a.peer_addr().unwrap(), b_addr);
        a.send(b"two").unwrap();
        let n = b.peek(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"two");
        let n = b.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"two");
        // A receiver parked before the datagram is sent.
        let b2 = b.try_clone().unwrap();
        let receiver = std::thread::spawn(move || {
            let mut buf = [0; 16];
            let n = b2.recv(&mut buf).unwrap();
            buf[..n].to_vec()
        });
        std::thread::sleep(Duration::from_millis(20));
        a.send(b"three").unwrap();
        assert_eq!(receiver.join().unwrap(), b"three");
        b.set_read_timeout(Some(Duration::from_millis(30))).unwrap();
        assert_eq!(b.read_timeout().unwrap(), std_rounded(Duration::from_millis(30)));
        assert_eq!(b.recv(&mut buf).unwrap_err().kind(), ErrorKind::WouldBlock);
        b.set_write_timeout(Some(Duration::from_secs(1))).unwrap();
        assert_eq!(b.write_timeout().unwrap(), std_rounded(Duration::from_secs(1)));
        a.set_ttl(9).unwrap();
        assert_eq!(a.ttl().unwrap(), 9);
        a.set_broadcast(true).unwrap();
        assert!(a.broadcast().unwrap());
        assert!(a.take_error().unwrap().is_none());
        let std_socket = a.into_std().unwrap();
        let a = UdpSocket::from_std(std_socket).unwrap();
        a.set_nonblocking(true).unwrap();
        assert_eq!(a.recv(&mut buf).unwrap_err().kind(), ErrorKind::WouldBlock);
    });
}

/// Cancelling a fiber parked in accept, read, recv and connect ends each
/// call with kind `Other` wrapping `Cancelled`, not `Interrupted`.
#[test]
fn blocking_calls_are_cancellation_points() {
    rt().block_on(|| {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let (tx, rx) = mpsc::channel::<(&'static str, io::Error)>();
        let mut handles = Vec::new();
        let t = tx.clone();
        handles.push(fiber_core::spawn(move || {
            let err = listener.accept().unwrap_err();
            t.send(("accept", err)).unwrap();
        }));
        let other = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(other.local_addr().unwrap()).unwrap();
        let (_server_side, _) = other.accept().unwrap();
        let t = tx.clone();
        handles.push(fiber_core::spawn(move || {
            let mut buf = [0; 8];
            // read_exact must not retry a cancellation.
            let err = (&client).read_exact(&mut buf).unwrap_err();
            t.send(("read_exact", err)).unwrap();
        }));
        let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
        let t = tx.clone();
        handles.push(fiber_core::spawn(move || {
            let err = udp.recv_from(&mut [0; 8]).unwrap_err();
            t.send(("recv_from", err)).unwrap();
        }));
        drop(tx);
        // Let them park (counted on this runtime only: `io_waiters` is
        // process-wide, and other tests of this binary run in parallel).
        let sched = fiber_core::current_scheduler().unwrap();
        while sched
            .frames()
            .dump()
            .fibers
            .iter()
            .filter(|f| f.waiting == fiber_core::WaitKind::Io)
            .count()
            < 3
        {
            fiber_sched::sleep(Duration::from_millis(1)).unwrap();
        }
        for h in &handles {
            h.cancel();
        }
        for h in handles {
            assert!(h.join().unwrap_err().is_cancelled());
        }
        let mut seen = Vec::new();
        while let Ok((what, err)) = rx.try_recv() {
            assert!(is_cancelled(&err), "{what}: {err:?}");
            seen.push(what);
        }
        seen.sort();
        assert_eq!(seen, ["accept", "read_exact", "recv_from"]);
    });
}

/// The original report: one fiber per connection, 16 slow clients, two
/// workers: every connection is served (the acceptor no longer holds a
/// worker).
#[test]
fn one_fiber_per_connection_serves_every_slow_client() {
    let rt = rt();
    let addr: SocketAddr = rt.block_on(|| {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        fiber_core::spawn(move || {
            for conn in listener.incoming() {
                let mut conn = conn.unwrap();
                fiber_core::spawn(move || {
                    let mut buf = [0; 64];
                    loop {
                        match conn.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => conn.write_all(&buf[..n]).unwrap(),
                        }
                    }
                });
            }
        });
        addr
    });
    let clients: Vec<_> = (0..16)
        .map(|i| {
            std::thread::spawn(move || {
                let mut s = std::net::TcpStream::connect(addr).unwrap();
                s.set_read_timeout(Some(HANG)).unwrap();
                for _ in 0..3 {
                    s.write_all(&[i]).unwrap();
                    let mut b = [0];
                    s.read_exact(&mut b).unwrap();
                    assert_eq!(b[0], i);
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
}

/// A fiber parked in a read wakes with end-of-file when the peer closes;
/// dropping a `try_clone` duplicate leaves the other handle working (std
/// semantics: each handle owns its fd).
#[test]
fn peer_close_wakes_a_parked_reader_and_clones_are_independent() {
    rt().block_on(|| {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        let duplicate = server.try_clone().unwrap();
        let reader = fiber_core::spawn(move || {
            let mut buf = [0; 8];
            let first = (&server).read(&mut buf).unwrap();
            let second = (&server).read(&mut buf).unwrap();
            (first, second)
        });
        while fiber_net::io_waiters() == 0 {
            let _ = fiber_core::yield_now();
        }
        drop(duplicate);
        (&client).write_all(b"abc").unwrap();
        drop(client);
        assert_eq!(reader.join().unwrap(), (3, 0));
    });
}

#[test]
fn unix_socket_calls() {
    in_fiber_and_thread(|| {
        use fiber_net::unix::{UnixDatagram, UnixListener, UnixStream};
        let dir = std::env::temp_dir().join(format!(
            "fiber-net-unix-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("stream");
        let listener = UnixListener::bind(&path).unwrap();
        assert_eq!(listener.local_addr().unwrap().as_pathname(), Some(path.as_path()));
        let clone = listener.try_clone().unwrap();
        let p = path.clone();
        let client = std::thread::spawn(move || {
            let mut s = UnixStream::connect(&p).unwrap();
            s.write_all(b"ping").unwrap();
            let mut back = [0; 4];
            s.read_exact(&mut back).unwrap();
            back
        });
        let (conn, _) = clone.accept().unwrap();
        let mut buf = [0; 4];
        (&conn).read_exact(&mut buf).unwrap();
        (&conn).write_all(&buf).unwrap();
        assert_eq!(&client.join().unwrap(), b"ping");
        let (a, b) = UnixStream::pair().unwrap();
        b.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        assert_eq!((&b).read(&mut buf).unwrap_err().kind(), ErrorKind::WouldBlock);
        b.set_read_timeout(None).unwrap();
        (&a).write_all(b"x").unwrap();
        a.shutdown(Shutdown::Write).unwrap();
        let mut got = Vec::new();
        (&b).read_to_end(&mut got).unwrap();
        assert_eq!(got, b"x");
        let (da, db) = UnixDatagram::pair().unwrap();
        da.send(b"dgram").unwrap();
        let n = db.recv(&mut buf[..]).unwrap();
        assert_eq!(&buf[..n], b"dgra");
        let bound = UnixDatagram::bind(dir.join("dgram")).unwrap();
        let sender = UnixDatagram::unbound().unwrap();
        sender.send_to(b"to", dir.join("dgram")).unwrap();
        let (n, _) = bound.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"to");
        drop(listener.into_std().unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
    });
}

/// What std reads back for a socket timeout of `d`: the kernel keeps it
/// rounded up to its clock tick, and so do `fiber::net`'s getters.
fn std_rounded(d: std::time::Duration) -> Option<std::time::Duration> {
    let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    s.set_read_timeout(Some(d)).unwrap();
    s.read_timeout().unwrap()
}
