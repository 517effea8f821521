//! Adversarial: `Duration::MAX`, far-future `Instant`s and zero durations in
//! every API that takes a time, checked against std / crossbeam behaviour:
//! a huge timeout means "wait until the event", never an overflow panic, a
//! wrap-around into an immediate timeout, or a hang after the event.

use fiber::chan::{self, RecvTimeoutError, SendTimeoutError};
use std::io::{self, Read, Write};
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use crate::common::{ms, within};

fn rt() -> fiber::Runtime {
    fiber::Runtime::builder()
        .workers(2)
        .shutdown_timeout(Duration::from_millis(500))
        .build()
        .unwrap()
}

/// 100 years ahead: representable, but any `+ Duration` on it overflows.
fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600)
}

#[test]
fn sleep_duration_max_and_sleep_until_far_future_end_when_cancelled() {
    within(20, || {
        rt().block_on(|| {
            let a = fiber::spawn(|| fiber::sleep(Duration::MAX));
            let b = fiber::spawn(|| fiber::sleep_until(far_future()));
            fiber::sleep(ms(20)).unwrap();
            assert!(
                !a.is_finished() && !b.is_finished(),
                "a huge sleep must not end at once"
            );
            a.cancel();
            b.cancel();
            assert!(a.join().unwrap_err().is_cancelled());
            assert!(b.join().unwrap_err().is_cancelled());
        })
    })
}

#[test]
fn sleep_zero_and_sleep_until_the_past_return_ok_at_once() {
    within(20, || {
        rt().block_on(|| {
            assert_eq!(fiber::sleep(Duration::ZERO), Ok(()));
            let past = Instant::now().checked_sub(ms(50)).unwrap_or_else(Instant::now);
            assert_eq!(fiber::sleep_until(past), Ok(()));
        })
    })
}

#[test]
fn recv_timeout_and_recv_deadline_max_get_a_late_value_in_fibers_and_threads() {
    within(20, || {
        let rt = rt();
        let (tx, rx) = chan::bounded::<u32>(0);
        let (tx2, rx2) = chan::unbounded::<u32>();
        // A plain thread waits with Duration::MAX; a fiber sends late.
        let thread = std::thread::spawn(move || rx2.recv_timeout(Duration::MAX));
        rt.block_on(|| {
            let sender = fiber::spawn(move || {
                fiber::sleep(ms(20)).unwrap();
                tx.send(7).unwrap();
                fiber::sleep(ms(20)).unwrap();
                tx2.send(8).unwrap();
            });
            assert_eq!(rx.recv_timeout(Duration::MAX), Ok(7));
            sender.join().unwrap();
        });
        assert_eq!(thread.join().unwrap(), Ok(8));
        let (tx, rx) = chan::bounded::<u32>(1);
        tx.send(1).unwrap();
        assert_eq!(rx.recv_deadline(far_future()), Ok(1));
        drop(tx);
        assert_eq!(rx.recv_deadline(far_future()), Err(RecvTimeoutError::Disconnected));
    })
}

#[test]
fn send_timeout_max_on_a_full_channel_completes_when_room_appears() {
    within(20, || {
        rt().block_on(|| {
            let (tx, rx) = chan::bounded::<u32>(1);
            tx.send(1).unwrap();
            let receiver = fiber::spawn(move || {
                fiber::sleep(ms(20)).unwrap();
                let a = rx.recv().unwrap();
                let b = rx.recv().unwrap();
                let c = rx.recv().unwrap();
                (a, b, c)
            });
            assert_eq!(tx.send_timeout(2, Duration::MAX), Ok(()));
            assert_eq!(tx.send_deadline(3, far_future()), Ok(()));
            assert_eq!(receiver.join().unwrap(), (1, 2, 3));
            // Disconnected: the value comes back even with an infinite timeout.
            match tx.send_timeout(4, Duration::MAX) {
                Err(SendTimeoutError::Disconnected(4)) => {}
                other => panic!("expected Disconnected(4), got {other:?}"),
            }
        })
    })
}

