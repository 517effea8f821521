//! Fiber stacks: carved from large slabs, guard-paged while the kernel's
//! mapping budget allows, overflow-checked at every switch beyond it.
//!
//! # The map-count budget
//!
//! Linux limits a process to `vm.max_map_count` mappings (65,530 by
//! default). A stack with a guard page is two mappings (the guard and the
//! usable part differ in protection), so guard pages alone stop near 32,000
//! live fibers. At start-up we read the limit and the mappings already in
//! use, keep [`MAP_HEADROOM`] for the rest of the process, and allow
//! `(limit - used - headroom) / 2` guarded stacks, process-wide. Past that,
//! stacks come from unguarded slabs (one mapping per slab) with a
//! [`RED_ZONE`] below each stack, and every switch checks the stack pointer
//! and the red zone's top cache line; a violation aborts with a message.
//! A one-time notice says when the runtime leaves the guard-page regime.
//!
//! # Layout
//!
//! ```text
//! guarded slab (PROT_NONE reserve; usable parts made RW as carved)
//! | guard | usable (size) | guard | usable | ...      low -> high addresses
//! unguarded slab (RW)
//! | red zone | usable (size) | red zone | usable | ...
//! ```
//!
//! Stacks grow down: `limit` is the low end of the usable part, `base` its
//! high end.

use crate::sync::{lock, Arc, Mutex};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering};
use std::sync::OnceLock;

/// Default usable stack size of a fiber: generous, because real code
/// (DEFLATE, formatting, deep parsers) needs real stacks; demand paging keeps
/// resident memory to the pages actually touched.
pub const DEFAULT_STACK_SIZE: usize = 256 * 1024;

/// Smallest accepted stack size: the fiber entry, a panic being caught and a
/// formatted message need about this much.
pub const MIN_STACK_SIZE: usize = 16 * 1024;

/// Largest accepted stack size (1 GiB), to catch unit mistakes.
pub const MAX_STACK_SIZE: usize = 1 << 30;

/// Stacks carved from one slab. Larger slabs mean fewer `mmap` calls (costly
/// on virtual machines); smaller ones less address space held per slab.
const SLAB_STACKS: usize = 64;

/// Unmapped-by-convention gap below each unguarded stack, so an overflow
/// of less than this lands in the gap, not in a neighbour's stack.
pub const RED_ZONE: usize = 16 * 1024;

/// Bytes at the top of the red zone that must stay zero (checked at every
/// switch of a fiber on an unguarded stack).
const RED_ZONE_CHECK: usize = 64;

/// Mappings kept for everything else in the process (heap arenas, thread
/// stacks, libraries, the application's own maps).
pub const MAP_HEADROOM: usize = 8192;

/// Kernel default for `vm.max_map_count`, used when `/proc` is unreadable.
const DEFAULT_MAX_MAP_COUNT: usize = 65_530;

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

/// Process-wide count of guarded stacks still allowed.
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

/// How many more guarded stacks the process may create (diagnostics).
pub fn guarded_stacks_left() -> usize {
    guard_budget().load(Ordering::Relaxed).max(0) as usize
}

static NOTICE_PRINTED: AtomicBool = AtomicBool::new(false);

fn print_unguarded_notice() {
    if !NOTICE_PRINTED.swap(true, Ordering::Relaxed) {
        eprintln!(
            "fiber: notice: the guard-page budget (vm.max_map_count, or the configured cap) is used up; further fiber \
             stacks have no guard page and are overflow-checked at every switch instead. \
             Raise the limit (sysctl -w vm.max_map_count=<larger>) to keep guard pages."
        );
    }
}

/// Stack settings shared by every stack of one runtime.
#[derive(Clone, Copy, Debug)]
pub struct StackConfig {
    /// Usable bytes per stack (rounded up to whole pages).
    pub size: usize,
    /// Cap on guarded stacks for this allocator, below the process budget
    /// (`None`: only the process budget applies). `Some(0)` forces the
    /// unguarded regime, which tests use.
    pub max_guarded: Option<usize>,
}

