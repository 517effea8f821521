//! Adversarial review, round 27: seeded random programs (a small fuzzer).
//!
//! From a seed, a tiny xorshift generator builds a program over the public
//! facade: 2 to 8 actors (detached fibers with handles, scoped children
//! under `scope` / `supervisor_scope` / `try_scope`, fibers running their
//! ops inside `fiber::blocking`, plain `std::thread`s) share 1 to 4
//! channels (`bounded(0)`, `bounded(k)`, `unbounded`) and one set of
//! `fiber::sync` primitives, and each runs a random sequence of operations:
//! every send/receive form, `Select` and `select!` with `default`, timeouts
//! and `after` arms, drops and clones of endpoints, `close`, Mutex / RwLock
//! / Semaphore / Condvar / Barrier / WaitGroup use, sleeps and yields,
//! cancelling another actor's job, `with_timeout`, `non_cancellable`
//! sections and panics.
//!
//! Every operation that waits has a timeout (a `_timeout` form, or an
//! untimed wait wrapped in `with_timeout`, or a select with an `after` arm),
//! and no lock is held across another lock, so the program cannot
//! legitimately hang: a hang is a runtime bug. Values are unique tokens
//! whose drop is recorded: every token created must end received exactly
//! once or dropped exactly once. Mutex- and RwLock-protected counters must
//! be exact, the semaphore never over-admits, every join reports an outcome
//! consistent with what its body did, and once everything is joined the
//! runtime has no live fiber left. A second mode returns from the root
//! while actors are parked on untimed waits and drops the runtime: the drop
//! must return and every token must still be accounted for.
//!
//! `FUZZ_SEEDS=n cargo test --release -p fiber --test reviews
//! -- --ignored review27::fuzz_long` runs the long variant (`FUZZ_START` moves the
//! first seed).

