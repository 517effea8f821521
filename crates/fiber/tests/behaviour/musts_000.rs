//! Requirements of the lifecycle design document (000) that no other test
//! held, or held only weakly; spec/musts.md traces each one. Each test
//! names the section it holds.

use crate::common::{ms, rt1, within};
use fiber::core::testing::TestScheduler;
use fiber::core::{fiber_wake, Canceller, Publish, WaitOptions, WaitResult, Waitable, Waiter};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

/// What a [`Gate`] does on its first publish, while the fiber is PARKING.
enum OnFirstPublish {
    /// Wake the record just published (a waker that sees PARKING).
    WakeSelf,
    /// Cancel the waiting fiber (a canceller that sees PARKING).
    Cancel(Canceller),
}

#[derive(Default)]
struct GateState {
    open: bool,
    records: Vec<Waiter>,
    tickets: Vec<u64>,
    publishes: usize,
    unpublishes: usize,
    first: Option<OnFirstPublish>,
}

/// A waitable that completes once opened, with a hook on its first publish.
struct Gate(Mutex<GateState>);

impl Gate {
    fn new(first: Option<OnFirstPublish>) -> Arc<Gate> {
        Arc::new(Gate(Mutex::new(GateState {
            first,
            ..GateState::default()
        })))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.0.lock().unwrap()
    }

    /// Open the gate and wake every published record; the claims won.
    fn open(&self) -> usize {
        let records = {
            let mut s = self.state();
            s.open = true;
            std::mem::take(&mut s.records)
        };
        records.iter().filter(|r| fiber_wake(r)).count()
    }
}

impl Waitable for Gate {
    type Io = ();

    fn try_complete(&self, _: &mut ()) -> Option<WaitResult> {
        self.state().open.then_some(WaitResult::Ok)
    }

    fn publish(&self, waiter: &Waiter, _: &mut ()) -> Publish {
        let first = {
            let mut s = self.state();
            if s.open {
                return Publish::Ready(WaitResult::Ok);
            }
            s.records.push(waiter.clone());
            s.tickets.push(waiter.ticket());
            s.publishes += 1;
            s.first.take()
        };
        match first {
            Some(OnFirstPublish::WakeSelf) => {
                assert!(!fiber_wake(waiter), "a PARKING fiber must not be claimed");
            }
            Some(OnFirstPublish::Cancel(canceller)) => canceller.cancel(),
            None => {}
        }
        Publish::Published
    }

    fn unpublish(&self, waiter: &Waiter, _: &mut ()) -> Option<WaitResult> {
        let mut s = self.state();
        s.unpublishes += 1;
        s.records.retain(|r| !r.same_wait(waiter));
        s.open.then_some(WaitResult::Ok)
    }
}

/// 000 §4.2 step 5, §4.3 (PARKING branch), §9 (PARKING -> RUNNING "MUST
/// unpublish"): a wake that finds the fiber PARKING only sets wake-pending;
/// the commit is aborted, the fiber resumes without a second enqueue, and
/// its record is unpublished before it publishes (with a fresh ticket) and
/// parks again. Without the unpublish the gate would hold two records.
#[test]
fn s9_a_park_aborted_by_wake_pending_unpublishes_before_it_parks_again() {
    within(10, || {
        let sched = TestScheduler::new();
        let gate = Gate::new(Some(OnFirstPublish::WakeSelf));
        let waiting = gate.clone();
        let handle = sched.spawn(move || fiber::core::fiber_wait(&*waiting, &mut (), WaitOptions::new()));
        assert_eq!(
            sched.run_until_idle(),
            1,
            "the aborted commit resumed the fiber in place"
        );
        {
            let s = gate.state();
            assert_eq!(s.publishes, 2, "published, recovered, published again");
            assert_eq!(s.unpublishes, 1, "the aborted park was unpublished");
            assert_eq!(s.records.len(), 1, "exactly one live record: the second park's");
            assert_eq!(s.tickets[1], s.tickets[0] + 1, "each publication has a fresh ticket");
            assert_eq!(s.records[0].ticket(), s.tickets[1]);
        }
        assert_eq!(gate.open(), 1, "the parked fiber is claimed once");
        sched.run();
        assert_eq!(handle.join().unwrap(), WaitResult::Ok);
    });
}

