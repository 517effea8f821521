//! Stack overflow in every regime (page-table guards, `mprotect` guards on
//! an older kernel, unguarded stacks by opt-in), each in a child process (the
//! process is supposed to die). The test re-runs its own test binary
//! filtered to itself with `CHILD_ENV` set; the child performs the overflow.

use super::Event;
use crate::stack::StackConfig;
use crate::testing::TestScheduler;
use crate::{fiber_wait, yield_now, WaitOptions, WaitResult};
use std::hint::black_box;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "FIBER_CORE_OVERFLOW_CHILD";
const STACK: usize = 64 * 1024;
/// How far past the usable stack the unguarded children go (inside the red zone).
const PAST_LIMIT: usize = 8 * 1024;

fn run_child(test: &str, mode: &str) -> Output {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, mode)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("re-run the test binary");
    let drain = |mut pipe: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            bytes
        })
    };
    let stdout = drain(Box::new(child.stdout.take().expect("piped stdout")));
    let stderr = drain(Box::new(child.stderr.take().expect("piped stderr")));
    // Hang detection only (a handler that loops on a fault must fail the
    // test, not hang it): the children finish in seconds.
    let deadline = Instant::now() + Duration::from_secs(300);
    let status = loop {
        if let Some(status) = child.try_wait().expect("poll the child") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{test} ({mode}): the child hung; stderr:\n{}",
                String::from_utf8_lossy(&stderr.join().unwrap())
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}

/// Overflows on purpose: there is no base case.
#[inline(never)]
#[allow(unconditional_recursion)]
fn recurse_forever(depth: u64) -> u64 {
    let buf = black_box([depth as u8 | 1; 1024]);
    black_box(recurse_forever(depth + 1)) + u64::from(buf[(depth % 1024) as usize])
}

/// Recurse until `past` bytes below the usable stack, then either switch
/// there or return and switch.
#[inline(never)]
fn recurse_past(top: usize, past: usize, switch_at_bottom: bool) -> u64 {
    let buf = black_box([0xA5u8; 1024]);
    let here = buf.as_ptr() as usize;
    if top - here > STACK + past {
        if switch_at_bottom {
            let _ = yield_now();
        }
        return 1;
    }
    black_box(recurse_past(top, past, switch_at_bottom)) + u64::from(buf[1])
}

/// One large zero-filled frame (88 KiB, more than the whole stack), written
/// from its bottom first: it never switches, and zeroes pass a "still zero"
/// canary, so only a hardware guard catches it.
#[inline(never)]
fn large_zeroed_frame() -> u8 {
    let mut buf = [0u8; 88 * 1024];
    // SAFETY: an in-bounds write to a local array.
    unsafe { std::ptr::write_volatile(buf.as_mut_ptr(), 0) };
    black_box(&mut buf);
    buf[black_box(7)]
}

/// Live fibers parked while one overflows: past the old guard-page budget
/// (about 28,600 stacks on a default `vm.max_map_count`).
const LIVE: usize = 100_000;

/// Park `LIVE` fibers, print the pool counters, then run `overflow` in one
/// more fiber.
fn overflow_among_live_fibers(overflow: fn() -> u64) {
    let sched = TestScheduler::with_stacks(StackConfig {
        size: STACK,
        ..StackConfig::default()
    });
    let event = std::sync::Arc::new(Event::default());
    for _ in 0..LIVE {
        let event = event.clone();
        sched.spawn(move || assert_eq!(fiber_wait(&*event, &mut (), WaitOptions::new()), WaitResult::Ok));
    }
    sched.run_until_idle();
    let stats = sched.pool_stats();
    eprintln!(
        "live {} guarded {} unguarded {}",
        stats.in_use, stats.guarded_stacks, stats.unguarded_stacks
    );
    sched.spawn(move || black_box(overflow()));
    sched.run_until_idle();
    drop(event);
}

fn child(mode: &str) {
    match mode {
        "many-deep" => overflow_among_live_fibers(|| recurse_forever(0)),
        "many-frame" => overflow_among_live_fibers(|| u64::from(large_zeroed_frame())),
        "old-kernel" => {
            crate::stack::pretend_old_kernel();
            let sched = TestScheduler::with_stacks(StackConfig {
                size: STACK,
                ..StackConfig::default()
            });
            sched.spawn(large_zeroed_frame);
            sched.run();
        }
        "guarded" => {
            let sched = TestScheduler::with_stacks(StackConfig {
                size: STACK,
                max_guarded: None,
                ..StackConfig::default()
            });
            sched.spawn(|| recurse_forever(0));
            sched.run();
        }
        "unguarded-deep" | "unguarded-returned" => {
            let sched = TestScheduler::with_stacks(StackConfig {
                size: STACK,
                max_guarded: Some(0),
                unguarded: crate::stack::UnguardedPolicy::Allow,
            });
            let at_bottom = mode == "unguarded-deep";
            sched.spawn(move || {
                let top = black_box(0u8);
                let top = std::ptr::addr_of!(top) as usize;
                recurse_past(top, PAST_LIMIT, at_bottom);
                let _ = yield_now();
            });
            sched.run();
        }
        other => panic!("unknown child mode {other}"),
    }
    eprintln!("child survived the overflow");
    std::process::exit(0);
}

#[test]
fn guard_page_overflow_kills_the_process() {
    if let Ok(mode) = std::env::var(CHILD_ENV) {
        child(&mode);
    }
    let out = run_child("tests::overflow::guard_page_overflow_kills_the_process", "guarded");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("child survived"), "{stderr}");
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGABRT),
        "status {:?}, stderr:\n{stderr}",
        out.status
    );
    assert!(stderr.contains("fiber 1 has overflowed its stack"), "{stderr}");
    assert!(stderr.contains("fiber stack size 65536 bytes"), "{stderr}");
}

