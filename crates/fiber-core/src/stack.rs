//! Fiber stacks: carved from large slabs, each with a hardware guard below
//! it (page-table guard regions where the kernel has them, `mprotect` guard
//! pages within the mapping budget where it does not), and a deliberate,
//! configurable policy beyond that.
//!
//! # Guard regimes
//!
//! 1. **Page-table guards** (Linux 6.13 and later). `madvise(MADV_GUARD_INSTALL)`
//!    marks the gap below each stack as a guard region in the page tables:
//!    touching it raises SIGSEGV, and it needs no mapping (VMA) of its own,
//!    so `vm.max_map_count` does not limit how many stacks are guarded. A
//!    slab is one read-write mapping; the gap below each stack is guarded
//!    when the stack is carved. Support is detected once per process, on a
//!    scratch mapping (`EINVAL` means the kernel does not know the advice).
//!    Guard markers survive `MADV_DONTNEED` (checked by
//!    `guard_markers_survive_dontneed`), so giving a stack's pages back keeps
//!    its guard.
//! 2. **`mprotect` guard pages** (older kernels). Linux limits a process to
//!    `vm.max_map_count` mappings (65,530 by default); a stack whose gap is
//!    `PROT_NONE` costs two. At first use we read the limit and the mappings
//!    in use, keep [`MAP_HEADROOM`] for the rest of the process, and allow
//!    `(limit - used - headroom) / 2` such stacks, process-wide.
//! 3. **Beyond the budget on an older kernel**, [`UnguardedPolicy`] decides:
//!    `Refuse` (the default) fails the spawn with an [`io::Error`] saying
//!    why; `Allow` carves stacks from plain read-write slabs with a
//!    [`RED_ZONE`] below each, prints a one-time notice, and checks the stack
//!    pointer and the red zone's top at every switch. Only this regime uses
//!    the switch-time check; a guarded stack relies on its guard.
//!
//! Every regime reports an overflow as `fiber <id> has overflowed its stack`
//! and aborts: guard hits through the SIGSEGV handler in `guard`, the
//! unguarded regime at the fiber's next switch.
//!
//! # Giving memory back
//!
//! [`StackAllocator::recycle`] takes a stack whose fiber finished, hands its
//! pages back to the kernel (`MADV_DONTNEED` on the usable part; guards are
//! untouched) and keeps it on a free list that [`StackAllocator::allocate`]
//! serves first, so the address range is reused and no new mapping is made.
//! The frame pool's `trim` calls it for idle frames beyond its watermark;
//! beyond `FREE_CAP` (1,024) recycled stacks are dropped (a slab is unmapped with
//! its last stack).
//!
//! # Layout
//!
//! ```text
//! | gap | usable (size) | gap | usable | ...      low -> high addresses
//! ```
//!
//! The gap is [`RED_ZONE`] bytes (at least a page): a guard region, a
//! `PROT_NONE` guard, or (unguarded regime) a red zone. Stacks grow down:
//! `limit` is the low end of the usable part, `base` its high end.

use crate::sync::{lock, Arc, Mutex};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicU8, Ordering};
use std::sync::OnceLock;

/// Default usable stack size of a fiber: generous, because real code
/// (DEFLATE, formatting, deep parsers) needs real stacks; demand paging keeps
/// resident memory to the pages actually touched. 256 KiB in an optimized
/// build; 1 MiB when this crate is built with debug assertions (a `cargo
/// test` or `cargo run` without `--release`), where unoptimized code gives
/// every temporary its own stack slot and needs several times the stack:
/// a 32 KiB message sent by value through a channel and received takes
/// about 450 KiB there (the caller's own frame 128 to 192 KiB of it), and
/// about 100 KiB in a release build.
pub const DEFAULT_STACK_SIZE: usize = if cfg!(debug_assertions) {
    1024 * 1024
} else {
    256 * 1024
};

/// Smallest accepted stack size: the fiber entry, a panic being caught and a
/// formatted message need about this much.
pub const MIN_STACK_SIZE: usize = 16 * 1024;

/// Largest accepted stack size (1 GiB), to catch unit mistakes.
pub const MAX_STACK_SIZE: usize = 1 << 30;

/// Stacks carved from one slab. Larger slabs mean fewer `mmap` calls (costly
/// on virtual machines); smaller ones less address space held per slab.
const SLAB_STACKS: usize = 64;

/// The gap below each stack (rounded up to a whole page): a guard region in
/// the guarded regimes, a red zone in the unguarded one, so that an
/// overflow of less than this lands in the gap, not in a neighbour's stack.
/// (Rust's stack probes touch every page of a large frame, so a frame
/// cannot jump a guard.)
pub const RED_ZONE: usize = 16 * 1024;

/// Bytes at the top of the red zone that must stay zero (checked at every
/// switch of a fiber on an unguarded stack).
const RED_ZONE_CHECK: usize = 64;

/// Recycled stacks kept on the free list; beyond this they are dropped.
const FREE_CAP: usize = 1024;

