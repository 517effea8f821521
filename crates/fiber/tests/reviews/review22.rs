//! Review 22: `fiber::net` in combinations: two fibers on one socket
//! through `try_clone` (a reader and a writer parked at once, a third
//! handle shutting the socket down, one of them cancelled mid-transfer),
//! cancellation in the middle of a large `write_all`, read timeouts racing
//! arriving data, UDP errors reaching a parked receive, Unix datagram
//! senders waiting on a receiver another socket filled, abstract Unix
//! addresses, and a runtime shut down while many fibers are parked on
//! sockets of every kind.
//!
//! Where std is the reference, the same steps run on std's sockets (on
//! plain threads) in the test itself.

use fiber::net::unix::{UnixDatagram, UnixListener, UnixStream};
use fiber::net::{Shutdown, TcpListener, TcpStream, UdpSocket};
use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::sockets::tcp_pair;
use crate::common::{in_child, ms, rt2, set_sock_timeout, wait_parked, within};

fn is_cancelled_io(e: &std::io::Error) -> bool {
    e.kind() == ErrorKind::Other && e.get_ref().is_some_and(|i| i.is::<fiber::Cancelled>())
}

/// Byte `i` of the test stream: a period of 251 (prime), so a byte out of
/// place (lost or repeated) shows.
fn pattern_at(i: usize) -> u8 {
    (i % 251) as u8
}

fn pattern(start: usize, len: usize) -> Vec<u8> {
    (start..start + len).map(pattern_at).collect()
}

fn temp_path(name: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("fiber-adv22-{}-{name}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path
}

/// Fill the unix datagram socket at `path` from a second, unrelated std
/// socket until the kernel refuses (`EAGAIN`: the receive queue holds
/// `net.unix.max_dgram_qlen` datagrams); returns that socket and how many
/// it queued.
fn fill_from_a_stranger(path: &std::path::Path) -> (std::os::unix::net::UnixDatagram, usize) {
    let filler = std::os::unix::net::UnixDatagram::unbound().unwrap();
    filler.set_nonblocking(true).unwrap();
    let mut queued = 0usize;
    loop {
        match filler.send_to(b"fill", path) {
            Ok(_) => queued += 1,
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::WouldBlock, "{e:?}");
                break;
            }
        }
        assert!(queued < 1_000_000);
    }
    (filler, queued)
}

/// std: `UnixDatagram::send_to` to a receiver whose queue is full blocks
/// until the receiver takes datagrams, then sends, whoever filled the
/// queue. Here another socket filled it, so the sender's own datagrams
/// are not the ones freed when the receiver drains (the case
/// `reviews/review8.rs::unix_datagram_send_to_a_full_unconnected_receiver_resumes_when_it_receives`
/// covers); the fiber parked in `send_to` must still resume and send.
#[test]
fn unix_datagram_send_to_a_receiver_filled_by_another_socket_resumes_when_it_drains() {
    // std reference: the blocked send completes once the receiver drains.
    within(20, || {
        let path = temp_path("std-stranger");
        let receiver = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        let (_filler, queued) = fill_from_a_stranger(&path);
        let sender = std::os::unix::net::UnixDatagram::unbound().unwrap();
        let p = path.clone();
        let t = std::thread::spawn(move || sender.send_to(b"last", &p).map_err(|e| e.kind()));
        let mut buf = [0u8; 8];
        for _ in 0..queued {
            assert_eq!(receiver.recv(&mut buf).unwrap(), 4);
        }
        assert_eq!(t.join().unwrap(), Ok(4));
        receiver.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let n = receiver.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"last");
        let _ = std::fs::remove_file(&path);
    });
    within(20, || {
        let rt = rt2();
        let path = temp_path("fiber-stranger");
        let receiver = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        let (_filler, queued) = fill_from_a_stranger(&path);
        let sender = rt.block_on(|| UnixDatagram::unbound().unwrap());
        let p = path.clone();
        let (tx, rx) = mpsc::channel();
        let h = rt.spawn(move || {
            let _ = tx.send(sender.send_to(b"last", &p).map_err(|e| e.kind()));
        });
        // The send parked on the full queue before the receiver drains it.
        wait_parked(&rt, 1);
        assert!(rx.try_recv().is_err(), "the send did not wait");
        let mut buf = [0u8; 8];
        for _ in 0..queued {
            assert_eq!(receiver.recv(&mut buf).unwrap(), 4);
        }
        let got = rx.recv_timeout(Duration::from_secs(3));
        if got.is_err() {
            h.cancel();
        }
        let _ = h.join();
        let _ = std::fs::remove_file(&path);
        assert_eq!(
            got,
            Ok(Ok(4)),
            "the parked send_to never resumed after the receiver took all {queued} datagrams"
        );
    });
}

/// The same with the sender connected to the receiver (`connect` then
/// `send`): Linux then hooks the sender onto the receiver's `peer_wait`
/// and relays a receive as a write event, so the parked send resumes.
#[test]
fn unix_datagram_connected_send_to_a_receiver_filled_by_another_socket_resumes() {
    within(20, || {
        let rt = rt2();
        let path = temp_path("fiber-connected");
        let receiver = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        let (_filler, queued) = fill_from_a_stranger(&path);
        let sender = rt.block_on(|| UnixDatagram::unbound().unwrap());
        sender.connect(&path).unwrap();
        let (tx, rx) = mpsc::channel();
        let h = rt.spawn(move || {
            let _ = tx.send(sender.send(b"last").map_err(|e| e.kind()));
        });
        wait_parked(&rt, 1);
        let mut buf = [0u8; 8];
        for _ in 0..queued {
            assert_eq!(receiver.recv(&mut buf).unwrap(), 4);
        }
        let got = rx.recv_timeout(Duration::from_secs(3));
        if got.is_err() {
            h.cancel();
        }
        let _ = h.join();
        let _ = std::fs::remove_file(&path);
        assert_eq!(got, Ok(Ok(4)), "the parked send never resumed");
        receiver.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let n = receiver.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"last");
    });
}

