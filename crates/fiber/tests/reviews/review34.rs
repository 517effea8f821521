//! Adversarial review, round 34: lost wake-ups and hangs in the scheduler
//! under load.
//!
//! A seeded random-program fuzzer (same generator and seed driver as
//! rounds 27 and 29, `crate::common::fuzz`) whose programs mix, on one fixed
//! worker, two fixed workers and an elastic pool (`workers(1)
//! .max_workers(4)`), with 0 to 3 plain "hog" threads spinning beside:
//! `fiber::sleep` (zero, 1 to 60 ms), `yield_now`, spinning without a
//! yield point (1 to 30 ms), spawn and join, channel hand-offs (unbounded,
//! rendezvous and small bounded) between fibers and plain threads in both
//! directions, received by `recv`, `recv_timeout` loops, `select!` with an
//! `after` arm or a `default(timeout)` arm, and polled `try_recv` with
//! yields, `fiber::blocking` calls, and one-shot wakes from plain threads.
//! Every wait has a partner that always comes (the channel graph has no
//! cycle: a consumer has one input, and the producer of an input has a
//! lower index), so a hang is a runtime bug; every program runs under a
//! hang guard and a watchdog that prints the runtime's dump and counters
//! before the guard fires. Checked exactly: every message arrives once and
//! in order, no timeout or sleep ends early, every join returns its value.
//!
//! Targeted tests around the timer paths of `fiber-sched` (`worker.rs`:
//! the run loop's own-wheel poll `own_next` / `TIMER_POLL`, `fire_wheel`
//! and its `TimerPass`, the idle workers' `fire_any_due`, `wake_at`;
//! `Shared::fire_timers_from_monitor` with its `GRACE_TICKS` cutoff for a
//! busy owner; `timer.rs`'s wheel and `monitor.rs`'s rescue of a stuck
//! worker's queues): the monitor firing a busy worker's wheel while the
//! worker arms and fires it; a fiber woken by a timer pass while another
//! wake races it (a message arriving at the deadline of a `recv_timeout`);
//! `yield_now` loops beside timer-woken, inbox-woken and global-queue
//! fibers; and the shape of the CI hang of
//! `reviews/review12.rs::a_sleeper_beside_crunchers_that_yield_one_worker`
//! repeated many times.
//!
//! Found (the tests marked "Failed before the fix"): a `select!` whose timer arm
//! (`after`, `at`) is already due completes without a yield point, so a
//! loop of them holds a fixed worker for ever; and fibers that compute
//! longer than the monitor's stuck threshold between yields put the
//! queues in a cycle (the monitor moves the busy worker's deque to the
//! global queue oldest first, reversing the order `take_global_batch`
//! gave it; the worker runs the head and batches the rest back) in which
//! two fibers in the middle never run: crunchers starve on one worker, and
//! a timer-woken sleeper waits 15 s to for ever on two (the likely
//! mechanism of the CI hang of round 12's test).
//!
//! Long runs: `FUZZ_SEEDS=n FUZZ_START=k cargo test -p fiber --features
//! fiber-core/spec-assert --test reviews -- --ignored
//! review34::fuzz_long` (and `ci_shape_long`). `R34_HANG_PAUSE=1` makes the watchdog
//! of a hung program print the process id and keep the process alive for
//! a debugger instead of letting the hang guard fail the test.

use crate::common::*;

use crate::common::fuzz::{env_u64, quiet_panics, run_seeds, Rng};
use crate::common::load::{hogs, spin, yielding_crunchers};
use fiber::chan::{after, bounded, unbounded, Receiver, RecvTimeoutError, Sender, TryRecvError};
use fiber::select;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
#[allow(unused_imports)]
use std::sync::Mutex;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------
// Harness.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Exactly one worker.
    One,
    /// Exactly two workers.
    Two,
    /// One worker to start, up to four.
    Elastic,
}

fn build(kind: Kind) -> fiber::Runtime {
    match kind {
        Kind::One => rt_fixed_grace(1, ms(300)),
        Kind::Two => rt_fixed_grace(2, ms(300)),
        Kind::Elastic => fiber::Runtime::builder()
            .workers(1)
            .max_workers(4)
            .shutdown_timeout(ms(300))
            .build()
            .unwrap(),
    }
}

/// Run `body` as the root fiber of a fresh runtime of `kind`. A watchdog
/// prints the runtime's dump and counters if the body is not done after
/// `watch_secs` (then, with `R34_HANG_PAUSE` set, it keeps the process
/// alive for a debugger); the caller's hang guard fails the test.
fn watched<T: Send + 'static>(kind: Kind, watch_secs: u64, what: String, body: impl FnOnce() -> T + Send) -> T {
    let rt = Arc::new(build(kind));
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let dog_rt = rt.clone();
    let dog = std::thread::spawn(move || {
        if let Err(mpsc::RecvTimeoutError::Timeout) = done_rx.recv_timeout(Duration::from_secs(watch_secs)) {
            eprintln!(
                "HANG WATCHDOG ({what}, {kind:?}): not done after {watch_secs} s\n{}\n{:#?}",
                dog_rt.dump(),
                dog_rt.stats()
            );
            if std::env::var_os("R34_HANG_PAUSE").is_some() {
                eprintln!("HANG WATCHDOG: pid {} paused for a debugger", std::process::id());
                loop {
                    std::thread::sleep(Duration::from_secs(3600));
                }
            }
            // Keep the runtime alive (its root is stuck): the hang guard
            // fails the test.
            std::mem::forget(dog_rt);
        }
    });
    let out = rt.block_on(body);
    let _ = done_tx.send(());
    let _ = dog.join();
    out
}

