//! Per-thread banks of scheduler reference counts.
//!
//! Every live fiber's frame owns a strong count of its scheduler's `Arc`
//! (so that a scheduler outlives every fiber it may still run). Taking and
//! giving back that count at every spawn and finish is an atomic
//! read-modify-write of one word that all workers share: in spawn-join
//! the spawner's worker increments it and the worker that ran the fiber
//! decrements it, so the line holding the count moves between the two
//! cores twice per fiber. A worker thread instead keeps a bank of counts
//! of its scheduler: a spawn takes one from the bank (refilled 32 at a
//! time), a finish deposits one (the bank gives 32 back above 64). The
//! counts are real strong counts throughout, owned by a frame or by a
//! bank, so the scheduler is dropped exactly as before, once the banks are
//! empty: a bank is emptied when its thread unregisters from its pool
//! ([`FramePool::unregister_thread`](crate::FramePool::unregister_thread),
//! which workers call before they exit) or exits.

use crate::sched::Schedule;
use crate::sync::Arc;

/// Take a strong count of `sched` for a frame.
#[inline]
pub(crate) fn acquire(sched: &Arc<dyn Schedule>) -> Arc<dyn Schedule> {
    imp::acquire(sched)
}

/// Give back a frame's strong count of its scheduler.
#[inline]
pub(crate) fn release(sched: Arc<dyn Schedule>) {
    imp::release(sched)
}

/// Bank counts on this thread from now on (a worker registering with its
/// pool).
pub(crate) fn enable() {
    imp::enable()
}

/// Stop banking on this thread and give every banked count back.
pub(crate) fn disable() {
    imp::disable()
}

mod imp {
    use super::*;
    use std::cell::Cell;
    use std::ptr::NonNull;

    /// Counts taken at once when the bank is empty.
    const REFILL: usize = 32;
    /// Counts a bank keeps at most; above this it gives `REFILL` back.
    const KEEP_MAX: usize = 64;

    struct Bank {
        enabled: Cell<bool>,
        /// The scheduler whose counts the bank holds (as `Arc::as_ptr`
        /// gives it); meaningful only while `counts > 0`.
        sched: Cell<Option<NonNull<dyn Schedule>>>,
        /// Strong counts of `sched` that this bank owns.
        counts: Cell<usize>,
    }

    impl Bank {
        /// Does the bank hold counts of `sched`'s allocation?
        fn holds(&self, sched: &Arc<dyn Schedule>) -> bool {
            self.counts.get() > 0
                && self
                    .sched
                    .get()
                    .is_some_and(|p| std::ptr::addr_eq(p.as_ptr(), Arc::as_ptr(sched)))
        }

        /// Give `n` banked counts back.
        fn give_back(&self, n: usize) {
            let Some(sched) = self.sched.get() else { return };
            let n = n.min(self.counts.get());
            self.counts.set(self.counts.get() - n);
            for _ in 0..n {
                // SAFETY: the bank owns `counts` strong counts of the `Arc`
                // that `sched` points into (taken by `acquire`'s refill or
                // deposited by `release`); this gives one up.
                drop(unsafe { Arc::from_raw(sched.as_ptr().cast_const()) });
            }
        }
    }

    impl Drop for Bank {
        fn drop(&mut self) {
            // The thread exits without having unregistered.
            self.give_back(usize::MAX);
        }
    }

    thread_local! {
        static BANK: Bank = const {
            Bank { enabled: Cell::new(false), sched: Cell::new(None), counts: Cell::new(0) }
        };
    }

    pub(super) fn acquire(sched: &Arc<dyn Schedule>) -> Arc<dyn Schedule> {
        let banked = BANK.try_with(|bank| {
            if !bank.enabled.get() {
                return false;
            }
            if !bank.holds(sched) {
                // Counts of another scheduler (or none): start over with
                // this one.
                bank.give_back(usize::MAX);
                for _ in 0..REFILL {
                    std::mem::forget(Arc::clone(sched));
                }
                bank.sched.set(Some(NonNull::from(&**sched)));
                bank.counts.set(REFILL);
            }
            bank.counts.set(bank.counts.get() - 1);
            true
        });
        if banked == Ok(true) {
            // SAFETY: the bank owned at least one strong count of `sched`'s
            // allocation (`holds`, or the refill just above) and gave it
            // up to this `Arc`.
            unsafe { Arc::from_raw(Arc::as_ptr(sched)) }
        } else {
            sched.clone()
        }
    }

