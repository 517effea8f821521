//! The poller thread rests while workers take the events (`rest.rs`), and
//! readiness still reaches a parked fiber when the workers stop taking
//! them: after a ping-pong that keeps the workers harvesting, one worker
//! spins in a fiber that never yields and the other goes to sleep; a byte
//! written by a plain thread must still wake the reader while the spinner
//! spins (the sleeping worker wakes the resting poller). In a file of its
//! own: the poll counters are process-wide.

use fiber_net::{poll_stats, TcpListener, TcpStream};
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[test]
fn readiness_reaches_a_parked_fiber_after_the_workers_stop_harvesting() {
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = fiber_sched::Runtime::builder()
            .workers(2)
            .max_workers(2)
            .build()
            .unwrap();
        let rests_before = poll_stats().poller_rests;
        let outcome = rt.block_on(|| {
            // Phase 1: keep the workers harvesting.
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let echo = fiber_core::spawn(move || {
                let (mut conn, _) = listener.accept().unwrap();
                let mut byte = [0u8; 1];
                while conn.read(&mut byte).unwrap() == 1 {
                    conn.write_all(&byte).unwrap();
                }
            });
            let mut client = TcpStream::connect(addr).unwrap();
            for i in 0..3000u32 {
                client.write_all(&[i as u8]).unwrap();
                let mut back = [0u8; 1];
                client.read_exact(&mut back).unwrap();
                assert_eq!(back[0], i as u8);
            }
            drop(client);
            echo.join().unwrap();

            // Phase 2: a reader parks on a socket, a spinner holds one
            // worker, the other worker has nothing to do.
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let got = Arc::new(AtomicBool::new(false));
            let reader = {
                let got = got.clone();
                fiber_core::spawn(move || {
                    let mut conn = TcpStream::connect(addr).unwrap();
                    let mut byte = [0u8; 1];
                    conn.read_exact(&mut byte).unwrap();
                    got.store(true, Ordering::SeqCst);
                    byte[0]
                })
            };
            let spinner = {
                let got = got.clone();
                fiber_core::spawn(move || {
                    // Never yields: ends when the reader got its byte, or
                    // gives up after a generous bound.
                    let start = Instant::now();
                    while !got.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(20) {
                        std::hint::spin_loop();
                    }
                    got.load(Ordering::SeqCst)
                })
            };
            let writer = std::thread::spawn(move || {
                let (mut conn, _) = listener.accept().unwrap();
                std::thread::sleep(Duration::from_millis(50));
                conn.write_all(&[42]).unwrap();
                // Keep the connection open until the reader has read.
                std::thread::sleep(Duration::from_millis(200));
            });
            let byte = reader.join().unwrap();
            let spinner_saw_it = spinner.join().unwrap();
            writer.join().unwrap();
            (byte, spinner_saw_it)
        });
        let rested = poll_stats().poller_rests - rests_before;
        done_tx.send((outcome, rested)).unwrap();
    });
    let ((byte, spinner_saw_it), rested) = done_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the reader was never woken");
    assert_eq!(byte, 42);
    assert!(
        spinner_saw_it,
        "the byte arrived while the spinner still held its worker"
    );
    // Informational: how often the poller rested during the ping-pong
    // (zero is possible on a machine where the poller always won the race).
    eprintln!("poller rests: {rested}");
}
