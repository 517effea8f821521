//! Fairness and timers on a loaded machine: plain OS threads spin beside
//! the runtime (2 to 4 "hog" threads, stopped by a flag at the end of each
//! test) while fibers whose turns are long (5 to 30 ms without a yield
//! point) run beside fast ping-pong pairs, yield loops, `select` loops with
//! `default`, and timers (sleep, `recv_timeout`, `select` with `after` and
//! `tick` arms, `with_timeout`), with wakes from plain threads and pinned
//! fibers, on 1 and 2 fixed workers and on elastic runtimes.
//!
//! Shapes from Go's runtime tests (golang/go `src/runtime/proc_test.go`:
//! `TestPingPongHog`, `TestTimerFairness`, `TestTimerFairness2`,
//! `TestYieldProgress`, `TestGCFairness`; `src/time/sleep_test.go`:
//! `TestAfterQueuing`, `TestAfterStress`, `TestSleep`), whose rule is that
//! on a busy machine a runnable goroutine (a timer-woken one included)
//! runs within a bounded delay (Go's runtime preempts after 10 ms and takes
//! from the global run queue every 61 schedule ticks). fiber is
//! cooperative (README "Guarantees"): a long turn holds its worker, so the
//! bounds asserted here are generous (a 100 ms timer fires within 2 s),
//! and what they catch is a fiber that waits far longer than any single
//! turn: seconds, behind fibers that do yield between turns.

use fiber::chan::{after, bounded, tick, unbounded, Receiver, Sender};
use fiber::select;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::load::{spin, under_load, yielding_crunchers};
use crate::common::{ms, rt1, rt2, within};

// ---------------------------------------------------------------------------
// Harness.

#[derive(Clone, Copy, Debug)]
enum Rt {
    /// Exactly one worker, growth off.
    One,
    /// Exactly two workers, growth off.
    Two,
    /// One worker to start, up to four (growth on).
    ElasticOne,
    /// The defaults (workers = cores, max = 2 x cores).
    Default,
}

fn build(kind: Rt) -> fiber::Runtime {
    match kind {
        Rt::One => rt1(),
        Rt::Two => rt2(),
        Rt::ElasticOne => fiber::Runtime::builder()
            .workers(1)
            .max_workers(4)
            .shutdown_timeout(ms(300))
            .build()
            .unwrap(),
        Rt::Default => fiber::Runtime::builder().shutdown_timeout(ms(300)).build().unwrap(),
    }
}

/// Run `f` as the root fiber of a runtime of kind `kind`, under a 60 s
/// hang guard.
fn on<T: Send + 'static>(kind: Rt, f: impl FnOnce() -> T + Send + 'static) -> T {
    within(60, move || build(kind).block_on(f))
}

/// A ping-pong pair whose members spin `per_turn` at each hand-off, until
/// `done` closes. Returns the members (each returns its turn count) and
/// the token channel (keep the sender: the pair ends when `done` closes).
struct Pair {
    members: Vec<fiber::JoinHandle<u64>>,
    tx: Sender<bool>,
    rx: Receiver<bool>,
}

fn pair(per_turn: Duration, done: &Receiver<()>, pinned: bool) -> Pair {
    let (tx, rx) = bounded::<bool>(0);
    let mut members = Vec::new();
    for _ in 0..2 {
        let (tx, rx, done) = (tx.clone(), rx.clone(), done.clone());
        let body = move || {
            let mut turns = 0u64;
            loop {
                select! {
                    recv(done) -> _ => return turns,
                    recv(rx) -> _ => {
                        spin(per_turn);
                        turns += 1;
                        select! {
                            send(tx, true) -> r => if r.is_err() { return turns; },
                            recv(done) -> _ => return turns,
                        }
                    }
                }
            }
        };
        members.push(if pinned {
            fiber::spawn_pinned(body)
        } else {
            fiber::spawn(body)
        });
    }
    tx.send(true).unwrap();
    Pair { members, tx, rx }
}

impl Pair {
    /// End the pair (`done` must be closed first); the members' turn counts.
    fn finish(self) -> Vec<u64> {
        drop((self.tx, self.rx));
        self.members.into_iter().map(|m| m.join().unwrap()).collect()
    }
}

/// A heavy pair (25 ms turns) and a light pair (5 us turns), as in
/// `conformance/go_runtime.rs::a_sleeper_wakes_beside_a_compute_heavy_ping_pong_pair`.
fn heavy_and_light(heavy: Duration, done: &Receiver<()>) -> Vec<Pair> {
    vec![pair(heavy, done, false), pair(Duration::from_micros(5), done, false)]
}

fn finish_all(pairs: Vec<Pair>) {
    for p in pairs {
        p.finish();
    }
}

/// Latency bound asserted for a timer or wake (the nominal delay is
/// 10-100 ms; turns are at most 30 ms).
const BOUND: Duration = Duration::from_secs(2);

// ---------------------------------------------------------------------------
// Sleepers.

/// Ten sleepers of 100 ms each (one batch of timer wakes at once) beside a
/// heavy and a light ping-pong pair: every one wakes within 2 s.
fn many_sleepers_beside_pairs(kind: Rt, heavy: Duration) {
    under_load(3, || {
        let worst = on(kind, move || {
            let (done_tx, done_rx) = bounded::<()>(0);
            let pairs = heavy_and_light(heavy, &done_rx);
            let sleepers: Vec<_> = (0..10)
                .map(|_| {
                    fiber::spawn(|| {
                        let s = Instant::now();
                        fiber::sleep(ms(100)).unwrap();
                        s.elapsed()
                    })
                })
                .collect();
            let slept: Vec<Duration> = sleepers.into_iter().map(|h| h.join().unwrap()).collect();
            drop(done_tx);
            finish_all(pairs);
            slept
        });
        for s in &worst {
            assert!(*s >= ms(100), "slept only {s:?}");
        }
        let max = worst.iter().max().unwrap();
        assert!(
            *max < BOUND,
            "{kind:?}: a 100 ms sleep took {max:?} beside ping-pong pairs ({worst:?})"
        );
    });
}

