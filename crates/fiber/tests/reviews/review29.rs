//! Adversarial review, round 29: seeded random programs, widened.
//!
//! Round 27's fuzzer drove channels, selects, locks and cancellation of
//! whole actors. This one (self-contained, same xorshift generator and
//! token ledger) drives what it left out: nested `scope` /
//! `supervisor_scope` / `try_scope` inside actors with failing, panicking
//! and cancelled children, a child cancelling its parent scope's job, a
//! sibling's `Job` cancelled (or cancel-and-joined) by another child,
//! `Job::current()` of a detached fiber cancel-and-joined by its spawner
//! (the root job and the handle must agree), `with_timeout` nested in
//! `with_timeout`, `non_cancellable` sections inside cancelled scopes,
//! `JoinHandle::cancel` and joins of cancelled or panicked fibers,
//! fiber-locals (a value per fiber, tokens dropped with the fiber),
//! `park` / `unpark` tokens (an unpark before a park is never lost),
//! `OnceLock` initialisation races (with panicking initialisers),
//! `Barrier` waits under timeouts (every generation releases exactly `n`
//! waiters), `Semaphore` acquires under timeouts, and loopback byte
//! streams (`TcpStream` over 127.0.0.1 or `UnixStream::pair`) read with
//! read timeouts, under `with_timeout` and from fibers cancelled mid-read,
//! whose bytes must arrive exactly once and in order.
//!
//! Every wait has a timeout or a partner that is never cancelled, so a
//! hang is a runtime bug. Checked: every token ends received or dropped
//! exactly once; a wait reports `Cancelled` only where something cancelled
//! it (an enclosing scope, a handle, a job, a deadline); no timeout fires
//! early; a scope returns only after every child ended, re-raises exactly
//! when an unjoined child panicked (a supervisor scope never), a try-scope
//! fails exactly when a child failed; join outcomes match what the body
//! did; counters are exact and no fiber is left alive after every join.
//! The shutdown mode adds untimed waits (park, semaphore, barrier,
//! `OnceLock::wait`, socket reads, sleeps) and drops the runtime while
//! actors are parked in them: the drop must return, the dropping thread
//! must not be left panicking, every token must be accounted for and
//! joins of the handles afterwards must return.
//!
//! `FUZZ_SEEDS=n cargo test --release -p fiber --test reviews
//! -- --ignored review29::fuzz_long` runs the long variant (`FUZZ_START` moves the
//! first seed; `fuzz_long_shutdown` runs only the shutdown mode).

use crate::common::fuzz::Rng;
use crate::common::ms;
use fiber::chan::{self, Receiver, Sender};
use fiber::sync::{Barrier, OnceLock, Semaphore};
use fiber::{Job, JobState};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn dur(rng: &mut Rng) -> Duration {
    match rng.below(10) {
        0..=2 => Duration::ZERO,
        3..=7 => Duration::from_micros(100 + rng.below(900)),
        _ => ms(1 + rng.below(3)),
    }
}

// ---------------------------------------------------------------- tokens

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

fiber::fiber_local! {
    static LOCAL_ID: Cell<u64> = Cell::new(0);
    static LOCAL_TOKS: RefCell<Vec<Tok>> = RefCell::new(Vec::new());
}

// ---------------------------------------------------------------- shared state

const PANIC_MARK: &str = "review29 planned panic";

fn planned_panic() -> ! {
    std::panic::panic_any(PANIC_MARK)
}

fn is_planned(p: &(dyn std::any::Any + Send)) -> bool {
    p.downcast_ref::<&str>() == Some(&PANIC_MARK) || p.downcast_ref::<String>().map(|s| s.as_str()) == Some(PANIC_MARK)
}

struct Shared {
    led: Arc<Ledger>,
    tx: Sender<Tok>,
    rx: Receiver<Tok>,
    sem: Semaphore,
    sem_k: usize,
    sem_in: AtomicUsize,
    barrier: Barrier,
    barrier_n: usize,
    barrier_passes: AtomicU64,
    barrier_leaders: AtomicU64,
    onces: Vec<OnceLock<u64>>,
    once_ok: Vec<AtomicU64>,
    once_seen: std::sync::Mutex<HashMap<usize, u64>>,
    never: OnceLock<u64>,
    next_id: AtomicU64,
    /// Untimed waits allowed (the shutdown mode).
    untimed: bool,
    /// Shutdown mode: anything may be cancelled (the runtime's shutdown).
    shutting: AtomicBool,
}

impl Shared {
    fn violation(&self, e: String) {
        self.led.error(e);
    }
    fn shutting(&self) -> bool {
        self.shutting.load(SeqCst)
    }
}

type Flag = Arc<AtomicBool>;

fn flag(v: bool) -> Flag {
    Arc::new(AtomicBool::new(v))
}

struct Ctx {
    sh: Arc<Shared>,
    rng: Rng,
    /// Flags of everything whose cancellation reaches this code (set before
    /// the cancel is requested): a `Cancelled` is legitimate if one is set.
    chain: Vec<Flag>,
    /// Inside `non_cancellable` (and no `with_timeout` inside it).
    held: bool,
    depth: u32,
    /// What this fiber last stored in `LOCAL_ID`.
    local: u64,
    name: String,
}

impl Ctx {
    fn child(&mut self, extra: &[Flag], name: String) -> Ctx {
        let mut chain = self.chain.clone();
        chain.extend(extra.iter().cloned());
        Ctx {
            sh: self.sh.clone(),
            rng: self.rng.fork(),
            chain,
            held: false,
            depth: self.depth + 1,
            local: 0,
            name,
        }
    }
    fn legit(&self) -> bool {
        self.sh.shutting() || self.chain.iter().any(|f| f.load(SeqCst))
    }
    fn cancelled_at(&self, what: &str) {
        if self.held && !self.sh.shutting() {
            self.sh.violation(format!(
                "{}: {what} reported Cancelled inside non_cancellable",
                self.name
            ));
        } else if !self.legit() {
            self.sh.violation(format!(
                "{}: {what} reported Cancelled but nothing cancelled it",
                self.name
            ));
        }
    }
    fn not_early(&self, t0: Instant, d: Duration, what: &str) {
        let waited = t0.elapsed();
        if waited < d && !self.legit() {
            self.sh
                .violation(format!("{}: {what}({d:?}) ended after only {waited:?}", self.name));
        }
    }
    fn run(&mut self, n: usize) {
        for _ in 0..n {
            self.step();
        }
    }

