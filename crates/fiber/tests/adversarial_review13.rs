//! Review 13 ("sweep"): the public API under extreme arguments and in
//! unusual calling contexts (panic hooks, thread-local destructors, a
//! destructor run by runtime teardown, objects shared across runtimes and
//! outliving the runtime that made them).
//!
//! Rules come from tokio's `Semaphore`, crossbeam-channel's `after`/`at`/
//! `tick`/`select`, and std's `Condvar`/`Mutex`/`thread`.

mod common;

use common::{ms, on_runtime, rt1, rt2, within};
use fiber::chan::{self, RecvTimeoutError, Select};
use fiber::sync::{Condvar, Mutex, Semaphore, WaitGroup};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A hundred years from now (`Instant + Duration` via `checked_add`).
fn far_future() -> Instant {
    Instant::now()
        .checked_add(Duration::from_secs(100 * 365 * 24 * 3600))
        .expect("a monotonic clock reaches a hundred years out")
}

// ---------------------------------------------------------------------------
// Semaphore: zero-permit requests and the MAX_PERMITS ceiling (tokio).
// ---------------------------------------------------------------------------

/// Park a fiber in `acquire_many(big)` on `sem`, which has fewer permits.
fn queue_a_big_waiter(sem: &Arc<Semaphore>, big: u32) -> fiber::JoinHandle<bool> {
    let s = sem.clone();
    let h = fiber::spawn(move || s.acquire_many(big).is_ok());
    let deadline = Instant::now() + Duration::from_secs(5);
    // The waiter is queued once a 1-permit try fails although a permit is free.
    while sem.try_acquire().map(drop).is_some() {
        assert!(Instant::now() < deadline, "the big waiter never queued");
        fiber::sleep(ms(1)).unwrap();
    }
    h
}

/// tokio: `try_acquire_many(0)` on an open semaphore always succeeds (it
/// needs nothing); a zero request is not "served" behind anyone.
/// (Failed before the fix: try_acquire_many(0) returns None while a larger acquire_many is queued.)
#[test]
fn sem_try_acquire_many_zero_succeeds_while_a_large_request_waits() {
    on_runtime(|| {
        let sem = Arc::new(Semaphore::new(2));
        let big = queue_a_big_waiter(&sem, 5);
        assert!(sem.try_acquire_many(0).is_some(), "a zero request needs no permit");
        sem.add_permits(3);
        assert!(big.join().unwrap());
    });
}

/// tokio: `acquire_many(0)` completes at once. With a queued large waiter
/// fiber parks the zero request behind it until that waiter is served.
/// (Failed before the fix: acquire_many(0) parks behind a queued acquire_many(5) until permits arrive.)
#[test]
fn sem_acquire_many_zero_returns_at_once_while_a_large_request_waits() {
    on_runtime(|| {
        let sem = Arc::new(Semaphore::new(2));
        let big = queue_a_big_waiter(&sem, 5);
        let s = sem.clone();
        let zero = fiber::spawn(move || {
            let _p = s.acquire_many(0).unwrap();
        });
        let r = fiber::with_timeout(ms(500), || zero.join());
        sem.add_permits(3);
        assert!(big.join().unwrap());
        assert!(
            r.is_ok(),
            "acquire_many(0) still parked after 500 ms behind acquire_many(5)"
        );
    });
}

/// tokio: adding permits past MAX_PERMITS panics; the count is unchanged
/// and the semaphore stays usable (a full-width `acquire_many(u32::MAX)`
/// on a MAX_PERMITS semaphore succeeds at once).
#[test]
fn sem_add_permits_past_the_ceiling_panics_and_keeps_the_count() {
    let sem = Semaphore::new(Semaphore::MAX_PERMITS);
    let msg = common::panic_message(|| sem.add_permits(1)).expect("adding past MAX_PERMITS panics");
    assert!(msg.contains("MAX_PERMITS"), "message: {msg}");
    assert_eq!(sem.available_permits(), Semaphore::MAX_PERMITS);
    let msg = common::panic_message(|| sem.add_permits(Semaphore::MAX_PERMITS + 1)).unwrap();
    assert!(msg.contains("MAX_PERMITS"), "message: {msg}");
    assert_eq!(sem.available_permits(), Semaphore::MAX_PERMITS);
    let p = sem.try_acquire_many(u32::MAX).expect("u32::MAX permits are there");
    assert_eq!(sem.available_permits(), Semaphore::MAX_PERMITS - u32::MAX as usize);
    drop(p);
    assert_eq!(sem.available_permits(), Semaphore::MAX_PERMITS);
}

