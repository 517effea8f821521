//! Unit tests of the state word and the legality matrix.

use super::*;
use std::panic::{catch_unwind, AssertUnwindSafe};

fn panic_message(f: impl FnOnce()) -> String {
    let err = catch_unwind(AssertUnwindSafe(f)).expect_err("expected a fail-fast panic");
    err.downcast_ref::<String>()
        .cloned()
        .or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap()
}

fn parked_word() -> (StateWord, u64) {
    let word = StateWord::new();
    word.transition_to_runnable_from_init();
    word.transition_to_running();
    let ticket = word.transition_to_parking();
    assert_eq!(word.transition_to_parked(Actor::Worker), Commit::Parked);
    (word, ticket)
}

#[test]
fn spawn_run_yield_finish_walks_the_matrix() {
    let word = StateWord::new();
    assert_eq!(word.load(Ordering::Relaxed).state(), FiberState::Init);
    word.transition_to_runnable_from_init();
    word.transition_to_running();
    word.transition_to_runnable_from_running();
    word.transition_to_running();
    word.transition_to_final(FiberState::Running, FiberState::Done);
    assert_eq!(word.load(Ordering::Relaxed).state(), FiberState::Done);
    word.transition_to_init();
    assert_eq!(word.load(Ordering::Relaxed).state(), FiberState::Init);
}

#[test]
fn every_park_bumps_the_ticket() {
    let word = StateWord::new();
    word.transition_to_runnable_from_init();
    word.transition_to_running();
    let first = word.transition_to_parking();
    word.transition_to_running_from_parking(Actor::Fiber);
    let second = word.transition_to_parking();
    assert_eq!(second, first + 1);
    assert_eq!(word.load(Ordering::Relaxed).ticket(), second);
}

#[test]
fn ticket_survives_recycling() {
    let (word, ticket) = parked_word();
    assert_eq!(word.wake(ticket), Claim::Claimed);
    word.transition_to_running();
    word.transition_to_final(FiberState::Running, FiberState::Done);
    word.transition_to_init();
    assert_eq!(
        word.load(Ordering::Relaxed).ticket(),
        ticket,
        "recycling keeps the ticket sequence"
    );
}

#[test]
fn ticket_wraps_at_56_bits_without_touching_state() {
    let word = StateWord(AtomicU64::new(!0xff | FiberState::Running.bits()));
    let ticket = word.transition_to_parking();
    assert_eq!(ticket, 0);
    assert_eq!(word.load(Ordering::Relaxed).state(), FiberState::Parking);
}

#[test]
fn wake_claims_parked_exactly_once() {
    let (word, ticket) = parked_word();
    assert_eq!(word.wake(ticket), Claim::Claimed);
    assert_eq!(word.wake(ticket), Claim::Stale, "a second waker must not claim");
    assert_eq!(word.load(Ordering::Relaxed).state(), FiberState::Runnable);
}

#[test]
fn wake_with_old_ticket_is_stale() {
    let (word, ticket) = parked_word();
    assert_eq!(word.wake(ticket.wrapping_sub(1)), Claim::Stale);
    assert_eq!(word.load(Ordering::Relaxed).state(), FiberState::Parked);
}

#[test]
fn wake_during_parking_sets_pending_and_aborts_commit() {
    let word = StateWord::new();
    word.transition_to_runnable_from_init();
    word.transition_to_running();
    let ticket = word.transition_to_parking();
    assert_eq!(word.wake(ticket), Claim::Pending);
    assert_eq!(
        word.wake(ticket),
        Claim::Pending,
        "repeated wakes while PARKING stay pending"
    );
    assert!(word.load(Ordering::Relaxed).is_wake_pending());
    assert_eq!(word.transition_to_parked(Actor::Worker), Commit::Aborted);
    let seen = word.load(Ordering::Relaxed);
    assert_eq!(seen.state(), FiberState::Running);
    assert!(!seen.is_wake_pending());
    assert_eq!(word.wake(ticket), Claim::Stale, "a late waker backs off once RUNNING");
}

#[test]
fn thread_self_claim_races_a_waker() {
    let (word, ticket) = parked_word();
    assert!(word.self_claim(ticket));
    assert_eq!(word.wake(ticket), Claim::Stale);
    let (word, ticket) = parked_word();
    assert_eq!(word.wake(ticket), Claim::Claimed);
    assert!(!word.self_claim(ticket));
}

#[test]
fn must_not_parker_parked_to_runnable() {
    assert!(!is_legal(FiberState::Parked, FiberState::Runnable, Actor::Fiber));
    let msg = panic_message(|| check(FiberState::Parked, FiberState::Runnable, Actor::Fiber));
    assert!(msg.contains("PARKED -> RUNNABLE"), "{msg}");
    assert!(msg.contains("fiber (F)"), "{msg}");
}

#[test]
fn must_not_enqueue_non_runnable() {
    for state in [
        FiberState::Init,
        FiberState::Running,
        FiberState::Parking,
        FiberState::Parked,
        FiberState::Waking,
        FiberState::Done,
        FiberState::Cancelled,
    ] {
        let msg = panic_message(|| check_enqueue(state, Actor::Scheduler));
        assert!(msg.contains(&format!("state {state}")), "{msg}");
        assert!(msg.contains("scheduler queue"), "{msg}");
        assert!(msg.contains("RUNNABLE"), "{msg}");
    }
    check_enqueue(FiberState::Runnable, Actor::Scheduler);
}

#[test]
fn must_not_waker_enqueue_parking() {
    let msg = panic_message(|| check_enqueue(FiberState::Parking, Actor::Waker));
    assert!(msg.contains("PARKING") && msg.contains("waker (W)"), "{msg}");
    // And the waker path itself never claims a PARKING fiber.
    let word = StateWord::new();
    word.transition_to_runnable_from_init();
    word.transition_to_running();
    let ticket = word.transition_to_parking();
    assert_ne!(word.wake(ticket), Claim::Claimed);
}

#[test]
fn illegal_transition_through_the_word_fails_fast() {
    let word = StateWord::new();
    // INIT -> RUNNING skips RUNNABLE: the worker may only run what was queued.
    let msg = panic_message(|| word.transition_to_running());
    assert!(msg.contains("INIT -> RUNNING") && msg.contains("worker (Wk)"), "{msg}");
}

#[test]
fn matrix_rows_are_legal_and_others_are_not() {
    use Actor::*;
    use FiberState::*;
    let legal = [
        (Init, Runnable, Spawner),
        (Runnable, Running, Worker),
        (Running, Runnable, Fiber),
        (Running, Parking, Fiber),
        (Parking, Running, Fiber),
        (Parking, Parked, Worker),
        (Parked, Waking, Fiber),
        (Parked, Waking, Waker),
        (Waking, Runnable, Waker),
        (Parked, Runnable, Waker),
        (Running, Done, Fiber),
        (Running, Cancelled, Fiber),
    ];
    for (from, to, actor) in legal {
        assert!(is_legal(from, to, actor), "{from} -> {to} by {actor} should be legal");
    }
    let illegal = [
        (Parked, Runnable, Fiber),
        (Parking, Runnable, Waker),
        (Init, Running, Worker),
        (Done, Runnable, Waker),
        (Running, Parking, Waker),
        (Waking, Runnable, Fiber),
    ];
    for (from, to, actor) in illegal {
        assert!(
            !is_legal(from, to, actor),
            "{from} -> {to} by {actor} should be illegal"
        );
    }
}