#[test]
fn zero_timeouts_behave_like_try_and_never_block() {
    within(20, || {
        // crossbeam: a zero timeout still takes a ready value.
        let (tx, rx) = chan::bounded::<u32>(1);
        assert_eq!(rx.recv_timeout(Duration::ZERO), Err(RecvTimeoutError::Timeout));
        tx.send_timeout(5, Duration::ZERO).unwrap();
        match tx.send_timeout(6, Duration::ZERO) {
            Err(SendTimeoutError::Timeout(6)) => {}
            other => panic!("expected Timeout(6), got {other:?}"),
        }
        assert_eq!(rx.recv_timeout(Duration::ZERO), Ok(5));
        let past = Instant::now().checked_sub(ms(10)).unwrap_or_else(Instant::now);
        assert_eq!(rx.recv_deadline(past), Err(RecvTimeoutError::Timeout));
        rt().block_on(move || {
            tx.send(9).unwrap();
            assert_eq!(rx.recv_timeout(Duration::ZERO), Ok(9));
            assert_eq!(rx.recv_deadline(past), Err(RecvTimeoutError::Timeout));
        });
    })
}

#[test]
fn park_timeout_max_returns_on_unpark_in_a_fiber() {
    within(20, || {
        rt().block_on(|| {
            let (tx, rx) = chan::bounded(1);
            let parker = fiber::spawn(move || {
                tx.send(fiber::current()).unwrap();
                fiber::park_timeout(Duration::MAX);
            });
            let handle = rx.recv().unwrap();
            fiber::sleep(ms(10)).unwrap();
            handle.unpark();
            parker.join().unwrap();
        })
    })
}

#[test]
fn park_timeout_max_on_a_plain_thread_returns_on_unpark() {
    within(20, || {
        let t = std::thread::spawn(|| fiber::park_timeout(Duration::MAX));
        std::thread::sleep(ms(20));
        t.thread().unpark();
        t.join().unwrap();
    })
}

#[test]
fn with_timeout_max_returns_the_value_and_is_ended_by_an_outer_cancel() {
    within(20, || {
        rt().block_on(|| {
            assert_eq!(fiber::with_timeout(Duration::MAX, || 3), Ok(3));
            let (tx, rx) = chan::bounded(1);
            let worker = fiber::spawn(move || {
                let r = fiber::with_timeout(Duration::MAX, || fiber::sleep(Duration::MAX));
                tx.send(format!("{r:?}")).unwrap();
            });
            fiber::sleep(ms(20)).unwrap();
            worker.cancel();
            let seen = rx
                .recv_timeout(Duration::from_secs(10))
                .expect("the cancel reached the body");
            assert!(
                !seen.contains("TimedOut"),
                "an explicit cancel is not a timeout: {seen}"
            );
            let _ = worker.join();
        })
    })
}

#[test]
fn with_timeout_zero_times_out_a_body_that_waits() {
    // Kotlin: withTimeout(0) { delay(..) } times out at the first suspension.
    within(20, || {
        rt().block_on(|| {
            let start = Instant::now();
            let r = fiber::with_timeout(Duration::ZERO, || fiber::sleep(Duration::from_secs(30)));
            assert!(r.is_err(), "with_timeout(0) must time out, got {r:?}");
            assert!(start.elapsed() < Duration::from_secs(10));
        })
    })
}

#[test]
fn nested_with_timeout_the_shorter_one_wins() {
    within(20, || {
        rt().block_on(|| {
            // Outer shorter: the outer reports the timeout.
            let outer = fiber::with_timeout(ms(30), || {
                let inner = fiber::with_timeout(Duration::MAX, || fiber::sleep(Duration::MAX));
                assert!(
                    inner.is_err() || inner.unwrap().is_err(),
                    "the inner body was cancelled"
                );
            });
            assert!(outer.is_err(), "outer deadline passed: {outer:?}");
            // Inner shorter: the inner times out, the outer completes.
            let outer = fiber::with_timeout(Duration::MAX, || {
                let inner = fiber::with_timeout(ms(10), || fiber::sleep(Duration::MAX));
                assert!(inner.is_err(), "inner deadline passed");
                fiber::check_cancelled().is_ok()
            });
            assert_eq!(outer, Ok(true), "the outer job is not cancelled by the inner timeout");
        })
    })
}