// ---------------------------------------------------------------------------
// Timer channels: extreme instants, 1 ns, outliving their runtime.
// ---------------------------------------------------------------------------

/// crossbeam: `at(when)` never fires before `when`; a hundred years out it
/// reads as empty, its timed receives time out, and a select with a short
/// timeout on it reports the timeout, on a plain thread and in a fiber.
#[test]
fn at_a_hundred_years_out_stays_empty_everywhere() {
    let check = || {
        let r = chan::at(far_future());
        assert!(r.is_empty());
        assert_eq!(r.len(), 0);
        assert!(!r.is_full());
        assert_eq!(r.recv_timeout(ms(10)), Err(RecvTimeoutError::Timeout));
        assert_eq!(r.recv_deadline(Instant::now() + ms(10)), Err(RecvTimeoutError::Timeout));
        let mut sel = Select::new();
        sel.recv(&r);
        assert!(sel.ready_timeout(ms(10)).is_err());
        assert!(sel.select_timeout(ms(10)).is_err());
    };
    within(10, check);
    on_runtime(check);
}

/// crossbeam: `after(1 ns)` is ready (almost) at once and delivers its due
/// instant, which is never later than the receive.
#[test]
fn after_one_nanosecond_fires_at_once_everywhere() {
    let check = || {
        let before = Instant::now();
        let r = chan::after(Duration::from_nanos(1));
        let due = r.recv_timeout(Duration::from_secs(5)).expect("1 ns timer fires");
        assert!(due >= before && due <= Instant::now());
        assert_eq!(r.try_recv(), Err(chan::TryRecvError::Empty), "one message only");
        let r2 = chan::after(Duration::from_nanos(1));
        let never = chan::never::<i32>();
        let picked = fiber::select! {
            recv(never) -> _ => 0,
            recv(r2) -> m => { assert!(m.is_ok()); 1 },
        };
        assert_eq!(picked, 1);
    };
    within(10, check);
    on_runtime(check);
}

/// crossbeam: `tick(1 ns)` delivers one due instant per receive, never
/// queueing a backlog; the instants do not go backwards.
#[test]
fn tick_of_one_nanosecond_delivers_non_decreasing_instants() {
    let check = || {
        let r = chan::tick(Duration::from_nanos(1));
        let mut last = None;
        for _ in 0..2_000 {
            let t = r.recv_timeout(Duration::from_secs(5)).expect("tick");
            if let Some(l) = last {
                assert!(t >= l, "tick instants went backwards");
            }
            last = Some(t);
        }
        assert!(last.unwrap() <= Instant::now());
    };
    within(20, check);
    on_runtime(check);
}

/// Timer channels are runtime-independent, as crossbeam's: a `tick` made
/// in a runtime keeps ticking after that runtime is dropped, on a plain
/// thread and in a fiber of a second runtime; an `after` armed in the
/// first runtime and never received there fires in the second.
#[test]
fn timer_channels_outlive_the_runtime_that_made_them() {
    within(20, || {
        let a = rt1();
        let (tick, late) = a.block_on(|| {
            let t = chan::tick(ms(5));
            t.recv().unwrap();
            let late = chan::after(ms(50));
            // Park on it once in this runtime so its timer is armed here.
            assert_eq!(late.recv_timeout(ms(1)), Err(RecvTimeoutError::Timeout));
            (t, late)
        });
        drop(a);
        tick.recv_timeout(Duration::from_secs(2))
            .expect("tick on a plain thread");
        let b = rt1();
        b.block_on(move || {
            tick.recv_timeout(Duration::from_secs(2)).expect("tick in runtime B");
            late.recv_timeout(Duration::from_secs(2)).expect("after in runtime B");
        });
    });
}

