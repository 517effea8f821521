//! The skynet benchmark: a 10-ary tree of 1,111,111 fibers; each leaf sends
//! its number to its parent's channel, each parent sums its 10 children.
//!
//! `cargo run --release --example skynet`

use fiber::chan::{bounded, Sender};
use std::time::Instant;

fn skynet(num: u64, size: u64, parent: Sender<u64>) {
    if size == 1 {
        parent.send(num).unwrap();
        return;
    }
    let (tx, rx) = bounded(10);
    for i in 0..10 {
        let tx = tx.clone();
        let child_size = size / 10;
        fiber::spawn(move || skynet(num + i * child_size, child_size, tx));
    }
    drop(tx);
    let sum: u64 = rx.iter().take(10).sum();
    parent.send(sum).unwrap();
}

fn main() {
    let (elapsed, sum) = fiber::run(|| {
        let start = Instant::now();
        let (tx, rx) = bounded(1);
        fiber::spawn(move || skynet(0, 1_000_000, tx));
        let sum = rx.recv().unwrap();
        (start.elapsed(), sum)
    });
    if sum != 499_999_500_000 {
        eprintln!("CHECK FAILED: skynet sum {sum} != 499999500000");
        std::process::exit(1);
    }
    println!(
        "skynet: 1,111,111 fibers, sum {sum}, {:.0} ms",
        elapsed.as_secs_f64() * 1000.0
    );
}
