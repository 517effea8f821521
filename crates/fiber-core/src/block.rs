//! Reference-counted join blocks, recycled through per-thread caches.
//!
//! Every `spawn` makes one block that the [`JoinHandle`](crate::JoinHandle),
//! the fiber's frame and the fiber's completion share. With `Arc` each was
//! a fresh allocation, made on the spawner's thread and usually freed on
//! the worker that ran the fiber: a producer-consumer pattern that sends
//! every free of glibc's allocator to the spawner's arena lock, which the
//! spawner's own `malloc`s take too. Here a block of a small task goes
//! back to the freeing thread's cache instead; full caches hand batches to
//! a global list that empty caches take whole (as the frame pool does with
//! frames), and a block too large for the pool's size class is an ordinary
//! allocation.
//!
//! [`BlockArc<T>`] is the typed owner (an `Arc<T>` without weak counts);
//! [`BlockDyn<D>`] is a counted reference to the same block seen through a
//! trait object `D` (what `Arc<T>` to `Arc<dyn D>` gives, which needs an
//! unstable trait on a type of our own).

use crate::sync::{fence, AtomicUsize, Ordering};
use std::alloc::Layout;
use std::marker::PhantomData;
use std::ptr::NonNull;

/// The size class of pooled blocks: a join block of a value up to about
/// 32 bytes fits (the block of `()` is about 190 bytes).
const BLOCK_SIZE: usize = 256;
/// The allocator's own alignment: a block allocated fresh is a plain
/// `malloc` (a larger alignment sends glibc to its much slower `memalign`
/// path, measured 10-20% slower on W1).
const BLOCK_ALIGN: usize = 16;

/// Give the memory of idle join blocks back to the allocator: the blocks
/// that threads handed to the shared free list and that stayed unused
/// since the previous trim, beyond a few (256). A call less than 0.9 s
/// after the previous one frees nothing (every runtime's monitor calls
/// this once a second, and the pool is the process's). Returns how many
/// blocks were freed.
pub fn trim_join_blocks() -> usize {
    trim_join_blocks_at(std::time::Instant::now())
}

/// [`trim_join_blocks`] as of `now` (for a caller with a clock of its own,
/// such as a test on virtual time).
pub fn trim_join_blocks_at(now: std::time::Instant) -> usize {
    pool::trim(now)
}

/// The header every block starts with.
struct Header {
    /// Owners of the block (`BlockArc` and `BlockDyn` alike).
    refs: AtomicUsize,
    /// Drops the value and frees the block; knows the value's type.
    destroy: unsafe fn(NonNull<Header>),
}

#[repr(C)]
struct Cell<T> {
    header: Header,
    value: T,
}

/// Does a `Cell<T>` go to the pool?
pub(crate) const fn pooled<T>() -> bool {
    let layout = Layout::new::<Cell<T>>();
    layout.size() <= BLOCK_SIZE && layout.align() <= BLOCK_ALIGN
}

/// The layout a `Cell<T>` is allocated with.
fn cell_layout<T>() -> Layout {
    if pooled::<T>() {
        pool::LAYOUT
    } else {
        Layout::new::<Cell<T>>()
    }
}

/// The owner of a reference-counted block holding a `T`.
pub(crate) struct BlockArc<T> {
    cell: NonNull<Cell<T>>,
    _owns: PhantomData<Cell<T>>,
}

// As `Arc<T>`: an owner is a pointer, movable whatever `T` is (the value
// itself never moves).
impl<T> Unpin for BlockArc<T> {}

// SAFETY: as `Arc<T>`: the value is shared between the owners (`Sync`) and
// dropped by whichever owner goes last (`Send`).
unsafe impl<T: Send + Sync> Send for BlockArc<T> {}
// SAFETY: as above.
unsafe impl<T: Send + Sync> Sync for BlockArc<T> {}

impl<T> BlockArc<T> {
    /// A block holding `value`, with one owner.
    #[cfg(any(test, loom))]
    pub(crate) fn new(value: T) -> BlockArc<T> {
        let [owner] = BlockArc::new_owners(value);
        owner
    }

