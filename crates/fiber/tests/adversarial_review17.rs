//! Adversarial review 17: time semantics as users of Go's `time` package,
//! crossbeam-channel's `after` / `at` / `tick` / `never` and tokio's
//! `time` expect them, beyond the extremes (those are in
//! `reviews/review4.rs` and `adversarial/timeouts.rs`).
//!
//! * Ordering: sleepers wake in deadline order; sleepers of one deadline
//!   all wake; a later sleeper never finds an earlier one still parked.
//! * Never early: every timed operation, beside plain threads that spin,
//!   on one worker and on two.
//! * crossbeam's documented timer channel rules: `tick` holds at most one
//!   message, drops the ticks a slow receiver missed, delivers the instant
//!   it was due and restarts its period after a late receive (crossbeam's
//!   rule, which the project documents; Go's ticker keeps the grid
//!   instead); `after` delivers once and never disconnects; `at(past)`
//!   delivers at once; `never` never delivers.
//! * Go habits: `time.After` re-created in each select iteration; timer
//!   channels that are made and dropped without a wait; a dropped ticker.
//! * Cancellation: a cancelled sleep ends at once; nested `with_timeout`.
//! * A busy runtime: deadlines are met while every worker runs a fiber
//!   that yields every 5 ms.

use fiber::chan::{self, RecvError, RecvTimeoutError, SendTimeoutError, TryRecvError};
use fiber::core::state::FiberState;
use fiber::{FiberId, TimedOut, WaitKind};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod common;
use common::{ms, rt1, rt2, wait_until, within};

// ------------------------------------------------------------- helpers

/// The tests of this file run one at a time: several spin plain threads
/// or hold a worker on purpose, and the ordering and lateness checks
/// beside them would measure the file's own load.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Fibers of the current runtime parked in a wait of `kind`.
fn parked(kind: WaitKind) -> usize {
    fiber::dump()
        .fibers
        .iter()
        .filter(|f| f.state == FiberState::Parked && f.waiting == kind)
        .count()
}

/// Timer entries of the current runtime (dead ones included).
fn timers_pending() -> usize {
    fiber::stats().runtime.timers_pending
}

/// Spin on this thread, without a yield point, until `until`.
fn spin_until_instant(until: Instant) {
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}

/// Plain threads that spin until dropped (load beside the runtime).
struct Spinners {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Spinners {
    fn start(n: usize) -> Spinners {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..n)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        Spinners { stop, threads }
    }
}

impl Drop for Spinners {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The median of `v` (sorted in place).
fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

// ------------------------------------------------------------ ordering

/// Go and tokio users expect sleepers to wake in deadline order. Sixteen
/// sleepers (spawned in a scrambled order, deadlines 2 ms apart) all come
/// due while the only worker is held by a fiber that never yields, so
/// they are woken together: they still run in deadline order, each at or
/// after its deadline, except that the worker's timed fairness look (due
/// after so long a turn) may take one of them early, as Go's runnext lets
/// one goroutine jump ahead (spec/sched.md section 2).
// Failed before the fix: the sleepers ran as [0, 1, 15, 14, ..., 2] (the batch taken from the global queue was pushed onto the LIFO local deque and ran newest first).
#[test]
fn sleepers_due_together_on_one_worker_run_in_deadline_order() {
    let _serial = serial();
    within(20, || {
        rt1().block_on(|| {
            const N: usize = 16;
            let order = Arc::new(Mutex::new(Vec::new()));
            let base = Instant::now() + ms(300);
            let mut handles = Vec::new();
            for k in 0..N {
                // 7 is coprime to 16: every index once, out of order.
                let i = (k * 7) % N;
                let order = order.clone();
                let due = base + ms(2 * i as u64);
                handles.push(fiber::spawn(move || {
                    fiber::sleep_until(due).unwrap();
                    let late_enough = Instant::now() >= due;
                    order.lock().unwrap().push(i);
                    late_enough
                }));
            }
            wait_until("the sleepers to park", 10, || parked(WaitKind::Sleep) >= N);
            // Hold the worker until every deadline has passed by a margin.
            spin_until_instant(base + ms(2 * N as u64 + 50));
            for h in handles {
                assert!(h.join().unwrap(), "a sleeper woke before its deadline");
            }
            let order = order.lock().unwrap().clone();
            let sorted = |v: &[usize]| v.windows(2).all(|w| w[0] < w[1]);
            // In deadline order once at most one sleeper (the one a
            // fairness look took early) is left out.
            let in_order = sorted(&order)
                || (0..order.len()).any(|skip| {
                    let rest: Vec<usize> = order
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| *i != skip)
                        .map(|(_, &v)| v)
                        .collect();
                    sorted(&rest)
                });
            assert!(in_order, "sleepers due together ran out of deadline order: {order:?}");
            assert_eq!(order.len(), N);
        })
    })
}