    fn step(&mut self) {
        let nested = self.depth < 3;
        let op = self.rng.below(if self.sh.untimed { 23 } else { 21 });
        match op {
            0 | 1 => self.op_sleep(),
            2 => {
                if fiber::yield_now().is_err() {
                    self.cancelled_at("yield_now");
                }
            }
            3 | 4 => self.op_chan(),
            5 | 6 if nested => self.op_scope(),
            7 if nested => self.op_job_cancel_and_join(),
            8 => self.op_timeouts(),
            9 if nested => self.op_non_cancellable(),
            10 if nested => self.op_handle_cancel(),
            11 => self.op_local(),
            12 => self.op_park_self(),
            13 => self.op_park_cross(),
            14 => self.op_once(),
            15 => self.op_barrier(),
            16 | 17 => self.op_sem(),
            18 => {
                let j = Job::current();
                if j.is_cancelled() && !self.legit() && !self.held {
                    self.sh
                        .violation(format!("{}: Job::current() cancelled, nothing cancelled it", self.name));
                }
                if j.is_completed() {
                    self.sh
                        .violation(format!("{}: Job::current() of a running fiber ended", self.name));
                }
            }
            19 | 20 => self.op_sleep(),
            21 | 22 => self.op_untimed(),
            _ => self.op_sleep(),
        }
    }

    fn op_sleep(&mut self) {
        let d = dur(&mut self.rng);
        let t0 = Instant::now();
        match fiber::sleep(d) {
            Ok(()) => self.not_early(t0, d, "sleep"),
            Err(_) => self.cancelled_at("sleep"),
        }
    }

    fn op_chan(&mut self) {
        let d = dur(&mut self.rng);
        let t0 = Instant::now();
        if self.rng.chance(50) {
            match self.sh.tx.send_timeout(Tok::new(&self.sh.led), d) {
                Ok(()) => {}
                Err(chan::SendTimeoutError::Timeout(t)) => {
                    drop(t);
                    if !fiber::is_cancelled() {
                        self.not_early(t0, d, "send_timeout");
                    }
                }
                Err(_) => {}
            }
        } else {
            match self.sh.rx.recv_timeout(d) {
                Ok(t) => {
                    if self.rng.chance(20) {
                        LOCAL_TOKS.with_borrow_mut(|v| v.push(t));
                    } else {
                        t.take();
                    }
                }
                Err(chan::RecvTimeoutError::Timeout) => {
                    if !fiber::is_cancelled() {
                        self.not_early(t0, d, "recv_timeout");
                    }
                }
                Err(_) => {}
            }
        }
    }

