//! Adversarial review, round 52: a seeded random-program fuzzer over the
//! public API, widened to the newest features.
//!
//! Rounds 27 and 29 drove flat actors (27) and nested scopes, fiber-locals,
//! park and sockets (29); round 48 drove loops of operations that never
//! wait beside runnext chains. This one builds, from a seed, a random
//! *tree* of fibers: regular, supervisor and try scopes nested inside each
//! other and inside `with_timeout`, detached fibers joined by their
//! spawner, each level with a random cancellation plan (`Scope::cancel`,
//! a `ScopedJoinHandle::cancel`, a `JoinHandle::cancel`, the scope's
//! `Job::cancel`, an expiring `with_timeout`, a sibling's planned panic or
//! a try-scope child's `Err`). The leaves run random scripts over
//! bounded / unbounded / rendezvous channels (with `close`), `select!`
//! with timer arms (`after`, `tick`, `never`) and `default` / `default(d)`
//! arms, `Select::try_select`, `fiber::sync` `Mutex` / `RwLock` /
//! `Condvar` / `Semaphore` / `Barrier` / `Once`, sleeps and yields, and
//! the operation budget: spinners that wait for a partner fiber using only
//! non-blocking operations (`try_recv`, `try_send`, a `select!` default,
//! `try_select`, `try_lock`, `try_read`, `try_acquire`), which must let the
//! partner run on one worker, and loops of operations that never wait
//! (sends and receives on a self-fed channel) that must end at their
//! `with_timeout` or at an enclosing cancellation.
//!
//! Oracles: every token sent is received exactly once or dropped exactly
//! once (returned in a `SendError`, left in a buffer, dropped with a
//! cancelled body); every spawned fiber's closure is dropped exactly once
//! ("no fiber lost": a guard moved into each closure); every join reports
//! an outcome consistent with what the body did (a value only if the body
//! ended normally, a panic only if it panicked as planned, a cancellation
//! only where some cancellation source was aimed at it) and a scope's
//! children's outcomes add up to its spawns; a wait reports `Cancelled`
//! only where a cancellation source exists; no timeout fires early; lock
//! counters are exact and the semaphore never over-admits; `Once` runs
//! once; the whole program ends within a bound; afterwards the runtime's
//! `Stats` show no live fiber, `spawns` at least the program's spawns, and
//! the dump no fiber. A shutdown mode drops the runtime in the middle:
//! the drop must return, every closure guard must be dropped and every
//! token accounted for.
//!
//! `FUZZ_SEEDS=n FUZZ_START=k cargo test --release -p fiber --features
//! fiber-core/spec-assert --test reviews -- --ignored
//! review52::fuzz_long` runs the long variant; `R52_SCALE=n` multiplies the default
//! tests' seed counts.
//!
//! Found: a fiber told of its `JoinHandle::cancel` (a wait returned
//! `Cancelled`) was never told again at a budget look, so a `with_timeout`
//! it opened afterwards never ended a loop of channel operations that
//! succeed at once: the loop ran for ever past the deadline
//! (`a_with_timeout_opened_after_a_told_handle_cancel_ends_its_loop_of_successful_recvs`;
//! about one program in eight hit it). A loop still running 3 s past its
//! deadline is a violation.

use crate::common::*;

use crate::common::fuzz::{env_u64, quiet_panics, run_seeds, Rng};
use fiber::chan::{self, after, never, tick, Receiver, Select, Sender};
use fiber::select;
use fiber::sync::{Barrier, Condvar, Mutex, Once, RwLock, Semaphore};
use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------- tokens

/// Where every token ended: received or dropped (each exactly once).
struct Ledger {
    next: AtomicU64,
    fate: std::sync::Mutex<HashMap<u64, &'static str>>,
    errors: std::sync::Mutex<Vec<String>>,
}

impl Ledger {
    fn new() -> Arc<Ledger> {
        Arc::new(Ledger {
            next: AtomicU64::new(0),
            fate: std::sync::Mutex::new(HashMap::new()),
            errors: std::sync::Mutex::new(Vec::new()),
        })
    }
    fn record(&self, id: u64, fate: &'static str) {
        let mut map = self.fate.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(old) = map.insert(id, fate) {
            drop(map);
            self.error(format!("token {id} {fate} after it was already {old}"));
        }
    }
    fn error(&self, e: String) {
        self.errors.lock().unwrap_or_else(|e| e.into_inner()).push(e);
    }
    fn settled(&self) -> bool {
        self.fate.lock().unwrap_or_else(|e| e.into_inner()).len() as u64 == self.next.load(SeqCst)
    }
    fn check(&self, what: &str) {
        let errors = self.errors.lock().unwrap_or_else(|e| e.into_inner()).clone();
        assert!(errors.is_empty(), "{what}: {errors:#?}");
        let created = self.next.load(SeqCst);
        let map = self.fate.lock().unwrap_or_else(|e| e.into_inner());
        let lost: Vec<u64> = (0..created).filter(|id| !map.contains_key(id)).take(10).collect();
        assert!(lost.is_empty(), "{what}: tokens lost: {lost:?} of {created}");
        assert_eq!(map.len() as u64, created, "{what}: unknown tokens");
    }
}

struct Tok {
    id: u64,
    led: Arc<Ledger>,
    taken: bool,
}

impl Tok {
    fn new(led: &Arc<Ledger>) -> Tok {
        Tok {
            id: led.next.fetch_add(1, SeqCst),
            led: led.clone(),
            taken: false,
        }
    }
    fn take(mut self) {
        self.taken = true;
        self.led.record(self.id, "received");
    }
}

impl Drop for Tok {
    fn drop(&mut self) {
        if !self.taken {
            self.led.record(self.id, "dropped");
        }
    }
}

// ---------------------------------------------------------------- shared state

const PANIC_MARK: &str = "review52 planned panic";

fn planned_panic() -> ! {
    std::panic::panic_any(PANIC_MARK)
}

fn is_planned(p: &(dyn std::any::Any + Send)) -> bool {
    p.downcast_ref::<&str>() == Some(&PANIC_MARK) || fiber::core::is_shutdown_unwind(p)
}