#[test]
fn select_with_timer_arms_of_duration_max() {
    within(20, || {
        rt().block_on(|| {
            let (tx, rx) = chan::bounded::<u32>(0);
            fiber::spawn(move || {
                fiber::sleep(ms(20)).unwrap();
                tx.send(1).unwrap();
            });
            let got = fiber::select! {
                recv(rx) -> v => v.unwrap(),
                recv(chan::after(Duration::MAX)) -> _ => panic!("after(MAX) fired"),
                recv(chan::tick(Duration::MAX)) -> _ => panic!("tick(MAX) fired"),
                recv(chan::at(far_future())) -> _ => panic!("at(far future) fired"),
                default(Duration::MAX) => panic!("default(MAX) fired"),
            };
            assert_eq!(got, 1);
            let never = chan::never::<u8>();
            let mut sel = chan::Select::new();
            sel.recv(&never);
            let start = Instant::now();
            assert!(sel.select_timeout(ms(20)).is_err());
            assert!(start.elapsed() >= ms(20), "a select timeout never ends early");
            drop(sel);
            let (tx, rx) = chan::bounded::<u8>(1);
            tx.send(2).unwrap();
            let mut sel = chan::Select::new();
            sel.recv(&rx);
            let op = sel.select_timeout(Duration::MAX).unwrap();
            assert_eq!(op.recv(&rx), Ok(2));
            tx.send(3).unwrap();
            let mut sel = chan::Select::new();
            sel.recv(&rx);
            assert_eq!(sel.ready_timeout(Duration::MAX), Ok(0));
            let mut sel = chan::Select::new();
            sel.recv(&rx);
            assert_eq!(sel.ready_deadline(far_future()), Ok(0));
        })
    })
}

#[test]
fn timer_channels_of_huge_durations_never_fire_and_never_panic() {
    within(20, || {
        for rx in [
            chan::after(Duration::MAX),
            chan::tick(Duration::MAX),
            chan::at(far_future()),
        ] {
            assert_eq!(rx.recv_timeout(ms(10)), Err(RecvTimeoutError::Timeout));
        }
        rt().block_on(|| {
            for rx in [
                chan::after(Duration::MAX),
                chan::tick(Duration::MAX),
                chan::at(far_future()),
            ] {
                assert_eq!(rx.recv_timeout(ms(10)), Err(RecvTimeoutError::Timeout));
            }
        })
    })
}

#[test]
fn condvar_and_runtime_options_take_duration_max() {
    within(20, || {
        let rt = fiber::Runtime::builder()
            .workers(1)
            .max_workers(2)
            .idle_timeout(Duration::MAX)
            .build()
            .unwrap();
        rt.block_on(|| {
            let pair = std::sync::Arc::new((fiber::sync::Mutex::new(false), fiber::sync::Condvar::new()));
            let p = pair.clone();
            fiber::spawn(move || {
                fiber::sleep(ms(10)).unwrap();
                *p.0.lock().unwrap() = true;
                p.1.notify_all();
            });
            let (m, cv) = &*pair;
            let (guard, res) = cv
                .wait_timeout_while(m.lock().unwrap(), Duration::MAX, |ready| !*ready)
                .unwrap();
            assert!(*guard && !res.timed_out());
        });
        // Runtime::shutdown_timeout(MAX) with a fiber that ends on cancel.
        rt.spawn(|| {
            let _ = fiber::sleep(Duration::MAX);
        });
        rt.shutdown_timeout(Duration::MAX);
    })
}

#[test]
fn fiber_env_durations_at_u64_max_and_beyond_never_panic() {
    use fiber::runtime::Config;
    for var in ["FIBER_IDLE_TIMEOUT_MS", "FIBER_SHUTDOWN_TIMEOUT_MS"] {
        for value in [
            "18446744073709551615",
            "18446744073709551616",
            "99999999999999999999999",
            "-1",
            "",
        ] {
            let r = std::panic::catch_unwind(|| {
                Config::resolve_with(&Default::default(), |k| (k == var).then(|| value.to_string()))
            });
            let r = r.unwrap_or_else(|_| panic!("{var}={value} panicked instead of resolving or erroring"));
            if let Err(e) = r {
                assert!(e.to_string().contains(var), "the error names {var}: {e}");
            }
        }
    }
    // u64::MAX ms is a valid "forever": a runtime with it starts and stops.
    let config = Config::resolve_with(&Default::default(), |k| {
        (k == "FIBER_IDLE_TIMEOUT_MS" || k == "FIBER_SHUTDOWN_TIMEOUT_MS").then(|| u64::MAX.to_string())
    });
    if let Ok(config) = config {
        within(20, move || {
            let rt = fiber::Runtime::with_config(config).unwrap();
            assert_eq!(rt.block_on(|| fiber::spawn(|| 4).join().unwrap()), 4);
        })
    }
}