/// The same without a busy worker: deadlines 10 ms apart on one idle
/// worker (its single wheel fires them one at a time), so a sleeper that
/// runs later never ran before an earlier deadline's one. (Fibers that one
/// worker's own wheel pass wakes together, which only a worker held off
/// its CPU for longer than the gap sees here, run newest first:
/// spec/sched.md section 7.)
/// `sleep_until` a past instant returns at once (Go's `time.Sleep` of a
/// negative duration).
#[test]
fn sleepers_on_one_idle_worker_run_in_deadline_order() {
    let _serial = serial();
    within(20, || {
        rt1().block_on(|| {
            const N: usize = 24;
            let order = Arc::new(Mutex::new(Vec::new()));
            let base = Instant::now() + ms(300);
            let handles: Vec<_> = (0..N)
                .map(|k| {
                    let i = N - 1 - k; // spawned latest deadline first
                    let order = order.clone();
                    let due = base + ms(10 * i as u64);
                    fiber::spawn(move || {
                        fiber::sleep_until(due).unwrap();
                        order.lock().unwrap().push(i);
                        Instant::now() >= due
                    })
                })
                .collect();
            wait_until("the sleepers to park", 10, || parked(WaitKind::Sleep) >= N);
            for h in handles {
                assert!(h.join().unwrap(), "a sleeper woke before its deadline");
            }
            assert_eq!(*order.lock().unwrap(), (0..N).collect::<Vec<_>>());
            let t = Instant::now();
            fiber::sleep_until(t - ms(5)).unwrap();
            fiber::sleep_until(t).unwrap();
            assert!(t.elapsed() < ms(500), "sleep_until the past took {:?}", t.elapsed());
        })
    })
}

/// Two workers, one of them held by a fiber that never yields for part
/// of the window: sleepers with deadlines 20 ms apart. When a sleeper
/// runs, every sleeper with an earlier deadline has been woken (it is no
/// longer parked in its sleep), whichever wheel held its timer.
#[test]
fn a_sleeper_never_finds_an_earlier_deadline_still_parked_on_two_workers() {
    let _serial = serial();
    within(20, || {
        rt2().block_on(|| {
            const N: usize = 12;
            let ids: Arc<Mutex<HashMap<FiberId, usize>>> = Arc::default();
            let seen_parked = Arc::new(Mutex::new(Vec::new()));
            let base = Instant::now() + ms(400);
            let mut handles = Vec::new();
            for k in 0..N {
                let i = (k * 5) % N; // 5 is coprime to 12
                let due = base + ms(20 * i as u64);
                let (ids_in, seen_parked) = (ids.clone(), seen_parked.clone());
                let h = fiber::spawn(move || {
                    fiber::sleep_until(due).unwrap();
                    let ids = ids_in.lock().unwrap().clone();
                    for f in fiber::dump().fibers {
                        if let Some(&j) = ids.get(&f.id) {
                            if j < i && f.state == FiberState::Parked && f.waiting == WaitKind::Sleep {
                                seen_parked.lock().unwrap().push((i, j));
                            }
                        }
                    }
                    Instant::now() >= due
                });
                ids.lock().unwrap().insert(h.id(), i);
                handles.push(h);
            }
            wait_until("the sleepers to park", 10, || parked(WaitKind::Sleep) >= N);
            // A fiber that holds one worker, without yielding, through
            // the first half of the deadlines.
            let spinner = fiber::spawn(move || spin_until_instant(base + ms(20 * N as u64 / 2)));
            for h in handles {
                assert!(h.join().unwrap(), "a sleeper woke before its deadline");
            }
            spinner.join().unwrap();
            let seen = seen_parked.lock().unwrap().clone();
            assert!(
                seen.is_empty(),
                "(sleeper, earlier sleeper still parked in its sleep): {seen:?}"
            );
        })
    })
}

/// Sleepers of one deadline (tokio: "Multiple `Sleep`s with the same
/// deadline all complete"): 300 fibers `sleep_until` one instant; all
/// wake, none before it, and no timer entry is left.
#[test]
fn sleepers_of_one_deadline_all_wake_at_or_after_it() {
    let _serial = serial();
    within(20, || {
        rt2().block_on(|| {
            const N: usize = 300;
            let due = Instant::now() + ms(250);
            let woke = Arc::new(AtomicUsize::new(0));
            let handles: Vec<_> = (0..N)
                .map(|_| {
                    let woke = woke.clone();
                    fiber::spawn(move || {
                        fiber::sleep_until(due).unwrap();
                        woke.fetch_add(1, Ordering::SeqCst);
                        Instant::now()
                    })
                })
                .collect();
            wait_until("the sleepers to park", 10, || parked(WaitKind::Sleep) >= N);
            assert_eq!(woke.load(Ordering::SeqCst), 0, "a sleeper woke before the deadline");
            let mut latest = due;
            for h in handles {
                let at = h.join().unwrap();
                assert!(at >= due, "a sleeper woke {:?} early", due - at);
                latest = latest.max(at);
            }
            assert_eq!(woke.load(Ordering::SeqCst), N);
            assert!(
                latest - due < Duration::from_secs(3),
                "the last of one deadline's sleepers ran {:?} after it",
                latest - due
            );
            assert_eq!(timers_pending(), 0, "timer entries left after every sleeper woke");
        })
    })
}

// ---------------------------------------------------------- never early