struct Chan {
    tx: Sender<Tok>,
    rx: Receiver<Tok>,
    cap: Option<usize>,
}

struct Shared {
    led: Arc<Ledger>,
    chans: Vec<Chan>,
    m: Mutex<u64>,
    m_count: AtomicU64,
    m_in: AtomicUsize,
    rw: RwLock<u64>,
    rw_count: AtomicU64,
    sem: Semaphore,
    sem_k: usize,
    sem_in: AtomicUsize,
    cvm: Mutex<u64>,
    cv: Condvar,
    barrier: Barrier,
    once: Once,
    once_runs: AtomicU64,
    once_returned: AtomicBool,
    /// Closures spawned and not yet dropped (`Life`).
    live: AtomicI64,
    /// Fibers this program spawned (watchdogs of `with_timeout` not included).
    spawned: AtomicU64,
    /// Panics are planned in this program (a regular scope's siblings may
    /// then be cancelled).
    panics: bool,
    shutdown: bool,
    seed: u64,
}

impl Shared {
    fn violation(&self, e: String) {
        self.led.error(format!("seed {}: {e}", self.seed));
    }
}

/// A holder inside a lock or semaphore: counted in on entry, out on drop
/// (a teardown unwind at a yield inside must count it out too, before the
/// guard or permit is released).
struct Inside<'a>(&'a AtomicUsize);

impl<'a> Inside<'a> {
    fn enter(sh: &Shared, n: &'a AtomicUsize, limit: usize, what: &str) -> Inside<'a> {
        let now = n.fetch_add(1, SeqCst) + 1;
        if now > limit {
            sh.violation(format!("{what} of {limit} admitted {now}"));
        }
        Inside(n)
    }
}

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
    }
}

/// Moved into every spawned closure: dropped exactly once, whether the
/// closure ran to its end, unwound, or was dropped without running.
struct Life(Arc<Shared>);

impl Life {
    fn new(sh: &Arc<Shared>) -> Life {
        sh.live.fetch_add(1, SeqCst);
        sh.spawned.fetch_add(1, SeqCst);
        Life(sh.clone())
    }
}

impl Drop for Life {
    fn drop(&mut self) {
        let was = self.0.live.fetch_sub(1, SeqCst);
        if was <= 0 {
            self.0
                .violation(format!("a closure guard dropped twice (live was {was})"));
        }
    }
}

/// What a child did, recorded by the child itself (the join must agree).
#[derive(Default)]
struct Rec {
    started: AtomicBool,
    completed: AtomicBool,
    panicked: AtomicBool,
    returned_err: AtomicBool,
}

fn dur(rng: &mut Rng) -> Duration {
    match rng.below(10) {
        0..=2 => Duration::ZERO,
        3..=7 => Duration::from_micros(100 + rng.below(900)),
        _ => ms(1 + rng.below(3)),
    }
}

/// One fiber's view: its generator and what may cancel it.
struct Ctx {
    sh: Arc<Shared>,
    rng: Rng,
    depth: u32,
    /// Some cancellation source is aimed at this fiber or an ancestor
    /// job (planned cancel, `with_timeout`, a failing sibling).
    may_cancel: bool,
    /// Inside a `with_timeout` opened by this fiber.
    in_timeout: u32,
    /// May this fiber panic (a planned panic)?
    may_panic: bool,
}

impl Ctx {
    fn child(&mut self, may_cancel: bool) -> Ctx {
        Ctx {
            sh: self.sh.clone(),
            rng: self.rng.fork(),
            depth: self.depth + 1,
            may_cancel: may_cancel || self.sh.shutdown,
            in_timeout: 0,
            may_panic: self.sh.panics,
        }
    }

    fn cancel_ok(&self) -> bool {
        self.may_cancel || self.in_timeout > 0 || self.sh.shutdown
    }

    /// After an operation failed: if the fiber reports cancelled, some
    /// source must exist.
    fn check_cancel(&self, what: &str) {
        if fiber::is_cancelled() && !self.cancel_ok() {
            self.sh.violation(format!(
                "{what} failed as cancelled with no cancellation source (depth {})",
                self.depth
            ));
        }
    }

    fn not_early(&self, t0: Instant, d: Duration, what: &str) {
        let waited = t0.elapsed();
        if waited < d && !fiber::is_cancelled() {
            self.sh
                .violation(format!("{what}({d:?}) timed out after only {waited:?}"));
        }
    }

    fn pick(&mut self) -> usize {
        self.rng.below(self.sh.chans.len() as u64) as usize
    }

    fn led(&self) -> Arc<Ledger> {
        self.sh.led.clone()
    }

    // ------------------------------------------------------------ leaves

    fn script(&mut self, n: usize) {
        for _ in 0..n {
            self.step();
        }
    }

