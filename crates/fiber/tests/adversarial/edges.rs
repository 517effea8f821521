//! Adversarial: edge inputs and self-referential misuse. Each either works
//! as the peer API documents or fails with a clear error or panic; never a
//! hang, an abort or a silent wrong answer.

use fiber::chan;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use crate::common::{in_child, ms, panic_message, rt, within};

#[test]
fn a_select_never_pairs_its_own_send_with_its_own_recv() {
    // Go: `select { case ch <- 1: case <-ch: }` on an unbuffered channel
    // with nobody else blocks; crossbeam likewise. With a timeout: timeout.
    within(20, || {
        let check = || {
            let (tx, rx) = chan::bounded::<u8>(0);
            let r = fiber::select! {
                send(tx, 1) -> _ => "send",
                recv(rx) -> _ => "recv",
                default(ms(20)) => "timeout",
            };
            assert_eq!(r, "timeout", "a select completed a rendezvous with itself");
            assert!(rx.try_recv().is_err());
        };
        check();
        rt().block_on(check);
    })
}

#[test]
fn tick_and_after_of_zero_fire_at_once_and_never_spin_forever() {
    within(20, || {
        let check = || {
            let a = chan::after(Duration::ZERO);
            assert!(a.recv_timeout(Duration::from_secs(5)).is_ok());
            let t = chan::tick(Duration::ZERO);
            for _ in 0..100 {
                assert!(
                    t.recv_timeout(Duration::from_secs(5)).is_ok(),
                    "tick(0) keeps delivering"
                );
            }
            let got = fiber::select! {
                recv(t) -> v => v.is_ok(),
                default(Duration::from_secs(5)) => false,
            };
            assert!(got);
        };
        check();
        rt().block_on(check);
    })
}

#[test]
fn a_cloned_after_receiver_delivers_its_one_instant_once() {
    within(20, || {
        rt().block_on(|| {
            let a = chan::after(ms(5));
            let got = Arc::new(AtomicUsize::new(0));
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    let (a, got) = (a.clone(), got.clone());
                    fiber::spawn(move || {
                        if a.recv_timeout(ms(50)).is_ok() {
                            got.fetch_add(1, Ordering::SeqCst);
                        }
                    })
                })
                .collect();
            for h in hs {
                h.join().unwrap();
            }
            assert_eq!(
                got.load(Ordering::SeqCst),
                1,
                "exactly one message is sent (crossbeam after)"
            );
        })
    })
}

#[test]
fn unpark_before_park_makes_park_return_at_once() {
    // std::thread::park: a token made available earlier is consumed.
    within(20, || {
        rt().block_on(|| {
            fiber::current().unpark();
            fiber::park(); // must not block
            let h = fiber::spawn(|| {
                fiber::current().unpark();
                fiber::park();
                fiber::park_timeout(ms(5)); // token consumed: times out
                true
            });
            assert!(h.join().unwrap());
        })
    })
}

#[test]
fn a_fiber_joining_its_own_handle_panics_naming_the_misuse() {
    // std::thread: joining the current thread's own handle panics
    // ("Resource deadlock avoided"); it could only wait forever.
    within(20, || {
        rt().block_on(|| {
            let (tx, rx) = chan::bounded::<fiber::JoinHandle<()>>(1);
            let (report_tx, report_rx) = chan::bounded::<String>(1);
            let me = fiber::spawn(move || {
                let own = rx.recv().unwrap();
                let msg = panic_message(|| {
                    let r = own.join();
                    let _ = report_tx.send(format!("returned {r:?}"));
                });
                if let Some(msg) = msg {
                    let _ = report_tx.send(format!("panicked: {msg}"));
                }
            });
            let canceller = me.canceller();
            tx.send(me).unwrap();
            let report = match report_rx.recv_timeout(Duration::from_secs(2)) {
                Ok(r) => r,
                Err(_) => {
                    canceller.cancel();
                    let r = report_rx.recv_timeout(Duration::from_secs(10));
                    panic!("a self-join blocked (until cancelled: {r:?})");
                }
            };
            assert!(report.starts_with("panicked") && report.contains("join"), "{report}");
        })
    })
}

