//! Probe: W1 spawn-join, repeated.
fn main() {
    let rounds: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(20);
    let n: usize = std::env::args().nth(2).and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let mut b = fiber::Runtime::builder();
    b.workers(2).max_workers(2);
    let rt = b.build().unwrap();
    rt.block_on(move || {
        let start = std::time::Instant::now();
        for _ in 0..rounds {
            let mut handles = Vec::with_capacity(n);
            for _ in 0..n {
                handles.push(fiber::spawn(|| ()));
            }
            let joined: usize = handles.into_iter().map(|h| h.join().is_ok() as usize).sum();
            assert_eq!(joined, n);
        }
        println!("{:.1} ns/task", start.elapsed().as_nanos() as f64 / (n * rounds) as f64);
    });
}
