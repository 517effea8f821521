//! The tour: what fiber does, in a few seconds.
//!
//! `cargo run --release --example tour`
//!
//! 1. 100,000 fibers spawned and joined.
//! 2. A three-stage channel pipeline with `select!` and a timeout.
//! 3. A job tree where one child fails and its siblings are cancelled.
//! 4. The runtime's counters.

use fiber::chan::{self, after, bounded};

use std::time::{Duration, Instant};

fn main() {
    fiber::run(|| {
        // 1. Many fibers.
        let start = Instant::now();
        let handles: Vec<_> = (0..100_000u64).map(|i| fiber::spawn(move || i)).collect();
        let sum: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(sum, 100_000 * 99_999 / 2);
        println!("1. spawned and joined 100,000 fibers in {:?}", start.elapsed());

        // 2. A pipeline: numbers -> squares -> sums, with select! and a timeout.
        let (numbers_tx, numbers_rx) = bounded::<u64>(0);
        let (squares_tx, squares_rx) = bounded::<u64>(16);
        let producer = fiber::spawn(move || {
            for n in 1..=1000 {
                numbers_tx.send(n).unwrap();
            }
        });
        let squarer = fiber::spawn(move || {
            for n in numbers_rx.iter() {
                squares_tx.send(n * n).unwrap();
            }
        });
        let timeout = after(Duration::from_secs(10));
        let mut total = 0u64;
        let mut count = 0;
        loop {
            chan::select! {
                recv(squares_rx) -> square => match square {
                    Ok(square) => { total += square; count += 1; }
                    Err(_) => break,
                },
                recv(timeout) -> _ => panic!("the pipeline stalled"),
            }
        }
        producer.join().unwrap();
        squarer.join().unwrap();
        assert_eq!((count, total), (1000, 333_833_500));
        println!("2. pipeline: {count} squares summed to {total} through a rendezvous and a buffered channel");

        // 3. A job tree: one child fails, its siblings are cancelled.
        let before = fiber::JobStats { ..fiber::stats().jobs };
        let outcome = fiber::try_scope(|s| {
            for i in 0..5 {
                s.spawn(move || {
                    // Wait for work that never comes; cancellation ends it.
                    let (_tx, rx) = bounded::<()>(0);
                    let _ = rx.recv_timeout(Duration::from_secs(60));
                    Ok::<_, String>(i)
                });
            }
            s.spawn(|| Err::<u32, _>("child 5 failed".to_string()));
            Ok(())
        });
        let after = fiber::stats().jobs;
        assert_eq!(outcome, Err("child 5 failed".to_string()));
        println!(
            "3. job tree: try_scope returned the first error ({:?}); {} sibling job(s) cancelled, {} failed",
            outcome.unwrap_err(),
            after.jobs_cancelled - before.jobs_cancelled,
            after.jobs_failed - before.jobs_failed
        );

        // 4. Counters.
        println!("4. {}", fiber::stats());
    });
}
