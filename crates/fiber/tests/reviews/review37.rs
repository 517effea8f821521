//! Review 37: realistic network servers under load, written the way a Go or
//! tokio user writes them from README.md and the rustdoc: a line-echo
//! server, a tiny HTTP/1.1 keep-alive server (one fiber per connection), a
//! splicing proxy (two fibers per connection through `try_clone`,
//! `shutdown(Write)` on end of file), a pub/sub fan-out over channels, a
//! server with per-connection read timeouts and an idle reaper
//! (`set_read_timeout`, `with_timeout`) and a UDP request/response server.
//! They are driven from plain threads and from fibers by many concurrent
//! clients (connection churn, slow one-byte clients, half-closing,
//! resetting and vanishing clients), then stopped while connections are
//! open and fibers are parked in accept, read and write (the scope
//! cancelled, the listener dropped, the runtime dropped). Checked: exact
//! results (every byte echoed once and in order, every request answered),
//! bounded latency, no descriptor leak (`/proc/self/fd`, in a child
//! process), no fiber leak (`fibers_alive` back to zero), shutdown within
//! its grace time, no hang. Also the readiness protocol's corners: two
//! fibers on one socket through `try_clone`, descriptor numbers reused
//! while another handle of the old socket is parked.
use crate::common::*;

use fiber::net::{Shutdown, TcpListener, TcpStream, UdpSocket};
use std::io::{self, BufRead, BufReader, ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A client's operations: write, read everything, close (reset or not).
type ClientOps = (Box<dyn Fn(&[u8])>, Box<dyn Fn() -> String>, Box<dyn Fn(bool)>);

// ------------------------------------------------------------------ helpers

/// Wait (on a plain thread, up to 5 s) until `rt` has no fiber alive. A
/// fiber's frame is released just after its join returns to a plain
/// thread, so the count lags a join by a moment (known, not a finding).
fn wait_no_fibers(rt: &fiber::Runtime) {
    let start = Instant::now();
    while rt.stats().fibers_alive != 0 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "fibers left alive: {}",
            rt.stats().fibers_alive
        );
        std::thread::sleep(ms(1));
    }
}

fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Start the process-wide I/O driver (its epoll descriptors live for the
/// life of the process), so that descriptor counts taken after this see
/// only sockets.
fn warm_up_driver() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    drop(l);
}

fn is_cancelled(e: &io::Error) -> bool {
    e.kind() == ErrorKind::Other && e.get_ref().is_some_and(|i| i.is::<fiber::core::Cancelled>())
}

fn pattern_at(i: usize) -> u8 {
    (i % 251) as u8
}

fn pattern(seed: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| pattern_at(i + seed)).collect()
}

/// The line-echo connection handler: every line back as it came.
fn echo_lines(conn: TcpStream) -> io::Result<u64> {
    let mut reader = BufReader::new(&conn);
    let mut line = Vec::new();
    let mut total = 0u64;
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line)? == 0 {
            return Ok(total);
        }
        (&conn).write_all(&line)?;
        total += line.len() as u64;
    }
}

/// A line-echo server: one fiber per connection, in a scope; returns when
/// its fiber is cancelled (accept fails with `Cancelled`), after every
/// connection fiber ended. Counts bytes echoed and handlers ended.
fn echo_server(listener: TcpListener, echoed: Arc<AtomicU64>, ended: Arc<AtomicUsize>) {
    fiber::scope(|s| loop {
        match listener.accept() {
            Ok((conn, _)) => {
                let (echoed, ended) = (echoed.clone(), ended.clone());
                s.spawn(move || {
                    if let Ok(n) = echo_lines(conn) {
                        echoed.fetch_add(n, Ordering::SeqCst);
                    }
                    ended.fetch_add(1, Ordering::SeqCst);
                });
            }
            Err(e) if is_cancelled(&e) => return,
            Err(e) => panic!("accept failed: {e}"),
        }
    })
}

/// A line-echo client: `lines` lines, each checked when it comes back;
/// slow clients write one byte per call.
fn echo_client<S>(stream: S, id: usize, lines: usize, slow: bool) -> u64
where
    for<'a> &'a S: Read + Write,
{
    let mut reader = BufReader::new(&stream);
    let mut got = Vec::new();
    let mut total = 0;
    for k in 0..lines {
        let line = format!("client {id} line {k} {}\n", "x".repeat((id * 7 + k) % 60));
        if slow {
            for b in line.as_bytes() {
                (&stream).write_all(std::slice::from_ref(b)).unwrap();
            }
        } else {
            (&stream).write_all(line.as_bytes()).unwrap();
        }
        got.clear();
        reader.read_until(b'\n', &mut got).unwrap();
        assert_eq!(got, line.as_bytes(), "client {id} line {k}");
        total += line.len() as u64;
    }
    total
}

// --------------------------------------------------------------- line echo

/// 150 fiber clients and 50 plain-thread clients (every tenth writing one
/// byte per call) against the echo server on a two-worker runtime; then
/// the server's fiber is cancelled while it is parked in accept.
#[test]
fn line_echo_server_many_clients_threads_and_fibers() {
    within(60, || {
        let rt = rt2();
        let listener = rt.block_on(|| TcpListener::bind("127.0.0.1:0").unwrap());
        let addr = listener.local_addr().unwrap();
        let (echoed, ended) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicUsize::new(0)));
        let (e2, n2) = (echoed.clone(), ended.clone());
        let server = rt.spawn(move || echo_server(listener, e2, n2));
        let threads: Vec<_> = (0..50)
            .map(|id| {
                std::thread::spawn(move || {
                    let s = std::net::TcpStream::connect(addr).unwrap();
                    s.set_nodelay(true).unwrap();
                    echo_client(s, id, 20, id % 10 == 0)
                })
            })
            .collect();
        let from_fibers: u64 = rt.block_on(move || {
            let clients: Vec<_> = (50..200)
                .map(|id| {
                    fiber::spawn(move || {
                        let s = TcpStream::connect(addr).unwrap();
                        s.set_nodelay(true).unwrap();
                        echo_client(s, id, 20, id % 10 == 0)
                    })
                })
                .collect();
            clients.into_iter().map(|c| c.join().unwrap()).sum()
        });
        let from_threads: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
        // Every client closed its socket: every handler reads end of file.
        let start = Instant::now();
        while ended.load(Ordering::SeqCst) < 200 {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "handlers still running: {}",
                ended.load(Ordering::SeqCst)
            );
            std::thread::sleep(ms(2));
        }
        assert_eq!(echoed.load(Ordering::SeqCst), from_fibers + from_threads);
        server.cancel();
        let start = Instant::now();
        server.join().unwrap_or_else(|e| assert!(e.is_cancelled(), "{e:?}"));
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "cancel took {:?}",
            start.elapsed()
        );
        wait_no_fibers(&rt);
    });
}