// ---------------------------------------------------------------------------
// The fuzzer.

/// A message source an actor feeds (it is the pipe's only producer).
#[derive(Clone, Copy, Debug)]
enum Flavor {
    Unbounded,
    Rendezvous,
    Bounded(usize),
}

#[derive(Clone, Copy, Debug)]
enum RecvMode {
    Plain,
    Timeout(Duration),
    SelectAfter(Duration),
    SelectDefault(Duration),
    Poll,
}

#[derive(Clone, Copy, Debug)]
enum SendMode {
    Plain,
    /// `select!` with a send arm and an `after` arm, retried until sent.
    SelectAfter(Duration),
}

#[derive(Clone, Debug)]
enum Op {
    Sleep(Duration),
    Yield,
    Spin(Duration),
    /// Spawn a child running these fillers, join it (fibers only).
    SpawnJoin(Vec<Op>),
    /// `fiber::blocking` spinning or sleeping for the duration.
    Blocking(Duration),
    /// A plain thread wakes this actor after the duration (one-shot).
    ThreadWake(Duration),
    /// `select!` on `after(d)` alone.
    After(Duration),
    /// Send the next message of output pipe `k`.
    Send(usize, SendMode),
    /// Receive the next message of the input pipe.
    Recv(RecvMode),
}

struct Pipe {
    tx: Sender<u64>,
    rx: Receiver<u64>,
    count: u64,
}

fn dur_sleep(rng: &mut Rng) -> Duration {
    match rng.below(10) {
        0..=1 => Duration::ZERO,
        2..=6 => ms(1 + rng.below(5)),
        7..=8 => ms(5 + rng.below(20)),
        _ => ms(20 + rng.below(41)),
    }
}

fn dur_spin(rng: &mut Rng) -> Duration {
    match rng.below(10) {
        0..=5 => ms(1 + rng.below(4)),
        6..=8 => ms(4 + rng.below(10)),
        _ => ms(14 + rng.below(17)),
    }
}

fn dur_timeout(rng: &mut Rng) -> Duration {
    match rng.below(6) {
        0 => Duration::ZERO,
        1..=3 => ms(1 + rng.below(3)),
        _ => ms(3 + rng.below(15)),
    }
}

/// A filler op (no channel), with `fiber` ops allowed or not.
fn filler(rng: &mut Rng, in_fiber: bool, depth: u32) -> Op {
    if !in_fiber {
        return match rng.below(3) {
            0 => Op::Sleep(dur_sleep(rng) / 2),
            1 => Op::Spin(dur_spin(rng) / 2),
            _ => Op::Yield,
        };
    }
    match rng.below(20) {
        0..=4 => Op::Sleep(dur_sleep(rng)),
        5..=8 => Op::Yield,
        9..=11 => Op::Spin(dur_spin(rng)),
        12..=13 if depth < 2 => {
            let n = 1 + rng.below(4);
            Op::SpawnJoin((0..n).map(|_| filler(rng, true, depth + 1)).collect())
        }
        14..=15 => Op::Blocking(ms(rng.below(6))),
        16..=17 => Op::ThreadWake(ms(rng.below(8))),
        18 => Op::After(dur_sleep(rng) / 2),
        _ => Op::Yield,
    }
}

/// What a fiber actor or thread actor reports.
type Outcome = Result<u64, String>;

