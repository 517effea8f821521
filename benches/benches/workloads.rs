//! The workloads of BENCHMARKS.md for fiber and its peers (std threads +
//! crossbeam-channel, tokio), one measurement per process.
//!
//! `cargo bench -p benches --bench workloads -- <workload> <system>` prints
//! one line `RESULT <workload> <system> <value> <unit> <detail>` (or
//! `SKIP <workload> <system> <reason>`); `cargo xtask bench` drives it.
//! A failed check prints `CHECK FAILED: ...` and exits with status 1.

use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// W1: tasks spawned and joined.
const W1_N: usize = 100_000;
/// W1/W7 with OS threads (2 mappings per thread stack; pid_max 32768).
const THREADS_N: usize = 10_000;
/// W3: round trips (OS threads: 100,000; a futex hand-off costs ~35 us here).
const W3_ROUNDS: u64 = 1_000_000;
const W3_ROUNDS_THREADS: u64 = 100_000;
/// W4: producers, consumers, messages per producer, capacity.
const W4_PRODUCERS: u64 = 4;
const W4_CONSUMERS: usize = 4;
const W4_PER_PRODUCER: u64 = 1_000_000;
const W4_CAP: usize = 1024;
/// W5: tasks x yields.
const W5_TASKS: usize = 1000;
const W5_YIELDS: usize = 1000;
/// W6: sleepers and their sleep.
const W6_N: usize = 100_000;
const W6_SLEEP: Duration = Duration::from_millis(10);
/// W7: parked tasks.
const W7_N: usize = 100_000;
/// W8: input bytes and block size.
const W8_LEN: usize = 67_108_864;
const W8_BLOCK: usize = 128 * 1024;
/// Micro workloads: operations per measurement.
const MICRO_OPS: usize = 200_000;

#[path = "workloads/sync.rs"]
mod sync_rows;

fn cores() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

fn check(ok: bool, what: impl FnOnce() -> String) {
    if !ok {
        eprintln!("CHECK FAILED: {}", what());
        std::process::exit(1);
    }
}

fn warmup_on() -> bool {
    std::env::var("ANCHORS_WARMUP").map_or(true, |v| v != "0")
}

/// `--fixed-workers`: exactly `cores()` workers (`max_workers = workers`,
/// growth off), as every peer gets; otherwise the elastic default ceiling.
fn fixed_workers() -> bool {
    std::env::args().any(|a| a == "--fixed-workers")
}

fn fiber_rt() -> fiber::Runtime {
    let c = cores();
    let mut builder = fiber::Runtime::builder();
    builder.workers(c);
    if fixed_workers() {
        builder.max_workers(c);
    }
    builder.build().expect("runtime")
}

fn tokio_rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cores())
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Run `body` (warm-up, then timed) as the fiber driver.
fn on_fiber<R: Send + 'static>(body: fn() -> R) -> Duration {
    let rt = fiber_rt();
    rt.block_on(move || {
        if warmup_on() {
            black_box(body());
        }
        let start = Instant::now();
        black_box(body());
        start.elapsed()
    })
}

/// Run `body` (warm-up, then timed) as a tokio driver task.
fn on_tokio<F, Fut>(body: F) -> Duration
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: std::future::Future + Send,
    Fut::Output: Send,
{
    let rt = tokio_rt();
    rt.block_on(async move {
        tokio::spawn(async move {
            if warmup_on() {
                black_box(body().await);
            }
            let start = Instant::now();
            black_box(body().await);
            start.elapsed()
        })
        .await
        .expect("driver task")
    })
}

fn on_thread<R>(body: fn() -> R) -> Duration {
    if warmup_on() {
        black_box(body());
    }
    let start = Instant::now();
    black_box(body());
    start.elapsed()
}

// ---- W1 spawn-join ----

fn w1_fiber() -> usize {
    let mut handles = Vec::with_capacity(W1_N);
    for _ in 0..W1_N {
        handles.push(fiber::spawn(|| ()));
    }
    let joined = handles
        .into_iter()
        .filter(|_| true)
        .map(|h| h.join().is_ok() as usize)
        .sum::<usize>();
    check(joined == W1_N, || format!("w1: {joined} joins"));
    joined
}

async fn w1_tokio() -> usize {
    let mut handles = Vec::with_capacity(W1_N);
    for _ in 0..W1_N {
        handles.push(tokio::spawn(async {}));
    }
    let mut joined = 0;
    for h in handles {
        joined += h.await.is_ok() as usize;
    }
    check(joined == W1_N, || format!("w1: {joined} joins"));
    joined
}