    /// A block holding `value`, with `N` owners from the start (one count
    /// store instead of `N - 1` atomic increments).
    pub(crate) fn new_owners<const N: usize>(value: T) -> [BlockArc<T>; N] {
        const { assert!(N > 0) };
        let layout = cell_layout::<T>();
        let raw = if pooled::<T>() {
            pool::take()
        } else {
            // SAFETY: `Cell<T>` has a non-zero size (its header).
            NonNull::new(unsafe { std::alloc::alloc(layout) }).unwrap_or_else(|| std::alloc::handle_alloc_error(layout))
        };
        let cell = raw.cast::<Cell<T>>();
        // SAFETY: `raw` is a fresh allocation of `cell_layout::<T>()`, large
        // and aligned enough for a `Cell<T>` (`pooled` checked it for the
        // pool's size class), and nobody else refers to it.
        unsafe {
            cell.as_ptr().write(Cell {
                header: Header {
                    refs: AtomicUsize::new(N),
                    destroy: destroy::<T>,
                },
                value,
            })
        };
        [(); N].map(|()| BlockArc {
            cell,
            _owns: PhantomData,
        })
    }

    /// This owner, seen as `D` through `view` (as [`erase`](Self::erase),
    /// but the owner's count moves to the view instead of a new one being
    /// taken).
    ///
    /// # Safety
    ///
    /// As [`erase`](Self::erase).
    pub(crate) unsafe fn into_dyn<D: ?Sized>(self, view: fn(*const T) -> *const D) -> BlockDyn<D> {
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: `value` is a field of a live cell.
        let value = unsafe { &raw const (*this.cell.as_ptr()).value };
        BlockDyn {
            header: this.header(),
            // SAFETY: as in `erase`.
            value: unsafe { NonNull::new_unchecked(view(value).cast_mut()) },
        }
    }

    /// A counted reference to the same block, seen as `D` through `view`
    /// (an unsizing cast such as `|t| t as *const dyn Trait`).
    ///
    /// # Safety
    ///
    /// `view` returns the pointer it is given, only unsized (a cast to a
    /// trait object that `T` implements); `D` may claim no auto trait
    /// (`Send`, `Sync`) that `T` lacks.
    pub(crate) unsafe fn erase<D: ?Sized>(&self, view: fn(*const T) -> *const D) -> BlockDyn<D> {
        let header = retain(self.header());
        // SAFETY: `value` is a field of a live cell.
        let value = unsafe { &raw const (*self.cell.as_ptr()).value };
        BlockDyn {
            header,
            // SAFETY: `view` maps the non-null pointer to the value to a
            // pointer to the same value (an unsizing cast; the contract).
            value: unsafe { NonNull::new_unchecked(view(value).cast_mut()) },
        }
    }

    fn header(&self) -> NonNull<Header> {
        self.cell.cast()
    }
}

impl<T> std::ops::Deref for BlockArc<T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: this owner keeps the cell alive; the value is shared
        // read-only (interior mutability is the value's own business).
        unsafe { &(*self.cell.as_ptr()).value }
    }
}

impl<T> Clone for BlockArc<T> {
    fn clone(&self) -> BlockArc<T> {
        retain(self.header());
        BlockArc {
            cell: self.cell,
            _owns: PhantomData,
        }
    }
}

impl<T> Drop for BlockArc<T> {
    fn drop(&mut self) {
        // SAFETY: this owner's count is given up once, here.
        unsafe { release(self.header()) }
    }
}

/// A counted reference to a block, seen through the (unsized) type `D`.
pub(crate) struct BlockDyn<D: ?Sized> {
    header: NonNull<Header>,
    value: NonNull<D>,
}

// SAFETY: made only from a `BlockArc<T>` that is `Send` and `Sync` (its `T`
// is), and `D` is a view of that `T`; `D: Send + Sync` restates it.
unsafe impl<D: ?Sized + Send + Sync> Send for BlockDyn<D> {}
// SAFETY: as above.
unsafe impl<D: ?Sized + Send + Sync> Sync for BlockDyn<D> {}

