//! Loom models of the park/wake protocol (spec 4, 8), run by
//! `cargo xtask loom`. Threads stand in for the fiber, its worker and the
//! wakers; the stack switch is elided (the fiber and its worker run in order
//! on one loom thread, which is what yield-before-commit guarantees).
//! Every model drives the real `StateWord` code.

use crate::state::{Actor, Claim, Commit, FiberState, StateWord};
use crate::sync::{fence, lock, Arc, AtomicBool, AtomicUsize, Mutex, Ordering};
use loom::thread;

/// A waitable with one waiter slot per fiber, modelled under loom's mutex.
struct Model {
    state: StateWord,
    /// Published waiter records (tickets).
    records: Mutex<Vec<u64>>,
    /// Set (under `records`) when the waitable completes the operation.
    done: Mutex<bool>,
    /// Enqueues made by claim winners (F4: at most one per park).
    enqueues: AtomicUsize,
    /// Resumes by the worker's aborted commit (lost-wake recovery).
    recovered: AtomicUsize,
}

impl Model {
    fn running() -> Arc<Model> {
        let state = StateWord::new();
        state.transition_to_runnable_from_init();
        state.transition_to_running();
        Arc::new(Model {
            state,
            records: Mutex::new(Vec::new()),
            done: Mutex::new(false),
            enqueues: AtomicUsize::new(0),
            recovered: AtomicUsize::new(0),
        })
    }

    /// fiber_wait steps 2-4 with the worker's commit. Returns the ticket and
    /// whether the fiber is parked (else it is RUNNING again).
    fn park(&self) -> (u64, bool) {
        let ticket = self.state.transition_to_parking();
        {
            let mut records = lock(&self.records);
            if *lock(&self.done) {
                drop(records);
                self.state.transition_to_running_from_parking(Actor::Fiber);
                return (ticket, false);
            }
            records.push(ticket);
        }
        match self.state.transition_to_parked(Actor::Worker) {
            Commit::Parked => (ticket, true),
            Commit::Aborted => {
                self.recovered.fetch_add(1, Ordering::Relaxed);
                (ticket, false)
            }
        }
    }

    /// A waker: complete the operation, take every record, wake each.
    fn complete_and_wake_all(&self) -> usize {
        let records: Vec<u64> = {
            let mut records = lock(&self.records);
            *lock(&self.done) = true;
            std::mem::take(&mut *records)
        };
        records.iter().filter(|&&t| self.wake(t)).count()
    }

    fn wake(&self, ticket: u64) -> bool {
        match self.state.wake(ticket) {
            Claim::Claimed => {
                self.enqueues.fetch_add(1, Ordering::Relaxed);
                true
            }
            Claim::Pending | Claim::Stale => false,
        }
    }

    /// The fiber got back on a CPU exactly once for this park.
    fn resumed_once(&self, parked: bool) {
        let enqueues = self.enqueues.load(Ordering::Relaxed);
        let recovered = self.recovered.load(Ordering::Relaxed);
        if parked {
            assert_eq!(
                enqueues, 1,
                "a parked fiber must be enqueued exactly once (lost or double wake)"
            );
            assert_eq!(recovered, 0);
        } else {
            assert_eq!(enqueues, 0, "a fiber that never parked must not be enqueued");
        }
    }
}

/// Wake racing the park: the waker may run before publish, while PARKING,
/// or after PARKED. Exactly one of {publish saw done, commit recovered,
/// claim enqueued} resumes the fiber. Removing the WAKE_PENDING check from
/// the commit (plain store of PARKED) loses the wake here.
#[test]
fn loom_wake_while_parking_or_parked() {
    loom::model(|| {
        let model = Model::running();
        let waker = {
            let model = model.clone();
            thread::spawn(move || model.complete_and_wake_all())
        };
        let (_, parked) = model.park();
        waker.join().unwrap();
        model.resumed_once(parked);
        if parked {
            assert_eq!(model.state.load(Ordering::Relaxed).state(), FiberState::Runnable);
        }
    });
}