#[test]
fn ten_sleepers_beside_a_heavy_and_a_light_pair_one_worker() {
    many_sleepers_beside_pairs(Rt::One, ms(25));
}

#[test]
fn ten_sleepers_beside_a_heavy_and_a_light_pair_two_workers() {
    many_sleepers_beside_pairs(Rt::Two, ms(25));
}

#[test]
fn ten_sleepers_beside_a_heavy_and_a_light_pair_elastic() {
    many_sleepers_beside_pairs(Rt::ElasticOne, ms(25));
}

/// A sleeper in a loop of 20 short sleeps (10 ms) beside two heavy pairs
/// (30 ms turns) on two workers: the whole loop, nominally 200 ms, ends
/// within a bound of 20 turns of each pair plus slack; every single sleep
/// within 2 s.
#[test]
fn a_loop_of_short_sleeps_beside_two_heavy_pairs_two_workers() {
    under_load(3, || {
        let (total, worst) = on(Rt::Two, || {
            let (done_tx, done_rx) = bounded::<()>(0);
            let pairs = vec![pair(ms(30), &done_rx, false), pair(ms(30), &done_rx, false)];
            let start = Instant::now();
            let mut worst = Duration::ZERO;
            for _ in 0..20 {
                let s = Instant::now();
                fiber::sleep(ms(10)).unwrap();
                worst = worst.max(s.elapsed());
            }
            let total = start.elapsed();
            drop(done_tx);
            finish_all(pairs);
            (total, worst)
        });
        assert!(worst < BOUND, "a 10 ms sleep took {worst:?}");
        assert!(total < Duration::from_secs(8), "20 sleeps of 10 ms took {total:?}");
    });
}

// ---------------------------------------------------------------------------
// Timer arms of channel operations and select.

/// `recv_timeout(50 ms)` on a channel nobody sends on, five times in a
/// row, beside a heavy and a light pair: each returns a timeout within 2 s.
fn recv_timeouts_beside_pairs(kind: Rt) {
    under_load(3, || {
        let times = on(kind, || {
            let (done_tx, done_rx) = bounded::<()>(0);
            let pairs = heavy_and_light(ms(25), &done_rx);
            let (_keep, rx) = bounded::<u8>(0);
            let waiter = fiber::spawn(move || {
                let mut times = Vec::new();
                for _ in 0..5 {
                    let s = Instant::now();
                    assert!(rx.recv_timeout(ms(50)).unwrap_err().is_timeout());
                    times.push(s.elapsed());
                }
                times
            });
            let times = waiter.join().unwrap();
            drop(done_tx);
            finish_all(pairs);
            times
        });
        for t in &times {
            assert!(*t >= ms(50), "timed out early: {t:?}");
        }
        let max = times.iter().max().unwrap();
        assert!(*max < BOUND, "{kind:?}: a 50 ms recv_timeout took {max:?} ({times:?})");
    });
}

#[test]
fn recv_timeouts_beside_pairs_one_worker() {
    recv_timeouts_beside_pairs(Rt::One);
}

#[test]
fn recv_timeouts_beside_pairs_two_workers() {
    recv_timeouts_beside_pairs(Rt::Two);
}

/// A select with an `after(100 ms)` arm and a never-ready arm, beside the
/// pairs: the `after` arm fires within 2 s, and reports a time at or after
/// its deadline.
fn select_after_beside_pairs(kind: Rt) {
    under_load(3, || {
        let took = on(kind, || {
            let (done_tx, done_rx) = bounded::<()>(0);
            let pairs = heavy_and_light(ms(25), &done_rx);
            let (_keep, never_rx) = bounded::<u8>(0);
            let w = fiber::spawn(move || {
                let s = Instant::now();
                let timer = after(ms(100));
                select! {
                    recv(never_rx) -> _ => panic!("nothing is sent"),
                    recv(timer) -> at => assert!(at.unwrap() >= s + ms(100)),
                }
                s.elapsed()
            });
            let took = w.join().unwrap();
            drop(done_tx);
            finish_all(pairs);
            took
        });
        assert!(took >= ms(100), "fired early: {took:?}");
        assert!(took < BOUND, "{kind:?}: an after(100 ms) arm fired after {took:?}");
    });
}

#[test]
fn a_select_after_arm_fires_beside_pairs_one_worker() {
    select_after_beside_pairs(Rt::One);
}

#[test]
fn a_select_after_arm_fires_beside_pairs_two_workers() {
    select_after_beside_pairs(Rt::Two);
}