// ------------------------------------------------------------------- HTTP

fn http_handle(conn: TcpStream) -> io::Result<usize> {
    let mut reader = BufReader::new(&conn);
    let mut served = 0;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(served);
        }
        assert!(
            line.starts_with("GET /") || line.starts_with("POST /"),
            "bad request line {line:?}"
        );
        let path = line.split(' ').nth(1).unwrap().to_string();
        let mut len = 0usize;
        let mut close = false;
        loop {
            let mut h = String::new();
            reader.read_line(&mut h)?;
            if h == "\r\n" {
                break;
            }
            let lower = h.to_ascii_lowercase();
            if let Some(v) = lower.strip_prefix("content-length:") {
                len = v.trim().parse().unwrap();
            }
            if lower.starts_with("connection: close") {
                close = true;
            }
        }
        let mut body = vec![0; len];
        reader.read_exact(&mut body)?;
        let reply = format!("{path} {}", body.len());
        let resp = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n{}\r\n{reply}",
            reply.len(),
            if close { "Connection: close\r\n" } else { "" }
        );
        (&conn).write_all(resp.as_bytes())?;
        served += 1;
        if close {
            return Ok(served);
        }
    }
}

fn http_client<S>(s: S, id: usize, requests: usize) -> usize
where
    for<'a> &'a S: Read + Write,
{
    let mut reader = BufReader::new(&s);
    for k in 0..requests {
        let path = format!("/c{id}/r{k}");
        let body = "b".repeat((id + k) % 300);
        let close = k + 1 == requests;
        let req = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n{}\r\n{body}",
            body.len(),
            if close { "Connection: close\r\n" } else { "" }
        );
        (&s).write_all(req.as_bytes()).unwrap();
        let mut status = String::new();
        reader.read_line(&mut status).unwrap();
        assert_eq!(status, "HTTP/1.1 200 OK\r\n", "client {id} request {k}");
        let mut len = 0;
        loop {
            let mut h = String::new();
            reader.read_line(&mut h).unwrap();
            if h == "\r\n" {
                break;
            }
            if let Some(v) = h.strip_prefix("Content-Length: ") {
                len = v.trim().parse().unwrap();
            }
        }
        let mut got = vec![0; len];
        reader.read_exact(&mut got).unwrap();
        assert_eq!(String::from_utf8(got).unwrap(), format!("{path} {}", body.len()));
    }
    // The server closes after `Connection: close`.
    let mut rest = Vec::new();
    assert_eq!(reader.read_to_end(&mut rest).unwrap(), 0);
    requests
}

/// 300 keep-alive connections of 10 requests each (200 from fibers of a
/// second runtime, 100 from plain threads): every request answered, the
/// right answer on the right connection.
#[test]
fn http_keep_alive_server_300_connections() {
    within(90, || {
        let rt = rt2();
        let listener = rt.block_on(|| TcpListener::bind("127.0.0.1:0").unwrap());
        let addr = listener.local_addr().unwrap();
        let served = Arc::new(AtomicUsize::new(0));
        let s2 = served.clone();
        let server = rt.spawn(move || {
            for conn in listener.incoming() {
                let conn = match conn {
                    Ok(c) => c,
                    Err(e) if is_cancelled(&e) => return,
                    Err(e) => panic!("{e}"),
                };
                let served = s2.clone();
                fiber::spawn(move || served.fetch_add(http_handle(conn).unwrap(), Ordering::SeqCst));
            }
        });
        let threads: Vec<_> = (0..100)
            .map(|id| std::thread::spawn(move || http_client(std::net::TcpStream::connect(addr).unwrap(), id, 10)))
            .collect();
        let clients = rt1();
        let n: usize = clients.block_on(move || {
            let hs: Vec<_> = (100..300)
                .map(|id| fiber::spawn(move || http_client(TcpStream::connect(addr).unwrap(), id, 10)))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum()
        });
        let m: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(n + m, 3000);
        assert_eq!(served.load(Ordering::SeqCst), 3000);
        server.cancel();
        let _ = server.join();
        drop(clients);
        let start = Instant::now();
        while rt.stats().fibers_alive != 0 {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "fibers left: {}",
                rt.stats().fibers_alive
            );
            std::thread::sleep(ms(2));
        }
    });
}

// ------------------------------------------------------------------ proxy

fn splice(from: TcpStream, to: TcpStream) -> io::Result<u64> {
    let mut buf = [0u8; 4096];
    let mut total = 0;
    loop {
        let n = (&from).read(&mut buf)?;
        if n == 0 {
            to.shutdown(Shutdown::Write)?;
            return Ok(total);
        }
        (&to).write_all(&buf[..n])?;
        total += n as u64;
    }
}

/// A backend that echoes everything until end of file, then closes.
fn echo_until_eof(conn: TcpStream) -> io::Result<u64> {
    let mut buf = [0u8; 8192];
    let mut total = 0;
    loop {
        let n = (&conn).read(&mut buf)?;
        if n == 0 {
            conn.shutdown(Shutdown::Write)?;
            return Ok(total);
        }
        (&conn).write_all(&buf[..n])?;
        total += n as u64;
    }
}

fn serve_forever(listener: TcpListener, handler: fn(TcpStream) -> io::Result<u64>, bytes: Arc<AtomicU64>) {
    fiber::scope(|s| loop {
        match listener.accept() {
            Ok((conn, _)) => {
                let bytes = bytes.clone();
                s.spawn(move || {
                    if let Ok(n) = handler(conn) {
                        bytes.fetch_add(n, Ordering::SeqCst);
                    }
                });
            }
            Err(e) if is_cancelled(&e) => return,
            Err(e) => panic!("accept: {e}"),
        }
    })
}

