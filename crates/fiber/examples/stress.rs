//! Randomized stress: spawn, yield, sleep, every kind of channel operation,
//! select (send and receive arms on shared channels, timers, closes and
//! cancels, fibers and threads mixed), scopes, cancellation and timeouts, in rounds, checking after each
//! round that no value was lost or duplicated, that every fiber finished
//! exactly once, that the live-fiber count is back to its baseline, and that
//! memory does not grow across rounds.
//!
//! `cargo xtask stress [--seconds N] [--seed S]` (runs this with the
//! `spec-assert` checks on). The seed is printed; `--seed` replays the same
//! mix (thread timing still varies).

use fiber::chan::{self, after, bounded, unbounded, Receiver, Sender};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
    fn fork(&mut self) -> Rng {
        Rng(self.next() | 1)
    }
}

#[derive(Default)]
struct Ledger {
    sent: Vec<u64>,
    received: Vec<u64>,
    returned: usize,
}

#[derive(Default)]
struct Totals {
    fibers: AtomicUsize,
    finished: AtomicUsize,
    messages: AtomicU64,
    cancellations: AtomicU64,
    timeouts: AtomicU64,
}

/// Counts a fiber as finished when dropped (also when it unwinds).
struct Finish(Arc<Totals>);

impl Drop for Finish {
    fn drop(&mut self) {
        self.0.finished.fetch_add(1, Ordering::Relaxed);
    }
}

fn go<T: Send + 'static>(totals: &Arc<Totals>, f: impl FnOnce() -> T + Send + 'static) -> fiber::JoinHandle<T> {
    totals.fibers.fetch_add(1, Ordering::Relaxed);
    let guard = Finish(totals.clone());
    fiber::spawn(move || {
        let _guard = guard;
        f()
    })
}

fn produce(mut rng: Rng, tx: Sender<u64>, first: u64, count: u64, ledger: Arc<Mutex<Ledger>>) {
    for v in first..first + count {
        let outcome = match rng.below(5) {
            0 => tx.send(v).map_err(|e| e.into_inner()),
            1 => tx
                .send_timeout(v, Duration::from_micros(rng.below(500)))
                .map_err(|e| e.into_inner()),
            2 => tx.try_send(v).map_err(|e| e.into_inner()),
            3 => chan::select! {
                send(tx, v) -> res => res.map_err(|e| e.into_inner()),
                default(Duration::from_micros(rng.below(500))) => Err(v),
            },
            _ => {
                let _ = fiber::yield_now();
                tx.send(v).map_err(|e| e.into_inner())
            }
        };
        let mut l = ledger.lock().unwrap();
        match outcome {
            Ok(()) => l.sent.push(v),
            Err(back) => {
                assert_eq!(back, v, "an unsent value comes back in the error");
                l.returned += 1;
            }
        }
    }
}

fn consume(mut rng: Rng, rx: Receiver<u64>, ledger: Arc<Mutex<Ledger>>) {
    let tick = after(Duration::from_millis(1 + rng.below(5)));
    loop {
        let got = match rng.below(5) {
            0 => rx.recv().map_err(|_| true),
            1 => rx
                .recv_timeout(Duration::from_micros(rng.below(800)))
                .map_err(|e| e.is_disconnected()),
            2 => rx.try_recv().map_err(|e| e.is_disconnected()),
            3 => chan::select! {
                recv(rx) -> v => v.map_err(|_| true),
                recv(tick) -> _ => Err(false),
            },
            _ => {
                if rng.below(4) == 0 {
                    let _ = fiber::sleep(Duration::from_micros(rng.below(300)));
                }
                rx.recv_timeout(Duration::from_millis(2))
                    .map_err(|e| e.is_disconnected())
            }
        };
        match got {
            Ok(v) => ledger.lock().unwrap().received.push(v),
            Err(true) => return,
            Err(false) => {
                if fiber::is_cancelled() {
                    return;
                }
                let _ = fiber::yield_now();
            }
        }
    }
}