/// Run `ops` on a fiber (`in_fiber`) or a plain thread; returns a checksum
/// of what it received, or the first violation.
fn run_ops(ops: &[Op], outs: &[Pipe], input: Option<&Pipe>, in_fiber: bool, tag: &str) -> Outcome {
    let mut next_out = vec![0u64; outs.len()];
    let mut next_in = 0u64;
    let mut sum = 0u64;
    let not_early = |t0: Instant, d: Duration, what: &str| -> Result<(), String> {
        let took = t0.elapsed();
        if took < d {
            Err(format!("{tag}: {what} of {d:?} ended after {took:?}"))
        } else {
            Ok(())
        }
    };
    for op in ops {
        match op {
            Op::Sleep(d) => {
                let t0 = Instant::now();
                if in_fiber {
                    fiber::sleep(*d).map_err(|_| format!("{tag}: sleep cancelled"))?;
                } else {
                    std::thread::sleep(*d);
                }
                not_early(t0, *d, "sleep")?;
            }
            Op::Yield => {
                if in_fiber {
                    fiber::yield_now().map_err(|_| format!("{tag}: yield cancelled"))?;
                } else {
                    std::thread::yield_now();
                }
            }
            Op::Spin(d) => spin(*d),
            Op::SpawnJoin(child) => {
                let child = child.clone();
                let ctag = format!("{tag}/child");
                let h = fiber::spawn(move || run_ops(&child, &[], None, true, &ctag).map(|s| s + 7));
                match h.join() {
                    Ok(Ok(7)) => {}
                    other => return Err(format!("{tag}: child join gave {other:?}")),
                }
            }
            Op::Blocking(d) => {
                let d = *d;
                let v = fiber::blocking(move || {
                    if d.as_millis() % 2 == 0 {
                        std::thread::sleep(d);
                    } else {
                        spin(d);
                    }
                    d.as_millis() as u64 + 11
                });
                if v != d.as_millis() as u64 + 11 {
                    return Err(format!("{tag}: blocking returned {v}"));
                }
            }
            Op::ThreadWake(d) => {
                let (tx, rx) = bounded::<u64>(if d.as_millis() % 2 == 0 { 0 } else { 1 });
                let d = *d;
                let t = std::thread::spawn(move || {
                    if d.as_millis() % 3 == 0 {
                        spin(d);
                    } else {
                        std::thread::sleep(d);
                    }
                    tx.send(99).unwrap();
                });
                match rx.recv() {
                    Ok(99) => {}
                    other => return Err(format!("{tag}: thread wake gave {other:?}")),
                }
                t.join().unwrap();
            }
            Op::After(d) => {
                let t0 = Instant::now();
                let timer = after(*d);
                select! {
                    recv(timer) -> at => {
                        let at = at.map_err(|e| format!("{tag}: after gave {e:?}"))?;
                        if at < t0 + *d {
                            return Err(format!("{tag}: after({d:?}) delivered an instant before its due time"));
                        }
                    }
                }
                not_early(t0, *d, "after")?;
            }
            Op::Send(k, mode) => {
                let p = &outs[*k];
                let v = next_out[*k];
                next_out[*k] += 1;
                match mode {
                    SendMode::Plain => p.tx.send(v).map_err(|e| format!("{tag}: send failed: {e:?}"))?,
                    SendMode::SelectAfter(d) => loop {
                        let t0 = Instant::now();
                        let timer = after(*d);
                        let sent = select! {
                            send(p.tx, v) -> r => { r.map_err(|e| format!("{tag}: select send failed: {e:?}"))?; true }
                            recv(timer) -> _ => { not_early(t0, *d, "select send after")?; false }
                        };
                        if sent {
                            break;
                        }
                    },
                }
            }
            Op::Recv(mode) => {
                let p = input.expect("a Recv op has an input");
                let expect = next_in;
                next_in += 1;
                let got = match mode {
                    RecvMode::Plain => p.rx.recv().map_err(|e| format!("{tag}: recv failed: {e:?}"))?,
                    RecvMode::Timeout(d) => loop {
                        let t0 = Instant::now();
                        match p.rx.recv_timeout(*d) {
                            Ok(v) => break v,
                            Err(RecvTimeoutError::Timeout) => not_early(t0, *d, "recv_timeout")?,
                            Err(e) => return Err(format!("{tag}: recv_timeout failed: {e:?}")),
                        }
                    },
                    RecvMode::SelectAfter(d) => loop {
                        let t0 = Instant::now();
                        let timer = after(*d);
                        let got = select! {
                            recv(p.rx) -> r => Some(r.map_err(|e| format!("{tag}: select recv failed: {e:?}"))?),
                            recv(timer) -> _ => { not_early(t0, *d, "select after")?; None }
                        };
                        if let Some(v) = got {
                            break v;
                        }
                    },
                    RecvMode::SelectDefault(d) => loop {
                        let t0 = Instant::now();
                        let got = select! {
                            recv(p.rx) -> r => Some(r.map_err(|e| format!("{tag}: select recv failed: {e:?}"))?),
                            default(*d) => { not_early(t0, *d, "select default")?; None }
                        };
                        if let Some(v) = got {
                            break v;
                        }
                    },
                    RecvMode::Poll => loop {
                        match p.rx.try_recv() {
                            Ok(v) => break v,
                            Err(TryRecvError::Empty) => {
                                if in_fiber {
                                    fiber::yield_now().map_err(|_| format!("{tag}: yield cancelled"))?;
                                } else {
                                    std::thread::yield_now();
                                }
                            }
                            Err(e) => return Err(format!("{tag}: try_recv failed: {e:?}")),
                        }
                    },
                };
                if got != expect {
                    return Err(format!("{tag}: received {got}, expected {expect}"));
                }
                sum += got + 1;
            }
        }
    }
    for (k, p) in outs.iter().enumerate() {
        if next_out[k] != p.count {
            return Err(format!("{tag}: sent {} of {} on output {k}", next_out[k], p.count));
        }
    }
    if let Some(p) = input {
        if next_in != p.count {
            return Err(format!("{tag}: received {next_in} of {}", p.count));
        }
        if !matches!(p.rx.try_recv(), Err(TryRecvError::Empty | TryRecvError::Disconnected)) {
            return Err(format!("{tag}: an extra message"));
        }
    }
    Ok(sum)
}