fn proxy(listener: TcpListener, backend: SocketAddr, spliced: Arc<AtomicU64>) {
    fiber::scope(|s| loop {
        match listener.accept() {
            Ok((client, _)) => {
                let spliced = spliced.clone();
                s.spawn(move || {
                    let upstream = TcpStream::connect(backend).unwrap();
                    let (c2, u2) = (client.try_clone().unwrap(), upstream.try_clone().unwrap());
                    let up = fiber::spawn(move || splice(client, upstream));
                    let down = splice(u2, c2);
                    let up = up.join();
                    if let (Ok(d), Ok(Ok(u))) = (down, up) {
                        spliced.fetch_add(d + u, Ordering::SeqCst);
                    }
                });
            }
            Err(e) if is_cancelled(&e) => return,
            Err(e) => panic!("accept: {e}"),
        }
    })
}

/// A proxy client: writes `len` bytes (in one fiber or thread) while it
/// reads them back (in another), half-closes, and reads to end of file.
fn proxy_client_fiber(addr: SocketAddr, id: usize, len: usize) -> usize {
    let s = TcpStream::connect(addr).unwrap();
    let w = s.try_clone().unwrap();
    let writer = fiber::spawn(move || {
        let data = pattern(id, len);
        for chunk in data.chunks(1000 + id % 3000) {
            (&w).write_all(chunk).unwrap();
        }
        w.shutdown(Shutdown::Write).unwrap();
    });
    let mut back = Vec::new();
    (&s).read_to_end(&mut back).unwrap();
    writer.join().unwrap();
    assert_eq!(back.len(), len, "client {id}");
    assert!(back == pattern(id, len), "client {id}: bytes out of order");
    len
}

fn proxy_client_thread(addr: SocketAddr, id: usize, len: usize) -> usize {
    let s = std::net::TcpStream::connect(addr).unwrap();
    let w = s.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        let data = pattern(id, len);
        for chunk in data.chunks(1000 + id % 3000) {
            (&w).write_all(chunk).unwrap();
        }
        w.shutdown(Shutdown::Write).unwrap();
    });
    let mut back = Vec::new();
    (&s).read_to_end(&mut back).unwrap();
    writer.join().unwrap();
    assert_eq!(back.len(), len, "client {id}");
    assert!(back == pattern(id, len), "client {id}: bytes out of order");
    len
}

/// 100 concurrent clients (80 fibers, 20 threads) through a splicing proxy
/// to an echo backend, 1-200 KiB each: every byte back once, in order;
/// both servers end when cancelled; no fiber left.
#[test]
fn splicing_proxy_exact_bytes() {
    within(90, || {
        let rt = rt2();
        let (backend, front) = rt.block_on(|| {
            (
                TcpListener::bind("127.0.0.1:0").unwrap(),
                TcpListener::bind("127.0.0.1:0").unwrap(),
            )
        });
        let (baddr, faddr) = (backend.local_addr().unwrap(), front.local_addr().unwrap());
        let (echoed, spliced) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let e2 = echoed.clone();
        let s2 = spliced.clone();
        let b = rt.spawn(move || serve_forever(backend, echo_until_eof, e2));
        let p = rt.spawn(move || proxy(front, baddr, s2));
        let size = |id: usize| 1024 + (id * 7919) % (200 * 1024);
        let threads: Vec<_> = (0..20)
            .map(|id| std::thread::spawn(move || proxy_client_thread(faddr, id, size(id))))
            .collect();
        let total: usize = rt.block_on(move || {
            let hs: Vec<_> = (20..100)
                .map(|id| fiber::spawn(move || proxy_client_fiber(faddr, id, size(id))))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum::<usize>()
        }) + threads.into_iter().map(|t| t.join().unwrap()).sum::<usize>();
        let expect: usize = (0..100).map(size).sum();
        assert_eq!(total, expect);
        let start = Instant::now();
        while spliced.load(Ordering::SeqCst) != 2 * expect as u64 || echoed.load(Ordering::SeqCst) != expect as u64 {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "spliced {} echoed {} of {expect}",
                spliced.load(Ordering::SeqCst),
                echoed.load(Ordering::SeqCst)
            );
            std::thread::sleep(ms(2));
        }
        p.cancel();
        b.cancel();
        let _ = p.join();
        let _ = b.join();
        wait_no_fibers(&rt);
    });
}

// ---------------------------------------------------------------- pub/sub