/// Mappings kept for everything else in the process (heap arenas, thread
/// stacks, libraries, the application's own maps).
pub const MAP_HEADROOM: usize = 8192;

/// Kernel default for `vm.max_map_count`, used when `/proc` is unreadable.
const DEFAULT_MAX_MAP_COUNT: usize = 65_530;

/// `madvise` advice installing guard regions (Linux 6.13; the same value on
/// every architecture). Defined here because older `libc` releases lack it.
const MADV_GUARD_INSTALL: libc::c_int = 102;

fn page_size() -> usize {
    static PAGE: OnceLock<usize> = OnceLock::new();
    *PAGE.get_or_init(|| {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if page > 0 {
            page as usize
        } else {
            4096
        }
    })
}

/// The gap below each stack: [`RED_ZONE`] rounded up to whole pages.
fn gap_size() -> usize {
    RED_ZONE.div_ceil(page_size()) * page_size()
}

/// Page-table guard support: 0 unknown, 1 supported, 2 not supported.
static GUARD_INSTALL: AtomicU8 = AtomicU8::new(0);

/// Does the kernel support `MADV_GUARD_INSTALL`? Probed once per process
/// on a scratch mapping.
pub fn page_table_guards_supported() -> bool {
    // Relaxed: a cached probe result; both racers compute the same answer.
    match GUARD_INSTALL.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => {
            let supported = probe_guard_install();
            let _ =
                GUARD_INSTALL.compare_exchange(0, if supported { 1 } else { 2 }, Ordering::Relaxed, Ordering::Relaxed);
            GUARD_INSTALL.load(Ordering::Relaxed) == 1
        }
    }
}

fn probe_guard_install() -> bool {
    // Under valgrind the advice reaches the kernel but valgrind does not
    // know the guard markers and faults on them itself; `mprotect` guard
    // pages (which it does model) keep the program checkable there.
    if running_under_valgrind() {
        return false;
    }
    let page = page_size();
    // SAFETY: an anonymous private mapping at an address of the kernel's
    // choosing aliases no existing memory; it is unmapped below.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            2 * page,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return false;
    }
    // SAFETY: the advice applies to the first page of our own scratch
    // mapping, which nothing else uses.
    let rc = unsafe { libc::madvise(ptr, page, MADV_GUARD_INSTALL) };
    // SAFETY: exactly the mapping made above.
    unsafe {
        libc::munmap(ptr, 2 * page);
    }
    rc == 0
}

/// Is this process running under valgrind (its preload library is in
/// `LD_PRELOAD`)?
fn running_under_valgrind() -> bool {
    std::env::var_os("LD_PRELOAD").is_some_and(|v| v.to_string_lossy().contains("vgpreload"))
}

/// Tests: make the next stack allocations of this thread fail.
#[cfg(test)]
pub(crate) mod tests_hook {
    use std::cell::Cell;

    thread_local! {
        static FAIL_NEXT: Cell<usize> = const { Cell::new(0) };
    }

    /// Fail the next `n` calls of `StackAllocator::allocate` on this thread.
    pub(crate) fn fail_next_allocations(n: usize) {
        FAIL_NEXT.with(|f| f.set(n));
    }

    pub(super) fn take_injected_failure() -> bool {
        FAIL_NEXT.with(|f| {
            let n = f.get();
            f.set(n.saturating_sub(1));
            n > 0
        })
    }
}

/// Tests: behave as on a kernel without `MADV_GUARD_INSTALL` from now on
/// (the `mprotect` and unguarded regimes). Affects stacks carved later.
#[cfg(test)]
pub(crate) fn pretend_old_kernel() {
    GUARD_INSTALL.store(2, Ordering::Relaxed);
}

/// Process-wide count of `mprotect`-guarded stacks still allowed.
fn guard_budget() -> &'static AtomicIsize {
    static BUDGET: OnceLock<AtomicIsize> = OnceLock::new();
    BUDGET.get_or_init(|| {
        let limit = std::fs::read_to_string("/proc/sys/vm/max_map_count")
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .unwrap_or(DEFAULT_MAX_MAP_COUNT);
        let used = std::fs::read_to_string("/proc/self/maps")
            .map(|s| s.lines().count())
            .unwrap_or(0);
        let free = limit.saturating_sub(used).saturating_sub(MAP_HEADROOM);
        AtomicIsize::new((free / 2) as isize)
    })
}

/// How many more guarded stacks the process may create (diagnostics):
/// `usize::MAX` with page-table guards, else the `mprotect` budget left.
pub fn guarded_stacks_left() -> usize {
    if page_table_guards_supported() {
        return usize::MAX;
    }
    guard_budget().load(Ordering::Relaxed).max(0) as usize
}

static NOTICE_PRINTED: AtomicBool = AtomicBool::new(false);

