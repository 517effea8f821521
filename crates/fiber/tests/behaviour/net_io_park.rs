//! `io_park`: one idle worker sleeps in the I/O driver itself. Sockets,
//! timers, notifications and shutdown keep working while it does, and the
//! driver wait is really used. Its own process (the poll counters are
//! process-wide).

use std::io::{Read, Write};
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn runtime(workers: usize) -> fiber::Runtime {
    fiber::Runtime::builder()
        .workers(workers)
        .max_workers(workers)
        .io_park(true)
        .build()
        .unwrap()
}

/// Hang guard only.
const HANG: Duration = Duration::from_secs(60);

#[test]
fn io_parked_workers_serve_sockets_timers_and_notifications() {
    let (done_tx, done_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let before = fiber::net::poll_stats().worker_io_waits;
        let rt = runtime(2);
        let echoed = rt.block_on(|| {
            let listener = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let server = fiber::spawn(move || {
                let (mut conn, _) = listener.accept().unwrap();
                let mut buf = [0u8; 64];
                let mut total = 0;
                loop {
                    let n = conn.read(&mut buf).unwrap();
                    if n == 0 {
                        return total;
                    }
                    total += n;
                    conn.write_all(&buf[..n]).unwrap();
                }
            });
            // A plain thread is the client: between its messages every
            // worker is idle, one of them waiting in the driver.
            let client = std::thread::spawn(move || {
                let mut s = std::net::TcpStream::connect(addr).unwrap();
                let mut back = [0u8; 5];
                for _ in 0..50 {
                    std::thread::sleep(Duration::from_millis(2));
                    s.write_all(b"hello").unwrap();
                    s.read_exact(&mut back).unwrap();
                    assert_eq!(&back, b"hello");
                }
            });
            // A timer fires on time while the workers are idle.
            let t0 = Instant::now();
            fiber::sleep(Duration::from_millis(20)).unwrap();
            assert!(t0.elapsed() >= Duration::from_millis(20));
            // Work from a plain thread (a notification) reaches an idle pool.
            let (tx, rx) = fiber::chan::bounded::<u32>(0);
            let sender = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(10));
                tx.send(7).unwrap();
            });
            assert_eq!(rx.recv().unwrap(), 7);
            sender.join().unwrap();
            client.join().unwrap();
            let echoed = server.join().unwrap();
            // On a loaded machine an idle worker's search (16 thread
            // yields) can outlast the short idle moments above, so give it
            // long ones until it has waited in the driver (20 s bound).
            let start = std::time::Instant::now();
            while fiber::net::poll_stats().worker_io_waits == before && start.elapsed() < Duration::from_secs(20) {
                fiber::sleep(Duration::from_millis(200)).unwrap();
            }
            echoed
        });
        let waits = fiber::net::poll_stats().worker_io_waits - before;
        // Shutdown with a worker in the driver ends (the guard below).
        drop(rt);
        done_tx.send((echoed, waits)).unwrap();
    });
    let (echoed, waits) = done_rx.recv_timeout(HANG).expect("io_park run hung");
    assert_eq!(echoed, 250, "every byte echoed");
    assert!(waits > 0, "an idle worker waited in the I/O driver");
}

#[test]
fn a_runtime_with_io_park_shuts_down_while_a_worker_waits_in_the_driver() {
    let (done_tx, done_rx) = mpsc::channel();
    std::thread::spawn(move || {
        // Idle from the start: a worker sleeps in the driver (the driver is
        // started by the socket), and dropping the runtime must wake it.
        let rt = runtime(1);
        rt.block_on(|| {
            let _listener = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
            fiber::sleep(Duration::from_millis(30)).unwrap();
        });
        drop(rt);
        done_tx.send(()).unwrap();
    });
    done_rx
        .recv_timeout(HANG)
        .expect("shutdown with a worker in the driver hung");
}