/// Pub/sub fan-out: 100 subscribers connect (half from threads), each
/// gets every one of 200 messages in order through its own bounded
/// channel and writer fiber; the publisher's end closes every connection.
#[test]
fn pubsub_fan_out_every_message_in_order() {
    within(60, || {
        const SUBS: usize = 100;
        const MSGS: usize = 200;
        let rt = rt2();
        let listener = rt.block_on(|| TcpListener::bind("127.0.0.1:0").unwrap());
        let addr = listener.local_addr().unwrap();
        let server = rt.spawn(move || {
            let (sub_tx, sub_rx) = fiber::chan::unbounded::<fiber::chan::Sender<Arc<Vec<u8>>>>();
            fiber::scope(|s| {
                // The publisher: waits for every subscriber, then publishes.
                s.spawn(move || {
                    let subs: Vec<_> = sub_rx.iter().take(SUBS).collect();
                    for m in 0..MSGS {
                        let msg = Arc::new(format!("message {m} {}\n", "p".repeat(m % 97)).into_bytes());
                        for tx in &subs {
                            tx.send(msg.clone()).unwrap();
                        }
                    }
                });
                for _ in 0..SUBS {
                    let (conn, _) = listener.accept().unwrap();
                    let (tx, rx) = fiber::chan::bounded::<Arc<Vec<u8>>>(4);
                    sub_tx.send(tx).unwrap();
                    s.spawn(move || {
                        let mut sent = 0;
                        for msg in rx.iter() {
                            (&conn).write_all(&msg).unwrap();
                            sent += 1;
                        }
                        conn.shutdown(Shutdown::Write).unwrap();
                        sent
                    });
                }
            });
        });
        let check = |lines: Vec<String>| {
            assert_eq!(lines.len(), MSGS);
            for (m, l) in lines.iter().enumerate() {
                assert_eq!(l, &format!("message {m} {}", "p".repeat(m % 97)));
            }
        };
        let threads: Vec<_> = (0..SUBS / 2)
            .map(|i| {
                std::thread::spawn(move || {
                    let s = std::net::TcpStream::connect(addr).unwrap();
                    // Every fifth subscriber is slow: it reads 7 bytes at a time.
                    let r: Box<dyn Read> = if i % 5 == 0 {
                        Box::new(s)
                    } else {
                        Box::new(BufReader::new(s))
                    };
                    BufReader::with_capacity(7, r)
                        .lines()
                        .map(|l| l.unwrap())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let fiber_lines = rt.block_on(move || {
            let hs: Vec<_> = (0..SUBS / 2)
                .map(|_| {
                    fiber::spawn(move || {
                        let s = TcpStream::connect(addr).unwrap();
                        BufReader::new(s).lines().map(|l| l.unwrap()).collect::<Vec<_>>()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
        });
        for l in fiber_lines {
            check(l);
        }
        for t in threads {
            check(t.join().unwrap());
        }
        server.join().unwrap();
        wait_no_fibers(&rt);
    });
}

// ------------------------------------------------- timeouts and the reaper

/// A server with a 300 ms per-connection read timeout: 40 clients that
/// vanish (connect, send nothing) are reaped, each seeing end of file
/// within a bound; 10 slow clients sending one byte every 20 ms are kept
/// and get every byte back; 10 clients inside a `with_timeout` session
/// limit are cut at the limit.
#[test]
fn read_timeout_reaper_keeps_slow_clients_and_reaps_idle_ones() {
    within(60, || {
        let rt = rt2();
        let listener = rt.block_on(|| TcpListener::bind("127.0.0.1:0").unwrap());
        let addr = listener.local_addr().unwrap();
        let (reaped, finished) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (r2, f2) = (reaped.clone(), finished.clone());
        let server = rt.spawn(move || {
            fiber::scope(|s| loop {
                let (conn, _) = match listener.accept() {
                    Ok(c) => c,
                    Err(e) if is_cancelled(&e) => return,
                    Err(e) => panic!("{e}"),
                };
                conn.set_read_timeout(Some(ms(300))).unwrap();
                let (reaped, finished) = (r2.clone(), f2.clone());
                s.spawn(move || {
                    let mut buf = [0u8; 64];
                    loop {
                        match (&conn).read(&mut buf) {
                            Ok(0) => {
                                finished.fetch_add(1, Ordering::SeqCst);
                                return;
                            }
                            Ok(n) => (&conn).write_all(&buf[..n]).unwrap(),
                            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                                reaped.fetch_add(1, Ordering::SeqCst);
                                return; // dropping `conn` closes it
                            }
                            Err(e) => panic!("{e}"),
                        }
                    }
                });
            })
        });
        let idle: Vec<_> = (0..40)
            .map(|_| {
                std::thread::spawn(move || {
                    let mut s = std::net::TcpStream::connect(addr).unwrap();
                    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                    let start = Instant::now();
                    let mut b = [0u8; 1];
                    let n = s.read(&mut b).unwrap();
                    (n, start.elapsed())
                })
            })
            .collect();
        let slow: Vec<_> = (0..10)
            .map(|i| {
                std::thread::spawn(move || {
                    let mut s = std::net::TcpStream::connect(addr).unwrap();
                    s.set_nodelay(true).unwrap();
                    let mut back = Vec::new();
                    for k in 0..15u8 {
                        s.write_all(&[k ^ i]).unwrap();
                        let mut b = [0u8; 1];
                        s.read_exact(&mut b).unwrap();
                        back.push(b[0]);
                        std::thread::sleep(ms(20));
                    }
                    s.shutdown(Shutdown::Write).unwrap();
                    let mut rest = Vec::new();
                    s.read_to_end(&mut rest).unwrap();
                    assert_eq!(back, (0..15u8).map(|k| k ^ i).collect::<Vec<_>>());
                })
            })
            .collect();
        for t in slow {
            t.join().unwrap();
        }
        for t in idle {
            let (n, waited) = t.join().unwrap();
            assert_eq!(n, 0);
            assert!(
                waited < Duration::from_secs(5),
                "an idle client was reaped after {waited:?}"
            );
        }
        assert_eq!(reaped.load(Ordering::SeqCst), 40);
        assert_eq!(finished.load(Ordering::SeqCst), 10);
        // Sessions under `with_timeout`: the limit cuts a client that keeps
        // talking; the parked read ends with `Cancelled`.
        let limited = rt.block_on(move || {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let a = l.local_addr().unwrap();
            let srv = fiber::spawn(move || {
                let mut cut = 0;
                fiber::scope(|s| {
                    let hs: Vec<_> = (0..10)
                        .map(|_| {
                            let (conn, _) = l.accept().unwrap();
                            s.spawn(move || {
                                fiber::with_timeout(ms(300), || {
                                    let mut buf = [0u8; 16];
                                    loop {
                                        match (&conn).read(&mut buf) {
                                            Ok(0) => return Ok(()),
                                            Ok(n) => (&conn).write_all(&buf[..n])?,
                                            Err(e) => return Err(e),
                                        }
                                    }
                                })
                            })
                        })
                        .collect();
                    for h in hs {
                        match h.join().unwrap() {
                            Err(_) => cut += 1,
                            Ok(Err(e)) => assert!(is_cancelled(&e), "{e}"),
                            Ok(Ok(())) => panic!("a session ended without the limit"),
                        }
                    }
                });
                cut
            });
            let clients: Vec<_> = (0..10)
                .map(|_| {
                    fiber::spawn(move || {
                        let s = TcpStream::connect(a).unwrap();
                        let start = Instant::now();
                        let mut b = [0u8; 1];
                        loop {
                            if (&s).write_all(b"z").is_err() {
                                break;
                            }
                            match (&s).read(&mut b) {
                                Ok(1) => fiber::sleep(ms(5)).unwrap(),
                                _ => break,
                            }
                        }
                        start.elapsed()
                    })
                })
                .collect();
            for c in clients {
                let t = c.join().unwrap();
                assert!(t < Duration::from_secs(5), "a session lasted {t:?}");
            }
            srv.join().unwrap()
        });
        assert_eq!(limited, 10);
        server.cancel();
        let _ = server.join();
        wait_no_fibers(&rt);
    });
}

// ------------------------------------------------------------------- UDP

/// A UDP request/response server of two fibers sharing the socket through
/// `try_clone` (one per handle), 100 client fibers of 20 requests each
/// plus 20 plain-thread clients: every request answered exactly once.
#[test]
fn udp_request_response_two_server_fibers_on_cloned_socket() {
    within(60, || {
        let rt = rt2();
        let sock = rt.block_on(|| UdpSocket::bind("127.0.0.1:0").unwrap());
        let addr = sock.local_addr().unwrap();
        let answered = Arc::new(AtomicUsize::new(0));
        let servers: Vec<_> = {
            let clone = sock.try_clone().unwrap();
            [sock, clone]
                .into_iter()
                .map(|s| {
                    let answered = answered.clone();
                    rt.spawn(move || loop {
                        let mut buf = [0u8; 512];
                        match s.recv_from(&mut buf) {
                            Ok((n, from)) => {
                                let mut reply = b"re:".to_vec();
                                reply.extend_from_slice(&buf[..n]);
                                s.send_to(&reply, from).unwrap();
                                answered.fetch_add(1, Ordering::SeqCst);
                            }
                            Err(e) if is_cancelled(&e) => return,
                            Err(e) => panic!("{e}"),
                        }
                    })
                })
                .collect()
        };
        let client = |id: usize, s: &dyn Fn(&[u8]) -> io::Result<()>, r: &dyn Fn(&mut [u8]) -> io::Result<usize>| {
            for k in 0..20 {
                let req = format!("{id}:{k}");
                s(req.as_bytes()).unwrap();
                let mut buf = [0u8; 512];
                let n = r(&mut buf).unwrap_or_else(|e| panic!("client {id} request {k}: {e}"));
                assert_eq!(&buf[..n], format!("re:{req}").as_bytes());
            }
        };
        let threads: Vec<_> = (0..20)
            .map(|id| {
                std::thread::spawn(move || {
                    let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
                    s.connect(addr).unwrap();
                    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                    client(id, &|b| s.send(b).map(drop), &|b| s.recv(b));
                })
            })
            .collect();
        rt.block_on(move || {
            let hs: Vec<_> = (20..120)
                .map(|id| {
                    fiber::spawn(move || {
                        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
                        s.connect(addr).unwrap();
                        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                        client(id, &|b| s.send(b).map(drop), &|b| s.recv(b));
                    })
                })
                .collect();
            for h in hs {
                h.join().unwrap();
            }
        });
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(answered.load(Ordering::SeqCst), 120 * 20);
        for s in &servers {
            s.cancel();
        }
        for s in servers {
            let _ = s.join();
        }
        wait_no_fibers(&rt);
    });
}

// ------------------------------------------------------------------ churn

/// 3,000 connections opened and closed from fibers and threads: a third
/// close normally, a third half-close first and read the server's
/// goodbye, a third reset (`SO_LINGER` 0). Every handler ends; no fiber
/// left; every half-closing client gets its goodbye.
#[test]
fn connection_churn_close_half_close_reset() {
    within(90, || {
        let rt = rt2();
        let listener = rt.block_on(|| TcpListener::bind("127.0.0.1:0").unwrap());
        let addr = listener.local_addr().unwrap();
        let (ended, eofs) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (n2, e2) = (ended.clone(), eofs.clone());
        let server = rt.spawn(move || {
            fiber::scope(|s| loop {
                let (conn, _) = match listener.accept() {
                    Ok(c) => c,
                    Err(e) if is_cancelled(&e) => return,
                    Err(e) => panic!("{e}"),
                };
                let (ended, eofs) = (n2.clone(), e2.clone());
                s.spawn(move || {
                    let mut buf = [0u8; 64];
                    let mut got = 0;
                    loop {
                        match (&conn).read(&mut buf) {
                            Ok(0) => {
                                eofs.fetch_add(1, Ordering::SeqCst);
                                let _ = (&conn).write_all(format!("bye {got}").as_bytes());
                                break;
                            }
                            Ok(n) => got += n,
                            Err(e) if e.kind() == ErrorKind::ConnectionReset => break,
                            Err(e) => panic!("{e}"),
                        }
                    }
                    ended.fetch_add(1, Ordering::SeqCst);
                });
            })
        });
        let one = |i: usize, s: &dyn Fn() -> ClientOps| {
            let (write, read_all, close) = s();
            write(format!("hello {i}").as_bytes());
            match i % 3 {
                0 => close(false),
                1 => {
                    close(true);
                    assert_eq!(read_all(), format!("bye {}", format!("hello {i}").len()));
                }
                _ => {}
            }
        };
        let threads: Vec<_> = (0..4)
            .map(|t| {
                std::thread::spawn(move || {
                    for i in (t..1000).step_by(4) {
                        let s = Arc::new(std::net::TcpStream::connect(addr).unwrap());
                        if i % 3 == 2 {
                            crate::common::sockets::reset_on_close(s.as_raw_fd());
                        }
                        let (a, b, c) = (s.clone(), s.clone(), s.clone());
                        one(i, &|| {
                            let (a, b, c) = (a.clone(), b.clone(), c.clone());
                            (
                                Box::new(move |d: &[u8]| (&*a).write_all(d).unwrap()),
                                Box::new(move || {
                                    let mut x = String::new();
                                    (&*b).read_to_string(&mut x).unwrap();
                                    x
                                }),
                                Box::new(move |half: bool| {
                                    if half {
                                        c.shutdown(Shutdown::Write).unwrap()
                                    }
                                }),
                            )
                        });
                    }
                })
            })
            .collect();
        rt.block_on(move || {
            let hs: Vec<_> = (0..20)
                .map(|f| {
                    fiber::spawn(move || {
                        for i in (1000 + f..3000).step_by(20) {
                            let s = Arc::new(TcpStream::connect(addr).unwrap());
                            if i % 3 == 2 {
                                crate::common::sockets::reset_on_close(s.as_raw_fd());
                            }
                            let (a, b, c) = (s.clone(), s.clone(), s.clone());
                            one(i, &|| {
                                let (a, b, c) = (a.clone(), b.clone(), c.clone());
                                (
                                    Box::new(move |d: &[u8]| (&*a).write_all(d).unwrap()),
                                    Box::new(move || {
                                        let mut x = String::new();
                                        (&*b).read_to_string(&mut x).unwrap();
                                        x
                                    }),
                                    Box::new(move |half: bool| {
                                        if half {
                                            c.shutdown(Shutdown::Write).unwrap()
                                        }
                                    }),
                                )
                            });
                        }
                    })
                })
                .collect();
            for h in hs {
                h.join().unwrap();
            }
        });
        for t in threads {
            t.join().unwrap();
        }
        let start = Instant::now();
        while ended.load(Ordering::SeqCst) < 3000 {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "handlers ended: {}",
                ended.load(Ordering::SeqCst)
            );
            std::thread::sleep(ms(2));
        }
        assert_eq!(ended.load(Ordering::SeqCst), 3000);
        assert_eq!(eofs.load(Ordering::SeqCst), 2000);
        server.cancel();
        let _ = server.join();
        wait_no_fibers(&rt);
    });
}

// ------------------------------------------- shutdown with open connections

/// In a child process (descriptor counts): an echo server with 200 open
/// connections, 100 of whose handlers are parked in read and 100 in write
/// (their clients asked for a flood and do not read), and the server
/// parked in accept; the runtime is dropped. The drop ends within its
/// grace time, every server-side socket is closed (every client sees end
/// of file or a reset), and the descriptor count is back to the baseline.
#[test]
fn runtime_drop_with_open_connections_closes_every_socket() {
    in_child("runtime_drop_with_open_connections_closes_every_socket", 60, || {
        warm_up_driver();
        let base = fd_count();
        let rt = rt_fixed_grace(2, ms(500));
        let listener = rt.block_on(|| TcpListener::bind("127.0.0.1:0").unwrap());
        let addr = listener.local_addr().unwrap();
        let started = Arc::new(AtomicUsize::new(0));
        let st = started.clone();
        rt.spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                let started = st.clone();
                fiber::spawn(move || {
                    let mut line = String::new();
                    let mut r = BufReader::new(&conn);
                    r.read_line(&mut line).unwrap();
                    started.fetch_add(1, Ordering::SeqCst);
                    if line == "flood\n" {
                        let chunk = [7u8; 65536];
                        loop {
                            (&conn).write_all(&chunk)?;
                        }
                    }
                    let mut rest = Vec::new();
                    r.read_to_end(&mut rest).map(drop)
                });
            }
        });
        let clients: Vec<_> = (0..200)
            .map(|i| {
                let mut s = std::net::TcpStream::connect(addr).unwrap();
                s.write_all(if i % 2 == 0 { b"flood\n" } else { b"quiet\n" }).unwrap();
                s
            })
            .collect();
        let start = Instant::now();
        while started.load(Ordering::SeqCst) < 200 {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "handlers started: {}",
                started.load(Ordering::SeqCst)
            );
            std::thread::sleep(ms(5));
        }
        wait_parked(&rt, 201);
        let start = Instant::now();
        drop(rt);
        let took = start.elapsed();
        assert!(took < Duration::from_secs(3), "the runtime's drop took {took:?}");
        assert_eq!(
            fd_count(),
            base + 200,
            "server sockets left open after the runtime's drop"
        );
        for (i, mut s) in clients.into_iter().enumerate() {
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut buf = vec![0u8; 1 << 20];
            loop {
                match s.read(&mut buf) {
                    Ok(0) => break,
                    Ok(_) => continue,
                    Err(e) if e.kind() == ErrorKind::ConnectionReset => break,
                    Err(e) => panic!("client {i}: {e}"),
                }
            }
        }
        assert_eq!(fd_count(), base);
    });
}

/// In a child: 100 fibers parked in `accept` on one listening socket
/// through the original and four `try_clone` handles; 60 clients connect
/// (exactly 60 acceptors get one each), the other 40 are cancelled and
/// return; every handle is dropped, no fiber and no descriptor is left,
/// and a new listener on the same port accepts again.
#[test]
fn acceptors_on_cloned_listeners_then_all_dropped() {
    in_child("acceptors_on_cloned_listeners_then_all_dropped", 60, || {
        warm_up_driver();
        let base = fd_count();
        let rt = rt_fixed_grace(2, ms(500));
        rt.block_on(|| {
            let l = Arc::new(TcpListener::bind("127.0.0.1:0").unwrap());
            let addr = l.local_addr().unwrap();
            let clones: Vec<_> = (0..4).map(|_| Arc::new(l.try_clone().unwrap())).collect();
            let accepted = Arc::new(AtomicUsize::new(0));
            let hs: Vec<_> = (0..100)
                .map(|i| {
                    let l = if i % 5 == 4 { l.clone() } else { clones[i % 5].clone() };
                    let accepted = accepted.clone();
                    fiber::spawn(move || {
                        let r = l.accept();
                        if let Ok((s, _)) = &r {
                            accepted.fetch_add(1, Ordering::SeqCst);
                            (&*s).write_all(b"hi").unwrap();
                        }
                        r.map(drop).map_err(|e| e.kind())
                    })
                })
                .collect();
            let start = Instant::now();
            while fiber::stats().runtime.fibers_parked < 100 {
                assert!(start.elapsed() < Duration::from_secs(10));
                fiber::sleep(ms(1)).unwrap();
            }
            // 60 connections: exactly 60 acceptors get one each.
            let conns: Vec<_> = (0..60)
                .map(|_| {
                    let mut c = TcpStream::connect(addr).unwrap();
                    let mut b = [0u8; 2];
                    c.read_exact(&mut b).unwrap();
                    c
                })
                .collect();
            assert_eq!(accepted.load(Ordering::SeqCst), 60);
            // Let the 60 acceptors finish first: one still between its
            // write and its return when cancelled ends CANCELLED (its
            // value dropped), which a CI run saw once (41 cancelled).
            let start = Instant::now();
            while hs.iter().filter(|h| h.is_finished()).count() < 60 {
                assert!(start.elapsed() < Duration::from_secs(10));
                fiber::sleep(ms(1)).unwrap();
            }
            // The rest: cancelled.
            let start = Instant::now();
            for h in &hs {
                h.cancel();
            }
            let mut cancelled = 0;
            for h in hs {
                match h.join() {
                    Ok(Ok(())) => {}
                    Ok(Err(k)) => {
                        assert_eq!(k, ErrorKind::Other);
                        cancelled += 1
                    }
                    Err(e) => {
                        assert!(e.is_cancelled(), "{e:?}");
                        cancelled += 1
                    }
                }
            }
            assert_eq!(cancelled, 40);
            assert!(start.elapsed() < Duration::from_secs(3));
            drop(conns);
            drop(clones);
            drop(l);
            // A new listener on the same port accepts again.
            let l2 = TcpListener::bind(addr).unwrap();
            let h = fiber::spawn(move || l2.accept().map(drop));
            let _c = TcpStream::connect(addr).unwrap();
            h.join().unwrap().unwrap();
        });
        wait_no_fibers(&rt);
        drop(rt);
        assert_eq!(fd_count(), base);
    });
}

// --------------------------------------------- two fibers on one socket

/// Two reader fibers on one connection through `try_clone`, each reading
/// as fast as it can, while a writer sends 4 MiB in odd-sized pieces:
/// between them they read every byte exactly once (the counts add up),
/// and both see end of file. Repeated 30 times on one worker and on two.
#[test]
fn two_readers_on_cloned_socket_lose_no_readiness() {
    within(60, || {
        for rt in [rt1(), rt2()] {
            rt.block_on(|| {
                for round in 0..30 {
                    let l = TcpListener::bind("127.0.0.1:0").unwrap();
                    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
                    let (s, _) = l.accept().unwrap();
                    let s2 = s.try_clone().unwrap();
                    let readers: Vec<_> = [s, s2]
                        .into_iter()
                        .map(|s| {
                            fiber::spawn(move || {
                                let mut buf = vec![0u8; 1 + round * 37 % 5000];
                                let mut n = 0usize;
                                loop {
                                    match (&s).read(&mut buf) {
                                        Ok(0) => return n,
                                        Ok(k) => n += k,
                                        Err(e) => panic!("{e}"),
                                    }
                                }
                            })
                        })
                        .collect();
                    let total = 1 << 20;
                    let data = vec![1u8; 3001];
                    let mut sent = 0;
                    while sent < total {
                        let k = data.len().min(total - sent);
                        (&c).write_all(&data[..k]).unwrap();
                        sent += k;
                    }
                    c.shutdown(Shutdown::Write).unwrap();
                    let got: usize = fiber::with_timeout(Duration::from_secs(10), || {
                        readers.into_iter().map(|r| r.join().unwrap()).sum()
                    })
                    .unwrap_or_else(|_| panic!("round {round}: a reader hung"));
                    assert_eq!(got, total, "round {round}");
                }
            });
        }
    });
}

/// A descriptor number reused while another handle of the old socket is
/// parked: fiber A reads on a clone; the original handle is dropped and
/// new sockets take its number; A must still wake for its own data, and
/// the new sockets must work (no event of theirs misrouted or lost).
#[test]
fn fd_number_reused_while_clone_parked() {
    within(60, || {
        let rt = rt2();
        rt.block_on(|| {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            let mut reused = 0;
            for round in 0..200 {
                let c = TcpStream::connect(addr).unwrap();
                let (s, _) = l.accept().unwrap();
                let clone = s.try_clone().unwrap();
                let reader = fiber::spawn(move || {
                    let mut b = [0u8; 8];
                    (&clone).read_exact(&mut b).map(|_| b)
                });
                wait_fiber_parked(reader.id());
                let old = s.as_raw_fd();
                drop(s);
                // New sockets: one of them most likely takes `old`.
                let c2 = TcpStream::connect(addr).unwrap();
                let (s2, _) = l.accept().unwrap();
                if c2.as_raw_fd() == old || s2.as_raw_fd() == old {
                    reused += 1;
                }
                let r2 = fiber::spawn(move || {
                    let mut b = [0u8; 4];
                    (&s2).read_exact(&mut b).map(|_| b)
                });
                (&c2).write_all(b"new!").unwrap();
                (&c).write_all(&(round as u64).to_le_bytes()).unwrap();
                let got = fiber::with_timeout(Duration::from_secs(5), || (reader.join(), r2.join()))
                    .unwrap_or_else(|_| panic!("round {round}: a reader hung"));
                assert_eq!(got.0.unwrap().unwrap(), (round as u64).to_le_bytes());
                assert_eq!(&got.1.unwrap().unwrap(), b"new!");
            }
            assert!(reused > 0, "no descriptor number was reused");
        });
    });
}

// ------------------------------------------------ graceful goodbye at drop

/// In a child: 100 connection handlers parked in read; the runtime is
/// dropped; each handler's read fails with `Cancelled` and it sends a
/// goodbye inside `fiber::non_cancellable` (a Go server's graceful
/// shutdown). Every client gets its goodbye and then end of file; the drop
/// ends well within its grace time; no descriptor left.
#[test]
fn runtime_drop_handlers_say_goodbye() {
    in_child("runtime_drop_handlers_say_goodbye", 60, || {
        warm_up_driver();
        let base = fd_count();
        let rt = rt_fixed_grace(2, Duration::from_secs(2));
        let listener = rt.block_on(|| TcpListener::bind("127.0.0.1:0").unwrap());
        let addr = listener.local_addr().unwrap();
        let ready = Arc::new(AtomicUsize::new(0));
        let r2 = ready.clone();
        rt.spawn(move || {
            fiber::scope(|s| {
                for conn in listener.incoming() {
                    let Ok(conn) = conn else { return };
                    let ready = r2.clone();
                    s.spawn(move || {
                        let mut buf = [0u8; 16];
                        (&conn).write_all(b"hello\n").unwrap();
                        ready.fetch_add(1, Ordering::SeqCst);
                        match (&conn).read(&mut buf) {
                            Err(e) if is_cancelled(&e) => {
                                fiber::non_cancellable(|| (&conn).write_all(b"goodbye\n")).unwrap();
                            }
                            other => panic!("{other:?}"),
                        }
                    });
                }
            })
        });
        let clients: Vec<_> = (0..100).map(|_| std::net::TcpStream::connect(addr).unwrap()).collect();
        let start = Instant::now();
        while ready.load(Ordering::SeqCst) < 100 {
            assert!(start.elapsed() < Duration::from_secs(20));
            std::thread::sleep(ms(5));
        }
        wait_parked(&rt, 101);
        let start = Instant::now();
        drop(rt);
        let took = start.elapsed();
        assert!(
            took < Duration::from_secs(1),
            "the drop took {took:?} (grace 2 s, nothing blocks)"
        );
        for (i, s) in clients.into_iter().enumerate() {
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut text = String::new();
            (&s).read_to_string(&mut text).unwrap();
            assert_eq!(text, "hello\ngoodbye\n", "client {i}");
        }
        assert_eq!(fd_count(), base);
    });
}

// ------------------------------------------------ latency under CPU load

/// Two workers, both kept busy by 4 fibers that compute and call
/// `yield_now` in a loop: an echo round trip over a socket still completes
/// within a bound (Go's netpoller is polled at every scheduling round, and
/// by sysmon every 10 ms); 300 round trips, the worst under 250 ms.
#[test]
fn io_latency_under_yielding_cpu_load() {
    within(60, || {
        let rt = rt2();
        let worst = rt.block_on(|| {
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let spinners: Vec<_> = (0..4)
                .map(|_| {
                    let stop = stop.clone();
                    fiber::spawn(move || {
                        let mut x = 0u64;
                        while !stop.load(Ordering::Relaxed) {
                            for i in 0..2000u64 {
                                x = x.wrapping_mul(31).wrapping_add(i);
                            }
                            let _ = fiber::yield_now();
                        }
                        x
                    })
                })
                .collect();
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let (s, _) = l.accept().unwrap();
            let echo = fiber::spawn(move || echo_lines(s));
            let mut r = BufReader::new(&c);
            let mut worst = Duration::ZERO;
            for k in 0..300 {
                let line = format!("ping {k}\n");
                let t = Instant::now();
                (&c).write_all(line.as_bytes()).unwrap();
                let mut got = String::new();
                r.read_line(&mut got).unwrap();
                assert_eq!(got, line);
                worst = worst.max(t.elapsed());
            }
            drop(r);
            c.shutdown(Shutdown::Write).unwrap();
            echo.join().unwrap().unwrap();
            stop.store(true, Ordering::Relaxed);
            for s in spinners {
                s.join().unwrap();
            }
            worst
        });
        assert!(worst < ms(250), "worst round trip {worst:?}");
    });
}

// ------------------------------------------- runtimes come and go (fds)

/// In a child: 20 runtimes in turn (io_park on and off, io_harvest on and
/// off), each serving a few echo connections and dropped with a
/// connection still open: the descriptor count is back to the baseline
/// after each.
#[test]
fn runtimes_come_and_go_leave_no_descriptor() {
    in_child("runtimes_come_and_go_leave_no_descriptor", 60, || {
        warm_up_driver();
        let base = fd_count();
        for round in 0..20 {
            let rt = fiber::Runtime::builder()
                .workers(2)
                .max_workers(2)
                .io_harvest(round % 4 != 3)
                .io_park(round % 2 == 1 && round % 4 != 3)
                .shutdown_timeout(ms(300))
                .build()
                .unwrap();
            let listener = rt.block_on(|| TcpListener::bind("127.0.0.1:0").unwrap());
            let addr = listener.local_addr().unwrap();
            let (e, n) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicUsize::new(0)));
            rt.spawn(move || echo_server(listener, e, n));
            rt.block_on(move || {
                for id in 0..5 {
                    echo_client(TcpStream::connect(addr).unwrap(), id, 3, false);
                }
            });
            let open = std::net::TcpStream::connect(addr).unwrap();
            echo_client(open.try_clone().unwrap(), 99, 1, false);
            drop(rt);
            drop(open);
            assert_eq!(fd_count(), base, "round {round}");
        }
    });
}

