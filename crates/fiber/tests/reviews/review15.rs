//! Review 15 ("programs"): realistic small programs end to end, the kind a
//! Go, tokio or crossbeam user writes in their first week. Each program
//! checks its exact result (no item lost or duplicated, every destructor
//! run exactly once) and runs on a one-worker runtime, a two-worker
//! runtime and the default elastic runtime, under a watchdog.

use crate::common::{ms, rt1, rt2, within};
use fiber::chan::{self, bounded, never, tick, unbounded, Receiver, Sender};
use fiber::net::{TcpListener, TcpStream};
use fiber::sync::{Barrier, Condvar, Mutex, RwLock, Semaphore, WaitGroup};
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------
// Harness: one #[test] per runtime for each program.
// ---------------------------------------------------------------------------

#[derive(Clone, Copy)]
enum Rt {
    One,
    Two,
    Elastic,
}

fn run_on(rt: Rt, body: fn()) {
    within(60, move || {
        let runtime = match rt {
            Rt::One => rt1(),
            Rt::Two => rt2(),
            Rt::Elastic => fiber::Runtime::new().unwrap(),
        };
        runtime.block_on(body);
    })
}

macro_rules! programs {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn rt1() {
                super::run_on(super::Rt::One, super::$name)
            }
            #[test]
            fn rt2() {
                super::run_on(super::Rt::Two, super::$name)
            }
            #[test]
            fn elastic() {
                super::run_on(super::Rt::Elastic, super::$name)
            }
        }
    )*};
}

programs!(
    worker_pool_results_in_order,
    pipeline_cancelled_by_its_sink_drops_every_item_once,
    pipeline_cancelled_from_outside_drops_every_item_once,
    fan_in_with_select_timeout_arm,
    fan_in_with_select_default_arm,
    rate_limiter_tick_does_not_drift_or_burst,
    pubsub_drops_slow_subscribers,
    graceful_shutdown_of_a_supervisor_tree,
    tcp_echo_server_with_50_clients_shut_down_while_connected,
    rpc_with_per_request_deadlines,
    bank_transfers_conserve_money_under_audit,
    barrier_phased_simulation_matches_sequential,
    parallel_quicksort_with_scope,
    timer_stress_10k_sleepers,
    pipeline_with_a_done_channel_drops_every_item_once,
    condvar_bounded_queue_producers_consumers,
    errgroup_first_error_cancels_the_rest,
    semaphore_limits_concurrent_fetches,
    client_read_deadline_then_retry_loses_no_bytes,
    blocking_file_io_worker_pool,
    plain_threads_feed_a_fiber_pool_and_wait_for_replies,
    udp_echo_with_lossless_loopback,
);

/// A small deterministic PRNG (xorshift64*).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Counts live values of a type: made on `new`, unmade on drop.
#[derive(Default)]
struct Live {
    made: AtomicUsize,
    dropped: AtomicUsize,
}

impl Live {
    fn alive(&self) -> usize {
        self.made.load(Ordering::SeqCst) - self.dropped.load(Ordering::SeqCst)
    }
}

// ---------------------------------------------------------------------------
// 1. A bounded worker pool fed by a channel; results collected in order.
// ---------------------------------------------------------------------------

struct Task {
    id: usize,
    live: Arc<Live>,
}

impl Task {
    fn new(id: usize, live: &Arc<Live>) -> Task {
        live.made.fetch_add(1, Ordering::SeqCst);
        Task { id, live: live.clone() }
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        self.live.dropped.fetch_add(1, Ordering::SeqCst);
    }
}

fn collatz_steps(mut n: u64) -> u64 {
    let mut steps = 0;
    while n > 1 {
        n = if n % 2 == 0 { n / 2 } else { 3 * n + 1 };
        steps += 1;
    }
    steps
}

fn worker_pool_results_in_order() {
    const N: usize = 2000;
    const WORKERS: usize = 4;
    let live = Arc::new(Live::default());
    let (task_tx, task_rx) = bounded::<Task>(WORKERS);
    let (res_tx, res_rx) = unbounded::<(usize, u64)>();
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            let task_rx = task_rx.clone();
            let res_tx = res_tx.clone();
            fiber::spawn(move || {
                let mut done = 0usize;
                for task in task_rx.iter() {
                    let v = collatz_steps(task.id as u64 + 1);
                    if task.id % 7 == 0 {
                        fiber::yield_now().unwrap();
                    }
                    res_tx.send((task.id, v)).unwrap();
                    done += 1;
                }
                done
            })
        })
        .collect();
    drop(task_rx);
    drop(res_tx);
    let producer = {
        let live = live.clone();
        fiber::spawn(move || {
            for id in 0..N {
                task_tx.send(Task::new(id, &live)).unwrap();
            }
        })
    };
    let mut results = vec![None; N];
    for (id, v) in res_rx.iter() {
        assert!(results[id].replace(v).is_none(), "result {id} delivered twice");
    }
    producer.join().unwrap();
    let per_worker: Vec<usize> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    assert_eq!(per_worker.iter().sum::<usize>(), N, "{per_worker:?}");
    let expected: Vec<Option<u64>> = (0..N).map(|i| Some(collatz_steps(i as u64 + 1))).collect();
    assert_eq!(results, expected);
    assert_eq!(live.made.load(Ordering::SeqCst), N);
    assert_eq!(live.alive(), 0, "every task dropped exactly once");
}

// ---------------------------------------------------------------------------
// 2. A 4-stage pipeline with backpressure, cancelled midway.
// ---------------------------------------------------------------------------

const MAX_ITEMS: usize = 200_000;

struct Ledger {
    made: AtomicUsize,
    drops: Vec<AtomicU8>,
}

impl Ledger {
    fn new() -> Arc<Ledger> {
        Arc::new(Ledger {
            made: AtomicUsize::new(0),
            drops: (0..MAX_ITEMS).map(|_| AtomicU8::new(0)).collect(),
        })
    }

    /// Every item made was dropped exactly once.
    fn check(&self) -> usize {
        let made = self.made.load(Ordering::SeqCst);
        assert!(made < MAX_ITEMS, "the source ran away: {made} items");
        for id in 0..MAX_ITEMS {
            let d = self.drops[id].load(Ordering::SeqCst);
            let want = u8::from(id < made);
            assert_eq!(d, want, "item {id} dropped {d} times ({made} made)");
        }
        made
    }
}

struct Item {
    id: usize,
    val: u64,
    ledger: Arc<Ledger>,
}

impl Drop for Item {
    fn drop(&mut self) {
        self.ledger.drops[self.id].fetch_add(1, Ordering::SeqCst);
    }
}

