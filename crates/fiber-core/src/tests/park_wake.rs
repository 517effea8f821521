//! The park/wake protocol end to end on the test scheduler.

use super::Event;
use crate::testing::TestScheduler;
use crate::{fiber_wait, fiber_wake, fiber_wake_via, yield_now, WaitOptions, WaitResult};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Deterministic shuffle (xorshift) so a failure replays.
fn shuffle<T>(items: &mut [T], mut seed: u64) {
    for i in (1..items.len()).rev() {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        items.swap(i, (seed % (i as u64 + 1)) as usize);
    }
}

fn park_and_wake_many(fibers: usize, wakers: usize, wait_for_publish: bool, seed: u64) {
    println!("seed {seed}");
    let sched = TestScheduler::new();
    let events: Arc<Vec<Event>> = Arc::new((0..fibers).map(|_| Event::default()).collect());
    let finished: Arc<Vec<AtomicUsize>> = Arc::new((0..fibers).map(|_| AtomicUsize::new(0)).collect());
    let mut handles = Vec::with_capacity(fibers);
    for i in 0..fibers {
        let events = events.clone();
        let finished = finished.clone();
        handles.push(sched.spawn(move || {
            let result = fiber_wait(&events[i], &mut (), WaitOptions::new());
            assert_eq!(result, WaitResult::Ok);
            finished[i].fetch_add(1, Ordering::Relaxed);
            i
        }));
    }
    // Let every fiber publish itself and park before the wakers start.
    if wait_for_publish {
        assert_eq!(sched.run_until_idle(), fibers);
        assert_eq!(sched.pool_stats().in_use, fibers);
    }
    let mut order: Vec<usize> = (0..fibers).collect();
    shuffle(&mut order, seed);
    let chunk = fibers.div_ceil(wakers);
    let threads: Vec<_> = order
        .chunks(chunk)
        .map(|part| {
            let part = part.to_vec();
            let events = events.clone();
            std::thread::spawn(move || part.iter().map(|&i| events[i].set()).sum::<usize>())
        })
        .collect();
    sched.run();
    let claimed: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    for (i, handle) in handles.into_iter().enumerate() {
        assert_eq!(handle.join().unwrap(), i);
    }
    for (i, count) in finished.iter().enumerate() {
        assert_eq!(
            count.load(Ordering::Relaxed),
            1,
            "fiber {i} finished {} times",
            count.load(Ordering::Relaxed)
        );
    }
    if wait_for_publish {
        assert_eq!(claimed, fibers, "every parked fiber is claimed by exactly one wake");
        let published: usize = events.iter().map(|e| e.publishes.load(Ordering::Relaxed)).sum();
        assert_eq!(published, fibers);
    }
    let stats = sched.pool_stats();
    assert_eq!(stats.in_use, 0);
    assert_eq!(
        sched.scheduler().frames().idle_in_global(),
        stats.allocated,
        "the pool holds every frame again"
    );
}

#[test]
fn ten_thousand_parked_fibers_woken_from_four_threads() {
    park_and_wake_many(10_000, 4, true, 0x9E37_79B9_7F4A_7C15);
}

#[test]
fn ten_thousand_fibers_racing_four_wakers() {
    park_and_wake_many(10_000, 4, false, 0xD1B5_4A32_D192_ED03);
}