// ------------------------------------------------ accept with a timeout

/// An accept loop that wakes every millisecond (a Go server's
/// `SetDeadline` loop checking a stop flag). `with_timeout` around
/// `accept` may drop a connection it accepted as the deadline passed
/// (documented: "an operation that completed inside `f` just as the
/// deadline passed is lost"), so the loop uses the operation's own timed
/// form, as that documentation says: `SO_RCVTIMEO` on the listener,
/// adopted by `TcpListener::from_std`. 300 clients connect: every
/// connection accepted exactly once, none lost between two timeouts.
#[test]
fn accept_with_timeout_loop_loses_no_connection() {
    within(60, || {
        let rt = rt2();
        rt.block_on(|| {
            let std_l = socket2_listener(1024);
            set_sock_timeout(std_l.as_raw_fd(), libc::SO_RCVTIMEO, ms(1));
            let l = TcpListener::from_std(std_l).unwrap();
            let addr = l.local_addr().unwrap();
            let clients = fiber::spawn(move || {
                let hs: Vec<_> = (0..300u32)
                    .map(|i| {
                        fiber::spawn(move || {
                            let mut c = TcpStream::connect(addr).unwrap();
                            c.write_all(&i.to_le_bytes()).unwrap();
                            let mut b = [0u8; 4];
                            c.read_exact(&mut b).unwrap();
                            assert_eq!(u32::from_le_bytes(b), i * 3);
                        })
                    })
                    .collect();
                for h in hs {
                    h.join().unwrap();
                }
            });
            let mut accepted = 0;
            let start = Instant::now();
            while accepted < 300 {
                assert!(start.elapsed() < Duration::from_secs(30), "accepted {accepted}");
                match l.accept() {
                    Ok((c, _)) => {
                        accepted += 1;
                        // Accepted sockets inherit the listener's timeouts.
                        c.set_read_timeout(None).unwrap();
                        fiber::spawn(move || {
                            let mut b = [0u8; 4];
                            (&c).read_exact(&mut b).unwrap();
                            (&c).write_all(&(u32::from_le_bytes(b) * 3).to_le_bytes()).unwrap();
                        });
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                    Err(e) => panic!("{e}"),
                }
            }
            clients.join().unwrap();
        });
        wait_no_fibers(&rt);
    });
}

/// A std listener with the given backlog.
fn socket2_listener(backlog: i32) -> std::net::TcpListener {
    use std::os::fd::FromRawFd;
    // SAFETY: plain socket calls on a descriptor we create and own.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0);
        let one: libc::c_int = 1;
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_REUSEADDR,
            (&raw const one).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
        let mut sa: libc::sockaddr_in = std::mem::zeroed();
        sa.sin_family = libc::AF_INET as libc::sa_family_t;
        sa.sin_addr.s_addr = u32::from_ne_bytes([127, 0, 0, 1]);
        assert_eq!(
            libc::bind(
                fd,
                (&raw const sa).cast(),
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t
            ),
            0
        );
        assert_eq!(libc::listen(fd, backlog), 0);
        std::net::TcpListener::from_raw_fd(fd)
    }
}
