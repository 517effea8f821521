//! Adversarial: channel edges found by review. A channel iterator is fused
//! (std's `FusedIterator` contract) even when its `None` came from a
//! cancelled receive, after which the channel may still deliver.

use fiber::chan::unbounded;

use crate::common::{ms, rt, within};

#[test]
fn iter_is_fused_even_after_a_with_timeout_cancellation() {
    within(20, || {
        rt().block_on(|| {
            let (tx, rx) = unbounded::<u32>();
            let mut it = rx.iter();
            let mut first = Some(99);
            let _ = fiber::with_timeout(ms(30), || first = it.next());
            assert_eq!(first, None, "the cancelled step yields None");
            tx.send(1).unwrap();
            assert_eq!(it.next(), None, "Iter is FusedIterator but yielded again after None");
            // The value is still in the channel for the next receive.
            assert_eq!(rx.try_recv(), Ok(1));
        })
    })
}

// Through `Iterator::fuse()`, which trusts a `FusedIterator` and adds no
// guard of its own.
#[test]
fn iter_fuse_adapter_stops_after_the_first_none() {
    within(20, || {
        rt().block_on(|| {
            let (tx, rx) = unbounded::<u32>();
            let mut it = rx.iter().fuse();
            let mut first = Some(99);
            let _ = fiber::with_timeout(ms(30), || first = it.next());
            assert_eq!(first, None);
            tx.send(1).unwrap();
            assert_eq!(it.next(), None, "`.fuse()` yielded after None");
        })
    })
}

#[test]
fn into_iter_is_fused_after_a_with_timeout_cancellation() {
    within(20, || {
        rt().block_on(|| {
            let (tx, rx) = unbounded::<u32>();
            let mut it = rx.into_iter();
            let mut first = Some(99);
            let _ = fiber::with_timeout(ms(30), || first = it.next());
            assert_eq!(first, None);
            tx.send(1).unwrap();
            assert_eq!(
                it.next(),
                None,
                "IntoIter is FusedIterator but yielded again after None"
            );
        })
    })
}

// A capacity that cannot be allocated is a panic naming it, not an
// arithmetic overflow inside the channel (or an abort).
#[test]
fn bounded_with_an_impossible_capacity_panics_naming_it() {
    for cap in [usize::MAX, usize::MAX / 2, isize::MAX as usize] {
        let msg = crate::common::panic_message(|| {
            let _ = fiber::chan::bounded::<u64>(cap);
        })
        .expect("bounded panics");
        assert!(
            msg.contains("capacity is too large") && msg.contains(&cap.to_string()),
            "{msg}"
        );
        // One line of prose (a wrapped string literal once kept its
        // indentation: "8 bytes              each").
        assert!(!msg.contains("  "), "{msg:?}");
    }
    // A large but possible one works.
    let (tx, rx) = fiber::chan::bounded::<u8>(1 << 16);
    tx.send(1).unwrap();
    assert_eq!(rx.recv(), Ok(1));
}

/// crossbeam-channel writes its errors' `Display` through `str`'s, which
/// honours width, fill and precision (`{:>40}`, `{:.9}`); so do ours (they
/// ignored them).
#[test]
fn error_display_honours_width_and_precision() {
    use fiber::chan::{RecvError, RecvTimeoutError, SendError, TryRecvError, TrySendError};
    assert_eq!(
        format!("[{:>50}]", RecvError),
        "[    receiving on an empty and disconnected channel]"
    );
    assert_eq!(format!("[{:.9}]", TryRecvError::Empty), "[receiving]");
    assert_eq!(
        format!("[{:>36}]", SendError(1u8)),
        "[   sending on a disconnected channel]"
    );
    assert_eq!(
        format!("[{:<26}]", TrySendError::Full(1u8)),
        "[sending on a full channel ]"
    );
    assert_eq!(format!("[{:*^9.7}]", RecvTimeoutError::Timeout), "[*timed o*]");
}