/// Two wakers holding the same record race: exactly one claims (F4).
/// Turning the claim CAS into a load-check-store lets both enqueue.
#[test]
fn loom_two_wakers_one_enqueue() {
    loom::model(|| {
        let model = Model::running();
        let ticket = model.state.transition_to_parking();
        assert_eq!(model.state.transition_to_parked(Actor::Worker), Commit::Parked);
        let wakers: Vec<_> = (0..2)
            .map(|_| {
                let model = model.clone();
                thread::spawn(move || model.wake(ticket))
            })
            .collect();
        let claims = wakers.into_iter().map(|w| w.join().unwrap()).filter(|&c| c).count();
        assert_eq!(claims, 1);
        model.resumed_once(true);
    });
}

/// A stale record (old ticket) fired while the frame is recycled for a new
/// incarnation that parks again: the stale wake never claims the new park.
/// Dropping the ticket comparison from `wake` lets it claim.
#[test]
fn loom_stale_ticket_after_recycle() {
    loom::model(|| {
        let model = Model::running();
        let old = model.state.transition_to_parking();
        assert_eq!(model.state.transition_to_parked(Actor::Worker), Commit::Parked);
        // The legitimate wake, then the fiber finishes; the frame is
        // recycled, respawned and parks with a new ticket.
        assert!(model.wake(old));
        let stale = {
            let model = model.clone();
            thread::spawn(move || model.state.wake(old))
        };
        let s = &model.state;
        s.transition_to_running();
        s.transition_to_final(FiberState::Running, FiberState::Done);
        s.transition_to_init();
        s.transition_to_runnable_from_init();
        s.transition_to_running();
        let new = s.transition_to_parking();
        let commit = s.transition_to_parked(Actor::Worker);
        assert_eq!(stale.join().unwrap(), Claim::Stale);
        assert_eq!(commit, Commit::Parked, "a stale wake must not even set WAKE_PENDING");
        let seen = s.load(Ordering::Relaxed);
        assert_eq!((seen.state(), seen.ticket()), (FiberState::Parked, new));
    });
}

/// A deadline wake (timer) races the data wake while the fiber unpublishes:
/// one claim in all, and the fiber learns whether the value was handed over
/// (no loss, no duplicate): it reports success exactly when the data waker
/// took its record. An `unpublish` that ignores `done` loses the value.
#[test]
fn loom_unpublish_races_wake() {
    loom::model(|| {
        let model = Model::running();
        let (ticket, parked) = model.park();
        assert!(parked);
        let data = {
            let model = model.clone();
            thread::spawn(move || {
                let records: Vec<u64> = {
                    let mut records = lock(&model.records);
                    *lock(&model.done) = true;
                    std::mem::take(&mut *records)
                };
                let took = records.contains(&ticket);
                let claimed = records.iter().filter(|&&t| model.wake(t)).count();
                (took, claimed)
            })
        };
        // The timer's wake; whoever claimed, the fiber then runs and
        // unpublishes (after the data waker if it was the claimer).
        let timer_claimed = model.wake(ticket);
        let unpublish = |model: &Model| {
            let mut records = lock(&model.records);
            let was_published = records.contains(&ticket);
            records.retain(|&t| t != ticket);
            // The wait completed iff the waker removed our record and
            // completed the operation.
            !was_published && *lock(&model.done)
        };
        let early = timer_claimed.then(|| {
            model.state.transition_to_running();
            unpublish(&model)
        });
        let (took, data_claims) = data.join().unwrap();
        assert_eq!(usize::from(timer_claimed) + data_claims, 1, "exactly one claim");
        let handed_over = match early {
            Some(handed_over) => handed_over,
            None => {
                model.state.transition_to_running();
                unpublish(&model)
            }
        };
        assert_eq!(
            handed_over, took,
            "the fiber's view of the handover matches the waker's"
        );
        model.resumed_once(true);
    });
}

