//! Unit tests of stack carving, guards and recycling.

use super::*;

/// Can the kernel read one byte at `addr`? A guard region (or a `PROT_NONE`
/// page) makes `write(2)` from it fail with EFAULT instead of raising a
/// signal, so this probes a guard without faulting.
fn readable(addr: usize) -> bool {
    let mut fds = [0; 2];
    // SAFETY: a fresh pipe; both ends are closed below.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: write(2) validates the source address itself (EFAULT).
    let n = unsafe { libc::write(fds[1], addr as *const libc::c_void, 1) };
    let errno = io::Error::last_os_error().raw_os_error();
    // SAFETY: closing the pipe made above.
    unsafe {
        libc::close(fds[0]);
        libc::close(fds[1]);
    }
    if n == 1 {
        return true;
    }
    assert_eq!(errno, Some(libc::EFAULT), "write from {addr:#x}");
    false
}

fn kernel_at_least(major: u32, minor: u32) -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut parts = release.trim().split(['.', '-']).map(|p| p.parse::<u32>().unwrap_or(0));
    let (a, b) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (a, b) >= (major, minor)
}

#[test]
fn page_table_guards_are_detected_on_linux_6_13_and_later() {
    if kernel_at_least(6, 13) {
        assert!(page_table_guards_supported());
        assert_eq!(guarded_stacks_left(), usize::MAX);
    }
}

#[test]
fn guard_markers_survive_dontneed() {
    if !page_table_guards_supported() {
        return;
    }
    let alloc = StackAllocator::new(StackConfig {
        size: 64 * 1024,
        ..StackConfig::default()
    });
    let stack = alloc.allocate().unwrap();
    assert!(stack.is_guarded() && !stack.was_recycled());
    let (limit, base) = (stack.limit, stack.base);
    assert!(!readable(limit - 1), "the gap below the stack is a guard");
    assert!(!readable(limit - gap_size()), "the whole gap is a guard");
    assert_eq!(guard::lookup(limit - 1), Some(64 * 1024), "the handler knows the guard");
    assert_eq!(guard::lookup(limit), None, "the usable part is not a guard");
    // SAFETY: the stack is ours and no fiber runs on it.
    unsafe { std::ptr::write_volatile((base - 8) as *mut u64, 0xDEAD_BEEF) };
    alloc.recycle(stack);
    assert!(!readable(limit - 1), "MADV_DONTNEED leaves the guard in place");
    let again = alloc.allocate().unwrap();
    assert!(again.was_recycled());
    assert_eq!(again.limit, limit, "the free list serves the same stack");
    // SAFETY: as above (the recycled stack is ours again).
    let word = unsafe { std::ptr::read_volatile((base - 8) as *const u64) };
    assert_eq!(word, 0, "pages went back");
}

#[test]
fn a_stack_without_a_guard_is_refused_by_default_with_a_clear_error() {
    let alloc = StackAllocator::new(StackConfig {
        max_guarded: Some(1),
        ..StackConfig::default()
    });
    let first = alloc.allocate().unwrap();
    assert!(first.is_guarded());
    let err = alloc.allocate().unwrap_err();
    let text = err.to_string();
    assert!(text.contains("no hardware guard"), "{text}");
    assert!(text.contains("FIBER_UNGUARDED=allow"), "{text}");
}

#[test]
fn the_allow_policy_hands_out_unguarded_stacks_with_a_red_zone() {
    let alloc = StackAllocator::new(StackConfig {
        max_guarded: Some(0),
        unguarded: UnguardedPolicy::Allow,
        ..StackConfig::default()
    });
    let stack = alloc.allocate().unwrap();
    assert!(!stack.is_guarded());
    assert!(readable(stack.limit - 1), "a red zone, not a guard");
    assert_eq!(guard::lookup(stack.limit - 1), None);
    assert!(!stack.bounds().overflowed(stack.limit + 4096));
    assert!(stack.bounds().overflowed(stack.limit - 8));
}

#[test]
fn unguarded_policy_parses_its_two_spellings() {
    assert_eq!(UnguardedPolicy::parse("refuse"), Some(UnguardedPolicy::Refuse));
    assert_eq!(UnguardedPolicy::parse(" Allow "), Some(UnguardedPolicy::Allow));
    assert_eq!(UnguardedPolicy::parse("yes"), None);
    assert_eq!(StackConfig::default().unguarded, UnguardedPolicy::Refuse);
}

#[test]
fn recycling_neighbours_in_one_call_keeps_their_guards_and_zeroes_their_pages() {
    let alloc = StackAllocator::new(StackConfig {
        size: 32 * 1024,
        ..StackConfig::default()
    });
    let stacks: Vec<_> = (0..3).map(|_| alloc.allocate().unwrap()).collect();
    let ranges: Vec<_> = stacks.iter().map(|s| (s.limit, s.base, s.is_guarded())).collect();
    for &(limit, base, _) in &ranges {
        // SAFETY: the stacks are ours and no fiber runs on them.
        unsafe {
            std::ptr::write_volatile((base - 8) as *mut u64, 7);
            std::ptr::write_volatile(limit as *mut u64, 7);
        }
    }
    alloc.recycle_many(stacks);
    for &(limit, base, guarded) in &ranges {
        assert_eq!(readable(limit - 1), !guarded, "the guard below {limit:#x} stays");
        // SAFETY: the ranges are still mapped (the free list holds the
        // stacks) and nothing else uses them.
        let (top, bottom) = unsafe {
            (
                std::ptr::read_volatile((base - 8) as *const u64),
                std::ptr::read_volatile(limit as *const u64),
            )
        };
        assert_eq!((top, bottom), (0, 0), "pages went back");
    }
    assert_eq!(alloc.free_stacks(), 3);
}