impl<D: ?Sized> std::ops::Deref for BlockDyn<D> {
    type Target = D;

    fn deref(&self) -> &D {
        // SAFETY: this reference keeps the block alive; `value` points into it.
        unsafe { self.value.as_ref() }
    }
}

impl<D: ?Sized> Clone for BlockDyn<D> {
    fn clone(&self) -> BlockDyn<D> {
        BlockDyn {
            header: retain(self.header),
            value: self.value,
        }
    }
}

impl<D: ?Sized> Drop for BlockDyn<D> {
    fn drop(&mut self) {
        // SAFETY: this reference's count is given up once, here.
        unsafe { release(self.header) }
    }
}

/// Count one more owner of a live block.
fn retain(header: NonNull<Header>) -> NonNull<Header> {
    // SAFETY: the caller owns a count, so the block is live.
    let refs = unsafe { &(*header.as_ptr()).refs };
    // Relaxed: a new owner is made from an existing one, which already
    // orders everything it saw (as `Arc::clone`).
    let old = refs.fetch_add(1, Ordering::Relaxed);
    if old > isize::MAX as usize {
        // As `Arc`: a count this high means owners were leaked in a loop.
        std::process::abort();
    }
    header
}

/// Give up one owner's count; the last one destroys the block.
///
/// # Safety
///
/// The caller owns a count of the live block and never uses it again.
unsafe fn release(header: NonNull<Header>) {
    // SAFETY: the caller's count keeps the block live until this decrement.
    let (refs, destroy) = unsafe { (&(*header.as_ptr()).refs, (*header.as_ptr()).destroy) };
    // Release: this owner's uses of the value happen before the last
    // owner's destruction, which pairs with it through the Acquire fence.
    if refs.fetch_sub(1, Ordering::Release) != 1 {
        return;
    }
    // Acquire: pairs with every other owner's Release decrement.
    fence(Ordering::Acquire);
    // SAFETY: this was the last count: nobody else refers to the block.
    unsafe { destroy(header) }
}

/// Drop the value of a `Cell<T>` and free the block.
///
/// # Safety
///
/// `header` is the header of a `Cell<T>` with no owners left.
unsafe fn destroy<T>(header: NonNull<Header>) {
    let cell = header.cast::<Cell<T>>();
    // Free the block even if the value's destructor panics.
    struct Free<T>(NonNull<Cell<T>>);
    impl<T> Drop for Free<T> {
        fn drop(&mut self) {
            let raw = self.0.cast::<u8>();
            if pooled::<T>() {
                // SAFETY: the block came from `pool::take` and its value
                // is dropped (or being unwound past).
                unsafe { pool::give(raw) }
            } else {
                // SAFETY: allocated in `BlockArc::new` with this layout.
                unsafe { std::alloc::dealloc(raw.as_ptr(), cell_layout::<T>()) }
            }
        }
    }
    let _free = Free(cell);
    // SAFETY: no owner is left (the function's contract); the value is
    // dropped once, here.
    unsafe { std::ptr::drop_in_place(&raw mut (*cell.as_ptr()).value) };
}

/// The pool of free blocks of the size class (under loom, plain
/// allocations: the models check the counts, not the cache).
#[cfg(loom)]
mod pool {
    use super::{BLOCK_ALIGN, BLOCK_SIZE};
    use std::alloc::Layout;
    use std::ptr::NonNull;

    pub(super) const LAYOUT: Layout = match Layout::from_size_align(BLOCK_SIZE, BLOCK_ALIGN) {
        Ok(layout) => layout,
        Err(_) => panic!("block layout"),
    };

    pub(super) fn take() -> NonNull<u8> {
        // SAFETY: `LAYOUT` has a non-zero size.
        NonNull::new(unsafe { std::alloc::alloc(LAYOUT) }).unwrap_or_else(|| std::alloc::handle_alloc_error(LAYOUT))
    }