/// source -> bounded(0) -> square -> bounded(8) -> add -> bounded(0) -> sink.
/// Returns the sink's receiver side; stages are children of `s`.
fn spawn_stages<'scope>(s: &'scope fiber::Scope<'scope, '_>, ledger: &Arc<Ledger>) -> Receiver<Item> {
    let (src_tx, src_rx) = bounded::<Item>(0);
    let (sq_tx, sq_rx) = bounded::<Item>(8);
    let (add_tx, add_rx) = bounded::<Item>(0);
    let ledger = ledger.clone();
    s.spawn(move || {
        for id in 0..MAX_ITEMS {
            ledger.made.fetch_add(1, Ordering::SeqCst);
            let item = Item {
                id,
                val: id as u64,
                ledger: ledger.clone(),
            };
            if src_tx.send(item).is_err() {
                break; // cancelled: the error held the item, now dropped
            }
        }
    });
    s.spawn(move || {
        for mut item in src_rx.iter() {
            item.val *= item.val;
            if sq_tx.send(item).is_err() {
                break;
            }
        }
    });
    s.spawn(move || {
        for mut item in sq_rx.iter() {
            item.val += 7;
            if add_tx.send(item).is_err() {
                break;
            }
        }
    });
    add_rx
}

fn pipeline_cancelled_by_its_sink_drops_every_item_once() {
    let ledger = Ledger::new();
    let taken = fiber::scope(|s| {
        let out = spawn_stages(s, &ledger);
        let mut taken = 0usize;
        for item in out.iter() {
            assert_eq!(item.id, taken, "items arrive in order");
            assert_eq!(item.val, (taken as u64) * (taken as u64) + 7);
            taken += 1;
            if taken == 500 {
                s.job().cancel();
                break;
            }
        }
        taken
    });
    assert_eq!(taken, 500);
    let made = ledger.check();
    assert!(made >= 500, "{made}");
}