/// TestTimerFairness under load: two fibers keep a channel ready
/// (`select` send / done) and a reader selects between it and a 20 ms
/// `after` timer, while two plain threads hog the CPU and a heavy pair
/// computes 20 ms turns: the timer arm is taken within 2 s (a select picks
/// uniformly among ready arms).
fn timer_fairness_under_load(kind: Rt) {
    under_load(2, || {
        let took = on(kind, || {
            let (done_tx, done_rx) = bounded::<()>(0);
            let heavy = pair(ms(20), &done_rx, false);
            let (c_tx, c_rx) = bounded::<bool>(0);
            let senders: Vec<_> = (0..2)
                .map(|_| {
                    let (c_tx, done_rx) = (c_tx.clone(), done_rx.clone());
                    fiber::spawn(move || loop {
                        select! {
                            send(c_tx, true) -> _ => {}
                            recv(done_rx) -> _ => return,
                        }
                    })
                })
                .collect();
            let start = Instant::now();
            let timer = after(ms(20));
            let mut reads = 0u64;
            loop {
                select! {
                    recv(c_rx) -> _ => reads += 1,
                    recv(timer) -> _ => break,
                }
            }
            let took = start.elapsed();
            drop(done_tx);
            for s in senders {
                s.join().unwrap();
            }
            heavy.finish();
            let _ = reads;
            took
        });
        assert!(
            took < BOUND,
            "{kind:?}: a 20 ms after arm beside ready senders took {took:?}"
        );
    });
}

#[test]
fn timer_fairness_under_load_one_worker() {
    timer_fairness_under_load(Rt::One);
}

#[test]
fn timer_fairness_under_load_two_workers() {
    timer_fairness_under_load(Rt::Two);
}

/// A select loop on a `tick(20 ms)` arm with a `default` (which polls and
/// spins 1 ms), beside a heavy pair: in 1 s of ticking the loop sees
/// ticks, and no gap between two ticks exceeds 2 s.
fn tick_select_default_beside_a_heavy_pair(kind: Rt) {
    under_load(3, || {
        let (ticks, gap) = on(kind, || {
            let (done_tx, done_rx) = bounded::<()>(0);
            let heavy = pair(ms(25), &done_rx, false);
            let light = pair(Duration::from_micros(5), &done_rx, false);
            let ticker = tick(ms(20));
            let start = Instant::now();
            let mut last = start;
            let mut gap = Duration::ZERO;
            let mut ticks = 0u32;
            while start.elapsed() < ms(1000) {
                select! {
                    recv(ticker) -> _ => {
                        ticks += 1;
                        gap = gap.max(last.elapsed());
                        last = Instant::now();
                    }
                    default => spin(ms(1)),
                }
            }
            gap = gap.max(last.elapsed());
            drop(done_tx);
            heavy.finish();
            light.finish();
            (ticks, gap)
        });
        assert!(ticks >= 2, "{kind:?}: only {ticks} ticks of 20 ms in 1 s");
        assert!(gap < BOUND, "{kind:?}: {gap:?} between two ticks of 20 ms");
    });
}

#[test]
fn a_tick_arm_in_a_select_default_loop_beside_pairs_one_worker() {
    tick_select_default_beside_a_heavy_pair(Rt::One);
}

#[test]
fn a_tick_arm_in_a_select_default_loop_beside_pairs_two_workers() {
    tick_select_default_beside_a_heavy_pair(Rt::Two);
}

// ---------------------------------------------------------------------------
// Timeouts of jobs.

/// `with_timeout(100 ms)` around a body parked for an hour, beside a heavy
/// and a light pair and two yield loops: the timeout ends it within 2 s.
fn with_timeout_beside_pairs_and_yielders(kind: Rt) {
    under_load(3, || {
        let took = on(kind, || {
            let (done_tx, done_rx) = bounded::<()>(0);
            let pairs = heavy_and_light(ms(25), &done_rx);
            let yielders = yielding_crunchers(2, Duration::ZERO);
            let s = Instant::now();
            let r = fiber::with_timeout(ms(100), || fiber::sleep(Duration::from_secs(3600)));
            let took = s.elapsed();
            assert!(r.is_err(), "the hour-long sleep ended: {r:?}");
            yielders.stop();
            drop(done_tx);
            finish_all(pairs);
            took
        });
        assert!(took >= ms(100), "timed out early: {took:?}");
        assert!(took < BOUND, "{kind:?}: with_timeout(100 ms) returned after {took:?}");
    });
}

#[test]
fn with_timeout_beside_pairs_and_yield_loops_one_worker() {
    with_timeout_beside_pairs_and_yielders(Rt::One);
}

#[test]
fn with_timeout_beside_pairs_and_yield_loops_two_workers() {
    with_timeout_beside_pairs_and_yielders(Rt::Two);
}

// ---------------------------------------------------------------------------
// Wakes from plain threads.

/// A plain thread sends a timestamp every 20 ms (30 messages) to a fiber
/// that receives beside a heavy and a light pair: each message is taken
/// within 2 s of its send and none is lost.
fn thread_wakes_beside_pairs(kind: Rt) {
    under_load(3, || {
        let lat = on(kind, || {
            let (done_tx, done_rx) = bounded::<()>(0);
            let pairs = heavy_and_light(ms(25), &done_rx);
            let (tx, rx) = bounded::<Instant>(0);
            let sender = std::thread::spawn(move || {
                for _ in 0..30 {
                    std::thread::sleep(ms(20));
                    tx.send(Instant::now()).unwrap();
                }
            });
            let receiver = fiber::spawn(move || {
                let mut worst = Duration::ZERO;
                let mut n = 0;
                for sent in rx.iter() {
                    worst = worst.max(sent.elapsed());
                    n += 1;
                }
                (n, worst)
            });
            let (n, worst) = receiver.join().unwrap();
            sender.join().unwrap();
            drop(done_tx);
            finish_all(pairs);
            assert_eq!(n, 30, "messages lost");
            worst
        });
        assert!(lat < BOUND, "{kind:?}: a plain thread's send was taken after {lat:?}");
    });
}

#[test]
fn wakes_from_a_plain_thread_beside_pairs_one_worker() {
    thread_wakes_beside_pairs(Rt::One);
}