#[test]
fn faults_outside_fiber_guard_pages_go_to_the_previous_handler() {
    if std::env::var(CHILD_ENV).is_ok() {
        // A guarded stack exists, so our handler is installed; then a plain
        // null dereference must still be reported as an ordinary SIGSEGV.
        let sched = TestScheduler::with_stacks(StackConfig {
            size: STACK,
            max_guarded: None,
            ..StackConfig::default()
        });
        sched.block_on(|| ());
        // SAFETY: not sound on purpose: this child process exists only to
        // fault on an address outside every fiber guard page and die.
        unsafe { std::ptr::read_volatile(std::ptr::null::<u8>()) };
        std::process::exit(0);
    }
    let out = run_child(
        "tests::overflow::faults_outside_fiber_guard_pages_go_to_the_previous_handler",
        "null",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGSEGV),
        "status {:?}, stderr:\n{stderr}",
        out.status
    );
    assert!(!stderr.contains("overflowed its stack"), "{stderr}");
}

#[test]
fn unguarded_overflow_is_caught_at_the_next_switch() {
    if let Ok(mode) = std::env::var(CHILD_ENV) {
        child(&mode);
    }
    for mode in ["unguarded-deep", "unguarded-returned"] {
        let out = run_child("tests::overflow::unguarded_overflow_is_caught_at_the_next_switch", mode);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("child survived"), "{mode}: {stderr}");
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGABRT),
            "{mode}: status {:?}, stderr:\n{stderr}",
            out.status
        );
        assert!(stderr.contains("has overflowed its stack"), "{mode}: {stderr}");
        assert!(
            stderr.contains("guard-page budget"),
            "the one-time notice says why: {stderr}"
        );
    }
}

#[test]
fn overflow_with_a_hundred_thousand_live_fibers_is_reported_by_the_guard() {
    if let Ok(mode) = std::env::var(CHILD_ENV) {
        child(&mode);
    }
    if !crate::stack::page_table_guards_supported() {
        // Past the mprotect budget, stacks are refused by default: nothing
        // runs unguarded; the unguarded regime has its own test.
        return;
    }
    for mode in ["many-deep", "many-frame"] {
        let out = run_child(
            "tests::overflow::overflow_with_a_hundred_thousand_live_fibers_is_reported_by_the_guard",
            mode,
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("child survived"), "{mode}: {stderr}");
        assert!(
            stderr.contains(&format!("live {LIVE} guarded {LIVE} unguarded 0")),
            "{mode}: every live stack is guarded: {stderr}"
        );
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGABRT),
            "{mode}: status {:?}, stderr:\n{stderr}",
            out.status
        );
        assert!(
            stderr.contains(&format!("fiber {} has overflowed its stack", LIVE + 1)),
            "{mode}: {stderr}"
        );
        assert!(stderr.contains("fiber stack size 65536 bytes"), "{mode}: {stderr}");
    }
}

#[test]
fn without_page_table_guards_mprotect_guards_catch_a_large_zeroed_frame() {
    if let Ok(mode) = std::env::var(CHILD_ENV) {
        child(&mode);
    }
    let out = run_child(
        "tests::overflow::without_page_table_guards_mprotect_guards_catch_a_large_zeroed_frame",
        "old-kernel",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("child survived"), "{stderr}");
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGABRT),
        "status {:?}, stderr:\n{stderr}",
        out.status
    );
    assert!(stderr.contains("fiber 1 has overflowed its stack"), "{stderr}");
}

/// Faults the program's own handler (installed before the runtime's)
/// repaired.
static REPAIRED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The page size, for the repairing handler (set before it is installed).
static PAGE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(4096);

extern "C" fn repairing_handler(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo; the faulting page is the
    // test's own PROT_NONE page, made writable so the access can proceed.
    unsafe {
        let size = PAGE.load(std::sync::atomic::Ordering::Relaxed);
        let page = ((*info).si_addr() as usize) & !(size - 1);
        libc::mprotect(page as *mut libc::c_void, size, libc::PROT_READ | libc::PROT_WRITE);
    }
    REPAIRED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

#[test]
fn foreign_faults_reach_the_previous_handler_and_ours_stays_installed() {
    if std::env::var(CHILD_ENV).is_ok() {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        PAGE.store(page, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: installing a SA_SIGINFO handler with a zeroed action.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = repairing_handler as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(libc::SIGSEGV, &action, std::ptr::null_mut());
        }
        let sched = TestScheduler::with_stacks(StackConfig {
            size: STACK,
            ..StackConfig::default()
        });
        sched.block_on(|| ());
        for _ in 0..2 {
            // SAFETY: a private anonymous page of our own; the repairing
            // handler makes it writable when the write faults.
            unsafe {
                let page = libc::mmap(
                    std::ptr::null_mut(),
                    page,
                    libc::PROT_NONE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                );
                assert_ne!(page, libc::MAP_FAILED);
                std::ptr::write_volatile(page as *mut u8, 1);
            }
        }
        eprintln!("repaired {}", REPAIRED.load(std::sync::atomic::Ordering::Relaxed));
        sched.spawn(|| recurse_forever(0));
        sched.run();
        eprintln!("child survived the overflow");
        std::process::exit(0);
    }
    let out = run_child(
        "tests::overflow::foreign_faults_reach_the_previous_handler_and_ours_stays_installed",
        "chain",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("repaired 2"), "both foreign faults chained: {stderr}");
    assert!(!stderr.contains("child survived"), "{stderr}");
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGABRT),
        "status {:?}, stderr:\n{stderr}",
        out.status
    );
    assert!(stderr.contains("fiber 2 has overflowed its stack"), "{stderr}");
}
