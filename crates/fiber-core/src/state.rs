//! The fiber state word: the single source of truth for a fiber's lifecycle.
//!
//! Normative rules: `spec/lifecycle.md`. Every change of a fiber's state goes
//! through a `transition_*` method of [`StateWord`]; each one checks the edge
//! against the legality matrix ([`check`]) whenever checks are on
//! (debug builds, tests, or the `spec-assert` feature) and fails fast with a
//! message naming from, to and actor.
//!
//! # Fields
//!
//! One `u64`, so that the wake claim validates the wait ticket and takes
//! ownership in a single compare-and-swap:
//!
//! ```text
//!  63                                    8 7  5   4   3    0
//! +---------------------------------------+----+---+--------+
//! |            wait ticket (56 bits)      | 0  | P | state  |
//! +---------------------------------------+----+---+--------+
//!  P = WAKE_PENDING: a waker saw PARKING with the current ticket.
//! ```
//!
//! # States
//!
//! `INIT -> RUNNABLE -> RUNNING -> {RUNNABLE | PARKING | DONE | CANCELLED}`,
//! `PARKING -> {RUNNING | PARKED}`, `PARKED -> RUNNABLE` (the fused
//! `PARKED -> WAKING -> RUNNABLE` wake claim), and `DONE | CANCELLED -> INIT`
//! when the frame is recycled.
//!
//! # Protocol
//!
//! * Only the fiber enters PARKING (bumping the ticket). Only the worker that
//!   ran it commits PARKED, after the fiber's stack is quiescent.
//! * A waker holding ticket `t` claims `(PARKED, t)` by one CAS; a waker that
//!   sees `(PARKING, t)` only sets `P`; any other observation is stale.
//! * The commit `(PARKING, t, P=0) -> (PARKED, t)` fails when `P` is set; the
//!   worker then returns the fiber to RUNNING (lost-wake recovery).

use crate::sync::{AtomicU64, Ordering};
use std::fmt;

/// Bits that hold the state number.
const STATE_MASK: u64 = 0b1111;
/// Set by a waker that observed PARKING with the current ticket.
const WAKE_PENDING: u64 = 1 << 4;
/// First bit of the wait ticket.
const TICKET_SHIFT: u32 = 8;
/// One ticket step, as an addend to the whole word.
const TICKET_ONE: u64 = 1 << TICKET_SHIFT;

/// Are the legality checks compiled in?
pub(crate) const CHECKS: bool = cfg!(any(debug_assertions, feature = "spec-assert"));

/// The lifecycle states of spec section 2.1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FiberState {
    /// Allocated, not yet scheduled.
    Init = 0,
    /// In exactly one run queue (or about to be pushed to one).
    Runnable = 1,
    /// Owned and executed by exactly one worker.
    Running = 2,
    /// In flight from RUNNING to PARKED; still owned by its worker.
    Parking = 3,
    /// Stack quiescent; discoverable by wakers through its wait ticket.
    Parked = 4,
    /// Logical wake-claim phase; fused into the claim CAS in this runtime.
    Waking = 5,
    /// Body returned (or panicked); result delivered.
    Done = 6,
    /// Ended by cancellation (never started, or acknowledged a cancel).
    Cancelled = 7,
}

impl FiberState {
    fn from_bits(bits: u64) -> FiberState {
        match bits & STATE_MASK {
            0 => FiberState::Init,
            1 => FiberState::Runnable,
            2 => FiberState::Running,
            3 => FiberState::Parking,
            4 => FiberState::Parked,
            5 => FiberState::Waking,
            6 => FiberState::Done,
            7 => FiberState::Cancelled,
            other => panic!("fiber state word holds an unknown state number {other}"),
        }
    }

    const fn bits(self) -> u64 {
        self as u64
    }

    /// Upper-case name used in the spec and in failure messages.
    pub fn name(self) -> &'static str {
        match self {
            FiberState::Init => "INIT",
            FiberState::Runnable => "RUNNABLE",
            FiberState::Running => "RUNNING",
            FiberState::Parking => "PARKING",
            FiberState::Parked => "PARKED",
            FiberState::Waking => "WAKING",
            FiberState::Done => "DONE",
            FiberState::Cancelled => "CANCELLED",
        }
    }
}