#[test]
fn a_scoped_child_joining_its_own_handle_panics_naming_the_misuse() {
    within(20, || {
        rt().block_on(|| {
            let (report_tx, report_rx) = chan::bounded::<Option<String>>(1);
            fiber::scope(|s| {
                let (tx, rx) = chan::bounded(1);
                let child = s.spawn(move || {
                    let own: fiber::ScopedJoinHandle<'_, ()> = rx.recv().unwrap();
                    let msg = panic_message(move || {
                        let _ = own.join();
                    });
                    report_tx.send(msg).unwrap();
                });
                tx.send(child).unwrap();
                match report_rx.recv_timeout(Duration::from_secs(2)) {
                    Ok(msg) => {
                        let msg = msg.expect("a self-join must panic");
                        assert!(msg.contains("join"), "{msg}");
                    }
                    Err(_) => {
                        s.job().cancel();
                        panic!("a scoped self-join blocked");
                    }
                }
            });
        })
    })
}

#[test]
fn a_plain_thread_in_handle_block_on_returns_when_the_runtime_is_dropped() {
    within(30, || {
        let rt = rt();
        let handle = rt.handle();
        let (started_tx, started_rx) = mpsc::channel();
        let t = std::thread::spawn(move || {
            std::panic::catch_unwind(AssertUnwindSafe(|| {
                handle.block_on(|| {
                    started_tx.send(()).unwrap();
                    fiber::sleep(Duration::MAX).is_err()
                })
            }))
        });
        started_rx.recv().unwrap();
        drop(rt);
        // Either the sleep returned Cancelled (true) or block_on panicked
        // (the root was unwound); it must return.
        if let Ok(cancelled) = t.join().unwrap() {
            assert!(cancelled);
        }
    })
}

#[test]
fn a_thread_joining_a_fiber_sees_cancelled_when_the_runtime_is_dropped() {
    within(30, || {
        let rt = rt();
        let h = rt.spawn(|| {
            let _ = fiber::sleep(Duration::MAX);
            5
        });
        let t = std::thread::spawn(move || h.join());
        std::thread::sleep(ms(20));
        drop(rt);
        let r = t.join().unwrap();
        assert!(
            r.unwrap_err().is_cancelled(),
            "shutdown cancelled the fiber before it returned"
        );
    })
}

#[test]
fn block_on_from_many_threads_at_once_on_one_runtime() {
    within(30, || {
        let rt = Arc::new(rt());
        let threads: Vec<_> = (0..8u64)
            .map(|i| {
                let rt = rt.clone();
                std::thread::spawn(move || {
                    rt.block_on(move || {
                        fiber::sleep(ms(2)).unwrap();
                        fiber::spawn(move || i * 2).join().unwrap()
                    })
                })
            })
            .collect();
        let sum: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(sum, 56);
    })
}

#[test]
fn absurd_stack_sizes_are_errors_not_panics() {
    within(20, || {
        rt().block_on(|| {
            for size in [usize::MAX, usize::MAX / 2, (1 << 30) + 1] {
                let err = fiber::Builder::new().stack_size(size).spawn(|| ()).unwrap_err();
                assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput, "stack_size({size})");
            }
            // Zero and tiny sizes: the pool's stack is enough.
            for size in [0, 1, 4096] {
                let h = fiber::Builder::new().stack_size(size).spawn(|| 3).unwrap();
                assert_eq!(h.join().unwrap(), 3);
            }
        });
        for size in [usize::MAX, 0] {
            let r = fiber::Runtime::builder().stack_size(size).build();
            let err = r
                .err()
                .unwrap_or_else(|| panic!("runtime stack_size({size}) must be refused"));
            assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
        }
    })
}

#[test]
fn a_huge_bounded_capacity_panics_with_a_message_or_works_lazily() {
    // crossbeam allocates the whole buffer up front; a capacity that cannot
    // be allocated must be a panic naming the problem (or, if the buffer is
    // allocated lazily, a working channel), never an abort.
    in_child(
        "a_huge_bounded_capacity_panics_with_a_message_or_works_lazily",
        30,
        || {
            for cap in [usize::MAX, usize::MAX / 2, 1 << 60] {
                match panic_message(|| {
                    let (tx, rx) = chan::bounded::<u64>(cap);
                    tx.send(1).unwrap();
                    assert_eq!(rx.recv(), Ok(1));
                }) {
                    None => {}
                    Some(msg) => assert!(!msg.is_empty(), "bounded({cap}) panicked without a message"),
                }
            }
        },
    );
}