/// A large `write_all` cancelled part way through a slow reader, on TCP and
/// on a Unix stream, while a second fiber is parked reading the other
/// direction on a `try_clone` handle (the two on different workers). The
/// cancelled call returns an error of kind `Other` wrapping
/// `fiber::Cancelled`; the peer then receives an exact prefix of the
/// buffer (no byte lost in the middle, none repeated), followed by what a
/// later write on the same connection sends; the reader on the clone is
/// untouched by the cancellation and gets its bytes.
macro_rules! cancelled_write_all_scenario {
    ($pair:expr) => {{
        const TOTAL: usize = 32 << 20;
        const FIRST: usize = 1 << 20;
        let rt = rt2();
        let (c, s) = rt.block_on(|| $pair);
        let c = Arc::new(c);
        let clone = c.try_clone().unwrap();
        let out = Arc::new(Mutex::new(None));
        let writer = {
            let (c, out) = (c.clone(), out.clone());
            rt.spawn(move || {
                let data = pattern(0, TOTAL);
                let r = (&*c).write_all(&data);
                *out.lock().unwrap() = Some(r);
            })
        };
        let reader = rt.spawn(move || {
            let mut got = [0u8; 1000];
            (&clone).read_exact(&mut got).map(|()| got.to_vec())
        });
        wait_parked(&rt, 2);
        // The slow reader takes the first MiB.
        let mut first = vec![0u8; FIRST];
        (&s).read_exact(&mut first).unwrap();
        assert!(first == pattern(0, FIRST), "the first MiB is not the buffer's start");
        wait_parked(&rt, 2);
        writer.cancel();
        let _ = writer.join();
        let r = out.lock().unwrap().take().expect("write_all returned");
        let e = r.expect_err("32 MiB fit in the socket buffers");
        assert!(is_cancelled_io(&e), "{e:?}");
        // The reader on the clone still waits and gets its bytes.
        (&s).write_all(&pattern(7, 1000)).unwrap();
        assert_eq!(reader.join().unwrap().unwrap(), pattern(7, 1000));
        // The connection is usable: a later write goes out after the
        // prefix (from a fiber: the buffers are full until the peer reads).
        let tail = rt.spawn({
            let c = c.clone();
            move || {
                (&*c).write_all(b"END!").unwrap();
                c.shutdown(Shutdown::Write).unwrap();
            }
        });
        let mut rest = Vec::new();
        (&s).read_to_end(&mut rest).unwrap();
        tail.join().unwrap();
        assert!(rest.len() >= 4 && rest.ends_with(b"END!"), "{} bytes", rest.len());
        let prefix = &rest[..rest.len() - 4];
        assert!(FIRST + prefix.len() < TOTAL, "the whole buffer went out");
        for (k, &b) in prefix.iter().enumerate() {
            assert_eq!(b, pattern_at(FIRST + k), "byte {} of the stream", FIRST + k);
        }
    }};
}

#[test]
fn a_cancelled_write_all_leaves_an_exact_prefix_and_a_working_tcp_connection() {
    within(30, || cancelled_write_all_scenario!(tcp_pair()));
}

#[test]
fn a_cancelled_write_all_leaves_an_exact_prefix_and_a_working_unix_stream() {
    within(30, || cancelled_write_all_scenario!(UnixStream::pair().unwrap()));
}

