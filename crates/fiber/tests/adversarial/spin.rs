//! Adversarial: fibers that never yield. They must not stop timers, other
//! fibers on other workers, `with_timeout` of a body that polls
//! `is_cancelled`, or shutdown (bounded delay).

use fiber::chan;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use crate::common::{ms, rt_fixed_grace, spin_until, within};

#[test]
fn with_timeout_ends_a_body_that_spins_polling_is_cancelled_on_a_single_worker() {
    // One worker, no growth: the only worker spins inside the body; the
    // deadline must still cancel the job (the timer is not the spinning
    // worker's to fire).
    within(30, || {
        let rt = fiber::Runtime::builder().workers(1).max_workers(1).build().unwrap();
        rt.block_on(|| {
            let start = Instant::now();
            let r = fiber::with_timeout(ms(30), || {
                while !fiber::is_cancelled() {
                    if start.elapsed() > Duration::from_secs(20) {
                        return "never cancelled";
                    }
                    std::hint::spin_loop();
                }
                "cancelled"
            });
            assert!(r.is_err(), "the deadline cancelled the spinning body: {r:?}");
            assert!(start.elapsed() < Duration::from_secs(15));
        })
    })
}

#[test]
fn with_timeout_ends_a_spinning_scoped_child_on_a_single_worker() {
    // The same through a scope: the child job inherits the deadline.
    within(30, || {
        let rt = fiber::Runtime::builder().workers(1).max_workers(1).build().unwrap();
        rt.block_on(|| {
            let start = Instant::now();
            let r = fiber::with_timeout(ms(30), || {
                fiber::scope(|s| {
                    s.spawn(|| {
                        while !fiber::is_cancelled() {
                            if start.elapsed() > Duration::from_secs(20) {
                                return false;
                            }
                            std::hint::spin_loop();
                        }
                        true
                    })
                    .join()
                })
            });
            assert!(r.is_err(), "the deadline cancelled the spinning child: {r:?}");
            assert!(start.elapsed() < Duration::from_secs(15));
        })
    })
}

#[test]
fn a_spinner_polling_is_cancelled_sees_a_cancel_from_a_plain_thread() {
    within(30, || {
        let rt = fiber::Runtime::builder().workers(1).max_workers(1).build().unwrap();
        let h = rt.spawn(|| {
            let start = Instant::now();
            while !fiber::is_cancelled() {
                assert!(start.elapsed() < Duration::from_secs(20), "never saw the cancel");
                std::hint::spin_loop();
            }
        });
        std::thread::sleep(ms(20));
        h.cancel();
        assert!(h.join().unwrap_err().is_cancelled());
    })
}

#[test]
fn a_spinner_on_a_single_worker_is_rescued_by_growth_for_a_sleeping_fiber() {
    // README: a fiber that spins for more than 10 ms makes the pool grow.
    within(30, || {
        let rt = fiber::Runtime::builder().workers(1).max_workers(2).build().unwrap();
        rt.block_on(|| {
            let flag = Arc::new(AtomicBool::new(false));
            let f = flag.clone();
            let spinner = fiber::spawn(move || spin_until(&f, Duration::from_secs(20)));
            let f = flag.clone();
            let setter = fiber::spawn(move || {
                fiber::sleep(ms(20)).unwrap();
                let after = chan::after(ms(5));
                after.recv().unwrap();
                f.store(true, Ordering::Release);
            });
            setter.join().unwrap();
            assert!(spinner.join().unwrap(), "the spinner was released by the sleeper");
        })
    })
}

#[test]
fn a_spinner_does_not_stop_timers_and_channels_on_the_other_worker() {
    within(30, || {
        let rt = fiber::Runtime::builder().workers(2).max_workers(2).build().unwrap();
        rt.block_on(|| {
            let flag = Arc::new(AtomicBool::new(false));
            let f = flag.clone();
            let spinner = fiber::spawn(move || spin_until(&f, Duration::from_secs(20)));
            // Ticks, after(), select with a timer arm and a rendezvous all
            // complete while one of the two workers spins.
            let ticks = chan::tick(ms(2));
            for _ in 0..5 {
                ticks.recv().unwrap();
            }
            let (tx, rx) = chan::bounded::<u32>(0);
            let producer = fiber::spawn(move || {
                for i in 0..100 {
                    tx.send(i).unwrap();
                }
            });
            assert_eq!(rx.iter().sum::<u32>(), 4950);
            producer.join().unwrap();
            let got = fiber::select! {
                recv(chan::never::<u8>()) -> _ => 0,
                recv(chan::after(ms(5))) -> _ => 1,
            };
            assert_eq!(got, 1);
            flag.store(true, Ordering::Release);
            assert!(spinner.join().unwrap());
        })
    })
}

#[test]
fn shutdown_with_a_fiber_that_never_yields_is_bounded() {
    // spec/reliability.md: a worker still running a fiber that never yields
    // is reported and left running; the drop returns.
    static RELEASE: AtomicBool = AtomicBool::new(false);
    let spins = Arc::new(AtomicUsize::new(0));
    let s = spins.clone();
    within(30, move || {
        let rt = rt_fixed_grace(2, ms(100));
        rt.spawn(move || {
            s.fetch_add(1, Ordering::SeqCst);
            // Never reaches a yield point; ends only after the test.
            spin_until(&RELEASE, Duration::from_secs(25));
        });
        while spins.load(Ordering::SeqCst) == 0 {
            std::thread::sleep(ms(1));
        }
        let start = Instant::now();
        drop(rt);
        let took = start.elapsed();
        RELEASE.store(true, Ordering::Release);
        assert!(took < Duration::from_secs(15), "shutdown waited {took:?} for a spinner");
    })
}

#[test]
fn shutdown_ends_a_spinner_that_polls_is_cancelled() {
    let ended = Arc::new(AtomicBool::new(false));
    let e = ended.clone();
    within(30, move || {
        let rt = fiber::Runtime::builder().workers(1).max_workers(1).build().unwrap();
        let (tx, rx) = mpsc::channel();
        rt.spawn(move || {
            tx.send(()).unwrap();
            let start = Instant::now();
            while !fiber::is_cancelled() && start.elapsed() < Duration::from_secs(20) {
                std::hint::spin_loop();
            }
            e.store(fiber::is_cancelled(), Ordering::SeqCst);
        });
        rx.recv().unwrap();
        drop(rt);
    });
    assert!(ended.load(Ordering::SeqCst), "the spinner saw shutdown's cancellation");
}

#[test]
fn a_yield_only_loop_is_cancelled_by_with_timeout_and_others_progress() {
    within(30, || {
        let rt = fiber::Runtime::builder().workers(1).max_workers(1).build().unwrap();
        rt.block_on(|| {
            let progressed = Arc::new(AtomicUsize::new(0));
            let p = progressed.clone();
            let other = fiber::spawn(move || {
                for _ in 0..10 {
                    p.fetch_add(1, Ordering::SeqCst);
                    let _ = fiber::yield_now();
                }
            });
            let r = fiber::with_timeout(ms(20), || loop {
                if fiber::yield_now().is_err() {
                    break;
                }
            });
            assert!(r.is_err());
            other.join().unwrap();
            assert_eq!(progressed.load(Ordering::SeqCst), 10);
        })
    })
}
