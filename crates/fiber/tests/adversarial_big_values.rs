//! Adversarial: bodies and values of a few KiB. `std::thread::spawn`
//! takes a closure of any size; so must `fiber::spawn`, a scoped spawn,
//! `Runtime::spawn` and `fiber::run`. (corosensei moves the entry closure
//! onto the new stack and refuses one over 1 KiB: a body that captured a
//! 2 KiB buffer panicked inside `spawn`.)

use std::hint::black_box;

mod common;
use common::{on_runtime, rt};

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