    /// A nested scope of 1 to 3 children running random ops.
    fn op_scope(&mut self) {
        #[derive(Clone, Copy, PartialEq, Debug)]
        enum K {
            Scope,
            Super,
            Try,
        }
        let k = match self.rng.below(3) {
            0 => K::Scope,
            1 => K::Super,
            _ => K::Try,
        };
        let n = 1 + self.rng.below(3) as usize;
        let sflag = flag(false);
        let ended = Arc::new(AtomicUsize::new(0));
        let panicked = Arc::new(AtomicUsize::new(0));
        let erred = Arc::new(AtomicUsize::new(0));
        let handle_cancels = Arc::new(AtomicUsize::new(0));
        let jobs: Arc<std::sync::Mutex<Vec<Job>>> = Arc::new(std::sync::Mutex::new(Vec::new()));
        struct EndGuard(Arc<AtomicUsize>);
        impl Drop for EndGuard {
            fn drop(&mut self) {
                self.0.fetch_add(1, SeqCst);
            }
        }
        struct Child {
            ctx: Ctx,
            steps: usize,
            fail: u64,
            cancel_parent: bool,
            cancel_sibling: u64,
            guard: EndGuard,
            rec: Arc<Rec>,
        }
        let mut children = Vec::new();
        let mut cflags = Vec::new();
        for i in 0..n {
            let cflag = flag(false);
            let ctx = self.child(&[sflag.clone(), cflag.clone()], format!("{}/{k:?}{i}", self.name));
            let fail = match self.rng.below(100) {
                0..=11 => 1,
                12..=23 if k == K::Try => 2,
                _ => 0,
            };
            children.push(Child {
                ctx,
                steps: self.rng.below(5) as usize,
                fail,
                cancel_parent: self.rng.chance(8),
                cancel_sibling: self.rng.below(100),
                guard: EndGuard(ended.clone()),
                rec: Arc::new(Rec::default()),
            });
            cflags.push(cflag);
        }
        let recs: Vec<Arc<Rec>> = children.iter().map(|c| c.rec.clone()).collect();
        // the child's body: Err(()) is a try-scope failure
        let body = {
            let (sflag, panicked, erred, jobs) = (sflag.clone(), panicked.clone(), erred.clone(), jobs.clone());
            let supervised = k == K::Super;
            let job_cancels = handle_cancels.clone();
            move |c: Child, scope_job: Job| -> Result<(), usize> {
                let Child {
                    mut ctx,
                    steps,
                    fail,
                    cancel_parent,
                    cancel_sibling,
                    guard,
                    rec,
                } = c;
                let _guard = guard;
                rec.ran.store(true, SeqCst);
                jobs.lock().unwrap().push(Job::current());
                if cancel_parent {
                    sflag.store(true, SeqCst);
                    scope_job.cancel();
                }
                ctx.run(steps);
                if cancel_sibling < 10 {
                    // a sibling's job (it may be the scope's own: cancel
                    // all of them then)
                    let j = jobs.lock().unwrap().first().cloned();
                    if let Some(j) = j {
                        // a child's own job cancelled: as its handle's cancel
                        sflag.store(true, SeqCst);
                        job_cancels.fetch_add(1, SeqCst);
                        if cancel_sibling < 5 {
                            j.cancel();
                        } else {
                            let _ = fiber::with_timeout(ms(2), || j.cancel_and_join());
                        }
                    }
                }
                match fail {
                    1 => {
                        if !supervised {
                            sflag.store(true, SeqCst);
                        }
                        panicked.fetch_add(1, SeqCst);
                        rec.panicking.store(true, SeqCst);
                        planned_panic()
                    }
                    2 => {
                        sflag.store(true, SeqCst);
                        erred.fetch_add(1, SeqCst);
                        rec.erred.store(true, SeqCst);
                        Err(0)
                    }
                    _ => {
                        rec.finished.store(true, SeqCst);
                        Ok(())
                    }
                }
            }
        };
        let mut bctx = self.child(std::slice::from_ref(&sflag), format!("{}/{k:?}body", self.name));
        bctx.depth = self.depth + 1;
        bctx.local = self.local;
        let body_steps = self.rng.below(3) as usize;
        let cancel_scope = self.rng.chance(10);
        let cancel_handle = if self.rng.chance(15) {
            Some(self.rng.below(n as u64) as usize)
        } else {
            None
        };
        let joins: Vec<bool> = (0..n).map(|_| self.rng.chance(40)).collect();
        let took = Arc::new(AtomicUsize::new(0));
        let sh = self.sh.clone();
        let t_before = ended.load(SeqCst);
        let r = std::panic::catch_unwind(AssertUnwindSafe(|| match k {
            K::Scope | K::Super => {
                macro_rules! run {
                    ($s:ident) => {{
                        let hs: Vec<_> = children
                            .into_iter()
                            .map(|c| {
                                let job = $s.job();
                                let body = body.clone();
                                $s.spawn(move || {
                                    let _ = body(c, job);
                                })
                            })
                            .collect();
                        if cancel_scope {
                            sflag.store(true, SeqCst);
                            $s.cancel();
                        }
                        if let Some(i) = cancel_handle {
                            cflags[i].store(true, SeqCst);
                            handle_cancels.fetch_add(1, SeqCst);
                            hs[i].cancel();
                        }
                        bctx.run(body_steps);
                        for (i, h) in hs.into_iter().enumerate() {
                            if !joins[i] {
                                continue;
                            }
                            let r = h.join();
                            if matches!(&r, Err(e) if e.is_panic()) {
                                took.fetch_add(1, SeqCst);
                            }
                            check_child_join(&bctx, &recs[i], &cflags[i], r.map(|_| ()), "scoped child", false);
                        }
                        LOCAL_ID.get()
                    }};
                }
                if k == K::Scope {
                    Ok(fiber::scope(|s| run!(s)))
                } else {
                    Ok(fiber::supervisor_scope(|s| run!(s)))
                }
            }
            K::Try => fiber::try_scope(|s| {
                for (i, c) in children.into_iter().enumerate() {
                    let job = s.job();
                    let body = body.clone();
                    let h = s.spawn(move || body(c, job));
                    if cancel_handle == Some(i) {
                        cflags[i].store(true, SeqCst);
                        handle_cancels.fetch_add(1, SeqCst);
                        h.cancel();
                    }
                }
                if cancel_scope {
                    sflag.store(true, SeqCst);
                    s.cancel();
                }
                bctx.run(body_steps);
                Ok(LOCAL_ID.get())
            }),
        }));
        let _ = t_before;
        // a teardown's unwind goes on (not ours to catch)
        let r = match r {
            Err(p) if fiber::core::is_shutdown_unwind(p.as_ref()) => std::panic::resume_unwind(p),
            r => r,
        };
        let body_local = bctx.local;
        self.local = body_local;
        // the scope returned (or raised): every child has ended
        let e = ended.load(SeqCst);
        if e != n {
            sh.violation(format!("{}: {k:?} returned with {e} of {n} children ended", self.name));
        }
        if sh.shutting() {
            return;
        }
        let (p, t, er) = (panicked.load(SeqCst), took.load(SeqCst), erred.load(SeqCst));
        match (&r, k) {
            (Ok(Ok(local)), _) => {
                if *local != body_local {
                    sh.violation(format!("{}: fiber-local changed across a scope body", self.name));
                }
                if k == K::Scope && p > t {
                    sh.violation(format!(
                        "{}: scope returned though {p} children panicked, {t} joined",
                        self.name
                    ));
                }
                if k == K::Try && (p > 0 || (er > 0 && handle_cancels.load(SeqCst) == 0)) {
                    sh.violation(format!(
                        "{}: try_scope returned Ok though {p} panicked, {er} failed",
                        self.name
                    ));
                }
            }
            (Ok(Err(_)), _) => {
                if er == 0 {
                    sh.violation(format!("{}: try_scope failed though no child returned Err", self.name));
                }
            }
            (Err(payload), _) => {
                if !is_planned(payload.as_ref()) {
                    sh.violation(format!("{}: {k:?} raised a foreign panic", self.name));
                }
                if k == K::Super {
                    sh.violation(format!("{}: supervisor_scope raised a child's panic", self.name));
                }
                if p <= t {
                    sh.violation(format!(
                        "{}: {k:?} raised though every panicked child was joined",
                        self.name
                    ));
                }
            }
        }
    }

    /// A detached fiber's root job, cancel-and-joined by its spawner: the
    /// job's final state and the handle's join agree.
    fn op_job_cancel_and_join(&mut self) {
        let cflag = flag(false);
        let mut cctx = self.child(std::slice::from_ref(&cflag), format!("{}/job", self.name));
        cctx.chain = vec![cflag.clone()];
        let what = self.rng.below(4);
        let d = dur(&mut self.rng);
        let rec = Arc::new(Rec::default());
        let rec2 = rec.clone();
        let (jtx, jrx) = chan::bounded(1);
        let h = fiber::spawn(move || {
            let _ = jtx.send(Job::current());
            child_work(cctx, what, d, &rec2);
        });
        let job = non_cancellable(&self.sh, || jrx.recv());
        let st = match job {
            Ok(job) => {
                if self.rng.chance(30) {
                    let _ = fiber::sleep(dur(&mut self.rng));
                }
                cflag.store(true, SeqCst);
                match job.cancel_and_join() {
                    Ok(st) => Some(st),
                    Err(_) => {
                        self.cancelled_at("Job::cancel_and_join");
                        None
                    }
                }
            }
            Err(_) => None,
        };
        let r = non_cancellable(&self.sh, || h.join());
        if self.sh.shutting() {
            return;
        }
        let Some(st) = st else { return };
        let agree = match (&r, st) {
            (Ok(()), JobState::Completed) => true,
            (Err(e), JobState::Cancelled) => e.is_cancelled(),
            (Err(e), JobState::Failed) => e.is_panic(),
            _ => false,
        };
        if !agree {
            self.sh.violation(format!(
                "{}: root job ended {st:?} but the handle joined {r:?}",
                self.name
            ));
        }
        check_child_join(self, &rec, &cflag, r, "cancel-and-joined fiber", true);
    }