impl Default for StackConfig {
    fn default() -> Self {
        StackConfig {
            size: DEFAULT_STACK_SIZE,
            max_guarded: None,
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

/// One `mmap` region that stacks are carved from.
#[derive(Debug)]
struct Slab {
    start: usize,
    len: usize,
    guarded: bool,
}

impl Drop for Slab {
    fn drop(&mut self) {
        if self.guarded {
            guard::unregister(self.start);
        }
        // SAFETY: `start..start+len` is exactly the mapping made in
        // `Slab::map`, and every stack carved from it holds an `Arc<Slab>`,
        // so none is in use any more.
        unsafe {
            libc::munmap(self.start as *mut libc::c_void, self.len);
        }
        if self.guarded {
            guard_budget().fetch_add(SLAB_STACKS as isize, Ordering::Relaxed);
        }
    }
}

impl Slab {
    fn map(len: usize, guarded: bool) -> io::Result<Slab> {
        let prot = if guarded {
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
            guarded,
        })
    }
}

/// A slab being carved, and how far.
#[derive(Debug, Default)]
struct Cursor {
    slab: Option<Arc<Slab>>,
    next: usize,
}

/// Hands out fiber stacks for one runtime.
#[derive(Debug)]
pub struct StackAllocator {
    size: usize,
    max_guarded: Option<usize>,
    guarded: Mutex<(Cursor, usize)>,
    unguarded: Mutex<Cursor>,
}

impl StackAllocator {
    /// An allocator for `config` (validated by the caller).
    pub fn new(config: StackConfig) -> StackAllocator {
        let page = page_size();
        StackAllocator {
            size: config.size.div_ceil(page) * page,
            max_guarded: config.max_guarded,
            guarded: Mutex::new((Cursor::default(), 0)),
            unguarded: Mutex::new(Cursor::default()),
        }
    }

    /// Usable bytes per stack.
    pub fn stack_size(&self) -> usize {
        self.size
    }

    /// A new stack: guarded while the budget allows, unguarded after.
    pub fn allocate(&self) -> io::Result<FiberStack> {
        if let Some(stack) = self.allocate_guarded()? {
            return Ok(stack);
        }
        print_unguarded_notice();
        self.allocate_unguarded()
    }

    fn allocate_guarded(&self) -> io::Result<Option<FiberStack>> {
        let page = page_size();
        let stride = self.size + page;
        let mut guard = lock(&self.guarded);
        let (cursor, made) = &mut *guard;
        if self.max_guarded.is_some_and(|max| *made >= max) {
            return Ok(None);
        }
        if cursor.slab.is_none() || cursor.next == SLAB_STACKS {
            let budget = guard_budget();
            if budget.fetch_sub(SLAB_STACKS as isize, Ordering::Relaxed) < SLAB_STACKS as isize {
                budget.fetch_add(SLAB_STACKS as isize, Ordering::Relaxed);
                return Ok(None);
            }
            match Slab::map(stride * SLAB_STACKS, true) {
                Ok(slab) => {
                    guard::register(slab.start, slab.len, stride, self.size);
                    cursor.slab = Some(Arc::new(slab));
                    cursor.next = 0;
                }
                Err(e) => {
                    budget.fetch_add(SLAB_STACKS as isize, Ordering::Relaxed);
                    return Err(e);
                }
            }
        }
        let slab = cursor.slab.clone().expect("slab was just mapped");
        let low = slab.start + cursor.next * stride + page;
        // SAFETY: `low..low+size` lies inside the slab (index < SLAB_STACKS)
        // and is carved exactly once, so no live stack uses it.
        let rc = unsafe { libc::mprotect(low as *mut libc::c_void, self.size, libc::PROT_READ | libc::PROT_WRITE) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        cursor.next += 1;
        *made += 1;
        Ok(Some(FiberStack {
            base: low + self.size,
            limit: low,
            guarded: true,
            _slab: slab,
        }))
    }

    fn allocate_unguarded(&self) -> io::Result<FiberStack> {
        let stride = self.size + RED_ZONE;
        let mut cursor = lock(&self.unguarded);
        if cursor.slab.is_none() || cursor.next == SLAB_STACKS {
            cursor.slab = Some(Arc::new(Slab::map(stride * SLAB_STACKS, false)?));
            cursor.next = 0;
        }
        let slab = cursor.slab.clone().expect("slab was just mapped");
        let low = slab.start + cursor.next * stride + RED_ZONE;
        cursor.next += 1;
        Ok(FiberStack {
            base: low + self.size,
            limit: low,
            guarded: false,
            _slab: slab,
        })
    }
}

/// One fiber stack (usable range `limit..base`).
#[derive(Debug)]
pub struct FiberStack {
    base: usize,
    limit: usize,
    guarded: bool,
    _slab: Arc<Slab>,
}

impl FiberStack {
    /// Does this stack have a guard page below it?
    pub fn is_guarded(&self) -> bool {
        self.guarded
    }

    /// Bounds used by the switch-time overflow check.
    pub(crate) fn bounds(&self) -> StackBounds {
        StackBounds {
            limit: self.limit,
            guarded: self.guarded,
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
    /// on the current stack. Guarded stacks fault on overflow instead, so
    /// they always pass.
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
            // (`allocate_unguarded` leaves RED_ZONE bytes below `limit`), so
            // this read is in bounds; volatile because other code never
            // writes it legitimately and the compiler must not assume so.
            unsafe { std::ptr::read_volatile(top.add(i)) != 0 }
        })
    }
}

/// Reporting a hit on a fiber's guard page (PITFALLS 7): a SIGSEGV/SIGBUS
/// handler, running on the thread's alternate signal stack (std gives every
/// thread one), looks the faulting address up in a fixed table of guarded
/// slabs; on a guard page it prints `fiber <id> has overflowed its stack`
/// with the stack size and how to raise it, and aborts. Any other fault goes
/// to the handler that was installed before ours. Everything the handler
/// touches is async-signal-safe: atomics, a stack buffer and `write(2)`.
mod guard {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::OnceLock;

    /// Guarded slabs the table can hold (each holds SLAB_STACKS stacks; the
    /// default map-count budget needs about 450).
    const SLOTS: usize = 4096;

    struct Entry {
        start: AtomicUsize,
        len: AtomicUsize,
        stride: AtomicUsize,
        size: AtomicUsize,
    }

    #[allow(clippy::declare_interior_mutable_const)]
    const EMPTY: Entry = Entry {
        start: AtomicUsize::new(0),
        len: AtomicUsize::new(0),
        stride: AtomicUsize::new(0),
        size: AtomicUsize::new(0),
    };
    static TABLE: [Entry; SLOTS] = [EMPTY; SLOTS];
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

    pub(super) fn register(start: usize, len: usize, stride: usize, size: usize) {
        install();
        for entry in &TABLE {
            // The `len` slot claims the entry; Release publishes the fields
            // to the handler's Acquire load of `len`.
            if entry
                .len
                .compare_exchange(0, usize::MAX, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                entry.start.store(start, Ordering::Relaxed);
                entry.stride.store(stride, Ordering::Relaxed);
                entry.size.store(size, Ordering::Relaxed);
                entry.len.store(len, Ordering::Release);
                return;
            }
        }
        if !FULL_WARNED.swap(true, Ordering::Relaxed) {
            eprintln!("fiber: notice: guard-page table full; overflows of newer stacks fault without a fiber message");
        }
    }

    pub(super) fn unregister(start: usize) {
        for entry in &TABLE {
            let len = entry.len.load(Ordering::Acquire);
            if len != 0 && len != usize::MAX && entry.start.load(Ordering::Relaxed) == start {
                entry.len.store(0, Ordering::Release);
                return;
            }
        }
    }

    fn install() {
        INSTALLED.get_or_init(|| {
            // SAFETY: plain sigaction calls with zeroed, then filled, structs;
            // the previous actions are stored before our handler is active
            // (it is installed by the same calls, and reads PREVIOUS only
            // after a fault in a registered slab, which cannot exist yet).
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

    /// The guard hit's stack size, if `addr` is on a registered guard page.
    fn lookup(addr: usize) -> Option<usize> {
        let page = super::page_size();
        for entry in &TABLE {
            let len = entry.len.load(Ordering::Acquire);
            if len == 0 || len == usize::MAX {
                continue;
            }
            let start = entry.start.load(Ordering::Relaxed);
            if addr < start || addr >= start + len {
                continue;
            }
            let stride = entry.stride.load(Ordering::Relaxed);
            if stride != 0 && (addr - start) % stride < page {
                return Some(entry.size.load(Ordering::Relaxed));
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

    extern "C" fn handler(signum: libc::c_int, info: *mut libc::siginfo_t, _context: *mut libc::c_void) {
        // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
        let addr = unsafe { (*info).si_addr() } as usize;
        if let Some(size) = lookup(addr) {
            let id = crate::fiber::current_id_for_signal();
            write_all(b"\nfiber ");
            write_number(id);
            write_all(b" has overflowed its stack\nfatal runtime error: stack overflow (fiber stack size ");
            write_number(size as u64);
            write_all(b" bytes; raise it with Builder::stack_size or FIBER_STACK_SIZE)\n");
            std::process::abort();
        }
        // Not ours: restore the previous action and return; the fault
        // happens again and goes to it (std's handler, or the default).
        if let Some(previous) = PREVIOUS.get() {
            let old = if signum == libc::SIGBUS {
                &previous.bus
            } else {
                &previous.segv
            };
            // SAFETY: re-installing a previously valid action.
            unsafe {
                libc::sigaction(signum, old, std::ptr::null_mut());
            }
        }
    }
}

#[cfg(test)]
mod tests;