impl fmt::Display for FiberState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Who performs a transition (the Actor column of the legality matrix).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Actor {
    /// `F`: the fiber itself (or a plain thread waiting through the protocol).
    Fiber,
    /// `Wk`: the worker loop, on its own stack.
    Worker,
    /// `W`: a waker (waitable, timer or canceller) holding a wait ticket.
    Waker,
    /// `S`: the spawner.
    Spawner,
    /// The frame pool recycling a finished frame.
    Pool,
    /// A scheduler queue accepting a fiber.
    Scheduler,
}

impl fmt::Display for Actor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Actor::Fiber => "fiber (F)",
            Actor::Worker => "worker (Wk)",
            Actor::Waker => "waker (W)",
            Actor::Spawner => "spawner (S)",
            Actor::Pool => "frame pool",
            Actor::Scheduler => "scheduler queue",
        })
    }
}

/// Is `from -> to` by `actor` a row of the legality matrix (spec section 9,
/// as refined in `spec/lifecycle.md`)?
pub fn is_legal(from: FiberState, to: FiberState, actor: Actor) -> bool {
    use Actor::*;
    use FiberState::*;
    matches!(
        (from, to, actor),
        (Init, Runnable, Spawner)
            | (Runnable, Running, Worker)
            | (Running, Runnable, Fiber | Worker)
            | (Running, Parking, Fiber)
            // publish failed or cancel seen (F); commit aborted by WAKE_PENDING (Wk)
            | (Parking, Running, Fiber | Worker)
            // commit: by the worker after the stack is quiescent; a plain
            // thread commits its own park (it has no second stack to resume).
            | (Parking, Parked, Worker | Fiber)
            | (Parked, Waking, Fiber | Waker)
            | (Waking, Runnable, Waker)
            // fused wake claim: PARKED -> WAKING -> RUNNABLE in one CAS
            | (Parked, Runnable, Waker)
            // fused self-claim of a thread parker whose deadline passed:
            // PARKED -> WAKING -> RUNNING in one CAS
            | (Parked, Running, Fiber)
            | (Running, Done, Fiber | Worker)
            | (Running, Cancelled, Fiber | Worker)
            // a fiber cancelled before its first instruction never runs
            | (Runnable, Cancelled, Worker)
            | (Done | Cancelled, Init, Pool)
    )
}

/// Fail fast on an illegal transition.
#[cold]
#[inline(never)]
#[track_caller]
pub(crate) fn illegal(from: FiberState, to: FiberState, actor: Actor) -> ! {
    panic!("illegal fiber transition {from} -> {to} by {actor} (spec/lifecycle.md, legality matrix)")
}

/// Check one edge against the matrix when checks are on.
#[inline(always)]
#[track_caller]
pub fn check(from: FiberState, to: FiberState, actor: Actor) {
    if CHECKS && !is_legal(from, to, actor) {
        illegal(from, to, actor)
    }
}

/// Check that a fiber handed to a run queue is RUNNABLE (invariant F2).
#[inline(always)]
#[track_caller]
pub(crate) fn check_enqueue(state: FiberState, actor: Actor) {
    if CHECKS && state != FiberState::Runnable {
        illegal_enqueue(state, actor)
    }
}

#[cold]
#[inline(never)]
#[track_caller]
fn illegal_enqueue(state: FiberState, actor: Actor) -> ! {
    panic!(
        "illegal enqueue of a fiber in state {state} by {actor}: only RUNNABLE fibers may enter a run queue (invariant F2)"
    )
}

/// A copy of the state word at one instant.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Snapshot(u64);

impl Snapshot {
    /// The lifecycle state.
    pub fn state(self) -> FiberState {
        FiberState::from_bits(self.0)
    }

    /// The current wait ticket (56 bits).
    pub fn ticket(self) -> u64 {
        self.0 >> TICKET_SHIFT
    }