    /// `with_timeout` nested in `with_timeout` around a sleep.
    fn op_timeouts(&mut self) {
        let d1 = dur(&mut self.rng) + Duration::from_micros(self.rng.below(3000));
        let d2 = dur(&mut self.rng) + Duration::from_micros(self.rng.below(3000));
        let d3 = dur(&mut self.rng) + Duration::from_micros(self.rng.below(3000));
        let steps = if self.rng.chance(30) {
            1 + self.rng.below(3) as usize
        } else {
            0
        };
        let t0 = Instant::now();
        let legit_before = self.legit();
        let held = self.held;
        self.held = false;
        self.chain.push(flag(true));
        let r = fiber::with_timeout(d1, || {
            let t1 = Instant::now();
            let inner = fiber::with_timeout(d2, || {
                self.run(steps);
                fiber::sleep(d3)
            });
            (inner, t1.elapsed())
        });
        self.chain.pop();
        self.held = held;
        let waited = t0.elapsed();
        let legit = legit_before || self.legit();
        match r {
            Err(_) => {
                if waited < d1 && !legit {
                    self.sh.violation(format!(
                        "{}: outer with_timeout({d1:?}) fired after {waited:?}",
                        self.name
                    ));
                }
            }
            Ok((Err(_), inner_waited)) => {
                if inner_waited < d2 && !legit {
                    self.sh.violation(format!(
                        "{}: inner with_timeout({d2:?}) fired after {inner_waited:?}",
                        self.name
                    ));
                }
            }
            Ok((Ok(Err(_)), _)) => {
                if !legit && !self.held {
                    self.sh.violation(format!(
                        "{}: sleep in nested with_timeout cancelled, no deadline passed ({d1:?} {d2:?} after {waited:?})",
                        self.name
                    ));
                }
            }
            Ok((Ok(Ok(())), _)) => {
                if waited < d3 {
                    self.sh
                        .violation(format!("{}: sleep({d3:?}) returned after {waited:?}", self.name));
                }
            }
        }
    }

    /// A `non_cancellable` section: its sleep sleeps, cancelled or not.
    fn op_non_cancellable(&mut self) {
        let d = dur(&mut self.rng);
        let steps = self.rng.below(3) as usize;
        let held = self.held;
        self.held = true;
        let (r, waited) = fiber::non_cancellable(|| {
            let t0 = Instant::now();
            let r = fiber::sleep(d);
            let waited = t0.elapsed();
            self.run(steps);
            (r, waited)
        });
        self.held = held;
        if self.sh.shutting() {
            return;
        }
        if r.is_err() {
            self.sh.violation(format!(
                "{}: sleep inside non_cancellable reported Cancelled",
                self.name
            ));
        } else if waited < d {
            self.sh
                .violation(format!("{}: non_cancellable sleep({d:?}) took {waited:?}", self.name));
        }
    }

    /// A detached fiber, maybe cancelled through its handle, then joined.
    fn op_handle_cancel(&mut self) {
        let cflag = flag(false);
        let mut cctx = self.child(&[], format!("{}/spawned", self.name));
        // detached: only its own handle cancels it
        cctx.chain = vec![cflag.clone()];
        let what = self.rng.below(4);
        let d = dur(&mut self.rng);
        let rec = Arc::new(Rec::default());
        let rec2 = rec.clone();
        let h = fiber::spawn(move || child_work(cctx, what, d, &rec2));
        if self.rng.chance(60) {
            if self.rng.chance(50) {
                let _ = fiber::sleep(dur(&mut self.rng));
            }
            cflag.store(true, SeqCst);
            h.cancel();
        }
        let r = if self.rng.chance(70) {
            non_cancellable(&self.sh, || h.join())
        } else {
            h.join()
        };
        if matches!(&r, Err(e) if e.is_join_cancelled()) {
            self.cancelled_at("JoinHandle::join");
            return;
        }
        check_child_join(self, &rec, &cflag, r, "spawned fiber", true);
    }

    /// A fiber-local keeps this fiber's value across parks.
    fn op_local(&mut self) {
        let now = LOCAL_ID.get();
        if now != self.local {
            self.sh.violation(format!(
                "{}: fiber-local reads {now}, this fiber stored {}",
                self.name, self.local
            ));
        }
        let id = self.sh.next_id.fetch_add(1, SeqCst) + 1;
        LOCAL_ID.set(id);
        self.local = id;
        if self.rng.chance(30) {
            LOCAL_TOKS.with_borrow_mut(|v| v.push(Tok::new(&self.sh.led)));
        }
        let _ = fiber::yield_now();
        self.op_sleep();
        let after = LOCAL_ID.get();
        if after != id {
            self.sh
                .violation(format!("{}: fiber-local {id} reads {after} after a park", self.name));
        }
    }

    /// An unpark before the park: the park returns at once.
    fn op_park_self(&mut self) {
        fiber::current().unpark();
        let t0 = Instant::now();
        fiber::park_timeout(Duration::from_secs(5));
        let waited = t0.elapsed();
        if waited > Duration::from_secs(2) {
            self.sh.violation(format!(
                "{}: park after unpark waited {waited:?} (lost token)",
                self.name
            ));
        }
    }

    /// Another fiber sets a flag and unparks this one: the wake is not lost.
    fn op_park_cross(&mut self) {
        let me = fiber::current();
        let set_at: Arc<std::sync::Mutex<Option<Instant>>> = Arc::new(std::sync::Mutex::new(None));
        let s2 = set_at.clone();
        let d = dur(&mut self.rng);
        let twice = self.rng.chance(30);
        let h = fiber::spawn(move || {
            let _ = fiber::sleep(d);
            *s2.lock().unwrap() = Some(Instant::now());
            me.unpark();
            if twice {
                me.unpark();
            }
        });
        let sh = self.sh.clone();
        let name = self.name.clone();
        let body = || {
            let start = Instant::now();
            loop {
                let at = *set_at.lock().unwrap();
                if let Some(at) = at {
                    let late = at.elapsed();
                    if late > Duration::from_secs(2) {
                        sh.violation(format!("{name}: woke {late:?} after the unpark (lost wake)"));
                    }
                    break;
                }
                if sh.shutting() && (fiber::is_cancelled() || start.elapsed() > ms(200)) {
                    break;
                }
                if start.elapsed() > Duration::from_secs(10) {
                    sh.violation(format!("{name}: the unparking fiber never ran"));
                    break;
                }
                fiber::park_timeout(Duration::from_secs(3));
            }
        };
        if sh.untimed {
            body();
        } else {
            fiber::non_cancellable(body);
        }
        let _ = non_cancellable(&self.sh, || h.join());
    }

