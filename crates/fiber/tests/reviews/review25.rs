//! Review 25: user destructors in combinations: destructors that panic,
//! park, spawn or re-enter the runtime, run from a channel dropped with
//! values in it, a detached fiber's value, a fiber-local, a `try_scope`'s
//! error, a select's unsent value, or a fiber unwound at shutdown; with 1
//! and 2 workers, inside and outside `non_cancellable`.

use std::cell::RefCell;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{in_child, ms, rt_fixed_grace, stubborn_sleep, wait_parked, within};

/// A value that counts its drops.
struct Counted(Arc<AtomicUsize>);
impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, SeqCst);
    }
}

/// A value whose drop spawns a fiber capturing a `Counted` (and counts
/// itself once the spawn returned).
struct SpawnsOnDrop {
    dropped: Arc<AtomicUsize>,
    captured: Arc<AtomicUsize>,
    via_handle: bool,
}
impl Drop for SpawnsOnDrop {
    fn drop(&mut self) {
        let c = Counted(self.captured.clone());
        let h = if self.via_handle {
            fiber::Handle::current().spawn(move || drop(c))
        } else {
            fiber::spawn(move || drop(c))
        };
        drop(h);
        self.dropped.fetch_add(1, SeqCst);
    }
}

/// A value whose drop sleeps in `non_cancellable` (a timed clean-up, which
/// README says runs to its end at shutdown) and then counts.
struct SleepsOnDrop(Arc<AtomicUsize>, Duration);
impl Drop for SleepsOnDrop {
    fn drop(&mut self) {
        let d = self.1;
        let _ = fiber::non_cancellable(|| fiber::sleep(d));
        self.0.fetch_add(1, SeqCst);
    }
}

fn counter() -> Arc<AtomicUsize> {
    Arc::new(AtomicUsize::new(0))
}

// ---------------------------------------------------------------------
// try_scope: the body's own error whose Drop panics
// ---------------------------------------------------------------------

/// The error the body of a `try_scope` returns after a child already
/// failed: it is the second error, dropped by `try_scope`; its drop panics.
struct BodyErr(Arc<AtomicUsize>);
impl Drop for BodyErr {
    fn drop(&mut self) {
        self.0.fetch_add(1, SeqCst);
        panic!("the body's error panicked in drop");
    }
}

enum E {
    Plain,
    Body(#[allow(dead_code)] BodyErr),
}

/// spec/reliability.md: "a scope returns only after everything its children
/// own (closure, value, locals) has been dropped"; std::thread::scope joins
/// every thread before it returns or unwinds. Here a child fails first, then
/// the body returns its own error whose Drop panics: `try_scope` must still
/// wait for the sibling (busy in a `non_cancellable` clean-up) before the
/// panic leaves it.
// Failed before the fix: try_scope unwinds out of its frame before its children end when the body's second error panics in Drop
#[test]
fn try_scope_whose_body_error_panics_in_drop_still_waits_for_its_children() {
    in_child(
        "try_scope_whose_body_error_panics_in_drop_still_waits_for_its_children",
        20,
        || {
            within(10, || {
                let rt = rt_fixed_grace(2, ms(300));
                let (finished_before_return, panicked) = rt.block_on(|| {
                    let sibling_done = AtomicBool::new(false);
                    let err_drops = counter();
                    let (started_tx, started_rx) = fiber::chan::bounded::<()>(1);
                    let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
                        fiber::try_scope(|s| {
                            s.spawn(|| -> Result<(), E> {
                                fiber::non_cancellable(|| {
                                    started_tx.send(()).unwrap();
                                    let _ = fiber::sleep(ms(300));
                                });
                                sibling_done.store(true, SeqCst);
                                Ok(())
                            });
                            started_rx.recv().unwrap();
                            // The first error: fails the scope, cancels the body.
                            s.spawn(|| -> Result<(), E> { Err(E::Plain) });
                            let _ = fiber::sleep(Duration::from_secs(5));
                            Err::<(), E>(E::Body(BodyErr(err_drops.clone())))
                        })
                    }));
                    let finished = sibling_done.load(SeqCst);
                    assert_eq!(err_drops.load(SeqCst), 1);
                    // Keep the borrowed flag alive until the child is surely done.
                    let _ = fiber::non_cancellable(|| fiber::sleep(ms(400)));
                    (finished, r.is_err())
                });
                assert!(panicked, "the error's drop panic reaches the caller");
                assert!(
                    finished_before_return,
                    "try_scope returned (unwinding) while a child still ran"
                );
            })
        },
    );
}

