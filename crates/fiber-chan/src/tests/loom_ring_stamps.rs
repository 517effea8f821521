//! The ring's slot stamps alone carry a value from its sender to its
//! receiver, and the receiver's read back to the next lap's sender, on the
//! production `Ring` with no channel lock around it: the Release stamp
//! store in `Ring::write` pairs with the Acquire stamp load in `pop` (1),
//! and the Release stamp store in `pop` with the Acquire stamp load in
//! `claim` (2).
//!
//! These models run without the loom-only fence of `seqcst_rmw_point`
//! (`without_seqcst_rmw_point`): that fence, placed after every position
//! CAS, also acts as an acquire fence for the stamp load made just before
//! it, so with it loom cannot see either stamp load's Acquire go (the
//! models of `loom_chan.rs` all pass with `pop`'s stamp load Relaxed).
//! Without it, each model fails with a causality violation on the slot
//! once the matching stamp load is Relaxed (checked for both).

use crate::ring::{Pop, Ring};
use crate::sync::without_seqcst_rmw_point;
use loom::thread;
use std::sync::Arc;

/// (1) sender -> receiver through the stamp of one slot.
#[test]
fn loom_ring_stamps_hand_the_value_to_the_receiver() {
    without_seqcst_rmw_point(|| {
        loom::model(|| {
            let ring = Arc::new(Ring::<Box<u64>>::new(1));
            let sender = {
                let ring = ring.clone();
                thread::spawn(move || {
                    let claim = ring.claim(false).unwrap_or_else(|_| panic!("an empty ring has room"));
                    ring.write(claim, &mut Some(Box::new(42)));
                })
            };
            let mut out = None;
            loop {
                match ring.pop(&mut out) {
                    Pop::Value => break,
                    Pop::Empty { .. } | Pop::Busy => thread::yield_now(),
                    Pop::Reserved { .. } => unreachable!("nothing reserves here"),
                }
            }
            assert_eq!(out.as_deref(), Some(&42));
            sender.join().unwrap();
        });
    });
}

/// (2) receiver -> next lap's sender through the stamp of one slot.
#[test]
fn loom_ring_stamps_free_the_slot_for_the_next_lap() {
    without_seqcst_rmw_point(|| {
        loom::model(|| {
            let ring = Arc::new(Ring::<Box<u64>>::new(1));
            let claim = ring.claim(false).unwrap_or_else(|_| panic!("an empty ring has room"));
            ring.write(claim, &mut Some(Box::new(1)));
            let receiver = {
                let ring = ring.clone();
                thread::spawn(move || {
                    let mut out = None;
                    assert!(matches!(ring.pop(&mut out), Pop::Value));
                    assert_eq!(out.as_deref(), Some(&1));
                })
            };
            // The next lap's send: waits while the slot still holds lap 0.
            let claim = loop {
                match ring.claim(false) {
                    Ok(claim) => break claim,
                    Err(_) => thread::yield_now(),
                }
            };
            ring.write(claim, &mut Some(Box::new(2)));
            receiver.join().unwrap();
            let mut out = None;
            assert!(matches!(ring.pop(&mut out), Pop::Value));
            assert_eq!(out.as_deref(), Some(&2));
        });
    });
}