/// Close-style wake-all of two fibers, with the close repeated: every
/// waiter resumes exactly once, the second close is a no-op.
#[test]
fn loom_close_wakes_all_once() {
    loom::model(|| {
        let shared = Arc::new((Mutex::new(Vec::<(usize, u64)>::new()), Mutex::new(false)));
        let fibers: Vec<Arc<Model>> = (0..2).map(|_| Model::running()).collect();
        let parks: Vec<_> = fibers
            .iter()
            .enumerate()
            .map(|(i, fiber)| {
                let (fiber, shared) = (fiber.clone(), shared.clone());
                thread::spawn(move || {
                    let ticket = fiber.state.transition_to_parking();
                    {
                        let mut records = lock(&shared.0);
                        if *lock(&shared.1) {
                            drop(records);
                            fiber.state.transition_to_running_from_parking(Actor::Fiber);
                            return false;
                        }
                        records.push((i, ticket));
                    }
                    match fiber.state.transition_to_parked(Actor::Worker) {
                        Commit::Parked => true,
                        Commit::Aborted => {
                            fiber.recovered.fetch_add(1, Ordering::Relaxed);
                            false
                        }
                    }
                })
            })
            .collect();
        let close = {
            let (shared, fibers) = (shared.clone(), fibers.clone());
            move || {
                // Close LP: the flag and the taking of every record happen
                // under one lock, so no publish can slip between them.
                let records = {
                    let mut records = lock(&shared.0);
                    *lock(&shared.1) = true;
                    std::mem::take(&mut *records)
                };
                for (i, ticket) in records {
                    fibers[i].wake(ticket);
                }
            }
        };
        let closer = thread::spawn(close.clone());
        let parked: Vec<bool> = parks.into_iter().map(|p| p.join().unwrap()).collect();
        closer.join().unwrap();
        for (fiber, &parked) in fibers.iter().zip(&parked) {
            fiber.resumed_once(parked);
        }
        // A repeated close is a no-op: no second enqueue.
        close();
        for (fiber, &parked) in fibers.iter().zip(&parked) {
            fiber.resumed_once(parked);
        }
    });
}

/// Cancellation has no waiter record: the canceller stores a flag and wakes
/// whatever the fiber waits on now. Runs the production halves of the
/// handshake (`wait.rs::enter_parking` for the parker, `wait_to_interrupt`
/// for the canceller, through `ModelFiber`): with the SeqCst fence in each
/// (store flag; fence; read state) vs (enter PARKING; fence; read flag) the
/// cancel is never lost. Removing either fence lets both sides miss.
#[test]
fn loom_cancel_is_never_lost() {
    loom::model(|| {
        let fiber = crate::model::ModelFiber::running(1);
        let cancel = Arc::new(AtomicBool::new(false));
        let canceller = {
            let (fiber, cancel) = (fiber.clone(), cancel.clone());
            thread::spawn(move || {
                cancel.store(true, Ordering::Relaxed);
                fiber.interrupt();
            })
        };
        let parked = fiber.park_unless(|| cancel.load(Ordering::Relaxed));
        canceller.join().unwrap();
        if parked {
            assert_eq!(fiber.enqueues(), 1, "cancel of a parked fiber was lost");
        }
    });
}

/// A hand-off whose only synchronisation is the state word: the waker
/// takes the waiter record (under the waitable's lock), then writes the
/// value into a cell outside any lock, then wakes. The waiter reads the
/// value after `fiber_wait` returns. This runs the production
/// `fiber_wait` / `fiber_wake` (the thread path, whose park and claim use
/// the same `StateWord` edges as a fiber's), and loom's cell checks that
/// the write happens-before the read: weakening the claim CAS in
/// `StateWord::wake` to Relaxed, or the parker's Acquire load in
/// `park_until_claimed`, makes this model fail with a causality error.
struct HandOff {
    slot: Mutex<Option<crate::Waiter>>,
    taken: AtomicBool,
    value: loom::cell::UnsafeCell<u64>,
}