#[test]
fn wakes_from_a_plain_thread_beside_pairs_two_workers() {
    thread_wakes_beside_pairs(Rt::Two);
}

/// A plain thread spawns fibers through a `Handle` every 20 ms while the
/// runtime runs pairs and long yielding turns: each spawned fiber starts
/// within 2 s.
fn handle_spawns_beside_pairs(kind: Rt) {
    under_load(3, || {
        within(60, move || {
            let rt = build(kind);
            let handle = rt.handle();
            let (done_tx, done_rx) = bounded::<()>(0);
            let (ready_tx, ready_rx) = bounded::<()>(1);
            let root = rt.spawn(move || {
                let pairs = heavy_and_light(ms(25), &done_rx);
                let stop = Arc::new(AtomicBool::new(false));
                let s2 = stop.clone();
                let long = fiber::spawn(move || {
                    while !s2.load(SeqCst) {
                        spin(ms(10));
                        fiber::yield_now().unwrap();
                    }
                });
                ready_tx.send(()).unwrap();
                let _ = done_rx.recv();
                stop.store(true, SeqCst);
                long.join().unwrap();
                finish_all(pairs);
            });
            ready_rx.recv().unwrap();
            let mut worst = Duration::ZERO;
            for _ in 0..20 {
                std::thread::sleep(ms(20));
                let sent = Instant::now();
                let h = handle.spawn(move || sent.elapsed());
                worst = worst.max(h.join().unwrap());
            }
            drop(done_tx);
            root.join().unwrap();
            assert!(worst < BOUND, "{kind:?}: a Handle::spawn started after {worst:?}");
        })
    });
}

#[test]
fn handle_spawns_from_a_plain_thread_beside_pairs_one_worker() {
    handle_spawns_beside_pairs(Rt::One);
}

#[test]
fn handle_spawns_from_a_plain_thread_beside_pairs_two_workers() {
    handle_spawns_beside_pairs(Rt::Two);
}

// ---------------------------------------------------------------------------
// Progress of every member of a mixed group.

/// A mixed group on one runtime: a heavy pair (20 ms turns), a light pair,
/// two yield loops, two fibers computing 15 ms between yields, two
/// `select`/`default` pollers and a sleeper loop (5 ms sleeps). Each
/// member counts its rounds; every member makes progress in each of two
/// windows of 1.5 s (turns are at most 20 ms, so a member idle for 1.5 s
/// waited behind some 75 turns).
fn mixed_group_progress(kind: Rt) {
    under_load(3, || {
        on(kind, move || {
            let (done_tx, done_rx) = bounded::<()>(0);
            let stop = Arc::new(AtomicBool::new(false));
            let names = ["yield-0", "yield-1", "long-0", "long-1", "poll-0", "poll-1", "sleeper"];
            let counters: Vec<Arc<AtomicU64>> = names.iter().map(|_| Arc::new(AtomicU64::new(0))).collect();
            let mut members = Vec::new();
            let pairs = heavy_and_light(ms(20), &done_rx);
            for (i, name) in names.iter().enumerate() {
                let (stop, c, done_rx) = (stop.clone(), counters[i].clone(), done_rx.clone());
                let role = name.split('-').next().unwrap().to_string();
                members.push(fiber::spawn(move || {
                    while !stop.load(SeqCst) {
                        match role.as_str() {
                            "yield" => fiber::yield_now().unwrap(),
                            "long" => {
                                spin(ms(15));
                                fiber::yield_now().unwrap();
                            }
                            "poll" => {
                                select! {
                                    recv(done_rx) -> _ => return,
                                    default => {}
                                }
                            }
                            _ => fiber::sleep(ms(5)).unwrap(),
                        }
                        c.fetch_add(1, SeqCst);
                    }
                }));
            }
            // Two windows of 1.5 s: every member advances in each.
            let mut stalled = Vec::new();
            let mut before: Vec<u64> = counters.iter().map(|c| c.load(SeqCst)).collect();
            for w in 0..2 {
                let s = Instant::now();
                while s.elapsed() < ms(1500) {
                    fiber::sleep(ms(50)).unwrap();
                }
                let now: Vec<u64> = counters.iter().map(|c| c.load(SeqCst)).collect();
                for i in 0..names.len() {
                    if now[i] == before[i] {
                        stalled.push(format!("{} in window {w}", names[i]));
                    }
                }
                before = now;
            }
            stop.store(true, SeqCst);
            drop(done_tx);
            for m in members {
                m.join().unwrap();
            }
            let turns: Vec<Vec<u64>> = pairs.into_iter().map(|p| p.finish()).collect();
            assert!(stalled.is_empty(), "{kind:?}: no progress for 1.5 s: {stalled:?}");
            for t in turns {
                assert!(t.iter().all(|&n| n > 0), "{kind:?}: a pair member never ran: {t:?}");
            }
        })
    });
}

#[test]
fn every_member_of_a_mixed_group_progresses_one_worker() {
    mixed_group_progress(Rt::One);
}

#[test]
fn every_member_of_a_mixed_group_progresses_two_workers() {
    mixed_group_progress(Rt::Two);
}

#[test]
fn every_member_of_a_mixed_group_progresses_default_runtime() {
    mixed_group_progress(Rt::Default);
}

// ---------------------------------------------------------------------------
// Pinned fibers.