fn pipeline_cancelled_from_outside_drops_every_item_once() {
    let ledger = Ledger::new();
    let progress = Arc::new(AtomicUsize::new(0));
    let l = ledger.clone();
    let p = progress.clone();
    let pipeline = fiber::spawn(move || {
        fiber::scope(|s| {
            let out = spawn_stages(s, &l);
            let mut taken = 0usize;
            for item in out.iter() {
                assert_eq!(item.id, taken);
                taken += 1;
                p.store(taken, Ordering::SeqCst);
                if taken % 10 == 0 {
                    // The sink is slow: backpressure fills every buffer.
                    let _ = fiber::sleep(ms(1));
                }
            }
            taken
        })
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    while progress.load(Ordering::SeqCst) < 300 {
        assert!(Instant::now() < deadline, "the pipeline made no progress");
        fiber::sleep(ms(1)).unwrap();
    }
    pipeline.cancel();
    let outcome = pipeline.join();
    assert!(outcome.as_ref().is_err_and(|e| e.is_cancelled()), "{outcome:?}");
    let made = ledger.check();
    let taken = progress.load(Ordering::SeqCst);
    assert!(made >= taken && taken >= 300, "made {made}, taken {taken}");
    // Backpressure: at most a handful of items beyond the sink are in flight
    // (a rendezvous, a buffer of 8, a rendezvous, plus one in each stage).
    assert!(made - taken <= 8 + 3 + 3, "made {made}, taken {taken}");
}

// ---------------------------------------------------------------------------
// 3. Fan-in of N producers with select!: a timeout arm, a default arm.
// ---------------------------------------------------------------------------

fn producer(p: usize, n: usize, cap: usize, pause_every: usize) -> Receiver<(usize, usize)> {
    let (tx, rx) = bounded(cap);
    fiber::spawn(move || {
        for seq in 0..n {
            tx.send((p, seq)).unwrap();
            if pause_every != 0 && seq % pause_every == pause_every - 1 {
                fiber::sleep(ms(5)).unwrap();
            }
        }
    });
    rx
}

fn fan_in_with_select_timeout_arm() {
    const N: usize = 400;
    let mut rxs = [
        Some(producer(0, N, 1, 0)),
        Some(producer(1, N, 0, 100)),
        Some(producer(2, N, 16, 50)),
    ];
    let none: Receiver<(usize, usize)> = never();
    let mut next = [0usize; 3];
    let mut timeouts = 0;
    let mut closed_seen = 0;
    loop {
        let [a, b, c] = &rxs;
        let got = chan::select! {
            recv(a.as_ref().unwrap_or(&none)) -> m => (0, m.ok()),
            recv(b.as_ref().unwrap_or(&none)) -> m => (1, m.ok()),
            recv(c.as_ref().unwrap_or(&none)) -> m => (2, m.ok()),
            default(Duration::from_secs(2)) => {
                timeouts += 1;
                break;
            }
        };
        match got {
            (i, Some((p, seq))) => {
                assert_eq!(i, p);
                assert_eq!(seq, next[p], "producer {p} out of order");
                next[p] += 1;
            }
            (i, None) => {
                rxs[i] = None;
                closed_seen += 1;
                if rxs.iter().all(Option::is_none) {
                    // Only never() arms left: the timeout arm must fire.
                    let r = chan::select! {
                        recv(none) -> _ => unreachable!(),
                        default(ms(30)) => "timed out",
                    };
                    assert_eq!(r, "timed out");
                    break;
                }
            }
        }
    }
    assert_eq!(
        timeouts, 0,
        "the 2 s timeout fired with producers still running: {next:?}"
    );
    assert_eq!(closed_seen, 3);
    assert_eq!(next, [N; 3]);
}

fn fan_in_with_select_default_arm() {
    const N: usize = 1000;
    let (a, b) = (producer(0, N, 0, 0), producer(1, N, 4, 0));
    let mut a = Some(a);
    let mut b = Some(b);
    let none: Receiver<(usize, usize)> = never();
    let mut next = [0usize; 2];
    let mut idle = 0u64;
    let deadline = Instant::now() + Duration::from_secs(30);
    while a.is_some() || b.is_some() {
        assert!(Instant::now() < deadline, "fan-in stalled at {next:?}");
        chan::select! {
            recv(a.as_ref().unwrap_or(&none)) -> m => match m {
                Ok((p, seq)) => { assert_eq!((p, seq), (0, next[0])); next[0] += 1; }
                Err(_) => a = None,
            },
            recv(b.as_ref().unwrap_or(&none)) -> m => match m {
                Ok((p, seq)) => { assert_eq!((p, seq), (1, next[1])); next[1] += 1; }
                Err(_) => b = None,
            },
            default => {
                idle += 1;
            }
        }
    }
    assert_eq!(next, [N, N]);
    let _ = idle; // how often the consumer found nothing: timing-dependent
}

// ---------------------------------------------------------------------------
// 4. A rate limiter with tick: no drift, no burst after a stall.
// ---------------------------------------------------------------------------

fn rate_limiter_tick_does_not_drift_or_burst() {
    let period = ms(20);
    const N: u32 = 15;
    let ticker = tick(period);
    let start = Instant::now();
    let mut due = Vec::new();
    for _ in 0..N {
        let d = ticker.recv().unwrap();
        assert!(Instant::now() >= d, "a tick delivered before it was due");
        due.push(d);
    }
    let took = start.elapsed();
    // N ticks take about N periods: not fewer, and not N periods plus a
    // rounding per tick.
    assert!(took >= period * N - ms(1), "{N} ticks in {took:?}");
    assert!(
        took < period * N + period * N / 2,
        "{N} ticks of {period:?} took {took:?}"
    );
    let exact = due.windows(2).filter(|w| w[1] - w[0] == period).count();
    if std::env::var("REVIEW15_VERBOSE").is_ok() {
        eprintln!("tick: {N} ticks in {took:?}, {exact} exact gaps");
    }
    assert!(
        exact as u32 >= (N - 1) / 2,
        "the schedule drifts: {exact} exact gaps of {}",
        N - 1
    );

    // A stall of 10 periods, then 6 receives: no burst of saved-up ticks.
    fiber::sleep(period * 10).unwrap();
    let resumed = Instant::now();
    let first = ticker.recv().unwrap();
    assert!(first < resumed, "a tick came due during the stall");
    let burst_start = Instant::now();
    for _ in 0..5 {
        ticker.recv().unwrap();
    }
    let spaced = burst_start.elapsed();
    assert!(
        spaced >= period * 4,
        "5 ticks after a stall came in {spaced:?} (a burst)"
    );
}

// ---------------------------------------------------------------------------
// 5. A pub/sub broadcaster that drops slow subscribers.
// ---------------------------------------------------------------------------

struct Msg {
    seq: u32,
    live: Arc<Live>,
}

impl Msg {
    fn new(seq: u32, live: &Arc<Live>) -> Msg {
        live.made.fetch_add(1, Ordering::SeqCst);
        Msg {
            seq,
            live: live.clone(),
        }
    }
}

impl Clone for Msg {
    fn clone(&self) -> Msg {
        Msg::new(self.seq, &self.live)
    }
}

impl Drop for Msg {
    fn drop(&mut self) {
        self.live.dropped.fetch_add(1, Ordering::SeqCst);
    }
}

enum Cmd {
    Subscribe(Sender<Msg>),
    Publish(Msg),
}

fn pubsub_drops_slow_subscribers() {
    const MSGS: u32 = 200;
    const BUF: usize = 16;
    const BATCH: u32 = 8;
    let live = Arc::new(Live::default());
    let (cmd_tx, cmd_rx) = bounded::<Cmd>(0);
    let (quit_tx, quit_rx) = bounded::<()>(0);
    let broadcaster = fiber::spawn(move || {
        let mut subs: Vec<Sender<Msg>> = Vec::new();
        let mut dropped_slow = 0;
        loop {
            chan::select! {
                recv(cmd_rx) -> cmd => match cmd {
                    Ok(Cmd::Subscribe(tx)) => subs.push(tx),
                    Ok(Cmd::Publish(msg)) => subs.retain(|tx| match tx.try_send(msg.clone()) {
                        Ok(()) => true,
                        Err(chan::TrySendError::Full(_)) => {
                            dropped_slow += 1;
                            false
                        }
                        Err(chan::TrySendError::Disconnected(_)) => false,
                    }),
                    Err(_) => break,
                },
                recv(quit_rx) -> _ => break,
            }
        }
        dropped_slow
    });
    let (ack_tx, ack_rx) = unbounded::<usize>();
    let mut fast = Vec::new();
    for i in 0..5 {
        let (tx, rx) = bounded::<Msg>(BUF);
        cmd_tx.send(Cmd::Subscribe(tx)).unwrap();
        let ack_tx = ack_tx.clone();
        fast.push(fiber::spawn(move || {
            let mut got = Vec::new();
            for m in rx.iter() {
                got.push(m.seq);
                if (m.seq + 1) % BATCH == 0 {
                    ack_tx.send(i).unwrap();
                }
            }
            got
        }));
    }
    let (release_tx, release_rx) = bounded::<()>(0);
    let mut slow = Vec::new();
    for _ in 0..2 {
        let (tx, rx) = bounded::<Msg>(BUF);
        cmd_tx.send(Cmd::Subscribe(tx)).unwrap();
        let release_rx = release_rx.clone();
        slow.push(fiber::spawn(move || {
            let _ = release_rx.recv(); // stuck until the publisher is done
            rx.iter().map(|m| m.seq).collect::<Vec<_>>()
        }));
    }
    drop(release_rx);
    for seq in 0..MSGS {
        cmd_tx.send(Cmd::Publish(Msg::new(seq, &live))).unwrap();
        if (seq + 1) % BATCH == 0 {
            // Wait until every fast subscriber took the batch.
            for _ in 0..5 {
                ack_rx.recv().unwrap();
            }
        }
    }
    quit_tx.send(()).unwrap();
    let dropped_slow = broadcaster.join().unwrap();
    drop(cmd_tx);
    drop(release_tx); // the slow subscribers wake up and drain
    for f in fast {
        assert_eq!(f.join().unwrap(), (0..MSGS).collect::<Vec<_>>());
    }
    for s in slow {
        assert_eq!(
            s.join().unwrap(),
            (0..BUF as u32).collect::<Vec<_>>(),
            "a slow subscriber keeps its buffer"
        );
    }
    assert_eq!(dropped_slow, 2);
    assert_eq!(live.alive(), 0, "every message copy dropped once");
    assert_eq!(
        live.made.load(Ordering::SeqCst),
        MSGS as usize * (1 + 5) + 2 * (BUF + 1)
    );
}

// ---------------------------------------------------------------------------
// 6. Graceful shutdown of a supervisor tree through a control channel.
// ---------------------------------------------------------------------------

struct Cleanup {
    i: usize,
    counts: Arc<Vec<AtomicUsize>>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        self.counts[self.i].fetch_add(1, Ordering::SeqCst);
    }
}

fn graceful_shutdown_of_a_supervisor_tree() {
    const CHILDREN: usize = 8;
    let counts = Arc::new((0..=CHILDREN).map(|_| AtomicUsize::new(0)).collect::<Vec<_>>());
    let rounds = Arc::new(AtomicUsize::new(0));
    let (ctrl_tx, ctrl_rx) = bounded::<&'static str>(0);
    let c = counts.clone();
    let r = rounds.clone();
    let supervisor = fiber::spawn(move || {
        fiber::supervisor_scope(|s| {
            let children: Vec<_> = (0..CHILDREN)
                .map(|i| {
                    let cleanup = Cleanup { i, counts: c.clone() };
                    let r = r.clone();
                    s.spawn(move || {
                        let _cleanup = cleanup;
                        let mut mine = 0u64;
                        loop {
                            r.fetch_add(1, Ordering::SeqCst);
                            mine += 1;
                            if fiber::sleep(ms(1 + i as u64)).is_err() {
                                break mine;
                            }
                        }
                    })
                })
                .collect();
            // A child that fails: the supervisor keeps the others running.
            let cleanup = Cleanup {
                i: CHILDREN,
                counts: c.clone(),
            };
            let bad = s.spawn(move || {
                let _cleanup = cleanup;
                fiber::sleep(ms(2)).unwrap();
                panic!("child {CHILDREN} failed");
            });
            assert!(bad.join().unwrap_err().is_panic());
            assert_eq!(ctrl_rx.recv().unwrap(), "shutdown");
            s.job().cancel();
            children
                .into_iter()
                .map(|h| {
                    let e = h.join().unwrap_err();
                    assert!(e.is_cancelled(), "{e}");
                })
                .count()
        })
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    while rounds.load(Ordering::SeqCst) < 100 {
        assert!(Instant::now() < deadline, "the children never ran");
        fiber::sleep(ms(2)).unwrap();
    }
    ctrl_tx.send("shutdown").unwrap();
    assert_eq!(supervisor.join().unwrap(), CHILDREN);
    for (i, n) in counts.iter().enumerate() {
        assert_eq!(n.load(Ordering::SeqCst), 1, "child {i}'s clean-up ran {n:?} times");
    }
}

// ---------------------------------------------------------------------------
// 7. A TCP echo server and 50 clients, shut down while clients are connected.
// ---------------------------------------------------------------------------

fn tcp_echo_server_with_50_clients_shut_down_while_connected() {
    const CLIENTS: usize = 50;
    const LINGER: usize = 10; // clients still connected at shutdown
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let handlers = Arc::new(Live::default());
    let h = handlers.clone();
    let server = fiber::spawn(move || {
        fiber::scope(|s| {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { break }; // cancelled
                h.made.fetch_add(1, Ordering::SeqCst);
                let h = h.clone();
                s.spawn(move || {
                    struct Done(Arc<Live>);
                    impl Drop for Done {
                        fn drop(&mut self) {
                            self.0.dropped.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    let _done = Done(h);
                    let mut stream = stream;
                    let mut buf = [0u8; 1024];
                    loop {
                        match stream.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                if stream.write_all(&buf[..n]).is_err() {
                                    break;
                                }
                            }
                        }
                    }
                });
            }
        })
    });
    let echoed = WaitGroup::new();
    let (eof_tx, eof_rx) = unbounded::<usize>();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let echoed = echoed.clone();
            let eof_tx = eof_tx.clone();
            fiber::spawn(move || {
                let mut stream = TcpStream::connect(addr).unwrap();
                for round in 0..20usize {
                    let msg: Vec<u8> = (0..(1 + (c * 7 + round * 13) % 300))
                        .map(|k| (c as u8).wrapping_mul(31).wrapping_add((round + k) as u8))
                        .collect();
                    stream.write_all(&msg).unwrap();
                    let mut back = vec![0u8; msg.len()];
                    stream.read_exact(&mut back).unwrap();
                    assert_eq!(back, msg, "client {c} round {round}");
                }
                drop(echoed);
                if c < LINGER {
                    // Stay connected until the server goes away.
                    let mut buf = [0u8; 16];
                    let n = stream.read(&mut buf).expect("the server closes, no error");
                    assert_eq!(n, 0, "client {c} got bytes after shutdown");
                    eof_tx.send(c).unwrap();
                }
            })
        })
        .collect();
    drop(eof_tx);
    echoed.wait();
    // Every lingering client is connected; the others may still be closing.
    let deadline = Instant::now() + Duration::from_secs(20);
    while handlers.alive() > LINGER {
        assert!(Instant::now() < deadline, "handlers of closed clients never ended");
        fiber::sleep(ms(2)).unwrap();
    }
    assert_eq!(handlers.alive(), LINGER);
    server.cancel();
    let outcome = server.join();
    assert!(outcome.as_ref().is_err_and(|e| e.is_cancelled()), "{outcome:?}");
    for c in clients {
        c.join().unwrap();
    }
    let mut eofs: Vec<usize> = eof_rx.iter().collect();
    eofs.sort_unstable();
    assert_eq!(eofs, (0..LINGER).collect::<Vec<_>>());
    assert_eq!(handlers.made.load(Ordering::SeqCst), CLIENTS);
    assert_eq!(handlers.alive(), 0, "every connection handler ended once");
    // The listener is gone with the server: a new connection is refused.
    assert!(TcpStream::connect(addr).is_err());
}