fn print_unguarded_notice() {
    if !NOTICE_PRINTED.swap(true, Ordering::Relaxed) {
        eprintln!(
            "fiber: notice: no hardware guard is available for further fiber stacks (this kernel lacks \
             MADV_GUARD_INSTALL and the guard-page budget of vm.max_map_count, or the configured cap, \
             is used up); FIBER_UNGUARDED=allow is set, so they run unguarded and are overflow-checked \
             at every switch instead. Raise the limit (sysctl -w vm.max_map_count=<larger>) or use \
             Linux 6.13 or later to keep every stack guarded."
        );
    }
}

/// What happens to a spawn that would need a stack when no hardware guard
/// is available: only on kernels without `MADV_GUARD_INSTALL`, once the
/// `vm.max_map_count` budget (or [`StackConfig::max_guarded`]) is used up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UnguardedPolicy {
    /// The spawn fails with an [`io::Error`] saying why (the default): no
    /// fiber ever runs without a hardware guard.
    #[default]
    Refuse,
    /// The stack has a red zone instead, checked at every switch of its
    /// fiber; a one-time notice says so. An overflow that skips the red zone
    /// and returns before the next switch can corrupt a neighbouring stack.
    Allow,
}

impl UnguardedPolicy {
    /// Parse `refuse` or `allow` (the `FIBER_UNGUARDED` spelling).
    pub fn parse(s: &str) -> Option<UnguardedPolicy> {
        match s.trim().to_ascii_lowercase().as_str() {
            "refuse" => Some(UnguardedPolicy::Refuse),
            "allow" => Some(UnguardedPolicy::Allow),
            _ => None,
        }
    }
}

/// Stack settings shared by every stack of one runtime.
#[derive(Clone, Copy, Debug)]
pub struct StackConfig {
    /// Usable bytes per stack (rounded up to whole pages).
    pub size: usize,
    /// Cap on guarded stacks for this allocator (`None`: no cap beyond the
    /// kernel's). `Some(0)` means no stack is guarded, which tests use to
    /// exercise the unguarded policy.
    pub max_guarded: Option<usize>,
    /// What to do when a stack cannot be guarded.
    pub unguarded: UnguardedPolicy,
}

impl Default for StackConfig {
    fn default() -> Self {
        StackConfig {
            size: DEFAULT_STACK_SIZE,
            max_guarded: None,
            unguarded: UnguardedPolicy::Refuse,
        }
    }
}

impl StackConfig {
    /// Validate the settings.
    pub fn validate(&self) -> Result<(), String> {
        if self.size < MIN_STACK_SIZE {
            return Err(format!(
                "stack size {} is below the minimum of {} bytes",
                self.size, MIN_STACK_SIZE
            ));
        }
        if self.size > MAX_STACK_SIZE {
            return Err(format!(
                "stack size {} is above the maximum of {} bytes",
                self.size, MAX_STACK_SIZE
            ));
        }
        Ok(())
    }
}

/// How the stacks of one slab are guarded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Read-write slab; each gap is a `MADV_GUARD_INSTALL` guard region.
    PageTable = 0,
    /// `PROT_NONE` reserve; each usable part made read-write when carved.
    Mprotect = 1,
    /// Read-write slab; each gap is a red zone.
    Unguarded = 2,
}

/// One `mmap` region that stacks are carved from.
#[derive(Debug)]
struct Slab {
    start: usize,
    len: usize,
    kind: Kind,
    /// `mprotect` guard budget this slab holds (given back on unmap).
    budget: isize,
    /// Its slot in the overflow handler's table (`guard::register`), if
    /// it has one.
    guard_slot: Option<usize>,
}

impl Drop for Slab {
    fn drop(&mut self) {
        if let Some(slot) = self.guard_slot {
            guard::unregister(slot, self.start);
        }
        // SAFETY: `start..start+len` is exactly the mapping made in
        // `Slab::map`, and every stack carved from it holds an `Arc<Slab>`,
        // so none is in use any more.
        unsafe {
            libc::munmap(self.start as *mut libc::c_void, self.len);
        }
        if self.budget > 0 {
            guard_budget().fetch_add(self.budget, Ordering::Relaxed);
        }
    }
}

impl Slab {
    fn map(len: usize, kind: Kind) -> io::Result<Slab> {
        let prot = if kind == Kind::Mprotect {
            libc::PROT_NONE
        } else {
            libc::PROT_READ | libc::PROT_WRITE
        };
        // SAFETY: an anonymous private mapping at an address of the kernel's
        // choosing aliases no existing memory.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Slab {
            start: ptr as usize,
            len,
            kind,
            budget: if kind == Kind::Mprotect {
                SLAB_STACKS as isize
            } else {
                0
            },
            guard_slot: None,
        })
    }
}

/// A slab being carved, and how far.
#[derive(Debug, Default)]
struct Cursor {
    slab: Option<Arc<Slab>>,
    next: usize,
}

/// The slabs being carved (one per kind) and how many guarded stacks this
/// allocator made.
#[derive(Debug, Default)]
struct Carver {
    cursors: [Cursor; 3],
    guarded_made: usize,
}

