//! W1 (spawn-join) in phases, several iterations in one runtime: the
//! spawn loop alone and spawn plus joins, in ns per fiber. The scheduler's
//! spawn-path profile in `spec/sched.md` section 7 was taken with it.
//!
//! ```text
//! cargo build --release -p benches --example w1_phases
//! target/release/examples/w1_phases
//! ```
//!
//! Environment: `N` fibers per iteration (100,000), `ITERS` (5),
//! `WORKERS` (2, fixed), `MODE=1` to join each fiber right after its spawn
//! instead of spawning all first.

use std::time::Instant;

mod support;
use support::{env, fixed_runtime};

fn main() {
    let n = env("N", 100_000) as usize;
    let iters = env("ITERS", 5);
    let workers = env("WORKERS", 2) as usize;
    let interleaved = env("MODE", 0) == 1;
    let rt = fixed_runtime(workers);
    rt.block_on(move || {
        for _ in 0..iters {
            let start = Instant::now();
            let per = |d: std::time::Duration| d.as_nanos() as f64 / n as f64;
            if interleaved {
                for _ in 0..n {
                    fiber::spawn(|| ()).join().expect("joined");
                }
                println!("interleaved total {:.1} ns/task", per(start.elapsed()));
            } else {
                let mut handles = Vec::with_capacity(n);
                for _ in 0..n {
                    handles.push(fiber::spawn(|| ()));
                }
                let spawned = start.elapsed();
                let joined = handles
                    .into_iter()
                    .filter(|_| true)
                    .map(|h| h.join().is_ok() as usize)
                    .sum::<usize>();
                assert_eq!(joined, n, "every fiber joins");
                println!(
                    "spawn {:.1} ns/task total {:.1} ns/task",
                    per(spawned),
                    per(start.elapsed())
                );
            }
        }
    });
}