    fn step(&mut self) {
        let sh = self.sh.clone();
        let led = self.led();
        match self.rng.below(32) {
            0 | 1 => {
                let c = self.pick();
                let d = dur(&mut self.rng);
                let t0 = Instant::now();
                match sh.chans[c].tx.send_timeout(Tok::new(&led), d) {
                    Ok(()) => {}
                    Err(chan::SendTimeoutError::Timeout(t)) => {
                        drop(t);
                        self.not_early(t0, d, "send_timeout");
                        self.check_cancel("send_timeout");
                    }
                    Err(chan::SendTimeoutError::Disconnected(t)) => drop(t),
                }
            }
            2 => {
                let c = self.pick();
                let _ = sh.chans[c].tx.try_send(Tok::new(&led));
            }
            3 | 4 => {
                let c = self.pick();
                let d = dur(&mut self.rng);
                let t0 = Instant::now();
                match sh.chans[c].rx.recv_timeout(d) {
                    Ok(t) => t.take(),
                    Err(chan::RecvTimeoutError::Timeout) => {
                        self.not_early(t0, d, "recv_timeout");
                        self.check_cancel("recv_timeout");
                    }
                    Err(_) => {}
                }
            }
            5 => {
                let c = self.pick();
                if let Ok(t) = sh.chans[c].rx.try_recv() {
                    t.take();
                }
                if let Some(k) = sh.chans[c].cap {
                    let len = sh.chans[c].rx.len();
                    if len > k.max(1) {
                        sh.violation(format!("bounded({k}) reports len {len}"));
                    }
                }
            }
            6..=9 => self.select_timers(),
            10 => self.select_dynamic(),
            11 => {
                // an untimed wait under a deadline
                let c = self.pick();
                let d = dur(&mut self.rng) + Duration::from_micros(200);
                self.in_timeout += 1;
                if self.rng.chance(50) {
                    let t = Tok::new(&led);
                    let tx = &sh.chans[c].tx;
                    let _ = fiber::with_timeout(d, move || tx.send(t));
                } else {
                    let rx = &sh.chans[c].rx;
                    if let Ok(Ok(t)) = fiber::with_timeout(d, || rx.recv()) {
                        t.take();
                    }
                }
                self.in_timeout -= 1;
            }
            12 => {
                if self.rng.chance(8) {
                    let c = self.pick();
                    sh.chans[c].tx.close();
                }
            }
            13 | 14 => {
                let mut g = sh.m.lock().unwrap_or_else(|e| e.into_inner());
                let inside = Inside::enter(&sh, &sh.m_in, 1, "mutex");
                *g += 1;
                sh.m_count.fetch_add(1, SeqCst);
                if self.rng.chance(30) {
                    let _ = fiber::yield_now();
                }
                drop(inside);
                drop(g);
            }
            15 => {
                if self.rng.chance(50) {
                    let mut g = sh.rw.write().unwrap_or_else(|e| e.into_inner());
                    *g += 1;
                    sh.rw_count.fetch_add(1, SeqCst);
                    if self.rng.chance(20) {
                        let _ = fiber::yield_now();
                    }
                } else {
                    let g = sh.rw.read().unwrap_or_else(|e| e.into_inner());
                    if *g != sh.rw_count.load(SeqCst) {
                        sh.violation(format!(
                            "rwlock reader saw {}, writers counted {}",
                            *g,
                            sh.rw_count.load(SeqCst)
                        ));
                    }
                }
            }
            16 => {
                let d = dur(&mut self.rng) + Duration::from_micros(200);
                self.in_timeout += 1;
                let sh2 = sh.clone();
                let _ = fiber::with_timeout(d, || {
                    if let Ok(p) = sh2.sem.acquire() {
                        let inside = Inside::enter(&sh2, &sh2.sem_in, sh2.sem_k, "semaphore");
                        let _ = fiber::yield_now();
                        drop(inside);
                        drop(p);
                    }
                });
                self.in_timeout -= 1;
            }
            17 => {
                if self.rng.chance(50) {
                    *sh.cvm.lock().unwrap_or_else(|e| e.into_inner()) += 1;
                    if self.rng.chance(50) {
                        sh.cv.notify_one();
                    } else {
                        sh.cv.notify_all();
                    }
                } else {
                    let g = sh.cvm.lock().unwrap_or_else(|e| e.into_inner());
                    let d = dur(&mut self.rng);
                    let _ = sh.cv.wait_timeout(g, d);
                }
            }
            18 => {
                let d = dur(&mut self.rng) + Duration::from_micros(200);
                self.in_timeout += 1;
                let _ = fiber::with_timeout(d, || sh.barrier.wait());
                self.in_timeout -= 1;
            }
            19 => {
                sh.once.call_once(|| {
                    sh.once_runs.fetch_add(1, SeqCst);
                });
                sh.once_returned.store(true, SeqCst);
            }
            20 | 21 => {
                let d = dur(&mut self.rng);
                let t0 = Instant::now();
                if fiber::sleep(d).is_ok() {
                    self.not_early(t0, d, "sleep");
                } else {
                    self.check_cancel("sleep");
                }
            }
            22 => {
                if fiber::yield_now().is_err() {
                    self.check_cancel("yield_now");
                }
            }
            23 | 24 => self.spinner(),
            25 => self.op_loop_under_timeout(),
            26 | 27 => {
                if self.depth < 4 {
                    let d = dur(&mut self.rng) + Duration::from_micros(300);
                    let n = 1 + self.rng.below(5) as usize;
                    let t0 = Instant::now();
                    self.in_timeout += 1;
                    self.depth += 1;
                    let r = fiber::with_timeout(d, || self.script(n));
                    self.depth -= 1;
                    self.in_timeout -= 1;
                    if r.is_err() {
                        self.not_early(t0, d, "with_timeout");
                    }
                }
            }
            28 | 29 => {
                if self.depth < 3 {
                    self.node();
                }
            }
            30 => {
                if self.may_panic && self.rng.chance(25) {
                    planned_panic();
                }
            }
            _ => {
                // a non-blocking burst: try forms over everything
                for _ in 0..self.rng.below(300) {
                    self.nonblocking_op();
                }
            }
        }
    }

    /// One operation that never waits (counted by the budget, whether it
    /// succeeds or misses).
    fn nonblocking_op(&mut self) {
        let sh = self.sh.clone();
        let c = self.pick();
        match self.rng.below(8) {
            0 => {
                if let Ok(t) = sh.chans[c].rx.try_recv() {
                    t.take();
                }
            }
            1 => {
                let _ = sh.chans[c].tx.try_send(Tok::new(&sh.led));
            }
            2 => {
                let rx = &sh.chans[c].rx;
                select! {
                    recv(rx) -> m => if let Ok(t) = m { t.take() },
                    default => {},
                }
            }
            3 => {
                let mut s = Select::new();
                s.recv(&sh.chans[c].rx);
                let got = match s.try_select() {
                    Ok(op) => op.recv(&sh.chans[c].rx).ok(),
                    Err(_) => None,
                };
                if let Some(t) = got {
                    t.take();
                }
            }
            4 => {
                if let Ok(mut g) = sh.m.try_lock() {
                    let inside = Inside::enter(&sh, &sh.m_in, 1, "mutex (try_lock)");
                    *g += 1;
                    sh.m_count.fetch_add(1, SeqCst);
                    drop(inside);
                }
            }
            5 => {
                if let Ok(g) = sh.rw.try_read() {
                    if *g != sh.rw_count.load(SeqCst) {
                        sh.violation("rwlock try_read saw a torn count".into());
                    }
                }
            }
            6 => {
                if let Some(p) = sh.sem.try_acquire() {
                    let inside = Inside::enter(&sh, &sh.sem_in, sh.sem_k, "semaphore (try_acquire)");
                    drop(inside);
                    drop(p);
                }
            }
            _ => {
                let t = Tok::new(&sh.led);
                let tx = &sh.chans[c].tx;
                select! {
                    send(tx, t) -> r => drop(r),
                    default => {},
                }
            }
        }
    }

