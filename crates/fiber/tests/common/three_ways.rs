//! The three-way harness of the ported channel suites
//! (`conformance/crossbeam.rs`, `conformance/crossbeam_mpsc.rs`): each
//! body runs on plain threads and in fibers of a one- and a two-worker
//! runtime, with upstream's `thread::sleep` / `yield_now` / `spawn`
//! mapped to what the mode needs.
#![allow(dead_code)]

use crate::common::{rt1, rt2, within};
use std::panic::resume_unwind;
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Mode {
    Threads,
    Fibers1,
    Fibers2,
}

pub fn run(mode: Mode, body: fn()) {
    within(60, move || match mode {
        Mode::Threads => body(),
        Mode::Fibers1 => rt1().block_on(body),
        Mode::Fibers2 => rt2().block_on(body),
    })
}

/// One `#[test]` per mode for each named body.
macro_rules! port {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn threads() {
                crate::three_ways::run(crate::three_ways::Mode::Threads, super::$name)
            }
            #[test]
            fn fibers_1w() {
                crate::three_ways::run(crate::three_ways::Mode::Fibers1, super::$name)
            }
            #[test]
            fn fibers_2w() {
                crate::three_ways::run(crate::three_ways::Mode::Fibers2, super::$name)
            }
        }
    )*};
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub fn in_fiber() -> bool {
    fiber::core::in_fiber()
}

/// `thread::sleep` of the upstream tests: parks a fiber, sleeps a thread.
pub fn sleep(d: Duration) {
    if in_fiber() {
        fiber::sleep(d).unwrap();
    } else {
        std::thread::sleep(d);
    }
}

/// `thread::yield_now` of the upstream tests, and the yield inside a loop
/// that never blocks.
pub fn relax() {
    if in_fiber() {
        let _ = fiber::yield_now();
    } else {
        std::thread::yield_now();
    }
}

/// A peer: a fiber in a runtime, a thread outside one.
pub enum Peer<T> {
    Fiber(fiber::JoinHandle<T>),
    Thread(std::thread::JoinHandle<T>),
}

impl<T: Send + 'static> Peer<T> {
    /// Join; re-raise the peer's panic.
    pub fn join(self) -> T {
        match self.outcome() {
            Ok(v) => v,
            Err(p) => resume_unwind(p),
        }
    }

    /// Join; `Err` with the payload if the peer panicked.
    pub fn outcome(self) -> Result<T, Box<dyn std::any::Any + Send>> {
        match self {
            Peer::Fiber(h) => h.join().map_err(|e| {
                if e.is_panic() {
                    e.into_panic()
                } else {
                    panic!("peer fiber failed: {e}")
                }
            }),
            Peer::Thread(h) => h.join(),
        }
    }
}

pub fn go<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Peer<T> {
    if in_fiber() {
        Peer::Fiber(fiber::spawn(f))
    } else {
        Peer::Thread(std::thread::spawn(f))
    }
}
