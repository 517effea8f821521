//! A fan-out / fan-in worker pool with cancellation on the first error:
//! a feeder sends work items, four workers process them, results are
//! collected; item 700 is bad, so the scope fails and the rest is cancelled.
//!
//! `cargo run --release --example pipeline`

use fiber::chan::bounded;

#[derive(Debug)]
struct BadItem(u32);

fn main() {
    let (outcome, processed) = fiber::run(|| {
        let (work_tx, work_rx) = bounded::<u32>(8);
        let (done_tx, done_rx) = bounded::<u32>(8);
        let outcome = fiber::try_scope(|s| {
            s.spawn(move || {
                for item in 0..10_000 {
                    if work_tx.send(item).is_err() {
                        break;
                    }
                }
                Ok(())
            });
            for _ in 0..4 {
                let (work_rx, done_tx) = (work_rx.clone(), done_tx.clone());
                s.spawn(move || {
                    for item in work_rx.iter() {
                        if item == 700 {
                            return Err(BadItem(item));
                        }
                        if fiber::check_cancelled().is_err() || done_tx.send(item * 2).is_err() {
                            break;
                        }
                    }
                    Ok(())
                });
            }
            drop(done_tx);
            let collector = s.spawn(move || Ok(done_rx.iter().count()));
            collector.join().map_err(|_| BadItem(u32::MAX))
        });
        let processed = outcome.as_ref().ok().copied();
        (outcome.map(|_| ()), processed)
    });
    match outcome {
        Err(BadItem(item)) => {
            println!(
                "pipeline: stopped on the first error (bad item {item}); the feeder and other workers were cancelled"
            );
            assert_eq!(item, 700);
        }
        Ok(()) => {
            eprintln!("CHECK FAILED: the bad item did not fail the pipeline ({processed:?} processed)");
            std::process::exit(1);
        }
    }
}