/// crossbeam: an operation that is ready wins over a deadline that has
/// already passed, and a deadline a hundred years out is no different from
/// no deadline: both select forms return the ready operation.
#[test]
fn select_deadline_in_the_past_or_far_future_still_returns_a_ready_op() {
    let check = || {
        let (tx, rx) = chan::bounded(1);
        tx.send(7).unwrap();
        let past = Instant::now()
            .checked_sub(Duration::from_secs(3600))
            .unwrap_or_else(Instant::now);
        let mut sel = Select::new();
        let i = sel.recv(&rx);
        let op = sel.select_deadline(past).expect("a ready op beats a passed deadline");
        assert_eq!(op.index(), i);
        assert_eq!(op.recv(&rx), Ok(7));
        tx.send(8).unwrap();
        let op = sel.select_deadline(far_future()).unwrap();
        assert_eq!(op.recv(&rx), Ok(8));
        tx.send(9).unwrap();
        assert_eq!(sel.ready_deadline(past), Ok(i));
        assert_eq!(rx.recv_deadline(past), Ok(9));
        tx.send(10).unwrap();
        assert_eq!(rx.recv_deadline(far_future()), Ok(10));
    };
    within(10, check);
    on_runtime(check);
}

/// A plain thread blocked in `send_deadline(100 years)` on a full channel
/// is released by a fiber that receives, and `recv_deadline(100 years)` in
/// a fiber by a plain thread that sends.
#[test]
fn far_future_deadlines_between_threads_and_fibers_complete() {
    within(20, || {
        let rt = rt2();
        let (tx, rx) = chan::bounded::<u32>(1);
        tx.send(1).unwrap();
        let sender = std::thread::spawn(move || tx.send_deadline(2, far_future()));
        let got = rt.block_on(move || {
            std::thread::sleep(ms(20));
            let a = rx.recv_deadline(far_future()).unwrap();
            let b = rx.recv_deadline(far_future()).unwrap();
            (a, b)
        });
        assert_eq!(got, (1, 2));
        assert!(sender.join().unwrap().is_ok());
    });
}

// ---------------------------------------------------------------------------
// Condvar: 1 ns and a far deadline.
// ---------------------------------------------------------------------------

/// std: `wait_timeout(1 ns)` with nobody notifying times out and gives the
/// guard back (re-locked); `wait_timeout_while` with a condition that is
/// already false returns at once without timing out.
#[test]
fn condvar_one_nanosecond_waits_time_out_and_relock() {
    let check = || {
        let m = Mutex::new(0u32);
        let cv = Condvar::new();
        let g = m.lock().unwrap();
        let (mut g, r) = cv.wait_timeout(g, Duration::from_nanos(1)).unwrap();
        assert!(r.timed_out());
        *g += 1;
        let (g, r) = cv.wait_timeout_while(g, Duration::from_nanos(1), |v| *v == 0).unwrap();
        assert!(!r.timed_out(), "condition already false");
        assert_eq!(*g, 1);
        drop(g);
        assert!(m.try_lock().is_ok(), "the guard was released");
    };
    within(10, check);
    on_runtime(check);
}

// ---------------------------------------------------------------------------
// Sync objects shared across runtimes.
// ---------------------------------------------------------------------------

/// A `fiber::sync::Mutex` held by a fiber of runtime A and awaited by a
/// fiber of runtime B: B gets it when A releases; a Condvar notify from A
/// wakes a waiter in B; a WaitGroup in B waits for a member in A.
#[test]
fn sync_objects_shared_between_two_runtimes_hand_over() {
    within(30, || {
        let a = rt1();
        let b = rt1();
        let state = Arc::new((Mutex::new(0u32), Condvar::new()));
        let wg = WaitGroup::new();
        let (locked_tx, locked_rx) = chan::bounded::<()>(0);

        let s = state.clone();
        let member = wg.clone();
        let holder = a.spawn(move || {
            let mut g = s.0.lock().unwrap();
            locked_tx.send(()).unwrap();
            fiber::sleep(ms(30)).unwrap();
            *g = 1;
            drop(g);
            s.1.notify_all();
            fiber::sleep(ms(10)).unwrap();
            let mut g = s.0.lock().unwrap();
            *g = 2;
            drop(g);
            s.1.notify_all();
            drop(member);
        });
        let s = state.clone();
        let got = b.block_on(move || {
            locked_rx.recv().unwrap();
            let g = s.0.lock().unwrap();
            let first = *g;
            let g = s.1.wait_while(g, |v| *v < 2).unwrap();
            let second = *g;
            drop(g);
            wg.wait();
            (first, second)
        });
        assert!(got.0 >= 1, "B took the lock before A released it");
        assert_eq!(got.1, 2);
        holder.join().unwrap();
    });
}