/// `Ok` if now is at or after `due`.
fn not_before(what: &str, due: Instant) -> Result<(), String> {
    let now = Instant::now();
    if now < due {
        return Err(format!("{what}: returned {:?} before its deadline", due - now));
    }
    Ok(())
}

/// One timed operation of `d`; `Err` describes a wrong outcome.
type TimedOp = fn(Duration) -> Result<(), String>;

/// Every timed operation of the facade, each checking its own outcome and
/// that it did not return before its deadline by the monotonic clock.
fn timed_ops() -> Vec<(&'static str, TimedOp)> {
    vec![
        ("sleep", |d| {
            let s = Instant::now();
            fiber::sleep(d).map_err(|e| format!("sleep: {e:?}"))?;
            not_before("sleep", s + d)
        }),
        ("sleep_until", |d| {
            let t = Instant::now() + d;
            fiber::sleep_until(t).map_err(|e| format!("sleep_until: {e:?}"))?;
            not_before("sleep_until", t)
        }),
        ("recv_timeout", |d| {
            let (_tx, rx) = chan::bounded::<u8>(1);
            let s = Instant::now();
            match rx.recv_timeout(d) {
                Err(RecvTimeoutError::Timeout) => not_before("recv_timeout", s + d),
                other => Err(format!("recv_timeout: {other:?}")),
            }
        }),
        ("recv_deadline", |d| {
            let (_tx, rx) = chan::unbounded::<u8>();
            let t = Instant::now() + d;
            match rx.recv_deadline(t) {
                Err(RecvTimeoutError::Timeout) => not_before("recv_deadline", t),
                other => Err(format!("recv_deadline: {other:?}")),
            }
        }),
        ("send_timeout", |d| {
            let (tx, _rx) = chan::bounded::<u8>(1);
            tx.send(0).unwrap();
            let s = Instant::now();
            match tx.send_timeout(7, d) {
                Err(SendTimeoutError::Timeout(7)) => not_before("send_timeout", s + d),
                other => Err(format!("send_timeout: {other:?}")),
            }
        }),
        ("send_deadline on a rendezvous channel", |d| {
            let (tx, _rx) = chan::bounded::<u8>(0);
            let t = Instant::now() + d;
            match tx.send_deadline(9, t) {
                Err(SendTimeoutError::Timeout(9)) => not_before("send_deadline", t),
                other => Err(format!("send_deadline: {other:?}")),
            }
        }),
        ("select with an after arm", |d| {
            let (_tx, rx) = chan::bounded::<u8>(0);
            let made_before = Instant::now();
            let timer = chan::after(d);
            let made_after = Instant::now();
            fiber::select! {
                recv(rx) -> v => Err(format!("select after: the channel arm fired: {v:?}")),
                recv(timer) -> v => {
                    let v = v.map_err(|e| format!("select after: {e:?}"))?;
                    if v < made_before + d || v > made_after + d {
                        return Err(format!("select after: message {:?} after creation", v - made_before));
                    }
                    not_before("select after", v)
                }
            }
        }),
        ("select with an at arm", |d| {
            let (_tx, rx) = chan::bounded::<u8>(0);
            let t = Instant::now() + d;
            fiber::select! {
                recv(rx) -> v => Err(format!("select at: the channel arm fired: {v:?}")),
                recv(chan::at(t)) -> v => {
                    if v != Ok(t) {
                        return Err(format!("select at: delivered {v:?}, not its instant"));
                    }
                    not_before("select at", t)
                }
            }
        }),
        ("select with a tick arm", |d| {
            let (_tx, rx) = chan::bounded::<u8>(0);
            let made_before = Instant::now();
            let ticker = chan::tick(d);
            for k in 1..=3u32 {
                fiber::select! {
                    recv(rx) -> v => return Err(format!("select tick: the channel arm fired: {v:?}")),
                    recv(ticker) -> v => {
                        let v = v.map_err(|e| format!("select tick: {e:?}"))?;
                        if v < made_before + d * k {
                            return Err(format!("select tick: tick {k} due at {:?}", v - made_before));
                        }
                        not_before("select tick", v)?;
                    }
                }
            }
            Ok(())
        }),
        ("select with a timed default", |d| {
            let (_tx, rx) = chan::bounded::<u8>(0);
            let s = Instant::now();
            fiber::select! {
                recv(rx) -> v => Err(format!("select default: the channel arm fired: {v:?}")),
                default(d) => not_before("select default(d)", s + d),
            }
        }),
        ("Condvar::wait_timeout", |d| {
            let m = fiber::sync::Mutex::new(());
            let cv = fiber::sync::Condvar::new();
            let s = Instant::now();
            let mut guard = m.lock().unwrap();
            loop {
                // A spurious wake-up is allowed (std): wait again for the rest.
                let left = (s + d).saturating_duration_since(Instant::now());
                let (g, r) = cv.wait_timeout(guard, left).unwrap();
                guard = g;
                if r.timed_out() {
                    return not_before("Condvar::wait_timeout", s + d);
                }
                if Instant::now() > s + d + Duration::from_secs(5) {
                    return Err("Condvar::wait_timeout never reported its timeout".into());
                }
            }
        }),
        ("Condvar::wait_timeout_while", |d| {
            let m = fiber::sync::Mutex::new(0u8);
            let cv = fiber::sync::Condvar::new();
            let s = Instant::now();
            let (_g, r) = cv.wait_timeout_while(m.lock().unwrap(), d, |v| *v == 0).unwrap();
            if !r.timed_out() {
                return Err("Condvar::wait_timeout_while: not timed out".into());
            }
            not_before("Condvar::wait_timeout_while", s + d)
        }),
        ("with_timeout", |d| {
            let s = Instant::now();
            match fiber::with_timeout(d, || fiber::sleep(Duration::MAX)) {
                Err(TimedOut) => not_before("with_timeout", s + d),
                Ok(r) => Err(format!("with_timeout: the body returned {r:?}")),
            }
        }),
        ("after().recv()", |d| {
            let made_before = Instant::now();
            let v = chan::after(d).recv().map_err(|e| format!("after: {e:?}"))?;
            if v < made_before + d {
                return Err(format!("after: message due {:?} after creation", v - made_before));
            }
            not_before("after().recv()", v)
        }),
        ("at().recv()", |d| {
            let t = Instant::now() + d;
            match chan::at(t).recv() {
                Ok(v) if v == t => not_before("at().recv()", t),
                other => Err(format!("at: {other:?}")),
            }
        }),
        ("tick().recv()", |d| {
            let made_before = Instant::now();
            let ticker = chan::tick(d);
            for k in 1..=3u32 {
                let v = ticker.recv().map_err(|e| format!("tick: {e:?}"))?;
                if v < made_before + d * k {
                    return Err(format!("tick: tick {k} due at {:?}", v - made_before));
                }
                not_before("tick().recv()", v)?;
            }
            Ok(())
        }),
        ("never().recv_timeout", |d| {
            let s = Instant::now();
            match chan::never::<u8>().recv_timeout(d) {
                Err(RecvTimeoutError::Timeout) => not_before("never().recv_timeout", s + d),
                other => Err(format!("never: {other:?}")),
            }
        }),
        ("after(10d).recv_timeout(d)", |d| {
            let s = Instant::now();
            match chan::after(d * 10).recv_timeout(d) {
                Err(RecvTimeoutError::Timeout) => not_before("after(10d).recv_timeout(d)", s + d),
                // A fiber that got its worker back only after the tick was
                // due finds both ready, and takes the value (as
                // crossbeam-channel's `recv_timeout` does): never before
                // the tick.
                Ok(at) if at >= s + d * 10 => not_before("after(10d).recv_timeout(d)", at),
                other => Err(format!("after(10d).recv_timeout(d): {other:?}")),
            }
        }),
    ]
}