// ---------------------------------------------------------------------------
// 8. Request/response RPC over channels with per-request deadlines.
// ---------------------------------------------------------------------------

struct Request {
    id: u64,
    delay: Duration,
    reply: Sender<u64>,
}

fn rpc_with_per_request_deadlines() {
    const REQS: u64 = 40;
    let (req_tx, req_rx) = bounded::<Request>(0);
    let undelivered = Arc::new(AtomicUsize::new(0));
    let handled = WaitGroup::new();
    let u = undelivered.clone();
    let hw = handled.clone();
    let server = fiber::spawn(move || {
        for req in req_rx.iter() {
            let u = u.clone();
            let hw = hw.clone();
            fiber::spawn(move || {
                let _member = hw;
                fiber::sleep(req.delay).unwrap();
                if req.reply.send(req.id * 10).is_err() {
                    u.fetch_add(1, Ordering::SeqCst);
                }
            });
        }
    });
    let results: Vec<Result<Option<u64>, fiber::TimedOut>> = fiber::scope(|s| {
        let handles: Vec<_> = (0..REQS)
            .map(|id| {
                let req_tx = req_tx.clone();
                s.spawn(move || {
                    let slow = id % 5 == 0;
                    let delay = if slow { ms(600) } else { ms(id % 4) };
                    fiber::with_timeout(ms(200), || {
                        let (reply, reply_rx) = bounded(1);
                        req_tx.send(Request { id, delay, reply }).ok()?;
                        reply_rx.recv().ok()
                    })
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    drop(req_tx);
    server.join().unwrap();
    handled.wait();
    for (id, r) in results.iter().enumerate() {
        let id = id as u64;
        if id % 5 == 0 {
            assert!(r.is_err(), "slow request {id} got {r:?}");
        } else {
            assert_eq!(*r, Ok(Some(id * 10)), "request {id}");
        }
    }
    assert_eq!(undelivered.load(Ordering::SeqCst), (REQS / 5) as usize);
}

// ---------------------------------------------------------------------------
// 9. A bank: 100 accounts, 1,000 fibers transferring, auditors reading.
// ---------------------------------------------------------------------------

fn bank_transfers_conserve_money_under_audit() {
    const ACCOUNTS: usize = 100;
    const FIBERS: usize = 1000;
    const TRANSFERS: usize = 10;
    const START: i64 = 1_000;
    let accounts: Arc<Vec<RwLock<i64>>> = Arc::new((0..ACCOUNTS).map(|_| RwLock::new(START)).collect());
    let journal = Arc::new(Mutex::new(Vec::<(usize, usize, i64)>::new()));
    let audits = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let auditors: Vec<_> = (0..3)
        .map(|_| {
            let accounts = accounts.clone();
            let audits = audits.clone();
            let stop = stop.clone();
            fiber::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    // Two-phase locking in index order: a consistent snapshot.
                    let guards: Vec<_> = accounts.iter().map(|a| a.read().unwrap()).collect();
                    let total: i64 = guards.iter().map(|g| **g).sum();
                    assert_eq!(total, START * ACCOUNTS as i64, "money created or lost");
                    drop(guards);
                    audits.fetch_add(1, Ordering::SeqCst);
                    fiber::sleep(ms(1)).unwrap();
                }
            })
        })
        .collect();
    let tellers: Vec<_> = (0..FIBERS)
        .map(|f| {
            let accounts = accounts.clone();
            let journal = journal.clone();
            fiber::spawn(move || {
                let mut rng = Rng::new(f as u64 + 1);
                for t in 0..TRANSFERS {
                    let from = rng.below(ACCOUNTS as u64) as usize;
                    let mut to = rng.below(ACCOUNTS as u64 - 1) as usize;
                    if to >= from {
                        to += 1;
                    }
                    let amount = rng.below(50) as i64 + 1;
                    let (lo, hi) = (from.min(to), from.max(to));
                    let mut a = accounts[lo].write().unwrap();
                    if t % 3 == 0 {
                        fiber::yield_now().unwrap(); // hold a lock across a switch
                    }
                    let mut b = accounts[hi].write().unwrap();
                    let (src, dst) = if from == lo {
                        (&mut *a, &mut *b)
                    } else {
                        (&mut *b, &mut *a)
                    };
                    if *src >= amount {
                        *src -= amount;
                        *dst += amount;
                        journal.lock().unwrap().push((from, to, amount));
                    }
                }
            })
        })
        .collect();
    for t in tellers {
        t.join().unwrap();
    }
    // Let the auditors see the quiet bank at least once more.
    let seen = audits.load(Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(20);
    while audits.load(Ordering::SeqCst) < seen + 3 {
        assert!(Instant::now() < deadline, "auditors stalled");
        fiber::sleep(ms(1)).unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    for a in auditors {
        a.join().unwrap();
    }
    let mut replay = vec![START; ACCOUNTS];
    let journal = journal.lock().unwrap();
    for &(from, to, amount) in journal.iter() {
        replay[from] -= amount;
        replay[to] += amount;
    }
    let finals: Vec<i64> = accounts.iter().map(|a| *a.read().unwrap()).collect();
    assert_eq!(finals, replay, "balances disagree with the journal");
    assert_eq!(finals.iter().sum::<i64>(), START * ACCOUNTS as i64);
    assert!(finals.iter().all(|&b| b >= 0));
    assert!(journal.len() > FIBERS * TRANSFERS / 2, "{} transfers", journal.len());
}

// ---------------------------------------------------------------------------
// 10. A phased simulation: Barrier between phases, WaitGroup at the end.
// ---------------------------------------------------------------------------

fn step(left: u64, me: u64, right: u64, phase: u64) -> u64 {
    (left * 3 + me * 5 + right * 7 + phase) % 1_000_003
}

fn barrier_phased_simulation_matches_sequential() {
    const CELLS: usize = 2048;
    const WORKERS: usize = 8;
    const PHASES: u64 = 40;
    let init: Vec<u64> = (0..CELLS as u64).map(|i| i * i % 1009).collect();
    let mut expected = init.clone();
    for p in 0..PHASES {
        expected = (0..CELLS)
            .map(|i| {
                step(
                    expected[(i + CELLS - 1) % CELLS],
                    expected[i],
                    expected[(i + 1) % CELLS],
                    p,
                )
            })
            .collect();
    }
    let bufs: Arc<[Vec<AtomicU64>; 2]> = Arc::new([
        init.iter().map(|&v| AtomicU64::new(v)).collect(),
        (0..CELLS).map(|_| AtomicU64::new(0)).collect(),
    ]);
    let barrier = Arc::new(Barrier::new(WORKERS));
    let leaders = Arc::new(AtomicUsize::new(0));
    let wg = WaitGroup::new();
    for w in 0..WORKERS {
        let (bufs, barrier, leaders, wg) = (bufs.clone(), barrier.clone(), leaders.clone(), wg.clone());
        fiber::spawn(move || {
            let _member = wg;
            let chunk = CELLS / WORKERS;
            for p in 0..PHASES {
                let (cur, next) = (&bufs[(p % 2) as usize], &bufs[((p + 1) % 2) as usize]);
                for i in w * chunk..(w + 1) * chunk {
                    let l = cur[(i + CELLS - 1) % CELLS].load(Ordering::Relaxed);
                    let m = cur[i].load(Ordering::Relaxed);
                    let r = cur[(i + 1) % CELLS].load(Ordering::Relaxed);
                    next[i].store(step(l, m, r, p), Ordering::Relaxed);
                }
                if barrier.wait().is_leader() {
                    leaders.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
    }
    wg.wait();
    let got: Vec<u64> = bufs[(PHASES % 2) as usize]
        .iter()
        .map(|a| a.load(Ordering::Relaxed))
        .collect();
    assert_eq!(got, expected);
    assert_eq!(leaders.load(Ordering::SeqCst), PHASES as usize, "one leader per phase");
}

// ---------------------------------------------------------------------------
// 11. A recursive parallel quicksort with scope.
// ---------------------------------------------------------------------------

fn partition(v: &mut [u32]) -> usize {
    let mid = v.len() / 2;
    let last = v.len() - 1;
    // Median of three to the end.
    if v[mid] < v[0] {
        v.swap(mid, 0);
    }
    if v[last] < v[0] {
        v.swap(last, 0);
    }
    if v[mid] < v[last] {
        v.swap(mid, last);
    }
    let pivot = v[last];
    let mut store = 0;
    for i in 0..last {
        if v[i] < pivot {
            v.swap(i, store);
            store += 1;
        }
    }
    v.swap(store, last);
    store
}

fn quicksort(v: &mut [u32], spawned: &AtomicUsize) {
    if v.len() <= 256 {
        v.sort_unstable();
        return;
    }
    let p = partition(v);
    let (lo, hi) = v.split_at_mut(p);
    fiber::scope(|s| {
        spawned.fetch_add(1, Ordering::Relaxed);
        s.spawn(move || quicksort(lo, spawned));
        quicksort(&mut hi[1..], spawned);
    });
}

fn parallel_quicksort_with_scope() {
    let mut rng = Rng::new(42);
    let mut v: Vec<u32> = (0..100_000).map(|_| rng.below(1 << 20) as u32).collect();
    let mut expected = v.clone();
    expected.sort_unstable();
    let spawned = AtomicUsize::new(0);
    quicksort(&mut v, &spawned);
    assert!(v == expected, "not sorted");
    assert!(spawned.load(Ordering::Relaxed) > 100);
}

// ---------------------------------------------------------------------------
// 12. Timer stress: 10,000 fibers each sleeping 0-50 ms.
// ---------------------------------------------------------------------------

fn timer_stress_10k_sleepers() {
    const FIBERS: usize = 10_000;
    let start = Instant::now();
    let early = Arc::new(AtomicUsize::new(0));
    let max_late_us = Arc::new(AtomicI64::new(0));
    let wg = WaitGroup::new();
    let mut rng = Rng::new(7);
    for i in 0..FIBERS {
        let d = ms(rng.below(51));
        let (early, max_late_us, wg) = (early.clone(), max_late_us.clone(), wg.clone());
        fiber::spawn(move || {
            let _member = wg;
            let deadline = Instant::now() + d;
            if i % 2 == 0 {
                fiber::sleep(d).unwrap();
            } else {
                fiber::sleep_until(deadline).unwrap();
            }
            let now = Instant::now();
            if now < deadline {
                early.fetch_add(1, Ordering::SeqCst);
            } else {
                max_late_us.fetch_max((now - deadline).as_micros() as i64, Ordering::SeqCst);
            }
        });
    }
    wg.wait();
    let took = start.elapsed();
    assert_eq!(early.load(Ordering::SeqCst), 0, "a sleeper woke before its deadline");
    assert!(
        took < Duration::from_secs(10),
        "10,000 sleeps of at most 50 ms took {took:?}"
    );
    let late = Duration::from_micros(max_late_us.load(Ordering::SeqCst) as u64);
    assert!(
        late < Duration::from_secs(2),
        "a sleeper woke {late:?} after its deadline"
    );
    if std::env::var("REVIEW15_VERBOSE").is_ok() {
        eprintln!(
            "timer stress: took {took:?}, max lateness {} us",
            max_late_us.load(Ordering::SeqCst)
        );
    }
}

// ---------------------------------------------------------------------------
// 13. Go-style pipeline cancelled by closing a done channel; stages select
//     between their send and the done channel.
// ---------------------------------------------------------------------------

fn done_stage(input: Receiver<Item>, out: Sender<Item>, done: Receiver<()>, f: fn(u64) -> u64, wg: WaitGroup) {
    fiber::spawn(move || {
        let _member = wg;
        loop {
            let mut item = chan::select! {
                recv(input) -> m => match m {
                    Ok(item) => item,
                    Err(_) => return,
                },
                recv(done) -> _ => return,
            };
            item.val = f(item.val);
            chan::select! {
                send(out, item) -> r => if r.is_err() { return },
                recv(done) -> _ => return, // `item` was not sent: dropped here
            }
        }
    });
}

fn pipeline_with_a_done_channel_drops_every_item_once() {
    let ledger = Ledger::new();
    let (done_tx, done_rx) = bounded::<()>(0);
    let wg = WaitGroup::new();
    let (src_tx, src_rx) = bounded::<Item>(0);
    let (a_tx, a_rx) = bounded::<Item>(8);
    let (b_tx, b_rx) = bounded::<Item>(0);
    {
        let (ledger, done, wg) = (ledger.clone(), done_rx.clone(), wg.clone());
        fiber::spawn(move || {
            let _member = wg;
            for id in 0..MAX_ITEMS {
                ledger.made.fetch_add(1, Ordering::SeqCst);
                let item = Item {
                    id,
                    val: id as u64,
                    ledger: ledger.clone(),
                };
                chan::select! {
                    send(src_tx, item) -> r => r.unwrap(),
                    recv(done) -> _ => return,
                }
            }
        });
    }
    done_stage(src_rx, a_tx, done_rx.clone(), |v| v * 2, wg.clone());
    done_stage(a_rx, b_tx, done_rx.clone(), |v| v + 1, wg.clone());
    drop(done_rx);
    let mut taken = 0usize;
    while taken < 300 {
        let item = b_rx.recv().unwrap();
        assert_eq!((item.id, item.val), (taken, taken as u64 * 2 + 1));
        taken += 1;
    }
    drop(done_tx); // close(done)
    wg.wait();
    drop(b_rx);
    let made = ledger.check();
    assert!(made >= 300, "{made}");
}

// ---------------------------------------------------------------------------
// 14. The classic bounded queue: Mutex + two Condvars.
// ---------------------------------------------------------------------------

struct BoundedQueue {
    items: Mutex<VecDeque<Option<u64>>>,
    not_empty: Condvar,
    not_full: Condvar,
    cap: usize,
}

impl BoundedQueue {
    fn push(&self, v: Option<u64>) {
        let mut q = self
            .not_full
            .wait_while(self.items.lock().unwrap(), |q| q.len() >= self.cap)
            .unwrap();
        q.push_back(v);
        drop(q);
        self.not_empty.notify_one();
    }
    fn pop(&self) -> Option<u64> {
        let mut q = self
            .not_empty
            .wait_while(self.items.lock().unwrap(), |q| q.is_empty())
            .unwrap();
        let v = q.pop_front().unwrap();
        drop(q);
        self.not_full.notify_one();
        v
    }
}

fn condvar_bounded_queue_producers_consumers() {
    const PRODUCERS: u64 = 4;
    const CONSUMERS: usize = 4;
    const EACH: u64 = 2000;
    let q = Arc::new(BoundedQueue {
        items: Mutex::new(VecDeque::new()),
        not_empty: Condvar::new(),
        not_full: Condvar::new(),
        cap: 3,
    });
    let consumers: Vec<_> = (0..CONSUMERS)
        .map(|_| {
            let q = q.clone();
            fiber::spawn(move || {
                let mut got = Vec::new();
                while let Some(v) = q.pop() {
                    got.push(v);
                }
                got
            })
        })
        .collect();
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let q = q.clone();
            fiber::spawn(move || {
                for i in 0..EACH {
                    q.push(Some(p * EACH + i));
                }
            })
        })
        .collect();
    for p in producers {
        p.join().unwrap();
    }
    for _ in 0..CONSUMERS {
        q.push(None);
    }
    let mut all: Vec<u64> = Vec::new();
    for c in consumers {
        let got = c.join().unwrap();
        // Each producer's values reach one consumer in the order it pushed them.
        for p in 0..PRODUCERS {
            let mine: Vec<u64> = got.iter().copied().filter(|v| v / EACH == p).collect();
            assert!(mine.windows(2).all(|w| w[0] < w[1]), "producer {p} reordered");
        }
        all.extend(got);
    }
    all.sort_unstable();
    assert_eq!(all, (0..PRODUCERS * EACH).collect::<Vec<_>>());
    assert!(q.items.lock().unwrap().is_empty());
}

// ---------------------------------------------------------------------------
// 15. errgroup: the first error cancels the other workers.
// ---------------------------------------------------------------------------

fn errgroup_first_error_cancels_the_rest() {
    const WORKERS: usize = 10;
    let counts = Arc::new((0..WORKERS).map(|_| AtomicUsize::new(0)).collect::<Vec<_>>());
    let started = Arc::new(AtomicUsize::new(0));
    let result: Result<Vec<u64>, String> = fiber::try_scope(|s| {
        let handles: Vec<_> = (0..WORKERS)
            .map(|i| {
                let cleanup = Cleanup {
                    i,
                    counts: counts.clone(),
                };
                let started = started.clone();
                s.spawn(move || {
                    let _cleanup = cleanup;
                    started.fetch_add(1, Ordering::SeqCst);
                    if i == 3 {
                        fiber::sleep(ms(5)).map_err(|_| "3 cancelled".to_string())?;
                        return Err(format!("worker {i} failed"));
                    }
                    let mut n = 0u64;
                    loop {
                        fiber::sleep(ms(1)).map_err(|_| format!("worker {i} cancelled"))?;
                        n += 1;
                        if n > 100_000 {
                            return Ok(n);
                        }
                    }
                })
            })
            .collect();
        // The body joins; every join after the failure reports cancellation.
        let mut values = Vec::new();
        for h in handles {
            match h.join() {
                Ok(v) => values.push(v),
                Err(e) => assert!(e.is_cancelled() || e.is_failed(), "{e}"),
            }
        }
        Ok(values)
    });
    assert_eq!(result, Err("worker 3 failed".to_string()));
    assert_eq!(started.load(Ordering::SeqCst), WORKERS);
    for (i, n) in counts.iter().enumerate() {
        assert_eq!(n.load(Ordering::SeqCst), 1, "worker {i}'s clean-up ran {n:?} times");
    }
}

// ---------------------------------------------------------------------------
// 16. A semaphore bounds the number of concurrent "fetches".
// ---------------------------------------------------------------------------

fn semaphore_limits_concurrent_fetches() {
    const JOBS: usize = 300;
    const LIMIT: usize = 5;
    let sem = Arc::new(Semaphore::new(LIMIT));
    let current = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..JOBS)
        .map(|i| {
            let (sem, current, peak) = (sem.clone(), current.clone(), peak.clone());
            fiber::spawn(move || {
                let _permit = sem.acquire().unwrap();
                let now = current.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                fiber::sleep(ms((i % 3) as u64)).unwrap();
                current.fetch_sub(1, Ordering::SeqCst);
                i
            })
        })
        .collect();
    let sum: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(sum, JOBS * (JOBS - 1) / 2);
    let peak = peak.load(Ordering::SeqCst);
    assert!((1..=LIMIT).contains(&peak), "peak concurrency {peak}");
    assert_eq!(sem.available_permits(), LIMIT);
}

// ---------------------------------------------------------------------------
// A TCP server whose runtime is dropped while plain-thread clients are
// connected: every connection is closed, every handler's clean-up runs once.
// ---------------------------------------------------------------------------

fn server_runtime_dropped_while_clients_connected(rt: fiber::Runtime) {
    const CLIENTS: usize = 20;
    let handlers = Arc::new(Live::default());
    let h = handlers.clone();
    let addr = rt.block_on(move || {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        fiber::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { break };
                h.made.fetch_add(1, Ordering::SeqCst);
                let h = h.clone();
                fiber::spawn(move || {
                    struct Done(Arc<Live>);
                    impl Drop for Done {
                        fn drop(&mut self) {
                            self.0.dropped.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    let _done = Done(h);
                    let mut buf = [0u8; 256];
                    while let Ok(n @ 1..) = stream.read(&mut buf) {
                        if stream.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                });
            }
        });
        addr
    });
    // block_on returned; the server fibers keep running (tokio's
    // multi-thread runtime does the same).
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            let msg = format!("hello from {c}");
            s.write_all(msg.as_bytes()).unwrap();
            let mut back = vec![0u8; msg.len()];
            s.read_exact(&mut back).unwrap();
            assert_eq!(back, msg.as_bytes());
            s
        })
        .collect();
    assert_eq!(handlers.made.load(Ordering::SeqCst), CLIENTS);
    let start = Instant::now();
    drop(rt);
    let took = start.elapsed();
    assert!(took < Duration::from_secs(5), "dropping the runtime took {took:?}");
    for (c, mut s) in clients.into_iter().enumerate() {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 8];
        let r = s.read(&mut buf);
        assert!(
            matches!(r, Ok(0)),
            "client {c}: {r:?} after the server's runtime was dropped"
        );
    }
    assert_eq!(handlers.alive(), 0, "every handler's clean-up ran once");
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "the listener outlived its runtime"
    );
}

mod server_runtime_dropped {
    use super::*;
    #[test]
    fn rt1() {
        within(60, || {
            server_runtime_dropped_while_clients_connected(crate::common::rt1())
        });
    }
    #[test]
    fn rt2() {
        within(60, || {
            server_runtime_dropped_while_clients_connected(crate::common::rt2())
        });
    }
    #[test]
    fn elastic() {
        within(60, || {
            server_runtime_dropped_while_clients_connected(fiber::Runtime::new().unwrap())
        });
    }
}

// ---------------------------------------------------------------------------
// 17. A client reads with a deadline (with_timeout), times out, then reads
//     again: the late reply is not lost (Go: SetReadDeadline, then reset).
// ---------------------------------------------------------------------------

fn client_read_deadline_then_retry_loses_no_bytes() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (bye_tx, bye_rx) = bounded::<()>(0);
    let server = fiber::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut req = [0u8; 4];
        s.read_exact(&mut req).unwrap();
        fiber::sleep(ms(150)).unwrap(); // a slow handler
        s.write_all(b"pong:").unwrap();
        s.write_all(&req).unwrap();
        let _ = bye_rx.recv(); // keep the connection open until told
    });
    let mut c = TcpStream::connect(addr).unwrap();
    c.write_all(b"ping").unwrap();
    let mut buf = [0u8; 9];
    let first = fiber::with_timeout(ms(30), || c.read(&mut buf));
    assert!(first.is_err(), "the reply came before the deadline: {first:?}");
    // The connection is still good: the whole reply arrives.
    c.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"pong:ping");
    // And the socket's own read timeout gives WouldBlock, then works again.
    c.set_read_timeout(Some(ms(20))).unwrap();
    let e = c.read(&mut buf).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
    drop(bye_tx);
    server.join().unwrap();
    c.set_read_timeout(None).unwrap();
    assert_eq!(c.read(&mut buf).unwrap(), 0, "EOF after the server closed");
}