    /// Racing `OnceLock` initialisers (some of which panic).
    fn op_once(&mut self) {
        let c = self.rng.below(self.sh.onces.len() as u64) as usize;
        let id = self.sh.next_id.fetch_add(1, SeqCst) + 1;
        let d = dur(&mut self.rng);
        let boom = self.rng.chance(15);
        let sh = self.sh.clone();
        if self.rng.chance(25) {
            // `OnceLock::wait` is not a cancellation point (spec/sync.md
            // section 5): a helper whose initialiser cannot fail is its partner
            let sh2 = sh.clone();
            let helper = fiber::spawn(move || {
                let _ = fiber::sleep(d);
                *sh2.onces[c].get_or_init(|| {
                    let n = sh2.once_ok[c].fetch_add(1, SeqCst) + 1;
                    if n > 1 {
                        sh2.violation(format!("OnceLock {c} initialised {n} times"));
                    }
                    id
                })
            });
            let v = *sh.onces[c].wait();
            self.once_seen(c, v);
            match non_cancellable(&sh, || helper.join()) {
                Ok(w) => self.once_seen(c, w),
                Err(e) if e.is_join_cancelled() => self.cancelled_at("join of the OnceLock helper"),
                Err(e) => {
                    if !sh.shutting() {
                        sh.violation(format!("OnceLock helper failed: {e:?}"));
                    }
                }
            }
            return;
        }
        let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
            *sh.onces[c].get_or_init(|| {
                let _ = fiber::sleep(d);
                if boom {
                    planned_panic();
                }
                let n = sh.once_ok[c].fetch_add(1, SeqCst) + 1;
                if n > 1 {
                    sh.violation(format!("OnceLock {c} initialised {n} times"));
                }
                id
            })
        }));
        match r {
            Ok(v) => self.once_seen(c, v),
            Err(p) if fiber::core::is_shutdown_unwind(p.as_ref()) => std::panic::resume_unwind(p),
            Err(p) => {
                if !boom || !is_planned(p.as_ref()) {
                    self.sh.violation(format!(
                        "{}: get_or_init raised though its initialiser did not panic",
                        self.name
                    ));
                }
            }
        }
    }

    fn once_seen(&self, c: usize, v: u64) {
        let mut m = self.sh.once_seen.lock().unwrap();
        let first = *m.entry(c).or_insert(v);
        if first != v {
            self.sh.violation(format!("OnceLock {c} read {v}, earlier {first}"));
        }
    }

    fn op_barrier(&mut self) {
        let d = dur(&mut self.rng) + Duration::from_micros(200);
        let sh = self.sh.clone();
        let r = fiber::with_timeout(d, || {
            let r = sh.barrier.wait();
            if !r.is_cancelled() {
                sh.barrier_passes.fetch_add(1, SeqCst);
                if r.is_leader() {
                    sh.barrier_leaders.fetch_add(1, SeqCst);
                }
            } else if r.is_leader() {
                sh.violation("a cancelled barrier wait led a generation".into());
            }
            r.is_cancelled()
        });
        if r == Ok(true) && !self.legit() {
            self.cancelled_at("Barrier::wait");
        }
    }

    fn op_sem(&mut self) {
        let sh = self.sh.clone();
        let n = 1 + self.rng.below(sh.sem_k as u64) as u32;
        let d = dur(&mut self.rng) + Duration::from_micros(200);
        let hold = self.rng.chance(50);
        let mode = self.rng.below(3);
        let t0 = Instant::now();
        let r = fiber::with_timeout(d, || {
            let p = match mode {
                0 => sh.sem.acquire().ok(),
                1 => sh.sem.acquire_many(n).ok(),
                _ => sh.sem.try_acquire_many(n),
            };
            if let Some(p) = p {
                let k = if mode == 0 { 1 } else { n as usize };
                let now = sh.sem_in.fetch_add(k, SeqCst) + k;
                // undone by a guard dropped before the permit (a teardown
                // may unwind the yield below)
                let _in = InSem(&sh.sem_in, k);
                if now > sh.sem_k {
                    sh.violation(format!(
                        "semaphore of {} admitted {now} (shutting: {})",
                        sh.sem_k,
                        sh.shutting()
                    ));
                }
                if hold {
                    let _ = fiber::yield_now();
                }
                drop(_in);
                drop(p);
            }
        });
        if r.is_err() {
            self.not_early(t0, d, "semaphore with_timeout");
        }
    }

    /// Shutdown mode only: a wait with no timeout (the runtime's drop ends it).
    fn op_untimed(&mut self) {
        if !self.sh.untimed {
            return;
        }
        let sh = self.sh.clone();
        match self.rng.below(7) {
            0 => fiber::park(),
            1 => {
                if let Ok(p) = sh.sem.acquire() {
                    let _ = fiber::sleep(Duration::MAX);
                    drop(p);
                }
            }
            2 => {
                let _ = sh.barrier.wait();
            }
            3 => {
                let _ = sh.never.wait();
            }
            4 => {
                let _ = fiber::sleep(Duration::MAX);
            }
            5 => {
                if let Ok(t) = sh.rx.recv() {
                    t.take();
                }
            }
            _ => {
                let _ = sh.tx.send(Tok::new(&sh.led));
            }
        }
    }
}

/// `f` without cancellation (its waits are bounded by partners that are
/// never cancelled), except in the shutdown mode.
fn non_cancellable<R>(sh: &Shared, f: impl FnOnce() -> R) -> R {
    if sh.untimed {
        f()
    } else {
        fiber::non_cancellable(f)
    }
}

struct InSem<'a>(&'a AtomicUsize, usize);

impl Drop for InSem<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(self.1, SeqCst);
    }
}

#[derive(Default)]
struct Rec {
    ran: AtomicBool,
    finished: AtomicBool,
    panicking: AtomicBool,
    erred: AtomicBool,
}