/// One actor of a program: a fiber or a plain thread, with its script.
struct Actor {
    in_fiber: bool,
    ops: Vec<Op>,
    outs: Vec<Pipe>,
    input: Option<Pipe>,
    /// What its checksum must be (sum of 1..=count of its input).
    expect: u64,
}

fn program(seed: u64, kind: Kind, _unused: bool) {
    let mut rng = Rng::new(seed ^ 0x3434);
    let n_hogs = rng.below(4) as usize;
    let n = 2 + rng.below(6) as usize;
    // Actors 0..n; about one in four a plain thread (never actor 0's
    // only peer: the fibers are the point).
    let in_fiber: Vec<bool> = (0..n).map(|i| i == 0 || !rng.chance(25)).collect();
    // Inputs: actor j > 0 has at most one input pipe, from a producer i < j.
    let mut inputs: Vec<Option<(usize, Flavor, u64)>> = vec![None; n];
    for (j, input) in inputs.iter_mut().enumerate().skip(1) {
        if rng.chance(75) {
            let i = rng.below(j as u64) as usize;
            let flavor = match rng.below(4) {
                0 => Flavor::Unbounded,
                1 => Flavor::Rendezvous,
                _ => Flavor::Bounded(1 + rng.below(3) as usize),
            };
            *input = Some((i, flavor, 1 + rng.below(8)));
        }
    }
    let mut actors: Vec<Actor> = (0..n)
        .map(|i| Actor {
            in_fiber: in_fiber[i],
            ops: Vec::new(),
            outs: Vec::new(),
            input: None,
            expect: 0,
        })
        .collect();
    for j in 0..n {
        if let Some((i, flavor, count)) = inputs[j] {
            let (tx, rx) = match flavor {
                Flavor::Unbounded => unbounded(),
                Flavor::Rendezvous => bounded(0),
                Flavor::Bounded(c) => bounded(c),
            };
            actors[i].outs.push(Pipe {
                tx: tx.clone(),
                rx: rx.clone(),
                count,
            });
            actors[j].input = Some(Pipe { tx, rx, count });
            actors[j].expect = count * (count + 1) / 2;
        }
    }
    // Scripts: the channel ops in order, with fillers between.
    for (idx, a) in actors.iter_mut().enumerate() {
        let mut chan_ops: Vec<Op> = Vec::new();
        for (k, p) in a.outs.iter().enumerate() {
            for _ in 0..p.count {
                let mode = if rng.chance(25) {
                    SendMode::SelectAfter(dur_timeout(&mut rng).max(ms(1)))
                } else {
                    SendMode::Plain
                };
                chan_ops.push(Op::Send(k, mode));
            }
        }
        // Interleave the outputs' sends at random (each pipe's own sends
        // keep their order: they are numbered as they run).
        for i in (1..chan_ops.len()).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            chan_ops.swap(i, j);
        }
        if let Some(p) = &a.input {
            for _ in 0..p.count {
                let mode = match rng.below(if a.in_fiber { 5 } else { 3 }) {
                    0 => RecvMode::Plain,
                    1 => RecvMode::Timeout(dur_timeout(&mut rng)),
                    // `after(ZERO)` included: a select on a due timer arm
                    // is a yield point (the due-timer tests below).
                    2 => RecvMode::SelectAfter(dur_timeout(&mut rng)),
                    3 => RecvMode::SelectDefault(dur_timeout(&mut rng)),
                    _ => RecvMode::Poll,
                };
                // Receives at random places among the sends.
                let at = rng.below(chan_ops.len() as u64 + 1) as usize;
                chan_ops.insert(at, Op::Recv(mode));
            }
        }
        // Keep each actor's receives in order relative to each other
        // (they are numbered as they run, so any order is fine) and add
        // fillers.
        let fills = 1 + rng.below(if idx == 0 { 8 } else { 6 });
        for _ in 0..fills {
            let f = filler(&mut rng, a.in_fiber, 0);
            let at = rng.below(chan_ops.len() as u64 + 1) as usize;
            chan_ops.insert(at, f);
        }
        a.ops = chan_ops;
    }
    if std::env::var_os("R34_PRINT").is_some() {
        eprintln!("seed {seed} {kind:?}: {n_hogs} hogs; inputs (producer, flavor, count): {inputs:?}");
        for (i, a) in actors.iter().enumerate() {
            eprintln!(
                "  actor {i} fiber={} input={:?} outs={:?}\n    {:?}",
                a.in_fiber,
                a.input.as_ref().map(|p| p.count),
                a.outs.iter().map(|p| p.count).collect::<Vec<_>>(),
                a.ops
            );
        }
    }
    let _hogs = hogs(n_hogs);
    let what = format!("seed {seed}");
    let outcome = watched(kind, 40, what.clone(), move || {
        let mut fibers = Vec::new();
        let mut threads = Vec::new();
        let mut root = None;
        for (i, a) in actors.into_iter().enumerate() {
            let tag = format!("seed {seed} actor {i}");
            let Actor {
                in_fiber,
                ops,
                outs,
                input,
                expect,
            } = a;
            let body = move || {
                let r = run_ops(&ops, &outs, input.as_ref(), in_fiber, &tag);
                drop(outs);
                drop(input);
                match r {
                    Ok(sum) if sum == expect => Ok(sum),
                    Ok(sum) => Err(format!("{tag}: checksum {sum}, expected {expect}")),
                    Err(e) => Err(e),
                }
            };
            if i == 0 {
                root = Some(body);
            } else if in_fiber {
                fibers.push(fiber::spawn(body));
            } else {
                threads.push(std::thread::spawn(body));
            }
        }
        let mut errors = Vec::new();
        if let Err(e) = (root.unwrap())() {
            errors.push(e);
        }
        for f in fibers {
            match f.join() {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => errors.push(e),
                Err(e) => errors.push(format!("a fiber actor failed: {e:?}")),
            }
        }
        for t in threads {
            match fiber::blocking(move || t.join()) {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => errors.push(e),
                Err(_) => errors.push("a thread actor panicked".to_string()),
            }
        }
        errors
    });
    assert!(outcome.is_empty(), "{what} {kind:?}: {outcome:#?}");
}