/// A semaphore whose permit is held by a fiber of a runtime that is then
/// dropped with the fiber parked: teardown unwinds the fiber, the permit
/// comes back, and a plain thread waiting in `acquire` gets it.
#[test]
fn a_permit_held_by_a_torn_down_fiber_returns_to_a_waiting_thread() {
    within(20, || {
        let sem = Arc::new(Semaphore::new(1));
        let rt = rt1();
        let (held_tx, held_rx) = chan::bounded::<()>(0);
        let s = sem.clone();
        rt.spawn(move || {
            let _p = s.acquire().unwrap();
            held_tx.send(()).unwrap();
            common::stubborn_sleep();
        });
        held_rx.recv().unwrap();
        let s = sem.clone();
        let waiter = std::thread::spawn(move || s.acquire().map(drop).is_ok());
        std::thread::sleep(ms(20));
        drop(rt);
        assert!(waiter.join().unwrap());
        assert_eq!(sem.available_permits(), 1);
    });
}

// ---------------------------------------------------------------------------
// Handles and jobs after their runtime is gone.
// ---------------------------------------------------------------------------

/// A `FiberHandle` and a `Job` kept past the runtime: `unpark`, `cancel`,
/// `state` and `join` return at once (nothing to wake, the job is over).
#[test]
fn fiber_handles_and_jobs_used_after_their_runtime_return_at_once() {
    within(20, || {
        let rt = rt1();
        let (fh, job, parked) = rt.block_on(|| {
            let parked = fiber::spawn(|| {
                fiber::park();
            });
            let fh = parked.fiber();
            let job = fiber::Job::current();
            (fh, job, parked)
        });
        drop(rt);
        fh.unpark();
        fh.unpark();
        job.cancel();
        let start = Instant::now();
        let _ = job.join();
        let _ = job.state();
        let _ = parked.join();
        assert!(start.elapsed() < Duration::from_secs(5));
    });
}

// ---------------------------------------------------------------------------
// Panic hooks.
// ---------------------------------------------------------------------------

static HOOK_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Install `hook` for panics whose message contains `tag`; other panics go
/// to the previous hook. Restores the previous hook on drop.
struct HookGuard {
    _lock: std::sync::MutexGuard<'static, ()>,
}

type PrevHook = Box<dyn Fn(&std::panic::PanicHookInfo<'_>) + Sync + Send + 'static>;

fn install_hook(tag: &'static str, hook: impl Fn() + Send + Sync + 'static) -> HookGuard {
    let lock = HOOK_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let prev: Arc<PrevHook> = Arc::new(std::panic::take_hook());
    let prev2 = prev.clone();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        if msg.contains(tag) {
            hook();
        } else {
            prev2(info);
        }
    }));
    HookGuard { _lock: lock }
}

impl Drop for HookGuard {
    fn drop(&mut self) {
        let _ = std::panic::take_hook();
    }
}

fiber::fiber_local! {
    static HOOK_LOCAL: u32 = 41;
}

/// A panic hook that runs in a panicking fiber may ask about that fiber:
/// `fiber::current()` (its id matches the join handle's), `is_cancelled`,
/// `Handle::try_current`, `fiber::stats()`, a fiber-local and a send on an
/// unbounded channel all work there; the join reports the panic.
#[test]
fn a_panic_hook_in_a_fiber_can_query_the_fiber_and_runtime() {
    let (tx, rx) = chan::unbounded::<(fiber::FiberId, bool, bool, u32)>();
    let _g = install_hook("review13-hook-query", move || {
        let id = fiber::current().id();
        let cancelled = fiber::is_cancelled();
        let has_handle = fiber::Handle::try_current().is_some();
        let _ = fiber::stats();
        let local = HOOK_LOCAL.with(|v| *v);
        tx.send((id, cancelled, has_handle, local)).unwrap();
    });
    on_runtime(move || {
        let h = fiber::spawn(|| -> () { panic!("review13-hook-query") });
        let id = h.id();
        let err = h.join().unwrap_err();
        assert!(err.is_panic());
        let (seen, cancelled, has_handle, local) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(seen, id);
        assert!(!cancelled);
        assert!(has_handle);
        assert_eq!(local, 41);
    });
}

/// A panic hook in a fiber that hands its report over a rendezvous
/// channel (the receiver is another fiber): the report arrives and the
/// panic still reaches the joiner.
#[test]
fn a_panic_hook_in_a_fiber_can_rendezvous_with_another_fiber() {
    let (tx, rx) = chan::bounded::<String>(0);
    let _g = install_hook("review13-hook-rendezvous", move || {
        let _ = tx.send_timeout("reported".to_string(), Duration::from_secs(5));
    });
    on_runtime(move || {
        let reader = fiber::spawn(move || rx.recv_timeout(Duration::from_secs(5)));
        let h = fiber::spawn(|| -> () { panic!("review13-hook-rendezvous") });
        assert!(h.join().unwrap_err().is_panic());
        assert_eq!(reader.join().unwrap().as_deref(), Ok("reported"));
    });
}