/// Run every timed operation at once, each in its own fiber, three times
/// with durations from 1 to 11 ms, while two plain threads spin beside
/// the runtime; collect every wrong outcome.
fn timed_ops_beside_spinning_threads(rt: fiber::Runtime) {
    let errors = within(30, move || {
        let _load = Spinners::start(2);
        rt.block_on(|| {
            let handles: Vec<_> = timed_ops()
                .into_iter()
                .map(|(name, op)| {
                    fiber::spawn(move || {
                        let mut errors = Vec::new();
                        for d in [ms(1), ms(4), ms(11)] {
                            let s = Instant::now();
                            if let Err(e) = op(d) {
                                errors.push(format!("{e} (d = {d:?})"));
                            }
                            if s.elapsed() > d * 3 + Duration::from_secs(3) {
                                errors.push(format!("{name}: took {:?} for d = {d:?}", s.elapsed()));
                            }
                        }
                        errors
                    })
                })
                .collect();
            handles.into_iter().flat_map(|h| h.join().unwrap()).collect::<Vec<_>>()
        })
    });
    assert!(errors.is_empty(), "{errors:#?}");
}

#[test]
fn no_timed_operation_returns_before_its_deadline_beside_spinning_threads_one_worker() {
    let _serial = serial();
    timed_ops_beside_spinning_threads(rt1());
}

#[test]
fn no_timed_operation_returns_before_its_deadline_beside_spinning_threads_two_workers() {
    let _serial = serial();
    timed_ops_beside_spinning_threads(rt2());
}

// --------------------------------------------------- crossbeam's `tick`