/// A child's error that comes after the first is dropped by the child;
/// its panicking Drop neither aborts nor replaces the first error, and
/// the scope still waits for everyone.
#[test]
fn try_scope_a_later_childs_error_that_panics_in_drop_keeps_the_first_error() {
    in_child(
        "try_scope_a_later_childs_error_that_panics_in_drop_keeps_the_first_error",
        20,
        || {
            within(10, || {
                let rt = rt_fixed_grace(1, ms(300));
                let err_drops = counter();
                let e2 = err_drops.clone();
                let r = rt.block_on(move || {
                    let sibling_done = AtomicBool::new(false);
                    let r = fiber::try_scope(|s| {
                        s.spawn(|| -> Result<(), E> { Err(E::Plain) });
                        s.spawn(|| -> Result<(), E> {
                            let _ = fiber::sleep(Duration::from_secs(5));
                            Err(E::Body(BodyErr(e2)))
                        });
                        s.spawn(|| -> Result<(), E> {
                            let _ = fiber::sleep(Duration::from_secs(5));
                            let _ = fiber::non_cancellable(|| fiber::sleep(ms(100)));
                            sibling_done.store(true, SeqCst);
                            Ok(())
                        });
                        Ok(())
                    });
                    assert!(sibling_done.load(SeqCst));
                    matches!(r, Err(E::Plain))
                });
                assert!(r, "the first error wins");
                assert_eq!(err_drops.load(SeqCst), 1);
            })
        },
    );
}

// ---------------------------------------------------------------------
// values left in a channel, dropped by a fiber unwound at teardown,
// whose Drop spawns
// ---------------------------------------------------------------------

fn channel_values_that_spawn_at_teardown(workers: usize, via_handle: bool) {
    within(10, move || {
        let dropped = counter();
        let captured = counter();
        let rt = rt_fixed_grace(workers, ms(100));
        for _ in 0..2 {
            let (dropped, captured) = (dropped.clone(), captured.clone());
            rt.spawn(move || {
                let (tx, rx) = fiber::chan::bounded(4);
                for _ in 0..3 {
                    tx.send(SpawnsOnDrop {
                        dropped: dropped.clone(),
                        captured: captured.clone(),
                        via_handle,
                    })
                    .unwrap();
                }
                let _keep = (tx, rx);
                stubborn_sleep();
            });
        }
        wait_parked(&rt, 2);
        let start = Instant::now();
        drop(rt);
        assert!(
            start.elapsed() < Duration::from_secs(4),
            "shutdown took {:?}",
            start.elapsed()
        );
        assert_eq!(dropped.load(SeqCst), 6, "every value dropped once");
        assert_eq!(
            captured.load(SeqCst),
            6,
            "every spawned closure run or dropped unrun once"
        );
    })
}

/// README: at shutdown "fibers of the runtime may still spawn, and their
/// children are cancelled before they start (their closure is dropped on
/// their own stack)"; what is left after the grace time is unwound.
#[test]
fn channel_values_whose_drop_spawns_at_teardown_one_worker() {
    in_child("channel_values_whose_drop_spawns_at_teardown_one_worker", 20, || {
        channel_values_that_spawn_at_teardown(1, false)
    });
}

/// The same spawns through `Handle::current().spawn` from inside the
/// fiber being torn down (a fiber of the runtime spawning).
#[test]
fn channel_values_whose_drop_spawns_through_a_handle_at_teardown() {
    in_child(
        "channel_values_whose_drop_spawns_through_a_handle_at_teardown",
        20,
        || channel_values_that_spawn_at_teardown(2, true),
    );
}