#[test]
fn tcp_read_timeout_max_waits_for_data_and_zero_is_invalid_input() {
    within(20, || {
        rt().block_on(|| {
            let listener = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let server = fiber::spawn(move || {
                let (mut s, _) = listener.accept().unwrap();
                fiber::sleep(ms(20)).unwrap();
                s.write_all(b"late").unwrap();
            });
            let mut c = fiber::net::TcpStream::connect(addr).unwrap();
            // std: Some(ZERO) is an InvalidInput error, for reads and writes.
            assert_eq!(
                c.set_read_timeout(Some(Duration::ZERO)).unwrap_err().kind(),
                io::ErrorKind::InvalidInput
            );
            assert_eq!(
                c.set_write_timeout(Some(Duration::ZERO)).unwrap_err().kind(),
                io::ErrorKind::InvalidInput
            );
            c.set_read_timeout(Some(Duration::MAX)).unwrap();
            c.set_write_timeout(Some(Duration::MAX)).unwrap();
            // std on Linux: the kernel keeps a timeout this long as none,
            // and the getter reads back `None`.
            assert_eq!(c.read_timeout().unwrap(), None);
            let mut buf = [0u8; 4];
            c.read_exact(&mut buf).unwrap();
            assert_eq!(&buf, b"late");
            server.join().unwrap();
        })
    })
}

#[test]
fn tcp_read_timeout_expires_with_would_block_or_timed_out() {
    within(20, || {
        rt().block_on(|| {
            let listener = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let mut c = fiber::net::TcpStream::connect(addr).unwrap();
            let (_s, _) = listener.accept().unwrap();
            c.set_read_timeout(Some(ms(20))).unwrap();
            assert_eq!(c.read_timeout().unwrap(), std_rounded(ms(20)));
            let start = Instant::now();
            let err = c.read(&mut [0u8; 8]).unwrap_err();
            assert!(
                matches!(err.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut),
                "std reports WouldBlock/TimedOut on a read timeout, got {err:?}"
            );
            assert!(start.elapsed() >= ms(20), "the read timeout never ends early");
        })
    })
}

#[test]
fn udp_read_timeout_max_and_zero() {
    within(20, || {
        rt().block_on(|| {
            let a = fiber::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            let b = fiber::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            assert_eq!(
                a.set_read_timeout(Some(Duration::ZERO)).unwrap_err().kind(),
                io::ErrorKind::InvalidInput
            );
            a.set_read_timeout(Some(Duration::MAX)).unwrap();
            let to = a.local_addr().unwrap();
            let sender = fiber::spawn(move || {
                fiber::sleep(ms(20)).unwrap();
                b.send_to(b"hi", to).unwrap();
            });
            let mut buf = [0u8; 8];
            let (n, _) = a.recv_from(&mut buf).unwrap();
            assert_eq!(&buf[..n], b"hi");
            sender.join().unwrap();
        })
    })
}

#[test]
fn connect_timeout_of_duration_max_and_zero() {
    within(20, || {
        rt().block_on(|| {
            let listener = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            // std: a zero connect timeout is InvalidInput.
            let err = fiber::net::TcpStream::connect_timeout(&addr, Duration::ZERO).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
            let c = fiber::net::TcpStream::connect_timeout(&addr, Duration::MAX).unwrap();
            assert_eq!(c.peer_addr().unwrap(), addr);
        })
    })
}

/// A fiber parked in `op`, cancelled: what `op` returned, as text.
fn cancelled_result(op: impl FnOnce() -> String + Send + 'static) -> String {
    let (report, reports) = chan::unbounded::<String>();
    let h = fiber::spawn(move || report.send(op()).unwrap());
    fiber::sleep(ms(10)).unwrap();
    h.cancel();
    let _ = h.join();
    reports
        .recv_timeout(Duration::from_secs(10))
        .expect("the cancelled wait returned")
}