/// crossbeam's documented `tick` example ("When messages get sent"),
/// scaled to a 40 ms period, on a receiver paused by `pause`:
/// * the first message is sent one period after creation, and received
///   then;
/// * after a pause of five periods the channel holds one message (its
///   capacity is 1), the one sent at two periods: the ticks missed during
///   the pause are dropped, not queued;
/// * the next message is sent one period after that late receive
///   (crossbeam's rule; Go's ticker would keep the grid instead);
/// * a receiver already waiting keeps the schedule: each further message
///   is exactly one period after the previous one.
fn tick_doc_example(pause: fn(Duration)) {
    let p = ms(40);
    let made_before = Instant::now();
    let r = chan::tick(p);
    let made_after = Instant::now();
    assert_eq!(r.capacity(), Some(1));
    let v1 = r.recv().unwrap();
    assert!(
        v1 >= made_before + p && v1 <= made_after + p,
        "first tick due {:?} after creation",
        v1 - made_before
    );
    assert!(Instant::now() >= v1, "first tick delivered early");

    pause(p * 5);
    assert_eq!(r.len(), 1, "a tick channel holds at most one message");
    assert!(r.is_full());
    let t0 = Instant::now();
    let v2 = r.try_recv().unwrap();
    let t1 = Instant::now();
    assert_eq!(v2, v1 + p, "the held message is the one sent at two periods");
    assert_eq!(r.try_recv(), Err(TryRecvError::Empty), "missed ticks were queued");
    assert_eq!(r.len(), 0);

    let v3 = r.recv().unwrap();
    assert!(
        v3 >= t0 + p && v3 <= t1 + p,
        "after a late receive the next tick is one period later ({:?} after it)",
        v3.saturating_duration_since(t0)
    );
    assert!(Instant::now() >= v3);

    let mut prev = v3;
    for _ in 0..4 {
        let waiting_since = Instant::now();
        let v = r.recv().unwrap();
        assert!(Instant::now() >= v, "a tick delivered early");
        assert_eq!(
            v,
            prev + p,
            "tick drifted (receive began {:?} after the previous tick)",
            waiting_since - prev
        );
        prev = v;
    }
}

#[test]
fn tick_follows_crossbeams_documented_schedule_in_a_fiber() {
    let _serial = serial();
    within(20, || rt2().block_on(|| tick_doc_example(|d| fiber::sleep(d).unwrap())));
}

#[test]
fn tick_follows_crossbeams_documented_schedule_on_a_plain_thread() {
    let _serial = serial();
    within(20, || tick_doc_example(std::thread::sleep));
}

/// Go habit: `for { select { case <-ticker.C: work() } }` with work longer
/// than the period. Missed ticks are dropped, not queued: each select
/// after the work finds exactly one held tick (a `try_recv` right after
/// it is `Empty`), the held tick is the first one missed (one period
/// after the previous message when that receive waited for it; one period
/// after the previous receive when that one came late: crossbeam's rule),
/// and after a late receive consecutive messages are at least one work
/// time apart (queued ticks would be one period apart).
#[test]
fn a_select_loop_slower_than_its_tick_gets_no_backlog() {
    let _serial = serial();
    within(20, || {
        rt2().block_on(|| {
            let p = ms(10);
            let work = ms(35);
            let ticker = chan::tick(p);
            let quit = chan::never::<()>();
            // (message, select start, select end) of the previous round.
            let mut prev: Option<(Instant, Instant, Instant)> = None;
            for round in 0..8 {
                let start = Instant::now();
                let v = fiber::select! {
                    recv(ticker) -> v => v.unwrap(),
                    recv(quit) -> _ => unreachable!(),
                };
                let end = Instant::now();
                assert!(end >= v, "a tick delivered before it was due");
                assert_eq!(ticker.try_recv(), Err(TryRecvError::Empty), "a second tick was held");
                if let Some((pv, ps, pe)) = prev {
                    assert!(v < start, "round {round}: no tick was held after {work:?} of work");
                    if pv >= ps {
                        // The previous receive waited for its tick.
                        assert_eq!(v, pv + p, "round {round}: the held tick is not the first missed");
                    } else {
                        // The previous receive came late.
                        assert!(
                            v >= ps + p && v <= pe + p,
                            "round {round}: the tick after a late receive is due {:?} after it",
                            v.saturating_duration_since(ps)
                        );
                        assert!(v - pv >= work, "round {round}: ticks {:?} apart: a backlog", v - pv);
                    }
                }
                prev = Some((v, start, end));
                fiber::sleep(work).unwrap();
            }
        })
    })
}

// ------------------------------------------- crossbeam's `after`, `at`, `never`

