//! Adversarial review, round 4: time at the extremes (the last
//! representable `Instant`, instants in the past, 1 ns) in every timed API
//! of the facade; selects whose only arms are timers under every kind of
//! cancellation and at shutdown; a ready channel against a fired timer;
//! timer arms reused across iterations; and timed waits whose deadlines
//! pass while every worker spins.
//!
//! Upstream references: crossbeam-channel (`after`, `at`, `tick`,
//! `Select`, `select!`; tests/after.rs, tests/tick.rs, tests/select.rs),
//! std (`Condvar::wait_timeout*`, `TcpStream::set_read_timeout`,
//! `connect_timeout`), Go (`time.After`, `time.Ticker`, select fairness).

use fiber::chan::{self, RecvError, RecvTimeoutError, Select, SendTimeoutError, TryRecvError};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{last_instant, ms, rt2, rt_fixed_grace, spin_until, within};

/// Run `f` in a fiber of a two-worker runtime and on a plain thread.
fn both(f: fn()) {
    within(60, move || {
        rt2().block_on(f);
        f();
    })
}

/// An instant `d` in the past (or the earliest representable one).
fn past(d: Duration) -> Instant {
    Instant::now().checked_sub(d).unwrap_or_else(|| Instant::now() - ms(1))
}

// ------------------------------------------------- the last Instant

/// Every deadline-taking call given the last representable `Instant`
/// waits (no overflow panic, no wrap into an immediate timeout) and ends
/// promptly when its fiber is cancelled, with the timed form's error.
/// crossbeam: `at(when)` "delivers a message at `when`"; std's
/// `thread::sleep` and crossbeam's timeouts must not panic on overflow.
#[test]
fn the_last_representable_instant_in_every_deadline_api_waits_and_is_cancellable() {
    type Op = fn(Instant) -> &'static str;
    let ops: Vec<(&'static str, Op, &'static str)> = vec![
        (
            "sleep_until",
            |t| {
                if fiber::sleep_until(t).is_err() {
                    "cancelled"
                } else {
                    "ok"
                }
            },
            "cancelled",
        ),
        (
            "recv_deadline",
            |t| {
                let (_tx, rx) = chan::bounded::<u8>(0);
                match rx.recv_deadline(t) {
                    Err(RecvTimeoutError::Timeout) => "timeout",
                    Err(RecvTimeoutError::Disconnected) => "disconnected",
                    Ok(_) => "value",
                }
            },
            "timeout",
        ),
        (
            "send_deadline",
            |t| {
                let (tx, _rx) = chan::bounded::<u8>(0);
                match tx.send_deadline(7, t) {
                    Err(SendTimeoutError::Timeout(7)) => "timeout",
                    Err(SendTimeoutError::Timeout(_)) => "wrong value",
                    Err(SendTimeoutError::Disconnected(_)) => "disconnected",
                    Ok(()) => "sent",
                }
            },
            "timeout",
        ),
        (
            "at().recv",
            |t| match chan::at(t).recv() {
                Err(RecvError) => "cancelled",
                Ok(_) => "fired",
            },
            "cancelled",
        ),
        (
            "at().recv_deadline",
            |t| match chan::at(t).recv_deadline(t) {
                Err(RecvTimeoutError::Timeout) => "timeout",
                Err(RecvTimeoutError::Disconnected) => "disconnected",
                Ok(_) => "fired",
            },
            "timeout",
        ),
        (
            "select_deadline",
            |t| {
                let (_tx, rx) = chan::bounded::<u8>(0);
                let timer = chan::at(t);
                let mut sel = Select::new();
                sel.recv(&rx);
                sel.recv(&timer);
                let r = match sel.select_deadline(t) {
                    Err(_) => "timeout",
                    Ok(op) => {
                        let i = op.index();
                        if i == 0 {
                            let _ = op.recv(&rx);
                        } else {
                            let _ = op.recv(&timer);
                        }
                        "selected"
                    }
                };
                r
            },
            "timeout",
        ),
        (
            "ready_deadline",
            |t| {
                let timer = chan::at(t);
                let mut sel = Select::new();
                sel.recv(&timer);
                match sel.ready_deadline(t) {
                    Err(_) => "timeout",
                    Ok(_) => "ready",
                }
            },
            "timeout",
        ),
        (
            "select! at(last)",
            |t| {
                fiber::select! {
                    recv(chan::at(t)) -> v => if v.is_err() { "cancelled" } else { "fired" },
                }
            },
            "cancelled",
        ),
    ];
    within(60, move || {
        let rt = rt2();
        rt.block_on(move || {
            for (name, op, want) in ops {
                // The join of a cancelled fiber says cancelled whatever it
                // returned: the call's own result goes through a cell.
                let got = Arc::new(std::sync::Mutex::new(None));
                let g = got.clone();
                let h = fiber::spawn(move || *g.lock().unwrap() = Some(op(last_instant())));
                fiber::sleep(ms(30)).unwrap();
                assert!(!h.is_finished(), "{name}: a wait until the last Instant ended at once");
                let start = Instant::now();
                h.cancel();
                let r = h.join();
                assert!(
                    start.elapsed() < Duration::from_secs(3),
                    "{name}: slow to end when cancelled"
                );
                assert!(r.unwrap_err().is_cancelled(), "{name}");
                assert_eq!(*got.lock().unwrap(), Some(want), "{name}");
            }
        })
    })
}

