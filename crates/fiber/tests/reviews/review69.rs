//! Review 69: the four newest changes. The aging of a long local deque
//! (`age_out_local`: fairness at the bottom of a deque just under and just
//! over its 1,024-fiber threshold, pinned fibers never leaving their
//! worker, no fiber lost or run twice); a select that parked until its
//! deadline no longer yields a second time (a poll loop that never parks
//! still yields; `default(d)`, an empty `Select` under a deadline, 1 ns);
//! standalone jobs sweeping their ended children as they end (thousands
//! of children, `children()`, `cancel_children`, drop counters); and the
//! idle stacks unmapped at shutdown (a `Handle` kept after its runtime,
//! spawns through it refused, `JoinHandle`s kept, several runtimes).

use crate::common::*;

use fiber::chan::{bounded, Select};
use fiber::Job;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------
// 1. Aging of a long local deque: fairness at the bottom of the deque.

/// Spin (without yielding) for `d`.
fn busy(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// One link of a chain of fibers: runs 200 us, then spawns the next link
/// (onto this worker) and ends, until `stop`; `alive` counts the chains.
fn chain(stop: Arc<AtomicBool>, alive: Arc<AtomicUsize>) {
    busy(Duration::from_micros(200));
    if stop.load(SeqCst) {
        alive.fetch_sub(1, SeqCst);
    } else {
        drop(fiber::spawn(move || chain(stop, alive)));
    }
}

/// On `workers` fixed workers kept saturated by 20 chains per worker
/// (each link spawns the next: new work keeps landing on top of the local
/// deque), a fiber spawns `victims` fibers at once onto its worker's local
/// deque: the worst wait of a victim until it first runs (capped at `cap`;
/// a victim that never ran by then counts as `cap`).
fn worst_wait_at_the_bottom(workers: usize, victims: usize, cap: Duration) -> Duration {
    let rt = rt_fixed_grace(workers, ms(1000));
    rt.block_on(move || {
        let stop = Arc::new(AtomicBool::new(false));
        let alive = Arc::new(AtomicUsize::new(20 * workers));
        for _ in 0..20 * workers {
            let (stop, alive) = (stop.clone(), alive.clone());
            drop(fiber::spawn(move || chain(stop, alive)));
        }
        // Let the chains spread and saturate the workers.
        fiber::sleep(ms(50)).unwrap();
        let done = Arc::new(AtomicUsize::new(0));
        let worst = Arc::new(AtomicU64::new(0));
        let spawned = Instant::now();
        let vs: Vec<_> = (0..victims)
            .map(|_| {
                let (done, worst) = (done.clone(), worst.clone());
                fiber::spawn(move || {
                    worst.fetch_max(spawned.elapsed().as_micros() as u64, SeqCst);
                    done.fetch_add(1, SeqCst);
                })
            })
            .collect();
        while done.load(SeqCst) < victims && spawned.elapsed() < cap {
            let _ = fiber::sleep(ms(5));
        }
        let all_ran = done.load(SeqCst) == victims;
        stop.store(true, SeqCst);
        for v in vs {
            v.join().unwrap();
        }
        assert_eq!(done.load(SeqCst), victims, "a victim was lost");
        while alive.load(SeqCst) > 0 {
            let _ = fiber::sleep(ms(1));
        }
        if all_ran {
            Duration::from_micros(worst.load(SeqCst))
        } else {
            cap
        }
    })
}

/// Just over the threshold the older half of the deque is moved to the
/// global queue and runs within a few passes.
#[test]
fn the_bottom_of_a_deque_just_over_the_threshold_runs_soon() {
    for workers in [1, 2] {
        let worst = within(60, move || {
            worst_wait_at_the_bottom(workers, 1_200 * workers, ms(8_000))
        });
        eprintln!("r69 fairness: {workers} worker(s), 1,200 victims per worker: worst wait {worst:?}");
        assert!(
            worst < ms(5_000),
            "{workers} worker(s): a fiber at the bottom of a deque of 1,200 waited {worst:?}"
        );
    }
}

/// Just under it, the bottom of the deque was served only one fiber per
/// timed look (10 ms) or per 976 counted looks until `AGE_OUT_SMALL`: on
/// one worker the last of 950 fibers waited over 6 s behind the chains,
/// where 1,200 (over `AGE_OUT_MIN`) all ran within about 0.5 s. (Two
/// workers: 0.9-5.5 s.)
// Failed before the fix: 950 fibers spawned onto a saturated worker's deque (under AGE_OUT_MIN = 1,024) are not all run after 6 s (1 worker), where 1,200 run within ~0.5 s
// (About 1.2 s with the fix on the 2-core VM, over 6 s before it; the
// bound, 5 s, leaves room for a loaded run.)
#[test]
fn the_bottom_of_a_deque_just_under_the_threshold_does_not_starve() {
    let worst = within(60, || worst_wait_at_the_bottom(1, 950, ms(6_000)));
    eprintln!("r69 fairness: 1 worker, 950 victims: worst wait {worst:?}");
    assert!(
        worst < ms(5_000),
        "a fiber at the bottom of a deque of 950 waited {worst:?}"
    );
}

/// Pinned fibers woken by their timers into a long, aged-out deque
/// (3,000 sleepers over two saturated workers) run only on the worker of
/// their first run; every fiber ends exactly once.
#[test]
fn aging_out_keeps_pinned_fibers_on_their_worker_and_loses_none() {
    within(60, || {
        rt_fixed_grace(2, ms(500)).block_on(|| {
            let stop = Arc::new(AtomicBool::new(false));
            let ends = Arc::new((0..3_000).map(|_| AtomicUsize::new(0)).collect::<Vec<_>>());
            let wrong = Arc::new(AtomicUsize::new(0));
            let hogs: Vec<_> = (0..20)
                .map(|_| {
                    let stop = stop.clone();
                    fiber::spawn(move || {
                        while !stop.load(SeqCst) {
                            busy(Duration::from_micros(200));
                            if fiber::sleep(ms(1)).is_err() {
                                break;
                            }
                        }
                    })
                })
                .collect();
            let mut hs = Vec::new();
            for i in 0..3_000 {
                let (ends, wrong) = (ends.clone(), wrong.clone());
                let pinned = i % 3 == 0;
                let body = move || {
                    let home = fiber::core::current_worker();
                    for _ in 0..5 {
                        fiber::sleep(ms(1)).unwrap();
                        if pinned && fiber::core::current_worker() != home {
                            wrong.fetch_add(1, SeqCst);
                        }
                    }
                    ends[i].fetch_add(1, SeqCst);
                };
                hs.push(fiber::Builder::new().pinned(pinned).spawn(body).unwrap());
            }
            for h in hs {
                h.join().unwrap();
            }
            stop.store(true, SeqCst);
            for h in hogs {
                h.join().unwrap();
            }
            assert_eq!(wrong.load(SeqCst), 0, "a pinned fiber ran off its worker");
            for (i, r) in ends.iter().enumerate() {
                assert_eq!(r.load(SeqCst), 1, "fiber {i} ended {} times", r.load(SeqCst));
            }
        });
    });
}

// ---------------------------------------------------------------------------
// 2. Select: no second yield after a park; still a yield point when it
// never parks.

#[test]
fn a_zero_timeout_select_poll_loop_still_lets_others_run_one_worker() {
    poller_lets_others_run(|| {
        let (_tx, rx) = bounded::<u8>(1);
        let mut sel = Select::new();
        sel.recv(&rx);
        assert!(sel.select_timeout(Duration::ZERO).is_err());
    });
    poller_lets_others_run(|| {
        let (_tx, rx) = bounded::<u8>(1);
        fiber::select! {
            recv(rx) -> _ => panic!("nothing was sent"),
            default(Duration::from_nanos(1)) => {},
        }
    });
    poller_lets_others_run(|| {
        fiber::select! {
            default(Duration::ZERO) => {},
        }
    });
    poller_lets_others_run(|| {
        let (_tx, rx) = bounded::<u8>(1);
        let mut sel = Select::new();
        let i = sel.recv(&rx);
        sel.remove(i);
        assert!(sel.select_timeout(Duration::from_nanos(1)).is_err());
    });
}

/// A select with only `default(d)` and a `Select` with every operation
/// removed under a deadline wait their time, never return early, and a
/// loop of them beside a yielder on one worker lets the yielder run.
#[test]
fn defaults_alone_and_emptied_selects_wait_their_time_one_worker() {
    within(30, || {
        rt1().block_on(|| {
            let stop = Arc::new(AtomicBool::new(false));
            let turns = Arc::new(AtomicU64::new(0));
            let (s, t) = (stop.clone(), turns.clone());
            let yielder = fiber::spawn(move || {
                while !s.load(SeqCst) {
                    t.fetch_add(1, SeqCst);
                    fiber::yield_now().unwrap();
                }
            });
            for round in 0..40 {
                let d = Duration::from_micros(500 + 100 * round);
                let start = Instant::now();
                if round % 2 == 0 {
                    fiber::select! {
                        default(d) => {},
                    }
                } else {
                    let (_tx, rx) = bounded::<u8>(0);
                    let mut sel = Select::new();
                    let i = sel.recv(&rx);
                    sel.remove(i);
                    assert!(sel.select_deadline(start + d).is_err());
                }
                assert!(start.elapsed() >= d, "round {round}: returned early");
            }
            stop.store(true, SeqCst);
            yielder.join().unwrap();
            assert!(turns.load(SeqCst) > 0);
        });
    });
}

/// A select woken just before its deadline by a value another receiver
/// takes first (a stale probe): it either gets a later value or times out,
/// never early, never losing a value.
#[test]
fn a_select_woken_by_a_stale_probe_near_its_deadline_loses_nothing() {
    within(30, || {
        rt2().block_on(|| {
            let (tx, rx) = bounded::<u32>(0);
            let got = Arc::new(AtomicUsize::new(0));
            let thieves: Vec<_> = (0..2)
                .map(|_| {
                    let (rx, got) = (rx.clone(), got.clone());
                    fiber::spawn(move || {
                        while rx.recv().is_ok() {
                            got.fetch_add(1, SeqCst);
                        }
                    })
                })
                .collect();
            let selector = {
                let (rx, got) = (rx.clone(), got.clone());
                fiber::spawn(move || {
                    for _ in 0..200 {
                        let d = Duration::from_micros(300);
                        let start = Instant::now();
                        fiber::select! {
                            recv(rx) -> v => if v.is_ok() { got.fetch_add(1, SeqCst); },
                            default(d) => assert!(start.elapsed() >= d, "select returned early"),
                        }
                    }
                })
            };
            let mut sent = 0;
            while !selector.is_finished() {
                tx.send(1).unwrap();
                sent += 1;
                let _ = fiber::sleep(Duration::from_micros(250));
            }
            selector.join().unwrap();
            drop(tx);
            drop(rx);
            for t in thieves {
                t.join().unwrap();
            }
            assert_eq!(got.load(SeqCst), sent, "a value was lost");
        });
    });
}

// ---------------------------------------------------------------------------
// 3. Standalone jobs sweeping their ended children.

struct DropCount(Arc<AtomicUsize>);
impl Drop for DropCount {
    fn drop(&mut self) {
        self.0.fetch_add(1, SeqCst);
    }
}

/// Thousands of children of a standalone job ending on both workers
/// while the parent is dropped uncompleted, a handler on it, each child
/// carrying a drop counter; then a job whose children are cancelled and
/// one completed while its children end: every value and handler dropped,
/// every handler of a completed job run.
#[test]
fn standalone_jobs_with_thousands_of_children_racing_their_drop_free_everything() {
    on_runtime(|| {
        let drops = Arc::new(AtomicUsize::new(0));
        let handlers = Arc::new(AtomicUsize::new(0));
        let ran = Arc::new(AtomicUsize::new(0));
        for round in 0..20 {
            let job = if round % 2 == 0 {
                Job::new(None)
            } else {
                Job::new_supervisor(None)
            };
            let d = DropCount(handlers.clone());
            let r = ran.clone();
            job.invoke_on_completion(move |_| {
                let _d = d;
                r.fetch_add(1, SeqCst);
            });
            for i in 0..200 {
                let d = DropCount(drops.clone());
                let _ = job.spawn(move || {
                    if i % 4 == 0 {
                        fiber::yield_now().unwrap();
                    }
                    drop(d);
                });
            }
            match round % 4 {
                0 => drop(job),
                1 => {
                    job.cancel_children();
                    drop(job);
                }
                _ => {
                    job.complete();
                    drop(job);
                }
            }
        }
        wait_until("every child's value dropped", 20, || drops.load(SeqCst) == 20 * 200);
        wait_until("every handler dropped", 20, || handlers.load(SeqCst) == 20);
        assert_eq!(ran.load(SeqCst), 10, "the completed jobs' handlers ran");
    });
}

// ---------------------------------------------------------------------------
// 4. Idle stacks released at shutdown.

/// A `Handle` kept after its runtime: spawns through it are refused (no
/// hang, no crash), a `JoinHandle` kept still gives its value, and a second
/// runtime alive meanwhile keeps running.
#[test]
fn a_handle_kept_after_its_runtime_refuses_spawns_cleanly() {
    within(30, || {
        let other = rt2();
        let keep = other.spawn(|| {
            let (tx, rx) = bounded::<u8>(0);
            let h = fiber::spawn(move || rx.recv().unwrap());
            tx.send(5).unwrap();
            h.join().unwrap()
        });
        let rt = rt2();
        let handle = rt.handle();
        let jh = rt.spawn(|| 42u32);
        assert_eq!(rt.block_on(|| 1), 1);
        // Joined before the drop: on a loaded machine the fiber may not
        // have started by then, and the drop cancels a fiber that never
        // ran (a gate run failed on the join's `unwrap`).
        assert_eq!(jh.join().unwrap(), 42);
        drop(rt);
        assert!(
            handle.try_spawn(|| 0u8).is_err(),
            "a spawn through a dead runtime's handle was taken"
        );
        assert_eq!(keep.join().unwrap(), 5);
        assert_eq!(other.block_on(|| fiber::spawn(|| 7).join().unwrap()), 7);
    });
}

/// A runtime dropped on a worker thread of another runtime (inside one of
/// its blocking calls), several times, beside a fiber of the first one.
#[test]
fn runtimes_dropped_inside_another_runtimes_blocking_calls() {
    within(30, || {
        let outer = rt2();
        outer.block_on(|| {
            for _ in 0..5 {
                let inner = rt1();
                let h = inner.spawn(|| (0..100).map(|i| fiber::spawn(move || i).join().unwrap()).sum::<u32>());
                assert_eq!(h.join().unwrap(), 4950);
                fiber::blocking(move || drop(inner));
            }
        });
    });
}