    /// The budget oracle: wait for a partner fiber with only non-blocking
    /// operations. The partner is detached (nothing here cancels it) and
    /// sets the flag when its closure is dropped, run or not; on one
    /// worker only the budget's yields let it run.
    fn spinner(&mut self) {
        let sh = self.sh.clone();
        let flag = Arc::new(AtomicBool::new(false));
        struct SetOnDrop(Arc<AtomicBool>);
        impl Drop for SetOnDrop {
            fn drop(&mut self) {
                self.0.store(true, SeqCst);
            }
        }
        let set = SetOnDrop(flag.clone());
        let life = Life::new(&sh);
        let yields = self.rng.below(3);
        let partner = fiber::spawn(move || {
            let _life = life;
            for _ in 0..yields {
                let _ = fiber::yield_now();
            }
            drop(set);
        });
        let t0 = Instant::now();
        let mut n = 0u64;
        while !flag.load(SeqCst) {
            self.nonblocking_op();
            n += 1;
            if t0.elapsed() > Duration::from_secs(5) {
                if !sh.shutdown {
                    sh.violation(format!(
                        "spinner: the partner never ran in {n} non-blocking operations (5 s)"
                    ));
                }
                break;
            }
        }
        match partner.join() {
            Ok(()) => {}
            Err(e) if e.is_join_cancelled() && self.cancel_ok() => {}
            Err(e) if sh.shutdown => drop(e),
            Err(e) => sh.violation(format!("spinner's partner: {e:?}")),
        }
    }

    /// A loop of operations that never wait (sends into and receives from
    /// a self-fed channel, with try-ops between) must end at its
    /// `with_timeout` (or an enclosing cancellation), losing no value.
    fn op_loop_under_timeout(&mut self) {
        let sh = self.sh.clone();
        let d = ms(1 + self.rng.below(4));
        let unbounded = self.rng.chance(50);
        let (tx, rx) = if unbounded {
            chan::unbounded::<Tok>()
        } else {
            chan::bounded::<Tok>(4)
        };
        let mix = self.rng.below(3);
        let mut rng = self.rng.fork();
        let t0 = Instant::now();
        self.in_timeout += 1;
        let r = fiber::with_timeout(d, || {
            let mut i = 0u64;
            loop {
                i += 1;
                if t0.elapsed() > d + Duration::from_secs(3) && !sh.shutdown {
                    sh.violation(format!(
                        "a self-fed op loop under with_timeout({d:?}) (unbounded {unbounded}, mix {mix}) still runs after {i} rounds, {:?}; is_cancelled {}",
                        t0.elapsed(),
                        fiber::is_cancelled()
                    ));
                    return i;
                }
                if let Err(e) = tx.send(Tok::new(&sh.led)) {
                    drop(e.into_inner());
                    return i;
                }
                if mix > 0 && rng.chance(30) {
                    let _ = tx.try_send(Tok::new(&sh.led));
                }
                match rx.recv() {
                    Ok(t) => t.take(),
                    Err(_) => return i,
                }
                if mix > 1 {
                    if let Ok(t) = rx.try_recv() {
                        t.take();
                    }
                }
            }
        });
        self.in_timeout -= 1;
        let took = t0.elapsed();
        if r.is_ok() && !fiber::is_cancelled() && !sh.shutdown {
            sh.violation("a self-fed op loop ended without a cancellation".into());
        }
        if took > d + Duration::from_secs(3) && !sh.shutdown {
            sh.violation(format!("a self-fed op loop under with_timeout({d:?}) ran {took:?}"));
        }
        // what is left in the channel is dropped with it
        drop((tx, rx));
    }

    /// `select!` with timer arms and default arms, in fixed shapes with
    /// random operands.
    fn select_timers(&mut self) {
        let sh = self.sh.clone();
        let led = self.led();
        let c1 = self.pick();
        let c2 = self.pick();
        let d = dur(&mut self.rng);
        let p = Duration::from_micros(50 + self.rng.below(500));
        let (rx1, tx2) = (&sh.chans[c1].rx, &sh.chans[c2].tx);
        let t0 = Instant::now();
        match self.rng.below(7) {
            0 => select! {
                recv(rx1) -> m => if let Ok(t) = m { t.take() },
                recv(after(d)) -> _ => {},
            },
            1 => select! {
                recv(after(d)) -> _ => {},
                send(tx2, Tok::new(&led)) -> r => drop(r),
                recv(rx1) -> m => if let Ok(t) = m { t.take() },
            },
            2 => {
                let tk = tick(p);
                for _ in 0..1 + self.rng.below(4) {
                    select! {
                        recv(tk) -> _ => {},
                        recv(rx1) -> m => if let Ok(t) = m { t.take() },
                        recv(never::<Tok>()) -> m => if let Ok(t) = m { t.take(); sh.violation("never delivered".into()) },
                    }
                }
            }
            3 => select! {
                recv(never::<Tok>()) -> m => {
                    // a timed select reports a cancellation as its timeout:
                    // this arm never runs
                    let cancelled = fiber::is_cancelled();
                    if let Ok(t) = m {
                        t.take();
                    }
                    sh.violation(format!("a never arm of a select with default(d) ran (cancelled: {cancelled})"));
                },
                send(tx2, Tok::new(&led)) -> r => drop(r),
                default(d) => self.not_early(t0, d, "select default(d)"),
            },
            4 => select! {
                recv(rx1) -> m => if let Ok(t) = m { t.take() },
                recv(tick(p)) -> _ => {},
                default => {},
            },
            5 => select! {
                send(tx2, Tok::new(&led)) -> r => drop(r),
                recv(never::<Tok>()) -> _ => {},
                recv(after(d)) -> _ => {},
            },
            _ => {
                // blocking select with only timer arms and a channel
                // behind a deadline
                let dd = d + Duration::from_micros(300);
                self.in_timeout += 1;
                let _ = fiber::with_timeout(dd, || {
                    select! {
                        recv(rx1) -> m => if let Ok(t) = m { t.take() },
                        recv(never::<Tok>()) -> _ => {},
                    }
                });
                self.in_timeout -= 1;
            }
        }
    }

