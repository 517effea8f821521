//! Adversarial: bodies and values of a few KiB. `std::thread::spawn`
//! takes a closure of any size; so must `fiber::spawn`, a scoped spawn,
//! `Runtime::spawn` and `fiber::run`. (corosensei moves the entry closure
//! onto the new stack and refuses one over 1 KiB: a body that captured a
//! 2 KiB buffer panicked inside `spawn`.)

use std::hint::black_box;

use crate::common::{in_child, on_runtime, rt};
use std::time::Duration;

const N: usize = 4096;

fn buffer(seed: u8) -> [u8; N] {
    let mut b = [0u8; N];
    for (i, x) in b.iter_mut().enumerate() {
        *x = seed.wrapping_add(i as u8);
    }
    b
}

fn sum(b: &[u8]) -> u64 {
    b.iter().map(|&x| u64::from(x)).sum()
}

#[test]
fn spawn_of_a_body_that_captured_4_kib_runs_it() {
    on_runtime(|| {
        let buf = buffer(3);
        let want = sum(&buf);
        let h = fiber::spawn(move || sum(black_box(&buf)));
        assert_eq!(h.join().unwrap(), want);
    });
}

#[test]
fn spawn_of_a_body_just_over_the_inline_limit_runs_it() {
    on_runtime(|| {
        for len in [1000usize, 1016, 1024, 1100] {
            let mut buf = [0u8; 1100];
            buf[..len].fill(1);
            let h = fiber::spawn(move || sum(black_box(&buf)));
            assert_eq!(h.join().unwrap(), len as u64);
        }
    });
}

#[test]
fn scoped_spawn_of_a_body_that_captured_4_kib_runs_it() {
    on_runtime(|| {
        let buf = buffer(5);
        let want = sum(&buf);
        let total = fiber::scope(|s| {
            let h = s.spawn(move || sum(black_box(&buf)));
            h.join().unwrap()
        });
        assert_eq!(total, want);
    });
}

#[test]
fn a_4_kib_result_comes_back_through_join() {
    on_runtime(|| {
        let h = fiber::spawn(|| buffer(9));
        assert_eq!(sum(&h.join().unwrap()), sum(&buffer(9)));
    });
}

#[test]
fn runtime_spawn_and_block_on_of_bodies_that_captured_4_kib_run_them() {
    let rt = rt();
    let buf = buffer(11);
    let want = sum(&buf);
    let h = rt.spawn(move || sum(black_box(&buf)));
    let buf2 = buffer(11);
    let got = rt.block_on(move || sum(black_box(&buf2)) + h.join().unwrap());
    assert_eq!(got, 2 * want);
}

#[test]
fn run_of_a_body_that_captured_4_kib_runs_it() {
    let buf = buffer(13);
    let want = sum(&buf);
    assert_eq!(fiber::run(move || sum(black_box(&buf))), want);
}

#[test]
fn one_kib_messages_pass_through_every_channel_flavour() {
    on_runtime(|| {
        for cap in [Some(0), Some(4), None] {
            let (tx, rx) = match cap {
                Some(c) => fiber::chan::bounded::<[u8; 1024]>(c),
                None => fiber::chan::unbounded(),
            };
            let h = fiber::spawn(move || {
                let mut total = 0;
                for m in rx.iter() {
                    total += sum(&m);
                }
                total
            });
            for i in 0..8u8 {
                tx.send([i; 1024]).unwrap();
            }
            drop(tx);
            assert_eq!(h.join().unwrap(), (0..8u64).map(|i| i * 1024).sum::<u64>());
        }
    });
}

/// A message of 8 KiB through every way a value enters and leaves a
/// channel, on a fiber with the default stack, in a test (debug) build.
/// Each internal step used to take the value by value, so every frame of
/// the send and receive paths held copies: an 8 KiB send or receive needed
/// 250 to 380 KiB of stack in a debug build and overflowed the default
/// 256 KiB (the process aborted). Run in a child process so that an
/// overflow fails this test instead of aborting the whole file.
const BIG: usize = 8 * 1024;

fn big(seed: u8) -> Box<[u8; BIG]> {
    let mut b = Box::new([0u8; BIG]);
    for (i, x) in b.iter_mut().enumerate() {
        *x = seed.wrapping_add(i as u8);
    }
    b
}

fn want(seed: u8) -> u64 {
    sum(&big(seed)[..])
}

// One operation per function, so that the test's own frames hold one
// copy each (a debug build gives every temporary of a function its own
// slot).
type Tx = fiber::chan::Sender<[u8; BIG]>;
type Rx = fiber::chan::Receiver<[u8; BIG]>;

#[inline(never)]
fn send(tx: &Tx, seed: u8) {
    tx.send(*big(seed)).unwrap();
}

#[inline(never)]
fn recv(rx: &Rx) -> u64 {
    sum(&rx.recv().unwrap())
}

#[inline(never)]
fn send_timeout(tx: &Tx, seed: u8) {
    tx.send_timeout(*big(seed), Duration::from_secs(5)).unwrap();
}