// SAFETY: `value` is written by the one waker before its wake and read by
// the waiter after its wait returns; loom checks exactly that ordering.
unsafe impl Sync for HandOff {}

impl crate::Waitable for HandOff {
    type Io = ();
    fn try_complete(&self, _: &mut ()) -> Option<crate::WaitResult> {
        None
    }
    fn publish(&self, waiter: &crate::Waiter, _: &mut ()) -> crate::Publish {
        *lock(&self.slot) = Some(waiter.clone());
        crate::Publish::Published
    }
    fn unpublish(&self, _: &crate::Waiter, _: &mut ()) -> Option<crate::WaitResult> {
        let mut slot = lock(&self.slot);
        // The record is gone only if the waker took it, and the waiter
        // only gets here after that waker's wake (claim or WAKE_PENDING).
        let taken = slot.take().is_none() && self.taken.load(Ordering::Relaxed);
        taken.then_some(crate::WaitResult::Ok)
    }
}

#[test]
fn loom_value_handed_across_a_park_is_visible() {
    loom::model(|| {
        let hand_off = Arc::new(HandOff {
            slot: Mutex::new(None),
            taken: AtomicBool::new(false),
            value: loom::cell::UnsafeCell::new(0),
        });
        let waker = {
            let hand_off = hand_off.clone();
            thread::spawn(move || loop {
                let record = {
                    let mut slot = lock(&hand_off.slot);
                    let record = slot.take();
                    if record.is_some() {
                        hand_off.taken.store(true, Ordering::Relaxed);
                    }
                    record
                };
                match record {
                    Some(record) => {
                        // SAFETY: only this thread writes, before the wake.
                        hand_off.value.with_mut(|v| unsafe { *v = 42 });
                        crate::fiber_wake(&record);
                        break;
                    }
                    None => thread::yield_now(),
                }
            })
        };
        let result = crate::fiber_wait(&*hand_off, &mut (), crate::WaitOptions::new());
        assert_eq!(result, crate::WaitResult::Ok);
        // SAFETY: the wait returned Ok, so the waker's write happened-before.
        let value = hand_off.value.with(|v| unsafe { *v });
        assert_eq!(value, 42);
        waker.join().unwrap();
    });
}

/// A spawn from outside the runtime racing teardown (`pool::SpawnGate`):
/// an admitted spawn's fiber is in the queue before teardown drains it, and
/// nothing is enqueued after the drain. Without teardown's wait for
/// admitted spawns, an admitted spawn enqueues after the drain (its join
/// then never returned).
#[test]
fn loom_spawn_admission_racing_teardown() {
    use crate::gate::SpawnGate;
    use crate::sync::AtomicU8;
    const OPEN: u8 = 0;
    const TEARDOWN: u8 = 2;
    loom::model(|| {
        let phase = Arc::new(AtomicU8::new(OPEN));
        let gate = Arc::new(SpawnGate::new());
        let queue = Arc::new(Mutex::new(Vec::new()));
        let spawner = {
            let (phase, gate, queue) = (phase.clone(), gate.clone(), queue.clone());
            thread::spawn(move || {
                if !gate.enter(&phase, OPEN) {
                    return false;
                }
                lock(&queue).push(1);
                gate.leave();
                true
            })
        };
        phase.store(TEARDOWN, Ordering::SeqCst);
        gate.wait_for_admitted();
        let drained = std::mem::take(&mut *lock(&queue));
        let admitted = spawner.join().unwrap();
        assert_eq!(
            admitted,
            drained.len() == 1,
            "an admitted spawn's fiber is drained by teardown"
        );
        assert!(lock(&queue).is_empty(), "nothing is enqueued after teardown's drain");
    });
}