    /// A `Select` of random channel arms in one of several modes.
    fn select_dynamic(&mut self) {
        let sh = self.sh.clone();
        let n_arms = 1 + self.rng.below(3) as usize;
        let mut plan = Vec::new();
        for _ in 0..n_arms {
            plan.push((self.pick(), self.rng.chance(50)));
        }
        let mode = self.rng.below(3);
        let d = dur(&mut self.rng);
        let timer = after(d);
        let mut sel = if self.rng.chance(30) {
            Select::new_biased()
        } else {
            Select::new()
        };
        for &(c, is_send) in &plan {
            if is_send {
                sel.send(&sh.chans[c].tx);
            } else {
                sel.recv(&sh.chans[c].rx);
            }
        }
        let timer_idx = sel.recv(&timer);
        let oper = match mode {
            0 => sel.try_select().ok(),
            1 => sel.select_timeout(d).ok(),
            _ => Some(sel.select()),
        };
        if let Some(op) = oper {
            let i = op.index();
            if i == timer_idx {
                let _ = op.recv(&timer);
            } else {
                let (c, is_send) = plan[i];
                if is_send {
                    if let Err(e) = op.send(&sh.chans[c].tx, Tok::new(&sh.led)) {
                        drop(e.into_inner());
                    }
                } else if let Ok(t) = op.recv(&sh.chans[c].rx) {
                    t.take();
                }
            }
        } else {
            self.check_cancel("select_timeout/try_select");
        }
    }

    // ------------------------------------------------------------ trees

    /// A random node: a scope of some kind, a detached fiber joined here,
    /// or a leaf script (this fiber).
    fn node(&mut self) {
        match self.rng.below(5) {
            0 => self.regular_scope(),
            1 => self.supervisor(),
            2 => self.try_scope(),
            3 => self.detached(),
            _ => {
                let n = 2 + self.rng.below(8) as usize;
                self.script(n);
            }
        }
    }

