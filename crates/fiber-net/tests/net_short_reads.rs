//! After a short stream read (fewer bytes than asked for), the next read
//! parks without a system call until a readiness event comes in
//! (`Readiness::poll_stream_read`). These tests hold the cases where that
//! must not hide anything: end of stream or an error that arrived together
//! with the data, data that arrives while the reader is parked, and a
//! `shutdown(Read)` of the reader's own handle. From plain threads and from
//! fibers of fiber-core's test scheduler.

mod common;

use fiber_core::testing::TestScheduler;
use fiber_net::{TcpListener, TcpStream};
use std::io::{Read, Write};
use std::net::Shutdown;
use std::sync::mpsc;

/// Run `f` on its own thread; fail (instead of hanging) if it does not
/// finish within the hang guard.
fn guarded<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(common::HANG)
        .unwrap_or_else(|_| panic!("{what}: hung (a read parked next to data or an end of stream)"))
}

/// A peer writes `data` and closes at once; the reader reads only after
/// the close, so the data and the end of stream are both queued (usually
/// announced by one event) before its first, short, read.
fn short_read_then_eof(data: &'static [u8]) -> (Vec<u8>, usize) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let writer = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        conn.write_all(data).unwrap();
        // Dropped: FIN right behind the data.
    });
    let mut s = TcpStream::connect(addr).unwrap();
    writer.join().unwrap();
    let mut buf = [0u8; 256];
    let n = s.read(&mut buf).unwrap();
    assert!(n > 0 && n < buf.len(), "a short read ({n} bytes)");
    let first = buf[..n].to_vec();
    // The end of stream is already here: this read must return 0 at once.
    let eof = s.read(&mut buf).unwrap();
    (first, eof)
}

#[test]
fn end_of_stream_behind_a_short_read_is_seen_on_a_thread() {
    for _ in 0..20 {
        let (first, eof) = guarded("thread reader", || short_read_then_eof(b"hello"));
        assert_eq!(first, b"hello");
        assert_eq!(eof, 0);
    }
}

#[test]
fn end_of_stream_behind_a_short_read_is_seen_in_a_fiber() {
    guarded("fiber reader", || {
        let sched = TestScheduler::new();
        let reader = sched.spawn(|| (0..20).map(|_| short_read_then_eof(b"hello")).collect::<Vec<_>>());
        sched.run();
        for (first, eof) in reader.join().unwrap() {
            assert_eq!(first, b"hello");
            assert_eq!(eof, 0);
        }
    });
}

#[test]
fn read_to_end_after_a_response_and_a_close_returns() {
    guarded("read_to_end", || {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut req = [0u8; 4];
            conn.read_exact(&mut req).unwrap();
            conn.write_all(b"response").unwrap();
        });
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"ping").unwrap();
        let mut all = Vec::new();
        s.read_to_end(&mut all).unwrap();
        server.join().unwrap();
        assert_eq!(all, b"response");
    });
}

/// Part two is written only once the reader has taken part one with a
/// short read: the reader's next read parks without a call and is woken
/// by the event of part two.
#[test]
fn data_arriving_after_a_short_read_wakes_the_parked_reader() {
    guarded("split message", || {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let writer = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            for part in [&b"part one"[..], b"part two", b"part three"] {
                conn.write_all(part).unwrap();
                go_rx.recv().unwrap();
            }
        });
        let sched = TestScheduler::new();
        let reader = sched.spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 64];
            for _ in 0..3 {
                let n = s.read(&mut buf).unwrap();
                got.push(buf[..n].to_vec());
                go_tx.send(()).unwrap();
            }
            got
        });
        sched.run();
        writer.join().unwrap();
        assert_eq!(
            reader.join().unwrap(),
            [b"part one".to_vec(), b"part two".to_vec(), b"part three".to_vec()]
        );
    });
}

#[test]
fn shutdown_read_after_a_short_read_ends_the_next_read() {
    guarded("shutdown(Read)", || {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let writer = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            conn.write_all(b"hi").unwrap();
            // Keep the connection open until the reader is done.
            done_rx.recv().unwrap();
        });
        let mut s = TcpStream::connect(addr).unwrap();
        let mut buf = [0u8; 64];
        assert_eq!(s.read(&mut buf).unwrap(), 2);
        s.shutdown(Shutdown::Read).unwrap();
        assert_eq!(s.read(&mut buf).unwrap(), 0, "reads end after shutdown(Read)");
        done_tx.send(()).unwrap();
        writer.join().unwrap();
    });
}