fn w1_threads() -> usize {
    let handles: Vec<_> = (0..THREADS_N).map(|_| std::thread::spawn(|| ())).collect();
    let joined = handles.into_iter().map(|h| h.join().is_ok() as usize).sum::<usize>();
    check(joined == THREADS_N, || format!("w1: {joined} joins"));
    joined
}

// ---- W2 skynet ----

fn skynet_fiber(num: u64, size: u64, parent: fiber::chan::Sender<u64>) {
    if size == 1 {
        parent.send(num).unwrap();
        return;
    }
    let (tx, rx) = fiber::chan::bounded(10);
    for i in 0..10 {
        let tx = tx.clone();
        let child = size / 10;
        fiber::spawn(move || skynet_fiber(num + i * child, child, tx));
    }
    drop(tx);
    parent.send(rx.iter().take(10).sum()).unwrap();
}

fn w2_fiber() -> u64 {
    let (tx, rx) = fiber::chan::bounded(1);
    fiber::spawn(move || skynet_fiber(0, 1_000_000, tx));
    let sum = rx.recv().unwrap();
    check(sum == 499_999_500_000, || format!("skynet sum {sum}"));
    sum
}

fn skynet_tokio(
    num: u64,
    size: u64,
    parent: tokio::sync::mpsc::Sender<u64>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    Box::pin(async move {
        if size == 1 {
            parent.send(num).await.unwrap();
            return;
        }
        let (tx, mut rx) = tokio::sync::mpsc::channel(10);
        for i in 0..10 {
            let child = size / 10;
            tokio::spawn(skynet_tokio(num + i * child, child, tx.clone()));
        }
        drop(tx);
        let mut sum = 0;
        for _ in 0..10 {
            sum += rx.recv().await.unwrap();
        }
        parent.send(sum).await.unwrap();
    })
}

async fn w2_tokio() -> u64 {
    let (tx, mut rx) = tokio::sync::mpsc::channel(1);
    tokio::spawn(skynet_tokio(0, 1_000_000, tx));
    let sum = rx.recv().await.unwrap();
    check(sum == 499_999_500_000, || format!("skynet sum {sum}"));
    sum
}

// ---- W3 ping-pong ----

fn w3_fiber() -> u64 {
    let (a_tx, a_rx) = fiber::chan::bounded::<u64>(0);
    let (b_tx, b_rx) = fiber::chan::bounded::<u64>(0);
    let pong = fiber::spawn(move || {
        for x in a_rx.iter() {
            b_tx.send(x + 1).unwrap();
        }
    });
    for i in 0..W3_ROUNDS {
        a_tx.send(i).unwrap();
        let y = b_rx.recv().unwrap();
        check(y == i + 1, || format!("ping-pong {y} != {}", i + 1));
    }
    drop(a_tx);
    pong.join().unwrap();
    W3_ROUNDS
}

async fn w3_tokio() -> u64 {
    let (a_tx, mut a_rx) = tokio::sync::mpsc::channel::<u64>(1);
    let (b_tx, mut b_rx) = tokio::sync::mpsc::channel::<u64>(1);
    let pong = tokio::spawn(async move {
        while let Some(x) = a_rx.recv().await {
            b_tx.send(x + 1).await.unwrap();
        }
    });
    for i in 0..W3_ROUNDS {
        a_tx.send(i).await.unwrap();
        let y = b_rx.recv().await.unwrap();
        check(y == i + 1, || format!("ping-pong {y} != {}", i + 1));
    }
    drop(a_tx);
    pong.await.unwrap();
    W3_ROUNDS
}

fn w3_threads() -> u64 {
    let (a_tx, a_rx) = crossbeam_channel::bounded::<u64>(0);
    let (b_tx, b_rx) = crossbeam_channel::bounded::<u64>(0);
    let pong = std::thread::spawn(move || {
        for x in a_rx.iter() {
            b_tx.send(x + 1).unwrap();
        }
    });
    for i in 0..W3_ROUNDS_THREADS {
        a_tx.send(i).unwrap();
        let y = b_rx.recv().unwrap();
        check(y == i + 1, || format!("ping-pong {y} != {}", i + 1));
    }
    drop(a_tx);
    pong.join().unwrap();
    W3_ROUNDS_THREADS
}

// ---- W4 mpmc ----

const W4_TOTAL: u64 = W4_PRODUCERS * W4_PER_PRODUCER;
const W4_SUM: u64 = 7_999_998_000_000;