    pub(crate) fn trim(_now: std::time::Instant) -> usize {
        0
    }

    /// # Safety
    ///
    /// `block` came from `take` and is no longer used.
    pub(super) unsafe fn give(block: NonNull<u8>) {
        // SAFETY: allocated by `take` with `LAYOUT`.
        unsafe { std::alloc::dealloc(block.as_ptr(), LAYOUT) }
    }
}

#[cfg(not(loom))]
mod pool {
    use super::{BLOCK_ALIGN, BLOCK_SIZE};
    use std::alloc::Layout;
    use std::cell::RefCell;
    use std::ptr::NonNull;
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    pub(super) const LAYOUT: Layout = match Layout::from_size_align(BLOCK_SIZE, BLOCK_ALIGN) {
        Ok(layout) => layout,
        Err(_) => panic!("block layout"),
    };
    /// Blocks in a batch handed between a thread and the global list.
    const BATCH: usize = 32;
    /// Batches the global list keeps at most (131,072 blocks, 32 MiB), so
    /// that a program that spawns a burst of that many fibers and joins
    /// them reuses the burst's blocks in the next (W1 went from about 210
    /// to 170 ns a fiber). `trim` gives them back once the bursts stop.
    const GLOBAL_BATCHES: usize = 4096;
    /// Batches `trim` leaves in the global list (256 blocks).
    const TRIM_KEEP: usize = 8;
    /// The least time between two trims that free.
    const TRIM_GAP: Duration = Duration::from_millis(900);

    /// A free block, linked through its first word.
    struct Free {
        next: Option<NonNull<Free>>,
    }

    /// A singly linked list of free blocks.
    struct List {
        head: Option<NonNull<Free>>,
        len: usize,
    }

    // SAFETY: a list owns its free blocks outright; nothing else refers to
    // them, so it may move to another thread.
    unsafe impl Send for List {}

    impl List {
        const EMPTY: List = List { head: None, len: 0 };

        fn push(&mut self, block: NonNull<u8>) {
            let node = block.cast::<Free>();
            // SAFETY: the block is free, ours, and large and aligned
            // enough for a `Free`.
            unsafe { node.as_ptr().write(Free { next: self.head }) };
            self.head = Some(node);
            self.len += 1;
        }

        fn pop(&mut self) -> Option<NonNull<u8>> {
            let node = self.head?;
            // SAFETY: every node of the list is a free block `push` wrote.
            self.head = unsafe { (*node.as_ptr()).next };
            self.len -= 1;
            Some(node.cast())
        }

        /// Free every block to the allocator.
        fn free_all(&mut self) {
            while let Some(block) = self.pop() {
                // SAFETY: every block of a list was allocated with `LAYOUT`.
                unsafe { std::alloc::dealloc(block.as_ptr(), LAYOUT) }
            }
        }
    }

    /// The free list shared by all threads: full batches given up by
    /// threads, taken whole by threads whose cache ran dry.
    struct Shared {
        state: Mutex<State>,
    }

    struct State {
        /// Full batches, taken from and given to the end.
        batches: Vec<List>,
        /// The fewest batches the list held since the last trim: the
        /// first `low` batches sat unused all that time.
        low: usize,
        /// When the last trim freed (or found nothing to free).
        last_trim: Option<Instant>,
    }

    impl Shared {
        const fn new() -> Shared {
            Shared {
                state: Mutex::new(State {
                    batches: Vec::new(),
                    // No trim yet: everything counts as unused.
                    low: usize::MAX,
                    last_trim: None,
                }),
            }
        }

        fn state(&self) -> std::sync::MutexGuard<'_, State> {
            // Nothing panics while holding the lock (a push after its
            // `reserve`, a pop, a drain; an allocation failure aborts).
            self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
        }

        /// Keep `list` (or free it if the list is full).
        fn hand_over(&self, mut list: List) {
            if list.len == 0 {
                return;
            }
            let mut state = self.state();
            if state.batches.len() < GLOBAL_BATCHES {
                state.batches.reserve(1);
                state.batches.push(list);
            } else {
                drop(state);
                list.free_all();
            }
        }

