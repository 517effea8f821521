//! Probe: spawn + join in a scope, in a loop.
fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2_000_000);
    let mut b = fiber::Runtime::builder();
    b.workers(2).max_workers(2);
    let rt = b.build().unwrap();
    rt.block_on(move || {
        let start = std::time::Instant::now();
        fiber::scope(|s| {
            let mut t = 0;
            for _ in 0..n {
                t += s.spawn(|| 1usize).join().unwrap();
            }
            assert_eq!(t, n);
        });
        println!("{:.1} ns/job", start.elapsed().as_nanos() as f64 / n as f64);
    });
}
