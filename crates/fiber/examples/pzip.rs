//! Parallel DEFLATE: one fiber per 128 KiB block, output in block order,
//! then the same with a pool of std threads; prints MB/s for both and
//! round-trips the output.
//!
//! `cargo run --release --example pzip [FILE]` (default: 32 MiB of the
//! benchmark's generated text)

use flate2::read::DeflateDecoder;
use flate2::write::DeflateEncoder;
use flate2::Compression;
use std::io::{Read, Write};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Instant;

const BLOCK: usize = 128 * 1024;
const DEFAULT_SIZE: usize = 32 * 1024 * 1024;

/// The benchmark's deterministic text generator (BENCHMARKS.md, W8).
fn generate(len: usize) -> Vec<u8> {
    const WORDS: [&str; 16] = [
        "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo", "lima",
        "mike", "november", "oscar", "papa",
    ];
    let mut buf = Vec::with_capacity(len + 32);
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    while buf.len() < len {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let r = x >> 33;
        buf.extend_from_slice(WORDS[(r & 15) as usize].as_bytes());
        if (r >> 4) & 7 == 0 {
            buf.extend_from_slice(((r >> 7) % 10000).to_string().as_bytes());
        }
        buf.push(if (r >> 20) & 15 == 0 { b'\n' } else { b' ' });
    }
    buf.truncate(len);
    buf
}

fn compress(block: &[u8]) -> Vec<u8> {
    let mut encoder = DeflateEncoder::new(Vec::with_capacity(block.len() / 3), Compression::new(6));
    encoder.write_all(block).expect("writing to a Vec cannot fail");
    encoder.finish().expect("writing to a Vec cannot fail")
}

fn with_fibers(data: Arc<Vec<u8>>) -> Vec<Vec<u8>> {
    fiber::run(move || {
        let blocks = data.len().div_ceil(BLOCK);
        let handles: Vec<_> = (0..blocks)
            .map(|i| {
                let data = data.clone();
                fiber::spawn(move || compress(&data[i * BLOCK..((i + 1) * BLOCK).min(data.len())]))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn with_threads(data: Arc<Vec<u8>>) -> Vec<Vec<u8>> {
    let blocks = data.len().div_ceil(BLOCK);
    let (work_tx, work_rx) = mpsc::channel::<usize>();
    let work_rx = Arc::new(Mutex::new(work_rx));
    let (out_tx, out_rx) = mpsc::channel::<(usize, Vec<u8>)>();
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let pool: Vec<_> = (0..threads)
        .map(|_| {
            let (work_rx, out_tx, data) = (work_rx.clone(), out_tx.clone(), data.clone());
            std::thread::spawn(move || loop {
                let next = work_rx.lock().unwrap().recv();
                let Ok(i) = next else { break };
                out_tx
                    .send((i, compress(&data[i * BLOCK..((i + 1) * BLOCK).min(data.len())])))
                    .unwrap();
            })
        })
        .collect();
    for i in 0..blocks {
        work_tx.send(i).unwrap();
    }
    drop(work_tx);
    drop(out_tx);
    let mut out = vec![Vec::new(); blocks];
    for (i, block) in out_rx {
        out[i] = block;
    }
    for t in pool {
        t.join().unwrap();
    }
    out
}

fn main() {
    let data = match std::env::args().nth(1) {
        Some(path) => std::fs::read(&path).unwrap_or_else(|e| panic!("cannot read {path}: {e}")),
        None => generate(DEFAULT_SIZE),
    };
    let data = Arc::new(data);
    let mb = data.len() as f64 / 1e6;

    let start = Instant::now();
    let fibers = with_fibers(data.clone());
    let fiber_secs = start.elapsed().as_secs_f64();
    let start = Instant::now();
    let threads = with_threads(data.clone());
    let thread_secs = start.elapsed().as_secs_f64();

    let mut restored = Vec::with_capacity(data.len());
    for block in &fibers {
        DeflateDecoder::new(&block[..])
            .read_to_end(&mut restored)
            .expect("valid DEFLATE");
    }
    if restored != *data || fibers != threads {
        eprintln!("CHECK FAILED: the round trip does not give the input back");
        std::process::exit(1);
    }
    let compressed: usize = fibers.iter().map(Vec::len).sum();
    println!(
        "pzip: {:.1} MB in {} blocks -> {:.1} MB; fibers {:.1} MB/s, std thread pool {:.1} MB/s ({:.0}%); round trip ok",
        mb,
        fibers.len(),
        compressed as f64 / 1e6,
        mb / fiber_secs,
        mb / thread_secs,
        100.0 * thread_secs / fiber_secs
    );
}