/// `fiber::run` from a panic hook on a plain thread (e.g. to flush a
/// report through fiber code): it works and the thread's own panic goes on.
#[test]
fn fiber_run_inside_a_panic_hook_on_a_plain_thread_works() {
    let ran = Arc::new(AtomicUsize::new(0));
    let r = ran.clone();
    let _g = install_hook("review13-hook-run", move || {
        let v = fiber::run(|| {
            let h = fiber::spawn(|| 20);
            h.join().unwrap() + 1
        });
        r.store(v, Ordering::SeqCst);
    });
    within(20, || {
        let t = std::thread::spawn(|| panic!("review13-hook-run"));
        assert!(t.join().is_err());
    });
    assert_eq!(ran.load(Ordering::SeqCst), 21);
}

// ---------------------------------------------------------------------------
// Destructors: during unwinding, thread exit, runtime teardown.
// ---------------------------------------------------------------------------

struct RunOnDrop(Arc<AtomicUsize>);
impl Drop for RunOnDrop {
    fn drop(&mut self) {
        let v = fiber::run(|| {
            let (tx, rx) = chan::bounded(0);
            fiber::spawn(move || tx.send(5usize).unwrap());
            rx.recv().unwrap()
        });
        self.0.store(v, Ordering::SeqCst);
    }
}

/// `fiber::run` from a destructor that runs while a plain thread unwinds
/// (`std::thread::panicking()` is true there): the runtime starts, runs
/// and shuts down, and the result comes back.
#[test]
fn fiber_run_in_a_destructor_during_unwinding_works() {
    let out = Arc::new(AtomicUsize::new(0));
    let o = out.clone();
    within(20, move || {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _d = RunOnDrop(o);
            std::panic::resume_unwind(Box::new("review13-unwind"));
        }));
        assert!(r.is_err());
    });
    assert_eq!(out.load(Ordering::SeqCst), 5);
}

thread_local! {
    static RUN_AT_EXIT: std::cell::RefCell<Option<RunOnDrop>> = const { std::cell::RefCell::new(None) };
}

/// `fiber::run` from a thread-local destructor of a plain thread.
#[test]
fn fiber_run_in_a_thread_local_destructor_works() {
    let out = Arc::new(AtomicUsize::new(0));
    let o = out.clone();
    within(20, move || {
        std::thread::spawn(move || RUN_AT_EXIT.with(|c| *c.borrow_mut() = Some(RunOnDrop(o))))
            .join()
            .unwrap();
    });
    assert_eq!(out.load(Ordering::SeqCst), 5);
}

struct SpawnOnDrop(chan::Sender<String>);
impl Drop for SpawnOnDrop {
    fn drop(&mut self) {
        let r = std::panic::catch_unwind(|| {
            let h = fiber::spawn(|| 3);
            format!("{:?}", h.join().map_err(|e| e.is_cancelled()))
        });
        let report = match r {
            Ok(s) => s,
            Err(p) => format!(
                "panic: {}",
                p.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default()
            ),
        };
        let _ = self.0.send(report);
    }
}

/// A destructor run by teardown (its fiber was parked when the runtime was
/// dropped) that spawns and joins a fiber: the drop finishes promptly and
/// the destructor's report reaches a plain thread (a result or a clear
/// panic, never a hang).
#[test]
fn spawning_from_a_destructor_run_by_teardown_finishes() {
    within(30, || {
        let (tx, rx) = chan::unbounded::<String>();
        let rt = common::rt_fixed_grace(1, ms(50));
        let (ready_tx, ready_rx) = chan::bounded::<()>(0);
        rt.spawn(move || {
            let _d = SpawnOnDrop(tx);
            ready_tx.send(()).unwrap();
            common::stubborn_sleep();
        });
        ready_rx.recv().unwrap();
        let start = Instant::now();
        drop(rt);
        assert!(start.elapsed() < Duration::from_secs(10));
        let report = rx.recv_timeout(Duration::from_secs(5)).expect("the destructor ran");
        assert!(
            report.starts_with("Ok(3)") || report.starts_with("Err(true)") || report.contains("fiber"),
            "report: {report}"
        );
    });
}