/// One fiber parked reading on a `try_clone` handle and another parked
/// writing (full buffers) on a second clone, on different workers; a third
/// fiber shuts the original down, for writing or both ways, on TCP and on
/// a Unix stream. std (same steps on threads): the blocked write fails
/// with `BrokenPipe`; the blocked read returns `Ok(0)` after
/// `shutdown(Both)` and, after `shutdown(Write)`, keeps waiting and gets
/// the byte the peer sends next; the peer reads exactly the bytes the
/// writes reported written, then end-of-file.
macro_rules! two_clones_shutdown_record {
    ($pair:expr, $how:expr, $spawn:expr, $settle:expr, $shut:expr) => {{
        let (c, s) = $pair;
        let how: Shutdown = $how;
        let reader_handle = c.try_clone().unwrap();
        let writer_handle = c.try_clone().unwrap();
        let written = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let w = written.clone();
        let (tx, rx) = mpsc::channel::<(&'static str, String)>();
        let tx2 = tx.clone();
        $spawn(Box::new(move || {
            let r = (&reader_handle).read(&mut [0u8; 16]);
            tx.send(("read", format!("{:?}", r.map_err(|e| e.kind())))).unwrap();
        }));
        $spawn(Box::new(move || {
            let e = loop {
                // Each write continues the pattern where the last ended.
                let chunk = pattern(w.load(std::sync::atomic::Ordering::SeqCst), 1 << 16);
                match (&writer_handle).write(&chunk) {
                    Ok(n) => {
                        w.fetch_add(n, std::sync::atomic::Ordering::SeqCst);
                    }
                    Err(e) => break e,
                }
            };
            tx2.send(("write", format!("{:?}", e.kind()))).unwrap();
        }));
        $settle();
        $shut(Box::new(move || c.shutdown(how).unwrap()));
        let mut ends = vec![rx.recv_timeout(Duration::from_secs(5)).expect("no parked call ended")];
        if how == Shutdown::Write {
            (&s).write_all(b"x").unwrap();
        }
        ends.push(
            rx.recv_timeout(Duration::from_secs(5))
                .expect("a parked call never ended"),
        );
        ends.sort();
        let mut all = Vec::new();
        (&s).read_to_end(&mut all).unwrap();
        let mut seen: Vec<(&str, String)> = ends;
        seen.push(("how", format!("{how:?}")));
        let total = written.load(std::sync::atomic::Ordering::SeqCst);
        seen.push((
            "peer got all written",
            format!("{}", all.len() == total && all == pattern(0, total)),
        ));
        seen
    }};
}

#[test]
fn a_third_fiber_s_shutdown_ends_a_parked_read_and_write_on_two_clones_like_std() {
    for how in [Shutdown::Write, Shutdown::Both] {
        for unix in [false, true] {
            let std_record = within(20, move || {
                let thread = |f: Box<dyn FnOnce() + Send>| {
                    std::thread::spawn(f);
                };
                // std's outcome does not depend on whether the calls are
                // blocked yet: a read or write after the shutdown ends the
                // same way.
                if unix {
                    two_clones_shutdown_record!(
                        std::os::unix::net::UnixStream::pair().unwrap(),
                        how,
                        thread,
                        || (),
                        |f: Box<dyn FnOnce() + Send>| f()
                    )
                } else {
                    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
                    let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
                    two_clones_shutdown_record!((c, l.accept().unwrap().0), how, thread, || (), |f: Box<
                        dyn FnOnce() + Send,
                    >| {
                        f()
                    })
                }
            });
            let fiber_record = within(20, move || {
                let rt = rt2();
                let handle = rt.handle();
                let h2 = handle.clone();
                let spawn = |f: Box<dyn FnOnce() + Send>| {
                    handle.spawn(f);
                };
                let settle = || wait_parked(&rt, 2);
                let shut = |f: Box<dyn FnOnce() + Send>| h2.spawn(f).join().unwrap();
                if unix {
                    two_clones_shutdown_record!(UnixStream::pair().unwrap(), how, spawn, settle, shut)
                } else {
                    two_clones_shutdown_record!(rt.block_on(tcp_pair), how, spawn, settle, shut)
                }
            });
            assert_eq!(fiber_record, std_record, "{how:?}, unix {unix}");
        }
    }
}

/// A read timeout of 1 ms racing bytes that arrive in bursts: every read
/// either returns bytes or expires with `WouldBlock`, and the bytes read
/// are exactly the bytes sent, in order, none lost at an expiry and none
/// repeated. Two readers share the stream through `try_clone` (each read
/// is atomic, so the pieces they take interleave without overlap).
#[test]
fn reads_with_a_tiny_timeout_racing_data_lose_and_repeat_no_byte() {
    within(30, || {
        const TOTAL: usize = 2 << 20;
        let rt = rt2();
        let (c, s) = rt.block_on(tcp_pair);
        c.set_read_timeout(Some(ms(1))).unwrap();
        let twin = c.try_clone().unwrap();
        assert_eq!(twin.read_timeout().unwrap(), c.read_timeout().unwrap());
        // A fiber mutex: held across the parked read, it parks the other
        // reader instead of blocking its worker.
        let taken = Arc::new(fiber::sync::Mutex::new(Vec::<(usize, Vec<u8>)>::new()));
        let seq = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let expiries = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let readers: Vec<_> = [c, twin]
            .into_iter()
            .map(|h| {
                let (taken, seq, expiries) = (taken.clone(), seq.clone(), expiries.clone());
                rt.spawn(move || {
                    let mut buf = vec![0u8; 3000];
                    loop {
                        // The piece and its order, under one lock with the
                        // read, so pieces are recorded in stream order.
                        let mut t = taken.lock().unwrap();
                        match (&h).read(&mut buf) {
                            Ok(0) => return,
                            Ok(n) => {
                                let k = seq.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                                t.push((k, buf[..n].to_vec()));
                            }
                            Err(e) => {
                                assert_eq!(e.kind(), ErrorKind::WouldBlock, "{e:?}");
                                expiries.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            }
                        }
                        drop(t);
                        fiber::yield_now().unwrap();
                    }
                })
            })
            .collect();
        let data = pattern(0, TOTAL);
        let mut sent = 0;
        let mut burst = 1usize;
        while sent < TOTAL {
            let n = burst.min(TOTAL - sent);
            (&s).write_all(&data[sent..sent + n]).unwrap();
            sent += n;
            burst = (burst * 7 + 13) % 65_536 + 1;
            if burst % 5 == 0 {
                std::thread::sleep(Duration::from_micros(700));
            }
        }
        // Before the end of stream: at least one expiry, so timeouts did
        // race the data (with no data left they expire every few ms).
        let start = Instant::now();
        while expiries.load(std::sync::atomic::Ordering::SeqCst) == 0 {
            assert!(start.elapsed() < Duration::from_secs(5), "no read ever timed out");
            std::thread::sleep(ms(1));
        }
        drop(s);
        for r in readers {
            r.join().unwrap();
        }
        let mut pieces = std::mem::take(&mut *taken.lock().unwrap());
        pieces.sort_by_key(|p| p.0);
        let got: Vec<u8> = pieces.into_iter().flat_map(|p| p.1).collect();
        assert_eq!(got.len(), TOTAL, "bytes lost or repeated");
        assert!(got == data, "bytes out of order");
    });
}

/// Linux: a connected UDP socket whose datagram hits a closed port gets
/// the ICMP error as `ECONNREFUSED` on its next receive, and a receive
/// already blocked returns it (std's blocking `recv`). A fiber parked in
/// `recv` when a clone sends wakes with `ConnectionRefused`, and the next
/// datagram from the peer is received whole; a parked `recv_from` with a
/// buffer smaller than the datagram gets it truncated, with its sender,
/// as std's.
macro_rules! udp_refused_record {
    ($u:ty, $run:expr) => {{
        let mut seen: Vec<String> = Vec::new();
        let closed = <$u>::bind("127.0.0.1:0").unwrap();
        let closed_addr = closed.local_addr().unwrap();
        drop(closed);
        let a = Arc::new(<$u>::bind("127.0.0.1:0").unwrap());
        a.connect(closed_addr).unwrap();
        let a2 = a.clone();
        let twin = a.try_clone().unwrap();
        let r = $run(
            Box::new(move || format!("{:?}", a2.recv(&mut [0u8; 8]).map_err(|e| e.kind())))
                as Box<dyn FnOnce() -> String + Send>,
            Box::new(move || {
                twin.send(b"ping").unwrap();
            }) as Box<dyn FnOnce() + Send>,
        );
        seen.push(format!("parked recv {r}"));
        seen.push(format!(
            "take_error after {:?}",
            a.take_error().unwrap().map(|e| e.kind())
        ));
        let peer = <$u>::bind(closed_addr).unwrap();
        peer.send_to(b"0123456789", a.local_addr().unwrap()).unwrap();
        let mut buf = [0u8; 16];
        seen.push(format!("{:?}", a.recv(&mut buf).map(|n| buf[..n].to_vec())));
        let b = Arc::new(<$u>::bind("127.0.0.1:0").unwrap());
        let b2 = b.clone();
        let b_addr = b.local_addr().unwrap();
        let peer_addr = peer.local_addr().unwrap();
        let r = $run(
            Box::new(move || {
                let mut small = [0u8; 4];
                format!(
                    "{:?}",
                    b2.recv_from(&mut small)
                        .map(|(n, from)| (small[..n].to_vec(), from == peer_addr))
                )
            }) as Box<dyn FnOnce() -> String + Send>,
            Box::new(move || {
                peer.send_to(b"truncated!", b_addr).unwrap();
                peer.send_to(b"whole", b_addr).unwrap();
            }) as Box<dyn FnOnce() + Send>,
        );
        seen.push(format!("parked small recv_from {r}"));
        seen.push(format!("{:?}", b.recv_from(&mut buf).map(|(n, _)| buf[..n].to_vec())));
        seen
    }};
}

#[test]
fn a_parked_udp_receive_gets_connection_refused_and_truncation_like_std() {
    let std_record = within(20, || {
        udp_refused_record!(
            std::net::UdpSocket,
            |recv: Box<dyn FnOnce() -> String + Send>, send: Box<dyn FnOnce() + Send>| {
                let t = std::thread::spawn(recv);
                // The order does not change std's outcome: a pending
                // error or datagram is returned at once too.
                send();
                t.join().unwrap()
            }
        )
    });
    let fiber_record = within(20, || {
        let rt = rt2();
        let run = |recv: Box<dyn FnOnce() -> String + Send>, send: Box<dyn FnOnce() + Send>| {
            let h = rt.spawn(recv);
            wait_parked(&rt, 1);
            rt.spawn(send).join().unwrap();
            h.join().unwrap()
        };
        udp_refused_record!(UdpSocket, run)
    });
    assert_eq!(fiber_record, std_record);
}

fn abstract_name(tag: &str) -> Vec<u8> {
    format!("fiber-adv22-{}-{tag}", std::process::id()).into_bytes()
}

/// Abstract Unix addresses (Linux): a listener bound with `bind_addr`, a
/// stream connected with `connect_addr`, the addresses each side reports,
/// an unbound datagram socket sending with `send_to_addr` to an abstract
/// one (the receiver sees an unnamed sender, and an abstract one after the
/// sender binds), and a name already in use. The record equals std's.
macro_rules! abstract_record {
    ($l:ty, $s:ty, $d:ty, $tag:expr) => {{
        use std::os::linux::net::SocketAddrExt;
        use std::os::unix::net::SocketAddr;
        let mut seen: Vec<String> = Vec::new();
        let name = abstract_name(concat!($tag, "-l"));
        let addr = SocketAddr::from_abstract_name(&name).unwrap();
        let listener = <$l>::bind_addr(&addr).unwrap();
        seen.push(format!(
            "listener {:?}",
            listener
                .local_addr()
                .unwrap()
                .as_abstract_name()
                .map(|n| n == &name[..])
        ));
        seen.push(format!(
            "bind again {:?}",
            <$l>::bind_addr(&addr).map(|_| ()).map_err(|e| e.kind())
        ));
        let client = <$s>::connect_addr(&addr).unwrap();
        let (server, from) = listener.accept().unwrap();
        seen.push(format!(
            "accepted from unnamed {} {:?}",
            from.is_unnamed(),
            from.as_abstract_name()
        ));
        seen.push(format!(
            "client peer {:?}",
            client.peer_addr().unwrap().as_abstract_name().map(|n| n == &name[..])
        ));
        (&client).write_all(b"abs").unwrap();
        let mut got = [0u8; 3];
        (&server).read_exact(&mut got).unwrap();
        seen.push(format!("{:?}", got));
        let missing = SocketAddr::from_abstract_name(abstract_name(concat!($tag, "-none"))).unwrap();
        seen.push(format!(
            "connect to nobody {:?}",
            <$s>::connect_addr(&missing).map(|_| ()).map_err(|e| e.kind())
        ));
        let dname = abstract_name(concat!($tag, "-d"));
        let daddr = SocketAddr::from_abstract_name(&dname).unwrap();
        let rx = <$d>::bind_addr(&daddr).unwrap();
        let tx = <$d>::unbound().unwrap();
        tx.send_to_addr(b"anon", &daddr).unwrap();
        let mut buf = [0u8; 8];
        let (n, from) = rx.recv_from(&mut buf).unwrap();
        seen.push(format!("{:?} unnamed {}", &buf[..n], from.is_unnamed()));
        let sname = abstract_name(concat!($tag, "-s"));
        let sender = <$d>::bind_addr(&SocketAddr::from_abstract_name(&sname).unwrap()).unwrap();
        sender.send_to_addr(b"named", &daddr).unwrap();
        let (n, from) = rx.recv_from(&mut buf).unwrap();
        seen.push(format!(
            "{:?} from {:?}",
            &buf[..n],
            from.as_abstract_name().map(|a| a == &sname[..])
        ));
        sender.connect_addr(&daddr).unwrap();
        sender.send(b"conn").unwrap();
        let n = rx.recv(&mut buf).unwrap();
        seen.push(format!("{:?}", &buf[..n]));
        seen
    }};
}

#[test]
fn abstract_unix_addresses_behave_like_std() {
    let std_record = within(20, || {
        abstract_record!(
            std::os::unix::net::UnixListener,
            std::os::unix::net::UnixStream,
            std::os::unix::net::UnixDatagram,
            "std"
        )
    });
    let fiber_record = within(20, || {
        rt2().block_on(|| abstract_record!(UnixListener, UnixStream, UnixDatagram, "fiber"))
    });
    let thread_record = within(20, || {
        abstract_record!(UnixListener, UnixStream, UnixDatagram, "thread")
    });
    assert_eq!(fiber_record, std_record, "in a fiber");
    assert_eq!(thread_record, std_record, "on a plain thread");
}

/// Open descriptors of this process.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// A runtime dropped while 150 fibers are parked on sockets: in `accept`
/// (two clones of one listener), TCP and Unix `read`, `write` on full
/// buffers, `connect` to a listener whose backlog is full (the SYN is
/// dropped), `connect_timeout` with a long timeout, UDP `recv_from` and
/// Unix datagram `recv`, a third of them looping on their call and
/// ignoring errors. The drop returns; every call parked at the time ended
/// with the cancellation error (kind `Other` holding `fiber::Cancelled`);
/// every descriptor the fibers owned is closed, no socket waiter is left
/// counted (`io_waiters`), and the listener and the peers' sockets, owned
/// outside the runtime, keep working from a plain thread. In a child
/// process: the descriptor count must be exact.
#[test]
fn a_runtime_dropped_with_150_fibers_parked_on_sockets_closes_every_descriptor() {
    in_child(
        "a_runtime_dropped_with_150_fibers_parked_on_sockets_closes_every_descriptor",
        60,
        || {
            // Start the I/O driver (its descriptors live as long as the process).
            drop(TcpListener::bind("127.0.0.1:0").unwrap());
            let rt = fiber::Runtime::builder()
                .workers(2)
                .max_workers(2)
                .shutdown_timeout(ms(300))
                .build()
                .unwrap();
            // Run one fiber so the runtime's own descriptors exist.
            rt.block_on(|| ());
            let before = open_fds();
            let listener = Arc::new(TcpListener::bind("127.0.0.1:0").unwrap());
            let addr = listener.local_addr().unwrap();
            // A listener with a full backlog: connects to it stay in SYN_SENT.
            let full = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            // SAFETY: a valid listening fd; listen(2) again only sets the backlog.
            assert_eq!(unsafe { libc::listen(full.as_raw_fd(), 0) }, 0);
            let full_addr = full.local_addr().unwrap();
            let mut fill = Vec::new();
            loop {
                match std::net::TcpStream::connect_timeout(&full_addr, ms(200)) {
                    Ok(s) => fill.push(s),
                    Err(e) => {
                        assert_eq!(e.kind(), ErrorKind::TimedOut);
                        break;
                    }
                }
                assert!(fill.len() < 100, "the backlog never filled");
            }
            let outcomes = Arc::new(Mutex::new(Vec::<String>::new()));
            let mut peers: Vec<Box<dyn std::any::Any>> = Vec::new();
            let mut count = 0usize;
            for i in 0..150usize {
                let stubborn = i % 3 == 0;
                let outcomes = outcomes.clone();
                let record = move |r: std::io::Result<()>| {
                    let line = match r {
                        Ok(()) => "ok".to_string(),
                        Err(e) if is_cancelled_io(&e) => "cancelled".to_string(),
                        Err(e) => format!("{:?}", e.kind()),
                    };
                    outcomes.lock().unwrap().push(line);
                };
                let body: Box<dyn FnOnce() + Send> = match i % 8 {
                    0 => {
                        let l = if i % 16 == 0 {
                            listener.clone()
                        } else {
                            Arc::new(listener.try_clone().unwrap())
                        };
                        Box::new(move || loop {
                            record(l.accept().map(drop));
                            if !stubborn {
                                break;
                            }
                        })
                    }
                    1 | 2 => {
                        let (c, s) = rt.block_on(tcp_pair);
                        let s = s.into_std().unwrap();
                        peers.push(Box::new(s));
                        if i % 8 == 1 {
                            Box::new(move || loop {
                                record((&c).read(&mut [0u8; 8]).map(drop));
                                if !stubborn {
                                    break;
                                }
                            })
                        } else {
                            Box::new(move || loop {
                                let r = loop {
                                    if let Err(e) = (&c).write(&[1u8; 1 << 16]) {
                                        break Err(e);
                                    }
                                };
                                record(r);
                                if !stubborn {
                                    break;
                                }
                            })
                        }
                    }
                    3 => Box::new(move || loop {
                        record(TcpStream::connect(full_addr).map(drop));
                        if !stubborn {
                            break;
                        }
                    }),
                    4 => Box::new(move || loop {
                        record(TcpStream::connect_timeout(&full_addr, Duration::from_secs(60)).map(drop));
                        if !stubborn {
                            break;
                        }
                    }),
                    5 => {
                        let u = UdpSocket::bind("127.0.0.1:0").unwrap();
                        Box::new(move || loop {
                            record(u.recv_from(&mut [0u8; 8]).map(drop));
                            if !stubborn {
                                break;
                            }
                        })
                    }
                    6 => {
                        let (a, b) = UnixStream::pair().unwrap();
                        peers.push(Box::new(b.into_std().unwrap()));
                        Box::new(move || loop {
                            record((&a).read(&mut [0u8; 8]).map(drop));
                            if !stubborn {
                                break;
                            }
                        })
                    }
                    _ => {
                        let (a, b) = UnixDatagram::pair().unwrap();
                        peers.push(Box::new(b.into_std().unwrap()));
                        Box::new(move || loop {
                            record(a.recv(&mut [0u8; 8]).map(drop));
                            if !stubborn {
                                break;
                            }
                        })
                    }
                };
                rt.spawn(body);
                count += 1;
            }
            wait_parked(&rt, count);
            let waiting = fiber::net::io_waiters();
            assert!(waiting >= count, "{waiting} socket waiters for {count} parked fibers");
            let (tx, rx) = mpsc::channel();
            std::thread::spawn(move || {
                drop(rt);
                let _ = tx.send(());
            });
            rx.recv_timeout(Duration::from_secs(20))
                .expect("dropping the runtime hung");
            let outcomes = std::mem::take(&mut *outcomes.lock().unwrap());
            assert!(
                outcomes.len() >= count,
                "{} outcomes for {count} fibers",
                outcomes.len()
            );
            let odd: Vec<_> = outcomes.iter().filter(|o| *o != "cancelled").collect();
            assert!(odd.is_empty(), "parked calls ended otherwise: {odd:?}");
            assert_eq!(fiber::net::io_waiters(), 0, "socket waiters left counted");
            // The listener, owned here, still accepts, from a plain thread.
            let client = std::net::TcpStream::connect(addr).unwrap();
            let (conn, from) = listener.accept().unwrap();
            assert_eq!(from, client.local_addr().unwrap());
            drop((conn, client, listener, peers, fill, full));
            let after = open_fds();
            assert_eq!(after, before, "descriptors before {before}, after {after}");
        },
    );
}

/// A fiber parked in `connect_timeout` (a long timeout, to a listener
/// whose backlog is full) that is cancelled returns the cancellation
/// error, not `TimedOut`, at once; one inside `fiber::with_timeout` whose
/// deadline is shorter than the connect timeout ends at the deadline,
/// with the cancellation error inside; a connect timeout shorter than the
/// deadline expires first with `TimedOut`, as std's. A closed port is
/// `ConnectionRefused`, as std's.
#[test]
fn connect_timeout_meets_cancellation_and_with_timeout() {
    within(30, || {
        let full = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        // SAFETY: a valid listening fd; listen(2) again only sets the backlog.
        assert_eq!(unsafe { libc::listen(full.as_raw_fd(), 0) }, 0);
        let full_addr = full.local_addr().unwrap();
        let mut fill = Vec::new();
        while let Ok(s) = std::net::TcpStream::connect_timeout(&full_addr, ms(200)) {
            fill.push(s);
            assert!(fill.len() < 100, "the backlog never filled");
        }
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let std_refused = std::net::TcpStream::connect_timeout(&closed, ms(500))
            .unwrap_err()
            .kind();
        let rt = rt2();
        let h = rt.spawn(move || TcpStream::connect_timeout(&full_addr, Duration::from_secs(30)).map(drop));
        wait_parked(&rt, 1);
        let start = Instant::now();
        h.cancel();
        let joined = h.join();
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "the cancel took {:?}",
            start.elapsed()
        );
        match joined {
            Ok(Err(e)) => assert!(is_cancelled_io(&e), "{e:?}"),
            Err(e) => assert!(e.is_cancelled(), "{e:?}"),
            Ok(Ok(())) => panic!("connected to a full backlog"),
        }
        rt.block_on(move || {
            let mut inner = None;
            let start = Instant::now();
            let outer = fiber::with_timeout(ms(50), || {
                inner = Some(TcpStream::connect_timeout(&full_addr, Duration::from_secs(30)).map(drop));
            });
            assert!(outer.is_err(), "with_timeout did not time out");
            let e = inner.expect("the connect returned").unwrap_err();
            assert!(is_cancelled_io(&e), "{e:?}");
            assert!(start.elapsed() < Duration::from_secs(2));
            let r = fiber::with_timeout(Duration::from_secs(10), || {
                TcpStream::connect_timeout(&full_addr, ms(60)).map(drop)
            });
            let e = r.expect("with_timeout expired first").unwrap_err();
            assert_eq!(e.kind(), ErrorKind::TimedOut, "{e:?}");
            let e = TcpStream::connect_timeout(&closed, ms(500)).unwrap_err();
            assert_eq!(e.kind(), std_refused);
            assert_eq!(e.kind(), ErrorKind::ConnectionRefused);
        });
        drop(fill);
    });
}

