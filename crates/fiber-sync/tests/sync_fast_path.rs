//! The uncontended fast paths do not allocate (a counting global
//! allocator watches one thread's lock/unlock loop).

use fiber_sync::{Condvar, Mutex, OnceLock, RwLock, Semaphore};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Counting;

thread_local! {
    static ALLOCS: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations(f: impl FnOnce()) -> usize {
    let before = ALLOCS.with(Cell::get);
    f();
    ALLOCS.with(Cell::get) - before
}

#[test]
fn uncontended_operations_do_not_allocate() {
    let m = Mutex::new(0u64);
    let rw = RwLock::new(0u64);
    let sem = Semaphore::new(2);
    let once = OnceLock::new();
    once.set(1u8).unwrap();
    // The counter works: one box is one allocation.
    assert_eq!(allocations(|| drop(std::hint::black_box(Box::new(7u8)))), 1);
    // Warm up thread-locals (panic count, ...) outside the measurement.
    drop(m.lock());
    let n = allocations(|| {
        for _ in 0..1000 {
            *m.lock().unwrap() += 1;
            drop(m.try_lock());
            *rw.write().unwrap() += 1;
            let a = rw.read().unwrap();
            let b = rw.read().unwrap();
            assert_eq!(*a, *b);
            drop((a, b));
            let p = sem.acquire().unwrap();
            drop(sem.try_acquire());
            drop(p);
            assert_eq!(once.get(), Some(&1));
        }
    });
    assert_eq!(n, 0, "the uncontended fast paths allocated {n} times");
}

/// `Mutex`, `RwLock`, `Condvar` and `OnceLock` construct in statics, as
/// std's do.
#[test]
fn const_constructors_work_in_statics() {
    static COUNT: Mutex<u32> = Mutex::new(0);
    static TABLE: RwLock<Vec<u8>> = RwLock::new(Vec::new());
    static READY: Condvar = Condvar::new();
    static NAME: OnceLock<&str> = OnceLock::new();
    *COUNT.lock().unwrap() += 1;
    TABLE.write().unwrap().push(1);
    READY.notify_all();
    assert_eq!(*NAME.get_or_init(|| "fiber"), "fiber");
    assert_eq!((*COUNT.lock().unwrap(), TABLE.read().unwrap().len()), (1, 1));
}