/// A spawned fiber's body: sleep, panic, a few ops, or nothing.
fn child_work(mut ctx: Ctx, what: u64, d: Duration, rec: &Rec) {
    rec.ran.store(true, SeqCst);
    match what {
        0 => {
            let t0 = Instant::now();
            match fiber::sleep(d + ms(1)) {
                Ok(()) => ctx.not_early(t0, d, "child sleep"),
                Err(_) => ctx.cancelled_at("child sleep"),
            }
        }
        1 => {
            rec.panicking.store(true, SeqCst);
            planned_panic()
        }
        2 => {
            let n = ctx.rng.below(4) as usize;
            ctx.run(n);
        }
        _ => {}
    }
    rec.finished.store(true, SeqCst);
}

/// A join's outcome against what the body did.
/// `strict`: a detached fiber, which only its own handle (or job) cancels.
fn check_child_join(ctx: &Ctx, rec: &Rec, cflag: &Flag, r: Result<(), fiber::JoinError>, what: &str, strict: bool) {
    let sh = &ctx.sh;
    match &r {
        Ok(()) => {
            if !rec.finished.load(SeqCst) {
                sh.violation(format!("{}: {what} joined Ok but its body did not finish", ctx.name));
            }
        }
        Err(e) if e.is_panic() => {
            if !rec.panicking.load(SeqCst) {
                sh.violation(format!("{}: {what} joined a panic it did not raise: {e:?}", ctx.name));
            }
        }
        Err(e) if e.is_join_cancelled() => ctx.cancelled_at(&format!("join of {what}")),
        Err(e) if e.is_cancelled() => {
            let lenient = ctx.legit() && !strict;
            if !cflag.load(SeqCst) && !lenient && !sh.shutting() {
                sh.violation(format!(
                    "{}: {what} joined Cancelled but nothing cancelled it",
                    ctx.name
                ));
            }
        }
        Err(e) => {
            if !rec.erred.load(SeqCst) {
                sh.violation(format!("{}: {what} joined {e:?}", ctx.name));
            }
        }
    }
}

// ---------------------------------------------------------------- sockets

enum Conn {
    Tcp(fiber::net::TcpStream),
    Unix(fiber::net::unix::UnixStream),
}

impl Conn {
    fn read(&self, b: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Conn::Tcp(s) => (&*s).read(b),
            Conn::Unix(s) => (&*s).read(b),
        }
    }
    fn write(&self, b: &[u8]) -> std::io::Result<usize> {
        match self {
            Conn::Tcp(s) => (&*s).write(b),
            Conn::Unix(s) => (&*s).write(b),
        }
    }
    fn set_read_timeout(&self, d: Option<Duration>) {
        match self {
            Conn::Tcp(s) => s.set_read_timeout(d).unwrap(),
            Conn::Unix(s) => s.set_read_timeout(d).unwrap(),
        }
    }
    fn set_write_timeout(&self, d: Option<Duration>) {
        match self {
            Conn::Tcp(s) => s.set_write_timeout(d).unwrap(),
            Conn::Unix(s) => s.set_write_timeout(d).unwrap(),
        }
    }
    fn shutdown_write(&self) {
        let _ = match self {
            Conn::Tcp(s) => s.shutdown(std::net::Shutdown::Write),
            Conn::Unix(s) => s.shutdown(std::net::Shutdown::Write),
        };
    }
}

/// The byte at stream position `p` (not periodic at small scales).
fn pattern(p: u64) -> u8 {
    let x = p.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (x >> 56) as u8 ^ (p as u8)
}

fn make_link(tcp: bool) -> (Arc<Conn>, Arc<Conn>) {
    if tcp {
        let l = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let c = fiber::spawn(move || fiber::net::TcpStream::connect(addr).unwrap());
        let (a, _) = l.accept().unwrap();
        let b = c.join().unwrap();
        (Arc::new(Conn::Tcp(b)), Arc::new(Conn::Tcp(a)))
    } else {
        let (a, b) = fiber::net::unix::UnixStream::pair().unwrap();
        (Arc::new(Conn::Unix(a)), Arc::new(Conn::Unix(b)))
    }
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)
}

/// Write `total` pattern bytes in random chunks, with write timeouts,
/// under `with_timeout`, with sleeps; then shut the write half.
fn net_writer(sh: Arc<Shared>, c: Arc<Conn>, mut rng: Rng, total: u64, sent: Arc<AtomicU64>, done: Flag) {
    let mut pos = 0u64;
    let start = Instant::now();
    while pos < total {
        if start.elapsed() > Duration::from_secs(20) {
            sh.violation(format!("net writer stuck at {pos} of {total}"));
            break;
        }
        let n = (1 + rng.below(3000)).min(total - pos);
        let buf: Vec<u8> = (pos..pos + n).map(pattern).collect();
        let mode = rng.below(4);
        let r = match mode {
            0 if !sh.untimed => {
                c.set_write_timeout(Some(dur(&mut rng) + Duration::from_micros(100)));
                c.write(&buf)
            }
            1 => {
                // with_timeout may drop a completed write's result
                // (documented): count the bytes inside
                let d = dur(&mut rng) + Duration::from_micros(100);
                let _ = fiber::with_timeout(d, || {
                    if let Ok(k) = c.write(&buf) {
                        pos += k as u64;
                        sent.store(pos, SeqCst);
                    }
                });
                Err(std::io::ErrorKind::TimedOut.into())
            }
            _ => {
                c.set_write_timeout(if sh.untimed { None } else { Some(ms(50)) });
                c.write(&buf)
            }
        };
        match r {
            Ok(k) => {
                pos += k as u64;
                sent.store(pos, SeqCst);
            }
            Err(e) if is_timeout(&e) || e.kind() == std::io::ErrorKind::Other => {
                if sh.shutting() {
                    break;
                }
            }
            Err(e) => {
                if !sh.shutting() {
                    sh.violation(format!("net write failed: {e}"));
                }
                break;
            }
        }
        if rng.chance(20) {
            let _ = fiber::sleep(dur(&mut rng));
        }
    }
    done.store(true, SeqCst);
    c.shutdown_write();
    // the reader shuts its write half at EOF: this half reads EOF (never
    // data, never a timeout)
    c.set_read_timeout(if sh.untimed {
        None
    } else {
        Some(Duration::from_secs(20))
    });
    let mut b = [0u8; 16];
    match c.read(&mut b) {
        Ok(0) => {}
        r => {
            if !sh.shutting() {
                sh.violation(format!("net: writer's read after the reader's shutdown gave {r:?}"));
            }
        }
    }
}

