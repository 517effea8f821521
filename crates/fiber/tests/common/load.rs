//! CPU load for the fairness tests: plain threads that spin beside the
//! runtime, and a spin without a yield point.

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `n` plain threads spinning until this is dropped (also on an unwind).
pub struct Hogs {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

/// Start `n` hog threads.
pub fn hogs(n: usize) -> Hogs {
    let stop = Arc::new(AtomicBool::new(false));
    let threads = (0..n)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(SeqCst) {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    Hogs { stop, threads }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        self.stop.store(true, SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Run `f` with `n` hog threads spinning beside it.
pub fn under_load<T>(n: usize, f: impl FnOnce() -> T) -> T {
    let _hogs = hogs(n);
    f()
}

/// Spin without a yield point for `d`.
pub fn spin(d: Duration) {
    let s = Instant::now();
    while s.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// Fibers that each spin `turn` (no yield point) and then yield, in a
/// loop, until [`Crunchers::stop`].
pub struct Crunchers {
    stop: Arc<AtomicBool>,
    handles: Vec<fiber::JoinHandle<u64>>,
}

/// Spawn `n` crunchers of `turn` on the current runtime.
pub fn yielding_crunchers(n: usize, turn: Duration) -> Crunchers {
    let stop = Arc::new(AtomicBool::new(false));
    let handles = (0..n)
        .map(|_| {
            let stop = stop.clone();
            fiber::spawn(move || {
                let mut turns = 0u64;
                while !stop.load(SeqCst) {
                    spin(turn);
                    turns += 1;
                    fiber::yield_now().unwrap();
                }
                turns
            })
        })
        .collect();
    Crunchers { stop, handles }
}

impl Crunchers {
    /// Stop them, join them, and return each one's count of turns.
    pub fn stop(self) -> Vec<u64> {
        self.stop.store(true, SeqCst);
        self.handles.into_iter().map(|h| h.join().unwrap()).collect()
    }
}
