//! Randomized no-loss test: producers and consumers (fibers and threads
//! mixed) on bounded(0), bounded(1), bounded(64) and unbounded channels, with
//! random timeouts, closes and cancellations. Every value sent with `Ok` is
//! received exactly once; every value not sent comes back in the error. The
//! seed is printed so a failure can be replayed (FIBER_CHAN_SEED=...).

mod common;
use fiber_chan::*;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[derive(Default)]
struct Ledger {
    sent: Vec<u64>,
    returned: Vec<u64>,
    received: Vec<u64>,
}

fn seed() -> u64 {
    std::env::var("FIBER_CHAN_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x1234_5678_9ABC_DEF1)
}

const PRODUCERS: u64 = 4;
const PER_PRODUCER: u64 = 2000;

fn scenario(cap: Option<usize>, seed: u64) {
    let (tx, rx) = match cap {
        Some(cap) => bounded::<u64>(cap),
        None => unbounded(),
    };
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let mut producers = Vec::new();
    for p in 0..PRODUCERS {
        let (tx, ledger) = (tx.clone(), ledger.clone());
        let mut rng = Rng(seed ^ (p + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let body = move || {
            for k in 0..PER_PRODUCER {
                let v = p * 1_000_000 + k;
                let outcome = match rng.below(4) {
                    0 => tx.send(v).map_err(|e| e.into_inner()),
                    1 => tx
                        .send_timeout(v, Duration::from_micros(rng.below(200)))
                        .map_err(|e| e.into_inner()),
                    2 => tx.try_send(v).map_err(|e| e.into_inner()),
                    _ => select! {
                        send(tx, v) -> res => res.map_err(|e| e.into_inner()),
                        default(Duration::from_micros(rng.below(200))) => Err(v),
                    },
                };
                let mut l = ledger.lock().unwrap();
                match outcome {
                    Ok(()) => l.sent.push(v),
                    Err(back) => {
                        assert_eq!(back, v, "the error returns the unsent value");
                        l.returned.push(v);
                    }
                }
            }
        };
        // Mix fibers and threads.
        producers.push(if p % 2 == 0 {
            common::go(body)
        } else {
            common::thread(body)
        });
    }
    drop(tx);
    let mut consumers = Vec::new();
    let mut cancellable = Vec::new();
    for c in 0..3u64 {
        let (rx, ledger) = (rx.clone(), ledger.clone());
        let mut rng = Rng(seed ^ (c + 17).wrapping_mul(0xD1B5_4A32_D192_ED03) | 1);
        let body = move || loop {
            let got = match rng.below(3) {
                0 => rx.recv().map_err(|_| true),
                1 => rx
                    .recv_timeout(Duration::from_micros(rng.below(300)))
                    .map_err(|e| e.is_disconnected()),
                _ => rx.try_recv().map_err(|e| e.is_disconnected()),
            };
            match got {
                Ok(v) => ledger.lock().unwrap().received.push(v),
                Err(true) => return,
                Err(false) => {
                    let _ = fiber_core::yield_now();
                }
            }
        };
        if c == 0 && fiber_core::in_fiber() {
            // A fiber that gets cancelled midway: it must lose nothing.
            cancellable.push(fiber_core::spawn(body));
        } else {
            consumers.push(if c % 2 == 0 {
                common::go(body)
            } else {
                common::thread(body)
            });
        }
    }
    for handle in &cancellable {
        let _ = fiber_core::yield_now();
        handle.cancel();
    }
    for p in producers {
        p.join();
    }
    for c in consumers {
        c.join();
    }
    for c in cancellable {
        let _ = c.join();
    }
    // Whatever is still buffered counts as received by the drain below.
    let leftover: Vec<u64> = rx.try_iter().collect();
    let mut l = ledger.lock().unwrap();
    l.received.extend(leftover);
    let mut counts: HashMap<u64, u32> = HashMap::new();
    for v in &l.received {
        *counts.entry(*v).or_default() += 1;
    }
    for v in &l.sent {
        assert_eq!(
            counts.remove(v),
            Some(1),
            "seed {seed}: value {v} sent Ok must be received exactly once"
        );
    }
    assert!(
        counts.is_empty(),
        "seed {seed}: received values that were never sent Ok: {counts:?}"
    );
    assert_eq!(l.sent.len() + l.returned.len(), (PRODUCERS * PER_PRODUCER) as usize);
}

#[test]
fn randomized_no_loss_on_every_capacity() {
    let base = seed();
    println!("FIBER_CHAN_SEED={base}");
    for (i, cap) in [Some(0), Some(1), Some(64), None].into_iter().enumerate() {
        let seed = base.wrapping_add(i as u64 * 7919);
        scenario(cap, seed);
        fiber_core::testing::TestScheduler::with_seed(seed).block_on(move || scenario(cap, seed));
        let rt = fiber_sched::Runtime::builder().workers(2).build().unwrap();
        rt.block_on(move || scenario(cap, seed));
    }
}

#[test]
fn randomized_close_while_busy_loses_nothing() {
    let base = seed();
    println!("FIBER_CHAN_SEED={base}");
    let rt = fiber_sched::Runtime::builder().workers(2).build().unwrap();
    for round in 0..5u64 {
        let seed = base ^ round;
        rt.block_on(move || {
            let (tx, rx) = bounded::<u64>((seed % 3) as usize);
            let sent = Arc::new(Mutex::new(Vec::new()));
            let producers: Vec<_> = (0..3u64)
                .map(|p| {
                    let (tx, sent) = (tx.clone(), sent.clone());
                    fiber_core::spawn(move || {
                        for k in 0..100 {
                            match tx.send(p * 1000 + k) {
                                Ok(()) => sent.lock().unwrap().push(p * 1000 + k),
                                Err(SendError(v)) => assert_eq!(v, p * 1000 + k),
                            }
                        }
                    })
                })
                .collect();
            let closer = {
                let tx = tx.clone();
                fiber_core::spawn(move || {
                    for _ in 0..(seed % 50) {
                        let _ = fiber_core::yield_now();
                    }
                    tx.close();
                })
            };
            drop(tx);
            let received: Vec<u64> = rx.iter().collect();
            closer.join().unwrap();
            for p in producers {
                p.join().unwrap();
            }
            let mut sent = sent.lock().unwrap().clone();
            let mut received = received;
            sent.sort();
            received.sort();
            assert_eq!(sent, received, "seed {seed}");
        });
    }
}