// ---------------------------------------------------------------------
// a detached fiber's value whose Drop sleeps (non_cancellable) and spawns
// ---------------------------------------------------------------------

struct SleepsThenSpawns {
    slept: Arc<AtomicUsize>,
    captured: Arc<AtomicUsize>,
}
impl Drop for SleepsThenSpawns {
    fn drop(&mut self) {
        let _ = fiber::non_cancellable(|| fiber::sleep(ms(150)));
        self.slept.fetch_add(1, SeqCst);
        let c = Counted(self.captured.clone());
        drop(fiber::spawn(move || drop(c)));
    }
}

fn detached_value_sleeps_then_spawns(workers: usize) {
    within(10, move || {
        let slept = counter();
        let captured = counter();
        let rt = rt_fixed_grace(workers, Duration::from_secs(3));
        for _ in 0..3 {
            let (slept, captured) = (slept.clone(), captured.clone());
            drop(rt.spawn(move || {
                // Cancelled by the shutdown: the body then returns its value.
                let _ = fiber::sleep(Duration::from_secs(3600));
                SleepsThenSpawns { slept, captured }
            }));
        }
        wait_parked(&rt, 3);
        let start = Instant::now();
        drop(rt);
        let took = start.elapsed();
        assert_eq!(slept.load(SeqCst), 3, "each clean-up ran to its end");
        assert_eq!(captured.load(SeqCst), 3);
        assert!(took < Duration::from_secs(3), "shutdown took {took:?}");
    })
}

/// README: a detached fiber's value is dropped inside the fiber; clean-up
/// in `non_cancellable` that sleeps runs to its end at shutdown.
#[test]
fn a_detached_values_drop_that_sleeps_then_spawns_at_shutdown_one_worker() {
    in_child(
        "a_detached_values_drop_that_sleeps_then_spawns_at_shutdown_one_worker",
        20,
        || detached_value_sleeps_then_spawns(1),
    );
}

#[test]
fn a_detached_values_drop_that_sleeps_then_spawns_at_shutdown_two_workers() {
    in_child(
        "a_detached_values_drop_that_sleeps_then_spawns_at_shutdown_two_workers",
        20,
        || detached_value_sleeps_then_spawns(2),
    );
}

// ---------------------------------------------------------------------
// a runtime owned by a fiber-local / a captured value, dropped at the
// outer runtime's teardown
// ---------------------------------------------------------------------

fiber::fiber_local! {
    static INNER_RT: RefCell<Option<fiber::Runtime>> = const { RefCell::new(None) };
}

fn inner_runtime_with_a_parked_fiber(c: Arc<AtomicUsize>) -> fiber::Runtime {
    let inner = rt_fixed_grace(1, ms(100));
    let v = Counted(c);
    inner.spawn(move || {
        let _v = v;
        stubborn_sleep();
    });
    wait_parked(&inner, 1);
    inner
}

fn inner_runtime_dropped_at_outer_teardown(workers: usize, in_local: bool) {
    within(10, move || {
        let inner_drops = counter();
        let outer_drops = counter();
        let outer = rt_fixed_grace(workers, ms(100));
        let inner = inner_runtime_with_a_parked_fiber(inner_drops.clone());
        let o = Counted(outer_drops.clone());
        outer.spawn(move || {
            let _o = o;
            let _held = if in_local {
                INNER_RT.with(|l| *l.borrow_mut() = Some(inner));
                None
            } else {
                Some(inner)
            };
            stubborn_sleep();
        });
        wait_parked(&outer, 1);
        let start = Instant::now();
        drop(outer);
        let took = start.elapsed();
        assert_eq!(outer_drops.load(SeqCst), 1);
        assert_eq!(inner_drops.load(SeqCst), 1, "the inner runtime's fiber was unwound");
        assert!(took < Duration::from_secs(5), "shutdown took {took:?}");
    })
}