/// On two workers, a heavy pair pinned to one worker and a pinned sleeper
/// spawned from the same fiber (so pinned to the same worker, if the pair
/// starts there): the pinned sleeper's 100 ms sleeps end within 2 s each
/// (its wake must reach its home while the home runs 25 ms turns).
#[test]
fn a_pinned_sleeper_beside_a_pinned_heavy_pair_two_workers() {
    under_load(3, || {
        let worst = on(Rt::Two, || {
            let (done_tx, done_rx) = bounded::<()>(0);
            let heavy = pair(ms(25), &done_rx, true);
            let light = pair(Duration::from_micros(5), &done_rx, true);
            let sleeper = fiber::spawn_pinned(|| {
                let mut worst = Duration::ZERO;
                for _ in 0..5 {
                    let s = Instant::now();
                    fiber::sleep(ms(100)).unwrap();
                    worst = worst.max(s.elapsed());
                }
                worst
            });
            let worst = sleeper.join().unwrap();
            drop(done_tx);
            heavy.finish();
            light.finish();
            worst
        });
        assert!(worst < BOUND, "a pinned 100 ms sleep took {worst:?}");
    });
}

/// A pinned fiber woken by a plain thread (20 ms apart) beside a pinned
/// heavy pair on one worker: each wake is taken within 2 s.
#[test]
fn a_pinned_receiver_woken_by_a_thread_beside_a_pinned_heavy_pair_one_worker() {
    under_load(3, || {
        let worst = on(Rt::One, || {
            let (done_tx, done_rx) = bounded::<()>(0);
            let heavy = pair(ms(25), &done_rx, true);
            let light = pair(Duration::from_micros(5), &done_rx, true);
            let (tx, rx) = unbounded::<Instant>();
            let receiver = fiber::spawn_pinned(move || {
                let mut worst = Duration::ZERO;
                let mut n = 0;
                for sent in rx.iter() {
                    worst = worst.max(sent.elapsed());
                    n += 1;
                }
                assert_eq!(n, 20, "messages lost");
                worst
            });
            let sender = std::thread::spawn(move || {
                for _ in 0..20 {
                    std::thread::sleep(ms(20));
                    tx.send(Instant::now()).unwrap();
                }
            });
            let worst = receiver.join().unwrap();
            sender.join().unwrap();
            drop(done_tx);
            heavy.finish();
            light.finish();
            worst
        });
        assert!(
            worst < BOUND,
            "a thread's wake of a pinned fiber was taken after {worst:?}"
        );
    });
}

// ---------------------------------------------------------------------------
// Chains of timer wakes.

/// Go's AfterFunc chain (TestAfterStress shape) under load: a chain of 30
/// fibers, each sleeping 5 ms and then spawning the next, beside a heavy
/// and a light pair on two workers: the chain (nominally 150 ms) completes
/// within 10 s and no link sleeps more than 2 s.
#[test]
fn a_chain_of_sleep_then_spawn_links_beside_pairs_two_workers() {
    fn link(left: u32, worst: Arc<Mutex<Duration>>, end: Sender<()>) {
        let s = Instant::now();
        fiber::sleep(ms(5)).unwrap();
        let took = s.elapsed();
        {
            let mut w = worst.lock().unwrap();
            *w = (*w).max(took);
        }
        if left == 0 {
            end.send(()).unwrap();
        } else {
            fiber::spawn(move || link(left - 1, worst, end));
        }
    }
    under_load(3, || {
        let (total, worst) = on(Rt::Two, || {
            let (done_tx, done_rx) = bounded::<()>(0);
            let pairs = heavy_and_light(ms(25), &done_rx);
            let worst = Arc::new(Mutex::new(Duration::ZERO));
            let (end_tx, end_rx) = bounded::<()>(1);
            let start = Instant::now();
            let w2 = worst.clone();
            fiber::spawn(move || link(29, w2, end_tx));
            let r = end_rx.recv_timeout(Duration::from_secs(20));
            let total = start.elapsed();
            drop(done_tx);
            finish_all(pairs);
            r.expect("the chain ended");
            let w = *worst.lock().unwrap();
            (total, w)
        });
        assert!(worst < BOUND, "a 5 ms link slept {worst:?}");
        assert!(total < Duration::from_secs(10), "30 links of 5 ms took {total:?}");
    });
}

/// TestAfterQueuing under load: fibers sleeping 0..9 x 20 ms, spawned in a
/// shuffled order, beside a heavy pair on one worker, report into one
/// channel: each wakes within 2 s of its deadline (order is not asserted:
/// a 25 ms turn may hold two deadlines 20 ms apart).
#[test]
fn after_queuing_beside_a_heavy_pair_one_worker() {
    under_load(3, || {
        let late = on(Rt::One, || {
            let (done_tx, done_rx) = bounded::<()>(0);
            let heavy = pair(ms(25), &done_rx, false);
            let (tx, rx) = unbounded::<Duration>();
            let start = Instant::now();
            for i in [5u32, 0, 3, 8, 1, 9, 4, 2, 7, 6] {
                let tx = tx.clone();
                fiber::spawn(move || {
                    let deadline = start + ms(20) * i;
                    fiber::sleep_until(deadline).unwrap();
                    tx.send(deadline.elapsed()).unwrap();
                });
            }
            drop(tx);
            let late: Vec<Duration> = rx.iter().collect();
            drop(done_tx);
            heavy.finish();
            late
        });
        assert_eq!(late.len(), 10);
        let max = late.iter().max().unwrap();
        assert!(*max < BOUND, "a sleeper woke {max:?} after its deadline ({late:?})");
    });
}

// ---------------------------------------------------------------------------
// Long turns that yield, without a ping-pong pair.