fn is_planned(_: &(dyn std::any::Any + Send)) -> bool {
    false
}

fn fuzz(seeds: std::ops::Range<u64>, kind: Kind, secs: u64) {
    quiet_panics(is_planned);
    run_seeds(seeds, kind, false, secs, program);
}

#[test]
fn fuzz_one_worker() {
    fuzz(0..3, Kind::One, 60);
}

#[test]
fn fuzz_two_workers() {
    fuzz(0..3, Kind::Two, 60);
}

#[test]
fn fuzz_elastic() {
    fuzz(0..3, Kind::Elastic, 60);
}

#[test]
#[ignore = "long fuzz: FUZZ_SEEDS / FUZZ_START"]
fn fuzz_long() {
    let start = env_u64("FUZZ_START", 0);
    let n = env_u64("FUZZ_SEEDS", 200);
    for kind in [Kind::One, Kind::Two, Kind::Elastic] {
        fuzz(start..start + n, kind, 100_000);
    }
}

#[test]
#[ignore = "long fuzz: one seed (R34_SEED, R34_KIND = one | two | elastic)"]
fn fuzz_one_seed() {
    let seed = env_u64("R34_SEED", 0);
    let kind = match std::env::var("R34_KIND").as_deref() {
        Ok("two") => Kind::Two,
        Ok("elastic") => Kind::Elastic,
        _ => Kind::One,
    };
    fuzz(seed..seed + 1, kind, 100_000);
}

// ---------------------------------------------------------------------------
// A timer channel that is already due: a select or receive on it completes
// at once, and a loop of them is a poll loop.

/// One poll: a `select!` whose only arm is an `after(ZERO)` timer (due at
/// once), the shape of `select! { recv(rx) -> .., recv(after(remaining))
/// -> .. }` once the remaining time has run out.
fn select_on_a_due_after() {
    let t = after(Duration::ZERO);
    select! {
        recv(t) -> r => { r.unwrap(); }
    }
}

/// One poll: a `select!` on a channel that stays empty and an
/// `after(ZERO)` arm.
fn select_on_an_empty_channel_and_a_due_after() {
    let (_tx, rx) = unbounded::<u8>();
    let t = after(Duration::ZERO);
    select! {
        recv(rx) -> _ => unreachable!("nothing is sent"),
        recv(t) -> r => { r.unwrap(); }
    }
}

/// One poll: `recv` on an `after(ZERO)` receiver.
fn recv_on_a_due_after() {
    after(Duration::ZERO).recv().unwrap();
}

/// One poll: `recv_timeout` on an `at(past)` receiver.
fn recv_timeout_on_a_past_at() {
    fiber::chan::at(Instant::now() - ms(5)).recv_timeout(ms(50)).unwrap();
}

// Failed before the fix: the poller's loop never yields; the setter never runs and the 30 s hang guard fires.
#[test]
fn a_loop_of_selects_on_a_due_after_lets_others_run_one_worker() {
    poller_lets_others_run(select_on_a_due_after);
}

// Failed before the fix: the poller's loop never yields; the setter never runs and the 30 s hang guard fires.
#[test]
fn a_loop_of_selects_on_an_empty_channel_and_a_due_after_lets_others_run_one_worker() {
    poller_lets_others_run(select_on_an_empty_channel_and_a_due_after);
}