/// Read to EOF with read timeouts, under `with_timeout`, and from helper
/// fibers cancelled mid-read; every byte must match its position.
fn net_reader(sh: Arc<Shared>, c: Arc<Conn>, mut rng: Rng, sent: Arc<AtomicU64>, done: Flag) {
    let got = Arc::new(std::sync::Mutex::new(0u64));
    let bad = Arc::new(AtomicBool::new(false));
    // take `n` bytes of `buf` at the current position
    let take = {
        let (got, bad, sh) = (got.clone(), bad.clone(), sh.clone());
        move |buf: &[u8]| {
            let mut g = got.lock().unwrap();
            for (i, b) in buf.iter().enumerate() {
                let p = *g + i as u64;
                if *b != pattern(p) && !bad.swap(true, SeqCst) {
                    sh.violation(format!(
                        "net byte {p} is {b:#x}, want {:#x} (lost or duplicated)",
                        pattern(p)
                    ));
                }
            }
            *g += buf.len() as u64;
        }
    };
    let start = Instant::now();
    let mut buf = vec![0u8; 4096];
    loop {
        if start.elapsed() > Duration::from_secs(20) {
            sh.violation(format!("net reader stuck at {}", *got.lock().unwrap()));
            break;
        }
        let want = 1 + rng.below(buf.len() as u64) as usize;
        let mode = rng.below(4);
        let r = match mode {
            0 => {
                c.set_read_timeout(if sh.untimed {
                    None
                } else {
                    Some(dur(&mut rng) + Duration::from_micros(100))
                });
                c.read(&mut buf[..want])
            }
            1 => {
                let d = dur(&mut rng) + Duration::from_micros(100);
                c.set_read_timeout(Some(ms(100)));
                // with_timeout may drop a completed read's result
                // (documented): take the bytes inside
                let _ = fiber::with_timeout(d, || {
                    if let Ok(k) = c.read(&mut buf[..want]) {
                        take(&buf[..k]);
                    }
                });
                Err(std::io::ErrorKind::TimedOut.into())
            }
            2 => {
                // a helper fiber reads and is cancelled through its handle
                let (c2, take2) = (c.clone(), take.clone());
                let reading = Arc::new(AtomicBool::new(false));
                let r2 = reading.clone();
                c.set_read_timeout(Some(ms(100)));
                let h = fiber::spawn(move || {
                    let mut b = vec![0u8; want];
                    r2.store(true, SeqCst);
                    match c2.read(&mut b) {
                        Ok(k) => {
                            take2(&b[..k]);
                            k
                        }
                        Err(_) => usize::MAX,
                    }
                });
                let _ = fiber::sleep(dur(&mut rng));
                h.cancel();
                match non_cancellable(&sh, || h.join()) {
                    Ok(0) => Ok(0),
                    Err(e) if e.is_join_cancelled() => break,
                    _ => Err(std::io::ErrorKind::Interrupted.into()),
                }
            }
            _ => {
                c.set_read_timeout(if sh.untimed { None } else { Some(ms(50)) });
                c.read(&mut buf[..want])
            }
        };
        match r {
            Ok(0) => {
                if !done.load(SeqCst) && !sh.shutting() {
                    sh.violation("net read EOF before the writer shut down".into());
                }
                break;
            }
            Ok(k) if mode != 1 && mode != 2 => take(&buf[..k]),
            Ok(_) => {}
            Err(e) if is_timeout(&e) || e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == std::io::ErrorKind::Other => {
                if sh.shutting() || fiber::is_cancelled() {
                    break;
                }
            }
            Err(e) => {
                if !sh.shutting() {
                    sh.violation(format!("net read failed: {e}"));
                }
                break;
            }
        }
        if rng.chance(10) {
            let _ = fiber::sleep(dur(&mut rng));
        }
    }
    c.shutdown_write();
    if !sh.shutting() {
        let (g, s) = (*got.lock().unwrap(), sent.load(SeqCst));
        if g != s {
            sh.violation(format!("net: read {g} bytes, {s} sent"));
        }
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

fn program(seed: u64, kind: RtKind, shutdown: bool) {
    let mut rng = Rng::new(seed);
    let led = Ledger::new();
    let sem_k = 1 + rng.below(3) as usize;
    let barrier_n = 2 + rng.below(3) as usize;
    let cap = rng.below(3) as usize;
    let (tx, rx) = chan::bounded(cap);
    let sh = Arc::new(Shared {
        led: led.clone(),
        tx,
        rx,
        sem: Semaphore::new(sem_k),
        sem_k,
        sem_in: AtomicUsize::new(0),
        barrier: Barrier::new(barrier_n),
        barrier_n,
        barrier_passes: AtomicU64::new(0),
        barrier_leaders: AtomicU64::new(0),
        onces: (0..3).map(|_| OnceLock::new()).collect(),
        once_ok: (0..3).map(|_| AtomicU64::new(0)).collect(),
        once_seen: std::sync::Mutex::new(HashMap::new()),
        never: OnceLock::new(),
        next_id: AtomicU64::new(0),
        untimed: shutdown,
        shutting: AtomicBool::new(false),
    });
    let n_actors = 2 + rng.below(5) as usize;
    let steps: Vec<usize> = (0..n_actors).map(|_| 4 + rng.below(16) as usize).collect();
    let n_links = rng.below(3) as usize;
    let grace = if shutdown { ms(30 + rng.below(50)) } else { ms(300) };
    let rt = make_rt(kind, grace);
    let sh2 = sh.clone();
    let t0 = Instant::now();
    let (wd_tx, wd_rx) = std::sync::mpsc::channel::<()>();
    let leftover = std::thread::scope(|ts| {
        let rt = &rt;
        ts.spawn(move || {
            // a hang: print what every fiber waits on
            if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = wd_rx.recv_timeout(Duration::from_secs(25)) {
                eprintln!("seed {seed} {kind:?}: no end after 25 s\n{}", rt.dump());
            }
        });
        let r = rt.block_on(move || {
            let sh = sh2;
            let mut rng = Rng::new(seed ^ 0xA11CE);
            let mut hs = Vec::new();
            let mut cflags = Vec::new();
            for (i, &st) in steps.iter().enumerate() {
                let cflag = flag(false);
                let ctx = Ctx {
                    sh: sh.clone(),
                    rng: rng.fork(),
                    chain: vec![cflag.clone()],
                    held: false,
                    depth: 0,
                    local: 0,
                    name: format!("a{i}"),
                };
                let panics = rng.chance(10);
                let rec = Arc::new(Rec::default());
                let rec2 = rec.clone();
                hs.push((
                    fiber::spawn(move || {
                        let mut ctx = ctx;
                        rec2.ran.store(true, SeqCst);
                        if LOCAL_ID.get() != 0 {
                            ctx.sh.violation("a new fiber's fiber-local is not fresh".into());
                        }
                        ctx.run(st);
                        if panics {
                            rec2.panicking.store(true, SeqCst);
                            planned_panic();
                        }
                        rec2.finished.store(true, SeqCst);
                    }),
                    rec,
                ));
                cflags.push(cflag);
            }
            let mut nets = Vec::new();
            for _ in 0..n_links {
                let (a, b) = make_link(rng.chance(50));
                let total = rng.below(40_000);
                let sent = Arc::new(AtomicU64::new(0));
                let done = flag(false);
                let (sh1, sh2, s2, d2) = (sh.clone(), sh.clone(), sent.clone(), done.clone());
                let (r1, r2) = (rng.fork(), rng.fork());
                nets.push(fiber::spawn(move || net_writer(sh1, a, r1, total, s2, d2)));
                nets.push(fiber::spawn(move || net_reader(sh2, b, r2, sent, done)));
            }
            if shutdown {
                let _ = fiber::sleep(ms(rng.below(8)));
                sh.shutting.store(true, SeqCst);
                return (hs, nets);
            }
            for (i, (h, _)) in hs.iter().enumerate() {
                if rng.chance(10) {
                    if rng.chance(50) {
                        let _ = fiber::sleep(dur(&mut rng));
                    }
                    cflags[i].store(true, SeqCst);
                    h.cancel();
                }
            }
            let root = Ctx {
                sh: sh.clone(),
                rng: rng.fork(),
                chain: vec![],
                held: false,
                depth: 0,
                local: 0,
                name: "root".into(),
            };
            for (i, (h, rec)) in hs.into_iter().enumerate() {
                check_child_join(&root, &rec, &cflags[i], h.join(), &format!("actor a{i}"), true);
            }
            for h in nets {
                if let Err(e) = h.join() {
                    sh.violation(format!("a net fiber failed: {e:?}"));
                }
            }
            (Vec::new(), Vec::new())
        });
        drop(wd_tx);
        r
    });
    let rt = if shutdown {
        let t1 = Instant::now();
        drop(rt);
        let took = t1.elapsed();
        assert!(
            !std::thread::panicking(),
            "seed {seed}: the runtime's drop left the thread panicking"
        );
        assert!(
            took < Duration::from_secs(10),
            "seed {seed}: the runtime's drop took {took:?}"
        );
        let (hs, nets) = leftover;
        for (h, rec) in hs {
            let r = h.join();
            if let Err(e) = &r {
                if e.is_panic() && !rec.panicking.load(SeqCst) {
                    sh.violation(format!(
                        "after the drop: an actor joined a panic it did not raise: {e:?}"
                    ));
                }
            } else if !rec.finished.load(SeqCst) {
                sh.violation("after the drop: an actor joined Ok but did not finish".into());
            }
        }
        for h in nets {
            let _ = h.join();
        }
        None
    } else {
        Some(rt)
    };
    let _ = t0;
    if let Some(rt) = rt {
        assert_eq!(sh.sem.available_permits(), sh.sem_k, "seed {seed}: semaphore permits");
        let gens = sh.barrier.generation();
        let passes = sh.barrier_passes.load(SeqCst);
        let leaders = sh.barrier_leaders.load(SeqCst);
        assert_eq!(leaders, gens, "seed {seed}: barrier leaders vs generations");
        assert_eq!(
            passes,
            gens * sh.barrier_n as u64,
            "seed {seed}: barrier passes vs generations of {}",
            sh.barrier_n
        );
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
    drop(sh);
    let start = Instant::now();
    while !led.settled() && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(ms(1));
    }
    led.check(&format!("seed {seed} {kind:?} shutdown={shutdown}"));
}

/// Keep the planned panics out of the output (other panics print as usual).
fn quiet_planned_panics() {
    crate::common::fuzz::quiet_panics(is_planned);
}

fn fuzz(seeds: std::ops::Range<u64>, kind: RtKind, shutdown: bool, secs: u64) {
    quiet_planned_panics();
    crate::common::fuzz::run_seeds(seeds, kind, shutdown, secs, program);
}

#[test]
fn fuzz_one_worker() {
    fuzz(0..75, RtKind::One, false, 120);
}

#[test]
fn fuzz_two_workers() {
    fuzz(1000..1075, RtKind::Two, false, 120);
}

#[test]
fn fuzz_elastic() {
    fuzz(2000..2075, RtKind::Elastic, false, 120);
}

#[test]
fn fuzz_shutdown_with_parked_actors() {
    fuzz(3000..3025, RtKind::Two, true, 120);
    fuzz(4000..4025, RtKind::One, true, 120);
    fuzz(5000..5025, RtKind::Elastic, true, 120);
}

#[test]
#[ignore = "long fuzz run (minutes): FUZZ_SEEDS=n, FUZZ_START=first seed, --release"]
fn fuzz_long() {
    let (n, start) = (
        crate::common::fuzz::env_u64("FUZZ_SEEDS", 2000),
        crate::common::fuzz::env_u64("FUZZ_START", 100_000),
    );
    for (k, kind) in [RtKind::One, RtKind::Two, RtKind::Elastic].into_iter().enumerate() {
        let base = start + k as u64 * 1_000_000;
        fuzz(base..base + n, kind, false, 3600);
        fuzz(base + 500_000..base + 500_000 + n / 10, kind, true, 3600);
    }
}

#[test]
#[ignore = "long fuzz run of the shutdown mode (minutes): FUZZ_SEEDS=n, FUZZ_START=first seed, --release"]
fn fuzz_long_shutdown() {
    let (n, start) = (
        crate::common::fuzz::env_u64("FUZZ_SEEDS", 1000),
        crate::common::fuzz::env_u64("FUZZ_START", 700_000),
    );
    for (k, kind) in [RtKind::One, RtKind::Two, RtKind::Elastic].into_iter().enumerate() {
        let base = start + k as u64 * 1_000_000;
        fuzz(base..base + n, kind, true, 3600);
    }
}