/// spec/reliability.md: a runtime dropped during another runtime's
/// teardown (on an unwinding thread) runs its own protocol on a thread of
/// its own: its fibers' destructors run.
#[test]
fn a_runtime_held_on_a_fiber_unwound_at_teardown_is_shut_down_one_worker() {
    in_child(
        "a_runtime_held_on_a_fiber_unwound_at_teardown_is_shut_down_one_worker",
        20,
        || inner_runtime_dropped_at_outer_teardown(1, false),
    );
}

#[test]
fn a_runtime_in_a_fiber_local_of_a_fiber_unwound_at_teardown_is_shut_down_two_workers() {
    in_child(
        "a_runtime_in_a_fiber_local_of_a_fiber_unwound_at_teardown_is_shut_down_two_workers",
        20,
        || inner_runtime_dropped_at_outer_teardown(2, true),
    );
}

// ---------------------------------------------------------------------
// a select's unsent value, in a loop that ignores cancellation
// ---------------------------------------------------------------------

/// Counts creations and drops; its drop then sleeps in `non_cancellable`.
struct Tracked {
    dropped: Arc<AtomicUsize>,
}
impl Tracked {
    fn new(created: &AtomicUsize, dropped: &Arc<AtomicUsize>) -> Tracked {
        created.fetch_add(1, SeqCst);
        Tracked {
            dropped: dropped.clone(),
        }
    }
}
impl Drop for Tracked {
    fn drop(&mut self) {
        // Counted on entry: a fiber left in this clean-up when the grace
        // time ends is unwound from it (by design), cutting it short.
        self.dropped.fetch_add(1, SeqCst);
        if fiber::core::in_fiber() {
            let _ = fiber::non_cancellable(|| fiber::sleep(ms(20)));
        }
    }
}

fn select_unsent_values_at_teardown(workers: usize, non_cancellable: bool) {
    within(10, move || {
        let created = counter();
        let dropped = counter();
        let rt = rt_fixed_grace(workers, ms(100));
        let (full_tx, _full_rx) = fiber::chan::bounded::<Tracked>(1);
        full_tx
            .send(Tracked::new(&created, &dropped))
            .unwrap_or_else(|_| panic!("room for one"));
        let (_never_tx, never_rx) = fiber::chan::bounded::<()>(0);
        for _ in 0..2 {
            let (tx, rx) = (full_tx.clone(), never_rx.clone());
            let (created, dropped) = (created.clone(), dropped.clone());
            rt.spawn(move || {
                let body = || loop {
                    fiber::select! {
                        send(tx, Tracked::new(&created, &dropped)) -> r => drop(r),
                        recv(rx) -> _r => {}
                    }
                };
                if non_cancellable {
                    fiber::non_cancellable(body)
                } else {
                    body()
                }
            });
        }
        wait_parked(&rt, 2);
        let start = Instant::now();
        drop(rt);
        let took = start.elapsed();
        drop(full_tx);
        drop(_full_rx);
        assert_eq!(created.load(SeqCst), dropped.load(SeqCst), "every value dropped once");
        assert!(took < Duration::from_secs(5), "shutdown took {took:?}");
    })
}

/// A select loop that ignores its cancellation is unwound after the grace
/// time: the value of its unsent send arm is dropped once, its clean-up
/// (a timed wait in `non_cancellable`) ends, and shutdown is bounded.
#[test]
fn select_loops_unsent_values_are_dropped_once_at_teardown_one_worker() {
    in_child(
        "select_loops_unsent_values_are_dropped_once_at_teardown_one_worker",
        20,
        || select_unsent_values_at_teardown(1, false),
    );
}

#[test]
fn select_loops_in_non_cancellable_unsent_values_are_dropped_once_at_teardown_two_workers() {
    in_child(
        "select_loops_in_non_cancellable_unsent_values_are_dropped_once_at_teardown_two_workers",
        20,
        || select_unsent_values_at_teardown(2, true),
    );
}

// ---------------------------------------------------------------------
// a runtime dropped by one of its own fibers' destructors
// ---------------------------------------------------------------------

/// How many threads of this process have a name starting with `prefix`.
fn threads_named(prefix: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("comm")).ok())
        .filter(|n| n.starts_with(prefix))
        .count()
}