/// 000 §4.3: "Cancellation targeting a PARKING fiber MUST use this same
/// wake-pending path", and §9 (PARKING -> RUNNING by N, "MUST unpublish").
/// The cancel lands while the fiber is inside `publish`: no enqueue by the
/// canceller (one resume in all), the wait ends `Cancelled`, and nothing is
/// left published.
#[test]
fn s4_3_a_cancel_that_finds_the_fiber_parking_takes_the_wake_pending_path() {
    within(10, || {
        let sched = TestScheduler::new();
        let slot: Arc<Mutex<Option<Arc<Gate>>>> = Arc::new(Mutex::new(None));
        let seen = Arc::new(Mutex::new(None));
        let (slot2, seen2) = (slot.clone(), seen.clone());
        let handle = sched.spawn(move || {
            let gate = slot2.lock().unwrap().clone().unwrap();
            let result = fiber::core::fiber_wait(&*gate, &mut (), WaitOptions::new());
            *seen2.lock().unwrap() = Some(result);
        });
        let gate = Gate::new(Some(OnFirstPublish::Cancel(handle.canceller())));
        *slot.lock().unwrap() = Some(gate.clone());
        assert_eq!(
            sched.run_until_idle(),
            1,
            "the canceller did not enqueue a PARKING fiber"
        );
        assert_eq!(*seen.lock().unwrap(), Some(WaitResult::Cancelled));
        {
            let s = gate.state();
            assert_eq!(s.publishes, 1);
            assert_eq!(s.unpublishes, 1, "the cancelled park was unpublished");
            assert!(s.records.is_empty(), "no record left behind");
        }
        assert!(handle.join().unwrap_err().is_cancelled());
        assert_eq!(gate.open(), 0, "nothing left to wake");
    });
}

/// 000 §5 "Channels ... MUST attempt direct rendezvous before
/// buffering/parking" (§5.5: a waiting receiver is served before the
/// buffer). On one worker the receiver cannot run while the sender goes
/// on, so a value put in the buffer instead of handed over would still be
/// there (`len() == 1`) and would take the room of a later send.
#[test]
fn s5_a_send_hands_its_value_to_a_parked_receiver_before_using_the_buffer() {
    within(10, || {
        rt1().block_on(|| {
            for cap in [1usize, 3] {
                let (tx, rx) = fiber::chan::bounded::<usize>(cap);
                let receiver = {
                    let rx = rx.clone();
                    fiber::spawn(move || rx.recv().unwrap())
                };
                let start = Instant::now();
                while tx.waiting().0 < 1 {
                    assert!(start.elapsed() < Duration::from_secs(5), "receiver never parked");
                    fiber::yield_now().unwrap();
                }
                tx.try_send(0).unwrap();
                assert_eq!(tx.len(), 0, "cap {cap}: the value went to the receiver, not the buffer");
                for v in 1..=cap {
                    assert_eq!(tx.try_send(v), Ok(()), "cap {cap}: the whole buffer is still free");
                }
                assert!(tx.try_send(99).is_err(), "cap {cap}: now the buffer is full");
                assert_eq!(receiver.join().unwrap(), 0);
                let rest: Vec<usize> = rx.try_iter().collect();
                assert_eq!(rest, (1..=cap).collect::<Vec<_>>());
            }
            let (tx, rx) = fiber::chan::unbounded::<u8>();
            let receiver = {
                let rx = rx.clone();
                fiber::spawn(move || rx.recv().unwrap())
            };
            while tx.waiting().0 < 1 {
                fiber::yield_now().unwrap();
            }
            tx.send(7).unwrap();
            assert_eq!(tx.len(), 0, "unbounded: handed over, not queued");
            assert_eq!(receiver.join().unwrap(), 7);
        });
    });
}

/// 000 §5.5 (receive side) with §5.2: a receive pops the buffer before it
/// takes a parked sender's value, so the order is the order of admission.
#[test]
fn s5_a_receive_takes_the_buffer_before_a_parked_sender() {
    within(10, || {
        rt1().block_on(|| {
            let (tx, rx) = fiber::chan::bounded::<u32>(2);
            tx.send(1).unwrap();
            tx.send(2).unwrap();
            let sender = {
                let tx = tx.clone();
                fiber::spawn(move || tx.send(3))
            };
            while tx.waiting().1 < 1 {
                fiber::yield_now().unwrap();
            }
            assert_eq!(rx.recv(), Ok(1));
            assert_eq!(rx.recv(), Ok(2));
            assert_eq!(rx.recv(), Ok(3));
            assert_eq!(sender.join().unwrap(), Ok(()));
        });
    });
}