fn round(seed: u64, totals: Arc<Totals>) {
    let mut rng = Rng(seed | 1);
    let (tx, rx) = match rng.below(4) {
        0 => bounded(0),
        1 => bounded(1),
        2 => bounded(64),
        _ => unbounded(),
    };
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let producers: Vec<_> = (0..2 + rng.below(4))
        .map(|p| {
            let (tx, ledger, r) = (tx.clone(), ledger.clone(), rng.fork());
            let count = 50 + r.0 % 300;
            go(&totals, move || produce(r, tx, p * 1_000_000, count, ledger))
        })
        .collect();
    drop(tx);
    // Steady consumers: they drain until the channel disconnects.
    let consumers: Vec<_> = (0..1 + rng.below(3))
        .map(|_| {
            let (rx, ledger, r) = (rx.clone(), ledger.clone(), rng.fork());
            go(&totals, move || consume(r, rx, ledger))
        })
        .collect();
    // Consumers in a scope that gets cancelled, and one under a timeout.
    let (rx2, ledger2, mut r2, t2) = (rx.clone(), ledger.clone(), rng.fork(), totals.clone());
    let scoped = go(&totals, move || {
        fiber::scope(|s| {
            for _ in 0..2 {
                let (rx, ledger, r) = (rx2.clone(), ledger2.clone(), r2.fork());
                s.spawn(move || consume(r, rx, ledger));
            }
            for _ in 0..r2.below(20) {
                let _ = fiber::yield_now();
            }
            s.job().cancel();
            t2.cancellations.fetch_add(1, Ordering::Relaxed);
        });
        let (rx, ledger, r) = (rx2.clone(), ledger2.clone(), r2.fork());
        let timed = fiber::with_timeout(Duration::from_millis(1 + r2.below(5)), move || consume(r, rx, ledger));
        if timed.is_err() {
            t2.timeouts.fetch_add(1, Ordering::Relaxed);
        }
    });
    // A fiber that is cancelled while parked, through its handle.
    let parked = {
        let (_keep, never) = bounded::<u64>(0);
        let h = go(&totals, move || {
            let _keep = _keep;
            never.recv()
        });
        let _ = fiber::sleep(Duration::from_micros(200));
        h.cancel();
        totals.cancellations.fetch_add(1, Ordering::Relaxed);
        h
    };
    for p in producers {
        p.join().expect("producers do not fail");
    }
    for c in consumers {
        c.join().expect("consumers do not fail");
    }
    scoped.join().expect("the scoped consumers end");
    let _ = parked.join();
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
        "seed {seed}: values received but never sent Ok: {counts:?}"
    );
    totals.messages.fetch_add(l.sent.len() as u64, Ordering::Relaxed);
}

/// Counts guards made and dropped: each must drop exactly once.
#[derive(Default)]
struct Guards {
    made: AtomicUsize,
    dropped: AtomicUsize,
}

struct Guard<'a> {
    guards: Arc<Guards>,
    borrowed: Option<&'a [u64]>,
    on_drop: DropKind,
}

#[derive(Clone)]
enum DropKind {
    Quiet,
    /// Blocks on a rendezvous send (cancelled at shutdown).
    Sends(Sender<u64>),
    /// Panics (the fiber returns normally when cancelled, so this is a
    /// plain panic caught at the fiber boundary).
    Panics,
}

impl<'a> Guard<'a> {
    fn new(guards: &Arc<Guards>, borrowed: Option<&'a [u64]>, on_drop: DropKind) -> Self {
        guards.made.fetch_add(1, Ordering::Relaxed);
        Guard {
            guards: guards.clone(),
            borrowed,
            on_drop,
        }
    }
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        if let Some(b) = self.borrowed {
            // The borrow must still be valid: its owner outlives us.
            assert_eq!(b.iter().sum::<u64>(), 6, "a borrowed local was corrupted");
        }
        self.guards.dropped.fetch_add(1, Ordering::Relaxed);
        match &self.on_drop {
            DropKind::Quiet => {}
            DropKind::Sends(tx) => {
                let _ = tx.send(1);
            }
            DropKind::Panics => {
                if !std::thread::panicking() {
                    panic!("a guard's destructor panics");
                }
            }
        }
    }
}