#[inline(never)]
fn recv_timeout(rx: &Rx) -> u64 {
    sum(&rx.recv_timeout(Duration::from_secs(5)).unwrap())
}

#[inline(never)]
fn try_send(tx: &Tx, seed: u8) {
    tx.try_send(*big(seed)).unwrap();
}

#[inline(never)]
fn try_recv(rx: &Rx) -> u64 {
    sum(&rx.try_recv().unwrap())
}

/// A select's send arm: `true` if it sent.
#[inline(never)]
fn select_send(tx: &Tx, seed: u8) -> bool {
    fiber::select! {
        send(tx, *big(seed)) -> r => r.is_ok(),
        default(Duration::from_millis(1)) => false,
    }
}

#[inline(never)]
fn select_recv(rx: &Rx) -> u64 {
    fiber::select! { recv(rx) -> m => sum(&m.unwrap()) }
}

/// A send that fails: the sum of the value it returns.
#[inline(never)]
fn failed_send(tx: &Tx, seed: u8) -> u64 {
    let fiber::chan::SendError(v) = tx.send(*big(seed)).unwrap_err();
    sum(&v)
}

/// `f` in a fiber of a runtime with 256 KiB stacks: the default of a
/// release build, which a debug build (1 MiB by default) would otherwise
/// not exercise.
fn on_256_kib_stacks<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    crate::common::within(30, move || {
        let rt = fiber::Runtime::builder().stack_size(256 * 1024).build().unwrap();
        rt.block_on(f)
    })
}

#[test]
fn eight_kib_messages_by_value_fit_the_default_stack_in_every_path() {
    in_child(
        "eight_kib_messages_by_value_fit_the_default_stack_in_every_path",
        60,
        || {
            on_256_kib_stacks(|| {
                for cap in [Some(0), Some(1), Some(4), None] {
                    let (tx, rx) = match cap {
                        Some(c) => fiber::chan::bounded::<[u8; BIG]>(c),
                        None => fiber::chan::unbounded(),
                    };
                    // A receiver parked first (the value is handed to it), then
                    // a sender parked first (the receiver takes it from there).
                    let rx2 = rx.clone();
                    let h = fiber::spawn(move || recv(&rx2));
                    while tx.waiting().0 == 0 && cap == Some(0) {
                        let _ = fiber::yield_now();
                    }
                    send(&tx, 1);
                    assert_eq!(h.join().unwrap(), want(1), "cap {cap:?}");
                    let tx2 = tx.clone();
                    let h = fiber::spawn(move || send(&tx2, 2));
                    assert_eq!(recv(&rx), want(2), "cap {cap:?}");
                    h.join().unwrap();
                    // The timed and non-blocking forms, select, and the value
                    // a failed send returns.
                    let tx3 = tx.clone();
                    let h = fiber::spawn(move || send_timeout(&tx3, 3));
                    assert_eq!(recv_timeout(&rx), want(3));
                    h.join().unwrap();
                    if cap != Some(0) {
                        try_send(&tx, 4);
                        assert_eq!(try_recv(&rx), want(4));
                        assert!(select_send(&tx, 5), "room for the select's send");
                        assert_eq!(select_recv(&rx), want(5));
                    }
                    drop(rx);
                    assert_eq!(failed_send(&tx, 6), want(6));
                }
            })
        },
    );
}

/// A fiber's return value of 16 KiB, joined, on a 256 KiB stack (the
/// release default) in a test (debug) build. The value travelled by value through the fiber's
/// completion (`Completion::finish`, `Task::complete`, each frame holding
/// copies): about 12 KiB already overflowed the 256 KiB stack in a debug
/// build. It now moves into the join slot in place.
const RESULT: usize = 16 * 1024;

#[inline(never)]
fn big_result(seed: u8) -> [u8; RESULT] {
    let mut b = [0u8; RESULT];
    for (i, x) in b.iter_mut().enumerate() {
        *x = seed.wrapping_add(i as u8);
    }
    b
}

#[inline(never)]
fn join_sum(h: fiber::JoinHandle<[u8; RESULT]>) -> u64 {
    sum(&h.join().unwrap())
}

#[test]
fn a_16_kib_return_value_fits_the_default_stack() {
    in_child("a_16_kib_return_value_fits_the_default_stack", 60, || {
        on_256_kib_stacks(|| {
            let want = sum(&big_result(7));
            let h = fiber::spawn(|| big_result(7));
            assert_eq!(join_sum(h), want);
            // Cancelled after its body returned: the value is dropped by
            // the fiber, in place.
            let h = fiber::spawn(|| {
                fiber::Job::current().cancel();
                big_result(8)
            });
            assert!(h.join().unwrap_err().is_cancelled());
            // A scoped child's value.
            let got = fiber::scope(|s| sum(&s.spawn(|| big_result(9)).join().unwrap()));
            assert_eq!(got, sum(&big_result(9)));
        })
    });
}