#[test]
fn stale_ticket_after_recycle_is_ignored() {
    let sched = TestScheduler::new();
    let first = Arc::new(Event::default());
    let waiting = first.clone();
    let a = sched.spawn(move || fiber_wait(&*waiting, &mut (), WaitOptions::new()));
    sched.run_until_idle();
    // Keep A's waiter record: after A finishes it is stale.
    let stale = first.records().pop().expect("A published a waiter");
    first.set();
    sched.run_until_idle();
    assert_eq!(a.join().unwrap(), WaitResult::Ok);
    assert_eq!(sched.pool_stats().allocated, 1);

    // B reuses A's frame and parks on another event.
    let second = Arc::new(Event::default());
    let resumes = Arc::new(AtomicUsize::new(0));
    let (waiting, counted) = (second.clone(), resumes.clone());
    let b = sched.spawn(move || {
        let result = fiber_wait(&*waiting, &mut (), WaitOptions::new());
        counted.fetch_add(1, Ordering::Relaxed);
        result
    });
    sched.run_until_idle();
    assert_eq!(sched.pool_stats().allocated, 1, "B runs on A's recycled frame");
    let fresh = second.records().pop().expect("B published a waiter");
    assert_ne!(fresh.ticket(), stale.ticket());

    assert!(!fiber_wake(&stale), "a stale record must not claim");
    assert_eq!(sched.run_until_idle(), 0, "nothing was enqueued by the stale wake");
    assert_eq!(resumes.load(Ordering::Relaxed), 0, "B is unaffected");

    second.set();
    sched.run();
    assert_eq!(b.join().unwrap(), WaitResult::Ok);
    assert_eq!(resumes.load(Ordering::Relaxed), 1);
}

#[test]
fn a_wake_via_a_scheduler_queues_the_fiber_on_its_own_scheduler() {
    // `fiber_wake_via` hands the fiber to the scheduler it was given only
    // when that is the fiber's own; given another, the fiber still goes to
    // its own (the other scheduler gets nothing), and a stale record claims
    // nothing either way.
    let own = TestScheduler::new();
    let other = TestScheduler::new();
    for via_own in [false, true] {
        let event = Arc::new(Event::default());
        let waiting = event.clone();
        let fiber = own.spawn(move || fiber_wait(&*waiting, &mut (), WaitOptions::new()));
        own.run_until_idle();
        let record = event.records().pop().expect("the fiber published a waiter");
        event.state.lock().unwrap().set = true;
        let via = if via_own { own.scheduler() } else { other.scheduler() };
        assert!(fiber_wake_via(&record, &*via), "a parked fiber's record claims");
        assert!(
            !fiber_wake_via(&record, &*via),
            "a second wake of one wait claims nothing"
        );
        assert_eq!(other.run_until_idle(), 0, "nothing was queued on the other scheduler");
        assert_eq!(own.run_until_idle(), 1, "the fiber ran on its own scheduler");
        assert_eq!(fiber.join().unwrap(), WaitResult::Ok);
    }
}

#[test]
fn wake_while_parking_is_recovered_by_the_commit() {
    // The fiber wakes its own waiter after publishing (as a waker on another
    // thread could): it is PARKING, so the wake only sets WAKE_PENDING and
    // the worker's commit resumes it instead of parking.
    struct SelfWaking(Event);
    impl crate::Waitable for SelfWaking {
        type Io = ();
        fn try_complete(&self, io: &mut ()) -> Option<WaitResult> {
            self.0.try_complete(io)
        }
        fn publish(&self, waiter: &crate::Waiter, io: &mut ()) -> crate::Publish {
            let published = self.0.publish(waiter, io);
            let records = self.0.records();
            {
                let mut state = self.0.state.lock().unwrap();
                state.set = true;
                state.waiters.clear();
            }
            assert!(!fiber_wake(&records[0]), "a PARKING fiber must not be claimed");
            published
        }
        fn unpublish(&self, waiter: &crate::Waiter, io: &mut ()) -> Option<WaitResult> {
            self.0.unpublish(waiter, io)
        }
    }
    let sched = TestScheduler::new();
    let handle = sched.spawn(|| fiber_wait(&SelfWaking(Event::default()), &mut (), WaitOptions::new()));
    assert_eq!(sched.run_until_idle(), 1, "resumed by the commit, not re-enqueued");
    assert_eq!(handle.join().unwrap(), WaitResult::Ok);
}

#[test]
fn yield_interleaves_fibers_in_fifo_order() {
    let sched = TestScheduler::new();
    let log = Arc::new(Mutex::new(Vec::new()));
    for name in ['a', 'b'] {
        let log = log.clone();
        sched.spawn(move || {
            for i in 0..3 {
                log.lock().unwrap().push(format!("{name}{i}"));
                let _ = yield_now();
            }
        });
    }
    sched.run();
    assert_eq!(*log.lock().unwrap(), ["a0", "b0", "a1", "b1", "a2", "b2"]);
}

