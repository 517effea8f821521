//! Stack overflow in both regimes, each in a child process (the process is
//! supposed to die). The test re-runs its own test binary filtered to itself
//! with `CHILD_ENV` set; the child performs the overflow.

use crate::stack::StackConfig;
use crate::testing::TestScheduler;
use crate::yield_now;
use std::hint::black_box;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Output};

const CHILD_ENV: &str = "FIBER_CORE_OVERFLOW_CHILD";
const STACK: usize = 64 * 1024;
/// How far past the usable stack the unguarded children go (inside the red zone).
const PAST_LIMIT: usize = 8 * 1024;

fn run_child(test: &str, mode: &str) -> Output {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, mode)
        .output()
        .expect("re-run the test binary")
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

fn child(mode: &str) {
    match mode {
        "guarded" => {
            let sched = TestScheduler::with_stacks(StackConfig {
                size: STACK,
                max_guarded: None,
            });
            sched.spawn(|| recurse_forever(0));
            sched.run();
        }
        "unguarded-deep" | "unguarded-returned" => {
            let sched = TestScheduler::with_stacks(StackConfig {
                size: STACK,
                max_guarded: Some(0),
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