    /// Did a waker see PARKING with the current ticket?
    pub fn is_wake_pending(self) -> bool {
        self.0 & WAKE_PENDING != 0
    }

    fn with_state(self, state: FiberState) -> Snapshot {
        Snapshot((self.0 & !(STATE_MASK | WAKE_PENDING)) | state.bits())
    }
}

impl fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Snapshot")
            .field("state", &self.state())
            .field("ticket", &self.ticket())
            .field("wake_pending", &self.is_wake_pending())
            .finish()
    }
}

/// Outcome of the worker's park commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum Commit {
    /// PARKED is published; the worker must not touch the fiber again.
    Parked,
    /// A waker came first (WAKE_PENDING); the fiber is RUNNING again and the
    /// worker must resume it.
    Aborted,
}

/// Outcome of a wake attempt with a ticket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum Claim {
    /// This waker won PARKED -> RUNNABLE and owns the single enqueue (F4).
    Claimed,
    /// The fiber was PARKING; WAKE_PENDING is set and the worker's commit
    /// will resume it. The waker does nothing else.
    Pending,
    /// The ticket is old or the fiber is already awake: no claim, no enqueue.
    Stale,
}

/// The atomic state word of one fiber (or thread parker).
#[derive(Debug)]
pub struct StateWord(AtomicU64);

impl Default for StateWord {
    fn default() -> Self {
        Self::new()
    }
}

impl StateWord {
    /// A fresh word: INIT, ticket 0.
    pub fn new() -> Self {
        StateWord(AtomicU64::new(FiberState::Init.bits()))
    }

    /// A word that starts RUNNING: the shape of a plain thread that waits
    /// through the protocol (it is always running when it is not parked).
    pub fn new_running() -> Self {
        StateWord(AtomicU64::new(FiberState::Running.bits()))
    }

    /// Read the word.
    #[inline]
    pub fn load(&self, order: Ordering) -> Snapshot {
        Snapshot(self.0.load(order))
    }

    /// An owner-only edge: `from -> to` (plus `extra` added to the word, used
    /// for the ticket bump). While a fiber is INIT, RUNNABLE, RUNNING, DONE
    /// or CANCELLED only its owner writes the word: wakers write only after
    /// observing PARKING or PARKED (`wake`), and they CAS from the value they
    /// observed. So a load and a plain store are exact here, and much cheaper
    /// than a locked read-modify-write on the hot yield and spawn paths.
    #[inline(always)]
    #[track_caller]
    fn shift(&self, from: FiberState, to: FiberState, actor: Actor, extra: u64, order: Ordering) -> Snapshot {
        let load_order = match order {
            Ordering::AcqRel | Ordering::Acquire => Ordering::Acquire,
            _ => Ordering::Relaxed,
        };
        let store_order = match order {
            Ordering::AcqRel | Ordering::Release => Ordering::Release,
            _ => Ordering::Relaxed,
        };
        let prev = Snapshot(self.0.load(load_order));
        if CHECKS && (prev.state() != from || prev.is_wake_pending()) {
            illegal(prev.state(), to, actor);
        }
        check(from, to, actor);
        self.0
            .store(Snapshot(prev.0.wrapping_add(extra)).with_state(to).0, store_order);
        prev
    }

    /// `INIT -> RUNNABLE` by the spawner, before the first enqueue.
    #[inline]
    #[track_caller]
    pub fn transition_to_runnable_from_init(&self) {
        // Release: pairs with the Acquire in `transition_to_running` (and the
        // run queue's own release/acquire), so the dequeuer sees the frame's
        // initialized fields.
        self.shift(
            FiberState::Init,
            FiberState::Runnable,
            Actor::Spawner,
            0,
            Ordering::Release,
        );
    }

    /// `RUNNABLE -> RUNNING` by the worker that dequeued the fiber. The queue
    /// guarantees a single consumer, so no CAS is needed (matrix row 2).
    #[inline]
    #[track_caller]
    pub fn transition_to_running(&self) {
        // AcqRel: Acquire pairs with the Release of whoever made the fiber
        // RUNNABLE (`transition_to_runnable_*`, `wake`). The Release half
        // pairs with nothing today (a late waker that reads RUNNING backs
        // off as stale without reading the runner's data); it is kept as
        // the spec table's "Dequeue to RUNNING" row has it.
        self.shift(
            FiberState::Runnable,
            FiberState::Running,
            Actor::Worker,
            0,
            Ordering::AcqRel,
        );
    }