#[test]
fn panic_is_captured_for_the_joiner_and_the_worker_goes_on() {
    let sched = TestScheduler::new();
    let bad = sched.spawn(|| -> u32 { panic!("boom in a fiber") });
    let good = sched.spawn(|| 7);
    sched.run();
    let err = bad.join().unwrap_err();
    assert!(err.is_panic());
    assert_eq!(
        err.to_string(),
        format!("{} panicked with message \"boom in a fiber\"", err.id())
    );
    assert_eq!(*err.into_panic().downcast::<&str>().unwrap(), "boom in a fiber");
    assert_eq!(good.join().unwrap(), 7);
    assert_eq!(sched.pool_stats().in_use, 0);
}

#[test]
fn deadline_times_out_on_virtual_time() {
    let sched = TestScheduler::new();
    let event = Arc::new(Event::default());
    let waiting = event.clone();
    let scheduler = sched.scheduler();
    let handle = sched.spawn(move || {
        let deadline = scheduler.now() + Duration::from_millis(250);
        fiber_wait(&*waiting, &mut (), WaitOptions::new().deadline(Some(deadline)))
    });
    sched.run();
    assert_eq!(handle.join().unwrap(), WaitResult::TimedOut);
    assert_eq!(sched.elapsed(), Duration::from_millis(250));
    assert!(event.records().is_empty(), "a timed-out waiter unpublishes itself");
}

#[test]
fn completion_wins_over_a_later_deadline() {
    let sched = TestScheduler::new();
    let event = Arc::new(Event::default());
    let (waiting, setter) = (event.clone(), event.clone());
    let scheduler = sched.scheduler();
    let waiter = sched.spawn(move || {
        let deadline = scheduler.now() + Duration::from_secs(5);
        fiber_wait(&*waiting, &mut (), WaitOptions::new().deadline(Some(deadline)))
    });
    sched.spawn(move || setter.set());
    sched.run();
    assert_eq!(waiter.join().unwrap(), WaitResult::Ok);
}

#[test]
fn cancel_wakes_a_parked_fiber_and_join_reports_it() {
    let sched = TestScheduler::new();
    let event = Arc::new(Event::default());
    let waiting = event.clone();
    let seen = Arc::new(Mutex::new(None));
    let record = seen.clone();
    let handle = sched.spawn(move || {
        let result = fiber_wait(&*waiting, &mut (), WaitOptions::new());
        *record.lock().unwrap() = Some(result);
    });
    sched.run_until_idle();
    handle.cancel();
    sched.run();
    assert_eq!(*seen.lock().unwrap(), Some(WaitResult::Cancelled));
    assert!(event.records().is_empty());
    assert!(handle.join().unwrap_err().is_cancelled());
}

#[test]
fn cancel_before_start_never_runs_the_body() {
    let sched = TestScheduler::new();
    let ran = Arc::new(AtomicUsize::new(0));
    let counted = ran.clone();
    let handle = sched.spawn(move || counted.fetch_add(1, Ordering::Relaxed));
    handle.cancel();
    sched.run();
    assert_eq!(ran.load(Ordering::Relaxed), 0);
    assert!(handle.join().unwrap_err().is_cancelled());
    assert_eq!(sched.pool_stats().in_use, 0);
}

#[test]
fn plain_threads_wait_through_the_same_protocol() {
    let event = Arc::new(Event::default());
    let setter = event.clone();
    let t = std::thread::spawn(move || {
        while setter.records().is_empty() {
            std::thread::yield_now();
        }
        setter.set()
    });
    assert_eq!(fiber_wait(&*event, &mut (), WaitOptions::new()), WaitResult::Ok);
    assert_eq!(t.join().unwrap(), 1, "the thread's record was claimed once");

    let never = Event::default();
    let deadline = std::time::Instant::now() + Duration::from_millis(20);
    assert_eq!(
        fiber_wait(&never, &mut (), WaitOptions::new().deadline(Some(deadline))),
        WaitResult::TimedOut
    );
    assert!(std::time::Instant::now() >= deadline);
    assert!(never.records().is_empty());
}