/// crossbeam: `after` "delivers a message after a certain duration",
/// "Exactly one message will be sent", the channel has capacity 1 and
/// "never gets disconnected". The message is the instant it was due,
/// however late it is received. Afterwards the channel is empty for good
/// (not disconnected): `try_recv` is `Empty`, a timed receive times out
/// after its full time, a blocking receive waits until cancelled.
#[test]
fn after_delivers_its_due_instant_once_then_stays_empty_never_disconnected() {
    let _serial = serial();
    within(20, || {
        rt2().block_on(|| {
            let d = ms(20);
            let made_before = Instant::now();
            let a = chan::after(d);
            let made_after = Instant::now();
            assert_eq!((a.capacity(), a.len(), a.is_empty()), (Some(1), 0, true));
            fiber::sleep(ms(60)).unwrap(); // received late
            assert_eq!(a.len(), 1);
            let v = a.recv().unwrap();
            assert!(
                v >= made_before + d && v <= made_after + d,
                "the message is the due instant, not the receive time ({:?} after creation)",
                v - made_before
            );
            assert_eq!(a.try_recv(), Err(TryRecvError::Empty));
            assert_eq!(
                (a.len(), a.is_empty(), a.is_full(), a.is_closed()),
                (0, true, false, false)
            );
            let s = Instant::now();
            assert_eq!(a.recv_timeout(ms(30)), Err(RecvTimeoutError::Timeout));
            assert!(s.elapsed() >= ms(30), "timed receive ended after {:?}", s.elapsed());
            let r = fiber::select! {
                recv(a) -> _ => "again",
                default(ms(15)) => "exhausted",
            };
            assert_eq!(r, "exhausted");

            // A blocking receive on the spent channel waits (no disconnect)
            // until its fiber is cancelled.
            let spent = a.clone();
            let outcome = Arc::new(Mutex::new(None));
            let o = outcome.clone();
            let waiter = fiber::spawn(move || {
                let r = spent.recv();
                *o.lock().unwrap() = Some(r);
            });
            let id = waiter.id();
            let is_parked = move || {
                fiber::dump()
                    .fibers
                    .iter()
                    .any(|f| f.id == id && f.state == FiberState::Parked)
            };
            wait_until("the receiver to park", 10, is_parked);
            fiber::sleep(ms(50)).unwrap();
            assert!(!waiter.is_finished(), "a receive on a spent after returned");
            assert!(is_parked(), "a receive on a spent after is not parked");
            let c = Instant::now();
            waiter.cancel();
            let _ = waiter.join();
            assert!(c.elapsed() < Duration::from_secs(2), "cancel took {:?}", c.elapsed());
            assert_eq!(*outcome.lock().unwrap(), Some(Err(RecvError)));
        })
    })
}

/// crossbeam: `at(when)` "delivers a message at a certain instant", the
/// message being that instant; "If the instant is in the past, the message
/// is delivered immediately". Exactly `when`, not the receive time.
#[test]
fn at_delivers_its_own_instant_at_once_when_past_and_exactly_then_when_future() {
    let _serial = serial();
    within(20, || {
        rt2().block_on(|| {
            let past = Instant::now() - ms(500);
            let a = chan::at(past);
            assert_eq!(a.len(), 1);
            assert_eq!(a.try_recv(), Ok(past));
            assert_eq!(a.try_recv(), Err(TryRecvError::Empty));

            let past = Instant::now() - ms(1);
            let s = Instant::now();
            let r = fiber::select! {
                recv(chan::at(past)) -> v => v,
                recv(chan::never::<Instant>()) -> v => v,
                default(Duration::from_secs(5)) => panic!("at(past) was not ready"),
            };
            assert_eq!(r, Ok(past));
            assert!(s.elapsed() < Duration::from_secs(1));

            let t = Instant::now() + ms(40);
            let a = chan::at(t);
            assert_eq!(a.try_recv(), Err(TryRecvError::Empty));
            assert_eq!(a.recv(), Ok(t));
            assert!(Instant::now() >= t);

            // Two channels of one instant deliver the same value.
            let t = Instant::now() + ms(20);
            let (a, b) = (chan::at(t), chan::at(t));
            assert_eq!((a.recv(), b.recv()), (Ok(t), Ok(t)));
        })
    })
}

/// crossbeam: `never` "never delivers messages", capacity 0, "never gets
/// disconnected"; a select over `never()` and a `default` takes the
/// default at once, every time; with an `after` arm the `after` fires.
#[test]
fn never_never_delivers_and_a_select_over_it_takes_the_default() {
    let _serial = serial();
    within(20, || {
        rt2().block_on(|| {
            let n = chan::never::<u32>();
            assert_eq!(
                (n.capacity(), n.len(), n.is_empty(), n.is_full()),
                (Some(0), 0, true, true)
            );
            assert_eq!(n.try_recv(), Err(TryRecvError::Empty));
            let s = Instant::now();
            for _ in 0..1000 {
                let r = fiber::select! {
                    recv(n) -> _ => "never",
                    default => "default",
                };
                assert_eq!(r, "default");
            }
            assert!(
                s.elapsed() < Duration::from_secs(2),
                "1000 defaults took {:?}",
                s.elapsed()
            );
            let s = Instant::now();
            let r = fiber::select! {
                recv(n) -> _ => "never",
                default(ms(30)) => "default",
            };
            assert_eq!(r, "default");
            assert!(s.elapsed() >= ms(30));
            let s = Instant::now();
            let r = fiber::select! {
                recv(n) -> _ => "never",
                recv(chan::after(ms(25))) -> _ => "after",
            };
            assert_eq!(r, "after");
            assert!(s.elapsed() >= ms(25));
            let s = Instant::now();
            assert_eq!(n.recv_timeout(ms(20)), Err(RecvTimeoutError::Timeout));
            assert!(s.elapsed() >= ms(20));
        })
    })
}

// ------------------------------------------------------------ Go habits