// ---------------------------------------------------------------------------
// 18. File I/O on the blocking pool from a pool of fibers.
// ---------------------------------------------------------------------------

fn blocking_file_io_worker_pool() {
    static RUN: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "fiber-review15-{}-{}",
        std::process::id(),
        RUN.fetch_add(1, Ordering::SeqCst)
    ));
    fiber::blocking({
        let dir = dir.clone();
        move || std::fs::create_dir_all(&dir)
    })
    .unwrap();
    let (tx, rx) = bounded::<usize>(0);
    let (res_tx, res_rx) = unbounded::<(usize, usize)>();
    let wg = WaitGroup::new();
    for _ in 0..8 {
        let (rx, res_tx, dir, wg) = (rx.clone(), res_tx.clone(), dir.clone(), wg.clone());
        fiber::spawn(move || {
            let _member = wg;
            for i in rx.iter() {
                let path = dir.join(format!("{i}.txt"));
                let body = format!("file {i}\n").repeat(i + 1);
                let p = path.clone();
                let b = body.clone();
                fiber::blocking(move || std::fs::write(&p, b)).unwrap();
                let back = fiber::blocking(move || std::fs::read_to_string(&path)).unwrap();
                assert_eq!(back, body);
                res_tx.send((i, back.len())).unwrap();
            }
        });
    }
    drop((rx, res_tx));
    for i in 0..100 {
        tx.send(i).unwrap();
    }
    drop(tx);
    wg.wait();
    let mut got: Vec<(usize, usize)> = res_rx.iter().collect();
    got.sort_unstable();
    let want: Vec<(usize, usize)> = (0..100).map(|i| (i, format!("file {i}\n").len() * (i + 1))).collect();
    assert_eq!(got, want);
    fiber::blocking(move || std::fs::remove_dir_all(&dir)).unwrap();
}