/// Empty reads on a stream with a read timeout and no data, as std on
/// Linux gives them: TCP's `recv` of 0 bytes sleeps out the timeout and
/// returns 0 (the kernel's receive loop ends on the length); a Unix
/// stream's sleeps out the timeout and fails with `EAGAIN` (its receive
/// loop retries after the wait and reports the expiry). A `read_vectored`
/// of empty slices returns 0 at once on both (the kernel's `readv` does
/// not reach the socket for 0 bytes). spec/net.md's "a read into an empty
/// buffer whose timeout expires returns `Ok(0)`, as a blocking `recv` of
/// 0 bytes does" holds for TCP only.
macro_rules! empty_read_record {
    ($tcp:expr, $unix:expr) => {{
        let mut seen: Vec<String> = Vec::new();
        let (c, _s) = $tcp;
        let (u, _v) = $unix;
        c.set_read_timeout(Some(ms(40))).unwrap();
        u.set_read_timeout(Some(ms(40))).unwrap();
        let timed = |what: &str, f: &mut dyn FnMut() -> std::io::Result<usize>| {
            let start = Instant::now();
            let r = f();
            format!(
                "{what} {:?} waited {}",
                r.map_err(|e| (e.kind(), e.raw_os_error())),
                start.elapsed() >= ms(35)
            )
        };
        seen.push(timed("tcp read", &mut || (&c).read(&mut [])));
        seen.push(timed("tcp read_vectored", &mut || {
            (&c).read_vectored(&mut [std::io::IoSliceMut::new(&mut [])])
        }));
        seen.push(timed("unix read", &mut || (&u).read(&mut [])));
        seen.push(timed("unix read_vectored", &mut || {
            (&u).read_vectored(&mut [std::io::IoSliceMut::new(&mut [])])
        }));
        seen
    }};
}