/// Go's `for { select { case v := <-ch: ...; case <-time.After(time.Hour): } }`:
/// a new `after(1h)` in each iteration of a ping-pong that parks the
/// select. Each parked select arms one entry that is dead once the
/// message comes; the entries must stay bounded (spec/sched.md: about as
/// many dead entries as live ones above the purge floor), not grow with
/// the iterations.
#[test]
fn an_after_made_in_every_select_iteration_keeps_timer_entries_bounded() {
    let _serial = serial();
    let (max, at_end) = within(60, || {
        rt2().block_on(|| {
            const N: usize = 20_000;
            let (data_tx, data_rx) = chan::bounded::<usize>(0);
            let (ack_tx, ack_rx) = chan::bounded::<()>(0);
            let producer = fiber::spawn(move || {
                for i in 0..N {
                    data_tx.send(i).unwrap();
                    ack_rx.recv().unwrap();
                }
            });
            let mut max = 0;
            for i in 0..N {
                fiber::select! {
                    recv(data_rx) -> v => assert_eq!(v, Ok(i)),
                    recv(chan::after(Duration::from_secs(3600))) -> _ => panic!("an hour passed"),
                }
                ack_tx.send(()).unwrap();
                if i % 64 == 0 {
                    max = max.max(timers_pending());
                }
            }
            producer.join().unwrap();
            (max, fiber::stats().runtime.timers_pending)
        })
    });
    eprintln!("after(1h) per iteration: at most {max} timer entries, {at_end} at the end");
    assert!(max <= 4_096, "{max} timer entries pending with at most two live waits");
}

/// Timer channels are materialized on demand, as crossbeam's are: making
/// (and holding, then dropping) 30,000 `after(1h)`, `at(+1h)` and
/// `tick(1h)` channels arms no timer at all (Go before 1.23 kept every
/// unstopped `time.After` timer until it fired).
#[test]
fn timer_channels_made_and_dropped_without_a_wait_arm_no_timer() {
    let _serial = serial();
    within(20, || {
        rt2().block_on(|| {
            let before = timers_pending();
            let hour = Duration::from_secs(3600);
            let mut held = Vec::new();
            for i in 0..10_000u32 {
                held.push(chan::after(hour + ms(u64::from(i))));
                held.push(chan::at(Instant::now() + hour));
                held.push(chan::tick(hour));
            }
            assert_eq!(timers_pending(), before, "holding timer channels armed timers");
            assert!(held.iter().all(|r| r.try_recv() == Err(TryRecvError::Empty)));
            drop(held);
            assert_eq!(timers_pending(), before);
        })
    })
}

/// Go's `ticker.Stop()` / dropping a crossbeam `tick`: a fiber selects on
/// a 1 ms tick until told to stop, then drops the ticker and ends. No
/// timer entry is left once the last one armed has had its time, and none
/// comes back: a dropped ticker ticks no more.
#[test]
fn a_dropped_ticker_leaves_no_timer_behind() {
    let _serial = serial();
    let rt = rt2();
    let h = rt.handle();
    within(20, move || {
        let (stop_tx, stop_rx) = chan::bounded::<()>(0);
        let ticks = h.block_on(move || {
            let ticking = fiber::spawn(move || {
                let ticker = chan::tick(ms(1));
                let mut n = 0;
                loop {
                    fiber::select! {
                        recv(ticker) -> _ => n += 1,
                        recv(stop_rx) -> _ => break,
                    }
                }
                n
            });
            fiber::sleep(ms(50)).unwrap();
            stop_tx.send(()).unwrap();
            ticking.join().unwrap()
        });
        assert!(ticks >= 10, "{ticks} ticks of 1 ms in 50 ms");
        // Checked from this plain thread: no fiber is waiting any more.
        let start = Instant::now();
        while rt.stats().timers_pending != 0 {
            assert!(start.elapsed() < Duration::from_secs(5), "a timer entry stayed");
            std::thread::sleep(ms(2));
        }
        for _ in 0..25 {
            std::thread::sleep(ms(2));
            assert_eq!(rt.stats().timers_pending, 0, "a dropped ticker armed a timer");
        }
    });
}

// --------------------------------------------------------- cancellation

/// A cancelled fiber's `sleep(1h)` returns `Err(Cancelled)` at once (tokio:
/// dropping a `Sleep` cancels it; Go: `ctx.Done()` in a select), and the
/// entries of 3,000 such sleeps do not outlive the monitor's sweep.
#[test]
fn cancelled_hour_sleeps_end_at_once_and_their_entries_are_swept() {
    let _serial = serial();
    within(30, || {
        rt2().block_on(|| {
            const N: usize = 3_000;
            let handles: Vec<_> = (0..N)
                .map(|_| {
                    fiber::spawn(|| {
                        let r = fiber::sleep(Duration::from_secs(3600));
                        (r, Instant::now())
                    })
                })
                .collect();
            wait_until("the sleepers to park", 10, || parked(WaitKind::Sleep) >= N);
            assert!(timers_pending() >= N);
            let c = Instant::now();
            for h in &handles {
                h.cancel();
            }
            for h in handles {
                // A fiber that returns normally after its cancel joins as
                // cancelled or with its value: either way it ran to the end.
                if let Ok((r, at)) = h.join() {
                    assert_eq!(r, Err(fiber::Cancelled));
                    assert!(at - c < Duration::from_secs(3), "a cancelled sleep took {:?}", at - c);
                }
            }
            assert!(
                c.elapsed() < Duration::from_secs(5),
                "cancelling took {:?}",
                c.elapsed()
            );
            let s = Instant::now();
            let mut left = timers_pending();
            while left > 3 * 1024 && s.elapsed() < Duration::from_secs(5) {
                fiber::sleep(ms(20)).unwrap();
                left = timers_pending();
            }
            assert!(left <= 3 * 1024, "{left} entries of cancelled sleeps left after 5 s");
        })
    })
}