#[test]
fn a_plain_thread_joins_a_fiber() {
    let sched = TestScheduler::new();
    let event = Arc::new(Event::default());
    let waiting = event.clone();
    let handle = sched.spawn(move || fiber_wait(&*waiting, &mut (), WaitOptions::new()));
    let joiner = std::thread::spawn(move || handle.join().unwrap());
    sched.run_until_idle();
    event.set();
    sched.run();
    assert_eq!(joiner.join().unwrap(), WaitResult::Ok);
}

#[test]
fn fibers_join_fibers() {
    let sched = TestScheduler::new();
    let total = sched.block_on(|| {
        let children: Vec<_> = (0..100u64).map(|i| crate::spawn(move || i * 2)).collect();
        children.into_iter().map(|c| c.join().unwrap()).sum::<u64>()
    });
    assert_eq!(total, 9900);
}

#[test]
fn shutdown_unwinds_parked_fibers_and_runs_destructors_once() {
    struct Counted(Arc<AtomicUsize>);
    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
    let sched = TestScheduler::new();
    let drops = Arc::new(AtomicUsize::new(0));
    let event = Arc::new(Event::default());
    let mut handles = Vec::new();
    for _ in 0..10 {
        let (drops, event) = (drops.clone(), event.clone());
        handles.push(sched.spawn(move || {
            let _guard = Counted(drops);
            fiber_wait(&*event, &mut (), WaitOptions::new());
        }));
    }
    sched.run_until_idle();
    let report = sched.shutdown();
    assert_eq!(report.abandoned, 0);
    assert_eq!(drops.load(Ordering::Relaxed), 10);
    for handle in handles {
        assert!(handle.join().unwrap_err().is_cancelled());
    }
    assert_eq!(sched.pool_stats().in_use, 0);
    assert_eq!(event.set(), 0, "every record left behind is stale");
}

#[test]
fn hundred_thousand_parked_fibers_fit_the_default_map_count() {
    const FIBERS: usize = 100_000;
    // On a kernel without page-table guards, stacks past the map-count
    // budget run unguarded (opt-in) instead of failing.
    let sched = TestScheduler::with_stacks(crate::StackConfig {
        unguarded: crate::UnguardedPolicy::Allow,
        ..crate::StackConfig::default()
    });
    let event = Arc::new(Event::default());
    let handles: Vec<_> = (0..FIBERS)
        .map(|i| {
            let event = event.clone();
            sched.spawn(move || {
                assert_eq!(fiber_wait(&*event, &mut (), WaitOptions::new()), WaitResult::Ok);
                i
            })
        })
        .collect();
    assert_eq!(sched.run_until_idle(), FIBERS);
    let stats = sched.pool_stats();
    assert_eq!(stats.in_use, FIBERS, "all parked at once");
    assert_eq!(stats.guarded_stacks + stats.unguarded_stacks, FIBERS);
    let map_limit: usize = std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .map(|s| s.trim().parse().unwrap())
        .unwrap_or(65_530);
    if crate::stack::page_table_guards_supported() {
        assert_eq!(
            stats.unguarded_stacks, 0,
            "page-table guards need no mapping: {stats:?}"
        );
    } else if map_limit < 2 * FIBERS {
        assert!(
            stats.unguarded_stacks > 0,
            "past the budget stacks go unguarded instead of failing: {stats:?}"
        );
    }
    assert!(
        stats.guarded_stacks > 0 || crate::stack::guarded_stacks_left() == 0,
        "{stats:?}"
    );
    assert_eq!(event.set(), FIBERS);
    sched.run();
    assert_eq!(
        handles.into_iter().map(|h| h.join().unwrap()).sum::<usize>(),
        FIBERS * (FIBERS - 1) / 2
    );
}