/// A runtime built and dropped while fibers are parked in scopes, selects,
/// joins and sleeps, with destructors that borrow, block and panic: every
/// guard must drop exactly once, and nothing may abort.
fn shutdown_round(seed: u64) {
    let mut rng = Rng(seed | 1);
    let guards = Arc::new(Guards::default());
    let runtime = fiber::Runtime::builder()
        .workers(2)
        .max_workers(3)
        .shutdown_timeout(Duration::from_millis(50))
        .build()
        .expect("runtime");
    let g = guards.clone();
    let fibers = 8 + rng.below(24);
    let mut kinds = rng.fork();
    let keep = runtime.block_on(move || {
        let (keep_tx, keep_rx) = bounded::<u64>(0);
        let (drain_tx, _drain_rx) = bounded::<u64>(0);
        for _ in 0..fibers {
            let (g, rx, drain) = (g.clone(), keep_rx.clone(), drain_tx.clone());
            let on_drop = match kinds.below(3) {
                0 => DropKind::Quiet,
                1 => DropKind::Sends(drain),
                _ => DropKind::Panics,
            };
            match kinds.below(5) {
                0 => drop(fiber::spawn(move || {
                    let local = vec![1u64, 2, 3];
                    fiber::scope(|s| {
                        let (local, g, child_rx) = (&local, g.clone(), rx.clone());
                        s.spawn(move || {
                            let _guard = Guard::new(&g, Some(local), on_drop);
                            let _ = child_rx.recv();
                        });
                        let _ = rx.recv();
                    });
                })),
                1 => drop(fiber::spawn(move || {
                    let _guard = Guard::new(&g, None, on_drop);
                    let (_t, other) = bounded::<u64>(1);
                    fiber::select! {
                        recv(rx) -> _ => {},
                        recv(other) -> _ => {},
                    }
                })),
                2 => drop(fiber::spawn(move || {
                    let _guard = Guard::new(&g, None, on_drop.clone());
                    let g2 = g.clone();
                    let inner = fiber::spawn(move || {
                        let _guard = Guard::new(&g2, None, on_drop);
                        let _ = rx.recv();
                    });
                    let _ = inner.join();
                })),
                3 => drop(fiber::spawn(move || {
                    let _guard = Guard::new(&g, None, on_drop);
                    let _ = fiber::sleep(Duration::from_secs(3600));
                })),
                _ => drop(fiber::spawn(move || {
                    // Ignores cancellation: only teardown's unwind ends it,
                    // so its destructor must not panic.
                    let _guard = Guard::new(&g, None, DropKind::Quiet);
                    loop {
                        if rx.recv().is_ok() {
                            break;
                        }
                    }
                })),
            }
        }
        for _ in 0..4 {
            let _ = fiber::yield_now();
        }
        // Kept open until the runtime is gone, so the fibers stay parked.
        keep_tx
    });
    drop(runtime);
    drop(keep);
    let (made, dropped) = (
        guards.made.load(Ordering::Relaxed),
        guards.dropped.load(Ordering::Relaxed),
    );
    assert_eq!(
        made, dropped,
        "shutdown round (seed {seed}): every destructor runs exactly once"
    );
}