/// Kotlin's `withTimeout` nested: the earlier deadline cuts, at its own
/// time. Outer 40 ms around inner 1 h: both report the timeout at 40 ms
/// (not before, not at the hour). Inner 40 ms inside outer 1 h: the
/// inner reports the timeout at 40 ms, the outer body goes on
/// uncancelled (a further sleep completes) and returns its value. Equal
/// deadlines: both time out.
#[test]
fn nested_with_timeout_the_earlier_deadline_cuts_at_its_own_time() {
    let _serial = serial();
    within(20, || {
        rt2().block_on(|| {
            let hour = Duration::from_secs(3600);
            let s = Instant::now();
            let mut inner = None;
            let outer = fiber::with_timeout(ms(40), || {
                inner = Some(fiber::with_timeout(hour, || fiber::sleep(hour)));
                s.elapsed()
            });
            let took = s.elapsed();
            assert_eq!(outer, Err(TimedOut));
            assert_eq!(inner, Some(Err(TimedOut)), "the inner call under the outer deadline");
            assert!(
                took >= ms(40) && took < Duration::from_secs(3),
                "outer ended after {took:?}"
            );

            let s = Instant::now();
            let outer = fiber::with_timeout(hour, || {
                let inner = fiber::with_timeout(ms(40), || fiber::sleep(hour));
                let inner_took = s.elapsed();
                let after = fiber::sleep(ms(10));
                (inner, inner_took, after, fiber::is_cancelled())
            });
            let (inner, inner_took, after, cancelled) = outer.expect("the outer deadline is an hour away");
            assert_eq!(inner, Err(TimedOut));
            assert!(
                inner_took >= ms(40) && inner_took < Duration::from_secs(3),
                "inner ended after {inner_took:?}"
            );
            assert_eq!(after, Ok(()), "the outer body was cancelled by the inner timeout");
            assert!(!cancelled);

            let s = Instant::now();
            let mut inner = None;
            let outer = fiber::with_timeout(ms(30), || {
                inner = Some(fiber::with_timeout(ms(30), || fiber::sleep(hour)));
            });
            assert_eq!((outer, inner), (Err(TimedOut), Some(Err(TimedOut))));
            assert!(s.elapsed() >= ms(30));
        })
    })
}

// --------------------------------------------------------- busy runtime

/// Every worker runs a fiber that spins 5 ms between yields; a sleeper
/// of 10 ms, 15 times: it never wakes early, the median lateness is under
/// 50 ms and none is past 1 s (tokio's and Go's timers are serviced
/// between tasks / at preemption points; a 5 ms yield grid bounds the
/// delay).
fn deadlines_met_beside_fibers_yielding_every_5ms(rt: fiber::Runtime, workers: usize) {
    let mut late = within(30, move || {
        rt.block_on(move || {
            let stop = Arc::new(AtomicBool::new(false));
            let running = Arc::new(AtomicUsize::new(0));
            let busy: Vec<_> = (0..workers)
                .map(|_| {
                    let (stop, running) = (stop.clone(), running.clone());
                    fiber::spawn(move || {
                        running.fetch_add(1, Ordering::SeqCst);
                        while !stop.load(Ordering::SeqCst) {
                            spin_until_instant(Instant::now() + ms(5));
                            if fiber::yield_now().is_err() {
                                break;
                            }
                        }
                    })
                })
                .collect();
            wait_until("the busy fibers to run", 10, || {
                running.load(Ordering::SeqCst) == workers
            });
            let mut late = Vec::new();
            for _ in 0..15 {
                let s = Instant::now();
                fiber::sleep(ms(10)).unwrap();
                let took = s.elapsed();
                assert!(took >= ms(10), "a sleep of 10 ms took {took:?}");
                late.push(took - ms(10));
            }
            stop.store(true, Ordering::SeqCst);
            for b in busy {
                b.join().unwrap();
            }
            late
        })
    });
    let worst = *late.iter().max().unwrap();
    let mid = median(&mut late);
    eprintln!("{workers} busy worker(s): median lateness {mid:?}, worst {worst:?}");
    assert!(mid < ms(50), "median lateness {mid:?} (all: {late:?})");
    assert!(worst < Duration::from_secs(1), "worst lateness {worst:?}");
}

#[test]
fn deadlines_are_met_while_the_one_worker_runs_a_fiber_yielding_every_5ms() {
    let _serial = serial();
    deadlines_met_beside_fibers_yielding_every_5ms(rt1(), 1);
}

#[test]
fn deadlines_are_met_while_both_workers_run_fibers_yielding_every_5ms() {
    let _serial = serial();
    deadlines_met_beside_fibers_yielding_every_5ms(rt2(), 2);
}