    /// The work of a child: a script, maybe a nested node, maybe a panic.
    fn child_body(mut ctx: Ctx, rec: &Rec, steps: usize) {
        rec.started.store(true, SeqCst);
        let panic_here = ctx.may_panic && ctx.rng.chance(15);
        struct OnUnwind<'a>(&'a Rec, bool);
        impl Drop for OnUnwind<'_> {
            fn drop(&mut self) {
                if std::thread::panicking() && self.1 {
                    self.0.panicked.store(true, SeqCst);
                }
            }
        }
        let guard = OnUnwind(rec, true);
        ctx.script(steps);
        if ctx.rng.chance(30) && ctx.depth < 3 {
            ctx.node();
        }
        if panic_here {
            planned_panic();
        }
        drop(guard);
        rec.completed.store(true, SeqCst);
    }

    /// Check one child's join against what it did.
    fn check_join<T: std::fmt::Debug>(&self, rec: &Rec, cancel_src: bool, r: Result<T, fiber::JoinError>, what: &str) {
        let sh = &self.sh;
        match r {
            Ok(_) => {
                if !rec.completed.load(SeqCst) {
                    sh.violation(format!("{what}: join Ok but the body did not complete"));
                }
            }
            Err(e) if e.is_panic() => {
                let planned = e.into_panic();
                if !is_planned(&*planned) {
                    let msg = planned
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| planned.downcast_ref::<&str>().map(|s| s.to_string()));
                    sh.violation(format!("{what}: unplanned panic {msg:?}"));
                } else if planned.downcast_ref::<&str>() == Some(&PANIC_MARK) && !rec.panicked.load(SeqCst) {
                    sh.violation(format!("{what}: join says panicked, the body did not"));
                }
            }
            Err(e) if e.is_join_cancelled() => {
                if !self.cancel_ok() {
                    sh.violation(format!("{what}: the join was cancelled with no source"));
                }
            }
            Err(e) if e.is_cancelled() => {
                if !(cancel_src || sh.shutdown) {
                    sh.violation(format!("{what}: {e:?} with no cancellation source"));
                }
                // (in the shutdown mode a teardown unwind counts as a panic
                // for `Rec`)
                if rec.panicked.load(SeqCst) && !sh.shutdown {
                    sh.violation(format!("{what}: reported {e:?} though the body panicked"));
                }
            }
            Err(e) if e.is_failed() => {
                if !rec.returned_err.load(SeqCst) {
                    sh.violation(format!("{what}: failed, but the body returned no Err"));
                }
            }
            Err(e) => sh.violation(format!("{what}: unexpected {e:?}")),
        }
    }

    fn cancel_plan(&mut self) -> u64 {
        // 0 none, 1 cancel the scope, 2 cancel one child, 3 the scope's
        // job, 4 the scope's job cancelled and joined by a detached helper
        if self.rng.chance(35) {
            1 + self.rng.below(4)
        } else {
            0
        }
    }

    fn regular_scope(&mut self) {
        let n = 1 + self.rng.below(3) as usize;
        let plan = self.cancel_plan();
        let delay = dur(&mut self.rng);
        let victim = self.rng.below(n as u64) as usize;
        let src = self.may_cancel || self.in_timeout > 0 || self.sh.panics || plan != 0;
        let kids: Vec<(Ctx, usize)> = (0..n)
            .map(|_| {
                let steps = 1 + self.rng.below(12) as usize;
                (self.child(src), steps)
            })
            .collect();
        let recs: Vec<Rec> = (0..n).map(|_| Rec::default()).collect();
        let sh = self.sh.clone();
        let me = &*self;
        let helper = std::sync::Mutex::new(None);
        let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
            fiber::scope(|s| {
                let hs: Vec<_> = kids
                    .into_iter()
                    .zip(&recs)
                    .map(|((ctx, steps), rec)| {
                        let life = Life::new(&sh);
                        s.spawn(move || {
                            let _life = life;
                            Ctx::child_body(ctx, rec, steps)
                        })
                    })
                    .collect();
                if plan != 0 {
                    let _ = fiber::sleep(delay);
                    match plan {
                        1 => s.cancel(),
                        2 => hs[victim].cancel(),
                        3 => s.job().cancel(),
                        _ => {
                            let job = s.job();
                            let life = Life::new(&sh);
                            *helper.lock().unwrap() = Some(fiber::spawn(move || {
                                let _life = life;
                                job.cancel_and_join()
                            }));
                        }
                    }
                }
                let mut outcomes = 0;
                for (i, h) in hs.into_iter().enumerate() {
                    me.check_join(&recs[i], src, h.join(), "scoped child");
                    outcomes += 1;
                }
                if outcomes != n {
                    sh.violation(format!("scope: {outcomes} outcomes of {n} children"));
                }
            })
        }));
        if let Err(p) = r {
            if sh.shutdown {
                std::panic::resume_unwind(p);
            }
            sh.violation("a scope whose every child was joined panicked".into());
        }
        self.join_helper(helper.into_inner().unwrap());
    }

    /// The detached helper that cancel-and-joined a scope's job: the job
    /// has ended by the time the scope returned.
    fn join_helper(&self, helper: Option<fiber::JoinHandle<Result<fiber::JobState, fiber::Cancelled>>>) {
        let Some(h) = helper else { return };
        match h.join() {
            Ok(Ok(state)) if state.is_terminal() => {}
            Ok(Ok(state)) => self
                .sh
                .violation(format!("cancel_and_join returned a live state {state:?}")),
            Ok(Err(_)) | Err(_) if self.sh.shutdown || self.cancel_ok() => {}
            other => self.sh.violation(format!("cancel_and_join helper: {other:?}")),
        }
    }

    fn supervisor(&mut self) {
        let n = 1 + self.rng.below(3) as usize;
        let plan = self.cancel_plan();
        let delay = dur(&mut self.rng);
        let victim = self.rng.below(n as u64) as usize;
        let src = self.may_cancel || self.in_timeout > 0 || plan != 0;
        let kids: Vec<(Ctx, usize)> = (0..n)
            .map(|_| {
                let steps = 1 + self.rng.below(12) as usize;
                (self.child(src), steps)
            })
            .collect();
        let recs: Vec<Rec> = (0..n).map(|_| Rec::default()).collect();
        // a child left unjoined (the scope waits for it)
        let leave = self.rng.chance(20);
        let sh = self.sh.clone();
        let me = &*self;
        let helper = std::sync::Mutex::new(None);
        let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
            fiber::supervisor_scope(|s| {
                let mut hs: Vec<_> = kids
                    .into_iter()
                    .zip(&recs)
                    .map(|((ctx, steps), rec)| {
                        let life = Life::new(&sh);
                        Some(s.spawn(move || {
                            let _life = life;
                            Ctx::child_body(ctx, rec, steps)
                        }))
                    })
                    .collect();
                if plan != 0 {
                    let _ = fiber::sleep(delay);
                    match plan {
                        1 => s.cancel(),
                        2 => hs[victim].as_ref().unwrap().cancel(),
                        3 => s.job().cancel(),
                        _ => {
                            let job = s.job();
                            let life = Life::new(&sh);
                            *helper.lock().unwrap() = Some(fiber::spawn(move || {
                                let _life = life;
                                job.cancel_and_join()
                            }));
                        }
                    }
                }
                if leave {
                    hs[0] = None;
                }
                for (i, h) in hs.into_iter().enumerate() {
                    if let Some(h) = h {
                        me.check_join(&recs[i], src, h.join(), "supervised child");
                    }
                }
            })
        }));
        if let Err(p) = r {
            if sh.shutdown {
                std::panic::resume_unwind(p);
            }
            sh.violation("a supervisor scope panicked".into());
        }
        self.join_helper(helper.into_inner().unwrap());
        if leave && !sh.shutdown {
            // the unjoined child ended before the scope returned
            let rec = &recs[0];
            if rec.started.load(SeqCst) && !rec.completed.load(SeqCst) && !rec.panicked.load(SeqCst) && !src {
                sh.violation("a supervisor scope returned before an unjoined child ended".into());
            }
        }
    }

    fn try_scope(&mut self) {
        let n = 1 + self.rng.below(3) as usize;
        let plan = self.cancel_plan();
        let delay = dur(&mut self.rng);
        let victim = self.rng.below(n as u64) as usize;
        // a child's Err cancels its siblings
        let src = true;
        let kids: Vec<(Ctx, usize, bool)> = (0..n)
            .map(|_| {
                let steps = 1 + self.rng.below(12) as usize;
                let fail = self.rng.chance(25);
                (self.child(src), steps, fail)
            })
            .collect();
        let recs: Vec<Rec> = (0..n).map(|_| Rec::default()).collect();
        let sh = self.sh.clone();
        let me = &*self;
        let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
            fiber::try_scope(|s| -> Result<(), usize> {
                let hs: Vec<_> = kids
                    .into_iter()
                    .zip(&recs)
                    .enumerate()
                    .map(|(i, ((ctx, steps, fail), rec))| {
                        let life = Life::new(&sh);
                        s.spawn(move || {
                            let _life = life;
                            Ctx::child_body(ctx, rec, steps);
                            if fail {
                                rec.returned_err.store(true, SeqCst);
                                return Err(i);
                            }
                            Ok(())
                        })
                    })
                    .collect();
                if plan != 0 {
                    let _ = fiber::sleep(delay);
                    match plan {
                        1 | 3 => s.cancel(),
                        _ => hs[victim].cancel(),
                    }
                }
                for (i, h) in hs.into_iter().enumerate() {
                    me.check_join(&recs[i], src, h.join(), "try-scope child");
                }
                Ok(())
            })
        }));
        match r {
            Ok(Ok(())) => {}
            Ok(Err(i)) => {
                if !recs[i].returned_err.load(SeqCst) {
                    sh.violation(format!("try_scope returned Err({i}) but that child returned no Err"));
                }
            }
            Err(p) => {
                if sh.shutdown {
                    std::panic::resume_unwind(p);
                }
                sh.violation("a try_scope whose every child was joined panicked".into());
            }
        }
    }

    fn detached(&mut self) {
        let sh = self.sh.clone();
        let cancel = self.rng.chance(35);
        let delay = dur(&mut self.rng);
        let steps = 1 + self.rng.below(12) as usize;
        let ctx = self.child(cancel);
        let rec = Arc::new(Rec::default());
        let rec2 = rec.clone();
        let life = Life::new(&sh);
        let h = fiber::spawn(move || {
            let _life = life;
            Ctx::child_body(ctx, &rec2, steps)
        });
        if cancel {
            let _ = fiber::sleep(delay);
            h.cancel();
        }
        let r = h.join();
        self.check_join(&rec, cancel, r, "detached child");
    }
}