use crate::common::fuzz::Rng;
use crate::common::{ms, within};
use fiber::chan::{self, Receiver, Select, Sender};
use fiber::sync::{Barrier, Condvar, Mutex, RwLock, Semaphore, WaitGroup};
use fiber::Job;
use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
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
    /// Every token created has exactly one fate.
    fn check(&self, what: &str) {
        let errors = self.errors.lock().unwrap_or_else(|e| e.into_inner()).clone();
        assert!(errors.is_empty(), "{what}: {errors:?}");
        let created = self.next.load(SeqCst);
        let map = self.fate.lock().unwrap_or_else(|e| e.into_inner());
        let lost: Vec<u64> = (0..created).filter(|id| !map.contains_key(id)).take(10).collect();
        assert!(
            lost.is_empty(),
            "{what}: tokens lost (never received nor dropped): {lost:?} of {created}"
        );
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
    /// The receiver's end of a token.
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

const PANIC_MARK: &str = "review27 planned panic";

#[derive(Default)]
struct Outcome {
    completed: AtomicBool,
    panicked: AtomicBool,
}

struct Shared {
    led: Arc<Ledger>,
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
    jobs: std::sync::Mutex<Vec<Option<Job>>>,
    /// Some cancellation was requested (an actor's job, or a scope's
    /// siblings after a failure): a join may then report `Cancelled`.
    cancel_seen: AtomicBool,
    outcomes: Vec<Outcome>,
    kinds: Vec<Kind>,
    /// Per actor: a cancellation may have been aimed at it.
    marks: Vec<AtomicBool>,
    /// Untimed waits allowed (the shutdown mode: the runtime's drop ends them).
    untimed: bool,
}

impl Shared {
    /// Actor `i` may be cancelled from now on (with its whole scope group:
    /// a scoped child's job may be shared, and a failure cancels siblings).
    fn mark(&self, i: usize) {
        let k = self.kinds[i];
        for (j, kj) in self.kinds.iter().enumerate() {
            if j == i || (k != Kind::Detached && *kj == k) {
                self.marks[j].store(true, SeqCst);
            }
        }
    }
    fn marked(&self, i: usize) -> bool {
        self.cancel_seen.load(SeqCst) || self.marks[i].load(SeqCst)
    }
    fn violation(&self, e: String) {
        self.led.error(e);
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Detached,
    Scoped,
    Supervised,
    TryScoped,
    Blocking,
    Thread,
}

/// One actor's endpoints and generator.
struct Ctx {
    sh: Arc<Shared>,
    tx: Vec<Option<Sender<Tok>>>,
    rx: Vec<Option<Receiver<Tok>>>,
    extra_tx: Vec<Sender<Tok>>,
    extra_rx: Vec<Receiver<Tok>>,
    rng: Rng,
    in_fiber: bool,
    me: usize,
    kind: Kind,
    caps: Vec<Option<usize>>,
    /// In a `non_cancellable` section (and no `with_timeout` inside it).
    held: bool,
}

fn dur(rng: &mut Rng) -> Duration {
    match rng.below(10) {
        0..=2 => Duration::ZERO,
        3..=7 => Duration::from_micros(100 + rng.below(900)),
        _ => ms(1 + rng.below(3)),
    }
}

impl Ctx {
    fn led(&self) -> Arc<Ledger> {
        self.sh.led.clone()
    }
    fn pick_tx(&mut self) -> Option<Sender<Tok>> {
        let n = self.tx.len() as u64;
        let c = self.rng.below(n) as usize;
        self.tx[c].clone()
    }
    fn pick_rx(&mut self) -> Option<Receiver<Tok>> {
        let n = self.rx.len() as u64;
        let c = self.rng.below(n) as usize;
        self.rx[c].clone()
    }

    /// Run `n` random operations; `depth` bounds nesting.
    fn run(&mut self, n: usize, depth: u32) {
        for _ in 0..n {
            self.step(depth);
        }
    }

    fn step(&mut self, depth: u32) {
        let sh = self.sh.clone();
        let led = self.led();
        let op = self.rng.below(if self.in_fiber { 30 } else { 20 });
        match op {
            // ---- channels
            0 | 1 => {
                if let Some(tx) = self.pick_tx() {
                    let d = dur(&mut self.rng);
                    let t0 = Instant::now();
                    if let Err(chan::SendTimeoutError::Timeout(t)) = tx.send_timeout(Tok::new(&led), d) {
                        drop(t);
                        self.not_early(t0, d, "send_timeout");
                    }
                }
            }
            2 => {
                if let Some(tx) = self.pick_tx() {
                    let _ = tx.try_send(Tok::new(&led));
                }
            }
            3 | 4 => {
                if let Some(rx) = self.pick_rx() {
                    let d = dur(&mut self.rng);
                    let t0 = Instant::now();
                    match rx.recv_timeout(d) {
                        Ok(t) => self.got(t),
                        Err(chan::RecvTimeoutError::Timeout) => self.not_early(t0, d, "recv_timeout"),
                        Err(_) => {}
                    }
                }
            }
            5 => {
                if let Some(rx) = self.pick_rx() {
                    if let Ok(t) = rx.try_recv() {
                        self.got(t);
                    }
                    let c = self.rng.below(self.caps.len() as u64) as usize;
                    if let (Some(k), Some(rx)) = (self.caps[c], &self.rx[c]) {
                        let len = rx.len();
                        if len > k.max(1) {
                            self.sh.violation(format!("bounded({k}) reports len {len}"));
                        }
                    }
                }
            }
            6 | 7 => self.select_dynamic(),
            8 => self.select_macro(),
            9 => {
                // endpoint churn
                let c = self.rng.below(self.tx.len() as u64) as usize;
                match self.rng.below(6) {
                    0 => self.tx[c] = None,
                    1 => self.rx[c] = None,
                    2 => {
                        if let Some(t) = &self.tx[c] {
                            self.extra_tx.push(t.clone());
                        }
                    }
                    3 => {
                        if let Some(r) = &self.rx[c] {
                            self.extra_rx.push(r.clone());
                        }
                    }
                    4 => {
                        self.extra_tx.pop();
                        self.extra_rx.pop();
                    }
                    _ => {
                        if self.rng.chance(30) {
                            if let Some(t) = &self.tx[c] {
                                t.close();
                            }
                        }
                    }
                }
            }
            // ---- locks
            10 | 11 => {
                let mut g = sh.m.lock().unwrap_or_else(|e| e.into_inner());
                if sh.m_in.fetch_add(1, SeqCst) != 0 {
                    sh.violation("two holders of the mutex".into());
                }
                *g += 1;
                sh.m_count.fetch_add(1, SeqCst);
                if self.rng.chance(30) {
                    if self.in_fiber {
                        let _ = fiber::yield_now();
                    } else {
                        std::thread::yield_now();
                    }
                }
                sh.m_in.fetch_sub(1, SeqCst);
                drop(g);
            }
            12 => {
                if self.rng.chance(50) {
                    let mut g = sh.rw.write().unwrap_or_else(|e| e.into_inner());
                    *g += 1;
                    sh.rw_count.fetch_add(1, SeqCst);
                } else {
                    let g = sh.rw.read().unwrap_or_else(|e| e.into_inner());
                    let seen = *g;
                    let floor = sh.rw_count.load(SeqCst);
                    if seen != floor {
                        sh.violation(format!("rwlock reader saw {seen}, writers counted {floor}"));
                    }
                }
            }
            13 => {
                if let Some(p) = sh.sem.try_acquire() {
                    self.in_sem(p);
                }
            }
            14 => {
                // condvar: notify or wait a moment
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
            15..=17 => {
                let d = dur(&mut self.rng);
                if self.in_fiber {
                    let t0 = Instant::now();
                    if fiber::sleep(d).is_ok() {
                        self.not_early(t0, d, "sleep");
                    } else {
                        self.cancel_expected(depth, "sleep");
                    }
                } else {
                    std::thread::sleep(d);
                }
            }
            18 | 19 => {
                if self.in_fiber {
                    if fiber::yield_now().is_err() {
                        self.cancel_expected(depth, "yield_now");
                    }
                } else {
                    std::thread::yield_now();
                }
            }
            // ---- fiber-only
            20 => {
                let d = dur(&mut self.rng) + Duration::from_micros(200);
                let sh2 = sh.clone();
                let _ = fiber::with_timeout(d, || {
                    if let Ok(p) = sh2.sem.acquire() {
                        let now = sh2.sem_in.fetch_add(1, SeqCst) + 1;
                        if now > sh2.sem_k {
                            sh2.violation(format!("semaphore of {} admitted {now}", sh2.sem_k));
                        }
                        let _ = fiber::yield_now();
                        sh2.sem_in.fetch_sub(1, SeqCst);
                        drop(p);
                    }
                });
            }
            21 => {
                let d = dur(&mut self.rng) + Duration::from_micros(200);
                let sh2 = sh.clone();
                let _ = fiber::with_timeout(d, || sh2.barrier.wait());
            }
            22 => {
                let wg = WaitGroup::new();
                let w2 = wg.clone();
                let d = dur(&mut self.rng);
                let h = fiber::spawn(move || {
                    let _ = fiber::sleep(d);
                    drop(w2);
                });
                let _ = fiber::with_timeout(d + ms(2), || wg.wait());
                let _ = h.join();
            }
            23 => {
                // untimed channel op under a deadline
                let d = dur(&mut self.rng) + Duration::from_micros(100);
                if self.rng.chance(50) {
                    if let Some(tx) = self.pick_tx() {
                        let t = Tok::new(&led);
                        let untimed = sh.untimed && self.rng.chance(50);
                        if untimed {
                            let _ = tx.send(t);
                        } else {
                            let _ = fiber::with_timeout(d, move || tx.send(t));
                        }
                    }
                } else if let Some(rx) = self.pick_rx() {
                    let untimed = sh.untimed && self.rng.chance(50);
                    let r = if untimed {
                        Ok(rx.recv())
                    } else {
                        fiber::with_timeout(d, || rx.recv())
                    };
                    if let Ok(Ok(t)) = r {
                        t.take();
                    }
                }
            }
            24 => {
                // cancel another actor's job
                if self.rng.chance(50) {
                    let jobs = sh.jobs.lock().unwrap_or_else(|e| e.into_inner());
                    let i = self.rng.below(jobs.len() as u64) as usize;
                    if let Some(j) = &jobs[i] {
                        if i != self.me || self.rng.chance(20) {
                            sh.mark(i);
                            j.cancel();
                        }
                    }
                }
            }
            25 | 26 => {
                if depth < 2 {
                    let d = dur(&mut self.rng) + Duration::from_micros(300);
                    let n = 1 + self.rng.below(4) as usize;
                    let t0 = Instant::now();
                    let held = std::mem::replace(&mut self.held, false);
                    let r = fiber::with_timeout(d, || self.run(n, depth + 1));
                    self.held = held;
                    if r.is_err() {
                        self.not_early(t0, d, "with_timeout");
                    }
                }
            }
            27 => {
                if depth < 2 {
                    let n = 1 + self.rng.below(3) as usize;
                    let held = std::mem::replace(&mut self.held, true);
                    fiber::non_cancellable(|| self.run(n, depth + 1));
                    self.held = held;
                }
            }
            28 => match self.rng.below(4) {
                0 => {
                    let _ = fiber::check_cancelled();
                }
                1 => {
                    if let Some(rx) = self.pick_rx() {
                        let toks: Vec<Tok> = rx.try_iter().take(4).collect();
                        for t in toks {
                            self.got(t);
                        }
                    }
                }
                2 => {
                    if let Some(rx) = self.pick_rx() {
                        let d = dur(&mut self.rng);
                        if let Ok(t) = rx.recv_deadline(Instant::now() + d) {
                            self.got(t);
                        }
                    }
                }
                _ => {
                    if let Some(tx) = self.pick_tx() {
                        let d = dur(&mut self.rng);
                        let _ = tx.send_deadline(Tok::new(&led), Instant::now() + d);
                    }
                }
            },
            _ => {
                // a random sub-select over `after`
                let d = dur(&mut self.rng);
                let a = chan::after(d);
                if let Some(rx) = self.pick_rx() {
                    fiber::select! {
                        recv(rx) -> m => if let Ok(t) = m { t.take() },
                        recv(a) -> _ => {},
                    }
                }
            }
        }
    }

    /// A wait reported a cancellation: outside `with_timeout`, only an
    /// actor someone cancelled may see one.
    fn cancel_expected(&self, depth: u32, what: &str) {
        if self.held {
            self.sh.violation(format!(
                "actor {} ({:?}): {what} reported Cancelled inside non_cancellable",
                self.me, self.kind
            ));
        }
        if depth == 0 && !self.sh.marked(self.me) {
            self.sh.violation(format!(
                "actor {} ({:?}): {what} reported Cancelled but nothing cancelled it",
                self.me, self.kind
            ));
        }
    }

    /// A wait that timed out must have waited its time (unless cancelled).
    fn not_early(&self, t0: Instant, d: Duration, what: &str) {
        let waited = t0.elapsed();
        if waited < d && !(self.in_fiber && fiber::is_cancelled()) {
            self.sh
                .violation(format!("{what}({d:?}) timed out after only {waited:?}"));
        }
    }

    /// A received token: usually taken, sometimes passed on.
    fn got(&mut self, t: Tok) {
        if self.rng.chance(25) {
            if let Some(tx) = self.pick_tx() {
                if self.rng.chance(50) {
                    let _ = tx.try_send(t);
                } else {
                    let d = dur(&mut self.rng);
                    let _ = tx.send_timeout(t, d);
                }
                return;
            }
        }
        t.take();
    }

    fn in_sem(&self, p: fiber::sync::SemaphorePermit<'_>) {
        let now = self.sh.sem_in.fetch_add(1, SeqCst) + 1;
        if now > self.sh.sem_k {
            self.sh
                .violation(format!("semaphore of {} admitted {now}", self.sh.sem_k));
        }
        self.sh.sem_in.fetch_sub(1, SeqCst);
        drop(p);
    }

    /// A `Select` of 1 to 3 channel arms, in one of several modes.
    fn select_dynamic(&mut self) {
        let led = self.led();
        let n_arms = 1 + self.rng.below(3) as usize;
        let mut plan = Vec::new();
        for _ in 0..n_arms {
            let c = self.rng.below(self.tx.len() as u64) as usize;
            plan.push((c, self.rng.chance(50)));
        }
        let mode = self.rng.below(4);
        let d = dur(&mut self.rng);
        let biased = self.rng.chance(20);
        let tick = chan::after(d);
        let in_fiber = self.in_fiber;
        let (txs, rxs) = (&self.tx, &self.rx);
        let mut sel = if biased { Select::new_biased() } else { Select::new() };
        let mut arms: Vec<(usize, bool)> = Vec::new();
        for &(c, is_send) in &plan {
            if is_send {
                if let Some(tx) = &txs[c] {
                    let i = sel.send(tx);
                    debug_assert_eq!(i, arms.len());
                    arms.push((c, true));
                }
            } else if let Some(rx) = &rxs[c] {
                sel.recv(rx);
                arms.push((c, false));
            }
        }
        let after_idx = if mode == 2 {
            let i = sel.recv(&tick);
            Some(i)
        } else {
            None
        };
        if arms.is_empty() && after_idx.is_none() {
            return;
        }
        let oper = match mode {
            0 => sel.try_select().ok(),
            1 => sel.select_timeout(d).ok(),
            2 => Some(sel.select()),
            _ => {
                if in_fiber {
                    let mut sel2 = sel.clone();
                    let r = fiber::with_timeout(d + Duration::from_micros(200), move || {
                        let oper = sel2.select();
                        let i = oper.index();
                        // complete inside: the operation borrows sel2
                        complete(oper, i, &arms, txs, rxs, &led, None);
                    });
                    let _ = r;
                    return;
                }
                sel.select_timeout(d).ok()
            }
        };
        if let Some(oper) = oper {
            let i = oper.index();
            complete(oper, i, &arms, txs, rxs, &led, after_idx.map(|a| (a, &tick)));
        }
    }

    /// `select!` with a send arm, a receive arm and `default` or a timeout.
    fn select_macro(&mut self) {
        let led = self.led();
        let (Some(tx), Some(rx)) = (self.pick_tx(), self.pick_rx()) else {
            return;
        };
        let d = dur(&mut self.rng);
        match self.rng.below(3) {
            0 => fiber::select! {
                send(tx, Tok::new(&led)) -> r => drop(r),
                recv(rx) -> m => if let Ok(t) = m { t.take() },
                default => {},
            },
            1 => fiber::select! {
                send(tx, Tok::new(&led)) -> r => drop(r),
                recv(rx) -> m => if let Ok(t) = m { t.take() },
                default(d) => {},
            },
            _ => chan::select_biased! {
                recv(rx) -> m => if let Ok(t) = m { t.take() },
                send(tx, Tok::new(&led)) -> r => drop(r),
                recv(chan::after(d)) -> _ => {},
            },
        }
    }
}

fn complete(
    oper: chan::SelectedOperation<'_, '_>,
    i: usize,
    arms: &[(usize, bool)],
    tx: &[Option<Sender<Tok>>],
    rx: &[Option<Receiver<Tok>>],
    led: &Arc<Ledger>,
    after: Option<(usize, &Receiver<Instant>)>,
) {
    if let Some((a, tick)) = after {
        if i == a {
            let _ = oper.recv(tick);
            return;
        }
    }
    let (c, is_send) = arms[i];
    if is_send {
        let _ = oper.send(tx[c].as_ref().unwrap(), Tok::new(led));
    } else if let Ok(t) = oper.recv(rx[c].as_ref().unwrap()) {
        t.take();
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
    match kind {
        RtKind::One => crate::common::rt_fixed_grace(1, grace),
        RtKind::Two => crate::common::rt_fixed_grace(2, grace),
        RtKind::Elastic => crate::common::rt_grace(2, grace),
    }
}

struct Plan {
    kinds: Vec<Kind>,
    caps: Vec<Option<usize>>,
    steps: Vec<usize>,
    panics: Vec<bool>,
    sem_k: usize,
    barrier_n: usize,
}

/// Bigger programs (more actors, longer sequences), as `FUZZ_BIG=1`.
static BIG: AtomicBool = AtomicBool::new(false);

fn plan(seed: u64, threads: bool) -> Plan {
    let mut rng = Rng::new(seed);
    let big = BIG.load(SeqCst) || std::env::var_os("FUZZ_BIG").is_some();
    let n = 2 + rng.below(if big { 11 } else { 7 }) as usize;
    let kinds = (0..n)
        .map(|_| match rng.below(if threads { 12 } else { 10 }) {
            0..=2 => Kind::Detached,
            3 | 4 => Kind::Scoped,
            5 => Kind::Supervised,
            6 | 7 => Kind::TryScoped,
            8 | 9 => Kind::Blocking,
            _ => Kind::Thread,
        })
        .collect();
    let channels = 1 + rng.below(4) as usize;
    let caps = (0..channels)
        .map(|_| match rng.below(3) {
            0 => Some(0),
            1 => Some(1 + rng.below(4) as usize),
            _ => None,
        })
        .collect();
    let steps = (0..n)
        .map(|_| 3 + rng.below(if big { 60 } else { 25 }) as usize)
        .collect();
    let panics = (0..n).map(|_| rng.chance(10)).collect();
    Plan {
        kinds,
        caps,
        steps,
        panics,
        sem_k: 1 + rng.below(3) as usize,
        barrier_n: 2 + rng.below(2) as usize,
    }
}

/// An actor's body: register its job, run its steps, maybe panic.
fn actor(mut ctx: Ctx, steps: usize, panics: bool) {
    let sh = ctx.sh.clone();
    let me = ctx.me;
    if ctx.in_fiber {
        sh.jobs.lock().unwrap_or_else(|e| e.into_inner())[me] = Some(Job::current());
    }
    let half = steps / 2;
    ctx.run(half, 0);
    if panics {
        // a failing scoped child cancels its siblings
        sh.mark(me);
        sh.outcomes[me].panicked.store(true, SeqCst);
        panic!("{PANIC_MARK}");
    }
    ctx.run(steps - half, 0);
    drop(ctx);
    sh.outcomes[me].completed.store(true, SeqCst);
}

/// A thread-side actor (plain thread or `fiber::blocking`): no fiber-only ops.
fn thread_actor(mut ctx: Ctx, steps: usize) {
    ctx.in_fiber = false;
    let sh = ctx.sh.clone();
    let me = ctx.me;
    ctx.run(steps, 0);
    drop(ctx);
    sh.outcomes[me].completed.store(true, SeqCst);
}

enum Either {
    Fiber(fiber::JoinHandle<()>),
    Thread(std::thread::JoinHandle<()>),
}

const PAIR_MSGS: u64 = 20;
const LONG: Duration = Duration::from_secs(5);

struct Msg {
    seq: u64,
    tok: Tok,
}

/// A producer and a consumer (each a fiber or a plain thread) over a
/// channel of their own, every wait with a long timeout, each side using
/// random forms; after each message the producer bumps a condvar-guarded
/// count that the consumer sometimes waits for.
fn spawn_pair(seed: u64, sh: Arc<Shared>) -> (Either, Either) {
    let mut rng = Rng::new(seed ^ 0xFA1);
    let (tx, rx) = match rng.below(3) {
        0 => chan::bounded(0),
        1 => chan::bounded(1 + rng.below(3) as usize),
        _ => chan::unbounded(),
    };
    let count = Arc::new((Mutex::new(0u64), Condvar::new()));
    let (sh2, count2) = (sh.clone(), count.clone());
    let mut prng = Rng::new(seed ^ 0xFA2);
    let producer = move || {
        let in_fiber = fiber::core::in_fiber();
        for seq in 0..PAIR_MSGS {
            let mut m = Msg {
                seq,
                tok: Tok::new(&sh2.led),
            };
            loop {
                let r = match prng.below(if in_fiber { 5 } else { 4 }) {
                    0 => tx.send_timeout(m, LONG).map_err(|e| e.into_inner()),
                    1 => match tx.try_send(m) {
                        Ok(()) => Ok(()),
                        Err(e) => {
                            if in_fiber {
                                let _ = fiber::yield_now();
                            } else {
                                std::thread::yield_now();
                            }
                            m = e.into_inner();
                            continue;
                        }
                    },
                    2 => {
                        let mut back = None;
                        fiber::select! {
                            send(tx, m) -> r => if let Err(e) = r { back = Some(e.into_inner()) },
                            default(LONG) => sh2.violation(format!("pair: select send {seq} timed out")),
                        }
                        match back {
                            Some(v) => Err(v),
                            None => Ok(()),
                        }
                    }
                    3 => tx.send(m).map_err(|e| e.into_inner()),
                    _ => match fiber::with_timeout(LONG, || tx.send(m)) {
                        Ok(r) => r.map_err(|e| e.into_inner()),
                        Err(_) => {
                            sh2.violation(format!("pair: send {seq} under with_timeout timed out"));
                            return;
                        }
                    },
                };
                if let Err(v) = r {
                    sh2.violation(format!("pair: send {} failed", v.seq));
                    return;
                }
                break;
            }
            let (m, cv) = &*count2;
            *m.lock().unwrap() += 1;
            cv.notify_all();
        }
    };
    let (sh3, count3) = (sh, count);
    let mut crng = Rng::new(seed ^ 0xFA3);
    let consumer = move || {
        let in_fiber = fiber::core::in_fiber();
        for want in 0..PAIR_MSGS {
            let got = loop {
                let r = match crng.below(5) {
                    0 => rx.recv_timeout(LONG).ok(),
                    1 => match rx.try_recv() {
                        Ok(v) => Some(v),
                        Err(chan::TryRecvError::Empty) => {
                            if in_fiber {
                                let _ = fiber::yield_now();
                            } else {
                                std::thread::yield_now();
                            }
                            continue;
                        }
                        Err(_) => None,
                    },
                    2 => fiber::select! {
                        recv(rx) -> v => v.ok(),
                        default(LONG) => None,
                    },
                    3 => rx.recv().ok(),
                    _ => {
                        let mut sel = Select::new();
                        sel.recv(&rx);
                        match sel.ready_timeout(LONG) {
                            Ok(_) => match rx.try_recv() {
                                Ok(v) => Some(v),
                                Err(_) => continue,
                            },
                            Err(_) => None,
                        }
                    }
                };
                break r;
            };
            let Some(msg) = got else {
                sh3.violation(format!("pair: message {want} never came"));
                return;
            };
            if msg.seq != want {
                sh3.violation(format!("pair: got message {} where {want} was due", msg.seq));
            }
            msg.tok.take();
            if crng.chance(20) {
                let (m, cv) = &*count3;
                let g = m.lock().unwrap();
                let (_g, t) = cv.wait_timeout_while(g, LONG, |c| *c <= want).unwrap();
                if t.timed_out() {
                    sh3.violation(format!("pair: condvar wait for count {} timed out", want + 1));
                }
            }
        }
    };
    let mut side = |f: Box<dyn FnOnce() + Send>| {
        if rng.chance(25) {
            Either::Thread(std::thread::spawn(f))
        } else {
            Either::Fiber(fiber::spawn(f))
        }
    };
    let a = side(Box::new(producer));
    let b = side(Box::new(consumer));
    (a, b)
}

/// The shutdown mode's plain thread: no senders; untimed receives until
/// every channel is disconnected (the runtime's drop must release the
/// senders its parked fibers hold).
fn draining_thread(mut ctx: Ctx) {
    ctx.tx.iter_mut().for_each(|t| *t = None);
    let sh = ctx.sh.clone();
    let mut rxs: Vec<Receiver<Tok>> = ctx.rx.iter_mut().filter_map(|r| r.take()).collect();
    while !rxs.is_empty() {
        let i = ctx.rng.below(rxs.len() as u64) as usize;
        match rxs[i].recv() {
            Ok(t) => t.take(),
            Err(_) => {
                rxs.swap_remove(i);
            }
        }
    }
    sh.outcomes[ctx.me].completed.store(true, SeqCst);
}

/// Check a join's outcome against what the body recorded.
fn check_join(sh: &Shared, me: usize, r: Result<(), fiber::JoinError>, what: &str) {
    let o = &sh.outcomes[me];
    match r {
        Ok(()) => {
            if !o.completed.load(SeqCst) {
                sh.violation(format!("{what} {me}: join Ok but the body did not complete"));
            }
        }
        Err(e) if e.is_panic() => {
            if !o.panicked.load(SeqCst) {
                sh.violation(format!(
                    "{what} {me}: join reports a panic the body never raised: {e:?}"
                ));
            } else {
                let p = e.into_panic();
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                if msg != PANIC_MARK {
                    sh.violation(format!("{what} {me}: join's panic payload is {msg:?}"));
                }
            }
        }
        Err(e) if e.is_cancelled() => {
            if !sh.cancel_seen.load(SeqCst) && !sh.marks[me].load(SeqCst) {
                sh.violation(format!("{what} {me}: join reports {e:?} but nothing was cancelled"));
            }
        }
        Err(e) => sh.violation(format!("{what} {me}: unexpected join error {e:?}")),
    }
}

/// Run the program of `seed` on a runtime of `kind`. With `shutdown`, the
/// root returns without joining (actors may wait untimed) and the runtime
/// is dropped under them.
fn program(seed: u64, kind: RtKind, shutdown: bool) {
    let p = plan(seed, true);
    let led = Ledger::new();
    let n = p.kinds.len();
    let sh = Arc::new(Shared {
        led: led.clone(),
        m: Mutex::new(0),
        m_count: AtomicU64::new(0),
        m_in: AtomicUsize::new(0),
        rw: RwLock::new(0),
        rw_count: AtomicU64::new(0),
        sem: Semaphore::new(p.sem_k),
        sem_k: p.sem_k,
        sem_in: AtomicUsize::new(0),
        cvm: Mutex::new(0),
        cv: Condvar::new(),
        barrier: Barrier::new(p.barrier_n),
        jobs: std::sync::Mutex::new(vec![None; n]),
        cancel_seen: AtomicBool::new(shutdown),
        outcomes: (0..n).map(|_| Outcome::default()).collect(),
        kinds: p.kinds.clone(),
        marks: (0..n).map(|_| AtomicBool::new(false)).collect(),
        untimed: shutdown,
    });
    let mut tx = Vec::new();
    let mut rx = Vec::new();
    for cap in &p.caps {
        let (t, r) = match cap {
            Some(k) => chan::bounded(*k),
            None => chan::unbounded(),
        };
        tx.push(Some(t));
        rx.push(Some(r));
    }
    let ctxs: Vec<Ctx> = (0..n)
        .map(|i| Ctx {
            sh: sh.clone(),
            tx: tx.clone(),
            rx: rx.clone(),
            extra_tx: Vec::new(),
            extra_rx: Vec::new(),
            rng: Rng::new(seed ^ ((i as u64 + 1) << 40)),
            in_fiber: true,
            me: i,
            kind: p.kinds[i],
            caps: p.caps.clone(),
            held: false,
        })
        .collect();
    drop((tx, rx));
    let grace = if shutdown { ms(50) } else { ms(300) };
    let rt = make_rt(kind, grace);
    let sh2 = sh.clone();
    let kinds = p.kinds.clone();
    let steps = p.steps.clone();
    let panics = p.panics.clone();
    let (threads, leftover) = rt.block_on(move || {
        let sh = sh2;
        let mut detached = Vec::new();
        let mut threads = Vec::new();
        let mut scoped = Vec::new();
        let mut supervised = Vec::new();
        let mut try_scoped = Vec::new();
        for (i, ctx) in ctxs.into_iter().enumerate() {
            let (s, pn) = (steps[i], panics[i]);
            match kinds[i] {
                Kind::Detached => detached.push((i, fiber::spawn(move || actor(ctx, s, pn)))),
                Kind::Blocking if sh.untimed && (s % 2 == 0) => {
                    // drains on a blocking-pool thread until the runtime's
                    // drop releases the senders of its parked fibers
                    detached.push((i, fiber::spawn(move || fiber::blocking(move || draining_thread(ctx)))))
                }
                Kind::Blocking => {
                    detached.push((i, fiber::spawn(move || fiber::blocking(move || thread_actor(ctx, s)))))
                }
                Kind::Thread if sh.untimed => threads.push((i, std::thread::spawn(move || draining_thread(ctx)))),
                Kind::Thread => threads.push((i, std::thread::spawn(move || thread_actor(ctx, s)))),
                Kind::Scoped => scoped.push((i, ctx, s, pn)),
                Kind::Supervised => supervised.push((i, ctx, s, pn)),
                Kind::TryScoped => try_scoped.push((i, ctx, s, pn)),
            }
        }
        // A pair that nobody cancels: every one of its waits has a partner,
        // so none may time out, and its messages stay in order.
        let pair = if !shutdown && Rng::new(seed ^ 0xFA1).chance(60) {
            Some(spawn_pair(seed, sh.clone()))
        } else {
            None
        };
        // The scope hosts: each a detached fiber, so the groups overlap.
        let mut hosts = Vec::new();
        if !scoped.is_empty() {
            let sh = sh.clone();
            hosts.push(fiber::spawn(move || {
                let any_panic = scoped.iter().any(|c| c.3);
                let sh3 = sh.clone();
                let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
                    fiber::scope(|s| {
                        let hs: Vec<_> = scoped
                            .into_iter()
                            .map(|(i, ctx, st, pn)| (i, s.spawn(move || actor(ctx, st, pn))))
                            .collect();
                        let mut rng = Rng::new(seed ^ 0x5C0E);
                        if rng.chance(10) {
                            let _ = fiber::sleep(dur(&mut rng));
                            sh3.mark(hs[0].0);
                            s.cancel();
                        } else if rng.chance(10) {
                            let (i, h) = &hs[rng.below(hs.len() as u64) as usize];
                            sh3.mark(*i);
                            h.cancel();
                        }
                        for (i, h) in hs {
                            let r = h.join();
                            if let Err(e) = &r {
                                if e.is_join_cancelled() {
                                    continue;
                                }
                            }
                            check_join(&sh3, i, r, "scoped");
                        }
                    })
                }));
                if r.is_err() && !any_panic {
                    sh.violation("scope panicked with no panicking child".into());
                }
            }));
        }
        if !supervised.is_empty() {
            let sh = sh.clone();
            hosts.push(fiber::spawn(move || {
                let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
                    fiber::supervisor_scope(|s| {
                        let hs: Vec<_> = supervised
                            .into_iter()
                            .map(|(i, ctx, st, pn)| (i, s.spawn(move || actor(ctx, st, pn))))
                            .collect();
                        for (i, h) in hs {
                            let r = h.join();
                            if matches!(&r, Err(e) if e.is_join_cancelled()) {
                                continue;
                            }
                            check_join(&sh, i, r, "supervised");
                        }
                    })
                }));
                if r.is_err() && !shutdown {
                    sh.violation("supervisor_scope panicked though every child was joined".into());
                }
            }));
        }
        if !try_scoped.is_empty() {
            let sh = sh.clone();
            hosts.push(fiber::spawn(move || {
                let sh3 = sh.clone();
                let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
                    fiber::try_scope(|s| -> Result<(), usize> {
                        for (i, ctx, st, pn) in try_scoped {
                            let sh4 = sh3.clone();
                            s.spawn(move || {
                                let fail = ctx.rng.clone().chance(20);
                                actor(ctx, st, pn);
                                if fail {
                                    sh4.mark(i);
                                    return Err(i);
                                }
                                Ok(())
                            });
                        }
                        Ok(())
                    })
                }));
                let _ = r;
            }));
        }
        if shutdown {
            // leave everything running or parked: the runtime's drop ends it
            let _ = fiber::sleep(ms(Rng::new(seed).below(5)));
            drop(hosts);
            return (threads, detached);
        }
        let mut rng = Rng::new(seed ^ 0xC0FFEE);
        for (i, h) in &detached {
            if rng.chance(10) {
                if rng.chance(50) {
                    let _ = fiber::sleep(dur(&mut rng));
                }
                sh.mark(*i);
                h.cancel();
            }
        }
        for (i, h) in detached {
            let r = h.join();
            let what = if kinds[i] == Kind::Blocking {
                "blocking"
            } else {
                "detached"
            };
            check_join(&sh, i, r, what);
        }
        for h in hosts {
            if let Err(e) = h.join() {
                sh.violation(format!("a scope host failed: {e:?}"));
            }
        }
        if let Some((a, b)) = pair {
            for h in [a, b] {
                match h {
                    Either::Fiber(h) => {
                        if let Err(e) = h.join() {
                            sh.violation(format!("pair fiber failed: {e:?}"));
                        }
                    }
                    Either::Thread(t) => {
                        if fiber::blocking(move || t.join()).is_err() {
                            sh.violation("pair thread failed".into());
                        }
                    }
                }
            }
        }
        (threads, Vec::new())
    });
    let rt = if shutdown {
        // drop the runtime under its parked fibers, then join their
        // handles from this plain thread
        drop(rt);
        for (i, h) in leftover {
            check_join(&sh, i, h.join(), "after the runtime");
        }
        None
    } else {
        Some(rt)
    };
    for (i, t) in threads {
        if t.join().is_err() {
            sh.violation(format!("thread {i} panicked"));
        }
    }
    if let Some(rt) = rt {
        // locks exact, nothing left alive
        let m = *sh.m.try_lock().expect("mutex free at the end");
        assert_eq!(m, sh.m_count.load(SeqCst), "seed {seed}: mutex counter");
        let rw = *sh.rw.try_read().expect("rwlock free at the end");
        assert_eq!(rw, sh.rw_count.load(SeqCst), "seed {seed}: rwlock counter");
        assert_eq!(sh.sem.available_permits(), p.sem_k, "seed {seed}: semaphore permits");
        let start = Instant::now();
        loop {
            let alive = rt.stats().fibers_alive;
            if alive == 0 {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "seed {seed} {kind:?}: {alive} fibers still alive after every join"
            );
            std::thread::sleep(ms(1));
        }
        drop(rt);
    }
    sh.jobs.lock().unwrap().clear();
    drop(sh);
    if shutdown {
        // a fiber in a `fiber::blocking` call at teardown is given up on and
        // unwound by the reaper once its call returns (spec/sched.md): its
        // tokens are accounted for a moment after the drop, not at once
        let start = Instant::now();
        while led.fate.lock().unwrap().len() as u64 != led.next.load(SeqCst)
            && start.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(ms(1));
        }
    }
    led.check(&format!("seed {seed} {kind:?} shutdown={shutdown}"));
    if std::env::var_os("FUZZ_VERBOSE").is_some() {
        let map = led.fate.lock().unwrap();
        let received = map.values().filter(|f| **f == "received").count();
        eprintln!("  tokens {} received {received}", map.len());
    }
}