/// Hands out fiber stacks for one runtime.
#[derive(Debug)]
pub struct StackAllocator {
    size: usize,
    gap: usize,
    max_guarded: Option<usize>,
    policy: UnguardedPolicy,
    carver: Mutex<Carver>,
    /// Recycled stacks (pages given back), served before carving.
    free: crossbeam_queue::SegQueue<FiberStack>,
    /// See [`may_refuse`](Self::may_refuse) (fixed at creation).
    may_refuse: bool,
}

impl StackAllocator {
    /// An allocator for `config` (validated by the caller).
    pub fn new(config: StackConfig) -> StackAllocator {
        let page = page_size();
        StackAllocator {
            size: config.size.div_ceil(page) * page,
            gap: gap_size(),
            max_guarded: config.max_guarded,
            policy: config.unguarded,
            carver: Mutex::new(Carver::default()),
            free: crossbeam_queue::SegQueue::new(),
            may_refuse: config.unguarded == UnguardedPolicy::Refuse
                && (config.max_guarded.is_some() || !page_table_guards_supported()),
        }
    }

    /// Usable bytes per stack.
    pub fn stack_size(&self) -> usize {
        self.size
    }

    /// Can [`allocate`](Self::allocate) refuse a stack for want of a guard
    /// (a cap on guarded stacks, or a kernel without `MADV_GUARD_INSTALL`
    /// whose `mprotect` budget can run out), under the refusing policy?
    /// Otherwise only the kernel's refusal of memory fails it.
    pub fn may_refuse(&self) -> bool {
        self.may_refuse
    }

    /// A stack: a recycled one if any, else a new one with a page-table
    /// guard, else (older kernels) an `mprotect` guard within the budget,
    /// else what the [`UnguardedPolicy`] says (an error, or an unguarded
    /// stack after a one-time notice).
    pub fn allocate(&self) -> io::Result<FiberStack> {
        #[cfg(test)]
        if tests_hook::take_injected_failure() {
            return Err(io::Error::other("injected stack mapping failure (test)"));
        }
        if let Some(mut stack) = self.free.pop() {
            stack.recycled = true;
            return Ok(stack);
        }
        let mut carver = lock(&self.carver);
        let capped = self.max_guarded.is_some_and(|max| carver.guarded_made >= max);
        if !capped {
            let kind = if page_table_guards_supported() {
                Kind::PageTable
            } else {
                Kind::Mprotect
            };
            if let Some(stack) = self.carve(&mut carver, kind)? {
                carver.guarded_made += 1;
                return Ok(stack);
            }
        }
        match self.policy {
            UnguardedPolicy::Refuse => Err(io::Error::other(format!(
                "fiber stack refused: no hardware guard is available for another stack ({}); \
                 raise vm.max_map_count, run on Linux 6.13 or later, or set FIBER_UNGUARDED=allow \
                 to run further fibers on unguarded stacks checked at every switch",
                if capped {
                    "the configured cap on guarded stacks is reached"
                } else {
                    "this kernel lacks MADV_GUARD_INSTALL and the vm.max_map_count guard-page budget is used up"
                }
            ))),
            UnguardedPolicy::Allow => {
                print_unguarded_notice();
                Ok(self
                    .carve(&mut carver, Kind::Unguarded)?
                    .expect("unguarded stacks need no budget"))
            }
        }
    }

