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

/// Bank counts on this thread from now on, of the scheduler whose frame
/// pool has id `pool` only (a worker registering with its pool). Counts of
/// any other scheduler are taken and given back one by one, so a bank
/// never holds another runtime alive.
pub(crate) fn enable(pool: usize) {
    imp::enable(pool)
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
        /// The frame pool whose scheduler's counts this thread banks (0:
        /// none).
        pool: Cell<usize>,
        /// That scheduler, as `Arc::into_raw` gave it; set with the first
        /// banked count, meaningful while `counts > 0`.
        sched: Cell<Option<NonNull<dyn Schedule>>>,
        /// Strong counts of `sched` that this bank owns.
        counts: Cell<usize>,
    }

    impl Bank {
        /// Does this thread bank counts of `sched`?
        fn banks(&self, sched: &Arc<dyn Schedule>) -> bool {
            let pool = self.pool.get();
            pool != 0 && sched.frames().id == pool
        }

        /// Give `n` banked counts back (all if fewer).
        fn give_back(&self, n: usize) {
            let Some(sched) = self.sched.get() else { return };
            let n = n.min(self.counts.get());
            self.counts.set(self.counts.get() - n);
            for _ in 0..n {
                // SAFETY: `sched` came from `Arc::into_raw`, and the bank
                // owns `counts` strong counts of that `Arc` (each put in by
                // an `into_raw`); this gives one up.
                drop(unsafe { Arc::from_raw(sched.as_ptr().cast_const()) });
            }
        }

        /// Put one strong count, owned by `sched`, into the bank.
        fn deposit(&self, sched: Arc<dyn Schedule>) {
            let raw = Arc::into_raw(sched);
            // SAFETY: `into_raw` never returns null.
            self.sched.set(Some(unsafe { NonNull::new_unchecked(raw.cast_mut()) }));
            self.counts.set(self.counts.get() + 1);
        }
    }

    impl Drop for Bank {
        fn drop(&mut self) {
            // The thread exits without having unregistered.
            self.pool.set(0);
            self.give_back(usize::MAX);
        }
    }

    thread_local! {
        static BANK: Bank = const {
            Bank { pool: Cell::new(0), sched: Cell::new(None), counts: Cell::new(0) }
        };
    }

    pub(super) fn acquire(sched: &Arc<dyn Schedule>) -> Arc<dyn Schedule> {
        let taken = BANK.try_with(|bank| {
            if !bank.banks(sched) {
                return None;
            }
            if bank.counts.get() == 0 {
                for _ in 0..REFILL {
                    bank.deposit(sched.clone());
                }
            }
            let raw = bank.sched.get()?;
            bank.counts.set(bank.counts.get() - 1);
            // SAFETY: `raw` came from `Arc::into_raw` of an `Arc` of
            // `sched`'s allocation (one scheduler per pool), and the bank
            // owned at least one count of it, which it gives to this `Arc`.
            Some(unsafe { Arc::from_raw(raw.as_ptr().cast_const()) })
        });
        match taken {
            Ok(Some(count)) => count,
            _ => sched.clone(),
        }
    }

    pub(super) fn release(sched: Arc<dyn Schedule>) {
        let mut owned = Some(sched);
        let _ = BANK.try_with(|bank| {
            let Some(sched) = owned.take_if(|s| bank.banks(s)) else {
                return;
            };
            bank.deposit(sched);
            if bank.counts.get() > KEEP_MAX {
                bank.give_back(REFILL);
            }
        });
        drop(owned);
    }

    pub(super) fn enable(pool: usize) {
        let _ = BANK.try_with(|bank| {
            if bank.pool.get() != pool {
                // Nothing is banked while the old counts go (their drop
                // may run a scheduler's destructor, which may finish
                // fibers on this thread).
                bank.pool.set(0);
                bank.give_back(usize::MAX);
                bank.pool.set(pool);
            }
        });
    }

    pub(super) fn disable() {
        let _ = BANK.try_with(|bank| {
            bank.pool.set(0);
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
                enable(sched.frames().id);
                for _ in 0..1000 {
                    tx.send(acquire(&sched)).unwrap();
                }
                disable();
            })
        };
        let pool = sched.frames().id;
        let finisher = std::thread::spawn(move || {
            enable(pool);
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
    fn a_bank_holds_counts_of_its_own_pools_scheduler_only() {
        let (a, b) = (TestScheduler::new(), TestScheduler::new());
        let (a, b) = (a.scheduler(), b.scheduler());
        let (base_a, base_b) = (strong(&a), strong(&b));
        std::thread::scope(|s| {
            s.spawn(|| {
                enable(a.frames().id);
                let from_a: Vec<_> = (0..10).map(|_| acquire(&a)).collect();
                assert!(strong(&a) >= base_a + 10, "each frame's count is real");
                // A spawn into another runtime from this worker, and its
                // finish here: one count taken and given back, none banked
                // (a banked count would keep that runtime alive).
                let from_b = acquire(&b);
                assert_eq!(strong(&b), base_b + 1);
                release(from_b);
                assert_eq!(strong(&b), base_b, "no count of another scheduler stays in the bank");
                from_a.into_iter().for_each(release);
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
            enable(moved.frames().id);
            let frame_count = acquire(&moved);
            release(frame_count);
            drop(moved);
        })
        .join()
        .unwrap();
        assert_eq!(strong(&sched), base);
    }
}