#[test]
fn a_cancelled_timed_wait_reports_timeout_for_duration_max_as_for_any_timeout() {
    // Documented: a fiber cancelled while it waits in recv_deadline /
    // send_deadline / select_timeout / ready_timeout gets a timeout. An
    // infinite timeout (whose deadline overflows) must not turn that into
    // `Disconnected` on a channel that is still connected, or into the
    // blocking form's failed first arm.
    within(20, || {
        rt().block_on(|| {
            for timeout in [Duration::from_secs(3600), Duration::MAX] {
                let (tx, rx) = chan::bounded::<u8>(0);
                let r = {
                    let rx = rx.clone();
                    cancelled_result(move || format!("{:?}", rx.recv_timeout(timeout)))
                };
                assert_eq!(r, "Err(Timeout)", "recv_timeout({timeout:?}) cancelled");
                let r = {
                    let tx = tx.clone();
                    cancelled_result(move || format!("{:?}", tx.send_timeout(1, timeout)))
                };
                assert_eq!(r, "Err(Timeout(..))", "send_timeout({timeout:?}) cancelled");
                for timer in [chan::never::<Instant>(), chan::after(Duration::MAX)] {
                    let r = cancelled_result(move || format!("{:?}", timer.recv_timeout(timeout)));
                    assert_eq!(r, "Err(Timeout)", "timer/never recv_timeout({timeout:?}) cancelled");
                }
                let r = {
                    let rx = rx.clone();
                    cancelled_result(move || {
                        let mut sel = chan::Select::new();
                        sel.recv(&rx);
                        let r = match sel.select_timeout(timeout) {
                            Ok(op) => format!("op {:?}", op.recv(&rx)),
                            Err(e) => format!("{e:?}"),
                        };
                        r
                    })
                };
                assert_eq!(r, "SelectTimeoutError", "select_timeout({timeout:?}) cancelled");
                let r = {
                    let rx = rx.clone();
                    cancelled_result(move || {
                        let mut sel = chan::Select::new();
                        sel.recv(&rx);
                        format!("{:?}", sel.ready_timeout(timeout))
                    })
                };
                assert_eq!(r, "Err(ReadyTimeoutError)", "ready_timeout({timeout:?}) cancelled");
                let r = {
                    let rx = rx.clone();
                    cancelled_result(move || {
                        fiber::select! {
                            recv(rx) -> v => format!("arm {v:?}"),
                            default(timeout) => "default".to_string(),
                        }
                    })
                };
                assert_eq!(r, "default", "select! default({timeout:?}) cancelled");
                drop((tx, rx));
            }
        })
    })
}

#[test]
fn select_timeout_max_with_every_operation_removed_waits_instead_of_panicking() {
    // select_deadline with no live operation waits until its deadline; an
    // infinite timeout waits until cancelled (it must not become the
    // blocking form, which panics on an empty set).
    within(20, || {
        rt().block_on(|| {
            let r = cancelled_result(|| {
                let (_tx, rx) = chan::bounded::<u8>(0);
                let mut sel = chan::Select::new();
                let i = sel.recv(&rx);
                sel.remove(i);
                match std::panic::catch_unwind(AssertUnwindSafe(|| sel.select_timeout(Duration::MAX).is_err())) {
                    Ok(timed_out) => format!("timed out: {timed_out}"),
                    Err(_) => "panicked".to_string(),
                }
            });
            assert_eq!(r, "timed out: true");
        })
    })
}

#[test]
fn every_fiber_env_variable_with_absurd_values_resolves_or_names_itself() {
    use fiber::runtime::Config;
    let vars = [
        "FIBER_WORKERS",
        "FIBER_MAX_WORKERS",
        "FIBER_STACK_SIZE",
        "FIBER_SHUTDOWN_TIMEOUT_MS",
        "FIBER_IDLE_TIMEOUT_MS",
        "FIBER_STATS",
        "FIBER_DEBUG_STALL",
        "FIBER_DUMP_SIGNAL",
        "FIBER_DEADLOCK_ABORT",
        "FIBER_UNGUARDED",
        "FIBER_BACKTRACE",
        "FIBER_IO_HARVEST",
        "FIBER_TRACE_SPANS",
        "FIBER_MAX_BLOCKING",
    ];
    let values = [
        "0",
        "-1",
        "18446744073709551616",
        "99999999999999999g",
        "18446744073709551615k",
        "1k",
        "abc",
        " 5 ",
        "",
        "SIGKILL",
        "1e3",
        "\u{0}",
        "２",
    ];
    for var in vars {
        for value in values {
            let r = std::panic::catch_unwind(|| {
                Config::resolve_with(&Default::default(), |k| (k == var).then(|| value.to_string()))
            });
            let r = r.unwrap_or_else(|_| panic!("{var}={value:?} panicked instead of resolving or erroring"));
            if let Err(e) = r {
                assert!(e.to_string().contains(var), "the error names {var}: {e}");
            }
        }
    }
}

