//! RwLock: shared readers, exclusive writers, from fibers, threads and
//! both; writers not starved by readers; poisoning.

mod common;

use common::{everywhere, go, join_all, runtime, thread, until, within};
use fiber_sync::RwLock;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, TryLockError};

#[test]
fn rwlock_readers_share_writers_exclude() {
    everywhere(|| {
        let lock = Arc::new(RwLock::new(0usize));
        let handles: Vec<_> = (0..6)
            .map(|i| {
                let lock = lock.clone();
                let work = move || {
                    for _ in 0..500 {
                        if i % 3 == 0 {
                            let mut w = lock.write().unwrap();
                            let v = *w;
                            if fiber_core::in_fiber() {
                                let _ = fiber_core::yield_now();
                            }
                            *w = v + 1;
                        } else {
                            let r = lock.read().unwrap();
                            let v = *r;
                            if fiber_core::in_fiber() {
                                let _ = fiber_core::yield_now();
                            }
                            assert_eq!(*r, v, "a writer ran inside a read section");
                        }
                    }
                };
                if i % 2 == 0 {
                    thread(work)
                } else {
                    go(work)
                }
            })
            .collect();
        join_all(handles);
        assert_eq!(*lock.read().unwrap(), 2 * 500);
    });
}

#[test]
fn rwlock_two_readers_at_once() {
    everywhere(|| {
        let lock = Arc::new(RwLock::new(1));
        let r1 = lock.read().unwrap();
        let other = {
            let lock = lock.clone();
            go(move || *lock.read().unwrap())
        };
        assert_eq!(other.join(), 1, "a second reader got in while the first held");
        assert!(matches!(lock.try_write(), Err(TryLockError::WouldBlock)));
        drop(r1);
        *lock.try_write().unwrap() = 2;
        let mut lock = Arc::try_unwrap(lock).unwrap();
        *lock.get_mut().unwrap() += 1;
        assert_eq!(lock.into_inner().unwrap(), 3);
    });
}

/// A stream of overlapping readers (each takes a new read lock while
/// another reader still holds one) never lets the count of readers reach
/// zero; a writer must still get in. The readers stop only once the
/// writer has written, so a starved writer is a hang (caught by the
/// watchdog), not a slow test.
#[test]
fn rwlock_writer_not_starved_by_readers() {
    within(|| {
        runtime().block_on(|| {
            let lock = Arc::new(RwLock::new(0u32));
            let written = Arc::new(AtomicBool::new(false));
            let reads = Arc::new(AtomicUsize::new(0));
            let readers: Vec<_> = (0..4)
                .map(|i| {
                    let (lock, written, reads) = (lock.clone(), written.clone(), reads.clone());
                    let work = move || {
                        while !written.load(Ordering::SeqCst) {
                            let _r = lock.read().unwrap();
                            reads.fetch_add(1, Ordering::SeqCst);
                            if fiber_core::in_fiber() {
                                let _ = fiber_core::yield_now();
                            } else {
                                std::thread::yield_now();
                            }
                        }
                    };
                    if i == 0 {
                        thread(work)
                    } else {
                        go(work)
                    }
                })
                .collect();
            until(|| reads.load(Ordering::SeqCst) > 100);
            *lock.write().unwrap() = 1;
            written.store(true, Ordering::SeqCst);
            join_all(readers);
            assert_eq!(*lock.read().unwrap(), 1);
        })
    });
}

#[test]
fn rwlock_poisoned_by_a_panicking_writer_not_a_reader() {
    everywhere(|| {
        let lock = Arc::new(RwLock::new(0));
        let l2 = lock.clone();
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            go(move || {
                let _r = l2.read().unwrap();
                panic!("reader panics");
            })
            .join()
        }));
        assert!(!lock.is_poisoned());
        let l3 = lock.clone();
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            go(move || {
                let _w = l3.write().unwrap();
                panic!("writer panics");
            })
            .join()
        }));
        assert!(lock.is_poisoned());
        assert!(lock.read().is_err());
        assert!(matches!(lock.try_write(), Err(TryLockError::Poisoned(_))));
        lock.clear_poison();
        assert_eq!(*lock.read().unwrap(), 0);
    });
}

/// The rule behind "writers are not starved": once a writer waits, a
/// reader that arrives later queues behind it (`try_read` refuses, `read`
/// gets in only after the writer), even while other readers hold the lock.
#[test]
fn rwlock_reader_arriving_after_a_waiting_writer_goes_after_it() {
    everywhere(|| {
        let lock = Arc::new(RwLock::new(Vec::new()));
        let first = lock.read().unwrap();
        let writer = {
            let lock = lock.clone();
            go(move || lock.write().unwrap().push("writer"))
        };
        // The writer is queued once a new reader is refused.
        until(|| lock.try_read().is_err());
        let reader = {
            let lock = lock.clone();
            go(move || {
                let seen = lock.read().unwrap().clone();
                seen
            })
        };
        drop(first);
        let seen = join_all(vec![reader]).pop().unwrap();
        join_all(vec![writer]);
        assert_eq!(seen, ["writer"], "the later reader got in before the waiting writer");
    });
}