// ---------------------------------------------------------------- programs

#[derive(Clone, Copy, Debug)]
enum RtKind {
    One,
    Two,
    Elastic,
}

fn make_rt(kind: RtKind, grace: Duration) -> fiber::Runtime {
    let (w, m) = match kind {
        RtKind::One => (1, 1),
        RtKind::Two => (2, 2),
        RtKind::Elastic => (1, 3),
    };
    fiber::Runtime::builder()
        .workers(w)
        .max_workers(m)
        .shutdown_timeout(grace)
        .build()
        .unwrap()
}

fn program(seed: u64, kind: RtKind, shutdown: bool) {
    let mut rng = Rng::new(seed);
    let led = Ledger::new();
    let n_chans = 1 + rng.below(4) as usize;
    let chans = (0..n_chans)
        .map(|_| {
            let cap = match rng.below(4) {
                0 => Some(0),
                1 => Some(1),
                2 => Some(2 + rng.below(6) as usize),
                _ => None,
            };
            let (tx, rx) = match cap {
                Some(k) => chan::bounded(k),
                None => chan::unbounded(),
            };
            Chan { tx, rx, cap }
        })
        .collect();
    let sem_k = 1 + rng.below(3) as usize;
    let sh = Arc::new(Shared {
        led: led.clone(),
        chans,
        m: Mutex::new(0),
        m_count: AtomicU64::new(0),
        m_in: AtomicUsize::new(0),
        rw: RwLock::new(0),
        rw_count: AtomicU64::new(0),
        sem: Semaphore::new(sem_k),
        sem_k,
        sem_in: AtomicUsize::new(0),
        cvm: Mutex::new(0),
        cv: Condvar::new(),
        barrier: Barrier::new(1 + rng.below(3) as usize),
        once: Once::new(),
        once_runs: AtomicU64::new(0),
        once_returned: AtomicBool::new(false),
        live: AtomicI64::new(0),
        spawned: AtomicU64::new(0),
        panics: rng.chance(40),
        shutdown,
        seed,
    });
    let grace = if shutdown { ms(30) } else { ms(300) };
    let rt = make_rt(kind, grace);
    let tops = 1 + rng.below(4) as usize;
    let mut roots = Vec::new();
    let sh2 = sh.clone();
    let mut root_rng = rng.fork();
    let stop_after = ms(rng.below(8));
    let done = rt.block_on(move || {
        let sh = sh2;
        for _ in 0..tops {
            let mut ctx = Ctx {
                sh: sh.clone(),
                rng: root_rng.fork(),
                depth: 0,
                may_cancel: sh.shutdown,
                in_timeout: 0,
                may_panic: false,
            };
            let life = Life::new(&sh);
            roots.push(fiber::spawn(move || {
                let _life = life;
                ctx.node();
            }));
        }
        if sh.shutdown {
            let _ = fiber::sleep(stop_after);
            return false;
        }
        for h in roots {
            if let Err(e) = h.join() {
                // a root's own node panicked: only a shutdown unwind or a
                // violation's cascade may do that
                sh.violation(format!("a root fiber failed: {e:?}"));
            }
        }
        true
    });
    if shutdown {
        drop(rt);
    } else {
        assert!(done);
        // a detached child whose join was cancelled runs on: wait for
        // every closure to be dropped
        let start = Instant::now();
        while sh.live.load(SeqCst) != 0 {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "seed {seed} {kind:?}: {} closures alive 20 s after the roots were joined\n{}",
                sh.live.load(SeqCst),
                rt.dump()
            );
            std::thread::sleep(ms(1));
        }
        // the runtime has no fiber left
        let start = Instant::now();
        loop {
            let st = rt.stats();
            if st.fibers_alive == 0 {
                assert!(
                    st.spawns >= sh.spawned.load(SeqCst),
                    "seed {seed}: stats.spawns {} below the program's {} spawns",
                    st.spawns,
                    sh.spawned.load(SeqCst)
                );
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "seed {seed} {kind:?}: {} fibers alive after every join\n{}",
                st.fibers_alive,
                rt.dump()
            );
            std::thread::sleep(ms(1));
        }
        let dumped = rt.dump().fibers.len();
        assert_eq!(
            dumped, 0,
            "seed {seed}: the dump lists {dumped} fibers after every join"
        );
        let m = *sh.m.try_lock().expect("mutex free at the end");
        assert_eq!(m, sh.m_count.load(SeqCst), "seed {seed}: mutex counter");
        let rw = *sh.rw.try_read().expect("rwlock free at the end");
        assert_eq!(rw, sh.rw_count.load(SeqCst), "seed {seed}: rwlock counter");
        assert_eq!(sh.sem.available_permits(), sh.sem_k, "seed {seed}: semaphore permits");
        drop(rt);
    }
    let runs = sh.once_runs.load(SeqCst);
    assert!(runs <= 1, "seed {seed}: Once ran {runs} times");
    if sh.once_returned.load(SeqCst) {
        assert_eq!(runs, 1, "seed {seed}: a call_once returned but the Once never ran");
    }
    if std::env::var_os("FUZZ_VERBOSE").is_some() {
        eprintln!("  spawned {} tokens {}", sh.spawned.load(SeqCst), led.next.load(SeqCst));
    }
    let live = sh.live.load(SeqCst);
    assert_eq!(
        live, 0,
        "seed {seed} {kind:?} shutdown={shutdown}: {live} closures never dropped (fibers lost)"
    );
    drop(sh);
    let start = Instant::now();
    while !led.settled() && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(ms(1));
    }
    led.check(&format!("seed {seed} {kind:?} shutdown={shutdown}"));
}

