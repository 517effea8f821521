//! Several users of the one I/O driver at once: two runtimes (one taking
//! ready events on its workers, one leaving them all to the poller thread),
//! the test scheduler and a plain thread, all doing socket round trips at
//! the same time, then one runtime dropped while the others go on. The
//! poller's rest (it stays out of `epoll_wait` while some workers take the
//! events) must never leave another user's socket without a waker.

use fiber_net::{TcpListener, TcpStream};
use std::io::{Read, Write};
use std::time::Duration;

/// An echo server on a plain thread, for `n` connections.
fn echo_server(n: usize) -> std::net::SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming().take(n) {
            let mut conn = conn.unwrap();
            std::thread::spawn(move || {
                let mut byte = [0u8; 1];
                while conn.read(&mut byte).is_ok_and(|n| n == 1) {
                    if conn.write_all(&byte).is_err() {
                        break;
                    }
                }
            });
        }
    });
    addr
}

/// `rounds` one-byte round trips over fiber-net.
fn ping(addr: std::net::SocketAddr, rounds: u32) -> u32 {
    let mut conn = TcpStream::connect(addr).unwrap();
    let mut ok = 0;
    for i in 0..rounds {
        conn.write_all(&[i as u8]).unwrap();
        let mut back = [0u8; 1];
        conn.read_exact(&mut back).unwrap();
        ok += u32::from(back[0] == i as u8);
    }
    ok
}

#[test]
fn two_runtimes_the_test_scheduler_and_a_thread_share_the_driver() {
    const ROUNDS: u32 = 2000;
    let addr = echo_server(5);
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let harvesting = {
        let done = done_tx.clone();
        std::thread::spawn(move || {
            let rt = fiber_sched::Runtime::builder()
                .workers(2)
                .max_workers(2)
                .build()
                .unwrap();
            let ok = rt.block_on(move || {
                let a = fiber_core::spawn(move || ping(addr, ROUNDS));
                let b = fiber_core::spawn(move || ping(addr, ROUNDS));
                a.join().unwrap() + b.join().unwrap()
            });
            // Dropped while the others may still run.
            drop(rt);
            done.send(("harvesting runtime", ok, 2 * ROUNDS)).unwrap();
        })
    };
    let poller_only = {
        let done = done_tx.clone();
        std::thread::spawn(move || {
            let rt = fiber_sched::Runtime::builder()
                .workers(1)
                .max_workers(1)
                .io_harvest(false)
                .build()
                .unwrap();
            let ok = rt.block_on(move || ping(addr, ROUNDS));
            done.send(("poller-only runtime", ok, ROUNDS)).unwrap();
        })
    };
    let test_sched = {
        let done = done_tx.clone();
        std::thread::spawn(move || {
            let sched = fiber_core::testing::TestScheduler::new();
            let h = sched.spawn(move || ping(addr, ROUNDS));
            sched.run();
            done.send(("test scheduler", h.join().unwrap(), ROUNDS)).unwrap();
        })
    };
    let thread = {
        let done = done_tx.clone();
        std::thread::spawn(move || {
            done.send(("plain thread", ping(addr, ROUNDS), ROUNDS)).unwrap();
        })
    };
    drop(done_tx);
    for _ in 0..4 {
        let (who, ok, want) = done_rx
            .recv_timeout(Duration::from_secs(120))
            .expect("a driver user never finished: a socket lost its waker");
        assert_eq!(ok, want, "{who}: every byte came back");
    }
    for t in [harvesting, poller_only, test_sched, thread] {
        t.join().unwrap();
    }
    // The driver still serves a new runtime after the others are gone.
    let addr = {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            conn.write_all(b"ok").unwrap();
        });
        addr
    };
    let rt = fiber_sched::Runtime::builder()
        .workers(2)
        .max_workers(2)
        .build()
        .unwrap();
    let got = rt.block_on(move || {
        let mut conn = TcpStream::connect(addr).unwrap();
        let mut buf = [0u8; 2];
        conn.read_exact(&mut buf).unwrap();
        buf
    });
    assert_eq!(&got, b"ok");
}