fn w4_fiber() -> u64 {
    let (tx, rx) = fiber::chan::bounded::<u64>(W4_CAP);
    let producers: Vec<_> = (0..W4_PRODUCERS)
        .map(|p| {
            let tx = tx.clone();
            fiber::spawn(move || {
                for k in 0..W4_PER_PRODUCER {
                    tx.send(p * 1_000_000 + k).unwrap();
                }
            })
        })
        .collect();
    drop(tx);
    let consumers: Vec<_> = (0..W4_CONSUMERS)
        .map(|_| {
            let rx = rx.clone();
            fiber::spawn(move || rx.iter().fold((0u64, 0u64), |(c, s), v| (c + 1, s + v)))
        })
        .collect();
    for p in producers {
        p.join().unwrap();
    }
    let (count, sum) = consumers
        .into_iter()
        .map(|c| c.join().unwrap())
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    check(count == W4_TOTAL && sum == W4_SUM, || {
        format!("mpmc count {count} sum {sum}")
    });
    count
}

async fn w4_tokio() -> u64 {
    let (tx, rx) = tokio::sync::mpsc::channel::<u64>(W4_CAP);
    let rx = Arc::new(tokio::sync::Mutex::new(rx));
    let producers: Vec<_> = (0..W4_PRODUCERS)
        .map(|p| {
            let tx = tx.clone();
            tokio::spawn(async move {
                for k in 0..W4_PER_PRODUCER {
                    tx.send(p * 1_000_000 + k).await.unwrap();
                }
            })
        })
        .collect();
    drop(tx);
    let consumers: Vec<_> = (0..W4_CONSUMERS)
        .map(|_| {
            let rx = rx.clone();
            tokio::spawn(async move {
                let (mut c, mut s) = (0u64, 0u64);
                loop {
                    let v = rx.lock().await.recv().await;
                    match v {
                        Some(v) => {
                            c += 1;
                            s += v;
                        }
                        None => return (c, s),
                    }
                }
            })
        })
        .collect();
    for p in producers {
        p.await.unwrap();
    }
    let mut total = (0, 0);
    for c in consumers {
        let (a, b) = c.await.unwrap();
        total = (total.0 + a, total.1 + b);
    }
    check(total == (W4_TOTAL, W4_SUM), || format!("mpmc {total:?}"));
    total.0
}

fn w4_threads() -> u64 {
    let (tx, rx) = crossbeam_channel::bounded::<u64>(W4_CAP);
    let producers: Vec<_> = (0..W4_PRODUCERS)
        .map(|p| {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for k in 0..W4_PER_PRODUCER {
                    tx.send(p * 1_000_000 + k).unwrap();
                }
            })
        })
        .collect();
    drop(tx);
    let consumers: Vec<_> = (0..W4_CONSUMERS)
        .map(|_| {
            let rx = rx.clone();
            std::thread::spawn(move || rx.iter().fold((0u64, 0u64), |(c, s), v| (c + 1, s + v)))
        })
        .collect();
    for p in producers {
        p.join().unwrap();
    }
    let total = consumers
        .into_iter()
        .map(|c| c.join().unwrap())
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    check(total == (W4_TOTAL, W4_SUM), || format!("mpmc {total:?}"));
    total.0
}

// ---- W5 yield ----

fn w5_fiber() -> usize {
    let handles: Vec<_> = (0..W5_TASKS)
        .map(|_| {
            fiber::spawn(|| {
                for _ in 0..W5_YIELDS {
                    let _ = fiber::yield_now();
                }
                W5_YIELDS
            })
        })
        .collect();
    let total: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
    check(total == W5_TASKS * W5_YIELDS, || format!("yields {total}"));
    total
}

async fn w5_tokio() -> usize {
    let handles: Vec<_> = (0..W5_TASKS)
        .map(|_| {
            tokio::spawn(async {
                for _ in 0..W5_YIELDS {
                    tokio::task::yield_now().await;
                }
                W5_YIELDS
            })
        })
        .collect();
    let mut total = 0;
    for h in handles {
        total += h.await.unwrap();
    }
    check(total == W5_TASKS * W5_YIELDS, || format!("yields {total}"));
    total
}

fn w5_threads() -> usize {
    let handles: Vec<_> = (0..W5_TASKS)
        .map(|_| {
            std::thread::spawn(|| {
                for _ in 0..W5_YIELDS {
                    std::thread::yield_now();
                }
                W5_YIELDS
            })
        })
        .collect();
    let total: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
    check(total == W5_TASKS * W5_YIELDS, || format!("yields {total}"));
    total
}

// ---- W6 timers ----

fn w6_fiber() -> usize {
    let handles: Vec<_> = (0..W6_N)
        .map(|_| {
            fiber::spawn(|| {
                let t0 = Instant::now();
                let _ = fiber::sleep(W6_SLEEP);
                t0.elapsed() >= W6_SLEEP
            })
        })
        .collect();
    let ok = handles
        .into_iter()
        .filter(|_| true)
        .map(|h| h.join().unwrap() as usize)
        .sum::<usize>();
    check(ok == W6_N, || format!("{} early wakes", W6_N - ok));
    ok
}