/// The same instant on a plain thread: a timer channel due then never
/// fires in the test's time, and a deadline then lets a late value in.
#[test]
fn the_last_representable_instant_on_a_plain_thread() {
    within(30, || {
        let t = last_instant();
        assert_eq!(chan::at(t).recv_timeout(ms(20)), Err(RecvTimeoutError::Timeout));
        assert_eq!(chan::at(t).try_recv(), Err(TryRecvError::Empty));
        let (tx, rx) = chan::bounded::<u8>(0);
        let h = std::thread::spawn(move || {
            std::thread::sleep(ms(30));
            tx.send(5).unwrap();
        });
        assert_eq!(rx.recv_deadline(t), Ok(5));
        h.join().unwrap();
        let r = fiber::select! {
            recv(chan::at(t)) -> _ => "at",
            recv(chan::tick(t.saturating_duration_since(Instant::now()))) -> _ => "tick",
            default(ms(20)) => "default",
        };
        assert_eq!(r, "default");
    })
}

/// `with_timeout` and `Condvar::wait_timeout` given the longest duration
/// that still yields a representable deadline (and one nanosecond more,
/// which does not): the body runs to its value, a notify still wakes the
/// waiter, and neither call panics on the arithmetic.
#[test]
fn timeouts_at_the_edge_of_instant_run_to_their_value() {
    within(30, || {
        rt2().block_on(|| {
            let edge = || last_instant().saturating_duration_since(Instant::now());
            for extra in [Duration::ZERO, Duration::from_secs(1), Duration::MAX - edge()] {
                let d = edge().saturating_add(extra);
                assert_eq!(fiber::with_timeout(d, || 5), Ok(5), "with_timeout({d:?})");
                let r = fiber::with_timeout(d, || fiber::with_timeout(ms(20), || fiber::sleep(Duration::MAX)));
                assert_eq!(r, Ok(Err(fiber::TimedOut)), "the inner short timeout wins under {d:?}");
                let pair = Arc::new((fiber::sync::Mutex::new(false), fiber::sync::Condvar::new()));
                let p = pair.clone();
                let notifier = fiber::spawn(move || {
                    fiber::sleep(ms(10)).unwrap();
                    *p.0.lock().unwrap() = true;
                    p.1.notify_all();
                });
                let g = pair.0.lock().unwrap();
                let (g, res) = pair.1.wait_timeout_while(g, d, |ready| !*ready).unwrap();
                assert!(*g && !res.timed_out(), "wait_timeout_while({d:?})");
                drop(g);
                notifier.join().unwrap();
            }
        })
    })
}

// ------------------------------------------------- instants in the past

/// crossbeam: a timed receive, send or select first tries the operation
/// and only then looks at the deadline, so a deadline in the past takes
/// what is ready and times out at once otherwise; `at(past)` delivers
/// `when` itself at once.
#[test]
fn past_deadlines_take_what_is_ready_and_time_out_at_once_otherwise() {
    both(|| {
        for ago in [ms(1), Duration::from_secs(1), Duration::from_secs(3600)] {
            let when = past(ago);
            let (tx, rx) = chan::bounded::<u32>(1);
            let start = Instant::now();
            assert_eq!(rx.recv_deadline(when), Err(RecvTimeoutError::Timeout));
            assert_eq!(tx.send_deadline(1, when), Ok(()), "room: a past deadline still sends");
            assert_eq!(tx.send_deadline(2, when), Err(SendTimeoutError::Timeout(2)));
            {
                let mut sel = Select::new();
                sel.recv(&rx);
                assert_eq!(sel.ready_deadline(when), Ok(0));
                let op = sel
                    .select_deadline(when)
                    .expect("a ready receive beats a past deadline");
                assert_eq!(op.recv(&rx), Ok(1));
            }
            {
                let mut sel = Select::new();
                sel.recv(&rx);
                assert!(sel.select_deadline(when).is_err());
                assert!(sel.ready_deadline(when).is_err());
            }
            let r = fiber::select! {
                recv(rx) -> _ => "recv",
                recv(chan::at(when)) -> v => { assert_eq!(v, Ok(when), "at(past) delivers `when`"); "at" },
            };
            assert_eq!(r, "at");
            assert_eq!(chan::at(when).recv_deadline(when), Ok(when));
            assert_eq!(chan::at(when).try_recv(), Ok(when));
            assert_eq!(chan::never::<u8>().recv_deadline(when), Err(RecvTimeoutError::Timeout));
            assert_eq!(
                chan::after(Duration::from_secs(3600)).recv_deadline(when),
                Err(RecvTimeoutError::Timeout)
            );
            assert_eq!(
                chan::tick(Duration::from_secs(3600)).recv_deadline(when),
                Err(RecvTimeoutError::Timeout)
            );
            assert!(
                start.elapsed() < ms(500),
                "past deadlines parked: {:?}",
                start.elapsed()
            );
            if fiber::core::in_fiber() {
                assert_eq!(fiber::sleep_until(when), Ok(()));
            }
        }
    })
}