// Failed before the fix: an empty read on a Unix stream whose read timeout expires returns Ok(0), where std's fails with WouldBlock (EAGAIN)
#[test]
fn empty_reads_with_an_expiring_timeout_match_std_on_tcp_and_unix_streams() {
    let std_record = within(20, || {
        empty_read_record!(
            {
                let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
                let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
                (c, l.accept().unwrap().0)
            },
            std::os::unix::net::UnixStream::pair().unwrap()
        )
    });
    let fiber_record = within(20, || {
        rt2().block_on(|| empty_read_record!(tcp_pair(), UnixStream::pair().unwrap()))
    });
    let thread_record = within(20, || empty_read_record!(tcp_pair(), UnixStream::pair().unwrap()));
    assert_eq!(fiber_record, std_record, "in a fiber");
    assert_eq!(thread_record, std_record, "on a plain thread");
}

/// A runtime dropped while fibers are parked on sockets inside
/// `fiber::non_cancellable` (the shutdown's cancellation does not end
/// those waits, so teardown takes them): the drop returns, each fiber's
/// socket is closed, and no socket waiter is left counted (`io_waiters`,
/// and fiber-core's `external_waiters`, which holds the deadlock report
/// off for every runtime in the process). A socket the fiber parked on
/// that outlives the runtime (owned outside) then still works, and an
/// event on it (the peer writes) wakes nobody stale. In a child process:
/// the counters are process-wide.
#[test]
fn a_runtime_dropped_with_fibers_parked_non_cancellably_on_sockets_leaves_nothing_behind() {
    in_child(
        "a_runtime_dropped_with_fibers_parked_non_cancellably_on_sockets_leaves_nothing_behind",
        60,
        || {
            drop(TcpListener::bind("127.0.0.1:0").unwrap());
            let rt = fiber::Runtime::builder()
                .workers(2)
                .max_workers(2)
                .shutdown_timeout(ms(200))
                .build()
                .unwrap();
            rt.block_on(|| ());
            let before = open_fds();
            let mut peers = Vec::new();
            let mut kept = Vec::new();
            for i in 0..8 {
                let (c, s) = rt.block_on(tcp_pair);
                peers.push(s);
                let c = Arc::new(c);
                if i % 2 == 0 {
                    kept.push(c.clone());
                }
                rt.spawn(move || {
                    fiber::non_cancellable(|| {
                        let _ = (&*c).read(&mut [0u8; 8]);
                    })
                });
            }
            let u = Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
            let u2 = u.clone();
            rt.spawn(move || fiber::non_cancellable(|| u2.recv_from(&mut [0u8; 8]).map(drop)));
            wait_parked(&rt, 9);
            assert!(fiber::net::io_waiters() >= 9);
            let (tx, rx) = mpsc::channel();
            std::thread::spawn(move || {
                drop(rt);
                let _ = tx.send(());
            });
            rx.recv_timeout(Duration::from_secs(20))
                .expect("dropping the runtime hung");
            assert_eq!(fiber::net::io_waiters(), 0, "socket waiters left counted");
            assert_eq!(fiber::core::external_waiters(), 0, "external waits left counted");
            // The sockets kept outside work from a plain thread; events on
            // them find no stale waiter.
            for (i, c) in kept.iter().enumerate() {
                (&peers[2 * i]).write_all(b"after").unwrap();
                let mut got = [0u8; 5];
                (&**c).read_exact(&mut got).unwrap();
                assert_eq!(&got, b"after");
            }
            let sender = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            sender.send_to(b"dgram", u.local_addr().unwrap()).unwrap();
            let mut buf = [0u8; 8];
            assert_eq!(u.recv_from(&mut buf).unwrap().0, 5);
            drop((kept, u, peers, sender));
            let after = open_fds();
            assert_eq!(after, before, "descriptors before {before}, after {after}");
        },
    );
}

