//! fiber-core: the park commit's Release is what hands the fiber's stack
//! to the worker that resumes it.
//!
//! What it checks: between `transition_to_parking` (the fiber's own store)
//! and the worker's commit CAS (`transition_to_parked`), the switch away
//! writes the fiber's stack (callee-saved registers, the return address).
//! Whoever resumes the fiber after a waker's claim must see those writes.
//! The only edge that carries them is the commit CAS's Release (success
//! ordering), read by the claim CAS (Acquire) and, through the claim's
//! release sequence, by the resuming worker's Acquire load in
//! `transition_to_running`. The Release of the PARKING store does not cover
//! them: they come after it.
//!
//! The existing models in `tests/loom_park.rs` do not write anything
//! between PARKING and the commit, so none of them fails when the commit's
//! success ordering is weakened to Relaxed; this one does (loom reports a
//! causality violation on the `stack` cell).
//!
//! Run with `cargo xtask loom fiber-core`.

use crate::state::{Actor, Claim, Commit, StateWord};
use crate::sync::{lock, Arc, Mutex};
use loom::cell::UnsafeCell;
use loom::thread;

struct Frame {
    state: StateWord,
    /// Stands in for the fiber's stack: written by the suspending switch
    /// (after PARKING, before the commit), read by the next resume.
    stack: UnsafeCell<u64>,
    /// The waitable's record slot (the waiter record under its lock).
    record: Mutex<Option<u64>>,
}

// SAFETY: `stack` is written by the parking side before its commit and read
// by the resuming side after a claim; loom checks that ordering.
unsafe impl Sync for Frame {}

#[test]
fn loom_commit_publishes_the_stack_to_the_resumer() {
    loom::model(|| {
        let state = StateWord::new();
        state.transition_to_runnable_from_init();
        state.transition_to_running();
        let frame = Arc::new(Frame {
            state,
            stack: UnsafeCell::new(0),
            record: Mutex::new(None),
        });
        // The waker, then the worker that dequeues and resumes the fiber
        // (one loom thread: the run queue's own edge is not what is tested;
        // the resumer reads the stack right after the claim, as a worker
        // would after `transition_to_running`).
        let waker = {
            let frame = frame.clone();
            thread::spawn(move || loop {
                let record = lock(&frame.record).take();
                match record {
                    Some(ticket) => {
                        if frame.state.wake(ticket) == Claim::Claimed {
                            frame.state.transition_to_running();
                            // SAFETY: we hold the claim; loom checks the
                            // write happened-before.
                            let saved = frame.stack.with(|s| unsafe { *s });
                            assert_eq!(saved, 7, "resumed a stack whose switch we cannot see");
                        }
                        break;
                    }
                    None => thread::yield_now(),
                }
            })
        };
        // The fiber: PARKING, publish (under the waitable's lock), then
        // its switch writes the stack, then its worker commits.
        let ticket = frame.state.transition_to_parking();
        *lock(&frame.record) = Some(ticket);
        // SAFETY: the fiber's own stack; nobody resumes it before the
        // commit (yield before commit).
        frame.stack.with_mut(|s| unsafe { *s = 7 });
        match frame.state.transition_to_parked(Actor::Worker) {
            Commit::Parked => {}
            Commit::Aborted => {
                // The waker set WAKE_PENDING: this worker resumes it.
                // SAFETY: this thread wrote the cell; the waker only reads
                // it after a successful claim, which an aborted commit
                // means it did not make.
                let saved = frame.stack.with(|s| unsafe { *s });
                assert_eq!(saved, 7);
            }
        }
        waker.join().unwrap();
    });
}