    pub(super) fn release(sched: Arc<dyn Schedule>) {
        let mut owned = Some(sched);
        let _ = BANK.try_with(|bank| {
            let Some(sched) = owned.as_ref() else { return };
            if !bank.enabled.get() {
                return;
            }
            if !bank.holds(sched) {
                if bank.counts.get() > 0 {
                    // Another scheduler's counts: leave them.
                    return;
                }
                bank.sched.set(Some(NonNull::from(&**sched)));
            }
            // The count moves into the bank.
            std::mem::forget(owned.take());
            bank.counts.set(bank.counts.get() + 1);
            if bank.counts.get() > KEEP_MAX {
                bank.give_back(REFILL);
            }
        });
        drop(owned);
    }

    pub(super) fn enable() {
        let _ = BANK.try_with(|bank| bank.enabled.set(true));
    }

    pub(super) fn disable() {
        let _ = BANK.try_with(|bank| {
            bank.enabled.set(false);
            bank.give_back(usize::MAX);
        });
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::testing::TestScheduler;

    fn strong(sched: &Arc<dyn Schedule>) -> usize {
        Arc::strong_count(sched)
    }

    #[test]
    fn counts_stay_real_and_come_back_when_the_thread_unregisters() {
        let test = TestScheduler::new();
        let sched = test.scheduler();
        let base = strong(&sched);
        // Not enabled: a plain clone and drop.
        let plain = acquire(&sched);
        assert_eq!(strong(&sched), base + 1);
        release(plain);
        assert_eq!(strong(&sched), base);

        // A spawner thread and a finisher thread, both banking: the counts
        // a frame holds are real strong counts wherever they are.
        let (tx, rx) = std::sync::mpsc::channel::<Arc<dyn Schedule>>();
        let spawner = {
            let sched = sched.clone();
            std::thread::spawn(move || {
                enable();
                for _ in 0..1000 {
                    tx.send(acquire(&sched)).unwrap();
                }
                disable();
            })
        };
        let finisher = std::thread::spawn(move || {
            enable();
            let mut n = 0;
            for frame_count in rx {
                release(frame_count);
                n += 1;
            }
            disable();
            n
        });
        spawner.join().unwrap();
        assert_eq!(finisher.join().unwrap(), 1000);
        // Both banks gave their counts back (the spawner's clone is gone).
        assert_eq!(strong(&sched), base);
    }

    #[test]
    fn a_bank_holds_counts_of_one_scheduler_and_switches_cleanly() {
        let (a, b) = (TestScheduler::new(), TestScheduler::new());
        let (a, b) = (a.scheduler(), b.scheduler());
        let (base_a, base_b) = (strong(&a), strong(&b));
        std::thread::scope(|s| {
            s.spawn(|| {
                enable();
                let from_a: Vec<_> = (0..10).map(|_| acquire(&a)).collect();
                assert!(strong(&a) >= base_a + 10, "each frame's count is real");
                let from_b: Vec<_> = (0..10).map(|_| acquire(&b)).collect();
                from_a.into_iter().for_each(release);
                from_b.into_iter().for_each(release);
                disable();
            });
        });
        assert_eq!((strong(&a), strong(&b)), (base_a, base_b));
    }

    #[test]
    fn a_thread_that_exits_without_unregistering_gives_its_counts_back() {
        let test = TestScheduler::new();
        let sched = test.scheduler();
        let base = strong(&sched);
        let moved = sched.clone();
        std::thread::spawn(move || {
            enable();
            let frame_count = acquire(&moved);
            release(frame_count);
            drop(moved);
        })
        .join()
        .unwrap();
        assert_eq!(strong(&sched), base);
    }
}