/// Linux copies a TCP listener's `SO_RCVTIMEO` / `SO_SNDTIMEO` to the
/// sockets it accepts, but not a Unix listener's (`unix_stream_connect`
/// makes the new socket afresh): std's stream accepted from a Unix
/// listener with both timeouts set has none, and its read waits for data.
/// A fiber Unix listener adopted with `from_std` (which takes the
/// listener's timeouts, spec/net.md section 3) must accept the same:
/// streams with no timeouts, whose read waits for the data written
/// 150 ms later rather than failing with `WouldBlock` after 50 ms.
// Failed before the fix: a stream accepted from an adopted UnixListener carrying SO_RCVTIMEO/SO_SNDTIMEO reports and obeys them (read fails with WouldBlock), where std's accepted unix stream has no timeouts
#[test]
fn a_unix_listener_s_timeouts_do_not_pass_to_accepted_streams_like_std() {
    fn listener_with_timeouts(name: &str) -> (std::os::unix::net::UnixListener, std::path::PathBuf) {
        let path = temp_path(name);
        let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
        set_sock_timeout(l.as_raw_fd(), libc::SO_RCVTIMEO, ms(50));
        set_sock_timeout(l.as_raw_fd(), libc::SO_SNDTIMEO, ms(60));
        (l, path)
    }
    // std reference: the accepted stream has no timeouts and waits.
    let std_record = within(20, || {
        let (l, path) = listener_with_timeouts("timeouts-std");
        let mut c = std::os::unix::net::UnixStream::connect(&path).unwrap();
        let (mut s, _) = l.accept().unwrap();
        let _ = std::fs::remove_file(&path);
        let got = (s.read_timeout().unwrap(), s.write_timeout().unwrap());
        let t = std::thread::spawn(move || {
            std::thread::sleep(ms(150));
            c.write_all(b"late").unwrap();
        });
        let mut buf = [0u8; 4];
        let read = s.read(&mut buf).map_err(|e| e.kind());
        t.join().unwrap();
        (got, read)
    });
    assert_eq!(std_record, ((None, None), Ok(4)));
    let fiber_record = within(20, || {
        rt2().block_on(|| {
            let (l, path) = listener_with_timeouts("timeouts-fiber");
            let l = UnixListener::from_std(l).unwrap();
            let c = UnixStream::connect(&path).unwrap();
            let (s, _) = l.accept().unwrap();
            let _ = std::fs::remove_file(&path);
            let got = (s.read_timeout().unwrap(), s.write_timeout().unwrap());
            let writer = fiber::spawn(move || {
                fiber::sleep(ms(150)).unwrap();
                (&c).write_all(b"late").unwrap();
            });
            let mut buf = [0u8; 4];
            let read = (&s).read(&mut buf).map_err(|e| e.kind());
            writer.join().unwrap();
            (got, read)
        })
    });
    assert_eq!(fiber_record, std_record);
}