async fn w6_tokio() -> usize {
    let handles: Vec<_> = (0..W6_N)
        .map(|_| {
            tokio::spawn(async {
                let t0 = Instant::now();
                tokio::time::sleep(W6_SLEEP).await;
                t0.elapsed() >= W6_SLEEP
            })
        })
        .collect();
    let mut ok = 0;
    for h in handles {
        ok += h.await.unwrap() as usize;
    }
    check(ok == W6_N, || format!("{} early wakes", W6_N - ok));
    ok
}

// ---- W7 parked memory ----

fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn w7(system: &str) -> (f64, usize) {
    match system {
        "fiber" => fiber_rt().block_on(|| {
            let baseline = status_kib("VmRSS:");
            let parked = Arc::new(AtomicUsize::new(0));
            let mut senders = Vec::with_capacity(W7_N);
            let mut handles = Vec::with_capacity(W7_N);
            for _ in 0..W7_N {
                let (tx, rx) = fiber::chan::bounded::<u64>(1);
                let parked = parked.clone();
                senders.push(tx);
                handles.push(fiber::spawn(move || {
                    parked.fetch_add(1, Ordering::Relaxed);
                    rx.recv().unwrap()
                }));
            }
            while parked.load(Ordering::Relaxed) < W7_N {
                let _ = fiber::sleep(Duration::from_millis(1));
            }
            let _ = fiber::sleep(Duration::from_millis(200));
            let peak = status_kib("VmHWM:");
            for (i, tx) in senders.iter().enumerate() {
                tx.send(i as u64).unwrap();
            }
            let sum: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
            check(sum == (W7_N as u64) * (W7_N as u64 - 1) / 2, || format!("w7 sum {sum}"));
            ((peak - baseline) as f64 / W7_N as f64, W7_N)
        }),
        "tokio" => {
            let rt = tokio_rt();
            rt.block_on(async {
                tokio::spawn(async {
                    let baseline = status_kib("VmRSS:");
                    let parked = Arc::new(AtomicUsize::new(0));
                    let mut senders = Vec::with_capacity(W7_N);
                    let mut handles = Vec::with_capacity(W7_N);
                    for _ in 0..W7_N {
                        let (tx, rx) = tokio::sync::oneshot::channel::<u64>();
                        let parked = parked.clone();
                        senders.push(tx);
                        handles.push(tokio::spawn(async move {
                            parked.fetch_add(1, Ordering::Relaxed);
                            rx.await.unwrap()
                        }));
                    }
                    while parked.load(Ordering::Relaxed) < W7_N {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    let peak = status_kib("VmHWM:");
                    for (i, tx) in senders.into_iter().enumerate() {
                        tx.send(i as u64).unwrap();
                    }
                    let mut sum = 0;
                    for h in handles {
                        sum += h.await.unwrap();
                    }
                    check(sum == (W7_N as u64) * (W7_N as u64 - 1) / 2, || format!("w7 sum {sum}"));
                    ((peak - baseline) as f64 / W7_N as f64, W7_N)
                })
                .await
                .unwrap()
            })
        }
        _ => {
            let baseline = status_kib("VmRSS:");
            let parked = Arc::new(AtomicUsize::new(0));
            let mut senders = Vec::with_capacity(THREADS_N);
            let mut handles = Vec::with_capacity(THREADS_N);
            for _ in 0..THREADS_N {
                let (tx, rx) = crossbeam_channel::bounded::<u64>(1);
                let parked = parked.clone();
                senders.push(tx);
                handles.push(std::thread::spawn(move || {
                    parked.fetch_add(1, Ordering::Relaxed);
                    rx.recv().unwrap()
                }));
            }
            while parked.load(Ordering::Relaxed) < THREADS_N {
                std::thread::sleep(Duration::from_millis(1));
            }
            std::thread::sleep(Duration::from_millis(200));
            let peak = status_kib("VmHWM:");
            for (i, tx) in senders.iter().enumerate() {
                tx.send(i as u64).unwrap();
            }
            let sum: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
            check(sum == (THREADS_N as u64) * (THREADS_N as u64 - 1) / 2, || {
                format!("w7 sum {sum}")
            });
            ((peak - baseline) as f64 / THREADS_N as f64, THREADS_N)
        }
    }
}

// ---- W8 cpu-parallel ----

fn w8_input() -> Arc<Vec<u8>> {
    const WORDS: [&str; 16] = [
        "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo", "lima",
        "mike", "november", "oscar", "papa",
    ];
    let mut buf = Vec::with_capacity(W8_LEN + 32);
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    while buf.len() < W8_LEN {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let r = x >> 33;
        buf.extend_from_slice(WORDS[(r & 15) as usize].as_bytes());
        if (r >> 4) & 7 == 0 {
            buf.extend_from_slice(((r >> 7) % 10000).to_string().as_bytes());
        }
        buf.push(if (r >> 20) & 15 == 0 { b'\n' } else { b' ' });
    }
    buf.truncate(W8_LEN);
    let mut h: u64 = 0xcbf29ce484222325;
    for &b in &buf {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    check(h == 0x821c05d5ef1e7ac8, || format!("w8 input FNV-1a {h:#x}"));
    Arc::new(buf)
}

fn deflate(block: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::new(6));
    e.write_all(block).unwrap();
    e.finish().unwrap()
}

fn w8_check(input: &[u8], blocks: &[Vec<u8>]) {
    use std::io::Read;
    let mut out = Vec::with_capacity(input.len());
    for b in blocks {
        flate2::read::DeflateDecoder::new(&b[..]).read_to_end(&mut out).unwrap();
    }
    check(out == input, || "w8 round trip".to_string());
}

fn block(input: &[u8], i: usize) -> &[u8] {
    &input[i * W8_BLOCK..((i + 1) * W8_BLOCK).min(input.len())]
}

fn w8(system: &str) -> Duration {
    let input = w8_input();
    let n = input.len().div_ceil(W8_BLOCK);
    let (elapsed, blocks) = match system {
        "fiber" => {
            let input = input.clone();
            fiber_rt().block_on(move || {
                let run = |input: &Arc<Vec<u8>>| -> Vec<Vec<u8>> {
                    let handles: Vec<_> = (0..n)
                        .map(|i| {
                            let input = input.clone();
                            fiber::spawn(move || deflate(block(&input, i)))
                        })
                        .collect();
                    handles.into_iter().map(|h| h.join().unwrap()).collect()
                };
                if warmup_on() {
                    black_box(run(&input));
                }
                let start = Instant::now();
                let blocks = run(&input);
                (start.elapsed(), blocks)
            })
        }
        "tokio" => {
            let input = input.clone();
            tokio_rt().block_on(async move {
                tokio::spawn(async move {
                    async fn run(input: &Arc<Vec<u8>>, n: usize) -> Vec<Vec<u8>> {
                        let handles: Vec<_> = (0..n)
                            .map(|i| {
                                let input = input.clone();
                                tokio::task::spawn_blocking(move || deflate(block(&input, i)))
                            })
                            .collect();
                        let mut out = Vec::with_capacity(n);
                        for h in handles {
                            out.push(h.await.unwrap());
                        }
                        out
                    }
                    if warmup_on() {
                        black_box(run(&input, n).await);
                    }
                    let start = Instant::now();
                    let blocks = run(&input, n).await;
                    (start.elapsed(), blocks)
                })
                .await
                .unwrap()
            })
        }
        _ => {
            let run = |input: &Arc<Vec<u8>>| -> Vec<Vec<u8>> {
                let (work_tx, work_rx) = crossbeam_channel::unbounded::<usize>();
                let (out_tx, out_rx) = crossbeam_channel::unbounded::<(usize, Vec<u8>)>();
                let pool: Vec<_> = (0..cores())
                    .map(|_| {
                        let (work_rx, out_tx, input) = (work_rx.clone(), out_tx.clone(), input.clone());
                        std::thread::spawn(move || {
                            for i in work_rx.iter() {
                                out_tx.send((i, deflate(block(&input, i)))).unwrap();
                            }
                        })
                    })
                    .collect();
                for i in 0..n {
                    work_tx.send(i).unwrap();
                }
                drop(work_tx);
                drop(out_tx);
                let mut out = vec![Vec::new(); n];
                for (i, b) in out_rx.iter() {
                    out[i] = b;
                }
                for t in pool {
                    t.join().unwrap();
                }
                out
            };
            if warmup_on() {
                black_box(run(&input));
            }
            let start = Instant::now();
            let blocks = run(&input);
            (start.elapsed(), blocks)
        }
    };
    w8_check(&input, &blocks);
    elapsed
}

// ---- micro: select, jobs, switch floor ----

fn select_fiber(k: usize) -> Duration {
    on_fiber_dyn(move || {
        let chans: Vec<_> = (0..k).map(|_| fiber::chan::bounded::<u64>(1)).collect();
        let mut got = 0u64;
        for i in 0..MICRO_OPS {
            chans[i % k].0.send(i as u64).unwrap();
            let mut sel = fiber::chan::Select::new();
            for (_, rx) in &chans {
                sel.recv(rx);
            }
            let oper = sel.select();
            let index = oper.index();
            got += oper.recv(&chans[index].1).unwrap();
        }
        check(got == (MICRO_OPS as u64) * (MICRO_OPS as u64 - 1) / 2, || {
            "select sum".to_string()
        });
    })
}

fn select_tokio(k: usize) -> Duration {
    let rt = tokio_rt();
    rt.block_on(async move {
        tokio::spawn(async move {
            let mut chans: Vec<_> = (0..k).map(|_| tokio::sync::mpsc::channel::<u64>(1)).collect();
            let start = Instant::now();
            let mut got = 0u64;
            for i in 0..MICRO_OPS {
                chans[i % k].0.send(i as u64).await.unwrap();
                // tokio::select! needs a fixed arm count; poll the receivers
                // in turn, which is what a select over k ready channels costs.
                let mut found = None;
                for (_, rx) in chans.iter_mut() {
                    if let Ok(v) = rx.try_recv() {
                        found = Some(v);
                        break;
                    }
                }
                got += found.expect("one channel is ready");
            }
            check(got == (MICRO_OPS as u64) * (MICRO_OPS as u64 - 1) / 2, || {
                "select sum".to_string()
            });
            start.elapsed()
        })
        .await
        .unwrap()
    })
}

fn select_threads(k: usize) -> Duration {
    let chans: Vec<_> = (0..k).map(|_| crossbeam_channel::bounded::<u64>(1)).collect();
    let start = Instant::now();
    let mut got = 0u64;
    for i in 0..MICRO_OPS {
        chans[i % k].0.send(i as u64).unwrap();
        let mut sel = crossbeam_channel::Select::new();
        for (_, rx) in &chans {
            sel.recv(rx);
        }
        let oper = sel.select();
        let index = oper.index();
        got += oper.recv(&chans[index].1).unwrap();
    }
    check(got == (MICRO_OPS as u64) * (MICRO_OPS as u64 - 1) / 2, || {
        "select sum".to_string()
    });
    start.elapsed()
}

fn on_fiber_dyn(body: impl FnOnce() + Send + 'static) -> Duration {
    fiber_rt().block_on(move || {
        let start = Instant::now();
        body();
        start.elapsed()
    })
}

fn job_create_fiber() -> Duration {
    on_fiber_dyn(|| {
        fiber::scope(|s| {
            let mut n = 0;
            for _ in 0..MICRO_OPS {
                n += s.spawn(|| 1usize).join().unwrap();
            }
            check(n == MICRO_OPS, || "job create".to_string());
        })
    })
}

fn job_create_tokio() -> Duration {
    let rt = tokio_rt();
    rt.block_on(async {
        tokio::spawn(async {
            let token = tokio_util::sync::CancellationToken::new();
            let start = Instant::now();
            let mut n = 0;
            for _ in 0..MICRO_OPS {
                let mut set = tokio::task::JoinSet::new();
                let child = token.child_token();
                set.spawn(async move {
                    let _ = &child;
                    1usize
                });
                n += set.join_next().await.unwrap().unwrap();
            }
            check(n == MICRO_OPS, || "job create".to_string());
            start.elapsed()
        })
        .await
        .unwrap()
    })
}

fn join_finished_fiber() -> Duration {
    on_fiber_dyn(|| {
        fiber::scope(|s| {
            let handles: Vec<_> = (0..MICRO_OPS).map(|i| s.spawn(move || i)).collect();
            // Every child has finished before the clock starts (the last
            // one spawned runs first, from the runnext slot, so checking it
            // alone would time joins that still park).
            while !handles.iter().all(|h| h.is_finished()) {
                let _ = fiber::yield_now();
            }
            let start = Instant::now();
            let sum: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
            let elapsed = start.elapsed();
            check(sum == MICRO_OPS * (MICRO_OPS - 1) / 2, || "join sum".to_string());
            JOIN_ELAPSED.store(elapsed.as_nanos() as usize, Ordering::Relaxed);
        })
    });
    Duration::from_nanos(JOIN_ELAPSED.load(Ordering::Relaxed) as u64)
}

static JOIN_ELAPSED: AtomicUsize = AtomicUsize::new(0);

fn join_finished_tokio() -> Duration {
    let rt = tokio_rt();
    rt.block_on(async {
        tokio::spawn(async {
            let handles: Vec<_> = (0..MICRO_OPS).map(|i| tokio::spawn(async move { i })).collect();
            tokio::time::sleep(Duration::from_millis(50)).await;
            let start = Instant::now();
            let mut sum = 0;
            for h in handles {
                sum += h.await.unwrap();
            }
            check(sum == MICRO_OPS * (MICRO_OPS - 1) / 2, || "join sum".to_string());
            start.elapsed()
        })
        .await
        .unwrap()
    })
}

/// Scope with 1,000 children (spawn all, scope waits), and cancel of a
/// 1,000-child tree (all parked, cancel, scope returns).
const TREE: usize = 1000;
const TREE_ROUNDS: usize = 20;

fn scope1k_fiber() -> Duration {
    on_fiber_dyn(|| {
        for _ in 0..TREE_ROUNDS {
            fiber::scope(|s| {
                for i in 0..TREE {
                    s.spawn(move || black_box(i));
                }
            });
        }
    })
}

fn scope1k_tokio() -> Duration {
    tokio_rt().block_on(async {
        tokio::spawn(async {
            let start = Instant::now();
            for _ in 0..TREE_ROUNDS {
                let mut set = tokio::task::JoinSet::new();
                for i in 0..TREE {
                    set.spawn(async move { black_box(i) });
                }
                while set.join_next().await.is_some() {}
            }
            start.elapsed()
        })
        .await
        .unwrap()
    })
}

fn cancel1k_fiber() -> Duration {
    on_fiber_dyn(|| {
        for _ in 0..TREE_ROUNDS {
            let cancelled = fiber::scope(|s| {
                let (_tx, rx) = fiber::chan::bounded::<()>(0);
                for _ in 0..TREE {
                    let rx = rx.clone();
                    s.spawn(move || rx.recv().is_err());
                }
                let _ = fiber::yield_now();
                s.job().cancel();
                s.job()
            });
            check(cancelled.state() == fiber::JobState::Cancelled, || {
                "cancel1k".to_string()
            });
        }
    })
}

fn cancel1k_tokio() -> Duration {
    tokio_rt().block_on(async {
        tokio::spawn(async {
            let start = Instant::now();
            for _ in 0..TREE_ROUNDS {
                let token = tokio_util::sync::CancellationToken::new();
                let mut set = tokio::task::JoinSet::new();
                for _ in 0..TREE {
                    let child = token.child_token();
                    set.spawn(async move { child.cancelled().await });
                }
                tokio::task::yield_now().await;
                token.cancel();
                while set.join_next().await.is_some() {}
            }
            start.elapsed()
        })
        .await
        .unwrap()
    })
}

fn switch_floor() -> Duration {
    let mut co = corosensei::Coroutine::new(|y: &corosensei::Yielder<(), ()>, ()| loop {
        y.suspend(());
    });
    let start = Instant::now();
    for _ in 0..MICRO_OPS * 10 {
        black_box(co.resume(()));
    }
    start.elapsed()
}

fn per(d: Duration, n: u64) -> f64 {
    d.as_nanos() as f64 / n as f64
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let (Some(workload), Some(system)) = (args.first(), args.get(1)) else {
        eprintln!("usage: workloads <w1|w2|w3|w4|w5|w6|w7|w8|select2|select8|job_create|join_finished|switch> <fiber|tokio|threads>");
        std::process::exit(2);
    };
    let system = system.as_str();
    let skip = |why: &str| {
        println!("SKIP {workload} {system} {why}");
        std::process::exit(0);
    };
    let (value, unit, detail) = match (workload.as_str(), system) {
        (w, sys) if w.starts_with("sync_") => sync_rows::run(w, sys),
        ("w1", "fiber") => (per(on_fiber(w1_fiber), W1_N as u64), "ns/task", format!("n={W1_N}")),
        ("w1", "tokio") => (per(on_tokio(w1_tokio), W1_N as u64), "ns/task", format!("n={W1_N}")),
        ("w1", _) => (
            per(on_thread(w1_threads), THREADS_N as u64),
            "ns/task",
            format!("n={THREADS_N}"),
        ),
        ("w2", "fiber") => (on_fiber(w2_fiber).as_secs_f64() * 1e3, "ms", "1,111,111 tasks".into()),
        ("w2", "tokio") => (on_tokio(w2_tokio).as_secs_f64() * 1e3, "ms", "1,111,111 tasks".into()),
        ("w2", _) => skip("1.1M OS threads do not fit (pid_max, map count)"),
        ("w3", "fiber") => (per(on_fiber(w3_fiber), W3_ROUNDS), "ns/rt", "bounded(0)".into()),
        ("w3", "tokio") => (per(on_tokio(w3_tokio), W3_ROUNDS), "ns/rt", "mpsc(1)".into()),
        ("w3", _) => (
            per(on_thread(w3_threads), W3_ROUNDS_THREADS),
            "ns/rt",
            format!("n={W3_ROUNDS_THREADS}"),
        ),
        ("w4", "fiber") => (
            W4_TOTAL as f64 / on_fiber(w4_fiber).as_secs_f64() / 1e6,
            "Mmsg/s",
            "bounded(1024)".into(),
        ),
        ("w4", "tokio") => (
            W4_TOTAL as f64 / on_tokio(w4_tokio).as_secs_f64() / 1e6,
            "Mmsg/s",
            "mpsc+Mutex".into(),
        ),
        ("w4", _) => (
            W4_TOTAL as f64 / on_thread(w4_threads).as_secs_f64() / 1e6,
            "Mmsg/s",
            "crossbeam".into(),
        ),
        ("w5", "fiber") => (
            per(on_fiber(w5_fiber), (W5_TASKS * W5_YIELDS) as u64),
            "ns/yield",
            String::new(),
        ),
        ("w5", "tokio") => (
            per(on_tokio(w5_tokio), (W5_TASKS * W5_YIELDS) as u64),
            "ns/yield",
            String::new(),
        ),
        ("w5", _) => (
            per(on_thread(w5_threads), (W5_TASKS * W5_YIELDS) as u64),
            "ns/yield",
            "1000 threads".into(),
        ),
        ("w6", "fiber") => (on_fiber(w6_fiber).as_secs_f64() * 1e3, "ms", format!("n={W6_N}")),
        ("w6", "tokio") => (on_tokio(w6_tokio).as_secs_f64() * 1e3, "ms", format!("n={W6_N}")),
        ("w6", _) => skip("a pool cannot host 100,000 blocking sleepers"),
        ("w7", sys) => {
            let (kib, n) = w7(sys);
            (kib, "KiB/task", format!("n={n}"))
        }
        ("w8", sys) => (W8_LEN as f64 / w8(sys).as_secs_f64() / 1e6, "MB/s", "512 blocks".into()),
        ("select2", "fiber") => (per(select_fiber(2), MICRO_OPS as u64), "ns/op", String::new()),
        ("select8", "fiber") => (per(select_fiber(8), MICRO_OPS as u64), "ns/op", String::new()),
        ("select2", "tokio") => (per(select_tokio(2), MICRO_OPS as u64), "ns/op", "try_recv scan".into()),
        ("select8", "tokio") => (per(select_tokio(8), MICRO_OPS as u64), "ns/op", "try_recv scan".into()),
        ("select2", _) => (per(select_threads(2), MICRO_OPS as u64), "ns/op", "crossbeam".into()),
        ("select8", _) => (per(select_threads(8), MICRO_OPS as u64), "ns/op", "crossbeam".into()),
        ("job_create", "fiber") => (per(job_create_fiber(), MICRO_OPS as u64), "ns/job", "spawn+join".into()),
        ("job_create", "tokio") => (
            per(job_create_tokio(), MICRO_OPS as u64),
            "ns/job",
            "JoinSet+token".into(),
        ),
        ("job_create", _) => skip("no job tree on plain threads"),
        ("join_finished", "fiber") => (per(join_finished_fiber(), MICRO_OPS as u64), "ns/join", String::new()),
        ("join_finished", "tokio") => (per(join_finished_tokio(), MICRO_OPS as u64), "ns/join", String::new()),
        ("join_finished", _) => skip("std thread joins are not comparable"),
        ("scope1k", "fiber") => (
            scope1k_fiber().as_secs_f64() * 1e6 / TREE_ROUNDS as f64,
            "us",
            "1,000 children".into(),
        ),
        ("scope1k", "tokio") => (
            scope1k_tokio().as_secs_f64() * 1e6 / TREE_ROUNDS as f64,
            "us",
            "JoinSet".into(),
        ),
        ("scope1k", _) => skip("no scopes of 1,000 threads here"),
        ("cancel1k", "fiber") => (
            cancel1k_fiber().as_secs_f64() * 1e6 / TREE_ROUNDS as f64,
            "us",
            "1,000 parked".into(),
        ),
        ("cancel1k", "tokio") => (
            cancel1k_tokio().as_secs_f64() * 1e6 / TREE_ROUNDS as f64,
            "us",
            "JoinSet+token".into(),
        ),
        ("cancel1k", _) => skip("threads cannot be cancelled"),
        ("switch", "fiber") => (
            per(switch_floor(), (MICRO_OPS * 10) as u64),
            "ns/switch",
            "bare corosensei".into(),
        ),
        ("switch", _) => skip("the floor is measured once"),
        _ => {
            eprintln!("unknown workload {workload}");
            std::process::exit(2);
        }
    };
    println!("RESULT {workload} {system} {value:.3} {unit} {detail}");
}