fiber::fiber_local! {
    static OWN_RT: RefCell<Option<fiber::Runtime>> = const { RefCell::new(None) };
}

fn own_runtime_dropped_by_a_destructor(workers: usize, name: &'static str, in_local: bool) {
    within(15, move || {
        let rt = fiber::Runtime::builder()
            .workers(workers)
            .max_workers(workers)
            .shutdown_timeout(ms(200))
            .thread_name(name)
            .build()
            .unwrap();
        let parked_drops = counter();
        let v = Counted(parked_drops.clone());
        rt.spawn(move || {
            let _v = v;
            let _ = fiber::sleep(Duration::from_secs(3600));
        });
        wait_parked(&rt, 1);
        let handle = rt.handle();
        let returned = counter();
        let r2 = returned.clone();
        if in_local {
            drop(handle.spawn(move || {
                OWN_RT.with(|l| *l.borrow_mut() = Some(rt));
                r2.fetch_add(1, SeqCst);
            }));
        } else {
            // The detached fiber's value is the runtime itself.
            drop(handle.spawn(move || {
                r2.fetch_add(1, SeqCst);
                rt
            }));
        }
        let start = Instant::now();
        while threads_named(name) > 0 || parked_drops.load(SeqCst) == 0 {
            assert!(
                start.elapsed() < Duration::from_secs(8),
                "threads left: {}, parked fiber's value dropped: {}",
                threads_named(name),
                parked_drops.load(SeqCst)
            );
            std::thread::sleep(ms(5));
        }
        assert_eq!(returned.load(SeqCst), 1);
        assert_eq!(parked_drops.load(SeqCst), 1);
    })
}

/// spec/reliability.md: "dropping a runtime inside one of its own fibers
/// panics with a clear message and hands the shutdown to a thread of its
/// own: no thread leaks"; here the drop is a destructor run after the body
/// (a detached fiber's value, a fiber-local), where the panic is swallowed.
#[test]
fn a_detached_fibers_value_that_is_its_own_runtime_shuts_it_down() {
    in_child(
        "a_detached_fibers_value_that_is_its_own_runtime_shuts_it_down",
        20,
        || own_runtime_dropped_by_a_destructor(1, "r25own-val", false),
    );
}

#[test]
fn a_fiber_local_holding_its_own_runtime_shuts_it_down_at_fiber_exit() {
    in_child(
        "a_fiber_local_holding_its_own_runtime_shuts_it_down_at_fiber_exit",
        20,
        || own_runtime_dropped_by_a_destructor(2, "r25own-loc", true),
    );
}

// ---------------------------------------------------------------------
// a cancelled scope's unrun child whose closure's drop spawns into the scope
// ---------------------------------------------------------------------

struct SpawnsIntoScope<'a, 'env> {
    scope: &'a fiber::Scope<'a, 'env>,
    depth: usize,
    drops: &'a AtomicUsize,
    ran: &'a AtomicUsize,
}
impl Drop for SpawnsIntoScope<'_, '_> {
    fn drop(&mut self) {
        self.drops.fetch_add(1, SeqCst);
        if self.depth > 0 {
            let next = SpawnsIntoScope {
                scope: self.scope,
                depth: self.depth - 1,
                drops: self.drops,
                ran: self.ran,
            };
            let ran = self.ran;
            // Into the scope that is closing; the child is cancelled
            // before it starts: its closure (and `next`) dropped unrun.
            drop(self.scope.spawn(move || {
                let _next = next;
                ran.fetch_add(1, SeqCst);
            }));
        }
    }
}

fn unrun_children_spawning_from_their_drops(workers: usize) {
    within(10, move || {
        let rt = rt_fixed_grace(workers, ms(300));
        let (drops, ran) = rt.block_on(|| {
            let drops = AtomicUsize::new(0);
            let ran = AtomicUsize::new(0);
            fiber::scope(|s| {
                s.cancel();
                for _ in 0..2 {
                    let v = SpawnsIntoScope {
                        scope: s,
                        depth: 3,
                        drops: &drops,
                        ran: &ran,
                    };
                    drop(s.spawn(move || {
                        let _v = v;
                    }));
                }
            });
            (drops.load(SeqCst), ran.load(SeqCst))
        });
        assert_eq!(ran, 0, "a child of a cancelled scope never runs");
        assert_eq!(
            drops, 8,
            "each chain of four captures dropped before the scope returned"
        );
    })
}