/// Keep the planned panics out of the output (other panics print as usual).
fn quiet_planned_panics() {
    crate::common::fuzz::quiet_panics(is_planned);
}

fn fuzz(seeds: std::ops::Range<u64>, kind: RtKind, shutdown: bool, secs: u64) {
    quiet_planned_panics();
    crate::common::fuzz::run_seeds(seeds, kind, shutdown, secs, program);
}

fn is_planned(p: &(dyn std::any::Any + Send)) -> bool {
    p.downcast_ref::<&str>() == Some(&PANIC_MARK) || p.downcast_ref::<String>().map(|s| s.as_str()) == Some(PANIC_MARK)
}

#[test]
fn fuzz_one_worker() {
    fuzz(0..200, RtKind::One, false, 120);
}

#[test]
fn fuzz_two_workers() {
    fuzz(1000..1200, RtKind::Two, false, 120);
}

#[test]
fn fuzz_elastic() {
    fuzz(2000..2200, RtKind::Elastic, false, 120);
}

#[test]
fn fuzz_shutdown_with_parked_actors() {
    fuzz(3000..3050, RtKind::Two, true, 120);
    fuzz(4000..4050, RtKind::One, true, 120);
    fuzz(5000..5050, RtKind::Elastic, true, 120);
}

#[test]
#[ignore = "long fuzz run (minutes): FUZZ_SEEDS=n, FUZZ_START=first seed, --release"]
fn fuzz_long() {
    let n: u64 = crate::common::fuzz::env_u64("FUZZ_SEEDS", 2000);
    let start: u64 = crate::common::fuzz::env_u64("FUZZ_START", 100_000);
    let kinds = [RtKind::One, RtKind::Two, RtKind::Elastic];
    for (k, kind) in kinds.into_iter().enumerate() {
        let base = start + k as u64 * 1_000_000;
        fuzz(base..base + n, kind, false, 3600);
        fuzz(base + 500_000..base + 500_000 + n / 10, kind, true, 3600);
    }
}