    /// `RUNNING -> RUNNABLE`: a cooperative yield, committed by the worker
    /// after the fiber's stack is quiescent.
    #[inline]
    #[track_caller]
    pub fn transition_to_runnable_from_running(&self) {
        // Release: pairs with the Acquire in `transition_to_running` on the
        // worker that runs the fiber next.
        self.shift(
            FiberState::Running,
            FiberState::Runnable,
            Actor::Worker,
            0,
            Ordering::Release,
        );
    }

    /// `RUNNING -> PARKING` by the fiber: bumps the wait ticket and returns
    /// the new ticket, which every waiter record of this wait carries.
    #[inline]
    #[track_caller]
    pub fn transition_to_parking(&self) -> u64 {
        // Release: a waker that later reads PARKING (Acquire in `wake`) after
        // finding the waiter record must not see an older state (spec table
        // "Enter PARKING"). The record itself is published later, under the
        // waitable's own release.
        let prev = self.shift(
            FiberState::Running,
            FiberState::Parking,
            Actor::Fiber,
            TICKET_ONE,
            Ordering::Release,
        );
        prev.ticket().wrapping_add(1) & (u64::MAX >> TICKET_SHIFT)
    }

    /// `PARKING -> RUNNING` by the fiber itself (publish failed, the wait
    /// completed during publish, or cancellation was seen before parking).
    /// Clears WAKE_PENDING: the fiber will look at the waitable anyway.
    #[inline]
    #[track_caller]
    pub fn transition_to_running_from_parking(&self, actor: Actor) {
        let mut current = self.0.load(Ordering::Relaxed);
        loop {
            let seen = Snapshot(current);
            if CHECKS && seen.state() != FiberState::Parking {
                illegal(seen.state(), FiberState::Running, actor);
            }
            // AcqRel: Acquire pairs with the Release of a waker that set
            // WAKE_PENDING (`wake`), so its waitable writes are visible;
            // Release pairs with the Acquire load in `wake` of a late waker,
            // which then sees RUNNING and backs off. Wakers only ever add
            // WAKE_PENDING, so the loop retries at most once per waker.
            match self.0.compare_exchange_weak(
                current,
                seen.with_state(FiberState::Running).0,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(actual) => current = actual,
            }
        }
        check(FiberState::Parking, FiberState::Running, actor);
    }

    /// The park commit, run by the worker after the fiber suspended (yield
    /// before commit): `(PARKING, t, P=0) -> (PARKED, t)`, or, when a waker
    /// set WAKE_PENDING, `PARKING -> RUNNING` (lost-wake recovery).
    #[inline]
    #[track_caller]
    pub fn transition_to_parked(&self, actor: Actor) -> Commit {
        let ticket_bits = self.0.load(Ordering::Relaxed) & !(STATE_MASK | WAKE_PENDING);
        let parking = ticket_bits | FiberState::Parking.bits();
        // Success: Release publishes parked-ness and the quiescent stack
        // (pairs with the Acquire of the claim CAS in `wake`). Failure:
        // Acquire pairs with the Release of the CAS in `wake` that set
        // WAKE_PENDING.
        match self.0.compare_exchange(
            parking,
            ticket_bits | FiberState::Parked.bits(),
            Ordering::Release,
            Ordering::Acquire,
        ) {
            Ok(_) => {
                check(FiberState::Parking, FiberState::Parked, actor);
                Commit::Parked
            }
            Err(current) => {
                let seen = Snapshot(current);
                if CHECKS && !(seen.state() == FiberState::Parking && seen.is_wake_pending()) {
                    illegal(seen.state(), FiberState::Parked, actor);
                }
                // Only this worker may leave PARKING and wakers only ever add
                // WAKE_PENDING, so a plain store of the recovered word is exact.
                // Release: pairs with the Acquire load in `wake` of a late
                // waker, which then sees RUNNING and backs off.
                check(FiberState::Parking, FiberState::Running, actor);
                self.0.store(seen.with_state(FiberState::Running).0, Ordering::Release);
                Commit::Aborted
            }
        }
    }