    /// Carve the next stack of `kind`, mapping a new slab when needed;
    /// `None` when the `mprotect` budget is used up.
    fn carve(&self, carver: &mut Carver, kind: Kind) -> io::Result<Option<FiberStack>> {
        let stride = self.size + self.gap;
        let cursor = &mut carver.cursors[kind as usize];
        if cursor.slab.is_none() || cursor.next == SLAB_STACKS {
            let budget = guard_budget();
            // Relaxed: a counter; the budget is advisory, never a protocol.
            if kind == Kind::Mprotect
                && budget.fetch_sub(SLAB_STACKS as isize, Ordering::Relaxed) < SLAB_STACKS as isize
            {
                budget.fetch_add(SLAB_STACKS as isize, Ordering::Relaxed);
                return Ok(None);
            }
            let mut slab = match Slab::map(stride * SLAB_STACKS, kind) {
                Ok(slab) => slab,
                Err(e) => {
                    if kind == Kind::Mprotect {
                        budget.fetch_add(SLAB_STACKS as isize, Ordering::Relaxed);
                    }
                    return Err(e);
                }
            };
            if kind != Kind::Unguarded {
                slab.guard_slot = guard::register(slab.start, slab.len, stride, self.gap, self.size);
            }
            cursor.slab = Some(Arc::new(slab));
            cursor.next = 0;
        }
        let slab = cursor.slab.clone().expect("slab was just mapped");
        let gap_start = slab.start + cursor.next * stride;
        let low = gap_start + self.gap;
        let rc = match kind {
            // SAFETY: `gap_start..low` lies inside the slab (index <
            // SLAB_STACKS) and is carved exactly once; no stack uses it.
            Kind::PageTable => unsafe { libc::madvise(gap_start as *mut libc::c_void, self.gap, MADV_GUARD_INSTALL) },
            // SAFETY: `low..low+size` lies inside the slab and is carved
            // exactly once, so no live stack uses it.
            Kind::Mprotect => unsafe {
                libc::mprotect(low as *mut libc::c_void, self.size, libc::PROT_READ | libc::PROT_WRITE)
            },
            Kind::Unguarded => 0,
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        cursor.next += 1;
        Ok(Some(FiberStack {
            base: low + self.size,
            limit: low,
            guarded: kind != Kind::Unguarded,
            recycled: false,
            _slab: slab,
        }))
    }

    /// A stack of its own with at least `size` usable bytes (up to
    /// [`MAX_STACK_SIZE`]), for a spawn that asks for more than this
    /// allocator's size. Guarded like the others (a page-table guard, else
    /// an `mprotect` guard within the budget, else what the
    /// [`UnguardedPolicy`] says); its mapping is unmapped with the stack.
    pub fn allocate_dedicated(&self, size: usize) -> io::Result<FiberStack> {
        if size > MAX_STACK_SIZE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("fiber stack size {size} is above the maximum of {MAX_STACK_SIZE} bytes"),
            ));
        }
        let size = size.div_ceil(page_size()) * page_size();
        let kind = if page_table_guards_supported() {
            Kind::PageTable
        } else if guard_budget().fetch_sub(1, Ordering::Relaxed) >= 1 {
            // Relaxed: an advisory counter, as in `carve`.
            Kind::Mprotect
        } else {
            guard_budget().fetch_add(1, Ordering::Relaxed);
            match self.policy {
                UnguardedPolicy::Refuse => {
                    return Err(io::Error::other(
                        "fiber stack refused: no hardware guard is available for another stack; \
                         raise vm.max_map_count, run on Linux 6.13 or later, or set FIBER_UNGUARDED=allow",
                    ))
                }
                UnguardedPolicy::Allow => {
                    print_unguarded_notice();
                    Kind::Unguarded
                }
            }
        };
        let stride = size + self.gap;
        let mut slab = match Slab::map(stride, kind) {
            Ok(slab) => slab,
            Err(e) => {
                if kind == Kind::Mprotect {
                    guard_budget().fetch_add(1, Ordering::Relaxed);
                }
                return Err(e);
            }
        };
        slab.budget = if kind == Kind::Mprotect { 1 } else { 0 };
        let low = slab.start + self.gap;
        let rc = match kind {
            // SAFETY: `start..low` is the gap at the bottom of this new
            // mapping, used by nothing.
            Kind::PageTable => unsafe { libc::madvise(slab.start as *mut libc::c_void, self.gap, MADV_GUARD_INSTALL) },
            // SAFETY: `low..low+size` is the usable part of this new
            // mapping, used by nothing yet.
            Kind::Mprotect => unsafe {
                libc::mprotect(low as *mut libc::c_void, size, libc::PROT_READ | libc::PROT_WRITE)
            },
            Kind::Unguarded => 0,
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        if kind != Kind::Unguarded {
            slab.guard_slot = guard::register(slab.start, slab.len, stride, self.gap, size);
        }
        Ok(FiberStack {
            base: low + size,
            limit: low,
            guarded: kind != Kind::Unguarded,
            recycled: false,
            _slab: Arc::new(slab),
        })
    }

    /// Take back a stack no fiber runs on: its pages go back to the kernel
    /// (`MADV_DONTNEED` on the usable part; a guard stays installed) and
    /// the stack waits on a free list for the next [`allocate`](Self::allocate).
    pub fn recycle(&self, stack: FiberStack) {
        stack.release_pages();
        if self.free.len() < FREE_CAP {
            self.free.push(stack);
        }
        // Beyond the cap the stack is dropped: its pages are gone already,
        // and its slab is unmapped with the slab's last stack.
    }

    /// Drop every stack this allocator keeps for later (the recycled ones)
    /// and the slabs it is carving, for an allocator whose runtime has shut
    /// down: each slab is unmapped once its last stack is gone. A later
    /// [`allocate`](Self::allocate) would map a new slab.
    pub fn release_unused(&self) {
        while self.free.pop().is_some() {}
        let cursors = std::mem::take(&mut lock(&self.carver).cursors);
        drop(cursors);
    }

    /// [`recycle`](Self::recycle) many stacks at once: neighbours carved
    /// from the same page-table-guarded or unguarded slab give their pages
    /// back in one `madvise` call (each call costs a TLB shootdown).
    pub fn recycle_many(&self, mut stacks: Vec<FiberStack>) {
        stacks.sort_unstable_by_key(|stack| stack.limit);
        let mut i = 0;
        while i < stacks.len() {
            let first = &stacks[i];
            // One mapping per such slab; an mprotect slab is many.
            let one_mapping = first._slab.kind != Kind::Mprotect;
            let mut j = i + 1;
            while one_mapping
                && j < stacks.len()
                && Arc::ptr_eq(&stacks[j]._slab, &first._slab)
                && stacks[j].limit == stacks[j - 1].base + self.gap
            {
                j += 1;
            }
            // SAFETY: `first.limit..stacks[j - 1].base` covers the usable
            // parts of stacks i..j, all held by value here (no fiber runs on
            // them), and the gaps between them, each the gap below one of
            // those stacks (guard markers survive MADV_DONTNEED; a red zone
            // is zero anyway).
            unsafe {
                libc::madvise(
                    first.limit as *mut libc::c_void,
                    stacks[j - 1].base - first.limit,
                    libc::MADV_DONTNEED,
                );
            }
            i = j;
        }
        for stack in stacks {
            if self.free.len() < FREE_CAP {
                self.free.push(stack);
            }
        }
    }

    /// Recycled stacks waiting for reuse (diagnostics).
    pub fn free_stacks(&self) -> usize {
        self.free.len()
    }
}