#[test]
fn a_zero_shutdown_timeout_still_unwinds_parked_fibers_once() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    struct Counted(Arc<AtomicUsize>);
    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let drops = Arc::new(AtomicUsize::new(0));
    let d = drops.clone();
    within(20, move || {
        let rt = fiber::Runtime::builder()
            .workers(2)
            .shutdown_timeout(Duration::ZERO)
            .idle_timeout(Duration::ZERO)
            .build()
            .unwrap();
        rt.block_on(move || {
            for _ in 0..4 {
                let d = d.clone();
                fiber::spawn(move || {
                    let _c = Counted(d.clone());
                    fiber::scope(|s| {
                        s.spawn(move || {
                            let _c = Counted(d);
                            let _ = fiber::sleep(Duration::MAX);
                        });
                    });
                });
            }
            fiber::sleep(ms(10)).unwrap();
        });
        drop(rt);
    });
    assert_eq!(drops.load(Ordering::SeqCst), 8);
}

/// Durations whose deadline is representable as an `Instant` but whose
/// length in milliseconds or nanoseconds does not fit a `u64`.
fn huge_but_representable() -> Vec<Duration> {
    [u64::MAX / 4, 1 << 62, 1 << 40, 1 << 35, 18_446_744_073_709_552]
        .into_iter()
        .map(Duration::from_secs)
        .filter(|d| Instant::now().checked_add(*d).is_some())
        .collect()
}

#[test]
fn huge_representable_timeouts_never_fire_early_in_fibers() {
    within(30, || {
        rt().block_on(|| {
            let durations = huge_but_representable();
            assert!(!durations.is_empty());
            for d in durations {
                let sleeper = fiber::spawn(move || fiber::sleep(d));
                let (_tx, rx) = chan::bounded::<u8>(0);
                let receiver = fiber::spawn(move || rx.recv_timeout(d));
                let (tx2, _rx2) = chan::bounded::<u8>(0);
                let sender = fiber::spawn(move || tx2.send_timeout(1, d).is_ok());
                let selector = fiber::spawn(move || {
                    fiber::select! {
                        recv(chan::never::<u8>()) -> _ => "never",
                        recv(chan::after(d)) -> _ => "after",
                        recv(chan::tick(d)) -> _ => "tick",
                        recv(chan::at(Instant::now() + d)) -> _ => "at",
                        default(d) => "default",
                    }
                });
                let timed = fiber::spawn(move || fiber::with_timeout(d, || fiber::sleep(ms(30))).is_ok());
                fiber::sleep(ms(50)).unwrap();
                assert!(!sleeper.is_finished(), "sleep({d:?}) ended early");
                assert!(!receiver.is_finished(), "recv_timeout({d:?}) ended early");
                assert!(!sender.is_finished(), "send_timeout({d:?}) ended early");
                assert!(!selector.is_finished(), "select with {d:?} timers ended early");
                assert!(timed.join().unwrap(), "with_timeout({d:?}) cut a 30 ms body short");
                for h in [
                    sleeper.canceller(),
                    receiver.canceller(),
                    sender.canceller(),
                    selector.canceller(),
                ] {
                    h.cancel();
                }
                let _ = (sleeper.join(), receiver.join(), sender.join(), selector.join());
            }
        })
    })
}