#[test]
fn barrier_of_zero_or_one_never_blocks() {
    // std: Barrier::new(0) and new(1) let every wait through as leader.
    within(20, || {
        rt().block_on(|| {
            for n in [0, 1] {
                let b = fiber::sync::Barrier::new(n);
                for _ in 0..3 {
                    assert!(b.wait().is_leader());
                }
            }
        })
    })
}

#[test]
fn a_semaphore_acquire_many_beyond_the_permits_waits_and_is_cancellable() {
    within(20, || {
        rt().block_on(|| {
            let sem = Arc::new(fiber::sync::Semaphore::new(2));
            let s = sem.clone();
            let h = fiber::spawn(move || s.acquire_many(3).map(drop).is_err());
            fiber::sleep(ms(10)).unwrap();
            assert!(!h.is_finished(), "3 of 2 permits cannot be acquired");
            h.cancel();
            let _ = h.join();
            assert_eq!(
                sem.available_permits(),
                2,
                "a cancelled acquire gives nothing back twice, takes nothing"
            );
            let p = sem.acquire_many(0).unwrap();
            drop(p);
            assert_eq!(sem.available_permits(), 2);
        })
    })
}

#[test]
fn spawning_from_inside_fiber_blocking_works_or_names_the_misuse() {
    within(20, || {
        rt().block_on(|| {
            let r = fiber::blocking(|| {
                // A blocking-pool thread is a plain thread: a Handle still works.
                let handle = fiber::Handle::try_current();
                let via_handle = handle.map(|h| h.spawn(|| 1).join().unwrap());
                let direct = panic_message(|| drop(fiber::spawn(|| ())));
                (via_handle, direct)
            });
            if let Some(msg) = r.1 {
                assert!(msg.contains("spawn"), "{msg}");
            }
            if let Some(v) = r.0 {
                assert_eq!(v, 1);
            }
        })
    })
}

#[test]
fn completing_a_selected_operation_with_the_wrong_handle_panics_and_frees_the_reservation() {
    // crossbeam: passing another receiver/sender than the selected one
    // panics. Here the select already reserved a buffer slot (send) or took
    // a value (recv): the panic must not leak the slot or confuse types.
    within(20, || {
        let check = || {
            let (tx1, rx1) = chan::bounded::<u8>(1);
            let (tx2, _rx2) = chan::bounded::<u8>(1);
            let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
                let mut sel = chan::Select::new();
                sel.send(&tx1);
                let op = sel.select();
                let _ = op.send(&tx2, 5);
            }));
            let msg = r.expect_err("a wrong sender must panic");
            let msg = msg
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| msg.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            assert!(msg.contains("sender"), "{msg}");
            assert_eq!(tx1.try_send(6), Ok(()), "the reserved slot was given back");
            assert_eq!(rx1.try_recv(), Ok(6));
            // A receive completed with a receiver of another element type.
            let (tx3, rx3) = chan::bounded::<u64>(1);
            let (_tx4, rx4) = chan::bounded::<String>(1);
            tx3.send(u64::MAX).unwrap();
            let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
                let mut sel = chan::Select::new();
                sel.recv(&rx3);
                let op = sel.select();
                let _ = op.recv(&rx4);
            }));
            assert!(r.is_err(), "a wrong receiver must panic, never read a u64 as a String");
            assert_eq!(tx3.try_send(1), Ok(()), "the channel still works");
            assert_eq!(rx3.try_recv(), Ok(1));
        };
        check();
        rt().block_on(check);
    })
}

#[test]
fn a_thread_name_with_a_nul_byte_is_a_build_error_not_a_panic() {
    // README: build() returns an InvalidInput error naming a bad setting.
    within(20, || {
        let r = std::panic::catch_unwind(|| fiber::Runtime::builder().workers(1).thread_name("bad\0name").build());
        let r = r.unwrap_or_else(|_| panic!("build() panicked on a NUL in thread_name instead of returning an error"));
        match r {
            Err(e) => {
                assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
                assert!(e.to_string().contains("thread_name"), "names the setting: {e}");
            }
            Ok(rt) => drop(rt),
        }
    })
}