/// Four fibers each computing 20 ms between yields on one worker (no pair:
/// every turn ends in a yield) and a sleeper: the sleeper's five 50 ms
/// sleeps each end within 2 s, and each cruncher runs.
fn crunchers_and_a_sleeper(kind: Rt, turn: Duration) {
    under_load(3, || {
        let (worst, rounds) = on(kind, move || {
            let crunchers = yielding_crunchers(4, turn);
            let mut worst = Duration::ZERO;
            for _ in 0..5 {
                let s = Instant::now();
                fiber::sleep(ms(50)).unwrap();
                worst = worst.max(s.elapsed());
            }
            (worst, crunchers.stop())
        });
        assert!(
            worst < BOUND,
            "{kind:?}: a 50 ms sleep beside yielding crunchers took {worst:?}"
        );
        assert!(
            rounds.iter().all(|&n| n > 0),
            "{kind:?}: a cruncher never ran: {rounds:?}"
        );
    });
}

#[test]
fn a_sleeper_beside_crunchers_that_yield_one_worker() {
    crunchers_and_a_sleeper(Rt::One, ms(20));
}

#[test]
fn a_sleeper_beside_crunchers_that_yield_elastic() {
    crunchers_and_a_sleeper(Rt::ElasticOne, ms(30));
}

// ---------------------------------------------------------------------------
// Lost wake-ups.

/// Many rendezvous hand-offs between fibers whose turns are long and fast
/// by turns, on two workers under load: a token ring of 6 fibers, where
/// every third member computes 5 ms, passes a token 600 times; the ring
/// completes (no lost wake-up) within 20 s.
#[test]
fn a_token_ring_with_long_and_fast_members_completes_two_workers() {
    under_load(4, || {
        let took = on(Rt::Two, || {
            const N: usize = 6;
            const LAPS: u32 = 100;
            let chans: Vec<_> = (0..N).map(|_| bounded::<u32>(0)).collect();
            let mut members = Vec::new();
            for i in 1..N {
                let rx = chans[i].1.clone();
                let tx = chans[(i + 1) % N].0.clone();
                members.push(fiber::spawn(move || {
                    for v in rx.iter() {
                        if i % 3 == 0 {
                            spin(ms(5));
                        }
                        if tx.send(v).is_err() {
                            return;
                        }
                    }
                }));
            }
            let start = Instant::now();
            for lap in 0..LAPS {
                chans[1].0.send(lap).unwrap();
                let back = chans[0].1.recv_timeout(Duration::from_secs(10)).expect("a lap ended");
                assert_eq!(back, lap);
            }
            let took = start.elapsed();
            drop(chans);
            for m in members {
                m.join().unwrap();
            }
            took
        });
        assert!(took < Duration::from_secs(20), "100 laps took {took:?}");
    });
}

// ---------------------------------------------------------------------------
// Many timer-woken fibers refilling the queues beside a heavy pair.

/// Twenty fibers each sleeping 10 ms ten times in a row, beside a heavy
/// pair (20 ms turns) and a light pair: the timer-woken fibers keep
/// refilling the worker's queues while the pairs hand each other the
/// runnext slot. Every single 10 ms sleep ends within 1 s: the sleepers'
/// own work is microseconds, so a fair order (Go's: the runnext hand-off
/// inherits the time slice, and a goroutine preempted after 10 ms goes to
/// the global queue behind the timer-woken ones) has each woken sleeper
/// wait about one heavy turn; 1 s is 50 heavy turns.
fn sleeper_loops_beside_pairs(kind: Rt, bound: Duration) {
    under_load(3, || {
        let worst = on(kind, || {
            let (done_tx, done_rx) = bounded::<()>(0);
            let pairs = heavy_and_light(ms(20), &done_rx);
            let loops: Vec<_> = (0..20)
                .map(|_| {
                    fiber::spawn(|| {
                        let mut worst = Duration::ZERO;
                        for _ in 0..10 {
                            let s = Instant::now();
                            fiber::sleep(ms(10)).unwrap();
                            worst = worst.max(s.elapsed());
                        }
                        worst
                    })
                })
                .collect();
            let worst: Vec<Duration> = loops.into_iter().map(|h| h.join().unwrap()).collect();
            drop(done_tx);
            finish_all(pairs);
            worst
        });
        let max = worst.iter().max().unwrap();
        assert!(
            *max < bound,
            "{kind:?}: a 10 ms sleep took {max:?} (worst of each sleeper: {worst:?})"
        );
    });
}

/// (Failed before the fix: the timer wakes go through the global queue (the monitor fires them during 20 ms turns) and back into the LIFO deque, served ~1 per 16 runnext hand-offs: 10 ms sleeps take 1.1-2.3 s.)
#[test]
fn twenty_sleeper_loops_beside_pairs_one_worker() {
    sleeper_loops_beside_pairs(Rt::One, Duration::from_secs(1));
}

#[test]
fn twenty_sleeper_loops_beside_pairs_two_workers() {
    sleeper_loops_beside_pairs(Rt::Two, Duration::from_secs(1));
}

