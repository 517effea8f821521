//! Adversarial (soundness): a pinned fiber resumes only on its home worker
//! (README: pinned fibers may keep references into that thread's
//! thread-locals across parks). Neither a first run that holds the worker
//! past the idle timeout (which drained the home under it) nor shutdown
//! (which resumed fibers on the dropping thread after the home exited)
//! may run it on another thread: there, its references point into a
//! destroyed thread-local.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::{in_child, within};

thread_local! {
    static CACHE: RefCell<Vec<u64>> = RefCell::new(vec![7; 64]);
}

/// A guard of a thread-local cache that reads it when dropped, but only on
/// its home thread (elsewhere the read itself would be the use after free:
/// it records the foreign drop instead).
struct Reader<'a> {
    cache: &'a RefCell<Vec<u64>>,
    home: std::thread::ThreadId,
    foreign_drop: Arc<AtomicBool>,
    sum: Arc<AtomicU64>,
}

impl Drop for Reader<'_> {
    fn drop(&mut self) {
        if std::thread::current().id() != self.home {
            self.foreign_drop.store(true, Ordering::SeqCst);
            return;
        }
        let sum: u64 = self.cache.borrow().iter().sum();
        self.sum.store(sum, Ordering::SeqCst);
    }
}

#[test]
fn a_pinned_fiber_left_at_shutdown_is_never_resumed_off_its_home_thread() {
    in_child(
        "a_pinned_fiber_left_at_shutdown_is_never_resumed_off_its_home_thread",
        60,
        || {
            within(30, || {
                let foreign = Arc::new(AtomicBool::new(false));
                let sum = Arc::new(AtomicU64::new(0));
                let (f2, s2) = (foreign.clone(), sum.clone());
                let rt = fiber::Runtime::builder()
                    .workers(2)
                    .max_workers(2)
                    .shutdown_timeout(Duration::from_millis(200))
                    .build()
                    .unwrap();
                rt.block_on(move || {
                    let m = Arc::new(fiber::sync::Mutex::new(()));
                    // Held for good: the pinned fiber's lock wait never ends
                    // before teardown.
                    std::mem::forget(m.lock().unwrap());
                    let m2 = m.clone();
                    fiber::spawn_pinned(move || {
                        CACHE.with(|c| {
                            let _r = Reader {
                                cache: c,
                                home: std::thread::current().id(),
                                foreign_drop: f2,
                                sum: s2,
                            };
                            let _g = m2.lock();
                        });
                    });
                    fiber::sleep(Duration::from_millis(50)).unwrap();
                });
                drop(rt);
                assert!(
                    !foreign.load(Ordering::SeqCst),
                    "the pinned fiber was resumed (its guard dropped) on another thread"
                );
            });
        },
    );
}

#[test]
fn a_pinned_fiber_whose_first_run_outlasts_the_idle_timeout_stays_on_its_home() {
    within(30, || {
        let rt = fiber::Runtime::builder()
            .workers(1)
            .max_workers(2)
            .idle_timeout(Duration::from_millis(50))
            .build()
            .unwrap();
        let (home, later, sum) = rt.block_on(|| {
            fiber::spawn_pinned(|| {
                CACHE.with(|c| {
                    let home = std::thread::current().id();
                    // The first run holds the worker, with no yield point,
                    // past the idle timeout.
                    std::thread::sleep(Duration::from_millis(400));
                    fiber::sleep(Duration::from_millis(200)).unwrap();
                    let later = std::thread::current().id();
                    let sum: u64 = if later == home { c.borrow().iter().sum() } else { 0 };
                    (home, later, sum)
                })
            })
            .join()
            .unwrap()
        });
        drop(rt);
        assert_eq!(home, later, "a pinned fiber resumed on another thread");
        assert_eq!(sum, 7 * 64);
    })
}