#[test]
fn a_fiber_whose_first_run_finds_no_stack_never_runs_and_its_join_says_why() {
    if !crate::stack::page_table_guards_supported() {
        // There every spawn takes its stack at once (a refusal is the
        // spawn's error): no first run looks for one.
        eprintln!("skipped: this kernel has no MADV_GUARD_INSTALL");
        return;
    }
    struct Dropped(Arc<AtomicUsize>);
    impl Drop for Dropped {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let sched = TestScheduler::new();
    let ran = Arc::new(AtomicUsize::new(0));
    let dropped = Arc::new(AtomicUsize::new(0));
    let captured = Dropped(dropped.clone());
    let flag = ran.clone();
    let handle = sched.spawn(move || {
        let _captured = captured;
        flag.fetch_add(1, Ordering::SeqCst);
        5
    });
    // The kernel refuses the stack the first run asks for.
    crate::stack::tests_hook::fail_next_allocations(1);
    sched.run();
    let err = handle.join().unwrap_err();
    // Reported as the fiber's panic, whose payload names the cause (a
    // cancellation would say that something cancelled it).
    assert!(err.is_panic(), "{err:?}");
    let why = err.into_panic().downcast::<String>().expect("a message");
    assert!(why.contains("could not start") && why.contains("no stack"), "{why}");
    assert_eq!(crate::start_failure(), None, "set only while the body drops");
    assert_eq!(ran.load(Ordering::SeqCst), 0, "the body never ran");
    assert_eq!(dropped.load(Ordering::SeqCst), 1, "the body was dropped unrun, once");
    // The runtime goes on: the next fiber gets a stack.
    let handle = sched.spawn(|| 6);
    sched.run();
    assert_eq!(handle.join().unwrap(), 6);
    let stats = sched.pool_stats();
    assert_eq!(stats.in_use, 0, "{stats:?}");
    assert_eq!(stats.guarded_stacks, 1, "{stats:?}");
}

#[test]
fn a_panicking_destructor_of_a_body_that_found_no_stack_stays_with_that_fiber() {
    if !crate::stack::page_table_guards_supported() {
        eprintln!("skipped: this kernel has no MADV_GUARD_INSTALL");
        return;
    }
    struct PanicsOnDrop;
    impl Drop for PanicsOnDrop {
        fn drop(&mut self) {
            panic!("a capture's destructor panics");
        }
    }
    let sched = TestScheduler::new();
    let captured = PanicsOnDrop;
    let handle = sched.spawn(move || {
        let _captured = captured;
        1
    });
    let next = sched.spawn(|| 2);
    crate::stack::tests_hook::fail_next_allocations(1);
    // The panic is contained where the body is dropped: the scheduler's
    // loop goes on and runs the next fiber.
    sched.run();
    assert!(handle.join().unwrap_err().is_panic());
    assert_eq!(next.join().unwrap(), 2);
    assert_eq!(sched.pool_stats().in_use, 0);
}

/// A body that found no stack is dropped unrun on the resuming thread: a
/// capture whose destructor uses a fiber-local must get a value of its
/// own for that drop, not the resuming thread's (or fiber's) storage. It
/// wrote into the thread's map, where the value outlived the fiber.
// Failed before the fix: the destructor's fiber-local value stayed in the resuming thread's map (read 1, not 0)
#[test]
fn a_body_that_found_no_stack_drops_its_fiber_locals_apart_from_the_thread() {
    if !crate::stack::page_table_guards_supported() {
        eprintln!("skipped: this kernel has no MADV_GUARD_INSTALL");
        return;
    }
    static KEY: u8 = 0;
    fn zero() -> AtomicUsize {
        AtomicUsize::new(0)
    }
    fn key() -> usize {
        &KEY as *const u8 as usize
    }
    struct BumpsALocal;
    impl Drop for BumpsALocal {
        fn drop(&mut self) {
            crate::with_fiber_local(key(), zero, |n| n.fetch_add(1, Ordering::SeqCst));
        }
    }
    let sched = TestScheduler::new();
    let captured = BumpsALocal;
    let handle = sched.spawn(move || {
        let _captured = captured;
        1
    });
    crate::stack::tests_hook::fail_next_allocations(1);
    sched.run();
    assert!(handle.join().unwrap_err().is_panic());
    let on_this_thread = crate::with_fiber_local(key(), zero, |n| n.load(Ordering::SeqCst));
    assert_eq!(
        on_this_thread, 0,
        "the unrun body's fiber-local landed in the thread's storage"
    );
}