/// Twenty fibers each waiting on its own channel, all woken at once by a
/// plain thread (five rounds, 300 ms apart), beside a heavy pair (20 ms
/// turns) on one worker: every wake is taken within 1 s of the send (50
/// heavy turns; a fair order runs the twenty, microseconds each, after at
/// most a turn or two) and none is lost.
/// (Failed before the fix: the wakes go to the global queue (the worker looks stalled mid-turn) and trickle back through the LIFO deque: p50 ~0.5 s, max 1.2-2.0 s.)
#[test]
fn twenty_fibers_woken_at_once_by_a_thread_beside_a_heavy_pair_one_worker() {
    under_load(3, || {
        let lat = on(Rt::One, || {
            let (done_tx, done_rx) = bounded::<()>(0);
            let heavy = pair(ms(20), &done_rx, false);
            let mut txs = Vec::new();
            let mut receivers = Vec::new();
            for _ in 0..20 {
                let (tx, rx) = bounded::<Instant>(1);
                txs.push(tx);
                receivers.push(fiber::spawn(move || {
                    rx.iter().map(|sent| sent.elapsed()).collect::<Vec<_>>()
                }));
            }
            let waker = std::thread::spawn(move || {
                for _ in 0..5 {
                    std::thread::sleep(ms(300));
                    let now = Instant::now();
                    for tx in &txs {
                        tx.send(now).unwrap();
                    }
                }
            });
            let lat: Vec<Vec<Duration>> = receivers.into_iter().map(|h| h.join().unwrap()).collect();
            waker.join().unwrap();
            drop(done_tx);
            heavy.finish();
            lat
        });
        assert!(lat.iter().all(|l| l.len() == 5), "wakes lost: {lat:?}");
        let mut all: Vec<u128> = lat.iter().flatten().map(|d| d.as_millis()).collect();
        all.sort();
        let max = lat.iter().flatten().max().unwrap();
        assert!(
            *max < Duration::from_secs(1),
            "a thread's wake was taken after {max:?} (ms: p50 {}, p90 {}, max {})",
            all[all.len() / 2],
            all[all.len() * 9 / 10],
            all[all.len() - 1]
        );
    });
}

/// Ten yield loops beside a heavy pair (20 ms turns) on one worker, for
/// 3 s: each yield loop keeps getting turns (Go's `TestYieldProgress`
/// shape: a `Gosched` loop is not starved), no yield returns after more
/// than 2 s.
#[test]
fn ten_yield_loops_beside_a_heavy_pair_progress_one_worker() {
    under_load(3, || {
        let r = on(Rt::One, || {
            let (done_tx, done_rx) = bounded::<()>(0);
            let heavy = pair(ms(20), &done_rx, false);
            let stop = Arc::new(AtomicBool::new(false));
            let loops: Vec<_> = (0..10)
                .map(|_| {
                    let stop = stop.clone();
                    fiber::spawn(move || {
                        let (mut n, mut worst) = (0u64, Duration::ZERO);
                        while !stop.load(SeqCst) {
                            let s = Instant::now();
                            fiber::yield_now().unwrap();
                            worst = worst.max(s.elapsed());
                            n += 1;
                        }
                        (n, worst)
                    })
                })
                .collect();
            fiber::sleep(ms(3000)).unwrap();
            stop.store(true, SeqCst);
            let r: Vec<(u64, Duration)> = loops.into_iter().map(|h| h.join().unwrap()).collect();
            drop(done_tx);
            heavy.finish();
            r
        });
        for (n, worst) in &r {
            assert!(*n >= 2, "a yield loop yielded {n} times in 3 s: {r:?}");
            assert!(*worst < BOUND, "a yield returned after {worst:?}: {r:?}");
        }
    });
}

// ---------------------------------------------------------------------------
// Every worker spinning: growth must take the timer-woken fiber.

/// As many spinners as the runtime has workers at the start, each spinning
/// without a yield point until a flag (or 6 s); a sleeper of 100 ms must
/// wake and set the flag: on an elastic runtime the monitor grows the pool
/// (a worker stuck for 10 ms) and the grown worker runs the sleeper, so it
/// wakes within 2 s, long before the spinners give up.
fn sleeper_while_every_worker_spins(kind: Rt, spinners: usize) {
    under_load(3, || {
        let (woke, ended_by_flag) = on(kind, move || {
            let flag = Arc::new(AtomicBool::new(false));
            let (started_tx, started_rx) = unbounded::<()>();
            let spin_handles: Vec<_> = (0..spinners)
                .map(|_| {
                    let (flag, started_tx) = (flag.clone(), started_tx.clone());
                    fiber::spawn(move || {
                        started_tx.send(()).unwrap();
                        crate::common::spin_until(&flag, Duration::from_secs(6))
                    })
                })
                .collect();
            let f2 = flag.clone();
            let sleeper = fiber::spawn(move || {
                let s = Instant::now();
                fiber::sleep(ms(100)).unwrap();
                let took = s.elapsed();
                f2.store(true, std::sync::atomic::Ordering::Release);
                took
            });
            // The root parks here; the spinners take every worker.
            let woke = sleeper.join().unwrap();
            for _ in 0..spinners {
                started_rx.recv().unwrap();
            }
            let ended: Vec<bool> = spin_handles.into_iter().map(|h| h.join().unwrap()).collect();
            (woke, ended)
        });
        assert!(
            woke < BOUND,
            "{kind:?}: the sleeper woke after {woke:?} while every worker spun"
        );
        assert!(
            ended_by_flag.iter().all(|&b| b),
            "{kind:?}: a spinner gave up: {ended_by_flag:?}"
        );
    });
}

#[test]
fn a_sleeper_wakes_while_the_only_worker_spins_elastic() {
    sleeper_while_every_worker_spins(Rt::ElasticOne, 1);
}

#[test]
fn a_sleeper_wakes_while_every_worker_spins_default_runtime() {
    sleeper_while_every_worker_spins(Rt::Default, 2);
}

#[test]
fn a_sleeper_wakes_while_three_spinners_hold_the_growing_pool_default_runtime() {
    sleeper_while_every_worker_spins(Rt::Default, 3);
}

// ---------------------------------------------------------------------------
// Lost wake-ups at timer deadlines.

