//! Loops for the operation budget's tells: self-fed channel loops, runs
//! of sends that never wait, and a fiber cancelled through its handle.

use super::{rt1, wait_fiber_parked, within};
use fiber::chan;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A loop of sends and receives that always succeed at once (a self-fed
/// unbounded channel): `Some(rounds)` once an operation fails (told of a
/// cancellation at a budget look), `None` if it still ran after `limit`.
pub fn self_fed_loop(limit: Duration) -> Option<u64> {
    let (tx, rx) = chan::unbounded::<u64>();
    let t0 = Instant::now();
    let mut i = 0u64;
    loop {
        i += 1;
        if t0.elapsed() > limit {
            return None;
        }
        if tx.send(i).is_err() || rx.recv().is_err() {
            return Some(i);
        }
    }
}

/// `n` sends on a fresh unbounded channel that never waits: how many were
/// made (a budget look that tells the fiber of a cancellation cuts one).
pub fn sends_made(n: u64) -> u64 {
    let (tx, rx) = chan::unbounded::<u64>();
    let mut made = 0;
    for i in 0..n {
        if tx.send(i).is_ok() {
            made += 1;
        }
    }
    drop(rx);
    made
}

/// Spawn `body` on a one-worker runtime, cancel it through its handle once
/// it is parked in its first wait, and return what it reported.
pub fn after_handle_cancel<T: Send + 'static>(body: impl FnOnce(mpsc::Sender<T>) + Send + 'static) -> T {
    within(30, move || {
        let (res_tx, res_rx) = mpsc::channel();
        rt1().block_on(move || {
            let h = fiber::spawn(move || body(res_tx));
            wait_fiber_parked(h.id());
            h.cancel();
            let _ = h.join();
        });
        res_rx.recv_timeout(Duration::from_secs(10)).unwrap()
    })
}