#[test]
#[ignore = "long fuzz run of the shutdown mode (minutes): FUZZ_SEEDS=n, FUZZ_START=first seed, --release"]
fn fuzz_long_shutdown() {
    let n: u64 = crate::common::fuzz::env_u64("FUZZ_SEEDS", 1000);
    let start: u64 = crate::common::fuzz::env_u64("FUZZ_START", 700_000);
    let kinds = [RtKind::One, RtKind::Two, RtKind::Elastic];
    for (k, kind) in kinds.into_iter().enumerate() {
        let base = start + k as u64 * 1_000_000;
        fuzz(base..base + n, kind, true, 3600);
    }
}

/// Shrunk from a hang of `fuzz_long_shutdown`: a fiber in a
/// `fiber::blocking` call whose closure waits for a sender that a fiber in
/// a `non_cancellable` section holds. Dropping the runtime unwinds the
/// holder at teardown (the call then returns) at about the moment it gives
/// the caller up; the caller's handle, joined afterwards from a plain
/// thread, must report (`Cancelled`, spec/sched.md: "its joiners get
/// `Cancelled`"), never wait for ever.
fn given_up_blocking_caller_round(workers: usize, grace: Duration) -> Result<(), fiber::JoinError> {
    let rt = crate::common::rt_fixed_grace(workers, grace);
    let h = rt.block_on(|| {
        let (tx, rx) = chan::bounded::<()>(0);
        let (in_call_tx, in_call_rx) = std::sync::mpsc::channel();
        fiber::spawn(move || {
            fiber::non_cancellable(|| {
                let _tx = tx;
                let _ = fiber::sleep(Duration::from_secs(3600));
            })
        });
        let caller = fiber::spawn(move || {
            fiber::blocking(move || {
                in_call_tx.send(()).unwrap();
                let _ = rx.recv();
            })
        });
        fiber::blocking(move || in_call_rx.recv().unwrap());
        caller
    });
    drop(rt);
    h.join()
}

// Failed before the fix: in a debug build (2 of 2 runs; 0 of 3 in release) a round's h.join() after drop(rt) never returns, with no runtime thread left
#[test]
fn a_fiber_given_up_in_a_blocking_call_can_be_joined_after_the_runtime_is_dropped() {
    within(30, || {
        for round in 0..200u64 {
            let grace = Duration::from_micros(200 + (round % 7) * 300);
            let r = given_up_blocking_caller_round(1 + (round % 2) as usize, grace);
            assert!(matches!(&r, Ok(()) | Err(_)));
        }
    });
}

// Hung before the fix in 2 of about 17,000 release shutdown seeds (this replay did not reproduce it in 120 runs): after the runtime's drop, a JoinHandle joined from a plain thread never returned
#[test]
fn replay_seed_1100765_one_worker_shutdown() {
    BIG.store(true, SeqCst);
    quiet_planned_panics();
    for _ in 0..40 {
        within(30, || program(1_100_765, RtKind::One, true));
    }
}