// ------------------------------------------------- one nanosecond

/// 1 ns in every timed API: no call hangs, none reports a value it did
/// not get, timers of 1 ns fire, and their instants never run backwards.
#[test]
fn one_nanosecond_in_every_timed_api() {
    both(|| {
        let ns = Duration::from_nanos(1);
        if fiber::core::in_fiber() {
            assert_eq!(fiber::sleep(ns), Ok(()));
            fiber::park_timeout(ns);
        }
        let (tx, rx) = chan::bounded::<u8>(0);
        assert_eq!(rx.recv_timeout(ns), Err(RecvTimeoutError::Timeout));
        assert_eq!(tx.send_timeout(3, ns), Err(SendTimeoutError::Timeout(3)));
        {
            let mut sel = Select::new();
            sel.recv(&rx);
            assert!(sel.select_timeout(ns).is_err());
            assert!(sel.ready_timeout(ns).is_err());
        }
        let r = fiber::select! { recv(rx) -> _ => "recv", default(ns) => "default" };
        assert_eq!(r, "default");
        let made = Instant::now();
        let got = chan::after(ns).recv().unwrap();
        assert!(got > made, "after(1 ns) delivered an instant before it was made");
        let r = fiber::select! {
            recv(chan::after(ns)) -> _ => "after",
            default(Duration::MAX) => "default",
        };
        assert_eq!(r, "after");
        let t = chan::tick(ns);
        let mut last = t.recv().unwrap();
        for _ in 0..200 {
            let next = t.recv().unwrap();
            assert!(next >= last + ns, "tick(1 ns) went backwards or early");
            last = next;
        }
        let m = fiber::sync::Mutex::new(0u8);
        let cv = fiber::sync::Condvar::new();
        let (g, res) = cv.wait_timeout(m.lock().unwrap(), ns).unwrap();
        assert!(res.timed_out());
        let (g, res) = cv.wait_timeout_while(g, ns, |_| true).unwrap();
        assert!(res.timed_out());
        drop(g);
    })
}

/// `with_timeout` of 1 ns: not zero, so the body runs (as Kotlin's
/// `withTimeout(1)` does), but its deadline has passed by then: the body
/// sees itself cancelled at once and the call reports `TimedOut`.
#[test]
fn with_timeout_of_one_nanosecond_runs_the_body_cancelled_and_times_out() {
    within(30, || {
        rt2().block_on(|| {
            let ran = AtomicBool::new(false);
            let r = fiber::with_timeout(Duration::from_nanos(1), || {
                ran.store(true, Ordering::SeqCst);
                (fiber::is_cancelled(), fiber::sleep(Duration::from_secs(5)).is_err())
            });
            assert!(ran.load(Ordering::SeqCst));
            assert_eq!(r, Err(fiber::TimedOut));
            // What the body saw, through a channel (the value is dropped).
            let (tx, rx) = chan::unbounded();
            let start = Instant::now();
            let _ = fiber::with_timeout(Duration::from_nanos(1), || {
                tx.send((fiber::is_cancelled(), fiber::sleep(Duration::from_secs(5)).is_err()))
                    .unwrap();
            });
            assert_eq!(rx.recv().unwrap(), (true, true));
            assert!(start.elapsed() < Duration::from_secs(2));
        })
    })
}

/// std: `set_read_timeout(Some(1 ns))` is accepted (only zero is
/// `InvalidInput`), a read then fails with `WouldBlock` on Linux once the
/// kernel's rounded-up timeout passes, and the getter reads back what
/// the kernel keeps. fiber's sockets must agree with std's on the same
/// kind of socket; `connect_timeout(1 ns)` must not panic or hang.
#[test]
fn one_nanosecond_socket_timeouts_match_std() {
    use std::io::Read;
    within(30, || {
        // std's answers.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut s = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        s.set_read_timeout(Some(Duration::from_nanos(1))).unwrap();
        let std_getter = s.read_timeout().unwrap();
        let std_kind = s.read(&mut [0u8; 4]).unwrap_err().kind();
        let su = std::os::unix::net::UnixDatagram::unbound().unwrap();
        su.set_read_timeout(Some(Duration::from_nanos(1))).unwrap();
        let std_unix_getter = su.read_timeout().unwrap();
        rt2().block_on(move || {
            let l = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            let mut c = fiber::net::TcpStream::connect(addr).unwrap();
            c.set_read_timeout(Some(Duration::from_nanos(1))).unwrap();
            assert_eq!(c.read_timeout().unwrap(), std_getter);
            let start = Instant::now();
            let e = c.read(&mut [0u8; 4]).unwrap_err();
            assert_eq!(e.kind(), std_kind);
            assert!(start.elapsed() < Duration::from_secs(2));
            c.set_write_timeout(Some(Duration::from_nanos(1))).unwrap();
            assert_eq!(c.write_timeout().unwrap(), std_getter);
            let u = fiber::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            u.set_read_timeout(Some(Duration::from_nanos(1))).unwrap();
            assert_eq!(u.read_timeout().unwrap(), std_getter);
            assert_eq!(u.recv(&mut [0u8; 4]).unwrap_err().kind(), std_kind);
            let (a, _b) = fiber::net::unix::UnixStream::pair().unwrap();
            a.set_read_timeout(Some(Duration::from_nanos(1))).unwrap();
            assert_eq!(a.read_timeout().unwrap(), std_unix_getter);
            let mut a = a;
            assert_eq!(a.read(&mut [0u8; 4]).unwrap_err().kind(), std_kind);
            let d = fiber::net::unix::UnixDatagram::unbound().unwrap();
            d.set_read_timeout(Some(Duration::from_nanos(1))).unwrap();
            assert_eq!(d.read_timeout().unwrap(), std_unix_getter);
            // A 1 ns connect: either it made it or it timed out.
            match fiber::net::TcpStream::connect_timeout(&addr, Duration::from_nanos(1)) {
                Ok(_) => {}
                Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}"),
            }
            // Duration::MAX: no deadline (std would wait for the kernel).
            let s = fiber::net::TcpStream::connect_timeout(&addr, Duration::MAX).unwrap();
            drop(s);
        });
    })
}