// ---------------------------------------------------------------------------
// 19. Plain threads (legacy code) send requests into a fiber pool through
//     channels and wait for the replies.
// ---------------------------------------------------------------------------

fn plain_threads_feed_a_fiber_pool_and_wait_for_replies() {
    let (req_tx, req_rx) = bounded::<(u64, Sender<u64>)>(2);
    let pool: Vec<_> = (0..4)
        .map(|_| {
            let req_rx = req_rx.clone();
            fiber::spawn(move || {
                let mut n = 0;
                for (x, reply) in req_rx.iter() {
                    if x % 3 == 0 {
                        fiber::yield_now().unwrap();
                    }
                    reply.send(x * x).unwrap();
                    n += 1;
                }
                n
            })
        })
        .collect();
    drop(req_rx);
    let handle = fiber::Handle::current();
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let req_tx = req_tx.clone();
            let handle = handle.clone();
            std::thread::spawn(move || {
                let mut sum = 0;
                for i in 0..200u64 {
                    let x = t * 1000 + i;
                    let (tx, rx) = bounded(0);
                    req_tx.send((x, tx)).unwrap();
                    let y = rx.recv().unwrap();
                    assert_eq!(y, x * x);
                    sum += y;
                }
                // A thread can also start a fiber and join it.
                let extra = handle.spawn(move || t + 1).join().unwrap();
                sum + extra
            })
        })
        .collect();
    drop(req_tx);
    // Wait for the threads from a fiber without blocking a worker.
    let sums: Vec<u64> = fiber::blocking(move || threads.into_iter().map(|t| t.join().unwrap()).collect());
    let served: usize = pool.into_iter().map(|p| p.join().unwrap()).sum();
    assert_eq!(served, 800);
    for (t, sum) in sums.iter().enumerate() {
        let t = t as u64;
        let want: u64 = (0..200u64).map(|i| (t * 1000 + i) * (t * 1000 + i)).sum::<u64>() + t + 1;
        assert_eq!(*sum, want, "thread {t}");
    }
}