/// spec/reliability.md: a scope returns only after everything its children
/// own has been dropped, also for a child that never ran; here each unrun
/// child's closure spawns the next child from its destructor.
#[test]
fn a_cancelled_scopes_unrun_children_spawning_from_their_drops_one_worker() {
    in_child(
        "a_cancelled_scopes_unrun_children_spawning_from_their_drops_one_worker",
        20,
        || unrun_children_spawning_from_their_drops(1),
    );
}

// ---------------------------------------------------------------------
// a destructor that drops an inner runtime whose fiber's clean-up needs
// the outer runtime (one outer worker, blocked by the inner shutdown)
// ---------------------------------------------------------------------

struct DropsInner(Option<fiber::Runtime>, Arc<AtomicUsize>);
impl Drop for DropsInner {
    fn drop(&mut self) {
        drop(self.0.take());
        self.1.fetch_add(1, SeqCst);
    }
}

struct NeedsOuter(fiber::Handle, Arc<AtomicUsize>);
impl Drop for NeedsOuter {
    fn drop(&mut self) {
        let outer = self.0.clone();
        // Clean-up that runs a root fiber on the outer runtime, from the
        // blocking pool (a fiber may not block_on).
        let r = fiber::blocking(move || std::panic::catch_unwind(AssertUnwindSafe(|| outer.block_on(|| 7))));
        if matches!(r, Ok(7)) {
            self.1.fetch_add(1, SeqCst);
        }
    }
}

/// README: "Dropping another runtime inside a fiber blocks that fiber's
/// worker for the inner shutdown"; the inner fiber's clean-up waits (in a
/// blocking call) for the outer runtime, whose only worker is that one.
/// Both shutdowns are bounded (grace times plus the 2 s worker bound) and
/// every destructor runs once.
#[test]
fn an_inner_runtimes_clean_up_needing_the_blocked_outer_worker_is_bounded() {
    in_child(
        "an_inner_runtimes_clean_up_needing_the_blocked_outer_worker_is_bounded",
        30,
        || {
            within(20, || {
                let outer = rt_fixed_grace(1, ms(200));
                let inner = rt_fixed_grace(1, ms(200));
                let cleaned = counter();
                let dropped = counter();
                let n = NeedsOuter(outer.handle(), cleaned.clone());
                inner.spawn(move || {
                    let _n = n;
                    let _ = fiber::sleep(Duration::from_secs(3600));
                });
                wait_parked(&inner, 1);
                let d = DropsInner(Some(inner), dropped.clone());
                let start = Instant::now();
                outer.block_on(move || drop(d));
                let took = start.elapsed();
                assert!(took >= ms(150), "the inner shutdown kept its grace time: {took:?}");
                assert_eq!(dropped.load(SeqCst), 1);
                // The inner fiber, given up on in its blocking call, is
                // resumed when the call returns and its destructor ends.
                let deadline = Instant::now() + Duration::from_secs(5);
                while cleaned.load(SeqCst) != 1 {
                    assert!(Instant::now() < deadline, "the inner clean-up never ended");
                    std::thread::sleep(ms(2));
                }
                drop(outer);
                assert!(start.elapsed() < Duration::from_secs(8), "took {:?}", start.elapsed());
            })
        },
    );
}

// ---------------------------------------------------------------------
// a scope's recorded child panic whose payload panics in Drop, dropped
// when the scope's owner is torn down
// ---------------------------------------------------------------------

struct BadPayload(Arc<AtomicUsize>);
impl Drop for BadPayload {
    fn drop(&mut self) {
        self.0.fetch_add(1, SeqCst);
        panic!("BadPayload dropped");
    }
}

/// Panics with a `BadPayload` when dropped.
struct Bomb(Arc<AtomicUsize>);
impl Drop for Bomb {
    fn drop(&mut self) {
        std::panic::panic_any(BadPayload(self.0.clone()));
    }
}