fn fuzz(seeds: std::ops::Range<u64>, kind: RtKind, shutdown: bool, secs: u64) {
    quiet_panics(is_planned);
    run_seeds(seeds, kind, shutdown, secs, program);
}

fn scaled(n: u64) -> u64 {
    n * env_u64("R52_SCALE", 1)
}

#[test]
fn fuzz_one_worker() {
    fuzz(0..scaled(60), RtKind::One, false, 600);
}

#[test]
fn fuzz_two_workers() {
    fuzz(10_000..10_000 + scaled(60), RtKind::Two, false, 600);
}

#[test]
fn fuzz_elastic() {
    fuzz(20_000..20_000 + scaled(40), RtKind::Elastic, false, 600);
}

#[test]
fn fuzz_shutdown_mid_program() {
    fuzz(30_000..30_000 + scaled(20), RtKind::One, true, 600);
    fuzz(40_000..40_000 + scaled(20), RtKind::Two, true, 600);
}

#[test]
#[ignore = "one seed: R52_SEED, R52_KIND (one, two, elastic), R52_SHUTDOWN"]
fn fuzz_one_seed() {
    let seed = env_u64("R52_SEED", 0);
    let kind = match std::env::var("R52_KIND").as_deref() {
        Ok("two") => RtKind::Two,
        Ok("elastic") => RtKind::Elastic,
        _ => RtKind::One,
    };
    let shutdown = std::env::var_os("R52_SHUTDOWN").is_some();
    fuzz(seed..seed + 1, kind, shutdown, 120);
}

#[test]
#[ignore = "long fuzz run: FUZZ_SEEDS=n, FUZZ_START=first seed"]
fn fuzz_long() {
    let n = env_u64("FUZZ_SEEDS", 1000);
    let start = env_u64("FUZZ_START", 1_000_000);
    for (k, kind) in [RtKind::One, RtKind::Two, RtKind::Elastic].into_iter().enumerate() {
        let base = start + k as u64 * 1_000_000;
        fuzz(base..base + n, kind, false, 36_000);
        fuzz(base + 500_000..base + 500_000 + n / 5, kind, true, 36_000);
    }
}

// ---------------------------------------------------------------- minimised

/// A loop of sends and receives that always succeed at once (a self-fed
/// unbounded channel) inside `with_timeout(4 ms)`; `Some(rounds)` if it
/// ended (a send or receive failed as cancelled, or the deadline's
/// `TimedOut`) within `limit`, `None` if the test had to cut it.
fn self_fed_loop_under_with_timeout(limit: Duration) -> Option<u64> {
    let (tx, rx) = chan::unbounded::<u64>();
    let t0 = Instant::now();
    let mut i = 0u64;
    let r = fiber::with_timeout(ms(4), || loop {
        i += 1;
        if t0.elapsed() > limit {
            return false;
        }
        if tx.send(i).is_err() || rx.recv().is_err() {
            return true;
        }
    });
    matches!(r, Ok(true) | Err(_)).then_some(i)
}

// Failed before the fix: a fiber told of its JoinHandle::cancel (a sleep returned Cancelled) is never told again, so a with_timeout it opens later never ends its loop of successful channel operations
#[test]
fn a_with_timeout_opened_after_a_told_handle_cancel_ends_its_loop_of_successful_recvs() {
    within(30, || {
        rt1().block_on(|| {
            let (res_tx, res_rx) = chan::bounded(1);
            let h = fiber::spawn(move || {
                // told: the wait returns Cancelled
                assert!(fiber::sleep(Duration::from_secs(10)).is_err());
                // clean-up that bounds itself with a deadline
                let _ = res_tx.send(self_fed_loop_under_with_timeout(Duration::from_secs(2)));
            });
            fiber::sleep(ms(5)).unwrap();
            h.cancel();
            assert!(h.join().unwrap_err().is_cancelled());
            let ended = res_rx.recv().unwrap();
            assert!(
                ended.is_some(),
                "the loop under with_timeout(4 ms) still ran after 2 s: its deadline never reached it"
            );
        })
    });
}

/// The same loop ends when the earlier tell was of a scope's
/// cancellation or of an outer `with_timeout` (the deadline's scope is
/// another), and in a fiber that was never cancelled.
#[test]
fn a_with_timeout_opened_after_a_told_scope_cancel_or_timeout_ends_its_loop() {
    within(30, || {
        rt1().block_on(|| {
            let (res_tx, res_rx) = chan::bounded(1);
            fiber::scope(|s| {
                let h = s.spawn(move || {
                    assert!(fiber::sleep(Duration::from_secs(10)).is_err());
                    let _ = res_tx.send(self_fed_loop_under_with_timeout(Duration::from_secs(2)));
                });
                fiber::sleep(ms(5)).unwrap();
                s.cancel();
                assert!(h.join().unwrap_err().is_cancelled());
            });
            assert!(res_rx.recv().unwrap().is_some(), "after a told scope cancel");
            let r = fiber::with_timeout(ms(5), || {
                assert!(fiber::sleep(Duration::from_secs(10)).is_err());
                self_fed_loop_under_with_timeout(Duration::from_secs(2))
            });
            assert!(r.is_err(), "the outer with_timeout reports its deadline");
            assert!(
                self_fed_loop_under_with_timeout(Duration::from_secs(2)).is_some(),
                "in a fiber never cancelled"
            );
        })
    });
}