        fn take_batch(&self) -> Option<List> {
            let mut state = self.state();
            let batch = state.batches.pop()?;
            state.low = state.low.min(state.batches.len());
            Some(batch)
        }

        /// Free the batches that went unused since the last trim, beyond
        /// `TRIM_KEEP`; a call less than `TRIM_GAP` after the last one
        /// does nothing (several runtimes' monitors call it). Returns how
        /// many blocks were freed.
        fn trim(&self, now: Instant) -> usize {
            let surplus: Vec<List> = {
                let mut state = self.state();
                // A `now` before the last trim (a caller's clock of its own)
                // starts a new period: a clock once far ahead must not stop
                // every later trim.
                if state
                    .last_trim
                    .and_then(|last| now.checked_duration_since(last))
                    .is_some_and(|since| since < TRIM_GAP)
                {
                    return 0;
                }
                state.last_trim = Some(now);
                let unused = state.low.min(state.batches.len());
                let free = unused.saturating_sub(TRIM_KEEP);
                // The unused batches are the oldest, at the front.
                let surplus = state.batches.drain(..free).collect();
                state.low = state.batches.len();
                surplus
            };
            let mut freed = 0;
            for mut list in surplus {
                freed += list.len;
                list.free_all();
            }
            freed
        }
    }

    static GLOBAL: Shared = Shared::new();

    pub(crate) fn trim(now: Instant) -> usize {
        GLOBAL.trim(now)
    }

    /// A thread's cache: blocks are taken from and given to `active`; a
    /// full `active` becomes `spare` (and an older spare goes to the global
    /// list), so that a thread alternating takes and gives at a batch
    /// boundary does not bounce batches through the global list.
    struct Local {
        active: List,
        spare: List,
    }

    impl Drop for Local {
        fn drop(&mut self) {
            // The thread is exiting: its blocks go to the global list (or
            // back to the allocator if that is full).
            for list in [&mut self.active, &mut self.spare] {
                let list = std::mem::replace(list, List::EMPTY);
                GLOBAL.hand_over(list);
            }
        }
    }

    thread_local! {
        static LOCAL: RefCell<Local> = const {
            RefCell::new(Local { active: List::EMPTY, spare: List::EMPTY })
        };
    }

    /// A free block of `LAYOUT`.
    pub(super) fn take() -> NonNull<u8> {
        let cached = LOCAL
            .try_with(|local| {
                let mut local = local.borrow_mut();
                if let Some(block) = local.active.pop() {
                    return Some(block);
                }
                if local.spare.len > 0 {
                    let spare = std::mem::replace(&mut local.spare, List::EMPTY);
                    local.active = spare;
                } else {
                    local.active = GLOBAL.take_batch()?;
                }
                local.active.pop()
            })
            .ok()
            .flatten();
        cached.unwrap_or_else(|| {
            // SAFETY: `LAYOUT` has a non-zero size.
            NonNull::new(unsafe { std::alloc::alloc(LAYOUT) }).unwrap_or_else(|| std::alloc::handle_alloc_error(LAYOUT))
        })
    }

    /// Give back a block of `take`.
    ///
    /// # Safety
    ///
    /// `block` came from `take` and nothing uses it any more.
    pub(super) unsafe fn give(block: NonNull<u8>) {
        let kept = LOCAL.try_with(|local| {
            let mut local = local.borrow_mut();
            local.active.push(block);
            if local.active.len == BATCH {
                let full = std::mem::replace(&mut local.active, List::EMPTY);
                let older = std::mem::replace(&mut local.spare, full);
                drop(local);
                GLOBAL.hand_over(older);
            }
        });
        if kept.is_err() {
            // The thread's cache is gone (thread exit): straight back.
            // SAFETY: allocated with `LAYOUT` (the function's contract).
            unsafe { std::alloc::dealloc(block.as_ptr(), LAYOUT) }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        fn fresh_batch() -> List {
            let mut list = List::EMPTY;
            for _ in 0..BATCH {
                // SAFETY: `LAYOUT` has a non-zero size.
                let block = unsafe { std::alloc::alloc(LAYOUT) };
                list.push(NonNull::new(block).expect("allocation"));
            }
            list
        }

        fn drain_all(shared: &Shared) {
            for mut list in shared.state().batches.drain(..) {
                list.free_all();
            }
        }

        #[test]
        fn trim_frees_the_batches_unused_since_the_last_trim_beyond_a_few() {
            let shared = Shared::new();
            let t0 = Instant::now();
            let batches = 4 * TRIM_KEEP;
            for _ in 0..batches {
                shared.hand_over(fresh_batch());
            }
            // The first trim: nothing was seen in use.
            assert_eq!(shared.trim(t0), (batches - TRIM_KEEP) * BATCH);
            assert_eq!(shared.state().batches.len(), TRIM_KEEP);
            // Batches handed over in a period are new, not unused: kept
            // by the trim that ends it.
            for _ in 0..batches {
                shared.hand_over(fresh_batch());
            }
            let period = TRIM_GAP + Duration::from_millis(1);
            assert_eq!(shared.trim(t0 + period), 0);
            // A steady trickle: the next period takes a batch and gives one
            // back, so a take happened; what stayed unused below the
            // lowest point, beyond the kept few, goes all the same.
            let taken = shared.take_batch().expect("a batch");
            shared.hand_over(taken);
            let len = shared.state().batches.len();
            assert_eq!(len, TRIM_KEEP + batches);
            assert_eq!(shared.trim(t0 + 2 * period), (len - 1 - TRIM_KEEP) * BATCH);
            assert_eq!(shared.state().batches.len(), TRIM_KEEP + 1);
            // Too soon after a trim: nothing.
            shared.hand_over(fresh_batch());
            assert_eq!(shared.trim(t0 + 2 * period + Duration::from_millis(5)), 0);
            // A trim with a clock far ahead does not stop the later ones
            // (a `now` before the last trim starts a new period).
            assert!(
                shared.trim(t0 + 1000 * period) > 0,
                "the batch unused since the last trim goes"
            );
            shared.hand_over(fresh_batch());
            let _ = shared.take_batch();
            shared.hand_over(fresh_batch());
            shared.hand_over(fresh_batch());
            assert!(shared.trim(t0) > 0, "a clock behind the last trim still trims");
            drain_all(&shared);
        }

        #[test]
        fn a_full_shared_list_frees_what_it_is_handed() {
            let shared = Shared::new();
            for _ in 0..GLOBAL_BATCHES + 2 {
                shared.hand_over(fresh_batch());
            }
            assert_eq!(shared.state().batches.len(), GLOBAL_BATCHES);
            drain_all(&shared);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize as StdAtomicUsize;

    struct Counted<'a>(&'a StdAtomicUsize, [u64; 2]);

    impl Drop for Counted<'_> {
        fn drop(&mut self) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    trait Name {
        fn name(&self) -> u64;
    }

    impl Name for Counted<'_> {
        fn name(&self) -> u64 {
            self.1[0]
        }
    }

    #[test]
    fn the_last_owner_of_either_kind_drops_the_value_once() {
        let drops = StdAtomicUsize::new(0);
        let a = BlockArc::new(Counted(&drops, [7, 0]));
        let b = a.clone();
        // SAFETY: an unsizing cast of a `Counted`, which is `Name`.
        let d = unsafe { a.erase(|t| t as *const dyn Name) };
        drop(a);
        drop(b);
        assert_eq!(d.name(), 7, "the erased reference still sees the value");
        assert_eq!(drops.load(std::sync::atomic::Ordering::Relaxed), 0);
        let d2 = d.clone();
        drop(d);
        assert_eq!(drops.load(std::sync::atomic::Ordering::Relaxed), 0);
        drop(d2);
        assert_eq!(drops.load(std::sync::atomic::Ordering::Relaxed), 1);
    }

    #[test]
    fn owners_made_together_and_moved_into_views_count_once_each() {
        let drops = StdAtomicUsize::new(0);
        let [a, b, c] = BlockArc::new_owners(Counted(&drops, [3, 0]));
        // SAFETY: as above.
        let view = unsafe { c.into_dyn(|t| t as *const dyn Name) };
        drop(a);
        drop(b);
        assert_eq!(view.name(), 3);
        assert_eq!(drops.load(std::sync::atomic::Ordering::Relaxed), 0);
        drop(view);
        assert_eq!(drops.load(std::sync::atomic::Ordering::Relaxed), 1);
    }

    #[test]
    fn blocks_freed_on_another_thread_come_back_through_the_global_list() {
        // Blocks made here and freed on another thread reach the global
        // list in batches and are taken again here: the values stay
        // intact across reuse (each block holds its own number).
        for round in 0..4u64 {
            let blocks: Vec<_> = (0..200u64).map(|i| BlockArc::new([round, i, !i])).collect();
            let moved = std::thread::spawn(move || {
                blocks
                    .iter()
                    .enumerate()
                    .all(|(i, b)| **b == [round, i as u64, !(i as u64)])
            })
            .join()
            .unwrap();
            assert!(moved, "round {round}: a block's value changed");
        }
    }

    #[test]
    fn a_value_larger_than_the_size_class_is_an_ordinary_allocation() {
        assert!(!pooled::<[u8; 4096]>());
        assert!(pooled::<[u64; 4]>());
        let big = BlockArc::new([9u8; 4096]);
        let again = big.clone();
        drop(big);
        assert!(again.iter().all(|&b| b == 9));
    }

    #[test]
    fn a_panicking_destructor_still_frees_the_block() {
        struct Boom;
        impl Drop for Boom {
            fn drop(&mut self) {
                panic!("boom");
            }
        }
        let block = BlockArc::new(Boom);
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(block)));
        assert!(caught.is_err(), "the destructor's panic reaches the owner");
        // The freed block is reusable.
        let next = BlockArc::new([1u64; 4]);
        assert_eq!(*next, [1u64; 4]);
    }
}