/// One fiber stack (usable range `limit..base`).
#[derive(Debug)]
pub struct FiberStack {
    base: usize,
    limit: usize,
    guarded: bool,
    recycled: bool,
    _slab: Arc<Slab>,
}

impl FiberStack {
    /// Does this stack have a hardware guard below it?
    pub fn is_guarded(&self) -> bool {
        self.guarded
    }

    /// Usable bytes.
    pub fn size(&self) -> usize {
        self.base - self.limit
    }

    /// Did this stack come from the free list rather than a fresh carve?
    pub fn was_recycled(&self) -> bool {
        self.recycled
    }

    /// Bounds used by the switch-time overflow check.
    pub(crate) fn bounds(&self) -> StackBounds {
        StackBounds {
            limit: self.limit,
            guarded: self.guarded,
        }
    }

    /// Give the usable part's pages back to the kernel; they read as zero
    /// when touched again. Guard regions survive `MADV_DONTNEED`, and
    /// `mprotect` guards and red zones lie outside the range.
    fn release_pages(&self) {
        // SAFETY: `limit..base` is this stack's own read-write range; holding
        // the `FiberStack` by reference outside any coroutine means no fiber
        // runs on it (a coroutine owns its stack while it exists), so nothing
        // reads the discarded contents.
        unsafe {
            libc::madvise(
                self.limit as *mut libc::c_void,
                self.base - self.limit,
                libc::MADV_DONTNEED,
            );
        }
    }
}

// SAFETY: `base` and `limit` delimit a read-write region owned by this value
// alone (carved once from a slab that lives as long as any of its stacks);
// `base` is page-aligned, which satisfies STACK_ALIGNMENT.
unsafe impl corosensei::stack::Stack for FiberStack {
    fn base(&self) -> corosensei::stack::StackPointer {
        corosensei::stack::StackPointer::new(self.base).expect("stack base is not null")
    }

    fn limit(&self) -> corosensei::stack::StackPointer {
        corosensei::stack::StackPointer::new(self.limit).expect("stack limit is not null")
    }
}

/// What the switch-time check needs to know about a stack.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct StackBounds {
    limit: usize,
    guarded: bool,
}

impl StackBounds {
    /// Has the fiber running on this stack overflowed it? `sp` is an address
    /// on the current stack. Only the unguarded regime checks (stack
    /// pointer below the limit, or the red zone's top no longer zero);
    /// guarded stacks fault on their guard instead, so they always pass.
    #[inline]
    pub(crate) fn overflowed(&self, sp: usize) -> bool {
        if self.guarded || self.limit == 0 {
            return false;
        }
        if sp < self.limit {
            return true;
        }
        let words = RED_ZONE_CHECK / std::mem::size_of::<u64>();
        let top = (self.limit - RED_ZONE_CHECK) as *const u64;
        (0..words).any(|i| {
            // SAFETY: the red zone lies inside the unguarded slab's RW mapping
            // (`carve` leaves a gap of at least RED_ZONE bytes below `limit`),
            // so this read is in bounds; volatile because other code never
            // writes it legitimately and the compiler must not assume so.
            unsafe { std::ptr::read_volatile(top.add(i)) != 0 }
        })
    }
}