/// std on Linux: a UDP socket bound to `[::]` receives IPv4 datagrams too
/// (`IPV6_V6ONLY` off, the kernel default), from a v4-mapped address, and
/// answers them; one bound to `[::1]` does not get them.
macro_rules! udp_dual_stack_record {
    ($u:ty) => {{
        let mut seen: Vec<String> = Vec::new();
        let any = <$u>::bind("[::]:0").unwrap();
        any.set_read_timeout(Some(ms(300))).unwrap();
        let port = any.local_addr().unwrap().port();
        let v4 = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        v4.set_read_timeout(Some(ms(300))).unwrap();
        v4.send_to(b"four", ("127.0.0.1", port)).unwrap();
        let mut buf = [0u8; 8];
        match any.recv_from(&mut buf) {
            Ok((n, from)) => {
                seen.push(format!("{:?} from v6 {}", &buf[..n], from.is_ipv6()));
                any.send_to(b"back", from).unwrap();
                let (n, _) = v4.recv_from(&mut buf).unwrap();
                seen.push(format!("{:?}", &buf[..n]));
            }
            Err(e) => seen.push(format!("{:?}", e.kind())),
        }
        seen
    }};
}

#[test]
fn a_udp_socket_bound_to_the_ipv6_any_address_takes_ipv4_like_std() {
    if std::net::UdpSocket::bind("[::]:0").is_err() {
        return; // no IPv6 here
    }
    let std_record = within(20, || udp_dual_stack_record!(std::net::UdpSocket));
    let fiber_record = within(20, || rt2().block_on(|| udp_dual_stack_record!(UdpSocket)));
    assert_eq!(fiber_record, std_record);
}