/// 000 §0 hard rule: channel lifetime and close are independent of the
/// cancellation of the scope (nursery) that made them. Cancelling the scope
/// cancels its fibers' operations but never closes the channel; values sent
/// before stay deliverable and the channel goes on working after the scope.
#[test]
fn s0_cancelling_a_scope_never_closes_its_channels() {
    within(10, || {
        rt1().block_on(|| {
            let (tx, rx) = fiber::scope(|s| {
                let (tx, rx) = fiber::chan::bounded::<u32>(4);
                let (tx2, rx2) = (tx.clone(), rx.clone());
                let (sent_tx, sent_rx) = fiber::chan::bounded::<()>(1);
                s.spawn(move || {
                    tx2.send(1).unwrap();
                    sent_tx.send(()).unwrap();
                    // Park on a rendezvous nobody serves: only the cancel ends it.
                    let (_keep, never) = fiber::chan::bounded::<()>(0);
                    let _ = never.recv();
                    drop(rx2);
                });
                sent_rx.recv().unwrap();
                s.cancel();
                (tx, rx)
            });
            assert!(
                !tx.is_closed() && !rx.is_closed(),
                "scope cancellation closed a channel"
            );
            assert_eq!(rx.recv(), Ok(1), "a value sent before the cancel is still delivered");
            tx.send(2).unwrap();
            assert_eq!(rx.recv(), Ok(2));
        });
    });
}

/// 000 §6.2: a worker in DRAINING "MUST NOT steal or accept new work",
/// "MUST drain local deque to global MPMC" and "MUST exit after its
/// current scheduler slice". A fiber spins (no progress) until the monitor
/// drains its worker, then spawns children from it and yields: no child
/// ever runs on the draining worker's thread, and after the yield the
/// fiber itself resumes on another thread (the drained worker left).
#[test]
fn s6_2_a_draining_worker_takes_no_new_work_and_exits_after_its_slice() {
    within(30, || {
        let rt = fiber::Runtime::builder()
            .workers(2)
            .max_workers(4)
            .idle_timeout(ms(200))
            .shutdown_timeout(ms(300))
            .build()
            .unwrap();
        let (home, after, seen) = rt.block_on(|| {
            let stuck = fiber::spawn(|| {
                let home = std::thread::current().id();
                let start = Instant::now();
                while fiber::stats().runtime.workers_drained_stuck == 0 {
                    assert!(start.elapsed() < Duration::from_secs(8), "the worker was never drained");
                    for _ in 0..1000 {
                        std::hint::spin_loop();
                    }
                }
                let seen: Arc<Mutex<Vec<ThreadId>>> = Arc::default();
                let children: Vec<_> = (0..32)
                    .map(|_| {
                        let seen = seen.clone();
                        fiber::spawn(move || {
                            for _ in 0..4 {
                                seen.lock().unwrap().push(std::thread::current().id());
                                let _ = fiber::yield_now();
                            }
                        })
                    })
                    .collect();
                // End this slice: the drained worker must leave now.
                let _ = fiber::yield_now();
                let after = std::thread::current().id();
                for c in children {
                    c.join().unwrap();
                }
                let seen = seen.lock().unwrap().clone();
                (home, after, seen)
            });
            stuck.join().unwrap()
        });
        assert_eq!(seen.len(), 32 * 4);
        assert!(
            seen.iter().all(|t| *t != home),
            "a draining worker ran new work ({} of {} runs)",
            seen.iter().filter(|t| **t == home).count(),
            seen.len()
        );
        assert_ne!(after, home, "the drained worker went on after its slice");
    });
}

/// 000 §3.1: "Channel code MUST implement admission and close behavior via
/// WaitableOps and MUST NOT directly mutate scheduler queues or worker
/// ownership state." Held structurally: fiber-chan does not depend on the
/// scheduler crate, and its sources never make a run-queue token, enqueue,
/// or move a fiber's state word; they park and wake only through
/// fiber-core's `fiber_wait` / `fiber_wake`.
#[test]
fn s3_1_channel_code_reaches_the_scheduler_only_through_the_wait_contract() {
    let chan = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fiber-chan");
    let manifest = std::fs::read_to_string(chan.join("Cargo.toml")).unwrap();
    let deps = manifest
        .split("[dependencies]")
        .nth(1)
        .and_then(|rest| rest.split("\n[").next())
        .expect("fiber-chan has a [dependencies] table");
    assert!(
        !deps.contains("fiber-sched"),
        "fiber-chan must not depend on the scheduler"
    );
    let forbidden = [
        "Runnable::new",
        ".schedule(",
        "transition_to_",
        "StateWord",
        "into_running",
    ];
    let mut uses_wait = false;
    let mut stack = vec![chan.join("src")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            uses_wait |= text.contains("fiber_wait") || text.contains("impl Waitable");
            for word in forbidden {
                assert!(
                    !text.contains(word),
                    "{} uses `{word}`: channel code must go through fiber_wait / fiber_wake",
                    path.display()
                );
            }
        }
    }
    assert!(uses_wait, "fiber-chan parks through fiber_wait / Waitable");
}