/// Reporting a hit on a fiber's guard (PITFALLS 7): a SIGSEGV/SIGBUS
/// handler, running on the thread's alternate signal stack (std gives every
/// thread one), looks the faulting address up in a fixed table of guarded
/// slabs; in the gap below a stack (a page-table guard region or an
/// `mprotect` guard) it prints `fiber <id> has overflowed its stack` with the
/// stack size and how to raise it, and aborts. Every other fault is passed
/// to the handler that was installed before ours, called directly, so ours
/// stays installed; when that was the default action, the default action is
/// restored and the fault re-executes (the process dies of it, as it would
/// without us). Everything the handler touches is async-signal-safe:
/// atomics, a stack buffer, `write(2)` and `sigaction(2)`.
mod guard {
    use std::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};
    use std::sync::OnceLock;

    /// Guarded slabs the table can hold (about 4.2 million live stacks).
    /// Past it, a newer stack's overflow still faults on its guard, but is
    /// reported as a plain SIGSEGV (a one-time notice says so).
    const SLOTS: usize = 65_536;

    struct Entry {
        start: AtomicUsize,
        len: AtomicUsize,
        stride: AtomicUsize,
        gap: AtomicUsize,
        size: AtomicUsize,
        /// Bumped by each `register` of the slot before it writes the
        /// fields: a handler that read the fields of a slot freed and taken
        /// again meanwhile (an old `len` with a new `start`) sees it
        /// changed and ignores what it read.
        generation: AtomicUsize,
    }

    #[allow(clippy::declare_interior_mutable_const)]
    const EMPTY: Entry = Entry {
        generation: AtomicUsize::new(0),
        start: AtomicUsize::new(0),
        len: AtomicUsize::new(0),
        stride: AtomicUsize::new(0),
        gap: AtomicUsize::new(0),
        size: AtomicUsize::new(0),
    };
    static TABLE: [Entry; SLOTS] = [EMPTY; SLOTS];
    /// One past the highest slot ever claimed (the handler scans up to it).
    static HIGH: AtomicUsize = AtomicUsize::new(0);
    /// Where `register` starts looking for a free slot.
    static HINT: AtomicUsize = AtomicUsize::new(0);
    static INSTALLED: OnceLock<()> = OnceLock::new();
    static FULL_WARNED: AtomicBool = AtomicBool::new(false);

    struct Previous {
        segv: libc::sigaction,
        bus: libc::sigaction,
    }

    // SAFETY: written once before any handler can read it (OnceLock), then
    // only read.
    unsafe impl Sync for Previous {}
    // SAFETY: as above.
    unsafe impl Send for Previous {}

    static PREVIOUS: OnceLock<Previous> = OnceLock::new();

    /// Record a guarded region; the slot it took (for `unregister`), or
    /// `None` if the table is full.
    pub(super) fn register(start: usize, len: usize, stride: usize, gap: usize, size: usize) -> Option<usize> {
        install();
        // Relaxed: a search hint only.
        let hint = HINT.load(Ordering::Relaxed);
        for i in (hint..SLOTS).chain(0..hint) {
            let entry = &TABLE[i];
            // The `len` slot claims the entry (usize::MAX: being written);
            // the Release store of the real length publishes the fields to
            // the handler's Acquire load of `len`.
            if entry
                .len
                .compare_exchange(0, usize::MAX, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                // Release: pairs with the Acquire of `lookup`'s first
                // look: a handler that reads the new generation there also
                // sees the slot claimed (its `len` is MAX or the new one).
                entry.generation.fetch_add(1, Ordering::Release);
                // Release fence: pairs with the Acquire fence in `lookup`:
                // a handler that reads any field written below then reads
                // the new generation on its second look.
                fence(Ordering::Release);
                entry.start.store(start, Ordering::Relaxed);
                entry.stride.store(stride, Ordering::Relaxed);
                entry.gap.store(gap, Ordering::Relaxed);
                entry.size.store(size, Ordering::Relaxed);
                // Release: pairs with the handler's Acquire load of HIGH, so
                // a handler that scans up to this slot sees it claimed.
                HIGH.fetch_max(i + 1, Ordering::Release);
                entry.len.store(len, Ordering::Release);
                HINT.store((i + 1) % SLOTS, Ordering::Relaxed);
                return Some(i);
            }
        }
        if !FULL_WARNED.swap(true, Ordering::Relaxed) {
            eprintln!("fiber: notice: guard table full; overflows of newer stacks fault without a fiber message");
        }
        None
    }

    /// Free the slot `register` gave for the region at `start`: O(1) (a
    /// scan up to the highest slot ever used made each unmap cost the size
    /// of the largest burst of stacks the process ever had).
    pub(super) fn unregister(slot: usize, start: usize) {
        let entry = &TABLE[slot];
        // Acquire: pairs with `register`'s Release store of `len`.
        let len = entry.len.load(Ordering::Acquire);
        debug_assert!(
            len != 0 && len != usize::MAX && entry.start.load(Ordering::Relaxed) == start,
            "guard slot {slot} does not hold the region at {start:#x}"
        );
        if len != 0 && len != usize::MAX && entry.start.load(Ordering::Relaxed) == start {
            // Release: the slot is free for the next `register`'s CAS.
            entry.len.store(0, Ordering::Release);
            HINT.store(slot, Ordering::Relaxed);
        }
    }

    fn install() {
        INSTALLED.get_or_init(|| {
            // SAFETY: plain sigaction calls with zeroed, then filled, structs;
            // the previous actions are stored before our handler is active
            // (it is installed by the same calls, and reads PREVIOUS only
            // after a fault, which it handles via the defaults if unset).
            unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = handler as *const () as usize;
                action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
                libc::sigemptyset(&mut action.sa_mask);
                let mut segv: libc::sigaction = std::mem::zeroed();
                let mut bus: libc::sigaction = std::mem::zeroed();
                libc::sigaction(libc::SIGSEGV, std::ptr::null(), &mut segv);
                libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut bus);
                let _ = PREVIOUS.set(Previous { segv, bus });
                libc::sigaction(libc::SIGSEGV, &action, std::ptr::null_mut());
                libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut());
            }
        });
    }

    /// The overflowed stack's size, if `addr` lies in the gap below a stack
    /// of a registered slab.
    pub(super) fn lookup(addr: usize) -> Option<usize> {
        // Acquire: pairs with `register`'s Release of HIGH.
        let high = HIGH.load(Ordering::Acquire).min(SLOTS);
        for entry in &TABLE[..high] {
            // Acquire: pairs with the Release bump in `register` (and
            // keeps the loads below after it); checked again after the
            // fields.
            let generation = entry.generation.load(Ordering::Acquire);
            // Acquire: pairs with `register`'s Release store of `len`.
            let len = entry.len.load(Ordering::Acquire);
            if len == 0 || len == usize::MAX {
                continue;
            }
            let start = entry.start.load(Ordering::Relaxed);
            if addr < start || addr >= start.saturating_add(len) {
                continue;
            }
            let stride = entry.stride.load(Ordering::Relaxed);
            let gap = entry.gap.load(Ordering::Relaxed);
            let size = entry.size.load(Ordering::Relaxed);
            // Acquire fence: pairs with the Release fence in `register`.
            // If the slot was freed and taken again while we read, some
            // field may be the new region's: the generation then differs,
            // and the mix is ignored (an unrelated fault reported as an
            // overflow, or an overflow as a plain SIGSEGV, otherwise).
            fence(Ordering::Acquire);
            if entry.generation.load(Ordering::Relaxed) != generation {
                continue;
            }
            if stride != 0 && (addr - start) % stride < gap {
                return Some(size);
            }
        }
        None
    }

    fn write_all(bytes: &[u8]) {
        // SAFETY: write(2) on fd 2 with a valid buffer is async-signal-safe.
        unsafe {
            libc::write(2, bytes.as_ptr() as *const libc::c_void, bytes.len());
        }
    }

    fn write_number(mut n: u64) {
        let mut buf = [0u8; 20];
        let mut i = buf.len();
        loop {
            i -= 1;
            buf[i] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        write_all(&buf[i..]);
    }

    extern "C" fn handler(signum: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
        // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
        let (addr, code) = unsafe { ((*info).si_addr() as usize, (*info).si_code) };
        // A fault (si_code > 0) at a guard is a fiber overflow; a signal
        // sent by kill(2) or raise(3) (si_code <= 0) never is.
        if code > 0 {
            if let Some(size) = lookup(addr) {
                let id = crate::fiber::current_id_for_signal();
                write_all(b"\nfiber ");
                write_number(id);
                write_all(b" has overflowed its stack\nfatal runtime error: stack overflow (fiber stack size ");
                write_number(size as u64);
                write_all(b" bytes; raise it with Builder::stack_size or FIBER_STACK_SIZE)\n");
                std::process::abort();
            }
        }
        chain(signum, info, context, code);
    }

    /// Pass a fault that is not ours to the action installed before ours.
    fn chain(signum: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void, code: libc::c_int) {
        let previous = PREVIOUS
            .get()
            .map(|p| if signum == libc::SIGBUS { p.bus } else { p.segv });
        let action = previous.map_or(libc::SIG_DFL, |p| p.sa_sigaction);
        if action == libc::SIG_IGN && code <= 0 {
            // A sent signal the program ignores.
            return;
        }
        if action == libc::SIG_DFL || action == libc::SIG_IGN {
            // The default action: restore it and let the signal happen
            // again (a fault re-executes on return; a sent signal is
            // raised again). Either way the process ends here.
            // SAFETY: installing SIG_DFL with a zeroed action is valid.
            unsafe {
                let mut default: libc::sigaction = std::mem::zeroed();
                default.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(signum, &default, std::ptr::null_mut());
                if code <= 0 {
                    libc::raise(signum);
                }
            }
            return;
        }
        let previous = previous.expect("a handler other than the defaults was recorded");
        if previous.sa_flags & libc::SA_SIGINFO != 0 {
            // SAFETY: the previous action was installed with SA_SIGINFO, so
            // its `sa_sigaction` is a three-argument handler; we pass it the
            // kernel's own arguments.
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                unsafe { std::mem::transmute::<usize, _>(action) };
            f(signum, info, context);
        } else {
            // SAFETY: without SA_SIGINFO, `sa_handler` is a one-argument
            // handler (libc overlays it with `sa_sigaction`).
            let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute::<usize, _>(action) };
            f(signum);
        }
    }
}

#[cfg(test)]
mod tests;