/// The control: a receive on a due timer is a zero wait, a yield point.
#[test]
fn a_loop_of_recvs_on_a_due_after_lets_others_run_one_worker() {
    poller_lets_others_run(recv_on_a_due_after);
}

/// The control: a receive on a due timer is a zero wait, a yield point.
#[test]
fn a_loop_of_recv_timeouts_on_a_past_at_lets_others_run_one_worker() {
    poller_lets_others_run(recv_timeout_on_a_past_at);
}

/// The controls: a zero `recv_timeout` and a `select!` with `default(ZERO)`
/// on an empty channel are yield points (fiber's documented rule).
#[test]
fn the_zero_timeout_controls_let_others_run_one_worker() {
    poller_lets_others_run(|| {
        let (_tx, rx) = unbounded::<u8>();
        assert!(rx.recv_timeout(Duration::ZERO).is_err());
    });
    poller_lets_others_run(|| {
        let (_tx, rx) = unbounded::<u8>();
        select! {
            recv(rx) -> _ => unreachable!(),
            default(Duration::ZERO) => {}
        }
    });
    poller_lets_others_run(|| fiber::sleep(Duration::ZERO).unwrap());
}

// ---------------------------------------------------------------------------
// The CI hang's shape: crunchers that compute between yields beside a
// sleeper, on one worker (and elastic), under load.

/// `crunchers` fibers each spin `turn` then yield, until the root fiber
/// has slept `sleeps` times `nap`; every sleep ends, not early, within
/// `bound`, and every cruncher ran. Under `hogs` spinning threads.
fn crunchers_beside_a_sleeper(kind: Kind, hogs_n: usize, crunchers: usize, turn: Duration, nap: Duration, sleeps: u32) {
    let _hogs = hogs(hogs_n);
    let what = format!("{crunchers} crunchers of {turn:?}, {sleeps} sleeps of {nap:?}");
    let (worst, rounds) = watched(kind, 20, what.clone(), move || {
        let handles = yielding_crunchers(crunchers, turn);
        let mut worst = Duration::ZERO;
        for _ in 0..sleeps {
            let s = Instant::now();
            fiber::sleep(nap).unwrap();
            let took = s.elapsed();
            assert!(took >= nap, "a sleep of {nap:?} ended after {took:?}");
            worst = worst.max(took);
        }
        (worst, handles.stop())
    });
    assert!(worst < Duration::from_secs(5), "{what}: a sleep took {worst:?}");
    // Every cruncher ran, when the sleeps gave them time enough for
    // several rounds each (the fairness of yield loops among themselves
    // is the test `every_yielding_cruncher_gets_its_turns_one_worker`;
    // here the point is the sleeper).
    assert_eq!(rounds.len(), crunchers, "{what}");
}

fn ci_shape_seed(seed: u64, kind: Kind, _: bool) {
    let mut rng = Rng::new(seed ^ 0xC1);
    let crunchers = 1 + rng.below(6) as usize;
    let turn = match rng.below(3) {
        0 => Duration::from_micros(200 + rng.below(800)),
        1 => ms(1 + rng.below(5)),
        _ => ms(10 + rng.below(21)),
    };
    let nap = match rng.below(3) {
        0 => Duration::ZERO,
        1 => ms(1 + rng.below(3)),
        _ => ms(20 + rng.below(41)),
    };
    let sleeps = if nap >= ms(20) { 3 } else { 20 };
    crunchers_beside_a_sleeper(kind, rng.below(4) as usize, crunchers, turn, nap, sleeps);
}

#[test]
fn the_ci_hang_shape_one_worker() {
    within(60, || crunchers_beside_a_sleeper(Kind::One, 3, 4, ms(20), ms(50), 5));
}

#[test]
fn the_ci_hang_shape_varied_short() {
    run_seeds(0..3, Kind::One, false, 60, ci_shape_seed);
    run_seeds(0..2, Kind::Elastic, false, 60, ci_shape_seed);
}

#[test]
#[ignore = "long fuzz: the CI hang's shape, FUZZ_SEEDS / FUZZ_START"]
fn ci_shape_long() {
    let start = env_u64("FUZZ_START", 0);
    let n = env_u64("FUZZ_SEEDS", 200);
    for kind in [Kind::One, Kind::Elastic, Kind::Two] {
        run_seeds(start..start + n, kind, false, 100_000, ci_shape_seed);
    }
}

// ---------------------------------------------------------------------------
// The monitor firing a busy worker's wheel while the owner arms and fires
// it too.