// ------------------------------------------------- timer-only selects, cancelled

/// What a select with only timer arms returns when its fiber is cancelled.
fn timer_only_select(kind: u8) -> &'static str {
    let late = chan::after(Duration::MAX);
    let hour = chan::tick(Duration::from_secs(3600));
    match kind {
        0 => fiber::select! {
            recv(late) -> v => if v.is_err() { "arm0-err" } else { "arm0-ok" },
            recv(hour) -> v => if v.is_err() { "arm1-err" } else { "arm1-ok" },
            recv(chan::never::<u8>()) -> _ => "never",
        },
        1 => fiber::select! {
            recv(late) -> _ => "after",
            recv(hour) -> _ => "tick",
            default(Duration::MAX) => "default",
        },
        2 => {
            let mut sel = Select::new();
            sel.recv(&late);
            sel.recv(&hour);
            let r = match sel.select_timeout(Duration::from_secs(3600)) {
                Err(_) => "timeout",
                Ok(op) => {
                    let i = op.index();
                    let _ = if i == 0 { op.recv(&late) } else { op.recv(&hour) };
                    "selected"
                }
            };
            r
        }
        _ => {
            let mut sel = Select::new();
            sel.recv(&hour);
            sel.recv(&late);
            match sel.ready() {
                0 if hour.try_recv().is_ok() => "ready-tick-really",
                0 => "ready-0",
                _ => "ready-other",
            }
        }
    }
}

const TIMER_ONLY_RESULTS: [&str; 4] = ["arm0-err", "default", "timeout", "ready-0"];

/// A fiber parked in a select whose only arms are timers (`after(MAX)`,
/// `tick(1 h)`, `never`) wakes promptly, with the documented result, for
/// every kind of cancellation: its handle, its job, a failing sibling in
/// a scope, and an enclosing `with_timeout`.
#[test]
fn timer_only_selects_wake_promptly_for_every_kind_of_cancellation() {
    within(60, || {
        rt2().block_on(|| {
            for kind in 0..4u8 {
                let want = TIMER_ONLY_RESULTS[kind as usize];
                // JoinHandle::cancel.
                let h = fiber::spawn(move || timer_only_select(kind));
                fiber::sleep(ms(20)).unwrap();
                assert!(!h.is_finished());
                let start = Instant::now();
                h.cancel();
                let r = h.join();
                assert!(
                    start.elapsed() < Duration::from_secs(2),
                    "kind {kind}: handle cancel slow"
                );
                assert!(r.unwrap_err().is_cancelled());
                // Job::cancel from another fiber, reading the result.
                let (tx, rx) = chan::bounded(1);
                let (jtx, jrx) = chan::bounded(1);
                let h = fiber::spawn(move || {
                    jtx.send(fiber::Job::current()).unwrap();
                    tx.send(timer_only_select(kind)).unwrap_or(());
                });
                let job = jrx.recv().unwrap();
                fiber::sleep(ms(20)).unwrap();
                let start = Instant::now();
                job.cancel();
                // The select's own result (the send may fail: cancelled).
                let got = rx.recv_timeout(Duration::from_secs(3));
                assert!(start.elapsed() < Duration::from_secs(2), "kind {kind}: job cancel slow");
                let _ = h.join();
                if let Ok(got) = got {
                    assert_eq!(got, want, "kind {kind}: Job::cancel");
                }
                // A sibling fails its scope.
                let start = Instant::now();
                let seen = Arc::new(std::sync::Mutex::new(None));
                let s2 = seen.clone();
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    fiber::scope(|s| {
                        s.spawn(move || *s2.lock().unwrap() = Some(timer_only_select(kind)));
                        s.spawn(|| {
                            fiber::sleep(ms(20)).unwrap();
                            panic!("sibling fails");
                        });
                    })
                }));
                assert!(r.is_err(), "the scope re-raises its child's panic");
                assert!(
                    start.elapsed() < Duration::from_secs(2),
                    "kind {kind}: scope failure slow"
                );
                assert_eq!(*seen.lock().unwrap(), Some(want), "kind {kind}: scope failure");
                // An enclosing with_timeout.
                let start = Instant::now();
                let seen = Arc::new(std::sync::Mutex::new(None));
                let s2 = seen.clone();
                let r = fiber::with_timeout(ms(20), move || *s2.lock().unwrap() = Some(timer_only_select(kind)));
                assert_eq!(r, Err(fiber::TimedOut));
                assert!(
                    start.elapsed() < Duration::from_secs(2),
                    "kind {kind}: with_timeout slow"
                );
                assert_eq!(*seen.lock().unwrap(), Some(want), "kind {kind}: with_timeout");
            }
        })
    })
}