#[test]
fn huge_representable_timeouts_never_fire_early_on_plain_threads() {
    within(30, || {
        for d in huge_but_representable() {
            let (_tx, rx) = chan::bounded::<u8>(0);
            let start = Instant::now();
            let r = fiber::select! {
                recv(rx) -> _ => "recv",
                recv(chan::after(d)) -> _ => "after",
                recv(chan::tick(d)) -> _ => "tick",
                default(ms(30)) => "default",
            };
            assert_eq!(r, "default", "a {d:?} timer fired early");
            assert!(start.elapsed() >= ms(30));
            let pair = (fiber::sync::Mutex::new(false), fiber::sync::Condvar::new());
            let t = std::thread::scope(|s| {
                let h = s.spawn(|| {
                    let g = pair.0.lock().unwrap();
                    let (_g, res) = pair.1.wait_timeout_while(g, d, |ready| !*ready).unwrap();
                    res.timed_out()
                });
                std::thread::sleep(ms(30));
                *pair.0.lock().unwrap() = true;
                pair.1.notify_all();
                h.join().unwrap()
            });
            assert!(!t, "Condvar::wait_timeout({d:?}) timed out instead of being notified");
        }
    })
}

/// `JoinError::is_timed_out`: "Did the fiber's job time out
/// (`with_timeout`)?" A scoped child whose job a `with_timeout` deadline
/// cancelled (its `cancel_reason` is `TimedOut`) joins as timed out; it
/// reported a plain cancellation (nothing ever made a timed-out error).
#[test]
fn a_scoped_child_cancelled_by_a_deadline_joins_as_timed_out() {
    within(30, || {
        crate::common::rt().block_on(|| {
            let mut seen = None;
            let r = fiber::with_timeout(ms(30), || {
                fiber::scope(|s| {
                    let (tx, rx) = chan::bounded::<fiber::Job>(1);
                    let h = s.spawn(move || {
                        tx.send(fiber::Job::current()).unwrap();
                        let _ = fiber::sleep(Duration::MAX);
                    });
                    let child_job = rx.recv().unwrap();
                    // No cancellation point until the child has ended, so
                    // the join reports the child's own outcome.
                    while !h.is_finished() {
                        std::thread::yield_now();
                    }
                    seen = Some((child_job.cancel_reason(), h.join()));
                })
            });
            assert_eq!(r, Err(fiber::TimedOut));
            let (reason, joined) = seen.unwrap();
            assert_eq!(reason, Some(fiber::CancelReason::TimedOut));
            let e = joined.unwrap_err();
            assert!(e.is_timed_out(), "joined as {e:?}");
            assert!(e.is_cancelled(), "a timeout is a cancellation");
        })
    });
}

/// An explicit cancel keeps reporting a cancellation.
#[test]
fn a_scoped_child_cancelled_explicitly_joins_as_cancelled() {
    within(30, || {
        crate::common::rt().block_on(|| {
            fiber::scope(|s| {
                let h = s.spawn(|| {
                    let _ = fiber::sleep(Duration::MAX);
                });
                h.cancel();
                let e = h.join().unwrap_err();
                assert!(e.is_cancelled() && !e.is_timed_out(), "joined as {e:?}");
            })
        })
    });
}

/// A wait whose deadline has already passed (a zero timeout) ends at once,
/// as std's, crossbeam's and Go's do: it never parks (waiting for the
/// timer wheel's next tick, about 1 ms, each time). Checked by the park
/// count, not by a clock.
#[test]
fn zero_timeouts_do_not_park() {
    within(30, || {
        crate::common::rt1().block_on(|| {
            let (_tx, rx) = fiber::chan::bounded::<u8>(0);
            let (stx, _srx) = fiber::chan::bounded::<u8>(0);
            let before = fiber::stats().runtime.parks;
            for _ in 0..50 {
                assert!(rx.recv_timeout(Duration::ZERO).is_err());
                assert!(stx.send_timeout(1, Duration::ZERO).is_err());
                fiber::park_timeout(Duration::ZERO);
                fiber::sleep(Duration::ZERO).unwrap();
                fiber::sleep_until(Instant::now()).unwrap();
                assert!(rx.recv_deadline(Instant::now()).is_err());
            }
            let parks = fiber::stats().runtime.parks - before;
            assert_eq!(parks, 0, "zero-timeout waits parked {parks} times");
            // A cancelled fiber's zero sleep still reports the cancellation.
            let job = fiber::Job::current();
            job.cancel();
            assert!(fiber::sleep(Duration::ZERO).is_err());
        })
    })
}

/// What std reads back for a socket timeout of `d`: the kernel keeps it
/// rounded up to its clock tick, and so do `fiber::net`'s getters.
fn std_rounded(d: std::time::Duration) -> Option<std::time::Duration> {
    let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    s.set_read_timeout(Some(d)).unwrap();
    s.read_timeout().unwrap()
}
