//! The operation budget (README "Guarantees", spec/lifecycle.md step 1):
//! a fiber whose blocking operations always complete at once never
//! parks, so on one worker the fibers queued beside it would wait until
//! its loop ends. Every 128 blocking channel or socket operations in a
//! row that complete without a switch, the fiber looks at the clock, and
//! one yields once the run has lasted `OP_SLICE` (2 ms). Each test runs such a loop for about a second of
//! work on one worker while the test's driver waits, yielding, for the
//! loop to make a little progress: before the budget, the driver ran
//! only once the loop had ended.

use crate::common::load::spin;
use crate::common::{rt1, within};
use std::io::{Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Items each loop handles; each costs `WORK`, so a loop runs about 0.8 s.
const N: u64 = 400_000;
const WORK: Duration = Duration::from_micros(2);
/// Progress the driver waits for (a few hundred turns of the budget).
const SOME: u64 = 2_000;

/// Run `looper` (given the progress counter) as a fiber on one worker and
/// return how long the driver, which yields while it waits, took to see
/// `SOME` progress, and whether the loop had finished by then.
fn driver_sees_progress(looper: impl FnOnce(Arc<AtomicU64>) + Send + 'static) -> (Duration, bool) {
    within(60, move || {
        rt1().block_on(move || {
            let done = Arc::new(AtomicU64::new(0));
            let d2 = done.clone();
            let looper = fiber::spawn(move || looper(d2));
            let start = Instant::now();
            while done.load(Ordering::Relaxed) < SOME {
                let _ = fiber::yield_now();
            }
            let waited = start.elapsed();
            let finished = looper.is_finished();
            looper.join().unwrap();
            (waited, finished)
        })
    })
}

fn assert_shared((waited, finished): (Duration, bool), what: &str) {
    // The rule: the driver runs before the loop ends. The bound on the
    // wait is loose (the loop alone is about 0.8 s of work; without the
    // budget the driver waits for all of it): on a loaded 2-core machine
    // the OS alone took a select loop's wait to 514 ms once.
    assert!(!finished, "{what}: the driver ran only once the loop had ended");
    assert!(
        waited < Duration::from_millis(2_000),
        "{what}: the driver waited {waited:?}"
    );
}

/// Guards the budget in `Receiver::recv` (the iterator uses it).
#[test]
fn a_receive_loop_on_a_full_channel_lets_the_fibers_beside_it_run() {
    let seen = driver_sees_progress(|done| {
        let (tx, rx) = fiber::chan::unbounded::<u64>();
        for _ in 0..N {
            tx.send(1).unwrap();
        }
        drop(tx);
        for v in rx {
            spin(WORK);
            done.fetch_add(v, Ordering::Relaxed);
        }
    });
    assert_shared(seen, "recv");
}

/// Guards the budget in `Sender::send`: a thread keeps the channel
/// drained.
#[test]
fn a_send_loop_into_a_drained_channel_lets_the_fibers_beside_it_run() {
    let seen = driver_sees_progress(|done| {
        let (tx, rx) = fiber::chan::bounded::<u64>(1 << 20);
        let drain = std::thread::spawn(move || rx.into_iter().count());
        for _ in 0..N {
            tx.send(1).unwrap();
            spin(WORK);
            done.fetch_add(1, Ordering::Relaxed);
        }
        drop(tx);
        assert_eq!(drain.join().unwrap() as u64, N);
    });
    assert_shared(seen, "send");
}

/// Guards the budget in a blocking `select!`'s completed operation.
#[test]
fn a_select_loop_on_a_full_channel_lets_the_fibers_beside_it_run() {
    let seen = driver_sees_progress(|done| {
        let (tx, rx) = fiber::chan::unbounded::<u64>();
        let (_never_tx, never_rx) = fiber::chan::bounded::<u64>(0);
        for _ in 0..N {
            tx.send(1).unwrap();
        }
        drop(tx);
        loop {
            fiber::select! {
                recv(rx) -> v => match v {
                    Ok(v) => {
                        spin(WORK);
                        done.fetch_add(v, Ordering::Relaxed);
                    }
                    Err(_) => break,
                },
                recv(never_rx) -> _ => unreachable!("nothing is sent there"),
            }
        }
    });
    assert_shared(seen, "select");
}

/// Guards the budget in a blocking socket's read: the peer wrote
/// everything before the loop starts.
#[test]
fn a_read_loop_on_a_socket_that_always_has_data_lets_the_fibers_beside_it_run() {
    let seen = driver_sees_progress(|done| {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let writer = std::thread::spawn(move || {
            let (mut peer, _) = listener.accept().unwrap();
            let chunk = [1u8; 64];
            for _ in 0..N / 64 {
                peer.write_all(&chunk).unwrap();
            }
        });
        let mut stream = fiber::net::TcpStream::connect(addr).unwrap();
        let mut buf = [0u8; 1];
        let mut total = 0u64;
        while total < N / 64 * 64 {
            let n = stream.read(&mut buf).unwrap();
            assert_eq!(n, 1);
            total += 1;
            spin(WORK);
            done.fetch_add(1, Ordering::Relaxed);
        }
        writer.join().unwrap();
    });
    assert_shared(seen, "read");
}