/// Dropping a runtime while fibers are parked in timer-only selects: the
/// cancel at shutdown wakes each of them, they return, and the drop does
/// not wait out a long grace time (10 s here).
#[test]
fn dropping_the_runtime_ends_timer_only_selects_without_the_grace_time() {
    within(60, || {
        let rt = fiber::Runtime::builder()
            .workers(2)
            .max_workers(2)
            .shutdown_timeout(Duration::from_secs(10))
            .build()
            .unwrap();
        let done = Arc::new(AtomicUsize::new(0));
        for i in 0..64u8 {
            let done = done.clone();
            drop(rt.spawn(move || {
                let _ = timer_only_select(i % 4);
                done.fetch_add(1, Ordering::SeqCst);
            }));
        }
        crate::common::wait_parked(&rt, 64);
        let start = Instant::now();
        drop(rt);
        let took = start.elapsed();
        assert_eq!(done.load(Ordering::SeqCst), 64, "every select returned");
        assert!(
            took < Duration::from_secs(3),
            "the drop waited {took:?} for returned selects"
        );
    })
}

/// A Go-style loop that ignores the select's error (`for { select { case
/// <-ticker.C: ... } }`) keeps running in a cancelled fiber; the shutdown
/// then takes the grace time and unwinds it, never longer, never a hang,
/// and its destructors run.
#[test]
fn dropping_the_runtime_with_select_loops_that_ignore_cancellation_is_bounded() {
    within(60, || {
        let rt = rt_fixed_grace(2, ms(300));
        let dropped = Arc::new(AtomicUsize::new(0));
        struct Count(Arc<AtomicUsize>);
        impl Drop for Count {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        for i in 0..8u32 {
            let guard = Count(dropped.clone());
            drop(rt.spawn(move || {
                let _guard = guard;
                let tick = chan::tick(ms(1 + i as u64));
                let late = chan::after(Duration::MAX);
                loop {
                    fiber::select! {
                        recv(tick) -> _ => {},
                        recv(late) -> _ => {},
                    }
                }
            }));
        }
        std::thread::sleep(ms(50));
        let start = Instant::now();
        drop(rt);
        let took = start.elapsed();
        assert!(took < Duration::from_secs(5), "shutdown took {took:?}");
        assert_eq!(dropped.load(Ordering::SeqCst), 8, "every looping fiber was unwound");
    })
}

// ------------------------------------------------- fairness with timers

/// Spec (chan.md section 4) and Go: a select picks uniformly among its
/// ready arms. A ready channel and a fired timer (`at` in the past, a
/// fresh `after(0)`, one `tick(0)` reused) must each be picked about half
/// the time, by `select!`, `Select::select` and `Select::ready`.
#[test]
fn a_ready_channel_and_a_fired_timer_are_each_picked_about_half_the_time() {
    both(|| {
        const N: usize = 2000;
        let (tx, rx) = chan::unbounded::<u32>();
        let reused_tick = chan::tick(Duration::ZERO);
        for timer_kind in 0..3 {
            let mut hits = [0usize; 2];
            for _ in 0..N {
                if rx.is_empty() {
                    tx.send(1).unwrap();
                }
                let fresh;
                let timer = match timer_kind {
                    0 => {
                        fresh = chan::at(past(ms(5)));
                        &fresh
                    }
                    1 => {
                        fresh = chan::after(Duration::ZERO);
                        &fresh
                    }
                    _ => &reused_tick,
                };
                fiber::select! {
                    recv(rx) -> v => { v.unwrap(); hits[0] += 1 },
                    recv(timer) -> v => { v.unwrap(); hits[1] += 1 },
                }
            }
            assert!(
                hits.iter().all(|&h| h > N / 4),
                "select! with timer kind {timer_kind}: {hits:?}"
            );
            let mut hits = [0usize; 2];
            for _ in 0..N {
                if rx.is_empty() {
                    tx.send(1).unwrap();
                }
                let timer = chan::at(past(ms(5)));
                let mut sel = Select::new();
                sel.recv(&rx);
                sel.recv(&timer);
                let op = sel.select();
                let i = op.index();
                if i == 0 {
                    op.recv(&rx).unwrap();
                } else {
                    op.recv(&timer).unwrap();
                }
                hits[i] += 1;
            }
            assert!(hits.iter().all(|&h| h > N / 4), "Select::select: {hits:?}");
            let mut hits = [0usize; 2];
            for _ in 0..N {
                if rx.is_empty() {
                    tx.send(1).unwrap();
                }
                let timer = chan::at(past(ms(5)));
                let mut sel = Select::new();
                sel.recv(&rx);
                sel.recv(&timer);
                hits[sel.ready()] += 1;
            }
            assert!(hits.iter().all(|&h| h > N / 4), "Select::ready: {hits:?}");
        }
    })
}

// ------------------------------------------------- timer arms reused

/// crossbeam's documented pattern: one `after` made before the loop bounds
/// the whole loop, however many messages arrive; once it fired it is
/// exhausted (an `after` channel delivers one message and never
/// disconnects), so a later select on it takes its default.
#[test]
fn an_after_arm_reused_across_iterations_bounds_the_whole_loop() {
    both(|| {
        let (tx, rx) = chan::bounded::<u32>(0);
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let producer = std::thread::spawn(move || {
            let mut i = 0;
            while !s.load(Ordering::SeqCst) {
                if tx.send_timeout(i, ms(50)).is_ok() {
                    i += 1;
                }
                std::thread::sleep(ms(2));
            }
        });
        let start = Instant::now();
        let timeout = chan::after(ms(150));
        let mut got = 0;
        loop {
            fiber::select! {
                recv(rx) -> v => { v.unwrap(); got += 1; },
                recv(timeout) -> v => { assert!(v.unwrap() >= start + ms(150)); break; },
            }
            assert!(start.elapsed() < Duration::from_secs(5), "the reused after never fired");
        }
        let took = start.elapsed();
        assert!(
            took >= ms(150) && took < Duration::from_secs(2),
            "loop ended after {took:?}"
        );
        assert!(got > 5, "the channel arm was starved: {got} messages");
        let r = fiber::select! {
            recv(timeout) -> _ => "again",
            default(ms(20)) => "exhausted",
        };
        assert_eq!(r, "exhausted");
        assert_eq!(timeout.try_recv(), Err(TryRecvError::Empty));
        stop.store(true, Ordering::SeqCst);
        producer.join().unwrap();
    })
}

/// A `Select` built once with a `tick` arm and selected in a loop: every
/// tick comes at least one period after the previous one, none twice.
#[test]
fn a_select_reused_with_a_tick_arm_never_delivers_early_or_twice() {
    both(|| {
        let d = ms(3);
        let t = chan::tick(d);
        let (_tx, rx) = chan::bounded::<u8>(0);
        let mut sel = Select::new();
        sel.recv(&rx);
        let ti = sel.recv(&t);
        let mut last: Option<Instant> = None;
        for _ in 0..30 {
            let op = sel.select();
            assert_eq!(op.index(), ti);
            let m = op.recv(&t).unwrap();
            assert!(m <= Instant::now(), "a tick from the future");
            if let Some(l) = last {
                assert!(m >= l + d, "tick came {:?} after the previous one", m - l);
            }
            last = Some(m);
        }
    })
}

/// Clones of one `after` receiver share its single message (crossbeam: the
/// channel delivers one message; a receiver's clone is the same channel):
/// of many receivers waiting on clones, exactly one gets it, by `recv`,
/// `recv_timeout` or `select!`.
#[test]
fn clones_of_one_after_deliver_its_message_exactly_once() {
    within(30, || {
        rt2().block_on(|| {
            for round in 0..20 {
                let a = chan::after(ms(10));
                let hits = Arc::new(AtomicUsize::new(0));
                let mut hs = Vec::new();
                for k in 0..6 {
                    let a = a.clone();
                    let hits = hits.clone();
                    hs.push(fiber::spawn(move || {
                        let got = match k % 3 {
                            0 => a.recv_timeout(ms(200)).is_ok(),
                            1 => fiber::select! {
                                recv(a) -> v => v.is_ok(),
                                default(ms(200)) => false,
                            },
                            _ => fiber::with_timeout(ms(200), || a.recv().is_ok()).unwrap_or(false),
                        };
                        if got {
                            hits.fetch_add(1, Ordering::SeqCst);
                        }
                    }));
                }
                for h in hs {
                    h.join().unwrap();
                }
                assert_eq!(hits.load(Ordering::SeqCst), 1, "round {round}");
            }
        })
    })
}

// ------------------------------------------------- tick drift

/// Count the ticks of `tick(d)` received in `window` by a loop of `recv`
/// or of `select!` (with a `never` arm beside the tick).
fn ticks_in(d: Duration, window: Duration, by_select: bool) -> usize {
    let t = chan::tick(d);
    let never = chan::never::<u8>();
    let start = Instant::now();
    let mut n = 0;
    while start.elapsed() < window {
        if by_select {
            fiber::select! {
                recv(t) -> v => { v.unwrap(); },
                recv(never) -> _ => unreachable!(),
            }
        } else {
            t.recv().unwrap();
        }
        n += 1;
    }
    n
}

/// Go's `time.Ticker` keeps its phase; crossbeam's blocking `recv` on a
/// `tick` keeps its schedule for a receiver that was already waiting (the
/// next delivery is `max(due, start of the receive) + period`), and
/// fiber's `recv` does the same
/// (`conformance/channels.rs::tick_keeps_its_schedule_for_a_receiver_that_was_waiting`,
/// whose comment says a `tick(1 ms)` on a fiber "gave about half its
/// messages" before). The same waiting receiver inside a `select!` loop
/// (the Go-style `for { select { case <-ticker.C: .. } }`) should see about
/// as many ticks as the plain `recv` loop.
/// Was: a select's tick arm restarted the period from its (late,
/// ms-rounded) wake, about half the ticks of a recv loop.
#[test]
fn a_tick_in_a_select_loop_keeps_its_schedule_like_a_recv_loop() {
    within(60, || {
        rt2().block_on(|| {
            let d = ms(1);
            let window = ms(400);
            let by_recv = ticks_in(d, window, false);
            let by_select = ticks_in(d, window, true);
            assert!(
                by_select * 10 >= by_recv * 8,
                "tick(1 ms) over 400 ms: a select loop got {by_select} ticks where a recv loop got {by_recv}"
            );
        })
    })
}

// ------------------------------------------------- deadlines while every worker spins

/// Every kind of timed wait (100 ms: long enough that the spinners are
/// spinning before it is due, on a loaded machine too), parked before the
/// workers get busy.
/// Each returns (its name, whether it reported the timeout, how long it
/// waited).
const TIMED_WAIT: Duration = Duration::from_millis(100);

fn timed_waiters() -> Vec<fiber::JoinHandle<(&'static str, bool, Duration)>> {
    let d = TIMED_WAIT;
    type W = fn(Duration) -> bool;
    let waits: Vec<(&'static str, W)> = vec![
        ("sleep", |d| fiber::sleep(d).is_ok()),
        ("sleep_until", |d| fiber::sleep_until(Instant::now() + d).is_ok()),
        ("park_timeout", |d| {
            fiber::park_timeout(d);
            true
        }),
        ("recv_timeout", |d| {
            let (_tx, rx) = chan::bounded::<u8>(0);
            rx.recv_timeout(d) == Err(RecvTimeoutError::Timeout)
        }),
        ("send_timeout", |d| {
            let (tx, _rx) = chan::bounded::<u8>(0);
            tx.send_timeout(1, d) == Err(SendTimeoutError::Timeout(1))
        }),
        ("select after", |d| {
            let (_tx, rx) = chan::bounded::<u8>(0);
            fiber::select! { recv(rx) -> _ => false, recv(chan::after(d)) -> v => v.is_ok() }
        }),
        ("select default", |d| {
            let (_tx, rx) = chan::bounded::<u8>(0);
            fiber::select! { recv(rx) -> _ => false, default(d) => true }
        }),
        ("tick recv", |d| chan::tick(d).recv().is_ok()),
        ("condvar", |d| {
            let m = fiber::sync::Mutex::new(());
            let cv = fiber::sync::Condvar::new();
            let (_g, r) = cv.wait_timeout(m.lock().unwrap(), d).unwrap();
            r.timed_out()
        }),
        ("with_timeout", |d| {
            fiber::with_timeout(d, || fiber::sleep(Duration::MAX)) == Err(fiber::TimedOut)
        }),
    ];
    waits
        .into_iter()
        .map(|(name, w)| {
            fiber::spawn(move || {
                let start = Instant::now();
                let ok = w(d);
                (name, ok, start.elapsed())
            })
        })
        .collect()
}

/// Park every kind of timed wait, then occupy `spinners` workers with
/// fibers that spin without a yield point until every wait has ended (or
/// `limit`). Returns whether the waits all ended while the spinners still
/// spun; asserts each wait reported its timeout and none ended early.
fn timed_waits_beside_spinners(rt: fiber::Runtime, spinners: usize, limit: Duration) -> bool {
    rt.block_on(move || {
        let waiters = timed_waiters();
        fiber::sleep(ms(3)).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let spinning: Vec<_> = (0..spinners)
            .map(|_| {
                let stop = stop.clone();
                fiber::spawn(move || spin_until(&stop, limit))
            })
            .collect();
        let checker = {
            let stop = stop.clone();
            fiber::spawn(move || {
                let mut out = Vec::new();
                for w in waiters {
                    out.push(w.join().unwrap());
                }
                stop.store(true, Ordering::Release);
                out
            })
        };
        let by_flag: Vec<bool> = spinning.into_iter().map(|s| s.join().unwrap()).collect();
        let spin_end = Instant::now();
        for (name, ok, waited) in checker.join().unwrap() {
            assert!(ok, "{name}: did not report its timeout");
            assert!(waited >= TIMED_WAIT, "{name}: ended early ({waited:?})");
        }
        assert!(
            spin_end.elapsed() < Duration::from_secs(2),
            "overdue waits were slow to end after the spin"
        );
        by_flag.iter().all(|&b| b)
    })
}

/// Growth off, every worker spinning without a yield point (README:
/// "Cooperative ... one that never does is not interrupted"): timed waits
/// whose deadlines pass meanwhile are late, but none is lost and each
/// ends with its timeout once the spinners stop.
#[test]
fn timed_waits_overdue_while_every_fixed_worker_spins_all_time_out_after() {
    within(60, || {
        let rescued = timed_waits_beside_spinners(rt_fixed_grace(2, ms(300)), 2, ms(300));
        assert!(!rescued, "with every fixed worker spinning nothing else can run");
    })
}

/// Growth off, one of two workers spinning (spec/sched.md section 7: the
/// monitor fires a busy owner's overdue wheel and the woken fibers run
/// elsewhere): every timed wait ends, with its timeout, during the spin.
#[test]
fn timed_waits_end_beside_one_spinning_fixed_worker() {
    within(60, || {
        let rescued = timed_waits_beside_spinners(rt_fixed_grace(2, ms(300)), 1, Duration::from_secs(10));
        assert!(rescued, "the timed waits did not end while one worker spun");
    })
}

/// Growth on (README: "A fiber that spins for more than 10 ms makes the
/// pool grow (up to max_workers)"): the same waits end, with their
/// timeouts, while both starting workers still spin.
#[test]
fn timed_waits_end_while_the_starting_workers_spin_when_the_pool_may_grow() {
    within(60, || {
        let rt = fiber::Runtime::builder()
            .workers(2)
            .max_workers(4)
            .shutdown_timeout(ms(300))
            .build()
            .unwrap();
        let rescued = timed_waits_beside_spinners(rt, 2, Duration::from_secs(10));
        assert!(
            rescued,
            "the timed waits did not end while the workers spun (no growth rescue)"
        );
    })
}

/// `with_timeout` around the join of a fiber that spins on the other
/// worker (there is no timed join; this is how one is written): the join,
/// a cancellation point, ends at the deadline with `TimedOut`, and the
/// spinner runs on; a scope, which must wait for its children, ends only
/// with the spinning child, and still reports the timeout.
#[test]
fn with_timeout_around_a_join_of_a_spinner_ends_at_its_deadline() {
    within(60, || {
        rt_fixed_grace(2, ms(300)).block_on(|| {
            let stop = Arc::new(AtomicBool::new(false));
            let s = stop.clone();
            let spinner = fiber::spawn(move || spin_until(&s, Duration::from_secs(5)));
            let start = Instant::now();
            let r = fiber::with_timeout(ms(30), || spinner.join());
            let took = start.elapsed();
            assert!(matches!(r, Err(fiber::TimedOut)), "{r:?}");
            assert!(took >= ms(30) && took < Duration::from_secs(2), "took {took:?}");
            stop.store(true, Ordering::Release);
            let start = Instant::now();
            let r = fiber::with_timeout(ms(30), || {
                fiber::scope(|sc| {
                    sc.spawn(|| spin_until(&AtomicBool::new(false), ms(300)));
                })
            });
            assert_eq!(r, Err(fiber::TimedOut));
            assert!(start.elapsed() >= ms(300), "the scope returned before its child");
        })
    })
}

// ------------------------------------------------- shutdown and huge timeouts

/// chan.md: a timeout too long for `Instant` (`Duration::MAX`) "waits
/// without a deadline"; the shutdown rule (spec/reliability.md, step 2)
/// keeps the grace time for a wait with a deadline and ends it after
/// 50 ms otherwise. So clean-up in `non_cancellable` that waits with
/// `recv_timeout(1000 years)` gets a value a plain thread sends within the
/// grace time, and the same clean-up with `recv_timeout(Duration::MAX)`
/// (to a std/crossbeam user the same wait) is unwound after 50 ms and the
/// thread's send is refused.
/// Was: `recv_timeout(Duration::MAX)` in `non_cancellable` clean-up was
/// unwound 50 ms into the grace (1000 years was not).
#[test]
fn non_cancellable_recv_timeout_max_keeps_the_grace_time_like_a_long_timeout() {
    within(60, || {
        for (name, d) in [
            ("1000 years", Duration::from_secs(1000 * 365 * 86400)),
            ("Duration::MAX", Duration::MAX),
        ] {
            let rt = rt_fixed_grace(2, Duration::from_secs(3));
            let (tx, rx) = chan::bounded::<u32>(0);
            let got = Arc::new(std::sync::Mutex::new(None));
            let g = got.clone();
            drop(rt.spawn(move || {
                let r = fiber::non_cancellable(|| rx.recv_timeout(d));
                *g.lock().unwrap() = Some(r);
            }));
            crate::common::wait_parked(&rt, 1);
            let sender = std::thread::spawn(move || {
                std::thread::sleep(ms(300));
                tx.send_timeout(9, Duration::from_secs(5)).is_ok()
            });
            drop(rt);
            let sent = sender.join().unwrap();
            assert!(sent, "{name}: the clean-up was unwound and the thread's send refused");
            assert_eq!(*got.lock().unwrap(), Some(Ok(9)), "{name}");
        }
    })
}
