//! Barrier, OnceLock and WaitGroup from fibers, threads and both;
//! cancellation of Barrier::wait and WaitGroup::wait.

mod common;

use common::{everywhere, go, join_all, runtime, thread, until, within};
use fiber_sync::{Barrier, OnceLock, WaitGroup};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

const PARTIES: usize = 5;
const GENERATIONS: usize = 50;

/// Each generation releases all parties together (nobody runs ahead into
/// the next generation while another is still in this one) with exactly
/// one leader.
#[test]
fn barrier_generations_one_leader_each() {
    everywhere(|| {
        let barrier = Arc::new(Barrier::new(PARTIES));
        let arrived = Arc::new(AtomicUsize::new(0));
        let leaders = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..PARTIES)
            .map(|i| {
                let (barrier, arrived, leaders) = (barrier.clone(), arrived.clone(), leaders.clone());
                let work = move || {
                    for g in 0..GENERATIONS {
                        arrived.fetch_add(1, Ordering::SeqCst);
                        let r = barrier.wait();
                        assert!(!r.is_cancelled());
                        // Everyone of generation g arrived before anyone left.
                        assert!(arrived.load(Ordering::SeqCst) >= (g + 1) * PARTIES);
                        if r.is_leader() {
                            leaders.fetch_add(1, Ordering::SeqCst);
                        }
                        barrier.wait();
                    }
                };
                if i % 2 == 0 {
                    thread(work)
                } else {
                    go(work)
                }
            })
            .collect();
        join_all(handles);
        assert_eq!(leaders.load(Ordering::SeqCst), GENERATIONS);
        assert_eq!(barrier.generation(), 2 * GENERATIONS as u64);
    });
}

/// A cancelled fiber leaves the barrier and takes its arrival back: the
/// generation still needs a full set of live parties.
#[test]
fn barrier_wait_is_a_cancellation_point() {
    within(|| {
        runtime().block_on(|| {
            let barrier = Arc::new(Barrier::new(2));
            let cancelled = Arc::new(AtomicUsize::new(0));
            let quitter = {
                let (barrier, cancelled) = (barrier.clone(), cancelled.clone());
                fiber_core::spawn(move || {
                    if barrier.wait().is_cancelled() {
                        cancelled.store(1, Ordering::SeqCst);
                    }
                })
            };
            // Let it arrive and park, then cancel it.
            for _ in 0..100 {
                let _ = fiber_core::yield_now();
            }
            quitter.cancel();
            let _ = quitter.join();
            assert_eq!(cancelled.load(Ordering::SeqCst), 1);
            assert_eq!(barrier.generation(), 0);
            // Two live parties complete a generation.
            let other = {
                let barrier = barrier.clone();
                fiber_core::spawn(move || barrier.wait().is_leader())
            };
            let me = barrier.wait().is_leader();
            assert!(me ^ other.join().unwrap());
            assert_eq!(barrier.generation(), 1);
        })
    });
}

/// Concurrent `get_or_init` from fibers and threads: the initializer runs
/// once, the others park until it is done and all see its value.
#[test]
fn once_lock_initializer_runs_once() {
    everywhere(|| {
        let cell = Arc::new(OnceLock::new());
        let runs = Arc::new(AtomicUsize::new(0));
        let entered = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..6)
            .map(|i| {
                let (cell, runs, entered) = (cell.clone(), runs.clone(), entered.clone());
                let work = move || {
                    entered.fetch_add(1, Ordering::SeqCst);
                    *cell.get_or_init(|| {
                        runs.fetch_add(1, Ordering::SeqCst);
                        // Stay in the initializer until everybody has
                        // called get_or_init, so the others really wait.
                        until(|| entered.load(Ordering::SeqCst) == 6);
                        42u64
                    })
                };
                if i % 2 == 0 {
                    thread(work)
                } else {
                    go(work)
                }
            })
            .collect();
        assert_eq!(join_all(handles), [42; 6]);
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert_eq!(cell.get(), Some(&42));
    });
}

#[test]
fn once_lock_set_get_into_inner_and_panicking_init() {
    everywhere(|| {
        let cell = OnceLock::new();
        assert_eq!(cell.get(), None);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            cell.get_or_init(|| panic!("initializer fails"));
        }));
        assert!(r.is_err());
        assert_eq!(cell.get(), None, "a failed initializer leaves the cell empty");
        assert_eq!(cell.set(String::from("a")), Ok(()));
        assert_eq!(cell.set(String::from("b")), Err(String::from("b")));
        assert_eq!(cell.get_or_init(|| unreachable!()), "a");
        assert_eq!(cell.into_inner(), Some(String::from("a")));
        let empty: OnceLock<u8> = OnceLock::new();
        assert_eq!(empty.into_inner(), None);
    });
}

#[test]
fn waitgroup_waits_for_every_member() {
    everywhere(|| {
        let wg = WaitGroup::new();
        let done = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..20)
            .map(|i| {
                let (wg, done) = (wg.clone(), done.clone());
                let work = move || {
                    if fiber_core::in_fiber() {
                        let _ = fiber_core::yield_now();
                    }
                    done.fetch_add(1, Ordering::SeqCst);
                    drop(wg);
                };
                if i % 4 == 0 {
                    thread(work)
                } else {
                    go(work)
                }
            })
            .collect();
        wg.wait();
        assert_eq!(done.load(Ordering::SeqCst), 20);
        join_all(handles);
    });
}

#[test]
fn waitgroup_of_1000_fibers() {
    within(|| {
        runtime().block_on(|| {
            let wg = WaitGroup::new();
            let done = Arc::new(AtomicUsize::new(0));
            for _ in 0..1000 {
                let (wg, done) = (wg.clone(), done.clone());
                fiber_core::spawn(move || {
                    done.fetch_add(1, Ordering::SeqCst);
                    drop(wg);
                });
            }
            wg.wait();
            assert_eq!(done.load(Ordering::SeqCst), 1000);
        })
    });
}

#[test]
fn waitgroup_wait_is_a_cancellation_point() {
    within(|| {
        runtime().block_on(|| {
            let wg = WaitGroup::new();
            let member = wg.clone();
            let returned = Arc::new(AtomicUsize::new(0));
            let waiter = {
                let returned = returned.clone();
                fiber_core::spawn(move || {
                    wg.wait();
                    returned.store(1, Ordering::SeqCst);
                })
            };
            for _ in 0..100 {
                let _ = fiber_core::yield_now();
            }
            waiter.cancel();
            let _ = waiter.join();
            assert_eq!(returned.load(Ordering::SeqCst), 1, "a cancelled wait returns early");
            drop(member);
        })
    });
}