#[cfg(loom)]
mod loom_tests {
    use super::*;
    use crate::sync::UnsafeCell;

    /// A value whose destructor reads what the owners wrote.
    struct Written(UnsafeCell<u64>, crate::sync::Arc<crate::sync::AtomicUsize>);

    impl Drop for Written {
        fn drop(&mut self) {
            // SAFETY: the last owner drops the value: every other owner's
            // write happened before (loom reports a race otherwise).
            let seen = self.0.with(|v| unsafe { *v });
            self.1.store(seen as usize, Ordering::Relaxed);
        }
    }

    // SAFETY: the cell is written by one owner at a time in the model
    // below, and read only by the destructor.
    unsafe impl Sync for Written {}

    /// The reference count: an owner's writes to the value happen before
    /// the destruction by whichever owner goes last, on either thread and
    /// through either kind of reference. Fails (a race on the cell, loom's
    /// causality check) if `release` decrements Relaxed or skips its
    /// Acquire fence.
    #[test]
    fn loom_the_last_owner_sees_every_owners_writes() {
        loom::model(|| {
            let seen = crate::sync::Arc::new(crate::sync::AtomicUsize::new(0));
            let block = BlockArc::new(Written(UnsafeCell::new(0), seen.clone()));
            // SAFETY: the identity view.
            let other = unsafe { block.erase(|w| w) };
            let t = loom::thread::spawn(move || {
                // SAFETY: this thread is the only writer until it drops
                // its reference; the main thread writes nothing.
                other.0.with_mut(|v| unsafe { *v = 7 });
                drop(other);
            });
            drop(block);
            t.join().unwrap();
            assert_eq!(
                seen.load(Ordering::Relaxed),
                7,
                "the value was dropped before the write or not at all"
            );
        });
    }
}