// ---------------------------------------------------------------------------
// Builders: extreme sizes.
// ---------------------------------------------------------------------------

/// std's `thread::Builder::stack_size` rounds a tiny size up to the
/// minimum; fiber's runtime documents a 16 KiB minimum: a 1-byte stack
/// runtime either builds and runs fibers, or is an `InvalidInput` error
/// naming the setting.
#[test]
fn a_runtime_with_a_one_byte_stack_runs_or_names_the_setting() {
    within(30, || {
        match fiber::Runtime::builder()
            .workers(1)
            .max_workers(1)
            .stack_size(1)
            .build()
        {
            Ok(rt) => assert_eq!(rt.block_on(|| fiber::spawn(|| 2 + 2).join().unwrap()), 4),
            Err(e) => {
                assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
                assert!(e.to_string().contains("stack"), "error: {e}");
            }
        }
    });
}

/// A blocking pool of zero threads: either refused at build naming the
/// setting, or `blocking` still completes (it cannot silently hang).
#[test]
fn zero_blocking_threads_is_refused_or_still_runs_blocking_calls() {
    within(30, || {
        match fiber::Runtime::builder().workers(1).max_blocking_threads(0).build() {
            Ok(rt) => assert_eq!(rt.block_on(|| fiber::blocking(|| 7)), 7),
            Err(e) => {
                assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
                assert!(e.to_string().contains("blocking"), "error: {e}");
            }
        }
    });
}

// ---------------------------------------------------------------------------
// More contexts: a job of runtime A joined in runtime B; spawning into a
// running runtime from a panic hook on a plain thread.
// ---------------------------------------------------------------------------

/// A `Job` (and a `JoinHandle`) of runtime A, joined from a fiber of
/// runtime B: the join parks in B until A's work finishes, and a cancel
/// issued from B reaches the fiber parked in A.
#[test]
fn a_job_of_one_runtime_is_joined_and_cancelled_from_another() {
    within(30, || {
        let a = rt1();
        let b = rt1();
        let (job_tx, job_rx) = chan::bounded::<fiber::Job>(1);
        let (go_tx, go_rx) = chan::bounded::<()>(0);
        let (saw_tx, saw_rx) = chan::bounded::<bool>(1);
        let worker = a.spawn(move || {
            job_tx.send(fiber::Job::current()).unwrap();
            // Ends when told to, or when cancelled.
            let _ = go_rx.recv();
            saw_tx.send(fiber::sleep(Duration::MAX).is_err()).unwrap();
        });
        let job = job_rx.recv().unwrap();
        let (joined, join_ok) = b.block_on(move || {
            assert!(job.is_active());
            let early = fiber::with_timeout(ms(30), || job.join());
            assert!(early.is_err(), "the job is still running in A");
            go_tx.send(()).unwrap();
            job.cancel();
            let r = fiber::with_timeout(Duration::from_secs(5), || worker.join());
            let j = fiber::with_timeout(Duration::from_secs(5), || job.join());
            (r, j.is_ok())
        });
        // A cancelled fiber that returns normally joins as cancelled (the
        // `non_cancellable` example in fiber's docs).
        assert!(joined.expect("joined within 5 s").unwrap_err().is_cancelled());
        assert_eq!(
            saw_rx.recv_timeout(Duration::from_secs(5)),
            Ok(true),
            "the sleep in A saw the cancel"
        );
        assert!(join_ok);
    });
}

/// A panic hook on a plain thread that reports into a running runtime
/// with `Handle::spawn` (captured earlier): the fiber runs and its result
/// is seen, while the thread's panic goes on.
#[test]
fn handle_spawn_from_a_panic_hook_on_a_plain_thread_reaches_the_runtime() {
    let rt = rt2();
    let handle = rt.handle();
    let (tx, rx) = chan::unbounded::<u32>();
    let _g = install_hook("review13-hook-spawn", move || {
        let tx = tx.clone();
        let h = handle.spawn(move || {
            fiber::yield_now().unwrap();
            tx.send(99).unwrap();
            1
        });
        assert_eq!(h.join().unwrap(), 1);
    });
    within(20, || {
        let t = std::thread::spawn(|| panic!("review13-hook-spawn"));
        assert!(t.join().is_err());
    });
    assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok(99));
    drop(rt);
}