/// On one worker: `sleepers` fibers sleep 0 to 2 ms in a loop (arming in
/// the worker's own wheel, between turns of the fibers below) while
/// `spinners` fibers spin 1 to 3 ms between yields (so the owner polls its
/// wheel every `TIMER_POLL` turns, milliseconds apart, and the monitor
/// fires it one tick late in between). Every sleep ends, none early.
fn sleepers_beside_spinners(kind: Kind, sleepers: usize, spinners: usize, rounds: u32) {
    let _hogs = hogs(1);
    let what = format!("{sleepers} sleepers x {rounds} beside {spinners} spinners");
    let done = watched(kind, 30, what.clone(), move || {
        let stop = Arc::new(AtomicBool::new(false));
        let spin_h: Vec<_> = (0..spinners)
            .map(|i| {
                let stop = stop.clone();
                fiber::spawn(move || {
                    let mut k = i as u64;
                    while !stop.load(SeqCst) {
                        k += 1;
                        spin(Duration::from_micros(1000 + (k * 701) % 2000));
                        fiber::yield_now().unwrap();
                    }
                })
            })
            .collect();
        let sleep_h: Vec<_> = (0..sleepers)
            .map(|i| {
                fiber::spawn(move || {
                    let mut early = 0;
                    for r in 0..rounds {
                        let d = Duration::from_micros(((i as u64 * 13 + r as u64 * 7) % 5) * 500);
                        let s = Instant::now();
                        fiber::sleep(d).unwrap();
                        if s.elapsed() < d {
                            early += 1;
                        }
                    }
                    early
                })
            })
            .collect();
        let early: u32 = sleep_h.into_iter().map(|h| h.join().unwrap()).sum();
        stop.store(true, SeqCst);
        for h in spin_h {
            h.join().unwrap();
        }
        early
    });
    assert_eq!(done, 0, "{what}: sleeps ended early");
}

#[test]
fn sleepers_beside_spinners_one_worker() {
    within(60, || sleepers_beside_spinners(Kind::One, 8, 2, 60));
}

#[test]
fn sleepers_beside_spinners_elastic() {
    within(60, || sleepers_beside_spinners(Kind::Elastic, 8, 3, 60));
}

#[test]
#[ignore = "long fuzz: many rounds of sleepers beside spinners"]
fn sleepers_beside_spinners_long() {
    for _ in 0..env_u64("FUZZ_SEEDS", 20) {
        within(100, || sleepers_beside_spinners(Kind::One, 16, 2, 400));
        within(100, || sleepers_beside_spinners(Kind::Two, 16, 3, 400));
        within(100, || sleepers_beside_spinners(Kind::Elastic, 16, 3, 400));
    }
}

// ---------------------------------------------------------------------------
// A wake racing a timer pass: messages that arrive at a `recv_timeout`'s
// deadline.

