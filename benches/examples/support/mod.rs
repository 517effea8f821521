//! What the timeline examples share: their environment knobs and the
//! fixed-size runtime they measure on.

/// The numeric environment variable `name`, or `default`.
pub fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A runtime of exactly `workers` workers (growth off, as the benches).
pub fn fixed_runtime(workers: usize) -> fiber::Runtime {
    fiber::Runtime::builder()
        .workers(workers)
        .max_workers(workers)
        .build()
        .expect("runtime")
}