/// A plain thread sends 300 values on a rendezvous channel, pausing 0 to 2
/// ms between sends; a fiber takes them with `recv_timeout(1 ms)` (counting
/// timeouts and retrying), beside a heavy (5 ms turns) and a light pair: a
/// send racing the deadline is never lost (every value arrives, in order)
/// and the whole exchange ends.
fn recv_timeout_races_lose_nothing(kind: Rt) {
    under_load(3, || {
        let (got, timeouts) = on(kind, || {
            let (done_tx, done_rx) = bounded::<()>(0);
            let pairs = heavy_and_light(ms(5), &done_rx);
            let (tx, rx) = bounded::<u32>(0);
            let sender = std::thread::spawn(move || {
                for i in 0..300u32 {
                    if i % 3 != 0 {
                        std::thread::sleep(Duration::from_micros(u64::from(i % 7) * 300));
                    }
                    tx.send(i).unwrap();
                }
            });
            let receiver = fiber::spawn(move || {
                let mut got = Vec::new();
                let mut timeouts = 0u32;
                let start = Instant::now();
                loop {
                    match rx.recv_timeout(ms(1)) {
                        Ok(v) => got.push(v),
                        Err(e) if e.is_timeout() => timeouts += 1,
                        Err(_) => break,
                    }
                    assert!(start.elapsed() < Duration::from_secs(30), "the exchange did not end");
                }
                (got, timeouts)
            });
            let r = receiver.join().unwrap();
            sender.join().unwrap();
            drop(done_tx);
            finish_all(pairs);
            r
        });
        assert_eq!(
            got,
            (0..300).collect::<Vec<u32>>(),
            "{kind:?}: values lost or reordered"
        );
        // On one worker the receiver runs between 5 ms turns, by which time
        // the sender always waits: no timeout there; on two it races.
        if matches!(kind, Rt::Two) {
            assert!(timeouts > 0, "{kind:?}: no timeout raced a send");
        }
    });
}

#[test]
fn recv_timeouts_racing_thread_sends_lose_nothing_one_worker() {
    recv_timeout_races_lose_nothing(Rt::One);
}

#[test]
fn recv_timeouts_racing_thread_sends_lose_nothing_two_workers() {
    recv_timeout_races_lose_nothing(Rt::Two);
}

/// The same race with a `select` whose other arm is `after(1 ms)`: a fiber
/// woken by the sender and by its timer at once takes one arm, and a value
/// of a completed receive is never dropped.
#[test]
fn select_after_arms_racing_thread_sends_lose_nothing_two_workers() {
    under_load(3, || {
        let got = on(Rt::Two, || {
            let (done_tx, done_rx) = bounded::<()>(0);
            let pairs = heavy_and_light(ms(5), &done_rx);
            let (tx, rx) = bounded::<u32>(0);
            let sender = std::thread::spawn(move || {
                for i in 0..300u32 {
                    std::thread::sleep(Duration::from_micros(u64::from(i % 5) * 400));
                    tx.send(i).unwrap();
                }
            });
            let mut got = Vec::new();
            let start = Instant::now();
            loop {
                select! {
                    recv(rx) -> v => match v {
                        Ok(v) => got.push(v),
                        Err(_) => break,
                    },
                    recv(after(ms(1))) -> _ => {}
                }
                assert!(start.elapsed() < Duration::from_secs(30), "the exchange did not end");
            }
            sender.join().unwrap();
            drop(done_tx);
            finish_all(pairs);
            got
        });
        assert_eq!(got, (0..300).collect::<Vec<u32>>(), "values lost or reordered");
    });
}

/// A `Condvar::wait_timeout(50 ms)` with no notifier, five times, beside a
/// heavy and a light pair that share the mutex's worker: each wait times
/// out within 2 s; then a notify from a plain thread ends a long wait
/// within 2 s.
fn condvar_timeouts_beside_pairs(kind: Rt) {
    under_load(3, || {
        let (worst, notified) = on(kind, || {
            let (done_tx, done_rx) = bounded::<()>(0);
            let pairs = heavy_and_light(ms(25), &done_rx);
            let state = Arc::new((fiber::sync::Mutex::new(false), fiber::sync::Condvar::new()));
            let mut worst = Duration::ZERO;
            {
                let (m, cv) = &*state;
                let mut g = m.lock().unwrap();
                for _ in 0..5 {
                    let s = Instant::now();
                    let (g2, r) = cv.wait_timeout(g, ms(50)).unwrap();
                    g = g2;
                    assert!(r.timed_out());
                    worst = worst.max(s.elapsed());
                }
            }
            let st = state.clone();
            let notifier = std::thread::spawn(move || {
                std::thread::sleep(ms(50));
                let (m, cv) = &*st;
                *m.lock().unwrap() = true;
                let at = Instant::now();
                cv.notify_all();
                at
            });
            let notified = {
                let (m, cv) = &*state;
                let g = m.lock().unwrap();
                let (g, r) = cv
                    .wait_timeout_while(g, Duration::from_secs(20), |ready| !*ready)
                    .unwrap();
                assert!(!r.timed_out() && *g, "the notify was lost");
                Instant::now()
            };
            let at = notifier.join().unwrap();
            drop(done_tx);
            finish_all(pairs);
            (worst, notified.saturating_duration_since(at))
        });
        assert!(worst < BOUND, "{kind:?}: a 50 ms condvar wait_timeout took {worst:?}");
        assert!(
            notified < BOUND,
            "{kind:?}: a notify from a thread was seen after {notified:?}"
        );
    });
}

#[test]
fn condvar_timeouts_and_a_thread_notify_beside_pairs_one_worker() {
    condvar_timeouts_beside_pairs(Rt::One);
}

#[test]
fn condvar_timeouts_and_a_thread_notify_beside_pairs_two_workers() {
    condvar_timeouts_beside_pairs(Rt::Two);
}