fn scope_owner_torn_down_with_two_bad_payloads(workers: usize) {
    within(10, move || {
        let payload_drops = counter();
        let owner_drops = counter();
        let rt = rt_fixed_grace(workers, ms(100));
        let (p, o) = (payload_drops.clone(), owner_drops.clone());
        let h = rt.spawn(move || {
            let _o = Counted(o);
            fiber::scope(|s| {
                let (b1, b2) = (Bomb(p.clone()), Bomb(p));
                drop(s.spawn(move || drop(b1)));
                // Run or dropped unrun, this child fails with a BadPayload too.
                drop(s.spawn(move || drop(b2)));
                stubborn_sleep();
            })
        });
        wait_parked(&rt, 1);
        let start = Instant::now();
        drop(rt);
        let took = start.elapsed();
        assert!(h.join().is_err());
        assert_eq!(owner_drops.load(SeqCst), 1);
        assert_eq!(payload_drops.load(SeqCst), 2);
        assert!(took < Duration::from_secs(5), "shutdown took {took:?}");
    })
}

/// Two children of a scope fail with payloads whose Drop panics; the
/// owner ignores the cancellation and is torn down after the grace time.
/// The payloads the scope does not raise are dropped once each ("a
/// payload's own Drop may panic: leaked then, never raised"), not during
/// the teardown unwind (which would abort), and shutdown is bounded.
#[test]
fn a_scope_owner_torn_down_with_two_recorded_bad_payloads_one_worker() {
    in_child(
        "a_scope_owner_torn_down_with_two_recorded_bad_payloads_one_worker",
        20,
        || scope_owner_torn_down_with_two_bad_payloads(1),
    );
}

#[test]
fn a_scope_owner_torn_down_with_two_recorded_bad_payloads_two_workers() {
    in_child(
        "a_scope_owner_torn_down_with_two_recorded_bad_payloads_two_workers",
        20,
        || scope_owner_torn_down_with_two_bad_payloads(2),
    );
}

fiber::fiber_local! {
    static CHILD_LOCAL: RefCell<Option<SleepsOnDrop>> = const { RefCell::new(None) };
}

/// spec/reliability.md: "a scope returns only after everything its children
/// own (closure, value, locals) has been dropped" (std's scoped join waits
/// for thread-local destructors). A child whose error comes after the
/// first, and whose error panics in Drop, must still have its fiber-locals
/// dropped before `try_scope` returns.
// Failed before the fix: a try_scope child whose later error panics in Drop has its fiber-locals dropped after the scope returned
#[test]
fn try_scope_a_later_childs_error_panicking_in_drop_drops_its_locals_before_the_scope_returns() {
    in_child(
        "try_scope_a_later_childs_error_panicking_in_drop_drops_its_locals_before_the_scope_returns",
        20,
        || {
            within(10, || {
                let rt = rt_fixed_grace(2, ms(300));
                let local_drops = counter();
                let err_drops = counter();
                let (l, e2) = (local_drops.clone(), err_drops.clone());
                let (first_wins, at_return) = rt.block_on(move || {
                    let r = fiber::try_scope(|s| {
                        s.spawn(move || -> Result<(), E> {
                            CHILD_LOCAL.with(|c| *c.borrow_mut() = Some(SleepsOnDrop(l, ms(100))));
                            // Cancelled by the sibling's failure.
                            let _ = fiber::sleep(Duration::from_secs(5));
                            Err(E::Body(BodyErr(e2)))
                        });
                        s.spawn(|| -> Result<(), E> {
                            let _ = fiber::non_cancellable(|| fiber::sleep(ms(20)));
                            Err(E::Plain)
                        });
                        Ok(())
                    });
                    (matches!(r, Err(E::Plain)), local_drops.load(SeqCst))
                });
                assert!(first_wins);
                assert_eq!(err_drops.load(SeqCst), 1);
                assert_eq!(
                    at_return, 1,
                    "the child's fiber-local was dropped after try_scope returned"
                );
            })
        },
    );
}
