//! `fiber::sync::Condvar` waits that end in odd places: an unwind out of
//! the wait before it released its mutex. std's `Condvar::wait` takes the
//! guard, so such an unwind must release the mutex (poisoned, as the
//! guard's drop would), never leave it locked with no guard to unlock it.

use crate::common::{ms, within};
use fiber::sync::{Condvar, Mutex, TryLockError};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;

/// A user `CancelScope` (public: `fiber::core::swap_cancel_scope`) whose
/// `is_cancelled` panics at its `n`-th call.
struct PanicsAt {
    calls: AtomicUsize,
    n: usize,
}

impl fiber::core::CancelScope for PanicsAt {
    fn is_cancelled(&self) -> bool {
        if self.calls.fetch_add(1, SeqCst) + 1 == self.n {
            panic!("is_cancelled panics at call {}", self.n);
        }
        false
    }
}

/// The first calls of `is_cancelled` in a condvar wait come before the
/// wait releases its mutex (the wait's own look for cancellation, then
/// the park's). A panic there unwound with the mutex locked and its guard
/// forgotten: the mutex stayed locked for ever and was not poisoned. Now
/// the wait's unwind releases it, poisoned; a panic at a later call, once
/// the mutex was released, leaves it released.
#[test]
fn a_panic_inside_a_condvar_wait_never_leaves_its_mutex_locked() {
    within(60, || {
        let rt = crate::common::rt_fixed_grace(2, ms(200));
        let outcomes = rt.block_on(|| {
            (1..=4)
                .map(|n| {
                    fiber::spawn(move || {
                        let pair = Arc::new((Mutex::new(false), Condvar::new()));
                        let p = pair.clone();
                        let notifier = fiber::spawn(move || {
                            fiber::sleep(ms(20)).unwrap();
                            *p.0.lock().unwrap_or_else(|e| e.into_inner()) = true;
                            p.1.notify_all();
                        });
                        let previous = fiber::core::swap_cancel_scope(Some(Arc::new(PanicsAt {
                            calls: AtomicUsize::new(0),
                            n,
                        })));
                        let waited = std::panic::catch_unwind(|| {
                            let (m, cv) = &*pair;
                            let g = m.lock().unwrap();
                            let _g = cv.wait_while(g, |ready| !*ready);
                        });
                        fiber::core::swap_cancel_scope(previous);
                        let locked = matches!(pair.0.try_lock(), Err(TryLockError::WouldBlock));
                        notifier.join().unwrap();
                        (n, waited.is_err(), locked)
                    })
                })
                .collect::<Vec<_>>()
                .into_iter()
                .map(|h| h.join().unwrap())
                .collect::<Vec<_>>()
        });
        for (n, panicked, locked) in &outcomes {
            assert!(
                !locked,
                "panic at call {n}: the mutex stayed locked after the wait (panicked: {panicked})"
            );
        }
        assert!(
            outcomes.iter().any(|&(_, panicked, _)| panicked),
            "some call panicked inside the wait: {outcomes:?}"
        );
    });
}