/// A sender (a plain thread or a fiber) sends `n` numbered messages, each
/// after waiting about `gap`; the receiver fiber loops on `recv_timeout`
/// of the same `gap`, so the message and the timer come due together.
/// Every message arrives once, in order; no timeout ends early.
fn messages_at_the_deadline(kind: Kind, from_thread: bool, n: u64, gap: Duration) {
    let what = format!(
        "{n} messages every {gap:?} from a {}",
        if from_thread { "thread" } else { "fiber" }
    );
    let (got, early) = watched(kind, 30, what.clone(), move || {
        let (tx, rx) = unbounded::<u64>();
        let send_all = move |in_fiber: bool| {
            for i in 0..n {
                if in_fiber {
                    fiber::sleep(gap).unwrap();
                } else {
                    std::thread::sleep(gap);
                }
                tx.send(i).unwrap();
            }
        };
        let sender: Box<dyn FnOnce() + Send> = if from_thread {
            let t = std::thread::spawn(move || send_all(false));
            Box::new(move || t.join().unwrap())
        } else {
            let f = fiber::spawn(move || send_all(true));
            Box::new(move || f.join().unwrap())
        };
        let mut got = Vec::new();
        let mut early = 0;
        loop {
            let s = Instant::now();
            match rx.recv_timeout(gap) {
                Ok(v) => got.push(v),
                Err(RecvTimeoutError::Timeout) => {
                    if s.elapsed() < gap {
                        early += 1;
                    }
                }
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        sender();
        (got, early)
    });
    assert_eq!(got, (0..n).collect::<Vec<_>>(), "{what}");
    assert_eq!(early, 0, "{what}: timeouts ended early");
}

#[test]
fn messages_at_the_deadline_from_a_thread_one_worker() {
    within(60, || messages_at_the_deadline(Kind::One, true, 150, ms(1)));
}

#[test]
fn messages_at_the_deadline_from_a_fiber_two_workers() {
    within(60, || messages_at_the_deadline(Kind::Two, false, 150, ms(1)));
}

#[test]
#[ignore = "long fuzz: messages at the deadline, many rounds"]
fn messages_at_the_deadline_long() {
    for _ in 0..env_u64("FUZZ_SEEDS", 10) {
        for kind in [Kind::One, Kind::Two, Kind::Elastic] {
            for from_thread in [true, false] {
                within(100, move || messages_at_the_deadline(kind, from_thread, 1000, ms(1)));
            }
        }
    }
}

// ---------------------------------------------------------------------------
// `yield_now` loops beside fibers woken by a timer, by a plain thread (the
// inbox) and through the global queue.

/// Three fibers yield in a loop (no work between yields) on `kind`; the
/// root sleeps 1 ms 100 times, then makes 100 round trips with a plain
/// thread, then 100 with a fiber spawned from a plain thread (through a
/// `Handle`: an outside spawn). All of it ends within the watchdog's bound.
fn yield_loops_beside_wakes(kind: Kind) {
    let _hogs = hogs(2);
    let took = watched(kind, 30, "yield loops beside wakes".into(), move || {
        let start = Instant::now();
        let yielders = yielding_crunchers(3, Duration::ZERO);
        for _ in 0..100 {
            fiber::sleep(ms(1)).unwrap();
        }
        let (to_t, t_rx) = bounded::<u32>(0);
        let (to_f, f_rx) = bounded::<u32>(0);
        let t = std::thread::spawn(move || {
            for v in t_rx.iter() {
                to_f.send(v + 1).unwrap();
            }
        });
        for i in 0..100 {
            to_t.send(i).unwrap();
            assert_eq!(f_rx.recv().unwrap(), i + 1);
        }
        drop(to_t);
        t.join().unwrap();
        let handle = fiber::Handle::current();
        for i in 0..100u32 {
            let h = handle.clone();
            let outside = std::thread::spawn(move || h.spawn(move || i * 3));
            let jh = outside.join().unwrap();
            assert_eq!(jh.join().unwrap(), i * 3);
        }
        assert!(yielders.stop().iter().all(|&n| n > 0));
        start.elapsed()
    });
    assert!(took < Duration::from_secs(20), "took {took:?}");
}

#[test]
fn yield_loops_beside_wakes_one_worker() {
    within(60, || yield_loops_beside_wakes(Kind::One));
}

#[test]
fn yield_loops_beside_wakes_elastic() {
    within(60, || yield_loops_beside_wakes(Kind::Elastic));
}

// ---------------------------------------------------------------------------
// Yield loops among themselves: a fiber that yields goes behind the
// others (README "Guarantees"; Go's `Gosched` puts the goroutine on the
// global run queue, behind every runnable one).

/// Five fibers compute 22 ms between yields on one worker (no hogs) while
/// the root yields (`sleep(ZERO)`, a yield point) for 2.5 s: about 110
/// turns in all, 22 each in a fair order. Each cruncher must get at least
/// a quarter of the mean.
fn yielding_crunchers_share(secs: u64) -> Vec<u64> {
    watched(Kind::One, 30, "yielding crunchers".into(), move || {
        let hs = yielding_crunchers(5, ms(22));
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_millis(secs) {
            fiber::sleep(Duration::ZERO).unwrap();
        }
        hs.stop()
    })
}

// Failed before the fix: e.g. [43, 192, 1, 232, 233] turns in 8 s, [15, 0, 0, 15, 15] in 1 s: two crunchers starve for seconds.
#[test]
fn every_yielding_cruncher_gets_its_turns_one_worker() {
    within(60, || {
        let rounds = yielding_crunchers_share(2500);
        let mean = rounds.iter().sum::<u64>() / rounds.len() as u64;
        assert!(
            rounds.iter().all(|&n| n * 4 >= mean && n > 0),
            "turns of five crunchers yielding every 22 ms over 2.5 s: {rounds:?}"
        );
    });
}

/// The CI hang's mechanism, made likely: `crunchers` fibers compute
/// `turn` (more than the monitor's 10 ms stuck threshold) between yields,
/// and the root sleeps 1 ms twenty times. Each turn the monitor moves the
/// busy worker's deque to the global queue oldest first, which reverses
/// the order `take_global_batch` gave it, and the worker takes the global
/// queue's head and batches the rest back: two fibers in the middle trade
/// places for ever. A timer-woken root that lands there never runs again
/// while the crunchers yield. Returns the longest sleep.
fn sleeper_beside_crunchers_in_a_cycle(kind: Kind, crunchers: usize, turn: Duration) -> Duration {
    watched(
        kind,
        50,
        format!("a sleeper beside {crunchers} crunchers of {turn:?}"),
        move || {
            let hs = yielding_crunchers(crunchers, turn);
            let mut worst = Duration::ZERO;
            for _ in 0..20 {
                let s = Instant::now();
                fiber::sleep(ms(1)).unwrap();
                worst = worst.max(s.elapsed());
            }
            hs.stop();
            worst
        },
    )
}

// Failed before the fix: a 1 ms sleep takes 15 s to over 50 s (the watchdog's dump shows the root RUNNABLE, never run while the crunchers cycle).
#[test]
fn a_sleeper_beside_five_yielding_crunchers_two_workers() {
    within(120, || {
        for _ in 0..3 {
            let worst = sleeper_beside_crunchers_in_a_cycle(Kind::Two, 5, ms(27));
            assert!(worst < Duration::from_secs(3), "a 1 ms sleep took {worst:?}");
        }
    });
}