/// Select stress: parties on fibers and threads select over send and
/// receive arms of shared channels (rendezvous, buffered, unbounded), timer
/// arms and defaults, while channels get closed and fibers cancelled. Every
/// value a send arm evaluated is either received exactly once (sent Ok) or
/// came back in its error; nothing else is ever received.
fn select_round(seed: u64, totals: Arc<Totals>) {
    let mut rng = Rng(seed | 1);
    let chans: Arc<Vec<(Sender<u64>, Receiver<u64>)>> = Arc::new(vec![bounded(0), bounded(1), unbounded()]);
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let evaluated = Arc::new(AtomicU64::new(0));
    let party = move |id: u64,
                      mut rng: Rng,
                      chans: Arc<Vec<(Sender<u64>, Receiver<u64>)>>,
                      ledger: Arc<Mutex<Ledger>>,
                      evaluated: Arc<AtomicU64>| {
        let mut next = id << 32;
        let tick = chan::tick(Duration::from_micros(50 + rng.below(300)));
        for _ in 0..100 + rng.below(200) {
            let (a, b) = (rng.below(3) as usize, rng.below(3) as usize);
            let (tx, rx) = (&chans[a].0, &chans[b].1);
            let mut value = || {
                next += 1;
                evaluated.fetch_add(1, Ordering::Relaxed);
                next
            };
            let wait = Duration::from_micros(rng.below(400));
            // (sent, received): what this select did.
            let (sent, got): (Option<Result<u64, u64>>, Option<u64>) = match rng.below(4) {
                0 => chan::select! {
                    send(tx, value()) -> res => (Some(res.map(|()| next).map_err(|e| e.into_inner())), None),
                    recv(rx) -> m => (None, m.ok()),
                    default(wait) => (None, None),
                },
                1 => chan::select! {
                    recv(tick) -> _ => (None, None),
                    send(tx, value()) -> res => (Some(res.map(|()| next).map_err(|e| e.into_inner())), None),
                    recv(rx) -> m => (None, m.ok()),
                },
                2 => chan::select_biased! {
                    recv(rx) -> m => (None, m.ok()),
                    recv(chan::after(wait)) -> _ => (None, None),
                },
                _ => chan::select! {
                    send(tx, value()) -> res => (Some(res.map(|()| next).map_err(|e| e.into_inner())), None),
                    default => (None, None),
                },
            };
            let mut l = ledger.lock().unwrap();
            match sent {
                Some(Ok(v)) => l.sent.push(v),
                Some(Err(_)) => l.returned += 1,
                None => {}
            }
            if let Some(v) = got {
                l.received.push(v);
            }
            drop(l);
            if rng.below(50) == 0 {
                chans[rng.below(3) as usize].0.close();
            }
        }
    };
    let mut fibers = Vec::new();
    let mut threads = Vec::new();
    for id in 1..=2 + rng.below(4) {
        let (c, l, e, r) = (chans.clone(), ledger.clone(), evaluated.clone(), rng.fork());
        if rng.below(3) == 0 {
            threads.push(std::thread::spawn(move || party(id, r, c, l, e)));
        } else {
            fibers.push(go(&totals, move || party(id, r, c, l, e)));
        }
    }
    // Cancel some fibers part-way: their selects end, nothing is lost.
    let _ = chan::after(Duration::from_micros(rng.below(2000))).recv();
    for (i, f) in fibers.iter().enumerate() {
        if rng.below(3) == 0 && i > 0 {
            f.cancel();
            totals.cancellations.fetch_add(1, Ordering::Relaxed);
        }
    }
    for f in fibers {
        let _ = f.join();
    }
    for t in threads {
        t.join().expect("select parties do not fail");
    }
    let mut l = ledger.lock().unwrap();
    for (_, rx) in chans.iter() {
        let leftover: Vec<u64> = rx.try_iter().collect();
        l.received.extend(leftover);
    }
    assert_eq!(
        (l.sent.len() + l.returned) as u64,
        evaluated.load(Ordering::Relaxed),
        "seed {seed}: every evaluated send value was sent or returned"
    );
    let mut counts: HashMap<u64, u32> = HashMap::new();
    for v in &l.received {
        *counts.entry(*v).or_default() += 1;
    }
    for v in &l.sent {
        assert_eq!(
            counts.remove(v),
            Some(1),
            "seed {seed}: value {v} sent Ok by a select must be received exactly once"
        );
    }
    assert!(counts.is_empty(), "seed {seed}: received but never sent Ok: {counts:?}");
    totals.messages.fetch_add(l.sent.len() as u64, Ordering::Relaxed);
}