// ---------------------------------------------------------------------------
// 20. A UDP echo server with per-datagram replies on loopback.
// ---------------------------------------------------------------------------

fn udp_echo_with_lossless_loopback() {
    use fiber::net::UdpSocket;
    let server = UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = server.local_addr().unwrap();
    let srv = fiber::spawn(move || {
        let mut buf = [0u8; 64];
        let mut served = 0;
        loop {
            let (n, from) = server.recv_from(&mut buf).unwrap();
            if &buf[..n] == b"quit" {
                return served;
            }
            buf[..n].reverse();
            server.send_to(&buf[..n], from).unwrap();
            served += 1;
        }
    });
    let clients: Vec<_> = (0..10)
        .map(|c| {
            fiber::spawn(move || {
                let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
                sock.connect(addr).unwrap();
                for i in 0..20 {
                    let msg = format!("c{c}-m{i}");
                    sock.send(msg.as_bytes()).unwrap();
                    let mut buf = [0u8; 64];
                    let n = sock.recv(&mut buf).unwrap();
                    let want: String = msg.chars().rev().collect();
                    assert_eq!(&buf[..n], want.as_bytes());
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    let q = UdpSocket::bind("127.0.0.1:0").unwrap();
    q.send_to(b"quit", addr).unwrap();
    assert_eq!(srv.join().unwrap(), 200);
}

// ---------------------------------------------------------------------------
// Design question (passes; see REPORT.md): `WaitGroup::wait` in a cancelled
// fiber returns `()` at once, with members still running; the caller cannot
// tell "all done" from "cancelled" except through `fiber::is_cancelled()`.
// Go's `wg.Wait()` and crossbeam's `WaitGroup::wait` are not cancellable.
// ---------------------------------------------------------------------------

#[test]
fn design_wait_group_wait_ends_silently_on_cancellation() {
    within(30, || {
        rt2().block_on(|| {
            let member_done = Arc::new(AtomicBool::new(false));
            let (release_tx, release_rx) = bounded::<()>(0);
            let wg = WaitGroup::new();
            let member = {
                let (wg, done) = (wg.clone(), member_done.clone());
                fiber::spawn(move || {
                    let _member = wg;
                    fiber::non_cancellable(|| release_rx.recv().unwrap());
                    done.store(true, Ordering::SeqCst);
                })
            };
            let waiter = {
                let done = member_done.clone();
                fiber::spawn(move || {
                    wg.wait(); // returns (), whatever ended it
                    (done.load(Ordering::SeqCst), fiber::is_cancelled())
                })
            };
            fiber::sleep(ms(20)).unwrap(); // the waiter parks (either way the outcome below holds)
            waiter.cancel();
            let outcome = waiter.join();
            // The waiter returned although the member is still running.
            assert!(outcome.as_ref().is_err_and(|e| e.is_cancelled()), "{outcome:?}");
            assert!(!member_done.load(Ordering::SeqCst));
            release_tx.send(()).unwrap();
            member.join().unwrap();
        })
    });
}