    /// The wake protocol for a waiter record holding `ticket`.
    #[inline]
    pub fn wake(&self, ticket: u64) -> Claim {
        // Acquire: pairs with the Release of the park commit and of
        // `transition_to_parking` (spec table "Waker claim").
        let mut current = self.0.load(Ordering::Acquire);
        loop {
            let seen = Snapshot(current);
            if seen.ticket() != ticket {
                return Claim::Stale;
            }
            let next = match seen.state() {
                FiberState::Parking if seen.is_wake_pending() => return Claim::Pending,
                FiberState::Parking => current | WAKE_PENDING,
                FiberState::Parked => seen.with_state(FiberState::Runnable).0,
                _ => return Claim::Stale,
            };
            // AcqRel: Acquire pairs with the commit's Release (we will touch
            // the stack owner's data); Release pairs with the Acquire of
            // `transition_to_running` and of the commit's failure path.
            match self
                .0
                .compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) if seen.state() == FiberState::Parked => {
                    check(FiberState::Parked, FiberState::Runnable, Actor::Waker);
                    return Claim::Claimed;
                }
                Ok(_) => return Claim::Pending,
                Err(actual) => current = actual,
            }
        }
    }

    /// Fused self-claim `(PARKED, t) -> RUNNING` by a thread parker whose
    /// deadline passed. Returns `false` if a waker claimed it first (the
    /// thread must then wait for that waker's unpark).
    #[inline]
    pub fn self_claim(&self, ticket: u64) -> bool {
        let ticket_bits = ticket << TICKET_SHIFT;
        // AcqRel: single-owner claim against racing wakers (spec table
        // "Self-claim wake").
        let ok = self
            .0
            .compare_exchange(
                ticket_bits | FiberState::Parked.bits(),
                ticket_bits | FiberState::Running.bits(),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok();
        if ok {
            check(FiberState::Parked, FiberState::Running, Actor::Fiber);
        }
        ok
    }

    /// `RUNNABLE -> RUNNING` by a thread parker after its waker claimed it.
    #[inline]
    pub fn transition_to_running_after_claim(&self) {
        self.transition_to_running_as(Actor::Worker)
    }

    fn transition_to_running_as(&self, actor: Actor) {
        // AcqRel: as in `transition_to_running`.
        self.shift(FiberState::Runnable, FiberState::Running, actor, 0, Ordering::AcqRel);
    }

    /// `RUNNING -> DONE` or `RUNNING -> CANCELLED`, by the worker after the
    /// body returned (its stack is quiescent). `RUNNABLE -> CANCELLED` when a
    /// fiber is cancelled before its first instruction.
    #[inline]
    #[track_caller]
    pub fn transition_to_final(&self, from: FiberState, to: FiberState) {
        debug_assert!(matches!(to, FiberState::Done | FiberState::Cancelled));
        // Release: pairs with the Acquire loads of teardown (`pool.rs`,
        // which then reads the frame); the diagnostics' loads are Relaxed
        // snapshots. Results travel through the join slot, which has its
        // own synchronization.
        self.shift(from, to, Actor::Worker, 0, Ordering::Release);
    }

    /// `DONE | CANCELLED -> INIT` when the frame pool recycles the frame. The
    /// ticket is kept, so waiter records of earlier incarnations stay stale.
    #[inline]
    #[track_caller]
    pub fn transition_to_init(&self) {
        let prev = self.load(Ordering::Relaxed);
        check(prev.state(), FiberState::Init, Actor::Pool);
        // Release: the frame travels through the pool's queue, which orders
        // this store before the next owner's reads.
        self.0.store(prev.with_state(FiberState::Init).0, Ordering::Release);
    }
}

#[cfg(test)]
mod tests;