fn vm_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with(field)).map(String::from))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let seconds: u64 = value("--seconds")
        .map(|s| s.parse().expect("--seconds N"))
        .unwrap_or(20);
    let seed: u64 = value("--seed")
        .map(|s| s.parse().expect("--seed S"))
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    println!("stress: seed {seed} (replay with --seed {seed}), {seconds} s");
    // The shutdown rounds' guards panic on purpose: keep their messages out
    // of the output, report every other panic as usual.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if info.payload().downcast_ref::<&str>() != Some(&"a guard's destructor panics") {
            default_hook(info);
        }
    }));
    let runtime = fiber::Runtime::builder().build().expect("runtime");
    let totals = Arc::new(Totals::default());
    let start = Instant::now();
    let mut rng = Rng(seed | 1);
    let mut rounds = 0u64;
    let mut shutdown_rounds = 0u64;
    let mut rss_after_first = 0;
    let baseline = runtime.stats().fibers_alive;
    let mut last_progress = Instant::now();
    while start.elapsed() < Duration::from_secs(seconds) {
        if last_progress.elapsed() >= Duration::from_secs(10) {
            last_progress = Instant::now();
            println!(
                "stress: {:.0} s: {rounds} rounds ({shutdown_rounds} shutdown rounds), {} fibers run, {} values \
                 checked, {} cancellations, {} timeouts, {} fibers alive",
                start.elapsed().as_secs_f64(),
                totals.fibers.load(Ordering::Relaxed),
                totals.messages.load(Ordering::Relaxed),
                totals.cancellations.load(Ordering::Relaxed),
                totals.timeouts.load(Ordering::Relaxed),
                runtime.stats().fibers_alive
            );
        }
        let round_seed = rng.next();
        let t = totals.clone();
        runtime.block_on(move || {
            round(round_seed, t.clone());
            select_round(round_seed ^ 0x005E_1EC7, t);
        });
        rounds += 1;
        // Every fiber of the round has finished: the live count returns.
        let deadline = Instant::now() + Duration::from_secs(5);
        while runtime.stats().fibers_alive > baseline && Instant::now() < deadline {
            std::thread::yield_now();
        }
        let alive = runtime.stats().fibers_alive;
        assert_eq!(
            alive, baseline,
            "round {rounds} (seed {round_seed}): live fibers {alive}, baseline {baseline}"
        );
        let fibers = totals.fibers.load(Ordering::Relaxed);
        let finished = totals.finished.load(Ordering::Relaxed);
        assert_eq!(fibers, finished, "round {rounds}: every fiber finishes exactly once");
        if rounds % 8 == 0 {
            shutdown_round(rng.next());
            shutdown_rounds += 1;
        }
        let rss = vm_kib("VmRSS:");
        if rounds == 3 {
            rss_after_first = rss;
        }
        if rounds > 3 {
            assert!(
                rss <= rss_after_first * 2 + 64 * 1024,
                "round {rounds}: memory grew from {rss_after_first} KiB to {rss} KiB"
            );
        }
    }
    let stats = runtime.stats();
    drop(runtime);
    println!(
        "stress: ok: {rounds} rounds ({shutdown_rounds} shutdown rounds) in {:.1} s; fibers {}, messages {}, \
         cancellations {}, timeouts {}, steals {}, peak RSS {} KiB",
        start.elapsed().as_secs_f64(),
        totals.fibers.load(Ordering::Relaxed),
        totals.messages.load(Ordering::Relaxed),
        totals.cancellations.load(Ordering::Relaxed),
        totals.timeouts.load(Ordering::Relaxed),
        stats.steals,
        vm_kib("VmHWM:")
    );
    println!("1 passed, 0 failed");
}
