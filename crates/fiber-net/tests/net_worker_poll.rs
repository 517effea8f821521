//! Workers take ready socket events themselves (fiber-core's `IoPoll`
//! hook): in a ping-pong over TCP on one worker, some readiness events are
//! taken by the worker (before it would sleep, or between fibers) instead
//! of the poller thread, and every message still arrives. In a file of its
//! own: the counters are process-wide.

use fiber_net::{poll_stats, TcpListener, TcpStream};
use std::io::{Read, Write};

#[test]
fn a_worker_takes_ready_events_itself() {
    let rt = fiber_sched::Runtime::builder()
        .workers(1)
        .max_workers(1)
        .build()
        .unwrap();
    let before = poll_stats();
    let total = rt.block_on(|| {
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
        let mut total = 0u64;
        for i in 0..2000u32 {
            client.write_all(&[i as u8]).unwrap();
            let mut back = [0u8; 1];
            client.read_exact(&mut back).unwrap();
            assert_eq!(back[0], i as u8);
            total += u64::from(back[0]);
        }
        drop(client);
        echo.join().unwrap();
        total
    });
    assert_eq!(total, (0..2000u64).map(|i| i % 256).sum::<u64>());
    let after = poll_stats();
    let by_workers = after.worker_events - before.worker_events;
    let by_poller = after.poller_events - before.poller_events;
    eprintln!("readiness events: {by_workers} taken by the worker, {by_poller} by the poller thread");
    assert!(by_workers > 0, "no event taken by the worker (poller took {by_poller})");
}
