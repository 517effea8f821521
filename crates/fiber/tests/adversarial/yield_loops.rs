//! Adversarial: fibers that yield in a loop. `yield_now` is a yield point:
//! a fiber that loops on it must not keep out fibers woken or spawned from
//! outside its worker (a channel send or `unpark` from a plain thread, a
//! `Handle::spawn`), nor timers, on one fixed worker, two, or an elastic
//! pool (Go's `Gosched` puts the goroutine behind the global run queue;
//! tokio's `yield_now` defers the task behind the others).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{ms, rt1, rt_fixed_grace, within};

#[test]
fn a_yield_loop_on_one_fixed_worker_lets_timers_fire() {
    within(20, || {
        rt1().block_on(|| {
            let stop = Arc::new(AtomicBool::new(false));
            let s2 = stop.clone();
            let spinner = fiber::spawn(move || {
                let mut n = 0u64;
                while !s2.load(Ordering::SeqCst) {
                    let _ = fiber::yield_now();
                    n += 1;
                }
                n
            });
            let t = Instant::now();
            fiber::sleep(ms(20)).unwrap();
            let late = t.elapsed();
            stop.store(true, Ordering::SeqCst);
            spinner.join().unwrap();
            assert!(late < ms(500), "a 20 ms sleep took {late:?} next to a yield loop");
        })
    })
}

#[test]
fn a_yield_loop_on_one_fixed_worker_lets_external_wakes_in() {
    within(20, || {
        rt1().block_on(|| {
            let stop = Arc::new(AtomicBool::new(false));
            let s2 = stop.clone();
            let spinner = fiber::spawn(move || {
                // bounded, so a starved waiter shows up as latency, not a hang
                let t = Instant::now();
                while !s2.load(Ordering::SeqCst) && t.elapsed() < Duration::from_secs(3) {
                    let _ = fiber::yield_now();
                }
            });
            let (tx, rx) = fiber::chan::bounded(0);
            let t = std::thread::spawn(move || {
                std::thread::sleep(ms(20));
                tx.send(1).unwrap();
            });
            let start = Instant::now();
            assert_eq!(rx.recv().unwrap(), 1);
            let late = start.elapsed();
            stop.store(true, Ordering::SeqCst);
            spinner.join().unwrap();
            t.join().unwrap();
            assert!(late < ms(500), "recv took {late:?}");
        })
    })
}

#[test]
fn with_timeout_around_a_yield_loop_on_one_fixed_worker() {
    within(20, || {
        rt1().block_on(|| {
            let t = Instant::now();
            let r = fiber::with_timeout(ms(30), || loop {
                if fiber::yield_now().is_err() {
                    break 1;
                }
            });
            assert_eq!(r, Err(fiber::TimedOut));
            assert!(t.elapsed() < ms(1000), "{:?}", t.elapsed());
        })
    })
}

#[test]
fn a_yield_loop_on_one_fixed_worker_lets_a_thread_unpark_in() {
    within(20, || {
        rt1().block_on(|| {
            let stop = Arc::new(AtomicBool::new(false));
            let s2 = stop.clone();
            let spinner = fiber::spawn(move || {
                // bounded, so a starved waiter shows up as latency, not a hang
                let t = Instant::now();
                while !s2.load(Ordering::SeqCst) && t.elapsed() < Duration::from_secs(3) {
                    let _ = fiber::yield_now();
                }
            });
            let me = fiber::current();
            let flag = Arc::new(AtomicBool::new(false));
            let f2 = flag.clone();
            let t = std::thread::spawn(move || {
                std::thread::sleep(ms(20));
                f2.store(true, Ordering::SeqCst);
                me.unpark();
            });
            let start = Instant::now();
            while !flag.load(Ordering::SeqCst) {
                fiber::park();
            }
            let late = start.elapsed();
            stop.store(true, Ordering::SeqCst);
            spinner.join().unwrap();
            t.join().unwrap();
            assert!(late < ms(500), "park took {late:?}");
        })
    })
}