/// std: `shutdown(Write)` on a Unix stream fails a write blocked on it at
/// once with `BrokenPipe`, whichever descriptor of the socket the shutdown
/// goes through. Here the writer is a fiber handle adopted with
/// `from_std`, and the shutdown comes through a std handle cloned before
/// the adoption (also through `shutdown(2)` on a raw duplicate). A Unix
/// socket's poll reports nothing for a send shutdown, and fiber wakes the
/// parked writers only of the handles `try_clone` made (spec/net.md
/// section 1), so the write stays parked until the peer reads.
// Known limit (spec/net.md section 3): a write parked on a full Unix stream
// is not woken when the socket is shut down for writing through another
// descriptor (a std clone made before `from_std`, or a raw dup), where
// std's blocked write fails with BrokenPipe: the kernel sends no readiness
// event for a unix send shutdown, and only this handle's own clones are
// told. It ends when the peer reads or closes, or by a timeout or a cancel.
#[ignore = "known limit: a unix write shutdown through a descriptor fiber does not own wakes no parked write"]
#[test]
fn a_unix_write_shutdown_through_another_descriptor_fails_a_parked_write_like_std() {
    // std reference.
    within(20, || {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let other = a.try_clone().unwrap();
        let t = std::thread::spawn(move || crate::common::write_until_error(|| (&a).write(&[0u8; 65536])));
        // The outcome does not depend on whether the write is blocked yet.
        other.shutdown(Shutdown::Write).unwrap();
        assert_eq!(t.join().unwrap(), ErrorKind::BrokenPipe);
    });
    for raw in [false, true] {
        within(20, move || {
            let rt = rt2();
            let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
            let other = a.try_clone().unwrap();
            let a = UnixStream::from_std(a).unwrap();
            let (tx, rx) = mpsc::channel();
            let h = rt.spawn(move || {
                let _ = tx.send(crate::common::write_until_error(|| (&a).write(&[0u8; 65536])));
            });
            wait_parked(&rt, 1);
            if raw {
                // SAFETY: `other` is an open socket for the call.
                assert_eq!(unsafe { libc::shutdown(other.as_raw_fd(), libc::SHUT_WR) }, 0);
            } else {
                other.shutdown(Shutdown::Write).unwrap();
            }
            let got = rx.recv_timeout(Duration::from_secs(2));
            if got.is_err() {
                h.cancel();
            }
            let _ = h.join();
            assert_eq!(got, Ok(ErrorKind::BrokenPipe), "raw shutdown(2): {raw}");
        });
    }
}