#[test]
fn a_yield_loop_on_one_fixed_worker_lets_an_unbounded_recv_in() {
    within(20, || {
        rt1().block_on(|| {
            let stop = Arc::new(AtomicBool::new(false));
            let s2 = stop.clone();
            let spinner = fiber::spawn(move || {
                // bounded, so a starved waiter shows up as latency, not a hang
                let t = Instant::now();
                while !s2.load(Ordering::SeqCst) && t.elapsed() < Duration::from_secs(3) {
                    let _ = fiber::yield_now();
                }
            });
            let (tx, rx) = fiber::chan::unbounded();
            let t = std::thread::spawn(move || {
                std::thread::sleep(ms(20));
                tx.send(1).unwrap();
            });
            let start = Instant::now();
            assert_eq!(rx.recv().unwrap(), 1);
            let late = start.elapsed();
            stop.store(true, Ordering::SeqCst);
            spinner.join().unwrap();
            t.join().unwrap();
            assert!(late < ms(500), "recv took {late:?}");
        })
    })
}

#[test]
fn a_yield_loop_on_one_fixed_worker_lets_a_handle_spawn_run() {
    within(20, || {
        let rt = rt1();
        let handle = rt.handle();
        rt.block_on(move || {
            let stop = Arc::new(AtomicBool::new(false));
            let s2 = stop.clone();
            let t = std::thread::spawn(move || {
                std::thread::sleep(ms(20));
                drop(handle.spawn(move || s2.store(true, Ordering::SeqCst)));
            });
            let start = Instant::now();
            while !stop.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(5) {
                let _ = fiber::yield_now();
            }
            t.join().unwrap();
            assert!(
                stop.load(Ordering::SeqCst),
                "a fiber spawned from outside never ran next to a yield loop"
            );
        })
    })
}

#[test]
fn yield_loops_on_two_fixed_workers_let_a_thread_wake_in() {
    within(20, || {
        let rt = rt_fixed_grace(2, ms(300));
        rt.block_on(|| {
            let stop = Arc::new(AtomicBool::new(false));
            let woke = Arc::new(AtomicBool::new(false));
            let mut spinners = Vec::new();
            for _ in 0..2 {
                let s2 = stop.clone();
                spinners.push(fiber::spawn(move || {
                    let t = Instant::now();
                    while !s2.load(Ordering::SeqCst) && t.elapsed() < Duration::from_secs(5) {
                        let _ = fiber::yield_now();
                    }
                }));
            }
            let (tx, rx) = fiber::chan::unbounded();
            let w2 = woke.clone();
            let s3 = stop.clone();
            let waiter = fiber::spawn(move || {
                rx.recv().unwrap();
                w2.store(true, Ordering::SeqCst);
                s3.store(true, Ordering::SeqCst);
            });
            fiber::sleep(ms(20)).unwrap();
            let t = std::thread::spawn(move || tx.send(()).unwrap());
            let start = Instant::now();
            for s in spinners {
                s.join().unwrap();
            }
            waiter.join().unwrap();
            t.join().unwrap();
            assert!(
                start.elapsed() < Duration::from_secs(2),
                "the woken fiber waited {:?} behind two yield loops",
                start.elapsed()
            );
        })
    })
}

#[test]
fn a_yield_loop_on_one_elastic_worker_lets_a_thread_wake_in() {
    within(20, || {
        let rt = fiber::Runtime::builder()
            .workers(1)
            .max_workers(4)
            .shutdown_timeout(ms(300))
            .build()
            .unwrap();
        rt.block_on(|| {
            let (tx, rx) = fiber::chan::unbounded();
            let t = std::thread::spawn(move || {
                std::thread::sleep(ms(20));
                tx.send(()).unwrap();
            });
            let got = Arc::new(AtomicBool::new(false));
            let g2 = got.clone();
            let waiter = fiber::spawn(move || {
                rx.recv().unwrap();
                g2.store(true, Ordering::SeqCst);
            });
            let start = Instant::now();
            while !got.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(5) {
                let _ = fiber::yield_now();
            }
            t.join().unwrap();
            let took = start.elapsed();
            assert!(got.load(Ordering::SeqCst), "woken fiber never ran in 5 s");
            waiter.join().unwrap();
            assert!(
                took < Duration::from_secs(2),
                "the woken fiber waited {took:?} behind a yield loop"
            );
        })
    })
}
